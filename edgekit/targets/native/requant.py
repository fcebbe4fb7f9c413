"""The host's twin of ekrt's requantization (``csrc/include/edgekit/requant.h``, normative).

``quantize_multiplier`` turns a real multiplier into the ``(multiplier, shift)`` pair the
runtime uses (``real = multiplier * 2**(shift - 31)``); ``requant`` is the integer pipeline
the kernels run (one rounding of the exact product, docs/ekrt.md), vectorized in numpy (int64
inside, so no overflow). Both are tested bit for bit against the C header through the
extension (tests/test_ekrt_core.py).
"""

from __future__ import annotations

import math

import numpy as np

SHIFT_MIN = -31
SHIFT_MAX = 30
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``(multiplier, shift)`` with ``real = multiplier * 2**(shift - 31)``, multiplier in [2^30, 2^31).

    0 (and anything below 2^-32, which flushes to 0 as in TFLite) gives ``(0, 0)``. A negative,
    non-finite or too large (>= 2^30) value is a ValueError: no int8 scale ratio gets there.
    """
    real = float(real)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"a requantization multiplier must be finite and >= 0, not {real!r}")
    if real == 0.0:
        return 0, 0
    q, e = math.frexp(real)  # real = q * 2**e, q in [0.5, 1)
    q_fixed = math.floor(q * 2**31 + 0.5)  # round half away from zero (q > 0)
    if q_fixed == 2**31:
        q_fixed //= 2
        e += 1
    if e < SHIFT_MIN:
        return 0, 0
    if e > SHIFT_MAX:
        raise ValueError(f"multiplier {real!r} is too large (>= 2^30) for ekrt's requantization")
    return int(q_fixed), int(e)


def mul_by_multiplier(x, multiplier, shift) -> np.ndarray:
    """``x * real`` as requant.h's ek_mul_by_multiplier: the exact product rounded once (ties
    toward +inf), saturated to int32. int64 in and out; shift in [-31, 30]."""
    n = 31 - np.asarray(shift, dtype=np.int64)
    v = (np.asarray(x, dtype=np.int64) * np.asarray(multiplier, dtype=np.int64) + (np.int64(1) << (n - 1))) >> n
    return np.clip(v, _INT32_MIN, _INT32_MAX)


def multiplier_value(multiplier: int, shift: int) -> float:
    """The real number a ``(multiplier, shift)`` pair stands for: ``multiplier * 2**(shift - 31)``."""
    return math.ldexp(float(multiplier), int(shift) - 31)


def requant(acc, multiplier, shift, zp, qmin=-128, qmax=127) -> np.ndarray:
    """int32 accumulators -> int8, exactly as requant.h's ek_requant (broadcasting numpy)."""
    v = mul_by_multiplier(acc, multiplier, shift) + np.asarray(zp, dtype=np.int64)
    return np.clip(v, qmin, qmax).astype(np.int8)


__all__ = ["SHIFT_MAX", "SHIFT_MIN", "mul_by_multiplier", "multiplier_value", "quantize_multiplier", "requant"]
