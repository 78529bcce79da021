/* fuzz_gguf.c — libFuzzer target for the GGUF reader (lib/checkpoint/gguf.c): opens the input, and
 * when the reader accepts it, checks the header against the raw bytes, every tensor (read in
 * full when it is F32, F16, BF16 or a quantized type the library decodes), name lookups and
 * every metadata pair. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A quantized tensor the library decodes: its blocks lie inside the file, it reads whole
 * (ASan sees any read past its blocks), and a range that starts and ends inside blocks gives
 * the same bits as the whole read. */
static void check_quantized(const stab_ckpt_tensor *t, size_t size) {
  uint64_t nb = stab_ckpt_nbytes(t);
  FUZZ_CHECK(!t->count || nb > 0, "'%s': %s of %llu elements spans no bytes", t->name, t->dtype_name,
             (unsigned long long)t->count);
  FUZZ_CHECK(t->offset <= size && nb <= size - t->offset, "'%s': %llu bytes from %llu are past the file", t->name,
             (unsigned long long)nb, (unsigned long long)t->offset);
  if (!t->count) return;
  size_t n = (size_t)t->count;
  float *all = malloc(n * sizeof *all), *part = malloc(n * sizeof *part);
  FUZZ_CHECK(all && part, "out of memory for %zu floats", n);
  FUZZ_CHECK(stab_ckpt_read_f32(t, 0, n, all) == STAB_OK, "'%s': %s not read: %s", t->name, t->dtype_name,
             stab_last_error());
  if (n > 2) {
    size_t first = 1 + n / 3 % 31, k = n - first - 1; /* off the block boundaries */
    FUZZ_CHECK(stab_ckpt_read_f32(t, first, k, part) == STAB_OK, "'%s': range not read", t->name);
    FUZZ_CHECK(!memcmp(part, all + first, k * sizeof *part), "'%s': [%zu, %zu) differs from the whole read",
               t->name, first, first + k);
  }
  free(all), free(part);
}

/* The reader accepted the input: everything it hands out must agree with the bytes. */
static void check_accepted(stab_gguf *f, const uint8_t *data, size_t size, const char *path) {
  FUZZ_CHECK(size >= 24 && memcmp(data, "GGUF", 4) == 0, "a %zu-byte file without the magic was accepted", size);
  FUZZ_CHECK(stab_gguf_is(path) == 1, "an accepted file is not sniffed as GGUF");
  uint32_t version = fuzz_le32(data + 4);
  FUZZ_CHECK(stab_gguf_version(f) == version && (version == 2 || version == 3), "version %u, header says %u",
             stab_gguf_version(f), version);
  uint64_t n_tensors = fuzz_le64(data + 8), n_kv = fuzz_le64(data + 16);
  size_t n = stab_gguf_count(f), nm = stab_gguf_metadata_count(f);
  FUZZ_CHECK(n == n_tensors && nm == n_kv, "%zu tensors and %zu pairs, the header says %llu and %llu", n, nm,
             (unsigned long long)n_tensors, (unsigned long long)n_kv);
  uint64_t align = stab_gguf_alignment(f);
  FUZZ_CHECK(align > 0 && (align & (align - 1)) == 0, "alignment %llu is not a power of two", (unsigned long long)align);

  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *t = stab_gguf_tensor(f, i);
    FUZZ_CHECK(t != NULL && t->name != NULL && t->dtype_name != NULL, "tensor %zu: NULL", i);
    FUZZ_CHECK(t->offset <= size, "'%s' starts past the end of the file", t->name);
    if (t->elem_size > 0) {
      fuzz_check_tensor(t, data, size); /* F32, F16, BF16 and the other fixed-size types */
    } else if (t->dtype == STAB_DTYPE_QUANT) {
      check_quantized(t, size);
    } else {
      /* block-quantized of a type not decoded: listed with its type name, never read as f32 */
      float x;
      FUZZ_CHECK(t->dtype == STAB_DTYPE_OTHER, "'%s': element size 0 for dtype %s", t->name, t->dtype_name);
      FUZZ_CHECK(stab_ckpt_read_f32(t, 0, 1, &x) != STAB_OK, "'%s': quantized %s read as f32", t->name,
                 t->dtype_name);
    }
    size_t at = n;
    FUZZ_CHECK(stab_gguf_find(f, t->name, &at) == STAB_OK && at == i, "find('%s') gave %zu, not %zu", t->name, at, i);
  }
  FUZZ_CHECK(stab_gguf_tensor(f, n) == NULL, "a tensor past the count");

  for (size_t i = 0; i < nm; i++) {
    const stab_gguf_kv *kv = stab_gguf_metadata(f, i);
    FUZZ_CHECK(kv != NULL && kv->key != NULL, "metadata pair %zu: NULL", i);
    FUZZ_CHECK(kv->offset < size, "'%s' is past the end of the file", kv->key);
    FUZZ_CHECK(stab_gguf_value_type_name(kv->type) != NULL, "'%s': unknown value type %d", kv->key, (int)kv->type);
    FUZZ_CHECK(stab_gguf_find_metadata(f, kv->key) == kv, "find_metadata('%s') is another pair", kv->key);
    if (kv->type == STAB_GGUF_STRING) FUZZ_CHECK(kv->s && strlen(kv->s) <= kv->len, "'%s': string", kv->key);
    if (kv->type == STAB_GGUF_ARRAY) FUZZ_CHECK(kv->len <= size, "'%s': %llu elements in a %zu-byte file", kv->key,
                                                (unsigned long long)kv->len, size);
    uint64_t u;
    stab_gguf_get_uint(f, kv->key, &u); /* any type: an answer or an error, never a crash */
  }
  FUZZ_CHECK(stab_gguf_metadata(f, nm) == NULL, "a metadata pair past the count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_begin(data, size);
  stab_gguf *f = (stab_gguf *)&f; /* must come back NULL on failure */
  stab_status st = stab_gguf_open(path, &f);
  if (st == STAB_OK) {
    check_accepted(f, data, size, path);
    stab_gguf_close(f);
  } else {
    fuzz_check_open_failure(st, path, f == NULL);
  }
  fuzz_end(size);
  return 0;
}
