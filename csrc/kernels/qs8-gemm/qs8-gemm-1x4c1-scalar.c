/* The qs8-gemm reference: plain C, builds everywhere, the production fallback. */
#include <string.h>

#include "edgekit/kernels.h"
#include "edgekit/requant.h"

void ek_qs8_gemm_ukernel_1x4c1__scalar(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                       const void* packed_w, int8_t* c, size_t c_stride,
                                       const struct ek_requant_params* rq) {
  for (size_t i = 0; i < m; i++) {
    const int8_t* ai = a + i * a_stride;
    int8_t* ci = c + i * c_stride;
    const int8_t* w = (const int8_t*)packed_w;
    for (size_t j0 = 0; j0 < n; j0 += 4) {
      /* uint32: the packed bias' and the sums wrap like every SIMD kernel's (no signed overflow) */
      uint32_t acc[4];
      memcpy(acc, w, sizeof acc);
      w += sizeof acc;
      for (size_t kk = 0; kk < k; kk++) {
        const int32_t x = ai[kk];
        acc[0] += (uint32_t)(x * w[0]);
        acc[1] += (uint32_t)(x * w[1]);
        acc[2] += (uint32_t)(x * w[2]);
        acc[3] += (uint32_t)(x * w[3]);
        w += 4;
      }
      const size_t nj = n - j0 < 4 ? n - j0 : 4;
      for (size_t j = 0; j < nj; j++) {
        ci[j0 + j] = ek_requant((int32_t)acc[j], rq->multiplier[j0 + j], rq->shift[j0 + j], rq->zp_out, rq->qmin,
                                rq->qmax);
      }
    }
  }
}
