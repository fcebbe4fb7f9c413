/* f32-qs8-cvt, 32 elements per iteration, AVX2: VDIVPS (the reference's divide, not a
 * reciprocal multiply), NaN masked to 0, VMAXPS/VMINPS clamp (equal to the reference's compares
 * once NaN is gone), VCVTPS2DQ rounds half to even; the sum with zp lies in int8, so the packs
 * never saturate. The 1..31-element tail is a masked load and a partial store. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

#include "../common/tail-avx2.h"

struct ek_cvt_consts {
  __m256 s, lo, hi;
  __m256i zp;
};

static inline __m256i ek_cvt8(__m256 v, const struct ek_cvt_consts* k) {
  __m256 q = _mm256_div_ps(v, k->s);
  q = _mm256_and_ps(q, _mm256_cmp_ps(q, q, _CMP_ORD_Q));
  q = _mm256_min_ps(_mm256_max_ps(q, k->lo), k->hi);
  return _mm256_add_epi32(_mm256_cvtps_epi32(q), k->zp);
}

/* 32 int32 in [-128, 127] (a, b, c, d: 8 each, in order) -> 32 int8 in order */
static inline __m256i ek_pack32(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d); /* a0 b0 a1 b1 (128-bit lanes) */
  const __m256i v = _mm256_packs_epi16(ab, cd);                               /* a0 b0 c0 d0 a1 b1 c1 d1 (dwords) */
  return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void ek_f32_qs8_cvt_ukernel__avx2_u32(size_t n, const float* x, int8_t* y, const struct ek_f32_qs8_cvt_params* p) {
  const struct ek_cvt_consts k = {_mm256_set1_ps(p->scale), _mm256_set1_ps((float)(-128 - p->zp)),
                                  _mm256_set1_ps((float)(127 - p->zp)), _mm256_set1_epi32(p->zp)};
  for (; n >= 32; n -= 32, x += 32, y += 32) {
    const __m256i a = ek_cvt8(_mm256_loadu_ps(x), &k), b = ek_cvt8(_mm256_loadu_ps(x + 8), &k);
    const __m256i c = ek_cvt8(_mm256_loadu_ps(x + 16), &k), d = ek_cvt8(_mm256_loadu_ps(x + 24), &k);
    _mm256_storeu_si256((__m256i*)(void*)y, ek_pack32(a, b, c, d));
  }
  if (n) {
    __m256i v[4];
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (size_t j = 0; j < 4; j++) { /* lanes at or past n are masked off: never loaded */
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)n - (int32_t)(8 * j)), idx);
      v[j] = ek_cvt8(_mm256_maskload_ps(x + (n > 8 * j ? 8 * j : 0), mask), &k);
    }
    const __m256i r = ek_pack32(v[0], v[1], v[2], v[3]);
    ek_avx2_store_tail16(y, _mm256_castsi256_si128(r), n < 16 ? n : 16);
    if (n > 16) ek_avx2_store_tail16(y + 16, _mm256_extracti128_si256(r, 1), n - 16);
  }
}
#endif
