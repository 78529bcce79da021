/* safetensors_write.c — the safetensors writer: the header JSON in the caller's order (metadata
 * first, then the tensors, their data contiguous in that order), padded with spaces to a multiple
 * of 8 bytes, written beside the file and renamed over it. It refuses anything the reader
 * (safetensors.c) would refuse, before creating a file, so a file it writes always reads back. */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reader's limit on the header (safetensors.c). */
#define HEADER_MAX ((uint64_t)100 << 20)

/* The header under construction: a growing string; on allocation failure `failed` is set and
 * every later append is a no-op (checked once, at the end). */
typedef struct {
  char *p;
  size_t len, cap;
  int failed;
} text;

static void append(text *t, const char *s, size_t n) {
  if (t->failed) return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 1024;
    while (t->len + n + 1 > cap) cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p) {
      t->failed = 1;
      return;
    }
    t->p = p, t->cap = cap;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
  t->p[t->len] = '\0';
}

static void append_str(text *t, const char *s) { append(t, s, strlen(s)); }

static void append_u64(text *t, uint64_t v) {
  char b[24];
  append(t, b, (size_t)snprintf(b, sizeof b, "%llu", (unsigned long long)v));
}

/* s as a JSON string: '"' and '\\' escaped, control characters as \u00XX, the rest (valid
 * UTF-8, checked by the caller) as it is. */
static void append_json_string(text *t, const char *s) {
  append(t, "\"", 1);
  for (const char *c = s; *c; c++) {
    unsigned char ch = (unsigned char)*c;
    if (ch == '"' || ch == '\\') {
      char e[2] = {'\\', (char)ch};
      append(t, e, 2);
    } else if (ch < 0x20) {
      char e[8];
      append(t, e, (size_t)snprintf(e, sizeof e, "\\u%04x", ch));
    } else {
      append(t, c, 1);
    }
  }
  append(t, "\"", 1);
}

/* A header string the reader would take: not NULL, valid UTF-8, at most 65536 bytes. */
static stab_status check_string(const char *path, const char *what, size_t index, const char *s) {
  if (!s) return stabi_fail(STAB_EINVAL, "%s: %s %zu is NULL", path, what, index);
  size_t n = strlen(s), bad = stabi_utf8_invalid_at(s, n);
  if (bad != (size_t)-1)
    return stabi_fail(STAB_EINVAL, "%s: %s %zu: invalid UTF-8 at byte %zu", path, what, index, bad);
  if (n > 65536) return stabi_fail(STAB_EINVAL, "%s: %s %zu is longer than 65536 bytes", path, what, index);
  return STAB_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Some string in s[0..n) twice (s is sorted in place): it, or NULL. */
static const char *duplicate(const char **s, size_t n) {
  if (n > 1) qsort(s, n, sizeof *s, cmp_str);
  for (size_t i = 1; i < n; i++)
    if (!strcmp(s[i], s[i - 1])) return s[i];
  return NULL;
}

/* Every rule of the reader, checked on the arguments: strings, names, dtypes, shapes, sizes.
 * *bytes receives the size of the data section. */
static stab_status check_entries(const char *path, const char *const *metadata, size_t n_metadata,
                                 const stab_safetensors_entry *tensors, size_t n_tensors, uint64_t *bytes) {
  stab_status st = STAB_OK;
  *bytes = 0;
  for (size_t i = 0; i < 2 * n_metadata; i++)
    if ((st = check_string(path, i % 2 ? "metadata value" : "metadata key", i / 2, metadata[i])) != STAB_OK)
      return st;
  for (size_t i = 0; i < n_tensors; i++) {
    const stab_safetensors_entry *e = &tensors[i];
    if ((st = check_string(path, "tensor", i, e->name)) != STAB_OK) return st;
    if (!e->name[0] || !strcmp(e->name, "__metadata__"))
      return stabi_fail(STAB_EINVAL, "%s: tensor %zu: the name \"%s\" is not a tensor's (empty, or the metadata's)",
                        path, i, e->name);
    size_t size = e->dtype ? stabi_safetensors_dtype_size(e->dtype) : 0;
    if (!size)
      return stabi_fail(STAB_EINVAL, "%s: tensor '%s': dtype \"%s\" is not one of safetensors' (F32, F16, BF16, "
                        "F64, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2)", path, e->name,
                        e->dtype ? e->dtype : "(NULL)");
    if (e->ndim > STAB_CKPT_MAX_DIMS)
      return stabi_fail(STAB_EINVAL, "%s: tensor '%s': %zu dimensions, more than %d", path, e->name, e->ndim,
                        STAB_CKPT_MAX_DIMS);
    /* the reader's rule: the product of the non-zero sizes fits 64 bits, and times the size */
    uint64_t count = 1;
    int empty = 0;
    for (size_t d = 0; d < e->ndim; d++) {
      if (e->shape[d] && count > UINT64_MAX / e->shape[d])
        return stabi_fail(STAB_EINVAL, "%s: tensor '%s': the product of shape overflows 64 bits", path, e->name);
      if (e->shape[d]) count *= e->shape[d];
      else empty = 1;
    }
    if (empty) count = 0;
    if (count > UINT64_MAX / size || count * size > UINT64_MAX - *bytes)
      return stabi_fail(STAB_EINVAL, "%s: tensor '%s': the data's size overflows 64 bits", path, e->name);
    if (count && !e->data) return stabi_fail(STAB_EINVAL, "%s: tensor '%s': NULL data", path, e->name);
    *bytes += count * size;
  }
  /* no name twice, no metadata key twice */
  size_t most = n_tensors > n_metadata ? n_tensors : n_metadata;
  const char **s = malloc((most ? most : 1) * sizeof *s);
  if (!s) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  for (size_t i = 0; i < n_tensors; i++) s[i] = tensors[i].name;
  const char *twice = duplicate(s, n_tensors);
  if (twice) st = stabi_fail(STAB_EINVAL, "%s: tensor name '%s' given twice", path, twice);
  for (size_t i = 0; i < n_metadata && st == STAB_OK; i++) s[i] = metadata[2 * i];
  if (st == STAB_OK && (twice = duplicate(s, n_metadata)))
    st = stabi_fail(STAB_EINVAL, "%s: __metadata__ key '%s' given twice", path, twice);
  free(s);
  return st;
}

/* The header: {"__metadata__":{"k":"v",...},"name":{"dtype":"F32","shape":[a,b],
 * "data_offsets":[begin,end]},...}, no blanks, then spaces up to a multiple of 8 bytes (the
 * data section aligned for any dtype). */
static void build_header(text *h, const char *const *metadata, size_t n_metadata,
                         const stab_safetensors_entry *tensors, size_t n_tensors) {
  uint64_t off = 0;
  append_str(h, "{");
  if (n_metadata) {
    append_str(h, "\"__metadata__\":{");
    for (size_t i = 0; i < n_metadata; i++) {
      if (i) append_str(h, ",");
      append_json_string(h, metadata[2 * i]);
      append_str(h, ":");
      append_json_string(h, metadata[2 * i + 1]);
    }
    append_str(h, "}");
  }
  for (size_t i = 0; i < n_tensors; i++) {
    const stab_safetensors_entry *e = &tensors[i];
    uint64_t count = 1;
    for (size_t d = 0; d < e->ndim; d++) count *= e->shape[d];
    uint64_t nb = count * stabi_safetensors_dtype_size(e->dtype);
    if (n_metadata || i) append_str(h, ",");
    append_json_string(h, e->name);
    append_str(h, ":{\"dtype\":");
    append_json_string(h, e->dtype);
    append_str(h, ",\"shape\":[");
    for (size_t d = 0; d < e->ndim; d++) {
      if (d) append_str(h, ",");
      append_u64(h, e->shape[d]);
    }
    append_str(h, "],\"data_offsets\":[");
    append_u64(h, off);
    append_str(h, ",");
    append_u64(h, off + nb);
    append_str(h, "]}");
    off += nb;
  }
  append_str(h, "}");
  while (!h->failed && h->len % 8) append_str(h, " ");
}

/* Writes n bytes, in pieces a single write() would take; 0, or -1 with errno. */
static int write_all(FILE *f, const void *p, uint64_t n) {
  const unsigned char *b = p;
  while (n) {
    size_t k = n > ((size_t)1 << 30) ? (size_t)1 << 30 : (size_t)n;
    if (fwrite(b, 1, k, f) != k) return -1;
    b += k, n -= k;
  }
  return 0;
}

stab_status stab_safetensors_write(const char *path, const char *const *metadata, size_t n_metadata,
                                   const stab_safetensors_entry *tensors, size_t n_tensors) {
  if (!path || (n_metadata && !metadata) || (n_tensors && !tensors))
    return stabi_fail(STAB_EINVAL, "stab_safetensors_write: NULL path, metadata or tensors");
  uint64_t bytes;
  stab_status st = check_entries(path, metadata, n_metadata, tensors, n_tensors, &bytes);
  if (st != STAB_OK) return st;
  text h = {0};
  build_header(&h, metadata, n_metadata, tensors, n_tensors);
  if (h.failed) {
    free(h.p);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for the header", path);
  }
  if (h.len > HEADER_MAX) {
    free(h.p);
    return stabi_fail(STAB_EINVAL, "%s: the header would be %zu bytes, above the format's limit of 100 MiB", path,
                      h.len);
  }
  /* Written beside and renamed over: a crash never leaves a half file under path. */
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  if (!tmp) {
    free(h.p);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  }
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    st = stabi_fail(STAB_EIO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    goto out;
  }
  unsigned char n8[8];
  for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
  int ok = fwrite(n8, 1, 8, f) == 8 && write_all(f, h.p, h.len) == 0;
  for (size_t i = 0; i < n_tensors && ok; i++) {
    uint64_t count = 1;
    for (size_t d = 0; d < tensors[i].ndim; d++) count *= tensors[i].shape[d];
    ok = write_all(f, tensors[i].data, count * stabi_safetensors_dtype_size(tensors[i].dtype)) == 0;
  }
  int err = ok ? 0 : errno;
  if (fclose(f) != 0 && ok) ok = 0, err = errno;
  if (!ok) {
    st = stabi_fail(STAB_EIO, "%s: cannot write %s: %s", path, tmp, strerror(err));
    remove(tmp);
    goto out;
  }
  if (rename(tmp, path) != 0) {
    st = stabi_fail(STAB_EIO, "%s: cannot rename %s over it: %s", path, tmp, strerror(errno));
    remove(tmp);
  }
out:
  free(tmp);
  free(h.p);
  return st;
}
