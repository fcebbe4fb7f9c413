/* qs8-gemm, 4 rows x 32 columns, k in groups of 4, AVX-512 VNNI (VPDPBUSD): 8 accumulators,
 * two weight vectors and four broadcasts per 8 VPDPBUSD. Measured the fastest tile on the
 * dev host (bench_kernels); 4x16c4 stays in the list as the narrower variant.
 *
 * VPDPBUSD multiplies unsigned by signed bytes: the caller passes activations as x ^ 0x80 =
 * x + 128 (uint8; kernels.h, a_offset 128), and the packed bias carries -128 * sum(w), so every
 * accumulator equals the scalar reference's exactly.
 * Loop order: column blocks outside, rows inside, so a block's packed weights (32 * k bytes)
 * stay in L1 and its requantization constants are set up once per call. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>
#include <string.h>

#include "../common/load-tail.h"
#include "../common/requant-avx512.h"

static inline __m512i ek_bcast4(const int8_t* p) {
  int32_t v;
  memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

/* 1..3 bytes left: the zero bytes past k meet the packing's zero weights */
static inline __m512i ek_bcast_tail(const int8_t* p, size_t len) { return _mm512_set1_epi32(ek_load_tail32(p, len)); }

#define EK_DP_ROW(r, va)                                   \
  {                                                        \
    const __m512i va_ = (va);                              \
    acc##r##a = _mm512_dpbusd_epi32(acc##r##a, va_, vwa); \
    acc##r##b = _mm512_dpbusd_epi32(acc##r##b, va_, vwb); \
  }

#define EK_STORE_ROW(r)                                                                                     \
  _mm_mask_storeu_epi8(c##r + j0, ma, ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc##r##a, &ra), vzp, vqmin, vqmax)); \
  _mm_mask_storeu_epi8(c##r + j0 + 16, mb, ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc##r##b, &rb), vzp, vqmin, vqmax));

#define EK_STORE_HALF(r) \
  _mm_mask_storeu_epi8(c##r + j0, ma, ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc##r##a, &ra), vzp, vqmin, vqmax));

/* rows past m alias the last real row (computed twice, stored twice, same values) */
#define EK_ROWS(i)                                          \
  const size_t rows = m - (i);                              \
  const int8_t* a0 = a + (i) * a_stride;                    \
  const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;         \
  const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;         \
  const int8_t* a3 = rows > 3 ? a2 + a_stride : a2;         \
  int8_t* c0 = c + (i) * c_stride;                          \
  int8_t* c1 = rows > 1 ? c0 + c_stride : c0;               \
  int8_t* c2 = rows > 2 ? c1 + c_stride : c1;               \
  int8_t* c3 = rows > 3 ? c2 + c_stride : c2;

void ek_qs8_gemm_ukernel_4x32c4__avx512vnni(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                            const void* packed_w, int8_t* c, size_t c_stride,
                                            const struct ek_requant_params* rq) {
  const size_t k_main = k & ~(size_t)3;
  const size_t k_pad = (k + 3) & ~(size_t)3;
  const size_t block_bytes = 32 * sizeof(int32_t) + k_pad * 32;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);

  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 32, w += block_bytes) {
    const size_t nj = n - j0 < 32 ? n - j0 : 32;
    const __mmask16 ma = (__mmask16)(nj >= 16 ? 0xFFFFu : (1u << nj) - 1u);
    const __mmask16 mb = (__mmask16)(nj <= 16 ? 0u : nj == 32 ? 0xFFFFu : (1u << (nj - 16)) - 1u);
    const struct ek_rq_avx512 ra = ek_rq_avx512_init(_mm512_maskz_loadu_epi32(ma, rq->multiplier + j0),
                                                     _mm512_maskz_loadu_epi32(ma, rq->shift + j0));
    const struct ek_rq_avx512 rb = ek_rq_avx512_init(_mm512_maskz_loadu_epi32(mb, rq->multiplier + j0 + 16),
                                                     _mm512_maskz_loadu_epi32(mb, rq->shift + j0 + 16));
    const __m512i bias_a = _mm512_loadu_si512(w), bias_b = _mm512_loadu_si512(w + 64);

    if (nj > 16) {
      for (size_t i = 0; i < m; i += 4) {
        EK_ROWS(i)
        __m512i acc0a = bias_a, acc0b = bias_b, acc1a = bias_a, acc1b = bias_b;
        __m512i acc2a = bias_a, acc2b = bias_b, acc3a = bias_a, acc3b = bias_b;
        const uint8_t* wk = w + 128;
        size_t kk = 0;
        for (; kk < k_main; kk += 4) {
          const __m512i vwa = _mm512_loadu_si512(wk);
          const __m512i vwb = _mm512_loadu_si512(wk + 64);
          EK_DP_ROW(0, ek_bcast4(a0 + kk))
          EK_DP_ROW(1, ek_bcast4(a1 + kk))
          EK_DP_ROW(2, ek_bcast4(a2 + kk))
          EK_DP_ROW(3, ek_bcast4(a3 + kk))
          wk += 128;
        }
        if (kk < k) { /* 1..3 left: zero-filled bytes meet zero-padded weights */
          const size_t len = k - kk;
          const __m512i vwa = _mm512_loadu_si512(wk);
          const __m512i vwb = _mm512_loadu_si512(wk + 64);
          EK_DP_ROW(0, ek_bcast_tail(a0 + kk, len))
          EK_DP_ROW(1, ek_bcast_tail(a1 + kk, len))
          EK_DP_ROW(2, ek_bcast_tail(a2 + kk, len))
          EK_DP_ROW(3, ek_bcast_tail(a3 + kk, len))
        }
        EK_STORE_ROW(3)
        EK_STORE_ROW(2)
        EK_STORE_ROW(1)
        EK_STORE_ROW(0)
      }
    } else { /* a last block of <= 16 columns: the left half only (n = 8, 16, 24 are common) */
      for (size_t i = 0; i < m; i += 4) {
        EK_ROWS(i)
        __m512i acc0a = bias_a, acc1a = bias_a, acc2a = bias_a, acc3a = bias_a;
        const uint8_t* wk = w + 128;
        size_t kk = 0;
        for (; kk < k_main; kk += 4) {
          const __m512i vwa = _mm512_loadu_si512(wk);
          acc0a = _mm512_dpbusd_epi32(acc0a, ek_bcast4(a0 + kk), vwa);
          acc1a = _mm512_dpbusd_epi32(acc1a, ek_bcast4(a1 + kk), vwa);
          acc2a = _mm512_dpbusd_epi32(acc2a, ek_bcast4(a2 + kk), vwa);
          acc3a = _mm512_dpbusd_epi32(acc3a, ek_bcast4(a3 + kk), vwa);
          wk += 128;
        }
        if (kk < k) {
          const size_t len = k - kk;
          const __m512i vwa = _mm512_loadu_si512(wk);
          acc0a = _mm512_dpbusd_epi32(acc0a, ek_bcast_tail(a0 + kk, len), vwa);
          acc1a = _mm512_dpbusd_epi32(acc1a, ek_bcast_tail(a1 + kk, len), vwa);
          acc2a = _mm512_dpbusd_epi32(acc2a, ek_bcast_tail(a2 + kk, len), vwa);
          acc3a = _mm512_dpbusd_epi32(acc3a, ek_bcast_tail(a3 + kk, len), vwa);
        }
        EK_STORE_HALF(3)
        EK_STORE_HALF(2)
        EK_STORE_HALF(1)
        EK_STORE_HALF(0)
      }
    }
  }
}
#endif
