"""ONNX Runtime: the generic backend. Runs float and QDQ int8 ONNX as they are."""

from __future__ import annotations

from edgekit.modelio import LoadedModel
from edgekit.profiles import Profile
from edgekit.quantize.scheme import ONNXRUNTIME
from edgekit.targets.base import Backend, Verdict

# ONNX Runtime's CPU provider implements the default domain up to this opset in the oldest
# release edgekit supports (1.17: opset 20); newer models need a newer runtime on the device.
MAX_OPSET = 20


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    scheme = ONNXRUNTIME
    runtimes = ("onnxruntime",)

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().supports(model, profile, facts)
        if not verdict.ok:
            return verdict
        if model.opset > MAX_OPSET:
            return Verdict(True, (f"model opset {model.opset} needs onnxruntime newer than 1.17 on the device",))
        return Verdict(True)
BACKEND = OnnxRuntimeBackend()
