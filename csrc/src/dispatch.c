/* Kernel dispatch: once per process (CPU features from edgekit/cpu.h), the last kernel of each family's list
 * (csrc/kernels/<family>/<family>.inc) whose ISA bits the CPU has. EKRT_ISA=<isa> caps the
 * features at that ISA (scalar, neon, neondot, avx2, avx512vnni, avx512vbmi, amx). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "edgekit/cpu.h"
#include "internal.h"

static const struct {
  const char* name;
  uint64_t mask; /* features an EKRT_ISA value allows */
} ISA_CAPS[] = {
    {"scalar", 0},
    {"neon", EKRT_CPU_NEON},
    {"neondot", EKRT_CPU_NEON | EKRT_CPU_NEONDOT},
    {"avx2", EKRT_CPU_AVX2},
    {"avx512vnni", EKRT_CPU_AVX2 | EKRT_CPU_AVX512VNNI},
    /* every x86 level: VBMI has no GEMM of its own, only the x8-lut kernel */
    {"avx512vbmi", EKRT_CPU_AVX2 | EKRT_CPU_AVX512VNNI | EKRT_CPU_AVX512VBMI},
    /* every x86 level: AMX has a GEMM only, the other families stay AVX-512's */
    {"amx", EKRT_CPU_AVX2 | EKRT_CPU_AVX512VNNI | EKRT_CPU_AVX512VBMI | EKRT_CPU_AMX},
};

/* Each family's list (.inc) read as a table: EK_KERNEL(isa, fn, mr, nr, kr) -> one entry. */
#define KERNEL_ENTRY(fn_type) \
  struct {                    \
    uint32_t isa;             \
    fn_type fn;               \
    const char* name;         \
    uint32_t mr, nr, kr;      \
  }
#define EK_KERNEL(isa, fn, mr, nr, kr) {isa, fn, #fn, mr, nr, kr},
static const KERNEL_ENTRY(ek_qs8_gemm_fn) GEMM[] = {
#include "../kernels/qs8-gemm/qs8-gemm.inc"
};
static const KERNEL_ENTRY(ek_qs8_dwconv_fn) DWCONV[] = {
#include "../kernels/qs8-dwconv/qs8-dwconv.inc"
};
static const KERNEL_ENTRY(ek_qs8_vadd_fn) VADD[] = {
#include "../kernels/qs8-vadd/qs8-vadd.inc"
};
static const KERNEL_ENTRY(ek_qs8_vmul_fn) VMUL[] = {
#include "../kernels/qs8-vmul/qs8-vmul.inc"
};
static const KERNEL_ENTRY(ek_x8_lut_fn) LUT[] = {
#include "../kernels/x8-lut/x8-lut.inc"
};
static const KERNEL_ENTRY(ek_f32_qs8_cvt_fn) CVT[] = {
#include "../kernels/f32-qs8-cvt/f32-qs8-cvt.inc"
};
#undef EK_KERNEL

static struct ek_kernels chosen;
static uint64_t cpu_features;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char built[64];

static size_t pick_last(const uint32_t* isas, size_t n, uint64_t feats) {
  size_t best = 0; /* entry 0 is the scalar reference: always there */
  for (size_t i = 0; i < n; i++)
    if ((feats & isas[i]) == isas[i]) best = i;
  return best;
}

#define PICK_FROM(table, feats, out_index)                                          \
  do {                                                                              \
    uint32_t isas_[sizeof(table) / sizeof(table[0])];                               \
    for (size_t i_ = 0; i_ < sizeof(table) / sizeof(table[0]); i_++) isas_[i_] = (table)[i_].isa; \
    out_index = pick_last(isas_, sizeof(table) / sizeof(table[0]), feats);          \
  } while (0)

static void init(void) {
  cpu_features = ek_cpu_detect();
  uint64_t feats = cpu_features;
  const char* want = getenv("EKRT_ISA");
  if (want && *want) {
    for (size_t i = 0; i < sizeof ISA_CAPS / sizeof ISA_CAPS[0]; i++)
      if (strcmp(want, ISA_CAPS[i].name) == 0) feats &= ISA_CAPS[i].mask;
  }
  size_t a, mu, lu, cv;
  PICK_FROM(VADD, feats, a);
  PICK_FROM(VMUL, feats, mu);
  PICK_FROM(LUT, feats, lu);
  PICK_FROM(CVT, feats, cv);
  /* the weight-bound bits are no CPU feature: they say an op's weights meet them (conv.c checks) */
  static const uint32_t bounds[EK_WEIGHT_KINDS] = {0, EK_ISA_WN, EK_ISA_W7 | EK_ISA_WN};
  for (int b = 0; b < EK_WEIGHT_KINDS; b++) {
    size_t gb, gsb;
    PICK_FROM(GEMM, feats | bounds[b], gb);
    PICK_FROM(GEMM, (feats & ~(uint64_t)EK_ISA_AMX) | bounds[b], gsb);
    chosen.gemm_for[b] = (struct ek_gemm_choice){GEMM[gb].fn, GEMM[gb].name, GEMM[gb].isa, GEMM[gb].mr, GEMM[gb].nr, GEMM[gb].kr};
    chosen.gemm_small_for[b] =
        (struct ek_gemm_choice){GEMM[gsb].fn, GEMM[gsb].name, GEMM[gsb].isa, GEMM[gsb].mr, GEMM[gsb].nr, GEMM[gsb].kr};
    size_t db;
    PICK_FROM(DWCONV, feats | bounds[b], db);
    chosen.dwconv_for[b] = (struct ek_dwconv_choice){DWCONV[db].fn, DWCONV[db].name, DWCONV[db].isa, DWCONV[db].nr};
  }
  /* the picks for any weights: what ekrt_kernel_choice reports and where a bounded kernel gives way */
  chosen.gemm = chosen.gemm_for[EK_WEIGHTS_ANY];
  chosen.gemm_small = chosen.gemm_small_for[EK_WEIGHTS_ANY];
  chosen.dwconv = chosen.dwconv_for[EK_WEIGHTS_ANY];
  chosen.vadd = VADD[a].fn;
  chosen.vadd_name = VADD[a].name;
  chosen.vmul = VMUL[mu].fn;
  chosen.vmul_name = VMUL[mu].name;
  chosen.lut = LUT[lu].fn;
  chosen.lut_name = LUT[lu].name;
  chosen.cvt = CVT[cv].fn;
  chosen.cvt_name = CVT[cv].name;
  chosen.flip = ek_qs8_flip;
#if EK_ENABLE_AVX2
  if (feats & EK_ISA_AVX2) {
    chosen.flip = ek_qs8_flip__avx2;
    chosen.clut = ek_x8_clut__avx2;
  }
#endif
  chosen.isa = ek_isa_name(chosen.gemm.isa);
  /* the ISAs this build has kernels for */
  uint32_t seen = 0;
  size_t at = 0;
  for (size_t i = 0; i < sizeof GEMM / sizeof GEMM[0]; i++) seen |= GEMM[i].isa ? GEMM[i].isa : 0x80000000u;
  for (size_t i = 0; i < sizeof DWCONV / sizeof DWCONV[0]; i++) seen |= DWCONV[i].isa;
  for (size_t i = 0; i < sizeof VADD / sizeof VADD[0]; i++) seen |= VADD[i].isa;
  for (size_t i = 0; i < sizeof VMUL / sizeof VMUL[0]; i++) seen |= VMUL[i].isa;
  for (size_t i = 0; i < sizeof LUT / sizeof LUT[0]; i++) seen |= LUT[i].isa;
  for (size_t i = 0; i < sizeof CVT / sizeof CVT[0]; i++) seen |= CVT[i].isa;
  static const uint32_t order[] = {0x80000000u, EK_ISA_NEON, EK_ISA_NEONDOT, EK_ISA_AVX2, EK_ISA_AVX512VNNI, EK_ISA_AVX512VBMI, EK_ISA_AMX};
  for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
    if (!(seen & order[i])) continue;
    const char* nm = ek_isa_name(order[i] == 0x80000000u ? 0 : order[i]);
    size_t l = strlen(nm);
    if (at + l + 2 >= sizeof built) break;
    if (at) built[at++] = ',';
    memcpy(built + at, nm, l);
    at += l;
    built[at] = '\0';
  }
}

const struct ek_kernels* ek_kernels(void) {
  pthread_once(&once, init);
  return &chosen;
}

const char* ekrt_isa_name(void) { return ek_kernels()->isa; }

uint64_t ekrt_cpu_features(void) {
  ek_kernels();
  return cpu_features;
}

const char* ekrt_built_isas(void) {
  ek_kernels();
  return built;
}

static const char* const FAMILIES[] = {"qs8-gemm", "qs8-dwconv", "qs8-vadd", "qs8-vmul", "x8-lut", "f32-qs8-cvt"};
#define N_FAMILIES ((int)(sizeof FAMILIES / sizeof FAMILIES[0]))

int ekrt_num_kernel_families(void) { return N_FAMILIES; }

int ekrt_kernel_choice(int family, const char** family_name, const char** kernel_name) {
  const struct ek_kernels* k = ek_kernels();
  if (family < 0 || family >= N_FAMILIES) return EKRT_EARG;
  const char* names[N_FAMILIES] = {k->gemm.name, k->dwconv.name, k->vadd_name, k->vmul_name, k->lut_name, k->cvt_name};
  if (family_name) *family_name = FAMILIES[family];
  if (kernel_name) *kernel_name = names[family];
  return 0;
}
