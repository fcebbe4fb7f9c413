/* The ops that are not kernel families (docs/ekrt.md "Ops"), and ADD/MUL through the
 * qs8-vadd / qs8-vmul kernels. Every op here computes each output element the same way on
 * any thread, so results never depend on the thread count. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "edgekit/requant.h"
#include "internal.h"


#define IN(k) (&m->tensors[op->in[k]])
#define OUTT (&m->tensors[op->out])

static int8_t clamp8(int32_t v) { return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); }

/* Tasks over rows of an op: ctx holds the op; `rows` rows are cut into chunks. */
struct row_job {
  struct ekrt_model* m;
  struct ek_op* op;
  size_t rows, chunk;
  void (*fn)(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1);
};
static void row_task(void* ctx, size_t i, int thread) {
  (void)thread;
  struct row_job* j = ctx;
  size_t r0 = i * j->chunk, r1 = ek_min_sz(r0 + j->chunk, j->rows);
  j->fn(j->m, j->op, r0, r1);
}
/* split `rows` rows of `row_cost` elements each into tasks of >= ~16K elements */
void ek_for_rows(struct ekrt_model* m, struct ek_op* op, size_t rows, size_t row_cost,
                 void (*fn)(struct ekrt_model*, struct ek_op*, size_t, size_t)) {
  size_t chunk = row_cost >= 16384 ? 1 : 16384 / (row_cost ? row_cost : 1);
  if (chunk > rows) chunk = rows ? rows : 1;
  struct row_job j = {m, op, rows, chunk, fn};
  size_t n = (rows + chunk - 1) / chunk;
  if (n < 2) {
    fn(m, op, 0, rows);
    return;
  }
  ek_parallel_for(m, op, n, row_task, NULL, &j);
}

/* ---- QUANTIZE / DEQUANTIZE (rows: N*H for the layout-changing 4-D case, else chunks) ---- */

/* ONNX QuantizeLinear through the f32-qs8-cvt kernel (kernels.h: float32 divide, round half
 * to even, NaN -> zp, saturate) */
static void quantize_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  const float* src = x->data;
  int8_t* dst = y->data;
  const struct ek_f32_qs8_cvt_params p = {y->scale, y->zp};
  const ek_f32_qs8_cvt_fn cvt = ek_kernels()->cvt;
  if (op->p[0]) { /* x [N,C,H,W] -> y [N,H,W,C]; a row is one (n, h) */
    size_t C = x->dims[1], H = x->dims[2], W = x->dims[3];
    for (size_t r = r0; r < r1; r++) {
      size_t n = r / H, h = r % H;
      int8_t* out = dst + r * W * C;
      for (size_t w0 = 0; w0 < W; w0 += 256) { /* quantize contiguously, then interleave */
        int8_t tmp[4][256];
        size_t nw = ek_min_sz(256, W - w0);
        for (size_t c0 = 0; c0 < C; c0 += 4) {
          size_t nc = ek_min_sz(4, C - c0);
          for (size_t c = 0; c < nc; c++) cvt(nw, src + ((n * C + c0 + c) * H + h) * W + w0, tmp[c], &p);
          int8_t* o = out + w0 * C + c0;
          if (nc == 3 && C == 3) /* RGB, the common input: vector interleave */
            ek_x8_transpose(3, nw, tmp[0], 256, o, 3);
          else if (nc == 3)
            for (size_t w = 0; w < nw; w++, o += C) o[0] = tmp[0][w], o[1] = tmp[1][w], o[2] = tmp[2][w];
          else
            for (size_t c = 0; c < nc; c++)
              for (size_t w = 0; w < nw; w++) o[w * C + c] = tmp[c][w];
        }
      }
    }
  } else {
    size_t end = ek_min_sz(r1 * 1024, x->elems);
    cvt(end - r0 * 1024, src + r0 * 1024, dst + r0 * 1024, &p);
  }
}

static void dequantize_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  const int8_t* src = x->data;
  float* dst = y->data;
  const float s = x->scale;
  const int32_t zp = x->zp;
  if (op->p[0]) { /* x [N,H,W,C] -> y [N,C,H,W]; a row is one (n, h); writes contiguous along W */
    size_t H = x->dims[1], W = x->dims[2], C = x->dims[3];
    for (size_t r = r0; r < r1; r++) {
      size_t n = r / H, h = r % H;
      const int8_t* in = src + r * W * C;
      for (size_t c = 0; c < C; c++) {
        float* out = dst + ((n * C + c) * H + h) * W;
        for (size_t w = 0; w < W; w++) out[w] = (float)(in[w * C + c] - zp) * s;
      }
    }
  } else {
    size_t end = ek_min_sz(r1 * 1024, x->elems);
    for (size_t i = r0 * 1024; i < end; i++) dst[i] = (float)(src[i] - zp) * s;
  }
}

/* a row of the layout change is one (n, h): x's H is dims[2] in NCHW (QUANTIZE), dims[1] in NHWC */
static void run_edge(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* x = IN(0);
  const int q = op->type == EKM_QUANTIZE;
  void (*rows)(struct ekrt_model*, struct ek_op*, size_t, size_t) = q ? quantize_rows : dequantize_rows;
  if (op->p[0])
    ek_for_rows(m, op, (size_t)x->dims[0] * x->dims[q ? 2 : 1], (size_t)x->dims[q ? 1 : 2] * x->dims[3], rows);
  else
    ek_for_rows(m, op, (x->elems + 1023) / 1024, 1024, rows);
}

/* QUANTIZE: a float tensor (a graph input, or a float island's value) -> int8 (NCHW -> NHWC with
 * params[0]); DEQUANTIZE: the reverse, to a graph output or to a float island */
static int check_edge(struct ek_check* o) {
  const int q = o->op->type == EKM_QUANTIZE;
  TRY(ek_need_in(o, 0, "x", q ? EKM_F32 : EKM_I8, q ? ST_IO | ST_ARENA : ST_ARENA, -1));
  TRY(ek_need_out(o, q ? EKM_I8 : EKM_F32, q ? ST_ARENA : ST_IO | ST_ARENA, -1));
  TRY(ek_need_param(o, 0, q ? "nchw_to_nhwc" : "nhwc_to_nchw", 0, 1));
  const uint32_t io = q ? o->op->in[0] : o->op->out;
  if (o->t[io].storage == EKM_IO && o->role[io] != (q ? 1 : 2))
    OFAIL("%s (tensor %u) is not a graph %s", q ? "input" : "output", io, q ? "input" : "output");
  const struct ek_tensor *f = q ? ek_in(o, 0) : ek_out(o), *i = q ? ek_out(o) : ek_in(o, 0); /* float, int8 */
  if (!o->op->p[0]) TRY(ek_need_same_dims_out(o, 0));
  else if (f->rank != 4 || i->rank != 4 || i->dims[0] != f->dims[0] || i->dims[1] != f->dims[2] || i->dims[2] != f->dims[3] ||
           i->dims[3] != f->dims[1])
    OFAIL("%s needs a rank-4 %s input and a %s output", q ? "nchw_to_nhwc" : "nhwc_to_nchw", q ? "[N,C,H,W]" : "[N,H,W,C]",
          q ? "[N,H,W,C]" : "[N,C,H,W]");
  return ek_need_unused_zero(o, 0x1);
}

/* ---- const int8 activations (an Add's operand, a LUT's table) are copied at load ---- */

static int own_const_inputs(struct ekrt_model* m, struct ek_op* op, const uint8_t* data) {
  for (uint32_t k = 0; k < op->n_in; k++) {
    struct ek_tensor* t = &m->tensors[op->in[k]];
    if (t->storage != EKM_CONST || t->data) continue;
    void* p = malloc(t->bytes + EK_SLACK);
    if (!p) return EKRT_ENOMEM;
    memcpy(p, data + t->offset, t->bytes);
    t->data = p;
    m->weights_bytes += t->bytes;
  }
  return 0;
}

static int own_const_inputs_prepare(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  return own_const_inputs(m, op, data);
}

/* ---- ADD / MUL ---- */

struct binary_state {
  struct ek_qs8_add_params add;
  struct ek_qs8_mul_params mul;
  ek_qs8_vadd_fn vadd;
  ek_qs8_vmul_fn vmul;
  size_t inner; /* elements per call: all, or C when b broadcasts over pixels */
};

static void binary_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct binary_state* s = op->state;
  const int8_t *a = IN(0)->data, *b = IN(1)->data;
  int8_t* y = OUTT->data;
  size_t inner = s->inner;
  int bcast = IN(1)->elems != IN(0)->elems;
  for (size_t r = r0; r < r1; r++) {
    const int8_t* br = bcast ? b : b + r * inner;
    if (op->type == EKM_ADD)
      s->vadd(inner, a + r * inner, br, y + r * inner, &s->add);
    else
      s->vmul(inner, a + r * inner, br, y + r * inner, &s->mul);
  }
}

static void run_binary(struct ekrt_model* m, struct ek_op* op) {
  const struct binary_state* s = op->state;
  ek_for_rows(m, op, IN(0)->elems / s->inner, s->inner, binary_rows);
}

static int prepare_binary(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  TRY(own_const_inputs(m, op, data));
  const struct ek_kernels* k = ek_kernels();
  struct binary_state* s = calloc(1, sizeof *s);
  if (!s) return EKRT_ENOMEM;
  op->state = s;
  const struct ek_tensor *a = IN(0), *b = IN(1), *y = OUTT;
  s->vadd = k->vadd;
  s->vmul = k->vmul;
  if (b->elems != a->elems) {
    s->inner = b->elems; /* [1,1,1,C] over an [N,H,W,C] a */
  } else {
    /* whole tensor, cut in rows of up to 4096 for threads */
    s->inner = a->elems;
    for (size_t d = 4096; d >= 1024; d /= 2)
      if (a->elems > d && a->elems % d == 0) {
        s->inner = d;
        break;
      }
  }
  s->add = (struct ek_qs8_add_params){a->zp, b->zp, op->p[0], op->p[1], op->p[2], op->p[3], op->p[4],
                                      op->p[5], op->p[6], y->zp, op->p[11], op->p[12]};
  s->mul = (struct ek_qs8_mul_params){a->zp, b->zp, op->p[0], op->p[1], y->zp, op->p[11], op->p[12]};
  return 0;
}

/* b has a's shape, or broadcasts over a's innermost axis: [1,...,1,C] of a's rank */
static int check_binary_shapes(struct ek_check* o) {
  const struct ek_tensor *a = ek_in(o, 0), *b = ek_in(o, 1);
  TRY(ek_need_same_dims_out(o, 0));
  if (ek_same_dims(a, b)) return 0;
  int ok = a->rank >= 1 && b->rank == a->rank && b->dims[a->rank - 1] == a->dims[a->rank - 1];
  for (uint32_t d = 0; ok && d + 1 < b->rank; d++) ok = b->dims[d] == 1;
  if (ok) return 0;
  OFAIL("input b (tensor %u) must have a's shape or be [1,...,1,C] with a's innermost C = %u", o->op->in[1],
        a->rank ? a->dims[a->rank - 1] : 0);
}

static int check_add(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "a", EKM_I8, ST_ACT, -1));
  TRY(ek_need_in(o, 1, "b", EKM_I8, ST_ACT, -1));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  TRY(check_binary_shapes(o));
  TRY(ek_need_multiplier(o, 0, "a multiplier", 0));
  TRY(ek_need_multiplier(o, 2, "b multiplier", 0));
  TRY(ek_need_param(o, 4, "left_shift", 0, EK_ADD_MAX_LEFT_SHIFT));
  TRY(ek_need_multiplier(o, 5, "output multiplier", EK_SHIFT_MAX));
  TRY(ek_need_act(o));
  return ek_need_unused_zero(o, 0x7F | P(11) | P(12));
}

static int check_mul(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "a", EKM_I8, ST_ACT, -1));
  TRY(ek_need_in(o, 1, "b", EKM_I8, ST_ACT, -1));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  TRY(check_binary_shapes(o));
  TRY(ek_need_multiplier(o, 0, "multiplier", EK_SHIFT_MAX));
  TRY(ek_need_act(o));
  return ek_need_unused_zero(o, 0x3 | P(11) | P(12));
}

/* ---- CONCAT: per input a 256-entry requantization table, or a copy when it is the identity.
 * The tables are in the x8-lut kernel's layout (indexed by the byte's unsigned value) and run
 * through it: AVX2 / NEON lookups instead of one table load per byte (a scalar loop here was
 * 13 % of nudenet-320n's time at 1 thread). ---- */

struct concat_state {
  size_t outer;
  size_t inner[EKM_MAX_OP_INPUTS]; /* bytes of input k per outer index */
  uint8_t* table[EKM_MAX_OP_INPUTS]; /* NULL: same scale and zero point, copy */
};

/* A row's slice of one input: short ones (the channels of a pixel, in NHWC) are 16-byte moves
 * inline, not a call to memcpy per pixel. */
static inline void concat_copy(int8_t* dst, const int8_t* src, size_t n) {
  if (n >= 256) {
    memcpy(dst, src, n);
    return;
  }
  for (; n >= 16; n -= 16, dst += 16, src += 16) memcpy(dst, src, 16);
  for (; n; n--) *dst++ = *src++;
}

#define CONCAT_BLOCK 4096 /* bytes of an input requantized at once, on the stack, before the copies */

static void concat_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct concat_state* s = op->state;
  size_t out_inner = 0;
  for (uint32_t k = 0; k < op->n_in; k++) out_inner += s->inner[k];
  int8_t* y = OUTT->data;
  size_t at = 0; /* input k's offset in an output row */
  for (uint32_t k = 0; k < op->n_in; k++) {
    const size_t w = s->inner[k];
    const int8_t* x = (const int8_t*)IN(k)->data;
    if (!s->table[k]) {
      for (size_t r = r0; r < r1; r++) concat_copy(y + r * out_inner + at, x + r * w, w);
    } else if (w >= CONCAT_BLOCK / 16) { /* long rows: the lookup straight into the output */
      for (size_t r = r0; r < r1; r++)
        ek_kernels()->lut(w, (const uint8_t*)(x + r * w), (uint8_t*)(y + r * out_inner + at), s->table[k]);
    } else { /* short rows: a block of them looked up in one call (the kernel's setup once), then copied */
      int8_t buf[CONCAT_BLOCK];
      const size_t rows = CONCAT_BLOCK / w;
      for (size_t b = r0; b < r1; b += rows) {
        const size_t n = ek_min_sz(rows, r1 - b);
        ek_kernels()->lut(n * w, (const uint8_t*)(x + b * w), (uint8_t*)buf, s->table[k]);
        for (size_t r = 0; r < n; r++) concat_copy(y + (b + r) * out_inner + at, buf + r * w, w);
      }
    }
    at += w;
  }
}

static void free_concat(void* state) {
  struct concat_state* s = state;
  for (int k = 0; k < EKM_MAX_OP_INPUTS; k++) free(s->table[k]);
  free(s);
}

static void run_concat(struct ekrt_model* m, struct ek_op* op) {
  const struct concat_state* s = op->state;
  ek_for_rows(m, op, s->outer, OUTT->elems / (s->outer ? s->outer : 1), concat_rows);
}

static int prepare_concat(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  TRY(own_const_inputs(m, op, data));
  struct concat_state* s = calloc(1, sizeof *s);
  if (!s) return EKRT_ENOMEM;
  op->state = s;
  const struct ek_tensor* y = OUTT;
  uint32_t axis = (uint32_t)op->p[0];
  s->outer = 1;
  for (uint32_t d = 0; d < axis; d++) s->outer *= y->dims[d];
  for (uint32_t k = 0; k < op->n_in; k++) {
    const struct ek_tensor* x = IN(k);
    s->inner[k] = x->elems / s->outer * (y->dtype == EKM_F32 ? 4 : 1);
    if (y->dtype == EKM_F32) continue; /* a float island's concat: copies */
    s->table[k] = malloc(256);
    if (!s->table[k]) return EKRT_ENOMEM;
    int identity = 1;
    for (int v = -128; v < 128; v++) {
      const int8_t q = (int8_t)ek_requant(v - x->zp, op->p[1 + 2 * k], op->p[2 + 2 * k], y->zp, -128, 127);
      s->table[k][(uint8_t)(int8_t)v] = (uint8_t)q; /* the byte's unsigned value indexes it */
      identity &= q == v;
    }
    if (identity) { /* the (2^30, 1) pair of equal scales: a copy */
      free(s->table[k]);
      s->table[k] = NULL;
    }
  }
  return 0;
}

static int check_concat(struct ek_check* o) {
  const struct ek_tensor* y = ek_out(o);
  const int f = y->dtype == EKM_F32; /* float32 (an island's): copies, no multipliers */
  TRY(ek_need_out(o, f ? EKM_F32 : EKM_I8, ST_ARENA, -1));
  if (y->rank < 1) OFAIL0("output must have rank >= 1");
  TRY(ek_need_param(o, 0, "axis", 0, (int32_t)y->rank - 1));
  uint32_t axis = (uint32_t)o->op->p[0];
  uint64_t total = 0;
  for (uint32_t k = 0; k < o->op->n_in; k++) {
    TRY(ek_need_in(o, k, "x", f ? EKM_F32 : EKM_I8, f ? ST_ACT | ST_IO : ST_ACT, (int)y->rank));
    const struct ek_tensor* x = ek_in(o, k);
    for (uint32_t d = 0; d < y->rank; d++)
      if (d != axis && x->dims[d] != y->dims[d])
        OFAIL("input %u (tensor %u) dims[%u] is %u, the output's is %u", k, o->op->in[k], d, x->dims[d], y->dims[d]);
    total += x->dims[axis];
    if (!f) TRY(ek_need_multiplier(o, 1 + 2 * (int)k, "input multiplier", EK_SHIFT_MAX));
  }
  if (total != y->dims[axis])
    OFAIL("inputs add up to %llu on axis %u, the output has %u", (unsigned long long)total, axis, y->dims[axis]);
  uint32_t used = 1;
  for (uint32_t k = 0; k < o->op->n_in && !f; k++) used |= P(1 + 2 * k) | P(2 + 2 * k);
  return ek_need_unused_zero(o, used);
}

/* ---- MAXPOOL / AVGPOOL (rows: N*OH) ---- */

struct pool_state {
  struct ek_geometry geo; /* dh = dw = 1 (check_pool) */
  int include_pad;
  int32_t zx, zy;
  int32_t* mult; /* per window element count 1..kh*kw: multiplier of real/count */
  int32_t* shift;
};

/* dst = max(dst, src), lane by lane: restrict (input and output never overlap) lets the
 * compiler vectorize it (NEON smax; SSE2/AVX2 compare and blend) instead of a byte loop */
static void max_into(int8_t* restrict dst, const int8_t* restrict src, size_t c) {
  for (size_t i = 0; i < c; i++) dst[i] = src[i] > dst[i] ? src[i] : dst[i];
}

static void pool_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct pool_state* s = op->state;
  const int8_t* x = IN(0)->data;
  int8_t* y = OUTT->data;
  int avg = op->type == EKM_AVGPOOL;
  int32_t acc[256];
  for (size_t r = r0; r < r1; r++) {
    size_t n = r / s->geo.oh, oy = r % s->geo.oh;
    int64_t y0 = (int64_t)(oy * s->geo.sh) - (int64_t)s->geo.pt, y1 = y0 + (int64_t)s->geo.kh;
    int64_t ya = y0 < 0 ? 0 : y0, yb = y1 < (int64_t)s->geo.h ? y1 : (int64_t)s->geo.h;
    for (size_t ox = 0; ox < s->geo.ow; ox++) {
      int64_t x0 = (int64_t)(ox * s->geo.sw) - (int64_t)s->geo.pl, x1 = x0 + (int64_t)s->geo.kw;
      int64_t xa = x0 < 0 ? 0 : x0, xb = x1 < (int64_t)s->geo.w ? x1 : (int64_t)s->geo.w;
      int8_t* dst = y + ((n * s->geo.oh + oy) * s->geo.ow + ox) * s->geo.c;
      if (!avg) { /* every window touches the input (check_pool): start from its first pixel */
        memcpy(dst, x + ((n * s->geo.h + (size_t)ya) * s->geo.w + (size_t)xa) * s->geo.c, s->geo.c);
        for (int64_t iy = ya; iy < yb; iy++)
          for (int64_t ix = iy == ya ? xa + 1 : xa; ix < xb; ix++)
            max_into(dst, x + ((n * s->geo.h + (size_t)iy) * s->geo.w + (size_t)ix) * s->geo.c, s->geo.c);
        continue;
      }
      size_t count = s->include_pad ? s->geo.kh * s->geo.kw : (size_t)((yb - ya) * (xb - xa));
      int32_t mu = s->mult[count - 1], sh = s->shift[count - 1];
      for (size_t c0 = 0; c0 < s->geo.c; c0 += 256) { /* channel blocks: a fixed-size accumulator */
        size_t nc = ek_min_sz(256, s->geo.c - c0);
        memset(acc, 0, nc * sizeof *acc);
        for (int64_t iy = ya; iy < yb; iy++)
          for (int64_t ix = xa; ix < xb; ix++) {
            const int8_t* src = x + ((n * s->geo.h + (size_t)iy) * s->geo.w + (size_t)ix) * s->geo.c + c0;
            for (size_t c = 0; c < nc; c++) acc[c] += src[c] - s->zx;
          }
        for (size_t c = 0; c < nc; c++) dst[c0 + c] = ek_requant(acc[c], mu, sh, s->zy, -128, 127);
      }
    }
  }
}

static void free_pool(void* state) {
  struct pool_state* s = state;
  free(s->mult);
  free(s->shift);
  free(s);
}

static void run_pool(struct ekrt_model* m, struct ek_op* op) {
  const struct pool_state* s = op->state;
  ek_for_rows(m, op, (size_t)IN(0)->dims[0] * s->geo.oh, s->geo.ow * s->geo.c * s->geo.kh * s->geo.kw, pool_rows);
}

static int prepare_pool(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)data;
  struct pool_state* s = calloc(1, sizeof *s);
  if (!s) return EKRT_ENOMEM;
  op->state = s;
  const struct ek_tensor *x = IN(0), *y = OUTT;
  s->geo = ek_geometry_of(m, op);
  s->include_pad = op->p[10];
  s->zx = x->zp;
  s->zy = y->zp;
  if (op->type == EKM_AVGPOOL) {
    size_t n = s->geo.kh * s->geo.kw;
    s->mult = malloc(n * sizeof *s->mult);
    s->shift = malloc(n * sizeof *s->shift);
    if (!s->mult || !s->shift) return EKRT_ENOMEM;
    double real = ldexp((double)op->p[13], op->p[14] - 31);
    for (size_t i = 0; i < n; i++)
      if (ek_quantize_multiplier(real / (double)(i + 1), &s->mult[i], &s->shift[i]) != 0)
        return ek_fail(err, err_len, "op (AVGPOOL): multiplier %d, shift %d give no valid per-count multiplier", op->p[13],
                       op->p[14]);
  }
  return 0;
}

/* MAXPOOL / AVGPOOL: the CONV2D output size (a ceil_mode pool comes with its extra padding
 * made explicit), and every window touches the input (padding alone never makes an output) */
static int pool_dim_ok(int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t out) {
  if (in + p0 + p1 < k || out != (in + p0 + p1 - k) / s + 1) return 0;
  return p0 < k && (out - 1) * s - p0 < in;
}

static int check_pool(struct ek_check* o) {
  const struct ek_op* op = o->op;
  int avg = op->type == EKM_AVGPOOL;
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, 4));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, 4));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  TRY(ek_need_param(o, 0, "kernel h", 1, (int32_t)EK_MAX_WINDOW));
  TRY(ek_need_param(o, 1, "kernel w", 1, (int32_t)EK_MAX_WINDOW));
  TRY(ek_need_param(o, 2, "stride h", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 3, "stride w", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 4, "dilation h", 1, 1));
  TRY(ek_need_param(o, 5, "dilation w", 1, 1));
  for (int i = 6; i < 10; i++) TRY(ek_need_param(o, i, "pad", 0, EK_MAX_PAD));
  if ((uint64_t)op->p[0] * (uint64_t)op->p[1] > EK_MAX_WINDOW)
    OFAIL("window %dx%d is larger than %u elements", op->p[0], op->p[1], EK_MAX_WINDOW);
  if (y->dims[0] != x->dims[0] || y->dims[3] != x->dims[3]) OFAIL0("output batch/channels differ from the input's");
  if (!pool_dim_ok(x->dims[1], op->p[0], op->p[2], op->p[6], op->p[8], y->dims[1]))
    OFAIL("output height %u does not follow from input height %u, kernel %d, stride %d, pads %d/%d", y->dims[1], x->dims[1],
          op->p[0], op->p[2], op->p[6], op->p[8]);
  if (!pool_dim_ok(x->dims[2], op->p[1], op->p[3], op->p[7], op->p[9], y->dims[2]))
    OFAIL("output width %u does not follow from input width %u, kernel %d, stride %d, pads %d/%d", y->dims[2], x->dims[2],
          op->p[1], op->p[3], op->p[7], op->p[9]);
  if (!avg) {
    TRY(ek_need_same_quant(o, 0));
    return ek_need_unused_zero(o, 0x3FF);
  }
  TRY(ek_need_param(o, 10, "count_include_pad", 0, 1));
  TRY(ek_need_multiplier(o, 13, "multiplier", EK_SHIFT_MAX));
  return ek_need_unused_zero(o, 0x7FF | P(13) | P(14));
}

/* ---- GLOBAL_AVGPOOL ---- */

static void gap_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  size_t hw = (size_t)x->dims[1] * x->dims[2], C = x->dims[3];
  const int8_t* src = x->data;
  int8_t* dst = y->data;
  for (size_t r = r0; r < r1; r++) { /* a row is (n, channel block of 64) */
    size_t nblk = (C + 63) / 64, n = r / nblk, c0 = (r % nblk) * 64, c1 = ek_min_sz(c0 + 64, C);
    int32_t acc[64] = {0};
    for (size_t p = 0; p < hw; p++) {
      const int8_t* px = src + (n * hw + p) * C;
      for (size_t c = c0; c < c1; c++) acc[c - c0] += px[c] - x->zp;
    }
    for (size_t c = c0; c < c1; c++) dst[n * C + c] = ek_requant(acc[c - c0], op->p[0], op->p[1], y->zp, -128, 127);
  }
}

static void run_gap(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* x = IN(0);
  size_t nblk = (x->dims[3] + 63) / 64;
  ek_for_rows(m, op, (size_t)x->dims[0] * nblk, (size_t)x->dims[1] * x->dims[2] * 64, gap_rows);
}

static int check_gap(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, 4));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, 4));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  if (y->dims[0] != x->dims[0] || y->dims[1] != 1 || y->dims[2] != 1 || y->dims[3] != x->dims[3])
    OFAIL("output must be [%u,1,1,%u]", x->dims[0], x->dims[3]);
  if ((uint64_t)x->dims[1] * x->dims[2] > (1u << 23)) OFAIL("H*W %u*%u exceeds 2^23", x->dims[1], x->dims[2]);
  TRY(ek_need_multiplier(o, 0, "multiplier", EK_SHIFT_MAX));
  return ek_need_unused_zero(o, 0x3);
}

/* ---- RESHAPE / TRANSPOSE ---- */

/* The NHWC -> NCHW RESHAPE and TRANSPOSE are matrix transposes of contiguous input rows
 * (ek_x8_transpose, ek_x32_transpose), one per outer index. On the caller alone: a transpose
 * moves bytes, and split over 2 threads on the 2-core VM it took 1.9-2.6x as long as on one
 * (magika's, 130-260 KB: each thread reads what the other's share of the producing op left in
 * its core's cache). */
struct tr_job {
  const uint8_t* src;
  uint8_t* dst;
  size_t elem, outer, rows, cols, ss, ds; /* per outer index: rows x cols, src row stride ss */
  size_t o_d[2], o_src[2], o_dst[2];      /* outer index -> two dims with their strides */
};
static void run_tr(const struct tr_job* j) {
  for (size_t o = 0; o < j->outer; o++) {
    size_t a = o / j->o_d[1], b = o % j->o_d[1];
    size_t so = a * j->o_src[0] + b * j->o_src[1], dso = a * j->o_dst[0] + b * j->o_dst[1];
    if (j->elem == 4)
      ek_x32_transpose(j->rows, j->cols, (const float*)j->src + so, j->ss, (float*)j->dst + dso, j->ds);
    else
      ek_x8_transpose(j->rows, j->cols, (const int8_t*)j->src + so, j->ss, (int8_t*)j->dst + dso, j->ds);
  }
}

static void run_reshape(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  if (op->p[0] == 0) {
    if (x->data != y->data) memmove(y->data, x->data, x->bytes);
    return;
  }
  /* NHWC bytes read in NCHW order: per n, an [H*W, C] matrix transposed */
  size_t N = x->dims[0], HW = (size_t)x->dims[1] * x->dims[2], C = x->dims[3];
  struct tr_job j = {x->data, y->data, 1, N, HW, C, C, HW, {N, 1}, {HW * C, 0}, {HW * C, 0}};
  run_tr(&j);
}

/* TRANSPOSE's walk for one element type: dst in order, src through the strides s of dims d
 * (what the matrix transposes below do not take: rows that stay contiguous, dims of 1) */
#define TRANSPOSE_WALK(name, T)                                                   \
  static void name(const T* src, T* dst, const size_t d[4], const size_t s[4]) { \
    for (size_t a = 0; a < d[0]; a++)                                             \
      for (size_t b = 0; b < d[1]; b++)                                           \
        for (size_t c = 0; c < d[2]; c++) {                                       \
          const T* row = src + a * s[0] + b * s[1] + c * s[2];                    \
          if (s[3] == 1) { /* the innermost dim stays innermost: whole rows */    \
            memcpy(dst, row, d[3] * sizeof(T));                                   \
            dst += d[3];                                                          \
            continue;                                                             \
          }                                                                       \
          for (size_t e = 0; e < d[3]; e++) *dst++ = row[e * s[3]];               \
        }                                                                         \
  }
TRANSPOSE_WALK(transpose_i8, int8_t)
TRANSPOSE_WALK(transpose_f32, float)
#undef TRANSPOSE_WALK

static void run_transpose(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  size_t d[4] = {1, 1, 1, 1}, stride_in[4] = {0, 0, 0, 0}, s[4] = {0, 0, 0, 0}, sd[4];
  uint32_t r = x->rank, off = 4 - r;
  size_t st = 1;
  for (int i = (int)r - 1; i >= 0; i--) {
    stride_in[i] = st;
    st *= x->dims[i];
  }
  for (uint32_t i = 0; i < r; i++) { /* output dim i walks input dim perm[i] */
    d[off + i] = y->dims[i];
    s[off + i] = stride_in[op->p[i]];
  }
  st = 1;
  for (int i = 3; i >= 0; i--) { /* the output's strides */
    sd[i] = st;
    st *= d[i];
  }
  /* the output dim k < 3 that walks the input's contiguous dim: then each (other two dims)
   * slice is a [d[3], d[k]] matrix of contiguous rows transposed (dims of 1 left out) */
  int k = -1;
  if (d[3] > 1 && s[3] != 1)
    for (int i = 2; i >= 0 && k < 0; i--)
      if (s[i] == 1 && d[i] > 1) k = i;
  if (k >= 0) {
    int o[2], no = 0;
    for (int i = 0; i < 3; i++)
      if (i != k) o[no++] = i;
    struct tr_job j = {x->data, y->data, x->dtype == EKM_F32 ? 4 : 1, d[o[0]] * d[o[1]], d[3], d[k], s[3], sd[k],
                       {d[o[0]], d[o[1]]}, {s[o[0]], s[o[1]]}, {sd[o[0]], sd[o[1]]}};
    run_tr(&j);
  } else if (x->dtype == EKM_F32) /* a float island's tensor: the same walk over 4-byte elements */
    transpose_f32(x->data, y->data, d, s);
  else
    transpose_i8(x->data, y->data, d, s);
}

/* RESHAPE / TRANSPOSE move int8 or float32 values (a float island's); the output has the input's
 * dtype. A float RESHAPE may write a graph output: an island's value the model returns. */
static int need_moved_dtype(struct ek_check* o) {
  const int f = ek_in(o, 0)->dtype == EKM_F32;
  TRY(ek_need_in(o, 0, "x", f ? EKM_F32 : EKM_I8, f ? ST_ARENA | ST_IO : ST_ARENA, -1)); /* f32: may be a graph input */
  const int to_io = f && o->op->type == EKM_RESHAPE;
  TRY(ek_need_out(o, f ? EKM_F32 : EKM_I8, to_io ? ST_ARENA | ST_IO : ST_ARENA, -1));
  if (ek_out(o)->storage == EKM_IO && o->role[o->op->out] != 2) OFAIL("output (tensor %u) is not a graph output", o->op->out);
  return 0;
}

static int check_reshape(struct ek_check* o) {
  TRY(need_moved_dtype(o));
  TRY(ek_need_param(o, 0, "order", 0, 1));
  if (o->op->p[0] == 1 && ek_in(o, 0)->dtype != EKM_I8) OFAIL0("order 1 (NCHW read of an NHWC tensor) is for int8 tensors");
  if (ek_in(o, 0)->elems != ek_out(o)->elems)
    OFAIL("output has %zu elements, the input %zu", ek_out(o)->elems, ek_in(o, 0)->elems);
  if (o->op->p[0] == 1 && ek_in(o, 0)->rank != 4) OFAIL0("order 1 (NCHW read of an NHWC tensor) needs a rank-4 input");
  TRY(ek_need_same_quant(o, 0));
  return ek_need_unused_zero(o, 0x1);
}

static int check_transpose(struct ek_check* o) {
  TRY(need_moved_dtype(o));
  TRY(ek_need_out(o, ek_in(o, 0)->dtype, ST_ARENA, (int)ek_in(o, 0)->rank));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  unsigned seen = 0;
  for (uint32_t d = 0; d < x->rank; d++) {
    TRY(ek_need_param(o, (int)d, "perm", 0, (int32_t)x->rank - 1));
    unsigned bit = 1u << o->op->p[d];
    if (seen & bit) OFAIL("params[0..%u] is not a permutation", x->rank - 1);
    seen |= bit;
    if (y->dims[d] != x->dims[o->op->p[d]])
      OFAIL("output dims[%u] is %u, input dims[perm[%u]] is %u", d, y->dims[d], d, x->dims[o->op->p[d]]);
  }
  TRY(ek_need_same_quant(o, 0));
  return ek_need_unused_zero(o, (1u << x->rank) - 1);
}

/* ---- RESIZE (NHWC), integers only (docs/ekrt.md): nearest iy = oy*IH/OH; bilinear half_pixel
 * with Q11 weights, y = (sum x*wy*wx + 2^21) >> 22 on the raw int8 values. Coordinates are
 * computed per row/pixel (no tables: nothing allocated in proportion to the dims). ---- */

/* source index 0/1 and the Q11 weight of index 1 for output coordinate o */
static void resize_coord(size_t in, size_t out, int linear, size_t o, size_t* i0, size_t* i1, int32_t* w1) {
  if (!linear) {
    *i0 = *i1 = (size_t)((uint64_t)o * in / out);
    *w1 = 0;
    return;
  }
  int64_t num = (int64_t)(2 * o + 1) * (int64_t)in - (int64_t)out, den = 2 * (int64_t)out;
  if (num < 0) num = 0;
  int64_t a = num / den;
  *w1 = (int32_t)(((num - a * den) * 2048 + den / 2) / den);
  if (a > (int64_t)in - 1) a = (int64_t)in - 1;
  *i0 = (size_t)a;
  *i1 = (size_t)(a + 1 < (int64_t)in ? a + 1 : (int64_t)in - 1);
}

static void resize_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  size_t H = x->dims[1], W = x->dims[2], C = x->dims[3], OH = y->dims[1], OW = y->dims[2];
  int linear = op->p[0] == 1;
  const int8_t* src = x->data;
  int8_t* dst = y->data;
  for (size_t r = r0; r < r1; r++) {
    size_t n = r / OH, oy = r % OH, ya, yb;
    int32_t wy1;
    resize_coord(H, OH, linear, oy, &ya, &yb, &wy1);
    int32_t wy0 = 2048 - wy1;
    const int8_t* rowa = src + (n * H + ya) * W * C;
    const int8_t* rowb = src + (n * H + yb) * W * C;
    for (size_t ox = 0; ox < OW; ox++) {
      size_t xa, xb;
      int32_t wx1;
      resize_coord(W, OW, linear, ox, &xa, &xb, &wx1);
      int8_t* o = dst + ((n * OH + oy) * OW + ox) * C;
      const int8_t *p00 = rowa + xa * C, *p01 = rowa + xb * C;
      if (!linear) {
        memcpy(o, p00, C);
        continue;
      }
      const int8_t *p10 = rowb + xa * C, *p11 = rowb + xb * C;
      int32_t wx0 = 2048 - wx1;
      for (size_t c = 0; c < C; c++) {
        int32_t top = p00[c] * wx0 + p01[c] * wx1, bot = p10[c] * wx0 + p11[c] * wx1;
        int32_t acc = top * wy0 + bot * wy1;
        o[c] = clamp8((int32_t)(((int64_t)acc + (1 << 21)) >> 22));
      }
    }
  }
}

static void run_resize(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* y = OUTT;
  ek_for_rows(m, op, (size_t)y->dims[0] * y->dims[1], (size_t)y->dims[2] * y->dims[3] * 4, resize_rows);
}

static int check_resize(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, 4));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, 4));
  TRY(ek_need_param(o, 0, "mode", 0, 1));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  if (y->dims[0] != x->dims[0] || y->dims[3] != x->dims[3]) OFAIL0("output batch/channels differ from the input's");
  TRY(ek_need_same_quant(o, 0));
  return ek_need_unused_zero(o, 0x1);
}

/* ---- LUT ---- */

static void lut_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const uint8_t* src = IN(0)->data;
  uint8_t* dst = OUTT->data;
  size_t end = ek_min_sz(r1 * 4096, IN(0)->elems);
  ek_kernels()->lut(end - r0 * 4096, src + r0 * 4096, dst + r0 * 4096, op->state);
}

static void run_lut(struct ekrt_model* m, struct ek_op* op) {
  ek_for_rows(m, op, (IN(0)->elems + 4095) / 4096, 4096, lut_rows);
}

static int prepare_lut(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  uint8_t* t = malloc(256);
  if (!t) return EKRT_ENOMEM;
  /* the kernel indexes by the byte's unsigned value u; the op's table by x + 128 = u ^ 0x80 */
  const uint8_t* table = data + IN(1)->offset;
  for (size_t u = 0; u < 256; u++) t[u] = table[u ^ 0x80];
  op->state = t;
  return 0;
}

static int check_lut(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, -1));
  TRY(ek_need_in(o, 1, "table", EKM_I8, ST_CONST, 1));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  if (ek_in(o, 1)->dims[0] != 256) OFAIL("the table has %u entries, must be 256", ek_in(o, 1)->dims[0]);
  TRY(ek_need_same_dims_out(o, 0));
  return ek_need_unused_zero(o, 0);
}

/* ---- SOFTMAX over the last axis, in double (docs/ekrt.md): v = (x - zx) * scale,
 * e = exp(v - max v), sum in index order, y = rint(e / sum * 256) - 128 (ties to even).
 * v - max v is (x - max x) * scale exactly (both products and their difference fit a double's
 * mantissa: a float scale times integers below 512), so e is a lookup in a table of
 * exp(-d * scale), d = max x - x in 0..255, made once: bit for bit the same e, no exp per row. ---- */

static void softmax_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const double* t = op->state; /* t[d] = exp(-d * scale) */
  const struct ek_tensor* x = IN(0);
  size_t n = x->dims[x->rank - 1];
  const int8_t* src = x->data;
  int8_t* dst = OUTT->data;
  for (size_t r = r0; r < r1; r++) {
    const int8_t* row = src + r * n;
    int mx = -128;
    for (size_t i = 0; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += t[mx - row[i]];
    /* rint rounds like nearbyint in the default mode, without nearbyint's fenv save/restore
     * (a libm call per element in musl, which the static runner links) */
    for (size_t i = 0; i < n; i++) dst[r * n + i] = clamp8((int32_t)rint(t[mx - row[i]] / sum * 256.0) - 128);
  }
}

static void run_softmax(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* x = IN(0);
  size_t n = x->dims[x->rank - 1];
  ek_for_rows(m, op, x->elems / n, n * 16, softmax_rows);
}

static int prepare_softmax(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)data;
  (void)err;
  (void)err_len;
  double* t = malloc(256 * sizeof *t);
  if (!t) return EKRT_ENOMEM;
  op->state = t;
  double s = (double)IN(0)->scale;
  for (int d = 0; d < 256; d++) t[d] = exp(-(double)d * s);
  return 0;
}

static int check_softmax(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, -1));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  if (x->rank < 1) OFAIL0("input must have rank >= 1");
  TRY(ek_need_param(o, 0, "axis", (int32_t)x->rank - 1, (int32_t)x->rank - 1));
  TRY(ek_need_same_dims_out(o, 0));
  if (y->scale != 1.0f / 256.0f || y->zp != -128)
    OFAIL("output scale/zero_point are %g/%d, must be 1/256 and -128", (double)y->scale, y->zp);
  return ek_need_unused_zero(o, 0x1);
}

/* ---- PAD / SLICE: data movement on the stored layout, up to rank 4. A row is the innermost
 * axis of the output; the outer index is decomposed into the other axes (dims as 4, leading 1s). ---- */

/* the output's dims as 4 (leading 1s) and the op's per-axis params aligned the same way */
static void dims4(const struct ek_tensor* t, size_t d[4]) {
  uint32_t off = 4 - t->rank;
  for (uint32_t i = 0; i < 4; i++) d[i] = i < off ? 1 : t->dims[i - off];
}
static int32_t param4(const struct ek_op* op, const struct ek_tensor* t, int base, uint32_t i, int32_t dflt) {
  uint32_t off = 4 - t->rank;
  return i < off ? dflt : op->p[base + (int)(i - off)];
}

/* what a PAD / SLICE row task reads: both shapes as 4 and two per-axis params, params[0 + axis]
 * (0 on the leading axes) and params[base1 + axis] (dflt1 there) */
struct move4 {
  size_t od[4], id[4]; /* output, input */
  int64_t p0[4], p1[4];
  const int8_t* src;
  int8_t* dst;
};
static struct move4 move4_of(const struct ekrt_model* m, const struct ek_op* op, int base1, int32_t dflt1) {
  const struct ek_tensor *x = IN(0), *y = OUTT;
  struct move4 v = {{0}, {0}, {0}, {0}, x->data, y->data};
  dims4(y, v.od);
  dims4(x, v.id);
  for (uint32_t i = 0; i < 4; i++) {
    v.p0[i] = param4(op, x, 0, i, 0);
    v.p1[i] = param4(op, x, base1, i, dflt1);
  }
  return v;
}

/* PAD: the input index output o reads on one axis, or -1 for the constant (mode 0) */
static int64_t pad_src(int64_t o, int64_t in, int64_t before, int64_t interior, int mode) {
  int64_t j = o - before;
  if (mode == 1) { /* reflect (no edge repeat); the loader keeps pads <= in - 1 */
    if (j < 0) j = -j;
    if (j >= in) j = 2 * (in - 1) - j;
    return j;
  }
  if (mode == 2) return j < 0 ? 0 : j >= in ? in - 1 : j; /* edge */
  if (j < 0 || j % (interior + 1)) return -1;
  j /= interior + 1;
  return j < in ? j : -1;
}

static void pad_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct move4 v = move4_of(m, op, 8, 0);
  const size_t *od = v.od, *id = v.id;
  const int64_t *before = v.p0, *inter = v.p1; /* params 0..3, 8..11 */
  const int mode = op->p[12];
  const int8_t value = (int8_t)op->p[13];
  const int8_t* src = v.src;
  int8_t* dst = v.dst;
  const size_t W = od[3];
  for (size_t r = r0; r < r1; r++) {
    size_t o2 = r % od[2], o1 = (r / od[2]) % od[1], o0 = r / (od[2] * od[1]);
    int64_t s0 = pad_src((int64_t)o0, (int64_t)id[0], before[0], inter[0], mode);
    int64_t s1 = pad_src((int64_t)o1, (int64_t)id[1], before[1], inter[1], mode);
    int64_t s2 = pad_src((int64_t)o2, (int64_t)id[2], before[2], inter[2], mode);
    int8_t* out = dst + r * W;
    if (s0 < 0 || s1 < 0 || s2 < 0) {
      memset(out, value, W);
      continue;
    }
    const int8_t* row = src + (((size_t)s0 * id[1] + (size_t)s1) * id[2] + (size_t)s2) * id[3];
    if (mode == 0) { /* the constant, then the row's elements at their (strided) places */
      size_t b = (size_t)before[3], step = (size_t)inter[3] + 1;
      if (step == 1) {
        memset(out, value, b);
        memcpy(out + b, row, id[3]);
        memset(out + b + id[3], value, W - b - id[3]);
      } else {
        memset(out, value, W);
        for (size_t i = 0; i < id[3]; i++) out[b + i * step] = row[i];
      }
      continue;
    }
    for (size_t w = 0; w < W; w++) {
      int64_t s = pad_src((int64_t)w, (int64_t)id[3], before[3], inter[3], mode);
      out[w] = s < 0 ? value : row[s];
    }
  }
}

/* one row = the output's last axis */
static void for_output_rows(struct ekrt_model* m, struct ek_op* op,
                            void (*fn)(struct ekrt_model*, struct ek_op*, size_t, size_t)) {
  const struct ek_tensor* y = OUTT;
  size_t W = y->rank ? y->dims[y->rank - 1] : 1;
  ek_for_rows(m, op, y->elems / W, W, fn);
}

static void run_pad(struct ekrt_model* m, struct ek_op* op) { for_output_rows(m, op, pad_rows); }

/* PAD / SLICE: an int8 input of rank >= 1 and an int8 output of its rank */
static int need_moved_io(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, -1));
  if (ek_in(o, 0)->rank < 1) OFAIL0("input must have rank >= 1");
  return ek_need_out(o, EKM_I8, ST_ARENA, (int)ek_in(o, 0)->rank);
}

static int check_pad(struct ek_check* o) {
  TRY(need_moved_io(o));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  TRY(ek_need_param(o, 12, "mode", 0, 2));
  TRY(ek_need_param(o, 13, "value", -128, 127));
  const int mode = o->op->p[12];
  uint32_t used = P(12) | P(13);
  for (uint32_t d = 0; d < x->rank; d++) {
    TRY(ek_need_param(o, (int)d, "pad before", 0, mode == 1 ? (int32_t)x->dims[d] - 1 : EK_MAX_PAD));
    TRY(ek_need_param(o, 4 + (int)d, "pad after", 0, mode == 1 ? (int32_t)x->dims[d] - 1 : EK_MAX_PAD));
    TRY(ek_need_param(o, 8 + (int)d, "interior", 0, mode == 0 ? EK_MAX_STRIDE : 0));
    used |= P(d) | P(4 + d) | P(8 + d);
    uint64_t want = (uint64_t)x->dims[d] + (uint64_t)(x->dims[d] - 1) * (uint64_t)o->op->p[8 + d] +
                    (uint64_t)o->op->p[d] + (uint64_t)o->op->p[4 + d];
    if (y->dims[d] != want) OFAIL("output dims[%u] is %u, the pads make %llu", d, y->dims[d], (unsigned long long)want);
  }
  TRY(ek_need_same_quant(o, 0));
  return ek_need_unused_zero(o, used);
}

static void slice_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const struct move4 v = move4_of(m, op, 4, 1);
  const size_t *od = v.od, *id = v.id;
  const int64_t *start = v.p0, *step = v.p1; /* params 0..3, 4..7 */
  const int8_t* src = v.src;
  int8_t* dst = v.dst;
  const size_t W = od[3];
  for (size_t r = r0; r < r1; r++) {
    size_t o2 = r % od[2], o1 = (r / od[2]) % od[1], o0 = r / (od[2] * od[1]);
    size_t s0 = (size_t)(start[0] + (int64_t)o0 * step[0]), s1 = (size_t)(start[1] + (int64_t)o1 * step[1]),
           s2 = (size_t)(start[2] + (int64_t)o2 * step[2]);
    const int8_t* row = src + ((s0 * id[1] + s1) * id[2] + s2) * id[3];
    int8_t* out = dst + r * W;
    if (step[3] == 1) {
      memcpy(out, row + start[3], W);
      continue;
    }
    for (size_t w = 0; w < W; w++) out[w] = row[start[3] + (int64_t)w * step[3]];
  }
}

static void run_slice(struct ekrt_model* m, struct ek_op* op) { for_output_rows(m, op, slice_rows); }

/* SLICE: out[o] = x[start + o * step] per axis; every index read lies inside the input */
static int check_slice(struct ek_check* o) {
  TRY(need_moved_io(o));
  const struct ek_tensor *x = ek_in(o, 0), *y = ek_out(o);
  uint32_t used = 0;
  for (uint32_t d = 0; d < x->rank; d++) {
    int32_t n = (int32_t)(x->dims[d] > (uint32_t)INT32_MAX ? INT32_MAX : x->dims[d]);
    TRY(ek_need_param(o, (int)d, "start", 0, n - 1));
    TRY(ek_need_param(o, 4 + (int)d, "step", -n, n));
    int64_t step = o->op->p[4 + d], last = (int64_t)o->op->p[d] + ((int64_t)y->dims[d] - 1) * step;
    if (step == 0) OFAIL("params[%u] (step) is 0", 4 + d);
    if (last < 0 || last >= (int64_t)x->dims[d])
      OFAIL("axis %u: start %d + (%u - 1) * step %d reads index %lld, outside 0..%u", d, o->op->p[d], y->dims[d],
            o->op->p[4 + d], (long long)last, x->dims[d] - 1);
    used |= P(d) | P(4 + d);
  }
  TRY(ek_need_same_quant(o, 0));
  return ek_need_unused_zero(o, used);
}

/* ---- LUT_CHANNEL: y[..., c] = table[c][x + 128], one 256-entry table per innermost channel
 * (PRelu, a per-channel affine before an elementwise function) ---- */

static void clut_rows(struct ekrt_model* m, struct ek_op* op, size_t r0, size_t r1) {
  const int8_t* t = op->state;
  const struct ek_tensor* x = IN(0);
  size_t C = x->dims[x->rank - 1];
  const int8_t* src = x->data;
  int8_t* dst = OUTT->data;
  const ek_x8_clut_fn kernel = ek_kernels()->clut;
  if (kernel) {
    kernel(r1 - r0, C, src + r0 * C, dst + r0 * C, t);
    return;
  }
  for (size_t r = r0; r < r1; r++)
    for (size_t c = 0; c < C; c++) dst[r * C + c] = t[c * 256 + (size_t)(src[r * C + c] + 128)];
}

static void run_clut(struct ekrt_model* m, struct ek_op* op) {
  const struct ek_tensor* x = IN(0);
  size_t C = x->dims[x->rank - 1];
  ek_for_rows(m, op, x->elems / C, C, clut_rows);
}

static int prepare_clut(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  const struct ek_tensor* t = IN(1);
  int8_t* p = calloc(1, t->bytes + EK_CLUT_PAD); /* the padding: kernels.h */
  if (!p) return EKRT_ENOMEM;
  memcpy(p, data + t->offset, t->bytes);
  op->state = p;
  m->weights_bytes += t->bytes + EK_CLUT_PAD;
  return 0;
}

static int check_clut(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, -1));
  TRY(ek_need_in(o, 1, "table", EKM_I8, ST_CONST, 2));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  const struct ek_tensor *x = ek_in(o, 0), *t = ek_in(o, 1);
  if (x->rank < 1) OFAIL0("input must have rank >= 1");
  if (t->dims[0] != x->dims[x->rank - 1] || t->dims[1] != 256)
    OFAIL("the table is [%u,%u], must be [%u,256] (one per innermost channel)", t->dims[0], t->dims[1], x->dims[x->rank - 1]);
  TRY(ek_need_same_dims_out(o, 0));
  return ek_need_unused_zero(o, 0);
}

/* ---- the ops: the one list (docs/ekrt.md "Ops"); the loader checks n_inputs, then check(),
 * then prepare(); ekrt_run calls run() ---- */

static const struct ek_op_desc OPS[] = {
    [EKM_QUANTIZE] = {"QUANTIZE", 1, 1, 0, check_edge, NULL, run_edge, NULL},
    [EKM_DEQUANTIZE] = {"DEQUANTIZE", 1, 1, 0, check_edge, NULL, run_edge, NULL},
    [EKM_CONV2D] = {"CONV2D", 5, 5, 0, ek_check_conv, ek_prepare_conv, ek_run_conv, ek_free_conv},
    [EKM_FULLY_CONNECTED] = {"FULLY_CONNECTED", 5, 5, 0, ek_check_fc, ek_prepare_conv, ek_run_conv, ek_free_conv},
    [EKM_ADD] = {"ADD", 2, 2, 1, check_add, prepare_binary, run_binary, NULL},
    [EKM_MUL] = {"MUL", 2, 2, 1, check_mul, prepare_binary, run_binary, NULL},
    [EKM_CONCAT] = {"CONCAT", 1, 8, 0, check_concat, prepare_concat, run_concat, free_concat},
    [EKM_MAXPOOL] = {"MAXPOOL", 1, 1, 0, check_pool, prepare_pool, run_pool, free_pool},
    [EKM_AVGPOOL] = {"AVGPOOL", 1, 1, 0, check_pool, prepare_pool, run_pool, free_pool},
    [EKM_GLOBAL_AVGPOOL] = {"GLOBAL_AVGPOOL", 1, 1, 0, check_gap, NULL, run_gap, NULL},
    [EKM_RESHAPE] = {"RESHAPE", 1, 1, 0, check_reshape, NULL, run_reshape, NULL},
    [EKM_TRANSPOSE] = {"TRANSPOSE", 1, 1, 0, check_transpose, NULL, run_transpose, NULL},
    [EKM_RESIZE] = {"RESIZE", 1, 1, 0, check_resize, NULL, run_resize, NULL},
    [EKM_LUT] = {"LUT", 2, 2, 1, check_lut, prepare_lut, run_lut, NULL},
    [EKM_SOFTMAX] = {"SOFTMAX", 1, 1, 0, check_softmax, prepare_softmax, run_softmax, NULL},
    [EKM_PAD] = {"PAD", 1, 1, 0, check_pad, NULL, run_pad, NULL},
    [EKM_SLICE] = {"SLICE", 1, 1, 0, check_slice, NULL, run_slice, NULL},
    [EKM_LUT_CHANNEL] = {"LUT_CHANNEL", 2, 2, 0, check_clut, prepare_clut, run_clut, NULL},
    [EKM_F_BINARY] = {"F_BINARY", 2, 2, 1, ek_check_fbinary, own_const_inputs_prepare, ek_run_fbinary, NULL},
    [EKM_F_UNARY] = {"F_UNARY", 1, 1, 1, ek_check_funary, NULL, ek_run_funary, NULL},
    [EKM_F_REDUCE] = {"F_REDUCE", 1, 1, 0, ek_check_freduce, ek_prepare_freduce, ek_run_freduce, NULL},
    [EKM_F_MATMUL] = {"F_MATMUL", 2, 2, 0, ek_check_fmatmul, own_const_inputs_prepare, ek_run_fmatmul, NULL},
    [EKM_F_SOFTMAX] = {"F_SOFTMAX", 1, 1, 0, ek_check_fsoftmax, NULL, ek_run_fsoftmax, NULL},
};
_Static_assert(sizeof OPS / sizeof OPS[0] == EKM_OP_LAST + 1, "one descriptor per op type of ekm.h");

/* ---- a LUT fused into the convolution before it ----
 * CONV2D (or FULLY_CONNECTED) -> LUT, where the LUT is the only reader of the convolution's
 * output (not a graph output): the convolution writes its outputs where the LUT's go and each
 * of its tasks applies the table to the outputs it just wrote, while they are in that core's
 * cache (a separate LUT pass read them back, from the other core's cache for the share a
 * worker wrote: nudenet-320n's 60 LUTs took 117 us at 1 thread, 239 us at 2). The bytes are the
 * same. Not when the LUT's output shares arena bytes with an input the convolution still
 * reads (the plan may give the LUT the bytes of a tensor that dies at the convolution). */
static void run_fused(struct ekrt_model* m, struct ek_op* op) {
  (void)m;
  (void)op;
}

static const struct ek_op_desc FUSED_LUT = {"LUT", 2, 2, 1, check_lut, NULL, run_fused, NULL};

static int overlaps(const struct ek_tensor* a, const struct ek_tensor* b) {
  return a->storage == EKM_ARENA && b->storage == EKM_ARENA && a->offset < b->offset + b->bytes &&
         b->offset < a->offset + a->bytes;
}

void ek_fuse_luts(struct ekrt_model* m) {
  for (uint32_t j = 0; j + 1 < m->n_ops; j++) {
    struct ek_op *conv = &m->ops[j], *lut = &m->ops[j + 1];
    if ((conv->type != EKM_CONV2D && conv->type != EKM_FULLY_CONNECTED) || lut->type != EKM_LUT ||
        lut->desc == &FUSED_LUT || lut->in[0] != conv->out || m->tensors[conv->out].storage != EKM_ARENA)
      continue;
    uint32_t readers = 0;
    for (uint32_t i = 0; i < m->n_ops; i++)
      for (uint32_t k = 0; k < m->ops[i].n_in; k++) readers += m->ops[i].in[k] == conv->out;
    int clash = 0;
    for (uint32_t k = 0; k < conv->n_in; k++) clash |= overlaps(&m->tensors[conv->in[k]], &m->tensors[lut->out]);
    if (readers != 1 || clash) continue;
    ek_conv_fuse_lut(conv, lut->state);
    conv->out = lut->out;
    lut->desc = &FUSED_LUT;
  }
}

int ek_op_fused(const struct ek_op* op) { return op->desc == &FUSED_LUT; }

const struct ek_op_desc* ek_op_desc(uint32_t type) {
  return type < sizeof OPS / sizeof OPS[0] && OPS[type].run ? &OPS[type] : NULL;
}
