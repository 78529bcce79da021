/* check_probe_moe.c — the probe on mixtures of experts, against independent references: a GGUF
 * ffn_*_exps tensor [n_expert][rows][cols] (F32 and Q4_K) and Mixtral-named per-expert
 * safetensors, each expert's metrics equal to those of its slice written as a 2-D tensor of a
 * file of its own (and its sigma to LAPACK's in f64), the layer's row the worst expert per
 * metric with its index, --experts rows, --prev per expert, and a 3-D tensor that is no expert
 * tensor listed with its reason. The probe runs as a program (builddir/harness/probe). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[512];

/* The probe's stdout for args (a shell word list), which must exit 0. Static, overwritten. */
static const char *probe(const char *args) {
  static char out[1 << 18];
  const char *bd = getenv("builddir");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s/harness/probe --quiet --json --exact %s", bd ? bd : ".", args);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t len = fread(out, 1, sizeof out - 1, p);
  out[len] = '\0';
  ck_assert_msg(pclose(p) == 0, "%s failed: %s", cmd, out);
  return out;
}

/* The JSON object of the layer named name in a report, NULL when there is none. The probe writes
 * one layer per line, "name" first. */
static const char *layer(const char *report, const char *name) {
  char pat[600];
  snprintf(pat, sizeof pat, "\n  {\"name\": \"%s\",", name);
  const char *p = strstr(report, pat);
  return p ? p + 3 : NULL;
}

/* The number after "key": in the layer's line (NaN for null or absent). */
static double num(const char *row, const char *key) {
  char pat[100];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *end = strchr(row, '\n'), *p = strstr(row, pat);
  if (!p || (end && p > end)) return NAN;
  p += strlen(pat);
  return strncmp(p, "null", 4) ? strtod(p, NULL) : NAN;
}

/* The metrics compared between an expert and its own 2-D file: every number a linear layer has. */
static const char *const linear_keys[] = {"forward", "dependency", "update", "sigma", "rel_update", NULL};

static void same_metrics(const char *a, const char *b, const char *what) {
  for (size_t k = 0; linear_keys[k]; k++) {
    double x = num(a, linear_keys[k]), y = num(b, linear_keys[k]);
    ck_assert_msg((isnan(x) && isnan(y)) || x == y, "%s %s: %.17g, its own file %.17g", what, linear_keys[k], x, y);
  }
}

/* The layer row's worst expert per metric is the expert rows' argmax, its value their max. */
static void worst_is_argmax(const char *report, const char *layer_name, const char *expert_fmt, size_t n) {
  const char *g = layer(report, layer_name);
  ck_assert_msg(g != NULL, "no row %s", layer_name);
  ck_assert_uint_eq((size_t)num(g, "experts"), n);
  const char *w = strstr(g, "\"worst_expert\": {");
  ck_assert_ptr_nonnull(w);
  for (size_t k = 0; linear_keys[k]; k++) {
    double best = NAN;
    size_t arg = 0;
    for (size_t x = 0; x < n; x++) {
      char nm[300];
      snprintf(nm, sizeof nm, expert_fmt, x);
      const char *e = layer(report, nm);
      ck_assert_msg(e != NULL, "no row %s", nm);
      double v = num(e, linear_keys[k]);
      if (!isnan(v) && (isnan(best) || v > best)) best = v, arg = x;
    }
    double got = num(g, linear_keys[k]), idx = num(w, linear_keys[k]);
    ck_assert_msg((isnan(best) && isnan(got)) || got == best, "%s %s: %.17g, worst expert's %.17g", layer_name,
                  linear_keys[k], got, best);
    if (!isnan(best)) ck_assert_msg(idx == (double)arg, "%s worst %s expert %g, want %zu", layer_name, linear_keys[k], idx, arg);
    else ck_assert_msg(isnan(idx), "%s worst %s: %g for no value", layer_name, linear_keys[k], idx);
  }
}

enum { E = 3, ROWS = 12, COLS = 20 };

/* E slices of ROWS x COLS, expert x scaled by scale[x]; a second set perturbed as the --prev. */
static void fill_experts(float *w, float *prev, uint64_t seed) {
  tu_rng r;
  tu_rng_init(&r, seed);
  static const double scale[E] = {1.0, 3.0, 0.5};
  for (size_t x = 0; x < E; x++) {
    tu_fill_gauss(w + x * ROWS * COLS, ROWS, COLS, COLS, 0.1 * scale[x], &r);
    for (size_t i = 0; i < ROWS * COLS; i++)
      prev[x * ROWS * COLS + i] = w[x * ROWS * COLS + i] + (float)(0.01 * (double)(x + 1) * tu_rng_gauss(&r));
  }
  /* expert 2 is the worst update by far, expert 1 the worst forward */
  for (size_t i = 0; i < ROWS * COLS; i++) prev[2 * ROWS * COLS + i] = w[2 * ROWS * COLS + i] + (float)(0.2 * tu_rng_gauss(&r));
}

static void write_gguf_experts(const char *path, const float *w) {
  gw_file g;
  gw_init(&g);
  gw_kv_str(&g, "general.architecture", "llama");
  gw_tensor(&g, "blk.0.ffn_gate_inp.weight", 2, (uint64_t[]){COLS, E}, GW_F32, w, COLS * E * sizeof *w);
  gw_tensor(&g, "blk.0.ffn_up_exps.weight", 3, (uint64_t[]){COLS, ROWS, E}, GW_F32, w, E * ROWS * COLS * sizeof *w);
  gw_tensor(&g, "blk.0.conv.weight", 3, (uint64_t[]){COLS, ROWS, E}, GW_F32, w, E * ROWS * COLS * sizeof *w);
  ck_assert_int_eq(gw_write(&g, path), 0);
}

static void write_gguf_slice(const char *path, const float *w) {
  gw_file g;
  gw_init(&g);
  gw_kv_str(&g, "general.architecture", "llama");
  gw_tensor(&g, "blk.0.ffn_up.weight", 2, (uint64_t[]){COLS, ROWS}, GW_F32, w, ROWS * COLS * sizeof *w);
  ck_assert_int_eq(gw_write(&g, path), 0);
}

START_TEST(test_gguf_f32_experts) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_moe");
  float *w = tu_floats(E * ROWS * COLS), *prev = tu_floats(E * ROWS * COLS);
  fill_experts(w, prev, 41);
  char moe[600], moe_prev[600];
  snprintf(moe, sizeof moe, "%s", tu_path_in(tmpdir, "moe.gguf"));
  snprintf(moe_prev, sizeof moe_prev, "%s", tu_path_in(tmpdir, "moe.prev.gguf"));
  write_gguf_experts(moe, w);
  write_gguf_experts(moe_prev, prev);
  char args[2048];
  snprintf(args, sizeof args, "--experts --prev '%s' '%s'", moe_prev, moe);
  char *report = strdup(probe(args));
  /* each expert: the metrics of its slice as a file of its own, the sigma LAPACK's */
  for (size_t x = 0; x < E; x++) {
    char one[600], one_prev[600], nm[64];
    snprintf(one, sizeof one, "%s", tu_path_in(tmpdir, "one.gguf"));
    snprintf(one_prev, sizeof one_prev, "%s", tu_path_in(tmpdir, "one.prev.gguf"));
    write_gguf_slice(one, w + x * ROWS * COLS);
    write_gguf_slice(one_prev, prev + x * ROWS * COLS);
    snprintf(args, sizeof args, "--prev '%s' '%s'", one_prev, one);
    const char *ref = layer(probe(args), "blk.0.ffn_up");
    ck_assert_ptr_nonnull(ref);
    snprintf(nm, sizeof nm, "blk.0.ffn_up_exps.%zu", x);
    const char *got = layer(report, nm);
    ck_assert_msg(got != NULL, "no row %s in %s", nm, report);
    same_metrics(got, ref, nm);
    double sigma = num(got, "sigma"), want = ref_sigma(w + x * ROWS * COLS, ROWS, COLS, COLS);
    ck_assert_msg(fabs(sigma - want) <= 1e-9 * want, "%s sigma %.17g, LAPACK %.17g", nm, sigma, want);
    ck_assert_uint_eq((size_t)num(got, "expert"), x);
    ck_assert_ptr_nonnull(strstr(got, "\"expert_of\": \"blk.0.ffn_up_exps\""));
    ck_assert_ptr_nonnull(strstr(got, "\"shape\": [12, 20]"));
  }
  worst_is_argmax(report, "blk.0.ffn_up_exps", "blk.0.ffn_up_exps.%zu", E);
  const char *g = layer(report, "blk.0.ffn_up_exps");
  ck_assert_ptr_nonnull(strstr(g, "\"worst_expert\": {\"forward\": 1, "));
  ck_assert_ptr_nonnull(strstr(g, "\"update\": 2, "));
  ck_assert_ptr_nonnull(strstr(g, "\"shape\": [3, 12, 20]"));
  /* the summary names the layer and its worst expert */
  ck_assert_ptr_nonnull(strstr(report, "\"update\": {\"layer\": \"blk.0.ffn_up_exps\""));
  ck_assert_ptr_nonnull(strstr(report, "\"unit\": \"1\", \"expert\": 2}"));
  /* the router is a linear layer; a 3-D tensor that is no expert tensor says so */
  const char *router = layer(report, "blk.0.ffn_gate_inp");
  ck_assert_ptr_nonnull(router);
  ck_assert_ptr_nonnull(strstr(router, "\"kind\": \"linear\""));
  ck_assert_ptr_nonnull(strstr(report, "{\"name\": \"blk.0.conv.weight\", \"message\": \"a 3-D tensor that is not an "
                                       "expert tensor by name (*_exps): no rule for it\"}"));
  free(report);
  /* without --experts: the layer's row alone, the same numbers */
  snprintf(args, sizeof args, "--prev '%s' '%s'", moe_prev, moe);
  report = strdup(probe(args));
  ck_assert_ptr_null(layer(report, "blk.0.ffn_up_exps.0"));
  ck_assert_ptr_nonnull(layer(report, "blk.0.ffn_up_exps"));
  ck_assert_ptr_null(strstr(report, "\"expert_of\""));
  free(report);
  /* the table: the layer's row says its worst experts; --experts adds a row per expert */
  const char *bd = getenv("builddir");
  char cmd[2048], line[1024];
  snprintf(cmd, sizeof cmd, "%s/harness/probe --quiet --experts --prev '%s' '%s'", bd ? bd : ".", moe_prev, moe);
  FILE *p = popen(cmd, "r");
  int layer_line = 0, expert_lines = 0, summary = 0;
  while (fgets(line, sizeof line, p)) {
    layer_line |= !strncmp(line, "blk.0.ffn_up_exps ", 18) && strstr(line, "3x12x20") &&
                  strstr(line, "3 experts, worst: forward 1") && strstr(line, "update 2");
    expert_lines += !strncmp(line, "blk.0.ffn_up_exps.", 18) && strstr(line, "12x20") && strstr(line, "of blk.0.ffn_up_exps");
    summary |= strstr(line, "update") && strstr(line, "blk.0.ffn_up_exps (expert 2)") != NULL;
  }
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(layer_line && expert_lines == E && summary, "table: layer %d experts %d summary %d", layer_line,
                expert_lines, summary);
  /* --hdf5: each expert a layer of the trace (as a trainer registers them), the layer of experts
   * none (it is the report's summary of them) */
  snprintf(cmd, sizeof cmd, "%s/harness/probe --quiet --hdf5 '%s' --step 3 '%s' >/dev/null && %s/harness/export '%s'",
           bd ? bd : ".", tu_path_in(tmpdir, "t.h5"), moe, bd ? bd : ".", tu_path_in(tmpdir, "t.h5"));
  p = popen(cmd, "r");
  int experts_forward = 0, group_rows = 0, router_row = 0;
  while (fgets(line, sizeof line, p)) {
    experts_forward += !strncmp(line, "3,blk.0.ffn_up_exps.", 20) && strstr(line, ",linear,forward,");
    group_rows += !strncmp(line, "3,blk.0.ffn_up_exps,", 20);
    router_row |= !strncmp(line, "3,blk.0.ffn_gate_inp,linear,", 28);
  }
  ck_assert_int_eq(pclose(p), 0);
  ck_assert_msg(experts_forward == E && !group_rows && router_row, "trace: %d experts' forward, %d rows of the layer, router %d",
                experts_forward, group_rows, router_row);
  free(w), free(prev);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* A Q4_K block (256 elements, 144 bytes) with sane scales: d, dmin as f16, random 6-bit scales
 * and minimums, random quants. */
static void q4k_block(unsigned char *b, tu_rng *r, double d) {
  uint16_t hd = stw_f16((float)d), hm = stw_f16((float)(d / 4));
  memcpy(b, &hd, 2), memcpy(b + 2, &hm, 2);
  for (size_t i = 4; i < 144; i++) b[i] = (unsigned char)(tu_rng_u64(r) & 0xff);
}

/* Quantized experts: each read through stab_ckpt_read_f32 with its own range, and measured as
 * the same bytes in a 2-D file of their own. */
START_TEST(test_gguf_q4k_experts) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_moe");
  enum { QE = 2, QR = 4, QC = 512, BLOCKS = QR * QC / 256, BYTES = BLOCKS * 144 };
  unsigned char *q = malloc(QE * BYTES);
  tu_rng r;
  tu_rng_init(&r, 7);
  for (size_t x = 0; x < QE; x++)
    for (size_t b = 0; b < BLOCKS; b++) q4k_block(q + x * BYTES + b * 144, &r, x ? 0.02 : 0.005);
  char moe[600];
  snprintf(moe, sizeof moe, "%s", tu_path_in(tmpdir, "q.gguf"));
  gw_file g;
  gw_init(&g);
  gw_tensor(&g, "blk.3.ffn_down_exps.weight", 3, (uint64_t[]){QC, QR, QE}, GW_Q4_K, q, QE * BYTES);
  ck_assert_int_eq(gw_write(&g, moe), 0);
  char args[1024];
  snprintf(args, sizeof args, "--experts '%s'", moe);
  char *report = strdup(probe(args));
  stab_gguf *f;
  TU_ASSERT_OK(stab_gguf_open(moe, &f));
  const stab_ckpt_tensor *t3 = stab_gguf_tensor(f, 0);
  float *all = tu_floats(QE * QR * QC), *one = tu_floats(QR * QC);
  TU_ASSERT_OK(stab_ckpt_read_f32(t3, 0, QE * QR * QC, all));
  for (size_t x = 0; x < QE; x++) {
    /* the library's view of the slice reads what a range of the 3-D tensor reads */
    stab_ckpt_tensor v;
    TU_ASSERT_OK(stab_model_expert_view(t3, x, &v));
    TU_ASSERT_OK(stab_ckpt_read_f32(&v, 0, QR * QC, one));
    ck_assert_msg(!memcmp(one, all + x * QR * QC, QR * QC * sizeof *one), "expert %zu's view reads other values", x);
    TU_ASSERT_OK(stab_ckpt_read_f32(t3, x * QR * QC + 300, 100, one));
    ck_assert(!memcmp(one, all + x * QR * QC + 300, 100 * sizeof *one));
    char path[600], nm[64];
    snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "q1.gguf"));
    gw_init(&g);
    gw_tensor(&g, "blk.3.ffn_down.weight", 2, (uint64_t[]){QC, QR}, GW_Q4_K, q + x * BYTES, BYTES);
    ck_assert_int_eq(gw_write(&g, path), 0);
    snprintf(args, sizeof args, "'%s'", path);
    const char *ref = layer(probe(args), "blk.3.ffn_down");
    snprintf(nm, sizeof nm, "blk.3.ffn_down_exps.%zu", x);
    const char *got = layer(report, nm);
    ck_assert_msg(ref && got, "%s: rows %p %p", nm, (const void *)ref, (const void *)got);
    same_metrics(got, ref, nm);
    ck_assert_ptr_nonnull(strstr(got, "\"dtype\": \"Q4_K\""));
    double want = ref_sigma(all + x * QR * QC, QR, QC, QC);
    ck_assert_msg(fabs(num(got, "sigma") - want) <= 1e-9 * want, "%s sigma %.17g LAPACK %.17g", nm, num(got, "sigma"), want);
  }
  worst_is_argmax(report, "blk.3.ffn_down_exps", "blk.3.ffn_down_exps.%zu", QE);
  stab_ckpt_tensor v;
  TU_ASSERT_STATUS(stab_model_expert_view(t3, QE, &v), STAB_EINVAL);
  stab_gguf_close(f);
  free(all), free(one), free(q), free(report);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* Mixtral's per-expert tensors in safetensors: one layer per projection and block, the worst
 * expert by name's index, every expert's sigma LAPACK's. */
START_TEST(test_hf_mixtral_experts) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_moe");
  float *w = tu_floats(E * ROWS * COLS), *prev = tu_floats(E * ROWS * COLS), *router = tu_floats(E * COLS);
  fill_experts(w, prev, 5);
  tu_rng r;
  tu_rng_init(&r, 9);
  tu_fill_gauss(router, E, COLS, COLS, 0.1, &r);
  stw_tensor t[E + 1];
  char names[E][96];
  t[0] = (stw_tensor){"model.layers.0.block_sparse_moe.gate.weight", "F32", 2, {E, COLS}, router, E * COLS * 4};
  for (size_t x = 0; x < E; x++) {
    /* experts in the file's order 2, 0, 1: the index is the name's */
    size_t id = (x + 2) % E;
    snprintf(names[x], sizeof names[x], "model.layers.0.block_sparse_moe.experts.%zu.w1.weight", id);
    t[x + 1] = (stw_tensor){names[x], "F32", 2, {ROWS, COLS}, w + id * ROWS * COLS, ROWS * COLS * 4};
  }
  char path[600];
  snprintf(path, sizeof path, "%s", tu_path_in(tmpdir, "mixtral.safetensors"));
  ck_assert_int_eq(stw_write(path, t, E + 1, NULL), 0);
  char args[1024];
  snprintf(args, sizeof args, "--experts '%s'", path);
  char *report = strdup(probe(args));
  worst_is_argmax(report, "model.layers.0.block_sparse_moe.experts.w1", "model.layers.0.block_sparse_moe.experts.%zu.w1", E);
  const char *g = layer(report, "model.layers.0.block_sparse_moe.experts.w1");
  ck_assert_ptr_nonnull(strstr(g, "\"worst_expert\": {\"forward\": 1, "));
  ck_assert_ptr_nonnull(strstr(g, "\"shape\": [3, 12, 20]"));
  for (size_t id = 0; id < E; id++) {
    char nm[96];
    snprintf(nm, sizeof nm, "model.layers.0.block_sparse_moe.experts.%zu.w1", id);
    const char *e = layer(report, nm);
    ck_assert_ptr_nonnull(e);
    double want = ref_sigma(w + id * ROWS * COLS, ROWS, COLS, COLS);
    ck_assert_msg(fabs(num(e, "sigma") - want) <= 1e-9 * want, "%s sigma %.17g LAPACK %.17g", nm, num(e, "sigma"), want);
  }
  const char *rt = layer(report, "model.layers.0.block_sparse_moe.gate");
  ck_assert_ptr_nonnull(rt);
  ck_assert_ptr_nonnull(strstr(rt, "\"kind\": \"linear\""));
  ck_assert_uint_eq((size_t)num(rt, "d_out"), E);
  free(report);
  /* --prev without expert 2: the warning counts layers as the report shows them (the router and
   * the layer of experts: 2), the layer of experts the one without an update, and no ratio
   * warning (the --prev file is the ratios' reference, its layers named already) */
  char prev_path[600], err_path[600], cmd[4096], err[4096] = "";
  snprintf(prev_path, sizeof prev_path, "%s", tu_path_in(tmpdir, "mixtral.prev.safetensors"));
  snprintf(err_path, sizeof err_path, "%s", tu_path_in(tmpdir, "err.txt"));
  for (size_t x = 0; x < E; x++) t[x + 1].data = prev + ((x + 2) % E) * ROWS * COLS;
  ck_assert_int_eq(stw_write(prev_path, t, E, NULL), 0); /* the last, expert 1, left out */
  const char *bd = getenv("builddir");
  snprintf(cmd, sizeof cmd, "%s/harness/probe --quiet --json --exact --prev '%s' '%s' 2>'%s'", bd ? bd : ".", prev_path,
           path, err_path);
  FILE *pp = popen(cmd, "r");
  static char out[1 << 18];
  size_t len = fread(out, 1, sizeof out - 1, pp);
  out[len] = '\0';
  ck_assert_int_eq(pclose(pp), 0);
  FILE *ef = fopen(err_path, "r");
  ck_assert_ptr_nonnull(ef);
  err[fread(err, 1, sizeof err - 1, ef)] = '\0';
  fclose(ef);
  ck_assert_msg(strstr(err, "warning: --prev ") &&
                    strstr(err, ": 1 of 2 layers have no counterpart there, so no update: "
                                "model.layers.0.block_sparse_moe.experts.w1\n"),
                "the update warning: %s", err);
  ck_assert_msg(!strstr(err, "no ratio"), "a ratio warning: %s", err);
  const char *gl = layer(out, "model.layers.0.block_sparse_moe.experts.w1"), *gr = layer(out, "model.layers.0.block_sparse_moe.gate");
  ck_assert_ptr_nonnull(gl);
  ck_assert_ptr_nonnull(gr);
  ck_assert_msg(isnan(num(gl, "update")) && isfinite(num(gr, "update")), "updates: layer of experts %g, router %g",
                num(gl, "update"), num(gr, "update"));
  free(w), free(prev), free(router);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("probe_moe");
  TCase *tc = tcase_create("experts");
  tcase_set_timeout(tc, 0);
  tcase_add_test(tc, test_gguf_f32_experts);
  tcase_add_test(tc, test_gguf_q4k_experts);
  tcase_add_test(tc, test_hf_mixtral_experts);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
