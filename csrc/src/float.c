/* The float ops of the islands (docs/ekrt.md "Float islands"): what the lowering cannot run in
 * int8 runs in float32 between a DEQUANTIZE and a QUANTIZE. Plain C loops, no kernel family:
 * every value is computed in double and rounded once to float32, so results do not depend on
 * the ISA, the libm's float variants or the compiler's vectorization (+ - * / and sqrt
 * rounded from double are the float32 operations exactly; ekm_reference.py does the same). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "internal.h"

#define IN(k) (&m->tensors[op->in[k]])
#define OUTT (&m->tensors[op->out])

/* ---- shapes as 4 right-aligned dims (numpy broadcasting) ---- */

static void dims4(const struct ek_tensor* t, size_t d[4]) {
  uint32_t off = 4 - t->rank;
  for (uint32_t i = 0; i < 4; i++) d[i] = i < off ? 1 : t->dims[i - off];
}

/* element strides of t read as the output's 4 dims: 0 along a broadcast axis */
static void bstrides(const struct ek_tensor* t, size_t s[4]) {
  size_t d[4], st = 1;
  dims4(t, d);
  for (int i = 3; i >= 0; i--) {
    s[i] = d[i] == 1 ? 0 : st;
    st *= d[i];
  }
}

/* a binary op (F_BINARY, F_MATMUL) over the output's 4 dims: a and b read through their strides */
struct fbin_view {
  const float *a, *b;
  float* y;
  size_t d[4], sa[4], sb[4]; /* the output's dims; a's and b's element strides */
};
static struct fbin_view fbin_view(const struct ekrt_model* m, const struct ek_op* op) {
  const struct ek_tensor *a = IN(0), *b = IN(1), *y = OUTT;
  struct fbin_view v = {a->data, b->data, y->data, {0}, {0}, {0}};
  dims4(y, v.d);
  bstrides(a, v.sa);
  bstrides(b, v.sb);
  return v;
}

static float param_f(const struct ek_op* op, int i) {
  float f;
  memcpy(&f, &op->p[i], sizeof f);
  return f;
}

/* a float op reads the arena, a constant or a graph input (an integer input such as token or
 * byte ids comes in as float32, exact up to 2^24) */
static int need_f32_act(struct ek_check* o, uint32_t k, const char* what) {
  return ek_need_in(o, k, what, EKM_F32, ST_ARENA | ST_CONST | ST_IO, -1);
}

static int need_finite_param(struct ek_check* o, int i, const char* what) {
  float f;
  memcpy(&f, &o->op->p[i], sizeof f);
  if (!isfinite(f)) OFAIL("params[%d] (%s) is not a finite float (bits 0x%08x)", i, what, (unsigned)o->op->p[i]);
  return 0;
}

/* ---- F_BINARY: y = a <op> b, numpy broadcasting (rank <= 4); the output may be larger than
 * the inputs' broadcast shape along axes where both are 1 (ONNX Expand: x * 1 into its shape) ---- */

enum { FB_ADD, FB_SUB, FB_MUL, FB_DIV, FB_POW, FB_MAX, FB_MIN, FB_EQUAL, FB_LAST = FB_EQUAL };

static double fbin(int k, double a, double b) {
  switch (k) {
    case FB_ADD: return a + b;
    case FB_SUB: return a - b;
    case FB_MUL: return a * b;
    case FB_DIV: return a / b;
    case FB_POW: return pow(a, b);
    case FB_MAX: return isnan(a) || isnan(b) ? NAN : a > b ? a : b;
    case FB_MIN: return isnan(a) || isnan(b) ? NAN : a < b ? a : b;
    default: return a == b ? 1.0 : 0.0; /* FB_EQUAL: ONNX Equal's bool as 1 / 0 */
  }
}

/* One innermost row of n outputs for an operation E(a, b) in float: for +, -, *, / the float
 * result equals the double one rounded once (double's 53 bits are more than 2 * 24 + 2, so the
 * second rounding never changes it), and max, min, == are exact, so these loops keep fbin's
 * values while the compiler vectorizes them: the contiguous and the broadcast-scalar cases get a
 * loop each, any other stride the strided one. */
#define FBIN_ROW(E)                                                                  \
  do {                                                                               \
    if (sa3 == 1 && sb3 == 1) {                                                      \
      for (size_t i = 0; i < n; i++) {                                               \
        const float a = ra[i], b = rb[i];                                            \
        py[i] = (E);                                                                 \
      }                                                                              \
    } else if (sa3 == 1 && sb3 == 0) {                                               \
      const float b = rb[0];                                                         \
      for (size_t i = 0; i < n; i++) {                                               \
        const float a = ra[i];                                                       \
        py[i] = (E);                                                                 \
      }                                                                              \
    } else if (sa3 == 0 && sb3 == 1) {                                               \
      const float a = ra[0];                                                         \
      for (size_t i = 0; i < n; i++) {                                               \
        const float b = rb[i];                                                       \
        py[i] = (E);                                                                 \
      }                                                                              \
    } else {                                                                         \
      for (size_t i = 0; i < n; i++) {                                               \
        const float a = ra[i * sa3], b = rb[i * sb3];                                \
        py[i] = (E);                                                                 \
      }                                                                              \
    }                                                                                \
  } while (0)

static void fbin_row(int k, const float* ra, size_t sa3, const float* rb, size_t sb3, float* py, size_t n) {
  switch (k) {
    case FB_ADD: FBIN_ROW(a + b); break;
    case FB_SUB: FBIN_ROW(a - b); break;
    case FB_MUL: FBIN_ROW(a * b); break;
    case FB_DIV: FBIN_ROW(a / b); break;
    case FB_MAX: FBIN_ROW(isnan(a) || isnan(b) ? NAN : a > b ? a : b); break;
    case FB_MIN: FBIN_ROW(isnan(a) || isnan(b) ? NAN : a < b ? a : b); break;
    case FB_EQUAL: FBIN_ROW(a == b ? 1.0f : 0.0f); break;
    default: /* FB_POW: in double, as fbin */
      for (size_t i = 0; i < n; i++) py[i] = (float)fbin(k, ra[i * sa3], rb[i * sb3]);
  }
}

/* rows [r0, r1) of the output's d[0] * d[1] * d[2] rows of d[3] elements */
static void fbinary_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct fbin_view v = fbin_view(m, op);
  const size_t *d = v.d, *sa = v.sa, *sb = v.sb;
  const int k = op->p[0];
  size_t i2 = r0 % d[2], i1 = r0 / d[2] % d[1], i0 = r0 / d[2] / d[1];
  for (size_t r = r0; r < r1; r++) {
    const float* ra = v.a + i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
    const float* rb = v.b + i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
    fbin_row(k, ra, sa[3], rb, sb[3], v.y + r * d[3], d[3]);
    if (++i2 == d[2]) {
      i2 = 0;
      if (++i1 == d[1]) i1 = 0, i0++;
    }
  }
}

void ek_run_fbinary(struct ekrt_model* m, struct ek_op* op) {
  const struct fbin_view v = fbin_view(m, op);
  ek_for_rows(m, op, v.d[0] * v.d[1] * v.d[2], v.d[3], fbinary_rows);
}

int ek_check_fbinary(struct ek_check* o) {
  TRY(need_f32_act(o, 0, "a"));
  TRY(need_f32_act(o, 1, "b"));
  TRY(ek_need_out(o, EKM_F32, ST_ARENA, -1));
  TRY(ek_need_param(o, 0, "operation", 0, FB_LAST));
  const struct ek_tensor *a = ek_in(o, 0), *b = ek_in(o, 1), *y = ek_out(o);
  if (a->rank > y->rank || b->rank > y->rank) OFAIL("inputs have rank %u and %u, more than the output's %u", a->rank, b->rank, y->rank);
  size_t da[4], db[4], dy[4];
  dims4(a, da);
  dims4(b, db);
  dims4(y, dy);
  for (int i = 0; i < 4; i++)
    if ((da[i] != 1 && da[i] != dy[i]) || (db[i] != 1 && db[i] != dy[i]))
      OFAIL("shapes do not broadcast: axis %d (from the right: %d) has a %zu, b %zu, output %zu", i, 3 - i, da[i], db[i], dy[i]);
  return ek_need_unused_zero(o, 0x1);
}

/* ---- F_UNARY: y = f(x) ---- */

enum {
  FU_SIGMOID, FU_TANH, FU_EXP, FU_LOG, FU_SQRT, FU_RECIPROCAL, FU_NEG, FU_ABS, FU_RELU, FU_ERF,
  FU_HARDSIGMOID, FU_HARDSWISH, FU_SOFTPLUS, FU_LEAKYRELU, FU_GELU, FU_LAST = FU_GELU
};

static double funa(int k, double x, double alpha, double beta) {
  switch (k) {
    case FU_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case FU_TANH: return tanh(x);
    case FU_EXP: return exp(x);
    case FU_LOG: return log(x);
    case FU_SQRT: return sqrt(x);
    case FU_RECIPROCAL: return 1.0 / x;
    case FU_NEG: return -x;
    case FU_ABS: return fabs(x);
    case FU_RELU: return x > 0 || isnan(x) ? x : 0.0;
    case FU_ERF: return erf(x);
    case FU_HARDSIGMOID: return fmax(0.0, fmin(1.0, alpha * x + beta));
    case FU_HARDSWISH: return x * fmax(0.0, fmin(1.0, x / 6.0 + 0.5));
    case FU_SOFTPLUS: return x > 30 ? x : log1p(exp(x));
    case FU_LEAKYRELU: return x >= 0 ? x : alpha * x;
    default: return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); /* FU_GELU, the exact form */
  }
}

static void unary_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const float* x = IN(0)->data;
  float* y = OUTT->data;
  const int k = op->p[0];
  const double alpha = param_f(op, 1), beta = param_f(op, 2);
  size_t end = ek_min_sz(r1 * 1024, IN(0)->elems);
  for (size_t i = r0 * 1024; i < end; i++) y[i] = (float)funa(k, x[i], alpha, beta);
}

void ek_run_funary(struct ekrt_model* m, struct ek_op* op) {
  ek_for_rows(m, op, (IN(0)->elems + 1023) / 1024, 1024, unary_rows);
}

int ek_check_funary(struct ek_check* o) {
  TRY(need_f32_act(o, 0, "x"));
  TRY(ek_need_out(o, EKM_F32, ST_ARENA, -1));
  TRY(ek_need_same_dims_out(o, 0));
  TRY(ek_need_param(o, 0, "operation", 0, FU_LAST));
  const int k = o->op->p[0];
  uint32_t used = 0x1;
  if (k == FU_HARDSIGMOID || k == FU_LEAKYRELU) {
    TRY(need_finite_param(o, 1, "alpha"));
    used |= P(1);
  }
  if (k == FU_HARDSIGMOID) {
    TRY(need_finite_param(o, 2, "beta"));
    used |= P(2);
  }
  return ek_need_unused_zero(o, used);
}

/* ---- F_REDUCE: mean / sum / max over the axes of a bitmask; the output keeps them as 1s ---- */

/* The largest of a row of n floats, 8 lanes at a time (SSE2 / NEON, each arch's baseline);
 * 0 when the row holds a NaN or its largest value is a zero: which one the loop in
 * ek_run_freduce keeps then (the first NaN; -0 or +0) depends on the order, and the caller
 * takes that loop. Otherwise the largest value is one number whatever the order. */
static int row_max(const float* p, size_t n, float* out) {
  size_t i = 0;
  float mx = -INFINITY;
  int nan = 0;
#if defined(__SSE2__)
  __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, bad = _mm_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(p + i), b = _mm_loadu_ps(p + i + 4);
    m0 = _mm_max_ps(a, m0);
    m1 = _mm_max_ps(b, m1);
    bad = _mm_or_ps(bad, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(m0, m1));
  for (int k = 0; k < 4; k++) mx = lanes[k] > mx ? lanes[k] : mx;
  nan = _mm_movemask_ps(bad) != 0;
#elif defined(__ARM_NEON) && defined(__aarch64__)
  float32x4_t m0 = vdupq_n_f32(-INFINITY), m1 = m0;
  uint32x4_t ok = vdupq_n_u32(~0u);
  for (; i + 8 <= n; i += 8) {
    const float32x4_t a = vld1q_f32(p + i), b = vld1q_f32(p + i + 4);
    m0 = vmaxq_f32(a, m0);
    m1 = vmaxq_f32(b, m1);
    ok = vandq_u32(ok, vandq_u32(vceqq_f32(a, a), vceqq_f32(b, b)));
  }
  mx = vmaxvq_f32(vmaxq_f32(m0, m1));
  nan = vminvq_u32(ok) == 0;
#endif
  for (; i < n; i++) {
    mx = p[i] > mx ? p[i] : mx;
    nan |= p[i] != p[i];
  }
  *out = mx;
  return !nan && mx != 0.0f;
}

void ek_run_freduce(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  size_t d[4], sy[4];
  dims4(x, d);
  bstrides(y, sy);
  double* acc = op->state;
  const int max = op->p[0] == 2;
  for (size_t i = 0; i < y->elems; i++) acc[i] = max ? -INFINITY : 0.0;
  const float* px = x->data;
  for (size_t i0 = 0; i0 < d[0]; i0++) /* in the input's order: every output's sum runs the same way */
    for (size_t i1 = 0; i1 < d[1]; i1++)
      for (size_t i2 = 0; i2 < d[2]; i2++) {
        double* row = acc + i0 * sy[0] + i1 * sy[1] + i2 * sy[2];
        float mx;
        if (max && sy[3] == 0 && row_max(px, d[3], &mx)) { /* the innermost axis reduced: a row's max */
          if (!isnan(*row) && mx > *row) *row = mx;     /* as the loop's: the first of equal values stays */
          px += d[3];
          continue;
        }
        for (size_t i3 = 0; i3 < d[3]; i3++, px++) {
          double* a = &row[i3 * sy[3]];
          if (!max) *a += *px;
          else if (*px > *a || isnan(*px)) *a = isnan(*a) ? *a : *px; /* NaN wins, as numpy's max */
        }
      }
  const double n = (double)x->elems / (double)y->elems;
  float* py = y->data;
  for (size_t i = 0; i < y->elems; i++) py[i] = (float)(op->p[0] == 0 ? acc[i] / n : acc[i]);
}

int ek_prepare_freduce(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)data;
  (void)err;
  (void)err_len;
  op->state = malloc(OUTT->elems * sizeof(double));
  return op->state ? 0 : EKRT_ENOMEM;
}

int ek_check_freduce(struct ek_check* o) {
  TRY(need_f32_act(o, 0, "x"));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  TRY(ek_need_out(o, EKM_F32, ST_ARENA, (int)x->rank));
  TRY(ek_need_param(o, 0, "kind", 0, 2));
  TRY(ek_need_param(o, 1, "axes", 1, (1 << x->rank) - 1));
  for (uint32_t a = 0; a < x->rank; a++) {
    uint32_t want = (o->op->p[1] >> a) & 1 ? 1 : x->dims[a];
    if (y->dims[a] != want) OFAIL("output dims[%u] is %u, the axes make %u", a, y->dims[a], want);
  }
  return ek_need_unused_zero(o, 0x3);
}

/* ---- F_MATMUL: [..., M, K] x [..., K, N] -> [..., M, N], batch dims broadcast, rank 2..4 ---- */

void ek_run_fmatmul(struct ekrt_model* m, struct ek_op* op) {
  const struct fbin_view v = fbin_view(m, op); /* batch axes 0, 1 broadcast; a [M, K] x b [K, N] */
  const struct ek_tensor* a = IN(0);
  const size_t M = v.d[2], N = v.d[3], K = a->dims[a->rank - 1];
  float* py = v.y;
  for (size_t i0 = 0; i0 < v.d[0]; i0++)
    for (size_t i1 = 0; i1 < v.d[1]; i1++) {
      const float* A = v.a + i0 * v.sa[0] + i1 * v.sa[1];
      const float* B = v.b + i0 * v.sb[0] + i1 * v.sb[1];
      for (size_t i = 0; i < M; i++)
        for (size_t j = 0; j < N; j++) {
          double acc = 0.0;
          for (size_t k = 0; k < K; k++) acc += (double)A[i * K + k] * (double)B[k * N + j];
          *py++ = (float)acc;
        }
    }
}

int ek_check_fmatmul(struct ek_check* o) {
  TRY(need_f32_act(o, 0, "a"));
  TRY(need_f32_act(o, 1, "b"));
  TRY(ek_need_out(o, EKM_F32, ST_ARENA, -1));
  const struct ek_tensor *a = ek_in(o, 0), *b = ek_in(o, 1), *y = ek_out(o);
  if (a->rank < 2 || b->rank < 2 || y->rank < 2 || a->rank > y->rank || b->rank > y->rank)
    OFAIL("ranks are a %u, b %u, output %u: need 2..4 and no input above the output's", a->rank, b->rank, y->rank);
  size_t da[4], db[4], dy[4];
  dims4(a, da);
  dims4(b, db);
  dims4(y, dy);
  if (da[3] != db[2] || dy[2] != da[2] || dy[3] != db[3])
    OFAIL("[.., %zu, %zu] x [.., %zu, %zu] does not give [.., %zu, %zu]", da[2], da[3], db[2], db[3], dy[2], dy[3]);
  for (int i = 0; i < 2; i++)
    if ((da[i] != 1 && da[i] != dy[i]) || (db[i] != 1 && db[i] != dy[i]) || dy[i] != (da[i] == 1 ? db[i] : da[i]))
      OFAIL("batch axis %d: a %zu, b %zu, output %zu do not broadcast", i, da[i], db[i], dy[i]);
  if (da[3] > EK_MAX_GEMM_K) OFAIL("K is %zu, more than %u", da[3], EK_MAX_GEMM_K);
  return ek_need_unused_zero(o, 0);
}

/* ---- F_SOFTMAX over the last axis: exp(x - max) / sum, in double ---- */

static void fsoftmax_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct ek_tensor* x = IN(0);
  size_t n = x->dims[x->rank - 1];
  const float* src = x->data;
  float* dst = OUTT->data;
  for (size_t r = r0; r < r1; r++) {
    const float* row = src + r * n;
    float* out = dst + r * n;
    double mx = row[0], sum = 0.0;
    for (size_t i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    for (size_t i = 0; i < n; i++) sum += exp((double)row[i] - mx);
    for (size_t i = 0; i < n; i++) out[i] = (float)(exp((double)row[i] - mx) / sum);
  }
}

void ek_run_fsoftmax(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* x = IN(0);
  size_t n = x->dims[x->rank - 1];
  ek_for_rows(m, op, x->elems / n, n * 32, fsoftmax_rows);
}

int ek_check_fsoftmax(struct ek_check* o) {
  TRY(need_f32_act(o, 0, "x"));
  TRY(ek_need_out(o, EKM_F32, ST_ARENA, -1));
  if (ek_in(o, 0)->rank < 1) OFAIL0("input must have rank >= 1");
  TRY(ek_need_same_dims_out(o, 0));
  return ek_need_unused_zero(o, 0);
}
