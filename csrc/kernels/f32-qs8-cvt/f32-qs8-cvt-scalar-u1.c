/* The f32-qs8-cvt reference (ONNX QuantizeLinear to int8): x / scale as a float32 divide, NaN
 * -> 0, clamp to [-128 - zp, 127 - zp], round half to even, + zp. The rounding adds and
 * subtracts 1.5 * 2^23, exact for |q| < 2^22 (the clamp guarantees it) under the default
 * rounding mode, which is what the SIMD conversions (CVTPS2DQ, FCVTNS) do. */
#include "edgekit/kernels.h"

#define EK_ROUND_MAGIC 12582912.0f

void ek_f32_qs8_cvt_ukernel__scalar_u1(size_t n, const float* x, int8_t* y, const struct ek_f32_qs8_cvt_params* p) {
  const float s = p->scale, lo = (float)(-128 - p->zp), hi = (float)(127 - p->zp);
  for (size_t i = 0; i < n; i++) {
    float q = x[i] / s;
    q = q != q ? 0.0f : q;
    q = q < lo ? lo : q > hi ? hi : q;
    q = (q + EK_ROUND_MAGIC) - EK_ROUND_MAGIC;
    y[i] = (int8_t)((int32_t)q + p->zp);
  }
}
