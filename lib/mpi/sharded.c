/* mpi_sharded.c — sigma of a matrix whose rows or columns are split among MPI ranks: the
 * single-process Lanczos (stab_spectral_norm_reduced) on each rank's shard, every pass's
 * products summed over the ranks in a fixed order (mpi_collective.c).
 * Split by rows, W = [W_1; ...; W_P]: W^T W = sum_k W_k^T W_k, vectors of d_in = cols.
 * Split by columns, W = [W_1 ... W_P]: sigma(W) = sigma(W^T), and W W^T = sum_k W_k W_k^T,
 * vectors of d_out = rows; the pass kernels read rows, so each estimate first transposes the
 * shard into the handle's copy (one read of the shard per estimate against the 2-30 passes). */
#include "mpi/mpi_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* What every rank must agree on, exchanged as bytes (every rank runs the same build). */
typedef struct {
  int split, method, max_passes, krylov_dim;
  uint64_t rows, cols, begin, end, seed;
  double tol;
} layout;

static const char *side(stab_mpi_split split) { return split == STAB_MPI_SPLIT_ROWS ? "rows" : "columns"; }

static stab_status check_shard(const stab_mpi_shard *sh, const stab_spectral_params *p) {
  static const char who[] = "stab_mpi_sharded_create";
  if (!sh) return stabi_fail(STAB_EINVAL, "%s: shard is NULL", who);
  if (sh->split != STAB_MPI_SPLIT_ROWS && sh->split != STAB_MPI_SPLIT_COLS)
    return stabi_fail(STAB_EINVAL, "%s: unknown split %d", who, (int)sh->split);
  if (sh->rows == 0 || sh->cols == 0)
    return stabi_fail(STAB_EDIM, "%s: the whole matrix is %zu x %zu", who, sh->rows, sh->cols);
  size_t extent = sh->split == STAB_MPI_SPLIT_ROWS ? sh->rows : sh->cols;
  if (sh->begin >= sh->end || sh->end > extent)
    return stabi_fail(STAB_ERANGE, "%s: %s [%zu, %zu) is empty or outside [0, %zu)", who,
                      side(sh->split), sh->begin, sh->end, extent);
  if (p && p->method != STAB_SPECTRAL_LANCZOS)
    return stabi_fail(STAB_EINVAL, "%s: params.method must be Lanczos", who);
  return STAB_OK;
}

/* Builds the handle for a shard already checked on its own. */
static stab_status alloc_handle(stab_mpi_sharded *s, const stab_spectral_params *p) {
  const stab_mpi_shard *sh = &s->shard;
  const int by_rows = sh->split == STAB_MPI_SPLIT_ROWS;
  s->local_rows = sh->end - sh->begin; /* by columns: the rows of the transposed shard */
  s->n = by_rows ? sh->cols : sh->rows;
  s->whole_rows = by_rows ? sh->rows : sh->cols;
  stab_status st = stab_spectral_workspace_create(s->local_rows, s->n, p, &s->ws);
  if (st != STAB_OK) return st;
  if (s->n > SIZE_MAX / 4)
    return stabi_fail(STAB_EDIM, "stab_mpi_sharded_create: %zu-vectors are too long", s->n);
  st = stabi_mpi_sum_init(&s->sum, s->comm, 4 * s->n); /* a Lanczos block is 4 vectors at most */
  if (st != STAB_OK) return st;
  s->v = calloc(s->n, sizeof *s->v);
  if (sh->split == STAB_MPI_SPLIT_COLS) s->transposed = malloc(s->local_rows * s->n * sizeof(float));
  if (!s->v || (sh->split == STAB_MPI_SPLIT_COLS && !s->transposed))
    return stabi_fail(STAB_ENOMEM, "stab_mpi_sharded_create: out of memory for a %zu x %zu shard",
                      s->local_rows, s->n);
  return STAB_OK;
}

/* t (cols x rows, row stride ldt) = w (rows x cols, row stride ld) transposed, by tiles of
 * TILE x TILE that stay in L1: element by element, every write of a row of w would land on
 * another cache line of t (a 768 x 3072 shard took 17 ms, 40 times its warm estimate's pass). */
__attribute__((noinline)) /* inlined, its counters spilled to the stack: 3.5x slower */
static void transpose(const float *restrict w, size_t rows, size_t cols, size_t ld, float *restrict t, size_t ldt) {
  enum { TILE = 32 };
  for (size_t i0 = 0; i0 < rows; i0 += TILE) {
    const size_t i1 = rows - i0 < TILE ? rows : i0 + TILE;
    for (size_t j0 = 0; j0 < cols; j0 += TILE) {
      const size_t j1 = cols - j0 < TILE ? cols : j0 + TILE;
      for (size_t j = j0; j < j1; j++)
        for (size_t i = i0; i < i1; i++) t[j * ldt + i] = w[i * ld + j];
    }
  }
}

static int by_begin(const void *a, const void *b) {
  const layout *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Every rank's layout against rank 0's, and the shards against the whole: each rank runs this
 * on the same gathered bytes, so each reaches the same verdict. sorted: scratch, ranks long. */
static stab_status check_layouts(const layout *all, layout *sorted, int ranks) {
  static const char who[] = "stab_mpi_sharded_create";
  const layout *z = &all[0];
  for (int r = 1; r < ranks; r++) {
    const layout *o = &all[r];
    if (o->split != z->split || o->rows != z->rows || o->cols != z->cols)
      return stabi_fail(STAB_EINVAL, "%s: rank %d registers a %llu x %llu matrix split by %s, rank 0 a "
                        "%llu x %llu split by %s", who, r, (unsigned long long)o->rows,
                        (unsigned long long)o->cols, side(o->split), (unsigned long long)z->rows,
                        (unsigned long long)z->cols, side(z->split));
    if (o->method != z->method || o->max_passes != z->max_passes || o->krylov_dim != z->krylov_dim ||
        o->seed != z->seed || o->tol != z->tol)
      return stabi_fail(STAB_EINVAL, "%s: rank %d's spectral params (threads aside) differ from rank 0's",
                        who, r);
  }
  memcpy(sorted, all, (size_t)ranks * sizeof *sorted);
  qsort(sorted, (size_t)ranks, sizeof *sorted, by_begin);
  const uint64_t extent = z->split == STAB_MPI_SPLIT_ROWS ? z->rows : z->cols;
  uint64_t next = 0;
  for (int i = 0; i < ranks; i++) {
    if (sorted[i].begin != next)
      return stabi_fail(STAB_ERANGE, "%s: the shards' %s %s at %llu (a shard begins at %llu)", who,
                        side(z->split), sorted[i].begin < next ? "overlap" : "leave a gap",
                        (unsigned long long)(sorted[i].begin < next ? sorted[i].begin : next),
                        (unsigned long long)sorted[i].begin);
    next = sorted[i].end;
  }
  if (next != extent)
    return stabi_fail(STAB_ERANGE, "%s: the shards cover %s [0, %llu) of [0, %llu)", who, side(z->split),
                      (unsigned long long)next, (unsigned long long)extent);
  return STAB_OK;
}

stab_status stab_mpi_sharded_create(MPI_Comm comm, const stab_mpi_shard *shard,
                                    const stab_spectral_params *params, stab_mpi_sharded **out) {
  static const char who[] = "stab_mpi_sharded_create";
  if (out) *out = NULL;
  MPI_Comm dup = MPI_COMM_NULL;
  /* collective on the caller's comm: every rank gets here, whatever its arguments */
  if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_dup failed", who);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  stab_spectral_params p = params ? *params : stab_spectral_default_params();
  stab_status st = out ? check_shard(shard, &p) : stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  stab_mpi_sharded *s = NULL;
  if (st == STAB_OK && !(s = calloc(1, sizeof *s))) st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  if (st == STAB_OK) {
    s->comm = dup;
    s->shard = *shard;
    st = alloc_handle(s, &p);
  }
  st = stabi_mpi_agree(dup, st, who);
  int ranks = 0;
  layout *all = NULL;
  if (st == STAB_OK && MPI_Comm_size(dup, &ranks) != MPI_SUCCESS)
    st = stabi_fail(STAB_EIO, "%s: MPI_Comm_size failed", who);
  if (st == STAB_OK) {
    all = calloc(2 * (size_t)ranks, sizeof *all);
    st = stabi_mpi_agree(dup, all ? STAB_OK : stabi_fail(STAB_ENOMEM, "%s: out of memory", who), who);
  }
  if (st == STAB_OK) {
    const layout me = {(int)shard->split, (int)p.method, p.max_passes, p.krylov_dim, shard->rows,
                       shard->cols, shard->begin, shard->end, p.seed, p.tol};
    if (MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, dup) != MPI_SUCCESS)
      st = stabi_fail(STAB_EIO, "%s: MPI_Allgather of the shards' layout failed", who);
    st = stabi_mpi_agree(dup, st, who);
    /* the same bytes on every rank: the same verdict, with no rank to blame but the one named */
    if (st == STAB_OK) st = check_layouts(all, all + ranks, ranks);
  }
  free(all);
  if (st != STAB_OK) {
    if (s) s->comm = MPI_COMM_NULL; /* freed below, once */
    stab_mpi_sharded_free(s);
    MPI_Comm_free(&dup);
    return st;
  }
  *out = s;
  return STAB_OK;
}

stab_status stabi_mpi_sharded_check(const stab_mpi_sharded *s, const float *w, size_t *ld,
                                    const stab_sigma_result *out, const char *who) {
  const stab_mpi_shard *sh = &s->shard;
  /* the shard as stored: rows (end - begin) x cols split by rows, rows x (end - begin) by columns */
  const size_t srows = sh->split == STAB_MPI_SPLIT_ROWS ? s->local_rows : sh->rows;
  const size_t scols = sh->split == STAB_MPI_SPLIT_ROWS ? sh->cols : s->local_rows;
  if (*ld == 0) *ld = scols;
  if (!w || !out) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !w ? "w" : "out");
  if (*ld < scols)
    return stabi_fail(STAB_EDIM, "%s: ld %zu is less than the shard's row length %zu", who, *ld, scols);
  if (srows > 1 && *ld > (SIZE_MAX / sizeof(float) - scols) / (srows - 1))
    return stabi_fail(STAB_EDIM, "%s: a %zu x %zu shard of stride %zu spans more than memory", who, srows,
                      scols, *ld);
  return STAB_OK;
}

void stabi_mpi_sharded_source(stab_mpi_sharded *s, const float *w, size_t ld, const float **a, size_t *lda) {
  *a = w;
  *lda = ld;
  if (s->shard.split == STAB_MPI_SPLIT_COLS) {
    transpose(w, s->shard.rows, s->local_rows, ld, s->transposed, s->n);
    *a = s->transposed;
    *lda = s->n;
  }
}

stab_status stabi_mpi_sharded_run(stab_mpi_sharded *s, const float *a, size_t lda, stab_spectral_reduce_fn fn,
                                  void *ctx, stab_sigma_result *out) {
  return stab_spectral_norm_reduced(s->ws, a, s->local_rows, s->n, lda, s->whole_rows, fn, ctx, s->v, out);
}

stab_status stab_mpi_sharded_sigma(stab_mpi_sharded *s, const float *w, size_t ld,
                                   stab_sigma_result *out) {
  static const char who[] = "stab_mpi_sharded_sigma";
  if (!s) return stabi_fail(STAB_EINVAL, "%s: s is NULL", who); /* no communicator to tell */
  if (out) {
    memset(out, 0, sizeof *out);
    out->sigma = out->rel_err = NAN;
  }
  stab_status st = stabi_mpi_agree(s->comm, stabi_mpi_sharded_check(s, w, &ld, out, who), who);
  if (st != STAB_OK) return st;
  const float *a = NULL;
  size_t lda = 0;
  stabi_mpi_sharded_source(s, w, ld, &a, &lda);
  st = stabi_mpi_sharded_run(s, a, lda, stabi_mpi_sum_reduce, &s->sum, out);
  /* every rank took the same decisions; this guards against an MPI failure seen by some ranks */
  st = stabi_mpi_agree(s->comm, st, who);
  if (st != STAB_OK) {
    out->sigma = out->rel_err = NAN;
    out->converged = 0;
  }
  return st;
}

void stab_mpi_sharded_free(stab_mpi_sharded *s) {
  if (!s) return;
  stab_spectral_workspace_free(s->ws);
  stabi_mpi_sum_free(&s->sum);
  free(s->v);
  free(s->transposed);
  if (s->comm != MPI_COMM_NULL) MPI_Comm_free(&s->comm);
  free(s);
}
