/* synth.c — splitmix64 and Box–Muller: reproducible Gaussian test matrices for the
 * harness programs. See synth.h. */
#include "synth.h"

#include <math.h>

/* Vigna's splitmix64: a Weyl sequence (golden-ratio increment) through a bijective mixer,
 * so every seed, 0 included, gives a full-period stream. */
static uint64_t next_u64(synth_rng *r)
{
  uint64_t z = (r->s += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Uniform in the open interval (0, 1): the top 53 bits, shifted by half a step, so that
 * log(u) below is always finite. */
static double next_open01(synth_rng *r)
{
  return ((double)(next_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); /* 2^-53 */
}

void synth_seed(synth_rng *r, uint64_t seed)
{
  r->s = seed;
}

/* Box–Muller keeps only the cosine branch: the state has no room to cache the sine
 * sample, and the harness needs reproducibility far more than the second draw. */
double synth_normal(synth_rng *r)
{
  const double two_pi = 6.283185307179586476925286766559;
  double u1 = next_open01(r);
  double u2 = next_open01(r);
  return sqrt(-2.0 * log(u1)) * cos(two_pi * u2);
}

void synth_gaussian(float *a, size_t n, double std, synth_rng *r)
{
  for (size_t i = 0; i < n; i++)
    a[i] = (float)(std * synth_normal(r));
}
