/* pass_pool.c — the threads that share a pass (or a monitor step's layers): a few workers
 * created once and kept asleep, and jobs of n numbered tasks that the caller's thread and any
 * worker that happens to be running claim one at a time.
 *
 * Why not an OpenMP parallel for: it ends on a barrier that waits for every thread of the
 * team, so on a machine whose cores are busy with other work (a trainer's spinning BLAS
 * threads) each pass waited for a descheduled thread to get a time slice, ~8 ms. Here the
 * caller never waits for a worker that has not started: tasks are claimed from an atomic
 * counter, a worker that is not scheduled simply claims none, and the caller waits only for
 * tasks already claimed and running. Which thread runs a task never changes what it computes
 * (each writes its own slot of the output), so results do not depend on the threads. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT, SCHED_IDLE */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Workers the pool ever creates. A pass has at most STABI_MAX_CHUNKS tasks; a monitor step
 * one per layer, and more threads than this would only queue for the same memory bus. */
#define POOL_MAX_WORKERS 63

/* The caller, its own tasks done, polls this many times (each a pause, tens of ns) for the
 * workers' last tasks before it sleeps: a few microseconds, enough to catch a task about to
 * end, far too short to take a core from other work. Workers never poll: they sleep as soon
 * as they find nothing to claim. */
#define SPIN_POLLS 256

/* The state of the job being run, all under `lock` except `claim` and `finished`.
 * claim packs the job's generation (high 32 bits) with the next unclaimed task (low 32):
 * a worker claims a task by compare-and-swap on the whole word, so a late worker holding an
 * earlier job's generation can never claim a task of a later job, whose data it does not
 * know. A job's fields stay valid while any of its tasks is unfinished, since the caller
 * waits for all of them. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;     /* workers: a new job */
  pthread_cond_t done;     /* the caller: its last task ended */
  int workers;             /* created and alive */
  int busy;                /* a job is running: other callers run serially */
  uint32_t gen;            /* the running (or last) job's generation */
  int joined, wanted;      /* workers that joined this job, and how many may */
  size_t n;
  stabi_task_fn fn;
  void *arg;
  uint64_t claim;          /* atomic: gen << 32 | next task */
  size_t finished;         /* atomic: tasks of this job that ended */
  int sleeping_caller;     /* the caller sleeps on `done` */
  pid_t caller;            /* the caller's thread id: its workers run at its priority */
  pid_t tids[POOL_MAX_WORKERS + 1]; /* the thread id of this job's worker in slot 1 .. joined */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0, 0, {0}};

/* ---- a worker runs at its caller's priority ----
 * A caller that measures at a low priority, so that it takes only the time other work leaves
 * idle (stab_monitor_measure_idle, which stabmeter.torch's Monitor(background=True,
 * priority='idle') calls, runs its measurement at SCHED_IDLE while the training goes on), would lose that if the pool's workers ran its tasks at their own, normal
 * priority; and once it is raised back (the trainer waits for the measurement), workers left
 * low would make it wait for them: a task at SCHED_IDLE on cores other programs keep busy gets
 * about 0.3% of one. So a worker takes its caller's scheduling policy and nice value when it
 * joins a job and, while it is below normal, again before each task; and a caller waiting for
 * its workers' last tasks raises any of them it outranks (lend_priority), every WAIT_CHECK_MS
 * while it waits. A worker that cannot take the caller's priority (raising a thread needs
 * CAP_SYS_NICE or RLIMIT_NICE) claims none of that job's tasks. About three system calls a
 * worker per job; none per task at normal priority. */

/* How often a caller waiting for its workers' tasks checks that none runs below it. */
#define WAIT_CHECK_MS 5

/* This worker's scheduling, as it last set it (valid once `known`). */
static __thread stabi_sched worker_sched;
static __thread int worker_sched_known;

/* Gives this worker the caller's scheduling; 0 when it cannot (the worker then stays out).
 * joining: read its own anew (a waiting caller may have raised it since it last set it). */
static int follow_caller(pid_t caller, int joining) {
  stabi_sched want;
  if (caller <= 0 || !stabi_sched_read(caller, &want)) return 1; /* nothing to follow: as it is */
  if (!worker_sched_known || joining) {
    if (!stabi_sched_read(0, &worker_sched)) return 1;
    worker_sched_known = 1;
  }
  if (stabi_sched_same(&want, &worker_sched)) return 1;
  if (!stabi_sched_set(0, &worker_sched, &want)) {
    worker_sched_known = 0; /* it may have part of it: read anew next time */
    return 0;
  }
  worker_sched = want;
  return 1;
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* fork: the child has only the forking thread, so it has no workers. Holding the lock across
 * fork means the child never inherits it held by a thread that does not exist there. */
static void before_fork(void) { pthread_mutex_lock(&pool.lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&pool.lock); }
static void after_fork_child(void) {
  pool.workers = 0;
  pool.busy = 0;
  pool.joined = pool.wanted = 0;
  pool.sleeping_caller = 0;
  pthread_cond_init(&pool.wake, NULL);
  pthread_cond_init(&pool.done, NULL);
  pthread_mutex_unlock(&pool.lock);
}
static void register_fork_handlers(void) {
  (void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* The caller, waiting under the lock for its workers' last tasks: any worker of this job below
 * normal while the caller is not (it was raised after the worker took its priority) is given
 * the caller's scheduling, so that the caller never waits on a starved task. */
static void lend_priority(void) {
  stabi_sched me, w;
  if (!stabi_sched_read(0, &me) || stabi_sched_below_normal(&me)) return;
  for (int slot = 1; slot <= pool.joined; slot++) {
    const pid_t tid = pool.tids[slot];
    if (tid > 0 && stabi_sched_read(tid, &w) && stabi_sched_below_normal(&w))
      (void)stabi_sched_set(tid, &w, &me); /* refused: it runs on as it is */
  }
}

/* Claims the next task of job gen; SIZE_MAX when that job has none left (or has ended). */
static size_t claim_task(uint32_t gen, size_t n) {
  uint64_t c = __atomic_load_n(&pool.claim, __ATOMIC_ACQUIRE);
  for (;;) {
    if ((uint32_t)(c >> 32) != gen || (c & 0xffffffffu) >= n) return SIZE_MAX;
    if (__atomic_compare_exchange_n(&pool.claim, &c, c + 1, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return (size_t)(c & 0xffffffffu);
  }
}

/* Runs the tasks of job gen this thread can claim, as slot `slot`; a worker (slot > 0) at its
 * caller's priority (follow_caller), or none. */
static void run_tasks(uint32_t gen, size_t n, stabi_task_fn fn, void *arg, int slot, pid_t caller) {
  size_t k;
  for (int first = 1;; first = 0) {
    if (slot > 0 && (first || stabi_sched_below_normal(&worker_sched)) && !follow_caller(caller, first)) return;
    if ((k = claim_task(gen, n)) == SIZE_MAX) break;
    fn(arg, k, slot);
    /* the release publishes what the task wrote; the one that ends the job wakes the caller */
    if (__atomic_add_fetch(&pool.finished, 1, __ATOMIC_ACQ_REL) == n) {
      pthread_mutex_lock(&pool.lock);
      if (pool.sleeping_caller) pthread_cond_signal(&pool.done);
      pthread_mutex_unlock(&pool.lock);
    }
  }
}

static void *worker_main(void *unused) {
  (void)unused;
  uint32_t seen = 0;
  int have_seen = 0;
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (!(pool.busy && (!have_seen || pool.gen != seen) && pool.joined < pool.wanted)) {
      /* a job this worker may not join (full, or one it already served) is left alone */
      if (pool.busy && (!have_seen || pool.gen != seen)) seen = pool.gen, have_seen = 1;
      pthread_cond_wait(&pool.wake, &pool.lock);
    }
    const uint32_t gen = pool.gen;
    const size_t n = pool.n;
    const stabi_task_fn fn = pool.fn;
    void *const arg = pool.arg;
    const pid_t caller = pool.caller;
    const int slot = ++pool.joined;
    pool.tids[slot] = stabi_thread_id();
    seen = gen, have_seen = 1;
    pthread_mutex_unlock(&pool.lock);
    run_tasks(gen, n, fn, arg, slot, caller);
    pthread_mutex_lock(&pool.lock);
  }
  return NULL;
}

/* Creates workers until there are `want` (or creation fails: then fewer). Under the lock. */
static void grow_workers(int want) {
  if (want > POOL_MAX_WORKERS) want = POOL_MAX_WORKERS;
  while (pool.workers < want) {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    /* the default stack: a monitor's layer tasks call LAPACK and BLAS, whose needs are theirs */
    pthread_t t;
    int rc = pthread_create(&t, &attr, worker_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) return; /* no more threads: the passes use those there are, or none */
    pool.workers++;
  }
}

int stabi_pool_cpus(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int c = CPU_COUNT(&set);
    if (c > 0) return c;
  }
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (c > 1024 ? 1024 : (int)c) : 1;
}

int stabi_pool_threads(int threads) { return threads > 0 ? threads : stabi_pool_cpus(); }

int stabi_pool_run(size_t n, int threads, stabi_task_fn fn, void *arg) {
  if ((size_t)threads > n) threads = (int)n;
  if (threads > 1 && n <= 0xffffffffu) {
    pthread_once(&fork_once, register_fork_handlers);
    pthread_mutex_lock(&pool.lock);
    if (pool.busy) { /* another caller's job (or ours, one level up): this one runs serially */
      pthread_mutex_unlock(&pool.lock);
      threads = 1;
    } else {
      grow_workers(threads - 1);
      threads = pool.workers + 1 < threads ? pool.workers + 1 : threads;
    }
    if (threads > 1) {
      const uint32_t gen = ++pool.gen;
      pool.busy = 1;
      pool.joined = 0;
      pool.wanted = threads - 1;
      pool.n = n;
      pool.fn = fn;
      pool.arg = arg;
      pool.caller = stabi_thread_id();
      __atomic_store_n(&pool.finished, 0, __ATOMIC_RELAXED);
      __atomic_store_n(&pool.claim, (uint64_t)gen << 32, __ATOMIC_RELEASE);
      pthread_cond_broadcast(&pool.wake);
      pthread_mutex_unlock(&pool.lock);

      run_tasks(gen, n, fn, arg, 0, 0);
      /* wait for tasks that workers claimed and are still running; never for a worker that
       * has not started, since it can claim nothing now */
      int polls = 0;
      while (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < n && polls < SPIN_POLLS) {
        cpu_relax();
        polls++;
      }
      pthread_mutex_lock(&pool.lock);
      while (__atomic_load_n(&pool.finished, __ATOMIC_ACQUIRE) < n) {
        pool.sleeping_caller = 1;
        lend_priority();
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WAIT_CHECK_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
          until.tv_sec++;
          until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&pool.done, &pool.lock, &until);
      }
      pool.sleeping_caller = 0;
      pool.busy = 0;
      const int used = pool.joined + 1;
      pthread_mutex_unlock(&pool.lock);
      return used;
    }
  }
  for (size_t k = 0; k < n; k++) fn(arg, k, 0);
  return 1;
}
