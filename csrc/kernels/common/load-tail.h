/* Loads of the last 1..7 bytes of a row without reading past it, zero-filled: inline byte
 * loads (a variable-length memcpy would be a library call per row). Private to the kernels. */
#ifndef EK_KERNELS_LOAD_TAIL_H
#define EK_KERNELS_LOAD_TAIL_H

#include <stddef.h>
#include <stdint.h>

/* len in [1, 4] */
static inline int32_t ek_load_tail32(const int8_t* p, size_t len) {
  uint32_t v = (uint8_t)p[0];
  if (len > 1) v |= (uint32_t)(uint8_t)p[1] << 8;
  if (len > 2) v |= (uint32_t)(uint8_t)p[2] << 16;
  if (len > 3) v |= (uint32_t)(uint8_t)p[3] << 24;
  return (int32_t)v;
}

/* len in [1, 8] */
static inline int64_t ek_load_tail64(const int8_t* p, size_t len) {
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) v |= (uint64_t)(uint8_t)p[i] << (8 * i);
  return (int64_t)v;
}

/* len in [1, 16]: bytes 0..len-1 of p, zero-filled to 16, as two 64-bit halves */
static inline void ek_load_tail128(const int8_t* p, size_t len, int64_t* lo, int64_t* hi) {
  if (len >= 8) {
    uint64_t v;
    __builtin_memcpy(&v, p, 8);
    *lo = (int64_t)v;
    *hi = len > 8 ? ek_load_tail64(p + 8, len - 8) : 0;
  } else {
    *lo = ek_load_tail64(p, len);
    *hi = 0;
  }
}

/* the low len bytes of v (little-endian) to p, len in [1, 8] */
static inline void ek_store_tail64(int8_t* p, uint64_t v, size_t len) {
  if (len == 8) {
    __builtin_memcpy(p, &v, 8);
    return;
  }
  for (size_t i = 0; i < len; i++) p[i] = (int8_t)(v >> (8 * i));
}

#endif /* EK_KERNELS_LOAD_TAIL_H */
