/* check_output.c — the one rule for results already where an output goes (stab_output_check)
 * and the trace writer keeping it (stab_trace_params.append = STAB_OUTPUT_NEW): a finished
 * trace is refused and left byte for byte as it was, a missing one is created, replacing and
 * appending happen only when asked; the file's bytes are compared with a copy read before. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stabmeter.h"
#include "testutil.h"

/* The whole file at path, malloc'd, its length in *n; NULL if it cannot be read. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 65536))) break;
    size_t got = fread(buf + len, 1, cap - len, f);
    if (!got) break;
    len += got;
  }
  fclose(f);
  *n = len;
  return buf;
}

START_TEST(test_check) {
  char dir[256];
  tu_tmpdir_make(dir, sizeof dir, "check_output");
  const char *file = tu_path_in(dir, "results.csv"), *none = tu_path_in(dir, "none.csv");
  const char *sub = tu_path_in(dir, "sub"), *link = tu_path_in(dir, "link"), *dangling = tu_path_in(dir, "dangling");
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fputs("a,b\n1,2\n", f);
  fclose(f);
  ck_assert_int_eq(mkdir(sub, 0777), 0);
  ck_assert_int_eq(symlink(file, link), 0);
  ck_assert_int_eq(symlink(none, dangling), 0);

  /* nothing there: every mode may write */
  for (int mode = 0; mode <= 2; mode++) TU_ASSERT_OK(stab_output_check(none, (stab_output_mode)mode, "a table"));
  /* something there: only a caller asked to append or replace goes on */
  TU_ASSERT_OK(stab_output_check(file, STAB_OUTPUT_APPEND, "a table"));
  TU_ASSERT_OK(stab_output_check(file, STAB_OUTPUT_REPLACE, "a table"));
  const char *there[] = {file, sub, link};
  for (size_t i = 0; i < 3; i++) {
    TU_ASSERT_STATUS(stab_output_check(there[i], STAB_OUTPUT_NEW, "a table"), STAB_EEXIST, "%s", there[i]);
    ck_assert_msg(strstr(stab_last_error(), there[i]) && strstr(stab_last_error(), "a table is already there") &&
                      strstr(stab_last_error(), "kept as it is"),
                  "message: %s", stab_last_error());
  }
  TU_ASSERT_STATUS(stab_output_check(file, STAB_OUTPUT_NEW, NULL), STAB_EEXIST);
  ck_assert_msg(strstr(stab_last_error(), "a file is already there"), "message: %s", stab_last_error());
  /* a link leading nowhere holds nothing */
  TU_ASSERT_OK(stab_output_check(dangling, STAB_OUTPUT_NEW, "a table"));
  /* bad arguments */
  TU_ASSERT_STATUS(stab_output_check(NULL, STAB_OUTPUT_NEW, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_output_check("", STAB_OUTPUT_NEW, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_output_check(file, (stab_output_mode)3, NULL), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "unknown mode 3"), "message: %s", stab_last_error());
  /* and the file is as it was */
  size_t n = 0;
  unsigned char *got = slurp(file, &n);
  ck_assert_ptr_nonnull(got);
  ck_assert_int_eq(n, 8);
  ck_assert_int_eq(memcmp(got, "a,b\n1,2\n", 8), 0);
  free(got);
  tu_tmpdir_remove(dir);
}
END_TEST

/* A monitor of one linear layer, measured once, with its weights in w. */
static stab_monitor *one_layer(float *w, size_t n) {
  for (size_t i = 0; i < n; i++) w[i] = (float)((i * 7919) % 13) / 13.0f - 0.5f;
  stab_monitor_params mp = stab_monitor_default_params();
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&mp, &m));
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 8, .d_out = 4, .weight = w};
  TU_ASSERT_OK(stab_monitor_add_layer(m, &l, NULL));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  return m;
}

/* Rows 1..n appended to a trace opened at path with mode. */
static stab_status write_trace(const char *path, const stab_monitor *m, int mode, int64_t first, int64_t n) {
  stab_trace_params p = stab_trace_default_params();
  p.append = mode;
  p.flush_every = 1;
  stab_trace *t = NULL;
  stab_status st = stab_trace_open(path, m, &p, &t);
  if (st != STAB_OK) return st;
  for (int64_t s = first; s < first + n; s++) TU_ASSERT_OK(stab_trace_append(t, s, (double)s, NULL, NULL));
  return stab_trace_close(t);
}

static int64_t trace_rows(const char *path, const stab_monitor *m) {
  stab_trace_params p = stab_trace_default_params();
  p.append = STAB_OUTPUT_APPEND;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  int64_t rows = stab_trace_steps(t);
  TU_ASSERT_OK(stab_trace_close(t));
  return rows;
}

START_TEST(test_trace_new) {
  char dir[256];
  tu_tmpdir_make(dir, sizeof dir, "check_output");
  const char *path = tu_path_in(dir, "trace.h5");
  float w[32];
  stab_monitor *m = one_layer(w, 32);

  /* nothing there: STAB_OUTPUT_NEW creates the trace */
  TU_ASSERT_OK(write_trace(path, m, STAB_OUTPUT_NEW, 1, 5));
  size_t n0 = 0, n1 = 0;
  unsigned char *before = slurp(path, &n0);
  ck_assert_ptr_nonnull(before);
  /* a finished trace: refused, its bytes untouched, no temporary left beside it */
  TU_ASSERT_STATUS(write_trace(path, m, STAB_OUTPUT_NEW, 1, 3), STAB_EEXIST);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "a trace is already there"),
                "message: %s", stab_last_error());
  unsigned char *after = slurp(path, &n1);
  ck_assert_ptr_nonnull(after);
  ck_assert_msg(n0 == n1 && memcmp(before, after, n0) == 0, "the refused trace changed (%zu -> %zu bytes)", n0, n1);
  free(after);
  char list[512];
  snprintf(list, sizeof list, "ls %s | grep -c . | grep -qx 1", dir);
  ck_assert_msg(system(list) == 0, "files beside the trace after a refusal");
  /* an unknown mode */
  TU_ASSERT_STATUS(write_trace(path, m, 3, 1, 1), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "append is 3"), "message: %s", stab_last_error());
  TU_ASSERT_STATUS(write_trace(path, m, -1, 1, 1), STAB_EINVAL);
  /* asked to append: rows after its last; asked to replace: a new trace */
  TU_ASSERT_OK(write_trace(path, m, STAB_OUTPUT_APPEND, 6, 2));
  ck_assert_int_eq(trace_rows(path, m), 7);
  TU_ASSERT_OK(write_trace(path, m, STAB_OUTPUT_REPLACE, 1, 2));
  ck_assert_int_eq(trace_rows(path, m), 2);
  free(before);
  stab_monitor_free(m);
  tu_tmpdir_remove(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("output");
  TCase *tc = tcase_create("output");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_check);
  tcase_add_test(tc, test_trace_new);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
