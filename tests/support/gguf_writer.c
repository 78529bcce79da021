/* gguf_writer.c — see gguf_writer.h. */
#include "gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gw_put(gw_buf *b, const void *data, size_t n) {
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) abort(); /* a test helper: out of memory ends the test */
    b->p = p, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, data, n);
  b->n += n;
}

static void put_le(gw_buf *b, uint64_t v, unsigned bytes) {
  unsigned char x[8];
  for (unsigned k = 0; k < bytes; k++) x[k] = (unsigned char)(v >> (8 * k));
  gw_put(b, x, bytes);
}

void gw_u8(gw_buf *b, uint8_t v) { put_le(b, v, 1); }
void gw_u32(gw_buf *b, uint32_t v) { put_le(b, v, 4); }
void gw_u64(gw_buf *b, uint64_t v) { put_le(b, v, 8); }

void gw_str(gw_buf *b, const char *s) {
  gw_u64(b, strlen(s));
  gw_put(b, s, strlen(s));
}

void gw_pad(gw_buf *b, size_t align) {
  while (b->n % align) gw_u8(b, 0);
}

int gw_save(const gw_buf *b, const char *path) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(b->p, 1, b->n, f) == b->n;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

void gw_free(gw_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void gw_init(gw_file *f) {
  memset(f, 0, sizeof *f);
  f->alignment = 32;
}

static void key(gw_file *f, const char *k, uint32_t type) {
  gw_str(&f->kv, k);
  gw_u32(&f->kv, type);
  f->nkv++;
}

void gw_kv_u32(gw_file *f, const char *k, uint32_t v) {
  key(f, k, GW_UINT32), gw_u32(&f->kv, v);
  if (!strcmp(k, "general.alignment")) f->alignment = v;
}
void gw_kv_i32(gw_file *f, const char *k, int32_t v) { key(f, k, GW_INT32), put_le(&f->kv, (uint32_t)v, 4); }
void gw_kv_u64(gw_file *f, const char *k, uint64_t v) { key(f, k, GW_UINT64), gw_u64(&f->kv, v); }
void gw_kv_i64(gw_file *f, const char *k, int64_t v) { key(f, k, GW_INT64), gw_u64(&f->kv, (uint64_t)v); }
void gw_kv_u8(gw_file *f, const char *k, uint8_t v) { key(f, k, GW_UINT8), gw_u8(&f->kv, v); }
void gw_kv_i8(gw_file *f, const char *k, int8_t v) { key(f, k, GW_INT8), gw_u8(&f->kv, (uint8_t)v); }
void gw_kv_u16(gw_file *f, const char *k, uint16_t v) { key(f, k, GW_UINT16), put_le(&f->kv, v, 2); }
void gw_kv_i16(gw_file *f, const char *k, int16_t v) { key(f, k, GW_INT16), put_le(&f->kv, (uint16_t)v, 2); }
void gw_kv_bool(gw_file *f, const char *k, int v) { key(f, k, GW_BOOL), gw_u8(&f->kv, v ? 1 : 0); }
void gw_kv_str(gw_file *f, const char *k, const char *v) { key(f, k, GW_STRING), gw_str(&f->kv, v); }

void gw_kv_f32(gw_file *f, const char *k, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  key(f, k, GW_FLOAT32), gw_u32(&f->kv, u);
}

void gw_kv_f64(gw_file *f, const char *k, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  key(f, k, GW_FLOAT64), gw_u64(&f->kv, u);
}

void gw_kv_u32_array(gw_file *f, const char *k, const uint32_t *v, size_t n) {
  key(f, k, GW_ARRAY);
  gw_u32(&f->kv, GW_UINT32);
  gw_u64(&f->kv, n);
  for (size_t i = 0; i < n; i++) gw_u32(&f->kv, v[i]);
}

void gw_kv_str_array(gw_file *f, const char *k, const char *const *v, size_t n) {
  key(f, k, GW_ARRAY);
  gw_u32(&f->kv, GW_STRING);
  gw_u64(&f->kv, n);
  for (size_t i = 0; i < n; i++) gw_str(&f->kv, v[i]);
}

void gw_tensor(gw_file *f, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, const void *data,
               size_t nbytes) {
  gw_pad(&f->data, f->alignment);
  gw_str(&f->info, name);
  gw_u32(&f->info, n_dims);
  for (uint32_t d = 0; d < n_dims; d++) gw_u64(&f->info, ne[d]);
  gw_u32(&f->info, type);
  gw_u64(&f->info, f->data.n);
  if (data) gw_put(&f->data, data, nbytes);
  else
    for (size_t i = 0; i < nbytes; i++) gw_u8(&f->data, 0);
  f->nt++;
}

int gw_write(gw_file *f, const char *path) {
  gw_buf out = {0};
  gw_put(&out, "GGUF", 4);
  gw_u32(&out, 3);
  gw_u64(&out, f->nt);
  gw_u64(&out, f->nkv);
  gw_put(&out, f->kv.p, f->kv.n);
  gw_put(&out, f->info.p, f->info.n);
  if (f->nt) {
    gw_pad(&out, f->alignment);
    gw_put(&out, f->data.p, f->data.n);
  }
  int rc = gw_save(&out, path);
  gw_free(&out), gw_free(&f->kv), gw_free(&f->info), gw_free(&f->data);
  return rc;
}
