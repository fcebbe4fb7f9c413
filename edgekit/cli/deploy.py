"""PLACEHOLDER: replaced by the module that implements `edgekit deploy`."""

import typer


def register(app: typer.Typer) -> None:
    pass
