"""PLACEHOLDER: replaced by the module that implements `edgekit profiles`."""

import typer

app = typer.Typer(help="profiles", no_args_is_help=True)
