/* LUT_CHANNEL rows with AVX2 (ops.c): y[r][c] = T[c][x[r][c] + 128], one 256-byte table per
 * innermost channel. No byte gather exists: VPGATHERDD fetches the dword at T + c * 256 + x + 128
 * for 8 channels at once and its low bytes are the answers (the tables' copy carries EK_CLUT_PAD
 * bytes of padding past the last table, so the dword read of its last entry stays inside).
 * 8 outputs per ~9 instructions where the scalar loop takes ~6 per output; channels past the
 * last multiple of 8 of a row are looked up one by one. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include <string.h>

void ek_x8_clut__avx2(size_t rows, size_t channels, const int8_t* x, int8_t* y, const int8_t* tables) {
  const __m256i step = _mm256_set1_epi32(8 * 256);
  const __m256i first = _mm256_setr_epi32(128, 256 + 128, 512 + 128, 768 + 128, 1024 + 128, 1280 + 128, 1536 + 128,
                                          1792 + 128);
  /* byte 0 of each dword, per 128-bit lane, then the two lanes' 4 bytes side by side */
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i join = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
  const size_t c8 = channels & ~(size_t)7;
  for (size_t r = 0; r < rows; r++, x += channels, y += channels) {
    __m256i offs = first;
    size_t c = 0;
    for (; c < c8; c += 8, offs = _mm256_add_epi32(offs, step)) {
      int64_t v;
      memcpy(&v, x + c, sizeof v);
      const __m256i idx = _mm256_add_epi32(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(v)), offs);
      const __m256i g = _mm256_i32gather_epi32((const int*)(const void*)tables, idx, 1);
      const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(g, pick), join);
      const int64_t out = _mm_cvtsi128_si64(_mm256_castsi256_si128(b));
      memcpy(y + c, &out, sizeof out);
    }
    for (; c < channels; c++) y[c] = tables[c * 256 + (size_t)(x[c] + 128)];
  }
}
#endif
