/* safetensors.c — the safetensors reader: maps the file read-only, parses its JSON
 * header with a small strict parser of its own and validates every rule of the format
 * before any tensor is handed out. Every failure names the file and the field or the
 * header byte at fault; every allocation is bounded by the header's size. */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The format's own limit on the header (the reference implementation's): a larger one is
 * not a real checkpoint, and refusing it bounds the parser's work. */
#define HEADER_MAX ((uint64_t)100 << 20)
#define NAME_MAX_BYTES 65536

typedef struct {
  char *key, *value;
} meta_entry;

struct stab_safetensors {
  stabi_mapped file;
  stab_ckpt_tensor *tensors; /* sorted by offset */
  size_t count, cap;
  size_t *by_name; /* indices sorted by name, for find */
  meta_entry *meta;
  size_t nmeta, metacap;
  int seen_meta;
};

/* ---- dtypes ------------------------------------------------------------------------ */

static const struct {
  const char *name;
  size_t size;
  stab_dtype dtype;
} dtypes[] = {
    {"F32", 4, STAB_DTYPE_F32},  {"F16", 2, STAB_DTYPE_F16},      {"BF16", 2, STAB_DTYPE_BF16},
    {"F64", 8, STAB_DTYPE_OTHER}, {"I64", 8, STAB_DTYPE_OTHER},    {"I32", 4, STAB_DTYPE_OTHER},
    {"I16", 2, STAB_DTYPE_OTHER}, {"I8", 1, STAB_DTYPE_OTHER},     {"U64", 8, STAB_DTYPE_OTHER},
    {"U32", 4, STAB_DTYPE_OTHER}, {"U16", 2, STAB_DTYPE_OTHER},    {"U8", 1, STAB_DTYPE_OTHER},
    {"BOOL", 1, STAB_DTYPE_OTHER}, {"F8_E4M3", 1, STAB_DTYPE_OTHER}, {"F8_E5M2", 1, STAB_DTYPE_OTHER},
};

size_t stabi_safetensors_dtype_size(const char *name) {
  for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
    if (!strcmp(dtypes[k].name, name)) return dtypes[k].size;
  return 0;
}

/* ---- the JSON cursor --------------------------------------------------------------- */
/* The header's schema is fixed (an object of objects of strings and integer arrays), so
 * the parser is recursive descent over exactly that schema, at most three levels deep by
 * construction; anything else in the header is an error at its byte offset. */

typedef struct {
  const char *p;   /* header bytes */
  size_t n, i;     /* length, cursor */
  const char *path;
} cursor;

static stab_status bad(const cursor *c, const char *fmt, const char *arg) {
  char what[512];
  snprintf(what, sizeof what, fmt, arg);
  return stabi_fail(STAB_EFORMAT, "%s: header byte %zu: %s", c->path, c->i, what);
}

static void skip_ws(cursor *c) {
  while (c->i < c->n && (c->p[c->i] == ' ' || c->p[c->i] == '\t' || c->p[c->i] == '\n' || c->p[c->i] == '\r'))
    c->i++;
}

/* Skips whitespace, then consumes ch or fails naming what was expected. */
static stab_status expect(cursor *c, char ch, const char *what) {
  skip_ws(c);
  if (c->i >= c->n) return bad(c, "header ends where %s was expected", what);
  if (c->p[c->i] != ch) return bad(c, "expected %s", what);
  c->i++;
  return STAB_OK;
}

/* 1 if the next non-blank byte is ch (consumed), 0 if not. */
static int accept(cursor *c, char ch) {
  skip_ws(c);
  if (c->i < c->n && c->p[c->i] == ch) {
    c->i++;
    return 1;
  }
  return 0;
}

/* A JSON string, decoded into a new NUL-terminated buffer (*out, caller frees). The decoded
 * text is never longer than the raw one, so the buffer is bounded by the header. \u0000 is
 * refused: names are C strings. */
static stab_status parse_string(cursor *c, char **out, const char *what) {
  *out = NULL;
  skip_ws(c);
  if (c->i >= c->n) return bad(c, "header ends where %s was expected", what);
  if (c->p[c->i] != '"') return bad(c, "expected %s (a string)", what);
  size_t start = ++c->i, end = start, len;
  while (end < c->n && c->p[end] != '"') end += (c->p[end] == '\\' && end + 1 < c->n) ? 2 : 1;
  if (end >= c->n) return bad(c, "unterminated string (%s)", what);
  if (end - start > NAME_MAX_BYTES) return bad(c, "%s is longer than 65536 bytes", what);
  char *s = malloc(end - start + 1);
  if (!s) return stabi_fail(STAB_ENOMEM, "%s: out of memory for a header string", c->path);
  /* the decoding is the JSON parser's (lib/core/json.c); the words are the header's */
  stab_status st = STAB_OK;
  switch (stabi_json_unescape(c->p, c->n, &c->i, end, s, &len)) {
  case STABI_JSTR_OK: break;
  case STABI_JSTR_CONTROL: st = bad(c, "control character in %s (must be escaped)", what); break;
  case STABI_JSTR_UTF8: st = bad(c, "invalid UTF-8 in %s", what); break;
  case STABI_JSTR_ESCAPE: st = bad(c, "invalid escape in %s", what); break;
  case STABI_JSTR_HEX_SHORT: st = bad(c, "%s", "truncated \\u escape"); break;
  /* a low half cut short by the string's end runs into its closing quote */
  case STABI_JSTR_LOW_CUT:
    st = bad(c, "%s", c->n - c->i < 4 ? "truncated \\u escape" : "bad hex digit in \\u escape");
    break;
  case STABI_JSTR_HEX_DIGIT: case STABI_JSTR_LOW_DIGIT: st = bad(c, "%s", "bad hex digit in \\u escape"); break;
  case STABI_JSTR_UNPAIRED: st = bad(c, "%s", "unpaired surrogate in \\u escape"); break;
  case STABI_JSTR_NUL: st = bad(c, "\\u0000 in %s (names are C strings)", what); break;
  }
  if (st != STAB_OK) {
    free(s);
    return st;
  }
  c->i = end + 1;
  *out = s;
  return STAB_OK;
}

/* A non-negative JSON integer; fractions, exponents, signs and leading zeros are errors. */
static stab_status parse_uint(cursor *c, uint64_t *out, const char *what) {
  skip_ws(c);
  if (c->i >= c->n) return bad(c, "header ends where %s was expected", what);
  if (c->p[c->i] == '-') return bad(c, "%s is negative", what);
  if (c->p[c->i] < '0' || c->p[c->i] > '9') return bad(c, "expected %s (an integer)", what);
  if (c->p[c->i] == '0' && c->i + 1 < c->n && c->p[c->i + 1] >= '0' && c->p[c->i + 1] <= '9')
    return bad(c, "%s has a leading zero", what);
  uint64_t v = 0;
  while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9') {
    unsigned d = (unsigned)(c->p[c->i] - '0');
    if (v > (UINT64_MAX - d) / 10) return bad(c, "%s does not fit in 64 bits", what);
    v = v * 10 + d;
    c->i++;
  }
  if (c->i < c->n && (c->p[c->i] == '.' || c->p[c->i] == 'e' || c->p[c->i] == 'E'))
    return bad(c, "%s is not an integer (floating-point numbers are not allowed here)", what);
  *out = v;
  return STAB_OK;
}

/* ---- the schema -------------------------------------------------------------------- */

static stab_status add_meta(stab_safetensors *f, cursor *c) {
  stab_status st = expect(c, '{', "'{' opening __metadata__ (an object of strings)");
  if (st != STAB_OK) return st;
  if (accept(c, '}')) return STAB_OK;
  do {
    char *k = NULL, *v = NULL;
    if ((st = parse_string(c, &k, "a __metadata__ key")) != STAB_OK) return st;
    if ((st = expect(c, ':', "':' after a __metadata__ key")) != STAB_OK ||
        (st = parse_string(c, &v, "a __metadata__ value")) != STAB_OK) {
      free(k);
      return st;
    }
    if (f->nmeta == f->metacap) {
      size_t cap = f->metacap ? 2 * f->metacap : 8;
      meta_entry *m = realloc(f->meta, cap * sizeof *m);
      if (!m) {
        free(k), free(v);
        return stabi_fail(STAB_ENOMEM, "%s: out of memory for metadata", c->path);
      }
      f->meta = m, f->metacap = cap;
    }
    f->meta[f->nmeta++] = (meta_entry){k, v};
  } while (accept(c, ','));
  return expect(c, '}', "',' or '}' in __metadata__");
}

static stab_status parse_tensor(stab_safetensors *f, cursor *c, stab_ckpt_tensor *t, uint64_t *begin,
                                uint64_t *end) {
  const char *nm = t->name;
  int have_dtype = 0, have_shape = 0, have_offsets = 0;
  stab_status st = expect(c, '{', "'{' opening the tensor's entry");
  if (st != STAB_OK) return st;
  if (!accept(c, '}')) {
   do {
    char *key = NULL;
    size_t keypos;
    skip_ws(c);
    keypos = c->i;
    if ((st = parse_string(c, &key, "a key of a tensor entry")) != STAB_OK) return st;
    if ((st = expect(c, ':', "':' after a key")) != STAB_OK) {
      free(key);
      return st;
    }
    if (!strcmp(key, "dtype")) {
      free(key);
      if (have_dtype++) { c->i = keypos; return bad(c, "tensor '%s': duplicate key \"dtype\"", nm); }
      char *d = NULL;
      size_t at = c->i;
      if ((st = parse_string(c, &d, "dtype")) != STAB_OK) return st;
      size_t k = 0;
      while (k < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[k].name, d)) k++;
      if (k == sizeof dtypes / sizeof dtypes[0]) {
        char msg[160];
        snprintf(msg, sizeof msg, "tensor '%.60s': unknown dtype \"%.40s\"", nm, d);
        free(d);
        c->i = at;
        return bad(c, "%s", msg);
      }
      free(d);
      t->dtype_name = dtypes[k].name, t->elem_size = dtypes[k].size, t->dtype = dtypes[k].dtype;
    } else if (!strcmp(key, "shape")) {
      free(key);
      if (have_shape++) { c->i = keypos; return bad(c, "tensor '%s': duplicate key \"shape\"", nm); }
      if ((st = expect(c, '[', "'[' opening shape")) != STAB_OK) return st;
      t->ndim = 0;
      if (!accept(c, ']')) {
        do {
          if (t->ndim == STAB_CKPT_MAX_DIMS) return bad(c, "tensor '%s': shape has more than 8 dimensions", nm);
          if ((st = parse_uint(c, &t->shape[t->ndim], "a shape dimension")) != STAB_OK) return st;
          t->ndim++;
        } while (accept(c, ','));
        if ((st = expect(c, ']', "',' or ']' in shape")) != STAB_OK) return st;
      }
    } else if (!strcmp(key, "data_offsets")) {
      free(key);
      if (have_offsets++) { c->i = keypos; return bad(c, "tensor '%s': duplicate key \"data_offsets\"", nm); }
      if ((st = expect(c, '[', "'[' opening data_offsets")) != STAB_OK ||
          (st = parse_uint(c, begin, "data_offsets[0]")) != STAB_OK ||
          (st = expect(c, ',', "',' in data_offsets (two integers)")) != STAB_OK ||
          (st = parse_uint(c, end, "data_offsets[1]")) != STAB_OK ||
          (st = expect(c, ']', "']' closing data_offsets (two integers)")) != STAB_OK)
        return st;
    } else {
      char msg[160];
      snprintf(msg, sizeof msg, "tensor '%.60s': unknown key \"%.40s\"", nm, key);
      free(key);
      c->i = keypos;
      return bad(c, "%s", msg);
    }
   } while (accept(c, ','));
   if ((st = expect(c, '}', "',' or '}' in a tensor entry")) != STAB_OK) return st;
  }
  if (!have_dtype || !have_shape || !have_offsets) {
    char msg[200];
    snprintf(msg, sizeof msg, "tensor '%.60s': missing \"%s\"", nm,
             !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
    return bad(c, "%s", msg);
  }
  (void)f;
  return STAB_OK;
}

static int cmp_offset(const void *a, const void *b) {
  const stab_ckpt_tensor *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  /* zero-sized tensors sit at the offset of the next one: they come first */
  uint64_t nx = x->count * x->elem_size, ny = y->count * y->elem_size;
  return nx < ny ? -1 : nx > ny;
}

static int cmp_meta(const void *a, const void *b) {
  return strcmp(((const meta_entry *)a)->key, ((const meta_entry *)b)->key);
}

/* The header object: tensors go to f->tensors with offsets relative to the data section
 * (made absolute by the caller). */
static stab_status parse_header(stab_safetensors *f, cursor *c, uint64_t data_size) {
  skip_ws(c);
  if (c->i >= c->n || c->p[c->i] != '{')
    return bad(c, "%s", "the header is not a JSON object (it must start with '{')");
  c->i++;
  stab_status st;
  if (!accept(c, '}')) {
   do {
    char *name = NULL;
    skip_ws(c);
    size_t namepos = c->i;
    if ((st = parse_string(c, &name, "a tensor name")) != STAB_OK) return st;
    if ((st = expect(c, ':', "':' after a tensor name")) != STAB_OK) {
      free(name);
      return st;
    }
    if (!strcmp(name, "__metadata__")) {
      free(name);
      if (f->seen_meta++) {
        c->i = namepos;
        return bad(c, "%s", "duplicate \"__metadata__\"");
      }
      if ((st = add_meta(f, c)) != STAB_OK) return st;
      continue;
    }
    if (!name[0]) {
      free(name);
      c->i = namepos;
      return bad(c, "%s", "empty tensor name");
    }
    if (f->count == f->cap) {
      size_t cap = f->cap ? 2 * f->cap : 64;
      stab_ckpt_tensor *t = realloc(f->tensors, cap * sizeof *t);
      if (!t) {
        free(name);
        return stabi_fail(STAB_ENOMEM, "%s: out of memory for the tensor index", c->path);
      }
      f->tensors = t, f->cap = cap;
    }
    stab_ckpt_tensor *t = &f->tensors[f->count++];
    memset(t, 0, sizeof *t);
    t->name = name;
    uint64_t begin = 0, end = 0;
    size_t entrypos = c->i;
    if ((st = parse_tensor(f, c, t, &begin, &end)) != STAB_OK) return st;
    /* shape against the byte range, without overflow: the product of the non-zero sizes
     * must fit 64 bits even when a zero makes the tensor empty (a rule independent of the
     * order of multiplication, as in the GGUF reader) */
    uint64_t count = 1;
    int empty = 0;
    for (size_t d = 0; d < t->ndim; d++) {
      if (t->shape[d] && count > UINT64_MAX / t->shape[d]) {
        c->i = entrypos;
        return bad(c, "tensor '%s': the product of shape overflows 64 bits", name);
      }
      if (t->shape[d]) count *= t->shape[d];
      else empty = 1;
    }
    if (empty) count = 0;
    if (count && count > UINT64_MAX / t->elem_size) {
      c->i = entrypos;
      return bad(c, "tensor '%s': shape times element size overflows 64 bits", name);
    }
    t->count = count;
    char msg[320];
    if (begin > end || end > data_size) {
      snprintf(msg, sizeof msg, "tensor '%.80s': data_offsets [%llu, %llu] outside the data section of %llu bytes",
               name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
      c->i = entrypos;
      return bad(c, "%s", msg);
    }
    if (end - begin != count * t->elem_size) {
      snprintf(msg, sizeof msg, "tensor '%.80s': shape holds %llu %s elements (%llu bytes) but data_offsets "
               "[%llu, %llu] span %llu bytes", name, (unsigned long long)count, t->dtype_name,
               (unsigned long long)(count * t->elem_size), (unsigned long long)begin, (unsigned long long)end,
               (unsigned long long)(end - begin));
      c->i = entrypos;
      return bad(c, "%s", msg);
    }
    t->offset = begin;
   } while (accept(c, ','));
   if ((st = expect(c, '}', "',' or '}' in the header object")) != STAB_OK) return st;
  }
  skip_ws(c);
  if (c->i != c->n) return bad(c, "%s", "bytes after the header object");
  return STAB_OK;
}

/* Names unique, offsets covering the data section without overlap or holes. */
static stab_status check_layout(stab_safetensors *f, uint64_t data_size) {
  if (f->count) qsort(f->tensors, f->count, sizeof *f->tensors, cmp_offset);
  uint64_t pos = 0;
  for (size_t i = 0; i < f->count; i++) {
    const stab_ckpt_tensor *t = &f->tensors[i];
    uint64_t nb = t->count * t->elem_size;
    if (t->offset < pos)
      return stabi_fail(STAB_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s' (ending at %llu)",
                        f->file.path, t->name, (unsigned long long)t->offset, (unsigned long long)(t->offset + nb),
                        f->tensors[i - 1].name, (unsigned long long)pos);
    if (t->offset > pos)
      return stabi_fail(STAB_EFORMAT, "%s: data section bytes [%llu, %llu) belong to no tensor (before '%s'); "
                        "the format allows no holes", f->file.path, (unsigned long long)pos,
                        (unsigned long long)t->offset, t->name);
    pos = t->offset + nb;
  }
  if (pos != data_size)
    return stabi_fail(STAB_EFORMAT, "%s: data section bytes [%llu, %llu) belong to no tensor (the tensors end at %llu); "
                      "the format allows no holes", f->file.path, (unsigned long long)pos,
                      (unsigned long long)data_size, (unsigned long long)pos);
  if (f->count) {
    stabi_name_ref *r = malloc(f->count * sizeof *r);
    if (!r || !(f->by_name = malloc(f->count * sizeof *f->by_name))) {
      free(r);
      return stabi_fail(STAB_ENOMEM, "%s: out of memory for the name index", f->file.path);
    }
    for (size_t i = 0; i < f->count; i++) r[i] = (stabi_name_ref){f->tensors[i].name, i};
    qsort(r, f->count, sizeof *r, stabi_cmp_name_ref);
    for (size_t i = 0; i < f->count; i++) f->by_name[i] = r[i].index;
    free(r);
    for (size_t i = 1; i < f->count; i++)
      if (!strcmp(f->tensors[f->by_name[i]].name, f->tensors[f->by_name[i - 1]].name))
        return stabi_fail(STAB_EFORMAT, "%s: duplicate tensor name '%s'", f->file.path, f->tensors[f->by_name[i]].name);
  }
  if (f->nmeta) {
    qsort(f->meta, f->nmeta, sizeof *f->meta, cmp_meta);
    for (size_t i = 1; i < f->nmeta; i++)
      if (!strcmp(f->meta[i].key, f->meta[i - 1].key))
        return stabi_fail(STAB_EFORMAT, "%s: __metadata__: duplicate key '%s'", f->file.path, f->meta[i].key);
  }
  return STAB_OK;
}

void stab_safetensors_close(stab_safetensors *f) {
  if (!f) return;
  stabi_mapped_close(&f->file);
  for (size_t i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
  for (size_t i = 0; i < f->nmeta; i++) free(f->meta[i].key), free(f->meta[i].value);
  free(f->tensors);
  free(f->by_name);
  free(f->meta);
  free(f);
}

stab_status stab_safetensors_open(const char *path, stab_safetensors **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_safetensors_open: NULL path or output");
  stab_safetensors *f = calloc(1, sizeof *f);
  if (!f) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  stab_status st = stabi_mapped_open(&f->file, path, 8, "the 8-byte header length");
  if (st != STAB_OK) goto out;
  /* Only the header is read here, and a page fault on a mapping reads around it (megabytes
   * of the tensors that follow, per file): a sharded model of a hundred shards read a
   * gigabyte from disk to open. No read-around while the header is parsed; best effort. */
  madvise(f->file.map, (size_t)f->file.size, MADV_RANDOM);
  uint64_t hlen = 0;
  for (int k = 7; k >= 0; k--) hlen = (hlen << 8) | f->file.map[k];
  if (hlen > f->file.size - 8) {
    st = stabi_fail(STAB_EFORMAT, "%s: header length %llu (bytes 0-7) is larger than the %llu bytes after it "
                    "(truncated file?)", path, (unsigned long long)hlen, (unsigned long long)(f->file.size - 8));
    goto out;
  }
  if (hlen == 0 || hlen > HEADER_MAX) {
    st = stabi_fail(STAB_EFORMAT, "%s: header length %llu (bytes 0-7) is %s", path, (unsigned long long)hlen,
                    hlen ? "above the format's limit of 100 MiB" : "zero");
    goto out;
  }
  cursor c = {(const char *)f->file.map + 8, (size_t)hlen, 0, path};
  uint64_t data_size = f->file.size - 8 - hlen;
  if ((st = parse_header(f, &c, data_size)) != STAB_OK) goto out;
  if ((st = check_layout(f, data_size)) != STAB_OK) goto out;
  for (size_t i = 0; i < f->count; i++) {
    f->tensors[i].data = f->file.map + 8 + hlen + f->tensors[i].offset;
    f->tensors[i].offset += 8 + hlen;
  }
out:
  if (f->file.map && stabi_mapped_shrunk(&f->file, NULL) != STAB_OK) st = STAB_EIO; /* the header read as zeros */
  if (f->file.map) madvise(f->file.map, (size_t)f->file.size, MADV_NORMAL); /* tensors are read in runs */
  if (st != STAB_OK) {
    stab_safetensors_close(f);
    return st;
  }
  *out = f;
  return STAB_OK;
}

size_t stab_safetensors_count(const stab_safetensors *f) { return f ? f->count : 0; }

const stab_ckpt_tensor *stab_safetensors_tensor(const stab_safetensors *f, size_t index) {
  return f && index < f->count ? &f->tensors[index] : NULL;
}

stab_status stab_safetensors_find(const stab_safetensors *f, const char *name, size_t *index) {
  if (!f || !name) return stabi_fail(STAB_EINVAL, "stab_safetensors_find: NULL reader or name");
  size_t lo = 0, hi = f->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = strcmp(f->tensors[f->by_name[mid]].name, name);
    if (r == 0) {
      if (index) *index = f->by_name[mid];
      return STAB_OK;
    }
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return STAB_ENOTFOUND; /* an ordinary answer, not a failure: last error untouched */
}

size_t stab_safetensors_metadata_count(const stab_safetensors *f) { return f ? f->nmeta : 0; }

stab_status stab_safetensors_metadata(const stab_safetensors *f, size_t index, const char **key,
                                      const char **value) {
  if (!f || index >= f->nmeta) return STAB_ENOTFOUND;
  if (key) *key = f->meta[index].key;
  if (value) *value = f->meta[index].value;
  return STAB_OK;
}

uint64_t stab_safetensors_file_size(const stab_safetensors *f) { return f ? f->file.size : 0; }
