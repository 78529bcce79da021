/* spectral.c — sigma(A) and sigma(A - B) of f32 matrices: Lanczos and power iteration on
 * the Gram matrix G = A^T A (one pass over A per step, gram_pass.c), warm-started from the
 * previous top right singular vector, and LAPACK dgesvd as the exact reference.
 *
 * Error estimate (relative, on sigma = sqrt(lambda_max(G))): the residual norm r of the
 * Ritz pair (theta, x) bounds the distance from theta to some eigenvalue of G (Bauer-Fike),
 * and d(sigma)/sigma = d(lambda)/(2 lambda), so rel_err = r / (2 theta). Sharper estimates
 * that divide r^2 by the gap to the second Ritz value (Kato-Temple) stopped too early on
 * Gaussian matrices, whose top singular values are close: 33 of 400 random cases ended above
 * tol, against 1 of 400 with the residual. The residual can still be fooled when x holds a
 * tiny component of the top singular vector: it then describes the second one. */
#include "internal.h"

#include <float.h>
#include <lapacke.h>
#include <stdlib.h>
#include <string.h>

struct stab_spectral_workspace {
  stab_spectral_params params;
  size_t max_rows, max_cols;
  size_t kdim;      /* Lanczos basis vectors held */
  double *partial;  /* chunk accumulators, stabi_chunk_count(max_rows) * max_cols */
  double *x, *y;    /* max_cols each */
  double *basis;    /* Lanczos: kdim * max_cols */
  double *alpha, *beta;          /* the tridiagonal T, kdim each */
  double *td, *te, *tz, *twork;  /* dstev scratch: kdim, kdim, kdim^2, 2 kdim */
  double *copy, *sv, *gwork;     /* exact: f64 matrix, singular values, dgesvd work */
  lapack_int lwork;
};

stab_spectral_params stab_spectral_default_params(void) {
  stab_spectral_params p;
  p.method = STAB_SPECTRAL_LANCZOS;
  p.tol = 1e-3;
  p.max_passes = 1000;
  p.krylov_dim = 64;
  p.threads = 0;
  p.seed = 0x5eed;
  return p;
}

stab_status stabi_spectral_check(const stab_spectral_params *p, const char *who) {
  if (p->method != STAB_SPECTRAL_LANCZOS && p->method != STAB_SPECTRAL_POWER &&
      p->method != STAB_SPECTRAL_EXACT)
    return stabi_fail(STAB_EINVAL, "%s: unknown spectral method %d", who, (int)p->method);
  if (!(p->tol > 0.0 && p->tol < 0.5))
    return stabi_fail(STAB_EINVAL, "%s: tol %g is outside (0, 0.5)", who, p->tol);
  if (p->max_passes < 1)
    return stabi_fail(STAB_EINVAL, "%s: max_passes %d is below 1", who, p->max_passes);
  if (p->krylov_dim < 2)
    return stabi_fail(STAB_EINVAL, "%s: krylov_dim %d is below 2", who, p->krylov_dim);
  if (p->threads < 0)
    return stabi_fail(STAB_EINVAL, "%s: threads %d is negative", who, p->threads);
  return STAB_OK;
}

static void free_buffers(stab_spectral_workspace *ws) {
  free(ws->partial); free(ws->x); free(ws->y); free(ws->basis);
  free(ws->alpha); free(ws->beta); free(ws->td); free(ws->te); free(ws->tz); free(ws->twork);
  free(ws->copy); free(ws->sv); free(ws->gwork);
}

void stab_spectral_workspace_free(stab_spectral_workspace *ws) {
  if (!ws) return;
  free_buffers(ws);
  free(ws);
}

static double *alloc_doubles(size_t n, int *failed) {
  double *p = NULL;
  if (n == 0 || n > (size_t)-1 / sizeof(double) || !(p = calloc(n, sizeof(double)))) *failed = 1;
  return p;
}

/* dgesvd's optimal workspace for values only of an m x n column-major matrix. */
static lapack_int gesvd_lwork(lapack_int m, lapack_int n) {
  double q = 0.0;
  if (LAPACKE_dgesvd_work(LAPACK_COL_MAJOR, 'N', 'N', m, n, NULL, m > 0 ? m : 1, NULL, NULL, 1,
                          NULL, 1, &q, -1) != 0)
    return 0;
  return (lapack_int)q;
}

/* (Re)allocates every buffer for matrices up to rows x cols. On failure the workspace is
 * left as it was. */
stab_status stabi_spectral_reserve(stab_spectral_workspace *ws, size_t rows, size_t cols) {
  if (rows <= ws->max_rows && cols <= ws->max_cols && ws->x) return STAB_OK;
  size_t r = rows > ws->max_rows ? rows : ws->max_rows;
  size_t c = cols > ws->max_cols ? cols : ws->max_cols;
  stab_spectral_workspace n = *ws;
  memset(&n.partial, 0, sizeof n - offsetof(stab_spectral_workspace, partial));
  n.max_rows = r;
  n.max_cols = c;
  int failed = 0;
  size_t nchunks = stabi_chunk_count(r);
  n.partial = alloc_doubles(stabi_mul(nchunks, c), &failed);
  n.x = alloc_doubles(c, &failed);
  n.y = alloc_doubles(c, &failed);
  if (ws->params.method == STAB_SPECTRAL_LANCZOS) {
    size_t k = (size_t)ws->params.krylov_dim;
    if (k > c) k = c; /* the Krylov space cannot grow past cols */
    n.kdim = k;
    n.basis = alloc_doubles(stabi_mul(k, c), &failed);
    n.alpha = alloc_doubles(k, &failed);
    n.beta = alloc_doubles(k, &failed);
    n.td = alloc_doubles(k, &failed);
    n.te = alloc_doubles(k, &failed);
    n.tz = alloc_doubles(stabi_mul(k, k), &failed);
    n.twork = alloc_doubles(2 * k, &failed);
  }
  if (ws->params.method == STAB_SPECTRAL_EXACT) {
    if (r > (size_t)INT32_MAX || c > (size_t)INT32_MAX) failed = 1;
    n.copy = alloc_doubles(stabi_mul(r, c), &failed);
    n.sv = alloc_doubles(r < c ? r : c, &failed);
    lapack_int w1 = gesvd_lwork((lapack_int)c, (lapack_int)r);
    lapack_int w2 = gesvd_lwork((lapack_int)r, (lapack_int)c);
    n.lwork = w1 > w2 ? w1 : w2;
    if (n.lwork < 1) failed = 1;
    else n.gwork = alloc_doubles((size_t)n.lwork, &failed);
  }
  if (failed) {
    free_buffers(&n);
    return stabi_fail(STAB_ENOMEM, "spectral workspace: cannot allocate for a %zu x %zu matrix",
                      r, c);
  }
  free_buffers(ws);
  *ws = n;
  return STAB_OK;
}

stab_status stab_spectral_workspace_create(size_t max_rows, size_t max_cols,
                                           const stab_spectral_params *params,
                                           stab_spectral_workspace **out) {
  if (!out) return stabi_fail(STAB_EINVAL, "stab_spectral_workspace_create: out is NULL");
  *out = NULL;
  if (max_rows == 0 || max_cols == 0 || !stabi_mul(max_rows, max_cols))
    return stabi_fail(STAB_EDIM, "stab_spectral_workspace_create: %zu x %zu is not a valid size",
                      max_rows, max_cols);
  stab_spectral_params p = params ? *params : stab_spectral_default_params();
  stab_status st = stabi_spectral_check(&p, "stab_spectral_workspace_create");
  if (st != STAB_OK) return st;
  stab_spectral_workspace *ws = calloc(1, sizeof *ws);
  if (!ws) return stabi_fail(STAB_ENOMEM, "stab_spectral_workspace_create: out of memory");
  ws->params = p;
  st = stabi_spectral_reserve(ws, max_rows, max_cols);
  if (st != STAB_OK) {
    free(ws);
    return st;
  }
  *out = ws;
  return STAB_OK;
}

const stab_spectral_params *stabi_spectral_params(const stab_spectral_workspace *ws) {
  return &ws->params;
}

size_t stabi_spectral_bytes(const stab_spectral_workspace *ws) {
  size_t d = stabi_chunk_count(ws->max_rows) * ws->max_cols + 2 * ws->max_cols;
  d += ws->kdim * ws->max_cols + ws->kdim * (5 + ws->kdim);
  if (ws->copy) d += ws->max_rows * ws->max_cols + ws->max_cols + ws->max_rows + (size_t)ws->lwork;
  return d * sizeof(double) + sizeof *ws;
}

/* ---- small vector helpers (f64) ---- */

static double dot(const double *a, const double *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += a[i] * b[i];
  return s;
}

static void scale(double *a, double s, size_t n) {
  for (size_t i = 0; i < n; i++) a[i] *= s;
}

/* A reproducible start vector with every direction present. */
static void cold_start(double *x, size_t n, uint64_t seed) {
  uint64_t s = seed ^ 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    s += 0x9e3779b97f4a7c15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = (double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
  }
  scale(x, 1.0 / sqrt(dot(x, x, n)), n);
}

/* Loads the start vector into x: the caller's warm vector when it is usable. Returns 1 for a
 * warm start. */
static int start_vector(double *x, const double *v, size_t n, uint64_t seed) {
  if (v) {
    double nn = dot(v, v, n);
    if (isfinite(nn) && nn > 0.0) {
      double s = 1.0 / sqrt(nn);
      for (size_t i = 0; i < n; i++) x[i] = v[i] * s;
      return 1;
    }
  }
  cold_start(x, n, seed);
  return 0;
}

/* Relative error of sigma from an absolute error bound of lambda. */
static double sigma_rel(double lambda_err, double theta) {
  if (theta <= 0.0) return lambda_err > 0.0 ? INFINITY : 0.0;
  return 0.5 * lambda_err / theta;
}

/* ---- power iteration ---- */

static void power(stab_spectral_workspace *ws, const float *a, const float *b, size_t rows,
                  size_t cols, size_t ld, double *v, stab_sigma_result *out) {
  const stab_spectral_params *p = &ws->params;
  double *x = ws->x, *y = ws->y;
  int warm = start_vector(x, v, cols, p->seed);
  double theta = 0.0, err = INFINITY;
  int k = 0;
  while (k < p->max_passes) {
    theta = stabi_gram_apply(a, b, rows, cols, ld, x, y, ws->partial, p->threads);
    k++;
    if (!isfinite(theta)) {
      out->nonfinite = 1;
      break;
    }
    double yy = dot(y, y, cols);
    if (yy == 0.0) {
      if (warm) { /* the warm vector fell in the null space: start again cold */
        warm = 0;
        cold_start(x, cols, p->seed);
        continue;
      }
      err = 0.0;
      break;
    }
    /* the residual of x: some eigenvalue lies within r of theta (Bauer-Fike) */
    double e = sqrt(fmax(yy - theta * theta, 0.0));
    err = sigma_rel(e, theta);
    scale(y, 1.0 / sqrt(yy), cols);
    memcpy(x, y, cols * sizeof *x);
    if (err <= p->tol) break;
  }
  out->passes = k;
  if (out->nonfinite) return;
  out->sigma = sqrt(theta);
  out->rel_err = err;
  out->converged = err <= p->tol;
  if (v) memcpy(v, x, cols * sizeof *v);
}

/* ---- Lanczos ---- */

/* Largest eigenpair of the j x j tridiagonal (alpha, beta): theta1, the second largest
 * theta2 (or -inf), and the last component of theta1's eigenvector. s: j doubles receiving
 * that eigenvector. Returns 0 on success. */
static int tridiag_top(stab_spectral_workspace *ws, size_t j, double *theta1, double *theta2,
                       double *s) {
  memcpy(ws->td, ws->alpha, j * sizeof(double));
  if (j > 1) memcpy(ws->te, ws->beta, (j - 1) * sizeof(double));
  lapack_int info = LAPACKE_dstev_work(LAPACK_COL_MAJOR, 'V', (lapack_int)j, ws->td, ws->te,
                                       ws->tz, (lapack_int)j, ws->twork);
  if (info != 0) return (int)info;
  *theta1 = ws->td[j - 1];
  *theta2 = j > 1 ? ws->td[j - 2] : -INFINITY;
  memcpy(s, ws->tz + (j - 1) * j, j * sizeof(double));
  return 0;
}

/* x = sum_i s_i q_i, normalised. */
static void ritz_vector(const stab_spectral_workspace *ws, size_t j, const double *s, size_t cols,
                        double *x) {
  memset(x, 0, cols * sizeof *x);
  for (size_t i = 0; i < j; i++) {
    const double *q = ws->basis + i * cols;
    for (size_t c = 0; c < cols; c++) x[c] += s[i] * q[c];
  }
  double nn = dot(x, x, cols);
  if (nn > 0.0) scale(x, 1.0 / sqrt(nn), cols);
}

static stab_status lanczos(stab_spectral_workspace *ws, const float *a, const float *b,
                           size_t rows, size_t cols, size_t ld, double *v,
                           stab_sigma_result *out) {
  const stab_spectral_params *p = &ws->params;
  const size_t kdim = ws->kdim;
  double *z = ws->y, *s = ws->x; /* x doubles as the Ritz coefficients once q_0 is in the basis */
  double theta = 0.0, err = INFINITY;
  int warm = start_vector(ws->basis, v, cols, p->seed);
  size_t j = 0; /* basis vectors in use */
  /* A matrix with a small side has a Krylov space that ends (beta = 0, theta exact) within
   * min(rows, cols) + 1 steps: cheap, and immune to the residual estimate being fooled by two
   * close top singular values. */
  const size_t small_side = rows < cols ? rows : cols;
  const int to_the_end = small_side <= 32 && (small_side == cols ? cols <= kdim : small_side < kdim);
  int k = 0;
  while (k < p->max_passes) {
    double *q = ws->basis + j * cols;
    double aq = stabi_gram_apply(a, b, rows, cols, ld, q, z, ws->partial, p->threads);
    k++;
    if (!isfinite(aq)) {
      out->nonfinite = 1;
      out->passes = k;
      return STAB_OK;
    }
    ws->alpha[j] = aq;
    /* Full reorthogonalisation, twice ("twice is enough"), which also removes the
     * three-term recurrence's alpha q_j and beta q_{j-1}. */
    for (int pass = 0; pass < 2; pass++)
      for (size_t i = 0; i <= j; i++) {
        const double *qi = ws->basis + i * cols;
        double c = dot(qi, z, cols);
        for (size_t t = 0; t < cols; t++) z[t] -= c * qi[t];
      }
    double beta = sqrt(dot(z, z, cols));
    ws->beta[j] = beta;
    j++;
    double theta2;
    int info = tridiag_top(ws, j, &theta, &theta2, s);
    if (info != 0)
      return stabi_fail(STAB_ELAPACK, "Lanczos: dstev failed with info %d at step %zu", info, j);
    if (theta <= 0.0 && beta == 0.0) {
      if (warm && j == 1) { /* the warm vector fell in the null space: start again cold */
        warm = 0;
        j = 0;
        cold_start(ws->basis, cols, p->seed);
        continue;
      }
      theta = 0.0; /* the zero matrix */
      err = 0.0;
      break;
    }
    /* the residual norm of the Ritz pair: some eigenvalue lies within it (Bauer-Fike) */
    double e = beta * fabs(s[j - 1]);
    err = sigma_rel(e, theta);
    /* beta tiny: the Krylov space is invariant and theta exact. */
    if ((err <= p->tol && !to_the_end) || beta <= 64 * DBL_EPSILON * theta || j == cols) break;
    if (j == kdim) { /* explicit restart from the Ritz vector */
      ritz_vector(ws, j, s, cols, z);
      memcpy(ws->basis, z, cols * sizeof *z);
      j = 0;
      continue;
    }
    double *next = ws->basis + j * cols;
    for (size_t t = 0; t < cols; t++) next[t] = z[t] / beta;
  }
  out->passes = k;
  out->sigma = sqrt(fmax(theta, 0.0));
  out->rel_err = err;
  out->converged = err <= p->tol;
  if (v && j > 0) {
    ritz_vector(ws, j, s, cols, z);
    memcpy(v, z, cols * sizeof *v);
  }
  return STAB_OK;
}

/* ---- exact: dgesvd on an f64 copy ---- */

static stab_status exact(stab_spectral_workspace *ws, const float *a, const float *b, size_t rows,
                         size_t cols, size_t ld, stab_sigma_result *out) {
  double *c = ws->copy;
  double bad = 0.0;
  for (size_t i = 0; i < rows; i++)
    for (size_t t = 0; t < cols; t++) {
      double e = b ? (double)a[i * ld + t] - (double)b[i * ld + t] : (double)a[i * ld + t];
      bad += e * 0.0; /* NaN for NaN or Inf, else 0 */
      c[i * cols + t] = e;
    }
  out->passes = 1;
  if (isnan(bad)) {
    out->nonfinite = 1;
    return STAB_OK;
  }
  /* Row-major rows x cols is column-major cols x rows: the transpose, same singular values. */
  lapack_int m = (lapack_int)cols, n = (lapack_int)rows;
  lapack_int lwork = ws->lwork;
  double q = 0.0;
  if (LAPACKE_dgesvd_work(LAPACK_COL_MAJOR, 'N', 'N', m, n, c, m, ws->sv, NULL, 1, NULL, 1, &q,
                          -1) == 0 && (lapack_int)q < lwork)
    lwork = (lapack_int)q;
  lapack_int info = LAPACKE_dgesvd_work(LAPACK_COL_MAJOR, 'N', 'N', m, n, c, m, ws->sv, NULL, 1,
                                        NULL, 1, ws->gwork, lwork);
  if (info != 0)
    return stabi_fail(STAB_ELAPACK, "exact sigma: dgesvd failed with info %d on %zu x %zu",
                      (int)info, rows, cols);
  out->sigma = ws->sv[0];
  out->rel_err = 0.0;
  out->converged = 1;
  return STAB_OK;
}

stab_status stab_spectral_norm(stab_spectral_workspace *ws, const float *a, const float *b,
                               size_t rows, size_t cols, size_t ld, double *v,
                               stab_sigma_result *out) {
  if (!ws || !a || !out)
    return stabi_fail(STAB_EINVAL, "stab_spectral_norm: %s is NULL",
                      !ws ? "ws" : !a ? "a" : "out");
  memset(out, 0, sizeof *out);
  out->sigma = NAN;
  out->rel_err = NAN;
  if (ld == 0) ld = cols;
  if (rows == 0 || cols == 0 || ld < cols || !stabi_mul_fits(rows - 1, ld))
    return stabi_fail(STAB_EDIM, "stab_spectral_norm: %zu x %zu with row stride %zu is invalid",
                      rows, cols, ld);
  if (rows > ws->max_rows || cols > ws->max_cols)
    return stabi_fail(STAB_EDIM,
                      "stab_spectral_norm: %zu x %zu does not fit the workspace (%zu x %zu)",
                      rows, cols, ws->max_rows, ws->max_cols);
  switch (ws->params.method) {
  case STAB_SPECTRAL_POWER: power(ws, a, b, rows, cols, ld, v, out); return STAB_OK;
  case STAB_SPECTRAL_LANCZOS: return lanczos(ws, a, b, rows, cols, ld, v, out);
  case STAB_SPECTRAL_EXACT: return exact(ws, a, b, rows, cols, ld, out);
  }
  return stabi_fail(STAB_EINVAL, "stab_spectral_norm: unknown method");
}

stab_status stab_sigma(const float *a, size_t rows, size_t cols, size_t ld,
                       const stab_spectral_params *params, double *v, stab_sigma_result *out) {
  stab_spectral_workspace *ws = NULL;
  stab_status st = stab_spectral_workspace_create(rows, cols, params, &ws);
  if (st == STAB_OK) st = stab_spectral_norm(ws, a, NULL, rows, cols, ld, v, out);
  stab_spectral_workspace_free(ws);
  return st;
}
