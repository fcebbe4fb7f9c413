"""`edgekit quantize`: float ONNX -> QDQ int8 ONNX, with an fp32-vs-int8 agreement report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common, render


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)


@common.options("quantize")
def quantize(
    model: Annotated[Path, typer.Argument(help="The float ONNX model.", show_default=False)],
    out: Annotated[Path, typer.Option("--output", "-o", help="Where to write the QDQ int8 model.", show_default=False)],
    target: common.Target = "local",
    backend: common.Backend = None,
    json_out: common.Json = False,
    **opts,
) -> None:
    """Quantize MODEL to int8 (QDQ ONNX) for a target's backend and report fp32-vs-int8 agreement.

    Example:

        edgekit quantize examples/digits/digits_cnn.onnx -o digits.int8.onnx --calib examples/digits/calib.npz
    """
    from edgekit import api

    o = common.output(json_out)
    if opts["method"] == "entropy":
        o.warn("entropy calibration is experimental: on the MobileNetV2 example it costs accuracy; percentile is the safer choice")
    result = api.quantize(model, out, events=o, target=target, backend=backend, **common.quantize_args(opts))
    doc = {"model": str(model), "output": str(out), "output_bytes": out.stat().st_size, **result.to_dict()}
    if json_out:
        o.json(doc)
        return
    render.print_quantize_report(o, doc)
    o.info(f"wrote {out} ({render.fmt_bytes(doc['output_bytes'])})")
