/* requant.h's ek_mul_by_multiplier, 16 x int32 lanes at a time, AVX-512 F/BW/VL (bit-exact):
 * VPMULDQ on even/odd lanes, a 64-bit rounding add, VPSRAVQ, saturation to int32 only when
 * some shift > 0 (otherwise the result always fits). Private to the kernels; include only
 * from files built with the avx512vnni flags. */
#ifndef EK_KERNELS_REQUANT_AVX512_H
#define EK_KERNELS_REQUANT_AVX512_H

#include <immintrin.h>
#include <stdint.h>

struct ek_rq_avx512 {
  __m512i mult, mult_odd, n_even, n_odd, rnd_even, rnd_odd;
  int has_left;
  int high33;            /* every shift <= -2: requant-avx2.h's high-half path (its proof) */
  __m512i n_high, hrnd32; /* n - 32 and 2^(n-33) per 32-bit lane (high33 path) */
};

static inline struct ek_rq_avx512 ek_rq_avx512_init(__m512i mult, __m512i shift) {
  struct ek_rq_avx512 r;
  const __m512i one64 = _mm512_set1_epi64(1);
  const __m512i n = _mm512_sub_epi32(_mm512_set1_epi32(31), shift);
  r.mult = mult;
  r.mult_odd = _mm512_srli_epi64(mult, 32);
  r.n_even = _mm512_and_si512(n, _mm512_set1_epi64(0xFFFFFFFF));
  r.n_odd = _mm512_srli_epi64(n, 32);
  r.rnd_even = _mm512_sllv_epi64(one64, _mm512_sub_epi64(r.n_even, one64));
  r.rnd_odd = _mm512_sllv_epi64(one64, _mm512_sub_epi64(r.n_odd, one64));
  r.has_left = _mm512_cmpgt_epi32_mask(shift, _mm512_setzero_si512()) != 0;
  r.high33 = _mm512_cmpgt_epi32_mask(shift, _mm512_set1_epi32(-2)) == 0;
  r.n_high = _mm512_sub_epi32(n, _mm512_set1_epi32(32));
  /* lanes with n < 33 (read only when high33 holds for all) get a count the shift ignores */
  r.hrnd32 = _mm512_sllv_epi32(_mm512_set1_epi32(1), _mm512_sub_epi32(n, _mm512_set1_epi32(33)));
  return r;
}

/* ek_avx512_mul_by_multiplier where r->high33 holds: with P = H * 2^32 + L, the rounding term
 * 2^(n-1) (n >= 33) lands on the high half H and L cannot carry past it (requant-avx2.h):
 * 7 ops per 16 lanes instead of 9 */
static inline __m512i ek_avx512_mul_high33(__m512i x, const struct ek_rq_avx512* r) {
  const __m512i pe = _mm512_mul_epi32(x, r->mult);
  const __m512i po = _mm512_mul_epi32(_mm512_srli_epi64(x, 32), r->mult_odd);
  const __m512i hi = _mm512_mask_blend_epi32((__mmask16)0xAAAA, _mm512_srli_epi64(pe, 32), po);
  return _mm512_srav_epi32(_mm512_add_epi32(hi, r->hrnd32), r->n_high);
}

static inline __m512i ek_avx512_mul_by_multiplier(__m512i x, const struct ek_rq_avx512* r) {
  __m512i pe = _mm512_add_epi64(_mm512_mul_epi32(x, r->mult), r->rnd_even);
  __m512i po = _mm512_add_epi64(_mm512_mul_epi32(_mm512_srli_epi64(x, 32), r->mult_odd), r->rnd_odd);
  pe = _mm512_srav_epi64(pe, r->n_even);
  po = _mm512_srav_epi64(po, r->n_odd);
  if (r->has_left) {
    const __m512i hi = _mm512_set1_epi64(INT32_MAX), lo = _mm512_set1_epi64(INT32_MIN);
    pe = _mm512_max_epi64(_mm512_min_epi64(pe, hi), lo);
    po = _mm512_max_epi64(_mm512_min_epi64(po, hi), lo);
  }
  return _mm512_mask_blend_epi32((__mmask16)0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

/* 16 int32 -> clamp(zp + v, qmin, qmax) as int8 (saturating narrows, zp, clamp). */
static inline __m128i ek_avx512_narrow16(__m512i x, __m256i vzp16, __m128i vqmin, __m128i vqmax) {
  __m256i v = _mm256_adds_epi16(_mm512_cvtsepi32_epi16(x), vzp16);
  __m128i b = _mm256_cvtsepi16_epi8(v);
  return _mm_min_epi8(_mm_max_epi8(b, vqmin), vqmax);
}

#endif /* EK_KERNELS_REQUANT_AVX512_H */
