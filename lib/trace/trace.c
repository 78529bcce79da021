/* trace.c — the HDF5 trace writer: every measured step of a monitor appended as one row of
 * extendable datasets (docs/manual/trace.md), one per metric, indexed by step and layer, so that the
 * file's objects, and what opening, flushing and closing it costs, grow with the metrics and
 * not with the layers. Written in SWMR mode so that a reader can follow the file while training
 * runs and a killed writer loses nothing it had flushed. /step and the layer names are dimension
 * scales and every dataset says its units, so that netCDF tools (xarray, ncdump) read the trace
 * as labelled data. Traces of formats 1 to 3 (a group of one-dimensional datasets per layer)
 * appended to are rewritten in this layout first (migrate.c).
 *
 * This file is the handle: opening a trace (a new one, or an existing one appended to), the
 * calls on it, closing it, and what a forked child may do with its copy. It calls down into the
 * files of one concern each (trace_internal.h lists them), and none of them calls back. */
#include "trace/trace_internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Rows are staged in memory and reach the file only at a flush: one write of many rows per
 * dataset costs little more than one of a row, and rows written but not flushed could reach
 * the disk in any order when HDF5 evicts its cache. A flush comes at least this often. No
 * more than a chunk, so that the rows of one flush start at most one new chunk per dataset
 * (reserve_bytes, in reserve.c, counts on it). */
enum { STAGE_ROWS = 256 };

/* The longest flush_seconds accepted (a day): beyond it a kill loses more than anyone means to
 * keep in memory only; 0 turns the clock off instead. */
enum { FLUSH_SECONDS_MAX = 86400 };

/* An open that finds its path changed under it starts again (lock.c's protocol) this many
 * times, then fails with STAB_EBUSY. */
enum { OPEN_ATTEMPTS = 3 };

/* ---- a forked child -------------------------------------------------------------------- */

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* Every trace open in this process (guarded by hdf5_lock, hdf5_util.c), for in_child. */
static stab_trace *open_traces;

/* In a forked child, at once: HDF5 there holds a copy of each open trace's state, which its
 * atexit handler would write over the parent's file when the child exits (a trace the parent
 * went on appending to was left unreadable, "addr overflow"). Each HDF5 descriptor now names
 * /dev/null, and the child's copy of the lock's descriptor is closed; only system calls here. */
static void in_child(void) {
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (stab_trace *t = open_traces; t; t = t->next_open) {
    if (t->h5_fd >= 0 && null_fd >= 0) dup2(null_fd, t->h5_fd);
    if (t->lock_fd >= 0) close(t->lock_fd);
    t->lock_fd = -1;
  }
  if (null_fd >= 0) close(null_fd);
  open_traces = NULL; /* none is this process's */
  stabi_trace_hdf5_lock_give();
}

/* Registered at the first open (fork_once): fork waits for hdf5_lock (hdf5_util.c), so that a
 * child never starts with it held by a writer thread it does not have, and the child lets go of
 * the parent's traces (in_child). */
static void after_fork(void) { pthread_atfork(stabi_trace_hdf5_lock_take, stabi_trace_hdf5_lock_give, in_child); }

/* A child forked from the process that opened t holds a copy of t: the same file, lock and
 * HDF5 state, sync objects perhaps held by a writer thread it does not have. The trace is the
 * parent's: in the child every call but stab_trace_close fails with this, and the close frees
 * the child's memory only (destroy). */
static stab_status foreign(const stab_trace *t, const char *who) {
  if (t->pid == getpid()) return STAB_OK;
  return stabi_fail(STAB_ESTATE, "%s: %s: the trace belongs to process %ld, which opened it; this process (%ld) "
                    "was forked from it and may only close its copy", who, t->path, (long)t->pid, (long)getpid());
}

stab_trace_params stab_trace_default_params(void) {
  stab_trace_params p;
  memset(&p, 0, sizeof p);
  p.flush_every = 0;
  p.flush_seconds = 1.0;
  p.on_error = STAB_TRACE_STOP;
  return p;
}

/* ---- the handle ------------------------------------------------------------------------ */

/* Closes every HDF5 object of t's file (whatever was opened), gives back the disk space
 * reserved and drops the lock. who NULL: silently (after another failure); else the first
 * failing close becomes STAB_EIO. t stays allocated, ready for another open attempt. */
static stab_status close_file(stab_trace *t, const char *who) {
  stab_status st = STAB_OK;
  if (t->cols)
    for (size_t k = 0; k < t->n_cols; k++) {
      if (t->cols[k].d >= 0 && H5Dclose(t->cols[k].d) < 0 && who && st == STAB_OK)
        st = stabi_trace_h5fail(who, t->path, "cannot close a dataset");
      t->cols[k].d = H5I_INVALID_HID;
    }
  /* Closing the file flushes it. */
  if (t->file >= 0 && H5Fclose(t->file) < 0 && who && st == STAB_OK)
    st = stabi_trace_h5fail(who, t->path, "cannot close the file");
  t->file = H5I_INVALID_HID;
  stabi_trace_unreserve(t);
  if (t->lock_fd >= 0) close(t->lock_fd); /* after the close: the file is complete */
  t->lock_fd = -1;
  t->written = 0;
  t->has_last = 0;
  return st;
}

/* Closes t's file and frees t; in a forked child (foreign) frees t only: the file, its lock
 * and HDF5's state are the parent's. */
static stab_status destroy(stab_trace *t, const char *who) {
  if (!t) return STAB_OK;
  if (t->pid != getpid()) {
    if (t->lock_fd >= 0) close(t->lock_fd); /* the child's copy (in_child closed it already) */
    t->lock_fd = -1;
    t->file = H5I_INVALID_HID;
    t->cols = (free(t->cols), NULL); /* the parent's dataset ids: none is closed here */
  }
  stab_status st = close_file(t, who);
  free(t->cols);
  free(t->head_first);
  free(t->reference);
  free(t->stage);
  free(t->stage_step);
  free(t->out);
  free(t->out_step);
  free(t->path);
  free(t);
  return st;
}

/* ---- opening --------------------------------------------------------------------------- */

/* 1 when the file fd starts with HDF5's signature, where this library writes it. */
static int hdf5_signature(int fd) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char head[8];
  return pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && memcmp(head, sig, sizeof sig) == 0;
}

/* An existing trace, to append to: locked (see the protocol, lock.c), then opened by HDF5. A file that
 * is not HDF5 at all (a checkpoint given as the trace, say) is refused before anything, the
 * disk reserve included, touches it. */
static stab_status open_existing(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, char **tmp,
                                  int *again) {
  stab_status st = stabi_trace_lock_path(b->who, b->path, "append to", &t->lock_fd, again);
  if (st != STAB_OK || t->lock_fd < 0) return st;
  if (!hdf5_signature(t->lock_fd))
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (not an HDF5 file): nothing was written to it",
                      b->who, b->path);
  if ((st = stabi_trace_open_disk(t, b, fapl, gnames, b->path)) != STAB_OK) return st;
  if (t->file_version < FORMAT_VERSION) { /* an older format: rewritten as this one (migrate.c) */
    const hid_t old = t->file;
    const int old_fd = t->lock_fd;
    t->file = H5I_INVALID_HID, t->lock_fd = -1;
    stabi_trace_unreserve(&(stab_trace){.lock_fd = old_fd, .reserved = t->reserved});
    t->reserved = 0;
    st = stabi_trace_create_new(t, b, fapl, gnames, tmp, again, old, t->file_version);
    H5Fclose(old);
    close(old_fd); /* after the rename: only now may another writer lock the old file, and find it replaced */
    return st;
  }
  if (H5Fstart_swmr_write(t->file) < 0) return stabi_trace_h5fail(b->who, b->path, "cannot start SWMR writing");
  return STAB_OK;
}

stab_status stab_trace_open(const char *path, const stab_monitor *m, const stab_trace_params *params,
                            stab_trace **out) {
  static const char who[] = "stab_trace_open";
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!path || !path[0] || !m)
    return stabi_fail(STAB_EINVAL, "%s: %s", who, !m ? "monitor is NULL" : "path is NULL or empty");
  stab_trace_params p = params ? *params : stab_trace_default_params();
  if (p.flush_every < 0) return stabi_fail(STAB_EINVAL, "%s: flush_every is %d, must be >= 0", who, p.flush_every);
  if (!(p.flush_seconds >= 0 && p.flush_seconds <= FLUSH_SECONDS_MAX)) /* NaN fails too */
    return stabi_fail(STAB_EINVAL, "%s: flush_seconds is %g, must be 0 .. %g", who, p.flush_seconds,
                      (double)FLUSH_SECONDS_MAX);
  if (p.on_error != STAB_TRACE_STOP && p.on_error != STAB_TRACE_CONTINUE)
    return stabi_fail(STAB_EINVAL, "%s: unknown on_error %d", who, (int)p.on_error);
  if (p.append != STAB_OUTPUT_REPLACE && p.append != STAB_OUTPUT_APPEND && p.append != STAB_OUTPUT_NEW)
    return stabi_fail(STAB_EINVAL, "%s: append is %d: 0 (replace), 1 (append) or 2 (new only)", who, p.append);
  stab_status st = stabi_trace_check_names(who, "scalars", p.scalars, p.n_scalars, 0);
  if (st == STAB_OK) st = stabi_trace_check_names(who, "layer_extras", p.layer_extras, p.n_layer_extras, 1);
  if (st != STAB_OK) return st;

  const size_t n_layers = stab_monitor_layer_count(m);
  stab_trace *t = calloc(1, sizeof *t);
  char **gnames = n_layers ? calloc(n_layers, sizeof *gnames) : NULL;
  stabi_sharing share;
  memset(&share, 0, sizeof share);
  builder b = {who, path, &p, H5I_INVALID_HID, &share};
  hid_t fapl = H5I_INVALID_HID;
  char *tmp = NULL;
  quiet q;
  pthread_once(&fork_once, after_fork);
  stabi_trace_hdf5_lock_take();
  stabi_trace_quiet_begin(&q);
  if (!t || (n_layers && !gnames)) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  t->file = H5I_INVALID_HID;
  t->lock_fd = -1;
  t->pid = getpid();
  t->h5_fd = -1;
  t->m = m;
  t->n_layers = n_layers;
  t->n_scalars = p.n_scalars;
  t->n_extras = p.n_layer_extras;
  t->on_error = p.on_error;
  t->path = malloc(strlen(path) + 1);
  t->head_first = malloc((n_layers ? n_layers : 1) * sizeof *t->head_first);
  t->reference = malloc((n_layers ? n_layers : 1) * sizeof *t->reference);
  if (!t->path || !t->head_first || !t->reference) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  strcpy(t->path, path);
  for (size_t i = 0; i < n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(m, i);
    t->head_first[i] = t->n_heads;
    t->n_heads += stabi_trace_layer_heads(l);
    if (!(gnames[i] = stabi_trace_group_name(l->name))) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
      goto out;
    }
    if (strcmp(gnames[i], ".") == 0) {
      st = stabi_fail(STAB_EINVAL, "%s: layer '%s' cannot be a layer name in the trace", who, l->name);
      goto out;
    }
  }
  if ((st = stabi_trace_check_unique(who, m, gnames, n_layers)) != STAB_OK) goto out;
  /* the columns: see COL_STEP */
  t->first_copy = FIRST_SCALAR + p.n_scalars;
  t->first_metric = t->first_copy + 2;
  t->head_col = t->n_heads ? t->first_metric + N_METRICS + N_RATIOS : 0;
  t->first_extra = t->first_metric + N_METRICS + N_RATIOS + (t->n_heads ? 1 : 0);
  t->n_cols = t->first_extra + p.n_layer_extras;
  t->cols = malloc(t->n_cols * sizeof *t->cols);
  if (!t->cols) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  for (size_t k = 0; k < t->n_cols; k++) {
    column *c = &t->cols[k];
    c->d = H5I_INVALID_HID;
    c->rank = k >= t->first_metric ? 2 : 1;
    c->width = c->rank == 1 ? 1 : k == t->head_col ? t->n_heads : n_layers;
    c->off = t->width;
    t->width += c->width;
  }
  t->cap = p.flush_every >= 1 && p.flush_every < STAGE_ROWS ? (size_t)p.flush_every : STAGE_ROWS;
  t->flush_seconds = p.flush_seconds;
  t->stage = malloc(t->width * t->cap * sizeof *t->stage);
  t->stage_step = malloc(t->cap * sizeof *t->stage_step);
  if (p.flush_every == 0) { /* the writer thread's half */
    t->out = malloc(t->width * t->cap * sizeof *t->out);
    t->out_step = malloc(t->cap * sizeof *t->out_step);
  }
  if (!t->stage || !t->stage_step || (p.flush_every == 0 && (!t->out || !t->out_step))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  if ((st = stabi_sharing_find(m, who, &share)) != STAB_OK) goto out;

  if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
      H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0 || (b.str = stabi_trace_string_type()) < 0) {
    st = stabi_trace_h5fail(who, path, "cannot set up HDF5 properties");
    goto out;
  }
  for (int attempt = 1;; attempt++) {
    int again = 0;
    struct stat sb;
    if (p.append == STAB_OUTPUT_NEW && (st = stab_output_check(path, STAB_OUTPUT_NEW, "a trace")) != STAB_OK) break;
    if (p.append == STAB_OUTPUT_APPEND && stat(path, &sb) == 0) st = open_existing(t, &b, fapl, gnames, &tmp, &again);
    else st = stabi_trace_create_new(t, &b, fapl, gnames, &tmp, &again, H5I_INVALID_HID, 0);
    if (st != STAB_OK || !again) break;
    /* another writer changed the path meanwhile: drop what was made, look again */
    close_file(t, NULL);
    if (tmp) unlink(tmp), free(tmp), tmp = NULL;
    if (attempt == OPEN_ATTEMPTS) {
      st = stabi_fail(STAB_EBUSY, "%s: %s: other processes kept replacing it while this one opened it", who, path);
      break;
    }
  }
out:
  if (gnames)
    for (size_t i = 0; i < n_layers; i++) free(gnames[i]);
  free(gnames);
  if (fapl >= 0) H5Pclose(fapl);
  if (b.str >= 0) H5Tclose(b.str);
  stabi_sharing_free(&share);
  if (st != STAB_OK) {
    destroy(t, NULL);
    if (tmp) unlink(tmp); /* ours (O_EXCL), not yet published: a published one is never removed */
  }
  free(tmp);
  if (st == STAB_OK) {
    void *h = NULL; /* the sec2 driver's handle is its descriptor */
    t->h5_fd = H5Fget_vfd_handle(t->file, H5P_DEFAULT, &h) >= 0 && h ? *(int *)h : -1;
    t->next_open = open_traces;
    open_traces = t;
  }
  stabi_trace_quiet_end(&q);
  stabi_trace_hdf5_lock_give();
  if (st == STAB_OK) {
    t->last_flush = stabi_trace_now_seconds(); /* the first rows wait at most flush_seconds, as later ones */
    if (p.flush_every == 0) stabi_trace_start_writer(t);
    *out = t;
  }
  return st;
}

/* ---- the calls on an open trace: append, flush, close ---------------------------------- */

/* The failure the trace stopped on, as a call returns it: the first call to learn of it (the
 * failing one, or with the writer thread the next one) returns it, later ones too in STOP mode
 * and STAB_OK in CONTINUE mode. Caller's thread, after the writer's failure is in t->error. */
static stab_status failed(stab_trace *t) {
  if (t->reported && t->on_error == STAB_TRACE_CONTINUE) return STAB_OK;
  t->reported = 1;
  return stabi_fail(t->error, "%s", t->message);
}

/* What layer i's ratios divide by: per metric, the file's reference when it has one, else the
 * monitor's (the first measurement of this run). */
static void trace_reference(const stab_trace *t, size_t i, stab_metrics *out) {
  const stab_metrics *mine = stab_monitor_reference(t->m, i);
  *out = t->reference[i];
  for (size_t j = 0; j < N_RATIOS; j++) {
    double *r = stabi_trace_reference_field(out, j);
    if (isnan(*r)) *r = stabi_trace_reference_value(mine, j);
  }
}

stab_status stab_trace_reference(const stab_trace *t, size_t index, stab_metrics *out) {
  static const char who[] = "stab_trace_reference";
  if (!t || !out) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !t ? "trace" : "out");
  if (index >= t->n_layers)
    return stabi_fail(STAB_ERANGE, "%s: index %zu, the trace has %zu layers", who, index, t->n_layers);
  trace_reference(t, index, out);
  return STAB_OK;
}

stab_status stab_trace_append(stab_trace *t, int64_t step, double wall_time, const double *scalars,
                              const double *layer_extras) {
  static const char who[] = "stab_trace_append";
  if (!t) return stabi_fail(STAB_EINVAL, "%s: trace is NULL", who);
  if (foreign(t, who) != STAB_OK) return STAB_ESTATE;
  if ((t->background ? stabi_trace_writer_error(t) : t->error) != STAB_OK) {
    t->staged = 0;
    return failed(t);
  }
  /* Readers and a resume (which keeps the rows up to a step) rely on /step increasing. Not a
   * write failure: the row is refused and the trace goes on. */
  if (t->has_last && step <= t->last_step)
    return stabi_fail(STAB_ERANGE, "%s: %s: step %lld is not after the last step %lld (steps must increase)", who,
                      t->path, (long long)step, (long long)t->last_step);
  t->last_step = step;
  t->has_last = 1;

  const size_t r = t->staged, cap = t->cap;
  /* row(k) is dataset k's row r in the stage */
#define row(k) (t->stage + t->cols[k].off * cap + r * t->cols[k].width)
  t->stage_step[r] = step;
  *row(COL_WALL) = wall_time;
  for (size_t s = 0; s < t->n_scalars; s++) *row(FIRST_SCALAR + s) = scalars ? scalars[s] : NAN;
  for (size_t i = 0; i < t->n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    double v[N_METRICS];
    stabi_trace_metric_values(stab_monitor_metrics(t->m, i), v);
    for (size_t j = 0; j < N_METRICS; j++) row(t->first_metric + j)[i] = v[j];
    stab_metrics ref;
    trace_reference(t, i, &ref);
    for (size_t j = 0; j < N_RATIOS; j++)
      row(t->first_metric + N_METRICS + j)[i] = stabi_trace_ratio_of(v[j], stabi_trace_reference_value(&ref, j));
    if (stabi_trace_layer_heads(l)) {
      const double *h = stab_monitor_head_bounds(t->m, i);
      for (size_t j = 0; j < l->heads; j++) row(t->head_col)[t->head_first[i] + j] = h[j];
    }
    for (size_t e = 0; e < t->n_extras; e++)
      row(t->first_extra + e)[i] = layer_extras ? layer_extras[i * t->n_extras + e] : NAN;
  }
#undef row
  /* Flushing costs about the same for one row as for 256 (it is per dataset), so rows wait in
   * the stage for flush_seconds: a kill then loses at most that span of appends, and the
   * flushes cost at most one per flush_seconds of the caller's time, whatever its step rate. */
  if (++t->staged < cap && !(t->flush_seconds > 0 && stabi_trace_now_seconds() - t->last_flush >= t->flush_seconds))
    return STAB_OK;
  return stabi_trace_write_out(t, who) == STAB_OK ? STAB_OK : failed(t);
}

stab_status stab_trace_flush(stab_trace *t) {
  if (!t) return stabi_fail(STAB_EINVAL, "stab_trace_flush: trace is NULL");
  if (foreign(t, "stab_trace_flush") != STAB_OK) return STAB_ESTATE;
  if ((t->background ? stabi_trace_writer_error(t) : t->error) != STAB_OK) {
    t->staged = 0;
    return failed(t);
  }
  stab_status st = stabi_trace_write_out(t, "stab_trace_flush");
  if (st == STAB_OK && t->background) { /* written, not only handed over */
    pthread_mutex_lock(&t->mu);
    stabi_trace_wait_written(t);
    st = t->error;
    pthread_mutex_unlock(&t->mu);
  }
  return st == STAB_OK ? STAB_OK : failed(t);
}

int64_t stab_trace_steps(const stab_trace *t) {
  if (!t) return 0;
  if (!t->background || t->pid != getpid()) return t->written + (int64_t)t->staged; /* a child: no lock */
  stab_trace *w = (stab_trace *)t; /* the lock only: nothing t shows changes */
  pthread_mutex_lock(&w->mu);
  int64_t n = t->written + (t->error == STAB_OK ? (int64_t)(t->staged + t->out_rows) : 0);
  pthread_mutex_unlock(&w->mu);
  return n;
}

stab_status stab_trace_last_step(const stab_trace *t, int64_t *step) {
  if (!t || !step) return stabi_fail(STAB_EINVAL, "stab_trace_last_step: %s is NULL", !t ? "trace" : "step");
  if (!t->has_last) return STAB_ENOTFOUND;
  *step = t->last_step;
  return STAB_OK;
}

/* From the caller's side: a failure of the writer thread happens at the call that returns it,
 * so that a program sees stab_trace_failed turn to 1 at that call, as without the thread. */
int stab_trace_failed(const stab_trace *t) { return t && t->reported; }

stab_status stab_trace_close(stab_trace *t) {
  if (!t) return STAB_OK;
  if (t->pid != getpid()) { /* a forked child's copy: no thread, lock or HDF5 call of the parent's */
    destroy(t, NULL);
    return STAB_OK;
  }
  stab_status st = STAB_OK;
  if (t->background) {
    if (stabi_trace_writer_error(t) == STAB_OK) stabi_trace_write_out(t, "stab_trace_close"); /* the last rows */
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->writer, NULL); /* it writes the last batch first */
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    t->background = 0;
    /* a failure no call has returned yet: the last batch's, or one after the last append */
    if (t->error != STAB_OK && !t->reported) st = failed(t);
  } else {
    st = t->error == STAB_OK ? stabi_trace_write_out(t, "stab_trace_close") : STAB_OK;
  }
  quiet q;
  stabi_trace_hdf5_lock_take();
  stabi_trace_quiet_begin(&q);
  for (stab_trace **p = &open_traces; *p; p = &(*p)->next_open)
    if (*p == t) {
      *p = t->next_open;
      break;
    }
  stab_status closed = destroy(t, "stab_trace_close");
  stabi_trace_quiet_end(&q);
  stabi_trace_hdf5_lock_give();
  if (st == STAB_OK) st = closed;
  return st;
}
