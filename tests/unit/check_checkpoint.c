/* check_checkpoint.c — the checkpoint handle (stab_checkpoint_*, lib/checkpoint/checkpoint.c):
 * every path the probe takes opened through it — a safetensors file, a Hugging Face folder and
 * its index (sharded), a GGUF file, a split GGUF model from a shard and from its folder, an
 * llm.c checkpoint — its tensors, names and rows checked against the format's own reader and
 * against the values the test wrote; the files it spans; and its errors, each named. The files
 * are written by the tests' own writers (st_writer, gguf_writer), which share no code with the
 * readers. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[512];
static const char *at(const char *name) { return tu_path_in(tmpdir, name); }

/* The value every test file holds at element k of the tensor numbered t: exact in f32 and
 * bf16 (a multiple of 1/8 below 64), so that a wrong tensor or a wrong offset shows. */
static float value(int t, size_t k) { return (float)(t * 4 + (int)(k % 13)) * 0.125f - 2.0f; }

enum { R = 6, C = 4 }; /* each tensor R x C */

static void fill(int t, float *x) {
  for (size_t k = 0; k < R * C; k++) x[k] = value(t, k);
}

/* Opens path through the handle, or fails naming the error. */
static stab_checkpoint *open_ok(const char *path) {
  stab_checkpoint *c = NULL;
  stab_status st = stab_checkpoint_open(path, &c);
  ck_assert_msg(st == STAB_OK && c, "%s: %d %s", path, st, stab_last_error());
  return c;
}

/* Tensor name of c holds tensor t's values (read through the handle, whole and two rows from
 * row 2), and find gives its index. */
static void has_values(const stab_checkpoint *c, const char *name, int t) {
  size_t i = SIZE_MAX;
  ck_assert_msg(stab_checkpoint_find(c, name, &i) == STAB_OK, "find %s: %s", name, stab_last_error());
  const stab_ckpt_tensor *x = stab_checkpoint_tensor(c, i);
  ck_assert_ptr_nonnull(x);
  ck_assert_str_eq(x->name, name);
  ck_assert_uint_eq(x->count, R * C);
  float got[R * C];
  TU_ASSERT_OK(stab_checkpoint_read_f32(c, i, 0, R * C, got), "%s", name);
  for (size_t k = 0; k < R * C; k++)
    ck_assert_msg(got[k] == value(t, k), "%s[%zu] = %g, written %g", name, k, got[k], value(t, k));
  float rows[2 * C];
  TU_ASSERT_OK(stab_checkpoint_read_f32(c, i, 2 * C, 2 * C, rows), "%s rows 2-3", name);
  for (size_t k = 0; k < 2 * C; k++) ck_assert(rows[k] == value(t, 2 * C + k));
}

/* Every tensor of c is, by name and bytes, the tensor of the same index the format's reader
 * gives (count/tensor(i) of the reader, passed as the list). */
static void same_as_reader(const stab_checkpoint *c, const stab_ckpt_tensor *const *want, size_t n) {
  ck_assert_uint_eq(stab_checkpoint_count(c), n);
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *t = stab_checkpoint_tensor(c, i);
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, want[i]->name);
    ck_assert_int_eq(t->dtype, want[i]->dtype);
    ck_assert_uint_eq(t->ndim, want[i]->ndim);
    ck_assert_uint_eq(t->count, want[i]->count);
    ck_assert_uint_eq(stab_ckpt_nbytes(t), stab_ckpt_nbytes(want[i]));
    ck_assert(!memcmp(t->data, want[i]->data, stab_ckpt_nbytes(t)));
  }
  ck_assert_ptr_null(stab_checkpoint_tensor(c, n));
}

/* ---- safetensors: one file, a folder and an index of shards ------------------------------ */

static void write_st(const char *path, int first, int n, int bf16) {
  float x[4][R * C];
  uint16_t h[4][R * C];
  stw_tensor ts[4];
  static const char *const names[] = {"a.weight", "b.weight", "c.weight", "d.weight"};
  for (int k = 0; k < n; k++) {
    fill(first + k, x[k]);
    ts[k] = (stw_tensor){names[first + k], bf16 ? "BF16" : "F32", 2, {R, C}, x[k], sizeof x[k]};
    if (bf16) stw_encode16(x[k], R * C, 1, h[k]), ts[k].data = h[k], ts[k].nbytes = sizeof h[k];
  }
  ck_assert_int_eq(stw_write(path, ts, (size_t)n, "\"producer\": \"check_checkpoint\""), 0);
}

START_TEST(test_safetensors_file) {
  write_st(at("one.safetensors"), 0, 4, 1);
  stab_checkpoint *c = open_ok(at("one.safetensors"));
  ck_assert_int_eq(stab_checkpoint_format(c), STAB_FILE_SAFETENSORS);
  ck_assert_ptr_null(stab_checkpoint_note(c));
  ck_assert_uint_eq(stab_checkpoint_file_count(c), 1);
  ck_assert_str_eq(stab_checkpoint_file_path(c, 0), at("one.safetensors"));
  ck_assert_ptr_null(stab_checkpoint_file_path(c, 1));
  ck_assert_ptr_null(stab_checkpoint_gguf(c));
  ck_assert_ptr_null(stab_checkpoint_llmc(c));
  const stab_safetensors *s = stab_checkpoint_safetensors(c);
  ck_assert_ptr_nonnull(s);
  const stab_ckpt_tensor *want[4];
  for (size_t i = 0; i < 4; i++) {
    want[i] = stab_safetensors_tensor(s, i);
    ck_assert_uint_eq(stab_checkpoint_file_of(c, i), 0);
  }
  ck_assert_uint_eq(stab_checkpoint_file_of(c, 4), SIZE_MAX);
  same_as_reader(c, want, 4);
  /* and the reader opened on its own agrees with the one behind the handle */
  stab_safetensors *alone = NULL;
  TU_ASSERT_OK(stab_safetensors_open(at("one.safetensors"), &alone));
  for (size_t i = 0; i < 4; i++) want[i] = stab_safetensors_tensor(alone, i);
  same_as_reader(c, want, 4);
  stab_safetensors_close(alone);
  has_values(c, "a.weight", 0);
  has_values(c, "d.weight", 3);
  const char *k, *v;
  ck_assert_int_eq(stab_safetensors_metadata(s, 0, &k, &v), STAB_OK);
  ck_assert_str_eq(k, "producer");
  ck_assert_str_eq(v, "check_checkpoint");
  stab_checkpoint_close(c);
}
END_TEST

static void write_sharded(const char *dir) {
  char p[1024];
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir), write_st(p, 0, 2, 0);
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir), write_st(p, 2, 2, 0);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"metadata\": {\"total_size\": 384}, \"weight_map\": {"
        "\"a.weight\": \"model-00001-of-00002.safetensors\", \"b.weight\": \"model-00001-of-00002.safetensors\", "
        "\"c.weight\": \"model-00002-of-00002.safetensors\", \"d.weight\": \"model-00002-of-00002.safetensors\"}}",
        f);
  ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_sharded) {
  write_sharded(tmpdir);
  const char *paths[] = {tmpdir, at("model.safetensors.index.json")};
  for (size_t w = 0; w < 2; w++) {
    stab_checkpoint *c = open_ok(paths[w]);
    ck_assert_int_eq(stab_checkpoint_format(c), STAB_FILE_SAFETENSORS);
    ck_assert_ptr_null(stab_checkpoint_note(c)); /* total_size is right */
    stab_sharded *sh = NULL;
    TU_ASSERT_OK(stab_sharded_open(paths[w], &sh));
    const stab_ckpt_tensor *want[4];
    for (size_t i = 0; i < 4; i++) want[i] = stab_sharded_tensor(sh, i);
    same_as_reader(c, want, 4);
    ck_assert_uint_eq(stab_checkpoint_file_count(c), 2);
    for (size_t k = 0; k < 2; k++) ck_assert_str_eq(stab_checkpoint_file_path(c, k), stab_sharded_shard_path(sh, k));
    stab_sharded_close(sh);
    ck_assert(strstr(stab_checkpoint_file_path(c, 1), "model-00002-of-00002.safetensors") != NULL);
    static const char *const names[] = {"a.weight", "b.weight", "c.weight", "d.weight"};
    for (int t = 0; t < 4; t++) {
      size_t i;
      has_values(c, names[t], t);
      ck_assert_int_eq(stab_checkpoint_find(c, names[t], &i), STAB_OK);
      ck_assert_uint_eq(stab_checkpoint_file_of(c, i), t < 2 ? 0 : 1);
    }
    /* the metadata reader is the first shard */
    ck_assert_ptr_nonnull(stab_checkpoint_safetensors(c));
    ck_assert_uint_eq(stab_safetensors_metadata_count(stab_checkpoint_safetensors(c)), 1);
    stab_checkpoint_close(c);
  }
  /* a total_size that disagrees: opened, with the index's warning as the note */
  char p[1024];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmpdir);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs("{\"metadata\": {\"total_size\": 1}, \"weight_map\": {"
        "\"a.weight\": \"model-00001-of-00002.safetensors\", \"b.weight\": \"model-00001-of-00002.safetensors\", "
        "\"c.weight\": \"model-00002-of-00002.safetensors\", \"d.weight\": \"model-00002-of-00002.safetensors\"}}",
        f);
  ck_assert_int_eq(fclose(f), 0);
  stab_checkpoint *c = open_ok(tmpdir);
  ck_assert_ptr_nonnull(stab_checkpoint_note(c));
  ck_assert_msg(!strncmp(stab_checkpoint_note(c), "warning: ", 9) && strstr(stab_checkpoint_note(c), "total_size"),
                "%s", stab_checkpoint_note(c));
  stab_checkpoint_close(c);
}
END_TEST

/* ---- GGUF: one file, and a model split in three ------------------------------------------- */

static void gguf_tensor(gw_file *f, int t) {
  static const char *const names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                                      "output.weight"};
  static float x[4][R * C];
  fill(t, x[t]);
  const uint64_t ne[2] = {C, R};
  gw_tensor(f, names[t], 2, ne, GW_F32, x[t], sizeof x[t]);
}

START_TEST(test_gguf_file) {
  gw_file f;
  gw_init(&f);
  gw_kv_str(&f, "general.architecture", "llama");
  for (int t = 0; t < 4; t++) gguf_tensor(&f, t);
  ck_assert_int_eq(gw_write(&f, at("one.gguf")), 0);
  stab_checkpoint *c = open_ok(at("one.gguf"));
  ck_assert_int_eq(stab_checkpoint_format(c), STAB_FILE_GGUF);
  ck_assert_ptr_null(stab_checkpoint_safetensors(c));
  ck_assert_ptr_nonnull(stab_checkpoint_gguf(c));
  ck_assert_uint_eq(stab_checkpoint_file_count(c), 1);
  stab_gguf *g = NULL;
  TU_ASSERT_OK(stab_gguf_open(at("one.gguf"), &g));
  const stab_ckpt_tensor *want[4];
  for (size_t i = 0; i < 4; i++) want[i] = stab_gguf_tensor(g, i);
  same_as_reader(c, want, 4);
  stab_gguf_close(g);
  has_values(c, "token_embd.weight", 0);
  has_values(c, "output.weight", 3);
  const stab_gguf_kv *kv = stab_gguf_find_metadata(stab_checkpoint_gguf(c), "general.architecture");
  ck_assert(kv && kv->type == STAB_GGUF_STRING && !strcmp(kv->s, "llama"));
  stab_checkpoint_close(c);
}
END_TEST

/* Shard k of 3 in dir: the model's metadata in the first only, split.* in every one. */
static void write_split(const char *dir) {
  static const int cut[4] = {0, 1, 3, 4};
  for (int k = 0; k < 3; k++) {
    char p[1024];
    gw_file f;
    gw_init(&f);
    if (k == 0) gw_kv_str(&f, "general.architecture", "llama");
    gw_kv_u16(&f, "split.no", (uint16_t)k);
    gw_kv_u16(&f, "split.count", 3);
    gw_kv_i32(&f, "split.tensors.count", 4);
    for (int t = cut[k]; t < cut[k + 1]; t++) gguf_tensor(&f, t);
    snprintf(p, sizeof p, "%s/m-%05d-of-%05d.gguf", dir, k + 1, 3);
    ck_assert_int_eq(gw_write(&f, p), 0);
  }
}

START_TEST(test_gguf_split) {
  write_split(tmpdir);
  const char *paths[] = {tmpdir, at("m-00002-of-00003.gguf"), at("m-00001-of-00003.gguf")};
  for (size_t w = 0; w < 3; w++) {
    stab_checkpoint *c = open_ok(paths[w]);
    ck_assert_int_eq(stab_checkpoint_format(c), STAB_FILE_GGUF);
    ck_assert_uint_eq(stab_checkpoint_count(c), 4);
    ck_assert_uint_eq(stab_checkpoint_file_count(c), 3);
    ck_assert(strstr(stab_checkpoint_file_path(c, 0), "m-00001-of-00003.gguf") != NULL);
    ck_assert(strstr(stab_checkpoint_file_path(c, 2), "m-00003-of-00003.gguf") != NULL);
    const char *note = stab_checkpoint_note(c);
    ck_assert_msg(note && !strncmp(note, "note: ", 6) && strstr(note, w == 1 ? "shard 2 of 3" : "shard 1 of 3"),
                  "%s", note ? note : "(none)");
    /* the metadata is the first shard's */
    ck_assert_ptr_nonnull(stab_gguf_find_metadata(stab_checkpoint_gguf(c), "general.architecture"));
    static const char *const names[] = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight",
                                        "output.weight"};
    static const size_t file[] = {0, 1, 1, 2};
    for (int t = 0; t < 4; t++) {
      size_t i;
      has_values(c, names[t], t);
      ck_assert_int_eq(stab_checkpoint_find(c, names[t], &i), STAB_OK);
      ck_assert_uint_eq(stab_checkpoint_file_of(c, i), file[t]);
      /* each tensor as the shard's own reader gives it */
      stab_gguf *g = NULL;
      size_t j;
      TU_ASSERT_OK(stab_gguf_open(stab_checkpoint_file_path(c, file[t]), &g));
      TU_ASSERT_OK(stab_gguf_find(g, names[t], &j));
      const stab_ckpt_tensor *want = stab_gguf_tensor(g, j), *got = stab_checkpoint_tensor(c, i);
      ck_assert_uint_eq(got->offset, want->offset);
      ck_assert(!memcmp(got->data, want->data, stab_ckpt_nbytes(want)));
      stab_gguf_close(g);
    }
    stab_checkpoint_close(c);
  }
  /* a shard missing: named */
  ck_assert_int_eq(unlink(at("m-00003-of-00003.gguf")), 0);
  stab_checkpoint *c = (stab_checkpoint *)1;
  ck_assert_int_eq(stab_checkpoint_open(at("m-00001-of-00003.gguf"), &c), STAB_ENOTFOUND);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(stab_last_error(), "m-00003-of-00003.gguf") != NULL, "%s", stab_last_error());
}
END_TEST

/* ---- llm.c ---------------------------------------------------------------------------------- */

START_TEST(test_llmc) {
  enum { T = 4, V = 8, L = 1, CH = 4 };
  const char *path = at("model.bin");
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  const int32_t hdr[8] = {20240326, 3, T, V, L, 1, CH, V}; /* magic, f32, maxT, V, L, heads, C, Vp */
  unsigned char h[1024] = {0};
  for (int k = 0; k < 8; k++)
    for (int b = 0; b < 4; b++) h[4 * k + b] = (unsigned char)((uint32_t)hdr[k] >> (8 * b));
  ck_assert_int_eq(fwrite(h, 1, sizeof h, f), sizeof h);
  const size_t n = (size_t)V * CH + (size_t)T * CH + (size_t)L * (13 * CH + 12 * CH * CH) + 2 * CH;
  for (size_t i = 0; i < n; i++) {
    float x = (float)(i % 29) * 0.25f; /* the file's i-th parameter: wte first */
    ck_assert_int_eq(fwrite(&x, sizeof x, 1, f), 1);
  }
  ck_assert_int_eq(fclose(f), 0);
  stab_checkpoint *c = open_ok(path);
  ck_assert_int_eq(stab_checkpoint_format(c), STAB_FILE_LLMC);
  ck_assert_ptr_nonnull(stab_checkpoint_llmc(c));
  ck_assert_ptr_null(stab_checkpoint_gguf(c));
  ck_assert_ptr_null(stab_checkpoint_safetensors(c));
  stab_llmc *lc = NULL;
  TU_ASSERT_OK(stab_llmc_open(path, &lc));
  size_t nt = stab_llmc_count(lc);
  const stab_ckpt_tensor **want = malloc(nt * sizeof *want);
  for (size_t i = 0; i < nt; i++) want[i] = stab_llmc_tensor(lc, i);
  same_as_reader(c, want, nt);
  free(want);
  stab_llmc_close(lc);
  size_t i;
  TU_ASSERT_OK(stab_checkpoint_find(c, "wte", &i));
  float got[V * CH];
  TU_ASSERT_OK(stab_checkpoint_read_f32(c, i, 0, V * CH, got));
  for (size_t k = 0; k < V * CH; k++) ck_assert(got[k] == (float)(k % 29) * 0.25f);
  stab_checkpoint_close(c);
}
END_TEST

/* ---- errors ----------------------------------------------------------------------------- */

START_TEST(test_errors) {
  stab_checkpoint *c = (stab_checkpoint *)1;
  TU_ASSERT_STATUS(stab_checkpoint_open(NULL, &c), STAB_EINVAL);
  ck_assert_ptr_null(c);
  TU_ASSERT_STATUS(stab_checkpoint_open(at("x"), NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_checkpoint_open("", &c), STAB_EINVAL);
  /* nothing there */
  TU_ASSERT_STATUS(stab_checkpoint_open(at("missing.safetensors"), &c), STAB_EIO);
  ck_assert(strstr(stab_last_error(), "missing.safetensors") != NULL);
  /* a file of another kind: the sniff names what it is */
  FILE *f = fopen(at("notes.txt"), "w");
  ck_assert_ptr_nonnull(f);
  fputs("not a checkpoint\n", f);
  ck_assert_int_eq(fclose(f), 0);
  TU_ASSERT_STATUS(stab_checkpoint_open(at("notes.txt"), &c), STAB_EFORMAT);
  ck_assert_msg(strstr(stab_last_error(), "notes.txt") && strstr(stab_last_error(), "text"), "%s", stab_last_error());
  ck_assert_ptr_null(c);
  /* a broken header named .safetensors: the reader's message, not the sniff's */
  static const unsigned char junk[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3};
  f = fopen(at("broken.safetensors"), "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(junk, 1, sizeof junk, f), sizeof junk);
  ck_assert_int_eq(fclose(f), 0);
  stab_safetensors *s = NULL;
  stab_status want = stab_safetensors_open(at("broken.safetensors"), &s);
  char reader_says[1024];
  snprintf(reader_says, sizeof reader_says, "%s", stab_last_error());
  ck_assert_int_ne(want, STAB_OK);
  TU_ASSERT_STATUS(stab_checkpoint_open(at("broken.safetensors"), &c), want);
  ck_assert_str_eq(stab_last_error(), reader_says);
  /* a handle's own errors */
  write_st(at("e.safetensors"), 0, 1, 0);
  c = open_ok(at("e.safetensors"));
  size_t i = 7;
  TU_ASSERT_STATUS(stab_checkpoint_find(c, "nope", &i), STAB_ENOTFOUND);
  TU_ASSERT_STATUS(stab_checkpoint_find(c, NULL, &i), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_checkpoint_find(NULL, "a.weight", &i), STAB_EINVAL);
  float x[R * C];
  TU_ASSERT_STATUS(stab_checkpoint_read_f32(c, 1, 0, 1, x), STAB_ERANGE);
  ck_assert(strstr(stab_last_error(), "tensor 1 of 1") != NULL);
  TU_ASSERT_STATUS(stab_checkpoint_read_f32(c, 0, R * C, 1, x), STAB_ERANGE); /* past its end */
  TU_ASSERT_STATUS(stab_checkpoint_read_f32(c, 0, 0, 1, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_checkpoint_read_f32(NULL, 0, 0, 1, x), STAB_EINVAL);
  stab_checkpoint_close(c);
  /* NULL is no checkpoint */
  ck_assert_uint_eq(stab_checkpoint_count(NULL), 0);
  ck_assert_ptr_null(stab_checkpoint_tensor(NULL, 0));
  ck_assert_uint_eq(stab_checkpoint_file_count(NULL), 0);
  ck_assert_int_eq(stab_checkpoint_format(NULL), STAB_FILE_UNKNOWN);
  stab_checkpoint_close(NULL);
}
END_TEST

static void setup(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_checkpoint"); }
static void teardown(void) { tu_tmpdir_remove(tmpdir); }

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("handle");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_safetensors_file);
  tcase_add_test(tc, test_sharded);
  tcase_add_test(tc, test_gguf_file);
  tcase_add_test(tc, test_gguf_split);
  tcase_add_test(tc, test_llmc);
  tcase_add_test(tc, test_errors);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
