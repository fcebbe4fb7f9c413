/* x8-lut, 64 bytes per iteration, AVX2: VPSHUFB over the table's 16 rows of 16 bytes.
 *
 * VPSHUFB gives row[idx & 15], or 0 when idx's top bit is set. The index is lowered by 16
 * before each of the 16 shuffles, wrapping for rows 1..8 and saturating (VPSUBSB) for 9..15;
 * a byte of row b then takes part in exactly the shuffles k in [0, b] (b < 8) or [b - 7, b]
 * (b >= 8). The shuffled tables are XOR differences, d[0] = T[0], d[k] = T[k-1] ^ T[k] for
 * k < 8 and d[k] = T[k-1] ^ T[k] ^ d[k-8] for k >= 8, so the XOR of the shuffles that take
 * part is T[b][idx & 15] exactly (XNNPACK's x8-lut method). */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

#include "../common/tail-avx2.h"

static inline __m256i ek_lut32(__m256i x, const __m256i d[16]) {
  const __m256i v16 = _mm256_set1_epi8(16);
  __m256i y = _mm256_shuffle_epi8(d[0], x);
  for (int k = 1; k < 9; k++) {
    x = _mm256_sub_epi8(x, v16);
    y = _mm256_xor_si256(y, _mm256_shuffle_epi8(d[k], x));
  }
  for (int k = 9; k < 16; k++) {
    x = _mm256_subs_epi8(x, v16);
    y = _mm256_xor_si256(y, _mm256_shuffle_epi8(d[k], x));
  }
  return y;
}

void ek_x8_lut_ukernel__avx2_u64(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table) {
  __m256i d[16];
  __m128i prev = _mm_setzero_si128();
  for (int k = 0; k < 16; k++) {
    const __m128i t = _mm_loadu_si128((const __m128i*)(const void*)(table + 16 * k));
    __m128i dk = k == 0 ? t : _mm_xor_si128(prev, t);
    if (k >= 8) dk = _mm_xor_si128(dk, _mm256_castsi256_si128(d[k - 8]));
    d[k] = _mm256_broadcastsi128_si256(dk);
    prev = t;
  }
  for (; n >= 64; n -= 64, x += 64, y += 64) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(const void*)x);
    const __m256i b = _mm256_loadu_si256((const __m256i*)(const void*)(x + 32));
    _mm256_storeu_si256((__m256i*)(void*)y, ek_lut32(a, d));
    _mm256_storeu_si256((__m256i*)(void*)(y + 32), ek_lut32(b, d));
  }
  for (; n >= 32; n -= 32, x += 32, y += 32)
    _mm256_storeu_si256((__m256i*)(void*)y, ek_lut32(_mm256_loadu_si256((const __m256i*)(const void*)x), d));
  if (n >= 16) {
    const __m256i r = ek_lut32(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(const void*)x)), d);
    _mm_storeu_si128((__m128i*)(void*)y, _mm256_castsi256_si128(r));
    n -= 16, x += 16, y += 16;
  }
  if (n) {
    const __m128i v = ek_avx2_load_tail16((const int8_t*)x, n);
    ek_avx2_store_tail16((int8_t*)y, _mm256_castsi256_si128(ek_lut32(_mm256_castsi128_si256(v), d)), n);
  }
}
#endif
