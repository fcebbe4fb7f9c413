/* ek_qs8_flip with AVX2: 32 bytes of x ^ 0x80 per step (the baseline build's loop does 16). The
 * dispatch hands it to conv.c where the CPU has AVX2, which every kernel that takes flipped
 * activations (VPDPBUSD, VPMADDUBSW) needs anyway. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

void ek_qs8_flip__avx2(size_t rows, size_t k, const int8_t* src, size_t src_stride, int8_t* dst) {
  if (src_stride == k) { /* one run */
    k *= rows;
    rows = 1;
  }
  const __m256i v80 = _mm256_set1_epi8((char)0x80);
  for (size_t i = 0; i < rows; i++) {
    const int8_t* s = src + i * src_stride;
    int8_t* d = dst + i * k;
    size_t j = 0;
    for (; j + 32 <= k; j += 32)
      _mm256_storeu_si256((__m256i*)(d + j), _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(s + j)), v80));
    if (j + 16 <= k) {
      _mm_storeu_si128((__m128i*)(d + j), _mm_xor_si128(_mm_loadu_si128((const __m128i*)(s + j)), _mm256_castsi256_si128(v80)));
      j += 16;
    }
    for (; j < k; j++) d[j] = (int8_t)((uint8_t)s[j] ^ 0x80u);
  }
}
#endif
