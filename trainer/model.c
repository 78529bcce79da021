/* model.c — the transformer of model.h: small pure kernels (output first, then inputs, then
 * sizes) in the order of the forward pass, each followed by its backward, then the model
 * that strings them together. Matrix products go to cblas_sgemm; every reduction over a
 * row (norms, softmax) accumulates in f64 so that the finite-difference check of the tests
 * sees the f32 rounding of the stored values only. The kernels and the forward pass are shared
 * with the split model of model_tp.c (model_kernels.h): the pass takes the widths a process
 * holds and how a block's row-parallel outputs are made. */
#include "model.h"
#include "model_kernels.h"
#include "synth.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RMS_EPS 1e-5

/* ---- encoder: x = wte[token] + wpe[position] -------------------------------------- */

int tokens_in_range(const int32_t *tokens, const int32_t *targets, size_t n, size_t V) {
  for (size_t i = 0; i < n; i++)
    if (tokens[i] < 0 || (size_t)tokens[i] >= V || (targets && (targets[i] < 0 || (size_t)targets[i] >= V)))
      return 0;
  return 1;
}

void encoder_forward(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, size_t b, size_t t, size_t D) {
  // out (b, t, D), tokens (b, t), wte (V, D), wpe (T, D)
  for (size_t i = 0; i < b * t; i++) {
    const float *e = wte + (size_t)tokens[i] * D, *p = wpe + (i % t) * D;
    for (size_t d = 0; d < D; d++) out[i * D + d] = e[d] + p[d];
  }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, size_t b, size_t t, size_t D) {
  for (size_t i = 0; i < b * t; i++) {
    float *e = dwte + (size_t)tokens[i] * D, *p = dwpe + (i % t) * D;
    for (size_t d = 0; d < D; d++) e[d] += dout[i * D + d], p[d] += dout[i * D + d];
  }
}

/* ---- RMSNorm with a gain: y = g * x / sqrt(mean(x^2) + eps) ----------------------- */

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *g,
                            size_t N, size_t D) {
  // out (N, D), rstd (N), inp (N, D), g (D)
  for (size_t i = 0; i < N; i++) {
    const float *x = inp + i * D;
    double ss = 0;
    for (size_t d = 0; d < D; d++) ss += (double)x[d] * x[d];
    double r = 1.0 / sqrt(ss / (double)D + RMS_EPS);
    rstd[i] = (float)r;
    for (size_t d = 0; d < D; d++) out[i * D + d] = (float)(x[d] * r) * g[d];
  }
}

/* dinp += d/dx, dg += d/dg. With n = x r: dx = r (dn - n mean(dn n)), dn = g dy. */
void rmsnorm_backward(float *dinp, float *dg, const float *dout, const float *inp,
                             const float *g, const float *rstd, size_t N, size_t D) {
  for (size_t i = 0; i < N; i++) {
    const float *x = inp + i * D, *dy = dout + i * D;
    double r = rstd[i], dot = 0;
    for (size_t d = 0; d < D; d++) dot += (double)dy[d] * g[d] * x[d] * r;
    dot /= (double)D;
    for (size_t d = 0; d < D; d++) {
      double n = x[d] * r;
      dg[d] += (float)(dy[d] * n);
      dinp[i * D + d] += (float)(r * (dy[d] * (double)g[d] - n * dot));
    }
  }
}

/* ---- linear layer, out-major weight: out = inp W^T + b ------------------------------ */

/* beta 0 overwrites out, beta 1 adds to it (a residual connection already copied there). */
void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                           size_t N, size_t C, size_t OC, float beta) {
  // out (N, OC), inp (N, C), w (OC, C), bias (OC) or NULL
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, inp,
              (int)C, w, (int)C, beta, out, (int)OC);
  if (bias)
    for (size_t i = 0; i < N; i++)
      for (size_t o = 0; o < OC; o++) out[i * OC + o] += bias[o];
}

/* dinp += dout W, dw += dout^T inp, dbias += column sums of dout. */
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, size_t N, size_t C, size_t OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f, dout,
              (int)OC, w, (int)C, 1.0f, dinp, (int)C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout,
              (int)OC, inp, (int)C, 1.0f, dw, (int)C);
  if (dbias)
    for (size_t o = 0; o < OC; o++) {
      double s = 0;
      for (size_t i = 0; i < N; i++) s += dout[i * OC + o];
      dbias[o] += (float)s;
    }
}

/* ---- causal multi-head self-attention on fused qkv -------------------------------- */

float model_attn_scale(const model_config *c) {
  size_t hs = c->width / c->heads;
  return c->attn_inverse ? 1.0f / (float)hs : 1.0f / sqrtf((float)hs);
}

void attention_forward(float *out, float *att, const float *qkv, size_t b, size_t t,
                              size_t D, size_t H, float scale) {
  // out (b, t, D), att (b, H, t, t) softmax weights (0 above the diagonal), qkv (b, t, 3D)
  size_t hs = D / H, C3 = 3 * D;
  for (size_t bi = 0; bi < b; bi++)
    for (size_t h = 0; h < H; h++) {
      const float *q = qkv + bi * t * C3 + h * hs, *k = q + D, *v = q + 2 * D;
      float *a = att + (bi * H + h) * t * t;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t, (int)t, (int)hs, scale, q,
                  (int)C3, k, (int)C3, 0.0f, a, (int)t);
      for (size_t i = 0; i < t; i++) {
        float *row = a + i * t, mx = row[0];
        for (size_t j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
        double s = 0;
        for (size_t j = 0; j <= i; j++) s += (row[j] = expf(row[j] - mx));
        for (size_t j = 0; j <= i; j++) row[j] = (float)(row[j] / s);
        for (size_t j = i + 1; j < t; j++) row[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t, (int)hs, (int)t, 1.0f, a,
                  (int)t, v, (int)C3, 0.0f, out + bi * t * D + h * hs, (int)D);
    }
}

/* dqkv += d/dqkv; datt is (t, t) scratch. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                               const float *att, size_t b, size_t t, size_t D, size_t H,
                               float scale) {
  size_t hs = D / H, C3 = 3 * D;
  for (size_t bi = 0; bi < b; bi++)
    for (size_t h = 0; h < H; h++) {
      const float *q = qkv + bi * t * C3 + h * hs, *k = q + D, *v = q + 2 * D;
      float *dq = dqkv + bi * t * C3 + h * hs, *dk = dq + D, *dv = dq + 2 * D;
      const float *a = att + (bi * H + h) * t * t, *dy = dout + bi * t * D + h * hs;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)t, (int)t, (int)hs, 1.0f, dy,
                  (int)D, v, (int)C3, 0.0f, datt, (int)t);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t, (int)hs, (int)t, 1.0f, a,
                  (int)t, dy, (int)D, 1.0f, dv, (int)C3);
      for (size_t i = 0; i < t; i++) { /* softmax backward, in place: datt becomes dpreatt */
        const float *ar = a + i * t;
        float *dr = datt + i * t;
        double s = 0;
        for (size_t j = 0; j <= i; j++) s += (double)ar[j] * dr[j];
        for (size_t j = 0; j < t; j++) dr[j] = j <= i ? (float)(ar[j] * (dr[j] - s)) : 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)t, (int)hs, (int)t, scale,
                  datt, (int)t, k, (int)C3, 1.0f, dq, (int)C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)t, (int)hs, (int)t, scale,
                  datt, (int)t, q, (int)C3, 1.0f, dk, (int)C3);
    }
}

/* ---- GELU, tanh approximation (as GPT-2) ----------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void gelu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x), th = tanhf(u);
    float sech2 = 1.0f - th * th;
    float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += g * dout[i];
  }
}

/* ---- softmax cross-entropy ------------------------------------------------------- */

/* probs (N, V) = softmax(logits); returns the mean of -log p[target] (in f64). */
double crossentropy_forward(float *probs, const float *logits, const int32_t *targets,
                                   size_t N, size_t V) {
  double total = 0;
  for (size_t i = 0; i < N; i++) {
    const float *z = logits + i * V;
    float mx = z[0];
    for (size_t v = 1; v < V; v++) mx = z[v] > mx ? z[v] : mx;
    double s = 0;
    for (size_t v = 0; v < V; v++) s += exp((double)z[v] - mx);
    for (size_t v = 0; v < V; v++) probs[i * V + v] = (float)(exp((double)z[v] - mx) / s);
    if (targets) total += log(s) + mx - z[targets[i]];
  }
  return total / (double)N;
}

/* dlogits = (probs - onehot(target)) / N. */
void crossentropy_backward(float *dlogits, const float *probs, const int32_t *targets,
                                  size_t N, size_t V) {
  float inv = 1.0f / (float)N;
  for (size_t i = 0; i < N; i++) {
    for (size_t v = 0; v < V; v++) dlogits[i * V + v] = probs[i * V + v] * inv;
    dlogits[i * V + targets[i]] -= inv;
  }
}

/* ---- parameters ------------------------------------------------------------------ */

static int push(model *m, size_t cap, const char *name, stab_kind kind, size_t rows,
                size_t cols, size_t blocks) {
  if (m->n_tensors == cap) return -1;
  model_tensor *t = &m->tensors[m->n_tensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->kind = kind, t->rows = rows, t->cols = cols, t->blocks = blocks;
  t->offset = m->n_params, t->size = rows * cols;
  m->n_params += t->size;
  return 0;
}

int model_create(model *m, const model_config *c) {
  memset(m, 0, sizeof *m);
  m->loss = NAN;
  if (!c->vocab || !c->width || !c->depth || !c->heads || !c->context || c->width % c->heads ||
      c->vocab > (1u << 24) || c->width > 65536 || c->depth > 1024 || c->context > 65536)
    return -1;
  m->c = *c;
  size_t V = c->vocab, D = c->width, L = c->depth, T = c->context;
  size_t cap = 3 + 10 * L + 1;
  if (!(m->tensors = calloc(cap, sizeof *m->tensors))) return -2;
  char nm[64];
  push(m, cap, "transformer.wte.weight", STAB_KIND_EMBEDDING, V, D, 1);
  push(m, cap, "transformer.wpe.weight", STAB_KIND_EMBEDDING, T, D, 1);
  for (size_t l = 0; l < L; l++) {
#define P(suffix, kind, r, cc, blk)                                                         \
  snprintf(nm, sizeof nm, "transformer.h.%zu.%s", l, suffix);                               \
  push(m, cap, nm, kind, r, cc, blk)
    P("ln_1.weight", STAB_KIND_GAIN, 1, D, 1);
    P("attn.c_attn.weight", STAB_KIND_LINEAR, 3 * D, D, 3);
    if (c->biases) { P("attn.c_attn.bias", STAB_KIND_BIAS, 1, 3 * D, 3); }
    P("attn.c_proj.weight", STAB_KIND_LINEAR, D, D, 1);
    if (c->biases) { P("attn.c_proj.bias", STAB_KIND_BIAS, 1, D, 1); }
    P("ln_2.weight", STAB_KIND_GAIN, 1, D, 1);
    P("mlp.c_fc.weight", STAB_KIND_LINEAR, 4 * D, D, 1);
    if (c->biases) { P("mlp.c_fc.bias", STAB_KIND_BIAS, 1, 4 * D, 1); }
    P("mlp.c_proj.weight", STAB_KIND_LINEAR, D, 4 * D, 1);
    if (c->biases) { P("mlp.c_proj.bias", STAB_KIND_BIAS, 1, D, 1); }
#undef P
  }
  push(m, cap, "transformer.ln_f.weight", STAB_KIND_GAIN, 1, D, 1);
  if (c->untied) push(m, cap, "lm_head.weight", STAB_KIND_LM_HEAD, V, D, 1);
  m->params = calloc(m->n_params, sizeof(float));
  m->grads = calloc(m->n_params, sizeof(float));
  if (!m->params || !m->grads) {
    model_free(m);
    return -2;
  }
  return 0;
}

void model_free(model *m) {
  if (!m) return;
  free(m->tensors), free(m->params), free(m->grads), free(m->acts), free(m->dacts);
  free(m->scratch), free(m->tokens), free(m->targets);
  memset(m, 0, sizeof *m);
}

const model_tensor *model_find(const model *m, const char *name) {
  for (size_t i = 0; i < m->n_tensors; i++)
    if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
  return NULL;
}

/* Tensors are pushed in a fixed order: wte, wpe, then per block 6 or 10, then ln_f, head. */
static size_t per_block(const model *m) { return m->c.biases ? 10 : 6; }

model_block model_block_at(const model *m, float *base, size_t l) {
  const model_tensor *t = m->tensors + 2 + l * per_block(m);
  model_block k = {0};
  k.ln1w = base + (t++)->offset;
  k.qkvw = base + (t++)->offset;
  if (m->c.biases) k.qkvb = base + (t++)->offset;
  k.attprojw = base + (t++)->offset;
  if (m->c.biases) k.attprojb = base + (t++)->offset;
  k.ln2w = base + (t++)->offset;
  k.fcw = base + (t++)->offset;
  if (m->c.biases) k.fcb = base + (t++)->offset;
  k.fcprojw = base + (t++)->offset;
  if (m->c.biases) k.fcprojb = base + (t++)->offset;
  return k;
}

float *model_wte(const model *m, float *base) { return base + m->tensors[0].offset; }
float *model_wpe(const model *m, float *base) { return base + m->tensors[1].offset; }
float *model_lnf(const model *m, float *base) {
  return base + m->tensors[2 + m->c.depth * per_block(m)].offset;
}
float *model_head(const model *m, float *base) {
  return m->c.untied ? base + m->tensors[m->n_tensors - 1].offset : model_wte(m, base);
}

void model_init_params(model *m, uint64_t seed, int gpt2) {
  synth_rng r;
  synth_seed(&r, seed);
  double proj_scale = 1.0 / sqrt(2.0 * (double)m->c.depth);
  for (size_t i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    float *w = m->params + t->offset;
    if (t->kind == STAB_KIND_GAIN || t->kind == STAB_KIND_BIAS) {
      float v = t->kind == STAB_KIND_GAIN ? 1.0f : 0.0f;
      for (size_t e = 0; e < t->size; e++) w[e] = v;
      continue;
    }
    double std;
    if (gpt2)
      std = strstr(t->name, "c_proj.weight") ? 0.02 * proj_scale : 0.02;
    else if (t->kind == STAB_KIND_LINEAR) /* per block of a fused matrix: q, k, v separately */
      std = stab_init_std(t->kind, t->cols, t->rows / t->blocks);
    else
      std = stab_init_std(t->kind, t->kind == STAB_KIND_LM_HEAD ? t->cols : t->rows,
                          t->kind == STAB_KIND_LM_HEAD ? t->rows : t->cols);
    synth_gaussian(w, t->size, std, &r);
  }
}

/* ---- activations ----------------------------------------------------------------- */

size_t model_acts_layout(const model_config *c, size_t Dl, size_t Hl, size_t Fl, float *base, size_t B, size_t T,
                         model_acts *a) {
  size_t V = c->vocab, D = c->width, L = c->depth, N = B * T;
  size_t sizes[] = {N * D,     L * N * D, L * N,     L * N * 3 * Dl, L * N * Dl, L * B * Hl * T * T,
                    L * N * D, L * N * D, L * N,     L * N * Fl,     L * N * Fl, L * N * D,
                    N * D,     N,         N * V,     N * V};
  float **ptrs[] = {&a->encoded, &a->ln1,     &a->ln1_rstd, &a->qkv, &a->atty,     &a->att,
                    &a->res2,    &a->ln2,     &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->res3,
                    &a->lnf,     &a->lnf_rstd, &a->logits,  &a->probs};
  size_t total = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    *ptrs[i] = base ? base + total : NULL;
    total += sizes[i];
  }
  return total;
}

/* The whole model's buffers: every width whole. */
static size_t acts_layout(const model *m, float *base, size_t B, size_t T, model_acts *a) {
  return model_acts_layout(&m->c, m->c.width, m->c.heads, 4 * m->c.width, base, B, T, a);
}

int model_reserve(model *m, size_t B, size_t T) {
  if (!B || !T || T > m->c.context || B > (1u << 20)) return -1;
  if (B <= m->B && T <= m->T) return 0;
  model_acts a;
  size_t n = acts_layout(m, NULL, B, T, &a);
  float *x = malloc(n * sizeof(float)), *dx = malloc(n * sizeof(float));
  float *s = malloc(T * T * sizeof(float));
  int32_t *tok = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
  if (!x || !dx || !s || !tok || !tgt) {
    free(x), free(dx), free(s), free(tok), free(tgt);
    return -2;
  }
  free(m->acts), free(m->dacts), free(m->scratch), free(m->tokens), free(m->targets);
  m->acts = x, m->dacts = dx, m->scratch = s, m->tokens = tok, m->targets = tgt;
  m->n_acts = n, m->B = B, m->T = T;
  return 0;
}

/* ---- the model ------------------------------------------------------------------- */

float model_forward_pass(const model *m, float *acts, size_t B, size_t T, size_t Dl, size_t Hl, size_t Fl,
                         const int32_t *tokens, const int32_t *targets, size_t b, size_t t, model_row_out row_out,
                         void *ctx) {
  size_t V = m->c.vocab, D = m->c.width, L = m->c.depth, N = b * t;
  size_t NB = B * T, ND = NB * D; /* per-layer strides of the buffers */
  model_acts a;
  model_acts_layout(&m->c, Dl, Hl, Fl, acts, B, T, &a);
  float *p = m->params;
  encoder_forward(a.encoded, tokens, model_wte(m, p), model_wpe(m, p), b, t, D);
  for (size_t l = 0; l < L; l++) {
    model_block w = model_block_at(m, p, l);
    const float *residual = l ? a.res3 + (l - 1) * ND : a.encoded;
    float *ln1 = a.ln1 + l * ND, *ln1r = a.ln1_rstd + l * NB, *qkv = a.qkv + l * NB * 3 * Dl;
    float *atty = a.atty + l * NB * Dl, *att = a.att + l * B * Hl * T * T;
    float *res2 = a.res2 + l * ND, *ln2 = a.ln2 + l * ND, *ln2r = a.ln2_rstd + l * NB;
    float *fch = a.fch + l * NB * Fl, *fchg = a.fch_gelu + l * NB * Fl, *res3 = a.res3 + l * ND;
    rmsnorm_forward(ln1, ln1r, residual, w.ln1w, N, D);
    matmul_forward(qkv, ln1, w.qkvw, w.qkvb, N, D, 3 * Dl, 0.0f); /* a split model: its heads */
    attention_forward(atty, att, qkv, b, t, Dl, Hl, model_attn_scale(&m->c));
    if (row_out(ctx, res2, residual, atty, w.attprojw, w.attprojb, N, Dl, D)) return NAN;
    rmsnorm_forward(ln2, ln2r, res2, w.ln2w, N, D);
    matmul_forward(fch, ln2, w.fcw, w.fcb, N, D, Fl, 0.0f); /* a split model: its columns */
    gelu_forward(fchg, fch, N * Fl);
    if (row_out(ctx, res3, res2, fchg, w.fcprojw, w.fcprojb, N, Fl, D)) return NAN;
  }
  rmsnorm_forward(a.lnf, a.lnf_rstd, a.res3 + (L - 1) * ND, model_lnf(m, p), N, D);
  matmul_forward(a.logits, a.lnf, model_head(m, p), NULL, N, D, V, 0.0f);
  double loss = crossentropy_forward(a.probs, a.logits, targets, N, V);
  return targets ? (float)loss : NAN;
}

/* The whole model's output of a block's attention or MLP: out = residual + inp W^T + bias. */
static int whole_row_out(void *ctx, float *out, const float *residual, const float *inp, const float *w,
                         const float *bias, size_t N, size_t C, size_t D) {
  (void)ctx;
  memcpy(out, residual, N * D * sizeof(float));
  matmul_forward(out, inp, w, bias, N, C, D, 1.0f);
  return 0;
}

float model_forward(model *m, const int32_t *tokens, const int32_t *targets, size_t b,
                    size_t t) {
  if (!b || !t || model_reserve(m, b, t) != 0) return NAN;
  size_t N = b * t;
  if (!tokens_in_range(tokens, targets, N, m->c.vocab)) return NAN;
  memcpy(m->tokens, tokens, N * sizeof *tokens);
  if (targets) memcpy(m->targets, targets, N * sizeof *targets);
  m->b = b, m->t = t;
  m->loss = model_forward_pass(m, m->acts, m->B, m->T, m->c.width, m->c.heads, 4 * m->c.width, tokens, targets, b,
                               t, whole_row_out, NULL);
  return m->loss;
}

void model_zero_grad(model *m) { memset(m->grads, 0, m->n_params * sizeof(float)); }

void model_backward(model *m) {
  if (!m->b || isnan(m->loss)) return;
  size_t V = m->c.vocab, D = m->c.width, L = m->c.depth, H = m->c.heads;
  size_t b = m->b, t = m->t, N = b * t;
  size_t ND = m->B * m->T * D, NB = m->B * m->T;
  model_acts a, da;
  acts_layout(m, m->acts, m->B, m->T, &a);
  acts_layout(m, m->dacts, m->B, m->T, &da);
  memset(m->dacts, 0, m->n_acts * sizeof(float));
  float *p = m->params, *g = m->grads;
  crossentropy_backward(da.logits, a.probs, m->targets, N, V);
  matmul_backward(da.lnf, model_head(m, g), NULL, da.logits, a.lnf, model_head(m, p), N, D, V);
  float *dlast = da.res3 + (L - 1) * ND;
  rmsnorm_backward(dlast, model_lnf(m, g), da.lnf, a.res3 + (L - 1) * ND, model_lnf(m, p),
                   a.lnf_rstd, N, D);
  for (size_t l = L; l-- > 0;) {
    model_block w = model_block_at(m, p, l), dw = model_block_at(m, g, l);
    const float *residual = l ? a.res3 + (l - 1) * ND : a.encoded;
    float *dresidual = l ? da.res3 + (l - 1) * ND : da.encoded;
    size_t o1 = l * ND, o4 = l * 4 * ND, or = l * NB, oa = l * m->B * H * m->T * m->T;
    float *dres3 = da.res3 + o1, *dres2 = da.res2 + o1;
    for (size_t i = 0; i < N * D; i++) dres2[i] += dres3[i];
    matmul_backward(da.fch_gelu + o4, dw.fcprojw, dw.fcprojb, dres3, a.fch_gelu + o4,
                    w.fcprojw, N, 4 * D, D);
    gelu_backward(da.fch + o4, a.fch + o4, da.fch_gelu + o4, N * 4 * D);
    matmul_backward(da.ln2 + o1, dw.fcw, dw.fcb, da.fch + o4, a.ln2 + o1, w.fcw, N, D, 4 * D);
    rmsnorm_backward(dres2, dw.ln2w, da.ln2 + o1, a.res2 + o1, w.ln2w, a.ln2_rstd + or, N, D);
    for (size_t i = 0; i < N * D; i++) dresidual[i] += dres2[i];
    matmul_backward(da.atty + o1, dw.attprojw, dw.attprojb, dres2, a.atty + o1, w.attprojw, N,
                    D, D);
    attention_backward(da.qkv + 3 * o1, m->scratch, da.atty + o1, a.qkv + 3 * o1, a.att + oa, b,
                       t, D, H, model_attn_scale(&m->c));
    matmul_backward(da.ln1 + o1, dw.qkvw, dw.qkvb, da.qkv + 3 * o1, a.ln1 + o1, w.qkvw, N, D,
                    3 * D);
    rmsnorm_backward(dresidual, dw.ln1w, da.ln1 + o1, residual, w.ln1w, a.ln1_rstd + or, N, D);
  }
  encoder_backward(model_wte(m, g), model_wpe(m, g), da.encoded, m->tokens, b, t, D);
}

const float *model_logits(const model *m) {
  model_acts a;
  acts_layout(m, m->acts, m->B, m->T, &a);
  return a.logits;
}

const float *model_residual(const model *m, int l) {
  model_acts a;
  acts_layout(m, m->acts, m->B, m->T, &a);
  return l < 0 ? a.encoded : a.res3 + (size_t)l * m->B * m->T * m->c.width;
}
