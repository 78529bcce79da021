/* synth.h — deterministic synthetic data for the harness programs (bench, demo).
 *
 * The same seed gives the same numbers on every machine and compiler: the generator is
 * splitmix64 (integer only) and the normals come from Box–Muller in f64 with libm's
 * log, sqrt and cos. Not for cryptography, not a part of the library.
 */
#ifndef STAB_HARNESS_SYNTH_H
#define STAB_HARNESS_SYNTH_H

#include <stddef.h>
#include <stdint.h>

/* Generator state: one 64-bit word (splitmix64). Copyable; two copies give the same stream. */
typedef struct {
  uint64_t s;
} synth_rng;

/* Starts r at seed; any value, 0 included, is a good seed. */
void synth_seed(synth_rng *r, uint64_t seed);

/* One standard normal sample (mean 0, variance 1); consumes two 64-bit draws. */
double synth_normal(synth_rng *r);

/* a[0..n) = std * N(0, 1), each sample computed in f64 and rounded once to f32.
 * n may be 0; a may then be NULL. */
void synth_gaussian(float *a, size_t n, double std, synth_rng *r);

#endif /* STAB_HARNESS_SYNTH_H */
