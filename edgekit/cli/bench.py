"""PLACEHOLDER: replaced by the module that implements `edgekit bench`."""

import typer


def register(app: typer.Typer) -> None:
    pass
