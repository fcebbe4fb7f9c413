"""The arithmetic of quantization, in one place and in plain numpy.

Conventions follow the ONNX QuantizeLinear / DequantizeLinear spec:
``q = saturate(round_half_to_even(x / scale) + zero_point)`` and ``x = (q - zero_point) * scale``.
"""

from __future__ import annotations

import numpy as np

QRANGES: dict[str, tuple[int, int]] = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int32": (-(2**31), 2**31 - 1),
}
NP_DTYPES = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32}

# Symmetric int8 uses the narrow range [-127, 127]: zero maps to 0 exactly and -x maps to -q,
# which TensorRT requires for weights and which keeps products symmetric.
SYMMETRIC_QMAX = 127


def scale_zero_point(
    rmin: np.ndarray | float, rmax: np.ndarray | float, dtype: str, symmetric: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Scale (float32) and zero point (``dtype``) for a real range; works per tensor or per channel.

    The range is widened to include 0 so that zero is exactly representable (padding, ReLU).
    A degenerate range (all zeros) gets scale 1, so nothing divides by zero.
    """
    rmin = np.minimum(np.asarray(rmin, dtype=np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, dtype=np.float64), 0.0)
    qmin, qmax = QRANGES[dtype]
    if symmetric:
        if dtype != "int8":
            raise ValueError("symmetric quantization is defined for int8 only")
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        scale = absmax / SYMMETRIC_QMAX
        zero_point = np.zeros_like(scale)
    else:
        scale = (rmax - rmin) / (qmax - qmin)
        safe = np.where(scale > 0, scale, 1.0)
        zero_point = np.clip(np.round(qmin - rmin / safe), qmin, qmax)
    # Cast first, then guard: a tiny positive float64 scale can round to 0.0 in float32.
    scale = scale.astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    return scale, zero_point.astype(NP_DTYPES[dtype])


def quantize(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, dtype: str, axis: int | None = None
) -> np.ndarray:
    """QuantizeLinear: round half to even, add zero point, saturate."""
    scale, zero_point = _broadcastable(x, scale, zero_point, axis)
    qmin, qmax = QRANGES[dtype]
    # Divide in float32 like the spec's runtimes do, so ties round the same way they do.
    with np.errstate(over="ignore"):  # inf saturates below, as the spec says
        q = np.rint(x.astype(np.float32) / scale.astype(np.float32)).astype(np.float64) + zero_point
    return np.clip(q, qmin, qmax).astype(NP_DTYPES[dtype])


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None = None) -> np.ndarray:
    """DequantizeLinear."""
    scale, zero_point = _broadcastable(q, scale, zero_point, axis)
    return ((q.astype(np.float64) - zero_point) * scale).astype(np.float32)


def _broadcastable(x, scale, zero_point, axis):
    scale = np.asarray(scale, dtype=np.float64)
    zero_point = np.asarray(zero_point, dtype=np.float64)
    if scale.ndim == 1 and axis is not None:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        zero_point = zero_point.reshape(shape)
    return scale, zero_point


def weight_params(w: np.ndarray, axis: int | None, qmax: int = SYMMETRIC_QMAX) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 params for a weight, per channel along ``axis`` (or per tensor if None).

    ``qmax`` below 127 narrows the weights (63: 7-bit) for kernels whose int16 sums saturate.
    """
    if axis is None:
        absmax = np.abs(w).max(initial=0.0)
    else:
        moved = np.moveaxis(np.abs(w), axis, 0).reshape(w.shape[axis], -1)
        absmax = moved.max(axis=1, initial=0.0)
    scale, zero_point = scale_zero_point(-absmax, absmax, "int8", symmetric=True)
    if qmax != SYMMETRIC_QMAX:
        scale = np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32)
    return scale, zero_point


def clip_weight(w: np.ndarray, axis: int | None, qmax: int = SYMMETRIC_QMAX, ratios: int = 26, lowest: float = 0.5) -> np.ndarray:
    """``w`` clipped per channel along ``axis`` (or as a whole) to the fraction of its absmax, in
    [lowest, 1], that minimises ||w - Q(w)||^2 under weight_params' symmetric rounding; a channel
    keeps its absmax unless clipping lowers its error. weight_params of the result gives those
    clipped scales, and quantizing the result equals quantizing ``w`` with them."""
    moved = np.moveaxis(w, axis, 0) if axis is not None else w[None]
    flat = moved.reshape(moved.shape[0], -1).astype(np.float64)
    absmax = np.abs(flat).max(axis=1, initial=0.0)
    best = absmax.copy()
    best_err = np.full(absmax.shape, np.inf)
    for r in np.linspace(1.0, lowest, ratios):  # 1.0 first: clipping must beat it strictly
        t = absmax * r
        scale = np.where(t > 0, t / qmax, 1.0)[:, None]
        err = np.square(np.clip(np.rint(flat / scale), -qmax, qmax) * scale - flat).sum(axis=1)
        better = err < best_err
        best, best_err = np.where(better, t, best), np.where(better, err, best_err)
    clipped = np.clip(flat, -best[:, None], best[:, None]).astype(w.dtype).reshape(moved.shape)
    return np.moveaxis(clipped, 0, axis) if axis is not None else clipped[0]


def quantize_bias(bias: np.ndarray, input_scale: float, weight_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int32 bias with scale ``input_scale * weight_scale`` (per channel), zero point 0."""
    scale = (np.float64(input_scale) * weight_scale.astype(np.float64)).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float64)
    lo, hi = QRANGES["int32"]
    q = np.clip(np.rint(bias.astype(np.float64) / safe), lo, hi).astype(np.int32)
    return q, scale


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-noise ratio of ``test`` against ``reference`` in dB (inf when identical)."""
    ref = reference.astype(np.float64).ravel()
    noise = ref - test.astype(np.float64).ravel()
    signal_power = float(np.dot(ref, ref))
    noise_power = float(np.dot(noise, noise))
    if noise_power == 0.0:
        return float("inf")
    if signal_power == 0.0:
        return float("-inf")
    return 10.0 * np.log10(signal_power / noise_power)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))
