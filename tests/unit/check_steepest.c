/* check_steepest.c — the steepest-descent helpers: msign by Newton–Schulz against the exact
 * U V^T of LAPACKE_dgesvd in f64 (quintic: singular values in its band and vectors kept;
 * cubic run to convergence: close to U V^T), the articles' init std in closed form, row
 * normalisation and sign, and their argument errors. */
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

/* Thin SVD of an f32 matrix in f64: u (rows, k), s (k), vt (k, cols), k = min side. */
static void svd(const float *a, size_t rows, size_t cols, double *u, double *s, double *vt) {
  double *x = tu_to_double(a, NULL, rows, cols, cols, 0);
  size_t k = rows < cols ? rows : cols;
  double *superb = tu_doubles(k);
  lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', (lapack_int)rows, (lapack_int)cols,
                                   x, (lapack_int)cols, s, u, (lapack_int)k, vt, (lapack_int)cols,
                                   superb);
  ck_assert_int_eq(info, 0);
  free(x), free(superb);
}

/* M = U^T out V (k x k): diagonal with out's singular values when out keeps G's vectors. */
static double *rotate(const double *u, const double *vt, const float *out, size_t rows,
                      size_t cols, size_t k) {
  double *m = tu_doubles(k * k);
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; j < k; j++) {
      double acc = 0;
      for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) acc += u[r * k + i] * out[r * cols + c] * vt[j * cols + c];
      m[i * k + j] = acc;
    }
  return m;
}

static const size_t shapes[][2] = {{32, 64}, {64, 32}, {40, 40}, {1, 24}, {24, 1}, {96, 48}};

START_TEST(test_msign_quintic_band) {
  size_t rows = shapes[_i][0], cols = shapes[_i][1], k = rows < cols ? rows : cols;
  tu_rng r;
  tu_rng_init(&r, 40 + (uint64_t)_i);
  float *g = tu_floats(rows * cols), *out = tu_floats(rows * cols);
  float *work = tu_floats(stab_msign_work_size(rows, cols));
  tu_fill_gauss(g, rows, cols, cols, 3.0, &r);
  TU_ASSERT_OK(stab_msign(g, rows, cols, STAB_MSIGN_QUINTIC, 5, out, work));
  double *u = tu_doubles(rows * k), *s = tu_doubles(k), *vt = tu_doubles(k * cols);
  svd(g, rows, cols, u, s, vt);
  double fro = 0;
  for (size_t i = 0; i < k; i++) fro += s[i] * s[i];
  fro = sqrt(fro);
  double *m = rotate(u, vt, out, rows, cols, k);
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; j < k; j++) {
      double v = m[i * k + j];
      if (i != j) {
        ck_assert_msg(fabs(v) < 2e-3, "%zux%zu: U^T msign V off-diagonal (%zu,%zu) = %g", rows,
                      cols, i, j, v);
      } else if (s[i] / fro >= 1e-2) {
        ck_assert_msg(v >= 0.68 && v <= 1.14, "%zux%zu: singular value %zu (s/||G||_F = %g) -> %g",
                      rows, cols, i, s[i] / fro, v);
      } else {
        ck_assert_msg(v >= 0 && v <= 1.21, "%zux%zu: tiny singular value %zu -> %g", rows, cols, i, v);
      }
    }
  free(g), free(out), free(work), free(u), free(s), free(vt), free(m);
}
END_TEST

START_TEST(test_msign_cubic_converges) {
  size_t rows = shapes[_i][0], cols = shapes[_i][1], k = rows < cols ? rows : cols;
  if (rows == cols) return; /* a square Gaussian's smallest singular value is too near 0 */
  tu_rng r;
  tu_rng_init(&r, 60 + (uint64_t)_i);
  float *g = tu_floats(rows * cols), *out = tu_floats(rows * cols);
  float *work = tu_floats(stab_msign_work_size(rows, cols));
  tu_fill_gauss(g, rows, cols, cols, 0.5, &r);
  memcpy(out, g, rows * cols * sizeof(float)); /* in place */
  TU_ASSERT_OK(stab_msign(out, rows, cols, STAB_MSIGN_CUBIC, 60, out, work));
  double *u = tu_doubles(rows * k), *s = tu_doubles(k), *vt = tu_doubles(k * cols);
  svd(g, rows, cols, u, s, vt);
  double err = 0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      double uv = 0;
      for (size_t p = 0; p < k; p++) uv += u[i * k + p] * vt[p * cols + j];
      err = fmax(err, fabs(out[i * cols + j] - uv));
    }
  ck_assert_msg(err < 1e-4, "%zux%zu: max |msign - U V^T| = %g", rows, cols, err);
  free(g), free(out), free(work), free(u), free(s), free(vt);
}
END_TEST

START_TEST(test_msign_edges) {
  float g[6] = {0}, out[6], work[64];
  ck_assert_uint_eq(stab_msign_work_size(2, 3), 2 * 6 + 2 * 4);
  ck_assert_uint_eq(stab_msign_work_size(3, 2), 2 * 6 + 2 * 4);
  TU_ASSERT_OK(stab_msign(g, 2, 3, STAB_MSIGN_QUINTIC, 5, out, work));
  for (int i = 0; i < 6; i++) ck_assert(out[i] == 0.0f);
  TU_ASSERT_STATUS(stab_msign(NULL, 2, 3, STAB_MSIGN_QUINTIC, 5, out, work), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_msign(g, 2, 3, STAB_MSIGN_QUINTIC, 0, out, work), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_msign(g, 2, 3, (stab_msign_method)9, 5, out, work), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_msign(g, 0, 3, STAB_MSIGN_QUINTIC, 5, out, work), STAB_EDIM);
  g[2] = NAN;
  out[0] = 42.0f;
  TU_ASSERT_STATUS(stab_msign(g, 2, 3, STAB_MSIGN_QUINTIC, 5, out, work), STAB_ERANGE);
  ck_assert(out[0] == 42.0f);
}
END_TEST

START_TEST(test_init_std) {
  TU_ASSERT_REL(stab_init_std(STAB_KIND_LINEAR, 64, 256), sqrt(4.0) / (8.0 + 16.0), 1e-15);
  TU_ASSERT_REL(stab_init_std(STAB_KIND_LINEAR, 100, 100), 1.0 / 20.0, 1e-15);
  TU_ASSERT_REL(stab_init_std(STAB_KIND_EMBEDDING, 256, 128), 1.0, 0);
  TU_ASSERT_REL(stab_init_std(STAB_KIND_LM_HEAD, 128, 256), 1.0 / 128.0, 1e-15);
  TU_ASSERT_REL(stab_init_std(STAB_KIND_GAIN, 128, 128), 1.0, 0);
  ck_assert(stab_init_std(STAB_KIND_BIAS, 128, 128) == 0.0);
  TU_ASSERT_NAN(stab_init_std(STAB_KIND_ATTENTION, 128, 128));
  TU_ASSERT_NAN(stab_init_std(STAB_KIND_LINEAR, 0, 128));
  /* The point of the init: a linear layer's forward stability sqrt(d_in/d_out) sigma(W) is
   * about 1, since sigma of a Gaussian d_out x d_in matrix is about std (sqrt(d_in) + sqrt(d_out)). */
  size_t din = 96, dout = 192;
  tu_rng r;
  tu_rng_init(&r, 5);
  float *w = tu_floats(din * dout);
  tu_fill_gauss(w, dout, din, din, stab_init_std(STAB_KIND_LINEAR, din, dout), &r);
  double fwd = sqrt((double)din / dout) * ref_sigma(w, dout, din, din);
  ck_assert_msg(fwd > 0.85 && fwd < 1.1, "forward stability at init %g", fwd);
  free(w);
}
END_TEST

START_TEST(test_normalize_and_sign) {
  float g[3 * 4] = {1, 2, 3, 4, 0, 0, 0, 0, -1, 1, -1, 1}, out[12];
  TU_ASSERT_OK(stab_normalize_rows(g, 3, 4, 0.5, out));
  TU_ASSERT_REL(ref_rms(out, 4, 1), 0.5, 1e-6);
  TU_ASSERT_REL(out[3] / out[0], 4.0, 1e-6);
  for (int j = 4; j < 8; j++) ck_assert(out[j] == 0.0f);
  TU_ASSERT_REL(out[8], -0.5, 1e-7);
  TU_ASSERT_OK(stab_normalize_rows(g, 3, 4, 2.0, g)); /* in place */
  TU_ASSERT_REL(ref_rms(g + 8, 4, 1), 2.0, 1e-6);
  TU_ASSERT_STATUS(stab_normalize_rows(NULL, 3, 4, 1.0, out), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_normalize_rows(g, 0, 4, 1.0, out), STAB_EDIM);
  float s[4] = {-3, 0, 2e-30f, NAN}, so[4];
  TU_ASSERT_OK(stab_sign(s, 4, 0.25, so));
  ck_assert(so[0] == -0.25f && so[1] == 0.0f && so[2] == 0.25f && isnan(so[3]));
  TU_ASSERT_STATUS(stab_sign(NULL, 4, 1.0, so), STAB_EINVAL);
}
END_TEST

static Suite *steepest_suite(void) {
  Suite *s = suite_create("steepest");
  TCase *tc = tcase_create("msign");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_msign_quintic_band, 0, 6);
  tcase_add_loop_test(tc, test_msign_cubic_converges, 0, 6);
  tcase_add_test(tc, test_msign_edges);
  suite_add_tcase(s, tc);
  tc = tcase_create("helpers");
  tcase_add_test(tc, test_init_std);
  tcase_add_test(tc, test_normalize_and_sign);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(steepest_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
