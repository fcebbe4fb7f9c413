/* qs8-gemm, 2 rows x 8 columns, AArch64 baseline NEON, two kernels on one body:
 *
 * 2x8c8__neon, k in groups of 8: SMULL (int8 x int8 -> int16, exact) then SADALP (pairwise
 * add-accumulate into int32). No SMLAL pairing, so weights of -128 are fine.
 *
 * 2x8c16__neon_mlal, k in groups of 16, for weights in [-127, 127] only (EK_ISA_WN: no weight is
 * -128, which edgekit's symmetric weights never are): SMULL of the low 8 bytes, SMLAL2 adds the
 * high 8 products onto them, SADALP: 3 instructions per 16 multiply-adds against 4. Two products
 * share an int16 lane, exact only while |a*w + a'*w'| <= 32767: with |w| <= 127 at most
 * 2 * 128 * 127 = 32512, with w = a = -128 twice 32768. The runtime takes it only for an op none
 * of whose weights is -128 (checked at load); the bound is part of its ISA word. */
#include "edgekit/kernels.h"

#if EK_ENABLE_NEON
#include <arm_neon.h>
#include <string.h>

#include "../common/load-tail.h"
#include "../common/requant-neon.h"

static inline int8x8_t ek_load_tail8(const int8_t* p, size_t len) {
  return vreinterpret_s8_s64(vdup_n_s64(ek_load_tail64(p, len)));
}

static inline int8x16_t ek_load_tail16(const int8_t* p, size_t len) {
  int64_t lo, hi;
  ek_load_tail128(p, len, &lo, &hi);
  return vcombine_s8(vreinterpret_s8_s64(vdup_n_s64(lo)), vreinterpret_s8_s64(vdup_n_s64(hi)));
}

#define EK_ROW_GROUP(r, va)                                                         \
  acc##r##0 = vpadalq_s16(acc##r##0, vmull_s8(vget_low_s8(vw01), va));            \
  acc##r##1 = vpadalq_s16(acc##r##1, vmull_s8(vget_high_s8(vw01), va));           \
  acc##r##2 = vpadalq_s16(acc##r##2, vmull_s8(vget_low_s8(vw23), va));            \
  acc##r##3 = vpadalq_s16(acc##r##3, vmull_s8(vget_high_s8(vw23), va));           \
  acc##r##4 = vpadalq_s16(acc##r##4, vmull_s8(vget_low_s8(vw45), va));            \
  acc##r##5 = vpadalq_s16(acc##r##5, vmull_s8(vget_high_s8(vw45), va));           \
  acc##r##6 = vpadalq_s16(acc##r##6, vmull_s8(vget_low_s8(vw67), va));            \
  acc##r##7 = vpadalq_s16(acc##r##7, vmull_s8(vget_high_s8(vw67), va));

#if !defined(__aarch64__) || !defined(__GNUC__)
#error "qs8-gemm-2x8-neon.c is AArch64 only (sources.toml: neon) and needs GNU inline assembly (gcc, clang)"
#endif

/* The kr = 16 tile in GNU assembly (AArch64). clang (the zig compiler that builds device
 * runners first) scheduled the intrinsics' SMULLs ahead of their SADALPs, ran out of the 32
 * vector registers and shuffled accumulators with MOVs and a spill every k group: this kernel
 * executed 16.2 M instructions on oww-embedding's Cortex-A72 path against gcc's 12.1 M. Here the
 * registers are fixed: row 0's accumulators v16-v23 (column j in v16+j), row 1's v24-v31, a pair
 * of weight columns v0-v1, the rows' 16 activations v2 / v3, products v4-v7. One pair of
 * columns (J, J+1) of a k group, both rows: */
#define EK_MLAL_PAIR(A0, A1, B0, B1)         \
  "ldp q0, q1, [%[w]], #32\n\t"              \
  "smull v4.8h, v2.8b, v0.8b\n\t"            \
  "smull v5.8h, v2.8b, v1.8b\n\t"            \
  "smull v6.8h, v3.8b, v0.8b\n\t"            \
  "smull v7.8h, v3.8b, v1.8b\n\t"            \
  "smlal2 v4.8h, v2.16b, v0.16b\n\t"         \
  "smlal2 v5.8h, v2.16b, v1.16b\n\t"         \
  "smlal2 v6.8h, v3.16b, v0.16b\n\t"         \
  "smlal2 v7.8h, v3.16b, v1.16b\n\t"         \
  "sadalp " A0 ".4s, v4.8h\n\t"              \
  "sadalp " A1 ".4s, v5.8h\n\t"              \
  "sadalp " B0 ".4s, v6.8h\n\t"              \
  "sadalp " B1 ".4s, v7.8h\n\t"
#define EK_MLAL_GROUP                                    \
  EK_MLAL_PAIR("v16", "v17", "v24", "v25")               \
  EK_MLAL_PAIR("v18", "v19", "v26", "v27")               \
  EK_MLAL_PAIR("v20", "v21", "v28", "v29")               \
  EK_MLAL_PAIR("v22", "v23", "v30", "v31")

/* rows a0, a1 over k (k_main of it in whole groups of 16; the rest, zero-filled, in x0t / x1t
 * when `tail`): each row's 8 column sums, columns 0-3 / 4-7, bias not added */
static inline void ek_mlal_tile(const int8_t* a0, const int8_t* a1, const int8_t* wk, size_t k_main, int8x16_t x0t,
                                int8x16_t x1t, size_t tail, int32x4_t* s0a, int32x4_t* s0b, int32x4_t* s1a,
                                int32x4_t* s1b) {
  size_t kk = 0;
  int32x4_t r0a, r0b, r1a, r1b;
  __asm__("movi v16.4s, #0\n\t" "movi v17.4s, #0\n\t" "movi v18.4s, #0\n\t" "movi v19.4s, #0\n\t"
          "movi v20.4s, #0\n\t" "movi v21.4s, #0\n\t" "movi v22.4s, #0\n\t" "movi v23.4s, #0\n\t"
          "movi v24.4s, #0\n\t" "movi v25.4s, #0\n\t" "movi v26.4s, #0\n\t" "movi v27.4s, #0\n\t"
          "movi v28.4s, #0\n\t" "movi v29.4s, #0\n\t" "movi v30.4s, #0\n\t" "movi v31.4s, #0\n\t"
          "cbz %[end], 2f\n\t"
          "1:\n\t"
          "ldr q2, [%[a0], %[kk]]\n\t"
          "ldr q3, [%[a1], %[kk]]\n\t"
          "add %[kk], %[kk], #16\n\t"
          EK_MLAL_GROUP
          "cmp %[kk], %[end]\n\t"
          "b.lo 1b\n\t"
          "2:\n\t"
          "cbz %[tail], 3f\n\t"
          "mov v2.16b, %[x0t].16b\n\t"
          "mov v3.16b, %[x1t].16b\n\t"
          EK_MLAL_GROUP
          "3:\n\t"
          "addp v16.4s, v16.4s, v17.4s\n\t" "addp v18.4s, v18.4s, v19.4s\n\t" "addp v16.4s, v16.4s, v18.4s\n\t"
          "addp v20.4s, v20.4s, v21.4s\n\t" "addp v22.4s, v22.4s, v23.4s\n\t" "addp v20.4s, v20.4s, v22.4s\n\t"
          "addp v24.4s, v24.4s, v25.4s\n\t" "addp v26.4s, v26.4s, v27.4s\n\t" "addp v24.4s, v24.4s, v26.4s\n\t"
          "addp v28.4s, v28.4s, v29.4s\n\t" "addp v30.4s, v30.4s, v31.4s\n\t" "addp v28.4s, v28.4s, v30.4s\n\t"
          "mov %[r0a].16b, v16.16b\n\t"
          "mov %[r0b].16b, v20.16b\n\t"
          "mov %[r1a].16b, v24.16b\n\t"
          "mov %[r1b].16b, v28.16b\n\t"
          : [r0a] "=w"(r0a), [r0b] "=w"(r0b), [r1a] "=w"(r1a), [r1b] "=w"(r1b), [w] "+r"(wk), [kk] "+r"(kk)
          : [a0] "r"(a0), [a1] "r"(a1), [end] "r"(k_main), [tail] "r"(tail), [x0t] "w"(x0t), [x1t] "w"(x1t)
          : "cc", "memory", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21",
            "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31");
  *s0a = r0a;
  *s0b = r0b;
  *s1a = r1a;
  *s1b = r1b;
}

static inline void ek_store8(int8_t* dst, int8x8_t v, size_t nj) {
  if (nj == 8) {
    vst1_s8(dst, v);
  } else {
    int8_t tmp[8];
    vst1_s8(tmp, v);
    memcpy(dst, tmp, nj);
  }
}

/* two rows' column sums (columns 0-3 / 4-7) + bias, requantized, stored (row 1 first: c1 may
 * alias c0) */
static inline __attribute__((always_inline)) void ek_requant_store(int32x4_t s0a, int32x4_t s0b, int32x4_t s1a,
                                                                   int32x4_t s1b, int32x4_t vb0123, int32x4_t vb4567,
                                                                   int32x4_t vm_a, int32x4_t vm_b, int64x2_t n0,
                                                                   int64x2_t n1, int64x2_t n2, int64x2_t n3,
                                                                   int16x8_t vzp, int8x8_t vqmin, int8x8_t vqmax,
                                                                   int8_t* c0, int8_t* c1, size_t nj) {
  s0a = ek_neon_mul_by_multiplier(vaddq_s32(s0a, vb0123), vm_a, n0, n1);
  s0b = ek_neon_mul_by_multiplier(vaddq_s32(s0b, vb4567), vm_b, n2, n3);
  s1a = ek_neon_mul_by_multiplier(vaddq_s32(s1a, vb0123), vm_a, n0, n1);
  s1b = ek_neon_mul_by_multiplier(vaddq_s32(s1b, vb4567), vm_b, n2, n3);
  ek_store8(c1, ek_neon_narrow8(s1a, s1b, vzp, vqmin, vqmax), nj);
  ek_store8(c0, ek_neon_narrow8(s0a, s0b, vzp, vqmin, vqmax), nj);
}

/* kr: 8 (SMULL + SADALP) or 16 (SMULL + SMLAL2 + SADALP), a constant after inlining */
static inline __attribute__((always_inline)) void ek_gemm_2x8(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                                              const void* packed_w, int8_t* c, size_t c_stride,
                                                              const struct ek_requant_params* rq, const size_t kr) {
  const size_t k_main = k / kr * kr;
  const size_t k_pad = (k + kr - 1) / kr * kr;
  const size_t block_bytes = 8 * sizeof(int32_t) + k_pad * 8;
  const int16x8_t vzp = vdupq_n_s16((int16_t)rq->zp_out);
  const int8x8_t vqmin = vdup_n_s8((int8_t)rq->qmin), vqmax = vdup_n_s8((int8_t)rq->qmax);
  const int32x4_t vzero = vdupq_n_s32(0);

  /* column blocks outside, rows inside: a block's weights stay in L1, its requantization
   * constants are set up once per call */
  const uint8_t* w = (const uint8_t*)packed_w;
  for (size_t j0 = 0; j0 < n; j0 += 8, w += block_bytes) {
    const size_t nj = n - j0 < 8 ? n - j0 : 8;
    int32x4_t vm_a, vm_b, vs_a, vs_b;
    if (nj == 8) {
      vm_a = vld1q_s32(rq->multiplier + j0);
      vm_b = vld1q_s32(rq->multiplier + j0 + 4);
      vs_a = vld1q_s32(rq->shift + j0);
      vs_b = vld1q_s32(rq->shift + j0 + 4);
    } else {
      int32_t mult[8] = {0, 0, 0, 0, 0, 0, 0, 0}, shift[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      memcpy(mult, rq->multiplier + j0, nj * sizeof(int32_t));
      memcpy(shift, rq->shift + j0, nj * sizeof(int32_t));
      vm_a = vld1q_s32(mult);
      vm_b = vld1q_s32(mult + 4);
      vs_a = vld1q_s32(shift);
      vs_b = vld1q_s32(shift + 4);
    }
    int64x2_t n0, n1, n2, n3;
    ek_neon_neg_n(vs_a, &n0, &n1);
    ek_neon_neg_n(vs_b, &n2, &n3);
    const int32x4_t vb0123 = vld1q_s32((const int32_t*)w);
    const int32x4_t vb4567 = vld1q_s32((const int32_t*)w + 4);

    for (size_t i = 0; i < m; i += 2) {
      /* a row past m aliases the last real row (computed twice, stored twice, same values) */
      const int8_t* a0 = a + i * a_stride;
      const int8_t* a1 = m - i > 1 ? a0 + a_stride : a0;
      int8_t* c0 = c + i * c_stride;
      int8_t* c1 = m - i > 1 ? c0 + c_stride : c0;
      if (kr == 16) {
        const size_t tail = k - k_main;
        int8x16_t x0t = vdupq_n_s8(0), x1t = vdupq_n_s8(0);
        if (tail) x0t = ek_load_tail16(a0 + k_main, tail), x1t = ek_load_tail16(a1 + k_main, tail);
        int32x4_t s0a, s0b, s1a, s1b;
        ek_mlal_tile(a0, a1, (const int8_t*)(w + 32), k_main, x0t, x1t, tail, &s0a, &s0b, &s1a, &s1b);
        ek_requant_store(s0a, s0b, s1a, s1b, vb0123, vb4567, vm_a, vm_b, n0, n1, n2, n3, vzp, vqmin, vqmax, c0 + j0,
                         c1 + j0, nj);
        continue;
      }
      /* kr = 8: SMULL + SADALP in intrinsics */
      int32x4_t acc00 = vzero, acc01 = vzero, acc02 = vzero, acc03 = vzero;
      int32x4_t acc04 = vzero, acc05 = vzero, acc06 = vzero, acc07 = vzero;
      int32x4_t acc10 = vzero, acc11 = vzero, acc12 = vzero, acc13 = vzero;
      int32x4_t acc14 = vzero, acc15 = vzero, acc16 = vzero, acc17 = vzero;
      const int8_t* wk = (const int8_t*)(w + 32);
      size_t kk = 0;
      for (; kk < k_main; kk += 8) {
        const int8x8_t va0 = vld1_s8(a0 + kk), va1 = vld1_s8(a1 + kk);
        const int8x16_t vw01 = vld1q_s8(wk);
        const int8x16_t vw23 = vld1q_s8(wk + 16);
        const int8x16_t vw45 = vld1q_s8(wk + 32);
        const int8x16_t vw67 = vld1q_s8(wk + 48);
        EK_ROW_GROUP(0, va0)
        EK_ROW_GROUP(1, va1)
        wk += 64;
      }
      if (kk < k) { /* 1..7 left, zero-filled against zero-padded weights */
        const int8x8_t va0 = ek_load_tail8(a0 + kk, k - kk), va1 = ek_load_tail8(a1 + kk, k - kk);
        const int8x16_t vw01 = vld1q_s8(wk);
        const int8x16_t vw23 = vld1q_s8(wk + 16);
        const int8x16_t vw45 = vld1q_s8(wk + 32);
        const int8x16_t vw67 = vld1q_s8(wk + 48);
        EK_ROW_GROUP(0, va0)
        EK_ROW_GROUP(1, va1)
      }
      ek_requant_store(vpaddq_s32(vpaddq_s32(acc00, acc01), vpaddq_s32(acc02, acc03)),
                       vpaddq_s32(vpaddq_s32(acc04, acc05), vpaddq_s32(acc06, acc07)),
                       vpaddq_s32(vpaddq_s32(acc10, acc11), vpaddq_s32(acc12, acc13)),
                       vpaddq_s32(vpaddq_s32(acc14, acc15), vpaddq_s32(acc16, acc17)), vb0123, vb4567, vm_a, vm_b, n0,
                       n1, n2, n3, vzp, vqmin, vqmax, c0 + j0, c1 + j0, nj);
    }
  }
}
void ek_qs8_gemm_ukernel_2x8c8__neon(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride, const void* packed_w,
                                     int8_t* c, size_t c_stride, const struct ek_requant_params* rq) {
  ek_gemm_2x8(m, n, k, a, a_stride, packed_w, c, c_stride, rq, 8);
}

void ek_qs8_gemm_ukernel_2x8c16__neon_mlal(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                                           const void* packed_w, int8_t* c, size_t c_stride,
                                           const struct ek_requant_params* rq) {
  ek_gemm_2x8(m, n, k, a, a_stride, packed_w, c, c_stride, rq, 16);
}
#endif
