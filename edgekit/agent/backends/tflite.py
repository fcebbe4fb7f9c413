"""LiteRT (TensorFlow Lite) on the device: tflite_runtime or ai_edge_litert, XNNPACK on the CPU.

tflite-runtime (last release 2.14) is built against numpy 1: it imports under numpy 2 but its
Interpreter fails. ai-edge-litert works with numpy 2. So under numpy 2 ai_edge_litert is tried
first, under numpy 1 tflite_runtime is; the other is the fallback. ``info`` says which ran.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from .. import AgentFailure, missing_runtime, provision_hint

# distributions that provide an Interpreter, in the order tried under numpy 1
_PACKAGES = ("tflite-runtime", "ai-edge-litert")
# provisioned, it is ai-edge-litert (works with numpy 2; tflite-runtime needs numpy<2)
_INSTALL_HINT = provision_hint("tflite")


# the runner may probe one thread against this runtime's default (runner.PROBE_*)
PROBE_THREADS = True


class Session:
    def __init__(self, interpreter, version: str, info: dict) -> None:
        self._interpreter = interpreter
        self._inputs = [(d["name"], d["index"], tuple(d["shape"])) for d in interpreter.get_input_details()]
        self._outputs = [d["index"] for d in interpreter.get_output_details()]
        self._resized = False
        self.version = version
        self.info = info

    def run(self, feeds: dict):
        it = self._interpreter
        if not self._resized:
            self._resize(feeds)
        for name, index, _ in self._inputs:
            it.set_tensor(index, feeds[name])
        it.invoke()
        return [it.get_tensor(i) for i in self._outputs]

    def timed(self, feeds: dict):
        """Inputs set once; a step is one ``invoke()`` (the outputs' copies out left out)."""
        self.run(feeds)  # resizes dynamic inputs and sets the tensors, which invoke() keeps
        invoke = self._interpreter.invoke
        clock = time.perf_counter_ns

        def step() -> int:
            t = clock()
            invoke()
            return clock() - t

        return step, "perf_counter_ns around Interpreter.invoke() on inputs set once"

    def _resize(self, feeds: dict) -> None:
        """Give dynamic inputs the shapes of the feeds once (the interpreter starts with 1s)."""
        changed = False
        for name, index, shape in self._inputs:
            if name not in feeds:
                known = ", ".join(n for n, _, _ in self._inputs)
                raise KeyError(f"no feed for input '{name}' (the model's inputs: {known})")
            if tuple(feeds[name].shape) != shape:
                self._interpreter.resize_tensor_input(index, list(feeds[name].shape))
                changed = True
        if changed:
            self._interpreter.allocate_tensors()
        self._resized = True


_SEEN_XNNPACK = [False]  # this process's runtime logged applying XNNPACK (it does so once)


def load(model_path: str, threads, options: dict = None, workdir: str = None) -> Session:
    options = dict(options or {})
    module, dist = _import()
    kwargs = {"model_path": model_path}
    if threads:
        kwargs["num_threads"] = int(threads)
    xnnpack = bool(options.get("xnnpack", True))
    if not xnnpack:
        kwargs["experimental_op_resolver_type"] = module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    version = _dist_version(dist, module)

    def build():
        interpreter = module.Interpreter(**kwargs)
        interpreter.allocate_tensors()
        return interpreter

    try:
        interpreter, log = _capture_stderr(build)
    except Exception as exc:  # ValueError for a bad model, RuntimeError for a failed delegate or numpy mismatch
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = "check the .tflite file on the host (edgekit plan MODEL.tflite reads it)"
        if "_ARRAY_API" in str(exc) or "numpy" in str(exc).lower():
            hint = f"{dist} was built for another numpy major version; {_INSTALL_HINT}"
        raise AgentFailure(f"{dist} {version} cannot load {os.path.basename(model_path)}: {first}", hint) from None
    _SEEN_XNNPACK[0] = _SEEN_XNNPACK[0] or "XNNPACK" in log
    info = {
        "package": dist,
        "package_version": version,
        "threads": threads,
        # The runtime says so on stderr when it applies its default delegate; trust that, not the
        # flag. It says so once per process: a second interpreter (the thread probe's) is silent.
        "xnnpack": xnnpack and ("XNNPACK" in log or _SEEN_XNNPACK[0]),
        "xnnpack_requested": xnnpack,
    }
    lines = [ln for ln in log.splitlines() if ln.strip()]
    if lines:
        info["runtime_log"] = lines[:10]
    return Session(interpreter, version, info)


def _import():
    """(interpreter module, distribution name): the package that matches this device's numpy."""
    order = list(_PACKAGES)
    if _numpy_major() >= 2:
        order.reverse()
    errors = []
    for dist in order:
        try:
            if dist == "tflite-runtime":
                from tflite_runtime import interpreter as module
            else:
                from ai_edge_litert import interpreter as module
        except ImportError as exc:
            errors.append(f"{dist}: {exc}")
            continue
        return module, dist
    raise AgentFailure(f"no LiteRT runtime imports on the device (for {sys.executable}): {'; '.join(errors)}", _INSTALL_HINT, runtime="tflite")


def _numpy_major() -> int:
    try:
        import numpy
    except ImportError:
        raise missing_runtime("numpy") from None
    try:
        return int(numpy.__version__.split(".")[0])
    except ValueError:
        return 0


def _dist_version(dist: str, module) -> str:
    try:
        from importlib import metadata

        return metadata.version(dist)
    except Exception:  # Python 3.7 has no importlib.metadata; a vendored copy has no metadata
        return str(getattr(module, "__version__", "unknown"))


def _capture_stderr(fn):
    """Run ``fn`` with file descriptor 2 captured: LiteRT's C++ logging writes there, not to sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            log = tmp.read().decode("utf-8", errors="replace")
    return result, log
