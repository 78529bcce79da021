/* stabmeter/checkpoint.h — a checkpoint's tensors as every reader hands them out
 * (stab_ckpt_tensor: a view into a read-only mapping, read as f32 whatever its stored type) and
 * what a file is before any reader parses it (stab_ckpt_sniff), and a checkpoint of any format
 * behind one handle (stab_checkpoint: open any path the probe takes, list, find and read its
 * tensors) — the entry point for a caller that reads weights. The reader of each format is in
 * stabmeter/formats.h; a caller that wants the metrics of every layer opens the checkpoint
 * through the probe (stabmeter/probe.h). Part of <stabmeter.h>. */
#ifndef STABMETER_CHECKPOINT_H
#define STABMETER_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"
#include "files.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Checkpoint readers                                                                  */
/*
 * A reader memory-maps a checkpoint read-only, validates its whole index up front (every
 * rule of the format: offsets inside the data and covering it without overlap or holes,
 * shapes agreeing with the byte ranges, known dtypes, unique names) and then hands out
 * tensors as views into the mapping. Nothing is read from the data until asked for, and
 * no allocation is larger than a small multiple of the file's index, so a hostile file
 * cannot make the reader allocate without bound. A malformed file gives STAB_EFORMAT
 * with a message naming the file and the field or byte offset at fault.
 * A reader is read-only after open: any number of threads may use it at once.
 *
 * The input guard: a file that shrinks under its mapping (truncated, or rewritten in place, by
 * another process) is an error, never a signal. The first time the library maps a file it
 * installs a SIGBUS handler (sigaction, SA_SIGINFO); a read of a mapping of the library's
 * past the file's new end, in any thread, reads a page of zeros, and the mapping is marked:
 * the reader's open, stab_ckpt_read_f32, stab_layer_metrics and the monitor on weights in it,
 * and stab_probe_measure then return STAB_EIO naming the file ("the file shrank while being
 * read"), and every later read of that mapping does too. A SIGBUS at any other address goes to
 * the handler installed before the library's (called as it was installed), else takes the
 * default action. A program that installs a SIGBUS handler of its own after opening a
 * checkpoint should call the one it replaces for addresses it does not know. Bytes a caller
 * reads itself from stab_ckpt_tensor.data after a shrink read as zeros; the library's next
 * read of that tensor reports it.
 */

/* stab_dtype (the element types of stored weights) is defined with the layers, in
 * stabmeter/layer.h. */

/* Dimensions a tensor may have; a file with more is rejected (STAB_EFORMAT). */
#define STAB_CKPT_MAX_DIMS 8

/* One tensor of a checkpoint: a view into the reader's mapping, valid until it is closed. */
typedef struct {
  const char *name;          /* NUL-terminated; owned by the reader */
  const char *dtype_name;    /* as the file spells it: "F32", "BF16", "I64", ... */
  stab_dtype dtype;
  size_t elem_size;          /* bytes per element; 0 for GGUF's block-quantized types */
  size_t ndim;               /* 0 for a scalar */
  uint64_t shape[STAB_CKPT_MAX_DIMS]; /* row-major, outermost first */
  uint64_t count;            /* elements: the product of shape (1 for a scalar) */
  const unsigned char *data; /* count * elem_size bytes, little-endian, no alignment promised */
  uint64_t offset;           /* byte offset of data from the start of the file */
} stab_ckpt_tensor;

/* Elements [first, first + n) of t (flat, row-major) as f32, into out (n floats). F16 and
 * BF16 convert exactly (subnormals, infinities and NaNs included); F32 is copied;
 * STAB_DTYPE_QUANT dequantizes exactly as ggml does (the same f32 values, bit for bit),
 * decoding each block the range touches, so a range may start and end anywhere.
 * Errors: NULL pointers STAB_EINVAL; a range outside the tensor STAB_ERANGE; dtype
 * STAB_DTYPE_OTHER STAB_EINVAL; a STAB_DTYPE_QUANT tensor whose count is not whole blocks
 * STAB_EFORMAT; the file holding t shrank under its mapping STAB_EIO naming the tensor and the
 * file (the input guard, above; out then holds zeros where the file has gone). */
stab_status stab_ckpt_read_f32(const stab_ckpt_tensor *t, uint64_t first, size_t n, float *out);

/* Bytes of data t spans: count * elem_size, or for a block-quantized GGUF type (elem_size 0)
 * its blocks times the bytes per block; 0 for a NULL or empty tensor, or a block type this
 * library does not know. */
uint64_t stab_ckpt_nbytes(const stab_ckpt_tensor *t);

/* Hands the mapped pages that lie wholly inside t back to the kernel (madvise
 * MADV_DONTNEED): the process's resident memory drops by them, t stays valid, and a later
 * read maps them again from the page cache. For a caller that reads a checkpoint tensor by
 * tensor and wants its peak memory near the largest tensor rather than the file. NULL or
 * an empty tensor is a no-op. */
void stab_ckpt_release(const stab_ckpt_tensor *t);

/* Maps the pages of t in one go (madvise MADV_POPULATE_READ; MADV_WILLNEED on kernels before
 * 5.14), so that reading t then takes no page fault per page. Best effort: NULL, an empty
 * tensor or a failure changes nothing but speed. A file that shrank since it was opened
 * is reported by the library's next read (the input guard, above), not here. */
void stab_ckpt_prefetch(const stab_ckpt_tensor *t);

/* The exact f32 value of one IEEE binary16 / bfloat16 (bit patterns as stored). */
float stab_f16_to_f32(uint16_t h);
float stab_bf16_to_f32(uint16_t b);

/* ---------------------------------------------------------------------------------- */
/* What a file is                                                                      */
/*
 * A checkpoint given to a reader that is not of its format gets a message about that format
 * ("header length 7022349238375811707 ... is larger than the file"), which tells the user
 * nothing. stab_ckpt_sniff says what the file is from its first bytes and its size, before
 * any reader parses it: it never decompresses, never unpickles, never follows an offset, and
 * reads at most STAB_SNIFF_BYTES bytes from the start of the file.
 */

/* The most bytes stab_ckpt_sniff reads, all from offset 0. */
#define STAB_SNIFF_BYTES 8192

typedef enum {
  STAB_FILE_UNKNOWN = 0,     /* binary, none of the below */
  STAB_FILE_EMPTY,           /* 0 bytes */
  STAB_FILE_SAFETENSORS,     /* an 8-byte little-endian header length below 2^32, then '{' */
  STAB_FILE_GGUF,            /* "GGUF" */
  STAB_FILE_LLMC,            /* an llm.c GPT-2 checkpoint: int32 magic 20240326 */
  STAB_FILE_LLMC_OTHER,      /* another llm.c file: tokenizer (20240328), token shard
                                (20240520), debug state (20240327) */
  STAB_FILE_PYTORCH_ZIP,     /* torch.save's zip: an entry data.pkl or DIR/data.pkl among those in
                                the bytes read */
  STAB_FILE_PYTORCH_LEGACY,  /* torch.save's format before 1.6: a pickled magic number */
  STAB_FILE_PICKLE,          /* any other pickle of protocol 2 to 5 */
  STAB_FILE_NPY,             /* "\x93NUMPY" */
  STAB_FILE_NPZ,             /* a zip whose entries in the bytes read all end in .npy */
  STAB_FILE_ZIP,             /* any other zip archive */
  STAB_FILE_ONNX,            /* named *.onnx and starting with ModelProto's ir_version field */
  STAB_FILE_GGML,            /* llama.cpp's formats before GGUF: GGML, GGMF, GGJT, GGLA, GGSN */
  STAB_FILE_HDF5,            /* the HDF5 signature, not a stabmeter trace as far as it shows */
  STAB_FILE_TRACE,           /* HDF5 holding the string "stabmeter-trace" in its first bytes */
  STAB_FILE_GZIP,
  STAB_FILE_ZSTD,
  STAB_FILE_XZ,
  STAB_FILE_BZIP2,
  STAB_FILE_LFS_POINTER,     /* a Git LFS pointer: text naming the real file by its hash */
  STAB_FILE_SHARD_INDEX,     /* a sharded checkpoint's JSON index (with "weight_map") */
  STAB_FILE_TEXT,            /* valid UTF-8 without NUL bytes (as far as it was read) */
  STAB_FILE_KIND_COUNT       /* the number of kinds, not a kind */
} stab_file_kind;

/* Says what the file at path is, opened through stab_input_open.
 *  path  a regular file (a FIFO or device is refused without blocking)
 *  kind  receives the kind; STAB_FILE_UNKNOWN on an I/O error
 * Returns STAB_OK for the kinds the library reads (SAFETENSORS, GGUF, LLMC), which are
 * then for the reader to validate. For every other kind, STAB_EFORMAT with a one-line message
 * (stab_last_error) naming the path, what the file is and what to do with it (convert a
 * PyTorch checkpoint to safetensors, read a trace with stabmeter-export, decompress a
 * compressed file, ...); an unknown binary file's message gives its first bytes in hex.
 * Errors: NULL path or kind STAB_EINVAL; a path that cannot be opened, is not a regular file or
 * cannot be read, STAB_EIO (the message of stab_input_open). Thread-safe. */
stab_status stab_ckpt_sniff(const char *path, stab_file_kind *kind);

/* What a kind is, as a noun phrase for a message ("a PyTorch checkpoint (zip)"); "?" for a
 * value outside the enum. Static storage. */
const char *stab_file_kind_name(stab_file_kind kind);


/* ---------------------------------------------------------------------------------- */
/* A checkpoint of any format                                                          */
/*
 * One handle over every format the library reads, the recommended way to read a checkpoint's
 * weights: the format is decided from the path (a folder, an index, the file's first bytes)
 * in one place, the right reader opens it, and the tensors are then listed, found and read
 * alike. Behind the handle are the readers of stabmeter/formats.h, with their validation,
 * their limits and their messages ("Checkpoint readers", above); a model in several files is
 * one checkpoint whose tensors are those of all its files. The handle is read-only after
 * open: any number of threads may use it at once. Its tensors are views into its readers'
 * mappings, valid until stab_checkpoint_close.
 */
typedef struct stab_checkpoint stab_checkpoint;

/* Opens the checkpoint at path, whatever its format:
 *  - a folder: a Hugging Face model (model.safetensors, else its index, every shard; see
 *    stab_sharded_open), or the one split GGUF model in it (PREFIX-0000k-of-0000N.gguf, every
 *    shard);
 *  - a sharded model's index (NAME.index.json, or any file whose bytes are one): every shard;
 *  - a file, by its first bytes (stab_ckpt_sniff): safetensors, GGUF or an llm.c GPT-2
 *    checkpoint. A GGUF file that is one shard of a split model (metadata split.count > 1)
 *    opens every shard of it; its metadata is the first shard's. A binary file of no format
 *    the sniff knows, named *.gguf or *.safetensors, is given to that format's reader, whose
 *    message then names the field at fault.
 * On success *out is the handle (stab_checkpoint_close frees it), else NULL.
 * Errors: NULL path or out STAB_EINVAL, an empty path STAB_EINVAL; a file of another kind (a
 * PyTorch checkpoint, a trace, text, a compressed file, ...) STAB_EFORMAT with the sniff's
 * message naming what it is and what to do; a path that cannot be opened or read STAB_EIO;
 * a malformed file or model, one of its readers' errors (STAB_EFORMAT, STAB_ERANGE, STAB_EIO,
 * ...); a shard of a split GGUF model missing STAB_ENOTFOUND naming it; a folder holding two
 * split GGUF models STAB_EINVAL; STAB_ENOMEM. Thread-safe. */
stab_status stab_checkpoint_open(const char *path, stab_checkpoint **out);

/* Unmaps every file and frees. NULL is a no-op. */
void stab_checkpoint_close(stab_checkpoint *c);

/* The format of the tensors: STAB_FILE_SAFETENSORS (one file, or a Hugging Face model of
 * several), STAB_FILE_GGUF (one file, or a split model) or STAB_FILE_LLMC; STAB_FILE_UNKNOWN
 * for NULL. Its own metadata is read through its reader (stab_checkpoint_safetensors, ...,
 * in stabmeter/formats.h). */
stab_file_kind stab_checkpoint_format(const stab_checkpoint *c);

/* What opening found that the caller should tell the user, as one line starting "note: " or
 * "warning: " (a shard of a split GGUF model read as the whole model; a sharded model's index
 * whose total_size disagrees with its tensors, stab_sharded_warning), or NULL. Owned by c. */
const char *stab_checkpoint_note(const stab_checkpoint *c);

/* The tensors: for one file, in its reader's order; for a model in several files, file by
 * file. The pointer is NULL past the end (and for a NULL handle, whose count is 0). */
size_t stab_checkpoint_count(const stab_checkpoint *c);
const stab_ckpt_tensor *stab_checkpoint_tensor(const stab_checkpoint *c, size_t index);

/* Index of the tensor of exactly that name into *index, or STAB_ENOTFOUND. NULL arguments
 * STAB_EINVAL. */
stab_status stab_checkpoint_find(const stab_checkpoint *c, const char *name, size_t *index);

/* Elements [first, first + n) of tensor index (flat, row-major: a row of a 2-D tensor is
 * shape[1] elements, so rows r0 .. r1 are first = r0 * shape[1], n = (r1 - r0) * shape[1]) as
 * f32 into out, exactly as stab_ckpt_read_f32 reads them (its conversions, its errors, the
 * input guard). Errors: NULL c or out STAB_EINVAL; index past the end STAB_ERANGE; else those
 * of stab_ckpt_read_f32. */
stab_status stab_checkpoint_read_f32(const stab_checkpoint *c, size_t index, uint64_t first, size_t n, float *out);

/* The files the checkpoint spans: 1 for one file, a model's shards in their order (for a
 * Hugging Face model, its index's; for a split GGUF model, PREFIX-00001 first); their paths
 * (the path as given for one file, NULL past the end), and the file tensor index lies in
 * (SIZE_MAX past the end). */
size_t stab_checkpoint_file_count(const stab_checkpoint *c);
const char *stab_checkpoint_file_path(const stab_checkpoint *c, size_t file);
size_t stab_checkpoint_file_of(const stab_checkpoint *c, size_t index);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_CHECKPOINT_H */
