"""Activation ranges and weight treatments on the real-model catalogue, by task metric.

One column per ``--method`` (``minmax``, ``percentile``, ``entropy``, ``mse``, ``auto`` and
recipes with ``+clip`` / ``+bias`` / ``+cle`` / ``+smooth[=alpha]``), next to ONNX Runtime's ``quantize_static``
defaults, each quantizing the same float model with the same calibration samples and judged on
held-out samples by the model's own task metric (``quantize_vs_ort.py`` does the work: the same
models, data, metric and timing; s = quantize wall time without edgekit's own held-out report).

    python benchmarks/ranges.py
    python benchmarks/ranges.py --models ppocr-cls,oww-embedding --methods minmax,mse,mse+bias
    python benchmarks/ranges.py --models minilm-l3,ppocr-rec --methods auto,auto+smooth,auto+smooth=0.8 --no-ort
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import quantize_vs_ort as qvo  # benchmarks/quantize_vs_ort.py (this script's folder)
from realdata import Skip, catalogue_names

from edgekit.modelio import load_model
from edgekit.quantize import FeedSet, quantize_model, save_model

METHODS = ("minmax", "percentile", "entropy", "mse", "auto", "mse+bias", "mse+clip+bias+cle")


def edgekit_method(method: str):
    """A column: ``quantize_model`` with the host's ONNX Runtime scheme and ``method``."""

    def tool(case: qvo.Case, out: Path) -> qvo.Column:
        loaded = load_model(case.src)
        calib = FeedSet(case.calib.feeds, f"{case.name} calib")
        heldout = FeedSet(case.heldout.feeds[:1], f"{case.name} held-out")
        t0 = time.perf_counter()
        result = quantize_model(loaded, qvo.host_scheme(), calib, heldout, method=method)
        save_model(result.model, out)
        smoothed = f"; smoothed {result.smoothing.inputs} MatMul/Gemm inputs" if result.smoothing else ""  # 0 says there was nothing to smooth
        return qvo.Column(out, time.perf_counter() - t0 - result.seconds.get("evaluate", 0.0), method + smoothed)

    return tool


def main(argv: list[str] | None = None) -> int:
    names_all = catalogue_names()
    ap = argparse.ArgumentParser(description="edgekit calibration methods on real pretrained models, by task metric.")
    ap.add_argument("--models", default=",".join(names_all), help=f"comma-separated, from: {', '.join(names_all)} (default: all)")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated --method values (default: {','.join(METHODS)})")
    ap.add_argument("--no-ort", action="store_true", help="leave out the 'ORT default' column")
    ap.add_argument("--calib", type=int, default=16, help="calibration samples (default 16)")
    ap.add_argument("--eval", type=int, default=8, help="held-out samples for the metric (default 8)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = ap.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from edgekit.errors import UsageError
    from edgekit.quantize.calib import parse_method

    try:
        for m in methods:
            parse_method(m)
    except UsageError as exc:
        print(f"error: {exc}\nhint: {exc.hint}", file=sys.stderr)
        return 2
    unknown = [m for m in names if m not in names_all]
    if unknown or not names:
        print(f"error: unknown model(s): {', '.join(unknown) or '(none given)'}\nhint: choose from {', '.join(names_all)}", file=sys.stderr)
        return 2
    columns = {m: edgekit_method(m) for m in methods}
    if not args.no_ort:
        columns["ORT default"] = qvo.ort_default

    def log(msg: str) -> None:
        print(f"[ranges] {msg}", file=sys.stderr, flush=True)

    import logging

    import onnxruntime

    logging.getLogger().setLevel(logging.ERROR)
    onnxruntime.set_default_logger_severity(3)
    results, skipped = [], []
    for name in names:
        try:
            results.append(qvo.bench_model(name, args.calib, args.eval, columns, log))
        except Skip as exc:
            skipped.append({"model": name, "reason": str(exc)})
    if args.json:
        print(json.dumps({"benchmark": "ranges", "environment": qvo.environment(args.calib, args.eval), "columns": list(columns),
                          "models": results, "skipped": skipped}, indent=2, default=str))
        return 0
    print(table(results, list(columns)))
    for line in qvo.notes(results):
        print("note: " + line)
    for s in skipped:
        print(f"skipped {s['model']}: {s['reason']}")
    return 0


def table(results: list[dict], columns: list[str]) -> str:
    """Metric and quantize seconds per column; the best edgekit metric of a row in bold."""
    lines = ["| model | metric (goal) | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for r in results:
        m = r["metric"]
        digits = ".5f" if "cosine" in (m["name"] or "") else ".3f"
        goal = "-" if m["goal"] is None else f"{'≥' if m['higher_is_better'] else '≤'} {m['goal']:g}"
        ours = [r["columns"][c]["metric"] for c in columns if c != "ORT default" and r["columns"][c]["metric"] is not None]
        best = (max if m["higher_is_better"] else min)(ours) if ours else None
        cells = []
        for c in columns:
            col = r["columns"][c]
            if col["error"]:
                cells.append(f"fails: {col['error'][:50]}")
                continue
            v = format(col["metric"], digits) + ("" if col["meets_goal"] else " ✗")
            cells.append(("**" + v + "**" if col["metric"] == best and c != "ORT default" else v) + f" ({col['quantize_s']:.1f} s)")
        lines.append(f"| {r['model']} | {m['name']} ({goal}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
