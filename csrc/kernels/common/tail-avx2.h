/* The first len (1..16) bytes of a row as one vector and back, without touching the bytes after
 * it and without a library call (a variable-length memcpy per row or per tap is one, and it
 * dominated the small-channel cases). Private to the kernels; include only from -mavx2 files. */
#ifndef EK_KERNELS_TAIL_AVX2_H
#define EK_KERNELS_TAIL_AVX2_H

#include <immintrin.h>

#include "load-tail.h"

/* bytes past len are zero */
static inline __m128i ek_avx2_load_tail16(const int8_t* p, size_t len) {
  int64_t lo, hi;
  ek_load_tail128(p, len, &lo, &hi);
  return _mm_set_epi64x(hi, lo);
}

static inline void ek_avx2_store_tail16(int8_t* p, __m128i v, size_t len) {
  ek_store_tail64(p, (uint64_t)_mm_cvtsi128_si64(v), len < 8 ? len : 8);
  if (len > 8) ek_store_tail64(p + 8, (uint64_t)_mm_extract_epi64(v, 1), len - 8);
}

#endif /* EK_KERNELS_TAIL_AVX2_H */
