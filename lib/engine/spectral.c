/* spectral.c — sigma(A) and sigma(A - B) of stored matrices (f32; F16 and BF16 through tiles): block Lanczos and power iteration
 * on the Gram matrix G = A^T A (one pass over A per step, gram_pass.c), warm-started from the
 * previous top right singular vector, and LAPACK dgesvd as the exact reference. One concern,
 * the estimate of sigma and its honest error, past 800 lines: the method's reasons are here.
 *
 * Method. Block Lanczos with blocks of BLOCK = 4 vectors, full reorthogonalisation, an
 * explicit restart from the 4 leading Ritz vectors when the basis (krylov_dim, 128) is full.
 * One pass applies G to the whole block. The block is what separates near-equal top values:
 * a Ritz value settles on s2 when the start vectors' components along the top two singular
 * vectors are nearly parallel, which is far less likely with 4 random vectors than with 2.
 * Block 2 did so on 4 of 256 seeds of a 512 x 128 matrix with s1/s2 = 1.0014 (the failure of
 * a TinyLlama v_proj: actual error 1.4e-3, reported below 1e-3); block 4 on none.
 *
 * Error estimate (relative, on sigma = sqrt(lambda_max(G)); d(sigma)/sigma = d(lambda)/(2 lambda)):
 * the residual bound r / (2 theta), theta the top Ritz value and r its residual norm: some
 * eigenvalue of G lies within r of theta (Bauer-Fike). It is not a proof that the eigenvalue
 * is the top one: nothing in a Krylov space bounds the distance to an eigenvalue it has not
 * seen yet, and the block above is what makes that rare. Two tighter estimates were tried and
 * dropped for reporting less than the actual error: Kato-Temple, r^2 / (theta_1 - theta_2)
 * (it needs a lower bound on the gap, which Ritz values do not give: above tol 33 times in
 * 400), and extrapolating theta's last rises as a geometric series (x8, confirmed over two
 * passes: 21 passes instead of 23 on a Gaussian 4096^2 at tol 1e-3, but on the bench's own
 * 4096^2, s1/s2 = 1.0014, at tol 2e-3 it reported 1.15e-3 for an actual 1.50e-3: theta sat
 * on s2 and its rises had collapsed). On Gaussians the residual bound overshoots the actual
 * error 10-100x (the Ritz vector mixes eigenvectors whose eigenvalues are all near lambda_max).
 * What holds is measured: harness/bench --accuracy counts, per family of matrices, how often
 * the actual error exceeds the reported one (docs/lab/performance.md).
 * Cost: at tol 1e-3, a Gaussian 4096^2 takes 23-32 passes depending on the matrix (block 2
 * with the same bound: 24-41), each one pass over A carrying the four vectors
 * (block_product).
 *
 * Warm starts. The monitor starts from last step's top right singular vector: the block is
 * that vector and the cold start's vectors 1 .. 3. The warm vector's Ritz pair can meet tol in
 * one pass whichever singular vector it lies along: the top one, or the second when the top
 * two swapped places since the last step. Nothing the warm pair shows tells the two apart (a
 * start along v2 is an eigenvector to rounding, and the random vectors' products differ by
 * about (s1 - s2) / cols between the two cases), and the residual bound proves only that SOME
 * value is near. Trusting it reported 4e-6 for an actual 9e-2 (s1/s2 = 1.1, a start along v2
 * to 1e-6; 1e-3 actual at 1.001 from v2 plus 1e-2 noise). So a warm start also asks the random
 * part of the block, the second Ritz pair: the best direction the random vectors found beside
 * the warm one. It must have converged as a cold start's top pair does, r2 <= 2 tol2 theta2
 * with tol2 = max(tol, WARM_TRUST_TOL); its interval [theta2 - r2, theta2 + r2] then holds the
 * top of what the warm vector missed, as a cold start's holds sigma_max, so lambda_max <=
 * max(theta + r, theta2 + r2) and the claim is max(r, theta2 + r2 - theta) / (2 theta)
 * (warm_err). A larger hidden value either shows as a second pair still moving or overtakes
 * the warm pair and becomes the top one. The block is 4 wide, as cold: with one random vector
 * (block 2) the second pair is what block 2's top pair was for a cold start, fooled 4 times in
 * 256. WARM_TRUST_TOL 1e-2: the swapped starts of check_spectral, 432 of them, none above the
 * reported error at 1e-2 or 3e-3, one at 3e-2. What it costs: the second pair's convergence,
 * which the warm vector cannot shorten; on a Gaussian the bulk below sigma_max is dense, so
 * a warm start costs 0.5-0.8 of a cold start's passes (a cold start waits for its top pair to
 * tol, the warm one for its second to 1e-2), more than the 1 pass a warm start took when it
 * trusted the warm pair alone (docs/lab/performance.md has the figures). The random vectors
 * are the cold start's (its seeds), so a warm estimate is a function of the matrix and v alone,
 * the same bits for any thread count, as a cold one.
 * Ritz values are lower bounds of sigma. */
#include "engine/engine.h"

#include <float.h>
#include <lapacke.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Matrices with at most this many columns get their Gram matrix formed exactly. */
#define SMALL_COLS 32

/* Lanczos block size: vectors carried by one pass (the kernels take 1, 2 or 4). */
#define BLOCK 4

struct stab_spectral_workspace {
  stab_spectral_params params;
  size_t max_rows, max_cols;
  size_t kdim;      /* Lanczos basis vectors held: a multiple of BLOCK, >= 2 BLOCK */
  size_t edim;      /* order of the largest projected eigenproblem: max(kdim, SMALL_COLS) */
  double *partial;  /* chunk accumulators, stabi_chunk_count(max_rows, max_cols) * BLOCK * max_cols */
  double *x, *y;    /* BLOCK * max_cols each */
  double *basis;    /* Lanczos: edim * max_cols */
  double *h;        /* the projected matrix Q^T G Q, kdim x kdim */
  double *e, *w, *z, *ework; /* the projected matrix's copy (or Jacobi's matrix), values, BLOCK
                                vectors, work */
  lapack_int *eiwork, *eifail; /* dstebz's and dstein's integer work */
  double *bq;                   /* Jacobi's vectors */
  lapack_int elwork, eliwork;
  double *copy, *sv, *gwork;     /* exact: f64 matrix, singular values, dgesvd work */
  lapack_int lwork;
  stabi_tiles tiles;             /* f32 tiles of 16-bit rows, one pair per thread */
  float *whole;                  /* a small 16-bit matrix (and B) as f32: 2 * whole_floats, made
                                    when first needed (stab_layer_metrics' path: STABI_WHOLE_FLOATS), or
                                    beforehand, as large as the matrices will be (the monitor's:
                                    stabi_spectral_reserve_whole) */
  size_t whole_floats;           /* floats of each half of whole */
  stabi_pass_reduce reduce;      /* stab_spectral_norm_reduced's hook; all zero otherwise */
};


stab_spectral_params stab_spectral_default_params(void) {
  stab_spectral_params p;
  p.method = STAB_SPECTRAL_LANCZOS;
  p.tol = 1e-3;
  p.max_passes = 1000;
  p.krylov_dim = 128;
  p.threads = 0;
  p.seed = 0x5eed;
  return p;
}

static void free_buffers(stab_spectral_workspace *ws) {
  free(ws->partial); free(ws->x); free(ws->y); free(ws->basis); free(ws->h);
  free(ws->e); free(ws->w); free(ws->z); free(ws->ework); free(ws->eiwork); free(ws->eifail); free(ws->bq);
  free(ws->copy); free(ws->sv); free(ws->gwork); free(ws->tiles.buf); free(ws->whole);
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
  size_t nchunks = stabi_chunk_count(r, c);
  n.partial = alloc_doubles(stabi_mul(nchunks, BLOCK * c), &failed); /* one block per chunk */
  n.x = alloc_doubles(BLOCK * c, &failed); /* a block of vectors; power and small_gram use 2 */
  n.y = alloc_doubles(BLOCK * c, &failed);
  /* a pair of tiles for each thread a pass may use (never more than its chunks); the exact
   * mode converts its rows through the first */
  int slots = stabi_pool_threads(ws->params.threads);
  if ((size_t)slots > nchunks) slots = (int)nchunks;
  n.tiles.floats = stabi_tile_floats(c);
  if (!n.tiles.floats) failed = 1;
  n.tiles.slots = slots;
  if (stabi_mul_fits(n.tiles.floats, 2 * (size_t)slots) &&
      !(n.tiles.buf = malloc(n.tiles.floats * 2 * (size_t)slots * sizeof(float))))
    failed = 1;
  if (ws->params.method == STAB_SPECTRAL_LANCZOS) {
    size_t k = stabi_krylov_basis(&ws->params);
    k = k < 2 * BLOCK ? 2 * BLOCK : k / BLOCK * BLOCK; /* whole blocks, two at least */
    n.kdim = k;
    n.edim = k > SMALL_COLS ? k : SMALL_COLS;
    n.basis = alloc_doubles(stabi_mul(n.edim, c), &failed);
    n.h = alloc_doubles(k * k, &failed);
    n.e = alloc_doubles(n.edim * n.edim, &failed);
    n.w = alloc_doubles(n.edim, &failed);
    n.z = alloc_doubles(BLOCK * n.edim, &failed);
    n.elwork = 13 * (lapack_int)n.edim; /* top_eigen_dense: 13 n doubles, 5 n integers */
    n.eliwork = 5 * (lapack_int)n.edim;
    if (!failed) {
      n.ework = alloc_doubles((size_t)n.elwork, &failed);
      n.bq = alloc_doubles(n.edim * n.edim, &failed);
      if (!(n.eiwork = calloc((size_t)n.eliwork, sizeof *n.eiwork))) failed = 1;
      if (!(n.eifail = calloc(n.edim, sizeof *n.eifail))) failed = 1;
    }
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
  n.whole = ws->whole; /* kept: sized for the matrices, not for the workspace's sides */
  n.whole_floats = ws->whole_floats;
  ws->whole = NULL;
  free_buffers(ws);
  *ws = n;
  return STAB_OK;
}

/* Room in ws->whole for two 16-bit matrices of n elements as f32 (n <= STABI_WHOLE_FLOATS). */
static int whole_room(stab_spectral_workspace *ws, size_t n) {
  if (n <= ws->whole_floats && ws->whole) return 1;
  float *w = malloc(2 * n * sizeof(float));
  if (!w) return 0;
  free(ws->whole);
  ws->whole = w;
  ws->whole_floats = n;
  return 1;
}

stab_status stabi_spectral_reserve_whole(stab_spectral_workspace *ws, size_t rows, size_t cols) {
  const size_t n = stabi_mul(rows, cols);
  if (!n || n > STABI_WHOLE_FLOATS || ws->params.method == STAB_SPECTRAL_EXACT || whole_room(ws, n)) return STAB_OK;
  return stabi_fail(STAB_ENOMEM, "spectral workspace: cannot allocate a %zu x %zu 16-bit matrix as f32", rows,
                    cols);
}

stab_status stab_spectral_workspace_create(size_t max_rows, size_t max_cols,
                                           const stab_spectral_params *params,
                                           stab_spectral_workspace **out) {
  if (!out) return stabi_fail(STAB_EINVAL, "stab_spectral_workspace_create: out is NULL");
  *out = NULL;
  /* the largest matrix must be one that could exist: then no buffer size below overflows */
  size_t ld = max_cols;
  stab_status st = stabi_check_extent("stab_spectral_workspace_create", "max_rows x max_cols",
                                      max_rows, max_cols, &ld, NULL);
  if (st != STAB_OK) return st;
  stab_spectral_params p = params ? *params : stab_spectral_default_params();
  st = stabi_spectral_check(&p, "stab_spectral_workspace_create");
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
  size_t d = (stabi_chunk_count(ws->max_rows, ws->max_cols) + 2) * BLOCK * ws->max_cols;
  d += ws->edim * ws->max_cols + ws->kdim * ws->kdim + ws->edim * (2 * ws->edim + 1 + BLOCK) +
       (size_t)ws->elwork;
  d += ((size_t)ws->eliwork + ws->edim) * sizeof(lapack_int) / sizeof(double) + 1;
  if (ws->copy) d += ws->max_rows * ws->max_cols + ws->max_cols + ws->max_rows + (size_t)ws->lwork;
  return d * sizeof(double) + ws->tiles.floats * 2 * (size_t)ws->tiles.slots * sizeof(float) +
         ws->whole_floats * 2 * sizeof(float) + sizeof *ws;
}

/* ---- small vector helpers (f64) ---- */

/* Eight running sums in a fixed order: the same result from every build, and eight
 * independent add chains. With one chain (an omp simd reduction, two lanes wide on
 * baseline x86-64) each dot waited on the add latency: dots took 29% of a one-pass
 * estimate of a 64x4096 matrix and 5% of a cold 4096x4096 one (perf, single thread). */
static double dot(const double *a, const double *b, size_t n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
    s4 += a[i + 4] * b[i + 4];
    s5 += a[i + 5] * b[i + 5];
    s6 += a[i + 6] * b[i + 6];
    s7 += a[i + 7] * b[i + 7];
  }
  double t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
  for (; i < n; i++) t += a[i] * b[i];
  return t;
}

static void scale(double *a, double s, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) a[i] *= s;
}

/* y -= c x */
static void axpy_sub(double *y, double c, const double *x, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) y[i] -= c * x[i];
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

static void power(stab_spectral_workspace *ws, const stabi_src *a, size_t rows, size_t cols,
                  double *v, stab_sigma_result *out) {
  const stab_spectral_params *p = &ws->params;
  double *x = ws->x, *y = ws->y;
  int warm = start_vector(x, v, cols, p->seed);
  double theta = 0.0, err = INFINITY;
  int k = 0;
  while (k < p->max_passes) {
    theta = stabi_gram_apply(a, rows, cols, x, y, ws->partial, &ws->tiles, p->threads, 1, p->tol < STAB_SPECTRAL_F32_TOL_MIN);
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
    /* the residual r = ||y - theta x|| of x: some eigenvalue lies within r of theta
     * (Bauer-Fike). Formed from its components, not as sqrt(yy - theta^2): that difference
     * cancels to 0 once r / theta is below about 1e-8 (f64), which claimed an exact answer
     * (rel_err 0, converged) at any tolerance below that. */
    double rr = 0.0;
    for (size_t i = 0; i < cols; i++) {
      double d = y[i] - theta * x[i];
      rr += d * d;
    }
    err = sigma_rel(sqrt(rr), theta);
    scale(y, 1.0 / sqrt(yy), cols);
    memcpy(x, y, cols * sizeof *x);
    if (err <= p->tol) break;
  }
  out->passes = k;
  if (out->nonfinite) return;
  out->sigma = sqrt(theta);
  out->rel_err = stabi_pass_rel_err(err, theta, p->tol);
  out->converged = err <= p->tol;
  if (v) memcpy(v, x, cols * sizeof *v);
}

/* ---- block Lanczos (block size 4) ---- */

/* The largest eigenpair of a small dense symmetric n x n matrix g (row-major, n <= SMALL_COLS)
 * by cyclic Jacobi rotations: accurate to rounding, and no LAPACK call (see below for why that
 * matters). a and vec: n^2 doubles of scratch; the eigenvector is returned in vec[0..n). */
static double jacobi_top(const double *g, size_t n, double *a, double *vec) {
  double *V = vec + 0; /* columns are eigenvectors; copied to the front at the end */
  memcpy(a, g, n * n * sizeof *a);
  memset(V, 0, n * n * sizeof *V);
  for (size_t i = 0; i < n; i++) V[i * n + i] = 1.0;
  for (int sweep = 0; sweep < 60; sweep++) {
    double off = 0.0, diag = 0.0;
    for (size_t i = 0; i < n; i++) {
      diag += a[i * n + i] * a[i * n + i];
      for (size_t j = i + 1; j < n; j++) off += a[i * n + j] * a[i * n + j];
    }
    if (off <= DBL_EPSILON * DBL_EPSILON * diag || off == 0.0) break;
    for (size_t p = 0; p < n; p++)
      for (size_t q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (apq == 0.0) continue;
        double th = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        double t = (th >= 0.0 ? 1.0 : -1.0) / (fabs(th) + sqrt(th * th + 1.0));
        double c = 1.0 / sqrt(t * t + 1.0), sn = t * c;
        for (size_t k = 0; k < n; k++) { /* columns p and q */
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - sn * akq;
          a[k * n + q] = sn * akp + c * akq;
        }
        for (size_t k = 0; k < n; k++) { /* rows p and q */
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - sn * aqk;
          a[q * n + k] = sn * apk + c * aqk;
        }
        for (size_t k = 0; k < n; k++) {
          double vkp = V[k * n + p], vkq = V[k * n + q];
          V[k * n + p] = c * vkp - sn * vkq;
          V[k * n + q] = sn * vkp + c * vkq;
        }
      }
  }
  size_t best = 0;
  for (size_t i = 1; i < n; i++)
    if (a[i * n + i] > a[best * n + best]) best = i;
  double theta = a[best * n + best];
  for (size_t k = 0; k < n; k++) a[k] = V[k * n + best];
  memcpy(vec, a, n * sizeof *vec);
  return theta;
}

/* x = sum_i s_i q_i over n basis vectors. */
static void combine(const double *basis, const double *s, size_t n, size_t cols, double *x) {
  memset(x, 0, cols * sizeof *x);
  for (size_t i = 0; i < n; i++) {
    const double *q = basis + i * cols;
    for (size_t c = 0; c < cols; c++) x[c] += s[i] * q[c];
  }
}

/* Orthogonalises z against q[0..n) twice ("twice is enough"); adds the coefficients into
 * coef[i * stride] when coef is not NULL. */
static void orthogonalise(const double *q, size_t n, size_t cols, double *z, double *coef,
                          size_t stride) {
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < n; i++) {
      const double *qi = q + i * cols;
      double c = dot(qi, z, cols);
      axpy_sub(z, c, qi, cols);
      if (coef) coef[i * stride] += c;
    }
}

/* One classical Gram-Schmidt sweep of the nz vectors z[0..nz) (cols apart) against q[lo..n):
 * z_v -= sum_i (q_i . z_v) q_i, the coefficients added into coef[i * stride + v] when coef is
 * not NULL. nz <= BLOCK; cc: (n - lo) x nz doubles of scratch. The sweep goes over the columns
 * in segments of ORTH_SEG, within which the block's segment stays in L1 while the basis streams
 * past: first every coefficient (stabi_dot4x4, four basis vectors at a time, summed over the
 * segments in order), then every update (stabi_sub4). One basis vector at a time (modified
 * Gram-Schmidt) read the whole block, 128 KiB at 4096 columns, from L2 twice for each basis
 * vector: 42.8 ms of the 170 of a cold 4096^2 estimate with scalar loops, 23.5 with SIMD ones. */
#define ORTH_SEG 512
static void gram_schmidt_sweep(const double *q, size_t lo, size_t n, size_t cols, double *z, size_t nz,
                               double *coef, size_t stride, double *cc) {
  const size_t k = n - lo;
  memset(cc, 0, k * nz * sizeof *cc);
  for (size_t t0 = 0; t0 < cols; t0 += ORTH_SEG) {
    const size_t len = cols - t0 < ORTH_SEG ? cols - t0 : ORTH_SEG;
    const double *y[4];
    for (size_t v = 0; v < 4; v++) y[v] = z + (v < nz ? v : 0) * cols + t0; /* past nz: repeats */
    for (size_t i0 = 0; i0 < k; i0 += 4) {
      const size_t ni = k - i0 < 4 ? k - i0 : 4;
      const double *x[4];
      for (size_t a = 0; a < 4; a++) x[a] = q + (lo + i0 + (a < ni ? a : 0)) * cols + t0;
      double s[4][4];
      stabi_dot4x4(x, y, len, s);
      for (size_t a = 0; a < ni; a++)
        for (size_t v = 0; v < nz; v++) cc[(i0 + a) * nz + v] += s[a][v];
    }
  }
  for (size_t t0 = 0; t0 < cols; t0 += ORTH_SEG) {
    const size_t len = cols - t0 < ORTH_SEG ? cols - t0 : ORTH_SEG;
    double *zs[4];
    for (size_t v = 0; v < 4; v++) zs[v] = z + (v < nz ? v : 0) * cols + t0; /* only v < nz written */
    for (size_t i0 = 0; i0 < k; i0 += 4) {
      const size_t ni = k - i0 < 4 ? k - i0 : 4;
      const double *x[4];
      double c[4][4] = {{0.0}}; /* past ni: 0, so the repeated vector subtracts nothing */
      for (size_t a = 0; a < 4; a++) x[a] = q + (lo + i0 + (a < ni ? a : 0)) * cols + t0;
      for (size_t a = 0; a < ni; a++)
        for (size_t v = 0; v < nz; v++) c[a][v] = cc[(i0 + a) * nz + v];
      stabi_sub4(x, c, zs, nz, len);
    }
  }
  if (coef)
    for (size_t i = 0; i < k; i++)
      for (size_t v = 0; v < nz; v++) coef[(lo + i) * stride + v] += cc[i * nz + v];
}

/* Orthogonalises the nz vectors z[0..nz) (cols apart) against q[0..n): a sweep against
 * q[lo..n), then one against the whole basis, and while a whole sweep took a vector below
 * 1/sqrt(2) of its norm (what was removed was not small against what is left, so its rounding
 * is not either: Daniel, Gragg, Kaufman and Stewart's test), another, at most twice more.
 * Coefficients are added into coef[i * stride + v] when coef is not NULL; cc: n x nz doubles.
 * lo = 0 is "twice is enough" on the whole basis. Lanczos passes lo = the previous block's
 * start: G q of the current block lies, to rounding and the f32 runs' error, in the span of the
 * previous, current and next blocks, so the first sweep need only remove those two blocks'
 * large components and the whole sweep after it removes the rest, which is small. Two whole
 * sweeps read the basis (n vectors of cols doubles) four times a pass, 32 n bytes a column,
 * more than a 256-row f32 layer's pass reads (1024) once n passes 32: the orthogonalisation's
 * instructions fell by 30-36% (callgrind, docs/lab/performance.md). */
static void orthogonalise_block(const double *q, size_t lo, size_t n, size_t cols, double *z, size_t nz,
                                double *coef, size_t stride, double *cc) {
  gram_schmidt_sweep(q, lo, n, cols, z, nz, coef, stride, cc);
  for (int extra = 0; extra < 3; extra++) {
    double before[BLOCK];
    for (size_t v = 0; v < nz; v++) before[v] = dot(z + v * cols, z + v * cols, cols);
    gram_schmidt_sweep(q, 0, n, cols, z, nz, coef, stride, cc);
    int again = 0;
    for (size_t v = 0; v < nz; v++) again |= dot(z + v * cols, z + v * cols, cols) < 0.5 * before[v];
    if (!again || extra == 2) break;
  }
}

/* Normalises z, or, when it is negligible (below tiny), replaces it by a random vector
 * orthogonal to q[0..n) and to also[0..na) (unit vectors) so that the basis keeps growing (or
 * by zero once the space is full). Returns the norm z had. */
static double normalise_or_replace(const double *q, size_t n, const double *also, size_t na,
                                   size_t cols, double *z, double tiny, uint64_t seed) {
  double nz = sqrt(dot(z, z, cols));
  if (nz > tiny) {
    scale(z, 1.0 / nz, cols);
    return nz;
  }
  cold_start(z, cols, seed);
  for (int pass = 0; pass < 2; pass++) {
    orthogonalise(q, n, cols, z, NULL, 0);
    orthogonalise(also, na, cols, z, NULL, 0);
  }
  double nr = sqrt(dot(z, z, cols));
  if (nr > 1e-8) scale(z, 1.0 / nr, cols);
  else memset(z, 0, cols * sizeof *z);
  return 0.0;
}

static double block_product(stab_spectral_workspace *ws, const stabi_src *a, size_t rows,
                            size_t cols, const double *x, double *y, size_t bs, int f64);

/* Narrow matrices: the whole Gram matrix G = A^T A from cols/2 two-vector passes over unit
 * vectors, then its largest eigenvalue: exact, whatever the spectrum. */
static stab_status small_gram(stab_spectral_workspace *ws, const stabi_src *a, size_t rows,
                              size_t cols, double *v, stab_sigma_result *out) {
  double *g = ws->basis; /* cols x cols, row-major: the basis holds SMALL_COLS vectors or more */
  int k = 0;
  for (size_t j = 0; j < cols; j += 2) {
    int nv = j + 1 < cols ? 2 : 1;
    memset(ws->x, 0, 2 * cols * sizeof(double));
    ws->x[j] = 1.0;
    if (nv == 2) ws->x[cols + j + 1] = 1.0;
    double q = block_product(ws, a, rows, cols, ws->x, ws->y, (size_t)nv, 1);
    k++;
    if (!isfinite(q)) {
      out->nonfinite = 1;
      out->passes = k;
      return STAB_OK;
    }
    for (int c = 0; c < nv; c++)
      for (size_t i = 0; i < cols; i++) g[i * cols + j + (size_t)c] = ws->y[(size_t)c * cols + i];
  }
  double theta = jacobi_top(g, cols, ws->e, ws->bq);
  out->passes = k;
  out->sigma = sqrt(fmax(theta, 0.0));
  out->rel_err = 0.0;
  out->converged = 1;
  if (v) memcpy(v, ws->bq, cols * sizeof *v);
  return STAB_OK;
}

/* Matrices with at most this many rows (and more columns than rows) get the Gram matrix of the
 * other side, K = A A^T (rows x rows), formed exactly, and its largest eigenpair (top_eigen_dense): sigma
 * exact to rounding after one read of A. Block Lanczos on A^T A took 13-14 passes and 5.7 ms on
 * a 64 x 2048 attention head (mostly orthogonalising against a basis of 2048-long vectors), 14 ms
 * on a 128 x 4096 one; every attention layer measures 2 x heads such blocks. Above 128 rows
 * forming K costs more than the passes it replaces. */
#define FEW_ROWS 128

/* K = C C^T for the rows x cols f64 matrix C: the upper triangle (j >= i) into K[i * ks + j].
 * Blocks of 4 x 4 rows (stabi_dot4x4: 16 sums in registers, each element loaded once per
 * block instead of once per pair) over segments of 256 columns, so that a block's 8 rows
 * (16 KiB) stay in L1. */
static void gram_rows(const double *C, size_t rows, size_t cols, double *K, size_t ks) {
  enum { B = 4, SEG = 256 };
  for (size_t i = 0; i < rows; i++)
    for (size_t j = i; j < rows; j++) K[i * ks + j] = 0.0;
  for (size_t t0 = 0; t0 < cols; t0 += SEG) {
    const size_t t1 = cols - t0 < SEG ? cols : t0 + SEG;
    for (size_t i0 = 0; i0 < rows; i0 += B)
      for (size_t j0 = i0; j0 < rows; j0 += B) {
        const size_t ni = rows - i0 < B ? rows - i0 : B, nj = rows - j0 < B ? rows - j0 : B;
        if (ni == B && nj == B) {
          const double *x[B], *y[B];
          for (size_t r = 0; r < B; r++) {
            x[r] = C + (i0 + r) * cols + t0;
            y[r] = C + (j0 + r) * cols + t0;
          }
          double s[B][B];
          stabi_dot4x4(x, y, t1 - t0, s);
          for (size_t a = 0; a < B; a++)
            for (size_t b = 0; b < B; b++)
              if (j0 + b >= i0 + a) K[(i0 + a) * ks + j0 + b] += s[a][b];
        } else {
          for (size_t a = 0; a < ni; a++)
            for (size_t b = 0; b < nj; b++)
              if (j0 + b >= i0 + a)
                K[(i0 + a) * ks + j0 + b] += dot(C + (i0 + a) * cols + t0, C + (j0 + b) * cols + t0, t1 - t0);
        }
      }
  }
}

/* The want largest eigenpairs of the symmetric n x n matrix K (upper triangle, row stride ks;
 * n <= ws->edim, want <= BLOCK): values ascending in ws->w[0..*found), *found = min(want, n),
 * unit eigenvectors (n doubles each) in ws->z in the same order. Householder reduction to a
 * tridiagonal T = Q^T K Q (LAPACK's dsytd2, written here on rows so that its loops run over
 * contiguous memory), T's top values by bisection (dstebz), their vectors by inverse iteration
 * (dstein, which keeps a cluster's vectors orthogonal), each times Q. K is overwritten (the
 * reflectors are kept in its rows). No threaded BLAS is called: the dense LAPACK drivers woke
 * OpenBLAS's threads on every call, whose spinning took the cores from the pass (64 x 64: 410
 * us, 94 with one thread). dsbevx, used here before, cost more on the small matrices the monitor
 * solves every pass: on Lanczos's projected matrix (a band 7 wide) at n = 32, 66 us against
 * about 25; on an attention head's 64 x 64 Gram matrix, a band as wide as itself, 155 us
 * against 60-100. Returns LAPACK's info (-1: not the values asked for). */
static int top_eigen_dense(stab_spectral_workspace *ws, double *K, size_t ks, size_t n, size_t want,
                           size_t *found) {
  const size_t E = ws->edim;
  double *const d = ws->ework, *const e = d + E, *const tau = e + E, *const p = tau + E;
  double *const work = p + E; /* dstebz 4 n, then dstein 5 n */
  lapack_int *const iblock = ws->eiwork, *const isplit = iblock + E, *const iwork = isplit + E;
  for (size_t i = 0; i < n; i++) /* the lower triangle from the upper */
    for (size_t j = 0; j < i; j++) K[i * ks + j] = K[j * ks + i];
  for (size_t k = 0; k + 2 < n; k++) {
    double *const x = K + k * ks + k + 1; /* row k right of the diagonal: column k below it */
    const size_t m = n - k - 1;
    const double alpha = x[0];
    const double xn = dot(x + 1, x + 1, m - 1);
    if (xn == 0.0) { /* already reduced */
      tau[k] = 0.0;
      e[k] = alpha;
      continue;
    }
    const double beta = -copysign(sqrt(alpha * alpha + xn), alpha);
    tau[k] = (beta - alpha) / beta;
    const double sc = 1.0 / (alpha - beta);
    x[0] = 1.0; /* the reflector v, v_0 = 1 */
    for (size_t i = 1; i < m; i++) x[i] *= sc;
    e[k] = beta;
    double *const B = K + (k + 1) * ks + k + 1; /* the trailing m x m block, both triangles */
    /* p = tau B v as a sum of B's rows (B is symmetric): contiguous updates that vectorise,
     * where a dot per row waits on one chain of additions */
    memset(p, 0, m * sizeof *p);
    for (size_t i = 0; i < m; i++) {
      const double *b = B + i * ks;
      const double ti = tau[k] * x[i];
#pragma omp simd
      for (size_t j = 0; j < m; j++) p[j] += ti * b[j];
    }
    const double half = -0.5 * tau[k] * dot(p, x, m);
    for (size_t i = 0; i < m; i++) p[i] += half * x[i]; /* w = p - (tau/2)(p.v) v */
    for (size_t i = 0; i < m; i++) { /* B -= v w^T + w v^T */
      double *b = B + i * ks;
      const double xi = x[i], pi = p[i];
#pragma omp simd
      for (size_t j = 0; j < m; j++) b[j] -= xi * p[j] + pi * x[j];
    }
  }
  for (size_t k = 0; k < n; k++) d[k] = K[k * ks + k];
  if (n >= 2) e[n - 2] = K[(n - 2) * ks + n - 1];
  const size_t m = want < n ? want : n;
  lapack_int ln = (lapack_int)n, got = 0, nsplit = 0;
  lapack_int info = LAPACKE_dstebz_work('I', 'B', ln, 0.0, 0.0, ln - (lapack_int)m + 1, ln, 0.0, d, e, &got,
                                        &nsplit, ws->w, iblock, isplit, work, iwork);
  if (info != 0) return (int)info;
  if (got != (lapack_int)m) return -1;
  double *const z = ws->z;
  info = LAPACKE_dstein_work(LAPACK_COL_MAJOR, ln, d, e, got, ws->w, iblock, isplit, z, ln, work, iwork,
                             ws->eifail);
  if (info != 0) return (int)info;
  /* dstebz orders by split-off block (dstein wants that order): ascending overall here */
  for (size_t i = 1; i < m; i++)
    for (size_t j = i; j > 0 && ws->w[j - 1] > ws->w[j]; j--) {
      const double t = ws->w[j];
      ws->w[j] = ws->w[j - 1];
      ws->w[j - 1] = t;
      memcpy(p, z + j * n, n * sizeof *p);
      memcpy(z + j * n, z + (j - 1) * n, n * sizeof *p);
      memcpy(z + (j - 1) * n, p, n * sizeof *p);
    }
  for (size_t c = 0; c < m; c++) { /* u = H_0 H_1 ... H_{n-3} y */
    double *const u = z + c * n;
    for (size_t k = n >= 3 ? n - 2 : 0; k-- > 0;) {
      if (tau[k] == 0.0) continue;
      const double *v = K + k * ks + k + 1;
      axpy_sub(u + k + 1, tau[k] * dot(v, u + k + 1, n - k - 1), v, n - k - 1);
    }
  }
  *found = m;
  return 0;
}

/* The want largest Ritz pairs of block Lanczos's projected matrix Q^T G Q, held (upper triangle)
 * in h with row stride hs, n x n: as top_eigen_dense, on a copy (h grows pass by pass). The whole
 * matrix, not a band: entries farther than BLOCK from the diagonal would be 0 by the Krylov
 * relation, but are up to about 4e-8 of the scale with passes in f32 runs, the projections the
 * basis actually has. Every pass asks for the top two pairs only (the stopping rules need no
 * more); a restart asks for BLOCK: on the monitor's 256-wide matrices, where this solve took as
 * long as the pass itself, asking for 4 each pass made a step about 10% slower. */
static int top_ritz(stab_spectral_workspace *ws, const double *h, size_t hs, size_t n, size_t want,
                    size_t *found) {
  double *const c = ws->e; /* edim^2 doubles */
  for (size_t i = 0; i < n; i++) memcpy(c + i * n + i, h + i * hs + i, (n - i) * sizeof *c);
  return top_eigen_dense(ws, c, n, n, want, found);
}

/* A (rows x cols, rows <= FEW_ROWS, ws->edim and ws->kdim) as f64 into the basis, K = A A^T
 * into h (row stride kdim), the top eigenpair of K (top_eigen_dense), and v = A^T u / |A^T u|
 * the top right singular vector. */
static stab_status few_rows(stab_spectral_workspace *ws, const stabi_src *a, size_t rows,
                            size_t cols, double *v, stab_sigma_result *out) {
  double *c = ws->basis, *K = ws->h;
  const size_t M = ws->kdim;
  float *ra = ws->tiles.buf, *rb = ws->tiles.buf + ws->tiles.floats;
  double bad = 0.0;
  for (size_t i = 0; i < rows; i++) {
    const float *x = stabi_row_f32(a->a, a->at, a->ld, i, cols, ra);
    const float *y = a->b ? stabi_row_f32(a->b, a->bt, a->ld, i, cols, rb) : NULL;
    double *ci = c + i * cols;
    for (size_t t = 0; t < cols; t++) {
      double e = y ? (double)x[t] - (double)y[t] : (double)x[t];
      bad += e * 0.0; /* NaN for NaN or Inf, else 0 */
      ci[t] = e;
    }
  }
  out->passes = 1;
  if (isnan(bad)) {
    out->nonfinite = 1;
    return STAB_OK;
  }
  gram_rows(c, rows, cols, K, M);
  double top = 0.0;
  for (size_t i = 0; i < rows; i++) top = fmax(top, K[i * M + i]);
  if (top == 0.0) { /* the zero matrix */
    out->sigma = 0.0;
    out->rel_err = 0.0;
    out->converged = 1;
    return STAB_OK;
  }
  size_t found = 0;
  int info = top_eigen_dense(ws, K, M, rows, 1, &found);
  if (info != 0)
    return stabi_fail(STAB_ELAPACK, "sigma of %zu x %zu: dstebz/dstein failed with info %d", rows, cols, info);
  out->sigma = sqrt(fmax(ws->w[0], 0.0));
  out->rel_err = 0.0;
  out->converged = 1;
  if (v) {
    combine(c, ws->z, rows, cols, ws->x);
    double nn = dot(ws->x, ws->x, cols);
    if (nn > 0.0) {
      scale(ws->x, 1.0 / sqrt(nn), cols);
      memcpy(v, ws->x, cols * sizeof *v);
    }
  }
  return STAB_OK;
}

/* ||R s|| for the upper triangular bs x bs R. */
static double ritz_residual(const double R[BLOCK][BLOCK], const double *s, size_t bs) {
  double rr = 0.0;
  for (size_t i = 0; i < bs; i++) {
    double t = 0.0;
    for (size_t c = i; c < bs; c++) t += R[i][c] * s[c];
    rr += t * t;
  }
  return sqrt(rr);
}

/* The caller's sum over shards of a pass's products y (n doubles) and quadratic form q. A
 * failed sum gives NaN, which every estimate takes for a non-finite matrix and stops on at
 * once; the status is kept for stab_spectral_norm_reduced to return. */
static double reduce_shards(stabi_pass_reduce *r, double *y, size_t n, double q) {
  if (r->status != STAB_OK) return NAN;
  r->status = r->fn(r->ctx, y, n, &q);
  return r->status == STAB_OK ? q : NAN;
}

/* G times the bs vectors at x, into y (bs x cols each), in one pass over A (f64 arithmetic
 * when f64, else the kernels' f32 runs). Returns x_0^T G x_0. */
static double block_product(stab_spectral_workspace *ws, const stabi_src *a, size_t rows,
                            size_t cols, const double *x, double *y, size_t bs, int f64) {
  double q = stabi_gram_apply(a, rows, cols, x, y, ws->partial, &ws->tiles, ws->params.threads, (int)bs, f64);
  return ws->reduce.fn ? reduce_shards(&ws->reduce, y, bs * cols, q) : q;
}

/* The error a warm start may claim (relative, on sigma), from the top two Ritz pairs: theta
 * with its residual r, and theta2 (ws->w[found - 2], vector ws->z + (found - 2) n) with its
 * residual r2. The second pair stands for what the random vectors of the block have found
 * beside the warm vector. Once it has converged as a cold start's would at tol2 = max(tol,
 * WARM_TRUST_TOL) (r2 <= 2 tol2 theta2), its interval [theta2 - r2, theta2 + r2] is trusted to
 * hold the top of what the warm vector did not see, so sigma_max^2 <= max(theta + r, theta2 +
 * r2): the claim is max(r, theta2 + r2 - theta) / (2 theta). Before that the claim is infinite
 * (the estimate goes on). See "Warm starts" at the top of the file. */
#define WARM_TRUST_TOL 1e-2
static double warm_err(const stab_spectral_workspace *ws, const double R[BLOCK][BLOCK], size_t n,
                       size_t bs, size_t found, double r, double theta, double tiny, double tol) {
  if (found < 2) return INFINITY;
  const double theta2 = ws->w[found - 2];
  const double r2 = ritz_residual(R, ws->z + (found - 2) * n + n - bs, bs);
  const double tol2 = tol > WARM_TRUST_TOL ? tol : WARM_TRUST_TOL;
  if (!(r2 <= 2.0 * tol2 * theta2 || r2 <= tiny)) return INFINITY;
  const double above = theta2 + r2 - theta;
  return sigma_rel(above > r ? above : r, theta);
}

static stab_status lanczos(stab_spectral_workspace *ws, const stabi_src *a, size_t rows, size_t cols,
                           double *v, stab_sigma_result *out) {
  if (cols <= SMALL_COLS) return small_gram(ws, a, rows, cols, v, out);
  const stab_spectral_params *p = &ws->params;
  const size_t M = ws->kdim; /* a multiple of BLOCK, at least 2 BLOCK */
  double *const Q = ws->basis, *const H = ws->h, *const Z = ws->y;
  /* A matrix with few rows: exact, from the Gram matrix of the rows side, warm start or not.
   * A warm start took 1-3 passes here when it trusted the warm vector alone; honest (see "Warm
   * starts"), it takes more (7 on a Gaussian 64 x 400) than the one read this takes. */
  if (!ws->reduce.fn && rows < cols && rows <= FEW_ROWS && rows <= M)
    return few_rows(ws, a, rows, cols, v, out);
  /* A shard (stab_spectral_norm_reduced) holds some of the rows only. When the whole matrix
   * has at most SMALL_COLS rows, its Krylov space ends (theta exact) within rows + BLOCK basis
   * vectors, and the estimate runs to that end from a cold start, warm start or not: cheap, and
   * immune to the residual estimate being fooled (an honest warm start there took more passes,
   * 6-9 against 3-4). */
  const size_t g_rows = ws->reduce.fn ? ws->reduce.whole_rows : rows; /* rows of the whole matrix */
  const int to_the_end = ws->reduce.fn && g_rows + 2 * BLOCK <= M && g_rows <= SMALL_COLS;
  const int warm = to_the_end ? start_vector(Q, NULL, cols, p->seed) : start_vector(Q, v, cols, p->seed);
  /* The block: BLOCK vectors, from a warm start as from a cold one: the warm vector takes the
   * place of the first random vector, the other BLOCK - 1 are the cold start's (see "Warm
   * starts" above for why a warm start needs them and what it must ask of them). */
  const size_t bs = BLOCK;
  for (size_t c = 1; c < bs; c++) { /* the rest of the first block: random, orthonormal */
    double *q = Q + c * cols;
    cold_start(q, cols, p->seed + c);
    for (int pass = 0; pass < 2; pass++) orthogonalise(Q, c, cols, q, NULL, 0);
    scale(q, 1.0 / sqrt(dot(q, q, cols)), cols);
  }
  memset(H, 0, M * M * sizeof *H);
  size_t m = 0; /* the current block is basis vectors m .. m + bs - 1 */
  double theta = 0.0, err = INFINITY, scale_seen = 0.0;
  static const double one = 1.0;
  const double *ritz = NULL; /* coefficients of the top Ritz vector in the basis */
  size_t ritz_n = 0;
  int k = 0;
  while (k < p->max_passes) {
    double q0 = block_product(ws, a, rows, cols, Q + m * cols, Z, bs,
                              to_the_end || p->tol < STAB_SPECTRAL_F32_TOL_MIN);
    k++;
    int finite = isfinite(q0);
    for (size_t c = 0; c < bs; c++) finite = finite && isfinite(Z[c * cols]);
    if (!finite) {
      out->nonfinite = 1;
      out->passes = k;
      return STAB_OK;
    }
    /* Column m+c of H is Q^T G q_{m+c}: the coefficients of the full orthogonalisation. */
    /* ws->z (the Ritz vectors, remade below) is the coefficients' scratch */
    orthogonalise_block(Q, m >= bs ? m - bs : 0, m + bs, cols, Z, bs, H + m, M, ws->z);
    const size_t n = m + bs;
    for (size_t i = 0; i < n; i++) { /* not fmax, a libm call each */
      const double d = fabs(H[i * M + i]);
      scale_seen = d > scale_seen ? d : scale_seen;
    }
    const double tiny = 64 * DBL_EPSILON * scale_seen;
    /* QR of the remainder, Z = [z_0 .. z_B-1] R (R upper triangular): the coupling of this
     * block to the next, and what the Ritz residuals are made of. */
    double R[BLOCK][BLOCK] = {{0.0}};
    for (size_t c = 0; c < bs; c++) {
      double *z = Z + c * cols;
      const double before = dot(z, z, cols);
      for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < c; j++) {
          double d = dot(Z + j * cols, z, cols);
          axpy_sub(z, d, Z + j * cols, cols);
          R[j][c] += d;
        }
      /* z is orthogonal to the basis to rounding relative to its norm before the block's own
       * projections; when those cancelled most of it (the norm fell below 1/sqrt(2) of what
       * it was), that rounding is no longer small against z: orthogonalise it again. */
      if (c > 0 && dot(z, z, cols) < 0.5 * before) /* ws->z: scratch, as above */
        orthogonalise_block(Q, 0, n, cols, z, 1, NULL, 0, ws->z);
      R[c][c] = normalise_or_replace(Q, n, Z, c, cols, z, tiny,
                                     p->seed + bs * (uint64_t)(k + 1) + c);
    }
    size_t found = 0;
    int info = top_ritz(ws, H, M, n, 2, &found);
    if (info != 0) return stabi_fail(STAB_ELAPACK, "Lanczos: dstebz/dstein failed with info %d at %zu", info, n);
    theta = ws->w[found - 1];
    ritz = ws->z + (found - 1) * n;
    ritz_n = n;
    if (scale_seen == 0.0) { /* the zero matrix: the random block saw nothing either */
      theta = 0.0;
      err = 0.0;
      break;
    }
    /* The top Ritz pair's residual is Z R s_last (Z orthonormal, s_last the last bs
     * coefficients of its vector): its norm is ||R s_last||. */
    double r = ritz_residual(R, ritz + n - bs, bs);
    err = sigma_rel(r, theta);
    if (warm && n >= cols) err = 0.0; /* the basis holds every direction: theta is exact */
    else if (warm) err = warm_err(ws, R, n, bs, found, r, theta, tiny, p->tol);
    if ((err <= p->tol && !to_the_end) || (r <= tiny && !warm) || n >= cols) break;
    if (n + bs > M) {
      /* Explicit restart from the bs leading Ritz vectors (orthonormal), the top one first. */
      info = top_ritz(ws, H, M, n, bs, &found);
      if (info != 0) return stabi_fail(STAB_ELAPACK, "Lanczos: dstebz/dstein failed with info %d at %zu", info, n);
      for (size_t i = 0; i < found; i++)
        combine(Q, ws->z + (found - 1 - i) * n, n, cols, ws->x + i * cols);
      memcpy(Q, ws->x, found * cols * sizeof *Q);
      memset(H, 0, M * M * sizeof *H);
      m = 0;
      ritz = &one; /* the top Ritz vector is now q_0 */
      ritz_n = 1;
      continue;
    }
    memcpy(Q + n * cols, Z, bs * cols * sizeof *Q);
    m = n;
  }
  out->passes = k;
  out->sigma = sqrt(fmax(theta, 0.0));
  out->rel_err = stabi_pass_rel_err(err, theta, p->tol);
  out->converged = err <= p->tol;
  if (v && ritz) {
    combine(Q, ritz, ritz_n, cols, ws->x);
    double nn = dot(ws->x, ws->x, cols);
    if (nn > 0.0) {
      scale(ws->x, 1.0 / sqrt(nn), cols);
      memcpy(v, ws->x, cols * sizeof *v);
    }
  }
  return STAB_OK;
}

/* ---- exact: dgesvd on an f64 copy ---- */

static stab_status exact(stab_spectral_workspace *ws, const stabi_src *src, size_t rows, size_t cols,
                         stab_sigma_result *out) {
  double *c = ws->copy;
  double bad = 0.0;
  float *ra = ws->tiles.buf, *rb = ws->tiles.buf + ws->tiles.floats;
  for (size_t i = 0; i < rows; i++) {
    const float *a = stabi_row_f32(src->a, src->at, src->ld, i, cols, ra);
    const float *b = src->b ? stabi_row_f32(src->b, src->bt, src->ld, i, cols, rb) : NULL;
    for (size_t t = 0; t < cols; t++) {
      double e = b ? (double)a[t] - (double)b[t] : (double)a[t];
      bad += e * 0.0; /* NaN for NaN or Inf, else 0 */
      c[i * cols + t] = e;
    }
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
  stab_status st = stabi_check_matrix("stab_spectral_norm", "a", a, rows, cols, &ld);
  if (st != STAB_OK) return st;
  const stabi_src src = {a, b, STAB_DTYPE_F32, STAB_DTYPE_F32, ld};
  return stabi_spectral_norm_src(ws, &src, rows, cols, v, out);
}

stab_status stabi_spectral_norm_src(stab_spectral_workspace *ws, const stabi_src *m, size_t rows,
                                    size_t cols, double *v, stab_sigma_result *out) {
  memset(out, 0, sizeof *out);
  out->sigma = NAN;
  out->rel_err = NAN;
  if (rows > ws->max_rows || cols > ws->max_cols)
    return stabi_fail(STAB_EDIM,
                      "stab_spectral_norm: %zu x %zu does not fit the workspace (%zu x %zu)",
                      rows, cols, ws->max_rows, ws->max_cols);
  stabi_src whole;
  if (!stabi_src_is_f32(m) && rows * cols <= STABI_WHOLE_FLOATS && ws->params.method != STAB_SPECTRAL_EXACT &&
      (rows * cols <= ws->whole_floats || whole_room(ws, STABI_WHOLE_FLOATS))) {
    float *wa = ws->whole, *wb = m->b ? ws->whole + ws->whole_floats : NULL;
    stabi_tile_f32(m->a, m->at, m->ld, 0, rows, cols, wa);
    if (wb) stabi_tile_f32(m->b, m->bt, m->ld, 0, rows, cols, wb);
    whole = (stabi_src){wa, wb, STAB_DTYPE_F32, STAB_DTYPE_F32, cols};
    m = &whole; /* without the memory (malloc failed): the tiles, slower, the same numbers */
  }
  switch (ws->params.method) {
  case STAB_SPECTRAL_POWER: power(ws, m, rows, cols, v, out); return STAB_OK;
  case STAB_SPECTRAL_LANCZOS: return lanczos(ws, m, rows, cols, v, out);
  case STAB_SPECTRAL_EXACT: return exact(ws, m, rows, cols, out);
  }
  return stabi_fail(STAB_EINVAL, "stab_spectral_norm: unknown method");
}

stab_status stab_sigma(const float *a, size_t rows, size_t cols, size_t ld,
                       const stab_spectral_params *params, double *v, stab_sigma_result *out) {
  static const char who[] = "stab_sigma";
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  memset(out, 0, sizeof *out);
  out->sigma = out->rel_err = NAN;
  /* the caller's arguments, checked as the caller named them, before the workspace is sized */
  stab_status st = stabi_check_matrix(who, "a", a, rows, cols, &ld);
  if (st == STAB_OK && params) st = stabi_spectral_check(params, who);
  if (st != STAB_OK) return st;
  stab_spectral_workspace *ws = NULL;
  st = stab_spectral_workspace_create(rows, cols, params, &ws);
  if (st == STAB_OK) st = stab_spectral_norm(ws, a, NULL, rows, cols, ld, v, out);
  stab_spectral_workspace_free(ws);
  return st;
}

/* The same Lanczos as stab_spectral_norm on G = sum_k A_k^T A_k, this process holding A = A_k:
 * every pass's local products are summed over the shards by the caller's reduce. The hook
 * lives in the workspace for the call's length only, so the single-process path is the one
 * above with one test of a NULL pointer per pass. */
stab_status stab_spectral_norm_reduced(stab_spectral_workspace *ws, const float *a, size_t rows,
                                       size_t cols, size_t ld, size_t whole_rows,
                                       stab_spectral_reduce_fn reduce, void *ctx, double *v,
                                       stab_sigma_result *out) {
  static const char who[] = "stab_spectral_norm_reduced";
  if (!ws || !a || !reduce || !out)
    return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who,
                      !ws ? "ws" : !a ? "a" : !reduce ? "reduce" : "out");
  memset(out, 0, sizeof *out);
  out->sigma = NAN;
  out->rel_err = NAN;
  if (ws->params.method != STAB_SPECTRAL_LANCZOS)
    return stabi_fail(STAB_EINVAL, "%s: the workspace's method must be Lanczos", who);
  stab_status st = stabi_check_matrix(who, "a", a, rows, cols, &ld);
  if (st != STAB_OK) return st;
  if (whole_rows < rows)
    return stabi_fail(STAB_EDIM, "%s: whole_rows %zu is less than the shard's %zu rows", who,
                      whole_rows, rows);
  const stabi_src src = {a, NULL, STAB_DTYPE_F32, STAB_DTYPE_F32, ld};
  ws->reduce = (stabi_pass_reduce){reduce, ctx, whole_rows, STAB_OK};
  st = stabi_spectral_norm_src(ws, &src, rows, cols, v, out);
  const stab_status rs = ws->reduce.status;
  ws->reduce = (stabi_pass_reduce){0};
  if (st == STAB_OK && rs != STAB_OK) {
    out->sigma = out->rel_err = NAN;
    out->nonfinite = 0;
    return rs;
  }
  return st;
}
