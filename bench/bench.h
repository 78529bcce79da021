/* bench.h — what the files of harness/bench share: the options, the shape of a matrix to
 * measure, what one size's measurement yields, and the functions one file calls in another.
 *   bench/bench.c           the command line and main
 *   bench/bench_size.c      the timing of one size (bandwidth, cold, warm, loaded, LAPACK, ARPACK)
 *   bench/bench_report.c    the targets, and the results as a table or one JSON object
 *   bench/bench_accuracy.c  --accuracy: the estimate's actual errors over families of matrices
 *   bench/bench_load.c, bench_arpack.c, bench_power.c, stream_read.c: the loaded machine, and
 *                           the baselines (ARPACK, power iteration, the reference read)
 * Not a part of the library. */
#ifndef STAB_BENCH_H
#define STAB_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "bench_load.h"

#define MIB (1024.0 * 1024.0)

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
  double fma_rate;       /* f32 FMAs a second with the pass's threads (bench/fma_peak.h), NaN if
                            unknown: measured once at the start; bench_report.c derives the
                            four-vector pass's ceiling from it */
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
  /* One pass of four vectors: a one-pass call warm-started from a fixed vector (the block of
   * a warm start is four vectors, the pass every monitor step makes), set-up and all. */
  double pass_s, pass_median_s, pass_GBps, pass_median_GBps;
  int pass_passes;         /* out.passes of the one-pass call; must be 1 */
  double pass_cold_GBps;   /* the same call from a cold start: one pass of four vectors */
  double pass1_GBps;       /* a pass of one vector: the cold power iteration's, its time over its passes */
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

/* Progress and diagnostics on stderr, flushed (bench_report.c). */
void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* sigma(A) by LAPACK ?gesvd (bench_size.c: the reference of both the timings and --accuracy). */
double lapack_sigma(char precision, void *work, size_t rows, size_t cols, double *sigma);

/* Measures one size (the index-th of o->sizes) into r (bench_size.c). Returns 0, or -1 if
 * something failed to run (r->ok = 0). */
int bench_size(const options *o, shape sh, size_t index, size_result *r);

/* The targets over the measured sizes, and the results as a table or, with o->json, one JSON
 * object, on stdout (bench_report.c). */
void bench_report(const options *o, const size_result *res, size_t n);

/* --accuracy N (bench_accuracy.c): the exit status. */
int accuracy_sweep(const options *o, long count);

#endif /* STAB_BENCH_H */
