"""A pure-numpy interpreter of ``.ekm`` files: the golden model of ekrt.

Every op is written out in integer arithmetic exactly as docs/ekrt.md ("op semantics") defines
it, with the requantization of ``requant.py`` (the twin of ``csrc/include/edgekit/requant.h``). The C runtime
must give the same int8 values bit for bit on every ISA; the tests compare the two. Slow
(convolutions are im2col + float64 matmul, exact for int8 products), meant for tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgekit.errors import InputError, ModelError
from edgekit.targets.native import ekm
from edgekit.targets.native.requant import (
    mul_by_multiplier,
    multiplier_value,
    quantize_multiplier,
    requant,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# -- ops --------------------------------------------------------------------------------------


def _i(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64)


def _windows(xp: np.ndarray, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, oh: int, ow: int) -> np.ndarray:
    """[N, OH, OW, KH, KW, C] view of the padded NHWC input."""
    n, _, _, c = xp.shape
    s = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, oh, ow, kh, kw, c), (s[0], s[1] * sh, s[2] * sw, s[1] * dh, s[2] * dw, s[3]), writeable=False)


def _pad(x: np.ndarray, p: Sequence[int], value) -> np.ndarray:
    return np.pad(x, ((0, 0), (p[6], p[8]), (p[7], p[9]), (0, 0)), constant_values=value)


def op_quantize(m, op, x, out):
    if op.params[0]:
        x = x.transpose(0, 2, 3, 1)
    q = np.rint(x.astype(np.float32) / np.float32(out.scale))
    return np.clip(q.astype(np.float64) + out.zero_point, -128, 127).astype(np.int8)


def op_dequantize(m, op, x, out):
    t = m.tensors[op.inputs[0]]
    y = (x.astype(np.float32) - np.float32(t.zero_point)) * np.float32(t.scale)
    return y.transpose(0, 3, 1, 2) if op.params[0] else y


def op_conv2d(m, op, x, out):
    p = op.params
    xt = m.tensors[op.inputs[0]]
    w, bias, mult, shift = (m.tensors[i].data for i in op.inputs[1:5])
    kh, kw, sh, sw, dh, dw, group = p[0], p[1], p[2], p[3], p[4], p[5], p[10]
    n, oh, ow, mo = out.dims
    xp = _pad(_i(x) - xt.zero_point, p, 0).astype(np.float64)
    cg = w.shape[3]
    mg = mo // group
    acc = np.empty((n, oh, ow, mo), np.int64)
    if cg == 1 and mg == 1:  # depthwise: one pass instead of a loop over the channels
        win = _windows(xp, kh, kw, sh, sw, dh, dw, oh, ow)
        acc[...] = np.einsum("nhwijc,cij->nhwc", win, w[..., 0].astype(np.float64), optimize=True)
        group = 0
    for g in range(group):
        win = _windows(np.ascontiguousarray(xp[..., g * cg:(g + 1) * cg]), kh, kw, sh, sw, dh, dw, oh, ow)
        wg = w[g * mg:(g + 1) * mg].reshape(mg, -1).astype(np.float64)
        acc[..., g * mg:(g + 1) * mg] = (win.reshape(n * oh * ow, -1) @ wg.T).reshape(n, oh, ow, mg).astype(np.int64)
    acc += bias.astype(np.int64)
    _check_acc(acc, op)
    return requant(acc, mult.astype(np.int64), shift.astype(np.int64), out.zero_point, p[11], p[12])


def op_fully_connected(m, op, x, out):
    xt = m.tensors[op.inputs[0]]
    w, bias, mult, shift = (m.tensors[i].data for i in op.inputs[1:5])
    rows = (_i(x).reshape(x.shape[0], -1) - xt.zero_point).astype(np.float64)  # [B, K]
    acc = (rows @ w.astype(np.float64).T).astype(np.int64) + bias
    _check_acc(acc, op)
    y = requant(acc, mult.astype(np.int64), shift.astype(np.int64), out.zero_point, op.params[11], op.params[12])
    return y.reshape(out.dims)


def _check_acc(acc: np.ndarray, op) -> None:
    if acc.size and (acc.min() < INT32_MIN or acc.max() > INT32_MAX):
        raise ModelError(f"{op.name}: int32 accumulator overflow", "this is a lowering bug (K too large)")


def op_add(m, op, a, b, out):
    p = op.params
    a_t, b_t = (m.tensors[i] for i in op.inputs[:2])
    a_s = mul_by_multiplier((_i(a) - a_t.zero_point) << p[4], p[0], p[1])
    b_s = mul_by_multiplier((_i(b) - b_t.zero_point) << p[4], p[2], p[3])
    return np.broadcast_to(requant(a_s + b_s, p[5], p[6], out.zero_point, p[11], p[12]), out.dims)


def op_mul(m, op, a, b, out):
    p = op.params
    a_t, b_t = (m.tensors[i] for i in op.inputs[:2])
    acc = (_i(a) - a_t.zero_point) * (_i(b) - b_t.zero_point)
    return np.broadcast_to(requant(acc, p[0], p[1], out.zero_point, p[11], p[12]), out.dims)


def op_concat(m, op, *xs_out):
    *xs, out = xs_out
    if out.dtype == ekm.F32:
        return np.concatenate(xs, axis=op.params[0])
    parts = [requant(_i(x) - m.tensors[i].zero_point, op.params[1 + 2 * k], op.params[2 + 2 * k], out.zero_point)
             for k, (i, x) in enumerate(zip(op.inputs, xs))]
    return np.concatenate(parts, axis=op.params[0])


def op_maxpool(m, op, x, out):
    p = op.params
    n, oh, ow, c = out.dims
    xp = _pad(x.astype(np.int16), p, -129)
    return _windows(xp, p[0], p[1], p[2], p[3], 1, 1, oh, ow).max(axis=(3, 4)).astype(np.int8)


def op_avgpool(m, op, x, out):
    p = op.params
    xt = m.tensors[op.inputs[0]]
    n, oh, ow, c = out.dims
    acc = _windows(_pad(_i(x) - xt.zero_point, p, 0), p[0], p[1], p[2], p[3], 1, 1, oh, ow).sum(axis=(3, 4))
    if p[10]:
        counts = np.full((oh, ow), p[0] * p[1], np.int64)
    else:
        ones = _pad(np.ones((1, *xt.dims[1:3], 1), np.int64), p, 0)
        counts = _windows(ones, p[0], p[1], p[2], p[3], 1, 1, oh, ow).sum(axis=(3, 4)).reshape(oh, ow)
    real = multiplier_value(p[13], p[14])
    table = {int(k): quantize_multiplier(real / int(k)) for k in np.unique(counts)}
    mult = np.vectorize(lambda k: table[int(k)][0], otypes=[np.int64])(counts)[None, :, :, None]
    shift = np.vectorize(lambda k: table[int(k)][1], otypes=[np.int64])(counts)[None, :, :, None]
    return requant(acc, mult, shift, out.zero_point)


def op_global_avgpool(m, op, x, out):
    xt = m.tensors[op.inputs[0]]
    acc = (_i(x) - xt.zero_point).sum(axis=(1, 2), keepdims=True)
    return requant(acc, op.params[0], op.params[1], out.zero_point)


def op_reshape(m, op, x, out):
    if op.params[0] == 1:
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x).reshape(out.dims)


def op_transpose(m, op, x, out):
    return x.transpose(op.params[: x.ndim])


def _bilinear_axis(in_n: int, out_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """half_pixel source index i0, i1 and the Q11 weight of i1, in integers."""
    d = np.arange(out_n, dtype=np.int64)
    num = np.maximum((2 * d + 1) * in_n - out_n, 0)
    den = 2 * out_n
    i0 = num // den
    w1 = ((num - i0 * den) * 2048 + den // 2) // den
    i0 = np.minimum(i0, in_n - 1)
    return i0, np.minimum(i0 + 1, in_n - 1), w1


def op_resize(m, op, x, out):
    n, oh, ow, c = out.dims
    _, ih, iw, _ = x.shape
    if op.params[0] == 0:
        iy = (np.arange(oh) * ih) // oh
        ix = (np.arange(ow) * iw) // ow
        return x[:, iy][:, :, ix]
    y0, y1, wy = _bilinear_axis(ih, oh)
    x0, x1, wx = _bilinear_axis(iw, ow)
    xi = _i(x)
    wy, wx = wy[None, :, None, None], wx[None, None, :, None]
    top = xi[:, y0][:, :, x0] * (2048 - wx) + xi[:, y0][:, :, x1] * wx
    bottom = xi[:, y1][:, :, x0] * (2048 - wx) + xi[:, y1][:, :, x1] * wx
    acc = top * (2048 - wy) + bottom * wy
    return np.clip((acc + (1 << 21)) >> 22, -128, 127).astype(np.int8)


def op_lut(m, op, x, table, out):
    return table.reshape(256)[_i(x) + 128]


def op_softmax(m, op, x, out):
    xt = m.tensors[op.inputs[0]]
    v = (_i(x) - xt.zero_point).astype(np.float64) * np.float64(np.float32(xt.scale))
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    total = np.cumsum(e, axis=-1)[..., -1:]  # in index order, as the C loop adds
    p = e / total
    return np.clip(np.rint(p * 256.0) - 128, -128, 127).astype(np.int8)


def _per_axis(op, x, base: int, default: int) -> list[int]:
    return [op.params[base + d] for d in range(x.ndim)] if x.ndim else [default]


def op_pad(m, op, x, out):
    p = op.params
    before, after, interior = _per_axis(op, x, 0, 0), _per_axis(op, x, 4, 0), _per_axis(op, x, 8, 0)
    if p[12] == 0:
        y = np.full(out.dims, p[13], np.int8)
        y[tuple(slice(b, b + (n - 1) * (i + 1) + 1, i + 1) for b, n, i in zip(before, x.shape, interior))] = x
        return y
    return np.pad(x, list(zip(before, after)), mode="reflect" if p[12] == 1 else "edge")


def op_slice(m, op, x, out):
    starts, steps = _per_axis(op, x, 0, 0), _per_axis(op, x, 4, 1)
    idx = tuple(np.arange(n) * st + s0 for s0, st, n in zip(starts, steps, out.dims))
    return x[np.ix_(*idx)]


def op_lut_channel(m, op, x, table, out):
    c = np.arange(x.shape[-1])
    return table[c, _i(x) + 128]


# -- the float ops of the islands: computed in float64, rounded once to float32 (as the C code) --


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float64)


def _minmax(a, b, pick):
    r = pick(a, b)
    return np.where(np.isnan(a) | np.isnan(b), np.nan, r)


_BINARY = (np.add, np.subtract, np.multiply, np.divide, np.power,
           lambda a, b: _minmax(a, b, np.maximum), lambda a, b: _minmax(a, b, np.minimum),
           lambda a, b: (a == b).astype(np.float64))


def op_f_binary(m, op, a, b, out):
    with np.errstate(all="ignore"):
        return np.broadcast_to(_BINARY[op.params[0]](_f64(a), _f64(b)).astype(np.float32), out.dims)


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(x) if x.size else x


def _unary(k: int, x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    name = ekm.UNARY_FUNCS[k]
    if name == "Sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if name == "Relu":
        return np.where(x > 0, x, np.where(np.isnan(x), x, 0.0))
    if name == "HardSigmoid":
        return np.fmax(0.0, np.fmin(1.0, alpha * x + beta))
    if name == "HardSwish":
        return x * np.fmax(0.0, np.fmin(1.0, x / 6.0 + 0.5))
    if name == "Softplus":
        return np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30))))
    if name == "LeakyRelu":
        return np.where(x >= 0, x, alpha * x)
    if name == "Erf":
        return _erf(x)
    if name == "Gelu":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    return {"Tanh": np.tanh, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Reciprocal": lambda v: 1.0 / v,
            "Neg": np.negative, "Abs": np.abs}[name](x)


def op_f_unary(m, op, x, out):
    alpha, beta = (float(ekm.bits_float(op.params[i])) for i in (1, 2))
    with np.errstate(all="ignore"):
        return _unary(op.params[0], _f64(x), alpha, beta).astype(np.float32)


def op_f_reduce(m, op, x, out):
    axes = tuple(a for a in range(x.ndim) if op.params[1] >> a & 1)
    f = (np.mean, np.sum, np.max)[op.params[0]]
    return f(_f64(x), axis=axes, keepdims=True).astype(np.float32)


def op_f_matmul(m, op, a, b, out):
    return np.matmul(_f64(a), _f64(b)).astype(np.float32).reshape(out.dims)


def op_f_softmax(m, op, x, out):
    v = _f64(x)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


OPS = {
    ekm.QUANTIZE: op_quantize, ekm.DEQUANTIZE: op_dequantize, ekm.CONV2D: op_conv2d,
    ekm.FULLY_CONNECTED: op_fully_connected, ekm.ADD: op_add, ekm.MUL: op_mul, ekm.CONCAT: op_concat,
    ekm.MAXPOOL: op_maxpool, ekm.AVGPOOL: op_avgpool, ekm.GLOBAL_AVGPOOL: op_global_avgpool,
    ekm.RESHAPE: op_reshape, ekm.TRANSPOSE: op_transpose, ekm.RESIZE: op_resize, ekm.LUT: op_lut,
    ekm.SOFTMAX: op_softmax, ekm.PAD: op_pad, ekm.SLICE: op_slice, ekm.LUT_CHANNEL: op_lut_channel,
    ekm.F_BINARY: op_f_binary, ekm.F_UNARY: op_f_unary, ekm.F_REDUCE: op_f_reduce, ekm.F_MATMUL: op_f_matmul,
    ekm.F_SOFTMAX: op_f_softmax,
}
# inputs the op functions take as arrays (the rest are constants they read themselves)
_ARRAY_INPUTS = {ekm.CONV2D: 1, ekm.FULLY_CONNECTED: 1}


def run(model: str | Path | ekm.EkmModel, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
        trace: dict[int, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Run a ``.ekm`` (path or EkmModel) on float inputs (by name, or in order); returns the
    float outputs by name. ``trace``, when given, receives every tensor's value by index."""
    m = model if isinstance(model, ekm.EkmModel) else ekm.load(model)
    names = [n for _, n in m.inputs]
    if not isinstance(inputs, Mapping):
        inputs = dict(zip(names, inputs))
    values: dict[int, np.ndarray] = {}
    for idx, name in m.inputs:
        if name not in inputs:
            raise InputError(f"no value for input '{name}'", f"pass one array per input: {', '.join(names)}")
        arr = np.asarray(inputs[name], dtype=np.float32)
        if tuple(arr.shape) != tuple(m.tensors[idx].dims):
            raise InputError(f"input '{name}' has shape {arr.shape}, the model wants {m.tensors[idx].dims}", "reshape the input")
        values[idx] = arr
    for i, t in enumerate(m.tensors):
        if t.storage == ekm.CONST:
            values[i] = t.data
    for op in m.ops:
        fn = OPS[op.type]
        n_arrays = _ARRAY_INPUTS.get(op.type, len(op.inputs))
        args = [values[i] for i in op.inputs[:n_arrays]]
        out = m.tensors[op.outputs[0]]
        y = fn(m, op, *args, out)
        if tuple(y.shape) != tuple(out.dims):
            raise ModelError(f"{op.name}: computed shape {y.shape}, the tensor says {out.dims}", "this is a lowering bug")
        values[op.outputs[0]] = np.ascontiguousarray(y, dtype=ekm.DTYPE_NUMPY[out.dtype])
    if trace is not None:
        trace.update(values)
    return {name: values[idx] for idx, name in m.outputs}


__all__ = ["OPS", "run"]
