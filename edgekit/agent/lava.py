"""The device side of a LAVA job: ``python3 agent.pyz lava BUNDLE_DIR --variant V ... [--fail GATE]``.

A LAVA test shell has no edgekit host on the other end, so this runs what a deploy would ask
for, one variant after another, each bench in a fresh agent process (as the host runs it), and:

* prints each bench document on one log line, ``EDGEKIT-DOC {"variant": ..., "doc": {...}}``,
  so ``edgekit results import-lava`` can rebuild the record, raw samples included, from the
  job's log;
* reports p50 / p90 / p99 / mean in ms through ``lava-test-case NAME --result R --measurement X
  --units ms`` (LAVA's own results), failing a metric whose absolute gate (``p99:<20ms``) it
  misses, and a ``VARIANT-bench`` case that fails when the bench did.

The percentiles here are LAVA's view only; the host recomputes every statistic from the raw
samples when it imports the log. Stdlib only, like the rest of the agent.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys

DOC_MARK = "EDGEKIT-DOC "
METRICS = ("p50", "p90", "p99", "mean")
_GATE_RE = re.compile(r"^(p50|p90|p99|mean):<\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)$")
_UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def percentile(sorted_ns: list, q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of sorted samples."""
    pos = (len(sorted_ns) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_ns) - 1)
    return sorted_ns[lo] + (sorted_ns[hi] - sorted_ns[lo]) * (pos - lo)


def metrics_ms(samples_ns: list) -> dict:
    s = sorted(samples_ns)
    return {"p50": percentile(s, 50) / 1e6, "p90": percentile(s, 90) / 1e6, "p99": percentile(s, 99) / 1e6,
            "mean": sum(s) / len(s) / 1e6}


def parse_gate(text: str) -> tuple:
    """``p99:<20ms`` -> ("p99", 20.0) in ms; ValueError for anything else (LAVA gates are absolute)."""
    m = _GATE_RE.match(text.strip())
    if not m:
        raise ValueError(f"not an absolute latency gate: {text!r} (write e.g. p99:<20ms)")
    return m.group(1), float(m.group(2)) * _UNIT_MS[m.group(3)]


def case_name(variant: str, metric: str) -> str:
    """A LAVA test case name (no whitespace; it is part of a URL)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{variant}-{metric}")


def report(name: str, result: str, measurement: float | None = None) -> None:
    argv = ["lava-test-case", name, "--result", result]
    if measurement is not None:
        argv += ["--measurement", f"{measurement:.6f}", "--units", "ms"]
    sys.stdout.flush()
    subprocess.run(argv, check=False)


def run(args: argparse.Namespace) -> int:
    gates = {}
    for g in args.fail:
        metric, limit = parse_gate(g)
        gates[metric] = limit
    agent = os.path.abspath(sys.argv[0])
    device = args.device or socket.gethostname() or "lava-device"
    failed = False
    for variant in args.variant:
        argv = [sys.executable, agent, "bench", args.bundle_dir, "--variant", variant, "--iterations", str(args.iterations)]
        if args.threads:
            argv += ["--threads", str(args.threads)]
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            doc = {"kind": "edgekit.error", "error": f"the agent printed no JSON document (exit {proc.returncode})"}
        line = {"variant": variant, "model": args.model, "target": args.target, "device": device, "doc": doc}
        print(DOC_MARK + json.dumps(line, separators=(",", ":")), flush=True)
        if proc.returncode != 0 or doc.get("kind") != "edgekit.bench" or not doc.get("samples_ns"):
            print(f"edgekit: {variant}: {doc.get('error', 'bench failed')}", flush=True)
            report(case_name(variant, "bench"), "fail")
            failed = True
            continue
        report(case_name(variant, "bench"), "pass")
        for metric, value in metrics_ms(doc["samples_ns"]).items():
            ok = metric not in gates or value < gates[metric]
            failed |= not ok
            report(case_name(variant, metric), "pass" if ok else "fail", value)
    return 1 if failed else 0


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(prog="agent.pyz lava", description="bench a bundle's variants inside a LAVA test shell")
    parser.add_argument("bundle_dir")
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--fail", action="append", default=[], help="absolute gate, e.g. p99:<20ms (repeatable)")
    parser.add_argument("--model", required=True, help="the model's name, for the stored record")
    parser.add_argument("--target", required=True, help="the target profile the bundle was made for")
    parser.add_argument("--device", default=None, help="the device's name in the record (default: its hostname)")
    args = parser.parse_args(argv)
    if shutil.which("lava-test-case") is None:
        print("error: lava-test-case is not on PATH: this command runs inside a LAVA test shell", file=sys.stderr)
        return 2
    try:
        return run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
