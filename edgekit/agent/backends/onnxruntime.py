"""ONNX Runtime on the CPU: all graph optimizations, CPUExecutionProvider.

Per-layer times (``layers``, asked for by ``bench --profile``) come from ORT's own profiler
(SessionOptions.enable_profiling) on a second session with the same options, run after the
timed loop: the profiler writes an event per node per run, which would slow the timed samples.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

from .. import AgentFailure, missing_runtime

PROFILE_WARMUP = 3  # runs left out of the profile: a new session's first runs do one-time work
PROFILE_RUNS = 20
_KERNEL = "_kernel_time"


# the runner may probe one thread against this runtime's default (runner.PROBE_*)
PROBE_THREADS = True


class Session:
    def __init__(self, session, version: str, make_session=None) -> None:
        self._session = session
        self._make_session = make_session
        self._last_feeds = None
        self._bound = None
        self.version = version

    def run(self, feeds: dict):
        self._last_feeds = feeds  # layers() replays the inputs that were timed
        return self._session.run(None, feeds)

    def timed(self, feeds: dict):
        """Inputs and outputs bound once (IOBinding; each output a preallocated array of the shape
        and dtype one run on these feeds gave); a step is one ``run_with_iobinding``, timed around
        the call into ORT's C++ session (its Python wrapper's per-call checks left out)."""
        import onnxruntime as ort

        session = self._session
        outputs = self.run(feeds)
        binding = session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        bound = []  # the arrays ORT writes into: they must outlive the binding
        for meta, value in zip(session.get_outputs(), outputs):
            if getattr(value, "dtype", None) is not None and value.dtype.kind in "biuf":
                array = value.copy()
                binding.bind_ortvalue_output(meta.name, ort.OrtValue.ortvalue_from_numpy(array))
                bound.append(array)
            else:  # a sequence, map or string output: ORT allocates it on each run
                binding.bind_output(meta.name)
        self._bound = (feeds, bound, binding)
        inner, handle = getattr(session, "_sess", None), getattr(binding, "_iobinding", None)
        if inner is not None and handle is not None and hasattr(inner, "run_with_iobinding"):
            run, args = inner.run_with_iobinding, (handle, ort.RunOptions())
        else:  # a build without the usual internals: its public call, checks included
            run, args = session.run_with_iobinding, (binding,)
        clock = time.perf_counter_ns

        def step() -> int:
            t = clock()
            run(*args)
            return clock() - t

        return step, "perf_counter_ns around InferenceSession.run_with_iobinding on inputs and outputs bound once"

    def layers(self):
        """Per node: ORT's profiled kernel time per inference, over PROFILE_RUNS runs of the last feeds."""
        if self._last_feeds is None or self._make_session is None:
            return None
        tmp = tempfile.mkdtemp(prefix="ort-profile-")
        try:
            session = self._make_session(os.path.join(tmp, "ort"))
            for _ in range(PROFILE_WARMUP + PROFILE_RUNS):
                session.run(None, self._last_feeds)
            with open(session.end_profiling(), encoding="utf-8") as fh:
                events = json.load(fh)
        except Exception:  # per-layer times are extra: the timings stand without them
            return None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return profile_layers(events, skip_runs=PROFILE_WARMUP)


def profile_layers(events: list, skip_runs: int = 0) -> list:
    """ORT profiler events (Chrome trace: ``{"cat": "Node", "name": "<node>_kernel_time", "dur": µs,
    "args": {"op_name"}}`` inside ``{"cat": "Session", "name": "model_run"}`` spans) -> per node, in
    execution order: ``{name, op, ns, calls}``, ns the mean time per run, over the runs after the
    first ``skip_runs``. A node's time is the median of its calls times its calls per run: one run
    stalled by another process (a 20x outlier on a busy board) must not make a layer look slow;
    ``ns_p25``/``ns_p75`` (the quartiles, the same way) say how far it moved between runs."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    kept = runs[skip_runs:] if len(runs) > skip_runs else runs
    totals = {}
    for e in events:
        name = e.get("name") or ""
        if e.get("cat") != "Node" or not name.endswith(_KERNEL):
            continue
        if kept and not any(a <= e["ts"] <= b for a, b in kept):
            continue
        entry = totals.setdefault(name[: -len(_KERNEL)], {"op": (e.get("args") or {}).get("op_name") or "", "us": []})
        entry["us"].append(e.get("dur") or 0)
    n = len(kept) or max((len(t["us"]) for t in totals.values()), default=1)
    out = []
    for k, t in totals.items():
        per_run = 1000.0 * len(t["us"]) / n  # µs of one call -> ns per run
        q = statistics.quantiles(t["us"], n=4, method="inclusive") if len(t["us"]) > 1 else [t["us"][0]] * 3
        out.append({"name": k, "op": t["op"], "ns": int(round(statistics.median(t["us"]) * per_run)),
                    "ns_p25": int(round(q[0] * per_run)), "ns_p75": int(round(q[2] * per_run)), "calls": len(t["us"])})
    return out


def load(model_path: str, threads: int | None, options: dict | None = None, workdir: str | None = None) -> Session:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        if getattr(exc, "name", None) == "onnxruntime":
            raise missing_runtime("onnxruntime") from None
        raise AgentFailure(
            f"onnxruntime is installed on the device but does not import: {exc}",
            "install a build of onnxruntime (and numpy) that matches the device's Python and CPU",
        ) from None

    def make_session(profile_prefix=None):
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # errors only: warnings would drown the agent's own messages
        if threads:
            opts.intra_op_num_threads = threads
        if profile_prefix:
            opts.enable_profiling = True
            opts.profile_file_prefix = profile_prefix
        return ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])

    try:
        session = make_session()
    except Exception as exc:  # ORT raises its own exception classes (Fail, InvalidGraph, ...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AgentFailure(
            f"onnxruntime {ort.__version__} cannot load {model_path}: {first}",
            "check the model with onnx.checker on the host; a newer onnxruntime on the device "
            "may be needed for its opset",
        ) from None
    return Session(session, ort.__version__, make_session)
