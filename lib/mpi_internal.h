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

#endif
