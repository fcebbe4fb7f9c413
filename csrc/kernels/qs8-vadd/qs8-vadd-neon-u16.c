/* qs8-vadd, 16 elements per iteration, AArch64 NEON (TFLite's quantized Add, bit-exact). y may
 * be a or b (in place). An input term whose multiplier is 2^30 with shift s <= 0 and
 * left_shift + s >= 1 (the input at the larger scale) is a left shift by left_shift + s - 1
 * (qs8-vadd-avx2-u16.c says why). */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>
#include <string.h>

#include "../common/requant-neon.h"

struct ek_vadd_consts {
  int32x4_t a_m, b_m, o_m, lift_a, lift_b, a_zp, b_zp; /* a power-of-two term's lift: ls + s - 1 */
  int64x2_t a_n, b_n, o_n; /* shift - 31 */
  int16x8_t vzp;
  int8x16_t qmin, qmax;
};

/* `pow2` a constant after inlining */
static inline __attribute__((always_inline)) int32x4_t ek_scale(int32x4_t x, int32x4_t zp, int32x4_t lift, int32x4_t m,
                                                                int64x2_t nn, const int pow2) {
  const int32x4_t v = vshlq_s32(vsubq_s32(x, zp), lift);
  return pow2 ? v : ek_neon_mul_by_multiplier(v, m, nn, nn);
}

static inline __attribute__((always_inline)) int8x16_t ek_vadd16(const int8_t* a, const int8_t* b,
                                                                 const struct ek_vadd_consts* k, const int pa,
                                                                 const int pb) {
  const int8x16_t va = vld1q_s8(a), vb = vld1q_s8(b);
  const int16x8_t a_lo = vmovl_s8(vget_low_s8(va)), a_hi = vmovl_high_s8(va);
  const int16x8_t b_lo = vmovl_s8(vget_low_s8(vb)), b_hi = vmovl_high_s8(vb);
  int32x4_t s[4];
  const int32x4_t xa[4] = {vmovl_s16(vget_low_s16(a_lo)), vmovl_high_s16(a_lo), vmovl_s16(vget_low_s16(a_hi)),
                           vmovl_high_s16(a_hi)};
  const int32x4_t xb[4] = {vmovl_s16(vget_low_s16(b_lo)), vmovl_high_s16(b_lo), vmovl_s16(vget_low_s16(b_hi)),
                           vmovl_high_s16(b_hi)};
  for (int q = 0; q < 4; q++) {
    const int32x4_t sa = ek_scale(xa[q], k->a_zp, k->lift_a, k->a_m, k->a_n, pa);
    const int32x4_t sb = ek_scale(xb[q], k->b_zp, k->lift_b, k->b_m, k->b_n, pb);
    s[q] = ek_neon_mul_by_multiplier(vaddq_s32(sa, sb), k->o_m, k->o_n, k->o_n);
  }
  return ek_neon_narrow16(s[0], s[1], s[2], s[3], k->vzp, k->qmin, k->qmax);
}

static inline __attribute__((always_inline)) void ek_vadd_loop(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                                               const struct ek_vadd_consts* k, const int pa,
                                                               const int pb) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) vst1q_s8(y + i, ek_vadd16(a + i, b + i, k, pa, pb));
  if (i < n) {
    int8_t ta[16] = {0}, tb[16] = {0}, ty[16];
    memcpy(ta, a + i, n - i);
    memcpy(tb, b + i, n - i);
    vst1q_s8(ty, ek_vadd16(ta, tb, k, pa, pb));
    memcpy(y + i, ty, n - i);
  }
}

void ek_qs8_vadd_ukernel__neon_u16(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                   const struct ek_qs8_add_params* p) {
  struct ek_vadd_consts k;
  k.a_m = vdupq_n_s32(p->a_multiplier);
  k.a_n = vdupq_n_s64((int64_t)p->a_shift - 31);
  k.b_m = vdupq_n_s32(p->b_multiplier);
  k.b_n = vdupq_n_s64((int64_t)p->b_shift - 31);
  k.o_m = vdupq_n_s32(p->out_multiplier);
  k.o_n = vdupq_n_s64((int64_t)p->out_shift - 31);
  const int pa = ek_qs8_add_term_is_shift(p->a_multiplier, p->a_shift, p->left_shift);
  const int pb = ek_qs8_add_term_is_shift(p->b_multiplier, p->b_shift, p->left_shift);
  k.lift_a = vdupq_n_s32(pa ? p->left_shift + p->a_shift - 1 : p->left_shift);
  k.lift_b = vdupq_n_s32(pb ? p->left_shift + p->b_shift - 1 : p->left_shift);
  k.a_zp = vdupq_n_s32(p->a_zp);
  k.b_zp = vdupq_n_s32(p->b_zp);
  k.vzp = vdupq_n_s16((int16_t)p->out_zp);
  k.qmin = vdupq_n_s8((int8_t)p->qmin);
  k.qmax = vdupq_n_s8((int8_t)p->qmax);
  if (pa && !pb)
    ek_vadd_loop(n, a, b, y, &k, 1, 0);
  else if (!pa && pb)
    ek_vadd_loop(n, a, b, y, &k, 0, 1);
  else if (pa && pb)
    ek_vadd_loop(n, a, b, y, &k, 1, 1);
  else
    ek_vadd_loop(n, a, b, y, &k, 0, 0);
}
#endif
