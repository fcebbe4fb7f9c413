/* Every kernel of every family list vs the scalar reference, bit for bit.
 *
 * The lists (csrc/kernels/<family>/<family>.inc) generate the tables below: adding a kernel
 * to a list adds it here. Each variant is compared with a naive reference written straight
 * from requant.h (which the scalar kernel must equal too) on ragged sizes (m, n, k, channels,
 * n not multiples of the tile), strided rows, per-channel multipliers/shifts (realistic,
 * rounding ties, random, left shifts), zero points and act_min/act_max. Bytes around every
 * output are checked untouched; inputs are allocated to their exact size (run under ASan to
 * catch over-reads). A variant whose ISA the CPU lacks is skipped with a line saying so.
 *
 * Output, one line per kernel:  PASS|FAIL|SKIP <family> <function> isa=<isa> ...
 * Exit status 0 when nothing failed. Options: --quick (fewer cases, for emulators),
 * --seed N, --run-all (ignore the CPU features: a kernel the CPU lacks then dies with SIGILL). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "edgekit/cpu.h"
#include "edgekit/kernels.h"
#include "edgekit/requant.h"

#include "../kernels/common/families.h" /* the tables, from the lists */

/* ---- helpers ------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static int32_t rnd_range(int32_t lo, int32_t hi) { /* inclusive */
  return lo + (int32_t)(rnd() % (uint64_t)((int64_t)hi - lo + 1));
}
static double rnd_unit(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

static void fill_i8(int8_t* p, size_t n, int mode) {
  for (size_t i = 0; i < n; i++) {
    switch (mode) {
      case 1: p[i] = -128; break;
      case 2: p[i] = (rnd() & 1) ? 127 : -128; break;
      default: p[i] = (int8_t)rnd_range(-128, 127);
    }
  }
}

/* One (multiplier, shift) per channel: realistic for an accumulator of typical size `scale`,
 * a rounding-tie case, a random one, or one with a left shift. */
/* set per case: 0 any kind of multiplier per channel; 1 only the realistic ones (a whole block
 * of shift <= -2 takes the AVX2 requantization's cheapest high-half path, which a single odd
 * channel in the block would turn off); 2 one shift for every channel, case_shift in [-31, -1],
 * with random multipliers: each boundary of those paths (n = 32, 33, 62) met by whole blocks */
static int realistic_only;
static int32_t case_shift;
static void draw_multiplier_mode(void) {
  realistic_only = (int)(rnd() % 3);
  case_shift = rnd_range(-31, -1);
}

static void make_multiplier(double acc_scale, int allow_left, int32_t* mult, int32_t* shift) {
  int32_t rm, rs; /* realistic: maps a typical accumulator to about +-40 */
  if (ek_quantize_multiplier(40.0 / acc_scale * (0.25 + 1.5 * rnd_unit()), &rm, &rs) != 0 || rs > 0) {
    rm = 1 << 30;
    rs = 0;
  }
  if (realistic_only == 2) {
    *mult = rnd_range(1 << 30, INT32_MAX);
    *shift = case_shift;
    return;
  }
  const int kind = realistic_only ? 0 : (int)(rnd() % 8);
  *mult = rm;
  *shift = rs;
  if (kind == 4) {
    *mult = 1 << 30; /* srdhm halves exactly: ties in both roundings */
    *shift = rs + 1 > 0 ? 0 : rs + 1;
  } else if (kind == 5) {
    *mult = INT32_MAX;
  } else if (kind == 6 && allow_left) {
    *mult = rnd_range(1 << 30, INT32_MAX); /* left shifts, up to saturation */
    *shift = rnd_range(1, 30);
  } else if (kind == 6) {
    *mult = rnd_range(1 << 30, INT32_MAX);
    *shift = rnd_range(-31, 0);
  } else if (kind == 7) {
    *mult = rnd_range(1 << 30, INT32_MAX);
    *shift = rs + rnd_range(-3, 3);
    if (*shift > 0) *shift = 0;
    if (*shift < -31) *shift = -31;
  }
}

static void make_clamp(int32_t zp, int32_t* qmin, int32_t* qmax) {
  switch (rnd() % 4) {
    case 0: *qmin = -128; *qmax = 127; break;
    case 1: *qmin = zp; *qmax = 127; break; /* ReLU */
    case 2: *qmin = zp; *qmax = zp + rnd_range(0, 127 - zp); break; /* ReLU6-like */
    default: *qmin = rnd_range(-128, 0); *qmax = rnd_range(*qmin, 127);
  }
}

static int32_t rnd_zp(void) { return rnd() % 4 ? rnd_range(-40, 40) : rnd_range(-128, 127); }

static const uint8_t CANARY = 0xA5;

static int check_canary(const int8_t* buf, size_t rows, size_t stride, size_t width) {
  for (size_t i = 0; i + 1 < rows; i++)
    for (size_t j = width; j < stride; j++)
      if ((uint8_t)buf[i * stride + j] != CANARY) return 0;
  return 1;
}

static int n_fail = 0;
/* outputs strictly inside (qmin, qmax) vs all: shows the cases exercise rounding, not only
 * the clamps */
static size_t n_interior = 0, n_outputs = 0;
static void count_interior(int8_t v, int32_t qmin, int32_t qmax) {
  n_outputs++;
  if (v > qmin && v < qmax) n_interior++;
}

/* What each test keeps per kernel of its list: still passing, cases run, why it failed. */
#define KERNEL_STATE(LIST)    \
  int ok[COUNT(LIST)];        \
  size_t ran[COUNT(LIST)];    \
  char why[COUNT(LIST)][256]; \
  for (size_t e = 0; e < COUNT(LIST); e++) ok[e] = 1, ran[e] = 0

/* Mark kernel e failed, saying why (the first failure is the one reported: tests stop at it). */
#define KERNEL_FAILS(e, ...) (snprintf(why[e], sizeof why[e], __VA_ARGS__), ok[e] = 0)

/* One kernel's line: SKIP where the CPU lacks its ISA, else PASS (`tile` is "" or "tile=... ") or FAIL. */
static void report(const char* family, const char* name, uint32_t isa, const char* tile, uint32_t features, int ok,
                   size_t ran, const char* why) {
  if ((features & isa) != isa)
    printf("SKIP %s %s isa=%s: the CPU lacks %s\n", family, name, ek_isa_name(isa),
           ek_cpu_feature_name(isa & ~EK_ISA_WEIGHT_BOUNDS));
  else if (ok)
    printf("PASS %s %s isa=%s %scases=%zu\n", family, name, ek_isa_name(isa), tile, ran);
  else {
    printf("FAIL %s %s isa=%s: %s\n", family, name, ek_isa_name(isa), why);
    n_fail++;
  }
}
#define REPORT(FAMILY, LIST)            \
  for (size_t e = 0; e < COUNT(LIST); e++) \
  report(FAMILY, LIST[e].name, LIST[e].isa, "", features, ok[e], ran[e], why[e])

/* ---- qs8-gemm ------------------------------------------------------------------------------ */

struct gemm_case {
  size_t m, n, k, a_stride, c_stride;
  int8_t *a, *w, *ref;
  int32_t *bias, *mult, *shift;
  int32_t zx;
  struct ek_requant_params rq;
};

/* bounds: 0, EK_ISA_WN (weights in [-127, 127]) or EK_ISA_W7 | EK_ISA_WN (in [-64, 64]), both ends
 * reached where the case draws extremes; every kernel runs such weights, the bounded ones only them */
static void gemm_case_make(struct gemm_case* g, size_t m, size_t n, size_t k, uint32_t bounds) {
  g->m = m;
  g->n = n;
  g->k = k;
  g->a_stride = k + (size_t)(rnd() % 3) * (rnd() % 5);
  g->c_stride = n + (size_t)(rnd() % 3) * (rnd() % 4);
  const int mode = (rnd() % 16 == 0) ? (int)(1 + rnd() % 2) : 0;
  g->a = xmalloc((m - 1) * g->a_stride + k);
  fill_i8(g->a, (m - 1) * g->a_stride + k, mode);
  g->w = xmalloc(n * k);
  fill_i8(g->w, n * k, mode);
  if (bounds & EK_ISA_W7)
    for (size_t i = 0; i < n * k; i++) g->w[i] = g->w[i] == 127 ? 64 : (int8_t)(g->w[i] / 2);
  else if (bounds & EK_ISA_WN)
    for (size_t i = 0; i < n * k; i++) g->w[i] = g->w[i] == -128 ? -127 : g->w[i];
  g->bias = xmalloc(n * sizeof(int32_t));
  g->mult = xmalloc(n * sizeof(int32_t));
  g->shift = xmalloc(n * sizeof(int32_t));
  g->zx = mode ? (rnd() & 1 ? -128 : 127) : rnd_range(-128, 127);
  const double acc_scale = 7400.0 * sqrt((double)k); /* std of sum (x - zx) * w, roughly */
  draw_multiplier_mode();
  for (size_t j = 0; j < n; j++) {
    const int32_t bmax = rnd() % 8 ? (int32_t)acc_scale : 1 << 20;
    g->bias[j] = rnd_range(-bmax, bmax);
    make_multiplier(acc_scale, 1, &g->mult[j], &g->shift[j]);
  }
  g->rq.multiplier = g->mult;
  g->rq.shift = g->shift;
  g->rq.zp_out = rnd_zp();
  make_clamp(g->rq.zp_out, &g->rq.qmin, &g->rq.qmax);
  g->ref = xmalloc(m * n);
  for (size_t i = 0; i < m; i++) {
    for (size_t j = 0; j < n; j++) {
      int32_t acc = g->bias[j];
      for (size_t kk = 0; kk < k; kk++)
        acc += ((int32_t)g->a[i * g->a_stride + kk] - g->zx) * (int32_t)g->w[j * k + kk];
      g->ref[i * n + j] = ek_requant(acc, g->mult[j], g->shift[j], g->rq.zp_out, g->rq.qmin, g->rq.qmax);
      count_interior(g->ref[i * n + j], g->rq.qmin, g->rq.qmax);
    }
  }
}

static void gemm_case_free(struct gemm_case* g) {
  free(g->a);
  free(g->w);
  free(g->bias);
  free(g->mult);
  free(g->shift);
  free(g->ref);
}

/* Runs one kernel on one case with the first n_run columns (n_run <= n: the runtime splits
 * columns over threads with the same packing); returns 1 when it matches the reference and
 * left every other byte of C alone. */
static int gemm_run(const struct gemm_entry* e, const struct gemm_case* g, const void* packed, size_t n_run,
                    char* why, size_t why_len) {
  const size_t c_size = (g->m - 1) * g->c_stride + g->n;
  int8_t* c = xmalloc(c_size);
  memset(c, CANARY, c_size);
  const size_t a_size = (g->m - 1) * g->a_stride + g->k;
  int8_t* a = g->a;
  if (ek_qs8_gemm_a_offset(e->isa) == 128) { /* such a kernel takes x ^ 0x80 (kernels.h); padding bytes too */
    a = xmalloc(a_size);
    for (size_t i = 0; i < a_size; i++) a[i] = (int8_t)((uint8_t)g->a[i] ^ 0x80u);
  }
  e->fn(g->m, n_run, g->k, a, g->a_stride, packed, c, g->c_stride, &g->rq);
  if (a != g->a) free(a);
  int ok = 1;
  for (size_t i = 0; i < g->m && ok; i++) {
    for (size_t j = 0; j < n_run; j++) {
      const int8_t got = c[i * g->c_stride + j], want = g->ref[i * g->n + j];
      if (got != want) {
        int32_t acc = g->bias[j];
        for (size_t kk = 0; kk < g->k; kk++)
          acc += ((int32_t)g->a[i * g->a_stride + kk] - g->zx) * (int32_t)g->w[j * g->k + kk];
        snprintf(why, why_len,
                 "m=%zu n=%zu (run %zu) k=%zu: C[%zu][%zu]=%d want %d (acc=%d mult=%d shift=%d zp=%d clamp=[%d,%d])",
                 g->m, g->n, n_run, g->k, i, j, got, want, acc, g->mult[j], g->shift[j], g->rq.zp_out, g->rq.qmin,
                 g->rq.qmax);
        ok = 0;
        break;
      }
    }
  }
  if (ok && !check_canary(c, g->m, g->c_stride, n_run)) {
    snprintf(why, why_len, "m=%zu n=%zu (run %zu) k=%zu: wrote past the columns (c_stride=%zu)", g->m, g->n, n_run,
             g->k, g->c_stride);
    ok = 0;
  }
  for (size_t j = n_run; ok && j < g->n; j++) { /* the last row's bytes past n_run too */
    if ((uint8_t)c[(g->m - 1) * g->c_stride + j] != CANARY) {
      snprintf(why, why_len, "m=%zu n=%zu (run %zu) k=%zu: wrote column %zu", g->m, g->n, n_run, g->k, j);
      ok = 0;
    }
  }
  free(c);
  return ok;
}

static int gemm_check(const struct gemm_entry* e, const struct gemm_case* g, char* why, size_t why_len) {
  void* packed = xmalloc(ek_qs8_gemm_packed_size(g->n, g->k, e->nr, e->kr));
  ek_qs8_gemm_pack(e->isa, e->nr, e->kr, g->n, g->k, g->w, g->bias, g->zx, packed);
  int ok = gemm_run(e, g, packed, g->n, why, why_len);
  if (ok && g->n > 1) ok = gemm_run(e, g, packed, 1 + (size_t)(rnd() % (g->n - 1)), why, why_len);
  free(packed);
  return ok;
}

/* The AVX2 flip equals the portable one on ragged rows, strided or one run, and writes nothing
 * past rows * k; a failure is a FAIL line (the flip is no listed kernel: a pass prints nothing). */
static void test_flip(uint32_t features) {
#if EK_ENABLE_AVX2
  if (!(features & EK_ISA_AVX2)) return;
  static const size_t rows_of[] = {1, 2, 3, 7};
  for (size_t r = 0; r < COUNT(rows_of); r++) {
    for (size_t k = 1; k <= 100; k++) {
      for (size_t pad = 0; pad <= 3; pad += 3) {
        const size_t rows = rows_of[r], stride = k + pad, n = rows * k;
        int8_t* src = xmalloc((rows - 1) * stride + k);
        int8_t* want = xmalloc(n + 64);
        int8_t* got = xmalloc(n + 64);
        fill_i8(src, (rows - 1) * stride + k, 0);
        memset(got, CANARY, n + 64);
        ek_qs8_flip(rows, k, src, stride, want);
        ek_qs8_flip__avx2(rows, k, src, stride, got);
        int bad = memcmp(got, want, n) != 0;
        for (size_t i = n; i < n + 64; i++) bad |= (uint8_t)got[i] != CANARY;
        if (bad) {
          printf("FAIL qs8-gemm ek_qs8_flip__avx2 isa=avx2: rows=%zu k=%zu stride=%zu\n", rows, k, stride);
          n_fail++;
          r = COUNT(rows_of);
          k = 100;
        }
        free(src);
        free(want);
        free(got);
        if (bad) break;
      }
    }
  }
#else
  (void)features;
#endif
}

static void test_gemm(uint32_t features, int quick) {
  test_flip(features);
  static const size_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 17};
  static const size_t ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 47, 48, 65};
  static const size_t ks[] = {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 15, 16, 17, 23, 24, 31, 32, 33, 63, 64, 100, 257};
  static const size_t big[][3] = {{9, 70, 1000}, {33, 130, 77}, {64, 64, 576}, {3, 16, 4096}};
  KERNEL_STATE(gemm_list);
  const size_t n_small = COUNT(ms) * COUNT(ns) * COUNT(ks);
  for (size_t c = 0; c < n_small + COUNT(big); c++) {
    size_t m, n, k;
    if (c < n_small) {
      m = ms[c % COUNT(ms)];
      n = ns[(c / COUNT(ms)) % COUNT(ns)];
      k = ks[c / (COUNT(ms) * COUNT(ns))];
      if (quick && (rnd() % 4) != 0) continue;
    } else {
      m = big[c - n_small][0];
      n = big[c - n_small][1];
      k = big[c - n_small][2];
    }
    struct gemm_case g;
    /* a third of the cases each: any weights, none -128 (the WN kernels run them too), 7-bit (W7 and WN) */
    static const uint32_t kinds[3] = {0, EK_ISA_WN, EK_ISA_W7 | EK_ISA_WN};
    const uint32_t bounds = kinds[rnd() % 3];
    gemm_case_make(&g, m, n, k, bounds);
    for (size_t e = 0; e < COUNT(gemm_list); e++) {
      if (((features | bounds) & gemm_list[e].isa) != gemm_list[e].isa || !ok[e]) continue;
      ok[e] = gemm_check(&gemm_list[e], &g, why[e], sizeof why[e]);
      ran[e]++;
    }
    gemm_case_free(&g);
  }
  for (size_t e = 0; e < COUNT(gemm_list); e++) {
    const struct gemm_entry* en = &gemm_list[e];
    char tile[64];
    snprintf(tile, sizeof tile, "tile=%zux%zuc%zu ", en->mr, en->nr, en->kr);
    report("qs8-gemm", en->name, en->isa, tile, features | EK_ISA_WEIGHT_BOUNDS, ok[e], ran[e], why[e]);
  }
}

/* ---- qs8-dwconv ---------------------------------------------------------------------------- */

static void test_dwconv(uint32_t features, int quick) {
  static const size_t chans[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 48, 64, 67, 100};
  static const size_t ksizes[] = {1, 2, 3, 4, 9, 25};
  static const size_t widths[] = {1, 2, 3, 5};
  KERNEL_STATE(dwconv_list);
  for (size_t ci = 0; ci < COUNT(chans); ci++) {
    for (size_t ki = 0; ki < COUNT(ksizes); ki++) {
      for (size_t wi = 0; wi < COUNT(widths); wi++) {
        if (quick && (rnd() % 3) != 0) continue;
        const size_t C = chans[ci], KS = ksizes[ki], OW = widths[wi];
        const int mode = (rnd() % 16 == 0) ? (int)(1 + rnd() % 2) : 0;
        const int32_t zx = mode ? -128 : rnd_range(-128, 127);
        /* input pixels: each its own exact-size allocation */
        const size_t n_pix = KS + OW;
        int8_t** pix = xmalloc(n_pix * sizeof(int8_t*));
        for (size_t i = 0; i < n_pix; i++) {
          pix[i] = xmalloc(C);
          fill_i8(pix[i], C, mode);
        }
        int8_t* zero = xmalloc(C);
        memset(zero, (int8_t)zx, C);
        const size_t step = KS + (rnd() % 2) * 2;
        const int8_t** ind = xmalloc((OW * step) * sizeof(int8_t*));
        for (size_t p = 0; p < OW; p++)
          for (size_t t = 0; t < step; t++)
            ind[p * step + t] = (rnd() % 8 == 0) ? zero : pix[(p + t) % n_pix];
        int8_t* w = xmalloc(KS * C);
        fill_i8(w, KS * C, mode);
        const uint32_t bounds = rnd() % 2 ? EK_ISA_WN : 0; /* half the cases: no weight is -128 (WN kernels run too) */
        if (bounds)
          for (size_t i = 0; i < KS * C; i++) w[i] = w[i] == -128 ? -127 : w[i];
        int32_t* bias = xmalloc(C * sizeof(int32_t));
        int32_t* mult = xmalloc(C * sizeof(int32_t));
        int32_t* shift = xmalloc(C * sizeof(int32_t));
        draw_multiplier_mode();
        for (size_t c = 0; c < C; c++) {
          const double acc_scale = 7400.0 * sqrt((double)KS);
          const int32_t bmax = rnd() % 8 ? (int32_t)acc_scale : 1 << 20;
          bias[c] = rnd_range(-bmax, bmax);
          make_multiplier(acc_scale, 1, &mult[c], &shift[c]);
        }
        struct ek_requant_params rq = {mult, shift, rnd_zp(), 0, 0};
        make_clamp(rq.zp_out, &rq.qmin, &rq.qmax);
        const size_t ostride = C + (rnd() % 2) * 3;
        int8_t* ref = xmalloc(OW * C);
        for (size_t p = 0; p < OW; p++) {
          for (size_t c = 0; c < C; c++) {
            int32_t acc = bias[c];
            for (size_t t = 0; t < KS; t++) acc += ((int32_t)ind[p * step + t][c] - zx) * (int32_t)w[t * C + c];
            ref[p * C + c] = ek_requant(acc, mult[c], shift[c], rq.zp_out, rq.qmin, rq.qmax);
            count_interior(ref[p * C + c], rq.qmin, rq.qmax);
          }
        }
        for (size_t e = 0; e < COUNT(dwconv_list); e++) {
          const struct dwconv_entry* en = &dwconv_list[e];
          if (((features | bounds) & en->isa) != en->isa || !ok[e]) continue;
          void* packed = xmalloc(ek_qs8_dwconv_packed_size(C, KS, en->cr));
          ek_qs8_dwconv_pack(en->isa, en->cr, C, KS, w, bias, zx, packed);
          const size_t osize = (OW - 1) * ostride + C;
          int8_t* out = xmalloc(osize);
          memset(out, CANARY, osize);
          en->fn(C, OW, KS, (const int8_t* const*)ind, step, packed, out, ostride, &rq);
          ran[e]++;
          for (size_t p = 0; p < OW && ok[e]; p++) {
            for (size_t c = 0; c < C; c++) {
              if (out[p * ostride + c] != ref[p * C + c]) {
                KERNEL_FAILS(e, "channels=%zu kernel=%zu width=%zu: out[%zu][%zu]=%d want %d", C, KS, OW, p, c,
                             out[p * ostride + c], ref[p * C + c]);
                break;
              }
            }
          }
          if (ok[e] && !check_canary(out, OW, ostride, C)) KERNEL_FAILS(e, "channels=%zu: wrote between pixels", C);
          free(out);
          free(packed);
        }
        free(ref);
        free(bias);
        free(mult);
        free(shift);
        free(w);
        free(ind);
        free(zero);
        for (size_t i = 0; i < n_pix; i++) free(pix[i]);
        free(pix);
      }
    }
  }
  for (size_t e = 0; e < COUNT(dwconv_list); e++) {
    const struct dwconv_entry* en = &dwconv_list[e];
    char tile[64];
    snprintf(tile, sizeof tile, "tile=c%zu ", en->cr);
    report("qs8-dwconv", en->name, en->isa, tile, features | EK_ISA_WEIGHT_BOUNDS, ok[e], ran[e], why[e]);
  }
}

/* ---- qs8-vadd / qs8-vmul ------------------------------------------------------------------ */

static const size_t elt_sizes[] = {0, 1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 100, 255, 1000};

static void make_add_params(struct ek_qs8_add_params* p) {
  p->a_zp = rnd_range(-128, 127);
  p->b_zp = rnd_range(-128, 127);
  p->out_zp = rnd_range(-128, 127);
  make_clamp(p->out_zp, &p->qmin, &p->qmax);
  if (rnd() % 3) { /* TFLite's derivation from three scales */
    const double sa = 0.001 + rnd_unit() * 0.1, sb = 0.001 + rnd_unit() * 0.1, sy = 0.002 + rnd_unit() * 0.2;
    const double twice = 2.0 * (sa > sb ? sa : sb);
    p->left_shift = 20;
    if (ek_quantize_multiplier(sa / twice, &p->a_multiplier, &p->a_shift) ||
        ek_quantize_multiplier(sb / twice, &p->b_multiplier, &p->b_shift) ||
        ek_quantize_multiplier(twice / ((double)(1 << 20) * sy), &p->out_multiplier, &p->out_shift)) {
      fprintf(stderr, "bad add scales\n");
      exit(2);
    }
  } else { /* anything the op's limits allow: inputs scale by < 1, so a' + b' fits int32 */
    p->left_shift = rnd() % 3 ? rnd_range(0, 22) : 0; /* 0 with 2^30 multipliers: ties */
    p->a_multiplier = rnd() % 4 ? rnd_range(1 << 30, INT32_MAX) : 1 << 30;
    p->b_multiplier = rnd() % 4 ? rnd_range(1 << 30, INT32_MAX) : 1 << 30;
    p->a_shift = rnd_range(-31, 0);
    p->b_shift = rnd_range(-31, 0);
    p->out_multiplier = rnd() % 4 ? rnd_range(1 << 30, INT32_MAX) : 1 << 30;
    p->out_shift = rnd_range(-31, 8);
  }
}

static int8_t add_ref(int8_t a, int8_t b, const struct ek_qs8_add_params* p) {
  const int32_t lift = (int32_t)1 << p->left_shift;
  const int32_t va = ek_mul_by_multiplier(((int32_t)a - p->a_zp) * lift, p->a_multiplier, p->a_shift);
  const int32_t vb = ek_mul_by_multiplier(((int32_t)b - p->b_zp) * lift, p->b_multiplier, p->b_shift);
  return ek_requant(va + vb, p->out_multiplier, p->out_shift, p->out_zp, p->qmin, p->qmax);
}

static void make_mul_params(struct ek_qs8_mul_params* p) {
  p->a_zp = rnd_range(-128, 127);
  p->b_zp = rnd_range(-128, 127);
  p->out_zp = rnd_range(-128, 127);
  make_clamp(p->out_zp, &p->qmin, &p->qmax);
  if (rnd() % 2) {
    const double real = (0.0005 + rnd_unit() * 0.01) * (0.0005 + rnd_unit() * 0.01) / (0.00001 + rnd_unit() * 0.001);
    if (ek_quantize_multiplier(real, &p->multiplier, &p->shift)) {
      p->multiplier = 1 << 30;
      p->shift = 0;
    }
  } else {
    p->multiplier = rnd() % 4 ? rnd_range(1 << 30, INT32_MAX) : 1 << 30;
    p->shift = rnd_range(-31, 20); /* left shifts up to saturation */
  }
}

static int8_t mul_ref(int8_t a, int8_t b, const struct ek_qs8_mul_params* p) {
  return ek_requant(((int32_t)a - p->a_zp) * ((int32_t)b - p->b_zp), p->multiplier, p->shift, p->out_zp, p->qmin,
                    p->qmax);
}

#define TEST_ELEMENTWISE(FAMILY, LIST, ENTRY, PARAMS, MAKE, REF)                                                \
  static void test_##ENTRY(uint32_t features, int quick) {                                                       \
    KERNEL_STATE(LIST);                                                                                          \
    const int reps = quick ? 6 : 40;                                                                             \
    for (int rep = 0; rep < reps; rep++) {                                                                       \
      for (size_t si = 0; si < COUNT(elt_sizes); si++) {                                                         \
        const size_t n = elt_sizes[si];                                                                          \
        struct PARAMS p;                                                                                         \
        MAKE(&p);                                                                                                \
        const int mode = rep % 8 == 7 ? 2 : 0;                                                                   \
        int8_t* a = xmalloc(n);                                                                                  \
        int8_t* b = xmalloc(n);                                                                                  \
        int8_t* ref = xmalloc(n);                                                                                \
        fill_i8(a, n, mode);                                                                                     \
        fill_i8(b, n, mode);                                                                                     \
        for (size_t i = 0; i < n; i++) {                                                                         \
          ref[i] = REF(a[i], b[i], &p);                                                                          \
          count_interior(ref[i], p.qmin, p.qmax);                                                                \
        }                                                                                                        \
        for (size_t e = 0; e < COUNT(LIST); e++) {                                                               \
          if ((features & LIST[e].isa) != LIST[e].isa || !ok[e]) continue;                                       \
          int8_t* y = xmalloc(n + 1);                                                                            \
          memset(y, CANARY, n + 1);                                                                              \
          LIST[e].fn(n, a, b, y, &p);                                                                            \
          int8_t* inplace = xmalloc(n);                                                                          \
          memcpy(inplace, a, n);                                                                                 \
          LIST[e].fn(n, inplace, b, inplace, &p); /* y == a */                                                   \
          ran[e]++;                                                                                              \
          for (size_t i = 0; i < n; i++) {                                                                       \
            if (y[i] != ref[i] || inplace[i] != ref[i]) {                                                        \
              KERNEL_FAILS(e, "n=%zu: y[%zu]=%d (in place %d) want %d (a=%d b=%d)", n, i, y[i], inplace[i],      \
                           ref[i], a[i], b[i]);                                                                  \
              break;                                                                                             \
            }                                                                                                    \
          }                                                                                                      \
          if (ok[e] && (uint8_t)y[n] != CANARY) KERNEL_FAILS(e, "n=%zu: wrote past the end", n);                 \
          free(inplace);                                                                                         \
          free(y);                                                                                               \
        }                                                                                                        \
        free(a);                                                                                                 \
        free(b);                                                                                                 \
        free(ref);                                                                                               \
      }                                                                                                          \
    }                                                                                                            \
    REPORT(FAMILY, LIST);                                                                                        \
  }

TEST_ELEMENTWISE("qs8-vadd", vadd_list, vadd, ek_qs8_add_params, make_add_params, add_ref)
TEST_ELEMENTWISE("qs8-vmul", vmul_list, vmul, ek_qs8_mul_params, make_mul_params, mul_ref)


/* ---- x8-lut / f32-qs8-cvt ------------------------------------------------------------------ */


/* Every length 0..100 and a large one (every byte value in each), random tables and the
 * identity; in place too. The reference is the plain table walk. */
/* LUT_CHANNEL's AVX2 rows equal the lookups one by one (every x, ragged channel counts) and write
 * nothing past the rows; the tables carry only EK_CLUT_PAD bytes of padding, as ops.c's copy.
 * A failure is a FAIL line (no listed kernel: a pass prints nothing). */
static void test_clut(uint32_t features) {
#if EK_ENABLE_AVX2
  if (!(features & EK_ISA_AVX2)) return;
  for (size_t C = 1; C <= 41; C++) {
    for (size_t rows = 1; rows <= 3; rows++) {
      const size_t n = rows * C;
      int8_t* tables = xmalloc(C * 256 + EK_CLUT_PAD);
      fill_i8(tables, C * 256 + EK_CLUT_PAD, 0);
      int8_t* x = xmalloc(n);
      for (size_t i = 0; i < n; i++) x[i] = (int8_t)(i % 3 == 0 ? (int)(i * 37 % 256) - 128 : rnd_range(-128, 127));
      if (n > 1) x[0] = 127, x[n - 1] = 127; /* the last entries: the gathers' padding */
      int8_t* got = xmalloc(n + 64);
      memset(got, CANARY, n + 64);
      ek_x8_clut__avx2(rows, C, x, got, tables);
      int bad = 0;
      for (size_t i = 0; i < n; i++) bad |= got[i] != tables[(i % C) * 256 + (size_t)(x[i] + 128)];
      for (size_t i = n; i < n + 64; i++) bad |= (uint8_t)got[i] != CANARY;
      free(tables);
      free(x);
      free(got);
      if (bad) {
        printf("FAIL x8-lut ek_x8_clut__avx2 isa=avx2: rows=%zu channels=%zu\n", rows, C);
        n_fail++;
        return;
      }
    }
  }
#else
  (void)features;
#endif
}

static void test_lut(uint32_t features, int quick) {
  test_clut(features);
  KERNEL_STATE(lut_list);
  const int reps = quick ? 3 : 12;
  for (int rep = 0; rep < reps; rep++) {
    uint8_t table[256];
    for (size_t i = 0; i < 256; i++) table[i] = rep == 0 ? (uint8_t)i : (uint8_t)rnd();
    for (size_t n = 0; n <= 101; n++) {
      const size_t len = n == 101 ? 4096 + 63 + (size_t)rep : n;
      uint8_t* x = xmalloc(len);
      uint8_t* ref = xmalloc(len);
      const size_t start = rnd() % 256;
      for (size_t i = 0; i < len; i++) x[i] = (uint8_t)(rep % 4 == 3 ? start + i : rnd()); /* runs cover all 256 */
      for (size_t i = 0; i < len; i++) {
        ref[i] = table[x[i]];
        count_interior((int8_t)ref[i], -128, 127);
      }
      for (size_t e = 0; e < COUNT(lut_list); e++) {
        if ((features & lut_list[e].isa) != lut_list[e].isa || !ok[e]) continue;
        uint8_t* y = xmalloc(len + 1);
        memset(y, CANARY, len + 1);
        lut_list[e].fn(len, x, y, table);
        uint8_t* inplace = xmalloc(len);
        memcpy(inplace, x, len);
        lut_list[e].fn(len, inplace, inplace, table);
        ran[e]++;
        for (size_t i = 0; i < len; i++)
          if (y[i] != ref[i] || inplace[i] != ref[i]) {
            KERNEL_FAILS(e, "n=%zu: y[%zu]=%u (in place %u) want %u (x=%u)", len, i, y[i], inplace[i], ref[i], x[i]);
            break;
          }
        if (ok[e] && y[len] != CANARY) KERNEL_FAILS(e, "n=%zu: wrote past the end", len);
        free(inplace);
        free(y);
      }
      free(x);
      free(ref);
    }
  }
  /* the byte values 0..255 in order under a random table, at every offset of a vector */
  for (size_t off = 0; off < 64; off++) {
    uint8_t table[256], x[320], ref[320];
    for (size_t i = 0; i < 256; i++) table[i] = (uint8_t)rnd();
    for (size_t i = 0; i < off + 256; i++) x[i] = (uint8_t)(i - off), ref[i] = table[x[i]];
    for (size_t e = 0; e < COUNT(lut_list); e++) {
      if ((features & lut_list[e].isa) != lut_list[e].isa || !ok[e]) continue;
      uint8_t y[320];
      lut_list[e].fn(off + 256, x, y, table);
      ran[e]++;
      if (memcmp(y, ref, off + 256) != 0) KERNEL_FAILS(e, "all byte values at offset %zu differ", off);
    }
  }
  REPORT("x8-lut", lut_list);
}

static int8_t cvt_ref(float v, const struct ek_f32_qs8_cvt_params* p) { /* nearbyint: ties to even */
  if (v != v) return (int8_t)p->zp;
  const float q = v / p->scale;
  const double r = nearbyint((double)q) + p->zp;
  return (int8_t)(r < -128 ? -128 : r > 127 ? 127 : r);
}

static float cvt_value(const struct ek_f32_qs8_cvt_params* p) {
  static const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 3.4e38f, -3.4e38f, 1e-45f, -1e-45f,
                               1.17549435e-38f, 16777216.0f, 4194304.5f, -8388607.0f};
  switch (rnd() % 8) {
    case 0: return edge[rnd() % COUNT(edge)];
    case 1: return ((float)rnd_range(-300, 300) + 0.5f) * p->scale; /* ties (exactly, when scale is a power of 2) */
    case 2: { /* any bit pattern */
      uint32_t b = (uint32_t)rnd();
      float f;
      memcpy(&f, &b, 4);
      return f;
    }
    default: return (float)((rnd_unit() * 2.0 - 1.0) * 300.0) * p->scale;
  }
}

static void test_cvt(uint32_t features, int quick) {
  KERNEL_STATE(cvt_list);
  const int reps = quick ? 3 : 20;
  for (int rep = 0; rep < reps; rep++) {
    for (size_t n = 0; n <= 101; n++) {
      const size_t len = n == 101 ? 4096 + 31 + (size_t)rep : n;
      struct ek_f32_qs8_cvt_params p;
      p.zp = rnd_range(-128, 127);
      p.scale = rnd() % 2 ? ldexpf(1.0f, rnd_range(-12, 2)) : (float)(1e-4 + rnd_unit() * 0.1);
      float* x = xmalloc(len * sizeof(float));
      int8_t* ref = xmalloc(len);
      for (size_t i = 0; i < len; i++) {
        x[i] = cvt_value(&p);
        ref[i] = cvt_ref(x[i], &p);
        count_interior(ref[i], -128, 127);
      }
      for (size_t e = 0; e < COUNT(cvt_list); e++) {
        if ((features & cvt_list[e].isa) != cvt_list[e].isa || !ok[e]) continue;
        int8_t* y = xmalloc(len + 1);
        memset(y, CANARY, len + 1);
        cvt_list[e].fn(len, x, y, &p);
        ran[e]++;
        for (size_t i = 0; i < len; i++)
          if (y[i] != ref[i]) {
            KERNEL_FAILS(e, "n=%zu: y[%zu]=%d want %d (x=%a scale=%a zp=%d)", len, i, y[i], ref[i], (double)x[i],
                         (double)p.scale, p.zp);
            break;
          }
        if (ok[e] && (uint8_t)y[len] != CANARY) KERNEL_FAILS(e, "n=%zu: wrote past the end", len);
        free(y);
      }
      free(x);
      free(ref);
    }
  }
  REPORT("f32-qs8-cvt", cvt_list);
}

/* ---- x8-transpose ----------------------------------------------------------------------------
 * Every rows x cols in 1..40 (whole 16 x 16 / 4 x 4 blocks, bands of 8 / 4 / 2 rows, strips of
 * 8 / 4 / 2 columns, one-by-one edges), with row strides wider than the rows (the gaps between
 * dst's rows keep their canaries) and with strides equal to them: dst equals the
 * element-by-element transpose. One vector path per arch (the baseline): a failure is a FAIL line. */
static void test_transpose(void) {
  for (int tight = 0; tight < 2; tight++) /* strides wider than the rows, or exactly them */
  for (size_t rows = 1; rows <= 40; rows++)
    for (size_t cols = 1; cols <= 40; cols++) {
      const size_t ss = cols + (tight ? 0 : 3), ds = rows + (tight ? 0 : 5);
      int8_t* a = xmalloc(rows * ss);
      int8_t* b = xmalloc(cols * ds);
      float* fa = xmalloc(rows * ss * sizeof(float));
      float* fb = xmalloc(cols * ds * sizeof(float));
      fill_i8(a, rows * ss, 0);
      for (size_t i = 0; i < rows * ss; i++) fa[i] = (float)a[i] + 0.25f * (float)(i % 4);
      memset(b, CANARY, cols * ds);
      for (size_t i = 0; i < cols * ds; i++) fb[i] = -1e30f;
      ek_x8_transpose(rows, cols, a, ss, b, ds);
      ek_x32_transpose(rows, cols, fa, ss, fb, ds);
      int bad = 0;
      for (size_t c = 0; c < cols; c++)
        for (size_t r = 0; r < ds; r++) {
          if (r < rows) {
            bad |= b[c * ds + r] != a[r * ss + c];
            bad |= fb[c * ds + r] != fa[r * ss + c];
          } else {
            bad |= (uint8_t)b[c * ds + r] != CANARY;
            bad |= fb[c * ds + r] != -1e30f;
          }
        }
      free(a);
      free(b);
      free(fa);
      free(fb);
      if (bad) {
        printf("FAIL x8-transpose ek_x8_transpose / ek_x32_transpose: rows=%zu cols=%zu tight=%d\n", rows, cols, tight);
        n_fail++;
        return;
      }
    }
}

int main(int argc, char** argv) {
  int quick = 0, run_all = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = 1;
    } else if (strcmp(argv[i], "--run-all") == 0) {
      run_all = 1;
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      rng_state = strtoull(argv[++i], NULL, 10);
    } else {
      fprintf(stderr, "usage: %s [--quick] [--seed N] [--run-all]\n", argv[0]);
      return 2;
    }
  }
  const uint32_t detected = ek_cpu_detect();
  char feats[128];
  printf("cpu features: %s\n", ek_cpu_feature_list(detected, feats, sizeof feats, " "));
  fflush(stdout);
  /* --run-all: run every kernel whatever the CPU says (an unsupported one dies with SIGILL:
   * the test that shows the skip is needed and the ISA's instructions really are used) */
  const uint32_t f = run_all ? ~0u : detected;
  test_transpose();
  void (*const tests[])(uint32_t, int) = {test_gemm, test_dwconv, test_vadd, test_vmul, test_lut, test_cvt};
  const char* const names[] = {"qs8-gemm", "qs8-dwconv", "qs8-vadd", "qs8-vmul", "x8-lut", "f32-qs8-cvt"};
  for (size_t t = 0; t < COUNT(tests); t++) {
    n_interior = n_outputs = 0;
    tests[t](f, quick);
    printf("INFO %s reference outputs: %zu, strictly inside [qmin, qmax]: %.1f%%\n", names[t], n_outputs,
           n_outputs ? 100.0 * (double)n_interior / (double)n_outputs : 0.0);
  }
  printf("%s: %d failed\n", n_fail ? "FAILED" : "OK", n_fail);
  return n_fail ? 1 : 0;
}
