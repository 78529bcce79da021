/* check_monitor_dtype.c — the per-step monitor on layers stored as BF16 and F16, as a bf16 model
 * holds them: a fused q/k/v split into three linear layers and its attention (llm.c's out-major
 * and HF's in-major layout), a tied embedding and LM head, an MLP linear, a gain, a bias, and a
 * matrix past what the passes convert whole. Over two steps, one with an update: every metric
 * the same bits as a monitor of the same layers converted to f32 (layer.h's promise, warm
 * starts included), equal to stab_layer_metrics of the 16-bit layers, and within the reported
 * error of LAPACK's dgesvd in f64 of the exactly converted matrices. The snapshot is a 16-bit
 * copy (half the memory), a step allocates nothing, and an external 16-bit layer is never read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

enum { C = 64, HEADS = 4, DH = C / HEADS, V = 97, FF = 4 * C, BIG_R = 1040, BIG_C = 1024 };

/* Numbers held twice: as 16-bit patterns and as the f32 values they stand for (exactly). */
typedef struct {
  uint16_t *h;
  float *f;
  size_t n;
} twin;

static stab_dtype dtype_of(int i) { return i ? STAB_DTYPE_F16 : STAB_DTYPE_BF16; }
static const char *dtype_name(stab_dtype t) { return t == STAB_DTYPE_BF16 ? "BF16" : "F16"; }

static float value_of(uint16_t h, stab_dtype t) { return t == STAB_DTYPE_BF16 ? stab_bf16_to_f32(h) : stab_f16_to_f32(h); }

/* n random 16-bit values of about N(0, std^2) (bf16: an f32 normal truncated; f16: a random
 * sign, mantissa and exponent around std). */
static twin twin_random(size_t n, stab_dtype t, double std, tu_rng *r) {
  twin w = {malloc(n * sizeof(uint16_t)), tu_floats(n), n};
  ck_assert(w.h != NULL);
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    if (t == STAB_DTYPE_BF16) {
      float x = (float)(std * tu_rng_gauss(r));
      uint32_t bits;
      memcpy(&bits, &x, sizeof bits);
      h = (uint16_t)(bits >> 16);
    } else {
      const int e = (int)lround(log2(std)) + 15; /* the exponent field of std */
      h = (uint16_t)(((tu_rng_u64(r) & 1u) << 15) | ((unsigned)(e - 3 + (int)(tu_rng_u64(r) % 5)) << 10) |
                     (tu_rng_u64(r) & 0x3ffu));
    }
    w.h[i] = h;
    w.f[i] = value_of(h, t);
  }
  return w;
}

/* An optimizer step in the stored type: most numbers move by a few units in the last place, in
 * either direction, some stay. Both copies change alike. */
static void twin_step(twin *w, stab_dtype t, tu_rng *r) {
  for (size_t i = 0; i < w->n; i++) {
    const int d = (int)(tu_rng_u64(r) % 7) - 3;
    if ((w->h[i] & 0x7fffu) < 8u) continue; /* near zero: a step could cross the sign */
    w->h[i] = (uint16_t)(w->h[i] + d);
    w->f[i] = value_of(w->h[i], t);
  }
}

static uint16_t *copy16(const twin *w) {
  uint16_t *c = malloc(w->n * sizeof *c);
  ck_assert(c != NULL);
  memcpy(c, w->h, w->n * sizeof *c);
  return c;
}

static float *copy32(const twin *w) {
  float *c = tu_floats(w->n);
  memcpy(c, w->f, w->n * sizeof *c);
  return c;
}

static void twin_free(twin *w) {
  free(w->h);
  free(w->f);
}

/* got within rel of want, both NaN or both finite. */
static void near_double(const char *what, const char *field, double got, double want, double rel) {
  if (isnan(want)) {
    ck_assert_msg(isnan(got), "%s: %s = %.17g, expected NaN", what, field, got);
    return;
  }
  ck_assert_msg(isfinite(got) && fabs(got - want) <= rel * fabs(want), "%s: %s = %.17g, expected %.17g (rel %.3g > %.3g)",
                what, field, got, want, tu_rel(got, want), rel);
}

/* ---- the model ------------------------------------------------------------------------ */

enum { QKV, QKV_B, CATTN, CATTN_B, WTE, FC, FC_B, GAIN, BIAS, BIG, NBUF };

typedef struct {
  twin t[NBUF];
  stab_dtype dtype;
  int big; /* the matrix the passes convert by tiles is registered */
} model;

static void model_init(model *md, stab_dtype t, int big, uint64_t seed) {
  static const size_t len[NBUF] = {3 * C * C, 3 * C, 3 * C * C, 3 * C, V * C, FF * C, FF, C, C, BIG_R * BIG_C};
  static const double std[NBUF] = {0.125, 0.03, 0.125, 0.03, 1.0, 0.06, 0.03, 1.0, 0.1, 0.03};
  tu_rng r;
  tu_rng_init(&r, seed);
  memset(md, 0, sizeof *md);
  md->dtype = t;
  md->big = big;
  for (int k = 0; k < NBUF; k++)
    if (k != BIG || big) md->t[k] = twin_random(len[k], t, std[k], &r);
}

static void model_step(model *md, uint64_t seed) {
  tu_rng r;
  tu_rng_init(&r, seed);
  for (int k = 0; k < NBUF; k++)
    if (md->t[k].n) twin_step(&md->t[k], md->dtype, &r);
}

static void model_free(model *md) {
  for (int k = 0; k < NBUF; k++) twin_free(&md->t[k]);
}

#define NLAYERS 13

/* The model's layers reading buffer p[k] for twin k (16-bit patterns or f32 values; esz bytes
 * each), as a trainer registers a GPT block: llm.c's fused qkv as q, k, v and an attention, HF's
 * in-major c_attn as q, v and an attention, the tied table twice, an MLP linear, the norm. */
static size_t model_layers(const model *md, const void *const p[NBUF], size_t esz, stab_dtype t,
                           stab_layer out[NLAYERS]) {
#define AT(k, off) ((const float *)(const void *)((const unsigned char *)p[k] + (size_t)(off) * esz))
  const stab_layer l[NLAYERS] = {
      {.name = "h.0.attn.c_attn.q", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .weight = AT(QKV, 0),
       .bias = AT(QKV_B, 0)},
      {.name = "h.0.attn.c_attn.k", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .weight = AT(QKV, C * C),
       .bias = AT(QKV_B, C)},
      {.name = "h.0.attn.c_attn.v", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .weight = AT(QKV, 2 * C * C),
       .bias = AT(QKV_B, 2 * C)},
      {.name = "h.0.attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = HEADS, .weight = AT(QKV, 0),
       .weight_k = AT(QKV, C * C)},
      {.name = "h.1.attn.c_attn.q", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .layout = STAB_LAYOUT_IN_MAJOR,
       .ld = 3 * C, .weight = AT(CATTN, 0), .bias = AT(CATTN_B, 0)},
      {.name = "h.1.attn.c_attn.v", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .layout = STAB_LAYOUT_IN_MAJOR,
       .ld = 3 * C, .weight = AT(CATTN, 2 * C), .bias = AT(CATTN_B, 2 * C)},
      {.name = "h.1.attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = HEADS,
       .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C, .weight = AT(CATTN, 0), .weight_k = AT(CATTN, C)},
      {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = C, .weight = AT(WTE, 0)},
      {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = C, .weight = AT(WTE, 0)},
      {.name = "h.0.mlp.c_fc", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = FF, .weight = AT(FC, 0),
       .bias = AT(FC_B, 0)},
      {.name = "h.0.ln_1.g", .kind = STAB_KIND_GAIN, .d_in = C, .d_out = C, .weight = AT(GAIN, 0)},
      {.name = "h.0.ln_1.b", .kind = STAB_KIND_BIAS, .d_in = C, .d_out = C, .weight = AT(BIAS, 0)},
      {.name = "big", .kind = STAB_KIND_LINEAR, .d_in = BIG_C, .d_out = BIG_R, .weight = AT(BIG, 0)},
  };
#undef AT
  const size_t n = md->big ? NLAYERS : NLAYERS - 1;
  for (size_t i = 0; i < n; i++) {
    out[i] = l[i];
    out[i].dtype = t;
  }
  return n;
}

static size_t layers16(const model *md, stab_layer out[NLAYERS]) {
  const void *p[NBUF];
  for (int k = 0; k < NBUF; k++) p[k] = md->t[k].h;
  return model_layers(md, p, sizeof(uint16_t), md->dtype, out);
}

static size_t layers32(const model *md, stab_layer out[NLAYERS]) {
  const void *p[NBUF];
  for (int k = 0; k < NBUF; k++) p[k] = md->t[k].f;
  return model_layers(md, p, sizeof(float), STAB_DTYPE_F32, out);
}

/* The layers of saved 16-bit copies of every buffer (stab_layer_metrics' `before`). */
static size_t layers_of(const model *md, uint16_t *const saved[NBUF], stab_layer out[NLAYERS]) {
  const void *p[NBUF];
  for (int k = 0; k < NBUF; k++) p[k] = saved[k];
  return model_layers(md, p, sizeof(uint16_t), md->dtype, out);
}

static stab_monitor *make_monitor(const stab_monitor_params *p, const stab_layer *l, size_t n) {
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(p, &m));
  for (size_t i = 0; i < n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &l[i], NULL), "%s", l[i].name);
  return m;
}

/* The stored matrix of a linear layer as f32 (the f32 twin's numbers): rows x cols, stride ld. */
static void stored(const stab_layer *l, size_t *rows, size_t *cols, size_t *ld) {
  const int in_major = l->layout == STAB_LAYOUT_IN_MAJOR;
  *rows = in_major ? l->d_in : l->d_out;
  *cols = in_major ? l->d_out : l->d_in;
  *ld = l->ld ? l->ld : *cols;
}

/* ---- references in f64 ---------------------------------------------------------------- */

/* A linear layer's sigma (and with before, sigma of the update) against dgesvd of the exactly
 * converted matrix, within the reported error plus the passes' rounding; rel_update against
 * its f64 definition. l32, b32: the f32 twins' layers after and before the step. */
static void check_linear_ref(const char *what, const stab_metrics *m, const stab_layer *l32, const stab_layer *b32) {
  size_t rows, cols, ld;
  stored(l32, &rows, &cols, &ld);
  const double slack = tu_round_slack(rows, cols) + tu_tol_exact(rows, cols);
  const double s = ref_sigma(l32->weight, rows, cols, ld);
  ck_assert_msg(fabs(m->sigma - s) <= (m->sigma_rel_err + slack) * s,
                "%s: sigma %.17g, dgesvd %.17g (rel %.3g, reported %.3g)", what, m->sigma, s, tu_rel(m->sigma, s),
                m->sigma_rel_err);
  if (!b32) return;
  const double su = ref_sigma_diff(l32->weight, b32->weight, rows, cols, ld);
  ck_assert_msg(su > 0 && fabs(m->sigma_update - su) <= (m->sigma_update_rel_err + slack) * su,
                "%s: sigma_update %.17g, dgesvd %.17g (rel %.3g, reported %.3g)", what, m->sigma_update, su,
                tu_rel(m->sigma_update, su), m->sigma_update_rel_err);
  double *w = tu_to_double(l32->weight, NULL, rows, cols, ld, 0), *d = tu_to_double(l32->weight, b32->weight, rows, cols, ld, 0);
  double w2 = ref_frob_d(w, rows * cols), d2 = ref_frob_d(d, rows * cols);
  w2 *= w2, d2 *= d2;
  if (l32->bias) {
    const double bw = ref_rms(l32->bias, l32->d_out, 1), bd = ref_rms_diff(l32->bias, b32->bias, l32->d_out);
    w2 += bw * bw * (double)l32->d_out;
    d2 += bd * bd * (double)l32->d_out;
  }
  TU_ASSERT_REL(m->rel_update, sqrt(d2) / sqrt(w2), 1e-12, "%s: rel_update", what);
  free(w), free(d);
}

/* An attention layer's per-head bounds s dh (f sigma(q_h)) (f sigma(k_h)) with s = 1/sqrt(dh),
 * f = sqrt(d / dh), against dgesvd of each head's blocks: never above (up to rounding), within
 * rel below. */
static void check_attention_ref(const char *what, const double *bounds, const stab_layer *l32, double rel) {
  const int in_major = l32->layout == STAB_LAYOUT_IN_MAJOR;
  const double f = sqrt((double)C / DH), s = 1.0 / sqrt((double)DH);
  for (size_t h = 0; h < HEADS; h++) {
    double sq, sk;
    if (in_major) {
      sq = ref_sigma(l32->weight + h * DH, C, DH, l32->ld);
      sk = ref_sigma(l32->weight_k + h * DH, C, DH, l32->ld);
    } else {
      sq = ref_sigma(l32->weight + h * DH * C, DH, C, C);
      sk = ref_sigma(l32->weight_k + h * DH * C, DH, C, C);
    }
    const double want = s * DH * (f * sq) * (f * sk);
    ck_assert_msg(bounds[h] <= want * (1 + 1e-6) && bounds[h] >= want * (1 - rel),
                  "%s: head %zu bound %.17g, dgesvd gives %.17g (rel %.3g)", what, h, bounds[h], want,
                  tu_rel(bounds[h], want));
  }
}

/* Tables and vectors against their definitions in f64 (docs/manual/metrics.md). */
static void check_other_ref(const char *what, const stab_metrics *m, const stab_layer *l32, const stab_layer *b32) {
  if (l32->kind == STAB_KIND_EMBEDDING || l32->kind == STAB_KIND_LM_HEAD) {
    double *w = tu_to_double(l32->weight, NULL, V, C, C, 0);
    const double r = ref_max_row_rms_d(w, V, C);
    TU_ASSERT_REL(l32->kind == STAB_KIND_EMBEDDING ? m->forward : m->forward - log((double)V),
                  l32->kind == STAB_KIND_EMBEDDING ? r : 2.0 * C * r, 1e-12, "%s: forward", what);
    free(w);
    if (b32) {
      double *d = tu_to_double(l32->weight, b32->weight, V, C, C, 0);
      const double dr = ref_max_row_rms_d(d, V, C);
      if (l32->kind == STAB_KIND_EMBEDDING) TU_ASSERT_REL(m->update, dr, 1e-12, "%s: update", what);
      else TU_ASSERT_REL(m->update, 2.0 * C * dr, 1e-12, "%s: update", what);
      free(d);
    }
  } else if (l32->kind == STAB_KIND_GAIN) {
    double g = 0, dg = 0;
    for (size_t i = 0; i < C; i++) {
      g = fmax(g, fabs((double)l32->weight[i]));
      if (b32) dg = fmax(dg, fabs((double)l32->weight[i] - (double)b32->weight[i]));
    }
    tu_assert_same_double(what, "forward (max |g|)", m->forward, g);
    if (b32) tu_assert_same_double(what, "update (max |dg|)", m->update, dg);
  } else {
    TU_ASSERT_REL(m->forward, ref_rms(l32->weight, C, 1), 1e-14, "%s: forward", what);
    if (b32) TU_ASSERT_REL(m->update, ref_rms_diff(l32->weight, b32->weight, C), 1e-14, "%s: update", what);
  }
}

/* ---- the tests -------------------------------------------------------------------------- */

/* Loop index: bit 0 the dtype (BF16, F16), bit 1 the spectral method (Lanczos with the centred
 * bound and the matrix past 2^20 elements; exact with the exact bound), bit 2 the threads a step
 * measures layers on (1, 2). */
START_TEST(test_snapshot_steps) {
  const stab_dtype t = dtype_of(_i & 1);
  const int exact = (_i >> 1) & 1, threads = (_i >> 2) & 1 ? 2 : 1;
  char what[200];
  model md;
  model_init(&md, t, !exact, 31 + (uint64_t)_i);
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = STAB_UPDATE_SNAPSHOT;
  p.metrics.spectral.threads = threads;
  if (exact) {
    p.metrics.spectral.method = STAB_SPECTRAL_EXACT;
    p.metrics.tight = STAB_TIGHT_EXACT;
  }
  stab_layer lh[NLAYERS], lf[NLAYERS], lb[NLAYERS], lf0[NLAYERS];
  const size_t n = layers16(&md, lh);
  layers32(&md, lf);
  stab_monitor *mh = make_monitor(&p, lh, n), *mf = make_monitor(&p, lf, n);
  const size_t mem = stab_monitor_memory(mh);

  /* step 0, no update: the first measurement is a cold start, as stab_layer_metrics' */
  TU_ASSERT_OK(stab_monitor_measure(mh, 0));
  TU_ASSERT_OK(stab_monitor_measure(mf, 0));
  for (size_t i = 0; i < n; i++) {
    snprintf(what, sizeof what, "%s %s, %s, %d thread(s), step 0", dtype_name(t), lh[i].name,
             exact ? "exact" : "lanczos", threads);
    tu_assert_same_metrics(what, stab_monitor_metrics(mh, i), stab_monitor_metrics(mf, i));
    stab_metrics want;
    double heads[HEADS];
    TU_ASSERT_OK(stab_layer_metrics(&lh[i], NULL, &p.metrics, &want, lh[i].kind == STAB_KIND_ATTENTION ? heads : NULL));
    tu_assert_same_metrics(what, stab_monitor_metrics(mh, i), &want);
    if (lh[i].kind == STAB_KIND_ATTENTION)
      for (size_t h = 0; h < HEADS; h++) {
        tu_assert_same_double(what, "head bound (f32 monitor)", stab_monitor_head_bounds(mh, i)[h], stab_monitor_head_bounds(mf, i)[h]);
        tu_assert_same_double(what, "head bound (stab_layer_metrics)", stab_monitor_head_bounds(mh, i)[h], heads[h]);
      }
  }

  /* step 1: snapshot, an optimizer step in the stored type, a measurement with the update */
  uint16_t *saved[NBUF] = {NULL};
  float *saved32[NBUF] = {NULL};
  for (int k = 0; k < NBUF; k++)
    if (md.t[k].n) saved[k] = copy16(&md.t[k]), saved32[k] = copy32(&md.t[k]);
  layers_of(&md, saved, lb);
  {
    const void *q[NBUF];
    for (int k = 0; k < NBUF; k++) q[k] = saved32[k];
    model_layers(&md, q, sizeof(float), STAB_DTYPE_F32, lf0);
  }
  TU_ASSERT_OK(stab_monitor_snapshot(mh));
  TU_ASSERT_OK(stab_monitor_snapshot(mf));
  model_step(&md, 77 + (uint64_t)_i);
  TU_ASSERT_OK(stab_monitor_measure(mh, 1));
  TU_ASSERT_OK(stab_monitor_measure(mf, 1));
  ck_assert_msg(stab_monitor_memory(mh) == mem, "memory %zu after two steps, %zu when registered",
                stab_monitor_memory(mh), mem);
  for (size_t i = 0; i < n; i++) {
    snprintf(what, sizeof what, "%s %s, %s, %d thread(s), step 1", dtype_name(t), lh[i].name,
             exact ? "exact" : "lanczos", threads);
    const stab_metrics *got = stab_monitor_metrics(mh, i);
    /* warm-started from step 0 alike: the f32 monitor's bits */
    tu_assert_same_metrics(what, got, stab_monitor_metrics(mf, i));
    const int attention = lh[i].kind == STAB_KIND_ATTENTION;
    stab_metrics want;
    double heads[HEADS];
    TU_ASSERT_OK(stab_layer_metrics(&lh[i], attention ? NULL : &lb[i], &p.metrics, &want, attention ? heads : NULL));
    if (lh[i].kind == STAB_KIND_LINEAR && !exact) {
      /* stab_layer_metrics starts cold; the monitor from step 0's vectors: each within its error */
      near_double(what, "sigma", got->sigma, want.sigma, got->sigma_rel_err + want.sigma_rel_err + 1e-6);
      near_double(what, "sigma_update", got->sigma_update, want.sigma_update,
                  got->sigma_update_rel_err + want.sigma_update_rel_err + 1e-6);
      near_double(what, "forward", got->forward, want.forward, got->sigma_rel_err + want.sigma_rel_err + 1e-6);
      near_double(what, "update", got->update, want.update,
                  got->sigma_update_rel_err + want.sigma_update_rel_err + 1e-6);
      tu_assert_same_double(what, "rel_update", got->rel_update, want.rel_update);
      ck_assert_int_eq(got->flags, want.flags);
    } else if (attention && !exact) {
      for (size_t h = 0; h < HEADS; h++)
        near_double(what, "head bound", stab_monitor_head_bounds(mh, i)[h], heads[h], 4.1e-3);
      near_double(what, "forward", got->forward, want.forward, 4.1e-3);
    } else if (lh[i].kind == STAB_KIND_LINEAR || attention) {
      near_double(what, "sigma", got->sigma, want.sigma, 1e-11);
      near_double(what, "sigma_update", got->sigma_update, want.sigma_update, 1e-11);
      near_double(what, "forward", got->forward, want.forward, 1e-11);
      near_double(what, "update", got->update, want.update, 1e-11);
      tu_assert_same_double(what, "rel_update", got->rel_update, want.rel_update);
      for (size_t h = 0; attention && h < HEADS; h++)
        near_double(what, "head bound", stab_monitor_head_bounds(mh, i)[h], heads[h], 1e-11);
    } else {
      tu_assert_same_metrics(what, got, &want); /* no spectral estimate, so no warm start: the same sums */
    }
    if (!attention) ck_assert_msg(isfinite(got->update) && got->update > 0, "%s: update %g", what, got->update);
    /* independent references of the exactly converted numbers */
    if (lh[i].kind == STAB_KIND_LINEAR) check_linear_ref(what, got, &lf[i], &lf0[i]);
    else if (attention) check_attention_ref(what, stab_monitor_head_bounds(mh, i), &lf[i], exact ? 1e-11 : 4.1e-3);
    else check_other_ref(what, got, &lf[i], &lf0[i]);
  }
  stab_monitor_free(mh);
  stab_monitor_free(mf);
  for (int k = 0; k < NBUF; k++) free(saved[k]), free(saved32[k]);
  model_free(&md);
}
END_TEST

/* The snapshot is a byte copy in the stored type: a 16-bit model's takes half the memory of the
 * same model's in f32, the rows a block of a fused matrix spans (in-major q and v of HF's c_attn:
 * (d_in - 1) * 3C + C elements) and nothing for attention. */
START_TEST(test_snapshot_memory) {
  const stab_dtype t = dtype_of(_i);
  model md;
  model_init(&md, t, 0, 5);
  stab_layer lh[NLAYERS], lf[NLAYERS];
  const size_t n = layers16(&md, lh);
  layers32(&md, lf);
  size_t elements = 0;
  for (size_t i = 0; i < n; i++) {
    const stab_layer *l = &lh[i];
    if (l->kind == STAB_KIND_ATTENTION) continue;
    if (l->kind == STAB_KIND_LINEAR) {
      size_t rows, cols, ld;
      stored(l, &rows, &cols, &ld);
      elements += (rows - 1) * ld + cols + (l->bias ? l->d_out : 0);
    } else {
      elements += l->kind == STAB_KIND_EMBEDDING || l->kind == STAB_KIND_LM_HEAD ? (size_t)V * C : C;
    }
  }
  stab_monitor_params snap = stab_monitor_default_params(), none = snap;
  none.update_mode = STAB_UPDATE_NONE;
  snap.metrics.spectral.threads = none.metrics.spectral.threads = 1;
  stab_monitor *hs = make_monitor(&snap, lh, n), *hn = make_monitor(&none, lh, n);
  stab_monitor *fs = make_monitor(&snap, lf, n), *fn = make_monitor(&none, lf, n);
  const size_t dh = stab_monitor_memory(hs) - stab_monitor_memory(hn);
  const size_t df = stab_monitor_memory(fs) - stab_monitor_memory(fn);
  ck_assert_msg(dh == 2 * elements && df == 4 * elements, "%s: snapshots of %zu elements take %zu bytes (f32: %zu)",
                dtype_name(t), elements, dh, df);
  stab_monitor_free(hs), stab_monitor_free(hn), stab_monitor_free(fs), stab_monitor_free(fn);
  model_free(&md);
}
END_TEST

/* GIVEN mode: the update handed per layer is stored as the layer is (a bf16 model's gradient
 * step in bf16), read as such: the bits of an f32 monitor given the same update as f32, and the
 * update's sigma within its reported error of dgesvd's. */
START_TEST(test_given_update) {
  const stab_dtype t = dtype_of(_i);
  char what[200];
  model md, up;
  model_init(&md, t, 0, 9);
  model_init(&up, t, 0, 10); /* the updates: random 16-bit numbers of the same shapes */
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = STAB_UPDATE_GIVEN;
  stab_layer lh[NLAYERS], lf[NLAYERS], uh[NLAYERS], uf[NLAYERS];
  const size_t n = layers16(&md, lh);
  layers32(&md, lf);
  layers16(&up, uh);
  layers32(&up, uf);
  stab_monitor *mh = make_monitor(&p, lh, n), *mf = make_monitor(&p, lf, n);
  for (size_t i = 0; i < n; i++) {
    if (lh[i].kind == STAB_KIND_ATTENTION) continue;
    TU_ASSERT_OK(stab_monitor_set_update(mh, i, uh[i].weight, uh[i].bias), "%s", lh[i].name);
    TU_ASSERT_OK(stab_monitor_set_update(mf, i, uf[i].weight, uf[i].bias), "%s", lh[i].name);
  }
  TU_ASSERT_OK(stab_monitor_measure(mh, 1));
  TU_ASSERT_OK(stab_monitor_measure(mf, 1));
  for (size_t i = 0; i < n; i++) {
    snprintf(what, sizeof what, "%s %s, given update", dtype_name(t), lh[i].name);
    const stab_metrics *got = stab_monitor_metrics(mh, i);
    tu_assert_same_metrics(what, got, stab_monitor_metrics(mf, i));
    if (lh[i].kind != STAB_KIND_LINEAR) continue;
    size_t rows, cols, ld;
    stored(&lf[i], &rows, &cols, &ld);
    const double su = ref_sigma(uf[i].weight, rows, cols, ld);
    ck_assert_msg(fabs(got->sigma_update - su) <= (got->sigma_update_rel_err + tu_round_slack(rows, cols)) * su,
                  "%s: sigma_update %.17g, dgesvd %.17g (reported %.3g)", what, got->sigma_update, su,
                  got->sigma_update_rel_err);
    const double k = sqrt((double)lf[i].d_in / (double)lf[i].d_out);
    near_double(what, "update", got->update, k * got->sigma_update + ref_rms(uf[i].bias, lf[i].d_out, 1), 1e-14);
  }
  stab_monitor_free(mh);
  stab_monitor_free(mf);
  model_free(&md);
  model_free(&up);
}
END_TEST

/* An external 16-bit layer (its shards on other processes): registered with its dtype, never
 * read (NULL weights), skipped by snapshots and measurements, its metrics as set; beside it a
 * 16-bit layer measured as usual. */
START_TEST(test_external) {
  const stab_dtype t = dtype_of(_i);
  model md;
  model_init(&md, t, 0, 12);
  stab_layer lh[NLAYERS];
  layers16(&md, lh);
  stab_monitor *m = make_monitor(NULL, lh, 1);
  const stab_layer ext = {.name = "split.fc", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = FF, .dtype = t};
  size_t i;
  TU_ASSERT_OK(stab_monitor_add_external(m, &ext, &i));
  ck_assert_int_eq(stab_monitor_layer(m, i)->dtype, t);
  TU_ASSERT_OK(stab_monitor_snapshot(m));
  TU_ASSERT_OK(stab_monitor_measure(m, 1));
  TU_ASSERT_NAN(stab_monitor_metrics(m, i)->forward, "external, not set");
  stab_metrics set = *stab_monitor_metrics(m, 0);
  TU_ASSERT_OK(stab_monitor_set_metrics(m, i, &set, NULL));
  tu_assert_same_metrics("external", stab_monitor_metrics(m, i), &set);
  ck_assert_msg(stab_monitor_metrics(m, 0)->sigma > 0, "the measured layer: sigma %g", stab_monitor_metrics(m, 0)->sigma);
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

static Suite *monitor_dtype_suite(void) {
  Suite *s = suite_create("monitor_dtype");
  TCase *tc = tcase_create("bf16_f16");
  tcase_set_timeout(tc, 0);
  tcase_add_loop_test(tc, test_snapshot_steps, 0, 8);
  tcase_add_loop_test(tc, test_snapshot_memory, 0, 2);
  tcase_add_loop_test(tc, test_given_update, 0, 2);
  tcase_add_loop_test(tc, test_external, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(monitor_dtype_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
