"""`edgekit quantize`: float ONNX -> QDQ int8 ONNX, with an fp32-vs-int8 agreement report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


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
    from edgekit.deploy import DeployRequest, prepare_deploy, run_quantize
    from edgekit.errors import ModelError, PlanError
    from edgekit.fsutil import check_output_path
    from edgekit.modelio import parse_shape_overrides
    from edgekit.quantize import save_model

    o = common.output(json_out)
    check_output_path(out)
    req = DeployRequest(
        model=model,
        target=target,
        backend=backend,
        calib=calib,
        eval=eval_data,
        labels=labels,
        method=common.check_method(method),
        exclude=tuple(exclude or ()),
        shapes=parse_shape_overrides(shape),
        preprocess=common.preprocess(preprocess),
        bench=False,
    )
    prep = prepare_deploy(req)
    if getattr(prep.loaded, "format", "onnx") != "onnx":
        raise ModelError(
            f"edgekit quantizes ONNX models; {model} is a {prep.loaded.format} model ({prep.plan.precision})",
            f"quantize the float ONNX model it came from, or bench it as it is: edgekit bench {model}",
        )
    if prep.plan.precision != "int8":
        raise PlanError(
            f"{prep.plan.backend} on {prep.plan.profile} runs {prep.plan.precision}: there is nothing to quantize",
            "pick a target (or --backend) with an int8 path, e.g. --target local",
        )
    if method == "entropy":
        o.warn("entropy calibration is experimental: on the MobileNetV2 example it costs accuracy; percentile is the safer choice")
    result = run_quantize(prep, req, o)
    save_model(result.model, out)
    doc = {"model": str(model), "output": str(out), "output_bytes": out.stat().st_size, **result.to_dict()}
    if json_out:
        o.json(doc)
        return
    print_report(o, doc)
    o.info(f"wrote {out} ({common.fmt_bytes(doc['output_bytes'])})")


def print_report(o: Output, doc: dict) -> None:
    cal = doc["calibration"]
    o.line(
        f"scheme {doc['scheme']['name']}, {doc['method']} calibration on {cal['samples']} samples from {cal['source']}"
        + (" (RANDOM: not representative)" if cal["random"] else "")
    )
    nodes = doc["nodes"]
    o.line(
        f"nodes: {nodes.get('int8', 0)} int8, {nodes.get('fused', 0)} fused activations, "
        f"{nodes.get('passthrough', 0)} int8 pass-through, {nodes.get('float', 0)} float"
    )
    agr = doc["agreement"]
    rows = []
    for out in agr["outputs"]:
        rows.append(
            [
                out["name"],
                f"{out['cosine']:.5f}",
                "inf" if out["snr_db"] is None else f"{out['snr_db']:.1f}",
                f"{out['max_abs_err']:.4g}",
                common.fmt_pct(out["top1"]),
            ]
        )
    o.table(["output", "cosine", "SNR dB", "max abs err", "top-1 agree"], rows, title=f"fp32 vs int8 on {agr['samples']} held-out samples ({agr['source']})")
    if agr.get("accuracy_fp32") is not None:
        o.line(
            f"accuracy on labels: fp32 {common.fmt_pct(agr['accuracy_fp32'])}, int8 {common.fmt_pct(agr['accuracy_int8'])} "
            f"(drop {agr['accuracy_drop'] * 100:+.2f} points)"
        )
    floats = doc.get("float_nodes", [])
    if floats:
        reasons: dict[str, list[str]] = {}
        for f in floats:
            reasons.setdefault(f"{f['op']}: {f['reason']}", []).append(f["name"])
        o.table(
            ["stays float", "nodes", "examples"],
            [[r, len(names), ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")] for r, names in reasons.items()],
        )
