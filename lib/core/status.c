/* status.c — error codes, the last-error message of each thread, the optional message
 * handler, and the version. */
#include "core/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512] = "no error";
static stab_message_fn message_fn;
static void *message_user;

const char *stab_version(void) { return STAB_VERSION_STRING; }

const char *stab_strerror(stab_status status) {
  switch (status) {
  case STAB_OK: return "success";
  case STAB_EINVAL: return "invalid argument";
  case STAB_EDIM: return "invalid dimensions";
  case STAB_ENOMEM: return "out of memory";
  case STAB_ENOTFOUND: return "no such layer";
  case STAB_EEXIST: return "already exists (a layer, or a file where an output goes)";
  case STAB_ESTATE: return "call out of order";
  case STAB_ELAPACK: return "LAPACK failure";
  case STAB_ERANGE: return "value out of range";
  case STAB_EIO: return "file input/output error";
  case STAB_EFORMAT: return "malformed file";
  case STAB_EBUSY: return "file held by another writer";
  }
  return "unknown status";
}

const char *stab_last_error(void) { return last_error; }

void stab_set_message_handler(stab_message_fn fn, void *user) {
  message_fn = fn;
  message_user = user;
}

stab_status stabi_fail(stab_status status, const char *fmt, ...) {
  va_list ap;
  /* formatted aside first: a message may quote the last one (stab_last_error() as an argument),
   * and vsnprintf into the buffer it reads from is undefined (glibc leaves it empty) */
  char text[sizeof last_error];
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  memcpy(last_error, text, sizeof text);
  if (message_fn) message_fn(message_user, last_error);
  return status;
}

void stabi_set_last_error(const char *msg) { snprintf(last_error, sizeof last_error, "%s", msg); }

void stabi_warn(const char *fmt, ...) {
  if (!message_fn) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  message_fn(message_user, buf);
}
