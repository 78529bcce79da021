/* open.c — a trace file on disk opened with HDF5 (a trace appended to, or a new trace's temporary
 * file): checked against the monitor and the params, rows a killed writer left incomplete cut
 * back, and what appending needs read back: the rows, the last step and the references the
 * ratios divide by. A file of format 1 to 3 is only opened here; migrate.c rewrites it. */
#include "trace/trace_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Opens dataset `name` of loc into cols[k], or says which one the trace lacks; checks its
 * rank and width. */
static stab_status open_column(stab_trace *t, const builder *b, hid_t loc, const char *where, const char *name,
                               size_t k) {
  column *c = &t->cols[k];
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: %s has no dataset '%s'", b->who, b->path,
                      where, name);
  if ((c->d = H5Dopen2(loc, name, H5P_DEFAULT)) < 0) return stabi_trace_h5fail(b->who, b->path, "cannot open %s/%s", where, name);
  hsize_t dims[2];
  hid_t s = H5Dget_space(c->d);
  int rank = s < 0 ? -1 : H5Sget_simple_extent_ndims(s);
  if (rank == c->rank) H5Sget_simple_extent_dims(s, dims, NULL);
  if (s >= 0) H5Sclose(s);
  if (rank != c->rank || (rank == 2 && dims[1] != c->width))
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: %s/%s is not %s", b->who, b->path, where, name,
                      c->rank == 1 ? "one-dimensional" : c->width == t->n_layers ? "(step, layer) of the monitor's layers"
                                                                                 : "(step, head) of the monitor's heads");
  return STAB_OK;
}

stab_status stabi_trace_link_count(const builder *b, hid_t g, const char *where, hsize_t *n) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) return stabi_trace_h5fail(b->who, b->path, "cannot list %s", where);
  *n = info.nlinks;
  return STAB_OK;
}

/* Reads the one-dimensional dataset loc/name of n values: strings (into *strings, to free with
 * free_strings) or int64 (ints). */
static stab_status read_array(const builder *b, hid_t loc, const char *name, size_t n, char **strings, int64_t *ints) {
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers has no dataset '%s'", b->who, b->path, name);
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT), s = d < 0 ? H5I_INVALID_HID : H5Dget_space(d);
  hsize_t dim = 0;
  stab_status st = STAB_OK;
  if (s < 0 || H5Sget_simple_extent_ndims(s) != 1 || H5Sget_simple_extent_dims(s, &dim, NULL) < 0 || dim != n)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers/%s has %llu values, the monitor %zu", b->who,
                    b->path, name, (unsigned long long)dim, n);
  else if (n && H5Dread(d, strings ? b->str : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        strings ? (void *)strings : (void *)ints) < 0)
    st = stabi_trace_h5fail(b->who, b->path, "cannot read /layers/%s", name);
  if (s >= 0) H5Sclose(s);
  if (d >= 0) H5Dclose(d);
  return st;
}

static void free_strings(char **s, size_t n) {
  for (size_t i = 0; i < n; i++) H5free_memory(s[i]);
}

/* A version 4 trace's layers against the monitor's: the same names in the same order, each of
 * the same kind and shape, the same heads and extras. */
static stab_status check_layers(stab_trace *t, const builder *b, hid_t layers, char *const *gnames) {
  const size_t n = t->n_layers, nh = t->n_heads;
  stab_status st = STAB_OK;
  char **names = calloc(n ? n : 1, sizeof *names), **kinds = calloc(n ? n : 1, sizeof *kinds);
  char **hl = calloc(nh ? nh : 1, sizeof *hl);
  int64_t *d_in = malloc((n ? n : 1) * sizeof *d_in), *d_out = malloc((n ? n : 1) * sizeof *d_out);
  if (!names || !kinds || !hl || !d_in || !d_out) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
    goto out;
  }
  if ((st = read_array(b, layers, "layer", n, names, NULL)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "kind", n, kinds, NULL)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "d_in", n, NULL, d_in)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "d_out", n, NULL, d_out)) != STAB_OK) goto out;
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    if (!names[i] || strcmp(names[i], gnames[i]) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: its layer %zu is '%s', the monitor's '%s' (the "
                      "same layers in the same order)", b->who, b->path, i, names[i] ? names[i] : "", gnames[i]);
    else if (!kinds[i] || strcmp(kinds[i], stab_kind_name(l->kind)) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %s in the trace, %s in the monitor",
                      b->who, b->path, l->name, kinds[i] ? kinds[i] : "", stab_kind_name(l->kind));
    else if (d_in[i] != (int64_t)l->d_in || d_out[i] != (int64_t)l->d_out)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %lld x %lld (d_in x d_out) in the "
                      "trace, %zu x %zu in the monitor", b->who, b->path, l->name, (long long)d_in[i],
                      (long long)d_out[i], l->d_in, l->d_out);
  }
  if (st == STAB_OK && nh && (st = read_array(b, layers, "head_layer", nh, hl, NULL)) == STAB_OK)
    for (size_t i = 0; i < n && st == STAB_OK; i++)
      for (size_t h = 0; h < stabi_trace_layer_heads(stab_monitor_layer(t->m, i)) && st == STAB_OK; h++)
        if (!hl[t->head_first[i] + h] || strcmp(hl[t->head_first[i] + h], gnames[i]) != 0)
          st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: other attention heads than the monitor's",
                          b->who, b->path);
out:
  if (names) free_strings(names, n);
  if (kinds) free_strings(kinds, n);
  if (hl) free_strings(hl, nh);
  free(names), free(kinds), free(hl), free(d_in), free(d_out);
  return st;
}

/* The rows of a dataset (its length along the steps). */
stab_status stabi_trace_dataset_rows(const builder *b, hid_t d, hsize_t *n) {
  hsize_t dims[2];
  hid_t s = H5Dget_space(d);
  int rank = s < 0 ? -1 : H5Sget_simple_extent_ndims(s);
  if (rank < 1 || rank > 2 || H5Sget_simple_extent_dims(s, dims, NULL) < 0) {
    stab_status st = stabi_trace_h5fail(b->who, b->path, "a dataset is not one- or two-dimensional");
    if (s >= 0) H5Sclose(s);
    return st;
  }
  H5Sclose(s);
  *n = dims[0];
  return STAB_OK;
}

/* Sets column k's rows (its length along the steps). */
herr_t stabi_trace_set_rows(const stab_trace *t, size_t k, hsize_t rows) {
  const hsize_t dims[2] = {rows, t->cols[k].width};
  return H5Dset_extent(t->cols[k].d, dims);
}

/* Cuts every dataset back to the rows whose step is at most b->p->resume_step: the steps a
 * resumed run is about to redo. Steps only grow along /step, so those rows are a prefix. */
static stab_status drop_rows_after(stab_trace *t, const builder *b, hsize_t *rows) {
  int64_t *steps = malloc(*rows * sizeof *steps);
  if (!steps) return stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
  stab_status st = STAB_OK;
  if (H5Dread(t->cols[COL_STEP].d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps) < 0) {
    st = stabi_trace_h5fail(b->who, b->path, "cannot read /step");
    goto out;
  }
  hsize_t keep = 0;
  while (keep < *rows && steps[keep] <= b->p->resume_step) keep++;
  for (size_t k = 0; keep < *rows && k < t->n_cols; k++)
    if (stabi_trace_set_rows(t, k, keep) < 0) {
      st = stabi_trace_h5fail(b->who, b->path, "cannot remove the rows after the resumed step");
      goto out;
    }
  *rows = keep;
out:
  free(steps);
  return st;
}

/* The step of the last of the file's rows, into t->last_step: later appends must come after it. */
static stab_status read_last_step(stab_trace *t, const builder *b, hsize_t rows) {
  hsize_t at = rows - 1, one = 1;
  hid_t fs = H5Dget_space(t->cols[COL_STEP].d), ms = H5Screate_simple(1, &one, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, &at, NULL, &one, NULL);
  if (rc >= 0) rc = H5Dread(t->cols[COL_STEP].d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &t->last_step);
  stab_status st = rc < 0 ? stabi_trace_h5fail(b->who, b->path, "cannot read the last step") : STAB_OK;
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  t->has_last = st == STAB_OK;
  return st;
}

/* Reads rows [first, first + n) of the two-dimensional dataset d (width values a row) into buf. */
static herr_t read_rows_2d(hid_t d, hsize_t first, hsize_t n, hsize_t width, hid_t type, void *buf) {
  const hsize_t start[2] = {first, 0}, count[2] = {n, width};
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(2, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (rc >= 0) rc = H5Dread(d, type, ms, fs, H5P_DEFAULT, buf);
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  return rc;
}

/* The reference of every layer from the file's rows (rows of them, after any cut back): the
 * first finite value > 0 of forward, dependency and update, as the monitor keeps it, so that a
 * resumed run divides by its first measurement, not by the first after the resume. Read a few
 * rows at a time, until every layer has its references: mostly the first rows. */
static stab_status read_references(stab_trace *t, const builder *b, hsize_t rows) {
  const size_t n = t->n_layers, block = n ? (CHUNK_VALUES * 8 + n - 1) / n : 1;
  for (size_t i = 0; i < n; i++) stabi_layer_measure_clear(&t->reference[i]);
  double *buf = malloc(block * (n ? n : 1) * sizeof *buf);
  if (!buf) return stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
  stab_status st = STAB_OK;
  for (size_t j = 0; j < N_RATIOS && st == STAB_OK; j++) {
    size_t missing = n;
    for (hsize_t r0 = 0; r0 < rows && missing && st == STAB_OK; r0 += block) {
      const hsize_t m = rows - r0 < block ? rows - r0 : block;
      if (read_rows_2d(t->cols[t->first_metric + j].d, r0, m, n, H5T_NATIVE_DOUBLE, buf) < 0) {
        st = stabi_trace_h5fail(b->who, b->path, "cannot read /layers/%s", stabi_trace_metric_names[j]);
        break;
      }
      for (size_t i = 0; i < n; i++) {
        double *ref = stabi_trace_reference_field(&t->reference[i], j);
        for (hsize_t r = 0; r < m && isnan(*ref); r++)
          if (isfinite(buf[r * n + i]) && buf[r * n + i] > 0) *ref = buf[r * n + i], missing--;
      }
    }
  }
  free(buf);
  return st;
}

/* Opens the trace file `disk` (path itself, or the new trace's temporary file) with HDF5, checks
 * it against the monitor and the params and opens every dataset. t->lock_fd holds its lock. A
 * trace of format 1 to 3 is left open as it is (t->file_version says so), for migrate. */
stab_status stabi_trace_open_disk(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, const char *disk) {
  const stab_trace_params *p = b->p;
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  hid_t scalars = H5I_INVALID_HID, layers = H5I_INVALID_HID;
  if ((st = stabi_trace_reserve(t, who, 0)) != STAB_OK) return st; /* cutting rows back writes too */
  t->file = H5Fopen(disk, H5F_ACC_RDWR, fapl);
  if (t->file < 0) {
    /* A writer killed in SWMR mode leaves the file marked as open for writing. Its data are
     * consistent (SWMR orders every flush), so the mark is cleared as h5clear -s does. */
    hbool_t clear = 1;
    H5Eclear2(H5E_DEFAULT);
    if (H5Pexist(fapl, "clear_status_flags") > 0 && H5Pset(fapl, "clear_status_flags", &clear) >= 0)
      t->file = H5Fopen(disk, H5F_ACC_RDWR, fapl);
    if (t->file < 0) return stabi_trace_h5fail(who, path, "cannot open the trace to append");
  }

  char format[64];
  int64_t version = 0;
  if (stabi_trace_get_string(t->file, "format", b->str, format, sizeof format) < 0 || strcmp(format, "stabmeter-trace") != 0 ||
      stabi_trace_get_int(t->file, "format_version", &version) < 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no format = \"stabmeter-trace\")", who, path);
  if (version < 1 || version > FORMAT_VERSION)
    return stabi_fail(STAB_EINVAL, "%s: %s: trace format_version %lld, this library writes %d (and migrates 1 to 3)",
                      who, path, (long long)version, FORMAT_VERSION);
  t->file_version = version;
  if (version < FORMAT_VERSION) return STAB_OK;
  if ((st = open_column(t, b, t->file, "the root", "step", COL_STEP)) != STAB_OK) return st;
  if ((st = open_column(t, b, t->file, "the root", "wall_time", COL_WALL)) != STAB_OK) return st;
  if (H5Lexists(t->file, "scalars", H5P_DEFAULT) <= 0 || H5Lexists(t->file, "layers", H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no /scalars or /layers)", who, path);
  if ((scalars = H5Gopen2(t->file, "scalars", H5P_DEFAULT)) < 0 ||
      (layers = H5Gopen2(t->file, "layers", H5P_DEFAULT)) < 0) {
    st = stabi_trace_h5fail(who, path, "cannot open /scalars or /layers");
    goto out;
  }
  hsize_t have = 0;
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++)
    st = open_column(t, b, scalars, "/scalars", p->scalars[s], FIRST_SCALAR + s);
  if (st == STAB_OK) st = open_column(t, b, scalars, "/scalars", "step", t->first_copy);
  if (st == STAB_OK) st = stabi_trace_link_count(b, scalars, "/scalars", &have);
  if (st == STAB_OK && have != t->n_scalars + 1)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu scalars, %zu declared", who, path,
                    (unsigned long long)(have - 1), t->n_scalars);
  if (st == STAB_OK) st = open_column(t, b, layers, "/layers", "step", t->first_copy + 1);
  if (st == STAB_OK) st = check_layers(t, b, layers, gnames);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++)
    st = open_column(t, b, layers, "/layers", k == t->head_col && k ? "head_bound" : stabi_trace_column_name(t, k, p->layer_extras), k);
  const hsize_t expected = 1 + N_STATIC + (t->n_heads ? 2 : 0) + (t->n_cols - t->first_metric);
  if (st == STAB_OK) st = stabi_trace_link_count(b, layers, "/layers", &have);
  if (st == STAB_OK && have != expected)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers has %llu datasets, %llu expected (other "
                    "layer extras)", who, path, (unsigned long long)have, (unsigned long long)expected);
  if (st != STAB_OK) goto out;

  /* Every flush writes /step last, so its length is the row count; a flush cut short by a kill
   * or a failure may have left other datasets longer, and they are cut back to it here. */
  hsize_t rows;
  if ((st = stabi_trace_dataset_rows(b, t->cols[COL_STEP].d, &rows)) != STAB_OK) goto out;
  for (size_t k = 1; k < t->n_cols; k++) {
    hsize_t n;
    if ((st = stabi_trace_dataset_rows(b, t->cols[k].d, &n)) != STAB_OK) goto out;
    if (n < rows) {
      st = stabi_fail(STAB_EIO, "%s: %s: damaged trace: a dataset has %llu rows, /step %llu", who, path,
                      (unsigned long long)n, (unsigned long long)rows);
      goto out;
    }
    if (n > rows && stabi_trace_set_rows(t, k, rows) < 0) {
      st = stabi_trace_h5fail(who, path, "cannot cut back a row left incomplete");
      goto out;
    }
  }
  if (p->resume_step > 0 && rows > 0 && (st = drop_rows_after(t, b, &rows)) != STAB_OK) goto out;
  t->written = (int64_t)rows;
  if (rows > 0 && (st = read_last_step(t, b, rows)) != STAB_OK) goto out;
  st = read_references(t, b, rows);
out:
  if (scalars >= 0) H5Gclose(scalars);
  if (layers >= 0) H5Gclose(layers);
  return st;
}
