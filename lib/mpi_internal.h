/* mpi_internal.h — what the MPI layer's files share: agreeing on a status across ranks, and
 * the fixed-order sum that makes every rank's estimate the same bits. Not installed. */
#ifndef STAB_MPI_INTERNAL_H
#define STAB_MPI_INTERNAL_H

#include "stabmeter_mpi.h"

/* libstabmeter's own failure recorder (status.c), exported for this layer alone: the message
 * lands where stab_last_error() reads it. */
stab_status stabi_fail(stab_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Collective: every rank gives its own status (its message in stab_last_error() when not
 * STAB_OK); every rank returns the first failing rank's status, its message prefixed with
 * "rank R: " and who, or STAB_OK when all succeeded. An MPI failure of the exchange itself:
 * STAB_EIO. */
stab_status stabi_mpi_agree(MPI_Comm comm, stab_status mine, const char *who);

/* The buffers of the fixed-order sum over comm's ranks of up to max_n doubles. */
typedef struct {
  MPI_Comm comm;
  int ranks;
  size_t max_n;
  double *send; /* max_n + 1: a pass's vectors and its quadratic form */
  double *all;  /* ranks x (max_n + 1): every rank's, in rank order */
} stabi_mpi_sum;

stab_status stabi_mpi_sum_init(stabi_mpi_sum *s, MPI_Comm comm, size_t max_n);
void stabi_mpi_sum_free(stabi_mpi_sum *s);
/* A stab_spectral_reduce_fn: ctx a stabi_mpi_sum. */
stab_status stabi_mpi_sum_reduce(void *ctx, double *y, size_t n, double *quad);

#endif
