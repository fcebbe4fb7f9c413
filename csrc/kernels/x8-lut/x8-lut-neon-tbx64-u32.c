/* x8-lut, 32 bytes per iteration, AArch64 NEON: the table as four 64-byte quarters. TBL gives
 * 0 and TBX keeps the lane for an index >= 64, so quarter q, looked up with idx - 64q (mod
 * 256), fills exactly the lanes whose index lies in it. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>

static inline uint8x16_t ek_lut16(uint8x16_t x, const uint8x16x4_t t[4]) {
  const uint8x16_t v64 = vdupq_n_u8(64);
  uint8x16_t y = vqtbl4q_u8(t[0], x);
  x = vsubq_u8(x, v64);
  y = vqtbx4q_u8(y, t[1], x);
  x = vsubq_u8(x, v64);
  y = vqtbx4q_u8(y, t[2], x);
  x = vsubq_u8(x, v64);
  return vqtbx4q_u8(y, t[3], x);
}

void ek_x8_lut_ukernel__neon_tbx64_u32(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table) {
  uint8x16x4_t t[4];
  for (int q = 0; q < 4; q++) t[q] = vld1q_u8_x4(table + 64 * q);
  for (; n >= 32; n -= 32, x += 32, y += 32) {
    const uint8x16_t a = vld1q_u8(x), b = vld1q_u8(x + 16);
    vst1q_u8(y, ek_lut16(a, t));
    vst1q_u8(y + 16, ek_lut16(b, t));
  }
  if (n >= 16) {
    vst1q_u8(y, ek_lut16(vld1q_u8(x), t));
    n -= 16, x += 16, y += 16;
  }
  if (n) { /* through a buffer: never read or write past the row */
    uint8_t buf[16] = {0};
    for (size_t i = 0; i < n; i++) buf[i] = x[i];
    vst1q_u8(buf, ek_lut16(vld1q_u8(buf), t));
    for (size_t i = 0; i < n; i++) y[i] = buf[i];
  }
}
#endif
