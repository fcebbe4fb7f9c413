"""ONNX Runtime: the generic backend. Runs float and QDQ int8 ONNX as they are."""

from __future__ import annotations

from dataclasses import replace

from edgekit.modelio import LoadedModel
from edgekit.profiles import Profile
from edgekit.quantize.scheme import (
    ONNXRUNTIME,
    X86_ARCHS,
    QuantScheme,
    narrow_weights,
    saturates_int16,
)
from edgekit.targets.base import Backend, Verdict

# ONNX Runtime's CPU provider implements the default domain up to this opset in the oldest
# release edgekit supports (1.17: opset 20); newer models need a newer runtime on the device.
MAX_OPSET = 20


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    scheme = ONNXRUNTIME
    runtimes = ("onnxruntime",)
    no_dynamic = ""  # fuses them into DynamicQuantizeMatMul (ConvInteger as it is)

    def quant_scheme(self, profile: Profile) -> QuantScheme:
        cpu = profile.cpu
        if cpu.arch.lower() not in X86_ARCHS:
            return self.scheme  # ARM: S8S8, which ORT's ARM kernels run as they are
        # On x86 ORT fuses uint8-activation Q/DQ into QLinearConv/QLinearAdd; with int8 activations
        # its optimiser leaves depthwise Conv and Add in float between Q/DQ pairs (counted in
        # tests/test_scheme_cpu.py), which runs slower than fp32.
        scheme = replace(self.scheme, activation_dtype="uint8", notes=("uint8 asymmetric activations (ORT's x86 kernels fuse them), per-channel symmetric int8 weights, int32 bias",))
        return narrow_weights(scheme) if saturates_int16(cpu.arch, cpu.isa) else scheme

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        verdict = super().supports(model, profile, facts)
        if verdict.ok and model.opset > MAX_OPSET:
            return Verdict(True, (f"model opset {model.opset} needs onnxruntime newer than 1.17 on the device",))
        return verdict
BACKEND = OnnxRuntimeBackend()
