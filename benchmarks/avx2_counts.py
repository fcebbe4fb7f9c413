"""x86 instructions per inference with every runtime held to AVX2: ekrt int8 against ONNX Runtime
and OpenVINO int8 (issue 29, item 4), on the files ``benchmarks/ekrt_threads.py --prepare`` writes.

Valgrind's virtual CPU has AVX2 and no AVX-512, VNNI or AMX (its cpuid hides what it cannot run),
so under it every runtime takes its AVX2 path: ekrt's dispatch (``EKRT_ISA=avx2`` is set as well,
and checked), ONNX Runtime's MLAS (u8s8 with VPMADDUBSW) and OpenVINO's oneDNN alike; nobody's
VNNI kernels meet ekrt's AVX2 ones. Each figure is callgrind's executed-instruction count (Ir) of
one process running ``1 + k`` inferences minus one running 1, over k (both warm up once first),
so loading, compiling and Python cancel out (every process runs with PYTHONHASHSEED=0 and one OpenBLAS
thread: with Python's hash seed random, ONNX Runtime's start-up differed by up to 200 M instructions
between two identical processes; fixed, by 0.4 M). The processes use ``_session`` of ekrt_threads.py:
ekrt through its extension (the runner's kernels), ORT with all graph optimizations, OpenVINO's
CPU plugin; one thread each; the peers run ``MODEL.int8.onnx`` (QDQ, uint8 activations,
per-channel int8 weights, what both run best on x86), ekrt ``MODEL.avx2.ekm`` of the same model
where the folder has it (quantized as edgekit does for ekrt on an AVX2 CPU: 7-bit weights on the
convolutions it runs as GEMMs, which take its VPMADDUBSW kernel; the peers' kernels are VPMADDUBSW
either way), else ``MODEL.ekm`` (8-bit weights: its exact 16-bit GEMM). The row says which.

An instruction is not a cycle (VPMADDUBSW does 32 multiply-adds, a scalar add one; a JIT that
unrolls wider retires fewer): a proxy for AVX2 speed on a machine that has AVX-512, until an
AVX2-only host times them (docs/benchmarks.md has such tables from 2026-11-24).

    python benchmarks/avx2_counts.py --prepared DIR --models orientation,efficientnet-lite0 [-k 2] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNTIMES = ("ekrt", "ort_int8", "ov_int8")

_GUEST = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import numpy as np
from ekrt_threads import _session
prep, model, runtime, iters = Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
with np.load(prep / f"{model}.npz") as data:
    feed = {k: data[k] for k in data.files}
if runtime == "ekrt" and (prep / f"{model}.avx2.ekm").exists():
    model += ".avx2"
m, run = _session(runtime, prep, model, 1)
if m is not None:
    from edgekit import _ekrt
    assert _ekrt.isa() == "avx2", _ekrt.isa()
run(feed)
for _ in range(iters):
    run(feed)
"""


def instructions(runtime: str, prep: Path, model: str, iters: int, tmp: Path) -> int:
    """callgrind's Ir of one guest process running ``1 + iters`` inferences."""
    script = tmp / "guest.py"
    script.write_text(_GUEST)
    env = {**os.environ, "EKRT_ISA": "avx2", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp / 'cg.out'}", "--smc-check=all-non-file",
           sys.executable, str(script), str(HERE), str(prep), model, runtime, str(iters)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        tail = r.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{runtime} on {model}: exit {r.returncode}: {' | '.join(tail)}")
    # the guest's own count: a runtime may fork a helper, which callgrind reports too
    pid = re.search(r"^==(\d+)== Command:", r.stderr, re.M)
    m = pid and re.search(rf"^=={pid.group(1)}== Collected\s*:\s*(\d+)", r.stderr, re.M)
    if not m:
        raise RuntimeError(f"{runtime} on {model}: no 'Collected' line from callgrind")
    return int(m.group(1))


def per_inference(runtime: str, prep: Path, model: str, k: int, tmp: Path) -> tuple[int, int]:
    """``((Ir of 1 + k inferences - Ir of 1) / k, noise)``. Start-up is not always the same number of
    instructions (ONNX Runtime's on EfficientNet-Lite0 once differed by more than its two extra
    inferences, and the difference went negative), so the 1-inference process runs twice, before
    and after: noise = their difference / k, the figure uses their mean."""
    one_a = instructions(runtime, prep, model, 1, tmp)
    many = instructions(runtime, prep, model, 1 + k, tmp)
    one_b = instructions(runtime, prep, model, 1, tmp)
    per = (many - (one_a + one_b) // 2) // k
    noise = abs(one_a - one_b) // k
    if per <= noise:
        raise RuntimeError(f"start-up noise ({noise} instructions per inference) swamps the count ({per})")
    return per, noise


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prepared", required=True, metavar="DIR", help="benchmarks/ekrt_threads.py --prepare DIR")
    p.add_argument("--models", required=True)
    p.add_argument("-k", type=int, default=2, help="extra inferences counted (default 2)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", metavar="FILE", help="also write the counts here")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"which of {', '.join(RUNTIMES)} to count (default all)")
    args = p.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("error: valgrind is not installed\nhint: apt-get install valgrind")
    prep = Path(args.prepared)
    tmp = prep / "avx2-counts"
    tmp.mkdir(exist_ok=True)
    rows = []
    for model in args.models.split(","):
        t0 = time.perf_counter()
        counts: dict[str, int | str] = {}
        noise: dict[str, int] = {}
        for rt in [r for r in RUNTIMES if r in args.runtimes.split(",")]:
            try:
                counts[rt], noise[rt] = per_inference(rt, prep, model, args.k, tmp)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                counts[rt] = f"failed: {exc}"
        peers = {rt: v for rt, v in counts.items() if rt != "ekrt" and isinstance(v, int)}
        best = min(peers, key=peers.__getitem__) if peers else None
        ratio = counts["ekrt"] / peers[best] if best and isinstance(counts.get("ekrt"), int) else None
        ekm = f"{model}.avx2.ekm" if (prep / f"{model}.avx2.ekm").exists() else f"{model}.ekm"
        rows.append({"model": model, "ekrt_file": ekm, **counts, "noise": noise, "best_peer": best, "ekrt_over_best": ratio})
        print(f"{model}: {counts} ekrt/best {ratio if ratio is None else round(ratio, 2)} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.markdown:
        print("| model | ekrt int8 (AVX2) M instr | ekrt's file | ORT int8 M instr | OpenVINO int8 M instr | best int8 peer | ekrt / best |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            cell = {rt: (f"{r[rt] / 1e6:.1f}" + (f" ± {r['noise'][rt] / 1e6:.1f}" if r["noise"].get(rt, 0) >= 50_000 else ""))
                    if isinstance(r.get(rt), int) else ("failed" if rt in r else "-") for rt in RUNTIMES}
            ratio = f"{r['ekrt_over_best']:.2f}×" if r["ekrt_over_best"] is not None else "-"
            print(f"| {r['model']} | {cell['ekrt']} | `{r['ekrt_file']}` | {cell['ort_int8']} | {cell['ov_int8']} | {r['best_peer'] or '-'} | {ratio} |")
    else:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
