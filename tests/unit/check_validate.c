/* check_validate.c — every public entry point that takes a matrix, a vector or spectral
 * parameters, called with each class of bad argument (NULL, zero sizes, a stride below the row,
 * strides and sizes whose span overflows, absurd spectral parameters): each must return the
 * same status with a message naming the argument, and read nothing (the sanitizer build turns
 * any stray read into a failure). The buffer given is a real 2 x 4 matrix, so a function that
 * accepts a bad shape reads past it. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

#define BIG ((size_t)-1)

static float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* 2 x 4, row-major */

/* ---- the matrix classes ------------------------------------------------------------- */

typedef struct {
  const char *what;
  int null_ptr;
  size_t rows, cols, ld;
  stab_status want;
  const char *says; /* a piece of the message naming what is wrong */
} matrix_case;

static const matrix_case matrix_cases[] = {
    {"NULL matrix", 1, 2, 4, 0, STAB_EINVAL, "NULL"},
    {"zero rows", 0, 0, 4, 0, STAB_EDIM, "> 0"},
    {"zero cols", 0, 2, 0, 0, STAB_EDIM, "> 0"},
    {"stride below the row", 0, 2, 4, 3, STAB_EDIM, "row stride ld 3"},
    {"stride SIZE_MAX", 0, 2, 4, BIG, STAB_EDIM, "span"},
    {"stride whose span overflows by the row", 0, 2, 4, BIG - 2, STAB_EDIM, "span"},
    {"stride past PTRDIFF_MAX bytes", 0, 2, 4, (size_t)PTRDIFF_MAX / 4, STAB_EDIM, "span"},
    {"rows SIZE_MAX", 0, BIG, 4, 0, STAB_EDIM, "span"},
    {"cols SIZE_MAX", 0, 1, BIG, 0, STAB_EDIM, "span"},
    {"cols SIZE_MAX, 2 rows", 0, 2, BIG, 0, STAB_EDIM, "span"},
};
#define N_MATRIX (sizeof matrix_cases / sizeof matrix_cases[0])

/* One entry point fed a matrix case: its status; *arg the argument's name in messages. */
typedef stab_status (*matrix_call)(const matrix_case *c, const char **arg);

static const float *ptr(const matrix_case *c) { return c->null_ptr ? NULL : buf; }

static stab_status call_sigma(const matrix_case *c, const char **arg) {
  stab_sigma_result r;
  *arg = "stab_sigma: a";
  stab_status st = stab_sigma(ptr(c), c->rows, c->cols, c->ld, NULL, NULL, &r);
  if (st != STAB_OK) ck_assert_msg(isnan(r.sigma), "stab_sigma failed but left sigma %g", r.sigma);
  return st;
}

static stab_status call_spectral_norm(const matrix_case *c, const char **arg) {
  stab_spectral_workspace *ws = NULL;
  TU_ASSERT_OK(stab_spectral_workspace_create(2, 4, NULL, &ws));
  stab_sigma_result r;
  double v[4] = {0};
  *arg = "stab_spectral_norm: a";
  /* with b too: sigma(A - B) reads both with the same shape */
  stab_status st = stab_spectral_norm(ws, ptr(c), buf, c->rows, c->cols, c->ld, v, &r);
  stab_spectral_workspace_free(ws);
  return st;
}

static stab_status call_workspace(const matrix_case *c, const char **arg) {
  if (c->null_ptr || c->ld) return STAB_OK; /* no matrix, no stride: the sizes only */
  stab_spectral_workspace *ws = NULL;
  *arg = "stab_spectral_workspace_create";
  stab_status st = stab_spectral_workspace_create(c->rows, c->cols, NULL, &ws);
  ck_assert_msg(st != STAB_OK || ws != NULL, "workspace created but NULL");
  if (st != STAB_OK) ck_assert_msg(ws == NULL, "failed but *out is not NULL");
  stab_spectral_workspace_free(ws);
  return st;
}

/* A layer of the kind, its stored matrix rows x cols with stride ld. */
static stab_layer layer_for(const matrix_case *c, stab_kind kind) {
  stab_layer l;
  memset(&l, 0, sizeof l);
  l.name = "L";
  l.kind = kind;
  l.ld = c->ld;
  l.weight = ptr(c);
  switch (kind) {
  case STAB_KIND_EMBEDDING: /* [V][d] */
  case STAB_KIND_LM_HEAD: l.vocab = c->rows, l.width = c->cols; break;
  case STAB_KIND_ATTENTION: l.d_in = c->cols, l.d_out = c->rows, l.heads = 1, l.weight_k = buf; break;
  default: l.d_in = c->cols, l.d_out = c->rows; break; /* linear: out-major */
  }
  return l;
}

static stab_status layer_metrics_of(const matrix_case *c, stab_kind kind, const char **arg) {
  stab_layer l = layer_for(c, kind);
  stab_metrics m;
  double heads[1];
  *arg = "stab_layer_metrics: layer 'L'";
  if (c->null_ptr) *arg = "stab_layer_metrics: layer 'L' has no weight";
  /* with an update as well: before is read with the layer's shape */
  stab_layer before = l;
  before.weight = buf;
  return stab_layer_metrics(&l, &before, NULL, &m, kind == STAB_KIND_ATTENTION ? heads : NULL);
}

static stab_status call_linear(const matrix_case *c, const char **arg) {
  return layer_metrics_of(c, STAB_KIND_LINEAR, arg);
}
static stab_status call_embedding(const matrix_case *c, const char **arg) {
  return layer_metrics_of(c, STAB_KIND_EMBEDDING, arg);
}
static stab_status call_lm_head(const matrix_case *c, const char **arg) {
  return layer_metrics_of(c, STAB_KIND_LM_HEAD, arg);
}
static stab_status call_attention(const matrix_case *c, const char **arg) {
  return layer_metrics_of(c, STAB_KIND_ATTENTION, arg);
}

static stab_status call_add_layer(const matrix_case *c, const char **arg) {
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  stab_layer l = layer_for(c, STAB_KIND_LINEAR);
  size_t idx = 99;
  *arg = c->null_ptr ? "stab_monitor_add_layer: layer 'L' has no weight" : "stab_monitor_add_layer: layer 'L'";
  stab_status st = stab_monitor_add_layer(m, &l, &idx);
  if (st != STAB_OK) {
    ck_assert_uint_eq(stab_monitor_layer_count(m), 0);
    ck_assert_uint_eq(idx, 99);
  } else {
    stab_monitor_snapshot(m); /* a shape wrongly accepted is read here */
  }
  stab_monitor_free(m);
  return st;
}

/* The steepest-descent helpers take contiguous matrices (no stride): the stride cases do not
 * apply. Their outputs are buffers as large as the valid 2 x 4 case needs: a shape wrongly
 * accepted writes past them (ASan). */
static stab_status call_msign(const matrix_case *c, const char **arg) {
  if (c->ld) return STAB_OK;
  float out[8], work[64];
  *arg = "stab_msign: g";
  return stab_msign(ptr(c), c->rows, c->cols, STAB_MSIGN_QUINTIC, 5, out, work);
}

static stab_status call_normalize_rows(const matrix_case *c, const char **arg) {
  if (c->ld) return STAB_OK;
  float out[8];
  *arg = "stab_normalize_rows: g";
  return stab_normalize_rows(ptr(c), c->rows, c->cols, 1.0, out);
}

static const struct {
  const char *name;
  matrix_call call;
} matrix_calls[] = {
    {"stab_msign", call_msign},
    {"stab_normalize_rows", call_normalize_rows},
    {"stab_sigma", call_sigma},
    {"stab_spectral_norm", call_spectral_norm},
    {"stab_spectral_workspace_create", call_workspace},
    {"stab_layer_metrics linear", call_linear},
    {"stab_layer_metrics embedding", call_embedding},
    {"stab_layer_metrics lm_head", call_lm_head},
    {"stab_layer_metrics attention", call_attention},
    {"stab_monitor_add_layer", call_add_layer},
};
#define N_MATRIX_CALLS (sizeof matrix_calls / sizeof matrix_calls[0])

START_TEST(test_bad_matrix) {
  const size_t f = (size_t)_i / N_MATRIX, k = (size_t)_i % N_MATRIX;
  const matrix_case *c = &matrix_cases[k];
  const char *arg = NULL;
  stab_status st = matrix_calls[f].call(c, &arg);
  if (!arg) return; /* the case does not apply to this entry point */
  ck_assert_msg(st == c->want, "%s, %s: status %d (%s), expected %s; message: %s", matrix_calls[f].name,
                c->what, (int)st, stab_strerror(st), stab_strerror(c->want), stab_last_error());
  ck_assert_msg(strstr(stab_last_error(), arg) && strstr(stab_last_error(), c->says),
                "%s, %s: message '%s' does not name '%s' and say '%s'", matrix_calls[f].name, c->what,
                stab_last_error(), arg, c->says);
}
END_TEST

/* ---- vectors: the RMS helpers return NaN and say why ---------------------------------- */

typedef struct {
  const char *what;
  int null_ptr;
  size_t n, stride;
  const char *says;
} vector_case;

static const vector_case vector_cases[] = {
    {"NULL", 1, 4, 1, "NULL"},
    {"n 0", 0, 0, 1, "> 0"},
    {"stride 0", 0, 4, 0, "stride is 0"},
    {"n SIZE_MAX", 0, BIG, 1, "span"},
    {"stride SIZE_MAX", 0, 2, BIG, "span"},
    {"stride past PTRDIFF_MAX bytes", 0, 2, (size_t)PTRDIFF_MAX / 4, "span"},
};
#define N_VECTOR (sizeof vector_cases / sizeof vector_cases[0])

START_TEST(test_bad_vector) {
  const vector_case *c = &vector_cases[_i];
  const float *x = c->null_ptr ? NULL : buf;
  static const char *const who[] = {"stab_rms: x", "stab_rms_diff: a", "stab_max_abs_diff: x"};
  for (int f = 0; f < 3; f++) {
    if (f > 0 && c->stride != 1) continue; /* the diff helpers have no stride */
    double r = f == 0 ? stab_rms(x, c->n, c->stride) : f == 1 ? stab_rms_diff(x, buf, c->n) : stab_max_abs_diff(x, buf, c->n);
    ck_assert_msg(isnan(r), "%s, %s: %g, expected NaN", who[f], c->what, r);
    ck_assert_msg(strstr(stab_last_error(), c->says) && (c->stride == 0 || strstr(stab_last_error(), who[f])),
                  "%s, %s: message '%s' does not say '%s'", who[f], c->what, stab_last_error(), c->says);
  }
}
END_TEST

/* ---- spectral parameters ------------------------------------------------------------- */

typedef struct {
  const char *what;
  stab_spectral_method method;
  double tol;
  int max_passes, krylov_dim, threads;
  const char *says;
} params_case;

static const params_case params_cases[] = {
    {"method 99", (stab_spectral_method)99, 1e-3, 1000, 128, 0, "method"},
    {"method -1", (stab_spectral_method)-1, 1e-3, 1000, 128, 0, "method"},
    {"tol NaN", STAB_SPECTRAL_LANCZOS, NAN, 1000, 128, 0, "tol"},
    {"tol -1e-3", STAB_SPECTRAL_LANCZOS, -1e-3, 1000, 128, 0, "tol"},
    {"tol 0", STAB_SPECTRAL_LANCZOS, 0.0, 1000, 128, 0, "tol"},
    {"tol 1e-300", STAB_SPECTRAL_LANCZOS, 1e-300, 1000, 128, 0, "tol"},
    {"tol 1e-13", STAB_SPECTRAL_LANCZOS, 1e-13, 1000, 128, 0, "tol"},
    {"tol 0.5", STAB_SPECTRAL_LANCZOS, 0.5, 1000, 128, 0, "tol"},
    {"tol inf", STAB_SPECTRAL_LANCZOS, INFINITY, 1000, 128, 0, "tol"},
    {"max_passes 0", STAB_SPECTRAL_LANCZOS, 1e-3, 0, 128, 0, "max_passes"},
    {"max_passes -1", STAB_SPECTRAL_LANCZOS, 1e-3, -1, 128, 0, "max_passes"},
    {"max_passes INT_MIN", STAB_SPECTRAL_LANCZOS, 1e-3, INT_MIN, 128, 0, "max_passes"},
    {"max_passes INT_MAX", STAB_SPECTRAL_LANCZOS, 1e-3, INT_MAX, 128, 0, "max_passes"},
    {"krylov_dim 1", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, 1, 0, "krylov_dim"},
    {"krylov_dim -5", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, -5, 0, "krylov_dim"},
    {"krylov_dim INT_MAX", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, INT_MAX, 0, "krylov_dim"},
    {"krylov_dim INT_MAX, power", STAB_SPECTRAL_POWER, 1e-3, 1000, INT_MAX, 0, "krylov_dim"},
    {"krylov_dim 1025", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, 1025, 0, "krylov_dim"},
    {"threads -1", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, 128, -1, "threads"},
    {"threads INT_MIN", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, 128, INT_MIN, "threads"},
};
#define N_PARAMS (sizeof params_cases / sizeof params_cases[0])

static stab_spectral_params params_of(const params_case *c) {
  stab_spectral_params p = stab_spectral_default_params();
  p.method = c->method, p.tol = c->tol, p.max_passes = c->max_passes;
  p.krylov_dim = c->krylov_dim, p.threads = c->threads;
  return p;
}

START_TEST(test_bad_params) {
  const params_case *c = &params_cases[_i];
  const stab_spectral_params p = params_of(c);
  stab_status st[4];
  const char *who[4] = {"stab_sigma", "stab_spectral_workspace_create", "stab_layer_metrics", "stab_monitor_create"};
  char msg[4][512];
  stab_sigma_result r;
  st[0] = stab_sigma(buf, 2, 4, 0, &p, NULL, &r);
  snprintf(msg[0], sizeof msg[0], "%s", stab_last_error());
  stab_spectral_workspace *ws = NULL;
  st[1] = stab_spectral_workspace_create(2, 4, &p, &ws);
  snprintf(msg[1], sizeof msg[1], "%s", stab_last_error());
  stab_spectral_workspace_free(ws);
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral = p;
  stab_layer l = {.name = "L", .kind = STAB_KIND_LINEAR, .d_in = 4, .d_out = 2, .weight = buf};
  stab_metrics m;
  st[2] = stab_layer_metrics(&l, NULL, &mp, &m, NULL);
  snprintf(msg[2], sizeof msg[2], "%s", stab_last_error());
  stab_monitor_params monp = stab_monitor_default_params();
  monp.metrics.spectral = p;
  stab_monitor *mon = NULL;
  st[3] = stab_monitor_create(&monp, &mon);
  snprintf(msg[3], sizeof msg[3], "%s", stab_last_error());
  stab_monitor_free(mon);
  for (int f = 0; f < 4; f++) {
    ck_assert_msg(st[f] == STAB_EINVAL, "%s, %s: status %d (%s), expected invalid argument; message: %s", who[f],
                  c->what, (int)st[f], stab_strerror(st[f]), msg[f]);
    ck_assert_msg(strstr(msg[f], who[f]) && strstr(msg[f], c->says), "%s, %s: message '%s' does not name %s",
                  who[f], c->what, msg[f], c->says);
  }
}
END_TEST

/* The bounds themselves are accepted, and measure. */
/* The helpers' own limits: stab_sign's n floats must be addressable, and stab_msign hands its
 * sides to cblas_sgemm as int, so a side above INT_MAX (whose span is fine) is refused rather
 * than cut short. */
START_TEST(test_steepest_limits) {
  float out[8], work[64];
  TU_ASSERT_STATUS(stab_sign(buf, BIG, 1.0, out), STAB_EDIM);
  ck_assert_msg(strstr(stab_last_error(), "stab_sign: g"), "message: %s", stab_last_error());
  TU_ASSERT_STATUS(stab_msign(buf, (size_t)INT_MAX + 1, 1, STAB_MSIGN_QUINTIC, 5, out, work), STAB_EDIM);
  ck_assert_msg(strstr(stab_last_error(), "above"), "message: %s", stab_last_error());
  TU_ASSERT_STATUS(stab_msign(buf, 1, (size_t)INT_MAX + 1, STAB_MSIGN_CUBIC, 5, out, work), STAB_EDIM);
  TU_ASSERT_OK(stab_sign(buf, 0, 1.0, out)); /* nothing to do */
}
END_TEST

START_TEST(test_params_at_bounds) {
  static const params_case ok[] = {
      {"tol STAB_SPECTRAL_TOL_MIN", STAB_SPECTRAL_LANCZOS, STAB_SPECTRAL_TOL_MIN, 1000, 128, 0, ""},
      {"max_passes STAB_SPECTRAL_MAX_PASSES", STAB_SPECTRAL_POWER, 1e-3, STAB_SPECTRAL_MAX_PASSES, 128, 0, ""},
      {"krylov_dim STAB_SPECTRAL_KRYLOV_MAX", STAB_SPECTRAL_LANCZOS, 1e-3, 1000, STAB_SPECTRAL_KRYLOV_MAX, 0, ""},
  };
  tu_rng rng;
  tu_rng_init(&rng, 77);
  float *a = tu_floats(300 * 64); /* wider than the exact small-matrix path, long enough for threads */
  tu_fill_gauss(a, 300, 64, 64, 1.0, &rng);
  double ref = ref_sigma(a, 300, 64, 64);
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    stab_spectral_params p = params_of(&ok[i]);
    stab_sigma_result r;
    TU_ASSERT_OK(stab_sigma(a, 300, 64, 0, &p, NULL, &r), "%s", ok[i].what);
    ck_assert_msg(r.converged, "%s: not converged (rel_err %g)", ok[i].what, r.rel_err);
    TU_ASSERT_REL(r.sigma, ref, 2 * p.tol + 1e-12, "%s", ok[i].what);
  }
  free(a);
}
END_TEST

/* Any thread count >= 0 is valid: a pass uses at most its 16 row chunks, so INT_MAX threads
 * (which OpenMP cannot create: libgomp aborts) give the bits of one thread. */
START_TEST(test_threads_int_max) {
  const size_t n = 1024; /* 2^20 elements: large enough for a pass to go parallel */
  tu_rng rng;
  tu_rng_init(&rng, 78);
  float *a = tu_floats(n * n);
  tu_fill_gauss(a, n, n, n, 1.0, &rng);
  stab_spectral_params p = stab_spectral_default_params();
  stab_sigma_result one, many;
  p.threads = 1;
  TU_ASSERT_OK(stab_sigma(a, n, n, 0, &p, NULL, &one));
  p.threads = INT_MAX;
  TU_ASSERT_OK(stab_sigma(a, n, n, 0, &p, NULL, &many));
  ck_assert_msg(one.sigma == many.sigma && one.passes == many.passes,
                "threads INT_MAX: sigma %.17g in %d passes, one thread %.17g in %d", many.sigma, many.passes,
                one.sigma, one.passes);
  free(a);
}
END_TEST

/* ---- layer names --------------------------------------------------------------------- */

START_TEST(test_names_utf8) {
  static const char *const bad[] = {"\xff", "fc\xc3", "a\xc0\xaf" "b", "\xed\xa0\x80", "x\xf4\x90\x80\x80"};
  static const size_t at[] = {0, 2, 1, 0, 1};
  stab_layer l = {.kind = STAB_KIND_LINEAR, .d_in = 4, .d_out = 2, .weight = buf};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char want[64];
    snprintf(want, sizeof want, "not valid UTF-8 (byte %zu ", at[i]);
    l.name = bad[i];
    stab_monitor *m = NULL;
    TU_ASSERT_OK(stab_monitor_create(NULL, &m));
    TU_ASSERT_STATUS(stab_monitor_add_layer(m, &l, NULL), STAB_EINVAL, "name %zu", i);
    ck_assert_msg(strstr(stab_last_error(), "stab_monitor_add_layer") && strstr(stab_last_error(), want),
                  "name %zu: message '%s'", i, stab_last_error());
    ck_assert_uint_eq(stab_monitor_layer_count(m), 0);
    stab_monitor_free(m);
    stab_metrics out;
    TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &out, NULL), STAB_EINVAL, "name %zu", i);
    ck_assert_msg(strstr(stab_last_error(), "stab_layer_metrics") && strstr(stab_last_error(), want),
                  "name %zu: message '%s'", i, stab_last_error());
  }
  /* valid names of every length of sequence pass, NULL too outside a monitor */
  static const char *const good[] = {"h.0.attn", "caf\xc3\xa9", "\xe2\x80\xae", "\xf0\x9f\x98\x80"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    l.name = good[i];
    stab_metrics out;
    TU_ASSERT_OK(stab_layer_metrics(&l, NULL, NULL, &out, NULL), "good name %zu", i);
  }
  l.name = NULL;
  stab_metrics out;
  TU_ASSERT_OK(stab_layer_metrics(&l, NULL, NULL, &out, NULL), "NULL name");
}
END_TEST

static Suite *validate_suite(void) {
  Suite *s = suite_create("validate");
  TCase *tc = tcase_create("matrices");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_bad_matrix, 0, (int)(N_MATRIX_CALLS * N_MATRIX));
  tcase_add_loop_test(tc, test_bad_vector, 0, (int)N_VECTOR);
  suite_add_tcase(s, tc);
  tc = tcase_create("params");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_bad_params, 0, (int)N_PARAMS);
  tcase_add_test(tc, test_params_at_bounds);
  tcase_add_test(tc, test_steepest_limits);
  tcase_add_test(tc, test_threads_int_max);
  suite_add_tcase(s, tc);
  tc = tcase_create("names");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_names_utf8);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(validate_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
