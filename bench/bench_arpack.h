/* bench_arpack.h — ARPACK (dsaupd, reverse communication) on the Gram matrix of an f32
 * matrix, its products by OpenBLAS sgemv: the bench's anchor for a cold sigma, done as scipy's
 * svds does it. Not a part of the library. */
#ifndef STAB_HARNESS_BENCH_ARPACK_H
#define STAB_HARNESS_BENCH_ARPACK_H

#include <stddef.h>

/* 1 when the bench was built with ARPACK (configure found dsaupd_), else 0. */
int arpack_available(void);

/* sigma(W) of the row-major rows x cols f32 matrix w: the largest eigenvalue of the smaller
 * Gram matrix (W^T W or W W^T) by dsaupd with which = "LA", nev = 1, ncv = min(n, 20) (scipy's
 * eigsh default), a seeded Gaussian start (the same every call) and maxiter 10 n, to
 * ARPACK's tolerance tol.
 * Each product reads W twice (two sgemv). On success returns 0 and sets *sigma, *reads (reads
 * of W) and *seconds (the whole call, allocation excluded); -1 when ARPACK is absent or
 * fails (a message on stderr). */
int arpack_sigma(const float *w, size_t rows, size_t cols, double tol, double *sigma, int *reads,
                 double *seconds);

#endif /* STAB_HARNESS_BENCH_ARPACK_H */
