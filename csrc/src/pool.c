/* A small thread pool: ek_parallel_for hands out task indices to the caller and n-1 workers.
 * Tasks are claimed from an atomic counter; which thread runs a task never changes its result
 * (each task writes its own outputs), so runs are bit-identical for any thread count. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#define EK_SPIN 4000 /* polls (~100 us) before a worker sleeps on the condition variable */

struct ek_pool {
  int n; /* threads, caller included */
  pthread_t* th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_uint_fast64_t generation; /* bumped for each job; 0 never used */
  atomic_int stop;
  atomic_int busy; /* workers still in the current job */
  atomic_size_t next;
  ek_task_fn task;
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
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void run_tasks(struct ek_pool* p, int thread) {
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
    if (i >= p->n_tasks) break;
    p->task(p->ctx, i, thread);
  }
}

static void* worker(void* arg) {
  struct worker_arg* wa = arg;
  struct ek_pool* p = wa->pool;
  int id = wa->id;
  free(wa);
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
    for (int spin = 0; g == seen && spin < EK_SPIN && !atomic_load_explicit(&p->stop, memory_order_relaxed); spin++) {
      cpu_relax();
      g = atomic_load_explicit(&p->generation, memory_order_acquire);
    }
    if (g == seen) {
      pthread_mutex_lock(&p->mu);
      while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
             !atomic_load_explicit(&p->stop, memory_order_relaxed))
        pthread_cond_wait(&p->cv, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    seen = g;
    run_tasks(p, id);
    atomic_fetch_sub_explicit(&p->busy, 1, memory_order_release);
  }
}

struct ek_pool* ek_pool_create(int threads) {
  struct ek_pool* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = threads;
  p->th = calloc((size_t)threads, sizeof *p->th);
  if (!p->th || pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p->th);
    free(p);
    return NULL;
  }
  pthread_cond_init(&p->cv, NULL);
  atomic_init(&p->generation, 0);
  atomic_init(&p->stop, 0);
  atomic_init(&p->busy, 0);
  atomic_init(&p->next, 0);
  for (int i = 1; i < threads; i++) {
    struct worker_arg* wa = malloc(sizeof *wa);
    if (wa) {
      wa->pool = p;
      wa->id = i;
    }
    if (!wa || pthread_create(&p->th[i], NULL, worker, wa) != 0) {
      free(wa);
      p->n = i; /* destroy joins the ones started */
      ek_pool_destroy(p);
      return NULL;
    }
  }
  return p;
}

void ek_pool_destroy(struct ek_pool* p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->stop, 1, memory_order_release);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->th);
  free(p);
}

void ek_parallel_for(struct ekrt_model* m, size_t n, ek_task_fn task, void* ctx) {
  struct ek_pool* p = m->pool;
  if (!p || p->n < 2 || n < 2) {
    for (size_t i = 0; i < n; i++) task(ctx, i, 0);
    return;
  }
  p->task = task;
  p->ctx = ctx;
  p->n_tasks = n;
  atomic_store_explicit(&p->next, 0, memory_order_relaxed);
  atomic_store_explicit(&p->busy, p->n - 1, memory_order_relaxed);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  run_tasks(p, 0);
  for (unsigned spin = 0; atomic_load_explicit(&p->busy, memory_order_acquire) != 0; spin++) {
    if (spin < EK_SPIN)
      cpu_relax();
    else
      sched_yield();
  }
}

uint64_t ek_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
