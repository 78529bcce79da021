/* measure.c — the probe's rows measured (stab_probe_measure): each layer read where it is
 * mapped (F32, F16, BF16) or converted to f32 block by block (quantized, unaligned), its pages
 * handed back after it, the reference's counterpart put back in the checkpoint's own order
 * (across formats), two layers at a time; the layers of experts as their worst expert; another
 * process's results taken in (stab_probe_set_result); the rows as one step of a trace. */
#include "probe/probe_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- reading weights as f32 -------------------------------------------------------- */

typedef struct {
  float *buf;
  size_t cap;
} f32buf;

static int little_endian(void) {
  const uint16_t one = 1;
  return *(const unsigned char *)&one == 1;
}

/* The tensor as f32: the mapping itself for aligned F32 on a little-endian host (no copy),
 * else converted into b block by block (grown to the largest tensor, reused). A converted
 * tensor's mapped pages are handed back as each block is converted (unless keep_mapped: a
 * tied head reads them next), so that the copy does not sit beside the whole tensor mapped:
 * an unaligned F32 tensor (a safetensors header whose length is not a multiple of 4) peaked
 * at twice its size, a BF16 one at three times the file's. NULL on failure (stab_last_error). */
static const float *as_f32(const stab_ckpt_tensor *t, f32buf *b, int keep_mapped) {
  if (t->dtype == STAB_DTYPE_F32 && little_endian() && ((uintptr_t)t->data % sizeof(float)) == 0)
    return (const float *)(const void *)t->data;
  size_t n = (size_t)t->count;
  if (n > b->cap) {
    float *p = realloc(b->buf, n * sizeof *p);
    if (!p) return stabi_fail(STAB_ENOMEM, "out of memory converting '%s' (%zu floats)", t->name, n), NULL;
    b->buf = p, b->cap = n;
  }
  enum { BLOCK = 1 << 16 };
  const long page = sysconf(_SC_PAGESIZE);
  const unsigned char *released = t->data; /* pages before this are handed back */
  for (size_t i = 0; i < n; i += BLOCK) {
    size_t k = n - i < BLOCK ? n - i : BLOCK;
    if (stab_ckpt_read_f32(t, i, k, b->buf + i) != STAB_OK) return NULL;
    /* a quantized tensor's blocks do not map to whole elements: handed back once, below */
    if (keep_mapped || page <= 0 || !t->elem_size) continue;
    /* from the last page boundary released up to the end of this block: whole pages only
     * (stab_ckpt_release rounds inwards), each page released once */
    const unsigned char *end = t->data + (i + k) * t->elem_size;
    stab_ckpt_tensor done = *t;
    done.data = released;
    done.count = (uint64_t)(end - released) / t->elem_size;
    stab_ckpt_release(&done);
    released = (const unsigned char *)((uintptr_t)end / (uintptr_t)page * (uintptr_t)page);
    if (released < t->data) released = t->data;
  }
  if (!keep_mapped && !t->elem_size) stab_ckpt_release(t);
  return b->buf;
}

/* How the library can read t where it is mapped: F32 (4-byte aligned), F16 or BF16 on a
 * little-endian host, the file's bytes being the host's 16-bit values; -1 when it must be
 * converted to f32 first (quantized, unaligned F32, a big-endian host). */
static int readable_in_place(const stab_ckpt_tensor *t) {
  if (!t || !little_endian()) return -1;
  if (t->dtype == STAB_DTYPE_F32) return (uintptr_t)t->data % sizeof(float) == 0 ? STAB_DTYPE_F32 : -1;
  if (t->dtype == STAB_DTYPE_F16 || t->dtype == STAB_DTYPE_BF16) return (int)t->dtype;
  return -1;
}

/* The dtype a layer made of t, bias and tk (either may be NULL) is handed to the library in:
 * t's own when all three are read in place in it (a layer has one dtype), else F32 (converted).
 * Reading BF16 where it is mapped is what keeps the probe's memory bounded: as f32, Llama-7B's
 * 32000 x 4096 embedding alone is a 524 MB copy per measuring thread. */
static stab_dtype layer_dtype(const stab_ckpt_tensor *t, const stab_ckpt_tensor *bias, const stab_ckpt_tensor *tk) {
  int d = readable_in_place(t);
  if (d < 0 || (bias && readable_in_place(bias) != d) || (tk && readable_in_place(tk) != d)) return STAB_DTYPE_F32;
  return (stab_dtype)d;
}

/* t as the library reads it in dtype (from layer_dtype): its mapping when dtype is t's own,
 * else as_f32's conversion. */
static const float *weights_as(const stab_ckpt_tensor *t, stab_dtype dtype, f32buf *b, int keep_mapped) {
  if (readable_in_place(t) == (int)dtype) return (const float *)(const void *)t->data;
  return as_f32(t, b, keep_mapped);
}

/* p moved off elements of dtype on (a fused q/k/v part's block); NULL stays NULL. */
static const float *elem_at(const float *p, stab_dtype dtype, size_t off) {
  return p ? (const float *)(const void *)((const unsigned char *)p + off * (dtype == STAB_DTYPE_F32 ? 4 : 2)) : NULL;
}

/* The logit bounds of attention row r, from q and k stored as dtype: the library's attention
 * metrics of the entry's layer (grouped-query heads included: .kv_heads). */
static stab_status measure_attention(stabi_probe_row *r, const float *q, const float *k, stab_dtype dtype,
                                     const stab_metrics_params *mp) {
  stab_layer L;
  stab_status st = stab_model_entry_layer(r->e, dtype, q, NULL, k, &L);
  if (st != STAB_OK) return st;
  L.scale = r->scale; /* the checkpoint's own (attn_scale), which the entry does not carry */
  return stab_layer_metrics(&L, NULL, mp, &r->m, r->head_bounds);
}

/* A row's sizes as stab_layer takes them. The row keeps d_in and d_out in its kind's math (the
 * report prints them); a table is registered by what it is, its V vectors (vocab) of width d. */
static void set_layer_sizes(stab_layer *L, const stabi_probe_row *r) {
  if (r->kind == STAB_KIND_EMBEDDING || r->kind == STAB_KIND_LM_HEAD) {
    L->vocab = r->kind == STAB_KIND_EMBEDDING ? r->d_in : r->d_out;
    L->width = r->kind == STAB_KIND_EMBEDDING ? r->d_out : r->d_in;
  } else {
    L->d_in = r->d_in;
    L->d_out = r->d_out;
  }
}

/* ---- measuring ---------------------------------------------------------------------- */

/* The conversion buffers of one measuring thread: weight, bias, the k tensor of an attention
 * row, and the reference checkpoint's weight and bias (--prev). */
typedef struct {
  f32buf w, b, k, pw, pb;
  f32buf pwx, pbx; /* the reference's weight and bias reordered into this checkpoint's order */
} row_buffers;

static void row_buffers_free(row_buffers *rb) {
  free(rb->w.buf), free(rb->b.buf), free(rb->k.buf), free(rb->pw.buf), free(rb->pb.buf);
  free(rb->pwx.buf), free(rb->pbx.buf);
}

/* The reference tensor pt (r's prev_t or prev_bias) as f32 in r's own order: as stored
 * (as_f32) when it is, else an f32 copy into out (one layer at a time) with the converter's
 * changes undone: transposed back, the q/k rows of each head put back in the order of the
 * current file (stab_qk_permutation), the offset added. NULL on failure (stab_last_error). */
static const float *prev_as_f32(const stabi_probe_row *r, const stab_ckpt_tensor *pt, f32buf *raw, f32buf *out) {
  const float *src = as_f32(pt, raw, 0);
  if (!src || (!r->prev_heads && !r->prev_transposed && r->prev_offset == 0.0f)) return src;
  const size_t n = (size_t)pt->count, rows = pt->ndim == 2 ? (size_t)pt->shape[0] : n, cols = n / rows;
  if (n > out->cap) {
    float *p = realloc(out->buf, n * sizeof *p);
    if (!p) return stabi_fail(STAB_ENOMEM, "out of memory reordering '%s' (%zu floats)", pt->name, n), NULL;
    out->buf = p, out->cap = n;
  }
  float *dst = out->buf;
  const float off = r->prev_offset;
  if (r->prev_transposed) { /* pt is [rows][cols]; the current tensor [cols][rows] */
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < cols; j++) dst[j * rows + i] = src[i * cols + j] + off;
    return dst;
  }
  size_t *perm = NULL;
  if (r->prev_heads) {
    if (!(perm = malloc(rows * sizeof *perm))) return stabi_fail(STAB_ENOMEM, "out of memory reordering '%s'", pt->name), NULL;
    if (stab_qk_permutation(rows, r->prev_heads, perm) != STAB_OK) {
      char why[400];
      snprintf(why, sizeof why, "%s", stab_last_error());
      stabi_fail(STAB_EINVAL, "%s: %s", pt->name, why);
      free(perm);
      return NULL;
    }
  }
  /* perm[i]: the HF row stored as GGUF row i */
  for (size_t i = 0; i < rows; i++) {
    size_t to = perm && !r->prev_to_gguf ? perm[i] : i, from = perm && r->prev_to_gguf ? perm[i] : i;
    for (size_t j = 0; j < cols; j++) dst[to * cols + j] = src[from * cols + j] + off;
  }
  free(perm);
  return dst;
}

/* The n = t->count values at w plus off, in out (an init reference's row read as the
 * checkpoint's converter stored its counterpart: row.self_offset). NULL when out of memory. */
static const float *offset_copy(const stab_ckpt_tensor *t, const float *w, float off, f32buf *out) {
  const size_t n = (size_t)t->count;
  if (n > out->cap) {
    float *p = realloc(out->buf, (n ? n : 1) * sizeof *p);
    if (!p) return stabi_fail(STAB_ENOMEM, "out of memory offsetting '%s' (%zu floats)", t->name, n), NULL;
    out->buf = p, out->cap = n;
  }
  for (size_t i = 0; i < n; i++) out->buf[i] = w[i] + off;
  return out->buf;
}

/* Measures one row into r->m (r->measured = 1): STAB_OK, or the failure (stab_last_error). Its mapped
 * pages are handed back afterwards unless keep_mapped (a tied head comes next). The update is
 * against r->prev_t (find_counterpart), when set. Safe to run for different rows at once: each
 * thread brings its own buffers. */
static stab_status measure_row(stabi_probe_row *r, const stab_metrics_params *mp, row_buffers *rb, int keep_mapped) {
  stab_ckpt_prefetch(r->t), stab_ckpt_prefetch(r->bias);
  if (r->tk != r->t) stab_ckpt_prefetch(r->tk);
  /* F16 and BF16 go to the library as they are mapped (it converts a few rows at a time);
   * only quantized, unaligned or big-endian tensors are converted whole */
  const stab_dtype dt = r->self_offset != 0.0f ? STAB_DTYPE_F32 : layer_dtype(r->t, r->bias, r->tk);
  const float *w = weights_as(r->t, dt, &rb->w, keep_mapped);
  if (w && r->self_offset != 0.0f) w = offset_copy(r->t, w, r->self_offset, &rb->pwx);
  const float *b = r->bias ? weights_as(r->bias, dt, &rb->b, keep_mapped) : NULL;
  const float *wk = r->tk == r->t ? w : r->tk ? weights_as(r->tk, dt, &rb->k, keep_mapped) : NULL; /* a fused qkv: one tensor */
  if (!w || (r->bias && !b) || (r->tk && !wk)) return STAB_EFORMAT;
  /* a part of a fused q/k/v: its block of the tensor (rows, or columns of stride ld) and its
   * slice of the bias, read where they are (a quantized tensor was converted whole above) */
  const int linear = r->kind == STAB_KIND_LINEAR;
  stab_layer L = {.name = r->name, .kind = r->kind,
                  .layout = linear || r->kind == STAB_KIND_ATTENTION ? r->layout : STAB_LAYOUT_NATURAL,
                  .weight = linear ? elem_at(w, dt, r->offset) : w, .bias = linear ? elem_at(b, dt, r->bias_offset) : b,
                  .ld = linear ? r->ld : 0, .weight_k = wk, .heads = r->heads, .dtype = dt};
  set_layer_sizes(&L, r);
  stab_layer before = L, *bp = NULL;
  if (r->prev_t && !r->prev_heads && !r->prev_transposed && r->prev_offset == 0.0f) {
    /* as stored, in its own dtype: a BF16 checkpoint against an F32 one reads both in place */
    before.dtype = layer_dtype(r->prev_t, r->bias ? r->prev_bias : NULL, NULL);
    before.weight = weights_as(r->prev_t, before.dtype, &rb->pw, 0);
    before.bias = r->bias ? weights_as(r->prev_bias, before.dtype, &rb->pb, 0) : NULL;
    if (!before.weight || (r->bias && !before.bias)) return STAB_EFORMAT;
    before.weight = elem_at(before.weight, before.dtype, linear ? r->offset : 0);
    before.bias = elem_at(before.bias, before.dtype, linear ? r->bias_offset : 0);
    bp = &before;
  } else if (r->prev_t) { /* reordered as the converter changed it: an f32 copy */
    before.dtype = STAB_DTYPE_F32;
    before.weight = prev_as_f32(r, r->prev_t, &rb->pw, &rb->pwx);
    before.bias = r->bias ? prev_as_f32(r, r->prev_bias, &rb->pb, &rb->pbx) : NULL;
    if (!before.weight || (r->bias && !before.bias)) return STAB_EFORMAT;
    /* in this checkpoint's order now: the part's block is where it is in t */
    before.weight = elem_at(before.weight, STAB_DTYPE_F32, linear ? r->offset : 0);
    before.bias = elem_at(before.bias, STAB_DTYPE_F32, linear ? r->bias_offset : 0);
    bp = &before;
  }
  stab_status st = r->kind == STAB_KIND_ATTENTION ? measure_attention(r, w, wk, dt, mp)
                                                  : stab_layer_metrics(&L, bp, mp, &r->m, r->head_bounds);
  if (st != STAB_OK) {
    char why[400];
    snprintf(why, sizeof why, "%s", stab_last_error());
    return stabi_fail(st, "%s: %s", r->name, why);
  }
  r->measured = 1;
  /* the mapped pages of this layer are not needed again (a tied head's, after the head):
   * peak memory stays near the largest layers, not the file */
  if (!keep_mapped) {
    stab_ckpt_release(r->t), stab_ckpt_release(r->bias), stab_ckpt_release(r->tk);
    if (bp) stab_ckpt_release(r->prev_t), stab_ckpt_release(r->prev_bias);
  }
  return STAB_OK;
}

/* The share of the run a row stands for in the ETA: the numbers it reads, times how often.
 * An attention row reads its q and k blocks (counting only q's tensor put Llama-7B's 32
 * attention rows, last in the table, at 1/14 of the work for a quarter of the time: the ETA
 * said 2 s with 10 s to go); a table is swept twice where a linear layer's Lanczos makes 10 to
 * 30 passes (counted as a linear, Llama-7B's embedding, first, made the ETA 10 s at 1.3 s
 * into a 26.5 s run). */
double stabi_probe_row_work(const stabi_probe_row *r) {
  if (r->kind == STAB_KIND_ATTENTION) return 2.0 * (double)r->d_in * (double)r->d_out;
  if (r->kind == STAB_KIND_EMBEDDING || r->kind == STAB_KIND_LM_HEAD) return 0.15 * (double)r->t->count;
  /* a part of a fused q/k/v reads its block: a third or so of the tensor */
  if (r->kind == STAB_KIND_LINEAR && r->e && r->e->part) return (double)r->d_in * (double)r->d_out;
  return (double)r->t->count;
}

/* ---- layers of experts ---------------------------------------------------------------- */

static double expert_metric(const stab_metrics *m, int k) {
  switch (k) {
  case EXPERT_FORWARD: return m->forward;
  case EXPERT_DEPENDENCY: return m->dependency;
  case EXPERT_UPDATE: return m->update;
  case EXPERT_SIGMA: return m->sigma;
  default: return m->rel_update;
  }
}

/* Each layer of experts' metrics: per metric, its worst expert's value and index (a NaN from
 * non-finite weights, or update, is the worst there is, as in the summary), from the rows of its
 * experts, which follow it; passes summed, flags joined. Measured when every expert was. An
 * expert without an update (no counterpart in --prev) leaves the layer's update unknown (NaN):
 * the worst of the others is not the layer's. */
void stabi_probe_expert_layers(stab_probe *p) {
  if (!p->experts_stale) return;
  p->experts_stale = 0;
  stabi_probe_row *rows = p->rows;
  size_t n = p->n;
  for (size_t i = 0; i < n; i++) {
    stabi_probe_row *g = &rows[i];
    if (!stabi_is_expert_layer(g) || g->error) continue;
    stab_metrics m = g->m; /* the NaNs of a linear layer not measured */
    m.forward = m.dependency = m.update = m.sigma = m.rel_update = NAN;
    m.sigma_rel_err = m.sigma_update = m.sigma_update_rel_err = NAN;
    m.forward_tight = m.dependency_tight = m.update_tight = m.spread = NAN;
    m.passes = m.update_passes = m.flags = 0;
    int all = 1, broken[N_EXPERT_METRICS] = {0}, no_update = 0;
    size_t j = i + 1;
    for (; j < n && stabi_is_expert(&rows[j]); j++) {
      const stabi_probe_row *x = &rows[j];
      no_update |= x->no_update != NULL;
      if (!x->measured) {
        all = 0;
        continue;
      }
      m.passes += x->m.passes, m.update_passes += x->m.update_passes, m.flags |= x->m.flags;
      m.tight_method = x->m.tight_method;
      for (int k = 0; k < N_EXPERT_METRICS; k++) {
        double v = expert_metric(&x->m, k), cur = expert_metric(&m, k);
        unsigned bad = k == EXPERT_UPDATE || k == EXPERT_REL_UPDATE ? STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE
                                                                   : STAB_FLAG_NONFINITE_WEIGHT;
        if (broken[k]) continue;
        int take = isnan(v) ? (x->m.flags & bad) != 0 : isnan(cur) || v > cur;
        if (!take) continue;
        broken[k] = isnan(v);
        g->worst[k] = x->e->expert;
        switch (k) {
        case EXPERT_FORWARD: m.forward = v; break;
        case EXPERT_DEPENDENCY: m.dependency = v; break;
        case EXPERT_UPDATE:
          m.update = v, m.sigma_update = x->m.sigma_update, m.sigma_update_rel_err = x->m.sigma_update_rel_err;
          break;
        case EXPERT_SIGMA: m.sigma = v, m.sigma_rel_err = x->m.sigma_rel_err; break;
        default: m.rel_update = v; break;
        }
      }
    }
    if (no_update) { /* an expert without a counterpart: the worst update is not known */
      m.update = m.rel_update = m.sigma_update = m.sigma_update_rel_err = NAN;
      g->worst[EXPERT_UPDATE] = g->worst[EXPERT_REL_UPDATE] = STAB_MODEL_NO_EXPERT;
    }
    g->m = m;
    g->measured = all && j > i + 1;
    i = j - 1;
  }
}


/* Where the thread that failed first leaves its message for the caller's thread. */
typedef struct {
  stab_status status;
  char message[512];
} first_failure;

stab_status stab_probe_measure(stab_probe *p, const unsigned char *which, stab_probe_progress_fn progress_fn,
                               void *user) {
  if (!p) return stabi_fail(STAB_EINVAL, "stab_probe_measure: NULL probe");
  stabi_probe_row *rows = p->rows;
  const size_t n = p->n, tied_src = p->tied_src;
  const stab_probe_params *o = &p->params;
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.tol = o->tol;
  if (o->exact) mp.spectral.method = STAB_SPECTRAL_EXACT;
  mp.tight = o->tight;
  /* the rows this call measures */
  unsigned char *todo = calloc(n ? n : 1, 1);
  if (!todo) return stabi_fail(STAB_ENOMEM, "stab_probe_measure: out of memory");
  double work = 0, done = 0;
  for (size_t i = 0; i < n; i++) {
    todo[i] = (!which || which[i]) && !rows[i].error && !stabi_is_expert_layer(&rows[i]) && !rows[i].measured;
    if (todo[i]) work += stabi_probe_row_work(&rows[i]);
  }
  /* A tied head (rows[n - 1]) is measured right after its embedding, by the same thread, while
   * the table is still mapped (its pages are released once, after the head): mapping GPT-2's
   * 154 MB wte a second time cost 5% of its probe. Only when both are measured here. */
  const size_t with_head = tied_src != SIZE_MAX && todo[tied_src] && todo[n - 1] ? tied_src : SIZE_MAX;
  /* Two layers are measured at a time, one thread each, instead of one layer with both
   * threads: most layers are small, their passes short, and the serial work between passes
   * (the Lanczos vectors, LAPACK on the small band matrix) left the second core idle. Results
   * are the same bits either way (a pass splits rows by shape, never by thread count). The
   * exact mode keeps one layer at a time: its dgesvd runs on OpenBLAS's own threads. */
  int layer_threads = o->threads > 0 ? o->threads : 1;
#ifdef _OPENMP
  if (o->threads <= 0 && !o->exact && omp_get_max_threads() > 1) layer_threads = 2;
#else
  layer_threads = 1;
#endif
  if (layer_threads > 1) mp.spectral.threads = 1;
  int failed = 0, stopped = 0;
  first_failure first = {STAB_OK, ""};
  const unsigned long trips = stabi_guard_trips(); /* the input guard: a file shrinking under the reads */
#ifdef _OPENMP
#pragma omp parallel num_threads(layer_threads)
#endif
  {
    row_buffers rb = {0};
    int me = 0;
#ifdef _OPENMP
    me = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
#endif
    for (size_t k = 0; k < n; k++) {
      if (!todo[k] || (with_head != SIZE_MAX && k == n - 1)) continue; /* the head goes with its embedding */
      int stop;
#ifdef _OPENMP
#pragma omp atomic read
#endif
      stop = failed;
      if (stop) continue;
      for (size_t i = k; i != SIZE_MAX; i = i == with_head ? n - 1 : SIZE_MAX) {
        stabi_probe_row *r = &rows[i];
        if (progress_fn) {
          double d;
#ifdef _OPENMP
#pragma omp atomic read
#endif
          d = done;
          stab_probe_progress pr = {.row = i, .count = n, .name = r->name, .work_done = d, .work_total = work,
                                    .thread = me};
          if (progress_fn(user, &pr)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
#ifdef _OPENMP
#pragma omp atomic write
#endif
            stopped = 1;
            break;
          }
        }
        stab_status st = measure_row(r, &mp, &rb, i == with_head);
        if (st != STAB_OK) {
#ifdef _OPENMP
#pragma omp critical(stab_probe_first_failure)
#endif
          if (first.status == STAB_OK) {
            first.status = st;
            snprintf(first.message, sizeof first.message, "%s", stab_last_error());
          }
#ifdef _OPENMP
#pragma omp atomic write
#endif
          failed = 1;
          break;
        }
#ifdef _OPENMP
#pragma omp atomic update
#endif
        done += stabi_probe_row_work(r);
      }
    }
    row_buffers_free(&rb);
  }
  free(todo);
  p->experts_stale = 1;
  if (stabi_guard_trips() != trips) { /* whichever row noticed it, if any, the file is named */
    for (size_t i = 0; i < n && first.status != STAB_EIO; i++)
      if (rows[i].e && rows[i].e->weight && rows[i].e->weight->data &&
          stabi_guard_check(rows[i].e->weight->data, 1, p->checkpoint) != STAB_OK) {
        first.status = STAB_EIO;
        snprintf(first.message, sizeof first.message, "%s", stab_last_error());
      }
  }
  if (first.status != STAB_OK) {
    stabi_set_last_error(first.message); /* the failing thread's, on the caller's */
    return first.status;
  }
  if (stopped) return stabi_fail(STAB_ESTATE, "%s: measuring stopped by the caller's progress_fn", p->checkpoint);
  return STAB_OK;
}

stab_status stab_probe_set_result(stab_probe *p, size_t i, const stab_metrics *m, const double *head_bounds,
                                  int measured) {
  if (!p || !m || i >= p->n)
    return stabi_fail(STAB_EINVAL, "stab_probe_set_result: %s", !p || !m ? "NULL argument" : "row out of range");
  stabi_probe_row *r = &p->rows[i];
  if (r->head_bounds && !head_bounds)
    return stabi_fail(STAB_EINVAL, "stab_probe_set_result: row '%s' is attention: its head bounds are needed", r->name);
  r->m = *m;
  r->measured = measured != 0;
  if (r->head_bounds) memcpy(r->head_bounds, head_bounds, r->heads * sizeof *r->head_bounds);
  p->experts_stale = 1;
  return STAB_OK;
}

/* ---- the init reference's rows ------------------------------------------------------ */

stab_status stab_probe_measure_init(stab_probe *p, const unsigned char *which, stab_probe_progress_fn progress_fn,
                                    void *user) {
  if (!p) return stabi_fail(STAB_EINVAL, "stab_probe_measure_init: NULL probe");
  stab_probe *q = p->init;
  if (!q) return STAB_OK;
  unsigned char *todo = calloc(q->n ? q->n : 1, 1);
  if (!todo) return stabi_fail(STAB_ENOMEM, "stab_probe_measure_init: out of memory");
  /* the counterparts of the rows asked for; a layer of experts' own (its experts are rows too,
   * matched by their names, so they are asked for with it) */
  for (size_t i = 0; i < p->n; i++)
    if ((!which || which[i]) && p->rows[i].init_row != SIZE_MAX) todo[p->rows[i].init_row] = 1;
  /* the same code path as the checkpoint's own rows: the same settings, the same bits */
  stab_status st = stab_probe_measure(q, todo, progress_fn, user);
  free(todo);
  return st;
}

/* value over init: NaN unless both are finite and init is above 0 */
static double ratio_of(double value, double init) {
  return isfinite(value) && isfinite(init) && init > 0 ? value / init : NAN;
}

void stabi_probe_ratios(stab_probe *p) {
  stabi_probe_expert_layers(p);
  if (p->init) stabi_probe_expert_layers(p->init);
  for (size_t i = 0; i < p->n; i++) {
    stabi_probe_row *r = &p->rows[i];
    stab_probe_ratio w = {NAN, NAN, NAN, NAN, r->init_row};
    const stabi_probe_row *c = p->init && r->init_row != SIZE_MAX ? &p->init->rows[r->init_row] : NULL;
    if (c && c->measured) w.forward_init = c->m.forward, w.dependency_init = c->m.dependency;
    if (r->measured) {
      w.forward_ratio = ratio_of(r->m.forward, w.forward_init);
      w.dependency_ratio = ratio_of(r->m.dependency, w.dependency_init);
    }
    r->ratio = w;
  }
}

stab_status stab_probe_ratio_at(stab_probe *p, size_t i, stab_probe_ratio *out) {
  if (!p || !out || i >= p->n)
    return stabi_fail(STAB_EINVAL, "stab_probe_ratio_at: %s", !p || !out ? "NULL argument" : "row out of range");
  stabi_probe_ratios(p);
  *out = p->rows[i].ratio;
  return STAB_OK;
}

/* ---- the trace ---------------------------------------------------------------------- */

/* Addresses standing for where each tensor sits in the checkpoint file, for the trace's record of
 * shared storage: the library finds which layers share storage (param_count_unique,
 * shares_storage_with) from the addresses they are registered with, and the probe measures from
 * buffers it reuses, so it registers each tensor at the address of its place in the file
 * instead, in a reservation that is never read or written (PROT_NONE): one float per byte of
 * the file. Tensors with disjoint bytes get disjoint ranges (a tensor of count elements of at
 * least one byte each spans at most its bytes' range); a tied head is its embedding's tensor,
 * an attention row reads inside its q and k tensors, so theirs overlap as their storage does. */
typedef struct {
  void *base;
  size_t bytes;
  const stab_checkpoint *ck; /* the places are its (stabi_checkpoint_place: the files one after another) */
} file_space;

static int file_space_reserve(file_space *fs, const stab_checkpoint *ck, const stabi_probe_row *rows, size_t n) {
  uint64_t end = 0;
  fs->ck = ck;
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *ts[] = {rows[i].t, rows[i].bias, rows[i].tk};
    for (size_t k = 0; k < 3; k++)
      if (ts[k] && stabi_checkpoint_place(ck, ts[k]) + ts[k]->count > end) end = stabi_checkpoint_place(ck, ts[k]) + ts[k]->count;
  }
  fs->bytes = (size_t)(end ? end : 1) * sizeof(float);
  fs->base = mmap(NULL, fs->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return fs->base != MAP_FAILED;
}

static const float *file_address(const file_space *fs, const stab_ckpt_tensor *t, size_t elem_offset) {
  return t ? (const float *)fs->base + stabi_checkpoint_place(fs->ck, t) + elem_offset : NULL;
}

/* A monitor with the rows as its layers carries the metrics to stab_trace_append, under the
 * rows' names (layer_names: a trace's names, unique). */
stab_status stab_probe_trace_append(stab_probe *p, const char *path, int64_t step) {
  if (!p || !path) return stabi_fail(STAB_EINVAL, "stab_probe_trace_append: NULL %s", p ? "path" : "probe");
  stabi_probe_expert_layers(p);
  const stab_probe_params *o = &p->params;
  const stabi_probe_row *rows = p->rows;
  const size_t n = p->n;
  file_space fs;
  if (!file_space_reserve(&fs, p->cur.ck, rows, n))
    return stabi_fail(STAB_ENOMEM, "%s: cannot reserve address space for the trace's layers: %s", path, strerror(errno));
  stab_monitor_params mp = stab_monitor_default_params();
  mp.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  stab_trace *t = NULL;
  stab_status st = stab_monitor_create(&mp, &m);
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    const stabi_probe_row *r = &rows[i];
    /* a layer of experts is the report's; a trainer registers each expert, as the rows here */
    if (!r->measured || stabi_is_expert_layer(r)) continue;
    int attention = r->kind == STAB_KIND_ATTENTION, linear = r->kind == STAB_KIND_LINEAR;
    /* a fused q/k/v part at its block of the tensor: the trace's shared storage sees the
     * attention layer's q and k inside the q and k parts, as a trainer's layers would */
    stab_layer L = {.name = r->name, .kind = r->kind, .heads = r->heads, .kv_heads = attention ? r->kv_heads : 0,
                    .weight = file_address(&fs, r->t, attention ? r->q_off : linear ? r->offset : 0),
                    .weight_k = attention ? file_address(&fs, r->tk, r->k_off) : NULL,
                    .bias = linear && r->bias ? file_address(&fs, r->bias, r->bias_offset) : NULL,
                    .ld = attention || linear ? r->ld : 0, .scale = attention ? r->scale : 0,
                    .layout = linear || attention ? r->layout : STAB_LAYOUT_NATURAL};
    set_layer_sizes(&L, r);
    size_t idx;
    if ((st = stab_monitor_add_layer(m, &L, &idx)) == STAB_OK) st = stab_monitor_set_metrics(m, idx, &r->m, r->head_bounds);
  }
  char config[512];
  snprintf(config, sizeof config, "{\"producer\": \"stabmeter-probe %s\", \"tol\": %g, \"exact\": %s, \"tight\": \"%s\"}",
           stab_version(), o->tol, o->exact ? "true" : "false",
           o->tight == STAB_TIGHT_EXACT ? "exact" : o->tight == STAB_TIGHT_NONE ? "none" : "centred");
  stab_trace_params tp = stab_trace_default_params();
  tp.append = STAB_OUTPUT_APPEND; /* a series of checkpoints builds one trace: later steps of the same layers */
  tp.run_config = config;
  if (st == STAB_OK) st = stab_trace_open(path, m, &tp, &t);
  /* no wall time for a checkpoint on disk: NaN, as the schema has it for a missing value */
  if (st == STAB_OK) st = stab_trace_append(t, step, NAN, NULL, NULL);
  if (st == STAB_OK) st = stab_trace_close(t);
  else stab_trace_close(t);
  if (st != STAB_OK) {
    char why[400];
    snprintf(why, sizeof why, "%s", stab_last_error());
    stabi_fail(st, "%s: %s", path, why);
  }
  stab_monitor_free(m);
  munmap(fs.base, fs.bytes);
  return st;
}

