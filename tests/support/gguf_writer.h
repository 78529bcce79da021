/* gguf_writer.h — a small GGUF (v3) writer for the tests: a byte buffer with the format's
 * primitive encodings (for the malformed cases, written field by field) and, on top of it,
 * well-formed files from metadata pairs and tensors. Independent of the library's reader:
 * it shares no code with it. */
#ifndef STAB_GGUF_WRITER_H
#define STAB_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

/* GGML type numbers the tests use. */
enum { GW_F32 = 0, GW_F16 = 1, GW_Q4_0 = 2, GW_Q8_0 = 8, GW_Q4_K = 12, GW_F64 = 28, GW_BF16 = 30 };
/* Metadata value types. */
enum { GW_UINT8, GW_INT8, GW_UINT16, GW_INT16, GW_UINT32, GW_INT32, GW_FLOAT32, GW_BOOL, GW_STRING,
       GW_ARRAY, GW_UINT64, GW_INT64, GW_FLOAT64 };

/* A growing byte buffer; every put appends little-endian bytes. */
typedef struct {
  unsigned char *p;
  size_t n, cap;
} gw_buf;

void gw_put(gw_buf *b, const void *data, size_t n);
void gw_u8(gw_buf *b, uint8_t v);
void gw_u32(gw_buf *b, uint32_t v);
void gw_u64(gw_buf *b, uint64_t v);
void gw_str(gw_buf *b, const char *s);      /* uint64 length + bytes */
void gw_pad(gw_buf *b, size_t align);       /* zeros up to a multiple of align */
int gw_save(const gw_buf *b, const char *path); /* 0 or -1 */
void gw_free(gw_buf *b);

/* A well-formed file under construction. */
typedef struct {
  gw_buf kv, info, data;
  uint64_t nkv, nt;
  size_t alignment; /* 32 unless set by gw_kv_u32("general.alignment") */
} gw_file;

void gw_init(gw_file *f);
/* Metadata pairs (the key, the type, the value). */
void gw_kv_u32(gw_file *f, const char *key, uint32_t v);
void gw_kv_i32(gw_file *f, const char *key, int32_t v);
void gw_kv_u64(gw_file *f, const char *key, uint64_t v);
void gw_kv_i64(gw_file *f, const char *key, int64_t v);
void gw_kv_u8(gw_file *f, const char *key, uint8_t v);
void gw_kv_i8(gw_file *f, const char *key, int8_t v);
void gw_kv_u16(gw_file *f, const char *key, uint16_t v);
void gw_kv_i16(gw_file *f, const char *key, int16_t v);
void gw_kv_f32(gw_file *f, const char *key, float v);
void gw_kv_f64(gw_file *f, const char *key, double v);
void gw_kv_bool(gw_file *f, const char *key, int v);
void gw_kv_str(gw_file *f, const char *key, const char *v);
void gw_kv_u32_array(gw_file *f, const char *key, const uint32_t *v, size_t n);
void gw_kv_str_array(gw_file *f, const char *key, const char *const *v, size_t n);
/* A tensor with n_dims dimensions ne[] (ne[0] fastest) of GGML type `type`, nbytes of data,
 * placed at the next multiple of the alignment in the data section. */
void gw_tensor(gw_file *f, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
               const void *data, size_t nbytes);
/* Header, metadata, infos, padding, data. Returns 0 or -1; frees f either way. */
int gw_write(gw_file *f, const char *path);

#endif
