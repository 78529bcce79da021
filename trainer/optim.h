/* optim.h — the trainer's two optimizers over a model's flat parameter buffer:
 *  adamw     AdamW (bias-corrected moments, decoupled weight decay on matrices only);
 *  steepest  the articles' steepest descent per layer kind, each step of size lr in its
 *            layer's stability norm: Muon for linear layers (dW = -lr sqrt(d_out/d_in)
 *            msign(G), per block of a fused matrix), row-normalised SGD for embeddings,
 *            class-vector-normalised SGD scaled 1/d for the LM head, SignSGD for gains,
 *            normalised SGD for biases.
 * Harness code: failures are returned, never printed. */
#ifndef STAB_HARNESS_OPTIM_H
#define STAB_HARNESS_OPTIM_H

#include <stddef.h>

#include "model.h"

typedef enum { OPTIM_ADAMW = 0, OPTIM_STEEPEST = 1 } optim_kind;

typedef struct {
  optim_kind kind;
  float beta1, beta2, eps; /* adamw moments; defaults 0.9, 0.95, 1e-8 */
  float weight_decay;      /* decoupled, times lr, on linear, embedding and lm_head weights;
                              default 0.1 for adamw, 0 for steepest */
  int ns_steps;            /* steepest: quintic Newton-Schulz steps of msign; default 5 */
} optim_params;

optim_params optim_default_params(optim_kind kind);

typedef struct {
  optim_params p;
  const model_tensor *tensors; /* the model's table (not owned) */
  size_t n_tensors, n_params;
  float *m, *v;  /* (n_params) adamw moments; NULL for steepest */
  float *dir;    /* (largest tensor) steepest: the direction of one tensor */
  float *work;   /* steepest: msign workspace for the largest linear block */
  long step;     /* steps taken */
} optim;

/* 0, or -2 when out of memory. The table must outlive the optimizer. */
int optim_create(optim *o, const optim_params *p, const model_tensor *tensors, size_t n_tensors,
                 size_t n_params);
void optim_free(optim *o);

/* One step with learning rate lr: params -= update(grads). Returns STAB_OK or the status of
 * a failed msign (non-finite gradient), with stab_last_error() saying which. The parameters
 * of tensors before the failing one are already updated. */
int optim_step(optim *o, float *params, const float *grads, float lr);

#endif /* STAB_HARNESS_OPTIM_H */
