/* check_linear_parts.c — stab_linear_metrics_assemble: a linear layer's metrics from its
 * whole-layer parts, against the closed forms of docs/manual/metrics.md on chosen numbers, against
 * stab_layer_metrics on the same layer (its parts measured independently: stab_sigma, sums of
 * squares in f64), and its flags, NaN and errors. */
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

static stab_sigma_result converged(double sigma, double rel_err, int passes) {
  stab_sigma_result r = {0};
  r.sigma = sigma;
  r.rel_err = rel_err;
  r.passes = passes;
  r.converged = 1;
  return r;
}

/* d_in 4, d_out 16: sqrt(d_in / d_out) = 1/2, every value exact in binary */
static stab_linear_parts chosen(void) {
  stab_linear_parts p = {.d_in = 4, .d_out = 16};
  p.weight = converged(3.0, 1e-4, 7);
  p.bias_rms = 0.25;
  p.with_update = 1;
  p.update = converged(0.5, 2e-4, 5);
  p.bias_update_rms = 0.125;
  p.weight_sumsq = 100.0;
  p.update_sumsq = 0.75;
  return p;
}

START_TEST(test_closed_forms) {
  stab_linear_parts p = chosen();
  stab_metrics m;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert(m.sigma == 3.0 && m.sigma_rel_err == 1e-4 && m.passes == 7);
  ck_assert(m.dependency == 1.5 && m.forward == 1.75);
  ck_assert(m.sigma_update == 0.5 && m.sigma_update_rel_err == 2e-4 && m.update_passes == 5);
  ck_assert(m.update == 0.375);
  /* ||dW, db||^2 = 0.75 + 0.125^2 16 = 1, ||W, b||^2 = 100 + 0.25^2 16 = 101 */
  TU_ASSERT_REL(m.rel_update, 1.0 / sqrt(101.0), 1e-15, "rel_update");
  ck_assert_int_eq(m.flags, 0);
  TU_ASSERT_NAN(m.forward_tight, "forward_tight");
  TU_ASSERT_NAN(m.spread, "spread");
  /* without an update: the update's fields NaN and counts 0, whatever they hold */
  p.with_update = 0;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert(m.forward == 1.75);
  TU_ASSERT_NAN(m.update, "update");
  TU_ASSERT_NAN(m.sigma_update, "sigma_update");
  TU_ASSERT_NAN(m.rel_update, "rel_update");
  ck_assert_int_eq(m.update_passes, 0);
  /* not converged: flagged, the values kept */
  p = chosen();
  p.update.converged = 0;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert_int_eq(m.flags, STAB_FLAG_NOT_CONVERGED);
  ck_assert(m.update == 0.375);
}
END_TEST

START_TEST(test_nonfinite) {
  stab_linear_parts p = chosen();
  stab_metrics m;
  p.weight.nonfinite = 1;
  p.weight.converged = 0; /* a nonfinite estimate is not also "not converged" */
  p.weight.sigma = NAN;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert_int_eq(m.flags, STAB_FLAG_NONFINITE_WEIGHT);
  TU_ASSERT_NAN(m.forward, "forward");
  TU_ASSERT_NAN(m.dependency, "dependency");
  TU_ASSERT_NAN(m.sigma, "sigma");
  ck_assert(m.update == 0.375); /* the update is finite */
  p = chosen();
  p.bias_rms = INFINITY;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert_int_eq(m.flags, STAB_FLAG_NONFINITE_WEIGHT);
  TU_ASSERT_NAN(m.forward, "forward, infinite bias");
  p = chosen();
  p.update_sumsq = NAN;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert_int_eq(m.flags, STAB_FLAG_NONFINITE_UPDATE);
  TU_ASSERT_NAN(m.update, "update");
  TU_ASSERT_NAN(m.rel_update, "rel_update");
  ck_assert(m.forward == 1.75);
  p = chosen();
  p.bias_update_rms = NAN;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &m), STAB_OK);
  ck_assert_int_eq(m.flags, STAB_FLAG_NONFINITE_UPDATE);
}
END_TEST

/* The parts of a whole layer measured here, with the library's public pieces and sums of our
 * own, give stab_layer_metrics' metrics: the same bits for what comes from the same estimate
 * (a cold stab_sigma with the same params), 1e-15 for what comes from sums of squares. */
START_TEST(test_matches_layer_metrics) {
  const size_t d_out = 48, d_in = 40;
  tu_rng r;
  tu_rng_init(&r, 17);
  float *w = tu_floats(d_out * d_in), *w0 = tu_floats(d_out * d_in), *b = tu_floats(d_out), *b0 = tu_floats(d_out);
  float *dw = tu_floats(d_out * d_in);
  tu_fill_lowrank(w0, d_out, d_in, d_in, 3, 0.1, &r);
  tu_fill_gauss(dw, d_out, d_in, d_in, 0.01, &r);
  tu_fill_gauss(b0, 1, d_out, d_out, 0.1, &r);
  double w2 = 0.0, dw2 = 0.0;
  for (size_t i = 0; i < d_out * d_in; i++) {
    /* on the grid of 2^-20 (|values| < 8): W - before is exact in f32, as stab_sigma takes it,
     * and in f64, as the few-rows Gram matrix of stab_layer_metrics' cold estimate forms it */
    w0[i] = (float)(nearbyint((double)w0[i] / 16.0 * 0x1p20) * 0x1p-20); /* the spike 10 / 16 */
    w[i] = (float)(nearbyint((double)(w0[i] + dw[i]) * 0x1p20) * 0x1p-20);
    dw[i] = w[i] - w0[i];
    w2 += (double)w[i] * (double)w[i];
    const double d = (double)w[i] - (double)w0[i];
    dw2 += d * d;
  }
  for (size_t i = 0; i < d_out; i++) b[i] = b0[i] + 0.01f;
  stab_layer l = {.kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out, .weight = w, .bias = b};
  stab_layer l0 = {.weight = w0, .bias = b0};
  stab_metrics_params mp = stab_metrics_default_params();
  stab_metrics want, got;
  ck_assert_int_eq(stab_layer_metrics(&l, &l0, &mp, &want, NULL), STAB_OK);
  stab_linear_parts p = {.d_in = d_in, .d_out = d_out, .with_update = 1};
  ck_assert_int_eq(stab_sigma(w, d_out, d_in, 0, &mp.spectral, NULL, &p.weight), STAB_OK);
  ck_assert_int_eq(stab_sigma(dw, d_out, d_in, 0, &mp.spectral, NULL, &p.update), STAB_OK);
  p.bias_rms = stab_rms_diff(b, NULL, d_out);
  p.bias_update_rms = stab_rms_diff(b, b0, d_out);
  p.weight_sumsq = w2;
  p.update_sumsq = dw2;
  ck_assert_int_eq(stab_linear_metrics_assemble(&p, &got), STAB_OK);
  ck_assert(got.sigma == want.sigma && got.dependency == want.dependency && got.forward == want.forward);
  ck_assert(got.sigma_update == want.sigma_update && got.update == want.update);
  ck_assert(got.passes == want.passes && got.update_passes == want.update_passes && got.flags == want.flags);
  TU_ASSERT_REL(got.rel_update, want.rel_update, 1e-15, "rel_update");
  free(w);
  free(w0);
  free(b);
  free(b0);
  free(dw);
}
END_TEST

START_TEST(test_errors) {
  stab_linear_parts p = chosen();
  stab_metrics m;
  TU_ASSERT_STATUS(stab_linear_metrics_assemble(NULL, &m), STAB_EINVAL, "parts NULL");
  TU_ASSERT_NAN(m.forward, "forward after parts NULL");
  TU_ASSERT_STATUS(stab_linear_metrics_assemble(&p, NULL), STAB_EINVAL, "out NULL");
  p.d_out = 0;
  TU_ASSERT_STATUS(stab_linear_metrics_assemble(&p, &m), STAB_EDIM, "d_out 0");
  TU_ASSERT_NAN(m.sigma, "sigma after d_out 0");
  ck_assert(strstr(stab_last_error(), "d_out 0") != NULL);
}
END_TEST

static Suite *linear_parts_suite(void) {
  Suite *s = suite_create("linear_parts");
  TCase *tc = tcase_create("assemble");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_closed_forms);
  tcase_add_test(tc, test_nonfinite);
  tcase_add_test(tc, test_matches_layer_metrics);
  tcase_add_test(tc, test_errors);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(linear_parts_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
