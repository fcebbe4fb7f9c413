"""One lowering function per ONNX op, and ``LOWERINGS`` (op type -> function): the single list of
what ekrt runs. A function gets the node, the params its output must have (``want``, None: its
natural params) and a clamp (``act``), and returns the int8 tensor holding that output."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgekit.quantize import qmath
from edgekit.targets.native import ekm
from edgekit.targets.native.lower.lut import ELEMENTWISE, lower_lut, lut_cone
from edgekit.targets.native.lower.movement import (
    as_view,
    lower_pad,
    lower_slice,
    lower_split,
    moved_input,
    spatial_zero_pad,
    view_of,
)
from edgekit.targets.native.lower.walk import (
    ADD_LEFT_SHIFT,
    NHWC,
    QT,
    SOFTMAX_SCALE,
    SOFTMAX_ZP,
    Lowerer,
    Lowering,
    LoweringError,
    QParams,
    attrs,
    channel_vector,
    stored,
    text,
    where,
)
from edgekit.targets.native.requant import quantize_multiplier


def _padding(node: onnx.NodeProto, in_hw: tuple[int, int], kernel: tuple[int, int],
             strides: tuple[int, int], dilations: tuple[int, int], out_hw: tuple[int, int]) -> list[int]:
    a = attrs(node)
    auto = text(a.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", ""):
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if len(pads) != 4:
            raise LoweringError(f"{where(node)} has pads {pads}", "ekrt runs 2-D convolutions and pools")
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = [0, 0, 0, 0]
        for d in range(2):
            total = max(0, (out_hw[d] - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_hw[d])
            small, big = total // 2, total - total // 2
            pads[d], pads[d + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    # ceil_mode (pools): pad the end so the window count matches the output size
    for d in range(2):
        need = (out_hw[d] - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1 - in_hw[d] - pads[d]
        if need > pads[d + 2]:
            if node.op_type == "AveragePool" and a.get("count_include_pad", 0):
                raise LoweringError(f"{where(node)}: ceil_mode with count_include_pad", "ekrt does not run that combination")
            pads[d + 2] = need
    if any(p < 0 for p in pads):
        raise LoweringError(f"{where(node)} has negative pads {pads}", "ekrt does not crop inside convolutions")
    return pads


def lower_conv(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    folded = spatial_zero_pad(lw, node.input[0])
    extra = [0, 0, 0, 0]
    if folded is not None:  # Pad(0) -> Conv: the conv pads with the zero point itself
        src, q, extra = folded
        x = lw.materialize(src, q)
    else:
        x = lw.input_i8(node, 0)
    if len(x.shape) != 4:
        raise LoweringError(f"{where(node)} is {len(x.shape) - 2}-D", "ekrt runs 2-D convolutions only")
    wname = node.input[1]
    if wname not in lw.qconsts:
        raise LoweringError(f"{where(node)}: the weight is not an int8 constant", "quantize the model with edgekit")
    w = lw.qconsts[wname]
    if np.any(w.zp != 0) or w.q.dtype != np.int8:
        raise LoweringError(f"{where(node)}: weights are not symmetric int8", "quantize with edgekit (symmetric int8 weights)")
    a = attrs(node)
    m_out, cpg, kh, kw = w.q.shape
    group = int(a.get("group", 1))
    strides = tuple(a.get("strides", (1, 1)))
    dil = tuple(a.get("dilations", (1, 1)))
    out_shape = lw.shape(node.output[0], node)
    n, c, h, wd = x.shape
    if c != cpg * group or m_out % group:
        raise LoweringError(f"{where(node)}: {c} input channels do not fit weight {w.q.shape} with group {group}", "check the model")
    pads = _padding(node, (h + extra[0] + extra[2], wd + extra[1] + extra[3]), (kh, kw), strides, dil, out_shape[2:])
    pads = [p + e for p, e in zip(pads, extra)]
    s_w = np.broadcast_to(w.scale.astype(np.float64), (m_out,))
    real = np.float64(x.q.scale) * s_w / np.float64(want.scale)
    bias = _bias(lw, node, m_out)
    wt = w.q.transpose(0, 2, 3, 1)  # [M][KH][KW][C/group]
    mult, shift = lw.requant_params(real)
    out = lw.new_i8(out_shape, want)
    amin, amax = lw.act_range(want, act)
    params = {0: kh, 1: kw, 2: strides[0], 3: strides[1], 4: dil[0], 5: dil[1],
              6: pads[0], 7: pads[1], 8: pads[2], 9: pads[3], 10: group, 11: amin, 12: amax}
    lw.op(ekm.CONV2D, [x.index, lw.const(ekm.I8, wt, wname), lw.const(ekm.I32, _fit_bias(bias, wt)), mult, shift], out.index, params, node.name)
    return out


def _bias(lw: Lowerer, node: onnx.NodeProto, n: int) -> np.ndarray:
    """Input 2, the int32 bias of ``n`` output channels (zeros when the node has none)."""
    if len(node.input) < 3 or not node.input[2]:
        return np.zeros(n, np.int32)
    b = lw.qconsts.get(node.input[2])
    if b is None or b.q.dtype != np.int32 or b.q.size != n:
        raise LoweringError(f"{where(node)}: the bias is not an int32 constant of {n} values", "quantize the model with edgekit")
    return b.q.reshape(n).astype(np.int32)


def _fit_bias(bias: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The bias within the runtime's accumulator bound, |bias| + 256 * sum|w| < 2^31 per output
    channel. Only a bias the quantizer saturated (a large float bias over a near-zero weight row:
    s_x * s_w tiny) is out of it; moving it by at most 256 * sum|w| accumulator steps changes the
    channel's real value by under 2^-15 of itself, and its output is saturated either way."""
    room = (2**31 - 1) - 256 * np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).sum(axis=1)
    return np.clip(bias.astype(np.int64), -room, room).astype(np.int32)


def lower_gemm(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    a = attrs(node)
    if node.op_type == "Gemm" and (a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0 or a.get("transA", 0)):
        raise LoweringError(f"{where(node)} has alpha/beta != 1 or transA", "ekrt runs plain x @ W + b")
    wname = node.input[1]
    if wname not in lw.qconsts:
        raise LoweringError(f"{where(node)}: the weight is not an int8 constant", "ekrt runs a fully connected layer with constant int8 weights")
    w = lw.qconsts[wname]
    if w.q.ndim != 2 or w.q.dtype != np.int8 or np.any(w.zp != 0):
        raise LoweringError(f"{where(node)}: the weight is not a 2-D symmetric int8 matrix", "quantize with edgekit")
    trans_b = node.op_type == "Gemm" and a.get("transB", 0)
    wq = w.q if trans_b else w.q.T  # [N][K]
    n_out, k = wq.shape
    rows = int(np.prod(x.shape[:-1]))
    if x.shape[-1] != k or (len(x.shape) == 4 and rows != 1):
        raise LoweringError(f"{where(node)}: input shape {x.shape} is not [..., {k}]", "ekrt runs fully connected layers over the rows of a rank <= 3 tensor")
    axis = w.axis if w.axis is None or w.axis >= 0 else w.axis + 2
    if w.scale.size > 1 and axis != (0 if trans_b else 1):
        raise LoweringError(f"{where(node)}: weight scales are not per output channel", "quantize with edgekit")
    s_w = np.broadcast_to(w.scale.reshape(-1).astype(np.float64), (n_out,))
    real = np.float64(x.q.scale) * s_w / np.float64(want.scale)
    bias = _bias(lw, node, n_out) if node.op_type == "Gemm" else np.zeros(n_out, np.int32)
    out_shape = lw.shape(node.output[0], node)
    mult, shift = lw.requant_params(real)
    if rows > 1 and len(x.shape) != 2:  # MatMul of [.., M, K] by a constant: the M rows as a batch
        flat = lw.new_i8((rows, k), x.q)  # the same bytes (rank <= 3 is stored as it is)
        lw.op(ekm.RESHAPE, [x.index], flat.index, {0: 0}, node.name + "__rows")
        x = flat
    out = lw.new_i8(out_shape if rows == 1 or len(out_shape) == 2 else (rows, n_out), want)
    amin, amax = lw.act_range(want, act)
    lw.op(ekm.FULLY_CONNECTED, [x.index, lw.const(ekm.I8, wq, wname), lw.const(ekm.I32, _fit_bias(bias, wq)), mult, shift], out.index, {11: amin, 12: amax}, node.name)
    if out.shape != tuple(out_shape):
        shaped = lw.new_i8(out_shape, want)
        lw.op(ekm.RESHAPE, [out.index], shaped.index, {0: 0}, node.name + "__shape")
        out = shaped
    return out


def _operand(lw: Lowerer, node: onnx.NodeProto, i: int, out_shape) -> tuple[QT | None, tuple]:
    """An Add/Mul operand as an int8 tensor: activations as they are, constants quantized."""
    name = node.input[i]
    if not lw.is_const(name):
        qt = lw.input_i8(node, i)
        return qt, qt.shape
    if name in lw.qconsts and lw.qconsts[name].q.dtype == np.int8 and lw.qconsts[name].scale.size == 1:
        c = lw.qconsts[name]
        q, qp = c.q, QParams(float(c.scale.reshape(())), int(c.zp.reshape(())))
    else:
        v = lw.float_const(name)
        qp = lw.natural(v)
        q = qmath.quantize(v, qp.scale, qp.zp, "int8")
    shape = tuple(q.shape)
    if shape == tuple(out_shape):
        data = q.transpose(NHWC) if len(shape) == 4 else q
        dims = stored(shape)
    elif channel_vector(shape, out_shape):
        data = q.reshape(-1)
        dims = (1, 1, 1, out_shape[1]) if len(out_shape) == 4 else (1,) * (len(out_shape) - 1) + (out_shape[-1],)
    else:
        return None, shape
    idx = lw.m.add_tensor(ekm.Tensor(ekm.I8, ekm.CONST, dims, qp.scale, qp.zp, data=np.ascontiguousarray(data).reshape(dims), name=name))
    lw.report.const_bytes += data.size
    return QT(idx, shape, qp), shape


def lower_binary(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    consts = [lw.is_const(i) for i in node.input]
    if any(consts) and _scalar_const(lw, node):
        return lower_lut(lw, node, want, act)
    if all(consts):
        raise LoweringError(f"{where(node)} has only constant inputs", "fold it (onnxsim) first")
    if lut_cone(lw, node.output[0]) is not None:  # e.g. x * relu6(x + 3): a function of x alone
        return lower_lut(lw, node, want, act)
    if node.op_type not in ("Add", "Mul"):
        raise LoweringError(f"{where(node)}: {node.op_type} of two tensors", "ekrt runs Add and Mul of two int8 tensors; Sub/Div only by a constant")
    want = lw.want_or_fail(node, want)
    out_shape = lw.shape(node.output[0], node)
    a, a_shape = _operand(lw, node, 0, out_shape)
    b, b_shape = _operand(lw, node, 1, out_shape)
    if a is None or b is None:
        raise LoweringError(f"{where(node)}: shapes {a_shape} and {b_shape} broadcast in a way ekrt does not run", "ekrt broadcasts only a per-channel operand")
    if tuple(a_shape) != tuple(out_shape):
        a, b, a_shape, b_shape = b, a, b_shape, a_shape
    if tuple(a_shape) != tuple(out_shape):
        raise LoweringError(f"{where(node)}: neither input has the output's shape {out_shape}", "ekrt broadcasts only a per-channel operand")
    if tuple(b_shape) != tuple(out_shape) and not channel_vector(b_shape, out_shape):
        raise LoweringError(f"{where(node)}: {b_shape} broadcasts over {out_shape} other than per channel", "ekrt broadcasts only a per-channel operand")
    out = lw.new_i8(out_shape, want)
    amin, amax = lw.act_range(want, act)
    if node.op_type == "Add":
        twice_max = 2.0 * max(a.q.scale, b.q.scale)
        ma, sa = quantize_multiplier(a.q.scale / twice_max)
        mb, sb = quantize_multiplier(b.q.scale / twice_max)
        mo, so = quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * want.scale))
        params = {0: ma, 1: sa, 2: mb, 3: sb, 4: ADD_LEFT_SHIFT, 5: mo, 6: so, 11: amin, 12: amax}
        lw.op(ekm.ADD, [a.index, b.index], out.index, params, node.name)
    else:
        m_, s_ = quantize_multiplier(a.q.scale * b.q.scale / want.scale)
        lw.op(ekm.MUL, [a.index, b.index], out.index, {0: m_, 1: s_, 11: amin, 12: amax}, node.name)
    return out


def _scalar_const(lw: Lowerer, node: onnx.NodeProto) -> bool:
    """One non-constant input (or the same one twice) and constants of one value each."""
    live = {i for i in node.input if i and not lw.is_const(i)}
    return len(live) == 1 and all(lw.float_const(i).size == 1 for i in node.input if i and lw.is_const(i))


def lower_relu_clip(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """Relu / Clip after an integer op fold into its clamp; after an int8 tensor they are a LUT."""
    src = node.input[0]
    parent = lw.producer.get(src)
    if src in lw.alias or (parent is not None and parent.op_type in ELEMENTWISE and lut_cone(lw, src) is not None):
        return lower_lut(lw, node, want, act)
    if node.op_type == "Relu":
        lo, hi = 0.0, math.inf
    else:
        a = attrs(node)
        lo, hi = a.get("min", -math.inf), a.get("max", math.inf)
        if len(node.input) > 1 and node.input[1]:
            lo = float(lw.float_const(node.input[1]).reshape(()))
        if len(node.input) > 2 and node.input[2]:
            hi = float(lw.float_const(node.input[2]).reshape(()))
    if act is not None:
        lo, hi = max(lo, act[0]), min(hi, act[1])
    return lw.materialize(src, want, (lo, hi))


def lower_concat(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    ins = [lw.input_i8(node, i) for i in range(len(node.input))]
    if len(ins) > ekm.MAX_OP_INPUTS:
        raise LoweringError(f"{where(node)} concatenates {len(ins)} tensors", "ekrt concatenates up to 8")
    want = want or (ins[0].q if all(t.q == ins[0].q for t in ins) else lw.want_or_fail(node, None))
    out_shape = lw.shape(node.output[0], node)
    axis = attrs(node)["axis"] % len(out_shape)
    axis = NHWC.index(axis) if len(out_shape) == 4 else axis
    params = {0: axis}
    for k, t in enumerate(ins):
        params[1 + 2 * k], params[2 + 2 * k] = quantize_multiplier(t.q.scale / want.scale)
    out = lw.new_i8(out_shape, want)
    lw.op(ekm.CONCAT, [t.index for t in ins], out.index, params, node.name)
    return lw.requant(out, None, act, node.output[0])


def _pool_params(node: onnx.NodeProto, x: QT, out_shape, extra=(0, 0, 0, 0)) -> dict[int, int]:
    """Kernel, strides and pads of a 2-D pool; ``extra``: pads of a Pad folded into it."""
    a = attrs(node)
    if len(x.shape) != 4:
        raise LoweringError(f"{where(node)} is not 2-D", "ekrt runs 2-D pools only")
    kernel = tuple(a["kernel_shape"])
    strides = tuple(a.get("strides", (1, 1)))
    if tuple(a.get("dilations", (1, 1))) != (1, 1) or a.get("storage_order", 0):
        raise LoweringError(f"{where(node)} has dilations or column-major storage", "ekrt pools have dilation 1")
    in_hw = (x.shape[2] + extra[0] + extra[2], x.shape[3] + extra[1] + extra[3])
    pads = [p + e for p, e in zip(_padding(node, in_hw, kernel, strides, (1, 1), out_shape[2:]), extra)]
    return {0: kernel[0], 1: kernel[1], 2: strides[0], 3: strides[1], 6: pads[0], 7: pads[1], 8: pads[2], 9: pads[3]}


def lower_maxpool(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    if len(node.output) > 1 and node.output[1]:
        raise LoweringError(f"{where(node)} returns indices", "ekrt's MaxPool returns values only")
    # max commutes with a monotone quantization: quantize first (float islands), then pool
    x = moved_input(lw, node, want, act)
    out_shape = lw.shape(node.output[0], node)
    params = _pool_params(node, x, out_shape)
    params.update({4: 1, 5: 1})
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.MAXPOOL, [x.index], out.index, params, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_avgpool(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    want = lw.want_or_fail(node, want)
    out_shape = lw.shape(node.output[0], node)
    folded = _avgpool_pad_fold(lw, node, out_shape)
    x = folded[0] if folded else lw.input_i8(node, 0)
    out = lw.new_i8(out_shape, want)
    if node.op_type == "GlobalAveragePool":  # never folded: only an AveragePool takes a Pad in
        if len(x.shape) != 4:
            raise LoweringError(f"{where(node)} is not 2-D", "ekrt runs 2-D pools only")
        hw = x.shape[2] * x.shape[3]
        m_, s_ = quantize_multiplier(x.q.scale / (want.scale * hw))
        lw.op(ekm.GLOBAL_AVGPOOL, [x.index], out.index, {0: m_, 1: s_}, node.name)
    else:
        params = folded[1] if folded else _pool_params(node, x, out_shape)
        if not folded:
            params.update({4: 1, 5: 1, 10: int(attrs(node).get("count_include_pad", 0))})
        params[13], params[14] = quantize_multiplier(x.q.scale / want.scale)
        lw.op(ekm.AVGPOOL, [x.index], out.index, params, node.name)
    return lw.requant(out, None, act, node.output[0])


def _avgpool_pad_fold(lw: Lowerer, node: onnx.NodeProto, out_shape) -> tuple[QT, dict] | None:
    """Pad(0) -> AveragePool: the zeros are counted, so the pool pads with them itself
    (count_include_pad), when its own pads are counted too (or absent) and every window still
    touches the input."""
    folded = spatial_zero_pad(lw, node.input[0]) if node.op_type == "AveragePool" else None
    if folded is None:
        return None
    src, q, extra = folded
    a = attrs(node)
    if not a.get("count_include_pad", 0) and (any(a.get("pads", [])) or text(a.get("auto_pad", "NOTSET")) not in ("NOTSET", "", "VALID")):
        return None
    x = lw.materialize(src, q)
    params = _pool_params(node, x, out_shape, extra)
    if any(params[6 + i] >= params[i % 2] for i in range(4)):
        return None
    params.update({4: 1, 5: 1, 10: 1})
    return x, params


def lower_reshape(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    if node.op_type == "Identity":
        return lw.materialize(node.input[0], want, act)
    x = moved_input(lw, node, want, act)
    out_shape = lw.shape(node.output[0], node)
    if math.prod(out_shape) != math.prod(x.shape):
        raise LoweringError(f"{where(node)}: {x.shape} -> {out_shape} changes the element count", "check the model")
    if x.view is not None or len(out_shape) > ekm.MAX_RANK:  # a chain through rank 5/6
        return lw.requant(as_view(lw, x, view_of(x).reshape(out_shape), node.name), want, act, node.output[0])

    def same_bytes(shape) -> bool:  # NHWC order == NCHW order
        return len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1

    if same_bytes(x.shape) and same_bytes(out_shape):
        order = 0
    elif len(x.shape) == 4 and len(out_shape) != 4:
        order = 1
    else:  # mixes the channel and spatial axes of a 4-D tensor: a transpose of merged axes
        return lw.requant(as_view(lw, x, view_of(x).reshape(out_shape), node.name), want, act, node.output[0])
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.RESHAPE, [x.index], out.index, {0: order}, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_transpose(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    x = moved_input(lw, node, want, act)
    rank = len(x.shape)
    perm = list(attrs(node).get("perm", range(rank - 1, -1, -1)))
    out_shape = lw.shape(node.output[0], node)
    if x.view is not None or rank > ekm.MAX_RANK:
        return lw.requant(as_view(lw, x, view_of(x).transpose(perm), node.name), want, act, node.output[0])
    if rank == 4:
        inv = np.argsort(NHWC)
        stored_perm = [int(inv[perm[NHWC[i]]]) for i in range(4)]
    else:
        stored_perm = perm
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.TRANSPOSE, [x.index], out.index, dict(enumerate(stored_perm)), node.name)
    return lw.requant(out, want, act, node.output[0])


def _resize_index_ok(mode: str, ctm: str, nearest_mode: str, in_n: int, out_n: int, scale: float) -> bool:
    """Does the node's coordinate rule give the runtime's: floor(d * in / out) (nearest), or
    half_pixel (linear)?"""
    d = np.arange(out_n, dtype=np.float64)
    if mode == "linear":
        return ctm in ("half_pixel", "pytorch_half_pixel") and (ctm == "half_pixel" or out_n > 1) and abs(scale - out_n / in_n) < 1e-6
    if ctm == "asymmetric":
        orig = d / scale
    elif ctm == "half_pixel":
        orig = (d + 0.5) / scale - 0.5
    elif ctm == "align_corners":
        orig = d * (in_n - 1) / max(out_n - 1, 1)
    else:
        return False
    rounding = {
        "floor": np.floor, "ceil": np.ceil,
        "round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    }.get(nearest_mode)
    if rounding is None:
        return False
    idx = np.clip(rounding(orig), 0, in_n - 1).astype(np.int64)
    return bool(np.array_equal(idx, (np.arange(out_n) * in_n) // out_n))


def lower_resize(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    a = attrs(node)
    mode = text(a.get("mode", "nearest"))
    ctm = text(a.get("coordinate_transformation_mode", "half_pixel"))
    nearest_mode = text(a.get("nearest_mode", "round_prefer_floor"))
    nearest = mode == "nearest"
    x = moved_input(lw, node, want, act) if nearest else lw.materialize(node.input[0], None)
    out_shape = lw.shape(node.output[0], node)
    if len(x.shape) != 4 or out_shape[:2] != x.shape[:2]:
        raise LoweringError(f"{where(node)} resizes {x.shape} -> {out_shape}", "ekrt resizes the H and W of 4-D tensors only")
    if mode not in ("nearest", "linear") or a.get("antialias", 0) or a.get("axes") is not None or text(a.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
        raise LoweringError(f"{where(node)}: mode {mode}", "ekrt resizes nearest and (bi)linear only")
    scales = None
    if len(node.input) > 2 and node.input[2] and lw.is_const(node.input[2]) and lw.float_const(node.input[2]).size == 4:
        scales = lw.float_const(node.input[2]).reshape(4)[2:]
    for d in range(2):
        in_n, out_n = x.shape[2 + d], out_shape[2 + d]
        scale = float(scales[d]) if scales is not None else out_n / in_n
        if not _resize_index_ok(mode, ctm, nearest_mode, in_n, out_n, scale):
            raise LoweringError(f"{where(node)}: coordinate mode {ctm}/{nearest_mode} with scale {scale:g}", "ekrt resizes nearest (asymmetric/floor or the same indices) and linear with half_pixel")
    out = lw.new_i8(out_shape, x.q)
    lw.op(ekm.RESIZE, [x.index], out.index, {0: 0 if nearest else 1}, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_softmax(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    x = lw.input_i8(node, 0)
    rank = len(x.shape)
    axis = attrs(node).get("axis", -1 if lw.opset >= 13 else 1) % rank
    # the runtime's rows are the stored innermost axis: the last one, or the channels of a 4-D tensor
    # (before opset 13 Softmax flattens from its axis: only the last axis means the same)
    innermost = axis == rank - 1 if rank != 4 else (axis == 1 and (lw.opset >= 13 or x.shape[2] * x.shape[3] == 1))
    if not innermost:
        raise LoweringError(f"{where(node)}: softmax over axis {axis} of a {x.shape} tensor", "ekrt runs softmax over the innermost axis (the last; the channels of a 4-D tensor)")
    out = lw.new_i8(x.shape, QParams(SOFTMAX_SCALE, SOFTMAX_ZP))
    lw.op(ekm.SOFTMAX, [x.index], out.index, {0: rank - 1}, node.name)
    return lw.requant(out, want, act, node.output[0])


def lower_conv_transpose(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """ConvTranspose = zeros (the zero point) inserted between the input's pixels (PAD's interior),
    then a stride-1 CONV2D with the kernel flipped and its in/out channels swapped."""
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    wname = node.input[1]
    w = lw.qconsts.get(wname)
    if len(x.shape) != 4 or w is None or w.q.ndim != 4:
        raise LoweringError(f"{where(node)} is not a 2-D transposed convolution with int8 weights", "ekrt runs 2-D ConvTranspose with constant weights")
    a = attrs(node)
    if int(a.get("group", 1)) != 1:
        raise LoweringError(f"{where(node)} has group {a.get('group')}", "grouped ConvTranspose stays float in the quantizer; deploy with another backend")
    if np.any(w.zp != 0) or w.q.dtype != np.int8 or (w.scale.size > 1 and (w.axis or 0) % 4 != 1):
        raise LoweringError(f"{where(node)}: weights are not symmetric int8 per output channel", "quantize with edgekit")
    c_in, m_out, kh, kw = w.q.shape
    n, c, h, wd = x.shape
    out_shape = lw.shape(node.output[0], node)
    strides, dil = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
    out_pad = tuple(a.get("output_padding", (0, 0)))
    auto = text(a.get("auto_pad", "NOTSET"))
    conv_pads = [0, 0, 0, 0]
    for d, (size, k) in enumerate(((h, kh), (wd, kw))):
        span = strides[d] * (size - 1) + out_pad[d] + (k - 1) * dil[d] + 1
        if "output_shape" in a or auto not in ("NOTSET", ""):
            total = span - out_shape[2 + d]
            small, big = total // 2, total - total // 2
            begin, end = (small, big) if auto == "SAME_UPPER" else (big, small)
        else:
            pads = list(a.get("pads", (0, 0, 0, 0)))
            begin, end = pads[d], pads[d + 2]
        conv_pads[d], conv_pads[d + 2] = (k - 1) * dil[d] - begin, (k - 1) * dil[d] - end + out_pad[d]
    if min(conv_pads) < 0 or c != c_in:
        raise LoweringError(f"{where(node)}: pads larger than the kernel or {c} channels for weight {w.q.shape}", "ekrt runs ConvTranspose with pads < kernel")
    s_w = np.broadcast_to(w.scale.reshape(-1).astype(np.float64), (m_out,))
    bias = _bias(lw, node, m_out)
    amin, amax = lw.act_range(want, act)
    if strides == (kh, kw) and dil == (1, 1) and tuple(out_shape[2:]) == (h * kh, wd * kw) and conv_pads == [kh - 1, kw - 1, kh - 1, kw - 1]:
        # kernel == stride, no overlap: a 1x1 conv to (i, j, m) channels, then pixels spread out by
        # one transpose (depth-to-space): 1/(kh*kw) of the zero-insertion MACs, no zeros
        wt = np.ascontiguousarray(w.q.transpose(2, 3, 1, 0).reshape(kh * kw * m_out, 1, 1, c))
        mult, shift = lw.requant_params(np.tile(np.float64(x.q.scale) * s_w / np.float64(want.scale), kh * kw))
        y = lw.new_i8((n, kh * kw * m_out, h, wd), want)
        params = {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 10: 1, 11: amin, 12: amax}
        lw.op(ekm.CONV2D, [x.index, lw.const(ekm.I8, wt, wname), lw.const(ekm.I32, _fit_bias(np.tile(bias, kh * kw), wt)), mult, shift],
              y.index, params, node.name)
        spread = view_of(y).reshape(n, kh, kw, m_out, h, wd).transpose(0, 3, 4, 1, 5, 2).reshape(out_shape)
        return as_view(lw, y, spread, node.name + "__spread")
    if strides != (1, 1):  # interior zeros, in stored (NHWC) axes 1 and 2
        zh, zw = (h - 1) * strides[0] + 1, (wd - 1) * strides[1] + 1
        z = lw.new_i8((n, c, zh, zw), x.q)
        lw.op(ekm.PAD, [x.index], z.index, {9: strides[0] - 1, 10: strides[1] - 1, 12: 0, 13: x.q.zp}, node.name + "__zeros")
        x = z
    wt = np.ascontiguousarray(w.q[:, :, ::-1, ::-1].transpose(1, 2, 3, 0))  # [M][KH][KW][C]
    mult, shift = lw.requant_params(np.float64(x.q.scale) * s_w / np.float64(want.scale))
    out = lw.new_i8(out_shape, want)
    params = {0: kh, 1: kw, 2: 1, 3: 1, 4: dil[0], 5: dil[1], 6: conv_pads[0], 7: conv_pads[1], 8: conv_pads[2],
              9: conv_pads[3], 10: 1, 11: amin, 12: amax}
    lw.op(ekm.CONV2D, [x.index, lw.const(ekm.I8, wt, wname), lw.const(ekm.I32, _fit_bias(bias, wt)), mult, shift], out.index, params, node.name)
    return out


def _clip(values: np.ndarray, act) -> np.ndarray:
    return values if act is None else np.clip(values, np.float32(act[0]), np.float32(act[1]))


def lower_prelu(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """PRelu: one table of 256 entries (a scalar slope) or one per channel (LUT_CHANNEL), each entry
    what the float graph computes: quantize(prelu(dequantize(x))), so it is exact."""
    x = lw.input_i8(node, 0)
    if not lw.is_const(node.input[1]):
        raise LoweringError(f"{where(node)}: the slope is not a constant", "ekrt runs PRelu with a constant slope")
    slope = lw.float_const(node.input[1]).astype(np.float32)
    grid = (np.arange(-128, 128, dtype=np.float32) - np.float32(x.q.zp)) * np.float32(x.q.scale)
    if slope.size == 1:
        lw.tabled.add(node.name)
        values = _clip(np.where(grid < 0, grid * slope.reshape(()), grid), act)
        return lw.lut(x, values, want or lw.natural(values), node.name)
    if not channel_vector(slope.shape, x.shape):
        raise LoweringError(f"{where(node)}: slope {slope.shape} for input {x.shape}", "ekrt runs a scalar or per-channel PRelu slope")
    values = _clip(np.where(grid < 0, grid[None, :] * slope.reshape(-1, 1), grid[None, :]), act)
    want = want or lw.natural(values)
    table = qmath.quantize(values, want.scale, want.zp, "int8")
    out = lw.new_i8(x.shape, want)
    lw.op(ekm.LUT_CHANNEL, [x.index, lw.const(ekm.I8, table, f"{node.name}__tables")], out.index, name=node.name)
    lw.tabled.add(node.name)
    return out


def lower_batchnorm(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """An inference BatchNormalization the quantizer left (after a ConvTranspose, say) is a
    per-channel function of one int8 value: one table per channel (LUT_CHANNEL), each computed
    by running DQ -> the node -> Q on all 256 values, so it holds what the float graph gives."""
    want = lw.want_or_fail(node, want)
    x = lw.input_i8(node, 0)
    if len(x.shape) not in (2, 4) or not all(lw.is_const(i) for i in node.input[1:]):
        raise LoweringError(f"{where(node)} on {x.shape}", "ekrt runs BatchNormalization of 2-D/4-D tensors with constant statistics")
    c = x.shape[1]
    i8 = onnx.TensorProto.INT8
    inits = [numpy_helper.from_array(np.float32(x.q.scale), "xs"), numpy_helper.from_array(np.int8(x.q.zp), "xz"),
             numpy_helper.from_array(np.float32(want.scale), "ys"), numpy_helper.from_array(np.int8(want.zp), "yz")]
    inits += [numpy_helper.from_array(lw.float_const(i).astype(np.float32), f"c{k}") for k, i in enumerate(node.input[1:])]
    bn = helper.make_node("BatchNormalization", ["x"] + [f"c{k}" for k in range(len(node.input) - 1)], ["f"])
    bn.attribute.extend(a for a in node.attribute if a.name == "epsilon")
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["q", "xs", "xz"], ["x"]), bn,
                               helper.make_node("QuantizeLinear", ["f", "ys", "yz"], ["y"])], "bn",
                              [helper.make_tensor_value_info("q", i8, [1, c, 256])], [helper.make_tensor_value_info("y", i8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    grid = np.broadcast_to(np.arange(-128, 128, dtype=np.int8), (1, c, 256)).copy()
    table = _run_small(model, {"q": grid}).reshape(c, 256)
    if act is not None:
        table = np.clip(table, *lw.act_range(want, act)).astype(np.int8)
    out = lw.new_i8(x.shape, want)
    lw.op(ekm.LUT_CHANNEL, [x.index, lw.const(ekm.I8, table, f"{node.name}__tables")], out.index, name=node.name)
    lw.tabled.add(node.name)
    return out


def _run_small(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    """One small graph run as ONNX Runtime runs it (graph optimizations off: the Q/DQ reference
    semantics), the ONNX reference implementation without ORT."""
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 3
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feed)[0]


def lower_reduce_mean(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """ReduceMean over axes that are adjacent in the stored layout = GLOBAL_AVGPOOL of the tensor
    seen as [outer, reduced, 1, inner] (the spatial axes of a 4-D tensor: no reshape at all)."""
    x = lw.input_i8(node, 0)
    want = want or x.q  # a mean stays inside the input's range
    rank = len(x.shape)
    a = attrs(node)
    if lw.opset >= 18 and len(node.input) > 1 and node.input[1]:
        axes = [int(v) for v in lw.consts[node.input[1]].reshape(-1)] if node.input[1] in lw.consts else None
        if axes is None:
            raise LoweringError(f"{where(node)}: axes are not constant", "ekrt reduces over static axes")
    else:
        axes = list(a.get("axes", []))
    axes = sorted({ax % rank for ax in axes} if axes else set(range(rank)))
    out_shape = lw.shape(node.output[0], node)
    st = [NHWC[i] for i in range(4)] if rank == 4 else list(range(rank))  # stored axis i holds logical st[i]
    red = [i for i in range(rank) if st[i] in axes]
    kept = [st[i] for i in range(rank) if st[i] not in axes]
    if red != list(range(red[0], red[-1] + 1)) or (len(out_shape) == len(kept) and kept != sorted(kept)):
        raise LoweringError(f"{where(node)}: mean over axes {axes} of {x.shape}", "ekrt averages over axes that are adjacent in its layout (NHWC for 4-D)")
    sd = stored(x.shape)
    outer, r, inner = math.prod(sd[: red[0]]), math.prod(sd[red[0]: red[-1] + 1]), math.prod(sd[red[-1] + 1:])
    if r > 1 << 23:
        raise LoweringError(f"{where(node)} averages {r} values", "ekrt averages at most 2^23 values")
    src = x
    if not (rank == 4 and red == [1, 2]):
        src = lw.new_i8((outer, inner, r, 1), x.q)  # stored [outer, r, 1, inner]: the same bytes
        lw.op(ekm.RESHAPE, [x.index], src.index, {0: 0}, node.name + "__view")
    m_, s_ = quantize_multiplier(x.q.scale / (want.scale * r))
    pooled = lw.new_i8((outer, inner, 1, 1), want)
    lw.op(ekm.GLOBAL_AVGPOOL, [src.index], pooled.index, {0: m_, 1: s_}, node.name)
    out = pooled
    if stored(out_shape) != stored(pooled.shape):
        out = lw.new_i8(out_shape, want)
        lw.op(ekm.RESHAPE, [pooled.index], out.index, {0: 0}, node.name + "__shape")
    return lw.requant(out, None, act, node.output[0])


FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def lower_cast(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """A Cast of a float activation to float32/float64 changes no value of it: nothing to run."""
    to = attrs(node).get("to")
    if to not in FLOAT_TYPES:
        raise LoweringError(f"{where(node)} casts an activation to {onnx.TensorProto.DataType.Name(to)}", "ekrt keeps activations int8; a Cast to an integer or float16 type changes values")
    return lw.materialize(node.input[0], want, act)


LOWERINGS: dict[str, Lowering] = {
    "Conv": lower_conv,
    "Gemm": lower_gemm,
    "MatMul": lower_gemm,
    **{op: lower_binary for op in ("Add", "Mul", "Sub", "Div", "Pow", "Max", "Min")},
    "Concat": lower_concat,
    "MaxPool": lower_maxpool,
    "AveragePool": lower_avgpool,
    "GlobalAveragePool": lower_avgpool,
    **{op: lower_reshape for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")},
    "Transpose": lower_transpose,
    "Resize": lower_resize,
    "Softmax": lower_softmax,
    "Pad": lower_pad,
    "Slice": lower_slice,
    "Split": lower_split,
    "PRelu": lower_prelu,
    "ReduceMean": lower_reduce_mean,
    "Cast": lower_cast,
    "ConvTranspose": lower_conv_transpose,
    "BatchNormalization": lower_batchnorm,
    "Relu": lower_relu_clip,
    "Clip": lower_relu_clip,
    **{op: lower_lut for op in ELEMENTWISE - {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Identity", "Relu", "Clip"}},
}
