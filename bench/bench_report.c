/* bench_report.c — what a run of harness/bench concludes: the targets (each from this run's
 * sizes), and the results as a table or as one JSON object (the format tests/programs/
 * bench_json.sh holds), on stdout; and the progress every file of the bench reports on stderr. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_arpack.h"
#include "stream_read.h"
#include "stabmeter.h"

/* Progress on stderr, flushed (results go to stdout): every file of the bench reports through it. */
void progress(const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fflush(stderr);
}

/* Matrices at least this big do not fit in any cache of the machines we run on, so their
 * pass bandwidth is a DRAM figure; the bandwidth target is judged on them. */
#define BIG_MATRIX_BYTES (64.0 * MIB)
#define TARGET_SPEEDUP 100.0
/* cold Lanczos against ARPACK, both stopped by their own rule at the same residual bound
 * (arpack_own_rule: no oracle picks ARPACK's tolerance), on these sizes */
#define TARGET_ARPACK 1.5
static const char *const arpack_target_sizes[] = {"4096x4096", "768x3072", "3072x768"};
#define TARGET_FRACTION 0.70
/* one pass (a warm start's: four vectors) against the reference read (the faster of a
 * wide-vector read and sgemv) over matrices of 64 MiB and more; BF16 the same, counting its
 * own bytes */
#define TARGET_REFERENCE_FRACTION 0.85
/* in cache memory is not the limit: the same pass against OpenBLAS sgemv reading the same
 * bytes, at this size (9 MiB: GPT-2's 768x3072). The pass makes 8 FMAs an element, sgemv 1:
 * the pass's arithmetic ceiling (bench/fma_peak.c) is printed beside it. */
#define TARGET_IN_CACHE_FRACTION 0.60
static const char *const in_cache_size = "768x3072";
#define TARGET_WARM_PASSES 4
/* a cold or warm estimate at most this many times its idle time: beside a trainer's OpenBLAS
 * sgemm threads, and beside one spinning loop per CPU (which give any job of that many threads
 * half the CPU: 2x is the fair-share floor there) */
#define TARGET_LOADED_BLAS 1.3
#define TARGET_LOADED_SPIN 2.2

/* "4096x4096" or "4096x4096:spiked" */
static const char *shape_name(char *buf, size_t len, size_t rows, size_t cols, int spiked)
{
  snprintf(buf, len, "%zux%zu%s", rows, cols, spiked ? ":spiked" : "");
  return buf;
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
  /* what the four-vector pass's FMAs allow there (pass4_ceiling_GBps(), half of it for BF16's 2
   * bytes an element, over the reference read) */
  double ref_ceiling, bf16_ref_ceiling;
  double in_cache;         /* pass_GBps / sgemv_GBps at in_cache_size; NaN if not measured */
  double in_cache_ceiling; /* pass4_ceiling_GBps() / sgemv_GBps there: the most in_cache can be */
  /* worst loaded/idle ratio (cold or warm) beside OpenBLAS sgemm and beside spinning loops;
   * NaN if none */
  double loaded_blas, loaded_spin;
  const size_result *loaded_blas_from, *loaded_spin_from;
  double arpack[3];        /* speedup_vs_arpack_own_rule at arpack_target_sizes; NaN if not measured */
  double spiked_vs_power;  /* power_oracle_s / cold_krylov_s, worst spiked size; NaN if none */
} targets;

/* The arithmetic ceiling of a four-vector pass in GB/s of f32 W: fma_rate FMAs a second, 8 an
 * element (4 dots and 4 scaled rows), 4 bytes an element. The same for every size. */
static double pass4_ceiling_GBps(const options *o)
{
  return o->fma_rate / 8.0 * sizeof(float) * 1e-9;
}

static targets compute_targets(const size_result *res, size_t n, double ceiling)
{
  targets t = {NAN, NAN, NULL, 0, -1, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NULL, NULL, {NAN, NAN, NAN}, NAN};
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
        t.arpack[k] = r->speedup_vs_arpack_own;
    if (!strcmp(name, in_cache_size)) {
      t.in_cache = r->pass_GBps / r->sgemv_GBps;
      t.in_cache_ceiling = ceiling / r->sgemv_GBps;
    }
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
      double *worst_of[2] = {&t.loaded_spin, &t.loaded_blas};
      const size_result **from[2] = {&t.loaded_spin_from, &t.loaded_blas_from};
      for (int k = 0; k < 2; k++) {
        double worst = fmax(l[k]->loaded_cold_s / l[k]->idle_cold_s, l[k]->loaded_warm_s / l[k]->idle_warm_s);
        if (!(worst <= *worst_of[k])) { /* also the first (NaN) */
          *worst_of[k] = worst;
          *from[k] = r;
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
    t.ref_ceiling = fmin(t.ref_ceiling, ceiling / r->reference_GBps);
    t.bf16_ref_ceiling = fmin(t.bf16_ref_ceiling, ceiling / 2.0 / r->reference_GBps);
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
  const char *beside[2] = {"OpenBLAS sgemm", "spinning loops"};
  const double bound[2] = {TARGET_LOADED_BLAS, TARGET_LOADED_SPIN};
  const double worst[2] = {t->loaded_blas, t->loaded_spin};
  const size_result *from[2] = {t->loaded_blas_from, t->loaded_spin_from};
  for (int k = 0; k < 2; k++)
    if (from[k])
      printf("target beside %s, cold and warm <= %.1fx idle: worst %.2fx (at %zux%zu) %s\n", beside[k], bound[k],
             worst[k], from[k]->rows, from[k]->cols, pass_fail(1, worst[k] <= bound[k]));
    else
      printf("target beside %s, cold and warm <= %.1fx idle: n/a SKIP\n", beside[k], bound[k]);
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
         "from a fixed vector,\n  one pass of a warm block's four vectors, set-up included (median "
         "in --json; a cold start's first\n  pass, also four vectors, is pass_cold_GBps). warm L/P: "
         "Lanczos/power passes on W + dW.\n\n");

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
         "passes of four vectors, the difference of 6 and 2).\n",
         stream_read_wide_name(), stream_threads);
  printf("%-11s %9s %8s %9s %8s %9s %8s %9s %8s\n", "size", "1v pass", "of ref", "4v warm", "of ref", "4v cold",
         "of ref", "4v FMAs", "of ref");
  for (size_t i = 0; i < n; i++) {
    const size_result *r = &res[i];
    char k[32], l[32];
    snprintf(s, sizeof s, "%zux%zu", r->rows, r->cols);
    printf("%-11s %9s %8s %9s %8s %9s %8s %9s %8s\n", s, fmt_num(a, sizeof a, "%.2f", r->pass1_GBps),
           fmt_num(b, sizeof b, "%.3f", r->pass1_GBps / r->reference_GBps), fmt_num(c, sizeof c, "%.2f", r->pass_GBps),
           fmt_num(d, sizeof d, "%.3f", r->reference_fraction), fmt_num(e, sizeof e, "%.2f", r->pass_cold_GBps),
           fmt_num(f, sizeof f, "%.3f", r->pass_cold_GBps / r->reference_GBps),
           fmt_num(k, sizeof k, "%.2f", pass4_ceiling_GBps(o)),
           fmt_num(l, sizeof l, "%.3f", pass4_ceiling_GBps(o) / r->reference_GBps));
  }
  printf("  passes of one and four vectors (GB/s of W read): 1v the cold power iteration's passes (its\n"
         "  time over its passes), 4v warm the warm pass above, 4v cold a cold start's first pass; the\n"
         "  engine makes no two-vector pass (a warm block is four vectors). 4v FMAs: the arithmetic\n"
         "  ceiling of a four-vector pass, 8 FMAs an element at this machine's FMA rate (%.1f G/s).\n\n",
         o->fma_rate * 1e-9);

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
    printf("target one pass >= %.0f%% of the reference read: %.1f%% (%s; its FMAs allow %.1f%%) %s\n",
           TARGET_REFERENCE_FRACTION * 100, t->ref_fraction * 100, where, t->ref_ceiling * 100,
           pass_fail(isfinite(t->ref_fraction), t->ref_fraction >= TARGET_REFERENCE_FRACTION));
    printf("target one pass over BF16 >= %.0f%% of the reference read: %.1f%% (%s; its FMAs allow %.1f%%) %s\n",
           TARGET_REFERENCE_FRACTION * 100, t->bf16_ref_fraction * 100, where, t->bf16_ref_ceiling * 100,
           pass_fail(isfinite(t->bf16_ref_fraction), t->bf16_ref_fraction >= TARGET_REFERENCE_FRACTION));
  } else {
    printf("target one pass >= %.0f%% of the reference read: n/a SKIP\n",
           TARGET_REFERENCE_FRACTION * 100);
  }
  if (isfinite(t->in_cache))
    printf("target one pass in cache (%s) >= %.0f%% of OpenBLAS sgemv's rate: %.1f%% (its FMAs allow %.1f%%) %s\n",
           in_cache_size, TARGET_IN_CACHE_FRACTION * 100, t->in_cache * 100, t->in_cache_ceiling * 100,
           pass_fail(1, t->in_cache >= TARGET_IN_CACHE_FRACTION));
  else
    printf("target one pass in cache (%s) >= %.0f%% of OpenBLAS sgemv's rate: n/a (not measured) SKIP\n",
           in_cache_size, TARGET_IN_CACHE_FRACTION * 100);
  if (t->warm >= 0)
    printf("target warm <= %d passes: %d %s\n", TARGET_WARM_PASSES, t->warm,
           pass_fail(1, t->warm <= TARGET_WARM_PASSES));
  else
    printf("target warm <= %d passes: n/a SKIP\n", TARGET_WARM_PASSES);
  print_loaded(res, n, t);
  for (int k = 0; k < 3; k++)
    if (isfinite(t->arpack[k]))
      printf("target cold %s >= %.1fx faster than ARPACK, each by its own rule: %.2fx %s\n",
             arpack_target_sizes[k], TARGET_ARPACK, t->arpack[k], pass_fail(1, t->arpack[k] >= TARGET_ARPACK));
    else
      printf("target cold %s >= %.1fx faster than ARPACK, each by its own rule: n/a (%s) SKIP\n",
             arpack_target_sizes[k], TARGET_ARPACK,
             !arpack_available() ? "built without ARPACK (libarpack2-dev)" : !o->lapack ? "--no-lapack"
                                                                         : "not measured");
  if (isfinite(t->spiked_vs_power))
    printf("target spiked: no slower than the oracle power iteration: %.2fx %s\n", t->spiked_vs_power,
           pass_fail(1, t->spiked_vs_power >= 1.0));
  else
    printf("target spiked: no slower than the oracle power iteration: n/a (no ROWSxCOLS:spiked size) SKIP\n");
  printf("  For information, ARPACK with an oracle: dsaupd on the smaller Gram matrix, sgemv products\n"
         "  (2 reads each), at the loosest of the ladder 1e-1, 3e-2, ... whose actual error <= tol, a\n"
         "  tolerance chosen after seeing the answer; the library at tol or the loosest tol/3, tol/10,\n"
         "  ... whose actual error <= ARPACK's. Errors against dgesvd.\n");
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
  /* The ARPACK targets' comparison: without an oracle, both sides on their own rule */
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

/* The member "arithmetic_ceiling": c (null when not measured) and its ", ", written into buf:
 * what a four-vector pass's FMAs allow the target's value to be. Returns buf. */
static const char *json_ceiling(char *buf, size_t len, double c)
{
  if (isfinite(c))
    snprintf(buf, len, "\"arithmetic_ceiling\": %.4f, ", c);
  else
    snprintf(buf, len, "\"arithmetic_ceiling\": null, ");
  return buf;
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
  json_num("fma_rate", o->fma_rate, 1);
  json_num("pass4_ceiling_GBps", pass4_ceiling_GBps(o), 1);
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
    json_num("pass1_GBps", r->pass1_GBps, 1);
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
  json_target("pass_reference_fraction", t->ref_fraction, 0, TARGET_REFERENCE_FRACTION,
              json_ceiling(extra, sizeof extra, t->ref_ceiling));
  json_target("pass_bf16_reference_fraction", t->bf16_ref_fraction, 0, TARGET_REFERENCE_FRACTION,
              json_ceiling(extra, sizeof extra, t->bf16_ref_ceiling));
  json_target("warm_passes", t->warm >= 0 ? t->warm : NAN, 1, TARGET_WARM_PASSES, NULL);
  e = snprintf(extra, sizeof extra, "\"size\": \"%s\", ", in_cache_size);
  json_ceiling(extra + e, sizeof extra - (size_t)e, t->in_cache_ceiling);
  json_target("pass_in_cache_sgemv_fraction", t->in_cache, 0, TARGET_IN_CACHE_FRACTION, extra);
  json_target("loaded_blas_slowdown", t->loaded_blas_from ? t->loaded_blas : NAN, 1, TARGET_LOADED_BLAS, NULL);
  json_target("loaded_spin_slowdown", t->loaded_spin_from ? t->loaded_spin : NAN, 1, TARGET_LOADED_SPIN, NULL);
  printf("\"arpack_available\": %s, ", arpack_available() ? "true" : "false");
  for (int k = 0; k < 3; k++) {
    char name[64];
    snprintf(name, sizeof name, "cold_vs_arpack_%s", arpack_target_sizes[k]);
    json_target(name, t->arpack[k], 0, TARGET_ARPACK, "\"rule\": \"own\", ");
  }
  printf("\"spiked_vs_power_oracle\": {");
  json_num("value", t->spiked_vs_power, 1);
  json_num("min", 1.0, 1);
  printf("\"pass\": %s}}}\n", isfinite(t->spiked_vs_power) ? (t->spiked_vs_power >= 1.0 ? "true" : "false") : "null");
}

void bench_report(const options *o, const size_result *res, size_t n)
{
  targets t = compute_targets(res, n, pass4_ceiling_GBps(o));
  if (o->json)
    print_json(o, res, n, &t, o->stream_threads);
  else
    print_human(o, res, n, &t, o->stream_threads);
}
