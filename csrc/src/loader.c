/* The .ekm loader: checks every field, offset, size, count, enum and index before use
 * (docs/ekrt.md), then builds the model (ops prepared by ops.c / conv.c). It reads the
 * caller's bytes with memcpy only (any alignment) and never past `size`; it is fuzzed
 * (csrc/fuzz/fuzz_ekm.c). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "edgekit/requant.h"
#include "internal.h"

int ek_fail(char* err, size_t err_len, const char* fmt, ...) {
  if (err && err_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return EKRT_EFORMAT;
}


static const char* dtype_name(uint32_t d) {
  return d == EKM_F32 ? "float32" : d == EKM_I8 ? "int8" : d == EKM_I32 ? "int32" : "?";
}
static const char* storage_name(uint32_t s) {
  return s == EKM_ARENA ? "arena" : s == EKM_CONST ? "const" : s == EKM_IO ? "io" : "?";
}
static size_t dtype_size(uint32_t d) { return d == EKM_I8 ? 1 : 4; }

/* ---- CRC-32 (IEEE 802.3, reflected, as zlib) ---- */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[i] = c;
  }
}

uint32_t ek_crc32(const uint8_t* p, size_t n) {
  pthread_once(&crc_once, crc_init);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

/* ---- validation context ---- */
struct vctx {
  const uint8_t* buf;
  size_t size;
  struct ekm_header h;
  struct ek_tensor* t;
  char* err;
  size_t err_len;
  /* per tensor: producing op + 1 (0: none), last reading op + 1, graph io role */
  uint32_t* def;
  uint32_t* last;
  uint8_t* role; /* 0 none, 1 graph input, 2 graph output */
  uint32_t* alias; /* union-find over RESHAPE aliases */
};

#define FAIL(...) return ek_fail(c->err, c->err_len, __VA_ARGS__)

static int range_ok(uint64_t off, uint64_t len, uint64_t limit) { return off <= limit && len <= limit - off; }

static int check_header(struct vctx* c) {
  const struct ekm_header* h = &c->h;
  if (memcmp(h->magic, EKM_MAGIC, 4) != 0) FAIL("header: magic is not \"EKM1\" (not an .ekm file)");
  if (h->version != EKM_VERSION) FAIL("header: version is %u, this ekrt reads version %u", h->version, EKM_VERSION);
  if (h->header_size != sizeof(struct ekm_header))
    FAIL("header: header_size is %u, must be %u", h->header_size, (unsigned)sizeof(struct ekm_header));
  if (h->flags != 0) FAIL("header: flags is 0x%x, must be 0", h->flags);
  if (h->file_size != c->size)
    FAIL("header: file_size is %llu but the file has %llu bytes (truncated or padded?)",
         (unsigned long long)h->file_size, (unsigned long long)c->size);
  if (h->reserved0 != 0) FAIL("header: reserved0 is %u, must be 0", h->reserved0);
  for (int i = 0; i < 32; i++)
    if (h->reserved[i] != 0) FAIL("header: reserved[%d] is %u, must be 0", i, h->reserved[i]);
  uint32_t crc = ek_crc32(c->buf + h->header_size, c->size - h->header_size);
  if (crc != h->checksum) FAIL("header: checksum is 0x%08x but the contents hash to 0x%08x (corrupt file)", h->checksum, crc);
  if (h->n_tensors < 1 || h->n_tensors > EK_MAX_TENSORS)
    FAIL("header: n_tensors is %u, must be 1..%u", h->n_tensors, EK_MAX_TENSORS);
  if (h->n_ops < 1 || h->n_ops > EK_MAX_OPS) FAIL("header: n_ops is %u, must be 1..%u", h->n_ops, EK_MAX_OPS);
  if (h->n_inputs < 1 || h->n_inputs > EK_MAX_IO) FAIL("header: n_inputs is %u, must be 1..%u", h->n_inputs, EK_MAX_IO);
  if (h->n_outputs < 1 || h->n_outputs > EK_MAX_IO)
    FAIL("header: n_outputs is %u, must be 1..%u", h->n_outputs, EK_MAX_IO);
  if (h->arena_size > EK_MAX_ARENA)
    FAIL("header: arena_size is %llu, more than the %llu ekrt allows", (unsigned long long)h->arena_size,
         (unsigned long long)EK_MAX_ARENA);
  struct {
    const char* name;
    uint64_t off, len;
  } sec[4] = {{"tensors_offset", h->tensors_offset, (uint64_t)h->n_tensors * sizeof(struct ekm_tensor)},
              {"ops_offset", h->ops_offset, (uint64_t)h->n_ops * sizeof(struct ekm_op)},
              {"io_offset", h->io_offset, (uint64_t)(h->n_inputs + h->n_outputs) * sizeof(struct ekm_io)},
              {"data_offset", h->data_offset, h->data_size}};
  for (int i = 0; i < 4; i++) {
    if (sec[i].off % EKM_ALIGN != 0)
      FAIL("header: %s is %llu, not a multiple of %u", sec[i].name, (unsigned long long)sec[i].off, EKM_ALIGN);
    if (sec[i].off < h->header_size)
      FAIL("header: %s is %llu, inside the header", sec[i].name, (unsigned long long)sec[i].off);
    if (!range_ok(sec[i].off, sec[i].len, c->size))
      FAIL("header: %s %llu + %llu bytes runs past the end of the file (%llu bytes)%s", sec[i].name,
           (unsigned long long)sec[i].off, (unsigned long long)sec[i].len, (unsigned long long)c->size,
           i == 3 ? " (data_size too large?)" : "");
  }
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      if (sec[i].len && sec[j].len && sec[i].off < sec[j].off + sec[j].len && sec[j].off < sec[i].off + sec[i].len)
        FAIL("header: sections %s and %s overlap", sec[i].name, sec[j].name);
  return 0;
}

static int check_tensor(struct vctx* c, uint32_t i, const struct ekm_tensor* r, struct ek_tensor* t) {
  if (r->dtype < EKM_F32 || r->dtype > EKM_I32) FAIL("tensor %u: dtype is %u, must be 1 (float32), 2 (int8) or 3 (int32)", i, r->dtype);
  if (r->storage < EKM_ARENA || r->storage > EKM_IO)
    FAIL("tensor %u: storage is %u, must be 1 (arena), 2 (const) or 3 (io)", i, r->storage);
  if (r->rank > EKM_MAX_RANK) FAIL("tensor %u: rank is %u, must be 0..4", i, r->rank);
  uint64_t elems = 1;
  for (uint32_t d = 0; d < 4; d++) {
    if (d < r->rank) {
      if (r->dims[d] == 0) FAIL("tensor %u: dims[%u] is 0, must be >= 1", i, d);
      elems *= r->dims[d];
      if (elems > EK_MAX_ELEMENTS) FAIL("tensor %u: dims product is larger than %llu", i, (unsigned long long)EK_MAX_ELEMENTS);
    } else if (r->dims[d] != 0) {
      FAIL("tensor %u: dims[%u] is %u past rank %u, must be 0", i, d, r->dims[d], r->rank);
    }
  }
  if (r->reserved != 0) FAIL("tensor %u: reserved is %u, must be 0", i, r->reserved);
  if (r->dtype == EKM_I8) {
    /* const int8 tensors (weights, tables) may carry scale 0: their scales live in the ops */
    int weights = r->storage == EKM_CONST && r->scale == 0.0f;
    if (!weights && (!(r->scale > 0.0f) || !isfinite(r->scale) || !isnormal(r->scale)))
      FAIL("tensor %u: scale is %g, must be a finite normal float > 0%s", i, (double)r->scale,
           r->storage == EKM_CONST ? " (or 0 for weights)" : "");
    if (r->zero_point < -128 || r->zero_point > 127) FAIL("tensor %u: zero_point is %d, must be -128..127", i, r->zero_point);
  } else if (r->scale != 0.0f || r->zero_point != 0) {
    FAIL("tensor %u: %s tensors carry scale 0 and zero_point 0 (got %g, %d)", i, dtype_name(r->dtype), (double)r->scale,
         r->zero_point);
  }
  uint64_t bytes = elems * dtype_size(r->dtype);
  switch (r->storage) {
    case EKM_ARENA:
      if (r->dtype == EKM_I32) FAIL("tensor %u: arena tensors are int8 or float32, this one is int32", i);
      if (r->offset % dtype_size(r->dtype) != 0)
        FAIL("tensor %u: arena offset %llu is not aligned to its %u-byte elements", i, (unsigned long long)r->offset,
             (unsigned)dtype_size(r->dtype));
      if (!range_ok(r->offset, bytes, c->h.arena_size))
        FAIL("tensor %u: arena offset %llu + %llu bytes is past arena_size %llu", i, (unsigned long long)r->offset,
             (unsigned long long)bytes, (unsigned long long)c->h.arena_size);
      break;
    case EKM_CONST:
      if (!range_ok(r->offset, bytes, c->h.data_size))
        FAIL("tensor %u: const offset %llu + %llu bytes is outside data (data_size %llu)", i, (unsigned long long)r->offset,
             (unsigned long long)bytes, (unsigned long long)c->h.data_size);
      if (r->offset % dtype_size(r->dtype) != 0)
        FAIL("tensor %u: const offset %llu is not aligned to its %u-byte elements", i, (unsigned long long)r->offset,
             (unsigned)dtype_size(r->dtype));
      break;
    default: /* EKM_IO */
      if (r->dtype != EKM_F32) FAIL("tensor %u: io tensors are float32, this one is %s", i, dtype_name(r->dtype));
      if (r->offset != 0) FAIL("tensor %u: io tensors have offset 0 (got %llu)", i, (unsigned long long)r->offset);
      break;
  }
  t->dtype = r->dtype;
  t->storage = r->storage;
  t->rank = r->rank;
  memcpy(t->dims, r->dims, sizeof t->dims);
  t->elems = (size_t)elems;
  t->bytes = (size_t)bytes;
  t->scale = r->scale;
  t->zp = r->zero_point;
  t->offset = r->offset;
  t->data = NULL;
  return 0;
}

/* ---- per-op check helpers (each op's check lives with the op: ops.c, conv.c) ---- */

/* input k must be of `dtype`; `storages` is a bitmask of allowed storages (1 << storage). */
int ek_need_in(struct ek_check* o, uint32_t k, const char* what, uint32_t dtype, unsigned storages, int rank) {
  const struct ek_tensor* t = ek_in(o, k);
  if (t->dtype != dtype)
    OFAIL("input %u (%s, tensor %u) is %s, must be %s", k, what, o->op->in[k], dtype_name(t->dtype), dtype_name(dtype));
  if (!(storages & (1u << t->storage)))
    OFAIL("input %u (%s, tensor %u) has storage %s, which this op does not take there", k, what, o->op->in[k],
          storage_name(t->storage));
  if (rank >= 0 && t->rank != (uint32_t)rank)
    OFAIL("input %u (%s, tensor %u) has rank %u, must be %d", k, what, o->op->in[k], t->rank, rank);
  return 0;
}

int ek_need_out(struct ek_check* o, uint32_t dtype, unsigned storages, int rank) {
  const struct ek_tensor* t = ek_out(o);
  if (t->dtype != dtype) OFAIL("output (tensor %u) is %s, must be %s", o->op->out, dtype_name(t->dtype), dtype_name(dtype));
  if (!(storages & (1u << t->storage)))
    OFAIL("output (tensor %u) has storage %s, which this op cannot write", o->op->out, storage_name(t->storage));
  if (rank >= 0 && t->rank != (uint32_t)rank) OFAIL("output (tensor %u) has rank %u, must be %d", o->op->out, t->rank, rank);
  return 0;
}

int ek_same_dims(const struct ek_tensor* a, const struct ek_tensor* b) {
  return a->rank == b->rank && memcmp(a->dims, b->dims, sizeof a->dims) == 0;
}

int ek_need_same_dims_out(struct ek_check* o, uint32_t k) {
  if (!ek_same_dims(ek_in(o, k), ek_out(o)))
    OFAIL("output (tensor %u) shape differs from input %u (tensor %u)", o->op->out, k, o->op->in[k]);
  return 0;
}

int ek_need_same_quant(struct ek_check* o, uint32_t k) {
  const struct ek_tensor *a = ek_in(o, k), *y = ek_out(o);
  if (a->scale != y->scale || a->zp != y->zp)
    OFAIL("output (tensor %u) scale/zero_point (%g, %d) differ from input %u's (%g, %d); this op does not requantize",
          o->op->out, (double)y->scale, y->zp, k, (double)a->scale, a->zp);
  return 0;
}

int ek_need_param(struct ek_check* o, int i, const char* what, int32_t lo, int32_t hi) {
  int32_t v = o->op->p[i];
  if (v < lo || v > hi) OFAIL("params[%d] (%s) is %d, must be %d..%d", i, what, v, lo, hi);
  return 0;
}

int ek_need_multiplier(struct ek_check* o, int i, const char* what, int32_t shift_max) {
  TRY(ek_need_param(o, i, what, 0, INT32_MAX));
  return ek_need_param(o, i + 1, "shift", EK_SHIFT_MIN, shift_max);
}

int ek_need_act(struct ek_check* o) {
  TRY(ek_need_param(o, 11, "act_min", -128, 127));
  TRY(ek_need_param(o, 12, "act_max", -128, 127));
  if (o->op->p[11] > o->op->p[12]) OFAIL("act_min %d is greater than act_max %d", o->op->p[11], o->op->p[12]);
  return 0;
}

/* params not in `used` (bitmask) must be 0 */
int ek_need_unused_zero(struct ek_check* o, uint32_t used) {
  for (int i = 0; i < EKM_N_PARAMS; i++)
    if (!(used & (1u << i)) && o->op->p[i] != 0) OFAIL("params[%d] is %d; this op does not use it, must be 0", i, o->op->p[i]);
  return 0;
}

static int32_t read_i32(const uint8_t* data, const struct ek_tensor* t, size_t i) {
  int32_t v;
  memcpy(&v, data + t->offset + 4 * i, 4);
  return v;
}

/* bias/mult/shift const vectors of length n (inputs k, k+1, k+2) for the int8 weights [n][kk]
 * of input k-1. Every int32 accumulator stays exact on every ISA: for each output channel,
 * |bias| + 256 * sum|w| < 2^31 bounds the true sum, the scalar kernels' running sums
 * (bias - zx*sum(w) + sum(x*w)) and the VNNI ones' (bias - (zx+128)*sum(w) + sum((x+128)*w)). */
int ek_need_requant_consts(struct ek_check* o, uint32_t k, uint32_t n, uint64_t kk) {
  static const char* const what[3] = {"bias", "multiplier", "shift"};
  for (uint32_t q = 0; q < 3; q++) {
    TRY(ek_need_in(o, k + q, what[q], EKM_I32, 1u << EKM_CONST, 1));
    if (ek_in(o, k + q)->dims[0] != n)
      OFAIL("input %u (%s) has %u values, must be %u (one per output channel)", k + q, what[q], ek_in(o, k + q)->dims[0], n);
  }
  const uint8_t* w = o->data + ek_in(o, k - 1)->offset;
  for (uint32_t ch = 0; ch < n; ch++) {
    int32_t b = read_i32(o->data, ek_in(o, k), ch), mu = read_i32(o->data, ek_in(o, k + 1), ch), sh = read_i32(o->data, ek_in(o, k + 2), ch);
    if (mu < 0) OFAIL("multiplier[%u] is %d, must be >= 0", ch, mu);
    if (sh < EK_SHIFT_MIN || sh > EK_SHIFT_MAX) OFAIL("shift[%u] is %d, must be %d..%d", ch, sh, EK_SHIFT_MIN, EK_SHIFT_MAX);
    uint64_t sum_abs = 0;
    for (uint64_t i = 0; i < kk; i++) {
      int8_t v = (int8_t)w[ch * kk + i];
      sum_abs += (uint64_t)(v < 0 ? -(int)v : v);
    }
    uint64_t bound = (uint64_t)(b < 0 ? -(int64_t)b : (int64_t)b) + 256 * sum_abs;
    if (bound > (uint64_t)INT32_MAX)
      OFAIL("output channel %u: |bias| + 256 * sum|w| = %llu exceeds 2^31 - 1 (an int32 accumulator could overflow)",
            ch, (unsigned long long)bound);
  }
  return 0;
}

static int check_op(struct vctx* c, uint32_t j, const struct ekm_op* r, struct ek_op* op) {
  const struct ek_op_desc* d = ek_op_desc(r->type);
  if (!d) FAIL("op %u: type is %u, must be 1..%d", j, r->type, EKM_OP_LAST);
  const char* name = d->name;
  if (r->n_inputs < d->min_in || r->n_inputs > d->max_in)
    FAIL("op %u (%s): n_inputs is %u, must be %u..%u", j, name, r->n_inputs, d->min_in, d->max_in);
  for (uint32_t k = 0; k < EKM_MAX_OP_INPUTS; k++) {
    if (k < r->n_inputs && r->inputs[k] >= c->h.n_tensors)
      FAIL("op %u (%s): inputs[%u] is tensor %u, there are %u tensors", j, name, k, r->inputs[k], c->h.n_tensors);
    if (k >= r->n_inputs && r->inputs[k] != 0) FAIL("op %u (%s): unused inputs[%u] is %u, must be 0", j, name, k, r->inputs[k]);
  }
  if (r->n_outputs != 1) FAIL("op %u (%s): n_outputs is %u, must be 1", j, name, r->n_outputs);
  if (r->outputs[0] >= c->h.n_tensors)
    FAIL("op %u (%s): outputs[0] is tensor %u, there are %u tensors", j, name, r->outputs[0], c->h.n_tensors);
  op->type = r->type;
  op->desc = d;
  op->n_in = r->n_inputs;
  memcpy(op->in, r->inputs, sizeof op->in);
  op->out = r->outputs[0];
  memcpy(op->p, r->params, sizeof op->p);

  /* dataflow: each non-const tensor written once, by an op before any reader */
  uint32_t y = op->out;
  if (c->t[y].storage == EKM_CONST) FAIL("op %u (%s): output tensor %u is a const tensor", j, name, y);
  if (c->role[y] == 1) FAIL("op %u (%s): output tensor %u is a graph input", j, name, y);
  if (c->def[y]) FAIL("op %u (%s): output tensor %u is already written by op %u", j, name, y, c->def[y] - 1);
  for (uint32_t k = 0; k < op->n_in; k++) {
    uint32_t x = op->in[k];
    const struct ek_tensor* t = &c->t[x];
    if (x == y) FAIL("op %u (%s): tensor %u is both input %u and the output", j, name, x, k);
    if (t->storage == EKM_ARENA && !c->def[x]) FAIL("op %u (%s): input %u (tensor %u) is read before any op writes it", j, name, k, x);
    if (t->storage == EKM_IO && c->role[x] != 1) FAIL("op %u (%s): input %u (tensor %u) is a graph output", j, name, k, x);
  }
  struct ek_check o = {c->t, c->buf + c->h.data_offset, c->role, op, j, name, c->err, c->err_len};
  TRY(d->check(&o));
  c->def[y] = j + 1;
  for (uint32_t k = 0; k < op->n_in; k++) c->last[op->in[k]] = j + 1;
  return 0;
}

/* Arena tensors whose byte ranges overlap must not be live at the same time, except an
 * exact alias: RESHAPE order 0 (same bytes), or an in-place ADD/MUL/LUT whose input dies there. */
static uint32_t find_root(uint32_t* alias, uint32_t i) {
  while (alias[i] != i) i = alias[i] = alias[alias[i]];
  return i;
}

struct span {
  uint64_t lo, hi;
  uint32_t t;
};
static int span_cmp(const void* a, const void* b) {
  const struct span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : (x->t < y->t ? -1 : x->t > y->t);
}

static int in_place_ok(const struct vctx* c, const struct ek_op* ops, uint32_t in, uint32_t out) {
  const struct ek_tensor *a = &c->t[in], *b = &c->t[out];
  if (a->offset != b->offset || a->bytes != b->bytes) return 0;
  const struct ek_op* op = &ops[c->def[out] - 1];
  if (!op->desc->in_place) return 0;
  int is_input = 0;
  for (uint32_t k = 0; k < op->n_in; k++) is_input |= op->in[k] == in;
  return is_input && c->last[in] == c->def[out]; /* the input dies at the op that overwrites it */
}

static int check_lifetimes(struct vctx* c, const struct ek_op* ops) {
  uint32_t n = c->h.n_tensors, ns = 0;
  struct span* s = malloc(sizeof *s * n);
  if (!s) return EKRT_ENOMEM;
  for (uint32_t i = 0; i < n; i++) c->alias[i] = i;
  for (uint32_t j = 0; j < c->h.n_ops; j++) {
    const struct ek_op* op = &ops[j];
    const struct ek_tensor *x = &c->t[op->in[0]], *y = &c->t[op->out];
    if (op->type == EKM_RESHAPE && op->p[0] == 0 && x->offset == y->offset)
      c->alias[find_root(c->alias, op->out)] = find_root(c->alias, op->in[0]);
  }
  for (uint32_t i = 0; i < n; i++)
    if (c->t[i].storage == EKM_ARENA && c->def[i]) s[ns++] = (struct span){c->t[i].offset, c->t[i].offset + c->t[i].bytes, i};
  qsort(s, ns, sizeof *s, span_cmp);
  int rc = 0;
  for (uint32_t a = 0; a < ns && !rc; a++) {
    for (uint32_t b = a + 1; b < ns && s[b].lo < s[a].hi; b++) {
      uint32_t ta = s[a].t, tb = s[b].t;
      if (find_root(c->alias, ta) == find_root(c->alias, tb)) continue;
      uint32_t da = c->def[ta], la = c->last[ta] > da ? c->last[ta] : da;
      uint32_t db = c->def[tb], lb = c->last[tb] > db ? c->last[tb] : db;
      if (la < db || lb < da) continue; /* lifetimes [def, last] do not meet */
      if ((la == db && in_place_ok(c, ops, ta, tb)) || (lb == da && in_place_ok(c, ops, tb, ta))) continue;
      rc = ek_fail(c->err, c->err_len,
                   "tensors %u and %u share arena bytes [%llu, %llu) while both are live (ops %u..%u and %u..%u): "
                   "the memory plan is wrong",
                   ta, tb, (unsigned long long)s[b].lo, (unsigned long long)(s[a].hi < s[b].hi ? s[a].hi : s[b].hi), da - 1,
                   la - 1, db - 1, lb - 1);
      break;
    }
  }
  free(s);
  return rc;
}

void ekrt_free(ekrt_model* m) {
  if (!m) return;
  if (m->pool) ek_pool_destroy(m->pool);
  if (m->ops)
    for (uint32_t j = 0; j < m->n_ops; j++)
      if (m->ops[j].state) m->ops[j].desc->free ? m->ops[j].desc->free(m->ops[j].state) : free(m->ops[j].state);
  if (m->tensors)
    for (uint32_t i = 0; i < m->n_tensors; i++)
      if (m->tensors[i].storage == EKM_CONST) free(m->tensors[i].data); /* copies own_const_inputs made */
  free(m->ops);
  free(m->tensors);
  free(m->io);
  free(m->names);
  free(m->arena);
  free(m->scratch);
  free(m);
}

static void* aligned_zalloc(size_t n) {
  void* p = NULL;
  if (posix_memalign(&p, 64, n ? n : 64) != 0) return NULL;
  memset(p, 0, n ? n : 64);
  return p;
}

static int load_checked(struct vctx* c, ekrt_model* m) {
  const struct ekm_header* h = &c->h;
  TRY(check_header(c));
  m->n_tensors = h->n_tensors;
  m->n_ops = h->n_ops;
  m->n_inputs = h->n_inputs;
  m->n_outputs = h->n_outputs;
  m->tensors = calloc(h->n_tensors, sizeof *m->tensors);
  m->ops = calloc(h->n_ops, sizeof *m->ops);
  m->io = calloc(h->n_inputs + h->n_outputs, sizeof *m->io);
  c->def = calloc(h->n_tensors, sizeof *c->def);
  c->last = calloc(h->n_tensors, sizeof *c->last);
  c->role = calloc(h->n_tensors, 1);
  c->alias = calloc(h->n_tensors, sizeof *c->alias);
  if (!m->tensors || !m->ops || !m->io || !c->def || !c->last || !c->role || !c->alias) return EKRT_ENOMEM;
  c->t = m->tensors;
  for (uint32_t i = 0; i < h->n_tensors; i++) {
    struct ekm_tensor r;
    memcpy(&r, c->buf + h->tensors_offset + (uint64_t)i * sizeof r, sizeof r);
    TRY(check_tensor(c, i, &r, &m->tensors[i]));
  }
  size_t names_len = 0;
  uint32_t n_io = h->n_inputs + h->n_outputs;
  for (uint32_t k = 0; k < n_io; k++) {
    struct ekm_io r;
    memcpy(&r, c->buf + h->io_offset + (uint64_t)k * sizeof r, sizeof r);
    const char* kind = k < h->n_inputs ? "input" : "output";
    uint32_t idx = k < h->n_inputs ? k : k - h->n_inputs;
    if (r.tensor >= h->n_tensors) FAIL("io %s %u: tensor is %u, there are %u tensors", kind, idx, r.tensor, h->n_tensors);
    if (m->tensors[r.tensor].storage != EKM_IO)
      FAIL("io %s %u: tensor %u has storage %s, must be io", kind, idx, r.tensor, storage_name(m->tensors[r.tensor].storage));
    if (c->role[r.tensor]) FAIL("io %s %u: tensor %u is already named by another io entry", kind, idx, r.tensor);
    c->role[r.tensor] = k < h->n_inputs ? 1 : 2;
    if (r.name_length < 1 || r.name_length > EK_MAX_NAME)
      FAIL("io %s %u: name_length is %u, must be 1..%u", kind, idx, r.name_length, EK_MAX_NAME);
    if (!range_ok(r.name_offset, r.name_length, h->data_size))
      FAIL("io %s %u: name at %llu + %u bytes is outside data (data_size %llu)", kind, idx,
           (unsigned long long)r.name_offset, r.name_length, (unsigned long long)h->data_size);
    m->io[k].tensor = r.tensor;
    m->io[k].name_len = r.name_length;
    m->io[k].name = (const char*)(uintptr_t)r.name_offset; /* fixed up below */
    names_len += r.name_length + 1;
  }
  for (uint32_t i = 0; i < h->n_tensors; i++)
    if (m->tensors[i].storage == EKM_IO && !c->role[i]) FAIL("tensor %u: an io tensor that no io entry names", i);
  m->names = malloc(names_len);
  if (!m->names) return EKRT_ENOMEM;
  size_t at = 0;
  for (uint32_t k = 0; k < n_io; k++) {
    uint64_t off = (uint64_t)(uintptr_t)m->io[k].name;
    memcpy(m->names + at, c->buf + h->data_offset + off, m->io[k].name_len);
    m->names[at + m->io[k].name_len] = '\0';
    m->io[k].name = m->names + at;
    at += m->io[k].name_len + 1;
  }
  for (uint32_t j = 0; j < h->n_ops; j++) {
    struct ekm_op r;
    memcpy(&r, c->buf + h->ops_offset + (uint64_t)j * sizeof r, sizeof r);
    TRY(check_op(c, j, &r, &m->ops[j]));
  }
  for (uint32_t k = h->n_inputs; k < n_io; k++)
    if (!c->def[m->io[k].tensor]) FAIL("io output %u: tensor %u is never written by an op", k - h->n_inputs, m->io[k].tensor);
  TRY(check_lifetimes(c, m->ops));

  m->arena_size = (size_t)h->arena_size;
  /* not zeroed: every arena tensor is written before it is read (checked above), and pages
   * of a large arena stay untouched until a run needs them */
  if (posix_memalign((void**)&m->arena, 64, m->arena_size + EK_SLACK) != 0) m->arena = NULL;
  if (!m->arena) return EKRT_ENOMEM;
  for (uint32_t i = 0; i < h->n_tensors; i++)
    if (m->tensors[i].storage == EKM_ARENA) m->tensors[i].data = m->arena + m->tensors[i].offset;
  const uint8_t* data = c->buf + h->data_offset;
  for (uint32_t j = 0; j < h->n_ops; j++)
    if (m->ops[j].desc->prepare) TRY(m->ops[j].desc->prepare(m, &m->ops[j], data, c->err, c->err_len));
  ek_fuse_luts(m);
  m->threads = 1;
  if (m->scratch_per_thread) {
    m->scratch = aligned_zalloc(m->scratch_per_thread);
    if (!m->scratch) return EKRT_ENOMEM;
  }
  return 0;
}

int ekrt_load(const void* data, size_t size, ekrt_model** out, char* err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (!out) return EKRT_EARG;
  *out = NULL;
  if (!data && size) return EKRT_EARG;
  if (size < sizeof(struct ekm_header))
    return ek_fail(err, err_len, "header: the file has %llu bytes, shorter than the %u-byte header", (unsigned long long)size,
                   (unsigned)sizeof(struct ekm_header));
  struct vctx c;
  memset(&c, 0, sizeof c);
  c.buf = data;
  c.size = size;
  c.err = err;
  c.err_len = err_len;
  memcpy(&c.h, data, sizeof c.h);
  ekrt_model* m = calloc(1, sizeof *m);
  if (!m) return EKRT_ENOMEM;
  int rc = load_checked(&c, m);
  free(c.def);
  free(c.last);
  free(c.role);
  free(c.alias);
  if (rc) {
    if (rc == EKRT_ENOMEM) ek_fail(err, err_len, "out of memory while loading the model");
    ekrt_free(m);
    return rc;
  }
  *out = m;
  return 0;
}

int ekrt_load_file(const char* path, ekrt_model** out, char* err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  if (!path || !out) return EKRT_EARG;
  *out = NULL;
  /* O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    ek_fail(err, err_len, "cannot open %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return EKRT_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    ek_fail(err, err_len, "%s is not a regular file (a device, FIFO or directory); give the path of an .ekm file", path);
    return EKRT_EIO;
  }
  if ((uint64_t)st.st_size > EKRT_MAX_FILE_BYTES) {
    close(fd);
    return ek_fail(err, err_len, "%s has %llu bytes, more than the %llu an .ekm file may have (EKRT_MAX_FILE_BYTES)", path,
                   (unsigned long long)st.st_size, (unsigned long long)EKRT_MAX_FILE_BYTES);
  }
  size_t size = (size_t)st.st_size, len = 0;
  uint8_t* buf = malloc(size ? size : 1);
  if (!buf) {
    close(fd);
    ek_fail(err, err_len, "out of memory reading %s", path);
    return EKRT_ENOMEM;
  }
  while (len < size) { /* a file that shrinks meanwhile is caught by the header's file_size */
    ssize_t got = read(fd, buf + len, size - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      ek_fail(err, err_len, "cannot read %s: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return EKRT_EIO;
    }
    if (got == 0) break;
    len += (size_t)got;
  }
  close(fd);
  int rc = ekrt_load(buf, len, out, err, err_len);
  free(buf);
  return rc;
}
