/* qs8-vadd, 16 elements per iteration, AVX2 (TFLite's quantized Add, bit-exact). y may be a
 * or b (in place). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

struct ek_vadd_consts {
  struct ek_rq_avx2 ra, rb, ro;
  __m256i a_zp, b_zp, vzp;
  __m128i lift, qmin, qmax;
};

static inline __m128i ek_vadd16(__m128i a8, __m128i b8, const struct ek_vadd_consts* k) {
  const __m256i va = _mm256_sub_epi16(_mm256_cvtepi8_epi16(a8), k->a_zp);
  const __m256i vb = _mm256_sub_epi16(_mm256_cvtepi8_epi16(b8), k->b_zp);
  __m256i a_lo = _mm256_sll_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(va)), k->lift);
  __m256i a_hi = _mm256_sll_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(va, 1)), k->lift);
  __m256i b_lo = _mm256_sll_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(vb)), k->lift);
  __m256i b_hi = _mm256_sll_epi32(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(vb, 1)), k->lift);
  const __m256i s_lo = _mm256_add_epi32(ek_avx2_mul_by_multiplier(a_lo, &k->ra), ek_avx2_mul_by_multiplier(b_lo, &k->rb));
  const __m256i s_hi = _mm256_add_epi32(ek_avx2_mul_by_multiplier(a_hi, &k->ra), ek_avx2_mul_by_multiplier(b_hi, &k->rb));
  return ek_avx2_narrow16(ek_avx2_mul_by_multiplier(s_lo, &k->ro), ek_avx2_mul_by_multiplier(s_hi, &k->ro), k->vzp,
                          k->qmin, k->qmax);
}

void ek_qs8_vadd_ukernel__avx2_u16(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                   const struct ek_qs8_add_params* p) {
  struct ek_vadd_consts k;
  k.ra = ek_rq_avx2_init(_mm256_set1_epi32(p->a_multiplier), _mm256_set1_epi32(p->a_shift));
  k.rb = ek_rq_avx2_init(_mm256_set1_epi32(p->b_multiplier), _mm256_set1_epi32(p->b_shift));
  k.ro = ek_rq_avx2_init(_mm256_set1_epi32(p->out_multiplier), _mm256_set1_epi32(p->out_shift));
  k.a_zp = _mm256_set1_epi16((int16_t)p->a_zp);
  k.b_zp = _mm256_set1_epi16((int16_t)p->b_zp);
  k.vzp = _mm256_set1_epi16((int16_t)p->out_zp);
  k.lift = _mm_cvtsi32_si128(p->left_shift);
  k.qmin = _mm_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm_set1_epi8((int8_t)p->qmax);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128((const __m128i*)(a + i)), vb = _mm_loadu_si128((const __m128i*)(b + i));
    _mm_storeu_si128((__m128i*)(y + i), ek_vadd16(va, vb, &k));
  }
  if (i < n) /* inline tail: these run once per pixel on broadcast operands (C = 8..88) */
    ek_avx2_store_tail16(y + i, ek_vadd16(ek_avx2_load_tail16(a + i, n - i), ek_avx2_load_tail16(b + i, n - i), &k), n - i);
}
#endif
