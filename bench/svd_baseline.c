/* svd_baseline.c — the time a user's own spectral norm takes per layer shape: LAPACK sgesdd,
 * singular values only, on an f32 copy (what scipy.linalg.svdvals and torch.linalg.matrix_norm
 * (ord=2) run on a float32 matrix), of a Gaussian N(0, 0.02^2) ROWS x COLS matrix. The copy is
 * made before the clock starts: only the SVD is timed. bench/probe_speed.sh multiplies each
 * shape's time by the number of such layers in a model, to set against the probe's run.
 * Usage: svd_baseline [--gesvd] ROWSxCOLS...; prints "ROWS COLS SECONDS SIGMA_MAX" per shape. */
#include <lapacke.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/clock.h"

/* A cheap Gaussian (Box-Muller on splitmix64): the values only set the spectrum, and sgesdd's
 * time depends on the shape, not on them. */
static double gauss(uint64_t *s) {
  uint64_t z[2];
  for (int k = 0; k < 2; k++) {
    uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    z[k] = x ^ (x >> 31);
  }
  double u1 = ((double)(z[0] >> 11) + 0.5) / 9007199254740992.0, u2 = (double)(z[1] >> 11) / 9007199254740992.0;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int main(int argc, char **argv) {
  int gesvd = 0, a = 1;
  if (a < argc && !strcmp(argv[a], "--gesvd")) gesvd = 1, a++;
  if (a >= argc) {
    fprintf(stderr, "usage: svd_baseline [--gesvd] ROWSxCOLS...\n");
    return 2;
  }
  for (; a < argc; a++) {
    size_t rows, cols;
    char tail;
    if (sscanf(argv[a], "%zux%zu%c", &rows, &cols, &tail) != 2 || !rows || !cols || rows > 1u << 20 || cols > 1u << 20) {
      fprintf(stderr, "svd_baseline: bad shape '%s' (ROWSxCOLS)\n", argv[a]);
      return 2;
    }
    size_t n = rows * cols, k = rows < cols ? rows : cols;
    float *w = malloc(n * sizeof *w), *s = malloc(k * sizeof *s), *superb = malloc(k * sizeof *superb);
    if (!w || !s || !superb) {
      fprintf(stderr, "svd_baseline: out of memory for %zu x %zu\n", rows, cols);
      return 1;
    }
    uint64_t seed = 1;
    for (size_t i = 0; i < n; i++) w[i] = (float)(0.02 * gauss(&seed));
    /* row-major rows x cols is column-major cols x rows: the same singular values */
    const lapack_int m = (lapack_int)cols, nn = (lapack_int)rows;
    double t0 = monotonic_seconds();
    lapack_int info = gesvd ? LAPACKE_sgesvd(LAPACK_COL_MAJOR, 'N', 'N', m, nn, w, m, s, NULL, 1, NULL, 1, superb)
                            : LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'N', m, nn, w, m, s, NULL, 1, NULL, 1);
    double t = monotonic_seconds() - t0;
    if (info != 0) {
      fprintf(stderr, "svd_baseline: %s failed on %zu x %zu (info %d)\n", gesvd ? "sgesvd" : "sgesdd", rows, cols, (int)info);
      return 1;
    }
    printf("%zu %zu %.4f %.6g\n", rows, cols, t, (double)s[0]);
    fflush(stdout);
    free(w), free(s), free(superb);
  }
  return 0;
}
