/* bench_power.c — a power iteration as PyTorch users write it (see bench_power.h). */
#include "bench_power.h"

#include <math.h>
#include <stdlib.h>

#include <cblas.h>

#include "clock.h"
#include "synth.h"

int power_oracle(const float *w, size_t rows, size_t cols, double ref, double tol, int max_iter,
                 unsigned long long seed, double *sigma, double *seconds)
{
  float *v = malloc(cols * sizeof *v), *u = malloc(rows * sizeof *u);
  int k = -1;
  if (!v || !u)
    goto out;
  synth_rng rng;
  synth_seed(&rng, seed);
  synth_gaussian(v, cols, 1.0, &rng);
  double t0 = monotonic_seconds(), s = 0.0;
  for (k = 1; k <= max_iter; k++) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)rows, (int)cols, 1.0f, w, (int)cols, v, 1, 0.0f, u, 1);
    float nu = cblas_snrm2((int)rows, u, 1);
    if (nu > 0.0f)
      cblas_sscal((int)rows, 1.0f / nu, u, 1);
    cblas_sgemv(CblasRowMajor, CblasTrans, (int)rows, (int)cols, 1.0f, w, (int)cols, u, 1, 0.0f, v, 1);
    float nv = cblas_snrm2((int)cols, v, 1);
    s = nv;
    if (nv > 0.0f)
      cblas_sscal((int)cols, 1.0f / nv, v, 1);
    if (fabs(s - ref) <= tol * ref)
      break;
  }
  *seconds = monotonic_seconds() - t0;
  *sigma = s;
out:
  free(v);
  free(u);
  return k;
}
