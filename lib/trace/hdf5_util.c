/* hdf5_util.c — calling HDF5 from the trace: one thread in it at a time in the whole process,
 * its own error printing off while we call it, its failures turned into this library's
 * messages, and the attributes (one string or integer each) the trace writes and reads. */
#include "trace/trace_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- one thread in HDF5 at a time ------------------------------------------------------ */

/* One thread in HDF5 at a time, in the whole process: HDF5 is thread-safe only when built so
 * (Debian 12's is, H5is_library_threadsafe says 1; a source build by default is not), and a
 * trace's writer thread writes while the caller opens or closes another trace. Held around
 * every HDF5 call of the trace writer; fork waits for it (after_fork, in trace.c), so that a
 * child never starts with it held by a writer thread it does not have. */
static pthread_mutex_t hdf5_lock = PTHREAD_MUTEX_INITIALIZER;

void stabi_trace_hdf5_lock_take(void) { pthread_mutex_lock(&hdf5_lock); }
void stabi_trace_hdf5_lock_give(void) { pthread_mutex_unlock(&hdf5_lock); }

/* ---- HDF5 errors ----------------------------------------------------------------------- */

/* The library never prints: HDF5's automatic error printing is off while we call it, and the
 * caller's own setting is back when we return. */

void stabi_trace_quiet_begin(quiet *q) {
  q->fn = NULL;
  q->data = NULL;
  H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

void stabi_trace_quiet_end(const quiet *q) { H5Eset_auto2(H5E_DEFAULT, q->fn, q->data); }

typedef struct {
  int n;
  char outer[160], inner[240];
} walk_state;

/* HDF5's file drivers describe a failed system call in one long line: "file write failed:
 * time = ..., filename = '<path>.<pid>.tmp', file descriptor = 3, errno = 28, error message =
 * 'No space left on device', buf = 0x..., total write size = 48, ...". The user gave neither
 * the temporary name nor cares for addresses and sizes: keep what failed and the system's
 * words ("file write failed: No space left on device"). Other messages are kept as they are. */
static void plain_words(char *s) {
  static const char em[] = "error message = '";
  char *m = strstr(s, em);
  if (!m) return;
  char why[128];
  const char *w = m + sizeof em - 1;
  size_t n = strcspn(w, "'");
  snprintf(why, sizeof why, "%.*s", (int)(n < sizeof why ? n : sizeof why - 1), w);
  /* what failed: the text before the first "key = value" detail */
  char *cut = s + strlen(s);
  static const char *const keys[] = {" time = ", " name = ", " filename = ", " errno = "};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    char *c = strstr(s, keys[k]);
    if (c && c < cut) cut = c;
  }
  while (cut > s && (cut[-1] == ' ' || cut[-1] == ',' || cut[-1] == ':')) cut--;
  char out[240];
  snprintf(out, sizeof out, "%.*s%s%s", (int)(cut - s), s, cut > s ? ": " : "", why);
  strcpy(s, out); /* out is at most as long as the buffer s lives in (240) */
}

/* Walked from the API call down: the first record says what was asked, the last (deepest) says
 * why it failed, e.g. the errno text of a file that cannot be created. */
static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
  walk_state *w = data;
  (void)n;
  const char *desc = e->desc && e->desc[0] ? e->desc : "(no description)";
  if (w->n == 0) snprintf(w->outer, sizeof w->outer, "%s", desc);
  snprintf(w->inner, sizeof w->inner, "%s", desc);
  for (char *c = w->inner; *c; c++) /* the file drivers' messages span lines */
    if (*c == '\n') *c = ' ';
  w->n++;
  return 0;
}

/* Records an HDF5 failure as STAB_EIO with the path, what failed (printf-style) and HDF5's own
 * message in words (plain_words). Called at the failure, before any other HDF5 call: each API
 * call clears the error stack on entry. */
__attribute__((format(printf, 3, 4)))
stab_status stabi_trace_h5fail(const char *who, const char *path, const char *fmt, ...) {
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  walk_state w;
  memset(&w, 0, sizeof w);
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
  if (w.n == 0) return stabi_fail(STAB_EIO, "%s: %s: %s (no HDF5 message)", who, path, what);
  plain_words(w.inner);
  if (w.n == 1) return stabi_fail(STAB_EIO, "%s: %s: %s: %s", who, path, what, w.inner);
  return stabi_fail(STAB_EIO, "%s: %s: %s: %s (%s)", who, path, what, w.inner, w.outer);
}

/* ---- attributes ------------------------------------------------------------------------ */

hid_t stabi_trace_string_type(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return t;
  if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
    H5Tclose(t);
    return H5I_INVALID_HID;
  }
  return t;
}

/* An attribute holding one value of type `mem` (stored as `file_type`). Returns < 0 on failure
 * with HDF5's message still on the error stack. */
static herr_t put_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem, const void *value) {
  herr_t rc = -1;
  hid_t space = H5I_INVALID_HID, a = H5I_INVALID_HID;
  if ((space = H5Screate(H5S_SCALAR)) < 0) goto out;
  if ((a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto out;
  if (H5Awrite(a, mem, value) < 0) goto out;
  rc = 0;
out:
  /* On failure, closing would clear the error stack before stabi_trace_h5fail reads it. */
  if (rc == 0) {
    rc = H5Aclose(a);
    if (H5Sclose(space) < 0) rc = -1;
  }
  return rc;
}

herr_t stabi_trace_put_string(hid_t obj, const char *name, hid_t str, const char *value) {
  return put_attr(obj, name, str, str, &value);
}

herr_t stabi_trace_put_int(hid_t obj, const char *name, int64_t value) {
  return put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

herr_t stabi_trace_set_string(hid_t obj, const char *name, hid_t str, const char *value) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return -1;
  return stabi_trace_put_string(obj, name, str, value);
}

/* Reads a string attribute into buf (truncated to len). Returns < 0 when missing or unreadable. */
herr_t stabi_trace_get_string(hid_t obj, const char *name, hid_t str, char *buf, size_t len) {
  herr_t rc = -1;
  char *value = NULL;
  buf[0] = '\0';
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  if (H5Aread(a, str, &value) >= 0 && value) {
    snprintf(buf, len, "%s", value);
    H5free_memory(value);
    rc = 0;
  }
  H5Aclose(a);
  return rc;
}

herr_t stabi_trace_get_int(hid_t obj, const char *name, int64_t *value) {
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  herr_t rc = H5Aread(a, H5T_NATIVE_INT64, value);
  H5Aclose(a);
  return rc;
}
