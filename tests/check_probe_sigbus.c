/* check_probe_sigbus.c — the probe's guard against a checkpoint shrinking under its mapping
 * (harness/ckpt_guard.c), deterministically: map a checkpoint, truncate it, then read it,
 * through the library's multi-threaded pass (stab_layer_metrics on the mapping) and its
 * block conversion (stab_ckpt_read_f32). The reads must finish, the guard must name the file,
 * bytes before the cut must read as they were; a SIGBUS outside the guarded ranges must still
 * kill the process (in a child). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_guard.h"
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
  ck_assert_int_eq(ckpt_guard_install(), 0);
  ck_assert_int_eq(ckpt_guard_add(path, t->data, t->count * 4), 0);
  stab_layer L = {.name = "w", .kind = STAB_KIND_LINEAR, .d_in = COLS, .d_out = ROWS,
                  .weight = (const float *)(const void *)t->data};
  stab_metrics before, after;
  TU_ASSERT_OK(stab_layer_metrics(&L, NULL, NULL, &before, NULL));
  ck_assert_ptr_null(ckpt_guard_tripped());
  stab_ckpt_release(t); /* the pages must come back from the file, which is now shorter */
  ck_assert_int_eq(truncate(path, (off_t)(t->offset + 100 * 4096)), 0);
  stab_ckpt_prefetch(t); /* pages past the new end: the advice fails quietly, no signal */
  ck_assert_ptr_null(ckpt_guard_tripped());
  TU_ASSERT_OK(stab_layer_metrics(&L, NULL, NULL, &after, NULL));
  ck_assert_ptr_nonnull(ckpt_guard_tripped());
  ck_assert_str_eq(ckpt_guard_tripped(), path);
  /* what lies before the cut reads as written; past it, zeros */
  const float *m = L.weight;
  size_t keep = (100 * 4096 - (size_t)(t->offset % 4096)) / 4;
  ck_assert(memcmp(m, a, keep * sizeof *m) == 0);
  ck_assert(m[(size_t)ROWS * COLS - 1] == 0.0f);
  ck_assert(before.sigma > after.sigma);
  ckpt_guard_clear();
  ck_assert_ptr_null(ckpt_guard_tripped());
  ckpt_guard_reset();
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
  ck_assert_int_eq(ckpt_guard_install(), 0);
  ck_assert_int_eq(ckpt_guard_add(path, t->data, t->count * 2), 0);
  uint64_t cut = 50000; /* elements left in the file */
  ck_assert_int_eq(truncate(path, (off_t)(t->offset + cut * 2)), 0);
  float *out = tu_floats(t->count);
  for (uint64_t first = 0; first < t->count; first += 65536) {
    size_t n = t->count - first < 65536 ? (size_t)(t->count - first) : 65536;
    TU_ASSERT_OK(stab_ckpt_read_f32(t, first, n, out + first));
  }
  ck_assert_str_eq(ckpt_guard_tripped(), path);
  ck_assert(memcmp(out, a, cut * sizeof *out) == 0);
  /* the kernel fills the page holding the new end with zeros past it; later pages are the guard's */
  for (uint64_t i = cut; i < t->count; i++) ck_assert_msg(out[i] == 0.0f, "element %llu", (unsigned long long)i);
  ckpt_guard_reset();
  stab_safetensors_close(f);
  unlink(path);
  free(out), free(a);
}
END_TEST

/* A file mapped by hand, truncated, read: in a child; returns its wait status. */
static int read_truncated_in_child(int opening) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    char p[] = "/tmp/check_probe_sigbus_child.XXXXXX";
    int fd = mkstemp(p);
    if (fd < 0 || ftruncate(fd, 1 << 20)) _exit(3);
    volatile const unsigned char *m = mmap(NULL, 1 << 20, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED || ckpt_guard_install()) _exit(3);
    if (opening) ckpt_guard_opening(p);
    if (truncate(p, 4096)) _exit(3);
    unlink(p);
    unsigned sum = m[0] + m[(1 << 20) - 1]; /* the second read is past the end */
    _exit(ckpt_guard_tripped() && !strcmp(ckpt_guard_tripped(), p) && sum == 0 ? 0 : 4);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  return status;
}

/* A model of thousands of files (one range each, as a sharded model of that many shards
 * registers): the last file registered is guarded as the first is. In a child. */
START_TEST(test_many_files_guarded) {
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    static char names[3000][24];
    if (ckpt_guard_install()) _exit(3);
    for (int i = 0; i < 2999; i++) { /* ranges of files mapped elsewhere: 64 bytes each, low addresses */
      snprintf(names[i], sizeof names[i], "shard-%d", i);
      if (ckpt_guard_add(names[i], (const void *)(uintptr_t)(4096 + 64 * (uintptr_t)i), 64)) _exit(5);
    }
    char p[] = "/tmp/check_probe_sigbus_many.XXXXXX";
    int fd = mkstemp(p);
    if (fd < 0 || ftruncate(fd, 1 << 20)) _exit(3);
    volatile const unsigned char *m = mmap(NULL, 1 << 20, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED || ckpt_guard_add(p, (const void *)m, 1 << 20)) _exit(6);
    if (truncate(p, 4096)) _exit(3);
    unlink(p);
    unsigned sum = m[0] + m[(1 << 20) - 1];
    _exit(ckpt_guard_tripped() && !strcmp(ckpt_guard_tripped(), p) && sum == 0 ? 0 : 4);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "child status %d (exit 5 or 6: a range refused; a signal: the 3000th file unguarded)", status);
}
END_TEST

START_TEST(test_unguarded_sigbus_still_kills) {
  int status = read_truncated_in_child(0);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS, "child status %d: want death by SIGBUS", status);
}
END_TEST

START_TEST(test_opening_guards_any_address) {
  int status = read_truncated_in_child(1);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}
END_TEST

static Suite *sigbus_suite(void) {
  Suite *s = suite_create("probe_sigbus");
  TCase *tc = tcase_create("truncated while mapped");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_threaded_pass_survives);
  tcase_add_test(tc, test_conversion_survives);
  tcase_add_test(tc, test_unguarded_sigbus_still_kills);
  tcase_add_test(tc, test_opening_guards_any_address);
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
