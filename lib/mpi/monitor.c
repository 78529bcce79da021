/* mpi_monitor.c — a monitor whose weights every rank holds whole (data parallelism, ZeRO-1/2):
 * the ranks divide its layers among themselves, each measures its share, and every rank ends
 * with every layer's metrics, the same bits as one process measuring them all.
 * Bit-identical because each layer is always measured by the same rank (the assignment depends
 * only on the layers' shapes), so its warm-start history is the single-process monitor's, and
 * a layer's metrics do not depend on which thread or which other layers a step measured.
 * Layers stored as F16 or BF16 are measured as the single-process monitor measures them: the
 * ranks must agree on each layer's dtype as on its shape (checked every step). */
#include "mpi/mpi_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A step's work on a layer, in elements read times the passes it expects: a warm Lanczos
 * estimate is counted as 3 passes (what it took before warm starts waited for the block's
 * random part, 0.12.0; now about 10 on a Gaussian: linear layers are underweighted against
 * tables, which only moves the balance between ranks), a table's row norms and bounds 2, a
 * vector 1. Only the shapes count, never with_update, so that a layer keeps its rank from step
 * to step. */
static uint64_t layer_cost(const stab_layer *l) {
  switch (l->kind) {
  case STAB_KIND_LINEAR: return (uint64_t)l->d_in * l->d_out * 3 + 1;
  case STAB_KIND_ATTENTION: return (uint64_t)l->d_in * l->d_out * 2 * 3 + 1; /* query and key */
  case STAB_KIND_EMBEDDING:
  case STAB_KIND_LM_HEAD: return (uint64_t)l->vocab * l->width * 2 + 1;
  default: return (uint64_t)(l->d_in > l->d_out ? l->d_in : l->d_out) + 1;
  }
}

/* Longest processing time first: the costliest layer (lowest index among equals) to the rank
 * with the least work so far (the lowest rank among equals). Deterministic on every rank. */
typedef struct {
  uint64_t cost;
  size_t index;
} costed;

static int costlier_first(const void *a, const void *b) {
  const costed *x = a, *y = b;
  if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static size_t head_count(const stab_layer *l) { return l->kind == STAB_KIND_ATTENTION ? l->heads : 0; }

stab_status stab_mpi_monitor_measure(MPI_Comm comm, stab_monitor *m, int with_update) {
  static const char who[] = "stab_mpi_monitor_measure";
  int rank = 0, ranks = 1;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &ranks) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_rank or MPI_Comm_size failed", who);
  const size_t n = m ? stab_monitor_layer_count(m) : 0;
  costed *order = NULL;
  uint64_t *cost = NULL, *lo = NULL, *hi = NULL;
  int *owner = NULL, *counts = NULL, *displs = NULL;
  unsigned char *mine = NULL, *packed = NULL, *all = NULL;
  stab_status st = m ? STAB_OK : stabi_fail(STAB_EINVAL, "%s: monitor is NULL", who);
  /* the same number of layers everywhere: a max and a min of it, exact */
  unsigned long long nn[2] = {n, ~(unsigned long long)n}, agreed[2];
  st = stabi_mpi_agree(comm, st, who);
  if (st != STAB_OK) return st;
  if (MPI_Allreduce(nn, agreed, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the layer counts failed", who);
  if (agreed[0] != n || ~agreed[1] != n)
    return stabi_fail(STAB_EINVAL, "%s: the ranks' monitors hold from %llu to %llu layers", who, ~agreed[1],
                      agreed[0]);
  if (n == 0) return STAB_OK;
  order = malloc(n * sizeof *order);
  cost = malloc(6 * n * sizeof *cost); /* cost, then dtype; the lowest and highest of both */
  owner = malloc(n * sizeof *owner);
  mine = calloc(n, 1);
  counts = calloc(2 * (size_t)ranks, sizeof *counts);
  uint64_t *load = calloc((size_t)ranks, sizeof *load);
  st = order && cost && owner && mine && counts && load ? STAB_OK
                                                        : stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  st = stabi_mpi_agree(comm, st, who);
  if (st != STAB_OK) goto out;
  lo = cost + 2 * n;
  hi = cost + 4 * n;
  for (size_t i = 0; i < n; i++) {
    cost[i] = layer_cost(stab_monitor_layer(m, i));
    cost[n + i] = (uint64_t)stab_monitor_layer(m, i)->dtype;
    order[i] = (costed){cost[i], i};
  }
  /* the same layers everywhere: their costs (shapes) and dtypes compared across ranks */
  for (size_t i = 0; i < 2 * n; i++) lo[i] = ~cost[i];
  if (MPI_Allreduce(cost, hi, (int)(2 * n), MPI_UINT64_T, MPI_MAX, comm) != MPI_SUCCESS ||
      MPI_Allreduce(MPI_IN_PLACE, lo, (int)(2 * n), MPI_UINT64_T, MPI_MAX, comm) != MPI_SUCCESS) {
    st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the layer shapes failed", who);
    goto out;
  }
  for (size_t i = 0; i < 2 * n; i++)
    if (hi[i] != cost[i] || ~lo[i] != cost[i]) {
      st = stabi_fail(STAB_EINVAL, "%s: layer %zu ('%s') has another %s on another rank", who, i % n,
                      stab_monitor_layer(m, i % n)->name, i < n ? "shape" : "dtype");
      goto out;
    }
  qsort(order, n, sizeof *order, costlier_first);
  for (size_t k = 0; k < n; k++) {
    int best = 0;
    for (int r = 1; r < ranks; r++)
      if (load[r] < load[best]) best = r;
    owner[order[k].index] = best;
    load[best] += order[k].cost;
  }
  /* this rank's share, then every share to every rank, packed in layer order per rank */
  displs = counts + ranks;
  const size_t per = sizeof(stab_metrics);
  for (size_t i = 0; i < n; i++) {
    mine[i] = owner[i] == rank;
    counts[owner[i]] += (int)(per + head_count(stab_monitor_layer(m, i)) * sizeof(double));
  }
  size_t total = 0;
  for (int r = 0; r < ranks; r++) {
    displs[r] = (int)total;
    total += (size_t)counts[r];
  }
  packed = malloc((size_t)counts[rank] + 1);
  all = malloc(total + 1);
  stab_status measured = packed && all ? stab_monitor_measure_some(m, with_update, mine)
                                       : stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  /* a rank out of memory stops every rank here; a failed measurement still shares its NaN
   * metrics, as the single-process monitor keeps the other layers' */
  st = stabi_mpi_agree(comm, packed && all ? STAB_OK : measured, who);
  if (st != STAB_OK) goto out;
  unsigned char *p = packed;
  for (size_t i = 0; i < n; i++) {
    if (!mine[i]) continue;
    memcpy(p, stab_monitor_metrics(m, i), per);
    p += per;
    size_t h = head_count(stab_monitor_layer(m, i));
    if (h) memcpy(p, stab_monitor_head_bounds(m, i), h * sizeof(double));
    p += h * sizeof(double);
  }
  if (MPI_Allgatherv(packed, counts[rank], MPI_BYTE, all, counts, displs, MPI_BYTE, comm) != MPI_SUCCESS) {
    st = stabi_fail(STAB_EIO, "%s: MPI_Allgatherv of the metrics failed", who);
    goto out;
  }
  for (int r = 0; r < ranks; r++) {
    const unsigned char *q = all + displs[r];
    for (size_t i = 0; i < n; i++) {
      if (owner[i] != r) continue;
      size_t h = head_count(stab_monitor_layer(m, i));
      if (r != rank) {
        stab_metrics mt;
        memcpy(&mt, q, per);
        /* every record is a multiple of 8 bytes from a malloc'd start: the bounds are aligned */
        stab_monitor_set_metrics(m, i, &mt, h ? (const double *)(const void *)(q + per) : NULL);
      }
      q += per + h * sizeof(double);
    }
  }
  /* the first failing rank's failure, on every rank (its message names the layer) */
  st = stabi_mpi_agree(comm, measured, who);
out:
  free(order);
  free(cost);
  free(owner);
  free(mine);
  free(counts);
  free(load);
  free(packed);
  free(all);
  return st;
}
