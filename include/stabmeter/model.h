/* stabmeter/model.h — what a model's tensors are: the names llama.cpp's GGUF and Hugging Face
 * give the same tensor, and the kind rules that make layers of a model's tensors by their names,
 * shapes and types (for the probe, and for a trainer registering its parameters by name). Part
 * of <stabmeter.h>. */
#ifndef STABMETER_MODEL_H
#define STABMETER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"
#include "checkpoint.h"
#include "formats.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Tensor names across formats: llama.cpp's GGUF names and Hugging Face's              */

/* A GGUF file converted from a Hugging Face checkpoint by llama.cpp's convert_hf_to_gguf.py
 * names its tensors blk.N.attn_q.weight where the safetensors has
 * model.layers.N.self_attn.q_proj.weight, and some values change on the way. These map one
 * name to the other, for the architectures (GGUF general.architecture) whose converter maps
 * names plainly: "llama" (Llama, and HF Mistral, which converts as Llama), "qwen2", "gemma",
 * "phi3" (fused attn_qkv <-> self_attn.qkv_proj, ffn_up <-> mlp.gate_up_proj) and "gpt2" (HF
 * names with or without "transformer."; GGUF to HF gives them without). For the llama family:
 * token_embd <-> model.embed_tokens, output <-> lm_head, output_norm <-> model.norm, and in
 * block N (blk.N. <-> model.layers.N.) attn_q/attn_k/attn_v/attn_output <->
 * self_attn.q_proj/k_proj/v_proj/o_proj, ffn_gate/ffn_up/ffn_down <->
 * mlp.gate_proj/up_proj/down_proj, attn_norm <-> input_layernorm, ffn_norm <->
 * post_attention_layernorm. GPT-2: token_embd <-> wte, position_embd <-> wpe, output_norm <->
 * ln_f, output <-> lm_head, and in block N (blk.N. <-> h.N.) attn_qkv <-> attn.c_attn,
 * attn_output <-> attn.c_proj, ffn_up <-> mlp.c_fc, ffn_down <-> mlp.c_proj, attn_norm <->
 * ln_1, ffn_norm <-> ln_2. The ".weight" or ".bias" suffix is kept; a name without one, or of
 * a module not listed, has no mapping. */

/* The converter's q/k row permutation (LlamaModel.permute), for the llama architecture only:
 * Qwen2, Gemma, Phi-3 and GPT-2 keep HF's row order. */
typedef enum {
  STAB_QK_NONE = 0,  /* rows as HF has them */
  STAB_QK_QUERY = 1, /* q_proj: rows permuted within each of the <arch>.attention.head_count heads */
  STAB_QK_KEY = 2    /* k_proj: the same within each of the head_count_kv key heads */
} stab_qk_rows;

/* What the converter did to a tensor's values besides renaming it. */
typedef struct {
  stab_qk_rows rows; /* the q/k row permutation (stab_qk_permutation), weight and bias alike */
  int conv1d;        /* 1 for a GPT-2 Conv1D weight (c_attn, c_proj, c_fc): HF stores it
                        [d_in][d_out], the converter transposes it to GGUF's [d_out][d_in] (a
                        file written out-major under these names, as nanoGPT and
                        stabmeter-train do, is not transposed: tell by shape or producer) */
  float gguf_offset; /* the GGUF value is the HF value plus this: 1 for Gemma's norm weights
                        (HF stores w - 1, llama.cpp w), else 0 */
} stab_name_transform;

/* 1 when arch (a GGUF general.architecture) has a name map here, else 0 (NULL too). */
int stab_name_map_knows(const char *arch);

/* The Hugging Face name of GGUF tensor gguf_name of a model of architecture arch, into out
 * (cap bytes, NUL-terminated), and what the converter did to it into *how (NULL: not wanted).
 * Errors: NULL arguments or cap 0 STAB_EINVAL; an architecture or name with no mapping
 * STAB_ENOTFOUND (the message names which); out too small STAB_ERANGE. Thread-safe. */
stab_status stab_name_map_to_hf(const char *arch, const char *gguf_name, char *out, size_t cap,
                                stab_name_transform *how);

/* The GGUF name of Hugging Face tensor hf_name, as stab_name_map_to_hf the other way. */
stab_status stab_name_map_to_gguf(const char *arch, const char *hf_name, char *out, size_t cap,
                                  stab_name_transform *how);

/* The converter's row order for a q or k weight (or bias) of rows rows in heads heads (query
 * heads for q, key heads for k): perm[i] is the HF row stored as GGUF row i (rows entries).
 * Within each head of width dh, HF row s*dh/2 + j (rotary half s, pair j) becomes row 2j + s.
 * Errors: NULL perm or heads 0 STAB_EINVAL; rows 0 or not heads of an even width STAB_ERANGE.
 * Thread-safe. */
stab_status stab_qk_permutation(size_t rows, size_t heads, size_t *perm);

/* ---------------------------------------------------------------------------------- */
/* What each tensor of a model is: the kind rules                                      */
/*
 * One set of rules decides, from the names, shapes and dtypes of a model's tensors, which
 * layers they make: each tensor's kind and layout, biases folded into their weights, query/key
 * pairs (fused or not, grouped-query) as attention layers, a tied head, and the names the
 * trace gives them. stabmeter-probe describes every checkpoint with them, and a trainer can
 * register its own parameters by name the same way: fill one stab_ckpt_tensor per parameter
 * (name, dtype STAB_DTYPE_F32, elem_size 4, ndim and shape as PyTorch prints them, count, data
 * = the buffer; offset unused), describe, and register each entry with stab_model_entry_layer.
 *
 * The rules, applied to every tensor in order (the first that matches decides):
 *  1. dtype STAB_DTYPE_OTHER: not measured, with the type's name.
 *  2. a kind override GLOB=KIND (stab_model_config.kinds, first match): skip lists it as not
 *     measured; otherwise that kind, for a 2-D tensor (linear, embedding, lm_head) or a 1-D one
 *     (gain, bias), else not measured with the mismatch.
 *  3. 3-D [n_expert][rows][cols] whose module name's last component ends in "_exps" (llama.cpp's
 *     blk.N.ffn_{gate,up,down}_exps, stored ne = {cols, rows, n_expert}): a layer of experts,
 *     each expert slice a linear layer [rows][cols] out-major (see Experts below).
 *     3-D X.bias_k, X.bias_v (nn.MultiheadAttention's add_bias_kv, [1][1][E]: a learned key and
 *     value appended to every sequence as one more position): not measured, saying so.
 *     Other 0-D, 3-D and up: not measured (no rule for them), override or not.
 *  4. 2-D, module name (the name without a trailing .weight or .bias) whose last component is
 *     wte wpe embed_tokens tok_embeddings token_embd word_embeddings position_embeddings
 *     token_type_embeddings embed_positions position_embd token_types: embedding, [V][d]
 *     (GGUF's ne = {d, V} is that same [V][d]).
 *  5. 2-D, last component lm_head, output or embed_out: lm_head, [V][d] (llama.cpp's
 *     output.weight; its blk.N.attn_output is a linear layer: the last component differs).
 *  6. 2-D otherwise: linear, out-major ([d_out][d_in], PyTorch nn.Linear, GGUF), except the HF
 *     GPT-2 Conv1D weights h.N.attn.c_attn, h.N.attn.c_proj, h.N.mlp.c_fc, h.N.mlp.c_proj, which
 *     are in-major when their shape is Conv1D's (c_attn [d][3d], c_fc wider than tall, mlp.c_proj
 *     taller than wide; nanoGPT stores the same names out-major) unless config.out_major; a
 *     layout override GLOB=in_major|out_major decides first. Routers (Mixtral's
 *     block_sparse_moe.gate, Qwen2-MoE's mlp.gate, GGUF ffn_gate_inp) and fused projections
 *     (Phi-3's gate_up_proj) are linear layers by this rule.
 *  7. 1-D X.bias where X.weight is a linear layer with d_out = its length: folded into it (so
 *     Qwen2's q/k/v biases are part of q_proj, k_proj, v_proj). nn.MultiheadAttention's
 *     X.in_proj_bias [3E] is folded into X.in_proj_weight [3E][E] (then split with it, below),
 *     or, when the module has separate X.q_proj_weight, X.k_proj_weight, X.v_proj_weight (kdim
 *     or vdim not E; each [E][.]), a third into each (bias_offset 0, E, 2E); else a bias.
 *  8. 1-D whose module name has a component containing "norm" (any case) or starting with "ln":
 *     gain if it is X.weight or has no suffix, bias if X.bias (a LayerNorm shift); llama.cpp's
 *     attn_norm, ffn_norm, output_norm, attn_q_norm are such.
 *  9. 1-D X.bias (or X.in_proj_bias) otherwise: bias.
 * 10. anything else: not measured.
 * Attention: for each query weight by name, its key (first match of the suffixes):
 *   X.q_proj.weight  X.k_proj.weight  (HF Llama, Mistral, Qwen2, Gemma, OPT)  X.logits
 *   X.query.weight   X.key.weight     (HF BERT)                               X.logits
 *   X.wq.weight      X.wk.weight      (Meta Llama)                            X.logits
 *   X.attn_q.weight  X.attn_k.weight  (llama.cpp GGUF)                        X.attn_logits
 *   X.attn.q.weight  X.attn.k.weight  (llm.c, whose reader splits the fused qkv; naming LLMC only)
 *                                                                             X.attn.logits
 *   X.q_proj_weight  X.k_proj_weight  (nn.MultiheadAttention, kdim/vdim)      X.logits
 *   X.c_attn.weight, X.qkv_proj.weight, X.qkv.weight, X.attn_qkv.weight, X.in_proj_weight:
 *                    fused q, k, v (GPT-2, Phi-3, ViT, GGUF, nn.MultiheadAttention)
 *                                                    X.logits (X.attn_logits for GGUF's)
 * (a bare module's names match too: in_proj_weight gives "logits"). A fused tensor is q, k, v
 * in that order along d_out: heads * d_h, kv_heads * d_h and kv_heads * d_h outputs, split by
 * heads with kv_heads or head_dim when the config has them (Phi-3: (32 + 2*8) * 96 rows), else
 * in three equal parts. Fused q/k/v: a fused tensor that is a linear layer (by rule 6 or an
 * override) is THREE linear entries in its place, q, k and v (part 1, 2, 3), named M.q, M.k,
 * M.v where M is its module (the name without ".weight", or without "_weight" for
 * in_proj_weight: h.0.attn.c_attn.q, layers.0.self_attn.in_proj.q), each its block of the
 * tensor and its slice of the folded bias (bias_offset): out-major, a block of whole rows
 * (offset = first row * d_in, ld 0); in-major (HF GPT-2's Conv1D [C][3C]), a block of columns
 * (offset = first column, ld = the stored row, 3C). Widths that cannot be split as above leave
 * it one linear layer under its own name (and the attention entry says why). Phi-3's
 * gate_up_proj is no q/k/v: one layer. Key heads of separate tensors
 * follow from the key's width (d_out(k) / d_h, d_h = d_out(q) / heads), and must agree with
 * config.kv_heads and head_dim when those are given. An attention pair that cannot be measured
 * (no head count, widths that heads do not divide) is an entry with the reason.
 * Experts: a 3-D expert tensor (rule 3), and the 2-D linear layers named X.experts.E.Y.weight
 * (E decimal digits: Mixtral's block_sparse_moe.experts.E.w1, Qwen2-MoE's, DeepSeek's and
 * OLMoE's mlp.experts.E.gate_proj ...; shared_experts are ordinary linears) of one X and Y with
 * the same shape, are one layer of experts: an entry with n_expert set, named X.experts.Y (the
 * 3-D tensor's module name for GGUF), followed at once by one entry per expert, in expert order,
 * named as a trainer registering each expert would: the tensor's (X.experts.E.Y) or, for a slice
 * of a 3-D tensor, the module name and the index (blk.0.ffn_up_exps.E), whose weight is a view
 * of the slice (stab_model_expert_view). The layer's entry reads nothing itself: its metrics are
 * its experts' (a report gives the worst expert per metric). Routers are linear layers (rule 6).
 * Tied head: with config.tie 1 or -1 (unknown), a model with no lm_head tensor (by rule 5, even
 * one not measured) and a token embedding (rule 4, not a position table, not overridden) is
 * tied: that embedding is an entry a second time, as lm_head, named "lm_head" (X.lm_head when
 * another entry is named lm_head already). With tie 0, never.
 * Names, as stabmeter-train's trace has them: the tensor name without a trailing ".weight"
 * (transformer.h.0.mlp.c_fc; nn.MultiheadAttention's X.q_proj_weight without "_weight":
 * X.q_proj), a bias of its own keeping its ".bias" (it would clash with its norm's gain), a name
 * another entry already has keeping the tensor name; the parts of a fused q/k/v as above; a
 * tensor not measured keeps its tensor name.
 * Order: one entry per tensor not folded, in the input's order (a fused q/k/v's three parts
 * where it is; a layer of experts where its first expert tensor is, its experts after it), then
 * the attention entries, then the tied head.
 */

/* The naming scheme of the file the tensors come from, for the rules only one scheme has. */
typedef enum {
  STAB_NAMING_ANY = 0,  /* unknown, or a trainer's own names: the general rules */
  STAB_NAMING_HF = 1,   /* safetensors, Hugging Face / PyTorch names */
  STAB_NAMING_GGUF = 2, /* llama.cpp's GGUF names (blk.N.attn_q ...) */
  STAB_NAMING_LLMC = 3  /* llm.c's checkpoint as stab_llmc names its views */
} stab_naming;

/* GLOB=VALUE: tensors whose name matches glob (fnmatch, no flags) get value. */
typedef struct {
  const char *glob;
  const char *value; /* kinds: linear, embedding, lm_head, gain, bias or skip;
                        layouts: in_major or out_major */
} stab_model_override;

/* What is known of the model besides its tensors: plain values, 0 (or -1) for unknown. The
 * caller owns every pointer; they must outlive stab_model_describe only. */
typedef struct {
  stab_naming naming;
  int out_major;         /* 1: GPT-2 Conv1D-named matrices are out-major too (stabmeter-train's
                            files, nanoGPT); 0: by their shape (rule 6) */
  size_t heads;          /* attention heads; 0 unknown (attention entries then say so) */
  size_t kv_heads;       /* key/value heads (grouped-query attention); 0 unknown */
  size_t head_dim;       /* d_h; 0 unknown (d_out(q) / heads) */
  const char *heads_source; /* where heads came from, for the messages ("--heads", "config.json");
                               NULL: "the config" */
  const char *heads_error;  /* why heads is 0 when the metadata had an invalid count, for the
                               attention entries' reason; NULL otherwise */
  int tie;               /* -1 unknown (tied when there is no head tensor), 0 not tied, 1 tied */
  const char *const *other_names; /* n_other names of the model's tensors that are not in the
                                     list (another shard's): a head among them means the model
                                     has its head, so no tied head is made */
  size_t n_other;
  const stab_model_override *kinds;   /* nkinds kind overrides, first match wins */
  size_t nkinds;
  const stab_model_override *layouts; /* nlayouts layout overrides, for linear layers */
  size_t nlayouts;
} stab_model_config;

/* naming ANY, out_major 0, heads, kv_heads, head_dim 0, tie -1, no overrides. */
stab_model_config stab_model_default_config(void);

/* The head count of a GGUF file into cfg: <general.architecture>.attention.head_count, and
 * head_count_kv and key_length when present (a per-layer array is left unknown); naming GGUF.
 * A cfg->heads already set (a user's) is kept, as are kv_heads and head_dim.
 * Errors: NULL arguments STAB_EINVAL; a head count that is present but not 1 to
 * STAB_MODEL_MAX_HEADS, STAB_ERANGE (heads left 0; the message names the key and value). */
stab_status stab_model_config_from_gguf(const stab_gguf *f, stab_model_config *cfg);
/* The same from a safetensors file's __metadata__: heads from "heads", "num_attention_heads"
 * or "n_head" (the first present, decimal digits only), out_major when "producer" starts with
 * stabmeter-train; naming HF. Errors as above (a value that is not a whole number in range). */
stab_status stab_model_config_from_safetensors(const stab_safetensors *f, stab_model_config *cfg);

/* The scale of the attention logits q.k a checkpoint's model applies: 1/sqrt(d_h) (GPT-2,
 * Llama, every Hugging Face model) or 1/d_h (muP; stabmeter-train --attn-scale inverse). */
typedef enum { STAB_ATTN_SCALE_SQRT = 0, STAB_ATTN_SCALE_INVERSE = 1 } stab_attn_scale;

/* The attention scale a safetensors file's __metadata__ "attn_scale" names ("sqrt" or
 * "inverse", as stabmeter-train writes it) into *out; absent: STAB_ATTN_SCALE_SQRT (config.json
 * and GGUF have no such field). Errors: NULL arguments STAB_EINVAL; any other value
 * STAB_EFORMAT (the message names the value; *out is SQRT). */
stab_status stab_model_attn_scale_from_safetensors(const stab_safetensors *f, stab_attn_scale *out);

/* The factor stab_layer.scale takes for that scale and head width d_h: 1/sqrt(d_h) or 1/d_h;
 * 0 (the library's default, 1/sqrt(d_h)) when head_dim is 0. Thread-safe. */
double stab_attn_scale_of(stab_attn_scale scale, size_t head_dim);

/* What a Hugging Face config.json says (stab_hf_config_read) into cfg: the head count with its
 * key heads and head_dim (when cfg->heads is 0: a user's count is kept, and the key heads and
 * head width come only with the count they belong to), and tie from tie_word_embeddings.
 * Errors: NULL arguments STAB_EINVAL; num_attention_heads above STAB_MODEL_MAX_HEADS STAB_ERANGE
 * (heads left 0; the message names it). */
stab_status stab_model_config_from_hf(const stab_hf_config *hf, stab_model_config *cfg);

/* The largest head count accepted. */
#define STAB_MODEL_MAX_HEADS (1 << 20)

/* One layer of the model, or one tensor that is not measured (why_not set). Sizes are in the
 * kind's math (stab_layer's d_in, d_out: an embedding's d_in is V, an lm_head's d_out is V). */
typedef struct {
  const char *name;      /* the layer's name as a trace has it (see the rules); owned by the model */
  stab_kind kind;
  stab_layout layout;    /* linear, attention: OUT_MAJOR or IN_MAJOR; NATURAL for other kinds */
  size_t d_in, d_out;    /* attention: d_in = d, d_out = heads * d_h (the query's outputs) */
  const stab_ckpt_tensor *weight; /* the tensor read (attention: the query's; a tied head: the
                                     embedding's); for an entry not measured, the tensor */
  const stab_ckpt_tensor *bias;     /* linear: the folded X.bias, or NULL */
  const stab_ckpt_tensor *weight_k; /* attention: the key's tensor (weight itself when fused) */
  size_t ld;             /* attention: the stored row length of weight, in elements; a part
                            of an in-major fused q/k/v: its stored row (3C); else 0 */
  size_t q_off, k_off;   /* attention: elements from the start of weight, weight_k to q and k */
  size_t heads;          /* attention: query heads */
  size_t kv_heads;       /* attention: key heads (fewer than heads: grouped-query) */
  int tied;              /* 1: a tied table entered a second time as lm_head */
  size_t n_expert;       /* a layer of experts: how many (its expert entries follow it); else 0 */
  size_t expert;         /* an expert's entry: its index (E of the name, or the slice); else
                            STAB_MODEL_NO_EXPERT */
  size_t group;          /* an expert's entry: the index of its layer's entry; else 0 */
  const char *why_not;   /* NULL, or why this tensor is not measured; owned by the model */
  /* (appended in 0.11.0) */
  size_t offset;         /* linear: elements from the start of weight to the layer's first
                            element (a part of a fused q/k/v: rows * d_in out-major, its first
                            column in-major, with ld); else 0 */
  size_t bias_offset;    /* linear: elements from the start of bias to the layer's slice of it;
                            else 0 */
  int part;              /* 1, 2, 3: the q, k or v block of a fused q/k/v tensor; else 0 */
} stab_model_entry;

#define STAB_MODEL_NO_EXPERT ((size_t)-1)
/* The most experts one layer may have (DeepSeek-V3 has 256, Kimi K2 384); a 3-D tensor with
 * more is not measured, with the reason. A model's 3-D tensors have at most 32 times as many
 * experts in all (a hostile file must not make the model allocate without bound); past that, a
 * 3-D tensor is not measured either. */
#define STAB_MODEL_MAX_EXPERTS 4096

/* A 2-D view [rows][cols] of expert slice `expert` of the 3-D tensor t [n_expert][rows][cols]:
 * the same name, dtype and file, data and offset moved to the slice (for a block-quantized
 * type, whole blocks: GGUF rows are whole blocks), so that stab_ckpt_read_f32, _release and
 * _prefetch read that expert alone. Errors: NULL arguments, t not 3-D, expert out of range,
 * or a quantized slice that is not whole blocks, STAB_EINVAL. */
stab_status stab_model_expert_view(const stab_ckpt_tensor *t, size_t expert, stab_ckpt_tensor *view);

typedef struct stab_model stab_model;

/* Describes a model from its tensors by the rules above.
 *  tensors  n tensor views (a reader's, or the caller's own); only name, dtype, dtype_name,
 *           ndim, shape and count are read here. They must outlive the model (entries point
 *           at them)
 *  config   NULL for stab_model_default_config()
 *  out      receives the model; free with stab_model_free
 * Errors: NULL tensors (with n > 0) or out STAB_EINVAL; a NULL tensor or name STAB_EINVAL naming
 * its index; a kind override whose value is not linear, embedding, lm_head, gain, bias or skip,
 * or a layout override's not in_major or out_major, STAB_EINVAL naming it (never ignored);
 * STAB_ENOMEM. A tensor the rules cannot measure is an entry with why_not, not an
 * error. The model is read-only after this: any number of threads may use it. */
stab_status stab_model_describe(const stab_ckpt_tensor *const *tensors, size_t n,
                                const stab_model_config *config, stab_model **out);
/* NULL is a no-op. */
void stab_model_free(stab_model *m);
/* The layout rule 6 gives a 2-D linear tensor named name of shape [rows][cols] under config
 * (NULL: defaults): STAB_LAYOUT_IN_MAJOR for an HF GPT-2 Conv1D weight in Conv1D's shape (unless
 * config->out_major), a layout override's, else STAB_LAYOUT_OUT_MAJOR (also for a NULL name). */
stab_layout stab_model_linear_layout(const stab_model_config *config, const char *name, size_t rows, size_t cols);
/* 1 when the model has a head tensor (rule 5 or a kind override, measured or not, or one of
 * config.other_names), 0 when it has none (then tied, or with config.tie 0 missing). */
int stab_model_has_head(const stab_model *m);
/* Entries in the order of the rules (tensors, then attention, then the tied head); NULL past
 * the end. */
size_t stab_model_count(const stab_model *m);
const stab_model_entry *stab_model_entry_at(const stab_model *m, size_t index);

/* The stab_layer of entry e, reading weight, bias and weight_k: the values of e->weight,
 * e->bias and e->weight_k from their first element, all three stored as dtype (F32, F16 or
 * BF16: the tensors' own data when their dtype is one of these, or the caller's f32 copy;
 * the layer's .dtype). The offsets into a fused tensor are added here, in elements of dtype
 * (attention: q_off, k_off; a linear part of a fused q/k/v: offset and bias_offset, with ld);
 * bias and weight_k are NULL when e has none. The layer is named e->name; an attention
 * entry's kv_heads is the layer's. A layer of experts is no stab_layer (register its
 * experts). Errors: NULL e, weight or out, an entry not measured or a layer of experts, a
 * dtype other than F32, F16 and BF16, STAB_EINVAL. */
stab_status stab_model_entry_layer(const stab_model_entry *e, stab_dtype dtype, const void *weight,
                                   const void *bias, const void *weight_k, stab_layer *out);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_MODEL_H */
