/* GOPS per kernel, from the same family lists as the tests (csrc/kernels/<family>/<family>.inc).
 *
 * One thread. gemm/dwconv: GOPS = 2 * multiply-adds / s on CNN-shaped problems (the im2col
 * shapes of MobileNetV2 / ResNet layers, an FC layer); vadd/vmul/lut/cvt: G elements / s. Each figure
 * is the fastest of >= 20 runs over >= 0.3 s (--quick: 3 runs, 0.02 s). Kernels the CPU lacks are listed
 * as skipped. Output: one line per (kernel, shape); --json prints one JSON document instead. */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "edgekit/cpu.h"
#include "edgekit/kernels.h"
#include "../kernels/common/families.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static int8_t rnd8(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (int8_t)(rng & 0xFF);
}
static double min_time = 0.3;
static int min_iters = 20;
static int json = 0, first_json = 1;

static void report(const char* family, const char* name, uint32_t isa, const char* shape, const char* unit,
                   double value) {
  if (json) {
    printf("%s\n    {\"family\": \"%s\", \"kernel\": \"%s\", \"isa\": \"%s\", \"shape\": \"%s\", \"%s\": %.3f}",
           first_json ? "" : ",", family, name, ek_isa_name(isa), shape, unit, value);
    first_json = 0;
  } else {
    printf("%-10s %-44s %-10s %-26s %8.2f %s\n", family, name, ek_isa_name(isa), shape, value, unit);
  }
}

static void report_skip(const char* family, const char* name, uint32_t isa) {
  if (!json) printf("%-10s %-44s %-10s skipped: the CPU lacks %s\n", family, name, ek_isa_name(isa), ek_cpu_feature_name(isa & ~EK_ISA_WEIGHT_BOUNDS));
}

/* Runs body once to warm up, then repeatedly for >= min_time (and >= min_iters times); best = the
 * fastest single run, which stays meaningful on a loaded machine. */
#define TIME_BEST(best, body)                        \
  do {                                               \
    body;                                            \
    best = 1e30;                                     \
    const double start = now_s();                    \
    for (int iter = 0;; iter++) {                    \
      const double t0 = now_s();                     \
      body;                                          \
      const double t1 = now_s();                     \
      if (t1 - t0 < best) best = t1 - t0;            \
      if (iter >= min_iters && t1 - start >= min_time) break; \
    }                                                \
  } while (0)

static void bench_gemm(uint32_t f) {
  static const struct { size_t m, n, k; const char* what; } shapes[] = {
      {12544, 16, 27, "mnv2-0.5 stem im2col"}, {12544, 8, 16, "mnv2-0.5 1x1 n=8"},
      {12544, 48, 8, "mnv2-0.25 1x1 expand k=8"}, {12544, 8, 27, "mnv2-0.25 stem im2col"}, {2304, 24, 8, "ppocr-cls 1x1 k=8"},
      {288, 88, 16, "ppocr-cls 1x1 3x96"},
      {3136, 144, 24, "mnv2 1x1 expand"},  {3136, 24, 144, "mnv2 1x1 project"},
      {784, 192, 32, "mnv2 1x1 28x28"},    {196, 384, 64, "mnv2 1x1 14x14"},
      {3136, 64, 576, "resnet 3x3 56x56"}, {784, 128, 1152, "resnet 3x3 28x28"},
      {196, 256, 2304, "resnet 3x3 14x14"}, {1, 1000, 1280, "fc 1280->1000"},
  };
  for (size_t s = 0; s < COUNT(shapes); s++) {
    const size_t m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
    int8_t* a = xmalloc(m * k);
    int8_t* w = xmalloc(n * k);
    int8_t* c = xmalloc(m * n);
    int32_t* bias = xmalloc(n * sizeof(int32_t));
    int32_t* mult = xmalloc(n * sizeof(int32_t));
    int32_t* shift = xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < m * k; i++) a[i] = rnd8();
    for (size_t i = 0; i < n * k; i++) w[i] = (int8_t)(rnd8() / 2); /* in [-64, 64]: every kernel runs them */
    for (size_t j = 0; j < n; j++) {
      bias[j] = rnd8() * 100;
      mult[j] = 1500000000 + rnd8() * 1000;
      shift[j] = -12;
    }
    struct ek_requant_params rq = {mult, shift, 3, -128, 127};
    char shape[64];
    snprintf(shape, sizeof shape, "%zux%zux%zu", m, n, k);
    for (size_t e = 0; e < COUNT(gemm_list); e++) {
      const struct gemm_entry* en = &gemm_list[e];
      if (((f | EK_ISA_WEIGHT_BOUNDS) & en->isa) != en->isa) {
        if (s == 0) report_skip("qs8-gemm", en->name, en->isa);
        continue;
      }
      void* packed = xmalloc(ek_qs8_gemm_packed_size(n, k, en->nr, en->kr));
      ek_qs8_gemm_pack(en->isa, en->nr, en->kr, n, k, w, bias, 5, packed);
      if (ek_qs8_gemm_a_offset(en->isa) == 128) ek_qs8_flip(m, k, a, k, a); /* it takes x ^ 0x80: any bytes time alike */
      double best;
      TIME_BEST(best, en->fn(m, n, k, a, k, packed, c, n, &rq));
      report("qs8-gemm", en->name, en->isa, shape, "GOPS", 2.0 * (double)m * (double)n * (double)k / best * 1e-9);
      free(packed);
    }
    free(a);
    free(w);
    free(c);
    free(bias);
    free(mult);
    free(shift);
  }
}

static void bench_dwconv(uint32_t f) {
  static const struct { size_t h, w, c, ks; } shapes[] = {{112, 112, 8, 9}, {112, 112, 16, 9}, {112, 112, 32, 9}, {56, 56, 144, 9}, {14, 14, 576, 9},
                                                          {7, 7, 960, 9}};
  for (size_t s = 0; s < COUNT(shapes); s++) {
    const size_t H = shapes[s].h, W = shapes[s].w, C = shapes[s].c, KS = shapes[s].ks;
    int8_t* x = xmalloc((H + 2) * (W + 2) * C);
    for (size_t i = 0; i < (H + 2) * (W + 2) * C; i++) x[i] = rnd8();
    int8_t* w = xmalloc(KS * C);
    for (size_t i = 0; i < KS * C; i++) w[i] = (int8_t)(rnd8() / 2); /* in [-64, 64]: every kernel runs them */
    int32_t* mult = xmalloc(C * sizeof(int32_t));
    int32_t* shift = xmalloc(C * sizeof(int32_t));
    for (size_t i = 0; i < C; i++) {
      mult[i] = 1400000000;
      shift[i] = -8;
    }
    struct ek_requant_params rq = {mult, shift, 0, -128, 127};
    /* indirection for a 3x3 stride-1 window over a padded input: H*W pixels */
    const int8_t** ind = xmalloc(H * W * KS * sizeof(int8_t*));
    for (size_t y = 0; y < H; y++)
      for (size_t xx = 0; xx < W; xx++)
        for (size_t t = 0; t < KS; t++)
          ind[(y * W + xx) * KS + t] = x + ((y + t / 3) * (W + 2) + xx + t % 3) * C;
    int8_t* out = xmalloc(H * W * C);
    char shape[64];
    snprintf(shape, sizeof shape, "%zux%zux%zu k%zu", H, W, C, KS);
    for (size_t e = 0; e < COUNT(dwconv_list); e++) {
      const struct dwconv_entry* en = &dwconv_list[e];
      if (((f | EK_ISA_WEIGHT_BOUNDS) & en->isa) != en->isa) {
        if (s == 0) report_skip("qs8-dwconv", en->name, en->isa);
        continue;
      }
      void* packed = xmalloc(ek_qs8_dwconv_packed_size(C, KS, en->cr));
      ek_qs8_dwconv_pack(en->isa, en->cr, C, KS, w, NULL, 0, packed);
      double best;
      TIME_BEST(best, for (size_t y = 0; y < H; y++) en->fn(C, W, KS, ind + y * W * KS, KS, packed,
                                                              out + y * W * C, C, &rq));
      report("qs8-dwconv", en->name, en->isa, shape, "GOPS", 2.0 * (double)(H * W * C * KS) / best * 1e-9);
      free(packed);
    }
    free(x);
    free(w);
    free(mult);
    free(shift);
    free(ind);
    free(out);
  }
}

/* Every kernel of an elementwise list on one shape: a skip line where the CPU lacks its ISA,
 * else its best time as G elements / s. `args` is the call's parenthesised argument list. */
#define BENCH_EACH(list, family, shape, n, args)                                                   \
  for (size_t e = 0; e < COUNT(list); e++) {                                                       \
    if ((f & list[e].isa) != list[e].isa) {                                                        \
      report_skip(family, list[e].name, list[e].isa);                                              \
      continue;                                                                                    \
    }                                                                                              \
    double best;                                                                                   \
    TIME_BEST(best, list[e].fn args);                                                              \
    report(family, list[e].name, list[e].isa, shape, "Gelem/s", (double)(n) / best * 1e-9);        \
  }

static void bench_elementwise(uint32_t f) {
  const size_t n = 56 * 56 * 24;
  int8_t* a = xmalloc(n);
  int8_t* b = xmalloc(n);
  int8_t* y = xmalloc(n);
  for (size_t i = 0; i < n; i++) {
    a[i] = rnd8();
    b[i] = rnd8();
  }
  char shape[64];
  snprintf(shape, sizeof shape, "n=%zu", n);
  const struct ek_qs8_add_params ap = {3, -7, 1100000000, -1, 1300000000, -1, 20, 1200000000, -19, 2, -128, 127};
  const struct ek_qs8_mul_params mp = {3, -7, 1300000000, -6, 2, -128, 127};
  BENCH_EACH(vadd_list, "qs8-vadd", shape, n, (n, a, b, y, &ap));
  BENCH_EACH(vmul_list, "qs8-vmul", shape, n, (n, a, b, y, &mp));
  uint8_t table[256];
  for (size_t i = 0; i < 256; i++) table[i] = (uint8_t)rnd8();
  BENCH_EACH(lut_list, "x8-lut", shape, n, (n, (const uint8_t*)a, (uint8_t*)y, table));
  /* a 224x224 RGB input */
  const size_t nf = 3 * 224 * 224;
  float* xf = xmalloc(nf * sizeof(float));
  int8_t* yq = xmalloc(nf);
  for (size_t i = 0; i < nf; i++) xf[i] = (float)rnd8() / 64.0f;
  const struct ek_f32_qs8_cvt_params cp = {0.0187f, -14};
  char fshape[64];
  snprintf(fshape, sizeof fshape, "n=%zu", nf);
  BENCH_EACH(cvt_list, "f32-qs8-cvt", fshape, nf, (nf, xf, yq, &cp));
  free(xf);
  free(yq);
  free(a);
  free(b);
  free(y);
}

int main(int argc, char** argv) {
  const char* only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      min_time = 0.02;
      min_iters = 3;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      fprintf(stderr, "usage: %s [--quick] [--json] [--family qs8-gemm|qs8-dwconv|elementwise]\n", argv[0]);
      return 2;
    }
  }
  const uint32_t f = ek_cpu_detect();
  if (json) printf("{\"results\": [");
  else {
    char names[128];
    printf("one thread; cpu features: %s\n", ek_cpu_feature_list(f, names, sizeof names, " "));
  }
  if (!only || strcmp(only, "qs8-gemm") == 0) bench_gemm(f);
  if (!only || strcmp(only, "qs8-dwconv") == 0) bench_dwconv(f);
  if (!only || strcmp(only, "elementwise") == 0) bench_elementwise(f);
  if (json) printf("\n]}\n");
  return 0;
}
