"""The planner: given a model and a profile, decide everything once; deploy only executes.

A plan says which backend runs the model (first in the profile's order that supports it, and
why the others were skipped), at which precision, with which quantization scheme, which nodes
stay float and why, and the steps a deploy will run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgekit.errors import PlanError, UsageError
from edgekit.modelio import IOSpec, LoadedModel
from edgekit.profiles import Profile
from edgekit.quantize import analyze_model
from edgekit.quantize.rewrite import NodeDecision
from edgekit.quantize.scheme import QuantScheme
from edgekit.targets import KNOWN_BACKENDS, available_backends, get_backend

PLAN_SCHEMA = 1


@dataclass(frozen=True)
class Step:
    name: str
    detail: str

    def to_dict(self) -> dict:
        return {"name": self.name, "detail": self.detail}


@dataclass(frozen=True)
class Plan:
    model: str
    model_path: str
    model_sha256: str
    inputs: tuple[IOSpec, ...]
    profile: str
    profile_description: str
    device: str
    backend: str
    precision: str
    quantize: bool
    scheme: QuantScheme | None
    method: str
    calibration: str  # where calibration data comes from ("random" when none was given)
    evaluation: str
    node_counts: dict[str, int]
    float_nodes: tuple[NodeDecision, ...]
    skipped: tuple[tuple[str, str], ...]  # (backend, why it was not chosen)
    notes: tuple[str, ...]
    steps: tuple[Step, ...] = field(default_factory=tuple)
    options: dict = field(default_factory=dict)  # backend options for the variants (agent side)
    probed: bool = False  # True: decided with the device's facts; False: on paper

    def to_dict(self) -> dict:
        return {
            "schema": PLAN_SCHEMA,
            "model": self.model,
            "model_path": self.model_path,
            "model_sha256": self.model_sha256,
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
            "steps": [s.to_dict() for s in self.steps],
            "options": self.options,
            "probed": self.probed,
        }


def choose_backend(
    model: LoadedModel, profile: Profile, forced: str | None, facts: dict | None = None, quantize: bool = True
) -> tuple[str, list[tuple[str, str]], list[str]]:
    skipped: list[tuple[str, str]] = []
    notes: list[str] = []
    if forced:
        if forced not in KNOWN_BACKENDS:
            raise UsageError(f"unknown backend '{forced}'", f"choose one of: {', '.join(KNOWN_BACKENDS)}")
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
        verdict = get_backend(spec.name).supports(model, profile, facts)
        if verdict.ok:
            notes.extend(verdict.reasons)
            return spec.name, skipped, notes
        skipped.append((spec.name, "; ".join(verdict.reasons)))
    fmt = getattr(model, "format", "onnx")
    if fmt != "onnx":
        # A model in another format runs on the one backend that reads it, listed or not.
        for name in available_backends():
            if profile.backend(name) is None and fmt in get_backend(name).formats:
                verdict = get_backend(name).supports(model, profile, facts)
                if verdict.ok:
                    notes.append(f"the {profile.name} profile lists no backend for {fmt} models: using {name}, which runs them")
                    notes.extend(verdict.reasons)
                    return name, skipped, notes
                skipped.append((name, "; ".join(verdict.reasons)))
    raise PlanError(
        f"no backend of profile {profile.name} can run this model: "
        + "; ".join(f"{b}: {r}" for b, r in skipped),
        f"force one with --backend (available: {', '.join(available_backends())}) or pick another --target",
    )


def make_plan(
    model: LoadedModel,
    profile: Profile,
    *,
    device: str = "local",
    backend: str | None = None,
    quantize: bool = True,
    method: str = "minmax",
    exclude: tuple[str, ...] = (),
    calibration: str = "random",
    evaluation: str = "",
    bench: bool = True,
    warmup: int | None = None,
    iterations: int | None = None,
    threads: int | None = None,
    output: Path | None = None,
    facts: dict | None = None,
) -> Plan:
    """Decide backend, precision, scheme and steps; ``facts``: the probed device, or None (on paper)."""
    name, skipped, notes = choose_backend(model, profile, backend, facts, quantize)
    impl = get_backend(name)
    spec = profile.backend(name)
    precisions = spec.precisions if spec else (("int8", "fp32") if impl.scheme else ("fp32",))
    if spec and spec.notes:
        notes.append(f"{name} on {profile.name}: {spec.notes}")
    onnx_model = getattr(model, "format", "onnx") == "onnx"
    if not onnx_model:
        # Not ONNX (a .tflite): it runs as it is, at the precision it was built with.
        precision = model.precision
        notes.append(f"a {model.format} model runs as it is ({precision}); edgekit quantizes ONNX models only")
    elif quantize and "int8" in precisions and impl.scheme is not None:
        precision = "int8"
    else:
        precision = next((p for p in precisions if p != "int8"), "fp32")
        if quantize and "int8" not in precisions:
            notes.append(f"{name} on {profile.name} has no int8 path: running {precision}")
    scheme: QuantScheme | None = impl.scheme if precision == "int8" and onnx_model else None
    counts: dict[str, int] = {}
    float_nodes: tuple[NodeDecision, ...] = ()
    if scheme is not None:
        prepared, analysis = analyze_model(model, scheme, exclude)
        counts = analysis.summary()
        float_nodes = tuple(analysis.float_nodes)
        notes.extend(impl.check_plan(prepared, analysis))
    if scheme is not None and calibration == "random":
        notes.append("no calibration data: int8 ranges will come from random inputs (give --calib)")

    warmup = profile.bench.warmup if warmup is None else warmup
    iterations = profile.bench.iterations if iterations is None else iterations
    threads = threads if threads is not None else profile.bench.threads
    steps: list[Step] = []
    if scheme is not None:
        steps.append(Step("quantize", f"QDQ int8 ({scheme.name} scheme, {method} calibration on {calibration}); agreement on {evaluation or 'held-out samples'}"))
    variants = ["fp32", "int8"] if scheme is not None else [precision]
    steps.append(Step("bundle", f"{', '.join(variants)} model(s) + manifest -> {output or 'edgekit-out/'}"))
    steps.append(Step("push", f"to {device} (content-addressed: unchanged files are not sent)"))
    for ds in impl.device_steps(spec, precision):
        steps.append(Step(ds.name, ds.detail))
    if bench:
        for v in variants:
            steps.append(
                Step("bench", f"{v} on {name}: {warmup} warm-up + {iterations} timed runs, threads={threads or 'all'}")
            )
        steps.append(Step("store", "results into the local results database (edgekit results list)"))
    return Plan(
        model=model.name,
        model_path=str(model.path),
        model_sha256=model.sha256,
        inputs=model.inputs,
        profile=profile.name,
        profile_description=profile.description,
        device=device,
        backend=name,
        precision=precision,
        quantize=scheme is not None,
        scheme=scheme,
        method=method,
        calibration=calibration,
        evaluation=evaluation,
        node_counts=counts,
        float_nodes=float_nodes,
        skipped=tuple(skipped),
        notes=tuple(notes),
        steps=tuple(steps),
        options=impl.variant_options(spec, precision),
        probed=facts is not None,
    )
