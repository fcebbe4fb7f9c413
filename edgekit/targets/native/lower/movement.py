"""Lowerings of ops that move int8 values without arithmetic and may change the shape: Pad,
Slice, Split. They commute with a monotone quantization, so a float input is quantized first
(straight to the params the consumer asks for) and the bytes are moved after; a constant Pad
value is quantized with the same params, exact for 0 (the zero point)."""

from __future__ import annotations

import math

import numpy as np
import onnx

from edgekit.quantize import qmath
from edgekit.targets.native import ekm
from edgekit.targets.native.lower.walk import (
    NHWC,
    QT,
    Lowerer,
    LoweringError,
    attrs,
    stored,
    text,
    where,
)

PAD_MODES = {"constant": 0, "reflect": 1, "edge": 2}


def to_stored(per_axis: list[int], rank: int) -> list[int]:
    """A per-logical-axis list in the runtime's stored axis order (4-D: NHWC)."""
    return [per_axis[NHWC[i]] for i in range(4)] if rank == 4 else list(per_axis)


def moved_input(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    """Input 0 of a data-movement op, quantized with the consumer's params when it is still float."""
    src = node.input[0]
    if src in lw.alias:
        return lw.alias[src]
    return lw.materialize(src, want, act)


# -- views: Reshape/Transpose chains through rank 5 and 6 -----------------------------------------


def view_of(x: QT) -> np.ndarray:
    """Per logical element of ``x``, its flat index in the stored bytes of a real tensor."""
    if x.view is not None:
        return x.view[1]
    flat = np.arange(math.prod(x.shape), dtype=np.int64).reshape(stored(x.shape))
    return flat.transpose(0, 3, 1, 2) if len(x.shape) == 4 else flat


def as_view(lw: Lowerer, x: QT, elements: np.ndarray, name: str) -> QT:
    """The tensor whose logical elements are ``elements`` (indices into ``x``'s real bytes): a view
    when its rank is above 4, else real, made of at most reshape -> transpose -> reshape."""
    base = x.view[0] if x.view is not None else x.index
    if elements.ndim > ekm.MAX_RANK:
        return QT(-1, tuple(elements.shape), x.q, (base, elements))
    out = lw.new_i8(tuple(elements.shape), x.q)
    flat = (elements.transpose(NHWC) if elements.ndim == 4 else elements).reshape(-1)
    axes = _transpose_axes(flat)
    if axes is None:
        cut = _cut(lw, base, flat, x.q, name)
        if cut is not None:
            base, flat = cut
            axes = _transpose_axes(flat)
    if axes is None or len(axes) > ekm.MAX_RANK:
        raise LoweringError(f"node '{name}': the rank-{elements.ndim} reshape/transpose chain is no transpose of <= {ekm.MAX_RANK} axes",
                            "ekrt moves data through Reshape/Transpose chains that merge into a 4-D transpose")
    outer_first = axes[::-1]  # (size, stride in the source)
    src_axes = sorted(outer_first, key=lambda a: -a[1])
    perm = [src_axes.index(a) for a in outer_first]
    cur = base
    if len(src_axes) > 1 and perm != sorted(perm):
        cur = _raw(lw, [a[0] for a in src_axes], x.q, [base], ekm.RESHAPE, {0: 0}, name + "__in")
        cur = _raw(lw, [a[0] for a in outer_first], x.q, [cur], ekm.TRANSPOSE, dict(enumerate(perm)), name + "__perm")
    lw.op(ekm.RESHAPE, [cur], out.index, {0: 0}, name)
    return out


def _raw(lw: Lowerer, dims: list[int], q, inputs: list[int], type_: int, params: dict, name: str) -> int:
    idx = lw.m.add_tensor(ekm.Tensor(ekm.I8, ekm.ARENA, tuple(dims), q.scale, q.zp))
    lw.op(type_, inputs, idx, params, name)
    return idx


def _axes_of(f: np.ndarray) -> list[tuple[int, int]] | None:
    """``f`` (output flat position -> source flat position) as ``f[0] + sum(i_k * stride_k)``: its
    axes, innermost first, as (size, source stride), adjacent axes that stay adjacent merged."""
    n, axes, block = f.size, [], 1
    g = f - f[0]
    while block < n:
        stride = int(g[block])
        count = 1
        while block * (count + 1) <= n and g[block * count] == count * stride:
            count += 1
        if count == 1 or n % (block * count):
            return None
        axes.append((count, stride))
        block *= count
    idx = np.zeros(1, np.int64)
    for size, stride in axes:  # innermost first: rebuild and compare
        idx = (np.arange(size, dtype=np.int64)[:, None] * stride + idx[None, :]).reshape(-1)
    return axes if np.array_equal(idx, g) else None


def _transpose_axes(f: np.ndarray) -> list[tuple[int, int]] | None:
    """``f`` as a transpose of a whole contiguous tensor (its _axes_of), else None."""
    if f[0] != 0 or np.unique(f).size != f.size:
        return None
    axes = _axes_of(f)
    expect = 1  # a transpose of a contiguous tensor: sorted by stride, each stride is the product below
    for size, stride in sorted(axes or [], key=lambda a: a[1]):
        if stride != expect:
            return None
        expect *= size
    return axes


def _cut(lw: Lowerer, base: int, f: np.ndarray, q, name: str) -> tuple[int, np.ndarray] | None:
    """Elements ``f`` of the real tensor ``base`` that are a strided block of it (q, k and v sliced
    out of one attention qkv view): the block cut out by RESHAPE -> SLICE (a contiguous tensor)
    and the positions of ``f`` in it; None when they are not."""
    axes = _axes_of(f)
    total = math.prod(lw.m.tensors[base].dims)
    if axes is None or np.unique(f).size != f.size:
        return None
    axes = sorted(axes, key=lambda a: a[1])
    strides = [a[1] for a in axes]
    # innermost first: the base seen as [.., s2/s1, s1/s0, s0]; the block takes each axis' size
    dims = ([strides[0]] if strides[0] > 1 else []) + [b // a for a, b in zip(strides, strides[1:])] + [total // strides[-1]]
    counts = ([1] if strides[0] > 1 else []) + [a[0] for a in axes]
    if any(b % a for a, b in zip(strides, strides[1:])) or total % strides[-1] or len(dims) > ekm.MAX_RANK:
        return None
    starts, rem = [], int(f[0])
    for d in dims:  # innermost first: f[0] in the mixed radix of dims
        starts.append(rem % d)
        rem //= d
    if any(s0 + c > d for s0, c, d in zip(starts, counts, dims)):
        return None
    shaped = _raw(lw, dims[::-1], q, [base], ekm.RESHAPE, {0: 0}, name + "__block")
    block = _raw(lw, counts[::-1], q, [shaped], ekm.SLICE, {**dict(enumerate(starts[::-1])), **{4 + d: 1 for d in range(len(dims))}}, name + "__cut")
    return block, np.argsort(np.argsort(f))  # the block keeps the source order: f's ranks are its positions


def _ints(lw: Lowerer, node: onnx.NodeProto, i: int, what: str) -> list[int] | None:
    if len(node.input) <= i or not node.input[i]:
        return None
    if not lw.is_const(node.input[i]):
        raise LoweringError(f"{where(node)}: {what} is not a constant", "ekrt moves data with static shapes only; fold the shape arithmetic (onnxsim)")
    name = node.input[i]
    return [int(v) for v in np.asarray(lw.consts[name] if name in lw.consts else lw.float_const(name)).reshape(-1)]


def pad_spec(lw: Lowerer, node: onnx.NodeProto, rank: int) -> tuple[str, list[int], list[int], float]:
    """(mode, pads before, pads after, constant value) of an ONNX Pad, per logical axis."""
    a = attrs(node)
    mode = text(a.get("mode", "constant"))
    if lw.opset < 11:
        pads, value = list(a.get("pads", [])), float(a.get("value", 0.0))
    else:
        pads = _ints(lw, node, 1, "pads") or []
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            if not lw.is_const(node.input[2]):
                raise LoweringError(f"{where(node)}: the pad value is not a constant", "use a constant pad value")
            value = float(np.asarray(lw.float_const(node.input[2])).reshape(-1)[0])
    axes = _ints(lw, node, 3, "axes")
    axes = [ax % rank for ax in axes] if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise LoweringError(f"{where(node)} has {len(pads)} pads for {len(axes)} axes", "check the model")
    before, after = [0] * rank, [0] * rank
    for k, ax in enumerate(axes):
        before[ax], after[ax] = pads[k], pads[k + len(axes)]
    return mode, before, after, value


def spatial_zero_pad(lw: Lowerer, name: str) -> tuple[str, object, list[int]] | None:
    """When float tensor ``name`` is a constant-zero Pad of the H and W axes of a 4-D tensor (with or
    without a Q/DQ pair after it), the padded source, the params of that Q (or None) and the pads
    [top, left, bottom, right]: a convolution takes them as its own padding (zero = the zero point)."""
    node, q = lw.producer.get(name), None
    if node is not None and node.op_type == "DequantizeLinear":
        qnode = lw.producer.get(node.input[0])
        if qnode is None or qnode.op_type != "QuantizeLinear":
            return None
        q, node = lw.qparams(qnode), lw.producer.get(qnode.input[0])
    if node is None or node.op_type != "Pad":
        return None
    try:
        rank = len(lw.shape(node.input[0], node))
        mode, before, after, value = pad_spec(lw, node, rank)
    except LoweringError:
        return None
    if rank != 4 or mode != "constant" or value != 0.0 or any(before[:2]) or any(after[:2]) or min(before + after) < 0:
        return None
    return node.input[0], q, [before[2], before[3], after[2], after[3]]


def lower_pad(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    x = moved_input(lw, node, want, act)
    rank = len(x.shape)
    mode, before, after, value = pad_spec(lw, node, rank)
    if mode not in PAD_MODES:
        raise LoweringError(f"{where(node)}: mode {mode}", "ekrt pads constant, reflect and edge")
    if min(before + after) < 0:  # a negative pad crops: a Slice first
        x = _slice(lw, x, [max(0, -b) for b in before], [1] * rank,
                   [n - max(0, -b) - max(0, -e) for n, b, e in zip(x.shape, before, after)], node.name + "__crop")
        before, after = [max(0, b) for b in before], [max(0, e) for e in after]
    if mode == "reflect" and any(b >= n or e >= n for b, e, n in zip(before, after, x.shape)):
        raise LoweringError(f"{where(node)}: reflect pads {before}/{after} reach past the edge of {x.shape}", "ONNX reflect pads are shorter than the axis")
    out_shape = tuple(n + b + e for n, b, e in zip(x.shape, before, after))
    if out_shape == x.shape:
        return lw.requant(x, want, act, node.output[0])
    qvalue = int(qmath.quantize(np.float32(value), x.q.scale, x.q.zp, "int8"))
    out = lw.new_i8(out_shape, x.q)
    sb, sa = to_stored(before, rank), to_stored(after, rank)
    params = {12: PAD_MODES[mode], 13: qvalue, **{d: sb[d] for d in range(rank)}, **{4 + d: sa[d] for d in range(rank)}}
    lw.op(ekm.PAD, [x.index], out.index, params, node.name)
    return lw.requant(out, want, act, node.output[0])


def _slice(lw: Lowerer, x: QT, starts: list[int], steps: list[int], counts: list[int], name: str) -> QT:
    """A SLICE of x (per logical axis: first index, step, element count); x itself when whole."""
    rank = len(x.shape)
    if all(s == 0 and st == 1 and c == n for s, st, c, n in zip(starts, steps, counts, x.shape)):
        return x
    if min(counts) < 1:
        raise LoweringError(f"node '{name}' makes an empty tensor", "ekrt tensors have at least one element")
    steps = [st if c > 1 else 1 for st, c in zip(steps, counts)]
    if x.view is not None:  # a slice of a rank-5/6 view (attention's q, k, v out of one qkv): a view too
        idx = [s0 + st * np.arange(c) for s0, st, c in zip(starts, steps, counts)]
        return as_view(lw, x, view_of(x)[np.ix_(*idx)], name)
    out = lw.new_i8(tuple(counts), x.q)
    ss, st = to_stored(starts, rank), to_stored(steps, rank)
    lw.op(ekm.SLICE, [x.index], out.index, {**{d: ss[d] for d in range(rank)}, **{4 + d: st[d] for d in range(rank)}}, name)
    return out


def lower_slice(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    x = moved_input(lw, node, want, act)
    rank = len(x.shape)
    if lw.opset < 10:
        a = attrs(node)
        starts, ends, axes, steps = list(a["starts"]), list(a["ends"]), a.get("axes"), None
    else:
        starts, ends = _ints(lw, node, 1, "starts"), _ints(lw, node, 2, "ends")
        axes, steps = _ints(lw, node, 3, "axes"), _ints(lw, node, 4, "steps")
    axes = list(range(len(starts))) if axes is None else [ax % rank for ax in axes]
    steps = steps or [1] * len(starts)
    first, step, count = [0] * rank, [1] * rank, list(x.shape)
    for ax, s0, e0, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise LoweringError(f"{where(node)} has step 0", "check the model")
        r = range(*slice(s0, e0, st).indices(x.shape[ax]))  # ONNX clamps starts/ends like Python
        first[ax], step[ax], count[ax] = (r.start if len(r) else 0), st, len(r)
    return lw.requant(_slice(lw, x, first, step, count, node.name), want, act, node.output[0])


def lower_split(lw: Lowerer, node: onnx.NodeProto, want, act) -> QT:
    asked = lw.asked
    k = list(node.output).index(asked)
    x = moved_input(lw, node, want, act)
    rank = len(x.shape)
    a = attrs(node)
    axis = a.get("axis", 0) % rank
    sizes = _ints(lw, node, 1, "split") if lw.opset >= 13 else None
    sizes = sizes or list(a.get("split", []))
    n_out = len(node.output)
    if not sizes:
        chunk = -(-x.shape[axis] // n_out)  # ONNX: equal parts, the last one smaller
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n_out)]
    if len(sizes) != n_out or sum(sizes) != x.shape[axis]:
        raise LoweringError(f"{where(node)}: split {sizes} of an axis of {x.shape[axis]}", "check the model")
    first, count = [0] * rank, list(x.shape)
    first[axis], count[axis] = sum(sizes[:k]), sizes[k]
    return lw.requant(_slice(lw, x, first, [1] * rank, count, f"{node.name}__{k}"), want, act, asked)
