/* qs8-gemm, 3 rows x 8 columns, k in groups of 8, AVX2: sign-extend to int16, VPMADDWD pairs
 * into int32 (exact: no saturating byte multiply), a horizontal reduction per tile. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include <string.h>

#include "../common/load-tail.h"
#include "../common/requant-avx2.h"

static inline __m256i ek_load_a8(const int8_t* p) {
  int64_t v;
  memcpy(&v, p, sizeof v);
  return _mm256_cvtepi8_epi16(_mm_set1_epi64x(v));
}

static inline __m256i ek_load_a_tail(const int8_t* p, size_t len) {
  return _mm256_cvtepi8_epi16(_mm_set1_epi64x(ek_load_tail64(p, len)));
}

static inline __m256i ek_reduce8(__m256i s01, __m256i s23, __m256i s45, __m256i s67) {
  const __m256i s0213 = _mm256_hadd_epi32(s01, s23);
  const __m256i s4657 = _mm256_hadd_epi32(s45, s67);
  const __m256i s = _mm256_hadd_epi32(s0213, s4657); /* 0 2 4 6 | 1 3 5 7 */
  return _mm256_permutevar8x32_epi32(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static inline void ek_store8(int8_t* dst, __m128i v, size_t nj) {
  if (nj == 8) {
    _mm_storel_epi64((__m128i*)dst, v);
  } else {
    int8_t tmp[16];
    _mm_storeu_si128((__m128i*)tmp, v);
    memcpy(dst, tmp, nj);
  }
}

#define EK_MADD_ROW(r, va)                                                    \
  acc##r##01 = _mm256_add_epi32(acc##r##01, _mm256_madd_epi16(va, vw01)); \
  acc##r##23 = _mm256_add_epi32(acc##r##23, _mm256_madd_epi16(va, vw23)); \
  acc##r##45 = _mm256_add_epi32(acc##r##45, _mm256_madd_epi16(va, vw45)); \
  acc##r##67 = _mm256_add_epi32(acc##r##67, _mm256_madd_epi16(va, vw67));

void ek_qs8_gemm_ukernel_3x8c8__avx2(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                     const void* packed_w, int8_t* c, size_t c_stride,
                                     const struct ek_requant_params* rq) {
  const size_t k_main = k & ~(size_t)7;
  const size_t k_pad = (k + 7) & ~(size_t)7;
  const size_t block_bytes = 8 * sizeof(int32_t) + k_pad * 8;
  const __m128i vzp = _mm_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);

  for (size_t i = 0; i < m; i += 3) {
    const size_t rows = m - i;
    const int8_t* a0 = a + i * a_stride;
    const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;
    const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;
    int8_t* c0 = c + i * c_stride;
    int8_t* c1 = rows > 1 ? c0 + c_stride : c0;
    int8_t* c2 = rows > 2 ? c1 + c_stride : c1;

    const uint8_t* w = (const uint8_t*)packed_w;
    for (size_t j0 = 0; j0 < n; j0 += 8) {
      __m256i acc001 = _mm256_setzero_si256(), acc023 = acc001, acc045 = acc001, acc067 = acc001;
      __m256i acc101 = acc001, acc123 = acc001, acc145 = acc001, acc167 = acc001;
      __m256i acc201 = acc001, acc223 = acc001, acc245 = acc001, acc267 = acc001;
      const int8_t* wk = (const int8_t*)(w + 32);
      size_t kk = 0;
      for (; kk < k_main; kk += 8) {
        const __m256i vw01 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)wk));
        const __m256i vw23 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 16)));
        const __m256i vw45 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 32)));
        const __m256i vw67 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 48)));
        const __m256i va0 = ek_load_a8(a0 + kk);
        EK_MADD_ROW(0, va0)
        const __m256i va1 = ek_load_a8(a1 + kk);
        EK_MADD_ROW(1, va1)
        const __m256i va2 = ek_load_a8(a2 + kk);
        EK_MADD_ROW(2, va2)
        wk += 64;
      }
      if (kk < k) {
        const size_t len = k - kk;
        const __m256i vw01 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)wk));
        const __m256i vw23 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 16)));
        const __m256i vw45 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 32)));
        const __m256i vw67 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(wk + 48)));
        const __m256i va0 = ek_load_a_tail(a0 + kk, len);
        EK_MADD_ROW(0, va0)
        const __m256i va1 = ek_load_a_tail(a1 + kk, len);
        EK_MADD_ROW(1, va1)
        const __m256i va2 = ek_load_a_tail(a2 + kk, len);
        EK_MADD_ROW(2, va2)
      }

      const size_t nj = n - j0 < 8 ? n - j0 : 8;
      const __m256i vbias = _mm256_loadu_si256((const __m256i*)w);
      __m256i vmult, vshift;
      if (nj == 8) {
        vmult = _mm256_loadu_si256((const __m256i*)(rq->multiplier + j0));
        vshift = _mm256_loadu_si256((const __m256i*)(rq->shift + j0));
      } else {
        const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i lmask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nj), lanes);
        vmult = _mm256_maskload_epi32((const int*)(rq->multiplier + j0), lmask);
        vshift = _mm256_maskload_epi32((const int*)(rq->shift + j0), lmask);
      }
      const struct ek_rq_avx2 r = ek_rq_avx2_init(vmult, vshift);
      const __m256i s0 = _mm256_add_epi32(ek_reduce8(acc001, acc023, acc045, acc067), vbias);
      const __m256i s1 = _mm256_add_epi32(ek_reduce8(acc101, acc123, acc145, acc167), vbias);
      const __m256i s2 = _mm256_add_epi32(ek_reduce8(acc201, acc223, acc245, acc267), vbias);
      ek_store8(c2 + j0, ek_avx2_narrow8(ek_avx2_mul_by_multiplier(s2, &r), vzp, vqmin, vqmax), nj);
      ek_store8(c1 + j0, ek_avx2_narrow8(ek_avx2_mul_by_multiplier(s1, &r), vzp, vqmin, vqmax), nj);
      ek_store8(c0 + j0, ek_avx2_narrow8(ek_avx2_mul_by_multiplier(s0, &r), vzp, vqmin, vqmax), nj);
      w += block_bytes;
    }
  }
}
#endif
