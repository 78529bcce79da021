/* check_data.c — the trainer's data (trainer/data.c): the built-in corpus is deterministic
 * text, files load as bytes, llm.c token files load with their header checked, and every
 * bad file is refused with status 2 and a message naming the file and the field; paths that
 * are not regular files (a FIFO with no writer, /dev/zero, a directory) and files over the
 * size bound are refused at once, with status 2 and a message naming the path. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "testutil.h"

static char dir[64];

static const char *path_of(const char *name) {
  static char p[128];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

static void write_file(const char *name, const void *data, size_t len) {
  FILE *f = fopen(path_of(name), "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* An llm.c file: header (magic, version, count), then count tokens of the version's width;
 * extra appends that many more bytes. */
static void write_llmc(const char *name, int magic, int version, int count, size_t ntok,
                       size_t extra) {
  size_t w = version == 2 ? 4 : 2, len = 1024 + ntok * w + extra;
  unsigned char *b = calloc(len, 1);
  int32_t h[256] = {magic, version, count};
  memcpy(b, h, sizeof h);
  for (size_t i = 0; i < ntok; i++) {
    uint32_t v = (uint32_t)(i * 37 % 1000);
    memcpy(b + 1024 + i * w, &v, w); /* little-endian host */
  }
  write_file(name, b, len);
  free(b);
}

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/check_data.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_builtin) {
  data_set a, b, c;
  ck_assert_int_eq(data_builtin(&a, 100000, 1), 0);
  ck_assert_int_eq(data_builtin(&b, 100000, 1), 0);
  ck_assert_int_eq(data_builtin(&c, 100000, 2), 0);
  ck_assert_uint_eq(a.n, 100000);
  ck_assert_uint_eq(a.vocab, 256);
  ck_assert(!memcmp(a.tokens, b.tokens, a.n * sizeof *a.tokens));
  ck_assert(memcmp(a.tokens, c.tokens, a.n * sizeof *a.tokens));
  size_t lines = 0, dots = 0;
  for (size_t i = 0; i < a.n; i++) {
    int ch = a.tokens[i];
    ck_assert_msg(ch == '\n' || (ch >= 32 && ch < 127), "byte %zu is %d", i, ch);
    lines += ch == '\n', dots += ch == '.';
  }
  ck_assert_uint_gt(lines, 2000);
  ck_assert_uint_ge(dots, lines - 1);
  data_free(&a), data_free(&b), data_free(&c);
  data_free(NULL);
}
END_TEST

START_TEST(test_bytes_and_batch) {
  write_file("t.txt", "hello, world\n", 13);
  data_set d;
  char err[512];
  ck_assert_int_eq(data_load(&d, path_of("t.txt"), err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 13);
  ck_assert_int_eq(d.tokens[0], 'h');
  int32_t tok[3 * 4], tgt[3 * 4];
  data_rng r = {3};
  data_batch(&d, &r, 0, d.n, 3, 4, tok, tgt);
  for (size_t b = 0; b < 3; b++) {
    for (size_t i = 0; i + 1 < 4; i++) ck_assert_int_eq(tgt[b * 4 + i], tok[b * 4 + i + 1]);
    const char *at = memchr("hello, world\n", tok[b * 4], 13);
    ck_assert_ptr_nonnull(at);
  }
  data_free(&d);
}
END_TEST

START_TEST(test_llmc) {
  data_set d;
  char err[512];
  write_llmc("v1.bin", 20240520, 1, 500, 500, 0);
  ck_assert_int_eq(data_load(&d, path_of("v1.bin"), err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 500);
  ck_assert_int_eq(d.tokens[3], 111);
  ck_assert_uint_eq(d.vocab, 999 + 1);
  data_free(&d);
  write_llmc("v2.bin", 20240520, 2, 300, 300, 0);
  ck_assert_int_eq(data_load(&d, path_of("v2.bin"), err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 300);
  ck_assert_int_eq(d.tokens[299], (int)(299 * 37 % 1000));
  data_free(&d);
}
END_TEST

START_TEST(test_bad_files) {
  static const struct {
    const char *name;
    int magic, version, count;
    size_t ntok, extra;
    const char *field;
  } bad[] = {
      {"magic.bin", 1234, 1, 10, 10, 0, "magic"},
      {"version.bin", 20240520, 3, 10, 10, 0, "version"},
      {"count.bin", 20240520, 1, 11, 10, 0, "token count"},
      {"odd.bin", 20240520, 1, 10, 10, 1, "token count"},
      {"zero.bin", 20240520, 1, 0, 0, 0, "token count"},
  };
  char err[512];
  data_set d;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    write_llmc(bad[i].name, bad[i].magic, bad[i].version, bad[i].count, bad[i].ntok, bad[i].extra);
    err[0] = 0;
    ck_assert_int_eq(data_load(&d, path_of(bad[i].name), err, sizeof err), 2);
    ck_assert_msg(strstr(err, bad[i].name) && strstr(err, bad[i].field),
                  "%s: message '%s' should name the file and '%s'", bad[i].name, err, bad[i].field);
    ck_assert_ptr_null(d.tokens);
  }
  write_file("short.bin", "abc", 3);
  ck_assert_int_eq(data_load(&d, path_of("short.bin"), err, sizeof err), 2);
  ck_assert_ptr_nonnull(strstr(err, "header"));
  write_file("empty.txt", "", 0);
  ck_assert_int_eq(data_load(&d, path_of("empty.txt"), err, sizeof err), 2);
  ck_assert_ptr_nonnull(strstr(err, "empty"));
  ck_assert_int_eq(data_load(&d, path_of("missing.txt"), err, sizeof err), 2);
  ck_assert_ptr_nonnull(strstr(err, "missing.txt"));
}
END_TEST

/* Before stab_input_open: a FIFO blocked the fopen for ever, /dev/zero grew memory without end. */
START_TEST(test_not_files) {
  char err[512], fifo[128];
  data_set d;
  snprintf(fifo, sizeof fifo, "%s", path_of("fifo"));
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  static const struct {
    const char *path, *what;
  } cases[] = {{NULL, "FIFO"}, {"/dev/zero", "character device"}, {"/dev/null", "character device"},
               {"/tmp", "directory"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *p = cases[i].path ? cases[i].path : fifo;
    err[0] = 0;
    ck_assert_int_eq(data_load(&d, p, err, sizeof err), 2);
    ck_assert_msg(strstr(err, p) && strstr(err, cases[i].what), "%s: message '%s' should name it and say '%s'", p,
                  err, cases[i].what);
    ck_assert_ptr_null(d.tokens);
  }
  /* one byte over the bound, sparse: nothing of it is read */
  int fd = open(path_of("big.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)DATA_MAX_BYTES + 1), 0);
  close(fd);
  ck_assert_int_eq(data_load(&d, path_of("big.txt"), err, sizeof err), 2);
  ck_assert_msg(strstr(err, "big.txt") && strstr(err, "more than the limit of 1073741824 bytes") &&
                    strstr(err, "1 GiB"),
                "message '%s' should name the file and the limit", err);
  ck_assert_ptr_null(d.tokens);
}
END_TEST

static Suite *data_suite(void) {
  Suite *s = suite_create("data");
  TCase *tc = tcase_create("data");
  tcase_set_timeout(tc, 60); /* a blocked open fails here, not after the default 600 s */
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_builtin);
  tcase_add_test(tc, test_bytes_and_batch);
  tcase_add_test(tc, test_llmc);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_not_files);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(data_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
