"""edgekit's Python API: what the CLI does, as functions with typed arguments and results.

>>> from edgekit import api as ek
>>> plan = ek.plan("examples/digits/digits_cnn.onnx", target="rpi5")  # doctest: +SKIP
>>> result = ek.deploy("examples/digits/digits_cnn.onnx", target="local")  # doctest: +SKIP
>>> result.summary()["speedup_p50"]  # doctest: +SKIP

Every function takes the model (or bundle) path first and keyword options after: the fields of
``edgekit.deploy.DeployRequest`` (target, device, backend, calib, eval, labels, method,
exclude, shapes, preprocess, warmup, iterations, duration_s, min_time_s, threads, rounds, output, inventory,
provision, lock_wait, trust_new_host, password). ``events`` (an ``edgekit.events.Events``)
receives progress and warnings; by default the library is silent. Errors are
``edgekit.errors.EdgekitError`` subclasses with ``message`` and ``hint``.

(The functions live here, not on the package root, because ``edgekit.quantize``,
``edgekit.plan``, ``edgekit.deploy`` and ``edgekit.bench`` are the modules that implement them.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgekit.bench.gates import Gate, GateReport, run_gates
from edgekit.bench.store import ResultsStore
from edgekit.bundle import load_bundle
from edgekit.deploy import DeployRequest, DeployResult, Job, execute, open_job, run
from edgekit.devices import DeviceEntry, connect, resolve_devices
from edgekit.devices.lock import device_lock
from edgekit.errors import GateError, ModelError, PlanError, UsageError
from edgekit.events import Events
from edgekit.fsutil import check_output_path
from edgekit.plan import Plan, Quantize, bench_config, plan_bundle
from edgekit.profiles import Profile, load_profile
from edgekit.quantize import (
    QuantizeResult,
    dynamic_dims,
    same_outputs,
    save_model,
    with_dynamic_inputs,
)
from edgekit.quantize.calib import DEFAULT_METHOD, parse_method
from edgekit.quantize.mixed import check_metric

MODEL_SUFFIXES = (".onnx", ".tflite")


def request(model: str | Path, **options: Any) -> DeployRequest:
    """A ``DeployRequest`` for ``model``; an unknown option is a UsageError naming it."""
    known = {f.name for f in dataclasses.fields(DeployRequest)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UsageError(f"unknown option(s): {', '.join(unknown)}", f"known options: {', '.join(sorted(known - {'model'}))}")
    if "exclude" in options:
        options["exclude"] = tuple(options["exclude"] or ())
    for key in ("calib", "eval", "labels", "output", "inventory"):
        if options.get(key) is not None:
            options[key] = Path(options[key])
    return DeployRequest(model=Path(model), **options)


def plan(model: str | Path, **options: Any) -> Plan:
    """What ``deploy`` would do, decided on paper (no device contacted).

    >>> ek.plan("examples/digits/digits_cnn.onnx", target="jetson-nano").precision  # doctest: +SKIP
    'fp16'
    """
    return open_job(request(model, **options)).plan()


def quantize(
    model: str | Path, output: str | Path, *, events: Events | None = None, max_drop: float | None = None, metric: str | None = None, **options: Any
) -> QuantizeResult:
    """Quantize ``model`` to QDQ int8 ONNX at ``output`` for the target's backend; the result
    carries the fp32-vs-int8 agreement on held-out samples.

    ``metric`` (top1, cosine, snr, iou, ctc or "path/module.py:fn"; default: the model's sidecar's,
    else top1 for class vectors, else cosine) is what ``result.check`` measures on the held-out
    samples against ``threshold`` (an option, in the metric's unit; default per metric, see
    ``quantize.threshold``); ``strict=True``: missing it is a GateError and no file.
    ``max_drop`` (a fraction, as deploy's: 0.01 is one point): mixed precision, the int8 nodes
    that cost the held-out metric most kept in float until it holds (``result.mixed_precision``);
    when it cannot hold, a GateError (``.decision``) and no file.

    >>> r = ek.quantize("examples/digits/digits_cnn.onnx", "digits.int8.onnx", calib="examples/digits/calib.npz")  # doctest: +SKIP
    >>> r.agreement.accuracy_int8  # doctest: +SKIP
    """
    output = check_output_path(output)
    check_metric(metric)
    parse_method(options.get("method", DEFAULT_METHOD))  # a bad --method fails before anything loads
    job = open_job(request(model, goal="quantize", metric=metric, **options))
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
        steps = tuple(dataclasses.replace(s, max_drop=max_drop * 100, metric=metric) if isinstance(s, Quantize) else s for s in planned.steps)
        planned = dataclasses.replace(planned, steps=steps)
    result = execute(planned, job, events=events).quantize
    mp = result.mixed_precision
    if mp is not None and not mp["holds"]:
        def v(x: float | None) -> str:
            return "inf" if x is None else f"{x:g}"

        err = GateError(
            f"--max-drop {mp['max_drop']:g} ({mp['metric']}) cannot hold: all int8 scores {v(mp['before'])}, and with the "
            f"{mp['tried_float_layers']} most harmful int8 nodes in float still {v(mp['after'])} (needs >= {v(mp['goal'])}); no model written",
            "allow a larger --max-drop, calibrate on more or better data (--calib, --method percentile), or deploy float (--no-quantize)",
        )
        err.decision = mp
        raise err
    save_model(_portable(job, result, events or Events()), output)
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


def deploy(model: str | Path, *, events: Events | None = None, **options: Any) -> DeployResult:
    """Quantize, bundle, push to the device, bench each variant there and store the runs.

    ``goal="bundle"`` stops after writing the bundle (no device).

    >>> r = ek.deploy("examples/digits/digits_cnn.onnx", target="local")  # doctest: +SKIP
    >>> r.to_dict()["summary"]["variants"]["int8"]["p50_ms"]  # doctest: +SKIP
    """
    job = open_job(request(model, **options))
    return run(job, job.plan(), events or Events())


def deploy_job(job: Job, device: DeviceEntry, events: Events, **changes: Any) -> DeployResult:
    """``job`` deployed to one ``device`` (a fleet runs this per device, sharing the loaded model and data)."""
    profile = load_profile(changes.pop("target")) if "target" in changes else job.profile
    one = dataclasses.replace(job, device=device, profile=profile, **changes)
    return run(one, one.plan(), events)


def bench(
    path: str | Path,
    *,
    variants: Sequence[str] | None = None,
    events: Events | None = None,
    **options: Any,
) -> DeployResult:
    """Bench a bundle directory (push it, time ``variants`` on the device, store the runs), or a
    model file as it is (unquantized, through the same pipeline as ``deploy``).

    >>> runs = ek.bench("edgekit-out/digits_cnn-local", variants=["int8"], iterations=500)  # doctest: +SKIP
    """
    path = Path(path)
    events = events or Events()
    if path.is_file() or path.suffix.lower() in MODEL_SUFFIXES:
        if variants:
            raise UsageError("variants select parts of a bundle; a model file has one", "drop the variant selection, or bench a bundle directory")
        return deploy(path, events=events, quantize=False, **{"remeasure": True, **options})  # bench measures, always
    if options.get("backend") or options.get("shapes"):
        raise UsageError("--backend and --shape apply to a model file; a bundle was built for its backend", "pass a model file, or drop them")
    bundle = load_bundle(path)
    target = options.pop("target", None)
    req = request(path, **options)
    entry = req.device if isinstance(req.device, DeviceEntry) else resolve_devices([req.device or "local"], req.inventory)[0]
    return bench_bundle(bundle, entry, load_profile(target or bundle.manifest.profile), req, variants, events)


def bench_bundle(
    bundle: Any, device: DeviceEntry, profile: Profile, req: DeployRequest, variants: Sequence[str] | None, events: Events
) -> DeployResult:
    """Push ``bundle`` to ``device`` and bench its ``variants`` (default: all) there, under the device's lock."""
    manifest = bundle.manifest
    known = [v.name for v in manifest.variants]
    selected = list(dict.fromkeys(variants or known))
    for name in selected:
        if name not in known:
            raise UsageError(f"the bundle has no variant '{name}'", f"pass one of: {', '.join(known)}")
    config = bench_config(profile.bench, req)
    planned = plan_bundle(manifest, profile, device=device.name, variants=selected, config=config)
    transport = connect(device, profile, trust_new_host=req.trust_new_host, password=req.password, log=events.info)
    try:
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
