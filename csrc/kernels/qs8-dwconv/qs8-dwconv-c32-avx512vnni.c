/* qs8-dwconv, 32 channels per step, AVX-512 VNNI: two taps at a time with VPDPWSSD on int16
 * pairs (x_t, x_t+1) x (w_t, w_t+1), exact in int32. Packed in the "pair" layout
 * (qs8-dwconv-pack.c): VPUNPCKLWD/HWD leave channels in lane order, VPACKSSDW restores it.
 * Channel blocks outside, pixels inside. */
#include "edgekit/kernels.h"

#if EK_ENABLE_AVX512VNNI
#include <immintrin.h>
#include <string.h>

#include "../common/requant-avx512.h"

static inline __m512i ek_load32(const int8_t* p, __mmask32 m) {
  return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, p));
}

/* the output pixels of one block of 17..32 channels from c0; constants after inlining: `high`
 * (both halves take the high33 requantization) and, for 3x3 and 5x5, the kernel size (the tap
 * loop unrolls whole) */
static inline __attribute__((always_inline)) void ek_dw32_pixels(size_t c0, __mmask32 cm, size_t output_width,
                                                                 size_t kernel_size, const int8_t* const* input,
                                                                 size_t input_step, const uint8_t* w, int8_t* output,
                                                                 size_t output_stride, const struct ek_rq_avx512* r_lo,
                                                                 const struct ek_rq_avx512* r_hi, __m512i vzp,
                                                                 __m256i vqmin, __m256i vqmax, const int high) {
  const __m512i bias_lo = _mm512_loadu_si512(w), bias_hi = _mm512_loadu_si512(w + 64);
  for (size_t p = 0; p < output_width; p++) {
    const int8_t* const* in = input + p * input_step;
    __m512i acc_lo = bias_lo, acc_hi = bias_hi;
    const uint8_t* wt = w + 128;
    size_t t = 0;
    for (; t + 1 < kernel_size; t += 2) {
      const __m512i x0 = ek_load32(in[t] + c0, cm), x1 = ek_load32(in[t + 1] + c0, cm);
      acc_lo = _mm512_dpwssd_epi32(acc_lo, _mm512_unpacklo_epi16(x0, x1), _mm512_loadu_si512(wt));
      acc_hi = _mm512_dpwssd_epi32(acc_hi, _mm512_unpackhi_epi16(x0, x1), _mm512_loadu_si512(wt + 64));
      wt += 128;
    }
    if (t < kernel_size) { /* the odd last tap pairs with zeros */
      const __m512i x0 = ek_load32(in[t] + c0, cm), x1 = _mm512_setzero_si512();
      acc_lo = _mm512_dpwssd_epi32(acc_lo, _mm512_unpacklo_epi16(x0, x1), _mm512_loadu_si512(wt));
      acc_hi = _mm512_dpwssd_epi32(acc_hi, _mm512_unpackhi_epi16(x0, x1), _mm512_loadu_si512(wt + 64));
    }
    const __m512i y_lo = high ? ek_avx512_mul_high33(acc_lo, r_lo) : ek_avx512_mul_by_multiplier(acc_lo, r_lo);
    const __m512i y_hi = high ? ek_avx512_mul_high33(acc_hi, r_hi) : ek_avx512_mul_by_multiplier(acc_hi, r_hi);
    const __m512i v = _mm512_adds_epi16(_mm512_packs_epi32(y_lo, y_hi), vzp); /* natural order */
    __m256i y = _mm512_cvtsepi16_epi8(v);
    y = _mm256_min_epi8(_mm256_max_epi8(y, vqmin), vqmax);
    _mm256_mask_storeu_epi8(output + p * output_stride + c0, cm, y);
  }
}

void ek_qs8_dwconv_ukernel_c32__avx512vnni(size_t channels, size_t output_width, size_t kernel_size,
                                           const int8_t* const* input, size_t input_step, const void* packed_w,
                                           int8_t* output, size_t output_stride,
                                           const struct ek_requant_params* rq) {
  const __m512i vzp = _mm512_set1_epi16((int16_t)rq->zp_out);
  const __m256i vqmin = _mm256_set1_epi8((int8_t)rq->qmin), vqmax = _mm256_set1_epi8((int8_t)rq->qmax);
  /* lo lane q <- channel 8*(q/4) + q%4, hi lane q <- that + 4 */
  const __m512i idx_lo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const __m512i idx_hi = _mm512_add_epi32(idx_lo, _mm512_set1_epi32(4));
  const size_t pairs = (kernel_size + 1) / 2;
  const size_t block_bytes = 32 * sizeof(int32_t) + pairs * 128;
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t c0 = 0; c0 < channels; c0 += 32, w += block_bytes) {
    const size_t nc = channels - c0 < 32 ? channels - c0 : 32;
    const __mmask32 cm = nc == 32 ? 0xFFFFFFFFu : (__mmask32)((1u << nc) - 1u);
    const __mmask16 m0 = (__mmask16)(cm & 0xFFFFu), m1 = (__mmask16)(cm >> 16);
    const __m512i mult0 = _mm512_maskz_loadu_epi32(m0, rq->multiplier + c0);
    const __m512i mult1 = _mm512_maskz_loadu_epi32(m1, rq->multiplier + c0 + 16);
    const __m512i shift0 = _mm512_maskz_loadu_epi32(m0, rq->shift + c0);
    const __m512i shift1 = _mm512_maskz_loadu_epi32(m1, rq->shift + c0 + 16);
    const struct ek_rq_avx512 r_lo = ek_rq_avx512_init(_mm512_permutex2var_epi32(mult0, idx_lo, mult1),
                                                       _mm512_permutex2var_epi32(shift0, idx_lo, shift1));
    const struct ek_rq_avx512 r_hi = ek_rq_avx512_init(_mm512_permutex2var_epi32(mult0, idx_hi, mult1),
                                                       _mm512_permutex2var_epi32(shift0, idx_hi, shift1));
    const __m512i bias_lo = _mm512_loadu_si512(w), bias_hi = _mm512_loadu_si512(w + 64);

    if (nc > 16) {
      /* the common case's tests out of the loops: whole blocks, the high33 path, 3x3 / 5x5 */
      if (nc == 32 && r_lo.high33 && r_hi.high33) {
        if (kernel_size == 9)
          ek_dw32_pixels(c0, cm, output_width, 9, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp, vqmin,
                         vqmax, 1);
        else if (kernel_size == 25)
          ek_dw32_pixels(c0, cm, output_width, 25, input, input_step, w, output, output_stride, &r_lo, &r_hi, vzp,
                         vqmin, vqmax, 1);
        else
          ek_dw32_pixels(c0, cm, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi,
                         vzp, vqmin, vqmax, 1);
      } else {
        ek_dw32_pixels(c0, cm, output_width, kernel_size, input, input_step, w, output, output_stride, &r_lo, &r_hi,
                       vzp, vqmin, vqmax, 0);
      }
    } else {
      /* <= 16 channels left (C = 16, 48, 144 ... are common): 256-bit halves. Channels 0-15 of
       * the pair layout sit in the low 256 bits of lo and hi. */
      const __mmask16 hm = (__mmask16)cm;
      const __m256i bias_lo8 = _mm512_castsi512_si256(bias_lo), bias_hi8 = _mm512_castsi512_si256(bias_hi);
      for (size_t p = 0; p < output_width; p++) {
        const int8_t* const* in = input + p * input_step;
        __m256i acc_lo = bias_lo8, acc_hi = bias_hi8;
        const uint8_t* wt = w + 128;
        size_t t = 0;
        for (; t + 1 < kernel_size; t += 2) {
          const __m256i x0 = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(hm, in[t] + c0));
          const __m256i x1 = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(hm, in[t + 1] + c0));
          acc_lo = _mm256_dpwssd_epi32(acc_lo, _mm256_unpacklo_epi16(x0, x1), _mm256_loadu_si256((const __m256i*)wt));
          acc_hi = _mm256_dpwssd_epi32(acc_hi, _mm256_unpackhi_epi16(x0, x1),
                                       _mm256_loadu_si256((const __m256i*)(wt + 64)));
          wt += 128;
        }
        if (t < kernel_size) {
          const __m256i x0 = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(hm, in[t] + c0)), x1 = _mm256_setzero_si256();
          acc_lo = _mm256_dpwssd_epi32(acc_lo, _mm256_unpacklo_epi16(x0, x1), _mm256_loadu_si256((const __m256i*)wt));
          acc_hi = _mm256_dpwssd_epi32(acc_hi, _mm256_unpackhi_epi16(x0, x1),
                                       _mm256_loadu_si256((const __m256i*)(wt + 64)));
        }
        /* requantize 16 lanes (upper halves zero) */
        const __m512i y_lo = ek_avx512_mul_by_multiplier(_mm512_castsi256_si512(acc_lo), &r_lo);
        const __m512i y_hi = ek_avx512_mul_by_multiplier(_mm512_castsi256_si512(acc_hi), &r_hi);
        const __m256i v = _mm256_adds_epi16(
            _mm256_packs_epi32(_mm512_castsi512_si256(y_lo), _mm512_castsi512_si256(y_hi)), _mm512_castsi512_si256(vzp));
        __m128i y = _mm256_cvtsepi16_epi8(v);
        y = _mm_min_epi8(_mm_max_epi8(y, _mm256_castsi256_si128(vqmin)), _mm256_castsi256_si128(vqmax));
        _mm_mask_storeu_epi8(output + p * output_stride + c0, hm, y);
      }
    }
  }
}
#endif
