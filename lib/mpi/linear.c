/* mpi_linear.c — a linear layer split by rows or columns among MPI ranks (tensor parallelism),
 * measured whole: sigma(W) and sigma(dW) by the sharded Lanczos (mpi_sharded.c), the sums of
 * squares of W, dW, b and db completed over the ranks in fixed point (mpi_collective.c), and the
 * library's own formulas on the whole layer's parts (stab_linear_metrics_assemble), so that
 * every rank gets what one process holding the whole layer gets, the same bits on each. */
#include "mpi/mpi_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* The largest handle id this process has taken part in creating. */
static uint64_t handles_made;

static const char *side(stab_mpi_split split) { return split == STAB_MPI_SPLIT_ROWS ? "rows" : "columns"; }

void stabi_mpi_linear_clear(stab_metrics *m) {
  memset(m, 0, sizeof *m);
  m->forward = m->dependency = m->update = NAN;
  m->forward_tight = m->dependency_tight = m->update_tight = m->spread = NAN;
  m->sigma = m->sigma_rel_err = m->sigma_update = m->sigma_update_rel_err = m->rel_update = NAN;
  m->tight_method = STAB_TIGHT_NONE;
}

static int readable(stab_dtype t) { return t == STAB_DTYPE_F32 || t == STAB_DTYPE_F16 || t == STAB_DTYPE_BF16; }

/* Row i (n elements, stride ld) of a stored F32, F16 or BF16 matrix as f32: the stored row
 * itself for F32, else converted into buf (exactly, as the library's readers convert). */
static const float *row_f32(const void *p, stab_dtype t, size_t ld, size_t i, size_t n, float *buf) {
  if (t == STAB_DTYPE_F32) return (const float *)p + i * ld;
  const uint16_t *q = (const uint16_t *)p + i * ld;
  for (size_t j = 0; j < n; j++) buf[j] = t == STAB_DTYPE_F16 ? stab_f16_to_f32(q[j]) : stab_bf16_to_f32(q[j]);
  return buf;
}

/* sum_i (a_i - b_i)^2 in f64 over rows x cols stored values (b NULL: sum_i a_i^2), each read
 * as f32 then widened, as the single-process sums take them. */
static double sumsq(const stab_mpi_linear *h, const void *a, stab_dtype at, const void *b, stab_dtype bt, size_t ld,
                    size_t rows, size_t cols) {
  double s = 0.0;
  for (size_t i = 0; i < rows; i++) {
    const float *x = row_f32(a, at, ld, i, cols, h->row_a);
    const float *y = b ? row_f32(b, bt, ld, i, cols, h->row_b) : NULL;
    for (size_t j = 0; j < cols; j++) {
      const double v = y ? (double)x[j] - (double)y[j] : (double)x[j];
      s += v * v;
    }
  }
  return s;
}

/* The shard on its own, before anything is allocated from its sizes. */
static stab_status check_shard(const stab_mpi_shard *sh) {
  static const char who[] = "stab_mpi_linear_create";
  if (!sh) return stabi_fail(STAB_EINVAL, "%s: shard is NULL", who);
  if (sh->split != STAB_MPI_SPLIT_ROWS && sh->split != STAB_MPI_SPLIT_COLS)
    return stabi_fail(STAB_EINVAL, "%s: unknown split %d", who, (int)sh->split);
  if (sh->rows == 0 || sh->cols == 0)
    return stabi_fail(STAB_EDIM, "%s: the whole layer is %zu x %zu (d_out x d_in)", who, sh->rows, sh->cols);
  const size_t extent = sh->split == STAB_MPI_SPLIT_ROWS ? sh->rows : sh->cols;
  if (sh->begin >= sh->end || sh->end > extent)
    return stabi_fail(STAB_ERANGE, "%s: %s [%zu, %zu) is empty or outside [0, %zu)", who, side(sh->split),
                      sh->begin, sh->end, extent);
  const size_t n = sh->end - sh->begin, other = sh->split == STAB_MPI_SPLIT_ROWS ? sh->cols : sh->rows;
  if (other > SIZE_MAX / sizeof(float) / n)
    return stabi_fail(STAB_EDIM, "%s: a shard of %zu x %zu is larger than memory can address", who, n, other);
  return STAB_OK;
}

/* The handle's local buffers, for a shard already checked. */
static stab_status alloc_local(stab_mpi_linear *h) {
  const stab_mpi_shard *sh = &h->shard;
  const int by_rows = sh->split == STAB_MPI_SPLIT_ROWS;
  h->srows = by_rows ? sh->end - sh->begin : sh->rows;
  h->scols = by_rows ? sh->cols : sh->end - sh->begin;
  /* split by rows a rank holds its rows' bias entries; by columns the whole (replicated) bias */
  h->bias_len = by_rows ? h->srows : sh->rows;
  h->row_len = h->scols > h->bias_len ? h->scols : h->bias_len;
  h->buf = malloc(h->srows * h->scols * sizeof *h->buf);
  h->row_a = malloc(2 * h->row_len * sizeof *h->row_a);
  if (!h->buf || !h->row_a)
    return stabi_fail(STAB_ENOMEM, "stab_mpi_linear_create: out of memory for a %zu x %zu shard", h->srows,
                      h->scols);
  h->row_b = h->row_a + h->row_len;
  return STAB_OK;
}

stab_status stab_mpi_linear_create(MPI_Comm comm, const stab_mpi_shard *shard, int has_bias,
                                   const stab_metrics_params *params, stab_mpi_linear **out) {
  static const char who[] = "stab_mpi_linear_create";
  if (out) *out = NULL;
  MPI_Comm dup = MPI_COMM_NULL;
  /* collective on the caller's comm: every rank gets here, whatever its arguments */
  if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS) return stabi_fail(STAB_EIO, "%s: MPI_Comm_dup failed", who);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  const stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stab_status st = out ? check_shard(shard) : stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  stab_mpi_linear *h = NULL;
  if (st == STAB_OK && !(h = calloc(1, sizeof *h))) st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  if (st == STAB_OK) {
    h->comm = dup;
    h->shard = *shard;
    h->has_bias = has_bias != 0;
    st = alloc_local(h);
  }
  st = stabi_mpi_agree(dup, st, who);
  if (st == STAB_OK) { /* a bias on some ranks only would make their sums count differently */
    /* in the same exchange, the handle's id: above every id any of the ranks has given out,
     * so that it is the same on every rank of comm and no other handle of a process has it
     * (the batch's check that every rank gives the same handles in the same order) */
    int64_t with[3] = {has_bias != 0, -(has_bias != 0), (int64_t)__atomic_load_n(&handles_made, __ATOMIC_ACQUIRE) + 1};
    if (MPI_Allreduce(MPI_IN_PLACE, with, 3, MPI_INT64_T, MPI_MAX, dup) != MPI_SUCCESS)
      st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' has_bias failed", who);
    else if (with[0] != -with[1])
      st = stabi_fail(STAB_EINVAL, "%s: has_bias is 1 on some ranks and 0 on others", who);
    else {
      h->id = (uint64_t)with[2];
      uint64_t seen = __atomic_load_n(&handles_made, __ATOMIC_ACQUIRE);
      while (seen < h->id &&
             !__atomic_compare_exchange_n(&handles_made, &seen, h->id, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      }
    }
    st = stabi_mpi_agree(dup, st, who);
  }
  /* each create is collective and agrees on its own status */
  if (st == STAB_OK) st = stab_mpi_sharded_create(dup, shard, &p.spectral, &h->w);
  if (st == STAB_OK) st = stab_mpi_sharded_create(dup, shard, &p.spectral, &h->dw);
  if (st == STAB_OK) st = stabi_mpi_agree(dup, stabi_mpi_sum_init(&h->sum, dup, 4), who);
  if (st != STAB_OK) {
    if (h) h->comm = MPI_COMM_NULL; /* freed below, once */
    stab_mpi_linear_free(h);
    MPI_Comm_free(&dup);
    return st;
  }
  *out = h;
  return STAB_OK;
}

/* What one rank can check of its arguments alone. */
stab_status stabi_mpi_linear_check(const stab_mpi_linear *h, const stab_layer *l, const stab_layer *before,
                                   const stab_metrics *out, size_t *ld, const char *who) {
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  if (!l) return stabi_fail(STAB_EINVAL, "%s: shard_layer is NULL", who);
  const char *name = l->name ? l->name : "(unnamed)";
  if (l->kind != STAB_KIND_LINEAR)
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s' is not a linear layer (kind %d)", who, name, (int)l->kind);
  if (l->layout != STAB_LAYOUT_NATURAL && l->layout != STAB_LAYOUT_OUT_MAJOR)
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s': only out-major shards (layout NATURAL or OUT_MAJOR) are "
                      "taken, layout is %d", who, name, (int)l->layout);
  if (l->d_out != h->srows || l->d_in != h->scols)
    return stabi_fail(STAB_EDIM, "%s: layer '%.60s' has d_out %zu and d_in %zu; this rank's shard (%s [%zu, %zu) "
                      "of %zu x %zu) is %zu x %zu", who, name, l->d_out, l->d_in, side(h->shard.split),
                      h->shard.begin, h->shard.end, h->shard.rows, h->shard.cols, h->srows, h->scols);
  if (!l->weight) return stabi_fail(STAB_EINVAL, "%s: layer '%.60s' has no weight (NULL)", who, name);
  if (!readable(l->dtype))
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s' has dtype %d, not F32, F16 or BF16", who, name, (int)l->dtype);
  *ld = l->ld ? l->ld : h->scols;
  if (*ld < h->scols)
    return stabi_fail(STAB_EDIM, "%s: layer '%.60s': ld %zu is less than the shard's row length %zu", who, name,
                      *ld, h->scols);
  if (h->srows > 1 && *ld > (SIZE_MAX / sizeof(float) - h->scols) / (h->srows - 1))
    return stabi_fail(STAB_EDIM, "%s: layer '%.60s': %zu rows of stride %zu span more than memory", who, name,
                      h->srows, *ld);
  if (!l->bias != !h->has_bias)
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s' %s a bias, and the handle was created %s", who, name,
                      l->bias ? "has" : "has no", h->has_bias ? "with one" : "without");
  if (!before) return STAB_OK;
  if (!before->weight) return stabi_fail(STAB_EINVAL, "%s: layer '%.60s': before->weight is NULL", who, name);
  if (!readable(before->dtype))
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s': before has dtype %d, not F32, F16 or BF16", who, name,
                      (int)before->dtype);
  if (l->bias && !before->bias)
    return stabi_fail(STAB_EINVAL, "%s: layer '%.60s' has a bias but before has none", who, name);
  return STAB_OK;
}

/* dW = W - before into the handle's buffer, in f32 as the single-process passes form it, and
 * in the same read of W and before their sums of squares in f64 (sumsq's, the same additions in
 * the same order): q[0] = ||W||^2, q[1] = ||W - before||^2 of this rank's part. */
void stabi_mpi_linear_update(stab_mpi_linear *h, const stab_layer *l, const stab_layer *before, size_t ld,
                             double q[2]) {
  double w2 = 0.0, d2 = 0.0;
  for (size_t i = 0; i < h->srows; i++) {
    const float *a = row_f32(l->weight, l->dtype, ld, i, h->scols, h->row_a);
    const float *b = row_f32(before->weight, before->dtype, ld, i, h->scols, h->row_b);
    float *d = h->buf + i * h->scols;
    for (size_t j = 0; j < h->scols; j++) {
      d[j] = a[j] - b[j];
      const double x = (double)a[j], v = x - (double)b[j];
      w2 += x * x;
      d2 += v * v;
    }
  }
  q[0] = w2;
  q[1] = d2;
}

void stabi_mpi_linear_weights(stab_mpi_linear *h, const stab_layer *l, size_t ld, const float **w, size_t *wld) {
  /* the sharded estimate reads f32: 16-bit weights are converted first, exactly */
  *w = (const float *)l->weight;
  *wld = ld;
  if (l->dtype != STAB_DTYPE_F32) {
    for (size_t i = 0; i < h->srows; i++)
      memcpy(h->buf + i * h->scols, row_f32(l->weight, l->dtype, ld, i, h->scols, h->row_a),
             h->scols * sizeof *h->buf);
    *w = h->buf;
    *wld = h->scols;
  }
}

void stabi_mpi_linear_bias_sums(stab_mpi_linear *h, const stab_layer *l, const stab_layer *before, double q[4]) {
  /* the bias counts once: split by columns every rank holds it whole, and the rank holding
   * column 0 alone adds it to the sums */
  const int my_bias = h->has_bias && (h->shard.split == STAB_MPI_SPLIT_ROWS || h->shard.begin == 0);
  if (!my_bias) return;
  q[2] = sumsq(h, l->bias, l->dtype, NULL, STAB_DTYPE_F32, 0, 1, h->bias_len);
  if (before) q[3] = sumsq(h, l->bias, l->dtype, before->bias, before->dtype, 0, 1, h->bias_len);
}

stab_status stabi_mpi_linear_finish(const stab_mpi_linear *h, stab_linear_parts *parts, const double q[4],
                                    int with_update, stab_metrics *out) {
  const double n = (double)h->shard.rows;
  parts->d_in = h->shard.cols;
  parts->d_out = h->shard.rows;
  parts->with_update = with_update;
  parts->weight_sumsq = q[0];
  parts->update_sumsq = q[1];
  parts->bias_rms = h->has_bias ? sqrt(q[2] / n) : 0.0;
  parts->bias_update_rms = h->has_bias && with_update ? sqrt(q[3] / n) : 0.0;
  return stab_linear_metrics_assemble(parts, out);
}

/* Is before given on every rank or on none? before on some ranks only would make the ranks'
 * collectives differ. */
static stab_status before_alike(MPI_Comm comm, const stab_layer *before, const char *who) {
  int with[2] = {before != NULL, -(before != NULL)};
  stab_status st = STAB_OK;
  if (MPI_Allreduce(MPI_IN_PLACE, with, 2, MPI_INT, MPI_MAX, comm) != MPI_SUCCESS)
    st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' before failed", who);
  else if (with[0] != -with[1])
    st = stabi_fail(STAB_EINVAL, "%s: before is given on some ranks and NULL on others", who);
  return stabi_mpi_agree(comm, st, who);
}

stab_status stab_mpi_linear_measure(stab_mpi_linear *h, const stab_layer *shard_layer, const stab_layer *before,
                                    stab_metrics *out) {
  static const char who[] = "stab_mpi_linear_measure";
  if (out) stabi_mpi_linear_clear(out);
  if (!h) return stabi_fail(STAB_EINVAL, "%s: h is NULL", who); /* no communicator to tell */
  const stab_layer *l = shard_layer;
  size_t ld = 0;
  stab_status st = stabi_mpi_agree(h->comm, stabi_mpi_linear_check(h, l, before, out, &ld, who), who);
  if (st == STAB_OK) st = before_alike(h->comm, before, who);
  if (st != STAB_OK) return st;
  stab_linear_parts parts = {0};
  const float *w = NULL;
  size_t wld = 0;
  stabi_mpi_linear_weights(h, l, ld, &w, &wld);
  st = stab_mpi_sharded_sigma(h->w, w, wld, &parts.weight);
  double q[4] = {0.0, 0.0, 0.0, 0.0}; /* ||W||^2, ||dW||^2, ||b||^2, ||db||^2 of this rank's part */
  if (st == STAB_OK) stabi_mpi_linear_bias_sums(h, l, before, q);
  if (st == STAB_OK && before) {
    stabi_mpi_linear_update(h, l, before, ld, q);
    st = stab_mpi_sharded_sigma(h->dw, h->buf, h->scols, &parts.update);
  }
  if (st == STAB_OK) st = stabi_mpi_agree(h->comm, stabi_mpi_sum_each(&h->sum, q, 4), who);
  if (st != STAB_OK) return st;
  return stabi_mpi_linear_finish(h, &parts, q, before != NULL, out);
}

void stab_mpi_linear_free(stab_mpi_linear *h) {
  if (!h) return;
  stab_mpi_sharded_free(h->dw);
  stab_mpi_sharded_free(h->w);
  stabi_mpi_sum_free(&h->sum);
  free(h->buf);
  free(h->row_a);
  if (h->comm != MPI_COMM_NULL) MPI_Comm_free(&h->comm);
  free(h);
}
