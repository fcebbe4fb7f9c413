/* qs8-vmul, 16 elements per iteration, AVX2 (bit-exact with the scalar reference). y may be a
 * or b (in place). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

struct ek_vmul_consts {
  struct ek_rq_avx2 r;
  __m256i a_zp, b_zp, vzp;
  __m128i qmin, qmax;
};

static inline __m128i ek_vmul16(__m128i a8, __m128i b8, const struct ek_vmul_consts* k) {
  const __m256i va = _mm256_sub_epi16(_mm256_cvtepi8_epi16(a8), k->a_zp);
  const __m256i vb = _mm256_sub_epi16(_mm256_cvtepi8_epi16(b8), k->b_zp);
  /* exact 32-bit products from the 16-bit halves; unpack lo/hi then packs restores the order */
  const __m256i lo = _mm256_mullo_epi16(va, vb), hi = _mm256_mulhi_epi16(va, vb);
  const __m256i p_lo = _mm256_unpacklo_epi16(lo, hi); /* 0-3 | 8-11 */
  const __m256i p_hi = _mm256_unpackhi_epi16(lo, hi); /* 4-7 | 12-15 */
  const __m256i y_lo = ek_avx2_mul_by_multiplier(p_lo, &k->r);
  const __m256i y_hi = ek_avx2_mul_by_multiplier(p_hi, &k->r);
  __m256i v = _mm256_adds_epi16(_mm256_packs_epi32(y_lo, y_hi), k->vzp); /* 0-7 | 8-15 */
  __m128i bytes = _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_min_epi8(_mm_max_epi8(bytes, k->qmin), k->qmax);
}

void ek_qs8_vmul_ukernel__avx2_u16(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                   const struct ek_qs8_mul_params* p) {
  struct ek_vmul_consts k;
  k.r = ek_rq_avx2_init(_mm256_set1_epi32(p->multiplier), _mm256_set1_epi32(p->shift));
  k.a_zp = _mm256_set1_epi16((int16_t)p->a_zp);
  k.b_zp = _mm256_set1_epi16((int16_t)p->b_zp);
  k.vzp = _mm256_set1_epi16((int16_t)p->out_zp);
  k.qmin = _mm_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm_set1_epi8((int8_t)p->qmax);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128((const __m128i*)(a + i)), vb = _mm_loadu_si128((const __m128i*)(b + i));
    _mm_storeu_si128((__m128i*)(y + i), ek_vmul16(va, vb, &k));
  }
  if (i < n) /* inline tail: these run once per pixel on broadcast operands (C = 8..88) */
    ek_avx2_store_tail16(y + i, ek_vmul16(ek_avx2_load_tail16(a + i, n - i), ek_avx2_load_tail16(b + i, n - i), &k), n - i);
}
#endif
