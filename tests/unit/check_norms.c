/* check_norms.c — stab_rms, stab_rms_diff and stab_max_abs_diff against closed forms and
 * long-double brute force: f64 accumulation, strides, NaN propagation. Also the small
 * status/version/defaults API, which has no module of its own to be tested with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

/* Naive f64 summation of n squares: error below n eps, with a floor. */
static double sum_tol(size_t n) { return 4.0 * (double)(n < 16 ? 16 : n) * DBL_EPSILON; }

/* ---- stab_rms ---------------------------------------------------------------------- */

START_TEST(test_rms_closed_forms) {
  enum { N = 1000 };
  float *x = tu_floats(N);

  for (size_t i = 0; i < N; i++) x[i] = 1.0f;
  TU_ASSERT_REL(stab_rms(x, N, 1), 1.0, sum_tol(N), "ones");

  for (size_t i = 0; i < N; i++) x[i] = -2.5f;
  TU_ASSERT_REL(stab_rms(x, N, 1), 2.5, sum_tol(N), "constant -2.5");

  /* sum_{i=1..n} i^2 = n (n+1) (2n+1) / 6, all exact in f64 */
  for (size_t i = 0; i < N; i++) x[i] = (float)(i + 1);
  TU_ASSERT_REL(stab_rms(x, N, 1), sqrt((N + 1.0) * (2.0 * N + 1.0) / 6.0), sum_tol(N), "1..n");

  x[0] = -7.0f;
  TU_ASSERT_REL(stab_rms(x, 1, 1), 7.0, 0.0, "single element");

  /* alternating signs: RMS ignores them */
  for (size_t i = 0; i < N; i++) x[i] = (i % 2) ? 3.0f : -3.0f;
  TU_ASSERT_REL(stab_rms(x, N, 1), 3.0, sum_tol(N), "alternating +-3");
  free(x);
}
END_TEST

START_TEST(test_rms_random_vs_bruteforce) {
  static const size_t sizes[] = {1, 2, 7, 64, 1000, 100003};
  tu_rng r;
  tu_rng_init(&r, 11);
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    float *x = tu_floats(n);
    tu_fill_gauss(x, 1, n, n, 3.0, &r);
    TU_ASSERT_REL(stab_rms(x, n, 1), ref_rms(x, n, 1), sum_tol(n), "n = %zu", n);
    free(x);
  }
}
END_TEST

/* Values whose squares overflow or underflow in f32 but not in f64, and a sum that f32
 * accumulation would get visibly wrong. */
START_TEST(test_rms_f64_accumulation) {
  enum { N = 3000000 };
  float *x = tu_floats(N);
  for (size_t i = 0; i < N; i++) x[i] = 0.1f;
  TU_ASSERT_REL(stab_rms(x, N, 1), (double)0.1f, 1e-9, "3e6 x 0.1f");

  for (size_t i = 0; i < 100; i++) x[i] = (i % 3) ? 1e30f : -1e30f;
  TU_ASSERT_REL(stab_rms(x, 100, 1), (double)1e30f, sum_tol(100), "1e30 (f32 square overflows)");

  for (size_t i = 0; i < 100; i++) x[i] = 3e38f;
  TU_ASSERT_REL(stab_rms(x, 100, 1), (double)3e38f, sum_tol(100), "3e38 near FLT_MAX");

  for (size_t i = 0; i < 100; i++) x[i] = 1e-30f;
  TU_ASSERT_REL(stab_rms(x, 100, 1), (double)1e-30f, sum_tol(100), "1e-30 (f32 square underflows)");

  /* mixed magnitudes: the small values must not vanish against the large one in f64 */
  for (size_t i = 0; i < 1000; i++) x[i] = 1.0f;
  x[0] = 1e4f;
  double want = sqrt((1e8 + 999.0) / 1000.0);
  TU_ASSERT_REL(stab_rms(x, 1000, 1), want, sum_tol(1000), "1e4 and 999 ones");
  free(x);
}
END_TEST

START_TEST(test_rms_stride) {
  enum { ROWS = 37, COLS = 11 };
  tu_rng r;
  tu_rng_init(&r, 12);
  float *a = tu_floats(ROWS * COLS);
  tu_fill_gauss(a, ROWS, COLS, COLS, 1.0, &r);
  for (size_t j = 0; j < COLS; j++)
    TU_ASSERT_REL(stab_rms(a + j, ROWS, COLS), ref_rms(a + j, ROWS, COLS), sum_tol(ROWS),
                  "column %zu with stride %d", j, COLS);

  /* NaN everywhere except column 4: a stride-COLS read of column 4 never sees it */
  for (size_t i = 0; i < ROWS; i++)
    for (size_t j = 0; j < COLS; j++)
      if (j != 4) a[i * COLS + j] = NAN;
  double got = stab_rms(a + 4, ROWS, COLS);
  TU_ASSERT_REL(got, ref_rms(a + 4, ROWS, COLS), sum_tol(ROWS), "column 4 amid NaN columns");

  /* stride 1 equals the contiguous RMS */
  tu_fill_gauss(a, 1, 50, 50, 1.0, &r);
  TU_ASSERT_REL(stab_rms(a, 50, 1), ref_rms(a, 50, 1), sum_tol(50), "stride 1");
  free(a);
}
END_TEST

START_TEST(test_rms_nonfinite) {
  enum { N = 257 };
  static const size_t where[] = {0, N / 2, N - 1};
  tu_rng r;
  tu_rng_init(&r, 13);
  float *x = tu_floats(N);
  for (size_t k = 0; k < 3; k++) {
    tu_fill_gauss(x, 1, N, N, 1.0, &r);
    x[where[k]] = NAN;
    TU_ASSERT_NAN(stab_rms(x, N, 1), "NaN at %zu", where[k]);

    tu_fill_gauss(x, 1, N, N, 1.0, &r);
    x[where[k]] = (k % 2) ? -INFINITY : INFINITY;
    double got = stab_rms(x, N, 1);
    ck_assert_msg(!isfinite(got), "Inf at %zu: stab_rms = %g, expected Inf or NaN", where[k], got);

    /* NaN wins over Inf */
    x[(where[k] + 1) % N] = NAN;
    TU_ASSERT_NAN(stab_rms(x, N, 1), "Inf at %zu and NaN after it", where[k]);
  }
  /* NaN also through a stride */
  tu_fill_gauss(x, 1, N, N, 1.0, &r);
  x[3 * 10] = NAN;
  TU_ASSERT_NAN(stab_rms(x, 20, 3), "NaN at strided element 10");
  free(x);
}
END_TEST

/* ---- stab_rms_diff ----------------------------------------------------------------- */

START_TEST(test_rms_diff_vs_bruteforce) {
  static const size_t sizes[] = {1, 3, 100, 4097};
  tu_rng r;
  tu_rng_init(&r, 21);
  for (size_t k = 0; k < 4; k++) {
    size_t n = sizes[k];
    float *a = tu_floats(n), *b = tu_floats(n);
    tu_fill_gauss(a, 1, n, n, 1.0, &r);
    tu_fill_gauss(b, 1, n, n, 0.5, &r);
    TU_ASSERT_REL(stab_rms_diff(a, b, n), ref_rms_diff(a, b, n), sum_tol(n), "n = %zu", n);
    TU_ASSERT_REL(stab_rms_diff(a, NULL, n), ref_rms(a, n, 1), sum_tol(n), "b NULL, n = %zu", n);
    double same = stab_rms_diff(a, a, n);
    ck_assert_msg(same == 0.0, "rms_diff(a, a) = %g, expected exactly 0", same);
    free(a);
    free(b);
  }
}
END_TEST

START_TEST(test_rms_diff_f64) {
  enum { N = 64 };
  float *a = tu_floats(N), *b = tu_floats(N);
  /* 1 + 2^-23 minus 1 is exactly 2^-23 in f64 */
  for (size_t i = 0; i < N; i++) {
    a[i] = 1.0f + 0x1.0p-23f;
    b[i] = 1.0f;
  }
  TU_ASSERT_REL(stab_rms_diff(a, b, N), 0x1.0p-23, sum_tol(N), "1+2^-23 vs 1");

  /* the difference overflows f32 but not f64 */
  for (size_t i = 0; i < N; i++) {
    a[i] = 3e38f;
    b[i] = -3e38f;
  }
  TU_ASSERT_REL(stab_rms_diff(a, b, N), 2.0 * (double)3e38f, sum_tol(N), "3e38 - (-3e38)");

  /* a tiny difference of large values: f32 subtraction is exact here too, but a library
   * that squares first and subtracts squares would lose it entirely */
  for (size_t i = 0; i < N; i++) {
    a[i] = 4096.0f + ((i % 2) ? 0.0009765625f : -0.0009765625f);
    b[i] = 4096.0f;
  }
  TU_ASSERT_REL(stab_rms_diff(a, b, N), 0.0009765625, sum_tol(N), "4096 +- 2^-10 vs 4096");
  free(a);
  free(b);
}
END_TEST

START_TEST(test_rms_diff_nan) {
  enum { N = 33 };
  float *a = tu_floats(N), *b = tu_floats(N);
  for (size_t i = 0; i < N; i++) a[i] = b[i] = (float)i;
  b[N - 1] = NAN;
  TU_ASSERT_NAN(stab_rms_diff(a, b, N), "NaN in b");
  b[N - 1] = (float)(N - 1);
  a[0] = NAN;
  TU_ASSERT_NAN(stab_rms_diff(a, b, N), "NaN in a");
  TU_ASSERT_NAN(stab_rms_diff(a, NULL, N), "NaN in a, b NULL");
  a[0] = INFINITY;
  b[0] = INFINITY;
  /* Inf - Inf is NaN */
  TU_ASSERT_NAN(stab_rms_diff(a, b, N), "Inf - Inf");
  free(a);
  free(b);
}
END_TEST

/* ---- stab_max_abs_diff ------------------------------------------------------------- */

static double brute_max_abs_diff(const float *x, const float *y, size_t n) {
  double best = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)x[i] - (y ? (double)y[i] : 0.0));
    if (d > best) best = d;
  }
  return best;
}

START_TEST(test_max_abs_diff_vs_bruteforce) {
  static const size_t sizes[] = {1, 2, 17, 1000};
  tu_rng r;
  tu_rng_init(&r, 31);
  for (size_t k = 0; k < 4; k++) {
    size_t n = sizes[k];
    float *x = tu_floats(n), *y = tu_floats(n);
    tu_fill_gauss(x, 1, n, n, 1.0, &r);
    tu_fill_gauss(y, 1, n, n, 1.0, &r);
    /* a max over exact f64 differences is itself exact */
    double got = stab_max_abs_diff(x, y, n), want = brute_max_abs_diff(x, y, n);
    ck_assert_msg(got == want, "n = %zu: max_abs_diff = %.17g, expected %.17g", n, got, want);
    got = stab_max_abs_diff(x, NULL, n);
    want = brute_max_abs_diff(x, NULL, n);
    ck_assert_msg(got == want, "n = %zu, y NULL: %.17g, expected %.17g", n, got, want);
    got = stab_max_abs_diff(x, x, n);
    ck_assert_msg(got == 0.0, "n = %zu: max_abs_diff(x, x) = %g", n, got);
    free(x);
    free(y);
  }
}
END_TEST

START_TEST(test_max_abs_diff_closed_forms) {
  float x[4] = {1.0f, -8.0f, 3.0f, 7.5f}, y[4] = {0.5f, 2.0f, 3.0f, 7.5f};
  ck_assert_double_eq(stab_max_abs_diff(x, y, 4), 10.0);
  ck_assert_double_eq(stab_max_abs_diff(x, NULL, 4), 8.0);
  /* negative maximum element: max |x| not max x */
  float neg[3] = {-5.0f, -1.0f, -2.0f};
  ck_assert_double_eq(stab_max_abs_diff(neg, NULL, 3), 5.0);
  /* difference beyond FLT_MAX */
  float big[2] = {3e38f, 0.0f}, nbig[2] = {-3e38f, 0.0f};
  ck_assert_double_eq(stab_max_abs_diff(big, nbig, 2), 2.0 * (double)3e38f);
  /* 1 + 2^-23 vs 1 */
  float p[1] = {1.0f + 0x1.0p-23f}, q[1] = {1.0f};
  ck_assert_double_eq(stab_max_abs_diff(p, q, 1), 0x1.0p-23);
}
END_TEST

/* fmax() drops NaN: a max written with it would hide a NaN that is not the first element. */
START_TEST(test_max_abs_diff_nonfinite) {
  enum { N = 129 };
  static const size_t where[] = {0, 1, N / 2, N - 1};
  float *x = tu_floats(N), *y = tu_floats(N);
  for (size_t k = 0; k < 4; k++) {
    for (size_t i = 0; i < N; i++) x[i] = y[i] = (float)i * 0.25f;
    x[where[k]] = NAN;
    TU_ASSERT_NAN(stab_max_abs_diff(x, y, N), "NaN in x at %zu", where[k]);
    TU_ASSERT_NAN(stab_max_abs_diff(x, NULL, N), "NaN in x at %zu, y NULL", where[k]);
    x[where[k]] = (float)where[k] * 0.25f;
    y[where[k]] = NAN;
    TU_ASSERT_NAN(stab_max_abs_diff(x, y, N), "NaN in y at %zu", where[k]);
    y[where[k]] = -INFINITY;
    double got = stab_max_abs_diff(x, y, N);
    ck_assert_msg(isinf(got) && got > 0, "-Inf in y at %zu: got %g, expected +Inf", where[k], got);
  }
  free(x);
  free(y);
}
END_TEST

/* ---- status, version, defaults ----------------------------------------------------- */

START_TEST(test_status_strings) {
  static const stab_status all[] = {STAB_OK,       STAB_EINVAL, STAB_EDIM,   STAB_ENOMEM,
                                    STAB_ENOTFOUND, STAB_EEXIST, STAB_ESTATE, STAB_ELAPACK,
                                    STAB_ERANGE, STAB_EFORMAT, STAB_EIO};
  enum { NS = sizeof all / sizeof all[0] };
  const char *unknown = stab_strerror((stab_status)42);
  ck_assert_ptr_nonnull(unknown);
  ck_assert_str_eq(unknown, "unknown status");
  ck_assert_str_eq(stab_strerror((stab_status)-99), "unknown status");
  for (size_t i = 0; i < NS; i++) {
    const char *s = stab_strerror(all[i]);
    ck_assert_msg(s != NULL && s[0] != '\0', "stab_strerror(%d) is empty", (int)all[i]);
    ck_assert_msg(strcmp(s, unknown) != 0, "stab_strerror(%d) is 'unknown status'", (int)all[i]);
    for (size_t j = 0; j < i; j++)
      ck_assert_msg(strcmp(s, stab_strerror(all[j])) != 0, "statuses %d and %d share '%s'",
                    (int)all[i], (int)all[j], s);
  }
  ck_assert_ptr_nonnull(stab_last_error());
}
END_TEST

START_TEST(test_version_and_kinds) {
  ck_assert_str_eq(stab_version(), STAB_VERSION_STRING);
  ck_assert_str_eq(stab_kind_name(STAB_KIND_LINEAR), "linear");
  ck_assert_str_eq(stab_kind_name(STAB_KIND_EMBEDDING), "embedding");
  ck_assert_str_eq(stab_kind_name(STAB_KIND_LM_HEAD), "lm_head");
  ck_assert_str_eq(stab_kind_name(STAB_KIND_GAIN), "gain");
  ck_assert_str_eq(stab_kind_name(STAB_KIND_BIAS), "bias");
  ck_assert_str_eq(stab_kind_name(STAB_KIND_ATTENTION), "attention");
  ck_assert_ptr_null(stab_kind_name((stab_kind)99));
  ck_assert_ptr_null(stab_kind_name((stab_kind)-1));
}
END_TEST

START_TEST(test_default_params) {
  stab_spectral_params sp = stab_spectral_default_params();
  ck_assert_int_eq(sp.method, STAB_SPECTRAL_LANCZOS);
  ck_assert_double_eq(sp.tol, 1e-3);
  ck_assert_int_eq(sp.max_passes, 1000);
  ck_assert_int_eq(sp.krylov_dim, 128);
  ck_assert_int_eq(sp.threads, 0);
  ck_assert_uint_eq(sp.seed, 0x5eed);
  stab_metrics_params mp = stab_metrics_default_params();
  ck_assert_int_eq(mp.tight, STAB_TIGHT_CENTRED);
  ck_assert_int_eq(mp.spectral.method, sp.method);
  ck_assert_double_eq(mp.spectral.tol, sp.tol);
  ck_assert_int_eq(mp.spectral.max_passes, sp.max_passes);
  ck_assert_int_eq(mp.spectral.krylov_dim, sp.krylov_dim);
  ck_assert_int_eq(mp.spectral.threads, sp.threads);
  ck_assert_uint_eq(mp.spectral.seed, sp.seed);
  stab_monitor_params monp = stab_monitor_default_params();
  ck_assert_int_eq(monp.update_mode, STAB_UPDATE_SNAPSHOT);
  ck_assert_int_eq(monp.metrics.tight, STAB_TIGHT_CENTRED);
  ck_assert_double_eq(monp.metrics.spectral.tol, 1e-3);
  ck_assert_int_eq(monp.metrics.spectral.method, STAB_SPECTRAL_LANCZOS);
}
END_TEST

static Suite *norms_suite(void) {
  Suite *s = suite_create("norms");
  TCase *tc = tcase_create("rms");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_rms_closed_forms);
  tcase_add_test(tc, test_rms_random_vs_bruteforce);
  tcase_add_test(tc, test_rms_f64_accumulation);
  tcase_add_test(tc, test_rms_stride);
  tcase_add_test(tc, test_rms_nonfinite);
  suite_add_tcase(s, tc);

  tc = tcase_create("rms_diff");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_rms_diff_vs_bruteforce);
  tcase_add_test(tc, test_rms_diff_f64);
  tcase_add_test(tc, test_rms_diff_nan);
  suite_add_tcase(s, tc);

  tc = tcase_create("max_abs_diff");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_max_abs_diff_vs_bruteforce);
  tcase_add_test(tc, test_max_abs_diff_closed_forms);
  tcase_add_test(tc, test_max_abs_diff_nonfinite);
  suite_add_tcase(s, tc);

  tc = tcase_create("status");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_status_strings);
  tcase_add_test(tc, test_version_and_kinds);
  tcase_add_test(tc, test_default_params);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(norms_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
