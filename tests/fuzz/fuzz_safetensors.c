/* fuzz_safetensors.c — libFuzzer target for the safetensors reader (lib/checkpoint/safetensors.c):
 * opens the input, and when the reader accepts it, checks the format's rules against the raw
 * bytes (tensors tile the data section in order), every name and metadata lookup, and reads
 * every tensor in full. */
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reader accepted the input: everything it hands out must agree with the bytes. */
static void check_accepted(stab_safetensors *f, const uint8_t *data, size_t size) {
  FUZZ_CHECK(size >= 8, "a %zu-byte file was accepted", size);
  uint64_t hlen = fuzz_le64(data);
  FUZZ_CHECK(hlen > 0 && hlen <= size - 8, "header length %llu accepted in a %zu-byte file", (unsigned long long)hlen,
             size);
  FUZZ_CHECK(stab_safetensors_file_size(f) == size, "file size %llu, input %zu",
             (unsigned long long)stab_safetensors_file_size(f), size);

  /* the tensors, in offset order, cover the data section exactly */
  size_t n = stab_safetensors_count(f);
  uint64_t pos = 8 + hlen;
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *t = stab_safetensors_tensor(f, i);
    fuzz_check_tensor(t, data, size);
    FUZZ_CHECK(t->name[0] != '\0', "tensor %zu has an empty name", i);
    FUZZ_CHECK(t->offset == pos, "'%s' starts at %llu, the previous tensor ends at %llu", t->name,
               (unsigned long long)t->offset, (unsigned long long)pos);
    pos += t->count * t->elem_size;
    size_t at = n;
    FUZZ_CHECK(stab_safetensors_find(f, t->name, &at) == STAB_OK && at == i, "find('%s') gave %zu, not %zu", t->name,
               at, i);
  }
  FUZZ_CHECK(pos == size, "the tensors end at %llu in a %zu-byte file", (unsigned long long)pos, size);
  FUZZ_CHECK(stab_safetensors_tensor(f, n) == NULL, "a tensor past the count");
  FUZZ_CHECK(stab_safetensors_find(f, "", NULL) == STAB_ENOTFOUND, "the empty name (refused in files) was found");

  /* metadata: every entry readable, keys strictly increasing (sorted and unique) */
  size_t nm = stab_safetensors_metadata_count(f);
  const char *prev = NULL;
  for (size_t i = 0; i < nm; i++) {
    const char *k = NULL, *v = NULL;
    FUZZ_CHECK(stab_safetensors_metadata(f, i, &k, &v) == STAB_OK && k && v, "metadata entry %zu", i);
    FUZZ_CHECK(!prev || strcmp(prev, k) < 0, "metadata keys '%s', '%s' out of order or repeated", prev, k);
    FUZZ_CHECK(strlen(v) <= hlen, "metadata value longer than the header");
    prev = k;
  }
  FUZZ_CHECK(stab_safetensors_metadata(f, nm, NULL, NULL) == STAB_ENOTFOUND, "a metadata entry past the count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_begin(data, size);
  stab_safetensors *f = (stab_safetensors *)&f; /* must come back NULL on failure */
  stab_status st = stab_safetensors_open(path, &f);
  if (st == STAB_OK) {
    check_accepted(f, data, size);
    stab_safetensors_close(f);
  } else {
    fuzz_check_open_failure(st, path, f == NULL);
  }
  fuzz_end(size);
  return 0;
}
