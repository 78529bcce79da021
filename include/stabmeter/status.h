/* stabmeter/status.h — what every fallible function returns (stab_status), the calling thread's
 * last failure in words, the optional sink for diagnostics, and the strict UTF-8 test the library
 * applies to every name it reads. Part of <stabmeter.h>, whose opening comment gives the
 * conventions every header follows. */
#ifndef STABMETER_STATUS_H
#define STABMETER_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Status codes                                                                        */

typedef enum {
  STAB_OK = 0,
  STAB_EINVAL = -1,   /* an argument is invalid: NULL where data is needed, unknown enum, bad tolerance */
  STAB_EDIM = -2,     /* a dimension is zero, inconsistent or so large that sizes overflow */
  STAB_ENOMEM = -3,   /* an allocation failed */
  STAB_ENOTFOUND = -4,/* no layer with that index or name */
  STAB_EEXIST = -5,   /* a layer with that name is already registered; or a file is already
                         where an output goes and was not to be replaced (stab_output_check) */
  STAB_ESTATE = -6,   /* a call out of order, e.g. an update measured with no snapshot taken */
  STAB_ELAPACK = -7,  /* LAPACK reported a failure (the message has its info code) */
  STAB_ERANGE = -8,   /* a value is out of its valid range (e.g. heads not dividing d_out) */
  STAB_EIO = -9,      /* a file could not be created, opened, sized, mapped, read or written (the
                         message names the path, with HDF5's or errno's own text) */
  STAB_EFORMAT = -10, /* a checkpoint or trace file breaks its format's rules (the message names
                         the file and the field, object or byte offset at fault) */
  STAB_EBUSY = -11    /* another process is writing that trace (it holds the trace's lock) or
                         changed it while this one was opening it; nothing of it was touched */
} stab_status;

/* A static, human-readable name of a status, "unknown status" for anything else. */
const char *stab_strerror(stab_status status);

/* The message of the last failure on the calling thread (thread-local, overwritten by
 * the next failure on that thread), e.g. "stab_linear_metrics: d_in is 0". Never NULL. */
const char *stab_last_error(void);

/* Optional sink for diagnostics (failures and non-finite-weight warnings naming the
 * layer). Called from the thread that hit them (a monitor step's layers are measured on the
 * library's pooled threads); must not call back into the library.
 * Pass NULL to remove. Process-wide; set it before other threads use the library. */
typedef void (*stab_message_fn)(void *user, const char *message);
void stab_set_message_handler(stab_message_fn fn, void *user);

/* Decodes the UTF-8 sequence at the start of s (at most n bytes): its length in bytes (1 to
 * 4) and, when cp is not NULL, its code point; 0 when s does not start with a valid one. Strict
 * (RFC 3629): overlong forms, surrogates (U+D800..U+DFFF) and code points above U+10FFFF are
 * invalid. It is the test the checkpoint readers apply to names and the monitor to layer names;
 * a program that prints strings from a file (metadata values) can use it to escape them. */
int stab_utf8_decode(const char *s, size_t n, uint32_t *cp);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_STATUS_H */
