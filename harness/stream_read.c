/* stream_read.c — the plain streaming read of harness/bench and bench/pass_ceiling: eight
 * independent 4-wide f32 accumulators (in registers; SSE2 is x86-64's baseline, so no special
 * flags) keep far more adds in flight than any memory system can feed, so the time is the
 * reads'. */
#include "stream_read.h"

#include <string.h>

#if defined(__GNUC__)
typedef float f32x4 __attribute__((vector_size(16)));

static f32x4 load4(const float *p) {
  f32x4 x;
  memcpy(&x, p, sizeof x); /* unaligned load */
  return x;
}
#endif

double stream_read_sum(const float *a, size_t n) {
  size_t i = 0;
  double s = 0.0;
#if defined(__GNUC__)
  f32x4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
  for (; i + 32 <= n; i += 32) {
    s0 += load4(a + i);
    s1 += load4(a + i + 4);
    s2 += load4(a + i + 8);
    s3 += load4(a + i + 12);
    s4 += load4(a + i + 16);
    s5 += load4(a + i + 20);
    s6 += load4(a + i + 24);
    s7 += load4(a + i + 28);
  }
  f32x4 t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
  s = (double)t[0] + t[1] + t[2] + t[3];
#endif
  for (; i < n; i++) s += a[i];
  return s;
}
