"""PLACEHOLDER: replaced by the module that implements `edgekit quantize`."""

import typer


def register(app: typer.Typer) -> None:
    pass
