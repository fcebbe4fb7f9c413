/* What the AVX2 4x16 GEMM kernels share (4x16c2: any weights; 4x16c4 w7: 7-bit weights): the
 * column-block loop with its per-channel constants, and the requantization and stores of a 4-row
 * tile whose accumulators hold columns in natural order (columns 0-7, 8-15). A kernel supplies
 * its k loop as `rows` (all rows of one block). Private to the kernels; include only from -mavx2
 * files. */
#ifndef EK_KERNELS_GEMM_4X16_AVX2_H
#define EK_KERNELS_GEMM_4X16_AVX2_H

#include <immintrin.h>

#include "requant-avx2.h"
#include "tail-avx2.h"

static inline void ek_avx2_store16(int8_t* dst, __m128i v, size_t nj) {
  if (nj == 16) {
    _mm_storeu_si128((__m128i*)dst, v);
    return;
  }
  ek_avx2_store_tail16(dst, v, nj);
}

/* the first nj <= 8 columns of a row */
static inline __attribute__((always_inline)) void ek_avx2_store_row8(int8_t* dst, __m256i acc, const struct ek_rq_avx2* r0,
                                                                     __m128i vzp, __m128i vqmin, __m128i vqmax, size_t nj,
                                                                     const int high) {
  const __m128i v = ek_avx2_narrow8(ek_avx2_requant32(acc, r0, high), vzp, vqmin, vqmax);
  if (nj == 8)
    _mm_storel_epi64((__m128i*)dst, v);
  else
    ek_store_tail64(dst, (uint64_t)_mm_cvtsi128_si64(v), nj);
}

/* rows c0..c3 (aliases past m: same values to the same place) of a tile; `two`: 16 columns;
 * `high`: r0 and r1 take the high33 requantization path (checked once per column block) */
static inline __attribute__((always_inline)) void ek_avx2_4x16_store(
    int8_t* c0, int8_t* c1, int8_t* c2, int8_t* c3, __m256i acc00, __m256i acc01, __m256i acc10, __m256i acc11,
    __m256i acc20, __m256i acc21, __m256i acc30, __m256i acc31, const struct ek_rq_avx2* r0, const struct ek_rq_avx2* r1,
    __m256i vzp, __m128i vqmin, __m128i vqmax, size_t nj, const int two, const int high) {
  if (two) { /* two rows per byte pack and clamp */
    const __m256i vqmin256 = _mm256_broadcastsi128_si256(vqmin), vqmax256 = _mm256_broadcastsi128_si256(vqmax);
    const __m256i v32 = ek_avx2_narrow16x2(ek_avx2_requant32(acc30, r0, high), ek_avx2_requant32(acc31, r1, high),
                                           ek_avx2_requant32(acc20, r0, high), ek_avx2_requant32(acc21, r1, high),
                                           vzp, vqmin256, vqmax256);
    ek_avx2_store16(c3, _mm256_castsi256_si128(v32), nj);
    ek_avx2_store16(c2, _mm256_extracti128_si256(v32, 1), nj);
    const __m256i v10 = ek_avx2_narrow16x2(ek_avx2_requant32(acc10, r0, high), ek_avx2_requant32(acc11, r1, high),
                                           ek_avx2_requant32(acc00, r0, high), ek_avx2_requant32(acc01, r1, high),
                                           vzp, vqmin256, vqmax256);
    ek_avx2_store16(c1, _mm256_castsi256_si128(v10), nj);
    ek_avx2_store16(c0, _mm256_extracti128_si256(v10, 1), nj);
  } else {
    const __m128i vzp8 = _mm256_castsi256_si128(vzp);
    ek_avx2_store_row8(c3, acc30, r0, vzp8, vqmin, vqmax, nj, high);
    ek_avx2_store_row8(c2, acc20, r0, vzp8, vqmin, vqmax, nj, high);
    ek_avx2_store_row8(c1, acc10, r0, vzp8, vqmin, vqmax, nj, high);
    ek_avx2_store_row8(c0, acc00, r0, vzp8, vqmin, vqmax, nj, high);
  }
}

/* all rows of one column block: w0 its packed k groups, bias0/bias1 its columns' bias' */
typedef void (*ek_avx2_4x16_rows_fn)(size_t m, size_t k, const int8_t* a, size_t a_stride, const int8_t* w0, __m256i bias0,
                                     __m256i bias1, int8_t* c, size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,
                                     const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin, __m128i vqmax);

/* One row function: the kernel's always-inline `rows(..., two, high)` with both fixed */
#define EK_AVX2_4X16_ROWS_FN(rows, name, two, high)                                                                 \
  static void name(size_t m, size_t k, const int8_t* a, size_t a_stride, const int8_t* w0, __m256i bias0,              \
                   __m256i bias1, int8_t* c, size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,                    \
                   const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin, __m128i vqmax) {                             \
    rows(m, k, a, a_stride, w0, bias0, bias1, c, c_stride, nj, r0, r1, vzp, vqmin, vqmax, two, high);                    \
  }

/* A kernel's four row functions (16 or 1..8 columns, each with the requantization path known or
 * tested per vector) and their table, indexed 2 * high + full. */
#define EK_AVX2_4X16_ROWS_FNS(rows)                                    \
  EK_AVX2_4X16_ROWS_FN(rows, rows##_half, 0, 0)                        \
  EK_AVX2_4X16_ROWS_FN(rows, rows##_full, 1, 0)                        \
  EK_AVX2_4X16_ROWS_FN(rows, rows##_half_high, 0, 1)                   \
  EK_AVX2_4X16_ROWS_FN(rows, rows##_full_high, 1, 1)                   \
  static const ek_avx2_4x16_rows_fn rows##_fns[4] = {rows##_half, rows##_full, rows##_half_high, rows##_full_high};

/* the column blocks of 16 (kr: the packing's k group): constants once per block; a block of
 * 1..8 columns runs the half functions (the first 8 columns only), others the full ones;
 * fns: EK_AVX2_4X16_ROWS_FNS's table */
static inline __attribute__((always_inline)) void ek_avx2_4x16_gemm(size_t m, size_t n, size_t k, size_t kr, const int8_t* a,
                                                                    size_t a_stride, const void* packed_w, int8_t* c,
                                                                    size_t c_stride, const struct ek_requant_params* rq,
                                                                    const ek_avx2_4x16_rows_fn* fns) {
  const size_t k_pad = (k + kr - 1) / kr * kr;
  const size_t block_bytes = 16 * sizeof(int32_t) + k_pad * 16;
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const uint8_t* wb = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 16, wb += block_bytes) {
    const size_t nj = n - j0 < 16 ? n - j0 : 16;
    /* per-channel constants of this block; lanes past n are never read */
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nj), lanes);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)nj - 8), lanes);
    const struct ek_rq_avx2 r0 = ek_rq_avx2_init(_mm256_maskload_epi32((const int*)(rq->multiplier + j0), mask0),
                                                 _mm256_maskload_epi32((const int*)(rq->shift + j0), mask0));
    const struct ek_rq_avx2 r1 = ek_rq_avx2_init(_mm256_maskload_epi32((const int*)(rq->multiplier + j0 + 8), mask1),
                                                 _mm256_maskload_epi32((const int*)(rq->shift + j0 + 8), mask1));
    const __m256i bias0 = _mm256_loadu_si256((const __m256i*)wb);
    const __m256i bias1 = _mm256_loadu_si256((const __m256i*)(wb + 32));
    const int8_t* w0 = (const int8_t*)(wb + 64);
    const int full = nj > 8, high = r0.high33 && (!full || r1.high33);
    fns[2 * high + full](m, k, a, a_stride, w0, bias0, bias1, c + j0, c_stride, nj, &r0, &r1, vzp, vqmin, vqmax);
  }
}

#endif /* EK_KERNELS_GEMM_4X16_AVX2_H */
