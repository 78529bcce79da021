/* layer_metrics.c — the three metrics of one layer of each kind (docs/manual/metrics.md, per kind),
 * from its weights and optionally its update. Shared by stab_layer_metrics (one call, its own
 * workspace) and the monitor (borrowed workspace, warm-start vectors kept between steps). */
#include "metrics/metrics.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

stab_metrics_params stab_metrics_default_params(void) {
  stab_metrics_params p;
  p.spectral = stab_spectral_default_params();
  p.tight = STAB_TIGHT_CENTRED;
  return p;
}

size_t stabi_layer_work(const stabi_shape *sh, stab_tight_method tight) {
  /* a table's items are its rows or its columns: take the larger need */
  const int exact = tight == STAB_TIGHT_EXACT;
  size_t a = stabi_set_work(sh->rows, sh->cols, exact), b = stabi_set_work(sh->cols, sh->rows, exact);
  return a > b ? a : b;
}

size_t stabi_layer_rowbuf(const stabi_shape *sh) {
  /* a stored row (cols), or a whole bias or gain vector (d_out: a linear's bias is longer
   * than its out-major rows when d_out > d_in) */
  return sh->cols > sh->d_out ? sh->cols : sh->d_out;
}

size_t stabi_warm_len(const stab_layer *l, const stabi_shape *sh) {
  if (l->kind == STAB_KIND_LINEAR) return 2 * sh->cols;
  if (l->kind == STAB_KIND_ATTENTION) return 2 * sh->heads * sh->block_cols;
  return 0;
}

/* The set of class or token vectors of a table (items = V, coords = d), stored as at and bt. */
static stabi_set table_set(const stabi_ctx *ctx, const stabi_shape *sh, const float *a, stab_dtype at,
                           const float *b, stab_dtype bt) {
  stabi_set s;
  s.a = a;
  s.b = b;
  s.at = at;
  s.bt = bt;
  s.ra = ctx->rowbuf;
  s.rb = ctx->rowbuf ? ctx->rowbuf + stabi_layer_rowbuf(sh) : NULL;
  s.ld = sh->ld;
  s.items_are_rows = sh->items_are_rows;
  s.items = sh->items_are_rows ? sh->rows : sh->cols;
  s.coords = sh->items_are_rows ? sh->cols : sh->rows;
  s.shards = ctx->shards;
  return s;
}

void stabi_layer_measure_clear(stab_metrics *m) {
  m->forward = m->dependency = m->update = NAN;
  m->forward_tight = m->dependency_tight = m->update_tight = m->spread = NAN;
  m->sigma = m->sigma_rel_err = m->sigma_update = m->sigma_update_rel_err = NAN;
  m->rel_update = NAN;
  m->passes = m->update_passes = 0;
  m->tight_method = STAB_TIGHT_NONE;
  m->flags = 0;
}

/* The diameter of a set by the chosen method (NaN for NONE), and into *max_rms the set's
 * max_i ||r_i||_RMS: from the centred bound's own sweep when it runs (a table as large as
 * GPT-2's wte is then read twice, not three times), else by stabi_set_max_rms. */
static double diameter(const stabi_ctx *ctx, const stabi_set *s, double *max_rms) {
  if (ctx->tight == STAB_TIGHT_CENTRED) {
    double maxsq = NAN;
    double dm = stabi_set_diameter_centred(s, ctx->work, &maxsq);
    *max_rms = sqrt(maxsq / (double)s->coords);
    return dm;
  }
  *max_rms = stabi_set_max_rms(s, ctx->work);
  return ctx->tight == STAB_TIGHT_EXACT ? stabi_set_diameter_exact(s, ctx->work) : NAN;
}

/* The two row buffers of ctx (A's, B's): rows of 16-bit operands are converted there. */
static float *rowbuf_a(const stabi_ctx *ctx) { return ctx->rowbuf; }
static float *rowbuf_b(const stabi_ctx *ctx, const stabi_shape *sh) {
  return ctx->rowbuf ? ctx->rowbuf + stabi_layer_rowbuf(sh) : NULL;
}

/* ||a - b||_RMS of n stored numbers (b NULL: ||a||_RMS), through the row buffers if 16-bit. */
static double rms_diff(const stabi_ctx *ctx, const stabi_shape *sh, const float *a, stab_dtype at,
                       const float *b, stab_dtype bt, size_t n) {
  const float *fa = stabi_row_f32(a, at, 0, 0, n, rowbuf_a(ctx));
  const float *fb = b ? stabi_row_f32(b, bt, 0, 0, n, rowbuf_b(ctx, sh)) : NULL;
  return stab_rms_diff(fa, fb, n);
}

/* sum of squares of a stored matrix of the layer's shape, or of A - B */
static double sumsq(const stabi_ctx *ctx, const stabi_shape *sh, const float *a, stab_dtype at,
                    const float *b, stab_dtype bt) {
  const stabi_src src = {a, b, at, bt, sh->ld};
  return stabi_sumsq(&src, sh->rows, sh->cols, rowbuf_a(ctx), rowbuf_b(ctx, sh));
}

stab_status stab_linear_metrics_assemble(const stab_linear_parts *parts, stab_metrics *out) {
  if (!out) return stabi_fail(STAB_EINVAL, "stab_linear_metrics_assemble: out is NULL");
  stabi_layer_measure_clear(out);
  if (!parts) return stabi_fail(STAB_EINVAL, "stab_linear_metrics_assemble: parts is NULL");
  if (parts->d_in == 0 || parts->d_out == 0)
    return stabi_fail(STAB_EDIM, "stab_linear_metrics_assemble: d_in %zu and d_out %zu; both must be > 0",
                      parts->d_in, parts->d_out);
  stab_metrics *m = out;
  const double k = sqrt((double)parts->d_in / (double)parts->d_out);
  const stab_sigma_result *r = &parts->weight;
  const double brms = parts->bias_rms;
  m->sigma = r->sigma;
  m->sigma_rel_err = r->rel_err;
  m->passes = r->passes;
  m->dependency = k * r->sigma;
  m->forward = k * r->sigma + brms;
  if (!r->converged && !r->nonfinite) m->flags |= STAB_FLAG_NOT_CONVERGED;
  if (r->nonfinite || !isfinite(brms)) {
    m->flags |= STAB_FLAG_NONFINITE_WEIGHT;
    m->forward = m->dependency = m->sigma = NAN;
  }
  if (!parts->with_update) return STAB_OK;
  r = &parts->update;
  const double dbrms = parts->bias_update_rms;
  m->sigma_update = r->sigma;
  m->sigma_update_rel_err = r->rel_err;
  m->update_passes = r->passes;
  m->update = k * r->sigma + dbrms;
  if (!r->converged && !r->nonfinite) m->flags |= STAB_FLAG_NOT_CONVERGED;
  /* without a bias both RMS are 0 and the sums stay as they are, bit for bit */
  const double dw2 = parts->update_sumsq + dbrms * dbrms * (double)parts->d_out;
  const double w2 = parts->weight_sumsq + brms * brms * (double)parts->d_out;
  m->rel_update = sqrt(dw2) / sqrt(w2);
  if (r->nonfinite || !isfinite(dbrms) || !isfinite(dw2)) {
    m->flags |= STAB_FLAG_NONFINITE_UPDATE;
    m->update = m->sigma_update = m->rel_update = NAN;
  }
  return STAB_OK;
}

/* A whole linear layer in this process: its parts measured here, the metrics from them. A
 * failure of the update's estimate leaves the weights' metrics filled. */
static stab_status linear(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                          const stabi_delta *dl, double *warm, stab_metrics *m) {
  stab_linear_parts parts = {.d_in = l->d_in, .d_out = l->d_out};
  const stabi_src w = {l->weight, NULL, l->dtype, STAB_DTYPE_F32, sh->ld};
  stab_status st = stabi_spectral_norm_src(ctx->ws, &w, sh->rows, sh->cols, warm, &parts.weight);
  if (st != STAB_OK) return st;
  parts.bias_rms = l->bias ? rms_diff(ctx, sh, l->bias, l->dtype, NULL, STAB_DTYPE_F32, l->d_out) : 0.0;
  if (dl) {
    const stabi_src dw = {dl->w, dl->w_sub, dl->wt, dl->sub_t, sh->ld};
    st = stabi_spectral_norm_src(ctx->ws, &dw, sh->rows, sh->cols, warm ? warm + sh->cols : NULL, &parts.update);
    if (st != STAB_OK) {
      stab_linear_metrics_assemble(&parts, m);
      return st;
    }
    parts.with_update = 1;
    parts.bias_update_rms = dl->b ? rms_diff(ctx, sh, dl->b, dl->wt, dl->b_sub, dl->sub_t, l->d_out) : 0.0;
    parts.update_sumsq = sumsq(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t);
    parts.weight_sumsq = sumsq(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32);
  }
  return stab_linear_metrics_assemble(&parts, m);
}

/* rel_update of a whole stored matrix (tables, vectors). */
static double rel_update(const stabi_ctx *ctx, const stabi_shape *sh, const stab_layer *l,
                         const stabi_delta *dl) {
  return sqrt(sumsq(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t)) /
         sqrt(sumsq(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32));
}

static void table(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                         const stabi_delta *dl, stab_metrics *m) {
  const int head = l->kind == STAB_KIND_LM_HEAD;
  stabi_set s = table_set(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32);
  const double d = (double)s.coords, logv = log((double)(s.shards ? s.shards->whole_items : s.items));
  double r;
  const double dm = diameter(ctx, &s, &r);
  m->tight_method = ctx->tight;
  if (head) {
    m->forward = logv + 2.0 * d * r;
    m->dependency = 2.0 * d * r;
    m->spread = 4.0 * d * r;
    m->forward_tight = logv + d * dm;
    m->dependency_tight = d * dm;
  } else {
    m->forward = r;
    m->spread = dm;
  }
  if (!isfinite(r)) {
    m->flags |= STAB_FLAG_NONFINITE_WEIGHT;
    m->forward = m->dependency = m->spread = m->forward_tight = m->dependency_tight = NAN;
  }
  if (!dl) return;
  stabi_set u = table_set(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t);
  double dr;
  if (head) {
    m->update_tight = d * diameter(ctx, &u, &dr);
  } else {
    dr = stabi_set_max_rms(&u, ctx->work);
  }
  m->update = head ? 2.0 * d * dr : dr;
  if (ctx->shards) { /* the whole table's sums of squares, as rel_update takes them */
    double q[2] = {sumsq(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t),
                   sumsq(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32)};
    stabi_items_complete(ctx->shards, 0, q, 2);
    m->rel_update = sqrt(q[0]) / sqrt(q[1]);
  } else {
    m->rel_update = rel_update(ctx, sh, l, dl);
  }
  if (!isfinite(dr)) {
    m->flags |= STAB_FLAG_NONFINITE_UPDATE;
    m->update = m->update_tight = m->rel_update = NAN;
  }
}

/* A gain or a bias split among shards (stab_vector_metrics_reduced): the same metrics from
 * the shards' maxima (a gain's max |g| and max |dg|) and sums of squares (a bias's RMS, and
 * rel_update's norms), in the same two reduce calls on every shard whatever its values. */
static void vector_shard(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                         const stabi_delta *dl, stab_metrics *m) {
  const size_t n = l->d_out;
  const double whole = (double)ctx->shards->whole_items;
  float *ra = rowbuf_a(ctx), *rb = rowbuf_b(ctx, sh);
  double big[2] = {NAN, NAN}, sq[2] = {sumsq(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32), 0.0};
  if (l->kind == STAB_KIND_GAIN) {
    big[0] = stab_max_abs_diff(stabi_row_f32(l->weight, l->dtype, 0, 0, n, ra), NULL, n);
    if (dl)
      big[1] = stab_max_abs_diff(stabi_row_f32(dl->w, dl->wt, 0, 0, n, ra),
                                 dl->w_sub ? stabi_row_f32(dl->w_sub, dl->sub_t, 0, 0, n, rb) : NULL, n);
    stabi_items_complete(ctx->shards, 1, big, dl ? 2 : 1);
  }
  if (dl) sq[1] = sumsq(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t);
  stabi_items_complete(ctx->shards, 0, sq, dl ? 2 : 1);
  m->forward = l->kind == STAB_KIND_GAIN ? big[0] : sqrt(sq[0] / whole);
  if (l->kind == STAB_KIND_GAIN) m->dependency = m->forward;
  if (dl) {
    m->update = l->kind == STAB_KIND_GAIN ? big[1] : sqrt(sq[1] / whole);
    m->rel_update = sqrt(sq[1]) / sqrt(sq[0]);
  }
}

static void vector(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                   const stabi_delta *dl, stab_metrics *m) {
  const size_t n = l->d_out;
  float *ra = rowbuf_a(ctx), *rb = rowbuf_b(ctx, sh);
  if (ctx->shards) {
    vector_shard(ctx, l, sh, dl, m);
  } else if (l->kind == STAB_KIND_GAIN) {
    m->forward = m->dependency = stab_max_abs_diff(stabi_row_f32(l->weight, l->dtype, 0, 0, n, ra), NULL, n);
    if (dl)
      m->update = stab_max_abs_diff(stabi_row_f32(dl->w, dl->wt, 0, 0, n, ra),
                                    dl->w_sub ? stabi_row_f32(dl->w_sub, dl->sub_t, 0, 0, n, rb) : NULL, n);
  } else {
    m->forward = rms_diff(ctx, sh, l->weight, l->dtype, NULL, STAB_DTYPE_F32, n);
    if (dl) m->update = rms_diff(ctx, sh, dl->w, dl->wt, dl->w_sub, dl->sub_t, n);
  }
  if (!isfinite(m->forward)) {
    m->flags |= STAB_FLAG_NONFINITE_WEIGHT;
    m->forward = m->dependency = NAN;
  }
  if (!dl) return;
  if (!ctx->shards) m->rel_update = rel_update(ctx, sh, l, dl);
  if (!isfinite(m->update)) {
    m->flags |= STAB_FLAG_NONFINITE_UPDATE;
    m->update = m->rel_update = NAN;
  }
}

static stab_status attention(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                             double *warm, stab_metrics *m, double *heads_out) {
  const double dh = (double)sh->dh, d = (double)l->d_in;
  const double s = l->scale > 0.0 ? l->scale : 1.0 / sqrt(dh);
  const double f = sqrt(d / dh);
  const size_t bc = sh->block_cols;
  double worst = 0.0;
  int bad = 0;
  const size_t group = sh->heads / sh->kv_heads;
  stab_sigma_result rk = {0};
  for (size_t h = 0; h < sh->heads; h++) {
    stab_sigma_result rq;
    /* query head h reads key head h / group: grouped-query attention shares a key head, which
     * is measured once, with the first query head of its group (TinyLlama: 4 key heads for 32
     * query heads, 28 of every 32 key estimates were repeats) */
    const size_t off = h * sh->block_step, k_off = h / group * sh->block_step;
    const stabi_src q = {stabi_elem_ptr(l->weight, l->dtype, off), NULL, l->dtype, STAB_DTYPE_F32, sh->ld};
    const stabi_src k = {stabi_elem_ptr(l->weight_k, l->dtype, k_off), NULL, l->dtype, STAB_DTYPE_F32, sh->ld};
    stab_status st = stabi_spectral_norm_src(ctx->ws, &q, sh->block_rows, bc, warm ? warm + 2 * h * bc : NULL, &rq);
    const int new_key = h % group == 0;
    if (st == STAB_OK && new_key)
      st = stabi_spectral_norm_src(ctx->ws, &k, sh->block_rows, bc, warm ? warm + (2 * h + 1) * bc : NULL, &rk);
    if (st != STAB_OK) return st;
    const int both = rq.passes + (new_key ? rk.passes : 0); /* each at most STAB_SPECTRAL_MAX_PASSES */
    m->passes = m->passes > INT_MAX - both ? INT_MAX : m->passes + both; /* many heads: saturate */
    if (!(rq.converged && rk.converged) && !(rq.nonfinite || rk.nonfinite))
      m->flags |= STAB_FLAG_NOT_CONVERGED;
    double bound = s * dh * (f * rq.sigma) * (f * rk.sigma);
    if (rq.nonfinite || rk.nonfinite) bad = 1;
    if (heads_out) heads_out[h] = bound;
    worst = stabi_nanmax(worst, bound);
  }
  m->forward = bad ? NAN : worst;
  if (bad) m->flags |= STAB_FLAG_NONFINITE_WEIGHT;
  return STAB_OK;
}

stab_status stabi_layer_measure(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                                const stabi_delta *dl, double *warm, stab_metrics *m,
                                double *heads_out) {
  stabi_layer_measure_clear(m);
  stab_status st = STAB_OK;
  switch (l->kind) {
  case STAB_KIND_LINEAR: st = linear(ctx, l, sh, dl, warm, m); break;
  case STAB_KIND_EMBEDDING:
  case STAB_KIND_LM_HEAD: table(ctx, l, sh, dl, m); break;
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS: vector(ctx, l, sh, dl, m); break;
  case STAB_KIND_ATTENTION: st = attention(ctx, l, sh, warm, m, heads_out); break;
  }
  /* the input guard: weights in a mapped checkpoint that shrank under this read read as zeros */
  if (st == STAB_OK && stabi_guard_trips()) {
    char who[160];
    snprintf(who, sizeof who, "layer '%s'", stabi_layer_name(l));
    st = stabi_guard_check(l->weight, 1, who);
    if (st == STAB_OK) st = stabi_guard_check(l->weight_k, 1, who);
    if (st == STAB_OK) st = stabi_guard_check(l->bias, 1, who);
    if (st != STAB_OK) return st;
  }
  if (st == STAB_OK && (m->flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE)))
    stabi_warn("layer '%s' (%s): %s hold NaN or Inf; its metrics are NaN", stabi_layer_name(l),
               stab_kind_name(l->kind),
               (m->flags & STAB_FLAG_NONFINITE_WEIGHT) ? "the weights" : "the update");
  return st;
}

/* Checks that the `before` weights cover what the layer has, in a dtype read natively. */
static stab_status check_before(const stab_layer *l, const stab_layer *before) {
  if (!before->weight)
    return stabi_fail(STAB_EINVAL, "stab_layer_metrics: layer '%s': before->weight is NULL",
                      stabi_layer_name(l));
  if (!stabi_dtype_size(before->dtype))
    return stabi_fail(STAB_EINVAL,
                      "stab_layer_metrics: layer '%s': before has dtype %s%s%d, not F32, F16 or BF16",
                      stabi_layer_name(l), stabi_dtype_name(before->dtype) ? stabi_dtype_name(before->dtype) : "",
                      stabi_dtype_name(before->dtype) ? " " : "unknown ", (int)before->dtype);
  if (l->bias && !before->bias)
    return stabi_fail(STAB_EINVAL, "stab_layer_metrics: layer '%s' has a bias but before has none",
                      stabi_layer_name(l));
  return STAB_OK;
}

/* The update W - before of a layer (its bias too), read in each one's dtype. */
static stabi_delta delta_of(const stab_layer *l, const stab_layer *before) {
  stabi_delta dl = {0};
  dl.w = l->weight;
  dl.w_sub = before->weight;
  dl.b = l->bias;
  dl.b_sub = before->bias;
  dl.wt = l->dtype;
  dl.sub_t = before->dtype;
  return dl;
}

/* The scratch a measurement needs in ctx: the work vector, and for 16-bit operands a row of
 * each as f32 (the passes have their own tiles). On failure nothing is left allocated. */
static stab_status alloc_scratch(stabi_ctx *ctx, const stabi_shape *sh, const stab_layer *l,
                                 const stab_layer *before, stab_tight_method tight, const char *who) {
  const size_t work_len = stabi_layer_work(sh, tight);
  ctx->work = work_len <= (size_t)-1 / sizeof(double) ? malloc(work_len * sizeof(double)) : NULL;
  const int native = l->dtype == STAB_DTYPE_F32 && (!before || before->dtype == STAB_DTYPE_F32);
  if (!native) ctx->rowbuf = malloc(2 * stabi_layer_rowbuf(sh) * sizeof(float));
  if (ctx->work && (native || ctx->rowbuf)) return STAB_OK;
  free(ctx->work);
  free(ctx->rowbuf);
  ctx->work = NULL;
  ctx->rowbuf = NULL;
  return stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
}

stab_status stab_layer_metrics(const stab_layer *layer, const stab_layer *before,
                               const stab_metrics_params *params, stab_metrics *out,
                               double *heads_out) {
  if (!out) return stabi_fail(STAB_EINVAL, "stab_layer_metrics: out is NULL");
  stabi_layer_measure_clear(out);
  stab_metrics_params p = params ? *params : stab_metrics_default_params();
  if (p.tight != STAB_TIGHT_CENTRED && p.tight != STAB_TIGHT_EXACT && p.tight != STAB_TIGHT_NONE)
    return stabi_fail(STAB_EINVAL, "stab_layer_metrics: unknown tight method %d", (int)p.tight);
  stabi_shape sh;
  stab_status st = stabi_layer_shape(layer, "stab_layer_metrics", &sh);
  if (st == STAB_OK) st = stabi_spectral_check(&p.spectral, "stab_layer_metrics");
  if (st != STAB_OK) return st;
  if (before && (st = check_before(layer, before)) != STAB_OK) return st;
  const stabi_delta dl = before ? delta_of(layer, before) : (stabi_delta){0};
  stabi_ctx ctx = {NULL, NULL, p.tight, NULL, NULL};
  size_t wr = layer->kind == STAB_KIND_ATTENTION ? sh.block_rows : sh.rows;
  size_t wc = layer->kind == STAB_KIND_ATTENTION ? sh.block_cols : sh.cols;
  if (layer->kind == STAB_KIND_LINEAR || layer->kind == STAB_KIND_ATTENTION)
    st = stab_spectral_workspace_create(wr, wc, &p.spectral, &ctx.ws);
  if (st != STAB_OK) return st;
  if ((st = alloc_scratch(&ctx, &sh, layer, before, p.tight, "stab_layer_metrics")) != STAB_OK) {
    stab_spectral_workspace_free(ctx.ws);
    return st;
  }
  st = stabi_layer_measure(&ctx, layer, &sh, before ? &dl : NULL, NULL, out, heads_out);
  free(ctx.rowbuf);
  free(ctx.work);
  stab_spectral_workspace_free(ctx.ws);
  return st;
}

/* What stab_table_metrics_reduced and stab_vector_metrics_reduced check before their first
 * reduce: the shard's kind (table is 1 for tables, 0 for gains and biases), its shape, that it
 * is no larger than the whole, and before. */
static stab_status check_shard(const char *who, int table, const stab_layer *shard, size_t whole,
                               const stab_layer *before, const stab_metrics_params *p, stabi_shape *sh) {
  if (!shard) return stabi_fail(STAB_EINVAL, "%s: shard is NULL", who);
  const int is_table = shard->kind == STAB_KIND_EMBEDDING || shard->kind == STAB_KIND_LM_HEAD;
  const int is_vector = shard->kind == STAB_KIND_GAIN || shard->kind == STAB_KIND_BIAS;
  if (table ? !is_table : !is_vector)
    return stabi_fail(STAB_EINVAL, "%s: layer '%s' is a %s, not a %s", who, stabi_layer_name(shard),
                      stab_kind_name(shard->kind), table ? "table" : "gain or bias");
  if (table && p->tight != STAB_TIGHT_CENTRED && p->tight != STAB_TIGHT_NONE)
    return stabi_fail(STAB_EINVAL, "%s: layer '%s': the tight method must be centred or none (all pairs "
                      "across shards are not computed)", who, stabi_layer_name(shard));
  stab_status st = stabi_layer_shape(shard, who, sh);
  if (st != STAB_OK) return st;
  const size_t mine = table ? shard->vocab : shard->d_out;
  if (whole < mine)
    return stabi_fail(STAB_EDIM, "%s: layer '%s': the whole %s %zu is less than the shard's %zu", who,
                      stabi_layer_name(shard), table ? "vocabulary" : "length", whole, mine);
  return before ? check_before(shard, before) : STAB_OK;
}

stab_status stab_table_check_shard(const stab_layer *shard, size_t whole_vocab, const stab_layer *before,
                                   const stab_metrics_params *params) {
  const stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stabi_shape sh;
  return check_shard("stab_table_metrics_reduced", 1, shard, whole_vocab, before, &p, &sh);
}

stab_status stab_vector_check_shard(const stab_layer *shard, size_t whole_length, const stab_layer *before,
                                    const stab_metrics_params *params) {
  const stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stabi_shape sh;
  return check_shard("stab_vector_metrics_reduced", 0, shard, whole_length, before, &p, &sh);
}

/* A layer split along its items (a table's tokens or classes, a vector's entries):
 * stab_layer_metrics' path on this shard, every sum and maximum completed over the shards by
 * the caller's reduce (stabi_ctx.shards). */
static stab_status metrics_reduced(const char *who, int table, const stab_layer *shard, size_t whole,
                                   const stab_layer *before, const stab_metrics_params *params,
                                   const stab_shard_reduce *reduce, stab_metrics *out) {
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  stabi_layer_measure_clear(out);
  if (!reduce || !reduce->sum || !reduce->max)
    return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !reduce ? "reduce" : "a reduce function");
  stab_metrics_params p = params ? *params : stab_metrics_default_params();
  stabi_shape sh;
  stab_status st = check_shard(who, table, shard, whole, before, &p, &sh);
  if (st != STAB_OK) return st;
  const stabi_delta dl = before ? delta_of(shard, before) : (stabi_delta){0};
  stabi_items_reduce r = {*reduce, whole, STAB_OK};
  stabi_ctx ctx = {NULL, NULL, p.tight, NULL, &r};
  if ((st = alloc_scratch(&ctx, &sh, shard, before, p.tight, who)) != STAB_OK) return st;
  st = stabi_layer_measure(&ctx, shard, &sh, before ? &dl : NULL, NULL, out, NULL);
  free(ctx.rowbuf);
  free(ctx.work);
  if (st == STAB_OK && r.status != STAB_OK) {
    stabi_layer_measure_clear(out);
    st = r.status;
  }
  return st;
}

stab_status stab_table_metrics_reduced(const stab_layer *shard, size_t whole_vocab, const stab_layer *before,
                                       const stab_metrics_params *params, const stab_shard_reduce *reduce,
                                       stab_metrics *out) {
  return metrics_reduced("stab_table_metrics_reduced", 1, shard, whole_vocab, before, params, reduce, out);
}

stab_status stab_vector_metrics_reduced(const stab_layer *shard, size_t whole_length, const stab_layer *before,
                                        const stab_metrics_params *params, const stab_shard_reduce *reduce,
                                        stab_metrics *out) {
  return metrics_reduced("stab_vector_metrics_reduced", 0, shard, whole_length, before, params, reduce, out);
}
