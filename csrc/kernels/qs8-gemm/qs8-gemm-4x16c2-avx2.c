/* qs8-gemm, 4 rows x 16 columns, weights packed in k-pairs (kr = 2), AVX2.
 *
 * Exact 16-bit formulation (no saturating byte multiply): a row's 8 next activations are
 * sign-extended to int16 once and each (a[k], a[k+1]) pair is broadcast (VPSHUFD); the packed
 * weights of one pair are 16 columns x 2 int8, sign-extended to two registers of 8 columns, and
 * VPMADDWD adds the pair's two products into each column's int32. The accumulators hold
 * columns in natural order, so unlike a kr = 8 layout there is no horizontal reduction per
 * tile: the bias' starts the sums and the requantization (requant-avx2.h) runs straight on
 * them, which is what matters for the small k (8, 16, 24) of mobile networks' 1x1 convs.
 * Column blocks outside, rows inside: the requantization constants are set up once per block. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

#include "../common/gemm-4x16-avx2.h"

/* 8 activations as int16, in both 128-bit lanes */
static inline __m256i ek_a8(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_broadcastq_epi64(_mm_loadl_epi64((const __m128i*)p)));
}

static inline __m256i ek_a8_tail(const int8_t* p, size_t len) {
  return _mm256_cvtepi8_epi16(_mm_set1_epi64x(ek_load_tail64(p, len)));
}

static inline __m256i ek_w8(const int8_t* p) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p)); }

/* acc[r][h] += pair `sel` of row r's activations x the pair's weights (h: columns 0-7, 8-15;
 * the second half only when `two`, a constant after inlining) */
#define EK_PAIR(sel, wp)                                                    \
  do {                                                                      \
    const __m256i w0 = ek_w8(wp);                                           \
    const __m256i w1 = two ? ek_w8((wp) + 16) : w0;                         \
    __m256i x = _mm256_shuffle_epi32(va0, sel);                             \
    acc00 = _mm256_add_epi32(acc00, _mm256_madd_epi16(x, w0));              \
    if (two) acc01 = _mm256_add_epi32(acc01, _mm256_madd_epi16(x, w1));     \
    x = _mm256_shuffle_epi32(va1, sel);                                     \
    acc10 = _mm256_add_epi32(acc10, _mm256_madd_epi16(x, w0));              \
    if (two) acc11 = _mm256_add_epi32(acc11, _mm256_madd_epi16(x, w1));     \
    x = _mm256_shuffle_epi32(va2, sel);                                     \
    acc20 = _mm256_add_epi32(acc20, _mm256_madd_epi16(x, w0));              \
    if (two) acc21 = _mm256_add_epi32(acc21, _mm256_madd_epi16(x, w1));     \
    x = _mm256_shuffle_epi32(va3, sel);                                     \
    acc30 = _mm256_add_epi32(acc30, _mm256_madd_epi16(x, w0));              \
    if (two) acc31 = _mm256_add_epi32(acc31, _mm256_madd_epi16(x, w1));     \
  } while (0)

static inline __attribute__((always_inline)) void ek_rows(size_t m, size_t k, const int8_t* a, size_t a_stride,
                                                          const int8_t* w0, __m256i bias0, __m256i bias1, int8_t* c,
                                                          size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,
                                                          const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin,
                                                          __m128i vqmax, const int two, const int high) {
  const size_t k_main = k & ~(size_t)7;
  for (size_t i = 0; i < m; i += 4) {
    const size_t rows = m - i;
    /* rows past m repeat the last row: same values, stored to the same place */
    const int8_t* a0 = a + i * a_stride;
    const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;
    const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;
    const int8_t* a3 = rows > 3 ? a2 + a_stride : a2;
    __m256i acc00 = bias0, acc01 = bias1, acc10 = bias0, acc11 = bias1;
    __m256i acc20 = bias0, acc21 = bias1, acc30 = bias0, acc31 = bias1;
    const int8_t* w = w0;
    size_t kk = 0;
    for (; kk < k_main; kk += 8, w += 128) {
      const __m256i va0 = ek_a8(a0 + kk), va1 = ek_a8(a1 + kk), va2 = ek_a8(a2 + kk), va3 = ek_a8(a3 + kk);
      EK_PAIR(0x00, w);
      EK_PAIR(0x55, w + 32);
      EK_PAIR(0xAA, w + 64);
      EK_PAIR(0xFF, w + 96);
    }
    if (kk < k) { /* 1..7 left: zero-filled activations, pairs up to k_pad */
      const size_t len = k - kk;
      const __m256i va0 = ek_a8_tail(a0 + kk, len), va1 = ek_a8_tail(a1 + kk, len);
      const __m256i va2 = ek_a8_tail(a2 + kk, len), va3 = ek_a8_tail(a3 + kk, len);
      EK_PAIR(0x00, w);
      if (len > 2) EK_PAIR(0x55, w + 32);
      if (len > 4) EK_PAIR(0xAA, w + 64);
      if (len > 6) EK_PAIR(0xFF, w + 96);
    }
    int8_t* c0 = c + i * c_stride;
    int8_t* c1 = rows > 1 ? c0 + c_stride : c0;
    int8_t* c2 = rows > 2 ? c1 + c_stride : c1;
    int8_t* c3 = rows > 3 ? c2 + c_stride : c2;
    ek_avx2_4x16_store(c0, c1, c2, c3, acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31, r0, r1, vzp, vqmin, vqmax, nj,
                       two, high);
  }
}

EK_AVX2_4X16_ROWS_FNS(ek_rows)

void ek_qs8_gemm_ukernel_4x16c2__avx2(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                      const void* packed_w, int8_t* c, size_t c_stride,
                                      const struct ek_requant_params* rq) {
  ek_avx2_4x16_gemm(m, n, k, 2, a, a_stride, packed_w, c, c_stride, rq, ek_rows_fns);
}
#endif
