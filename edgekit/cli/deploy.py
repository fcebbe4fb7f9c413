"""`edgekit deploy`: the whole trip — quantize, bundle, push, bench, store, summarize."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)


def deploy(
    model: Annotated[Path, typer.Argument(help="The float ONNX model.", show_default=False)],
    target: common.Target = "local",
    device: Annotated[str | None, typer.Option("--device", "-d", help="Device to deploy to (default: this machine).")] = None,
    backend: common.Backend = None,
    no_quantize: Annotated[bool, typer.Option("--no-quantize", help="Deploy the float model only.")] = False,
    no_bench: Annotated[bool, typer.Option("--no-bench", help="Build the bundle, don't push or benchmark.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and stop.")] = False,
    calib: common.Calib = None,
    eval_data: common.Eval = None,
    labels: common.Labels = None,
    method: common.Method = "minmax",
    exclude: common.Exclude = None,
    shape: common.Shape = None,
    preprocess: common.PreprocessOpt = None,
    warmup: Annotated[int | None, typer.Option("--warmup", min=0, help="Warm-up runs (default: the profile's).")] = None,
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", min=1, help="Timed runs (default: the profile's).")] = None,
    duration: Annotated[float | None, typer.Option("--duration", min=0.01, help="Time for this many seconds instead of a count.")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="Inference threads (default: all cores).")] = None,
    out_dir: Annotated[Path | None, typer.Option("--output", "-o", help="Bundle directory (default: edgekit-out/MODEL-TARGET).")] = None,
    json_out: common.Json = False,
) -> None:
    """Quantize MODEL, bundle it for a target, push it to the device, benchmark fp32 vs int8 there.

    Example:

        edgekit deploy examples/digits/digits_cnn.onnx --target local
    """
    from edgekit.cli.plan import print_plan
    from edgekit.deploy import DeployRequest, prepare_deploy
    from edgekit.deploy import deploy as run_deploy
    from edgekit.modelio import parse_shape_overrides

    o = common.output(json_out)
    req = DeployRequest(
        model=model,
        target=target,
        device=device,
        backend=backend,
        quantize=not no_quantize,
        bench=not no_bench,
        calib=calib,
        eval=eval_data,
        labels=labels,
        method=common.check_method(method),
        exclude=tuple(exclude or ()),
        shapes=parse_shape_overrides(shape),
        preprocess=common.preprocess(preprocess),
        warmup=warmup,
        iterations=iterations,
        duration_s=duration,
        threads=threads,
        output=out_dir,
    )
    prep = prepare_deploy(req)
    if dry_run:
        if json_out:
            o.json({"dry_run": True, "plan": prep.plan.to_dict()})
        else:
            print_plan(o, prep.plan.to_dict())
            o.info("dry run: nothing was quantized, written, pushed or benchmarked")
        return
    if no_bench:
        for note in prep.plan.notes:
            o.info(f"note: {note}")
    result = run_deploy(req, o, prep)
    doc = result.to_dict()
    if json_out:
        o.json(doc)
        return
    print_summary(o, doc)


def print_summary(o: Output, doc: dict) -> None:
    from edgekit.deploy import speed_sentence

    s = doc["summary"]
    variants = s["variants"]
    fp = variants.get("fp32", {})
    agreement = s.get("agreement")
    top1 = None
    if agreement:
        top1 = next((x["top1"] for x in agreement["outputs"] if x["top1"] is not None), None)
    rows = []
    for name, v in variants.items():
        speed = "-"
        if v.get("p50_ms") and fp.get("p50_ms"):
            speed = f"{fp['p50_ms'] / v['p50_ms']:.2f}x"
        agree = "-"
        if name != "fp32" and agreement:
            first = agreement["outputs"][0]
            agree = f"cos {first['cosine']:.4f}" + (f", top-1 {top1 * 100:.1f}%" if top1 is not None else "")
        rows.append(
            [
                name,
                v["backend"],
                common.fmt_ms(v.get("p50_ms")),
                common.fmt_ms(v.get("p99_ms")),
                speed,
                common.fmt_bytes(v.get("size_bytes")),
                common.fmt_pct(v.get("accuracy")),
                agree,
            ]
        )
    title = f"{doc['model']} on {doc['target']} ({doc['device']}), backend {doc['backend']}"
    o.table(["variant", "backend", "p50 ms", "p99 ms", "speed-up", "size", "accuracy", "agreement vs fp32"], rows, title=title)
    if agreement:
        o.line(
            f"agreement measured on {agreement['samples']} held-out samples ({agreement['source']})"
            + (
                f"; accuracy drop {s['accuracy_drop'] * 100:+.2f} points"
                if s.get("accuracy_drop") is not None
                else ""
            )
        )
    sentence = speed_sentence(s, len(doc["plan"]["float_nodes"]))
    if sentence:
        o.line(sentence)
    if doc["runs"]:
        ids = ", ".join(str(r["id"]) for r in doc["runs"])
        o.info(f"results stored as run(s) {ids}: edgekit results show ID")
    o.info(f"bundle: {doc['bundle']['path']}")
