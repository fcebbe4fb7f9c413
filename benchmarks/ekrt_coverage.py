"""Which nodes ekrt runs, for every model the tests and benchmarks use (issue 11, item 2).

For each model: lowered or not, and its nodes by how ekrt runs them: int8 ops, int8 tables
(float functions of one int8 value), float (nodes with no int8 lowering, run in float32 islands
between a DEQUANTIZE and a QUANTIZE; with the op types, and with --json each node's reason),
cannot run (neither way; with the op types), and nodes not reached because an input could not
be lowered. This is what
``edgekit plan MODEL --target rpi5`` shows as ``coverage  native``; the counts come from
``edgekit.targets.native.lower.coverage`` (the QDQ graph with placeholder ranges, lowered past
each failure; no calibration data needed). Models from registry packages that are not installed
are listed as missing, with how to install them.

    python benchmarks/ekrt_coverage.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from realmodels import CATALOGUE  # noqa: E402

from edgekit.modelio import load_model  # noqa: E402
from edgekit.targets.native.lower import coverage  # noqa: E402

# name -> (path or a realmodels catalogue entry, input shapes): the examples and every real model
MODELS = {
    "digits": (ROOT / "examples/digits/digits_cnn.onnx", None),
    "mobilenetv2": (ROOT / "examples/mobilenetv2/mobilenetv2.onnx", None),
    **{name: (m, {k: v for k, v in m.inputs.items() if v}) for name, m in CATALOGUE.items()},
}


def _ops(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = ap.parse_args()
    rows = {}
    for name, (where, shapes) in MODELS.items():
        try:
            path = where if isinstance(where, Path) else where.locate()
        except LookupError as exc:
            rows[name] = {"missing": str(exc)}
            continue
        cov = coverage(load_model(path, shapes))
        rows[name] = {"lowers": not (cov["unsupported_nodes"] or cov.get("error")), **cov}
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| model | ekrt lowers | int8 | int8 tables | float | cannot run | not reached |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "missing" in r:
            print(f"| {name} | (missing: {r['missing']}) | | | | | |")
            continue
        cells = [sum(r[k].values()) for k in ("int8", "tables", "float")]
        floats = f"{cells[2]} ({_ops(r['float'])})" if cells[2] else "0"
        cannot = f"{sum(r['unsupported'].values())} ({_ops(r['unsupported'])})"
        if r.get("error"):  # the walk stopped before any node: say where
            cannot = f"whole model: {r['error'].split(': ', 1)[0]}"
        print(f"| {name} | {'yes' if r['lowers'] else 'no'} | {cells[0]} | {cells[1]} | {floats} | {cannot} | {r['blocked']} |")
    lowered = sum(1 for r in rows.values() if r.get("lowers"))
    print(f"\nekrt lowers {lowered} of {sum(1 for r in rows.values() if 'missing' not in r)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
