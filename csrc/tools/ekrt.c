/* ekrt: the static device runner (docs/ekrt.md). No Python needed on the device.
 *
 *   ekrt info  [MODEL.ekm] [--threads N] [--json]   (--json with a model: its partition_macs,
 *              the conv/FC multiply-accumulates per thread as run splits them at that count)
 *   ekrt run   MODEL.ekm [--inputs A.npy ...] [--seed N] [--threads N] [--save DIR] [--json]
 *              (.npy inputs may stack N samples along the first axis: each runs, outputs stack alike)
 *   ekrt bench MODEL.ekm [--iterations N | --duration S] [--warmup N|auto] [--threads N] [--profile]
 *                        [--inputs A.npy ...] [--seed N] [--variant NAME] [--bundle-hash HEX] [--json]
 *
 * bench --json prints one document in the agent's bench schema (docs/bundle-and-agent.md).
 * Without --threads ekrt takes one thread per usable core when an op is big enough to split
 * (config.threads is then null; backend_info.threads says how many ran).
 * Without --inputs, inputs are numpy.random.RandomState(seed).standard_normal(shape) as
 * float32 (seed 0), the same values the Python agent feeds other backends. --warmup auto (the
 * default) warms up until latency is stable, bounded (warmup_done). --profile times each op in a
 * separate pass of up to PROFILE_RUNS runs after the timed loop, so the samples stay clean; each
 * op's time is the median over those runs (one preempted run must not make a layer look slow),
 * with the 25th and 75th percentiles as its spread.
 * timed_window_ns is the timed loop's [start, end] on CLOCK_MONOTONIC (the agent's energy meter
 * stamps its samples with the same clock). Failures print
 * {"kind": "edgekit.error", "error", "hint"} with --json, else error:/hint: lines; exit 1
 * (2 for a usage error). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "edgekit/cpu.h"
#include "edgekit/ekrt.h"
#include "runner.h"


/* ---- commands ---- */

struct loaded {
  ekrt_model* m;
  int n_in, n_out;
  size_t samples;     /* `run`: samples stacked along the first axis of every --inputs file */
  float* base[MAX_IO]; /* the inputs as read; in[i] points at the sample being run */
  float* in[MAX_IO];
  float* out[MAX_IO];
  uint64_t load_ns;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void load_model(const struct opts* o, struct loaded* l) {
  if (!o->model) die(2, USAGE_HINT, "%s needs a MODEL.ekm", o->cmd);
  char err[512];
  uint64_t t0 = now_ns();
  int rc = ekrt_load_file(o->model, &l->m, err, sizeof err);
  l->load_ns = now_ns() - t0;
  if (rc == EKRT_EIO) die(1, "check the path", "%s", err);
  if (rc) die(1, "re-create the model with edgekit (the lowering writes .ekm files)", "%s is not a valid .ekm file: %s", o->model, err);
  /* the automatic choice only speeds up: when its threads cannot start, run on one */
  rc = ekrt_set_threads(l->m, o->threads ? o->threads : EKRT_THREADS_AUTO);
  if (rc && o->threads) die(1, "use fewer --threads", "cannot start %d threads (code %d)", o->threads, rc);
  l->n_in = ekrt_num_inputs(l->m);
  l->n_out = ekrt_num_outputs(l->m);
  if (o->n_inputs && o->n_inputs != l->n_in) die(2, "give one .npy per model input, in order", "the model has %d inputs, --inputs gave %d", l->n_in, o->n_inputs);
  struct mt rng;
  mt_seed(&rng, (uint32_t)o->seed);
  for (int i = 0; i < l->n_in; i++) {
    size_t n = ekrt_io_elements(l->m, 0, i);
    int rank;
    uint32_t dims[4];
    ekrt_io_info(l->m, 0, i, NULL, NULL, &rank, dims);
    if (o->n_inputs) {
      size_t count;
      l->in[i] = read_npy_samples(o->inputs[i], n, dims, rank, strcmp(o->cmd, "run") == 0 ? (size_t)-1 : 1, &count);
      if (i && count != l->samples) die(2, "stack the same number of samples in every --inputs file", "%s holds %zu samples, %s holds %zu", o->inputs[i], count, o->inputs[0], l->samples);
      l->samples = count;
    } else {
      l->in[i] = malloc(n * sizeof(float) + 64);
      if (!l->in[i]) die(1, "free some memory", "out of memory");
      for (size_t k = 0; k < n; k++) l->in[i][k] = (float)mt_gauss(&rng);
      l->samples = 1;
    }
    l->base[i] = l->in[i];
  }
  for (int i = 0; i < l->n_out; i++) {
    l->out[i] = calloc(ekrt_io_elements(l->m, 1, i) + 16, sizeof(float));
    if (!l->out[i]) die(1, "free some memory", "out of memory");
  }
}

static void free_model(struct loaded* l) {
  for (int i = 0; i < l->n_in; i++) free(l->base[i]);
  for (int i = 0; i < l->n_out; i++) free(l->out[i]);
  ekrt_free(l->m);
}

static void run_once(struct loaded* l) {
  int rc = ekrt_run(l->m, (const float* const*)l->in, l->out);
  if (rc) die(1, "report this with the model", "ekrt_run failed (code %d)", rc);
}

static void print_io(const ekrt_model* m, int is_output) {
  int n = is_output ? ekrt_num_outputs(m) : ekrt_num_inputs(m);
  putchar('[');
  for (int i = 0; i < n; i++) {
    const char* name;
    size_t len;
    int rank;
    uint32_t dims[4];
    ekrt_io_info(m, is_output, i, &name, &len, &rank, dims);
    fputs(i ? ", {\"name\": " : "{\"name\": ", stdout);
    json_str(name, len);
    fputs(", \"shape\": [", stdout);
    for (int d = 0; d < rank; d++) printf("%s%u", d ? ", " : "", dims[d]);
    fputs("], \"dtype\": \"float32\"}", stdout);
  }
  putchar(']');
}

static int cmd_info(const struct opts* o) {
  struct loaded l;
  memset(&l, 0, sizeof l);
  if (o->model) load_model(o, &l);
  const char* forced = getenv("EKRT_ISA");
  if (o->json) {
    printf("{\"schema\": 1, \"kind\": \"edgekit.ekrt.info\", \"version\": \"%s\", \"arch\": \"%s\", \"isa\": \"%s\", \"features\": ",
           EKRT_VERSION_STRING, EKRT_ARCH, ekrt_isa_name());
    print_features();
    fputs(", \"built_isas\": ", stdout);
    print_built();
    fputs(", \"forced_isa\": ", stdout);
    json_cstr(forced && *forced ? forced : NULL);
    fputs(", \"kernels\": ", stdout);
    print_kernels();
    if (l.m) {
      fputs(", \"model\": {\"path\": ", stdout);
      json_cstr(o->model);
      printf(", \"ops\": %d, \"threads\": %d, \"memory_bytes\": %zu, \"kernels_used\": ", ekrt_num_ops(l.m),
             ekrt_get_threads(l.m), ekrt_memory_bytes(l.m));
      print_model_kernels(l.m);
      fputs(", \"inputs\": ", stdout);
      print_io(l.m, 0);
      fputs(", \"outputs\": ", stdout);
      print_io(l.m, 1);
      /* conv/FC multiply-accumulates per thread as run splits them at this thread count */
      int threads = ekrt_get_threads(l.m);
      uint64_t* macs = calloc((size_t)threads, sizeof *macs);
      if (macs && ekrt_partition(l.m, threads, -1, macs) == 0) {
        fputs(", \"partition_macs\": [", stdout);
        for (int t = 0; t < threads; t++) printf("%s%llu", t ? ", " : "", (unsigned long long)macs[t]);
        putchar(']');
      }
      free(macs);
      putchar('}');
    }
    fputs("}\n", stdout);
  } else {
    printf("ekrt %s (%s)\nisa: %s%s%s\nbuilt isas: %s\nfeatures:", EKRT_VERSION_STRING, EKRT_ARCH, ekrt_isa_name(),
           forced && *forced ? " (EKRT_ISA=" : "", forced && *forced ? forced : "", ekrt_built_isas());
    if (forced && *forced) fputs(")", stdout);
    char names[128];
    ek_cpu_feature_list(ekrt_cpu_features(), names, sizeof names, " ");
    printf(" %s\n", names[0] ? names : "none");
    for (int i = 0; i < ekrt_num_kernel_families(); i++) {
      const char *fam, *name;
      ekrt_kernel_choice(i, &fam, &name);
      printf("%-11s %s\n", fam, name);
    }
    if (l.m)
      printf("model: %s, %d ops, %d threads, %zu bytes of memory\n", o->model, ekrt_num_ops(l.m), ekrt_get_threads(l.m),
             ekrt_memory_bytes(l.m));
  }
  if (l.m) free_model(&l);
  return 0;
}

static int cmd_run(const struct opts* o) {
  struct loaded l;
  memset(&l, 0, sizeof l);
  load_model(o, &l);
  /* Every stacked sample runs in this one process (evaluation of a held-out set); the outputs
   * are stacked the same way. */
  size_t count = l.samples ? l.samples : 1;
  float* all[MAX_IO];
  for (int i = 0; i < l.n_out; i++) {
    all[i] = malloc(count * ekrt_io_elements(l.m, 1, i) * sizeof(float) + 64);
    if (!all[i]) die(1, "stack fewer samples", "out of memory");
  }
  for (size_t s = 0; s < count; s++) {
    for (int i = 0; i < l.n_in; i++) l.in[i] = l.base[i] + s * ekrt_io_elements(l.m, 0, i);
    run_once(&l);
    for (int i = 0; i < l.n_out; i++) {
      size_t n = ekrt_io_elements(l.m, 1, i);
      memcpy(all[i] + s * n, l.out[i], n * sizeof(float));
    }
  }
  if (o->save) {
    for (int i = 0; i < l.n_out; i++) {
      char path[4096];
      int rank;
      uint32_t dims[4];
      ekrt_io_info(l.m, 1, i, NULL, NULL, &rank, dims);
      if (rank >= 1) dims[0] *= (uint32_t)count;
      snprintf(path, sizeof path, "%s/output%d.npy", o->save, i);
      write_npy(path, all[i], rank, dims);
    }
  }
  if (o->json) {
    fputs("{\"schema\": 1, \"kind\": \"edgekit.ekrt.run\", \"isa\": ", stdout);
    json_cstr(ekrt_isa_name());
    fputs(", \"outputs\": [", stdout);
    for (int i = 0; i < l.n_out; i++) {
      const char* name;
      size_t len;
      int rank;
      uint32_t dims[4];
      ekrt_io_info(l.m, 1, i, &name, &len, &rank, dims);
      if (rank >= 1) dims[0] *= (uint32_t)count;
      fputs(i ? ", {\"name\": " : "{\"name\": ", stdout);
      json_str(name, len);
      fputs(", \"shape\": [", stdout);
      for (int d = 0; d < rank; d++) printf("%s%u", d ? ", " : "", dims[d]);
      fputs("]", stdout);
      if (!o->save) { /* with --save the values are in the .npy files: don't print megabytes of text */
        fputs(", \"values\": [", stdout);
        size_t n = count * ekrt_io_elements(l.m, 1, i);
        for (size_t k = 0; k < n; k++) printf("%s%.9g", k ? ", " : "", (double)all[i][k]);
        fputs("]", stdout);
      }
      fputs("}", stdout);
    }
    fputs("]}\n", stdout);
  } else {
    for (int i = 0; i < l.n_out; i++) {
      const char* name;
      size_t len;
      ekrt_io_info(l.m, 1, i, &name, &len, NULL, NULL);
      size_t n = ekrt_io_elements(l.m, 1, i), best = 0;
      for (size_t k = 1; k < n; k++)
        if (l.out[i][k] > l.out[i][best]) best = k;
      printf("%.*s: %zu values, argmax %zu (%g)%s\n", (int)len, name, n, best, (double)l.out[i][best], count > 1 ? " (last sample)" : "");
    }
    if (count > 1) printf("ran %zu samples\n", count);
  }
  for (int i = 0; i < l.n_out; i++) free(all[i]);
  free_model(&l);
  return 0;
}

static int cmp_u64(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

/* Warm-up "auto", the rule and numbers of edgekit/agent/runner.py (warmup_done): run at least
 * AUTO_MIN warm-up iterations; stop when the median of the last AUTO_WINDOW is within 5% of the
 * median of the AUTO_WINDOW before them, or after AUTO_MAX_RUNS iterations or AUTO_MAX_NS of
 * warm-up, whichever comes first (a board that never settles still gets timed). */
#define AUTO_MIN 5
#define AUTO_WINDOW 5
#define AUTO_MAX_RUNS 200
#define AUTO_MAX_NS 2000000000ull
#define MAX_WARMUP_SAMPLES 1000 /* reported; a longer fixed warm-up still runs in full */
#define PROFILE_RUNS 20

static uint64_t median_window(const uint64_t* s) {
  uint64_t w[AUTO_WINDOW];
  memcpy(w, s, sizeof w);
  qsort(w, AUTO_WINDOW, sizeof *w, cmp_u64);
  return w[AUTO_WINDOW / 2];
}

static int warmup_done(const uint64_t* s, size_t n, uint64_t elapsed_ns) {
  if (n < AUTO_MIN) return 0;
  if (n >= AUTO_MAX_RUNS || elapsed_ns >= AUTO_MAX_NS) return 1;
  if (n < 2 * AUTO_WINDOW) return 0;
  uint64_t before = median_window(s + n - 2 * AUTO_WINDOW), last = median_window(s + n - AUTO_WINDOW);
  uint64_t diff = last > before ? last - before : before - last;
  return diff * 20 <= before; /* within 5% */
}

static size_t warm_up(const struct opts* o, struct loaded* l, uint64_t* kept, size_t* n_kept) {
  size_t n = 0;
  *n_kept = 0;
  uint64_t begin = now_ns();
  while (o->warmup_auto || n < (size_t)o->warmup) {
    uint64_t a = now_ns();
    run_once(l);
    uint64_t b = now_ns();
    if (*n_kept < MAX_WARMUP_SAMPLES) kept[(*n_kept)++] = b - a > 0 ? b - a : 1;
    n++;
    if (o->warmup_auto && warmup_done(kept, *n_kept, b - begin)) break;
  }
  return n;
}

/* The q-quantile (nearest rank) of n values, sorted in place. */
static uint64_t quantile_u64(uint64_t* v, size_t n, double q) {
  qsort(v, n, sizeof *v, cmp_u64);
  size_t i = (size_t)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

static int cmd_bench(const struct opts* o) {
  char started[64];
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%S+00:00", &tmv);
  struct loaded l;
  memset(&l, 0, sizeof l);
  load_model(o, &l);
  char sha[65] = "";
  if (sha256_file(o->model, sha) != 0) sha[0] = '\0';
  uint64_t t0 = now_ns();
  run_once(&l);
  uint64_t first_ns = now_ns() - t0;
  static uint64_t warm[MAX_WARMUP_SAMPLES];
  size_t n_warm;
  size_t warmup = warm_up(o, &l, warm, &n_warm);
  /* --duration: for that long; --min-time: at least --iterations and at least that long */
  double window = o->duration > 0 ? o->duration : o->min_time;
  size_t count = o->duration > 0 ? 1 : (size_t)o->iterations;
  size_t cap = window > 0 ? (count > 1024 ? count : 1024) : count, n = 0;
  uint64_t* samples = malloc(cap * sizeof *samples);
  if (!samples) die(1, "use fewer --iterations", "out of memory");
  uint64_t loop_start = now_ns();
  uint64_t deadline = window > 0 ? loop_start + (uint64_t)(window * 1e9) : 0;
  for (;;) {
    uint64_t a = now_ns();
    run_once(&l);
    uint64_t b = now_ns();
    if (n == cap) {
      cap *= 2;
      uint64_t* ns = realloc(samples, cap * sizeof *samples);
      if (!ns) die(1, "use a shorter --duration", "out of memory");
      samples = ns;
    }
    samples[n++] = b - a > 0 ? b - a : 1;
    if ((n >= count && b >= deadline) || n >= MAX_SAMPLES) break;
  }
  uint64_t loop_end = now_ns();
  size_t profiled = n < PROFILE_RUNS ? n : PROFILE_RUNS;
  int n_ops = ekrt_num_ops(l.m);
  uint64_t* per_run = NULL; /* [op][run]: each op's time in each profiled run */
  if (o->profile && profiled && n_ops > 0) {
    per_run = calloc((size_t)n_ops * profiled, sizeof *per_run);
    uint64_t* before = calloc((size_t)n_ops, sizeof *before);
    if (!per_run || !before) die(1, "profile fewer ops", "out of memory");
    ekrt_profile(l.m, 1);
    for (size_t i = 0; i < profiled; i++) {
      run_once(&l); /* the totals accumulate (ekrt_profile(m, 0) would reset them): a run's share is the difference */
      for (int j = 0; j < n_ops; j++) {
        const char* name;
        uint64_t total;
        ekrt_op_times(l.m, j, &name, &total);
        per_run[(size_t)j * profiled + i] = total - before[j];
        before[j] = total;
      }
    }
    free(before);
  }
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  long long peak = (long long)ru.ru_maxrss * 1024;
  uint32_t dims[4];
  int rank = 0;
  ekrt_io_info(l.m, 0, 0, NULL, NULL, &rank, dims);
  unsigned batch = rank >= 2 ? dims[0] : 1;
  if (o->json) {
    printf("{\"schema\": 1, \"kind\": \"edgekit.bench\", \"agent_version\": null, \"variant\": ");
    json_cstr(o->variant);
    printf(", \"backend\": \"native\", \"backend_version\": \"%s\", \"precision\": \"int8\", \"model\": ", EKRT_VERSION_STRING);
    json_cstr(o->model);
    fputs(", \"model_sha256\": ", stdout);
    json_cstr(sha[0] ? sha : NULL);
    fputs(", \"bundle_hash\": ", stdout);
    json_cstr(o->bundle_hash);
    printf(", \"config\": {\"warmup\": %zu, \"warmup_mode\": \"%s\", \"iterations\": ", warmup, o->warmup_auto ? "auto" : "fixed");
    if (o->duration > 0) printf("null, \"duration_s\": %g", o->duration);
    else printf("%ld, \"duration_s\": null", o->iterations);
    if (o->min_time > 0 && !(o->duration > 0)) printf(", \"min_time_s\": %g", o->min_time);
    else fputs(", \"min_time_s\": null", stdout);
    if (o->threads) printf(", \"threads\": %d", o->threads);
    else fputs(", \"threads\": null", stdout);
    printf(", \"batch\": %u}, \"warmup_samples_ns\": [", batch);
    for (size_t i = 0; i < n_warm; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)warm[i]);
    fputs("], \"samples_ns\": [", stdout);
    for (size_t i = 0; i < n; i++) printf("%s%llu", i ? ", " : "", (unsigned long long)samples[i]);
    printf("], \"timed_window_ns\": [%llu, %llu], \"load_ns\": %llu, \"first_inference_ns\": %llu, \"peak_rss_bytes\": %lld, \"layers\": ",
           (unsigned long long)loop_start, (unsigned long long)loop_end, (unsigned long long)l.load_ns, (unsigned long long)first_ns, peak);
    if (per_run) {
      putchar('[');
      for (int j = 0; j < n_ops; j++) {
        const char* name;
        uint64_t total;
        ekrt_op_times(l.m, j, &name, &total);
        uint64_t* runs = per_run + (size_t)j * profiled;
        unsigned long long p25 = quantile_u64(runs, profiled, 0.25), p50 = quantile_u64(runs, profiled, 0.5), p75 = quantile_u64(runs, profiled, 0.75);
        const char* kernel = ekrt_op_kernel(l.m, j);
        printf("%s{\"name\": \"%s#%d\", \"op\": \"%s\", \"ns\": %llu, \"ns_p25\": %llu, \"ns_p75\": %llu, \"calls\": %zu", j ? ", " : "", name, j,
               name, p50, p25, p75, profiled);
        if (kernel) printf(", \"kernel\": \"%s\"", kernel);
        if (ekrt_op_fused(l.m, j)) fputs(", \"fused\": true", stdout);
        putchar('}');
      }
      putchar(']');
    } else {
      fputs("null", stdout);
    }
    printf(", \"backend_info\": {\"runner\": \"ekrt %s\", \"isa\": \"%s\", \"kernels\": ", EKRT_VERSION_STRING, ekrt_isa_name());
    print_kernels();
    fputs(", \"kernels_used\": ", stdout);
    print_model_kernels(l.m);
    fputs(", \"features\": ", stdout);
    print_features();
    printf(", \"threads\": %d, \"memory_bytes\": %zu}", ekrt_get_threads(l.m), ekrt_memory_bytes(l.m));
    printf(", \"started_at\": \"%s\", \"device\": ", started);
    print_device();
    fputs(", \"device_state\": null}\n", stdout);
  } else {
    qsort(samples, n, sizeof *samples, cmp_u64);
    printf("%s: %zu warm-up (%s) + %zu runs, p50 %.3f ms, min %.3f ms, max %.3f ms, load %.3f ms, peak RSS %.1f MB, isa %s, threads %d\n",
           o->model, warmup, o->warmup_auto ? "auto" : "fixed", n, samples[n / 2] / 1e6, samples[0] / 1e6, samples[n - 1] / 1e6, l.load_ns / 1e6, peak / 1048576.0,
           ekrt_isa_name(), ekrt_get_threads(l.m));
    if (per_run)
      for (int j = 0; j < n_ops; j++) {
        const char* name;
        uint64_t total;
        ekrt_op_times(l.m, j, &name, &total);
        const char* kernel = ekrt_op_kernel(l.m, j);
        printf("  %4d %-16s %10.1f us (median of %zu runs)%s%s%s\n", j, name, quantile_u64(per_run + (size_t)j * profiled, profiled, 0.5) / 1e3, profiled,
               kernel ? "  " : "", kernel ? kernel : "", ekrt_op_fused(l.m, j) ? "  (fused into the op before)" : "");
      }
  }
  free(per_run);
  free(samples);
  free_model(&l);
  return 0;
}

int main(int argc, char** argv) {
  struct opts o;
  if (argc >= 2 && (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0)) {
    printf("ekrt %s (%s)\n", EKRT_VERSION_STRING, EKRT_ARCH);
    return 0;
  }
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0)) {
    printf("%s\n", USAGE_HINT + 7);
    return 0;
  }
  parse(argc, argv, &o);
  if (strcmp(o.cmd, "info") == 0) return cmd_info(&o);
  if (strcmp(o.cmd, "run") == 0) return cmd_run(&o);
  if (strcmp(o.cmd, "bench") == 0) return cmd_bench(&o);
  die(2, USAGE_HINT, "unknown command '%s'", o.cmd);
  return 2;
}
