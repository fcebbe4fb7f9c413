"""PLACEHOLDER: replaced by the module that implements `edgekit results`."""

import typer

app = typer.Typer(help="results", no_args_is_help=True)
