/* x8-lut, 64 bytes per iteration, AVX-512 VBMI: VPERMI2B looks a byte up among 128 table
 * entries by its low 7 bits; one lookup in entries 0-127, one in 128-255, and a blend by the
 * byte's top bit give T[x] exactly: 3 instructions per 64 bytes (the AVX2 kernel's 16 VPSHUFB
 * rounds take ~47 per 32). The tail is a masked load and store of the last n < 64 bytes. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VBMI
#include <immintrin.h>

static inline __m512i ek_lut64(__m512i x, __m512i t0, __m512i t1, __m512i t2, __m512i t3) {
  const __m512i lo = _mm512_permutex2var_epi8(t0, x, t1); /* T[x & 127] */
  const __m512i hi = _mm512_permutex2var_epi8(t2, x, t3); /* T[128 + (x & 127)] */
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

void ek_x8_lut_ukernel__avx512vbmi_u64(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table) {
  const __m512i t0 = _mm512_loadu_si512((const void*)table);
  const __m512i t1 = _mm512_loadu_si512((const void*)(table + 64));
  const __m512i t2 = _mm512_loadu_si512((const void*)(table + 128));
  const __m512i t3 = _mm512_loadu_si512((const void*)(table + 192));
  for (; n >= 64; n -= 64, x += 64, y += 64)
    _mm512_storeu_si512((void*)y, ek_lut64(_mm512_loadu_si512((const void*)x), t0, t1, t2, t3));
  if (n) {
    const __mmask64 m = ((__mmask64)1 << n) - 1; /* n < 64 */
    _mm512_mask_storeu_epi8((void*)y, m, ek_lut64(_mm512_maskz_loadu_epi8(m, (const void*)x), t0, t1, t2, t3));
  }
}
#endif
