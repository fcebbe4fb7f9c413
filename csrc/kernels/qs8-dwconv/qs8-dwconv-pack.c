/* Weight packing for every qs8-dwconv kernel (layouts in kernels.h). */
#include <string.h>

#include "edgekit/kernels.h"

/* The "pair" layout of the x86 kernels, which multiply two taps at once with VPMADDWD /
 * VPDPWSSD on int16 pairs: within a block of cr channels (a multiple of 8), accumulator "lo"
 * lane q holds channel 8*(q/4) + q%4 and "hi" lane q channel 8*(q/4) + 4 + q%4 (the order
 * VPUNPCKLWD / VPUNPCKHWD leave sign-extended inputs in; VPACKSSDW undoes it). */
static int ek_pair_layout(uint32_t isa, size_t cr) {
  return (isa == EK_ISA_AVX2 || isa == EK_ISA_AVX512VNNI) && cr % 8 == 0;
}

static size_t ek_pair_channel(size_t half, size_t q) { return 8 * (q / 4) + 4 * half + q % 4; }

size_t ek_qs8_dwconv_packed_size(size_t channels, size_t kernel_size, size_t cr) {
  const size_t blocks = (channels + cr - 1) / cr;
  const size_t plain = cr * sizeof(int32_t) + kernel_size * cr;
  const size_t pairs = cr * sizeof(int32_t) + (kernel_size + 1) / 2 * cr * 2 * sizeof(int16_t);
  return blocks * (plain > pairs ? plain : pairs); /* enough for every ISA's layout */
}

static int32_t ek_bias_prime(const int8_t* w, const int32_t* bias, int32_t zx, size_t channels, size_t kernel_size,
                             size_t c) {
  int64_t sum = 0;
  for (size_t t = 0; t < kernel_size; t++) sum += w[t * channels + c];
  const int64_t v = (bias != NULL ? (int64_t)bias[c] : 0) - (int64_t)zx * sum;
  return (int32_t)(uint32_t)(uint64_t)v; /* modular: kernels accumulate mod 2^32 */
}

void ek_qs8_dwconv_pack(uint32_t isa, size_t cr, size_t channels, size_t kernel_size, const int8_t* w,
                        const int32_t* bias, int32_t zx, void* packed) {
  uint8_t* out = (uint8_t*)packed;
  if (ek_pair_layout(isa, cr)) {
    const size_t half = cr / 2;
    for (size_t c0 = 0; c0 < channels; c0 += cr) {
      for (size_t h = 0; h < 2; h++) {
        for (size_t q = 0; q < half; q++) {
          const size_t c = c0 + ek_pair_channel(h, q);
          const int32_t b = c < channels ? ek_bias_prime(w, bias, zx, channels, kernel_size, c) : 0;
          memcpy(out, &b, sizeof b);
          out += sizeof b;
        }
      }
      for (size_t t = 0; t < kernel_size; t += 2) {
        for (size_t h = 0; h < 2; h++) {
          for (size_t q = 0; q < half; q++) {
            const size_t c = c0 + ek_pair_channel(h, q);
            int16_t pair[2] = {0, 0};
            if (c < channels) {
              pair[0] = w[t * channels + c];
              if (t + 1 < kernel_size) pair[1] = w[(t + 1) * channels + c];
            }
            memcpy(out, pair, sizeof pair);
            out += sizeof pair;
          }
        }
      }
    }
    return;
  }
  for (size_t c0 = 0; c0 < channels; c0 += cr) {
    for (size_t j = 0; j < cr; j++) {
      const int32_t b = c0 + j < channels ? ek_bias_prime(w, bias, zx, channels, kernel_size, c0 + j) : 0;
      memcpy(out, &b, sizeof b);
      out += sizeof b;
    }
    int8_t* q = (int8_t*)out;
    for (size_t t = 0; t < kernel_size; t++) {
      for (size_t j = 0; j < cr; j++) *q++ = (c0 + j < channels) ? w[t * channels + c0 + j] : 0;
    }
    out += kernel_size * cr;
  }
}
