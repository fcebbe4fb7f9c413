/* CPU features, one definition for the runtime's dispatch (src/dispatch.c), the kernel tests
 * (tests/test_kernels.c), the kernel benchmarks (bench/bench_kernels.c) and the printed
 * names (`ekrt info`, _ekrt.features()).
 *
 * A feature bit is an EK_ISA_* kernel level (kernels.h): a kernel runs when all its bits are
 * set. Its printed name is the word edgekit/profiles/model.py uses for the CPU feature that
 * level needs (Linux /proc/cpuinfo's where it has one): "neon", "asimddp", "avx2",
 * "avx512_vnni" (which here also implies AVX-512 F/BW/VL and the OS saving ZMM state),
 * "avx512vbmi" (F/BW too), "amx_int8" (AMX-TILE and AMX-INT8 with AVX-512 VNNI, the OS saving
 * tile state and granting this process its use). Kernel ISA names (EKRT_ISA, built ISAs,
 * function suffixes) stay: scalar, neon, neondot, avx2, avx512vnni, avx512vbmi, amx. Header-only (static inline), so each of the three builds takes it as is. */
#ifndef EDGEKIT_CPU_H
#define EDGEKIT_CPU_H

#include <stdint.h>

#include "edgekit/kernels.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

/* the bits, in the order they are printed */
#define EK_CPU_N_FEATURES 6
static inline uint32_t ek_cpu_feature_bit(int i) {
  static const uint32_t bits[EK_CPU_N_FEATURES] = {EK_ISA_NEON, EK_ISA_NEONDOT, EK_ISA_AVX2, EK_ISA_AVX512VNNI, EK_ISA_AVX512VBMI, EK_ISA_AMX};
  return i >= 0 && i < EK_CPU_N_FEATURES ? bits[i] : 0;
}

static inline const char* ek_cpu_feature_name(uint32_t bit) {
  switch (bit) {
    case EK_ISA_NEON: return "neon";
    case EK_ISA_NEONDOT: return "asimddp";
    case EK_ISA_AVX2: return "avx2";
    case EK_ISA_AVX512VNNI: return "avx512_vnni";
    case EK_ISA_AVX512VBMI: return "avx512vbmi";
    case EK_ISA_AMX: return "amx_int8";
    default: return "?";
  }
}

/* the kernel ISA level's name (a kernel's suffix, EKRT_ISA's values) */
static inline const char* ek_isa_name(uint32_t isa) {
  switch (isa) {
    case EK_ISA_SCALAR: return "scalar";
    case EK_ISA_NEON: return "neon";
    case EK_ISA_NEONDOT: return "neondot";
    case EK_ISA_AVX2: return "avx2";
    case EK_ISA_AVX512VNNI: return "avx512vnni";
    case EK_ISA_AVX512VBMI: return "avx512vbmi";
    case EK_ISA_AMX: return "amx";
    case EK_ISA_AVX2 | EK_ISA_W7: return "avx2"; /* with 7-bit weights */
    case EK_ISA_NEON | EK_ISA_WN: return "neon";  /* with no weight of -128 */
    default: return "?";
  }
}

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
/* arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Linux (5.16+) lets a process use AMX's
 * tile data only once it asks; the grant is the process's, for every thread. A raw syscall, so
 * the header needs no feature-test macros (glibc declares syscall() only under _DEFAULT_SOURCE). */
static inline int ek_amx_granted(void) {
  long ret;
  __asm__ __volatile__("syscall" : "=a"(ret) : "a"(158L /* SYS_arch_prctl */), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
  return ret == 0;
}
#else
static inline int ek_amx_granted(void) { return 0; }
#endif

/* getauxval(AT_HWCAP) on aarch64; cpuid + xgetbv on x86 (AVX2 needs the OS to save YMM state,
 * AVX-512 VNNI needs F, BW, VL, VNNI and ZMM state; VBMI needs F, BW, VBMI and ZMM state; AMX
 * needs AVX-512 VNNI, tile state and the OS's grant, which detecting it asks for) */
static inline uint32_t ek_cpu_detect(void) {
  uint32_t f = 0;
#if defined(__aarch64__)
#if defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP);
  if (hw & (1ul << 1)) f |= EK_ISA_NEON;                                  /* HWCAP_ASIMD */
  if ((hw & (1ul << 1)) && (hw & (1ul << 20))) f |= EK_ISA_NEONDOT;       /* HWCAP_ASIMDDP */
#else
  f |= EK_ISA_NEON; /* Advanced SIMD is part of every AArch64 core */
#endif
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  if (!((c >> 27) & 1) || !((c >> 28) & 1)) return 0; /* OSXSAVE, AVX */
  unsigned xlo, xhi;
  __asm__ __volatile__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  (void)xhi;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  if ((xlo & 0x6u) == 0x6u && ((b >> 5) & 1)) f |= EK_ISA_AVX2;
  if ((xlo & 0xE6u) == 0xE6u && ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1) && ((c >> 11) & 1) &&
      (f & EK_ISA_AVX2))
    f |= EK_ISA_AVX512VNNI;
  if ((xlo & 0xE6u) == 0xE6u && ((b >> 16) & 1) && ((b >> 30) & 1) && ((c >> 1) & 1) && (f & EK_ISA_AVX2))
    f |= EK_ISA_AVX512VBMI;
  /* AMX-TILE (edx 24), AMX-INT8 (edx 25), XTILECFG + XTILEDATA state (XCR0 bits 17, 18) */
  if ((f & EK_ISA_AVX512VNNI) && ((d >> 24) & 1) && ((d >> 25) & 1) && (xlo & 0x60000u) == 0x60000u && ek_amx_granted())
    f |= EK_ISA_AMX;
#endif
  return f;
}

/* "name name ..." of the bits set in f, into buf (empty when none) */
static inline const char* ek_cpu_feature_list(uint64_t f, char* buf, unsigned len, const char* sep) {
  unsigned at = 0;
  if (len) buf[0] = '\0';
  for (int i = 0; i < EK_CPU_N_FEATURES; i++) {
    if (!(f & ek_cpu_feature_bit(i))) continue;
    for (const char* p = at ? sep : ""; *p && at + 1 < len; p++) buf[at++] = *p;
    for (const char* p = ek_cpu_feature_name(ek_cpu_feature_bit(i)); *p && at + 1 < len; p++) buf[at++] = *p;
    if (len) buf[at] = '\0';
  }
  return buf;
}

#endif /* EDGEKIT_CPU_H */
