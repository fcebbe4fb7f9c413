"""The planner: the one place that decides. ``deploy.execute`` walks what it decided.

``make_plan(model, profile, ...)`` picks the backend (the first in the profile's order that
supports the model on that device, and why the others were skipped), the precision, the
quantization scheme, which nodes stay float and why, the variants (backend, precision and
runtime options of each), the bench configuration, and the typed steps a deploy runs.
``replan(plan, model, profile, facts)`` decides again with the probed device's facts.
``plan_bundle`` is the plan of an existing bundle (push, bench, store). ``quantize``,
``plan``, ``bench`` and ``deploy`` are the same plan truncated (``goal``) or derived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edgekit.agentclient import BenchConfig
from edgekit.errors import PlanError, ProfileError, UsageError
from edgekit.jsonable import FieldsDict
from edgekit.modelio import IOSpec, LoadedModel
from edgekit.profiles import CpuSpec, Profile, resolve
from edgekit.profiles.model import BenchDefaults
from edgekit.profiles.probe import normalize_arch
from edgekit.quantize import analyze_model
from edgekit.quantize.calib import DEFAULT_METHOD, DYNAMIC, is_dynamic
from edgekit.quantize.rewrite import NodeDecision
from edgekit.quantize.scheme import QuantScheme
from edgekit.targets import KNOWN_BACKENDS, available_backends, get_backend
from edgekit.targets.base import DeviceStep

PLAN_SCHEMA = 2
GOALS = ("quantize", "bundle", "deploy")  # how far a plan goes: stop after quantize, after the bundle, or run it all
CHOICES = ("plan", "measure")  # --choose: the planner's first feasible backend, or the fastest measured on the device
EVAL_SAMPLES = "eval/samples.npz"  # the held-out inputs, in the bundle
LAYER_SAMPLES = 4  # held-out samples the twins of --layers error run: a few are enough to rank layers
LAYER_SAMPLES_FILE = "eval/layer-samples.npz"


@dataclass(frozen=True)
class VariantPlan(FieldsDict):
    """One runnable model of the bundle: its name, the backend that runs it, its options."""

    name: str  # "fp32", "int8", "fp16"
    backend: str
    precision: str
    options: dict[str, Any] = field(default_factory=dict)  # what the agent passes to the runtime


# -- the steps: typed, frozen, executed by deploy.execute in this order ---------------------


@dataclass(frozen=True)
class Quantize:
    scheme: QuantScheme
    method: str
    calibration: str
    evaluation: str
    max_drop: float | None = None  # mixed precision: held-out metric points int8 may lose (None: all int8)
    metric: str | None = None  # its metric (None: top1 for class vectors, else cosine)
    variant: str = "int8"  # the variant this int8 model is for (--choose measure quantizes per candidate backend)

    name = "quantize"

    @property
    def detail(self) -> str:
        mixed = f"; layers kept float while the held-out {self.metric or 'metric'} drops more than {self.max_drop:g} points" if self.max_drop is not None else ""
        which = f"{self.variant}: " if self.variant != "int8" else ""
        if is_dynamic(self.method):
            mixed = f"; refused if the held-out {self.metric or 'metric'} drops more than {self.max_drop:g} points" if self.max_drop is not None else ""
            return f"{which}int8 weights, activations quantized at run time ({self.scheme.name} scheme, --method dynamic: nothing calibrated); agreement on {self.evaluation or 'held-out samples'}{mixed}"
        return (
            f"{which}QDQ int8 ({self.scheme.name} scheme, {self.method} calibration on {self.calibration}); "
            f"agreement on {self.evaluation or 'held-out samples'}{mixed}"
        )


@dataclass(frozen=True)
class Compile:
    variant: VariantPlan

    name = "compile"

    @property
    def detail(self) -> str:
        v = self.variant
        return f"{v.name} variant for {v.backend}"


@dataclass(frozen=True)
class WriteBundle:
    output: str
    variants: tuple[str, ...]

    name = "bundle"

    @property
    def detail(self) -> str:
        return f"{', '.join(self.variants)} model(s) + manifest -> {self.output}"


@dataclass(frozen=True)
class Push:
    device: str

    name = "push"

    @property
    def detail(self) -> str:
        return f"to {self.device} (content-addressed: unchanged files are not sent)"


@dataclass(frozen=True)
class Bench:
    variant: VariantPlan
    config: BenchConfig
    device_steps: tuple[DeviceStep, ...] = ()  # done by the agent before timing (e.g. an engine build)
    reuse: bool = False  # an identical earlier measurement (same bundle, device, settings) stands in for a new one
    round: int = 1  # which of config.rounds agent processes this is (the host merges them after the last)

    name = "bench"

    @property
    def detail(self) -> str:
        c, v = self.config, self.variant
        how = bench_window(c)
        if self.round > 1:
            return f"{v.name} on {v.backend}, round {self.round} of {c.rounds}: another agent process, {c.warmup} warm-up + {how}, the threads round 1 chose"
        first = f" after {', '.join(s.name for s in self.device_steps)} on the device" if self.device_steps else ""
        layers = ", then a profiled pass for per-layer times" if c.profile else ""
        rounds = f" (round 1 of {c.rounds}; the samples of all rounds are merged)" if c.rounds > 1 else ""
        return f"{v.name} on {v.backend}{first}: {c.warmup} warm-up + {how}, threads={c.threads or '1 or all, probed'}{layers}{rounds}{_REUSE if self.reuse else ''}"


@dataclass(frozen=True)
class Eval:
    variant: VariantPlan
    samples: str  # the bundle's held-out inputs
    threads: int | None = None
    reuse: bool = False  # as Bench.reuse

    name = "eval"

    @property
    def detail(self) -> str:
        return f"{self.variant.name} on {self.variant.backend}: every held-out sample, outputs back to the host for the agreement{_REUSE if self.reuse else ''}"


@dataclass(frozen=True)
class LayerError:
    fp32: VariantPlan
    int8: VariantPlan
    samples: str  # the bundle's few held-out inputs the twins run
    threads: int | None = None

    name = "layers"

    @property
    def detail(self) -> str:
        return (
            f"{self.fp32.name} on {self.fp32.backend} and {self.int8.name} on {self.int8.backend} again, each with every int8 tensor "
            f"as an output, on {LAYER_SAMPLES} held-out samples: per-layer SNR/cosine as the device computed them, beside each layer's time"
        )


# what a reusing Bench/Eval says it may do instead of measuring
_REUSE = " (or reused: the identical earlier measurement of this bundle on this device)"


@dataclass(frozen=True)
class Gate:
    max_drop: float  # accuracy points (a fraction) int8 may lose against labels
    require_int8: bool
    candidates: tuple[str, ...] = ("int8",)  # the int8 variants it weighs (--choose measure: one per backend)

    name = "gate"

    @property
    def detail(self) -> str:
        acc = f"accuracy drop <= {self.max_drop * 100:g} points (or top-1/cosine agreement >= 0.99 without labels)"
        then = "; fail (exit 5) otherwise (--require-int8)" if self.require_int8 else ""
        which = f"; of {', '.join(self.candidates)}, the fastest that passes" if len(self.candidates) > 1 else ""
        return f"recommend int8 only if faster than float on the device beyond the noise and {acc}{which}{then}"


@dataclass(frozen=True)
class Store:
    name = "store"

    @property
    def detail(self) -> str:
        return "results into the local results database (edgekit results list)"


Step = Quantize | Compile | WriteBundle | Push | Bench | Eval | LayerError | Gate | Store


def step_dict(step: Step) -> dict[str, Any]:
    """A step as JSON: its name, a one-line detail, and its typed fields."""
    doc: dict[str, Any] = {"name": step.name, "detail": step.detail}
    if isinstance(step, (Compile, Bench, Eval)):
        doc["variant"] = step.variant.to_dict()
    if isinstance(step, LayerError):
        doc["variants"] = [step.fp32.to_dict(), step.int8.to_dict()]
    if isinstance(step, Bench):
        doc["config"] = asdict(step.config)
        doc["device_steps"] = [{"name": s.name, "detail": s.detail} for s in step.device_steps]
        doc["round"] = step.round
    if isinstance(step, (Bench, Eval)):
        doc["reuse"] = step.reuse
    return doc


# -- the plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What the caller asked for; the plan keeps it so ``replan`` decides from the same asks."""

    device: str = "local"
    backend: str | None = None
    quantize: bool = True
    method: str = DEFAULT_METHOD
    exclude: tuple[str, ...] = ()
    calibration: str = "random"  # where calibration data comes from ("random" when none was given)
    evaluation: str = ""
    goal: str = "deploy"
    warmup: int | None = None
    iterations: int | None = None
    duration_s: float | None = None
    min_time_s: float | None = None
    threads: int | None = None
    rounds: int | None = None  # agent processes per variant (None: the profile's)
    layers: bool = True  # per-layer times (a separate profiled pass)
    layer_error: bool = False  # per-layer fp32-vs-int8 error on the device (--layers error)
    output: str = ""
    max_drop: float = 0.01  # the int8 gate: accuracy points (a fraction) int8 may lose
    require_int8: bool = False  # the int8 gate failing is an error (exit 5)
    remeasure: bool = False  # measure even when the same bundle was measured on the same device with the same settings
    choose: str = "plan"  # "measure": bench the int8 variant on every backend of the profile that can run it, keep the fastest


@dataclass(frozen=True)
class Plan:
    model: str
    model_path: str
    model_sha256: str
    model_format: str
    inputs: tuple[IOSpec, ...]
    profile: str
    profile_description: str
    device: str
    backend: str
    precision: str
    scheme: QuantScheme | None
    method: str
    calibration: str
    evaluation: str
    node_counts: dict[str, int]
    float_nodes: tuple[NodeDecision, ...]
    skipped: tuple[tuple[str, str], ...]  # (backend, why it was not chosen)
    notes: tuple[str, ...]
    variants: tuple[VariantPlan, ...]
    steps: tuple[Step, ...]
    options: Options
    probed: bool = False  # True: decided with the device's facts; False: on paper
    coverage: dict[str, dict] = field(default_factory=dict)  # backend -> its nodes by how it runs them

    @property
    def quantize(self) -> bool:
        return self.scheme is not None

    def variant(self, name: str) -> VariantPlan:
        return next(v for v in self.variants if v.name == name)

    @property
    def needs_device(self) -> bool:
        return any(isinstance(s, (Push, Bench)) for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": PLAN_SCHEMA,
            "model": self.model,
            "model_path": self.model_path,
            "model_sha256": self.model_sha256,
            "model_format": self.model_format,
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in self.inputs],
            "profile": self.profile,
            "profile_description": self.profile_description,
            "device": self.device,
            "backend": self.backend,
            "precision": self.precision,
            "quantize": self.quantize,
            "scheme": self.scheme.to_dict() if self.scheme else None,
            "method": self.method,
            "calibration": self.calibration,
            "evaluation": self.evaluation,
            "nodes": self.node_counts,
            "float_nodes": [d.to_dict() for d in self.float_nodes],
            "skipped_backends": [{"backend": b, "reason": r} for b, r in self.skipped],
            "notes": list(self.notes),
            "variants": [v.to_dict() for v in self.variants],
            "steps": [step_dict(s) for s in self.steps],
            "probed": self.probed,
            "coverage": self.coverage,
        }


def _no_dynamic(name: str, quantize: bool, method: str) -> str:
    """Why backend ``name`` cannot run the model ``method`` makes ("" when it can, or runs float only)."""
    impl = get_backend(name)
    return impl.no_dynamic if quantize and impl.scheme is not None and is_dynamic(method) else ""


def choose_backend(
    model: LoadedModel, profile: Profile, forced: str | None, facts: dict | None = None, quantize: bool = True, method: str = DEFAULT_METHOD
) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The backend that runs ``model`` on ``profile``'s device, the ones skipped (and why), notes."""
    skipped: list[tuple[str, str]] = []
    notes: list[str] = []
    if forced:
        if forced not in KNOWN_BACKENDS:
            raise UsageError(f"unknown backend '{forced}'", f"choose one of: {', '.join(KNOWN_BACKENDS)}")
        why = _no_dynamic(forced, quantize, method)
        if why:
            raise PlanError(f"--backend {forced} cannot run --method {DYNAMIC}: {why}", f"drop --backend, or quantize {forced} with a static --method (e.g. auto)")
        verdict = get_backend(forced).supports(model, profile, facts)
        if not verdict.ok:
            raise PlanError(
                f"--backend {forced} cannot run this model on {profile.name}: {'; '.join(verdict.reasons)}",
                f"available backends: {', '.join(available_backends())}",
            )
        if profile.backend(forced) is None:
            notes.append(f"backend {forced} forced with --backend; the {profile.name} profile does not list it")
        notes.extend(verdict.reasons)
        return forced, skipped, notes
    for spec in profile.backends:
        if not quantize and spec.precisions and set(spec.precisions) == {"int8"}:
            skipped.append((spec.name, "it runs int8 only, and quantization is off"))
            continue
        why = _no_dynamic(spec.name, quantize, method)
        if why:
            skipped.append((spec.name, f"--method {DYNAMIC}: {why}"))
            notes.append(f"not {spec.name}: --method {DYNAMIC}: {why}")
            continue
        verdict = get_backend(spec.name).supports(model, profile, facts)
        if verdict.ok:
            notes.extend(verdict.reasons)
            return spec.name, skipped, notes
        skipped.append((spec.name, "; ".join(verdict.reasons)))
    if model.format != "onnx":
        # A model in another format runs on the one backend that reads it, listed or not.
        for name in available_backends():
            if profile.backend(name) is None and model.format in get_backend(name).formats:
                verdict = get_backend(name).supports(model, profile, facts)
                if verdict.ok:
                    notes.append(f"the {profile.name} profile lists no backend for {model.format} models: using {name}, which runs them")
                    notes.extend(verdict.reasons)
                    return name, skipped, notes
                skipped.append((name, "; ".join(verdict.reasons)))
    raise PlanError(
        f"no backend of profile {profile.name} can run this model: "
        + "; ".join(f"{b}: {r}" for b, r in skipped),
        f"force one with --backend (available: {', '.join(available_backends())}) or pick another --target",
    )


def bench_config(defaults: BenchDefaults, asks: Any) -> BenchConfig:
    """The bench settings: what was asked for (``asks``: an ``Options`` or a ``DeployRequest``, read
    by field name), else the profile's. The profile's count is a minimum that its ``min_time``
    extends (a model of microseconds is then timed for a second, not for a few ms); a count asked
    for is run exactly, unless a minimum time is asked for too."""
    if asks.duration_s is not None:
        min_time = 0.0
    elif asks.min_time_s is not None:
        min_time = float(asks.min_time_s)
    else:
        min_time = defaults.min_time_s if asks.iterations is None else 0.0
    return BenchConfig(
        warmup=defaults.warmup if asks.warmup is None else asks.warmup,  # profile default: "auto"
        iterations=defaults.iterations if asks.iterations is None else asks.iterations,
        duration_s=asks.duration_s,
        min_time_s=min_time,
        threads=defaults.threads if asks.threads is None else asks.threads,
        profile=asks.layers,
        rounds=defaults.rounds if asks.rounds is None else asks.rounds,
    )


def bench_window(c: BenchConfig) -> str:
    """How long the timed runs go on, in words: "2 s", "100 timed runs", "100 timed runs and at least 1 s"."""
    if c.duration_s is not None:
        return f"{c.duration_s:g} s"
    return f"{c.iterations} timed runs" + (f" and at least {c.min_time_s:g} s" if c.min_time_s > 0 else "")


def bench_steps(variants: Sequence[VariantPlan], config: BenchConfig, profile: Profile, *, reuse: bool = False) -> list[Bench]:
    """A Bench step per variant and round. The variants alternate round by round (fp32, int8, fp32,
    int8...), so that a stretch of the device running slow falls on each of them alike."""
    steps = []
    for r in range(1, config.rounds + 1):
        for v in variants:
            runner = get_backend(v.backend)
            first = tuple(runner.device_steps(profile.backend(runner.name), v.precision)) if r == 1 else ()
            steps.append(Bench(v, config, first, reuse=reuse, round=r))
    return steps


def make_plan(model: LoadedModel, profile: Profile, *, facts: dict | None = None, **asks: Any) -> Plan:
    """Decide backend, precision, scheme, variants, bench config and steps.

    ``asks``: the fields of ``Options`` (device, backend, quantize, method, exclude,
    calibration, evaluation, goal, warmup, iterations, duration_s, min_time_s, threads, layers, output, max_drop,
    require_int8, remeasure, choose);
    ``facts``: the probed device's, or None (planned on paper).

    >>> plan = make_plan(load_model("examples/digits/digits_cnn.onnx"), load_profile("rpi5"))  # doctest: +SKIP
    >>> plan.backend, [s.name for s in plan.steps]  # doctest: +SKIP
    ('native', ['quantize', 'compile', 'compile', 'bundle', 'push', 'bench', 'bench', 'store'])
    """
    try:
        options = Options(**asks)
    except TypeError as exc:
        raise UsageError(f"make_plan: {exc}", f"known options: {', '.join(Options.__dataclass_fields__)}") from None
    if options.goal not in GOALS:
        raise UsageError(f"unknown plan goal '{options.goal}'", f"choose one of: {', '.join(GOALS)}")
    if options.choose not in CHOICES:
        raise UsageError(f"unknown --choose '{options.choose}'", f"choose one of: {', '.join(CHOICES)}")
    if options.choose == "measure" and options.backend:
        raise UsageError("--choose measure weighs the profile's backends, and --backend forces one", "drop one of them")
    name, skipped, notes = choose_backend(model, profile, options.backend, facts, options.quantize, options.method)
    impl = get_backend(name)
    spec = profile.backend(name)
    precisions = spec.precisions if spec else (("int8", "fp32") if impl.scheme else ("fp32",))
    if spec and spec.notes:
        notes.append(f"{name} on {profile.name}: {spec.notes}")
    if model.format != "onnx":
        # Not ONNX (a .tflite): it runs as it is, at the precision it was built with.
        precision = model.precision
        notes.append(f"a {model.format} model runs as it is ({precision}); edgekit quantizes ONNX models only")
    elif options.quantize and "int8" in precisions and impl.scheme is not None:
        precision = "int8"
    else:
        precision = next((p for p in precisions if p != "int8"), "fp32")
        if options.quantize and "int8" not in precisions:
            notes.append(f"{name} on {profile.name} has no int8 path: running {precision}")
    scheme = impl.quant_scheme(profile) if precision == "int8" and model.format == "onnx" else None
    if scheme is not None and scheme.weight_qmax < 127:
        notes.append(f"{name} on this CPU: {scheme.notes[-1]}")
    counts: dict[str, int] = {}
    float_nodes: tuple[NodeDecision, ...] = ()
    coverage = {}
    if options.quantize and model.format == "onnx":  # each listed backend that can say, chosen or not
        for b in dict.fromkeys([name, *(s.name for s in profile.backends)]):
            cov = get_backend(b).coverage(model)
            if cov is not None:
                coverage[b] = cov
    if scheme is not None:
        prepared, analysis = analyze_model(model, scheme, options.exclude, options.method)
        counts = analysis.summary()
        float_nodes = tuple(analysis.float_nodes)
        notes.extend(impl.check_plan(prepared, analysis))
        if options.calibration == "random" and not is_dynamic(options.method):
            notes.append("no calibration data: int8 ranges will come from random inputs (give --calib)")

    # Unquantized, the model is one variant named after the precision the device runs it at
    # (fp16 on a Myriad VPU, int8 for an int8 .tflite); quantized, the float model is the reference.
    names = ("fp32", "int8") if scheme is not None else (precision,)
    variants = []
    for vname in names:
        runner = get_backend(impl.variant_backend(vname, facts))  # native leaves fp32 to ORT or numpy
        variants.append(VariantPlan(vname, runner.name, vname, runner.variant_options(profile.backend(runner.name), vname)))
    config = bench_config(profile.bench, options)

    rivals: list[tuple[VariantPlan, QuantScheme]] = []  # --choose measure: int8 on the profile's other backends
    if options.choose == "measure" and scheme is not None and options.goal == "deploy":
        rivals, why_not = _rivals(model, profile, name, facts, options.method)
        notes.extend(why_not)
        variants += [v for v, _ in rivals]
        if not rivals:
            notes.append(f"--choose measure: no other backend of {profile.name} can run int8 here; measuring {name} alone")
    steps: list[Step] = []
    if scheme is not None:
        # deploy keeps float the layers that push the host's estimate beyond its int8 gate (not on random data: its ranges say nothing)
        mixed = options.max_drop * 100 if options.goal != "quantize" and options.calibration != "random" else None
        steps.append(Quantize(scheme, options.method, options.calibration, options.evaluation, mixed))
        steps += [Quantize(sch, options.method, options.calibration, options.evaluation, mixed, variant=v.name) for v, sch in rivals]
    if options.goal != "quantize":
        steps += [Compile(v) for v in variants]
        steps.append(WriteBundle(options.output or "edgekit-out/", tuple(v.name for v in variants)))
    if options.goal == "deploy":
        steps.append(Push(options.device))
        steps += bench_steps(variants, config, profile, reuse=not options.remeasure)
        if scheme is not None:
            # the agreement that counts: each variant run on the device by the backend that ships it
            blind = [v.backend for v in variants if not get_backend(v.backend).evaluates]
            if blind:
                notes.append(f"{', '.join(sorted(set(blind)))} gives no per-sample outputs on the device: the int8 gate uses the host's estimate of the agreement")
                if options.layer_error:
                    notes.append("--layers error: no per-layer error, for the same reason")
            else:
                steps += [Eval(v, EVAL_SAMPLES, config.threads, reuse=not options.remeasure) for v in variants]
                if options.layer_error:
                    steps.append(LayerError(variants[0], variants[1], LAYER_SAMPLES_FILE, config.threads))
            steps.append(Gate(options.max_drop, options.require_int8, ("int8", *(v.name for v, _ in rivals))))
        steps.append(Store())
        if options.layer_error and scheme is None:
            notes.append(f"--layers error compares int8 with fp32 layer by layer, and {name} on {profile.name} runs {precision} only: per-layer times only")
    elif options.require_int8:
        raise UsageError("--require-int8 needs the device: the gate compares int8 with float there", "drop --no-bench (or --require-int8)")
    if options.require_int8 and scheme is None:
        raise PlanError(f"--require-int8, but {name} on {profile.name} runs {precision}: there is no int8 variant to gate", "drop --require-int8, or pick a target (or --backend) with an int8 path")
    return Plan(
        model=model.name,
        model_path=str(model.path),
        model_sha256=model.sha256,
        model_format=model.format,
        inputs=tuple(model.inputs),
        profile=profile.name,
        profile_description=profile.description,
        device=options.device,
        backend=name,
        precision=precision,
        scheme=scheme,
        method=options.method,
        calibration=options.calibration,
        evaluation=options.evaluation,
        node_counts=counts,
        float_nodes=float_nodes,
        skipped=tuple(skipped),
        notes=tuple(notes),
        variants=tuple(variants),
        steps=tuple(steps),
        options=options,
        probed=facts is not None,
        coverage=coverage,
    )


def _rivals(
    model: LoadedModel, profile: Profile, chosen: str, facts: dict | None, method: str = DEFAULT_METHOD
) -> tuple[list[tuple[VariantPlan, QuantScheme]], list[str]]:
    """The int8 variants (``int8-<backend>``) of the profile's other backends that can run ``model``
    on the device, each with its own scheme; and why the others cannot."""
    found, notes = [], []
    for spec in profile.backends:
        impl = get_backend(spec.name)
        if spec.name == chosen or impl.scheme is None or (spec.precisions and "int8" not in spec.precisions):
            continue
        if _no_dynamic(spec.name, True, method):
            notes.append(f"--choose measure: not {spec.name}: {impl.no_dynamic}")
            continue
        verdict = impl.supports(model, profile, facts)
        if not verdict.ok:
            notes.append(f"--choose measure: not {spec.name}: {'; '.join(verdict.reasons)}")
            continue
        found.append((VariantPlan(f"int8-{spec.name}", spec.name, "int8", impl.variant_options(spec, "int8")), impl.quant_scheme(profile)))
    return found, notes


def replan(plan: Plan, model: LoadedModel, profile: Profile, facts: dict) -> Plan:
    """The same asks decided again with the probed device's facts (its CPU, its runtimes). Where
    the facts contradict the profile, the plan follows the facts and its notes say so."""
    fitted, notes = follow_facts(profile, facts)
    decided = make_plan(model, fitted, facts=facts, **vars(plan.options))
    if decided.backend != plan.backend and not plan.probed:
        why = next((r for b, r in decided.skipped if b == plan.backend), "")
        notes.append(f"on paper {plan.backend}; the device says otherwise{f' ({why})' if why else ''}: running {decided.backend}")
    return replace(decided, notes=(*notes, *decided.notes))


def follow_facts(profile: Profile, facts: dict | None) -> tuple[Profile, list[str]]:
    """``profile`` with the probed device's CPU (ISA features, cores, model) in place of the one it
    describes, and a note for each contradiction. A probe profile takes the facts silently: it
    promises nothing. A device of another architecture is preflight's failure, not a plan's."""
    cpu = cpu_from_facts(facts)
    if cpu is None:
        return profile, []
    if profile.probe or not profile.cpu.arch:
        return resolve(profile, cpu=cpu), []
    try:
        if normalize_arch(cpu.arch) != profile.cpu.arch:
            return profile, []
    except ProfileError:
        return profile, []
    said = profile.cpu
    differs = []
    extra = [f for f in cpu.isa if f not in said.isa]
    lacks = [f for f in said.isa if f not in cpu.isa]
    if extra:
        differs.append(f"it has {' '.join(extra)} beyond the profile's {' '.join(said.isa) or 'baseline'}")
    if lacks:
        differs.append(f"it lacks {' '.join(lacks)}, which the profile lists")
    if cpu.cores and said.cores and cpu.cores != said.cores:
        differs.append(f"{cpu.cores} cores, not {said.cores}")
    fitted = replace(profile, cpu=CpuSpec(arch=said.arch, core=cpu.core or said.core, isa=cpu.isa, cores=cpu.cores or said.cores))
    if not differs:
        return fitted, []
    return fitted, [f"the device's CPU ({cpu.core or 'unknown model'}) differs from profile {profile.name}'s: {'; '.join(differs)}; planned with the device's facts"]


def cpu_from_facts(facts: dict | None) -> CpuSpec | None:
    """The CPU facts of a probed device in the profiles' vocabulary (None: not probed)."""
    d = (facts or {}).get("device") or {}
    if not d.get("arch"):
        return None
    return CpuSpec(arch=d["arch"], core=d.get("cpu_model"), isa=tuple(d.get("isa") or ()), cores=d.get("cores"))


def plan_bundle(manifest: Any, profile: Profile, *, device: str, variants: list[str], config: BenchConfig) -> Plan:
    """The plan of bundle that exists already: push it, bench ``variants``, store the runs."""
    chosen = tuple(VariantPlan(v.name, v.backend, v.precision, dict(v.options)) for v in manifest.variants if v.name in variants)
    steps: list[Step] = [Push(device), *bench_steps(chosen, config, profile), Store()]
    recorded = manifest.plan or {}
    return Plan(
        model=manifest.model_name,
        model_path=str(recorded.get("model_path", "")),
        model_sha256=manifest.model_sha256,
        model_format=str(recorded.get("model_format", "onnx")),
        inputs=(),
        profile=profile.name,
        profile_description=profile.description,
        device=device,
        backend=manifest.backend,
        precision=manifest.precision,
        scheme=None,
        method=str(recorded.get("method", "")),
        calibration=str(recorded.get("calibration", "")),
        evaluation=str(recorded.get("evaluation", "")),
        node_counts=dict(recorded.get("nodes") or {}),
        float_nodes=(),
        skipped=(),
        notes=(),
        variants=chosen,
        steps=tuple(steps),
        options=Options(device=device, backend=manifest.backend),
    )
