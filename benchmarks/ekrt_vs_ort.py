"""ekrt (edgekit's int8 runtime) against ONNX Runtime and OpenVINO, int8 and fp32, on the same QDQ models.

For each model: quantize once with edgekit's native scheme (the QDQ model ORT runs), lower it
to ``.ekm`` (what ekrt runs), and measure in one run:

* latency p50, 1 thread and all threads, interleaved in rounds so machine drift hits all alike
  (a round times each ``--iterations`` times; the figure is the median over rounds of the
  per-round median). Peers: ORT int8 (the QDQ model) and fp32 (the prepared float model), and
  OpenVINO's CPU plugin on the same two files when it is installed (``PERFORMANCE_HINT``
  LATENCY, ``INFERENCE_NUM_THREADS``, fp32 inference precision for the float model); the
  ratios are ekrt over the best int8 peer and over the best peer of any precision. ORT through
  its Python API; ekrt through its CPython extension
  ``edgekit._ekrt`` in the same process with 1 thread, and with all threads through its static
  runner in its own process (ORT's idle workers spin after each run and would steal the cores
  from ekrt's in a shared process). The runner's 1-thread p50 is shown as a cross-check;
* peak RSS of a process that loads the model and runs it 20 times: the static runner, and a
  Python process with ORT (minus a bare ``python -c "import numpy"``, so the interpreter is
  not held against ORT: both figures are shown);
* the static runner's size, for this machine and for aarch64 (cross-built);
* with ``--arm-counts``: executed aarch64 instructions per inference of the cross-built
  runner under ``qemu-aarch64 -d in_asm,exec,nochain`` (Cortex-A72 NEON path and Cortex-A76
  dot-product path) as a proxy for ARM speed, the difference of a k-iteration and a 1-iteration
  run, so start-up cancels out.

Machines are noisy: only medians and ratios are printed.

    python benchmarks/ekrt_vs_ort.py
    python benchmarks/ekrt_vs_ort.py --models digits,mobilenetv2-224 --rounds 9 --arm-counts
    python benchmarks/ekrt_vs_ort.py --models digits,mtcnn-onet   # catalogue names (tests/realmodels.py) too
    python benchmarks/ekrt_vs_ort.py --json > ekrt_vs_ort.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from edgekit.modelio import load_model  # noqa: E402
from edgekit.quantize import SCHEMES, FeedSet, load_feeds, quantize_model, save_model  # noqa: E402
from edgekit.targets.native import build, ekm  # noqa: E402
from edgekit.targets.native.lower import lower  # noqa: E402

RSS_RUNS = 20


def _random(shape, n, seed) -> FeedSet:
    rng = np.random.default_rng(seed)
    return FeedSet([{"input": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)], f"normal({seed})")


def model_digits():
    loaded = load_model(ROOT / "examples/digits/digits_cnn.onnx")
    sc = loaded.sidecar
    return loaded, load_feeds(sc.calibration, loaded.inputs), load_feeds(sc.evaluation, loaded.inputs)


def model_mobilenetv2(size: int):
    def make():
        path = ROOT / "examples/mobilenetv2/mobilenetv2.onnx"
        if size == 64:
            loaded = load_model(path)
            sc = loaded.sidecar
            return loaded, load_feeds(sc.calibration, loaded.inputs), load_feeds(sc.evaluation, loaded.inputs)
        loaded = load_model(path, {"input": (1, 3, size, size)})
        return loaded, _random((1, 3, size, size), 16, 0), _random((1, 3, size, size), 4, 1)
    return make


def model_resnet_shaped():
    from test_native_lower import resnet_shaped

    tmp = Path(tempfile.mkdtemp(prefix="ekrt-bench-"))
    onnx.save(resnet_shaped(), tmp / "resnet_shaped.onnx")
    return load_model(tmp / "resnet_shaped.onnx"), _random((1, 3, 32, 32), 16, 0), _random((1, 3, 32, 32), 4, 1)


def model_ocr_cls():
    from realmodels import cls_samples, find_rapidocr_model

    try:
        path = find_rapidocr_model("cls")
    except LookupError as exc:
        raise SystemExit(f"ocr-cls: {exc}") from None
    loaded = load_model(path, {"x": (1, 3, 48, 192)})
    return (loaded, FeedSet([{"x": s[None]} for s in cls_samples(32, seed=0)], "cls"),
            FeedSet([{"x": s[None]} for s in cls_samples(4, seed=1)], "cls"))


MODELS = {
    "digits": model_digits,
    "mobilenetv2": model_mobilenetv2(64),
    "mobilenetv2-224": model_mobilenetv2(224),
    "resnet-shaped": model_resnet_shaped,
    "ocr-cls": model_ocr_cls,
}


def model_catalogue(name: str, n_calib: int = 16, n_held: int = 4):
    """A real model of tests/realmodels.py's CATALOGUE at its static input shapes, with its own
    calibration and held-out samples (never the same)."""
    from realmodels import CATALOGUE

    m = CATALOGUE[name]
    try:
        loaded = load_model(m.locate(), {k: v for k, v in m.inputs.items() if v})
    except LookupError as exc:
        raise SystemExit(f"{name}: {exc}") from None
    return loaded, FeedSet(m.calib(n_calib).feeds, f"{name} calib({n_calib})"), FeedSet(m.eval(n_held).feeds, f"{name} eval({n_held})")


def model_factory(name: str):
    """``--models`` names: this file's MODELS, else a catalogue model."""
    return MODELS.get(name) or (lambda: model_catalogue(name))


# -- latency --------------------------------------------------------------------------------------


def _median_loop(run, feed, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        run(feed)
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times)


def latency(fp32: Path, qdq: Path, ekm_path: Path, feed: dict, threads: int, rounds: int, iterations: int,
            runner: Path, tmp: Path) -> dict[str, float]:
    """Median over rounds of per-round medians, in ms. With all threads ekrt is timed by its
    static runner in its own process: ORT's idle workers spin for a while after every run and,
    in the same process on a small machine, would steal the cores from ekrt's workers."""
    import edgekit._ekrt as ekrt

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return lambda f: s.run(None, f)

    runs = {"ort_int8": session(qdq), "ort_fp32": session(fp32), **openvino_sessions(qdq, fp32, threads)}
    if threads == 1:
        m = ekrt.Model(str(ekm_path))
        m.set_threads(1)
        runs = {"ekrt": m.run, **runs}
    for run in runs.values():  # warm-up
        for _ in range(max(3, iterations // 5)):
            run(feed)
    per_round: dict[str, list[float]] = {k: [] for k in runs}
    if threads != 1:
        per_round["ekrt"] = []
    for _ in range(rounds):
        for name, run in runs.items():
            per_round[name].append(_median_loop(run, feed, iterations))
        if threads != 1:
            time.sleep(0.5)  # let ORT's workers stop spinning first: they would share the cores
            per_round["ekrt"].append(runner_p50(runner, ekm_path, feed, tmp, iterations, threads=os.cpu_count() or 1) * 1e6)
    return {k: statistics.median(v) / 1e6 for k, v in per_round.items()}


def openvino_sessions(qdq: Path, fp32: Path, threads: int) -> dict:
    """OpenVINO CPU on the same QDQ and float files, or nothing when it is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return {}
    core = ov.Core()

    def session(path: Path, precision: str | None):
        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        request = core.compile_model(str(path), "CPU", config).create_infer_request()
        return lambda f: request.infer(f)

    return {"ov_int8": session(qdq, None), "ov_fp32": session(fp32, "f32")}


def best_peers(t: dict[str, float]) -> dict[str, float]:
    """ekrt's time over the best int8 peer's and over the best peer's of any precision."""
    int8 = min(v for k, v in t.items() if k.endswith("_int8"))
    anyp = min(v for k, v in t.items() if k != "ekrt")
    return {"vs_best_int8": t["ekrt"] / int8, "vs_best_any": t["ekrt"] / anyp}


def runner_p50(runner: Path, ekm_path: Path, feed: dict, tmp: Path, iterations: int, threads: int = 1) -> float:
    files = []
    for i, arr in enumerate(feed.values()):
        files.append(tmp / f"in{i}.npy")
        np.save(files[-1], arr.astype(np.float32))
    out = subprocess.run([str(runner), "bench", str(ekm_path), "--json", "--threads", str(threads), "--warmup", "10",
                          "--iterations", str(iterations), "--inputs", *map(str, files)], capture_output=True, text=True, check=True)
    return statistics.median(json.loads(out.stdout)["samples_ns"]) / 1e6


# -- memory ---------------------------------------------------------------------------------------

def _peak_rss(argv: list[str]) -> int | None:
    """Peak RSS of ``argv`` as GNU time (``/usr/bin/time -f %M``) reports its child. Not
    measured with wait4 from here: Linux carries ru_maxrss over exec, so a child spawned from
    this big Python process would inherit this process's peak."""
    gnu_time = shutil.which("time", path="/usr/bin:/bin")
    if gnu_time is None:
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as fh:
        subprocess.run([gnu_time, "-f", "%M", "-o", fh.name, *argv], stdout=subprocess.DEVNULL, check=True)
        return int(fh.read().split()[-1]) * 1024


_ORT_RSS = """
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
f = dict(np.load(sys.argv[2]))
for _ in range({n}): s.run(None, f)
"""


def peak_rss(runner: Path, ekm_path: Path, qdq: Path, fp32: Path, feed: dict, tmp: Path) -> dict[str, int]:
    npz = tmp / "feed.npz"
    np.savez(npz, **feed)
    files = []
    for i, arr in enumerate(feed.values()):
        files.append(str(tmp / f"rss{i}.npy"))
        np.save(files[-1], arr.astype(np.float32))
    out = {"ekrt_runner": _peak_rss([str(runner), "bench", str(ekm_path), "--json", "--threads", "1", "--warmup", "0",
                                     "--iterations", str(RSS_RUNS), "--inputs", *files])}
    py = sys.executable
    out["python_numpy"] = _peak_rss([py, "-c", "import numpy"])
    out["ort_int8"] = _peak_rss([py, "-c", _ORT_RSS.format(n=RSS_RUNS), str(qdq), str(npz)])
    out["ort_fp32"] = _peak_rss([py, "-c", _ORT_RSS.format(n=RSS_RUNS), str(fp32), str(npz)])
    return out


# -- aarch64 instruction counts under qemu ----------------------------------------------------------

def executed_instructions(log: Path) -> int:
    """Σ over the `Trace` lines of the instruction count of the block at that guest pc (from
    the block's `IN:` listing): ``-d in_asm,exec,nochain`` logs every execution of a block."""
    return sum(executed_blocks(log).values())


def executed_blocks(log: Path) -> dict[int, int]:
    """Instructions executed per block (guest pc), as :func:`executed_instructions` sums them."""
    out: dict[int, int] = {}
    for (_cpu, pc), n in executed_by_cpu_block(log).items():
        out[pc] = out.get(pc, 0) + n
    return out


def executed_by_cpu_block(log: Path) -> dict[tuple[int, int], int]:
    """Instructions executed per (guest CPU, block pc): each ``Trace N: ... [../<pc>/..]`` line is
    one execution by guest CPU N (a thread, in qemu-user) of the block whose size its ``IN:``
    listing gives."""
    sizes: dict[int, int] = {}
    counts: Counter = Counter()
    cur, n = None, 0
    with open(log, "rb") as fh:
        for line in fh:
            c = line[:1]
            if c == b"0":  # "0x<pc>:  <encoding>  <instruction>"
                if cur is None:
                    cur = int(line[2:line.index(b":")], 16)
                n += 1
            elif c == b"T":  # "Trace N: 0xHOST [flags/<guest pc>/...]"
                if cur is not None:
                    sizes[cur], cur, n = n, None, 0
                counts[(int(line[6:line.index(b":")]), line.split(b"/", 2)[1])] += 1
            elif cur is not None:
                sizes[cur], cur, n = n, None, 0
    if cur is not None:
        sizes[cur] = n
    return {(cpu, int(pc, 16)): sizes.get(int(pc, 16), 0) * k for (cpu, pc), k in counts.items()}


def _files(feed: dict, tmp: Path, stem: str) -> list[str]:
    files = []
    for i, arr in enumerate(feed.values()):
        files.append(str(tmp / f"{stem}{i}.npy"))
        np.save(files[-1], arr.astype(np.float32))
    return files


def arm_counts_ekrt(ekm_path: Path, feed: dict, tmp: Path, qemu: str, k: int) -> dict[str, int]:
    runner = build.build_runner("aarch64")
    files = _files(feed, tmp, "arm")
    out = {}
    for cpu in ARM_CPUS:
        totals = {}
        for iters in (1, 1 + k):
            log = tmp / f"qemu-{cpu}-{iters}.log"
            subprocess.run([qemu, "-cpu", cpu, "-d", "in_asm,exec,nochain", "-D", str(log), str(runner), "bench", str(ekm_path),
                            "--json", "--threads", "1", "--warmup", "0", "--iterations", str(iters), "--inputs", *files],
                           capture_output=True, check=True)
            totals[iters] = executed_instructions(log)
            log.unlink()
        out[cpu] = (totals[1 + k] - totals[1]) // k
    return out


ARM_CPUS = {"cortex-a72": (0x8FB, 0), "cortex-a76": (0x119FFB, 0)}  # qemu's AT_HWCAP, AT_HWCAP2


def aarch64_site(dist: str, version: str, tmp: Path) -> Path:
    """``dist==version``'s manylinux aarch64 cp311 wheel (the rootfs's Python), unpacked in ``tmp``."""
    site = tmp / f"{dist}-aarch64"
    if not site.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", f"{dist}=={version}", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "-d", str(tmp / f"{dist}-wheel"),
                        *[a for t in (17, 27, 28, 31, 34, 35, 36) for a in ("--platform", f"manylinux_2_{t}_aarch64")]],
                       check=True, capture_output=True)
        import zipfile

        zipfile.ZipFile(next((tmp / f"{dist}-wheel").glob("*.whl"))).extractall(site)
    return site


def arm_counts_guest(script: str, model: Path, feed: dict, tmp: Path, qemu: str, k: int, rootfs: Path, site: Path) -> dict[str, int] | str:
    """A Python runtime's aarch64 wheel under qemu, in the armboard rootfs's Python (an
    ARM-looking /proc/cpuinfo bind-mounted, or ORT and LiteRT crash on import), counting only
    the instructions inside the runtime's own libraries (``-dfilter`` over the code ranges that
    ``script`` prints as its last line; address layout fixed with ``setarch -R``).
    ``script`` gets argv: model, iterations, one .npy per input."""
    if os.geteuid() != 0:
        return "needs root (a mount namespace for an ARM /proc/cpuinfo)"
    if not (rootfs / "usr/bin/python3").exists():
        return f"no aarch64 rootfs with python3 at {rootfs} (python -m tests.lab.armboard builds one)"
    from tests.lab import armboard

    script_path = tmp / "guest_script.py"
    script_path.write_text(script)
    files = _files(feed, tmp, "guestarm")
    out: dict[str, int] = {}
    ranges = None
    for cpu, hw in ARM_CPUS.items():
        cpuinfo = tmp / f"cpuinfo-{cpu}"
        cpuinfo.write_text(armboard.cpuinfo_text(cpu, hw[0], hw[1], 1))

        def run(iters: int, dfilter: str | None, cpu: str = cpu, cpuinfo: Path = cpuinfo) -> str:
            trace = f"-d in_asm,exec,nochain -dfilter {dfilter} -D {tmp}/guest-{iters}.log" if dfilter else ""
            env = (f"LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu/blas:/usr/lib/aarch64-linux-gnu/lapack PYTHONPATH={site}")
            cmd = (f"mount --bind {cpuinfo} /proc/cpuinfo && {env} {qemu} -cpu {cpu} -L {rootfs} {trace} "
                   f"{rootfs}/usr/bin/python3 {script_path} {model} {iters} {' '.join(files)}")
            return subprocess.run(["setarch", platform.machine(), "-R", "unshare", "-m", "sh", "-c", cmd],
                                  capture_output=True, text=True, check=True).stdout.split()[-1]

        ranges = ranges or run(0, None)  # one start-up costs minutes under qemu: the layout is fixed, asserted below
        dfilter = ",".join(f"0x{lo}..0x{int(hi, 16) - 1:x}" for lo, hi in (r.split("-") for r in ranges.split(",")))
        blocks = []
        for iters in (1, 1, 1 + k):
            assert run(iters, dfilter) == ranges, "the runtime moved: addresses are not fixed"
            log = tmp / f"guest-{iters}.log"
            blocks.append(executed_blocks(log))
            log.unlink()
        # ORT's start-up runs a varying amount of work (seen: 65 M and 238 M instructions in two
        # identical 1-run starts, mostly one zlib-deflate-like loop): blocks whose count differs
        # between the two 1-run starts are start-up noise, left out of the difference.
        once, again, many = blocks
        noisy = {pc for pc in once.keys() | again.keys() if once.get(pc, 0) != again.get(pc, 0)}
        out[cpu] = sum(n - once.get(pc, 0) for pc, n in many.items() if pc not in noisy) // k
        out[f"{cpu}_noise_left_out"] = sum(abs(once.get(pc, 0) - again.get(pc, 0)) for pc in noisy)
    return out


def _code_ranges(marker: str) -> str:
    """Guest-script tail: print the executable mappings of files whose path holds ``marker``."""
    return f"""
print(",".join(l.split()[0] for l in open("/proc/self/maps") if {marker!r} in l and " r-xp " in l))
"""


_ORT_ARM = """
import sys, numpy as np, onnxruntime as ort
o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], o, providers=["CPUExecutionProvider"])
feed = {i.name: np.load(f) for i, f in zip(s.get_inputs(), sys.argv[3:])}
for _ in range(int(sys.argv[2])):
    s.run(None, feed)
""" + _code_ranges("onnxruntime_pybind11_state")


def arm_counts_ort(qdq: Path, feed: dict, tmp: Path, qemu: str, k: int, rootfs: Path) -> dict[str, int] | str:
    """ORT's aarch64 wheel (the host's version), counted inside its library only."""
    return arm_counts_guest(_ORT_ARM, qdq, feed, tmp, qemu, k, rootfs, aarch64_site("onnxruntime", ort.__version__, tmp))


def arm_counts(ekm_path: Path, qdq: Path, feed: dict, tmp: Path, rootfs: Path, k: int = 4) -> dict:
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        return {"error": "qemu-aarch64 is not installed"}
    out = {"ekrt": arm_counts_ekrt(ekm_path, feed, tmp, qemu, k)}
    try:
        out["ort_int8"] = arm_counts_ort(qdq, feed, tmp, qemu, k, rootfs)
    except (subprocess.CalledProcessError, AssertionError, OSError) as exc:
        out["ort_int8"] = f"failed: {exc}"
    return out


# -- the run ------------------------------------------------------------------------------------------


def bench_model(name: str, args, runner: Path, tmp: Path) -> dict:
    loaded, calib, held = model_factory(name)()
    result = quantize_model(loaded, SCHEMES["native"], calib, held)
    d = tmp / name
    d.mkdir()
    fp32, qdq, ekm_path = d / "fp32.onnx", d / "int8.qdq.onnx", d / "int8.ekm"
    from edgekit.quantize.prepare import prepare

    onnx.save(prepare(loaded.model, loaded.inputs, 13), fp32)  # static shapes, BN folded: ORT's best float
    save_model(result.model, qdq)
    m, report = lower(result.model)
    ekm.save(m, ekm_path)
    feed = held.feeds[0]
    doc: dict = {"model": name, "ekm_ops": dict(Counter(op.type_name for op in m.ops)), "arena_bytes": m.arena_size}
    for threads in (1, 0):
        key = "1_thread" if threads == 1 else "all_threads"
        doc[key] = latency(fp32, qdq, ekm_path, feed, threads, args.rounds, args.iterations, runner, d)
    doc["runner_p50_ms_1_thread"] = runner_p50(runner, ekm_path, feed, d, args.iterations * args.rounds)
    doc["peak_rss"] = peak_rss(runner, ekm_path, qdq, fp32, feed, d)
    if args.arm_counts:
        doc["arm_instructions_per_inference"] = arm_counts(ekm_path, qdq, feed, d, Path(args.arm_rootfs))
    return doc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="digits,mobilenetv2,mobilenetv2-224,resnet-shaped,ocr-cls")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iterations", type=int, default=30, help="timed runs per session per round")
    p.add_argument("--arm-counts", action="store_true", help="count aarch64 instructions under qemu (slow)")
    p.add_argument("--arm-rootfs", default=str(Path.home() / ".cache/edgekit-dev/rootfs-arm64"),
                   help="an aarch64 Debian root with python3 + numpy, for ORT's aarch64 build (tests/lab/armboard.py)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    runner = build.build_runner()
    sizes = {build.host_arch(): runner.stat().st_size}
    try:
        sizes["aarch64"] = build.build_runner("aarch64").stat().st_size
    except Exception as exc:  # no cross compiler: say so, keep going
        sizes["aarch64"] = f"not built: {exc}"
    import edgekit._ekrt as ekrt

    out = {"schema": 1, "machine": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "onnxruntime": ort.__version__, "ekrt_isa": ekrt.isa(), "runner_bytes": sizes, "models": []}
    with tempfile.TemporaryDirectory(prefix="ekrt-vs-ort-") as tmpdir:
        for name in args.models.split(","):
            out["models"].append(bench_model(name.strip(), args, runner, Path(tmpdir)))
            if not args.json:
                _print_model(out["models"][-1])
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"\nekrt ISA {out['ekrt_isa']}, ORT {out['onnxruntime']}, {out['cores']} cores; static runner: "
              + ", ".join(f"{a} {s / 1024:.0f} KB" if isinstance(s, int) else f"{a} {s}" for a, s in sizes.items()))


def _print_model(d: dict) -> None:
    print(f"\n== {d['model']}  ({sum(d['ekm_ops'].values())} ekrt ops, arena {d['arena_bytes'] / 1024:.0f} KB)")
    peers = [k for k in ("ort_int8", "ort_fp32", "ov_int8", "ov_fp32") if k in d["1_thread"]]
    print(f"{'':14s}{'ekrt ms':>10s}" + "".join(f"{k:>10s}" for k in peers) + f"{'/best int8':>12s}{'/best any':>11s}")
    for key in ("1_thread", "all_threads"):
        t = d[key]
        r = best_peers(t)
        print(f"{key:14s}{t['ekrt']:10.3f}" + "".join(f"{t[k]:10.3f}" for k in peers)
              + f"{r['vs_best_int8']:12.2f}{r['vs_best_any']:11.2f}")
    print(f"static runner `ekrt bench` p50, 1 thread: {d['runner_p50_ms_1_thread']:.3f} ms")
    r = d["peak_rss"]
    if r["ekrt_runner"] is None:
        print("peak RSS: not measured (install GNU time: apt-get install time)")
        return _print_arm(d)
    base = r["python_numpy"]
    print(f"peak RSS MB: ekrt runner {r['ekrt_runner'] / 2**20:.1f} | ORT int8 {r['ort_int8'] / 2**20:.1f} "
          f"({(r['ort_int8'] - base) / 2**20:.1f} over python+numpy {base / 2**20:.1f}) | ORT fp32 {r['ort_fp32'] / 2**20:.1f}; "
          f"ratio ekrt/ORT int8 {r['ekrt_runner'] / r['ort_int8']:.2f} (vs ORT's own share {r['ekrt_runner'] / max(1, r['ort_int8'] - base):.2f})")
    _print_arm(d)


def _print_arm(d: dict) -> None:
    a = d.get("arm_instructions_per_inference")
    if not a:
        return
    if "error" in a:
        print(f"aarch64 instructions: {a['error']}")
        return
    for cpu in ARM_CPUS:
        e, o = a["ekrt"][cpu], a["ort_int8"][cpu] if isinstance(a["ort_int8"], dict) else None
        print(f"aarch64 instructions per inference, {cpu} (qemu): ekrt {e:,}" + (f" | ORT int8 {o:,} | ratio {e / o:.2f}" if o else f" | ORT: {a['ort_int8']}"))


if __name__ == "__main__":
    main()
