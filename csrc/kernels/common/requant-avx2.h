/* requant.h's ek_mul_by_multiplier, 8 x int32 lanes at a time, AVX2 (bit-exact):
 *     v = x * multiplier (exact, 64-bit),  y = sat32((v + 2^(n-1)) >> n),  n = 31 - shift.
 * AVX2 has no 64-bit arithmetic shift: with |v| < 2^62, (v + 2^(n-1) + 2^62) is non-negative,
 * a logical shift of it equals floor((v + 2^(n-1)) / 2^n) + 2^(62-n), and the 2^(62-n) comes
 * off afterwards (mod 2^32 when the result fits int32, i.e. shift <= 0; in 64 bits with a
 * saturation otherwise).
 *
 * When every lane has shift <= -1 (n >= 32: a conv's s_x * s_w / s_y < 0.5, the usual case), a
 * cheaper exact path: P = x * multiplier + 2^(n-1) needs no bias (|P| < 2^63), its high 32 bits
 * are floor(P / 2^32) and fit int32, and an arithmetic 32-bit shift by n - 32 of them is
 * floor(P / 2^n), the reference's value (which fits int32 there, so nothing saturates).
 * 8 vector ops per 8 lanes instead of 10. When every shift <= -2 (n >= 33, `high33`), the rounding
 * term 2^(n-1) is a multiple of 2^32 and can be added to the high halves instead: with
 * P = H * 2^32 + L (0 <= L < 2^32), floor((P + 2^(n-1)) / 2^n) = floor((H + 2^(n-33)) / 2^(n-32))
 * because L / 2^32 < 1 cannot carry past a multiple of 2^(n-32); |H| < 2^30 and 2^(n-33) <= 2^29,
 * so the sum fits int32: 7 ops. Private to the kernels; include only from files built with
 * -mavx2. */
#ifndef EK_KERNELS_REQUANT_AVX2_H
#define EK_KERNELS_REQUANT_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* Per-lane constants of 8 (multiplier, shift) pairs; "even"/"odd" = lanes 0,2,4,6 / 1,3,5,7
 * in the 64-bit positions _mm256_mul_epi32 works on. */
struct ek_rq_avx2 {
  __m256i mult, mult_odd;
  __m256i n_even, n_odd;     /* n = 31 - shift, as 64-bit counts */
  __m256i rnd_even, rnd_odd; /* 2^(n-1) + 2^62 */
  __m256i off_even, off_odd; /* 2^(62-n), 64-bit */
  __m256i off32;             /* 2^(62-n) mod 2^32, per 32-bit lane */
  int has_left;              /* some shift > 0: results may need saturating */
  int high;                  /* every shift <= -1: the high-half path below */
  int high33;                /* every shift <= -2: the cheaper high-half path */
  __m256i n_high;            /* n - 32 per 32-bit lane (high paths) */
  __m256i hrnd32;            /* 2^(n-33) per 32-bit lane (high33 path) */
  __m256i hrnd_even, hrnd_odd; /* 2^(n-1), 64-bit (high path) */
};

static inline struct ek_rq_avx2 ek_rq_avx2_init(__m256i mult, __m256i shift) {
  struct ek_rq_avx2 r;
  const __m256i one64 = _mm256_set1_epi64x(1), lo32 = _mm256_set1_epi64x(0xFFFFFFFF);
  const __m256i bias62 = _mm256_set1_epi64x(INT64_C(1) << 62), c62 = _mm256_set1_epi64x(62);
  const __m256i n = _mm256_sub_epi32(_mm256_set1_epi32(31), shift);
  r.mult = mult;
  r.mult_odd = _mm256_srli_epi64(mult, 32);
  r.n_even = _mm256_and_si256(n, lo32);
  r.n_odd = _mm256_srli_epi64(n, 32);
  r.rnd_even = _mm256_add_epi64(_mm256_sllv_epi64(one64, _mm256_sub_epi64(r.n_even, one64)), bias62);
  r.rnd_odd = _mm256_add_epi64(_mm256_sllv_epi64(one64, _mm256_sub_epi64(r.n_odd, one64)), bias62);
  r.off_even = _mm256_sllv_epi64(one64, _mm256_sub_epi64(c62, r.n_even));
  r.off_odd = _mm256_sllv_epi64(one64, _mm256_sub_epi64(c62, r.n_odd));
  r.off32 = _mm256_blend_epi32(r.off_even, _mm256_slli_epi64(r.off_odd, 32), 0xAA);
  r.has_left = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(shift, _mm256_setzero_si256()))) != 0;
  r.high = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(shift, _mm256_set1_epi32(-1)))) == 0;
  r.high33 = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(shift, _mm256_set1_epi32(-2)))) == 0;
  r.n_high = _mm256_sub_epi32(n, _mm256_set1_epi32(32));
  /* lanes with n < 33 (only read when high33 holds for all) get a count the shift ignores */
  r.hrnd32 = _mm256_sllv_epi32(_mm256_set1_epi32(1), _mm256_sub_epi32(n, _mm256_set1_epi32(33)));
  r.hrnd_even = _mm256_sub_epi64(r.rnd_even, bias62);
  r.hrnd_odd = _mm256_sub_epi64(r.rnd_odd, bias62);
  return r;
}

static inline __m256i ek_avx2_sat32_epi64(__m256i v) {
  const __m256i hi = _mm256_set1_epi64x(INT32_MAX), lo = _mm256_set1_epi64x(INT32_MIN);
  v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
  return _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
}

/* ek_mul_by_multiplier per lane where r->high33 is known to hold */
static inline __m256i ek_avx2_mul_high33(__m256i x, const struct ek_rq_avx2* r) {
  const __m256i pe = _mm256_mul_epi32(x, r->mult);
  const __m256i po = _mm256_mul_epi32(_mm256_srli_epi64(x, 32), r->mult_odd);
  const __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA); /* the high halves H */
  return _mm256_srav_epi32(_mm256_add_epi32(hi, r->hrnd32), r->n_high);
}

/* ek_mul_by_multiplier per lane. */
static inline __m256i ek_avx2_mul_by_multiplier(__m256i x, const struct ek_rq_avx2* r) {
  if (r->high) {
    const __m256i pe = _mm256_add_epi64(_mm256_mul_epi32(x, r->mult), r->hrnd_even);
    const __m256i po = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), r->mult_odd), r->hrnd_odd);
    const __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA); /* the high halves */
    return _mm256_srav_epi32(hi, r->n_high);
  }
  __m256i pe = _mm256_add_epi64(_mm256_mul_epi32(x, r->mult), r->rnd_even);
  __m256i po = _mm256_add_epi64(_mm256_mul_epi32(_mm256_srli_epi64(x, 32), r->mult_odd), r->rnd_odd);
  pe = _mm256_srlv_epi64(pe, r->n_even);
  po = _mm256_srlv_epi64(po, r->n_odd);
  if (!r->has_left) return _mm256_sub_epi32(_mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA), r->off32);
  pe = ek_avx2_sat32_epi64(_mm256_sub_epi64(pe, r->off_even));
  po = ek_avx2_sat32_epi64(_mm256_sub_epi64(po, r->off_odd));
  return _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* the same, with `high` a constant after inlining: 1 when the caller has checked r->high33 once
 * for a whole loop (the per-vector tests left the tile's epilogue) */
static inline __attribute__((always_inline)) __m256i ek_avx2_requant32(__m256i x, const struct ek_rq_avx2* r,
                                                                       const int high) {
  return high ? ek_avx2_mul_high33(x, r) : ek_avx2_mul_by_multiplier(x, r);
}

/* 16 int32 (lo = elements 0..7, hi = 8..15) -> clamp(zp + v, qmin, qmax) as int8. Saturating
 * narrows, a saturating zp add, then the clamp equal requant.h's 64-bit add and clamp
 * (qmin/qmax lie within int8). */
static inline __m128i ek_avx2_narrow16(__m256i lo, __m256i hi, __m256i vzp16, __m128i vqmin, __m128i vqmax) {
  __m256i v = _mm256_packs_epi32(lo, hi); /* 0-3 8-11 | 4-7 12-15 */
  v = _mm256_permute4x64_epi64(v, 0xD8);  /* 0-7 | 8-15 */
  v = _mm256_adds_epi16(v, vzp16);
  __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_min_epi8(_mm_max_epi8(b, vqmin), vqmax);
}

/* Two rows of 16 int32 each (row r: lo = elements 0..7, hi = 8..15) -> row 0's 16 int8 in the
 * low 128 bits, row 1's in the high: ek_avx2_narrow16 twice, sharing the byte pack and clamp. */
static inline __m256i ek_avx2_narrow16x2(__m256i lo0, __m256i hi0, __m256i lo1, __m256i hi1, __m256i vzp16,
                                         __m256i vqmin, __m256i vqmax) {
  const __m256i a = _mm256_adds_epi16(_mm256_packs_epi32(lo0, hi0), vzp16); /* row 0: 0-3 8-11 | 4-7 12-15 */
  const __m256i b = _mm256_adds_epi16(_mm256_packs_epi32(lo1, hi1), vzp16);
  __m256i v = _mm256_packs_epi16(a, b); /* dwords: r0 0-3, r0 8-11, r1 0-3, r1 8-11 | r0 4-7, r0 12-15, r1 4-7, r1 12-15 */
  v = _mm256_min_epi8(_mm256_max_epi8(v, vqmin), vqmax);
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 int32 -> 8 int8 in the low half. */
static inline __m128i ek_avx2_narrow8(__m256i x, __m128i vzp16, __m128i vqmin, __m128i vqmax) {
  __m128i v = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  v = _mm_adds_epi16(v, vzp16);
  v = _mm_packs_epi16(v, v);
  return _mm_min_epi8(_mm_max_epi8(v, vqmin), vqmax);
}

#endif /* EK_KERNELS_REQUANT_AVX2_H */
