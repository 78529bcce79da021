/* utf8.c — the one UTF-8 decoder and encoder of the library, strict as RFC 3629 has it: no overlong
 * forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no lone continuation bytes.
 * The checkpoint readers refuse names that fail it and the monitor refuses layer names, so
 * that every name the library hands out can be written into JSON or an HDF5 UTF-8 string. The
 * encoder and the hex digit serve the two JSON parsers' \u escapes (safetensors headers,
 * json.c). */
#include "core/core.h"

int stab_utf8_decode(const char *s, size_t n, uint32_t *cp) {
  if (!s || n == 0) return 0;
  const unsigned char *u = (const unsigned char *)s;
  const unsigned b = u[0];
  size_t len;
  uint32_t c, min;
  if (b < 0x80) {
    if (cp) *cp = b;
    return 1;
  }
  if ((b & 0xe0) == 0xc0) len = 2, c = b & 0x1f, min = 0x80;
  else if ((b & 0xf0) == 0xe0) len = 3, c = b & 0x0f, min = 0x800;
  else if ((b & 0xf8) == 0xf0) len = 4, c = b & 0x07, min = 0x10000;
  else return 0; /* a continuation byte, or 0xf8..0xff */
  if (len > n) return 0;
  for (size_t k = 1; k < len; k++) {
    if ((u[k] & 0xc0) != 0x80) return 0;
    c = (c << 6) | (u[k] & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  if (cp) *cp = c;
  return (int)len;
}

size_t stabi_utf8_invalid_at(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    int len = stab_utf8_decode(s + i, n - i, NULL);
    if (!len) return i;
    i += (size_t)len;
  }
  return (size_t)-1;
}

size_t stabi_utf8_encode(char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (char)(0xc0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (char)(0xe0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (char)(0xf0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f));
  return 4;
}

int stabi_hex_digit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}
