"""Execute a plan: walk its typed steps, nothing decided here.

``open_job`` loads what a request names, once: the model, the profile, the device entry and
(on first use) the data. ``run`` takes the job's plan on paper, connects, checks the device
(preflight), re-plans with its facts and ``execute``s the plan under the device's lock.
``execute`` runs each step with the handler for its type and returns what happened, including
the list of steps it ran (the very objects ``deploy --dry-run`` prints).
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgekit import layererror
from edgekit.agentclient import bench_variant, eval_variant
from edgekit.bench import reuse
from edgekit.bench.compare import machine_shift
from edgekit.bench.record import (
    contention_note,
    make_record,
    measurement_warnings,
    merge_rounds,
    round_p50s_ns,
)
from edgekit.bench.store import ResultsStore
from edgekit.bench.vcs import vcs_info
from edgekit.bench.verdict import Verdict, choose_fastest, int8_verdict
from edgekit.bundle import Bundle, Variant, write_bundle
from edgekit.devices import DeviceEntry, connect, resolve_devices
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT
from edgekit.devices.lock import device_lock
from edgekit.devices.preflight import ensure_ready
from edgekit.errors import AgentError, GateError, ModelError, PlanError, UsageError
from edgekit.events import Events
from edgekit.fsutil import check_output_dir
from edgekit.modelio import LoadedModel, load_model, read_sidecar
from edgekit.plan import (
    LAYER_SAMPLES,
    Bench,
    Compile,
    Eval,
    Gate,
    LayerError,
    Options,
    Plan,
    Push,
    Quantize,
    Store,
    WriteBundle,
    bench_window,
    make_plan,
    replan,
    step_dict,
)
from edgekit.profiles import Profile, load_profile, resolve
from edgekit.quantize import (
    FeedSet,
    Preprocess,
    QuantizeResult,
    analyze_model,
    load_feeds,
    quantize_model,
    random_feeds,
    save_model,
)
from edgekit.quantize import cache as qcache
from edgekit.quantize.calib import DEFAULT_METHOD, parse_method, spread
from edgekit.quantize.mixed import check_metric
from edgekit.quantize.report import AgreementReport, compare
from edgekit.quantize.smooth import Smoothing
from edgekit.quantize.threshold import Check, check_threshold
from edgekit.targets import get_backend
from edgekit.transport.agentzip import agent_path
from edgekit.transport.base import Transport
from edgekit.transport.push import PushResult, progress_reporter, push_bundle

HELD_OUT_FRACTION = 0.2
RANDOM_SAMPLES = 32


@dataclass(frozen=True)
class DeployRequest:
    """The typed arguments of quantize / plan / bench / deploy (the CLI and the Python API build one)."""

    model: Path
    target: str = "local"
    device: str | DeviceEntry | None = None
    backend: str | None = None
    quantize: bool = True
    goal: str = "deploy"  # "quantize", "bundle" (no device) or "deploy"
    calib: Path | None = None
    eval: Path | None = None
    labels: Path | None = None
    method: str = DEFAULT_METHOD
    exclude: tuple[str, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    preprocess: Preprocess | None = None
    warmup: int | None = None
    iterations: int | None = None
    duration_s: float | None = None
    min_time_s: float | None = None  # None: the profile's (when no --iterations count was asked for)
    threads: int | None = None
    rounds: int | None = None  # agent processes per variant, samples merged (None: the profile's, 1)
    layers: bool = True  # per-layer times, from a separate profiled pass after the timed runs
    layer_error: bool = False  # per-layer fp32-vs-int8 error measured on the device (--layers error)
    output: Path | None = None
    inventory: Path | None = None  # where a --device name is looked up (default: ./devices.toml)
    provision: bool = False  # install the plan's runtime on the device when preflight finds it missing
    lock_wait: float = DEFAULT_LOCK_WAIT  # seconds to queue behind another job's lock on the device
    max_drop: float = 1.0  # the int8 gate: accuracy POINTS int8 may lose against labels (as --max-drop)
    require_int8: bool = False  # exit 5 when the int8 gate recommends float
    remeasure: bool = False  # bench and evaluate even when an identical earlier measurement exists
    calib_samples: int | None = None  # calibrate on at most this many samples, spread over the data
    choose: str = "plan"  # "measure": int8 on every backend of the profile that can run it, the fastest wins
    trust_new_host: bool = False  # save the key of an SSH device not yet in known_hosts
    password: str | None = field(default=None, repr=False)  # SSH password login, only when given
    metric: str | None = None  # what the int8 model's held-out check measures (None: the sidecar's, else top1 for class vectors, else cosine)
    threshold: float | None = None  # the figure that check must reach, in the metric's unit (None: the sidecar's, else the metric's default)
    strict: bool = False  # an int8 model that misses the threshold is an error (exit 5), not a warning


class _Memo:
    """Values computed once per key, whichever thread asks first (a fleet's devices share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[Any, threading.Lock] = {}
        self._values: dict[Any, Any] = {}

    def get(self, key: Any, make: Any) -> Any:
        with self._lock:
            lock = self._keys.setdefault(key, threading.Lock())
        with lock:
            if key not in self._values:
                self._values[key] = make()
            return self._values[key]


@dataclass
class Job:
    """What a request names, loaded once: the model, its profile, the device, the data."""

    request: DeployRequest
    model: LoadedModel
    profile: Profile
    device: DeviceEntry
    calib: Path | None
    eval: Path | None
    labels: Path | None
    output: Path
    notes: tuple[str, ...] = ()  # what loading decided that the plan should say (shapes from data)
    memo: _Memo = field(default_factory=_Memo, repr=False)  # shared by a fleet's per-device copies

    def feeds(self, events: Events) -> tuple[FeedSet, FeedSet]:
        """The calibration and held-out sets, read on first use (random only with a loud warning)."""
        return self.memo.get("feeds", lambda: _load_feeds(self, events))

    def plan(self) -> Plan:
        """The plan on paper (no device facts yet)."""
        decided = {"device", "calibration", "evaluation", "output"}  # by loading: given below
        asks = {k: getattr(self.request, k) for k in Options.__dataclass_fields__.keys() - decided}
        asks["max_drop"] = self.request.max_drop / 100  # points asked, the plan's fraction
        plan = make_plan(
            self.model,
            self.profile,
            device=self.device.name,
            calibration=str(self.calib) if self.calib else "random",
            evaluation=str(self.eval) if self.eval else (f"last {int(HELD_OUT_FRACTION * 100)}% of the calibration data" if self.calib else "random"),
            output=str(self.output),
            **asks,
        )
        return dataclasses.replace(plan, notes=self.notes + plan.notes)


def open_job(req: DeployRequest) -> Job:
    """Load the model, the profile and the device entry of ``req``; check the output path."""
    loaded, notes = _load(req)
    device = req.device if isinstance(req.device, DeviceEntry) else resolve_devices([req.device or "local"], req.inventory)[0]
    profile = load_profile(req.target)
    if device.is_local:
        profile = resolve(profile)  # a probe profile on this machine: its CPU is the host's, known now
    sc = loaded.sidecar
    check_metric(req.metric)
    try:
        check_metric(sc.metric)
        check_threshold(sc.metric, sc.threshold)
    except UsageError as exc:  # the sidecar's [accuracy]: the model's data is unusable (exit 3)
        where = loaded.path.with_name(loaded.path.stem + ".edgekit.toml")
        raise ModelError(f"{where}: [accuracy]: {exc.message.replace('--threshold', 'threshold')}", exc.hint) from None
    check_threshold(req.metric or sc.metric, req.threshold)
    calib = req.calib or sc.calibration
    evaluation = req.eval or sc.evaluation
    labels = req.labels or (sc.labels if evaluation is not None and evaluation == sc.evaluation else None)
    output = req.output or Path("edgekit-out") / f"{loaded.name}-{profile.name}"
    if req.output is not None:
        check_output_dir(output)
    return Job(req, loaded, profile, device, calib, evaluation, labels, output, notes)


def _load(req: DeployRequest) -> tuple[Any, tuple[str, ...]]:
    """The model, its dynamic input dimensions taken from the data when --shape does not give them
    (a dynamic batch runs at 1, the data's sample shape decides the rest)."""
    try:
        return load_model(req.model, req.shapes), ()
    except ModelError as exc:
        if "dynamic shape" not in exc.message:
            raise
        sidecar = read_sidecar(Path(req.model))
        guessed = {**_sample_shapes(req.calib or sidecar.calibration or req.eval or sidecar.evaluation, req.model), **req.shapes}
        if guessed == req.shapes:
            raise
        model = load_model(req.model, guessed)
        taken = ", ".join(f"{k}:{','.join(map(str, v))}" for k, v in guessed.items() if k not in req.shapes)
        return model, (f"dynamic input shapes taken from the data (batch 1): {taken}; give --shape to choose others",)


def _sample_shapes(data: Path | None, model: Path) -> dict[str, tuple[int, ...]]:
    """Input name -> the shape of one sample (batch 1) in a stacked .npz (or a .npy, for a
    single-input model); {} when the data says nothing (a folder, images, an unreadable file)."""
    if data is None or not Path(data).is_file():
        return {}
    try:
        if Path(data).suffix == ".npy":
            graph = onnx.load(str(model), load_external_data=False).graph
            names = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
            arr = np.load(data, mmap_mode="r", allow_pickle=False)
            return {names[0]: (1, *arr.shape[1:])} if len(names) == 1 and arr.ndim >= 1 else {}
        with np.load(data, allow_pickle=False) as z:
            return {k: (1, *z[k].shape[1:]) for k in z.files if z[k].ndim >= 1}
    except (OSError, ValueError, KeyError):
        return {}  # the data loader reports a bad file, with its own words


def run(job: Job, plan: Plan, events: Events) -> DeployResult:
    """Execute ``plan``; one that reaches a device connects, runs preflight and is re-planned first."""
    if not plan.needs_device:
        for note in plan.notes:
            events.info(f"note: {note}")
        return execute(plan, job, None, events)
    req = job.request
    transport = connect(job.device, job.profile, trust_new_host=req.trust_new_host, password=req.password, log=events.info)
    try:
        # Preflight reads the device's facts (its runtimes, its CPU) and stops here, before any
        # push, when the device cannot run the plan; the real plan is made with those facts.
        ready = ensure_ready(transport, job.profile, plan, device=job.device.name, provision=req.provision, events=events)
        plan = replan(plan, job.model, job.profile, ready.facts)
        plan = dataclasses.replace(plan, notes=job.notes + plan.notes)
        for note in plan.notes:
            events.info(f"note: {note}")
        with device_lock(transport, wait=req.lock_wait, on_wait=events.info) as lock:  # no other job benches it meanwhile
            try:
                result = execute(plan, job, transport, events, facts=ready.facts, lock=lock)
            except AgentError as exc:
                if exc.reason != "compile" or plan.options.backend is not None:  # a backend the user forced stays
                    raise
                plan, facts = _after_refusal(plan, job, ready.facts, exc, events)
                result = execute(plan, job, transport, events, facts=facts, lock=lock)
    finally:
        transport.close()
    v = result.verdict
    if v is not None and plan.options.require_int8 and plan.variant(v.recommended).precision != "int8":
        raise GateError(
            f"--require-int8: the int8 gate recommends {v.recommended} on {plan.device}: " + "; ".join(v.reasons),
            f"the runs are stored (edgekit results list); see why with edgekit deploy {job.model.path} --json (summary.recommendation)",
        )
    return result


def _after_refusal(plan: Plan, job: Job, facts: dict, exc: AgentError, events: Events) -> tuple[Plan, dict]:
    """The plan again without the backend whose runtime refused the model at compile (``exc``), and
    the facts that say so: the next backend of the profile runs it, and the plan's
    ``skipped_backends`` records why (when no other backend can, the refusal is the error)."""
    why = f"the device's {plan.backend} refused the model at compile: {exc.message}"
    facts = {**facts, "refused": {**(facts.get("refused") or {}), plan.backend: why}}
    try:
        new = replan(plan, job.model, job.profile, facts)
    except PlanError:
        raise exc from None  # nothing to fall back to: the refusal is the error
    events.warn(f"{why}; falling back to {new.backend}, the next backend of {job.profile.name}")
    new = dataclasses.replace(new, notes=job.notes + new.notes + (f"{plan.backend} refused the model at compile on {plan.device}; fell back to {new.backend}",))
    return new, facts


@dataclass
class DeployResult:
    plan: Plan
    quantize: QuantizeResult | None
    bundle: Bundle | None
    push: PushResult | None
    records: list[dict]
    run_ids: list[int]
    sizes: dict[str, int]
    executed: list[Any] = field(default_factory=list)  # the plan's steps, as they ran
    agreement: AgreementReport | None = None  # measured on the device (Eval steps); else None
    verdict: Verdict | None = None  # the int8 gate (Gate step)
    seconds: list[float] = field(default_factory=list)  # wall time of each executed step
    reused: set[int] = field(default_factory=set)  # run ids of earlier measurements that stood in for new ones
    agreements: dict[str, AgreementReport] = field(default_factory=dict)  # each int8 variant's, on the device (--choose measure: several)
    layer_error: dict | None = None  # per-layer fp32-vs-int8 error on the device (--layers error)

    def summary(self) -> dict[str, Any]:
        by_variant = {r["agent"]["variant"]: (r, rid) for r, rid in zip(self.records, self.run_ids)}
        variants: dict[str, dict] = {}
        # the agreement that counts: the device's when it was measured, else the host's estimate
        agreement = self.agreement or (self.quantize.agreement if self.quantize else None)
        for v in self.plan.variants:
            rec, rid = by_variant.get(v.name, (None, None))
            entry: dict[str, Any] = {
                "backend": v.backend,
                "precision": v.precision,
                "size_bytes": self.sizes.get(v.name),
                "p50_ms": rec["stats"]["p50"] if rec else None,
                "p99_ms": rec["stats"]["p99"] if rec else None,
                "mean_ms": rec["stats"]["mean"] if rec else None,
                "peak_rss_bytes": rec["agent"].get("peak_rss_bytes") if rec else None,
                "run_id": rid,
            }
            own = self.agreements.get(v.name, agreement)
            if own is not None:
                entry["accuracy"] = own.accuracy_int8 if v.precision == "int8" else own.accuracy_fp32
            if v.name in self.agreements and v.name != "int8":  # --choose measure's other int8 variants
                entry["agreement"] = self.agreements[v.name].to_dict()
            variants[v.name] = entry
        out: dict[str, Any] = {"variants": variants}
        fp, q = variants.get("fp32"), variants.get("int8")
        if fp and q and fp["p50_ms"] and q["p50_ms"]:
            out["speedup_p50"] = round(fp["p50_ms"] / q["p50_ms"], 3)
            out["int8_faster"] = q["p50_ms"] < fp["p50_ms"]
        if fp and q and fp["size_bytes"] and q["size_bytes"]:
            out["size_ratio"] = round(q["size_bytes"] / fp["size_bytes"], 3)
        if agreement is not None:
            out["agreement"] = agreement.to_dict()
            out["accuracy_fp32"] = agreement.accuracy_fp32
            out["accuracy_int8"] = agreement.accuracy_int8
            out["accuracy_drop"] = agreement.accuracy_drop
        if self.agreement is not None and self.quantize is not None:
            out["agreement_host_estimate"] = self.quantize.agreement.to_dict()
        if self.verdict is not None:
            out["recommended"] = self.verdict.recommended
            out["recommendation"] = self.verdict.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "kind": "edgekit.deploy",
            "model": self.plan.model,
            "target": self.plan.profile,
            "device": self.plan.device,
            "backend": self.plan.backend,
            "precision": self.plan.precision,
            "plan": self.plan.to_dict(),
            "executed_steps": [step_dict(s) for s in self.executed],
            "step_seconds": [round(t, 4) for t in self.seconds],
            "quantize": self.quantize.to_dict() if self.quantize else None,
            "bundle": None if self.bundle is None else {
                "path": str(self.bundle.root),
                "hash": self.bundle.manifest.bundle_hash,
                "files": [f.to_dict() for f in self.bundle.manifest.files],
            },
            "push": self.push.to_dict() if self.push else None,
            "runs": [
                {
                    "id": rid,
                    "variant": r["agent"]["variant"],
                    "backend": r["agent"]["backend"],
                    "precision": r["agent"]["precision"],
                    "stats": r["stats"],
                    "peak_rss_bytes": r["agent"].get("peak_rss_bytes"),
                    "run_uuid": r["run_uuid"],
                    # what the backend told about loading and executing (e.g. OpenVINO's cached load)
                    "backend_info": r["agent"].get("backend_info") or {},
                    "layers": r["agent"].get("layers"),
                    "warnings": measurement_warnings(r["agent"]),  # drift, throttling: why a number is suspect
                    "measured": r["created"],
                    "reused": rid in self.reused,  # an identical earlier measurement, not one made now
                    "lock": r.get("lock"),  # the dead job's lock it broke first, and the processes it ended
                }
                for rid, r in zip(self.run_ids, self.records)
            ],
            "summary": self.summary(),
            "layer_error": self.layer_error,
        }


def execute(
    plan: Plan,
    job: Job | None,
    transport: Transport | None = None,
    events: Events | None = None,
    *,
    facts: dict | None = None,
    bundle: Bundle | None = None,
    lock: Any = None,
    measured: Measured | None = None,
    only: tuple[type, ...] | None = None,
) -> DeployResult:
    """Run each step of ``plan`` in order. ``job``: the loaded model and data (None for a plan of an
    existing ``bundle``); ``transport``: the device, for Push and Bench; ``facts``: the device's;
    ``lock``: the device lock held meanwhile (runs measured after losing it are not stored);
    ``measured``: what the device's steps already did elsewhere (Ansible's engine ran them), taken
    instead of a transport; ``only``: run just the steps of these types (the host's part, say)."""
    walk = _Walk(plan, job, transport, events or Events(), facts, bundle, lock, measured=measured)
    built = measured.built if measured is not None else None
    if built is not None:
        walk.qresult, walk.sizes, walk.bundle = built.quantize, dict(built.sizes), built.bundle
    with tempfile.TemporaryDirectory(prefix="edgekit-deploy-") as tmp:
        walk.tmp = Path(tmp)
        for step in plan.steps:
            if built is not None and isinstance(step, (Quantize, Compile, WriteBundle)):
                continue  # done once for the fleet: ``built`` holds what it made
            if only is not None and not isinstance(step, only):
                continue
            t0 = time.perf_counter()
            _HANDLERS[type(step)](walk, step)
            walk.executed.append(step)
            walk.seconds.append(time.perf_counter() - t0)
    return DeployResult(
        plan, walk.qresult, walk.bundle, walk.push, walk.records, walk.run_ids, walk.sizes, walk.executed, walk.agreement, walk.verdict,
        walk.seconds, walk.reused_ids, walk.agreements, walk.layer_error,
    )


@dataclass
class Measured:
    """A device's side of a plan, run by another engine (Ansible): the push, the agent's documents
    per variant (bench; eval with the outputs it fetched), and the agent's path on the device (it
    is part of a measurement's key). ``execute`` turns them into records as it would its own."""

    push: PushResult
    agent: str
    benches: dict[str, dict] = field(default_factory=dict)  # variant -> the agent's bench document
    evals: dict[str, Path] = field(default_factory=dict)  # variant -> its outputs (.npz), fetched from the device
    built: DeployResult | None = None  # the host's steps (quantize, compile, bundle), run once for a fleet: not run again

    def bench(self, variant: str) -> dict:
        if variant not in self.benches:
            raise AgentError(f"no bench document of variant '{variant}' came back from the device", "run the deploy again")
        return self.benches[variant]

    def outputs(self, variant: str) -> Path:
        if variant not in self.evals:
            raise AgentError(f"no outputs of variant '{variant}' came back from the device", "run the deploy again")
        return self.evals[variant]


def measured_before(plan: Plan, bundle: Bundle, facts: dict | None, agent: str) -> bool:
    """Whether ``execute`` would reuse earlier measurements for every Bench and Eval step of ``plan``
    (so the device need not run them); ``agent``: the agent's path on the device."""
    w = _Walk(plan, None, None, Events(), facts, bundle, measured=Measured(PushResult("", 0, 0, 0, 0.0), agent))
    steps = [s for s in plan.steps if isinstance(s, (Bench, Eval))]
    return bool(steps) and all(s.reuse for s in steps) and _earlier(w, steps[0]) is not None


@dataclass
class _Walk:
    """The state the steps hand each other."""

    plan: Plan
    job: Job | None
    transport: Transport | None
    events: Events
    facts: dict | None
    bundle: Bundle | None
    lock: Any = None
    tmp: Path = Path()
    qresult: QuantizeResult | None = None
    sources: dict[str, Path] = field(default_factory=dict)  # variant name -> the ONNX (or .tflite) it starts from
    files: dict[str, Path] = field(default_factory=dict)  # bundle path -> local file
    variants: list[Variant] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    push: PushResult | None = None
    records: list[dict] = field(default_factory=list)
    run_ids: list[int] = field(default_factory=list)
    executed: list[Any] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # variant -> what the device computed
    agreement: AgreementReport | None = None
    verdict: Verdict | None = None
    found: dict[int, Any] | None = None  # id(step) -> the earlier measurement reused for it (None: not looked yet)
    agreements: dict[str, AgreementReport] = field(default_factory=dict)  # int8 variant -> its agreement on the device
    reused_ids: set[int] = field(default_factory=set)
    rounds: dict[str, list[dict]] = field(default_factory=dict)  # variant -> the agent documents of its rounds so far
    twins: dict[str, Any] = field(default_factory=dict)  # --layers error: the layers, and per variant its twin's bundle path and output order
    layer_error: dict | None = None
    measured: Measured | None = None  # the device's steps as another engine ran them (no transport then)

    def source(self, name: str) -> Path:
        return self.sources.get(name, self.job.model.path)  # unquantized: the model as it is

    def device(self) -> Transport:
        if self.transport is None:
            raise AssertionError("a plan with device steps was executed without a transport")
        return self.transport


def _quantize(w: _Walk, step: Quantize) -> None:
    job = w.job
    calibration, heldout = job.feeds(w.events)
    backend = w.plan.variant(step.variant).backend
    metric, goal, _ = accuracy_goal(job)
    if step.metric is None and metric is not None:
        step = dataclasses.replace(step, metric=metric)
    k = qcache.key(
        job.model.sha256, step.scheme, step.method, job.request.exclude, calibration, heldout, max_drop=step.max_drop, metric=step.metric, threshold=goal,
        backend=backend if step.max_drop is not None else None,  # what it can keep float
    )  # fmt: skip
    result = job.memo.get(("quantize", k), lambda: _quantize_or_reuse(w, step, k, calibration, heldout))
    if step.variant == "int8":  # the plan's own backend; --choose measure's rivals are int8-<backend>
        w.qresult = result
    if result.check is not None and not result.check.passed and job.request.strict:
        raise GateError(
            f"--strict: the {step.variant} model misses its {result.check.metric} threshold "
            f"({result.check.value:.4g}, needs {'<=' if result.check.metric == 'ctc' else '>='} {result.check.threshold:g}); no model written",
            "calibrate on data like the real inputs (--calib, the same preprocessing), try --method percentile or --max-drop, or lower --threshold",
        )
    mp = result.mixed_precision
    if mp and not mp["holds"] and job.request.goal != "quantize":
        why = ""
        if (mp.get("judged") or {}).get("missed"):
            why = f" on the {mp['judged']['samples']} held-out samples it did not search on ({mp['judged']['after']} < {mp['judged']['goal']})"
        elif not mp.get("tried_float_layers") and mp.get("not_candidates"):
            why = f" (no int8 node can stay float on {w.plan.variant(step.variant).backend}: {'; '.join(mp['not_candidates']['why'])})"
        w.events.warn(f"keeping layers in float did not hold the held-out {mp['metric']} within {mp['max_drop']:g} points{why}: the {step.variant} variant stays all int8 (the gate decides)")
    get_backend(w.plan.variant(step.variant).backend).check_quantized(result.model)  # e.g. TensorRT's Q/DQ rules
    w.sources[step.variant] = w.tmp / f"model.{step.variant}.onnx"
    save_model(result.model, w.sources[step.variant])


def _quantize_or_reuse(w: _Walk, step: Quantize, k: str, calibration: FeedSet, heldout: FeedSet) -> QuantizeResult:
    """The cached quantization with this key, else a new one (then cached)."""
    job = w.job
    hit = qcache.load(k)
    if hit is not None:
        model, report, agreement = hit
        w.events.info(f"int8 model of {job.model.path.name} unchanged: reusing the cached quantization ({k[:12]})")
        method = report.get("method", step.method)  # a --max-drop search may have fallen back to dynamic
        scheme = step.scheme
        kept = report.get("scheme") or {}
        if scheme.seven_bit_for_speed and kept.get("weight_qmax") == 127:  # quantize_model fell back to 8-bit weights
            scheme = dataclasses.replace(scheme, weight_qmax=127, depthwise_weight_qmax=None, seven_bit_for_speed=False,
                                         notes=tuple(kept.get("notes") or scheme.notes))
        _, analysis = analyze_model(job.model, scheme, job.request.exclude, method)
        cal = report["calibration"]
        result = QuantizeResult(
            model, scheme, method, analysis, cal["source"], cal["samples"], cal["random"], agreement, report["seconds"], cached=True,
            layers=report.get("layers") or [], mixed_precision=report.get("mixed_precision"),
            smoothing=Smoothing.from_dict(report["smoothed"]) if report.get("smoothed") else None,
            check=Check.from_dict(report["check"]) if report.get("check") else None, int8_mac_share=report.get("int8_mac_share"),
            auto_ranges=report.get("auto_ranges"),
        )
        _warn_check(w, step, result)
        return result
    w.events.info(f"quantizing {job.model.path.name} for {w.plan.backend} ({step.scheme.name} scheme)")
    passes = parse_method(step.method).passes
    what = "quantizing weights (dynamic: activations quantized at run time, nothing calibrated)" if not passes else f"calibrating on {len(calibration.feeds)} samples ({step.method})"
    with w.events.progress(what, total=passes * len(calibration.feeds) or None) as prog:
        result = quantize_model(
            job.model, step.scheme, calibration, heldout, method=step.method, exclude=job.request.exclude, progress=prog, max_drop=step.max_drop, metric=step.metric,
            events=w.events, dynamic_fallback=not get_backend(w.plan.variant(step.variant).backend).no_dynamic,
            runs_float=get_backend(w.plan.variant(step.variant).backend).runs_float, goal=accuracy_goal(job)[1],
            metric_why=accuracy_goal(job)[2],
        )
    path = w.tmp / f"quantized-{k[:12]}.onnx"
    save_model(result.model, path)
    qcache.save(k, path, result.to_dict())
    _warn_check(w, step, result)
    return result


def _warn_check(w: _Walk, step: Quantize, result: QuantizeResult) -> None:
    """The one warning line of an int8 model that misses its threshold (once per quantization)."""
    if result.check is not None and not result.check.passed:
        w.events.warn(("" if step.variant == "int8" else f"{step.variant}: ") + result.check.line())


def accuracy_goal(job: Job) -> tuple[str | None, float | None, str]:
    """The metric and threshold of the int8 model's held-out check, and where the metric came
    from: the request's, else the model's sidecar ([accuracy]; its threshold counts only for its
    metric); None for the metric's default."""
    req, sc = job.request, job.model.sidecar
    metric = req.metric or sc.metric
    goal = req.threshold if req.threshold is not None else (sc.threshold if metric == sc.metric else None)
    why = "--metric" if req.metric else (f"{job.model.path.stem}.edgekit.toml" if sc.metric else "")
    return metric, goal, why


def _compile(w: _Walk, step: Compile) -> None:
    v, model = step.variant, w.job.model
    rel = f"{v.name}/model.{model.format}"
    compiled = get_backend(v.backend).compile(w.source(v.name), w.tmp / v.name)  # None: the device runs the file as it is
    if compiled:
        w.files.update({f"{v.name}/{p.name}": p for p in compiled})
        rel = f"{v.name}/{compiled[0].name}"
    else:
        w.files[rel] = w.source(v.name)
    sample = _sample_file(w)
    if sample is not None:
        w.files[f"{v.name}/inputs.npz"] = sample
    w.variants.append(Variant(v.name, v.backend, v.precision, rel, tuple(model.inputs), tuple(model.outputs), v.options))
    w.sizes[v.name] = sum(p.stat().st_size for p in compiled) if compiled else w.files[rel].stat().st_size


def _sample_file(w: _Walk) -> Path | None:
    """One real held-out sample (when there is real data): what the device times."""
    path = w.tmp / "inputs.npz"
    if not path.exists() and (w.job.calib is not None or w.job.eval is not None):
        _, heldout = w.job.feeds(w.events)
        np.savez(path, **heldout.feeds[0])
    return path if path.exists() else None


def _write_bundle(w: _Walk, step: WriteBundle) -> None:
    job, plan = w.job, w.plan
    w.files.update(get_backend(plan.backend).runtime_files(job.profile, w.facts, w.tmp / "runtime", w.events))
    evals = {s.samples for s in plan.steps if isinstance(s, Eval)}
    if evals:
        _, heldout = job.feeds(w.events)
        path = w.tmp / "eval-samples.npz"
        np.savez(path, **{name: np.concatenate([f[name] for f in heldout.feeds]) for name in heldout.feeds[0]})
        w.files.update({rel: path for rel in evals})
    for le in (s for s in plan.steps if isinstance(s, LayerError)):
        _twins(w, le)
    out = Path(step.output)
    if job.request.output is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    w.bundle = write_bundle(
        out,
        files=w.files,
        model_name=job.model.name,
        model_sha256=job.model.sha256,
        profile=plan.profile,
        backend=plan.backend,
        precision=plan.precision,
        variants=w.variants,
        plan=plan.to_dict(),
        overwrite=True,
    )
    w.events.info(f"bundle written to {w.bundle.root} ({len(w.bundle.manifest.files)} files)")


def _push(w: _Walk, step: Push) -> None:
    if w.measured is not None:
        w.push = w.measured.push
        return
    transport = w.device()
    with w.events.progress(f"pushing bundle {w.bundle.manifest.bundle_hash[:12]} to {transport.name}") as bar:
        w.push = push_bundle(transport, w.bundle, progress=progress_reporter(bar))
    p = w.push
    if p.files_sent:
        w.events.info(f"pushed to {transport.name}: {p.files_sent} file(s) sent ({p.bytes_sent} bytes), {p.files_skipped} unchanged")
    else:
        w.events.info(f"bundle already on {transport.name}: nothing to push")


def _bench(w: _Walk, step: Bench) -> None:
    c, name = step.config, step.variant.name
    if step.round > 1 and any(r["agent"]["variant"] == name for r in w.records):
        return  # reused: a measured variant's record comes only after its last round
    k = _measurement_key(w, step)
    earlier = _earlier(w, step)
    if earlier is not None:
        rid = earlier["id"]  # (the Store step takes it off: the run is in the store already)
        w.records.append(earlier)
        w.reused_ids.add(rid)
        w.events.info(
            f"{name}: same bundle, device and settings as run {rid} (measured {earlier['created'][:19]} UTC): "
            "reusing it (--remeasure to measure again)"
        )
        return
    docs = w.rounds.setdefault(name, [])
    if w.measured is not None:  # one round (Ansible's engine refuses more)
        docs.append(w.measured.bench(name))
        w.records.append(make_record(merge_rounds(docs), model_name=w.plan.model, target=w.plan.profile, device=w.plan.device, extra={reuse.RECORD_FIELD: k}))
        return
    transport = w.device()
    how = bench_window(c) + (f", round {step.round} of {c.rounds}" if c.rounds > 1 else "")
    probe = True
    if docs:  # a later round: what the first one's thread probe chose (one thread, or the default), no second profiled pass
        one = (docs[0].get("threads_probe") or {}).get("chosen") == 1
        c, probe = dataclasses.replace(c, threads=1 if one else c.threads, profile=False), False
    with w.events.progress(f"benchmarking {name} on {transport.name} ({how})"):
        docs.append(bench_variant(transport, w.push.remote_dir, name, c, probe_threads=probe))
    if len(docs) == step.config.rounds:
        doc = merge_rounds(docs)
        w.records.append(make_record(doc, model_name=w.plan.model, target=w.plan.profile, device=w.plan.device, extra={reuse.RECORD_FIELD: k}))


def _eval(w: _Walk, step: Eval) -> None:
    v = step.variant
    k = _measurement_key(w, step)
    local = _earlier(w, step)
    if local is None and w.measured is not None:
        local = w.measured.outputs(v.name)
        reuse.save_outputs(k, local)
    if local is None:
        transport = w.device()
        local = w.tmp / f"{v.name}.outputs.npz"
        with w.events.progress(f"evaluating {v.name} on {transport.name} ({v.backend})"):
            eval_variant(transport, w.push.remote_dir, v.name, step.samples, local, threads=step.threads)
        reuse.save_outputs(k, local)
    with np.load(local, allow_pickle=False) as data:
        w.outputs[v.name] = {k: data[k] for k in data.files}
    if "fp32" not in w.outputs:
        return
    _, heldout = w.job.feeds(w.events)

    def per_sample(name: str) -> dict[str, list[np.ndarray]]:
        return {k: [a[i : i + 1] for i in range(len(a))] for k, a in w.outputs[name].items()}

    fp = w.plan.variant("fp32")
    for name in [n for n in w.outputs if n not in w.agreements and w.plan.variant(n).precision == "int8"]:
        where = f"{w.plan.device}: fp32 on {fp.backend}, {'int8' if name == 'int8' else name} on {w.plan.variant(name).backend}"
        w.agreements[name] = compare(per_sample("fp32"), per_sample(name), heldout.labels, source=heldout.source, measured_on=where, estimate=False)
    w.agreement = w.agreements.get("int8")


def _twins(w: _Walk, step: LayerError) -> None:
    """Each variant's twin with the int8 tensors exposed (``layererror``), compiled by its backend
    into ``<variant>/layers/``, and the few held-out samples they run."""
    fp32, int8 = onnx.load(str(w.source(step.fp32.name))), onnx.load(str(w.source(step.int8.name)))
    layers = layererror.find_layers(fp32, int8)
    w.twins["layers"] = layers
    for v, (twin, order) in ((step.fp32, layererror.fp32_twin(fp32, layers)), (step.int8, layererror.int8_twin(int8, layers))):
        d = w.tmp / f"twin-{v.name}"
        d.mkdir()
        src = d / "model.onnx"
        onnx.save(twin, str(src))
        compiled = get_backend(v.backend).compile(src, d / "out")
        base = f"{v.name}/{layererror.TWIN_DIR}"
        if compiled:
            w.files.update({f"{base}/{p.name}": p for p in compiled})
            w.twins[v.name] = (f"{base}/{compiled[0].name}", order)
        else:
            w.files[f"{base}/model.onnx"] = src
            w.twins[v.name] = (f"{base}/model.onnx", order)
    _, heldout = w.job.feeds(w.events)
    path = w.tmp / "layer-samples.npz"
    few = heldout.feeds[:LAYER_SAMPLES]
    np.savez(path, **{name: np.concatenate([f[name] for f in few]) for name in few[0]})
    w.files[step.samples] = path


def _layer_error(w: _Walk, step: LayerError) -> None:
    """Both twins on the device, then per layer the int8 tensor against the float one."""
    transport, layers = w.device(), w.twins["layers"]
    got, fidelity = {}, {}
    with np.load(w.files[step.samples], allow_pickle=False) as data:
        feeds = {k: data[k] for k in data.files}
    n = len(next(iter(feeds.values())))
    for v in (step.fp32, step.int8):
        rel, order = w.twins[v.name]
        local = w.tmp / f"{v.name}.layers.npz"
        with w.events.progress(f"{v.name} on {transport.name} ({v.backend}) with {len(layers)} int8 tensors exposed, {n} samples"):
            eval_variant(transport, w.push.remote_dir, v.name, step.samples, local, threads=step.threads, model=rel)
        with np.load(local, allow_pickle=False) as data:
            outs = {k: data[k] for k in data.files}
        got[v.name] = layererror.by_layer(outs, order)
        # the twin's own outputs against the plain variant's on the same samples: 0 unless exposing
        # tensors changed how the backend computes (ONNX Runtime does not fuse a Q/DQ group whose tensor is an output)
        plain = w.outputs.get(v.name) or {}
        diffs = [float(np.max(np.abs(outs[f"output{k}"] - plain[o.name][:n]))) for k, o in enumerate(w.job.model.outputs)
                 if f"output{k}" in outs and o.name in plain and plain[o.name][:n].shape == outs[f"output{k}"].shape]  # fmt: skip
        fidelity[v.name] = max(diffs) if diffs else None
    for name, value in feeds.items():  # a quantized graph input: the float side is the input itself
        got[step.fp32.name].setdefault(name, value)
    times = {r["agent"]["variant"]: r["agent"].get("layers") for r in w.records if r["agent"]["variant"] in (step.fp32.name, step.int8.name)}
    rows = layererror.compare_layers(layers, got[step.fp32.name], got[step.int8.name], times)
    w.layer_error = {
        "measured_on": w.plan.device,
        "samples": n,
        "variants": {v.name: {"backend": v.backend, "twin": w.twins[v.name][0], "outputs_max_abs_diff_vs_plain": fidelity[v.name]} for v in (step.fp32, step.int8)},
        "worst": [r["tensor"] for r in layererror.worst(rows)],
        "layers": rows,
    }


def _measurement_key(w: _Walk, step: Bench | Eval) -> str:
    if isinstance(step, Bench):
        settings = {"config": dataclasses.asdict(step.config), "device_steps": [s.name for s in step.device_steps]}
    else:
        settings = {"samples": step.samples, "threads": step.threads}
    return reuse.key(
        step.name, bundle_hash=w.bundle.manifest.bundle_hash, variant=step.variant.to_dict(), settings=settings, device=w.plan.device,
        facts=w.facts, agent=w.measured.agent if w.measured is not None else agent_path(w.device()),
    )  # fmt: skip


def _earlier(w: _Walk, step: Bench | Eval) -> Any:
    """What stands in for measuring ``step``: a stored run (Bench) or cached outputs (Eval); None: measure.
    Decided once per plan, all or nothing: a fresh fp32 run beside last week's int8 run would
    compare two moments of the device, not two variants."""
    if not step.reuse:
        return None
    if w.found is None:
        found: dict[int, Any] = {}
        p = w.plan
        for s in p.steps:
            if not isinstance(s, (Bench, Eval)) or not s.reuse or (isinstance(s, Bench) and s.round > 1):
                continue
            k = _measurement_key(w, s)
            hit = reuse.find_run(k, model=p.model, target=p.profile, device=p.device, variant=s.variant.name) if isinstance(s, Bench) else reuse.outputs_path(k)
            if hit is None:
                found = {}
                break
            found[id(s)] = hit
        w.found = found
    return w.found.pop(id(step), None)


def _gate(w: _Walk, step: Gate) -> None:
    runs = {r["agent"]["variant"]: r["agent"] for r in w.records}
    if "fp32" not in runs or "int8" not in runs:
        return

    def verdict(name: str, agreement: Any) -> Verdict:
        fp32, run = runs["fp32"], runs[name]
        a, b = round_p50s_ns(fp32), round_p50s_ns(run)
        rounds = tuple(x / y for x, y in zip(a, b)) if len(a) == len(b) > 1 else ()
        return int8_verdict("fp32", fp32["samples_ns"], run["samples_ns"], agreement.to_dict() if agreement else None, step.max_drop, machine_shift(fp32, run), rounds,
                            contended=(contention_note(fp32), contention_note(run)))  # fmt: skip

    w.verdict = verdict("int8", w.agreement or (w.qresult.agreement if w.qresult else None))  # the device's, else the host's estimate
    if len(step.candidates) > 1:
        verdicts = {"int8": w.verdict}
        for name in step.candidates[1:]:
            if name in runs:
                verdicts[name] = verdict(name, w.agreements.get(name))
        w.verdict = choose_fastest(verdicts, {n: w.plan.variant(n).backend for n in verdicts})


def _store(w: _Walk, step: Store) -> None:
    if all("id" in r for r in w.records):  # every run reused: each is in the store already, as it was measured
        w.run_ids = [r.pop("id") for r in w.records]
        return
    if w.lock is not None:
        w.lock.ensure_held()  # runs measured while another job had the board are worthless
    vcs = vcs_info()  # the branch the runs belong to: `latest@BRANCH` baselines find them by it
    broke = w.lock.record() if w.lock is not None and hasattr(w.lock, "record") else None
    for r in w.records:
        if broke and "id" not in r:  # measured after breaking a dead job's lock (and ending its processes)
            r["lock"] = broke  # each int8 run carries how it compared with float on this device
        if r["agent"]["variant"] in w.agreements:
            r["agreement"] = w.agreements[r["agent"]["variant"]].to_dict()
        if r["agent"]["variant"] == "int8" and w.verdict is not None:
            r["recommendation"] = w.verdict.to_dict()
        if r["agent"]["variant"] == "int8" and w.layer_error is not None:
            r["layer_error"] = w.layer_error  # measured on the device, per layer
        if r["agent"]["variant"] == "int8" and w.qresult is not None and w.qresult.layers:
            r["quantization"] = w.qresult.quantization_record()  # each int8 node's local error
        r.setdefault("vcs", dict(vcs))
    with ResultsStore() as store:
        w.run_ids = [r.pop("id") if "id" in r else store.add(r) for r in w.records]


_HANDLERS = {
    Quantize: _quantize, Compile: _compile, WriteBundle: _write_bundle, Push: _push, Bench: _bench, Eval: _eval, LayerError: _layer_error,
    Gate: _gate, Store: _store,
}  # fmt: skip


def _load_feeds(job: Job, events: Events) -> tuple[FeedSet, FeedSet]:
    """Calibration and held-out sets; random data only with a loud warning."""
    inputs, pre = job.model.inputs, job.request.preprocess
    if job.calib is None:
        events.warn(
            f"no calibration data: calibrating on {RANDOM_SAMPLES} RANDOM samples. The int8 ranges and the "
            "agreement figures below are not representative of real inputs; give --calib DATA "
            "(a .npz/.npy, a folder of .npz, or a folder of images with --preprocess)"
        )
        calibration = random_feeds(inputs, RANDOM_SAMPLES, seed=0)
    else:  # with held-out data of its own, only the samples calibration uses are read
        calibration = load_feeds(job.calib, inputs, preprocess=pre, samples=job.request.calib_samples if job.eval is not None else None)
    if job.eval is not None:
        heldout = load_feeds(job.eval, inputs, preprocess=pre, labels=job.labels)
    elif not calibration.random and len(calibration.feeds) > 1:
        calibration, heldout = calibration.split(HELD_OUT_FRACTION)
    else:
        heldout = random_feeds(inputs, max(4, RANDOM_SAMPLES // 4), seed=1)
    n = job.request.calib_samples
    if n is not None and len(calibration.feeds) > n:
        calibration = dataclasses.replace(calibration, feeds=spread(calibration.feeds, n))
    return calibration, heldout


__all__ = ["DeployRequest", "DeployResult", "Job", "Measured", "execute", "measured_before", "open_job", "run"]
