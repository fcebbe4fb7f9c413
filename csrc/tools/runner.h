/* The runner's helpers (json.c, options.c, sha256.c, mt19937.c, npy.c, device.c), used by its commands (ekrt.c). */
#ifndef EKRT_RUNNER_H
#define EKRT_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "edgekit/ekrt.h"

#define MAX_IO 64
#define MAX_SAMPLES 1000000

#if defined(__aarch64__)
#define EKRT_ARCH "aarch64"
#elif defined(__x86_64__)
#define EKRT_ARCH "x86_64"
#elif defined(__arm__)
#define EKRT_ARCH "armv7l"
#else
#define EKRT_ARCH "unknown"
#endif

#if defined(__GNUC__)
#define EK_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define EK_NORETURN __attribute__((noreturn))
#else
#define EK_PRINTF(f, a)
#define EK_NORETURN
#endif

/* json.c: with --json (json_mode) failures are an edgekit.error document on stdout */
extern int json_mode;
EK_NORETURN void die(int code, const char* hint, const char* fmt, ...) EK_PRINTF(3, 4);
void json_str(const char* s, size_t n);
void json_cstr(const char* s); /* NULL: null */

/* options.c */
extern const char* USAGE_HINT;
struct opts {
  const char* cmd;
  const char* model;
  int json, profile, threads;
  long iterations, warmup;
  int warmup_auto; /* --warmup auto (the default): until stable, bounded */
  double duration; /* > 0: time for this long instead of a count */
  double min_time; /* > 0: at least --iterations and at least this long */
  int n_inputs;
  const char* inputs[MAX_IO];
  unsigned long seed;
  const char* save;
  const char* variant;
  const char* bundle_hash;
};
void parse(int argc, char** argv, struct opts* o);

/* sha256.c: 64 hex digits + NUL; -1 when the file cannot be read */
int sha256_file(const char* path, char hex[65]);

/* mt19937.c */
struct mt {
  uint32_t s[624];
  int i;
  int has_gauss;
  double gauss;
};
void mt_seed(struct mt* m, uint32_t seed);
double mt_gauss(struct mt* m);

/* npy.c: dies with the reason on any mismatch */
float* read_npy(const char* path, size_t want, const uint32_t* dims, int rank);
float* read_npy_samples(const char* path, size_t want, const uint32_t* dims, int rank, size_t max_count, size_t* count);
void write_npy(const char* path, const float* data, int rank, const uint32_t* dims);

/* device.c: JSON values */
void print_features(void);
void print_device(void);
void print_kernels(void);
void print_model_kernels(const ekrt_model* m); /* JSON list: the conv kernels its ops run */
void print_built(void);

#endif /* EKRT_RUNNER_H */
