/* Matrix transposes for TRANSPOSE and the NHWC -> NCHW RESHAPE (kernels.h, x8-transpose).
 *
 * Bytes go through 16-byte vector registers, SSE2 on x86-64 and NEON on aarch64 / armv7 with
 * NEON: each architecture's baseline, so no dispatch. The perfect shuffle: with 2^m registers
 * of 16 bytes, interleaving register i with register i + 2^(m-1) (for every i < 2^(m-1)) moves
 * each byte from index [register | byte] (m + 4 bits) to that index rotated left by one bit.
 * So a 16 x 16 block (rows in registers) is transposed by 4 passes; a band of 2^m < 16 rows by
 * m passes (16 columns of 2^m bytes each come out, in order); a strip of 2^m < 16 columns of
 * 16 rows, loaded as 16 rows of 2^m bytes, by 4 passes (2^m output rows of 16 bytes). Other
 * ragged edges go one byte at a time; floats take 4 x 4 blocks. A permutation: the result is
 * the same on every path. */
#include <string.h>

#include "edgekit/kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
typedef __m128i ek_v16;
static inline ek_v16 v_load(const void* p) { return _mm_loadu_si128((const __m128i*)p); }
static inline void v_store(void* p, ek_v16 v) { _mm_storeu_si128((__m128i*)p, v); }
static inline void v_zip(ek_v16 a, ek_v16 b, ek_v16* lo, ek_v16* hi) {
  *lo = _mm_unpacklo_epi8(a, b);
  *hi = _mm_unpackhi_epi8(a, b);
}
#define EK_T_VEC 1
#elif defined(__ARM_NEON)
#include <arm_neon.h>
typedef int8x16_t ek_v16;
static inline ek_v16 v_load(const void* p) { return vld1q_s8((const int8_t*)p); }
static inline void v_store(void* p, ek_v16 v) { vst1q_s8((int8_t*)p, v); }
static inline void v_zip(ek_v16 a, ek_v16 b, ek_v16* lo, ek_v16* hi) {
  const int8x16x2_t z = vzipq_s8(a, b);
  *lo = z.val[0];
  *hi = z.val[1];
}
#define EK_T_VEC 1
#else
#define EK_T_VEC 0
#endif

#if EK_T_VEC
/* `passes` perfect-shuffle passes over the n (a power of two, <= 16) registers of x */
static inline __attribute__((always_inline)) void shuffle(ek_v16* x, int n, int passes) {
  ek_v16 t[16];
  for (int pass = 0; pass < passes; pass++) {
    for (int i = 0; i < n / 2; i++) v_zip(x[i], x[i + n / 2], &t[2 * i], &t[2 * i + 1]);
    for (int i = 0; i < n; i++) x[i] = t[i];
  }
}

static void block16(const int8_t* src, size_t ss, int8_t* dst, size_t ds) {
  ek_v16 x[16];
  for (int i = 0; i < 16; i++) x[i] = v_load(src + (size_t)i * ss);
  shuffle(x, 16, 4);
  for (int i = 0; i < 16; i++) v_store(dst + (size_t)i * ds, x[i]);
}

/* h (2, 4 or 8) rows x 16 columns: column c's h bytes land at dst + c * ds */
static inline __attribute__((always_inline)) void band(int h, const int8_t* src, size_t ss, int8_t* dst, size_t ds) {
  ek_v16 x[8];
  for (int i = 0; i < h; i++) x[i] = v_load(src + (size_t)i * ss);
  shuffle(x, h, h == 8 ? 3 : h == 4 ? 2 : 1); /* log2(h) passes */
  if (ds == (size_t)h) { /* the columns are contiguous: 16 * h bytes */
    for (int i = 0; i < h; i++) v_store(dst + (size_t)i * 16, x[i]);
    return;
  }
  int8_t t[128];
  for (int i = 0; i < h; i++) v_store(t + i * 16, x[i]);
  for (int c = 0; c < 16; c++) memcpy(dst + (size_t)c * ds, t + c * h, (size_t)h);
}

/* 16 rows x w (2, 4 or 8) columns: output row c (16 bytes) at dst + c * ds */
static inline __attribute__((always_inline)) void strip(int w, const int8_t* src, size_t ss, int8_t* dst,
                                                        size_t ds) {
  int8_t t[128];
  for (int r = 0; r < 16; r++) memcpy(t + r * w, src + (size_t)r * ss, (size_t)w);
  ek_v16 x[8];
  for (int i = 0; i < w; i++) x[i] = v_load(t + i * 16);
  shuffle(x, w, 4);
  for (int i = 0; i < w; i++) v_store(dst + (size_t)i * ds, x[i]);
}
#endif

/* 3 rows of 16 bytes -> 16 columns of 3 contiguous bytes (an image's R, G and B planes -> its
 * pixels: the QUANTIZE of an NCHW RGB input) */
static void columns3(const int8_t* src, size_t ss, int8_t* dst) {
#if defined(__SSE2__)
  /* unpacks make 4 registers of 4 pixels as (r, g, b, 0) words; each then drops its zero bytes:
   * in each 64-bit half, (p0 | p1 << 24), then the high half's 6 bytes move down next to the
   * low half's 6, and the 12 bytes are stored (the next store overwrites the 4 past them) */
  const __m128i a = v_load(src), b = v_load(src + ss), c = v_load(src + 2 * ss), z = _mm_setzero_si128();
  const __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
  const __m128i c_lo = _mm_unpacklo_epi8(c, z), c_hi = _mm_unpackhi_epi8(c, z);
  const __m128i q[4] = {_mm_unpacklo_epi16(ab_lo, c_lo), _mm_unpackhi_epi16(ab_lo, c_lo),
                        _mm_unpacklo_epi16(ab_hi, c_hi), _mm_unpackhi_epi16(ab_hi, c_hi)};
  const __m128i m24 = _mm_set1_epi64x(0xFFFFFF), m48 = _mm_set1_epi64x(0xFFFFFF000000);
  const __m128i mid = _mm_set_epi64x(0xFFFFFFFF, (long long)0xFFFF000000000000ull); /* bytes 6..11 */
  __m128i v[4];
  for (int i = 0; i < 4; i++) {
    const __m128i t = _mm_or_si128(_mm_and_si128(q[i], m24), _mm_and_si128(_mm_srli_epi64(q[i], 8), m48));
    v[i] = _mm_or_si128(_mm_move_epi64(t), _mm_and_si128(_mm_srli_si128(t, 2), mid));
  }
  v_store(dst, v[0]);
  v_store(dst + 12, v[1]);
  v_store(dst + 24, v[2]);
  _mm_storel_epi64((__m128i*)(void*)(dst + 36), v[3]);
  const int32_t last = _mm_cvtsi128_si32(_mm_srli_si128(v[3], 8));
  memcpy(dst + 44, &last, 4);
#else
  int8x16x3_t v;
  v.val[0] = v_load(src);
  v.val[1] = v_load(src + ss);
  v.val[2] = v_load(src + 2 * ss);
  vst3q_s8(dst, v);
#endif
}

void ek_x8_transpose(size_t rows, size_t cols, const int8_t* src, size_t ss, int8_t* dst, size_t ds) {
  size_t r0 = 0;
#if EK_T_VEC
  if (rows == 3 && ds == 3) {
    size_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) columns3(src + c0, ss, dst + c0 * 3);
    for (size_t c = c0; c < cols; c++)
      for (size_t r = 0; r < 3; r++) dst[c * 3 + r] = src[r * ss + c];
    return;
  }
  for (; r0 + 16 <= rows; r0 += 16) { /* bands of 16 rows: 16 x 16 blocks, then strips */
    size_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) block16(src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
    for (int w = 8; w >= 2; w /= 2) {
      if (cols - c0 < (size_t)w) continue;
      if (w == 8) strip(8, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
      else if (w == 4) strip(4, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
      else strip(2, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
      c0 += (size_t)w;
    }
    for (size_t c = c0; c < cols; c++)
      for (size_t r = r0; r < r0 + 16; r++) dst[c * ds + r] = src[r * ss + c];
  }
  for (int h = 8; h >= 2; h /= 2) { /* fewer than 16 rows left: bands of 8, 4, 2 */
    if (rows - r0 < (size_t)h) continue;
    size_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) {
      if (h == 8) band(8, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds); /* constants after inlining */
      else if (h == 4) band(4, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
      else band(2, src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
    }
    for (size_t c = c0; c < cols; c++)
      for (size_t r = r0; r < r0 + (size_t)h; r++) dst[c * ds + r] = src[r * ss + c];
    r0 += (size_t)h;
  }
#endif
  for (size_t c = 0; c < cols; c++)
    for (size_t r = r0; r < rows; r++) dst[c * ds + r] = src[r * ss + c];
}

/* floats: 4 x 4 blocks, two passes of the same shuffle on 4-byte lanes */
#if defined(__SSE2__) || defined(__ARM_NEON)
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
static void block4_x32(const float* src, size_t ss, float* dst, size_t ds) {
  for (size_t c = 0; c < 4; c++)
    for (size_t r = 0; r < 4; r++) dst[c * ds + r] = src[r * ss + c];
}
#endif

void ek_x32_transpose(size_t rows, size_t cols, const float* src, size_t ss, float* dst, size_t ds) {
  size_t r0 = 0;
  for (; r0 + 4 <= rows; r0 += 4) {
    size_t c0 = 0;
    for (; c0 + 4 <= cols; c0 += 4) block4_x32(src + r0 * ss + c0, ss, dst + c0 * ds + r0, ds);
    for (size_t c = c0; c < cols; c++)
      for (size_t r = r0; r < r0 + 4; r++) dst[c * ds + r] = src[r * ss + c];
  }
  for (size_t c = 0; c < cols; c++)
    for (size_t r = r0; r < rows; r++) dst[c * ds + r] = src[r * ss + c];
}
