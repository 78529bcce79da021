/* mpi_internal.h — what the MPI layer's files share: agreeing on a status across ranks, and
 * the fixed-order sum that makes every rank's estimate the same bits. Not installed. */
#ifndef STAB_MPI_INTERNAL_H
#define STAB_MPI_INTERNAL_H

#include "stabmeter_mpi.h"

#include <stdint.h>

/* libstabmeter's own failure recorder (status.c), exported for this layer alone: the message
 * lands where stab_last_error() reads it. */
stab_status stabi_fail(stab_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Collective: every rank gives its own status (its message in stab_last_error() when not
 * STAB_OK); every rank returns the first failing rank's status, its message prefixed with
 * "rank R: " and who, or STAB_OK when all succeeded. An MPI failure of the exchange itself:
 * STAB_EIO. */
stab_status stabi_mpi_agree(MPI_Comm comm, stab_status mine, const char *who);

/* Sums and maxima over comm's ranks that every rank gets with the same bits
 * (mpi_collective.c says how): the buffers for up to max_n + 1 values. */
typedef struct {
  MPI_Comm comm;
  int ranks;
  int bits;       /* the fixed-point grid's bits below a group's largest magnitude */
  size_t max_n;
  int64_t *fixed; /* max_n + 2: the values on the grid, then summed */
  double *scale;  /* max_n + 2: the groups' largest magnitudes, and a flag */
  int *kinds;     /* max_n + 2: NaN or infinities seen, when some value is not finite */
} stabi_mpi_sum;

stab_status stabi_mpi_sum_init(stabi_mpi_sum *s, MPI_Comm comm, size_t max_n);
void stabi_mpi_sum_free(stabi_mpi_sum *s);
/* A stab_spectral_reduce_fn: ctx a stabi_mpi_sum; y (n <= max_n, one grid) and *quad summed. */
stab_status stabi_mpi_sum_reduce(void *ctx, double *y, size_t n, double *quad);
/* x[0..n) (n <= max_n + 1) replaced by its sums over the ranks, each value on a grid of its own
 * (values of unrelated sizes). */
stab_status stabi_mpi_sum_each(stabi_mpi_sum *s, double *x, size_t n);
/* x[0..n) (n <= max_n + 1) replaced by its maxima over the ranks; a NaN on any rank wins. */
stab_status stabi_mpi_max(stabi_mpi_sum *s, double *x, size_t n);

/* One part of a segmented sum: x[0..nx) on one grid, each c[k] on its own (either may be empty). */
typedef struct {
  double *x;
  size_t nx;
  double *c;
  size_t nc;
} stabi_mpi_segment;

/* Every segment's values replaced by their sums over the ranks, each segment with the bits it
 * gets summed alone (stabi_mpi_sum_reduce, stabi_mpi_sum_each), all in the same collectives:
 * one MPI_MAX of every grid's scale, one MPI_SUM of every value (a third, MPI_BOR, when some
 * value is not finite). flag: NULL, or a value maxed over the ranks with the scales. Needs
 * the values' total <= max_n + 1, and the grids (one per segment and per c) + 2 <= max_n + 2. */
stab_status stabi_mpi_sum_segments(stabi_mpi_sum *s, const stabi_mpi_segment *seg, size_t nseg, double *flag);

/* ---- the sharded estimate and the split linear layer, opened for mpi_batch.c ---- */

struct stab_mpi_sharded {
  MPI_Comm comm;             /* a duplicate of the caller's, errors returned */
  stab_mpi_shard shard;
  size_t local_rows, n;      /* what the engine sees: local_rows x n (transposed split by columns) */
  size_t whole_rows;         /* rows of the whole matrix the engine sees (cols split by columns) */
  stab_spectral_workspace *ws;
  stabi_mpi_sum sum;
  double *v;                 /* n: warm start, replicated; zeros until the first estimate */
  float *transposed;         /* split by columns: local_rows x n, the shard transposed */
};

/* stab_mpi_sharded_sigma's checks of w, ld and out on this rank alone (no collective); *ld
 * becomes the stride (0 replaced). */
stab_status stabi_mpi_sharded_check(const stab_mpi_sharded *s, const float *w, size_t *ld,
                                    const stab_sigma_result *out, const char *who);
/* The matrix the engine reads for a checked w: w itself split by rows, its transpose into the
 * handle's copy split by columns. */
void stabi_mpi_sharded_source(stab_mpi_sharded *s, const float *w, size_t ld, const float **a, size_t *lda);
/* The engine on that matrix from the handle's warm start, every pass's sum through fn(ctx). */
stab_status stabi_mpi_sharded_run(stab_mpi_sharded *s, const float *a, size_t lda, stab_spectral_reduce_fn fn,
                                  void *ctx, stab_sigma_result *out);

struct stab_mpi_linear {
  MPI_Comm comm;              /* a duplicate of the caller's, errors returned */
  stab_mpi_shard shard;
  int has_bias;
  uint64_t id;                /* the same on every rank of comm, distinct per handle in a process */
  size_t srows, scols;        /* the shard as stored, out-major */
  size_t bias_len;            /* the entries of the bias this rank is given */
  stab_mpi_sharded *w, *dw;   /* W's estimate and the update's, each with its own warm start */
  stabi_mpi_sum sum;
  float *buf;                 /* srows x scols: the update, or 16-bit weights as f32 */
  float *row_a, *row_b;       /* a stored row or the bias, as f32 (16-bit dtypes) */
  size_t row_len;
};

/* stab_mpi_linear_measure's steps, in the order it takes them, for the batch to take alike:
 * the checks of one rank's arguments (who names the caller in the message), the weights as
 * f32 (16-bit ones converted into h->buf), the update formed in h->buf with the sums of
 * squares of W and dW (q[0], q[1]), the bias's (q[2], q[3]), and the metrics from the parts
 * and the sums q over the ranks. */
stab_status stabi_mpi_linear_check(const stab_mpi_linear *h, const stab_layer *l, const stab_layer *before,
                                   const stab_metrics *out, size_t *ld, const char *who);
void stabi_mpi_linear_clear(stab_metrics *m);
void stabi_mpi_linear_weights(stab_mpi_linear *h, const stab_layer *l, size_t ld, const float **w, size_t *wld);
void stabi_mpi_linear_update(stab_mpi_linear *h, const stab_layer *l, const stab_layer *before, size_t ld,
                             double q[2]);
void stabi_mpi_linear_bias_sums(stab_mpi_linear *h, const stab_layer *l, const stab_layer *before, double q[4]);
stab_status stabi_mpi_linear_finish(const stab_mpi_linear *h, stab_linear_parts *parts, const double q[4],
                                    int with_update, stab_metrics *out);

#endif
