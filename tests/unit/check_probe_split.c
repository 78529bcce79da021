/* check_probe_split.c — a GGUF model split as llama.cpp's gguf-split splits it (files
 * PREFIX-0000k-of-0000N.gguf; metadata split.no, split.count, split.tensors.count in every shard,
 * the model's own in the first) is probed as the whole model: from any shard or the folder, the
 * same rows and values, bit for bit, as the same model written as one file, and the real output
 * head (in the last shard) is the head, never a tied one invented from the first shard's token
 * table. A missing shard, a renamed one, disagreeing counts and a tensor in two shards are
 * refused naming the file. The split is written by the tests' own GGUF writer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[512];
static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

enum { D = 16, V = 40, FF = 24, NT = 12 };

typedef struct {
  const char *name;
  uint64_t ne[2]; /* ne[0] fastest */
  uint32_t nd;
  float *data;
} tensor;

static tensor model[NT];

static void make_model(void) {
  static const struct { const char *name; uint64_t ne0, ne1; uint32_t nd; } shapes[NT] = {
      {"token_embd.weight", D, V, 2},       {"blk.0.attn_norm.weight", D, 1, 1},
      {"blk.0.attn_q.weight", D, D, 2},     {"blk.0.attn_k.weight", D, D, 2},
      {"blk.0.attn_v.weight", D, D, 2},     {"blk.0.attn_output.weight", D, D, 2},
      {"blk.0.ffn_norm.weight", D, 1, 1},   {"blk.0.ffn_gate.weight", D, FF, 2},
      {"blk.0.ffn_up.weight", D, FF, 2},    {"blk.0.ffn_down.weight", FF, D, 2},
      {"output_norm.weight", D, 1, 1},      {"output.weight", D, V, 2},
  };
  if (model[0].data) return;
  tu_rng r;
  tu_rng_init(&r, 29);
  for (int i = 0; i < NT; i++) {
    model[i].name = shapes[i].name, model[i].nd = shapes[i].nd;
    model[i].ne[0] = shapes[i].ne0, model[i].ne[1] = shapes[i].ne1;
    size_t n = (size_t)(shapes[i].ne0 * shapes[i].ne1);
    model[i].data = tu_floats(n);
    /* the head 3x the table's scale: a tied head would report other numbers */
    double sd = !strcmp(shapes[i].name, "output.weight") ? 3.0 : 1.0;
    for (size_t k = 0; k < n; k++) model[i].data[k] = (float)(sd * tu_rng_gauss(&r));
  }
}

static void model_metadata(gw_file *f) {
  gw_kv_str(f, "general.architecture", "llama");
  gw_kv_u32(f, "llama.attention.head_count", 2);
  gw_kv_u32(f, "llama.attention.head_count_kv", 2);
  gw_kv_u32(f, "llama.embedding_length", D);
  gw_kv_u32(f, "llama.block_count", 1);
}

static void add_tensor(gw_file *f, int i) {
  const tensor *t = &model[i];
  gw_tensor(f, t->name, t->nd, t->ne, GW_F32, t->data, (size_t)(t->ne[0] * t->ne[1]) * sizeof(float));
}

/* The whole model as one file. */
static void write_whole(const char *path) {
  gw_file f;
  gw_init(&f);
  model_metadata(&f);
  for (int i = 0; i < NT; i++) add_tensor(&f, i);
  ck_assert_int_eq(gw_write(&f, path), 0);
}

/* Shard k of n (0-based) holding tensors [lo, hi), named PREFIX-0000k-of-0000n.gguf in dir, as
 * gguf-split writes it: the model's metadata in the first shard only, the split keys in every one
 * (split.no, split.count as uint16, split.tensors.count as int32). */
static void write_shard(const char *path, int k, int n, int lo, int hi, int32_t said_tensors) {
  gw_file f;
  gw_init(&f);
  if (k == 0) model_metadata(&f);
  gw_kv_u16(&f, "split.no", (uint16_t)k);
  gw_kv_u16(&f, "split.count", (uint16_t)n);
  gw_kv_i32(&f, "split.tensors.count", said_tensors);
  for (int i = lo; i < hi; i++) add_tensor(&f, i);
  ck_assert_int_eq(gw_write(&f, path), 0);
}

/* The split of the issue: shard 1 holds only token_embd, shard 3 the real head. */
static void write_split(const char *dir) {
  char p[1024];
  static const int cut[4] = {0, 1, 8, NT};
  for (int k = 0; k < 3; k++) {
    snprintf(p, sizeof p, "%s/m-%05d-of-%05d.gguf", dir, k + 1, 3);
    write_shard(p, k, 3, cut[k], cut[k + 1], NT);
  }
}

static stab_probe *open_measured(const char *path) {
  stab_probe_params pp = stab_probe_default_params();
  pp.exact = 1;
  stab_probe *p = NULL;
  stab_status st = stab_probe_open(path, &pp, &p);
  ck_assert_msg(st == STAB_OK, "%s: %s", path, stab_last_error());
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  return p;
}

static int same(double a, double b) { return (isnan(a) && isnan(b)) || a == b; }

/* Every row of b is a's, in a's order, with a's values bit for bit. */
static void same_rows(stab_probe *a, stab_probe *b, const char *what) {
  ck_assert_msg(stab_probe_count(a) == stab_probe_count(b), "%s: %zu rows, the whole file %zu", what,
                stab_probe_count(b), stab_probe_count(a));
  for (size_t i = 0; i < stab_probe_count(a); i++) {
    stab_probe_row x, y;
    ck_assert_int_eq(stab_probe_row_at(a, i, &x), STAB_OK);
    ck_assert_int_eq(stab_probe_row_at(b, i, &y), STAB_OK);
    ck_assert_msg(!strcmp(x.name, y.name), "%s row %zu: %s, the whole file %s", what, i, y.name, x.name);
    ck_assert_int_eq(x.kind, y.kind);
    ck_assert_int_eq(x.tied, y.tied);
    ck_assert_msg(same(x.metrics.forward, y.metrics.forward) && same(x.metrics.dependency, y.metrics.dependency) &&
                      same(x.metrics.sigma, y.metrics.sigma),
                  "%s %s: forward %.17g, the whole file %.17g", what, x.name, y.metrics.forward, x.metrics.forward);
  }
}

/* The row named name, or fails. */
static stab_probe_row row_named(stab_probe *p, const char *name) {
  stab_probe_row r;
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    if (!strcmp(r.name, name)) return r;
  }
  ck_abort_msg("no row %s", name);
  return r;
}

START_TEST(split_is_the_whole_model) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_split");
  make_model();
  char whole[1024], dir[1024], p[1024];
  snprintf(whole, sizeof whole, "%s", tmp_path("whole.gguf"));
  snprintf(dir, sizeof dir, "%s", tmp_path("split"));
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  write_whole(whole);
  write_split(dir);
  stab_probe *w = open_measured(whole);
  stab_probe_row head = row_named(w, "output");
  ck_assert_int_eq(head.kind, STAB_KIND_LM_HEAD);
  ck_assert_int_eq(head.tied, 0);
  for (int k = 1; k <= 3; k++) {
    snprintf(p, sizeof p, "%s/m-%05d-of-00003.gguf", dir, k);
    stab_probe *s = open_measured(p);
    same_rows(w, s, p);
    /* the real head, from the last shard: not the first shard's table again */
    stab_probe_row h = row_named(s, "output");
    ck_assert_int_eq(h.tied, 0);
    ck_assert_str_eq(h.tensor, "output.weight");
    stab_probe_free(s);
  }
  stab_probe *s = open_measured(dir);
  same_rows(w, s, dir);
  stab_probe_free(s);
  stab_probe_free(w);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* stab_probe_open fails with status want and a message holding every string of must. */
static void refused(const char *path, stab_status want, const char *const *must) {
  stab_probe_params pp = stab_probe_default_params();
  stab_probe *p = NULL;
  stab_status st = stab_probe_open(path, &pp, &p);
  ck_assert_msg(st == want, "%s: status %d, want %d (%s)", path, st, want, st ? stab_last_error() : "opened");
  ck_assert_ptr_null(p);
  for (size_t i = 0; must[i]; i++)
    ck_assert_msg(strstr(stab_last_error(), must[i]), "%s: '%s' lacks '%s'", path, stab_last_error(), must[i]);
}

START_TEST(split_refusals) {
  tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_split");
  make_model();
  char dir[1024], p[1024], q[1024];
  snprintf(dir, sizeof dir, "%s", tmp_path("bad"));
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  write_split(dir);
  /* a missing shard: named, from any other shard and from the folder */
  snprintf(p, sizeof p, "%s/m-00003-of-00003.gguf", dir);
  snprintf(q, sizeof q, "%s/moved.bin", dir);
  ck_assert_int_eq(rename(p, q), 0);
  snprintf(p, sizeof p, "%s/m-00001-of-00003.gguf", dir);
  refused(p, STAB_ENOTFOUND, (const char *const[]){"m-00003-of-00003.gguf", "missing", "shard 3 of 3", NULL});
  refused(dir, STAB_ENOTFOUND, (const char *const[]){"m-00003-of-00003.gguf", "missing", NULL});
  /* a shard renamed: its siblings cannot be found, said rather than read alone */
  snprintf(p, sizeof p, "%s/m-00003-of-00003.gguf", dir);
  ck_assert_int_eq(rename(q, p), 0);
  snprintf(p, sizeof p, "%s/m-00002-of-00003.gguf", dir);
  snprintf(q, sizeof q, "%s/renamed.gguf", dir);
  ck_assert_int_eq(rename(p, q), 0);
  refused(q, STAB_EFORMAT, (const char *const[]){"renamed.gguf", "split GGUF", "-00002-of-00003.gguf", NULL});
  ck_assert_int_eq(rename(q, p), 0);
  /* split.tensors.count that is not what the shards hold */
  snprintf(p, sizeof p, "%s/m-00002-of-00003.gguf", dir);
  write_shard(p, 1, 3, 1, 8, NT + 1);
  snprintf(p, sizeof p, "%s/m-00001-of-00003.gguf", dir);
  refused(p, STAB_EFORMAT, (const char *const[]){"split.tensors.count", "m-00002-of-00003.gguf", NULL});
  /* a tensor in two shards */
  snprintf(p, sizeof p, "%s/m-00002-of-00003.gguf", dir);
  write_shard(p, 1, 3, 0, 8, NT);
  snprintf(p, sizeof p, "%s/m-00003-of-00003.gguf", dir);
  refused(p, STAB_EFORMAT, (const char *const[]){"token_embd.weight", "m-00001-of-00003.gguf", "m-00002-of-00003.gguf", NULL});
  /* a shard whose split.no is not its name's */
  write_shard(p, 1, 3, 8, NT, NT);
  snprintf(p, sizeof p, "%s/m-00001-of-00003.gguf", dir);
  refused(p, STAB_EFORMAT, (const char *const[]){"split.no", NULL});
  tu_tmpdir_remove(tmpdir);
}
END_TEST

static Suite *split_suite(void) {
  Suite *s = suite_create("probe_split");
  TCase *tc = tcase_create("split");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, split_is_the_whole_model);
  tcase_add_test(tc, split_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(split_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
