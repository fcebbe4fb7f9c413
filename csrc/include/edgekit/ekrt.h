/* ekrt: edgekit's int8 runtime. C API (docs/ekrt.md, "C API").
 *
 * Every function that can fail returns 0 on success and one of the EKRT_E* codes otherwise;
 * the load functions also write a one-line message (NUL-terminated, truncated to err_len)
 * that names the offending field, e.g. "op 3 (CONV2D): params[2] (stride h) is 0, must be >= 1". */
#ifndef EDGEKIT_EKRT_H
#define EDGEKIT_EKRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EKRT_VERSION_STRING "0.1.0"

enum ekrt_status {
  EKRT_OK = 0,
  EKRT_EARG = 1,    /* a bad argument (NULL, index out of range, threads < 1) */
  EKRT_EIO = 2,     /* the file cannot be read */
  EKRT_EFORMAT = 3, /* the bytes are not a valid .ekm file */
  EKRT_ENOMEM = 4,  /* out of memory */
  EKRT_ETHREAD = 5  /* a worker thread could not be started */
};

/* CPU feature bits (ekrt_cpu_features). */
#define EKRT_CPU_NEON (1u << 0)       /* aarch64 Advanced SIMD (HWCAP_ASIMD) */
#define EKRT_CPU_NEONDOT (1u << 1)    /* aarch64 SDOT/UDOT (HWCAP_ASIMDDP) */
#define EKRT_CPU_AVX2 (1u << 8)       /* x86 AVX2 (+ OS saves YMM) */
#define EKRT_CPU_AVX512VNNI (1u << 9) /* x86 AVX-512 F/BW/VL/VNNI (+ OS saves ZMM) */
#define EKRT_CPU_AVX512VBMI (1u << 10) /* x86 AVX-512 F/BW/VBMI (+ OS saves ZMM) */
#define EKRT_CPU_AMX (1u << 11)        /* x86 AMX-TILE/INT8 + AVX-512 VNNI (+ OS saves tile data, granted) */

typedef struct ekrt_model ekrt_model;

/* Load a model from bytes (copied: the caller may free data afterwards) or from a file. */
int ekrt_load(const void* data, size_t size, ekrt_model** out, char* err, size_t err_len);
/* a regular file of at most EKRT_MAX_FILE_BYTES (a device, FIFO or directory is EKRT_EIO; a
 * larger file EKRT_EFORMAT), read whole, then ekrt_load */
#define EKRT_MAX_FILE_BYTES ((uint64_t)1 << 30)
int ekrt_load_file(const char* path, ekrt_model** out, char* err, size_t err_len);

int ekrt_num_inputs(const ekrt_model* model);
int ekrt_num_outputs(const ekrt_model* model);
/* Name (not NUL-terminated; owned by the model), rank and dims of input/output `index`. */
int ekrt_io_info(const ekrt_model* model, int is_output, int index, const char** name, size_t* name_len,
                 int* rank, uint32_t dims[4]);
/* Number of float32 elements of input/output `index` (0 when out of range). */
size_t ekrt_io_elements(const ekrt_model* model, int is_output, int index);

/* Threads for ekrt_run, the caller included (1 = the caller only; a model loads with 1).
 * EKRT_THREADS_AUTO: one per usable CPU (1 when no op of the model is big enough to split);
 * ekrt_get_threads says what was chosen. Each op uses only the threads its own work pays for
 * (EKRT_WORK_PER_THREAD overrides the per-ISA break-even); EKRT_PIN=1 pins worker k to the
 * k-th usable CPU. Results do not depend on the thread count. */
#define EKRT_THREADS_AUTO 0
int ekrt_set_threads(ekrt_model* model, int threads);
int ekrt_get_threads(const ekrt_model* model);

/* One inference: inputs[i] / outputs[i] are dense float32 buffers of the io shapes. A model
 * is not reentrant: one ekrt_run at a time per model. */
int ekrt_run(ekrt_model* model, const float* const* inputs, float* const* outputs);

/* Per-op timing: enable (resets the totals), then each ekrt_run adds each op's time. */
int ekrt_profile(ekrt_model* model, int enable);
int ekrt_num_ops(const ekrt_model* model);
/* Op `op`'s type name ("CONV2D") and total ns over the profiled runs. */
int ekrt_op_times(const ekrt_model* model, int op, const char** name, uint64_t* ns);
/* The kernel op `op` runs (CONV2D / FULLY_CONNECTED: the qs8-gemm or qs8-dwconv function chosen
 * for its shape and weights); NULL for other ops. */
const char* ekrt_op_kernel(const ekrt_model* model, int op);
/* 1 when op `op` is a LUT that the convolution before it applies to its outputs as it writes
 * them (folded at load: docs/ekrt.md); its own run does nothing. */
int ekrt_op_fused(const ekrt_model* model, int op);
/* Work per run: multiply-accumulates of CONV2D/FULLY_CONNECTED plus one per element read by
 * every other op (for reports, and for the fuzzer to skip running huge models). */
uint64_t ekrt_macs(const ekrt_model* model);
/* The partition of CONV2D / FULLY_CONNECTED multiply-accumulates over `threads` threads, as
 * ekrt_run at that count splits them when every thread keeps up (a thread that falls behind
 * has its unclaimed tasks taken by the others): macs[t], t < threads, of op `op` (other ops: all
 * 0), or of the whole model for op = -1. An op too small to split counts on thread 0. */
int ekrt_partition(const ekrt_model* model, int threads, int op, uint64_t* macs);
/* Bytes the model holds: the arena, packed weights and scratch (for reports). */
size_t ekrt_memory_bytes(const ekrt_model* model);

/* The ISA whose kernels run ("scalar", "neon", "neondot", "avx2", "avx512vnni"): the best
 * the CPU has, or EKRT_ISA when set to one the CPU has. */
const char* ekrt_isa_name(void);
uint64_t ekrt_cpu_features(void);
/* Names of the kernel chosen per family: family i in [0, ekrt_num_kernel_families()). */
int ekrt_num_kernel_families(void);
int ekrt_kernel_choice(int family, const char** family_name, const char** kernel_name);
/* Comma-separated names of the ISAs this build has kernels for ("scalar,avx2,avx512vnni"). */
const char* ekrt_built_isas(void);

void ekrt_free(ekrt_model* model);

#ifdef __cplusplus
}
#endif

#endif /* EDGEKIT_EKRT_H */
