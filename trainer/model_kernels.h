/* model_kernels.h — the transformer's kernels of model.c (output first, then inputs, then sizes)
 * and its forward pass, shared by the whole model (model.c) and the model split across
 * tensor-parallel ranks (model_tp.c), so that both compute each piece with the same code.
 * Shapes as in model.h's letters; N = b t rows. Backward kernels accumulate (+=) into their outputs.
 * Harness code. */
#ifndef STAB_HARNESS_MODEL_KERNELS_H
#define STAB_HARNESS_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* 1 when every one of the n tokens (and targets, when not NULL) is in [0, V), else 0. */
int tokens_in_range(const int32_t *tokens, const int32_t *targets, size_t n, size_t V);

/* out (b, t, D) = wte[token] + wpe[position]; tokens (b, t), wte (V, D), wpe (T, D). */
void encoder_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, size_t b,
                     size_t t, size_t D);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, size_t b,
                      size_t t, size_t D);

/* out (N, D) = g * x / sqrt(mean(x^2) + eps), rstd (N) the row scales; g (D). */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *g, size_t N, size_t D);
void rmsnorm_backward(float *dinp, float *dg, const float *dout, const float *inp, const float *g,
                      const float *rstd, size_t N, size_t D);

/* out (N, OC) = beta out + inp W^T + bias; inp (N, C), w (OC, C) out-major, bias (OC) or NULL. */
void matmul_forward(float *out, const float *inp, const float *w, const float *bias, size_t N, size_t C,
                    size_t OC, float beta);
/* dinp (N, C) += dout W, dw (OC, C) += dout^T inp, dbias (OC) += column sums of dout (NULL: none). */
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, size_t N, size_t C, size_t OC);

/* Causal attention of H heads of size D / H on qkv (b, t, 3D): q, k, v each D wide, head h at
 * columns h D / H of each; logits scale * q k^T (model_attn_scale); out (b, t, D), att
 * (b, H, t, t) the softmax weights. A rank of a tensor-parallel run passes its own heads and
 * width (H / P, D / P). */
void attention_forward(float *out, float *att, const float *qkv, size_t b, size_t t, size_t D, size_t H,
                       float scale);
/* dqkv += d/dqkv; datt is (t, t) scratch; scale as in the forward. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                        size_t b, size_t t, size_t D, size_t H, float scale);

/* GELU, tanh approximation, elementwise over n values. */
void gelu_forward(float *out, const float *inp, size_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* probs (N, V) = softmax(logits); returns the mean of -log p[target] (in f64), 0 without targets. */
double crossentropy_forward(float *probs, const float *logits, const int32_t *targets, size_t N, size_t V);
/* dlogits (N, V) = (probs - onehot(target)) / N. */
void crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets, size_t N, size_t V);

/* ---- the forward pass, whole or split --------------------------------------------- */

/* Every forward buffer; the same layout holds their gradients. Dl, Hl and Fl are the widths a
 * process holds of the attention (D), its heads (H) and the MLP (4D): whole in one process,
 * 1/P of each on a rank of a tensor-parallel run (model_tp.h). */
typedef struct {
  float *encoded;  /* (B, T, D) */
  float *ln1;      /* (L, B, T, D) */
  float *ln1_rstd; /* (L, B, T) */
  float *qkv;      /* (L, B, T, 3 Dl) q, k, v of this process's heads */
  float *atty;     /* (L, B, T, Dl) attention output before c_proj */
  float *att;      /* (L, B, Hl, T, T) softmax weights */
  float *res2;     /* (L, B, T, D) residual after attention */
  float *ln2;      /* (L, B, T, D) */
  float *ln2_rstd; /* (L, B, T) */
  float *fch;      /* (L, B, T, Fl) */
  float *fch_gelu; /* (L, B, T, Fl) */
  float *res3;     /* (L, B, T, D) residual after the block */
  float *lnf;      /* (B, T, D) */
  float *lnf_rstd; /* (B, T) */
  float *logits;   /* (B, T, V) */
  float *probs;    /* (B, T, V) */
} model_acts;

/* Lays the buffers of config c at widths Dl, Hl, Fl out from base (NULL: only counts) for B
 * sequences of T positions; returns the floats needed. */
size_t model_acts_layout(const model_config *c, size_t Dl, size_t Hl, size_t Fl, float *base, size_t B, size_t T,
                         model_acts *a);

/* The output of a block's attention or MLP (c_proj, mlp.c_proj): out (N, D) = residual + inp W^T
 * + bias, inp (N, C), w (D, C). In one process one product; on a rank of a split model the
 * rank's columns' product summed over the ranks (collective). 0, or 1 when it failed. */
typedef int (*model_row_out)(void *ctx, float *out, const float *residual, const float *inp, const float *w,
                             const float *bias, size_t N, size_t C, size_t D);

/* The forward pass of m's parameters (whole, or a rank's slices at widths Dl, Hl, Fl) over
 * tokens (b, t) into the buffers at acts (laid out for B, T >= b, t), each block's two
 * row-parallel outputs by row_out(ctx, ...). Returns the mean loss over targets, NaN without
 * targets or when row_out failed. One copy of the pass for model.c and model_tp.c. */
float model_forward_pass(const model *m, float *acts, size_t B, size_t T, size_t Dl, size_t Hl, size_t Fl,
                         const int32_t *tokens, const int32_t *targets, size_t b, size_t t, model_row_out row_out,
                         void *ctx);

#endif /* STAB_HARNESS_MODEL_KERNELS_H */
