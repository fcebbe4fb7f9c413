"""Which ONNX ops of each real model ekrt's lowering covers, and the first node it cannot run.

For every model of ``tests/realmodels.py`` CATALOGUE: the op types of the graph as edgekit's
quantizer prepares it (constants and BatchNormalization folded, the package's input shapes),
each marked by whether ``edgekit.targets.native.lower.LOWERINGS`` (the one list ``edgekit plan``
reads) has it, and the verdict of ``check_lowerable`` (what the planner asks: the QDQ graph
lowered with placeholder ranges), which names the first node ekrt cannot run.

    python benchmarks/coverage.py
    python benchmarks/coverage.py --json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

from realdata import (  # benchmarks/realdata.py (this script's folder)
    Skip,
    catalogue,
    catalogue_names,
)

from edgekit.modelio import load_model
from edgekit.quantize import analyze_model
from edgekit.quantize.scheme import NATIVE
from edgekit.targets.native.lower import LOWERINGS, check_lowerable

QDQ = {"QuantizeLinear", "DequantizeLinear"}


def coverage(name: str) -> dict:
    model, _ = catalogue(name)
    loaded = load_model(model.locate(), {k: v for k, v in model.inputs.items() if v})
    row = {"model": name, "family": model.family, "nodes": None, "ops": {}, "missing": [], "lowerable": None, "first_failure": None}
    try:
        prepared, _ = analyze_model(loaded, NATIVE)
    except Exception as exc:  # the quantizer's own preparation refuses: nothing reaches the lowering
        row["first_failure"] = f"quantizer preparation: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        row["lowerable"] = False
        return row
    ops = collections.Counter(n.op_type for n in prepared.graph.node if n.op_type not in QDQ)
    row["nodes"] = sum(ops.values())
    row["ops"] = dict(sorted(ops.items()))
    row["missing"] = sorted(op for op in ops if op not in LOWERINGS)
    row["covered_nodes"] = sum(c for op, c in ops.items() if op in LOWERINGS)
    try:
        reason = check_lowerable(loaded)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    row["lowerable"] = reason is None
    row["first_failure"] = reason
    return row


def main(argv: list[str] | None = None) -> int:
    names = catalogue_names()
    ap = argparse.ArgumentParser(description="ekrt lowering coverage of the real models", epilog="example: python benchmarks/coverage.py --json")
    ap.add_argument("--models", default=",".join(names), help=f"comma-separated, from: {', '.join(names)}")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    if not chosen or any(m not in names for m in chosen):
        print(f"error: unknown model in {args.models!r}\nhint: choose from {', '.join(names)}", file=sys.stderr)
        return 2
    rows, skipped = [], []
    for name in chosen:
        try:
            rows.append(coverage(name))
        except Skip as exc:
            skipped.append({"model": name, "reason": str(exc)})
    if args.json:
        print(json.dumps({"lowerings": sorted(LOWERINGS), "models": rows, "skipped": skipped}, indent=2))
        return 0
    ok = sum(bool(r["lowerable"]) for r in rows)
    print(f"ekrt lowers {ok} of {len(rows)} real models ({len(LOWERINGS)} op types in LOWERINGS)\n")
    print("| model | nodes covered | op types without a lowering | ekrt runs it? first failure |")
    print("|---|---|---|---|")
    for r in rows:
        covered = "-" if r["nodes"] is None else f"{r['covered_nodes']}/{r['nodes']}"
        verdict = "yes" if r["lowerable"] else f"no: {r['first_failure']}"
        print(f"| {r['model']} | {covered} | {', '.join(r['missing']) or '-'} | {verdict} |")
    for s in skipped:
        print(f"skipped {s['model']}: {s['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
