/* model_config.c — what a checkpoint's own metadata says of its model (head counts, the
 * producer's layout), as the plain values of stab_model_config that the kind rules take. */
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* 1 when s is a whole number in [lo, hi] written in decimal digits alone (no sign, no blanks,
 * no base prefix: strtoull would take "-1" as 18446744073709551615), into *v. */
static int whole_number(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *v) {
  if (!s || *s < '0' || *s > '9') return 0;
  unsigned long long x = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned d = (unsigned)(*s - '0');
    if (x > (~0ULL - d) / 10) return 0;
    x = x * 10 + d;
  }
  if (*s || x < lo || x > hi) return 0;
  *v = x;
  return 1;
}

/* <arch>.attention.<what> as a count from 1 to STAB_MODEL_MAX_HEADS into *v: STAB_OK, or
 * STAB_ENOTFOUND (absent, or with arrays_unknown an array: per-layer counts are left unknown),
 * or STAB_ERANGE. */
static stab_status gguf_count(const stab_gguf *f, const char *arch, const char *what, int arrays_unknown, size_t *v) {
  char key[192];
  snprintf(key, sizeof key, "%s.attention.%s", arch, what);
  const stab_gguf_kv *kv = stab_gguf_find_metadata(f, key);
  if (!kv || (arrays_unknown && kv->type == STAB_GGUF_ARRAY)) return STAB_ENOTFOUND;
  if (kv->type == STAB_GGUF_ARRAY) /* GGUF allows a count per layer; the rows take one for all */
    return stabi_fail(STAB_ERANGE, "the GGUF metadata's %s is an array of %llu %s (a count per layer), not one count "
                      "for every layer (give --heads H)", key, (unsigned long long)kv->len,
                      stab_gguf_value_type_name(kv->elem_type));
  uint64_t h = 0;
  stab_status st = stab_gguf_get_uint(f, key, &h);
  if (st == STAB_OK && h > 0 && h <= STAB_MODEL_MAX_HEADS) return *v = (size_t)h, STAB_OK;
  if (st == STAB_OK)
    return stabi_fail(STAB_ERANGE, "the GGUF metadata's %s is %llu, which is invalid (1 to %d; give --heads H)", key,
                      (unsigned long long)h, STAB_MODEL_MAX_HEADS);
  return stabi_fail(STAB_ERANGE, "%s (give --heads H)", stab_last_error());
}

stab_status stab_model_config_from_gguf(const stab_gguf *f, stab_model_config *cfg) {
  if (!f || !cfg) return stabi_fail(STAB_EINVAL, "stab_model_config_from_gguf: NULL argument");
  cfg->naming = STAB_NAMING_GGUF;
  const stab_gguf_kv *arch = stab_gguf_find_metadata(f, "general.architecture");
  if (!arch || arch->type != STAB_GGUF_STRING) return STAB_OK;
  size_t v;
  if (cfg->heads) return STAB_OK; /* the key heads and head width come with the count only */
  stab_status st = gguf_count(f, arch->s, "head_count", 0, &v);
  if (st == STAB_ENOTFOUND) return STAB_OK;
  cfg->heads_source = "the GGUF metadata";
  if (st != STAB_OK) return st;
  cfg->heads = v;
  if (gguf_count(f, arch->s, "head_count_kv", 1, &v) == STAB_OK) cfg->kv_heads = v;
  if (gguf_count(f, arch->s, "key_length", 1, &v) == STAB_OK) cfg->head_dim = v;
  return STAB_OK;
}

stab_status stab_model_config_from_hf(const stab_hf_config *hf, stab_model_config *cfg) {
  if (!hf || !cfg) return stabi_fail(STAB_EINVAL, "stab_model_config_from_hf: NULL argument");
  cfg->tie = hf->tie_word_embeddings;
  if (cfg->heads || !hf->num_attention_heads) return STAB_OK;
  cfg->heads_source = "config.json";
  if (hf->num_attention_heads > STAB_MODEL_MAX_HEADS)
    return stabi_fail(STAB_ERANGE, "config.json's num_attention_heads is %zu, more than %d (give --heads H)",
                      hf->num_attention_heads, STAB_MODEL_MAX_HEADS);
  cfg->heads = hf->num_attention_heads;
  cfg->kv_heads = hf->num_key_value_heads, cfg->head_dim = hf->head_dim;
  return STAB_OK;
}

int stabi_model_trainer_file(const stab_safetensors *f) {
  /* the trainer writes "stabmeter-train VERSION" (trainer/train.c) */
  for (size_t i = 0; i < stab_safetensors_metadata_count(f); i++) {
    const char *k, *v;
    stab_safetensors_metadata(f, i, &k, &v);
    if (!strcmp(k, "producer") && !strncmp(v, "stabmeter-train", 15)) return 1;
  }
  return 0;
}

stab_status stab_model_config_from_safetensors(const stab_safetensors *f, stab_model_config *cfg) {
  static const char *const head_keys[] = {"heads", "num_attention_heads", "n_head", NULL};
  if (!f || !cfg) return stabi_fail(STAB_EINVAL, "stab_model_config_from_safetensors: NULL argument");
  cfg->naming = STAB_NAMING_HF;
  if (stabi_model_trainer_file(f)) cfg->out_major = 1;
  if (cfg->heads) return STAB_OK;
  size_t n = stab_safetensors_metadata_count(f);
  for (size_t i = 0; i < n; i++) {
    const char *k, *v;
    stab_safetensors_metadata(f, i, &k, &v);
    for (size_t j = 0; head_keys[j]; j++) {
      if (strcmp(k, head_keys[j])) continue;
      unsigned long long h;
      cfg->heads_source = "__metadata__";
      if (whole_number(v, 1, STAB_MODEL_MAX_HEADS, &h)) return cfg->heads = (size_t)h, STAB_OK;
      return stabi_fail(STAB_ERANGE, "__metadata__ %s is '%.40s', not a whole number from 1 to %d (give --heads H)", k,
                        v, STAB_MODEL_MAX_HEADS);
    }
  }
  return STAB_OK;
}

stab_status stab_model_attn_scale_from_safetensors(const stab_safetensors *f, stab_attn_scale *out) {
  if (!f || !out) return stabi_fail(STAB_EINVAL, "stab_model_attn_scale_from_safetensors: NULL argument");
  *out = STAB_ATTN_SCALE_SQRT; /* every other producer's, and the trainer's default */
  size_t n = stab_safetensors_metadata_count(f);
  for (size_t i = 0; i < n; i++) {
    const char *k, *v;
    stab_safetensors_metadata(f, i, &k, &v);
    if (strcmp(k, "attn_scale")) continue;
    if (!strcmp(v, "sqrt")) return *out = STAB_ATTN_SCALE_SQRT, STAB_OK;
    if (!strcmp(v, "inverse")) return *out = STAB_ATTN_SCALE_INVERSE, STAB_OK;
    /* a guess would put the logit bound off by sqrt(d_h) without a word */
    return stabi_fail(STAB_EFORMAT, "__metadata__ attn_scale is '%.40s', not sqrt or inverse", v);
  }
  return STAB_OK;
}

double stab_attn_scale_of(stab_attn_scale scale, size_t head_dim) {
  if (!head_dim) return 0;
  return scale == STAB_ATTN_SCALE_INVERSE ? 1.0 / (double)head_dim : 1.0 / sqrt((double)head_dim);
}
