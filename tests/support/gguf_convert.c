/* gguf_convert.c — test and demo helper: converts one of our safetensors checkpoints
 * (stabmeter-train's GPT-2 names, or Hugging Face Llama names) into a GGUF file named and laid
 * out as llama.cpp's convert_hf_to_gguf.py would write it, with the 2-D weights in a chosen
 * type, quantized by tests/support/gguf_quant.c (our own simple quantizers, not llama.cpp's); and, with
 * --reference, the quantization error each layer of such a pair must show, computed here from
 * the file's blocks decoded by the tests' own decoder, independently of the probe.
 *
 * Usage: gguf_convert [--arch llama|qwen2|gemma|gpt2] [--heads H] [--kv-heads K] [--no-permute]
 *                     IN.safetensors OUT.gguf TYPE
 *   TYPE: F32, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K or Q4_K. 1-D tensors (norms, biases) stay
 *   F32, as llama.cpp keeps them. A weight whose rows are not whole blocks of TYPE falls back
 *   as llama.cpp's quantizer does (Q4_K to Q5_0, Q6_K to Q8_0), then to F16, said on stderr.
 *   Names by llama.cpp's tensor map (written out below, apart from the library's name map);
 *   Llama's q_proj and k_proj rows permuted within each head as LlamaModel.permute does (the
 *   query heads for q, the key heads for k; --no-permute leaves them, to show what a missed
 *   permutation looks like); HF GPT-2 Conv1D weights transposed unless the file is
 *   stabmeter-train's (out-major already); --arch gemma stores the norm weights plus one, as
 *   llama.cpp does for Gemma (whose HF weights are w - 1), and qwen2 and gemma keep HF's q/k
 *   row order (their converter classes do not permute). Metadata: general.architecture, general.name,
 *   general.file_type, general.quantization_version, <arch>.context_length,
 *   embedding_length, block_count, feed_forward_length, attention.head_count and
 *   head_count_kv, rope.dimension_count (llama), the norm epsilon. No tokenizer: llama.cpp
 *   cannot run the file, the probe reads it.
 *   Heads: --heads, else __metadata__ heads, num_attention_heads or n_head; key heads:
 *   --kv-heads, else __metadata__ kv_heads or num_key_value_heads, else from k_proj's rows.
 *
 * Usage: gguf_convert --reference IN.safetensors CONVERTED.gguf
 *   One line per weight of IN that has a counterpart in CONVERTED:
 *     GGUF_NAME HF_NAME KIND UPDATE DW_F W_GGUF_F W_HF_F
 *   UPDATE the update metric of dW = W_gguf - W_hf in docs/manual/metrics.md's definition for the
 *   kind (linear sqrt(d_in/d_out) sigma(dW) plus the bias's RMS, sigma by LAPACK dgesvd in f64;
 *   embedding max_i RMS(dE_i); lm_head 2 d max_i RMS(dw_i); gain max |dg|; bias RMS(db)), and
 *   the Frobenius norms of dW, W_gguf and W_hf; a tied model's head (no output.weight) gets a
 *   line "token_embd.weight HF_NAME lm_head ...", and GPT-2's fused attn_qkv three lines, one
 *   per third of its rows (q, k, v as the probe splits it), named blk.N.attn_qkv.q and
 *   HF_MODULE.q (k, v) as the probe names those layers. The GGUF values are decoded here (F32 as
 *   stored, F16 by bits, block types by gq_element), rows put back in HF order by this file's
 *   own permutation.
 * Usage: gguf_convert --make llama|gpt2 OUT.safetensors
 *   Writes a model to convert: Llama-shaped (V 96, d 256, 4 query heads and 2 key heads of 64,
 *   ff 512, 2 blocks, an lm_head of its own: rows of 256 and 512, so that Q4_K applies) or HF
 *   GPT-2 (V 64, d 64, 2 heads, 1 block, tied, Conv1D weights in-major with biases), i.i.d.
 *   Gaussian weights (std 0.02, norms 1 + 0.1 N(0, 1)), heads in __metadata__.
 * Exit 0, 1 on failure, 2 on bad usage or input. */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_quant.h"
#include "gguf_writer.h"
#include "st_writer.h"
#include "stabmeter.h"

/* ---- llama.cpp's names ------------------------------------------------------------- */

typedef struct {
  const char *hf, *gguf;
} name_pair;

static const name_pair llama_top[] = {{"model.embed_tokens", "token_embd"}, {"lm_head", "output"},
                                      {"model.norm", "output_norm"}, {NULL, NULL}};
static const name_pair llama_block[] = {{"self_attn.q_proj", "attn_q"},   {"self_attn.k_proj", "attn_k"},
                                        {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"},
                                        {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},
                                        {"mlp.down_proj", "ffn_down"},    {"input_layernorm", "attn_norm"},
                                        {"post_attention_layernorm", "ffn_norm"}, {NULL, NULL}};
static const name_pair gpt2_top[] = {{"wte", "token_embd"}, {"wpe", "position_embd"}, {"ln_f", "output_norm"},
                                     {"lm_head", "output"}, {NULL, NULL}};
static const name_pair gpt2_block[] = {{"ln_1", "attn_norm"},       {"attn.c_attn", "attn_qkv"},
                                       {"attn.c_proj", "attn_output"}, {"ln_2", "ffn_norm"},
                                       {"mlp.c_fc", "ffn_up"},       {"mlp.c_proj", "ffn_down"}, {NULL, NULL}};

static int gpt2_arch(const char *arch) { return !strcmp(arch, "gpt2"); }

/* The GGUF name of HF tensor name into out, and its block (or -1) and module; 0 when unmapped. */
static int to_gguf(const char *arch, const char *name, char *out, size_t cap, long *block, const char **module) {
  const name_pair *top = gpt2_arch(arch) ? gpt2_top : llama_top, *blk = gpt2_arch(arch) ? gpt2_block : llama_block;
  const char *prefix = gpt2_arch(arch) ? "h." : "model.layers.";
  if (gpt2_arch(arch) && !strncmp(name, "transformer.", 12)) name += 12;
  const char *dot = strrchr(name, '.');
  if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return 0;
  size_t mlen = (size_t)(dot - name);
  *block = -1;
  for (const name_pair *p = top; p->hf; p++)
    if (strlen(p->hf) == mlen && !strncmp(name, p->hf, mlen)) {
      *module = p->gguf;
      snprintf(out, cap, "%s%s", p->gguf, dot);
      return 1;
    }
  size_t pl = strlen(prefix);
  if (strncmp(name, prefix, pl)) return 0;
  char *end;
  long b = strtol(name + pl, &end, 10);
  if (end == name + pl || *end != '.' || b < 0) return 0;
  const char *mod = end + 1;
  size_t len = (size_t)(dot - mod);
  for (const name_pair *p = blk; p->hf; p++)
    if (strlen(p->hf) == len && !strncmp(mod, p->hf, len)) {
      *block = b, *module = p->gguf;
      snprintf(out, cap, "blk.%ld.%s%s", b, p->gguf, dot);
      return 1;
    }
  return 0;
}

/* ---- the q/k rows ------------------------------------------------------------------ */

/* LlamaModel.permute: within each head of width dh, HF row s*dh/2 + j (rotary half s, pair j)
 * is stored as row 2j + s. The stored row r's source row. */
static size_t permuted_source(size_t r, size_t dh) {
  size_t h = r / dh, i = r % dh, j = i / 2, s = i % 2;
  return h * dh + s * (dh / 2) + j;
}

/* ---- types ------------------------------------------------------------------------- */

typedef struct {
  const char *name;
  uint32_t type, file_type; /* GGML type; general.file_type of a file mostly of it */
  const char *fallback;     /* when a row is not whole blocks */
} out_type;

static const out_type out_types[] = {
    {"F32", 0, 0, NULL},      {"F16", 1, 1, NULL},      {"Q4_0", 2, 2, "F16"},    {"Q4_1", 3, 3, "F16"},
    {"Q5_0", 6, 8, "F16"},    {"Q5_1", 7, 9, "F16"},    {"Q8_0", 8, 7, "F16"},    {"Q4_K", 12, 14, "Q5_0"},
    {"Q6_K", 14, 18, "Q8_0"}, {NULL, 0, 0, NULL}};

static const out_type *type_named(const char *name) {
  for (const out_type *t = out_types; name && t->name; t++)
    if (!strcmp(t->name, name)) return t;
  return NULL;
}

static const gq_type *block_type(uint32_t type) {
  for (int i = 0; i < GQ_NTYPES; i++)
    if ((uint32_t)gq_types[i].type == type) return &gq_types[i];
  return NULL;
}

/* ---- the checkpoint ---------------------------------------------------------------- */

static const char *metadata(const stab_safetensors *st, const char *key) {
  for (size_t i = 0; i < stab_safetensors_metadata_count(st); i++) {
    const char *k, *v;
    stab_safetensors_metadata(st, i, &k, &v);
    if (!strcmp(k, key)) return v;
  }
  return NULL;
}

static size_t metadata_uint(const stab_safetensors *st, const char *const *keys) {
  for (size_t i = 0; keys[i]; i++) {
    const char *v = metadata(st, keys[i]);
    if (v) return (size_t)strtoul(v, NULL, 10);
  }
  return 0;
}

static float *read_all(const stab_ckpt_tensor *t) {
  float *x = malloc((size_t)t->count * sizeof *x);
  if (x && stab_ckpt_read_f32(t, 0, (size_t)t->count, x) != STAB_OK) {
    fprintf(stderr, "gguf_convert: %s\n", stab_last_error());
    free(x);
    return NULL;
  }
  return x;
}

static int usage(void) {
  fprintf(stderr, "usage: gguf_convert [--arch A] [--heads H] [--kv-heads K] [--no-permute] IN.safetensors OUT.gguf TYPE\n"
                  "       gguf_convert --reference IN.safetensors CONVERTED.gguf\n");
  return 2;
}

typedef struct {
  const char *arch;
  size_t heads, kv_heads, dh;
  int permute, conv1d_in_major;
  float norm_offset; /* added to norm weights (Gemma) */
} model;

/* The architecture, heads and layouts of st (arch_opt, heads_opt, kv_opt: the options or 0). */
static int describe(const stab_safetensors *st, const char *arch_opt, size_t heads_opt, size_t kv_opt, model *m) {
  static const char *const head_keys[] = {"heads", "num_attention_heads", "n_head", NULL};
  static const char *const kv_keys[] = {"kv_heads", "num_key_value_heads", NULL};
  memset(m, 0, sizeof *m);
  m->arch = arch_opt;
  const stab_ckpt_tensor *q = NULL, *k = NULL;
  for (size_t i = 0; i < stab_safetensors_count(st); i++) {
    const char *n = stab_safetensors_tensor(st, i)->name;
    if (!m->arch && (!strncmp(n, "model.layers.", 13) || !strcmp(n, "model.embed_tokens.weight"))) m->arch = "llama";
    if (!m->arch && (strstr(n, "wte.weight") || strstr(n, ".attn.c_attn."))) m->arch = "gpt2";
    if (!q && strstr(n, ".self_attn.q_proj.weight")) q = stab_safetensors_tensor(st, i);
    if (!k && strstr(n, ".self_attn.k_proj.weight")) k = stab_safetensors_tensor(st, i);
  }
  if (!m->arch) {
    fprintf(stderr, "gguf_convert: neither Llama nor GPT-2 tensor names\n");
    return 2;
  }
  m->heads = heads_opt ? heads_opt : metadata_uint(st, head_keys);
  m->kv_heads = kv_opt ? kv_opt : metadata_uint(st, kv_keys);
  if (!m->heads) {
    fprintf(stderr, "gguf_convert: no head count (give --heads H)\n");
    return 2;
  }
  if (q && k && !m->kv_heads && q->shape[0] % m->heads == 0)
    m->kv_heads = (size_t)k->shape[0] / ((size_t)q->shape[0] / m->heads);
  if (!m->kv_heads) m->kv_heads = m->heads;
  if (q) m->dh = (size_t)q->shape[0] / m->heads;
  m->permute = !strcmp(m->arch, "llama");
  m->norm_offset = !strcmp(m->arch, "gemma") ? 1.0f : 0.0f;
  const char *producer = metadata(st, "producer");
  m->conv1d_in_major = gpt2_arch(m->arch) && !(producer && !strncmp(producer, "stabmeter-train", 15));
  return 0;
}

static int is_conv1d(const char *module) {
  return !strcmp(module, "attn_qkv") || !strcmp(module, "attn_output") || !strcmp(module, "ffn_up") ||
         !strcmp(module, "ffn_down");
}

/* The tensor's values in GGUF's order (rows permuted, Conv1D transposed), rows x cols. */
static float *converted_values(const model *m, const stab_ckpt_tensor *t, const char *module, int weight,
                               int permute, size_t *rows, size_t *cols) {
  float *x = read_all(t);
  if (!x) return NULL;
  *rows = t->ndim == 2 ? (size_t)t->shape[0] : 1, *cols = t->ndim == 2 ? (size_t)t->shape[1] : (size_t)t->count;
  if (t->ndim == 2 && weight && m->conv1d_in_major && is_conv1d(module)) {
    float *y = malloc((size_t)t->count * sizeof *y);
    for (size_t i = 0; y && i < *rows; i++)
      for (size_t j = 0; j < *cols; j++) y[j * *rows + i] = x[i * *cols + j];
    free(x);
    size_t r = *rows;
    *rows = *cols, *cols = r;
    return y;
  }
  if (weight && m->norm_offset != 0.0f && strstr(module, "_norm"))
    for (size_t e = 0; e < (size_t)t->count; e++) x[e] += m->norm_offset;
  int q = !strcmp(module, "attn_q"), k = !strcmp(module, "attn_k");
  if (permute && m->permute && (q || k)) {
    /* a bias is one column of rows values */
    size_t nrows = t->ndim == 2 ? *rows : *cols, width = t->ndim == 2 ? *cols : 1;
    size_t heads = q ? m->heads : m->kv_heads;
    if (nrows % heads || (nrows / heads) % 2) {
      fprintf(stderr, "gguf_convert: %s: %zu rows are not %zu heads of an even width\n", t->name, nrows, heads);
      free(x);
      return NULL;
    }
    float *y = malloc((size_t)t->count * sizeof *y);
    for (size_t r = 0; y && r < nrows; r++)
      memcpy(y + r * width, x + permuted_source(r, nrows / heads) * width, width * sizeof *y);
    free(x);
    return y;
  }
  return x;
}

/* Encodes rows x cols values x in type t into a new buffer (*nbytes). */
static unsigned char *encode(const out_type *t, const float *x, size_t rows, size_t cols, size_t *nbytes) {
  size_t n = rows * cols;
  if (t->type == 0) {
    *nbytes = n * 4;
    unsigned char *b = malloc(*nbytes);
    if (b) memcpy(b, x, *nbytes);
    return b;
  }
  if (t->type == 1) {
    *nbytes = n * 2;
    uint16_t *h = malloc(*nbytes);
    if (h) stw_encode16(x, n, 0, h);
    return (unsigned char *)h;
  }
  const gq_type *q = block_type(t->type);
  size_t blocks = n / q->block;
  *nbytes = blocks * q->bytes;
  unsigned char *b = malloc(*nbytes);
  float deq[256];
  double bnd[256];
  for (size_t i = 0; b && i < blocks; i++)
    if (gq_quantize(q, x + i * q->block, b + i * q->bytes, deq, bnd)) {
      free(b);
      return NULL;
    }
  return b;
}

static int convert(const model *m, const stab_safetensors *st, const char *out_path, const out_type *want, int permute) {
  gw_file w;
  gw_init(&w);
  char key[128];
  size_t d = 0, blocks = 0, ff = 0, ctx = 0;
  for (size_t i = 0; i < stab_safetensors_count(st); i++) {
    const stab_ckpt_tensor *t = stab_safetensors_tensor(st, i);
    char g[512];
    long b;
    const char *mod;
    if (!to_gguf(m->arch, t->name, g, sizeof g, &b, &mod) || t->ndim != 2) continue;
    if (!strcmp(mod, "token_embd")) d = (size_t)t->shape[1];
    if (!strcmp(mod, "position_embd")) ctx = (size_t)t->shape[0];
    if (!strcmp(mod, "ffn_up")) ff = (size_t)(m->conv1d_in_major ? t->shape[1] : t->shape[0]);
    if (b >= 0 && (size_t)b + 1 > blocks) blocks = (size_t)b + 1;
  }
  const char *name = m->arch;
  gw_kv_str(&w, "general.architecture", name);
  gw_kv_str(&w, "general.name", "converted by stabmeter's tests/support/gguf_convert");
  gw_kv_u32(&w, "general.file_type", want->file_type);
  if (want->type > 1) gw_kv_u32(&w, "general.quantization_version", 2);
#define KEY(s) (snprintf(key, sizeof key, "%s.%s", name, s), key)
  gw_kv_u32(&w, KEY("context_length"), (uint32_t)(ctx ? ctx : 2048));
  gw_kv_u32(&w, KEY("embedding_length"), (uint32_t)d);
  gw_kv_u32(&w, KEY("block_count"), (uint32_t)blocks);
  gw_kv_u32(&w, KEY("feed_forward_length"), (uint32_t)ff);
  gw_kv_u32(&w, KEY("attention.head_count"), (uint32_t)m->heads);
  gw_kv_u32(&w, KEY("attention.head_count_kv"), (uint32_t)m->kv_heads);
  if (gpt2_arch(name)) {
    gw_kv_f32(&w, KEY("attention.layer_norm_epsilon"), 1e-5f);
  } else {
    gw_kv_u32(&w, KEY("rope.dimension_count"), (uint32_t)m->dh);
    gw_kv_f32(&w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
  }
#undef KEY
  for (size_t i = 0; i < stab_safetensors_count(st); i++) {
    const stab_ckpt_tensor *t = stab_safetensors_tensor(st, i);
    char g[512];
    long b;
    const char *mod;
    if (t->dtype != STAB_DTYPE_F32 && t->dtype != STAB_DTYPE_F16 && t->dtype != STAB_DTYPE_BF16) {
      fprintf(stderr, "gguf_convert: %s: dtype %s not converted\n", t->name, t->dtype_name);
      continue;
    }
    if (!to_gguf(m->arch, t->name, g, sizeof g, &b, &mod) || t->ndim < 1 || t->ndim > 2) {
      fprintf(stderr, "gguf_convert: %s: no GGUF name, not converted\n", t->name);
      continue;
    }
    int weight = strlen(t->name) > 7 && !strcmp(t->name + strlen(t->name) - 7, ".weight");
    size_t rows, cols;
    float *x = converted_values(m, t, mod, weight, permute, &rows, &cols);
    if (!x) return 1;
    const out_type *ty = t->ndim == 2 ? want : type_named("F32");
    while (ty->type > 1 && cols % block_type(ty->type)->block) {
      const out_type *next = type_named(ty->fallback);
      fprintf(stderr, "gguf_convert: %s: rows of %zu are not whole %s blocks: %s\n", g, cols, ty->name, next->name);
      ty = next;
    }
    size_t nbytes;
    unsigned char *data = encode(ty, x, rows, cols, &nbytes);
    free(x);
    if (!data) return fprintf(stderr, "gguf_convert: %s: out of memory\n", g), 1;
    uint64_t ne[2] = {cols, rows};
    gw_tensor(&w, g, t->ndim == 2 ? 2 : 1, ne, ty->type, data, nbytes);
    free(data);
  }
  if (gw_write(&w, out_path)) {
    fprintf(stderr, "gguf_convert: cannot write %s\n", out_path);
    return 1;
  }
  return 0;
}

/* ---- the reference: what the probe must report ---------------------------------------- */

/* The GGUF tensor's values decoded here, rows x cols as stored (shape[0] x shape[1]). */
static double *decoded(const stab_ckpt_tensor *t) {
  size_t n = (size_t)t->count;
  double *x = malloc(n * sizeof *x);
  if (!x) return NULL;
  const gq_type *q = NULL;
  for (int i = 0; t->dtype == STAB_DTYPE_QUANT && i < GQ_NTYPES; i++)
    if (!strcmp(gq_types[i].name, t->dtype_name)) q = &gq_types[i];
  for (size_t e = 0; e < n; e++) {
    if (!strcmp(t->dtype_name, "F32")) {
      float f;
      memcpy(&f, t->data + 4 * e, 4);
      x[e] = f;
    } else if (!strcmp(t->dtype_name, "F16")) {
      x[e] = stab_f16_to_f32((uint16_t)(t->data[2 * e] | t->data[2 * e + 1] << 8));
    } else if (q) {
      x[e] = gq_element(q->type, t->data + e / q->block * q->bytes, (unsigned)(e % q->block));
    } else {
      fprintf(stderr, "gguf_convert: %s: type %s has no decoder here\n", t->name, t->dtype_name);
      free(x);
      return NULL;
    }
  }
  return x;
}

/* The largest singular value of the rows x cols matrix a (row-major), by LAPACK in f64. */
static double sigma_max(const double *a, size_t rows, size_t cols) {
  size_t k = rows < cols ? rows : cols;
  double *copy = malloc(rows * cols * sizeof *copy), *s = malloc(k * sizeof *s), *superb = malloc(k * sizeof *superb);
  memcpy(copy, a, rows * cols * sizeof *copy);
  lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'N', 'N', (lapack_int)rows, (lapack_int)cols, copy,
                                   (lapack_int)cols, s, NULL, 1, NULL, 1, superb);
  double v = info == 0 ? s[0] : NAN;
  free(copy), free(s), free(superb);
  return v;
}

static double max_row_rms(const double *a, size_t rows, size_t cols) {
  double worst = 0;
  for (size_t i = 0; i < rows; i++) {
    double ss = 0;
    for (size_t j = 0; j < cols; j++) ss += a[i * cols + j] * a[i * cols + j];
    worst = fmax(worst, sqrt(ss / (double)cols));
  }
  return worst;
}

static double frob(const double *a, size_t n) {
  double ss = 0;
  for (size_t i = 0; i < n; i++) ss += a[i] * a[i];
  return sqrt(ss);
}

static int reference(const model *m, const stab_safetensors *st, const char *gguf_path) {
  stab_gguf *gg = NULL;
  if (stab_gguf_open(gguf_path, &gg) != STAB_OK) {
    fprintf(stderr, "gguf_convert: %s\n", stab_last_error());
    return 2;
  }
  int rc = 0, has_output = 0;
  size_t idx;
  has_output = stab_gguf_find(gg, "output.weight", &idx) == STAB_OK;
  for (size_t i = 0; i < stab_safetensors_count(st) && !rc; i++) {
    const stab_ckpt_tensor *t = stab_safetensors_tensor(st, i);
    char g[512];
    long b;
    const char *mod;
    if (!to_gguf(m->arch, t->name, g, sizeof g, &b, &mod) || stab_gguf_find(gg, g, &idx) != STAB_OK) continue;
    int weight = strlen(t->name) > 7 && !strcmp(t->name + strlen(t->name) - 7, ".weight");
    const stab_ckpt_tensor *gt = stab_gguf_tensor(gg, idx);
    /* the original in GGUF's order (this file's own conversion), against the file's values */
    size_t rows, cols;
    float *orig = converted_values(m, t, mod, weight, 1, &rows, &cols);
    double *q = decoded(gt);
    if (!orig || !q || gt->count != rows * cols) {
      free(orig), free(q);
      rc = 1;
      break;
    }
    size_t n = rows * cols;
    double *dw = malloc(n * sizeof *dw), *w0 = malloc(n * sizeof *w0);
    for (size_t e = 0; e < n; e++) w0[e] = orig[e], dw[e] = q[e] - w0[e];
    const char *kind;
    double upd;
    if (!strcmp(mod, "token_embd") || !strcmp(mod, "position_embd")) kind = "embedding", upd = max_row_rms(dw, rows, cols);
    else if (!strcmp(mod, "output")) kind = "lm_head", upd = 2.0 * (double)cols * max_row_rms(dw, rows, cols);
    else if (t->ndim == 1 && weight) {
      kind = "gain", upd = 0;
      for (size_t e = 0; e < n; e++) upd = fmax(upd, fabs(dw[e]));
    } else if (t->ndim == 1) kind = "bias", upd = frob(dw, n) / sqrt((double)n);
    else kind = "linear", upd = sqrt((double)cols / (double)rows) * sigma_max(dw, rows, cols);
    if (!strcmp(kind, "linear") && !strcmp(mod, "attn_qkv") && rows % 3 == 0) {
      /* the fused q, k, v are three layers (GPT-2: thirds), the probe's rows named
       * <module>.q ...: row blocks in GGUF's order, each block's own update and norms */
      const size_t r3 = rows / 3, lg = strlen(g) - (weight ? 7 : 0), lh = strlen(t->name) - (weight ? 7 : 0);
      for (size_t p = 0; p < 3; p++) {
        const double *d = dw + p * r3 * cols, *qb = q + p * r3 * cols, *wb = w0 + p * r3 * cols;
        printf("%.*s.%c %.*s.%c linear %.17g %.17g %.17g %.17g\n", (int)lg, g, "qkv"[p], (int)lh, t->name, "qkv"[p],
               sqrt((double)cols / (double)r3) * sigma_max(d, r3, cols), frob(d, r3 * cols), frob(qb, r3 * cols),
               frob(wb, r3 * cols));
      }
    } else
    printf("%s %s %s %.17g %.17g %.17g %.17g\n", g, t->name, kind, upd, frob(dw, n), frob(q, n), frob(w0, n));
    if (!strcmp(mod, "token_embd") && !has_output)
      printf("%s %s lm_head %.17g %.17g %.17g %.17g\n", g, t->name, 2.0 * (double)cols * max_row_rms(dw, rows, cols),
             frob(dw, n), frob(q, n), frob(w0, n));
    free(orig), free(q), free(dw), free(w0);
  }
  stab_gguf_close(gg);
  return rc;
}

/* ---- a model to convert (--make) ------------------------------------------------------- */

static uint64_t rng = 0x243f6a8885a308d3ull;
static double gauss(void) {
  double u[2];
  for (int k = 0; k < 2; k++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u[k] = ((double)(rng >> 11) + 0.5) / 9007199254740992.0;
  }
  return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static int make_model(const char *kind, const char *path) {
  int llama = !strcmp(kind, "llama");
  if (!llama && strcmp(kind, "gpt2")) return usage();
  enum { LV = 96, LD = 256, LQ = 256, LK = 128, LF = 512, LB = 2, GV = 64, GD = 64, GT = 16 };
  stw_tensor t[32];
  char names[32][96];
  float *vals[32];
  size_t n = 0;
#define ADD(nm, nd, s0, s1, norm)                                                                  \
  do {                                                                                             \
    snprintf(names[n], sizeof names[n], "%s", nm);                                                 \
    size_t cnt = (size_t)(s0) * (size_t)((nd) == 2 ? (s1) : 1);                                    \
    vals[n] = malloc(cnt * sizeof(float));                                                         \
    for (size_t e = 0; e < cnt; e++) vals[n][e] = (float)((norm) ? 1 + 0.1 * gauss() : 0.02 * gauss()); \
    t[n] = (stw_tensor){names[n], "F32", (nd), {(s0), (s1)}, vals[n], cnt * sizeof(float)};        \
    n++;                                                                                           \
  } while (0)
  char nm[96];
  if (llama) {
    ADD("model.embed_tokens.weight", 2, LV, LD, 0);
    for (int b = 0; b < LB; b++) {
#define BLK(suffix, nd, s0, s1, norm)                                                              \
  do {                                                                                             \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", b, suffix);                                      \
    ADD(nm, nd, s0, s1, norm);                                                                     \
  } while (0)
      BLK("input_layernorm.weight", 1, LD, 0, 1);
      BLK("self_attn.q_proj.weight", 2, LQ, LD, 0);
      BLK("self_attn.k_proj.weight", 2, LK, LD, 0);
      BLK("self_attn.v_proj.weight", 2, LK, LD, 0);
      BLK("self_attn.o_proj.weight", 2, LD, LQ, 0);
      BLK("post_attention_layernorm.weight", 1, LD, 0, 1);
      BLK("mlp.gate_proj.weight", 2, LF, LD, 0);
      BLK("mlp.up_proj.weight", 2, LF, LD, 0);
      BLK("mlp.down_proj.weight", 2, LD, LF, 0);
#undef BLK
    }
    ADD("model.norm.weight", 1, LD, 0, 1);
    ADD("lm_head.weight", 2, LV, LD, 0);
  } else {
    ADD("transformer.wte.weight", 2, GV, GD, 0);
    ADD("transformer.wpe.weight", 2, GT, GD, 0);
    ADD("transformer.h.0.ln_1.weight", 1, GD, 0, 1);
    ADD("transformer.h.0.ln_1.bias", 1, GD, 0, 0);
    ADD("transformer.h.0.attn.c_attn.weight", 2, GD, 3 * GD, 0); /* Conv1D: [d_in][d_out] */
    ADD("transformer.h.0.attn.c_attn.bias", 1, 3 * GD, 0, 0);
    ADD("transformer.h.0.attn.c_proj.weight", 2, GD, GD, 0);
    ADD("transformer.h.0.attn.c_proj.bias", 1, GD, 0, 0);
    ADD("transformer.h.0.ln_2.weight", 1, GD, 0, 1);
    ADD("transformer.h.0.ln_2.bias", 1, GD, 0, 0);
    ADD("transformer.h.0.mlp.c_fc.weight", 2, GD, 4 * GD, 0);
    ADD("transformer.h.0.mlp.c_fc.bias", 1, 4 * GD, 0, 0);
    ADD("transformer.h.0.mlp.c_proj.weight", 2, 4 * GD, GD, 0);
    ADD("transformer.h.0.mlp.c_proj.bias", 1, GD, 0, 0);
    ADD("transformer.ln_f.weight", 1, GD, 0, 1);
    ADD("transformer.ln_f.bias", 1, GD, 0, 0);
  }
#undef ADD
  int rc = stw_write(path, t, n, llama ? "\"heads\": \"4\", \"kv_heads\": \"2\"" : "\"heads\": \"2\"");
  for (size_t i = 0; i < n; i++) free(vals[i]);
  if (rc) fprintf(stderr, "gguf_convert: cannot write %s\n", path);
  return rc ? 1 : 0;
}

int main(int argc, char **argv) {
  const char *arch = NULL;
  size_t heads = 0, kv = 0;
  int permute = 1, ref = 0, a = 1;
  for (; a < argc && !strncmp(argv[a], "--", 2); a++) {
    if (!strcmp(argv[a], "--no-permute")) permute = 0;
    else if (!strcmp(argv[a], "--reference")) ref = 1;
    else if (a + 2 < argc && !strcmp(argv[a], "--make")) return make_model(argv[a + 1], argv[a + 2]);
    else if (a + 1 < argc && !strcmp(argv[a], "--arch")) arch = argv[++a];
    else if (a + 1 < argc && !strcmp(argv[a], "--heads")) heads = (size_t)strtoul(argv[++a], NULL, 10);
    else if (a + 1 < argc && !strcmp(argv[a], "--kv-heads")) kv = (size_t)strtoul(argv[++a], NULL, 10);
    else return usage();
  }
  if (argc - a != (ref ? 2 : 3)) return usage();
  const out_type *want = ref ? NULL : type_named(argv[a + 2]);
  if (!ref && !want) return fprintf(stderr, "gguf_convert: unknown type '%s'\n", argv[a + 2]), 2;
  if (arch && strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "gemma") && strcmp(arch, "gpt2"))
    return fprintf(stderr, "gguf_convert: --arch llama, qwen2, gemma or gpt2\n"), 2;
  stab_safetensors *st = NULL;
  if (stab_safetensors_open(argv[a], &st) != STAB_OK) {
    fprintf(stderr, "gguf_convert: %s\n", stab_last_error());
    return 2;
  }
  model m;
  int rc = describe(st, arch, heads, kv, &m);
  if (!rc) rc = ref ? reference(&m, st, argv[a + 1]) : convert(&m, st, argv[a + 1], want, permute);
  stab_safetensors_close(st);
  return rc;
}
