/* qs8-gemm, 4 rows x 16 columns, weights packed in k-quads (kr = 4), AVX2, for weights in
 * [-64, 64] only (EK_ISA_W7: 7-bit weights, what x86 runtimes quantize to on CPUs without VNNI).
 *
 * VPMADDUBSW multiplies unsigned by signed bytes and adds each pair into a *saturating* int16.
 * The caller passes activations as x ^ 0x80 = x + 128 in [0, 255] (kernels.h, a_offset 128; the
 * packed bias carries -128 * sum(w), as for VPDPBUSD); with |w| <= 64 a pair is at most
 * 2 * 255 * 64 = 32640 < 32767 in magnitude, so nothing saturates and the kernel is exact.
 * VPMADDWD by ones then adds the two pairs of a column's k-quad into its int32. Per k-quad and
 * 4x16 tile: 4 broadcasts, 8 VPMADDUBSW, 8 VPMADDWD, 8 VPADDD for 256 multiply-adds, against the
 * 16-bit kernel's (4x16c2) ~5 per instruction; the k loop takes two quads per turn. The packing
 * is the VNNI kernels' c4 one (a column's 4 bytes of a k-quad side by side), so the accumulators
 * hold columns in natural order, as in 4x16c2, and share its requantization. The runtime takes
 * this kernel only for an op whose packed weights all lie in [-64, 64] (checked at load);
 * weights outside would saturate silently, so the precondition is part of the kernel's ISA
 * word, not a hope. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>

#include "../common/gemm-4x16-avx2.h"

/* rows past m repeat the last row, as in every gemm kernel */
#define EK_QUAD(xa, acc0, acc1)                                                              \
  do {                                                                                       \
    const __m256i x = (xa);                                                                  \
    acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w0), vones));     \
    if (two) acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w1), vones)); \
  } while (0)

/* one k-quad of the 4 rows at byte kk, weights at w */
#define EK_QUAD4(kk, w)                                                       \
  do {                                                                        \
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(w));               \
    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)((w) + 32)) : w0; \
    EK_QUAD(ek_bcast4(a0 + (kk)), acc00, acc01);                              \
    EK_QUAD(ek_bcast4(a1 + (kk)), acc10, acc11);                              \
    EK_QUAD(ek_bcast4(a2 + (kk)), acc20, acc21);                              \
    EK_QUAD(ek_bcast4(a3 + (kk)), acc30, acc31);                              \
  } while (0)

/* The k loop of a full tile (16 columns) in GNU assembly: 8 accumulators, the ones vector and 4
 * temporaries stay in 13 of the 16 ymm registers, where GCC's register allocation of the same
 * intrinsics kept 4 accumulators on the stack (a store per accumulator per turn: 68 instead of
 * 64 instructions per two k-quads). One row of one k-quad at byte offset OFF: */
#define EK_W7_ROW(OFF, A, C0, C1)                      \
  "vpbroadcastd " #OFF "(%[" #A "],%[kk]), %[b]\n\t"   \
  "vpmaddubsw %[w0], %[b], %[t]\n\t"                   \
  "vpmaddwd %[ones], %[t], %[t]\n\t"                   \
  "vpaddd %[t], %[" #C0 "], %[" #C0 "]\n\t"            \
  "vpmaddubsw %[w1], %[b], %[b]\n\t"                   \
  "vpmaddwd %[ones], %[b], %[b]\n\t"                   \
  "vpaddd %[b], %[" #C1 "], %[" #C1 "]\n\t"
/* one k-quad of the 4 rows: weights at WOFF bytes from w, activations at OFF from a_r + kk */
#define EK_W7_QUAD(OFF, WOFF)                          \
  "vmovdqu " #WOFF "(%[w]), %[w0]\n\t"                 \
  "vmovdqu " #WOFF "+32(%[w]), %[w1]\n\t"              \
  EK_W7_ROW(OFF, a0, c00, c01) EK_W7_ROW(OFF, a1, c10, c11) \
  EK_W7_ROW(OFF, a2, c20, c21) EK_W7_ROW(OFF, a3, c30, c31)
#define EK_W7_OPERANDS                                                                                       \
  : [c00] "+x"(acc00), [c01] "+x"(acc01), [c10] "+x"(acc10), [c11] "+x"(acc11), [c20] "+x"(acc20),          \
    [c21] "+x"(acc21), [c30] "+x"(acc30), [c31] "+x"(acc31), [w] "+r"(w), [kk] "+r"(kk), [w0] "=&x"(t0),     \
    [w1] "=&x"(t1), [b] "=&x"(t2), [t] "=&x"(t3)                                                              \
  : [a0] "r"(a0), [a1] "r"(a1), [a2] "r"(a2), [a3] "r"(a3), [end] "r"(k_two), [ones] "x"(vones)             \
  : "cc", "memory"

static inline __m256i ek_bcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* one 4-row tile of a column block: rows a0..a3 into c0..c3 */
static inline __attribute__((always_inline)) void ek_tile(size_t k, const int8_t* a0, const int8_t* a1, const int8_t* a2,
                                                          const int8_t* a3, const int8_t* wq, __m256i bias0, __m256i bias1,
                                                          int8_t* c0, int8_t* c1, int8_t* c2, int8_t* c3, size_t nj,
                                                          const struct ek_rq_avx2* r0, const struct ek_rq_avx2* r1,
                                                          __m256i vzp, __m128i vqmin, __m128i vqmax, const int two,
                                                          const int high) {
  const size_t k_main = k & ~(size_t)3, k_two = k & ~(size_t)7;
  const __m256i vones = _mm256_set1_epi16(1);
  __m256i acc00 = bias0, acc01 = bias1, acc10 = bias0, acc11 = bias1;
  __m256i acc20 = bias0, acc21 = bias1, acc30 = bias0, acc31 = bias1;
  const int8_t* w = wq;
  size_t kk = 0;
#if defined(__GNUC__) && defined(__x86_64__)
  if (two) {
    __m256i t0, t1, t2, t3;
    if (k_two) /* two k-quads a turn; kk, w advance */
      __asm__("1:\n\t" EK_W7_QUAD(0, 0) EK_W7_QUAD(4, 64)
              "add $8, %[kk]\n\t"
              "sub $-128, %[w]\n\t"
              "cmp %[end], %[kk]\n\t"
              "jb 1b\n\t" EK_W7_OPERANDS);
    if (kk < k_main) {
      __asm__(EK_W7_QUAD(0, 0) EK_W7_OPERANDS);
      kk += 4;
      w += 64;
    }
  } else
#endif
  {
    for (; kk < k_two; kk += 8, w += 128) {
      EK_QUAD4(kk, w);
      EK_QUAD4(kk + 4, w + 64);
    }
    if (kk < k_main) {
      EK_QUAD4(kk, w);
      kk += 4;
      w += 64;
    }
  }
  if (kk < k) { /* 1..3 left: the zero bytes past k meet the packing's zero weights */
    const size_t len = k - kk;
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)w);
    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)(w + 32)) : w0;
    EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a0 + kk, len)), acc00, acc01);
    EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a1 + kk, len)), acc10, acc11);
    EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a2 + kk, len)), acc20, acc21);
    EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a3 + kk, len)), acc30, acc31);
  }
  ek_avx2_4x16_store(c0, c1, c2, c3, acc00, acc01, acc10, acc11, acc20, acc21, acc30, acc31, r0, r1, vzp, vqmin, vqmax, nj,
                     two, high);
}

/* one row of a column block (m = 1: a fully connected layer at batch 1; the last row of a tall
 * GEMM), a quarter of the 4-row tile's multiplies */
static inline __attribute__((always_inline)) void ek_tile1(size_t k, const int8_t* a0, const int8_t* wq, __m256i bias0,
                                                           __m256i bias1, int8_t* c0, size_t nj, const struct ek_rq_avx2* r0,
                                                           const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin,
                                                           __m128i vqmax, const int two, const int high) {
  const size_t k_main = k & ~(size_t)3;
  const __m256i vones = _mm256_set1_epi16(1);
  __m256i acc00 = bias0, acc01 = bias1;
  const int8_t* w = wq;
  size_t kk = 0;
  for (; kk < k_main; kk += 4, w += 64) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)w);
    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)(w + 32)) : w0;
    EK_QUAD(ek_bcast4(a0 + kk), acc00, acc01);
  }
  if (kk < k) {
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)w);
    const __m256i w1 = two ? _mm256_loadu_si256((const __m256i*)(w + 32)) : w0;
    EK_QUAD(_mm256_set1_epi32(ek_load_tail32(a0 + kk, k - kk)), acc00, acc01);
  }
  if (two) {
    ek_avx2_store16(c0, ek_avx2_narrow16(ek_avx2_requant32(acc00, r0, high), ek_avx2_requant32(acc01, r1, high), vzp, vqmin, vqmax),
                    nj);
  } else {
    ek_avx2_store_row8(c0, acc00, r0, _mm256_castsi256_si128(vzp), vqmin, vqmax, nj, high);
  }
}

/* all rows of one column block: whole tiles with plain row pointers, then the last 1..3 rows (rows
 * past m repeat the last row, as in every gemm kernel: same values to the same place; a last
 * single row runs alone) */
static inline __attribute__((always_inline)) void ek_rows(size_t m, size_t k, const int8_t* a, size_t a_stride,
                                                          const int8_t* wq, __m256i bias0, __m256i bias1, int8_t* c,
                                                          size_t c_stride, size_t nj, const struct ek_rq_avx2* r0,
                                                          const struct ek_rq_avx2* r1, __m256i vzp, __m128i vqmin,
                                                          __m128i vqmax, const int two, const int high) {
  size_t i = 0;
  for (; i + 4 <= m; i += 4) {
    const int8_t* a0 = a + i * a_stride;
    int8_t* c0 = c + i * c_stride;
    ek_tile(k, a0, a0 + a_stride, a0 + 2 * a_stride, a0 + 3 * a_stride, wq, bias0, bias1, c0, c0 + c_stride,
            c0 + 2 * c_stride, c0 + 3 * c_stride, nj, r0, r1, vzp, vqmin, vqmax, two, high);
  }
  if (i + 1 == m) {
    ek_tile1(k, a + i * a_stride, wq, bias0, bias1, c + i * c_stride, nj, r0, r1, vzp, vqmin, vqmax, two, high);
  } else if (i < m) {
    const size_t rows = m - i;
    const int8_t* a0 = a + i * a_stride;
    const int8_t* a1 = rows > 1 ? a0 + a_stride : a0;
    const int8_t* a2 = rows > 2 ? a1 + a_stride : a1;
    int8_t* c0 = c + i * c_stride;
    int8_t* c1 = rows > 1 ? c0 + c_stride : c0;
    int8_t* c2 = rows > 2 ? c1 + c_stride : c1;
    ek_tile(k, a0, a1, a2, a2, wq, bias0, bias1, c0, c1, c2, c2, nj, r0, r1, vzp, vqmin, vqmax, two, high);
  }
}

EK_AVX2_4X16_ROWS_FNS(ek_rows)

void ek_qs8_gemm_ukernel_4x16c4__avx2_w7(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                        const void* packed_w, int8_t* c, size_t c_stride,
                                        const struct ek_requant_params* rq) {
  ek_avx2_4x16_gemm(m, n, k, 4, a, a_stride, packed_w, c, c_stride, rq, ek_rows_fns);
}
#endif
