/* qs8-dwconv, 16 channels per step, AArch64 NEON: SMULL/SMULL2 to int16, SADDW/SADDW2 into
 * int32 (c16__neon: any weights). c16__neon_mlal, for weights in [-127, 127] only (EK_ISA_WN):
 * taps in pairs, SMULL/SMULL2 of the first and SMLAL/SMLAL2 of the second into the same int16
 * lanes, then SADDW/SADDW2: 8 arithmetic instructions per 2 taps of 16 channels against 12. A
 * lane then holds two products, at most 2 * 128 * 127 = 32512 in magnitude while no weight is
 * -128 (checked at load: the ISA word's bound). One packing for both. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>
#include <string.h>

#include "../common/requant-neon.h"

/* a tap's 16 channels (nc < 16: zero-filled, not read past) */
static inline int8x16_t ek_row16(const int8_t* p, size_t nc) {
  if (nc == 16) return vld1q_s8(p);
  int8_t tmp[16] = {0};
  memcpy(tmp, p, nc);
  return vld1q_s8(tmp);
}

static inline __attribute__((always_inline)) void ek_dwconv_c16(size_t channels, size_t output_width, size_t kernel_size,
                                                                const int8_t* const* input, size_t input_step,
                                                                const void* packed_w, int8_t* output, size_t output_stride,
                                                                const struct ek_requant_params* rq, const int paired) {
  const int16x8_t vzp = vdupq_n_s16((int16_t)rq->zp_out);
  const int8x16_t vqmin = vdupq_n_s8((int8_t)rq->qmin), vqmax = vdupq_n_s8((int8_t)rq->qmax);
  const size_t block_bytes = 16 * sizeof(int32_t) + kernel_size * 16;
  /* channel blocks outside, pixels inside: requantization constants once per block per call */
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t c0 = 0; c0 < channels; c0 += 16, w += block_bytes) {
    const size_t nc = channels - c0 < 16 ? channels - c0 : 16;
    int32_t mult[16], shift[16];
    memset(mult, 0, sizeof mult);
    memset(shift, 0, sizeof shift);
    memcpy(mult, rq->multiplier + c0, nc * sizeof(int32_t));
    memcpy(shift, rq->shift + c0, nc * sizeof(int32_t));
    const int32x4_t m0 = vld1q_s32(mult), m1 = vld1q_s32(mult + 4), m2 = vld1q_s32(mult + 8),
                    m3 = vld1q_s32(mult + 12);
    int64x2_t n00, n01, n10, n11, n20, n21, n30, n31;
    ek_neon_neg_n(vld1q_s32(shift), &n00, &n01);
    ek_neon_neg_n(vld1q_s32(shift + 4), &n10, &n11);
    ek_neon_neg_n(vld1q_s32(shift + 8), &n20, &n21);
    ek_neon_neg_n(vld1q_s32(shift + 12), &n30, &n31);
    const int32_t* wb = (const int32_t*)w;
    const int32x4_t b0 = vld1q_s32(wb), b1 = vld1q_s32(wb + 4), b2 = vld1q_s32(wb + 8), b3 = vld1q_s32(wb + 12);

    for (size_t p = 0; p < output_width; p++) {
      const int8_t* const* in = input + p * input_step;
      int32x4_t acc0 = b0, acc1 = b1, acc2 = b2, acc3 = b3;
      const int8_t* wt = (const int8_t*)(w + 64);
      size_t t = 0;
      if (paired) {
        for (; t + 2 <= kernel_size; t += 2, wt += 32) {
          const int8x16_t vx0 = ek_row16(in[t] + c0, nc), vx1 = ek_row16(in[t + 1] + c0, nc);
          const int8x16_t vk0 = vld1q_s8(wt), vk1 = vld1q_s8(wt + 16);
          const int16x8_t plo = vmlal_s8(vmull_s8(vget_low_s8(vx0), vget_low_s8(vk0)), vget_low_s8(vx1), vget_low_s8(vk1));
          const int16x8_t phi = vmlal_high_s8(vmull_high_s8(vx0, vk0), vx1, vk1);
          acc0 = vaddw_s16(acc0, vget_low_s16(plo));
          acc1 = vaddw_high_s16(acc1, plo);
          acc2 = vaddw_s16(acc2, vget_low_s16(phi));
          acc3 = vaddw_high_s16(acc3, phi);
        }
      }
      for (; t < kernel_size; t++, wt += 16) { /* every tap, or a paired kernel's odd last one */
        const int8x16_t vx = ek_row16(in[t] + c0, nc), vk = vld1q_s8(wt);
        const int16x8_t plo = vmull_s8(vget_low_s8(vx), vget_low_s8(vk));
        const int16x8_t phi = vmull_high_s8(vx, vk);
        acc0 = vaddw_s16(acc0, vget_low_s16(plo));
        acc1 = vaddw_high_s16(acc1, plo);
        acc2 = vaddw_s16(acc2, vget_low_s16(phi));
        acc3 = vaddw_high_s16(acc3, phi);
      }
      acc0 = ek_neon_mul_by_multiplier(acc0, m0, n00, n01);
      acc1 = ek_neon_mul_by_multiplier(acc1, m1, n10, n11);
      acc2 = ek_neon_mul_by_multiplier(acc2, m2, n20, n21);
      acc3 = ek_neon_mul_by_multiplier(acc3, m3, n30, n31);
      const int8x16_t y = ek_neon_narrow16(acc0, acc1, acc2, acc3, vzp, vqmin, vqmax);
      int8_t* out = output + p * output_stride + c0;
      if (nc == 16) {
        vst1q_s8(out, y);
      } else {
        int8_t tmp[16];
        vst1q_s8(tmp, y);
        memcpy(out, tmp, nc);
      }
    }
  }
}
void ek_qs8_dwconv_ukernel_c16__neon(size_t channels, size_t output_width, size_t kernel_size,
                                     const int8_t* const* input, size_t input_step, const void* packed_w,
                                     int8_t* output, size_t output_stride, const struct ek_requant_params* rq) {
  ek_dwconv_c16(channels, output_width, kernel_size, input, input_step, packed_w, output, output_stride, rq, 0);
}

void ek_qs8_dwconv_ukernel_c16__neon_mlal(size_t channels, size_t output_width, size_t kernel_size,
                                          const int8_t* const* input, size_t input_step, const void* packed_w,
                                          int8_t* output, size_t output_stride, const struct ek_requant_params* rq) {
  ek_dwconv_c16(channels, output_width, kernel_size, input, input_step, packed_w, output, output_stride, rq, 1);
}
#endif
