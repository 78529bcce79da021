/* model.h — a small decoder-only transformer (GPT-2 shaped, RMSNorm) in plain C with
 * OpenBLAS sgemm: forward, full backward, parameters in one flat buffer described by a
 * table of tensors with PyTorch names and out-major ([out][in]) layouts.
 *
 * Dimension letters, used in every shape comment:
 *   V vocabulary, D width, L blocks, H heads, hs = D/H head size, T context (positions
 *   allocated), B batch, t <= T the length of the current sequences.
 * Harness code: reports failures by return value, never prints or exits. */
#ifndef STAB_HARNESS_MODEL_H
#define STAB_HARNESS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "stabmeter.h"

typedef struct {
  size_t vocab;   /* V */
  size_t width;   /* D; divisible by heads */
  size_t depth;   /* L */
  size_t heads;   /* H */
  size_t context; /* T: positions of wpe, the longest sequence */
  int biases;     /* 1: every linear layer has a bias */
  int untied;     /* 1: a separate lm_head.weight; 0: the head is wte */
  int attn_inverse; /* 0: attention logits scaled by 1/sqrt(hs) (GPT-2); 1: by 1/hs (muP) */
} model_config;

/* The attention logits' scale s of that config: 1/sqrt(hs), or 1/hs with attn_inverse. One
 * home for it, so that the model, its tensor-parallel split and the monitor's logit bound
 * s hs F_q F_k all use the same number. */
float model_attn_scale(const model_config *c);

/* One parameter tensor: rows x cols floats at params + offset (gains and biases: rows 1).
 * Linear layers are out-major: rows = d_out, cols = d_in. blocks > 1 means the rows are
 * that many stacked matrices of rows/blocks rows each (attn.c_attn: q, k, v). */
typedef struct {
  char name[64];
  stab_kind kind; /* linear, embedding (wte, wpe), lm_head (untied head), gain, bias */
  size_t rows, cols, blocks;
  size_t offset, size;
} model_tensor;

/* Pointers to one block's tensors inside a flat buffer (params or grads). Bias pointers are
 * NULL without biases. */
typedef struct {
  float *ln1w;      /* (D) */
  float *qkvw;      /* (3D, D)  q rows 0..D-1, k rows D..2D-1, v rows 2D..3D-1 */
  float *qkvb;      /* (3D) */
  float *attprojw;  /* (D, D) */
  float *attprojb;  /* (D) */
  float *ln2w;      /* (D) */
  float *fcw;       /* (4D, D) */
  float *fcb;       /* (4D) */
  float *fcprojw;   /* (D, 4D) */
  float *fcprojb;   /* (D) */
} model_block;

typedef struct {
  model_config c;
  size_t n_tensors;
  model_tensor *tensors;
  size_t n_params;
  float *params; /* (n_params) */
  float *grads;  /* (n_params) same table */
  /* activations, allocated for B x T by model_forward's first call (or model_reserve) */
  size_t B, T;
  size_t n_acts;
  float *acts;   /* every forward buffer, see model.c */
  float *dacts;  /* their gradients */
  float *scratch;/* (T, T) attention backward */
  int32_t *tokens, *targets; /* (B, T) copies of the last batch */
  size_t b, t;   /* shape of the last forward */
  float loss;    /* mean cross-entropy of the last forward; NaN if none */
} model;

/* The tensor table and zeroed buffers. Returns 0, or -1 on a bad config (zero sizes, width
 * not divisible by heads) or -2 when out of memory. */
int model_create(model *m, const model_config *c);
void model_free(model *m);

/* Allocates activations for batches of up to B sequences of up to T (<= context) tokens.
 * 0, -1 bad sizes, -2 out of memory. */
int model_reserve(model *m, size_t B, size_t T);

/* The tensor of that name, or NULL. */
const model_tensor *model_find(const model *m, const char *name);
/* Pointers of block l inside base (m->params or m->grads). */
model_block model_block_at(const model *m, float *base, size_t l);
/* Where wte, wpe, ln_f and the head (wte when tied) live inside base. */
float *model_wte(const model *m, float *base);
float *model_wpe(const model *m, float *base);
float *model_lnf(const model *m, float *base);
float *model_head(const model *m, float *base);

/* Initialisation: gpt2 = std 0.02 for weights (c_proj layers 0.02/sqrt(2L)), gains 1,
 * biases 0; otherwise the articles' per-kind init (stab_init_std). Deterministic in seed. */
void model_init_params(model *m, uint64_t seed, int gpt2);

/* Forward over b sequences of t tokens (t <= context; grows the activations if needed;
 * tokens and targets in [0, V)). targets NULL: logits only. Returns the mean cross-entropy,
 * NaN without targets, and NaN on bad sizes, an out-of-range token or no memory. */
float model_forward(model *m, const int32_t *tokens, const int32_t *targets, size_t b, size_t t);

/* Zeroes m->grads. */
void model_zero_grad(model *m);

/* Accumulates d loss / d params into m->grads for the last forward (which needs targets). */
void model_backward(model *m);

/* The logits (b, t, V) of the last forward. */
const float *model_logits(const model *m);

/* Residual stream after block l (l = -1: the embeddings), (B, T, D) of the last forward. */
const float *model_residual(const model *m, int l);

#endif /* STAB_HARNESS_MODEL_H */
