"""OpenVINO (CPU) vs ONNX Runtime vs ekrt, on the same models, fp32 and int8, in one run.

Every runtime gets the same files: the float ONNX model and one int8 QDQ model made by
edgekit's quantizer (calibrated on the model's real data), with the same real input. Each
measurement runs in a fresh worker process through edgekit's own agent backends (so what is
timed is what `edgekit bench` times: one synchronous call per iteration), which also makes
peak RSS per runtime meaningful. Configurations are interleaved in rounds so machine drift
hits all alike; the table shows the median over rounds of each configuration's p50, and ratios.

Models: the digits CNN (1x1x8x8), the MobileNetV2-shaped example at 64x64 and at 224x224 (it is
resolution-independent: convolutions and a global pool; it is quantized at 64x64 on its own
data and the same scales serve 224x224, fed an upsampled real sample), and PaddleOCR's
text-direction classifier (1x3x48x192, from the rapidocr-onnxruntime wheel, real photo crops).

ekrt (edgekit's native runtime) is measured when this edgekit has it, otherwise shown as absent.

    python benchmarks/backends.py
    python benchmarks/backends.py --models digits,mobilenetv2-224 --repeats 5
    python benchmarks/backends.py --json > backends.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from realdata import ROOT, Skip, rapidocr_cls  # benchmarks/realdata.py (this script's folder)

SCHEMA = 1
RUNTIMES = ("onnxruntime", "openvino", "ekrt")
PRECISIONS = ("fp32", "int8")
WARMUP = 20
BUDGET_S = 1.0  # timed seconds per configuration and round, roughly
MIN_ITERS, MAX_ITERS = 30, 2000


# ---------------------------------------------------------------- worker (one runtime per process)


def worker(runtime: str, model: str, inputs: str, threads: int, workdir: str) -> dict:
    """Load ``model`` in ``runtime`` through the agent's backend, time it, report p50 and peak RSS."""
    import numpy as np

    # this process's own peak (VmHWM), not its parent's
    from edgekit.agent.runner import peak_rss_bytes

    with np.load(inputs) as data:
        feeds = {k: data[k] for k in data.files}
    t0 = time.perf_counter_ns()
    if runtime == "onnxruntime":
        from edgekit.agent.backends import onnxruntime as backend

        session = backend.load(model, threads or None, {}, workdir)
    elif runtime == "openvino":
        from edgekit.agent.backends import openvino as backend

        session = backend.load(model, threads or None, {"device": "CPU", "precision_hint": "f32", "cache": False}, workdir)
    else:  # ekrt: ``model`` is the .ekm the parent lowered, beside bin/ekrt and inputs.npz
        from edgekit.agent.backends import native as backend

        return _ekrt_worker(backend, model, feeds, threads, t0)
    load_ns = time.perf_counter_ns() - t0
    run = session.run
    for _ in range(WARMUP):
        run(feeds)
    t0 = time.perf_counter_ns()
    for _ in range(5):
        run(feeds)
    per = max((time.perf_counter_ns() - t0) / 5, 1)
    iters = int(min(MAX_ITERS, max(MIN_ITERS, BUDGET_S * 1e9 / per)))
    samples = []
    gc.disable()
    for _ in range(iters):
        t = time.perf_counter_ns()
        run(feeds)
        samples.append(time.perf_counter_ns() - t)
    gc.enable()
    info = getattr(session, "info", None) or {}
    return {
        "p50_ns": statistics.median(samples),
        "n": len(samples),
        "load_ns": load_ns,
        "peak_rss_bytes": peak_rss_bytes(),
        "version": session.version,
        "execution_devices": info.get("execution_devices"),
    }


def _ekrt_worker(backend, model: str, feeds: dict, threads: int, t0: int) -> dict:
    """ekrt times itself in its own process (the agent's Session.bench); same budget as the others."""
    workdir = os.path.dirname(model)
    session = backend.load(model, threads or None, {"runner": "bin/ekrt"}, workdir)
    load_ns = time.perf_counter_ns() - t0
    spec = [{"name": k, "shape": list(v.shape), "dtype": v.dtype.name} for k, v in feeds.items()]
    probe, _, _ = session.bench(WARMUP, 5, None, spec)
    per = max(statistics.median(probe), 1)
    iters = int(min(MAX_ITERS, max(MIN_ITERS, BUDGET_S * 1e9 / per)))
    samples, _, info = session.bench(WARMUP, iters, None, spec)
    return {
        "p50_ns": statistics.median(samples),
        "n": len(samples),
        "load_ns": load_ns,
        "peak_rss_bytes": info.get("peak_rss_bytes"),  # the runner's own process
        "version": session.version,
        "execution_devices": [info.get("isa")] if info.get("isa") else None,
    }


def lower_for_ekrt(int8: Path, inputs: Path, work: Path) -> Path:
    """The QDQ model lowered to .ekm, with the runner built for this machine and the input beside it."""
    import shutil

    from edgekit.targets import get_backend
    from edgekit.targets.native.build import build_runner

    d = work / "ekrt" / int8.parent.name
    ekm = get_backend("native").compile(int8, d)[0]
    (d / "bin").mkdir(exist_ok=True)
    shutil.copy2(build_runner(), d / "bin" / "ekrt")
    shutil.copy2(inputs, d / "inputs.npz")
    return ekm


def run_worker(runtime: str, model: Path, inputs: Path, threads: int, workdir: Path) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", runtime, str(model), str(inputs), str(threads), str(workdir)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{runtime} worker failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- models


@dataclass
class Case:
    name: str
    shape: tuple[int, ...]
    fp32: Path
    int8: Path
    inputs: Path
    origin: str


def _save_case(name, loaded, calib, sample, work: Path, origin: str, run_shape=None) -> Case:
    import numpy as np
    import onnx

    from edgekit.modelio import IOSpec, with_static_inputs
    from edgekit.quantize import quantize_model, save_model
    from edgekit.quantize.scheme import ONNXRUNTIME

    # One QDQ model for every runtime: the onnxruntime and openvino schemes are the same settings
    # (int8 asymmetric activations, per-channel symmetric int8 weights, int32 bias).
    result = quantize_model(loaded, ONNXRUNTIME, calib, calib)
    d = work / name
    d.mkdir(parents=True, exist_ok=True)
    fp32, int8 = d / "fp32.onnx", d / "int8.onnx"
    shape_inputs = loaded.inputs
    if run_shape is not None:  # same weights and scales, run at another resolution
        shape_inputs = (IOSpec(loaded.inputs[0].name, run_shape, loaded.inputs[0].dtype),)
    onnx.save(with_static_inputs(loaded.model, shape_inputs), str(fp32))
    q = result.model if run_shape is None else with_static_inputs(result.model, shape_inputs)
    save_model(q, int8)
    np.savez(d / "inputs.npz", **sample)
    return Case(name, tuple(shape_inputs[0].shape), fp32, int8, d / "inputs.npz", origin)


def _example(name: str, folder: str, stem: str, size: int | None = None) -> Callable[[Path], Case]:
    def make(work: Path) -> Case:
        from edgekit.modelio import load_model
        from edgekit.quantize import load_feeds

        path = ROOT / "examples" / folder / f"{stem}.onnx"
        loaded = load_model(path)
        calib = load_feeds(loaded.sidecar.calibration, loaded.inputs)
        sample = load_feeds(loaded.sidecar.evaluation, loaded.inputs).feeds[0]
        if size is None or (1, 3, size, size) == loaded.inputs[0].shape:
            return _save_case(name, loaded, calib, sample, work, str(path.relative_to(ROOT)))
        key = loaded.inputs[0].name
        sample = {key: _resize(sample[key], size)}
        return _save_case(name, loaded, calib, sample, work, f"{path.relative_to(ROOT)} at {size}x{size}", (1, 3, size, size))

    return make


def _resize(x, size: int):
    """NCHW float image, bilinear, per channel (PIL 'F' mode)."""
    import numpy as np
    from PIL import Image

    out = np.stack([np.asarray(Image.fromarray(c).resize((size, size), Image.BILINEAR)) for c in x[0]])
    return out[None].astype(np.float32)


def _ppocr_cls(work: Path) -> Case:
    from edgekit.modelio import load_model
    from edgekit.quantize import FeedSet

    realmodels, path = rapidocr_cls()
    loaded = load_model(path, {"x": (1, *realmodels.CLS_SHAPE)})
    xc, _ = realmodels.cls_dataset(200, 0)
    xh, _ = realmodels.cls_dataset(1, 1)
    calib = FeedSet([{"x": x[None]} for x in xc], "cls_dataset(200, seed=0)")
    dist = realmodels.RAPIDOCR_DIST
    return _save_case("ppocr-cls", loaded, calib, {"x": xh[0][None]}, work, f"{dist} {importlib.metadata.version(dist)}: {path.name}")


MODELS: dict[str, Callable[[Path], Case]] = {
    "digits": _example("digits", "digits", "digits_cnn"),
    "mobilenetv2-64": _example("mobilenetv2-64", "mobilenetv2", "mobilenetv2", 64),
    "mobilenetv2-224": _example("mobilenetv2-224", "mobilenetv2", "mobilenetv2", 224),
    "ppocr-cls": _ppocr_cls,
}


def runtime_absent(runtime: str) -> str | None:
    """Why ``runtime`` can't be measured here (None: it can)."""
    if runtime == "ekrt":
        try:
            from edgekit.agent.backends import native  # noqa: F401
            from edgekit.targets.native.build import why_not_buildable
        except ImportError:
            return "absent (no native runtime in this edgekit)"
        reason = why_not_buildable(_host_arch())
        return f"absent ({reason})" if reason else None
    try:
        importlib.metadata.version(runtime)
    except importlib.metadata.PackageNotFoundError:
        return f"absent ({runtime} not installed)"
    return None


# ---------------------------------------------------------------- main


def _host_arch() -> str:
    from edgekit.targets.native.build import host_arch

    return host_arch()


def measure(cases: list[Case], runtimes: list[str], threads: list[int], repeats: int, work: Path) -> dict:
    configs = [(c, r, p, t) for c in cases for r in runtimes for p in PRECISIONS for t in threads]
    p50s: dict[tuple, list[float]] = {}
    last: dict[tuple, dict] = {}
    failed: dict[tuple, str] = {}
    ekm: dict[str, Path] = {}
    if "ekrt" in runtimes:
        for case in cases:
            try:
                ekm[case.name] = lower_for_ekrt(case.int8, case.inputs, work)
            except Exception as exc:  # lowering or the runner build: report it, measure the rest
                for n in threads:
                    failed[(case.name, "ekrt", "int8", n)] = f"ekrt: {type(exc).__name__}: {getattr(exc, 'message', exc)}"
    for rnd in range(repeats):
        print(f"round {rnd + 1}/{repeats}: {len(configs)} configurations", file=sys.stderr)
        for case, runtime, precision, n in configs:
            key = (case.name, runtime, precision, n)
            if key in failed or (runtime == "ekrt" and precision == "fp32"):
                continue
            model = case.fp32 if precision == "fp32" else case.int8
            if runtime == "ekrt":
                model = ekm[case.name]
            try:
                doc = run_worker(runtime, model, case.inputs, n, work)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                failed[key] = str(exc)
                continue
            p50s.setdefault(key, []).append(doc["p50_ns"])
            last[key] = doc
    return {"p50s": p50s, "last": last, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over all configurations (median of p50s)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    ap.add_argument("--worker", nargs=5, metavar=("RUNTIME", "MODEL", "INPUTS", "THREADS", "WORKDIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        runtime, model, inputs, threads, workdir = args.worker
        print(json.dumps(worker(runtime, model, inputs, int(threads), workdir)))
        return 0

    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        print(f"error: unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = [1] if cores == 1 else [1, 0]  # 0: the runtime's default (all cores)
    absent = {r: runtime_absent(r) for r in RUNTIMES}
    runtimes = [r for r in RUNTIMES if absent[r] is None]
    with tempfile.TemporaryDirectory(prefix="edgekit-backends-") as tmp:
        work = Path(tmp)
        cases, skipped = [], {}
        for name in names:
            print(f"preparing {name} ...", file=sys.stderr)
            try:
                cases.append(MODELS[name](work))
            except Skip as exc:
                skipped[name] = str(exc)
        result = measure(cases, runtimes, threads, args.repeats, work)

    doc = _document(cases, skipped, absent, threads, cores, args.repeats, result)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc)
    return 0


def _document(cases, skipped, absent, threads, cores, repeats, result) -> dict:
    rows = []
    for case in cases:
        for runtime in RUNTIMES:
            for precision in PRECISIONS:
                row = {"model": case.name, "runtime": runtime, "precision": precision}
                for n in threads:
                    key = (case.name, runtime, precision, n)
                    col = "1" if n == 1 else "all"
                    if absent[runtime]:
                        row[col] = {"status": absent[runtime]}
                    elif runtime == "ekrt" and precision == "fp32":
                        row[col] = {"status": "n/a (ekrt runs int8 only)"}
                    elif key in result["failed"]:
                        row[col] = {"status": f"failed: {result['failed'][key]}"}
                    else:
                        last = result["last"][key]
                        row[col] = {
                            "p50_ms": statistics.median(result["p50s"][key]) / 1e6,
                            "p50_ms_rounds": [p / 1e6 for p in result["p50s"][key]],
                            "peak_rss_mb": last["peak_rss_bytes"] / 2**20 if last["peak_rss_bytes"] else None,
                            "version": last["version"],
                            "execution_devices": last["execution_devices"],
                        }
                rows.append(row)
    versions = {}
    for dist in ("onnxruntime", "openvino", "numpy"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "schema": SCHEMA,
        "kind": "edgekit.benchmark.backends",
        "machine": {"cpu": _cpu_model(), "cores": cores, "python": platform.python_version()},
        "versions": versions,
        "repeats": repeats,
        "threads": ["1" if n == 1 else "all" for n in threads],
        "models": {c.name: {"shape": list(c.shape), "origin": c.origin} for c in cases},
        "skipped_models": skipped,
        "rows": rows,
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _cell(row: dict, col: str) -> dict:
    return row.get(col) or {}


def _print(doc: dict) -> None:
    m = doc["machine"]
    print(f"{m['cpu']} ({m['cores']} cores), Python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in doc["versions"].items()))
    print(f"median p50 over {doc['repeats']} rounds, batch 1, one synchronous call per iteration; ratios < 1 mean faster\n")
    cols = doc["threads"]
    for name, meta in doc["models"].items():
        print(f"{name}  input {'x'.join(map(str, meta['shape']))}  ({meta['origin']})")
        header = f"  {'runtime':<12}{'prec':<6}" + "".join(f"{'p50 ms ' + c + 'T':>14}" for c in cols) + f"{'vs ORT int8':>13}{'int8/fp32':>11}{'RSS MB':>9}"
        print(header)
        rows = [r for r in doc["rows"] if r["model"] == name]
        ref = next(r for r in rows if r["runtime"] == "onnxruntime" and r["precision"] == "int8")
        for r in rows:
            cells = []
            for c in cols:
                cell = _cell(r, c)
                cells.append(f"{cell['p50_ms']:>14.3f}" if "p50_ms" in cell else f"{cell.get('status', '-').split()[0]:>14}")
            first = _cell(r, cols[0])
            ref_p = _cell(ref, cols[0]).get("p50_ms")
            vs = f"{first['p50_ms'] / ref_p:>12.2f}x" if "p50_ms" in first and ref_p else f"{'-':>13}"
            fp = next(x for x in rows if x["runtime"] == r["runtime"] and x["precision"] == "fp32")
            fp_p = _cell(fp, cols[0]).get("p50_ms")
            q = f"{first['p50_ms'] / fp_p:>10.2f}x" if r["precision"] == "int8" and "p50_ms" in first and fp_p else f"{'':>11}"
            rss = f"{first['peak_rss_mb']:>9.0f}" if first.get("peak_rss_mb") else f"{'':>9}"
            print(f"  {r['runtime']:<12}{r['precision']:<6}" + "".join(cells) + vs + q + rss)
        print()
    for name, why in doc["skipped_models"].items():
        print(f"skipped {name}: {why}")
    for why in sorted({c["status"] for r in doc["rows"] for c in r.values() if isinstance(c, dict) and "status" in c}):
        print(f"not measured: {why}")
    print(f"ratio columns use the {cols[0]}-thread p50; RSS is the worker process's peak (Python + numpy + runtime + model)")


if __name__ == "__main__":
    sys.exit(main())
