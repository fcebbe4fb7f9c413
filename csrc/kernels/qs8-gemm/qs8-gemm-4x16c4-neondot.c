/* qs8-gemm, 4 rows x 16 columns, k in groups of 4, AArch64 NEON dot product (SDOT, ARMv8.2
 * +dotprod). Own translation unit, built with -march=armv8.2-a+dotprod, so no SDOT can leak
 * into the baseline kernels. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEONDOT
#include <arm_neon.h>
#include <string.h>

#include "../common/load-tail.h"
#include "../common/requant-neon.h"

static inline int8x8_t ek_load_tail8(const int8_t* p, size_t len) {
  return vreinterpret_s8_s64(vdup_n_s64(ek_load_tail64(p, len)));
}

#define EK_DOT_ROW(r, va, lane)                                   \
  acc##r##a = vdotq_lane_s32(acc##r##a, vwa, va, lane);         \
  acc##r##b = vdotq_lane_s32(acc##r##b, vwb, va, lane);         \
  acc##r##c = vdotq_lane_s32(acc##r##c, vwc, va, lane);         \
  acc##r##d = vdotq_lane_s32(acc##r##d, vwd, va, lane);

#define EK_DOT_GROUP(lane)                        \
  {                                               \
    const int8x16_t vwa = vld1q_s8(wk);           \
    const int8x16_t vwb = vld1q_s8(wk + 16);      \
    const int8x16_t vwc = vld1q_s8(wk + 32);      \
    const int8x16_t vwd = vld1q_s8(wk + 48);      \
    EK_DOT_ROW(0, va0, lane)                      \
    EK_DOT_ROW(1, va1, lane)                      \
    EK_DOT_ROW(2, va2, lane)                      \
    EK_DOT_ROW(3, va3, lane)                      \
    wk += 64;                                     \
  }

#define EK_REQUANT_ROW(r)                                                          \
  acc##r##a = ek_neon_mul_by_multiplier(acc##r##a, vm_a, na0, na1);              \
  acc##r##b = ek_neon_mul_by_multiplier(acc##r##b, vm_b, nb0, nb1);              \
  acc##r##c = ek_neon_mul_by_multiplier(acc##r##c, vm_c, nc0, nc1);              \
  acc##r##d = ek_neon_mul_by_multiplier(acc##r##d, vm_d, nd0, nd1);              \
  const int8x16_t y##r = ek_neon_narrow16(acc##r##a, acc##r##b, acc##r##c, acc##r##d, vzp, vqmin, vqmax);

static inline void ek_store16(int8_t* dst, int8x16_t v, size_t nj) {
  if (nj == 16) {
    vst1q_s8(dst, v);
  } else {
    int8_t tmp[16];
    vst1q_s8(tmp, v);
    memcpy(dst, tmp, nj);
  }
}

void ek_qs8_gemm_ukernel_4x16c4__neondot(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                         const void* packed_w, int8_t* c, size_t c_stride,
                                         const struct ek_requant_params* rq) {
  const size_t k_main = k & ~(size_t)7;
  const size_t k_pad = (k + 3) & ~(size_t)3;
  const size_t block_bytes = 16 * sizeof(int32_t) + k_pad * 16;
  const int16x8_t vzp = vdupq_n_s16((int16_t)rq->zp_out);
  const int8x16_t vqmin = vdupq_n_s8((int8_t)rq->qmin), vqmax = vdupq_n_s8((int8_t)rq->qmax);

  /* column blocks outside, rows inside: a block's weights stay in L1, its requantization
   * constants are set up once per call */
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 16, w += block_bytes) {
    const size_t nj = n - j0 < 16 ? n - j0 : 16;
    int32_t mult[16], shift[16];
    const int32_t* pm = rq->multiplier + j0;
    const int32_t* ps = rq->shift + j0;
    if (nj < 16) {
      memset(mult, 0, sizeof mult);
      memset(shift, 0, sizeof shift);
      memcpy(mult, pm, nj * sizeof(int32_t));
      memcpy(shift, ps, nj * sizeof(int32_t));
      pm = mult;
      ps = shift;
    }
    const int32x4_t vm_a = vld1q_s32(pm), vm_b = vld1q_s32(pm + 4), vm_c = vld1q_s32(pm + 8),
                    vm_d = vld1q_s32(pm + 12);
    int64x2_t na0, na1, nb0, nb1, nc0, nc1, nd0, nd1;
    ek_neon_neg_n(vld1q_s32(ps), &na0, &na1);
    ek_neon_neg_n(vld1q_s32(ps + 4), &nb0, &nb1);
    ek_neon_neg_n(vld1q_s32(ps + 8), &nc0, &nc1);
    ek_neon_neg_n(vld1q_s32(ps + 12), &nd0, &nd1);
    const int32_t* wb = (const int32_t*)w;
    const int32x4_t ba = vld1q_s32(wb), bb = vld1q_s32(wb + 4), bc = vld1q_s32(wb + 8), bd = vld1q_s32(wb + 12);

    for (size_t i = 0; i < m; i += 4) {
      /* rows past m alias the last real row (computed twice, stored twice, same values) */
      const size_t rows = m - i;
      const int8_t* a0 = a + i * a_stride;
      const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;
      const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;
      const int8_t* a3 = rows > 3 ? a2 + a_stride : a2;
      int8_t* c0 = c + i * c_stride;
      int8_t* c1 = rows > 1 ? c0 + c_stride : c0;
      int8_t* c2 = rows > 2 ? c1 + c_stride : c1;
      int8_t* c3 = rows > 3 ? c2 + c_stride : c2;
      int32x4_t acc0a = ba, acc0b = bb, acc0c = bc, acc0d = bd;
      int32x4_t acc1a = ba, acc1b = bb, acc1c = bc, acc1d = bd;
      int32x4_t acc2a = ba, acc2b = bb, acc2c = bc, acc2d = bd;
      int32x4_t acc3a = ba, acc3b = bb, acc3c = bc, acc3d = bd;
      const int8_t* wk = (const int8_t*)(w + 64);
      size_t kk = 0;
      for (; kk < k_main; kk += 8) {
        const int8x8_t va0 = vld1_s8(a0 + kk), va1 = vld1_s8(a1 + kk);
        const int8x8_t va2 = vld1_s8(a2 + kk), va3 = vld1_s8(a3 + kk);
        EK_DOT_GROUP(0)
        EK_DOT_GROUP(1)
      }
      if (kk < k) { /* 1..7 left: one or two groups of 4, zero-filled */
        const size_t len = k - kk;
        const int8x8_t va0 = ek_load_tail8(a0 + kk, len), va1 = ek_load_tail8(a1 + kk, len);
        const int8x8_t va2 = ek_load_tail8(a2 + kk, len), va3 = ek_load_tail8(a3 + kk, len);
        EK_DOT_GROUP(0)
        if (len > 4) EK_DOT_GROUP(1)
      }
      EK_REQUANT_ROW(0)
      EK_REQUANT_ROW(1)
      EK_REQUANT_ROW(2)
      EK_REQUANT_ROW(3)
      ek_store16(c3 + j0, y3, nj);
      ek_store16(c2 + j0, y2, nj);
      ek_store16(c1 + j0, y1, nj);
      ek_store16(c0 + j0, y0, nj);
    }
  }
}
#endif
