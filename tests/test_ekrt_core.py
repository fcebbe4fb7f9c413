"""ekrt's core (docs/ekrt.md): the loader rejects every malformed field with a message naming
it, every op runs bit-identical to the numpy golden model (ekm_reference), threads and ISAs
never change a bit, the extension's API behaves, requant.py equals requant.h, and the static
runner's JSON is the agent's bench schema."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from edgekit import _ekrt
from edgekit.targets.native import ekm, ekm_reference, sources
from edgekit.targets.native import requant as rq
from edgekit.targets.native.lower import plan_memory

REPO = Path(__file__).resolve().parents[1]
CSRC = REPO / "csrc"
REGRESSIONS = Path(__file__).resolve().parent / "fuzz-regressions"


# -- a small builder of .ekm models (QUANTIZE -> ops -> DEQUANTIZE), NHWC inside -------------


class Builder:
    def __init__(self, seed: int = 0) -> None:
        self.m = ekm.EkmModel()
        self.rng = np.random.RandomState(seed)

    def tensor(self, dtype, storage, dims, scale=0.0, zp=0, data=None) -> int:
        return self.m.add_tensor(ekm.Tensor(dtype, storage, tuple(int(d) for d in dims), scale, zp, data=data))

    def act(self, dims, scale=None, zp=None) -> int:
        scale = float(self.rng.uniform(0.01, 0.1)) if scale is None else scale
        zp = int(self.rng.randint(-20, 20)) if zp is None else zp
        return self.tensor(ekm.I8, ekm.ARENA, dims, scale, zp)

    def t(self, i: int) -> ekm.Tensor:
        return self.m.tensors[i]

    def input(self, dims, name="x", scale=0.05, zp=3) -> int:
        """A float input (NCHW when 4-D) quantized to an NHWC int8 tensor."""
        x = self.tensor(ekm.F32, ekm.IO, dims)
        self.m.inputs.append((x, name))
        nhwc = (dims[0], dims[2], dims[3], dims[1]) if len(dims) == 4 else dims
        q = self.act(nhwc, scale, zp)
        self.m.add_op(ekm.QUANTIZE, [x], [q], {0: int(len(dims) == 4)})
        return q

    def output(self, q: int, name="y") -> int:
        d = self.t(q).dims
        dims = (d[0], d[3], d[1], d[2]) if len(d) == 4 else d
        y = self.tensor(ekm.F32, ekm.IO, dims)
        self.m.add_op(ekm.DEQUANTIZE, [q], [y], {0: int(len(d) == 4)})
        self.m.outputs.append((y, name))
        return y

    def requant_consts(self, acc_scale, out_scale, n):
        mults, shifts = zip(*(rq.quantize_multiplier(float(s) / out_scale) for s in acc_scale))
        return (self.tensor(ekm.I32, ekm.CONST, (n,), data=np.array(mults, np.int32)),
                self.tensor(ekm.I32, ekm.CONST, (n,), data=np.array(shifts, np.int32)))

    def conv(self, x, m_out, k=(3, 3), stride=(1, 1), dil=(1, 1), pads=(1, 1, 1, 1), group=1,
             act=(-128, 127), wrange=(-128, 128)) -> int:
        n, h, w, c = self.t(x).dims
        kh, kw = k
        oh = (h + pads[0] + pads[2] - (dil[0] * (kh - 1) + 1)) // stride[0] + 1
        ow = (w + pads[1] + pads[3] - (dil[1] * (kw - 1) + 1)) // stride[1] + 1
        wt = self.rng.randint(*wrange, size=(m_out, kh, kw, c // group)).astype(np.int8)
        w_scale = self.rng.uniform(0.002, 0.02, size=m_out)
        x_scale = self.t(x).scale
        bias = self.rng.randint(-3000, 3000, size=m_out).astype(np.int32)
        y = self.act((n, oh, ow, m_out))
        mu, sh = self.requant_consts(x_scale * w_scale, self.t(y).scale, m_out)
        wi = self.tensor(ekm.I8, ekm.CONST, wt.shape, data=wt)
        bi = self.tensor(ekm.I32, ekm.CONST, (m_out,), data=bias)
        params = {0: kh, 1: kw, 2: stride[0], 3: stride[1], 4: dil[0], 5: dil[1], 6: pads[0], 7: pads[1],
                  8: pads[2], 9: pads[3], 10: group, 11: act[0], 12: act[1]}
        self.m.add_op(ekm.CONV2D, [x, wi, bi, mu, sh], [y], params)
        return y

    def fc(self, x, n_out, flat_dims=2) -> int:
        b = self.t(x).dims[0]
        k = int(np.prod(self.t(x).dims[1:]))
        wt = self.rng.randint(-128, 128, size=(n_out, k)).astype(np.int8)
        y = self.act((b, n_out) if flat_dims == 2 else (b, 1, 1, n_out))
        mu, sh = self.requant_consts(self.t(x).scale * self.rng.uniform(0.001, 0.01, size=n_out), self.t(y).scale, n_out)
        wi = self.tensor(ekm.I8, ekm.CONST, wt.shape, data=wt)
        bi = self.tensor(ekm.I32, ekm.CONST, (n_out,), data=self.rng.randint(-500, 500, size=n_out).astype(np.int32))
        self.m.add_op(ekm.FULLY_CONNECTED, [x, wi, bi, mu, sh], [y], {11: -128, 12: 127})
        return y

    def add(self, a, b, op=ekm.ADD, act=(-128, 127)) -> int:
        ta, tb = self.t(a), self.t(b)
        y = self.act(ta.dims)
        if op == ekm.ADD:
            twice = 2 * max(ta.scale, tb.scale)
            ma, sa = rq.quantize_multiplier(ta.scale / twice)
            mb, sb = rq.quantize_multiplier(tb.scale / twice)
            mo, so = rq.quantize_multiplier(twice / ((1 << 20) * self.t(y).scale))
            params = {0: ma, 1: sa, 2: mb, 3: sb, 4: 20, 5: mo, 6: so, 11: act[0], 12: act[1]}
        else:
            mm, sm = rq.quantize_multiplier(ta.scale * tb.scale / self.t(y).scale)
            params = {0: mm, 1: sm, 11: act[0], 12: act[1]}
        self.m.add_op(op, [a, b], [y], params)
        return y

    def const_act(self, dims, scale=0.03, zp=2) -> int:
        data = self.rng.randint(-128, 128, size=dims).astype(np.int8)
        return self.tensor(ekm.I8, ekm.CONST, dims, scale, zp, data=data)

    def simple(self, type_, inputs, out_dims, params, same_q=True, scale=None, zp=None) -> int:
        src = self.t(inputs[0])
        y = self.act(out_dims, src.scale if same_q else scale, src.zero_point if same_q else zp)
        self.m.add_op(type_, list(inputs), [y], params)
        return y

    def pool(self, x, type_, k, stride, pads, include_pad=0) -> int:
        n, h, w, c = self.t(x).dims
        dims = [(size + p0 + p1 - kk) // s + 1 for size, kk, s, p0, p1 in
                ((h, k[0], stride[0], pads[0], pads[2]), (w, k[1], stride[1], pads[1], pads[3]))]
        params = {0: k[0], 1: k[1], 2: stride[0], 3: stride[1], 4: 1, 5: 1, 6: pads[0], 7: pads[1], 8: pads[2], 9: pads[3]}
        if type_ == ekm.MAXPOOL:
            return self.simple(ekm.MAXPOOL, [x], (n, *dims, c), params)
        y = self.act((n, *dims, c))
        params[10] = include_pad
        params[13], params[14] = rq.quantize_multiplier(self.t(x).scale / self.t(y).scale)
        self.m.add_op(ekm.AVGPOOL, [x], [y], params)
        return y

    def lut(self, x) -> int:
        t = self.t(x)
        real = (np.arange(-128, 128) - t.zero_point) * t.scale
        y = self.act(t.dims, 1.0 / 256, -128)
        table = np.clip(np.rint(1 / (1 + np.exp(-real)) * 256) - 128, -128, 127).astype(np.int8)
        ti = self.tensor(ekm.I8, ekm.CONST, (256,), data=table)
        self.m.add_op(ekm.LUT, [x, ti], [y])
        return y

    def pad(self, x, before, after, interior=(0, 0, 0, 0), mode=0, value=0) -> int:
        dims = [d + (d - 1) * i + b + a for d, b, a, i in zip(self.t(x).dims, before, after, interior)]
        r = len(dims)
        params = {12: mode, 13: value, **{d: before[d] for d in range(r)}, **{4 + d: after[d] for d in range(r)},
                  **{8 + d: interior[d] for d in range(r)}}
        return self.simple(ekm.PAD, [x], dims, params)

    def slice(self, x, starts, steps, out_dims) -> int:
        r = len(out_dims)
        return self.simple(ekm.SLICE, [x], out_dims, {**{d: starts[d] for d in range(r)}, **{4 + d: steps[d] for d in range(r)}})

    def lut_channel(self, x) -> int:
        t = self.t(x)
        c = t.dims[-1]
        y = self.act(t.dims)
        table = self.rng.randint(-128, 128, size=(c, 256)).astype(np.int8)
        self.m.add_op(ekm.LUT_CHANNEL, [x, self.tensor(ekm.I8, ekm.CONST, (c, 256), data=table)], [y])
        return y

    # float islands: DEQUANTIZE to float32 in the arena, float ops, QUANTIZE back
    def to_float(self, q: int) -> int:
        d = self.t(q).dims
        f = self.tensor(ekm.F32, ekm.ARENA, (d[0], d[3], d[1], d[2]) if len(d) == 4 else d)
        self.m.add_op(ekm.DEQUANTIZE, [q], [f], {0: int(len(d) == 4)})
        return f

    def to_int8(self, f: int, scale=0.02, zp=-3) -> int:
        d = self.t(f).dims
        q = self.act((d[0], d[2], d[3], d[1]) if len(d) == 4 else d, scale, zp)
        self.m.add_op(ekm.QUANTIZE, [f], [q], {0: int(len(d) == 4)})
        return q

    def fconst(self, dims, lo=-2.0, hi=2.0) -> int:
        return self.tensor(ekm.F32, ekm.CONST, dims, data=self.rng.uniform(lo, hi, size=dims).astype(np.float32))

    def fop(self, type_, inputs, dims, params=None) -> int:
        y = self.tensor(ekm.F32, ekm.ARENA, dims)
        self.m.add_op(type_, list(inputs), [y], params)
        return y

    def funary(self, f, name, alpha=0.0, beta=0.0) -> int:
        params = {0: ekm.UNARY_FUNCS.index(name), 1: ekm.float_bits(alpha), 2: ekm.float_bits(beta)}
        return self.fop(ekm.F_UNARY, [f], self.t(f).dims, params)

    def fbinary(self, a, b, name) -> int:
        dims = np.broadcast_shapes(self.t(a).dims, self.t(b).dims)
        return self.fop(ekm.F_BINARY, [a, b], dims, {0: ekm.BINARY_FUNCS.index(name)})

    def freduce(self, f, axes, kind="ReduceMean") -> int:
        dims = tuple(1 if a in axes else d for a, d in enumerate(self.t(f).dims))
        return self.fop(ekm.F_REDUCE, [f], dims, {0: ekm.REDUCE_FUNCS.index(kind), 1: sum(1 << a for a in axes)})

    def fmatmul(self, a, b) -> int:
        da, db = self.t(a).dims, self.t(b).dims
        dims = (*np.broadcast_shapes(da[:-2], db[:-2]), da[-2], db[-1])
        return self.fop(ekm.F_MATMUL, [a, b], dims)

    def float_output(self, f, name) -> int:
        y = self.tensor(ekm.F32, ekm.IO, self.t(f).dims)
        self.m.add_op(ekm.RESHAPE, [f], [y], {0: 0})
        self.m.outputs.append((y, name))
        return y

    def finish(self) -> bytes:
        plan_memory(self.m)
        return ekm.to_bytes(self.m)


def every_op_model(size: int = 16, channels: int = 16, seed: int = 0) -> Builder:
    """One graph with every op of docs/ekrt.md (and the conv driver's four paths)."""
    b = Builder(seed)
    x = b.input((1, 3, size, size))
    c1 = b.conv(x, channels, (3, 3), pads=(1, 1, 1, 1), act=(-100, 127))            # im2col
    dw = b.conv(c1, channels, (3, 3), stride=(2, 2), pads=(1, 1, 1, 1), group=channels)  # depthwise
    g2 = b.conv(dw, channels, (3, 3), dil=(2, 2), pads=(2, 2, 2, 2), group=2)        # grouped, dilated
    pw = b.conv(g2, channels, (1, 1), pads=(0, 0, 0, 0))                              # 1x1 direct
    s = b.add(pw, dw)                                                                 # residual
    mc = b.add(s, b.const_act((1, 1, 1, channels)), op=ekm.MUL)                       # per-channel mul
    mp = b.pool(mc, ekm.MAXPOOL, (3, 3), (1, 1), (1, 1, 1, 1))
    ap = b.pool(mp, ekm.AVGPOOL, (3, 3), (2, 2), (1, 1, 2, 2), include_pad=0)  # ceil_mode, made explicit
    up = b.simple(ekm.RESIZE, [ap], (1, b.t(ap).dims[1] * 2, b.t(ap).dims[2] * 2, channels), {0: 1})
    nn = b.simple(ekm.RESIZE, [ap], (1, b.t(ap).dims[1] * 2, b.t(ap).dims[2] * 2, channels), {0: 0})
    cat = b.act((1, b.t(up).dims[1], b.t(up).dims[2], 2 * channels))
    pairs = {0: 3}
    for k, src in enumerate((up, nn)):
        pairs[1 + 2 * k], pairs[2 + 2 * k] = rq.quantize_multiplier(b.t(src).scale / b.t(cat).scale)
    b.m.add_op(ekm.CONCAT, [up, nn], [cat], pairs)
    d = b.t(cat).dims
    tr = b.simple(ekm.TRANSPOSE, [cat], (d[0], d[2], d[1], d[3]), {0: 0, 1: 2, 2: 1, 3: 3})
    sg = b.lut(tr)
    gp = _gap(b, sg)
    fl = b.simple(ekm.RESHAPE, [sg], (1, int(np.prod(b.t(sg).dims))), {0: 1})       # Flatten NCHW order
    f1 = b.fc(fl, 10)
    f2 = b.fc(gp, 10, flat_dims=4)
    f2r = b.simple(ekm.RESHAPE, [f2], (1, 10), {0: 0})
    sm = _softmax(b, f1)
    h, w = b.t(s).dims[1:3]
    sl = b.slice(s, (0, h - 1, 1, channels - 1), (1, -2, 2, -1), (1, (h + 1) // 2, w // 2, channels))
    pd = b.pad(b.pad(sl, (0, 1, 1, 0), (0, 1, 0, 0), mode=1), (0, 1, 0, 0), (0, 0, 1, 0), (0, 1, 1, 0), value=-7)
    b.output(sm, "probs")
    b.output(f2r, "logits")
    b.output(mp, "features")
    b.output(b.lut_channel(pd), "moved")
    # a float island: every float op, fed by a DEQUANTIZE, back to int8 through a QUANTIZE
    f = b.to_float(mp)
    n, c, h, w = b.t(f).dims
    hs = b.funary(f, "HardSigmoid", 0.1, 0.4)
    centred = b.fbinary(hs, b.freduce(hs, (2, 3)), "Sub")
    scaled = b.fbinary(centred, b.fconst((c, 1, 1)), "Mul")
    rows = b.fop(ekm.RESHAPE, [scaled], (c, h * w), {0: 0})
    mm = b.fmatmul(rows, b.fconst((h * w, 8), -0.1, 0.1))
    att = b.fop(ekm.F_SOFTMAX, [b.fop(ekm.TRANSPOSE, [mm], (8, c), {0: 1, 1: 0})], (8, c))
    mixed = b.fmatmul(att, rows)  # two activations
    b.output(b.to_int8(b.freduce(mixed, (0,), "ReduceSum"), 0.01, 0), "island")
    b.float_output(att, "attention")
    return b


def inputs_for(b: Builder, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    return [rng.standard_normal(b.m.tensors[i].dims).astype(np.float32) * 2 for i, _ in b.m.inputs]


def reference(b: Builder, xs) -> list[np.ndarray]:
    out = ekm_reference.run(b.m, xs)
    return [out[name] for _, name in b.m.outputs]


@pytest.fixture(scope="module")
def every_op():
    b = every_op_model()
    return b, b.finish()


# -- requant.py is requant.h ------------------------------------------------------------------


def test_quantize_multiplier_twin_matches_the_header():
    rng = np.random.RandomState(1)
    reals = list(np.exp(rng.uniform(np.log(2.0**-40), np.log(2.0**29.9), 4000)))
    reals += [0.0, 2.0**-32, 2.0**-31, 2.0**-33, 0.5, 1.0, 1.0 - 2.0**-40, 0.75, 2.0**29, 3.0**10 / 7]
    for r in reals:
        assert rq.quantize_multiplier(r) == _ekrt.quantize_multiplier(float(r)), r
    m, s = rq.quantize_multiplier(0.37)
    assert 2**30 <= m < 2**31 and abs(rq.multiplier_value(m, s) - 0.37) < 1e-9
    assert rq.quantize_multiplier(1.0 - 2.0**-40) == (2**30, 1)  # rounds up to 2^31: renormalized
    for bad in (-0.5, float("inf"), float("nan"), 2.0**30):
        with pytest.raises(ValueError):
            rq.quantize_multiplier(bad)
        with pytest.raises(ValueError):
            _ekrt.quantize_multiplier(bad)


def test_requant_twin_matches_the_header():
    rng = np.random.RandomState(2)
    n = 3000
    acc = np.concatenate([rng.randint(-(2**31), 2**31 - 1, n, dtype=np.int64), rng.randint(-5000, 5000, n),
                          [-(2**31), 2**31 - 1, 0, 1, -1]])
    mult = rng.randint(2**30, 2**31 - 1, acc.size, dtype=np.int64)
    mult[:50] = 0
    shift = rng.randint(-31, 31, acc.size)
    zp = rng.randint(-128, 128, acc.size)
    lo = rng.randint(-128, 0, acc.size)
    hi = rng.randint(0, 128, acc.size)
    got = rq.requant(acc, mult, shift, zp, lo, hi)
    want = [_ekrt.requant(int(a), int(m), int(s), int(z), int(q0), int(q1))
            for a, m, s, z, q0, q1 in zip(acc, mult, shift, zp, lo, hi)]
    np.testing.assert_array_equal(got, np.array(want, np.int8))
    # a tie rounds toward +inf: 3 * 0.5 = 1.5 -> 2, -3 * 0.5 = -1.5 -> -1
    assert _ekrt.requant(3, 2**30, 0, 0, -128, 127) == 2 == rq.requant(3, 2**30, 0, 0)
    assert _ekrt.requant(-3, 2**30, 0, 0, -128, 127) == -1 == rq.requant(-3, 2**30, 0, 0)
    # the reference interpreter uses the same multiply
    np.testing.assert_array_equal(ekm_reference.mul_by_multiplier(acc, mult, shift), rq.mul_by_multiplier(acc, mult, shift))


# -- every op runs, bit-identical to the golden model ------------------------------------------


def test_every_op_matches_the_reference(every_op):
    b, blob = every_op
    model = _ekrt.Model(blob)
    assert {ekm.OP_NAMES[op.type] for op in b.m.ops} == set(ekm.OP_NAMES.values())
    for seed in range(3):
        xs = inputs_for(b, seed)
        got = model.run(xs)
        for g, w, (_, name) in zip(got, reference(b, xs), b.m.outputs):
            assert g.dtype == np.float32 and g.shape == w.shape, name
            np.testing.assert_array_equal(g, w, err_msg=name)
        assert np.unique(got[2]).size > 20  # the features are not saturated: the test can fail
        assert np.unique(got[4]).size > 20 and np.unique(got[5]).size > 20  # nor the float island


def _one_op(make) -> Builder:
    b = Builder(7)
    x = b.input((1, 12, 9, 11))
    y = make(b, x)
    b.output(y)
    return b


OP_CASES = {
    "conv3x3_stride2_pad_asym": lambda b, x: b.conv(x, 20, (3, 3), stride=(2, 2), pads=(0, 1, 2, 1)),
    "conv5x1_dilated": lambda b, x: b.conv(x, 7, (5, 1), dil=(2, 1), pads=(4, 0, 4, 0)),
    "conv_groups3_relu6": lambda b, x: b.conv(x, 9, (3, 3), group=3, act=(-30, 60)),
    "conv_1x1_direct": lambda b, x: b.conv(x, 33, (1, 1), pads=(0, 0, 0, 0)),
    "conv_1x1_stride2": lambda b, x: b.conv(x, 17, (1, 1), stride=(2, 2), pads=(0, 0, 0, 0)),
    "conv_kernel_bigger_than_input": lambda b, x: b.conv(x, 5, (9, 11), pads=(0, 0, 0, 0)),
    "depthwise_5x5": lambda b, x: b.conv(x, 12, (5, 5), pads=(2, 2, 2, 2), group=12),
    "depthwise_channel_multiplier": lambda b, x: b.conv(x, 24, (3, 3), group=12),
    "weights_pm127": lambda b, x: b.conv(x, 19, (3, 3), wrange=(-127, 128)),
    "fc_batch_rows": lambda b, x: b.fc(b.simple(ekm.RESHAPE, [x], (9, 11 * 12), {0: 0}), 7),
    "fc_from_flatten": lambda b, x: b.fc(b.simple(ekm.RESHAPE, [x], (1, 9 * 11 * 12), {0: 1}), 37),
    "maxpool_ceil_as_pad": lambda b, x: b.pool(x, ekm.MAXPOOL, (2, 2), (2, 2), (0, 0, 1, 1)),
    "maxpool_stride_over_kernel": lambda b, x: b.pool(x, ekm.MAXPOOL, (2, 1), (3, 3), (1, 0, 0, 0)),
    "avgpool_include_pad": lambda b, x: b.pool(x, ekm.AVGPOOL, (3, 3), (2, 2), (1, 1, 1, 1), include_pad=1),
    "avgpool_exclude_pad": lambda b, x: b.pool(x, ekm.AVGPOOL, (3, 2), (1, 2), (1, 0, 1, 1)),
    "add_same_shape_relu": lambda b, x: b.add(x, b.conv(x, 12, (1, 1), pads=(0, 0, 0, 0)), act=(-5, 127)),
    "add_broadcast_const": lambda b, x: b.add(x, b.const_act((1, 1, 1, 12))),
    "mul_same_shape": lambda b, x: b.add(x, b.conv(x, 12, (3, 3)), op=ekm.MUL),
    "resize_nearest_down": lambda b, x: b.simple(ekm.RESIZE, [x], (1, 4, 7, 12), {0: 0}),
    "resize_bilinear_up": lambda b, x: b.simple(ekm.RESIZE, [x], (1, 17, 23, 12), {0: 1}),
    "transpose_nchw": lambda b, x: b.simple(ekm.TRANSPOSE, [x], (1, 12, 9, 11), {0: 0, 1: 3, 2: 1, 3: 2}),
    "concat_requant_axis1": lambda b, x: _concat(b, [x, b.conv(x, 12, (3, 3))], axis=1),
    "concat_identity_axis3": lambda b, x: _concat(b, [x, x, x], axis=3, same=True),
    # channels of a pixel (short rows): requantized a block of rows at a time, then copied
    "concat_requant_axis3": lambda b, x: _concat(b, [x, b.conv(x, 12, (3, 3))], axis=3),
    "concat_requant_axis3_blocks": lambda b, x: _concat_blocks(b, x),
    "lut_sigmoid": lambda b, x: b.lut(x),
    "global_avgpool": lambda b, x: _gap(b, x),
    "pad_constant_interior": lambda b, x: b.pad(x, (0, 1, 2, 3), (0, 2, 0, 1), (0, 1, 0, 2), value=5),
    "pad_reflect": lambda b, x: b.pad(x, (0, 2, 3, 0), (0, 1, 4, 1), mode=1),
    "pad_edge": lambda b, x: b.pad(x, (1, 3, 0, 2), (0, 0, 5, 1), mode=2),
    "slice_negative_steps": lambda b, x: b.slice(x, (0, 8, 1, 11), (1, -2, 3, -1), (1, 5, 4, 12)),
    "slice_rank2": lambda b, x: b.slice(b.simple(ekm.RESHAPE, [x], (9, 11 * 12), {0: 0}), (2, 5), (3, 7), (3, 19)),
    "lut_channel": lambda b, x: b.lut_channel(x),
    "softmax_rows": lambda b, x: _softmax(b, b.simple(ekm.RESHAPE, [x], (9, 11 * 12), {0: 0})),
}


# W = 13: the SIMD body and the tail; C = 3: the RGB interleave; W = 300: two 256-wide chunks;
# C = 7: a block of 4 channels and one of 3
@pytest.mark.parametrize("dims", [(1, 2, 3, 13), (1, 3, 2, 300), (1, 7, 2, 37)])
def test_quantize_rounds_half_to_even_and_saturates(dims):
    b = Builder(3)
    x = b.input(dims, scale=0.5, zp=-3)
    b.output(x)
    model = _ekrt.Model(b.finish())
    v = np.array([0.25, 0.75, -0.25, -0.75, 1.25, 63.0, 64.0, 65.25, -62.25, -63.25, 1e30, -1e30,
                  np.inf, -np.inf, 0.0, -0.0, 3.3, -7.7, 0.2499999, 100.0], np.float32)
    xs = np.resize(v, dims).astype(np.float32)
    tail = xs.reshape(-1)[len(v)::3]  # a view: every third value after the edge cases is random
    tail[:] = np.random.RandomState(0).uniform(-80, 80, tail.size)
    got = model.run([xs])[0]
    np.testing.assert_array_equal(got, reference(b, [xs])[0])
    # 0.25 / 0.5 = 0.5 -> 0 (even), 0.75 / 0.5 = 1.5 -> 2: (q - zp) * scale
    assert got.reshape(-1)[:4].tolist() == [0.0, 1.0, 0.0, -1.0]
    assert got.max() == (127 + 3) * 0.5 and got.min() == (-128 + 3) * 0.5
    xs[0, 0, 0, 0] = np.nan
    assert model.run([xs])[0][0, 0, 0, 0] == 0.0  # NaN is real zero (the zero point)


def test_depthwise_with_run_time_indirection():
    """Depthwise tap pointers, every way conv.c builds them: per row at run time (an 11x11 whose
    shared-column table would exceed 512 KB), prebuilt at load (the 3x3 stride 2), and per pixel
    for a width-dilated kernel; all give the reference's bits, with threads too."""
    b = Builder(4)
    x = b.input((1, 5, 90, 91))
    y = b.conv(x, 5, (11, 11), pads=(5, 5, 5, 5), group=5)
    y2 = b.conv(y, 5, (3, 3), stride=(2, 2), group=5)
    y3 = b.conv(y2, 5, (3, 3), dil=(2, 2), pads=(2, 2, 2, 2), group=5)
    b.output(y3)
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 1)
    want = reference(b, xs)[0]
    np.testing.assert_array_equal(model.run(xs)[0], want)
    model.set_threads(3)
    np.testing.assert_array_equal(model.run(xs)[0], want)


# im2col's runs of interior pixels (copied kernel row by kernel row) and its per-pixel edges: a
# stem conv's 9-byte rows (3x3 RGB, stride 2), 6-byte rows, rows over 16 bytes, a kernel wider
# than the padded-free interior (no runs at all), more than 16 kernel rows (no kept row pointers),
# a stride over the kernel, asymmetric pads
@pytest.mark.parametrize("dims,kernel,stride,pads", [
    ((1, 3, 23, 37), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((1, 3, 8, 40), (3, 3), (1, 1), (0, 2, 1, 0)),
    ((1, 2, 9, 21), (3, 3), (2, 2), (1, 1, 1, 1)),
    ((1, 6, 7, 19), (3, 5), (1, 3), (2, 2, 0, 3)),
    ((1, 3, 6, 5), (3, 7), (1, 1), (1, 3, 1, 3)),
    ((1, 3, 20, 9), (17, 3), (1, 1), (8, 1, 8, 1)),
    ((1, 4, 11, 30), (2, 2), (3, 3), (0, 0, 0, 0)),
])
def test_im2col_geometries_match_the_reference(dims, kernel, stride, pads):
    b = Builder(5)
    x = b.input(dims)
    b.output(b.conv(x, 13, kernel, stride=stride, pads=pads))
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 2)
    want = reference(b, xs)[0]
    np.testing.assert_array_equal(model.run(xs)[0], want)
    model.set_threads(2)
    np.testing.assert_array_equal(model.run(xs)[0], want)


def _concat(b: Builder, xs, axis, same=False):
    dims = list(b.t(xs[0]).dims)
    dims[axis] = sum(b.t(x).dims[axis] for x in xs)
    first = b.t(xs[0])
    y = b.act(dims, first.scale if same else None, first.zero_point if same else None)
    params = {0: axis}
    for k, x in enumerate(xs):
        params[1 + 2 * k], params[2 + 2 * k] = rq.quantize_multiplier(b.t(x).scale / b.t(y).scale)
    b.m.add_op(ekm.CONCAT, list(xs), [y], params)
    return y


def _concat_blocks(b: Builder, x):
    """Rows of 12, 5 and 12 bytes over 1600 pixels: several blocks of rows, tails of the lookup."""
    u = b.simple(ekm.RESIZE, [x], (1, 40, 40, 12), {0: 1})
    return _concat(b, [u, b.conv(u, 5, (1, 1), pads=(0, 0, 0, 0)), b.add(u, u)], axis=3)


def _gap(b: Builder, x):
    n, h, w, c = b.t(x).dims
    y = b.act((n, 1, 1, c))
    m_, s_ = rq.quantize_multiplier(b.t(x).scale / (b.t(y).scale * h * w))
    b.m.add_op(ekm.GLOBAL_AVGPOOL, [x], [y], {0: m_, 1: s_})
    return y


def _softmax(b: Builder, x):
    y = b.act(b.t(x).dims, 1.0 / 256, -128)
    b.m.add_op(ekm.SOFTMAX, [x], [y], {0: len(b.t(x).dims) - 1})
    return y


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_matches_the_reference(case):
    b = _one_op(OP_CASES[case])
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 3)
    got = model.run(xs)[0]
    want = reference(b, xs)[0]
    np.testing.assert_array_equal(got, want)
    assert np.unique(got).size > 1


def _float_case(kind: str, name: str):
    """One float op between a DEQUANTIZE and a float graph output (x is [1,12,9,11] as float)."""

    def make(b: Builder, x):
        f = b.to_float(x)
        if kind == "unary":
            return b.funary(f, name, 0.2 if name in ("HardSigmoid", "LeakyRelu") else 0.0, 0.5 if name == "HardSigmoid" else 0.0)
        if kind == "binary":  # one operand per channel, the other a broadcast activation
            other = b.fbinary(b.freduce(f, (3,)), b.fconst((12, 1, 1), 0.5, 2.0), "Mul")
            if name == "Equal":  # 1 where an element is its row's max
                return b.fbinary(f, b.freduce(f, (3,), "ReduceMax"), name)
            return b.fbinary(f, other, name) if name != "Pow" else b.fbinary(b.funary(f, "Abs"), other, name)
        if kind == "reduce":
            return b.freduce(f, (1, 3) if name == "ReduceSum" else (0, 2), name)
        if kind == "expand":  # [1,12,9,1] written into [2,12,9,11]
            return b.fop(ekm.F_BINARY, [b.freduce(f, (3,)), b.fconst((1,))], (2, 12, 9, 11), {0: ekm.BINARY_FUNCS.index("Mul")})
        if kind == "matmul":  # batch broadcast: [1,12,9,11] x [12,11,5], and two activations
            mm = b.fmatmul(f, b.fconst((12, 11, 5)))
            return b.fmatmul(b.fop(ekm.TRANSPOSE, [mm], (1, 12, 5, 9), {0: 0, 1: 1, 2: 3, 3: 2}), f)
        if kind == "concat":
            return b.fop(ekm.CONCAT, [f, b.fconst((1, 12, 2, 11)), f], (1, 12, 20, 11), {0: 2})
        return b.fop(ekm.F_SOFTMAX, [f], b.t(f).dims)

    return make


FLOAT_CASES = {**{f"unary_{n}": ("unary", n) for n in ekm.UNARY_FUNCS}, **{f"binary_{n}": ("binary", n) for n in ekm.BINARY_FUNCS},
               **{n: ("reduce", n) for n in ekm.REDUCE_FUNCS}, "expand": ("expand", ""), "matmul": ("matmul", ""), "softmax": ("softmax", ""), "concat": ("concat", "")}


@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_float_op_matches_the_reference(case):
    b = Builder(7)
    x = b.input((1, 12, 9, 11), scale=0.04, zp=0)
    b.float_output(_float_case(*FLOAT_CASES[case])(b, x), "y")
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 3)
    got = model.run(xs)[0]
    np.testing.assert_array_equal(got, reference(b, xs)[0])
    assert np.unique(got).size > 1


@pytest.mark.parametrize("name", ekm.BINARY_FUNCS)
def test_float_binary_rows_keep_the_reference_on_every_layout(name):
    """F_BINARY's row loops (contiguous, a broadcast b, a broadcast a) give the reference's bits,
    NaN, infinities and signed zeros included."""
    b = Builder(11)
    x = b.input((1, 12, 9, 11), scale=0.04, zp=0)
    f = b.to_float(x)
    dims = b.t(f).dims
    rng = np.random.RandomState(3)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.0], np.float32)
    full = rng.uniform(-2, 2, size=dims).astype(np.float32)
    full.flat[rng.choice(full.size, 60, replace=False)] = rng.choice(special, 60)
    if name == "Pow":
        f = b.funary(f, "Abs")
        full = np.abs(full)
    c_full = b.tensor(ekm.F32, ekm.CONST, dims, data=full)
    outs = []
    for other in (c_full, *(b.tensor(ekm.F32, ekm.CONST, (1,), data=np.array([v], np.float32)) for v in (np.nan, -0.0, 0.75))):
        outs.append(b.fbinary(f, other, name))  # b contiguous or one value for the row
        outs.append(b.fbinary(other, f, name))  # a contiguous or one value for the row
    for k, o in enumerate(outs):
        b.float_output(o, f"y{k}")
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 3)
    for got, want in zip(model.run(xs), reference(b, xs)):
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(got), nan)
        np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])  # -0.0 is not 0.0


def test_transposes_on_blocks_and_ragged_edges_keep_the_reference():
    """TRANSPOSE (int8 and float, all 24 permutations) and the NHWC -> NCHW RESHAPE on dims that
    give the 16 x 16 (4 x 4) vector blocks of ek_x8_transpose / ek_x32_transpose and ragged
    edges; the reference is numpy's transpose."""
    b = Builder(13)
    x = b.input((2, 19, 33, 17), scale=0.04, zp=0)
    f = b.to_float(x)  # [2, 17, 19, 33]
    for perm in itertools.permutations(range(4)):
        for src in (x, f):
            dims = tuple(b.t(src).dims[p] for p in perm)
            y = (b.simple if src == x else b.fop)(ekm.TRANSPOSE, [src], dims, dict(enumerate(perm)))
            (b.output(y, f"q{perm}") if src == x else b.float_output(y, f"f{perm}"))
    b.output(b.simple(ekm.RESHAPE, [x], (2, 17, 19 * 33), {0: 1}), "nchw")
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 3)
    got, want = model.run(xs), reference(b, xs)
    assert len(got) == 49
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_float_binary_split_over_threads_keeps_the_bits(monkeypatch):
    """F_BINARY's rows run as tasks (ek_for_rows): on 1, 2 and 4 threads, every op split, the
    reference's bits on each layout (full, a row broadcast, a column broadcast)."""
    monkeypatch.setenv("EKRT_WORK_PER_THREAD", "0")
    b = Builder(19)
    x = b.input((1, 8, 64, 300), scale=0.04, zp=0)  # 153,600 floats: 10 tasks of 16 K elements
    f = b.to_float(x)
    for k, other in enumerate((b.fconst((1, 8, 64, 300)), b.fconst((1, 1, 1, 300)), b.fconst((1, 8, 64, 1)))):
        b.float_output(b.fbinary(f, other, "Mul"), f"mul{k}")
        b.float_output(b.fbinary(other, f, "Sub"), f"sub{k}")
    blob = b.finish()
    xs = inputs_for(b, 5)
    want = reference(b, xs)
    for threads in (1, 2, 4):
        for g, w in zip(_ekrt.Model(blob, threads=threads).run(xs), want):
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


def _max_in_order(v: np.ndarray, axes) -> np.ndarray:
    """F_REDUCE max as its loop defines it: in the input's order, a value replaces the running
    maximum only when greater, so the first NaN and the first of equal values (-0 before +0) stay."""
    out = np.full([1 if a in axes else d for a, d in enumerate(v.shape)], -np.inf, np.float64)
    for idx in np.ndindex(*v.shape):
        o = tuple(0 if a in axes else i for a, i in enumerate(idx))
        a, x = out[o], np.float64(v[idx])
        if (x > a or np.isnan(x)) and not np.isnan(a):
            out[o] = x
    return out.astype(np.float32)


def _reduce_max_model() -> tuple[Builder, list]:
    """ReduceMax's rows: with a NaN, whose largest value is -0 or +0 (either first), of every
    length around the 8 lanes; outputs in{k} (the reducer's input) and max{k} per case."""
    b = Builder(17)
    x = b.input((1, 12, 9, 37), scale=0.04, zp=0)
    f = b.to_float(x)  # [1, 12, 9, 37]: rows of 37, 4 x 8 lanes and a tail
    dims = b.t(f).dims
    rng = np.random.RandomState(5)
    mult = rng.uniform(-2, 2, size=dims).astype(np.float32)
    mult[0, 1:5] = -np.abs(mult[0, 1:5])  # negative rows ...
    mult[0, 1, :, 3] = 0.0  # ... whose max is +0 in every row, or -0, or both in either order
    mult[0, 2, :, 4] = -0.0
    mult[0, 3, :, 5], mult[0, 3, :, 8] = -0.0, 0.0  # different lanes: which comes first is the order
    mult[0, 4, :, 5], mult[0, 4, :, 8] = 0.0, -0.0
    mult[0, 5, ::2, 7] = np.nan
    mult[0, 6, :, 36] = np.nan  # in the tail after the lanes
    mult[0, 7, :, 0] = np.inf
    mult[0, 8] = -np.inf
    h = b.fbinary(b.funary(f, "Abs"), b.fconst((1, 1, 1, 1), 0.25, 0.25), "Add")  # > 0
    g = b.fbinary(h, b.tensor(ekm.F32, ekm.CONST, dims, data=mult), "Mul")  # mult's signs, zeros, NaN, inf
    cases = [(g, axes) for axes in ((3,), (2, 3), (1, 3), (2,), (1, 2, 3))]
    for n in (1, 7, 8, 9, 15, 16, 17):  # row lengths around the 8 lanes
        cases.append((b.to_float(b.input((1, 3, n, 4), scale=0.04, zp=0)), (3,)))
    for k, (t, axes) in enumerate(cases):
        b.float_output(t, f"in{k}")
        b.float_output(b.freduce(t, axes, "ReduceMax"), f"max{k}")
    return b, [axes for _, axes in cases]


def _assert_max_in_order(got: list[np.ndarray], axes_of: list) -> None:
    signs = 0
    for k, axes in enumerate(axes_of):  # against the loop on the input ekrt itself computed
        out, want = got[2 * k + 1], _max_in_order(got[2 * k], axes)
        nan = np.isnan(want)
        np.testing.assert_array_equal(np.isnan(out), nan, err_msg=str(k))
        np.testing.assert_array_equal(out.view(np.uint32)[~nan], want.view(np.uint32)[~nan], err_msg=str(k))  # -0.0 is not 0.0
        signs += int(np.sum(np.signbit(want) & (want == 0)))
    assert signs > 0  # some row's max was -0 and stayed so


def test_reduce_max_over_rows_keeps_the_first_nan_and_the_first_zero():
    """ReduceMax over the innermost axis takes 8 lanes at a time (SSE2 here); the rows where the
    order decides (a NaN, a largest value of -0 or +0) keep the loop's bits."""
    b, axes_of = _reduce_max_model()
    _assert_max_in_order(_ekrt.Model(b.finish()).run(inputs_for(b, 3)), axes_of)


def test_threads_never_change_a_bit():
    b = every_op_model(size=64, channels=32, seed=5)  # big enough that every op is split into tasks
    model = _ekrt.Model(b.finish())
    xs = inputs_for(b, 9)
    base = model.run(xs)
    for threads in (2, 3, 4, 7, 1):
        model.set_threads(threads)
        assert model.threads == threads
        for _ in range(3):
            for g, w in zip(model.run(xs), base):
                np.testing.assert_array_equal(g, w)
    for g, w in zip(base, reference(b, xs)):
        np.testing.assert_array_equal(g, w)


def big_and_tiny_model() -> Builder:
    """Ops far above the split threshold (a 3x3 conv of ~38 M MACs, its 1x1 of ~8 M) between
    ops far below it (an 8-element FC, a softmax of 10)."""
    b = Builder(11)
    x = b.input((1, 32, 32, 32))
    c = b.conv(x, 64)
    p = b.conv(c, 64, (1, 1), pads=(0, 0, 0, 0), act=(-128, 100))
    f = b.fc(_gap(b, p), 10, flat_dims=4)
    sm = _softmax(b, b.simple(ekm.RESHAPE, [f], (1, 10), {0: 0}))
    b.output(sm, "probs")
    b.output(p, "features")
    return b


def test_the_split_cost_model_has_a_row_for_every_gemm_isa():
    # ekrt_isa_name() is the GEMM kernel's ISA; one missing from the table fell to the scalar
    # row (8 K of work per thread) and split every small op: AMX did, and LUT, TRANSPOSE and
    # CONCAT ran slower at 2 threads than at 1 on nudenet-320n
    import re

    table = (CSRC / "src" / "internal.h").read_text()
    rows = dict(re.findall(r'\{"(\w+)", (\d+)\}', table.split("#define EK_WORK_PER_THREAD_TABLE", 1)[1].splitlines()[0]))
    from edgekit.targets.native import sources

    isas = sources.load_description()["isa"]
    gemm_isas = {sources.isa_of(f, isas) for f in (CSRC / "kernels" / "qs8-gemm").glob("qs8-gemm-*x*-*.c")}
    assert gemm_isas and gemm_isas <= set(rows), (sorted(gemm_isas - set(rows)), rows)


@pytest.mark.parametrize("work_per_thread", [None, "0"], ids=["cost-model", "split-everything"])
def test_threads_1_2_4_are_bit_identical_on_big_and_tiny_ops(work_per_thread, monkeypatch):
    if work_per_thread is not None:
        monkeypatch.setenv("EKRT_WORK_PER_THREAD", work_per_thread)
    b = big_and_tiny_model()
    blob = b.finish()
    xs = inputs_for(b, 4)
    want = reference(b, xs)
    for threads in (1, 2, 4, 2, 1):
        model = _ekrt.Model(blob, threads=threads)
        assert model.threads == threads
        for _ in range(5):  # repeated runs: the pool's job hand-over, wake-ups and rests
            for g, w in zip(model.run(xs), want):
                np.testing.assert_array_equal(g, w)


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def test_threads_default_is_every_usable_core_when_an_op_splits(every_op, monkeypatch):
    """The default is the device's cores (issue 29), not what the biggest op's size pays for; a
    model with no op worth a second thread (per the per-ISA break-even) gets 1."""
    cpus = _usable_cpus()
    _, tiny = every_op
    b = big_and_tiny_model()
    blob = b.finish()
    monkeypatch.delenv("EKRT_WORK_PER_THREAD", raising=False)
    model = _ekrt.Model(blob)  # a 38 M MAC conv: worth splitting on any ISA
    assert model.threads == cpus
    model.set_threads(1)
    assert model.threads == 1
    model.set_threads(None)  # back to ekrt's choice
    assert model.threads == cpus
    monkeypatch.setenv("EKRT_WORK_PER_THREAD", "0")  # every op worth every core
    assert _ekrt.Model(tiny).threads == cpus
    monkeypatch.setenv("EKRT_WORK_PER_THREAD", str(1 << 40))  # no op worth a second thread
    assert _ekrt.Model(blob).threads == 1
    with pytest.raises(ValueError, match="threads must be 1..256"):
        _ekrt.Model(blob, threads=0)


_ISA_SCRIPT = """
import sys, numpy as np
from edgekit import _ekrt
m = _ekrt.Model(sys.argv[1])
xs = [np.load(p) for p in sys.argv[2:]]
out = m.run(xs)
print(_ekrt.isa(), *(np.ascontiguousarray(o).tobytes().hex() for o in out))
"""


def test_ekrt_isa_scalar_forces_the_reference_kernels_and_changes_no_bit(every_op, tmp_path):
    b, blob = every_op
    (tmp_path / "m.ekm").write_bytes(blob)
    args = [str(tmp_path / "m.ekm")]
    for i, x in enumerate(inputs_for(b, 1)):
        np.save(tmp_path / f"x{i}.npy", x)
        args.append(str(tmp_path / f"x{i}.npy"))
    results = {}
    usable = [isa for isa, feature in sources.ISA_FEATURE.items() if feature in _ekrt.features()]
    clean = {k: v for k, v in os.environ.items() if k != "EKRT_ISA"}  # the suite may run under a forced ISA
    for isa in ("scalar", "", "bogus", None, *usable):
        env = clean if isa is None else {**clean, "EKRT_ISA": isa}
        r = subprocess.run([sys.executable, "-c", _ISA_SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        chosen, *outs = r.stdout.split()
        results[isa] = (chosen, outs)
    assert results["scalar"][0] == "scalar"
    assert results[""][0] == results[None][0] == results["bogus"][0]  # empty or unknown: the CPU's own choice
    for isa in usable:  # avx512vbmi has only an x8-lut kernel: the GEMM's, and so isa(), stay avx512vnni's
        assert results[isa][0] == isa or (isa, results[isa][0]) == ("avx512vbmi", "avx512vnni"), (isa, results[isa][0])
    assert len({tuple(outs) for _, outs in results.values()}) == 1
    want = reference(b, [np.load(a) for a in args[1:]])
    assert results["scalar"][1] == [w.tobytes().hex() for w in want]


# -- the extension's API -----------------------------------------------------------------------


def test_extension_api(every_op, tmp_path):
    b, blob = every_op
    path = tmp_path / "m.ekm"
    path.write_bytes(blob)
    model = _ekrt.Model(str(path))
    assert model.inputs == [("x", (1, 3, 16, 16))]
    assert [name for name, _ in model.outputs] == ["probs", "logits", "features", "moved", "island", "attention"]
    assert model.outputs[0][1] == (1, 10) and model.memory_bytes >= b.m.arena_size
    x = inputs_for(b)[0]
    by_list = model.run([x])
    by_dict = _ekrt.Model(path).run({"x": x})
    as_f64 = model.run([x.astype(np.float64)])  # converted to float32
    non_contiguous = model.run([np.asfortranarray(x)])
    for outs in (by_dict, as_f64, non_contiguous):
        for g, w in zip(outs, by_list):
            np.testing.assert_array_equal(g, w)
    probs = by_list[0]
    assert abs(float(probs.sum()) - 1.0) < 0.05  # softmax of the output really is a distribution

    model.profile(True)
    for _ in range(3):
        model.run([x])
    times = model.op_times()
    assert [name for name, _ in times] == [ekm.OP_NAMES[op.type] for op in b.m.ops]
    assert all(ns > 0 for _, ns in times)
    model.profile(False)
    assert all(ns == 0 for _, ns in model.op_times())

    with pytest.raises(ValueError, match=r"input 'x' has shape \(1, 3, 16, 15\), the model wants \(1, 3, 16, 16\)"):
        model.run([x[..., :15]])
    with pytest.raises(ValueError, match="got 2 arrays, the model has 1 inputs"):
        model.run([x, x])
    with pytest.raises(KeyError, match="no array for input 'x'"):
        model.run({"y": x})
    with pytest.raises(ValueError, match="threads must be 1..256"):
        model.set_threads(0)
    with pytest.raises(OSError, match="cannot open"):
        _ekrt.Model(str(tmp_path / "missing.ekm"))
    with pytest.raises(_ekrt.FormatError, match="shorter than the 128-byte header"):
        _ekrt.Model(b"EKM1")
    with pytest.raises(TypeError):
        _ekrt.Model(12)
    assert _ekrt.isa() in _ekrt.built_isas().split(",")
    assert set(_ekrt.kernels()) == {"qs8-gemm", "qs8-dwconv", "qs8-vadd", "qs8-vmul", "x8-lut", "f32-qs8-cvt"}
    assert _ekrt.kernels()["qs8-gemm"].endswith("__" + _ekrt.isa())


# -- the loader rejects malformed files ----------------------------------------------------------

HDR = struct.Struct("<4sIIIQIIIIIIQQQQQQ32s")
TENSOR_FIELDS = {"dtype": (0, "I"), "storage": (4, "I"), "rank": (8, "I"), "dims0": (12, "I"), "dims1": (16, "I"),
                 "dims2": (20, "I"), "dims3": (24, "I"), "scale": (28, "f"), "zp": (32, "i"), "reserved": (36, "I"),
                 "offset": (40, "Q")}


class Blob:
    """A good model's bytes plus what it takes to mutate one field (the checksum fixed up)."""

    def __init__(self, builder: Builder, data: bytes) -> None:
        self.b = builder
        self.data = data
        h = HDR.unpack_from(data, 0)
        self.tensors_off, self.ops_off, self.io_off, self.data_off = h[11], h[12], h[13], h[14]

    def set(self, offset: int, fmt: str, value, fix_crc: bool = True) -> bytes:
        buf = bytearray(self.data)
        struct.pack_into("<" + fmt, buf, offset, value)
        if fix_crc:
            struct.pack_into("<I", buf, 24, zlib.crc32(bytes(buf[128:])) & 0xFFFFFFFF)
        return bytes(buf)

    def tensor(self, i: int, field: str, value) -> bytes:
        off, fmt = TENSOR_FIELDS[field]
        return self.set(self.tensors_off + 48 * i + off, fmt, value)

    def op_at(self, type_: int, nth: int = 0) -> int:
        return [j for j, op in enumerate(self.b.m.ops) if op.type == type_][nth]

    def op(self, j: int, field: str, value) -> bytes:
        off = {"type": 0, "n_inputs": 4, "n_outputs": 40, "output": 44}.get(field)
        if off is None and field.startswith("in"):
            off = 8 + 4 * int(field[2:])
        if off is None:  # "p<i>"
            off = 48 + 4 * int(field[1:])
        return self.set(self.ops_off + 128 * j + off, "i" if field.startswith("p") else "I", value)

    def io(self, k: int, field: str, value) -> bytes:
        off, fmt = {"tensor": (0, "I"), "name_length": (4, "I"), "name_offset": (8, "Q")}[field]
        return self.set(self.io_off + 16 * k + off, fmt, value)

    def const_i32(self, tensor: int, index: int, value) -> bytes:
        t = self.b.m.tensors[tensor]
        const_off = struct.unpack_from("<Q", self.data, self.tensors_off + 48 * tensor + 40)[0]
        assert t.storage == ekm.CONST
        return self.set(self.data_off + const_off + 4 * index, "i", value)


@pytest.fixture(scope="module")
def blob(every_op):
    return Blob(*every_op)


def _tensor_where(b: Builder, pred) -> int:
    return next(i for i, t in enumerate(b.m.tensors) if pred(t))


def _malformed(blob: Blob) -> dict[str, tuple[bytes, str]]:
    b = blob.b
    m = b.m
    arena = _tensor_where(b, lambda t: t.storage == ekm.ARENA)
    c_i8 = _tensor_where(b, lambda t: t.storage == ekm.CONST and t.dtype == ekm.I8 and len(t.dims) == 4 and t.dims[0] > 1)
    c_i32 = _tensor_where(b, lambda t: t.storage == ekm.CONST and t.dtype == ekm.I32)
    io_t = m.inputs[0][0]
    conv = blob.op_at(ekm.CONV2D)
    dwconv = blob.op_at(ekm.CONV2D, 1)
    add, mul, cat = blob.op_at(ekm.ADD), blob.op_at(ekm.MUL), blob.op_at(ekm.CONCAT)
    mp, ap, gap = blob.op_at(ekm.MAXPOOL), blob.op_at(ekm.AVGPOOL), blob.op_at(ekm.GLOBAL_AVGPOOL)
    rs, tr, rz, lut, sm = (blob.op_at(t) for t in (ekm.RESHAPE, ekm.TRANSPOSE, ekm.RESIZE, ekm.LUT, ekm.SOFTMAX))
    fc, q, dq = blob.op_at(ekm.FULLY_CONNECTED), blob.op_at(ekm.QUANTIZE), blob.op_at(ekm.DEQUANTIZE)
    sl, reflect, zeros, clut = blob.op_at(ekm.SLICE), blob.op_at(ekm.PAD), blob.op_at(ekm.PAD, 1), blob.op_at(ekm.LUT_CHANNEL)
    fu, fb, fr = blob.op_at(ekm.F_UNARY), blob.op_at(ekm.F_BINARY), blob.op_at(ekm.F_REDUCE)
    fmm, fsm, fq = blob.op_at(ekm.F_MATMUL), blob.op_at(ekm.F_SOFTMAX), blob.op_at(ekm.QUANTIZE, 1)
    fdq = next(j for j, op in enumerate(m.ops) if op.type == ekm.DEQUANTIZE and m.tensors[op.outputs[0]].storage == ekm.ARENA)
    f_arena = m.ops[fu].outputs[0]
    n_t = len(m.tensors)
    conv_op = m.ops[conv]
    later_out = m.ops[conv + 1].outputs[0]
    size = len(blob.data)
    h = lambda off, fmt, v: blob.set(off, fmt, v)  # noqa: E731
    truncated = bytearray(blob.data[:-64])
    struct.pack_into("<Q", truncated, 16, len(truncated))
    struct.pack_into("<I", truncated, 24, zlib.crc32(bytes(truncated[128:])) & 0xFFFFFFFF)
    flipped = bytearray(blob.data)
    flipped[size - 70] ^= 0x10
    return {
        # header
        "short": (blob.data[:100], "shorter than the 128-byte header"),
        "magic": (blob.data[:3] + b"2" + blob.data[4:], "magic"),
        "version": (h(4, "I", 2), "version is 2"),
        "header_size": (h(8, "I", 64), "header_size is 64"),
        "flags": (h(12, "I", 1), "flags is 0x1"),
        "file_size_truncated": (blob.data[:-64], "file_size is"),
        "data_size_past_end": (bytes(truncated), "data_offset"),
        "checksum": (bytes(flipped), "checksum"),
        "reserved0": (h(44, "I", 7), "reserved0 is 7"),
        "reserved": (h(96 + 5, "B", 1), "reserved[5] is 1"),
        "n_tensors_0": (h(28, "I", 0), "n_tensors is 0"),
        "n_tensors_past_file": (h(28, "I", n_t + 5000), "tensors_offset"),
        "n_ops_huge": (h(32, "I", 2**21), "n_ops is 2097152"),
        "n_inputs_0": (h(36, "I", 0), "n_inputs is 0"),
        "n_outputs_65": (h(40, "I", 65), "n_outputs is 65"),
        "tensors_unaligned": (h(48, "Q", blob.tensors_off + 8), "tensors_offset is"),
        "ops_in_header": (h(56, "Q", 64), "inside the header"),
        "io_past_end": (h(64, "Q", size + 64), "io_offset"),
        "sections_overlap": (h(64, "Q", blob.ops_off), "overlap"),
        "arena_too_big": (h(88, "Q", 2**31), "arena_size is 2147483648"),
        "data_offset_huge": (h(72, "Q", 2**63), "data_offset"),
        # tensors
        "dtype": (blob.tensor(arena, "dtype", 9), f"tensor {arena}: dtype is 9"),
        "storage": (blob.tensor(arena, "storage", 0), f"tensor {arena}: storage is 0"),
        "rank": (blob.tensor(arena, "rank", 5), f"tensor {arena}: rank is 5"),
        "dim_zero": (blob.tensor(arena, "dims1", 0), f"tensor {arena}: dims[1] is 0"),
        "dim_past_rank": (blob.tensor(c_i32, "dims2", 3), f"tensor {c_i32}: dims[2] is 3 past rank 1"),
        "dims_product": (blob.tensor(arena, "dims1", 2**31 - 1), f"tensor {arena}: dims product"),
        "tensor_reserved": (blob.tensor(arena, "reserved", 1), f"tensor {arena}: reserved is 1"),
        "scale_nan": (blob.tensor(arena, "scale", float("nan")), f"tensor {arena}: scale is nan"),
        "scale_negative": (blob.tensor(arena, "scale", -0.5), f"tensor {arena}: scale is -0.5"),
        "scale_inf": (blob.tensor(arena, "scale", float("inf")), f"tensor {arena}: scale is inf"),
        "scale_denormal": (blob.tensor(arena, "scale", 1e-40), "finite normal float"),
        "zero_point": (blob.tensor(arena, "zp", 200), f"tensor {arena}: zero_point is 200"),
        "int32_scale": (blob.tensor(c_i32, "scale", 0.5), f"tensor {c_i32}: int32 tensors carry scale 0"),
        "arena_past_end": (blob.tensor(arena, "offset", m.arena_size), "past arena_size"),
        "arena_int32": (blob.tensor(arena, "dtype", ekm.I32), "int32 tensors carry scale 0"),
        "const_outside_data": (blob.tensor(c_i8, "offset", 2**40), "outside data"),
        "const_misaligned": (blob.tensor(c_i32, "offset", 2), "not aligned to its 4-byte elements"),
        "const_float_for_int32": (blob.tensor(c_i32, "dtype", ekm.F32), "is float32, must be int32"),
        "arena_float_misaligned": (blob.tensor(f_arena, "offset", m.tensors[f_arena].offset + 2), "not aligned to its 4-byte elements"),
        "io_int8": (blob.tensor(io_t, "dtype", ekm.I8), f"tensor {io_t}: scale is 0"),
        "io_int32": (blob.tensor(io_t, "dtype", ekm.I32), "io tensors are float32"),
        "io_offset": (blob.tensor(io_t, "offset", 64), "io tensors have offset 0"),
        # io table
        "io_tensor_range": (blob.io(0, "tensor", n_t), f"io input 0: tensor is {n_t}"),
        "io_not_io": (blob.io(0, "tensor", arena), "must be io"),
        "io_duplicate": (blob.io(1, "tensor", io_t), "already named by another io entry"),
        "io_name_empty": (blob.io(0, "name_length", 0), "name_length is 0"),
        "io_name_long": (blob.io(0, "name_length", 5000), "name_length is 5000"),
        "io_name_outside": (blob.io(0, "name_offset", 2**40), "outside data"),
        # ops: structure and dataflow
        "op_type_0": (blob.op(conv, "type", 0), f"op {conv}: type is 0"),
        "op_type_past_last": (blob.op(conv, "type", max(ekm.OP_NAMES) + 1), f"op {conv}: type is {max(ekm.OP_NAMES) + 1}"),
        "op_n_inputs": (blob.op(conv, "n_inputs", 4), f"op {conv} (CONV2D): n_inputs is 4"),
        "op_unused_input": (blob.op(q, "in3", 2), "unused inputs[3] is 2"),
        "op_n_outputs": (blob.op(conv, "n_outputs", 2), "n_outputs is 2"),
        "op_input_range": (blob.op(conv, "in0", n_t + 1), f"inputs[0] is tensor {n_t + 1}"),
        "op_output_range": (blob.op(conv, "output", n_t), f"outputs[0] is tensor {n_t}"),
        "op_output_const": (blob.op(conv, "output", c_i8), "is a const tensor"),
        "op_output_twice": (blob.op(conv + 1, "output", conv_op.outputs[0]), "already written by op"),
        "op_read_before_write": (blob.op(conv, "in0", later_out), "is read before any op writes it"),
        "op_output_is_input": (blob.op(q, "output", io_t), "is a graph input"),
        # ops: params and shapes
        "conv_stride_0": (blob.op(conv, "p2", 0), "params[2] (stride h) is 0"),
        "conv_dilation_0": (blob.op(conv, "p5", 0), "params[5] (dilation w) is 0"),
        "conv_pad_negative": (blob.op(conv, "p6", -1), "params[6] (pad top) is -1"),
        "conv_kernel_mismatch": (blob.op(conv, "p0", 5), "differ from the weights'"),
        "conv_group": (blob.op(conv, "p10", 2), "do not split into 2 groups"),
        "conv_act": (blob.op(conv, "p12", -101), "act_min -100 is greater than act_max -101"),
        "conv_act_range": (blob.op(conv, "p12", 128), "params[12] (act_max) is 128"),
        "conv_unused_param": (blob.op(conv, "p15", 1), "params[15] is 1; this op does not use it"),
        "conv_out_shape": (blob.op(dwconv, "p2", 1), "output height"),
        "conv_bias_length": (blob.op(conv, "in2", m.ops[fc].inputs[2]), "input 2 (bias) has 10 values, must be 16"),
        "conv_weights_arena": (blob.op(conv, "in1", conv_op.inputs[0]), "input 1 (weights"),
        "conv_multiplier_negative": (blob.const_i32(conv_op.inputs[3], 0, -5), "multiplier[0] is -5"),
        "conv_shift_31": (blob.const_i32(conv_op.inputs[4], 1, 31), "shift[1] is 31"),
        "conv_accumulator_bound": (blob.const_i32(conv_op.inputs[2], 2, -(2**31) + 1000),
                                   "output channel 2: |bias| + 256 * sum|w| ="),
        "add_left_shift": (blob.op(add, "p4", 23), "params[4] (left_shift) is 23"),
        "add_input_shift_positive": (blob.op(add, "p1", 1), "params[1] (shift) is 1"),
        "mul_shift": (blob.op(mul, "p1", 40), "params[1] (shift) is 40"),
        "mul_broadcast": (blob.op(mul, "in1", m.ops[conv].inputs[0]), "input b"),
        "concat_axis": (blob.op(cat, "p0", 4), "params[0] (axis) is 4"),
        "concat_unused_pair": (blob.op(cat, "p5", 3), "params[5] is 3"),
        "concat_n_inputs": (blob.op(cat, "n_inputs", 1), "unused inputs[1] is"),
        "maxpool_dilation": (blob.op(mp, "p4", 2), "params[4] (dilation h) is 2"),
        "maxpool_window": (blob.op(mp, "p0", 5), "output height"),
        "avgpool_count_include_pad": (blob.op(ap, "p10", 2), "params[10] (count_include_pad) is 2"),
        "gap_multiplier": (blob.op(gap, "p0", -1), "params[0] (multiplier) is -1"),
        "reshape_order": (blob.op(rs, "p0", 2), "params[0] (order) is 2"),
        "transpose_perm": (blob.op(tr, "p1", 0), "not a permutation"),
        "resize_mode": (blob.op(rz, "p0", 2), "params[0] (mode) is 2"),
        "lut_table": (blob.op(lut, "in1", c_i8), "(table, tensor"),
        "softmax_axis": (blob.op(sm, "p0", 0), "params[0] (axis) is 0"),
        "slice_reads_past_the_start": (blob.op(sl, "p3", 0), "outside 0.."),
        "slice_start_past_the_end": (blob.op(sl, "p2", 1000), "params[2] (start) is 1000"),
        "slice_step_0": (blob.op(sl, "p5", 0), "params[5] (step) is 0"),
        "slice_unused_param": (blob.op(sl, "p9", 1), "params[9] is 1; this op does not use it"),
        "pad_reflect_past_the_edge": (blob.op(reflect, "p2", 1000), "params[2] (pad before) is 1000"),
        "pad_reflect_interior": (blob.op(reflect, "p9", 1), "params[9] (interior) is 1"),
        "pad_out_shape": (blob.op(zeros, "p5", 3), "the pads make"),
        "pad_mode": (blob.op(zeros, "p12", 3), "params[12] (mode) is 3"),
        "pad_value": (blob.op(zeros, "p13", 300), "params[13] (value) is 300"),
        "lut_channel_table": (blob.op(clut, "in1", m.ops[lut].inputs[1]), "(table, tensor"),
        "fc_weights_shape": (blob.op(fc, "in1", c_i8), "input 1 (weights"),
        "quantize_layout": (blob.op(q, "p0", 0), "shape differs"),
        "dequantize_layout": (blob.op(dq, "p0", 5), "params[0] (nhwc_to_nchw) is 5"),
        # the float ops of the islands
        "f_unary_operation": (blob.op(fu, "p0", 99), "params[0] (operation) is 99"),
        "f_unary_alpha_nan": (blob.op(fu, "p1", 0x7FC00000), "params[1] (alpha) is not a finite float"),
        "f_unary_int8_input": (blob.op(fu, "in0", m.ops[conv].outputs[0]), "is int8, must be float32"),
        "f_unary_unused_param": (blob.op(fu, "p4", 1), "params[4] is 1; this op does not use it"),
        "f_binary_operation": (blob.op(fb, "p0", 8), "params[0] (operation) is 8"),
        "f_binary_broadcast": (blob.op(fb, "in1", m.ops[fmm].inputs[1]), "do not broadcast"),
        "f_reduce_no_axes": (blob.op(fr, "p1", 0), "params[1] (axes) is 0"),
        "f_reduce_axes_shape": (blob.op(fr, "p1", 1), "the axes make"),
        "f_reduce_kind": (blob.op(fr, "p0", 3), "params[0] (kind) is 3"),
        "f_matmul_shapes": (blob.op(fmm, "in1", m.ops[fmm].inputs[0]), "does not give"),
        "f_softmax_unused_param": (blob.op(fsm, "p3", 1), "params[3] is 1; this op does not use it"),
        "quantize_int8_input": (blob.op(fq, "in0", m.ops[conv].outputs[0]), "is int8, must be float32"),
        "dequantize_to_float_layout": (blob.op(fdq, "p0", 0), "shape differs"),
        "reshape_order_1_float": (blob.op(blob.op_at(ekm.RESHAPE, 2), "p0", 1), "is for int8 tensors"),
        "maxpool_quant_mismatch": (blob.tensor(m.ops[mp].outputs[0], "zp", 77), "does not requantize"),
        "graph_output_unwritten": (h(32, "I", len(m.ops) - 1), "is never written by an op"),
        "memory_plan_overlap": (blob.tensor(m.ops[q].outputs[0], "offset", m.tensors[conv_op.outputs[0]].offset),
                                "share arena bytes"),
    }


def test_loader_rejects_every_malformed_field(blob):
    cases = _malformed(blob)
    assert len(cases) > 90
    _ekrt.Model(blob.data)  # the unmutated file loads
    failures = []
    for name, (data, needle) in cases.items():
        try:
            _ekrt.Model(data)
        except _ekrt.FormatError as exc:
            if needle not in str(exc):
                failures.append(f"{name}: {exc} (wanted {needle!r})")
        else:
            failures.append(f"{name}: loaded")
    assert not failures, "\n".join(failures)


_MUTATE_SCRIPT = r"""
import random, struct, sys, zlib
from edgekit import _ekrt
import numpy as np
data = open(sys.argv[1], 'rb').read()
rng = random.Random(int(sys.argv[2]))
loaded = rejected = 0
for i in range(int(sys.argv[3])):
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        pos = rng.randrange(len(buf)) if rng.random() < 0.5 else rng.randrange(min(len(buf), 1024))
        kind = rng.random()
        if kind < 0.6:
            buf[pos] = rng.randrange(256)
        elif kind < 0.8:
            struct.pack_into('<i', buf, pos - pos % 4, rng.choice((0, 1, -1, 2**31 - 1, -2**31, 64, 255, 2**16)))
        else:
            buf[pos] ^= 1 << rng.randrange(8)
    if rng.random() < 0.95:
        struct.pack_into('<I', buf, 24, zlib.crc32(bytes(buf[128:])) & 0xFFFFFFFF)
    try:
        m = _ekrt.Model(bytes(buf))
    except _ekrt.FormatError:
        rejected += 1
        continue
    loaded += 1
    xs = [np.zeros(shape, np.float32) for _, shape in m.inputs]
    if m.memory_bytes < (64 << 20):
        m.run(xs)
print(loaded, rejected)
"""


def test_loader_survives_random_mutations(every_op, tmp_path):
    """A fuzzer without clang: 3000 mutated files (checksum fixed up) load or are rejected, and a
    loaded one runs; a crash kills the subprocess and fails here."""
    path = tmp_path / "m.ekm"
    path.write_bytes(every_op[1])
    r = subprocess.run([sys.executable, "-c", _MUTATE_SCRIPT, str(path), "1", "3000"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    loaded, rejected = map(int, r.stdout.split())
    assert rejected > 1500 and loaded > 10  # both paths were exercised


def test_fuzz_regressions_replay(tmp_path):
    """Inputs the fuzzer once crashed on (tests/fuzz-regressions/) load or are rejected cleanly."""
    files = sorted(p for p in REGRESSIONS.glob("*") if p.is_file() and p.suffix != ".md") if REGRESSIONS.is_dir() else []
    script = (  # the harness's fix-up first: file_size and checksum, as fuzz_ekm.c does
        "import struct, sys, zlib\nfrom edgekit import _ekrt\nimport numpy as np\n"
        "for p in sys.argv[1:]:\n"
        "    b = bytearray(open(p, 'rb').read())\n"
        "    if len(b) >= 128:\n"
        "        struct.pack_into('<Q', b, 16, len(b))\n"
        "        struct.pack_into('<I', b, 24, zlib.crc32(bytes(b[128:])) & 0xFFFFFFFF)\n"
        "    try:\n        m = _ekrt.Model(bytes(b))\n    except _ekrt.FormatError:\n        continue\n"
        "    if m.memory_bytes < (64 << 20):\n        m.run([np.zeros(s, np.float32) for _, s in m.inputs])\n"
        "print(len(sys.argv) - 1)\n"
    )
    r = subprocess.run([sys.executable, "-c", script, *map(str, files)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"a regression input crashes the loader again: {r.stderr[-2000:]}"
    assert int(r.stdout) == len(files)


# -- C hygiene: -Wall -Wextra -Werror with gcc and clang ------------------------------------------


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_c_sources_are_warning_free(cc):
    if not shutil.which(cc):
        pytest.skip(f"{cc} is not installed")
    import sysconfig

    files = [*sorted((CSRC / "src").glob("*.c")), *sorted((CSRC / "tools").glob("*.c")), CSRC / "python" / "module.c",
             *sorted((CSRC / "fuzz").glob("*.c"))]
    r = subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{CSRC / 'include'}",
                        f"-I{sysconfig.get_paths()['include']}", *map(str, files)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


# -- the static runner -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from edgekit.targets.native.build import BuildError, build_runner, why_not_buildable

    reason = why_not_buildable("x86_64" if os.uname().machine == "x86_64" else os.uname().machine)
    if reason:
        pytest.skip(reason)
    os.environ.setdefault("EDGEKIT_CACHE_DIR", str(tmp_path_factory.mktemp("runner-cache")))
    try:
        return build_runner()
    except BuildError as exc:  # e.g. no static libc: name it instead of a traceback
        pytest.fail(f"{exc.message} ({exc.hint})")


def _ekrt_cli(runner, *args, env=None):
    return subprocess.run([str(runner), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_runner_info_json(runner, every_op, tmp_path):
    path = tmp_path / "m.ekm"
    path.write_bytes(every_op[1])
    r = _ekrt_cli(runner, "info", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "edgekit.ekrt.info" and doc["isa"] == _ekrt.isa()
    assert doc["kernels"] == _ekrt.kernels() and doc["features"] == _ekrt.features()
    assert doc["model"]["ops"] == len(every_op[0].m.ops)
    assert doc["model"]["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
    forced = json.loads(_ekrt_cli(runner, "info", "--json", env={"EKRT_ISA": "scalar"}).stdout)
    assert forced["isa"] == "scalar" and forced["forced_isa"] == "scalar"
    assert set(forced["kernels"].values()) == {
        "ek_qs8_gemm_ukernel_1x4c1__scalar", "ek_qs8_dwconv_ukernel_c1__scalar",
        "ek_qs8_vadd_ukernel__scalar_u1", "ek_qs8_vmul_ukernel__scalar_u1",
        "ek_x8_lut_ukernel__scalar_u4", "ek_f32_qs8_cvt_ukernel__scalar_u1"}
    human = _ekrt_cli(runner, "info")
    assert human.returncode == 0 and f"isa: {_ekrt.isa()}" in human.stdout


def test_runner_reports_the_threads_it_chose(runner, every_op, tmp_path, monkeypatch):
    monkeypatch.delenv("EKRT_WORK_PER_THREAD", raising=False)
    tiny, big = tmp_path / "tiny.ekm", tmp_path / "big.ekm"
    tiny.write_bytes(every_op[1])
    big.write_bytes(big_and_tiny_model().finish())
    for path in (tiny, big):
        info = json.loads(_ekrt_cli(runner, "info", path, "--json").stdout)
        assert info["model"]["threads"] == _ekrt.Model(str(path)).threads
        r = _ekrt_cli(runner, "bench", path, "--json", "--iterations", "3", "--warmup", "1")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["config"]["threads"] is None  # not asked for
        assert doc["backend_info"]["threads"] == info["model"]["threads"]
    # the break-even work per thread is per ISA (scalar's is 8x lower than avx2's, and every_op's
    # largest op is above it): held to avx2, which every x86-64 host here has, tiny runs on one
    pin = {"EKRT_ISA": "avx2"} if platform.machine().lower() in ("x86_64", "amd64") else {}
    tiny_avx2 = json.loads(_ekrt_cli(runner, "info", tiny, "--json", env=pin).stdout)["model"]
    assert tiny_avx2["threads"] == 1, tiny_avx2


# A LUT after the convolution whose output only it reads is folded in (the convolution applies
# the table to each task's outputs): every conv path and a grouped one (tiles narrower than the
# row), at 1-3 threads, give the reference's bytes; a LUT whose input another op reads too,
# and one placed (by hand) on the bytes of the convolution's input, stay separate ops.
_FUSE_CASES = {
    "im2col": lambda b, x: b.lut(b.conv(x, 24, (3, 3))),
    "direct_1x1": lambda b, x: b.lut(b.conv(x, 40, (1, 1), pads=(0, 0, 0, 0))),
    "depthwise": lambda b, x: b.lut(b.conv(x, 12, (3, 3), group=12)),
    "grouped": lambda b, x: b.lut(b.conv(x, 12, (3, 3), group=3)),
    "fc": lambda b, x: b.lut(b.fc(b.simple(ekm.RESHAPE, [x], (1, 9 * 11 * 12), {0: 1}), 37)),
    "two_readers": lambda b, x: (lambda c: b.add(b.lut(c), c))(b.conv(x, 12, (3, 3))),
}


@pytest.mark.parametrize("case", sorted(_FUSE_CASES))
def test_a_lut_after_a_convolution_is_fused_with_the_same_bytes(case, runner, tmp_path):
    b = _one_op(_FUSE_CASES[case])
    data = b.finish()
    model = _ekrt.Model(data)
    xs = inputs_for(b, 3)
    want = reference(b, xs)[0]
    for threads in (1, 2, 3):
        model.set_threads(threads)
        np.testing.assert_array_equal(model.run(xs)[0], want)
    path = tmp_path / "m.ekm"
    path.write_bytes(data)
    r = _ekrt_cli(runner, "bench", path, "--json", "--iterations", "2", "--warmup", "0", "--profile")
    assert r.returncode == 0, r.stderr
    fused = [layer["op"] for layer in json.loads(r.stdout)["layers"] if layer.get("fused")]
    assert fused == ([] if case == "two_readers" else ["LUT"])


def test_a_lut_on_its_convolutions_input_bytes_is_not_fused(runner, tmp_path):
    b = _one_op(lambda b, x: b.lut(b.conv(b.conv(x, 12, (1, 1), pads=(0, 0, 0, 0)), 12, (3, 3))))
    b.finish()
    j = next(j for j, op in enumerate(b.m.ops) if op.type == ekm.LUT)
    conv, lut = b.m.ops[j - 1], b.m.ops[j]
    assert conv.type == ekm.CONV2D and lut.inputs[0] == conv.outputs[0]
    x, y = b.m.tensors[conv.inputs[0]], b.m.tensors[lut.outputs[0]]
    y.offset = x.offset  # as a plan without the fusion rule may place it: x dies at the conv
    data = ekm.to_bytes(b.m)
    xs = inputs_for(b, 4)
    np.testing.assert_array_equal(_ekrt.Model(data).run(xs)[0], reference(b, xs)[0])
    path = tmp_path / "m.ekm"
    path.write_bytes(data)
    doc = json.loads(_ekrt_cli(runner, "bench", path, "--json", "--iterations", "1", "--warmup", "0", "--profile").stdout)
    assert not any(layer.get("fused") for layer in doc["layers"])


def test_runner_bench_json_is_the_agent_schema(runner, every_op, tmp_path):
    from edgekit.bench.record import make_record

    path = tmp_path / "m.ekm"
    path.write_bytes(every_op[1])
    r = _ekrt_cli(runner, "bench", path, "--json", "--iterations", "7", "--warmup", "2", "--threads", "2",
                  "--profile", "--variant", "int8", "--bundle-hash", "ab12")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "edgekit.bench" and doc["schema"] == 1 and doc["backend"] == "native"
    assert len(doc["samples_ns"]) == 7 and all(s > 0 for s in doc["samples_ns"])
    assert doc["config"] == {"warmup": 2, "warmup_mode": "fixed", "iterations": 7, "duration_s": None, "min_time_s": None, "threads": 2, "batch": 1}
    assert doc["model_sha256"] == hashlib.sha256(every_op[1]).hexdigest() and doc["bundle_hash"] == "ab12"
    assert [layer["op"] for layer in doc["layers"]] == [ekm.OP_NAMES[op.type] for op in every_op[0].m.ops]
    # each op: the median over the profiled runs (7 here) between its quartiles, not a mean
    assert all(x["calls"] == 7 and x["ns_p25"] <= x["ns"] <= x["ns_p75"] for x in doc["layers"]), doc["layers"]
    assert doc["backend_info"]["isa"] == _ekrt.isa() and doc["backend_info"]["threads"] == 2
    assert doc["device"]["arch"] == os.uname().machine and doc["peak_rss_bytes"] > 0
    record = make_record(doc, model_name="m", target="local", device="local")
    assert record["stats"]["n"] == 7 and record["stats"]["p50"] > 0
    timed = json.loads(_ekrt_cli(runner, "bench", path, "--json", "--duration", "0.2", "--warmup", "0").stdout)
    assert timed["config"]["iterations"] is None and timed["config"]["duration_s"] == 0.2 and timed["samples_ns"]
    # --min-time: at least the count and at least that long (the window is the runner's own clock)
    least = json.loads(_ekrt_cli(runner, "bench", path, "--json", "--iterations", "3", "--min-time", "0.2", "--warmup", "0").stdout)
    assert least["config"]["iterations"] == 3 and least["config"]["min_time_s"] == 0.2 and len(least["samples_ns"]) > 3
    start, end = least["timed_window_ns"]
    assert end - start >= 0.2e9
    r = _ekrt_cli(runner, "bench", path, "--min-time", "-1")  # without --json: the error line on stderr
    assert r.returncode == 2 and "--min-time wants seconds > 0" in r.stderr, r


def test_runner_run_matches_the_extension(runner, every_op, tmp_path):
    b, blob = every_op
    path = tmp_path / "m.ekm"
    path.write_bytes(blob)
    model = _ekrt.Model(blob)
    # seeded inputs: the same values as numpy.random.RandomState(0).standard_normal (the agent's)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = _ekrt_cli(runner, "run", path, "--save", out_dir)
    assert r.returncode == 0, r.stderr
    x = np.random.RandomState(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    for i, want in enumerate(model.run([x])):
        np.testing.assert_array_equal(np.load(out_dir / f"output{i}.npy"), want)
    # given inputs, several threads, JSON values
    x2 = inputs_for(b, 4)[0]
    np.save(tmp_path / "x.npy", x2)
    r = _ekrt_cli(runner, "run", path, "--inputs", tmp_path / "x.npy", "--threads", "3", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for out, want in zip(doc["outputs"], model.run([x2])):
        np.testing.assert_array_equal(np.array(out["values"], np.float32).reshape(out["shape"]), want)
    # samples stacked along the first axis run in one process, outputs stacked alike (the agent's
    # evaluation); a file that is not a whole number of samples is refused
    xs = np.concatenate([inputs_for(b, seed)[0] for seed in (5, 6, 7)])
    np.save(tmp_path / "xs.npy", xs)
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    r = _ekrt_cli(runner, "run", path, "--inputs", tmp_path / "xs.npy", "--save", stacked)
    assert r.returncode == 0, r.stderr
    for i, outs in enumerate(zip(*(model.run([xs[s : s + 1]]) for s in range(3)))):
        np.testing.assert_array_equal(np.load(stacked / f"output{i}.npy"), np.concatenate(outs))
    np.save(tmp_path / "bad.npy", xs[:, :2])  # three samples of the wrong channel count
    r = _ekrt_cli(runner, "run", path, "--inputs", tmp_path / "bad.npy")
    assert r.returncode != 0 and "the input wants" in r.stderr
    r = _ekrt_cli(runner, "bench", path, "--inputs", tmp_path / "xs.npy", "--iterations", "2")
    assert r.returncode != 0 and "the input wants" in r.stderr  # bench times one sample, as given
    # integer inputs (byte or token ids) are read as the float32 the model takes
    ids = np.random.RandomState(8).randint(-300, 300, (1, 3, 16, 16))
    for dtype in (np.int32, np.int64):
        np.save(tmp_path / "ids.npy", ids.astype(dtype))
        out = tmp_path / f"ids_{np.dtype(dtype).name}"
        out.mkdir()
        r = _ekrt_cli(runner, "run", path, "--inputs", tmp_path / "ids.npy", "--save", out)
        assert r.returncode == 0, r.stderr
        for i, want in enumerate(model.run([ids.astype(np.float32)])):
            np.testing.assert_array_equal(np.load(out / f"output{i}.npy"), want)


def test_runner_errors(runner, every_op, tmp_path):
    bad = Blob(*every_op).op(1, "p2", 0)
    (tmp_path / "bad.ekm").write_bytes(bad)
    r = _ekrt_cli(runner, "run", tmp_path / "bad.ekm")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and "params[2] (stride h) is 0" in lines[0]
    assert lines[1].startswith("hint: ")
    r = _ekrt_cli(runner, "bench", tmp_path / "missing.ekm", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["kind"] == "edgekit.error" and "cannot open" in doc["error"] and doc["hint"]
    r = _ekrt_cli(runner, "bench", tmp_path / "bad.ekm", "--iterations", "0")
    assert r.returncode == 2 and "--iterations wants an integer" in r.stderr
    r = _ekrt_cli(runner, "frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr
    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 16, 15), np.float32))
    (tmp_path / "m.ekm").write_bytes(every_op[1])
    r = _ekrt_cli(runner, "run", tmp_path / "m.ekm", "--inputs", tmp_path / "wrong.npy")
    assert r.returncode == 1 and "the input wants 768" in r.stderr


# -- under qemu: the cross-built runner takes the NEON and the SDOT paths -----------------------


@pytest.fixture
def aarch64_runner() -> tuple[str, Path]:
    """(qemu-aarch64, the cross-built static runner), or a skip saying what is missing."""
    from edgekit.targets.native.build import BuildError, build_runner, why_not_buildable

    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not qemu:
        pytest.skip("qemu-aarch64-static is not installed (apt-get install qemu-user-static)")
    reason = why_not_buildable("aarch64")
    if reason:
        pytest.skip(reason)
    try:
        return qemu, build_runner("aarch64")
    except BuildError as exc:
        pytest.fail(f"{exc.message} ({exc.hint})")


def test_runner_under_qemu_aarch64(every_op, aarch64_runner, tmp_path):
    qemu, runner = aarch64_runner
    b, blob = every_op
    path = tmp_path / "m.ekm"
    path.write_bytes(blob)
    x = inputs_for(b, 6)[0]
    np.save(tmp_path / "x.npy", x)
    want = _ekrt.Model(blob).run([x])
    for cpu, isa in (("cortex-a72", "neon"), ("cortex-a76", "neondot")):
        env = {k: v for k, v in os.environ.items() if k != "EKRT_ISA"}  # an x86 ISA forced for the suite is not this CPU's
        info = subprocess.run([qemu, "-cpu", cpu, str(runner), "info", "--json"], capture_output=True, text=True, timeout=120, env=env)
        assert info.returncode == 0, info.stderr
        doc = json.loads(info.stdout)
        assert doc["arch"] == "aarch64" and doc["isa"] == isa, doc
        assert doc["kernels"]["qs8-gemm"].endswith("__" + isa)
        out = tmp_path / cpu
        out.mkdir()
        r = subprocess.run([qemu, "-cpu", cpu, str(runner), "run", str(path), "--inputs", str(tmp_path / "x.npy"),
                            "--threads", "2", "--save", str(out)], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        for i, w in enumerate(want):
            np.testing.assert_array_equal(np.load(out / f"output{i}.npy"), w, err_msg=f"{cpu} output {i}")


def test_float_ops_under_qemu_aarch64_equal_the_x86_extension(aarch64_runner, tmp_path):
    """Every F_UNARY / F_BINARY function through the cross-built runner (aarch64's libm, NEON
    build): the same float32 bits as the x86 extension (each value computed in double, rounded once)."""
    qemu, runner = aarch64_runner
    b = Builder(11)
    x = b.input((1, 12, 9, 11), scale=0.04, zp=0)
    for kind, names in (("unary", ekm.UNARY_FUNCS), ("binary", ekm.BINARY_FUNCS)):
        for name in names:
            b.float_output(_float_case(kind, name)(b, x), f"{kind}_{name}")
    for kind in ("reduce", "matmul", "softmax"):
        b.float_output(_float_case(kind, "ReduceMax")(b, x), kind)
    blob = b.finish()
    (tmp_path / "m.ekm").write_bytes(blob)
    xs = inputs_for(b, 4)
    np.save(tmp_path / "x.npy", xs[0])
    want = _ekrt.Model(blob).run(xs)
    env = {k: v for k, v in os.environ.items() if k != "EKRT_ISA"}
    r = subprocess.run([qemu, "-cpu", "cortex-a72", str(runner), "run", str(tmp_path / "m.ekm"), "--inputs", str(tmp_path / "x.npy"),
                        "--save", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    for i, ((_, name), w) in enumerate(zip(b.m.outputs, want)):
        np.testing.assert_array_equal(np.load(tmp_path / f"output{i}.npy"), w, err_msg=name)


def test_reduce_max_over_rows_under_qemu_aarch64(aarch64_runner, tmp_path):
    """The same rows through the cross-built runner: NEON's lanes keep the loop's bits too."""
    qemu, runner = aarch64_runner
    b, axes_of = _reduce_max_model()
    (tmp_path / "m.ekm").write_bytes(b.finish())
    feeds = []
    for i, x in enumerate(inputs_for(b, 3)):
        feeds.append(str(tmp_path / f"x{i}.npy"))
        np.save(feeds[-1], x)
    r = subprocess.run([qemu, "-cpu", "cortex-a72", str(runner), "run", str(tmp_path / "m.ekm"), "--inputs", *feeds,
                        "--save", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _assert_max_in_order([np.load(tmp_path / f"output{i}.npy") for i in range(2 * len(axes_of))], axes_of)


# -- one description of the sources; a compiler without an ISA's flags still builds ------------


def test_sources_description_per_arch_and_fallbacks():
    x86 = sources.c_sources("x86_64", "extension")
    names = {s.path.name for s in x86.sources}
    assert "module.c" in names and "ekrt.c" not in names and "loader.c" in names
    assert not any("neon" in n for n in names)
    assert {s.isa for s in x86.sources} >= {None, "scalar", "avx2", "avx512vnni"}
    assert all(s.flags == ("-mavx2",) for s in x86.sources if s.isa == "avx2")
    arm = sources.c_sources("arm64", "runner")
    assert arm.arch == "aarch64" and "ekrt.c" in {s.path.name for s in arm.sources}
    assert all(s.flags == ("-march=armv8.2-a+dotprod",) for s in arm.sources if s.isa == "neondot")
    # zig only takes -mcpu: the second alternative wins
    zig_like = sources.c_sources("aarch64", "runner", supported=lambda isa, flags: flags[0].startswith("-mcpu"))
    assert {s.flags for s in zig_like.sources if s.isa == "neondot"} == {("-mcpu=generic+dotprod",)}
    # a compiler that takes no ISA flag: those files are left out, their defines are set
    bare = sources.c_sources("x86_64", "runner", supported=lambda isa, flags: False)
    assert {s.isa for s in bare.sources} == {None, "scalar"}
    assert set(bare.defines) == {"EK_NO_AVX2", "EK_NO_AVX512VNNI", "EK_NO_AVX512VBMI", "EK_NO_AMX"}
    assert set(bare.skipped) == {"avx2", "avx512vnni", "avx512vbmi", "amx"}
    assert sources.isa_of("qs8-vadd-avx2-u16.c", {"avx2": {}, "scalar": {}}) == "avx2"
    with pytest.raises(ValueError, match="must be one of"):
        sources.c_sources("x86_64", "wheel")


def test_a_build_without_simd_flags_links_and_runs_scalar(every_op, tmp_path):
    """What setup.py / build.py do when the compiler rejects every ISA flag: the kernel files are
    left out, -DEK_NO_<ISA> drops them from the lists, and the result runs the scalar kernels."""
    from edgekit.targets.native import sources

    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc or os.uname().machine != "x86_64":
        pytest.skip("needs gcc on x86_64")
    ss = sources.c_sources("x86_64", "runner", supported=lambda isa, flags: False)
    exe = tmp_path / "ekrt"
    r = subprocess.run([cc, *ss.cflags, *(f"-I{d}" for d in ss.include_dirs), *(f"-D{d}=1" for d in ss.defines),
                        *(str(s.path) for s in ss.sources), "-o", str(exe), *(f"-l{lib}" for lib in ss.libraries)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(subprocess.run([str(exe), "info", "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert doc["built_isas"] == ["scalar"] and doc["isa"] == "scalar"
    path = tmp_path / "m.ekm"
    path.write_bytes(every_op[1])
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run([str(exe), "run", str(path), "--save", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    x = np.random.RandomState(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    for i, want in enumerate(_ekrt.Model(every_op[1]).run([x])):
        np.testing.assert_array_equal(np.load(out / f"output{i}.npy"), want)


def test_in_place_elementwise_and_reshape_alias_are_exact():
    """The loader accepts an output at its dying input's bytes for LUT/ADD/MUL and a RESHAPE
    order 0 at its input's offset (docs/ekrt.md); the results stay exact."""
    b = Builder(11)
    x = b.input((1, 8, 6, 5))
    c1 = b.conv(x, 16, (3, 3))
    lu = b.lut(c1)
    ad = b.add(lu, b.const_act((1, 1, 1, 16)))
    mu = b.add(ad, b.const_act((1, 1, 1, 16)), op=ekm.MUL)
    rs = b.simple(ekm.RESHAPE, [mu], (1, 6 * 5 * 16), {0: 0})
    b.output(rs)
    plan_memory(b.m)
    for t in (lu, ad, mu, rs):
        b.t(t).offset = b.t(c1).offset
    model = _ekrt.Model(ekm.to_bytes(b.m))
    xs = inputs_for(b, 2)
    np.testing.assert_array_equal(model.run(xs)[0], reference(b, xs)[0])
    # the same bytes for a conv's output and its input: rejected
    b.t(c1).offset = b.t(x).offset = 0
    with pytest.raises(_ekrt.FormatError, match="share arena bytes"):
        _ekrt.Model(ekm.to_bytes(b.m))
