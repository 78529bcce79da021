/* check_spectral.c — stab_sigma and stab_spectral_norm (LANCZOS, POWER, EXACT) against
 * LAPACKE_dgesvd in f64 on the same f32 numbers, over matrix families with known spectral
 * structure; sigma(A - B), strided blocks, warm starts, thread-count invariance, NaN and
 * invalid arguments. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lapacke.h>

#include "stabmeter.h"
#include "testutil.h"

static const char *method_name(stab_spectral_method m) {
  return m == STAB_SPECTRAL_LANCZOS ? "LANCZOS" : m == STAB_SPECTRAL_POWER ? "POWER" : "EXACT";
}

static stab_spectral_params params_for(stab_spectral_method method) {
  stab_spectral_params p = stab_spectral_default_params();
  p.method = method;
  return p;
}

/* The result of an iterative (or exact) estimate checked against the f64 reference `ref`.
 * a is rows x cols with row stride ld; v the returned vector (iterative modes) or NULL. */
static void check_result(const char *what, stab_spectral_method method, const stab_sigma_result *res,
                         double ref, const float *a, size_t rows, size_t cols, size_t ld,
                         const double *v, double tol) {
  ck_assert_msg(res->nonfinite == 0, "%s %s: nonfinite = %d on a finite matrix", what,
                method_name(method), res->nonfinite);
  ck_assert_msg(isfinite(res->rel_err) && res->rel_err >= 0.0, "%s %s: rel_err = %g", what,
                method_name(method), res->rel_err);
  if (ref == 0.0) {
    ck_assert_msg(res->sigma == 0.0 && res->rel_err == 0.0,
                  "%s %s: zero matrix gave sigma %g, rel_err %g (expected 0, 0)", what,
                  method_name(method), res->sigma, res->rel_err);
    return;
  }
  if (method == STAB_SPECTRAL_EXACT) {
    TU_ASSERT_REL(res->sigma, ref, tu_tol_exact(rows, cols), "%s EXACT", what);
    ck_assert_msg(res->rel_err == 0.0, "%s EXACT: rel_err = %g, expected 0", what, res->rel_err);
    ck_assert_msg(res->converged == 1, "%s EXACT: converged = %d", what, res->converged);
    return;
  }
  TU_ASSERT_REL(res->sigma, ref, tol, "%s %s (passes %d, rel_err %g)", what, method_name(method),
                res->passes, res->rel_err);
  /* Ritz values are lower bounds of sigma up to the passes' rounding */
  TU_ASSERT_LE(res->sigma, ref, tu_round_slack(rows, cols), "%s %s lower bound", what,
               method_name(method));
  ck_assert_msg(res->converged == 1, "%s %s: not converged after %d passes (rel_err %g)", what,
                method_name(method), res->passes, res->rel_err);
  ck_assert_msg(res->rel_err <= tol, "%s %s: converged but rel_err %g > tol %g", what,
                method_name(method), res->rel_err, tol);
  ck_assert_msg(res->passes >= 1 && res->passes <= 1000, "%s %s: passes = %d", what,
                method_name(method), res->passes);
  if (v) {
    /* v is the unit top right singular vector estimate: ||A v|| reproduces sigma */
    TU_ASSERT_REL(tu_norm2(v, cols), 1.0, 1e-10, "%s %s: ||v||", what, method_name(method));
    double *av = tu_doubles(rows);
    tu_matvec(a, rows, cols, ld, v, av);
    TU_ASSERT_REL(tu_norm2(av, rows), res->sigma, tol, "%s %s: ||A v|| vs sigma", what,
                  method_name(method));
    free(av);
  }
}

/* ---- the matrix families --------------------------------------------------------- */

typedef enum {
  F_GAUSS,       /* param: std */
  F_LOWRANK,     /* param: noise; rank */
  F_DIAG_LIN,    /* diag (i + 1) / n */
  F_DIAG_RAND,   /* diag Gaussian, mixed signs */
  F_DIAG_DOUBLE, /* diag 5, 5, 1/3, 1/4 ...: a double top singular value */
  F_ORTHO,       /* Q of QR of a Gaussian */
  F_HOUSE,       /* Householder reflection */
  F_RANK1,
  F_ZERO
} family;

typedef struct {
  const char *name;
  family fam;
  size_t rows, cols, ld; /* ld 0: cols; ld > cols pads with NaN */
  double param;
  size_t rank;
} spec_case;

static const spec_case cases[] = {
    {"gauss 200x200", F_GAUSS, 200, 200, 0, 1.0, 0},
    {"gauss 512x384", F_GAUSS, 512, 384, 0, 1.0, 0},
    {"gauss tall 300x40", F_GAUSS, 300, 40, 0, 1.0, 0},
    {"gauss wide 40x300", F_GAUSS, 40, 300, 0, 1.0, 0},
    {"gauss 100x60 in ld 80 (NaN padding)", F_GAUSS, 100, 60, 80, 1.0, 0},
    {"gauss x 1e-30 60x40", F_GAUSS, 60, 40, 0, 1e-30, 0},
    {"gauss x 1e30 60x40", F_GAUSS, 60, 40, 0, 1e30, 0},
    {"low rank 5 + noise 300x200", F_LOWRANK, 300, 200, 0, 0.01, 5},
    {"low rank 3 + noise wide 60x400", F_LOWRANK, 60, 400, 0, 0.01, 3},
    {"rank 2 exactly 90x60", F_LOWRANK, 90, 60, 0, 0.0, 2},
    {"diag (i+1)/64 64x64", F_DIAG_LIN, 64, 64, 0, 0.0, 0},
    {"diag random signs 50x80", F_DIAG_RAND, 50, 80, 0, 0.0, 0},
    {"diag double top 40x40", F_DIAG_DOUBLE, 40, 40, 0, 0.0, 0},
    {"orthogonal 96x96 (dgeqrf/dorgqr)", F_ORTHO, 96, 96, 0, 0.0, 0},
    {"orthonormal columns 300x40", F_ORTHO, 300, 40, 0, 0.0, 0},
    {"orthonormal rows 40x300", F_ORTHO, 40, 300, 0, 0.0, 0},
    {"householder 80x80", F_HOUSE, 80, 80, 0, 0.0, 0},
    {"rank 1 120x70", F_RANK1, 120, 70, 0, 0.0, 0},
    {"1x1", F_GAUSS, 1, 1, 0, 1.0, 0},
    {"row 1x50", F_GAUSS, 1, 50, 0, 1.0, 0},
    {"column 50x1", F_GAUSS, 50, 1, 0, 1.0, 0},
    {"zero 30x20", F_ZERO, 30, 20, 0, 0.0, 0},
    {"zero 1x1", F_ZERO, 1, 1, 0, 0.0, 0},
};
enum { NCASES = sizeof cases / sizeof cases[0] };

/* Builds case c (seeded by its index); returns the buffer and sets *ld. */
static float *make_case(const spec_case *c, uint64_t seed, size_t *ld) {
  size_t rows = c->rows, cols = c->cols;
  *ld = c->ld ? c->ld : cols;
  float *a = tu_matrix_padded(rows, cols, *ld);
  tu_rng r;
  tu_rng_init(&r, seed);
  size_t k = rows < cols ? rows : cols;
  double *diag = tu_doubles(k);
  switch (c->fam) {
  case F_GAUSS:
    tu_fill_gauss(a, rows, cols, *ld, c->param, &r);
    break;
  case F_LOWRANK:
    tu_fill_lowrank(a, rows, cols, *ld, c->rank, c->param, &r);
    break;
  case F_DIAG_LIN:
    for (size_t i = 0; i < k; i++) diag[i] = (double)(i + 1) / (double)k;
    tu_fill_diag(a, rows, cols, *ld, diag);
    break;
  case F_DIAG_RAND:
    for (size_t i = 0; i < k; i++) diag[i] = tu_rng_gauss(&r);
    tu_fill_diag(a, rows, cols, *ld, diag);
    break;
  case F_DIAG_DOUBLE:
    for (size_t i = 0; i < k; i++) diag[i] = i < 2 ? 5.0 : 1.0 / (double)(i + 1);
    tu_fill_diag(a, rows, cols, *ld, diag);
    break;
  case F_ORTHO:
    tu_fill_orthonormal(a, rows, cols, *ld, &r);
    break;
  case F_HOUSE:
    tu_fill_householder(a, rows, *ld, &r);
    break;
  case F_RANK1:
    tu_fill_rank1(a, rows, cols, *ld, &r);
    break;
  case F_ZERO:
    tu_fill_diag(a, rows, cols, *ld, diag);  // diag is all zeros
    break;
  }
  free(diag);
  return a;
}

/* Loop index = case * 3 + method. */
START_TEST(test_sigma_families) {
  const spec_case *c = &cases[_i / 3];
  stab_spectral_method method = (stab_spectral_method)(_i % 3);
  size_t ld;
  float *a = make_case(c, 1000 + (uint64_t)_i / 3, &ld);
  double ref = ref_sigma(a, c->rows, c->cols, ld);
  if (c->fam == F_ZERO) ck_assert(ref == 0.0);
  ck_assert_msg(isfinite(ref), "%s: reference sigma %g (the NaN padding leaked into it?)", c->name, ref);

  stab_spectral_params p = params_for(method);
  double *v = tu_doubles(c->cols);
  stab_sigma_result res;
  memset(&res, 0, sizeof res);
  TU_ASSERT_OK(stab_sigma(a, c->rows, c->cols, ld, &p, v, &res), "%s %s", c->name,
               method_name(method));
  check_result(c->name, method, &res, ref, a, c->rows, c->cols, ld,
               method == STAB_SPECTRAL_EXACT || c->fam == F_ZERO ? NULL : v, p.tol);

  /* v may also be NULL */
  stab_sigma_result res2;
  memset(&res2, 0, sizeof res2);
  TU_ASSERT_OK(stab_sigma(a, c->rows, c->cols, ld, &p, NULL, &res2), "%s %s, v NULL", c->name,
               method_name(method));
  check_result(c->name, method, &res2, ref, a, c->rows, c->cols, ld, NULL, p.tol);
  free(v);
  free(a);
}
END_TEST

/* Few rows (rows <= 128, rows < cols): a cold or warm start forms the rows-side Gram matrix
 * and is exact to rounding in one pass, near-equal top values included; 129 rows is Lanczos.
 * Against dgesvd in f64, and ||A v|| = sigma. */
START_TEST(test_few_rows_exact) {
  static const struct { size_t rows, cols, ld; int pair; } shapes[] = {
      {1, 300, 0, 0}, {33, 500, 0, 0}, {64, 2048, 0, 0}, {64, 256, 300, 1},
      {100, 101, 0, 0}, {128, 4096, 0, 1}, {129, 300, 0, 0}};
  tu_rng r;
  tu_rng_init(&r, 77);
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    const size_t rows = shapes[k].rows, cols = shapes[k].cols;
    const size_t ld = shapes[k].ld ? shapes[k].ld : cols;
    float *a = tu_floats(rows * ld);
    tu_fill_gauss(a, rows, cols, ld, 1.0, &r);
    if (shapes[k].pair) /* the top two values 1e-4 apart: rows 0 and 1 scaled up */
      for (size_t t = 0; t < cols; t++) {
        a[t] *= 30.0f;
        a[ld + t] *= 30.003f;
      }
    const double ref = ref_sigma(a, rows, cols, ld);
    stab_spectral_params p = stab_spectral_default_params();
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_OK(stab_spectral_workspace_create(rows, cols, &p, &ws), "%zux%zu", rows, cols);
    double *v = tu_doubles(cols);
    stab_sigma_result res;
    TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, rows, cols, ld, v, &res), "%zux%zu cold", rows, cols);
    double *av = tu_doubles(rows);
    tu_matvec(a, rows, cols, ld, v, av);
    if (rows <= 128) {
      ck_assert_msg(res.passes == 1 && res.rel_err == 0.0 && res.converged,
                    "%zux%zu cold: passes %d, rel_err %g (expected 1, 0)", rows, cols, res.passes, res.rel_err);
      TU_ASSERT_REL(res.sigma, ref, 1e-12, "%zux%zu cold: exact sigma", rows, cols);
      TU_ASSERT_REL(tu_norm2(v, cols), 1.0, 1e-12, "%zux%zu cold: ||v||", rows, cols);
      TU_ASSERT_REL(tu_norm2(av, rows), ref, 1e-11, "%zux%zu cold: ||A v|| vs sigma", rows, cols);
    } else {
      ck_assert_msg(res.passes > 1 && res.rel_err > 0.0, "%zux%zu cold: passes %d, rel_err %g: Lanczos expected",
                    rows, cols, res.passes, res.rel_err);
      check_result("129 rows", STAB_SPECTRAL_LANCZOS, &res, ref, a, rows, cols, ld, v, p.tol);
    }
    /* from that vector, warm: exact again with few rows, else Lanczos, a lower bound within tol */
    stab_sigma_result warm;
    TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, rows, cols, ld, v, &warm), "%zux%zu warm", rows, cols);
    TU_ASSERT_REL(warm.sigma, ref, rows <= 128 ? 1e-12 : p.tol, "%zux%zu warm", rows, cols);
    TU_ASSERT_LE(warm.sigma, ref, tu_round_slack(rows, cols), "%zux%zu warm lower bound", rows, cols);
    if (rows <= 128)
      ck_assert_msg(warm.passes == 1 && warm.rel_err == 0.0, "%zux%zu warm: passes %d, rel_err %g (expected 1, 0)",
                    rows, cols, warm.passes, warm.rel_err);
    /* A - B the same way, B = A / 2 on the first rows: sigma(A - B) by dgesvd of the difference */
    if (rows <= 128) {
      float *b = tu_floats(rows * ld);
      memcpy(b, a, rows * ld * sizeof *b);
      for (size_t t = 0; t < cols; t++) b[t] *= 0.5f;
      stab_sigma_result d;
      TU_ASSERT_OK(stab_spectral_norm(ws, a, b, rows, cols, ld, NULL, &d), "%zux%zu A - B", rows, cols);
      TU_ASSERT_REL(d.sigma, ref_sigma_diff(a, b, rows, cols, ld), 1e-12, "%zux%zu A - B exact", rows, cols);
      ck_assert_msg(d.passes == 1 && d.rel_err == 0.0, "%zux%zu A - B: passes %d", rows, cols, d.passes);
      /* NaN in one element: nonfinite, STAB_OK */
      a[(rows - 1) * ld + cols / 2] = NAN;
      TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, rows, cols, ld, NULL, &d), "%zux%zu NaN", rows, cols);
      ck_assert_msg(d.nonfinite == 1 && isnan(d.sigma), "%zux%zu NaN: nonfinite %d sigma %g", rows, cols,
                    d.nonfinite, d.sigma);
      free(b);
    }
    stab_spectral_workspace_free(ws);
    free(av);
    free(v);
    free(a);
  }
}
END_TEST

/* Few rows whose Gram matrix K = A A^T is already (block) diagonal, so that the reduction to
 * a tridiagonal finds columns with nothing below their first entry (no reflector), and whose
 * top value is repeated (a cluster for the eigenvector): orthogonal rows, one nonzero each, and
 * a matrix of two blocks. Exact against dgesvd; ||A v|| = sigma checks the vector. */
START_TEST(test_few_rows_reduced_gram) {
  enum { ROWS = 6, COLS = 40 };
  static const float scales[][ROWS] = {{1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 0.0f}, /* orthogonal rows, top twice */
                                       {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 2.5f},  /* one nonzero row, last */
                                       {4.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}}; /* blocks, below */
  for (size_t c = 0; c < sizeof scales / sizeof scales[0]; c++) {
    float *a = tu_floats(ROWS * COLS);
    for (size_t i = 0; i < ROWS; i++) a[i * COLS + 3 * i] = scales[c][i];
    if (c == 2) /* rows 1 and 2 share columns (a 2 x 2 block of K), rows 3..5 stay orthogonal */
      for (size_t t = 20; t < 30; t++) {
        a[1 * COLS + t] = 0.25f * (float)(t - 19);
        a[2 * COLS + t] = 0.5f - 0.125f * (float)(t - 19);
      }
    const double ref = ref_sigma(a, ROWS, COLS, COLS);
    stab_spectral_params p = stab_spectral_default_params();
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_OK(stab_spectral_workspace_create(ROWS, COLS, &p, &ws), "case %zu", c);
    double *v = tu_doubles(COLS), *av = tu_doubles(ROWS);
    stab_sigma_result res;
    TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, ROWS, COLS, COLS, v, &res), "case %zu", c);
    ck_assert_msg(res.passes == 1 && res.rel_err == 0.0, "case %zu: passes %d, rel_err %g (exact expected)", c,
                  res.passes, res.rel_err);
    TU_ASSERT_REL(res.sigma, ref, 1e-12, "case %zu: exact sigma", c);
    tu_matvec(a, ROWS, COLS, COLS, v, av);
    TU_ASSERT_REL(tu_norm2(v, COLS), 1.0, 1e-12, "case %zu: ||v||", c);
    TU_ASSERT_REL(tu_norm2(av, ROWS), ref, 1e-12, "case %zu: ||A v|| vs sigma", c);
    stab_spectral_workspace_free(ws);
    free(av);
    free(v);
    free(a);
  }
}
END_TEST

/* ---- sigma(A - B) and blocks ------------------------------------------------------- */

static void check_diff(const char *what, const float *a, const float *b, size_t rows, size_t cols,
                       size_t ld) {
  double ref = ref_sigma_diff(a, b, rows, cols, ld);
  for (int m = 0; m < 3; m++) {
    stab_spectral_params p = params_for((stab_spectral_method)m);
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_OK(stab_spectral_workspace_create(rows, cols, &p, &ws), "%s %s", what,
                 method_name((stab_spectral_method)m));
    ck_assert_ptr_nonnull(ws);
    stab_sigma_result res;
    memset(&res, 0, sizeof res);
    double *v = tu_doubles(cols);
    TU_ASSERT_OK(stab_spectral_norm(ws, a, b, rows, cols, ld, v, &res), "%s %s", what,
                 method_name((stab_spectral_method)m));
    check_result(what, (stab_spectral_method)m, &res, ref, a, rows, cols, ld, NULL, p.tol);
    if (m != STAB_SPECTRAL_EXACT && ref > 0.0) {
      /* v is a top right singular vector estimate of A - B */
      float *d = tu_floats(rows * cols);
      double *dd = tu_to_double(a, b, rows, cols, ld, 0), *av = tu_doubles(rows);
      for (size_t i = 0; i < rows * cols; i++) d[i] = (float)dd[i];
      tu_matvec(d, rows, cols, cols, v, av);
      TU_ASSERT_REL(tu_norm2(av, rows), res.sigma, 1e-3 + 1e-6, "%s %s: ||(A-B) v||", what,
                    method_name((stab_spectral_method)m));
      free(d);
      free(dd);
      free(av);
    }
    free(v);
    stab_spectral_workspace_free(ws);
  }
}

/* n x k (row-major) with orthonormal columns: Q of the QR of a Gaussian, in f64. */
static double *orthonormal_columns(size_t n, size_t k, tu_rng *r) {
  double *q = tu_doubles(n * k), *tau = tu_doubles(k);
  for (size_t i = 0; i < n * k; i++) q[i] = tu_rng_gauss(r);
  ck_assert_int_eq(LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)k, q, (lapack_int)k, tau), 0);
  ck_assert_int_eq(LAPACKE_dorgqr(LAPACK_ROW_MAJOR, (lapack_int)n, (lapack_int)k, (lapack_int)k, q,
                                  (lapack_int)k, tau), 0);
  free(tau);
  return q;
}

/* The failure of issue 13 (a TinyLlama v_proj, s1/s2 = 1.0014): theta settled on s2 before
 * s1 showed, and the residual bound, true of *some* singular value, was reported for s1.
 * W = U diag(s) V^T with a known spectrum, dense below the top like a trained layer's
 * (s_i = 1 - 0.6 ((i - 1) / k)^(2/3) for i >= 1) and s_0 = 1.0014 s_1. Over many seeds
 * the reported rel_err must bound the actual one. Block-2 Lanczos with the residual bound
 * failed on 4 of seeds 0..255, 3 of them in this range (65, 109, 121: actual 1.4e-3, the
 * distance to s_1, reported 6.2e-4 to 8.3e-4). */
START_TEST(test_near_equal_top_pair) {
  enum { ROWS = 512, COLS = 128, K = 128, SEED0 = 60, SEEDS = 72 };
  float *a = tu_floats((size_t)ROWS * COLS);
  double s[K];
  for (size_t i = 1; i < K; i++) s[i] = 1.0 - 0.6 * pow((double)(i - 1) / K, 2.0 / 3.0);
  s[0] = 1.0014 * s[1];
  int bad = 0;
  double worst = 0.0;
  for (int seed = SEED0; seed < SEED0 + SEEDS; seed++) {
    tu_rng r;
    tu_rng_init(&r, 1300 + (uint64_t)seed);
    double *u = orthonormal_columns(ROWS, K, &r), *v = orthonormal_columns(COLS, K, &r);
    for (size_t i = 0; i < ROWS; i++)
      for (size_t j = 0; j < COLS; j++) {
        double t = 0.0;
        for (size_t l = 0; l < K; l++) t += u[i * K + l] * s[l] * v[j * K + l];
        a[i * COLS + j] = (float)t;
      }
    stab_spectral_params p = stab_spectral_default_params();
    p.seed = (uint64_t)seed;
    stab_sigma_result res;
    ck_assert_int_eq(stab_sigma(a, ROWS, COLS, COLS, &p, NULL, &res), STAB_OK);
    /* the closed form is of the f64 matrix; rounding W to f32 moves sigma by ~1e-9 */
    double actual = fabs(s[0] - res.sigma) / s[0];
    if (actual > res.rel_err + 1e-8) {
      bad++;
      fprintf(stderr, "near-equal pair, seed %d: actual %.3e > reported %.3e (%d passes)\n", seed,
              actual, res.rel_err, res.passes);
    }
    if (actual > worst) worst = actual;
    ck_assert_msg(res.converged, "seed %d: not converged (%d passes)", seed, res.passes);
    free(u);
    free(v);
  }
  ck_assert_msg(bad == 0, "near-equal top pair: actual error above the reported one on %d of %d "
                "seeds (worst actual %.3e)", bad, SEEDS, worst);
  free(a);
}
END_TEST

START_TEST(test_sigma_diff) {
  tu_rng r;
  tu_rng_init(&r, 2001);
  /* after = before + a small step, inside a NaN-padded buffer */
  size_t rows = 150, cols = 90, ld = 100;
  float *a = tu_matrix_padded(rows, cols, ld), *b = tu_matrix_padded(rows, cols, ld);
  tu_fill_gauss(b, rows, cols, ld, 0.1, &r);
  memcpy(a, b, rows * ld * sizeof *a);
  tu_add_relative_noise(a, rows, cols, ld, 1e-2, &r);
  check_diff("small step 150x90 ld 100", a, b, rows, cols, ld);
  check_diff("small step reversed", b, a, rows, cols, ld);
  free(a);
  free(b);

  /* two unrelated matrices, tall and wide */
  rows = 200, cols = 30;
  a = tu_floats(rows * cols);
  b = tu_floats(rows * cols);
  tu_fill_gauss(a, rows, cols, cols, 1.0, &r);
  tu_fill_lowrank(b, rows, cols, cols, 2, 0.1, &r);
  check_diff("independent 200x30", a, b, rows, cols, cols);
  check_diff("independent 30x200", a, b, cols, rows, rows);
  free(a);
  free(b);
}
END_TEST

START_TEST(test_sigma_diff_same_is_zero) {
  tu_rng r;
  tu_rng_init(&r, 2002);
  float *a = tu_floats(40 * 30);
  tu_fill_gauss(a, 40, 30, 30, 1.0, &r);
  for (int m = 0; m < 3; m++) {
    stab_spectral_params p = params_for((stab_spectral_method)m);
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_OK(stab_spectral_workspace_create(40, 30, &p, &ws));
    stab_sigma_result res;
    memset(&res, 0xff, sizeof res);
    TU_ASSERT_OK(stab_spectral_norm(ws, a, a, 40, 30, 30, NULL, &res));
    ck_assert_msg(res.sigma == 0.0 && res.rel_err == 0.0 && res.nonfinite == 0,
                  "%s: sigma(A - A) = %g, rel_err %g, nonfinite %d", method_name((stab_spectral_method)m),
                  res.sigma, res.rel_err, res.nonfinite);
    stab_spectral_workspace_free(ws);
  }
  free(a);
}
END_TEST

/* A block of a bigger matrix (ld > cols) reads only the block. */
START_TEST(test_sigma_block_of_bigger) {
  enum { BR = 200, BC = 150, R0 = 20, C0 = 30, ROWS = 100, COLS = 80 };
  tu_rng r;
  tu_rng_init(&r, 2003);
  float *big = tu_floats(BR * BC);
  tu_fill_gauss(big, BR, BC, BC, 1.0, &r);
  /* make the surroundings dominate: a block-blind reader gets a very different sigma */
  for (size_t i = 0; i < BR; i++)
    for (size_t j = 0; j < BC; j++)
      if (i < R0 || i >= R0 + ROWS || j < C0 || j >= C0 + COLS) big[i * BC + j] *= 50.0f;
  const float *blk = big + R0 * BC + C0;
  double ref = ref_sigma(blk, ROWS, COLS, BC);
  for (int m = 0; m < 3; m++) {
    stab_spectral_params p = params_for((stab_spectral_method)m);
    stab_sigma_result res;
    double *v = tu_doubles(COLS);
    TU_ASSERT_OK(stab_sigma(blk, ROWS, COLS, BC, &p, v, &res));
    check_result("block 100x80 of 200x150", (stab_spectral_method)m, &res, ref, blk, ROWS, COLS, BC,
                 m == STAB_SPECTRAL_EXACT ? NULL : v, p.tol);
    free(v);
  }
  free(big);
}
END_TEST

/* ---- parameters -------------------------------------------------------------------- */

START_TEST(test_tight_tolerance) {
  tu_rng r;
  tu_rng_init(&r, 3001);
  float *a = tu_floats(200 * 200);
  tu_fill_gauss(a, 200, 200, 200, 1.0, &r);
  double ref = ref_sigma(a, 200, 200, 200);
  stab_spectral_params p = params_for(STAB_SPECTRAL_LANCZOS);
  p.tol = 1e-8;
  stab_sigma_result res;
  TU_ASSERT_OK(stab_sigma(a, 200, 200, 200, &p, NULL, &res));
  check_result("gauss 200x200 tol 1e-8", STAB_SPECTRAL_LANCZOS, &res, ref, a, 200, 200, 200, NULL,
               1e-8);
  free(a);

  a = tu_floats(300 * 200);
  tu_fill_lowrank(a, 300, 200, 200, 4, 0.01, &r);
  ref = ref_sigma(a, 300, 200, 200);
  p = params_for(STAB_SPECTRAL_POWER);
  p.tol = 1e-6;
  TU_ASSERT_OK(stab_sigma(a, 300, 200, 200, &p, NULL, &res));
  check_result("low rank 300x200 tol 1e-6", STAB_SPECTRAL_POWER, &res, ref, a, 300, 200, 200, NULL,
               1e-6);
  free(a);
}
END_TEST

/* Power iteration's error estimate at a tolerance below 1e-8: it must stay an honest bound of
 * what the returned vector shows (its residual, computed here in f64 from the matrix), never 0
 * for a vector that is not exact. sqrt(||Gx||^2 - theta^2) cancelled to 0 there and stopped
 * the iteration with rel_err 0. */
START_TEST(test_power_error_below_1e8) {
  tu_rng r;
  tu_rng_init(&r, 3005);
  const size_t rows = 60, cols = 40;
  float *a = tu_floats(rows * cols);
  tu_fill_gauss(a, rows, cols, cols, 1.0, &r);
  stab_spectral_params p = params_for(STAB_SPECTRAL_POWER);
  p.tol = 1e-12;
  p.max_passes = 5000;
  double *v = tu_doubles(cols), *av = tu_doubles(rows), *y = tu_doubles(cols);
  stab_sigma_result res;
  TU_ASSERT_OK(stab_sigma(a, rows, cols, cols, &p, v, &res));
  tu_matvec(a, rows, cols, cols, v, av);
  tu_matvec_t(a, rows, cols, cols, av, y);
  double theta = 0, rr = 0, vv = tu_norm2(v, cols);
  for (size_t i = 0; i < cols; i++) theta += v[i] * y[i];
  theta /= vv * vv;
  for (size_t i = 0; i < cols; i++) rr += (y[i] - theta * v[i]) * (y[i] - theta * v[i]) / (vv * vv);
  double shown = 0.5 * sqrt(rr) / theta; /* the bound the returned vector gives */
  ck_assert_msg(res.rel_err > 0.0, "rel_err 0 after %d passes, the vector's residual says %g", res.passes,
                shown);
  ck_assert_msg(res.rel_err >= 0.5 * shown - 1e-15, "rel_err %g below the vector's own bound %g", res.rel_err,
                shown);
  ck_assert_msg(res.converged && res.rel_err <= p.tol, "not converged: rel_err %g after %d passes", res.rel_err,
                res.passes);
  TU_ASSERT_REL(res.sigma, ref_sigma(a, rows, cols, cols), 1e-12, "sigma (passes %d)", res.passes);
  free(a), free(v), free(av), free(y);
}
END_TEST

/* The passes' precision follows tol. At the default tol they are f32 runs, whose rounding a
 * Krylov space that ends (rank 1: the first block spans it) does not see: rel_err must still
 * cover the actual error, and says at least 1e-7 (the floor stabmeter.h documents). Below
 * STAB_SPECTRAL_F32_TOL_MIN they are f64: sigma to 1e-12 against dgesvd, on a matrix whose
 * rows span six decades (where the f32 runs were 1.7e-8 off). */
START_TEST(test_precision_follows_tol) {
  tu_rng r;
  tu_rng_init(&r, 3011);
  const size_t rows = 256, cols = 2048;
  float *a = tu_floats(rows * cols);
  tu_fill_lowrank(a, rows, cols, cols, 1, 0.0, &r);
  double ref = ref_sigma(a, rows, cols, cols);
  stab_spectral_params p = params_for(STAB_SPECTRAL_LANCZOS);
  stab_sigma_result res;
  TU_ASSERT_OK(stab_sigma(a, rows, cols, cols, &p, NULL, &res));
  double err = tu_rel(res.sigma, ref);
  ck_assert_msg(err <= res.rel_err + 1e-15 && res.rel_err >= 1e-7 && res.rel_err <= p.tol,
                "rank 1, tol %g: actual error %.3g, reported %.3g (passes %d)", p.tol, err, res.rel_err,
                res.passes);

  tu_fill_gauss(a, rows, cols, cols, 1.0, &r);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) a[i * cols + j] = (float)(a[i * cols + j] * pow(1e-6, (double)i / rows));
  ref = ref_sigma(a, rows, cols, cols);
  p.tol = 1e-9;
  TU_ASSERT_OK(stab_sigma(a, rows, cols, cols, &p, NULL, &res));
  ck_assert_msg(p.tol < STAB_SPECTRAL_F32_TOL_MIN, "tol %g is not below the f32 floor %g", p.tol,
                STAB_SPECTRAL_F32_TOL_MIN);
  check_result("rows scaled 1 .. 1e-6, tol 1e-9", STAB_SPECTRAL_LANCZOS, &res, ref, a, rows, cols, cols, NULL,
               1e-9);
  TU_ASSERT_REL(res.sigma, ref, 1e-12, "rows scaled 1 .. 1e-6, tol 1e-9: f64 passes (%d)", res.passes);
  free(a);
}
END_TEST

START_TEST(test_not_converged) {
  tu_rng r;
  tu_rng_init(&r, 3002);
  float *a = tu_floats(200 * 200);
  tu_fill_gauss(a, 200, 200, 200, 1.0, &r);
  double ref = ref_sigma(a, 200, 200, 200);
  for (int m = 0; m < 2; m++) {
    stab_spectral_params p = params_for((stab_spectral_method)m);
    p.tol = 1e-10;
    p.max_passes = 3;
    stab_sigma_result res;
    TU_ASSERT_OK(stab_sigma(a, 200, 200, 200, &p, NULL, &res));
    ck_assert_msg(res.converged == 0, "%s: converged with 3 passes at tol 1e-10 (rel_err %g)",
                  method_name(p.method), res.rel_err);
    ck_assert_msg(res.passes >= 1 && res.passes <= 3, "%s: passes %d with max_passes 3",
                  method_name(p.method), res.passes);
    ck_assert_msg(isfinite(res.rel_err) && res.rel_err > p.tol, "%s: rel_err %g",
                  method_name(p.method), res.rel_err);
    ck_assert_msg(res.sigma > 0.0, "%s: sigma %g", method_name(p.method), res.sigma);
    TU_ASSERT_LE(res.sigma, ref, tu_round_slack(200, 200), "%s after 3 passes", method_name(p.method));
  }
  free(a);
}
END_TEST

START_TEST(test_small_krylov_dim) {
  tu_rng r;
  tu_rng_init(&r, 3003);
  float *a = tu_floats(200 * 150);
  tu_fill_lowrank(a, 200, 150, 150, 3, 0.05, &r);
  double ref = ref_sigma(a, 200, 150, 150);
  for (int k = 2; k <= 4; k++) {
    stab_spectral_params p = params_for(STAB_SPECTRAL_LANCZOS);
    p.krylov_dim = k;
    stab_sigma_result res;
    TU_ASSERT_OK(stab_sigma(a, 200, 150, 150, &p, NULL, &res), "krylov_dim %d", k);
    check_result(tu_ctx("low rank 200x150 krylov_dim %d", k), STAB_SPECTRAL_LANCZOS, &res, ref, a,
                 200, 150, 150, NULL, p.tol);
  }
  free(a);
}
END_TEST

/* Any seed is accurate; the same seed is reproducible to the bit; v NULL, all zeros and
 * non-finite v are all the same cold start. Loop index: method (LANCZOS, POWER) * 3 + seed. */
START_TEST(test_seeds_and_cold_start) {
  static const uint64_t seeds[] = {1, 0x5eed, 0xdeadbeefcafeULL};
  tu_rng r;
  tu_rng_init(&r, 3004);
  float *a = tu_floats(120 * 90);
  tu_fill_gauss(a, 120, 90, 90, 1.0, &r);
  double ref = ref_sigma(a, 120, 90, 90);
  stab_spectral_params p = params_for((stab_spectral_method)(_i / 3));
  p.seed = seeds[_i % 3];
  char ctx[64];
  snprintf(ctx, sizeof ctx, "%s seed %llx", method_name(p.method), (unsigned long long)p.seed);

  stab_sigma_result r0, r1, r2, r3, r4;
  double *v1 = tu_doubles(90), *v2 = tu_doubles(90), *v3 = tu_doubles(90);
  for (size_t i = 0; i < 90; i++) v2[i] = NAN;
  for (size_t i = 0; i < 90; i++) v3[i] = i == 7 ? INFINITY : 1.0;
  TU_ASSERT_OK(stab_sigma(a, 120, 90, 90, &p, NULL, &r0));
  TU_ASSERT_OK(stab_sigma(a, 120, 90, 90, &p, v1, &r1));
  TU_ASSERT_OK(stab_sigma(a, 120, 90, 90, &p, v2, &r2));
  TU_ASSERT_OK(stab_sigma(a, 120, 90, 90, &p, v3, &r3));
  TU_ASSERT_OK(stab_sigma(a, 120, 90, 90, &p, NULL, &r4));
  ck_assert_msg(memcmp(&r0.sigma, &r1.sigma, sizeof(double)) == 0 && r0.passes == r1.passes,
                "%s: v NULL (%.17g, %d passes) and v zeros (%.17g, %d) differ", ctx, r0.sigma,
                r0.passes, r1.sigma, r1.passes);
  ck_assert_msg(memcmp(&r0.sigma, &r2.sigma, sizeof(double)) == 0 && r0.passes == r2.passes,
                "%s: v NULL (%.17g, %d passes) and v NaN (%.17g, %d) differ", ctx, r0.sigma,
                r0.passes, r2.sigma, r2.passes);
  ck_assert_msg(memcmp(&r0.sigma, &r3.sigma, sizeof(double)) == 0 && r0.passes == r3.passes,
                "%s: v NULL (%.17g, %d passes) and v with an Inf (%.17g, %d) differ", ctx,
                r0.sigma, r0.passes, r3.sigma, r3.passes);
  TU_ASSERT_REL(tu_norm2(v2, 90), 1.0, 1e-10, "%s: v after a NaN start", ctx);
  ck_assert_msg(memcmp(&r0.sigma, &r4.sigma, sizeof(double)) == 0 &&
                    memcmp(&r0.rel_err, &r4.rel_err, sizeof(double)) == 0,
                "%s: two identical calls differ", ctx);
  check_result(ctx, p.method, &r0, ref, a, 120, 90, 90, NULL, p.tol);
  free(v1);
  free(v2);
  free(v3);
  free(a);
}
END_TEST

/* ---- warm start -------------------------------------------------------------------- */

/* Loop index: 0 LANCZOS on Gaussian, 1 POWER on Gaussian, 2 LANCZOS on low rank, 3 POWER on low rank. */
START_TEST(test_warm_start_fewer_passes) {
  stab_spectral_method method = (stab_spectral_method)(_i % 2);
  int lowrank = _i / 2;
  size_t rows = 256, cols = 192;
  tu_rng r;
  tu_rng_init(&r, 4000 + (uint64_t)_i);
  float *w = tu_floats(rows * cols);
  if (lowrank)
    tu_fill_lowrank(w, rows, cols, cols, 4, 0.05, &r);
  else
    tu_fill_gauss(w, rows, cols, cols, 1.0, &r);
  const char *what = lowrank ? "low rank 256x192" : "gauss 256x192";
  stab_spectral_params p = params_for(method);

  double *v = tu_doubles(cols);
  stab_sigma_result cold, warm, cold2;
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, v, &cold));
  check_result(tu_ctx("%s cold", what), method, &cold, ref_sigma(w, rows, cols, cols), w, rows,
               cols, cols, v, p.tol);

  tu_add_relative_noise(w, rows, cols, cols, 1e-3, &r);
  double ref2 = ref_sigma(w, rows, cols, cols);
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, v, &warm));
  check_result(tu_ctx("%s warm", what), method, &warm, ref2, w, rows, cols, cols, v, p.tol);
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, NULL, &cold2));
  check_result(tu_ctx("%s cold after step", what), method, &cold2, ref2, w, rows, cols, cols, NULL,
               p.tol);
  /* fewer passes than cold, except Lanczos on the low-rank matrix: its cold start meets tol in
   * 3 passes, which a warm one also takes (its second Ritz pair must converge: spectral.c,
   * "Warm starts") */
  const int at_most = method == STAB_SPECTRAL_LANCZOS && lowrank;
  ck_assert_msg(at_most ? warm.passes <= cold.passes && warm.passes <= cold2.passes
                        : warm.passes < cold.passes && warm.passes < cold2.passes,
                "%s %s: warm start took %d passes, cold %d (before the step) and %d (after)", what,
                method_name(method), warm.passes, cold.passes, cold2.passes);
  free(v);
  free(w);
}
END_TEST

/* Warm starts on matrices of exactly low rank, 300 x 200 (ranks 6, 10, 13, 21; tol 1e-3 and
 * 1e-9): the block's Krylov space ends within a few passes, the remainders vanish and random
 * vectors orthogonal to the basis take their place, so the next product has large components
 * along blocks older than the last two, which Lanczos's first (local) sweep does not touch: the
 * whole-basis sweep after it removes them, and its second-sweep test (spectral.c,
 * orthogonalise_block) is what fires here. Against dgesvd within the reported error, warm from
 * the cold start's vector and from a vector along the smallest nonzero direction.
 * Loop index: rank * 2 + tol. */
START_TEST(test_warm_start_exact_low_rank) {
  static const size_t ranks[] = {6, 10, 13, 21};
  const size_t rank = ranks[_i / 2], rows = 300, cols = 200;
  const double tol = _i % 2 ? 1e-9 : 1e-3;
  tu_rng r;
  tu_rng_init(&r, 4400 + (uint64_t)_i);
  float *w = tu_floats(rows * cols);
  tu_fill_lowrank(w, rows, cols, cols, rank, 0.0, &r);
  const double ref = ref_sigma(w, rows, cols, cols);
  stab_spectral_params p = params_for(STAB_SPECTRAL_LANCZOS);
  p.tol = tol;
  double *v = tu_doubles(cols);
  stab_sigma_result cold, warm, side;
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, v, &cold));
  char what[64];
  snprintf(what, sizeof what, "rank %zu 300x200 tol %g", rank, tol);
  check_result(tu_ctx("%s cold", what), STAB_SPECTRAL_LANCZOS, &cold, ref, w, rows, cols, cols, v, tol);
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, v, &warm));
  check_result(tu_ctx("%s warm", what), STAB_SPECTRAL_LANCZOS, &warm, ref, w, rows, cols, cols, v, tol);
  /* a start along the last row of W: inside the row space, far from the top */
  for (size_t j = 0; j < cols; j++) v[j] = w[(rows - 1) * cols + j];
  TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &p, v, &side));
  check_result(tu_ctx("%s warm from a row", what), STAB_SPECTRAL_LANCZOS, &side, ref, w, rows, cols, cols,
               v, tol);
  free(v);
  free(w);
}
END_TEST

/* A warm start along the SECOND right singular vector, as a monitor's is when the top two
 * singular values swapped places since its last step: the estimate must not report an error
 * below the actual one (it may settle on s2 only if it says so). W = U diag(s1, 1, 0.95 ..
 * 0.05) V^T with s1 = 1.001, 1.01 or 1.1 (the loop index's ratio), tall 512 x 128 and wide
 * 128 x 512, tol 1e-4, the start V[:,1] plus Gaussian noise, 1e-2 (4 seeds) or 1e-6 (4 seeds,
 * nearly a clean swap); actual error against dgesvd in f64 on the same f32 numbers. Before the
 * fix: at 1.001 and 1e-2, ~7e-5 reported for an actual 1e-3 on half the seeds; at 1e-6, one
 * pass and every ratio (1.1: 9% actual, 1e-7 reported). */
START_TEST(test_warm_start_swapped_pair) {
  static const double ratios[] = {1.001, 1.01, 1.1};
  enum { K = 128, SEEDS = 8 };
  const double ratio = ratios[_i % 3];
  const int wide = _i / 3;
  const size_t rows = wide ? K : 4 * K, cols = wide ? 4 * K : K;
  float *a = tu_floats(rows * cols);
  double *warm = tu_doubles(cols), s[K];
  s[0] = ratio;
  s[1] = 1.0;
  for (size_t i = 2; i < K; i++) s[i] = 0.95 - 0.9 * (double)(i - 2) / (K - 3); /* 0.95 .. 0.05 */
  int bad = 0;
  double worst = 0.0;
  for (int seed = 0; seed < SEEDS; seed++) {
    tu_rng r;
    tu_rng_init(&r, 7100 + 10 * (uint64_t)_i + (uint64_t)seed);
    double *u = orthonormal_columns(rows, K, &r), *v = orthonormal_columns(cols, K, &r);
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < cols; j++) {
        double t = 0.0;
        for (size_t l = 0; l < K; l++) t += u[i * K + l] * s[l] * v[j * K + l];
        a[i * cols + j] = (float)t;
      }
    const double noise = seed < SEEDS / 2 ? 1e-2 : 1e-6;
    for (size_t j = 0; j < cols; j++) warm[j] = v[j * K + 1] + noise * tu_rng_gauss(&r);
    const double ref = ref_sigma(a, rows, cols, cols);
    stab_spectral_params p = stab_spectral_default_params();
    p.tol = 1e-4;
    stab_sigma_result res;
    TU_ASSERT_OK(stab_sigma(a, rows, cols, cols, &p, warm, &res));
    const double actual = fabs(ref - res.sigma) / ref;
    if (actual > res.rel_err + 1e-7) { /* 1e-7: the f32 passes' rounding */
      bad++;
      fprintf(stderr, "swapped pair s1/s2 %g %zux%zu seed %d noise %g: actual %.3e > reported %.3e (%d passes)\n",
              ratio, rows, cols, seed, noise, actual, res.rel_err, res.passes);
    }
    if (actual > worst) worst = actual;
    free(u);
    free(v);
  }
  ck_assert_msg(bad == 0, "warm start along v2, s1/s2 %g, %zux%zu: actual error above the reported one "
                "on %d of %d seeds (worst actual %.3e)", ratio, rows, cols, bad, SEEDS, worst);
  free(warm);
  free(a);
}
END_TEST

/* ---- threads ----------------------------------------------------------------------- */

START_TEST(test_threads_bit_identical) {
  /* 1.2M elements: passes under 1M run on one thread whatever is asked (gram_pass.c) */
  enum { ROWS = 1500, COLS = 800 };
  tu_rng r;
  tu_rng_init(&r, 5001);
  float *a = tu_floats(ROWS * COLS), *b = tu_floats(ROWS * COLS);
  tu_fill_gauss(a, ROWS, COLS, COLS, 1.0, &r);
  memcpy(b, a, sizeof(float) * ROWS * COLS);
  tu_add_relative_noise(b, ROWS, COLS, COLS, 0.1, &r);
  double ref = ref_sigma(a, ROWS, COLS, COLS);
  static const int threads[] = {1, 2, 0}; /* 3 threads: tests/unit/check_gram_pass, pass by pass */
  enum { NT = sizeof threads / sizeof threads[0] };
  for (int m = 0; m < 3; m++)
    for (int with_b = 0; with_b < 2; with_b++) {
      stab_sigma_result res[NT];
      double *v[NT];
      for (int t = 0; t < NT; t++) {
        stab_spectral_params p = params_for((stab_spectral_method)m);
        p.threads = threads[t];
        stab_spectral_workspace *ws = NULL;
        TU_ASSERT_OK(stab_spectral_workspace_create(ROWS, COLS, &p, &ws));
        v[t] = tu_doubles(COLS);
        TU_ASSERT_OK(stab_spectral_norm(ws, a, with_b ? b : NULL, ROWS, COLS, COLS, v[t], &res[t]));
        stab_spectral_workspace_free(ws);
      }
      const char *ctx = tu_ctx("%s%s", method_name((stab_spectral_method)m), with_b ? " A-B" : "");
      if (!with_b)
        check_result(ctx, (stab_spectral_method)m, &res[0], ref, a, ROWS, COLS, COLS,
                     m == STAB_SPECTRAL_EXACT ? NULL : v[0], 1e-3);
      for (int t = 1; t < NT; t++) {
        ck_assert_msg(memcmp(&res[0].sigma, &res[t].sigma, sizeof(double)) == 0,
                      "%s: sigma %.17g with 1 thread, %.17g with %d", ctx, res[0].sigma,
                      res[t].sigma, threads[t]);
        ck_assert_msg(memcmp(&res[0].rel_err, &res[t].rel_err, sizeof(double)) == 0 &&
                          res[0].passes == res[t].passes,
                      "%s: rel_err/passes %.17g/%d with 1 thread, %.17g/%d with %d", ctx,
                      res[0].rel_err, res[0].passes, res[t].rel_err, res[t].passes, threads[t]);
        if (m != STAB_SPECTRAL_EXACT)
          ck_assert_msg(memcmp(v[0], v[t], COLS * sizeof(double)) == 0,
                        "%s: v differs between 1 and %d threads", ctx, threads[t]);
      }
      for (int t = 0; t < NT; t++) free(v[t]);
    }
  free(a);
  free(b);
}
END_TEST

/* ---- workspace --------------------------------------------------------------------- */

START_TEST(test_workspace_reuse) {
  tu_rng r;
  tu_rng_init(&r, 6001);
  stab_spectral_params p = params_for(STAB_SPECTRAL_LANCZOS);
  stab_spectral_workspace *ws = NULL;
  TU_ASSERT_OK(stab_spectral_workspace_create(300, 300, &p, &ws));
  ck_assert_ptr_nonnull(ws);
  static const size_t shapes[][2] = {{300, 40}, {40, 300}, {200, 200}, {10, 10}, {300, 300}, {7, 3}, {1, 1}};
  /* a matrix bigger than the workspace in both dimensions is refused */
  float *big = tu_floats(400 * 400);
  stab_sigma_result res;
  TU_ASSERT_FAILS(stab_spectral_norm(ws, big, NULL, 400, 400, 400, NULL, &res));
  free(big);
  float *a = tu_floats(300 * 300);
  double *v = tu_doubles(300);
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    size_t rows = shapes[k][0], cols = shapes[k][1];
    if (k == 3)
      memset(a, 0, sizeof(float) * rows * cols);
    else
      tu_fill_gauss(a, rows, cols, cols, 1.0, &r);
    memset(v, 0, 300 * sizeof(double));
    TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, rows, cols, cols, v, &res), "%zux%zu", rows, cols);
    check_result(tu_ctx("workspace 300x300, matrix %zux%zu", rows, cols), p.method, &res,
                 ref_sigma(a, rows, cols, cols), a, rows, cols, cols, k == 3 ? NULL : v, p.tol);
  }
  stab_spectral_workspace_free(ws);
  stab_spectral_workspace_free(NULL);
  free(a);
  free(v);
}
END_TEST

/* ---- non-finite ---------------------------------------------------------------------- */

START_TEST(test_nonfinite) {
  enum { ROWS = 50, COLS = 40 };
  static const size_t where[][2] = {{0, 0}, {49, 39}, {25, 17}, {10, 3}};
  static const float bad[] = {NAN, NAN, INFINITY, -INFINITY};
  tu_rng r;
  tu_rng_init(&r, 7001);
  float *a = tu_floats(ROWS * COLS), *b = tu_floats(ROWS * COLS);
  for (int m = 0; m < 3; m++) {
    stab_spectral_params p = params_for((stab_spectral_method)m);
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_OK(stab_spectral_workspace_create(ROWS, COLS, &p, &ws));
    double *v = tu_doubles(COLS);
    for (int k = 0; k < 4; k++) {
      const char *ctx = tu_ctx("%s: %g at (%zu, %zu)", method_name(p.method), (double)bad[k],
                               where[k][0], where[k][1]);
      tu_fill_gauss(a, ROWS, COLS, COLS, 1.0, &r);
      tu_fill_gauss(b, ROWS, COLS, COLS, 1.0, &r);
      a[where[k][0] * COLS + where[k][1]] = bad[k];
      stab_sigma_result res;
      memset(&res, 0, sizeof res);
      TU_ASSERT_OK(stab_sigma(a, ROWS, COLS, COLS, &p, v, &res), "%s", ctx);
      TU_ASSERT_NAN(res.sigma, "%s", ctx);
      ck_assert_msg(res.nonfinite == 1, "%s: nonfinite = %d", ctx, res.nonfinite);

      /* in B of A - B */
      memset(&res, 0, sizeof res);
      TU_ASSERT_OK(stab_spectral_norm(ws, b, a, ROWS, COLS, COLS, v, &res), "%s (in B)", ctx);
      TU_ASSERT_NAN(res.sigma, "%s (in B)", ctx);
      ck_assert_msg(res.nonfinite == 1, "%s (in B): nonfinite = %d", ctx, res.nonfinite);

      /* the workspace and v recover on the next finite matrix: the same bits as a fresh
       * workspace with a cold start (v was cold before the bad matrices) */
      a[where[k][0] * COLS + where[k][1]] = 0.5f;
      TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, ROWS, COLS, COLS, v, &res), "%s then finite", ctx);
      stab_sigma_result fresh;
      TU_ASSERT_OK(stab_sigma(a, ROWS, COLS, COLS, &p, NULL, &fresh));
      ck_assert_msg(memcmp(&res.sigma, &fresh.sigma, sizeof(double)) == 0 && res.nonfinite == 0,
                    "%s then finite: sigma %.17g (nonfinite %d), a fresh call gives %.17g", ctx,
                    res.sigma, res.nonfinite, fresh.sigma);
      memset(v, 0, COLS * sizeof *v);
    }
    free(v);
    stab_spectral_workspace_free(ws);
  }
  free(a);
  free(b);
}
END_TEST

/* ---- invalid arguments --------------------------------------------------------------- */

START_TEST(test_invalid_arguments) {
  float a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  stab_spectral_params p = stab_spectral_default_params();
  stab_sigma_result res;

  TU_ASSERT_STATUS(stab_sigma(NULL, 3, 4, 4, &p, NULL, &res), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_sigma(a, 3, 4, 4, &p, NULL, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_sigma(a, 0, 4, 4, &p, NULL, &res), STAB_EDIM);
  TU_ASSERT_STATUS(stab_sigma(a, 3, 0, 4, &p, NULL, &res), STAB_EDIM);
  TU_ASSERT_FAILS(stab_sigma(a, 3, 4, 3, &p, NULL, &res), "ld < cols");

  static const double bad_tol[] = {0.0, -1e-3, 0.5, 2.0, NAN};
  for (int k = 0; k < 5; k++) {
    stab_spectral_params q = p;
    q.tol = bad_tol[k];
    TU_ASSERT_FAILS(stab_sigma(a, 3, 4, 4, &q, NULL, &res), "tol %g", bad_tol[k]);
    stab_spectral_workspace *ws = NULL;
    TU_ASSERT_FAILS(stab_spectral_workspace_create(3, 4, &q, &ws), "workspace tol %g", bad_tol[k]);
  }
  stab_spectral_params q = p;
  q.krylov_dim = 1;
  TU_ASSERT_FAILS(stab_sigma(a, 3, 4, 4, &q, NULL, &res), "krylov_dim 1");
  q = p;
  q.method = (stab_spectral_method)7;
  TU_ASSERT_STATUS(stab_sigma(a, 3, 4, 4, &q, NULL, &res), STAB_EINVAL, "method 7");

  stab_spectral_workspace *ws = NULL;
  TU_ASSERT_STATUS(stab_spectral_workspace_create(3, 4, &p, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_spectral_workspace_create(0, 4, &p, &ws), STAB_EDIM);
  TU_ASSERT_STATUS(stab_spectral_workspace_create(3, 0, &p, &ws), STAB_EDIM);
  TU_ASSERT_FAILS(stab_spectral_workspace_create(SIZE_MAX / 2, SIZE_MAX / 2, &p, &ws),
                  "sizes that overflow");

  TU_ASSERT_OK(stab_spectral_workspace_create(3, 4, &p, &ws));
  TU_ASSERT_STATUS(stab_spectral_norm(NULL, a, NULL, 3, 4, 4, NULL, &res), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_spectral_norm(ws, NULL, NULL, 3, 4, 4, NULL, &res), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_spectral_norm(ws, a, NULL, 3, 4, 4, NULL, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_spectral_norm(ws, a, NULL, 0, 4, 4, NULL, &res), STAB_EDIM);
  TU_ASSERT_FAILS(stab_spectral_norm(ws, a, NULL, 3, 4, 2, NULL, &res), "ld < cols");
  /* the workspace still works after the failures */
  TU_ASSERT_OK(stab_spectral_norm(ws, a, NULL, 3, 4, 4, NULL, &res));
  TU_ASSERT_REL(res.sigma, ref_sigma(a, 3, 4, 4), 1e-3);
  stab_spectral_workspace_free(ws);
}
END_TEST

static Suite *spectral_suite(void) {
  Suite *s = suite_create("spectral");
  TCase *tc = tcase_create("families");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_sigma_families, 0, 3 * NCASES);
  suite_add_tcase(s, tc);

  tc = tcase_create("difference_and_blocks");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_near_equal_top_pair);
  tcase_add_test(tc, test_few_rows_exact);
  tcase_add_test(tc, test_few_rows_reduced_gram);
  tcase_add_test(tc, test_sigma_diff);
  tcase_add_test(tc, test_sigma_diff_same_is_zero);
  tcase_add_test(tc, test_sigma_block_of_bigger);
  suite_add_tcase(s, tc);

  tc = tcase_create("parameters");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_tight_tolerance);
  tcase_add_test(tc, test_power_error_below_1e8);
  tcase_add_test(tc, test_precision_follows_tol);
  tcase_add_test(tc, test_not_converged);
  tcase_add_test(tc, test_small_krylov_dim);
  tcase_add_loop_test(tc, test_seeds_and_cold_start, 0, 6);
  suite_add_tcase(s, tc);

  tc = tcase_create("warm_start");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_warm_start_fewer_passes, 0, 4);
  tcase_add_loop_test(tc, test_warm_start_exact_low_rank, 0, 8);
  tcase_add_loop_test(tc, test_warm_start_swapped_pair, 0, 6);
  suite_add_tcase(s, tc);

  tc = tcase_create("threads");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_threads_bit_identical);
  suite_add_tcase(s, tc);

  tc = tcase_create("robustness");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_workspace_reuse);
  tcase_add_test(tc, test_nonfinite);
  tcase_add_test(tc, test_invalid_arguments);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(spectral_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
