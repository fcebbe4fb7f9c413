/* qs8-gemm, 2 rows x 8 columns, k in groups of 8, AArch64 baseline NEON: SMULL (int8 x int8
 * -> int16, exact) then SADALP (pairwise add-accumulate into int32). No SMLAL pairing, so
 * weights of -128 are fine. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>
#include <string.h>

#include "../common/load-tail.h"
#include "../common/requant-neon.h"

static inline int8x8_t ek_load_tail8(const int8_t* p, size_t len) {
  return vreinterpret_s8_s64(vdup_n_s64(ek_load_tail64(p, len)));
}

#define EK_ROW_GROUP(r, va)                                                         \
  acc##r##0 = vpadalq_s16(acc##r##0, vmull_s8(vget_low_s8(vw01), va));            \
  acc##r##1 = vpadalq_s16(acc##r##1, vmull_s8(vget_high_s8(vw01), va));           \
  acc##r##2 = vpadalq_s16(acc##r##2, vmull_s8(vget_low_s8(vw23), va));            \
  acc##r##3 = vpadalq_s16(acc##r##3, vmull_s8(vget_high_s8(vw23), va));           \
  acc##r##4 = vpadalq_s16(acc##r##4, vmull_s8(vget_low_s8(vw45), va));            \
  acc##r##5 = vpadalq_s16(acc##r##5, vmull_s8(vget_high_s8(vw45), va));           \
  acc##r##6 = vpadalq_s16(acc##r##6, vmull_s8(vget_low_s8(vw67), va));            \
  acc##r##7 = vpadalq_s16(acc##r##7, vmull_s8(vget_high_s8(vw67), va));

static inline void ek_store8(int8_t* dst, int8x8_t v, size_t nj) {
  if (nj == 8) {
    vst1_s8(dst, v);
  } else {
    int8_t tmp[8];
    vst1_s8(tmp, v);
    memcpy(dst, tmp, nj);
  }
}

void ek_qs8_gemm_ukernel_2x8c8__neon(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                     const void* packed_w, int8_t* c, size_t c_stride,
                                     const struct ek_requant_params* rq) {
  const size_t k_main = k & ~(size_t)7;
  const size_t k_pad = (k + 7) & ~(size_t)7;
  const size_t block_bytes = 8 * sizeof(int32_t) + k_pad * 8;
  const int16x8_t vzp = vdupq_n_s16((int16_t)rq->zp_out);
  const int8x8_t vqmin = vdup_n_s8((int8_t)rq->qmin), vqmax = vdup_n_s8((int8_t)rq->qmax);
  const int32x4_t vzero = vdupq_n_s32(0);

  /* column blocks outside, rows inside: a block's weights stay in L1, its requantization
   * constants are set up once per call */
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 8, w += block_bytes) {
    const size_t nj = n - j0 < 8 ? n - j0 : 8;
    int32x4_t vm_a, vm_b, vs_a, vs_b;
    if (nj == 8) {
      vm_a = vld1q_s32(rq->multiplier + j0);
      vm_b = vld1q_s32(rq->multiplier + j0 + 4);
      vs_a = vld1q_s32(rq->shift + j0);
      vs_b = vld1q_s32(rq->shift + j0 + 4);
    } else {
      int32_t mult[8] = {0, 0, 0, 0, 0, 0, 0, 0}, shift[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      memcpy(mult, rq->multiplier + j0, nj * sizeof(int32_t));
      memcpy(shift, rq->shift + j0, nj * sizeof(int32_t));
      vm_a = vld1q_s32(mult);
      vm_b = vld1q_s32(mult + 4);
      vs_a = vld1q_s32(shift);
      vs_b = vld1q_s32(shift + 4);
    }
    int64x2_t n0, n1, n2, n3;
    ek_neon_neg_n(vs_a, &n0, &n1);
    ek_neon_neg_n(vs_b, &n2, &n3);
    const int32x4_t vb0123 = vld1q_s32((const int32_t*)w);
    const int32x4_t vb4567 = vld1q_s32((const int32_t*)w + 4);

    for (size_t i = 0; i < m; i += 2) {
      /* a row past m aliases the last real row (computed twice, stored twice, same values) */
      const int8_t* a0 = a + i * a_stride;
      const int8_t* a1 = m - i > 1 ? a0 + a_stride : a0;
      int8_t* c0 = c + i * c_stride;
      int8_t* c1 = m - i > 1 ? c0 + c_stride : c0;
      int32x4_t acc00 = vzero, acc01 = vzero, acc02 = vzero, acc03 = vzero;
      int32x4_t acc04 = vzero, acc05 = vzero, acc06 = vzero, acc07 = vzero;
      int32x4_t acc10 = vzero, acc11 = vzero, acc12 = vzero, acc13 = vzero;
      int32x4_t acc14 = vzero, acc15 = vzero, acc16 = vzero, acc17 = vzero;
      const int8_t* wk = (const int8_t*)(w + 32);
      size_t kk = 0;
      for (; kk < k_main; kk += 8) {
        const int8x8_t va0 = vld1_s8(a0 + kk), va1 = vld1_s8(a1 + kk);
        const int8x16_t vw01 = vld1q_s8(wk);
        const int8x16_t vw23 = vld1q_s8(wk + 16);
        const int8x16_t vw45 = vld1q_s8(wk + 32);
        const int8x16_t vw67 = vld1q_s8(wk + 48);
        EK_ROW_GROUP(0, va0)
        EK_ROW_GROUP(1, va1)
        wk += 64;
      }
      if (kk < k) { /* 1..7 left, zero-filled against zero-padded weights */
        const int8x8_t va0 = ek_load_tail8(a0 + kk, k - kk), va1 = ek_load_tail8(a1 + kk, k - kk);
        const int8x16_t vw01 = vld1q_s8(wk);
        const int8x16_t vw23 = vld1q_s8(wk + 16);
        const int8x16_t vw45 = vld1q_s8(wk + 32);
        const int8x16_t vw67 = vld1q_s8(wk + 48);
        EK_ROW_GROUP(0, va0)
        EK_ROW_GROUP(1, va1)
      }
      int32x4_t s0a = vaddq_s32(vpaddq_s32(vpaddq_s32(acc00, acc01), vpaddq_s32(acc02, acc03)), vb0123);
      int32x4_t s0b = vaddq_s32(vpaddq_s32(vpaddq_s32(acc04, acc05), vpaddq_s32(acc06, acc07)), vb4567);
      int32x4_t s1a = vaddq_s32(vpaddq_s32(vpaddq_s32(acc10, acc11), vpaddq_s32(acc12, acc13)), vb0123);
      int32x4_t s1b = vaddq_s32(vpaddq_s32(vpaddq_s32(acc14, acc15), vpaddq_s32(acc16, acc17)), vb4567);
      s0a = ek_neon_mul_by_multiplier(s0a, vm_a, n0, n1);
      s0b = ek_neon_mul_by_multiplier(s0b, vm_b, n2, n3);
      s1a = ek_neon_mul_by_multiplier(s1a, vm_a, n0, n1);
      s1b = ek_neon_mul_by_multiplier(s1b, vm_b, n2, n3);
      ek_store8(c1 + j0, ek_neon_narrow8(s1a, s1b, vzp, vqmin, vqmax), nj);
      ek_store8(c0 + j0, ek_neon_narrow8(s0a, s0b, vzp, vqmin, vqmax), nj);
    }
  }
}
#endif
