/* Matrix transposes for TRANSPOSE and the NHWC -> NCHW RESHAPE (kernels.h, x8-transpose).
 *
 * Blocks of 16 x 16 bytes (4 x 4 floats) go through vector registers: SSE2 on x86-64 and NEON
 * on aarch64 / armv7 with NEON are each architecture's baseline, so no dispatch. A block is
 * transposed by the perfect shuffle: interleaving row i with row i + h/2 (h rows of a block),
 * for every i, rotates each element's index bits [row | col] left by one; log2(h) passes swap
 * the row and column bits. 16 bytes: 4 passes of 16 unpacks; 4 floats: 2 passes of 4. The
 * ragged edges go one element at a time. A permutation: the result is the same on every path. */
#include "edgekit/kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#if defined(__SSE2__) || defined(__ARM_NEON)
static void block16_x8(const int8_t* src, size_t ss, int8_t* dst, size_t ds) {
#if defined(__SSE2__)
  __m128i a[16], b[16];
  for (int i = 0; i < 16; i++) a[i] = _mm_loadu_si128((const __m128i*)(src + (size_t)i * ss));
  for (int pass = 0; pass < 4; pass++) {
    __m128i* x = pass & 1 ? b : a;
    __m128i* y = pass & 1 ? a : b;
    for (int i = 0; i < 8; i++) {
      y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
      y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
    }
  }
  for (int i = 0; i < 16; i++) _mm_storeu_si128((__m128i*)(dst + (size_t)i * ds), a[i]);
#else
  int8x16_t a[16], b[16];
  for (int i = 0; i < 16; i++) a[i] = vld1q_s8(src + (size_t)i * ss);
  for (int pass = 0; pass < 4; pass++) {
    int8x16_t* x = pass & 1 ? b : a;
    int8x16_t* y = pass & 1 ? a : b;
    for (int i = 0; i < 8; i++) {
      int8x16x2_t z = vzipq_s8(x[i], x[i + 8]);
      y[2 * i] = z.val[0];
      y[2 * i + 1] = z.val[1];
    }
  }
  for (int i = 0; i < 16; i++) vst1q_s8(dst + (size_t)i * ds, a[i]);
#endif
}

static void block4_x32(const float* src, size_t ss, float* dst, size_t ds) {
#if defined(__SSE2__)
  __m128 a[4], b[4];
  for (int i = 0; i < 4; i++) a[i] = _mm_loadu_ps(src + (size_t)i * ss);
  for (int i = 0; i < 2; i++) {
    b[2 * i] = _mm_unpacklo_ps(a[i], a[i + 2]);
    b[2 * i + 1] = _mm_unpackhi_ps(a[i], a[i + 2]);
  }
  for (int i = 0; i < 2; i++) {
    a[2 * i] = _mm_unpacklo_ps(b[i], b[i + 2]);
    a[2 * i + 1] = _mm_unpackhi_ps(b[i], b[i + 2]);
  }
  for (int i = 0; i < 4; i++) _mm_storeu_ps(dst + (size_t)i * ds, a[i]);
#else
  float32x4_t a[4], b[4];
  for (int i = 0; i < 4; i++) a[i] = vld1q_f32(src + (size_t)i * ss);
  for (int i = 0; i < 2; i++) {
    float32x4x2_t z = vzipq_f32(a[i], a[i + 2]);
    b[2 * i] = z.val[0];
    b[2 * i + 1] = z.val[1];
  }
  for (int i = 0; i < 2; i++) {
    float32x4x2_t z = vzipq_f32(b[i], b[i + 2]);
    a[2 * i] = z.val[0];
    a[2 * i + 1] = z.val[1];
  }
  for (int i = 0; i < 4; i++) vst1q_f32(dst + (size_t)i * ds, a[i]);
#endif
}
#else
static void block16_x8(const int8_t* src, size_t ss, int8_t* dst, size_t ds) {
  for (size_t c = 0; c < 16; c++)
    for (size_t r = 0; r < 16; r++) dst[c * ds + r] = src[r * ss + c];
}
static void block4_x32(const float* src, size_t ss, float* dst, size_t ds) {
  for (size_t c = 0; c < 4; c++)
    for (size_t r = 0; r < 4; r++) dst[c * ds + r] = src[r * ss + c];
}
#endif

/* One element type's driver: whole B x B blocks through the vector block, the rest one by one.
 * Blocks go along a band of B source rows, so the band's rows stay in cache while it is read. */
#define EK_TRANSPOSE_FN(name, T, B, block)                                                   \
  void name(size_t rows, size_t cols, const T* src, size_t ss, T* dst, size_t ds) {          \
    size_t r0 = 0;                                                                           \
    for (; r0 + B <= rows; r0 += B) {                                                         \
      size_t c0 = 0;                                                                         \
      for (; c0 + B <= cols; c0 += B) block(src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds); \
      for (size_t c = c0; c < cols; c++)                                                     \
        for (size_t r = r0; r < r0 + B; r++) dst[c * ds + r] = src[r * ss + c];              \
    }                                                                                        \
    for (size_t c = 0; c < cols; c++)                                                        \
      for (size_t r = r0; r < rows; r++) dst[c * ds + r] = src[r * ss + c];                  \
  }

EK_TRANSPOSE_FN(ek_x8_transpose, int8_t, 16, block16_x8)
EK_TRANSPOSE_FN(ek_x32_transpose, float, 4, block4_x32)
#undef EK_TRANSPOSE_FN
