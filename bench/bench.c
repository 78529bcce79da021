/* bench.c — how fast and how well stabmeter estimates sigma(W) of f32 matrices.
 *
 * For each size, on a seeded Gaussian W (std 1/sqrt(cols)): cold Lanczos and power
 * iteration to the tolerance, LAPACK sgesvd (values only) as the time to beat and the
 * reference sigma, the read bandwidth one library pass reaches (f32, and BF16 read as stored)
 * against the reference read (bench/stream_read.h: the faster of a wide-vector read and
 * OpenBLAS sgemv of the same bytes, same run) and a plain streaming read, and the passes a
 * warm start needs after an update of relative size 1e-3. Results (a table, or one JSON object with --json) on stdout, progress on stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <lapacke.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_arpack.h"
#include "bench_power.h"
#include "cli.h"
#include "bench_load.h"
#include "clock.h"
#include "stream_read.h"
#include "stabmeter.h"
#include "synth.h"

#define MIB (1024.0 * 1024.0)
/* Matrices at least this big do not fit in any cache of the machines we run on, so their
 * pass bandwidth is a DRAM figure; the bandwidth target is judged on them. */
#define BIG_MATRIX_BYTES (64.0 * MIB)
#define TARGET_SPEEDUP 100.0
/* cold Lanczos against ARPACK at equal or better actual error, on these sizes */
#define TARGET_ARPACK 2.0
static const char *const arpack_target_sizes[] = {"4096x4096", "768x3072", "3072x768"};
/* ARPACK's tolerance ladder, loosest first (see arpack_ladder) */
static const double arpack_ladder_tols[] = {1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6};
/* the spiked matrices' s2/s1 */
#define SPIKE_RATIO 0.836
#define TARGET_FRACTION 0.70
/* one pass against the reference read (the faster of a wide-vector read and sgemv) */
#define TARGET_REFERENCE_FRACTION 0.85
#define TARGET_WARM_PASSES 4
/* beside a busy machine, a cold or warm estimate at most this many times its idle time */
#define TARGET_LOADED_SLOWDOWN 1.5

static const char *const default_sizes = "512x512,1024x1024,2048x2048,4096x4096,768x3072,3072x768";
static const char *const quick_sizes = "256x256,512x512,256x1024,1024x256";

/* ---------------------------------------------------------------------------------- */
/* Options                                                                             */

typedef struct {
  size_t rows, cols;
  int spiked; /* ROWSxCOLS:spiked: Gaussian plus a rank-one spike, s2/s1 = SPIKE_RATIO */
} shape;

typedef struct {
  shape *sizes;          /* the matrices to measure, in order */
  size_t n_sizes;
  int threads;           /* stab_spectral_params.threads; 0 = the CPUs this process may run on */
  int stream_threads;    /* threads of the plain streaming read (the same number, resolved) */
  double load_start, load_end; /* 1-minute load average before and after the run */
  double tol;            /* target relative error of sigma */
  int max_passes;        /* pass limit of the cold and warm estimates */
  int repeats;           /* timings of one pass and of the stream read: best of this many (at least) */
  int cold_repeats;      /* cold and warm estimates: best of this many (within a time budget) */
  uint64_t seed;
  double update;         /* ||dW||_F / ||W||_F of the warm-start update */
  int json;
  int lapack;            /* 0 with --no-lapack */
  int exact_f64;         /* also dgesvd; its sigma becomes the reference */
  int exact_warm;        /* also the SVD of W + dW, for the actual warm errors */
  int loaded;            /* 0 with --no-load: no loaded_slowdown */
} options;

/* ---------------------------------------------------------------------------------- */
/* Results                                                                             */

/* One spectral estimate: the best time over its repeats and the (deterministic) result. */
typedef struct {
  double seconds;
  int passes;
  int converged;
  double sigma;
  double est_rel_err;  /* the library's own estimate */
  double rel_err;      /* |sigma - reference| / reference; NaN without a reference */
} sigma_run;

typedef struct {
  size_t rows, cols;
  int ok;                  /* 0 when something failed to run for this size */
  sigma_run cold_power, cold_krylov, warm_power, warm_krylov;
  int warm_err_actual;     /* warm rel_err is against an SVD of W + dW (--exact-warm) */
  double sigma_lapack;     /* sgesvd of W (NaN with --no-lapack) */
  double sigma_f64;        /* dgesvd of W (--exact-f64 only) */
  double lapack_s, dgesvd_s;
  double speedup;          /* lapack_s / cold_krylov.seconds */
  double stream_s, stream_GBps;
  /* One pass of two vectors: a one-pass call warm-started from a fixed vector (the block of
   * a warm start is two vectors, the pass every monitor step makes). */
  double pass_s, pass_median_s, pass_GBps, pass_median_GBps;
  int pass_passes;         /* out.passes of the one-pass call; must be 1 */
  double pass_cold_GBps;   /* the same call from a cold start: one pass of four vectors */
  double fraction;         /* pass_GBps / stream_GBps */
  /* The reference read (bench/stream_read.h), with the pass's threads and with one: */
  double wide_GBps, sgemv_GBps, reference_GBps;          /* best of each; the faster */
  double wide_1t_GBps, sgemv_1t_GBps, reference_1t_GBps;
  double reference_fraction;    /* pass_GBps / reference_GBps */
  double pass_1t_GBps, reference_1t_fraction; /* a one-thread pass, against reference_1t */
  double pass_bf16_s, pass_bf16_GBps;  /* one pass over W stored as BF16 (bytes as stored) */
  double bf16_reference_fraction;      /* pass_bf16_GBps / reference_GBps */
  load_result load_spin, load_blas; /* beside spinning loops, beside spinning OpenBLAS threads */
  int loaded_ok;           /* both measured */
  int spiked;
  /* ARPACK at the loosest tolerance of the ladder whose actual error <= tol (NaN/-1 if none) */
  double arpack_s, arpack_rel_err, arpack_tol;
  int arpack_reads;
  /* the library at the loosest of tol, tol/3, tol/10, ... whose actual error <= ARPACK's */
  double krylov_equal_tol, krylov_equal_s, krylov_equal_rel_err;
  int krylov_equal_passes;
  double speedup_vs_arpack;
  /* ARPACK stopped by its own rule at the bound the library stops on (arpack_own_rule) */
  double arpack_own_s, arpack_own_rel_err, arpack_own_tol;
  int arpack_own_reads;
  double speedup_vs_arpack_own; /* arpack_own_s / cold_krylov.seconds (the library at tol) */
  double power_oracle_s;   /* torch-style power iteration stopped by an oracle at tol */
  int power_oracle_iterations;
} size_result;

static void sigma_run_clear(sigma_run *r)
{
  r->seconds = NAN;
  r->passes = -1;
  r->converged = 0;
  r->sigma = NAN;
  r->est_rel_err = NAN;
  r->rel_err = NAN;
}

static void size_result_clear(size_result *r, shape s)
{
  r->rows = s.rows;
  r->cols = s.cols;
  r->ok = 1;
  sigma_run_clear(&r->cold_power);
  sigma_run_clear(&r->cold_krylov);
  sigma_run_clear(&r->warm_power);
  sigma_run_clear(&r->warm_krylov);
  r->warm_err_actual = 0;
  r->sigma_lapack = r->sigma_f64 = NAN;
  r->lapack_s = r->dgesvd_s = r->speedup = NAN;
  r->stream_s = r->stream_GBps = NAN;
  r->pass_s = r->pass_median_s = r->pass_GBps = r->pass_median_GBps = NAN;
  r->pass_cold_GBps = NAN;
  r->pass_passes = -1;
  r->fraction = NAN;
  r->wide_GBps = r->sgemv_GBps = r->reference_GBps = NAN;
  r->wide_1t_GBps = r->sgemv_1t_GBps = r->reference_1t_GBps = NAN;
  r->reference_fraction = r->pass_1t_GBps = r->reference_1t_fraction = NAN;
  r->pass_bf16_s = r->pass_bf16_GBps = r->bf16_reference_fraction = NAN;
  r->spiked = s.spiked;
  r->arpack_s = r->arpack_rel_err = r->arpack_tol = NAN;
  r->arpack_reads = -1;
  r->krylov_equal_tol = r->krylov_equal_s = r->krylov_equal_rel_err = NAN;
  r->krylov_equal_passes = -1;
  r->speedup_vs_arpack = NAN;
  r->arpack_own_s = r->arpack_own_rel_err = r->arpack_own_tol = r->speedup_vs_arpack_own = NAN;
  r->arpack_own_reads = -1;
  r->power_oracle_s = NAN;
  r->power_oracle_iterations = -1;
}

/* ---------------------------------------------------------------------------------- */
/* Small helpers                                                                       */

static void progress(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fflush(stderr);
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of n values (sorts them). */
static double median(double *x, int n)
{
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double rel_diff(double x, double ref)
{
  return fabs(x - ref) / fabs(ref);
}

/* f64 Frobenius norm of n floats. */
static double frobenius(const float *a, size_t n)
{
  double s = 0.0;
  for (size_t i = 0; i < n; i++)
    s += (double)a[i] * a[i];
  return sqrt(s);
}

/* A per-size, per-purpose seed: the same matrix for the same --seed and shape whatever
 * else is on the list. splitmix64 mixes its seed, so a plain combination is enough. */
static uint64_t seed_for(uint64_t seed, shape s, uint64_t purpose)
{
  return seed ^ (UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)s.rows) ^
         (UINT64_C(0xc2b2ae3d27d4eb4f) * (uint64_t)s.cols) ^ (UINT64_C(0x165667b19e3779f9) * purpose);
}

/* The 1-minute load average (Linux /proc/loadavg), NaN where there is none. Other work on
 * the machine shows up directly in the timings, so the run records it. */
static double load_average(void)
{
  double x = NAN;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &x) != 1)
      x = NAN;
    fclose(f);
  }
  return x;
}

static void report_stab_error(const char *what, stab_status st)
{
  progress("%s: %s: %s (%s)\n", cli_name, what, stab_strerror(st), stab_last_error());
}

/* ---------------------------------------------------------------------------------- */
/* The plain streaming read                                                            */

/* Keeps the sums alive so that the compiler cannot drop the reads. */
static volatile double stream_sink;

/* Seconds of one streaming read of a[0..n). */
static double time_stream(const float *a, size_t n, int threads)
{
  double t0 = monotonic_seconds();
  double s = stream_read_threads(a, n, threads);
  double t = monotonic_seconds() - t0;
  stream_sink = s;
  return t;
}

/* ---------------------------------------------------------------------------------- */
/* Library calls                                                                       */

/* Runs stab_spectral_norm on a (rows x cols) up to `repeats` times, each from the same
 * start: v_init (cols values) or, when NULL, all zeros (a cold start). Stops repeating
 * once `budget_s` seconds were spent. Keeps the best time; the result is the last call's
 * (the library is deterministic). On return v holds the last estimate of the top right
 * singular vector. */
static stab_status run_sigma(stab_spectral_workspace *ws, const float *a, size_t rows, size_t cols,
                             double *v, const double *v_init, int repeats, double budget_s,
                             sigma_run *out)
{
  double spent = 0.0;
  out->seconds = INFINITY;
  for (int r = 0; r < repeats && (r == 0 || spent < budget_s); r++) {
    if (v_init)
      memcpy(v, v_init, cols * sizeof *v);
    else
      memset(v, 0, cols * sizeof *v);
    stab_sigma_result res;
    double t0 = monotonic_seconds();
    stab_status st = stab_spectral_norm(ws, a, NULL, rows, cols, cols, v, &res);
    double t = monotonic_seconds() - t0;
    if (st != STAB_OK)
      return st;
    spent += t;
    if (t < out->seconds)
      out->seconds = t;
    out->passes = res.passes;
    out->converged = res.converged;
    out->sigma = res.sigma;
    out->est_rel_err = res.rel_err;
  }
  return STAB_OK;
}

static stab_status make_workspace(size_t rows, size_t cols, stab_spectral_method method, double tol,
                                  int max_passes, int threads, stab_spectral_workspace **ws)
{
  stab_spectral_params p = stab_spectral_default_params();
  p.method = method;
  p.tol = tol;
  p.max_passes = max_passes;
  p.threads = threads;
  return stab_spectral_workspace_create(rows, cols, &p, ws);
}

/* sigma(A) by LAPACK ?gesvd, values only, destroying `work`, which must hold a copy of A:
 * float with precision 's' (sgesvd), double with 'd' (dgesvd). A row-major rows x cols matrix
 * is the column-major cols x rows matrix A^T, which has the same singular values, so LAPACK
 * gets the memory as it is: no transposed copy inside LAPACKE to pollute the time. Returns
 * the seconds, or a negative value. */
static double lapack_sigma(char precision, void *work, size_t rows, size_t cols, double *sigma)
{
  size_t k = rows < cols ? rows : cols;
  size_t elem = precision == 'd' ? sizeof(double) : sizeof(float);
  void *s = malloc(k * elem);      /* the singular values, in work's precision */
  void *superb = malloc(k * elem); /* LAPACK's scratch */
  lapack_int m = (lapack_int)cols, n = (lapack_int)rows;
  double t = -1.0;
  if (!s || !superb) {
    progress("%s: out of memory for %cgesvd\n", cli_name, precision);
    goto out;
  }
  double t0 = monotonic_seconds();
  lapack_int info = precision == 'd'
                        ? LAPACKE_dgesvd(LAPACK_COL_MAJOR, 'N', 'N', m, n, work, m, s, NULL, 1, NULL, 1, superb)
                        : LAPACKE_sgesvd(LAPACK_COL_MAJOR, 'N', 'N', m, n, work, m, s, NULL, 1, NULL, 1, superb);
  double t1 = monotonic_seconds();
  if (info != 0) {
    progress("%s: LAPACKE_%cgesvd failed, info = %d\n", cli_name, precision, (int)info);
    goto out;
  }
  *sigma = precision == 'd' ? *(double *)s : *(float *)s;
  t = t1 - t0;
out:
  free(s);
  free(superb);
  return t;
}

/* The reference sigma of `a` for the actual errors: dgesvd with --exact-f64, else sgesvd.
 * fcopy (and dcopy with --exact-f64) are scratch of the matrix's size. Returns 0 on success. */
static int reference_sigma(const options *o, const float *a, size_t rows, size_t cols,
                           float *fcopy, double *dcopy, double *sigma_f32, double *t_f32,
                           double *sigma_f64, double *t_f64)
{
  size_t n = rows * cols;
  memcpy(fcopy, a, n * sizeof *fcopy);
  *t_f32 = lapack_sigma('s', fcopy, rows, cols, sigma_f32);
  if (*t_f32 < 0.0)
    return -1;
  if (o->exact_f64) {
    for (size_t i = 0; i < n; i++)
      dcopy[i] = a[i];
    *t_f64 = lapack_sigma('d', dcopy, rows, cols, sigma_f64);
    if (*t_f64 < 0.0)
      return -1;
  }
  return 0;
}

/* OpenBLAS's worker threads spin for a while after a call; give them time to go to sleep
 * so that they do not steal the cores from the next timed pass. */
static void let_blas_idle(void)
{
  struct timespec t = {0, 200 * 1000 * 1000};
  nanosleep(&t, NULL);
}

/* One pass over W stored as BF16 (wb, rows x cols), read as it is stored: a layer's metrics
 * (the public way to measure a 16-bit matrix) at two pass limits, best of `repeats` each,
 * interleaved; the difference over the difference of passes leaves one pass, without the
 * layer's other reads and its workspace. tol is the smallest the f32 passes take, so that
 * neither estimate stops early. Seconds, or NaN if a call failed or the passes did not
 * differ. */
static double time_bf16_pass(const options *o, const uint16_t *wb, size_t rows, size_t cols,
                             int repeats)
{
  enum { FEW = 2, MANY = 6 }; /* few passes a call: fewer chances of a stalled one in each */
  stab_layer l = {.name = "w", .kind = STAB_KIND_LINEAR, .d_in = cols, .d_out = rows,
                  .weight = (const float *)(const void *)wb, .dtype = STAB_DTYPE_BF16};
  double best[2] = {INFINITY, INFINITY};
  int passes[2] = {0, 0};
  for (int k = 0; k < repeats; k++)
    for (int which = 0; which < 2; which++) {
      stab_metrics_params p = stab_metrics_default_params();
      p.spectral.tol = STAB_SPECTRAL_F32_TOL_MIN;
      p.spectral.max_passes = which ? MANY : FEW;
      p.spectral.threads = o->threads;
      stab_metrics m;
      double t0 = monotonic_seconds();
      stab_status st = stab_layer_metrics(&l, NULL, &p, &m, NULL);
      double t = monotonic_seconds() - t0;
      if (st != STAB_OK) {
        report_stab_error("stab_layer_metrics (BF16 passes)", st);
        return NAN;
      }
      passes[which] = m.passes;
      if (t < best[which])
        best[which] = t;
    }
  if (passes[1] <= passes[0])
    return NAN;
  return (best[1] - best[0]) / (passes[1] - passes[0]);
}

/* W += theta u v^T (u, v random unit vectors) with theta such that s2/s1 = SPIKE_RATIO:
 * W's Gaussian part (std 1/sqrt(cols)) has its top singular value near the bulk edge
 * 1 + sqrt(c), c = rows / cols, and a spike theta above sqrt(c)^(1/2) lifts s1 to
 * sqrt((1 + theta^2)(c + theta^2)) / theta (Benaych-Georges and Nadakuditi), solved for
 * theta by bisection. */
static void add_spike(float *w, size_t rows, size_t cols, synth_rng *rng)
{
  double c = (double)rows / (double)cols, edge = 1.0 + sqrt(c), want = edge / SPIKE_RATIO;
  double lo = pow(c, 0.25), hi = 100.0;
  for (int i = 0; i < 200; i++) {
    double th = 0.5 * (lo + hi);
    double s1 = sqrt((1.0 + th * th) * (c + th * th)) / th;
    if (s1 < want) lo = th; else hi = th;
  }
  double theta = 0.5 * (lo + hi);
  double *u = malloc(rows * sizeof *u), *v = malloc(cols * sizeof *v), nu = 0.0, nv = 0.0;
  if (!u || !v) {
    free(u);
    free(v);
    return;
  }
  for (size_t i = 0; i < rows; i++) {
    u[i] = synth_normal(rng);
    nu += u[i] * u[i];
  }
  for (size_t j = 0; j < cols; j++) {
    v[j] = synth_normal(rng);
    nv += v[j] * v[j];
  }
  double k = theta / sqrt(nu * nv);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++)
      w[i * cols + j] = (float)(w[i * cols + j] + k * u[i] * v[j]);
  free(u);
  free(v);
}

/* "4096x4096" or "4096x4096:spiked" */
static const char *shape_name(char *buf, size_t len, size_t rows, size_t cols, int spiked)
{
  snprintf(buf, len, "%zux%zu%s", rows, cols, spiked ? ":spiked" : "");
  return buf;
}

/* ARPACK stopped by its own rule, as a user without an oracle runs it: dsaupd stops when the
 * Ritz value theta = sigma^2 has a residual <= tol_a theta; the library stops when r / (2 theta)
 * <= tol (spectral.c), so tol_a = 2 tol is the same bound. Best of `repeats` timings, against
 * the library's cold estimate at tol. */
static void arpack_own_rule(const options *o, const float *w, size_t rows, size_t cols, double ref,
                            const char *tag, size_result *r)
{
  double tol = 2.0 * o->tol, sig = NAN, best = INFINITY, t;
  int reads = -1;
  for (int k = 0; k < o->cold_repeats; k++) {
    if (arpack_sigma(w, rows, cols, tol, &sig, &reads, &t))
      return;
    if (t < best)
      best = t;
  }
  r->arpack_own_s = best;
  r->arpack_own_rel_err = rel_diff(sig, ref);
  r->arpack_own_tol = tol;
  r->arpack_own_reads = reads;
  r->speedup_vs_arpack_own = best / r->cold_krylov.seconds;
  progress("%s: arpack by its own rule, tol %.0e: %.4f s, %d reads, err %.2e: lanczos at tol %.1e %.2fx\n",
           tag, tol, best, reads, r->arpack_own_rel_err, o->tol, r->speedup_vs_arpack_own);
}

/* ARPACK on the ladder of tolerances, loosest first: the first whose actual error is <= tol
 * (the fastest ARPACK answer that meets the bench's requirement), best of `repeats` timings.
 * Then the library at tol, or at tol/3, tol/10, ... until its actual error is <= ARPACK's:
 * the speedup compares answers at least as accurate as ARPACK's. */
static void arpack_ladder(const options *o, const float *w, size_t rows, size_t cols, double ref,
                          const char *tag, size_result *r)
{
  for (size_t i = 0; i < sizeof arpack_ladder_tols / sizeof *arpack_ladder_tols; i++) {
    double tol = arpack_ladder_tols[i], sig = NAN, best = INFINITY, t;
    int reads = -1;
    for (int k = 0; k < o->cold_repeats; k++) {
      if (arpack_sigma(w, rows, cols, tol, &sig, &reads, &t))
        return;
      if (t < best)
        best = t;
    }
    double err = rel_diff(sig, ref);
    progress("%s: arpack tol %.0e: %.4f s, %d reads, err %.2e\n", tag, tol, best, reads, err);
    if (err <= o->tol) {
      r->arpack_s = best;
      r->arpack_rel_err = err;
      r->arpack_tol = tol;
      r->arpack_reads = reads;
      break;
    }
  }
  let_blas_idle();
  if (!isfinite(r->arpack_s))
    return;
  double *v = malloc(cols * sizeof *v);
  if (!v)
    return;
  /* tol, tol/3, tol/10, tol/30, ... down to the library's smallest tolerance */
  for (int i = 0;; i++) {
    double tol = o->tol / (pow(10.0, i / 2) * (i % 2 ? 3.0 : 1.0));
    if (tol < STAB_SPECTRAL_TOL_MIN)
      break;
    stab_spectral_workspace *ws = NULL;
    sigma_run run;
    sigma_run_clear(&run);
    if (make_workspace(rows, cols, STAB_SPECTRAL_LANCZOS, tol, o->max_passes, o->threads, &ws) != STAB_OK ||
        run_sigma(ws, w, rows, cols, v, NULL, o->cold_repeats, 5.0, &run) != STAB_OK) {
      stab_spectral_workspace_free(ws);
      break;
    }
    stab_spectral_workspace_free(ws);
    run.rel_err = rel_diff(run.sigma, ref);
    if (run.rel_err <= r->arpack_rel_err) {
      r->krylov_equal_tol = tol;
      r->krylov_equal_s = run.seconds;
      r->krylov_equal_rel_err = run.rel_err;
      r->krylov_equal_passes = run.passes;
      r->speedup_vs_arpack = r->arpack_s / run.seconds;
      progress("%s: lanczos tol %.1e: %.4f s, %d passes, err %.2e: %.2fx arpack\n", tag, tol,
               run.seconds, run.passes, run.rel_err, r->speedup_vs_arpack);
      break;
    }
  }
  free(v);
}

/* ---------------------------------------------------------------------------------- */
/* One size                                                                            */

/* Measures one size into r. Returns 0, or -1 if something failed to run (r->ok = 0). */
static int bench_size(const options *o, shape sh, size_t index, size_result *r)
{
  size_t rows = sh.rows, cols = sh.cols, n = rows * cols;
  double bytes = (double)n * sizeof(float);
  char tag[64];
  snprintf(tag, sizeof tag, "[%zu/%zu] %zux%zu", index + 1, o->n_sizes, rows, cols);

  float *w = NULL;       /* W, rows x cols row-major */
  float *w2 = NULL;      /* W + dW, rows x cols */
  float *fcopy = NULL;   /* sgesvd's copy of W (or of W + dW), rows x cols */
  double *dcopy = NULL;  /* dgesvd's f64 copy, rows x cols (--exact-f64 only) */
  double *v = NULL;      /* estimate of the top right singular vector, cols */
  double *v_power = NULL, *v_krylov = NULL; /* the cold estimates' vectors, cols each */
  double *v_warm = NULL; /* the one-pass calls' warm start: all ones, cols */
  stab_spectral_workspace *ws_power = NULL, *ws_krylov = NULL, *ws_one = NULL, *ws_one_1t = NULL;
  double *pass_times = NULL;
  float *xf = NULL, *yf = NULL; /* the reference sgemv's vectors, cols and rows */
  uint16_t *wb = NULL;          /* W as BF16 (its f32 numbers' high halves), rows x cols */
  stab_status st;
  int rc = -1;

  size_result_clear(r, sh);
  int need_copy = o->lapack || o->exact_warm;
  w = malloc(n * sizeof *w);
  w2 = malloc(n * sizeof *w2);
  fcopy = need_copy ? malloc(n * sizeof *fcopy) : NULL;
  dcopy = need_copy && o->exact_f64 ? malloc(n * sizeof *dcopy) : NULL;
  v = malloc(cols * sizeof *v);
  v_power = malloc(cols * sizeof *v_power);
  v_krylov = malloc(cols * sizeof *v_krylov);
  v_warm = malloc(cols * sizeof *v_warm);
  xf = malloc(cols * sizeof *xf);
  yf = malloc(rows * sizeof *yf);
  wb = malloc(n * sizeof *wb);
  if (!w || !w2 || !v || !v_power || !v_krylov || !v_warm || !xf || !yf || !wb || (need_copy && !fcopy) ||
      (need_copy && o->exact_f64 && !dcopy)) {
    progress("%s: %s: out of memory\n", cli_name, tag);
    goto out;
  }

  progress("%s: fill (%.0f MiB)\n", tag, bytes / MIB);
  synth_rng rng;
  synth_seed(&rng, seed_for(o->seed, sh, 0));
  synth_gaussian(w, n, 1.0 / sqrt((double)cols), &rng);
  for (size_t j = 0; j < cols; j++)
    v_warm[j] = 1.0;
  if (sh.spiked)
    add_spike(w, rows, cols, &rng);

  if ((st = make_workspace(rows, cols, STAB_SPECTRAL_POWER, o->tol, o->max_passes, o->threads,
                           &ws_power)) != STAB_OK ||
      (st = make_workspace(rows, cols, STAB_SPECTRAL_LANCZOS, o->tol, o->max_passes, o->threads,
                           &ws_krylov)) != STAB_OK ||
      (st = make_workspace(rows, cols, STAB_SPECTRAL_LANCZOS, o->tol, 1, o->threads, &ws_one)) !=
          STAB_OK ||
      (st = make_workspace(rows, cols, STAB_SPECTRAL_LANCZOS, o->tol, 1, 1, &ws_one_1t)) != STAB_OK) {
    report_stab_error("stab_spectral_workspace_create", st);
    goto out;
  }

  /* Bandwidth first, while no BLAS thread is awake. The stream reads and the one-pass
   * calls alternate, so that both see the same machine (other load, clock); the best of
   * each is kept. Small matrices get more repeats so that each timing reads at least
   * 1 GiB in total. */
  int reps = o->repeats;
  double want = 1024.0 * MIB / bytes;
  if (want > reps)
    reps = want > 1000 ? 1000 : (int)want;
  progress("%s: stream read and one pass, x%d each\n", tag, reps);
  pass_times = malloc((size_t)reps * sizeof *pass_times);
  if (!pass_times) {
    progress("%s: %s: out of memory\n", cli_name, tag);
    goto out;
  }
  {
    sigma_run one, cold;
    double cold_s = INFINITY;
    /* Warm-up of both: threads started, caches and branch predictors in their steady state. */
    stream_sink = stream_read_threads(w, n, o->stream_threads);
    if ((st = run_sigma(ws_one, w, rows, cols, v, v_warm, 1, 0.0, &one)) != STAB_OK) {
      report_stab_error("stab_spectral_norm (one pass)", st);
      goto out;
    }
    r->stream_s = INFINITY;
    for (int k = 0; k < reps; k++) {
      double t = time_stream(w, n, o->stream_threads);
      if (t < r->stream_s)
        r->stream_s = t;
      if ((st = run_sigma(ws_one, w, rows, cols, v, v_warm, 1, 0.0, &one)) != STAB_OK ||
          (st = run_sigma(ws_one, w, rows, cols, v, NULL, 1, 0.0, &cold)) != STAB_OK) {
        report_stab_error("stab_spectral_norm (one pass)", st);
        goto out;
      }
      pass_times[k] = one.seconds;
      cold_s = fmin(cold_s, cold.seconds / (cold.passes > 0 ? cold.passes : 1));
    }
    r->pass_cold_GBps = bytes / cold_s * 1e-9;
    r->stream_GBps = bytes / r->stream_s * 1e-9;
    r->pass_passes = one.passes;
    if (one.passes != 1)
      progress("%s: %s: max_passes = 1 made %d passes (bandwidth counts them all)\n", cli_name, tag,
               one.passes);
    double passes = one.passes > 0 ? one.passes : 1;
    r->pass_median_s = median(pass_times, reps); /* sorted: [0] is the best */
    r->pass_s = pass_times[0];
    r->pass_GBps = bytes * passes / r->pass_s * 1e-9;
    r->pass_median_GBps = bytes * passes / r->pass_median_s * 1e-9;
    r->fraction = r->pass_GBps / r->stream_GBps;
  }

  /* The reference read, and a one-thread pass against a one-thread reference (the probe and
   * the monitor measure each layer on one thread). The wide reads alternate with the passes;
   * the sgemv calls come after, as OpenBLAS's threads spin for a while after each. */
  progress("%s: reference read (wide read, sgemv) and one-thread pass, x%d each\n", tag, reps);
  {
    sigma_run one;
    double wide = INFINITY, wide_1t = INFINITY, pass_1t = INFINITY;
    double gemv = INFINITY, gemv_1t = INFINITY;
    if ((st = run_sigma(ws_one_1t, w, rows, cols, v, v_warm, 1, 0.0, &one)) != STAB_OK) {
      report_stab_error("stab_spectral_norm (one pass, one thread)", st);
      goto out;
    }
    stream_sink = reference_wide_read(w, n, o->stream_threads);
    for (int k = 0; k < reps; k++) {
      wide = fmin(wide, reference_wide_read(w, n, o->stream_threads));
      wide_1t = fmin(wide_1t, reference_wide_read(w, n, 1));
      if ((st = run_sigma(ws_one_1t, w, rows, cols, v, v_warm, 1, 0.0, &one)) != STAB_OK) {
        report_stab_error("stab_spectral_norm (one pass, one thread)", st);
        goto out;
      }
      pass_1t = fmin(pass_1t, one.seconds / (one.passes > 0 ? one.passes : 1));
    }
    for (size_t j = 0; j < cols; j++)
      xf[j] = 1.0f / (float)(j + 1);
    reference_sgemv(w, rows, cols, o->stream_threads, xf, yf);
    for (int k = 0; k < reps; k++)
      gemv = fmin(gemv, reference_sgemv(w, rows, cols, o->stream_threads, xf, yf));
    for (int k = 0; k < reps; k++)
      gemv_1t = fmin(gemv_1t, reference_sgemv(w, rows, cols, 1, xf, yf));
    let_blas_idle();
    r->wide_GBps = bytes / wide * 1e-9;
    r->sgemv_GBps = bytes / gemv * 1e-9;
    r->reference_GBps = fmax(r->wide_GBps, r->sgemv_GBps);
    r->reference_fraction = r->pass_GBps / r->reference_GBps;
    r->wide_1t_GBps = bytes / wide_1t * 1e-9;
    r->sgemv_1t_GBps = bytes / gemv_1t * 1e-9;
    r->reference_1t_GBps = fmax(r->wide_1t_GBps, r->sgemv_1t_GBps);
    r->pass_1t_GBps = bytes / pass_1t * 1e-9;
    r->reference_1t_fraction = r->pass_1t_GBps / r->reference_1t_GBps;
  }

  /* BF16 read directly: the bytes as stored (half of f32's) over the f32 reference. */
  progress("%s: one pass over W as BF16\n", tag);
  {
    for (size_t i = 0; i < n; i++) {
      uint32_t bits;
      memcpy(&bits, &w[i], sizeof bits);
      wb[i] = (uint16_t)(bits >> 16);
    }
    r->pass_bf16_s = time_bf16_pass(o, wb, rows, cols, o->repeats);
    r->pass_bf16_GBps = (double)n * sizeof *wb / r->pass_bf16_s * 1e-9;
    r->bf16_reference_fraction = r->pass_bf16_GBps / r->reference_GBps;
  }

  /* Cold estimates: v all zeros, best of cold_repeats within a 5 s budget per method. */
  progress("%s: cold power\n", tag);
  if ((st = run_sigma(ws_power, w, rows, cols, v_power, NULL, o->cold_repeats, 5.0,
                      &r->cold_power)) != STAB_OK) {
    report_stab_error("stab_spectral_norm (cold power)", st);
    goto out;
  }
  progress("%s: cold power %.4f s, %d passes%s\n", tag, r->cold_power.seconds, r->cold_power.passes,
           r->cold_power.converged ? "" : " (not converged)");
  progress("%s: cold lanczos\n", tag);
  if ((st = run_sigma(ws_krylov, w, rows, cols, v_krylov, NULL, o->cold_repeats, 5.0,
                      &r->cold_krylov)) != STAB_OK) {
    report_stab_error("stab_spectral_norm (cold lanczos)", st);
    goto out;
  }
  progress("%s: cold lanczos %.4f s, %d passes%s\n", tag, r->cold_krylov.seconds,
           r->cold_krylov.passes, r->cold_krylov.converged ? "" : " (not converged)");

  /* Warm: W + dW with ||dW||_F = update * ||W||_F, each method from its own cold vector
   * (what a monitor configured with that method would hold from the step before). */
  progress("%s: warm update %.0e\n", tag, o->update);
  synth_seed(&rng, seed_for(o->seed, sh, 1));
  synth_gaussian(w2, n, 1.0, &rng);
  double scale = o->update * frobenius(w, n) / frobenius(w2, n);
  for (size_t i = 0; i < n; i++)
    w2[i] = (float)(w[i] + scale * w2[i]);
  if ((st = run_sigma(ws_krylov, w2, rows, cols, v, v_krylov, o->cold_repeats, 5.0,
                      &r->warm_krylov)) != STAB_OK) {
    report_stab_error("stab_spectral_norm (warm lanczos)", st);
    goto out;
  }
  if ((st = run_sigma(ws_power, w2, rows, cols, v, v_power, o->cold_repeats, 5.0,
                      &r->warm_power)) != STAB_OK) {
    report_stab_error("stab_spectral_norm (warm power)", st);
    goto out;
  }
  progress("%s: warm lanczos %d passes, warm power %d passes\n", tag, r->warm_krylov.passes,
           r->warm_power.passes);

  /* Beside a busy machine: the cold and warm Lanczos estimates idle, then with every CPU kept
   * busy, by loops and by a child's OpenBLAS sgemm; before LAPACK, whose threads would stay. */
  if (o->loaded) {
    progress("%s: loaded slowdown (a spinning child per CPU, then OpenBLAS sgemm)\n", tag);
    if (bench_loaded_slowdown(ws_krylov, w, w2, rows, cols, v_krylov, v, o->cold_repeats, LOAD_SPIN,
                              &r->load_spin) ||
        bench_loaded_slowdown(ws_krylov, w, w2, rows, cols, v_krylov, v, o->cold_repeats, LOAD_BLAS,
                              &r->load_blas))
      goto out;
    r->loaded_ok = 1;
    progress("%s: loaded/idle cold %.2fx warm %.2fx (spin), cold %.2fx warm %.2fx (OpenBLAS)\n", tag,
             r->load_spin.loaded_cold_s / r->load_spin.idle_cold_s,
             r->load_spin.loaded_warm_s / r->load_spin.idle_warm_s,
             r->load_blas.loaded_cold_s / r->load_blas.idle_cold_s,
             r->load_blas.loaded_warm_s / r->load_blas.idle_warm_s);
  }

  /* LAPACK last: its threads would otherwise compete with the timed passes above. */
  if (o->lapack) {
    progress("%s: sgesvd%s ...\n", tag, o->exact_f64 ? " and dgesvd" : "");
    if (reference_sigma(o, w, rows, cols, fcopy, dcopy, &r->sigma_lapack, &r->lapack_s,
                        &r->sigma_f64, &r->dgesvd_s))
      goto out;
    progress("%s: sgesvd %.3f s\n", tag, r->lapack_s);
    double ref = o->exact_f64 ? r->sigma_f64 : r->sigma_lapack;
    r->cold_power.rel_err = rel_diff(r->cold_power.sigma, ref);
    r->cold_krylov.rel_err = rel_diff(r->cold_krylov.sigma, ref);
    r->speedup = r->lapack_s / r->cold_krylov.seconds;
    if (o->exact_f64) {
      double sig = NAN;
      progress("%s: power iteration (oracle stop)\n", tag);
      r->power_oracle_iterations = power_oracle(w, rows, cols, ref, o->tol, 100000,
                                                seed_for(o->seed, sh, 2), &sig, &r->power_oracle_s);
      let_blas_idle();
      if (arpack_available()) {
        arpack_ladder(o, w, rows, cols, ref, tag, r);
        arpack_own_rule(o, w, rows, cols, ref, tag, r);
        let_blas_idle();
      }
    }
  }
  if (o->exact_warm) {
    double s32 = NAN, s64 = NAN, t32, t64;
    progress("%s: sgesvd of W + dW%s ...\n", tag, o->exact_f64 ? " and dgesvd" : "");
    if (reference_sigma(o, w2, rows, cols, fcopy, dcopy, &s32, &t32, &s64, &t64))
      goto out;
    double ref = o->exact_f64 ? s64 : s32;
    r->warm_krylov.rel_err = rel_diff(r->warm_krylov.sigma, ref);
    r->warm_power.rel_err = rel_diff(r->warm_power.sigma, ref);
    r->warm_err_actual = 1;
  }
  if (o->lapack || o->exact_warm)
    let_blas_idle();
  rc = 0;

out:
  if (rc)
    r->ok = 0;
  stab_spectral_workspace_free(ws_power);
  stab_spectral_workspace_free(ws_krylov);
  stab_spectral_workspace_free(ws_one);
  stab_spectral_workspace_free(ws_one_1t);
  free(pass_times);
  free(xf);
  free(yf);
  free(wb);
  free(v_krylov);
  free(v_power);
  free(v_warm);
  free(v);
  free(dcopy);
  free(fcopy);
  free(w2);
  free(w);
  return rc;
}

/* ---------------------------------------------------------------------------------- */
/* Targets                                                                             */

typedef struct {
  double speedup;          /* cold Lanczos vs sgesvd at 4096x4096; NaN if not measured */
  double fraction;         /* min pass/stream over the big matrices (or the largest one) */
  const size_result *fraction_from; /* the size the fraction is from */
  int fraction_big;        /* 1 if it is over matrices >= 64 MiB */
  int warm;                /* max Lanczos warm passes over the sizes; -1 if none */
  /* the same sizes as fraction: min pass/reference over them, f32 and BF16 */
  double ref_fraction, bf16_ref_fraction;
  double loaded;           /* worst loaded/idle ratio (cold or warm, either load); NaN if none */
  const size_result *loaded_from;
  double arpack[3];        /* speedup_vs_arpack at arpack_target_sizes; NaN if not measured */
  double spiked_vs_power;  /* power_oracle_s / cold_krylov_s, worst spiked size; NaN if none */
} targets;

static targets compute_targets(const size_result *res, size_t n)
{
  targets t = {NAN, NAN, NULL, 0, -1, NAN, NAN, NAN, NULL, {NAN, NAN, NAN}, NAN};
  const size_result *largest = NULL;
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    if (!r->ok)
      continue;
    char name[48];
    shape_name(name, sizeof name, r->rows, r->cols, r->spiked);
    if (!strcmp(name, "4096x4096") && isfinite(r->speedup))
      t.speedup = r->speedup;
    for (int k = 0; k < 3; k++)
      if (!strcmp(name, arpack_target_sizes[k]))
        t.arpack[k] = r->speedup_vs_arpack;
    double vs = r->power_oracle_s / r->cold_krylov.seconds;
    if (r->spiked && isfinite(vs) && !(vs >= t.spiked_vs_power))
      t.spiked_vs_power = vs;
    double bytes = (double)r->rows * r->cols * sizeof(float);
    if (bytes >= BIG_MATRIX_BYTES && isfinite(r->fraction) &&
        (!t.fraction_big || r->fraction < t.fraction)) {
      t.fraction = r->fraction;
      t.fraction_from = r;
      t.fraction_big = 1;
    }
    if (!largest || bytes > (double)largest->rows * largest->cols * sizeof(float))
      largest = r;
    if (r->warm_krylov.passes > t.warm)
      t.warm = r->warm_krylov.passes;
    if (r->loaded_ok) {
      const load_result *l[2] = {&r->load_spin, &r->load_blas};
      for (int k = 0; k < 2; k++) {
        double worst = fmax(l[k]->loaded_cold_s / l[k]->idle_cold_s, l[k]->loaded_warm_s / l[k]->idle_warm_s);
        if (!(worst <= t.loaded)) { /* also the first (NaN) */
          t.loaded = worst;
          t.loaded_from = r;
        }
      }
    }
  }
  if (!t.fraction_big && largest) {
    t.fraction = largest->fraction;
    t.fraction_from = largest;
  }
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    double bytes = (double)r->rows * r->cols * sizeof(float);
    if (!r->ok || (t.fraction_big ? bytes < BIG_MATRIX_BYTES : r != largest))
      continue;
    t.ref_fraction = fmin(t.ref_fraction, r->reference_fraction);       /* fmin: NaN loses */
    t.bf16_ref_fraction = fmin(t.bf16_ref_fraction, r->bf16_reference_fraction);
  }
  return t;
}

static const char *pass_fail(int measured, int pass)
{
  return !measured ? "SKIP" : pass ? "PASS" : "FAIL";
}

/* ---------------------------------------------------------------------------------- */
/* Output                                                                              */

/* x with printf format fmt, or "-" when x is not finite. */
static const char *fmt_num(char *buf, size_t len, const char *fmt, double x)
{
  if (isfinite(x))
    snprintf(buf, len, fmt, x);
  else
    snprintf(buf, len, "-");
  return buf;
}

/* "seconds (passes)", with '*' after the passes of an estimate that did not converge. */
static const char *fmt_run(char *buf, size_t len, const sigma_run *r)
{
  if (r->passes < 0)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.5f (%4d)%s", r->seconds, r->passes, r->converged ? " " : "*");
  return buf;
}

static const char *fmt_warm(char *buf, size_t len, const size_result *r)
{
  if (r->warm_krylov.passes < 0)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%d%s/%d%s", r->warm_krylov.passes, r->warm_krylov.converged ? "" : "*",
             r->warm_power.passes, r->warm_power.converged ? "" : "*");
  return buf;
}

/* The loaded_slowdown table and its target line. */
static void print_loaded(const size_result *res, size_t n, const targets *t)
{
  int any = 0;
  for (size_t i = 0; i < n; i++)
    any |= res[i].loaded_ok;
  if (any) {
    printf("\nbeside a busy machine (best of the repeats each; load = 1-minute average while loaded)\n");
    printf("%-11s %9s %9s %8s %8s %8s %8s %6s\n", "size", "idle s", "loaded s", "cold", "warm", "blas c",
           "blas w", "load");
    for (size_t i = 0; i < n; i++) {
      const size_result *r = &res[i];
      if (!r->loaded_ok)
        continue;
      char s[32];
      snprintf(s, sizeof s, "%zux%zu", r->rows, r->cols);
      printf("%-11s %9.4f %9.4f %7.2fx %7.2fx %7.2fx %7.2fx %6.2f\n", s, r->load_spin.idle_cold_s,
             r->load_spin.loaded_cold_s, r->load_spin.loaded_cold_s / r->load_spin.idle_cold_s,
             r->load_spin.loaded_warm_s / r->load_spin.idle_warm_s,
             r->load_blas.loaded_cold_s / r->load_blas.idle_cold_s,
             r->load_blas.loaded_warm_s / r->load_blas.idle_warm_s, r->load_spin.load_after);
    }
    printf("  cold/warm: loaded / idle with a spinning loop on each of the %d online CPUs; blas: beside\n"
           "  one process doing sgemm on as many OpenBLAS threads.\n", res[0].load_spin.cpus);
  }
  if (t->loaded_from)
    printf("target loaded cold and warm <= %.1fx idle: worst %.2fx (at %zux%zu) %s\n", TARGET_LOADED_SLOWDOWN,
           t->loaded, t->loaded_from->rows, t->loaded_from->cols,
           pass_fail(1, t->loaded <= TARGET_LOADED_SLOWDOWN));
  else
    printf("target loaded cold and warm <= %.1fx idle: n/a SKIP\n", TARGET_LOADED_SLOWDOWN);
}

static void print_human(const options *o, const size_result *res, size_t n, const targets *t,
                        int stream_threads)
{
  char a[64], b[64], c[64], d[64], e[64], f[64], g[64], h[64], s[32];
  printf("stabmeter %s bench: kernel %s, tol %.0e, max passes %d, threads %d (stream read %d), "
         "seed %llu, update %.0e\n",
         stab_version(), stab_spectral_kernel(), o->tol, o->max_passes, o->threads, stream_threads,
         (unsigned long long)o->seed, o->update);
  if (isfinite(o->load_start))
    printf("load average %.2f at the start, %.2f at the end\n", o->load_start, o->load_end);
  printf("\n");
  printf("%-11s %20s %20s %9s %8s %11s %9s %8s %9s\n", "size", "cold power s (pass)",
         "cold krylov s (pass)", "sgesvd s", "speedup", "stream GB/s", "pass GB/s", "fraction",
         "warm L/P");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    snprintf(s, sizeof s, "%zux%zu", r->rows, r->cols);
    printf("%-11s %20s %20s %9s %8s %11s %9s %8s %9s%s\n", s, fmt_run(a, sizeof a, &r->cold_power),
           fmt_run(b, sizeof b, &r->cold_krylov), fmt_num(c, sizeof c, "%.3f", r->lapack_s),
           fmt_num(d, sizeof d, "%.1fx", r->speedup), fmt_num(e, sizeof e, "%.2f", r->stream_GBps),
           fmt_num(f, sizeof f, "%.2f", r->pass_GBps), fmt_num(g, sizeof g, "%.3f", r->fraction),
           fmt_warm(h, sizeof h, r), r->ok ? "" : "  (failed)");
  }
  printf("  * not converged within max passes. pass GB/s: best of the one-pass calls warm-started "
         "from a fixed vector,\n  one pass of two vectors (median in --json; a cold start's first "
         "pass, four vectors, is pass_cold_GBps).\n  warm L/P: Lanczos/power passes on W + dW.\n\n");

  printf("%-11s %9s %9s %9s %9s %8s %9s %9s %8s %9s %8s\n", "size", "wide GB/s", "sgemv",
         "reference", "pass", "of ref", "1t pass", "1t ref", "of ref", "bf16 pass", "of ref");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    char k[32], l[32];
    snprintf(s, sizeof s, "%zux%zu", r->rows, r->cols);
    printf("%-11s %9s %9s %9s %9s %8s %9s %9s %8s %9s %8s\n", s,
           fmt_num(a, sizeof a, "%.2f", r->wide_GBps), fmt_num(b, sizeof b, "%.2f", r->sgemv_GBps),
           fmt_num(c, sizeof c, "%.2f", r->reference_GBps), fmt_num(d, sizeof d, "%.2f", r->pass_GBps),
           fmt_num(e, sizeof e, "%.3f", r->reference_fraction),
           fmt_num(f, sizeof f, "%.2f", r->pass_1t_GBps), fmt_num(g, sizeof g, "%.2f", r->reference_1t_GBps),
           fmt_num(h, sizeof h, "%.3f", r->reference_1t_fraction),
           fmt_num(k, sizeof k, "%.2f", r->pass_bf16_GBps),
           fmt_num(l, sizeof l, "%.3f", r->bf16_reference_fraction));
  }
  printf("  reference: the faster of a %s read loop (%d threads) and OpenBLAS sgemv of the same "
         "bytes, best of each; 1t: one thread\n  each side; bf16: the same matrix stored as BF16, "
         "its bytes as stored, against the f32 reference\n  (through stab_layer_metrics, which starts cold: "
         "passes of four vectors, the difference of 6 and 2).\n\n",
         stream_read_wide_name(), stream_threads);

  const char *ref = o->exact_f64 ? "dgesvd" : "sgesvd";
  printf("%-11s %14s %12s %11s %12s %11s %24s\n", "size", o->exact_f64 ? "sigma dgesvd" : "sigma sgesvd",
         "err krylov", "(estimate)", "err power", "(estimate)", "warm err krylov / power");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    snprintf(s, sizeof s, "%zux%zu", r->rows, r->cols);
    double sig = o->exact_f64 ? r->sigma_f64 : r->sigma_lapack;
    char w1[32], w2[32], wb[80];
    snprintf(wb, sizeof wb, "%s / %s %s",
             fmt_num(w1, sizeof w1, "%.1e", r->warm_err_actual ? r->warm_krylov.rel_err
                                                               : r->warm_krylov.est_rel_err),
             fmt_num(w2, sizeof w2, "%.1e", r->warm_err_actual ? r->warm_power.rel_err
                                                               : r->warm_power.est_rel_err),
             r->warm_err_actual ? "(actual)" : "(est.)");
    printf("%-11s %14s %12s %11s %12s %11s %24s\n", s, fmt_num(a, sizeof a, "%.8f", sig),
           fmt_num(b, sizeof b, "%.2e", r->cold_krylov.rel_err),
           fmt_num(c, sizeof c, "(%.2e)", r->cold_krylov.est_rel_err),
           fmt_num(d, sizeof d, "%.2e", r->cold_power.rel_err),
           fmt_num(e, sizeof e, "(%.2e)", r->cold_power.est_rel_err), wb);
  }
  printf("  err: |sigma - %s| / %s (the estimate is the library's own); warm errors are actual "
         "only with --exact-warm.\n\n",
         ref, ref);

  /* The three targets, each from this run. */
  if (isfinite(t->speedup))
    printf("target cold 4096x4096 >= %.0fx faster than sgesvd: %.1fx %s\n", TARGET_SPEEDUP,
           t->speedup, pass_fail(1, t->speedup >= TARGET_SPEEDUP));
  else
    printf("target cold 4096x4096 >= %.0fx faster than sgesvd: n/a (%s) SKIP\n", TARGET_SPEEDUP,
           o->lapack ? "4096x4096 not measured" : "--no-lapack");
  if (t->fraction_from) {
    char where[96];
    if (t->fraction_big)
      snprintf(where, sizeof where, "min over sizes >= 64 MiB, at %zux%zu", t->fraction_from->rows,
               t->fraction_from->cols);
    else
      snprintf(where, sizeof where, "no size >= 64 MiB; largest, %zux%zu, may sit in cache",
               t->fraction_from->rows, t->fraction_from->cols);
    printf("target one pass >= %.0f%% of the reference read: %.1f%% (%s) %s\n",
           TARGET_REFERENCE_FRACTION * 100, t->ref_fraction * 100, where,
           pass_fail(isfinite(t->ref_fraction), t->ref_fraction >= TARGET_REFERENCE_FRACTION));
    printf("target one pass over BF16 >= %.0f%% of the reference read: %.1f%% (%s) %s\n",
           TARGET_REFERENCE_FRACTION * 100, t->bf16_ref_fraction * 100, where,
           pass_fail(isfinite(t->bf16_ref_fraction), t->bf16_ref_fraction >= TARGET_REFERENCE_FRACTION));
  } else {
    printf("target one pass >= %.0f%% of the reference read: n/a SKIP\n",
           TARGET_REFERENCE_FRACTION * 100);
  }
  if (t->warm >= 0)
    printf("target warm <= %d passes: %d %s\n", TARGET_WARM_PASSES, t->warm,
           pass_fail(1, t->warm <= TARGET_WARM_PASSES));
  else
    printf("target warm <= %d passes: n/a SKIP\n", TARGET_WARM_PASSES);
  print_loaded(res, n, t);
  for (int k = 0; k < 3; k++)
    if (isfinite(t->arpack[k]))
      printf("target cold %s >= %.0fx faster than ARPACK at equal or better error: %.2fx %s\n",
             arpack_target_sizes[k], TARGET_ARPACK, t->arpack[k], pass_fail(1, t->arpack[k] >= TARGET_ARPACK));
    else
      printf("target cold %s >= %.0fx faster than ARPACK at equal or better error: n/a (%s) SKIP\n",
             arpack_target_sizes[k], TARGET_ARPACK,
             !arpack_available() ? "built without ARPACK (libarpack2-dev)" : !o->lapack ? "--no-lapack"
                                                                         : "not measured");
  if (isfinite(t->spiked_vs_power))
    printf("target spiked: no slower than the oracle power iteration: %.2fx %s\n", t->spiked_vs_power,
           pass_fail(1, t->spiked_vs_power >= 1.0));
  else
    printf("target spiked: no slower than the oracle power iteration: n/a (no ROWSxCOLS:spiked size) SKIP\n");
  printf("  ARPACK: dsaupd on the smaller Gram matrix, sgemv products (2 reads each), at the loosest\n"
         "  of the ladder 1e-1, 3e-2, ... whose actual error <= tol; the library at tol or the\n"
         "  loosest tol/3, tol/10, ... whose actual error <= ARPACK's. Errors against dgesvd.\n");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    char nm[48];
    if (isfinite(r->arpack_s) || r->power_oracle_iterations >= 0)
      printf("  %-16s arpack %s s (tol %.0e, %d reads, err %.2e); lanczos %s s (tol %.1e, %d passes, "
             "err %.2e): %.2fx; power (oracle) %s s, %d iterations\n",
             shape_name(nm, sizeof nm, r->rows, r->cols, r->spiked), fmt_num(a, sizeof a, "%.4f", r->arpack_s),
             r->arpack_tol, r->arpack_reads, r->arpack_rel_err, fmt_num(b, sizeof b, "%.4f", r->krylov_equal_s),
             r->krylov_equal_tol, r->krylov_equal_passes, r->krylov_equal_rel_err, r->speedup_vs_arpack,
             fmt_num(c, sizeof c, "%.4f", r->power_oracle_s), r->power_oracle_iterations);
  }
  /* Not a target of its own: the comparison without an oracle, both sides on their own rule */
  int own = 0;
  for (size_t i = 0; i < n; i++)
    own = own || isfinite(res[i].arpack_own_s);
  if (!own)
    return;
  printf("  Without an oracle, each stopped by its own rule at the same residual bound (ARPACK at\n"
         "  tol %.0e, its residual <= tol sigma^2, is the library's r / (2 sigma^2) <= %.0e):\n",
         2.0 * o->tol, o->tol);
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    char nm[48];
    if (isfinite(r->arpack_own_s))
      printf("  %-16s arpack %.4f s (%d reads, err %.2e); lanczos %s s (%d passes, err %.2e): %.2fx\n",
             shape_name(nm, sizeof nm, r->rows, r->cols, r->spiked), r->arpack_own_s, r->arpack_own_reads,
             r->arpack_own_rel_err, fmt_num(b, sizeof b, "%.4f", r->cold_krylov.seconds), r->cold_krylov.passes,
             r->cold_krylov.rel_err, r->speedup_vs_arpack_own);
  }
}

/* A JSON number, or null when x is not finite. */
static void json_num(const char *key, double x, int comma)
{
  if (isfinite(x))
    printf("\"%s\": %.9g", key, x);
  else
    printf("\"%s\": null", key);
  if (comma)
    printf(", ");
}

static void json_int(const char *key, int x, int comma)
{
  if (x >= 0)
    printf("\"%s\": %d", key, x);
  else
    printf("\"%s\": null", key);
  if (comma)
    printf(", ");
}

static void json_bool(const char *key, int x, int comma)
{
  printf("\"%s\": %s%s", key, x ? "true" : "false", comma ? ", " : "");
}

/* One target: "name": {"value": x, "min" or "max": bound, extra, "pass": met}, then ", ";
 * met is null when the value was not measured (NaN). extra: more members with their trailing
 * ", ", or NULL. */
static void json_target(const char *name, double value, int is_max, double bound, const char *extra)
{
  printf("\"%s\": {", name);
  json_num("value", value, 1);
  json_num(is_max ? "max" : "min", bound, 1);
  if (extra)
    fputs(extra, stdout);
  int met = is_max ? value <= bound : value >= bound;
  printf("\"pass\": %s}, ", isfinite(value) ? (met ? "true" : "false") : "null");
}

static void print_json(const options *o, const size_result *res, size_t n, const targets *t,
                       int stream_threads)
{
  /* The run's streaming-read bandwidth is that of its largest matrix: the one least
   * helped by the caches. */
  const size_result *largest = NULL;
  for (size_t i = 0; i < n; i++)
    if (res[i].ok && (!largest || res[i].rows * res[i].cols > largest->rows * largest->cols))
      largest = &res[i];

  printf("{\"format\": \"stabmeter-bench\", \"format_version\": 1, \"library_version\": \"%s\", "
         "\"kernel\": \"%s\", ", stab_version(), stab_spectral_kernel());
  json_num("tol", o->tol, 1);
  json_int("max_passes", o->max_passes, 1);
  printf("\"seed\": %llu, ", (unsigned long long)o->seed);
  json_num("update", o->update, 1);
  json_num("stream_read_GBps", largest ? largest->stream_GBps : NAN, 1);
  if (largest)
    printf("\"stream_read_size\": [%zu, %zu], ", largest->rows, largest->cols);
  json_int("threads", stream_threads, 1);
  json_int("params_threads", o->threads, 1);
  json_num("load_average_start", o->load_start, 1);
  json_num("load_average_end", o->load_end, 1);
  printf("\"reference\": %s, ", !o->lapack ? "null" : o->exact_f64 ? "\"dgesvd\"" : "\"sgesvd\"");
  printf("\"sizes\": [");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    printf("%s\n  {\"rows\": %zu, \"cols\": %zu, ", i ? "," : "", r->rows, r->cols);
    json_bool("ok", r->ok, 1);
    json_num("cold_power_s", r->cold_power.seconds, 1);
    json_int("cold_power_passes", r->cold_power.passes, 1);
    json_bool("cold_power_converged", r->cold_power.converged, 1);
    json_num("cold_krylov_s", r->cold_krylov.seconds, 1);
    json_int("cold_krylov_passes", r->cold_krylov.passes, 1);
    json_bool("cold_krylov_converged", r->cold_krylov.converged, 1);
    json_num("lapack_s", r->lapack_s, 1);
    json_num("dgesvd_s", r->dgesvd_s, 1);
    json_num("speedup_vs_lapack", r->speedup, 1);
    json_num("stream_GBps", r->stream_GBps, 1);
    json_num("pass_s", r->pass_s, 1);
    json_int("pass_passes", r->pass_passes, 1);
    json_num("pass_GBps", r->pass_GBps, 1);
    json_num("pass_GBps_median", r->pass_median_GBps, 1);
    json_num("pass_cold_GBps", r->pass_cold_GBps, 1);
    json_num("pass_bandwidth_fraction", r->fraction, 1);
    json_num("reference_read_GBps", r->reference_GBps, 1);
    json_num("wide_read_GBps", r->wide_GBps, 1);
    json_num("sgemv_GBps", r->sgemv_GBps, 1);
    json_num("pass_reference_fraction", r->reference_fraction, 1);
    json_num("pass_1t_GBps", r->pass_1t_GBps, 1);
    json_num("reference_read_1t_GBps", r->reference_1t_GBps, 1);
    json_num("wide_read_1t_GBps", r->wide_1t_GBps, 1);
    json_num("sgemv_1t_GBps", r->sgemv_1t_GBps, 1);
    json_num("pass_1t_reference_fraction", r->reference_1t_fraction, 1);
    json_num("pass_bf16_s", r->pass_bf16_s, 1);
    json_num("pass_bf16_GBps", r->pass_bf16_GBps, 1);
    json_num("pass_bf16_reference_fraction", r->bf16_reference_fraction, 1);
    json_int("warm_passes", r->warm_krylov.passes, 1);
    json_bool("warm_converged", r->warm_krylov.converged, 1);
    json_int("warm_passes_power", r->warm_power.passes, 1);
    json_bool("warm_power_converged", r->warm_power.converged, 1);
    json_num("warm_krylov_s", r->warm_krylov.seconds, 1);
    json_num("warm_power_s", r->warm_power.seconds, 1);
    json_num("sigma_lapack", r->sigma_lapack, 1);
    json_num("sigma_f64", r->sigma_f64, 1);
    json_num("sigma_krylov", r->cold_krylov.sigma, 1);
    json_num("sigma_power", r->cold_power.sigma, 1);
    json_num("rel_err_krylov", r->cold_krylov.rel_err, 1);
    json_num("rel_err_power", r->cold_power.rel_err, 1);
    json_num("est_rel_err_krylov", r->cold_krylov.est_rel_err, 1);
    json_num("est_rel_err_power", r->cold_power.est_rel_err, 1);
    /* Warm errors: actual against an SVD of W + dW with --exact-warm, else the estimates. */
    json_num("warm_rel_err_krylov",
             r->warm_err_actual ? r->warm_krylov.rel_err : r->warm_krylov.est_rel_err, 1);
    json_num("warm_rel_err_power",
             r->warm_err_actual ? r->warm_power.rel_err : r->warm_power.est_rel_err, 1);
    json_bool("warm_rel_err_actual", r->warm_err_actual, 1);
    /* loaded / idle, best of the repeats each: beside spinning loops, and beside OpenBLAS */
    json_num("loaded_slowdown", r->loaded_ok ? r->load_spin.loaded_cold_s / r->load_spin.idle_cold_s : NAN, 1);
    json_num("loaded_slowdown_warm", r->loaded_ok ? r->load_spin.loaded_warm_s / r->load_spin.idle_warm_s : NAN, 1);
    json_num("loaded_slowdown_blas", r->loaded_ok ? r->load_blas.loaded_cold_s / r->load_blas.idle_cold_s : NAN, 1);
    json_num("loaded_slowdown_blas_warm",
             r->loaded_ok ? r->load_blas.loaded_warm_s / r->load_blas.idle_warm_s : NAN, 1);
    json_num("loaded_idle_cold_s", r->loaded_ok ? r->load_spin.idle_cold_s : NAN, 1);
    json_num("loaded_cold_s", r->loaded_ok ? r->load_spin.loaded_cold_s : NAN, 1);
    json_num("loaded_idle_warm_s", r->loaded_ok ? r->load_spin.idle_warm_s : NAN, 1);
    json_num("loaded_warm_s", r->loaded_ok ? r->load_spin.loaded_warm_s : NAN, 1);
    json_num("loaded_load_average", r->loaded_ok ? r->load_spin.load_after : NAN, 1);
    json_bool("spiked", r->spiked, 1);
    json_num("arpack_s", r->arpack_s, 1);
    json_num("arpack_rel_err", r->arpack_rel_err, 1);
    json_num("arpack_tol", r->arpack_tol, 1);
    json_int("arpack_reads", r->arpack_reads, 1);
    json_num("speedup_vs_arpack", r->speedup_vs_arpack, 1);
    json_num("arpack_own_rule_s", r->arpack_own_s, 1);
    json_num("arpack_own_rule_tol", r->arpack_own_tol, 1);
    json_int("arpack_own_rule_reads", r->arpack_own_reads, 1);
    json_num("arpack_own_rule_rel_err", r->arpack_own_rel_err, 1);
    json_num("speedup_vs_arpack_own_rule", r->speedup_vs_arpack_own, 1);
    json_num("krylov_tol_for_equal_error", r->krylov_equal_tol, 1);
    json_num("krylov_equal_error_s", r->krylov_equal_s, 1);
    json_int("krylov_equal_error_passes", r->krylov_equal_passes, 1);
    json_num("krylov_equal_error_rel_err", r->krylov_equal_rel_err, 1);
    json_num("power_oracle_s", r->power_oracle_s, 1);
    json_int("power_oracle_iterations", r->power_oracle_iterations, 0);
    printf("}");
  }
  printf("\n ],\n \"targets\": {");
  json_target("cold_4096_speedup", t->speedup, 0, TARGET_SPEEDUP, NULL);
  char extra[128];
  int e = 0;
  if (t->fraction_from)
    e = snprintf(extra, sizeof extra, "\"size\": [%zu, %zu], ", t->fraction_from->rows, t->fraction_from->cols);
  snprintf(extra + e, sizeof extra - (size_t)e, "\"over_big_matrices\": %s, ", t->fraction_big ? "true" : "false");
  json_target("pass_bandwidth_fraction", t->fraction, 0, TARGET_FRACTION, extra);
  json_target("pass_reference_fraction", t->ref_fraction, 0, TARGET_REFERENCE_FRACTION, NULL);
  json_target("pass_bf16_reference_fraction", t->bf16_ref_fraction, 0, TARGET_REFERENCE_FRACTION, NULL);
  json_target("warm_passes", t->warm >= 0 ? t->warm : NAN, 1, TARGET_WARM_PASSES, NULL);
  json_target("loaded_slowdown", t->loaded_from ? t->loaded : NAN, 1, TARGET_LOADED_SLOWDOWN, NULL);
  printf("\"arpack_available\": %s, ", arpack_available() ? "true" : "false");
  for (int k = 0; k < 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "cold_vs_arpack_%s", arpack_target_sizes[k]);
    json_target(name, t->arpack[k], 0, TARGET_ARPACK, NULL);
  }
  printf("\"spiked_vs_power_oracle\": {");
  json_num("value", t->spiked_vs_power, 1);
  json_num("min", 1.0, 1);
  printf("\"pass\": %s}}}\n", isfinite(t->spiked_vs_power) ? (t->spiked_vs_power >= 1.0 ? "true" : "false") : "null");
}

/* ---------------------------------------------------------------------------------- */
/* Command line                                                                        */

static void usage(void)
{
  printf("Usage: %s [OPTION]...\n"
         "Times stabmeter's spectral norm of seeded Gaussian f32 matrices (std 1/sqrt(cols)):\n"
         "cold Lanczos and power iteration against LAPACK sgesvd, the bandwidth of one pass\n"
         "(f32, and BF16 read as stored; with the given threads and with one) against the\n"
         "reference read (the faster of a wide-vector read loop and OpenBLAS sgemv of the same\n"
         "bytes) and a plain streaming read, and the passes of a warm start after an update.\n"
         "Results on stdout, progress on stderr.\n"
         "\n"
         "Options:\n"
         "  -s, --sizes LIST      comma-separated ROWSxCOLS, each side in 1..65536; a size\n"
         "                        ending in :spiked is a Gaussian plus a rank-one spike,\n"
         "                        s2/s1 = 0.836 (default %s)\n"
         "  -q, --quick           the small list %s\n"
         "  -t, --threads N       threads of a pass and of the streaming read, 0..4096 (default\n"
         "                        0: the CPUs this process may run on)\n"
         "      --tol X           target relative error of sigma, in (0, 0.5) (default 1e-3)\n"
         "      --max-passes N    pass limit of the cold and warm estimates (default 1000)\n"
         "      --repeats N       timings of one pass and of the stream read: best of N (default\n"
         "                        10, 5 with --quick; small matrices get more, up to 1000, so\n"
         "                        that each timing reads 1 GiB)\n"
         "      --cold-repeats N  cold and warm estimates: best of N, within 5 s each (default 3)\n"
         "      --seed N          seed of the matrices (default 1)\n"
         "      --update X        ||dW||_F / ||W||_F of the warm-start update, in (0, 1)\n"
         "                        (default 1e-3)\n"
         "      --no-lapack       skip sgesvd (no speedup, no actual errors)\n"
         "      --exact-f64       also dgesvd on an f64 copy, and use it as the reference\n"
         "                        (always when built with ARPACK: its ladder, the oracle power\n"
         "                        iteration and the equal-error comparison need it)\n"
         "      --exact-warm      also the SVD of W + dW, for the actual warm errors\n"
         "      --no-load         skip loaded_slowdown (the cold and warm estimates timed again\n"
         "                        beside a spinning child per CPU, and beside OpenBLAS sgemm)\n"
         "      --accuracy N      instead: N matrices in five families (Gaussian, spiked,\n"
         "                        low-rank + noise, near-equal top pair, wide and tall), how\n"
         "                        often the actual error (against dgesvd) exceeds the reported\n"
         "                        one and tol\n"
         "  -j, --json            one JSON object on stdout instead of the table\n"
         "  -h, --help            print this help and exit\n"
         "  -V, --version         print the version and exit\n"
         "\n"
         "Exit status:\n"
         "  0  everything ran (whatever the targets say)\n"
         "  1  something failed\n"
         "  2  bad usage\n",
         cli_name, default_sizes, quick_sizes);
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi)
    return -1;
  *out = x;
  return 0;
}

/* "512x512,768x3072" into a new array; -1 on a malformed list. */
static int parse_sizes(const char *list, shape **out, size_t *n)
{
  size_t cap = 1;
  for (const char *p = list; *p; p++)
    cap += *p == ',';
  shape *s = malloc(cap * sizeof *s);
  char *copy = strdup(list);
  size_t k = 0;
  int rc = -1;
  if (!s || !copy)
    goto out;
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *x = strpbrk(tok, "xX"), *kind = strchr(tok, ':');
    long rows, cols;
    if (!x)
      goto out;
    s[k].spiked = 0;
    if (kind) {
      if (strcmp(kind, ":spiked"))
        goto out;
      *kind = '\0';
      s[k].spiked = 1;
    }
    *x = '\0';
    /* 65536 keeps rows * cols * 8 (the f64 copy) far from overflow and LAPACK's int. */
    if (parse_long(tok, 1, 65536, &rows) || parse_long(x + 1, 1, 65536, &cols))
      goto out;
    s[k].rows = (size_t)rows;
    s[k].cols = (size_t)cols;
    k++;
  }
  if (k == 0)
    goto out;
  *out = s;
  *n = k;
  s = NULL;
  rc = 0;
out:
  free(s);
  free(copy);
  return rc;
}

/* --accuracy N: N matrices in families with different spectra, each method's sigma at the
 * default settings against dgesvd in f64 of the same f32 numbers: how often the actual error
 * exceeds the reported one (the claim the estimate makes) and tol, the worst ratio of the two,
 * the mean passes. The figures behind docs/lab/performance.md's "accuracy of the estimate". */
typedef enum { FAM_GAUSS, FAM_SPIKED, FAM_LOWRANK, FAM_NEAR_PAIR, FAM_WIDE_TALL, FAM_COUNT } family;
static const struct {
  const char *name, *what;
  int share; /* percent of the matrices */
} families[FAM_COUNT] = {
    {"gaussian", "Gaussian, random shapes 2..300 x 2..300", 30},
    {"spiked", "Gaussian + rank-one spike, s2/s1 in [0.5, 0.95], sides 40..600", 15},
    {"lowrank", "rank 1..16 (s_i = 0.7^i) + Gaussian noise 1e-2, sides 40..600", 15},
    {"near_pair", "U diag(s) V^T, s1/s2 in [1.0001, 1.01], s_i = s_2 (1 - 0.6 (i/k)^(2/3)), "
                  "2048x256 256x2048 512x512 1024x256 256x1024", 25},
    {"wide_tall", "Gaussian, 33..128 x 1000..3000 and transposed", 15},
};

/* A uniform integer in [lo, hi]. */
static size_t uniform_side(synth_rng *r, size_t lo, size_t hi)
{
  return lo + (size_t)(fabs(synth_normal(r)) * 1e6) % (hi - lo + 1);
}

static double uniform01(synth_rng *r)
{
  return (double)((size_t)(fabs(synth_normal(r)) * 1e9) % 1000000) / 1e6;
}

/* n x k (row-major) orthonormal columns: Q of the QR of a Gaussian, in f64. */
static int orthonormal(double *q, size_t n, size_t k, double *tau, synth_rng *r)
{
  for (size_t i = 0; i < n * k; i++)
    q[i] = synth_normal(r);
  return LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)k, q, (lapack_int)k, tau) ||
         LAPACKE_dorgqr(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)k, (lapack_int)k, q, (lapack_int)k, tau);
}

/* Fills a (rows x cols) with one matrix of family f; *rows, *cols chosen here. d, u, vt, tau:
 * scratch of MAX_ELEMS, MAX_SIDE^2 (twice) and MAX_SIDE doubles. Returns 0. */
enum { ACC_MAX_SIDE = 3000, ACC_MAX_ELEMS = 3000 * 128 > 2048 * 256 ? 3000 * 128 : 2048 * 256 };
static int accuracy_matrix(family f, synth_rng *rng, float *a, size_t *rows, size_t *cols, double *u,
                           double *vt, double *tau, double *d)
{
  size_t m, n;
  switch (f) {
  case FAM_GAUSS:
    m = uniform_side(rng, 2, 300);
    n = uniform_side(rng, 2, 300);
    synth_gaussian(a, m * n, 1.0, rng);
    break;
  case FAM_SPIKED: {
    m = uniform_side(rng, 40, 600);
    n = uniform_side(rng, 40, 600);
    synth_gaussian(a, m * n, 1.0 / sqrt((double)n), rng);
    double c = (double)m / (double)n, want = (1.0 + sqrt(c)) / (0.5 + 0.45 * uniform01(rng));
    double lo = pow(c, 0.25), hi = 100.0;
    for (int i = 0; i < 200; i++) {
      double th = 0.5 * (lo + hi);
      if (sqrt((1.0 + th * th) * (c + th * th)) / th < want) lo = th; else hi = th;
    }
    double nu = 0.0, nv = 0.0;
    for (size_t i = 0; i < m; i++) {
      u[i] = synth_normal(rng);
      nu += u[i] * u[i];
    }
    for (size_t j = 0; j < n; j++) {
      vt[j] = synth_normal(rng);
      nv += vt[j] * vt[j];
    }
    double k = 0.5 * (lo + hi) / sqrt(nu * nv);
    for (size_t i = 0; i < m; i++)
      for (size_t j = 0; j < n; j++)
        a[i * n + j] = (float)(a[i * n + j] + k * u[i] * vt[j]);
    break;
  }
  case FAM_LOWRANK: {
    m = uniform_side(rng, 40, 600);
    n = uniform_side(rng, 40, 600);
    size_t rank = uniform_side(rng, 1, 16);
    for (size_t i = 0; i < m * n; i++)
      d[i] = 1e-2 / sqrt((double)(m > n ? m : n)) * synth_normal(rng);
    for (size_t l = 0; l < rank; l++) {
      double nu = 0.0, nv = 0.0;
      for (size_t i = 0; i < m; i++) {
        u[i] = synth_normal(rng);
        nu += u[i] * u[i];
      }
      for (size_t j = 0; j < n; j++) {
        vt[j] = synth_normal(rng);
        nv += vt[j] * vt[j];
      }
      double k = pow(0.7, (double)l) / sqrt(nu * nv);
      for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
          d[i * n + j] += k * u[i] * vt[j];
    }
    for (size_t i = 0; i < m * n; i++)
      a[i] = (float)d[i];
    break;
  }
  case FAM_NEAR_PAIR: {
    static const size_t shapes[][2] = {{2048, 256}, {256, 2048}, {512, 512}, {1024, 256}, {256, 1024}};
    size_t pick = uniform_side(rng, 0, 4);
    m = shapes[pick][0];
    n = shapes[pick][1];
    size_t k = m < n ? m : n;
    double ratio = exp(log(1.0001) + uniform01(rng) * (log(1.01) - log(1.0001)));
    /* U (m x k) diag(s) V^T (k x n): u and vt hold U and V (n x k) */
    if (orthonormal(u, m, k, tau, rng) || orthonormal(vt, n, k, tau, rng))
      return -1;
    for (size_t l = 0; l < k; l++) {
      double sl = l == 0 ? ratio : 1.0 - 0.6 * pow((double)(l - 1) / (double)k, 2.0 / 3.0);
      for (size_t i = 0; i < m; i++)
        u[i * k + l] *= sl;
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0, u, (int)k, vt,
                (int)k, 0.0, d, (int)n);
    for (size_t i = 0; i < m * n; i++)
      a[i] = (float)d[i];
    break;
  }
  default: { /* FAM_WIDE_TALL */
    size_t narrow = uniform_side(rng, 33, 128), wide = uniform_side(rng, 1000, ACC_MAX_SIDE);
    int tall = uniform_side(rng, 0, 1);
    m = tall ? wide : narrow;
    n = tall ? narrow : wide;
    synth_gaussian(a, m * n, 1.0, rng);
    break;
  }
  }
  *rows = m;
  *cols = n;
  return 0;
}

static int accuracy_sweep(const options *o, long count)
{
  enum { NM = 2 }; /* lanczos, power (power on the gaussian family only: it takes thousands of
                      passes on near-equal pairs) */
  /* the estimate claims actual <= reported; exact answers (rel_err 0) differ from dgesvd by
   * rounding, which this slack absorbs */
  const double slack = 1e-12;
  struct { long n, above_reported, above_tol, passes; double worst_ratio, worst; } st[FAM_COUNT][NM];
  memset(st, 0, sizeof st);
  float *a = malloc((size_t)ACC_MAX_ELEMS * sizeof *a);
  double *d = malloc((size_t)ACC_MAX_ELEMS * sizeof *d);
  double *u = malloc((size_t)ACC_MAX_SIDE * 256 * sizeof *u), *vt = malloc((size_t)ACC_MAX_SIDE * 256 * sizeof *vt);
  double *tau = malloc((size_t)ACC_MAX_SIDE * sizeof *tau), ref = 0.0;
  int rc = 1;
  if (!a || !d || !u || !vt || !tau) {
    cli_error("out of memory");
    goto out;
  }
  synth_rng rng;
  synth_seed(&rng, o->seed);
  long k = 0;
  for (int f = 0; f < FAM_COUNT; f++) {
    long nf = count * families[f].share / 100;
    if (f == FAM_COUNT - 1) /* the remainder */
      nf = count - k;
    for (long j = 0; j < nf; j++, k++) {
      size_t rows, cols;
      if (accuracy_matrix((family)f, &rng, a, &rows, &cols, u, vt, tau, d)) {
        cli_error("matrix %ld: QR failed", k);
        goto out;
      }
      for (size_t i = 0; i < rows * cols; i++)
        d[i] = a[i];
      if (lapack_sigma('d', d, rows, cols, &ref) < 0) {
        cli_error("dgesvd failed on matrix %ld (%zu x %zu)", k, rows, cols);
        goto out;
      }
      for (int m = 0; m < (f == FAM_GAUSS ? NM : 1); m++) {
        stab_spectral_params p = stab_spectral_default_params();
        p.method = m == 0 ? STAB_SPECTRAL_LANCZOS : STAB_SPECTRAL_POWER;
        p.tol = o->tol;
        p.threads = o->threads;
        p.seed = (uint64_t)k;
        stab_sigma_result r;
        if (stab_sigma(a, rows, cols, cols, &p, NULL, &r) != STAB_OK) {
          cli_error("matrix %ld: %s", k, stab_last_error());
          goto out;
        }
        double err = ref > 0.0 ? fabs(ref - r.sigma) / ref : fabs(r.sigma);
        st[f][m].n++;
        st[f][m].passes += r.passes;
        if (err > r.rel_err + slack) {
          st[f][m].above_reported++;
          progress("%s: %s matrix %ld (%zu x %zu): actual %.3e above the reported %.3e (%d passes)\n",
                   cli_name, families[f].name, k, rows, cols, err, r.rel_err, r.passes);
        }
        if (err > o->tol)
          st[f][m].above_tol++;
        if (err > st[f][m].worst)
          st[f][m].worst = err;
        /* over the slack: an exact answer's rounding is not a ratio to report */
        if (err / fmax(r.rel_err, slack) > st[f][m].worst_ratio)
          st[f][m].worst_ratio = err / fmax(r.rel_err, slack);
      }
      if ((k + 1) % 100 == 0)
        progress("%s: accuracy %ld/%ld\n", cli_name, k + 1, count);
    }
  }
  long total_above = 0;
  for (int f = 0; f < FAM_COUNT; f++)
    total_above += st[f][0].above_reported;
  if (o->json) {
    printf("{\"format\": \"stabmeter-bench-accuracy\", \"format_version\": 2, \"matrices\": %ld, "
           "\"tol\": %g, \"seed\": %llu, \"kernel\": \"%s\", \"lanczos_above_reported\": %ld, "
           "\"families\": [",
           count, o->tol, (unsigned long long)o->seed, stab_spectral_kernel(), total_above);
    int first = 1;
    for (int f = 0; f < FAM_COUNT; f++)
      for (int m = 0; m < NM; m++) {
        if (!st[f][m].n)
          continue;
        printf("%s\n  {\"family\": \"%s\", \"method\": \"%s\", \"matrices\": %ld, \"above_reported\": %ld, "
               "\"above_tol\": %ld, \"worst_actual_over_reported\": %.3g, \"worst_rel_err\": %.3e, "
               "\"mean_passes\": %.2f}", first ? "" : ",", families[f].name, m ? "power" : "lanczos",
               st[f][m].n, st[f][m].above_reported, st[f][m].above_tol, st[f][m].worst_ratio,
               st[f][m].worst, (double)st[f][m].passes / (double)st[f][m].n);
        first = 0;
      }
    printf("\n]}\n");
  } else {
    printf("stabmeter %s accuracy: %ld matrices, tol %.0e, seed %llu, against dgesvd (f64)\n\n",
           stab_version(), count, o->tol, (unsigned long long)o->seed);
    for (int f = 0; f < FAM_COUNT; f++)
      printf("  %-10s %s\n", families[f].name, families[f].what);
    printf("\n%-10s %-8s %8s %15s %10s %18s %14s %12s\n", "family", "method", "matrices",
           "actual>reported", "actual>tol", "worst act/reported", "worst rel err", "mean passes");
    for (int f = 0; f < FAM_COUNT; f++)
      for (int m = 0; m < NM; m++)
        if (st[f][m].n)
          printf("%-10s %-8s %8ld %15ld %10ld %18.3g %14.2e %12.1f\n", families[f].name,
                 m ? "power" : "lanczos", st[f][m].n, st[f][m].above_reported, st[f][m].above_tol,
                 st[f][m].worst_ratio, st[f][m].worst, (double)st[f][m].passes / (double)st[f][m].n);
    printf("  actual > reported counts |sigma - dgesvd| / dgesvd > rel_err + %.0e (the claim of the\n"
           "  estimate; it must be 0). A pass is one product with a block of vectors.\n", slack);
  }
  rc = ferror(stdout) ? 1 : 0;
out:
  free(a);
  free(d);
  free(u);
  free(vt);
  free(tau);
  return rc;
}

int main(int argc, char **argv)
{
  enum { OPT_TOL = 256, OPT_MAX_PASSES, OPT_REPEATS, OPT_COLD_REPEATS, OPT_SEED, OPT_UPDATE,
         OPT_NO_LAPACK, OPT_EXACT_F64, OPT_EXACT_WARM, OPT_ACCURACY, OPT_NO_LOAD };
  static const struct option longopts[] = {
      {"sizes", required_argument, NULL, 's'},
      {"quick", no_argument, NULL, 'q'},
      {"threads", required_argument, NULL, 't'},
      {"tol", required_argument, NULL, OPT_TOL},
      {"max-passes", required_argument, NULL, OPT_MAX_PASSES},
      {"repeats", required_argument, NULL, OPT_REPEATS},
      {"cold-repeats", required_argument, NULL, OPT_COLD_REPEATS},
      {"seed", required_argument, NULL, OPT_SEED},
      {"update", required_argument, NULL, OPT_UPDATE},
      {"no-lapack", no_argument, NULL, OPT_NO_LAPACK},
      {"exact-f64", no_argument, NULL, OPT_EXACT_F64},
      {"exact-warm", no_argument, NULL, OPT_EXACT_WARM},
      {"accuracy", required_argument, NULL, OPT_ACCURACY},
      {"no-load", no_argument, NULL, OPT_NO_LOAD},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  options o = {.sizes = NULL, .n_sizes = 0, .threads = 0, .tol = 1e-3, .max_passes = 1000,
               .repeats = 0 /* 10, or 5 with --quick */, .cold_repeats = 3, .seed = 1, .update = 1e-3, .json = 0,
               .lapack = 1, .exact_f64 = 0, .exact_warm = 0, .loaded = 1};
  const char *sizes = default_sizes;
  int quick = 0, c;
  long accuracy = 0;

  cli_init("stabmeter-bench");
  unsigned long long v = 0;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS "s:qt:j", longopts, NULL)) != -1) {
    int rc = 0;
    switch (c) {
    case 's': sizes = optarg; break;
    case 'q': quick = 1; break;
    case 't': if (!(rc = cli_whole("--threads", optarg, 0, 4096, &v))) o.threads = (int)v; break;
    case OPT_TOL: rc = cli_real("--tol", optarg, 0.0, 1, 0.5, 1, &o.tol); break;
    case OPT_MAX_PASSES:
      if (!(rc = cli_whole("--max-passes", optarg, 1, 1000000, &v))) o.max_passes = (int)v;
      break;
    case OPT_REPEATS: if (!(rc = cli_whole("--repeats", optarg, 1, 100000, &v))) o.repeats = (int)v; break;
    case OPT_COLD_REPEATS:
      if (!(rc = cli_whole("--cold-repeats", optarg, 1, 1000, &v))) o.cold_repeats = (int)v;
      break;
    case OPT_SEED: if (!(rc = cli_whole("--seed", optarg, 0, UINT64_MAX, &v))) o.seed = (uint64_t)v; break;
    case OPT_UPDATE: rc = cli_real("--update", optarg, 0.0, 1, 1.0, 1, &o.update); break;
    case OPT_NO_LAPACK: o.lapack = 0; break;
    case OPT_EXACT_F64: o.exact_f64 = 1; break;
    case OPT_EXACT_WARM: o.exact_warm = 1; break;
    case OPT_NO_LOAD: o.loaded = 0; break;
    case OPT_ACCURACY: if (!(rc = cli_whole("--accuracy", optarg, 1, 1000000, &v))) accuracy = (long)v; break;
    case 'j': o.json = 1; break;
    case 'h': usage(); return CLI_OK;
    case 'V': return cli_version();
    default: return cli_getopt_error(c, argv);
    }
    if (rc)
      return rc;
  }
  if (optind < argc)
    return cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (accuracy)
    return accuracy_sweep(&o, accuracy);
  if (quick && sizes == default_sizes)
    sizes = quick_sizes;
  if (parse_sizes(sizes, &o.sizes, &o.n_sizes))
    return cli_bad_value("--sizes", sizes, "ROWSxCOLS[,ROWSxCOLS]..., each side in 1..65536, e.g. 512x512,768x3072");
  if (o.repeats == 0)
    o.repeats = quick ? 5 : 10;
  /* ARPACK's and the power iteration's errors reach 1e-5 and below, where sgesvd's own error
   * would decide the comparison: they need dgesvd (f64) as the reference */
  if (o.lapack && arpack_available())
    o.exact_f64 = 1;

  /* The streaming read uses as many threads as a pass does. */
#ifdef _OPENMP
  o.stream_threads = o.threads > 0 ? o.threads : omp_get_max_threads();
#else
  if (o.threads > 1)
    progress("%s: built without OpenMP: the library and the stream read use one thread\n", cli_name);
  o.stream_threads = 1;
#endif

  size_result *res = calloc(o.n_sizes, sizeof *res);
  if (!res) {
    cli_error("out of memory");
    free(o.sizes);
    return 1;
  }
  int failed = 0;
  o.load_start = load_average();
  if (o.load_start > 0.5)
    progress("%s: load average %.2f: other work on this machine will disturb the timings\n", cli_name,
             o.load_start);
  for (size_t i = 0; i < o.n_sizes; i++)
    if (bench_size(&o, o.sizes[i], i, &res[i]))
      failed = 1;

  o.load_end = load_average();
  targets t = compute_targets(res, o.n_sizes);
  if (o.json)
    print_json(&o, res, o.n_sizes, &t, o.stream_threads);
  else
    print_human(&o, res, o.n_sizes, &t, o.stream_threads);
  fflush(stdout);

  free(res);
  free(o.sizes);
  return failed || ferror(stdout) ? 1 : 0;
}
