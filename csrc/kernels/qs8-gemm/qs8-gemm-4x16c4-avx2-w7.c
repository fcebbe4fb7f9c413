/* qs8-gemm, 4 rows x 16 columns, weights packed in k-quads (kr = 4), AVX2, for weights in
 * [-64, 64] only (EK_ISA_W7: 7-bit weights, what x86 runtimes quantize to on CPUs without VNNI).
 *
 * VPMADDUBSW multiplies unsigned by signed bytes and adds each pair into a *saturating* int16.
 * Activations enter as x ^ 0x80 = x + 128 in [0, 255] (the packed bias carries -128 * sum(w),
 * as for VPDPBUSD); with |w| <= 64 a pair is at most 2 * 255 * 64 = 32640 < 32767 in magnitude,
 * so nothing saturates and the kernel is exact. VPMADDWD by ones then adds the two pairs of a
 * column's k-quad into its int32. Per k-quad and 4x16 tile: 4 broadcasts, 4 XORs, 8 VPMADDUBSW,
 * 8 VPMADDWD, 8 VPADDD for 256 multiply-adds, against the 16-bit kernel's (4x16c2) ~5 per
 * instruction. The packing is the VNNI kernels' c4 one (a column's 4 bytes of a k-quad side by
 * side), so the accumulators hold columns in natural order, as in 4x16c2, and share its
 * requantization. The runtime takes this kernel only for an op whose packed weights all lie in
 * [-64, 64] (checked at load); weights outside would saturate silently, so the precondition is
 * part of the kernel's ISA word, not a hope. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

/* rows past m repeat the last row, as in every gemm kernel */
#define EK_QUAD(xa, acc0, acc1)                                                              \
  do {                                                                                       \
    const __m256i x = _mm256_xor_si256(xa, vflip);                                           \
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), vones));     \
    if (two) acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), vones)); \
  } while (0)

static inline __m256i ek_bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

static inline void ek_store16(int8_t* dst, __m128i v, size_t nj) {
  if (nj == 16) {
    _mm_storeu_si128((__m128i*)dst, v);
    return;
  }
  ek_avx2_store_tail16(dst, v, nj);
}

static inline void ek_store_row8(int8_t* dst, __m256i acc, const struct ek_rq_avx2* r0, __m128i vzp, __m128i vqmin,
                                 __m128i vqmax, size_t nj) {
  const __m128i v = ek_avx2_narrow8(ek_avx2_mul_by_multiplier(acc, r0), vzp, vqmin, vqmax);
  if (nj == 8)
    _mm_storel_epi64((__m128i*)dst, v);
  else
    ek_store_tail64(dst, (uint64_t)_mm_cvtsi128_si64(v), nj);
}

static inline __attribute__((always_inline)) void ek_rows(size_t m, size_t k, const int8_t* a, size_t a_stride,
                                                          const int8_t* wq, __m256i bias0, __m256i bias1, int8_t* c,
                                                          size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,
                                                          const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin,
                                                          __m128i vqmax, const int two) {
  const size_t k_main = k & ~(size_t)3;
  const __m256i vqmin256 = _mm256_broadcastsi128_si256(vqmin), vqmax256 = _mm256_broadcastsi128_si256(vqmax);
  const __m256i vflip = _mm256_set1_epi8((char)0x80), vones = _mm256_set1_epi16(1);
  for (size_t i = 0; i < m; i += 4) {
    const size_t rows = m - i;
    const int8_t* a0 = a + i * a_stride;
    const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;
    const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;
    const int8_t* a3 = rows > 3 ? a2 + a_stride : a2;
    __m256i acc00 = bias0, acc01 = bias1, acc10 = bias0, acc11 = bias1;
    __m256i acc20 = bias0, acc21 = bias1, acc30 = bias0, acc31 = bias1;
    const int8_t* w = wq;
    size_t kk = 0;
    for (; kk < k_main; kk += 4, w += 64) {
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)w);
      const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)(w + 32)) : w0;
      EK_QUAD(ek_bcast4(a0 + kk), acc00, acc01);
      EK_QUAD(ek_bcast4(a1 + kk), acc10, acc11);
      EK_QUAD(ek_bcast4(a2 + kk), acc20, acc21);
      EK_QUAD(ek_bcast4(a3 + kk), acc30, acc31);
    }
    if (kk < k) { /* 1..3 left: zero activations (x + 128 = 128) meet the packing's zero weights */
      const size_t len = k - kk;
      const __m256i w0 = _mm256_loadu_si256((const __m256i*)w);
      const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)(w + 32)) : w0;
      EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a0 + kk, len)), acc00, acc01);
      EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a1 + kk, len)), acc10, acc11);
      EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a2 + kk, len)), acc20, acc21);
      EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a3 + kk, len)), acc30, acc31);
    }
    int8_t* c0 = c + i * c_stride;
    int8_t* c1 = rows > 1 ? c0 + c_stride : c0;
    int8_t* c2 = rows > 2 ? c1 + c_stride : c1;
    int8_t* c3 = rows > 3 ? c2 + c_stride : c2;
    if (two) {
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

void ek_qs8_gemm_ukernel_4x16c4__avx2_w7(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                        const void* packed_w, int8_t* c, size_t c_stride,
                                        const struct ek_requant_params* rq) {
  const size_t k_pad = (k + 3) & ~(size_t)3;
  const size_t block_bytes = 16 * sizeof(int32_t) + k_pad * 16;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);

  const uint8_t* wb = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 16, wb += block_bytes) {
    const size_t nj = n - j0 < 16 ? n - j0 : 16;
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
    else
      ek_rows(m, k, a, a_stride, w0, bias0, bias1, c + j0, c_stride, nj, &r0, &r1, vzp, vqmin, vqmax, 0);
  }
}
#endif
