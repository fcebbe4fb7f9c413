"""The shape every backend has: what it supports, which scheme it wants, how it runs.

One module per backend subclasses ``Backend``. The planner asks each backend of a profile,
in order, whether it ``supports`` the model on that device (with the device's facts when a
device was probed, else on paper), and takes the first that does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.events import Events
from edgekit.modelio import LoadedModel
from edgekit.profiles import BackendSpec, Profile
from edgekit.quantize.scheme import QuantScheme

if TYPE_CHECKING:
    import onnx

    from edgekit.quantize.rewrite import Analysis


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...] = ()
    # Why not, for a device that can't: arch, missing (the runtime), version, device (e.g. no
    # NPU plugin or driver), model, refused (the device's runtime refused the model at compile).
    # Preflight's hint (provision? upgrade?) depends on it.
    kind: str = ""


@dataclass(frozen=True)
class DeviceStep:
    """A step the plan runs on the device before benchmarking (e.g. a TensorRT engine build)."""

    name: str
    detail: str


def runtime_version(facts: dict | None, *keys: str) -> str | None:
    """The first of ``keys`` the device has installed, from the agent's facts (None: absent)."""
    if not facts:
        return None
    runtimes = (facts.get("device") or facts).get("runtimes") or {}
    return next((runtimes[key] for key in keys if runtimes.get(key)), None)


class Backend:
    """A backend: subclasses set the class attributes and override what differs."""

    name: str = ""
    implemented: bool = True
    scheme: QuantScheme | None = None  # None: takes the model in float only
    archs: tuple[str, ...] = ("x86_64", "aarch64", "armv7l")
    formats: tuple[str, ...] = ("onnx",)  # model file formats it runs
    runtimes: tuple[str, ...] = ()  # facts["device"]["runtimes"] keys; any one present will do
    missing: str = ""  # why, when none of ``runtimes`` is on the device (default: their names)
    evaluates: bool = True  # the agent can run held-out samples through it one by one (Eval steps)
    # Why it cannot run a --method dynamic model (int8 weights, activations quantized at run time:
    # DynamicQuantizeLinear + MatMulInteger/ConvInteger) in int8; "" when it can. The planner skips it.
    no_dynamic: str = "it has no run-time-quantized int8 path"

    def runs_float(self, op_type: str) -> str | None:
        """Why this backend cannot run an ``op_type`` node that mixed precision keeps in float
        between int8 ones (None: it can). ``--max-drop`` only keeps float what it can run."""
        return None

    def quant_scheme(self, profile: Profile) -> QuantScheme | None:
        """The scheme this backend wants on ``profile``'s CPU (resolved with the device's facts once probed)."""
        return self.scheme

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        """Can this backend run ``model`` on ``profile``'s device? ``facts``: the probed device."""
        if model.format not in self.formats:
            return Verdict(False, (f"{self.name} does not run {model.format} models",), "model")
        return self.runs_on(profile, facts)

    def runs_on(self, profile: Profile, facts: dict | None = None) -> Verdict:
        """Can this backend run on ``profile``'s device at all (arch, runtime and its version)?
        The one answer the planner and preflight share; ``facts``: the probed device, or None."""
        if not self.implemented:
            return Verdict(False, (f"the {self.name} backend is not available in this edgekit version",), "unavailable")
        arch = ((facts or {}).get("device") or {}).get("arch") or profile.cpu.arch
        if arch and arch not in self.archs:
            return Verdict(False, (f"{self.name} does not run on {arch}",), "arch")
        refused = ((facts or {}).get("refused") or {}).get(self.name)
        if refused:  # the device's runtime refused this model (deploy's fallback)
            return Verdict(False, (refused,), "refused")
        if facts is None or not self.runtimes:
            return Verdict(True)
        version = runtime_version(facts, *self.runtimes)
        if version is None:
            return Verdict(False, (self.missing or f"{' or '.join(self.runtimes)} is not installed on the device",), "missing")
        problem = self.version_problem(profile, version)
        if problem:
            return Verdict(False, (problem,), "version")
        return Verdict(True)

    def version_problem(self, profile: Profile, version: str) -> str | None:
        """Why the device's runtime ``version`` is outside what ``profile`` allows (None: inside)."""
        spec = profile.backend(self.name)
        if spec is None:
            return None
        try:
            inside = spec.version_ok(version)
        except ValueError:
            return None  # a custom build's version string: don't guess
        if inside:
            return None
        return f"{self.runtimes[0]} {version} is installed; {profile.name} needs {spec.bounds()}"

    def variant_options(self, spec: BackendSpec | None, precision: str) -> dict[str, Any]:
        """Options the agent passes to the runtime for a variant (JSON values)."""
        return {}

    def device_steps(self, spec: BackendSpec | None, precision: str) -> list[DeviceStep]:
        """Extra steps on the device before timing (shown in the plan)."""
        return []

    def compile(self, model_path: Path, out_dir: Path) -> list[Path] | None:
        """Convert a variant's ONNX model into the files the device runs, written in ``out_dir``.

        The first file is the one the agent loads; the others go beside it in the bundle.
        None (the default): the device runs the ONNX file as it is.
        """
        return None

    def variant_backend(self, variant: str, facts: dict | None = None) -> str:
        """The backend that runs ``variant`` ("fp32", "int8") of a plan made for this one
        (``facts``: the probed device). Default: this backend runs every variant."""
        return self.name

    def runtime_files(self, profile: Profile, facts: dict | None, out_dir: Path, events: Events | None = None) -> dict[str, Path]:
        """Files the device needs besides the variants' models (bundle path -> local file),
        e.g. a runner built for the device's arch. ``out_dir``: a scratch directory; ``events``
        hears of a long step (a build)."""
        return {}

    def coverage(self, model: LoadedModel) -> dict | None:
        """Which of ``model``'s nodes this backend runs in int8, in float and not at all (by op type),
        for the plan to show; None: the backend does not say."""
        return None

    def check_plan(self, prepared: onnx.ModelProto, analysis: Analysis) -> list[str]:
        """Notes from checking the planned int8 graph before calibration (e.g. TensorRT's Q/DQ lint)."""
        return []

    def check_quantized(self, model: onnx.ModelProto) -> None:
        """Raise ModelError when the calibrated QDQ model breaks this backend's rules."""


class Unavailable(Backend):
    """A backend a profile may name that this edgekit version cannot use yet."""

    implemented = False

    def __init__(self, name: str) -> None:
        self.name = name
