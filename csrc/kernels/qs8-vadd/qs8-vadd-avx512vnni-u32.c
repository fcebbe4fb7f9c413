/* qs8-vadd, 32 elements per iteration, AVX-512 (F/BW/VL; built at the avx512vnni level, no
 * VNNI instruction needed). TFLite's quantized Add, bit-exact; y may be a or b (in place). An
 * input term whose multiplier is 2^30 with shift s <= 0 and left_shift + s >= 1 (the input at
 * the larger scale) is a left shift by left_shift + s - 1 (qs8-vadd-avx2-u16.c says why). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>

#include "../common/requant-avx512.h"

struct ek_vadd_consts {
  struct ek_rq_avx512 ra, rb, ro;
  __m512i a_zp, b_zp, vzp;
  __m128i lift_a, lift_b; /* a power-of-two term's count is ls + s - 1, others' ls */
  __m256i qmin, qmax;
};

/* `pow2`, `high` (the high33 path) constants after inlining */
static inline __attribute__((always_inline)) __m512i ek_vadd_term(__m512i d, __m128i lift, const struct ek_rq_avx512* r,
                                                                  const int pow2, const int high) {
  const __m512i x = _mm512_sll_epi32(d, lift);
  if (pow2) return x;
  return high ? ek_avx512_mul_high33(x, r) : ek_avx512_mul_by_multiplier(x, r);
}

static inline __attribute__((always_inline)) __m256i ek_vadd32(__m256i a8, __m256i b8, const struct ek_vadd_consts* k,
                                                               const int pa, const int pb, const int high) {
  const __m512i va = _mm512_sub_epi16(_mm512_cvtepi8_epi16(a8), k->a_zp);
  const __m512i vb = _mm512_sub_epi16(_mm512_cvtepi8_epi16(b8), k->b_zp);
  const __m512i a_lo = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(va));
  const __m512i a_hi = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(va, 1));
  const __m512i b_lo = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(vb));
  const __m512i b_hi = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(vb, 1));
  const __m512i s_lo = _mm512_add_epi32(ek_vadd_term(a_lo, k->lift_a, &k->ra, pa, high),
                                        ek_vadd_term(b_lo, k->lift_b, &k->rb, pb, high));
  const __m512i s_hi = _mm512_add_epi32(ek_vadd_term(a_hi, k->lift_a, &k->ra, pa, high),
                                        ek_vadd_term(b_hi, k->lift_b, &k->rb, pb, high));
  const __m512i o_lo = high ? ek_avx512_mul_high33(s_lo, &k->ro) : ek_avx512_mul_by_multiplier(s_lo, &k->ro);
  const __m512i o_hi = high ? ek_avx512_mul_high33(s_hi, &k->ro) : ek_avx512_mul_by_multiplier(s_hi, &k->ro);
  const __m256i y_lo = _mm512_cvtsepi32_epi16(o_lo), y_hi = _mm512_cvtsepi32_epi16(o_hi);
  const __m512i v = _mm512_adds_epi16(_mm512_inserti64x4(_mm512_castsi256_si512(y_lo), y_hi, 1), k->vzp);
  return _mm256_min_epi8(_mm256_max_epi8(_mm512_cvtsepi16_epi8(v), k->qmin), k->qmax);
}

static inline __attribute__((always_inline)) void ek_vadd_loop(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                                               const struct ek_vadd_consts* k, const int pa,
                                                               const int pb, const int high) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i va = _mm256_loadu_si256((const __m256i*)(a + i)), vb = _mm256_loadu_si256((const __m256i*)(b + i));
    _mm256_storeu_si256((__m256i*)(y + i), ek_vadd32(va, vb, k, pa, pb, high));
  }
  if (i < n) {
    const __mmask32 m = (__mmask32)((1u << (n - i)) - 1u);
    const __m256i va = _mm256_maskz_loadu_epi8(m, a + i), vb = _mm256_maskz_loadu_epi8(m, b + i);
    _mm256_mask_storeu_epi8(y + i, m, ek_vadd32(va, vb, k, pa, pb, high));
  }
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
  const int pa = ek_qs8_add_term_is_shift(p->a_multiplier, p->a_shift, p->left_shift);
  const int pb = ek_qs8_add_term_is_shift(p->b_multiplier, p->b_shift, p->left_shift);
  k.lift_a = _mm_cvtsi32_si128(pa ? p->left_shift + p->a_shift - 1 : p->left_shift);
  k.lift_b = _mm_cvtsi32_si128(pb ? p->left_shift + p->b_shift - 1 : p->left_shift);
  k.qmin = _mm256_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm256_set1_epi8((int8_t)p->qmax);
  const int high = (pa || k.ra.high33) && (pb || k.rb.high33) && k.ro.high33;
  if (high && pa && !pb)
    ek_vadd_loop(n, a, b, y, &k, 1, 0, 1);
  else if (high && !pa && pb)
    ek_vadd_loop(n, a, b, y, &k, 0, 1, 1);
  else if (high && pa && pb)
    ek_vadd_loop(n, a, b, y, &k, 1, 1, 1);
  else if (high)
    ek_vadd_loop(n, a, b, y, &k, 0, 0, 1);
  else /* the rest: pa and pb tested per vector */
    ek_vadd_loop(n, a, b, y, &k, pa, pb, 0);
}
#endif
