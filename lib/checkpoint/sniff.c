/* sniff.c — what a file is, from its first bytes and its size, before a reader parses it:
 * so that a PyTorch checkpoint, a trace or a text file given to the probe is named as what it
 * is, with what to do about it, instead of failing a reader's check of a format it never had.
 * Nothing here decompresses, unpickles or follows an offset: every test looks at bytes already
 * read from offset 0, and only as far as the read went. */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* llm.c's magic numbers (int32, little-endian): train_gpt2.c's checkpoint, test_gpt2.c's debug
 * state, the tokenizer file and the token shards of its data loader. */
#define LLMC_MODEL_MAGIC 20240326u
#define LLMC_STATE_MAGIC 20240327u
#define LLMC_TOKENIZER_MAGIC 20240328u
#define LLMC_TOKENS_MAGIC 20240520u

/* The bytes read: head[0..n) of a file of size bytes. */
typedef struct {
  const unsigned char *b;
  size_t n;
  uint64_t size;
} head;

static int starts(const head *h, const void *magic, size_t len) { return h->n >= len && !memcmp(h->b, magic, len); }

static int has_u32le(const head *h, size_t at, uint32_t *v) {
  if (h->n < at + 4) return 0;
  *v = (uint32_t)h->b[at] | (uint32_t)h->b[at + 1] << 8 | (uint32_t)h->b[at + 2] << 16 | (uint32_t)h->b[at + 3] << 24;
  return 1;
}

static int ends_with(const char *s, size_t len, const char *suffix) {
  size_t k = strlen(suffix);
  return len >= k && !memcmp(s + len - k, suffix, k);
}

static int contains(const head *h, const char *needle) {
  size_t k = strlen(needle);
  for (size_t i = 0; k <= h->n && i <= h->n - k; i++)
    if (!memcmp(h->b + i, needle, k)) return 1;
  return 0;
}

/* A ZIP file's entries as their local headers give them (PK\3\4; name_len at byte 26,
 * extra_len at 28, the compressed size at 18, the name at 30), walked while they lie in the
 * bytes read and their sizes are in the header (bit 3 of the flags unset). torch.save writes
 * "ARCHIVE/data.pkl" (ARCHIVE the file's stem, or "archive") among its first entries;
 * numpy.savez writes NAME.npy entries only. */
static stab_file_kind zip_kind(const head *h) {
  size_t at = 0, npy = 0, other = 0;
  while (at + 30 <= h->n && !memcmp(h->b + at, "PK\3\4", 4)) {
    const unsigned char *e = h->b + at;
    const size_t len = (size_t)e[26] | (size_t)e[27] << 8, extra = (size_t)e[28] | (size_t)e[29] << 8;
    const uint64_t data = (uint64_t)e[18] | (uint64_t)e[19] << 8 | (uint64_t)e[20] << 16 | (uint64_t)e[21] << 24;
    if (len == 0 || len > h->n - at - 30) break;
    const char *name = (const char *)e + 30;
    if ((len == 8 && !memcmp(name, "data.pkl", 8)) || ends_with(name, len, "/data.pkl")) return STAB_FILE_PYTORCH_ZIP;
    if (ends_with(name, len, ".npy")) npy++;
    else other++;
    if (e[6] & 8) break; /* sizes in a descriptor after the data: the next entry's place is unknown */
    const uint64_t next = (uint64_t)at + 30 + len + extra + data;
    if (next > h->n) break;
    at = (size_t)next;
  }
  return npy && !other ? STAB_FILE_NPZ : STAB_FILE_ZIP;
}

/* A pickle of protocol 2 or later starts with PROTO (0x80) and its version. torch.save's legacy
 * format pickles its magic number 0x1950a86a20f9469cfc6c first: LONG1 (0x8a), 10 bytes,
 * little-endian. Protocols 0 and 1 have no opening mark to know them by. */
static stab_file_kind pickle_kind(const head *h) {
  static const unsigned char torch_legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                               0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  if (h->n < 2 || h->b[0] != 0x80 || h->b[1] < 2 || h->b[1] > 5) return STAB_FILE_UNKNOWN;
  return starts(h, torch_legacy, sizeof torch_legacy) ? STAB_FILE_PYTORCH_LEGACY : STAB_FILE_PICKLE;
}

/* The HDF5 signature sits at 0, or after a user block at 512, 1024, 2048, ... bytes. A trace's
 * root attribute format = "stabmeter-trace" is a variable-length string kept in the global heap
 * the writer creates with the file, in its first few kilobytes: finding the string there is a
 * strong sign, not a proof (reading the attribute would take an HDF5 parse of a hostile file). */
static stab_file_kind hdf5_kind(const head *h) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  for (size_t at = 0; at + sizeof sig <= h->n; at = at ? 2 * at : 512)
    if (!memcmp(h->b + at, sig, sizeof sig)) return contains(h, "stabmeter-trace") ? STAB_FILE_TRACE : STAB_FILE_HDF5;
  return STAB_FILE_UNKNOWN;
}

/* llama.cpp's formats before GGUF, their uint32 magics as they lie on disk (little-endian). */
static int is_ggml_legacy(const head *h) {
  static const char *const magic[] = {"lmgg", "fmgg", "tjgg", "algg", "nsgg"};
  for (size_t i = 0; i < sizeof magic / sizeof *magic; i++)
    if (starts(h, magic[i], 4)) return 1;
  return 0;
}

/* An ONNX file is a protobuf ModelProto, which has no magic; its writers put field 1
 * (ir_version, a varint: tag byte 0x08) first, and the versions so far are below 128. So the
 * name must say .onnx too, and the message says "looks like". */
static int looks_onnx(const head *h, const char *path) {
  return ends_with(path, strlen(path), ".onnx") && h->n >= 2 && h->b[0] == 0x08 && h->b[1] >= 1 && h->b[1] < 0x80;
}

/* Safetensors: a u64 header length, then the header, which must start with '{'. A length of
 * 2^32 or more is no real header (the reference reader caps it at 100 MB): that is a text
 * file's first eight characters, which happen to precede a '{'. A length past the file's end
 * still counts: the reader then says the file is truncated. */
static int is_safetensors(const head *h) {
  uint32_t lo, hi;
  return h->n >= 9 && h->b[8] == '{' && has_u32le(h, 0, &lo) && has_u32le(h, 4, &hi) && hi == 0 && lo >= 2;
}

/* Text: valid UTF-8 without control characters other than whitespace and ESC (a log's
 * colours) in the bytes read; a sequence cut by the end of the read (the file goes on) does not
 * count against it. */
static int is_text(const head *h) {
  for (size_t i = 0; i < h->n; i++)
    if (h->b[i] == 0 || (h->b[i] < 0x20 && !strchr("\t\n\v\f\r\033", h->b[i])) || h->b[i] == 0x7f) return 0;
  size_t bad = stabi_utf8_invalid_at((const char *)h->b, h->n);
  if (bad == (size_t)-1) return 1;
  if (h->size <= h->n) return 0; /* the whole file was read: nothing was cut */
  /* cut: a lead byte announcing more bytes than are left, followed by continuation bytes only */
  const unsigned lead = h->b[bad];
  const size_t len = (lead & 0xe0) == 0xc0 ? 2 : (lead & 0xf0) == 0xe0 ? 3 : (lead & 0xf8) == 0xf0 ? 4 : 0;
  if (len == 0 || bad + len <= h->n) return 0;
  for (size_t i = bad + 1; i < h->n; i++)
    if ((h->b[i] & 0xc0) != 0x80) return 0;
  return 1;
}

static stab_file_kind text_kind(const head *h) {
  if (starts(h, "version https://git-lfs.github.com/spec/", 40)) return STAB_FILE_LFS_POINTER;
  size_t i = 0;
  while (i < h->n && strchr(" \t\r\n", h->b[i])) i++;
  if (i < h->n && h->b[i] == '{' && contains(h, "\"weight_map\"")) return STAB_FILE_SHARD_INDEX;
  return STAB_FILE_TEXT;
}

static stab_file_kind kind_of(const head *h, const char *path) {
  uint32_t magic;
  stab_file_kind k;
  if (h->size == 0 || h->n == 0) return STAB_FILE_EMPTY;
  /* first: a header length is any 8 bytes below 2^32 (its low byte may be a pickle's 0x80, its
   * low bytes "GG"), and no magic below has four zero bytes then '{' at bytes 4-8 */
  if (is_safetensors(h)) return STAB_FILE_SAFETENSORS;
  if (starts(h, "GGUF", 4)) return STAB_FILE_GGUF;
  if (has_u32le(h, 0, &magic)) {
    if (magic == LLMC_MODEL_MAGIC) return STAB_FILE_LLMC;
    if (magic == LLMC_STATE_MAGIC || magic == LLMC_TOKENIZER_MAGIC || magic == LLMC_TOKENS_MAGIC)
      return STAB_FILE_LLMC_OTHER;
  }
  if ((k = hdf5_kind(h)) != STAB_FILE_UNKNOWN) return k;
  if (starts(h, "PK\3\4", 4)) return zip_kind(h);
  if (starts(h, "PK\5\6", 4)) return STAB_FILE_ZIP; /* an empty archive: its end record only */
  if ((k = pickle_kind(h)) != STAB_FILE_UNKNOWN) return k;
  if (starts(h, "\x93NUMPY", 6)) return STAB_FILE_NPY;
  if (is_ggml_legacy(h)) return STAB_FILE_GGML;
  if (starts(h, "\x1f\x8b", 2)) return STAB_FILE_GZIP;
  if (starts(h, "\x28\xb5\x2f\xfd", 4)) return STAB_FILE_ZSTD;
  if (starts(h, "\xfd" "7zXZ\0", 6)) return STAB_FILE_XZ;
  if (starts(h, "BZh", 3) && h->n >= 4 && h->b[3] >= '1' && h->b[3] <= '9') return STAB_FILE_BZIP2;
  if (looks_onnx(h, path)) return STAB_FILE_ONNX;
  if (is_text(h)) return text_kind(h);
  return STAB_FILE_UNKNOWN;
}

const char *stab_file_kind_name(stab_file_kind kind) {
  switch (kind) {
  case STAB_FILE_UNKNOWN: return "a binary file of no format stabmeter knows";
  case STAB_FILE_EMPTY: return "an empty file (0 bytes)";
  case STAB_FILE_SAFETENSORS: return "a safetensors checkpoint";
  case STAB_FILE_GGUF: return "a GGUF checkpoint";
  case STAB_FILE_LLMC: return "an llm.c GPT-2 checkpoint";
  case STAB_FILE_LLMC_OTHER: return "an llm.c file that is not a checkpoint (tokenizer, token shard or debug state)";
  case STAB_FILE_PYTORCH_ZIP: return "a PyTorch checkpoint (zip, torch.save)";
  case STAB_FILE_PYTORCH_LEGACY: return "a PyTorch checkpoint (legacy pickle format, torch.save before 1.6)";
  case STAB_FILE_PICKLE: return "a Python pickle";
  case STAB_FILE_NPY: return "a numpy array (.npy)";
  case STAB_FILE_NPZ: return "a numpy archive (.npz)";
  case STAB_FILE_ZIP: return "a zip archive";
  case STAB_FILE_ONNX: return "what looks like an ONNX model";
  case STAB_FILE_GGML: return "a legacy llama.cpp file (GGML/GGMF/GGJT, before GGUF)";
  case STAB_FILE_HDF5: return "an HDF5 file";
  case STAB_FILE_TRACE: return "a stabmeter trace (HDF5)";
  case STAB_FILE_GZIP: return "a gzip-compressed file";
  case STAB_FILE_ZSTD: return "a zstd-compressed file";
  case STAB_FILE_XZ: return "an xz-compressed file";
  case STAB_FILE_BZIP2: return "a bzip2-compressed file";
  case STAB_FILE_LFS_POINTER: return "a Git LFS pointer (the file's hash, not its content)";
  case STAB_FILE_SHARD_INDEX: return "the index of a sharded checkpoint";
  case STAB_FILE_TEXT: return "a text file";
  case STAB_FILE_KIND_COUNT: break;
  }
  return "?";
}

/* Words the refusal of a kind no reader reads: what to do, in one line (the path is p). */
static stab_status refuse(const char *p, stab_file_kind kind, const head *h) {
  const char *what = stab_file_kind_name(kind);
  switch (kind) {
  case STAB_FILE_PYTORCH_ZIP:
  case STAB_FILE_PYTORCH_LEGACY:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, which stabmeter does not read (it never unpickles): convert it to safetensors, "
                      "e.g. python3 -c 'import torch, safetensors.torch as s; "
                      "s.save_file(torch.load(\"%s\", weights_only=True), \"%s.safetensors\")'",
                      p, what, p, p);
  case STAB_FILE_PICKLE:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, which stabmeter does not read (it never unpickles): save the weights as "
                      "safetensors with the program that wrote it",
                      p, what);
  case STAB_FILE_NPY:
  case STAB_FILE_NPZ:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, not a checkpoint stabmeter reads: save the named weight matrices as "
                      "safetensors (safetensors.numpy.save_file)",
                      p, what);
  case STAB_FILE_ZIP:
    return stabi_fail(STAB_EFORMAT, "%s: %s that is not a PyTorch checkpoint: unpack it and probe the checkpoint inside", p, what);
  case STAB_FILE_ONNX:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, which stabmeter does not read: export the model's weights as safetensors "
                      "from the framework that made it",
                      p, what);
  case STAB_FILE_GGML:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, which stabmeter does not read: convert it to GGUF with llama.cpp's "
                      "convert_llama_ggml_to_gguf.py, or probe the safetensors it came from",
                      p, what);
  case STAB_FILE_HDF5:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, not a checkpoint; if it is a stabmeter trace, read it with stabmeter-export or h5py", p, what);
  case STAB_FILE_TRACE:
    return stabi_fail(STAB_EFORMAT,
                      "%s: %s, not a checkpoint: read it with stabmeter-export (CSV, JSON lines) or h5py; "
                      "to add a probe to it, give it to --hdf5", p, what);
  case STAB_FILE_GZIP:
  case STAB_FILE_ZSTD:
  case STAB_FILE_XZ:
  case STAB_FILE_BZIP2:
    return stabi_fail(STAB_EFORMAT, "%s: %s: decompress it first (stabmeter never decompresses), e.g. %s -dk %s", p,
                      what,
                      kind == STAB_FILE_GZIP   ? "gzip"
                      : kind == STAB_FILE_ZSTD ? "zstd"
                      : kind == STAB_FILE_XZ   ? "xz"
                                               : "bzip2",
                      p);
  case STAB_FILE_LFS_POINTER:
    return stabi_fail(STAB_EFORMAT, "%s: %s: fetch the file itself, e.g. git lfs pull --include '%s'", p, what, p);
  case STAB_FILE_SHARD_INDEX:
    return stabi_fail(STAB_EFORMAT, "%s: %s, not a checkpoint itself: stab_sharded_open reads it and its shards as one "
                      "model (stabmeter-probe does, given this file or its directory)", p, what);
  case STAB_FILE_LLMC_OTHER:
    return stabi_fail(STAB_EFORMAT, "%s: %s: give the model checkpoint (model_NNNNNNNN.bin) instead", p, what);
  case STAB_FILE_EMPTY:
  case STAB_FILE_TEXT:
    return stabi_fail(STAB_EFORMAT, "%s: %s, not a checkpoint (stabmeter reads safetensors, GGUF and llm.c checkpoints)", p,
                      what);
  default: break;
  }
  char hex[3 * 16 + 1] = "";
  for (size_t i = 0, at = 0; i < h->n && i < 16; i++) at += (size_t)snprintf(hex + at, sizeof hex - at, "%s%02x", i ? " " : "", h->b[i]);
  return stabi_fail(STAB_EFORMAT,
                    "%s: %s (first bytes: %s; %llu bytes): stabmeter reads safetensors, GGUF and llm.c checkpoints",
                    p, what, hex, (unsigned long long)h->size);
}

stab_status stab_ckpt_sniff(const char *path, stab_file_kind *kind) {
  if (kind) *kind = STAB_FILE_UNKNOWN;
  if (!path || !kind) return stabi_fail(STAB_EINVAL, "stab_ckpt_sniff: NULL %s", path ? "kind" : "path");
  int fd;
  uint64_t size;
  stab_status st = stab_input_open(path, 0, &fd, &size);
  if (st != STAB_OK) return st;
  /* exactly as many bytes as the file has (up to the cap), on the heap: a test that looked past
   * what was read would then be caught by the sanitizers, not read a stack buffer's leftovers */
  size_t want = size < STAB_SNIFF_BYTES ? (size_t)size : STAB_SNIFF_BYTES, got = 0;
  unsigned char *buf = malloc(want ? want : 1);
  if (!buf) {
    close(fd);
    return stabi_fail(STAB_ENOMEM, "%s: cannot allocate %zu bytes to read its start", path, want);
  }
  while (got < want) { /* pread may return less than asked; 0 means the file shrank */
    ssize_t r = pread(fd, buf + got, want - got, (off_t)got);
    if (r < 0) {
      int err = errno;
      close(fd);
      free(buf);
      errno = err;
      return stabi_fail(STAB_EIO, "%s: cannot read its first %zu bytes: %s", path, want, strerror(errno));
    }
    if (r == 0) break;
    got += (size_t)r;
  }
  close(fd);
  head h = {buf, got, size};
  *kind = kind_of(&h, path);
  st = *kind == STAB_FILE_SAFETENSORS || *kind == STAB_FILE_GGUF || *kind == STAB_FILE_LLMC ? STAB_OK
                                                                                           : refuse(path, *kind, &h);
  free(buf);
  return st;
}
