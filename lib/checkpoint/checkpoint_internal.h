/* checkpoint_internal.h — what the checkpoint readers (lib/checkpoint/) share beyond the public
 * header: the tensors' order by name, a split GGUF model's shards, the decoders of GGUF's
 * block-quantized types; and what the probe asks of a checkpoint handle beyond the public
 * stab_checkpoint_* (where a tensor's bytes lie among its files). Never installed. */
#ifndef STABMETER_CHECKPOINT_INTERNAL_H
#define STABMETER_CHECKPOINT_INTERNAL_H

#include "engine/engine.h"

#include <string.h>

/* ---- safetensors (safetensors.c, for safetensors_write.c) ---- */

/* Bytes per element of the safetensors dtype spelled name ("F32", "BF16", ...), or 0 when the
 * format has no such dtype: the writer refuses what the reader would. */
size_t stabi_safetensors_dtype_size(const char *name);

/* ---- the tensors by name (safetensors.c, gguf.c) ---- */

/* A tensor's name and its index in the file, sorted by name (stabi_cmp_name_ref, for qsort) to
 * find tensors by name and to catch a name given twice. */
typedef struct {
  const char *name;
  size_t index;
} stabi_name_ref;
static inline int stabi_cmp_name_ref(const void *a, const void *b) {
  return strcmp(((const stabi_name_ref *)a)->name, ((const stabi_name_ref *)b)->name);
}

/* ---- a split GGUF model (gguf_split.c) ---- */

/* The bytes of a GGUF file as mapped (0 for NULL). */
uint64_t stabi_gguf_file_size(const stab_gguf *g);

/* llama.cpp's gguf-split files, every shard of one model: PREFIX-0000k-of-0000N.gguf. */
typedef struct stabi_gguf_split stabi_gguf_split;
/* g's place in a split model: metadata split.no (0-based) into *no and split.count into *count;
 * a file without them is shard 0 of 1. Inconsistent values are STAB_EFORMAT naming path. */
stab_status stabi_gguf_split_info(const stab_gguf *g, const char *path, size_t *no, size_t *count);
/* Every shard of the split model whose shard `first` (opened from path, split.count > 1) is: the
 * siblings by name, each checked (its split.no and split.count, split.tensors.count the same in
 * all and equal to the tensors they hold, no tensor twice). On success *out owns first; on
 * failure first is still the caller's. A missing shard is STAB_ENOTFOUND naming it. */
stab_status stabi_gguf_split_open(const char *path, stab_gguf *first, stabi_gguf_split **out);
/* The first shard (PREFIX-00001-of-NNNNN.gguf) of the one split model in dir, malloc'ed into
 * *first; STAB_ENOTFOUND (no error recorded) when dir holds none, or holds safetensors; two
 * models there are STAB_EINVAL. */
stab_status stabi_gguf_split_first_in(const char *dir, char **first);
void stabi_gguf_split_close(stabi_gguf_split *s);
size_t stabi_gguf_split_count(const stabi_gguf_split *s);
const stab_ckpt_tensor *stabi_gguf_split_tensor(const stabi_gguf_split *s, size_t i);
stab_status stabi_gguf_split_find(const stabi_gguf_split *s, const char *name, size_t *index);
size_t stabi_gguf_split_shard_count(const stabi_gguf_split *s);
const stab_gguf *stabi_gguf_split_shard(const stabi_gguf_split *s, size_t k);
const char *stabi_gguf_split_shard_path(const stabi_gguf_split *s, size_t k);
size_t stabi_gguf_split_shard_of(const stabi_gguf_split *s, size_t i);
/* Shard k's first byte in the model as one sequence of bytes (the earlier shards' sizes). */
uint64_t stabi_gguf_split_base(const stabi_gguf_split *s, size_t k);

/* ---- a checkpoint handle: its files (checkpoint.c) ---- */

/* A sharded safetensors model's folder (where its config.json is; stab_sharded_directory), or
 * NULL for a checkpoint of one file or a split GGUF model. */
const char *stabi_checkpoint_directory(const stab_checkpoint *c);
/* The file t's bytes are in and their offset there (found by address, a tensor's mapping being
 * its file's: a view into a 3-D experts tensor too); t's own offset and the path as given when
 * no file's mapping holds it. */
const char *stabi_checkpoint_file_at(const stab_checkpoint *c, const stab_ckpt_tensor *t, uint64_t *offset);
/* Where t's bytes sit in the checkpoint as one sequence of bytes: its offset in its file, after
 * the earlier files' bytes for a model of several (their offsets restart in every file). */
uint64_t stabi_checkpoint_place(const stab_checkpoint *c, const stab_ckpt_tensor *t);
/* The mapped bytes [*lo, *lo + *len) the tensors of file k span: 1, or 0 when they span none
 * (no tensor with data, or only block types this library does not know). */
int stabi_checkpoint_file_span(const stab_checkpoint *c, size_t k, const void **lo, size_t *len);

/* ---- GGUF block-quantized tensors (gguf_dequant.c) ---- */

/* One ggml block layout: its GGML name, elements and bytes per block, and the decoder that
 * writes a block's `block` elements as f32, exactly as ggml's dequantize_row does. */
typedef struct {
  const char *name;
  uint32_t block, bytes;
  void (*decode)(const unsigned char *blk, float *out);
} stabi_quant_type;

/* The layout named dtype_name ("Q4_K", ...), or NULL when it is not one decoded here. */
const stabi_quant_type *stabi_quant_find(const char *dtype_name);
/* Elements [first, first + n) of t, stored as q (the range already checked against t->count),
 * into out: decodes each block the range touches. STAB_EFORMAT when t->count is not whole
 * blocks. */
stab_status stabi_dequant(const stab_ckpt_tensor *t, const stabi_quant_type *q, uint64_t first, size_t n,
                          float *out);

#endif /* STABMETER_CHECKPOINT_INTERNAL_H */
