/* hf_config.c — a Hugging Face model's config.json: the few values the kind rules need (head
 * counts, widths, whether the head is tied, expert counts), read from a real JSON parse and
 * checked, so that a wrong value is a message naming the file and the key rather than a wrong
 * measurement. */
#include "checkpoint/checkpoint_internal.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

/* config.json is a few kilobytes; a megabyte is far above any real one and bounds the read. */
#define CONFIG_MAX_BYTES ((uint64_t)1 << 20)
/* Above any real model's, and small enough that products of two stay far from overflow. */
#define COUNT_MAX ((uint64_t)1 << 40)

/* Where a key is looked up: the top level, else "text_config" (a multimodal model keeps its
 * language model's values there). */
typedef struct {
  const stabi_json *top, *text;
  const char *path;
} scopes;

static const stabi_json *lookup(const scopes *s, const char *key, int *nested) {
  const stabi_json *v = stabi_json_get(s->top, key);
  *nested = 0;
  if (!v && s->text && (v = stabi_json_get(s->text, key))) *nested = 1;
  return v;
}

/* A whole number in [lo, COUNT_MAX] under one of the keys (aliases, in order: the first present
 * decides; two present that disagree are an error), or *out 0 when none is there. JSON null is
 * absent (transformers writes "head_dim": null for models that derive it). */
static stab_status get_count(const scopes *s, const char *const *keys, uint64_t lo, size_t *out, const char **found) {
  *out = 0;
  const char *first = NULL;
  for (size_t k = 0; keys[k]; k++) {
    int nested;
    const stabi_json *v = lookup(s, keys[k], &nested);
    if (!v || v->type == STABI_JSON_NULL) continue;
    const char *where = nested ? "text_config." : "";
    int str = v->type == STABI_JSON_STRING;
    if (v->type != STABI_JSON_NUMBER)
      return stabi_fail(STAB_EFORMAT, "%s: \"%s%s\" is %s%s%.40s%s, not a whole number", s->path, where, keys[k],
                        stabi_json_type_name(v), str ? " \"" : "", str ? v->s : "", str ? "\"" : "");
    /* a number is its value, however written: 4, 4.0 and 4e0 are four heads (JSON has one number
     * type; Python's json writes a float 4.0 where a config held one) */
    uint64_t u = v->is_uint ? v->u : 0;
    int whole = v->is_uint || (isfinite(v->num) && v->num >= 0 && v->num <= (double)COUNT_MAX && v->num == floor(v->num));
    if (whole && !v->is_uint) u = (uint64_t)v->num;
    if (!whole || u < lo || u > COUNT_MAX)
      return stabi_fail(STAB_EFORMAT, "%s: \"%s%s\" is %.17g, not a whole number from %llu to %llu", s->path, where,
                        keys[k], v->num, (unsigned long long)lo, (unsigned long long)COUNT_MAX);
    if (!first) {
      first = keys[k], *out = (size_t)u;
      if (found) *found = keys[k];
    } else if ((size_t)u != *out)
      return stabi_fail(STAB_EFORMAT, "%s: \"%s\" is %llu but \"%s\" is %zu (the same value under two names)", s->path,
                        keys[k], (unsigned long long)u, first, *out);
  }
  return STAB_OK;
}

static stab_status get_string(const scopes *s, const char *key, char *buf, size_t cap) {
  int nested;
  const stabi_json *v = lookup(s, key, &nested);
  buf[0] = '\0';
  if (!v || v->type == STABI_JSON_NULL) return STAB_OK;
  if (v->type != STABI_JSON_STRING)
    return stabi_fail(STAB_EFORMAT, "%s: \"%s%s\" is %s, not a string", s->path, nested ? "text_config." : "", key,
                      stabi_json_type_name(v));
  snprintf(buf, cap, "%s", v->s);
  return STAB_OK;
}

stab_status stab_hf_config_read(const char *path, stab_hf_config *out) {
  if (out) memset(out, 0, sizeof *out), out->tie_word_embeddings = -1;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_hf_config_read: NULL path or output");
  stabi_json root;
  stab_status st = stabi_json_read(path, CONFIG_MAX_BYTES, &root);
  if (st != STAB_OK) return st;
  scopes s = {&root, NULL, path};
  if (root.type != STABI_JSON_OBJECT) {
    st = stabi_fail(STAB_EFORMAT, "%s: the top level is %s, not an object", path, stabi_json_type_name(&root));
    goto out;
  }
  s.text = stabi_json_get(&root, "text_config");
  if (s.text && s.text->type == STABI_JSON_NULL) s.text = NULL;
  if (s.text && s.text->type != STABI_JSON_OBJECT) {
    st = stabi_fail(STAB_EFORMAT, "%s: \"text_config\" is %s, not an object", path, stabi_json_type_name(s.text));
    goto out;
  }
  static const char *const k_heads[] = {"num_attention_heads", "n_head", NULL};
  static const char *const k_kv[] = {"num_key_value_heads", NULL};
  static const char *const k_hd[] = {"head_dim", NULL};
  static const char *const k_hidden[] = {"hidden_size", "n_embd", NULL};
  static const char *const k_layers[] = {"num_hidden_layers", "n_layer", NULL};
  static const char *const k_vocab[] = {"vocab_size", NULL};
  static const char *const k_local[] = {"num_local_experts", NULL};
  static const char *const k_experts[] = {"num_experts", NULL};
  static const char *const k_routed[] = {"n_routed_experts", NULL};
  static const char *const k_per_tok[] = {"num_experts_per_tok", NULL};
  const char *heads_key = "num_attention_heads", *kv_key = "num_key_value_heads";
  /* expert counts may be 0 (a dense layer's config of an MoE family); every size must be >= 1 */
  if ((st = get_count(&s, k_heads, 1, &out->num_attention_heads, &heads_key)) != STAB_OK ||
      (st = get_count(&s, k_kv, 1, &out->num_key_value_heads, &kv_key)) != STAB_OK ||
      (st = get_count(&s, k_hd, 1, &out->head_dim, NULL)) != STAB_OK ||
      (st = get_count(&s, k_hidden, 1, &out->hidden_size, NULL)) != STAB_OK ||
      (st = get_count(&s, k_layers, 1, &out->num_hidden_layers, NULL)) != STAB_OK ||
      (st = get_count(&s, k_vocab, 1, &out->vocab_size, NULL)) != STAB_OK ||
      (st = get_count(&s, k_local, 0, &out->num_local_experts, NULL)) != STAB_OK ||
      (st = get_count(&s, k_experts, 0, &out->num_experts, NULL)) != STAB_OK ||
      (st = get_count(&s, k_routed, 0, &out->n_routed_experts, NULL)) != STAB_OK ||
      (st = get_count(&s, k_per_tok, 0, &out->num_experts_per_tok, NULL)) != STAB_OK ||
      (st = get_string(&s, "model_type", out->model_type, sizeof out->model_type)) != STAB_OK)
    goto out;
  if (out->num_key_value_heads && out->num_attention_heads &&
      (out->num_key_value_heads > out->num_attention_heads || out->num_attention_heads % out->num_key_value_heads)) {
    st = stabi_fail(STAB_EFORMAT, "%s: \"%s\" %zu does not divide \"%s\" %zu (each key head serves a whole group of "
                    "query heads)", path, kv_key, out->num_key_value_heads, heads_key, out->num_attention_heads);
    goto out;
  }
  int nested;
  const stabi_json *v = lookup(&s, "tie_word_embeddings", &nested);
  if (v && v->type != STABI_JSON_NULL) {
    if (v->type != STABI_JSON_TRUE && v->type != STABI_JSON_FALSE) {
      st = stabi_fail(STAB_EFORMAT, "%s: \"%stie_word_embeddings\" is %s, not true or false", path,
                      nested ? "text_config." : "", stabi_json_type_name(v));
      goto out;
    }
    out->tie_word_embeddings = v->type == STABI_JSON_TRUE;
  }
  if ((v = stabi_json_get(&root, "architectures")) && v->type != STABI_JSON_NULL) {
    if (v->type != STABI_JSON_ARRAY || (v->n && v->items[0].type != STABI_JSON_STRING)) {
      st = stabi_fail(STAB_EFORMAT, "%s: \"architectures\" is %s, not an array of strings", path,
                      v->type != STABI_JSON_ARRAY ? stabi_json_type_name(v) : "an array of other values");
      goto out;
    }
    if (v->n) snprintf(out->architecture, sizeof out->architecture, "%s", v->items[0].s);
  }
out:
  stabi_json_free(&root);
  if (st != STAB_OK) memset(out, 0, sizeof *out), out->tie_word_embeddings = -1;
  return st;
}
