/* fuzz_llmc.c — libFuzzer target for the llm.c checkpoint reader (lib/checkpoint/llmc.c): opens the
 * input, and when the reader accepts it, checks the configuration against the header's ints,
 * the file size against the parameter count, the views and their names, and reads every view
 * in full. */
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reader accepted the input: everything it hands out must agree with the bytes. */
static void check_accepted(stab_llmc *f, const uint8_t *data, size_t size, const char *path) {
  FUZZ_CHECK(size >= 1024, "a %zu-byte file was accepted", size);
  FUZZ_CHECK(stab_llmc_is(path) == 1, "an accepted file does not start with the magic");
  const stab_llmc_config *c = stab_llmc_config_of(f);
  int32_t h[8];
  for (int k = 0; k < 8; k++) h[k] = (int32_t)fuzz_le32(data + 4 * k);
  FUZZ_CHECK(c->version == h[1] && (h[1] == 3 || h[1] == 5), "version %d, header int 1 is %d", c->version, h[1]);
  FUZZ_CHECK((int64_t)c->max_t == h[2] && (int64_t)c->vocab == h[3] && (int64_t)c->layers == h[4] &&
                 (int64_t)c->heads == h[5] && (int64_t)c->channels == h[6] && (int64_t)c->padded_vocab == h[7],
             "the configuration differs from the header ints");
  FUZZ_CHECK(c->heads > 0 && c->channels % c->heads == 0 && c->vocab <= c->padded_vocab, "inconsistent header accepted");

  /* the size the header describes, in 128-bit arithmetic, independently of the reader's */
  unsigned __int128 C = c->channels, params = (unsigned __int128)c->padded_vocab * C + (unsigned __int128)c->max_t * C +
                                                (unsigned __int128)c->layers * (13 * C + 12 * C * C) + 2 * C;
  size_t es = c->version == 5 ? 2 : 4;
  FUZZ_CHECK(1024 + params * es == size, "a %zu-byte file accepted for a header describing other sizes", size);

  size_t n = stab_llmc_count(f);
  FUZZ_CHECK(n == 16 * c->layers + 4, "%zu views for %zu layers", n, c->layers);
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *t = stab_llmc_tensor(f, i);
    fuzz_check_tensor(t, data, size);
    FUZZ_CHECK(t->elem_size == es, "'%s': element size %zu in a version %d file", t->name, t->elem_size, c->version);
    size_t at = n;
    FUZZ_CHECK(stab_llmc_find(f, t->name, &at) == STAB_OK && at == i, "find('%s') gave %zu, not %zu", t->name, at, i);
  }
  FUZZ_CHECK(stab_llmc_tensor(f, n) == NULL, "a view past the count");
  FUZZ_CHECK(stab_llmc_find(f, "h.0.attn.qkv.weight", NULL) == STAB_ENOTFOUND, "the fused qkv found: it is split");
  const stab_ckpt_tensor *wte = stab_llmc_tensor(f, 0), *last = stab_llmc_tensor(f, n - 1);
  FUZZ_CHECK(!strcmp(wte->name, "wte") && wte->ndim == 2 && wte->shape[0] == c->vocab && wte->shape[1] == c->channels,
             "the first view is not wte (V, C)");
  FUZZ_CHECK(!strcmp(last->name, "ln_f.bias") && last->offset + last->count * es == size,
             "the last view is not ln_f.bias ending at the end of the file");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_begin(data, size);
  stab_llmc *f = (stab_llmc *)&f; /* must come back NULL on failure */
  stab_status st = stab_llmc_open(path, &f);
  if (st == STAB_OK) {
    check_accepted(f, data, size, path);
    stab_llmc_close(f);
  } else {
    fuzz_check_open_failure(st, path, f == NULL);
  }
  fuzz_end(size);
  return 0;
}
