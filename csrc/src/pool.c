/* A small thread pool that never waits for a thread that has not shown up.
 *
 * ek_parallel_for opens a job, wakes at most as many workers as the op's work pays for, runs
 * tasks itself, then closes the job: a worker that arrives after the close leaves without
 * touching it, so the caller waits only for tasks already claimed (never for a worker still
 * waiting for a core another process holds). Workers poll for ~EK_SPIN_NS after a job (ops
 * follow each other closely) and then sleep on a condition variable; the caller polls at most
 * as long before it sleeps too. Nothing spins unbounded, so a busy core is never fought over;
 * and when workers keep missing jobs (their cores are taken), the pool rests: the next
 * splittable ops run on the caller alone, for a back-off that doubles while probes still miss.  Tasks are claimed from an atomic counter and each writes its own outputs,
 * so results are bit-identical for any thread count. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* Poll this long before sleeping: covers the gap between two ops, and is all a worker can take
 * from a caller sharing its core (a wake-up from sleep cost the caller up to ~60 us on a
 * loaded 2-vCPU VM, so polling a little is worth it). */
#define EK_SPIN_NS 20000u
#define EK_MISSES 4
#define EK_BACKOFF_MIN 16u
#define EK_BACKOFF_MAX 1024u

struct ek_pool {
  int n; /* threads, caller included */
  pthread_t* th;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers sleep here */
  pthread_cond_t done_cv; /* the caller sleeps here */
  /* seq_cst on all of these: a sleeper announces itself, then re-checks (no lost wake-up) */
  atomic_uint job;         /* id of the open job, 0 while none is open */
  atomic_int stop;
  atomic_int active;       /* workers inside the open job */
  atomic_int sleepers;     /* workers blocked (or about to) on work_cv */
  atomic_int caller_asleep;
  atomic_int slots;        /* workers still allowed to join the open job */
  atomic_size_t next;      /* next task index to claim */
  unsigned last_id;
  /* back-off when workers do not show up (their cores are busy): after EK_MISSES jobs in a row
   * where the caller ran every task, the next `rest` splittable ops run on the caller alone */
  unsigned misses, rest, backoff;
  ek_task_fn task; /* the open job (written only while no worker is inside) */
  void* ctx;
  size_t n_tasks;
};

struct worker_arg {
  struct ek_pool* pool;
  int id;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("pause");
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

static size_t run_tasks(struct ek_pool* p, int thread) {
  size_t done = 0;
  for (;; done++) {
    size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (i >= p->n_tasks) break;
    p->task(p->ctx, i, thread);
  }
  return done;
}

static int new_job(struct ek_pool* p, unsigned seen) {
  unsigned j = atomic_load(&p->job);
  return j != 0 && j != seen;
}

/* until a job other than `seen` is open (or stop): poll, then sleep */
static void wait_for_job(struct ek_pool* p, unsigned seen) {
  uint64_t t0 = ek_now_ns();
  for (unsigned spin = 1; !new_job(p, seen) && !atomic_load(&p->stop); spin++) {
    cpu_relax();
    if (spin % 64 == 0 && ek_now_ns() - t0 > EK_SPIN_NS) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while (!new_job(p, seen) && !atomic_load(&p->stop)) pthread_cond_wait(&p->work_cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
      return;
    }
  }
}

static void* worker(void* arg) {
  struct worker_arg* wa = arg;
  struct ek_pool* p = wa->pool;
  int id = wa->id;
  free(wa);
  unsigned seen = 0;
  for (;;) {
    wait_for_job(p, seen);
    if (atomic_load(&p->stop)) return NULL;
    atomic_fetch_add(&p->active, 1);
    unsigned j = atomic_load(&p->job); /* after joining: if still open, the caller waits for us */
    if (j != 0 && atomic_fetch_sub(&p->slots, 1) > 0) run_tasks(p, id);
    if (j != 0) seen = j;
    if (atomic_fetch_sub(&p->active, 1) == 1 && atomic_load(&p->caller_asleep)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

struct ek_pool* ek_pool_create(int threads) {
  struct ek_pool* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->th = calloc((size_t)threads, sizeof *p->th);
  if (!p->th || pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p->th);
    free(p);
    return NULL;
  }
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  atomic_init(&p->job, 0);
  atomic_init(&p->stop, 0);
  atomic_init(&p->active, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->caller_asleep, 0);
  atomic_init(&p->slots, 0);
  atomic_init(&p->next, 0);
  p->n = 1;
  p->backoff = EK_BACKOFF_MIN;
  for (int i = 1; i < threads; i++) {
    struct worker_arg* wa = malloc(sizeof *wa);
    if (wa) {
      wa->pool = p;
      wa->id = i;
    }
    if (!wa || pthread_create(&p->th[i], NULL, worker, wa) != 0) {
      free(wa);
      ek_pool_destroy(p); /* joins the ones started */
      return NULL;
    }
    p->n = i + 1;
  }
  return p;
}

void ek_pool_destroy(struct ek_pool* p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
  pthread_cond_destroy(&p->work_cv);
  pthread_cond_destroy(&p->done_cv);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

int ek_threads_for(const struct ekrt_model* m, uint64_t work) {
  uint64_t t = m->work_per_thread ? work / m->work_per_thread : UINT64_MAX;
  return t < 2 ? 1 : t < (uint64_t)m->threads ? (int)t : m->threads;
}

int ek_op_threads(const struct ekrt_model* m, const struct ek_op* op) {
  return m->pool && !m->pool->rest ? ek_threads_for(m, ek_op_work(m, op)) : 1;
}

void ek_parallel_for(struct ekrt_model* m, const struct ek_op* op, size_t n, ek_task_fn task, void* ctx) {
  struct ek_pool* p = m->pool;
  size_t want = (size_t)ek_op_threads(m, op);
  if (p && p->rest && ek_threads_for(m, ek_op_work(m, op)) > 1) p->rest--;
  if (want > n) want = n;
  if (want < 2) {
    for (size_t i = 0; i < n; i++) task(ctx, i, 0);
    return;
  }
  p->task = task;
  p->ctx = ctx;
  p->n_tasks = n;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store(&p->slots, (int)want - 1);
  if (++p->last_id == 0) p->last_id = 1;
  atomic_store(&p->job, p->last_id);
  /* without the mutex: a worker between announcing its sleep and sleeping misses this signal
   * and sleeps through the job, which the caller then runs alone; never a wrong result */
  int asleep = atomic_load(&p->sleepers);
  for (int k = 0; k < asleep && k < (int)want - 1; k++) pthread_cond_signal(&p->work_cv);
  size_t mine = run_tasks(p, 0);
  atomic_store(&p->job, 0); /* close: from now on no worker joins */
  if (mine < n) {
    p->misses = 0;
    p->backoff = EK_BACKOFF_MIN;
  } else if (++p->misses >= EK_MISSES) {
    p->misses = 0;
    p->rest = p->backoff;
    p->backoff = p->backoff * 2 > EK_BACKOFF_MAX ? EK_BACKOFF_MAX : p->backoff * 2;
  }
  uint64_t t0 = 0;
  for (unsigned spin = 1; atomic_load(&p->active) != 0; spin++) {
    cpu_relax();
    if (spin % 64 != 0) continue;
    if (!t0) t0 = ek_now_ns();
    if (ek_now_ns() - t0 > EK_SPIN_NS) {
      pthread_mutex_lock(&p->mu);
      atomic_store(&p->caller_asleep, 1);
      while (atomic_load(&p->active) != 0) pthread_cond_wait(&p->done_cv, &p->mu);
      atomic_store(&p->caller_asleep, 0);
      pthread_mutex_unlock(&p->mu);
      break;
    }
  }
}

uint64_t ek_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
