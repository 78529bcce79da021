/* create.c — a new trace's contents, without rows: the root's attributes, every dataset of
 * format 4 created empty and extendable along the steps, what each layer is along the layer
 * dimension, the dimension scales, and each dataset's units and words (from schema.c). */
#include "trace/trace_internal.h"

#include <hdf5_hl.h> /* H5DS: /step as a dimension scale */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a new file's datasets ------------------------------------------------------------- */

/* Creates cols[k] as loc/name: one-dimensional (rank 1), or (step, width) (rank 2), extendable
 * along the steps, chunked as stabi_trace_chunk_of (schema.c) says; float64 with NaN as its
 * fill value, or int64. */
static stab_status new_column(stab_trace *t, const builder *b, hid_t loc, const char *name, size_t k, int is_int) {
  column *c = &t->cols[k];
  size_t cr, cv;
  stabi_trace_chunk_of(c->rank == 2 ? c->width : 1, &cr, &cv);
  const hsize_t dims[2] = {0, c->width}, max[2] = {H5S_UNLIMITED, c->width ? c->width : H5S_UNLIMITED},
                chunk[2] = {cr, cv};
  const double nan = NAN;
  stab_status st = STAB_OK;
  hid_t space = H5Screate_simple(c->rank, dims, max), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (space < 0 || dcpl < 0 || H5Pset_chunk(dcpl, c->rank, chunk) < 0 ||
      (!is_int && H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan) < 0) ||
      (c->d = H5Dcreate2(loc, name, is_int ? H5T_STD_I64LE : H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl,
                         H5P_DEFAULT)) < 0)
    st = stabi_trace_h5fail(b->who, b->path, "cannot create dataset '%s'", name);
  if (space >= 0) H5Sclose(space);
  if (dcpl >= 0) H5Pclose(dcpl);
  return st;
}

/* ---- the description: dimension scales, units, words ----------------------------------- */

/* Dataset d (where/name, for messages) gets `scale` as the scale of its dimension dim. */
static stab_status attach(const builder *b, hid_t d, hid_t scale, unsigned dim, const char *where, const char *name) {
  htri_t on = H5DSis_attached(d, scale, dim);
  if (on < 0 || (!on && H5DSattach_scale(d, scale, dim) < 0))
    return stabi_trace_h5fail(b->who, b->path, "cannot attach a dimension scale to %s/%s", where, name);
  return STAB_OK;
}

static stab_status make_scale(const builder *b, hid_t d, const char *where, const char *name) {
  htri_t is = H5DSis_scale(d);
  if (is < 0 || (!is && H5DSset_scale(d, name) < 0))
    return stabi_trace_h5fail(b->who, b->path, "cannot make %s/%s a dimension scale", where, name);
  return STAB_OK;
}

/* Dataset d's units and long_name (key names its row in words) for a dataset of /step,
 * /wall_time or /scalars (kind NOT_LAYER). */
static stab_status describe_dataset(const builder *b, hid_t d, const char *where, const char *name, const char *key,
                                    int kind) {
  const wording *w = stabi_trace_wording_of(key, kind);
  if (stabi_trace_set_string(d, "long_name", b->str, w ? w->long_name : name) < 0 ||
      (w && stabi_trace_set_string(d, "units", b->str, w->units) < 0))
    return stabi_trace_h5fail(b->who, b->path, "cannot write the units of %s/%s", where, name);
  return STAB_OK;
}

/* The units and long_name of a per-layer dataset (key: its row in words), whose layers may be
 * of several kinds with different words (forward is in nats for an LM head): the words every
 * kind present shares are units and long_name; where kinds differ, units_<kind> and
 * long_name_<kind> for each kind present, and long_name the words before the first ':'. */
static stab_status describe_per_layer(const stab_trace *t, const builder *b, hid_t d, const char *name,
                                      const char *key) {
  const wording *first = NULL;
  int same_units = 1, same_words = 1, present[STAB_KIND_ATTENTION + 1] = {0};
  for (size_t i = 0; i < t->n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    const wording *w = (size_t)l->kind > STAB_KIND_ATTENTION ? NULL : stabi_trace_wording_of(key, (int)l->kind);
    if (!w || present[l->kind]) continue; /* a kind the dataset says nothing of: head_bound of a linear layer */
    present[l->kind] = 1;
    if (!first) first = w;
    same_units &= strcmp(w->units, first->units) == 0;
    same_words &= w == first;
  }
  char text[160];
  const char *lname = first ? first->long_name : name;
  if (first && !same_words) {
    size_t n = strcspn(first->long_name, ":");
    snprintf(text, sizeof text, "%.*s (in words for each kind: long_name_<kind>)", (int)n, first->long_name);
    lname = text;
  }
  if (stabi_trace_set_string(d, "long_name", b->str, lname) < 0 ||
      (first && same_units && stabi_trace_set_string(d, "units", b->str, first->units) < 0))
    return stabi_trace_h5fail(b->who, b->path, "cannot write the units of /layers/%s", name);
  for (int k = 0; k <= STAB_KIND_ATTENTION && first && (!same_units || !same_words); k++) {
    const wording *w = present[k] ? stabi_trace_wording_of(key, k) : NULL;
    if (!w) continue;
    char an[64];
    snprintf(an, sizeof an, "units_%s", stab_kind_name((stab_kind)k));
    if (!same_units && stabi_trace_set_string(d, an, b->str, w->units) < 0) return stabi_trace_h5fail(b->who, b->path, "cannot write %s", an);
    snprintf(an, sizeof an, "long_name_%s", stab_kind_name((stab_kind)k));
    if (!same_words && stabi_trace_set_string(d, an, b->str, w->long_name) < 0)
      return stabi_trace_h5fail(b->who, b->path, "cannot write %s", an);
  }
  return STAB_OK;
}

/* A one-dimensional dataset loc/name of n values, written whole: strings (str) or int64. */
static stab_status put_array(const builder *b, hid_t loc, const char *name, const char *const *strings,
                             const int64_t *ints, size_t n, hid_t *out) {
  hsize_t dim = n;
  stab_status st = STAB_OK;
  hid_t space = H5Screate_simple(1, &dim, NULL);
  *out = space < 0 ? H5I_INVALID_HID
                   : H5Dcreate2(loc, name, strings ? b->str : H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (*out < 0 || (n && H5Dwrite(*out, strings ? b->str : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 strings ? (const void *)strings : (const void *)ints) < 0))
    st = stabi_trace_h5fail(b->who, b->path, "cannot write /layers/%s", name);
  if (space >= 0) H5Sclose(space);
  return st;
}

/* What each layer is, along the layer dimension (stabi_trace_static_names), and with heads, the head
 * dimension. layers is /layers; lstep its copy of /step. The other datasets of /layers are
 * then attached to the scales (describe_columns). */
static stab_status create_statics(stab_trace *t, const builder *b, hid_t layers, char *const *gnames, hid_t *scale,
                                  hid_t *head) {
  const size_t n = t->n_layers, nh = t->n_heads;
  stab_status st = STAB_OK;
  const char **s = calloc((n ? n : 1) * STATIC_STRINGS, sizeof *s);
  char *text = malloc((n ? n : 1) * 512);
  int64_t *v = malloc((n ? n : 1) * (N_STATIC - STATIC_STRINGS) * sizeof *v);
  int64_t *hv = malloc((nh ? nh : 1) * sizeof *hv);
  const char **hl = malloc((nh ? nh : 1) * sizeof *hl);
  char **with = calloc(n ? n : 1, sizeof *with);
  if (!s || !text || !v || !hv || !hl || !with) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    stabi_trace_describe_layer(l, stabi_monitor_shape(t->m, i), text + i * 512, 512);
    size_t len = 1;
    for (size_t k = 0; k < b->share->n_with[i]; k++) len += strlen(gnames[b->share->with[i][k]]) + 1;
    if (!(with[i] = malloc(len))) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
      goto out;
    }
    with[i][0] = '\0';
    for (size_t k = 0; k < b->share->n_with[i]; k++) {
      if (k) strcat(with[i], " ");
      strcat(with[i], gnames[b->share->with[i][k]]);
    }
    const char *row[STATIC_STRINGS] = {gnames[i], stab_kind_name(l->kind), stabi_trace_layout_name(l), text + i * 512, with[i]};
    for (size_t k = 0; k < STATIC_STRINGS; k++) s[k * n + i] = row[k];
    const int64_t num[N_STATIC - STATIC_STRINGS] = {(int64_t)l->d_in, (int64_t)l->d_out, stabi_trace_param_count(l),
                                                    b->share->unique[i]};
    for (size_t k = 0; k < N_STATIC - STATIC_STRINGS; k++) v[k * n + i] = num[k];
    for (size_t h = 0; h < stabi_trace_layer_heads(l); h++) hv[t->head_first[i] + h] = (int64_t)h, hl[t->head_first[i] + h] = gnames[i];
  }
  for (size_t k = 0; k < N_STATIC && st == STAB_OK; k++) {
    hid_t d = H5I_INVALID_HID;
    st = k < STATIC_STRINGS ? put_array(b, layers, stabi_trace_static_names[k], s + k * n, NULL, n, &d)
                            : put_array(b, layers, stabi_trace_static_names[k], NULL, v + (k - STATIC_STRINGS) * n, n, &d);
    if (st == STAB_OK && k == 0) st = make_scale(b, d, "/layers", "layer");
    else if (st == STAB_OK) st = attach(b, d, *scale, 0, "/layers", stabi_trace_static_names[k]);
    if (st == STAB_OK && d >= 0) {
      static const char *const said[N_STATIC] = {
          "layer name (a '/' of the monitor's name as '.')", "layer kind", "how the weight is stored",
          "the layer's kind and stored shape in words", "the other layers sharing some of its storage (space-separated)",
          "input width", "output width", "parameters the layer's metrics read",
          "parameters no other layer of the trace reads"};
      if (stabi_trace_set_string(d, "long_name", b->str, said[k]) < 0 ||
          (k >= STATIC_STRINGS && stabi_trace_set_string(d, "units", b->str, "1") < 0))
        st = stabi_trace_h5fail(b->who, b->path, "cannot describe /layers/%s", stabi_trace_static_names[k]);
    }
    if (k == 0 && st == STAB_OK) *scale = d; /* closed by stabi_trace_create_file */
    else if (d >= 0) H5Dclose(d);
  }
  if (st == STAB_OK && nh) {
    hid_t d = H5I_INVALID_HID;
    if ((st = put_array(b, layers, stabi_trace_head_names[0], NULL, hv, nh, head)) == STAB_OK)
      st = make_scale(b, *head, "/layers", "head");
    if (st == STAB_OK && stabi_trace_set_string(*head, "long_name", b->str, "attention head's number in its layer") < 0)
      st = stabi_trace_h5fail(b->who, b->path, "cannot describe /layers/head");
    if (st == STAB_OK) st = put_array(b, layers, stabi_trace_head_names[1], hl, NULL, nh, &d);
    if (st == STAB_OK) st = attach(b, d, *head, 0, "/layers", stabi_trace_head_names[1]);
    if (st == STAB_OK && stabi_trace_set_string(d, "long_name", b->str, "the attention head's layer") < 0)
      st = stabi_trace_h5fail(b->who, b->path, "cannot describe /layers/head_layer");
    if (d >= 0) H5Dclose(d);
  }
out:
  if (with)
    for (size_t i = 0; i < n; i++) free(with[i]);
  free(with), free(s), free(text), free(v), free(hv), free(hl);
  return st;
}

/* Builds the new trace, without rows, in the file t->file, created with fapl (in memory: see
 * stabi_trace_create_new, image.c). Every column is created and described: /step and the
 * groups' copies of it are the step dimension's scales, /layers/layer the layer dimension's,
 * /layers/head the heads'. */
stab_status stabi_trace_create_file(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames,
                                    const char *created, const char *run_config) {
  const stab_trace_params *p = b->p;
  stab_status st = STAB_OK;
  hid_t scalars = H5I_INVALID_HID, layers = H5I_INVALID_HID, scale = H5I_INVALID_HID, head = H5I_INVALID_HID;
  t->file = H5Fcreate(b->path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (t->file < 0) return stabi_trace_h5fail(b->who, b->path, "cannot create the file");

  if (stabi_trace_put_string(t->file, "format", b->str, "stabmeter-trace") < 0 ||
      stabi_trace_put_int(t->file, "format_version", FORMAT_VERSION) < 0 ||
      stabi_trace_put_string(t->file, "library_version", b->str, stab_version()) < 0 ||
      stabi_trace_put_string(t->file, "created_utc", b->str, created) < 0 ||
      stabi_trace_put_string(t->file, "run_config", b->str, run_config ? run_config : "{}") < 0)
    return stabi_trace_h5fail(b->who, b->path, "cannot write the root attributes");

  if ((st = new_column(t, b, t->file, "step", COL_STEP, 1)) != STAB_OK) return st;
  if ((st = new_column(t, b, t->file, "wall_time", COL_WALL, 0)) != STAB_OK) return st;
  if ((scalars = H5Gcreate2(t->file, "scalars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
      (layers = H5Gcreate2(t->file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
    st = stabi_trace_h5fail(b->who, b->path, "cannot create the groups /scalars and /layers");
    goto out;
  }
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++) st = new_column(t, b, scalars, p->scalars[s], FIRST_SCALAR + s, 0);
  if (st == STAB_OK) st = new_column(t, b, scalars, "step", t->first_copy, 1);
  if (st == STAB_OK) st = new_column(t, b, layers, "step", t->first_copy + 1, 1);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++)
    st = new_column(t, b, layers, k == t->head_col && k ? "head_bound" : stabi_trace_column_name(t, k, p->layer_extras), k, 0);
  if (st == STAB_OK) st = create_statics(t, b, layers, gnames, &scale, &head);

  /* the scales and the words */
  const hid_t step = t->cols[COL_STEP].d, sstep = t->cols[t->first_copy].d, lstep = t->cols[t->first_copy + 1].d;
  if (st == STAB_OK) st = make_scale(b, step, "", "step");
  if (st == STAB_OK) st = describe_dataset(b, step, "", "step", "step", NOT_LAYER);
  if (st == STAB_OK) st = attach(b, t->cols[COL_WALL].d, step, 0, "", "wall_time");
  if (st == STAB_OK) st = describe_dataset(b, t->cols[COL_WALL].d, "", "wall_time", "wall_time", NOT_LAYER);
  if (st == STAB_OK) st = make_scale(b, sstep, "/scalars", "step");
  if (st == STAB_OK) st = describe_dataset(b, sstep, "/scalars", "step", "step", NOT_LAYER);
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++) {
    st = attach(b, t->cols[FIRST_SCALAR + s].d, sstep, 0, "/scalars", p->scalars[s]);
    if (st == STAB_OK) st = describe_dataset(b, t->cols[FIRST_SCALAR + s].d, "/scalars", p->scalars[s], p->scalars[s], NOT_LAYER);
  }
  if (st == STAB_OK) st = make_scale(b, lstep, "/layers", "step");
  if (st == STAB_OK) st = describe_dataset(b, lstep, "/layers", "step", "step", NOT_LAYER);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++) {
    const int heads = k == t->head_col && k;
    const char *name = heads ? "head_bound" : stabi_trace_column_name(t, k, p->layer_extras);
    st = attach(b, t->cols[k].d, lstep, 0, "/layers", name);
    if (st == STAB_OK) st = attach(b, t->cols[k].d, heads ? head : scale, 1, "/layers", name);
    if (st == STAB_OK) st = describe_per_layer(t, b, t->cols[k].d, name, name);
  }
out:
  if (scalars >= 0) H5Gclose(scalars);
  if (layers >= 0) H5Gclose(layers);
  if (scale >= 0) H5Dclose(scale);
  if (head >= 0) H5Dclose(head);
  return st;
}
