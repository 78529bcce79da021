/* stabmeter/spectral.h — the spectral engine: sigma(W), or sigma(A - B), of an f32 matrix by
 * block Lanczos, power iteration or LAPACK, in a workspace allocated once; and of a matrix split
 * by rows among processes. Every metric of a weight matrix stands on it; a caller uses it
 * directly only to measure matrices of its own. Part of <stabmeter.h>. */
#ifndef STABMETER_SPECTRAL_H
#define STABMETER_SPECTRAL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Spectral norms                                                                      */

typedef enum {
  STAB_SPECTRAL_LANCZOS = 0, /* block Lanczos (blocks of 4) on the Gram matrix, full
                                reorthogonalisation (default) */
  STAB_SPECTRAL_POWER = 1,   /* power iteration on the Gram matrix */
  STAB_SPECTRAL_EXACT = 2    /* LAPACK dgesvd (values only) on an f64 copy: the reference */
} stab_spectral_method;

/* Bounds of the parameters below (every function taking them returns STAB_EINVAL outside).
 * TOL_MIN: f64 accumulation puts a floor of about 1e-14 under the relative error Lanczos can
 * certify (measured up to 1000 x 1000); below 1e-12 a tolerance would only make every estimate
 * run out of passes and be flagged not converged. KRYLOV_MAX: the basis takes krylov_dim x cols
 * doubles and the projected problem krylov_dim^2; more vectors than this gain nothing. */
#define STAB_SPECTRAL_TOL_MIN 1e-12
/* F32_TOL_MIN: the smallest tol that the fast passes honour. They keep products and partial
 * sums in f32 over short runs, each added into f64: sigma's actual error from them was at
 * most 2.5e-8 (Gaussian, spiked, low-rank, row- and column-scaled matrices up to 4096 x 4096),
 * and an estimate on them reports rel_err >= 1e-7. A smaller tol makes every pass of that
 * estimate all-f64 (about half the speed where memory is not the limit). */
#define STAB_SPECTRAL_F32_TOL_MIN 1e-6
#define STAB_SPECTRAL_MAX_PASSES 1000000
#define STAB_SPECTRAL_KRYLOV_MAX 1024

typedef struct {
  stab_spectral_method method;
  double tol;       /* target relative error of sigma, in [STAB_SPECTRAL_TOL_MIN, 0.5); default 1e-3.
                       Below STAB_SPECTRAL_F32_TOL_MIN the passes are all-f64 (slower) */
  int max_passes;   /* at most this many passes over the matrix, 1 to STAB_SPECTRAL_MAX_PASSES;
                       default 1000 */
  int krylov_dim;   /* Lanczos basis vectors kept before an explicit restart, 2 to
                       STAB_SPECTRAL_KRYLOV_MAX (rounded to whole blocks of 4 vectors, at
                       least 8); default 128 */
  int threads;      /* threads for a pass, >= 0; 0 = the CPUs this process may run on
                       (sched_getaffinity). A pass never uses more than it has row chunks (16),
                       nor threads for a matrix under 2^20 elements; a monitor step measures
                       its layers on this many threads, one matrix each. Threads sleep between
                       passes, and a pass never waits for one that is not running. Results are
                       bit-identical for every value. Default 0 */
  uint64_t seed;    /* seed of the cold-start vector; default 0x5eed */
} stab_spectral_params;

/* The defaults above. */
stab_spectral_params stab_spectral_default_params(void);

typedef struct {
  double sigma;     /* the estimate; power and Lanczos give lower bounds (Ritz values) */
  double rel_err;   /* estimated relative error of sigma; 0 for exact mode and for the zero matrix.
                       Lanczos and power: the residual bound, true of the eigenvalue nearest
                       the Ritz value, which is the top one unless the Krylov space has not
                       seen it yet (its record over families of matrices: docs/lab/performance.md);
                       from a warm start (Lanczos) it also covers what the block's random
                       vectors found beside the warm vector, so that a start along the second
                       singular vector does not pass for the top one */
  int passes;       /* passes made: products of W^T W with the current vector (power) or block
                       of 4 vectors (Lanczos), one read of the matrix each (in this version a
                       Lanczos pass still reads it twice, two vectors at a time) */
  int converged;    /* 1 when rel_err <= tol (always 1 in exact mode), 0 if max_passes ran out */
  int nonfinite;    /* 1 when the matrix holds NaN or Inf: sigma is then NaN */
} stab_sigma_result;

/* Workspace for spectral norms of matrices with rows <= max_rows and cols <= max_cols (the
 * stored shape; a transposed shape must fit on its own). It owns every buffer a computation needs, so stab_spectral_norm allocates
 * nothing. Not thread-safe: one workspace per concurrent caller.
 * Errors: out NULL or params outside their bounds STAB_EINVAL; a zero side, or a max_rows x
 * max_cols matrix of floats larger than memory can address, STAB_EDIM; STAB_ENOMEM. */
typedef struct stab_spectral_workspace stab_spectral_workspace;

stab_status stab_spectral_workspace_create(size_t max_rows, size_t max_cols,
                                           const stab_spectral_params *params,
                                           stab_spectral_workspace **out);
/* NULL is a no-op. */
void stab_spectral_workspace_free(stab_spectral_workspace *ws);

/* sigma(A) or, when b is not NULL, sigma(A - B) without forming A - B.
 *  a, b   rows x cols, row-major with row stride ld (>= cols; 0 means cols) elements; f32.
 *         Every function taking a matrix checks it alike: a NULL STAB_EINVAL; a zero side,
 *         ld < cols, or a span (rows - 1) * ld + cols of floats past what memory can address
 *         (more than PTRDIFF_MAX bytes) STAB_EDIM; the message names the argument
 *  v      warm-start vector of length cols, in f64, or NULL. On entry a previous estimate
 *         of the top right singular vector (all zeros or non-finite means cold start);
 *         on return the new estimate, unit-norm. Pass the same vector every step.
 *  out    the result. On a non-finite matrix out->nonfinite = 1, sigma NaN, return STAB_OK.
 * The shape must fit the workspace. In exact mode v is left untouched and passes is 1 (the
 * copy). Lanczos is exact (to rounding) on narrow matrices, but when depends on which side
 * is narrow and on v:
 *  - cols <= 32: always, warm start or not (the whole cols x cols Gram matrix is formed and
 *    its top eigenvalue taken; rel_err 0);
 *  - rows <= 128 with cols > rows (and rows <= krylov_dim, true of the default): warm start
 *    or cold, the Gram matrix of the rows side (rows x rows, from an f64 copy of A) is formed
 *    and its top eigenvalue taken (rel_err 0, passes 1).
 * cols is the stored row length, so an out-major attention head block (d_h rows of d) is the
 * second case: stab_layer_metrics and a monitor measure it exactly. A warm start elsewhere is
 * a block of v and three random vectors, and stops when both the top Ritz pair and what the
 * random vectors found meet tol: fewer passes than a cold start on most matrices, not 1-3
 * (docs/manual/metrics.md, "Warm starts"). Power iteration always stops at
 * tol. */
stab_status stab_spectral_norm(stab_spectral_workspace *ws, const float *a, const float *b,
                               size_t rows, size_t cols, size_t ld, double *v,
                               stab_sigma_result *out);

/* The build of the pass kernel this process uses: "avx512", "avx2" (with FMA) or "generic",
 * the best the processor runs unless the environment variable STAB_KERNEL names another it
 * runs. Results differ between kernels by rounding only; within one they are reproducible. */
const char *stab_spectral_kernel(void);

/* One call without a workspace: creates one, computes, frees (allocates). params NULL means
 * the defaults; v may be NULL. Errors as stab_spectral_norm and stab_spectral_workspace_create
 * (out NULL STAB_EINVAL; on any error *out is NaN). */
stab_status stab_sigma(const float *a, size_t rows, size_t cols, size_t ld,
                       const stab_spectral_params *params, double *v, stab_sigma_result *out);

/* Sums a pass's products over the shards of a matrix, for stab_spectral_norm_reduced: on
 * entry y (n doubles: the pass's nv vectors of the shared length, one after the other) and
 * *quad (x_0^T G_k x_0) are this shard's; on return both must be the sums over every shard,
 * the same bits on every shard (else the shards' estimates part ways). Return STAB_OK, or a
 * failure, which stops the estimate and is returned by it. Stabmeter's MPI layer
 * (stabmeter_mpi.h) is one such; a caller with its own transport may write another. */
typedef stab_status (*stab_spectral_reduce_fn)(void *ctx, double *y, size_t n, double *quad);

/* sigma of a matrix split by rows among shards, W = [A_1; A_2; ...; A_P], this caller holding
 * A = A_k: the same Lanczos as stab_spectral_norm (warm start, stopping rule, error estimate,
 * f32 or f64 passes; exact when cols <= 32, and from a cold start when whole_rows <= 32, the
 * Krylov space run to its end: the few-rows Gram matrix of one process is not formed, a shard's
 * rows being some of W's) on G = W^T W = sum_k A_k^T A_k, each pass this
 * shard's product followed by reduce(ctx, ...). Every shard must call it with the same cols,
 * whole_rows, workspace params (threads aside) and v, and then takes the same decisions
 * (passes, restarts, stop, failure) and returns the same result, bit for bit.
 *  a           rows x cols, row stride ld (0 means cols), f32: this shard's rows, checked as
 *              stab_spectral_norm checks a; rows must fit the workspace
 *  whole_rows  the rows of W (the sum of every shard's rows), >= rows (else STAB_EDIM)
 *  reduce, ctx the sum over shards, called once per pass (never after a failure)
 *  v, out      as stab_spectral_norm's; on a failure of reduce, its status, sigma NaN
 * A shard split by columns is the same problem on W^T: pass A_k^T. The method must be
 * STAB_SPECTRAL_LANCZOS (else STAB_EINVAL). The argument checks above fail before the first
 * reduce, on this shard alone: a caller whose shards could disagree checks them together
 * first. Not thread-safe on one workspace. */
stab_status stab_spectral_norm_reduced(stab_spectral_workspace *ws, const float *a, size_t rows,
                                       size_t cols, size_t ld, size_t whole_rows,
                                       stab_spectral_reduce_fn reduce, void *ctx, double *v,
                                       stab_sigma_result *out);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_SPECTRAL_H */
