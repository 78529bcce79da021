/* model_tp.c — the split transformer of model_tp.h: the cut of each tensor, the slices in and
 * out of the whole model's layout, the forward pass (model.c's, at this rank's widths, with a
 * sum over the ranks after each row-parallel layer) and the backward pass, which strings
 * model.c's kernels (model_kernels.h) together with a sum before each column-parallel layer's
 * input gradient. Built with --with-mpi. */
#include "model_tp.h"
#include "model_kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

tp_split model_tp_split_of(const model_tensor *t) {
  if (ends_with(t->name, ".attn.c_attn.weight") || ends_with(t->name, ".attn.c_attn.bias") ||
      ends_with(t->name, ".mlp.c_fc.weight") || ends_with(t->name, ".mlp.c_fc.bias"))
    return TP_OUT;
  if (ends_with(t->name, ".attn.c_proj.weight") || ends_with(t->name, ".mlp.c_proj.weight")) return TP_IN;
  return TP_WHOLE;
}

/* Copies tensor t (of the whole model, wt) between the whole layout and rank r's slice: the
 * cut side (rows, or columns, a bias's entries being its columns) has t->blocks blocks, and the
 * rank holds the r-th P-th of each, one after another. to_local 1: whole -> local. */
static void copy_slice(float *local, float *whole, const model_tensor *wt, tp_split s, size_t P, size_t r,
                       int to_local) {
  size_t R = wt->rows, C = wt->cols, K = wt->blocks;
  if (s == TP_WHOLE) {
    if (to_local) memcpy(local, whole, wt->size * sizeof *local);
    else memcpy(whole, local, wt->size * sizeof *local);
    return;
  }
  if (s == TP_OUT && R > 1) { /* whole rows */
    size_t n = R / K / P;
    for (size_t lr = 0; lr < R / P; lr++) {
      size_t wr = lr / n * (R / K) + r * n + lr % n;
      if (to_local) memcpy(local + lr * C, whole + wr * C, C * sizeof *local);
      else memcpy(whole + wr * C, local + lr * C, C * sizeof *local);
    }
    return;
  }
  size_t n = C / K / P, Cl = C / P; /* columns of every row, or a bias's entries */
  for (size_t row = 0; row < R; row++)
    for (size_t lc = 0; lc < Cl; lc++) {
      size_t wc = lc / n * (C / K) + r * n + lc % n;
      if (to_local) local[row * Cl + lc] = whole[row * C + wc];
      else whole[row * C + wc] = local[row * Cl + lc];
    }
}

int model_tp_create(model_tp *tp, const model *whole, train_world *w) {
  memset(tp, 0, sizeof *tp);
  tp->loss = NAN;
  size_t P = (size_t)train_world_size(w), D = whole->c.width, H = whole->c.heads;
  if (H % P || D % P) return -1;
  tp->w = w, tp->P = P, tp->rank = (size_t)train_world_rank(w);
  tp->Dl = D / P, tp->Hl = H / P, tp->Fl = 4 * D / P;
  model *m = &tp->local;
  m->c = whole->c;
  m->loss = NAN;
  m->n_tensors = whole->n_tensors;
  m->tensors = malloc(whole->n_tensors * sizeof *m->tensors);
  tp->split = malloc(whole->n_tensors * sizeof *tp->split);
  tp->whole_tensors = malloc(whole->n_tensors * sizeof *tp->whole_tensors);
  if (!m->tensors || !tp->split || !tp->whole_tensors) return model_tp_free(tp), -2;
  memcpy(tp->whole_tensors, whole->tensors, whole->n_tensors * sizeof *tp->whole_tensors);
  tp->whole_params = whole->n_params;
  for (size_t i = 0; i < whole->n_tensors; i++) {
    model_tensor t = whole->tensors[i];
    tp_split s = model_tp_split_of(&t);
    if (s == TP_OUT && t.rows > 1) t.rows /= P;
    else if (s != TP_WHOLE) t.cols /= P;
    t.size = t.rows * t.cols;
    t.offset = m->n_params;
    m->n_params += t.size;
    m->tensors[i] = t;
    tp->split[i] = s;
  }
  m->params = calloc(m->n_params, sizeof(float));
  m->grads = calloc(m->n_params, sizeof(float));
  tp->gathered = malloc(P * m->n_params * sizeof(float));
  if (!m->params || !m->grads || !tp->gathered) return model_tp_free(tp), -2;
  model_tp_scatter(tp, whole->params, m->params);
  return 0;
}

void model_tp_free(model_tp *tp) {
  if (!tp) return;
  model_free(&tp->local);
  free(tp->split), free(tp->whole_tensors), free(tp->acts), free(tp->dacts), free(tp->partial), free(tp->scratch), free(tp->gathered);
  free(tp->tokens), free(tp->targets);
  memset(tp, 0, sizeof *tp);
}

void model_tp_scatter(const model_tp *tp, const float *whole, float *local) {
  for (size_t i = 0; i < tp->local.n_tensors; i++) {
    const model_tensor *wt = &tp->whole_tensors[i];
    copy_slice(local + tp->local.tensors[i].offset, (float *)(whole + wt->offset), wt, tp->split[i], tp->P,
               tp->rank, 1);
  }
}

int model_tp_gather(model_tp *tp, const float *local, float *whole) {
  size_t n = tp->local.n_params;
  if (train_world_allgather(tp->w, local, n * sizeof *local, tp->gathered)) return 1;
  for (size_t r = 0; r < tp->P; r++)
    for (size_t i = 0; i < tp->local.n_tensors; i++) {
      const model_tensor *wt = &tp->whole_tensors[i];
      /* a replicated tensor is the same on every rank: rank 0's */
      if (r && tp->split[i] == TP_WHOLE) continue;
      copy_slice(tp->gathered + r * n + tp->local.tensors[i].offset, whole + wt->offset, wt, tp->split[i], tp->P,
                 r, 0);
    }
  return 0;
}

size_t model_tp_replicated(const model_tp *tp, const float *local, float *out) {
  size_t k = 0;
  for (size_t i = 0; i < tp->local.n_tensors; i++) {
    const model_tensor *t = &tp->local.tensors[i];
    if (tp->split[i] != TP_WHOLE) continue;
    if (out) memcpy(out + k, local + t->offset, t->size * sizeof *out);
    k += t->size;
  }
  return k;
}

/* ---- activations: model.c's buffers at this rank's widths ------------------------ */

static size_t acts_layout(const model_tp *tp, float *base, size_t B, size_t T, model_acts *a) {
  return model_acts_layout(&tp->local.c, tp->Dl, tp->Hl, tp->Fl, base, B, T, a);
}

static int reserve(model_tp *tp, size_t B, size_t T) {
  if (!B || !T || T > tp->local.c.context || B > (1u << 20)) return -1;
  if (B <= tp->B && T <= tp->T) return 0;
  model_acts a;
  size_t n = acts_layout(tp, NULL, B, T, &a), D = tp->local.c.width;
  float *x = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float)), *s = malloc(T * T * sizeof(float));
  float *part = malloc(B * T * D * sizeof(float));
  int32_t *tok = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
  if (!x || !dx || !s || !part || !tok || !tgt) {
    free(x), free(dx), free(s), free(part), free(tok), free(tgt);
    return -2;
  }
  free(tp->acts), free(tp->dacts), free(tp->scratch), free(tp->partial), free(tp->tokens), free(tp->targets);
  tp->acts = x, tp->dacts = dx, tp->scratch = s, tp->partial = part, tp->tokens = tok, tp->targets = tgt;
  tp->n_acts = n, tp->B = B, tp->T = T;
  return 0;
}

/* out = residual + the ranks' summed partial outputs + the (replicated) bias. */
static void add_row_parallel(float *out, const float *residual, const float *sum, const float *bias, size_t N,
                             size_t D) {
  for (size_t i = 0; i < N; i++)
    for (size_t d = 0; d < D; d++) out[i * D + d] = residual[i * D + d] + sum[i * D + d] + (bias ? bias[d] : 0.0f);
}

/* ---- the split model --------------------------------------------------------------- */

/* A rank's output of a block's attention or MLP, row-parallel: its columns' product, summed over
 * the ranks, plus the residual and the (replicated) bias. Collective. */
static int split_row_out(void *ctx, float *out, const float *residual, const float *inp, const float *w,
                         const float *bias, size_t N, size_t C, size_t D) {
  model_tp *tp = ctx;
  matmul_forward(tp->partial, inp, w, NULL, N, C, D, 0.0f);
  if (train_world_sum(tp->w, tp->partial, N * D)) return 1;
  add_row_parallel(out, residual, tp->partial, bias, N, D);
  return 0;
}

float model_tp_forward(model_tp *tp, const int32_t *tokens, const int32_t *targets, size_t b, size_t t) {
  model *m = &tp->local;
  if (!b || !t || reserve(tp, b, t) != 0) return NAN;
  size_t N = b * t;
  if (!tokens_in_range(tokens, targets, N, m->c.vocab)) return NAN;
  memcpy(tp->tokens, tokens, N * sizeof *tokens);
  if (targets) memcpy(tp->targets, targets, N * sizeof *targets);
  tp->b = b, tp->t = t;
  /* the whole model's pass at this rank's widths, its row-parallel outputs summed over the ranks */
  tp->loss = m->loss = model_forward_pass(m, tp->acts, tp->B, tp->T, tp->Dl, tp->Hl, tp->Fl, tokens, targets, b, t,
                                          split_row_out, tp);
  return tp->loss;
}

int model_tp_backward(model_tp *tp) {
  model *m = &tp->local;
  if (!tp->b || isnan(tp->loss)) return 0;
  size_t V = m->c.vocab, D = m->c.width, L = m->c.depth, b = tp->b, t = tp->t, N = b * t;
  size_t Dl = tp->Dl, Hl = tp->Hl, Fl = tp->Fl, NB = tp->B * tp->T, ND = NB * D;
  model_acts a, da;
  acts_layout(tp, tp->acts, tp->B, tp->T, &a);
  acts_layout(tp, tp->dacts, tp->B, tp->T, &da);
  memset(tp->dacts, 0, tp->n_acts * sizeof(float));
  float *p = m->params, *g = m->grads;
  crossentropy_backward(da.logits, a.probs, tp->targets, N, V);
  matmul_backward(da.lnf, model_head(m, g), NULL, da.logits, a.lnf, model_head(m, p), N, D, V);
  rmsnorm_backward(da.res3 + (L - 1) * ND, model_lnf(m, g), da.lnf, a.res3 + (L - 1) * ND, model_lnf(m, p),
                   a.lnf_rstd, N, D);
  for (size_t l = L; l-- > 0;) {
    model_block w = model_block_at(m, p, l), dw = model_block_at(m, g, l);
    const float *residual = l ? a.res3 + (l - 1) * ND : a.encoded;
    float *dresidual = l ? da.res3 + (l - 1) * ND : da.encoded;
    size_t o1 = l * ND, or = l * NB, oq = l * NB * 3 * Dl, oy = l * NB * Dl, of = l * NB * Fl;
    size_t oa = l * tp->B * Hl * tp->T * tp->T;
    float *dres3 = da.res3 + o1, *dres2 = da.res2 + o1;
    for (size_t i = 0; i < N * D; i++) dres2[i] += dres3[i];
    /* row-parallel: this rank's columns and their inputs' gradient; the bias's gradient is
     * the same on every rank (dres3 is) */
    matmul_backward(da.fch_gelu + of, dw.fcprojw, dw.fcprojb, dres3, a.fch_gelu + of, w.fcprojw, N, Fl, D);
    gelu_backward(da.fch + of, a.fch + of, da.fch_gelu + of, N * Fl);
    /* column-parallel: each rank's part of the gradient of ln2, summed before the norm */
    matmul_backward(da.ln2 + o1, dw.fcw, dw.fcb, da.fch + of, a.ln2 + o1, w.fcw, N, D, Fl);
    if (train_world_sum(tp->w, da.ln2 + o1, N * D)) return 1;
    rmsnorm_backward(dres2, dw.ln2w, da.ln2 + o1, a.res2 + o1, w.ln2w, a.ln2_rstd + or, N, D);
    for (size_t i = 0; i < N * D; i++) dresidual[i] += dres2[i];
    matmul_backward(da.atty + oy, dw.attprojw, dw.attprojb, dres2, a.atty + oy, w.attprojw, N, Dl, D);
    attention_backward(da.qkv + oq, tp->scratch, da.atty + oy, a.qkv + oq, a.att + oa, b, t, Dl, Hl,
                       model_attn_scale(&m->c));
    matmul_backward(da.ln1 + o1, dw.qkvw, dw.qkvb, da.qkv + oq, a.ln1 + o1, w.qkvw, N, D, 3 * Dl);
    if (train_world_sum(tp->w, da.ln1 + o1, N * D)) return 1;
    rmsnorm_backward(dresidual, dw.ln1w, da.ln1 + o1, residual, w.ln1w, a.ln1_rstd + or, N, D);
  }
  encoder_backward(model_wte(m, g), model_wpe(m, g), da.encoded, tp->tokens, b, t, D);
  return 0;
}

const float *model_tp_residual(const model_tp *tp, int l) {
  model_acts a;
  acts_layout(tp, tp->acts, tp->B, tp->T, &a);
  return l < 0 ? a.encoded : a.res3 + (size_t)l * tp->B * tp->T * tp->local.c.width;
}
