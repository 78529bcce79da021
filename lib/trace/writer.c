/* writer.c — staged rows reaching the file: each dataset's rows written and flushed, /step last;
 * in the caller's thread (flush_every >= 1) or by the trace's writer thread, which writes one
 * batch while appends fill the other stage. */
#include "trace/trace_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>

/* The clock of the flush policy: monotonic, so that a clock set back never holds rows back. */
double stabi_trace_now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a batch of rows written to the file ----------------------------------------------- */

/* Dataset k's `rows` rows of stage (laid out as t->stage) and steps, written after the file's
 * `written` rows. */
static stab_status write_column(stab_trace *t, size_t k, const char *who, const double *stage,
                                const int64_t *steps, size_t rows) {
  const column *c = &t->cols[k];
  const hsize_t at[2] = {(hsize_t)t->written, 0}, count[2] = {rows, c->width}, n[2] = {at[0] + rows, c->width};
  if (H5Dset_extent(c->d, n) < 0) return stabi_trace_h5fail(who, t->path, "cannot extend a dataset");
  hid_t fs = H5Dget_space(c->d), ms = H5Screate_simple(c->rank, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, NULL, count, NULL);
  if (rc >= 0)
    rc = k == COL_STEP || k == t->first_copy || k == t->first_copy + 1
             ? H5Dwrite(c->d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, steps)
             : H5Dwrite(c->d, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, stage + c->off * t->cap);
  /* HDF5's message is taken before H5Sclose clears it. */
  stab_status st = rc < 0 ? stabi_trace_h5fail(who, t->path, "cannot write rows") : STAB_OK;
  if (fs >= 0 && H5Sclose(fs) < 0 && st == STAB_OK) st = stabi_trace_h5fail(who, t->path, "cannot write rows");
  if (ms >= 0) H5Sclose(ms);
  return st;
}

/* Writes rows and flushes them, in two steps: every dataset but /step, flush, then /step,
 * flush. HDF5 writes a flush's metadata in its own order, so a writer killed during a single
 * flush could leave /step longer than another dataset; this way the length of /step never
 * counts a row that is not everywhere. Called from the caller's thread (flush_every >= 1) or
 * the writer thread, never both; takes hdf5_lock (hdf5_util.c). */
static stab_status write_rows(stab_trace *t, const char *who, const double *stage, const int64_t *steps,
                              size_t rows) {
  quiet q;
  stabi_trace_hdf5_lock_take();
  stabi_trace_quiet_begin(&q);
  stab_status st = stabi_trace_reserve(t, who, rows);
  for (size_t k = 1; k < t->n_cols && st == STAB_OK; k++) st = write_column(t, k, who, stage, steps, rows);
  if (st == STAB_OK && H5Fflush(t->file, H5F_SCOPE_LOCAL) < 0) st = stabi_trace_h5fail(who, t->path, "cannot flush");
  if (st == STAB_OK) st = write_column(t, 0, who, stage, steps, rows);
  if (st == STAB_OK && H5Fflush(t->file, H5F_SCOPE_LOCAL) < 0) st = stabi_trace_h5fail(who, t->path, "cannot flush");
  stabi_trace_quiet_end(&q);
  stabi_trace_hdf5_lock_give();
  return st;
}

/* A write failed: the trace keeps the failure (STOP) or turns itself off (CONTINUE). The rows
 * staged are dropped: the trace holds what reached the file. Caller's thread, mu not held. */
static stab_status stop(stab_trace *t, stab_status st) {
  t->error = st;
  t->staged = 0;
  snprintf(t->message, sizeof t->message, "%s", stab_last_error());
  return st;
}

/* ---- the writer thread ----------------------------------------------------------------- */

/* Writes each batch handed to it (out), records a failure for the caller's next call, and ends
 * at close once nothing is left. Rows of a batch that failed are dropped, as the stage is in the
 * caller's thread. */
static void *writer_main(void *arg) {
  stab_trace *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->out_rows && !t->quit) pthread_cond_wait(&t->cv, &t->mu);
    if (!t->out_rows) break;
    const size_t rows = t->out_rows;
    const double *out = t->out;
    const int64_t *steps = t->out_step;
    pthread_mutex_unlock(&t->mu);
    /* out, written, dsets and the file are this thread's while out_rows is set */
    stab_status st = write_rows(t, "stab_trace_append (rows written in the background)", out, steps, rows);
    pthread_mutex_lock(&t->mu);
    if (st == STAB_OK) {
      t->written += (int64_t)rows;
    } else if (t->error == STAB_OK) {
      t->error = st;
      snprintf(t->message, sizeof t->message, "%s", stab_last_error()); /* this thread's */
    }
    t->out_rows = 0;
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Starts the writer thread; without one (no thread to be had), the caller's thread writes, as
 * with flush_every >= 1. */
void stabi_trace_start_writer(stab_trace *t) {
  if (pthread_mutex_init(&t->mu, NULL) != 0) return;
  if (pthread_cond_init(&t->cv, NULL) != 0) {
    pthread_mutex_destroy(&t->mu);
    return;
  }
  if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    return;
  }
  t->background = 1;
}

/* Waits until the writer has written the batch it holds; mu held. */
void stabi_trace_wait_written(stab_trace *t) {
  while (t->out_rows) pthread_cond_wait(&t->cv, &t->mu);
}

/* The writer's failure, or STAB_OK. */
stab_status stabi_trace_writer_error(stab_trace *t) {
  pthread_mutex_lock(&t->mu);
  stab_status st = t->error;
  pthread_mutex_unlock(&t->mu);
  return st;
}

/* Flushes the staged rows: hands them to the writer thread (after it has written the batch
 * before: at most one batch is in flight, so once this returns every row staged before the
 * previous flush is in the file), or writes them here. A failure, this one's or the writer's
 * with the previous batch, drops the staged rows and is returned. */
stab_status stabi_trace_write_out(stab_trace *t, const char *who) {
  if (t->background) {
    pthread_mutex_lock(&t->mu);
    stabi_trace_wait_written(t);
    stab_status st = t->error;
    if (st == STAB_OK && t->staged) {
      double *stage = t->stage;
      int64_t *steps = t->stage_step;
      t->stage = t->out, t->stage_step = t->out_step;
      t->out = stage, t->out_step = steps;
      t->out_rows = t->staged;
      pthread_cond_signal(&t->cv);
    }
    t->staged = 0; /* handed over, or dropped by the failure */
    pthread_mutex_unlock(&t->mu);
    t->last_flush = stabi_trace_now_seconds();
    return st;
  }
  if (!t->staged) return STAB_OK;
  stab_status st = write_rows(t, who, t->stage, t->stage_step, t->staged);
  if (st != STAB_OK) return stop(t, st);
  t->written += (int64_t)t->staged;
  t->staged = 0;
  t->last_flush = stabi_trace_now_seconds();
  return STAB_OK;
}
