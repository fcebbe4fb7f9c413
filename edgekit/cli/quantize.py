"""`edgekit quantize`: float ONNX -> QDQ int8 ONNX, with an fp32-vs-int8 agreement report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common, render


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)


def quantize(
    model: Annotated[Path, typer.Argument(help="The float ONNX model.", show_default=False)],
    out: Annotated[Path, typer.Option("--output", "-o", help="Where to write the QDQ int8 model.", show_default=False)],
    target: common.Target = "local",
    backend: common.Backend = None,
    calib: common.Calib = None,
    eval_data: common.Eval = None,
    labels: common.Labels = None,
    method: common.Method = "minmax",
    exclude: common.Exclude = None,
    shape: common.Shape = None,
    preprocess: common.PreprocessOpt = None,
    json_out: common.Json = False,
) -> None:
    """Quantize MODEL to int8 (QDQ ONNX) for a target's backend and report fp32-vs-int8 agreement.

    Example:

        edgekit quantize examples/digits/digits_cnn.onnx -o digits.int8.onnx --calib examples/digits/calib.npz
    """
    from edgekit import api

    o = common.output(json_out)
    if method == "entropy":
        o.warn("entropy calibration is experimental: on the MobileNetV2 example it costs accuracy; percentile is the safer choice")
    result = api.quantize(
        model, out, events=o, target=target, backend=backend, calib=calib, eval=eval_data, labels=labels,
        method=common.check_method(method), exclude=exclude, shapes=common.shapes(shape), preprocess=common.preprocess(preprocess),
    )  # fmt: skip
    doc = {"model": str(model), "output": str(out), "output_bytes": out.stat().st_size, **result.to_dict()}
    if json_out:
        o.json(doc)
        return
    render.print_quantize_report(o, doc)
    o.info(f"wrote {out} ({render.fmt_bytes(doc['output_bytes'])})")
