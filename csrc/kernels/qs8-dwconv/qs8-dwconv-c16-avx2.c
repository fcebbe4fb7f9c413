/* qs8-dwconv, 16 channels per step, AVX2: two taps at a time with VPMADDWD on int16 pairs
 * (x_t, x_t+1) x (w_t, w_t+1), exact in int32. Packed in the "pair" layout (qs8-dwconv-pack.c):
 * VPUNPCKLWD/HWD leave channels in lane order, VPACKSSDW restores it. Channel blocks outside,
 * pixels inside: the requantization constants are set up once per block per call. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX2
#include <immintrin.h>
#include <string.h>

#include "../common/requant-avx2.h"
#include "../common/tail-avx2.h"

/* inline partial loads: a memcpy of nc bytes would be a library call per tap (9 per pixel) */
static inline __m256i ek_load16(const int8_t* p, size_t nc) {
  if (nc == 16) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)p));
  return _mm256_cvtepi8_epi16(ek_avx2_load_tail16(p, nc));
}

static inline void ek_store16(int8_t* p, __m128i y, size_t nc) {
  if (nc == 16) {
    _mm_storeu_si128((__m128i*)p, y);
    return;
  }
  ek_avx2_store_tail16(p, y, nc);
}

/* natural-order int32 x 16 -> the lo / hi accumulator orders (lane L: channels 8L+0..3 / 8L+4..7) */
static inline void ek_split_order(const int32_t* v, __m256i* lo, __m256i* hi) {
  const __m256i a = _mm256_loadu_si256((const __m256i*)v), b = _mm256_loadu_si256((const __m256i*)(v + 8));
  *lo = _mm256_permute2x128_si256(a, b, 0x20); /* a.lane0 (ch 0-3) | b.lane0 (ch 8-11) */
  *hi = _mm256_permute2x128_si256(a, b, 0x31); /* a.lane1 (ch 4-7) | b.lane1 (ch 12-15) */
}

static inline int64_t ek_load8(const int8_t* p, size_t nc) {
  if (nc == 8) {
    int64_t v;
    __builtin_memcpy(&v, p, 8);
    return v;
  }
  return ek_load_tail64(p, nc);
}

/* the multipliers and shifts of channels c0 .. c0 + nc (nc <= 16), zero past them */
static inline void ek_block_consts(const struct ek_requant_params* rq, size_t c0, size_t nc, int32_t mult[16],
                                   int32_t shift[16]) {
  memset(mult, 0, 16 * sizeof(int32_t));
  memset(shift, 0, 16 * sizeof(int32_t));
  memcpy(mult, rq->multiplier + c0, nc * sizeof(int32_t));
  memcpy(shift, rq->shift + c0, nc * sizeof(int32_t));
}

/* A block of nc <= 8 channels from c0 (all channels of a slim network's first layers, or the
 * last block of 24, 40, 88): half a 16-channel block would idle, so two output pixels share the
 * registers, pixel p in the low 128-bit lane and p + 1 in the high one; the block's channels
 * 0-3 / 4-7 weights and constants are repeated in both lanes. Constants after inlining: `full`
 * (nc == 8: clang does not take the partial-load test out of the tap loop by itself), `high`
 * (both halves take the high33 requantization path) and, for a 3x3, the kernel size (the tap
 * loop unrolls whole). */
static inline __attribute__((always_inline)) void ek_c8x2_pixels(size_t nc, size_t c0, size_t output_width,
                                                                 size_t kernel_size, const int8_t* const* input,
                                                                 size_t input_step, const uint8_t* w, int8_t* output,
                                                                 size_t output_stride, const struct ek_rq_avx2* r_lo,
                                                                 const struct ek_rq_avx2* r_hi, __m256i vzp,
                                                                 __m128i vqmin, __m128i vqmax, const int full,
                                                                 const int high) {
  const __m256i bias_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)w));
  const __m256i bias_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(w + 32)));
  for (size_t p = 0; p < output_width; p += 2) {
    const int two = p + 1 < output_width;
    const int8_t* const* in0 = input + p * input_step;
    const int8_t* const* in1 = two ? in0 + input_step : in0;
    __m256i acc_lo = bias_lo, acc_hi = bias_hi;
    const uint8_t* wt = w + 64;
    for (size_t t = 0; t < kernel_size; t += 2, wt += 64) {
      const __m256i x0 = _mm256_cvtepi8_epi16(_mm_set_epi64x(ek_load8(in1[t] + c0, full ? 8 : nc), ek_load8(in0[t] + c0, full ? 8 : nc)));
      __m256i x1 = _mm256_setzero_si256(); /* the odd last tap pairs with zeros */
      if (t + 1 < kernel_size)
        x1 = _mm256_cvtepi8_epi16(_mm_set_epi64x(ek_load8(in1[t + 1] + c0, full ? 8 : nc), ek_load8(in0[t + 1] + c0, full ? 8 : nc)));
      const __m256i w_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)wt));
      const __m256i w_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(wt + 32)));
      acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, x1), w_lo));
      acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, x1), w_hi));
    }
    const __m256i y_lo = ek_avx2_requant32(acc_lo, r_lo, high), y_hi = ek_avx2_requant32(acc_hi, r_hi, high);
    const __m256i v = _mm256_adds_epi16(_mm256_packs_epi32(y_lo, y_hi), vzp); /* lane L: pixel p + L, ch 0-7 */
    __m128i y = _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    y = _mm_min_epi8(_mm_max_epi8(y, vqmin), vqmax);
    int8_t* out = output + p * output_stride + c0;
    ek_store_tail64(out, (uint64_t)_mm_cvtsi128_si64(y), full ? 8 : nc);
    if (two) ek_store_tail64(out + output_stride, (uint64_t)_mm_extract_epi64(y, 1), full ? 8 : nc);
  }
}

static void ek_dwconv_c8x2(size_t nc, size_t c0, size_t output_width, size_t kernel_size, const int8_t* const* input,
                           size_t input_step, const uint8_t* w, int8_t* output, size_t output_stride,
                           const struct ek_requant_params* rq) {
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);
  int32_t mult[16], shift[16];
  ek_block_consts(rq, c0, nc, mult, shift);
  const struct ek_rq_avx2 r_lo = ek_rq_avx2_init(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)mult)),
                                                 _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)shift)));
  const struct ek_rq_avx2 r_hi =
      ek_rq_avx2_init(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(mult + 4))),
                      _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(shift + 4))));
  if (nc == 8 && kernel_size == 9 && r_lo.high33 && r_hi.high33)
    ek_c8x2_pixels(8, c0, output_width, 9, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp, vqmin, vqmax,
                   1, 1);
  else if (nc == 8)
    ek_c8x2_pixels(8, c0, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                   vqmin, vqmax, 1, 0);
  else
    ek_c8x2_pixels(nc, c0, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                   vqmin, vqmax, 0, 0);
}

/* the output pixels of one 16-channel block (nc > 8 channels from c0); constants after
 * inlining: `full` (nc == 16), `high` (both halves take the high33 requantization path) and, for
 * 3x3 and 5x5, the kernel size (the tap loop unrolls whole) */
static inline __attribute__((always_inline)) void ek_dw_pixels(size_t c0, size_t nc, size_t output_width,
                                                               size_t kernel_size, const int8_t* const* input,
                                                               size_t input_step, const uint8_t* w, int8_t* output,
                                                               size_t output_stride, const struct ek_rq_avx2* r_lo,
                                                               const struct ek_rq_avx2* r_hi, __m256i vzp,
                                                               __m128i vqmin, __m128i vqmax, const int full,
                                                               const int high) {
  const __m256i bias_lo = _mm256_loadu_si256((const __m256i*)w);
  const __m256i bias_hi = _mm256_loadu_si256((const __m256i*)(w + 32));
  for (size_t p = 0; p < output_width; p++) {
    const int8_t* const* in = input + p * input_step;
    __m256i acc_lo = bias_lo, acc_hi = bias_hi;
    const uint8_t* wt = w + 64;
    size_t t = 0;
    for (; t + 1 < kernel_size; t += 2) {
      const __m256i x0 = ek_load16(in[t] + c0, full ? 16 : nc), x1 = ek_load16(in[t + 1] + c0, full ? 16 : nc);
      acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, x1),
                                                          _mm256_loadu_si256((const __m256i*)wt)));
      acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, x1),
                                                          _mm256_loadu_si256((const __m256i*)(wt + 32))));
      wt += 64;
    }
    if (t < kernel_size) { /* the odd last tap pairs with zeros */
      const __m256i x0 = ek_load16(in[t] + c0, full ? 16 : nc), x1 = _mm256_setzero_si256();
      acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, x1),
                                                          _mm256_loadu_si256((const __m256i*)wt)));
      acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, x1),
                                                          _mm256_loadu_si256((const __m256i*)(wt + 32))));
    }
    const __m256i y_lo = ek_avx2_requant32(acc_lo, r_lo, high), y_hi = ek_avx2_requant32(acc_hi, r_hi, high);
    /* per lane: lo (ch 8L+0..3), hi (ch 8L+4..7) -> natural order */
    __m256i v = _mm256_adds_epi16(_mm256_packs_epi32(y_lo, y_hi), vzp);
    __m128i y = _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    y = _mm_min_epi8(_mm_max_epi8(y, vqmin), vqmax);
    ek_store16(output + p * output_stride + c0, y, full ? 16 : nc);
  }
}

void ek_qs8_dwconv_ukernel_c16__avx2(size_t channels, size_t output_width, size_t kernel_size,
                                     const int8_t* const* input, size_t input_step, const void* packed_w,
                                     int8_t* output, size_t output_stride,
                                     const struct ek_requant_params* rq) {
  const __m256i vzp = _mm256_set1_epi16((int16_t)rq->zp_out);
  const __m128i vqmin = _mm_set1_epi8((int8_t)rq->qmin), vqmax = _mm_set1_epi8((int8_t)rq->qmax);
  const size_t pairs = (kernel_size + 1) / 2;
  const size_t block_bytes = 16 * sizeof(int32_t) + pairs * 64;
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t c0 = 0; c0 < channels; c0 += 16, w += block_bytes) {
    const size_t nc = channels - c0 < 16 ? channels - c0 : 16;
    if (nc <= 8) {
      ek_dwconv_c8x2(nc, c0, output_width, kernel_size, input, input_step, w, output, output_stride, rq);
      break;
    }
    int32_t mult[16], shift[16];
    ek_block_consts(rq, c0, nc, mult, shift);
    __m256i m_lo, m_hi, s_lo, s_hi;
    ek_split_order(mult, &m_lo, &m_hi);
    ek_split_order(shift, &s_lo, &s_hi);
    const struct ek_rq_avx2 r_lo = ek_rq_avx2_init(m_lo, s_lo), r_hi = ek_rq_avx2_init(m_hi, s_hi);
    if (nc == 16 && r_lo.high33 && r_hi.high33) { /* the common case, its tests out of the loops */
      if (kernel_size == 9)
        ek_dw_pixels(c0, 16, output_width, 9, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp, vqmin, vqmax,
                     1, 1);
      else if (kernel_size == 25)
        ek_dw_pixels(c0, 16, output_width, 25, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp, vqmin,
                     vqmax, 1, 1);
      else
        ek_dw_pixels(c0, 16, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                     vqmin, vqmax, 1, 1);
    } else if (nc == 16) { /* the partial-load tests out of the tap loop, whatever the compiler */
      ek_dw_pixels(c0, 16, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                   vqmin, vqmax, 1, 0);
    } else {
      ek_dw_pixels(c0, nc, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                   vqmin, vqmax, 0, 0);
    }
  }
}
#endif
