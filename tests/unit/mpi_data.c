/* mpi_data.c — the test data tests/unit/mpi_sharded's files make alike: uniform values from a seed,
 * their bfloat16 patterns, and a rank's share of an extent. */
#include "mpi_check.h"

#include <string.h>

void mpi_fill(float *x, size_t n, uint64_t seed, uint64_t salt, float amp) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + salt;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = amp * (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
}

uint16_t mpi_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

void mpi_share_of(int me, size_t extent, const int *weight, size_t *begin, size_t *end) {
  int total = 0;
  for (int r = 0; r < ranks; r++) total += weight[r];
  size_t at = 0;
  for (int r = 0; r <= me; r++) {
    size_t n = r == ranks - 1 ? extent - at : extent * (size_t)weight[r] / (size_t)total;
    if (n == 0) n = 1;
    *begin = at;
    *end = at + n;
    at += n;
  }
}
