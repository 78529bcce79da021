/* mpi_table.c — layers split along their items among MPI ranks: an embedding or LM-head table
 * by vocabulary, a gain or a bias by entries. The library's metrics on each rank's part
 * (stab_table_metrics_reduced, stab_vector_metrics_reduced), its sums (the mean item, sums of
 * squares) and maxima (row norms, distances to the mean, a gain's largest entry) completed over
 * the ranks.
 * Sums and maxima through mpi_collective.c's, which give every rank the same bits (a NaN on any
 * rank wins a maximum: MPI_MAX on doubles says nothing of NaN); each sum's values on grids of
 * their own, as they are of unrelated sizes (the mean item's entries, sums of squares). */
#include "mpi/mpi_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static stab_status sum_over_ranks(void *ctx, double *x, size_t n) { return stabi_mpi_sum_each(ctx, x, n); }

static stab_status max_over_ranks(void *ctx, double *x, size_t n) { return stabi_mpi_max(ctx, x, n); }

/* What every rank must agree on about its shard, exchanged as bytes. */
typedef struct {
  int kind, layout, dtype, tight;
  uint64_t width, whole, begin, count;
} table_layout;

static int by_begin(const void *a, const void *b) {
  const table_layout *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static stab_status check_parts(const char *who, table_layout *all, int ranks) {
  const table_layout z = all[0];
  for (int r = 1; r < ranks; r++)
    if (all[r].kind != z.kind || all[r].layout != z.layout || all[r].dtype != z.dtype || all[r].tight != z.tight ||
        all[r].width != z.width || all[r].whole != z.whole)
      return stabi_fail(STAB_EINVAL, "%s: rank %d's layer (kind, layout, dtype, width, whole length or tight "
                        "method) differs from rank 0's", who, r);
  qsort(all, (size_t)ranks, sizeof *all, by_begin);
  uint64_t next = 0;
  for (int i = 0; i < ranks; i++) {
    if (all[i].begin != next)
      return stabi_fail(STAB_ERANGE, "%s: the shards %s at %llu", who,
                        all[i].begin < next ? "overlap" : "leave a gap",
                        (unsigned long long)(all[i].begin < next ? all[i].begin : next));
    next = all[i].begin + all[i].count;
  }
  if (next != z.whole)
    return stabi_fail(STAB_ERANGE, "%s: the shards cover [0, %llu) of [0, %llu)", who,
                      (unsigned long long)next, (unsigned long long)z.whole);
  return STAB_OK;
}

/* The two public functions: table 1 for a table split by vocabulary, 0 for a vector by entries. */
static stab_status split_metrics(MPI_Comm comm, const char *who, int table, const stab_layer *shard, size_t begin,
                                 size_t whole, const stab_layer *before, const stab_metrics_params *params,
                                 stab_metrics *out) {
  stabi_mpi_sum g;
  memset(&g, 0, sizeof g);
  int ranks = 0;
  table_layout *all = NULL;
  stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stab_status st = STAB_OK;
  if (!out || !shard)
    st = stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !out ? "out" : "shard");
  const int is_table = shard && (shard->kind == STAB_KIND_EMBEDDING || shard->kind == STAB_KIND_LM_HEAD);
  const int is_vector = shard && (shard->kind == STAB_KIND_GAIN || shard->kind == STAB_KIND_BIAS);
  const size_t count = !shard ? 0 : table ? shard->vocab : shard->d_out;
  if (st == STAB_OK && (table ? !is_table : !is_vector))
    st = stabi_fail(STAB_EINVAL, "%s: layer '%s' is not a %s", who, shard->name ? shard->name : "(unnamed)",
                    table ? "table" : "gain or bias");
  else if (st == STAB_OK && (count == 0 || begin >= whole || count > whole - begin))
    st = stabi_fail(STAB_ERANGE, "%s: %s [%zu, %zu + %zu) are empty or outside [0, %zu)", who,
                    table ? "tokens" : "entries", begin, begin, count, whole);
  if (MPI_Comm_size(comm, &ranks) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_size failed", who);
  if (st == STAB_OK) {
    st = stabi_mpi_sum_init(&g, comm, table && shard->width > 2 ? shard->width : 2);
    all = malloc((size_t)ranks * sizeof *all);
    if (st == STAB_OK && !all) st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  }
  st = stabi_mpi_agree(comm, st, who);
  if (st == STAB_OK) {
    const table_layout me = {(int)shard->kind, table ? (int)shard->layout : 0, (int)shard->dtype,
                             table ? (int)p.tight : 0, table ? shard->width : 0, whole, begin, count};
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, comm) != MPI_SUCCESS)
      st = stabi_fail(STAB_EIO, "%s: MPI_Allgather of the shards' layout failed", who);
    st = stabi_mpi_agree(comm, st, who);
    if (st == STAB_OK) st = check_parts(who, all, ranks); /* the same verdict on every rank */
  }
  /* the library's own checks of the shard, agreed on before its first collective */
  /* before on some ranks only would make the ranks' reduce calls differ */
  if (st == STAB_OK) {
    int with[2] = {before != NULL, -(before != NULL)};
    if (MPI_Allreduce(MPI_IN_PLACE, with, 2, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
      st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' before failed", who);
    else if (with[0] != -with[1])
      st = stabi_fail(STAB_EINVAL, "%s: before is given on some ranks and NULL on others", who);
  }
  if (st == STAB_OK)
    st = stabi_mpi_agree(comm, table ? stab_table_check_shard(shard, whole, before, &p)
                                     : stab_vector_check_shard(shard, whole, before, &p), who);
  if (st == STAB_OK) {
    stab_shard_reduce ops = {sum_over_ranks, max_over_ranks, &g};
    st = table ? stab_table_metrics_reduced(shard, whole, before, &p, &ops, out)
               : stab_vector_metrics_reduced(shard, whole, before, &p, &ops, out);
    st = stabi_mpi_agree(comm, st, who);
  }
  if (st != STAB_OK && out) {
    out->forward = out->dependency = out->update = out->spread = NAN;
    out->forward_tight = out->dependency_tight = out->update_tight = out->rel_update = NAN;
  }
  stabi_mpi_sum_free(&g);
  free(all);
  return st;
}

stab_status stab_mpi_table_metrics(MPI_Comm comm, const stab_layer *shard, size_t vocab_begin, size_t whole_vocab,
                                   const stab_layer *before, const stab_metrics_params *params, stab_metrics *out) {
  return split_metrics(comm, "stab_mpi_table_metrics", 1, shard, vocab_begin, whole_vocab, before, params, out);
}

stab_status stab_mpi_vector_metrics(MPI_Comm comm, const stab_layer *shard, size_t begin, size_t whole_length,
                                    const stab_layer *before, const stab_metrics_params *params, stab_metrics *out) {
  return split_metrics(comm, "stab_mpi_vector_metrics", 0, shard, begin, whole_length, before, params, out);
}
