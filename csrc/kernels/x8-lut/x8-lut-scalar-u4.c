/* The x8-lut reference: one table load per byte. */
#include "edgekit/kernels.h"

void ek_x8_lut_ukernel__scalar_u4(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint8_t a = table[x[i]], b = table[x[i + 1]], c = table[x[i + 2]], d = table[x[i + 3]];
    y[i] = a;
    y[i + 1] = b;
    y[i + 2] = c;
    y[i + 3] = d;
  }
  for (; i < n; i++) y[i] = table[x[i]];
}
