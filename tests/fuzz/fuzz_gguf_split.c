/* fuzz_gguf_split.c — libFuzzer target for a split GGUF model (lib/checkpoint/gguf_split.c over
 * lib/checkpoint/gguf.c): the input is a little-endian uint32 n, n bytes of shard 1, the rest shard 2,
 * written as m-00001-of-00002.gguf and m-00002-of-00002.gguf in a directory of the process's own;
 * shard 1 is opened and, when it says it is one of a split (split.count > 1), its model. An
 * accepted model must hold exactly its shards' tensors, each found by name in its own shard's
 * bytes, none twice, and split.tensors.count of them when the shards say it; a refusal must say
 * why and leave nothing open. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "checkpoint/checkpoint_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], paths[2][128];

static void cleanup(void) {
  remove(paths[0]), remove(paths[1]), rmdir(dir);
}

static void put(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  FUZZ_CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

static void check_model(const stabi_gguf_split *s, const uint8_t *const *bytes, const size_t *sizes) {
  size_t n = stabi_gguf_split_shard_count(s), total = 0;
  FUZZ_CHECK(n == 2, "%zu shards, the input has 2", n);
  for (size_t k = 0; k < n; k++) total += stab_gguf_count(stabi_gguf_split_shard(s, k));
  FUZZ_CHECK(stabi_gguf_split_count(s) == total, "%zu tensors, the shards hold %zu", stabi_gguf_split_count(s), total);
  uint64_t said;
  if (stab_gguf_get_uint(stabi_gguf_split_shard(s, 0), "split.tensors.count", &said) == STAB_OK)
    FUZZ_CHECK(said == total, "split.tensors.count %llu, %zu tensors accepted", (unsigned long long)said, total);
  uint64_t base = 0;
  for (size_t k = 0; k < n; k++) {
    FUZZ_CHECK(stabi_gguf_split_base(s, k) == base, "shard %zu starts at %llu, not %llu", k,
               (unsigned long long)stabi_gguf_split_base(s, k), (unsigned long long)base);
    base += sizes[k];
  }
  for (size_t i = 0; i < total; i++) {
    const stab_ckpt_tensor *t = stabi_gguf_split_tensor(s, i);
    size_t k = stabi_gguf_split_shard_of(s, i), j = (size_t)-1;
    FUZZ_CHECK(t && k < n, "tensor %zu: NULL or in shard %zu", i, k);
    FUZZ_CHECK(stabi_gguf_split_find(s, t->name, &j) == STAB_OK && j == i, "'%s' found at %zu, listed at %zu", t->name, j, i);
    if (t->elem_size > 0) fuzz_check_tensor(t, bytes[k], sizes[k]); /* its bytes are its own shard's */
  }
  FUZZ_CHECK(stabi_gguf_split_tensor(s, total) == NULL, "a tensor past the end");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/fuzz_gguf_split.XXXXXX");
    FUZZ_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(paths[0], sizeof paths[0], "%s/m-00001-of-00002.gguf", dir);
    snprintf(paths[1], sizeof paths[1], "%s/m-00002-of-00002.gguf", dir);
    atexit(cleanup);
  }
  if (size < 4) return 0;
  fuzz_begin(data, size); /* the heap accounting; the shards are files of their own */
  size_t n = fuzz_le32(data);
  if (n > size - 4) n = size - 4;
  const uint8_t *bytes[2] = {data + 4, data + 4 + n};
  size_t sizes[2] = {n, size - 4 - n};
  put(paths[0], bytes[0], sizes[0]);
  put(paths[1], bytes[1], sizes[1]);
  stab_gguf *g = NULL;
  if (stab_gguf_open(paths[0], &g) == STAB_OK) {
    size_t no = 0, count = 0;
    if (stabi_gguf_split_info(g, paths[0], &no, &count) == STAB_OK && count > 1) {
      stabi_gguf_split *s = NULL;
      stab_status st = stabi_gguf_split_open(paths[0], g, &s);
      if (st == STAB_OK) {
        check_model(s, bytes, sizes);
        stabi_gguf_split_close(s); /* its shards, g among them */
        g = NULL;
      } else {
        FUZZ_CHECK(s == NULL && stab_last_error()[0], "refused (%d) without a message or with a model", st);
      }
    }
    stab_gguf_close(g);
  }
  fuzz_end(size);
  return 0;
}
