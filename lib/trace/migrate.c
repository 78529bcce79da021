/* migrate.c — a trace of format 1 to 3 (a group of one-dimensional datasets per layer), checked
 * against the monitor and its rows copied into a new file of format 4, before it is appended to
 * (image.c writes the new file and renames it over the old one). */
#include "trace/trace_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- formats 1 to 3: migration --------------------------------------------------------- */

/* A trace of format 1 to 3 holds a group per layer under /layers, of one-dimensional datasets
 * (forward, ..., head<h>_bound, the extras; from format 2 a copy of /step, from 3 the ratios).
 * Appending to one rewrites it as format 4: a new file is built in memory with the monitor's
 * layers (stabi_trace_create_file, create.c), filled with the old file's rows here, written
 * beside the trace and renamed over it while the old file's lock is held
 * (stabi_trace_create_new, image.c). A writer killed before the rename leaves the old trace as
 * it was (and its temporary file); after it, the new one. */

/* Rows copied at a time: about a million values of one dataset. */
enum { MIGRATE_VALUES = 1 << 20 };

/* Reads rows [first, first + n) of the one-dimensional dataset at path in old into buf. */
static stab_status read_old(const builder *b, hid_t old, const char *path, hsize_t first, hsize_t n, hid_t type,
                            void *buf) {
  hid_t d = H5Dopen2(old, path, H5P_DEFAULT), fs = d < 0 ? H5I_INVALID_HID : H5Dget_space(d);
  hid_t ms = H5Screate_simple(1, &n, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, &first, NULL, &n, NULL);
  if (rc >= 0) rc = H5Dread(d, type, ms, fs, H5P_DEFAULT, buf);
  stab_status st = rc < 0 ? stabi_trace_h5fail(b->who, b->path, "cannot read %s of the trace to migrate", path) : STAB_OK;
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  if (d >= 0) H5Dclose(d);
  return st;
}

/* The old trace against the monitor, as format 3's writer checked it: every layer's group, of
 * the same kind and shape, with the metrics, heads and extras the monitor's trace has, and
 * nothing else; the declared scalars. */
static stab_status check_old(stab_trace *t, const builder *b, hid_t old, char *const *gnames) {
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  hsize_t have = 0;
  if (H5Lexists(old, "step", H5P_DEFAULT) <= 0 || H5Lexists(old, "wall_time", H5P_DEFAULT) <= 0 ||
      H5Lexists(old, "scalars", H5P_DEFAULT) <= 0 || H5Lexists(old, "layers", H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no /step, /wall_time, /scalars or /layers)", who, path);
  for (size_t s = 0; s < t->n_scalars; s++) {
    char p[600];
    snprintf(p, sizeof p, "scalars/%s", b->p->scalars[s]);
    if (H5Lexists(old, p, H5P_DEFAULT) <= 0)
      return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /scalars has no dataset '%s'", who, path,
                        b->p->scalars[s]);
  }
  hid_t g = H5Gopen2(old, "scalars", H5P_DEFAULT);
  if (g < 0) return stabi_trace_h5fail(who, path, "cannot open /scalars");
  st = stabi_trace_link_count(b, g, "/scalars", &have);
  htri_t copy = H5Lexists(g, "step", H5P_DEFAULT);
  H5Gclose(g);
  if (st == STAB_OK && have != t->n_scalars + (copy > 0))
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu scalars, %zu declared", who, path,
                      (unsigned long long)(have - (copy > 0)), t->n_scalars);
  if ((g = H5Gopen2(old, "layers", H5P_DEFAULT)) < 0) return stabi_trace_h5fail(who, path, "cannot open /layers");
  if ((st = stabi_trace_link_count(b, g, "/layers", &have)) == STAB_OK && have != t->n_layers)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu layers, the monitor %zu", who, path,
                    (unsigned long long)have, t->n_layers);
  for (size_t i = 0; i < t->n_layers && st == STAB_OK; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    if (H5Lexists(g, gnames[i], H5P_DEFAULT) <= 0) {
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has no layer '%s'", who, path, l->name);
      break;
    }
    hid_t lg = H5Gopen2(g, gnames[i], H5P_DEFAULT);
    char kind[32];
    int64_t d_in = -1, d_out = -1;
    if (lg < 0) {
      st = stabi_trace_h5fail(who, path, "cannot open a layer's group");
      break;
    }
    if (stabi_trace_get_string(lg, "kind", b->str, kind, sizeof kind) < 0 || stabi_trace_get_int(lg, "d_in", &d_in) < 0 ||
        stabi_trace_get_int(lg, "d_out", &d_out) < 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no kind, d_in or d_out", who, path,
                      l->name);
    else if (strcmp(kind, stab_kind_name(l->kind)) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %s in the trace, %s in the monitor",
                      who, path, l->name, kind, stab_kind_name(l->kind));
    else if (d_in != (int64_t)l->d_in || d_out != (int64_t)l->d_out)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %lld x %lld (d_in x d_out) in the "
                      "trace, %zu x %zu in the monitor", who, path, l->name, (long long)d_in, (long long)d_out, l->d_in,
                      l->d_out);
    /* its datasets: the metrics, heads and extras, besides a copy of /step and ratios (whole,
     * or those an upgrade to format 3 cut short made) */
    hsize_t n = 0, extra = 0;
    if (st == STAB_OK) st = stabi_trace_link_count(b, lg, "a layer", &n);
    const char *need[N_METRICS + 64];
    size_t n_need = 0;
    for (size_t k = 0; k < N_METRICS; k++) need[n_need++] = stabi_trace_metric_names[k];
    for (size_t k = 0; k < t->n_extras && n_need < sizeof need / sizeof need[0]; k++) need[n_need++] = b->p->layer_extras[k];
    for (size_t k = 0; k < n_need && st == STAB_OK; k++)
      if (H5Lexists(lg, need[k], H5P_DEFAULT) <= 0)
        st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no dataset '%s'", who, path,
                        l->name, need[k]);
    for (size_t h = 0; h < stabi_trace_layer_heads(l) && st == STAB_OK; h++) {
      char hn[40];
      snprintf(hn, sizeof hn, "head%zu_bound", h);
      if (H5Lexists(lg, hn, H5P_DEFAULT) <= 0)
        st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no dataset '%s'", who, path,
                        l->name, hn);
    }
    extra += H5Lexists(lg, "step", H5P_DEFAULT) > 0;
    for (size_t j = 0; j < N_RATIOS; j++) extra += H5Lexists(lg, stabi_trace_ratio_names[j], H5P_DEFAULT) > 0;
    if (st == STAB_OK && n != N_METRICS + stabi_trace_layer_heads(l) + t->n_extras + extra)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has %llu datasets in the trace, %zu "
                      "expected (other heads or layer extras)", who, path, l->name, (unsigned long long)(n - extra),
                      N_METRICS + stabi_trace_layer_heads(l) + t->n_extras);
    H5Gclose(lg);
  }
  H5Gclose(g);
  return st;
}

/* The old dataset holding column c of cols[k] (a layer's, or a head's), into buf. ratio: the
 * metric j whose ratio it is when the old trace has no ratios (format 1 or 2), else -1. */
static void old_name(const stab_trace *t, const builder *b, char *const *gnames, size_t k, size_t c, int64_t version,
                     char *buf, size_t len, int *ratio) {
  *ratio = -1;
  if (k == t->head_col && k) {
    size_t i = 0;
    while (i + 1 < t->n_layers && t->head_first[i + 1] <= c) i++;
    snprintf(buf, len, "layers/%s/head%zu_bound", gnames[i], c - t->head_first[i]);
    return;
  }
  const size_t j = k - t->first_metric;
  if (j >= N_METRICS && j < N_METRICS + N_RATIOS && version < 3) {
    *ratio = (int)(j - N_METRICS);
    snprintf(buf, len, "layers/%s/%s", gnames[c], stabi_trace_metric_names[j - N_METRICS]);
    return;
  }
  snprintf(buf, len, "layers/%s/%s", gnames[c], stabi_trace_column_name(t, k, b->p->layer_extras));
}

/* Fills the new trace t (its columns created, no rows) with the rows of the old trace old, of
 * format `version`: the rows of its /step (a dataset longer than /step was cut short by a kill),
 * copied as they are; format 1 and 2's missing ratios made from the rows as format 3's upgrade
 * made them (each metric over its first finite value > 0 in the file). */
stab_status stabi_trace_migrate_rows(stab_trace *t, const builder *b, hid_t old, int64_t version, char *const *gnames) {
  stab_status st = check_old(t, b, old, gnames);
  if (st != STAB_OK) return st;
  hsize_t rows = 0;
  hid_t sd = H5Dopen2(old, "step", H5P_DEFAULT);
  if (sd < 0) return stabi_trace_h5fail(b->who, b->path, "cannot open /step");
  st = stabi_trace_dataset_rows(b, sd, &rows);
  H5Dclose(sd);
  if (st != STAB_OK) return st;
  double *ref = malloc((t->n_layers ? t->n_layers : 1) * N_RATIOS * sizeof *ref);
  double *col = malloc((rows ? rows : 1) * sizeof *col);
  size_t most = 1;
  for (size_t k = 0; k < t->n_cols; k++) most = t->cols[k].width > most ? t->cols[k].width : most;
  const size_t block = MIGRATE_VALUES / most ? MIGRATE_VALUES / most : 1;
  double *buf = malloc(block * most * sizeof *buf);
  double *one = malloc(block * sizeof *one);
  if (!ref || !col || !buf || !one) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory to migrate the trace", b->who);
    goto out;
  }
  char name[700];
  if (version < 3) /* the references the ratios divide by, over all the rows */
    for (size_t i = 0; i < t->n_layers && st == STAB_OK; i++)
      for (size_t j = 0; j < N_RATIOS && st == STAB_OK; j++) {
        snprintf(name, sizeof name, "layers/%s/%s", gnames[i], stabi_trace_metric_names[j]);
        double *r = &ref[i * N_RATIOS + j];
        *r = NAN;
        if (rows && (st = read_old(b, old, name, 0, rows, H5T_NATIVE_DOUBLE, col)) != STAB_OK) break;
        for (hsize_t q = 0; q < rows && isnan(*r); q++)
          if (isfinite(col[q]) && col[q] > 0) *r = col[q];
      }
  for (size_t k = 0; k < t->n_cols && st == STAB_OK; k++) {
    const column *c = &t->cols[k];
    const int is_int = k == COL_STEP || k == t->first_copy || k == t->first_copy + 1;
    if (stabi_trace_set_rows(t, k, rows) < 0) {
      st = stabi_trace_h5fail(b->who, b->path, "cannot size the migrated trace's datasets");
      break;
    }
    for (hsize_t r0 = 0; r0 < rows && st == STAB_OK; r0 += block) {
      const hsize_t n = rows - r0 < block ? rows - r0 : block;
      if (c->rank == 1) {
        const char *src = is_int ? "step" : k == COL_WALL ? "wall_time" : NULL;
        if (!src) snprintf(name, sizeof name, "scalars/%s", b->p->scalars[k - FIRST_SCALAR]), src = name;
        st = read_old(b, old, src, r0, n, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, buf);
      } else {
        for (size_t q = 0; q < c->width && st == STAB_OK; q++) {
          int ratio;
          old_name(t, b, gnames, k, q, version, name, sizeof name, &ratio);
          st = read_old(b, old, name, r0, n, H5T_NATIVE_DOUBLE, one);
          for (hsize_t r = 0; r < n; r++)
            buf[r * c->width + q] = ratio < 0 ? one[r] : stabi_trace_ratio_of(one[r], ref[q * N_RATIOS + (size_t)ratio]);
        }
      }
      if (st != STAB_OK) break;
      const hsize_t start[2] = {r0, 0}, count[2] = {n, c->width};
      hid_t fs = H5Dget_space(c->d), ms = H5Screate_simple(c->rank, count, NULL);
      herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
      if (rc >= 0) rc = H5Dwrite(c->d, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, buf);
      if (rc < 0) st = stabi_trace_h5fail(b->who, b->path, "cannot write the migrated rows");
      if (fs >= 0) H5Sclose(fs);
      if (ms >= 0) H5Sclose(ms);
    }
  }
out:
  free(ref), free(col), free(buf), free(one);
  return st;
}
