/* Every kernel of every family list (csrc/kernels/<family>/<family>.inc) as a table, for the
 * programs that walk all of them: the kernel tests (csrc/tests/test_kernels.c) and the kernel
 * benchmark (csrc/bench/bench_kernels.c). Adding a kernel to a list adds it to both. Include it
 * once; the tables are static, one copy per program. Also COUNT and xmalloc, which both use. */
#ifndef EK_KERNELS_COMMON_FAMILIES_H
#define EK_KERNELS_COMMON_FAMILIES_H

#include <stdio.h>
#include <stdlib.h>

#include "edgekit/kernels.h"

struct gemm_entry { uint32_t isa; const char* name; ek_qs8_gemm_fn fn; size_t mr, nr, kr; };
static const struct gemm_entry gemm_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn, mr, nr, kr},
#include "../qs8-gemm/qs8-gemm.inc"
#undef EK_KERNEL
};
struct dwconv_entry { uint32_t isa; const char* name; ek_qs8_dwconv_fn fn; size_t cr; };
static const struct dwconv_entry dwconv_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn, nr},
#include "../qs8-dwconv/qs8-dwconv.inc"
#undef EK_KERNEL
};
struct vadd_entry { uint32_t isa; const char* name; ek_qs8_vadd_fn fn; };
static const struct vadd_entry vadd_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn},
#include "../qs8-vadd/qs8-vadd.inc"
#undef EK_KERNEL
};
struct vmul_entry { uint32_t isa; const char* name; ek_qs8_vmul_fn fn; };
static const struct vmul_entry vmul_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn},
#include "../qs8-vmul/qs8-vmul.inc"
#undef EK_KERNEL
};
struct lut_entry { uint32_t isa; const char* name; ek_x8_lut_fn fn; };
static const struct lut_entry lut_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn},
#include "../x8-lut/x8-lut.inc"
#undef EK_KERNEL
};
struct cvt_entry { uint32_t isa; const char* name; ek_f32_qs8_cvt_fn fn; };
static const struct cvt_entry cvt_list[] = {
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, #fn, fn},
#include "../f32-qs8-cvt/f32-qs8-cvt.inc"
#undef EK_KERNEL
};
#define COUNT(x) (sizeof(x) / sizeof((x)[0]))

/* malloc that never returns NULL (a test or benchmark has nothing to fall back to) */
static void* xmalloc(size_t n) {
  void* p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

#endif
