/* bench_power.h — the "torch-style" power iteration on an f32 matrix by OpenBLAS sgemv,
 * stopped by an oracle: the bench's baseline for matrices with a gap. Not a part of the
 * library. */
#ifndef STAB_HARNESS_BENCH_POWER_H
#define STAB_HARNESS_BENCH_POWER_H

#include <stddef.h>

/* u = W v / |W v|, v = W^T u / |W^T u|, sigma = |W^T u| (two sgemv an iteration) on the
 * row-major rows x cols f32 w from a seeded Gaussian v, stopped at the first iteration whose
 * |sigma - ref| / ref <= tol (the oracle: it knows the answer), at most max_iter iterations.
 * Returns the iterations (max_iter + 1 if the oracle never said stop) and sets *seconds (the
 * iterations and the oracle's check, allocation excluded) and *sigma; -1 on out of memory. */
int power_oracle(const float *w, size_t rows, size_t cols, double ref, double tol, int max_iter,
                 unsigned long long seed, double *sigma, double *seconds);

#endif /* STAB_HARNESS_BENCH_POWER_H */
