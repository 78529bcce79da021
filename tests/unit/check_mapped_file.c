/* check_mapped_file.c — what every checkpoint reader does before parsing (lib/core/mapped_file.c on
 * stab_input_open, and the llm.c and GGUF sniffs): paths that are not regular files (a FIFO
 * with no writer, a symbolic link to one, a directory, character devices), missing and empty
 * files each give their status and a message naming the path and what it is, promptly: a FIFO
 * must not block the open waiting for a writer. stab_input_open's size bound. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reader_checks.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[256];

static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_mapped_file"); }

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

/* Both readers refuse path with status want and a message holding path and what. */
static void assert_refused(const char *path, stab_status want, const char *what) {
  stab_safetensors *s = (stab_safetensors *)&s;
  stab_status st = stab_safetensors_open(path, &s);
  reader_assert_refused(tu_ctx("safetensors, %s", path), path, st, want, s == NULL, what);
  stab_llmc *l = (stab_llmc *)&l;
  st = stab_llmc_open(path, &l);
  reader_assert_refused(tu_ctx("llmc, %s", path), path, st, want, l == NULL, what);
  ck_assert_int_eq(stab_llmc_is(path), 0);
  ck_assert_int_eq(stab_gguf_is(path), 0); /* before the fix: a FIFO blocked its fopen */
}

/* stab_input_open refuses path with status want and a message naming path and holding what. */
static void assert_input_refused(const char *path, uint64_t max_bytes, stab_status want, const char *what) {
  int fd = 7;
  uint64_t size = 7;
  stab_status st = stab_input_open(path, max_bytes, &fd, &size);
  reader_assert_refused(tu_ctx("stab_input_open, %s", path), path, st, want, fd == -1 && size == 0, what);
}

START_TEST(test_not_regular) {
  make_tmpdir();
  const char *fifo = tmp_path("fifo");
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  char link[300];
  snprintf(link, sizeof link, "%s", tmp_path("link"));
  ck_assert_int_eq(symlink(fifo, link), 0);
  assert_refused(fifo, STAB_EIO, "not a regular file"); /* before the fix: blocked in open() */
  assert_refused(link, STAB_EIO, "not a regular file");
  assert_refused(tmpdir, STAB_EIO, "not a regular file");
  assert_refused("/dev/null", STAB_EIO, "not a regular file");
  assert_refused("/dev/zero", STAB_EIO, "not a regular file");
  /* the message says what the path is */
  assert_input_refused(fifo, 0, STAB_EIO, "it is a FIFO (named pipe)");
  assert_input_refused(link, 0, STAB_EIO, "it is a FIFO (named pipe)");
  assert_input_refused(tmpdir, 0, STAB_EIO, "it is a directory");
  assert_input_refused("/dev/zero", 0, STAB_EIO, "it is a character device");
  ck_assert_int_eq(unlink(link), 0);
  ck_assert_int_eq(unlink(fifo), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

START_TEST(test_missing_and_empty) {
  make_tmpdir();
  const char *missing = tmp_path("missing"), *empty = tmp_path("empty");
  assert_refused(missing, STAB_EIO, strerror(ENOENT));
  int fd = open(empty, O_WRONLY | O_CREAT | O_EXCL, 0600);
  ck_assert_int_ge(fd, 0);
  close(fd);
  assert_refused(empty, STAB_EFORMAT, "truncated: 0 bytes");
  /* the sniff reads regular files: four bytes of the magic are enough for it */
  const unsigned char magic[4] = {0xc6, 0xd7, 0x34, 0x01}; /* 20240326, little-endian */
  fd = open(empty, O_WRONLY | O_TRUNC);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, magic, 4), 4);
  close(fd);
  ck_assert_int_eq(stab_llmc_is(empty), 1);
  ck_assert_int_eq(stab_gguf_is(empty), 0);
  ck_assert_int_eq(stab_gguf_is(missing), 0);
  assert_input_refused(missing, 0, STAB_EIO, strerror(ENOENT));
  /* the size bound: the size itself passes, one byte less does not */
  int in = -1;
  uint64_t size = 0;
  TU_ASSERT_OK(stab_input_open(empty, 4, &in, &size));
  ck_assert_int_ge(in, 0);
  ck_assert_uint_eq(size, 4);
  unsigned char back[4];
  ck_assert_int_eq(read(in, back, 4), 4); /* the descriptor reads the file */
  ck_assert_int_eq(memcmp(back, magic, 4), 0);
  close(in);
  assert_input_refused(empty, 3, STAB_ERANGE, "4 bytes, more than the limit of 3 bytes");
  TU_ASSERT_STATUS(stab_input_open(NULL, 0, &in, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_input_open(empty, 0, NULL, NULL), STAB_EINVAL);
  ck_assert_int_eq(unlink(empty), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

static Suite *mapped_file_suite(void) {
  Suite *s = suite_create("mapped_file");
  TCase *tc = tcase_create("paths");
  tcase_set_timeout(tc, 30); /* a blocked open fails the test here, not after the default 600 s */
  tcase_add_test(tc, test_not_regular);
  tcase_add_test(tc, test_missing_and_empty);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(mapped_file_suite());
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
