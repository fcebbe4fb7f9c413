"""`edgekit plan`: what a deploy would do, decided once, printed before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common, render
from edgekit.cli.output import Output


def plan(
    model: Annotated[Path, typer.Argument(help="The float ONNX model (or a .tflite, which runs as it is).", show_default=False)],
    target: common.Target = "local",
    device: Annotated[str, typer.Option("--device", "-d", help="Device to deploy to.")] = "local",
    backend: common.Backend = None,
    no_quantize: Annotated[bool, typer.Option("--no-quantize", help="Plan a float deploy.")] = False,
    calib: common.Calib = None,
    method: common.Method = common.DEFAULT_METHOD,
    exclude: common.Exclude = None,
    shape: common.Shape = None,
    json_out: common.Json = False,
) -> None:
    """Show the plan for MODEL on a target: backend, precision, scheme, float nodes and steps.

    Example:

        edgekit plan examples/digits/digits_cnn.onnx --target rpi5
    """
    from edgekit import api

    o = Output()
    doc = api.plan(
        model, target=target, device=device, backend=backend, quantize=not no_quantize, calib=calib,
        method=common.check_method(method), exclude=exclude, shapes=common.shapes(shape),
    ).to_dict()  # fmt: skip
    if json_out:
        o.json(doc)
        return
    render.print_plan(o, doc)
