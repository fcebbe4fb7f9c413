"""The pipeline that executes a plan: quantize -> bundle -> push -> bench -> store -> summary."""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgekit.bench.record import make_record
from edgekit.bench.run import BenchConfig, bench_variant
from edgekit.bench.stats import Stats
from edgekit.bench.store import ResultsStore
from edgekit.bundle import Bundle, TensorSpec, Variant, write_bundle
from edgekit.devices import connect
from edgekit.devices.lock import DEFAULT_WAIT as DEFAULT_LOCK_WAIT
from edgekit.devices.lock import device_lock
from edgekit.devices.preflight import ensure_ready
from edgekit.errors import OutputPathError
from edgekit.modelio import LoadedModel, load_model
from edgekit.plan import Plan, make_plan
from edgekit.profiles import CpuSpec, Profile, load_profile, resolve
from edgekit.quantize import (
    FeedSet,
    Preprocess,
    QuantizeResult,
    load_feeds,
    quantize_model,
    random_feeds,
    save_model,
)
from edgekit.targets import get_backend
from edgekit.transport.push import PushResult, progress_reporter, push_bundle

HELD_OUT_FRACTION = 0.2
RANDOM_SAMPLES = 32


class Events:
    """What the pipeline tells its caller; the CLI passes its Output (same methods)."""

    def info(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    @contextlib.contextmanager
    def progress(self, description: str, total: int | None = None):
        class _P:
            def advance(self, n: int = 1) -> None:
                pass

            def update(self, description: str) -> None:
                pass

        yield _P()


@dataclass(frozen=True)
class DeployRequest:
    model: Path
    target: str = "local"
    device: str | None = None
    backend: str | None = None
    quantize: bool = True
    bench: bool = True
    calib: Path | None = None
    eval: Path | None = None
    labels: Path | None = None
    method: str = "minmax"
    exclude: tuple[str, ...] = ()
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    preprocess: Preprocess | None = None
    warmup: int | None = None
    iterations: int | None = None
    duration_s: float | None = None
    threads: int | None = None
    output: Path | None = None
    inventory: Path | None = None  # where a --device name is looked up (default: ./devices.toml)
    provision: bool = False  # install the plan's runtime on the device when preflight finds it missing
    lock_wait: float = DEFAULT_LOCK_WAIT  # seconds to queue behind another job's lock on the device
    trust_new_host: bool = False  # save the key of an SSH device not yet in known_hosts
    password: str | None = field(default=None, repr=False)  # SSH password login, only when given


@dataclass
class Prepared:
    """Everything decided before any work: the model, the profile, the data, the plan."""

    loaded: LoadedModel
    profile: Profile
    plan: Plan
    calib: Path | None
    eval: Path | None
    labels: Path | None
    output: Path
    facts: dict | None = None  # the probed device's (None: planned on paper)


def prepare_deploy(req: DeployRequest, facts: dict | None = None) -> Prepared:
    """Load and check everything, then plan; ``facts`` of the probed device make the plan real."""
    loaded = load_model(req.model, req.shapes)
    profile = resolve(load_profile(req.target), cpu=cpu_from_facts(facts))
    sc = loaded.sidecar
    calib = req.calib or sc.calibration
    evaluation = req.eval or (sc.evaluation if req.eval is None else None)
    labels = req.labels or (sc.labels if evaluation is not None and evaluation == sc.evaluation else None)
    output = req.output or Path("edgekit-out") / f"{loaded.name}-{profile.name}"
    if not output.parent.exists() and req.output is not None:
        raise OutputPathError(f"output directory does not exist: {output.parent}", f"create it first (mkdir -p {output.parent})")
    plan = make_plan(
        loaded,
        profile,
        device=req.device or "local",
        backend=req.backend,
        quantize=req.quantize,
        method=req.method,
        exclude=req.exclude,
        calibration=str(calib) if calib else "random",
        evaluation=str(evaluation) if evaluation else (f"last {int(HELD_OUT_FRACTION * 100)}% of the calibration data" if calib else "random"),
        bench=req.bench,
        warmup=req.warmup,
        iterations=req.iterations,
        threads=req.threads,
        output=output,
        facts=facts,
    )
    return Prepared(loaded, profile, plan, calib, evaluation, labels, output, facts)


def cpu_from_facts(facts: dict | None) -> CpuSpec | None:
    """The CPU facts of a probed device in the profiles' vocabulary (None: not probed)."""
    if not facts:
        return None
    d = facts.get("device") or {}
    if not d.get("arch"):
        return None
    return CpuSpec(arch=d["arch"], core=d.get("cpu_model"), isa=tuple(d.get("isa") or ()), cores=d.get("cores"))


def load_data(
    loaded: LoadedModel,
    calib: Path | None,
    evaluation: Path | None,
    labels: Path | None,
    preprocess: Preprocess | None,
    events: Events,
) -> tuple[FeedSet, FeedSet]:
    """Calibration and held-out sets; random data only with a loud warning."""
    if calib is None:
        events.warn(
            f"no calibration data: calibrating on {RANDOM_SAMPLES} RANDOM samples. The int8 ranges and the "
            "agreement figures below are not representative of real inputs; give --calib DATA "
            "(a .npz/.npy, a folder of .npz, or a folder of images with --preprocess)"
        )
        calibration = random_feeds(loaded.inputs, RANDOM_SAMPLES, seed=0)
    else:
        calibration = load_feeds(calib, loaded.inputs, preprocess=preprocess)
    if evaluation is not None:
        heldout = load_feeds(evaluation, loaded.inputs, preprocess=preprocess, labels=labels)
    elif not calibration.random and len(calibration.feeds) > 1:
        calibration, heldout = calibration.split(HELD_OUT_FRACTION)
    else:
        heldout = random_feeds(loaded.inputs, max(4, RANDOM_SAMPLES // 4), seed=1)
    return calibration, heldout


def run_quantize(prep: Prepared, req: DeployRequest, events: Events) -> QuantizeResult:
    scheme = prep.plan.scheme
    assert scheme is not None
    calibration, heldout = load_data(prep.loaded, prep.calib, prep.eval, prep.labels, req.preprocess, events)
    passes = 1 if req.method == "minmax" else 2
    with events.progress(f"calibrating on {len(calibration.feeds)} samples ({req.method})", total=passes * len(calibration.feeds)) as prog:
        return quantize_model(prep.loaded, scheme, calibration, heldout, method=req.method, exclude=req.exclude, progress=prog)


@dataclass
class DeployResult:
    plan: Plan
    quantize: QuantizeResult | None
    bundle: Bundle
    push: PushResult | None
    records: list[dict]
    run_ids: list[int]
    sizes: dict[str, int]

    def summary(self) -> dict[str, Any]:
        by_variant = {r["agent"]["variant"]: r for r in self.records}
        variants: dict[str, dict] = {}
        agreement = self.quantize.agreement if self.quantize else None
        for v in self.bundle.manifest.variants:
            rec = by_variant.get(v.name)
            entry: dict[str, Any] = {
                "backend": v.backend,
                "precision": v.precision,
                "size_bytes": self.sizes.get(v.name),
                "p50_ms": rec["stats"]["p50"] if rec else None,
                "p99_ms": rec["stats"]["p99"] if rec else None,
                "mean_ms": rec["stats"]["mean"] if rec else None,
                "peak_rss_bytes": rec["agent"].get("peak_rss_bytes") if rec else None,
                "run_id": self.run_ids[self.records.index(rec)] if rec else None,
            }
            if agreement is not None:
                entry["accuracy"] = agreement.accuracy_int8 if v.precision == "int8" else agreement.accuracy_fp32
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
            "quantize": self.quantize.to_dict() if self.quantize else None,
            "bundle": {
                "path": str(self.bundle.root),
                "hash": self.bundle.manifest.bundle_hash,
                "files": [f.to_dict() for f in self.bundle.manifest.files],
            },
            "push": self.push.to_dict() if self.push else None,
            "runs": [
                {
                    "id": rid,
                    "variant": r["agent"]["variant"],
                    "stats": r["stats"],
                    "run_uuid": r["run_uuid"],
                    # what the backend told about loading and executing (e.g. OpenVINO's cached load)
                    "backend_info": r["agent"].get("backend_info") or {},
                    "layers": r["agent"].get("layers"),
                }
                for rid, r in zip(self.run_ids, self.records)
            ],
            "summary": self.summary(),
        }


def _specs(model_path: Path, inputs) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    import onnx

    from edgekit.modelio import np_dtype

    m = onnx.load(str(model_path), load_external_data=False)
    outs = []
    for o in m.graph.output:
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in o.type.tensor_type.shape.dim)
        outs.append(TensorSpec(o.name, dims, np_dtype(o.type.tensor_type.elem_type)))
    ins = tuple(TensorSpec(i.name, tuple(i.shape), i.dtype) for i in inputs)
    return ins, tuple(outs)


def _loaded_specs(loaded) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Input and output specs of a model that is not ONNX, as its loader read them."""
    return (
        tuple(TensorSpec(i.name, tuple(i.shape), i.dtype) for i in loaded.inputs),
        tuple(TensorSpec(o.name, tuple(o.shape), o.dtype) for o in loaded.outputs),
    )


def deploy(req: DeployRequest, events: Events | None = None, prep: Prepared | None = None) -> DeployResult:
    events = events or Events()
    prep = prep or prepare_deploy(req)
    transport = None
    try:
        if req.bench:
            # The real plan needs the device's facts: which runtimes it has, its CPU. Preflight reads
            # them and stops here, before any push, when the device cannot run the plan.
            transport = connect(
                req.device, prep.profile, inventory=req.inventory,
                trust_new_host=req.trust_new_host, password=req.password, log=events.info,
            )  # fmt: skip
            ready = ensure_ready(transport, prep.profile, prep.plan, device=req.device or "local", provision=req.provision, events=events)
            prep = prepare_deploy(req, ready.facts)
            for note in prep.plan.notes:
                events.info(f"note: {note}")
        if transport is None:
            return _execute(req, prep, events, transport)
        with device_lock(transport, wait=req.lock_wait, on_wait=events.info):  # no other job benches it meanwhile
            return _execute(req, prep, events, transport)
    finally:
        if transport is not None:
            transport.close()


def _execute(req: DeployRequest, prep: Prepared, events: Events, transport) -> DeployResult:
    plan = prep.plan
    qresult = None
    with tempfile.TemporaryDirectory(prefix="edgekit-deploy-") as tmpdir:
        tmp = Path(tmpdir)
        files: dict[str, Path] = {}
        variants: list[Variant] = []
        sizes: dict[str, int] = {}
        # Unquantized, the model is bundled as it is, as one variant named after the precision the
        # device runs it at (fp16 on a Myriad VPU, int8 for an int8 .tflite).
        fmt = getattr(prep.loaded, "format", "onnx")
        source = "fp32" if plan.quantize else plan.precision
        fp32 = tmp / f"model.{source}.{fmt}"
        fp32.write_bytes(prep.loaded.path.read_bytes())
        sample = None
        if plan.quantize:
            events.info(f"quantizing {prep.loaded.path.name} for {plan.backend} ({plan.scheme.name} scheme)")
            qresult = run_quantize(prep, req, events)
            get_backend(plan.backend).check_quantized(qresult.model)  # e.g. TensorRT's Q/DQ rules
            int8 = tmp / "model.int8.onnx"
            save_model(qresult.model, int8)
        # One real sample (when there is real data) is what the device times.
        if prep.eval is not None or prep.calib is not None:
            calibration, heldout = load_data(prep.loaded, prep.calib, prep.eval, prep.labels, req.preprocess, Events())
            sample = heldout.feeds[0]
        if sample is not None:
            np.savez(tmp / "inputs.npz", **sample)
        ins, outs = _specs(fp32, prep.loaded.inputs) if fmt == "onnx" else _loaded_specs(prep.loaded)
        chosen = ["fp32", "int8"] if plan.quantize else [source]
        for name in chosen:
            rel = f"{name}/model.{fmt}"
            files[rel] = tmp / f"model.{name}.{fmt}"
            if sample is not None:
                files[f"{name}/inputs.npz"] = tmp / "inputs.npz"
            # e.g. native runs the int8 variant and leaves the fp32 reference to ONNX Runtime
            impl = get_backend(get_backend(plan.backend).variant_backend(name, prep.facts))
            compiled = impl.compile(files[rel], tmp / name)  # None: the device runs the ONNX file
            if compiled:
                del files[rel]
                files.update({f"{name}/{p.name}": p for p in compiled})
                rel = f"{name}/{compiled[0].name}"
            options = impl.variant_options(prep.profile.backend(impl.name), name)
            variants.append(Variant(name, impl.name, name, rel, ins, outs, options))
            sizes[name] = sum(p.stat().st_size for p in compiled) if compiled else files[rel].stat().st_size
        files.update(get_backend(plan.backend).runtime_files(prep.profile, prep.facts, tmp / "runtime"))
        if req.output is None:
            prep.output.parent.mkdir(parents=True, exist_ok=True)
        bundle = write_bundle(
            prep.output,
            files=files,
            model_name=prep.loaded.name,
            model_sha256=prep.loaded.sha256,
            profile=plan.profile,
            backend=plan.backend,
            precision=plan.precision,
            variants=variants,
            plan=plan.to_dict(),
            overwrite=True,
        )
    events.info(f"bundle written to {bundle.root} ({len(bundle.manifest.files)} files)")
    push = None
    records: list[dict] = []
    run_ids: list[int] = []
    if transport is not None:
        with events.progress(f"pushing bundle to {transport.name}") as prog:
            push = push_bundle(transport, bundle, progress=progress_reporter(prog))
        events.info(
            f"pushed to {transport.name}: {push.files_sent} file(s) sent ({push.bytes_sent} bytes), {push.files_skipped} unchanged"
        )
        config = BenchConfig(
            warmup=req.warmup if req.warmup is not None else prep.profile.bench.warmup,
            iterations=req.iterations if req.iterations is not None else prep.profile.bench.iterations,
            duration_s=req.duration_s,
            threads=req.threads if req.threads is not None else prep.profile.bench.threads,
        )
        store = ResultsStore()
        try:
            for v in variants:
                with events.progress(f"benchmarking {v.name} on {transport.name}"):
                    doc = bench_variant(transport, push.remote_dir, v.name, config)
                record = make_record(doc, model_name=prep.loaded.name, target=plan.profile, device=plan.device)
                run_ids.append(store.add(record))
                records.append(record)
        finally:
            store.close()
    return DeployResult(plan, qresult, bundle, push, records, run_ids, sizes)


def speed_sentence(summary: dict, float_nodes: int = 0) -> str | None:
    """The plain-language verdict on int8 vs fp32 speed on this device."""
    if "speedup_p50" not in summary:
        return None
    s = summary["speedup_p50"]
    if summary["int8_faster"]:
        return f"int8 is {s:.2f}x faster than fp32 at p50 on this device."
    why = []
    fp_p50 = summary["variants"]["fp32"]["p50_ms"]
    if fp_p50 is not None and fp_p50 < 0.1:
        why.append(f"the model runs in {fp_p50 * 1000:.0f} us, where per-call overhead outweighs the arithmetic")
    if float_nodes:
        why.append(f"{float_nodes} node(s) stay float, and each int8/float boundary costs a Q/DQ conversion")
    if not why:
        why.append("this runtime's int8 kernels are not faster than its fp32 ones on this CPU")
    return f"int8 is NOT faster than fp32 on this device ({s:.2f}x fp32's speed at p50): " + "; ".join(why) + "."


__all__ = ["DeployRequest", "DeployResult", "Events", "Prepared", "deploy", "prepare_deploy", "speed_sentence", "Stats"]
