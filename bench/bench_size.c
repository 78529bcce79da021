/* bench_size.c — the timing of one size: on a seeded Gaussian W (plus a rank-one spike for
 * ROWSxCOLS:spiked), the bandwidth of one pass against the streaming and the reference reads
 * (f32 with the given threads and with one, and BF16 read as stored), the cold and the warm
 * estimates, the loaded slowdown (bench_load.c), then LAPACK's sigma and, with ARPACK, the
 * ARPACK and power-iteration comparisons. Timed work first, LAPACK and ARPACK last: their
 * threads would compete with the timed passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lapacke.h>

#include "bench.h"
#include "bench_arpack.h"
#include "bench_power.h"
#include "cli.h"
#include "clock.h"
#include "stream_read.h"
#include "stabmeter.h"
#include "synth.h"

/* ARPACK's tolerance ladder, loosest first (see arpack_ladder) */
static const double arpack_ladder_tols[] = {1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6, 1e-6};
/* the spiked matrices' s2/s1 */
#define SPIKE_RATIO 0.836

/* ---------------------------------------------------------------------------------- */
/* Results before measuring                                                            */

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
  r->pass_cold_GBps = r->pass1_GBps = NAN;
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
double lapack_sigma(char precision, void *work, size_t rows, size_t cols, double *sigma)
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
 * neither estimate stops early. Seconds, or NaN if a call failed, the passes did not differ, or
 * the more passes did not take longer (a matrix too small to time so). */
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
  /* on a matrix of a few kB the two calls' set-up differs by more than the passes take: no figure */
  if (passes[1] <= passes[0] || !(best[1] > best[0]))
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
int bench_size(const options *o, shape sh, size_t index, size_result *r)
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
  if (r->cold_power.passes > 0) /* one vector per pass: its rate, set-up and all */
    r->pass1_GBps = bytes * r->cold_power.passes / r->cold_power.seconds * 1e-9;
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
