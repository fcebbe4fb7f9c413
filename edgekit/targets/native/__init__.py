"""The ``native`` backend: edgekit's own int8 runtime, ekrt (docs/ekrt.md).

On the host, the QDQ model is lowered to ``.ekm`` (``lower``) and the static ``ekrt`` runner is
built for the device's arch (``build``); on the device the agent starts the runner, which
needs nothing installed. ekrt runs int8 only: a plan's fp32 variant (the reference the int8
speed is compared with) runs on ONNX Runtime when the device has it, else on the numpy
reference interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgekit.events import Events
from edgekit.modelio import LoadedModel
from edgekit.profiles import BackendSpec, Profile
from edgekit.quantize.scheme import NATIVE, QuantScheme, narrow_weights, saturates_int16
from edgekit.targets.base import Backend, Verdict, runtime_version

EKM_FILE = "model.ekm"
LAYER_NAMES_FILE = "layers.json"  # the agent's native backend reads it (same name there)
RUNNER = "bin/ekrt"


class NativeBackend(Backend):
    name = "native"
    scheme = NATIVE
    no_dynamic = "ekrt has no run-time-quantized int8; onnxruntime runs it"
    archs = ("x86_64", "aarch64")
    runtimes = ()  # the runner is static and travels in the bundle

    def quant_scheme(self, profile: Profile) -> QuantScheme:
        """On x86 without VNNI, 7-bit weights for the convolutions ekrt runs as GEMMs: its AVX2
        kernel for them (VPMADDUBSW, exact for |w| <= 64, picked per op at load) is 1.2-1.9x its
        exact 8-bit one (docs/kernels.md), as ONNX Runtime's and OpenVINO's kernels there need the
        same. Depthwise convolutions keep 8 bits: their kernel is the same on both."""
        cpu = profile.cpu
        return narrow_weights(self.scheme, depthwise=False) if saturates_int16(cpu.arch, cpu.isa) else self.scheme

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().supports(model, profile, facts)
        if not verdict.ok:
            return verdict
        from edgekit.targets.native.build import why_not_buildable
        from edgekit.targets.native.lower import check_lowerable

        reason = check_lowerable(model)
        if reason:
            return Verdict(False, (f"ekrt cannot run it: {reason}",))
        reason = why_not_buildable(_arch(profile, facts))
        if reason:
            return Verdict(False, (reason,))
        return Verdict(True)

    def coverage(self, model: LoadedModel) -> dict | None:
        """ekrt's nodes by how it runs them: int8 ops, int8 tables, float islands, unsupported."""
        from edgekit.targets.native.lower import coverage

        return coverage(model) if model.format == "onnx" else None

    def runs_float(self, op_type: str) -> str | None:
        """ekrt runs float only the ops of its float islands (docs/ekrt.md): no float Conv or Gemm."""
        from edgekit.targets.native.lower.islands import FLOAT_LOWERINGS

        return None if op_type in FLOAT_LOWERINGS else f"ekrt has no float {op_type}"

    def variant_backend(self, variant: str, facts: dict | None = None) -> str:
        """ekrt runs the int8 variant; the fp32 reference runs on ONNX Runtime, or numpy."""
        if variant == "int8":
            return self.name
        if facts is None or runtime_version(facts, "onnxruntime"):
            return "onnxruntime"
        return "numpy" if runtime_version(facts, "numpy") else "onnxruntime"

    def compile(self, model_path: Path, out_dir: Path) -> list[Path]:
        """The QDQ model lowered to ``model.ekm`` in ``out_dir``."""
        from edgekit.targets.native.lower import lower_file

        out_dir.mkdir(parents=True, exist_ok=True)
        ekm_path = out_dir / EKM_FILE
        report = lower_file(model_path, ekm_path)
        # .ekm stores no names: the device's profile names op j by the ONNX node it came from through
        # this list, so per-layer time joins with the quantizer's per-node error and ORT's profile.
        names = out_dir / LAYER_NAMES_FILE
        names.write_text(json.dumps(report.op_names), encoding="utf-8")
        return [ekm_path, names]

    def runtime_files(self, profile: Profile, facts: dict | None, out_dir: Path, events: Events | None = None) -> dict[str, Path]:
        """The ``ekrt`` runner for the device's arch: installed with edgekit, cached, or built now."""
        from edgekit.targets.native.build import build_runner

        return {RUNNER: build_runner(_arch(profile, facts), events=events)}

    def variant_options(self, spec: BackendSpec | None, precision: str) -> dict:
        return {"runner": RUNNER} if precision == "int8" else {}


def _arch(profile: Profile, facts: dict | None) -> str:
    from edgekit.targets.native.build import host_arch

    return ((facts or {}).get("device") or {}).get("arch") or profile.cpu.arch or host_arch()


BACKEND = NativeBackend()
