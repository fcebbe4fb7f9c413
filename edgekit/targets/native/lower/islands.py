"""Float islands: a node with no int8 lowering runs in float32 (docs/ekrt.md "Float islands").

``Lowerer.materialize`` falls back here when an op's int8 lowering raises: the node's float
inputs come from DEQUANTIZE of the int8 tensors they read (or are constants / graph inputs, or
float nodes before it, lowered the same way), and its value is QUANTIZEd with the params of
the QuantizeLinear after it, so the int8 consumers see what the QDQ model gives them.
``FLOAT_LOWERINGS`` (op type -> function) is the single list of what runs in float; each
function returns the float tensor of the output ``lw.asked``."""

from __future__ import annotations

import numpy as np
import onnx

from edgekit.targets.native import ekm
from edgekit.targets.native.lower.walk import (
    FT,
    FloatLowering,
    Lowerer,
    LoweringError,
    attrs,
    where,
)


def _out(lw: Lowerer, node: onnx.NodeProto, type_: int, inputs: list[FT], shape, params=None, suffix: str = "") -> FT:
    if len(shape) > ekm.MAX_RANK or any(len(x.shape) > ekm.MAX_RANK for x in inputs):
        raise LoweringError(f"{where(node)}: a float tensor of rank > {ekm.MAX_RANK}", f"ekrt's float islands hold tensors of rank <= {ekm.MAX_RANK}")
    y = lw.new_f32(tuple(shape))
    lw.op(type_, [x.index for x in inputs], y.index, params, node.name + suffix)
    return y


def binary(lw: Lowerer, node: onnx.NodeProto, a: FT, b: FT, func: str, suffix: str = "") -> FT:
    try:
        shape = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise LoweringError(f"{where(node)}: shapes {a.shape} and {b.shape} do not broadcast", "check the model") from None
    return _out(lw, node, ekm.F_BINARY, [a, b], shape, {0: ekm.BINARY_FUNCS.index(func)}, suffix)


def lower_f_binary(lw: Lowerer, node: onnx.NodeProto) -> FT:
    xs = [lw.float_value(i) for i in node.input if i]
    sum_ = node.op_type == "Sum"
    y = xs[0]
    for k, x in enumerate(xs[1:]):  # Max / Min / Sum of more than two inputs: a chain
        y = binary(lw, node, y, x, "Add" if sum_ else node.op_type, f"__{k}" if sum_ or len(xs) > 2 else "")
    return y


_UNARY_DEFAULTS = {"HardSigmoid": (0.2, 0.5), "LeakyRelu": (0.01, 0.0)}


def lower_f_unary(lw: Lowerer, node: onnx.NodeProto) -> FT:
    x = lw.float_value(node.input[0])
    op = node.op_type
    a = attrs(node)
    if op == "Gelu" and a.get("approximate", b"none") not in (b"none", "none"):
        raise LoweringError(f"{where(node)}: Gelu approximate={a['approximate']!r}", "ekrt runs the exact Gelu in float")
    alpha, beta = _UNARY_DEFAULTS.get(op, (0.0, 0.0))
    alpha, beta = float(a.get("alpha", alpha)), float(a.get("beta", beta))
    return _out(lw, node, ekm.F_UNARY, [x], x.shape, {0: ekm.UNARY_FUNCS.index(op), 1: ekm.float_bits(alpha), 2: ekm.float_bits(beta)})


def _scalar(lw: Lowerer, value: float, name: str) -> FT:
    return FT(lw.const(ekm.F32, np.float32(value).reshape(()), name), (1,))


def lower_f_clip(lw: Lowerer, node: onnx.NodeProto) -> FT:
    y = lw.float_value(node.input[0])
    a = attrs(node)
    lo, hi = a.get("min"), a.get("max")
    if len(node.input) > 1 and node.input[1]:
        lo = float(lw.float_const(node.input[1]).reshape(()))
    if len(node.input) > 2 and node.input[2]:
        hi = float(lw.float_const(node.input[2]).reshape(()))
    if lo is not None:
        y = binary(lw, node, y, _scalar(lw, lo, node.name + "__min"), "Max", "__min")
    if hi is not None:
        y = binary(lw, node, y, _scalar(lw, hi, node.name + "__max"), "Min", "__max")
    return y


def _reshape(lw: Lowerer, node: onnx.NodeProto, x: FT, shape, suffix: str = "") -> FT:
    shape = tuple(shape)
    if shape == x.shape:
        return x
    return _out(lw, node, ekm.RESHAPE, [x], shape, {0: 0}, suffix)


def lower_f_reshape(lw: Lowerer, node: onnx.NodeProto) -> FT:
    """Reshape / Flatten / Squeeze / Unsqueeze / Identity / a Cast to float: the same values."""
    if node.op_type == "Cast" and attrs(node).get("to") not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise LoweringError(f"{where(node)} casts to {onnx.TensorProto.DataType.Name(attrs(node).get('to'))}", "ekrt's islands are float32")
    return _reshape(lw, node, lw.float_value(node.input[0]), lw.shape(node.output[0], node))


def lower_f_transpose(lw: Lowerer, node: onnx.NodeProto) -> FT:
    x = lw.float_value(node.input[0])
    perm = list(attrs(node).get("perm", range(len(x.shape) - 1, -1, -1)))
    return _out(lw, node, ekm.TRANSPOSE, [x], tuple(x.shape[p] for p in perm), dict(enumerate(perm)))


def lower_f_reduce(lw: Lowerer, node: onnx.NodeProto) -> FT:
    x = lw.float_value(node.input[0])
    a = attrs(node)
    rank = len(x.shape)
    if len(node.input) > 1 and node.input[1]:
        if not lw.is_const(node.input[1]):
            raise LoweringError(f"{where(node)}: axes are not constant", "ekrt reduces over static axes")
        axes = [int(v) for v in lw.consts[node.input[1]].reshape(-1)]
    else:
        axes = list(a.get("axes", []))
    if not axes and a.get("noop_with_empty_axes", 0):
        return x
    if node.op_type == "GlobalMaxPool":
        axes = list(range(2, rank))
    axes = sorted({ax % rank for ax in axes} if axes else set(range(rank)))
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    y = _out(lw, node, ekm.F_REDUCE, [x], kept, {0: ekm.REDUCE_FUNCS.index(node.op_type.replace("GlobalMaxPool", "ReduceMax")), 1: sum(1 << ax for ax in axes)})
    return _reshape(lw, node, y, lw.shape(node.output[0], node), "__shape")


def lower_f_expand(lw: Lowerer, node: onnx.NodeProto) -> FT:
    """Expand: x * 1 written into the broadcast shape (F_BINARY's output may be the larger one)."""
    x = lw.float_value(node.input[0])
    shape = tuple(lw.shape(node.output[0], node))
    return _out(lw, node, ekm.F_BINARY, [x, _scalar(lw, 1.0, node.name + "__one")], shape, {0: ekm.BINARY_FUNCS.index("Mul")})


def lower_f_matmul(lw: Lowerer, node: onnx.NodeProto) -> FT:
    a, b = lw.float_value(node.input[0]), lw.float_value(node.input[1])
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise LoweringError(f"{where(node)}: a rank-1 operand ({a.shape} x {b.shape})", "ekrt's float MatMul takes operands of rank 2..4")
    out = lw.shape(node.output[0], node)
    y = _out(lw, node, ekm.F_MATMUL, [a, b], (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]))
    return _reshape(lw, node, y, out, "__shape")


def lower_f_softmax(lw: Lowerer, node: onnx.NodeProto) -> FT:
    x = lw.float_value(node.input[0])
    rank = len(x.shape)
    axis = attrs(node).get("axis", -1 if lw.opset >= 13 else 1) % rank
    if lw.opset < 13 and axis != rank - 1:
        raise LoweringError(f"{where(node)}: opset-{lw.opset} Softmax over axes {axis}.. (flattened)", "export with opset >= 13")
    if axis == rank - 1:
        return _out(lw, node, ekm.F_SOFTMAX, [x], x.shape)
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]  # a swap is its own inverse
    moved = _out(lw, node, ekm.TRANSPOSE, [x], tuple(x.shape[p] for p in perm), dict(enumerate(perm)), "__in")
    sm = _out(lw, node, ekm.F_SOFTMAX, [moved], moved.shape, suffix="__softmax")
    return _out(lw, node, ekm.TRANSPOSE, [sm], x.shape, dict(enumerate(perm)))


def lower_f_concat(lw: Lowerer, node: onnx.NodeProto) -> FT:
    xs = [lw.float_value(i) for i in node.input if i]
    shape = lw.shape(node.output[0], node)
    axis = attrs(node)["axis"] % len(shape)
    return _out(lw, node, ekm.CONCAT, xs, shape, {0: axis})


def lower_f_batchnorm(lw: Lowerer, node: onnx.NodeProto) -> FT:
    """Inference BatchNormalization: x * s + t with s, t per channel (axis 1), folded at lowering."""
    x = lw.float_value(node.input[0])
    if not all(lw.is_const(i) for i in node.input[1:5]):
        raise LoweringError(f"{where(node)}: statistics are not constant", "ekrt runs inference BatchNormalization")
    g, b, mean, var = (lw.float_const(i).astype(np.float64) for i in node.input[1:5])
    eps = float(attrs(node).get("epsilon", 1e-5))
    s = g / np.sqrt(var + eps)
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    sc = FT(lw.const(ekm.F32, s.reshape(shape), node.name + "__scale"), tuple(s.reshape(shape).shape))
    sh = FT(lw.const(ekm.F32, (b - mean * s).reshape(shape), node.name + "__shift"), sc.shape)
    return binary(lw, node, binary(lw, node, x, sc, "Mul", "__scale"), sh, "Add")


FLOAT_LOWERINGS: dict[str, FloatLowering] = {
    **{op: lower_f_binary for op in ekm.BINARY_FUNCS},
    "Sum": lower_f_binary,
    **{op: lower_f_unary for op in ekm.UNARY_FUNCS},
    "Clip": lower_f_clip,
    **{op: lower_f_reshape for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast")},
    "Transpose": lower_f_transpose,
    "Concat": lower_f_concat,
    **{op: lower_f_reduce for op in (*ekm.REDUCE_FUNCS, "GlobalMaxPool")},
    "Expand": lower_f_expand,
    "MatMul": lower_f_matmul,
    "Softmax": lower_f_softmax,
    "BatchNormalization": lower_f_batchnorm,
}
