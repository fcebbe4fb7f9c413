"""``+gptq``: each layer's int8 weights rounded against its float inputs, not to the nearest step.

Rounding every weight to its nearest int8 step leaves errors that add up in the layer's output
``W x``. GPTQ (Frantar et al. 2022, after Optimal Brain Quantization) rounds the columns of
``W`` (an output channel per row) one at a time and moves each column's rounding error onto the
columns not rounded yet, weighted by the inverse Hessian ``H = sum x x^T`` of the layer's inputs
on the calibration samples, so that those columns absorb it where the inputs correlate. The
scale of every channel stays the one round-to-nearest uses (``qmath.weight_params``): only which
integer each weight gets changes.

Why: on EfficientNet-Lite0 (ImageNet weights, 64 held-out photos) edgekit's int8 top-1
agreement was 0.92-0.94 and stayed 0.9375 with every activation left float: its loss was the
weights' rounding (``benchmarks/weight_rounding.py``). GPTQ weights (weights only) brought it to
0.969; on oww-embedding, a model never tuned on, int8 cosine 0.997 -> 0.999.

What is rounded this way: Conv (group 1, or depthwise: one Hessian per channel), Gemm and MatMul
with a constant weight. Other layers (grouped or transposed convolutions, dilated kernels) keep
round-to-nearest. Each layer's Hessian sees at most ``COLUMNS`` of its input positions per
sample (a seeded subsample), so the cost does not grow with the image size.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx

from edgekit.quantize import qmath
from edgekit.quantize.rewrite import Analysis
from edgekit.quantize.rules import attr
from edgekit.quantize.scheme import QuantScheme, weight_qmax_of

COLUMNS = 1024  # input positions per sample and layer that enter its Hessian
DAMP = 0.01  # of the Hessian's mean diagonal, added to its diagonal (GPTQ's dampening)
BLOCK = 64  # columns rounded between two updates of the rest (solve)


class Layer:
    """One layer GPTQ rounds: its node, weight, and how its input becomes rows of ``W``'s columns."""

    def __init__(self, node: onnx.NodeProto, weight: str, axis: int | None, w: np.ndarray) -> None:
        self.node, self.weight, self.axis, self.w = node, weight, axis, w
        self.input = node.input[0]
        self.depthwise = node.op_type == "Conv" and int(attr(node, "group", 1)) > 1
        self.hessian: np.ndarray | float = 0.0
        self.samples = 0
        self.rng = np.random.default_rng(0)  # the positions a sample contributes: its own stream per layer
        self.source = self  # the layer whose Hessian this one's is (another reading the same patches)

    @property
    def geometry(self) -> tuple:
        """What makes two layers' Hessians the same: their input and how it becomes columns."""
        n = self.node
        if n.op_type != "Conv":
            return (self.input, "rows")
        return (self.input, self.depthwise, self.w.shape[1:], tuple(attr(n, "strides", [1, 1])), tuple(attr(n, "pads", [0, 0, 0, 0])))

    def add(self, x: np.ndarray) -> None:
        """Add one sample's input ``x`` to the Hessian (float32 sums: 16 samples x 1024 positions
        lose nothing GPTQ can see, and a float64 copy of a 2304 x 2304 sum per sample was a
        fifth of the collection's time)."""
        rng = self.rng
        if self.node.op_type == "Conv":
            cols = self._positions(x, rng)
            if self.depthwise:  # one K x K Hessian per channel: channels split over the cores, each the same sums
                taps = self.w.shape[2] * self.w.shape[3]
                h = _by_channels(lambda a, b: _grams(self._patches(x[:, a:b], cols)), x.shape[1], taps * taps * len(cols))
            else:
                p = self._patches(x, cols)  # (1, C*K*K, L), float32
                h = p[0] @ p[0].T
        else:  # Gemm / MatMul: the last axis is the reduction
            rows = x.reshape(-1, x.shape[-1]).astype(np.float32, copy=False)
            if rows.shape[0] > COLUMNS:
                rows = rows[np.sort(rng.choice(rows.shape[0], COLUMNS, replace=False))]
            h = rows.T @ rows
        if isinstance(self.hessian, np.ndarray):
            self.hessian += h
        else:
            self.hessian = h
        self.samples += 1

    def _out_hw(self, x: np.ndarray) -> tuple[int, int]:
        n = self.node
        kh, kw = self.w.shape[2:]
        s, p = attr(n, "strides", [1, 1]), attr(n, "pads", [0, 0, 0, 0])
        return (x.shape[2] + p[0] + p[2] - kh) // s[0] + 1, (x.shape[3] + p[1] + p[3] - kw) // s[1] + 1

    def _positions(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The output positions (flat, sorted) whose input patches one sample adds: at most COLUMNS."""
        ho, wo = self._out_hw(x)
        return np.sort(rng.choice(ho * wo, size=min(COLUMNS, ho * wo), replace=False))

    def _patches(self, x: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(C, K*K, L) for a depthwise Conv, else (1, C*K*K, L): the input patches of the output
        positions ``cols``, in ``W``'s column order."""
        n = self.node
        kh, kw = self.w.shape[2:]
        s, p = attr(n, "strides", [1, 1]), attr(n, "pads", [0, 0, 0, 0])
        wo = self._out_hw(x)[1]
        oy, ox = np.divmod(cols, wo)
        if kh == kw == 1 and not any(p):  # a 1x1: the positions' pixels, no padded copy of the input
            flat = x[0].astype(np.float32, copy=False).reshape(x.shape[1], -1)
            v = np.take(flat, oy * s[0] * x.shape[3] + ox * s[1], axis=1)
            return v[:, None, :] if self.depthwise else v[None]
        x = np.pad(x[0].astype(np.float32, copy=False), ((0, 0), (p[0], p[2]), (p[1], p[3])))
        c = x.shape[0]
        ky, kx = np.divmod(np.arange(kh * kw), kw)
        v = x[:, oy[None, :] * s[0] + ky[:, None], ox[None, :] * s[1] + kx[:, None]]  # C, K, L: only the positions drawn
        return v if self.depthwise else v.reshape(1, c * kh * kw, -1)


def _grams(p: np.ndarray) -> np.ndarray:
    """p p^T of each (K, L) of ``p`` (C, K, L)."""
    return np.einsum("ckn,cln->ckl", p, p, optimize=True)


SPLIT_WORK = 4_000_000  # multiply-adds of a sample's depthwise Hessians below which one thread does them
SPLIT_CHANNELS = 16  # channels per part, at least


@functools.lru_cache(maxsize=1)
def _pool() -> tuple[ThreadPoolExecutor | None, int]:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return (ThreadPoolExecutor(cores, thread_name_prefix="edgekit-gptq") if cores > 1 else None), cores


def _by_channels(fn: Callable[[int, int], np.ndarray], channels: int, per_channel: int) -> np.ndarray:
    """``fn(0, channels)``, computed as channel ranges on every core when the work pays for it
    (numpy's einsum runs one thread, and releases the GIL): each channel's sums are the ones
    ``fn`` makes alone, so the result is the same to the bit."""
    pool, cores = _pool()
    parts = min(cores, channels // SPLIT_CHANNELS, channels * per_channel // max(SPLIT_WORK, 1)) if pool is not None else 1
    if parts <= 1:
        return fn(0, channels)
    cuts = np.linspace(0, channels, parts + 1).round().astype(int)
    return np.concatenate(list(pool.map(fn, cuts[:-1], cuts[1:])))


def layers(model: onnx.ModelProto, analysis: Analysis) -> list[Layer]:
    """The quantized layers GPTQ can round (see the module's docstring)."""
    out = []
    for node in model.graph.node:
        r = analysis.rules.get(node.name)
        if r is None or r.weight is None or r.weight != 1 or not node.input or node.input[0] in analysis.consts:
            continue
        w = analysis.consts.get(node.input[1])
        if w is None:
            continue
        if node.op_type == "Conv":
            group = int(attr(node, "group", 1))
            ok = (w.ndim == 4 and r.weight_axis in (0, None) and attr(node, "dilations", [1, 1]) == [1, 1]
                  and attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET") and (group == 1 or (group == w.shape[0] and w.shape[1] == 1)))
        elif node.op_type == "Gemm":
            ok = w.ndim == 2 and not attr(node, "transA", 0) and r.weight_axis in ((0 if attr(node, "transB", 0) else 1), None)
        elif node.op_type == "MatMul":
            ok = w.ndim == 2 and r.weight_axis in (1, None)
        else:
            ok = False
        if ok:
            out.append(Layer(node, node.input[1], r.weight_axis, w))
    return out


def inverse_factor(H: np.ndarray) -> np.ndarray:
    """The upper triangular U with ``H^-1 = U^T U`` for each (d, d) of ``H`` (n, d, d), positive
    definite: what GPTQ reads its updates from. With P the reversal of the axes, PHP = L L^T gives
    H^-1 = (P L^-1 P)^T (P L^-1 P), and P L^-1 P is upper triangular: one Cholesky factor and one
    triangular inverse, not an inverse and then a Cholesky factor of it (3x fewer flops; in
    float32, as GPTQ does: the float64 inverse was 70 % of the solve's time on nudenet-320n)."""
    L = np.linalg.cholesky(H[:, ::-1, ::-1])
    return _lower_inverse(L)[:, ::-1, ::-1]


def _lower_inverse(L: np.ndarray) -> np.ndarray:
    """The inverse of each lower triangular (d, d) of ``L``, by halves: [A 0; B C]^-1 =
    [A^-1 0; -C^-1 B A^-1 C^-1] (matrix products, where BLAS is fast)."""
    d = L.shape[-1]
    if d <= 128:
        return np.tril(np.linalg.inv(L))
    h = d // 2
    Ai, Ci = _lower_inverse(L[:, :h, :h]), _lower_inverse(L[:, h:, h:])
    out = np.zeros_like(L)
    out[:, :h, :h], out[:, h:, h:] = Ai, Ci
    out[:, h:, :h] = -(Ci @ (L[:, h:, :h] @ Ai))
    return out


def solve(W: np.ndarray, H: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    """Integers (``-qmax..qmax``) for ``W`` (rows: output channels; ``scale`` one per row) given the
    Hessian of its inputs: ``H`` (d, d) shared by the rows, or (rows, d, d) one per row. A column
    whose inputs were never nonzero (a zero diagonal) is rounded to nearest and passes nothing on."""
    d = W.shape[1]
    H = np.array(H, dtype=np.float64)
    shared = H.ndim == 2
    Hs = H[None] if shared else H
    diag = np.diagonal(Hs, axis1=1, axis2=2)
    dead = diag == 0
    Hs = Hs + (DAMP * np.maximum(diag.mean(axis=1), 1e-12))[:, None, None] * np.eye(d)[None]
    Hs[:, np.arange(d), np.arange(d)] += dead  # a dead input: its column only rounds
    try:
        U = inverse_factor(Hs.astype(np.float32)).astype(np.float64)
    except np.linalg.LinAlgError:
        U = None
    if U is None or not np.isfinite(U).all():  # no usable inverse: round to nearest
        return np.clip(np.round(W / scale[:, None]), -qmax, qmax).astype(np.int64)
    Wt = np.array(W, dtype=np.float64).T.copy()  # a column of W is a contiguous row here
    Q = np.zeros(Wt.shape, dtype=np.int64)
    # GPTQ's lazy batches: the columns of a block pass their errors on within it one by one, and
    # onto the columns after it in one matrix product (the same sums, far less memory traffic)
    for b0 in range(0, d, BLOCK):
        b1 = min(b0 + BLOCK, d)
        err = np.zeros((b1 - b0, Wt.shape[1]))
        for i in range(b0, b1):
            Q[i] = np.clip(np.round(Wt[i] / scale), -qmax, qmax)
            e = (Wt[i] - Q[i] * scale) / U[:, i, i]
            Wt[i + 1 : b1] -= U[:, i, i + 1 : b1].T * e
            err[i - b0] = e
        if b1 < d:
            Wt[b1:] -= U[0, b0:b1, b1:].T @ err if shared else np.einsum("rbk,br->kr", U[:, b0:b1, b1:], err)
    return Q.T


def round_layers(found: Sequence[Layer], scheme: QuantScheme, weights: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Weight name -> its int8 values by GPTQ, at the scales round-to-nearest uses, for each layer
    whose Hessian saw a sample; in the weight's own layout and dtype. ``weights``: the values to
    round by name where they changed since ``layers`` (clipped: ``+clip``); default the layers'."""
    out: dict[str, np.ndarray] = {}
    for layer in found:
        src = layer.source
        if not src.samples or layer.weight in out:
            continue
        w, n = (weights or {}).get(layer.weight, layer.w), layer.node
        qmax = weight_qmax_of(scheme, n, w.shape)
        s, _ = qmath.weight_params(w, layer.axis, qmax)
        if n.op_type == "Conv":
            W = w.reshape(w.shape[0], -1)
        elif n.op_type == "Gemm" and attr(n, "transB", 0):
            W = w
        else:  # Gemm without transB, MatMul: (K, N), outputs on the columns
            W = w.T
        scale = np.broadcast_to(np.asarray(s, dtype=np.float64).reshape(-1), (W.shape[0],))
        Q = solve(W, src.hessian, scale, qmax)
        Q = Q.reshape(w.shape) if n.op_type == "Conv" else (Q if W is w else Q.T)
        out[layer.weight] = Q.astype(np.int8)
    return out


class Hessians:
    """What the calibration pass feeds (``calib.collect_ranges``'s ``taps``): each layer's
    Hessian from the float values of its input, so GPTQ needs no pass of its own."""

    def __init__(self, found: Sequence[Layer]) -> None:
        self.by_input: dict[str, list[Layer]] = {}
        first: dict[tuple, Layer] = {}
        for layer in found:  # layers reading the same patches of one input (a detector's heads) share one Hessian
            layer.source = first.setdefault(layer.geometry, layer)
            if layer.source is layer:
                self.by_input.setdefault(layer.input, []).append(layer)

    @property
    def tensors(self) -> list[str]:
        return list(self.by_input)

    def add(self, name: str, value: np.ndarray) -> None:
        for layer in self.by_input.get(name, ()):
            layer.add(value)
