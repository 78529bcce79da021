/* reader_checks.c — see reader_checks.h. The closed forms are written from the formats'
 * definitions, independently of the library's bit-moving conversion. */
#include "reader_checks.h"

#include <math.h>
#include <string.h>

#include "testutil.h"

void reader_assert_refused(const char *label, const char *path, stab_status status, stab_status want,
                           int out_is_null, const char *text) {
  const char *msg = stab_last_error();
  ck_assert_msg(status == want, "%s: status %d, want %d (%s)", label, (int)status, (int)want, msg);
  ck_assert_msg(out_is_null, "%s: output not NULL on failure", label);
  ck_assert_msg(strstr(msg, path) != NULL, "%s: message does not name the file: %s", label, msg);
  ck_assert_msg(strstr(msg, text) != NULL, "%s: message lacks \"%s\": %s", label, text, msg);
}

/* The value of 16-bit pattern h: sign, then exponent bits e and mantissa bits m, with
 * subnormals at e = 0 and infinities and NaNs at the largest e. */
static double half_value(unsigned h, int bf16) {
  int s = (h >> 15) & 1, e, m;
  double v;
  if (bf16) {
    e = (h >> 7) & 255, m = h & 127;
    v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
  } else {
    e = (h >> 10) & 31, m = h & 1023;
    v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  }
  return s ? -v : v;
}

void reader_check_all_halves(const stab_ckpt_tensor *t, int bf16, float *out) {
  ck_assert_uint_eq(t->count, 65536);
  for (uint64_t first = 0; first < 65536;) {
    size_t n = first % 3 ? 1000 : 4093;
    if (n > 65536 - first) n = 65536 - first;
    TU_ASSERT_OK(stab_ckpt_read_f32(t, first, n, out + first), "%s [%llu, +%zu)", t->dtype_name,
                 (unsigned long long)first, n);
    first += n;
  }
  for (unsigned h = 0; h < 65536; h++) {
    double want = half_value(h, bf16);
    if (isnan(want))
      ck_assert_msg(isnan(out[h]), "%s 0x%04x: got %.9g, want NaN", t->dtype_name, h, out[h]);
    else
      ck_assert_msg((double)out[h] == want && !signbit(out[h]) == !signbit(want), "%s 0x%04x: got %.9g, want %.17g",
                    t->dtype_name, h, out[h], want);
  }
}
