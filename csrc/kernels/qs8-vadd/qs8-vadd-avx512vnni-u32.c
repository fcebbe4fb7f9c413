/* qs8-vadd, 32 elements per iteration, AVX-512 (F/BW/VL; built at the avx512vnni level, no
 * VNNI instruction needed). TFLite's quantized Add, bit-exact; y may be a or b (in place). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>

#include "../common/requant-avx512.h"

struct ek_vadd_consts {
  struct ek_rq_avx512 ra, rb, ro;
  __m512i a_zp, b_zp, vzp;
  __m128i lift;
  __m256i qmin, qmax;
};

static inline __m256i ek_vadd32(__m256i a8, __m256i b8, const struct ek_vadd_consts* k) {
  const __m512i va = _mm512_sub_epi16(_mm512_cvtepi8_epi16(a8), k->a_zp);
  const __m512i vb = _mm512_sub_epi16(_mm512_cvtepi8_epi16(b8), k->b_zp);
  const __m512i a_lo = _mm512_sll_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(va)), k->lift);
  const __m512i a_hi = _mm512_sll_epi32(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(va, 1)), k->lift);
  const __m512i b_lo = _mm512_sll_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(vb)), k->lift);
  const __m512i b_hi = _mm512_sll_epi32(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(vb, 1)), k->lift);
  const __m512i s_lo = _mm512_add_epi32(ek_avx512_mul_by_multiplier(a_lo, &k->ra), ek_avx512_mul_by_multiplier(b_lo, &k->rb));
  const __m512i s_hi = _mm512_add_epi32(ek_avx512_mul_by_multiplier(a_hi, &k->ra), ek_avx512_mul_by_multiplier(b_hi, &k->rb));
  const __m256i y_lo = _mm512_cvtsepi32_epi16(ek_avx512_mul_by_multiplier(s_lo, &k->ro));
  const __m256i y_hi = _mm512_cvtsepi32_epi16(ek_avx512_mul_by_multiplier(s_hi, &k->ro));
  const __m512i v = _mm512_adds_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(y_lo), y_hi, 1), k->vzp);
  return _mm256_min_epi8(_mm256_max_epi8(_mm512_cvtsepi16_epi8(v), k->qmin), k->qmax);
}

void ek_qs8_vadd_ukernel__avx512vnni_u32(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                         const struct ek_qs8_add_params* p) {
  struct ek_vadd_consts k;
  k.ra = ek_rq_avx512_init(_mm512_set1_epi32(p->a_multiplier), _mm512_set1_epi32(p->a_shift));
  k.rb = ek_rq_avx512_init(_mm512_set1_epi32(p->b_multiplier), _mm512_set1_epi32(p->b_shift));
  k.ro = ek_rq_avx512_init(_mm512_set1_epi32(p->out_multiplier), _mm512_set1_epi32(p->out_shift));
  k.a_zp = _mm512_set1_epi16((int16_t)p->a_zp);
  k.b_zp = _mm512_set1_epi16((int16_t)p->b_zp);
  k.vzp = _mm512_set1_epi16((int16_t)p->out_zp);
  k.lift = _mm_cvtsi32_si128(p->left_shift);
  k.qmin = _mm256_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm256_set1_epi8((int8_t)p->qmax);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(a + i)), vb = _mm256_loadu_si256((const __m256i*)(b + i));
    _mm256_storeu_si256((__m256i*)(y + i), ek_vadd32(va, vb, &k));
  }
  if (i < n) {
    const __mmask32 m = (__mmask32)((1u << (n - i)) - 1u);
    const __m256i va = _mm256_maskz_loadu_epi8(m, a + i), vb = _mm256_maskz_loadu_epi8(m, b + i);
    _mm256_mask_storeu_epi8(y + i, m, ek_vadd32(va, vb, &k));
  }
}
#endif
