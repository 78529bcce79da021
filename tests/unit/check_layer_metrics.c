/* check_layer_metrics.c — stab_layer_metrics for every layer kind against the definitions of
 * docs/manual/metrics.md computed independently (LAPACKE sigma, brute-force norms and diameters), and
 * each definition checked by brute force on sampled inputs: no RMS-1 input ever exceeds a
 * reported bound, and the top singular direction attains the exact ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h" /* PACKAGE_VERSION, from configure.ac */
#include "stabmeter.h"
#include "testutil.h"

#define LANCZOS_TOL 1e-3

static stab_metrics_params params_with(stab_spectral_method method, stab_tight_method tight) {
  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.method = method;
  p.tight = tight;
  return p;
}

static stab_metrics measure(const stab_layer *l, const stab_layer *before,
                            const stab_metrics_params *p, double *heads, const char *what) {
  stab_metrics m;
  memset(&m, 0, sizeof m);
  TU_ASSERT_OK(stab_layer_metrics(l, before, p, &m, heads), "%s", what);
  return m;
}

/* rel_update may be taken against the weights after the step (the layer) or before it;
 * the header does not say which, so either is accepted, each to f64 rounding. */
static void check_rel_update(const char *what, double got, double d_norm, double after_norm,
                             double before_norm) {
  double a = d_norm / after_norm, b = d_norm / before_norm;
  ck_assert_msg(isfinite(got) && (tu_rel(got, a) <= 1e-9 || tu_rel(got, b) <= 1e-9),
                "%s: rel_update = %.17g, expected %.17g (||dW||/||W after||) or %.17g (/||W before||)",
                what, got, a, b);
}

/* ---- linear -------------------------------------------------------------------------- */

typedef struct {
  double sigma, forward, dependency;
  double sigma_update, update, d_norm, after_norm, before_norm; /* NaN without before */
} linear_ref;

/* stored w (and w0 before the step, or NULL), bias b (b0), in-major or out-major */
static linear_ref ref_linear(const float *w, const float *b, const float *w0, const float *b0,
                             size_t d_in, size_t d_out, int in_major, size_t ld) {
  size_t rows = in_major ? d_in : d_out, cols = in_major ? d_out : d_in;
  if (!ld) ld = cols;
  double c = sqrt((double)d_in / (double)d_out);
  linear_ref r;
  r.sigma = ref_sigma(w, rows, cols, ld);
  double rb = b ? ref_rms(b, d_out, 1) : 0.0;
  r.dependency = c * r.sigma;
  r.forward = r.dependency + rb;
  r.sigma_update = r.update = r.d_norm = r.after_norm = r.before_norm = NAN;
  if (w0) {
    r.sigma_update = ref_sigma_diff(w, w0, rows, cols, ld);
    double db = b ? ref_rms_diff(b, b0, d_out) : 0.0;
    r.update = c * r.sigma_update + db;
    double *dw = tu_to_double(w, w0, rows, cols, ld, 0), *wa = tu_to_double(w, NULL, rows, cols, ld, 0),
           *wb = tu_to_double(w0, NULL, rows, cols, ld, 0);
    double n = (double)d_out;
    double dn = ref_frob_d(dw, rows * cols), an = ref_frob_d(wa, rows * cols),
           bn = ref_frob_d(wb, rows * cols);
    r.d_norm = sqrt(dn * dn + db * db * n);
    r.after_norm = sqrt(an * an + (b ? rb * rb * n : 0.0));
    r.before_norm = sqrt(bn * bn + (b0 ? pow(ref_rms(b0, d_out, 1), 2) * n : 0.0));
    free(dw);
    free(wa);
    free(wb);
  }
  return r;
}

/* Measures the layer with EXACT and with LANCZOS and checks every field against r. */
static void check_linear(const char *what, const stab_layer *l, const stab_layer *before,
                         const linear_ref *r) {
  size_t rows = l->layout == STAB_LAYOUT_IN_MAJOR ? l->d_in : l->d_out;
  size_t cols = l->layout == STAB_LAYOUT_IN_MAJOR ? l->d_out : l->d_in;
  for (int k = 0; k < 2; k++) {
    stab_spectral_method method = k ? STAB_SPECTRAL_LANCZOS : STAB_SPECTRAL_EXACT;
    stab_metrics_params p = params_with(method, STAB_TIGHT_CENTRED);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s, %s", what, k ? "LANCZOS" : "EXACT");
    stab_metrics m = measure(l, before, &p, NULL, ctx);
    double tol = k ? LANCZOS_TOL : tu_tol_exact(rows, cols);
    ck_assert_msg(m.flags == 0, "%s: flags %#x", ctx, (unsigned)m.flags);
    TU_ASSERT_REL(m.sigma, r->sigma, tol, "%s", ctx);
    TU_ASSERT_REL(m.forward, r->forward, tol, "%s", ctx);
    TU_ASSERT_REL(m.dependency, r->dependency, tol, "%s", ctx);
    ck_assert_msg(isfinite(m.sigma_rel_err) && m.sigma_rel_err >= 0.0 && m.sigma_rel_err <= tol,
                  "%s: sigma_rel_err %g", ctx, m.sigma_rel_err);
    if (k) {
      /* Lanczos values are lower bounds */
      TU_ASSERT_LE(m.forward, r->forward, tu_round_slack(rows, cols), "%s", ctx);
      TU_ASSERT_LE(m.dependency, r->dependency, tu_round_slack(rows, cols), "%s", ctx);
      ck_assert_msg(m.passes >= 1, "%s: passes %d", ctx, m.passes);
    } else {
      ck_assert_msg(m.sigma_rel_err == 0.0, "%s: EXACT sigma_rel_err %g", ctx, m.sigma_rel_err);
    }
    TU_ASSERT_NAN(m.forward_tight, "%s", ctx);
    TU_ASSERT_NAN(m.dependency_tight, "%s", ctx);
    TU_ASSERT_NAN(m.update_tight, "%s", ctx);
    TU_ASSERT_NAN(m.spread, "%s", ctx);
    if (!before) {
      TU_ASSERT_NAN(m.update, "%s, no update", ctx);
      TU_ASSERT_NAN(m.sigma_update, "%s, no update", ctx);
      TU_ASSERT_NAN(m.rel_update, "%s, no update", ctx);
      continue;
    }
    TU_ASSERT_REL(m.sigma_update, r->sigma_update, tol, "%s", ctx);
    TU_ASSERT_REL(m.update, r->update, tol, "%s", ctx);
    ck_assert_msg(isfinite(m.sigma_update_rel_err) && m.sigma_update_rel_err <= tol,
                  "%s: sigma_update_rel_err %g", ctx, m.sigma_update_rel_err);
    if (k) {
      TU_ASSERT_LE(m.update, r->update, tu_round_slack(rows, cols), "%s", ctx);
      ck_assert_msg(m.update_passes >= 1, "%s: update_passes %d", ctx, m.update_passes);
    }
    check_rel_update(ctx, m.rel_update, r->d_norm, r->after_norm, r->before_norm);
  }
}

static double init_std(size_t d_in, size_t d_out) {
  return sqrt((double)d_out / (double)d_in) / (sqrt((double)d_in) + sqrt((double)d_out));
}

START_TEST(test_linear_out_major) {
  enum { DIN = 200, DOUT = 120 };
  tu_rng r;
  tu_rng_init(&r, 101);
  float *w = tu_floats(DOUT * DIN), *b = tu_floats(DOUT);
  tu_fill_gauss(w, DOUT, DIN, DIN, init_std(DIN, DOUT), &r);
  tu_fill_gauss(b, 1, DOUT, DOUT, 0.3, &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                  .layout = STAB_LAYOUT_OUT_MAJOR, .weight = w};
  linear_ref ref = ref_linear(w, NULL, NULL, NULL, DIN, DOUT, 0, 0);
  check_linear("out-major 200->120, no bias", &l, NULL, &ref);
  l.layout = STAB_LAYOUT_NATURAL;
  check_linear("natural 200->120, no bias", &l, NULL, &ref);
  l.bias = b;
  ref = ref_linear(w, b, NULL, NULL, DIN, DOUT, 0, 0);
  check_linear("natural 200->120, bias", &l, NULL, &ref);
  free(w);
  free(b);
}
END_TEST

/* NATURAL is OUT_MAJOR for linear: the same numbers to the bit. */
START_TEST(test_linear_natural_is_out_major) {
  tu_rng r;
  tu_rng_init(&r, 102);
  float *w = tu_floats(70 * 90);
  tu_fill_gauss(w, 70, 90, 90, 1.0, &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 90, .d_out = 70,
                  .layout = STAB_LAYOUT_NATURAL, .weight = w};
  stab_metrics a = measure(&l, NULL, NULL, NULL, "natural");
  l.layout = STAB_LAYOUT_OUT_MAJOR;
  stab_metrics b = measure(&l, NULL, NULL, NULL, "out-major");
  ck_assert_msg(memcmp(&a.forward, &b.forward, sizeof(double)) == 0 &&
                    memcmp(&a.sigma, &b.sigma, sizeof(double)) == 0,
                "natural %.17g / out-major %.17g differ", a.forward, b.forward);
  free(w);
}
END_TEST

START_TEST(test_linear_in_major) {
  enum { DIN = 64, DOUT = 160 };
  tu_rng r;
  tu_rng_init(&r, 103);
  float *w = tu_floats(DIN * DOUT), *b = tu_floats(DOUT);
  tu_fill_gauss(w, DIN, DOUT, DOUT, init_std(DIN, DOUT), &r);
  tu_fill_gauss(b, 1, DOUT, DOUT, 0.2, &r);
  stab_layer l = {.name = "c_fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                  .layout = STAB_LAYOUT_IN_MAJOR, .weight = w};
  linear_ref ref = ref_linear(w, NULL, NULL, NULL, DIN, DOUT, 1, 0);
  check_linear("in-major 64->160, no bias", &l, NULL, &ref);
  l.bias = b;
  ref = ref_linear(w, b, NULL, NULL, DIN, DOUT, 1, 0);
  check_linear("in-major 64->160, bias", &l, NULL, &ref);
  free(w);
  free(b);
}
END_TEST

/* Blocks of bigger matrices: NaN padding past the row, and a fused qkv in-major matrix. */
START_TEST(test_linear_ld) {
  enum { DIN = 90, DOUT = 50 };
  tu_rng r;
  tu_rng_init(&r, 104);
  /* out-major [DOUT][DIN] in rows of DIN + 37 */
  size_t ld = DIN + 37;
  float *w = tu_matrix_padded(DOUT, DIN, ld), *b = tu_floats(DOUT);
  tu_fill_gauss(w, DOUT, DIN, ld, init_std(DIN, DOUT), &r);
  tu_fill_gauss(b, 1, DOUT, DOUT, 0.1, &r);
  stab_layer l = {.name = "blk", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                  .layout = STAB_LAYOUT_OUT_MAJOR, .ld = ld, .weight = w, .bias = b};
  linear_ref ref = ref_linear(w, b, NULL, NULL, DIN, DOUT, 0, ld);
  check_linear("out-major 90->50 in ld 127", &l, NULL, &ref);
  free(w);

  /* in-major [DIN][DOUT] in rows of DOUT + 5 */
  ld = DOUT + 5;
  w = tu_matrix_padded(DIN, DOUT, ld);
  tu_fill_gauss(w, DIN, DOUT, ld, init_std(DIN, DOUT), &r);
  l.layout = STAB_LAYOUT_IN_MAJOR;
  l.ld = ld;
  l.weight = w;
  ref = ref_linear(w, b, NULL, NULL, DIN, DOUT, 1, ld);
  check_linear("in-major 90->50 in ld 55", &l, NULL, &ref);
  free(w);
  free(b);

  /* HF Conv1D c_attn: [C][3C] in-major; the k block is columns C..2C-1, the others are
   * 40x bigger so that a block-blind reader is caught */
  enum { C = 48 };
  float *qkv = tu_floats(C * 3 * C);
  tu_fill_gauss(qkv, C, 3 * C, 3 * C, 1.0, &r);
  for (size_t i = 0; i < C; i++)
    for (size_t j = 0; j < 3 * C; j++)
      if (j < C || j >= 2 * C) qkv[i * 3 * C + j] *= 40.0f;
  stab_layer k = {.name = "attn.k", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C,
                  .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C, .weight = qkv + C};
  ref = ref_linear(qkv + C, NULL, NULL, NULL, C, C, 1, 3 * C);
  check_linear("k block of in-major qkv [48][144]", &k, NULL, &ref);
  free(qkv);
}
END_TEST

/* ---- fused q/k/v: the two layouts the header shows ------------------------------------------ */

/* A fused qkv of width C: llm.c's out-major [3C][C] (q, k, v are blocks of rows) or HF GPT-2
 * Conv1D's in-major [C][3C] (blocks of columns). The blocks are scaled 1, 6 and 36, so that a
 * block read from the wrong place, or mixing two blocks, is off by far more than rounding. */
enum { QKV_C = 40, QKV_HEADS = 4 };
static const float qkv_scale[3] = {1.0f, 6.0f, 36.0f};

static float *make_qkv(int in_major, tu_rng *r) {
  const size_t C = QKV_C;
  float *w = tu_floats(3 * C * C);
  tu_fill_gauss(w, 1, 3 * C * C, 3 * C * C, 1.0 / sqrt((double)C), r);
  for (size_t i = 0; i < (in_major ? C : 3 * C); i++)
    for (size_t j = 0; j < (in_major ? 3 * C : C); j++)
      w[i * (in_major ? 3 * C : C) + j] *= qkv_scale[in_major ? j / C : i / C];
  return w;
}

/* Block p (0 q, 1 k, 2 v) copied out as its own contiguous C x C matrix, stored as in the
 * fused one (out-major: its C rows; in-major: its C columns of every row). */
static float *qkv_block(const float *w, int in_major, size_t p) {
  const size_t C = QKV_C;
  float *b = tu_floats(C * C);
  for (size_t i = 0; i < C; i++)
    for (size_t j = 0; j < C; j++) b[i * C + j] = in_major ? w[i * 3 * C + p * C + j] : w[(p * C + i) * C + j];
  return b;
}

/* The per-head logit bounds s d_h (f sigma(Wq_h)) (f sigma(Wk_h)), f = sqrt(d / d_h), from
 * contiguous copies of the q and k blocks, by LAPACK. */
static void ref_head_bounds(const float *q, const float *k, int in_major, double *bound) {
  const size_t C = QKV_C, dh = C / QKV_HEADS;
  const double f = sqrt((double)C / (double)dh), s = 1.0 / sqrt((double)dh);
  for (size_t h = 0; h < QKV_HEADS; h++) {
    /* head h: out-major rows h dh.. (dh x C), in-major columns h dh.. (C x dh) */
    size_t off = in_major ? h * dh : h * dh * C, rows = in_major ? C : dh, cols = in_major ? dh : C;
    bound[h] = s * (double)dh * (f * ref_sigma(q + off, rows, cols, C)) * (f * ref_sigma(k + off, rows, cols, C));
  }
}

/* Each recipe of the header gives, for q, k and v, the values of the separate block and, for
 * the attention layer, the bounds of the separate q and k blocks. */
START_TEST(test_fused_qkv_layouts) {
  const size_t C = QKV_C;
  static const char *part = "qkv";
  tu_rng r;
  tu_rng_init(&r, 105);
  for (int in_major = 0; in_major < 2; in_major++) {
    float *w = make_qkv(in_major, &r), *blk[3];
    for (size_t p = 0; p < 3; p++) {
      blk[p] = qkv_block(w, in_major, p);
      /* llm.c: {.d_in = C, .d_out = C, .weight = qkvw + p*C*C}, ld 0. HF: in-major, .ld = 3C,
       * .weight = w + p*C */
      stab_layer l = {.name = "attn.qkv", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C,
                      .layout = in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_NATURAL,
                      .ld = in_major ? 3 * C : 0, .weight = in_major ? w + p * C : w + p * C * C};
      linear_ref ref = ref_linear(blk[p], NULL, NULL, NULL, C, C, in_major, 0);
      char what[96];
      snprintf(what, sizeof what, "%s: %c block", in_major ? "HF Conv1D [C][3C]" : "llm.c qkvw [3C][C]", part[p]);
      check_linear(what, &l, NULL, &ref);
    }
    stab_layer a = {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = QKV_HEADS,
                    .layout = in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_NATURAL, .ld = in_major ? 3 * C : 0,
                    .weight = w, .weight_k = in_major ? w + C : w + C * C};
    double want[QKV_HEADS], got[QKV_HEADS], worst = 0.0;
    ref_head_bounds(blk[0], blk[1], in_major, want);
    stab_metrics_params prm = params_with(STAB_SPECTRAL_EXACT, STAB_TIGHT_CENTRED);
    stab_metrics m = measure(&a, NULL, &prm, got, in_major ? "HF attention" : "llm.c attention");
    for (size_t h = 0; h < QKV_HEADS; h++) {
      TU_ASSERT_REL(got[h], want[h], 3.0 * tu_tol_exact(C, C), "%s attention, head %zu", in_major ? "HF" : "llm.c", h);
      worst = fmax(worst, want[h]);
    }
    TU_ASSERT_REL(m.forward, worst, 3.0 * tu_tol_exact(C, C), "%s attention forward", in_major ? "HF" : "llm.c");
    for (size_t p = 0; p < 3; p++) free(blk[p]);
    free(w);
  }
}
END_TEST

/* What the header warns of: the HF recipe (.ld = 3C) applied to llm.c's out-major qkvw is
 * accepted, stays inside the buffer, and measures rows p, p + 3, p + 6, ... of the fused
 * matrix (rows of q, then of k, then of v), not block p. */
START_TEST(test_fused_qkv_ld_on_out_major) {
  const size_t C = QKV_C;
  tu_rng r;
  tu_rng_init(&r, 106);
  float *w = make_qkv(0, &r), *rows = tu_floats(C * C);
  for (size_t p = 0; p < 3; p++) {
    for (size_t i = 0; i < C; i++) memcpy(rows + i * C, w + (3 * i + p) * C, C * sizeof(float));
    float *blk = qkv_block(w, 0, p);
    stab_layer l = {.name = "attn.qkv", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .ld = 3 * C,
                    .weight = w + p * C};
    stab_metrics_params prm = params_with(STAB_SPECTRAL_EXACT, STAB_TIGHT_CENTRED);
    stab_metrics m = measure(&l, NULL, &prm, NULL, "ld 3C on out-major qkvw");
    double read = ref_sigma(rows, C, C, C), block = ref_sigma(blk, C, C, C);
    TU_ASSERT_REL(m.sigma, read, tu_tol_exact(C, C), "block %zu with ld 3C: sigma of rows %zu, %zu, ...", p, p,
                  p + 3);
    ck_assert_msg(fabs(m.sigma / block - 1.0) > 0.1,
                  "block %zu with ld 3C: sigma %.6g is within 10%% of the block's own %.6g: the test data "
                  "does not tell the two readings apart", p, m.sigma, block);
    free(blk);
  }
  free(rows);
  free(w);
}
END_TEST

START_TEST(test_linear_update) {
  enum { DIN = 120, DOUT = 80 };
  tu_rng r;
  tu_rng_init(&r, 105);
  for (int in_major = 0; in_major < 2; in_major++) {
    size_t rows = in_major ? DIN : DOUT, cols = in_major ? DOUT : DIN, ld = cols + 3 * in_major;
    float *w0 = tu_matrix_padded(rows, cols, ld), *w1 = tu_matrix_padded(rows, cols, ld);
    float *b0 = tu_floats(DOUT), *b1 = tu_floats(DOUT);
    tu_fill_gauss(w0, rows, cols, ld, init_std(DIN, DOUT), &r);
    memcpy(w1, w0, rows * ld * sizeof *w1);
    tu_add_relative_noise(w1, rows, cols, ld, 1e-2, &r);
    tu_fill_gauss(b0, 1, DOUT, DOUT, 0.1, &r);
    for (size_t i = 0; i < DOUT; i++) b1[i] = b0[i] + (float)(1e-3 * tu_rng_gauss(&r));
    stab_layer after = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                        .layout = in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR,
                        .ld = ld, .weight = w1, .bias = b1};
    stab_layer before = after;
    before.weight = w0;
    before.bias = b0;
    linear_ref ref = ref_linear(w1, b1, w0, b0, DIN, DOUT, in_major, ld);
    check_linear(in_major ? "update, in-major, ld 83, bias" : "update, out-major, bias", &after,
                 &before, &ref);
    after.bias = before.bias = NULL;
    ref = ref_linear(w1, NULL, w0, NULL, DIN, DOUT, in_major, ld);
    check_linear(in_major ? "update, in-major, ld 83" : "update, out-major", &after, &before, &ref);
    free(w0);
    free(w1);
    free(b0);
    free(b1);
  }
}
END_TEST

/* Linear layers with one output or one input: sigma is a vector norm. Loop index: shape. */
static const struct {
  const char *name;
  size_t d_in, d_out;
  stab_layout layout;
} vector_shapes[] = {
    {"out-major 64 -> 1 ([1][64])", 64, 1, STAB_LAYOUT_OUT_MAJOR},
    {"in-major 64 -> 1 ([64][1])", 64, 1, STAB_LAYOUT_IN_MAJOR},
    {"out-major 1 -> 64 ([64][1])", 1, 64, STAB_LAYOUT_OUT_MAJOR},
    {"in-major 1 -> 64 ([1][64])", 1, 64, STAB_LAYOUT_IN_MAJOR},
    {"out-major 1 -> 1", 1, 1, STAB_LAYOUT_OUT_MAJOR},
};

START_TEST(test_linear_vector_shapes) {
  enum { N = 64 };
  tu_rng r;
  tu_rng_init(&r, 107);
  float *w = tu_floats(N);
  tu_fill_gauss(w, 1, N, N, 0.1, &r);
  size_t d_in = vector_shapes[_i].d_in, d_out = vector_shapes[_i].d_out;
  double sigma = d_in * d_out == 1 ? fabs((double)w[0]) : ref_rms(w, N, 1) * sqrt((double)N);
  stab_layer l = {.name = "head", .kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out,
                  .layout = vector_shapes[_i].layout, .weight = w};
  for (int e = 0; e < 2; e++) {
    stab_metrics_params p = stab_metrics_default_params();
    if (e) p.spectral.method = STAB_SPECTRAL_EXACT;
    char ctx[160];
    snprintf(ctx, sizeof ctx, "%s, %s", vector_shapes[_i].name, e ? "EXACT" : "LANCZOS");
    stab_metrics m = measure(&l, NULL, &p, NULL, ctx);
    TU_ASSERT_REL(m.sigma, sigma, 1e-12, "%s: sigma = ||w||_2", ctx);
    TU_ASSERT_REL(m.forward, sqrt((double)d_in / (double)d_out) * sigma, 1e-12, "%s: forward", ctx);
  }
  free(w);
}
END_TEST

/* The top right singular vector v from a LANCZOS stab_sigma, as input x = v sqrt(d_in),
 * attains forward: ||x W||_RMS = forward. Random RMS-1 inputs never exceed it, with or
 * without bias; differences of inputs never exceed dependency. */
START_TEST(test_linear_bruteforce) {
  enum { DIN = 96, DOUT = 64, SAMPLES = 200 };
  tu_rng r;
  tu_rng_init(&r, 106);
  for (int in_major = 0; in_major < 2; in_major++) {
    size_t rows = in_major ? DIN : DOUT, cols = in_major ? DOUT : DIN;
    float *w = tu_floats(DIN * DOUT), *b = tu_floats(DOUT);
    tu_fill_gauss(w, rows, cols, cols, init_std(DIN, DOUT), &r);
    tu_fill_gauss(b, 1, DOUT, DOUT, 0.05, &r);
    stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                    .layout = in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR, .weight = w};
    const char *what = in_major ? "in-major" : "out-major";
    stab_metrics nob = measure(&l, NULL, NULL, NULL, what);
    l.bias = b;
    stab_metrics wb = measure(&l, NULL, NULL, NULL, what);

    stab_spectral_params sp = stab_spectral_default_params();
    stab_sigma_result res;
    double *v = tu_doubles(cols), *x = tu_doubles(DIN), *x2 = tu_doubles(DIN), *y = tu_doubles(DOUT),
           *y2 = tu_doubles(DOUT);
    TU_ASSERT_OK(stab_sigma(w, rows, cols, cols, &sp, v, &res));
    if (in_major) {
      /* stored [d_in][d_out]: v lives on the output side, A v is the input direction */
      tu_matvec(w, rows, cols, cols, v, x);
      double n = tu_norm2(x, DIN);
      for (size_t i = 0; i < DIN; i++) x[i] *= sqrt((double)DIN) / n;
    } else {
      for (size_t i = 0; i < DIN; i++) x[i] = v[i] * sqrt((double)DIN);
    }
    TU_ASSERT_REL(tu_rms_d(x, DIN), 1.0, 1e-9, "%s: RMS of the top input", what);
    /* y = x W */
    if (in_major)
      tu_matvec_t(w, rows, cols, cols, x, y);
    else
      tu_matvec(w, rows, cols, cols, x, y);
    TU_ASSERT_REL(tu_rms_d(y, DOUT), nob.forward, LANCZOS_TOL, "%s: ||x W||_RMS at the top input", what);
    TU_ASSERT_LE(tu_rms_d(y, DOUT), nob.forward, LANCZOS_TOL, "%s: top input", what);

    for (int s = 0; s < SAMPLES; s++) {
      tu_random_unit_rms(x, DIN, &r);
      if (in_major)
        tu_matvec_t(w, rows, cols, cols, x, y);
      else
        tu_matvec(w, rows, cols, cols, x, y);
      TU_ASSERT_LE(tu_rms_d(y, DOUT), nob.forward, 0.0, "%s: random input %d, no bias", what, s);
      for (size_t i = 0; i < DOUT; i++) y2[i] = y[i] + b[i];
      TU_ASSERT_LE(tu_rms_d(y2, DOUT), wb.forward, 0.0, "%s: random input %d, bias", what, s);
      /* dependency: (x - x2) W over ||x - x2|| */
      tu_random_unit_rms(x2, DIN, &r);
      for (size_t i = 0; i < DIN; i++) x2[i] = x[i] + (s % 2 ? 1e-3 : 1.0) * x2[i];
      for (size_t i = 0; i < DIN; i++) x2[i] -= x[i];
      if (in_major)
        tu_matvec_t(w, rows, cols, cols, x2, y);
      else
        tu_matvec(w, rows, cols, cols, x2, y);
      TU_ASSERT_LE(tu_rms_d(y, DOUT) / tu_rms_d(x2, DIN), wb.dependency, 0.0,
                   "%s: random pair %d", what, s);
    }
    free(v);
    free(x);
    free(x2);
    free(y);
    free(y2);
    free(w);
    free(b);
  }
}
END_TEST

/* ---- embedding ------------------------------------------------------------------------- */

/* Reference values of an embedding stored [V][d] as contiguous f64 rows (E, and dE or NULL). */
static void check_embedding(const char *what, const stab_layer *l, const stab_layer *before,
                            const double *e, const double *de, const double *e0, size_t V, size_t d) {
  stab_metrics m = measure(l, before, NULL, NULL, what);
  double R = ref_max_row_rms_d(e, V, d);
  ck_assert_msg(m.flags == 0, "%s: flags %#x", what, (unsigned)m.flags);
  TU_ASSERT_REL(m.forward, R, 1e-12, "%s: forward = max_i ||E_i||_RMS", what);
  TU_ASSERT_NAN(m.dependency, "%s", what);
  TU_ASSERT_NAN(m.forward_tight, "%s", what);
  TU_ASSERT_NAN(m.dependency_tight, "%s", what);
  TU_ASSERT_NAN(m.update_tight, "%s", what);
  /* spread: an upper bound of the row diameter, no looser than the two obvious ones */
  double dm = ref_diameter_rows_d(e, V, d), c = ref_centred_radius_rows_d(e, V, d);
  ck_assert_msg(isfinite(m.spread) && m.spread >= dm * (1.0 - 1e-12),
                "%s: spread %.17g below the brute-force diameter %.17g", what, m.spread, dm);
  TU_ASSERT_LE(m.spread, fmax(2.0 * R, 2.0 * c), 1e-12, "%s: spread", what);
  if (!de) {
    TU_ASSERT_NAN(m.update, "%s, no update", what);
    TU_ASSERT_NAN(m.rel_update, "%s, no update", what);
    return;
  }
  TU_ASSERT_REL(m.update, ref_max_row_rms_d(de, V, d), 1e-12, "%s: update = max_i ||dE_i||_RMS", what);
  check_rel_update(what, m.rel_update, ref_frob_d(de, V * d), ref_frob_d(e, V * d),
                   ref_frob_d(e0, V * d));
}

START_TEST(test_embedding) {
  enum { V = 300, D = 48 };
  tu_rng r;
  tu_rng_init(&r, 201);
  /* rows of very different norms, so that the max matters */
  float *e0 = tu_floats(V * D), *e1 = tu_floats(V * D);
  tu_fill_gauss(e0, V, D, D, 1.0, &r);
  for (size_t i = 0; i < V; i++) {
    float s = (float)(0.25 + tu_rng_uniform(&r));
    if (i == 123) s = 2.5f;
    for (size_t j = 0; j < D; j++) e0[i * D + j] *= s;
  }
  memcpy(e1, e0, sizeof(float) * V * D);
  /* a row-normalised step touching a few rows, one much more than the others */
  for (size_t i = 0; i < V; i += 7)
    for (size_t j = 0; j < D; j++) e1[i * D + j] += (float)((i == 42 ? 0.1 : 0.01) * tu_rng_gauss(&r));
  double *e = tu_to_double(e1, NULL, V, D, D, 0), *de = tu_to_double(e1, e0, V, D, D, 0),
         *eb = tu_to_double(e0, NULL, V, D, D, 0);

  stab_layer l = {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = D,
                  .layout = STAB_LAYOUT_NATURAL, .weight = e1};
  stab_layer b = l;
  b.weight = e0;
  check_embedding("embedding natural [300][48]", &l, NULL, e, NULL, eb, V, D);
  check_embedding("embedding natural, update", &l, &b, e, de, eb, V, D);
  l.layout = b.layout = STAB_LAYOUT_IN_MAJOR;
  check_embedding("embedding IN_MAJOR (= [V][d]), update", &l, &b, e, de, eb, V, D);

  /* OUT_MAJOR: [d][V], i.e. the transpose, inside NaN-padded rows */
  size_t ld = V + 2;
  float *t1 = tu_matrix_padded(D, V, ld), *t0 = tu_matrix_padded(D, V, ld);
  for (size_t i = 0; i < V; i++)
    for (size_t j = 0; j < D; j++) {
      t1[j * ld + i] = e1[i * D + j];
      t0[j * ld + i] = e0[i * D + j];
    }
  l.layout = b.layout = STAB_LAYOUT_OUT_MAJOR;
  l.ld = b.ld = ld;
  l.weight = t1;
  b.weight = t0;
  check_embedding("embedding OUT_MAJOR [48][300] ld 302, update", &l, &b, e, de, eb, V, D);

  /* natural in NaN-padded rows */
  ld = D + 3;
  float *p1 = tu_matrix_padded(V, D, ld), *p0 = tu_matrix_padded(V, D, ld);
  for (size_t i = 0; i < V; i++)
    for (size_t j = 0; j < D; j++) {
      p1[i * ld + j] = e1[i * D + j];
      p0[i * ld + j] = e0[i * D + j];
    }
  l.layout = b.layout = STAB_LAYOUT_NATURAL;
  l.ld = b.ld = ld;
  l.weight = p1;
  b.weight = p0;
  check_embedding("embedding natural ld 51, update", &l, &b, e, de, eb, V, D);

  free(e0);
  free(e1);
  free(e);
  free(de);
  free(eb);
  free(t0);
  free(t1);
  free(p0);
  free(p1);
}
END_TEST

/* ---- lm_head --------------------------------------------------------------------------- */

/* logsumexp_i <x, w_i - w_t>, w as contiguous f64 [V][d] */
static double lm_loss(const double *w, size_t V, size_t d, const double *x, size_t t) {
  double *z = tu_doubles(V), mx = -INFINITY;
  for (size_t i = 0; i < V; i++) {
    double s = 0.0;
    for (size_t j = 0; j < d; j++) s += x[j] * (w[i * d + j] - w[t * d + j]);
    z[i] = s;
    if (s > mx) mx = s;
  }
  double sum = 0.0;
  for (size_t i = 0; i < V; i++) sum += exp(z[i] - mx);
  free(z);
  return mx + log(sum);
}

typedef struct {
  double R, dm, centred;      /* of W */
  double dR, ddm, dcentred;   /* of dW; NaN without */
  double norm, d_norm, norm0; /* Frobenius norms of W, dW, W before */
} lm_ref;

/* w, dw, w0: contiguous f64 [V][d] (dw, w0 may be NULL) */
static lm_ref ref_lm(const double *w, const double *dw, const double *w0, size_t V, size_t d) {
  lm_ref r;
  r.R = ref_max_row_rms_d(w, V, d);
  r.dm = ref_diameter_rows_d(w, V, d);
  r.centred = ref_centred_radius_rows_d(w, V, d);
  r.norm = ref_frob_d(w, V * d);
  r.dR = r.ddm = r.dcentred = r.d_norm = r.norm0 = NAN;
  if (dw) {
    r.dR = ref_max_row_rms_d(dw, V, d);
    r.ddm = ref_diameter_rows_d(dw, V, d);
    r.dcentred = ref_centred_radius_rows_d(dw, V, d);
    r.d_norm = ref_frob_d(dw, V * d);
    r.norm0 = ref_frob_d(w0, V * d);
  }
  return r;
}

static void check_lm_head(const char *what, const stab_layer *l, const stab_layer *before,
                          const lm_ref *r, size_t V, size_t d) {
  double logv = log((double)V), dd = (double)d;
  for (int t = 0; t < 3; t++) {
    stab_tight_method tight = (stab_tight_method)t;
    stab_metrics_params p = params_with(STAB_SPECTRAL_LANCZOS, tight);
    char ctx[256];
    snprintf(ctx, sizeof ctx, "%s, tight %s", what,
             t == STAB_TIGHT_CENTRED ? "CENTRED" : t == STAB_TIGHT_EXACT ? "EXACT" : "NONE");
    stab_metrics m = measure(l, before, &p, NULL, ctx);
    ck_assert_msg(m.flags == 0, "%s: flags %#x", ctx, (unsigned)m.flags);
    TU_ASSERT_REL(m.forward, logv + 2.0 * dd * r->R, 1e-12, "%s: log V + 2 d R", ctx);
    TU_ASSERT_REL(m.dependency, 2.0 * dd * r->R, 1e-12, "%s: 2 d R", ctx);
    TU_ASSERT_REL(m.spread, 4.0 * dd * r->R, 1e-12, "%s: 4 d R", ctx);
    ck_assert_msg(m.tight_method == t, "%s: tight_method %d", ctx, m.tight_method);
    if (tight == STAB_TIGHT_NONE) {
      TU_ASSERT_NAN(m.forward_tight, "%s", ctx);
      TU_ASSERT_NAN(m.dependency_tight, "%s", ctx);
      TU_ASSERT_NAN(m.update_tight, "%s", ctx);
    } else {
      /* a true upper bound of d Dm; exact: d Dm itself; centred: no looser than
       * 2 d max_i ||w_i - mean||_RMS (the header's formula) nor than the headline 2 d R */
      ck_assert_msg(m.dependency_tight >= dd * r->dm * (1.0 - 1e-12),
                    "%s: dependency_tight %.17g below d Dm = %.17g", ctx, m.dependency_tight,
                    dd * r->dm);
      if (tight == STAB_TIGHT_EXACT)
        TU_ASSERT_REL(m.dependency_tight, dd * r->dm, 1e-9, "%s: dependency_tight = d Dm", ctx);
      else
        TU_ASSERT_LE(m.dependency_tight, 2.0 * dd * fmin(r->centred, r->R), 1e-9,
                     "%s: centred dependency_tight", ctx);
      TU_ASSERT_REL(m.forward_tight, logv + m.dependency_tight, 1e-12, "%s: forward_tight", ctx);
    }
    if (!before) {
      TU_ASSERT_NAN(m.update, "%s, no update", ctx);
      TU_ASSERT_NAN(m.update_tight, "%s, no update", ctx);
      continue;
    }
    TU_ASSERT_REL(m.update, 2.0 * dd * r->dR, 1e-12, "%s: 2 d dR", ctx);
    if (tight != STAB_TIGHT_NONE) {
      ck_assert_msg(m.update_tight >= dd * r->ddm * (1.0 - 1e-12),
                    "%s: update_tight %.17g below d dDm = %.17g", ctx, m.update_tight, dd * r->ddm);
      if (tight == STAB_TIGHT_EXACT)
        TU_ASSERT_REL(m.update_tight, dd * r->ddm, 1e-9, "%s: update_tight = d dDm", ctx);
      else
        TU_ASSERT_LE(m.update_tight, 2.0 * dd * fmin(r->dcentred, r->dR), 1e-9,
                     "%s: centred update_tight", ctx);
    }
    check_rel_update(ctx, m.rel_update, r->d_norm, r->norm, r->norm0);
  }
}

/* The three lm_head data sets: 0 Gaussian init (std 1/d), 1 classes around a shared mean
 * (where the tight bound is far below the headline), 2 a larger V for the blocked all-pairs
 * path. */
static const struct { const char *name; size_t V, d; int shifted; } lm_sets[] = {
    {"lm_head Gaussian V 40 d 24", 40, 24, 0},
    {"lm_head shared mean V 50 d 16", 50, 16, 1},
    {"lm_head Gaussian V 700 d 32", 700, 32, 0},
};

static float *make_lm(size_t V, size_t d, int shifted, tu_rng *r) {
  float *w = tu_floats(V * d);
  if (!shifted) {
    tu_fill_gauss(w, V, d, d, 1.0 / (double)d, r);
  } else {
    double *mu = tu_doubles(d);
    for (size_t j = 0; j < d; j++) mu[j] = tu_rng_gauss(r);
    for (size_t i = 0; i < V; i++)
      for (size_t j = 0; j < d; j++) w[i * d + j] = (float)(mu[j] + 0.1 * tu_rng_gauss(r));
    free(mu);
  }
  return w;
}

START_TEST(test_lm_head) {
  size_t V = lm_sets[_i].V, d = lm_sets[_i].d;
  tu_rng r;
  tu_rng_init(&r, 301 + (uint64_t)_i);
  float *w0 = make_lm(V, d, lm_sets[_i].shifted, &r), *w1 = tu_floats(V * d);
  memcpy(w1, w0, sizeof(float) * V * d);
  for (size_t i = 0; i < V; i++)
    for (size_t j = 0; j < d; j++)
      w1[i * d + j] += (float)(1e-3 / (double)d * (i == 3 ? 10.0 : 1.0) * tu_rng_gauss(&r));
  double *w = tu_to_double(w1, NULL, V, d, d, 0), *dw = tu_to_double(w1, w0, V, d, d, 0),
         *wb = tu_to_double(w0, NULL, V, d, d, 0);
  lm_ref ref = ref_lm(w, dw, wb, V, d);
  lm_ref ref_nodw = ref_lm(w, NULL, NULL, V, d);
  if (lm_sets[_i].shifted)  // the data set is one where the centred bound beats the headline
    ck_assert_msg(ref.centred < 0.5 * ref.R, "test data: centred radius %g vs R %g", ref.centred, ref.R);
  char what[160];

  stab_layer l = {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = d,
                  .layout = STAB_LAYOUT_NATURAL, .weight = w1};
  stab_layer b = l;
  b.weight = w0;
  snprintf(what, sizeof what, "%s natural", lm_sets[_i].name);
  check_lm_head(what, &l, NULL, &ref_nodw, V, d);
  snprintf(what, sizeof what, "%s natural, update", lm_sets[_i].name);
  check_lm_head(what, &l, &b, &ref, V, d);
  l.layout = b.layout = STAB_LAYOUT_OUT_MAJOR;
  snprintf(what, sizeof what, "%s OUT_MAJOR (= [V][d]), update", lm_sets[_i].name);
  check_lm_head(what, &l, &b, &ref, V, d);

  /* natural in NaN-padded rows */
  size_t ld = d + 5;
  float *p1 = tu_matrix_padded(V, d, ld), *p0 = tu_matrix_padded(V, d, ld);
  for (size_t i = 0; i < V; i++)
    for (size_t j = 0; j < d; j++) {
      p1[i * ld + j] = w1[i * d + j];
      p0[i * ld + j] = w0[i * d + j];
    }
  l.layout = b.layout = STAB_LAYOUT_NATURAL;
  l.ld = b.ld = ld;
  l.weight = p1;
  b.weight = p0;
  snprintf(what, sizeof what, "%s natural ld %zu, update", lm_sets[_i].name, ld);
  check_lm_head(what, &l, &b, &ref, V, d);

  /* IN_MAJOR: [d][V], NaN-padded */
  ld = V + 3;
  float *t1 = tu_matrix_padded(d, V, ld), *t0 = tu_matrix_padded(d, V, ld);
  for (size_t i = 0; i < V; i++)
    for (size_t j = 0; j < d; j++) {
      t1[j * ld + i] = w1[i * d + j];
      t0[j * ld + i] = w0[i * d + j];
    }
  l.layout = b.layout = STAB_LAYOUT_IN_MAJOR;
  l.ld = b.ld = ld;
  l.weight = t1;
  b.weight = t0;
  snprintf(what, sizeof what, "%s IN_MAJOR [d][V] ld %zu, update", lm_sets[_i].name, ld);
  check_lm_head(what, &l, &b, &ref, V, d);

  free(w0);
  free(w1);
  free(w);
  free(dw);
  free(wb);
  free(p0);
  free(p1);
  free(t0);
  free(t1);
}
END_TEST

/* Sampled inputs x (RMS 1) and labels t never give a loss above forward or forward_tight,
 * nor a difference quotient above dependency_tight; the worst pair's direction attains
 * d Dm. */
START_TEST(test_lm_head_bruteforce) {
  enum { SAMPLES = 400 };
  size_t V = lm_sets[_i].V, d = lm_sets[_i].d;
  if (V > 100) V = 100;  // the brute force is O(V d) per sample
  tu_rng r;
  tu_rng_init(&r, 311 + (uint64_t)_i);
  float *w1 = make_lm(V, d, lm_sets[_i].shifted, &r);
  double *w = tu_to_double(w1, NULL, V, d, d, 0);
  stab_layer l = {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = d,
                  .layout = STAB_LAYOUT_NATURAL, .weight = w1};
  stab_metrics_params pc = params_with(STAB_SPECTRAL_LANCZOS, STAB_TIGHT_CENTRED);
  stab_metrics_params pe = params_with(STAB_SPECTRAL_LANCZOS, STAB_TIGHT_EXACT);
  stab_metrics mc = measure(&l, NULL, &pc, NULL, lm_sets[_i].name);
  stab_metrics me = measure(&l, NULL, &pe, NULL, lm_sets[_i].name);
  const char *what = lm_sets[_i].name;

  /* the worst pair, by brute force */
  size_t ia = 0, ib = 1;
  double best = -1.0;
  for (size_t i = 0; i < V; i++)
    for (size_t t = 0; t < V; t++) {
      double s = 0.0;
      for (size_t j = 0; j < d; j++) s += pow(w[i * d + j] - w[t * d + j], 2);
      if (s > best) best = s, ia = i, ib = t;
    }

  double *x = tu_doubles(d), *x2 = tu_doubles(d), *dir = tu_doubles(d);
  for (size_t j = 0; j < d; j++) dir[j] = w[ia * d + j] - w[ib * d + j];
  double dn = tu_rms_d(dir, d);
  for (size_t j = 0; j < d; j++) dir[j] /= dn;  // RMS 1

  /* x along w_a - w_b with label b: loss >= d Dm, and still <= forward_tight */
  double l_adv = lm_loss(w, V, d, dir, ib);
  ck_assert_msg(l_adv >= me.dependency_tight * (1.0 - 1e-9),
                "%s: loss %.17g at the worst direction below d Dm = %.17g", what, l_adv,
                me.dependency_tight);
  TU_ASSERT_LE(l_adv, me.forward_tight, 1e-12, "%s: worst direction, exact tight", what);
  TU_ASSERT_LE(l_adv, mc.forward_tight, 1e-12, "%s: worst direction, centred tight", what);
  TU_ASSERT_LE(l_adv, me.forward, 1e-12, "%s: worst direction, headline", what);

  for (int s = 0; s < SAMPLES; s++) {
    size_t t = (size_t)(tu_rng_u64(&r) % V);
    tu_random_unit_rms(x, d, &r);
    if (s % 4 == 0)  // half-way to the worst direction
      for (size_t j = 0; j < d; j++) x[j] = 0.5 * x[j] + dir[j];
    double xn = tu_rms_d(x, d);
    for (size_t j = 0; j < d; j++) x[j] /= xn;
    double l1 = lm_loss(w, V, d, x, t);
    TU_ASSERT_LE(l1, me.forward, 1e-12, "%s: sample %d, headline forward", what, s);
    TU_ASSERT_LE(l1, mc.forward_tight, 1e-12, "%s: sample %d, centred forward_tight", what, s);
    TU_ASSERT_LE(l1, me.forward_tight, 1e-12, "%s: sample %d, exact forward_tight", what, s);

    /* a nearby or a far second input, sometimes along the worst direction */
    double step = s % 3 == 0 ? 1e-4 : s % 3 == 1 ? 0.1 : 1.0;
    tu_random_unit_rms(x2, d, &r);
    for (size_t j = 0; j < d; j++) x2[j] = x[j] + step * (s % 2 ? dir[j] : x2[j]);
    double dx = 0.0;
    for (size_t j = 0; j < d; j++) dx += (x2[j] - x[j]) * (x2[j] - x[j]);
    dx = sqrt(dx / (double)d);
    double q = fabs(lm_loss(w, V, d, x2, t) - l1) / dx;
    TU_ASSERT_LE(q, me.dependency_tight, 1e-9, "%s: pair %d (step %g), exact", what, s, step);
    TU_ASSERT_LE(q, mc.dependency_tight, 1e-9, "%s: pair %d (step %g), centred", what, s, step);
    TU_ASSERT_LE(q, me.dependency, 1e-9, "%s: pair %d (step %g), headline", what, s, step);
  }
  free(x);
  free(x2);
  free(dir);
  free(w);
  free(w1);
}
END_TEST

/* ---- tables: vocab and width, the same for both kinds ---------------------------------------- */

/* One [V][d] table registered as a tied model does, as embedding and as lm_head with the same
 * .vocab, .width and .weight: each kind gives its definition by brute force. V != d, so a
 * table read the other way round would change every value. */
START_TEST(test_table_vocab_width) {
  enum { V = 70, D = 24 };
  tu_rng r;
  tu_rng_init(&r, 321);
  float *w = make_lm(V, D, 0, &r);
  for (size_t j = 0; j < D; j++) w[17 * D + j] *= 3.0f;  // one row sets the max
  double *wd = tu_to_double(w, NULL, V, D, D, 0);
  const double R = ref_max_row_rms_d(wd, V, D), dm = ref_diameter_rows_d(wd, V, D);
  stab_layer emb = {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = D, .weight = w};
  stab_layer head = {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = D, .weight = w};
  stab_metrics_params p = params_with(STAB_SPECTRAL_LANCZOS, STAB_TIGHT_EXACT);
  stab_metrics me = measure(&emb, NULL, &p, NULL, "tied table as embedding");
  stab_metrics mh = measure(&head, NULL, &p, NULL, "tied table as lm_head");
  TU_ASSERT_REL(me.forward, R, 1e-12, "embedding forward = max_i ||E_i||_RMS");
  TU_ASSERT_REL(mh.forward, log((double)V) + 2.0 * D * R, 1e-12, "lm_head forward = log V + 2 d R");
  TU_ASSERT_REL(mh.dependency, 2.0 * D * R, 1e-12, "lm_head dependency = 2 d R");
  TU_ASSERT_REL(mh.dependency_tight, D * dm, 1e-9, "lm_head dependency_tight = d Dm");

  /* d_in and d_out beside them, in the kind's math: the same numbers */
  stab_layer emb2 = emb, head2 = head;
  emb2.d_in = V, emb2.d_out = D;
  head2.d_in = D, head2.d_out = V;
  stab_metrics me2 = measure(&emb2, NULL, &p, NULL, "embedding with d_in, d_out too");
  stab_metrics mh2 = measure(&head2, NULL, &p, NULL, "lm_head with d_in, d_out too");
  ck_assert_msg(me2.forward == me.forward && mh2.forward == mh.forward, "consistent d_in, d_out changed a value");

  /* ... and contradicting them: refused, naming the layer and both pairs */
  stab_metrics m;
  head2.d_in = V, head2.d_out = D;  // the embedding's pair on the head
  TU_ASSERT_STATUS(stab_layer_metrics(&head2, NULL, NULL, &m, NULL), STAB_EINVAL, "lm_head d_in V, d_out d");
  ck_assert_msg(strstr(stab_last_error(), "'lm_head'") && strstr(stab_last_error(), "contradict"),
                "message: %s", stab_last_error());
  emb2.d_out = V;
  TU_ASSERT_STATUS(stab_layer_metrics(&emb2, NULL, NULL, &m, NULL), STAB_EINVAL, "embedding d_out V");

  /* The interface before 0.2.0, d_in and d_out alone, right or swapped: refused, never read
   * either way, with a message saying what to write instead */
  static const stab_kind kinds[] = {STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD};
  for (int k = 0; k < 2; k++)
    for (int swapped = 0; swapped < 2; swapped++) {
      stab_layer old = {.name = "old", .kind = kinds[k], .d_in = swapped ? D : V, .d_out = swapped ? V : D,
                        .weight = w};
      const char *what = stab_kind_name(kinds[k]);
      TU_ASSERT_STATUS(stab_layer_metrics(&old, NULL, NULL, &m, NULL), STAB_EINVAL, "%s given d_in %zu, d_out %zu",
                       what, old.d_in, old.d_out);
      const char *e = stab_last_error();
      ck_assert_msg(strstr(e, "'old'") && strstr(e, what) && strstr(e, "use .vocab") && strstr(e, ".width"),
                    "%s: the message does not name the layer or say to use .vocab and .width: %s", what, e);
      TU_ASSERT_NAN(m.forward, "%s refused", what);
    }

  /* vocab and width belong to tables only */
  stab_layer fc = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D, .vocab = V, .width = D,
                   .weight = w};
  TU_ASSERT_STATUS(stab_layer_metrics(&fc, NULL, NULL, &m, NULL), STAB_EINVAL, "linear with vocab and width");
  ck_assert_msg(strstr(stab_last_error(), "'fc'") && strstr(stab_last_error(), "d_in and d_out"), "message: %s",
                stab_last_error());
  free(wd);
  free(w);
}
END_TEST

/* stab_layer changed in 0.2.0 (vocab, width): the header's version, configure's and the
 * library's must say so alike, or a caller's version check passes against the wrong one. */
START_TEST(test_version_of_the_interface) {
  char composed[32];
  snprintf(composed, sizeof composed, "%d.%d.%d", STAB_VERSION_MAJOR, STAB_VERSION_MINOR, STAB_VERSION_PATCH);
  ck_assert_str_eq(composed, STAB_VERSION_STRING);
  ck_assert_str_eq(STAB_VERSION_STRING, PACKAGE_VERSION);
  ck_assert_str_eq(stab_version(), STAB_VERSION_STRING);
  ck_assert_msg(STAB_VERSION_MAJOR > 0 || STAB_VERSION_MINOR >= 2, "stab_layer has vocab and width since 0.2.0");
}
END_TEST

/* ---- gain and bias --------------------------------------------------------------------- */

START_TEST(test_gain) {
  enum { D = 100 };
  tu_rng r;
  tu_rng_init(&r, 401);
  float *g0 = tu_floats(D), *g1 = tu_floats(D);
  for (size_t i = 0; i < D; i++) g0[i] = (float)(1.0 + 0.1 * tu_rng_gauss(&r));
  g0[37] = -3.75f;
  for (size_t i = 0; i < D; i++) g1[i] = g0[i] - (i % 2 ? 1e-3f : -1e-3f);
  g1[61] = g0[61] + 0.02f;
  stab_layer l = {.name = "ln_f", .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = g1};
  stab_layer b = l;
  b.weight = g0;
  double gmax = 0.0, dmax = 0.0, dn = 0.0, n1 = 0.0, n0 = 0.0;
  for (size_t i = 0; i < D; i++) {
    gmax = fmax(gmax, fabs((double)g1[i]));
    double dg = (double)g1[i] - (double)g0[i];
    dmax = fmax(dmax, fabs(dg));
    dn += dg * dg;
    n1 += (double)g1[i] * g1[i];
    n0 += (double)g0[i] * g0[i];
  }
  ck_assert_double_eq(gmax, (double)g1[37]  * -1.0);

  stab_metrics m = measure(&l, NULL, NULL, NULL, "gain");
  ck_assert_msg(m.forward == gmax && m.dependency == gmax,
                "gain: forward %.17g, dependency %.17g, expected max|gamma| = %.17g", m.forward,
                m.dependency, gmax);
  TU_ASSERT_NAN(m.update, "gain, no update");
  TU_ASSERT_NAN(m.spread, "gain");
  TU_ASSERT_NAN(m.forward_tight, "gain");
  ck_assert_msg(m.flags == 0, "gain: flags %#x", (unsigned)m.flags);

  m = measure(&l, &b, NULL, NULL, "gain, update");
  ck_assert_msg(m.forward == gmax, "gain: forward %.17g, expected %.17g", m.forward, gmax);
  ck_assert_msg(m.update == dmax, "gain: update %.17g, expected max|dgamma| = %.17g", m.update, dmax);
  check_rel_update("gain", m.rel_update, sqrt(dn), sqrt(n1), sqrt(n0));

  /* layout is ignored for gain */
  l.layout = STAB_LAYOUT_IN_MAJOR;
  m = measure(&l, NULL, NULL, NULL, "gain, in-major");
  ck_assert_msg(m.forward == gmax, "gain in-major: forward %.17g", m.forward);

  /* brute force: diag(gamma) on RMS-1 inputs; sqrt(d) e_37 attains max|gamma| */
  double *x = tu_doubles(D), *y = tu_doubles(D);
  x[37] = sqrt((double)D);
  for (size_t i = 0; i < D; i++) y[i] = x[i] * g1[i];
  TU_ASSERT_REL(tu_rms_d(y, D), m.forward, 1e-14, "gain at sqrt(d) e_37");
  for (int s = 0; s < 100; s++) {
    tu_random_unit_rms(x, D, &r);
    for (size_t i = 0; i < D; i++) y[i] = x[i] * g1[i];
    TU_ASSERT_LE(tu_rms_d(y, D), m.forward, 1e-14, "gain sample %d", s);
  }
  free(x);
  free(y);
  free(g0);
  free(g1);
}
END_TEST

START_TEST(test_bias) {
  enum { D = 77 };
  tu_rng r;
  tu_rng_init(&r, 402);
  float *b0 = tu_floats(D), *b1 = tu_floats(D);
  tu_fill_gauss(b0, 1, D, D, 0.3, &r);
  for (size_t i = 0; i < D; i++) b1[i] = b0[i] + (float)(1e-3 * tu_rng_gauss(&r));
  stab_layer l = {.name = "b", .kind = STAB_KIND_BIAS, .d_in = D, .d_out = D, .weight = b1};
  stab_layer b = l;
  b.weight = b0;
  stab_metrics m = measure(&l, NULL, NULL, NULL, "bias");
  TU_ASSERT_REL(m.forward, ref_rms(b1, D, 1), 1e-14, "bias forward = RMS");
  TU_ASSERT_NAN(m.dependency, "bias");
  TU_ASSERT_NAN(m.update, "bias, no update");
  TU_ASSERT_NAN(m.spread, "bias");
  TU_ASSERT_NAN(m.forward_tight, "bias");
  m = measure(&l, &b, NULL, NULL, "bias, update");
  double db = ref_rms_diff(b1, b0, D);
  TU_ASSERT_REL(m.update, db, 1e-14, "bias update = RMS(db)");
  TU_ASSERT_REL(m.forward, ref_rms(b1, D, 1), 1e-14, "bias forward with update");
  check_rel_update("bias", m.rel_update, db, ref_rms(b1, D, 1), ref_rms(b0, D, 1));
  free(b0);
  free(b1);
}
END_TEST

/* ---- attention ------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  size_t d, heads, dh;
  int in_major;
  double scale;     /* 0: default 1/sqrt(d_h) */
  int fused;        /* in-major qkv [d][3 H dh], q and k blocks read through ld */
} attn_case;

static const attn_case attn_cases[] = {
    {"out-major d 48, 3 heads of 8", 48, 3, 8, 0, 0.0, 0},
    {"in-major d 48, 3 heads of 8", 48, 3, 8, 1, 0.0, 0},
    {"out-major d 64, 4 heads of 16, scale 0.3", 64, 4, 16, 0, 0.3, 0},
    {"in-major d 64, 4 heads of 16, scale 0.3", 64, 4, 16, 1, 0.3, 0},
    {"out-major d 40, 1 head of 40", 40, 1, 40, 0, 0.0, 0},
    {"fused in-major qkv [48][144], 4 heads of 12", 48, 4, 12, 1, 0.0, 1},
    {"out-major d 16, 4 heads of 1", 16, 4, 1, 0, 0.0, 0},
    {"in-major d 16, 4 heads of 1", 16, 4, 1, 1, 0.0, 0},
};
enum { NATTN = sizeof attn_cases / sizeof attn_cases[0] };

/* The head-h block of a stored projection: out-major rows h dh.., in-major columns h dh.. */
static const float *head_block(const float *w, const attn_case *c, size_t ld, size_t h,
                               size_t *rows, size_t *cols) {
  if (c->in_major) {
    *rows = c->d, *cols = c->dh;
    return w + h * c->dh;
  }
  *rows = c->dh, *cols = c->d;
  return w + h * c->dh * ld;
}

/* q = x Wq_h for the stored block (length dh) */
static void head_apply(const float *blk, const attn_case *c, size_t ld, const double *x, double *q) {
  if (c->in_major)
    tu_matvec_t(blk, c->d, c->dh, ld, x, q);
  else
    tu_matvec(blk, c->dh, c->d, ld, x, q);
}

START_TEST(test_attention) {
  const attn_case *c = &attn_cases[_i];
  size_t dout = c->heads * c->dh;
  tu_rng r;
  tu_rng_init(&r, 501 + (uint64_t)_i);
  size_t rows = c->in_major ? c->d : dout, cols = c->in_major ? dout : c->d;
  size_t ld = c->fused ? 3 * dout : cols;
  float *buf = tu_floats(rows * ld), *wq, *wk;
  tu_fill_gauss(buf, rows, ld, ld, 1.0 / sqrt((double)c->d), &r);
  if (c->fused) {
    wq = buf;
    wk = buf + dout;
    for (size_t i = 0; i < rows; i++)  // v block 30x bigger: a block-blind reader is caught
      for (size_t j = 2 * dout; j < 3 * dout; j++) buf[i * ld + j] *= 30.0f;
  } else {
    wq = buf;
    wk = tu_floats(rows * ld);
    tu_fill_gauss(wk, rows, ld, ld, 1.0 / sqrt((double)c->d), &r);
  }
  /* heads of different sizes, so that the max over heads is one definite head */
  for (size_t h = 0; h < c->heads; h++) {
    size_t br, bc;
    float *bq = (float *)head_block(wq, c, ld, h, &br, &bc);
    float *bk = (float *)head_block(wk, c, ld, h, &br, &bc);
    for (size_t i = 0; i < br; i++)
      for (size_t j = 0; j < bc; j++) {
        bq[i * ld + j] *= (float)(1.0 + 0.3 * (double)h);
        bk[i * ld + j] *= (float)(1.0 + 0.2 * (double)((h + 1) % c->heads));
      }
  }
  double s = c->scale > 0.0 ? c->scale : 1.0 / sqrt((double)c->dh);
  double *ref = tu_doubles(c->heads), ref_max = 0.0, sigq_max = 0.0;
  for (size_t h = 0; h < c->heads; h++) {
    size_t br, bc;
    const float *bq = head_block(wq, c, ld, h, &br, &bc);
    const float *bk = head_block(wk, c, ld, h, &br, &bc);
    double sq = ref_sigma(bq, br, bc, ld), sk = ref_sigma(bk, br, bc, ld);
    double f = sqrt((double)c->d / (double)c->dh);
    ref[h] = s * (double)c->dh * (f * sq) * (f * sk);
    ref_max = fmax(ref_max, ref[h]);
    sigq_max = fmax(sigq_max, sq);
  }

  stab_layer l = {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = c->d, .d_out = dout,
                  .layout = c->in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR,
                  .ld = c->fused ? ld : 0, .weight = wq, .weight_k = wk, .heads = c->heads,
                  .scale = c->scale};
  double *heads = tu_doubles(c->heads), sigma_got[2];
  for (int k = 0; k < 2; k++) {
    stab_metrics_params p = params_with(k ? STAB_SPECTRAL_LANCZOS : STAB_SPECTRAL_EXACT,
                                        STAB_TIGHT_CENTRED);
    char ctx[200];
    snprintf(ctx, sizeof ctx, "%s, %s", c->name, k ? "LANCZOS" : "EXACT");
    double tol = k ? 2.0 * LANCZOS_TOL + LANCZOS_TOL * LANCZOS_TOL : 3.0 * tu_tol_exact(c->d, dout);
    for (size_t h = 0; h < c->heads; h++) heads[h] = NAN;
    stab_metrics m = measure(&l, NULL, &p, heads, ctx);
    ck_assert_msg(m.flags == 0, "%s: flags %#x", ctx, (unsigned)m.flags);
    for (size_t h = 0; h < c->heads; h++) {
      TU_ASSERT_REL(heads[h], ref[h], tol, "%s: head %zu bound s d_h Fq Fk", ctx, h);
      if (k) TU_ASSERT_LE(heads[h], ref[h], tu_round_slack(c->d, dout), "%s: head %zu", ctx, h);
    }
    TU_ASSERT_REL(m.forward, ref_max, tol, "%s: max over heads", ctx);
    sigma_got[k] = m.sigma;
    TU_ASSERT_NAN(m.dependency, "%s", ctx);
    TU_ASSERT_NAN(m.update, "%s, no update", ctx);
    TU_ASSERT_NAN(m.spread, "%s", ctx);
    TU_ASSERT_NAN(m.forward_tight, "%s", ctx);
    /* heads_out may be NULL */
    stab_metrics m2 = measure(&l, NULL, &p, NULL, ctx);
    ck_assert_msg(memcmp(&m.forward, &m2.forward, sizeof(double)) == 0,
                  "%s: forward %.17g with heads_out, %.17g without", ctx, m.forward, m2.forward);
  }

  /* brute force: sampled logits s <x1 Wq_h, x2 Wk_h> with RMS-1 inputs never exceed the
   * head's bound; the top singular inputs of each block come closest */
  double *x1 = tu_doubles(c->d), *x2 = tu_doubles(c->d), *q = tu_doubles(c->dh),
         *kk = tu_doubles(c->dh), *uq = tu_doubles(c->d > c->dh ? c->d : c->dh),
         *uk = tu_doubles(c->d > c->dh ? c->d : c->dh);
  for (size_t h = 0; h < c->heads; h++) {
    size_t br, bc;
    const float *bq = head_block(wq, c, ld, h, &br, &bc);
    const float *bk = head_block(wk, c, ld, h, &br, &bc);
    for (int smp = 0; smp < 101; smp++) {
      if (smp == 0) {
        /* the input side of the block: right vectors out-major, left vectors in-major */
        if (c->in_major) {
          ref_sigma_vectors(bq, br, bc, ld, uq, NULL);
          ref_sigma_vectors(bk, br, bc, ld, uk, NULL);
        } else {
          ref_sigma_vectors(bq, br, bc, ld, NULL, uq);
          ref_sigma_vectors(bk, br, bc, ld, NULL, uk);
        }
        for (size_t j = 0; j < c->d; j++) x1[j] = uq[j] * sqrt((double)c->d);
        for (size_t j = 0; j < c->d; j++) x2[j] = uk[j] * sqrt((double)c->d);
      } else {
        tu_random_unit_rms(x1, c->d, &r);
        tu_random_unit_rms(x2, c->d, &r);
      }
      head_apply(bq, c, ld, x1, q);
      head_apply(bk, c, ld, x2, kk);
      double dot = 0.0;
      for (size_t j = 0; j < c->dh; j++) dot += q[j] * kk[j];
      TU_ASSERT_LE(fabs(s * dot), heads[h], 1e-12, "%s: head %zu sample %d", c->name, h, smp);
    }
  }
  /* sigma is a linear layer's field: NaN for attention (header), whose spectral norms are
   * per head and enter only the bounds */
  (void)sigq_max;
  ck_assert_msg(isnan(sigma_got[0]) && isnan(sigma_got[1]), "%s: attention sigma is %g / %g, not NaN",
                c->name, sigma_got[0], sigma_got[1]);
  free(x1);
  free(x2);
  free(q);
  free(kk);
  free(uq);
  free(uk);
  free(heads);
  free(ref);
  if (!c->fused) free(wk);
  free(buf);
}
END_TEST

/* With Wk = Wq the bound is attained: x1 = x2 = the top input of the worst head. */
START_TEST(test_attention_attained) {
  enum { D = 32, H = 2, DH = 8 };
  tu_rng r;
  tu_rng_init(&r, 551);
  float *w = tu_floats(H * DH * D);  // out-major [H DH][D]
  tu_fill_gauss(w, H * DH, D, D, 0.2, &r);
  for (size_t i = DH; i < H * DH; i++)
    for (size_t j = 0; j < D; j++) w[i * D + j] *= 1.5f;  // head 1 is the larger
  stab_layer l = {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = D, .d_out = H * DH,
                  .layout = STAB_LAYOUT_OUT_MAJOR, .weight = w, .weight_k = w, .heads = H};
  double heads[H];
  stab_metrics m = measure(&l, NULL, NULL, heads, "Wk = Wq");
  double *v = tu_doubles(D), *x = tu_doubles(D), *q = tu_doubles(DH);
  ref_sigma_vectors(w + DH * D, DH, D, D, NULL, v);
  for (size_t j = 0; j < D; j++) x[j] = v[j] * sqrt((double)D);
  tu_matvec(w + DH * D, DH, D, D, x, q);
  double logit = 0.0;
  for (size_t j = 0; j < DH; j++) logit += q[j] * q[j];
  logit /= sqrt((double)DH);
  TU_ASSERT_REL(m.forward, logit, 2.0 * LANCZOS_TOL + 1e-6, "attained logit of head 1");
  TU_ASSERT_REL(heads[1], logit, 2.0 * LANCZOS_TOL + 1e-6, "attained logit of head 1");
  TU_ASSERT_LE(heads[1], logit, 1e-10, "head 1 bound is a Ritz-based lower estimate");
  free(v);
  free(x);
  free(q);
  free(w);
}
END_TEST

/* ---- non-finite ------------------------------------------------------------------------ */

/* Loop index: 0 linear, 1 linear (NaN in bias), 2 embedding, 3 lm_head, 4 gain, 5 bias,
 * 6 attention (NaN in weight_k); each with NaN and with Inf. */
START_TEST(test_nonfinite_weight) {
  int which = _i / 2;
  float bad = _i % 2 ? INFINITY : NAN;
  enum { DI = 24, DO = 16 };
  tu_rng r;
  tu_rng_init(&r, 601);
  float *w = tu_floats(DI * DO), *w2 = tu_floats(DI * DO), *b = tu_floats(DO);
  tu_fill_gauss(w, DI, DO, DO, 0.2, &r);
  tu_fill_gauss(w2, DI, DO, DO, 0.2, &r);
  tu_fill_gauss(b, 1, DO, DO, 0.2, &r);
  stab_layer l = {.name = "bad", .weight = w};
  static const char *names[] = {"linear", "linear bias", "embedding", "lm_head", "gain", "bias", "attention k"};
  switch (which) {
  case 0:
  case 1:
    l.kind = STAB_KIND_LINEAR, l.d_in = DI, l.d_out = DO, l.layout = STAB_LAYOUT_IN_MAJOR;
    l.bias = b;
    break;
  case 2:
    l.kind = STAB_KIND_EMBEDDING, l.vocab = DI, l.width = DO;
    break;
  case 3:
    l.kind = STAB_KIND_LM_HEAD, l.vocab = DI, l.width = DO;
    break;
  case 4:
  case 5:
    l.kind = which == 4 ? STAB_KIND_GAIN : STAB_KIND_BIAS, l.d_in = l.d_out = DI;
    break;
  default:
    l.kind = STAB_KIND_ATTENTION, l.d_in = DI, l.d_out = DO, l.layout = STAB_LAYOUT_IN_MAJOR;
    l.weight_k = w2, l.heads = 2;
    break;
  }
  char ctx[100];
  snprintf(ctx, sizeof ctx, "%s with %g", names[which], (double)bad);
  /* the finite layer first, then the same with one bad value */
  double heads[2];
  stab_metrics_params p = params_with(STAB_SPECTRAL_LANCZOS, STAB_TIGHT_EXACT);
  stab_metrics good = measure(&l, NULL, &p, heads, ctx);
  ck_assert_msg(isfinite(good.forward) && good.flags == 0, "%s: finite layer gave %g, flags %#x",
                ctx, good.forward, (unsigned)good.flags);
  if (which == 1)
    b[DO - 1] = bad;
  else if (which == 6)
    w2[5 * DO + 3] = bad;  // column 3: head 0 in-major
  else
    w[7] = bad;
  stab_metrics m = measure(&l, NULL, &p, heads, ctx);
  ck_assert_msg(m.flags & STAB_FLAG_NONFINITE_WEIGHT, "%s: flags %#x lack NONFINITE_WEIGHT", ctx,
                (unsigned)m.flags);
  TU_ASSERT_NAN(m.forward, "%s", ctx);
  if (which == 0 || which == 4 || which == 3) TU_ASSERT_NAN(m.dependency, "%s", ctx);
  if (which == 0) TU_ASSERT_NAN(m.sigma, "%s", ctx);
  if (which == 3) TU_ASSERT_NAN(m.forward_tight, "%s", ctx);
  if (which == 6) TU_ASSERT_NAN(heads[0], "%s: head 0 holds the bad value", ctx);
  free(w);
  free(w2);
  free(b);
}
END_TEST

/* A bad value in `before` spoils the update only. Loop: 0 linear, 1 embedding, 2 lm_head, 3 gain, 4 bias. */
START_TEST(test_nonfinite_update) {
  enum { DI = 24, DO = 16 };
  tu_rng r;
  tu_rng_init(&r, 602);
  float *w = tu_floats(DI * DO), *w0 = tu_floats(DI * DO);
  tu_fill_gauss(w, DI, DO, DO, 0.2, &r);
  memcpy(w0, w, sizeof(float) * DI * DO);
  tu_add_relative_noise(w, DI, DO, DO, 1e-2, &r);
  static const stab_kind kinds[] = {STAB_KIND_LINEAR, STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD,
                                    STAB_KIND_GAIN, STAB_KIND_BIAS};
  stab_layer l = {.name = "l", .kind = kinds[_i], .d_in = DI, .d_out = DO, .weight = w};
  if (kinds[_i] == STAB_KIND_GAIN || kinds[_i] == STAB_KIND_BIAS) l.d_out = DI;
  if (kinds[_i] == STAB_KIND_EMBEDDING || kinds[_i] == STAB_KIND_LM_HEAD)
    l.d_in = l.d_out = 0, l.vocab = DI, l.width = DO;
  stab_layer b = l;
  b.weight = w0;
  const char *ctx = stab_kind_name(kinds[_i]);
  stab_metrics_params p = params_with(STAB_SPECTRAL_EXACT, STAB_TIGHT_EXACT);
  stab_metrics clean = measure(&l, NULL, &p, NULL, ctx);
  w0[11] = NAN;
  stab_metrics m = measure(&l, &b, &p, NULL, ctx);
  ck_assert_msg(m.flags & STAB_FLAG_NONFINITE_UPDATE, "%s: flags %#x lack NONFINITE_UPDATE", ctx,
                (unsigned)m.flags);
  ck_assert_msg(!(m.flags & STAB_FLAG_NONFINITE_WEIGHT), "%s: flags %#x claim NONFINITE_WEIGHT",
                ctx, (unsigned)m.flags);
  TU_ASSERT_NAN(m.update, "%s", ctx);
  ck_assert_msg(m.forward == clean.forward, "%s: forward %.17g with a bad update, %.17g without",
                ctx, m.forward, clean.forward);
  free(w);
  free(w0);
}
END_TEST

START_TEST(test_not_converged_flag) {
  tu_rng r;
  tu_rng_init(&r, 701);
  float *w = tu_floats(200 * 200);
  tu_fill_gauss(w, 200, 200, 200, 0.05, &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 200, .d_out = 200, .weight = w};
  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.tol = 1e-10;
  p.spectral.max_passes = 2;
  stab_metrics m = measure(&l, NULL, &p, NULL, "max_passes 2");
  ck_assert_msg(m.flags & STAB_FLAG_NOT_CONVERGED, "flags %#x lack NOT_CONVERGED", (unsigned)m.flags);
  ck_assert_msg(isfinite(m.forward) && m.forward > 0.0, "forward %g", m.forward);
  ck_assert_msg(m.sigma_rel_err > 1e-10, "sigma_rel_err %g", m.sigma_rel_err);
  TU_ASSERT_LE(m.forward, ref_sigma(w, 200, 200, 200), tu_round_slack(200, 200), "lower bound");
  free(w);
}
END_TEST

/* ---- threads ----------------------------------------------------------------------------- */

START_TEST(test_threads_bit_identical) {
  enum { DIN = 300, DOUT = 500 };
  tu_rng r;
  tu_rng_init(&r, 801);
  float *w0 = tu_floats(DIN * DOUT), *w1 = tu_floats(DIN * DOUT);
  tu_fill_gauss(w0, DOUT, DIN, DIN, init_std(DIN, DOUT), &r);
  memcpy(w1, w0, sizeof(float) * DIN * DOUT);
  tu_add_relative_noise(w1, DOUT, DIN, DIN, 1e-2, &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT, .weight = w1};
  stab_layer b = l;
  b.weight = w0;
  stab_layer a = {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = DIN, .d_out = DIN,
                  .weight = w1, .weight_k = w0, .heads = 6};
  stab_metrics ml[2], ma[2];
  double ha[2][6];
  for (int t = 0; t < 2; t++) {
    stab_metrics_params p = stab_metrics_default_params();
    p.spectral.threads = t + 1;
    ml[t] = measure(&l, &b, &p, NULL, "linear");
    ma[t] = measure(&a, NULL, &p, ha[t], "attention");
  }
  ck_assert_msg(memcmp(&ml[0].forward, &ml[1].forward, sizeof(double)) == 0 &&
                    memcmp(&ml[0].update, &ml[1].update, sizeof(double)) == 0 &&
                    memcmp(&ml[0].sigma_rel_err, &ml[1].sigma_rel_err, sizeof(double)) == 0,
                "linear: forward %.17g / %.17g, update %.17g / %.17g with 1 / 2 threads",
                ml[0].forward, ml[1].forward, ml[0].update, ml[1].update);
  ck_assert_msg(memcmp(ha[0], ha[1], sizeof ha[0]) == 0 &&
                    memcmp(&ma[0].forward, &ma[1].forward, sizeof(double)) == 0,
                "attention: forward %.17g / %.17g with 1 / 2 threads", ma[0].forward, ma[1].forward);
  free(w0);
  free(w1);
}
END_TEST

/* ---- invalid arguments ------------------------------------------------------------------- */

START_TEST(test_invalid_arguments) {
  float w[48];
  for (int i = 0; i < 48; i++) w[i] = (float)i / 48.0f;
  stab_metrics m;
  stab_layer ok = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 6, .d_out = 8, .weight = w};
  TU_ASSERT_OK(stab_layer_metrics(&ok, NULL, NULL, &m, NULL));

  TU_ASSERT_STATUS(stab_layer_metrics(NULL, NULL, NULL, &m, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_layer_metrics(&ok, NULL, NULL, NULL, NULL), STAB_EINVAL);
  stab_layer l = ok;
  l.weight = NULL;
  TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EINVAL, "weight NULL");
  l = ok;
  l.d_in = 0;
  TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EDIM, "d_in 0");
  l = ok;
  l.d_out = 0;
  TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EDIM, "d_out 0");
  l = ok;
  l.ld = 5;  // out-major rows are d_in = 6 long
  TU_ASSERT_FAILS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), "out-major ld 5 < 6");
  l = ok;
  l.layout = STAB_LAYOUT_IN_MAJOR;
  l.ld = 7;  // in-major rows are d_out = 8 long
  TU_ASSERT_FAILS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), "in-major ld 7 < 8");
  l = ok;
  l.kind = (stab_kind)42;
  TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EINVAL, "kind 42");
  l = ok;
  l.layout = (stab_layout)9;
  TU_ASSERT_STATUS(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EINVAL, "layout 9");

  stab_layer g = {.name = "g", .kind = STAB_KIND_GAIN, .d_in = 6, .d_out = 8, .weight = w};
  TU_ASSERT_FAILS(stab_layer_metrics(&g, NULL, NULL, &m, NULL), "gain with d_in != d_out");
  g.kind = STAB_KIND_BIAS;
  TU_ASSERT_FAILS(stab_layer_metrics(&g, NULL, NULL, &m, NULL), "bias with d_in != d_out");
  stab_layer e = {.name = "e", .kind = STAB_KIND_EMBEDDING, .vocab = 0, .width = 8, .weight = w};
  TU_ASSERT_STATUS(stab_layer_metrics(&e, NULL, NULL, &m, NULL), STAB_EDIM, "embedding V 0");
  e.kind = STAB_KIND_LM_HEAD;
  TU_ASSERT_STATUS(stab_layer_metrics(&e, NULL, NULL, &m, NULL), STAB_EDIM, "lm_head V 0");
  e.vocab = 8;
  e.width = 0;
  TU_ASSERT_STATUS(stab_layer_metrics(&e, NULL, NULL, &m, NULL), STAB_EDIM, "lm_head d 0");

  stab_layer a = {.name = "a", .kind = STAB_KIND_ATTENTION, .d_in = 4, .d_out = 12, .weight = w,
                  .weight_k = w, .heads = 3};
  TU_ASSERT_OK(stab_layer_metrics(&a, NULL, NULL, &m, NULL));
  a.heads = 5;
  TU_ASSERT_FAILS(stab_layer_metrics(&a, NULL, NULL, &m, NULL), "5 heads for d_out 12");
  a.heads = 0;
  TU_ASSERT_FAILS(stab_layer_metrics(&a, NULL, NULL, &m, NULL), "0 heads");
  a.heads = 3;
  a.weight_k = NULL;
  TU_ASSERT_STATUS(stab_layer_metrics(&a, NULL, NULL, &m, NULL), STAB_EINVAL, "weight_k NULL");

  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.tol = 0.0;
  TU_ASSERT_FAILS(stab_layer_metrics(&ok, NULL, &p, &m, NULL), "tol 0");
  p.spectral.tol = -1.0;
  TU_ASSERT_FAILS(stab_layer_metrics(&ok, NULL, &p, &m, NULL), "tol -1");
  p = stab_metrics_default_params();
  p.tight = (stab_tight_method)9;
  e.width = 6;
  TU_ASSERT_FAILS(stab_layer_metrics(&e, NULL, &p, &m, NULL), "tight method 9");

  stab_layer before = ok;
  before.weight = NULL;
  TU_ASSERT_STATUS(stab_layer_metrics(&ok, &before, NULL, &m, NULL), STAB_EINVAL, "before->weight NULL");
}
END_TEST

static Suite *layer_metrics_suite(void) {
  Suite *s = suite_create("layer_metrics");
  TCase *tc = tcase_create("linear");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_linear_out_major);
  tcase_add_test(tc, test_linear_natural_is_out_major);
  tcase_add_test(tc, test_linear_in_major);
  tcase_add_test(tc, test_linear_ld);
  tcase_add_test(tc, test_fused_qkv_layouts);
  tcase_add_test(tc, test_fused_qkv_ld_on_out_major);
  tcase_add_test(tc, test_linear_update);
  tcase_add_loop_test(tc, test_linear_vector_shapes, 0, 5);
  tcase_add_test(tc, test_linear_bruteforce);
  suite_add_tcase(s, tc);

  tc = tcase_create("embedding");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_embedding);
  suite_add_tcase(s, tc);

  tc = tcase_create("lm_head");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_lm_head, 0, 3);
  tcase_add_loop_test(tc, test_lm_head_bruteforce, 0, 3);
  suite_add_tcase(s, tc);

  tc = tcase_create("interface"); /* what changed in 0.2.0; Check's default timeout (make check: 600 s) */
  tcase_add_test(tc, test_table_vocab_width);
  tcase_add_test(tc, test_version_of_the_interface);
  suite_add_tcase(s, tc);

  tc = tcase_create("gain_bias");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_gain);
  tcase_add_test(tc, test_bias);
  suite_add_tcase(s, tc);

  tc = tcase_create("attention");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_attention, 0, NATTN);
  tcase_add_test(tc, test_attention_attained);
  suite_add_tcase(s, tc);

  tc = tcase_create("robustness");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_nonfinite_weight, 0, 14);
  tcase_add_loop_test(tc, test_nonfinite_update, 0, 5);
  tcase_add_test(tc, test_not_converged_flag);
  tcase_add_test(tc, test_threads_bit_identical);
  tcase_add_test(tc, test_invalid_arguments);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(layer_metrics_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
