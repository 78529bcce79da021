/* mpi_collective.c — the MPI layer's two collectives: every rank agreeing on one status (so a
 * failure on one rank never leaves the others waiting in a later collective), and the sum over
 * ranks of a Lanczos pass's products in a fixed order.
 *
 * Why not MPI_Allreduce: MPI does not promise that every rank gets the same bits, nor the same
 * bits from run to run (the reduction tree may depend on the message size, the topology and
 * the algorithm the library picks). Lanczos takes decisions from these sums (stop, restart);
 * ranks that part ways by one rounding would call different collectives and hang. So every
 * rank gathers every rank's products (MPI_Allgather moves bytes, it does not add) and adds them
 * itself in rank order 0, 1, ..., P-1: the same bits everywhere, always. The cost: each rank
 * receives (P - 1) x (n + 1) doubles and adds P vectors, where a bandwidth-optimal all-reduce
 * moves about 2 (n + 1); and P x (n + 1) doubles of memory. docs/mpi.md weighs it. */
#include "mpi_internal.h"

#include <stdlib.h>
#include <string.h>

/* One all-reduce of two ints when every rank succeeded: MINLOC over (failed ? 0 : 1, rank)
 * finds the lowest failing rank, which then broadcasts its status and message. Nothing is
 * allocated, so that a rank out of memory still takes part. */
stab_status stabi_mpi_agree(MPI_Comm comm, stab_status mine, const char *who) {
  int rank = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_rank failed", who);
  struct { int ok, rank; } me = {mine == STAB_OK, rank}, first;
  if (MPI_Allreduce(&me, &first, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' status failed", who);
  if (first.ok) return STAB_OK;
  struct { int status; char message[244]; } why;
  memset(&why, 0, sizeof why);
  if (rank == first.rank) {
    why.status = (int)mine;
    strncpy(why.message, stab_last_error(), sizeof why.message - 1);
  }
  if (MPI_Bcast(&why, (int)sizeof why, MPI_BYTE, first.rank, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: rank %d failed, and MPI_Bcast of its message failed", who, first.rank);
  return stabi_fail((stab_status)why.status, "rank %d: %s", first.rank, why.message);
}

stab_status stabi_mpi_sum_init(stabi_mpi_sum *s, MPI_Comm comm, size_t max_n) {
  memset(s, 0, sizeof *s);
  s->comm = comm;
  if (MPI_Comm_size(comm, &s->ranks) != MPI_SUCCESS || s->ranks < 1)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Comm_size failed");
  s->max_n = max_n;
  size_t per = max_n + 1;
  if (per > (size_t)INT32_MAX || per > SIZE_MAX / sizeof(double) / (size_t)s->ranks)
    return stabi_fail(STAB_EDIM, "stab_mpi: %zu doubles per rank is too many for one MPI call", per);
  s->send = malloc(per * sizeof *s->send);
  s->all = malloc(per * (size_t)s->ranks * sizeof *s->all);
  if (!s->send || !s->all) {
    stabi_mpi_sum_free(s);
    return stabi_fail(STAB_ENOMEM, "stab_mpi: cannot allocate %d x %zu doubles for the sum over ranks",
                      s->ranks, per);
  }
  return STAB_OK;
}

void stabi_mpi_sum_free(stabi_mpi_sum *s) {
  free(s->send);
  free(s->all);
  s->send = s->all = NULL;
}

stab_status stabi_mpi_sum_reduce(void *ctx, double *y, size_t n, double *quad) {
  stabi_mpi_sum *s = ctx;
  if (n > s->max_n)
    return stabi_fail(STAB_EDIM, "stab_mpi: a pass of %zu doubles exceeds the %zu reserved", n, s->max_n);
  const size_t per = n + 1;
  memcpy(s->send, y, n * sizeof *y);
  s->send[n] = *quad;
  if (MPI_Allgather(s->send, (int)per, MPI_DOUBLE, s->all, (int)per, MPI_DOUBLE, s->comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Allgather of a pass's %zu doubles failed", per);
  /* rank order, from rank 0's values up: one fixed sequence of additions on every rank */
  memcpy(y, s->all, n * sizeof *y);
  double q = s->all[n];
  for (int r = 1; r < s->ranks; r++) {
    const double *o = s->all + (size_t)r * per;
    for (size_t i = 0; i < n; i++) y[i] += o[i];
    q += o[n];
  }
  *quad = q;
  return STAB_OK;
}
