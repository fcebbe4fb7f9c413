"""Time one variant of a bundle on this device and describe the run as one JSON document.

The agent reports raw per-iteration latencies and facts only; statistics are the host's job.
"""

from __future__ import annotations

import gc
import os
import posixpath
import sys
import time
from datetime import datetime, timezone

from . import (
    AGENT_VERSION,
    MAX_SAMPLES,
    PATH_OPTIONS,
    REPUSH,
    SCHEMA,
    AgentFailure,
    bundle_file,
    bundle_hash,
    missing_runtime,
    read_json,
    sha256_file,
)
from .backends import load_backend
from .contention import contention, snapshot
from .energy import energy_record, open_meter
from .facts import device_facts, device_state
from .speed import SpeedMeter

MAX_WARMUP_SAMPLES = 1000
INPUTS_FILE = "inputs.npz"

# Warm-up "auto": until latency is stable, bounded. Run at least AUTO_MIN warm-up iterations;
# stop when the median of the last AUTO_WINDOW is within AUTO_TOLERANCE of the median of the
# AUTO_WINDOW before them (caches, allocators, clocks and JITs have settled), or after
# AUTO_MAX_RUNS iterations or AUTO_MAX_NS of warm-up, whichever comes first (a board that never
# settles, e.g. while it heats up, still gets timed; its drift shows in the samples). ekrt's
# runner (csrc/tools/ekrt.c) applies the same rule with the same numbers.
AUTO = "auto"
AUTO_MIN = 5
AUTO_WINDOW = 5
AUTO_TOLERANCE = 0.05
AUTO_MAX_RUNS = 200
AUTO_MAX_NS = 2_000_000_000

# Threads when nobody chose a count (no --threads, none in the profile), on a multi-core device
# and a backend that takes a count: a short probe of one thread against the runtime's own
# default (all cores), alternating PROBE_ROUNDS rounds of PROBE_RUNS runs after PROBE_WARMUP
# each (bounded by PROBE_MAX_NS). All cores are chosen only when their median is at least
# PROBE_MARGIN faster: one thread is steadier and leaves the other cores to the device's other
# work, and a pool that stalls on a busy core is the failure this guards against.
PROBE_WARMUP = 3
PROBE_ROUNDS = 4
PROBE_RUNS = 3
PROBE_MAX_NS = 1_000_000_000
PROBE_MARGIN = 0.10


def warmup_done(samples_ns: list, elapsed_ns: int) -> bool:
    """The auto warm-up's stopping rule, after ``samples_ns`` (in execution order) took ``elapsed_ns``."""
    n = len(samples_ns)
    if n < AUTO_MIN:
        return False
    if n >= AUTO_MAX_RUNS or elapsed_ns >= AUTO_MAX_NS:
        return True
    if n < 2 * AUTO_WINDOW:
        return False
    before = _median(samples_ns[-2 * AUTO_WINDOW : -AUTO_WINDOW])
    return abs(_median(samples_ns[-AUTO_WINDOW:]) - before) <= AUTO_TOLERANCE * before


def _median(values: list) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def common_layers(layers):
    """Per-layer times in the one format every backend reports (name, op, ns: the median time per
    inference over the profiled runs, ns_p25/ns_p75: its spread over them or null, calls: how
    many timed executions it is over, or null), plus whatever the backend adds (OpenVINO's
    exec_type, trtexec's percent)."""
    if not layers:
        return None
    out = []
    for layer in layers:
        entry = dict(layer)
        entry["name"] = str(entry.get("name") or "")
        entry["op"] = str(entry.get("op") or "")
        entry["ns"] = max(0, int(round(entry.get("ns") or 0)))
        for key in ("ns_p25", "ns_p75"):
            value = entry.get(key)
            entry[key] = max(0, int(round(value))) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        calls = entry.get("calls")
        entry["calls"] = int(calls) if isinstance(calls, int) and not isinstance(calls, bool) else None
        out.append(entry)
    return out


def bench(
    bundle_dir: str,
    variant: str,
    warmup=AUTO,
    iterations: int = 100,
    duration_s: float | None = None,
    threads: int | None = None,
    profile: bool = False,
    min_time_s: float = 0.0,
    probe_threads: bool = True,
) -> dict:
    """Load ``variant`` of the bundle at ``bundle_dir``, time it, return the bench document.

    ``warmup``: a count of untimed runs, or "auto" (until stable, bounded: ``warmup_done``).
    With ``duration_s`` the timed loop runs until that much time is used (at least one
    iteration) instead of a fixed number of ``iterations``; with ``min_time_s`` it runs at least
    ``iterations`` and at least that long (trtexec's rule), so that a model of a few microseconds
    is timed over a window that outlasts a neighbour's burst or a clock step. With ``profile`` the backend's
    per-layer times come from a separate pass after the timed loop, which profiling would slow.
    Without ``threads``, the runtime's default is probed against one thread unless not ``probe_threads``
    (the host's later rounds time what the first round's probe chose).
    """
    if duration_s is not None:
        min_time_s = 0.0  # a duration is the whole window (the loops below and the backends' rely on it)
    manifest, spec, model_path, model_sha = _open_variant(bundle_dir, variant)
    backend = load_backend(spec["backend"])
    facts = device_facts()
    before = device_state()
    started_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")

    options = dict(variant_options(bundle_dir, manifest, spec))
    if getattr(backend, "STATIC_SHAPES", False):  # it compiles dynamic inputs at the shapes timed
        options["input_shapes"] = {t["name"]: list(t["shape"]) for t in spec["inputs"] if t["shape"] and all(d > 0 for d in t["shape"])}
    t0 = time.perf_counter_ns()
    session = backend.load(model_path, threads, options, bundle_dir)
    load_ns = time.perf_counter_ns() - t0
    probe = None
    if threads is None and probe_threads and getattr(backend, "PROBE_THREADS", False) and (os.cpu_count() or 1) > 1:
        session, threads, probe, load_ns = _probe_threads(backend, session, load_ns, model_path, options, bundle_dir, spec)
    own_bench = getattr(session, "bench", None)
    meter = open_meter()
    warmup_mode = AUTO if warmup == AUTO else "fixed"
    if own_bench is not None:
        # A backend that times itself on the device (ekrt's runner, trtexec) returns the
        # per-iteration samples, per-layer times and its info; there is no first call to time.
        if meter is not None:
            meter.start()
        # the runner's window is inside its process: the snapshots span its load and warm-up too
        procs = snapshot()
        try:
            samples, layers, info = own_bench(warmup, iterations, duration_s, spec["inputs"], profile=profile, min_time_s=min_time_s)
        finally:
            if meter is not None:
                meter.stop()
        procs_after = snapshot()
        first_ns = info.pop("first_inference_ns", None)  # when the runtime timed its own first call
        warmup_samples = info.pop("warmup_samples_ns", None)
        warmup_run = info.pop("warmup", None if warmup == AUTO else warmup)
        warmup_mode = info.pop("warmup_mode", warmup_mode)
        window = info.pop("timed_window_ns", None)  # CLOCK_MONOTONIC, as the meter's timestamps
        dims = spec["inputs"][0]["shape"] if spec["inputs"] else []
        batch = int(dims[0]) if len(dims) >= 2 and dims[0] > 0 else 1
        energy = energy_record(meter, window[0], window[1], len(samples) * batch) if window else None
        speed_probe = None  # its window is in another process (agent.speed)
        contended = contention(procs, procs_after, threads or info.get("threads"), "runner")
    else:
        feeds = make_inputs(bundle_dir, spec)

        t0 = time.perf_counter_ns()
        try:
            session.run(feeds)
        except Exception as exc:  # the runtime's own error types: name them, don't crash
            raise _runtime_failure(f"inference of variant '{variant}' failed", exc) from None
        first_ns = time.perf_counter_ns() - t0
        step, timing = _stepper(session, feeds, variant)
        warmup_samples = _warmup(step, warmup)
        warmup_run = len(warmup_samples)
        speed = SpeedMeter()
        procs = snapshot()
        if meter is not None:
            meter.start()
        start = time.monotonic_ns()
        samples = _timed_loop(step, iterations, duration_s, min_time_s, speed)
        end = time.monotonic_ns()
        if meter is not None:
            meter.stop()
        procs_after = snapshot()
        contended = contention(procs, procs_after, threads or (getattr(session, "info", None) or {}).get("threads"), "loop")
        speed_probe = speed.record()
        first_input = feeds[spec["inputs"][0]["name"]] if spec["inputs"] else None
        batch = int(first_input.shape[0]) if first_input is not None and first_input.ndim >= 2 else 1
        energy = energy_record(meter, start, end, len(samples) * batch)
        layers = session.layers() if profile and hasattr(session, "layers") else None
        info = dict(getattr(session, "info", None) or {})
        info["timing"] = timing  # what one sample spans (the runtime's own clock, where it has one)
    after = device_state()

    return {
        "schema": SCHEMA,
        "kind": "edgekit.bench",
        "agent_version": AGENT_VERSION,
        "variant": spec["name"],
        "backend": spec["backend"],
        "backend_version": session.version,
        "precision": spec["precision"],
        "model": spec["model"],
        "model_sha256": model_sha,
        "bundle_hash": bundle_hash(manifest),
        "config": {
            "warmup": warmup_run,
            "warmup_mode": warmup_mode,
            "iterations": None if duration_s is not None else iterations,
            "duration_s": duration_s,
            "min_time_s": min_time_s or None,
            # all cores when not asked: the count the backend chose, where it says
            "threads": threads if threads is not None else info.get("threads"),
            "batch": batch,
        },
        "warmup_samples_ns": None if warmup_samples is None else warmup_samples[:MAX_WARMUP_SAMPLES],
        "samples_ns": samples,
        "load_ns": load_ns,
        "first_inference_ns": first_ns,
        # a runtime in its own process (ekrt's runner) reports that process's peak, not the agent's
        "peak_rss_bytes": info.pop("peak_rss_bytes", None) or peak_rss_bytes(),
        "layers": common_layers(layers),
        "energy": energy,
        "backend_info": info,
        "threads_probe": probe,
        "started_at": started_at,
        "device": facts,
        "device_state": {"before": before, "after": after},
        "speed_probe": speed_probe,  # the device's own speed through the timed window (agent.speed)
        "contention": contended,  # other processes' CPU through the timed window (agent.contention)
    }


def _probe_threads(backend, session, load_ns: int, model_path: str, options: dict, bundle_dir: str, spec: dict) -> tuple:
    """(the session to time, its thread count, the probe's record, its load time): one thread
    against the runtime's default, whichever is faster by the rule above PROBE_WARMUP."""
    t0 = time.perf_counter_ns()
    single = backend.load(model_path, 1, options, bundle_dir)
    single_load_ns = time.perf_counter_ns() - t0
    own = getattr(session, "bench", None)
    feeds = None if own is not None else make_inputs(bundle_dir, spec)
    steps = {}
    runs = {"all": [], "one": []}
    begin = time.perf_counter_ns()
    for r in range(PROBE_ROUNDS):
        for key, s in (("all", session), ("one", single)):
            if own is not None:  # a runtime in its own process times itself
                runs[key] += s.bench(PROBE_WARMUP, PROBE_RUNS, None, spec["inputs"], profile=False)[0]
            else:
                if r == 0:
                    steps[key] = _stepper(s, feeds, spec["name"])[0]
                    _warmup(steps[key], PROBE_WARMUP)
                runs[key] += _timed_loop(steps[key], PROBE_RUNS, None)
        if time.perf_counter_ns() - begin > PROBE_MAX_NS:
            break
    p50 = {key: _median(v) for key, v in runs.items()}
    all_threads = (getattr(session, "info", None) or {}).get("threads") or os.cpu_count()
    use_all = p50["all"] <= (1 - PROBE_MARGIN) * p50["one"]
    record = {"all_threads": all_threads, "all_p50_ns": int(p50["all"]), "one_p50_ns": int(p50["one"]), "runs": len(runs["one"]), "chosen": all_threads if use_all else 1}
    if use_all:
        del single
        return session, None, record, load_ns
    del session
    steps.clear()  # a step holds its session
    gc.collect()
    return single, 1, record, single_load_ns


def _open_variant(bundle_dir: str, variant: str, model: str | None = None) -> tuple:
    """The manifest, the variant's spec, its model path and sha256 (checked against the manifest).
    ``model``: another file of the bundle that the variant's backend runs instead (its twin with
    intermediate tensors exposed)."""
    manifest = read_manifest(bundle_dir)
    spec = find_variant(manifest, variant)
    model_rel = model or spec["model"]
    model_path = bundle_file(bundle_dir, model_rel, f"variant '{variant}' model")
    if not os.path.isfile(model_path):
        raise AgentFailure(f"the bundle on the device has no model file {model_rel}", REPUSH)
    model_sha = sha256_file(model_path)
    recorded = {f["path"]: f["sha256"] for f in manifest["files"]}
    if recorded.get(model_rel) != model_sha:
        raise AgentFailure(f"{model_rel} on the device does not match its sha256 in manifest.json", REPUSH)
    return manifest, spec, model_path, model_sha


def variant_options(bundle_dir: str, manifest: dict, spec: dict) -> dict:
    """The variant's backend options, with every file it names checked: inside the bundle, listed in
    the manifest and matching its sha256 there (a runner is executed: it must be the one pushed)."""
    options = spec.get("options") or {}
    if not isinstance(options, dict):
        raise AgentFailure(f"variant '{spec.get('name')}' in manifest.json: 'options' must be an object", REPUSH)
    recorded = {f["path"]: f["sha256"] for f in manifest["files"]}
    for key in PATH_OPTIONS:
        if key not in options:
            continue
        rel = options[key]
        path = bundle_file(bundle_dir, rel, f"variant '{spec.get('name')}' options.{key}")
        if rel not in recorded:
            raise AgentFailure(f"manifest.json: options.{key} {rel!r} is not one of the bundle's files", REPUSH)
        if not os.path.isfile(path) or sha256_file(path) != recorded[rel]:
            raise AgentFailure(f"{rel} on the device does not match its sha256 in manifest.json", REPUSH)
    return dict(options)


def evaluate(bundle_dir: str, variant: str, samples: str, output: str, threads: int | None = None, model: str | None = None) -> dict:
    """Run every sample of the bundle's ``samples`` file (an .npz of stacked inputs, sample i is
    ``arr[i:i+1]``) through ``variant`` on this device; write the stacked outputs to ``output`` (.npz
    keyed by output name; outside the bundle, whose files are only what the manifest lists). The
    host compares the variants' outputs: the agreement it reports is what this device computed.
    ``model``: a bundle file the variant's backend runs instead (the host's twin of it with
    intermediate tensors as outputs); its outputs are keyed ``output0``, ``output1``... in order."""
    np = _numpy()
    manifest, spec, model_path, model_sha = _open_variant(bundle_dir, variant, model)
    options = dict(variant_options(bundle_dir, manifest, spec))
    path = bundle_file(bundle_dir, samples, "samples file")
    arrays = _npz_inputs(np, path, spec)
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1:
        raise AgentFailure(f"{samples}: the inputs hold different numbers of samples ({sorted(counts)})", REPUSH)
    n = counts.pop()
    session = load_backend(spec["backend"]).load(model_path, threads, options, bundle_dir)
    names = [t["name"] for t in spec.get("outputs") or []] if model is None else []
    got = {}

    def infer(fn, feeds, where: str = ""):
        try:
            return fn(feeds)
        except AgentFailure:
            raise
        except Exception as exc:  # the runtime's own error types: name them, don't crash
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise AgentFailure(f"inference of variant '{variant}' failed{where}: {first}", "check the samples match the model's inputs") from None

    t0 = time.perf_counter_ns()
    run_all = getattr(session, "run_all", None)  # a runtime in its own process: all samples at once
    for i in range(n if run_all is None else 0):
        result = infer(session.run, {k: a[i : i + 1] for k, a in arrays.items()}, f" on sample {i}")
        if isinstance(result, dict) and all(isinstance(k, str) for k in result):
            values = [result[k] for k in names] if names else list(result.values())
        else:
            values = list(result.values()) if hasattr(result, "values") else list(result)
        for k, value in enumerate(values):
            # copies: a runtime may hand out views of buffers it reuses on the next call
            got.setdefault(names[k] if k < len(names) else f"output{k}", []).append(np.array(value, copy=True))
    if run_all is not None and n:
        for k, value in enumerate(infer(run_all, arrays)):
            got[names[k] if k < len(names) else f"output{k}"] = [np.asarray(value)]
    seconds = (time.perf_counter_ns() - t0) / 1e9
    out_path = output if output.endswith(".npz") else output + ".npz"  # numpy.savez would add it
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    np.savez(out_path, **{k: np.concatenate([np.reshape(v, (1, -1)) if v.ndim == 0 else v for v in vs]) for k, vs in got.items()})
    return {
        "schema": SCHEMA,
        "kind": "edgekit.eval",
        "agent_version": AGENT_VERSION,
        "variant": spec["name"],
        "backend": spec["backend"],
        "backend_version": session.version,
        "model_sha256": model_sha,
        "bundle_hash": bundle_hash(manifest),
        "samples": n,
        "outputs": out_path,
        "seconds": round(seconds, 3),
    }


def _stepper(session, feeds: dict, variant: str) -> tuple:
    """(step, how): ``step()`` runs one inference on ``feeds`` and returns its time in ns, taken as
    close to the runtime as the session allows (its ``timed``: inputs bound once, the runtime's
    own clock where it has one), else by the agent's clock around ``session.run``; ``how`` says which."""
    timed = getattr(session, "timed", None)
    if timed is not None:
        try:
            return timed(feeds)
        except Exception as exc:  # the runtime's own error types: name them, don't crash
            raise _runtime_failure(f"binding the inputs of variant '{variant}' for timing failed", exc) from None
    run = session.run
    clock = time.perf_counter_ns

    def step() -> int:
        t = clock()
        run(feeds)
        return clock() - t

    return step, "perf_counter_ns around the agent's session.run(feeds)"


def _warmup(step, warmup) -> list:
    """Run the warm-up (a count, or "auto": ``warmup_done``) of ``step`` (``_stepper``); its
    latencies in execution order."""
    clock = time.perf_counter_ns
    samples = []
    begin = clock()
    while True if warmup == AUTO else len(samples) < warmup:
        samples.append(step())
        if warmup == AUTO and warmup_done(samples, clock() - begin):
            break
    return samples


def _timed_loop(step, iterations: int, duration_s: float | None, min_time_s: float = 0.0, speed: SpeedMeter | None = None) -> list:
    """Per-iteration times of ``step`` (``_stepper``): ``iterations`` of them; or for ``duration_s``;
    or at least ``iterations`` and at least ``min_time_s`` (bounded by MAX_SAMPLES). ``speed``
    times its loop between inferences when a burst is due (outside the samples)."""
    clock = time.perf_counter_ns
    tick = speed.tick if speed is not None else (lambda now: None)
    samples = []
    # Like timeit: a collector pause inside one iteration would show up as a fake outlier.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        if duration_s is None and not min_time_s:
            for _ in range(iterations):
                samples.append(step())
                tick(clock())
        else:
            count = 1 if duration_s is not None else iterations
            deadline = clock() + int((duration_s if duration_s is not None else min_time_s) * 1e9)
            while True:
                samples.append(step())
                end = clock()
                if (end >= deadline and len(samples) >= count) or len(samples) >= MAX_SAMPLES:
                    break
                tick(end)
    finally:
        if gc_was_enabled:
            gc.enable()
    return samples


def read_manifest(bundle_dir: str) -> dict:
    """The bundle's manifest.json, checked just enough to be used safely here."""
    if not os.path.isdir(bundle_dir):
        raise AgentFailure(f"no bundle directory on the device at {bundle_dir}", REPUSH)
    path = os.path.join(bundle_dir, "manifest.json")
    manifest = read_json(path, REPUSH)
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if schema != SCHEMA:
        raise AgentFailure(
            f"{path} has bundle schema {schema!r}; this agent reads schema {SCHEMA}",
            "use the same edgekit version to build the bundle and to run it",
        )
    files = manifest.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "path" in f and "sha256" in f for f in files):
        raise AgentFailure(f"{path}: 'files' must be a list of {{path, sha256, size}} objects", REPUSH)
    for f in files:
        bundle_file(bundle_dir, f["path"], "file")
    if not isinstance(manifest.get("variants"), list):
        raise AgentFailure(f"{path}: 'variants' must be a list", REPUSH)
    return manifest


def find_variant(manifest: dict, name: str) -> dict:
    names = []
    for spec in manifest["variants"]:
        if isinstance(spec, dict):
            names.append(str(spec.get("name")))
            if spec.get("name") == name:
                for key in ("backend", "precision", "model", "inputs"):
                    if key not in spec:
                        raise AgentFailure(f"variant '{name}' in manifest.json has no '{key}'", REPUSH)
                return spec
    raise AgentFailure(
        f"the bundle has no variant '{name}' (it has: {', '.join(names) or 'none'})",
        "pass one of the bundle's variant names",
    )


def make_inputs(bundle_dir: str, spec: dict) -> dict:
    """Feeds for the variant: its directory's inputs.npz when present, else seeded random data.

    Random data is deterministic (seed 0) so every device times the same values: floats are
    standard normal, integers lie in [0, 10) (safe as indices), booleans are coin flips.
    Dimensions <= 0 (dynamic) become 1.
    """
    np = _numpy()
    model_dir = posixpath.dirname(spec["model"])
    npz = bundle_file(bundle_dir, posixpath.join(model_dir, INPUTS_FILE), "inputs file")
    if os.path.isfile(npz):
        return _npz_inputs(np, npz, spec)
    rng = np.random.RandomState(0)  # the legacy generator's stream is frozen across numpy versions
    feeds = {}
    for tensor in spec["inputs"]:
        try:
            dtype = np.dtype(tensor["dtype"])
        except TypeError:
            raise AgentFailure(
                f"input '{tensor['name']}' has an unknown dtype {tensor['dtype']!r}",
                "rebuild the bundle; dtypes are numpy names such as float32 or int64",
            ) from None
        shape = tuple(d if d > 0 else 1 for d in tensor["shape"])
        if dtype.kind == "f":
            feeds[tensor["name"]] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[tensor["name"]] = rng.randint(0, 10, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[tensor["name"]] = rng.randint(0, 2, size=shape).astype(dtype)
        else:
            raise AgentFailure(
                f"cannot make random data for input '{tensor['name']}' of dtype {dtype.name}",
                f"put sample inputs in {INPUTS_FILE} beside the model in the bundle",
            )
    return feeds


def _npz_inputs(np, path: str, spec: dict) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # numpy raises ValueError/OSError/zipfile errors for a bad file
        raise AgentFailure(f"cannot read {path}: {exc}", f"rebuild {INPUTS_FILE} with numpy.savez") from None
    feeds = {}
    for tensor in spec["inputs"]:
        name = tensor["name"]
        if name not in arrays:
            raise AgentFailure(
                f"{path} has no array for input '{name}' (it has: {', '.join(sorted(arrays)) or 'none'})",
                f"save one array per model input, keyed by input name: numpy.savez(path, **{{'{name}': ...}})",
            )
        if arrays[name].dtype.name != tensor["dtype"]:
            raise AgentFailure(
                f"{path}: input '{name}' is {arrays[name].dtype.name}, the model wants {tensor['dtype']}",
                f"save it as {tensor['dtype']}",
            )
        feeds[name] = arrays[name]
    return feeds


def peak_rss_bytes() -> int | None:
    # Linux keeps ru_maxrss across fork+exec: an agent started by a big host process (the local
    # transport) would report the host's peak. VmHWM belongs to this process image alone.
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _numpy():
    try:
        import numpy
    except ImportError:
        raise missing_runtime("numpy") from None
    return numpy


def _runtime_failure(what: str, exc: Exception) -> AgentFailure:
    """A runtime's own exception as one agent failure line: ``what``, then its first line."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return AgentFailure(f"{what}: {first}", "check that the variant's inputs in manifest.json (or its inputs.npz) match the model")
