/* check_layer_dtype.c — stab_layer_metrics on weights stored as BF16 and F16: for every kind,
 * layout, tight method and spectral method, with and without `before` (in the same or another
 * dtype), the metrics must be bit-identical to those of the same layer converted to f32 first
 * (the conversion is exact, and the passes run the f32 kernels on converted tiles). Shapes are
 * picked so that tile boundaries fall inside a chunk of rows, inside an attention head's block,
 * and leave a remainder; a tile that read a wrong row would change the numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

/* Numbers held twice: as 16-bit patterns (bf16 or f16) and as the f32 values they stand for. */
typedef struct {
  uint16_t *h;
  float *f;
  size_t n;
  stab_dtype dtype;
} twin;

static float value_of(uint16_t h, stab_dtype dtype) {
  return dtype == STAB_DTYPE_BF16 ? stab_bf16_to_f32(h) : stab_f16_to_f32(h);
}

/* n random values of about N(0, std^2) that dtype represents exactly; f16 also gets a few
 * subnormals. */
static twin twin_random(size_t n, stab_dtype dtype, double std, tu_rng *r) {
  twin t = {malloc(n * sizeof(uint16_t)), tu_floats(n), n, dtype};
  ck_assert(t.h != NULL);
  for (size_t i = 0; i < n; i++) {
    float x = (float)(std * tu_rng_gauss(r));
    uint16_t h;
    if (dtype == STAB_DTYPE_BF16) {
      uint32_t bits;
      memcpy(&bits, &x, sizeof bits);
      h = (uint16_t)(bits >> 16); /* truncation: a bf16 value */
    } else if (tu_rng_u64(r) % 50 == 0) {
      h = (uint16_t)((tu_rng_u64(r) & 0x83ffu)); /* sign and mantissa, exponent 0: subnormal */
    } else {
      /* sign, exponent 2^-9 .. 2^2 around std, random mantissa */
      h = (uint16_t)(((tu_rng_u64(r) & 1u) << 15) | ((6u + tu_rng_u64(r) % 11u) << 10) |
                     (tu_rng_u64(r) & 0x3ffu));
    }
    t.h[i] = h;
    t.f[i] = value_of(h, dtype);
  }
  return t;
}

static void twin_free(twin *t) {
  free(t->h);
  free(t->f);
}

/* The most elements a 16-bit matrix has that the passes convert whole (lib/engine/spectral.c) */
#define WHOLE_CONVERTED ((size_t)1 << 20)

static const stab_spectral_method methods[] = {STAB_SPECTRAL_LANCZOS, STAB_SPECTRAL_POWER, STAB_SPECTRAL_EXACT};
static const char *const method_names[] = {"lanczos", "power", "exact"};
static const stab_tight_method tights[] = {STAB_TIGHT_CENTRED, STAB_TIGHT_EXACT, STAB_TIGHT_NONE};
static const char *const tight_names[] = {"centred", "exact", "none"};

/* The layer as described (its pointers into the f32 twins) against the same layer pointing
 * into the 16-bit twins at the same element offsets; `before` likewise, in its own dtype. Every
 * spectral method, and every tight method for tables. heads: attention's per-head bounds,
 * compared too. */
static void check_layer(const char *what, stab_layer l, const twin *w, const twin *b, const twin *k,
                        stab_layer *before, const twin *w0, const twin *b0) {
  const size_t woff = (size_t)(l.weight - w->f), boff = b ? (size_t)(l.bias - b->f) : 0;
  const size_t koff = k ? (size_t)(l.weight_k - k->f) : 0;
  stab_layer h = l;
  h.dtype = w->dtype;
  h.weight = (const float *)(const void *)(w->h + woff);
  h.bias = b ? (const float *)(const void *)(b->h + boff) : NULL;
  h.weight_k = k ? (const float *)(const void *)(k->h + koff) : NULL;
  stab_layer hb;
  if (before) {
    hb = *before;
    hb.dtype = w0->dtype;
    hb.weight = (const float *)(const void *)(w0->h + (size_t)(before->weight - w0->f));
    hb.bias = b0 ? (const float *)(const void *)(b0->h + (size_t)(before->bias - b0->f)) : NULL;
  }
  const int table = l.kind == STAB_KIND_EMBEDDING || l.kind == STAB_KIND_LM_HEAD;
  /* The exact method converts a 16-bit matrix row by row into f64 at every size; the tiles
   * that shapes past WHOLE_CONVERTED exercise are the passes'. There it would add nothing but
   * twelve f64 SVDs of 3000 x 400 by LAPACK, most of this test's time: the smaller shapes
   * check it. */
  const size_t methods_here = (size_t)l.d_in * l.d_out > WHOLE_CONVERTED ? 2 : 3;
  for (size_t mi = 0; mi < methods_here; mi++)
    for (size_t ti = 0; ti < (table ? 3u : 1u); ti++) {
      stab_metrics_params p = stab_metrics_default_params();
      p.spectral.method = methods[mi];
      p.tight = tights[ti];
      stab_metrics mf, mh;
      double hf[16], hh[16];
      char msg[200];
      snprintf(msg, sizeof msg, "%s, %s, tight %s%s", what, method_names[mi], tight_names[ti],
               before ? ", with before" : "");
      TU_ASSERT_OK(stab_layer_metrics(&l, before, &p, &mf, l.heads ? hf : NULL), "%s (f32)", msg);
      TU_ASSERT_OK(stab_layer_metrics(&h, before ? &hb : NULL, &p, &mh, l.heads ? hh : NULL), "%s (16-bit)", msg);
      tu_assert_same_metrics(msg, &mh, &mf);
      ck_assert_msg(isfinite(mf.forward) || (mf.flags & STAB_FLAG_NONFINITE_WEIGHT), "%s: forward %g", msg,
                    mf.forward);
      for (size_t i = 0; i < l.heads; i++) tu_assert_same_double(msg, "head bound", hh[i], hf[i]);
    }
}

static const stab_dtype dtypes[] = {STAB_DTYPE_BF16, STAB_DTYPE_F16};
static const char *const dtype_names[] = {"BF16", "F16"};

/* ---- linear ------------------------------------------------------------------------------ */

/* out-major and in-major, with a bias, with before; shapes around the tile: 3000 x 400 has
 * more than the 2^20 elements converted whole (smaller 16-bit matrices are converted once per
 * estimate), so its passes go through tiles of 8 rows of 3000, a 66-row chunk holding 8 tiles
 * and 2 rows; 320 rows of 100 a tile; 1 row, 1 column */
static const struct {
  size_t d_in, d_out;
  stab_layout layout;
} linear_shapes[] = {
    {3000, 400, STAB_LAYOUT_OUT_MAJOR}, {100, 1000, STAB_LAYOUT_OUT_MAJOR}, {301, 1, STAB_LAYOUT_OUT_MAJOR},
    {1, 45, STAB_LAYOUT_OUT_MAJOR},     {333, 77, STAB_LAYOUT_IN_MAJOR},    {5, 3, STAB_LAYOUT_IN_MAJOR},
};
#define NLINEAR (sizeof linear_shapes / sizeof linear_shapes[0])

START_TEST(test_linear) {
  const size_t s = (size_t)_i / 2;
  const stab_dtype dt = dtypes[_i % 2];
  tu_rng r;
  tu_rng_init(&r, 100 + (uint64_t)_i);
  const size_t d_in = linear_shapes[s].d_in, d_out = linear_shapes[s].d_out, n = d_in * d_out;
  twin w = twin_random(n, dt, 0.02, &r), b = twin_random(d_out, dt, 0.1, &r);
  twin w0 = twin_random(n, dt, 0.02, &r), b0 = twin_random(d_out, dt, 0.1, &r);
  stab_layer l = {.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out,
                  .layout = linear_shapes[s].layout, .weight = w.f, .bias = b.f};
  stab_layer before = l;
  before.weight = w0.f;
  before.bias = b0.f;
  char what[100];
  snprintf(what, sizeof what, "linear %zu x %zu %s, %s", d_in, d_out,
           l.layout == STAB_LAYOUT_IN_MAJOR ? "in-major" : "out-major", dtype_names[_i % 2]);
  check_layer(what, l, &w, &b, NULL, NULL, NULL, NULL);
  check_layer(what, l, &w, &b, NULL, &before, &w0, &b0);
  /* no bias */
  l.bias = NULL;
  before.bias = NULL;
  check_layer(what, l, &w, NULL, NULL, &before, &w0, NULL);
  twin_free(&w), twin_free(&b), twin_free(&w0), twin_free(&b0);
}
END_TEST

/* q, k, v as column blocks of a fused in-major [C][3C] (ld 3C), and row blocks of an out-major
 * [3C][C]: the tile reads cols of each row, from the block's first column */
START_TEST(test_linear_ld_blocks) {
  const stab_dtype dt = dtypes[_i];
  tu_rng r;
  tu_rng_init(&r, 7 + (uint64_t)_i);
  const size_t C = 96;
  twin w = twin_random(3 * C * C, dt, 0.02, &r), b = twin_random(3 * C, dt, 0.1, &r);
  twin w0 = twin_random(3 * C * C, dt, 0.02, &r), b0 = twin_random(3 * C, dt, 0.1, &r);
  for (size_t blk = 0; blk < 3; blk++) {
    char what[100];
    stab_layer l = {.name = "c_attn", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C,
                    .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C, .weight = w.f + blk * C, .bias = b.f + blk * C};
    stab_layer before = l;
    before.weight = w0.f + blk * C;
    before.bias = b0.f + blk * C;
    snprintf(what, sizeof what, "in-major block %zu of [C][3C], %s", blk, dtype_names[_i]);
    check_layer(what, l, &w, &b, NULL, &before, &w0, &b0);
    l.layout = STAB_LAYOUT_OUT_MAJOR;
    l.ld = 0;
    l.weight = w.f + blk * C * C;
    before = l;
    before.weight = w0.f + blk * C * C;
    before.bias = b0.f + blk * C;
    snprintf(what, sizeof what, "out-major block %zu of [3C][C], %s", blk, dtype_names[_i]);
    check_layer(what, l, &w, &b, NULL, &before, &w0, &b0);
  }
  twin_free(&w), twin_free(&b), twin_free(&w0), twin_free(&b0);
}
END_TEST

/* Large enough for a parallel pass: the tiles of two threads must give the bits of one. */
START_TEST(test_threads) {
  tu_rng r;
  tu_rng_init(&r, 3);
  const size_t d_in = 1030, d_out = 1100;
  twin w = twin_random(d_in * d_out, STAB_DTYPE_BF16, 0.02, &r);
  stab_layer l = {.name = "big", .kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out, .weight = w.f};
  stab_layer h = l;
  h.dtype = STAB_DTYPE_BF16;
  h.weight = (const float *)(const void *)w.h;
  stab_metrics_params p = stab_metrics_default_params();
  stab_metrics ref, m;
  TU_ASSERT_OK(stab_layer_metrics(&l, NULL, &p, &ref, NULL), "f32");
  for (int t = 1; t <= 3; t++) {
    p.spectral.threads = t;
    TU_ASSERT_OK(stab_layer_metrics(&h, NULL, &p, &m, NULL), "bf16, %d threads", t);
    char what[40];
    snprintf(what, sizeof what, "bf16, %d threads", t);
    tu_assert_same_metrics(what, &m, &ref);
  }
  twin_free(&w);
}
END_TEST

/* ---- attention --------------------------------------------------------------------------- */

/* heads whose blocks are rows (out-major: rows of 4100, 8 rows a tile, so each 20-row head block
 * holds two tile boundaries and a remainder) or columns (in-major, ld), and a GQA-style head:
 * one query head's block against a key block at another offset */
START_TEST(test_attention) {
  const stab_dtype dt = dtypes[_i];
  tu_rng r;
  tu_rng_init(&r, 11 + (uint64_t)_i);
  const size_t d = 4100, heads = 4, dh = 20, dout = heads * dh;
  twin q = twin_random(dout * d, dt, 0.05, &r), k = twin_random(dout * d, dt, 0.05, &r);
  char what[100];
  stab_layer l = {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = d, .d_out = dout,
                  .layout = STAB_LAYOUT_OUT_MAJOR, .weight = q.f, .weight_k = k.f, .heads = heads};
  snprintf(what, sizeof what, "attention out-major, %zu heads, %s", heads, dtype_names[_i]);
  check_layer(what, l, &q, NULL, &k, NULL, NULL, NULL);
  /* in-major: the same numbers as [d'][ld] with d' = 80 inputs, 5 heads of 40 columns from column 60 */
  stab_layer li = {.name = "attn_in", .kind = STAB_KIND_ATTENTION, .d_in = 80, .d_out = 200,
                   .layout = STAB_LAYOUT_IN_MAJOR, .ld = d, .weight = q.f + 60, .weight_k = k.f + 1000, .heads = 5};
  snprintf(what, sizeof what, "attention in-major block, ld %zu, %s", d, dtype_names[_i]);
  check_layer(what, li, &q, NULL, &k, NULL, NULL, NULL);
  /* one head of 260 rows of 4100 (over 2^20 elements: through the tiles, 8 rows each, a
   * boundary every 8 rows of the head's block and 4 left) */
  twin q1 = twin_random(260 * d, dt, 0.05, &r), k1 = twin_random(260 * d, dt, 0.05, &r);
  stab_layer one = {.name = "attn1", .kind = STAB_KIND_ATTENTION, .d_in = d, .d_out = 260, .weight = q1.f,
                    .weight_k = k1.f, .heads = 1};
  snprintf(what, sizeof what, "attention, one head of 260 rows, %s", dtype_names[_i]);
  check_layer(what, one, &q1, NULL, &k1, NULL, NULL, NULL);
  twin_free(&q1), twin_free(&k1);
  /* GQA: query head 3 against key head 1, one head each */
  stab_layer g = {.name = "gqa", .kind = STAB_KIND_ATTENTION, .d_in = d, .d_out = dh, .weight = q.f + 3 * dh * d,
                  .weight_k = k.f + 1 * dh * d, .heads = 1};
  snprintf(what, sizeof what, "attention GQA head, %s", dtype_names[_i]);
  check_layer(what, g, &q, NULL, &k, NULL, NULL, NULL);
  twin_free(&q), twin_free(&k);
}
END_TEST

/* ---- tables ------------------------------------------------------------------------------ */

/* embedding and lm_head, items as rows (natural) and as columns, with and without before, each
 * tight method; 700 x 50 puts 648-row tiles over a 700-row table, 50 x 700 column items */
START_TEST(test_tables) {
  const stab_dtype dt = dtypes[_i % 2];
  const stab_kind kind = _i / 2 ? STAB_KIND_LM_HEAD : STAB_KIND_EMBEDDING;
  tu_rng r;
  tu_rng_init(&r, 21 + (uint64_t)_i);
  const size_t V = 700, D = 50;
  twin t = twin_random(V * D, dt, 0.02, &r), t0 = twin_random(V * D, dt, 0.02, &r);
  for (int transposed = 0; transposed < 2; transposed++) {
    char what[100];
    stab_layer l = {.name = "table", .kind = kind, .vocab = V, .width = D, .weight = t.f};
    if (transposed) l.layout = kind == STAB_KIND_EMBEDDING ? STAB_LAYOUT_OUT_MAJOR : STAB_LAYOUT_IN_MAJOR;
    stab_layer before = l;
    before.weight = t0.f;
    snprintf(what, sizeof what, "%s %s, %s", stab_kind_name(kind), transposed ? "[d][V]" : "[V][d]",
             dtype_names[_i % 2]);
    check_layer(what, l, &t, NULL, NULL, NULL, NULL, NULL);
    check_layer(what, l, &t, NULL, NULL, &before, &t0, NULL);
  }
  /* one row, one column */
  stab_layer one = {.name = "one", .kind = kind, .vocab = 1, .width = 33, .weight = t.f + 5};
  check_layer("table of 1 row", one, &t, NULL, NULL, NULL, NULL, NULL);
  one.vocab = 33, one.width = 1;
  check_layer("table of width 1", one, &t, NULL, NULL, NULL, NULL, NULL);
  twin_free(&t), twin_free(&t0);
}
END_TEST

/* ---- vectors ----------------------------------------------------------------------------- */

START_TEST(test_vectors) {
  const stab_dtype dt = dtypes[_i % 2];
  const stab_kind kind = _i / 2 ? STAB_KIND_BIAS : STAB_KIND_GAIN;
  tu_rng r;
  tu_rng_init(&r, 31 + (uint64_t)_i);
  const size_t n = 4099;
  twin g = twin_random(n, dt, 1.0, &r), g0 = twin_random(n, dt, 1.0, &r);
  stab_layer l = {.name = "norm", .kind = kind, .d_in = n, .d_out = n, .weight = g.f};
  stab_layer before = l;
  before.weight = g0.f;
  check_layer(stab_kind_name(kind), l, &g, NULL, NULL, NULL, NULL, NULL);
  check_layer(stab_kind_name(kind), l, &g, NULL, NULL, &before, &g0, NULL);
  l.d_in = l.d_out = 1;
  check_layer("vector of 1", l, &g, NULL, NULL, NULL, NULL, NULL);
  twin_free(&g), twin_free(&g0);
}
END_TEST

/* ---- mixed dtypes: a BF16 checkpoint against an F32 (or F16) one ------------------------- */

START_TEST(test_before_in_another_dtype) {
  tu_rng r;
  tu_rng_init(&r, 41);
  const size_t d_in = 200, d_out = 150;
  twin w = twin_random(d_in * d_out, STAB_DTYPE_BF16, 0.02, &r), b = twin_random(d_out, STAB_DTYPE_BF16, 0.1, &r);
  twin w0 = twin_random(d_in * d_out, STAB_DTYPE_F16, 0.02, &r), b0 = twin_random(d_out, STAB_DTYPE_F16, 0.1, &r);
  stab_layer l = {.name = "mix", .kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out, .weight = w.f, .bias = b.f};
  stab_layer before = l;
  before.weight = w0.f, before.bias = b0.f;
  check_layer("BF16 against F16", l, &w, &b, NULL, &before, &w0, &b0);
  /* BF16 against its f32 twin's values as F32: an update of exactly zero */
  stab_layer h = l;
  h.dtype = STAB_DTYPE_BF16;
  h.weight = (const float *)(const void *)w.h;
  h.bias = (const float *)(const void *)b.h;
  stab_layer f32 = l; /* dtype F32 */
  stab_metrics m;
  TU_ASSERT_OK(stab_layer_metrics(&h, &f32, NULL, &m, NULL), "BF16 against F32");
  ck_assert_msg(m.update == 0.0 && m.rel_update == 0.0, "BF16 against its own values as F32: update %g", m.update);
  /* and against a different F32 layer: as the all-f32 measurement */
  stab_metrics ref;
  before = l;
  before.weight = w0.f, before.bias = b0.f; /* F32 */
  TU_ASSERT_OK(stab_layer_metrics(&h, &before, NULL, &m, NULL), "BF16 against F32");
  TU_ASSERT_OK(stab_layer_metrics(&l, &before, NULL, &ref, NULL), "F32 against F32");
  tu_assert_same_metrics("BF16 against F32", &m, &ref);
  twin_free(&w), twin_free(&b), twin_free(&w0), twin_free(&b0);
}
END_TEST

/* ---- NaN and Inf patterns ----------------------------------------------------------------- */

static const uint16_t bad_bf16[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x7f81 /* signalling NaN */};
static const uint16_t bad_f16[] = {0x7e00, 0xfe00, 0x7c00, 0xfc00, 0x7c01};

START_TEST(test_nonfinite) {
  const int use_f16 = _i / 5;
  const stab_dtype dt = use_f16 ? STAB_DTYPE_F16 : STAB_DTYPE_BF16;
  const uint16_t bad = use_f16 ? bad_f16[_i % 5] : bad_bf16[_i % 5];
  tu_rng r;
  tu_rng_init(&r, 51 + (uint64_t)_i);
  const size_t d_in = 64, d_out = 70;
  twin w = twin_random(d_in * d_out, dt, 0.02, &r), w0 = twin_random(d_in * d_out, dt, 0.02, &r);
  twin g = twin_random(d_out, dt, 1.0, &r);
  w.h[d_in * 69 + 63] = bad; /* the last element: the tile's last row */
  w.f[d_in * 69 + 63] = value_of(bad, dt);
  g.h[17] = bad;
  g.f[17] = value_of(bad, dt);
  stab_layer l = {.name = "bad", .kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out, .weight = w.f};
  stab_layer before = l;
  before.weight = w0.f;
  check_layer("non-finite linear", l, &w, NULL, NULL, NULL, NULL, NULL);
  check_layer("non-finite linear", l, &w, NULL, NULL, &before, &w0, NULL);
  stab_layer h = l;
  h.dtype = dt;
  h.weight = (const float *)(const void *)w.h;
  stab_metrics m;
  TU_ASSERT_OK(stab_layer_metrics(&h, NULL, NULL, &m, NULL), "non-finite");
  ck_assert_msg((m.flags & STAB_FLAG_NONFINITE_WEIGHT) && isnan(m.forward), "pattern 0x%04x not flagged", bad);
  /* the update holds it when only before has it */
  stab_layer hb = h;
  hb.weight = (const float *)(const void *)w0.h;
  TU_ASSERT_OK(stab_layer_metrics(&hb, &h, NULL, &m, NULL), "non-finite before");
  ck_assert_msg((m.flags & STAB_FLAG_NONFINITE_UPDATE) && isnan(m.update), "pattern 0x%04x in before not flagged", bad);
  stab_layer gl = {.name = "gain", .kind = STAB_KIND_GAIN, .d_in = d_out, .d_out = d_out, .weight = g.f};
  check_layer("non-finite gain", gl, &g, NULL, NULL, NULL, NULL, NULL);
  stab_layer tl = {.name = "emb", .kind = STAB_KIND_EMBEDDING, .vocab = d_out, .width = d_in, .weight = w.f};
  check_layer("non-finite embedding", tl, &w, NULL, NULL, NULL, NULL, NULL);
  twin_free(&w), twin_free(&w0), twin_free(&g);
}
END_TEST

/* ---- dtypes not read natively ------------------------------------------------------------ */

START_TEST(test_refused_dtypes) {
  static float w[12];
  const stab_dtype refused[] = {STAB_DTYPE_QUANT, STAB_DTYPE_OTHER, (stab_dtype)99};
  stab_metrics m;
  for (size_t i = 0; i < 3; i++) {
    stab_layer l = {.name = "wq", .kind = STAB_KIND_LINEAR, .d_in = 3, .d_out = 4, .weight = w, .dtype = refused[i]};
    ck_assert_int_eq(stab_layer_metrics(&l, NULL, NULL, &m, NULL), STAB_EINVAL);
    ck_assert_msg(strstr(stab_last_error(), "'wq'") && strstr(stab_last_error(), "dtype"), "message: %s",
                  stab_last_error());
    stab_layer ok = l;
    ok.dtype = STAB_DTYPE_BF16;
    ck_assert_int_eq(stab_layer_metrics(&ok, &l, NULL, &m, NULL), STAB_EINVAL);
    ck_assert_msg(strstr(stab_last_error(), "'wq'") && strstr(stab_last_error(), "before"), "message: %s",
                  stab_last_error());
  }
  /* the monitor refuses them as stab_layer_metrics does, and takes F32, F16 and BF16 layers
   * (check_monitor_dtype.c measures them) */
  stab_monitor *mon = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &mon), "monitor");
  for (size_t i = 0; i < 3; i++) {
    stab_layer l = {.name = "wq", .kind = STAB_KIND_LINEAR, .d_in = 3, .d_out = 4, .weight = w, .dtype = refused[i]};
    ck_assert_int_eq(stab_monitor_add_layer(mon, &l, NULL), STAB_EINVAL);
    ck_assert_msg(strstr(stab_last_error(), "'wq'") && strstr(stab_last_error(), "dtype"), "message: %s",
                  stab_last_error());
  }
  const stab_dtype taken[] = {STAB_DTYPE_F32, STAB_DTYPE_F16, STAB_DTYPE_BF16};
  const char *const names[] = {"w32", "w16", "wbf16"};
  for (size_t i = 0; i < 3; i++) {
    stab_layer l = {.name = names[i], .kind = STAB_KIND_LINEAR, .d_in = 3, .d_out = 4, .weight = w, .dtype = taken[i]};
    TU_ASSERT_OK(stab_monitor_add_layer(mon, &l, NULL), "%s", names[i]);
  }
  ck_assert_uint_eq(stab_monitor_layer_count(mon), 3);
  stab_monitor_free(mon);
}
END_TEST

static Suite *layer_dtype_suite(void) {
  Suite *s = suite_create("layer_dtype");
  TCase *tc = tcase_create("bit_identical");
  tcase_set_timeout(tc, 0);
  tcase_add_loop_test(tc, test_linear, 0, 2 * (int)NLINEAR);
  tcase_add_loop_test(tc, test_linear_ld_blocks, 0, 2);
  tcase_add_test(tc, test_threads);
  tcase_add_loop_test(tc, test_attention, 0, 2);
  tcase_add_loop_test(tc, test_tables, 0, 4);
  tcase_add_loop_test(tc, test_vectors, 0, 4);
  tcase_add_test(tc, test_before_in_another_dtype);
  tcase_add_loop_test(tc, test_nonfinite, 0, 10);
  tcase_add_test(tc, test_refused_dtypes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(layer_dtype_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
