/* bench_accuracy.c — harness/bench --accuracy: whether the estimate's reported error holds,
 * over families of matrices with different spectra, against dgesvd in f64. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <lapacke.h>

#include "bench.h"
#include "cli.h"
#include "stabmeter.h"
#include "synth.h"

/* --accuracy N: N matrices in families with different spectra, each method's sigma at the
 * default settings against dgesvd in f64 of the same f32 numbers: how often the actual error
 * exceeds the reported one (the claim the estimate makes) and tol, the worst ratio of the two,
 * the mean passes. The figures behind docs/lab/performance.md's "accuracy of the estimate".
 * Near-equal pairs are also estimated warm, as a monitor's step would: from the top right
 * singular vector V[:,0] (warm_v1, the usual step) and from the second, V[:,1] (warm_v2, the
 * top two swapped since the last step), Lanczos either way. */
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

int accuracy_sweep(const options *o, long count)
{
  enum { NM = 4 }; /* lanczos, power (power on the gaussian family only: it takes thousands of
                      passes on near-equal pairs), lanczos warm from V[:,0] and from V[:,1]
                      (near-equal pairs, whose V is known) */
  static const char *const method_names[NM] = {"lanczos", "power", "warm_v1", "warm_v2"};
  /* the estimate claims actual <= reported; exact answers (rel_err 0) differ from dgesvd by
   * rounding, which this slack absorbs */
  const double slack = 1e-12;
  struct { long n, above_reported, above_tol, passes; double worst_ratio, worst; } st[FAM_COUNT][NM];
  memset(st, 0, sizeof st);
  float *a = malloc((size_t)ACC_MAX_ELEMS * sizeof *a);
  double *d = malloc((size_t)ACC_MAX_ELEMS * sizeof *d);
  double *u = malloc((size_t)ACC_MAX_SIDE * 256 * sizeof *u), *vt = malloc((size_t)ACC_MAX_SIDE * 256 * sizeof *vt);
  double *tau = malloc((size_t)ACC_MAX_SIDE * sizeof *tau), ref = 0.0;
  double *warm = malloc((size_t)ACC_MAX_SIDE * sizeof *warm);
  int rc = 1;
  if (!a || !d || !u || !vt || !tau || !warm) {
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
      for (int m = 0; m < NM; m++) {
        if ((m == 1 && f != FAM_GAUSS) || (m >= 2 && f != FAM_NEAR_PAIR))
          continue;
        const size_t kk = rows < cols ? rows : cols; /* vt holds V, cols x kk */
        if (m >= 2)
          for (size_t c = 0; c < cols; c++)
            warm[c] = vt[c * kk + (size_t)(m - 2)];
        stab_spectral_params p = stab_spectral_default_params();
        p.method = m == 1 ? STAB_SPECTRAL_POWER : STAB_SPECTRAL_LANCZOS;
        p.tol = o->tol;
        p.threads = o->threads;
        p.seed = (uint64_t)k;
        stab_sigma_result r;
        if (stab_sigma(a, rows, cols, cols, &p, m >= 2 ? warm : NULL, &r) != STAB_OK) {
          cli_error("matrix %ld: %s", k, stab_last_error());
          goto out;
        }
        double err = ref > 0.0 ? fabs(ref - r.sigma) / ref : fabs(r.sigma);
        st[f][m].n++;
        st[f][m].passes += r.passes;
        if (err > r.rel_err + slack) {
          st[f][m].above_reported++;
          progress("%s: %s %s matrix %ld (%zu x %zu): actual %.3e above the reported %.3e (%d passes)\n",
                   cli_name, families[f].name, method_names[m], k, rows, cols, err, r.rel_err, r.passes);
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
  long total_above = 0, warm_above = 0;
  for (int f = 0; f < FAM_COUNT; f++) {
    total_above += st[f][0].above_reported;
    warm_above += st[f][2].above_reported + st[f][3].above_reported;
  }
  if (o->json) {
    printf("{\"format\": \"stabmeter-bench-accuracy\", \"format_version\": 2, \"matrices\": %ld, "
           "\"tol\": %g, \"seed\": %llu, \"kernel\": \"%s\", \"lanczos_above_reported\": %ld, "
           "\"warm_above_reported\": %ld, \"families\": [",
           count, o->tol, (unsigned long long)o->seed, stab_spectral_kernel(), total_above, warm_above);
    int first = 1;
    for (int f = 0; f < FAM_COUNT; f++)
      for (int m = 0; m < NM; m++) {
        if (!st[f][m].n)
          continue;
        printf("%s\n  {\"family\": \"%s\", \"method\": \"%s\", \"matrices\": %ld, \"above_reported\": %ld, "
               "\"above_tol\": %ld, \"worst_actual_over_reported\": %.3g, \"worst_rel_err\": %.3e, "
               "\"mean_passes\": %.2f}", first ? "" : ",", families[f].name, method_names[m],
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
                 method_names[m], st[f][m].n, st[f][m].above_reported, st[f][m].above_tol,
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
  free(warm);
  return rc;
}
