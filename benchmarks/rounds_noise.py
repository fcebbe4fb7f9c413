"""False alarms of a latency gate on back-to-back runs of one build: one agent process per run
against several (``--rounds``), interleaved in the same session.

Each pair is two ``edgekit bench`` runs of the digits example on ``local`` (ONNX Runtime, one
thread, the profile's 0.5 s window per process), the same build twice, then
``edgekit results compare A B --fail p50:+5%`` on them. Nothing changed between A and B, so every
"slower"/"faster" verdict is noise called a change, and every failed gate a false alarm. The
pairs alternate between ``--rounds 1`` and ``--rounds R``. Reported per setting: the pairs whose
p50 verdict was a change, the gates that failed, the gates left undecided (the machine moved,
``unsure``), the median and largest |p50 change|, and the median noise floor the comparison used.

    python benchmarks/rounds_noise.py [--pairs 8] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"


def edgekit(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgekit", *args], env=env, capture_output=True, text=True, timeout=900)


def pair(env: dict, rounds: int) -> dict:
    ids = []
    for _ in range(2):
        r = edgekit(env, "bench", str(DIGITS), "--target", "local", "--threads", "1", "--rounds", str(rounds), "--json")
        if r.returncode != 0:
            raise SystemExit(f"error: bench failed:\n{r.stderr}")
        ids.append(json.loads(r.stdout)[0]["id"])
    r = edgekit(env, "results", "compare", str(ids[0]), str(ids[1]), "--fail", "p50:+5%", "--json")
    if r.returncode not in (0, 5):
        raise SystemExit(f"error: compare failed:\n{r.stderr}")
    doc = json.loads(r.stdout)
    p50 = next(m for m in doc["metrics"] if m["metric"] == "p50")
    return {"change": p50["change"], "verdict": p50["verdict"], "gate": doc["gates"][0]["status"], "machine_shift": doc["machine_shift"], "why": p50.get("why", "")}


def summary(rows: list[dict]) -> dict:
    changes = [abs(r["change"]) for r in rows]
    return {
        "pairs": len(rows),
        "called_a_change": sum(r["verdict"] in ("slower", "faster") for r in rows),
        "gate_failed": sum(r["gate"] == "fail" for r in rows),
        "gate_undecided": sum(r["gate"] == "skipped" for r in rows),
        "median_abs_change_pct": round(statistics.median(changes) * 100, 2),
        "max_abs_change_pct": round(max(changes) * 100, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="back-to-back pairs per setting (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="agent processes per run in the second setting (default 3)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edgekit-rounds-") as home:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(EDGEKIT_DATA_DIR=home, EDGEKIT_BRANCH="bench")  # a results store of its own
        rows: dict[int, list[dict]] = {1: [], args.rounds: []}
        for i in range(args.pairs):
            for rounds in (1, args.rounds) if i % 2 == 0 else (args.rounds, 1):  # alternate which goes first
                rows[rounds].append(pair(env, rounds))
                if not args.json:
                    r = rows[rounds][-1]
                    print(f"rounds {rounds}: p50 {r['change'] * 100:+.1f}% {r['verdict']}, gate {r['gate']}, loop moved {r['machine_shift'] * 100:.1f}%", file=sys.stderr)
    result = {str(k): summary(v) for k, v in rows.items()}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'rounds':>6} {'pairs':>5} {'called a change':>15} {'gate failed':>11} {'undecided':>9} {'median |change|':>15} {'max |change|':>12}")
    for k, s in result.items():
        print(f"{k:>6} {s['pairs']:>5} {s['called_a_change']:>15} {s['gate_failed']:>11} {s['gate_undecided']:>9} "
              f"{s['median_abs_change_pct']:>14.2f}% {s['max_abs_change_pct']:>11.2f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
