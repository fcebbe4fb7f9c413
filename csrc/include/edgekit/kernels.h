/* ekrt kernels: signatures, requantization parameters and weight packing (docs/ekrt.md,
 * "Kernels"; ../STYLE "Kernels").
 *
 * Each family has an X-macro list, csrc/kernels/<family>/<family>.inc, of lines
 *     EK_KERNEL(isa_flag, function, mr, nr, kr)
 * ordered from the scalar reference (always first, always present) to the best kernel: the
 * dispatch takes the LAST entry whose isa_flag bits the CPU has ((features & isa) == isa).
 * The lists carry their own #if guards (EK_ENABLE_<ISA> below), so including a list never
 * names a kernel this build does not compile. Tile fields per family:
 *     qs8-gemm    mr x nr output tile, kr = k elements per packed group
 *     qs8-dwconv  mr = 1, nr = channel tile, kr = 1
 *     qs8-vadd    mr = 1, nr = elements per loop iteration (the unroll), kr = 1
 *     qs8-vmul    as qs8-vadd
 *     x8-lut, f32-qs8-cvt   as qs8-vadd
 *
 * Every kernel is bit-identical to the scalar reference (csrc/include/edgekit/requant.h).
 * No kernel reads or writes outside the buffers its arguments describe. */
#ifndef EDGEKIT_KERNELS_H
#define EDGEKIT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ISA flags of the lists: the same bits as ekrt_cpu_features() (EKRT_CPU_* in ekrt.h). */
#define EK_ISA_SCALAR 0u
#define EK_ISA_NEON (1u << 0)       /* aarch64 Advanced SIMD */
#define EK_ISA_NEONDOT (1u << 1)    /* + SDOT (ARMv8.2 dotprod); own TU, -march=armv8.2-a+dotprod */
#define EK_ISA_AVX2 (1u << 8)       /* x86-64 AVX2; -mavx2 */
#define EK_ISA_AVX512VNNI (1u << 9) /* AVX-512 F/BW/VL/VNNI; -mavx512f -mavx512bw -mavx512vl -mavx512vnni */
#define EK_ISA_AVX512VBMI (1u << 10) /* AVX-512 F/BW/VBMI (byte permutes; not implied by VNNI: Cascade Lake has VNNI only) */
#define EK_ISA_AMX (1u << 11)        /* AMX-TILE + AMX-INT8 (TDPBSSD) with AVX-512 VNNI, the OS granting tile data; -mamx-tile -mamx-int8 */
/* Not CPU features: bounds on an op's weights that a kernel whose ISA word has the bit needs to
 * be exact. The CPU never reports them; the runtime adds them for an op whose weights all meet
 * them (checked at load), and the tests draw such kernels' weights from there.
 * W7: all in [-64, 64] (7-bit, what x86 runtimes quantize to without VNNI; implies WN).
 * WN: none is -128 ([-127, 127], edgekit's symmetric weights). */
#define EK_ISA_W7 (1u << 16)
#define EK_ISA_WN (1u << 17)
#define EK_ISA_WEIGHT_BOUNDS (EK_ISA_W7 | EK_ISA_WN)

/* Which ISAs this translation unit may name. A build whose compiler cannot take a kernel
 * file's flags skips the file and compiles everything else with -DEK_NO_<ISA>. */
#if defined(__aarch64__) && !defined(EK_NO_NEON)
#define EK_ENABLE_NEON 1
#else
#define EK_ENABLE_NEON 0
#endif
#if defined(__aarch64__) && !defined(EK_NO_NEON) && !defined(EK_NO_NEONDOT)
#define EK_ENABLE_NEONDOT 1
#else
#define EK_ENABLE_NEONDOT 0
#endif
#if defined(__x86_64__) && !defined(EK_NO_AVX2)
#define EK_ENABLE_AVX2 1
#else
#define EK_ENABLE_AVX2 0
#endif
#if defined(__x86_64__) && !defined(EK_NO_AVX512VNNI)
#define EK_ENABLE_AVX512VNNI 1
#else
#define EK_ENABLE_AVX512VNNI 0
#endif
#if defined(__x86_64__) && !defined(EK_NO_AVX512VBMI)
#define EK_ENABLE_AVX512VBMI 1
#else
#define EK_ENABLE_AVX512VBMI 0
#endif
#if defined(__x86_64__) && !defined(EK_NO_AMX) && !defined(EK_NO_AVX512VNNI)
#define EK_ENABLE_AMX 1
#else
#define EK_ENABLE_AMX 0
#endif

/* Per-output-channel requantization (requant.h's ek_requant): channel j of a call uses
 * multiplier[j], shift[j]; zp_out and [qmin, qmax] (within [-128, 127]) are per tensor. */
struct ek_requant_params {
  const int32_t* multiplier;
  const int32_t* shift;
  int32_t zp_out;
  int32_t qmin;
  int32_t qmax;
};

/* ---- qs8-gemm ----------------------------------------------------------------------------
 * C[i][j] = requant_j(bias'[j] + sum_k A[i][k] * W[j][k]) for i < m, j < n.
 * A: int8 rows of k elements, a_stride bytes apart (a_stride >= k); for a kernel whose
 * ek_qs8_gemm_a_offset is 128 (it multiplies unsigned bytes: VPDPBUSD, VPMADDUBSW) the caller
 * passes every byte as x ^ 0x80 = x + 128 (uint8), once per op rather than once per broadcast
 * in every tile (ek_qs8_flip). C: c_stride bytes apart.
 * packed_w: ek_qs8_gemm_pack output for this kernel's (isa, nr, kr); a call with n < the
 * packed width uses the first n columns. rq->multiplier/shift have >= n entries.
 * m, n, k >= 1. */
typedef void (*ek_qs8_gemm_fn)(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride,
                               const void* packed_w, int8_t* c, size_t c_stride,
                               const struct ek_requant_params* rq);

/* Packed layout, per block of nr columns (the last block zero-padded):
 *     nr x int32 bias'  then  (k_pad / kr) groups of nr x kr int8 (group g, column j, element
 *     r = W[block*nr + j][g*kr + r], 0 beyond n or k),      k_pad = k rounded up to kr,
 * bias'[j] = bias[j] - (zx + a_offset) * sum_k W[j][k], a_offset = ek_qs8_gemm_a_offset(isa)
 * (128 for kernels that multiply unsigned activations: VPDPBUSD takes x + 128; 0 for AMX's
 * TDPBSSD, signed by signed). */
size_t ek_qs8_gemm_packed_size(size_t n, size_t k, size_t nr, size_t kr);
int32_t ek_qs8_gemm_a_offset(uint32_t isa);
/* dst[i][j] = src[i][j] ^ 0x80 for rows of k bytes (src rows src_stride apart, dst rows k apart):
 * the activations of an a_offset-128 kernel. dst may equal src when src_stride == k. */
void ek_qs8_flip(size_t rows, size_t k, const int8_t* src, size_t src_stride, int8_t* dst);
#if EK_ENABLE_AVX2
void ek_qs8_flip__avx2(size_t rows, size_t k, const int8_t* src, size_t src_stride, int8_t* dst);
#endif
typedef void (*ek_qs8_flip_fn)(size_t rows, size_t k, const int8_t* src, size_t src_stride, int8_t* dst);

/* LUT_CHANNEL (ops.c): y[r][c] = tables[c * 256 + x[r][c] + 128] for r < rows, c < channels;
 * tables must be readable EK_CLUT_PAD bytes past channels * 256 (a gather reads dwords). */
#define EK_CLUT_PAD 4
typedef void (*ek_x8_clut_fn)(size_t rows, size_t channels, const int8_t* x, int8_t* y, const int8_t* tables);
#if EK_ENABLE_AVX2
void ek_x8_clut__avx2(size_t rows, size_t channels, const int8_t* x, int8_t* y, const int8_t* tables);
#endif
/* w: int8 [n][k] row-major; bias: int32 [n] or NULL (zeros); zx: the activations' zero
 * point. packed: ek_qs8_gemm_packed_size bytes, 4-byte aligned (64 is best). */
void ek_qs8_gemm_pack(uint32_t isa, size_t nr, size_t kr, size_t n, size_t k, const int8_t* w,
                      const int32_t* bias, int32_t zx, void* packed);

/* ---- qs8-dwconv --------------------------------------------------------------------------
 * Depthwise convolution (group == channels, one filter per channel) over an indirection
 * buffer. For output pixel p < output_width and channel c < channels:
 *     acc = bias'[c] + sum_{t < kernel_size} input[p * input_step + t][c] * W[t][c]
 *     output[p * output_stride + c] = requant_c(acc)
 * input[...] are pointers to `channels` int8 values (the tap's input pixel in NHWC), or to a
 * row of `channels` bytes equal to zx for padding (padding is real zero). input_step (in
 * pointers) is usually kernel_size. output_stride >= channels (bytes). */
typedef void (*ek_qs8_dwconv_fn)(size_t channels, size_t output_width, size_t kernel_size,
                                 const int8_t* const* input, size_t input_step, const void* packed_w,
                                 int8_t* output, size_t output_stride,
                                 const struct ek_requant_params* rq);

/* Packed layout, per block of cr channels (the last block zero-padded), bias'[c] = bias[c] -
 * zx * sum_t W[t][c]:
 *   plain (scalar, neon):  cr x int32 bias'  then  kernel_size groups of cr int8
 *                          (tap t, channel j = W[t][block*cr + j]);
 *   pair (avx2, avx512vnni; cr a multiple of 8): two taps at a time as int16 pairs for
 *                          VPMADDWD / VPDPWSSD, channels in the lane order VPUNPCKLWD/HWD
 *                          produce (qs8-dwconv-pack.c): cr x int32 bias' then ceil(ks/2)
 *                          groups of cr x (int16 W[t][c], int16 W[t+1][c]).
 * ek_qs8_dwconv_packed_size is enough for any ISA's layout of that cr. */
size_t ek_qs8_dwconv_packed_size(size_t channels, size_t kernel_size, size_t cr);
/* w: int8 [kernel_size][channels] (ONNX [C][1][KH][KW] transposed: tap-major = [KH][KW][C]);
 * bias: int32 [channels] or NULL. */
void ek_qs8_dwconv_pack(uint32_t isa, size_t cr, size_t channels, size_t kernel_size, const int8_t* w,
                        const int32_t* bias, int32_t zx, void* packed);

/* ---- qs8-vadd ----------------------------------------------------------------------------
 * TFLite's quantized Add (docs/ekrt.md op ADD), for i < n:
 *     a' = ek_mul_by_multiplier((a[i] - a_zp) << left_shift, a_multiplier, a_shift)
 *     b' = likewise for b
 *     y[i] = ek_requant(a' + b', out_multiplier, out_shift, out_zp, qmin, qmax)
 * left_shift in [0, 23] keeps (a - a_zp) << left_shift within int32. */
struct ek_qs8_add_params {
  int32_t a_zp, b_zp;
  int32_t a_multiplier, a_shift;
  int32_t b_multiplier, b_shift;
  int32_t left_shift;
  int32_t out_multiplier, out_shift;
  int32_t out_zp, qmin, qmax;
};
typedef void (*ek_qs8_vadd_fn)(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                               const struct ek_qs8_add_params* p);
/* An input term whose multiplier is 2^30 with shift s <= 0 and left_shift + s >= 1 (the input
 * at the larger scale: TFLite's derivation divides both scales by twice the larger) is exactly
 * a left shift by left_shift + s - 1: with d = x - zp and n = 31 - s, d * 2^(ls+30) is a
 * multiple of 2^n and the rounding term 2^(n-1) lies below it. The SIMD kernels take it so. */
static inline int ek_qs8_add_term_is_shift(int32_t multiplier, int32_t shift, int32_t left_shift) {
  return multiplier == (INT32_C(1) << 30) && shift <= 0 && left_shift + shift >= 1;
}

/* ---- qs8-vmul ----------------------------------------------------------------------------
 * Quantized Mul (op MUL): y[i] = ek_requant((a[i] - a_zp) * (b[i] - b_zp), multiplier, shift,
 * out_zp, qmin, qmax), multiplier/shift of s_a * s_b / s_y. */
struct ek_qs8_mul_params {
  int32_t a_zp, b_zp;
  int32_t multiplier, shift;
  int32_t out_zp, qmin, qmax;
};
typedef void (*ek_qs8_vmul_fn)(size_t n, const int8_t* a, const int8_t* b, int8_t* y,
                               const struct ek_qs8_mul_params* p);

/* ---- x8-lut --------------------------------------------------------------------------------
 * Table lookup (op LUT): y[i] = table[x[i]] for i < n, table 256 bytes indexed by the byte's
 * unsigned value (the runtime rotates an int8 op's table by 128 at load). y may be x. */
typedef void (*ek_x8_lut_fn)(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table);

/* ---- x8-transpose -------------------------------------------------------------------------
 * dst[c * ds + r] = src[r * ss + c] for r < rows, c < cols (strides in elements): TRANSPOSE and
 * the NHWC -> NCHW RESHAPE. Vector blocks on each arch's baseline (SSE2, NEON), no dispatch. */
void ek_x8_transpose(size_t rows, size_t cols, const int8_t* src, size_t ss, int8_t* dst, size_t ds);
void ek_x32_transpose(size_t rows, size_t cols, const float* src, size_t ss, float* dst, size_t ds);

/* ---- f32-qs8-cvt -------------------------------------------------------------------------
 * ONNX QuantizeLinear to int8 (op QUANTIZE): y[i] = clamp(round_half_even(x[i] / scale) + zp,
 * -128, 127) with a float32 divide; NaN -> zp; +-inf and huge values saturate. scale > 0. */
struct ek_f32_qs8_cvt_params {
  float scale;
  int32_t zp;
};
typedef void (*ek_f32_qs8_cvt_fn)(size_t n, const float* x, int8_t* y, const struct ek_f32_qs8_cvt_params* p);

/* ---- prototypes of every kernel in the lists --------------------------------------------- */
#define EK_KERNEL(isa, fn, mr, nr, kr)                                                           \
  void fn(size_t m, size_t n, size_t k, const int8_t* a, size_t a_stride, const void* packed_w, \
          int8_t* c, size_t c_stride, const struct ek_requant_params* rq);
#include "../../kernels/qs8-gemm/qs8-gemm.inc"
#undef EK_KERNEL

#define EK_KERNEL(isa, fn, mr, nr, kr)                                                            \
  void fn(size_t channels, size_t output_width, size_t kernel_size, const int8_t* const* input, \
          size_t input_step, const void* packed_w, int8_t* output, size_t output_stride,         \
          const struct ek_requant_params* rq);
#include "../../kernels/qs8-dwconv/qs8-dwconv.inc"
#undef EK_KERNEL

#define EK_KERNEL(isa, fn, mr, nr, kr) \
  void fn(size_t n, const int8_t* a, const int8_t* b, int8_t* y, const struct ek_qs8_add_params* p);
#include "../../kernels/qs8-vadd/qs8-vadd.inc"
#undef EK_KERNEL

#define EK_KERNEL(isa, fn, mr, nr, kr) \
  void fn(size_t n, const int8_t* a, const int8_t* b, int8_t* y, const struct ek_qs8_mul_params* p);
#include "../../kernels/qs8-vmul/qs8-vmul.inc"
#undef EK_KERNEL

#define EK_KERNEL(isa, fn, mr, nr, kr) void fn(size_t n, const uint8_t* x, uint8_t* y, const uint8_t* table);
#include "../../kernels/x8-lut/x8-lut.inc"
#undef EK_KERNEL

#define EK_KERNEL(isa, fn, mr, nr, kr) \
  void fn(size_t n, const float* x, int8_t* y, const struct ek_f32_qs8_cvt_params* p);
#include "../../kernels/f32-qs8-cvt/f32-qs8-cvt.inc"
#undef EK_KERNEL

#ifdef __cplusplus
}
#endif

#endif /* EDGEKIT_KERNELS_H */
