/* ekrt's C API around a loaded model: io info, threads, run, per-op profiling. */
#define _GNU_SOURCE /* sched_getaffinity (glibc and musl) */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

int ekrt_num_inputs(const ekrt_model* m) { return m ? (int)m->n_inputs : 0; }
int ekrt_num_outputs(const ekrt_model* m) { return m ? (int)m->n_outputs : 0; }
int ekrt_num_ops(const ekrt_model* m) { return m ? (int)m->n_ops : 0; }

static const struct ek_io* io_at(const ekrt_model* m, int is_output, int index) {
  if (!m || index < 0) return NULL;
  uint32_t n = is_output ? m->n_outputs : m->n_inputs;
  if ((uint32_t)index >= n) return NULL;
  return &m->io[(is_output ? m->n_inputs : 0) + (uint32_t)index];
}

int ekrt_io_info(const ekrt_model* m, int is_output, int index, const char** name, size_t* name_len, int* rank,
                 uint32_t dims[4]) {
  const struct ek_io* io = io_at(m, is_output, index);
  if (!io) return EKRT_EARG;
  const struct ek_tensor* t = &m->tensors[io->tensor];
  if (name) *name = io->name;
  if (name_len) *name_len = io->name_len;
  if (rank) *rank = (int)t->rank;
  if (dims) memcpy(dims, t->dims, sizeof t->dims);
  return 0;
}

size_t ekrt_io_elements(const ekrt_model* m, int is_output, int index) {
  const struct ek_io* io = io_at(m, is_output, index);
  return io ? m->tensors[io->tensor].elems : 0;
}

/* CPUs this process may run on (taskset, cgroup cpusets), else the online ones */
static int usable_cpus(void) {
#if defined(__linux__) && defined(CPU_COUNT)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

/* EKRT_THREADS_AUTO: one thread per usable CPU when some op of the model is big enough to
 * split in two (ek_threads_for), else 1. A busy machine is handled by measurement, not by
 * starting fewer threads: the pool rests while its workers miss jobs (pool.c), and the
 * agent's bench probes one thread against this choice. */
static int auto_threads(ekrt_model* m) {
  int cpus = usable_cpus(), saved = m->threads, any = 0;
  m->threads = cpus;
  for (uint32_t j = 0; j < m->n_ops && !any; j++) any = ek_threads_for(m, ek_op_work(m, &m->ops[j])) > 1;
  m->threads = saved;
  return any ? cpus : 1;
}

/* The work per thread below which splitting an op costs more than it saves, per ISA: about
 * EK_HANDOVER_NS of the ISA's single-thread kernel speed (benchmarks/ekrt_threads.py
 * --calibrate, docs/ekrt.md "Threads"). */
uint64_t ek_work_per_thread(const char* isa) {
  static const struct {
    const char* isa;
    uint64_t work;
  } table[] = {EK_WORK_PER_THREAD_TABLE};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (!strcmp(table[i].isa, isa)) return table[i].work;
  return table[0].work;
}

static uint64_t work_per_thread(void) {
  const char* v = getenv("EKRT_WORK_PER_THREAD");
  char* end;
  unsigned long long n = v && *v ? strtoull(v, &end, 10) : 0;
  return v && *v && !*end ? (uint64_t)n : ek_work_per_thread(ekrt_isa_name());
}

static int pin_threads(void) {
  const char* v = getenv("EKRT_PIN");
  return v && !strcmp(v, "1");
}

int ekrt_set_threads(ekrt_model* m, int threads) {
  if (!m) return EKRT_EARG;
  m->work_per_thread = work_per_thread();
  if (threads == EKRT_THREADS_AUTO) threads = auto_threads(m);
  if (threads < 1 || threads > 256) return EKRT_EARG;
  if (threads == m->threads) return 0;
  uint8_t* scratch = NULL;
  if (m->scratch_per_thread) {
    if (posix_memalign((void**)&scratch, 64, (size_t)threads * m->scratch_per_thread) != 0) return EKRT_ENOMEM;
    memset(scratch, 0, (size_t)threads * m->scratch_per_thread);
  }
  struct ek_pool* pool = NULL;
  if (threads > 1) {
    pool = ek_pool_create(threads, pin_threads());
    if (!pool) {
      free(scratch);
      return EKRT_ETHREAD;
    }
  }
  if (m->pool) ek_pool_destroy(m->pool);
  free(m->scratch);
  m->pool = pool;
  m->scratch = scratch;
  m->threads = threads;
  return 0;
}

int ekrt_get_threads(const ekrt_model* m) { return m ? m->threads : 0; }

int ekrt_run(ekrt_model* m, const float* const* inputs, float* const* outputs) {
  if (!m || !inputs || !outputs) return EKRT_EARG;
  for (uint32_t k = 0; k < m->n_inputs; k++) {
    if (!inputs[k]) return EKRT_EARG;
    m->tensors[m->io[k].tensor].data = (void*)(uintptr_t)inputs[k];
  }
  for (uint32_t k = 0; k < m->n_outputs; k++) {
    if (!outputs[k]) return EKRT_EARG;
    m->tensors[m->io[m->n_inputs + k].tensor].data = outputs[k];
  }
  ek_pool_begin(m->pool);
  if (m->profiling) {
    for (uint32_t j = 0; j < m->n_ops; j++) {
      uint64_t t0 = ek_now_ns();
      m->ops[j].desc->run(m, &m->ops[j]);
      m->ops[j].ns += ek_now_ns() - t0;
    }
  } else {
    for (uint32_t j = 0; j < m->n_ops; j++) m->ops[j].desc->run(m, &m->ops[j]);
  }
  ek_pool_end(m->pool);
  for (uint32_t k = 0; k < m->n_inputs + m->n_outputs; k++) m->tensors[m->io[k].tensor].data = NULL;
  return 0;
}

int ekrt_profile(ekrt_model* m, int enable) {
  if (!m) return EKRT_EARG;
  m->profiling = enable != 0;
  for (uint32_t j = 0; j < m->n_ops; j++) m->ops[j].ns = 0;
  return 0;
}

int ekrt_op_times(const ekrt_model* m, int op, const char** name, uint64_t* ns) {
  if (!m || op < 0 || (uint32_t)op >= m->n_ops) return EKRT_EARG;
  if (name) *name = m->ops[op].desc->name;
  if (ns) *ns = m->ops[op].ns;
  return 0;
}

const char* ekrt_op_kernel(const ekrt_model* m, int op) {
  if (!m || op < 0 || (uint32_t)op >= m->n_ops) return NULL;
  const struct ek_op* o = &m->ops[op];
  return o->type == EKM_CONV2D || o->type == EKM_FULLY_CONNECTED ? ek_conv_kernel(o) : NULL;
}

int ekrt_op_fused(const ekrt_model* m, int op) {
  return m && op >= 0 && (uint32_t)op < m->n_ops && ek_op_fused(&m->ops[op]);
}

size_t ekrt_memory_bytes(const ekrt_model* m) {
  if (!m) return 0;
  return m->arena_size + m->weights_bytes + (size_t)m->threads * m->scratch_per_thread;
}

static uint64_t op_macs(const ekrt_model* m, const struct ek_op* op) {
  const struct ek_tensor* y = &m->tensors[op->out];
  uint64_t work = y->elems;
  if (op->type == EKM_CONV2D || op->type == EKM_FULLY_CONNECTED) {
    const struct ek_tensor* w = &m->tensors[op->in[1]];
    work = (uint64_t)y->elems * (w->elems / w->dims[0]) /* K per output */;
  } else if (op->type == EKM_MAXPOOL || op->type == EKM_AVGPOOL) {
    work = (uint64_t)y->elems * (uint64_t)op->p[0] * (uint64_t)op->p[1];
  } else {
    for (uint32_t k = 0; k < op->n_in; k++) work += m->tensors[op->in[k]].elems;
  }
  return work;
}

uint64_t ek_op_work(const struct ekrt_model* m, const struct ek_op* op) {
  uint64_t macs = op_macs(m, op);
  return op->type == EKM_CONV2D || op->type == EKM_FULLY_CONNECTED ? macs >> ek_conv_work_shift(op) : macs * EK_ELEM_WORK;
}

uint64_t ekrt_macs(const ekrt_model* m) {
  if (!m) return 0;
  uint64_t total = 0;
  for (uint32_t j = 0; j < m->n_ops; j++) total += op_macs(m, &m->ops[j]);
  return total;
}

int ekrt_partition(const ekrt_model* m, int threads, int op, uint64_t* macs) {
  if (!m || !macs || threads < 1 || threads > 256 || op < -1 || (op >= 0 && (uint32_t)op >= m->n_ops)) return EKRT_EARG;
  memset(macs, 0, (size_t)threads * sizeof *macs);
  struct ekrt_model view = *m; /* the cost model at `threads` threads, as ekrt_set_threads would set it */
  view.threads = threads;
  view.work_per_thread = work_per_thread();
  for (uint32_t j = op < 0 ? 0 : (uint32_t)op; j < (op < 0 ? m->n_ops : (uint32_t)op + 1); j++) {
    const struct ek_op* o = &m->ops[j];
    if (o->type != EKM_CONV2D && o->type != EKM_FULLY_CONNECTED) continue;
    ek_conv_partition(&view, o, ek_threads_for(&view, ek_op_work(&view, o)), macs);
  }
  return 0;
}
