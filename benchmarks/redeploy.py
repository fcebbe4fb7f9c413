"""An unchanged redeploy over SSH: what it costs, what it sends, against ``scp`` of the same bundle.

Starts a real OpenSSH sshd on 127.0.0.1 (``tests/lab/sshd.py``), deploys the digits example to it
through the real CLI (``edgekit deploy ... --device lab --json``), then deploys it again unchanged,
``--repeats`` times. An unchanged redeploy reuses the quantization and the identical earlier
measurement (same bundle, device facts and bench settings; ``bench.reuse``). For each it reports
the wall time of the whole command, the bytes sent, and whether the quantization and the runs
were reused. The peers, interleaved in the same run: the same redeploy with ``--remeasure`` (bench
and evaluate on the device again; its time outside the Bench and Eval steps is reported too), the
same with one agent process per step as well (``EDGEKIT_AGENT_SERVE=0``, as before the agent
server), and OpenSSH's ``scp`` of the bundle's files to the same sshd. Medians.

Python compiles each module once into ``__pycache__`` (as an installed package ships it);
``PYTHONDONTWRITEBYTECODE``, set in some development shells, would make every start compile
edgekit again (~0.2 s here), so it is removed from the deploys' environment.

    python benchmarks/redeploy.py [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.lab, when run as a script from anywhere
DIGITS = ROOT / "examples" / "digits" / "digits_cnn.onnx"
MEASURING = {"bench", "eval"}


def deploy(env: dict, out: Path, *extra: str) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "edgekit", "deploy", str(DIGITS), "--target", "linux-cpu", "--device", "lab",
            "--iterations", "20", "--warmup", "2", "-o", str(out), "--json", *extra]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: deploy failed:\n{proc.stderr}")
    return wall, json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="unchanged redeploys (default 5)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print("error: --repeats must be >= 1", file=sys.stderr)
        return 2
    from tests.lab.sshd import LabUnavailable, Sshd

    with tempfile.TemporaryDirectory(prefix="edgekit-redeploy-") as tmp:
        work = Path(tmp)
        try:
            server = Sshd(work / "sshd").start()
        except LabUnavailable as exc:
            print(f"error: cannot start the loopback sshd: {exc}", file=sys.stderr)
            return 1
        try:
            home = work / "user"
            (home / ".ssh").mkdir(parents=True)
            (home / ".ssh" / "config").write_text(server.ssh_config("lab"))
            (home / ".ssh" / "known_hosts").write_text(server.known_hosts_line())
            env = {**os.environ, "HOME": str(home), "CI": "1", "EDGEKIT_CACHE_DIR": str(work / "cache"), "EDGEKIT_DATA_DIR": str(work / "data")}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            first_wall, first = deploy(env, work / "bundle")
            print(f"first deploy: {first_wall:.2f}s, sent {first['push']['bytes_sent']} bytes", file=sys.stderr)
            files = [work / "bundle" / f["path"] for f in first["bundle"]["files"]] + [work / "bundle" / "manifest.json"]
            rows, remeasure, per_step = [], [], []
            for i in range(args.repeats):
                # the peers write their own bundle directories: a bundle's manifest records the plan
                # (--remeasure is part of it), so sharing one would make each redeploy a changed bundle
                per_step.append(deploy({**env, "EDGEKIT_AGENT_SERVE": "0"}, work / "bundle-per-step", "--remeasure")[0])
                again_wall, again = deploy(env, work / "bundle-remeasure", "--remeasure")
                remeasure.append({"wall_s": again_wall, "measuring_s": _measuring(again)})
                wall, doc = deploy(env, work / "bundle")
                dest = server.home / f"scp-{i}"
                dest.mkdir()
                start = time.perf_counter()
                subprocess.run(["scp", *server.ssh_argv(), "-P", str(server.port), "-q", *map(str, files), f"{server.user}@127.0.0.1:{dest}/"], check=True)
                scp = time.perf_counter() - start
                shutil.rmtree(dest)
                steps = {s["name"]: 0.0 for s in doc["executed_steps"]}
                for s, sec in zip(doc["executed_steps"], doc["step_seconds"]):
                    steps[s["name"]] += sec
                rows.append({
                    "wall_s": wall, "bytes_sent": doc["push"]["bytes_sent"], "quantize_cached": doc["quantize"]["cached"],
                    "runs_reused": all(r["reused"] for r in doc["runs"]), "scp_bundle_s": scp, "steps": steps,
                })  # fmt: skip
                print(f"redeploy {i + 1}/{args.repeats}: {wall:.2f}s wall (runs reused: {rows[-1]['runs_reused']}), sent {rows[-1]['bytes_sent']} bytes; "
                      f"--remeasure {again_wall:.2f}s; one agent per step {per_step[-1]:.2f}s; scp of the bundle {scp:.2f}s", file=sys.stderr)  # fmt: skip
        finally:
            server.stop()

    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "scp_bundle_s")}
    re_wall = statistics.median(r["wall_s"] for r in remeasure)
    re_outside = statistics.median(r["wall_s"] - r["measuring_s"] for r in remeasure)
    doc = {
        "bundle_bytes": sum(f["size"] for f in first["bundle"]["files"]),
        "first_deploy_s": round(first_wall, 3),
        "redeploy_median": {k: round(v, 3) for k, v in med.items()},
        "redeploy_bytes_sent": sorted({r["bytes_sent"] for r in rows}),
        "quantization_reused": all(r["quantize_cached"] for r in rows),
        "runs_reused": all(r["runs_reused"] for r in rows),
        "step_seconds_median": {k: round(statistics.median(r["steps"][k] for r in rows), 3) for k in rows[0]["steps"]},
        "remeasure_wall_s": round(re_wall, 3),
        "remeasure_outside_bench_eval_s": round(re_outside, 3),
        "redeploy_over_remeasure": round(med["wall_s"] / re_wall, 2),
        "one_agent_process_per_step_wall_s": round(statistics.median(per_step), 3),
        "agent_server_over_per_step": round(re_wall / statistics.median(per_step), 2),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"bundle {doc['bundle_bytes'] / 1e3:.0f} KB; first deploy {first_wall:.2f}s")
    print(f"unchanged redeploy (median of {len(rows)}): {med['wall_s']:.2f}s wall; sent {doc['redeploy_bytes_sent']} bytes; "
          f"quantization reused: {doc['quantization_reused']}; runs reused: {doc['runs_reused']}")
    print(f"the same with --remeasure: {re_wall:.2f}s wall ({re_outside:.2f}s outside bench/eval) -> redeploy / remeasure = {doc['redeploy_over_remeasure']:.2f}x")
    print(f"--remeasure with one agent process per step (EDGEKIT_AGENT_SERVE=0): {doc['one_agent_process_per_step_wall_s']:.2f}s "
          f"-> agent server / per step = {doc['agent_server_over_per_step']:.2f}x")
    print(f"scp of the same bundle: {med['scp_bundle_s']:.2f}s")
    print("per step (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in doc["step_seconds_median"].items()))
    return 0


def _measuring(doc: dict) -> float:
    return sum(sec for s, sec in zip(doc["executed_steps"], doc["step_seconds"]) if s["name"] in MEASURING)


if __name__ == "__main__":
    sys.exit(main())
