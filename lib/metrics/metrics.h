/* metrics.h — one layer's metrics and the monitor's internals (lib/metrics/): what a layer is
 * (its descriptor checked and resolved to its storage), which registered layers share stored
 * numbers, and measuring one layer. Never installed. */
#ifndef STABMETER_METRICS_H
#define STABMETER_METRICS_H

#include "engine/engine.h"

/* ---- a layer: its descriptor checked and resolved (layer.c; stab_kind_name too) ---- */

/* Where a layer's numbers sit in memory, resolved and validated from its descriptor. */
typedef struct {
  size_t d_in, d_out;     /* the layer's sizes in its kind's math, y = x W with W d_in x d_out:
                             a table's from its vocab and width (embedding V x d, lm_head d x V),
                             every other kind's as given */
  size_t rows, cols, ld;  /* the stored matrix (gain, bias: 1 x d) */
  int items_are_rows;     /* embedding, lm_head: the token/class vectors are rows */
  size_t heads, dh;       /* attention: heads and head width */
  size_t kv_heads;        /* attention: key heads (heads unless grouped-query) */
  size_t block_rows, block_cols, block_step; /* attention: one head's block, and the offset
                                                in elements from one head to the next */
} stabi_shape;

/* Validates a layer (who names the caller in messages) and resolves its storage. */
stab_status stabi_layer_shape(const stab_layer *l, const char *who, stabi_shape *out);
/* A layer name (not NULL) is valid UTF-8, else STAB_EINVAL naming the byte offset: names go
 * into messages, JSON reports and HDF5 UTF-8 strings, and the message does not echo the bytes. */
stab_status stabi_check_name(const char *who, const char *name);
/* The layer's name for messages: "(unnamed)" when it has none. */
static inline const char *stabi_layer_name(const stab_layer *l) { return l->name ? l->name : "(unnamed)"; }

/* ---- one layer's metrics (layer_metrics.c) ---- */

/* ---- which registered layers share stored numbers (monitor.c, shared_storage.c) ---- */

/* The resolved storage of the monitor's layer i, as registered; NULL when i is out of range. */
const stabi_shape *stabi_monitor_shape(const stab_monitor *m, size_t i);

/* One tensor registered twice (a tied embedding and LM head), or a layer whose weights point
 * into another's (q and k inside a fused qkv linear), found from the address ranges of every
 * layer's stored numbers (weight, weight_k, bias), so that counting parameters per layer does
 * not count a parameter twice. */
typedef struct {
  int64_t *unique;  /* (n_layers) stored numbers (elements of the layer's dtype) of the layer
                       that no layer registered before it holds: the sum over layers is the
                       number of distinct parameters */
  size_t **with;    /* (n_layers) the other layers holding at least one of its numbers, ascending */
  size_t *n_with;   /* (n_layers) */
  size_t n_layers;
} stabi_sharing;

/* Fills *out for every layer of m (who names the caller in messages). STAB_ENOMEM. */
stab_status stabi_sharing_find(const stab_monitor *m, const char *who, stabi_sharing *out);
/* Frees what stabi_sharing_find allocated; a zeroed struct is a no-op. */
void stabi_sharing_free(stabi_sharing *s);

/* The update of a layer: dW = w - w_sub (w_sub NULL: dW = w), same for bias and key. */
typedef struct {
  const float *w, *w_sub, *b, *b_sub, *k, *k_sub;
  stab_dtype wt, sub_t;   /* how w, b, k and how w_sub, b_sub, k_sub are stored (0: F32) */
} stabi_delta;

/* Everything a measurement borrows. ws must fit the layer's blocks; work holds
 * stabi_layer_work() doubles. */
typedef struct {
  stab_spectral_workspace *ws;
  double *work;
  stab_tight_method tight;
  float *rowbuf;          /* 2 * stabi_layer_rowbuf() floats: rows of 16-bit layers as f32; may
                             be NULL for F32 layers, which are read in place */
  stabi_items_reduce *shards; /* a table split by vocabulary (stab_table_metrics_reduced), else NULL */
} stabi_ctx;

/* Floats of ctx->rowbuf a layer of this shape needs per operand (A, B). */
size_t stabi_layer_rowbuf(const stabi_shape *sh);

size_t stabi_layer_work(const stabi_shape *sh, stab_tight_method tight);
/* Doubles of warm-start state a layer keeps between measurements. */
size_t stabi_warm_len(const stab_layer *l, const stabi_shape *sh);

/* Measures one layer. delta NULL: no update. warm: stabi_warm_len() doubles kept by the
 * caller between steps (zeros the first time), or NULL for cold starts. heads_out: attention
 * per-head bounds (heads doubles) or NULL. */
/* Metrics before any measurement: every value NaN, no flags. */
void stabi_layer_measure_clear(stab_metrics *m);

stab_status stabi_layer_measure(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                                const stabi_delta *delta, double *warm, stab_metrics *out,
                                double *heads_out);

#endif /* STABMETER_METRICS_H */
