/* kind_rules.c — what each tensor of a model is: the kind rules of stabmeter.h applied to a
 * list of named tensors (kind, layout, sizes, folded biases, query/key pairs, the tied head,
 * the trace names), so that the probe, a trainer registering by name and bindings share them. */
#include "core/core.h"

#include <fnmatch.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct stab_model {
  stab_model_entry *e;
  size_t n;
  void **owned; /* names, reasons and expert views the entries point at */
  int has_head; /* a head tensor: stab_model_has_head */
  size_t nowned, capowned;
};

static const char *const embed_names[] = {"wte", "wpe", "embed_tokens", "tok_embeddings", "token_embd",
                                          "word_embeddings", "position_embeddings", "token_type_embeddings",
                                          "embed_positions", "position_embd", "token_types", NULL};
static const char *const position_names[] = {"wpe", "position_embeddings", "token_type_embeddings",
                                             "embed_positions", "position_embd", "token_types", NULL};
static const char *const head_names[] = {"lm_head", "output", "embed_out", NULL};
static const char *const conv1d_globs[] = {"h.*.attn.c_attn.weight", "*.h.*.attn.c_attn.weight",
                                           "h.*.attn.c_proj.weight", "*.h.*.attn.c_proj.weight",
                                           "h.*.mlp.c_fc.weight",    "*.h.*.mlp.c_fc.weight",
                                           "h.*.mlp.c_proj.weight",  "*.h.*.mlp.c_proj.weight", NULL};

/* Query weights by suffix and where their key is; k NULL: q, k and v fused in one tensor. */
static const struct {
  const char *q, *k, *logits;
  int llmc_only; /* llm.c's reader splits its qkv into h.N.attn.{q,k,v}: other files' names differ */
} attn_rules[] = {{".q_proj.weight", ".k_proj.weight", ".logits", 0},
                  {".query.weight", ".key.weight", ".logits", 0},
                  {".wq.weight", ".wk.weight", ".logits", 0},
                  {".attn_q.weight", ".attn_k.weight", ".attn_logits", 0},
                  {".attn.q.weight", ".attn.k.weight", ".attn.logits", 1},
                  {".q_proj_weight", ".k_proj_weight", ".logits", 0}, /* nn.MultiheadAttention, kdim/vdim */
                  {".c_attn.weight", NULL, ".logits", 0},
                  {".qkv_proj.weight", NULL, ".logits", 0},
                  {".attn_qkv.weight", NULL, ".attn_logits", 0},
                  {".qkv.weight", NULL, ".logits", 0},
                  {".in_proj_weight", NULL, ".logits", 0}}; /* nn.MultiheadAttention */
enum { N_ATTN_RULES = sizeof attn_rules / sizeof attn_rules[0] };

/* The attention rule whose query suffix name has (or which name is, without the leading dot: a
 * bare nn.MultiheadAttention's in_proj_weight), under the naming's restrictions, with *stem the
 * length of the name before the suffix; N_ATTN_RULES when none. */
static size_t attn_rule_of(const char *name, const stab_model_config *c, size_t *stem) {
  size_t n = strlen(name);
  for (size_t r = 0; r < N_ATTN_RULES; r++) {
    if ((attn_rules[r].llmc_only && c->naming != STAB_NAMING_LLMC) || (c->naming == STAB_NAMING_LLMC && !attn_rules[r].llmc_only))
      continue;
    const char *q = attn_rules[r].q;
    size_t k = strlen(q);
    if (n >= k && !strcmp(name + n - k, q)) return *stem = n - k, r;
    if (!strcmp(name, q + 1)) return *stem = 0, r;
  }
  return N_ATTN_RULES;
}

/* The name of rule r's attention entry for a query named with a stem of that length. */
static void logits_name(char *out, size_t cap, const char *qname, size_t stem, size_t r) {
  if (stem) snprintf(out, cap, "%.*s%s", (int)stem, qname, attn_rules[r].logits);
  else snprintf(out, cap, "%s", attn_rules[r].logits + 1);
}

stab_model_config stab_model_default_config(void) {
  stab_model_config c;
  memset(&c, 0, sizeof c);
  c.tie = -1;
  return c;
}

/* ---- names ------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* The length of the module name: the name without a trailing ".weight" or ".bias". */
static size_t module_len(const char *name) {
  size_t n = strlen(name);
  if (ends_with(name, ".weight")) return n - 7;
  if (ends_with(name, ".bias")) return n - 5;
  return n;
}

/* 1 when the last dot-separated component of the module name of `name` is one of names. */
static int last_component_in(const char *name, const char *const *names) {
  size_t end = module_len(name), start = end;
  while (start > 0 && name[start - 1] != '.') start--;
  for (size_t i = 0; names[i]; i++)
    if (strlen(names[i]) == end - start && !strncmp(name + start, names[i], end - start)) return 1;
  return 0;
}

static int matches_any(const char *name, const char *const *globs) {
  for (size_t i = 0; globs[i]; i++)
    if (!fnmatch(globs[i], name, 0)) return 1;
  return 0;
}

/* 1 when name is comp or ends in "." comp (a parameter PyTorch names without ".weight":
 * nn.MultiheadAttention's in_proj_weight, in_proj_bias, bias_k ...). */
static int is_component(const char *name, const char *comp) {
  size_t n = strlen(name), k = strlen(comp);
  return n >= k && !strcmp(name + n - k, comp) && (n == k || name[n - k - 1] == '.');
}

/* 1 when a module component contains "norm" (any case) or starts with "ln". */
static int is_norm_module(const char *name) {
  size_t end = module_len(name);
  for (size_t i = 0; i < end;) {
    size_t j = i;
    while (j < end && name[j] != '.') j++;
    if (j - i >= 2 && !strncmp(name + i, "ln", 2)) return 1;
    for (size_t p = i; p + 4 <= j; p++)
      if (!strncasecmp(name + p, "norm", 4)) return 1;
    i = j + 1;
  }
  return 0;
}

/* 1 when the module name's last component ends in "_exps" (llama.cpp's ffn_up_exps ...). */
static int expert_tensor(const char *name) {
  size_t end = module_len(name), start = end;
  while (start > 0 && name[start - 1] != '.') start--;
  return end - start > 5 && !strncmp(name + end - 5, "_exps", 5);
}

/* Where the expert index of a per-expert name is: X.experts.E.Y with E decimal digits, into
 * *digits (its offset) and *len; 0 when the name is not one. */
static int expert_name(const char *name, size_t *digits, size_t *len) {
  for (const char *p = strstr(name, ".experts."); p; p = strstr(p + 1, ".experts.")) {
    const char *d = p + 9, *q = d;
    while (*q >= '0' && *q <= '9' && q - d < 9) q++;
    if (q > d && *q == '.') return *digits = (size_t)(d - name), *len = (size_t)(q - d), 1;
  }
  return 0;
}

/* 1 when a GPT-2-named matrix has Conv1D's in-major shape: c_attn [d][3d], c_fc [d][4d],
 * mlp.c_proj [4d][d]. nanoGPT and stabmeter-train store the same names out-major; attn.c_proj
 * is square, where the layout changes no metric. */
static int conv1d_shape(const char *name, size_t rows, size_t cols) {
  if (ends_with(name, "attn.c_attn.weight")) return cols == 3 * rows;
  if (ends_with(name, "mlp.c_fc.weight")) return cols > rows;
  if (ends_with(name, "mlp.c_proj.weight")) return rows > cols;
  return 1;
}

static const char *override_for(const stab_model_override *o, size_t n, const char *name) {
  for (size_t i = 0; o && i < n; i++)
    if (o[i].glob && o[i].value && !fnmatch(o[i].glob, name, 0)) return o[i].value;
  return NULL;
}

stab_layout stab_model_linear_layout(const stab_model_config *config, const char *name, size_t rows, size_t cols) {
  const stab_model_config def = stab_model_default_config(), *c = config ? config : &def;
  if (!name) return STAB_LAYOUT_OUT_MAJOR;
  const char *lay = override_for(c->layouts, c->nlayouts, name);
  int in_major = lay ? !strcmp(lay, "in_major")
                     : !c->out_major && matches_any(name, conv1d_globs) && conv1d_shape(name, rows, cols);
  return in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR;
}

static int kind_from(const char *s, stab_kind *k) {
  static const stab_kind all[] = {STAB_KIND_LINEAR, STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD, STAB_KIND_GAIN,
                                  STAB_KIND_BIAS};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!strcmp(s, stab_kind_name(all[i]))) return *k = all[i], 1;
  return 0;
}

/* ---- the model's own strings ------------------------------------------------------- */

/* Keeps s (malloc'd) for the model's lifetime; NULL (and s freed) when out of memory. */
static void *keep_any(stab_model *m, void *s) {
  if (!s) return NULL;
  if (m->nowned == m->capowned) {
    size_t cap = m->capowned ? 2 * m->capowned : 64;
    void **p = realloc(m->owned, cap * sizeof *p);
    if (!p) {
      free(s);
      return NULL;
    }
    m->owned = p, m->capowned = cap;
  }
  return m->owned[m->nowned++] = s;
}
static const char *keep(stab_model *m, char *s) { return keep_any(m, s); }

/* A formatted string kept by the model, or NULL when out of memory. */
__attribute__((format(printf, 2, 3))) static const char *keepf(stab_model *m, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[640];
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return keep(m, strdup(buf));
}

/* ---- rules 1-6 and 8-10: one tensor ------------------------------------------------- */

/* Classifies t into e; 0, or -1 when out of memory. Rule 7 (bias folding) comes afterwards. */
static int classify(stab_model *m, const stab_model_config *c, const stab_ckpt_tensor *t, stab_model_entry *e) {
  memset(e, 0, sizeof *e);
  e->weight = t;
  e->name = t->name;
  e->expert = STAB_MODEL_NO_EXPERT;
  if (t->dtype == STAB_DTYPE_OTHER) {
    if (c->naming == STAB_NAMING_GGUF)
      e->why_not = keepf(m, "unsupported GGML type %s: the probe reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
                            "Q8_0, Q2_K-Q6_K, IQ4_NL and IQ4_XS tensors", t->dtype_name ? t->dtype_name : "?");
    else
      e->why_not = keepf(m, "dtype %s is not a floating-point type the probe reads (F32, F16, BF16)",
                         t->dtype_name ? t->dtype_name : "?");
    return e->why_not ? 0 : -1;
  }
  const char *forced = override_for(c->kinds, c->nkinds, t->name);
  stab_kind fk = STAB_KIND_LINEAR;
  if (forced && !strcmp(forced, "skip")) {
    e->why_not = "skipped by --kind";
    return 0;
  }
  if (forced && !kind_from(forced, &fk)) forced = NULL; /* not a kind: no override */
  if (t->ndim == 3 && expert_tensor(t->name)) {
    if (t->count == 0) {
      e->why_not = "an empty tensor (a zero dimension): nothing to measure";
      return 0;
    }
    if (t->shape[0] > STAB_MODEL_MAX_EXPERTS) {
      e->why_not = keepf(m, "%llu experts: more than the %d a layer may have", (unsigned long long)t->shape[0],
                         STAB_MODEL_MAX_EXPERTS);
      return e->why_not ? 0 : -1;
    }
    /* [n_expert][rows][cols]: each slice out-major, as GGUF's other matrices */
    e->kind = STAB_KIND_LINEAR, e->layout = STAB_LAYOUT_OUT_MAJOR;
    e->d_in = (size_t)t->shape[2], e->d_out = (size_t)t->shape[1], e->n_expert = (size_t)t->shape[0];
    return 0;
  }
  if (t->ndim == 3 && (is_component(t->name, "bias_k") || is_component(t->name, "bias_v"))) {
    const char *what = is_component(t->name, "bias_k") ? "key" : "value";
    e->why_not = keepf(m, "nn.MultiheadAttention's add_bias_kv: a learned %s appended to every sequence's %ss as "
                          "one more position (a vector, not a map of the input): not measured", what, what);
    return e->why_not ? 0 : -1;
  }
  if (t->ndim == 0 || t->ndim > 2) {
    e->why_not = t->ndim == 3 ? keepf(m, "a 3-D tensor that is not an expert tensor by name (*_exps): no rule for it")
                 : keepf(m, "%s tensor (%llu dimensions): no rule for it", t->ndim ? "a 3-D or higher" : "a scalar",
                         (unsigned long long)t->ndim);
    return e->why_not ? 0 : -1;
  }
  if (t->count == 0) {
    e->why_not = "an empty tensor (a zero dimension): nothing to measure";
    return 0;
  }
  int two_d = t->ndim == 2;
  if (forced) {
    e->kind = fk;
    int wants_matrix = fk == STAB_KIND_LINEAR || fk == STAB_KIND_EMBEDDING || fk == STAB_KIND_LM_HEAD;
    if (wants_matrix != two_d) {
      e->why_not = keepf(m, "--kind %s does not fit a %llu-D tensor", forced, (unsigned long long)t->ndim);
      return e->why_not ? 0 : -1;
    }
  }
  size_t rows = two_d ? (size_t)t->shape[0] : 1, cols = two_d ? (size_t)t->shape[1] : (size_t)t->count;
  if (forced) {
    /* decided above */
  } else if (two_d && last_component_in(t->name, embed_names)) {
    e->kind = STAB_KIND_EMBEDDING;
  } else if (two_d && last_component_in(t->name, head_names)) {
    e->kind = STAB_KIND_LM_HEAD;
  } else if (two_d) {
    e->kind = STAB_KIND_LINEAR;
  } else if (is_norm_module(t->name) && !ends_with(t->name, ".bias")) {
    e->kind = STAB_KIND_GAIN;
  } else if (ends_with(t->name, ".bias") || is_component(t->name, "in_proj_bias")) {
    e->kind = STAB_KIND_BIAS; /* folded later when it pairs with a linear weight */
  } else {
    e->why_not = "a 1-D tensor that is neither a norm gain nor a bias by name; --kind gain|bias names it";
    return 0;
  }
  switch (e->kind) {
  case STAB_KIND_LINEAR: {
    e->layout = stab_model_linear_layout(c, t->name, rows, cols);
    int in_major = e->layout == STAB_LAYOUT_IN_MAJOR;
    e->d_in = in_major ? rows : cols;
    e->d_out = in_major ? cols : rows;
    break;
  }
  case STAB_KIND_EMBEDDING: e->d_in = rows, e->d_out = cols; break;
  case STAB_KIND_LM_HEAD: e->d_in = cols, e->d_out = rows; break;
  default: e->d_in = e->d_out = (size_t)t->count; break;
  }
  return 0;
}

/* ---- lookups by name ------------------------------------------------------------------ */

static const stab_ckpt_tensor *const *sort_tensors; /* qsort's context: the input list */
static int by_tensor_name(const void *a, const void *b) {
  return strcmp(sort_tensors[*(const size_t *)a]->name, sort_tensors[*(const size_t *)b]->name);
}

/* The first index (into by_name, sorted by tensor name) of the tensors named name, or n. */
static size_t find_name(const stab_ckpt_tensor *const *t, const size_t *by_name, size_t n, const char *name) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(t[by_name[mid]]->name, name) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && !strcmp(t[by_name[lo]]->name, name) ? lo : n;
}

/* ---- attention -------------------------------------------------------------------------- */

/* The widths of q and of k (v's is k's) in a fused q, k, v tensor named name of total outputs:
 * heads*d_h + 2*kv*d_h, split by heads with kv_heads or head_dim when the config has them, else
 * in three equal parts; *q_out 0 when they cannot be, with *why the reason (kept by m; when m is
 * NULL, no reason is made). 0, or -1 when out of memory. */
static int fused_widths(stab_model *m, const stab_model_config *c, const char *name, size_t total, size_t *q_out,
                        size_t *k_out, const char **why) {
  const size_t heads = c->heads, kv = c->kv_heads, dh = c->head_dim;
  *q_out = *k_out = 0;
  if (why) *why = NULL;
  if (heads && kv) {
    if (total % (heads + 2 * kv) == 0) *q_out = total / (heads + 2 * kv) * heads, *k_out = *q_out / heads * kv;
  } else if (heads && dh) {
    if (total % dh == 0 && total / dh > heads && (total / dh - heads) % 2 == 0)
      *q_out = heads * dh, *k_out = (total / dh - heads) / 2 * dh;
  } else if (total % 3 == 0) {
    *q_out = *k_out = total / 3;
  }
  if (*q_out || !m) return 0;
  if (heads && kv) *why = keepf(m, "fused qkv '%s': d_out %zu is not (%zu heads + 2 x %zu key heads) x d_h", name, total, heads, kv);
  else if (heads && dh)
    *why = keepf(m, "fused qkv '%s': d_out %zu is not (%zu heads + 2 x key heads) x head_dim %zu", name, total, heads, dh);
  else *why = keepf(m, "fused qkv '%s': d_out %zu is not three equal parts", name, total);
  return *why ? 0 : -1;
}

/* Makes e the attention entry of query tensor tq (entry q, linear) and key tk (entry k; tq
 * itself when fused): sizes, offsets and head counts, or why_not. 0, or -1 when out of memory. */
static int attention_entry(stab_model *m, const stab_model_config *c, const stab_model_entry *q,
                           const stab_model_entry *k, int fused, const char *name, stab_model_entry *e) {
  const stab_ckpt_tensor *tq = q->weight;
  memset(e, 0, sizeof *e);
  e->expert = STAB_MODEL_NO_EXPERT;
  e->weight = tq, e->weight_k = k->weight;
  e->kind = STAB_KIND_ATTENTION, e->layout = q->layout;
  e->d_in = q->d_in;
  e->ld = (size_t)tq->shape[1]; /* the stored row, either layout */
  if (!(e->name = keep(m, strdup(name)))) return -1;
  size_t heads = c->heads, kv = c->kv_heads, dh = c->head_dim;
  const char *from = c->heads_source ? c->heads_source : "the config";
  size_t q_out = 0, k_out = 0;
  const char *why = NULL;
  if (fused) {
    if (fused_widths(m, c, tq->name, q->d_out, &q_out, &k_out, &why)) return -1;
    if (!q_out) {
      e->why_not = why;
      return why ? 0 : -1;
    }
    /* q is the first part of a fused tensor, k the second: rows (out-major) or columns */
    e->k_off = e->layout == STAB_LAYOUT_IN_MAJOR ? q_out : q_out * e->ld;
  } else {
    q_out = q->d_out, k_out = k->d_out;
  }
  e->d_out = q_out;
  char buf[300] = "";
  if (!fused && k->d_in != q->d_in)
    snprintf(buf, sizeof buf, "query d_in %zu but key '%s' d_in %zu", q->d_in, k->weight->name, k->d_in);
  else if (!fused && k->layout != q->layout)
    snprintf(buf, sizeof buf, "query and key '%s' have different layouts", k->weight->name);
  else if (!heads && c->heads_error)
    snprintf(buf, sizeof buf, "%s", c->heads_error);
  else if (!heads)
    snprintf(buf, sizeof buf, "no head count (give --heads H; none in the file's metadata or the model's config.json)");
  else if (q_out % heads)
    snprintf(buf, sizeof buf, "%zu heads (from %s) do not divide the query width %zu", heads, from, q_out);
  else if (dh && q_out / heads != dh)
    snprintf(buf, sizeof buf, "%s's head_dim %zu times %zu heads is not the query width %zu", from, dh, heads, q_out);
  else if (k_out % (q_out / heads) || !k_out || heads % (k_out / (q_out / heads)))
    snprintf(buf, sizeof buf, "key width %zu is not a whole number of key heads of width %zu dividing %zu heads",
             k_out, q_out / heads, heads);
  else if (kv && k_out / (q_out / heads) != kv)
    snprintf(buf, sizeof buf, "%s's %s %zu (of width %zu) does not match the key width %zu", from,
             c->naming == STAB_NAMING_GGUF ? "head_count_kv" : "num_key_value_heads", kv, q_out / heads, k_out);
  else if (k_out != q_out && q->layout == STAB_LAYOUT_IN_MAJOR)
    snprintf(buf, sizeof buf, "grouped-query attention with in-major weights (not supported)");
  if (buf[0]) {
    e->why_not = keep(m, strdup(buf));
    return e->why_not ? 0 : -1;
  }
  e->heads = heads;
  e->kv_heads = k_out / (q_out / heads);
  return 0;
}

/* Appends an attention entry for every query/key pair of the tensors, by name. */
static int add_attention(stab_model *m, const stab_model_config *c, const stab_ckpt_tensor *const *t, size_t n,
                         const size_t *by_name) {
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *tq = t[i];
    size_t stem, rule = attn_rule_of(tq->name, c, &stem);
    if (rule == N_ATTN_RULES) continue;
    char lname[640];
    logits_name(lname, sizeof lname, tq->name, stem, rule);
    stab_model_entry q, k;
    if (classify(m, c, tq, &q)) return -1;
    if (q.why_not || q.kind != STAB_KIND_LINEAR) continue; /* the query itself is listed with its reason */
    int fused = attn_rules[rule].k == NULL;
    if (fused) {
      k = q;
    } else {
      char kname[640];
      if (stem) snprintf(kname, sizeof kname, "%.*s%s", (int)stem, tq->name, attn_rules[rule].k);
      else snprintf(kname, sizeof kname, "%s", attn_rules[rule].k + 1);
      size_t j = find_name(t, by_name, n, kname);
      if (j == n) continue; /* a lone query: no logits to bound */
      if (classify(m, c, t[by_name[j]], &k)) return -1;
      if (k.why_not || k.kind != STAB_KIND_LINEAR) continue; /* the key itself is listed with its reason */
    }
    if (attention_entry(m, c, &q, &k, fused, lname, &m->e[m->n])) return -1;
    m->n++;
  }
  return 0;
}

/* ---- rule 7, the tied head, the names ------------------------------------------------ */

static const stab_model_entry *sort_entries; /* qsort's context */
static int by_weight_name(const void *a, const void *b) {
  return strcmp(sort_entries[*(const size_t *)a].weight->name, sort_entries[*(const size_t *)b].weight->name);
}
static int by_entry_name(const void *a, const void *b) {
  return strcmp(sort_entries[*(const size_t *)a].name, sort_entries[*(const size_t *)b].name);
}

/* Rule 7: X.bias into a linear X.weight of matching width; the folded entries removed. The
 * weight is looked up in the entries sorted by name: n log n, not n^2 (a hostile llm.c header
 * declaring 20000 one-channel blocks took minutes with a scan per bias). */
/* The linear entry of tensor w (by: the entries' indices sorted by tensor name) of d_out
 * outputs with no bias yet, or NULL. */
static stab_model_entry *unbiased_linear(stab_model *m, const size_t *by, const char *w, size_t d_out) {
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(m->e[by[mid]].weight->name, w) < 0) lo = mid + 1;
    else hi = mid;
  }
  for (size_t k = lo; k < m->n && !strcmp(m->e[by[k]].weight->name, w); k++) {
    stab_model_entry *x = &m->e[by[k]];
    if (!x->why_not && x->kind == STAB_KIND_LINEAR && !x->n_expert && x->d_out == d_out && !x->bias) return x;
  }
  return NULL;
}

static int fold_biases(stab_model *m) {
  size_t n = m->n, *by = malloc((n ? n : 1) * sizeof *by);
  if (!by) return -1;
  for (size_t i = 0; i < n; i++) by[i] = i;
  sort_entries = m->e;
  qsort(by, n, sizeof *by, by_weight_name);
  char *folded = calloc(n ? n : 1, 1);
  if (!folded) return free(by), -1;
  for (size_t i = 0; i < n; i++) {
    stab_model_entry *b = &m->e[i];
    if (b->why_not || b->kind != STAB_KIND_BIAS) continue;
    const char *bn = b->weight->name;
    const size_t count = (size_t)b->weight->count;
    char w[640];
    stab_model_entry *x;
    if (ends_with(bn, ".bias")) {
      snprintf(w, sizeof w, "%.*s.weight", (int)(strlen(bn) - 5), bn);
      if ((x = unbiased_linear(m, by, w, count))) x->bias = b->weight, folded[i] = 1;
      continue;
    }
    if (!is_component(bn, "in_proj_bias")) continue;
    /* nn.MultiheadAttention: q, k, v's biases one after another, for the fused in_proj_weight
     * (split afterwards, each part its slice) or for separate q/k/v_proj_weight (kdim, vdim) */
    const int stem = (int)(strlen(bn) - strlen("in_proj_bias"));
    snprintf(w, sizeof w, "%.*sin_proj_weight", stem, bn);
    if ((x = unbiased_linear(m, by, w, count))) {
      x->bias = b->weight, folded[i] = 1;
      continue;
    }
    stab_model_entry *part[3];
    static const char *const sep[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
    int all = count % 3 == 0;
    for (int k = 0; k < 3 && all; k++) {
      snprintf(w, sizeof w, "%.*s%s", stem, bn, sep[k]);
      all = (part[k] = unbiased_linear(m, by, w, count / 3)) != NULL;
    }
    for (int k = 0; k < 3 && all; k++) part[k]->bias = b->weight, part[k]->bias_offset = (size_t)k * (count / 3);
    folded[i] = all;
  }
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!folded[i]) m->e[k++] = m->e[i];
  m->n = k;
  free(folded), free(by);
  return 0;
}

/* ---- fused q, k, v --------------------------------------------------------------------------- */

/* Every fused q/k/v linear (the fused attention rules: c_attn, qkv_proj, attn_qkv, qkv,
 * in_proj_weight) becomes three linear entries, q, k and v, in its place: <module>.q, .k, .v,
 * each its block of the tensor (rows out-major; columns in-major, ld the stored row) and its
 * slice of the folded bias. A tensor whose widths the config cannot split (fused_widths) stays
 * one linear layer. 0, or -1 when out of memory. */
static int split_fused(stab_model *m, const stab_model_config *c) {
  size_t n = m->n, parts = 0;
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = &m->e[i];
    size_t stem, rule, q_out, k_out;
    if (e->why_not || e->kind != STAB_KIND_LINEAR || e->n_expert || e->weight->ndim != 2) continue;
    if ((rule = attn_rule_of(e->weight->name, c, &stem)) == N_ATTN_RULES || attn_rules[rule].k) continue;
    fused_widths(NULL, c, e->weight->name, e->d_out, &q_out, &k_out, NULL);
    parts += q_out ? 2 : 0;
  }
  if (!parts) return 0;
  /* the entries, two more per fused tensor, and room for the tied head */
  stab_model_entry *out = calloc(n + parts + 1, sizeof *out);
  if (!out) return -1;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = &m->e[i];
    size_t stem, rule = N_ATTN_RULES, q_out = 0, k_out = 0;
    if (!e->why_not && e->kind == STAB_KIND_LINEAR && !e->n_expert && e->weight->ndim == 2 &&
        (rule = attn_rule_of(e->weight->name, c, &stem)) != N_ATTN_RULES && !attn_rules[rule].k)
      fused_widths(NULL, c, e->weight->name, e->d_out, &q_out, &k_out, NULL);
    if (!q_out) {
      out[k++] = *e;
      continue;
    }
    /* the module: the name without ".weight" (c_attn.weight) or "_weight" (in_proj_weight) */
    const char *tn = e->weight->name;
    const int mod = (int)(strlen(tn) - (ends_with(tn, ".weight") ? 7 : ends_with(tn, "_weight") ? 7 : 0));
    const size_t width[3] = {q_out, k_out, e->d_out - q_out - k_out}, total = e->d_out;
    const int in_major = e->layout == STAB_LAYOUT_IN_MAJOR;
    size_t first = 0; /* the part's first output */
    for (int p = 0; p < 3; p++) {
      stab_model_entry *x = &out[k++];
      *x = *e;
      x->d_out = width[p];
      x->part = p + 1;
      /* out-major: a block of whole rows; in-major: columns of the stored rows of total */
      x->offset = in_major ? first : first * e->d_in;
      x->ld = in_major ? total : 0;
      x->bias_offset = e->bias ? e->bias_offset + first : 0;
      if (!(x->name = keepf(m, "%.*s.%c", mod, tn, "qkv"[p]))) return free(out), -1;
      first += width[p];
    }
  }
  free(m->e);
  m->e = out, m->n = k;
  return 0;
}

/* ---- experts ------------------------------------------------------------------------------ */

stab_status stab_model_expert_view(const stab_ckpt_tensor *t, size_t expert, stab_ckpt_tensor *view) {
  if (!t || !view) return stabi_fail(STAB_EINVAL, "stab_model_expert_view: NULL argument");
  if (t->ndim != 3 || expert >= t->shape[0])
    return stabi_fail(STAB_EINVAL, "stab_model_expert_view: '%s' has no expert %zu (%zu dimensions)",
                      t->name ? t->name : "?", expert, t->ndim);
  const uint64_t per = t->shape[1] * t->shape[2], n = t->shape[0];
  stab_ckpt_tensor v = *t;
  v.ndim = 2;
  v.shape[0] = t->shape[1], v.shape[1] = t->shape[2], v.shape[2] = 0;
  v.count = per;
  uint64_t bytes = per * t->elem_size;
  if (!t->elem_size) { /* block-quantized: the slices are whole blocks when the total divides evenly */
    uint64_t all = stab_ckpt_nbytes(t);
    bytes = stab_ckpt_nbytes(&v);
    if (!bytes || bytes * n != all)
      return stabi_fail(STAB_EINVAL, "stab_model_expert_view: '%s': an expert of %llu %s elements is not whole blocks",
                        t->name ? t->name : "?", (unsigned long long)per, t->dtype_name ? t->dtype_name : "?");
  }
  v.data = t->data ? t->data + expert * bytes : NULL;
  v.offset = t->offset + expert * bytes;
  *view = v;
  return STAB_OK;
}

/* The most expert entries of one model: past it, a 3-D tensor is not measured (a hostile file
 * of many huge expert counts must not make the model allocate without bound). */
enum { MAX_MODEL_EXPERTS = 32 * STAB_MODEL_MAX_EXPERTS };

typedef struct {
  char *key;     /* the name without its expert index: X.experts.Y.weight */
  size_t expert; /* E */
  size_t entry;  /* index in the entries */
} hf_expert;

static int by_key_shape_expert(const void *pa, const void *pb) {
  const hf_expert *a = pa, *b = pb;
  int c = strcmp(a->key, b->key);
  if (c) return c;
  const stab_model_entry *x = &sort_entries[a->entry], *y = &sort_entries[b->entry];
  if (x->d_in != y->d_in) return x->d_in < y->d_in ? -1 : 1;
  if (x->d_out != y->d_out) return x->d_out < y->d_out ? -1 : 1;
  if (x->layout != y->layout) return x->layout < y->layout ? -1 : 1;
  if (a->expert != b->expert) return a->expert < b->expert ? -1 : 1;
  return a->entry < b->entry ? -1 : a->entry > b->entry;
}

/* Layers of experts: every 3-D expert tensor followed by its slices, and the HF per-expert
 * linears of one X.experts.*.Y and one shape gathered under an entry X.experts.Y, where the
 * first of them was. 0, or -1 when out of memory. */
static int group_experts(stab_model *m) {
  size_t n = m->n, nh = 0, slices = 0;
  hf_expert *h = calloc(n ? n : 1, sizeof *h);
  size_t *run_of = malloc((n ? n : 1) * sizeof *run_of); /* entry -> its run's first index in h, or SIZE_MAX */
  stab_model_entry *out = NULL;
  size_t *run_low = NULL;
  int rc = -1;
  if (!h || !run_of) goto done;
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = &m->e[i];
    size_t d, len;
    run_of[i] = SIZE_MAX;
    if (e->n_expert && !e->why_not) slices += e->n_expert;
    if (e->why_not || e->kind != STAB_KIND_LINEAR || e->n_expert || e->part || e->weight->ndim != 2 ||
        !expert_name(e->weight->name, &d, &len))
      continue;
    const char *name = e->weight->name;
    if (!(h[nh].key = malloc(strlen(name) + 1))) goto done;
    snprintf(h[nh].key, strlen(name) + 1, "%.*s%s", (int)d, name, name + d + len + 1);
    h[nh].expert = (size_t)strtoul(name + d, NULL, 10);
    h[nh].entry = i;
    nh++;
  }
  if (!nh && !slices) {
    rc = 0;
    goto done;
  }
  sort_entries = m->e;
  qsort(h, nh, sizeof *h, by_key_shape_expert);
  size_t runs = 0;
  /* run_low[first]: the run's first entry in the model's order, which stands for it */
  run_low = malloc((nh ? nh : 1) * sizeof *run_low);
  if (!run_low) goto done;
  for (size_t k = 0; k < nh; k++) {
    const stab_model_entry *a = &m->e[h[k].entry];
    int same = k > 0 && !strcmp(h[k].key, h[k - 1].key) && a->d_in == m->e[h[k - 1].entry].d_in &&
               a->d_out == m->e[h[k - 1].entry].d_out && a->layout == m->e[h[k - 1].entry].layout;
    size_t first = same ? run_of[h[k - 1].entry] : k;
    runs += !same;
    run_of[h[k].entry] = first;
    run_low[first] = same && run_low[first] < h[k].entry ? run_low[first] : h[k].entry;
  }
  /* one layer per name: of the runs of one key with different shapes, the longest (the first
   * of equal ones) is the layer; the other experts stay linears of their own */
  for (size_t a = 0; a < nh;) {
    size_t b = a, best = a, best_len = 0;
    while (b < nh && !strcmp(h[b].key, h[a].key)) b++;
    for (size_t r = a; r < b;) {
      size_t e = r;
      while (e < b && run_of[h[e].entry] == r) e++;
      if (e - r > best_len) best = r, best_len = e - r;
      r = e;
    }
    for (size_t j = a; j < b; j++)
      if (run_of[h[j].entry] != best) run_of[h[j].entry] = SIZE_MAX; /* (runs stays an upper bound) */
    a = b;
  }
  if (slices > MAX_MODEL_EXPERTS) slices = MAX_MODEL_EXPERTS; /* the rest: not measured, below */
  /* every entry, one per run of HF experts, the slices, and the tied head to come */
  if (!(out = calloc(n + runs + slices + 1, sizeof *out))) goto done;
  size_t k = 0, made = 0;
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = &m->e[i];
    if (run_of[i] != SIZE_MAX) {
      size_t r = run_of[i];
      if (run_low[r] != i) continue;
      stab_model_entry *g = &out[k];
      size_t gi = k++;
      *g = m->e[h[r].entry];
      g->bias = NULL;
      g->expert = STAB_MODEL_NO_EXPERT;
      const char *key = h[r].key;
      if (!(g->name = keepf(m, "%.*s", (int)(ends_with(key, ".weight") ? strlen(key) - 7 : strlen(key)), key))) goto done;
      for (size_t j = r; j < nh && run_of[h[j].entry] == r; j++) {
        out[k] = m->e[h[j].entry];
        out[k].expert = h[j].expert, out[k].group = gi;
        k++, g->n_expert++;
      }
      continue;
    }
    out[k] = *e;
    if (!e->n_expert || e->why_not) {
      k++;
      continue;
    }
    size_t gi = k++;
    if (made + e->n_expert > MAX_MODEL_EXPERTS) {
      out[gi].why_not = keepf(m, "%zu experts: the model's 3-D tensors would have more than %d", e->n_expert,
                              MAX_MODEL_EXPERTS);
      if (!out[gi].why_not) goto done;
      out[gi].n_expert = 0;
      continue;
    }
    stab_ckpt_tensor *views = keep_any(m, calloc(e->n_expert, sizeof *views));
    if (!views) goto done;
    size_t mod = module_len(e->weight->name);
    for (size_t x = 0; x < e->n_expert; x++) {
      if (stab_model_expert_view(e->weight, x, &views[x]) != STAB_OK) {
        out[gi].why_not = keepf(m, "%s", stab_last_error());
        if (!out[gi].why_not) goto done;
        out[gi].n_expert = 0;
        k = gi + 1;
        break;
      }
      stab_model_entry *s = &out[k++];
      *s = *e;
      s->n_expert = 0, s->expert = x, s->group = gi;
      s->weight = &views[x];
      if (!(s->name = keepf(m, "%.*s.%zu", (int)mod, e->weight->name, x))) goto done;
    }
    if (out[gi].n_expert) made += e->n_expert;
  }
  free(m->e);
  m->e = out, m->n = k;
  out = NULL;
  rc = 0;
done:
  for (size_t i = 0; h && i < nh; i++) free(h[i].key);
  free(h), free(run_of), free(out), free(run_low);
  return rc;
}

/* The tied head: no lm_head tensor (a head tensor not measured, e.g. of a type not read, still
 * means the model is not tied), the first token embedding entered again as lm_head. */
static void add_tied_head(stab_model *m, const stab_model_config *c, const stab_ckpt_tensor *const *t, size_t n) {
  int has_head = 0;
  for (size_t i = 0; i < m->n; i++) has_head |= !m->e[i].why_not && m->e[i].kind == STAB_KIND_LM_HEAD;
  for (size_t i = 0; i < n && !has_head; i++)
    has_head = t[i]->ndim == 2 && last_component_in(t[i]->name, head_names) &&
               !override_for(c->kinds, c->nkinds, t[i]->name);
  /* one shard of a model: a head in another shard is the model's head all the same (an index
   * has names, not shapes) */
  for (size_t i = 0; c->other_names && i < c->n_other && !has_head; i++)
    has_head = c->other_names[i] && last_component_in(c->other_names[i], head_names) &&
               !override_for(c->kinds, c->nkinds, c->other_names[i]);
  m->has_head = has_head;
  if (c->tie == 0) return; /* no head tensor: the head is missing, not tied */
  for (size_t i = 0, end = m->n; i < end && !has_head; i++) {
    const stab_model_entry *e = &m->e[i];
    if (e->why_not || e->kind != STAB_KIND_EMBEDDING) continue;
    if (last_component_in(e->weight->name, position_names)) continue;
    if (override_for(c->kinds, c->nkinds, e->weight->name)) continue; /* the user said what it is */
    stab_model_entry *h = &m->e[m->n++];
    *h = *e;
    h->kind = STAB_KIND_LM_HEAD;
    h->d_in = e->d_out, h->d_out = e->d_in;
    h->tied = 1;
    has_head = 1;
  }
}

/* Names every entry as a trace of the same model names its layer (see the rules): the trainer
 * registers "transformer.h.0.mlp.c_fc" for transformer.h.0.mlp.c_fc.weight and "lm_head" for
 * its tied head, so a report and a trace join on the name. */
static int name_entries(stab_model *m) {
  size_t n = m->n;
  for (size_t i = 0; i < n; i++) {
    stab_model_entry *e = &m->e[i];
    if (e->tied || e->why_not || e->kind == STAB_KIND_BIAS || e->kind == STAB_KIND_ATTENTION ||
        e->name != e->weight->name || !ends_with(e->weight->name, ".weight"))
      continue; /* (a layer of experts and a slice are named when they are made) */
    if (!(e->name = keep(m, strndup(e->weight->name, strlen(e->weight->name) - 7)))) return -1;
  }
  /* nn.MultiheadAttention's separate projections (kdim, vdim): X.q_proj_weight is X.q_proj */
  for (size_t i = 0; i < n; i++) {
    stab_model_entry *e = &m->e[i];
    const char *tn = e->weight->name;
    if (e->why_not || e->kind != STAB_KIND_LINEAR || e->name != tn || e->part ||
        !(is_component(tn, "q_proj_weight") || is_component(tn, "k_proj_weight") || is_component(tn, "v_proj_weight")))
      continue;
    if (!(e->name = keep(m, strndup(tn, strlen(tn) - 7)))) return -1;
  }
  size_t *by = malloc((n ? n : 1) * sizeof *by);
  if (!by) return -1;
  for (size_t i = 0; i < n; i++) by[i] = i;
  sort_entries = m->e;
  qsort(by, n, sizeof *by, by_entry_name);
  int head_taken = 0;
  /* a stripped name another entry has keeps its tensor name (a file may hold "x" and "x.weight") */
  char *revert = calloc(n ? n : 1, 1);
  if (!revert) return free(by), -1;
  for (size_t k = 0; k < n; k++) {
    const stab_model_entry *e = &m->e[by[k]];
    head_taken |= !e->tied && !strcmp(e->name, "lm_head");
    int clash = (k > 0 && !strcmp(m->e[by[k - 1]].name, e->name)) || (k + 1 < n && !strcmp(m->e[by[k + 1]].name, e->name));
    revert[by[k]] = clash && e->name != e->weight->name && !e->tied && e->kind != STAB_KIND_ATTENTION &&
                    !e->n_expert && e->expert == STAB_MODEL_NO_EXPERT && !e->part;
  }
  for (size_t i = 0; i < n; i++)
    if (revert[i]) m->e[i].name = m->e[i].weight->name;
  free(revert), free(by);
  for (size_t i = 0; i < n; i++) {
    stab_model_entry *e = &m->e[i];
    if (!e->tied) continue;
    /* a model with an lm_head of its own and a tied head besides (an override made it so) */
    const char *tn = e->weight->name;
    e->name = head_taken ? keepf(m, "%.*s.lm_head", (int)(strlen(tn) - (ends_with(tn, ".weight") ? 7 : 0)), tn)
                         : "lm_head";
    if (!e->name) return -1;
  }
  return 0;
}

/* ---- the model ---------------------------------------------------------------------------- */

/* STAB_EINVAL naming the first override whose value is none of values (NULL-terminated): a
 * typo ("embeding", "in-major") would otherwise be no override at all, unsaid. */
static stab_status check_overrides(const stab_model_override *o, size_t n, const char *field,
                                   const char *const *values) {
  if (n && !o) return stabi_fail(STAB_EINVAL, "stab_model_describe: %s is NULL with n%s %zu", field, field, n);
  for (size_t i = 0; i < n; i++) {
    if (!o[i].glob || !o[i].value)
      return stabi_fail(STAB_EINVAL, "stab_model_describe: %s[%zu] has a NULL glob or value", field, i);
    size_t k = 0;
    while (values[k] && strcmp(values[k], o[i].value)) k++;
    if (!values[k]) {
      char want[128] = "";
      for (size_t j = 0; values[j]; j++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", j ? ", " : "", values[j]);
      return stabi_fail(STAB_EINVAL, "stab_model_describe: %s[%zu] '%s=%s': '%s' is not one of %s", field, i,
                        o[i].glob, o[i].value, o[i].value, want);
    }
  }
  return STAB_OK;
}

stab_status stab_model_describe(const stab_ckpt_tensor *const *tensors, size_t n, const stab_model_config *config,
                                stab_model **out) {
  if (out) *out = NULL;
  if (!out || (n && !tensors)) return stabi_fail(STAB_EINVAL, "stab_model_describe: NULL %s", out ? "tensors" : "out");
  for (size_t i = 0; i < n; i++)
    if (!tensors[i] || !tensors[i]->name)
      return stabi_fail(STAB_EINVAL, "stab_model_describe: tensor %zu is NULL or has no name", i);
  const stab_model_config def = stab_model_default_config(), *c = config ? config : &def;
  static const char *const kind_values[] = {"linear", "embedding", "lm_head", "gain", "bias", "skip", NULL};
  static const char *const layout_values[] = {"in_major", "out_major", NULL};
  stab_status st = check_overrides(c->kinds, c->nkinds, "kinds", kind_values);
  if (st == STAB_OK) st = check_overrides(c->layouts, c->nlayouts, "layouts", layout_values);
  if (st != STAB_OK) return st;
  stab_model *m = calloc(1, sizeof *m);
  size_t *by_name = malloc((n ? n : 1) * sizeof *by_name);
  /* one entry per tensor, at most one attention entry per tensor, one tied head */
  if (!m || !by_name || n > SIZE_MAX / (2 * sizeof *m->e) - 1 || !(m->e = calloc(2 * n + 1, sizeof *m->e))) goto oom;
  for (size_t i = 0; i < n; i++) by_name[i] = i;
  sort_tensors = tensors;
  qsort(by_name, n, sizeof *by_name, by_tensor_name);
  for (size_t i = 0; i < n; i++)
    if (classify(m, c, tensors[i], &m->e[m->n++])) goto oom;
  if (add_attention(m, c, tensors, n, by_name) || fold_biases(m) || split_fused(m, c) || group_experts(m)) goto oom;
  add_tied_head(m, c, tensors, n);
  if (name_entries(m)) goto oom;
  free(by_name);
  *out = m;
  return STAB_OK;
oom:
  free(by_name);
  stab_model_free(m);
  return stabi_fail(STAB_ENOMEM, "stab_model_describe: out of memory describing %zu tensors", n);
}

void stab_model_free(stab_model *m) {
  if (!m) return;
  for (size_t i = 0; i < m->nowned; i++) free(m->owned[i]);
  free(m->owned), free(m->e), free(m);
}

size_t stab_model_count(const stab_model *m) { return m ? m->n : 0; }

int stab_model_has_head(const stab_model *m) { return m ? m->has_head : 0; }

const stab_model_entry *stab_model_entry_at(const stab_model *m, size_t index) {
  return m && index < m->n ? &m->e[index] : NULL;
}

/* ---- entries as layers ------------------------------------------------------------------- */

stab_status stab_model_entry_layer(const stab_model_entry *e, stab_dtype dtype, const void *weight,
                                   const void *bias, const void *weight_k, stab_layer *out) {
  if (!e || !weight || !out) return stabi_fail(STAB_EINVAL, "stab_model_entry_layer: NULL argument");
  if (e->why_not) return stabi_fail(STAB_EINVAL, "stab_model_entry_layer: '%s' is not measured: %s", e->name, e->why_not);
  if (e->n_expert)
    return stabi_fail(STAB_EINVAL, "stab_model_entry_layer: '%s' is a layer of %zu experts: register each expert's entry",
                      e->name, e->n_expert);
  if (dtype != STAB_DTYPE_F32 && dtype != STAB_DTYPE_F16 && dtype != STAB_DTYPE_BF16)
    return stabi_fail(STAB_EINVAL, "stab_model_entry_layer: '%s': dtype %d is not F32, F16 or BF16", e->name, (int)dtype);
  const size_t elem = dtype == STAB_DTYPE_F32 ? 4 : 2; /* the offsets below count elements */
  int attention = e->kind == STAB_KIND_ATTENTION;
  if (attention && !weight_k) return stabi_fail(STAB_EINVAL, "stab_model_entry_layer: attention '%s': NULL weight_k", e->name);
  stab_layer L;
  memset(&L, 0, sizeof L);
  L.name = e->name;
  L.kind = e->kind;
  L.layout = e->kind == STAB_KIND_LINEAR || attention ? e->layout : STAB_LAYOUT_NATURAL;
  if (e->kind == STAB_KIND_EMBEDDING || e->kind == STAB_KIND_LM_HEAD) {
    /* a table by what it is: V vectors of width d, whichever side is the input */
    L.vocab = e->kind == STAB_KIND_EMBEDDING ? e->d_in : e->d_out;
    L.width = e->kind == STAB_KIND_EMBEDDING ? e->d_out : e->d_in;
  } else {
    L.d_in = e->d_in, L.d_out = e->d_out;
  }
  L.dtype = dtype;
  const int linear = e->kind == STAB_KIND_LINEAR;
  /* a part of a fused q/k/v: its block of the tensor and its slice of the bias */
  L.weight = (const float *)(const void *)((const unsigned char *)weight +
                                           (attention ? e->q_off : linear ? e->offset : 0) * elem);
  L.bias = linear && e->bias && bias ? (const float *)(const void *)((const unsigned char *)bias + e->bias_offset * elem) : NULL;
  if (linear) L.ld = e->ld;
  if (attention) {
    L.weight_k = (const float *)(const void *)((const unsigned char *)weight_k + e->k_off * elem);
    L.ld = e->ld, L.heads = e->heads, L.kv_heads = e->kv_heads;
  }
  *out = L;
  return STAB_OK;
}
