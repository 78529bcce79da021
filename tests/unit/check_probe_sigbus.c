/* check_probe_sigbus.c — the library's input guard against a checkpoint shrinking under its
 * mapping (lib/core/mapped_file.c), deterministically: map a checkpoint, truncate it, then read it,
 * through the library's multi-threaded pass (stab_layer_metrics on the mapping), its block
 * conversion (stab_ckpt_read_f32) and the probe (stab_probe_measure). The reads must finish
 * with STAB_EIO naming the file, bytes before the cut must read as they were; a SIGBUS outside
 * the library's mappings must still kill the process, or reach the program's own handler (in
 * a child). No handler of the test's own: the library installs its guard. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

enum { ROWS = 1200, COLS = 1000 }; /* 1.2M elements: the pass runs on the OpenMP threads */

static char path[256];

/* A one-tensor safetensors file of ROWS x COLS (F32 or BF16) at a fresh path. */
static float *write_checkpoint(int bf16) {
  snprintf(path, sizeof path, "/tmp/check_probe_sigbus.XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  tu_rng r;
  tu_rng_init(&r, 11);
  float *a = tu_floats((size_t)ROWS * COLS);
  tu_fill_gauss(a, ROWS, COLS, COLS, 1.0, &r);
  uint16_t *h = NULL;
  if (bf16) {
    h = malloc((size_t)ROWS * COLS * 2);
    stw_encode16(a, (size_t)ROWS * COLS, 1, h);
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) a[i] = stab_bf16_to_f32(h[i]);
  }
  stw_tensor t = {"w.weight", bf16 ? "BF16" : "F32", 2, {ROWS, COLS}, bf16 ? (void *)h : (void *)a,
                  (size_t)ROWS * COLS * (bf16 ? 2 : 4)};
  ck_assert_int_eq(stw_write(path, &t, 1, NULL), 0);
  free(h);
  return a;
}

START_TEST(test_threaded_pass_survives) {
  float *a = write_checkpoint(0);
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(path, &f));
  const stab_ckpt_tensor *t = stab_safetensors_tensor(f, 0);
  stab_layer L = {.name = "w", .kind = STAB_KIND_LINEAR, .d_in = COLS, .d_out = ROWS,
                  .weight = (const float *)(const void *)t->data};
  stab_metrics before, after;
  TU_ASSERT_OK(stab_layer_metrics(&L, NULL, NULL, &before, NULL));
  stab_ckpt_release(t); /* the pages must come back from the file, which is now shorter */
  ck_assert_int_eq(truncate(path, (off_t)(t->offset + 100 * 4096)), 0);
  stab_ckpt_prefetch(t); /* pages past the new end: the advice fails quietly, no signal */
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, NULL, &after, NULL), STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "shrank while being read"),
                "message: %s", stab_last_error());
  /* what lies before the cut reads as written; past it, zeros */
  const float *m = L.weight;
  size_t keep = (100 * 4096 - (size_t)(t->offset % 4096)) / 4;
  ck_assert(memcmp(m, a, keep * sizeof *m) == 0);
  ck_assert(m[(size_t)ROWS * COLS - 1] == 0.0f);
  /* the mapping stays marked: every later read says so */
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, NULL, &after, NULL), STAB_EIO);
  stab_safetensors_close(f);
  unlink(path);
  free(a);
}
END_TEST

START_TEST(test_conversion_survives) {
  float *a = write_checkpoint(1);
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(path, &f));
  const stab_ckpt_tensor *t = stab_safetensors_tensor(f, 0);
  uint64_t cut = 50000; /* elements left in the file */
  ck_assert_int_eq(truncate(path, (off_t)(t->offset + cut * 2)), 0);
  float *out = tu_floats(t->count);
  uint64_t first = 0;
  stab_status st = STAB_OK;
  for (; first < t->count && st == STAB_OK; first += 65536) {
    size_t n = t->count - first < 65536 ? (size_t)(t->count - first) : 65536;
    st = stab_ckpt_read_f32(t, first, n, out + first);
  }
  ck_assert_int_eq(st, STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "w.weight"), "message: %s",
                stab_last_error());
  ck_assert(first - 65536 >= cut - cut % 65536); /* the read that failed is the one past the cut */
  ck_assert(memcmp(out, a, (cut - cut % 65536) * sizeof *out) == 0);
  stab_safetensors_close(f);
  unlink(path);
  free(out), free(a);
}
END_TEST

/* The probe, as the programs and the Python package call it: truncated between open and measure. */
START_TEST(test_probe_measure_fails) {
  float *a = write_checkpoint(0);
  stab_probe *p = NULL;
  stab_probe_params pp = stab_probe_default_params();
  TU_ASSERT_OK(stab_probe_open(path, &pp, &p));
  ck_assert_int_eq(truncate(path, 8192), 0);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "shrank while being read"),
                "message: %s", stab_last_error());
  stab_probe_free(p);
  /* opened after the cut: refused as truncated, by the format's own check */
  ck_assert_int_ne(stab_probe_open(path, &pp, &p), STAB_OK);
  unlink(path);
  free(a);
}
END_TEST

static void exit_42(int sig) { (void)sig; _exit(42); }

/* A file mapped by hand (not the library's), truncated, read: in a child, after the library
 * mapped a file of its own (its guard installed), with or without a program's handler installed
 * before; returns the child's wait status. */
static int read_truncated_in_child(int program_handler) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (program_handler) signal(SIGBUS, exit_42);
    char p[] = "/tmp/check_probe_sigbus_child.XXXXXX";
    int fd = mkstemp(p);
    if (fd < 0 || ftruncate(fd, 1 << 20)) _exit(3);
    volatile const unsigned char *m = mmap(NULL, 1 << 20, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    stab_safetensors *f = NULL;
    if (m == MAP_FAILED || stab_safetensors_open(path, &f) != STAB_OK) _exit(3);
    if (truncate(p, 4096)) _exit(3);
    unlink(p);
    unsigned sum = m[0] + m[(1 << 20) - 1]; /* the second read is past the end */
    _exit(sum == 0 ? 4 : 5);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* A model of more than a thousand files (a sharded model of that many shards): the last file
 * mapped is guarded as the first is. One small file, mapped 1,100 times over, then cut. */
START_TEST(test_many_files_guarded) {
  enum { FILES = 1100, SIDE = 64 };
  snprintf(path, sizeof path, "/tmp/check_probe_sigbus_many.XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  float *a = tu_floats(SIDE * SIDE);
  for (size_t i = 0; i < SIDE * SIDE; i++) a[i] = (float)i;
  stw_tensor w = {"w.weight", "F32", 2, {SIDE, SIDE}, a, SIDE * SIDE * 4};
  ck_assert_int_eq(stw_write(path, &w, 1, NULL), 0);
  stab_safetensors **f = calloc(FILES, sizeof *f);
  for (int i = 0; i < FILES; i++) TU_ASSERT_OK(stab_safetensors_open(path, &f[i]));
  const stab_ckpt_tensor *t = stab_safetensors_tensor(f[FILES - 1], 0);
  ck_assert_int_eq(truncate(path, (off_t)t->offset + 4), 0); /* the tensor's later pages are gone */
  float *out = tu_floats(SIDE * SIDE);
  ck_assert_int_eq(stab_ckpt_read_f32(t, 0, SIDE * SIDE, out), STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), path), "message: %s", stab_last_error());
  for (int i = 0; i < FILES; i++) stab_safetensors_close(f[i]);
  unlink(path);
  free(f), free(out), free(a);
}
END_TEST

START_TEST(test_unguarded_sigbus_still_kills) {
  float *a = write_checkpoint(0);
  int status = read_truncated_in_child(0);
  /* in the sanitizer build the handler before the library's is ASan's: it reports the fault and
   * ends the process with its exit code (1), which is the chaining this checks */
  int sanitizer_ended = getenv("STAB_SANITIZED") && WIFEXITED(status) && WEXITSTATUS(status) == 1;
  ck_assert_msg((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) || sanitizer_ended,
                "child status %d: want death by SIGBUS", status);
  unlink(path);
  free(a);
}
END_TEST

START_TEST(test_program_handler_chained) {
  float *a = write_checkpoint(0);
  int status = read_truncated_in_child(1);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 42, "child status %d: want the program's handler",
                status);
  unlink(path);
  free(a);
}
END_TEST

static Suite *sigbus_suite(void) {
  Suite *s = suite_create("probe_sigbus");
  TCase *tc = tcase_create("truncated while mapped");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_threaded_pass_survives);
  tcase_add_test(tc, test_conversion_survives);
  tcase_add_test(tc, test_probe_measure_fails);
  tcase_add_test(tc, test_unguarded_sigbus_still_kills);
  tcase_add_test(tc, test_program_handler_chained);
  tcase_add_test(tc, test_many_files_guarded);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(sigbus_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
