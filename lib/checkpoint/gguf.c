/* gguf.c — the GGUF reader (llama.cpp's format, v2 and v3): maps the file read-only,
 * walks its metadata and tensor infos with a cursor that checks every length against the
 * bytes left before using it, and validates every tensor's byte range before handing out
 * any tensor. Every failure names the file, the field and its byte offset. */
#include "checkpoint/checkpoint_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4         /* GGML_MAX_DIMS: no GGUF writer writes more */
#define NAME_MAX_BYTES 65536    /* keys and tensor names; llama.cpp itself caps names at 64 */
#define ARRAY_NEST_MAX 8        /* arrays of arrays: bounded recursion */

/* ---- GGML tensor types: block size (elements) and bytes per block ------------------ */
/* The numbers are the file's; types removed from ggml (4, 5, 31-33, 36-38) are unknown.
 * STAB_DTYPE_OTHER here: read_tensor_info makes a quantized type STAB_DTYPE_QUANT when
 * gguf_dequant.c decodes it. */

typedef struct {
  const char *name;
  uint32_t block, bytes;
  stab_dtype dtype;
} ggml_type_info;

static const ggml_type_info ggml_types[] = {
    [0] = {"F32", 1, 4, STAB_DTYPE_F32},         [1] = {"F16", 1, 2, STAB_DTYPE_F16},
    [2] = {"Q4_0", 32, 18, STAB_DTYPE_OTHER},    [3] = {"Q4_1", 32, 20, STAB_DTYPE_OTHER},
    [6] = {"Q5_0", 32, 22, STAB_DTYPE_OTHER},    [7] = {"Q5_1", 32, 24, STAB_DTYPE_OTHER},
    [8] = {"Q8_0", 32, 34, STAB_DTYPE_OTHER},    [9] = {"Q8_1", 32, 36, STAB_DTYPE_OTHER},
    [10] = {"Q2_K", 256, 84, STAB_DTYPE_OTHER},  [11] = {"Q3_K", 256, 110, STAB_DTYPE_OTHER},
    [12] = {"Q4_K", 256, 144, STAB_DTYPE_OTHER}, [13] = {"Q5_K", 256, 176, STAB_DTYPE_OTHER},
    [14] = {"Q6_K", 256, 210, STAB_DTYPE_OTHER}, [15] = {"Q8_K", 256, 292, STAB_DTYPE_OTHER},
    [16] = {"IQ2_XXS", 256, 66, STAB_DTYPE_OTHER}, [17] = {"IQ2_XS", 256, 74, STAB_DTYPE_OTHER},
    [18] = {"IQ3_XXS", 256, 98, STAB_DTYPE_OTHER}, [19] = {"IQ1_S", 256, 50, STAB_DTYPE_OTHER},
    [20] = {"IQ4_NL", 32, 18, STAB_DTYPE_OTHER}, [21] = {"IQ3_S", 256, 110, STAB_DTYPE_OTHER},
    [22] = {"IQ2_S", 256, 82, STAB_DTYPE_OTHER}, [23] = {"IQ4_XS", 256, 136, STAB_DTYPE_OTHER},
    [24] = {"I8", 1, 1, STAB_DTYPE_OTHER},       [25] = {"I16", 1, 2, STAB_DTYPE_OTHER},
    [26] = {"I32", 1, 4, STAB_DTYPE_OTHER},      [27] = {"I64", 1, 8, STAB_DTYPE_OTHER},
    [28] = {"F64", 1, 8, STAB_DTYPE_OTHER},      [29] = {"IQ1_M", 256, 56, STAB_DTYPE_OTHER},
    [30] = {"BF16", 1, 2, STAB_DTYPE_BF16},      [34] = {"TQ1_0", 256, 54, STAB_DTYPE_OTHER},
    [35] = {"TQ2_0", 256, 66, STAB_DTYPE_OTHER}, [39] = {"MXFP4", 32, 17, STAB_DTYPE_OTHER},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *stab_gguf_type_name(uint32_t t) { return t < N_GGML_TYPES ? ggml_types[t].name : NULL; }

/* Metadata value types: bytes of a scalar (0: string or array). */
static const struct {
  const char *name;
  unsigned size;
} value_types[] = {{"uint8", 1}, {"int8", 1},   {"uint16", 2}, {"int16", 2}, {"uint32", 4},
                   {"int32", 4}, {"float32", 4}, {"bool", 1},  {"string", 0}, {"array", 0},
                   {"uint64", 8}, {"int64", 8}, {"float64", 8}};
#define N_VALUE_TYPES (sizeof value_types / sizeof value_types[0])

const char *stab_gguf_value_type_name(stab_gguf_type t) {
  return (unsigned)t < N_VALUE_TYPES ? value_types[t].name : NULL;
}

/* ---- the reader ---------------------------------------------------------------------- */

typedef struct {
  uint64_t info_at; /* byte offset of the tensor's info, for messages */
  uint64_t nbytes;
} tensor_extra;

struct stab_gguf {
  stabi_mapped file;
  uint32_t version;
  uint64_t alignment, data_start;
  stab_ckpt_tensor *tensors;
  tensor_extra *extra;
  size_t count, cap;
  size_t *by_name;
  stab_gguf_kv *kv;
  size_t nkv, kvcap;
  size_t *kv_by_key;
};

/* A cursor over the mapped file: every read checks the bytes left first. */
typedef struct {
  const unsigned char *p;
  uint64_t n, i;
  const char *path;
} cursor;

static stab_status bad_at(const cursor *c, uint64_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static stab_status bad_at(const cursor *c, uint64_t at, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return stabi_fail(STAB_EFORMAT, "%s: byte %llu: %s", c->path, (unsigned long long)at, what);
}

static uint64_t left(const cursor *c) { return c->n - c->i; }

static stab_status need(const cursor *c, uint64_t bytes, const char *what) {
  if (left(c) >= bytes) return STAB_OK;
  return bad_at(c, c->i, "%s: the file ends %llu bytes in (truncated?)", what, (unsigned long long)left(c));
}

static uint64_t le(const unsigned char *p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned k = bytes; k-- > 0;) v = (v << 8) | p[k];
  return v;
}

static stab_status read_u32(cursor *c, uint32_t *v, const char *what) {
  stab_status st = need(c, 4, what);
  if (st != STAB_OK) return st;
  *v = (uint32_t)le(c->p + c->i, 4);
  c->i += 4;
  return STAB_OK;
}

static stab_status read_u64(cursor *c, uint64_t *v, const char *what) {
  stab_status st = need(c, 8, what);
  if (st != STAB_OK) return st;
  *v = le(c->p + c->i, 8);
  c->i += 8;
  return STAB_OK;
}

/* A string: uint64 length, then the bytes. *out gets a NUL-terminated copy (NULL: skipped);
 * a name (is_name) must be non-empty, without NUL, at most NAME_MAX_BYTES. */
static stab_status read_string(cursor *c, char **out, uint64_t *len_out, const char *what, int is_name) {
  uint64_t at = c->i, len;
  if (out) *out = NULL;
  stab_status st = read_u64(c, &len, what);
  if (st != STAB_OK) return st;
  if (len > left(c))
    return bad_at(c, at, "%s: string length %llu is beyond the file (%llu bytes left)", what, (unsigned long long)len,
                  (unsigned long long)left(c));
  if (is_name && len == 0) return bad_at(c, at, "%s is empty", what);
  if (is_name && len > NAME_MAX_BYTES)
    return bad_at(c, at, "%s is %llu bytes long (at most %d)", what, (unsigned long long)len, NAME_MAX_BYTES);
  if (is_name && memchr(c->p + c->i, 0, (size_t)len)) return bad_at(c, at, "%s holds a NUL byte", what);
  /* Names are text that reports print and look up: refused unless UTF-8 (keys and tensor names
   * of every real GGUF are ASCII). String values are kept as the file has them (a tokenizer's
   * bytes may be anything); whoever prints one checks it with stab_utf8_decode. */
  if (is_name) {
    size_t badi = stabi_utf8_invalid_at((const char *)c->p + c->i, (size_t)len);
    if (badi != (size_t)-1)
      return bad_at(c, c->i + badi, "%s is not valid UTF-8 (byte 0x%02x at index %zu)", what,
                    c->p[c->i + badi], badi);
  }
  if (out) {
    char *s = malloc((size_t)len + 1); /* len <= the file's size, which is mapped */
    if (!s) return stabi_fail(STAB_ENOMEM, "%s: out of memory for %s", c->path, what);
    memcpy(s, c->p + c->i, (size_t)len);
    s[len] = '\0';
    *out = s;
  }
  if (len_out) *len_out = len;
  c->i += len;
  return STAB_OK;
}

/* Skips an array's elements (type and count already read), checking the file holds them. */
static stab_status skip_array(cursor *c, uint32_t type, uint64_t count, uint64_t at, const char *key, int depth) {
  stab_status st;
  if (type >= N_VALUE_TYPES)
    return bad_at(c, at, "metadata '%s': unknown array element type %u", key, type);
  if (value_types[type].size) {
    if (count > left(c) / value_types[type].size)
      return bad_at(c, at, "metadata '%s': array of %llu %s is beyond the file (%llu bytes left)", key,
                    (unsigned long long)count, value_types[type].name, (unsigned long long)left(c));
    c->i += count * value_types[type].size;
    return STAB_OK;
  }
  if (type == STAB_GGUF_STRING) {
    if (count > left(c) / 8)
      return bad_at(c, at, "metadata '%s': array of %llu strings is beyond the file (%llu bytes left)", key,
                    (unsigned long long)count, (unsigned long long)left(c));
    for (uint64_t k = 0; k < count; k++)
      if ((st = read_string(c, NULL, NULL, "a string in a metadata array", 0)) != STAB_OK) return st;
    return STAB_OK;
  }
  /* arrays of arrays: each holds at least its type and count */
  if (depth >= ARRAY_NEST_MAX)
    return bad_at(c, at, "metadata '%s': arrays nested more than %d deep", key, ARRAY_NEST_MAX);
  if (count > left(c) / 12)
    return bad_at(c, at, "metadata '%s': array of %llu arrays is beyond the file (%llu bytes left)", key,
                  (unsigned long long)count, (unsigned long long)left(c));
  for (uint64_t k = 0; k < count; k++) {
    uint32_t t;
    uint64_t n, inner = c->i;
    if ((st = read_u32(c, &t, "an inner array's element type")) != STAB_OK ||
        (st = read_u64(c, &n, "an inner array's length")) != STAB_OK ||
        (st = skip_array(c, t, n, inner, key, depth + 1)) != STAB_OK)
      return st;
  }
  return STAB_OK;
}

/* One metadata pair into kv (key already read into kv->key). */
static stab_status read_value(cursor *c, stab_gguf_kv *kv) {
  uint32_t type;
  uint64_t at = c->i;
  stab_status st = read_u32(c, &type, "a metadata value type");
  if (st != STAB_OK) return st;
  if (type >= N_VALUE_TYPES) return bad_at(c, at, "metadata '%s': unknown value type %u", kv->key, type);
  kv->type = (stab_gguf_type)type;
  if (type == STAB_GGUF_STRING) {
    char *s;
    if ((st = read_string(c, &s, &kv->len, "a metadata string", 0)) != STAB_OK) return st;
    kv->s = s;
    return STAB_OK;
  }
  if (type == STAB_GGUF_ARRAY) {
    uint32_t et;
    if ((st = read_u32(c, &et, "a metadata array's element type")) != STAB_OK ||
        (st = read_u64(c, &kv->len, "a metadata array's length")) != STAB_OK)
      return st;
    kv->elem_type = (stab_gguf_type)et;
    return skip_array(c, et, kv->len, at, kv->key, 0);
  }
  unsigned size = value_types[type].size;
  if ((st = need(c, size, "a metadata value")) != STAB_OK) return st;
  uint64_t raw = le(c->p + c->i, size);
  c->i += size;
  switch (kv->type) {
  case STAB_GGUF_UINT8: case STAB_GGUF_UINT16: case STAB_GGUF_UINT32: case STAB_GGUF_UINT64:
    kv->u = raw, kv->f = (double)raw;
    break;
  case STAB_GGUF_INT8: kv->i = (int8_t)raw, kv->f = (double)kv->i; break;
  case STAB_GGUF_INT16: kv->i = (int16_t)raw, kv->f = (double)kv->i; break;
  case STAB_GGUF_INT32: kv->i = (int32_t)raw, kv->f = (double)kv->i; break;
  case STAB_GGUF_INT64: memcpy(&kv->i, &raw, 8), kv->f = (double)kv->i; break;
  case STAB_GGUF_FLOAT32: {
    uint32_t b = (uint32_t)raw;
    float x;
    memcpy(&x, &b, 4);
    kv->f = x;
    break;
  }
  case STAB_GGUF_FLOAT64: memcpy(&kv->f, &raw, 8); break;
  case STAB_GGUF_BOOL:
    if (raw > 1) return bad_at(c, at, "metadata '%s': bool value %u is neither 0 nor 1", kv->key, (unsigned)raw);
    kv->u = raw, kv->f = (double)raw;
    break;
  default: break;
  }
  return STAB_OK;
}


/* by_name[] of n names (get(i)), sorted; the first duplicate's two indices in *dup_a, *dup_b. */
static stab_status sort_names(const char *path, const char *const *names, size_t n, size_t **by_name, size_t *dup_a,
                              size_t *dup_b) {
  *dup_a = *dup_b = (size_t)-1;
  if (!n) return STAB_OK;
  stabi_name_ref *r = malloc(n * sizeof *r);
  if (!r || !(*by_name = malloc(n * sizeof **by_name))) {
    free(r);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for the name index", path);
  }
  for (size_t i = 0; i < n; i++) r[i] = (stabi_name_ref){names[i], i};
  qsort(r, n, sizeof *r, stabi_cmp_name_ref);
  for (size_t i = 0; i < n; i++) (*by_name)[i] = r[i].index;
  for (size_t i = 1; i < n && *dup_a == (size_t)-1; i++)
    if (!strcmp(r[i].name, r[i - 1].name)) {
      *dup_a = r[i - 1].index < r[i].index ? r[i - 1].index : r[i].index;
      *dup_b = r[i - 1].index < r[i].index ? r[i].index : r[i - 1].index;
    }
  free(r);
  return STAB_OK;
}

typedef struct {
  uint64_t offset, nbytes;
  size_t index;
} extent;
static int cmp_extent(const void *a, const void *b) {
  const extent *x = a, *y = b;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* One tensor info at the cursor into f->tensors[f->count]. */
static stab_status read_tensor_info(stab_gguf *f, cursor *c, size_t index) {
  stab_ckpt_tensor *t = &f->tensors[f->count];
  tensor_extra *x = &f->extra[f->count];
  memset(t, 0, sizeof *t);
  x->info_at = c->i;
  char what[64], *name = NULL;
  snprintf(what, sizeof what, "tensor %zu's name", index);
  stab_status st = read_string(c, &name, NULL, what, 1);
  if (st != STAB_OK) return st;
  t->name = name;
  f->count++; /* owned from here on: close frees the name */
  uint32_t nd, type;
  uint64_t at = c->i, ne[GGUF_MAX_DIMS], off;
  if ((st = read_u32(c, &nd, "a tensor's n_dims")) != STAB_OK) return st;
  if (nd == 0 || nd > GGUF_MAX_DIMS)
    return bad_at(c, at, "tensor '%s': n_dims %u (must be 1 to %d)", name, nd, GGUF_MAX_DIMS);
  /* The product of the non-zero sizes must fit 64 bits even when a zero makes the tensor
   * empty, so that the rule does not depend on the order the dimensions are multiplied in. */
  uint64_t nonzero = 1;
  int empty = 0;
  for (uint32_t d = 0; d < nd; d++) {
    at = c->i;
    if ((st = read_u64(c, &ne[d], "a tensor's ne[]")) != STAB_OK) return st;
    if (ne[d] > (uint64_t)INT64_MAX)
      return bad_at(c, at, "tensor '%s': ne[%u] is negative (%lld)", name, d, (long long)ne[d]);
    if (ne[d] && nonzero > UINT64_MAX / ne[d])
      return bad_at(c, at, "tensor '%s': the product of ne[] overflows 64 bits", name);
    if (ne[d]) nonzero *= ne[d];
    else empty = 1;
  }
  const uint64_t count = empty ? 0 : nonzero;
  at = c->i;
  if ((st = read_u32(c, &type, "a tensor's type")) != STAB_OK) return st;
  if (type >= N_GGML_TYPES || !ggml_types[type].name)
    return bad_at(c, at, "tensor '%s': unknown GGML type %u", name, type);
  const ggml_type_info *gt = &ggml_types[type];
  if (ne[0] % gt->block)
    return bad_at(c, at, "tensor '%s': ne[0] = %llu is not a multiple of %s's block of %u elements", name,
                  (unsigned long long)ne[0], gt->name, gt->block);
  uint64_t blocks = count / gt->block;
  if (blocks && blocks > UINT64_MAX / gt->bytes)
    return bad_at(c, at, "tensor '%s': its byte size overflows 64 bits", name);
  x->nbytes = blocks * gt->bytes;
  at = c->i;
  if ((st = read_u64(c, &off, "a tensor's offset")) != STAB_OK) return st;
  t->offset = off; /* relative to the data section until the layout is checked */
  t->dtype_name = gt->name;
  /* a quantized type is measurable when gguf_dequant.c decodes its blocks */
  t->dtype = gt->block > 1 && stabi_quant_find(gt->name) ? STAB_DTYPE_QUANT : gt->dtype;
  t->elem_size = gt->block == 1 ? gt->bytes : 0;
  t->ndim = nd;
  for (uint32_t d = 0; d < nd; d++) t->shape[d] = ne[nd - 1 - d];
  t->count = count;
  return STAB_OK;
}

/* Offsets aligned, ranges inside the data section, no two tensors sharing a byte, names unique. */
static stab_status check_layout(stab_gguf *f, const cursor *c) {
  uint64_t data_size = f->file.size - f->data_start;
  for (size_t i = 0; i < f->count; i++) {
    const stab_ckpt_tensor *t = &f->tensors[i];
    uint64_t nb = f->extra[i].nbytes, at = f->extra[i].info_at;
    if (t->offset % f->alignment)
      return bad_at(c, at, "tensor '%s': offset %llu is not a multiple of the alignment %llu", t->name,
                    (unsigned long long)t->offset, (unsigned long long)f->alignment);
    if (t->offset > data_size || nb > data_size - t->offset)
      return bad_at(c, at, "tensor '%s': offset %llu + %llu bytes is outside the data section of %llu bytes "
                    "(starting at byte %llu; truncated file?)", t->name, (unsigned long long)t->offset,
                    (unsigned long long)nb, (unsigned long long)data_size, (unsigned long long)f->data_start);
  }
  if (f->count) {
    extent *e = malloc(f->count * sizeof *e);
    if (!e) return stabi_fail(STAB_ENOMEM, "%s: out of memory for the tensor index", f->file.path);
    for (size_t i = 0; i < f->count; i++) e[i] = (extent){f->tensors[i].offset, f->extra[i].nbytes, i};
    qsort(e, f->count, sizeof *e, cmp_extent);
    /* zero-byte tensors hold no byte: they overlap nothing */
    size_t last = (size_t)-1;
    for (size_t k = 0; k < f->count; k++) {
      if (!e[k].nbytes) continue;
      if (last != (size_t)-1 && e[k].offset < e[last].offset + e[last].nbytes) {
        const stab_ckpt_tensor *x = &f->tensors[e[last].index], *y = &f->tensors[e[k].index];
        stab_status st = bad_at(c, f->extra[e[k].index].info_at,
                                "tensor '%s': data [%llu, %llu) overlaps tensor '%s' [%llu, %llu)", y->name,
                                (unsigned long long)e[k].offset, (unsigned long long)(e[k].offset + e[k].nbytes),
                                x->name, (unsigned long long)e[last].offset,
                                (unsigned long long)(e[last].offset + e[last].nbytes));
        free(e);
        return st;
      }
      last = k;
    }
    free(e);
  }
  const char **names = malloc((f->count + f->nkv + 1) * sizeof *names);
  if (!names) return stabi_fail(STAB_ENOMEM, "%s: out of memory for the name index", f->file.path);
  size_t da, db;
  for (size_t i = 0; i < f->count; i++) names[i] = f->tensors[i].name;
  stab_status st = sort_names(f->file.path, names, f->count, &f->by_name, &da, &db);
  if (st == STAB_OK && da != (size_t)-1)
    st = bad_at(c, f->extra[db].info_at, "duplicate tensor name '%s' (tensors %zu and %zu)", f->tensors[db].name, da, db);
  if (st == STAB_OK) {
    for (size_t i = 0; i < f->nkv; i++) names[i] = f->kv[i].key;
    st = sort_names(f->file.path, names, f->nkv, &f->kv_by_key, &da, &db);
    if (st == STAB_OK && da != (size_t)-1)
      st = bad_at(c, f->kv[db].offset, "duplicate metadata key '%s' (pairs %zu and %zu)", f->kv[db].key, da, db);
  }
  free(names);
  return st;
}

void stab_gguf_close(stab_gguf *f) {
  if (!f) return;
  stabi_mapped_close(&f->file);
  for (size_t i = 0; i < f->count; i++) free((char *)f->tensors[i].name);
  for (size_t i = 0; i < f->nkv; i++) free((char *)f->kv[i].key), free((char *)f->kv[i].s);
  free(f->tensors), free(f->extra), free(f->by_name);
  free(f->kv), free(f->kv_by_key);
  free(f);
}

/* Room for one more element in a doubling array (capped by what the file can hold). */
static int grow(void **p, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t c = *cap ? 2 * *cap : 16;
  void *q = realloc(*p, c * elem);
  if (!q) return -1;
  *p = q, *cap = c;
  return 0;
}

static stab_status parse(stab_gguf *f) {
  cursor c = {f->file.map, f->file.size, 0, f->file.path};
  stab_status st;
  if (memcmp(f->file.map, "GGUF", 4))
    return bad_at(&c, 0, "bad magic %02x %02x %02x %02x (a GGUF file starts with \"GGUF\")", f->file.map[0],
                  f->file.map[1], f->file.map[2], f->file.map[3]);
  c.i = 4;
  if ((st = read_u32(&c, &f->version, "the version")) != STAB_OK) return st;
  if (f->version != 2 && f->version != 3) {
    uint32_t swapped = __builtin_bswap32(f->version);
    if (swapped == 2 || swapped == 3)
      return bad_at(&c, 4, "version %u is a big-endian GGUF file, which is not supported", swapped);
    return bad_at(&c, 4, "version %u is not supported (2 and 3 are)", f->version);
  }
  uint64_t nt, nkv;
  if ((st = read_u64(&c, &nt, "the tensor count")) != STAB_OK ||
      (st = read_u64(&c, &nkv, "the metadata count")) != STAB_OK)
    return st;
  /* the smallest pair is 14 bytes (a one-byte key, a uint8), the smallest tensor info 33 (a
   * one-byte name, one dimension): counts the file cannot hold are refused before any
   * allocation, and arrays grow only as entries are actually read */
  if (nkv > left(&c) / 14)
    return bad_at(&c, 16, "metadata count %llu cannot fit in the %llu bytes after the header",
                  (unsigned long long)nkv, (unsigned long long)left(&c));
  if (nt > left(&c) / 33)
    return bad_at(&c, 8, "tensor count %llu cannot fit in the %llu bytes after the header", (unsigned long long)nt,
                  (unsigned long long)left(&c));
  f->alignment = GGUF_DEFAULT_ALIGNMENT;
  for (uint64_t k = 0; k < nkv; k++) {
    if (grow((void **)&f->kv, &f->kvcap, f->nkv, sizeof *f->kv))
      return stabi_fail(STAB_ENOMEM, "%s: out of memory for the metadata", f->file.path);
    stab_gguf_kv *kv = &f->kv[f->nkv];
    memset(kv, 0, sizeof *kv);
    kv->offset = c.i;
    char *key;
    if ((st = read_string(&c, &key, NULL, "a metadata key", 1)) != STAB_OK) return st;
    kv->key = key;
    f->nkv++;
    if ((st = read_value(&c, kv)) != STAB_OK) return st;
    if (!strcmp(key, "general.alignment")) {
      if (kv->type != STAB_GGUF_UINT32)
        return bad_at(&c, kv->offset, "general.alignment has type %s, not uint32", value_types[kv->type].name);
      if (kv->u == 0 || (kv->u & (kv->u - 1)))
        return bad_at(&c, kv->offset, "general.alignment is %llu, not a power of two", (unsigned long long)kv->u);
      f->alignment = kv->u;
    }
  }
  for (uint64_t k = 0; k < nt; k++) {
    tensor_extra *x = NULL;
    if (grow((void **)&f->tensors, &f->cap, f->count, sizeof *f->tensors) ||
        !(x = realloc(f->extra, f->cap * sizeof *f->extra)))
      return stabi_fail(STAB_ENOMEM, "%s: out of memory for the tensor index", f->file.path);
    f->extra = x;
    if ((st = read_tensor_info(f, &c, (size_t)k)) != STAB_OK) return st;
  }
  /* the data section starts at the next multiple of the alignment (none without tensors) */
  uint64_t pad = (f->alignment - c.i % f->alignment) % f->alignment;
  if (nt && pad > left(&c))
    return bad_at(&c, c.i, "the file ends inside the padding before the data section (%llu bytes left, %llu "
                  "needed to reach alignment %llu; truncated?)", (unsigned long long)left(&c),
                  (unsigned long long)pad, (unsigned long long)f->alignment);
  f->data_start = nt ? c.i + pad : c.i;
  if ((st = check_layout(f, &c)) != STAB_OK) return st;
  for (size_t i = 0; i < f->count; i++) {
    f->tensors[i].offset += f->data_start;
    f->tensors[i].data = f->file.map + f->tensors[i].offset;
  }
  return STAB_OK;
}

stab_status stab_gguf_open(const char *path, stab_gguf **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_gguf_open: NULL path or output");
  stab_gguf *f = calloc(1, sizeof *f);
  if (!f) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  stab_status st = stabi_mapped_open(&f->file, path, 24, "the 24-byte GGUF header");
  if (st == STAB_OK) st = parse(f);
  if (f->file.map && stabi_mapped_shrunk(&f->file, NULL) != STAB_OK) st = STAB_EIO; /* what parse said was of zeros */
  if (st != STAB_OK) {
    stab_gguf_close(f);
    return st;
  }
  *out = f;
  return STAB_OK;
}

uint32_t stab_gguf_version(const stab_gguf *f) { return f ? f->version : 0; }
uint64_t stab_gguf_alignment(const stab_gguf *f) { return f ? f->alignment : 0; }
size_t stab_gguf_count(const stab_gguf *f) { return f ? f->count : 0; }
uint64_t stabi_gguf_file_size(const stab_gguf *f) { return f ? f->file.size : 0; }

const stab_ckpt_tensor *stab_gguf_tensor(const stab_gguf *f, size_t index) {
  return f && index < f->count ? &f->tensors[index] : NULL;
}

/* Binary search of sorted indices by name (names via get). */
static size_t lookup(const size_t *sorted, size_t n, const char *name, const char *(*get)(const stab_gguf *, size_t),
                     const stab_gguf *f) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = strcmp(get(f, sorted[mid]), name);
    if (r == 0) return sorted[mid];
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return (size_t)-1;
}
static const char *tensor_name(const stab_gguf *f, size_t i) { return f->tensors[i].name; }
static const char *kv_key(const stab_gguf *f, size_t i) { return f->kv[i].key; }

stab_status stab_gguf_find(const stab_gguf *f, const char *name, size_t *index) {
  if (!f || !name) return stabi_fail(STAB_EINVAL, "stab_gguf_find: NULL reader or name");
  size_t i = lookup(f->by_name, f->count, name, tensor_name, f);
  if (i == (size_t)-1) return STAB_ENOTFOUND; /* an ordinary answer: last error untouched */
  if (index) *index = i;
  return STAB_OK;
}

size_t stab_gguf_metadata_count(const stab_gguf *f) { return f ? f->nkv : 0; }

const stab_gguf_kv *stab_gguf_metadata(const stab_gguf *f, size_t index) {
  return f && index < f->nkv ? &f->kv[index] : NULL;
}

const stab_gguf_kv *stab_gguf_find_metadata(const stab_gguf *f, const char *key) {
  if (!f || !key) return NULL;
  size_t i = lookup(f->kv_by_key, f->nkv, key, kv_key, f);
  return i == (size_t)-1 ? NULL : &f->kv[i];
}

stab_status stab_gguf_get_uint(const stab_gguf *f, const char *key, uint64_t *out) {
  const stab_gguf_kv *kv = stab_gguf_find_metadata(f, key);
  if (!kv) return STAB_ENOTFOUND;
  switch (kv->type) {
  case STAB_GGUF_UINT8: case STAB_GGUF_UINT16: case STAB_GGUF_UINT32: case STAB_GGUF_UINT64:
    if (out) *out = kv->u;
    return STAB_OK;
  case STAB_GGUF_INT8: case STAB_GGUF_INT16: case STAB_GGUF_INT32: case STAB_GGUF_INT64:
    if (kv->i < 0)
      return stabi_fail(STAB_EINVAL, "%s: metadata '%s' is negative (%lld)", f->file.path, key, (long long)kv->i);
    if (out) *out = (uint64_t)kv->i;
    return STAB_OK;
  default:
    return stabi_fail(STAB_EINVAL, "%s: metadata '%s' is a %s, not an integer", f->file.path, key,
                      value_types[kv->type].name);
  }
}

int stab_gguf_is(const char *path) { return stabi_input_starts_with(path, "GGUF", 4); }
