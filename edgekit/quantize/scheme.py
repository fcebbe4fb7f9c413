"""QuantScheme: how a backend wants its int8 QDQ model, as a frozen, typed value.

Target differences live here (symmetric or not, per-channel or not, which ops get Q/DQ),
never in a second file format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

# Ops whose int8 form the backends implement (their inputs get Q/DQ, weights are int8).
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul", "Concat", "AveragePool", "GlobalAveragePool"})
# Ops that move or select int8 values without arithmetic: output keeps the input's scale.
PASSTHROUGH_OPS = frozenset({
    "MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Resize", "Identity", "Slice",
    "Split", "Gather", "DepthToSpace", "SpaceToDepth", "Pad",
})
# Activations folded into the producer's output range (the Q after them clamps just the same).
FUSED_ACTIVATIONS = frozenset({"Relu", "Clip"})


@dataclass(frozen=True)
class QuantScheme:
    name: str
    activation_dtype: str = "int8"  # "int8" | "uint8"
    activation_symmetric: bool = False
    per_channel: bool = True  # weights: per output channel (always symmetric int8)
    ops: frozenset[str] = COMPUTE_OPS
    passthrough: frozenset[str] = PASSTHROUGH_OPS
    min_opset: int = 13  # per-channel DequantizeLinear (axis) needs opset 13
    # int32 bias through DequantizeLinear (input scale x weight scale); False keeps bias float,
    # for runtimes that fold the bias themselves and reject an int32 DequantizeLinear (TensorRT).
    quantize_bias: bool = True
    weight_qmax: int = 127  # 63: 7-bit weights, for x86 int8 kernels without VNNI (narrow_weights)
    # a depthwise Conv's weights, where they differ (weight_qmax_of): ekrt's depthwise kernels sum
    # int16 pairs on every ISA, so narrowing them would cost accuracy for no speed
    depthwise_weight_qmax: int | None = None
    # the 7-bit weights only buy speed (a runtime exact on 8-bit ones too: ekrt): quantize_model
    # tries 8-bit weights when the 7-bit model misses its held-out check
    seven_bit_for_speed: bool = False
    # A Gather from a constant float table (a word-embedding matrix) as int8: the table stored int8
    # (one scale), the rows it selects keep that scale (DQ -> Gather -> Q, which the runtime runs
    # as an int8 Gather). For runtimes whose QDQ passes do that (ONNX Runtime, OpenVINO).
    int8_tables: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = sorted(self.ops)
        d["passthrough"] = sorted(self.passthrough)
        d["notes"] = list(self.notes)
        return d


# ONNX Runtime CPU: int8 activations (asymmetric) x int8 weights; the S8S8 QDQ format is
# what ORT recommends on x86-64 and ARM (U8S8 can saturate in VNNI-less AVX2 paths).
ONNXRUNTIME = QuantScheme(
    name="onnxruntime",
    int8_tables=True,
    notes=("int8 asymmetric activations, per-channel symmetric int8 weights, int32 bias",),
)
# TensorRT explicit quantization: symmetric int8, zero point 0 everywhere.
TENSORRT = QuantScheme(
    name="tensorrt",
    activation_symmetric=True,
    # TensorRT's ONNX parser takes DequantizeLinear of int8 (fp8/int4) only: an int32 bias DQ fails
    # with "only activation types allowed as input to this layer"; its int8 kernels add a float bias.
    quantize_bias=False,
    notes=("TensorRT Q/DQ: symmetric int8, zero point 0, per-channel weights on the output-channel axis, float bias",),
)
# OpenVINO reads QDQ ONNX as FakeQuantize and its low-precision transformations pick u8 or i8 per
# tensor; NNCF and OpenVINO's own int8 models use uint8 (asymmetric) activations with symmetric int8
# weights, the pair its CPU kernels are built around. Signed int8 activations are refused outright
# by 2026.4's CPU plugin on AMX Xeons ("No suitable implementations"), and on a 2-core AMX VM it
# compiled them but ran the digits convolutions in f32 (brgconv_avx512_f32) where uint8 ran
# brgconv_avx512_amx_I8 (tests/test_openvino.py). No device fact shows a plugin that does better
# with int8 activations, so uint8 is the scheme for every OpenVINO device.
OPENVINO = QuantScheme(
    name="openvino",
    activation_dtype="uint8",
    int8_tables=True,
    notes=("uint8 asymmetric activations (as NNCF and OpenVINO's own int8 models), per-channel symmetric int8 weights",),
)
# edgekit's own runtime: same as ORT, so ORT on the same QDQ model is its oracle.
NATIVE = QuantScheme(name="native", notes=("int8 asymmetric activations, per-channel int8 weights, int32 bias",))

# x86 int8 kernels without VNNI (AVX2; AVX-512 before VNNI) multiply uint8 x int8 pairs with
# VPMADDUBSW, whose int16 sum of two products saturates: 255 x 127 x 2 > 32767. ONNX Runtime's
# CPU provider (it shifts int8 activations to uint8 for this kernel) and OpenVINO's CPU plugin
# both use it there. 7-bit weights (|q| <= 63) keep every pair inside int16: 255 x 63 x 2 = 32130.
# ORT calls this reduce_range, OpenVINO's NNCF overflow_fix. With VNNI (VPDPBUSD sums in int32)
# the full 8-bit range is safe.
X86_ARCHS = ("x86_64", "amd64", "i686", "i386", "x86")
VNNI = ("avx512_vnni", "avx_vnni")


def saturates_int16(arch: str | None, isa: tuple[str, ...] | list[str]) -> bool:
    """Does this CPU's int8 dot product go through a saturating int16 sum (x86 without VNNI)?"""
    return (arch or "").lower() in X86_ARCHS and not any(f in isa for f in VNNI)


def narrow_weights(scheme: QuantScheme, depthwise: bool = True) -> QuantScheme:
    """``scheme`` with 7-bit weights, so a VPMADDUBSW kernel cannot saturate; ``depthwise=False``
    keeps depthwise convolutions' weights 8-bit (for a runtime whose depthwise kernel is exact on
    them at the same speed: ekrt)."""
    if depthwise:
        note = "7-bit weights (|q| <= 63): this x86 CPU has no VNNI, and its int8 kernels sum pairs in a saturating int16"
        return replace(scheme, weight_qmax=63, notes=(*scheme.notes, note))
    note = ("7-bit weights (|q| <= 63) on convolutions and matrix products, 8-bit on depthwise ones: this x86 CPU has "
            "no VNNI, and ekrt's AVX2 kernel for 7-bit weights (VPMADDUBSW) is ~1.2-1.9x its exact 8-bit one")
    return replace(scheme, weight_qmax=63, depthwise_weight_qmax=scheme.weight_qmax, seven_bit_for_speed=True, notes=(*scheme.notes, note))


def weight_qmax_of(scheme: QuantScheme, node, shape: tuple[int, ...]) -> int:
    """The largest |q| of ``node``'s weight (of ``shape``): ``depthwise_weight_qmax`` for a
    depthwise Conv (one input channel per group, a group per output channel), where it is set."""
    if scheme.depthwise_weight_qmax is not None and node.op_type == "Conv" and len(shape) >= 2 and shape[1] == 1:
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        if group > 1 and group == shape[0]:
            return scheme.depthwise_weight_qmax
    return scheme.weight_qmax


SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (ONNXRUNTIME, TENSORRT, OPENVINO, NATIVE)}
