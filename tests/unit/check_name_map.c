/* check_name_map.c — lib/model/name_map.c: tensor names between llama.cpp's GGUF naming and Hugging
 * Face's, against pairs written out here by hand from llama.cpp's tensor_mapping.py (both
 * ways, every block module, with and without GPT-2's "transformer."), what the converter did
 * to each (q/k rows, Conv1D transposes, Gemma's +1), names and architectures with no mapping,
 * and the q/k row permutation against a brute-force reshape / swapaxes / reshape. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"
#include "testutil.h"

typedef struct {
  const char *arch, *gguf, *hf;
  stab_qk_rows rows;
  int conv1d;
  float offset;
} pair;

/* Written out whole rather than generated, so that a wrong table entry cannot agree with a
 * wrong generator; block numbers 0, 7 and 31 catch a number parsed or printed wrongly. */
static const pair pairs[] = {
    {"llama", "token_embd.weight", "model.embed_tokens.weight", STAB_QK_NONE, 0, 0},
    {"llama", "output.weight", "lm_head.weight", STAB_QK_NONE, 0, 0},
    {"llama", "output_norm.weight", "model.norm.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", STAB_QK_QUERY, 0, 0},
    {"llama", "blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", STAB_QK_KEY, 0, 0},
    {"llama", "blk.7.attn_q.bias", "model.layers.7.self_attn.q_proj.bias", STAB_QK_QUERY, 0, 0},
    {"llama", "blk.7.attn_k.bias", "model.layers.7.self_attn.k_proj.bias", STAB_QK_KEY, 0, 0},
    {"llama", "blk.31.attn_v.weight", "model.layers.31.self_attn.v_proj.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.31.attn_output.weight", "model.layers.31.self_attn.o_proj.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight", STAB_QK_NONE, 0, 0},
    {"llama", "blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight", STAB_QK_NONE, 0, 0},
    /* routers of mixtures of experts: Mixtral (converted as llama), Qwen2-MoE with its shared expert */
    {"llama", "blk.5.ffn_gate_inp.weight", "model.layers.5.block_sparse_moe.gate.weight", STAB_QK_NONE, 0, 0},
    {"qwen2moe", "blk.2.ffn_gate_inp.weight", "model.layers.2.mlp.gate.weight", STAB_QK_NONE, 0, 0},
    {"qwen2moe", "blk.2.ffn_gate_inp_shexp.weight", "model.layers.2.mlp.shared_expert_gate.weight", STAB_QK_NONE, 0, 0},
    {"qwen2moe", "blk.2.ffn_up_shexp.weight", "model.layers.2.mlp.shared_expert.up_proj.weight", STAB_QK_NONE, 0, 0},
    {"qwen2moe", "blk.2.attn_q.weight", "model.layers.2.self_attn.q_proj.weight", STAB_QK_NONE, 0, 0},
    /* Qwen2: Llama's names (with q/k/v biases), rows as HF has them */
    {"qwen2", "blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight", STAB_QK_NONE, 0, 0},
    {"qwen2", "blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias", STAB_QK_NONE, 0, 0},
    {"qwen2", "blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias", STAB_QK_NONE, 0, 0},
    {"qwen2", "token_embd.weight", "model.embed_tokens.weight", STAB_QK_NONE, 0, 0},
    /* Gemma: rows as HF has them, norms plus one */
    {"gemma", "blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", STAB_QK_NONE, 0, 0},
    {"gemma", "blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight", STAB_QK_NONE, 0, 1},
    {"gemma", "blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight", STAB_QK_NONE, 0, 1},
    {"gemma", "output_norm.weight", "model.norm.weight", STAB_QK_NONE, 0, 1},
    {"gemma", "blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight", STAB_QK_NONE, 0, 0},
    /* Phi-3: fused projections */
    {"phi3", "blk.2.attn_qkv.weight", "model.layers.2.self_attn.qkv_proj.weight", STAB_QK_NONE, 0, 0},
    {"phi3", "blk.2.ffn_up.weight", "model.layers.2.mlp.gate_up_proj.weight", STAB_QK_NONE, 0, 0},
    {"phi3", "blk.2.ffn_down.weight", "model.layers.2.mlp.down_proj.weight", STAB_QK_NONE, 0, 0},
    {"phi3", "blk.2.attn_output.weight", "model.layers.2.self_attn.o_proj.weight", STAB_QK_NONE, 0, 0},
    {"phi3", "blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight", STAB_QK_NONE, 0, 0},
    {"phi3", "output.weight", "lm_head.weight", STAB_QK_NONE, 0, 0},
    /* GPT-2: Conv1D weights transposed (their biases are not) */
    {"gpt2", "token_embd.weight", "wte.weight", STAB_QK_NONE, 0, 0},
    {"gpt2", "position_embd.weight", "wpe.weight", STAB_QK_NONE, 0, 0},
    {"gpt2", "output_norm.weight", "ln_f.weight", STAB_QK_NONE, 0, 0},
    {"gpt2", "output_norm.bias", "ln_f.bias", STAB_QK_NONE, 0, 0},
    {"gpt2", "output.weight", "lm_head.weight", STAB_QK_NONE, 0, 0},
    {"gpt2", "blk.0.attn_qkv.weight", "h.0.attn.c_attn.weight", STAB_QK_NONE, 1, 0},
    {"gpt2", "blk.0.attn_qkv.bias", "h.0.attn.c_attn.bias", STAB_QK_NONE, 0, 0},
    {"gpt2", "blk.11.attn_output.weight", "h.11.attn.c_proj.weight", STAB_QK_NONE, 1, 0},
    {"gpt2", "blk.11.ffn_up.weight", "h.11.mlp.c_fc.weight", STAB_QK_NONE, 1, 0},
    {"gpt2", "blk.11.ffn_up.bias", "h.11.mlp.c_fc.bias", STAB_QK_NONE, 0, 0},
    {"gpt2", "blk.11.ffn_down.weight", "h.11.mlp.c_proj.weight", STAB_QK_NONE, 1, 0},
    {"gpt2", "blk.5.attn_norm.weight", "h.5.ln_1.weight", STAB_QK_NONE, 0, 0},
    {"gpt2", "blk.5.attn_norm.bias", "h.5.ln_1.bias", STAB_QK_NONE, 0, 0},
    {"gpt2", "blk.5.ffn_norm.weight", "h.5.ln_2.weight", STAB_QK_NONE, 0, 0},
};
enum { NPAIRS = sizeof pairs / sizeof pairs[0] };

static void check_how(const pair *p, const stab_name_transform *how, const char *dir) {
  ck_assert_msg(how->rows == p->rows, "%s %s: rows %d, want %d", dir, p->gguf, how->rows, p->rows);
  ck_assert_msg(how->conv1d == p->conv1d, "%s %s: conv1d %d", dir, p->gguf, how->conv1d);
  ck_assert_msg(how->gguf_offset == p->offset, "%s %s: offset %g", dir, p->gguf, (double)how->gguf_offset);
}

START_TEST(test_pairs_both_ways) {
  for (size_t i = 0; i < NPAIRS; i++) {
    const pair *p = &pairs[i];
    char out[256];
    stab_name_transform how;
    memset(&how, 0x5a, sizeof how); /* every field must be written */
    TU_ASSERT_OK(stab_name_map_to_hf(p->arch, p->gguf, out, sizeof out, &how));
    ck_assert_msg(!strcmp(out, p->hf), "%s %s -> '%s', want '%s'", p->arch, p->gguf, out, p->hf);
    check_how(p, &how, "to_hf");
    memset(&how, 0x5a, sizeof how);
    TU_ASSERT_OK(stab_name_map_to_gguf(p->arch, p->hf, out, sizeof out, &how));
    ck_assert_msg(!strcmp(out, p->gguf), "%s %s -> '%s', want '%s'", p->arch, p->hf, out, p->gguf);
    check_how(p, &how, "to_gguf");
    /* how may be NULL */
    TU_ASSERT_OK(stab_name_map_to_hf(p->arch, p->gguf, out, sizeof out, NULL));
    ck_assert_str_eq(out, p->hf);
  }
}
END_TEST

/* GPT-2's HF files under GPT2LMHeadModel name the body transformer.*: the same GGUF names;
 * its head stays lm_head, never transformer.lm_head. */
START_TEST(test_gpt2_prefix) {
  for (size_t i = 0; i < NPAIRS; i++) {
    const pair *p = &pairs[i];
    if (strcmp(p->arch, "gpt2") || !strcmp(p->hf, "lm_head.weight")) continue;
    char hf[256], out[256];
    snprintf(hf, sizeof hf, "transformer.%s", p->hf);
    TU_ASSERT_OK(stab_name_map_to_gguf("gpt2", hf, out, sizeof out, NULL));
    ck_assert_msg(!strcmp(out, p->gguf), "%s -> '%s', want '%s'", hf, out, p->gguf);
  }
  char out[64];
  TU_ASSERT_STATUS(stab_name_map_to_gguf("gpt2", "transformer.lm_head.weight", out, sizeof out, NULL), STAB_ENOTFOUND);
  /* the prefix is GPT-2's only */
  TU_ASSERT_STATUS(stab_name_map_to_gguf("llama", "transformer.model.norm.weight", out, sizeof out, NULL), STAB_ENOTFOUND);
}
END_TEST

/* Every module of every architecture: GGUF -> HF -> GGUF is the identity over block numbers
 * and both suffixes (a name that maps one way must map back). */
START_TEST(test_round_trip_every_module) {
  static const char *const archs[] = {"llama", "qwen2", "gemma", "phi3", "gpt2"};
  static const char *const modules[] = {"token_embd", "position_embd", "output", "output_norm", "attn_q", "attn_k",
                                        "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
                                        "attn_norm", "ffn_norm"};
  static const size_t top[] = {1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  size_t mapped = 0;
  for (size_t a = 0; a < 5; a++)
    for (size_t m = 0; m < sizeof modules / sizeof modules[0]; m++)
      for (size_t blk = 0; blk < (top[m] ? 1 : 40); blk += 13)
        for (int sfx = 0; sfx < 2; sfx++) {
          char g[128], hf[256], back[128];
          if (top[m]) snprintf(g, sizeof g, "%s%s", modules[m], sfx ? ".bias" : ".weight");
          else snprintf(g, sizeof g, "blk.%zu.%s%s", blk, modules[m], sfx ? ".bias" : ".weight");
          if (stab_name_map_to_hf(archs[a], g, hf, sizeof hf, NULL) != STAB_OK) continue;
          mapped++;
          TU_ASSERT_OK(stab_name_map_to_gguf(archs[a], hf, back, sizeof back, NULL));
          ck_assert_msg(!strcmp(back, g), "%s: %s -> %s -> %s", archs[a], g, hf, back);
        }
  /* llama, qwen2, gemma: 3 model-level + 9 block modules; phi3: 3 + 6; gpt2: 4 + 6; blocks at
   * 4 numbers, each name with 2 suffixes */
  ck_assert_uint_eq(mapped, 3 * 2 * (3 + 9 * 4) + 2 * (3 + 6 * 4) + 2 * (4 + 6 * 4));
}
END_TEST

START_TEST(test_unmapped) {
  char out[256];
  static const char *const gguf_names[] = {
      "rope_freqs.weight",                 /* llama.cpp's own, no HF tensor */
      "blk.0.attn_q_norm.weight",          /* Qwen3 / OLMo2: not in these maps */
      "blk.0.ffn_gate_exps.weight",        /* experts: not mapped */
      "blk.x.attn_q.weight", "blk.00.attn_q.weight", "blk.-1.attn_q.weight", "blk..attn_q.weight",
      "blk.0.attn_q",                      /* no suffix */
      "blk.0.attn_q.scale", "token_embd", "token_embd.weight.weight", "", "blk.0.attn_qx.weight",
      "blk.0.attn_.weight",
  };
  for (size_t i = 0; i < sizeof gguf_names / sizeof gguf_names[0]; i++) {
    out[0] = 'x';
    TU_ASSERT_STATUS(stab_name_map_to_hf("llama", gguf_names[i], out, sizeof out, NULL), STAB_ENOTFOUND);
    ck_assert_msg(out[0] == '\0', "'%s': out not emptied", gguf_names[i]);
    ck_assert_msg(strstr(stab_last_error(), gguf_names[i]), "message '%s'", stab_last_error());
  }
  static const char *const hf_names[] = {"model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.0.mlp.experts.0.w1.weight",
                                         "model.layers.0.self_attn.q_proj", "model.embed_tokens", "h.0.attn.c_attn.weight",
                                         "model.layers.1e3.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight.bias",
                                         "layers.0.self_attn.q_proj.weight", "lm_head.bias.weight"};
  for (size_t i = 0; i < sizeof hf_names / sizeof hf_names[0]; i++)
    TU_ASSERT_STATUS(stab_name_map_to_gguf("llama", hf_names[i], out, sizeof out, NULL), STAB_ENOTFOUND);
  /* names of one family are not another's */
  TU_ASSERT_STATUS(stab_name_map_to_gguf("gpt2", "model.layers.0.self_attn.q_proj.weight", out, sizeof out, NULL),
                   STAB_ENOTFOUND);
  TU_ASSERT_STATUS(stab_name_map_to_hf("phi3", "blk.0.attn_q.weight", out, sizeof out, NULL), STAB_ENOTFOUND);
  TU_ASSERT_STATUS(stab_name_map_to_gguf("phi3", "model.layers.0.mlp.up_proj.weight", out, sizeof out, NULL), STAB_ENOTFOUND);
  /* architectures without a map: refused, named */
  static const char *const archs[] = {"bert", "mamba", "llama4", "", "LLAMA", "qwen3", "gemma2"};
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++) {
    ck_assert_int_eq(stab_name_map_knows(archs[i]), 0);
    TU_ASSERT_STATUS(stab_name_map_to_hf(archs[i], "token_embd.weight", out, sizeof out, NULL), STAB_ENOTFOUND);
    ck_assert_msg(strstr(stab_last_error(), "no name map for the GGUF architecture"), "%s", stab_last_error());
  }
  ck_assert_int_eq(stab_name_map_knows(NULL), 0);
  ck_assert_int_eq(stab_name_map_knows("llama"), 1);
  ck_assert_int_eq(stab_name_map_knows("gpt2"), 1);
  /* arguments */
  TU_ASSERT_STATUS(stab_name_map_to_hf(NULL, "token_embd.weight", out, sizeof out, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_name_map_to_hf("llama", NULL, out, sizeof out, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_name_map_to_gguf("llama", "lm_head.weight", NULL, 8, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_name_map_to_gguf("llama", "lm_head.weight", out, 0, NULL), STAB_EINVAL);
  /* exactly the length fits; one byte less does not */
  TU_ASSERT_OK(stab_name_map_to_hf("llama", "output.weight", out, sizeof "lm_head.weight", NULL));
  TU_ASSERT_STATUS(stab_name_map_to_hf("llama", "output.weight", out, sizeof "lm_head.weight" - 1, NULL), STAB_ERANGE);
}
END_TEST

/* The converter's permute, done the long way: view the (rows, cols) matrix as an array of
 * shape (heads, 2, half, cols) by strides, swap axes 1 and 2 into (heads, half, 2, cols), and
 * read that out in row-major order. Row r of the result is the source row at the index the
 * swapped view gives, which is what perm[r] must be. */
static void brute_force_permute(size_t rows, size_t heads, size_t *src_row) {
  const size_t half = rows / heads / 2;
  const size_t shape[3] = {heads, 2, half};            /* the source view (cols left out) */
  const size_t stride[3] = {2 * half, half, 1};        /* its row strides */
  const size_t swapped_shape[3] = {shape[0], shape[2], shape[1]};
  const size_t swapped_stride[3] = {stride[0], stride[2], stride[1]};
  size_t r = 0;
  for (size_t i0 = 0; i0 < swapped_shape[0]; i0++)
    for (size_t i1 = 0; i1 < swapped_shape[1]; i1++)
      for (size_t i2 = 0; i2 < swapped_shape[2]; i2++)
        src_row[r++] = i0 * swapped_stride[0] + i1 * swapped_stride[1] + i2 * swapped_stride[2];
}

START_TEST(test_qk_permutation) {
  static const size_t cases[][2] = {{8, 1}, {8, 2}, {8, 4}, {64, 4}, {256, 4}, {128, 2}, {4096, 32}, {1024, 8}, {2, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    size_t rows = cases[c][0], heads = cases[c][1];
    size_t *perm = malloc(rows * sizeof *perm), *want = malloc(rows * sizeof *want);
    TU_ASSERT_OK(stab_qk_permutation(rows, heads, perm));
    brute_force_permute(rows, heads, want);
    for (size_t r = 0; r < rows; r++)
      ck_assert_msg(perm[r] == want[r], "rows %zu heads %zu: perm[%zu] = %zu, want %zu", rows, heads, r, perm[r], want[r]);
    /* a permutation: every row once */
    char *seen = calloc(rows, 1);
    for (size_t r = 0; r < rows; r++) {
      ck_assert_msg(perm[r] < rows && !seen[perm[r]], "rows %zu heads %zu: row %zu twice", rows, heads, perm[r]);
      seen[perm[r]] = 1;
    }
    free(seen), free(perm), free(want);
  }
  /* one head of 8: HF rows 0..3 are the first rotary half, 4..7 the second: interleaved */
  size_t p[8];
  TU_ASSERT_OK(stab_qk_permutation(8, 1, p));
  const size_t want8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (size_t r = 0; r < 8; r++) ck_assert_uint_eq(p[r], want8[r]);
  TU_ASSERT_STATUS(stab_qk_permutation(8, 0, p), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_qk_permutation(8, 1, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_qk_permutation(0, 1, p), STAB_ERANGE);
  TU_ASSERT_STATUS(stab_qk_permutation(6, 4, p), STAB_ERANGE); /* 4 heads do not divide 6 rows */
  TU_ASSERT_STATUS(stab_qk_permutation(6, 2, p), STAB_ERANGE); /* heads of width 3: odd */
}
END_TEST

static Suite *name_map_suite(void) {
  Suite *s = suite_create("name_map");
  TCase *tc = tcase_create("names");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_pairs_both_ways);
  tcase_add_test(tc, test_gpt2_prefix);
  tcase_add_test(tc, test_round_trip_every_module);
  tcase_add_test(tc, test_unmapped);
  tcase_add_test(tc, test_qk_permutation);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(name_map_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
