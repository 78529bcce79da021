/* data.h — token streams for the trainer: a built-in deterministic corpus with structure a
 * small byte-level model can learn, any file as bytes, and llm.c token files.
 * Harness code: failures come back as a status and a message, never printed here. */
#ifndef STAB_HARNESS_DATA_H
#define STAB_HARNESS_DATA_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int32_t *tokens; /* (n) owned */
  size_t n;
  size_t vocab;    /* 256 for bytes; max token + 1 for llm.c files */
  char what[256];  /* a description for the log, e.g. "built-in corpus (524288 bytes)" */
} data_set;

/* The largest file data_load reads, in bytes (1 GiB): it is read whole and held as int32
 * tokens, about 5 times its size in memory. */
#define DATA_MAX_BYTES (UINT64_C(1) << 30)

/* The built-in corpus: about n_bytes of English-like text from a seeded generator (a small
 * grammar with agreement, a fixed table of facts about people and places that recur, and
 * small arithmetic), as bytes. Same seed, same text. 0, or -2 when out of memory. */
int data_builtin(data_set *d, size_t n_bytes, uint64_t seed);

/* A file: a name ending in ".bin" is an llm.c token file (256 int32 header: magic 20240520,
 * version 1 with uint16 tokens or 2 with uint32 tokens, header[2] the token count, then
 * the tokens; the size must match); anything else is read as bytes (vocab 256).
 * Opened by stab_input_open: only a regular file of at most DATA_MAX_BYTES, read whole.
 * Returns 0; 2 for a path that cannot be opened, is not a regular file (a FIFO, /dev/zero, a
 * directory) or is larger than DATA_MAX_BYTES, and for a bad or empty file (the message names
 * the file and the field); 1 when a read fails or memory runs out. err receives the message
 * (errlen bytes). */
int data_load(data_set *d, const char *path, char *err, size_t errlen);

void data_free(data_set *d);

/* Generator of batch positions: splitmix64. */
typedef struct {
  uint64_t s;
} data_rng;

/* B windows of T + 1 tokens at uniform random offsets in [lo, hi - T - 1]: tok (B, T) the
 * first T, tgt (B, T) the next-token targets. Needs hi - lo >= T + 1. */
void data_batch(const data_set *d, data_rng *r, size_t lo, size_t hi, size_t B, size_t T,
                int32_t *tok, int32_t *tgt);

#endif /* STAB_HARNESS_DATA_H */
