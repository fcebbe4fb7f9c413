"""QuantScheme: how a backend wants its int8 QDQ model, as a frozen, typed value.

Target differences live here (symmetric or not, per-channel or not, which ops get Q/DQ),
never in a second file format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
# OpenVINO reads QDQ ONNX as FakeQuantize; int8 asymmetric activations are fine on CPU/NPU.
OPENVINO = QuantScheme(name="openvino", notes=("int8 asymmetric activations, per-channel int8 weights",))
# edgekit's own runtime: same as ORT, so ORT on the same QDQ model is its oracle.
NATIVE = QuantScheme(name="native", notes=("int8 asymmetric activations, per-channel int8 weights, int32 bias",))

SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (ONNXRUNTIME, TENSORRT, OPENVINO, NATIVE)}


def scheme_for(backend: str) -> QuantScheme:
    return SCHEMES.get(backend, ONNXRUNTIME)
