/* stabmeter/formats.h — the checkpoint readers, one per format: a safetensors file, a Hugging
 * Face model (one file or sharded) and its config.json, an llm.c GPT-2 checkpoint, a GGUF file.
 * Each maps its file, validates the whole index when it opens it ("Checkpoint readers" in
 * stabmeter/checkpoint.h) and hands out stab_ckpt_tensor views. Beside the safetensors reader,
 * its writer (stab_safetensors_write), which writes only what the reader takes. Part of
 * <stabmeter.h>. */
#ifndef STABMETER_FORMATS_H
#define STABMETER_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* A safetensors file                                                                 */

/* A safetensors file: 8-byte little-endian header length N, N bytes of JSON (an object of
 * name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
 * object of string -> string), then the data section the offsets are relative to. Every
 * string of the header (names, metadata keys and values) must be valid UTF-8 once its escapes
 * are decoded (no raw invalid bytes, no \u escape of a lone surrogate, no \u0000): JSON is
 * text, so a header that is not is malformed. */
typedef struct stab_safetensors stab_safetensors;

/* Maps and validates path. Errors: STAB_EIO (cannot open, stat or map; not a regular file),
 * STAB_EFORMAT (any rule broken), STAB_ENOMEM, STAB_EINVAL (NULL arguments). On failure
 * *out is NULL. */
stab_status stab_safetensors_open(const char *path, stab_safetensors **out);

/* Unmaps and frees. NULL is a no-op. */
void stab_safetensors_close(stab_safetensors *f);

/* Tensors in the order of their data in the file; the pointer is NULL past the end. */
size_t stab_safetensors_count(const stab_safetensors *f);
const stab_ckpt_tensor *stab_safetensors_tensor(const stab_safetensors *f, size_t index);

/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_safetensors_find(const stab_safetensors *f, const char *name, size_t *index);

/* "__metadata__" entries in key order; STAB_ENOTFOUND past the end. */
size_t stab_safetensors_metadata_count(const stab_safetensors *f);
stab_status stab_safetensors_metadata(const stab_safetensors *f, size_t index, const char **key,
                                      const char **value);

/* Bytes of the file (as mapped). */
uint64_t stab_safetensors_file_size(const stab_safetensors *f);

/* One tensor for stab_safetensors_write. */
typedef struct {
  const char *name;   /* UTF-8, non-empty, not "__metadata__", at most 65536 bytes, unique in the file */
  const char *dtype;  /* as the format spells it: "F32", "F16", "BF16", "F64", "I64", "I32", "I16",
                         "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2" */
  size_t ndim;        /* 0 (a scalar) to STAB_CKPT_MAX_DIMS */
  uint64_t shape[STAB_CKPT_MAX_DIMS]; /* row-major, outermost first; the first ndim are used */
  const void *data;   /* product(shape) elements of dtype, in the file's byte order (little-
                         endian: written as they are); read only; may be NULL when empty */
} stab_safetensors_entry;

/* Writes a safetensors file at path: the header {"__metadata__":{...},"name":{"dtype",
 * "shape","data_offsets"},...} without blanks, keys in the order given (the metadata, when
 * n_metadata > 0, first), padded with spaces to a multiple of 8 bytes, then the tensors' data
 * contiguous in the order given (data_offsets follow from it). metadata: n_metadata pairs,
 * metadata[2i] the key and metadata[2i + 1] its value, each UTF-8 (at most 65536 bytes), keys
 * unique. Strings are escaped as JSON needs ('"', '\', control characters).
 * The file is written to "<path>.tmp" and renamed over path: path holds the old file or the
 * whole new one, never a part (the .tmp is removed on failure). Nothing is synced to disk.
 * Whatever stab_safetensors_open would refuse is refused before any file is created: a file
 * written here opens and reads back the same bytes.
 * Errors (the message names path, and the tensor or key): STAB_EINVAL (NULL path, or NULL
 * arrays with counts > 0; a NULL, empty, duplicate or invalid UTF-8 name or metadata key, an
 * unknown dtype, more than STAB_CKPT_MAX_DIMS dimensions, a size overflowing 64 bits, NULL data
 * for a non-empty tensor, a header over 100 MiB), STAB_EIO (cannot create, write or rename the
 * file: the system's reason), STAB_ENOMEM. Thread-safe for distinct paths. */
stab_status stab_safetensors_write(const char *path, const char *const *metadata, size_t n_metadata,
                                   const stab_safetensors_entry *tensors, size_t n_tensors);

/* ---------------------------------------------------------------------------------- */
/* A Hugging Face model: one safetensors file or sharded                              */

/* A Hugging Face model as one checkpoint: a directory holding model.safetensors, or a sharded
 * model (the index model.safetensors.index.json, {"metadata": {"total_size": bytes},
 * "weight_map": {tensor name: shard file name}}, and the shards beside it). Each shard is a
 * safetensors file opened and validated by stab_safetensors_open (headers only: opening reads
 * no tensor data, so a model of many shards opens in the time of their headers). The index is
 * validated too: strict JSON (no key twice), a "weight_map" object of strings, each shard a
 * plain file name of the index's directory (no '/', not "." or "..": a hostile index cannot
 * reach outside the model), every shard opening, each tensor in exactly the shard the index
 * names, no tensor the index does not list, none twice. Symbolic links are followed (the
 * Hugging Face cache's snapshots are links into its blobs); a FIFO, a device or a directory
 * in a shard's place is refused without blocking (see stab_input_open). Messages name the
 * index, the shard and the tensor. */
typedef struct stab_shard_index stab_shard_index;
typedef struct stab_sharded stab_sharded;

/* Reads and validates an index file alone (its JSON and names; no shard is opened).
 * Errors: STAB_EIO (cannot open; not a regular file), STAB_EFORMAT (not JSON, no weight_map
 * object, a value not a string, an unsafe shard name, a tensor twice, an empty map), STAB_ERANGE
 * (larger than 64 MiB), STAB_ENOMEM, STAB_EINVAL. On failure *out is NULL. */
stab_status stab_shard_index_open(const char *path, stab_shard_index **out);
/* NULL is a no-op. */
void stab_shard_index_close(stab_shard_index *ix);
/* The index's tensors in name order, each with the number of its shard (*shard, may be NULL);
 * NULL past the end. */
size_t stab_shard_index_count(const stab_shard_index *ix);
const char *stab_shard_index_tensor(const stab_shard_index *ix, size_t index, size_t *shard);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_shard_index_find(const stab_shard_index *ix, const char *name, size_t *index);
/* The distinct shard file names in name order (model-00001-of-00003.safetensors, ...): the
 * model's order. NULL past the end. */
size_t stab_shard_index_shard_count(const stab_shard_index *ix);
const char *stab_shard_index_shard(const stab_shard_index *ix, size_t shard);
/* metadata.total_size, or STAB_ENOTFOUND when the index has none (or not a whole number). */
stab_status stab_shard_index_total_size(const stab_shard_index *ix, uint64_t *bytes);
/* The path the index was opened by. */
const char *stab_shard_index_path(const stab_shard_index *ix);
/* Something odd but not wrong (a metadata.total_size that is not a number), or NULL. */
const char *stab_shard_index_warning(const stab_shard_index *ix);

/* Finds the index in file's directory (any *.safetensors.index.json) that lists file's name as
 * a shard: STAB_OK with *out (the caller closes it) and *shard (may be NULL) its number;
 * STAB_ENOTFOUND (no error recorded) when no index there lists it; an error of
 * stab_shard_index_open when an index there is malformed. For a caller given one shard of a
 * model: the tensors of the other shards are not in the file, but they are in the model. */
stab_status stab_shard_index_beside(const char *file, stab_shard_index **out, size_t *shard);

/* Opens path: a directory (model.safetensors, else model.safetensors.index.json, else the only
 * *.safetensors.index.json in it; transformers' own order), or an index file. Errors as
 * stab_shard_index_open and stab_safetensors_open, and STAB_EFORMAT for a directory with no
 * weights, a shard missing, unreadable or not safetensors (the message says which), a tensor
 * in no shard, in another shard than the index says, or in two. A metadata.total_size other
 * than the sum of the tensors' bytes does not refuse the model (it says nothing about any
 * tensor, and indexes whose value was written by hand exist): stab_sharded_warning says it. */
stab_status stab_sharded_open(const char *path, stab_sharded **out);
/* Unmaps every shard and frees. NULL is a no-op. */
void stab_sharded_close(stab_sharded *f);
/* The tensors shard by shard, each shard's in the order of its data: the order the same model
 * saved as one file lists them when the shards are consecutive cuts of it. NULL past the end. */
size_t stab_sharded_count(const stab_sharded *f);
const stab_ckpt_tensor *stab_sharded_tensor(const stab_sharded *f, size_t index);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_sharded_find(const stab_sharded *f, const char *name, size_t *index);
/* The shards (1 for a single model.safetensors), their paths, and the shard of tensor index
 * (SIZE_MAX out of range). */
size_t stab_sharded_shard_count(const stab_sharded *f);
const stab_safetensors *stab_sharded_shard(const stab_sharded *f, size_t shard);
const char *stab_sharded_shard_path(const stab_sharded *f, size_t shard);
size_t stab_sharded_shard_of(const stab_sharded *f, size_t index);
/* The model's directory (where config.json is). */
const char *stab_sharded_directory(const stab_sharded *f);
/* The index, or NULL for a directory with a single model.safetensors. */
const stab_shard_index *stab_sharded_index(const stab_sharded *f);
/* The total_size mismatch or the index's warning, or NULL. */
const char *stab_sharded_warning(const stab_sharded *f);
/* The first shard's "__metadata__" (transformers writes the same in every shard). */
size_t stab_sharded_metadata_count(const stab_sharded *f);
stab_status stab_sharded_metadata(const stab_sharded *f, size_t index, const char **key, const char **value);

/* ---------------------------------------------------------------------------------- */
/* A Hugging Face config.json                                                         */

/* The values of a Hugging Face config.json that say how to read the weights; 0 (or "" or -1)
 * where the file has no such key (or null). A key absent at the top level is looked up under
 * "text_config" (multimodal models keep their language model's values there). */
typedef struct {
  size_t num_attention_heads; /* query heads; GPT-2's n_head */
  size_t num_key_value_heads; /* key/value heads (grouped-query attention); 0: as many as query heads */
  size_t head_dim;            /* one head's width, when the config gives it (Gemma's is not hidden/heads) */
  size_t hidden_size;         /* GPT-2's n_embd */
  size_t num_hidden_layers;   /* GPT-2's n_layer */
  size_t vocab_size;
  int tie_word_embeddings;    /* 1 true, 0 false, -1 absent: transformers' default differs by model class */
  char model_type[64];        /* "llama", "gpt2", ... */
  char architecture[128];     /* architectures[0]: "LlamaForCausalLM", ... */
  size_t num_local_experts;   /* Mixtral */
  size_t num_experts;         /* Qwen2-MoE, OLMoE */
  size_t n_routed_experts;    /* DeepSeek-V2/V3 */
  size_t num_experts_per_tok; /* experts routed to per token */
} stab_hf_config;

/* Reads path (a regular file of at most 1 MiB) into *out. Errors (STAB_EFORMAT unless said),
 * each naming the file and the key: not JSON or not an object; a count that is not a whole
 * number (a string "abc", 12.5, -1, 0 for a size; 4.0 and 4e0 are the number 4, as JSON
 * numbers are); two names of one value that disagree
 * (num_attention_heads and n_head); num_key_value_heads not dividing num_attention_heads;
 * tie_word_embeddings not a boolean; model_type not a string; architectures not an array of
 * strings; STAB_EIO, STAB_ERANGE as stab_input_open; STAB_EINVAL for NULL arguments. On
 * failure *out is as for an empty config. Thread-safe. */
stab_status stab_hf_config_read(const char *path, stab_hf_config *out);

/* ---------------------------------------------------------------------------------- */
/* An llm.c GPT-2 checkpoint                                                          */

/* An llm.c GPT-2 checkpoint (train_gpt2.c's write_checkpoint): 256 int32 of header (magic
 * 20240326, version 3 = f32 or 5 = bf16, max_seq_len, vocab_size, num_layers, num_heads,
 * channels, padded_vocab_size), then every parameter in llm.c's order. The reader hands out
 * views named like the HF GPT-2 modules but split: wte (V, C; the padded rows V..Vp-1 left
 * out), wpe (maxT, C), and per block l: h.l.ln_1.{weight,bias}, h.l.attn.{q,k,v}.{weight,bias}
 * (the three (C, C) blocks of the fused qkv), h.l.attn.proj.*, h.l.ln_2.*, h.l.mlp.fc.* (4C, C),
 * h.l.mlp.proj.* (C, 4C); then ln_f.{weight,bias}. Matrices are out-major. The file's size
 * must be exactly the header plus the parameters its shapes describe. */
typedef struct {
  int version;          /* 3 (f32) or 5 (bf16) */
  size_t max_t, vocab, padded_vocab, layers, heads, channels;
} stab_llmc_config;

typedef struct stab_llmc stab_llmc;

/* Errors as stab_safetensors_open. */
stab_status stab_llmc_open(const char *path, stab_llmc **out);
/* NULL is a no-op. */
void stab_llmc_close(stab_llmc *f);
const stab_llmc_config *stab_llmc_config_of(const stab_llmc *f);
/* The views in llm.c's order; NULL past the end. */
size_t stab_llmc_count(const stab_llmc *f);
const stab_ckpt_tensor *stab_llmc_tensor(const stab_llmc *f, size_t index);
/* Index of a view by name, or STAB_ENOTFOUND. */
stab_status stab_llmc_find(const stab_llmc *f, const char *name, size_t *index);
/* 1 when path is a regular file starting with the llm.c magic (a format sniff; no validation,
 * no error recorded; never blocks: see stab_input_open). */
int stab_llmc_is(const char *path);

/* ---------------------------------------------------------------------------------- */
/* A GGUF file                                                                        */

/* A GGUF file (llama.cpp's format, versions 2 and 3, little-endian): "GGUF", uint32
 * version, uint64 tensor count, uint64 metadata count, the metadata key/value pairs, the
 * tensor infos (name, dimensions ne[] with ne[0] the fastest-varying, GGML type, offset),
 * then, at a multiple of general.alignment (default 32), the data section the offsets are
 * relative to. The reader hands tensors out with shape[] outermost first, i.e. reversed
 * from ne[]: a matrix with ne = {d_in, d_out} comes out as shape {d_out, d_in}, out-major.
 * F32, F16 and BF16 tensors convert to f32 (stab_ckpt_read_f32), and so do the quantized
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS
 * (STAB_DTYPE_QUANT, dequantized exactly as ggml does); every other GGML type (Q8_1, Q8_K,
 * the grid-based I-quants IQ1_* IQ2_* IQ3_*, TQ*, MXFP4, integers, F64) is STAB_DTYPE_OTHER.
 * dtype_name is always the GGML type name; block-quantized types have elem_size 0 (their
 * bytes per element are not whole: stab_ckpt_nbytes gives the bytes) and a row (ne[0]) of
 * whole blocks. Tensors come in file order. Every count, string length, array
 * length, dimension, offset and byte range is checked against the file before anything is
 * allocated for it; a malformed file is STAB_EFORMAT with a message naming the file, the
 * field and its byte offset. Duplicate tensor names and duplicate keys are errors, and so are
 * names and keys that are not valid UTF-8 (stab_utf8_decode); string values are kept as the
 * file has them, whatever their bytes. */
typedef struct stab_gguf stab_gguf;

/* Types of metadata values, numbered as in the file. */
typedef enum {
  STAB_GGUF_UINT8 = 0, STAB_GGUF_INT8 = 1, STAB_GGUF_UINT16 = 2, STAB_GGUF_INT16 = 3,
  STAB_GGUF_UINT32 = 4, STAB_GGUF_INT32 = 5, STAB_GGUF_FLOAT32 = 6, STAB_GGUF_BOOL = 7,
  STAB_GGUF_STRING = 8, STAB_GGUF_ARRAY = 9, STAB_GGUF_UINT64 = 10, STAB_GGUF_INT64 = 11,
  STAB_GGUF_FLOAT64 = 12
} stab_gguf_type;

/* One metadata pair. Scalars are decoded; arrays are not (only their element type and
 * length are kept: tokenizer vocabularies are large and the probe needs none of them). */
typedef struct {
  const char *key;          /* NUL-terminated, owned by the reader */
  stab_gguf_type type;
  uint64_t u;               /* unsigned integer types and bool (0 or 1) */
  int64_t i;                /* signed integer types */
  double f;                 /* every numeric type and bool, as a double */
  const char *s;            /* STRING: the bytes, NUL-terminated (a NUL inside ends it early);
                               not necessarily UTF-8 */
  uint64_t len;             /* STRING: bytes in the file; ARRAY: elements */
  stab_gguf_type elem_type; /* ARRAY: the element type */
  uint64_t offset;          /* byte offset of the pair in the file */
} stab_gguf_kv;

/* Maps and validates path. Errors as stab_safetensors_open. On failure *out is NULL. */
stab_status stab_gguf_open(const char *path, stab_gguf **out);
/* Unmaps and frees. NULL is a no-op. */
void stab_gguf_close(stab_gguf *f);
/* The file's version (2 or 3) and data alignment in bytes. */
uint32_t stab_gguf_version(const stab_gguf *f);
uint64_t stab_gguf_alignment(const stab_gguf *f);
/* Tensors in file order; NULL past the end. */
size_t stab_gguf_count(const stab_gguf *f);
const stab_ckpt_tensor *stab_gguf_tensor(const stab_gguf *f, size_t index);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_gguf_find(const stab_gguf *f, const char *name, size_t *index);
/* Metadata pairs in file order; NULL past the end. */
size_t stab_gguf_metadata_count(const stab_gguf *f);
const stab_gguf_kv *stab_gguf_metadata(const stab_gguf *f, size_t index);
/* The pair with this key, or NULL. */
const stab_gguf_kv *stab_gguf_find_metadata(const stab_gguf *f, const char *key);
/* The value of key as a non-negative integer (any integer type). STAB_ENOTFOUND if absent
 * (last error untouched), STAB_EINVAL if it is not an integer or is negative. */
stab_status stab_gguf_get_uint(const stab_gguf *f, const char *key, uint64_t *out);
/* The GGML name of a tensor type ("F32", "Q4_K", ...); NULL for a number it does not know. */
const char *stab_gguf_type_name(uint32_t ggml_type);
/* The name of a metadata value type ("uint32", "string", ...); NULL if unknown. */
const char *stab_gguf_value_type_name(stab_gguf_type type);
/* 1 when path is a regular file starting with the GGUF magic (a format sniff; no validation,
 * no error recorded; never blocks: see stab_input_open). */
int stab_gguf_is(const char *path);

/* ---------------------------------------------------------------------------------- */
/* The reader behind a checkpoint handle                                              */

/* For the metadata of a checkpoint opened with stab_checkpoint_open (stabmeter/checkpoint.h):
 * its safetensors file (a Hugging Face model of several: its first shard, whose __metadata__
 * transformers writes in every shard), its GGUF file (a split model: its first shard, which
 * holds the model's metadata) or its llm.c checkpoint; NULL when the checkpoint is of another
 * format, or c is NULL. Owned by c. */
const stab_safetensors *stab_checkpoint_safetensors(const stab_checkpoint *c);
const stab_gguf *stab_checkpoint_gguf(const stab_checkpoint *c);
const stab_llmc *stab_checkpoint_llmc(const stab_checkpoint *c);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_FORMATS_H */
