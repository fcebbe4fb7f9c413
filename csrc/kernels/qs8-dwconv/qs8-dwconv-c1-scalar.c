/* The qs8-dwconv reference: one channel at a time, plain C. */
#include <string.h>

#include "edgekit/kernels.h"
#include "edgekit/requant.h"

void ek_qs8_dwconv_ukernel_c1__scalar(size_t channels, size_t output_width, size_t kernel_size,
                                      const int8_t* const* input, size_t input_step, const void* packed_w,
                                      int8_t* output, size_t output_stride,
                                      const struct ek_requant_params* rq) {
  for (size_t p = 0; p < output_width; p++) {
    const int8_t* const* in = input + p * input_step;
    int8_t* out = output + p * output_stride;
    const int8_t* w = (const int8_t*)packed_w;
    for (size_t c = 0; c < channels; c++) {
      uint32_t acc; /* wraps like the SIMD kernels (no signed overflow) */
      memcpy(&acc, w, sizeof acc);
      w += sizeof acc;
      for (size_t t = 0; t < kernel_size; t++) acc += (uint32_t)((int32_t)in[t][c] * (int32_t)w[t]);
      w += kernel_size;
      out[c] = ek_requant((int32_t)acc, rq->multiplier[c], rq->shift[c], rq->zp_out, rq->qmin, rq->qmax);
    }
  }
}
