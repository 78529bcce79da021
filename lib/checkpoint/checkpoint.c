/* checkpoint.c — a checkpoint of any format behind one handle (stab_checkpoint_*): the one place
 * that decides what a path is (a folder, an index, a file by its first bytes, a shard of a split
 * GGUF model) and opens it with its reader; then the tensors, found and read alike whatever the
 * format, and the files they lie in. The readers themselves are the other files of this folder. */
#include "checkpoint/checkpoint_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Exactly one of st, sh, gg, lc is set (gs with gg: gg is then gs's first shard, gs's). */
struct stab_checkpoint {
  stab_file_kind format;   /* STAB_FILE_SAFETENSORS, STAB_FILE_GGUF or STAB_FILE_LLMC */
  char *path;              /* as given */
  stab_safetensors *st;    /* one safetensors file */
  stab_sharded *sh;        /* a Hugging Face folder or index: every shard */
  stab_gguf *gg;           /* one GGUF file, or a split model's first shard (its metadata) */
  stabi_gguf_split *gs;    /* a split GGUF model: every shard, or NULL */
  stab_llmc *lc;           /* an llm.c checkpoint */
  char *note;              /* stab_checkpoint_note, or NULL */
};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

static char *copy_of(const char *s) {
  size_t n = strlen(s) + 1;
  char *c = malloc(n);
  return c ? memcpy(c, s, n) : NULL;
}

/* A GGUF file c->gg (opened from path) that is one shard of a split model (llama.cpp's
 * gguf-split: metadata split.count > 1): every shard, as one checkpoint whose metadata is the
 * first shard's. A missing shard is an error naming it: a part of a model read as the whole
 * would report its tensors as the model's, and a tied head its other shards hold. */
static stab_status open_split(stab_checkpoint *c, const char *path) {
  size_t no, n;
  stab_status st = stabi_gguf_split_info(c->gg, path, &no, &n);
  if (st != STAB_OK || n == 1) return st;
  if ((st = stabi_gguf_split_open(path, c->gg, &c->gs)) != STAB_OK) return st;
  c->gg = (stab_gguf *)stabi_gguf_split_shard(c->gs, 0);
  const char *fmt = "note: %s is shard %zu of %zu of a split GGUF model: reading all %zu (%s ... %s) as one checkpoint";
  const char *a = stabi_gguf_split_shard_path(c->gs, 0), *b = stabi_gguf_split_shard_path(c->gs, n - 1);
  int len = snprintf(NULL, 0, fmt, path, no + 1, n, n, a, b);
  if (len < 0 || !(c->note = malloc((size_t)len + 1))) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  snprintf(c->note, (size_t)len + 1, fmt, path, no + 1, n, n, a, b);
  return STAB_OK;
}

/* What path is and its reader, the one place that decides it. A folder or a sharded model's
 * index is every shard as one checkpoint (a folder holding a split GGUF model: its shards);
 * any other path is a file of the format its first bytes say (stab_ckpt_sniff). A binary file
 * of no known format named .gguf or .safetensors is one with a broken header: its reader says
 * which field is wrong. Any other file is refused with what it is (a PyTorch checkpoint, a
 * trace, text, ...): the sniff's message. */
static stab_status open_any(stab_checkpoint *c, const char *path) {
  struct stat sb;
  stab_file_kind kind = STAB_FILE_UNKNOWN;
  stab_status st = STAB_OK;
  int sharded = (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || ends_with(path, ".index.json");
  char *split_first = NULL; /* a folder of a split GGUF model: its first shard */
  if (sharded && S_ISDIR(sb.st_mode)) {
    st = stabi_gguf_split_first_in(path, &split_first);
    if (st == STAB_OK) sharded = 0, kind = STAB_FILE_GGUF;
    else if (st != STAB_ENOTFOUND) return st;
    st = STAB_OK;
  }
  if (!sharded && !split_first) {
    st = stab_ckpt_sniff(path, &kind);
    if (kind == STAB_FILE_SHARD_INDEX) sharded = 1, st = STAB_OK;
  }
  if (st != STAB_OK && kind == STAB_FILE_UNKNOWN && ends_with(path, ".gguf")) kind = STAB_FILE_GGUF, st = STAB_OK;
  if (st != STAB_OK && kind == STAB_FILE_UNKNOWN && ends_with(path, ".safetensors"))
    kind = STAB_FILE_SAFETENSORS, st = STAB_OK;
  if (st == STAB_OK) {
    c->format = sharded || (kind != STAB_FILE_LLMC && kind != STAB_FILE_GGUF) ? STAB_FILE_SAFETENSORS : kind;
    st = sharded                  ? stab_sharded_open(path, &c->sh)
         : kind == STAB_FILE_LLMC ? stab_llmc_open(path, &c->lc)
         : kind == STAB_FILE_GGUF ? stab_gguf_open(split_first ? split_first : path, &c->gg)
                                  : stab_safetensors_open(path, &c->st);
  }
  if (st == STAB_OK && c->gg) st = open_split(c, split_first ? split_first : path);
  if (st == STAB_OK && c->sh && stab_sharded_warning(c->sh)) {
    const char *w = stab_sharded_warning(c->sh);
    if (!(c->note = malloc(strlen(w) + sizeof "warning: ")))
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
    else
      strcat(strcpy(c->note, "warning: "), w);
  }
  free(split_first);
  return st;
}

stab_status stab_checkpoint_open(const char *path, stab_checkpoint **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_checkpoint_open: NULL %s", path ? "out" : "path");
  if (!*path) return stabi_fail(STAB_EINVAL, "stab_checkpoint_open: the path is empty");
  stab_checkpoint *c = calloc(1, sizeof *c);
  if (!c || !(c->path = copy_of(path))) {
    free(c);
    return stabi_fail(STAB_ENOMEM, "stab_checkpoint_open: out of memory");
  }
  stab_status st = open_any(c, c->path);
  if (st != STAB_OK) {
    stab_checkpoint_close(c);
    return st;
  }
  *out = c;
  return STAB_OK;
}

void stab_checkpoint_close(stab_checkpoint *c) {
  if (!c) return;
  stab_safetensors_close(c->st);
  stab_sharded_close(c->sh);
  if (c->gs) stabi_gguf_split_close(c->gs); /* its shards, c->gg among them */
  else stab_gguf_close(c->gg);
  stab_llmc_close(c->lc);
  free(c->note), free(c->path);
  free(c);
}

stab_file_kind stab_checkpoint_format(const stab_checkpoint *c) { return c ? c->format : STAB_FILE_UNKNOWN; }

const char *stab_checkpoint_note(const stab_checkpoint *c) { return c ? c->note : NULL; }

/* ---- the tensors ----------------------------------------------------------------------- */

size_t stab_checkpoint_count(const stab_checkpoint *c) {
  if (!c) return 0;
  if (c->gs) return stabi_gguf_split_count(c->gs);
  return c->sh ? stab_sharded_count(c->sh) : c->st ? stab_safetensors_count(c->st)
         : c->gg ? stab_gguf_count(c->gg) : stab_llmc_count(c->lc);
}

const stab_ckpt_tensor *stab_checkpoint_tensor(const stab_checkpoint *c, size_t i) {
  if (!c) return NULL;
  if (c->gs) return stabi_gguf_split_tensor(c->gs, i);
  return c->sh ? stab_sharded_tensor(c->sh, i) : c->st ? stab_safetensors_tensor(c->st, i)
         : c->gg ? stab_gguf_tensor(c->gg, i) : stab_llmc_tensor(c->lc, i);
}

stab_status stab_checkpoint_find(const stab_checkpoint *c, const char *name, size_t *index) {
  if (!c || !name || !index) return stabi_fail(STAB_EINVAL, "stab_checkpoint_find: NULL argument");
  return c->gs ? stabi_gguf_split_find(c->gs, name, index)
         : c->sh ? stab_sharded_find(c->sh, name, index)
         : c->st ? stab_safetensors_find(c->st, name, index)
         : c->gg ? stab_gguf_find(c->gg, name, index)
                 : stab_llmc_find(c->lc, name, index);
}

stab_status stab_checkpoint_read_f32(const stab_checkpoint *c, size_t i, uint64_t first, size_t n, float *out) {
  if (!c || !out) return stabi_fail(STAB_EINVAL, "stab_checkpoint_read_f32: NULL %s", c ? "out" : "checkpoint");
  const stab_ckpt_tensor *t = stab_checkpoint_tensor(c, i);
  if (!t)
    return stabi_fail(STAB_ERANGE, "stab_checkpoint_read_f32: %s: tensor %zu of %zu", c->path, i,
                      stab_checkpoint_count(c));
  return stab_ckpt_read_f32(t, first, n, out);
}

/* ---- the files ---------------------------------------------------------------------------- */

size_t stab_checkpoint_file_count(const stab_checkpoint *c) {
  if (!c) return 0;
  return c->gs ? stabi_gguf_split_shard_count(c->gs) : c->sh ? stab_sharded_shard_count(c->sh) : 1;
}

const char *stab_checkpoint_file_path(const stab_checkpoint *c, size_t k) {
  if (!c || k >= stab_checkpoint_file_count(c)) return NULL;
  return c->gs ? stabi_gguf_split_shard_path(c->gs, k) : c->sh ? stab_sharded_shard_path(c->sh, k) : c->path;
}

size_t stab_checkpoint_file_of(const stab_checkpoint *c, size_t i) {
  if (!c || i >= stab_checkpoint_count(c)) return SIZE_MAX;
  return c->gs ? stabi_gguf_split_shard_of(c->gs, i) : c->sh ? stab_sharded_shard_of(c->sh, i) : 0;
}

const stab_safetensors *stab_checkpoint_safetensors(const stab_checkpoint *c) {
  return !c ? NULL : c->sh ? stab_sharded_shard(c->sh, 0) : c->st;
}
const stab_gguf *stab_checkpoint_gguf(const stab_checkpoint *c) { return c ? c->gg : NULL; }
const stab_llmc *stab_checkpoint_llmc(const stab_checkpoint *c) { return c ? c->lc : NULL; }

const char *stabi_checkpoint_directory(const stab_checkpoint *c) { return c && c->sh ? stab_sharded_directory(c->sh) : NULL; }

/* The first byte of file k's mapping: its first tensor's data less that tensor's offset. */
static const unsigned char *file_base(const stab_checkpoint *c, size_t k, uint64_t *size) {
  const stab_ckpt_tensor *first;
  if (c->gs) {
    const stab_gguf *g = stabi_gguf_split_shard(c->gs, k);
    first = stab_gguf_tensor(g, 0), *size = stabi_gguf_file_size(g);
  } else if (c->sh || c->st) {
    const stab_safetensors *s = c->sh ? stab_sharded_shard(c->sh, k) : c->st;
    first = stab_safetensors_tensor(s, 0), *size = stab_safetensors_file_size(s);
  } else {
    first = stab_checkpoint_tensor(c, 0), *size = UINT64_MAX; /* not checked: the one file */
  }
  return first ? first->data - first->offset : NULL;
}

const char *stabi_checkpoint_file_at(const stab_checkpoint *c, const stab_ckpt_tensor *t, uint64_t *offset) {
  size_t i;
  /* a split GGUF model: the file of the tensor of t's name, if t lies in it */
  if (c->gs && stabi_gguf_split_find(c->gs, t->name, &i) == STAB_OK) {
    size_t k = stabi_gguf_split_shard_of(c->gs, i);
    uint64_t size;
    const unsigned char *base = file_base(c, k, &size);
    if (base && t->data >= base && t->data < base + size) {
      *offset = (uint64_t)(t->data - base);
      return stabi_gguf_split_shard_path(c->gs, k);
    }
  }
  /* else by address, file by file (a view into an experts tensor has no name of the file's) */
  for (size_t k = 0; k < stab_checkpoint_file_count(c); k++) {
    uint64_t size;
    const unsigned char *base = file_base(c, k, &size);
    if (!base || t->data < base || (size != UINT64_MAX && t->data >= base + size)) continue;
    *offset = (uint64_t)(t->data - base);
    return stab_checkpoint_file_path(c, k);
  }
  *offset = t->offset;
  return c->path;
}

uint64_t stabi_checkpoint_place(const stab_checkpoint *c, const stab_ckpt_tensor *t) {
  size_t i;
  if (c->gs && stabi_gguf_split_find(c->gs, t->name, &i) == STAB_OK)
    return stabi_gguf_split_base(c->gs, stabi_gguf_split_shard_of(c->gs, i)) + t->offset;
  if (!c->sh || stab_sharded_find(c->sh, t->name, &i) != STAB_OK) return t->offset;
  uint64_t base = 0;
  for (size_t k = 0; k < stab_sharded_shard_of(c->sh, i); k++)
    base += stab_safetensors_file_size(stab_sharded_shard(c->sh, k));
  return base + t->offset;
}

/* Tensor i of file k (k's own order), and the tensors file k holds. */
static size_t file_tensor_count(const stab_checkpoint *c, size_t k) {
  return c->gs ? stab_gguf_count(stabi_gguf_split_shard(c->gs, k))
         : c->sh ? stab_safetensors_count(stab_sharded_shard(c->sh, k)) : stab_checkpoint_count(c);
}
static const stab_ckpt_tensor *file_tensor(const stab_checkpoint *c, size_t k, size_t i) {
  return c->gs ? stab_gguf_tensor(stabi_gguf_split_shard(c->gs, k), i)
         : c->sh ? stab_safetensors_tensor(stab_sharded_shard(c->sh, k), i) : stab_checkpoint_tensor(c, i);
}

int stabi_checkpoint_file_span(const stab_checkpoint *c, size_t k, const void **lo, size_t *len) {
  uintptr_t a = UINTPTR_MAX, b = 0;
  for (size_t i = 0, n = file_tensor_count(c, k); i < n; i++) {
    const stab_ckpt_tensor *t = file_tensor(c, k, i);
    const uint64_t nb = stab_ckpt_nbytes(t);
    if (!nb) continue; /* empty, or a block type never read */
    a = (uintptr_t)t->data < a ? (uintptr_t)t->data : a;
    b = (uintptr_t)t->data + nb > b ? (uintptr_t)t->data + nb : b;
  }
  if (b <= a) return 0;
  *lo = (const void *)a, *len = b - a;
  return 1;
}
