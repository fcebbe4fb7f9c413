"""ekrt's thread scaling against ONNX Runtime and OpenVINO; a busy core; the split break-even.

Three modes:

``--scaling`` (issue 29): for each model, time 1, 2, 4, ... all usable threads for ekrt int8
(the ``.ekm``), ONNX Runtime fp32 and int8, and OpenVINO's CPU plugin fp32 and int8 (skipped
with a line when ``openvino`` is not importable). Every measurement is a process of its own
(``--worker``: load, warm up, time about ``--seconds``, print the median), so no runtime's idle
workers steal cores from another; configurations are interleaved in rounds (model x threads x
runtime, round after round) and each figure is the median over rounds of the per-process
medians. Printed per model and thread count: each runtime's ms and speed-up over its own
1 thread, the best peer (any precision), ekrt / best peer, and the op type where ekrt spent
most of its time at that count. ``--markdown`` prints the tables for docs/benchmarks.md,
``--json FILE`` writes the raw medians. The peers' int8 file is a QDQ model with uint8
activations and per-channel int8 weights (U8S8, made by edgekit's quantizer: what both peers
run best on x86, and the only int8 OpenVINO's CPU plugin takes on AMX Xeons); the fp32 file is
the same prepared float model; OpenVINO fp32 is held to f32 (``INFERENCE_PRECISION_HINT``).

``--prepare DIR`` writes those files once per model (``NAME.fp32.onnx``, ``NAME.int8.onnx``,
``NAME.ekm``, ``NAME.npz``: one held-out real feed; ``models.json`` lists them), so that
``--scaling --prepared DIR`` can run on a machine that has only numpy and onnxruntime (the worker
imports ``edgekit._ekrt`` and nothing else of edgekit).

Default (issue 11): the ``.ekm`` of each model at 1 thread, at every usable core, and at the
count ekrt picks itself (``Model(path)``), in interleaved rounds, once on the machine as it is
and once with a competing Python busy loop pinned to one core (a subprocess, bounded in time,
always killed). The goal: all threads / 1 thread <= 1.05 with the competitor.

``--calibrate``: the break-even of a split, per ISA (EKRT_ISA). A chain of 8 identical
convolutions (so workers are polling between ops, as inside a real model) of growing size, every
op split (EKRT_WORK_PER_THREAD=0) at 2 threads against 1. An op pays for a second thread once
its work per thread is above the break-even. ``--prepare`` writes these models too (under
``DIR/calibrate``), for ``--calibrate --prepared DIR`` on a machine without pytest.

    python benchmarks/ekrt_threads.py --scaling --models ppocr-det,nudenet-320n --markdown
    python benchmarks/ekrt_threads.py --prepare /tmp/prep --models ppocr-det,mobilenetv2-224
    python benchmarks/ekrt_threads.py --scaling --prepared /tmp/prep --threads 1,2,4,8,16 --json out.json
    python benchmarks/ekrt_threads.py [--models digits,mobilenetv2] [--rounds 9] [--iterations 100]
    python benchmarks/ekrt_threads.py --prepared /tmp/prep --models ppocr-det,layout-cdla   # busy core, prepared .ekm
    EKRT_ISA=avx2 python benchmarks/ekrt_threads.py --calibrate
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgekit import _ekrt  # noqa: E402

BUSY_SECONDS = 600  # the competitor's own bound, should this script die without killing it
BUSY = "import os, sys, time\nos.sched_setaffinity(0, {int(sys.argv[1])})\nend = time.monotonic() + float(sys.argv[2])\nwhile time.monotonic() < end:\n    pass\n"
RUNTIMES = ("ekrt", "ort_fp32", "ort_int8", "ov_fp32", "ov_int8")
PEERS = RUNTIMES[1:]
WORKER_TIMEOUT_S = 60  # one process: load, warm up, time ~1 s; a hang must not eat a short lent machine
SCALING_MODELS = "ppocr-det,nudenet-320n,layout-cdla,mobilenetv2-224"


@contextlib.contextmanager
def competitor(on: bool):
    """A busy loop pinned to the last usable core while the block runs."""
    if not on:
        yield None
        return
    core = max(os.sched_getaffinity(0))
    proc = subprocess.Popen([sys.executable, "-c", BUSY, str(core), str(BUSY_SECONDS)])
    try:
        time.sleep(0.2)  # let it start spinning
        yield core
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- preparing models


def native_avx2_scheme():
    """The scheme edgekit gives ekrt on an x86 CPU without VNNI (7-bit GEMM weights)."""
    import dataclasses

    from edgekit.profiles import load_profile
    from edgekit.profiles.model import CpuSpec
    from edgekit.targets.native import NativeBackend

    avx2 = CpuSpec("x86_64", "x86-64 with AVX2, no VNNI", ("sse4_2", "avx2"), 4)
    return NativeBackend().quant_scheme(dataclasses.replace(load_profile("linux-cpu"), cpu=avx2, probe=False))


def prepare(names: list[str], out: Path) -> list[dict]:
    """fp32, U8S8 QDQ, .ekm (and ``.avx2.ekm``: as quantized for an AVX2 CPU) and one real held-out
    feed per model, into ``out``."""
    import dataclasses
    from collections import Counter

    import onnx

    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))
    from ekrt_vs_ort import model_factory  # catalogue names and the examples

    from edgekit.quantize import SCHEMES, quantize_model, save_model
    from edgekit.quantize.prepare import prepare as prepare_float
    from edgekit.targets.native import ekm
    from edgekit.targets.native.lower import lower

    u8s8 = dataclasses.replace(SCHEMES["openvino"], activation_dtype="uint8")
    out.mkdir(parents=True, exist_ok=True)
    listed = []
    for name in names:
        t0 = time.monotonic()
        loaded, calib, held = model_factory(name)()
        onnx.save(prepare_float(loaded.model, loaded.inputs, 13), out / f"{name}.fp32.onnx")
        native = quantize_model(loaded, SCHEMES["native"], calib, held)
        m, _ = lower(native.model)
        ekm.save(m, out / f"{name}.ekm")
        ekm.save(lower(quantize_model(loaded, native_avx2_scheme(), calib, held).model)[0], out / f"{name}.avx2.ekm")
        save_model(quantize_model(loaded, u8s8, calib, held).model, out / f"{name}.int8.onnx")
        np.savez_compressed(out / f"{name}.npz", **held.feeds[0])
        listed.append({"model": name, "ekm_ops": dict(Counter(op.type_name for op in m.ops))})
        print(f"prepared {name} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    index = out / "models.json"  # a second --prepare into the same folder adds to its list
    kept = [d for d in (json.loads(index.read_text()) if index.is_file() else []) if d["model"] not in names]
    index.write_text(json.dumps(kept + listed, indent=1))
    calibration_models(out / "calibrate")
    return listed


# ---------------------------------------------------------------- one runtime in one process


def _session(runtime: str, prep: Path, model: str, threads: int):
    """A run(feed) callable for one runtime at a thread count."""
    if runtime == "ekrt":
        m = _ekrt.Model(str(prep / f"{model}.ekm"), threads=threads)
        names = [n for n, _ in m.inputs]
        return m, lambda feed: m.run([feed[n] for n in names])
    path = prep / f"{model}.{runtime.split('_')[1]}.onnx"
    if runtime.startswith("ort"):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return None, lambda feed: s.run(None, feed)
    import openvino as ov

    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "INFERENCE_NUM_THREADS": threads}
    if runtime == "ov_fp32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    request = ov.Core().compile_model(str(path), "CPU", config).create_infer_request()
    return None, lambda feed: request.infer(feed)


def worker(runtime: str, prep: Path, model: str, threads: int, seconds: float) -> dict:
    """Median ms of one runtime at one thread count; for ekrt also the op type it spent most time in."""
    with np.load(prep / f"{model}.npz") as data:
        feed = {k: data[k] for k in data.files}
    ekrt_model, run = _session(runtime, prep, model, threads)
    t_end = time.perf_counter() + seconds / 4
    warm = 0
    while warm < 3 or time.perf_counter() < t_end:  # warm-up: a quarter of the budget, at least 3 runs
        run(feed)
        warm += 1
    times: list[int] = []
    t_end = time.perf_counter() + seconds
    while len(times) < 5 or (time.perf_counter() < t_end and len(times) < 5000):
        t = time.perf_counter_ns()
        run(feed)
        times.append(time.perf_counter_ns() - t)
    doc = {"runtime": runtime, "model": model, "threads": threads, "ms": statistics.median(times) / 1e6, "n": len(times)}
    if ekrt_model is not None:
        ekrt_model.profile(True)
        for _ in range(max(3, min(50, len(times) // 4))):
            run(feed)
        per_type: dict[str, int] = {}
        for op, ns in ekrt_model.op_times():
            per_type[op] = per_type.get(op, 0) + ns
        total = sum(per_type.values()) or 1
        top = max(per_type, key=per_type.__getitem__)
        doc["top_op"], doc["top_op_share"] = top, per_type[top] / total
        doc["threads_used"] = ekrt_model.threads
    return doc


def run_worker(runtime: str, prep: Path, model: str, threads: int, seconds: float) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", runtime, "--prepared", str(prep), "--models", model,
            "--threads", str(threads), "--seconds", str(seconds)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S} s"}
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:300]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def openvino_absent() -> str | None:
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        return f"OpenVINO not importable here ({exc}): its columns are skipped"
    return None


def thread_counts(spec: str | None) -> list[int]:
    cores = len(os.sched_getaffinity(0))
    if spec:
        return sorted({int(t) for t in spec.split(",")})
    counts, t = [], 1
    while t < cores:
        counts.append(t)
        t *= 2
    return counts + [cores]


def scaling(prep: Path, models: list[str], threads: list[int], rounds: int, seconds: float, deadline: float | None = None) -> dict:
    absent = openvino_absent()
    runtimes = [r for r in RUNTIMES if not (absent and r.startswith("ov"))]
    if absent:
        print(absent, file=sys.stderr)
    samples: dict[tuple[str, int, str], list[float]] = {}
    extra: dict[tuple[str, int], dict] = {}
    errors: dict[str, str] = {}
    t_start, done = time.monotonic(), 0
    for rnd in range(rounds):
        t_round = time.monotonic()
        for model in models:
            for t in threads:
                for rt in runtimes:
                    key = f"{model}/{t}/{rt}"
                    if key in errors:
                        continue
                    doc = run_worker(rt, prep, model, t, seconds)
                    if "error" in doc:
                        errors[key] = doc["error"]
                        print(f"{key}: {doc['error']}", file=sys.stderr)
                        continue
                    samples.setdefault((model, t, rt), []).append(doc["ms"])
                    if rt == "ekrt":
                        extra.setdefault((model, t), {}).setdefault("top", []).append((doc["top_op"], doc["top_op_share"]))
        done += 1
        now = time.monotonic()
        print(f"round {rnd + 1}/{rounds} done in {now - t_round:.0f} s", file=sys.stderr)
        if deadline is not None and now - t_start + (now - t_round) > deadline:
            print(f"stopping after {done} rounds: another would pass the {deadline:.0f} s deadline", file=sys.stderr)
            break
    rows = []
    for model in models:
        for t in threads:
            row = {"model": model, "threads": t}
            for rt in runtimes:
                v = samples.get((model, t, rt))
                row[rt] = statistics.median(v) if v else None
                row[f"{rt}_rounds"] = v or []
            tops = extra.get((model, t), {}).get("top", [])
            if tops:
                op = max({o for o, _ in tops}, key=lambda o: sum(1 for x, _ in tops if x == o))
                row["ekrt_top_op"] = op
                row["ekrt_top_op_share"] = statistics.median([s for o, s in tops if o == op])
            rows.append(row)
    for row in rows:
        one = next(r for r in rows if r["model"] == row["model"] and r["threads"] == threads[0])
        for rt in runtimes:
            row[f"{rt}_speedup"] = one[rt] / row[rt] if one.get(rt) and row.get(rt) and threads[0] == 1 else None
        peers = {rt: row[rt] for rt in runtimes if rt in PEERS and row.get(rt)}
        row["best_peer"] = min(peers, key=peers.__getitem__) if peers else None
        row["ekrt_over_best"] = row["ekrt"] / peers[row["best_peer"]] if peers and row.get("ekrt") else None
    return {"schema": 1, "machine": machine(), "threads": threads, "rounds": done, "seconds_per_process": seconds,
            "runtimes": runtimes, "openvino": "absent" if absent else _version("openvino"), "onnxruntime": _version("onnxruntime"),
            "rows": rows, "errors": errors}


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def machine() -> dict:
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "usable_cores": len(os.sched_getaffinity(0)), "isa": _ekrt.isa(), "ekrt": _ekrt.version,
            "python": platform.python_version(), "load_average_at_start": os.getloadavg()[0]}


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def print_scaling(doc: dict, markdown: bool) -> None:
    rts = doc["runtimes"]
    names = {"ekrt": "ekrt int8", "ort_fp32": "ORT fp32", "ort_int8": "ORT int8", "ov_fp32": "OV fp32", "ov_int8": "OV int8"}
    head = ["model", "thr"] + [f"{names[r]} ms (speed-up)" for r in rts] + ["best peer", "ekrt / best", "ekrt's top op"]
    lines = []
    for row in doc["rows"]:
        cells = [row["model"], str(row["threads"])]
        cells += [f"{_ms(row.get(r))} ({_x(row.get(f'{r}_speedup'))})" for r in rts]
        cells += [names.get(row["best_peer"] or "", "—"), _x(row.get("ekrt_over_best"))]
        cells.append(f"{row['ekrt_top_op']} {row['ekrt_top_op_share']:.0%}" if row.get("ekrt_top_op") else "—")
        lines.append(cells)
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for c in lines:
            print("| " + " | ".join(c) + " |")
    else:
        widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        for c in lines:
            print("  ".join(x.ljust(w) for x, w in zip(c, widths)))
    for key, err in doc["errors"].items():
        print(f"{'- ' if markdown else ''}{key}: {err}")


# ---------------------------------------------------------------- busy core (issue 11) and calibration


def lower_example(name: str, out: Path) -> Path:
    from edgekit.modelio import load_model
    from edgekit.quantize import SCHEMES, load_feeds, quantize_model
    from edgekit.targets.native import ekm
    from edgekit.targets.native.lower import lower

    onnx_path = {"digits": "examples/digits/digits_cnn.onnx", "mobilenetv2": "examples/mobilenetv2/mobilenetv2.onnx"}[name]
    loaded = load_model(ROOT / onnx_path)
    sc = loaded.sidecar
    result = quantize_model(loaded, SCHEMES["native"], load_feeds(sc.calibration, loaded.inputs),
                            load_feeds(sc.evaluation, loaded.inputs))
    m, _ = lower(result.model)
    path = out / f"{name}.ekm"
    ekm.save(m, path)
    return path


def median_ms(models: dict[str, _ekrt.Model], xs: list[np.ndarray], rounds: int, iterations: int) -> dict[str, float]:
    per_round: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for key, m in models.items():
            for _ in range(max(3, iterations // 10)):
                m.run(xs)
            times = []
            for _ in range(iterations):
                t = time.perf_counter_ns()
                m.run(xs)
                times.append(time.perf_counter_ns() - t)
            per_round[key].append(statistics.median(times))
    return {k: statistics.median(v) / 1e6 for k, v in per_round.items()}


def bench(path: Path, rounds: int, iterations: int) -> list[dict]:
    cores = len(os.sched_getaffinity(0))
    models = {"1": _ekrt.Model(str(path), threads=1), "all": _ekrt.Model(str(path), threads=cores),
              "auto": _ekrt.Model(str(path))}
    rng = np.random.RandomState(0)
    xs = [rng.standard_normal(shape).astype(np.float32) for _, shape in models["1"].inputs]
    rows = []
    for busy in (False, True):
        with competitor(busy):
            ms = median_ms(models, xs, rounds, iterations)
        rows.append({"model": path.stem, "competitor": busy, "cores": cores, "auto_threads": models["auto"].threads,
                     "ms_1": ms["1"], "ms_all": ms["all"], "ms_auto": ms["auto"],
                     "all_over_1": ms["all"] / ms["1"], "auto_over_1": ms["auto"] / ms["1"]})
    return rows


def calibration_models(out: Path) -> list[dict]:
    """Chains of 8 identical convolutions (3x3, 1x1, depthwise; 32 channels) of growing size, as .ekm."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ekrt_core import Builder

    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for side in (4, 6, 8, 12, 16, 24, 32):
        for kind in ("3x3", "1x1", "dw"):
            b = Builder(0)
            y = b.input((1, 32, side, side))
            for _ in range(8):
                if kind == "3x3":
                    y = b.conv(y, 32)
                elif kind == "1x1":
                    y = b.conv(y, 32, (1, 1), pads=(0, 0, 0, 0))
                else:
                    y = b.conv(y, 32, group=32)
            b.output(y)
            w = b.t(b.m.ops[1].inputs[1])
            name = f"conv-{kind}-{side}x{side}x32"
            (out / f"{name}.ekm").write_bytes(b.finish())
            cases.append({"name": name, "macs_per_op": side * side * 32 * int(np.prod(w.dims[1:]))})
    (out / "calibrate.json").write_text(json.dumps(cases, indent=1))
    return cases


def calibrate(folder: Path, rounds: int, iterations: int, busy: bool) -> None:
    cases = json.loads((folder / "calibrate.json").read_text())
    print(f"ekrt isa {_ekrt.isa()}; op (x8 in a chain)   MACs/op   1 thr ms  2 thr ms  2/1   "
          f"(every op split; competitor: {'on' if busy else 'off'})")
    os.environ["EKRT_WORK_PER_THREAD"] = "0"
    try:
        with competitor(busy):
            for case in cases:
                path = str(folder / f"{case['name']}.ekm")
                ms = {"1": _ekrt.Model(path, threads=1), "2": _ekrt.Model(path, threads=2)}
                xs = [np.random.RandomState(0).standard_normal(shape).astype(np.float32) for _, shape in ms["1"].inputs]
                r = median_ms(ms, xs, rounds, iterations)
                print(f"{case['name']:28s} {case['macs_per_op']:9d}  {r['1']:8.4f}  {r['2']:8.4f}  {r['2'] / r['1']:.2f}")
    finally:
        del os.environ["EKRT_WORK_PER_THREAD"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--busy", action="store_true", help="--calibrate with a competing busy loop on one core")
    p.add_argument("--scaling", action="store_true")
    p.add_argument("--prepare", metavar="DIR", help="write the models' files for --scaling --prepared DIR, then stop")
    p.add_argument("--prepared", metavar="DIR", help="--scaling: use these prepared files")
    p.add_argument("--threads", help="--scaling: thread counts (default 1, 2, 4, ... all usable cores)")
    p.add_argument("--seconds", type=float, default=1.0, help="--scaling: timed seconds per process")
    p.add_argument("--deadline", type=float, help="--scaling: start no round that would end after this many seconds")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--json", metavar="FILE", help="--scaling: also write the raw medians here")
    p.add_argument("--worker", choices=RUNTIMES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.prepared), args.models, int(args.threads), args.seconds)))
        return
    print(f"ekrt {_ekrt.version}, isa {_ekrt.isa()}, {len(os.sched_getaffinity(0))} usable cores, "
          f"load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    if args.prepare:
        prepare((args.models or SCALING_MODELS).split(","), Path(args.prepare))
        return
    if args.scaling:
        with contextlib.ExitStack() as stack:
            prep = Path(args.prepared) if args.prepared else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ekrt-scaling-")))
            if args.prepared and args.models is None:
                models = [d["model"] for d in json.loads((prep / "models.json").read_text())]
            else:
                models = (args.models or SCALING_MODELS).split(",")
                if not args.prepared:
                    prepare(models, prep)
            doc = scaling(prep, models, thread_counts(args.threads), args.rounds or 3, args.seconds, args.deadline)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=1))
        m = doc["machine"]
        print(f"{m['cpu']}, {m['usable_cores']} usable cores, ekrt isa {m['isa']}, onnxruntime {doc['onnxruntime']}, "
              f"openvino {doc['openvino']}; median of {doc['rounds']} interleaved rounds, one process per figure")
        print_scaling(doc, args.markdown)
        return
    if args.calibrate:
        with contextlib.ExitStack() as stack:
            folder = Path(args.prepared) / "calibrate" if args.prepared else None
            if folder is None:
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ekrt-calibrate-")))
                calibration_models(folder)
            calibrate(folder, args.rounds or 9, args.iterations, args.busy)
        return
    with tempfile.TemporaryDirectory(prefix="ekrt-threads-") as tmp:
        rows = []
        for name in (args.models or "digits,mobilenetv2").split(","):
            path = Path(args.prepared) / f"{name}.ekm" if args.prepared else lower_example(name, Path(tmp))
            rows += bench(path, args.rounds or 9, args.iterations)
    if args.markdown:
        print(f"| model | busy core | 1 thread ms | {rows[0]['cores'] if rows else 'all'} threads ms | all / 1 | ekrt's own count | its ms | its / 1 |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['model']} | {'yes' if r['competitor'] else 'no'} | {r['ms_1']:.3f} | {r['ms_all']:.3f} | {r['all_over_1']:.2f} | "
                  f"{r['auto_threads']} | {r['ms_auto']:.3f} | {r['auto_over_1']:.2f} |")
        return
    print("model        competitor  1 thr ms  all thr ms  all/1   auto thr  auto ms  auto/1")
    for r in rows:
        print(f"{r['model']:12s} {'yes' if r['competitor'] else 'no':10s}  {r['ms_1']:8.4f}  {r['ms_all']:10.4f}  "
              f"{r['all_over_1']:5.2f}   {r['auto_threads']:8d}  {r['ms_auto']:7.4f}  {r['auto_over_1']:5.2f}")


if __name__ == "__main__":
    main()
