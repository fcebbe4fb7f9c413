"""PLACEHOLDER: replaced by the module that implements `edgekit plan`."""

import typer


def register(app: typer.Typer) -> None:
    pass
