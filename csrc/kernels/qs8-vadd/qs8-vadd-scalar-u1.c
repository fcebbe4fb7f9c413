/* The qs8-vadd reference: TFLite's quantized Add, one element at a time. */
#include "edgekit/kernels.h"
#include "edgekit/requant.h"

void ek_qs8_vadd_ukernel__scalar_u1(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                                    const struct ek_qs8_add_params* p) {
  const int32_t lift = (int32_t)1 << p->left_shift;
  for (size_t i = 0; i < n; i++) {
    const int32_t va = ek_mul_by_multiplier(((int32_t)a[i] - p->a_zp) * lift, p->a_multiplier, p->a_shift);
    const int32_t vb = ek_mul_by_multiplier(((int32_t)b[i] - p->b_zp) * lift, p->b_multiplier, p->b_shift);
    y[i] = ek_requant(va + vb, p->out_multiplier, p->out_shift, p->out_zp, p->qmin, p->qmax);
  }
}
