/* qs8-gemm, 4 rows x 16 columns, k in groups of 4, AVX-512 VNNI (VPDPBUSD).
 *
 * VPDPBUSD multiplies unsigned by signed bytes: the caller passes activations as x ^ 0x80 =
 * x + 128 (uint8; kernels.h, a_offset 128), and the packed bias carries -128 * sum(w), so every
 * accumulator equals the scalar reference's exactly (mod 2^32, and the true value fits). */
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

void ek_qs8_gemm_ukernel_4x16c4__avx512vnni(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                            const void* packed_w, int8_t* c, size_t c_stride,
                                            const struct ek_requant_params* rq) {
  const size_t k_main = k & ~(size_t)3;
  const size_t k_pad = (k + 3) & ~(size_t)3;
  const size_t block_bytes = 16 * sizeof(int32_t) + k_pad * 16;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);

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

    const uint8_t* w = (const uint8_t*)packed_w;
    for (size_t j0 = 0; j0 < n; j0 += 16) {
      __m512i acc0 = _mm512_loadu_si512(w);
      __m512i acc1 = acc0, acc2 = acc0, acc3 = acc0;
      const uint8_t* wk = w + 64;
      size_t kk = 0;
      for (; kk < k_main; kk += 4) {
        const __m512i vw = _mm512_loadu_si512(wk);
        acc0 = _mm512_dpbusd_epi32(acc0, ek_bcast4(a0 + kk), vw);
        acc1 = _mm512_dpbusd_epi32(acc1, ek_bcast4(a1 + kk), vw);
        acc2 = _mm512_dpbusd_epi32(acc2, ek_bcast4(a2 + kk), vw);
        acc3 = _mm512_dpbusd_epi32(acc3, ek_bcast4(a3 + kk), vw);
        wk += 64;
      }
      if (kk < k) { /* 1..3 left: zero-filled bytes meet zero-padded weights */
        const size_t len = k - kk;
        const __m512i vw = _mm512_loadu_si512(wk);
        acc0 = _mm512_dpbusd_epi32(acc0, ek_bcast_tail(a0 + kk, len), vw);
        acc1 = _mm512_dpbusd_epi32(acc1, ek_bcast_tail(a1 + kk, len), vw);
        acc2 = _mm512_dpbusd_epi32(acc2, ek_bcast_tail(a2 + kk, len), vw);
        acc3 = _mm512_dpbusd_epi32(acc3, ek_bcast_tail(a3 + kk, len), vw);
      }

      const size_t nj = n - j0 < 16 ? n - j0 : 16;
      const __mmask16 cmask = (__mmask16)((1u << nj) - 1u);
      const struct ek_rq_avx512 r = ek_rq_avx512_init(_mm512_maskz_loadu_epi32(cmask, rq->multiplier + j0),
                                                      _mm512_maskz_loadu_epi32(cmask, rq->shift + j0));
      const __m128i y0 = ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc0, &r), vzp, vqmin, vqmax);
      const __m128i y1 = ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc1, &r), vzp, vqmin, vqmax);
      const __m128i y2 = ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc2, &r), vzp, vqmin, vqmax);
      const __m128i y3 = ek_avx512_narrow16(ek_avx512_mul_by_multiplier(acc3, &r), vzp, vqmin, vqmax);
      _mm_mask_storeu_epi8(c3 + j0, cmask, y3);
      _mm_mask_storeu_epi8(c2 + j0, cmask, y2);
      _mm_mask_storeu_epi8(c1 + j0, cmask, y1);
      _mm_mask_storeu_epi8(c0 + j0, cmask, y0);
      w += block_bytes;
    }
  }
}
#endif
