/* qs8-vadd, 16 elements per iteration, AVX2 (TFLite's quantized Add, bit-exact). y may be a
 * or b (in place).
 *
 * The input with the larger scale has the multiplier 0.5 exactly (2^30, shift 0: TFLite's
 * derivation divides both scales by twice the larger). An input term whose multiplier is 2^30
 * with shift s <= 0 and left_shift + s >= 1 is a plain shift: with d = x - zp and
 * n = 31 - s, (d * 2^ls * 2^30 + 2^(n-1)) >> n = d * 2^(ls+s-1), since d * 2^(ls+30) is a
 * multiple of 2^n and the rounding term is below it. Such a term takes one shift instead of the
 * 64-bit multiply-and-round (8-10 vector ops per 8 lanes). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

struct ek_vadd_consts {
  struct ek_rq_avx2 ra, rb, ro;
  __m256i a_zp, b_zp, vzp;
  __m128i lift_a, lift_b, qmin, qmax; /* a power-of-two term's count is ls + s - 1, others' ls */
};

/* one input's term, 8 lanes of x - zp; `pow2`, `high` (high33 path) constants after inlining */
static inline __attribute__((always_inline)) __m256i ek_vadd_term(__m256i d, __m128i lift, const struct ek_rq_avx2* r,
                                                                  const int pow2, const int high) {
  const __m256i x = _mm256_sll_epi32(d, lift);
  return pow2 ? x : ek_avx2_requant32(x, r, high);
}

/* `high`: the output's and each non-power-of-two input's multiplier take the high33 path */
static inline __attribute__((always_inline)) __m128i ek_vadd16(__m128i a8, __m128i b8, const struct ek_vadd_consts* k,
                                                               const int pa, const int pb, const int high) {
  const __m256i va = _mm256_sub_epi16(_mm256_cvtepi8_epi16(a8), k->a_zp);
  const __m256i vb = _mm256_sub_epi16(_mm256_cvtepi8_epi16(b8), k->b_zp);
  const __m256i a_lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(va));
  const __m256i a_hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(va, 1));
  const __m256i b_lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(vb));
  const __m256i b_hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(vb, 1));
  const __m256i s_lo = _mm256_add_epi32(ek_vadd_term(a_lo, k->lift_a, &k->ra, pa, high),
                                        ek_vadd_term(b_lo, k->lift_b, &k->rb, pb, high));
  const __m256i s_hi = _mm256_add_epi32(ek_vadd_term(a_hi, k->lift_a, &k->ra, pa, high),
                                        ek_vadd_term(b_hi, k->lift_b, &k->rb, pb, high));
  return ek_avx2_narrow16(ek_avx2_requant32(s_lo, &k->ro, high), ek_avx2_requant32(s_hi, &k->ro, high), k->vzp, k->qmin,
                          k->qmax);
}

static inline __attribute__((always_inline)) void ek_vadd_loop(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                                               const struct ek_vadd_consts* k, const int pa,
                                                               const int pb, const int high) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i va = _mm_loadu_si128((const __m128i*)(a + i)), vb = _mm_loadu_si128((const __m128i*)(b + i));
    _mm_storeu_si128((__m128i*)(y + i), ek_vadd16(va, vb, k, pa, pb, high));
  }
  if (i < n) /* inline tail: these run once per pixel on broadcast operands (C = 8..88) */
    ek_avx2_store_tail16(y + i,
                         ek_vadd16(ek_avx2_load_tail16(a + i, n - i), ek_avx2_load_tail16(b + i, n - i), k, pa, pb, high),
                         n - i);
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
  const int pa = ek_qs8_add_term_is_shift(p->a_multiplier, p->a_shift, p->left_shift);
  const int pb = ek_qs8_add_term_is_shift(p->b_multiplier, p->b_shift, p->left_shift);
  k.lift_a = _mm_cvtsi32_si128(pa ? p->left_shift + p->a_shift - 1 : p->left_shift);
  k.lift_b = _mm_cvtsi32_si128(pb ? p->left_shift + p->b_shift - 1 : p->left_shift);
  k.qmin = _mm_set1_epi8((int8_t)p->qmin);
  k.qmax = _mm_set1_epi8((int8_t)p->qmax);
  const int high = (pa || k.ra.high33) && (pb || k.rb.high33) && k.ro.high33;
  if (high && pa && !pb) /* the usual cases: one input (or both) at the larger scale, a small output multiplier */
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
