/* Weight packing for every qs8-gemm kernel (layout in kernels.h). */
#include <string.h>

#include "edgekit/kernels.h"

size_t ek_qs8_gemm_packed_size(size_t n, size_t k, size_t nr, size_t kr) {
  size_t blocks = (n + nr - 1) / nr;
  size_t k_pad = (k + kr - 1) / kr * kr;
  return blocks * (nr * sizeof(int32_t) + k_pad * nr);
}

/* VPDPBUSD (avx512vnni) and VPMADDUBSW (avx2 with 7-bit weights) take unsigned activations, x + 128;
 * AMX's TDPBSSD and the others signed */
int32_t ek_qs8_gemm_a_offset(uint32_t isa) {
  const uint32_t level = isa & ~(uint32_t)EK_ISA_WEIGHT_BOUNDS;
  return level == EK_ISA_AVX512VNNI || isa == (EK_ISA_AVX2 | EK_ISA_W7) ? 128 : 0;
}

void ek_qs8_flip(size_t rows, size_t k, const int8_t* src, size_t src_stride, int8_t* dst) {
  if (src_stride == k) { /* one run (a 1x1 conv's rows, im2col's): the loop vectorizes whole */
    k *= rows;
    rows = 1;
  }
  for (size_t i = 0; i < rows; i++) {
    const uint8_t* s = (const uint8_t*)src + i * src_stride;
    uint8_t* d = (uint8_t*)dst + i * k;
    for (size_t j = 0; j < k; j++) d[j] = s[j] ^ 0x80u;
  }
}

void ek_qs8_gemm_pack(uint32_t isa, size_t nr, size_t kr, size_t n, size_t k, const int8_t* w,
                      const int32_t* bias, int32_t zx, void* packed) {
  const int64_t a_zero = (int64_t)zx + ek_qs8_gemm_a_offset(isa);
  const size_t k_pad = (k + kr - 1) / kr * kr;
  uint8_t* out = (uint8_t*)packed;
  for (size_t n0 = 0; n0 < n; n0 += nr) {
    for (size_t j = 0; j < nr; j++) {
      int32_t b = 0;
      if (n0 + j < n) {
        int64_t sum = 0;
        const int8_t* row = w + (n0 + j) * k;
        for (size_t i = 0; i < k; i++) sum += row[i];
        int64_t v = (bias != NULL ? (int64_t)bias[n0 + j] : 0) - a_zero * sum;
        b = (int32_t)(uint32_t)(uint64_t)v; /* modular: kernels accumulate mod 2^32 */
      }
      memcpy(out, &b, sizeof b);
      out += sizeof b;
    }
    int8_t* q = (int8_t*)out;
    for (size_t g = 0; g < k_pad; g += kr) {
      for (size_t j = 0; j < nr; j++) {
        for (size_t r = 0; r < kr; r++) {
          size_t col = n0 + j, kk = g + r;
          *q++ = (col < n && kk < k) ? w[col * k + kk] : 0;
        }
      }
    }
    out += k_pad * nr;
  }
}
