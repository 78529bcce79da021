/* check_trace_read.c — the library's trace reader (<stabmeter/trace_read.h>) against what was
 * written: a trace written through the monitor and stab_trace_append read back bit for bit (steps,
 * wall_time, scalars, every layer's metrics as the monitor gave them, the extras, the attention
 * heads' bounds, the layers' attributes, run_config), any range of rows; the selection; a trace
 * read over and over while a writer thread of the same process writes another (the shared HDF5
 * lock); and every bad argument and bad file refused with its status and a message naming it. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stabmeter.h"
#include "testutil.h"

enum { D = 16, HEADS = 2, ROWS = 7, NL = 3 };

static char tmpdir[64];

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

/* Each test in a directory of its own (a checked fixture: run in the test's process). */
static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_trace_read"); }

static void remove_tmpdir(void) { tu_tmpdir_remove(tmpdir); }

static const char *const scalar_names[] = {"loss", "lr"};
static const char *const extra_names[] = {"act_rms"};
static const char *const layer_names[] = {"h.10.fc", "h.2.fc", "attn"}; /* read back: attn, h.2.fc, h.10.fc */

typedef struct {
  stab_monitor *m;
  float *w[NL], *wk;
  /* what was appended, row by row */
  int64_t steps[ROWS];
  double wall[ROWS], scalars[ROWS][2], extras[ROWS][NL];
  stab_metrics metrics[ROWS][NL];
  double heads[ROWS][HEADS];
  size_t rows;
} run;

static void run_init(run *x, tu_rng *r) {
  memset(x, 0, sizeof *x);
  TU_ASSERT_OK(stab_monitor_create(NULL, &x->m));
  for (size_t i = 0; i < NL; i++) {
    x->w[i] = tu_floats(D * D);
    tu_fill_gauss(x->w[i], D, D, D, 0.2, r);
    stab_layer l = {.name = layer_names[i], .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D, .weight = x->w[i]};
    if (i == 2) {
      x->wk = tu_floats(D * D);
      tu_fill_gauss(x->wk, D, D, D, 0.2, r);
      l.kind = STAB_KIND_ATTENTION, l.weight_k = x->wk, l.heads = HEADS;
    }
    TU_ASSERT_OK(stab_monitor_add_layer(x->m, &l, NULL));
  }
}

static void run_free(run *x) {
  stab_monitor_free(x->m);
  for (size_t i = 0; i < NL; i++) free(x->w[i]);
  free(x->wk);
}

static stab_trace *open_trace(const char *path, run *x, int flush_every) {
  stab_trace_params p = stab_trace_default_params();
  p.flush_every = flush_every;
  p.run_config = "{\"what\": \"check_trace_read\"}";
  p.scalars = scalar_names, p.n_scalars = 2;
  p.layer_extras = extra_names, p.n_layer_extras = 1;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, x->m, &p, &t));
  return t;
}

/* One step measured and appended, what was handed over recorded in x. */
static void append_row(run *x, stab_trace *t, tu_rng *r, int64_t step) {
  TU_ASSERT_OK(stab_monitor_snapshot(x->m));
  for (size_t i = 0; i < NL; i++) tu_add_relative_noise(x->w[i], D, D, D, 0.01, r);
  TU_ASSERT_OK(stab_monitor_measure(x->m, 1));
  size_t k = x->rows++;
  x->steps[k] = step;
  x->wall[k] = 0.25 * (double)k + 1.0 / 3.0;
  x->scalars[k][0] = 2.0 / (double)(k + 1);
  x->scalars[k][1] = k == 3 ? NAN : 1e-3 * (double)k;
  for (size_t i = 0; i < NL; i++) {
    x->extras[k][i] = k == 2 ? -0.0 : tu_rng_gauss(r);
    x->metrics[k][i] = *stab_monitor_metrics(x->m, i);
  }
  memcpy(x->heads[k], stab_monitor_head_bounds(x->m, 2), sizeof x->heads[k]);
  TU_ASSERT_OK(stab_trace_append(t, step, x->wall[k], x->scalars[k], x->extras[k]));
}

/* a == b as bits (NaN equals NaN; -0 differs from 0). */
static int same(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static size_t metric_index(stab_trace_reader *rd, size_t layer, const char *name) {
  for (size_t c = 0; c < stab_trace_read_metric_count(rd, layer); c++)
    if (!strcmp(stab_trace_read_metric_name(rd, layer, c), name)) return c;
  ck_abort_msg("layer %s has no metric %s", stab_trace_read_layer_name(rd, layer), name);
  return 0;
}

static void write_trace(const char *path, run *x, tu_rng *r) {
  run_init(x, r);
  stab_trace *t = open_trace(path, x, 1);
  for (int64_t s = 1; s <= ROWS; s++) append_row(x, t, r, 10 * s);
  TU_ASSERT_OK(stab_trace_close(t));
}

START_TEST(test_values) {
  tu_rng r;
  tu_rng_init(&r, 7);
  run x;
  const char *path = tmp_path("values.h5");
  write_trace(path, &x, &r);
  stab_trace_reader *rd = NULL;
  TU_ASSERT_OK(stab_trace_read_open(path, NULL, &rd));
  ck_assert_int_eq(stab_trace_read_format_version(rd), 4);
  ck_assert_int_eq(stab_trace_read_rows(rd), ROWS);
  ck_assert_int_eq(stab_trace_read_live(rd), 0);
  ck_assert_int_eq(stab_trace_read_is_file(rd, path), 1);
  ck_assert_int_eq(stab_trace_read_is_file(rd, tmpdir), 0);
  const char *json = NULL;
  TU_ASSERT_OK(stab_trace_read_run_config(rd, &json));
  ck_assert_str_eq(json, "{\"what\": \"check_trace_read\"}");

  int64_t steps[ROWS];
  double v[ROWS];
  TU_ASSERT_OK(stab_trace_read_steps(rd, 0, ROWS, steps));
  for (size_t k = 0; k < ROWS; k++) ck_assert_int_eq(steps[k], x.steps[k]);
  ck_assert(stab_trace_read_has_wall_time(rd));
  TU_ASSERT_OK(stab_trace_read_wall_time(rd, 0, ROWS, v));
  for (size_t k = 0; k < ROWS; k++) ck_assert_msg(same(v[k], x.wall[k]), "wall_time row %zu", k);
  ck_assert_uint_eq(stab_trace_read_scalar_count(rd), 2);
  for (size_t s = 0; s < 2; s++) {
    ck_assert_str_eq(stab_trace_read_scalar_name(rd, s), scalar_names[s]);
    TU_ASSERT_OK(stab_trace_read_scalar(rd, s, 0, ROWS, v));
    for (size_t k = 0; k < ROWS; k++) ck_assert_msg(same(v[k], x.scalars[k][s]), "%s row %zu", scalar_names[s], k);
  }
  /* the layers in name order, numbers as numbers; each layer's columns, the writer's first */
  static const size_t order[NL] = {2, 1, 0};
  ck_assert_uint_eq(stab_trace_read_layer_count(rd), NL);
  for (size_t l = 0; l < NL; l++) {
    const size_t i = order[l];
    ck_assert_str_eq(stab_trace_read_layer_name(rd, l), layer_names[i]);
    ck_assert_str_eq(stab_trace_read_layer_kind(rd, l), i == 2 ? "attention" : "linear");
    ck_assert_str_eq(stab_trace_read_metric_name(rd, l, 0), "forward");
    ck_assert_str_eq(stab_trace_read_metric_name(rd, l, 1), "dependency");
    ck_assert_str_eq(stab_trace_read_metric_name(rd, l, 2), "update");
    static const char *const fields[] = {"sigma", "sigma_update", "rel_update"};
    for (size_t f = 0; f < 3; f++) {
      TU_ASSERT_OK(stab_trace_read_metric(rd, l, metric_index(rd, l, fields[f]), 0, ROWS, v));
      for (size_t k = 0; k < ROWS; k++) {
        const stab_metrics *m = &x.metrics[k][i];
        double want = f == 0 ? m->sigma : f == 1 ? m->sigma_update : m->rel_update;
        ck_assert_msg(same(v[k], want), "%s %s row %zu: %.17g, wrote %.17g", layer_names[i], fields[f], k, v[k], want);
      }
    }
    TU_ASSERT_OK(stab_trace_read_metric(rd, l, metric_index(rd, l, "act_rms"), 0, ROWS, v));
    for (size_t k = 0; k < ROWS; k++) ck_assert_msg(same(v[k], x.extras[k][i]), "%s act_rms row %zu", layer_names[i], k);
    for (size_t h = 0; i == 2 && h < HEADS; h++) {
      char name[32];
      snprintf(name, sizeof name, "head%zu_bound", h);
      TU_ASSERT_OK(stab_trace_read_metric(rd, l, metric_index(rd, l, name), 0, ROWS, v));
      for (size_t k = 0; k < ROWS; k++) ck_assert_msg(same(v[k], x.heads[k][h]), "%s row %zu", name, k);
    }
    const stab_trace_attr *a = NULL;
    size_t n = 0, seen = 0;
    TU_ASSERT_OK(stab_trace_read_layer_attrs(rd, l, &a, &n));
    for (size_t j = 0; j < n; j++) {
      if (j) ck_assert_msg(strcmp(a[j - 1].name, a[j].name) < 0, "attributes in name order");
      if (!strcmp(a[j].name, "d_in") || !strcmp(a[j].name, "d_out")) {
        ck_assert_ptr_null(a[j].text);
        ck_assert_int_eq(a[j].value, D);
        seen++;
      } else if (!strcmp(a[j].name, "kind")) {
        ck_assert_str_eq(a[j].text, stab_trace_read_layer_kind(rd, l));
        seen++;
      } else if (!strcmp(a[j].name, "param_count")) {
        ck_assert_int_eq(a[j].value, i == 2 ? 2 * D * D : D * D);
        seen++;
      }
    }
    ck_assert_uint_eq(seen, 4);
  }
  /* a range inside: rows 2..4 of a column */
  TU_ASSERT_OK(stab_trace_read_steps(rd, 2, 3, steps));
  ck_assert_int_eq(steps[0], x.steps[2]);
  ck_assert_int_eq(steps[2], x.steps[4]);
  TU_ASSERT_OK(stab_trace_read_steps(rd, ROWS, 0, steps)); /* nothing, at the end */
  stab_trace_read_close(rd);
  run_free(&x);
}
END_TEST

START_TEST(test_selection) {
  tu_rng r;
  tu_rng_init(&r, 8);
  run x;
  const char *path = tmp_path("selection.h5");
  write_trace(path, &x, &r);
  const char *const globs[] = {"h.*"};
  const char *const metrics[] = {"update", "lr"};
  stab_trace_read_params p = stab_trace_read_default_params();
  p.layer_globs = globs, p.n_layer_globs = 1, p.metrics = metrics, p.n_metrics = 2;
  stab_trace_reader *rd = NULL;
  TU_ASSERT_OK(stab_trace_read_open(path, &p, &rd));
  ck_assert(!stab_trace_read_has_wall_time(rd));
  ck_assert_uint_eq(stab_trace_read_scalar_count(rd), 1);
  ck_assert_str_eq(stab_trace_read_scalar_name(rd, 0), "lr");
  ck_assert_uint_eq(stab_trace_read_layer_count(rd), 2);
  for (size_t l = 0; l < 2; l++) {
    ck_assert_uint_eq(stab_trace_read_metric_count(rd, l), 1);
    ck_assert_str_eq(stab_trace_read_metric_name(rd, l, 0), "update");
  }
  double v[ROWS];
  TU_ASSERT_STATUS(stab_trace_read_wall_time(rd, 0, ROWS, v), STAB_ERANGE);
  stab_trace_read_close(rd);
  /* a pattern or a name that selects nothing: a typo, named */
  const char *const none[] = {"nothing*"};
  p = stab_trace_read_default_params();
  p.layer_globs = none, p.n_layer_globs = 1;
  TU_ASSERT_STATUS(stab_trace_read_open(path, &p, &rd), STAB_EFORMAT);
  ck_assert_ptr_null(rd);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "nothing*"), "%s", stab_last_error());
  p = stab_trace_read_default_params();
  p.metrics = none, p.n_metrics = 1;
  TU_ASSERT_STATUS(stab_trace_read_open(path, &p, &rd), STAB_EFORMAT);
  ck_assert_msg(strstr(stab_last_error(), "nothing*"), "%s", stab_last_error());
  run_free(&x);
}
END_TEST

/* Readers in this thread while the library's writer thread writes another trace: each HDF5 call
 * of either waits for the other's (on an HDF5 built without thread safety, the calls would
 * otherwise corrupt its state). */
START_TEST(test_while_a_writer_thread_writes) {
  tu_rng r;
  tu_rng_init(&r, 9);
  run done, live;
  const char *path = tmp_path("done.h5");
  write_trace(path, &done, &r);
  run_init(&live, &r);
  stab_trace *t = open_trace(tmp_path("live.h5"), &live, 0); /* flush_every 0: the writer thread */
  for (int64_t s = 1; s <= ROWS; s++) {
    append_row(&live, t, &r, s);
    TU_ASSERT_OK(stab_trace_flush(t)); /* the writer thread writes while the reader below reads */
    for (int i = 0; i < 5; i++) {
      stab_trace_reader *rd = NULL;
      TU_ASSERT_OK(stab_trace_read_open(path, NULL, &rd));
      double v[ROWS];
      TU_ASSERT_OK(stab_trace_read_metric(rd, 0, 0, 0, ROWS, v));
      ck_assert(same(v[ROWS - 1], done.metrics[ROWS - 1][2].forward));
      stab_trace_read_close(rd);
    }
  }
  TU_ASSERT_OK(stab_trace_close(t));
  stab_trace_reader *rd = NULL;
  TU_ASSERT_OK(stab_trace_read_open(tmp_path("live.h5"), NULL, &rd));
  ck_assert_int_eq(stab_trace_read_rows(rd), ROWS);
  stab_trace_read_close(rd);
  run_free(&done);
  run_free(&live);
}
END_TEST

START_TEST(test_bad_arguments_and_files) {
  tu_rng r;
  tu_rng_init(&r, 10);
  run x;
  const char *path = tmp_path("args.h5");
  write_trace(path, &x, &r);
  stab_trace_reader *rd = (stab_trace_reader *)&x; /* set to NULL by a failed open */
  TU_ASSERT_STATUS(stab_trace_read_open(NULL, NULL, &rd), STAB_EINVAL);
  ck_assert_ptr_null(rd);
  TU_ASSERT_STATUS(stab_trace_read_open(path, NULL, NULL), STAB_EINVAL);
  stab_trace_read_params p = stab_trace_read_default_params();
  p.n_metrics = 1; /* metrics NULL with a count */
  TU_ASSERT_STATUS(stab_trace_read_open(path, &p, &rd), STAB_EINVAL);
  /* a missing file, a directory, a file that is not HDF5, HDF5 that is not a trace */
  const char *missing = tmp_path("missing.h5");
  TU_ASSERT_STATUS(stab_trace_read_open(missing, NULL, &rd), STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), missing) != NULL, "%s", stab_last_error());
  TU_ASSERT_STATUS(stab_trace_read_open(tmpdir, NULL, &rd), STAB_EIO);
  const char *text = tmp_path("text.h5");
  FILE *f = fopen(text, "w");
  ck_assert_ptr_nonnull(f);
  fputs("step,loss\n1,2.5\n", f);
  fclose(f);
  TU_ASSERT_STATUS(stab_trace_read_open(text, NULL, &rd), STAB_EFORMAT);
  ck_assert_msg(strstr(stab_last_error(), text) && strstr(stab_last_error(), "not an HDF5 file"), "%s",
                stab_last_error());
  /* out of range */
  TU_ASSERT_OK(stab_trace_read_open(path, NULL, &rd));
  double v[ROWS + 1];
  int64_t s[ROWS + 1];
  TU_ASSERT_STATUS(stab_trace_read_steps(rd, 0, ROWS + 1, s), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_steps(rd, -1, 1, s), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_steps(rd, ROWS, 1, s), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_steps(rd, 0, 1, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_trace_read_scalar(rd, 2, 0, 1, v), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_metric(rd, NL, 0, 0, 1, v), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_metric(rd, 0, 1000, 0, 1, v), STAB_ERANGE);
  const stab_trace_attr *a;
  size_t n;
  TU_ASSERT_STATUS(stab_trace_read_layer_attrs(rd, NL, &a, &n), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_trace_read_run_config(rd, NULL), STAB_EINVAL);
  ck_assert_ptr_null(stab_trace_read_layer_name(rd, NL));
  ck_assert_ptr_null(stab_trace_read_metric_name(rd, 0, 1000));
  ck_assert_ptr_null(stab_trace_read_scalar_name(rd, 2));
  ck_assert_uint_eq(stab_trace_read_metric_count(rd, NL), 0);
  stab_trace_read_close(rd);
  /* NULL readers */
  stab_trace_read_close(NULL);
  ck_assert_int_eq(stab_trace_read_rows(NULL), 0);
  ck_assert_int_eq(stab_trace_read_format_version(NULL), 0);
  ck_assert_uint_eq(stab_trace_read_layer_count(NULL), 0);
  ck_assert_int_eq(stab_trace_read_is_file(NULL, path), 0);
  TU_ASSERT_STATUS(stab_trace_read_steps(NULL, 0, 0, s), STAB_EINVAL);
  run_free(&x);
}
END_TEST

static Suite *trace_read_suite(void) {
  Suite *s = suite_create("trace_read");
  TCase *tc = tcase_create("read");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
  tcase_add_test(tc, test_values);
  tcase_add_test(tc, test_selection);
  tcase_add_test(tc, test_while_a_writer_thread_writes);
  tcase_add_test(tc, test_bad_arguments_and_files);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(trace_read_suite());
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
