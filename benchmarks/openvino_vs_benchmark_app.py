"""edgekit bench's latency against the runtime's own tool: OpenVINO's ``benchmark_app`` on the same
model file, and for ONNX Runtime the floor a Python caller can reach.

Both tools time the same file, with the same settings, each run in a process of its own, in
interleaved rounds (so a slow patch of a shared machine hits both alike):

* **OpenVINO**: ``benchmark_app -m MODEL -d CPU -hint latency -api sync -infer_precision f32 -t S``
  (one stream, one request, synchronous infers; f32 as edgekit's plan asks, or OpenVINO would run
  bf16 on CPUs that have it; ``-shape`` where the model's input is dynamic; ``--threads N``: a
  ``-load_config`` of the latency hint with ``INFERENCE_NUM_THREADS`` N, what edgekit's agent sets)
  against ``edgekit bench MODEL --backend openvino --duration S --no-layers [--threads N]`` (the same
  hint, precision, shape and threads). benchmark_app's figure is the median of ``InferRequest.latency``; edgekit's is the p50 of
  the agent's samples. The threads each ran with are printed (they must agree).
* **ONNX Runtime** (``--peers onnxruntime``): ORT ships no benchmark tool on pip
  (onnxruntime_perf_test is a source build), so the peer is the floor of a Python caller: a
  minimal loop of ``run_with_iobinding`` on pre-bound inputs and outputs
  (``InferenceSession._sess.run_with_iobinding``, timed with ``perf_counter_ns``), all graph
  optimizations, ``--threads`` threads, against ``edgekit bench --backend onnxruntime --threads N``.

``--threads`` defaults to 1: on a shared 2-core VM two threads per runtime stall on each other's
busy core, and that noise would drown the harness share this compares.

Models: the digits CNN (1x1x8x8) and the MobileNetV2 example (1x3x64x64), fp32 as shipped and
int8 as ``edgekit quantize --target x86-openvino`` writes it (the openvino scheme's QDQ model; ORT
runs the same file). The ratio is edgekit / peer per round; the median of the rounds is printed
(goal: 0.95-1.05). Nothing is asserted: this is a measurement, not a test.

    python benchmarks/openvino_vs_benchmark_app.py                        # 5 rounds of 2 s
    python benchmarks/openvino_vs_benchmark_app.py --rounds 7 --peers openvino,onnxruntime
    python benchmarks/openvino_vs_benchmark_app.py --markdown             # a table for docs/benchmarks.md
    python benchmarks/openvino_vs_benchmark_app.py --compare-with /tmp/ek-before   # also an older checkout's edgekit bench
    python benchmarks/openvino_vs_benchmark_app.py --json > run.json; ... --render run.json --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "digits": (ROOT / "examples/digits/digits_cnn.onnx", None),
    "mobilenetv2": (ROOT / "examples/mobilenetv2/mobilenetv2.onnx", ("input", (1, 3, 64, 64))),
}
PEERS = ("openvino", "onnxruntime")
TIMEOUT = 600

# The ONNX Runtime floor: one process, the loop a Python caller cannot undercut.
_ORT_FLOOR = r"""
import json, sys, time
import numpy as np, onnxruntime as ort
path, shape, threads, seconds = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
opts = ort.SessionOptions()
opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
opts.intra_op_num_threads = threads
s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
inp = s.get_inputs()[0]
dims = shape or [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
x = np.random.RandomState(0).standard_normal(dims).astype(np.float32)
outs = s.run(None, {inp.name: x})
io = s.io_binding()
io.bind_cpu_input(inp.name, x)
keep = [o.copy() for o in outs]
for meta, arr in zip(s.get_outputs(), keep):
    io.bind_ortvalue_output(meta.name, ort.OrtValue.ortvalue_from_numpy(arr))
run, handle, ro = s._sess.run_with_iobinding, io._iobinding, ort.RunOptions()
clock = time.perf_counter_ns
end = clock() + int(0.2e9)
while clock() < end:
    run(handle, ro)
samples = []
end = clock() + int(seconds * 1e9)
while True:
    t = clock(); run(handle, ro); now = clock()
    samples.append(now - t)
    if now >= end:
        break
print(json.dumps({"p50_ns": float(np.percentile(samples, 50)), "n": len(samples), "threads": threads}))
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sh(argv: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=cwd)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv[:6]))} ... exited {proc.returncode}: {(proc.stderr or proc.stdout)[-800:]}")
    return proc.stdout


def benchmark_app() -> list[str]:
    """OpenVINO's benchmark_app: the wheel's console script beside this Python, else its module."""
    found = Path(sys.executable).with_name("benchmark_app")
    if found.exists():
        return [str(found)]
    try:  # the venv that holds openvino (scripts/env.sh keeps the deps in a venv of their own)
        import openvino

        beside = Path(openvino.__file__).resolve().parents[4] / "bin" / "benchmark_app"  # VENV/lib/pythonX.Y/site-packages/openvino
        if beside.exists():
            return [str(beside)]
    except ImportError:
        pass
    if shutil.which("benchmark_app"):
        return [shutil.which("benchmark_app")]
    return [sys.executable, "-m", "openvino.tools.benchmark.main"]


def run_benchmark_app(path: Path, shape, seconds: int, threads: int, work: Path) -> dict:
    argv = [*benchmark_app(), "-m", str(path), "-d", "CPU", "-hint", "latency", "-api", "sync", "-infer_precision", "f32", "-t", str(seconds)]
    if threads:  # the latency hint and a thread count, as edgekit's agent sets them (-nthreads needs -hint none)
        config = work / f"ov-threads-{threads}.json"
        config.write_text(json.dumps({"CPU": {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads)}}))
        argv += ["-load_config", str(config)]
    if shape:
        argv += ["-shape", f"{shape[0]}[{','.join(map(str, shape[1]))}]"]
    out = sh(argv)
    median = re.search(r"Median:\s+([\d.]+)\s*(us|ms)", out)
    threads = re.search(r"INFERENCE_NUM_THREADS:\s*(\d+)", out)
    count = re.search(r"Count:\s+(\d+)", out)
    if not median:
        raise RuntimeError(f"benchmark_app printed no median latency:\n{out[-1500:]}")
    value = float(median.group(1)) * (1e3 if median.group(2) == "us" else 1e6)
    return {"p50_ns": value, "threads": int(threads.group(1)) if threads else None, "n": int(count.group(1)) if count else None}


def run_edgekit(path: Path, shape, backend: str, seconds: float, env: dict, threads: int | None, checkout: Path) -> dict:
    argv = [sys.executable, "-m", "edgekit", "bench", str(path), "--backend", backend, "--target", "local",
            "--duration", str(seconds), "--no-layers", "--json"]  # fmt: skip
    if shape:
        argv += ["--shape", f"{shape[0]}:{','.join(map(str, shape[1]))}"]
    if threads:
        argv += ["--threads", str(threads)]
    # python -m puts the working directory first on sys.path, before PYTHONPATH: run in the checkout
    record = json.loads(sh(argv, {**env, "PYTHONPATH": str(checkout)}, cwd=checkout))[0]
    agent = record["agent"]
    samples = sorted(agent["samples_ns"])
    return {
        "p50_ns": record["stats"]["p50"] * 1e6,
        "threads": agent["config"].get("threads") or (agent.get("backend_info") or {}).get("threads"),
        "n": len(samples),
        "timing": (agent.get("backend_info") or {}).get("timing"),
    }


def run_ort_floor(path: Path, shape, seconds: float, threads: int) -> dict:
    dims = list(shape[1]) if shape else None
    return json.loads(sh([sys.executable, "-c", _ORT_FLOOR, str(path), json.dumps(dims), str(threads), str(seconds)]))


def quantize(name: str, path: Path, out: Path, env: dict) -> Path:
    target = out / f"{name}.int8.onnx"
    sh([sys.executable, "-m", "edgekit", "quantize", str(path), "-o", str(target), "--target", "x86-openvino"], {**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    return target


def machine() -> str:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = re.search(r"model name\s*:\s*(.+)", text).group(1).strip()
        flags = set(re.search(r"flags\s*:\s*(.+)", text).group(1).split())
    except (OSError, AttributeError):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8") if f in flags]
    return f"{os.cpu_count()}-core {platform.machine()}, {model} ({', '.join(isa) or 'no AVX2'})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of: " + ", ".join(MODELS))
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--peers", default="openvino", help="comma list of: openvino (benchmark_app), onnxruntime (a minimal iobinding loop)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=2, help="timed window of each run (whole seconds: benchmark_app -t takes those)")
    ap.add_argument("--threads", type=int, default=1,
                    help="inference threads, both tools (0: each runtime's default; ORT's floor then uses 1 thread)")  # fmt: skip
    ap.add_argument("--compare-with", type=Path, help="another edgekit checkout whose edgekit bench is timed too (before/after)")
    ap.add_argument("--markdown", action="store_true", help="a markdown table for docs/benchmarks.md")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--render", type=Path, metavar="FILE", help="print the table of an earlier --json run instead of measuring")
    a = ap.parse_args()
    if a.render:
        render(json.loads(a.render.read_text()), a.markdown)
        return 0
    models = [m for m in a.models.split(",") if m]
    peers = [p for p in a.peers.split(",") if p]
    precisions = [p for p in a.precisions.split(",") if p]
    bad = [m for m in models if m not in MODELS] + [p for p in peers if p not in PEERS] + [p for p in precisions if p not in ("fp32", "int8")]
    if bad or a.rounds < 1 or a.seconds <= 0:
        ap.error(f"unknown or bad values: {', '.join(bad) or 'rounds/seconds must be positive'}")
    checkouts = {"edgekit": ROOT}
    if a.compare_with:
        checkouts["before"] = a.compare_with.resolve()

    with tempfile.TemporaryDirectory(prefix="ek-vs-bapp-") as tmp:
        work = Path(tmp)
        # edgekit's own store and caches: this run's records stay out of the user's results
        env = {**os.environ, "EDGEKIT_DATA_DIR": str(work / "data"), "XDG_CACHE_HOME": str(work / "cache"), "CI": "1"}
        files = {}
        for name in models:
            path, shape = MODELS[name]
            if "fp32" in precisions:
                files[(name, "fp32")] = (path, shape)
            if "int8" in precisions:
                log(f"quantizing {name} (edgekit quantize --target x86-openvino) ...")
                files[(name, "int8")] = (quantize(name, path, work, env), shape)
        results: dict = {}
        for r in range(a.rounds):
            for (name, precision), (path, shape) in files.items():
                jobs = []
                for peer in peers:
                    if peer == "openvino":
                        jobs.append((("openvino", "peer"), lambda p=path, s=shape: run_benchmark_app(p, s, a.seconds, a.threads, work)))
                    else:
                        jobs.append((("onnxruntime", "peer"), lambda p=path, s=shape: run_ort_floor(p, s, a.seconds, a.threads or 1)))
                    for label, checkout in checkouts.items():
                        jobs.append(((peer, label), lambda p=path, s=shape, b=peer, c=checkout: run_edgekit(p, s, b, a.seconds, env, a.threads or None, c)))
                if r % 2:
                    jobs.reverse()  # alternate who goes first
                for (peer, who), job in jobs:
                    got = job()
                    results.setdefault((name, precision, peer), {}).setdefault(who, []).append(got)
                    log(f"round {r + 1}: {name} {precision} {peer} {who}: p50 {got['p50_ns'] / 1e3:.1f} us ({got.get('threads')} threads)")

    rows = []
    for (name, precision, peer), by in results.items():
        peer_p50 = [x["p50_ns"] for x in by["peer"]]
        row = {"model": name, "precision": precision, "peer": "benchmark_app" if peer == "openvino" else "ORT iobinding loop",
               "backend": peer, "peer_p50_us": statistics.median(peer_p50) / 1e3,
               "peer_threads": sorted({x["threads"] for x in by["peer"]}), "rounds": len(peer_p50)}  # fmt: skip
        for label in checkouts:
            mine = [x["p50_ns"] for x in by[label]]
            row[f"{label}_p50_us"] = statistics.median(mine) / 1e3
            row[f"{label}_ratio"] = statistics.median(m / p for m, p in zip(mine, peer_p50))
            row[f"{label}_threads"] = sorted({x["threads"] for x in by[label]})
            row[f"{label}_timing"] = by[label][0].get("timing")
        rows.append(row)

    doc = {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": a.seconds,
           "threads": a.threads, "rounds": a.rounds, "checkouts": list(checkouts), "rows": rows}  # fmt: skip
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        render(doc, a.markdown)
    return 0


def render(doc: dict, markdown: bool) -> None:
    """The table of a run (``--json``'s document): plain, or markdown for docs/benchmarks.md."""
    rows, extra = doc["rows"], [k for k in doc["checkouts"] if k != "edgekit"]
    if markdown:
        head = "| model | precision | peer | peer p50 us | edgekit p50 us | edgekit / peer |" + "".join(f" {k} p50 us | {k} / peer |" for k in extra) + " threads (peer / edgekit) |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in rows:
            cells = [row["model"], row["precision"], row["peer"], f"{row['peer_p50_us']:.1f}", f"{row['edgekit_p50_us']:.1f}", f"**{row['edgekit_ratio']:.2f}**"]
            cells += [v for k in extra for v in (f"{row[f'{k}_p50_us']:.1f}", f"{row[f'{k}_ratio']:.2f}")]
            cells.append(f"{row['peer_threads']} / {row['edgekit_threads']}")
            print("| " + " | ".join(map(str, cells)) + " |")
        print(f"\n{doc['machine']}, {doc['date']}; {doc['rounds']} interleaved rounds of {doc['seconds']} s per tool, each its own "
              "process; ratio = median over rounds of edgekit p50 / peer p50.")  # fmt: skip
        return
    print(f"{'model':<12} {'prec':<5} {'peer':<19} {'peer us':>9} {'edgekit us':>11} {'ratio':>6}" + "".join(f" {k + ' us':>10} {k:>7}" for k in extra) + "  threads")
    for row in rows:
        line = f"{row['model']:<12} {row['precision']:<5} {row['peer']:<19} {row['peer_p50_us']:>9.1f} {row['edgekit_p50_us']:>11.1f} {row['edgekit_ratio']:>6.2f}"
        line += "".join(f" {row[f'{k}_p50_us']:>10.1f} {row[f'{k}_ratio']:>7.2f}" for k in extra)
        print(line + f"  {row['peer_threads']} / {row['edgekit_threads']}")
    print(f"# {doc['machine']}, {doc['date']}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
