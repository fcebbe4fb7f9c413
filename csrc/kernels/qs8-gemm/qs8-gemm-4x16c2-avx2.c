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

#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

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

static inline void ek_store16(int8_t* dst, __m128i v, size_t nj) {
  if (nj == 16) {
    _mm_storeu_si128((__m128i*)dst, v);
    return;
  }
  ek_avx2_store_tail16(dst, v, nj);
}

/* the first nj <= 8 columns of a row */
static inline void ek_store_row8(int8_t* dst, __m256i acc, const struct ek_rq_avx2* r0, __m128i vzp, __m128i vqmin,
                                 __m128i vqmax, size_t nj) {
  const __m128i v = ek_avx2_narrow8(ek_avx2_mul_by_multiplier(acc, r0), vzp, vqmin, vqmax);
  if (nj == 8)
    _mm_storel_epi64((__m128i*)dst, v);
  else
    ek_store_tail64(dst, (uint64_t)_mm_cvtsi128_si64(v), nj);
}

/* all rows of one column block; `two`: 16 columns (else the block's first 8) */
static inline __attribute__((always_inline)) void ek_rows(size_t m, size_t k, const int8_t* a, size_t a_stride,
                                                          const int8_t* w0, __m256i bias0, __m256i bias1, int8_t* c,
                                                          size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,
                                                          const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin,
                                                          __m128i vqmax, const int two) {
  const size_t k_main = k & ~(size_t)7;
  const __m256i vqmin256 = _mm256_broadcastsi128_si256(vqmin), vqmax256 = _mm256_broadcastsi128_si256(vqmax);
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
    if (two) { /* two rows per byte pack and clamp */
      const __m256i v32 = ek_avx2_narrow16x2(ek_avx2_mul_by_multiplier(acc30, r0), ek_avx2_mul_by_multiplier(acc31, r1),
                                             ek_avx2_mul_by_multiplier(acc20, r0), ek_avx2_mul_by_multiplier(acc21, r1),
                                             vzp, vqmin256, vqmax256);
      ek_store16(c3, _mm256_castsi256_si128(v32), nj);
      ek_store16(c2, _mm256_extracti128_si256(v32, 1), nj);
      const __m256i v10 = ek_avx2_narrow16x2(ek_avx2_mul_by_multiplier(acc10, r0), ek_avx2_mul_by_multiplier(acc11, r1),
                                             ek_avx2_mul_by_multiplier(acc00, r0), ek_avx2_mul_by_multiplier(acc01, r1),
                                             vzp, vqmin256, vqmax256);
      ek_store16(c1, _mm256_castsi256_si128(v10), nj);
      ek_store16(c0, _mm256_extracti128_si256(v10, 1), nj);
    } else {
      const __m128i vzp8 = _mm256_castsi256_si128(vzp);
      ek_store_row8(c3, acc30, r0, vzp8, vqmin, vqmax, nj);
      ek_store_row8(c2, acc20, r0, vzp8, vqmin, vqmax, nj);
      ek_store_row8(c1, acc10, r0, vzp8, vqmin, vqmax, nj);
      ek_store_row8(c0, acc00, r0, vzp8, vqmin, vqmax, nj);
    }
  }
}

void ek_qs8_gemm_ukernel_4x16c2__avx2(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                      const void* packed_w, int8_t* c, size_t c_stride,
                                      const struct ek_requant_params* rq) {
  const size_t k_pad = (k + 1) & ~(size_t)1;
  const size_t block_bytes = 16 * sizeof(int32_t) + k_pad * 16;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

  const uint8_t* wb = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 16, wb += block_bytes) {
    const size_t nj = n - j0 < 16 ? n - j0 : 16;
    /* per-channel constants of this block; lanes past n are never read */
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nj), lanes);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nj - 8), lanes);
    const struct ek_rq_avx2 r0 = ek_rq_avx2_init(_mm256_maskload_epi32((const int*)(rq->multiplier + j0), mask0),
                                                 _mm256_maskload_epi32((const int*)(rq->shift + j0), mask0));
    const struct ek_rq_avx2 r1 =
        ek_rq_avx2_init(_mm256_maskload_epi32((const int*)(rq->multiplier + j0 + 8), mask1),
                        _mm256_maskload_epi32((const int*)(rq->shift + j0 + 8), mask1));
    const __m256i bias0 = _mm256_loadu_si256((const __m256i*)wb);
    const __m256i bias1 = _mm256_loadu_si256((const __m256i*)(wb + 32));
    const int8_t* w0 = (const int8_t*)(wb + 64);

    if (nj > 8)
      ek_rows(m, k, a, a_stride, w0, bias0, bias1, c + j0, c_stride, nj, &r0, &r1, vzp, vqmin, vqmax, 1);
    else /* the last 1..8 columns: half the multiplies */
      ek_rows(m, k, a, a_stride, w0, bias0, bias1, c + j0, c_stride, nj, &r0, &r1, vzp, vqmin, vqmax, 0);
  }
}
#endif
