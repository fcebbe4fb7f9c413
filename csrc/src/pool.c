/* The thread pool: a static partition of each op's tasks over its threads, with stealing.
 *
 * ek_parallel_for cuts an op's tasks into one contiguous range per thread, balanced by the
 * tasks' work (the partition ekrt_partition reports), opens a job, and runs its own range;
 * each thread that finishes its range takes the tasks still unclaimed in the others' ranges,
 * one at a time from an atomic counter per range. So on a quiet machine every thread runs its
 * own share, and a thread whose core is taken (or that never shows up) costs nothing: the
 * others, the caller included, run its tasks. The caller then closes the job: a worker that
 * arrives after the close leaves without touching it, so the caller waits only for tasks
 * already claimed, never for a worker still waiting for a core another process holds.
 *
 * Waiting: inside one ekrt_run (ek_pool_begin .. ek_pool_end) workers poll for the next job
 * for up to EK_RUN_SPIN_NS (ops follow each other closely; a wake-up from sleep costs tens of
 * microseconds), yielding the core every 64 polls after the first EK_SPIN_NS (as ORT's spin
 * does), and after the run they sleep on a condition variable at once. The caller polls
 * for stragglers at most EK_SPIN_NS before it sleeps too. Nothing spins unbounded, so a busy
 * core is never fought over for long; and when polling workers keep missing jobs, or keep the
 * caller waiting at the end of a job longer than half its own share took (their cores are
 * taken), the pool rests: the next splittable ops run on the caller alone, for a back-off that
 * doubles while probes still miss, and resting workers sleep instead of polling.
 *
 * Each task writes its own outputs only, so results are bit-identical for any thread count
 * and any order of claiming. */
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_* */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#define EK_SPIN_NS 20000u      /* the caller, waiting for workers still inside a job */
#define EK_RUN_SPIN_NS 500000u /* a worker between two ops of one run */
#define EK_MISSES 4
#define EK_BACKOFF_MIN 16u
#define EK_BACKOFF_MAX 1024u

/* one thread's range of the open job's tasks, on a cache line of its own */
struct ek_range {
  _Alignas(64) atomic_size_t next;
  size_t end;
};

struct ek_pool {
  int n; /* threads, caller included */
  pthread_t* th;
  struct ek_range* ranges; /* n of them */
  size_t* bounds;          /* n + 1: the partition of the open job */
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* workers sleep here */
  pthread_cond_t done_cv; /* the caller sleeps here */
  /* seq_cst on all of these: a sleeper announces itself, then re-checks (no lost wake-up) */
  atomic_uint job;         /* id of the open job, 0 while none is open */
  atomic_int stop;
  atomic_int in_run;       /* inside ekrt_run: workers poll between jobs */
  atomic_uint wakes;       /* bumped (under mu) when a run wakes the sleeping workers */
  atomic_int active;       /* workers inside the open job */
  atomic_int sleepers;     /* workers blocked (or about to) on work_cv */
  atomic_int caller_asleep;
  atomic_int slots;        /* workers still allowed to join the open job */
  atomic_uint rest;        /* splittable ops still to run on the caller alone (back-off) */
  int parts;               /* threads (ranges) of the open job */
  unsigned last_id;
  unsigned misses, backoff;
  ek_task_fn task; /* the open job (written only while no worker is inside) */
  void* ctx;
};

struct worker_arg {
  struct ek_pool* pool;
  int id, cpu; /* cpu: pin to it, or -1 */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ __volatile__("pause");
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

/* run range `part`'s tasks, then steal from the others' ranges; `thread` picks the scratch */
static size_t run_tasks(struct ek_pool* p, int part, int thread) {
  size_t done = 0;
  for (int k = 0; k < p->parts; k++) {
    struct ek_range* r = &p->ranges[(part + k) % p->parts];
    for (;;) {
      size_t i = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
      if (i >= r->end) break;
      p->task(p->ctx, i, thread);
      done++;
    }
  }
  return done;
}

static int new_job(struct ek_pool* p, unsigned seen) {
  unsigned j = atomic_load(&p->job);
  return j != 0 && j != seen;
}

/* until a job other than `seen` is open (or stop): poll while a run is on, then sleep */
static void wait_for_job(struct ek_pool* p, unsigned seen) {
  uint64_t t0 = 0;
  for (unsigned spin = 1; !new_job(p, seen) && !atomic_load(&p->stop); spin++) {
    cpu_relax();
    if (spin % 64 != 0) continue;
    if (!t0) t0 = ek_now_ns();
    uint64_t waited = ek_now_ns() - t0;
    /* past the short pure spin, yield the core now and then: a worker sharing its core with the
     * caller (a busy machine) would otherwise hold off the very thread that opens the next job */
    if (waited > EK_SPIN_NS) sched_yield();
    if (!atomic_load(&p->in_run) || atomic_load(&p->rest) || waited > EK_RUN_SPIN_NS) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      unsigned wakes = atomic_load(&p->wakes);
      while (!new_job(p, seen) && !atomic_load(&p->stop) && atomic_load(&p->wakes) == wakes)
        pthread_cond_wait(&p->work_cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
      t0 = 0; /* woken for a run that starts: poll again (the loop ends at once on a job) */
    }
  }
}

static void pin_to(int cpu) {
#if defined(__linux__) && defined(CPU_SET)
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set); /* a refusal leaves it unpinned */
#else
  (void)cpu;
#endif
}

static void* worker(void* arg) {
  struct worker_arg* wa = arg;
  struct ek_pool* p = wa->pool;
  int id = wa->id;
  pin_to(wa->cpu);
  free(wa);
  unsigned seen = 0;
  for (;;) {
    wait_for_job(p, seen);
    if (atomic_load(&p->stop)) return NULL;
    atomic_fetch_add(&p->active, 1);
    unsigned j = atomic_load(&p->job); /* after joining: if still open, the caller waits for us */
    if (j != 0) {
      int slot = atomic_fetch_sub(&p->slots, 1);
      if (slot > 0) run_tasks(p, p->parts - slot, id);
      seen = j;
    }
    /* The last one out wakes a sleeping caller, deciding under the mutex: the caller sets
     * caller_asleep and reads active while holding it, so either it sees active at 0 or we see
     * it asleep. Reading caller_asleep without the mutex relies on a store-load (Dekker) order
     * that qemu-user does not give an aarch64 STLR/LDAR pair on an x86 host: the caller slept
     * through the signal and a deploy to an emulated board hung until killed (600 s). */
    if (atomic_fetch_sub(&p->active, 1) == 1) {
      pthread_mutex_lock(&p->mu);
      if (atomic_load(&p->caller_asleep)) pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

/* the k-th CPU this process may run on, or -1 */
static int nth_cpu(int k) {
#if defined(__linux__) && defined(CPU_ISSET)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
  for (int c = 0, seen = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set) && seen++ == k) return c;
#else
  (void)k;
#endif
  return -1;
}

struct ek_pool* ek_pool_create(int threads, int pin) {
  struct ek_pool* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->th = calloc((size_t)threads, sizeof *p->th);
  p->bounds = calloc((size_t)threads + 1, sizeof *p->bounds);
  if (posix_memalign((void**)&p->ranges, 64, (size_t)threads * sizeof *p->ranges) != 0) p->ranges = NULL;
  if (!p->th || !p->bounds || !p->ranges || pthread_mutex_init(&p->mu, NULL) != 0) {
    free(p->th);
    free(p->bounds);
    free(p->ranges);
    free(p);
    return NULL;
  }
  memset(p->ranges, 0, (size_t)threads * sizeof *p->ranges);
  pthread_cond_init(&p->work_cv, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  atomic_init(&p->job, 0);
  atomic_init(&p->stop, 0);
  atomic_init(&p->in_run, 0);
  atomic_init(&p->wakes, 0);
  atomic_init(&p->active, 0);
  atomic_init(&p->sleepers, 0);
  atomic_init(&p->caller_asleep, 0);
  atomic_init(&p->slots, 0);
  atomic_init(&p->rest, 0);
  p->n = 1;
  p->backoff = EK_BACKOFF_MIN;
  for (int i = 1; i < threads; i++) {
    struct worker_arg* wa = malloc(sizeof *wa);
    if (wa) {
      wa->pool = p;
      wa->id = i;
      wa->cpu = pin ? nth_cpu(i) : -1;
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
  free(p->bounds);
  free(p->ranges);
  free(p);
}

/* A run starts: wake the sleeping workers so they poll by the time the first big op comes
 * (unless the pool rests: then they sleep on). */
void ek_pool_begin(struct ek_pool* p) {
  if (!p) return;
  atomic_store(&p->in_run, 1);
  if (atomic_load(&p->rest) || atomic_load(&p->sleepers) == 0) return;
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add(&p->wakes, 1);
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->mu);
}

/* The run is over: workers sleep as soon as they next look. */
void ek_pool_end(struct ek_pool* p) {
  if (p) atomic_store(&p->in_run, 0);
}

int ek_threads_for(const struct ekrt_model* m, uint64_t work) {
  uint64_t t = m->work_per_thread ? work / m->work_per_thread : UINT64_MAX;
  return t < 2 ? 1 : t < (uint64_t)m->threads ? (int)t : m->threads;
}

int ek_op_threads(const struct ekrt_model* m, const struct ek_op* op) {
  return m->pool && !atomic_load(&m->pool->rest) ? ek_threads_for(m, ek_op_work(m, op)) : 1;
}

/* bounds[0..parts]: contiguous ranges of [0, n) of about equal work (work(ctx, i), or 1 per
 * task when work is NULL): range t ends at the first task whose cumulative work reaches
 * (t + 1) / parts of the total, rounded to the nearer task boundary */
void ek_partition(size_t n, int parts, ek_work_fn work, void* ctx, size_t* bounds) {
  bounds[0] = 0;
  if (!work) {
    for (int t = 1; t <= parts; t++) bounds[t] = n * (size_t)t / (size_t)parts;
    return;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += work(ctx, i);
  uint64_t sum = 0;
  size_t i = 0;
  for (int t = 1; t < parts; t++) {
    uint64_t target = total * (uint64_t)t / (uint64_t)parts;
    while (i < n) {
      uint64_t w = work(ctx, i);
      if (sum + w > target && (sum + w - target) * 2 > w) break; /* more of it lies past the target */
      sum += w;
      i++;
    }
    bounds[t] = i;
  }
  bounds[parts] = n;
}

void ek_parallel_for(struct ekrt_model* m, const struct ek_op* op, size_t n, ek_task_fn task, ek_work_fn work,
                     void* ctx) {
  struct ek_pool* p = m->pool;
  size_t want = (size_t)ek_op_threads(m, op);
  if (p && atomic_load(&p->rest) && ek_threads_for(m, ek_op_work(m, op)) > 1) atomic_fetch_sub(&p->rest, 1);
  if (want > n) want = n;
  if (want < 2) {
    for (size_t i = 0; i < n; i++) task(ctx, i, 0);
    return;
  }
  p->task = task;
  p->ctx = ctx;
  p->parts = (int)want;
  ek_partition(n, (int)want, work, ctx, p->bounds);
  for (size_t t = 0; t < want; t++) {
    atomic_store_explicit(&p->ranges[t].next, p->bounds[t], memory_order_relaxed);
    p->ranges[t].end = p->bounds[t + 1];
  }
  atomic_store(&p->slots, (int)want - 1);
  if (++p->last_id == 0) p->last_id = 1;
  atomic_store(&p->job, p->last_id);
  /* without the mutex: a worker between announcing its sleep and sleeping misses this signal
   * and sleeps through the job, which the others then run; never a wrong result */
  int asleep = atomic_load(&p->sleepers);
  for (int k = 0; k < asleep && k < (int)want - 1; k++) pthread_cond_signal(&p->work_cv);
  uint64_t t_open = ek_now_ns();
  size_t mine = run_tasks(p, 0, 0);
  atomic_store(&p->job, 0); /* close: from now on no worker joins */
  uint64_t t_mine = ek_now_ns();
  uint64_t t0 = 0;
  int waited = atomic_load(&p->active) != 0;
  for (unsigned spin = 1; atomic_load(&p->active) != 0; spin++) {
    cpu_relax();
    if (spin % 64 != 0) continue;
    if (!t0) t0 = ek_now_ns();
    if (ek_now_ns() - t0 > EK_SPIN_NS) {
      pthread_mutex_lock(&p->mu);
      atomic_store(&p->caller_asleep, 1);
      while (atomic_load(&p->active) != 0) {
        /* bounded: a wake-up lost to any ordering not foreseen here costs 10 ms, never a hang */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 10000000;
        if (until.tv_nsec >= 1000000000) {
          until.tv_sec++;
          until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&p->done_cv, &p->mu, &until);
      }
      atomic_store(&p->caller_asleep, 0);
      pthread_mutex_unlock(&p->mu);
      break;
    }
  }
  /* A miss: the caller ran every task although every worker was polling as the job opened (a
   * worker woken for this job is still on its way, which says nothing about its core; counting
   * it would keep a resting pool resting on a quiet machine, its probe finding the workers
   * asleep). A stall is one too: a worker claimed a task, then lost its core to another
   * process and kept the caller waiting longer than half the time the caller itself worked. */
  int stall = waited && (ek_now_ns() - t_mine) * 2 > t_mine - t_open;
  if (mine < n && !stall) {
    p->misses = 0;
    p->backoff = EK_BACKOFF_MIN;
  } else if ((stall || asleep == 0) && ++p->misses >= EK_MISSES) {
    p->misses = 0;
    atomic_store(&p->rest, p->backoff);
    p->backoff = p->backoff * 2 > EK_BACKOFF_MAX ? EK_BACKOFF_MAX : p->backoff * 2;
  }
}

uint64_t ek_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
