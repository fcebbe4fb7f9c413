/* ekrt internals shared by the runtime's translation units (not installed, not API). */
#ifndef EKRT_INTERNAL_H
#define EKRT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "edgekit/ekm.h"
#include "edgekit/ekrt.h"
#include "edgekit/kernels.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ekrt reads .ekm files (little-endian) in place: big-endian hosts are not supported"
#endif

/* Limits the loader enforces (docs/ekrt.md "Loader limits"). */
#define EK_MAX_TENSORS (1u << 20)
#define EK_MAX_OPS (1u << 20)
#define EK_MAX_IO 64u
#define EK_MAX_NAME 1024u
#define EK_MAX_ELEMENTS ((uint64_t)INT32_MAX)
#define EK_MAX_ARENA ((uint64_t)1 << 30)
#define EK_MAX_GEMM_K (1u << 24)
#define EK_MAX_WINDOW 65536u
#define EK_MAX_STRIDE 1024
#define EK_MAX_PAD 65536
#define EK_ADD_MAX_LEFT_SHIFT 22
/* Bytes allocated past the arena and scratch buffers: kernels may read (never use) up to
 * this many bytes past the end of a row (XNNPACK's OOB-read convention). */
#define EK_SLACK 64u

struct ek_pool;

struct ek_tensor {
  uint32_t dtype, storage, rank;
  uint32_t dims[4];
  size_t elems, bytes;
  float scale;
  int32_t zp;
  uint64_t offset;
  void* data; /* arena tensors: arena + offset; io tensors: set by ekrt_run; const: NULL */
};

struct ek_op;
struct ek_check;
typedef void (*ek_op_run_fn)(struct ekrt_model* m, struct ek_op* op);

/* One per op type (the table in ops.c is the only list of ops): adding an op is one
 * descriptor plus its functions. */
struct ek_op_desc {
  const char* name;
  uint32_t min_in, max_in; /* n_inputs */
  int in_place;            /* the output may take the bytes of an input that dies there */
  int (*check)(struct ek_check* o); /* at load: dtypes, storages, shapes, params (rejections name the field) */
  int (*prepare)(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len); /* NULL: none */
  ek_op_run_fn run;
  void (*free)(void* state); /* NULL: free(state) */
};
const struct ek_op_desc* ek_op_desc(uint32_t type); /* NULL when type names no op */

struct ek_op {
  uint32_t type;
  uint32_t n_in;
  uint32_t in[EKM_MAX_OP_INPUTS];
  uint32_t out;
  int32_t p[EKM_N_PARAMS];
  const struct ek_op_desc* desc;
  void* state; /* per-op prepared data (packed weights, tables), freed with the model */
  uint64_t ns;
};

struct ek_io {
  uint32_t tensor;
  const char* name; /* points into model->names */
  size_t name_len;
};

struct ekrt_model {
  uint32_t n_tensors, n_ops, n_inputs, n_outputs;
  struct ek_tensor* tensors;
  struct ek_op* ops;
  struct ek_io* io; /* inputs, then outputs */
  char* names;
  uint8_t* arena;
  size_t arena_size;
  uint8_t* scratch; /* per-thread scratch: threads * scratch_per_thread bytes */
  size_t scratch_per_thread;
  size_t weights_bytes;
  int threads;
  uint64_t work_per_thread; /* ek_work_per_thread(isa), or EKRT_WORK_PER_THREAD from the environment */
  struct ek_pool* pool;
  int profiling;
};

/* The kernels chosen for this CPU (dispatch.c), fixed after the first call. */
struct ek_gemm_choice {
  ek_qs8_gemm_fn fn;
  const char* name;
  uint32_t isa, mr, nr, kr;
};
struct ek_dwconv_choice {
  ek_qs8_dwconv_fn fn;
  const char* name;
  uint32_t isa, cr;
};
/* AMX's GEMM takes convolutions whose k (kh * kw * c / group) is at least this; below, its
 * one 64-byte chunk is mostly padding and AVX-512 VNNI's kernel was faster (bench_kernels on a
 * Sapphire Rapids VM, docs/kernels.md: k = 8 0.75-0.96x, k = 16 0.95-1.17x, k = 24-32
 * 1.06-1.7x, k >= 64 1.7-9x) */
#define EK_AMX_MIN_K 16
/* what an op's weights allow (conv.c checks them at load): an index into the gemm choices */
enum { EK_WEIGHTS_ANY, EK_WEIGHTS_NARROW /* EK_ISA_WN */, EK_WEIGHTS_7BIT /* EK_ISA_W7 | EK_ISA_WN */, EK_WEIGHT_KINDS };
struct ek_kernels {
  struct ek_gemm_choice gemm;       /* = gemm_for[EK_WEIGHTS_ANY] (reported as the family's kernel) */
  struct ek_gemm_choice gemm_small; /* = gemm_small_for[EK_WEIGHTS_ANY]: for k < EK_AMX_MIN_K, the best that is not AMX's */
  /* the same two picks for weights that meet a bound (a kernel exact only on them may win) */
  struct ek_gemm_choice gemm_for[EK_WEIGHT_KINDS], gemm_small_for[EK_WEIGHT_KINDS];
  struct ek_dwconv_choice dwconv_for[EK_WEIGHT_KINDS];
  struct ek_dwconv_choice dwconv; /* = dwconv_for[EK_WEIGHTS_ANY] */
  ek_qs8_vadd_fn vadd;
  const char* vadd_name;
  ek_qs8_vmul_fn vmul;
  const char* vmul_name;
  ek_x8_lut_fn lut;
  const char* lut_name;
  ek_f32_qs8_cvt_fn cvt;
  const char* cvt_name;
  ek_qs8_flip_fn flip; /* activations for the a_offset-128 GEMMs (kernels.h) */
  ek_x8_clut_fn clut;  /* LUT_CHANNEL's rows; NULL: ops.c's loop */
  const char* isa; /* the gemm kernel's ISA */
};
const struct ek_kernels* ek_kernels(void);

/* loader.c */
int ek_fail(char* err, size_t err_len, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* An op under check at load, and the helpers every op's check uses (loader.c). Each fails
 * with "op <j> (<NAME>): ..." naming the field. */
struct ek_check {
  const struct ek_tensor* t; /* all tensors */
  const uint8_t* data;       /* the file's data section */
  const uint8_t* role;       /* per tensor: 0, 1 graph input, 2 graph output */
  const struct ek_op* op;
  uint32_t j;
  const char* name;
  char* err;
  size_t err_len;
};
#define OFAIL(fmt, ...) return ek_fail(o->err, o->err_len, "op %u (%s): " fmt, o->j, o->name, __VA_ARGS__)
#define OFAIL0(fmt) return ek_fail(o->err, o->err_len, "op %u (%s): " fmt, o->j, o->name)
#define TRY(x)             \
  do {                     \
    int rc_ = (x);         \
    if (rc_) return rc_;   \
  } while (0)
#define ST_ARENA (1u << EKM_ARENA)
#define ST_CONST (1u << EKM_CONST)
#define ST_IO (1u << EKM_IO)
#define ST_ACT (ST_ARENA | ST_CONST) /* int8 activations may be constants (e.g. an Add's operand) */
#define P(i) (1u << (i))
static inline const struct ek_tensor* ek_in(const struct ek_check* o, uint32_t k) { return &o->t[o->op->in[k]]; }
static inline const struct ek_tensor* ek_out(const struct ek_check* o) { return &o->t[o->op->out]; }
int ek_need_in(struct ek_check* o, uint32_t k, const char* what, uint32_t dtype, unsigned storages, int rank);
int ek_need_out(struct ek_check* o, uint32_t dtype, unsigned storages, int rank);
int ek_same_dims(const struct ek_tensor* a, const struct ek_tensor* b);
int ek_need_same_dims_out(struct ek_check* o, uint32_t k);
int ek_need_same_quant(struct ek_check* o, uint32_t k); /* output scale/zp = input k's */
int ek_need_param(struct ek_check* o, int i, const char* what, int32_t lo, int32_t hi);
int ek_need_multiplier(struct ek_check* o, int i, const char* what, int32_t shift_max); /* params i, i+1 */
int ek_need_act(struct ek_check* o);                                                   /* params 11, 12 */
int ek_need_unused_zero(struct ek_check* o, uint32_t used);                            /* bitmask of used params */
int ek_need_requant_consts(struct ek_check* o, uint32_t k, uint32_t n, uint64_t kk);

/* The NHWC geometry of a windowed op (CONV2D, MAXPOOL, AVGPOOL), read at prepare: input h x w x c,
 * output oh x ow, and params 0..7: kernel, strides, dilations, top and left pads. */
struct ek_geometry {
  size_t h, w, c, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl;
};
static inline struct ek_geometry ek_geometry_of(const struct ekrt_model* m, const struct ek_op* op) {
  const struct ek_tensor *x = &m->tensors[op->in[0]], *y = &m->tensors[op->out];
  const int32_t* p = op->p;
  return (struct ek_geometry){.h = x->dims[1], .w = x->dims[2], .c = x->dims[3], .oh = y->dims[1], .ow = y->dims[2],
                              .kh = (size_t)p[0], .kw = (size_t)p[1], .sh = (size_t)p[2], .sw = (size_t)p[3],
                              .dh = (size_t)p[4], .dw = (size_t)p[5], .pt = (size_t)p[6], .pl = (size_t)p[7]};
}

/* conv.c: CONV2D and FULLY_CONNECTED (their descriptors are in ops.c's table) */
int ek_check_conv(struct ek_check* o);
int ek_check_fc(struct ek_check* o);
int ek_prepare_conv(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len);
void ek_run_conv(struct ekrt_model* m, struct ek_op* op);
void ek_conv_fuse_lut(struct ek_op* op, const uint8_t* table); /* the LUT's rotated table, applied per task */
void ek_fuse_luts(struct ekrt_model* m); /* at load, after every op is prepared (ops.c) */
int ek_op_fused(const struct ek_op* op); /* a LUT that ek_fuse_luts folded into the op before it */
void ek_free_conv(void* state);

/* ops.c: fn(m, op, r0, r1) over `rows` rows of `row_cost` elements, cut in tasks of >= ~16K elements */
void ek_for_rows(struct ekrt_model* m, struct ek_op* op, size_t rows, size_t row_cost,
                 void (*fn)(struct ekrt_model*, struct ek_op*, size_t, size_t));

/* float.c: the float ops of the islands (their descriptors are in ops.c's table) */
int ek_check_fbinary(struct ek_check* o);
void ek_run_fbinary(struct ekrt_model* m, struct ek_op* op);
int ek_check_funary(struct ek_check* o);
void ek_run_funary(struct ekrt_model* m, struct ek_op* op);
int ek_check_freduce(struct ek_check* o);
int ek_prepare_freduce(struct ekrt_model* m, struct ek_op* op, const uint8_t* data, char* err, size_t err_len);
void ek_run_freduce(struct ekrt_model* m, struct ek_op* op);
int ek_check_fmatmul(struct ek_check* o);
void ek_run_fmatmul(struct ekrt_model* m, struct ek_op* op);
int ek_check_fsoftmax(struct ek_check* o);
void ek_run_fsoftmax(struct ekrt_model* m, struct ek_op* op);

/* pool.c: run task(ctx, i, thread) for i in [0, n) on as many of the model's threads as op's
 * work pays for (ek_threads_for), the caller included: each thread first runs its own
 * contiguous range of tasks (ek_partition, balanced by work(ctx, i), or by count when work is
 * NULL), then steals. `thread` (0..threads-1) is unique among the threads running at once (it
 * picks the scratch). Deterministic results are the caller's job: each task writes its own
 * outputs only. */
typedef void (*ek_task_fn)(void* ctx, size_t i, int thread);
typedef uint64_t (*ek_work_fn)(void* ctx, size_t i);
struct ek_pool* ek_pool_create(int threads, int pin); /* pin: worker k runs on the k-th usable CPU */
void ek_pool_destroy(struct ek_pool* pool);
void ek_pool_begin(struct ek_pool* pool); /* ekrt_run starts: workers poll between its ops */
void ek_pool_end(struct ek_pool* pool);   /* ... and sleep after it */
void ek_partition(size_t n, int parts, ek_work_fn work, void* ctx, size_t* bounds); /* bounds[parts + 1] */
void ek_parallel_for(struct ekrt_model* m, const struct ek_op* op, size_t n, ek_task_fn task, ek_work_fn work,
                     void* ctx);

/* The cost model (api.c, docs/ekrt.md "Threads"): an op's work in multiply-accumulates, other
 * ops' elements weighted by EK_ELEM_WORK. An op is split over t threads only when each gets
 * at least the work per thread that pays for a hand-over to a polling worker, measured per
 * ISA (ek_work_per_thread, benchmarks/ekrt_threads.py --calibrate). EKRT_WORK_PER_THREAD
 * overrides it (0 splits every op). */
#define EK_ELEM_WORK 8u
/* ek_work_per_thread's table (the first row is the default for an ISA not listed): the work per
 * thread from which a split into 2 pays on chains of convolutions (benchmarks/ekrt_threads.py
 * --calibrate, every op split, 2 threads against 1). x86: measured on the 2-core AVX-512 VNNI
 * VM on 2026-11-28 in its quieter minutes (load average 2-3, one run each; it was too loaded
 * before): scalar ~5-16 K MACs per op pays, avx2 ~70-150 K, avx512vnni ~150-300 K. neon and
 * neondot are ESTIMATES (qemu's timing means nothing): the A72's NEON kernels at ~2x the
 * scalar break-even, the A76's SDOT ones at avx2's. amx: avx512vnni's (its elementwise kernels are
 * those), its GEMM's MACs counted a quarter (ek_conv_work_shift). Rerun --calibrate on a quiet machine. */
#define EK_WORK_PER_THREAD_TABLE {"scalar", 8192}, {"avx2", 65536}, {"avx512vnni", 131072}, {"amx", 131072}, {"neon", 16384}, {"neondot", 65536}
uint64_t ek_work_per_thread(const char* isa);
uint64_t ek_op_work(const struct ekrt_model* m, const struct ek_op* op);
int ek_threads_for(const struct ekrt_model* m, uint64_t work); /* 1..m->threads */
/* the threads op gets now: ek_threads_for its work, or 1 while the pool rests (pool.c) */
int ek_op_threads(const struct ekrt_model* m, const struct ek_op* op);
/* conv.c: the MACs each of `threads` threads runs of a CONV2D / FULLY_CONNECTED op under the
 * executor's partition (per_thread[threads], added to) */
void ek_conv_partition(const struct ekrt_model* m, const struct ek_op* op, int threads, uint64_t* per_thread);
/* conv.c: log2 of how many multiply-accumulates of this CONV2D / FULLY_CONNECTED count as one
 * unit of work: 2 where it runs on AMX's GEMM (a split paid from ~1.3 M MACs per op there, 4x
 * the avx512vnni kernels' break-even: benchmarks/ekrt_threads.py --calibrate), else 0 */
int ek_conv_work_shift(const struct ek_op* op);
const char* ek_conv_kernel(const struct ek_op* op); /* its kernel's name; NULL before it is prepared */

uint32_t ek_crc32(const uint8_t* p, size_t n);
uint64_t ek_now_ns(void);

static inline size_t ek_min_sz(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t ek_round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

#endif /* EKRT_INTERNAL_H */
