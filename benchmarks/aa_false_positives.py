"""False positives of the regression gates on A/A pairs: the same build benched twice, back to back.

Each pair is two ``edgekit bench`` runs of the digits example on ``local`` (ONNX Runtime, one
thread, ``--rounds 3`` by default: three agent processes per run), the same bundle twice. Nothing
changed between A and B, so every gate that fails B against A is a false positive. Each gate is
checked as ``edgekit ci`` checks it (``edgekit.bench.gates``: fail only when the change exceeds the
limit, its interval lies beyond the limit and the test across rounds agrees; inconclusive when the
runs cannot tell). Reported per gate: pairs, failed (false-positive rate), inconclusive, passed.

The runs are kept in a results store (``--store DIR``, default a temporary one); given a store that
already holds pairs, the script checks the gates on those instead of benching again, so a changed
gate rule can be measured on the same runs.

    python benchmarks/aa_false_positives.py [--pairs 40] [--rounds 3] [--store DIR] [--markdown | --json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"
GATES = ("p50:+5%", "p90:+10%", "p99:+10%", "mean:+5%", "throughput:-5%")


def bench(env: dict, rounds: int) -> int:
    """One ``edgekit bench`` run; its stored run id."""
    argv = [sys.executable, "-m", "edgekit", "bench", str(DIGITS), "--target", "local", "--threads", "1", "--rounds", str(rounds), "--json"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"error: edgekit bench failed (exit {r.returncode}):\n{r.stderr}")
    return int(json.loads(r.stdout)[0]["id"])


def stored_pairs(db: Path) -> list[tuple[int, int]]:
    """The pairs already in the store: runs 1-2, 3-4, ... (ids in the order they were benched)."""
    from edgekit.bench.store import ResultsStore

    if not db.is_file():
        return []
    with ResultsStore(db) as store:
        ids = sorted(row["id"] for row in store.list(limit=100_000))
    return [(ids[i], ids[i + 1]) for i in range(0, len(ids) - 1, 2)]


def check(db: Path, pairs: list[tuple[int, int]]) -> dict:
    """Every gate on every pair (B against A): counts of each outcome, and the failed pairs' lines."""
    from edgekit.bench.gates import parse_gate
    from edgekit.bench.store import ResultsStore

    gates = [parse_gate(g) for g in GATES]
    out = {g.text: {"pairs": 0, "fail": 0, "inconclusive": 0, "pass": 0, "failed_lines": []} for g in gates}
    with ResultsStore(db) as store:
        for a_id, b_id in pairs:
            a, b = store.get(a_id), store.get(b_id)
            for g in gates:
                res = g.check(b, a)
                row = out[g.text]
                row["pairs"] += 1
                row[res.outcome] = row.get(res.outcome, 0) + 1
                if res.outcome == "fail":
                    row["failed_lines"].append(f"runs {a_id}/{b_id}: {res.line}")
    for row in out.values():
        row["false_positive_rate"] = row["fail"] / row["pairs"] if row["pairs"] else None
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(result: dict, pairs: int, rounds: int) -> str:
    lines = [
        f"A/A pairs: {pairs} (digits_cnn on local, ONNX Runtime fp32, 1 thread, `--rounds {rounds}`), "
        f"{os.cpu_count()} cores, {cpu_model()}.",
        "",
        "| gate | pairs | failed (false positive) | inconclusive | passed |",
        "|---|---|---|---|---|",
    ]
    for gate, row in result.items():
        rate = row["false_positive_rate"] * 100 if row["pairs"] else 0.0
        inc = row["inconclusive"] / row["pairs"] * 100 if row["pairs"] else 0.0
        lines.append(f"| `{gate}` | {row['pairs']} | {row['fail']} ({rate:.1f} %) | {row['inconclusive']} ({inc:.1f} %) | {row['pass']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40, help="A/A pairs to bench (default 40)")
    ap.add_argument("--rounds", type=int, default=3, help="agent processes per run (default 3)")
    ap.add_argument("--store", type=Path, help="keep the runs in this directory's results.db; pairs already there are reused")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="a markdown table (for docs/benchmarks.md)")
    out.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.rounds < 1:
        ap.error("--pairs and --rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="edgekit-aa-") as tmp:
        data = args.store or Path(tmp)
        data.mkdir(parents=True, exist_ok=True)
        db = data / "results.db"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(EDGEKIT_DATA_DIR=str(data), EDGEKIT_BRANCH="aa-bench")
        pairs = stored_pairs(db)
        if pairs:
            print(f"checking the gates on the {len(pairs)} pair(s) already in {db}", file=sys.stderr)
        while len(pairs) < args.pairs:
            a, b = bench(env, args.rounds), bench(env, args.rounds)
            pairs.append((a, b))
            print(f"pair {len(pairs)}/{args.pairs}: runs {a}, {b}", file=sys.stderr)
        result = check(db, pairs)
    if args.json:
        print(json.dumps({"pairs": len(pairs), "rounds": args.rounds, "gates": result}, indent=2))
    elif args.markdown:
        print(markdown(result, len(pairs), args.rounds), end="")
    else:
        print(f"{'gate':>16} {'pairs':>5} {'failed':>7} {'rate':>6} {'inconclusive':>12} {'passed':>6}")
        for gate, row in result.items():
            print(f"{gate:>16} {row['pairs']:>5} {row['fail']:>7} {row['false_positive_rate'] * 100:>5.1f}% {row['inconclusive']:>12} {row['pass']:>6}")
        for gate, row in result.items():
            for line in row["failed_lines"]:
                print(f"false positive {gate}: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
