/* qs8-vmul, 32 elements per iteration, AVX-512 (F/BW/VL; built at the avx512vnni level, no
 * VNNI instruction needed). Bit-exact with the scalar reference; y may be a or b (in place). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>

#include "../common/requant-avx512.h"

struct ek_vmul_consts {
  struct ek_rq_avx512 r;
  __m512i a_zp, b_zp, vzp;
  __m256i qmin, qmax;
};

static inline __m256i ek_vmul32(__m256i a8, __m256i b8, const struct ek_vmul_consts* k) {
  const __m512i va = _mm512_sub_epi16(_mm512_cvtepi8_epi16(a8), k->a_zp);
  const __m512i vb = _mm512_sub_epi16(_mm512_cvtepi8_epi16(b8), k->b_zp);
  /* exact 32-bit products from the 16-bit halves; unpack lo/hi then packs restores the order */
  const __m512i lo = _mm512_mullo_epi16(va, vb), hi = _mm512_mulhi_epi16(va, vb);
  const __m512i y_lo = ek_avx512_mul_by_multiplier(_mm512_unpacklo_epi16(lo, hi), &k->r);
  const __m512i y_hi = ek_avx512_mul_by_multiplier(_mm512_unpackhi_epi16(lo, hi), &k->r);
  const __m512i v = _mm512_adds_epi16(_mm512_packs_epi32(y_lo, y_hi), k->vzp);
  return _mm256_min_epi8(_mm256_max_epi8(_mm512_cvtsepi16_epi8(v), k->qmin), k->qmax);
}

void ek_qs8_vmul_ukernel__avx512vnni_u32(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                         const struct ek_qs8_mul_params* p) {
  struct ek_vmul_consts k;
  k.r = ek_rq_avx512_init(_mm512_set1_epi32(p->multiplier), _mm512_set1_epi32(p->shift));
  k.a_zp = _mm512_set1_epi16((int16_t)p->a_zp);
  k.b_zp = _mm512_set1_epi16((int16_t)p->b_zp);
  k.vzp = _mm512_set1_epi16((int16_t)p->out_zp);
  k.qmin = _mm256_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm256_set1_epi8((int8_t)p->qmax);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(a + i)), vb = _mm256_loadu_si256((const __m256i*)(b + i));
    _mm256_storeu_si256((__m256i*)(y + i), ek_vmul32(va, vb, &k));
  }
  if (i < n) {
    const __mmask32 m = (__mmask32)((1u << (n - i)) - 1u);
    const __m256i va = _mm256_maskz_loadu_epi8(m, a + i), vb = _mm256_maskz_loadu_epi8(m, b + i);
    _mm256_mask_storeu_epi8(y + i, m, ek_vmul32(va, vb, &k));
  }
}
#endif
