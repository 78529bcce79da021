/* st_writer.h — a small safetensors writer for the tests: well-formed files from a list of
 * tensors, raw files from a header string (for the malformed cases), and f32 -> f16/bf16
 * encoders. Independent of the library's reader: it shares no code with it. */
#ifndef STAB_ST_WRITER_H
#define STAB_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  const char *name;    /* written as is: no escaping (tests use plain names) */
  const char *dtype;   /* "F32", "F16", "BF16", "I64" ... */
  size_t ndim;
  uint64_t shape[8];
  const void *data;    /* nbytes of little-endian elements */
  size_t nbytes;
} stw_tensor;

/* Writes the tensors in order, contiguous, with an optional __metadata__ whose inner JSON
 * (e.g. "\"k\": \"v\"") is given raw. Returns 0, or -1 on an I/O error. */
int stw_write(const char *path, const stw_tensor *t, size_t n, const char *metadata_json);

/* Writes an 8-byte length (hlen, normally strlen(header)), the header, then n data bytes
 * (zeros when data is NULL). Returns 0 or -1. */
int stw_write_raw(const char *path, uint64_t hlen, const char *header, const void *data, size_t n);

/* f32 -> IEEE binary16 / bfloat16, round to nearest even (NaN stays NaN). */
uint16_t stw_f16(float f);
uint16_t stw_bf16(float f);

/* Encodes n floats of x into out (n * 2 bytes) in the named 16-bit dtype. */
void stw_encode16(const float *x, size_t n, int bf16, uint16_t *out);

#endif
