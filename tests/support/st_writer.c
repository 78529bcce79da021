/* st_writer.c — see st_writer.h. */
#include "st_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int stw_write_raw(const char *path, uint64_t hlen, const char *header, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  unsigned char len[8];
  for (int k = 0; k < 8; k++) len[k] = (unsigned char)(hlen >> (8 * k));
  int ok = fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, strlen(header), f) == strlen(header);
  if (data) ok = ok && fwrite(data, 1, n, f) == n;
  else
    for (size_t i = 0; ok && i < n; i++) ok = fputc(0, f) != EOF;
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

int stw_write(const char *path, const stw_tensor *t, size_t n, const char *metadata_json) {
  size_t cap = 256 + (metadata_json ? strlen(metadata_json) : 0), len = 0, total = 0;
  for (size_t i = 0; i < n; i++) cap += strlen(t[i].name) + 200 + 24 * t[i].ndim;
  char *h = malloc(cap + 8);
  if (!h) return -1;
  len += (size_t)sprintf(h + len, "{");
  if (metadata_json) len += (size_t)sprintf(h + len, "\"__metadata__\": {%s}", metadata_json);
  for (size_t i = 0; i < n; i++) {
    len += (size_t)sprintf(h + len, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": [", (i || metadata_json) ? ", " : "",
                           t[i].name, t[i].dtype);
    for (size_t d = 0; d < t[i].ndim; d++)
      len += (size_t)sprintf(h + len, "%s%llu", d ? ", " : "", (unsigned long long)t[i].shape[d]);
    len += (size_t)sprintf(h + len, "], \"data_offsets\": [%zu, %zu]}", total, total + t[i].nbytes);
    total += t[i].nbytes;
  }
  len += (size_t)sprintf(h + len, "}");
  while (len % 8) h[len++] = ' '; /* as the reference writer does: data 8-byte aligned */
  h[len] = '\0';
  unsigned char *data = malloc(total ? total : 1);
  if (!data) {
    free(h);
    return -1;
  }
  for (size_t i = 0, off = 0; i < n; off += t[i].nbytes, i++)
    if (t[i].nbytes) memcpy(data + off, t[i].data, t[i].nbytes);
  int rc = stw_write_raw(path, len, h, data, total);
  free(h);
  free(data);
  return rc;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

uint16_t stw_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

uint16_t stw_f16(float f) {
  uint32_t u = bits_of(f), sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {
    /* subnormal or zero in f16: value / 2^-24 rounded to nearest even, done in f64 exactly */
    float m;
    memcpy(&m, &a, sizeof m);
    double q = (double)m * 16777216.0, fl = (double)(long)q;
    long r = (long)fl;
    if (q - fl > 0.5 || (q - fl == 0.5 && (r & 1))) r++;
    return (uint16_t)(sign | (uint32_t)r); /* r == 1024 gives the smallest normal, correctly */
  }
  uint32_t e = ((a >> 23) - 112) << 10, mant = a & 0x7fffffu;
  uint32_t h = e | (mant >> 13), rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

void stw_encode16(const float *x, size_t n, int bf16, uint16_t *out) {
  for (size_t i = 0; i < n; i++) out[i] = bf16 ? stw_bf16(x[i]) : stw_f16(x[i]);
}
