/* requant.h's ek_mul_by_multiplier, 4 x int32 lanes at a time, AArch64 NEON (bit-exact):
 * SMULL/SMULL2 (exact 64-bit products), SRSHL by -(31 - shift) (a rounding shift is exactly
 * (v + 2^(n-1)) >> n), SQXTN/SQXTN2 (saturate to int32). Private to the kernels. */
#ifndef EK_KERNELS_REQUANT_NEON_H
#define EK_KERNELS_REQUANT_NEON_H

#include <arm_neon.h>

/* neg_n_lo / neg_n_hi: shift - 31 of lanes 0-1 / 2-3, as int64 counts. */
static inline int32x4_t ek_neon_mul_by_multiplier(int32x4_t x, int32x4_t mult, int64x2_t neg_n_lo,
                                                  int64x2_t neg_n_hi) {
  const int64x2_t lo = vrshlq_s64(vmull_s32(vget_low_s32(x), vget_low_s32(mult)), neg_n_lo);
  const int64x2_t hi = vrshlq_s64(vmull_high_s32(x, mult), neg_n_hi);
  return vqmovn_high_s64(vqmovn_s64(lo), hi);
}

/* Counts for 4 shifts. */
static inline void ek_neon_neg_n(int32x4_t shift, int64x2_t* lo, int64x2_t* hi) {
  const int32x4_t nn = vsubq_s32(shift, vdupq_n_s32(31));
  *lo = vmovl_s32(vget_low_s32(nn));
  *hi = vmovl_high_s32(nn);
}

/* 16 int32 -> clamp(zp + v, qmin, qmax) as int8 (saturating narrows, zp, clamp). */
static inline int8x16_t ek_neon_narrow16(int32x4_t a, int32x4_t b, int32x4_t c, int32x4_t d, int16x8_t vzp,
                                         int8x16_t vqmin, int8x16_t vqmax) {
  int16x8_t lo = vqaddq_s16(vqmovn_high_s32(vqmovn_s32(a), b), vzp);
  int16x8_t hi = vqaddq_s16(vqmovn_high_s32(vqmovn_s32(c), d), vzp);
  int8x16_t v = vqmovn_high_s16(vqmovn_s16(lo), hi);
  return vminq_s8(vmaxq_s8(v, vqmin), vqmax);
}

/* 8 int32 -> 8 int8. */
static inline int8x8_t ek_neon_narrow8(int32x4_t a, int32x4_t b, int16x8_t vzp, int8x8_t vqmin, int8x8_t vqmax) {
  int16x8_t v = vqaddq_s16(vqmovn_high_s32(vqmovn_s32(a), b), vzp);
  return vmin_s8(vmax_s8(vqmovn_s16(v), vqmin), vqmax);
}

#endif /* EK_KERNELS_REQUANT_NEON_H */
