/* ekrt's one requantization policy (docs/ekrt.md, "Requantization"). Normative scalar
 * reference: every SIMD kernel is bit-identical to these functions, and the host's twin
 * (edgekit/targets/native/requant.py) is tested against them.
 *
 * A real multiplier r > 0 is held as (multiplier, shift): r = multiplier * 2^(shift - 31),
 * multiplier in [2^30, 2^31) (or 0 for r == 0), shift in [-31, 30]. The one operation every
 * op uses is ek_mul_by_multiplier (one rounding of the exact product). */
#ifndef EDGEKIT_REQUANT_H
#define EDGEKIT_REQUANT_H

#include <math.h>
#include <stdint.h>

#define EK_SHIFT_MIN (-31)
#define EK_SHIFT_MAX 30

/* gemmlowp's two-rounding pair (kept for reference and tests; no op uses them). */

/* gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2^31), saturating the one
 * overflow case (INT32_MIN * INT32_MIN). Ties round away from zero. */
static inline int32_t ek_srdhm(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
  int64_t ab = (int64_t)a * (int64_t)b;
  int64_t nudge = ab >= 0 ? (INT64_C(1) << 30) : (1 - (INT64_C(1) << 30));
  return (int32_t)((ab + nudge) / (INT64_C(1) << 31)); /* C division truncates toward zero */
}

/* gemmlowp RoundingDivideByPOT: x / 2^exponent rounded to nearest, ties away from zero.
 * exponent in [0, 31]. */
static inline int32_t ek_rdivpot(int32_t x, int exponent) {
  int32_t mask = (int32_t)((INT64_C(1) << exponent) - 1);
  int32_t remainder = x & mask;
  int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
  return (int32_t)(((int64_t)x >> exponent) + (remainder > threshold ? 1 : 0));
}

/* x * r for r = multiplier * 2^(shift - 31): the exact 64-bit product rounded ONCE (ties
 * up, i.e. toward +inf: (v + 2^(n-1)) >> n with an arithmetic shift), saturated to int32.
 * shift in [-31, 30] makes n = 31 - shift in [1, 62]; |x * multiplier| < 2^62, so no
 * intermediate overflows. (docs/ekrt.md "CHANGED by lowering": one rounding, because the
 * gemmlowp pair above rounds twice and drifts from ONNX Runtime.) SIMD: SMULL + SRSHL + SQXTN
 * on NEON; _mm256_mul_epi32 + 64-bit rounding add + shift on AVX2. */
static inline int32_t ek_mul_by_multiplier(int32_t x, int32_t multiplier, int32_t shift) {
  int n = 31 - shift;
  int64_t v = ((int64_t)x * (int64_t)multiplier + (INT64_C(1) << (n - 1))) >> n;
  return (int32_t)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v);
}

/* acc (int32, bias included) -> int8: clamp(zp + acc * r, qmin, qmax), the add in 64 bits. */
static inline int8_t ek_requant(int32_t acc, int32_t multiplier, int32_t shift, int32_t zp, int32_t qmin,
                                int32_t qmax) {
  int64_t v = (int64_t)ek_mul_by_multiplier(acc, multiplier, shift) + zp;
  return (int8_t)(v < qmin ? qmin : v > qmax ? qmax : v);
}

/* The host's quantize_multiplier, in C (the runtime derives AVGPOOL's per-count multipliers
 * with it). real >= 0; returns 0 and sets (0, 0) for real == 0 or real < 2^-32; returns -1
 * when real is negative, not finite, or >= 2^30 (shift would exceed EK_SHIFT_MAX). */
static inline int ek_quantize_multiplier(double real, int32_t* multiplier, int32_t* shift) {
  *multiplier = 0;
  *shift = 0;
  if (!(real >= 0.0) || !isfinite(real)) return -1;
  if (real == 0.0) return 0;
  int e = 0;
  double q = frexp(real, &e); /* real = q * 2^e, q in [0.5, 1) */
  int64_t q_fixed = (int64_t)floor(q * 2147483648.0 + 0.5);
  if (q_fixed == (INT64_C(1) << 31)) {
    q_fixed /= 2;
    e += 1;
  }
  if (e < EK_SHIFT_MIN) return 0; /* below 2^-32: flushes to 0, as TFLite does */
  if (e > EK_SHIFT_MAX) return -1;
  *multiplier = (int32_t)q_fixed;
  *shift = e;
  return 0;
}

#endif /* EDGEKIT_REQUANT_H */
