"""OpenVINO on the device: compile on the requested device with a model cache, time sync infers.

``load`` compiles twice when caching is on: once with this model's cache emptied (the first
load a user sees after a deploy) and once more from the cache (every later start), and
reports both. The timed session is the cached one. Per-layer counters come from a separate
compile with PERF_COUNT on, run after the timed loop, so counting never slows the timing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import statistics
import time

from .. import AgentFailure, missing_runtime, sha256_file

_META_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")
_PROFILE_WARMUP = 5  # a fresh compile's first inferences include one-time work
_PROFILE_RUNS = 20  # inferences whose per-layer counters are averaged

# The runner passes the variant's concrete input shapes (options["input_shapes"]): a dynamic
# input is reshaped to them before compiling, as benchmark_app's -shape does. Compiled with its
# dynamic dims, the MobileNetV2 example (1x3xHxW) ran at 7.8 ms per 64x64 inference against
# 4.7 ms compiled for 1x3x64x64 (same minute, busy 2-core VM).
STATIC_SHAPES = True


class Session:
    def __init__(self, core, model_path, device, config, compiled, version, info, shapes=None):
        self._core = core
        self._model_path = model_path
        self._shapes = shapes
        self._device = device
        self._config = config
        self._request = compiled.create_infer_request()
        self._infer = _infer_fn(self._request)
        self._last_feeds = None
        self._bound = None
        self.version = version
        self.info = info

    def run(self, feeds: dict):
        self._last_feeds = feeds  # layers() replays the inputs that were timed
        return self._infer(feeds)

    def timed(self, feeds: dict):
        """Bind ``feeds`` to the request once (shared with the arrays, no copy); a step is one sync
        ``infer()`` timed by OpenVINO itself (``InferRequest.latency``, what benchmark_app reports)."""
        ov = _import_openvino()
        self._last_feeds = feeds
        request = self._request
        # the tensors share the arrays' memory: keep both alive as long as the request uses them
        self._bound = [(name, array if array.flags.c_contiguous else array.copy()) for name, array in feeds.items()]
        for name, array in self._bound:
            request.set_tensor(name, ov.Tensor(array, shared_memory=True))
        infer = request.infer
        if not hasattr(request, "latency"):  # before 2022.1: the agent's clock around the call
            clock = time.perf_counter_ns

            def step() -> int:
                t = clock()
                infer()
                return clock() - t

            return step, "perf_counter_ns around InferRequest.infer() on inputs bound once"

        def step() -> int:
            infer()
            return max(1, int(round(request.latency * 1e6)))  # ms, measured in C++ around the infer

        return step, "OpenVINO InferRequest.latency of a sync infer() on inputs bound once"

    def layers(self):
        """Per-layer times of a PERF_COUNT compile of the model: the median over a few inferences (and the quartiles)."""
        if self._last_feeds is None:
            return None
        config = dict(self._config)
        config["PERF_COUNT"] = True
        try:
            source = _source(self._core, self._model_path, self._shapes)[0]
            request = self._core.compile_model(source, self._device, config).create_infer_request()
        except Exception:  # counters are a bonus: a device without them still has its timing
            return None
        for _ in range(_PROFILE_WARMUP):
            request.infer(self._last_feeds)
        totals = {}
        for _ in range(_PROFILE_RUNS):
            request.infer(self._last_feeds)
            for p in request.get_profiling_info():
                entry = totals.setdefault(p.node_name, [p, [], 0])  # dicts keep the execution order
                entry[1].append(_ns(p.real_time))
                entry[2] += 1
        out = []
        for p, ns, calls in totals.values():
            q = statistics.quantiles(ns, n=4, method="inclusive") if len(ns) > 1 else [ns[0]] * 3
            out.append({"name": p.node_name, "op": p.node_type, "ns": int(round(statistics.median(ns))), "ns_p25": int(round(q[0])),
                        "ns_p75": int(round(q[2])), "calls": calls, "exec_type": p.exec_type, "status": _status(p.status)})  # fmt: skip
        return out


def load(model_path: str, threads, options: dict = None, workdir: str = None) -> Session:
    ov = _import_openvino()
    options = dict(options or {})
    device = str(options.get("device") or "CPU").upper()
    core = ov.Core()
    version = _version(ov)
    available = list(core.available_devices)
    primary = _primary(device)
    if primary not in _META_DEVICES and not any(d.split(".")[0] == primary for d in available):
        raise AgentFailure(
            f"OpenVINO {version} on this device sees {', '.join(available) or 'no devices'}, not the requested {device}",
            _missing_device_hint(primary),
        )
    supported = _supported(core, primary)
    config = {}
    if threads and "INFERENCE_NUM_THREADS" in supported:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    if "PERFORMANCE_HINT" in supported:
        config["PERFORMANCE_HINT"] = "LATENCY"  # batch 1, one request: what the timed loop does
    hint = options.get("precision_hint")
    if hint and "INFERENCE_PRECISION_HINT" in supported:
        config["INFERENCE_PRECISION_HINT"] = hint

    info = {"device": device, "available_devices": available, "config": {k: str(v) for k, v in config.items()}}
    shapes = options.get("input_shapes") or None
    cache_dir = None
    if options.get("cache", True) and workdir:
        cache_dir = os.path.join(workdir, "ov-cache", _model_key(model_path, device, config, shapes))
        shutil.rmtree(cache_dir, ignore_errors=True)  # the first load must not find a cache
        os.makedirs(cache_dir)
        core.set_property({"CACHE_DIR": cache_dir})
        info["cache_dir"] = cache_dir

    compiled, first_ns, reshaped = _compile(core, model_path, device, config, version, shapes)
    info["first_load_ns"] = first_ns
    info["cached_load_ns"] = None
    if reshaped:
        info["reshaped"] = reshaped  # dynamic inputs compiled at the shapes the variant is timed with
    if cache_dir is not None:
        info["cache_files"] = len(os.listdir(cache_dir))
        del compiled
        compiled, info["cached_load_ns"], _ = _compile(core, model_path, device, config, version, shapes)

    executed = _execution_devices(compiled)
    info["execution_devices"] = executed
    # OpenVINO falls back to another device silently (HETERO, AUTO): say it out loud.
    info["fallback"] = bool(executed) and primary not in _META_DEVICES and any(
        d.split(".")[0] != primary for d in executed
    )
    # the threads it really uses (with none asked: its own choice)
    with contextlib.suppress(Exception):  # not every plugin (NPU, MYRIAD) has the property
        used = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        if used > 0:
            info["threads"] = used
    if "INFERENCE_PRECISION_HINT" in supported:
        with contextlib.suppress(Exception):  # a plugin may list it and still not report it
            precision = compiled.get_property("INFERENCE_PRECISION_HINT")
            info["inference_precision"] = precision.to_string() if hasattr(precision, "to_string") else str(precision)
    return Session(core, model_path, device, config, compiled, version, info, shapes)


def _source(core, model_path: str, shapes: dict | None) -> tuple:
    """(what to compile, the inputs reshaped): the model file itself, or where it has dynamic
    inputs that ``shapes`` (name -> dims) fixes, the model read and reshaped to them."""
    if not shapes:
        return model_path, {}
    model = core.read_model(model_path)
    fixed = {}
    for port in model.inputs:
        dims = shapes.get(port.get_any_name())
        shape = port.get_partial_shape()
        if dims and shape.is_dynamic and shape.rank.is_static and shape.rank.get_length() == len(dims):
            fixed[port.get_any_name()] = [int(d) for d in dims]
    if not fixed:
        return model_path, {}
    model.reshape({name: dims for name, dims in fixed.items()})
    return model, fixed


def _compile(core, model_path, device, config, version, shapes=None):
    t0 = time.perf_counter_ns()
    try:
        source, reshaped = _source(core, model_path, shapes)
        compiled = core.compile_model(source, device, config)
    except Exception as exc:  # OpenVINO raises RuntimeError (and its own subclasses)
        raise AgentFailure(
            f"OpenVINO {version} cannot compile {os.path.basename(model_path)} for {device}: {_what(exc)}",
            f"check that the device's OpenVINO supports every op of the model on {device} "
            "(edgekit plan shows the ops); try --backend onnxruntime",
            reason="compile",
        ) from None
    return compiled, time.perf_counter_ns() - t0, reshaped


def _what(exc: Exception) -> str:
    """The line of an OpenVINO exception that says what is wrong, not where it was thrown:
    ``Exception from src/...:132:`` / ``Check 'false' failed at ...`` lines come first."""
    lines = [x.strip() for x in str(exc).splitlines() if x.strip()]
    said = [x for x in lines if not x.startswith(("Exception from ", "Check '"))]
    listed = [x[2:].strip() for x in said if x.startswith("--")]  # "-- No conversion rule found for operations: ..."
    return (listed or said or lines or [type(exc).__name__])[0]


def _infer_fn(request):
    """The fastest sync call this OpenVINO has: ``infer(feeds, share_inputs=True)`` (2023.1+)."""
    import inspect

    try:
        params = inspect.signature(request.infer).parameters
    except (TypeError, ValueError):  # a compiled method without a signature
        params = {}
    if "share_inputs" in params:
        return lambda feeds: request.infer(feeds, share_inputs=True)
    return request.infer


def _import_openvino():
    try:
        import openvino as ov

        if not hasattr(ov, "Core"):  # 2022.x: API 2.0 lives in openvino.runtime
            import openvino.runtime as ov
        return ov
    except ImportError as exc:
        if getattr(exc, "name", None) in ("openvino", "openvino.runtime"):
            raise missing_runtime("openvino") from None
        raise AgentFailure(
            f"openvino is installed on the device but does not import: {exc}",
            "install an openvino build that matches the device's Python and CPU",
        ) from None


def _version(ov) -> str:
    version = getattr(ov, "__version__", None) or ov.get_version()
    return str(version).split("-")[0]


def _primary(device: str) -> str:
    """``CPU`` -> CPU, ``GPU.1`` -> GPU, ``HETERO:NPU,CPU`` -> NPU, ``AUTO:GPU,CPU`` -> AUTO."""
    head, _, rest = device.partition(":")
    if rest and head == "HETERO":
        return rest.split(",")[0].split(".")[0]
    return head.split(".")[0]


def _supported(core, device: str) -> set:
    try:
        return set(core.get_property(device, "SUPPORTED_PROPERTIES"))
    except Exception:
        return set()


def _execution_devices(compiled) -> list:
    try:
        return [str(d) for d in compiled.get_property("EXECUTION_DEVICES")]
    except Exception:  # before 2023.0 compiled models did not report it
        return []


def _model_key(model_path: str, device: str, config: dict, shapes: dict | None = None) -> str:
    h = hashlib.sha256(sha256_file(model_path).encode())
    h.update(repr((device, sorted(config.items()), sorted((shapes or {}).items()))).encode())
    return h.hexdigest()[:16]


def _missing_device_hint(device: str) -> str:
    if device == "MYRIAD":
        return "plug in the Neural Compute Stick 2 and use OpenVINO <= 2022.3 (the MYRIAD plugin was removed in 2023.0)"
    if device == "NPU":
        return "install the Intel NPU driver (Linux kernel 6.6+) and OpenVINO >= 2024.0; check ls /dev/accel"
    if device == "GPU":
        return "install the Intel GPU compute runtime (intel-opencl-icd) for OpenVINO's GPU plugin"
    return "choose a device OpenVINO lists here, or another --target"


def _ns(delta) -> int:
    """A profiling time (datetime.timedelta, microsecond resolution) in nanoseconds."""
    return (delta.days * 86400 + delta.seconds) * 1000000000 + delta.microseconds * 1000


def _status(status) -> str:
    name = getattr(status, "name", None) or str(status)
    return name.rsplit(".", 1)[-1]
