/* check_model_rules.c — the kind rules (stab_model_describe) on tensor lists named as the
 * checkpoints of GPT-2 (HF Conv1D, nanoGPT, llm.c), Llama/Mistral/Qwen2, Gemma, Phi-3, Mixtral
 * and llama.cpp's GGUF name them: every entry's kind, layout, sizes, pairing, tied head and name,
 * and the reason of each tensor not measured. No file is needed: the rules read names, shapes
 * and dtypes only; the layer helpers are checked against layers written by hand. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

/* A tensor as a list gives it: name, dtype (STAB_DTYPE_OTHER has the name Q8_1), shape. */
typedef struct {
  const char *name;
  stab_dtype dtype;
  size_t ndim;
  uint64_t shape[3];
} spec;

#define T2(name, r, c) {name, STAB_DTYPE_F32, 2, {r, c, 0}}
#define T1(name, n) {name, STAB_DTYPE_F32, 1, {n, 0, 0}}

typedef struct {
  stab_ckpt_tensor t[64];
  const stab_ckpt_tensor *p[64];
  stab_model *m;
} model;

static void build(model *md, const spec *sp, size_t n, const stab_model_config *c) {
  ck_assert_uint_le(n, 64);
  memset(md, 0, sizeof *md);
  for (size_t i = 0; i < n; i++) {
    stab_ckpt_tensor *t = &md->t[i];
    t->name = sp[i].name;
    t->dtype = sp[i].dtype;
    t->dtype_name = sp[i].dtype == STAB_DTYPE_OTHER ? "Q8_1" : sp[i].dtype == STAB_DTYPE_QUANT ? "Q4_K" : "F32";
    t->elem_size = sp[i].dtype == STAB_DTYPE_F32 ? 4 : 0;
    t->ndim = sp[i].ndim;
    t->offset = 100000 * (i + 1); /* where a file would have it: views move from here */
    t->count = 1;
    for (size_t d = 0; d < t->ndim; d++) t->shape[d] = sp[i].shape[d], t->count *= sp[i].shape[d];
    md->p[i] = t;
  }
  ck_assert_int_eq(stab_model_describe(md->p, n, c, &md->m), STAB_OK);
}

/* The entry named name (exactly one), or a failure. */
static const stab_model_entry *entry(const model *md, const char *name) {
  const stab_model_entry *found = NULL;
  for (size_t i = 0; i < stab_model_count(md->m); i++) {
    const stab_model_entry *e = stab_model_entry_at(md->m, i);
    if (strcmp(e->name, name)) continue;
    ck_assert_msg(!found, "two entries named %s", name);
    found = e;
  }
  ck_assert_msg(found != NULL, "no entry named %s", name);
  return found;
}

/* A measured entry of that kind, layout (NATURAL for tables, norms, biases) and sizes. */
static void expect(const model *md, const char *name, stab_kind kind, stab_layout layout, size_t d_in, size_t d_out) {
  const stab_model_entry *e = entry(md, name);
  ck_assert_msg(!e->why_not, "%s not measured: %s", name, e->why_not);
  ck_assert_msg(e->kind == kind, "%s: kind %s, want %s", name, stab_kind_name(e->kind), stab_kind_name(kind));
  ck_assert_msg(e->layout == layout, "%s: layout %d, want %d", name, (int)e->layout, (int)layout);
  ck_assert_msg(e->d_in == d_in && e->d_out == d_out, "%s: %zu -> %zu, want %zu -> %zu", name, e->d_in, e->d_out,
                d_in, d_out);
}

/* An entry not measured whose reason contains why. */
static void expect_not(const model *md, const char *name, const char *why) {
  const stab_model_entry *e = entry(md, name);
  ck_assert_msg(e->why_not && strstr(e->why_not, why), "%s: reason '%s', want '%s'", name,
                e->why_not ? e->why_not : "(measured)", why);
}

/* An attention entry: query and key tensors (indices into md->t), heads, key heads, offsets. */
static void expect_attention(const model *md, const char *name, size_t q, size_t k, stab_layout layout, size_t d_in,
                             size_t d_out, size_t heads, size_t kv, size_t ld, size_t k_off) {
  expect(md, name, STAB_KIND_ATTENTION, layout, d_in, d_out);
  const stab_model_entry *e = entry(md, name);
  ck_assert_ptr_eq(e->weight, &md->t[q]);
  ck_assert_ptr_eq(e->weight_k, &md->t[k]);
  ck_assert_uint_eq(e->heads, heads);
  ck_assert_uint_eq(e->kv_heads, kv);
  ck_assert_uint_eq(e->ld, ld);
  ck_assert_uint_eq(e->q_off, 0);
  ck_assert_uint_eq(e->k_off, k_off);
}

static void expect_part(const model *md, const char *name, size_t tensor, int part, stab_layout layout, size_t d_in,
                        size_t d_out, size_t offset, size_t ld, const stab_ckpt_tensor *bias, size_t bias_offset);

static size_t count_kind(const model *md, stab_kind kind) {
  size_t k = 0;
  for (size_t i = 0; i < stab_model_count(md->m); i++) {
    const stab_model_entry *e = stab_model_entry_at(md->m, i);
    k += !e->why_not && e->kind == kind;
  }
  return k;
}

static stab_model_config heads_config(size_t heads, size_t kv, size_t dh) {
  stab_model_config c = stab_model_default_config();
  c.heads = heads, c.kv_heads = kv, c.head_dim = dh;
  c.heads_source = "the test";
  return c;
}

/* d 8, V 50, T 16, 2 heads */
static const spec gpt2_hf[] = {
    T2("transformer.wte.weight", 50, 8),          T2("transformer.wpe.weight", 16, 8),
    T1("transformer.h.0.ln_1.weight", 8),         T1("transformer.h.0.ln_1.bias", 8),
    T2("transformer.h.0.attn.c_attn.weight", 8, 24), T1("transformer.h.0.attn.c_attn.bias", 24),
    T2("transformer.h.0.attn.c_proj.weight", 8, 8),  T1("transformer.h.0.attn.c_proj.bias", 8),
    T1("transformer.h.0.ln_2.weight", 8),         T1("transformer.h.0.ln_2.bias", 8),
    T2("transformer.h.0.mlp.c_fc.weight", 8, 32), T1("transformer.h.0.mlp.c_fc.bias", 32),
    T2("transformer.h.0.mlp.c_proj.weight", 32, 8), T1("transformer.h.0.mlp.c_proj.bias", 8),
    T1("transformer.ln_f.weight", 8),             T1("transformer.ln_f.bias", 8)};
enum { N_GPT2 = sizeof gpt2_hf / sizeof gpt2_hf[0] };

START_TEST(test_gpt2_hf_conv1d) {
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, gpt2_hf, N_GPT2, &c);
  /* 16 tensors, 4 biases folded, c_attn as q, k and v, one attention entry, the tied head */
  ck_assert_uint_eq(stab_model_count(md.m), 16 - 4 + 2 + 1 + 1);
  expect(&md, "transformer.wte", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 50, 8);
  expect(&md, "transformer.wpe", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 16, 8);
  expect(&md, "transformer.h.0.ln_1", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 8, 8);
  expect(&md, "transformer.h.0.ln_1.bias", STAB_KIND_BIAS, STAB_LAYOUT_NATURAL, 8, 8);
  expect_part(&md, "transformer.h.0.attn.c_attn.q", 4, 1, STAB_LAYOUT_IN_MAJOR, 8, 8, 0, 24, &md.t[5], 0);
  expect_part(&md, "transformer.h.0.attn.c_attn.v", 4, 3, STAB_LAYOUT_IN_MAJOR, 8, 8, 16, 24, &md.t[5], 16);
  expect(&md, "transformer.h.0.attn.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 8, 8);
  expect(&md, "transformer.h.0.mlp.c_fc", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 8, 32);
  expect(&md, "transformer.h.0.mlp.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 32, 8);
  expect(&md, "transformer.ln_f", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 8, 8);
  ck_assert_ptr_eq(entry(&md, "transformer.h.0.mlp.c_proj")->bias, &md.t[13]);
  ck_assert_ptr_null(entry(&md, "transformer.h.0.ln_1")->bias);
  /* fused in-major: q the first 8 columns of the 24, k the next 8 */
  expect_attention(&md, "transformer.h.0.attn.logits", 4, 4, STAB_LAYOUT_IN_MAJOR, 8, 8, 2, 2, 24, 8);
  /* no lm_head tensor: wte again, last, as the tied head (never wpe) */
  const stab_model_entry *h = stab_model_entry_at(md.m, stab_model_count(md.m) - 1);
  expect(&md, "lm_head", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 8, 50);
  ck_assert_ptr_eq(h, entry(&md, "lm_head"));
  ck_assert_int_eq(h->tied, 1);
  ck_assert_ptr_eq(h->weight, &md.t[0]);
  stab_model_free(md.m);
}
END_TEST

/* nanoGPT keeps the GPT-2 names with nn.Linear's layout: out-major by shape, and a file of
 * stabmeter-train's (out_major) out-major throughout, the square attn.c_proj included. */
START_TEST(test_gpt2_nanogpt_out_major) {
  spec sp[N_GPT2];
  memcpy(sp, gpt2_hf, sizeof sp);
  sp[4].shape[0] = 24, sp[4].shape[1] = 8;   /* c_attn [3d][d] */
  sp[10].shape[0] = 32, sp[10].shape[1] = 8; /* c_fc [4d][d] */
  sp[12].shape[0] = 8, sp[12].shape[1] = 32; /* mlp.c_proj [d][4d] */
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, sp, N_GPT2, &c);
  expect_part(&md, "transformer.h.0.attn.c_attn.k", 4, 2, STAB_LAYOUT_OUT_MAJOR, 8, 8, 64, 0, &md.t[5], 8);
  expect(&md, "transformer.h.0.mlp.c_fc", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 32);
  expect(&md, "transformer.h.0.mlp.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 32, 8);
  expect(&md, "transformer.h.0.attn.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 8, 8);
  /* out-major fused: q the first 8 rows, k starts 8 rows of 8 in */
  expect_attention(&md, "transformer.h.0.attn.logits", 4, 4, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 64);
  stab_model_free(md.m);
  c.out_major = 1;
  build(&md, sp, N_GPT2, &c);
  expect(&md, "transformer.h.0.attn.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  stab_model_free(md.m);
  /* the rule on its own, as --prev across formats asks it of the other file's tensors */
  ck_assert_int_eq(stab_model_linear_layout(NULL, "transformer.h.3.mlp.c_fc.weight", 8, 32), STAB_LAYOUT_IN_MAJOR);
  ck_assert_int_eq(stab_model_linear_layout(NULL, "transformer.h.3.mlp.c_fc.weight", 32, 8), STAB_LAYOUT_OUT_MAJOR);
  ck_assert_int_eq(stab_model_linear_layout(&c, "transformer.h.3.mlp.c_fc.weight", 8, 32), STAB_LAYOUT_OUT_MAJOR);
  ck_assert_int_eq(stab_model_linear_layout(NULL, "model.layers.0.mlp.up_proj.weight", 8, 32), STAB_LAYOUT_OUT_MAJOR);
  ck_assert_int_eq(stab_model_linear_layout(NULL, NULL, 8, 32), STAB_LAYOUT_OUT_MAJOR);
  /* a layout override decides before the shape */
  stab_model_override lay = {"*.c_fc.weight", "in_major"};
  c.out_major = 0, c.layouts = &lay, c.nlayouts = 1;
  build(&md, sp, N_GPT2, &c);
  expect(&md, "transformer.h.0.mlp.c_fc", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 32, 8);
  stab_model_free(md.m);
}
END_TEST

/* llm.c's views: q, k, v split out of the fused qkv; attention pairs h.N.attn.q/k only under
 * llm.c's naming (another file's h.0.attn.q is no query by name). */
START_TEST(test_llmc) {
  static const spec sp[] = {T2("wte", 50, 8),          T2("wpe", 16, 8),          T1("h.0.ln_1.weight", 8),
                            T1("h.0.ln_1.bias", 8),    T2("h.0.attn.q.weight", 8, 8), T2("h.0.attn.k.weight", 8, 8),
                            T2("h.0.attn.v.weight", 8, 8), T1("h.0.attn.q.bias", 8), T1("h.0.attn.k.bias", 8),
                            T1("h.0.attn.v.bias", 8),  T2("h.0.attn.proj.weight", 8, 8), T1("h.0.attn.proj.bias", 8),
                            T2("h.0.mlp.fc.weight", 32, 8), T2("h.0.mlp.proj.weight", 8, 32), T1("ln_f.weight", 8)};
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  c.naming = STAB_NAMING_LLMC;
  build(&md, sp, sizeof sp / sizeof sp[0], &c);
  expect(&md, "wte", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 50, 8);
  expect(&md, "h.0.attn.q", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  ck_assert_ptr_eq(entry(&md, "h.0.attn.q")->bias, &md.t[7]);
  ck_assert_ptr_eq(entry(&md, "h.0.attn.proj")->bias, &md.t[11]);
  expect(&md, "h.0.mlp.fc", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 32);
  expect(&md, "h.0.mlp.proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 32, 8);
  expect_attention(&md, "h.0.attn.logits", 4, 5, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 0);
  ck_assert_ptr_eq(entry(&md, "lm_head")->weight, &md.t[0]);
  stab_model_free(md.m);
  c.naming = STAB_NAMING_HF;
  build(&md, sp, sizeof sp / sizeof sp[0], &c);
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_ATTENTION), 0);
  stab_model_free(md.m);
}
END_TEST

/* Llama/Mistral (GQA: 4 heads of 4, 2 key heads) and Qwen2 (q/k/v biases). d 16, ff 24, V 40. */
static const spec llama[] = {
    T2("model.embed_tokens.weight", 40, 16),
    T1("model.layers.0.input_layernorm.weight", 16),
    T2("model.layers.0.self_attn.q_proj.weight", 16, 16),
    T2("model.layers.0.self_attn.k_proj.weight", 8, 16),
    T2("model.layers.0.self_attn.v_proj.weight", 8, 16),
    T2("model.layers.0.self_attn.o_proj.weight", 16, 16),
    T1("model.layers.0.post_attention_layernorm.weight", 16),
    T2("model.layers.0.mlp.gate_proj.weight", 24, 16),
    T2("model.layers.0.mlp.up_proj.weight", 24, 16),
    T2("model.layers.0.mlp.down_proj.weight", 16, 24),
    T1("model.norm.weight", 16),
    T2("lm_head.weight", 40, 16),
    /* Qwen2's */
    T1("model.layers.0.self_attn.q_proj.bias", 16),
    T1("model.layers.0.self_attn.k_proj.bias", 8),
    T1("model.layers.0.self_attn.v_proj.bias", 8)};
enum { N_LLAMA = sizeof llama / sizeof llama[0] };

START_TEST(test_llama_qwen2_gqa) {
  model md;
  stab_model_config c = heads_config(4, 0, 0);
  build(&md, llama, N_LLAMA, &c);
  ck_assert_uint_eq(stab_model_count(md.m), 15 - 3 + 1); /* three biases folded, one attention, no tie */
  expect(&md, "model.embed_tokens", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 40, 16);
  expect(&md, "model.layers.0.input_layernorm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 16, 16);
  expect(&md, "model.layers.0.post_attention_layernorm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 16, 16);
  expect(&md, "model.norm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 16, 16);
  expect(&md, "model.layers.0.self_attn.k_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 8);
  expect(&md, "model.layers.0.mlp.down_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 24, 16);
  expect(&md, "lm_head", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 16, 40);
  ck_assert_int_eq(entry(&md, "lm_head")->tied, 0);
  ck_assert_ptr_eq(entry(&md, "model.layers.0.self_attn.q_proj")->bias, &md.t[12]);
  ck_assert_ptr_eq(entry(&md, "model.layers.0.self_attn.k_proj")->bias, &md.t[13]);
  ck_assert_ptr_eq(entry(&md, "model.layers.0.self_attn.v_proj")->bias, &md.t[14]);
  expect_attention(&md, "model.layers.0.self_attn.logits", 2, 3, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 0);
  stab_model_free(md.m);
  /* key heads given: must agree with the key's width */
  c = heads_config(4, 2, 4);
  build(&md, llama, N_LLAMA, &c);
  expect_attention(&md, "model.layers.0.self_attn.logits", 2, 3, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 0);
  stab_model_free(md.m);
  c = heads_config(4, 4, 0);
  build(&md, llama, N_LLAMA, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "the test's num_key_value_heads 4 (of width 4) does not match the key width 8");
  stab_model_free(md.m);
  /* heads that do not divide, and none at all */
  c = heads_config(3, 0, 0);
  build(&md, llama, N_LLAMA, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "3 heads (from the test) do not divide the query width 16");
  stab_model_free(md.m);
  build(&md, llama, N_LLAMA, NULL);
  expect_not(&md, "model.layers.0.self_attn.logits", "no head count");
  stab_model_free(md.m);
  c = stab_model_default_config();
  c.heads_error = "__metadata__ heads is 'x'";
  build(&md, llama, N_LLAMA, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "__metadata__ heads is 'x'");
  stab_model_free(md.m);
}
END_TEST

/* Gemma: no lm_head tensor (tied), head_dim 16 with d 24 (not d / heads), norm gains. */
START_TEST(test_gemma_tied_head_dim) {
  static const spec sp[] = {T2("model.embed_tokens.weight", 40, 24),
                            T1("model.layers.0.input_layernorm.weight", 24),
                            T2("model.layers.0.self_attn.q_proj.weight", 32, 24),
                            T2("model.layers.0.self_attn.k_proj.weight", 16, 24),
                            T2("model.layers.0.self_attn.v_proj.weight", 16, 24),
                            T2("model.layers.0.self_attn.o_proj.weight", 24, 32),
                            T1("model.norm.weight", 24)};
  enum { N = sizeof sp / sizeof sp[0] };
  model md;
  stab_model_config c = heads_config(2, 1, 16);
  build(&md, sp, N, &c);
  expect_attention(&md, "model.layers.0.self_attn.logits", 2, 3, STAB_LAYOUT_OUT_MAJOR, 24, 32, 2, 1, 24, 0);
  expect(&md, "model.layers.0.self_attn.o_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 32, 24);
  expect(&md, "model.norm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 24, 24);
  expect(&md, "lm_head", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 24, 40);
  ck_assert_int_eq(entry(&md, "lm_head")->tied, 1);
  ck_assert_ptr_eq(entry(&md, "lm_head")->weight, &md.t[0]);
  stab_model_free(md.m);
  /* a head_dim that the query is not made of */
  c = heads_config(2, 0, 12);
  build(&md, sp, N, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "the test's head_dim 12 times 2 heads is not the query width 32");
  stab_model_free(md.m);
  /* the config says untied: no head invented, and the model says it has none */
  c = heads_config(2, 0, 0);
  c.tie = 0;
  build(&md, sp, N, &c);
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_LM_HEAD), 0);
  ck_assert_int_eq(stab_model_has_head(md.m), 0);
  stab_model_free(md.m);
  /* one shard alone: the head is in another shard (a name, no tensor): not tied either */
  static const char *const elsewhere[] = {"model.layers.9.mlp.up_proj.weight", "lm_head.weight"};
  c = heads_config(2, 0, 0);
  c.other_names = elsewhere, c.n_other = 2;
  build(&md, sp, N, &c);
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_LM_HEAD), 0);
  ck_assert_int_eq(stab_model_has_head(md.m), 1);
  stab_model_free(md.m);
  c.n_other = 1; /* the other shard has no head: tied */
  build(&md, sp, N, &c);
  ck_assert_int_eq(entry(&md, "lm_head")->tied, 1);
  ck_assert_int_eq(stab_model_has_head(md.m), 0);
  stab_model_free(md.m);
  /* config.json's numbers: the head count brings its key heads and head_dim; tie as it says */
  stab_hf_config hf;
  memset(&hf, 0, sizeof hf);
  hf.num_attention_heads = 2, hf.num_key_value_heads = 1, hf.head_dim = 16, hf.tie_word_embeddings = 0;
  c = stab_model_default_config();
  ck_assert_int_eq(stab_model_config_from_hf(&hf, &c), STAB_OK);
  ck_assert_uint_eq(c.heads, 2);
  ck_assert_uint_eq(c.kv_heads, 1);
  ck_assert_uint_eq(c.head_dim, 16);
  ck_assert_int_eq(c.tie, 0);
  ck_assert_str_eq(c.heads_source, "config.json");
  c = heads_config(4, 0, 0); /* a user's count stays, without config.json's key heads */
  ck_assert_int_eq(stab_model_config_from_hf(&hf, &c), STAB_OK);
  ck_assert_uint_eq(c.heads, 4);
  ck_assert_uint_eq(c.kv_heads, 0);
  hf.num_attention_heads = STAB_MODEL_MAX_HEADS + 1;
  c = stab_model_default_config();
  ck_assert_int_eq(stab_model_config_from_hf(&hf, &c), STAB_ERANGE);
  ck_assert_uint_eq(c.heads, 0);
}
END_TEST

/* Phi-3: qkv_proj of (4 heads + 2 x 2 key heads) x 4 rows; gate_up_proj [2 ff][d] a linear. */
START_TEST(test_phi3_fused_gqa) {
  static const spec sp[] = {T2("model.embed_tokens.weight", 40, 16),
                            T2("model.layers.0.self_attn.qkv_proj.weight", 32, 16),
                            T2("model.layers.0.self_attn.o_proj.weight", 16, 16),
                            T2("model.layers.0.mlp.gate_up_proj.weight", 48, 16),
                            T2("model.layers.0.mlp.down_proj.weight", 16, 24),
                            T2("lm_head.weight", 40, 16)};
  enum { N = sizeof sp / sizeof sp[0] };
  model md;
  stab_model_config c = heads_config(4, 2, 0);
  build(&md, sp, N, &c);
  expect_part(&md, "model.layers.0.self_attn.qkv_proj.q", 1, 1, STAB_LAYOUT_OUT_MAJOR, 16, 16, 0, 0, NULL, 0);
  expect_part(&md, "model.layers.0.self_attn.qkv_proj.k", 1, 2, STAB_LAYOUT_OUT_MAJOR, 16, 8, 16 * 16, 0, NULL, 0);
  expect_part(&md, "model.layers.0.self_attn.qkv_proj.v", 1, 3, STAB_LAYOUT_OUT_MAJOR, 16, 8, 24 * 16, 0, NULL, 0);
  expect(&md, "model.layers.0.mlp.gate_up_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 48);
  /* q: rows 0-15, k: rows 16-23 (16 rows of 16 in) */
  expect_attention(&md, "model.layers.0.self_attn.logits", 1, 1, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 16 * 16);
  stab_model_free(md.m);
  c = heads_config(4, 0, 4); /* head_dim instead of key heads: the same split */
  build(&md, sp, N, &c);
  expect_part(&md, "model.layers.0.self_attn.qkv_proj.v", 1, 3, STAB_LAYOUT_OUT_MAJOR, 16, 8, 24 * 16, 0, NULL, 0);
  expect_attention(&md, "model.layers.0.self_attn.logits", 1, 1, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 16 * 16);
  stab_model_free(md.m);
  c = heads_config(4, 0, 0); /* neither: three equal parts, which 32 rows are not */
  build(&md, sp, N, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "d_out 32 is not three equal parts");
  expect(&md, "model.layers.0.self_attn.qkv_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 32); /* one layer */
  stab_model_free(md.m);
  c = heads_config(4, 3, 0);
  build(&md, sp, N, &c);
  expect_not(&md, "model.layers.0.self_attn.logits", "is not (4 heads + 2 x 3 key heads)");
  stab_model_free(md.m);
}
END_TEST

/* A layer of n experts named name, whose expert entries follow it in order, named
 * expert_fmt (with %zu) and reading the tensors want[] (NULL: views of the 3-D tensor t3). */
static void expect_experts(const model *md, const char *name, size_t n, const char *expert_fmt, const size_t *ids,
                           const size_t *want, const stab_ckpt_tensor *t3) {
  const stab_model_entry *g = entry(md, name);
  ck_assert_msg(!g->why_not, "%s: %s", name, g->why_not);
  ck_assert_uint_eq(g->n_expert, n);
  ck_assert_uint_eq(g->expert, STAB_MODEL_NO_EXPERT);
  size_t gi = (size_t)(g - stab_model_entry_at(md->m, 0));
  stab_layer L;
  ck_assert_int_eq(stab_model_entry_layer(g, STAB_DTYPE_F32, md, NULL, NULL, &L), STAB_EINVAL);
  for (size_t x = 0; x < n; x++) {
    const stab_model_entry *e = stab_model_entry_at(md->m, gi + 1 + x);
    char want_name[200];
    snprintf(want_name, sizeof want_name, expert_fmt, ids ? ids[x] : x);
    ck_assert_str_eq(e->name, want_name);
    ck_assert_uint_eq(e->expert, ids ? ids[x] : x);
    ck_assert_uint_eq(e->group, gi);
    ck_assert_uint_eq(e->n_expert, 0);
    ck_assert_int_eq(e->kind, STAB_KIND_LINEAR);
    ck_assert_uint_eq(e->d_in, g->d_in);
    ck_assert_uint_eq(e->d_out, g->d_out);
    if (want) {
      ck_assert_ptr_eq(e->weight, &md->t[want[x]]);
    } else {
      /* a 2-D view of slice x: same name, its own place in the file */
      ck_assert_ptr_eq(e->weight->name, t3->name);
      ck_assert_uint_eq(e->weight->ndim, 2);
      ck_assert_uint_eq(e->weight->shape[0], t3->shape[1]);
      ck_assert_uint_eq(e->weight->shape[1], t3->shape[2]);
      ck_assert_uint_eq(e->weight->count, t3->shape[1] * t3->shape[2]);
      uint64_t bytes = stab_ckpt_nbytes(t3) / t3->shape[0];
      ck_assert_uint_eq(e->weight->offset, t3->offset + x * bytes);
      if (t3->data) ck_assert_ptr_eq(e->weight->data, t3->data + x * bytes);
      else ck_assert_ptr_null(e->weight->data);
    }
  }
}

/* Mixtral: the router block_sparse_moe.gate [E][d] is linear; experts.E.w1/w2/w3 are layers of
 * experts per projection; Qwen2-MoE's mlp.experts.E.*_proj likewise, its shared_expert and
 * router mlp.gate ordinary linears. */
START_TEST(test_mixtral_router_experts) {
  static const spec sp[] = {T2("model.layers.0.block_sparse_moe.gate.weight", 4, 16),
                            T2("model.layers.0.block_sparse_moe.experts.0.w1.weight", 24, 16),
                            T2("model.layers.0.block_sparse_moe.experts.0.w2.weight", 16, 24),
                            T2("model.layers.0.block_sparse_moe.experts.0.w3.weight", 24, 16),
                            T2("model.layers.0.block_sparse_moe.experts.10.w2.weight", 16, 24),
                            T2("model.layers.0.block_sparse_moe.experts.2.w2.weight", 16, 24),
                            T2("model.layers.1.mlp.gate.weight", 4, 16),
                            T2("model.layers.1.mlp.experts.1.gate_proj.weight", 24, 16),
                            T2("model.layers.1.mlp.experts.0.gate_proj.weight", 24, 16),
                            T2("model.layers.1.mlp.shared_experts.gate_proj.weight", 24, 16),
                            T2("model.layers.1.mlp.experts.2.gate_proj.weight", 20, 16)};
  model md;
  build(&md, sp, sizeof sp / sizeof sp[0], NULL);
  /* 11 tensors, 4 layers of experts (w1, w2, w3, and the 2 gate_proj of one shape); the odd
   * gate_proj of another shape a linear of its own */
  ck_assert_uint_eq(stab_model_count(md.m), 11 + 4);
  expect(&md, "model.layers.1.mlp.experts.2.gate_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 20);
  ck_assert_uint_eq(entry(&md, "model.layers.1.mlp.experts.2.gate_proj")->expert, STAB_MODEL_NO_EXPERT);
  expect(&md, "model.layers.0.block_sparse_moe.gate", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 4);
  expect(&md, "model.layers.1.mlp.gate", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 4);
  expect(&md, "model.layers.1.mlp.shared_experts.gate_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 24);
  ck_assert_uint_eq(entry(&md, "model.layers.1.mlp.shared_experts.gate_proj")->expert, STAB_MODEL_NO_EXPERT);
  expect(&md, "model.layers.0.block_sparse_moe.experts.w2", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 24, 16);
  expect_experts(&md, "model.layers.0.block_sparse_moe.experts.w2", 3, "model.layers.0.block_sparse_moe.experts.%zu.w2",
                 (const size_t[]){0, 2, 10}, (const size_t[]){2, 5, 4}, NULL);
  expect_experts(&md, "model.layers.0.block_sparse_moe.experts.w1", 1, "model.layers.0.block_sparse_moe.experts.%zu.w1",
                 NULL, (const size_t[]){1}, NULL);
  expect_experts(&md, "model.layers.1.mlp.experts.gate_proj", 2, "model.layers.1.mlp.experts.%zu.gate_proj", NULL,
                 (const size_t[]){8, 7}, NULL);
  /* the layer stands where its first expert tensor was: after the router */
  ck_assert_str_eq(stab_model_entry_at(md.m, 1)->name, "model.layers.0.block_sparse_moe.experts.w1");
  stab_model_free(md.m);
}
END_TEST

/* llama.cpp's GGUF names: token_embd, blk.N.attn_*, ffn_*, *_norm gains, output or tied; types
 * not read listed with their name; 3-D tensors without a rule listed as such. */
static const spec gguf[] = {T2("token_embd.weight", 40, 16),
                            T1("blk.0.attn_norm.weight", 16),
                            {"blk.0.attn_q.weight", STAB_DTYPE_QUANT, 2, {16, 16, 0}},
                            T2("blk.0.attn_k.weight", 8, 16),
                            T2("blk.0.attn_v.weight", 8, 16),
                            T2("blk.0.attn_output.weight", 16, 16),
                            T1("blk.0.ffn_norm.weight", 16),
                            T2("blk.0.ffn_gate.weight", 24, 16),
                            {"blk.0.ffn_down.weight", STAB_DTYPE_OTHER, 2, {16, 24, 0}},
                            {"blk.1.ffn_up_exps.weight", STAB_DTYPE_F32, 3, {4, 24, 16}},
                            {"blk.1.ffn_gate_inp.weight", STAB_DTYPE_F32, 2, {4, 16}},
                            {"blk.1.conv.weight", STAB_DTYPE_F32, 3, {4, 3, 16}},
                            {"blk.1.ffn_down_exps.weight", STAB_DTYPE_QUANT, 3, {2, 16, 256}},
                            T1("output_norm.weight", 16),
                            T2("output.weight", 40, 16)};
enum { N_GGUF = sizeof gguf / sizeof gguf[0] };

START_TEST(test_gguf_llama_cpp) {
  model md;
  stab_model_config c = heads_config(4, 0, 0);
  c.naming = STAB_NAMING_GGUF;
  build(&md, gguf, N_GGUF, &c);
  expect(&md, "token_embd", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 40, 16);
  expect(&md, "blk.0.attn_norm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 16, 16);
  expect(&md, "blk.0.attn_q", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 16);
  expect(&md, "blk.0.attn_output", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 16);
  expect(&md, "output_norm", STAB_KIND_GAIN, STAB_LAYOUT_NATURAL, 16, 16);
  expect(&md, "output", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 16, 40);
  expect_attention(&md, "blk.0.attn_logits", 2, 3, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 0);
  expect_not(&md, "blk.0.ffn_down.weight", "unsupported GGML type Q8_1");
  /* [4][24][16]: four out-major experts 16 -> 24, slices of the tensor */
  expect(&md, "blk.1.ffn_up_exps", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 24);
  expect_experts(&md, "blk.1.ffn_up_exps", 4, "blk.1.ffn_up_exps.%zu", NULL, NULL, &md.t[9]);
  expect(&md, "blk.1.ffn_up_exps.3", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 24);
  /* Q4_K: 16 rows of 256 per expert, 144 bytes a block */
  expect_experts(&md, "blk.1.ffn_down_exps", 2, "blk.1.ffn_down_exps.%zu", NULL, NULL, &md.t[12]);
  ck_assert_uint_eq(entry(&md, "blk.1.ffn_down_exps.1")->weight->offset, md.t[12].offset + 16 * 144);
  expect(&md, "blk.1.ffn_gate_inp", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 4);
  expect_not(&md, "blk.1.conv.weight", "a 3-D tensor that is not an expert tensor by name (*_exps): no rule for it");
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_LM_HEAD), 1);
  stab_model_free(md.m);
  /* a head of a type not read still means not tied; without output.weight, token_embd is */
  spec sp[N_GGUF];
  memcpy(sp, gguf, sizeof sp);
  sp[N_GGUF - 1].dtype = STAB_DTYPE_OTHER;
  build(&md, sp, N_GGUF, &c);
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_LM_HEAD), 0);
  expect_not(&md, "output.weight", "unsupported GGML type");
  stab_model_free(md.m);
  build(&md, gguf, N_GGUF - 1, &c);
  expect(&md, "lm_head", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 16, 40);
  ck_assert_ptr_eq(entry(&md, "lm_head")->weight, &md.t[0]);
  stab_model_free(md.m);
}
END_TEST

/* Expert counts past the bounds: one tensor's, and the model's in all (32 layers' worth). */
START_TEST(test_expert_bounds) {
  static stab_ckpt_tensor t[34];
  const stab_ckpt_tensor *p[34];
  static char names[34][40];
  for (size_t i = 0; i < 34; i++) {
    snprintf(names[i], sizeof names[i], "blk.%zu.ffn_up_exps.weight", i);
    t[i] = (stab_ckpt_tensor){.name = names[i], .dtype = STAB_DTYPE_F32, .dtype_name = "F32", .elem_size = 4,
                              .ndim = 3, .shape = {STAB_MODEL_MAX_EXPERTS, 1, 2}, .count = 2 * STAB_MODEL_MAX_EXPERTS};
    p[i] = &t[i];
  }
  t[0].shape[0] = STAB_MODEL_MAX_EXPERTS + 1, t[0].count = 2 * (STAB_MODEL_MAX_EXPERTS + 1);
  model md = {.m = NULL};
  ck_assert_int_eq(stab_model_describe(p, 34, NULL, &md.m), STAB_OK);
  expect_not(&md, "blk.0.ffn_up_exps.weight", "4097 experts: more than the 4096 a layer may have");
  for (size_t i = 1; i <= 32; i += 31) {
    char nm[40];
    snprintf(nm, sizeof nm, "blk.%zu.ffn_up_exps", i);
    ck_assert_uint_eq(entry(&md, nm)->n_expert, STAB_MODEL_MAX_EXPERTS);
  }
  expect_not(&md, "blk.33.ffn_up_exps.weight", "the model's 3-D tensors would have more than 131072");
  ck_assert_uint_eq(stab_model_count(md.m), 34 + 32 * STAB_MODEL_MAX_EXPERTS);
  stab_model_free(md.m);
}
END_TEST

/* Overrides and the names: skip, a kind that does not fit, a kind forced on a 2-D tensor, a
 * name that clashes, a bias of the wrong width, a 1-D tensor no rule names, a scalar, an empty
 * tensor, a tied head when the file has an lm_head named by an override. */
START_TEST(test_overrides_and_names) {
  static const spec sp[] = {T2("wte.weight", 50, 8), T2("wpe.weight", 16, 8), T1("ln_f.weight", 8),
                            T2("x", 8, 8),           T2("x.weight", 8, 8),   T1("fc.bias", 7),
                            T2("fc.weight", 8, 8),   T1("scale", 8),         {"step", STAB_DTYPE_F32, 0, {0}},
                            T2("emptyw", 0, 8),      T2("proj.weight", 8, 8)};
  enum { N = sizeof sp / sizeof sp[0] };
  stab_model_override kinds[] = {{"wpe.weight", "skip"}, {"ln_f.weight", "linear"}, {"proj.weight", "lm_head"}};
  stab_model_config c = stab_model_default_config();
  c.kinds = kinds, c.nkinds = 3;
  model md;
  build(&md, sp, N, &c);
  expect_not(&md, "wpe.weight", "skipped by --kind");
  expect_not(&md, "ln_f.weight", "--kind linear does not fit a 1-D tensor");
  /* "x" and "x.weight" both exist: the stripped name would clash, so x.weight keeps its own */
  expect(&md, "x", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  expect(&md, "x.weight", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  /* fc.bias is 7 wide, fc.weight's d_out 8: not folded, a bias of its own keeping .bias */
  expect(&md, "fc.bias", STAB_KIND_BIAS, STAB_LAYOUT_NATURAL, 7, 7);
  ck_assert_ptr_null(entry(&md, "fc")->bias);
  expect_not(&md, "scale", "neither a norm gain nor a bias by name");
  expect_not(&md, "step", "a scalar tensor");
  expect_not(&md, "emptyw", "an empty tensor");
  /* proj is an lm_head by override: the model has a head, so wte is not tied */
  expect(&md, "proj", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 8, 8);
  ck_assert_uint_eq(count_kind(&md, STAB_KIND_LM_HEAD), 1);
  stab_model_free(md.m);
  /* an lm_head tensor overridden to something else does not count as the head: wte is tied,
   * and named wte.lm_head because "lm_head" is taken by a tensor of that name */
  static const spec sp2[] = {T2("wte.weight", 50, 8), T2("lm_head", 8, 8)};
  stab_model_override k2[] = {{"lm_head", "linear"}};
  c.kinds = k2, c.nkinds = 1;
  build(&md, sp2, 2, &c);
  expect(&md, "lm_head", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  expect(&md, "wte.lm_head", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 8, 50);
  ck_assert_int_eq(entry(&md, "wte.lm_head")->tied, 1);
  stab_model_free(md.m);
}
END_TEST

/* A trainer registering by name: the entries' layers measure what the hand-written layers of
 * stabmeter.h's examples measure (a linear with its bias, GPT-2's fused in-major attention),
 * and a GQA head's layer reads its group's key head. */
/* The flow docs/manual/instrumenting.md shows a trainer ("Registering layers by name"): its HF GPT-2
 * parameters described as stab_ckpt_tensors over its own buffers, every measured entry
 * registered in a monitor through stab_model_entry_layer, one measurement. Every entry must be
 * accepted (names unique, sizes consistent), and each layer's metrics must be those of the
 * layer written by hand: the Conv1D c_attn's k block in-major (columns 8-15 of rows of 24) with
 * its third of the bias, the tied head as a table of
 * V = 50 rows of width 8, the attention pair inside the fused c_attn (k 8 columns in). */
START_TEST(test_register_by_name) {
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, gpt2_hf, N_GPT2, &c);
  float *buf[N_GPT2];
  tu_rng rng;
  tu_rng_init(&rng, 7);
  for (size_t i = 0; i < N_GPT2; i++) {
    size_t n = (size_t)md.t[i].count;
    ck_assert_ptr_nonnull(buf[i] = malloc(n * sizeof(float)));
    tu_fill_gauss(buf[i], 1, n, n, 0.2, &rng);
    md.t[i].data = (const unsigned char *)buf[i];
  }
  stab_model_free(md.m);
  ck_assert_int_eq(stab_model_describe(md.p, N_GPT2, &c, &md.m), STAB_OK); /* over the buffers */
  stab_monitor_params mp = stab_monitor_default_params();
  mp.update_mode = STAB_UPDATE_NONE;
  stab_monitor *mon;
  ck_assert_int_eq(stab_monitor_create(&mp, &mon), STAB_OK);
  size_t registered = 0, measured = 0;
  for (size_t i = 0; i < stab_model_count(md.m); i++) {
    const stab_model_entry *e = stab_model_entry_at(md.m, i);
    if (e->why_not) continue;
    measured++;
    stab_layer L;
    ck_assert_int_eq(stab_model_entry_layer(e, STAB_DTYPE_F32, e->weight->data, e->bias ? e->bias->data : NULL,
                                            e->weight_k ? e->weight_k->data : NULL, &L),
                     STAB_OK);
    ck_assert_msg(stab_monitor_add_layer(mon, &L, NULL) == STAB_OK, "%s: %s", e->name, stab_last_error());
    registered++;
  }
  ck_assert_uint_eq(registered, measured);
  ck_assert_uint_ge(registered, 10); /* 2 tables, 4 linears, 5 norm pairs' gains and shifts, logits, head */
  ck_assert_int_eq(stab_monitor_measure(mon, 0), STAB_OK);
  const float *w = buf[4], *b = buf[5], *wte = buf[0];
  stab_layer want[] = {
      {.name = "c_attn.k", .kind = STAB_KIND_LINEAR, .d_in = 8, .d_out = 8, .layout = STAB_LAYOUT_IN_MAJOR,
       .ld = 24, .weight = w + 8, .bias = b + 8},
      {.name = "head", .kind = STAB_KIND_LM_HEAD, .vocab = 50, .width = 8, .weight = wte},
      {.name = "logits", .kind = STAB_KIND_ATTENTION, .d_in = 8, .d_out = 8, .layout = STAB_LAYOUT_IN_MAJOR,
       .ld = 24, .weight = w, .weight_k = w + 8, .heads = 2}};
  const char *names[] = {"transformer.h.0.attn.c_attn.k", "lm_head", "transformer.h.0.attn.logits"};
  for (size_t k = 0; k < 3; k++) {
    size_t idx;
    ck_assert_msg(stab_monitor_find(mon, names[k], &idx) == STAB_OK, "no layer %s", names[k]);
    stab_metrics ref;
    ck_assert_int_eq(stab_layer_metrics(&want[k], NULL, NULL, &ref, NULL), STAB_OK);
    const stab_metrics *got = stab_monitor_metrics(mon, idx);
    ck_assert_msg(fabs(got->forward - ref.forward) <= 1e-6 * fabs(ref.forward), "%s forward %.9g, by hand %.9g",
                  names[k], got->forward, ref.forward);
  }
  stab_monitor_free(mon);
  stab_model_free(md.m);
  for (size_t i = 0; i < N_GPT2; i++) free(buf[i]);
}
END_TEST

START_TEST(test_entry_layers) {
  tu_rng rng;
  tu_rng_init(&rng, 12);
  const size_t C = 8, H = 2;
  float *w = tu_floats(C * 3 * C), *b = tu_floats(3 * C);
  tu_fill_gauss(w, C, 3 * C, 3 * C, 0.3, &rng);
  tu_fill_gauss(b, 1, 3 * C, 3 * C, 0.1, &rng);
  static const spec sp[] = {T2("h.0.attn.c_attn.weight", 8, 24), T1("h.0.attn.c_attn.bias", 24)};
  model md;
  stab_model_config c = heads_config(H, 0, 0);
  build(&md, sp, 2, &c);
  md.t[0].data = (const unsigned char *)w, md.t[1].data = (const unsigned char *)b;
  const stab_model_entry *lin = entry(&md, "h.0.attn.c_attn.v"), *att = entry(&md, "h.0.attn.logits");
  stab_layer L, ref;
  stab_metrics m1, m2;
  ck_assert_int_eq(stab_model_entry_layer(lin, STAB_DTYPE_F32, w, b, NULL, &L), STAB_OK);
  ref = (stab_layer){.name = "h.0.attn.c_attn.v", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C,
                     .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C, .weight = w + 2 * C, .bias = b + 2 * C};
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, NULL, &m1, NULL), STAB_OK);
  ck_assert_int_eq(stab_layer_metrics(&ref, NULL, NULL, &m2, NULL), STAB_OK);
  ck_assert_double_eq(m1.forward, m2.forward);
  ck_assert_double_eq(m1.dependency, m2.dependency);
  double hb1[2], hb2[2];
  ck_assert_int_eq(stab_model_entry_layer(att, STAB_DTYPE_F32, w, NULL, w, &L), STAB_OK);
  ref = (stab_layer){.name = "a", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .layout = STAB_LAYOUT_IN_MAJOR,
                     .ld = 3 * C, .weight = w, .weight_k = w + C, .heads = H};
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, NULL, &m1, hb1), STAB_OK);
  ck_assert_int_eq(stab_layer_metrics(&ref, NULL, NULL, &m2, hb2), STAB_OK);
  ck_assert_double_eq(m1.forward, m2.forward);
  ck_assert_double_eq(hb1[1], hb2[1]);
  /* the same entry over 16-bit data: the offsets into the fused tensor count 2-byte elements */
  ck_assert_int_eq(stab_model_entry_layer(att, STAB_DTYPE_BF16, w, NULL, w, &L), STAB_OK);
  ck_assert_int_eq(L.dtype, STAB_DTYPE_BF16);
  ck_assert_ptr_eq(L.weight, w);
  ck_assert_ptr_eq((const void *)L.weight_k, (const void *)((const unsigned char *)w + C * 2));
  ck_assert_int_eq(stab_model_entry_layer(att, STAB_DTYPE_QUANT, w, NULL, w, &L), STAB_EINVAL);
  stab_model_free(md.m);
  build(&md, llama, N_LLAMA, &(stab_model_config){.heads = 4, .tie = -1});
  att = entry(&md, "model.layers.0.self_attn.logits");
  float q[16 * 16], k[8 * 16];
  tu_fill_gauss(q, 16, 16, 16, 0.2, &rng);
  tu_fill_gauss(k, 8, 16, 16, 0.3, &rng);
  /* grouped-query: one layer with kv_heads, each head's bound s d_h (f sigma(q_h)) (f sigma(k_g))
   * with g = h / 2, f = sqrt(d / d_h), by LAPACK */
  ck_assert_int_eq(stab_model_entry_layer(att, STAB_DTYPE_F32, q, NULL, k, &L), STAB_OK);
  ck_assert_uint_eq(L.kv_heads, 2);
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.method = STAB_SPECTRAL_EXACT;
  double hb[4];
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, &mp, &m1, hb), STAB_OK);
  double worst = 0;
  for (size_t hh = 0; hh < 4; hh++) {
    double dh = 4, f = sqrt(16 / dh);
    double want = dh / sqrt(dh) * f * ref_sigma(q + hh * 4 * 16, 4, 16, 16) * f * ref_sigma(k + hh / 2 * 4 * 16, 4, 16, 16);
    ck_assert_msg(fabs(hb[hh] - want) <= 1e-12 * want, "head %zu: %.17g, LAPACK %.17g", hh, hb[hh], want);
    worst = fmax(worst, want);
  }
  ck_assert_double_eq_tol(m1.forward, worst, 1e-12 * worst);
  /* each key head is measured once, not once per query head that reads it: the passes are
   * those of 4 query blocks and 2 key blocks */
  stab_metrics_params lp = stab_metrics_default_params();
  ck_assert_int_eq(stab_layer_metrics(&L, NULL, &lp, &m1, hb), STAB_OK);
  int want_passes = 0;
  for (size_t b = 0; b < 6; b++) {
    stab_sigma_result one;
    ck_assert_int_eq(stab_sigma(b < 4 ? q + b * 4 * 16 : k + (b - 4) * 4 * 16, 4, 16, 16, &lp.spectral, NULL, &one), STAB_OK);
    want_passes += one.passes;
  }
  ck_assert_msg(m1.passes == want_passes, "GQA: %d passes, the 6 blocks' own take %d", m1.passes, want_passes);
  ck_assert_double_eq_tol(m1.forward, worst, 2e-3 * worst);
  ck_assert_int_eq(stab_model_entry_layer(entry(&md, "model.norm"), STAB_DTYPE_F32, NULL, NULL, NULL, &L), STAB_EINVAL);
  stab_model_free(md.m);
  stab_model *none;
  ck_assert_int_eq(stab_model_describe(NULL, 1, NULL, &none), STAB_EINVAL);
  ck_assert_ptr_null(none);
  const stab_ckpt_tensor *nul = NULL;
  ck_assert_int_eq(stab_model_describe(&nul, 1, NULL, &none), STAB_EINVAL);
  ck_assert_int_eq(stab_model_describe(NULL, 0, NULL, &none), STAB_OK);
  ck_assert_uint_eq(stab_model_count(none), 0);
  stab_model_free(none);
  stab_model_free(NULL);
  free(w), free(b);
}
END_TEST

/* ---- fused q, k, v split into three linear layers -------------------------------------- */

/* The part of a fused q/k/v entry: its block of the tensor and slice of the bias. */
static void expect_part(const model *md, const char *name, size_t tensor, int part, stab_layout layout, size_t d_in,
                        size_t d_out, size_t offset, size_t ld, const stab_ckpt_tensor *bias, size_t bias_offset) {
  expect(md, name, STAB_KIND_LINEAR, layout, d_in, d_out);
  const stab_model_entry *e = entry(md, name);
  ck_assert_ptr_eq(e->weight, &md->t[tensor]);
  ck_assert_int_eq(e->part, part);
  ck_assert_uint_eq(e->offset, offset);
  ck_assert_uint_eq(e->ld, ld);
  ck_assert_ptr_eq(e->bias, bias);
  ck_assert_uint_eq(e->bias_offset, bias ? bias_offset : 0);
}

/* The layer of entry e over w and b (f32) measured exactly: its sigma against LAPACK's of the
 * block [rows][cols] at block with row stride ld (the stored block: in-major rows are inputs),
 * and its forward against sqrt(d_in/d_out) sigma + ||bias slice||_RMS in double. */
static void expect_block_metrics(const stab_model_entry *e, const float *w, const float *b, const float *block,
                                 size_t rows, size_t cols, size_t ld, const float *bslice) {
  stab_layer L;
  ck_assert_int_eq(stab_model_entry_layer(e, STAB_DTYPE_F32, w, b, NULL, &L), STAB_OK);
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.method = STAB_SPECTRAL_EXACT;
  stab_metrics m;
  ck_assert_msg(stab_layer_metrics(&L, NULL, &mp, &m, NULL) == STAB_OK, "%s: %s", e->name, stab_last_error());
  double sigma = ref_sigma(block, rows, cols, ld), rms = 0;
  for (size_t i = 0; bslice && i < e->d_out; i++) rms += (double)bslice[i] * bslice[i];
  rms = sqrt(rms / (double)e->d_out);
  double fwd = sqrt((double)e->d_in / (double)e->d_out) * sigma + rms;
  ck_assert_msg(fabs(m.sigma - sigma) <= 1e-9 * sigma, "%s: sigma %.17g, LAPACK %.17g", e->name, m.sigma, sigma);
  ck_assert_msg(fabs(m.forward - fwd) <= 1e-9 * fwd, "%s: forward %.17g, by hand %.17g", e->name, m.forward, fwd);
}

/* Gaussian data for every tensor of md (freed by free_data), then described again over it. */
static float **with_data(model *md, size_t n, const stab_model_config *c, unsigned seed) {
  float **buf = malloc(n * sizeof *buf);
  tu_rng rng;
  tu_rng_init(&rng, seed);
  for (size_t i = 0; i < n; i++) {
    size_t k = (size_t)md->t[i].count;
    buf[i] = tu_floats(k ? k : 1);
    tu_fill_gauss(buf[i], 1, k, k, 0.3, &rng);
    md->t[i].data = (const unsigned char *)buf[i];
  }
  stab_model_free(md->m);
  ck_assert_int_eq(stab_model_describe(md->p, n, c, &md->m), STAB_OK);
  return buf;
}
static void free_data(float **buf, size_t n) {
  for (size_t i = 0; i < n; i++) free(buf[i]);
  free(buf);
}

/* HF GPT-2's Conv1D c_attn [C][3C] in-major with its bias [3C]: q, k, v are column blocks of
 * the stored rows (ld 3C, offsets 0, C, 2C), their biases the thirds; nanoGPT's out-major
 * [3C][C]: row blocks (offsets 0, C*C, 2*C*C, ld 0). The attention entry stays as it was. */
START_TEST(test_fused_c_attn_split) {
  const size_t C = 8;
  static const spec in_major[] = {T2("h.0.attn.c_attn.weight", 8, 24), T1("h.0.attn.c_attn.bias", 24),
                                  T2("h.0.attn.c_proj.weight", 8, 8)};
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, in_major, 3, &c);
  float **buf = with_data(&md, 3, &c, 31);
  /* c_attn's one entry is three, the bias folded (no entry of its own), plus c_proj and logits */
  ck_assert_uint_eq(stab_model_count(md.m), 3 + 1 + 1);
  const char *names[] = {"h.0.attn.c_attn.q", "h.0.attn.c_attn.k", "h.0.attn.c_attn.v"};
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], 0, (int)p + 1, STAB_LAYOUT_IN_MAJOR, C, C, p * C, 3 * C, &md.t[1], p * C);
    expect_block_metrics(entry(&md, names[p]), buf[0], buf[1], buf[0] + p * C, C, C, 3 * C, buf[1] + p * C);
  }
  /* the entries stand where the tensor was, in q, k, v order */
  ck_assert_str_eq(stab_model_entry_at(md.m, 0)->name, "h.0.attn.c_attn.q");
  ck_assert_str_eq(stab_model_entry_at(md.m, 2)->name, "h.0.attn.c_attn.v");
  expect(&md, "h.0.attn.c_proj", STAB_KIND_LINEAR, STAB_LAYOUT_IN_MAJOR, 8, 8);
  ck_assert_uint_eq(entry(&md, "h.0.attn.c_proj")->offset, 0);
  ck_assert_uint_eq(entry(&md, "h.0.attn.c_proj")->ld, 0);
  expect_attention(&md, "h.0.attn.logits", 0, 0, STAB_LAYOUT_IN_MAJOR, 8, 8, 2, 2, 24, 8);
  stab_model_free(md.m);
  free_data(buf, 3);
  static const spec out_major[] = {T2("h.0.attn.c_attn.weight", 24, 8), T1("h.0.attn.c_attn.bias", 24)};
  build(&md, out_major, 2, &c);
  buf = with_data(&md, 2, &c, 32);
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], 0, (int)p + 1, STAB_LAYOUT_OUT_MAJOR, C, C, p * C * C, 0, &md.t[1], p * C);
    expect_block_metrics(entry(&md, names[p]), buf[0], buf[1], buf[0] + p * C * C, C, C, C, buf[1] + p * C);
  }
  expect_attention(&md, "h.0.attn.logits", 0, 0, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 64);
  /* over 16-bit data the offsets count 2-byte elements */
  stab_layer L;
  ck_assert_int_eq(stab_model_entry_layer(entry(&md, "h.0.attn.c_attn.v"), STAB_DTYPE_BF16, buf[0], buf[1], NULL, &L),
                   STAB_OK);
  ck_assert_ptr_eq((const void *)L.weight, (const void *)((const unsigned char *)buf[0] + 2 * C * C * 2));
  ck_assert_ptr_eq((const void *)L.bias, (const void *)((const unsigned char *)buf[1] + 2 * C * 2));
  stab_model_free(md.m);
  free_data(buf, 2);
  /* widths the config cannot split (25 rows, no key heads): one linear layer, as the tensor */
  static const spec odd[] = {T2("h.0.attn.c_attn.weight", 25, 8)};
  build(&md, odd, 1, &c);
  expect(&md, "h.0.attn.c_attn", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 25);
  ck_assert_int_eq(entry(&md, "h.0.attn.c_attn")->part, 0);
  expect_not(&md, "h.0.attn.logits", "d_out 25 is not three equal parts");
  stab_model_free(md.m);
}
END_TEST

/* Phi-3's qkv_proj with grouped-query widths: (4 heads + 2 x 2 key heads) x 4 = 32 rows, q 16,
 * k and v 8 each, with a fused bias; in-major by a layout override, column blocks of a stored
 * row of 32 (the attention pair is refused in-major with GQA; its q, k, v are measured). */
START_TEST(test_fused_qkv_proj_gqa) {
  static const spec sp[] = {T2("model.layers.0.self_attn.qkv_proj.weight", 32, 16),
                            T1("model.layers.0.self_attn.qkv_proj.bias", 32),
                            T2("model.layers.0.mlp.gate_up_proj.weight", 48, 16)};
  const char *names[] = {"model.layers.0.self_attn.qkv_proj.q", "model.layers.0.self_attn.qkv_proj.k",
                         "model.layers.0.self_attn.qkv_proj.v"};
  const size_t first[] = {0, 16, 24}, width[] = {16, 8, 8};
  model md;
  stab_model_config c = heads_config(4, 2, 0);
  build(&md, sp, 3, &c);
  float **buf = with_data(&md, 3, &c, 33);
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], 0, (int)p + 1, STAB_LAYOUT_OUT_MAJOR, 16, width[p], first[p] * 16, 0, &md.t[1], first[p]);
    expect_block_metrics(entry(&md, names[p]), buf[0], buf[1], buf[0] + first[p] * 16, width[p], 16, 16, buf[1] + first[p]);
  }
  /* gate_up_proj is no q/k/v: one layer */
  expect(&md, "model.layers.0.mlp.gate_up_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 16, 48);
  ck_assert_int_eq(entry(&md, "model.layers.0.mlp.gate_up_proj")->part, 0);
  expect_attention(&md, "model.layers.0.self_attn.logits", 0, 0, STAB_LAYOUT_OUT_MAJOR, 16, 16, 4, 2, 16, 16 * 16);
  stab_model_free(md.m);
  free_data(buf, 3);
  spec in[3];
  memcpy(in, sp, sizeof in);
  in[0].shape[0] = 16, in[0].shape[1] = 32;
  stab_model_override lay = {"*.qkv_proj.weight", "in_major"};
  c.layouts = &lay, c.nlayouts = 1;
  build(&md, in, 3, &c);
  buf = with_data(&md, 3, &c, 34);
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], 0, (int)p + 1, STAB_LAYOUT_IN_MAJOR, 16, width[p], first[p], 32, &md.t[1], first[p]);
    expect_block_metrics(entry(&md, names[p]), buf[0], buf[1], buf[0] + first[p], 16, width[p], 32, buf[1] + first[p]);
  }
  expect_not(&md, "model.layers.0.self_attn.logits", "grouped-query attention with in-major weights");
  stab_model_free(md.m);
  free_data(buf, 3);
}
END_TEST

/* PyTorch nn.MultiheadAttention: in_proj_weight [3E][E] with in_proj_bias [3E] is q, k, v
 * (module X.in_proj) with their bias slices and the attention entry X.logits; out_proj an
 * ordinary linear; a bare module's names have no prefix. */
START_TEST(test_mha_in_proj) {
  const size_t E = 8;
  static const spec sp[] = {T2("layers.0.self_attn.in_proj_weight", 24, 8), T1("layers.0.self_attn.in_proj_bias", 24),
                            T2("layers.0.self_attn.out_proj.weight", 8, 8), T1("layers.0.self_attn.out_proj.bias", 8)};
  const char *names[] = {"layers.0.self_attn.in_proj.q", "layers.0.self_attn.in_proj.k", "layers.0.self_attn.in_proj.v"};
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, sp, 4, &c);
  float **buf = with_data(&md, 4, &c, 35);
  ck_assert_uint_eq(stab_model_count(md.m), 3 + 1 + 1); /* q, k, v, out_proj, logits: both biases folded */
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], 0, (int)p + 1, STAB_LAYOUT_OUT_MAJOR, E, E, p * E * E, 0, &md.t[1], p * E);
    expect_block_metrics(entry(&md, names[p]), buf[0], buf[1], buf[0] + p * E * E, E, E, E, buf[1] + p * E);
  }
  expect(&md, "layers.0.self_attn.out_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 8, 8);
  ck_assert_ptr_eq(entry(&md, "layers.0.self_attn.out_proj")->bias, &md.t[3]);
  expect_attention(&md, "layers.0.self_attn.logits", 0, 0, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 64);
  stab_model_free(md.m);
  free_data(buf, 4);
  /* without heads: q, k, v all the same, the attention entry says what it lacks */
  build(&md, sp, 4, NULL);
  expect_part(&md, names[2], 0, 3, STAB_LAYOUT_OUT_MAJOR, E, E, 2 * E * E, 0, &md.t[1], 2 * E);
  expect_not(&md, "layers.0.self_attn.logits", "no head count");
  stab_model_free(md.m);
  /* the module itself given (a model that is one nn.MultiheadAttention) */
  static const spec bare[] = {T2("in_proj_weight", 24, 8), T1("in_proj_bias", 24), T2("out_proj.weight", 8, 8)};
  build(&md, bare, 3, &c);
  expect_part(&md, "in_proj.k", 0, 2, STAB_LAYOUT_OUT_MAJOR, E, E, E * E, 0, &md.t[1], E);
  expect_attention(&md, "logits", 0, 0, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 64);
  stab_model_free(md.m);
  /* bias=False: no in_proj_bias; add_bias_kv: bias_k and bias_v [1][1][E], not measured, said */
  static const spec kv[] = {T2("attn.in_proj_weight", 24, 8), {"attn.bias_k", STAB_DTYPE_F32, 3, {1, 1, 8}},
                            {"attn.bias_v", STAB_DTYPE_F32, 3, {1, 1, 8}}};
  build(&md, kv, 3, &c);
  expect_part(&md, "attn.in_proj.q", 0, 1, STAB_LAYOUT_OUT_MAJOR, E, E, 0, 0, NULL, 0);
  expect_not(&md, "attn.bias_k", "add_bias_kv: a learned key appended to every sequence's keys");
  expect_not(&md, "attn.bias_v", "add_bias_kv: a learned value appended to every sequence's values");
  stab_model_free(md.m);
}
END_TEST

/* nn.MultiheadAttention with kdim or vdim other than embed_dim: separate X.q_proj_weight [E][E],
 * X.k_proj_weight [E][kdim], X.v_proj_weight [E][vdim], named X.q_proj ..., each with its third
 * of X.in_proj_bias; the attention entry X.logits from q and k when they read the same inputs. */
START_TEST(test_mha_separate_proj) {
  static const spec sp[] = {T2("enc.attn.q_proj_weight", 8, 8), T2("enc.attn.k_proj_weight", 8, 8),
                            T2("enc.attn.v_proj_weight", 8, 5), T1("enc.attn.in_proj_bias", 24),
                            T2("enc.attn.out_proj.weight", 8, 8)};
  model md;
  stab_model_config c = heads_config(2, 0, 0);
  build(&md, sp, 5, &c);
  float **buf = with_data(&md, 5, &c, 36);
  ck_assert_uint_eq(stab_model_count(md.m), 3 + 1 + 1);
  const char *names[] = {"enc.attn.q_proj", "enc.attn.k_proj", "enc.attn.v_proj"};
  const size_t d_in[] = {8, 8, 5};
  for (size_t p = 0; p < 3; p++) {
    expect_part(&md, names[p], p, 0, STAB_LAYOUT_OUT_MAJOR, d_in[p], 8, 0, 0, &md.t[3], p * 8);
    expect_block_metrics(entry(&md, names[p]), buf[p], buf[3], buf[p], 8, d_in[p], d_in[p], buf[3] + p * 8);
  }
  expect_attention(&md, "enc.attn.logits", 0, 1, STAB_LAYOUT_OUT_MAJOR, 8, 8, 2, 2, 8, 0);
  stab_model_free(md.m);
  free_data(buf, 5);
  /* kdim 6: keys read other inputs than queries; no bias: nothing folded */
  spec sp2[5];
  memcpy(sp2, sp, sizeof sp2);
  sp2[1].shape[1] = 6;
  build(&md, sp2, 3, &c);
  expect(&md, "enc.attn.k_proj", STAB_KIND_LINEAR, STAB_LAYOUT_OUT_MAJOR, 6, 8);
  ck_assert_ptr_null(entry(&md, "enc.attn.k_proj")->bias);
  expect_not(&md, "enc.attn.logits", "query d_in 8 but key 'enc.attn.k_proj_weight' d_in 6");
  stab_model_free(md.m);
  /* a bias of the wrong width is not sliced: a bias entry of its own */
  sp2[1].shape[1] = 8, sp2[3].shape[0] = 21;
  build(&md, sp2, 4, &c);
  expect(&md, "enc.attn.in_proj_bias", STAB_KIND_BIAS, STAB_LAYOUT_NATURAL, 21, 21);
  ck_assert_ptr_null(entry(&md, "enc.attn.q_proj")->bias);
  stab_model_free(md.m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model_rules");
  TCase *tc = tcase_create("rules");
  tcase_set_timeout(tc, 0); /* no wall-clock limit: the suite also runs under the sanitizers */
  tcase_add_test(tc, test_gpt2_hf_conv1d);
  tcase_add_test(tc, test_gpt2_nanogpt_out_major);
  tcase_add_test(tc, test_llmc);
  tcase_add_test(tc, test_llama_qwen2_gqa);
  tcase_add_test(tc, test_gemma_tied_head_dim);
  tcase_add_test(tc, test_phi3_fused_gqa);
  tcase_add_test(tc, test_mixtral_router_experts);
  tcase_add_test(tc, test_gguf_llama_cpp);
  tcase_add_test(tc, test_overrides_and_names);
  tcase_add_test(tc, test_expert_bounds);
  tcase_add_test(tc, test_entry_layers);
  tcase_add_test(tc, test_register_by_name);
  tcase_add_test(tc, test_fused_c_attn_split);
  tcase_add_test(tc, test_fused_qkv_proj_gqa);
  tcase_add_test(tc, test_mha_in_proj);
  tcase_add_test(tc, test_mha_separate_proj);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
