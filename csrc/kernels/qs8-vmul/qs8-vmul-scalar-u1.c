/* The qs8-vmul reference: quantized Mul, one element at a time. */
#include "edgekit/kernels.h"
#include "edgekit/requant.h"

void ek_qs8_vmul_ukernel__scalar_u1(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                    const struct ek_qs8_mul_params* p) {
  for (size_t i = 0; i < n; i++) {
    const int32_t prod = ((int32_t)a[i] - p->a_zp) * ((int32_t)b[i] - p->b_zp);
    y[i] = ek_requant(prod, p->multiplier, p->shift, p->out_zp, p->qmin, p->qmax);
  }
}
