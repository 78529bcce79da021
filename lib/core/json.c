/* json.c — a small strict JSON parser (RFC 8259) into a tree, for the JSON files that sit beside a
 * checkpoint: a Hugging Face config.json and a sharded model's index. The safetensors header keeps
 * its own parser, fixed to that header's schema; these files are free-form, so they get a tree.
 * Both decode strings with stabi_json_unescape, here.
 * Strict RFC 8259, but for the words NaN, Infinity and -Infinity, which Python's json module
 * writes for such floats and so appear in real config.json files.
 * Every failure names the file and the byte offset; every allocation is bounded by a small
 * multiple of the text's length, and nesting by JSON_MAX_DEPTH, so a hostile file cannot make the
 * parser allocate or recurse without bound. */
#include "core/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Deeper than any real config (Hugging Face's nest three or four levels); bounds the recursion. */
#define JSON_MAX_DEPTH 64

typedef struct {
  const char *p;
  size_t n, i;
  const char *path;
} cursor;

static stab_status bad(const cursor *c, const char *what) {
  return stabi_fail(STAB_EFORMAT, "%s: byte %zu: %s", c->path, c->i, what);
}

static void skip_ws(cursor *c) {
  while (c->i < c->n && (c->p[c->i] == ' ' || c->p[c->i] == '\t' || c->p[c->i] == '\n' || c->p[c->i] == '\r'))
    c->i++;
}

/* Four hex digits at text[*at] (fewer than 4 bytes left: STABI_JSTR_HEX_SHORT; a byte that is
 * no hex digit: STABI_JSTR_HEX_DIGIT, *at unmoved), *at past them. */
static stabi_jstr_fault read_hex4(const char *text, size_t n, size_t *at, unsigned *out) {
  if (n - *at < 4) return STABI_JSTR_HEX_SHORT;
  unsigned v = 0;
  for (int k = 0; k < 4; k++) {
    int h = stabi_hex_digit(text[*at + k]);
    if (h < 0) return STABI_JSTR_HEX_DIGIT;
    v = v * 16 + (unsigned)h;
  }
  *at += 4;
  *out = v;
  return STABI_JSTR_OK;
}

stabi_jstr_fault stabi_json_unescape(const char *text, size_t n, size_t *at, size_t end, char *out, size_t *len) {
  size_t i = *at, o = 0;
  stabi_jstr_fault f = STABI_JSTR_OK;
  while (i < end && !f) {
    unsigned char ch = (unsigned char)text[i];
    if (ch < 0x20) {
      f = STABI_JSTR_CONTROL;
      break;
    }
    if (ch != '\\') {
      size_t k = (size_t)stab_utf8_decode(text + i, end - i, NULL);
      if (!k) {
        f = STABI_JSTR_UTF8;
        break;
      }
      memcpy(out + o, text + i, k);
      o += k, i += k;
      continue;
    }
    char e = text[i + 1];
    i += 2;
    unsigned u, lo;
    switch (e) {
    case '"': out[o++] = '"'; break;
    case '\\': out[o++] = '\\'; break;
    case '/': out[o++] = '/'; break;
    case 'b': out[o++] = '\b'; break;
    case 'f': out[o++] = '\f'; break;
    case 'n': out[o++] = '\n'; break;
    case 'r': out[o++] = '\r'; break;
    case 't': out[o++] = '\t'; break;
    case 'u':
      if ((f = read_hex4(text, n, &i, &u)) != STABI_JSTR_OK) break;
      if (u >= 0xd800 && u <= 0xdbff) {
        /* a high surrogate must be followed by \u and a low one */
        if (i + 2 > end || text[i] != '\\' || text[i + 1] != 'u') f = STABI_JSTR_UNPAIRED;
        else if ((i += 2) + 4 > end) f = STABI_JSTR_LOW_CUT;
        else if (read_hex4(text, n, &i, &lo) != STABI_JSTR_OK) f = STABI_JSTR_LOW_DIGIT;
        else if (lo < 0xdc00 || lo > 0xdfff) f = STABI_JSTR_UNPAIRED;
        else u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
      } else if (u >= 0xdc00 && u <= 0xdfff) {
        f = STABI_JSTR_UNPAIRED;
      } else if (u == 0) {
        f = STABI_JSTR_NUL;
      }
      if (!f) o += stabi_utf8_encode(out + o, u); /* at most 4 bytes for the 6 or 12 read */
      break;
    default: i -= 2, f = STABI_JSTR_ESCAPE;
    }
  }
  out[o] = '\0';
  *at = i, *len = o;
  return f;
}

/* A string at the cursor (its opening quote), decoded into a new NUL-terminated buffer: valid
 * UTF-8, escapes decoded, no \u0000 (the strings are names and paths: C strings). The decoded
 * text is never longer than the raw one. */
static stab_status parse_string(cursor *c, char **out) {
  *out = NULL;
  size_t start = ++c->i, end = start, len;
  while (end < c->n && c->p[end] != '"') end += (c->p[end] == '\\' && end + 1 < c->n) ? 2 : 1;
  if (end >= c->n) return bad(c, "unterminated string");
  char *s = malloc(end - start + 1);
  if (!s) return stabi_fail(STAB_ENOMEM, "%s: out of memory for a string", c->path);
  const char *why = NULL;
  switch (stabi_json_unescape(c->p, c->n, &c->i, end, s, &len)) {
  case STABI_JSTR_OK: break;
  case STABI_JSTR_CONTROL: why = "control character in a string (must be escaped)"; break;
  case STABI_JSTR_UTF8: why = "invalid UTF-8 in a string"; break;
  case STABI_JSTR_ESCAPE: why = "invalid escape in a string"; break;
  case STABI_JSTR_HEX_SHORT: case STABI_JSTR_HEX_DIGIT: why = "bad \\u escape"; break;
  /* a low half cut short is said where its \u starts */
  case STABI_JSTR_LOW_CUT: c->i -= 2, why = "unpaired surrogate in \\u escape"; break;
  case STABI_JSTR_LOW_DIGIT: case STABI_JSTR_UNPAIRED: why = "unpaired surrogate in \\u escape"; break;
  case STABI_JSTR_NUL: why = "\\u0000 in a string"; break;
  }
  if (why) {
    free(s);
    return bad(c, why);
  }
  c->i = end + 1;
  *out = s;
  return STAB_OK;
}

/* A number as RFC 8259 writes it: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? ; an integer
 * without fraction or exponent that fits is also kept exactly (is_uint, u). */
static stab_status parse_number(cursor *c, stabi_json *v) {
  size_t start = c->i;
  int neg = 0, digits = 0, whole = 1;
  uint64_t u = 0;
  if (c->p[c->i] == '-') neg = 1, c->i++;
  if (c->i < c->n && c->p[c->i] == '0') c->i++, digits = 1;
  else
    for (; c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9'; c->i++, digits++) {
      unsigned d = (unsigned)(c->p[c->i] - '0');
      if (u > (UINT64_MAX - d) / 10) whole = 0;
      else u = u * 10 + d;
    }
  if (!digits) return bad(c, "a number without digits");
  if (c->i < c->n && c->p[c->i] == '.') {
    whole = 0, c->i++;
    size_t d0 = c->i;
    while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9') c->i++;
    if (c->i == d0) return bad(c, "no digits after a decimal point");
  }
  if (c->i < c->n && (c->p[c->i] == 'e' || c->p[c->i] == 'E')) {
    whole = 0, c->i++;
    if (c->i < c->n && (c->p[c->i] == '+' || c->p[c->i] == '-')) c->i++;
    size_t d0 = c->i;
    while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9') c->i++;
    if (c->i == d0) return bad(c, "no digits in an exponent");
  }
  char buf[64];
  size_t len = c->i - start;
  if (len >= sizeof buf) len = sizeof buf - 1; /* a longer literal: its value to double precision anyway */
  memcpy(buf, c->p + start, len);
  buf[len] = '\0';
  v->type = STABI_JSON_NUMBER;
  v->num = strtod(buf, NULL);
  v->is_uint = whole && !neg;
  v->u = v->is_uint ? u : 0;
  return STAB_OK;
}

static int literal(cursor *c, const char *word) {
  size_t n = strlen(word);
  if (c->n - c->i < n || memcmp(c->p + c->i, word, n)) return 0;
  c->i += n;
  return 1;
}

typedef struct {
  const char *key;
  size_t index;
} key_ref;
static int cmp_key(const void *a, const void *b) { return strcmp(((const key_ref *)a)->key, ((const key_ref *)b)->key); }

/* Duplicate keys are refused: a reader that took the first and one that took the last would
 * disagree about the same file. n log n, for an index of tens of thousands of tensors. */
static stab_status check_unique(cursor *c, const stabi_json *obj) {
  if (obj->n < 2) return STAB_OK;
  key_ref *r = malloc(obj->n * sizeof *r);
  if (!r) return stabi_fail(STAB_ENOMEM, "%s: out of memory", c->path);
  for (size_t i = 0; i < obj->n; i++) r[i] = (key_ref){obj->keys[i], i};
  qsort(r, obj->n, sizeof *r, cmp_key);
  stab_status st = STAB_OK;
  for (size_t i = 1; i < obj->n && st == STAB_OK; i++)
    if (!strcmp(r[i].key, r[i - 1].key)) {
      size_t at = obj->items[r[i].index > r[i - 1].index ? r[i].index : r[i - 1].index].at;
      st = stabi_fail(STAB_EFORMAT, "%s: byte %zu: key \"%.200s\" appears twice in one object", c->path, at, r[i].key);
    }
  free(r);
  return st;
}

static stab_status parse_value(cursor *c, stabi_json *v, int depth);

/* An array or an object at the cursor (its opening bracket). */
static stab_status parse_container(cursor *c, stabi_json *v, int depth) {
  int object = c->p[c->i] == '{';
  char close = object ? '}' : ']';
  v->type = object ? STABI_JSON_OBJECT : STABI_JSON_ARRAY;
  if (depth >= JSON_MAX_DEPTH) return bad(c, "nested more than 64 levels deep");
  c->i++;
  skip_ws(c);
  if (c->i < c->n && c->p[c->i] == close) {
    c->i++;
    return STAB_OK;
  }
  size_t cap = 0;
  stab_status st;
  for (;;) {
    if (v->n == cap) {
      size_t ncap = cap ? 2 * cap : 4;
      stabi_json *items = realloc(v->items, ncap * sizeof *items);
      if (items) v->items = items;
      char **keys = object && items ? realloc(v->keys, ncap * sizeof *keys) : NULL;
      if (keys) v->keys = keys;
      if (!items || (object && !keys)) return stabi_fail(STAB_ENOMEM, "%s: out of memory", c->path);
      cap = ncap;
    }
    skip_ws(c);
    if (object) {
      if (c->i >= c->n) return bad(c, "the text ends inside an object");
      if (c->p[c->i] != '"') return bad(c, "expected a key (a string)");
      if ((st = parse_string(c, &v->keys[v->n])) != STAB_OK) return st;
      skip_ws(c);
      if (c->i >= c->n || c->p[c->i] != ':') {
        free(v->keys[v->n]);
        return bad(c, "expected ':' after a key");
      }
      c->i++;
    }
    memset(&v->items[v->n], 0, sizeof v->items[v->n]);
    st = parse_value(c, &v->items[v->n], depth + 1);
    v->n++; /* counted even when it failed: freeing it frees what it got */
    if (st != STAB_OK) return st;
    skip_ws(c);
    if (c->i < c->n && c->p[c->i] == ',') {
      c->i++;
      continue;
    }
    if (c->i < c->n && c->p[c->i] == close) {
      c->i++;
      return object ? check_unique(c, v) : STAB_OK;
    }
    return bad(c, object ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
  }
}

static stab_status parse_value(cursor *c, stabi_json *v, int depth) {
  skip_ws(c);
  v->at = c->i;
  if (c->i >= c->n) return bad(c, "the text ends where a value was expected");
  char ch = c->p[c->i];
  if (ch == '{' || ch == '[') return parse_container(c, v, depth);
  if (ch == '"') {
    v->type = STABI_JSON_STRING;
    return parse_string(c, &v->s);
  }
  /* Python's json.dump writes a float's infinity or NaN as these words (allow_nan is its
   * default), so config.json files with them exist: taken as numbers, never as whole ones */
  if (literal(c, "NaN") || literal(c, "Infinity") || literal(c, "-Infinity")) {
    v->type = STABI_JSON_NUMBER;
    v->num = c->p[v->at] == 'N' ? NAN : c->p[v->at] == '-' ? -INFINITY : INFINITY;
    return STAB_OK;
  }
  if (ch == '-' || (ch >= '0' && ch <= '9')) return parse_number(c, v);
  if (literal(c, "true")) return v->type = STABI_JSON_TRUE, STAB_OK;
  if (literal(c, "false")) return v->type = STABI_JSON_FALSE, STAB_OK;
  if (literal(c, "null")) return v->type = STABI_JSON_NULL, STAB_OK;
  return bad(c, "not a JSON value");
}

void stabi_json_free(stabi_json *v) {
  if (!v) return;
  if (v->type == STABI_JSON_STRING) free(v->s);
  if (v->type == STABI_JSON_ARRAY || v->type == STABI_JSON_OBJECT) {
    for (size_t i = 0; i < v->n; i++) {
      stabi_json_free(&v->items[i]);
      if (v->keys) free(v->keys[i]);
    }
    free(v->items), free(v->keys);
  }
  memset(v, 0, sizeof *v);
}

stab_status stabi_json_parse(const char *text, size_t len, const char *path, stabi_json *out) {
  memset(out, 0, sizeof *out);
  cursor c = {text, len, 0, path};
  /* a UTF-8 byte order mark is not JSON, but editors write one: said as such */
  if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) return bad(&c, "a byte order mark (JSON text has none)");
  stab_status st = parse_value(&c, out, 0);
  if (st == STAB_OK) {
    skip_ws(&c);
    if (c.i != c.n) st = bad(&c, "text after the JSON value");
  }
  if (st != STAB_OK) stabi_json_free(out);
  return st;
}

stab_status stabi_json_read(const char *path, uint64_t max_bytes, stabi_json *out) {
  memset(out, 0, sizeof *out);
  int fd;
  uint64_t size;
  stab_status st = stab_input_open(path, max_bytes, &fd, &size);
  if (st != STAB_OK) return st;
  char *text = malloc(size ? (size_t)size : 1);
  if (!text) {
    close(fd);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for %llu bytes", path, (unsigned long long)size);
  }
  size_t got = 0;
  while (got < size) {
    ssize_t r = pread(fd, text + got, (size_t)size - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break; /* shrank since the open, or a read error: parsed as what was read */
    got += (size_t)r;
  }
  close(fd);
  if (!got) st = stabi_fail(STAB_EFORMAT, "%s: empty file (a JSON value was expected)", path);
  else st = stabi_json_parse(text, got, path, out);
  free(text);
  return st;
}

const stabi_json *stabi_json_get(const stabi_json *obj, const char *key) {
  if (!obj || obj->type != STABI_JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

const char *stabi_json_type_name(const stabi_json *v) {
  switch (v->type) {
  case STABI_JSON_NULL: return "null";
  case STABI_JSON_TRUE: case STABI_JSON_FALSE: return "a boolean";
  case STABI_JSON_NUMBER: return "a number";
  case STABI_JSON_STRING: return "a string";
  case STABI_JSON_ARRAY: return "an array";
  case STABI_JSON_OBJECT: return "an object";
  }
  return "?";
}
