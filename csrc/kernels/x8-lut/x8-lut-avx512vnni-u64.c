/* x8-lut, 64 bytes per iteration, AVX-512 BW (the avx512vnni level; no VNNI instruction): the
 * AVX2 kernel's 16 VPSHUFB over XOR-difference rows (x8-lut-avx2-u64.c says why it is exact)
 * on 512-bit registers; the tail is a masked load and store. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>

static inline __m512i ek_lut64(__m512i x, const __m512i d[16]) {
  const __m512i v16 = _mm512_set1_epi8(16);
  __m512i y = _mm512_shuffle_epi8(d[0], x);
  for (int k = 1; k < 9; k++) {
    x = _mm512_sub_epi8(x, v16);
    y = _mm512_xor_si512(y, _mm512_shuffle_epi8(d[k], x));
  }
  for (int k = 9; k < 16; k++) {
    x = _mm512_subs_epi8(x, v16);
    y = _mm512_xor_si512(y, _mm512_shuffle_epi8(d[k], x));
  }
  return y;
}

void ek_x8_lut_ukernel__avx512vnni_u64(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table) {
  __m512i d[16];
  __m128i prev = _mm_setzero_si128(), low[8];
  for (int k = 0; k < 16; k++) {
    const __m128i t = _mm_loadu_si128((const __m128i*)(const void*)(table + 16 * k));
    __m128i dk = k == 0 ? t : _mm_xor_si128(prev, t);
    if (k >= 8) dk = _mm_xor_si128(dk, low[k - 8]);
    else low[k] = dk;
    d[k] = _mm512_broadcast_i32x4(dk);
    prev = t;
  }
  for (; n >= 64; n -= 64, x += 64, y += 64)
    _mm512_storeu_si512((void*)y, ek_lut64(_mm512_loadu_si512((const void*)x), d));
  if (n) {
    const __mmask64 m = _cvtu64_mask64((UINT64_C(1) << n) - 1);
    _mm512_mask_storeu_epi8((void*)y, m, ek_lut64(_mm512_maskz_loadu_epi8(m, (const void*)x), d));
  }
}
#endif
