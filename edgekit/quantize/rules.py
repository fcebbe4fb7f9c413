"""Per-op quantization rules: a registry from op type to a handler ``(node, ctx) -> rule``.

A handler returns a ``NodeRule`` (what of this node becomes int8) or a string: the reason the
node stays float. Handlers read the context; they never edit the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx

from edgekit.quantize.scheme import QuantScheme


@dataclass(frozen=True)
class NodeRule:
    activations: tuple[int, ...] = ()  # input indices that get Q/DQ with their own (calibrated) range
    weight: int | None = None  # input index of a constant weight: int8, symmetric
    weight_axis: int | None = None  # its output-channel axis (None: per tensor)
    bias: int | None = None  # input index of a constant bias: int32 = input scale x weight scale
    output: str = "own"  # "own": output gets its own range; "same": inherits input 0's; "none"


@dataclass
class RuleContext:
    consts: dict[str, np.ndarray]
    elem_types: dict[str, int]
    scheme: QuantScheme

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def is_float(self, name: str) -> bool:
        if name in self.consts:
            return self.consts[name].dtype == np.float32
        return self.elem_types.get(name) == onnx.TensorProto.FLOAT


Handler = Callable[[onnx.NodeProto, RuleContext], "NodeRule | str"]
RULES: dict[str, Handler] = {}


def rule(*op_types: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in op_types:
            RULES[op] = fn
        return fn

    return register


def attr(node: onnx.NodeProto, name: str, default):
    """``node``'s attribute ``name``, or ``default`` when it has none."""
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _weight_axis(ctx: RuleContext, axis: int) -> int | None:
    return axis if ctx.scheme.per_channel else None


def _bias_index(node: onnx.NodeProto, ctx: RuleContext, index: int, channels: int) -> int | None:
    if len(node.input) > index and node.input[index]:
        b = ctx.consts.get(node.input[index])
        if b is not None and b.ndim == 1 and b.shape[0] == channels and b.dtype == np.float32:
            return index
    return None


@rule("Conv", "ConvTranspose")
def conv(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    if not ctx.is_const(node.input[1]):
        return "weights are not constant"
    if node.op_type == "ConvTranspose" and attr(node, "group", 1) != 1:
        return "grouped ConvTranspose has no int8 kernel"
    w = ctx.consts[node.input[1]]
    # Output channels: axis 0 of a Conv weight [C_out, C_in/group, k...], axis 1 of a
    # ConvTranspose's [C_in, C_out/group, k...].
    axis = 1 if node.op_type == "ConvTranspose" else 0
    return NodeRule(activations=(0,), weight=1, weight_axis=_weight_axis(ctx, axis), bias=_bias_index(node, ctx, 2, w.shape[axis]))


@rule("Gemm")
def gemm(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    if attr(node, "alpha", 1.0) != 1.0 or attr(node, "beta", 1.0) != 1.0 or attr(node, "transA", 0):
        return "Gemm with alpha/beta != 1 or transA has no int8 form"
    if not ctx.is_const(node.input[1]):
        return NodeRule(activations=(0, 1))
    w = ctx.consts[node.input[1]]
    if w.ndim != 2:
        return "Gemm weight is not 2-D"
    axis = 0 if attr(node, "transB", 0) else 1
    return NodeRule(activations=(0,), weight=1, weight_axis=_weight_axis(ctx, axis), bias=_bias_index(node, ctx, 2, w.shape[axis]))


@rule("MatMul")
def matmul(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    a_const, b_const = ctx.is_const(node.input[0]), ctx.is_const(node.input[1])
    if a_const and b_const:
        return "both inputs are constant"
    if b_const:
        w = ctx.consts[node.input[1]]
        return NodeRule(activations=(0,), weight=1, weight_axis=_weight_axis(ctx, 1) if w.ndim == 2 else None)
    if a_const:
        return NodeRule(activations=(1,), weight=0, weight_axis=None)
    return NodeRule(activations=(0, 1))


@rule("Add", "Mul")
def elementwise(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    if all(ctx.is_const(i) for i in node.input):
        return "all inputs are constant"
    return NodeRule(activations=tuple(range(len(node.input))))


@rule("Concat")
def concat(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    return NodeRule(activations=tuple(range(len(node.input))))


@rule("AveragePool", "GlobalAveragePool")
def average_pool(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    return NodeRule(activations=(0,))


def passthrough_rule(node: onnx.NodeProto, ctx: RuleContext) -> NodeRule | str:
    """Data movement: int8 in, int8 out with the same scale (the caller checks input 0 is int8)."""
    if node.op_type == "Resize" and attr(node, "mode", b"nearest") not in (b"nearest", "nearest", b"linear", "linear"):
        return "Resize mode other than nearest/linear"
    if node.op_type == "Pad" and attr(node, "mode", b"constant") not in (b"constant", "constant"):
        return "Pad mode other than constant"
    return NodeRule(activations=(0,), output="same")
