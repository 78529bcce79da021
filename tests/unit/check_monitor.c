/* check_monitor.c — the per-step monitor: registration of every layer kind, lookups and
 * their failures, metrics equal to stab_layer_metrics on the same weights, update metrics
 * in snapshot and given-update modes, warm starts, NaN isolation between layers, and the
 * memory accounting; a step's layers measured on several threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "stabmeter.h"
#include "testutil.h"

#include <sched.h>

/* ---- a small model with one layer of every kind ------------------------------------ */

enum { MAXL = 8, NSLOT = 3 }; /* slots: 0 weight, 1 bias, 2 weight_k */

typedef struct {
  size_t n;
  stab_layer layers[MAXL];
  float *base[MAXL][NSLOT];  /* owned buffers (NULL if the slot is unused) */
  size_t len[MAXL][NSLOT];   /* floats in each buffer */
  size_t off[MAXL];          /* the weight starts at base + off */
  size_t rows[MAXL], cols[MAXL]; /* stored shape of the weight block */
  size_t ld[MAXL];
  int tied;                  /* lm_head reads the embedding's buffer */
} model;

static void add(model *md, stab_layer l, size_t rows, size_t cols, size_t ld, size_t off,
                size_t bias_len, int with_k, tu_rng *r, double std) {
  size_t i = md->n++;
  md->rows[i] = rows, md->cols[i] = cols, md->ld[i] = ld ? ld : cols, md->off[i] = off;
  md->len[i][0] = rows * md->ld[i] + off;
  md->base[i][0] = tu_floats(md->len[i][0]);
  tu_fill_gauss(md->base[i][0], 1, md->len[i][0], md->len[i][0], std, r);
  l.weight = md->base[i][0] + off;
  if (bias_len) {
    md->len[i][1] = bias_len;
    md->base[i][1] = tu_floats(bias_len);
    tu_fill_gauss(md->base[i][1], 1, bias_len, bias_len, 0.1, r);
    l.bias = md->base[i][1];
  }
  if (with_k) {
    md->len[i][2] = md->len[i][0];
    md->base[i][2] = tu_floats(md->len[i][2]);
    tu_fill_gauss(md->base[i][2], 1, md->len[i][2], md->len[i][2], std, r);
    l.weight_k = md->base[i][2] + off;
  }
  md->layers[i] = l;
}

/* fc (linear out-major + bias), proj (linear in-major, a block of a wider matrix through ld),
 * wte (embedding), lm_head, ln_f (gain), b_out (bias), attn (4 heads). */
static void model_init(model *md, uint64_t seed, int tied) {
  memset(md, 0, sizeof *md);
  tu_rng r;
  tu_rng_init(&r, seed);
  add(md, (stab_layer){.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 64, .d_out = 96},
      96, 64, 0, 0, 96, 0, &r, 0.05);
  add(md, (stab_layer){.name = "proj", .kind = STAB_KIND_LINEAR, .d_in = 48, .d_out = 40,
                       .layout = STAB_LAYOUT_IN_MAJOR, .ld = 120},
      48, 40, 120, 40, 0, 0, &r, 0.08);
  add(md, (stab_layer){.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = 200, .width = 32},
      200, 32, 0, 0, 0, 0, &r, 1.0);
  if (tied) {
    size_t i = md->n++;
    md->layers[i] = (stab_layer){.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = 200,
                                 .width = 32, .weight = md->layers[2].weight};
    md->rows[i] = 200, md->cols[i] = 32, md->ld[i] = 32;
    md->tied = 1;
  } else {
    add(md, (stab_layer){.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = 200, .width = 32},
        200, 32, 0, 0, 0, 0, &r, 1.0 / 32.0);
  }
  add(md, (stab_layer){.name = "ln_f", .kind = STAB_KIND_GAIN, .d_in = 32, .d_out = 32},
      1, 32, 0, 0, 0, 0, &r, 1.0);
  add(md, (stab_layer){.name = "b_out", .kind = STAB_KIND_BIAS, .d_in = 32, .d_out = 32},
      1, 32, 0, 0, 0, 0, &r, 0.2);
  add(md, (stab_layer){.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = 32, .d_out = 32,
                       .heads = 4},
      32, 32, 0, 0, 0, 1, &r, 0.15);
}

static void model_free(model *md) {
  for (size_t i = 0; i < md->n; i++)
    for (int s = 0; s < NSLOT; s++) free(md->base[i][s]);
}

/* Floats the monitor has to snapshot: each layer's weight block, bias and weight_k. */
static size_t model_weight_floats(const model *md) {
  size_t n = 0;
  for (size_t i = 0; i < md->n; i++) {
    size_t blk = md->rows[i] * md->cols[i];
    n += blk;
    if (md->layers[i].bias) n += md->layers[i].d_out;
    if (md->layers[i].weight_k) n += blk;
  }
  return n;
}

/* Copies of every owned buffer, and the layers pointing into them (the weights before a step). */
typedef struct {
  float *base[MAXL][NSLOT];
  stab_layer layers[MAXL];
} model_copy;

static void model_copy_take(model_copy *c, const model *md) {
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < md->n; i++) {
    c->layers[i] = md->layers[i];
    for (int s = 0; s < NSLOT; s++) {
      if (!md->base[i][s]) continue;
      c->base[i][s] = tu_floats(md->len[i][s]);
      memcpy(c->base[i][s], md->base[i][s], md->len[i][s] * sizeof(float));
    }
    if (c->base[i][0]) c->layers[i].weight = c->base[i][0] + md->off[i];
    if (c->base[i][1]) c->layers[i].bias = c->base[i][1];
    if (c->base[i][2]) c->layers[i].weight_k = c->base[i][2] + md->off[i];
  }
  if (md->tied) c->layers[3].weight = c->layers[2].weight;
}

static void model_copy_free(model_copy *c) {
  for (size_t i = 0; i < MAXL; i++)
    for (int s = 0; s < NSLOT; s++) free(c->base[i][s]);
}

/* An optimizer step in place: every buffer moves by `rel` of its norm. */
static void model_step(model *md, double rel, tu_rng *r) {
  for (size_t i = 0; i < md->n; i++)
    for (int s = 0; s < NSLOT; s++)
      if (md->base[i][s]) tu_add_relative_noise(md->base[i][s], 1, md->len[i][s], md->len[i][s], rel, r);
}

static stab_monitor *make_monitor(const model *md, stab_update_mode mode,
                                  const stab_metrics_params *mp) {
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = mode;
  if (mp) p.metrics = *mp;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  ck_assert_ptr_nonnull(m);
  for (size_t i = 0; i < md->n; i++) {
    size_t idx = 12345;
    TU_ASSERT_OK(stab_monitor_add_layer(m, &md->layers[i], &idx), "adding %s", md->layers[i].name);
    ck_assert_msg(idx == i, "%s registered as %zu, expected %zu", md->layers[i].name, idx, i);
  }
  return m;
}

static stab_metrics_params exact_params(void) {
  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.method = STAB_SPECTRAL_EXACT;
  p.tight = STAB_TIGHT_EXACT;
  return p;
}

/* Every value field of got equals want within rel (NaN where want is NaN). */
static void compare_metrics(const char *ctx, const stab_metrics *got, const stab_metrics *want,
                            double rel, int with_update) {
  struct { const char *name; double g, w; } f[] = {
      {"forward", got->forward, want->forward},
      {"dependency", got->dependency, want->dependency},
      {"forward_tight", got->forward_tight, want->forward_tight},
      {"dependency_tight", got->dependency_tight, want->dependency_tight},
      {"spread", got->spread, want->spread},
      {"sigma", got->sigma, want->sigma},
      {"update", got->update, want->update},
      {"update_tight", got->update_tight, want->update_tight},
      {"sigma_update", got->sigma_update, want->sigma_update},
      {"rel_update", got->rel_update, want->rel_update},
  };
  size_t nf = with_update ? 10 : 6;
  for (size_t k = 0; k < nf; k++) {
    if (isnan(f[k].w)) {
      ck_assert_msg(isnan(f[k].g), "%s: %s = %.17g, stab_layer_metrics gives NaN", ctx, f[k].name, f[k].g);
      continue;
    }
    ck_assert_msg(isfinite(f[k].g) && tu_rel(f[k].g, f[k].w) <= rel,
                  "%s: %s = %.17g, stab_layer_metrics gives %.17g (rel %.3g > %.3g)", ctx,
                  f[k].name, f[k].g, f[k].w, tu_rel(f[k].g, f[k].w), rel);
  }
  ck_assert_msg(got->flags == want->flags, "%s: flags %#x, stab_layer_metrics gives %#x", ctx,
                (unsigned)got->flags, (unsigned)want->flags);
}

/* ---- lifecycle and lookups ----------------------------------------------------------- */

START_TEST(test_create_free) {
  stab_monitor_free(NULL);
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  ck_assert_ptr_nonnull(m);
  ck_assert_uint_eq(stab_monitor_layer_count(m), 0);
  ck_assert_ptr_null(stab_monitor_layer(m, 0));
  ck_assert_ptr_null(stab_monitor_metrics(m, 0));
  /* measuring nothing is fine */
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_monitor_free(m);

  TU_ASSERT_STATUS(stab_monitor_create(NULL, NULL), STAB_EINVAL);
  stab_monitor_params p = stab_monitor_default_params();
  p.metrics.spectral.tol = 0.0;
  m = NULL;
  TU_ASSERT_FAILS(stab_monitor_create(&p, &m), "tol 0");
  p = stab_monitor_default_params();
  p.update_mode = (stab_update_mode)7;
  TU_ASSERT_FAILS(stab_monitor_create(&p, &m), "update mode 7");
}
END_TEST

START_TEST(test_register_and_lookup) {
  model md;
  model_init(&md, 1, 0);
  stab_monitor *m = make_monitor(&md, STAB_UPDATE_SNAPSHOT, NULL);
  ck_assert_uint_eq(stab_monitor_layer_count(m), md.n);
  for (size_t i = 0; i < md.n; i++) {
    const stab_layer *l = stab_monitor_layer(m, i);
    ck_assert_ptr_nonnull(l);
    ck_assert_str_eq(l->name, md.layers[i].name);
    ck_assert_msg(l->name != md.layers[i].name, "%s: the monitor did not copy the name", l->name);
    ck_assert_int_eq(l->kind, md.layers[i].kind);
    if (l->kind == STAB_KIND_EMBEDDING || l->kind == STAB_KIND_LM_HEAD) {
      /* registered as vocab 200, width 32 (d_in, d_out 0): the copy has them in the kind's
       * math, embedding 200 -> 32, lm_head 32 -> 200, the values a trace records */
      ck_assert_uint_eq(l->vocab, 200);
      ck_assert_uint_eq(l->width, 32);
      ck_assert_uint_eq(l->d_in, (l->kind == STAB_KIND_EMBEDDING ? 200 : 32));
      ck_assert_uint_eq(l->d_out, (l->kind == STAB_KIND_EMBEDDING ? 32 : 200));
    } else {
      ck_assert_uint_eq(l->d_in, md.layers[i].d_in);
      ck_assert_uint_eq(l->d_out, md.layers[i].d_out);
      ck_assert_uint_eq(l->vocab, 0);
      ck_assert_uint_eq(l->width, 0);
    }
    ck_assert_ptr_eq(l->weight, md.layers[i].weight);
    size_t idx = 999;
    TU_ASSERT_OK(stab_monitor_find(m, md.layers[i].name, &idx));
    ck_assert_uint_eq(idx, i);
    /* not measured yet: NaN */
    const stab_metrics *mt = stab_monitor_metrics(m, i);
    ck_assert_ptr_nonnull(mt);
    TU_ASSERT_NAN(mt->forward, "%s before any measurement", l->name);
  }
  size_t idx;
  TU_ASSERT_STATUS(stab_monitor_find(m, "no such layer", &idx), STAB_ENOTFOUND);
  ck_assert_ptr_null(stab_monitor_layer(m, md.n));
  ck_assert_ptr_null(stab_monitor_layer(m, (size_t)-1));
  ck_assert_ptr_null(stab_monitor_metrics(m, md.n));
  ck_assert_ptr_null(stab_monitor_head_bounds(m, md.n));
  ck_assert_ptr_null(stab_monitor_head_bounds(m, 0));  // linear: no heads

  /* duplicate names are refused and change nothing */
  stab_layer dup = md.layers[4];
  TU_ASSERT_STATUS(stab_monitor_add_layer(m, &dup, &idx), STAB_EEXIST);
  ck_assert_uint_eq(stab_monitor_layer_count(m), md.n);

  /* invalid layers are refused and change nothing */
  stab_layer bad = md.layers[0];
  bad.name = "bad dims";
  bad.d_in = 0;
  TU_ASSERT_STATUS(stab_monitor_add_layer(m, &bad, &idx), STAB_EDIM);
  bad = md.layers[6];
  bad.name = "bad heads";
  bad.heads = 5;
  TU_ASSERT_FAILS(stab_monitor_add_layer(m, &bad, &idx), "heads 5 for d_out 32");
  TU_ASSERT_STATUS(stab_monitor_add_layer(m, NULL, &idx), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_monitor_add_layer(NULL, &md.layers[0], &idx), STAB_EINVAL);
  ck_assert_uint_eq(stab_monitor_layer_count(m), md.n);
  TU_ASSERT_STATUS(stab_monitor_find(m, "bad dims", &idx), STAB_ENOTFOUND);

  /* a long name in a buffer the caller then reuses; index may be NULL */
  enum { LONG = 5000 };
  char *name = malloc(LONG + 1);
  memset(name, 'x', LONG);
  name[LONG] = '\0';
  stab_layer lng = md.layers[5];
  lng.name = name;
  TU_ASSERT_OK(stab_monitor_add_layer(m, &lng, NULL));
  name[0] = 'z';  // the caller's buffer now says something else
  char *orig = malloc(LONG + 1);
  memset(orig, 'x', LONG);
  orig[LONG] = '\0';
  TU_ASSERT_OK(stab_monitor_find(m, orig, &idx), "the 5000-character name");
  ck_assert_uint_eq(idx, md.n);
  ck_assert_str_eq(stab_monitor_layer(m, md.n)->name, orig);
  TU_ASSERT_STATUS(stab_monitor_find(m, name, &idx), STAB_ENOTFOUND);
  ck_assert_uint_eq(stab_monitor_layer_count(m), md.n + 1);
  free(name);
  free(orig);
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* Thousands of layers (a mixture of experts): every one is found by its name, and every name
 * registered again is refused, through the monitor's name index as it grows. */
START_TEST(test_many_names) {
  enum { N = 3000 };
  float b[4] = {1, 2, 3, 4};
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  char name[32];
  for (size_t i = 0; i < N; i++) {
    snprintf(name, sizeof name, "blk.%zu.ffn_down.%zu", i / 64, i % 64);
    stab_layer l = {.name = name, .kind = STAB_KIND_BIAS, .d_in = 4, .d_out = 4, .weight = b};
    size_t idx = 0;
    TU_ASSERT_OK(stab_monitor_add_layer(m, &l, &idx));
    ck_assert_uint_eq(idx, i);
  }
  for (size_t i = 0; i < N; i++) {
    snprintf(name, sizeof name, "blk.%zu.ffn_down.%zu", i / 64, i % 64);
    size_t idx = 0;
    TU_ASSERT_OK(stab_monitor_find(m, name, &idx));
    ck_assert_uint_eq(idx, i);
    ck_assert_str_eq(stab_monitor_layer(m, idx)->name, name);
    stab_layer again = {.name = name, .kind = STAB_KIND_BIAS, .d_in = 4, .d_out = 4, .weight = b};
    TU_ASSERT_STATUS(stab_monitor_add_layer(m, &again, NULL), STAB_EEXIST);
  }
  size_t idx;
  TU_ASSERT_STATUS(stab_monitor_find(m, "blk.0.ffn_down", &idx), STAB_ENOTFOUND);
  ck_assert_uint_eq(stab_monitor_layer_count(m), N);
  stab_monitor_free(m);
  /* an empty monitor finds nothing */
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  TU_ASSERT_STATUS(stab_monitor_find(m, "x", &idx), STAB_ENOTFOUND);
  stab_monitor_free(m);
}
END_TEST

/* ---- measurements vs stab_layer_metrics ---------------------------------------------- */

/* Loop index 0: EXACT spectral + EXACT tight (to rounding); 1: defaults (LANCZOS, CENTRED). */
START_TEST(test_measure_matches_layer_metrics) {
  model md;
  model_init(&md, 2, 0);
  stab_metrics_params p = _i == 0 ? exact_params() : stab_metrics_default_params();
  double rel = _i == 0 ? 1e-11 : 4.1e-3;
  stab_monitor *m = make_monitor(&md, STAB_UPDATE_NONE, &p);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  for (size_t i = 0; i < md.n; i++) {
    double heads[8];
    stab_metrics want;
    TU_ASSERT_OK(stab_layer_metrics(&md.layers[i], NULL, &p, &want,
                                    md.layers[i].kind == STAB_KIND_ATTENTION ? heads : NULL));
    const stab_metrics *got = stab_monitor_metrics(m, i);
    ck_assert_ptr_nonnull(got);
    char ctx[100];
    snprintf(ctx, sizeof ctx, "%s (%s)", md.layers[i].name, _i == 0 ? "exact" : "defaults");
    compare_metrics(ctx, got, &want, rel, 0);
    TU_ASSERT_NAN(got->update, "%s: measured without update", ctx);
    if (md.layers[i].kind == STAB_KIND_ATTENTION) {
      const double *hb = stab_monitor_head_bounds(m, i);
      ck_assert_ptr_nonnull(hb);
      for (size_t h = 0; h < md.layers[i].heads; h++)
        TU_ASSERT_REL(hb[h], heads[h], rel, "%s head %zu", ctx, h);
    }
  }
  /* a tied table registered as embedding and lm_head */
  stab_monitor_free(m);
  model_free(&md);
  model_init(&md, 3, 1);
  m = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  for (size_t i = 2; i <= 3; i++) {
    stab_metrics want;
    TU_ASSERT_OK(stab_layer_metrics(&md.layers[i], NULL, &p, &want, NULL));
    compare_metrics(i == 2 ? "tied wte" : "tied lm_head", stab_monitor_metrics(m, i), &want, rel, 0);
  }
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* Snapshot mode over three steps; update metrics equal stab_layer_metrics with `before`. */
START_TEST(test_snapshot_mode) {
  model md;
  model_init(&md, 4, _i);  // loop 1: tied embedding / lm_head
  stab_metrics_params p = exact_params();
  stab_monitor *m = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p);
  tu_rng r;
  tu_rng_init(&r, 44);

  /* no snapshot yet */
  TU_ASSERT_STATUS(stab_monitor_measure(m, 1), STAB_ESTATE);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  size_t mem = stab_monitor_memory(m);
  for (int step = 0; step < 3; step++) {
    model_copy before;
    model_copy_take(&before, &md);
    TU_ASSERT_OK(stab_monitor_snapshot(m));
    model_step(&md, step == 1 ? 1e-2 : 1e-3, &r);
    TU_ASSERT_OK(stab_monitor_measure(m, 1), "step %d", step);
    for (size_t i = 0; i < md.n; i++) {
      stab_metrics want;
      double heads[8];
      TU_ASSERT_OK(stab_layer_metrics(&md.layers[i], &before.layers[i], &p, &want,
                                      md.layers[i].kind == STAB_KIND_ATTENTION ? heads : NULL));
      char ctx[100];
      snprintf(ctx, sizeof ctx, "step %d, %s%s", step, md.layers[i].name, md.tied ? " (tied)" : "");
      const stab_metrics *got = stab_monitor_metrics(m, i);
      if (md.layers[i].kind != STAB_KIND_ATTENTION)  // no update is defined for attention
        ck_assert_msg(isfinite(want.update), "%s: reference update %g", ctx, want.update);
      compare_metrics(ctx, got, &want, 1e-11, 1);
    }
    /* the snapshot is used up by the measurement */
    TU_ASSERT_STATUS(stab_monitor_measure(m, 1), STAB_ESTATE, "step %d, second measure", step);
    TU_ASSERT_OK(stab_monitor_measure(m, 0));
    model_copy_free(&before);
  }
  ck_assert_msg(stab_monitor_memory(m) == mem, "memory grew from %zu to %zu while measuring", mem,
                stab_monitor_memory(m));
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* Given-update mode: the update metrics are those of the handed dW. */
START_TEST(test_given_mode) {
  model md;
  model_init(&md, 5, 0);
  stab_metrics_params p = exact_params();
  stab_monitor *m = make_monitor(&md, STAB_UPDATE_GIVEN, &p);
  tu_rng r;
  tu_rng_init(&r, 55);
  TU_ASSERT_STATUS(stab_monitor_measure(m, 1), STAB_ESTATE);
  float dummy[4] = {0};
  TU_ASSERT_STATUS(stab_monitor_set_update(m, md.n, dummy, NULL), STAB_ENOTFOUND);

  /* dW buffers shaped like the weights (same ld and offset) */
  float *du[MAXL][NSLOT];
  memset(du, 0, sizeof du);
  for (size_t i = 0; i < md.n; i++) {
    for (int s = 0; s < NSLOT; s++) {
      if (!md.base[i][s]) continue;
      du[i][s] = tu_matrix_padded(1, md.len[i][s], md.len[i][s]);
      tu_fill_gauss(du[i][s], 1, md.len[i][s], md.len[i][s], 1e-3 * (double)(i + 1), &r);
    }
    const stab_layer *l = &md.layers[i];
    TU_ASSERT_OK(stab_monitor_set_update(m, i, du[i][0] + md.off[i], l->bias ? du[i][1] : NULL),
                 "%s", l->name);
  }
  size_t mem = stab_monitor_memory(m);
  TU_ASSERT_OK(stab_monitor_measure(m, 1));
  ck_assert_uint_eq(stab_monitor_memory(m), mem);

  for (size_t i = 0; i < md.n; i++) {
    const stab_layer *l = &md.layers[i];
    const stab_metrics *got = stab_monitor_metrics(m, i);
    const float *dw = du[i][0] + md.off[i];
    size_t rows = md.rows[i], cols = md.cols[i], ld = md.ld[i];
    double *dd = tu_to_double(dw, NULL, rows, cols, ld, 0);
    double want = NAN, want_tight = NAN;
    switch (l->kind) {
    case STAB_KIND_LINEAR: {
      double db = l->bias ? ref_rms(du[i][1], l->d_out, 1) : 0.0;
      want = sqrt((double)l->d_in / (double)l->d_out) * ref_sigma(dw, rows, cols, ld) + db;
      TU_ASSERT_REL(got->sigma_update, ref_sigma(dw, rows, cols, ld), tu_tol_exact(rows, cols),
                    "%s sigma_update", l->name);
      break;
    }
    case STAB_KIND_EMBEDDING:
      want = ref_max_row_rms_d(dd, rows, cols);
      break;
    case STAB_KIND_LM_HEAD:
      want = 2.0 * (double)l->width * ref_max_row_rms_d(dd, rows, cols);
      want_tight = (double)l->width * ref_diameter_rows_d(dd, rows, cols);
      break;
    case STAB_KIND_GAIN:
      want = 0.0;
      for (size_t j = 0; j < cols; j++) want = fmax(want, fabs((double)dw[j]));
      break;
    case STAB_KIND_BIAS:
      want = ref_rms(dw, cols, 1);
      break;
    default:
      break;
    }
    if (!isnan(want)) TU_ASSERT_REL(got->update, want, tu_tol_exact(rows, cols), "%s update from dW", l->name);
    if (!isnan(want_tight))
      TU_ASSERT_REL(got->update_tight, want_tight, 1e-9, "%s update_tight from dW", l->name);
    /* forward is still that of the live weights */
    stab_metrics ref;
    TU_ASSERT_OK(stab_layer_metrics(l, NULL, &p, &ref, NULL));
    TU_ASSERT_REL(got->forward, ref.forward, 1e-11, "%s forward in given mode", l->name);
    free(dd);
  }
  for (size_t i = 0; i < md.n; i++)
    for (int s = 0; s < NSLOT; s++) free(du[i][s]);
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* ---- warm start ------------------------------------------------------------------------ */

START_TEST(test_warm_start) {
  enum { DIN = 192, DOUT = 256 };
  tu_rng r;
  tu_rng_init(&r, 66);
  float *w = tu_floats(DIN * DOUT);
  tu_fill_gauss(w, DOUT, DIN, DIN, 1.0 / sqrt((double)DIN), &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT, .weight = w};
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &l, NULL));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_metrics first = *stab_monitor_metrics(m, 0);
  double c = sqrt((double)DIN / (double)DOUT);
  TU_ASSERT_REL(first.forward, c * ref_sigma(w, DOUT, DIN, DIN), 1e-3, "cold measurement");
  tu_add_relative_noise(w, DOUT, DIN, DIN, 1e-3, &r);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_metrics second = *stab_monitor_metrics(m, 0);
  TU_ASSERT_REL(second.forward, c * ref_sigma(w, DOUT, DIN, DIN), 1e-3, "warm measurement");
  TU_ASSERT_LE(second.forward, c * ref_sigma(w, DOUT, DIN, DIN), tu_round_slack(DIN, DOUT), "warm");
  ck_assert_msg(second.passes < first.passes,
                "warm start after a 1e-3 step took %d passes, the cold start %d", second.passes,
                first.passes);
  stab_monitor_free(m);
  free(w);
}
END_TEST

/* ---- NaN isolation --------------------------------------------------------------------- */

static char messages[8192];
static void capture(void *user, const char *msg) {
  (void)user;
  size_t n = strlen(messages);
  snprintf(messages + n, sizeof messages - n, "%s\n", msg);
}

START_TEST(test_nan_isolation) {
  model md;
  model_init(&md, 7, 0);
  stab_metrics_params p = exact_params();
  /* a bad copy of fc registered first, then the model */
  float *bad = tu_floats(96 * 64);
  memcpy(bad, md.layers[0].weight, sizeof(float) * 96 * 64);
  bad[5 * 64 + 9] = NAN;
  stab_layer bl = md.layers[0];
  bl.name = "poisoned.layer";
  bl.weight = bad;
  stab_monitor_params mp = stab_monitor_default_params();
  mp.metrics = p;
  stab_monitor *m = NULL, *clean = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p);
  TU_ASSERT_OK(stab_monitor_create(&mp, &m));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &bl, NULL));
  for (size_t i = 0; i < md.n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &md.layers[i], NULL));

  messages[0] = '\0';
  stab_set_message_handler(capture, NULL);
  TU_ASSERT_OK(stab_monitor_snapshot(m));
  TU_ASSERT_OK(stab_monitor_snapshot(clean));
  tu_rng r;
  tu_rng_init(&r, 77);
  model_step(&md, 1e-3, &r);
  TU_ASSERT_OK(stab_monitor_measure(m, 1));
  TU_ASSERT_OK(stab_monitor_measure(clean, 1));
  stab_set_message_handler(NULL, NULL);

  const stab_metrics *b = stab_monitor_metrics(m, 0);
  ck_assert_msg(b->flags & STAB_FLAG_NONFINITE_WEIGHT, "poisoned layer flags %#x", (unsigned)b->flags);
  TU_ASSERT_NAN(b->forward, "poisoned layer");
  TU_ASSERT_NAN(b->sigma, "poisoned layer");
  ck_assert_msg(strstr(messages, "poisoned.layer") != NULL,
                "no message names the poisoned layer; messages were:\n%s", messages);
  for (size_t i = 0; i < md.n; i++) {
    char ctx[100];
    snprintf(ctx, sizeof ctx, "%s next to a NaN layer", md.layers[i].name);
    compare_metrics(ctx, stab_monitor_metrics(m, i + 1), stab_monitor_metrics(clean, i), 1e-11, 1);
    if (md.layers[i].kind == STAB_KIND_ATTENTION)
      TU_ASSERT_REL(stab_monitor_head_bounds(m, i + 1)[0], stab_monitor_head_bounds(clean, i)[0],
                    1e-11, "%s", ctx);
  }

  /* the layer recovers once its weights are finite again */
  bad[5 * 64 + 9] = 0.01f;
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_metrics want;
  TU_ASSERT_OK(stab_layer_metrics(&bl, NULL, &p, &want, NULL));
  compare_metrics("poisoned layer repaired", stab_monitor_metrics(m, 0), &want, 1e-11, 0);

  /* and with the default (Lanczos) method too: NaN does not poison the warm-start vector */
  stab_monitor_free(m);
  m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &bl, NULL));
  bad[5 * 64 + 9] = INFINITY;
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_NAN(stab_monitor_metrics(m, 0)->forward, "Inf, Lanczos");
  bad[5 * 64 + 9] = 0.01f;
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_REL(stab_monitor_metrics(m, 0)->forward, want.forward, 1e-3, "repaired, Lanczos");

  stab_monitor_free(m);
  stab_monitor_free(clean);
  free(bad);
  model_free(&md);
}
END_TEST

/* ---- memory and states ----------------------------------------------------------------- */

START_TEST(test_memory) {
  model md;
  model_init(&md, 8, 0);
  stab_monitor *none = make_monitor(&md, STAB_UPDATE_NONE, NULL);
  stab_monitor *given = make_monitor(&md, STAB_UPDATE_GIVEN, NULL);
  stab_monitor *snap = make_monitor(&md, STAB_UPDATE_SNAPSHOT, NULL);
  size_t mn = stab_monitor_memory(none), mg = stab_monitor_memory(given),
         ms = stab_monitor_memory(snap);
  size_t weights = model_weight_floats(&md) * sizeof(float);
  ck_assert_msg(mn > 0 && mg > 0, "memory: none %zu, given %zu", mn, mg);
  ck_assert_msg(ms >= mn + weights,
                "snapshot monitor reports %zu bytes, the NONE one %zu: the snapshot copy of %zu "
                "bytes of weights is not counted",
                ms, mn, weights);
  ck_assert_msg(ms >= mg + weights, "snapshot monitor %zu bytes, given-update one %zu, weights %zu",
                ms, mg, weights);
  /* snapshot and measure allocate nothing */
  TU_ASSERT_OK(stab_monitor_measure(snap, 0));
  TU_ASSERT_OK(stab_monitor_snapshot(snap));
  TU_ASSERT_OK(stab_monitor_measure(snap, 1));
  TU_ASSERT_OK(stab_monitor_measure(none, 0));
  ck_assert_uint_eq(stab_monitor_memory(snap), ms);
  ck_assert_uint_eq(stab_monitor_memory(none), mn);
  /* a layer more, more memory */
  stab_layer extra = md.layers[0];
  extra.name = "fc.again";
  TU_ASSERT_OK(stab_monitor_add_layer(snap, &extra, NULL));
  ck_assert_msg(stab_monitor_memory(snap) >= ms + 96 * 64 * sizeof(float),
                "adding a 96x64 layer grew the snapshot monitor from %zu to %zu bytes", ms,
                stab_monitor_memory(snap));
  stab_monitor_free(none);
  stab_monitor_free(given);
  stab_monitor_free(snap);
  model_free(&md);
}
END_TEST

START_TEST(test_states_and_arguments) {
  model md;
  model_init(&md, 9, 0);
  stab_monitor *none = make_monitor(&md, STAB_UPDATE_NONE, NULL);
  TU_ASSERT_FAILS(stab_monitor_measure(none, 1), "with_update in NONE mode");
  TU_ASSERT_OK(stab_monitor_measure(none, 0));
  TU_ASSERT_STATUS(stab_monitor_measure(NULL, 0), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_monitor_snapshot(NULL), STAB_EINVAL);
  size_t idx;
  TU_ASSERT_STATUS(stab_monitor_find(NULL, "fc", &idx), STAB_EINVAL);
  stab_monitor_free(none);
  model_free(&md);
}
END_TEST

/* Metrics measured elsewhere are what the monitor hands back afterwards (the probe records
 * a checkpoint's metrics this way for the trace); measuring again replaces them. */
START_TEST(test_set_metrics) {
  float w[4 * 6] = {0}, k[4 * 6] = {0};
  for (int i = 0; i < 24; i++) w[i] = (float)(i % 5) - 2.0f, k[i] = (float)(i % 3);
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  stab_layer fc = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 6, .d_out = 4, .weight = w};
  stab_layer at = {.name = "at", .kind = STAB_KIND_ATTENTION, .d_in = 6, .d_out = 4, .heads = 2, .weight = w,
                   .weight_k = k};
  TU_ASSERT_OK(stab_monitor_add_layer(m, &fc, NULL));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &at, NULL));
  stab_metrics x;
  memset(&x, 0, sizeof x);
  x.forward = 1.5, x.dependency = 2.5, x.update = NAN, x.sigma = 3.5, x.passes = 7, x.flags = STAB_FLAG_NOT_CONVERGED;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, 0, &x, NULL));
  const stab_metrics *got = stab_monitor_metrics(m, 0);
  ck_assert(got->forward == 1.5 && got->dependency == 2.5 && isnan(got->update) && got->sigma == 3.5);
  ck_assert_int_eq(got->passes, 7);
  ck_assert_int_eq(got->flags, STAB_FLAG_NOT_CONVERGED);
  const double hb[2] = {0.25, 0.75};
  TU_ASSERT_OK(stab_monitor_set_metrics(m, 1, &x, hb));
  ck_assert(stab_monitor_head_bounds(m, 1)[0] == 0.25 && stab_monitor_head_bounds(m, 1)[1] == 0.75);
  TU_ASSERT_OK(stab_monitor_set_metrics(m, 1, &x, NULL));
  ck_assert(isnan(stab_monitor_head_bounds(m, 1)[0]) && isnan(stab_monitor_head_bounds(m, 1)[1]));
  TU_ASSERT_STATUS(stab_monitor_set_metrics(m, 2, &x, NULL), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_monitor_set_metrics(m, 0, NULL, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_monitor_set_metrics(NULL, 0, &x, NULL), STAB_EINVAL);
  /* a measurement replaces them with the real ones */
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_metrics ref;
  TU_ASSERT_OK(stab_layer_metrics(&fc, NULL, NULL, &ref, NULL));
  ck_assert(fabs(stab_monitor_metrics(m, 0)->dependency - ref.dependency) <= 1e-3 * ref.dependency);
  stab_monitor_free(m);
}
END_TEST

/* ---- the reference: each metric's first finite value > 0 --------------------------------- */

/* Bit for bit: a reference is a copy of a measured value, NaN only where none was seen. */
static void assert_ref(double got, double want, const char *what, const char *layer) {
  ck_assert_msg((isnan(got) && isnan(want)) || memcmp(&got, &want, sizeof got) == 0,
                "%s reference of %s: %.17g, expected %.17g", what, layer, got, want);
}

/* A first measurement without an update gives forward and dependency their reference, the
 * first with one update's; later ones change nothing. measure_some keeps the layers it skips
 * unreferenced; set_reference replaces the reference, leaving NaN (and non-positive) fields to
 * the next measurement. */
START_TEST(test_reference) {
  model md;
  model_init(&md, 12, 0);
  stab_monitor *m = make_monitor(&md, STAB_UPDATE_SNAPSHOT, NULL);
  tu_rng r;
  tu_rng_init(&r, 8);
  for (size_t i = 0; i < md.n; i++) {
    const stab_metrics *ref = stab_monitor_reference(m, i);
    ck_assert_ptr_nonnull(ref);
    ck_assert(isnan(ref->forward) && isnan(ref->dependency) && isnan(ref->update) && isnan(ref->sigma));
  }
  ck_assert_ptr_null(stab_monitor_reference(m, md.n));
  ck_assert_ptr_null(stab_monitor_reference(NULL, 0));
  /* layer 0 skipped at first */
  unsigned char which[MAXL];
  memset(which, 1, sizeof which);
  which[0] = 0;
  TU_ASSERT_OK(stab_monitor_measure_some(m, 0, which));
  TU_ASSERT_NAN(stab_monitor_reference(m, 0)->forward, "a layer measure_some skipped");
  stab_metrics first[MAXL];
  for (size_t i = 1; i < md.n; i++) first[i] = *stab_monitor_metrics(m, i);
  TU_ASSERT_OK(stab_monitor_measure(m, 0)); /* warm-started: other bits than the first */
  first[0] = *stab_monitor_metrics(m, 0);
  for (size_t i = 0; i < md.n; i++) {
    const stab_metrics *ref = stab_monitor_reference(m, i);
    const char *name = md.layers[i].name;
    ck_assert_msg(isfinite(first[i].forward) && first[i].forward > 0, "%s: forward %g", name, first[i].forward);
    /* layer 0 at this measurement; the others at measure_some's, the same weights */
    assert_ref(ref->forward, first[i].forward, "forward", name);
    assert_ref(ref->dependency, first[i].dependency, "dependency", name);
    TU_ASSERT_NAN(ref->update, "%s: measured without an update", name);
  }
  stab_metrics second[MAXL];
  for (int step = 0; step < 2; step++) {
    TU_ASSERT_OK(stab_monitor_snapshot(m));
    model_step(&md, 0.05, &r);
    TU_ASSERT_OK(stab_monitor_measure(m, 1));
    if (step == 0)
      for (size_t i = 0; i < md.n; i++) second[i] = *stab_monitor_metrics(m, i);
  }
  for (size_t i = 0; i < md.n; i++) {
    const stab_metrics *ref = stab_monitor_reference(m, i), *now = stab_monitor_metrics(m, i);
    const char *name = md.layers[i].name;
    ck_assert_msg(now->forward != first[i].forward, "%s: the weights did not change", name);
    assert_ref(ref->forward, first[i].forward, "forward", name);
    assert_ref(ref->update, second[i].update, "update", name); /* NaN for attention */
    if (md.layers[i].kind != STAB_KIND_ATTENTION) ck_assert(isfinite(ref->update) && ref->update != now->update);
  }
  /* set_reference: 2 kept, NaN and -1 left to the next measurement */
  stab_metrics x;
  memset(&x, 0, sizeof x);
  x.forward = 2.0, x.dependency = NAN, x.update = -1.0, x.sigma = 5.0;
  TU_ASSERT_OK(stab_monitor_set_reference(m, 0, &x));
  const stab_metrics *ref0 = stab_monitor_reference(m, 0);
  ck_assert(ref0->forward == 2.0 && isnan(ref0->dependency) && isnan(ref0->update) && isnan(ref0->sigma));
  TU_ASSERT_OK(stab_monitor_snapshot(m));
  model_step(&md, 0.05, &r);
  TU_ASSERT_OK(stab_monitor_measure(m, 1));
  ck_assert(ref0->forward == 2.0);
  assert_ref(ref0->dependency, stab_monitor_metrics(m, 0)->dependency, "dependency after set_reference", "fc");
  assert_ref(ref0->update, stab_monitor_metrics(m, 0)->update, "update after set_reference", "fc");
  TU_ASSERT_STATUS(stab_monitor_set_reference(m, md.n, &x), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_monitor_set_reference(m, 0, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_monitor_set_reference(NULL, 0, &x), STAB_EINVAL);
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* A zero bias (forward 0) and non-finite weights (NaN metrics) give no reference; the first
 * measurement where the value is finite and > 0 does. External layers get theirs from
 * stab_monitor_set_metrics. */
START_TEST(test_reference_late) {
  float b[8] = {0}, g[8];
  for (int i = 0; i < 8; i++) g[i] = 1.0f + 0.125f * (float)i;
  g[3] = NAN;
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  stab_layer bias = {.name = "b", .kind = STAB_KIND_BIAS, .d_in = 8, .d_out = 8, .weight = b};
  stab_layer gain = {.name = "g", .kind = STAB_KIND_GAIN, .d_in = 8, .d_out = 8, .weight = g};
  stab_layer ext = {.name = "ext", .kind = STAB_KIND_LINEAR, .d_in = 6, .d_out = 4};
  size_t ie;
  TU_ASSERT_OK(stab_monitor_add_layer(m, &bias, NULL));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &gain, NULL));
  TU_ASSERT_OK(stab_monitor_add_external(m, &ext, &ie));
  stab_monitor_measure(m, 0); /* whatever it says of the NaN, the gain gets NaN metrics and a flag */
  ck_assert(stab_monitor_metrics(m, 0)->forward == 0.0);
  TU_ASSERT_NAN(stab_monitor_reference(m, 0)->forward, "a zero bias");
  TU_ASSERT_NAN(stab_monitor_reference(m, 1)->forward, "a gain holding NaN");
  TU_ASSERT_NAN(stab_monitor_reference(m, ie)->forward, "an external layer never set");
  b[2] = 2.0f, g[3] = 0.5f; /* ||b||_RMS = sqrt(4/8), max |g| = 1.875 */
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  ck_assert_double_eq_tol(stab_monitor_reference(m, 0)->forward, sqrt(0.5), 1e-12);
  ck_assert_double_eq_tol(stab_monitor_reference(m, 1)->forward, 1.875, 1e-12);
  ck_assert_double_eq_tol(stab_monitor_reference(m, 1)->dependency, 1.875, 1e-12);
  b[2] = 4.0f;
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  ck_assert_double_eq_tol(stab_monitor_reference(m, 0)->forward, sqrt(0.5), 1e-12);
  stab_metrics x;
  memset(&x, 0, sizeof x);
  x.forward = NAN, x.dependency = 0.0, x.update = INFINITY;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, ie, &x, NULL));
  const stab_metrics *re = stab_monitor_reference(m, ie);
  ck_assert(isnan(re->forward) && isnan(re->dependency) && isnan(re->update));
  x.forward = 1.5, x.dependency = 0.75, x.update = 0.01;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, ie, &x, NULL));
  x.forward = 3.0, x.dependency = 1.5, x.update = 0.02;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, ie, &x, NULL));
  ck_assert(re->forward == 1.5 && re->dependency == 0.75 && re->update == 0.01);
  stab_monitor_free(m);
}
END_TEST

/* ---- tables: vocab and width --------------------------------------------------------------- */

/* A tied table, one [V][d] buffer registered as embedding and as lm_head with the same .vocab,
 * .width and .weight: each gives its definition by brute force, and the monitor's copies carry
 * d_in and d_out in each kind's math (what a trace records). A table in the interface before
 * 0.2.0 (d_in, d_out only), right or swapped, is refused and leaves the monitor as it was. */
START_TEST(test_tied_table) {
  enum { V = 90, D = 20 };
  tu_rng r;
  tu_rng_init(&r, 71);
  float *w = tu_floats(V * D);
  tu_fill_gauss(w, V, D, D, 1.0 / D, &r);
  for (size_t j = 0; j < D; j++) w[5 * D + j] *= 4.0f;  // one row sets the max
  stab_monitor_params p = stab_monitor_default_params();
  p.metrics.tight = STAB_TIGHT_EXACT;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  static const stab_kind kinds[] = {STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD};
  for (int k = 0; k < 2; k++)
    for (int swapped = 0; swapped < 2; swapped++) {
      stab_layer old = {.name = "wte", .kind = kinds[k], .d_in = swapped ? D : V, .d_out = swapped ? V : D,
                        .weight = w};
      TU_ASSERT_STATUS(stab_monitor_add_layer(m, &old, NULL), STAB_EINVAL, "%s given d_in %zu, d_out %zu",
                       stab_kind_name(kinds[k]), old.d_in, old.d_out);
      ck_assert_msg(strstr(stab_last_error(), "stab_monitor_add_layer") && strstr(stab_last_error(), "'wte'") &&
                        strstr(stab_last_error(), "use .vocab") && strstr(stab_last_error(), ".width"),
                    "message: %s", stab_last_error());
    }
  ck_assert_uint_eq(stab_monitor_layer_count(m), 0);

  stab_layer emb = {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = D, .weight = w};
  stab_layer head = {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = D, .weight = w};
  TU_ASSERT_OK(stab_monitor_add_layer(m, &emb, NULL));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &head, NULL));
  const stab_layer *ce = stab_monitor_layer(m, 0), *ch = stab_monitor_layer(m, 1);
  ck_assert(ce->vocab == V && ce->width == D && ch->vocab == V && ch->width == D);
  ck_assert_msg(ce->d_in == V && ce->d_out == D, "embedding copy: d_in %zu, d_out %zu", ce->d_in, ce->d_out);
  ck_assert_msg(ch->d_in == D && ch->d_out == V, "lm_head copy: d_in %zu, d_out %zu", ch->d_in, ch->d_out);
  /* a copy handed back registers again as it is (its d_in and d_out agree with vocab, width) */
  stab_layer again = *ch;
  again.name = "lm_head again";
  TU_ASSERT_OK(stab_monitor_add_layer(m, &again, NULL));

  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  double *wd = tu_to_double(w, NULL, V, D, D, 0);
  const double R = ref_max_row_rms_d(wd, V, D), dm = ref_diameter_rows_d(wd, V, D);
  const stab_metrics *me = stab_monitor_metrics(m, 0), *mh = stab_monitor_metrics(m, 1), *ma = stab_monitor_metrics(m, 2);
  TU_ASSERT_REL(me->forward, R, 1e-12, "embedding forward = max_i ||E_i||_RMS");
  TU_ASSERT_REL(mh->forward, log((double)V) + 2.0 * D * R, 1e-12, "lm_head forward = log V + 2 d R");
  TU_ASSERT_REL(mh->dependency_tight, D * dm, 1e-9, "lm_head dependency_tight = d Dm");
  ck_assert_msg(ma->forward == mh->forward, "the head registered from its copy: forward %.17g, %.17g", ma->forward,
                mh->forward);
  free(wd);
  stab_monitor_free(m);
  free(w);
}
END_TEST

/* ---- exact below 32, warm and cold ---------------------------------------------------------- */

/* What the header promises of Lanczos on narrow matrices in a monitor, which warm-starts every
 * measurement after its first: at most 32 columns, exact at every step; at most 32 rows (and
 * more columns), exact on the first (cold) measurement, then within tol below the exact value. */
START_TEST(test_narrow_exact_and_warm) {
  enum { FEW = 16, MANY = 200, STEPS = 4 };
  tu_rng r;
  tu_rng_init(&r, 72);
  float *wide = tu_floats(FEW * MANY), *tall = tu_floats(MANY * FEW);
  tu_fill_gauss(wide, FEW, MANY, MANY, 0.1, &r);
  tu_fill_gauss(tall, MANY, FEW, FEW, 0.1, &r);
  /* out-major: rows = d_out */
  stab_layer few_rows = {.name = "few rows", .kind = STAB_KIND_LINEAR, .d_in = MANY, .d_out = FEW, .weight = wide};
  stab_layer few_cols = {.name = "few cols", .kind = STAB_KIND_LINEAR, .d_in = FEW, .d_out = MANY, .weight = tall};
  stab_monitor_params p = stab_monitor_default_params();
  p.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &few_rows, NULL));
  TU_ASSERT_OK(stab_monitor_add_layer(m, &few_cols, NULL));
  const double tol = p.metrics.spectral.tol, exact = tu_tol_exact(FEW, MANY);
  for (int s = 0; s < STEPS; s++) {
    TU_ASSERT_OK(stab_monitor_measure(m, 0));
    const stab_metrics *a = stab_monitor_metrics(m, 0), *b = stab_monitor_metrics(m, 1);
    double ra = ref_sigma(wide, FEW, MANY, MANY), rb = ref_sigma(tall, MANY, FEW, FEW);
    TU_ASSERT_REL(b->sigma, rb, exact, "16 columns, step %d", s);
    ck_assert_msg(b->sigma_rel_err == 0.0, "16 columns, step %d: rel_err %g", s, b->sigma_rel_err);
    if (s == 0) {
      TU_ASSERT_REL(a->sigma, ra, exact, "16 rows, cold");
    } else {
      TU_ASSERT_REL(a->sigma, ra, tol, "16 rows, warm, step %d", s);
      TU_ASSERT_LE(a->sigma, ra, tu_round_slack(FEW, MANY), "16 rows, warm, step %d: a lower bound", s);
      ck_assert_msg(a->sigma_rel_err <= tol, "16 rows, warm, step %d: rel_err %g", s, a->sigma_rel_err);
    }
    /* stab_layer_metrics starts cold every time: exact */
    stab_metrics one;
    TU_ASSERT_OK(stab_layer_metrics(&few_rows, NULL, &p.metrics, &one, NULL));
    TU_ASSERT_REL(one.sigma, ra, exact, "16 rows, stab_layer_metrics, step %d", s);
    tu_add_relative_noise(wide, FEW, MANY, MANY, 1e-2, &r);
    tu_add_relative_noise(tall, MANY, FEW, FEW, 1e-2, &r);
  }
  stab_monitor_free(m);
  free(wide);
  free(tall);
}
END_TEST

/* ---- layers on several threads ------------------------------------------------------ */

/* Threads of this process, from /proc/self/task (0 when it cannot be read). */
static int process_threads(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  if (f) fclose(f);
  return n;
}

static int same_metrics(const stab_metrics *a, const stab_metrics *b) {
  const double x[] = {a->forward, a->dependency, a->update, a->forward_tight, a->dependency_tight,
                      a->update_tight, a->spread, a->sigma, a->sigma_rel_err, a->sigma_update,
                      a->sigma_update_rel_err, a->rel_update};
  const double y[] = {b->forward, b->dependency, b->update, b->forward_tight, b->dependency_tight,
                      b->update_tight, b->spread, b->sigma, b->sigma_rel_err, b->sigma_update,
                      b->sigma_update_rel_err, b->rel_update};
  return memcmp(x, y, sizeof x) == 0 && a->passes == b->passes && a->update_passes == b->update_passes &&
         a->flags == b->flags && a->tight_method == b->tight_method;
}

/* A step measured with its layers spread over threads gives the bits of one thread, every step
 * (warm starts included), and really uses another thread: these layers are far below the size
 * where a single pass would. */
START_TEST(test_layers_in_parallel) {
  static const int threads[] = {1, 2, 3, 8};
  enum { NT = sizeof threads / sizeof threads[0], STEPS = 3 };
  model md;
  model_init(&md, 9, 0);
  stab_monitor *m[NT];
  for (int t = 0; t < NT; t++) {
    stab_metrics_params p = stab_metrics_default_params();
    p.spectral.threads = threads[t];
    m[t] = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p);
  }
  const int before = process_threads();
  tu_rng r;
  tu_rng_init(&r, 99);
  for (int step = 0; step < STEPS; step++) {
    for (int t = 0; t < NT; t++) TU_ASSERT_OK(stab_monitor_snapshot(m[t]));
    model_step(&md, 1e-2, &r);
    for (int t = 0; t < NT; t++) TU_ASSERT_OK(stab_monitor_measure(m[t], 1), "step %d, %d threads", step, threads[t]);
    for (size_t i = 0; i < md.n; i++)
      for (int t = 1; t < NT; t++) {
        const stab_metrics *a = stab_monitor_metrics(m[0], i), *b = stab_monitor_metrics(m[t], i);
        ck_assert_msg(same_metrics(a, b), "step %d, %s: sigma %.17g forward %.17g update %.17g with 1 thread, "
                      "%.17g %.17g %.17g with %d", step, md.layers[i].name, a->sigma, a->forward, a->update,
                      b->sigma, b->forward, b->update, threads[t]);
        const double *ha = stab_monitor_head_bounds(m[0], i), *hb = stab_monitor_head_bounds(m[t], i);
        if (ha) ck_assert_msg(memcmp(ha, hb, md.layers[i].heads * sizeof *ha) == 0, "step %d, %s: head bounds "
                              "differ with %d threads", step, md.layers[i].name, threads[t]);
      }
  }
  if (before > 0) ck_assert_msg(process_threads() > before, "%d threads before the steps, %d after: the layers "
                                "were all measured on the caller's", before, process_threads());
  for (int t = 0; t < NT; t++) stab_monitor_free(m[t]);
  model_free(&md);
}
END_TEST

/* stab_monitor_measure_idle (a binding's background measurement): the same bits as
 * stab_monitor_snapshot then stab_monitor_measure on a twin monitor, every step, warm starts
 * included, on one and two threads; the calling thread has its own priority again when it
 * returns; hurry for a ticket not running changes nothing; a failure is returned (the update
 * without a snapshot) and skips the snapshot. Whether the thread ran at SCHED_IDLE is
 * check_priority's (the idle turn). */
START_TEST(test_measure_idle) {
  enum { STEPS = 3 };
  model md;
  model_init(&md, 11, 0);
  for (int threads = 1; threads <= 2; threads++) {
    stab_metrics_params p = stab_metrics_default_params();
    p.spectral.threads = threads;
    stab_monitor *plain = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p), *idle = make_monitor(&md, STAB_UPDATE_SNAPSHOT, &p);
    TU_ASSERT_STATUS(stab_monitor_measure_idle(NULL, 1, 1, 0, 0), STAB_EINVAL);
    stab_monitor_hurry(NULL, 1);
    const int policy = sched_getscheduler(0);
    /* an update with no snapshot: the measurement's error, and no snapshot after it */
    TU_ASSERT_STATUS(stab_monitor_measure_idle(idle, 1, 1, 1, 1), STAB_ESTATE);
    TU_ASSERT_STATUS(stab_monitor_measure(idle, 1), STAB_ESTATE);
    /* the first step's snapshot alone, as a background loop takes it */
    TU_ASSERT_OK(stab_monitor_measure_idle(idle, 2, 0, 0, 1));
    tu_rng r;
    tu_rng_init(&r, 111);
    for (int step = 0; step < STEPS; step++) {
      TU_ASSERT_OK(stab_monitor_snapshot(plain));
      model_step(&md, 1e-2, &r);
      TU_ASSERT_OK(stab_monitor_measure(plain, 1));
      stab_monitor_hurry(idle, 1000); /* another ticket's hurry: this one still runs idle */
      TU_ASSERT_OK(stab_monitor_measure_idle(idle, 3 + (uint64_t)step, 1, 1, 1), "step %d", step);
      ck_assert_int_eq(sched_getscheduler(0), policy);
      for (size_t i = 0; i < md.n; i++) {
        const stab_metrics *a = stab_monitor_metrics(plain, i), *b = stab_monitor_metrics(idle, i);
        ck_assert_msg(same_metrics(a, b), "%d threads, step %d, %s: sigma %.17g / update %.17g measured, %.17g / "
                      "%.17g measured idle", threads, step, md.layers[i].name, a->sigma, a->update, b->sigma,
                      b->update);
      }
    }
    stab_monitor_free(plain);
    stab_monitor_free(idle);
  }
  model_free(&md);
}
END_TEST

/* Externals registered after the only measured layer: they grow no thread's buffers, so they
 * must not make a thread ready to measure. Before 0.11.0 each one did, and a step's thread on
 * such a slot measured the layer with a NULL workspace (a crash whenever that thread claimed
 * it: about one step in seven with two threads). Many steps on four threads: the thread that
 * claims the layer varies, so a slot without buffers would be met. */
START_TEST(test_externals_after_the_measured_layer) {
  float w[8 * 24];
  for (int i = 0; i < 8 * 24; i++) w[i] = (float)((i * 7) % 11) - 5.0f;
  stab_monitor_params p = stab_monitor_default_params();
  p.metrics.spectral.threads = 4;
  p.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&p, &m));
  stab_layer fc = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 24, .d_out = 8, .weight = w};
  TU_ASSERT_OK(stab_monitor_add_layer(m, &fc, NULL));
  const char *names[] = {"ext0", "ext1", "ext2", "ext3"};
  for (int e = 0; e < 4; e++) {
    stab_layer ext = {.name = names[e], .kind = STAB_KIND_LINEAR, .d_in = 512, .d_out = 512};
    TU_ASSERT_OK(stab_monitor_add_external(m, &ext, NULL));
  }
  stab_metrics ref;
  TU_ASSERT_OK(stab_layer_metrics(&fc, NULL, &p.metrics, &ref, NULL));
  for (int step = 0; step < 200; step++) {
    TU_ASSERT_OK(stab_monitor_measure(m, 0), "step %d", step);
    TU_ASSERT_REL(stab_monitor_metrics(m, 0)->sigma, ref.sigma, 1e-6, "step %d", step);
  }
  stab_monitor_free(m);
}
END_TEST

/* A layer held elsewhere (stab_monitor_add_external): skipped by snapshot and measure (its
 * pointers are never read: here they are NULL, and a real layer beside it is measured as
 * stab_layer_metrics measures it), NaN until set, then what was set, through measurements; the
 * trace records it whole under its name and shape and writes the set metrics. */
START_TEST(test_external) {
  float w[4 * 6], w0[4 * 6], b[4] = {0.5f, -1.0f, 0.25f, 2.0f};
  for (int i = 0; i < 24; i++) w0[i] = w[i] = (float)(i % 5) - 2.0f;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m)); /* SNAPSHOT mode */
  stab_layer fc = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 6, .d_out = 4, .weight = w, .bias = b};
  stab_layer big = {.name = "big", .kind = STAB_KIND_LINEAR, .d_in = 512, .d_out = 2048, .bias = b};
  stab_layer at = {.name = "at", .kind = STAB_KIND_ATTENTION, .d_in = 64, .d_out = 64, .heads = 4};
  size_t ib = 9, ia = 9;
  size_t empty = stab_monitor_memory(m);
  TU_ASSERT_OK(stab_monitor_add_external(m, &big, &ib));
  /* no warm vectors, snapshot (4 MiB) or workspace for 2048 x 512: its name, the layer table */
  ck_assert_uint_lt(stab_monitor_memory(m) - empty, 16384);
  TU_ASSERT_OK(stab_monitor_add_layer(m, &fc, NULL));
  TU_ASSERT_OK(stab_monitor_add_external(m, &at, &ia));
  ck_assert_uint_eq(ib, 0);
  ck_assert_uint_eq(ia, 2);
  ck_assert_uint_eq(stab_monitor_layer_count(m), 3);
  ck_assert(stab_monitor_layer(m, 0)->weight == NULL && stab_monitor_layer(m, 0)->d_out == 2048);
  ck_assert(stab_monitor_layer(m, 2)->weight_k == NULL);
  /* the checks of add_layer: a duplicate name, a bad shape */
  TU_ASSERT_STATUS(stab_monitor_add_external(m, &fc, NULL), STAB_EEXIST);
  stab_layer odd = at;
  odd.name = "odd", odd.heads = 5;
  TU_ASSERT_FAILS(stab_monitor_add_external(m, &odd, NULL), "5 heads of 64");
  TU_ASSERT_STATUS(stab_monitor_add_external(NULL, &at, NULL), STAB_EINVAL);
  ck_assert_uint_eq(stab_monitor_layer_count(m), 3);
  TU_ASSERT_OK(stab_monitor_snapshot(m));
  for (int i = 0; i < 24; i++) w[i] += 0.01f * (float)(i % 3);
  TU_ASSERT_OK(stab_monitor_measure(m, 1));
  stab_layer before = fc;
  before.weight = w0;
  stab_metrics ref;
  TU_ASSERT_OK(stab_layer_metrics(&fc, &before, NULL, &ref, NULL));
  const stab_metrics *got = stab_monitor_metrics(m, 1);
  ck_assert(fabs(got->dependency - ref.dependency) <= 1e-6 * ref.dependency);
  ck_assert(fabs(got->update - ref.update) <= 1e-5 * ref.update);
  ck_assert(isnan(stab_monitor_metrics(m, 0)->forward) && isnan(stab_monitor_metrics(m, 2)->forward));
  stab_metrics x;
  memset(&x, 0, sizeof x);
  x.forward = 1.5, x.dependency = 2.5, x.update = 0.125, x.sigma = 3.5, x.passes = 7;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, 0, &x, NULL));
  const double hb[4] = {0.25, 0.75, 1.5, 0.5};
  x.forward = 1.5, x.passes = 12;
  TU_ASSERT_OK(stab_monitor_set_metrics(m, 2, &x, hb));
  TU_ASSERT_OK(stab_monitor_snapshot(m));
  TU_ASSERT_OK(stab_monitor_measure(m, 1)); /* leaves them as set */
  TU_ASSERT_OK(stab_monitor_measure_some(m, 0, NULL));
  ck_assert(stab_monitor_metrics(m, 0)->sigma == 3.5 && stab_monitor_metrics(m, 0)->update == 0.125);
  ck_assert(stab_monitor_head_bounds(m, 2)[1] == 0.75 && stab_monitor_metrics(m, 2)->passes == 12);
  /* GIVEN mode asks no update of an external layer */
  stab_monitor_params gp = stab_monitor_default_params();
  gp.update_mode = STAB_UPDATE_GIVEN;
  stab_monitor *g = NULL;
  TU_ASSERT_OK(stab_monitor_create(&gp, &g));
  TU_ASSERT_OK(stab_monitor_add_external(g, &big, NULL));
  TU_ASSERT_OK(stab_monitor_measure(g, 1));
  stab_monitor_free(g);
  /* the trace: every layer, the external ones with their whole shape and the metrics set */
  char dir[64];
  tu_tmpdir_make(dir, sizeof dir, "check_monitor");
  const char *path = tu_path_in(dir, "external.h5");
  stab_trace_params tp = stab_trace_default_params();
  tp.flush_every = 1;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &tp, &t));
  TU_ASSERT_OK(stab_trace_append(t, 1, 0.5, NULL, NULL));
  ck_assert_int_eq(stab_trace_steps(t), 1);
  TU_ASSERT_OK(stab_trace_close(t));
  struct stat sb;
  ck_assert(stat(path, &sb) == 0 && sb.st_size > 0);
  tu_tmpdir_remove(dir);
  stab_monitor_free(m);
}
END_TEST

static Suite *monitor_suite(void) {
  Suite *s = suite_create("monitor");
  TCase *tc = tcase_create("lifecycle");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_create_free);
  tcase_add_test(tc, test_register_and_lookup);
  tcase_add_test(tc, test_states_and_arguments);
  tcase_add_test(tc, test_memory);
  tcase_add_test(tc, test_set_metrics);
  tcase_add_test(tc, test_reference);
  tcase_add_test(tc, test_reference_late);
  tcase_add_test(tc, test_external);
  tcase_add_test(tc, test_externals_after_the_measured_layer);
  suite_add_tcase(s, tc);

  tc = tcase_create("measure");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_measure_matches_layer_metrics, 0, 2);
  tcase_add_loop_test(tc, test_snapshot_mode, 0, 2);
  tcase_add_test(tc, test_given_mode);
  tcase_add_test(tc, test_warm_start);
  tcase_add_test(tc, test_narrow_exact_and_warm);
  tcase_add_test(tc, test_tied_table);
  tcase_add_test(tc, test_nan_isolation);
  tcase_add_test(tc, test_layers_in_parallel);
  tcase_add_test(tc, test_measure_idle);
  tcase_add_test(tc, test_many_names);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(monitor_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
