/* CONV2D and FULLY_CONNECTED: weights packed once at load for the chosen qs8-gemm kernel (or
 * qs8-dwconv for depthwise), then run as tiles spread over the model's threads.
 *
 *   1x1, stride 1, no pad, 1 group  -> qs8-gemm straight on the NHWC input (rows = pixels)
 *   depthwise (group == C == M)     -> qs8-dwconv over a per-row indirection buffer, built per
 *                                      row at run time (column-shared without dilation)
 *   anything else                   -> im2col of a block of output pixels, then qs8-gemm,
 *                                      per group
 * Padding reads the input's zero point (real zero). */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- load-time checks ---- */

static int out_dim_ok(int64_t in, int64_t k, int64_t s, int64_t d, int64_t p0, int64_t p1, int64_t out) {
  int64_t span = d * (k - 1) + 1;
  if (in + p0 + p1 < span) return 0;
  return out == (in + p0 + p1 - span) / s + 1;
}

int ek_check_conv(struct ek_check* o) {
  const struct ek_op* op = o->op;
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, 4));
  TRY(ek_need_in(o, 1, "weights", EKM_I8, ST_CONST, 4));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, 4));
  const struct ek_tensor *x = ek_in(o, 0), *w = ek_in(o, 1), *y = ek_out(o);
  uint32_t M = w->dims[0], KH = w->dims[1], KW = w->dims[2], CG = w->dims[3];
  uint64_t K = (uint64_t)KH * KW * CG;
  if (K > EK_MAX_GEMM_K) OFAIL("kernel volume %llu (kh*kw*c/group) exceeds %u", (unsigned long long)K, EK_MAX_GEMM_K);
  TRY(ek_need_requant_consts(o, 2, M, K));
  TRY(ek_need_param(o, 0, "kernel h", 1, (int32_t)EK_MAX_WINDOW));
  TRY(ek_need_param(o, 1, "kernel w", 1, (int32_t)EK_MAX_WINDOW));
  if ((uint32_t)op->p[0] != KH || (uint32_t)op->p[1] != KW)
    OFAIL("params[0..1] (kernel %dx%d) differ from the weights' %ux%u", op->p[0], op->p[1], KH, KW);
  TRY(ek_need_param(o, 2, "stride h", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 3, "stride w", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 4, "dilation h", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 5, "dilation w", 1, EK_MAX_STRIDE));
  TRY(ek_need_param(o, 6, "pad top", 0, EK_MAX_PAD));
  TRY(ek_need_param(o, 7, "pad left", 0, EK_MAX_PAD));
  TRY(ek_need_param(o, 8, "pad bottom", 0, EK_MAX_PAD));
  TRY(ek_need_param(o, 9, "pad right", 0, EK_MAX_PAD));
  TRY(ek_need_param(o, 10, "group", 1, INT32_MAX));
  TRY(ek_need_act(o));
  TRY(ek_need_unused_zero(o, 0x1FFF));
  uint32_t g = (uint32_t)op->p[10];
  if (x->dims[3] % g != 0 || x->dims[3] / g != CG)
    OFAIL("input channels %u do not split into %u groups of the weights' %u", x->dims[3], g, CG);
  if (M % g != 0) OFAIL("%u output channels do not split into %u groups", M, g);
  if (y->dims[0] != x->dims[0] || y->dims[3] != M)
    OFAIL("output dims [%u,%u,%u,%u] do not match batch %u and %u output channels", y->dims[0], y->dims[1], y->dims[2],
          y->dims[3], x->dims[0], M);
  if (!out_dim_ok(x->dims[1], KH, op->p[2], op->p[4], op->p[6], op->p[8], y->dims[1]))
    OFAIL("output height %u does not follow from input height %u, kernel %u, stride %d, dilation %d, pads %d/%d",
          y->dims[1], x->dims[1], KH, op->p[2], op->p[4], op->p[6], op->p[8]);
  if (!out_dim_ok(x->dims[2], KW, op->p[3], op->p[5], op->p[7], op->p[9], y->dims[2]))
    OFAIL("output width %u does not follow from input width %u, kernel %u, stride %d, dilation %d, pads %d/%d",
          y->dims[2], x->dims[2], KW, op->p[3], op->p[5], op->p[7], op->p[9]);
  return 0;
}

int ek_check_fc(struct ek_check* o) {
  TRY(ek_need_in(o, 0, "x", EKM_I8, ST_ARENA, -1));
  TRY(ek_need_in(o, 1, "weights", EKM_I8, ST_CONST, 2));
  TRY(ek_need_out(o, EKM_I8, ST_ARENA, -1));
  const struct ek_tensor *x = ek_in(o, 0), *w = ek_in(o, 1), *y = ek_out(o);
  uint32_t N = w->dims[0], K = w->dims[1];
  if (K > EK_MAX_GEMM_K) OFAIL("K is %u, exceeds %u", K, EK_MAX_GEMM_K);
  TRY(ek_need_requant_consts(o, 2, N, K));
  TRY(ek_need_act(o));
  TRY(ek_need_unused_zero(o, P(11) | P(12)));
  int x_ok = (x->rank == 2 && x->dims[1] == K) || (x->rank == 4 && x->dims[1] == 1 && x->dims[2] == 1 && x->dims[3] == K);
  if (!x_ok) OFAIL("input x (tensor %u) must be [B,%u] or [B,1,1,%u]", o->op->in[0], K, K);
  int y_ok = (y->rank == 2 && y->dims[1] == N) || (y->rank == 4 && y->dims[1] == 1 && y->dims[2] == 1 && y->dims[3] == N);
  if (!y_ok || y->dims[0] != x->dims[0]) OFAIL("output (tensor %u) must be [%u,%u] or [%u,1,1,%u]", o->op->out, x->dims[0], N, x->dims[0], N);
  return 0;
}

enum conv_kind { CONV_DIRECT = 0, CONV_IM2COL = 1, CONV_DEPTHWISE = 2, CONV_FC = 3 };

struct conv_state {
  enum conv_kind kind;
  /* geometry (NHWC; FULLY_CONNECTED sets only oh = ow = 1 of geo) */
  struct ek_geometry geo;
  size_t batch, m, groups, cg, mg, k;
  int32_t zx;
  /* gemm */
  ek_qs8_gemm_fn gemm;
  size_t mr, nr, kr, block_bytes, group_bytes, rows_per_task;
  int work_shift; /* ek_conv_work_shift: 2 on AMX's GEMM */
  ek_qs8_flip_fn flip; /* the GEMM multiplies unsigned bytes: a task hands it x ^ 0x80 (kernels.h); else NULL */
  const char* kernel; /* the gemm or dwconv kernel's name (ek_conv_kernel) */
  /* dwconv */
  ek_qs8_dwconv_fn dwconv;
  int8_t* zero_row; /* c bytes of zx, for padding taps */
  int shared_columns;         /* depthwise without width dilation: taps in (kx, ky) order */
  const int8_t** columns;     /* shared columns: every row's pointers, built at load when small */
  size_t row_pointers;        /* pointers per row (shared columns) */
  void* packed;     /* groups * group_bytes (gemm) or the dwconv packing */
  int32_t* mult;
  int32_t* shift;
  int32_t zp_out, qmin, qmax;
  const uint8_t* lut; /* a LUT fused in (ek_conv_fuse_lut): its rotated table, applied to each
                         task's outputs while they are in this core's cache; else NULL */
};

/* the run-time view handed to tasks */
struct conv_job {
  struct ekrt_model* model;
  const struct conv_state* s;
  const int8_t* x;
  int8_t* y;
  /* gemm kinds: tasks are (group, row block, column block) tiles; depthwise: (output row,
   * pixel chunk) */
  size_t rows_per_task, row_blocks, col_blocks, cols_per_block;
  size_t px_per_task, px_chunks;
  uint64_t id; /* this run of the op, unique (im2col_reuse) */
};

static void* aligned_alloc64(size_t n) {
  void* p = NULL;
  return posix_memalign(&p, 64, n ? n : 64) == 0 ? p : NULL;
}

static void gemm_cols(const struct conv_state* s, size_t g, size_t rows, const int8_t* a, size_t a_stride, int8_t* y,
                      size_t y_stride, size_t col0, size_t cols) {
  const uint8_t* packed = (const uint8_t*)s->packed + g * s->group_bytes + (col0 / s->nr) * s->block_bytes;
  size_t ch0 = g * s->mg + col0;
  struct ek_requant_params rq = {s->mult + ch0, s->shift + ch0, s->zp_out, s->qmin, s->qmax};
  s->gemm(rows, cols, s->k, a, a_stride, packed, y + ch0, y_stride, &rq);
}

/* a fused LUT over `rows` rows of `cols` outputs from column ch0 (row stride m), in place */
static void apply_lut(const struct conv_state* s, int8_t* y, size_t rows, size_t ch0, size_t cols) {
  const ek_x8_lut_fn lut = ek_kernels()->lut;
  if (cols == s->m) {
    lut(rows * cols, (const uint8_t*)y, (uint8_t*)y, s->lut);
    return;
  }
  for (size_t r = 0; r < rows; r++) lut(cols, (const uint8_t*)(y + r * s->m + ch0), (uint8_t*)(y + r * s->m + ch0), s->lut);
}

/* task i = (group, row block, column block): its group, first row, rows, first column, columns */
struct tile {
  size_t g, r0, rows, c0, cols;
};
static struct tile task_tile(const struct conv_job* j, size_t i) {
  const struct conv_state* s = j->s;
  size_t cb = i % j->col_blocks;
  i /= j->col_blocks;
  size_t rb = i % j->row_blocks, rows_total = s->batch * s->geo.oh * s->geo.ow;
  struct tile t = {i / j->row_blocks, rb * j->rows_per_task, 0, cb * j->cols_per_block, 0};
  t.rows = ek_min_sz(j->rows_per_task, rows_total - t.r0);
  t.cols = ek_min_sz(j->cols_per_block, s->mg - t.c0);
  return t;
}

static void task_direct(void* ctx, size_t i, int thread) {
  const struct conv_job* j = ctx;
  const struct conv_state* s = j->s;
  const struct tile t = task_tile(j, i);
  size_t a_stride = s->kind == CONV_FC ? s->k : s->geo.c;
  const int8_t* a = j->x + t.r0 * a_stride;
  if (s->flip) { /* the tile's rows, flipped once into this thread's scratch (k per row) */
    int8_t* flipped = (int8_t*)j->model->scratch + (size_t)thread * j->model->scratch_per_thread;
    s->flip(t.rows, s->k, a, a_stride, flipped);
    a = flipped;
    a_stride = s->k;
  }
  gemm_cols(s, t.g, t.rows, a, a_stride, j->y + t.r0 * s->m, s->m, t.c0, t.cols);
  if (s->lut) apply_lut(s, j->y + t.r0 * s->m, t.rows, t.g * s->mg + t.c0, t.cols);
}

/* a copy of n bytes; up to 256 inline, not a library call (a stem conv's kw * C = 9: two
 * overlapping 8-byte moves; 17-256: 16-byte moves, the last one overlapping) */
static inline void copy_bytes(int8_t* dst, const int8_t* src, size_t n) {
  if (n >= 8 && n <= 16) {
    uint64_t lo, hi;
    memcpy(&lo, src, 8);
    memcpy(&hi, src + n - 8, 8);
    memcpy(dst, &lo, 8);
    memcpy(dst + n - 8, &hi, 8);
  } else if (n > 16 && n <= 256) {
    for (size_t o = 0; o + 16 < n; o += 16) memcpy(dst + o, src + o, 16);
    memcpy(dst + n - 16, src + n - 16, 16);
  } else if (n < 8) {
    for (size_t i = 0; i < n; i++) dst[i] = src[i];
  } else {
    memcpy(dst, src, n);
  }
}

#define EK_IM2COL_ROWS 16 /* kernel heights up to this keep their input row pointers per output row */

/* np consecutive pixels' taps of one kernel row: pixel p's kwc bytes from src + p * step to
 * dst + p * k (src NULL: a padding row, zx) */
static void im2col_run(int8_t* dst, size_t k, const int8_t* src, size_t step, size_t kwc, size_t np, int zx) {
  if (!src)
    for (size_t p = 0; p < np; p++, dst += k) memset(dst, zx, kwc);
  else if (kwc >= 8 && kwc <= 16) /* the stem's 9: copy_bytes's test out of the loop */
    for (size_t p = 0; p < np; p++, dst += k, src += step) copy_bytes(dst, src, kwc);
  else
    for (size_t p = 0; p < np; p++, dst += k, src += step) copy_bytes(dst, src, kwc);
}

static void im2col(const struct conv_state* s, const int8_t* x, size_t g, size_t r0, size_t rows, int8_t* a) {
  /* the geometry in locals: the copies store bytes, which as far as the compiler knows may alias
   * *s (a stem conv's im2col reloaded its fields: 127 instructions an output pixel) */
  const size_t cg = s->cg, k = s->k, kh = s->geo.kh, kw = s->geo.kw, sh = s->geo.sh, sw = s->geo.sw;
  const size_t dh = s->geo.dh, dw = s->geo.dw, h = s->geo.h, w = s->geo.w, c = s->geo.c;
  const size_t oh = s->geo.oh, ow = s->geo.ow, kwc = kw * cg, row_bytes = w * c;
  const int64_t pt = (int64_t)s->geo.pt, pl = (int64_t)s->geo.pl, span = (int64_t)((kw - 1) * dw);
  const int zx = s->zx;
  /* one group, no dilation, few kernel rows: the output pixels ox in [ox_lo, ox_hi) read kw*C
   * contiguous input bytes per kernel row, and go kernel row by kernel row, as runs */
  const int runs = s->groups == 1 && dw == 1 && kh <= EK_IM2COL_ROWS;
  size_t ox_lo = (size_t)((pl + (int64_t)sw - 1) / (int64_t)sw), ox_hi = 0;
  if ((int64_t)w + pl - span > 0) ox_hi = ek_min_sz(ow, (size_t)(((int64_t)w + pl - span - 1) / (int64_t)sw) + 1);
  size_t ox = r0 % ow, oy = (r0 / ow) % oh, n = r0 / (ow * oh);
  const int8_t* rowp[EK_IM2COL_ROWS]; /* this output row's input rows (NULL: padding) */
  int fresh = 0;
  for (size_t r = 0; r < rows;) {
    if (!fresh && kh <= EK_IM2COL_ROWS) {
      for (size_t ky = 0; ky < kh; ky++) {
        int64_t iy = (int64_t)(oy * sh + ky * dh) - pt;
        rowp[ky] = iy < 0 || iy >= (int64_t)h ? NULL : x + (n * h + (size_t)iy) * row_bytes + g * cg;
      }
      fresh = 1;
    }
    int8_t* dst = a + r * k;
    const int64_t ix0 = (int64_t)(ox * sw) - pl;
    size_t np = 1;
    if (runs && ox >= ox_lo && ox < ox_hi) {
      np = ek_min_sz(ox_hi - ox, rows - r);
      for (size_t ky = 0; ky < kh; ky++)
        im2col_run(dst + ky * kwc, k, rowp[ky] ? rowp[ky] + (size_t)ix0 * c : NULL, sw * c, kwc, np, zx);
    } else {
      for (size_t ky = 0; ky < kh; ky++, dst += kwc) {
        const int8_t* row;
        if (kh <= EK_IM2COL_ROWS) {
          row = rowp[ky];
        } else {
          int64_t iy = (int64_t)(oy * sh + ky * dh) - pt;
          row = iy < 0 || iy >= (int64_t)h ? NULL : x + (n * h + (size_t)iy) * row_bytes + g * cg;
        }
        if (!row) {
          memset(dst, zx, kwc);
          continue;
        }
        if (s->groups == 1 && dw == 1 && ix0 >= 0 && ix0 + span < (int64_t)w) {
          copy_bytes(dst, row + (size_t)ix0 * c, kwc);
          continue;
        }
        for (size_t kx = 0; kx < kw; kx++) {
          int64_t ix = ix0 + (int64_t)(kx * dw);
          if (ix < 0 || ix >= (int64_t)w)
            memset(dst + kx * cg, zx, cg);
          else
            copy_bytes(dst + kx * cg, row + (size_t)ix * c, cg);
        }
      }
    }
    r += np;
    ox += np;
    if (ox == ow) { /* next output row without a division per pixel */
      ox = 0;
      fresh = 0;
      if (++oy == oh) {
        oy = 0;
        n++;
      }
    }
  }
}

/* The rows a thread's scratch holds: a task whose column block differs from the one before it
 * on the same thread (a range of tasks runs a row block's column blocks one after another)
 * takes them as they are instead of building them again. */
static _Thread_local struct {
  uint64_t id;
  int thread;
  size_t g, r0;
} im2col_reuse;
static atomic_uint_fast64_t conv_runs;

static void task_im2col(void* ctx, size_t i, int thread) {
  const struct conv_job* j = ctx;
  const struct conv_state* s = j->s;
  const struct tile t = task_tile(j, i);
  int8_t* a = (int8_t*)j->model->scratch + (size_t)thread * j->model->scratch_per_thread;
  if (im2col_reuse.id != j->id || im2col_reuse.thread != thread || im2col_reuse.g != t.g || im2col_reuse.r0 != t.r0) {
    im2col(s, j->x, t.g, t.r0, t.rows, a);
    if (s->flip) s->flip(t.rows, s->k, a, s->k, a);
    im2col_reuse.id = j->id;
    im2col_reuse.thread = thread;
    im2col_reuse.g = t.g;
    im2col_reuse.r0 = t.r0;
  }
  gemm_cols(s, t.g, t.rows, a, s->k, j->y + t.r0 * s->m, s->m, t.c0, t.cols);
  if (s->lut) apply_lut(s, j->y + t.r0 * s->m, t.rows, t.g * s->mg + t.c0, t.cols);
}

#define EK_DW_PIXELS 64                /* output pixels per indirection chunk (width-dilated depthwise) */
#define EK_DW_TABLE_BYTES (512u << 10) /* up to this, the shared-column pointers are built at load */

/* Without width dilation, output pixel p reads input columns p*sw .. p*sw + kw - 1: one pointer
 * per (input column, kernel row), column-major, serves every pixel reading that column; pixel
 * p's taps are the kw*kh pointers from p*sw*kh on (input_step sw*kh), in (kx, ky) order, which
 * is the order the weights are packed in. A third of the per-pixel table at stride 1 (a
 * prebuilt per-pixel table was 72 bytes a pixel of a 3x3, more than the pixel's activations). */
static void fill_columns(const struct conv_state* s, const int8_t* x, size_t n, size_t oy, const int8_t** ind) {
  size_t cols = (s->geo.ow - 1) * s->geo.sw + s->geo.kw;
  for (size_t ky = 0; ky < s->geo.kh; ky++) {
    int64_t iy = (int64_t)(oy * s->geo.sh + ky * s->geo.dh) - (int64_t)s->geo.pt;
    const int8_t* row = iy >= 0 && iy < (int64_t)s->geo.h ? x + (n * s->geo.h + (size_t)iy) * s->geo.w * s->geo.c : NULL;
    for (size_t col = 0; col < cols; col++) {
      int64_t ix = (int64_t)col - (int64_t)s->geo.pl;
      ind[col * s->geo.kh + ky] = row && ix >= 0 && ix < (int64_t)s->geo.w ? row + (size_t)ix * s->geo.c : s->zero_row;
    }
  }
}

/* the tap pointers of output pixels [ox0, ox0 + np) of row (n, oy) */
static void fill_indirection(const struct conv_state* s, const int8_t* x, size_t n, size_t oy, size_t ox0, size_t np,
                             const int8_t** ind) {
  size_t ks = s->geo.kh * s->geo.kw;
  for (size_t p = 0; p < np; p++) {
    size_t ox = ox0 + p;
    for (size_t ky = 0; ky < s->geo.kh; ky++) {
      int64_t iy = (int64_t)(oy * s->geo.sh + ky * s->geo.dh) - (int64_t)s->geo.pt;
      int row_in = iy >= 0 && iy < (int64_t)s->geo.h;
      for (size_t kx = 0; kx < s->geo.kw; kx++) {
        int64_t ix = (int64_t)(ox * s->geo.sw + kx * s->geo.dw) - (int64_t)s->geo.pl;
        const int8_t* src = s->zero_row;
        if (row_in && ix >= 0 && ix < (int64_t)s->geo.w) src = x + ((n * s->geo.h + (size_t)iy) * s->geo.w + (size_t)ix) * s->geo.c;
        ind[p * ks + ky * s->geo.kw + kx] = src;
      }
    }
  }
}

static void task_depthwise(void* ctx, size_t i, int thread) {
  const struct conv_job* j = ctx;
  const struct conv_state* s = j->s;
  size_t row = i / j->px_chunks, oy = row % s->geo.oh, n = row / s->geo.oh, ks = s->geo.kh * s->geo.kw;
  size_t px0 = (i % j->px_chunks) * j->px_per_task, px1 = ek_min_sz(px0 + j->px_per_task, s->geo.ow);
  struct ek_requant_params rq = {s->mult, s->shift, s->zp_out, s->qmin, s->qmax};
  int8_t* yrow = j->y + (n * s->geo.oh + oy) * s->geo.ow * s->geo.c;
  const int8_t** ind =
      (const int8_t**)(void*)(j->model->scratch + (size_t)thread * j->model->scratch_per_thread);
  if (s->shared_columns) {
    if (s->columns)
      ind = s->columns + row * s->row_pointers;
    else
      fill_columns(s, j->x, n, oy, ind);
    size_t step = s->geo.sw * s->geo.kh;
    s->dwconv(s->geo.c, px1 - px0, ks, ind + px0 * step, step, s->packed, yrow + px0 * s->geo.c, s->geo.c, &rq);
  } else {
    for (size_t ox0 = px0; ox0 < px1; ox0 += EK_DW_PIXELS) {
      size_t np = ek_min_sz(EK_DW_PIXELS, px1 - ox0);
      fill_indirection(s, j->x, n, oy, ox0, np, ind);
      s->dwconv(s->geo.c, np, ks, ind, ks, s->packed, yrow + ox0 * s->geo.c, s->geo.c, &rq);
    }
  }
  if (s->lut) apply_lut(s, yrow + px0 * s->geo.c, 1, 0, (px1 - px0) * s->geo.c);
}

static uint64_t work_depthwise(void* ctx, size_t i) {
  const struct conv_job* j = ctx;
  size_t px0 = (i % j->px_chunks) * j->px_per_task, px = ek_min_sz(j->px_per_task, j->s->geo.ow - px0);
  return (uint64_t)px * j->s->geo.c * j->s->geo.kh * j->s->geo.kw;
}

static uint64_t work_gemm(void* ctx, size_t i) {
  const struct conv_job* j = ctx;
  const struct tile t = task_tile(j, i);
  return (uint64_t)t.rows * t.cols * j->s->k;
}

/* Tasks per thread an op is cut into when split: enough that the partition by work (ranges
 * of whole tasks) gives each thread within ~1/16 of its share, and that stealing has
 * something to take. */
#define EK_TASKS_PER_THREAD 8u
/* Up to 4 threads, column blocks are cut only to give each thread this many tasks: each block
 * re-reads its rows (an im2col convolution's are built once per thread and row block,
 * im2col_reuse), and each AMX call reloads its activation tiles. Cutting columns to 8 tasks a
 * thread made nudenet-320n's 10-35 us convolutions (10x10 and 20x20 outputs) no faster on 2
 * threads than on 1, some 25 % slower (2-core VM, AMX); with 2, nudenet-320n's 2-thread time
 * fell 2.96 -> 2.70 ms. From 5 threads on, 8 a thread: each thread's share of the MACs stays
 * within 10 % of 1/N (tests/test_ekrt_partition.py; 2 a thread missed that at 12 threads). */
#define EK_COLUMN_TASKS_PER_THREAD 2u
#define EK_COLUMN_TASKS_MAX_THREADS 4u

/* the tiling of op's tasks for `threads` threads; returns the number of tasks */
static size_t conv_tiling(const struct conv_state* s, size_t threads, struct conv_job* j) {
  size_t want = threads > 1 ? EK_TASKS_PER_THREAD * threads : 1;
  size_t want_cols = threads > EK_COLUMN_TASKS_MAX_THREADS ? want : threads > 1 ? EK_COLUMN_TASKS_PER_THREAD * threads : 1;
  if (s->kind == CONV_DEPTHWISE) {
    size_t rows = s->batch * s->geo.oh, chunks = rows >= want ? 1 : (want + rows - 1) / rows;
    size_t px = (s->geo.ow + chunks - 1) / chunks, min_px = ek_min_sz(8, s->geo.ow);
    j->px_per_task = px < min_px ? min_px : px;
    j->px_chunks = (s->geo.ow + j->px_per_task - 1) / j->px_per_task;
    return rows * j->px_chunks;
  }
  size_t rows_total = s->kind == CONV_FC ? s->batch : s->batch * s->geo.oh * s->geo.ow, g = s->groups;
  size_t rpt = s->rows_per_task, floor_rows = ek_min_sz(rpt, 4 * s->mr);
#define BLOCKS(r) (g * ((rows_total + (r) - 1) / (r)))
  /* few tiles: smaller row blocks first (down to 4*mr rows), then column blocks (whole nr
   * blocks: each re-reads its rows) up to want_cols tiles, then row blocks down to mr */
  if (BLOCKS(rpt) < want) {
    size_t r = ek_round_up((g * rows_total + want - 1) / want, s->mr);
    rpt = r < floor_rows ? floor_rows : r < rpt ? r : rpt;
  }
  j->cols_per_block = s->mg;
  j->col_blocks = 1;
  if (BLOCKS(rpt) < want_cols) {
    size_t nblocks = (s->mg + s->nr - 1) / s->nr, per = (want_cols + BLOCKS(rpt) - 1) / BLOCKS(rpt);
    j->cols_per_block = (nblocks + per - 1) / per * s->nr;
    j->col_blocks = (s->mg + j->cols_per_block - 1) / j->cols_per_block;
  }
  if (BLOCKS(rpt) * j->col_blocks < want && rpt > s->mr) {
    size_t r = ek_round_up((g * rows_total * j->col_blocks + want - 1) / want, s->mr);
    if (r < rpt) rpt = r;
  }
#undef BLOCKS
  j->rows_per_task = rpt;
  j->row_blocks = (rows_total + rpt - 1) / rpt;
  return g * j->row_blocks * j->col_blocks;
}

void ek_run_conv(struct ekrt_model* m, struct ek_op* op) {
  const struct conv_state* s = op->state;
  struct conv_job j = {m, s, m->tensors[op->in[0]].data, m->tensors[op->out].data, 0, 0, 0, 0, 0, 0, 0};
  j.id = atomic_fetch_add(&conv_runs, 1) + 1;
  size_t n = conv_tiling(s, (size_t)ek_op_threads(m, op), &j);
  if (s->kind == CONV_DEPTHWISE)
    ek_parallel_for(m, op, n, task_depthwise, work_depthwise, &j);
  else
    ek_parallel_for(m, op, n, s->kind == CONV_IM2COL ? task_im2col : task_direct, work_gemm, &j);
}

void ek_conv_fuse_lut(struct ek_op* op, const uint8_t* table) {
  struct conv_state* s = op->state;
  s->lut = table;
}

int ek_conv_work_shift(const struct ek_op* op) {
  const struct conv_state* s = op->state;
  return s ? s->work_shift : 0;
}

const char* ek_conv_kernel(const struct ek_op* op) {
  const struct conv_state* s = op->state;
  return s ? s->kernel : NULL;
}

void ek_conv_partition(const struct ekrt_model* m, const struct ek_op* op, int threads, uint64_t* per_thread) {
  const struct conv_state* s = op->state;
  struct conv_job j = {(struct ekrt_model*)m, s, NULL, NULL, 0, 0, 0, 0, 0, 0, 0};
  size_t n = conv_tiling(s, (size_t)threads, &j), parts = ek_min_sz((size_t)threads, n);
  ek_work_fn work = s->kind == CONV_DEPTHWISE ? work_depthwise : work_gemm;
  size_t* bounds = malloc((parts + 1) * sizeof *bounds);
  if (!bounds) return;
  ek_partition(n, (int)parts, work, &j, bounds);
  for (size_t t = 0; t < parts; t++)
    for (size_t i = bounds[t]; i < bounds[t + 1]; i++) per_thread[t] += work(&j, i);
  free(bounds);
}

static void free_conv(struct conv_state* s) {
  if (!s) return;
  free((void*)s->columns);
  free(s->packed);
  free(s->zero_row);
  free(s->mult);
  free(s->shift);
  free(s);
}

static int32_t* copy_i32(const uint8_t* data, const struct ek_tensor* t) {
  int32_t* v = aligned_alloc64(t->bytes);
  if (v) memcpy(v, data + t->offset, t->bytes);
  return v;
}

/* the tightest bound all n weights meet (EK_WEIGHTS_*): a kernel whose ISA word needs that
 * bound (EK_ISA_W7, EK_ISA_WN) is exact on them */
static int weight_bound(const int8_t* w, size_t n) {
  int lo = 0, hi = 0;
  for (size_t i = 0; i < n; i++) {
    lo = w[i] < lo ? w[i] : lo;
    hi = w[i] > hi ? w[i] : hi;
  }
  if (lo >= -64 && hi <= 64) return EK_WEIGHTS_7BIT;
  return lo > -128 ? EK_WEIGHTS_NARROW : EK_WEIGHTS_ANY;
}

int ek_prepare_conv(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len) {
  (void)err;
  (void)err_len;
  const struct ek_kernels* kern = ek_kernels();
  const struct ek_tensor *x = &m->tensors[op->in[0]], *w = &m->tensors[op->in[1]], *y = &m->tensors[op->out];
  struct conv_state* s = calloc(1, sizeof *s);
  if (!s) return EKRT_ENOMEM;
  op->state = s;
  s->zx = x->zp;
  s->zp_out = y->zp;
  s->qmin = op->p[11];
  s->qmax = op->p[12];
  s->mult = copy_i32(data, &m->tensors[op->in[3]]);
  s->shift = copy_i32(data, &m->tensors[op->in[4]]);
  int32_t* bias = copy_i32(data, &m->tensors[op->in[2]]);
  const int8_t* wd = (const int8_t*)(data + w->offset);
  if (!s->mult || !s->shift || !bias) {
    free(bias);
    return EKRT_ENOMEM;
  }
  int rc = 0;
  size_t scratch = 0;
  if (op->type == EKM_FULLY_CONNECTED) {
    s->kind = CONV_FC;
    s->batch = x->dims[0];
    s->geo.oh = s->geo.ow = 1;
    s->m = s->mg = w->dims[0];
    s->k = s->cg = w->dims[1];
    s->groups = 1;
  } else {
    s->batch = x->dims[0];
    s->geo = ek_geometry_of(m, op);
    s->m = y->dims[3];
    s->groups = (size_t)op->p[10];
    s->cg = s->geo.c / s->groups;
    s->mg = s->m / s->groups;
    s->k = s->geo.kh * s->geo.kw * s->cg;
    int pads = op->p[6] | op->p[7] | op->p[8] | op->p[9];
    if (s->groups == s->geo.c && s->cg == 1 && s->m == s->geo.c && s->groups > 1) {
      s->kind = CONV_DEPTHWISE;
    } else if (s->geo.kh == 1 && s->geo.kw == 1 && s->geo.sh == 1 && s->geo.sw == 1 && !pads && s->groups == 1) {
      s->kind = CONV_DIRECT;
    } else {
      s->kind = CONV_IM2COL;
    }
  }
  if (s->kind == CONV_DEPTHWISE) {
    const struct ek_dwconv_choice* dk = &kern->dwconv_for[weight_bound(wd, w->elems)];
    size_t ks = s->geo.kh * s->geo.kw, cr = dk->cr;
    s->dwconv = dk->fn;
    s->kernel = dk->name;
    s->zero_row = aligned_alloc64(s->geo.c);
    s->shared_columns = s->geo.dw == 1;
    int8_t* taps = malloc(ks * s->geo.c); /* [M][KH][KW][1] -> tap-major [KH*KW][C] ([KW][KH] if shared) */
    size_t bytes = ek_qs8_dwconv_packed_size(s->geo.c, ks, cr);
    s->packed = aligned_alloc64(bytes);
    if (!s->zero_row || !taps || !s->packed) {
      free(taps);
      rc = EKRT_ENOMEM;
    } else {
      memset(s->zero_row, s->zx, s->geo.c);
      for (size_t ch = 0; ch < s->geo.c; ch++)
        for (size_t ky = 0; ky < s->geo.kh; ky++)
          for (size_t kx = 0; kx < s->geo.kw; kx++) {
            size_t t = s->shared_columns ? kx * s->geo.kh + ky : ky * s->geo.kw + kx;
            taps[t * s->geo.c + ch] = wd[ch * ks + ky * s->geo.kw + kx];
          }
      ek_qs8_dwconv_pack(dk->isa, cr, s->geo.c, ks, taps, bias, s->zx, s->packed);
      free(taps);
      m->weights_bytes += bytes;
      s->row_pointers = ((s->geo.ow - 1) * s->geo.sw + s->geo.kw) * s->geo.kh;
      /* the input lives in the arena at a fixed address: its pointers can be built now */
      uint64_t table = (uint64_t)s->batch * s->geo.oh * s->row_pointers * sizeof(const int8_t*);
      if (s->shared_columns && table <= EK_DW_TABLE_BYTES && (s->columns = malloc((size_t)table)) != NULL) {
        m->weights_bytes += (size_t)table;
        for (size_t i = 0; i < s->batch * s->geo.oh; i++)
          fill_columns(s, x->data, i / s->geo.oh, i % s->geo.oh, s->columns + i * s->row_pointers);
      } else {
        scratch = (s->shared_columns ? s->row_pointers : ek_min_sz(s->geo.ow, EK_DW_PIXELS) * ks) * sizeof(const int8_t*);
      }
    }
  } else {
    const int bound = weight_bound(wd, w->elems);
    const struct ek_gemm_choice* gk = s->k < EK_AMX_MIN_K ? &kern->gemm_small_for[bound] : &kern->gemm_for[bound];
    /* a kernel the bound allows, whose k group is wider than the op's whole k, would multiply
     * mostly padding (NEON's SMLAL kernel takes k by 16; a 1x1 conv of 8 channels has k = 8) */
    if (gk->kr > s->k) gk = s->k < EK_AMX_MIN_K ? &kern->gemm_small : &kern->gemm;
    s->gemm = gk->fn;
    s->kernel = gk->name;
    s->work_shift = gk->isa == EK_ISA_AMX ? 2 : 0;
    s->flip = ek_qs8_gemm_a_offset(gk->isa) == 128 ? kern->flip : NULL;
    s->mr = gk->mr;
    s->nr = gk->nr;
    s->kr = gk->kr;
    s->block_bytes = ek_qs8_gemm_packed_size(s->nr, s->k, s->nr, s->kr);
    s->group_bytes = ek_qs8_gemm_packed_size(s->mg, s->k, s->nr, s->kr);
    s->packed = aligned_alloc64(s->groups * s->group_bytes);
    if (!s->packed) {
      rc = EKRT_ENOMEM;
    } else {
      for (size_t g = 0; g < s->groups; g++)
        ek_qs8_gemm_pack(gk->isa, s->nr, s->kr, s->mg, s->k, wd + g * s->mg * s->k, bias + g * s->mg, s->zx,
                         (uint8_t*)s->packed + g * s->group_bytes);
      m->weights_bytes += s->groups * s->group_bytes;
    }
    /* rows per task: about 32 KB of im2col rows, a multiple of the kernel's mr */
    size_t rows = (32768 / (s->k ? s->k : 1)) / s->mr * s->mr;
    if (rows < s->mr) rows = s->mr;
    if (rows > 16 * s->mr) rows = 16 * s->mr;
    if (s->kind == CONV_FC) rows = s->mr * 4;
    s->rows_per_task = rows;
    if (s->kind == CONV_IM2COL || s->flip) scratch = rows * s->k;
  }
  free(bias);
  if (scratch + EK_SLACK > m->scratch_per_thread) m->scratch_per_thread = ek_round_up(scratch + EK_SLACK, 64);
  return rc;
}

void ek_free_conv(void* state) { free_conv(state); }
