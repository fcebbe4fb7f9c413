"""edgekit's Python API: what the CLI does, as functions with typed keyword arguments in the CLI's units.

>>> from edgekit import api as ek
>>> plan = ek.plan("examples/digits/digits_cnn.onnx", target="rpi5")  # doctest: +SKIP
>>> result = ek.deploy("examples/digits/digits_cnn.onnx", target="local", iterations=200)  # doctest: +SKIP
>>> result.summary()["speedup_p50"]  # doctest: +SKIP

Every function takes the model (or bundle) path first and keyword-only options after, named and
measured as the CLI's flags are: ``max_drop`` is accuracy POINTS like ``--max-drop`` (1 = one
point), ``duration_s`` / ``min_time_s`` / ``lock_wait`` are seconds, ``warmup`` a count or
"auto". A bad value raises ``edgekit.errors.UsageError`` before any work starts, with the CLI's
words (the checks live once, in ``edgekit.validate``). ``events`` (an ``edgekit.events.Events``)
receives progress and warnings; by default the library is silent. Errors are
``edgekit.errors.EdgekitError`` subclasses with ``message`` and ``hint``. docs/api.md has the
whole shape.

(The functions live here, not on the package root, because ``edgekit.quantize``,
``edgekit.plan``, ``edgekit.deploy`` and ``edgekit.bench`` are the modules that implement them.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from edgekit import validate
from edgekit.bench.gates import Gate, GateReport, run_gates
from edgekit.bench.store import ResultsStore
from edgekit.bundle import Bundle, load_bundle
from edgekit.deploy import DeployRequest, DeployResult, Job, execute, open_job, run
from edgekit.devices import DeviceEntry, connect, resolve_devices
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT
from edgekit.devices.lock import device_lock
from edgekit.devices.preflight import ensure_ready
from edgekit.errors import GateError, ModelError, PlanError, UsageError
from edgekit.events import Events
from edgekit.fsutil import check_output_path
from edgekit.modelio import parse_shape_overrides
from edgekit.plan import CHOICES, GOALS, Plan, Quantize, bench_config, plan_bundle
from edgekit.profiles import Profile, load_profile
from edgekit.quantize import (
    QuantizeResult,
    dynamic_dims,
    same_outputs,
    save_model,
    with_dynamic_inputs,
)
from edgekit.quantize.calib import DEFAULT_METHOD, Preprocess, parse_method
from edgekit.quantize.mixed import check_metric
from edgekit.targets import KNOWN_BACKENDS

MODEL_SUFFIXES = (".onnx", ".tflite")

PathArg = str | Path
Device = str | DeviceEntry | None
Warmup = int | Literal["auto"] | None
Shapes = Mapping[str, Sequence[int]] | None
PreprocessArg = str | Preprocess | None


def request(model: PathArg, **options: Any) -> DeployRequest:
    """The ``DeployRequest`` the typed functions (and the CLI) build, every value checked here,
    before any work: an unknown option or a bad value is a UsageError naming it.

    ``max_drop`` is in accuracy points, as everywhere in the API and the CLI.
    """
    known = {f.name for f in dataclasses.fields(DeployRequest)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option(s): {', '.join(unknown)}", f"known options: {', '.join(sorted(known - {'model'}))}")
    for name in validate.BOUNDS.keys() & options.keys():
        validate.number(name, options[name])
    if "warmup" in options:
        options["warmup"] = validate.warmup(options["warmup"])
    for name in ("goal", "choose", "backend", "method"):
        if options.get(name) is not None:
            _check_choice(name, options[name])
    if "exclude" in options:
        options["exclude"] = _names(options["exclude"])
    if options.get("shapes") is not None:
        options["shapes"] = _shapes(options["shapes"])
    elif "shapes" in options:
        options["shapes"] = {}
    if isinstance(options.get("preprocess"), str):
        options["preprocess"] = Preprocess.parse(options["preprocess"])
    for key in ("calib", "eval", "labels", "output", "inventory"):
        if options.get(key) is not None:
            options[key] = Path(options[key])
    return DeployRequest(model=Path(model), **options)


def _check_choice(name: str, value: Any) -> None:
    if name == "goal":
        validate.choice("plan goal", value, GOALS)
    elif name == "choose":
        validate.choice("--choose", value, CHOICES)
    elif name == "backend":
        validate.choice("--backend", value, KNOWN_BACKENDS)
    else:
        parse_method(value)  # "unknown calibration method ..." as --method says it


def _names(names: Sequence[str] | None) -> tuple[str, ...]:
    """Node or variant names: a sequence of them (a lone string is one name, not its letters)."""
    if names is None:
        return ()
    return (names,) if isinstance(names, str) else tuple(names)


def _shapes(shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """``{"input": (1, 3, 224, 224)}``, checked as ``--shape input:1,3,224,224`` is."""
    if not isinstance(shapes, Mapping):
        raise UsageError(f"shapes must map input names to dimensions, got {shapes!r}", 'e.g. shapes={"input": (1, 3, 224, 224)}')
    return parse_shape_overrides([f"{name}:{','.join(map(str, dims))}" for name, dims in shapes.items()])


def plan(
    model: PathArg,
    *,
    target: str = "local",
    device: Device = None,
    inventory: PathArg | None = None,
    backend: str | None = None,
    quantize: bool = True,
    goal: Literal["quantize", "bundle", "deploy"] = "deploy",
    calib: PathArg | None = None,
    calib_samples: int | None = None,
    eval: PathArg | None = None,
    labels: PathArg | None = None,
    method: str = DEFAULT_METHOD,
    exclude: Sequence[str] = (),
    shapes: Shapes = None,
    preprocess: PreprocessArg = None,
    warmup: Warmup = None,
    iterations: int | None = None,
    duration_s: float | None = None,
    min_time_s: float | None = None,
    threads: int | None = None,
    rounds: int | None = None,
    layers: bool = True,
    layer_error: bool = False,
    output: PathArg | None = None,
    max_drop: float = 1.0,
    require_int8: bool = False,
    choose: Literal["plan", "measure"] = "plan",
) -> Plan:
    """What ``deploy`` would do, decided on paper (no device contacted): backend, precision,
    scheme, float nodes, variants and steps. Same options as ``deploy``; ``goal`` truncates it
    ("quantize": the quantize step only, "bundle": up to the bundle).

    >>> ek.plan("examples/digits/digits_cnn.onnx", target="jetson-nano").precision  # doctest: +SKIP
    'fp16'
    """
    req = request(
        model, target=target, device=device, inventory=inventory, backend=backend, quantize=quantize, goal=goal,
        calib=calib, calib_samples=calib_samples, eval=eval, labels=labels, method=method, exclude=exclude, shapes=shapes,
        preprocess=preprocess, warmup=warmup, iterations=iterations, duration_s=duration_s, min_time_s=min_time_s,
        threads=threads, rounds=rounds, layers=layers, layer_error=layer_error, output=output, max_drop=max_drop,
        require_int8=require_int8, choose=choose,
    )  # fmt: skip
    return open_job(req).plan()


def quantize(
    model: PathArg,
    output: PathArg,
    *,
    target: str = "local",
    backend: str | None = None,
    calib: PathArg | None = None,
    calib_samples: int | None = None,
    eval: PathArg | None = None,
    labels: PathArg | None = None,
    method: str = DEFAULT_METHOD,
    exclude: Sequence[str] = (),
    shapes: Shapes = None,
    preprocess: PreprocessArg = None,
    max_drop: float | None = None,
    metric: str | None = None,
    threshold: float | None = None,
    strict: bool = False,
    events: Events | None = None,
) -> QuantizeResult:
    """Quantize ``model`` to QDQ int8 ONNX at ``output`` for the target's backend; the result
    carries the fp32-vs-int8 agreement on held-out samples (``result.agreement``).

    ``metric`` (top1, cosine, snr, iou, ctc or "path/module.py:fn"; default: the model's sidecar's,
    else top1 for class vectors, else cosine) is what ``result.check`` measures on the held-out
    samples against ``threshold`` (in the metric's unit; default per metric, see
    ``quantize.threshold``); ``strict=True``: missing it is a GateError and no file.
    ``max_drop`` (POINTS, as ``--max-drop``: 1 keeps the held-out metric within one point of
    float's) turns on mixed precision: the int8 nodes that cost the metric most are kept in float
    until it holds (``result.mixed_precision``); when it cannot, a GateError (``.decision``) and no
    file.

    >>> r = ek.quantize("examples/digits/digits_cnn.onnx", "digits.int8.onnx", calib="examples/digits/calib.npz", max_drop=1)  # doctest: +SKIP
    >>> r.agreement.accuracy_int8  # doctest: +SKIP
    """
    path = check_output_path(output)
    validate.number("max_drop", max_drop)
    check_metric(metric)
    req = request(
        model, goal="quantize", target=target, backend=backend, calib=calib, calib_samples=calib_samples, eval=eval,
        labels=labels, method=method, exclude=exclude, shapes=shapes, preprocess=preprocess, metric=metric,
        threshold=threshold, strict=strict,
    )  # fmt: skip
    job = open_job(req)
    if job.model.format != "onnx":
        raise ModelError(
            f"edgekit quantizes ONNX models; {model} is a {job.model.format} model ({job.model.precision})",
            f"quantize the float ONNX model it came from, or bench it as it is: edgekit bench {model}",
        )
    planned = job.plan()
    if not planned.quantize:
        raise PlanError(
            f"{planned.backend} on {planned.profile} runs {planned.precision}: there is nothing to quantize",
            "pick a target (or --backend) with an int8 path, e.g. --target local",
        )
    if max_drop is not None:
        steps = tuple(dataclasses.replace(s, max_drop=float(max_drop), metric=metric) if isinstance(s, Quantize) else s for s in planned.steps)
        planned = dataclasses.replace(planned, steps=steps)
    result = execute(planned, job, events=events).quantize
    assert result is not None  # a plan with a Quantize step quantizes
    mp = result.mixed_precision
    if mp is not None and not mp["holds"]:
        def v(x: float | None) -> str:
            return "inf" if x is None else f"{x:g}"

        j = mp.get("judged") or {}
        if j.get("missed"):
            why = (f"with {len(mp.get('float_layers') or []) or mp['tried_float_layers']} int8 node(s) in float the {mp['samples']} samples it searched on score "
                   f"{v(mp['after'])} (needs >= {v(mp['goal'])}), but the {j['samples']} held-out samples it did not search on score {v(j['after'])} "
                   f"(needs >= {v(j['goal'])})")  # fmt: skip
        elif mp["tried_float_layers"] == 0 and mp.get("not_candidates"):
            why = f"all int8 scores {v(mp['before'])} (needs >= {v(mp['goal'])}), and no int8 node can stay float on this backend ({'; '.join(mp['not_candidates']['why'])})"
        else:
            why = (f"all int8 scores {v(mp['before'])}, and with the {mp['tried_float_layers']} most harmful int8 nodes in float still {v(mp['after'])} "
                   f"(needs >= {v(mp['goal'])}; nor did the first or last {mp['tried_float_layers']} in graph order)")  # fmt: skip
        err = GateError(
            f"--max-drop {mp['max_drop']:g} ({mp['metric']}) cannot hold: {why}; no model written",
            "allow a larger --max-drop, calibrate on more or better data (--calib, --method percentile), or deploy float (--no-quantize)",
        )
        err.decision = mp  # type: ignore[attr-defined]
        raise err
    save_model(_portable(job, result, events or Events()), path)
    return result


def _portable(job: Job, result: QuantizeResult, events: Events) -> Any:  # onnx.ModelProto
    """The model to hand out: with the original's dynamic input dimensions where the int8 graph
    can keep them (checked to compute what the fixed-shape one does), else the fixed-shape one."""
    dims = dynamic_dims(job.model.model)
    if not dims:
        return result.model
    fixed = ", ".join(f"{i.name}:{','.join(map(str, i.shape))}" for i in job.model.inputs)
    kept_float = bool((result.mixed_precision or {}).get("float_layers"))
    dynamic = None if kept_float else with_dynamic_inputs(result.model, job.model, result.scheme, job.request.exclude)
    calibration, _ = job.feeds(events)
    if dynamic is not None and same_outputs(result.model, dynamic, calibration.feeds[0]):
        shown = ", ".join(f"{name}:[{','.join(map(str, d))}]" for name, d in dims.items())
        events.info(f"the int8 model keeps the dynamic input dimensions ({shown}); it was calibrated at {fixed}")
        return dynamic
    why = "layers kept float by --max-drop" if kept_float else "its graph depends on the fixed shape"
    events.info(f"the int8 model has fixed input shapes {fixed} ({why}); quantize again with --shape for other sizes")
    return result.model


def deploy(
    model: PathArg,
    *,
    target: str = "local",
    device: Device = None,
    inventory: PathArg | None = None,
    backend: str | None = None,
    quantize: bool = True,
    goal: Literal["bundle", "deploy"] = "deploy",
    calib: PathArg | None = None,
    calib_samples: int | None = None,
    eval: PathArg | None = None,
    labels: PathArg | None = None,
    method: str = DEFAULT_METHOD,
    exclude: Sequence[str] = (),
    shapes: Shapes = None,
    preprocess: PreprocessArg = None,
    warmup: Warmup = None,
    iterations: int | None = None,
    duration_s: float | None = None,
    min_time_s: float | None = None,
    threads: int | None = None,
    rounds: int | None = None,
    layers: bool = True,
    layer_error: bool = False,
    output: PathArg | None = None,
    max_drop: float = 1.0,
    require_int8: bool = False,
    choose: Literal["plan", "measure"] = "plan",
    remeasure: bool = False,
    provision: bool = False,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    trust_new_host: bool = False,
    password: str | None = None,
    events: Events | None = None,
) -> DeployResult:
    """Quantize, bundle, push to the device, bench each variant there and store the runs.

    ``max_drop``: the int8 gate, accuracy POINTS int8 may lose against ``labels`` (as ``--max-drop``;
    also how far the host's mixed precision may let the held-out metric drop). ``layer_error``: per-layer
    fp32-vs-int8 error measured on the device (as ``--layers error``). ``goal="bundle"``
    stops after writing the bundle (no device). ``iterations``: timed runs, exactly (default: the
    profile's count, for at least its ``min_time_s``); ``warmup``: a count or "auto".

    >>> r = ek.deploy("examples/digits/digits_cnn.onnx", target="local", iterations=200, max_drop=0.5)  # doctest: +SKIP
    >>> r.to_dict()["summary"]["variants"]["int8"]["p50_ms"]  # doctest: +SKIP
    """
    req = request(
        model, target=target, device=device, inventory=inventory, backend=backend, quantize=quantize, goal=goal,
        calib=calib, calib_samples=calib_samples, eval=eval, labels=labels, method=method, exclude=exclude, shapes=shapes,
        preprocess=preprocess, warmup=warmup, iterations=iterations, duration_s=duration_s, min_time_s=min_time_s,
        threads=threads, rounds=rounds, layers=layers, layer_error=layer_error, output=output, max_drop=max_drop,
        require_int8=require_int8, choose=choose,
        remeasure=remeasure, provision=provision, lock_wait=lock_wait, trust_new_host=trust_new_host, password=password,
    )  # fmt: skip
    job = open_job(req)
    return run(job, job.plan(), events or Events())


def deploy_job(job: Job, device: DeviceEntry, events: Events, **changes: Any) -> DeployResult:
    """``job`` deployed to one ``device`` (a fleet runs this per device, sharing the loaded model and data)."""
    profile = load_profile(changes.pop("target")) if "target" in changes else job.profile
    one = dataclasses.replace(job, device=device, profile=profile, **changes)
    return run(one, one.plan(), events)


def bench(
    path: PathArg,
    *,
    target: str | None = None,
    device: Device = None,
    inventory: PathArg | None = None,
    variants: Sequence[str] | None = None,
    backend: str | None = None,
    shapes: Shapes = None,
    warmup: Warmup = None,
    iterations: int | None = None,
    duration_s: float | None = None,
    min_time_s: float | None = None,
    threads: int | None = None,
    rounds: int | None = None,
    layers: bool = True,
    layer_error: bool = False,
    output: PathArg | None = None,
    lock_wait: float = DEFAULT_LOCK_WAIT,
    trust_new_host: bool = False,
    password: str | None = None,
    events: Events | None = None,
) -> DeployResult:
    """Bench a bundle directory (push it, time ``variants`` on the device, store the runs), or a
    model file as it is (unquantized, through the same pipeline as ``deploy``; ``output``: where its
    bundle goes). ``target``: default the bundle's profile (a model file: "local"); ``backend`` and
    ``shapes`` apply to a model file only.

    >>> runs = ek.bench("edgekit-out/digits_cnn-local", variants=["int8"], iterations=500)  # doctest: +SKIP
    """
    path = Path(path)
    events = events or Events()
    timing = dict(warmup=warmup, iterations=iterations, duration_s=duration_s, min_time_s=min_time_s, threads=threads, rounds=rounds, layers=layers)
    ssh = dict(inventory=inventory, lock_wait=lock_wait, trust_new_host=trust_new_host, password=password)
    if path.is_file() or path.suffix.lower() in MODEL_SUFFIXES:
        if variants:
            raise UsageError("variants select parts of a bundle; a model file has one", "drop the variant selection, or bench a bundle directory")
        req = request(path, target=target or "local", device=device, backend=backend, shapes=shapes, quantize=False, output=output, remeasure=True,
                      layer_error=layer_error, **timing, **ssh)
        job = open_job(req)  # bench measures, always (remeasure)
        return run(job, job.plan(), events)
    if backend or shapes:
        raise UsageError("--backend and --shape apply to a model file; a bundle was built for its backend", "pass a model file, or drop them")
    if layer_error:
        raise UsageError("--layers error runs twins of the fp32 and int8 models that deploy builds; a bundle has none", f"deploy the model: edgekit deploy MODEL --layers error (or bench {path} --layers time)")
    req = request(path, device=device, **timing, **ssh)  # every value checked before the bundle is read
    selected = _names(variants) or None
    bundle = load_bundle(path)
    entry = req.device if isinstance(req.device, DeviceEntry) else resolve_devices([req.device or "local"], req.inventory)[0]
    return bench_bundle(bundle, entry, load_profile(target or bundle.manifest.profile), req, selected, events)


def select_variants(bundle: Bundle, variants: Sequence[str] | None) -> list[str]:
    """``variants`` of ``bundle`` (default: all of them), each checked: an unknown name is a UsageError."""
    known = [v.name for v in bundle.manifest.variants]
    for name in variants or []:
        if name not in known:
            raise UsageError(f"the bundle has no variant '{name}'", f"pass one of: {', '.join(known)}")
    return list(dict.fromkeys(variants or known))


def bench_bundle(
    bundle: Bundle, device: DeviceEntry, profile: Profile, req: DeployRequest, variants: Sequence[str] | None, events: Events
) -> DeployResult:
    """Check that ``device`` has the runtimes of the ``variants`` (default: all) of ``bundle`` (a
    PreflightError naming ``edgekit devices provision`` before anything is pushed), then push the
    bundle and bench them there, under the device's lock."""
    manifest = bundle.manifest
    selected = select_variants(bundle, variants)
    config = bench_config(profile.bench, req)
    planned = plan_bundle(manifest, profile, device=device.name, variants=selected, config=config)
    transport = connect(device, profile, trust_new_host=req.trust_new_host, password=req.password, log=events.info)
    try:
        ensure_ready(transport, profile, planned, device=device.name, events=events, bundle=bundle)
        with device_lock(transport, wait=req.lock_wait, on_wait=events.info) as lock:
            return execute(planned, None, transport, events, bundle=bundle, lock=lock)
    finally:
        transport.close()


def check_gates(result: DeployResult, gates: Sequence[str | Gate], *, baseline: str | None = None) -> GateReport:
    """Regression gates (``"p50:+5%"``, ``"p99:<20ms"``...) on the runs ``deploy`` or ``bench`` just
    stored: the int8 run when there is one, else the first, against ``baseline`` (a run id, an
    export file ``FILE``/``FILE#N``, or ``latest@BRANCH``; default: the newest earlier run of the
    same model, target, device and variant). ``report.error()`` is the GateError to raise, if any.

    >>> report = ek.check_gates(ek.deploy("examples/digits/digits_cnn.onnx"), ["p50:+5%"])  # doctest: +SKIP
    """
    records = [{"id": rid, **r} for r, rid in zip(result.records, result.run_ids)]
    if not records:
        raise UsageError("gates check a benchmark, and this run stored none", "drop --no-bench (gates need a run on the device)")
    with ResultsStore() as store:
        return run_gates(gates, records, store, baseline=baseline)


def results(path: str | Path | None = None) -> ResultsStore:
    """The results store (default: the user data dir's); use it as a context manager.

    >>> with ek.results() as store:  # doctest: +SKIP
    ...     latest = store.list(limit=1)
    """
    return ResultsStore(Path(path) if path is not None else None)


__all__ = ["bench", "check_gates", "deploy", "plan", "quantize", "request", "results"]
