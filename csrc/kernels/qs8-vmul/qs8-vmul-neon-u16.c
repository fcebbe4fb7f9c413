/* qs8-vmul, 16 elements per iteration, AArch64 NEON (bit-exact with the scalar reference). y
 * may be a or b (in place). */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>
#include <string.h>

#include "../common/requant-neon.h"

struct ek_vmul_consts {
  int32x4_t m;
  int64x2_t nn; /* shift - 31 */
  int16x8_t a_zp, b_zp, vzp;
  int8x16_t qmin, qmax;
};

static inline int8x16_t ek_vmul16(const int8_t* a, const int8_t* b, const struct ek_vmul_consts* k) {
  const int8x16_t va = vld1q_s8(a), vb = vld1q_s8(b);
  const int16x8_t a_lo = vsubq_s16(vmovl_s8(vget_low_s8(va)), k->a_zp);
  const int16x8_t a_hi = vsubq_s16(vmovl_high_s8(va), k->a_zp);
  const int16x8_t b_lo = vsubq_s16(vmovl_s8(vget_low_s8(vb)), k->b_zp);
  const int16x8_t b_hi = vsubq_s16(vmovl_high_s8(vb), k->b_zp);
  const int32x4_t p0 = ek_neon_mul_by_multiplier(vmull_s16(vget_low_s16(a_lo), vget_low_s16(b_lo)), k->m, k->nn, k->nn);
  const int32x4_t p1 = ek_neon_mul_by_multiplier(vmull_high_s16(a_lo, b_lo), k->m, k->nn, k->nn);
  const int32x4_t p2 = ek_neon_mul_by_multiplier(vmull_s16(vget_low_s16(a_hi), vget_low_s16(b_hi)), k->m, k->nn, k->nn);
  const int32x4_t p3 = ek_neon_mul_by_multiplier(vmull_high_s16(a_hi, b_hi), k->m, k->nn, k->nn);
  return ek_neon_narrow16(p0, p1, p2, p3, k->vzp, k->qmin, k->qmax);
}

void ek_qs8_vmul_ukernel__neon_u16(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                   const struct ek_qs8_mul_params* p) {
  struct ek_vmul_consts k;
  k.m = vdupq_n_s32(p->multiplier);
  k.nn = vdupq_n_s64((int64_t)p->shift - 31);
  k.a_zp = vdupq_n_s16((int16_t)p->a_zp);
  k.b_zp = vdupq_n_s16((int16_t)p->b_zp);
  k.vzp = vdupq_n_s16((int16_t)p->out_zp);
  k.qmin = vdupq_n_s8((int8_t)p->qmin);
  k.qmax = vdupq_n_s8((int8_t)p->qmax);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) vst1q_s8(y + i, ek_vmul16(a + i, b + i, &k));
  if (i < n) {
    int8_t ta[16] = {0}, tb[16] = {0}, ty[16];
    memcpy(ta, a + i, n - i);
    memcpy(tb, b + i, n - i);
    vst1q_s8(ty, ek_vmul16(ta, tb, &k));
    memcpy(y + i, ty, n - i);
  }
}
#endif
