/* check_safetensors_write.c — the safetensors writer (lib/checkpoint/safetensors_write.c):
 * a file it writes holds exactly the expected bytes (the header compared byte for byte with
 * one written out by hand here, the data after it), reads back through the library's reader
 * with every name, dtype, shape, value and metadata entry; it replaces a file whole; and every
 * argument the reader would refuse is refused, naming the file, before any file is created.
 * With --write PATH it writes the sample file and exits, for safetensors_write.sh's reader in
 * Python. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[256];

/* ---- the sample file --------------------------------------------------------------- */

static const float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-30f};
static const uint16_t bf16[4] = {0x3f80, 0xc020, 0x7f80, 0x0001}; /* 1, -2.5, inf, a subnormal */
static const int64_t i64 = -1234567890123LL;
static const uint8_t u8[3] = {0, 127, 255};

/* Metadata with a quote, a backslash, a newline and a non-ASCII letter; tensors 2-D, 1-D, a
 * scalar, an empty one, and a name that needs escaping. */
static const char *const meta[] = {"format", "pt", "note", "a \"quoted\" \\ line\nand \xc3\xa9t\xc3\xa9"};

static void sample(stab_safetensors_entry e[5]) {
  e[0] = (stab_safetensors_entry){.name = "w", .dtype = "F32", .ndim = 2, .shape = {2, 3}, .data = f32};
  e[1] = (stab_safetensors_entry){.name = "b\"x", .dtype = "BF16", .ndim = 1, .shape = {4}, .data = bf16};
  e[2] = (stab_safetensors_entry){.name = "scalar", .dtype = "I64", .ndim = 0, .data = &i64};
  e[3] = (stab_safetensors_entry){.name = "empty", .dtype = "F32", .ndim = 2, .shape = {0, 5}, .data = NULL};
  e[4] = (stab_safetensors_entry){.name = "\xce\xbb.u8", .dtype = "U8", .ndim = 1, .shape = {3}, .data = u8};
}

/* The header the writer must produce for the sample, written out by hand: no blanks, keys in
 * the order given, offsets following the data in order, padded with spaces to 8 bytes. */
static const char want_header[] =
    "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"a \\\"quoted\\\" \\\\ line\\u000aand \xc3\xa9t\xc3\xa9\"},"
    "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\\\"x\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"scalar\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
    "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[40,40]},"
    "\"\xce\xbb.u8\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[40,43]}}";

static stab_status write_sample(const char *path) {
  stab_safetensors_entry e[5];
  sample(e);
  return stab_safetensors_write(path, meta, 2, e, 5);
}

/* The whole file at path, malloc'ed; *n its size. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  unsigned char *b = malloc(1 << 16);
  *n = fread(b, 1, 1 << 16, f);
  fclose(f);
  return b;
}

static int exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

START_TEST(test_bytes) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_safetensors_write");
  char path[512];
  snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "s.safetensors"));
  TU_ASSERT_OK(write_sample(path));
  size_t n, hl = strlen(want_header), padded = (hl + 7) / 8 * 8;
  unsigned char *b = slurp(path, &n);
  ck_assert_uint_eq(n, 8 + padded + 43);
  uint64_t len = 0;
  for (int k = 7; k >= 0; k--) len = len << 8 | b[k];
  ck_assert_uint_eq(len, padded);
  ck_assert_msg(!memcmp(b + 8, want_header, hl), "header: %.*s", (int)hl, (const char *)b + 8);
  for (size_t i = hl; i < padded; i++) ck_assert_int_eq(b[8 + i], ' ');
  const unsigned char *d = b + 8 + padded;
  ck_assert(!memcmp(d, f32, 24) && !memcmp(d + 24, bf16, 8) && !memcmp(d + 32, &i64, 8) && !memcmp(d + 40, u8, 3));
  free(b);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ck_assert_msg(!exists(tmp), "the temporary file is left");
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

START_TEST(test_reads_back) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_safetensors_write");
  char path[512];
  snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "s.safetensors"));
  TU_ASSERT_OK(write_sample(path));
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(path, &f));
  stab_safetensors_entry e[5];
  sample(e);
  ck_assert_uint_eq(stab_safetensors_count(f), 5);
  for (size_t i = 0; i < 5; i++) {
    size_t k;
    TU_ASSERT_OK(stab_safetensors_find(f, e[i].name, &k), "tensor %zu", i);
    const stab_ckpt_tensor *t = stab_safetensors_tensor(f, k);
    ck_assert_str_eq(t->dtype_name, e[i].dtype);
    ck_assert_uint_eq(t->ndim, e[i].ndim);
    uint64_t count = 1;
    for (size_t d = 0; d < e[i].ndim; d++) {
      ck_assert_uint_eq(t->shape[d], e[i].shape[d]);
      count *= e[i].shape[d];
    }
    ck_assert_uint_eq(t->count, count);
    if (count) ck_assert(!memcmp(t->data, e[i].data, count * t->elem_size));
  }
  /* the values as the library reads them: F32 copied, BF16 converted exactly */
  size_t k;
  float got[6];
  TU_ASSERT_OK(stab_safetensors_find(f, "w", &k));
  TU_ASSERT_OK(stab_ckpt_read_f32(stab_safetensors_tensor(f, k), 0, 6, got));
  ck_assert(!memcmp(got, f32, sizeof f32));
  TU_ASSERT_OK(stab_safetensors_find(f, "b\"x", &k));
  TU_ASSERT_OK(stab_ckpt_read_f32(stab_safetensors_tensor(f, k), 0, 4, got));
  ck_assert(got[0] == 1.0f && got[1] == -2.5f && isinf(got[2]) && got[2] > 0 && got[3] > 0 && got[3] < 1e-38f);
  ck_assert_uint_eq(stab_safetensors_metadata_count(f), 2);
  const char *key, *value;
  TU_ASSERT_OK(stab_safetensors_metadata(f, 0, &key, &value)); /* key order: format, note */
  ck_assert_str_eq(key, "format");
  ck_assert_str_eq(value, "pt");
  TU_ASSERT_OK(stab_safetensors_metadata(f, 1, &key, &value));
  ck_assert_str_eq(key, "note");
  ck_assert_str_eq(value, meta[3]);
  stab_safetensors_close(f);
  /* no metadata, no tensors: "{}" and six spaces, which the reader takes */
  TU_ASSERT_OK(stab_safetensors_write(path, NULL, 0, NULL, 0));
  size_t n;
  unsigned char *b = slurp(path, &n);
  ck_assert_uint_eq(n, 16);
  ck_assert(!memcmp(b, "\x08\0\0\0\0\0\0\0{}      ", 16));
  free(b);
  TU_ASSERT_OK(stab_safetensors_open(path, &f));
  ck_assert_uint_eq(stab_safetensors_count(f), 0);
  stab_safetensors_close(f);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

/* write(e) is refused with want, a message naming path and holding what, no file at path and
 * no temporary beside it. */
static void assert_refused(const char *path, const stab_safetensors_entry *e, size_t n, const char *const *m,
                           size_t nm, stab_status want, const char *what) {
  stab_status st = stab_safetensors_write(path, m, nm, e, n);
  ck_assert_msg(st == want, "%s: status %d, want %d (%s)", what, st, want, stab_last_error());
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), what), "message: %s (want %s)",
                stab_last_error(), what);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ck_assert_msg(!exists(path) && !exists(tmp), "%s: a file was left", what);
}

START_TEST(test_refusals) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_safetensors_write");
  char path[512];
  snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "r.safetensors"));
  const float x[2] = {1, 2};
  stab_safetensors_entry e[2] = {{.name = "a", .dtype = "F32", .ndim = 1, .shape = {2}, .data = x},
                                 {.name = "b", .dtype = "F32", .ndim = 1, .shape = {2}, .data = x}};
  e[1].name = "";
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "not a tensor's");
  e[1].name = "__metadata__";
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "not a tensor's");
  e[1].name = "a";
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "tensor name 'a' given twice");
  e[1].name = "bad\xff";
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "invalid UTF-8 at byte 3");
  e[1].name = "b";
  e[1].dtype = "F31";
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "dtype \"F31\" is not one of safetensors'");
  e[1].dtype = NULL;
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "tensor 'b': dtype");
  e[1].dtype = "F32";
  e[1].ndim = 9;
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "9 dimensions");
  e[1].ndim = 2, e[1].shape[0] = (uint64_t)1 << 40, e[1].shape[1] = (uint64_t)1 << 40;
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "the product of shape overflows 64 bits");
  e[1].ndim = 1, e[1].shape[0] = (uint64_t)1 << 62;
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "the data's size overflows 64 bits");
  e[1].shape[0] = 2, e[1].data = NULL;
  assert_refused(path, e, 2, NULL, 0, STAB_EINVAL, "tensor 'b': NULL data");
  e[1].data = x;
  const char *const dup[] = {"k", "1", "k", "2"};
  assert_refused(path, e, 2, dup, 2, STAB_EINVAL, "__metadata__ key 'k' given twice");
  const char *const bad_value[] = {"k", "\xc3"};
  assert_refused(path, e, 2, bad_value, 1, STAB_EINVAL, "metadata value 0: invalid UTF-8");
  const char *const null_key[] = {NULL, "v"};
  assert_refused(path, e, 2, null_key, 1, STAB_EINVAL, "metadata key 0 is NULL");
  TU_ASSERT_STATUS(stab_safetensors_write(NULL, NULL, 0, e, 2), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_safetensors_write(path, NULL, 1, e, 2), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_safetensors_write(path, NULL, 0, NULL, 2), STAB_EINVAL);
  /* unwritable: a missing directory; a directory where the file goes (the rename fails) */
  char missing[600];
  snprintf(missing, sizeof missing, "%s/no/such/dir/x.safetensors", tmpdir);
  assert_refused(missing, e, 2, NULL, 0, STAB_EIO, strerror(ENOENT));
  ck_assert_int_eq(mkdir(path, 0700), 0);
  stab_status st = stab_safetensors_write(path, NULL, 0, e, 2);
  ck_assert_int_eq(st, STAB_EIO);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "cannot rename"), "%s",
                stab_last_error());
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  ck_assert_msg(!exists(tmp), "the temporary file is left after a failed rename");
  ck_assert_int_eq(rmdir(path), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

/* A refused write leaves the file there as it was; a new one replaces it whole. */
START_TEST(test_replaces_whole) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_safetensors_write");
  char path[512];
  snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "s.safetensors"));
  TU_ASSERT_OK(write_sample(path));
  size_t n0, n1;
  unsigned char *before = slurp(path, &n0);
  stab_safetensors_entry bad = {.name = "x", .dtype = "Q4", .ndim = 0, .data = f32};
  TU_ASSERT_STATUS(stab_safetensors_write(path, NULL, 0, &bad, 1), STAB_EINVAL);
  unsigned char *after = slurp(path, &n1);
  ck_assert(n0 == n1 && !memcmp(before, after, n0));
  free(after);
  stab_safetensors_entry one = {.name = "x", .dtype = "F32", .ndim = 1, .shape = {1}, .data = f32};
  TU_ASSERT_OK(stab_safetensors_write(path, NULL, 0, &one, 1));
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(path, &f));
  ck_assert_uint_eq(stab_safetensors_count(f), 1);
  ck_assert_uint_eq(stab_safetensors_metadata_count(f), 0);
  stab_safetensors_close(f);
  free(before);
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(tmpdir), 0);
}
END_TEST

static Suite *write_suite(void) {
  Suite *s = suite_create("safetensors_write");
  TCase *tc = tcase_create("writer");
  tcase_add_test(tc, test_bytes);
  tcase_add_test(tc, test_reads_back);
  tcase_add_test(tc, test_refusals);
  tcase_add_test(tc, test_replaces_whole);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--write")) {
    if (write_sample(argv[2]) == STAB_OK) return 0;
    fprintf(stderr, "%s\n", stab_last_error());
    return 1;
  }
  SRunner *sr = srunner_create(write_suite());
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
