/* fuzz_shard_index.c — libFuzzer target for the JSON files beside a Hugging Face checkpoint: the
 * input is read as a sharded model's index (stab_shard_index_open, lib/checkpoint/sharded.c) and as a
 * config.json (stab_hf_config_read, lib/checkpoint/hf_config.c), both over lib/core/json.c. An accepted index must
 * keep every promise of stabmeter.h (tensor names unique, sorted, found by find; shard names plain
 * file names, sorted, unique; each tensor's shard in range); an accepted config's values must be in
 * their documented ranges; a refusal is STAB_EFORMAT (or STAB_ENOMEM) naming the file, with the
 * output emptied. The shards themselves are never opened: the input's directory is /proc/self/fd. */
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* 1 when the n bytes of s are valid UTF-8 (each sequence as stab_utf8_decode takes it). */
static int utf8_ok(const char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    int k = stab_utf8_decode(s + i, n - i, NULL);
    if (k <= 0) return 0;
    i += (size_t)k;
  }
  return 1;
}

static void check_index(const char *path, const uint8_t *data, size_t size) {
  stab_shard_index *ix = (stab_shard_index *)1;
  stab_status st = stab_shard_index_open(path, &ix);
  if (st != STAB_OK) {
    fuzz_check_open_failure(st, path, ix == NULL);
    return;
  }
  /* an object holding the key weight_map, so the input must say so somewhere */
  FUZZ_CHECK(memchr(data, '{', size) != NULL, "an index without an object");
  size_t n = stab_shard_index_count(ix), ns = stab_shard_index_shard_count(ix);
  FUZZ_CHECK(n > 0 && ns > 0 && ns <= n, "%zu tensors in %zu shards", n, ns);
  const char *prev = NULL;
  for (size_t k = 0; k < ns; k++) {
    const char *s = stab_shard_index_shard(ix, k);
    FUZZ_CHECK(s && s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, ".."), "unsafe shard name '%s'", s ? s : "");
    FUZZ_CHECK(utf8_ok(s, strlen(s)), "shard %zu: not UTF-8", k);
    FUZZ_CHECK(!prev || strcmp(prev, s) < 0, "shards not sorted or not unique: '%s' then '%s'", prev, s);
    prev = s;
  }
  FUZZ_CHECK(stab_shard_index_shard(ix, ns) == NULL, "a shard past the end");
  prev = NULL;
  for (size_t i = 0; i < n; i++) {
    size_t shard = (size_t)-1, at = (size_t)-1;
    const char *t = stab_shard_index_tensor(ix, i, &shard);
    FUZZ_CHECK(t && t[0] && utf8_ok(t, strlen(t)), "tensor %zu: empty or not UTF-8", i);
    FUZZ_CHECK(shard < ns, "tensor '%s': shard %zu of %zu", t, shard, ns);
    FUZZ_CHECK(!prev || strcmp(prev, t) < 0, "tensors not sorted or not unique: '%s' then '%s'", prev, t);
    FUZZ_CHECK(stab_shard_index_find(ix, t, &at) == STAB_OK && at == i, "find('%s') gave %zu, not %zu", t, at, i);
    prev = t;
  }
  FUZZ_CHECK(stab_shard_index_tensor(ix, n, NULL) == NULL, "a tensor past the end");
  FUZZ_CHECK(stab_shard_index_find(ix, "", NULL) == STAB_ENOTFOUND, "an empty name found");
  uint64_t total = 0;
  st = stab_shard_index_total_size(ix, &total);
  FUZZ_CHECK(st == STAB_OK || st == STAB_ENOTFOUND, "total_size status %d", st);
  FUZZ_CHECK(!strcmp(stab_shard_index_path(ix), path), "the index's path");
  stab_shard_index_close(ix);
}

static void check_config(const char *path) {
  stab_hf_config c;
  memset(&c, 0x5a, sizeof c);
  stab_status st = stab_hf_config_read(path, &c);
  FUZZ_CHECK(c.tie_word_embeddings >= -1 && c.tie_word_embeddings <= 1, "tie %d", c.tie_word_embeddings);
  FUZZ_CHECK(memchr(c.model_type, 0, sizeof c.model_type) && memchr(c.architecture, 0, sizeof c.architecture),
             "a string not terminated");
  if (st != STAB_OK) {
    FUZZ_CHECK(st == STAB_EFORMAT || st == STAB_ENOMEM, "status %d", st);
    FUZZ_CHECK(strstr(stab_last_error(), path) != NULL, "the message does not name the file: %s", stab_last_error());
    FUZZ_CHECK(c.num_attention_heads == 0 && c.num_key_value_heads == 0 && c.head_dim == 0 && c.tie_word_embeddings == -1 &&
                   !c.model_type[0] && !c.architecture[0],
               "values left after a refusal");
    return;
  }
  const size_t max = (size_t)1 << 40;
  size_t counts[] = {c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size, c.num_hidden_layers,
                     c.vocab_size, c.num_local_experts, c.num_experts, c.n_routed_experts, c.num_experts_per_tok};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) FUZZ_CHECK(counts[i] <= max, "count %zu: %zu", i, counts[i]);
  if (c.num_attention_heads && c.num_key_value_heads)
    FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "%zu key heads for %zu heads", c.num_key_value_heads,
               c.num_attention_heads);
  FUZZ_CHECK(utf8_ok(c.model_type, strlen(c.model_type)) || strlen(c.model_type) == sizeof c.model_type - 1,
             "model_type not UTF-8"); /* a cut string may end inside a sequence */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_begin(data, size);
  check_index(path, data, size);
  check_config(path);
  fuzz_end(size);
  return 0;
}
