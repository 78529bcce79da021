/* train_tp.c — the monitor of a tensor-parallel run (train_tp.h): where each of the trace's
 * layers is measured, the measurements, and their metrics put back into the trace's monitor.
 * Built with --with-mpi. */
#include "stabmeter_mpi.h"
#include "train_tp.h"
#include "cli.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A split linear layer: its handle, the trace's layer, this rank's slices (local tensors). */
typedef struct {
  stab_mpi_linear *h;
  size_t trace_index;
  size_t w, b;         /* local tensor indices of the weight and the bias (SIZE_MAX: none) */
  size_t w_off, b_off; /* where the layer's shard starts in them (elements): c_attn's q, k and v
                          are blocks of rows of one tensor, each rank's the rows of its heads */
  size_t d_out, d_in;  /* this rank's shard */
} split_linear;

struct train_tp {
  train_world *w;
  const model_tp *tp;
  stab_monitor *rep;      /* the replicated layers, on this rank's copies */
  size_t *rep_trace;      /* (rep's layers) their index in the trace's monitor */
  stab_monitor *heads;    /* this rank's heads of each attention layer */
  size_t *heads_trace;    /* (heads' layers) */
  split_linear *lin;      /* (n_lin) */
  size_t n_lin;
  float *before;          /* (local.n_params) the slices before the step */
  double *mine, *all;     /* the heads' records: this rank's, every rank's (P of them) */
  double *bounds;         /* (H) one attention layer's heads, in the whole model's order */
  /* one step's batch of the split layers: handles and metrics (n_lin), their shards then
   * their befores (2 n_lin), and pointers to those (2 n_lin) */
  stab_mpi_linear **hs;
  stab_layer *shards;
  const stab_layer **shard_ptrs;
  stab_metrics *lin_metrics;
  size_t record;          /* doubles per attention layer in a record */
  int snapshot_ready;
};

/* The whole model's tensor holding p (a pointer into whole->params), or SIZE_MAX. */
static size_t tensor_of(const model *whole, const float *p) {
  if (!p) return SIZE_MAX;
  for (size_t i = 0; i < whole->n_tensors; i++) {
    const model_tensor *t = &whole->tensors[i];
    if (p >= whole->params + t->offset && p < whole->params + t->offset + t->size) return i;
  }
  return SIZE_MAX;
}

/* The same place in this rank's copy of a replicated tensor. */
static const float *local_of(const model_tp *tp, const model *whole, const float *p) {
  size_t i = tensor_of(whole, p);
  if (i == SIZE_MAX) return NULL;
  return tp->local.params + tp->local.tensors[i].offset + (p - whole->params - whole->tensors[i].offset);
}

static int fail_st(const char *what, const char *name) {
  cli_error("tensor parallel: %s '%s': %s", what, name, stab_last_error());
  return 1;
}

int train_tp_create(train_world *w, const model_tp *tp, const model *whole, const stab_monitor *trace,
                    const stab_monitor_params *mp, train_tp **out) {
  *out = NULL;
  train_tp *t = calloc(1, sizeof *t);
  size_t n = stab_monitor_layer_count(trace), P = tp->P, r = tp->rank, D = tp->local.c.width;
  int rc = 1;
  if (!t) return cli_error("out of memory for the monitor"), 1;
  t->w = w, t->tp = tp;
  stab_monitor_params hp = *mp;
  hp.update_mode = STAB_UPDATE_NONE; /* attention has no update */
  t->rep_trace = malloc(n * sizeof *t->rep_trace);
  t->heads_trace = malloc(n * sizeof *t->heads_trace);
  t->lin = calloc(n, sizeof *t->lin);
  t->before = malloc(tp->local.n_params * sizeof *t->before);
  if (!t->rep_trace || !t->heads_trace || !t->lin || !t->before || stab_monitor_create(mp, &t->rep) != STAB_OK ||
      stab_monitor_create(&hp, &t->heads) != STAB_OK) {
    cli_error("out of memory for the monitor");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const stab_layer *tl = stab_monitor_layer(trace, i);
    size_t ti = tensor_of(whole, tl->weight), idx;
    stab_layer l = *tl;
    if (ti == SIZE_MAX) {
      cli_error("tensor parallel: layer '%s' reads no tensor of the model", tl->name);
      goto out;
    }
    const float *wl = tp->local.params + tp->local.tensors[ti].offset;
    if (tl->kind == STAB_KIND_ATTENTION) { /* its q rows and k rows of this rank's heads */
      l.d_out = tp->Dl, l.heads = tp->Hl, l.weight = wl, l.weight_k = wl + tp->Dl * D;
      if (stab_monitor_add_layer(t->heads, &l, &idx) != STAB_OK) {
        fail_st("the heads of", tl->name);
        goto out;
      }
      t->heads_trace[idx] = i;
    } else if (tp->split[ti] != TP_WHOLE) {
      split_linear *s = &t->lin[t->n_lin]; /* its handle once every rank is ready: below */
      int rows = tp->split[ti] == TP_OUT;
      size_t cut = (rows ? tl->d_out : tl->d_in) / P;
      s->trace_index = i, s->w = ti, s->b = tensor_of(whole, tl->bias);
      s->d_out = rows ? cut : tl->d_out, s->d_in = rows ? tl->d_in : cut;
      /* a block of whole rows of a tensor split by rows (c_attn's k: rows D..2D-1) starts as many
       * of this rank's rows into its slice (its heads' k rows follow its q rows), row-blocks of
       * the whole tensor being cut alike; a tensor split by columns is one layer from its start */
      const size_t w_rows = (size_t)(tl->weight - whole->params - whole->tensors[ti].offset) / tl->d_in;
      s->w_off = rows ? w_rows / P * tl->d_in : 0;
      s->b_off = rows && tl->bias ? (size_t)(tl->bias - whole->params - whole->tensors[s->b].offset) / P : 0;
      t->n_lin++;
    } else {
      l.weight = local_of(tp, whole, tl->weight);
      l.bias = local_of(tp, whole, tl->bias);
      if (stab_monitor_add_layer(t->rep, &l, &idx) != STAB_OK) {
        fail_st("the replicated layer", tl->name);
        goto out;
      }
      t->rep_trace[idx] = i;
    }
  }
  size_t na = stab_monitor_layer_count(t->heads);
  t->record = 4 + tp->Hl; /* status, forward, passes, flags, the bounds */
  t->mine = malloc((na ? na : 1) * t->record * sizeof *t->mine);
  t->all = malloc(P * (na ? na : 1) * t->record * sizeof *t->all);
  t->bounds = malloc(P * tp->Hl * sizeof *t->bounds);
  const size_t nl = t->n_lin ? t->n_lin : 1;
  t->hs = malloc(nl * sizeof *t->hs);
  t->shards = malloc(2 * nl * sizeof *t->shards);
  t->shard_ptrs = malloc(2 * nl * sizeof *t->shard_ptrs);
  t->lin_metrics = malloc(nl * sizeof *t->lin_metrics);
  if (!t->mine || !t->all || !t->bounds || !t->hs || !t->shards || !t->shard_ptrs || !t->lin_metrics) {
    cli_error("out of memory for the monitor");
    goto out;
  }
  rc = 0;
out:
  /* the split layers' handles are collective: every rank creates them, or none */
  if ((rc = train_world_agree(w, rc))) {
    train_tp_free(t);
    return rc;
  }
  for (size_t k = 0; k < t->n_lin && !rc; k++) {
    split_linear *s = &t->lin[k];
    const stab_layer *tl = stab_monitor_layer(trace, s->trace_index);
    int rows = tp->split[s->w] == TP_OUT;
    /* c_attn.q's rows here are the q rows of this rank's heads, rows r D/P .. (r+1) D/P - 1 of
     * the whole q (likewise k and v): contiguous shards in rank order */
    stab_mpi_shard sh = {rows ? STAB_MPI_SPLIT_ROWS : STAB_MPI_SPLIT_COLS, tl->d_out, tl->d_in, 0, 0};
    size_t cut = rows ? s->d_out : s->d_in;
    sh.begin = r * cut, sh.end = (r + 1) * cut;
    /* the same status on every rank: all stop here together */
    if (stab_mpi_linear_create(train_world_comm(w), &sh, tl->bias != NULL, &mp->metrics, &s->h) != STAB_OK)
      rc = fail_st("the split layer", tl->name);
  }
  if (rc) train_tp_free(t);
  else *out = t;
  return rc;
}

stab_status train_tp_snapshot(train_tp *t) {
  memcpy(t->before, t->tp->local.params, t->tp->local.n_params * sizeof *t->before);
  t->snapshot_ready = 1;
  return stab_monitor_snapshot(t->rep);
}

/* The attention layers: each rank's heads measured, the records gathered in rank order, and
 * each layer's metrics those of one process over all heads (the largest bound; NaN when a head
 * has non-finite weights). */
static stab_status measure_heads(train_tp *t, stab_monitor *trace) {
  size_t na = stab_monitor_layer_count(t->heads), R = t->record, Hl = t->tp->Hl, P = t->tp->P;
  stab_status st = stab_monitor_measure(t->heads, 0);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", st == STAB_OK ? "" : stab_last_error());
  for (size_t i = 0; i < na; i++) {
    const stab_metrics *x = stab_monitor_metrics(t->heads, i);
    double *q = t->mine + i * R;
    q[0] = (double)st, q[1] = x->forward, q[2] = (double)x->passes, q[3] = (double)x->flags;
    memcpy(q + 4, stab_monitor_head_bounds(t->heads, i), Hl * sizeof *q);
  }
  if (train_world_allgather(t->w, t->mine, na * R * sizeof *t->mine, t->all))
    return STAB_EIO;
  for (size_t r = 0; r < P; r++) /* the first failing rank's status, on every rank */
    for (size_t i = 0; i < na; i++)
      if (t->all[(r * na + i) * R] != 0.0) {
        if (r != t->tp->rank) snprintf(msg, sizeof msg, "rank %zu failed to measure its attention heads", r);
        cli_error("tensor parallel: %s", msg);
        return (stab_status)(int)t->all[(r * na + i) * R];
      }
  double *bounds = t->bounds;
  for (size_t i = 0; i < na; i++) {
    stab_metrics m = *stab_monitor_metrics(t->heads, i);
    double forward = 0;
    int passes = 0, flags = 0, bad = 0;
    for (size_t r = 0; r < P; r++) {
      const double *q = t->all + (r * na + i) * R;
      if (isnan(q[1])) bad = 1;
      else if (q[1] > forward) forward = q[1];
      passes += (int)q[2], flags |= (int)q[3];
      memcpy(bounds + r * Hl, q + 4, Hl * sizeof *bounds);
    }
    m.forward = bad ? NAN : forward, m.passes = passes, m.flags = flags;
    stab_monitor_set_metrics(trace, t->heads_trace[i], &m, bounds);
  }
  return STAB_OK;
}

stab_status train_tp_measure(train_tp *t, stab_monitor *trace, int with_update) {
  const model *m = &t->tp->local;
  stab_status first = stab_mpi_monitor_measure(train_world_comm(t->w), t->rep, with_update);
  if (first != STAB_OK) cli_error("tensor parallel: replicated layers: %s", stab_last_error());
  for (size_t i = 0; i < stab_monitor_layer_count(t->rep); i++)
    stab_monitor_set_metrics(trace, t->rep_trace[i], stab_monitor_metrics(t->rep, i),
                             stab_monitor_head_bounds(t->rep, i));
  int update = with_update && t->snapshot_ready;
  /* the split layers, each measured whole by every rank together, all in one batch: one
   * exchange per pass for all of them (stab_mpi_linear_measure_batch) */
  stab_layer *befores = t->shards + t->n_lin;
  const stab_layer **before_ptrs = t->shard_ptrs + t->n_lin;
  for (size_t k = 0; k < t->n_lin; k++) {
    const split_linear *s = &t->lin[k];
    const stab_layer *tl = stab_monitor_layer(trace, s->trace_index);
    size_t wo = m->tensors[s->w].offset, bo = s->b == SIZE_MAX ? 0 : m->tensors[s->b].offset;
    t->hs[k] = s->h;
    wo += s->w_off, bo += s->b_off;
    t->shards[k] = (stab_layer){.name = tl->name, .kind = STAB_KIND_LINEAR, .d_in = s->d_in, .d_out = s->d_out,
                                .weight = m->params + wo, .bias = s->b == SIZE_MAX ? NULL : m->params + bo};
    befores[k] = t->shards[k];
    befores[k].weight = t->before + wo, befores[k].bias = t->shards[k].bias ? t->before + bo : NULL;
    t->shard_ptrs[k] = &t->shards[k];
    before_ptrs[k] = &befores[k];
  }
  stab_status st = stab_mpi_linear_measure_batch(t->hs, t->n_lin, t->shard_ptrs, update ? before_ptrs : NULL,
                                                 t->lin_metrics);
  if (st != STAB_OK && first == STAB_OK) {
    cli_error("tensor parallel: the split layers: %s", stab_last_error());
    first = st;
  }
  for (size_t k = 0; k < t->n_lin; k++) stab_monitor_set_metrics(trace, t->lin[k].trace_index, &t->lin_metrics[k], NULL);
  st = measure_heads(t, trace);
  if (first == STAB_OK) first = st;
  if (with_update) t->snapshot_ready = 0;
  return first;
}

size_t train_tp_memory(const train_tp *t) {
  return t ? stab_monitor_memory(t->rep) + stab_monitor_memory(t->heads) + t->tp->local.n_params * sizeof(float)
           : 0;
}

void train_tp_free(train_tp *t) {
  if (!t) return;
  for (size_t k = 0; k < t->n_lin; k++) stab_mpi_linear_free(t->lin[k].h);
  stab_monitor_free(t->rep);
  stab_monitor_free(t->heads);
  free(t->rep_trace), free(t->heads_trace), free(t->lin), free(t->before), free(t->mine), free(t->all), free(t->bounds);
  free(t->hs), free(t->shards), free(t->shard_ptrs), free(t->lin_metrics);
  free(t);
}
