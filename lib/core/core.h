/* core.h — the library's basics, shared by every wing; never installed: recording failures and
 * warnings, checked arithmetic, argument and name checks, UTF-8, input files and the guarded
 * mappings of checkpoint files, and the JSON reader. Internal functions are prefixed stabi_ so
 * that only stab_* names are exported.
 * The wings of lib/, each including only the ones below it:
 *   core <- engine (stored rows, passes, spectral norms) <- metrics (a layer, the monitor)
 *        <- trace, checkpoint, model <- probe <- mpi (libstabmeter_mpi). */
#ifndef STABMETER_CORE_H
#define STABMETER_CORE_H

#include "stabmeter.h"

#include <math.h>
#include <stddef.h>

/* Records a failure for stab_last_error() and the message handler; returns status so that
 * a caller can write `return stabi_fail(STAB_EDIM, "...", ...);`. */
stab_status stabi_fail(stab_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Hands a warning (not a failure) to the message handler only. */
void stabi_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Makes msg the calling thread's stab_last_error() without calling the message handler: a
 * failure met on a pooled thread (and already handed to the handler there) reported again on
 * the thread that asked for the work. */
void stabi_set_last_error(const char *msg);

/* max that lets NaN win, unlike fmax: a NaN anywhere must reach the result. */
static inline double stabi_nanmax(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  return a > b ? a : b;
}

/* 1 when a * b fits in size_t. */
static inline int stabi_mul_fits(size_t a, size_t b) { return a == 0 || b <= (size_t)-1 / a; }

/* a * b, or 0 when it overflows (callers pass sizes already known to be > 0). */
static inline size_t stabi_mul(size_t a, size_t b) { return stabi_mul_fits(a, b) ? a * b : 0; }

/* ---- argument checks shared by every public entry point (validate.c, utf8.c) ---- */

/* A matrix of rows x cols floats with row stride *ld (0 means cols, written back): both sizes
 * > 0, ld >= cols, and the span (rows - 1) * ld + cols addressable as floats (no overflow of
 * size_t, at most PTRDIFF_MAX bytes). who names the function, what the argument ("a", "layer
 * 'fc1'") in the message. span may be NULL. */
stab_status stabi_check_extent(const char *who, const char *what, size_t rows, size_t cols,
                               size_t *ld, size_t *span);
/* The same, and a not NULL (STAB_EINVAL). */
stab_status stabi_check_matrix(const char *who, const char *what, const float *a, size_t rows,
                               size_t cols, size_t *ld);
/* Spectral parameters within the bounds of stabmeter.h; who names the caller in the message. */
stab_status stabi_spectral_check(const stab_spectral_params *p, const char *who);
/* Lanczos basis vectors of validated parameters: krylov_dim rounded up to even, at least 4. */
size_t stabi_krylov_basis(const stab_spectral_params *p);
/* Offset of the first byte of s[0..n) that does not start a valid UTF-8 sequence (see
 * stab_utf8_decode), or (size_t)-1 when all n bytes are valid. */
size_t stabi_utf8_invalid_at(const char *s, size_t n);
/* Code point cp (at most U+10FFFF, not a surrogate: the caller checked) as UTF-8 into o (room
 * for 4 bytes); the bytes written. */
size_t stabi_utf8_encode(char *o, uint32_t cp);
/* The value of hex digit ch (0-9, a-f, A-F), or -1. */
int stabi_hex_digit(char ch);

/* ---- input files (input_file.c) ---- */

/* 1 when path is a regular file (opened as stab_input_open does) whose first n (<= 16) bytes
 * are magic, else 0. Records no error: it is a format sniff, and the open that follows reports. */
int stabi_input_starts_with(const char *path, const void *magic, size_t n);

/* ---- checkpoint files (mapped_file.c) ---- */

/* A checkpoint file as its reader holds it: the path every message names, and the whole
 * file mapped read-only. */
typedef struct {
  char *path;         /* the caller's path, copied */
  unsigned char *map; /* the file's size bytes, read-only */
  uint64_t size;      /* bytes */
  _Atomic int *tripped; /* the input guard's mark: non-zero once a read ran past the file's end
                         (the file shrank under the mapping); NULL: unguarded */
} stabi_mapped;

/* Copies path into m and maps the regular file there, whole. A file shorter than min_bytes is
 * STAB_EFORMAT, "fewer than <what>"; open, stat or map failures are STAB_EIO with errno's
 * text; no memory for the copy is STAB_ENOMEM. On failure m holds nothing. */
stab_status stabi_mapped_open(stabi_mapped *m, const char *path, uint64_t min_bytes, const char *what);
/* Unmaps and frees what m holds, leaving it empty; an empty m (zeroed, or closed) is fine. */
void stabi_mapped_close(stabi_mapped *m);
/* The input guard (mapped_file.c): every mapping of stabi_mapped_open is guarded against the
 * file shrinking under it; a read past the new end reads zeros and marks the mapping. STAB_OK,
 * or STAB_EIO "[who: ]path: the file shrank while being read" once it is marked. */
stab_status stabi_mapped_shrunk(const stabi_mapped *m, const char *who);
/* The path of a guarded mapping overlapping [p, p + len) that a read ran past the end of, else
 * NULL (one atomic load while no file ever shrank). The path lives as long as the mapping. */
const char *stabi_guard_tripped_in(const void *p, size_t len);
/* STAB_OK, or STAB_EIO "[who: ]path: the file shrank while being read" for that mapping. */
stab_status stabi_guard_check(const void *p, size_t len, const char *who);
/* How many reads ran past a guarded file's end so far, in the whole process. */
unsigned long stabi_guard_trips(void);

/* ---- JSON files beside a checkpoint: config.json, a sharded model's index (json.c) ---- */

/* What is wrong with a JSON string's text (stabi_json_unescape); each parser words its own
 * message and says where from the offset it is given. */
typedef enum {
  STABI_JSTR_OK = 0,
  STABI_JSTR_CONTROL,    /* a raw byte below 0x20 (must be escaped) */
  STABI_JSTR_UTF8,       /* invalid UTF-8 */
  STABI_JSTR_ESCAPE,     /* a backslash and a byte that is no escape */
  STABI_JSTR_HEX_SHORT,  /* \u with fewer than 4 bytes left in the whole text */
  STABI_JSTR_HEX_DIGIT,  /* \u and a byte among the next 4 that is no hex digit */
  STABI_JSTR_LOW_CUT,    /* a high surrogate's \u low half with fewer than 4 bytes left in the
                            string (offset: after that \u) */
  STABI_JSTR_LOW_DIGIT,  /* a high surrogate's \u low half with a byte that is no hex digit */
  STABI_JSTR_UNPAIRED,   /* a surrogate without its pair */
  STABI_JSTR_NUL         /* \u0000: names and paths are C strings */
} stabi_jstr_fault;

/* The one JSON string decoder, of the config/index parser (json.c) and the safetensors header's
 * (lib/checkpoint/safetensors.c): the string's bytes text[*at, end) (after its opening quote, up
 * to its closing one; text holds n bytes in all, end < n) decoded into out (end - *at + 1 bytes:
 * the decoded text is never longer than the raw one), escapes and \u surrogate pairs decoded,
 * valid UTF-8 required, NUL-terminated, its length into *len. STABI_JSTR_OK with *at at end; or
 * the fault, *at the byte offset where it lies (a bad escape: its backslash; a \u escape's
 * digits: where they start; a surrogate unpaired or \u0000: after its digits; a raw byte: it). */
stabi_jstr_fault stabi_json_unescape(const char *text, size_t n, size_t *at, size_t end, char *out, size_t *len);


typedef enum {
  STABI_JSON_NULL, STABI_JSON_FALSE, STABI_JSON_TRUE, STABI_JSON_NUMBER, STABI_JSON_STRING,
  STABI_JSON_ARRAY, STABI_JSON_OBJECT
} stabi_json_type;

/* One JSON value; a tree owns its children. Kept small (48 bytes): a hostile file of N bytes
 * can hold N / 2 values, and the tree must stay within a small multiple of the file. */
typedef struct stabi_json {
  stabi_json_type type;
  int is_uint;               /* NUMBER written as a non-negative integer that fits 64 bits: u */
  size_t at;                 /* byte offset of the value in the text, for messages */
  size_t n;                  /* ARRAY, OBJECT: members */
  uint64_t u;
  union {
    double num;              /* NUMBER */
    char *s;                 /* STRING, decoded (valid UTF-8, no NUL) */
    struct {
      struct stabi_json *items; /* ARRAY, OBJECT: (n) values */
      char **keys;              /* OBJECT: (n) keys, decoded, unique */
    };
  };
} stabi_json;

/* Parses len bytes of text (path names it in messages) into *out: strict RFC 8259 (plus Python's
 * NaN, Infinity and -Infinity, as numbers), strings valid
 * UTF-8 without \u0000, no duplicate key in an object, nesting at most 64 deep. STAB_EFORMAT
 * naming path and the byte offset; STAB_ENOMEM. On failure *out holds nothing. */
stab_status stabi_json_parse(const char *text, size_t len, const char *path, stabi_json *out);
/* Reads the regular file at path (at most max_bytes; see stab_input_open) and parses it. */
stab_status stabi_json_read(const char *path, uint64_t max_bytes, stabi_json *out);
/* Frees what a parse allocated; a zeroed value is fine. */
void stabi_json_free(stabi_json *v);
/* The member key of an object, or NULL (not an object, or no such key). */
const stabi_json *stabi_json_get(const stabi_json *obj, const char *key);
/* "a string", "a number", ... for messages. */
const char *stabi_json_type_name(const stabi_json *v);

#endif /* STABMETER_CORE_H */
