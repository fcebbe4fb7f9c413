"""aarch64 instructions per ekrt thread under qemu: does each of N threads do 1/N of an inference?
(issue 29, item 3)

qemu-user runs a guest's threads as host threads, but its timing says nothing about a board, so
thread scaling on ARM is judged by work, not time: the cross-built static runner benches the
model with ``--threads N`` under ``qemu-aarch64 -cpu cortex-a72`` (NEON) and ``-cpu cortex-a76``
(dot-product) with ``-d in_asm,exec,nochain``, and every executed block is charged to the guest
CPU (thread) that ran it (the ``Trace N:`` lines; the runner's main thread is CPU 0). The figure
per thread count is the difference of a (1+k)- and a 1-iteration run over k (start-up cancels),
per thread: its share of the inference's instructions, and the total against one thread's (the
pool's own cost: partitioning, claiming, polling).

Shares are what the threads *did*, with stealing: a thread that qemu schedules late does less
and another one takes its tasks (``csrc/src/pool.c``). The static partition each thread starts
with is asserted within 10 % of 1/N of the MACs in ``tests/test_ekrt_partition.py``; these counts
show what happens on top of it. Polling counts too: a worker spinning between two ops executes
instructions that do no work, so the total grows with the thread count by the pool's cost.

    python benchmarks/arm_thread_counts.py --models ppocr-cls,mtcnn-onet --threads 1,2,4 -k 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from ekrt_vs_ort import ARM_CPUS, _files, executed_by_cpu_block, model_factory  # noqa: E402

from edgekit.quantize import SCHEMES, quantize_model  # noqa: E402
from edgekit.targets.native import build, ekm  # noqa: E402
from edgekit.targets.native.lower import lower  # noqa: E402


def executed_per_cpu(log: Path) -> dict[int, int]:
    """Instructions executed per guest CPU (thread) in a ``-d in_asm,exec,nochain`` log."""
    per: dict[int, int] = defaultdict(int)
    for (cpu, _pc), n in executed_by_cpu_block(log).items():
        per[cpu] += n
    return dict(per)


def count(runner: Path, ekm_path: Path, files: list[str], qemu: str, cpu: str, threads: int, k: int, tmp: Path) -> list[int]:
    """Instructions per inference per thread (main thread first)."""
    totals = {}
    for iters in (1, 1 + k):
        log = tmp / f"qemu-{cpu}-{threads}-{iters}.log"
        subprocess.run([qemu, "-cpu", cpu, "-d", "in_asm,exec,nochain", "-D", str(log), str(runner), "bench", str(ekm_path), "--json",
                        "--threads", str(threads), "--warmup", "0", "--iterations", str(iters), "--inputs", *files],
                       capture_output=True, check=True, timeout=3600)  # fmt: skip
        totals[iters] = executed_per_cpu(log)
        log.unlink()
    cpus = sorted(set(totals[1]) | set(totals[1 + k]))
    return [max(0, totals[1 + k].get(c, 0) - totals[1].get(c, 0)) // k for c in cpus]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="ppocr-cls", help="comma-separated: benchmarks/ekrt_vs_ort.py names or catalogue names")
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("-k", type=int, default=2, help="extra iterations counted (the difference of 1+k and 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        raise SystemExit("error: qemu-aarch64 is not installed\nhint: apt-get install qemu-user-static")
    runner = build.build_runner("aarch64")
    threads = [int(t) for t in args.threads.split(",")]
    out = []
    with tempfile.TemporaryDirectory(prefix="edgekit-armthreads-") as t:
        tmp = Path(t)
        for name in args.models.split(","):
            loaded, calib, held = model_factory(name)()
            result = quantize_model(loaded, SCHEMES["native"], calib, held)
            m, _ = lower(result.model)
            ekm_path = tmp / f"{name}.ekm"
            ekm.save(m, ekm_path)
            files = _files(held.feeds[0], tmp, name)
            for cpu in ARM_CPUS:
                one = None
                for n in threads:
                    per = count(runner, ekm_path, files, qemu, cpu, n, args.k, tmp)
                    total = sum(per)
                    one = total if n == 1 else one
                    row = {"model": name, "cpu": cpu, "threads": n, "per_thread": per, "total": total,
                           "shares": [round(p / total, 3) for p in per] if total else [],
                           "total_vs_1_thread": round(total / one, 3) if one else None}  # fmt: skip
                    out.append(row)
                    if not args.json:
                        shares = " ".join(f"{s * 100:.0f}%" for s in row["shares"])
                        print(f"{name:14} {cpu:11} {n:2} thr: {total / 1e6:9.1f} M instr/inference ({row['total_vs_1_thread']}x 1 thr); per thread {shares}", flush=True)
    if args.json:
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
