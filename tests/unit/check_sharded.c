/* check_sharded.c — the library's side of Hugging Face model directories, on files written here:
 * stab_hf_config_read on config.json files of each family's shape (Llama, GPT-2's own key names,
 * a multimodal text_config, MoE expert counts) and on each wrong value; stab_shard_index_* on
 * indexes (order, find, total_size, warnings); stab_sharded_open on shards written by
 * tests/support/st_writer.c (an independent writer): the model's tensors in shard order then file order,
 * their values, find across shards, symbolic links; stab_shard_index_beside for one shard. */
#include <errno.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char dir[256];

/* 1 when s matches the extended regular expression re. */
static int matches(const char *s, const char *re) {
  regex_t r;
  ck_assert_int_eq(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
  int ok = regexec(&r, s, 0, NULL, 0) == 0;
  regfree(&r);
  return ok;
}

/* dir/name (static, overwritten by the next call). */
static const char *at(const char *name) {
  static char path[2][1024];
  static int k;
  k ^= 1;
  snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
  return path[k];
}

static const char *put(const char *name, const char *text) {
  const char *path = at(name);
  FILE *f = fopen(path, "w");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  fputs(text, f);
  ck_assert_int_eq(fclose(f), 0);
  return path;
}

static stab_hf_config config_of(const char *text) {
  stab_hf_config c;
  const char *path = put("config.json", text);
  stab_status st = stab_hf_config_read(path, &c);
  ck_assert_msg(st == STAB_OK, "%s: %s", text, stab_last_error());
  return c;
}

START_TEST(test_config_values) {
  stab_hf_config c = config_of("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
                               "\"hidden_size\": 2048, \"num_attention_heads\": 32, \"num_key_value_heads\": 4, "
                               "\"num_hidden_layers\": 22, \"vocab_size\": 32000, \"head_dim\": null, "
                               "\"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"tie_word_embeddings\": false}");
  ck_assert_uint_eq(c.num_attention_heads, 32);
  ck_assert_uint_eq(c.num_key_value_heads, 4);
  ck_assert_uint_eq(c.head_dim, 0); /* null: absent */
  ck_assert_uint_eq(c.hidden_size, 2048);
  ck_assert_uint_eq(c.num_hidden_layers, 22);
  ck_assert_uint_eq(c.vocab_size, 32000);
  ck_assert_int_eq(c.tie_word_embeddings, 0);
  ck_assert_str_eq(c.model_type, "llama");
  ck_assert_str_eq(c.architecture, "LlamaForCausalLM");
  ck_assert_uint_eq(c.num_local_experts + c.num_experts + c.n_routed_experts + c.num_experts_per_tok, 0);
  /* GPT-2's own names; no tie key: unknown */
  c = config_of("{\"model_type\": \"gpt2\", \"n_embd\": 768, \"n_head\": 12, \"n_layer\": 12, \"vocab_size\": 50257}");
  ck_assert_uint_eq(c.num_attention_heads, 12);
  ck_assert_uint_eq(c.hidden_size, 768);
  ck_assert_uint_eq(c.num_hidden_layers, 12);
  ck_assert_int_eq(c.tie_word_embeddings, -1);
  ck_assert_str_eq(c.architecture, "");
  /* multimodal: the text model's values under text_config; the top level wins where it has one */
  c = config_of("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", "
                "\"text_config\": {\"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256, "
                "\"hidden_size\": 2560, \"model_type\": \"gemma3_text\", \"tie_word_embeddings\": true}, "
                "\"vision_config\": {\"num_attention_heads\": 16}}");
  ck_assert_uint_eq(c.num_attention_heads, 8);
  ck_assert_uint_eq(c.num_key_value_heads, 4);
  ck_assert_uint_eq(c.head_dim, 256);
  ck_assert_int_eq(c.tie_word_embeddings, 1);
  ck_assert_str_eq(c.model_type, "gemma3");
  /* experts */
  c = config_of("{\"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"num_local_experts\": 8, "
                "\"num_experts_per_tok\": 2}");
  ck_assert_uint_eq(c.num_local_experts, 8);
  ck_assert_uint_eq(c.num_experts_per_tok, 2);
  c = config_of("{\"n_routed_experts\": 256, \"num_experts_per_tok\": 8, \"num_experts\": 0}");
  ck_assert_uint_eq(c.n_routed_experts, 256);
  ck_assert_uint_eq(c.num_experts, 0);
  /* escapes and unicode in strings; whitespace everywhere */
  c = config_of(" \r\n\t{ \"model_type\" : \"ll\\u0061ma\\u00e9\\ud83d\\ude00\" , \"n_head\" : 4 } \n");
  ck_assert_str_eq(c.model_type, "llama\xc3\xa9\xf0\x9f\x98\x80");
  ck_assert_uint_eq(c.num_attention_heads, 4);
  /* Python's json.dump writes infinities and NaN as words: read as numbers, never as counts */
  c = config_of("{\"n_head\": 4, \"max_position_embeddings\": Infinity, \"eps\": [NaN, -Infinity]}");
  ck_assert_uint_eq(c.num_attention_heads, 4);
  /* a whole number however JSON writes it: 4.0 (Python's json for a float) and 4e0 are 4 */
  c = config_of("{\"num_attention_heads\": 4.0, \"num_key_value_heads\": 2e0, \"hidden_size\": 64.00}");
  ck_assert_uint_eq(c.num_attention_heads, 4);
  ck_assert_uint_eq(c.num_key_value_heads, 2);
  ck_assert_uint_eq(c.hidden_size, 64);
  stab_hf_config bad;
  ck_assert_int_eq(stab_hf_config_read(put("config.json", "{\"n_head\": Infinity}"), &bad), STAB_EFORMAT);
  ck_assert(strstr(stab_last_error(), "\"n_head\" is inf, not a whole number") != NULL);
}
END_TEST

START_TEST(test_config_errors) {
  static const struct {
    const char *text, *says;
  } cases[] = {
      {"", "empty file"},
      {"{\"num_attention_heads\": 4,", "the text ends"},
      {"{\"num_attention_heads\": 4,}", "expected a key"},
      {"{'num_attention_heads': 4}", "expected a key"},
      {"{\"a\": tru}", "not a JSON value"},
      {"{\"a\": 01}", "text after|expected ','"},
      {"{\"a\": 1.}", "no digits after a decimal point"},
      {"{\"a\": \"\\x\"}", "invalid escape"},
      {"{\"a\": \"\\ud800\"}", "unpaired surrogate"},
      {"{\"a\": \"\\u0000\"}", "\\\\u0000"},
      {"{\"a\": \"\xff\"}", "invalid UTF-8"},
      {"{\"a\": \"x\ny\"}", "control character"},
      {"\xef\xbb\xbf{}", "byte order mark"},
      {"{} {}", "text after the JSON value"},
      {"[1]", "the top level is an array, not an object"},
      {"{\"num_attention_heads\": \"abc\"}", "\"num_attention_heads\" is a string \"abc\", not a whole number"},
      {"{\"num_attention_heads\": 4.5}", "\"num_attention_heads\" is 4.5, not a whole number"},
      {"{\"num_attention_heads\": -4}", "\"num_attention_heads\" is -4, not a whole number"},
      {"{\"num_attention_heads\": 0}", "\"num_attention_heads\" is 0, not a whole number from 1"},
      {"{\"num_attention_heads\": 1e13}", "\"num_attention_heads\" is 10000000000000, not a whole number from 1 to"},
      {"{\"num_attention_heads\": 4.000001}", "\"num_attention_heads\" is 4.0000010000000001, not a whole number"},
      {"{\"vocab_size\": 99999999999999999999}", "\"vocab_size\" is 1e\\+20"},
      {"{\"num_attention_heads\": [4]}", "is an array, not a whole number"},
      {"{\"num_attention_heads\": 4, \"num_key_value_heads\": 3}", "\"num_key_value_heads\" 3 does not divide"},
      {"{\"num_attention_heads\": 4, \"num_key_value_heads\": 8}", "\"num_key_value_heads\" 8 does not divide"},
      {"{\"n_head\": 12, \"num_attention_heads\": 16}", "\"n_head\" is 12 but \"num_attention_heads\" is 16"},
      {"{\"text_config\": {\"num_attention_heads\": \"x\"}}", "\"text_config.num_attention_heads\" is a string"},
      {"{\"text_config\": 3}", "\"text_config\" is a number, not an object"},
      {"{\"tie_word_embeddings\": 1}", "\"tie_word_embeddings\" is a number, not true or false"},
      {"{\"model_type\": 7}", "\"model_type\" is a number, not a string"},
      {"{\"architectures\": \"Llama\"}", "\"architectures\" is a string, not an array of strings"},
      {"{\"architectures\": [1]}", "not an array of strings"},
      {"{\"a\": 1, \"a\": 2}", "key \"a\" appears twice in one object"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    stab_hf_config c;
    memset(&c, 0x5a, sizeof c);
    const char *path = put("bad.json", cases[i].text);
    stab_status st = stab_hf_config_read(path, &c);
    ck_assert_msg(st == STAB_EFORMAT, "case %zu (%s): status %d, not STAB_EFORMAT", i, cases[i].text, st);
    const char *msg = stab_last_error();
    ck_assert_msg(strstr(msg, path) != NULL, "case %zu: the message does not name the file: %s", i, msg);
    ck_assert_msg(matches(msg, cases[i].says), "case %zu (%s): message '%s' lacks /%s/", i, cases[i].text, msg,
                  cases[i].says);
    ck_assert_msg(c.num_attention_heads == 0 && c.tie_word_embeddings == -1 && !c.model_type[0],
                  "case %zu: values left after a refusal", i);
  }
  /* nested deeper than 64 levels: refused, never a stack overflow */
  char deep[2 * 100000 + 3];
  size_t n = 0;
  deep[n++] = '{', deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"', deep[n++] = ':';
  for (int k = 0; k < 90000; k++) deep[n++] = '[';
  deep[n] = '\0';
  stab_hf_config c;
  ck_assert_int_eq(stab_hf_config_read(put("deep.json", deep), &c), STAB_EFORMAT);
  ck_assert(strstr(stab_last_error(), "nested more than 64 levels deep") != NULL);
  /* not there; NULL arguments */
  ck_assert_int_eq(stab_hf_config_read(at("missing.json"), &c), STAB_EIO);
  ck_assert_int_eq(stab_hf_config_read(NULL, &c), STAB_EINVAL);
  ck_assert_int_eq(stab_hf_config_read(at("deep.json"), NULL), STAB_EINVAL);
}
END_TEST

START_TEST(test_index) {
  const char *path = put("model.safetensors.index.json",
                         "{\"metadata\": {\"total_size\": 36, \"total_parameters\": 9}, \"weight_map\": {"
                         "\"z.weight\": \"model-00002-of-00002.safetensors\", \"a.weight\": \"model-00001-of-00002.safetensors\", "
                         "\"m.weight\": \"model-00002-of-00002.safetensors\"}}");
  stab_shard_index *ix = NULL;
  ck_assert_msg(stab_shard_index_open(path, &ix) == STAB_OK, "%s", stab_last_error());
  ck_assert_uint_eq(stab_shard_index_count(ix), 3);
  ck_assert_uint_eq(stab_shard_index_shard_count(ix), 2);
  ck_assert_str_eq(stab_shard_index_shard(ix, 0), "model-00001-of-00002.safetensors");
  ck_assert_str_eq(stab_shard_index_shard(ix, 1), "model-00002-of-00002.safetensors");
  ck_assert_ptr_null(stab_shard_index_shard(ix, 2));
  static const char *const names[] = {"a.weight", "m.weight", "z.weight"};
  static const size_t shards[] = {0, 1, 1};
  for (size_t i = 0; i < 3; i++) {
    size_t k = 9, j = 9;
    ck_assert_str_eq(stab_shard_index_tensor(ix, i, &k), names[i]);
    ck_assert_uint_eq(k, shards[i]);
    ck_assert_int_eq(stab_shard_index_find(ix, names[i], &j), STAB_OK);
    ck_assert_uint_eq(j, i);
  }
  ck_assert_ptr_null(stab_shard_index_tensor(ix, 3, NULL));
  ck_assert_int_eq(stab_shard_index_find(ix, "b.weight", NULL), STAB_ENOTFOUND);
  uint64_t total = 0;
  ck_assert_int_eq(stab_shard_index_total_size(ix, &total), STAB_OK);
  ck_assert_uint_eq(total, 36);
  ck_assert_ptr_null(stab_shard_index_warning(ix));
  ck_assert_str_eq(stab_shard_index_path(ix), path);
  stab_shard_index_close(ix);
  /* no metadata: no total; a total that is not a number: a warning, not a refusal */
  ck_assert_int_eq(stab_shard_index_open(put("i.json", "{\"weight_map\": {\"a\": \"s.safetensors\"}}"), &ix), STAB_OK);
  ck_assert_int_eq(stab_shard_index_total_size(ix, &total), STAB_ENOTFOUND);
  stab_shard_index_close(ix);
  ck_assert_int_eq(stab_shard_index_open(put("i.json", "{\"metadata\": {\"total_size\": 1.5e3}, \"weight_map\": "
                                              "{\"a\": \"s.safetensors\"}}"), &ix), STAB_OK);
  ck_assert_int_eq(stab_shard_index_total_size(ix, &total), STAB_ENOTFOUND);
  ck_assert(stab_shard_index_warning(ix) && strstr(stab_shard_index_warning(ix), "is a number, not a whole number"));
  stab_shard_index_close(ix);
  /* refusals */
  static const struct {
    const char *text, *says;
  } bad[] = {
      {"not json", "byte 0: not a JSON value"},
      {"[]", "not a sharded checkpoint's index: the top level is not an object"},
      {"{\"metadata\": {}}", "no \"weight_map\" object"},
      {"{\"weight_map\": [\"a\"]}", "\"weight_map\" is not an object"},
      {"{\"weight_map\": {}}", "\"weight_map\" is empty"},
      {"{\"weight_map\": {\"a\": null}}", "tensor 'a': the shard is null, not a file name"},
      {"{\"weight_map\": {\"a\": \"\"}}", "tensor 'a': shard name '' is empty"},
      {"{\"weight_map\": {\"a\": \"sub/s.safetensors\"}}", "shard name 'sub/s.safetensors' holds a '/'"},
      {"{\"weight_map\": {\"a\": \"..\"}}", "shard name '..' is a directory's name"},
      {"{\"weight_map\": {\"a\": \".\"}}", "shard name '.' is a directory's name"},
      {"{\"weight_map\": {\"\": \"s.safetensors\"}}", "an empty tensor name"},
      {"{\"weight_map\": {\"a\": \"s.safetensors\", \"a\": \"t.safetensors\"}}", "key \"a\" appears twice"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ix = (stab_shard_index *)1;
    path = put("bad.index.json", bad[i].text);
    ck_assert_int_eq(stab_shard_index_open(path, &ix), STAB_EFORMAT);
    ck_assert_ptr_null(ix);
    ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), bad[i].says), "case %zu: '%s' lacks '%s'",
                  i, stab_last_error(), bad[i].says);
  }
  ck_assert_int_eq(stab_shard_index_open(NULL, &ix), STAB_EINVAL);
  stab_shard_index_close(NULL);
}
END_TEST

/* Three shards of a small model, written by st_writer; the values of tensor k are k*100 + i. */
static void write_model(void) {
  static float v[8][6];
  for (int k = 0; k < 8; k++)
    for (int i = 0; i < 6; i++) v[k][i] = (float)(k * 100 + i);
  /* shard 1: e, a (data order, not name order); shard 2: q, b; shard 3: head, norm */
  stw_tensor s1[] = {{"e.weight", "F32", 2, {3, 2}, v[0], 24}, {"a.weight", "F32", 1, {4}, v[1], 16}};
  stw_tensor s2[] = {{"q.weight", "F32", 2, {2, 3}, v[2], 24}, {"b.bias", "F32", 1, {2}, v[3], 8}};
  stw_tensor s3[] = {{"lm_head.weight", "F32", 2, {3, 2}, v[4], 24}, {"norm.weight", "F32", 1, {2}, v[5], 8}};
  ck_assert_int_eq(stw_write(at("model-00001-of-00003.safetensors"), s1, 2, "\"format\": \"pt\""), 0);
  ck_assert_int_eq(stw_write(at("model-00002-of-00003.safetensors"), s2, 2, "\"format\": \"pt\""), 0);
  ck_assert_int_eq(stw_write(at("model-00003-of-00003.safetensors"), s3, 2, "\"format\": \"pt\""), 0);
  put("model.safetensors.index.json",
      "{\"metadata\": {\"total_size\": 104}, \"weight_map\": {\"a.weight\": \"model-00001-of-00003.safetensors\", "
      "\"b.bias\": \"model-00002-of-00003.safetensors\", \"e.weight\": \"model-00001-of-00003.safetensors\", "
      "\"lm_head.weight\": \"model-00003-of-00003.safetensors\", \"norm.weight\": \"model-00003-of-00003.safetensors\", "
      "\"q.weight\": \"model-00002-of-00003.safetensors\"}}");
}

START_TEST(test_sharded_open) {
  write_model();
  static const char *const order[] = {"e.weight", "a.weight", "q.weight", "b.bias", "lm_head.weight", "norm.weight"};
  static const size_t shard_of[] = {0, 0, 1, 1, 2, 2};
  const char *paths[] = {dir, at("model.safetensors.index.json")};
  for (int p = 0; p < 2; p++) {
    stab_sharded *f = NULL;
    ck_assert_msg(stab_sharded_open(paths[p], &f) == STAB_OK, "%s: %s", paths[p], stab_last_error());
    ck_assert_uint_eq(stab_sharded_count(f), 6);
    ck_assert_uint_eq(stab_sharded_shard_count(f), 3);
    ck_assert_str_eq(stab_sharded_directory(f), dir);
    ck_assert_ptr_nonnull(stab_sharded_index(f));
    ck_assert_ptr_null(stab_sharded_warning(f));
    for (size_t i = 0; i < 6; i++) {
      const stab_ckpt_tensor *t = stab_sharded_tensor(f, i);
      ck_assert_str_eq(t->name, order[i]);
      ck_assert_uint_eq(stab_sharded_shard_of(f, i), shard_of[i]);
      size_t j = 99;
      ck_assert_int_eq(stab_sharded_find(f, order[i], &j), STAB_OK);
      ck_assert_uint_eq(j, i);
      /* the values, through the shard's own mapping: the i-th tensor written holds i*100 + e */
      int k = (int)i;
      float x[6];
      ck_assert_int_eq(stab_ckpt_read_f32(t, 0, (size_t)t->count, x), STAB_OK);
      for (size_t e = 0; e < t->count; e++) ck_assert_float_eq(x[e], (float)(k * 100 + (int)e));
    }
    ck_assert_ptr_null(stab_sharded_tensor(f, 6));
    ck_assert_uint_eq(stab_sharded_shard_of(f, 6), SIZE_MAX);
    ck_assert_int_eq(stab_sharded_find(f, "missing", NULL), STAB_ENOTFOUND);
    ck_assert_str_eq(stab_sharded_shard_path(f, 1), at("model-00002-of-00003.safetensors"));
    ck_assert_uint_eq(stab_safetensors_count(stab_sharded_shard(f, 2)), 2);
    ck_assert_uint_eq(stab_sharded_metadata_count(f), 1);
    const char *k, *v;
    ck_assert_int_eq(stab_sharded_metadata(f, 0, &k, &v), STAB_OK);
    ck_assert_str_eq(k, "format");
    ck_assert_str_eq(v, "pt");
    stab_sharded_close(f);
  }
  /* one shard: the index beside it lists it as shard 2 of 3 */
  stab_shard_index *ix = NULL;
  size_t k = 9;
  ck_assert_int_eq(stab_shard_index_beside(at("model-00002-of-00003.safetensors"), &ix, &k), STAB_OK);
  ck_assert_uint_eq(k, 1);
  ck_assert_uint_eq(stab_shard_index_shard_count(ix), 3);
  ck_assert_int_eq(stab_shard_index_find(ix, "lm_head.weight", NULL), STAB_OK);
  stab_shard_index_close(ix);
  ck_assert_int_eq(stab_shard_index_beside(at("config.json"), &ix, &k), STAB_ENOTFOUND);
  ck_assert_ptr_null(ix);
  /* a total_size off by one: opened, with a warning */
  put("model.safetensors.index.json",
      "{\"metadata\": {\"total_size\": 105}, \"weight_map\": {\"a.weight\": \"model-00001-of-00003.safetensors\", "
      "\"b.bias\": \"model-00002-of-00003.safetensors\", \"e.weight\": \"model-00001-of-00003.safetensors\", "
      "\"lm_head.weight\": \"model-00003-of-00003.safetensors\", \"norm.weight\": \"model-00003-of-00003.safetensors\", "
      "\"q.weight\": \"model-00002-of-00003.safetensors\"}}");
  stab_sharded *f = NULL;
  ck_assert_int_eq(stab_sharded_open(dir, &f), STAB_OK);
  ck_assert(stab_sharded_warning(f) && strstr(stab_sharded_warning(f), "is 105 bytes, but the shards' tensors hold 104"));
  stab_sharded_close(f);
  /* the shards as symbolic links (the Hugging Face cache's snapshots) */
  char link[600], target[64];
  for (int s = 1; s <= 3; s++) {
    snprintf(target, sizeof target, "model-0000%d-of-00003.safetensors", s);
    snprintf(link, sizeof link, "%s/blob%d", dir, s);
    ck_assert_int_eq(rename(at(target), link), 0);
    snprintf(link, sizeof link, "blob%d", s);
    ck_assert_int_eq(symlink(link, at(target)), 0);
  }
  ck_assert_msg(stab_sharded_open(dir, &f) == STAB_OK, "%s", stab_last_error());
  ck_assert_uint_eq(stab_sharded_count(f), 6);
  stab_sharded_close(f);
  for (int s = 1; s <= 3; s++) {
    snprintf(target, sizeof target, "model-0000%d-of-00003.safetensors", s);
    snprintf(link, sizeof link, "%s/blob%d", dir, s);
    unlink(at(target));
    ck_assert_int_eq(rename(link, at(target)), 0);
  }
  /* a directory with model.safetensors: that file alone, no index (transformers' order) */
  stw_tensor one[] = {{"w", "F32", 1, {2}, (float[]){1, 2}, 8}};
  ck_assert_int_eq(stw_write(at("model.safetensors"), one, 1, NULL), 0);
  ck_assert_int_eq(stab_sharded_open(dir, &f), STAB_OK);
  ck_assert_uint_eq(stab_sharded_count(f), 1);
  ck_assert_ptr_null(stab_sharded_index(f));
  ck_assert_str_eq(stab_sharded_tensor(f, 0)->name, "w");
  stab_sharded_close(f);
  unlink(at("model.safetensors"));
  ck_assert_int_eq(stab_sharded_open(NULL, &f), STAB_EINVAL);
  stab_sharded_close(NULL);
}
END_TEST

static void clean(void) {
  static const char *const files[] = {"config.json", "bad.json", "deep.json", "i.json", "bad.index.json",
                                      "model.safetensors.index.json", "model-00001-of-00003.safetensors",
                                      "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                      "model.safetensors"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) unlink(at(files[i]));
  if (rmdir(dir) != 0) fprintf(stderr, "check_sharded: cannot remove %s: %s\n", dir, strerror(errno));
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/check_sharded.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  Suite *s = suite_create("sharded");
  TCase *tc = tcase_create("sharded");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_config_values);
  tcase_add_test(tc, test_config_errors);
  tcase_add_test(tc, test_index);
  tcase_add_test(tc, test_sharded_open);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK); /* the tests share the directory's files in order */
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  clean();
  return failures ? 1 : 0;
}
