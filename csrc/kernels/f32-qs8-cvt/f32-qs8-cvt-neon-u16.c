/* f32-qs8-cvt, 16 elements per iteration, AArch64 NEON: FDIV (the reference's divide), NaN
 * masked to 0, FMAX/FMIN clamp, FCVTNS rounds half to even; the sum with zp lies in int8, so
 * the narrows never saturate. The tail goes through a buffer. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>

struct ek_cvt_consts {
  float32x4_t s, lo, hi;
  int32x4_t zp;
};

static inline int16x8_t ek_cvt8(const float* x, const struct ek_cvt_consts* k) {
  int32x4_t r[2];
  for (int h = 0; h < 2; h++) {
    float32x4_t q = vdivq_f32(vld1q_f32(x + 4 * h), k->s);
    q = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(q), vceqq_f32(q, q)));
    q = vminq_f32(vmaxq_f32(q, k->lo), k->hi);
    r[h] = vaddq_s32(vcvtnq_s32_f32(q), k->zp);
  }
  return vcombine_s16(vqmovn_s32(r[0]), vqmovn_s32(r[1]));
}

void ek_f32_qs8_cvt_ukernel__neon_u16(size_t n, const float* x, int8_t* y, const struct ek_f32_qs8_cvt_params* p) {
  const struct ek_cvt_consts k = {vdupq_n_f32(p->scale), vdupq_n_f32((float)(-128 - p->zp)),
                                  vdupq_n_f32((float)(127 - p->zp)), vdupq_n_s32(p->zp)};
  for (; n >= 16; n -= 16, x += 16, y += 16)
    vst1q_s8(y, vcombine_s8(vqmovn_s16(ek_cvt8(x, &k)), vqmovn_s16(ek_cvt8(x + 8, &k))));
  if (n) {
    float in[16] = {0};
    int8_t out[16];
    for (size_t i = 0; i < n; i++) in[i] = x[i];
    vst1q_s8(out, vcombine_s8(vqmovn_s16(ek_cvt8(in, &k)), vqmovn_s16(ek_cvt8(in + 8, &k))));
    for (size_t i = 0; i < n; i++) y[i] = out[i];
  }
}
#endif
