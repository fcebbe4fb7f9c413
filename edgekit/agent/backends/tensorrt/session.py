"""The backend the agent runs: build the engine with trtexec (cached), then let trtexec time it.

An engine only runs on the GPU, TensorRT version and build flags it was built with, so it is
built here, on the device, from the bundle's ONNX model and kept under
``<workdir>/trt-engines/<key>.engine``; an unchanged deploy finds it and skips the build.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time

from ... import AgentFailure, facts, missing_runtime, sha256_file
from .probe import TRTEXEC_JETPACK, find_trtexec, tensorrt_version
from .trtexec import (
    MIN_VERSION,
    PRECISIONS,
    TrtexecOutputError,
    banner_version,
    build_flags,
    engine_key,
    gpu_identity,
    parse_export_profile,
    parse_export_times,
    parse_trtexec_log,
    root_error,
    shapes_spec,
    tensor_name,
    trtexec_bench_argv,
    trtexec_build_argv,
    version_tuple,
    warmup_ms_for,
)

ENGINE_DIR = "trt-engines"
INPUTS_FILE = "inputs.npz"
AUTO_WARMUP_MS = 2000  # the agent's auto warm-up bound (runner.AUTO_MAX_NS)
BUILD_TIMEOUT_S = 1800.0  # a first build on a Jetson Nano takes minutes; a hung one must end
_NO_SUMMARY_HINT = "run trtexec by hand with the same arguments (info.bench_argv) and read its log"


def _quoted(argv: list) -> str:
    return " ".join(shlex.quote(a) for a in argv)  # shlex.join needs Python 3.8


def _run(argv: list, timeout: float, what: str) -> str:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AgentFailure(
            f"trtexec {what} did not finish within {timeout:.0f} s: {_quoted(argv)}",
            "run the command by hand on the device; a first engine build on a small Jetson can take long",
        ) from None
    except OSError as exc:
        raise AgentFailure(
            f"cannot run trtexec at {argv[0]}: {exc.strerror or exc}",
            "check that the file is an executable trtexec for this device",
        ) from None
    out = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0 and not re.search(r"&&&& (PASSED|FAILED)", out):
        # killed or crashed before its verdict line: record the failure the way trtexec would
        out += f"\n&&&& FAILED TensorRT.trtexec (exit code {proc.returncode})\n"
    return out


def probe_version(trtexec: str) -> str:
    """The TensorRT version trtexec belongs to: its banner (``--help`` prints it), else the probe's."""
    version = banner_version(_run([trtexec, "--help"], 120, "--help"))
    version = version or tensorrt_version(ask_trtexec=False)[0]  # without asking trtexec again
    if version is None:
        raise AgentFailure(
            f"cannot tell which TensorRT version {trtexec} belongs to (no banner in its --help output)",
            "put the trtexec of the installed TensorRT first on PATH (JetPack: /usr/src/tensorrt/bin)",
        )
    try:
        too_old = version_tuple(version)[:2] < MIN_VERSION
    except ValueError:
        raise AgentFailure(f"trtexec reports an unreadable TensorRT version {version!r}", "reinstall TensorRT") from None
    if too_old:
        raise AgentFailure(
            f"TensorRT {version} on the device is older than {MIN_VERSION[0]}.{MIN_VERSION[1]}",
            "edgekit needs TensorRT 8.0+ (JetPack 4.6+) for Q/DQ models and trtexec's report format",
        )
    return version


def _device_identity() -> str:
    board = facts._board()
    l4t = facts.parse_nv_tegra_release(facts._read(facts.NV_TEGRA_RELEASE) or "")
    gpu = None
    if not board:
        try:
            proc = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30,
            )  # fmt: skip
            gpu = proc.stdout.decode("utf-8", "replace").strip().splitlines()[0] if proc.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            gpu = None
    return gpu_identity(board, ("L4T " + l4t) if l4t else None, gpu)


def _raw_inputs(npz: str, inputs: list, out_dir: str) -> str:
    """Write the variant's sample inputs as raw files for ``--loadInputs``; return its value."""
    try:
        import numpy as np
    except ImportError:
        raise missing_runtime("numpy", f"numpy (to read {npz})") from None
    try:
        with np.load(npz, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # numpy raises ValueError/OSError/zipfile errors for a bad file
        raise AgentFailure(f"cannot read {npz}: {exc}", f"rebuild {INPUTS_FILE} with numpy.savez") from None
    specs = []
    for i, tensor in enumerate(inputs):
        name = tensor["name"]
        if name not in arrays:
            raise AgentFailure(f"{npz} has no array for input '{name}'", "save one array per model input")
        if arrays[name].dtype.name != tensor["dtype"]:
            raise AgentFailure(
                f"{npz}: input '{name}' is {arrays[name].dtype.name}, the model wants {tensor['dtype']}",
                f"save it as {tensor['dtype']}",
            )
        path = os.path.join(out_dir, f"input{i}.raw")
        np.ascontiguousarray(arrays[name]).tofile(path)
        specs.append(f"{tensor_name(name)}:{path}")
    return ",".join(specs)


class Session:
    """A variant to be built (if its engine is not cached) and timed by trtexec."""

    def __init__(self, trtexec: str, version: str, model_path: str, options: dict, workdir: str) -> None:
        self.trtexec = trtexec
        self.version = version
        self.model_path = model_path
        self.precision = options.get("precision") or "fp32"
        self.dla_core = options.get("dla_core")
        self.allow_gpu_fallback = bool(options.get("allow_gpu_fallback", True))
        self.workspace_mb = options.get("workspace_mb")
        self.build_timeout_s = float(options.get("build_timeout_s") or BUILD_TIMEOUT_S)
        self.engine_dir = os.path.join(workdir, ENGINE_DIR)
        self.info = {}

    def run(self, feeds: dict):
        raise AgentFailure(
            "the tensorrt backend is timed by trtexec, not call by call",
            "bench it through the agent (edgekit bench / edgekit deploy)",
        )

    def bench(self, warmup, iterations: int, duration_s: float | None, inputs: list, profile: bool = False, min_time_s: float = 0.0) -> tuple:
        """Build the engine if the cache lacks it, time it; return (samples_ns, layers, info)."""
        os.makedirs(self.engine_dir, exist_ok=True)
        shapes = shapes_spec(inputs) if inputs else None
        identity = _device_identity()
        try:
            flags = build_flags(
                self.version, self.precision, dla_core=self.dla_core,
                allow_gpu_fallback=self.allow_gpu_fallback, workspace_mb=self.workspace_mb, shapes=shapes,
            )  # fmt: skip
        except ValueError as exc:
            raise AgentFailure(f"bad tensorrt options for this variant: {exc}", "rebuild the bundle with edgekit deploy") from None
        key = engine_key(sha256_file(self.model_path), self.version, identity, flags)
        engine = os.path.join(self.engine_dir, key + ".engine")
        self.info = {
            "trtexec": self.trtexec,
            "tensorrt_version": self.version,
            "gpu_or_soc": identity,
            "engine_key": key,
            "engine": engine,
            "engine_cached": os.path.isfile(engine),
            "engine_build_ns": None,
        }
        if not self.info["engine_cached"]:
            self._build(engine, key, flags)
        work = tempfile.mkdtemp(prefix="bench-", dir=self.engine_dir)
        try:
            return self._time(engine, key, work, warmup, iterations, duration_s, shapes, inputs, profile, min_time_s)
        finally:
            shutil.rmtree(work)

    def _build(self, engine: str, key: str, flags: list) -> None:
        # Build under a temporary name: a killed build must not leave a half engine in the cache.
        partial = f"{engine}.{os.getpid()}.partial"
        timing_cache = os.path.join(self.engine_dir, f"timing-{re.sub(r'[^0-9.]', '', self.version)}.cache")
        argv = trtexec_build_argv(self.model_path, partial, flags, trt_version=self.version, timing_cache=timing_cache, trtexec=self.trtexec)
        self.info["build_argv"] = argv
        t0 = time.perf_counter_ns()
        log = _run(argv, self.build_timeout_s, "engine build")
        build_ns = time.perf_counter_ns() - t0
        log_path = os.path.join(self.engine_dir, key + ".build.log")
        with open(log_path, "w", encoding="utf-8") as fh:
            fh.write(log)
        report = parse_trtexec_log(log, require_summary=False)
        if report["passed"] is False or not os.path.isfile(partial):
            if os.path.exists(partial):
                os.unlink(partial)
            raise AgentFailure(
                f"trtexec (TensorRT {self.version}) could not build the {self.precision} engine: "
                f"{root_error(report['errors'])}",
                f"its full log is on the device at {log_path}; check the model with `edgekit plan` (TensorRT Q/DQ lint) "
                f"and TensorRT {self.version}'s ONNX operator support",
            )
        os.replace(partial, self.info["engine"])
        self.info["engine_build_ns"] = build_ns
        self.info["trtexec_build_s"] = report["engine_build_s"]

    def _time(self, engine, key, work, warmup, iterations, duration_s, shapes, inputs, want_layers, min_time_s=0.0) -> tuple:
        times = os.path.join(work, "times.json")
        profile = os.path.join(work, "profile.json") if want_layers else None
        npz = os.path.join(os.path.dirname(self.model_path), INPUTS_FILE)
        load_inputs = _raw_inputs(npz, inputs, work) if inputs and os.path.isfile(npz) else None
        # trtexec warms up for a time and cannot stop when latency settles: "auto" gets the
        # whole bound of the agent's auto warm-up
        warmup_ms = AUTO_WARMUP_MS if warmup == "auto" else warmup_ms_for(warmup)
        argv = trtexec_bench_argv(
            engine, warmup_ms=warmup_ms, iterations=iterations, duration_s=duration_s, export_times=times, min_time_s=min_time_s,
            export_profile=profile, dla_core=self.dla_core, shapes=shapes, load_inputs=load_inputs,
            trtexec=self.trtexec,
        )  # fmt: skip
        self.info["bench_argv"] = argv
        timeout = 600.0 + 3 * (duration_s or min_time_s or 0) + warmup_ms / 1000.0
        log = _run(argv, timeout, "benchmark")
        with open(os.path.join(self.engine_dir, key + ".bench.log"), "w", encoding="utf-8") as fh:
            fh.write(log)
        try:
            report = parse_trtexec_log(log)
            if not os.path.isfile(times):
                raise TrtexecOutputError("trtexec wrote no --exportTimes file")
            with open(times, encoding="utf-8") as fh:
                samples = parse_export_times(fh.read(), skip=report["warmup_queries"] or 0)
            layers = None
            if profile and os.path.isfile(profile):
                with open(profile, encoding="utf-8") as fh:
                    text = fh.read()
                runs = json.loads(text)[0]["count"]  # the profile run's inferences (parse_export_profile checked it)
                layers = [dict(layer, calls=runs) for layer in parse_export_profile(text)]
        except TrtexecOutputError as exc:
            raise AgentFailure(f"cannot read trtexec's benchmark of {engine}: {exc}", _NO_SUMMARY_HINT) from None
        self.info.update({
            "device_name": report["device"],
            "compute_capability": report["compute_capability"],
            "engine_deserialize_ns": None if report["engine_deserialize_s"] is None else int(report["engine_deserialize_s"] * 1e9),
            "warmup_ms": warmup_ms,
            "warmup_queries": report["warmup_queries"],
            "warmup": report["warmup_queries"],
            "warmup_mode": "fixed",  # by time
            "throughput_qps": report["throughput_qps"],
            "latency_ms": report["latency_ms"],
            "gpu_compute_ms": report["gpu_compute_ms"],
            "h2d_ms": report["h2d_ms"],
            "d2h_ms": report["d2h_ms"],
        })
        return samples, layers, dict(self.info)


def load(model_path: str, threads: int | None, options: dict | None = None, workdir: str | None = None) -> Session:
    """Find trtexec and its TensorRT version; the engine is built (or found) by ``Session.bench``."""
    options = dict(options or {})
    precision = options.get("precision") or "fp32"
    if precision not in PRECISIONS:
        raise AgentFailure(
            f"tensorrt variant precision {precision!r} is not one of {', '.join(PRECISIONS)}",
            "rebuild the bundle with edgekit deploy",
        )
    trtexec = find_trtexec()
    if trtexec is None:
        raise AgentFailure(
            f"trtexec is not on this device (looked on PATH and in {TRTEXEC_JETPACK})",
            "install TensorRT with its trtexec (JetPack puts it in /usr/src/tensorrt/bin) or add trtexec's directory to PATH",
        )
    version = probe_version(trtexec)
    return Session(trtexec, version, model_path, options, workdir or os.path.dirname(model_path))
