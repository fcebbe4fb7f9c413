"""`edgekit quantize`: float ONNX -> QDQ int8 ONNX, with an fp32-vs-int8 agreement report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit import validate
from edgekit.cli import common, render
from edgekit.cli.output import Output


@common.options("quantize")
def quantize(
    model: Annotated[Path, typer.Argument(help="The float ONNX model.", show_default=False)],
    out: Annotated[Path, typer.Option("--output", "-o", help="Where to write the QDQ int8 model.", show_default=False)],
    target: common.Target = "local",
    backend: common.Backend = None,
    report: Annotated[
        bool,
        typer.Option("--report", help="Per-layer sensitivity, most harmful first: each int8 node's error, and the outputs with it alone quantized / alone float."),
    ] = False,
    report_full: Annotated[
        bool, typer.Option("--report-full", help="--report, measuring the output effects however many int8 nodes there are (two inference passes per node and sample).")
    ] = False,
    max_drop: Annotated[
        float | None,
        typer.Option(
            "--max-drop", callback=validate.option("max_drop"), metavar="POINTS",
            help="Mixed precision: keep the int8 nodes that cost the held-out --metric most in float until it drops at most POINTS "
            "below float's (snr: until noise is at most POINTS % of the signal); refuse (exit 5, no file) when it cannot.",
        ),
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric", metavar="NAME",
            help="The task's metric, fp32 vs int8 on the held-out samples: what --threshold checks and --max-drop holds: top1, cosine, snr, "
            "iou (masks at 0.5), ctc (100 - CER of greedy CTC decodes) or path/module.py:fn (fn(ref_outputs, q_outputs) -> float, higher is better). "
            "Default: the model's .edgekit.toml [accuracy] metric, else top1 for class vectors, else cosine.",
        ),
    ] = None,
    json_out: common.Json = False,
    **opts,
) -> None:
    """Quantize MODEL to int8 (QDQ ONNX) for a target's backend and report fp32-vs-int8 agreement.

    Example:

        edgekit quantize examples/digits/digits_cnn.onnx -o digits.int8.onnx --calib examples/digits/calib.npz

    Keeping layers in float until the held-out character error rate rises at most 1 point:

        edgekit quantize rec.onnx -o rec.int8.onnx --calib lines.npz --eval held.npz --max-drop 1 --metric ctc

    An int8 model whose held-out figure misses its threshold gets a warning line; --strict makes it exit 5:

        edgekit quantize det.onnx -o det.int8.onnx --calib pages/ --metric iou --threshold 0.9 --strict
    """
    from edgekit import api
    from edgekit.errors import GateError

    o = Output()
    if (report or report_full) and opts["method"] == common.DYNAMIC:
        from edgekit.quantize.sensitivity import no_dynamic_report

        raise no_dynamic_report()
    try:
        result = api.quantize(
            model, out, events=o, target=target, backend=backend, max_drop=max_drop, metric=metric, **common.quantize_args(opts)
        )
    except GateError as exc:
        decision = getattr(exc, "decision", None)
        if decision is not None:
            if json_out:
                o.json({"model": str(model), "output": None, "mixed_precision": decision})
            else:
                _print_mixed(o, decision)
        raise
    doc = {"model": str(model), "output": str(out), "output_bytes": out.stat().st_size, **result.to_dict()}
    if report or report_full:
        sens = _sensitivity(o, model, result, target=target, backend=backend, full=report_full, opts=opts)
        doc["layers"] = sens.pop("layers")
        doc["sensitivity"] = sens
    if json_out:
        o.json(doc)
        return
    render.print_quantize_report(o, doc)
    if doc["mixed_precision"] is not None:
        _print_mixed(o, doc["mixed_precision"])
    if "sensitivity" in doc:
        render.print_layer_report(o, doc)
    o.info(f"wrote {out} ({render.fmt_bytes(doc['output_bytes'])})")


def _sensitivity(o, model: Path, result, *, target: str, backend: str | None, full: bool, opts: dict) -> dict:
    """The per-layer report of ``result``, on the held-out samples the quantizer checked it on."""
    from edgekit import api
    from edgekit.deploy import open_job
    from edgekit.events import Events
    from edgekit.quantize import sensitivity

    args = common.quantize_args(opts)
    job = open_job(api.request(model, goal="quantize", target=target, backend=backend, **args))
    _, heldout = job.feeds(Events())  # read as the quantizer read them (its warnings are printed already)
    n = len(result.layers)
    with o.progress(f"measuring {n} int8 nodes alone quantized and alone float", total=n) as prog:
        s = sensitivity.measure_result(job.model, result, heldout.feeds, exclude=args["exclude"] or (), full=full, progress=prog)
    return s.to_dict()


def _db(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2f}"


def _gain(layer: dict) -> str:
    """A node's output SNR gain kept float, or its block's when it was ranked in a block of neighbours."""
    if layer.get("output_snr_db_gain_float") is not None or layer.get("block_gain_db") is None:
        return _db(layer.get("output_snr_db_gain_float"))
    return f"{_db(layer['block_gain_db'])} (block of {layer.get('block_size')})"


def _print_mixed(o, mp: dict) -> None:
    """What --max-drop decided: the metric before and after, the layers kept float and why, their cost."""
    unit = "dB" if mp["unit"] == "dB" else "pt"

    def v(x: float | None) -> str:
        return "inf" if x is None else f"{x:.2f} {unit}"

    picked = f" ({mp['metric_why']})" if mp["metric_why"] else ""
    o.line(
        f"mixed precision, {mp['metric']}{picked} searched on {mp['samples']} {mp.get('searched_on') or 'held-out samples'}: all int8 {v(mp['before'])}, float {v(mp['reference'])}, "
        f"needs >= {v(mp['goal'])} (--max-drop {mp['max_drop']:g})"
    )
    j = mp.get("judged")
    if j:
        o.line(
            f"  judged on {j['samples']} held-out samples the search never saw: all int8 {v(j['before'])}, with its choice {v(j['after'])}, "
            f"needs >= {v(j['goal'])}" + (": MISSED" if j.get("missed") else "")
        )
    if mp.get("not_candidates"):
        nc = mp["not_candidates"]
        o.line(f"  {nc['nodes']} int8 node(s) are not candidates for float: {'; '.join(nc['why'])}")
    if not mp["holds"]:
        ranked = mp["sensitivity"]["layers"]
        o.table(
            ["node", "op", "local SNR dB", "gain kept float dB", "MACs"],
            [[x["name"], x["op"], _db(x["snr_db"]), _gain(x), render.fmt_pct(x["macs_share"])] for x in ranked[:20]],
            title=f"per-layer sensitivity, most harmful first ({mp['rank_samples']} held-out samples, Q/DQ reference): "
            f"with the first {mp['tried_float_layers']} in float the {mp['metric']} is {v(mp['after'])}",
        )
        return
    if not mp["float_layers"]:
        o.line("  all int8 holds: no layer kept in float")
        return
    o.table(
        ["kept float", "op", "gain kept float dB", "MACs"],
        [[x["name"], x["op"], _db(x["gain_db"]), render.fmt_pct(x["macs_share"])] for x in mp["float_layers"]],
        title=f"{len(mp['float_layers'])} layer(s) kept in float"
        + (f" (found in {mp['found_by']})" if mp.get("found_by", "ranking") != "ranking" else "")
        + f": {mp['metric']} {v(mp['before'])} -> {v(mp['after'])}, "
        f"{render.fmt_pct(mp['int8_mac_share'])} of the MACs still int8 (decided in {mp['seconds']:.1f} s)",
    )
    lat = mp.get("latency")
    if lat:
        o.line(f"latency, {lat['measured_on']}: fp32 {lat['fp32_ms']:.2f} ms, all int8 {lat['int8_ms']:.2f} ms, mixed {lat['mixed_ms']:.2f} ms")
