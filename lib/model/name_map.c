/* name_map.c — tensor names between llama.cpp's GGUF naming and Hugging Face's, both ways,
 * and what llama.cpp's converter (convert_hf_to_gguf.py) does to a tensor's values on the way
 * (the q/k row permutation of Llama-type models, the transposed GPT-2 Conv1D weights, Gemma's
 * norm weights stored plus one), so that a GGUF file can be compared with the safetensors it
 * came from: the probe's --prev across formats. The tables are written from gguf-py's
 * tensor_mapping.py and the converter's model classes, for the architectures they map plainly. */
#include "core/core.h"

#include <stdio.h>
#include <string.h>

/* One module of a block (after "blk.N." / "model.layers.N." or "h.N.") or of the model. */
typedef struct {
  const char *gguf, *hf;
  stab_qk_rows rows; /* the converter's q/k row permutation (permuting architectures only) */
  int conv1d;        /* HF GPT-2 Conv1D: the converter transposes the weight */
  int norm;          /* a norm gain: Gemma's is stored plus one */
} module_pair;

/* Llama, Mistral (HF's MistralForCausalLM converts as Llama), Qwen2, Gemma: the same names. */
static const module_pair llama_blocks[] = {
    {"attn_q", "self_attn.q_proj", STAB_QK_QUERY, 0, 0},   {"attn_k", "self_attn.k_proj", STAB_QK_KEY, 0, 0},
    {"attn_v", "self_attn.v_proj", STAB_QK_NONE, 0, 0},    {"attn_output", "self_attn.o_proj", STAB_QK_NONE, 0, 0},
    {"ffn_gate", "mlp.gate_proj", STAB_QK_NONE, 0, 0},     {"ffn_up", "mlp.up_proj", STAB_QK_NONE, 0, 0},
    {"ffn_down", "mlp.down_proj", STAB_QK_NONE, 0, 0},     {"attn_norm", "input_layernorm", STAB_QK_NONE, 0, 1},
    {"ffn_norm", "post_attention_layernorm", STAB_QK_NONE, 0, 1}, {NULL, NULL, STAB_QK_NONE, 0, 0}};
/* Llama's names plus the router of a mixture of experts: Mixtral converts as "llama" (its experts,
 * 3-D ffn_*_exps in GGUF and one tensor per expert in HF, are not mapped). */
static const module_pair mixtral_blocks[] = {
    {"attn_q", "self_attn.q_proj", STAB_QK_QUERY, 0, 0},   {"attn_k", "self_attn.k_proj", STAB_QK_KEY, 0, 0},
    {"attn_v", "self_attn.v_proj", STAB_QK_NONE, 0, 0},    {"attn_output", "self_attn.o_proj", STAB_QK_NONE, 0, 0},
    {"ffn_gate", "mlp.gate_proj", STAB_QK_NONE, 0, 0},     {"ffn_up", "mlp.up_proj", STAB_QK_NONE, 0, 0},
    {"ffn_down", "mlp.down_proj", STAB_QK_NONE, 0, 0},     {"attn_norm", "input_layernorm", STAB_QK_NONE, 0, 1},
    {"ffn_norm", "post_attention_layernorm", STAB_QK_NONE, 0, 1},
    {"ffn_gate_inp", "block_sparse_moe.gate", STAB_QK_NONE, 0, 0}, {NULL, NULL, STAB_QK_NONE, 0, 0}};
/* Qwen2-MoE ("qwen2moe"): Qwen2's names, the router mlp.gate and the shared expert with its gate. */
static const module_pair qwen2moe_blocks[] = {
    {"attn_q", "self_attn.q_proj", STAB_QK_NONE, 0, 0},    {"attn_k", "self_attn.k_proj", STAB_QK_NONE, 0, 0},
    {"attn_v", "self_attn.v_proj", STAB_QK_NONE, 0, 0},    {"attn_output", "self_attn.o_proj", STAB_QK_NONE, 0, 0},
    {"attn_norm", "input_layernorm", STAB_QK_NONE, 0, 1},  {"ffn_norm", "post_attention_layernorm", STAB_QK_NONE, 0, 1},
    {"ffn_gate_inp", "mlp.gate", STAB_QK_NONE, 0, 0},
    {"ffn_gate_inp_shexp", "mlp.shared_expert_gate", STAB_QK_NONE, 0, 0},
    {"ffn_gate_shexp", "mlp.shared_expert.gate_proj", STAB_QK_NONE, 0, 0},
    {"ffn_up_shexp", "mlp.shared_expert.up_proj", STAB_QK_NONE, 0, 0},
    {"ffn_down_shexp", "mlp.shared_expert.down_proj", STAB_QK_NONE, 0, 0}, {NULL, NULL, STAB_QK_NONE, 0, 0}};
static const module_pair llama_top[] = {{"token_embd", "model.embed_tokens", STAB_QK_NONE, 0, 0},
                                        {"output", "lm_head", STAB_QK_NONE, 0, 0},
                                        {"output_norm", "model.norm", STAB_QK_NONE, 0, 1},
                                        {NULL, NULL, STAB_QK_NONE, 0, 0}};
/* Phi-3: fused q/k/v and gate/up projections, the other names Llama's. */
static const module_pair phi3_blocks[] = {
    {"attn_qkv", "self_attn.qkv_proj", STAB_QK_NONE, 0, 0}, {"attn_output", "self_attn.o_proj", STAB_QK_NONE, 0, 0},
    {"ffn_up", "mlp.gate_up_proj", STAB_QK_NONE, 0, 0},     {"ffn_down", "mlp.down_proj", STAB_QK_NONE, 0, 0},
    {"attn_norm", "input_layernorm", STAB_QK_NONE, 0, 1},   {"ffn_norm", "post_attention_layernorm", STAB_QK_NONE, 0, 1},
    {NULL, NULL, STAB_QK_NONE, 0, 0}};
/* GPT-2: HF names with or without "transformer."; the four Conv1D weights transposed. */
static const module_pair gpt2_blocks[] = {
    {"attn_qkv", "attn.c_attn", STAB_QK_NONE, 1, 0}, {"attn_output", "attn.c_proj", STAB_QK_NONE, 1, 0},
    {"ffn_up", "mlp.c_fc", STAB_QK_NONE, 1, 0},      {"ffn_down", "mlp.c_proj", STAB_QK_NONE, 1, 0},
    {"attn_norm", "ln_1", STAB_QK_NONE, 0, 1},       {"ffn_norm", "ln_2", STAB_QK_NONE, 0, 1},
    {NULL, NULL, STAB_QK_NONE, 0, 0}};
static const module_pair gpt2_top[] = {{"token_embd", "wte", STAB_QK_NONE, 0, 0},
                                       {"position_embd", "wpe", STAB_QK_NONE, 0, 0},
                                       {"output_norm", "ln_f", STAB_QK_NONE, 0, 1},
                                       {"output", "lm_head", STAB_QK_NONE, 0, 0},
                                       {NULL, NULL, STAB_QK_NONE, 0, 0}};

/* An architecture as general.architecture names it. permutes: the converter reorders q and
 * k rows (LlamaModel.permute: Llama and HF Mistral, both "llama"; Qwen2, Gemma and Phi-3 keep
 * HF's order). gain_offset: added to every norm weight (Gemma's HF weights are w - 1). */
typedef struct {
  const char *arch;
  const module_pair *blocks, *top;
  const char *hf_block; /* the HF prefix of block N, with %zu */
  int permutes;
  float gain_offset;
} arch_table;

static const arch_table archs[] = {
    {"llama", mixtral_blocks, llama_top, "model.layers.%zu.", 1, 0.0f},
    {"qwen2", llama_blocks, llama_top, "model.layers.%zu.", 0, 0.0f},
    {"qwen2moe", qwen2moe_blocks, llama_top, "model.layers.%zu.", 0, 0.0f},
    {"gemma", llama_blocks, llama_top, "model.layers.%zu.", 0, 1.0f},
    {"phi3", phi3_blocks, llama_top, "model.layers.%zu.", 0, 0.0f},
    {"gpt2", gpt2_blocks, gpt2_top, "h.%zu.", 0, 0.0f},
};
enum { N_ARCHS = sizeof archs / sizeof archs[0] };

static const arch_table *arch_of(const char *arch) {
  for (size_t i = 0; arch && i < N_ARCHS; i++)
    if (!strcmp(archs[i].arch, arch)) return &archs[i];
  return NULL;
}

int stab_name_map_knows(const char *arch) { return arch_of(arch) != NULL; }

/* Splits a name into its module and its suffix (".weight" or ".bias", kept as is): *mlen is the
 * module's length. 0 when the name has neither suffix. */
static int split_suffix(const char *name, size_t *mlen, const char **suffix) {
  static const char *const suffixes[] = {".weight", ".bias"};
  size_t n = strlen(name);
  for (size_t i = 0; i < 2; i++) {
    size_t k = strlen(suffixes[i]);
    if (n > k && !strcmp(name + n - k, suffixes[i])) {
      *mlen = n - k, *suffix = suffixes[i];
      return 1;
    }
  }
  return 0;
}

/* A block number written plainly ("0", "12"; no sign, no leading zero but "0") at s, ended by
 * '.': its value and the characters it spans; 0 when s does not start with one. */
static size_t block_number(const char *s, size_t *v) {
  size_t k = 0, x = 0;
  while (s[k] >= '0' && s[k] <= '9') {
    if (k >= 9) return 0; /* no model has a billion blocks */
    x = x * 10 + (size_t)(s[k] - '0'), k++;
  }
  if (k == 0 || s[k] != '.' || (k > 1 && s[0] == '0')) return 0;
  *v = x;
  return k + 1;
}

static void fill_transform(const arch_table *a, const module_pair *m, const char *suffix, stab_name_transform *how) {
  if (!how) return;
  how->rows = a->permutes ? m->rows : STAB_QK_NONE;
  how->conv1d = m->conv1d && !strcmp(suffix, ".weight");
  how->gguf_offset = m->norm && !strcmp(suffix, ".weight") ? a->gain_offset : 0.0f;
}

static stab_status put(size_t cap, const char *what, int n) {
  if (n < 0 || (size_t)n >= cap) return stabi_fail(STAB_ERANGE, "stab_name_map: the name for '%s' does not fit in %zu bytes", what, cap);
  return STAB_OK;
}

static stab_status check_args(const char *fn, const char *arch, const char *name, char *out, size_t cap,
                              const arch_table **a) {
  if (!arch || !name || !out || !cap) return stabi_fail(STAB_EINVAL, "%s: NULL argument or zero capacity", fn);
  if (!(*a = arch_of(arch)))
    return stabi_fail(STAB_ENOTFOUND, "%s: no name map for the GGUF architecture '%s' (llama, qwen2, gemma, phi3, gpt2 have one)",
                      fn, arch);
  out[0] = '\0';
  return STAB_OK;
}

stab_status stab_name_map_to_hf(const char *arch, const char *gguf_name, char *out, size_t cap,
                                stab_name_transform *how) {
  const arch_table *a;
  stab_status st = check_args("stab_name_map_to_hf", arch, gguf_name, out, cap, &a);
  if (st != STAB_OK) return st;
  size_t mlen, blk, k;
  const char *suffix;
  if (split_suffix(gguf_name, &mlen, &suffix)) {
    if (!strncmp(gguf_name, "blk.", 4) && (k = block_number(gguf_name + 4, &blk))) {
      const char *mod = gguf_name + 4 + k;
      size_t len = mlen - 4 - k;
      for (const module_pair *m = a->blocks; m->gguf; m++) {
        if (strlen(m->gguf) != len || strncmp(mod, m->gguf, len)) continue;
        char prefix[64];
        snprintf(prefix, sizeof prefix, a->hf_block, blk);
        fill_transform(a, m, suffix, how);
        return put(cap, gguf_name, snprintf(out, cap, "%s%s%s", prefix, m->hf, suffix));
      }
    } else {
      for (const module_pair *m = a->top; m->gguf; m++) {
        if (strlen(m->gguf) != mlen || strncmp(gguf_name, m->gguf, mlen)) continue;
        fill_transform(a, m, suffix, how);
        return put(cap, gguf_name, snprintf(out, cap, "%s%s", m->hf, suffix));
      }
    }
  }
  return stabi_fail(STAB_ENOTFOUND, "stab_name_map_to_hf: '%s' has no Hugging Face name in the %s map", gguf_name, arch);
}

stab_status stab_name_map_to_gguf(const char *arch, const char *hf_name, char *out, size_t cap,
                                  stab_name_transform *how) {
  const arch_table *a;
  stab_status st = check_args("stab_name_map_to_gguf", arch, hf_name, out, cap, &a);
  if (st != STAB_OK) return st;
  size_t mlen, blk, k;
  const char *suffix, *name = hf_name;
  /* GPT-2's HF files name their modules with or without the GPT2LMHeadModel's "transformer." */
  if (a->blocks == gpt2_blocks && !strncmp(name, "transformer.", 12)) name += 12;
  if (split_suffix(name, &mlen, &suffix)) {
    /* the block prefix's fixed part: "model.layers." or "h." */
    size_t fixed = strcspn(a->hf_block, "%");
    if (!strncmp(name, a->hf_block, fixed) && (k = block_number(name + fixed, &blk))) {
      const char *mod = name + fixed + k;
      size_t len = mlen - fixed - k;
      for (const module_pair *m = a->blocks; m->gguf; m++) {
        if (strlen(m->hf) != len || strncmp(mod, m->hf, len)) continue;
        fill_transform(a, m, suffix, how);
        return put(cap, hf_name, snprintf(out, cap, "blk.%zu.%s%s", blk, m->gguf, suffix));
      }
    }
    for (const module_pair *m = a->top; m->gguf; m++) {
      if (strlen(m->hf) != mlen || strncmp(name, m->hf, mlen)) continue;
      /* GPT2LMHeadModel keeps its head outside "transformer." */
      if (name != hf_name && !strcmp(m->hf, "lm_head")) break;
      fill_transform(a, m, suffix, how);
      return put(cap, hf_name, snprintf(out, cap, "%s%s", m->gguf, suffix));
    }
  }
  return stabi_fail(STAB_ENOTFOUND, "stab_name_map_to_gguf: '%s' has no GGUF name in the %s map", hf_name, arch);
}

/* LlamaModel.permute reshapes a (rows, cols) weight to (heads, 2, rows / heads / 2, cols),
 * swaps the two middle axes and reshapes back: within each head, HF's two rotary halves
 * (rows j and j + half) become neighbouring rows 2j and 2j + 1, the interleaved pairs
 * llama.cpp's rotary embedding reads. GGUF row h*dh + 2j + s is HF row h*dh + s*half + j. */
stab_status stab_qk_permutation(size_t rows, size_t heads, size_t *perm) {
  if (!perm || !heads) return stabi_fail(STAB_EINVAL, "stab_qk_permutation: %s", perm ? "heads is 0" : "perm is NULL");
  if (rows == 0 || rows % heads || (rows / heads) % 2)
    return stabi_fail(STAB_ERANGE, "stab_qk_permutation: %zu rows are not %zu heads of an even width", rows, heads);
  const size_t dh = rows / heads, half = dh / 2;
  for (size_t h = 0; h < heads; h++)
    for (size_t j = 0; j < half; j++)
      for (size_t s = 0; s < 2; s++) perm[h * dh + 2 * j + s] = h * dh + s * half + j;
  return STAB_OK;
}
