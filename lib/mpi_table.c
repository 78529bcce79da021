/* mpi_table.c — an embedding or LM-head table split by vocabulary among MPI ranks: the
 * library's table metrics on each rank's rows (stab_table_metrics_reduced), its sums (the mean
 * item, sums of squares) and maxima (row norms, distances to the mean) completed over the ranks.
 * Sums and maxima through mpi_collective.c's, which give every rank the same bits (a NaN on any
 * rank wins a maximum: MPI_MAX on doubles says nothing of NaN); each sum's values on grids of
 * their own, as they are of unrelated sizes (the mean item's entries, sums of squares). */
#include "mpi_internal.h"

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

static stab_status check_tables(table_layout *all, int ranks) {
  static const char who[] = "stab_mpi_table_metrics";
  const table_layout z = all[0];
  for (int r = 1; r < ranks; r++)
    if (all[r].kind != z.kind || all[r].layout != z.layout || all[r].dtype != z.dtype || all[r].tight != z.tight ||
        all[r].width != z.width || all[r].whole != z.whole)
      return stabi_fail(STAB_EINVAL, "%s: rank %d's table (kind, layout, dtype, width, whole vocabulary or tight "
                        "method) differs from rank 0's", who, r);
  qsort(all, (size_t)ranks, sizeof *all, by_begin);
  uint64_t next = 0;
  for (int i = 0; i < ranks; i++) {
    if (all[i].begin != next)
      return stabi_fail(STAB_ERANGE, "%s: the shards' vocabularies %s at %llu", who,
                        all[i].begin < next ? "overlap" : "leave a gap",
                        (unsigned long long)(all[i].begin < next ? all[i].begin : next));
    next = all[i].begin + all[i].count;
  }
  if (next != z.whole)
    return stabi_fail(STAB_ERANGE, "%s: the shards cover tokens [0, %llu) of [0, %llu)", who,
                      (unsigned long long)next, (unsigned long long)z.whole);
  return STAB_OK;
}

stab_status stab_mpi_table_metrics(MPI_Comm comm, const stab_layer *shard, size_t vocab_begin, size_t whole_vocab,
                                   const stab_layer *before, const stab_metrics_params *params, stab_metrics *out) {
  static const char who[] = "stab_mpi_table_metrics";
  stabi_mpi_sum g;
  memset(&g, 0, sizeof g);
  int ranks = 0;
  table_layout *all = NULL;
  stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stab_status st = STAB_OK;
  if (!out || !shard)
    st = stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !out ? "out" : "shard");
  else if (shard->kind != STAB_KIND_EMBEDDING && shard->kind != STAB_KIND_LM_HEAD)
    st = stabi_fail(STAB_EINVAL, "%s: layer '%s' is not a table", who, shard->name ? shard->name : "(unnamed)");
  else if (shard->vocab == 0 || vocab_begin >= whole_vocab || shard->vocab > whole_vocab - vocab_begin)
    st = stabi_fail(STAB_ERANGE, "%s: tokens [%zu, %zu + %zu) are empty or outside [0, %zu)", who, vocab_begin,
                    vocab_begin, shard->vocab, whole_vocab);
  if (MPI_Comm_size(comm, &ranks) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_size failed", who);
  if (st == STAB_OK) {
    st = stabi_mpi_sum_init(&g, comm, shard->width > 2 ? shard->width : 2);
    all = malloc((size_t)ranks * sizeof *all);
    if (st == STAB_OK && !all) st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  }
  st = stabi_mpi_agree(comm, st, who);
  if (st == STAB_OK) {
    const table_layout me = {(int)shard->kind, (int)shard->layout, (int)shard->dtype, (int)p.tight,
                             shard->width, whole_vocab, vocab_begin, shard->vocab};
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, comm) != MPI_SUCCESS)
      st = stabi_fail(STAB_EIO, "%s: MPI_Allgather of the shards' layout failed", who);
    st = stabi_mpi_agree(comm, st, who);
    if (st == STAB_OK) st = check_tables(all, ranks); /* the same verdict on every rank */
  }
  /* the library's own checks of the shard, agreed on before its first collective */
  if (st == STAB_OK) st = stabi_mpi_agree(comm, stab_table_check_shard(shard, whole_vocab, before, &p), who);
  if (st == STAB_OK) {
    stab_shard_reduce ops = {sum_over_ranks, max_over_ranks, &g};
    st = stab_table_metrics_reduced(shard, whole_vocab, before, &p, &ops, out);
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
