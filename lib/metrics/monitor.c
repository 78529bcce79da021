/* monitor.c — the per-step monitor: layers registered once with every buffer allocated then
 * (warm-start vectors, snapshot copies, a spectral workspace per measuring thread), and a
 * measurement every step that allocates nothing.
 *
 * A step measures its layers on several threads, one layer each, largest first, each claimed
 * by whichever thread is free (pass_pool.c). Most layers are small and their passes short, and
 * the serial work between passes (the Lanczos vectors, LAPACK on the small projected problem)
 * left a second core idle when both shared one pass; sharing nothing, the threads also never
 * wait for each other while another program holds the cores. A layer's numbers depend only on
 * its weights and its own warm vectors, so they are the same bits on any thread. */
#include "metrics/metrics.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  stab_layer layer;   /* the caller's descriptor, name pointing at our copy, d_in/d_out filled in */
  stabi_shape shape;
  double *warm;       /* warm-start vectors, stabi_warm_len doubles */
  void *snap_w, *snap_b; /* SNAPSHOT mode: the weights before the step, byte copies in the
                             layer's dtype (stride kept): exact, and a 16-bit layer's half the
                             memory of an f32 copy */
  size_t snap_len;    /* elements in snap_w */
  const float *given_w, *given_b; /* GIVEN mode */
  stab_metrics metrics;
  stab_metrics reference; /* forward, dependency, update at the first measurement where each was
                             finite and > 0 (NaN until then); the other fields NaN (counts 0) */
  double *heads;      /* attention: per-head bounds */
  int external;       /* stab_monitor_add_external: no weights here, metrics set from elsewhere */
} entry;

/* What one measuring thread borrows: layers do not share buffers. */
typedef struct {
  stab_spectral_workspace *ws; /* NULL until a layer has a spectral block */
  double *work;
  size_t work_len;
  float *rowbuf;               /* rows of 16-bit layers as f32 (stabi_ctx.rowbuf); NULL until a
                                  16-bit layer is registered */
  size_t rowbuf_len;           /* floats in rowbuf */
  stab_status st;              /* this step: the failure of its earliest layer that failed */
  size_t failed_at;            /* that layer (SIZE_MAX: none) */
  char message[512];           /* its stab_last_error() */
} slot;

/* Threads a step measures layers on, at most: each holds a workspace as large as the largest
 * layer needs (its Lanczos basis alone krylov_dim x cols doubles, 3 MiB at 3072 columns), and
 * more threads would only queue for the same memory. */
#define MONITOR_MAX_THREADS 8

struct stab_monitor {
  stab_monitor_params params;
  entry *layers;
  size_t count, cap;
  size_t *order;      /* (cap) the layers, largest stored matrix first (ties: registration) */
  slot *slots;        /* (threads) */
  int threads;        /* the params' threads, resolved */
  int ready;          /* slots with buffers for every registered layer: min(threads, measured) */
  size_t measured;    /* layers read here: count less the external ones, which grow no slot */
  size_t max_rows, max_cols; /* the largest spectral block's sides so far */
  size_t max_work;    /* the most doubles of work a layer needs (stabi_layer_work) */
  size_t max_rowbuf;  /* the most floats of row buffers a 16-bit layer needs (0: none so far) */
  size_t max_whole;   /* the largest 16-bit spectral block's elements (stabi_spectral_reserve_whole) */
  int snapshot_ready;
  size_t bytes;
  size_t *by_name;    /* (name_cap) open-addressed index of the layers by name: i + 1, 0 empty,
                         so that registering n layers costs O(n), not n^2 / 2 name compares */
  size_t name_cap;    /* a power of two, at least twice count once any layer is registered */
  stabi_idle_turn idle; /* stab_monitor_measure_idle's priority */
};

/* FNV-1a of a layer's name: the name index's hash. */
static size_t name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325u;
  for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001b3u;
  return (size_t)h;
}

/* The slot of name in the index: the one holding it, or the empty one where it would go. */
static size_t *name_slot(const stab_monitor *m, const char *name) {
  size_t mask = m->name_cap - 1, k = name_hash(name) & mask;
  while (m->by_name[k] && strcmp(m->layers[m->by_name[k] - 1].layer.name, name) != 0) k = (k + 1) & mask;
  return &m->by_name[k];
}

/* Room in the index for one layer more, at most half full (rebuilt twice as large). */
static stab_status name_room(stab_monitor *m, const char *who) {
  if (2 * (m->count + 1) <= m->name_cap) return STAB_OK;
  size_t cap = m->name_cap ? 2 * m->name_cap : 64;
  size_t *grown = calloc(cap, sizeof *grown);
  if (!grown) return stabi_fail(STAB_ENOMEM, "%s: out of memory for the layer table", who);
  free(m->by_name);
  m->by_name = grown;
  m->name_cap = cap;
  for (size_t i = 0; i < m->count; i++) *name_slot(m, m->layers[i].layer.name) = i + 1;
  return STAB_OK;
}

stab_monitor_params stab_monitor_default_params(void) {
  stab_monitor_params p;
  p.metrics = stab_metrics_default_params();
  p.update_mode = STAB_UPDATE_SNAPSHOT;
  return p;
}

stab_status stab_monitor_create(const stab_monitor_params *params, stab_monitor **out) {
  if (!out) return stabi_fail(STAB_EINVAL, "stab_monitor_create: out is NULL");
  *out = NULL;
  stab_monitor_params p = params ? *params : stab_monitor_default_params();
  if (p.update_mode != STAB_UPDATE_NONE && p.update_mode != STAB_UPDATE_SNAPSHOT &&
      p.update_mode != STAB_UPDATE_GIVEN)
    return stabi_fail(STAB_EINVAL, "stab_monitor_create: unknown update mode %d", (int)p.update_mode);
  if (p.metrics.tight != STAB_TIGHT_CENTRED && p.metrics.tight != STAB_TIGHT_EXACT &&
      p.metrics.tight != STAB_TIGHT_NONE)
    return stabi_fail(STAB_EINVAL, "stab_monitor_create: unknown tight method %d", (int)p.metrics.tight);
  stab_status st = stabi_spectral_check(&p.metrics.spectral, "stab_monitor_create");
  if (st != STAB_OK) return st;
  stab_monitor *m = calloc(1, sizeof *m);
  int threads = stabi_pool_threads(p.metrics.spectral.threads);
  if (threads > MONITOR_MAX_THREADS) threads = MONITOR_MAX_THREADS;
  if (m && !(m->slots = calloc((size_t)threads, sizeof *m->slots))) {
    free(m);
    m = NULL;
  }
  if (!m) return stabi_fail(STAB_ENOMEM, "stab_monitor_create: out of memory");
  m->threads = threads;
  m->params = p;
  m->bytes = sizeof *m;
  stabi_idle_turn_init(&m->idle);
  *out = m;
  return STAB_OK;
}

static void free_entry(entry *e) {
  free((char *)e->layer.name);
  free(e->warm);
  free(e->snap_w);
  free(e->snap_b);
  free(e->heads);
}

void stab_monitor_free(stab_monitor *m) {
  if (!m) return;
  for (size_t i = 0; i < m->count; i++) free_entry(&m->layers[i]);
  free(m->layers);
  free(m->order);
  free(m->by_name);
  for (int s = 0; s < m->threads; s++) {
    stab_spectral_workspace_free(m->slots[s].ws);
    free(m->slots[s].work);
    free(m->slots[s].rowbuf);
  }
  free(m->slots);
  stabi_idle_turn_destroy(&m->idle);
  free(m);
}

size_t stab_monitor_layer_count(const stab_monitor *m) { return m ? m->count : 0; }

const stabi_shape *stabi_monitor_shape(const stab_monitor *m, size_t i) {
  return m && i < m->count ? &m->layers[i].shape : NULL;
}

const stab_layer *stab_monitor_layer(const stab_monitor *m, size_t index) {
  return m && index < m->count ? &m->layers[index].layer : NULL;
}

stab_status stab_monitor_find(const stab_monitor *m, const char *name, size_t *index) {
  if (!m || !name) return stabi_fail(STAB_EINVAL, "stab_monitor_find: %s is NULL", !m ? "monitor" : "name");
  size_t i = m->count ? *name_slot(m, name) : 0;
  if (i) {
    if (index) *index = i - 1;
    return STAB_OK;
  }
  return stabi_fail(STAB_ENOTFOUND, "stab_monitor_find: no layer named '%s'", name);
}

/* The spectral blocks of a layer: the whole matrix, or one head's block. */
static void spectral_block(const stab_layer *l, const stabi_shape *sh, size_t *rows, size_t *cols) {
  *rows = l->kind == STAB_KIND_ATTENTION ? sh->block_rows : sh->rows;
  *cols = l->kind == STAB_KIND_ATTENTION ? sh->block_cols : sh->cols;
}

static int has_spectral(const stab_layer *l) {
  return l->kind == STAB_KIND_LINEAR || l->kind == STAB_KIND_ATTENTION;
}

/* Gives every slot a layer may be measured on (one more than now, up to the threads, for
 * the layer being added) buffers that fit that layer too: a 16-bit layer's also the f32 rows
 * its sums read and the f32 copy its spectral estimates convert a small block into, so that
 * measuring it allocates nothing. Grows buffers only, so a failure leaves the monitor able to
 * measure the layers it has. */
static stab_status grow_slots(stab_monitor *m, const stab_layer *l, const stabi_shape *sh, size_t work_len,
                              const char *who) {
  /* what every slot must hold: the largest of each need over all the layers, since any slot
   * may measure any layer (a slot first used for a small layer measures a large one later) */
  size_t r = m->max_rows, c = m->max_cols, whole = m->max_whole;
  size_t work = work_len > m->max_work ? work_len : m->max_work, rowbuf = m->max_rowbuf;
  const int wide = l->dtype != STAB_DTYPE_F32;
  if (has_spectral(l)) {
    size_t lr, lc;
    spectral_block(l, sh, &lr, &lc);
    if (lr > r) r = lr;
    if (lc > c) c = lc;
    const size_t n = stabi_mul(lr, lc); /* converted whole up to STABI_WHOLE_FLOATS, else by tiles */
    if (wide && n <= STABI_WHOLE_FLOATS && n > whole) whole = n;
  }
  if (wide && 2 * stabi_layer_rowbuf(sh) > rowbuf) rowbuf = 2 * stabi_layer_rowbuf(sh);
  const int want = m->count + 1 < (size_t)m->threads ? (int)m->count + 1 : m->threads;
  for (int s = 0; s < want; s++) {
    slot *t = &m->slots[s];
    stab_status st = STAB_OK;
    if (r && !t->ws) st = stab_spectral_workspace_create(r, c, &m->params.metrics.spectral, &t->ws);
    else if (r) st = stabi_spectral_reserve(t->ws, r, c);
    if (st == STAB_OK && whole) st = stabi_spectral_reserve_whole(t->ws, whole, 1);
    if (st != STAB_OK) return st;
    if (rowbuf > t->rowbuf_len) {
      float *b = rowbuf <= (size_t)-1 / sizeof *b ? realloc(t->rowbuf, rowbuf * sizeof *b) : NULL;
      if (!b) return stabi_fail(STAB_ENOMEM, "%s: layer '%s': out of memory for its row buffers", who, l->name);
      t->rowbuf = b;
      t->rowbuf_len = rowbuf;
    }
    if (work > t->work_len) {
      double *w = work <= (size_t)-1 / sizeof *w ? realloc(t->work, work * sizeof *w) : NULL;
      if (!w) return stabi_fail(STAB_ENOMEM, "%s: layer '%s': out of memory for its workspace", who, l->name);
      t->work = w;
      t->work_len = work;
    }
  }
  m->max_rows = r;
  m->max_cols = c;
  m->max_work = work;
  m->max_rowbuf = rowbuf;
  m->max_whole = whole;
  return STAB_OK;
}

/* Numbers a layer's measurement reads: what orders the layers of a step, largest first, so
 * that the last layers left to a step's threads are its smallest. */
static size_t layer_size(const entry *e) {
  size_t n = e->shape.rows * e->shape.cols;
  return e->layer.kind == STAB_KIND_ATTENTION ? 2 * n : n;
}

/* Puts layer i (just registered) into m->order. */
static void insert_in_order(stab_monitor *m, size_t i) {
  const size_t size = layer_size(&m->layers[i]);
  size_t at = i;
  while (at > 0 && layer_size(&m->layers[m->order[at - 1]]) < size) at--;
  memmove(m->order + at + 1, m->order + at, (i - at) * sizeof *m->order);
  m->order[at] = i;
}

/* Registers a layer; external: no weights are read, so no warm vectors, snapshot or
 * workspace are needed, only its shape, name and head bounds (stab_monitor_add_external). */
static stab_status add_entry(stab_monitor *m, const stab_layer *layer, size_t *index, int external,
                             const char *who) {
  if (!m || !layer) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !m ? "monitor" : "layer");
  if (!layer->name || !layer->name[0]) return stabi_fail(STAB_EINVAL, "%s: a layer needs a name", who);
  stab_status st = stabi_check_name(who, layer->name);
  if (st != STAB_OK) return st;
  if ((st = name_room(m, who)) != STAB_OK) return st;
  if (*name_slot(m, layer->name))
    return stabi_fail(STAB_EEXIST, "%s: a layer named '%s' is already registered", who, layer->name);
  entry e;
  memset(&e, 0, sizeof e);
  st = stabi_layer_shape(layer, who, &e.shape);
  if (st != STAB_OK) return st;
  const size_t esz = stabi_dtype_size(layer->dtype); /* stabi_layer_shape refused the others */
  e.layer = *layer;
  /* d_in and d_out in the kind's math for every kind, a table's included (given as vocab and
   * width): what stab_monitor_layer shows, and what the trace records per layer as before. */
  e.layer.d_in = e.shape.d_in;
  e.layer.d_out = e.shape.d_out;
  e.external = external;
  const int snapshot = !external && m->params.update_mode == STAB_UPDATE_SNAPSHOT &&
                       layer->kind != STAB_KIND_ATTENTION;
  const size_t warm_len = external ? 0 : stabi_warm_len(layer, &e.shape);
  const size_t work_len = stabi_layer_work(&e.shape, m->params.metrics.tight);
  size_t bytes = 0;
  int failed = 0;

  /* Grow what is shared first: on failure nothing of the monitor's state is lost. */
  st = external ? STAB_OK : grow_slots(m, layer, &e.shape, work_len, who);
  if (st != STAB_OK) return st;
  if (m->count == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 16;
    entry *grown = realloc(m->layers, cap * sizeof *grown);
    if (!grown) return stabi_fail(STAB_ENOMEM, "%s: out of memory for the layer table", who);
    m->layers = grown;
    size_t *order = realloc(m->order, cap * sizeof *order);
    if (!order) return stabi_fail(STAB_ENOMEM, "%s: out of memory for the layer table", who);
    m->order = order;
    m->cap = cap;
  }
  size_t nlen = strlen(layer->name) + 1;
  char *name = malloc(nlen);
  if (!name) failed = 1;
  else memcpy(name, layer->name, nlen);
  e.layer.name = name;
  if (warm_len && !(e.warm = calloc(warm_len, sizeof *e.warm))) failed = 1;
  bytes += nlen + warm_len * sizeof(double);
  if (snapshot) {
    e.snap_len = (e.shape.rows - 1) * e.shape.ld + e.shape.cols;
    if (!(e.snap_w = malloc(e.snap_len * esz))) failed = 1;
    bytes += e.snap_len * esz;
    if (layer->kind == STAB_KIND_LINEAR && layer->bias) {
      if (!(e.snap_b = malloc(layer->d_out * esz))) failed = 1;
      bytes += layer->d_out * esz;
    }
  }
  if (layer->kind == STAB_KIND_ATTENTION) {
    if (!(e.heads = malloc(e.shape.heads * sizeof *e.heads))) failed = 1;
    bytes += e.shape.heads * sizeof(double);
  }
  if (failed) {
    free_entry(&e);
    return stabi_fail(STAB_ENOMEM, "%s: layer '%s': out of memory", who, layer->name);
  }
  for (size_t h = 0; h < e.shape.heads; h++) e.heads[h] = NAN;
  stabi_layer_measure_clear(&e.metrics);
  stabi_layer_measure_clear(&e.reference);
  m->layers[m->count] = e;
  *name_slot(m, e.layer.name) = m->count + 1;
  insert_in_order(m, m->count);
  if (index) *index = m->count;
  m->count++;
  /* an external layer grows no slot, so it must not make one ready: a step's thread on a slot
   * without buffers would measure a layer with a NULL workspace */
  if (!external) m->measured++;
  m->ready = m->measured < (size_t)m->threads ? (int)m->measured : m->threads;
  m->bytes += bytes;
  return STAB_OK;
}

stab_status stab_monitor_add_layer(stab_monitor *m, const stab_layer *layer, size_t *index) {
  return add_entry(m, layer, index, 0, "stab_monitor_add_layer");
}

/* A layer held elsewhere (its shards on other processes, a checkpoint): the shape is checked as
 * stab_monitor_add_layer checks it, with stand-ins for the pointers it does not read. */
stab_status stab_monitor_add_external(stab_monitor *m, const stab_layer *layer, size_t *index) {
  static const char who[] = "stab_monitor_add_external";
  if (!m || !layer) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !m ? "monitor" : "layer");
  stab_layer l = *layer;
  static const float none = 0.0f; /* never read: only its address passes the checks */
  l.weight = &none;
  if (l.kind == STAB_KIND_ATTENTION) l.weight_k = &none;
  size_t i;
  stab_status st = add_entry(m, &l, &i, 1, who);
  if (st != STAB_OK) return st;
  m->layers[i].layer.weight = layer->weight; /* as given: stab_monitor_layer shows the caller's */
  m->layers[i].layer.weight_k = layer->weight_k;
  if (index) *index = i;
  return STAB_OK;
}

stab_status stab_monitor_snapshot(stab_monitor *m) {
  if (!m) return stabi_fail(STAB_EINVAL, "stab_monitor_snapshot: monitor is NULL");
  if (m->params.update_mode != STAB_UPDATE_SNAPSHOT)
    return stabi_fail(STAB_ESTATE, "stab_monitor_snapshot: the monitor was not created in snapshot mode");
  for (size_t i = 0; i < m->count; i++) {
    entry *e = &m->layers[i];
    if (e->external) continue;
    const size_t esz = stabi_dtype_size(e->layer.dtype);
    if (e->snap_w) memcpy(e->snap_w, e->layer.weight, e->snap_len * esz);
    if (e->snap_b) memcpy(e->snap_b, e->layer.bias, e->layer.d_out * esz);
  }
  m->snapshot_ready = 1;
  return STAB_OK;
}

stab_status stab_monitor_set_update(stab_monitor *m, size_t index, const float *weight_update,
                                    const float *bias_update) {
  static const char who[] = "stab_monitor_set_update";
  if (!m) return stabi_fail(STAB_EINVAL, "%s: monitor is NULL", who);
  if (m->params.update_mode != STAB_UPDATE_GIVEN)
    return stabi_fail(STAB_ESTATE, "%s: the monitor was not created in given-update mode", who);
  if (index >= m->count)
    return stabi_fail(STAB_ENOTFOUND, "%s: no layer %zu (%zu registered)", who, index, m->count);
  entry *e = &m->layers[index];
  if (!weight_update)
    return stabi_fail(STAB_EINVAL, "%s: layer '%s': weight_update is NULL", who, e->layer.name);
  if (e->layer.bias && !bias_update)
    return stabi_fail(STAB_EINVAL, "%s: layer '%s' has a bias: bias_update is needed", who, e->layer.name);
  e->given_w = weight_update;
  e->given_b = e->layer.bias ? bias_update : NULL;
  return STAB_OK;
}

/* The update of one layer for this measurement, or NULL if it has none: the snapshot and a
 * given update are stored as the layer is. */
static const stabi_delta *layer_delta(const stab_monitor *m, const entry *e, stabi_delta *d) {
  memset(d, 0, sizeof *d);
  if (e->layer.kind == STAB_KIND_ATTENTION) return NULL;
  d->wt = d->sub_t = e->layer.dtype;
  if (m->params.update_mode == STAB_UPDATE_SNAPSHOT) {
    d->w = e->layer.weight;
    d->w_sub = e->snap_w;
    d->b = e->layer.bias;
    d->b_sub = e->snap_b;
  } else {
    d->w = e->given_w;
    d->b = e->given_b;
  }
  return d;
}

/* The first finite positive value of each metric is its reference: each on its own, since a
 * step measured without an update has update NaN, and a layer with non-finite weights has NaN
 * metrics until (if ever) they are finite again. */
static void keep_one(double *reference, double value) {
  if (isnan(*reference) && isfinite(value) && value > 0) *reference = value;
}

static void keep_reference(entry *e) {
  keep_one(&e->reference.forward, e->metrics.forward);
  keep_one(&e->reference.dependency, e->metrics.dependency);
  keep_one(&e->reference.update, e->metrics.update);
}

/* A step's layers as pool tasks: task k measures the k-th largest layer with the buffers of
 * the slot of the thread that claimed it. Passes inside find the pool busy and run on that
 * thread alone. */
typedef struct {
  stab_monitor *m;
  int with_update;
  const unsigned char *which; /* the layers to measure, NULL for all */
} step_job;

static void measure_task(void *arg, size_t k, int s) {
  const step_job *job = arg;
  stab_monitor *m = job->m;
  const size_t i = m->order[k];
  if ((job->which && !job->which[i]) || m->layers[i].external) return;
  entry *e = &m->layers[i];
  slot *t = &m->slots[s];
  stabi_ctx ctx = {t->ws, t->work, m->params.metrics.tight, t->rowbuf, NULL};
  stabi_delta d;
  const stabi_delta *dl = job->with_update ? layer_delta(m, e, &d) : NULL;
  stab_status st = stabi_layer_measure(&ctx, &e->layer, &e->shape, dl, e->warm, &e->metrics, e->heads);
  keep_reference(e);
  if (st != STAB_OK && i < t->failed_at) {
    t->failed_at = i;
    t->st = st;
    snprintf(t->message, sizeof t->message, "%s", stab_last_error());
  }
}

stab_status stab_monitor_measure(stab_monitor *m, int with_update) {
  return stab_monitor_measure_some(m, with_update, NULL);
}

/* stab_monitor_measure restricted to the layers of which (all when NULL): a process measuring
 * its share of a model that several hold whole (stabmeter_mpi.h). */
stab_status stab_monitor_measure_some(stab_monitor *m, int with_update, const unsigned char *which) {
  static const char who[] = "stab_monitor_measure";
  if (!m) return stabi_fail(STAB_EINVAL, "%s: monitor is NULL", who);
  if (with_update) {
    if (m->params.update_mode == STAB_UPDATE_NONE)
      return stabi_fail(STAB_ESTATE, "%s: an update was asked of a monitor created without updates", who);
    if (m->params.update_mode == STAB_UPDATE_SNAPSHOT && !m->snapshot_ready)
      return stabi_fail(STAB_ESTATE, "%s: no snapshot since the last measurement; call stab_monitor_snapshot() before the optimizer step", who);
    if (m->params.update_mode == STAB_UPDATE_GIVEN)
      for (size_t i = 0; i < m->count; i++)
        if (m->layers[i].layer.kind != STAB_KIND_ATTENTION && !m->layers[i].external && !m->layers[i].given_w)
          return stabi_fail(STAB_ESTATE, "%s: layer '%s' has no update set (stab_monitor_set_update)", who,
                            m->layers[i].layer.name);
  }
  stab_status first = STAB_OK;
  if (m->ready <= 1) {
    /* one thread: the layers in order, each pass free to use the pool's threads */
    stabi_ctx ctx = {m->slots[0].ws, m->slots[0].work, m->params.metrics.tight, m->slots[0].rowbuf, NULL};
    for (size_t i = 0; i < m->count; i++) {
      if ((which && !which[i]) || m->layers[i].external) continue;
      entry *e = &m->layers[i];
      stabi_delta d;
      const stabi_delta *dl = with_update ? layer_delta(m, e, &d) : NULL;
      stab_status st = stabi_layer_measure(&ctx, &e->layer, &e->shape, dl, e->warm, &e->metrics, e->heads);
      keep_reference(e);
      if (st != STAB_OK && first == STAB_OK) first = st;
    }
  } else {
    for (int s = 0; s < m->ready; s++) m->slots[s].failed_at = SIZE_MAX;
    step_job job = {m, with_update, which};
    stabi_pool_run(m->count, m->ready, measure_task, &job);
    /* the failure of the earliest layer, as the serial order would return it */
    const slot *f = NULL;
    for (int s = 0; s < m->ready; s++)
      if (m->slots[s].failed_at != SIZE_MAX && (!f || m->slots[s].failed_at < f->failed_at)) f = &m->slots[s];
    if (f) {
      stabi_set_last_error(f->message);
      first = f->st;
    }
  }
  if (with_update) m->snapshot_ready = 0;
  return first;
}

/* The measurement and the snapshot between the idle turn's enter and leave (priority.c says
 * why the switch is made here and not by the binding around this call). */
stab_status stab_monitor_measure_idle(stab_monitor *m, uint64_t ticket, int measure, int with_update, int snapshot) {
  if (!m) return stabi_fail(STAB_EINVAL, "stab_monitor_measure_idle: monitor is NULL");
  stabi_idle_enter(&m->idle, ticket);
  stab_status st = measure ? stab_monitor_measure(m, with_update) : STAB_OK;
  if (st == STAB_OK && snapshot) st = stab_monitor_snapshot(m);
  stabi_idle_leave(&m->idle);
  return st;
}

void stab_monitor_hurry(stab_monitor *m, uint64_t ticket) {
  if (m) stabi_idle_hurry(&m->idle, ticket);
}

const stab_metrics *stab_monitor_metrics(const stab_monitor *m, size_t index) {
  return m && index < m->count ? &m->layers[index].metrics : NULL;
}

const double *stab_monitor_head_bounds(const stab_monitor *m, size_t index) {
  return m && index < m->count ? m->layers[index].heads : NULL;
}

stab_status stab_monitor_set_metrics(stab_monitor *m, size_t index, const stab_metrics *metrics,
                                     const double *head_bounds) {
  if (!m || !metrics)
    return stabi_fail(STAB_EINVAL, "stab_monitor_set_metrics: %s is NULL", !m ? "monitor" : "metrics");
  if (index >= m->count)
    return stabi_fail(STAB_ERANGE, "stab_monitor_set_metrics: index %zu, the monitor has %zu layers", index,
                      m->count);
  entry *e = &m->layers[index];
  e->metrics = *metrics;
  keep_reference(e);
  for (size_t h = 0; e->heads && h < e->shape.heads; h++) e->heads[h] = head_bounds ? head_bounds[h] : NAN;
  return STAB_OK;
}

const stab_metrics *stab_monitor_reference(const stab_monitor *m, size_t index) {
  return m && index < m->count ? &m->layers[index].reference : NULL;
}

/* A resumed run's reference, from its trace (stab_trace_reference) or its own records: what is
 * not finite and > 0 stays to be taken from the next measurements. */
stab_status stab_monitor_set_reference(stab_monitor *m, size_t index, const stab_metrics *reference) {
  static const char who[] = "stab_monitor_set_reference";
  if (!m || !reference) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !m ? "monitor" : "reference");
  if (index >= m->count)
    return stabi_fail(STAB_ERANGE, "%s: index %zu, the monitor has %zu layers", who, index, m->count);
  stab_metrics *r = &m->layers[index].reference;
  stabi_layer_measure_clear(r);
  keep_one(&r->forward, reference->forward);
  keep_one(&r->dependency, reference->dependency);
  keep_one(&r->update, reference->update);
  return STAB_OK;
}

size_t stab_monitor_memory(const stab_monitor *m) {
  if (!m) return 0;
  size_t b = m->bytes + m->cap * (sizeof(entry) + sizeof *m->order) + (size_t)m->threads * sizeof(slot);
  for (int s = 0; s < m->threads; s++) {
    b += m->slots[s].work_len * sizeof(double) + m->slots[s].rowbuf_len * sizeof(float);
    if (m->slots[s].ws) b += stabi_spectral_bytes(m->slots[s].ws);
  }
  return b;
}
