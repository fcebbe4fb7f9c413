/* numpy's legacy RandomState(seed).standard_normal: MT19937 + the polar Box-Muller (the
 * runner's inputs without --inputs are the very values the Python agent feeds). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>

#include "runner.h"

void mt_seed(struct mt* m, uint32_t seed) {
  m->s[0] = seed;
  for (int i = 1; i < 624; i++) m->s[i] = 1812433253u * (m->s[i - 1] ^ (m->s[i - 1] >> 30)) + (uint32_t)i;
  m->i = 624;
  m->has_gauss = 0;
}

static uint32_t mt_next(struct mt* m) {
  if (m->i >= 624) {
    for (int k = 0; k < 624; k++) {
      uint32_t y = (m->s[k] & 0x80000000u) | (m->s[(k + 1) % 624] & 0x7fffffffu);
      m->s[k] = m->s[(k + 397) % 624] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
    }
    m->i = 0;
  }
  uint32_t y = m->s[m->i++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

static double mt_double(struct mt* m) {
  uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

double mt_gauss(struct mt* m) {
  if (m->has_gauss) {
    m->has_gauss = 0;
    return m->gauss;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * mt_double(m) - 1.0;
    x2 = 2.0 * mt_double(m) - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  double f = sqrt(-2.0 * log(r2) / r2);
  m->gauss = f * x1;
  m->has_gauss = 1;
  return f * x2;
}

