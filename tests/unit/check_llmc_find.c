/* check_llmc_find.c — stab_llmc_find on an llm.c file whose header declares 20000 one-channel
 * blocks (1 MB, 320004 views): every view is found at its own index, names that only look
 * like view names are not, and finding all of them takes well under the test's timeout (a
 * scan of every view per lookup, as before, took minutes: 5e10 string compares). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stabmeter.h"
#include "testutil.h"

enum { L = 20000, C = 1, T = 1, V = 1 };

/* Writes the header and n zero bf16 parameters; returns the path (static). */
static const char *write_thin(void) {
  static char path[256];
  snprintf(path, sizeof path, "%s/check_llmc_find.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  int fd = mkstemp(path);
  ck_assert_msg(fd >= 0, "mkstemp: %s", strerror(errno));
  FILE *f = fdopen(fd, "wb");
  ck_assert_ptr_nonnull(f);
  const int32_t hdr[8] = {20240326, 5, T, V, L, 1, C, V}; /* magic, bf16, maxT, V, L, heads, C, Vp */
  unsigned char h[1024] = {0};
  for (int k = 0; k < 8; k++)
    for (int b = 0; b < 4; b++) h[4 * k + b] = (unsigned char)((uint32_t)hdr[k] >> (8 * b));
  ck_assert_int_eq(fwrite(h, 1, sizeof h, f), sizeof h);
  const size_t n = (size_t)V * C + (size_t)T * C + (size_t)L * (13 * C + 12 * C * C) + 2 * C;
  for (size_t i = 0; i < 2 * n; i++) ck_assert_int_ne(fputc(0, f), EOF);
  ck_assert_int_eq(fclose(f), 0);
  return path;
}

START_TEST(test_find_every_view) {
  const char *path = write_thin();
  stab_llmc *f = NULL;
  TU_ASSERT_OK(stab_llmc_open(path, &f));
  size_t n = stab_llmc_count(f);
  ck_assert_uint_eq(n, 16 * (size_t)L + 4);
  for (size_t i = 0; i < n; i++) {
    size_t at = n;
    const char *name = stab_llmc_tensor(f, i)->name;
    ck_assert_msg(stab_llmc_find(f, name, &at) == STAB_OK && at == i, "find(%s) gave %zu, not %zu", name, at, i);
  }
  /* near misses: leading zeros, out of range, overflowing, signed, truncated, padded */
  static const char *const absent[] = {"h.01.ln_1.weight", "h.20000.ln_1.weight", "h.99999999999999999999.ln_1.weight",
                                       "h.-1.ln_1.weight", "h.+1.ln_1.weight", "h. 1.ln_1.weight", "h.1", "h.1.",
                                       "h.", "h", "", "wte ", "ln_f", "h.0.attn.qkv.weight", "wpe.weight"};
  for (size_t k = 0; k < sizeof absent / sizeof absent[0]; k++)
    ck_assert_msg(stab_llmc_find(f, absent[k], NULL) == STAB_ENOTFOUND, "'%s' was found", absent[k]);
  TU_ASSERT_STATUS(stab_llmc_find(f, NULL, NULL), STAB_EINVAL);
  stab_llmc_close(f);
  ck_assert_int_eq(unlink(path), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("llmc_find");
  TCase *tc = tcase_create("find");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_find_every_view);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
