/* bench_load.c — the bench's loaded_slowdown: how much slower a cold and a warm estimate run
 * while other processes keep every CPU busy, the case of a monitor beside a trainer.
 *
 * The load is child processes forked here, so that the ratio is taken in one run with both
 * sides on the same machine: LOAD_SPIN, a plain loop per online CPU (two `yes >/dev/null`
 * on two cores), and LOAD_BLAS, one child calling OpenBLAS sgemm in a loop on as many threads
 * as there are CPUs, whose threads spin between products. Each child asks the kernel to kill
 * it when the bench dies (PR_SET_PDEATHSIG), so no spinner outlives a bench killed by a
 * signal; on every normal path they are killed and reaped before the function returns. */
#include "bench_load.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>

#include "clock.h"

#define MAX_CHILDREN 256

/* OpenBLAS's own call (cblas.h declares it in OpenBLAS only): the threads of the child's
 * sgemm. Weak, so that the bench still links against another BLAS (the BLAS load then runs
 * on what that BLAS chooses). */
extern void openblas_set_num_threads(int) __attribute__((weak));

static double load_average(void) {
  double l[1];
  return getloadavg(l, 1) == 1 ? l[0] : NAN;
}

/* In a child: dies with the parent (the bench) whatever kills it. */
static void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0); /* the bench already died before the prctl */
}

static volatile unsigned long spin_sink;

static void spin_forever(void) {
  for (unsigned long i = 0;; i++) spin_sink = i;
}

/* sgemm after sgemm on `threads` OpenBLAS threads: 256^3 products, a few ms each, as a
 * trainer's layers make them. */
static void blas_forever(int threads) {
  enum { N = 256 };
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
  float *a = malloc(sizeof *a * N * N * 3);
  if (!a) _exit(1);
  for (size_t i = 0; i < (size_t)N * N * 3; i++) a[i] = (float)((i * 2654435761u) % 1000) * 1e-3f;
  for (;;) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, a + N * N, N, 0.0f,
                       a + 2 * N * N, N);
}

typedef struct {
  pid_t pid[MAX_CHILDREN];
  int n;
} children;

static void stop_children(children *c) {
  for (int i = 0; i < c->n; i++) kill(c->pid[i], SIGKILL);
  for (int i = 0; i < c->n; i++)
    while (waitpid(c->pid[i], NULL, 0) < 0 && errno == EINTR) {
    }
  c->n = 0;
}

/* Forks the load; on failure stops what it started. */
static int start_children(children *c, load_kind kind, int cpus) {
  const pid_t parent = getpid();
  int want = kind == LOAD_SPIN ? cpus : 1;
  c->n = 0;
  fflush(NULL); /* nothing buffered is written twice */
  for (int i = 0; i < want && i < MAX_CHILDREN; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "loaded_slowdown: fork: %s\n", strerror(errno));
      stop_children(c);
      return -1;
    }
    if (pid == 0) {
      die_with_parent(parent);
      if (kind == LOAD_SPIN) spin_forever();
      blas_forever(cpus);
    }
    c->pid[c->n++] = pid;
  }
  return 0;
}

/* Best time of `repeats` estimates from v_init (NULL: cold). */
static int best_time(stab_spectral_workspace *ws, const float *a, size_t rows, size_t cols,
                     const double *v_init, double *v, int repeats, double *best) {
  *best = INFINITY;
  for (int r = 0; r < repeats; r++) {
    if (v_init) memcpy(v, v_init, cols * sizeof *v);
    else memset(v, 0, cols * sizeof *v);
    stab_sigma_result res;
    double t0 = monotonic_seconds();
    stab_status st = stab_spectral_norm(ws, a, NULL, rows, cols, cols, v, &res);
    double t = monotonic_seconds() - t0;
    if (st != STAB_OK) {
      fprintf(stderr, "loaded_slowdown: stab_spectral_norm: %s\n", stab_last_error());
      return -1;
    }
    if (t < *best) *best = t;
  }
  return 0;
}

int bench_loaded_slowdown(stab_spectral_workspace *ws, const float *a, const float *a2, size_t rows,
                          size_t cols, const double *v_warm, double *v, int repeats, load_kind kind,
                          load_result *out) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  out->cpus = online > 0 ? (online > MAX_CHILDREN ? MAX_CHILDREN : (int)online) : 1;
  out->idle_cold_s = out->loaded_cold_s = out->idle_warm_s = out->loaded_warm_s = NAN;
  if (repeats < 1) repeats = 1;
  if (best_time(ws, a, rows, cols, NULL, v, repeats, &out->idle_cold_s) ||
      best_time(ws, a2, rows, cols, v_warm, v, repeats, &out->idle_warm_s))
    return -1;
  children c;
  if (start_children(&c, kind, out->cpus)) return -1;
  usleep(100000); /* the children running, and the BLAS one's threads started */
  out->load_before = load_average();
  int rc = best_time(ws, a, rows, cols, NULL, v, repeats, &out->loaded_cold_s) ||
                   best_time(ws, a2, rows, cols, v_warm, v, repeats, &out->loaded_warm_s)
               ? -1
               : 0;
  out->load_after = load_average();
  stop_children(&c);
  return rc;
}
