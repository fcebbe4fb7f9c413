"""OpenVINO: compiles the QDQ ONNX model on the device (CPU, GPU, NPU, or MYRIAD for an NCS2).

The device's own OpenVINO reads the ONNX file: its ONNX frontend has read opset-13
QuantizeLinear/DequantizeLinear (per-channel axis) since 2021.1, and turns each Q/DQ pair into
a FakeQuantize the CPU and NPU plugins run in int8. edgekit does *not* convert to IR on the
host: an IR written by a newer OpenVINO is not guaranteed to load in an older one (OpenVINO
promises backward compatibility of IR only: old IR on a new runtime), so for a device whose
OpenVINO is older than the host's the ONNX file is the portable artifact.
"""

from __future__ import annotations

from typing import Any

from edgekit.profiles import BackendSpec, Profile
from edgekit.profiles.model import version_tuple
from edgekit.quantize.scheme import OPENVINO, QuantScheme, narrow_weights, saturates_int16
from edgekit.targets.base import Backend, DeviceStep, Verdict, runtime_version

# The agent uses OpenVINO's API 2.0 (openvino.runtime.Core), which arrived in 2022.1.
MIN_VERSION = "2022.1"
# The MYRIAD plugin (Neural Compute Stick 2) shipped for the last time in 2022.3 LTS.
MYRIAD_MAX_VERSION = "2022.3"
# Devices that compute in half precision whatever the model's weights are.
_FP16_DEVICES = ("MYRIAD", "NPU", "GPU")


def device_of(spec: BackendSpec | None) -> str:
    """The OpenVINO device a profile asks for ("CPU" when it names none)."""
    return (spec.device if spec and spec.device else "CPU").upper()


def _primary(device: str) -> str:
    """``HETERO:NPU,CPU`` -> ``NPU``; ``GPU.1`` -> ``GPU``."""
    name = device.split(":", 1)[1] if ":" in device else device
    return name.split(",")[0].split(".")[0]


def _older(version: str, bound: str) -> bool:
    try:
        return version_tuple(version) < version_tuple(bound)
    except ValueError:  # a custom build's version string: don't guess
        return False


class OpenVinoBackend(Backend):
    name = "openvino"
    scheme = OPENVINO
    # Measured (2026.4, CPU): it reads the graph and agrees with the reference, but its runtime model
    # computes those MatMuls and Convs as f32 FullyConnected/Convolution: no int8 to gain.
    no_dynamic = "OpenVINO's CPU plugin runs run-time-quantized MatMulInteger/ConvInteger in f32, not int8; onnxruntime runs it in int8"
    runtimes = ("openvino",)

    def quant_scheme(self, profile: Profile) -> QuantScheme:
        # only the CPU plugin runs VPMADDUBSW kernels; NPU/VPU/GPU plugins have their own int8 paths
        cpu = profile.cpu
        if device_of(profile.backend(self.name)) in ("CPU", "AUTO") and saturates_int16(cpu.arch, cpu.isa):
            return narrow_weights(self.scheme)
        return self.scheme

    def runs_on(self, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().runs_on(profile, facts)
        if not verdict.ok:
            return verdict
        spec = profile.backend(self.name)
        device = device_of(spec)
        version = runtime_version(facts, *self.runtimes)
        reasons: list[str] = []
        if device == "MYRIAD":
            reasons.append("MYRIAD (Myriad X VPU, NCS2) computes in fp16 only, so int8 is refused")
        needs = _bounds(spec, device)
        if version is None:
            if needs:
                reasons.append(f"the device's OpenVINO must be {needs} (planned on paper: not checked yet)")
            return Verdict(True, tuple(reasons))
        seen = ((facts or {}).get("probe") or {}).get("openvino_devices")
        if spec is not None and spec.device and isinstance(seen, list):
            wanted = [p for p in spec.device.replace("HETERO:", "").replace("AUTO:", "").split(",") if p]
            absent = [p for p in wanted if not any(str(x).split(".")[0] == p for x in seen)]
            if absent:
                why = f"OpenVINO sees devices {', '.join(map(str, seen)) or 'none'}, not {', '.join(absent)} (driver or plugin missing)"
                return Verdict(False, (why,), "device")
        if needs:
            reasons.append(f"the device has OpenVINO {version} ({device} needs {needs})")
        host = _host_version()
        if host and _older(version, host):
            reasons.append(
                f"the device's OpenVINO {version} is older than this host's {host}: the bundle carries the ONNX "
                "model for the device's own ONNX frontend, not IR (IR from a newer OpenVINO may not load in an older one)"
            )
        return Verdict(True, tuple(reasons))

    def version_problem(self, profile: Profile, version: str) -> str | None:
        if _older(version, MIN_VERSION):
            return f"the device has OpenVINO {version}; the edgekit agent needs {MIN_VERSION} or newer (API 2.0)"
        spec = profile.backend(self.name)
        device = device_of(spec)
        needs = _bounds(spec, device)
        if needs and not _within(version, spec, device):
            return f"the device has OpenVINO {version}; {device} on {profile.name} needs OpenVINO {needs}"
        return None

    def variant_options(self, spec: BackendSpec | None, precision: str) -> dict[str, Any]:
        device = device_of(spec)
        # f32 on the CPU keeps fp32 runs fp32 (OpenVINO would pick bf16 on CPUs that have it) and
        # keeps an int8 model's remaining float layers in f32, as ONNX Runtime runs them.
        hint = "f16" if precision == "fp16" or _primary(device) in _FP16_DEVICES else "f32"
        return {"device": device, "precision_hint": hint, "cache": True}

    def device_steps(self, spec: BackendSpec | None, precision: str) -> list[DeviceStep]:
        device = device_of(spec)
        return [
            DeviceStep(
                "compile",
                f"OpenVINO compiles each variant for {device} on the device with a model cache "
                "(a compile with an empty cache, then one from the cache: both times are reported)",
            )
        ]


def _limits(spec: BackendSpec | None, device: str) -> BackendSpec:
    """The profile's version bounds, with MYRIAD's own ceiling even when a profile forgets it."""
    low = spec.min_version if spec else None
    high = spec.max_version if spec else None
    if device == "MYRIAD" and (high is None or _older(MYRIAD_MAX_VERSION, high)):
        high = MYRIAD_MAX_VERSION
    return BackendSpec("openvino", ("fp32",), min_version=low, max_version=high)


def _bounds(spec: BackendSpec | None, device: str) -> str:
    """``">= 2023.3"``, ``"<= 2022.3 (the MYRIAD plugin was removed in 2023.0)"``, or "" (any)."""
    text = _limits(spec, device).bounds()
    if device == "MYRIAD":
        text += " (the MYRIAD plugin was removed in 2023.0)"
    return text


def _within(version: str, spec: BackendSpec | None, device: str) -> bool:
    try:
        return _limits(spec, device).version_ok(version)
    except ValueError:  # a custom build's version string: don't refuse on a guess
        return True


def _host_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("openvino")
    except metadata.PackageNotFoundError:
        return None


BACKEND = OpenVinoBackend()
