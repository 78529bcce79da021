/* model_tp.h — the transformer of model.h split across the ranks of a tensor-parallel run
 * (Megatron-style): each rank holds the q, k and v rows of its H / P heads and the matching
 * c_attn bias entries (column-parallel), the columns of attn.c_proj that read those heads
 * (row-parallel), the rows of mlp.c_fc and its bias entries (column-parallel) and the columns of
 * mlp.c_proj that read them (row-parallel); embeddings, norms, the row-parallel layers' biases
 * and the LM head are replicated. Every rank runs the whole batch. Forward: one sum over the
 * ranks of the activations after each row-parallel layer; backward: one of the input gradients
 * before each column-parallel layer; sums in rank order (train_world_sum), so that every rank's
 * replicated values, and so its replicated gradients, are the same bits.
 * model_tp.c, built with ./configure --with-mpi only; without it these are never reached.
 * Harness code: failures come back by return value (and a message on stderr for MPI's). */
#ifndef STAB_HARNESS_MODEL_TP_H
#define STAB_HARNESS_MODEL_TP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "train_world.h"

/* How a tensor is cut among the ranks. */
typedef enum {
  TP_WHOLE = 0, /* replicated: every rank the whole tensor */
  TP_OUT = 1,   /* by outputs: a weight's rows, a bias's entries, 1/P of each block (q, k, v) */
  TP_IN = 2     /* by inputs: a weight's columns */
} tp_split;

typedef struct {
  model local;     /* local.c the whole model's config; local.tensors this rank's shapes, in the
                      whole model's order and under its names; local.params and local.grads
                      this rank's slices (its activations are not used) */
  tp_split *split; /* (local.n_tensors) */
  model_tensor *whole_tensors; /* (local.n_tensors) the whole model's table */
  size_t whole_params; /* the whole model's n_params */
  train_world *w;
  size_t P, rank;  /* ranks, this one */
  size_t Dl, Hl, Fl; /* this rank's width of q (and k, v), heads, and MLP width: D/P, H/P, 4D/P */
  /* activations for batches of up to B x T, laid out by model_tp.c */
  size_t B, T, n_acts;
  float *acts, *dacts;
  float *partial;  /* (B, T, D) a row-parallel layer's output before the sum */
  float *scratch;  /* (T, T) attention backward */
  float *gathered; /* (P, local.n_params) every rank's slices, for model_tp_gather */
  int32_t *tokens, *targets; /* (B, T) */
  size_t b, t;
  float loss;
} model_tp;

#if TRAIN_WITH_MPI

/* The split of tensor i of the whole model (its name decides: model.c's table). */
tp_split model_tp_split_of(const model_tensor *t);

/* This rank's part of the whole model (initialised, or loaded from a checkpoint): the table
 * and its slices of whole->params. P = the world's size. Returns 0; -1 when the heads or the
 * width are not divisible by P (the caller has said why); -2 out of memory. */
int model_tp_create(model_tp *tp, const model *whole, train_world *w);
void model_tp_free(model_tp *tp);

/* local (local.n_params) = this rank's slices of whole (laid out as the whole model's params):
 * the weights, or AdamW's moments. */
void model_tp_scatter(const model_tp *tp, const float *whole, float *local);

/* Collective: whole (the whole model's n_params) on every rank = every rank's slices of local
 * put in place. Returns 0, or 1 with the message on stderr. */
int model_tp_gather(model_tp *tp, const float *local, float *whole);

/* As model_forward and model_backward, on every rank with the same batch. Collective.
 * forward: the mean cross-entropy, the same bits on every rank, NaN on bad input or a failed
 * sum. backward: 0, or 1 when a sum failed (message on stderr). Gradients into local.grads
 * (zeroed by the caller: model_zero_grad(&tp->local)). */
float model_tp_forward(model_tp *tp, const int32_t *tokens, const int32_t *targets, size_t b, size_t t);
int model_tp_backward(model_tp *tp);

/* Residual stream after block l (l = -1: the embeddings), (b, t, D) of the last forward:
 * replicated, the same on every rank. */
const float *model_tp_residual(const model_tp *tp, int l);

/* The replicated tensors of local (laid out as local.params), one after another, into out
 * (NULL: only counts); returns their floats. Every rank's should be the same bits. */
size_t model_tp_replicated(const model_tp *tp, const float *local, float *out);

#else

static inline int model_tp_create(model_tp *tp, const model *whole, train_world *w) {
  return (void)tp, (void)whole, (void)w, -1;
}
static inline void model_tp_free(model_tp *tp) { (void)tp; }
static inline void model_tp_scatter(const model_tp *tp, const float *whole, float *local) {
  (void)tp, (void)whole, (void)local;
}
static inline int model_tp_gather(model_tp *tp, const float *local, float *whole) {
  return (void)tp, (void)local, (void)whole, 1;
}
static inline float model_tp_forward(model_tp *tp, const int32_t *tokens, const int32_t *targets, size_t b,
                                     size_t t) {
  return (void)tp, (void)tokens, (void)targets, (void)b, (void)t, NAN;
}
static inline int model_tp_backward(model_tp *tp) { return (void)tp, 1; }
static inline const float *model_tp_residual(const model_tp *tp, int l) { return (void)tp, (void)l, NULL; }
static inline size_t model_tp_replicated(const model_tp *tp, const float *local, float *out) {
  return (void)tp, (void)local, (void)out, 0;
}

#endif

#endif /* STAB_HARNESS_MODEL_TP_H */
