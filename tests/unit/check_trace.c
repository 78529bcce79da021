/* check_trace.c — the HDF5 trace writer, every file read back with the HDF5 C API: the schema
 * of docs/manual/metrics.md (datasets, types, chunking, unlimited extents, attributes, /step the dimension
 * scale of every dataset, units, which layers share storage), values equal bit for
 * bit to the monitor's metrics, staging and flushing, resume with a matching and a mismatched
 * monitor, a writer killed with SIGKILL, and write failures (no directory, a full disk). */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hdf5.h>
#include <hdf5_hl.h>

#include "stabmeter.h"
#include "testutil.h"

/* ---- a model with one layer of every kind, one name holding '/' ----------------------- */

enum { MAXL = 8, D = 24, V = 40, HEADS = 3, DH = 8 };

typedef struct {
  size_t n;
  stab_layer layers[MAXL];
  float *buf[MAXL][2];  /* weight (or query) and bias (or key); NULL if unused */
  size_t len[MAXL][2];
} model;

static void add(model *md, stab_layer l, size_t wlen, size_t blen, tu_rng *r, double std) {
  size_t i = md->n++;
  md->len[i][0] = wlen;
  md->buf[i][0] = tu_floats(wlen);
  tu_fill_gauss(md->buf[i][0], 1, wlen, wlen, std, r);
  l.weight = md->buf[i][0];
  if (blen) {
    md->len[i][1] = blen;
    md->buf[i][1] = tu_floats(blen);
    tu_fill_gauss(md->buf[i][1], 1, blen, blen, std, r);
    if (l.kind == STAB_KIND_ATTENTION) l.weight_k = md->buf[i][1];
    else l.bias = md->buf[i][1];
  }
  md->layers[i] = l;
}

/* d_out_fc changes one layer's shape, for a monitor that does not match a trace. */
static void model_init(model *md, uint64_t seed, size_t d_out_fc) {
  memset(md, 0, sizeof *md);
  tu_rng r;
  tu_rng_init(&r, seed);
  add(md, (stab_layer){.name = "blocks/0/fc", .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = d_out_fc},
      D * d_out_fc, d_out_fc, &r, 0.1);
  add(md, (stab_layer){.name = "proj", .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = 16,
                       .layout = STAB_LAYOUT_IN_MAJOR},
      D * 16, 0, &r, 0.1);
  add(md, (stab_layer){.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = D}, V * D, 0, &r, 1.0);
  add(md, (stab_layer){.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = D}, V * D, 0, &r,
      1.0 / D);
  add(md, (stab_layer){.name = "ln_f", .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D}, D, 0, &r, 1.0);
  add(md, (stab_layer){.name = "b_out", .kind = STAB_KIND_BIAS, .d_in = D, .d_out = D}, D, 0, &r, 0.2);
  add(md, (stab_layer){.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = D, .d_out = HEADS * DH,
                       .heads = HEADS},
      D * HEADS * DH, D * HEADS * DH, &r, 0.15);
}

static void model_free(model *md) {
  for (size_t i = 0; i < md->n; i++) free(md->buf[i][0]), free(md->buf[i][1]);
}

static void model_step(model *md, tu_rng *r) {
  for (size_t i = 0; i < md->n; i++)
    for (int s = 0; s < 2; s++)
      if (md->buf[i][s]) tu_add_relative_noise(md->buf[i][s], 1, md->len[i][s], md->len[i][s], 0.01, r);
}

static stab_monitor *make_monitor(const model *md) {
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  for (size_t i = 0; i < md->n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &md->layers[i], NULL));
  return m;
}

static const char *const scalar_names[] = {"loss", "lr"};
static const char *const extra_names[] = {"act_rms", "act_cos1"};
enum { NS = 2, NE = 2 };
static const char run_config[] = "{\"model\": \"test\", \"seed\": 7}";

static stab_trace_params trace_params(int flush_every) {
  stab_trace_params p = stab_trace_default_params();
  p.flush_every = flush_every;
  p.run_config = run_config;
  p.scalars = scalar_names, p.n_scalars = NS;
  p.layer_extras = extra_names, p.n_layer_extras = NE;
  return p;
}

/* The values a row should hold, taken from the monitor when the row was appended. */
typedef struct {
  int64_t step;
  double wall, scalars[NS], extras[MAXL][NE];
  stab_metrics metrics[MAXL];
  double heads[MAXL][HEADS];
} row_want;

static void scalars_of(int64_t step, double *s) { s[0] = 2.0 / (double)(step + 1), s[1] = 1e-3 * (double)step; }
static void extras_of(int64_t step, size_t n_layers, double *e) {
  for (size_t i = 0; i < n_layers; i++) e[i * NE] = 0.25 * (double)i + (double)step, e[i * NE + 1] = NAN;
}

/* Appends one row and records what it should hold. */
static void append_row(stab_trace *t, const stab_monitor *m, int64_t step, row_want *w) {
  size_t n = stab_monitor_layer_count(m);
  double e[MAXL * NE];
  w->step = step;
  w->wall = 0.5 * (double)step + 0.125;
  scalars_of(step, w->scalars);
  extras_of(step, n, e);
  for (size_t i = 0; i < n; i++) {
    w->metrics[i] = *stab_monitor_metrics(m, i);
    memcpy(w->extras[i], e + i * NE, sizeof w->extras[i]);
    const double *h = stab_monitor_head_bounds(m, i);
    for (size_t k = 0; h && k < HEADS; k++) w->heads[i][k] = h[k];
  }
  TU_ASSERT_OK(stab_trace_append(t, step, w->wall, w->scalars, e), "append step %lld", (long long)step);
}

/* ---- files ------------------------------------------------------------------------------- */

static char tmpdir[64];

static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_trace"); }

static void remove_tmpdir(void) { tu_tmpdir_remove(tmpdir); }

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

/* A full disk, simulated: HDF5's sec2 driver writes with pwrite, which this program defines
 * over the C library's, so that while disk_limit is set every write ending past it fails with
 * ENOSPC, as on a full disk where rewriting allocated blocks works and new blocks do not.
 * Extending a file with ftruncate (no blocks needed) still works, as on a real full disk. */
static off_t disk_limit;
/* A writer killed in the middle of a flush, deterministically: when set, the process kills
 * itself at that many writes from now (test_kill9). */
static long die_at_write;

/* A disk with no room left, as the library's reserve meets it: while set, fallocate fails with
 * ENOSPC (HDF5 itself never calls it), so that a flush is refused before HDF5 writes. */
static int no_room;

int fallocate(int fd, int mode, off_t off, off_t len) {
  static int (*real)(int, int, off_t, off_t);
  if (!real) real = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
  if (no_room) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, mode, off, len);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
  static ssize_t (*real)(int, const void *, size_t, off_t);
  if (!real) real = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  if (die_at_write && --die_at_write == 0) raise(SIGKILL);
  if (disk_limit && off + (off_t)n > disk_limit) {
    errno = ENOSPC;
    return -1;
  }
  return real(fd, buf, n, off);
}

/* Opens a trace for reading. swmr: as a reader of a file whose writer may not have closed it. */
static hid_t open_read(const char *path, int swmr) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY | (swmr ? H5F_ACC_SWMR_READ : 0), H5P_DEFAULT);
  ck_assert_msg(f >= 0, "cannot open %s for reading%s", path, swmr ? " (SWMR)" : "");
  return f;
}

static void attr_string(hid_t obj, const char *name, char *buf, size_t len) {
  ck_assert_msg(H5Aexists(obj, name) > 0, "no attribute %s", name);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT), type = H5Aget_type(a);
  ck_assert_msg(H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0,
                "attribute %s is not a variable-length string", name);
  char *v = NULL;
  ck_assert_int_ge(H5Aread(a, type, &v), 0);
  snprintf(buf, len, "%s", v);
  H5free_memory(v);
  H5Tclose(type);
  H5Aclose(a);
}

static int64_t attr_int(hid_t obj, const char *name) {
  ck_assert_msg(H5Aexists(obj, name) > 0, "no attribute %s", name);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT), type = H5Aget_type(a);
  ck_assert_msg(H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 8, "attribute %s is not int64", name);
  int64_t v = -1;
  ck_assert_int_ge(H5Aread(a, H5T_NATIVE_INT64, &v), 0);
  H5Tclose(type);
  H5Aclose(a);
  return v;
}

/* ---- format 4: a layer's values are its column of each (step, layer) dataset ---------------- */

/* The strings of the one-dimensional dataset `name`, n of them (each to H5free_memory). */
static char **read_strings(hid_t f, const char *name, size_t *n) {
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  ck_assert_msg(d >= 0, "no dataset %s", name);
  hid_t sp = H5Dget_space(d), type = H5Tcopy(H5T_C_S1), ftype = H5Dget_type(d);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5Tget_cset(ftype)); /* UTF-8: no conversion to ASCII exists */
  H5Tclose(ftype);
  hsize_t len = 0;
  ck_assert_int_eq(H5Sget_simple_extent_ndims(sp), 1);
  H5Sget_simple_extent_dims(sp, &len, NULL);
  char **v = calloc(len + 1, sizeof *v);
  ck_assert_ptr_nonnull(v);
  if (len) ck_assert_int_ge(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v), 0);
  H5Tclose(type), H5Sclose(sp), H5Dclose(d);
  *n = (size_t)len;
  return v;
}

static void free_strings(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) H5free_memory(v[i]);
  free(v);
}

/* The index of layer `group` ("layers/<name>", a '/' of the name already '.') along the layer
 * dimension: its place in /layers/layer. */
static size_t layer_index(hid_t f, const char *group) {
  size_t n, at = (size_t)-1;
  char **names = read_strings(f, "layers/layer", &n);
  for (size_t i = 0; i < n; i++)
    if (!strcmp(names[i], group + 7)) at = i;
  free_strings(names, n);
  ck_assert_msg(at != (size_t)-1, "no layer %s in /layers/layer", group + 7);
  return at;
}

/* Layer `group`'s value of the dataset `name` along the layer dimension (/layers/kind, d_in ...):
 * a string into buf, or an int64. */
static void layer_string(hid_t f, const char *group, const char *name, char *buf, size_t len) {
  size_t n, i = layer_index(f, group);
  char path[64];
  snprintf(path, sizeof path, "layers/%s", name);
  char **v = read_strings(f, path, &n);
  ck_assert_msg(i < n, "%s is shorter than /layers/layer", path);
  snprintf(buf, len, "%s", v[i]);
  free_strings(v, n);
}

static int64_t layer_int(hid_t f, const char *group, const char *name) {
  size_t i = layer_index(f, group);
  char path[64];
  snprintf(path, sizeof path, "layers/%s", name);
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT), type = d < 0 ? -1 : H5Dget_type(d);
  ck_assert_msg(d >= 0, "no dataset %s", path);
  ck_assert_msg(H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) == 8, "%s is not int64", path);
  int64_t *v = malloc((i + 1) * sizeof *v);
  hsize_t start = i, one = 1;
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(1, &one, NULL);
  ck_assert_int_ge(H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, NULL, &one, NULL), 0);
  ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, v), 0);
  int64_t x = v[0];
  free(v), H5Sclose(fs), H5Sclose(ms), H5Tclose(type), H5Dclose(d);
  return x;
}

/* "layers/<layer>/<metric>" as format 3 named it: the dataset holding it in format 4 (into
 * dset) and its column there: /layers/<metric>'s column of the layer, or for head<h>_bound
 * /layers/head_bound's column of that head. */
static size_t layer_column(hid_t f, const char *name, char *dset, size_t len) {
  const char *slash = strrchr(name, '/');
  char group[160];
  snprintf(group, sizeof group, "%.*s", (int)(slash - name), name);
  unsigned h;
  char tail[8];
  if (sscanf(slash + 1, "head%u_bou%7s", &h, tail) == 2 && !strcmp(tail, "nd")) {
    size_t n, col = (size_t)-1;
    char **hl = read_strings(f, "layers/head_layer", &n);
    int64_t *hn = malloc((n + 1) * sizeof *hn);
    hid_t d = H5Dopen2(f, "layers/head", H5P_DEFAULT);
    ck_assert_int_ge(H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, hn), 0);
    H5Dclose(d);
    for (size_t c = 0; c < n; c++)
      if (!strcmp(hl[c], group + 7) && hn[c] == (int64_t)h) col = c;
    free_strings(hl, n), free(hn);
    ck_assert_msg(col != (size_t)-1, "no head %u of %s in /layers/head_bound", h, group);
    snprintf(dset, len, "layers/head_bound");
    return col;
  }
  snprintf(dset, len, "layers/%s", slash + 1);
  return layer_index(f, group);
}

/* Checks the schema of one dataset (1-D, chunked, unlimited, float64 or int64) and reads it
 * whole into a new buffer (8 bytes per row). Returns its length. A layer's dataset as format 3
 * named it, "layers/<layer>/<metric>", is its column of the (step, layer) dataset that holds it
 * (layer_column), whose schema is checked alike (2-D, chunked, unlimited along the steps). */
static hsize_t read_dataset(hid_t f, const char *name, int is_int, void **out) {
  if (!strncmp(name, "layers/", 7) && strchr(name + 7, '/')) {
    char dset[160];
    const hsize_t col = layer_column(f, name, dset, sizeof dset);
    hid_t d = H5Dopen2(f, dset, H5P_DEFAULT);
    ck_assert_msg(d >= 0, "cannot open %s (for %s)", dset, name);
    hid_t type = H5Dget_type(d), space = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
    ck_assert_msg(H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 8, "%s is not float64", dset);
    ck_assert_msg(H5Sget_simple_extent_ndims(space) == 2, "%s is not two-dimensional", dset);
    hsize_t dims[2], max[2], chunk[2];
    H5Sget_simple_extent_dims(space, dims, max);
    ck_assert_msg(max[0] == H5S_UNLIMITED && max[1] == dims[1] && col < dims[1], "%s is not (step, layer)", dset);
    ck_assert_msg(H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 2, chunk) == 2 && chunk[0] > 0,
                  "%s is not chunked", dset);
    double *buf = malloc((dims[0] ? dims[0] : 1) * 8);
    ck_assert_ptr_nonnull(buf);
    const hsize_t start[2] = {0, col}, count[2] = {dims[0], 1};
    hid_t ms = H5Screate_simple(2, count, NULL);
    if (dims[0]) {
      ck_assert_int_ge(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL), 0);
      ck_assert_int_ge(H5Dread(d, H5T_NATIVE_DOUBLE, ms, space, H5P_DEFAULT, buf), 0);
    }
    H5Sclose(ms), H5Pclose(dcpl), H5Sclose(space), H5Tclose(type), H5Dclose(d);
    *out = buf;
    return dims[0];
  }
  ck_assert_msg(H5Lexists(f, name, H5P_DEFAULT) > 0, "no dataset %s", name);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  ck_assert_msg(d >= 0, "cannot open %s", name);
  hid_t type = H5Dget_type(d), space = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
  ck_assert_msg(H5Tget_class(type) == (is_int ? H5T_INTEGER : H5T_FLOAT) && H5Tget_size(type) == 8,
                "%s is not %s", name, is_int ? "int64" : "float64");
  if (is_int) ck_assert_msg(H5Tget_sign(type) == H5T_SGN_2, "%s is not signed", name);
  ck_assert_msg(H5Sget_simple_extent_ndims(space) == 1, "%s is not one-dimensional", name);
  hsize_t n = 0, max = 0, chunk = 0;
  H5Sget_simple_extent_dims(space, &n, &max);
  ck_assert_msg(max == H5S_UNLIMITED, "%s is not extendable", name);
  ck_assert_msg(H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 1, &chunk) == 1 && chunk > 0,
                "%s is not chunked", name);
  void *buf = malloc((n ? n : 1) * 8);
  ck_assert_ptr_nonnull(buf);
  if (n) ck_assert_int_ge(H5Dread(d, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf), 0);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(d);
  *out = buf;
  return n;
}

/* Bit for bit, so that a NaN is equal to the same NaN and -0 differs from 0. */
static void assert_same(double got, double want, const char *what, size_t row) {
  ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s row %zu: %.17g in the file, %.17g expected", what,
                row, got, want);
}

static size_t link_count(hid_t f, const char *group) {
  H5G_info_t info;
  ck_assert_int_ge(H5Gget_info_by_name(f, group, &info, H5P_DEFAULT), 0);
  return (size_t)info.nlinks;
}

static const char *const metric_names[] = {
    "forward", "dependency", "update", "forward_tight", "dependency_tight", "update_tight", "spread", "sigma",
    "sigma_rel_err", "sigma_update", "sigma_update_rel_err", "rel_update", "passes", "update_passes", "flags"};
enum { NM = sizeof metric_names / sizeof metric_names[0] };
/* Format 3: the ratios of forward, dependency and update (metric_names[0..2]) to their first
 * finite value > 0 */
static const char *const ratio_names[] = {"forward_ratio", "dependency_ratio", "update_ratio"};
enum { NR = 3 };

static double metric_field(const stab_metrics *m, size_t k) {
  const double v[NM] = {m->forward, m->dependency, m->update, m->forward_tight, m->dependency_tight,
                        m->update_tight, m->spread, m->sigma, m->sigma_rel_err, m->sigma_update,
                        m->sigma_update_rel_err, m->rel_update, m->passes, m->update_passes, m->flags};
  return v[k];
}

/* Dataset `name` has the scale `step` (its group's) on its dimension, and units and long_name
 * that are not empty (an attribute the writer skipped would leave netCDF tools without them). */
static void check_dataset_described(hid_t f, hid_t step, const char *name) {
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  ck_assert_msg(d >= 0, "cannot open %s", name);
  ck_assert_msg(H5DSis_attached(d, step, 0) > 0, "%s: /step is not its dimension scale", name);
  char s[512];
  attr_string(d, "units", s, sizeof s);
  ck_assert_msg(s[0], "%s: empty units", name);
  attr_string(d, "long_name", s, sizeof s);
  ck_assert_msg(s[0], "%s: empty long_name", name);
  H5Dclose(d);
}

/* Rows a dataset may hold past /step's: 0, except in a file whose writer was killed, which may
 * have died in the middle of a flush. Every dataset of a row is extended and written before
 * /step, which is the row count, so such a file can hold datasets one row longer than /step
 * (readers read /step's length); test_kill9 sets it to 1 while it reads its killed file. */
static size_t killed_slack;

/* Length n of a dataset beside /step's n_step rows: equal, or up to killed_slack more. */
static int rows_fit(size_t n, size_t n_step) { return n >= n_step && n <= n_step + killed_slack; }

/* Group `group`'s step: a dimension scale named step holding the values of /step; opened. */
static hid_t group_step(hid_t f, const char *group) {
  char name[160], scale[16];
  snprintf(name, sizeof name, "%s/step", group);
  ck_assert_msg(H5Lexists(f, name, H5P_DEFAULT) > 0, "%s: no step", group);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  ck_assert_int_ge(d, 0);
  ck_assert_msg(H5DSis_scale(d) > 0 && H5DSget_scale_name(d, scale, sizeof scale) == 4 && !strcmp(scale, "step"),
                "%s is not a dimension scale named step", name);
  int64_t *mine, *root;
  hsize_t n = read_dataset(f, name, 1, (void **)&mine), n_root = read_dataset(f, "step", 1, (void **)&root);
  ck_assert_msg(rows_fit(n, n_root) && (n_root == 0 || memcmp(mine, root, n_root * sizeof *mine) == 0),
                "%s differs from /step", name);
  free(mine), free(root);
  return d;
}

/* The netCDF view of the file: /step a dimension scale named step, attached to /wall_time, each
 * group's copy of it the scale of the group's datasets, units and long_name everywhere, a
 * description per layer. */
static void check_described(hid_t f, const model *md) {
  hid_t step = H5Dopen2(f, "step", H5P_DEFAULT);
  ck_assert_int_ge(step, 0);
  ck_assert_msg(H5DSis_scale(step) > 0, "/step is not a dimension scale");
  char s[512];
  ck_assert(H5DSget_scale_name(step, s, sizeof s) == 4 && strcmp(s, "step") == 0);
  attr_string(step, "units", s, sizeof s);
  ck_assert_str_eq(s, "1");
  attr_string(step, "long_name", s, sizeof s);
  ck_assert_msg(s[0], "/step: empty long_name");
  check_dataset_described(f, step, "wall_time");
  hid_t gs = group_step(f, "scalars");
  for (size_t k = 0; k < NS; k++) {
    char name[64];
    snprintf(name, sizeof name, "scalars/%s", scalar_names[k]);
    check_dataset_described(f, gs, name);
  }
  H5Dclose(gs);
  /* /layers: its copy of /step the scale of every dataset's steps, /layers/layer (the names) of
   * the layers, /layers/head of the heads */
  gs = group_step(f, "layers");
  hid_t lay = H5Dopen2(f, "layers/layer", H5P_DEFAULT), head = H5Dopen2(f, "layers/head", H5P_DEFAULT);
  ck_assert_msg(H5DSis_scale(lay) > 0 && H5DSget_scale_name(lay, s, sizeof s) == 5 && !strcmp(s, "layer"),
                "/layers/layer is not a dimension scale named layer");
  ck_assert_msg(H5DSis_scale(head) > 0, "/layers/head is not a dimension scale");
  for (size_t k = 0; k < NM + NR + NE + 1; k++) {
    char name[128];
    const char *m = k < NM ? metric_names[k] : k < NM + NR ? ratio_names[k - NM] : k < NM + NR + NE ? extra_names[k - NM - NR]
                                                                                                   : "head_bound";
    snprintf(name, sizeof name, "layers/%s", m);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    ck_assert_msg(d >= 0, "no %s", name);
    ck_assert_msg(H5DSis_attached(d, gs, 0) > 0, "%s: step is not the scale of its rows", name);
    ck_assert_msg(H5DSis_attached(d, k == NM + NR + NE ? head : lay, 1) > 0, "%s: no scale on its columns", name);
    attr_string(d, "long_name", s, sizeof s);
    ck_assert_msg(s[0], "%s: empty long_name", name);
    if (k >= NM && k < NM + NR) { /* a ratio, the lm_head's too: one unit */
      attr_string(d, "units", s, sizeof s);
      ck_assert_msg(!strcmp(s, "1"), "%s: units '%s'", name, s);
      attr_string(d, "long_name", s, sizeof s);
      ck_assert_msg(strstr(s, "first measured step"), "%s: long_name '%s'", name, s);
    } else if (H5Aexists(d, "units") <= 0) { /* kinds of other units: each kind's, every kind present */
      for (size_t i = 0; i < md->n; i++) {
        char an[64];
        snprintf(an, sizeof an, "units_%s", stab_kind_name(md->layers[i].kind));
        if (k < NM + NR + NE || md->layers[i].kind == STAB_KIND_ATTENTION)
          ck_assert_msg(H5Aexists(d, an) > 0, "%s: no units and no %s", name, an);
      }
    }
    H5Dclose(d);
  }
  for (size_t i = 0; i < md->n; i++) {
    const stab_layer *l = &md->layers[i];
    char g[64];
    snprintf(g, sizeof g, "layers/%s", l->name);
    for (char *c = g + 7; *c; c++)
      if (*c == '/') *c = '.';
    layer_string(f, g, "description", s, sizeof s);
    ck_assert_msg(strstr(s, stab_kind_name(l->kind)) || (l->kind == STAB_KIND_LM_HEAD && strstr(s, "LM head")) ||
                      (l->kind == STAB_KIND_GAIN && strstr(s, "gain")),
                  "%s: description '%s' does not name its kind", g, s);
  }
  H5Dclose(lay), H5Dclose(head), H5Dclose(gs);
  /* the LM head's values bound a loss: nats; a linear layer's are RMS ratios */
  hid_t d = H5Dopen2(f, "layers/forward", H5P_DEFAULT);
  attr_string(d, "units_lm_head", s, sizeof s);
  ck_assert_str_eq(s, "nats");
  attr_string(d, "units_linear", s, sizeof s);
  ck_assert_str_eq(s, "1");
  H5Dclose(d);
  H5Dclose(step);
}

/* Each layer's ratios against its own forward, dependency and update columns read back: the
 * value over the first finite value > 0 of its column (NaN where either is NaN). */
static void check_ratios(hid_t f, const model *md, size_t rows) {
  for (size_t i = 0; i < md->n; i++) {
    char g[64], name[128];
    snprintf(g, sizeof g, "layers/%s", md->layers[i].name);
    for (char *c = g + 7; *c; c++)
      if (*c == '/') *c = '.';
    for (size_t j = 0; j < NR; j++) {
      double *v, *ratio, ref = NAN;
      snprintf(name, sizeof name, "%s/%s", g, metric_names[j]);
      ck_assert(rows_fit(read_dataset(f, name, 0, (void **)&v), rows));
      snprintf(name, sizeof name, "%s/%s", g, ratio_names[j]);
      ck_assert_msg(rows_fit(read_dataset(f, name, 0, (void **)&ratio), rows), "%s has the wrong length", name);
      for (size_t r = 0; r < rows && isnan(ref); r++)
        if (isfinite(v[r]) && v[r] > 0) ref = v[r];
      for (size_t r = 0; r < rows; r++) {
        double want = isnan(v[r]) || isnan(ref) ? NAN : v[r] / ref;
        ck_assert_msg((isnan(want) && isnan(ratio[r])) || ratio[r] == want, "%s row %zu: %.17g, expected %.17g / %.17g",
                      name, r, ratio[r], v[r], ref);
      }
      /* every kind has a forward value, > 0 in these models: never a column of NaN */
      ck_assert_msg(j != 0 || rows == 0 || !isnan(ref), "%s: no reference in %zu rows", name, rows);
      free(v), free(ratio);
    }
  }
}

/* The whole file against the rows expected: schema of every dataset and every value. */
static void check_file(hid_t f, const model *md, const row_want *want, size_t rows) {
  int64_t *steps;
  double *v;
  ck_assert_msg(read_dataset(f, "step", 1, (void **)&steps) == rows, "/step has the wrong length");
  for (size_t r = 0; r < rows; r++) ck_assert_int_eq(steps[r], want[r].step);
  free(steps);
  ck_assert(rows_fit(read_dataset(f, "wall_time", 0, (void **)&v), rows));
  for (size_t r = 0; r < rows; r++) assert_same(v[r], want[r].wall, "wall_time", r);
  free(v);
  ck_assert_uint_eq(link_count(f, "/scalars"), NS + 1); /* and its copy of /step */
  for (size_t s = 0; s < NS; s++) {
    char name[64];
    snprintf(name, sizeof name, "scalars/%s", scalar_names[s]);
    ck_assert(rows_fit(read_dataset(f, name, 0, (void **)&v), rows));
    for (size_t r = 0; r < rows; r++) assert_same(v[r], want[r].scalars[s], name, r);
    free(v);
  }
  /* format 4: whatever the layers, /layers holds its step, the 9 datasets along the layer
   * dimension, head and head_layer, and one dataset per metric, ratio, extra and head_bound */
  ck_assert_uint_eq(link_count(f, "/layers"), 1 + 9 + 2 + NM + NR + NE + 1);
  for (size_t i = 0; i < md->n; i++) {
    const stab_layer *l = &md->layers[i];
    char g[64], name[128];
    snprintf(g, sizeof g, "layers/%s", l->name);
    for (char *c = g + 7; *c; c++)
      if (*c == '/') *c = '.';
    size_t heads = l->kind == STAB_KIND_ATTENTION ? l->heads : 0;
    ck_assert_uint_eq(layer_index(f, g), i); /* the monitor's order */
    for (size_t k = 0; k < NM + heads + NE; k++) {
      if (k < NM) snprintf(name, sizeof name, "%s/%s", g, metric_names[k]);
      else if (k < NM + heads) snprintf(name, sizeof name, "%s/head%zu_bound", g, k - NM);
      else snprintf(name, sizeof name, "%s/%s", g, extra_names[k - NM - heads]);
      ck_assert_msg(rows_fit(read_dataset(f, name, 0, (void **)&v), rows), "%s has the wrong length", name);
      for (size_t r = 0; r < rows; r++) {
        double w = k < NM ? metric_field(&want[r].metrics[i], k)
                           : k < NM + heads ? want[r].heads[i][k - NM] : want[r].extras[i][k - NM - heads];
        assert_same(v[r], w, name, r);
      }
      free(v);
    }
  }
  check_described(f, md);
  check_ratios(f, md, rows);
}

/* Attributes of the root and of every layer group. */
static void check_attrs(hid_t f, const model *md) {
  char s[256];
  attr_string(f, "format", s, sizeof s);
  ck_assert_str_eq(s, "stabmeter-trace");
  ck_assert_int_eq(attr_int(f, "format_version"), 4);
  attr_string(f, "library_version", s, sizeof s);
  ck_assert_str_eq(s, stab_version());
  attr_string(f, "run_config", s, sizeof s);
  ck_assert_str_eq(s, run_config);
  attr_string(f, "created_utc", s, sizeof s);
  int y, mo, d, h, mi, sec;
  char z = 0;
  ck_assert_msg(strlen(s) == 20 && sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &sec, &z) == 7 &&
                    z == 'Z' && y >= 2024,
                "created_utc '%s' is not YYYY-MM-DDTHH:MM:SSZ", s);
  static const struct {
    const char *group, *name, *kind, *layout;
    int64_t d_in, d_out, params;
  } want[] = {
      {"layers/blocks.0.fc", "blocks/0/fc", "linear", "out_major", D, D, D * D + D},
      {"layers/proj", "proj", "linear", "in_major", D, 16, D * 16},
      {"layers/wte", "wte", "embedding", "rows", V, D, V * D},
      {"layers/lm_head", "lm_head", "lm_head", "rows", D, V, V * D},
      {"layers/ln_f", "ln_f", "gain", "rows", D, D, D},
      {"layers/b_out", "b_out", "bias", "rows", D, D, D},
      {"layers/attn", "attn", "attention", "out_major", D, HEADS * DH, 2 * D * HEADS * DH},
  };
  ck_assert_uint_eq(md->n, sizeof want / sizeof want[0]);
  for (size_t i = 0; i < md->n; i++) {
    const char *g = want[i].group;
    ck_assert_uint_eq(layer_index(f, g), i);
    layer_string(f, g, "kind", s, sizeof s);
    ck_assert_str_eq(s, want[i].kind);
    layer_string(f, g, "layout", s, sizeof s);
    ck_assert_msg(strcmp(s, want[i].layout) == 0, "%s: layout %s, expected %s", g, s, want[i].layout);
    ck_assert_int_eq(layer_int(f, g, "d_in"), want[i].d_in);
    ck_assert_int_eq(layer_int(f, g, "d_out"), want[i].d_out);
    ck_assert_int_eq(layer_int(f, g, "param_count"), want[i].params);
  }
}

/* Writes `rows` rows: the first without an update (NaN), the rest each after a step. */
static void write_rows(stab_trace *t, stab_monitor *m, model *md, tu_rng *r, row_want *want, size_t first,
                       size_t rows) {
  for (size_t s = first; s < first + rows; s++) {
    if (s == 0) {
      TU_ASSERT_OK(stab_monitor_measure(m, 0));
    } else {
      TU_ASSERT_OK(stab_monitor_snapshot(m));
      model_step(md, r);
      TU_ASSERT_OK(stab_monitor_measure(m, 1));
    }
    append_row(t, m, (int64_t)(10 * s), &want[s]);
    ck_assert_int_eq(stab_trace_steps(t), (int64_t)(s + 1));
  }
}

/* ---- schema and values ----------------------------------------------------------------- */

enum { ROWS = 7 };

/* The writer's rows per chunk (CHUNK_ROWS, lib/trace/trace_internal.h): a flush crossing it needs new room on the disk. */
enum { CHUNK_ROWS_TEST = 256 };

/* flush_every 1, 3 (rows staged between flushes) and 100 (nothing flushed before close). */
/* 1 when msg, with the first occurrence of path cut out, holds what: the trace's own path
 * comes from mkdtemp, whose random letters may spell "0x" (a flake seen once in distcheck). */
static int beyond_path_holds(const char *msg, const char *path, const char *what) {
  char rest[1200];
  const char *at = strstr(msg, path);
  if (at) snprintf(rest, sizeof rest, "%.*s%s", (int)(at - msg), msg, at + strlen(path));
  else snprintf(rest, sizeof rest, "%s", msg);
  return strstr(rest, what) != NULL;
}

START_TEST(test_schema_and_values) {
  const int flush_every[] = {1, 3, 100};
  make_tmpdir();
  model md;
  model_init(&md, 11, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 5);
  row_want want[ROWS];
  stab_trace_params p = trace_params(flush_every[_i]);
  stab_trace *t = NULL;
  const char *path = tmp_path("schema.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 0);
  write_rows(t, m, &md, &r, want, 0, ROWS);
  ck_assert_int_eq(stab_trace_failed(t), 0);
  TU_ASSERT_OK(stab_trace_close(t));

  /* The first row has no update: NaN in every layer; later rows have one but attention. */
  for (size_t i = 0; i < md.n; i++) {
    TU_ASSERT_NAN(want[0].metrics[i].update, "%s", md.layers[i].name);
    if (md.layers[i].kind != STAB_KIND_ATTENTION)
      ck_assert_msg(isfinite(want[1].metrics[i].update), "%s has no update", md.layers[i].name);
  }
  hid_t f = open_read(path, 0);
  check_attrs(f, &md);
  check_file(f, &md, want, ROWS);
  /* The attention heads really differ, so head datasets are not one value copied. */
  ck_assert(want[ROWS - 1].heads[6][0] != want[ROWS - 1].heads[6][1]);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* A SWMR reader in another process, forked before this one touches HDF5: within one process
 * HDF5 shares a file opened twice, and a child forked later would inherit the writer's open
 * file. Each rows_seen() has it open the file afresh and say how many rows /step holds, -1 if
 * it cannot open or read it, -2 if the last step is not 10 x its row (as write_rows numbers
 * them). */
typedef struct {
  pid_t pid;
  int ask, answer; /* pipe ends: a byte asks, an int answers */
} reader;

static reader start_reader(const char *path) {
  int go[2], done[2];
  ck_assert_int_eq(pipe(go), 0);
  ck_assert_int_eq(pipe(done), 0);
  reader rd = {fork(), go[1], done[0]};
  ck_assert_int_ge(rd.pid, 0);
  if (rd.pid == 0) {
    close(go[1]), close(done[0]);
    char c;
    while (read(go[0], &c, 1) == 1 && c == '?') {
      int rows = -1;
      hid_t f = H5Fopen(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
      if (f >= 0) {
        hid_t d = H5Dopen2(f, "step", H5P_DEFAULT), sp = d >= 0 ? H5Dget_space(d) : -1;
        hsize_t n = 0, one = 1;
        int64_t last = -1;
        if (sp >= 0 && H5Sget_simple_extent_dims(sp, &n, NULL) == 1) {
          hsize_t at = n ? n - 1 : 0;
          hid_t mem = H5Screate_simple(1, &one, NULL);
          if (!n) rows = 0;
          else if (H5Sselect_hyperslab(sp, H5S_SELECT_SET, &at, NULL, &one, NULL) >= 0 &&
                   H5Dread(d, H5T_NATIVE_INT64, mem, sp, H5P_DEFAULT, &last) >= 0)
            rows = last == 10 * ((int64_t)n - 1) ? (int)n : -2;
          H5Sclose(mem);
        }
        if (sp >= 0) H5Sclose(sp);
        if (d >= 0) H5Dclose(d);
        H5Fclose(f);
      }
      if (write(done[1], &rows, sizeof rows) != sizeof rows) _exit(2);
    }
    _exit(0);
  }
  close(go[0]), close(done[1]);
  return rd;
}

static int rows_seen(const reader *rd) {
  int rows = -3;
  ck_assert_int_eq(write(rd->ask, "?", 1), 1);
  ck_assert_int_eq(read(rd->answer, &rows, sizeof rows), (ssize_t)sizeof rows);
  return rows;
}

static void stop_reader(reader *rd) {
  int status = 0;
  close(rd->ask), close(rd->answer);
  ck_assert_int_eq(waitpid(rd->pid, &status, 0), rd->pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the reader ended with status 0x%x", status);
}

/* Rows are visible to a SWMR reader once flushed, before the writer closes. */
START_TEST(test_flush_visible) {
  make_tmpdir();
  const char *path = tmp_path("flush.h5");
  reader rd = start_reader(path);
  model md;
  model_init(&md, 12, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 6);
  row_want want[ROWS];
  stab_trace_params p = trace_params(1000);
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 4);
  TU_ASSERT_OK(stab_trace_flush(t));
  int rows = rows_seen(&rd);
  ck_assert_msg(rows == 4, "the SWMR reader saw %d rows, 4 were flushed", rows);
  stop_reader(&rd);
  TU_ASSERT_OK(stab_trace_close(t));
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* The default policy stages rows until a full stage (256 rows), stab_trace_flush or close, when
 * flush_seconds has not passed (an hour here, so that no machine is slow enough to reach it):
 * a reader sees 0 rows after 3 appends, at most the full stage's 256 after 300 (the writer
 * thread may still be writing them), all of them after the flush (which waits for the
 * writer); and close writes the rows still staged, every value as appended. */
enum { MANY = 310 };
START_TEST(test_stage_until_flush) {
  make_tmpdir();
  const char *path = tmp_path("staged.h5");
  reader rd = start_reader(path);
  model md;
  model_init(&md, 21, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 9);
  row_want *want = malloc(MANY * sizeof *want);
  ck_assert_ptr_nonnull(want);
  stab_trace_params p = trace_params(0);
  p.flush_seconds = 3600;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 3);
  int rows = rows_seen(&rd);
  ck_assert_msg(rows == 0, "the reader saw %d rows of 3 staged", rows);
  write_rows(t, m, &md, &r, want, 3, 297);
  rows = rows_seen(&rd);
  ck_assert_msg(rows == 0 || rows == 256, "the reader saw %d rows of 300 appended, not 0 or the full stage's 256",
                rows);
  TU_ASSERT_OK(stab_trace_flush(t));
  rows = rows_seen(&rd);
  ck_assert_msg(rows == 300, "the reader saw %d rows after the flush of 300", rows);
  write_rows(t, m, &md, &r, want, 300, MANY - 300);
  ck_assert_int_eq(stab_trace_steps(t), MANY);
  TU_ASSERT_OK(stab_trace_close(t));
  stop_reader(&rd);
  hid_t f = open_read(path, 0);
  check_file(f, &md, want, MANY);
  H5Fclose(f);
  free(want);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* An append flush_seconds after the last flush hands every staged row to the writer thread,
 * and the next such flush waits until they are written: after two sleeps longer than
 * flush_seconds (a slow machine only lengthens them), each followed by an append, a reader
 * sees every row before the second sleep. */
START_TEST(test_flush_by_time) {
  make_tmpdir();
  const char *path = tmp_path("timed.h5");
  reader rd = start_reader(path);
  model md;
  model_init(&md, 22, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 10);
  row_want want[ROWS];
  stab_trace_params p = trace_params(0);
  p.flush_seconds = 0.2;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 3);
  const struct timespec pause = {0, 300 * 1000 * 1000};
  ck_assert_int_eq(nanosleep(&pause, NULL), 0);
  write_rows(t, m, &md, &r, want, 3, 1);
  ck_assert_int_eq(nanosleep(&pause, NULL), 0);
  write_rows(t, m, &md, &r, want, 4, 1);
  int rows = rows_seen(&rd);
  ck_assert_msg(rows == 4 || rows == 5, "the reader saw %d rows, 4 appended before the last pause of %g s", rows,
                p.flush_seconds);
  stop_reader(&rd);
  TU_ASSERT_OK(stab_trace_close(t));
  hid_t f = open_read(path, 0);
  check_file(f, &md, want, 5);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- resume ------------------------------------------------------------------------------ */

START_TEST(test_append_resume) {
  make_tmpdir();
  model md;
  model_init(&md, 13, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 7);
  row_want want[ROWS];
  stab_trace_params p = trace_params(2);
  stab_trace *t = NULL;
  const char *path = tmp_path("resume.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 3);
  TU_ASSERT_OK(stab_trace_close(t));

  p.append = 1;
  p.run_config = "{\"resumed\": true}"; /* the original stays */
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 3);
  write_rows(t, m, &md, &r, want, 3, ROWS - 3);
  TU_ASSERT_OK(stab_trace_close(t));

  hid_t f = open_read(path, 0);
  check_attrs(f, &md);
  check_file(f, &md, want, ROWS);
  H5Fclose(f);

  /* append on a missing file creates it */
  TU_ASSERT_OK(stab_trace_open(tmp_path("new.h5"), m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 0);
  TU_ASSERT_OK(stab_trace_close(t));
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* Appending keeps the reference of the file's earlier rows, not the first measurement after
 * the resume: a fresh monitor (its own reference would be from row 3) appends rows 3..6, and
 * every ratio is over the first finite value of the whole column; stab_trace_reference says
 * that reference, and stab_monitor_set_reference takes it. (An older format's trace appended to
 * is rewritten as format 4, its ratios made from its rows: tests/programs/trace_readers.sh, on a
 * format 1 trace written by stabmeter 0.1.) */
START_TEST(test_append_keeps_reference) {
  make_tmpdir();
  model md;
  model_init(&md, 17, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 9);
  row_want want[ROWS];
  stab_trace_params p = trace_params(2);
  stab_trace *t = NULL;
  const char *path = tmp_path("reference.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 3);
  TU_ASSERT_OK(stab_trace_close(t));
  stab_metrics first[MAXL];
  for (size_t i = 0; i < md.n; i++) first[i] = *stab_monitor_reference(m, i);
  stab_monitor_free(m);

  m = make_monitor(&md); /* the resumed process's: no reference yet */
  p.append = 1;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 3);
  for (size_t i = 0; i < md.n; i++) {
    stab_metrics ref;
    TU_ASSERT_OK(stab_trace_reference(t, i, &ref));
    /* the first measurement of the first run: forward from row 0, update from row 1 */
    assert_same(ref.forward, want[0].metrics[i].forward, "reference forward", i);
    assert_same(ref.forward, first[i].forward, "monitor reference forward", i);
    assert_same(ref.update, first[i].update, "reference update", i);
    if (md.layers[i].kind != STAB_KIND_ATTENTION) assert_same(ref.update, want[1].metrics[i].update, "update", i);
    TU_ASSERT_NAN(ref.sigma, "only forward, dependency and update: %s", md.layers[i].name);
    TU_ASSERT_NAN(stab_monitor_reference(m, i)->forward, "%s", md.layers[i].name);
    if (i % 2 == 0) TU_ASSERT_OK(stab_monitor_set_reference(m, i, &ref)); /* the others the trace's alone */
  }
  write_rows(t, m, &md, &r, want, 3, ROWS - 3);
  for (size_t i = 0; i < md.n; i++) {
    const stab_metrics *mine = stab_monitor_reference(m, i);
    /* set: the file's; not set: its own first measurement (row 3), which the trace ignores */
    assert_same(mine->forward, i % 2 == 0 ? first[i].forward : want[3].metrics[i].forward, "monitor's forward", i);
    ck_assert_msg(want[3].metrics[i].forward != first[i].forward, "%s: rows 0 and 3 alike", md.layers[i].name);
  }
  TU_ASSERT_OK(stab_trace_close(t));
  hid_t f = open_read(path, 0);
  check_attrs(f, &md); /* version 4 */
  check_file(f, &md, want, ROWS); /* the ratios too, over the column's first finite value */
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* A run resumed from an earlier checkpoint: the rows after its step are removed (steps 30 and
 * 40 of five rows 0..40 when resuming at 25) and the new rows take their place; a resume_step
 * past the last row keeps them all. */
START_TEST(test_append_drops_redone_rows) {
  make_tmpdir();
  model md;
  model_init(&md, 13, D);
  stab_monitor *m = make_monitor(&md);
  tu_rng r;
  tu_rng_init(&r, 11);
  row_want want[ROWS];
  stab_trace_params p = trace_params(1);
  stab_trace *t = NULL;
  const char *path = tmp_path("redo.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  write_rows(t, m, &md, &r, want, 0, 5);
  TU_ASSERT_OK(stab_trace_close(t));

  p.append = 1;
  p.resume_step = 1000; /* after the last row: nothing removed */
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 5);
  TU_ASSERT_OK(stab_trace_close(t));

  p.resume_step = 25;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 3);
  write_rows(t, m, &md, &r, want, 3, ROWS - 3); /* steps 30..60 again, other values */
  TU_ASSERT_OK(stab_trace_close(t));

  hid_t f = open_read(path, 0);
  check_file(f, &md, want, ROWS);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* A monitor whose layers or names differ is refused, naming the difference, and the trace is
 * left as it was. */
/* Disk blocks a file holds, in bytes. */
static off_t allocated(const char *path) {
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  return (off_t)sb.st_blocks * 512;
}

/* The disk reserve is given back at close: a closed trace holds about its size on disk, not
 * the reserve on top (on ext4 a hole punched past the end freed nothing: 556 KB took 1.8 MB).
 * And a file that is not HDF5 given as the trace to append to (a checkpoint, say) is refused
 * before anything touches it: its bytes, its size on disk and its times stay as they were. */
START_TEST(test_disk_left_as_found) {
  make_tmpdir();
  model md;
  model_init(&md, 23, D);
  stab_monitor *m = make_monitor(&md);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_trace *t = NULL;
  const char *path = tmp_path("given_back.h5");
  stab_trace_params p = trace_params(1);
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  for (int64_t s = 1; s <= 300; s++) TU_ASSERT_OK(stab_trace_append(t, s, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  /* a file system block and HDF5's rounding at most, never the reserve (256 KiB and more) */
  ck_assert_msg(allocated(path) <= sb.st_size + 64 * 1024, "a closed trace of %lld bytes holds %lld on disk",
                (long long)sb.st_size, (long long)allocated(path));

  const char *other = tmp_path("model.safetensors");
  FILE *f = fopen(other, "wb");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 4096; i++) fputc(i * 7 & 0xff, f);
  ck_assert_int_eq(fclose(f), 0);
  struct stat before, after;
  ck_assert_int_eq(stat(other, &before), 0);
  off_t blocks = allocated(other);
  p.append = 1;
  TU_ASSERT_STATUS(stab_trace_open(other, m, &p, &t), STAB_EINVAL);
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(stab_last_error(), "not an HDF5 file") && strstr(stab_last_error(), other),
                "message: %s", stab_last_error());
  ck_assert_int_eq(stat(other, &after), 0);
  ck_assert_int_eq(after.st_size, before.st_size);
  ck_assert_int_eq(allocated(other), blocks);
  ck_assert_msg(after.st_mtim.tv_sec == before.st_mtim.tv_sec && after.st_mtim.tv_nsec == before.st_mtim.tv_nsec &&
                after.st_ctim.tv_sec == before.st_ctim.tv_sec && after.st_ctim.tv_nsec == before.st_ctim.tv_nsec,
                "the file's times changed");
  f = fopen(other, "rb");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 4096; i++) ck_assert_int_eq(fgetc(f), i * 7 & 0xff);
  fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

START_TEST(test_append_mismatch) {
  make_tmpdir();
  model md, other;
  model_init(&md, 14, D);
  stab_monitor *m = make_monitor(&md);
  stab_trace_params p = trace_params(1);
  stab_trace *t = NULL;
  const char *path = tmp_path("mismatch.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_OK(stab_trace_append(t, 0, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  p.append = 1;

  /* fc with another d_out */
  model_init(&other, 14, D + 8);
  stab_monitor *m2 = make_monitor(&other);
  TU_ASSERT_STATUS(stab_trace_open(path, m2, &p, &t), STAB_EINVAL);
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(stab_last_error(), "blocks/0/fc") && strstr(stab_last_error(), path),
                "message does not name the layer and path: %s", stab_last_error());
  stab_monitor_free(m2);

  /* one layer fewer */
  stab_monitor *m3 = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m3));
  for (size_t i = 0; i + 1 < md.n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m3, &md.layers[i], NULL));
  TU_ASSERT_STATUS(stab_trace_open(path, m3, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "layers"), "message: %s", stab_last_error());
  /* a layer of another kind under a known name */
  stab_layer l = md.layers[md.n - 1];
  l.kind = STAB_KIND_LINEAR, l.heads = 0, l.weight_k = NULL, l.d_out = D;
  TU_ASSERT_OK(stab_monitor_add_layer(m3, &l, NULL));
  TU_ASSERT_STATUS(stab_trace_open(path, m3, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "'attn'") && strstr(stab_last_error(), "attention"), "message: %s",
                stab_last_error());
  stab_monitor_free(m3);

  /* other scalars, other extras */
  p.n_scalars = 1;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "scalars"), "message: %s", stab_last_error());
  p.n_scalars = NS, p.n_layer_extras = 1;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "layer extras"), "message: %s", stab_last_error());

  /* not a trace: not even HDF5 (refused before HDF5 opens it, as a trace of another format is) */
  FILE *fp = fopen(tmp_path("junk.h5"), "w");
  ck_assert_ptr_nonnull(fp);
  fputs("not hdf5\n", fp);
  fclose(fp);
  p.n_layer_extras = NE;
  TU_ASSERT_STATUS(stab_trace_open(tmp_path("junk.h5"), m, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "junk.h5") && strstr(stab_last_error(), "not a stabmeter trace"),
                "message: %s", stab_last_error());

  hid_t f = open_read(path, 0);
  int64_t *steps;
  ck_assert(read_dataset(f, "step", 1, (void **)&steps) == 1);
  free(steps);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&other);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* While a trace is being written, another process can neither resume it nor replace it. */
START_TEST(test_one_writer) {
  make_tmpdir();
  model md;
  model_init(&md, 20, D);
  stab_monitor *m = make_monitor(&md);
  stab_trace_params p = trace_params(1);
  stab_trace *t = NULL;
  const char *path = tmp_path("busy.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  for (int append = 0; append < 2; append++) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      /* Refused before HDF5 is called, so this child's copy of the writer's state is not used. */
      stab_trace *t2 = NULL;
      p.append = append;
      char msg[600];
      stab_status st = stab_trace_open(path, m, &p, &t2);
      snprintf(msg, sizeof msg, "%d %s", (int)st, stab_last_error());
      _exit(write(fds[1], msg, strlen(msg) + 1) > 0 ? 0 : 1);
    }
    close(fds[1]);
    char msg[600] = "";
    ck_assert_int_gt(read(fds[0], msg, sizeof msg - 1), 0);
    close(fds[0]);
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(atoi(msg) == STAB_EBUSY && strstr(msg, "another process is writing") && strstr(msg, path),
                  "a second writer (append %d) was not refused: %s", append, msg);
  }
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_OK(stab_trace_append(t, 0, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  p.append = 1; /* closed: it can be resumed */
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), 1);
  TU_ASSERT_OK(stab_trace_close(t));
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- writers started together ------------------------------------------------------------ */

enum { RACERS = 4, RACE_ROUNDS = 12 };

/* How the racers of a round open the path: all create it (no file there), all replace a
 * finished trace, or half append and half create (no file there). */
static const char *const race_kinds[] = {"create/create", "replace/replace", "append/create"};

/* The string attribute run_config of a closed trace, into buf. */
static void file_run_config(const char *path, char *buf, size_t len) {
  hid_t f = open_read(path, 0);
  attr_string(f, "run_config", buf, len);
  H5Fclose(f);
}

/* RACERS processes open one path together (released by closing a pipe they all wait on) and
 * hold what they opened until every one has reported; many rounds. Exactly one may open it,
 * the others get STAB_EBUSY naming the path, and the file afterwards is the winner's: its
 * run_config and its single row. No temporary file is left. */
START_TEST(test_writers_race) {
  make_tmpdir();
  model md;
  model_init(&md, 21, D);
  stab_monitor *m = make_monitor(&md);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  for (int round = 0; round < RACE_ROUNDS; round++) {
    const int kind = round % 3;
    char name[32], config[RACERS][64];
    snprintf(name, sizeof name, "race%02d.h5", round);
    const char *p0 = tmp_path(name);
    char path[256];
    snprintf(path, sizeof path, "%s", p0);
    if (kind == 1) { /* a finished trace to replace */
      stab_trace *t = NULL;
      stab_trace_params p = trace_params(1);
      TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
      TU_ASSERT_OK(stab_trace_append(t, -1, 0.0, NULL, NULL));
      TU_ASSERT_OK(stab_trace_close(t));
    }
    int start[2], results[2], hold[2];
    ck_assert_int_eq(pipe(start), 0);
    ck_assert_int_eq(pipe(results), 0);
    ck_assert_int_eq(pipe(hold), 0);
    pid_t pid[RACERS];
    for (int k = 0; k < RACERS; k++) {
      snprintf(config[k], sizeof config[k], "{\"writer\": %d, \"round\": %d}", k, round);
      pid[k] = fork();
      ck_assert_int_ge(pid[k], 0);
      if (pid[k] > 0) continue;
      close(start[1]), close(results[0]), close(hold[1]);
      char c;
      if (read(start[0], &c, 1) != 0) _exit(3); /* EOF: released */
      stab_trace_params p = trace_params(1);
      p.run_config = config[k];
      p.append = kind == 2 && k % 2 == 0;
      stab_trace *t = NULL;
      stab_status st = stab_trace_open(path, m, &p, &t);
      char msg[600];
      snprintf(msg, sizeof msg, "%d %d %s", k, (int)st, st == STAB_OK ? "" : stab_last_error());
      char rec[608];
      memset(rec, 0, sizeof rec);
      memcpy(rec, msg, strlen(msg));
      if (write(results[1], rec, sizeof rec) != (ssize_t)sizeof rec) _exit(4);
      if (read(hold[0], &c, 1) != 0) _exit(5); /* held until every racer has reported */
      if (st == STAB_OK && (stab_trace_append(t, 100 + k, 0.0, NULL, NULL) != STAB_OK || stab_trace_close(t) != STAB_OK))
        _exit(6);
      _exit(0);
    }
    close(start[0]), close(results[1]), close(hold[0]);
    close(start[1]); /* go */
    int winners = 0, winner = -1;
    for (int k = 0; k < RACERS; k++) {
      char rec[608];
      ck_assert_msg(read(results[0], rec, sizeof rec) == (ssize_t)sizeof rec, "round %d: a racer did not report", round);
      int who = -1, st = 0, used = 0;
      ck_assert(sscanf(rec, "%d %d %n", &who, &st, &used) == 2);
      if (st == STAB_OK) {
        winners++, winner = who;
      } else {
        ck_assert_msg(st == STAB_EBUSY && strstr(rec + used, path), "round %d (%s): racer %d: status %d: %s", round,
                      race_kinds[kind], who, st, rec + used);
      }
    }
    close(hold[1]); /* let them finish */
    close(results[0]);
    for (int k = 0; k < RACERS; k++) {
      int status = 0;
      ck_assert_int_eq(waitpid(pid[k], &status, 0), pid[k]);
      ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "round %d: racer %d ended with status 0x%x", round,
                    k, status);
    }
    ck_assert_msg(winners == 1, "round %d (%s): %d writers opened the trace, exactly one may", round, race_kinds[kind],
                  winners);
    char got[256];
    file_run_config(path, got, sizeof got);
    ck_assert_msg(strcmp(got, config[winner]) == 0, "round %d (%s): the trace's run_config is %s, the winner's %s",
                  round, race_kinds[kind], got, config[winner]);
    hid_t f = open_read(path, 0);
    int64_t *steps;
    ck_assert_int_eq(read_dataset(f, "step", 1, (void **)&steps), 1);
    ck_assert_int_eq(steps[0], 100 + winner);
    free(steps);
    H5Fclose(f);
  }
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq %d", tmpdir, RACE_ROUNDS);
  ck_assert_msg(system(cmd) == 0, "a temporary file was left in %s", tmpdir);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- steps ------------------------------------------------------------------------------- */

/* /step must increase: a step not after the last is refused with STAB_ERANGE naming both, the
 * trace goes on; on a resumed trace the last is the file's. */
START_TEST(test_steps_increase) {
  make_tmpdir();
  model md;
  model_init(&md, 22, D);
  stab_monitor *m = make_monitor(&md);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  const char *path = tmp_path("steps.h5");
  stab_trace_params p = trace_params(1);
  stab_trace *t = NULL;
  int64_t last = 0;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  TU_ASSERT_STATUS(stab_trace_last_step(t, &last), STAB_ENOTFOUND);
  TU_ASSERT_STATUS(stab_trace_last_step(t, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_trace_last_step(NULL, &last), STAB_EINVAL);
  TU_ASSERT_OK(stab_trace_append(t, 5, 0.0, NULL, NULL));
  const int64_t bad[] = {5, 3, INT64_MIN};
  for (size_t i = 0; i < 3; i++) {
    TU_ASSERT_STATUS(stab_trace_append(t, bad[i], 0.0, NULL, NULL), STAB_ERANGE, "step %lld", (long long)bad[i]);
    char want[64];
    snprintf(want, sizeof want, "step %lld is not after the last step 5", (long long)bad[i]);
    ck_assert_msg(strstr(stab_last_error(), want) && strstr(stab_last_error(), path), "message: %s", stab_last_error());
    ck_assert_int_eq(stab_trace_failed(t), 0);
  }
  TU_ASSERT_OK(stab_trace_append(t, 6, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_last_step(t, &last));
  ck_assert_int_eq(last, 6);
  ck_assert_int_eq(stab_trace_steps(t), 2);
  TU_ASSERT_OK(stab_trace_close(t));
  p.append = 1;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  TU_ASSERT_OK(stab_trace_last_step(t, &last));
  ck_assert_int_eq(last, 6);
  TU_ASSERT_STATUS(stab_trace_append(t, 6, 0.0, NULL, NULL), STAB_ERANGE);
  TU_ASSERT_OK(stab_trace_append(t, 7, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  hid_t f = open_read(path, 0);
  int64_t *steps;
  ck_assert_int_eq(read_dataset(f, "step", 1, (void **)&steps), 3);
  ck_assert(steps[0] == 5 && steps[1] == 6 && steps[2] == 7);
  free(steps);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- kill -9 ----------------------------------------------------------------------------- */

enum { KILL_AFTER = 12 };

/* A writer appends one row per measurement of a fixed model (flush every step) and reports
 * each on a pipe; after KILL_AFTER rows the parent kills it (_i = 0: wherever it is), or it
 * kills itself at the _i-th write of the next flush; then the parent replays the measurements
 * (deterministic) and checks every row the file holds, opening it as a SWMR reader with
 * nothing repaired. Then append clears the writer's mark and adds rows. */
static const long kill_at_write[] = {0, 1, 3, 8, 20};

START_TEST(test_kill9) {
  const long mid_flush = kill_at_write[_i];
  make_tmpdir();
  const char *path = tmp_path("killed.h5");
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    model md;
    model_init(&md, 15, D);
    stab_monitor *m = make_monitor(&md);
    stab_trace_params p = trace_params(1);
    stab_trace *t = NULL;
    if (stab_trace_open(path, m, &p, &t) != STAB_OK) _exit(3);
    double e[MAXL * NE], s[NS];
    for (int64_t step = 0;; step++) {
      if (stab_monitor_measure(m, 0) != STAB_OK) _exit(4);
      scalars_of(step, s);
      extras_of(step, md.n, e);
      if (mid_flush && step == KILL_AFTER) die_at_write = mid_flush;
      if (stab_trace_append(t, step, 0.5 * (double)step + 0.125, s, e) != STAB_OK) _exit(5);
      if (write(fds[1], "x", 1) != 1) _exit(6);
    }
  }
  close(fds[1]);
  char c;
  for (int k = 0; k < KILL_AFTER; k++)
    ck_assert_msg(read(fds[0], &c, 1) == 1, "the writer stopped after %d rows", k);
  if (!mid_flush) ck_assert_int_eq(kill(pid, SIGKILL), 0);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  close(fds[0]);

  hid_t f = open_read(path, 1);
  int64_t *steps;
  size_t rows = read_dataset(f, "step", 1, (void **)&steps);
  free(steps);
  ck_assert_msg(rows >= KILL_AFTER, "%zu rows after the kill, %d were flushed", rows, KILL_AFTER);
  model md;
  model_init(&md, 15, D);
  stab_monitor *m = make_monitor(&md);
  row_want *want = malloc((rows + 2) * sizeof *want);
  ck_assert_ptr_nonnull(want);
  for (size_t s = 0; s < rows; s++) {
    TU_ASSERT_OK(stab_monitor_measure(m, 0));
    size_t n = md.n;
    want[s].step = (int64_t)s;
    want[s].wall = 0.5 * (double)s + 0.125;
    scalars_of((int64_t)s, want[s].scalars);
    double e[MAXL * NE];
    extras_of((int64_t)s, n, e);
    for (size_t i = 0; i < n; i++) {
      want[s].metrics[i] = *stab_monitor_metrics(m, i);
      memcpy(want[s].extras[i], e + i * NE, sizeof want[s].extras[i]);
      const double *h = stab_monitor_head_bounds(m, i);
      for (size_t k = 0; h && k < HEADS; k++) want[s].heads[i][k] = h[k];
    }
  }
  killed_slack = 1;
  check_file(f, &md, want, rows);
  killed_slack = 0;
  H5Fclose(f);

  /* Resume after the crash: append clears the mark a killed SWMR writer leaves (and trims
   * what a flush cut short wrote past /step: checked with no slack below). */
  stab_trace_params p = trace_params(1);
  p.append = 1;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  ck_assert_int_eq(stab_trace_steps(t), (int64_t)rows);
  for (size_t s = rows; s < rows + 2; s++) {
    TU_ASSERT_OK(stab_monitor_measure(m, 0));
    append_row(t, m, (int64_t)s, &want[s]);
  }
  TU_ASSERT_OK(stab_trace_close(t));
  f = open_read(path, 0); /* closed cleanly now: a plain open works */
  check_file(f, &md, want, rows + 2);
  H5Fclose(f);
  free(want);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* The default flush policy under kill -9: a writer appends BEFORE_PAUSE rows, sleeps longer
 * than flush_seconds (the default, 1 s), appends one more (which hands them all to the writer
 * thread), sleeps again and appends one (a flush, which waits until the rows handed before are
 * written), appends a few (staged), and kills itself. The file must hold every row up to the
 * first flush, each as appended; the later ones may or may not be there. Sleeping makes it
 * independent of speed: a slow machine only flushes more. */
enum { BEFORE_PAUSE = 5, AFTER_FLUSH = 4 };
START_TEST(test_kill9_default_policy) {
  make_tmpdir();
  const char *path = tmp_path("killed-default.h5");
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    model md;
    model_init(&md, 15, D);
    stab_monitor *m = make_monitor(&md);
    stab_trace_params p = trace_params(0);
    p.flush_seconds = stab_trace_default_params().flush_seconds;
    stab_trace *t = NULL;
    if (stab_trace_open(path, m, &p, &t) != STAB_OK) _exit(3);
    double e[MAXL * NE], s[NS];
    for (int64_t step = 0; step <= BEFORE_PAUSE + AFTER_FLUSH; step++) {
      if (step == BEFORE_PAUSE || step == BEFORE_PAUSE + 1) {
        const struct timespec pause = {1, 200 * 1000 * 1000};
        if (nanosleep(&pause, NULL) != 0) _exit(7);
      }
      if (stab_monitor_measure(m, 0) != STAB_OK) _exit(4);
      scalars_of(step, s);
      extras_of(step, md.n, e);
      if (stab_trace_append(t, step, 0.5 * (double)step + 0.125, s, e) != STAB_OK) _exit(5);
    }
    raise(SIGKILL);
    _exit(6);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the writer ended with status 0x%x", status);

  hid_t f = open_read(path, 1);
  int64_t *steps;
  size_t rows = read_dataset(f, "step", 1, (void **)&steps);
  free(steps);
  ck_assert_msg(rows >= BEFORE_PAUSE + 1 && rows <= BEFORE_PAUSE + 1 + AFTER_FLUSH,
                "%zu rows after the kill; %d were appended before the pause and the flush", rows, BEFORE_PAUSE + 1);
  model md;
  model_init(&md, 15, D);
  stab_monitor *m = make_monitor(&md);
  row_want want[BEFORE_PAUSE + 1 + AFTER_FLUSH];
  for (size_t r = 0; r < rows; r++) {
    TU_ASSERT_OK(stab_monitor_measure(m, 0));
    want[r].step = (int64_t)r;
    want[r].wall = 0.5 * (double)r + 0.125;
    scalars_of((int64_t)r, want[r].scalars);
    double e[MAXL * NE];
    extras_of((int64_t)r, md.n, e);
    for (size_t i = 0; i < md.n; i++) {
      want[r].metrics[i] = *stab_monitor_metrics(m, i);
      memcpy(want[r].extras[i], e + i * NE, sizeof want[r].extras[i]);
      const double *h = stab_monitor_head_bounds(m, i);
      for (size_t k = 0; h && k < HEADS; k++) want[r].heads[i][k] = h[k];
    }
  }
  /* The kill can land while the writer thread is writing a batch, between its flush of the
   * other datasets and its flush of /step (write_rows): those may then hold rows more than
   * /step counts, up to every row appended, never fewer. Seen in a make distcheck beside
   * other tests: wall_time one row longer. */
  killed_slack = BEFORE_PAUSE + 1 + AFTER_FLUSH - rows;
  check_file(f, &md, want, rows);
  killed_slack = 0;
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- failures ---------------------------------------------------------------------------- */

static int hdf5_printed;
static herr_t count_prints(hid_t stack, void *data) {
  (void)stack, (void)data;
  hdf5_printed++;
  return 0;
}

START_TEST(test_no_directory) {
  model md;
  model_init(&md, 16, D);
  stab_monitor *m = make_monitor(&md);
  /* The caller's HDF5 error printer is never called by the library, and is still set after. */
  H5Eset_auto2(H5E_DEFAULT, count_prints, NULL);
  stab_trace *t = (stab_trace *)&md;
  const char *path = "/nonexistent-stabmeter-dir/sub/trace.h5";
  TU_ASSERT_STATUS(stab_trace_open(path, m, NULL, &t), STAB_EIO);
  ck_assert_ptr_null(t);
  ck_assert_msg(strstr(stab_last_error(), path), "message does not name the path: %s", stab_last_error());
  ck_assert_msg(strstr(stab_last_error(), "No such file or directory"), "no HDF5/errno text: %s",
                stab_last_error());
  ck_assert_int_eq(hdf5_printed, 0);
  H5E_auto2_t fn = NULL;
  void *data = (void *)1;
  H5Eget_auto2(H5E_DEFAULT, &fn, &data);
  ck_assert_msg(fn == count_prints && data == NULL, "the caller's HDF5 error handler was not restored");
  ck_assert_str_eq(stab_strerror(STAB_EIO), "file input/output error");
  stab_monitor_free(m);
  model_free(&md);
}
END_TEST

/* On a full disk the failing append returns STAB_EIO naming the path and the system's message,
 * later ones follow on_error, and every row appended before the failure is in the file. */
START_TEST(test_write_failure) {
  const stab_trace_on_error mode = _i ? STAB_TRACE_CONTINUE : STAB_TRACE_STOP;
  make_tmpdir();
  model md;
  model_init(&md, 17, D);
  stab_monitor *m = make_monitor(&md);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_trace_params p = trace_params(1);
  p.on_error = mode;
  stab_trace *t = NULL;
  const char *path = tmp_path("full.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  for (int64_t s = 0; s < 3; s++) TU_ASSERT_OK(stab_trace_append(t, s, 0.0, NULL, NULL));
  struct stat sb;
  ck_assert_int_eq(stat(path, &sb), 0);
  disk_limit = sb.st_size;
  int64_t good = 3;
  stab_status st = STAB_OK;
  while (good < 2000 && (st = stab_trace_append(t, good, 0.0, NULL, NULL)) == STAB_OK) good++;
  ck_assert_msg(st == STAB_EIO, "no write failure on a full disk (%lld rows), status %d", (long long)good, (int)st);
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "No space left on device"),
                "message does not name the path and the cause: %s", stab_last_error());
  ck_assert_msg(!beyond_path_holds(stab_last_error(), path, ".tmp") && !beyond_path_holds(stab_last_error(), path, "0x") &&
                    !strstr(stab_last_error(), "file descriptor"),
                "HDF5's details reach the message: %s", stab_last_error());
  ck_assert_int_eq(stab_trace_failed(t), 1);
  char first[512];
  snprintf(first, sizeof first, "%s", stab_last_error());
  if (mode == STAB_TRACE_STOP) {
    TU_ASSERT_STATUS(stab_trace_append(t, good + 1, 0.0, NULL, NULL), STAB_EIO);
    ck_assert_str_eq(stab_last_error(), first);
    TU_ASSERT_STATUS(stab_trace_flush(t), STAB_EIO);
  } else {
    TU_ASSERT_OK(stab_trace_append(t, good + 1, 0.0, NULL, NULL));
    TU_ASSERT_OK(stab_trace_flush(t));
    ck_assert_int_eq(stab_trace_failed(t), 1);
    ck_assert_int_eq(stab_trace_steps(t), good);
  }
  stab_status closed = stab_trace_close(t); /* may fail again: the disk is still full */
  ck_assert_msg(closed == STAB_OK || (closed == STAB_EIO && strstr(stab_last_error(), path)), "close: %d %s",
                (int)closed, stab_last_error());
  disk_limit = 0;

  /* Every row appended before the failure is there. */
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) f = open_read(path, 1); /* if the close could not clear the writer's mark */
  int64_t *steps;
  hsize_t n = read_dataset(f, "step", 1, (void **)&steps);
  ck_assert_msg(n >= (hsize_t)good, "%llu rows after the failure, %lld were appended", (unsigned long long)n,
                (long long)good);
  for (int64_t s = 0; s < good; s++) ck_assert_int_eq(steps[s], s);
  free(steps);
  double *v;
  ck_assert(read_dataset(f, "layers/ln_f/forward", 0, (void **)&v) >= (hsize_t)good);
  for (int64_t s = 0; s < good; s++) assert_same(v[s], stab_monitor_metrics(m, 4)->forward, "ln_f/forward", (size_t)s);
  free(v);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* A full disk met by a delayed flush: FLUSHED rows are in the file, a writer appending to it
 * (so that it holds no room reserved yet) stages rows across a chunk boundary (so the flush
 * needs new room), and the disk has none. _i = 0: close writes them and returns the failure;
 * _i = 1: an append flush_seconds after the last flush hands them to the writer thread, which
 * fails, and the next append (the next flush, after another pause) returns it, or an earlier
 * one if the machine was slow enough to flush by time already; _i = 2 the same with on_error
 * CONTINUE (returned once, then nothing). Either way the call returns
 * STAB_EIO naming the path and the cause, every flushed row is there, HDF5 never wrote on the
 * full disk, and the file closes cleanly. */
enum { FLUSHED = 250, STAGED = 10 };
START_TEST(test_delayed_write_failure) {
  const int by_time = _i >= 1, go_on = _i == 2; /* 2: on_error CONTINUE */
  make_tmpdir();
  model md;
  model_init(&md, 23, D);
  stab_monitor *m = make_monitor(&md);
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_trace_params p = trace_params(0);
  p.flush_seconds = by_time ? 0.2 : 3600;
  if (go_on) p.on_error = STAB_TRACE_CONTINUE;
  stab_trace *t = NULL;
  const char *path = tmp_path("full-later.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  for (int64_t s = 0; s < FLUSHED; s++) TU_ASSERT_OK(stab_trace_append(t, s, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  p.append = 1;
  TU_ASSERT_OK(stab_trace_open(path, m, &p, &t));
  no_room = 1;
  stab_status st = STAB_OK;
  int64_t failed_at = -1;
  for (int64_t s = FLUSHED; s < FLUSHED + STAGED && st == STAB_OK; s++) {
    /* a failure is the caller's at the call that returns it (the trainer's "said once") */
    ck_assert_int_eq(stab_trace_failed(t), 0);
    st = stab_trace_append(t, s, 0.0, NULL, NULL);
    if (st != STAB_OK) failed_at = s;
  }
  if (by_time) {
    for (int64_t s = FLUSHED + STAGED; s < FLUSHED + STAGED + 2 && st == STAB_OK; s++) {
      const struct timespec pause = {0, 300 * 1000 * 1000};
      ck_assert_int_eq(nanosleep(&pause, NULL), 0);
      failed_at = s;
      ck_assert_int_eq(stab_trace_failed(t), 0);
      st = stab_trace_append(t, s, 0.0, NULL, NULL);
    }
    ck_assert_msg(st == STAB_EIO, "no failure from the delayed flush on a full disk: status %d", (int)st);
    ck_assert_msg(failed_at >= CHUNK_ROWS_TEST, "the append of step %lld failed, before a new chunk", (long long)failed_at);
  } else {
    ck_assert_msg(st == STAB_OK, "an append failed with nothing to flush (step %lld): %s", (long long)failed_at,
                  stab_last_error());
    st = stab_trace_close(t);
    t = NULL;
    ck_assert_msg(st == STAB_EIO, "close wrote on a full disk without an error: status %d", (int)st);
  }
  ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), "No space left on device"),
                "message does not name the path and the cause: %s", stab_last_error());
  if (t) {
    ck_assert_int_eq(stab_trace_failed(t), 1);
    if (go_on) { /* returned once, then the trace is off */
      TU_ASSERT_OK(stab_trace_append(t, FLUSHED + STAGED + 2, 0.0, NULL, NULL));
      TU_ASSERT_OK(stab_trace_flush(t));
    } else {
      TU_ASSERT_STATUS(stab_trace_append(t, FLUSHED + STAGED + 2, 0.0, NULL, NULL), STAB_EIO);
    }
    ck_assert_int_eq(stab_trace_failed(t), 1);
    TU_ASSERT_OK(stab_trace_close(t)); /* HDF5 wrote nothing on the full disk: it closes cleanly */
  }
  no_room = 0;
  hid_t f = open_read(path, 0); /* closed cleanly: a plain open works */
  int64_t *steps;
  hsize_t n = read_dataset(f, "step", 1, (void **)&steps);
  ck_assert_msg(n >= FLUSHED && n < CHUNK_ROWS_TEST, "%llu rows after the failure, %d were flushed before it",
                (unsigned long long)n, FLUSHED);
  for (hsize_t s = 0; s < n; s++) ck_assert_int_eq(steps[s], (int64_t)s);
  free(steps);
  double *v;
  ck_assert(read_dataset(f, "layers/ln_f/forward", 0, (void **)&v) == n);
  for (hsize_t s = 0; s < n; s++) assert_same(v[s], stab_monitor_metrics(m, 4)->forward, "ln_f/forward", (size_t)s);
  free(v);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* A trace that cannot be created (the disk is full) leaves the file that was at its path as it
 * was, no temporary file, a message naming the path in words, and a process that exits quietly. */
START_TEST(test_create_failure) {
  make_tmpdir();
  model md;
  model_init(&md, 19, D);
  /* One thread: the child below is forked from this process, and under LeakSanitizer a child
   * forked from a process with threads (the monitor's layer threads) inherits a registry of
   * threads it does not have and says so at exit ("Running thread ... was not suspended"),
   * which is the sanitizer's noise, not the HDF5 noise at exit that this test is about. */
  stab_monitor_params mp = stab_monitor_default_params();
  mp.metrics.spectral.threads = 1;
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&mp, &m));
  for (size_t i = 0; i < md.n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &md.layers[i], NULL));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_trace *t = NULL;
  const char *path = tmp_path("kept.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, NULL, &t));
  TU_ASSERT_OK(stab_trace_append(t, 42, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  /* In a child that leaves with exit(), as a program does: HDF5 1.10.8 crashes at exit (in
   * H5F__close_cb) or prints "infinite loop closing library" in a process where a write of its
   * failed, so the library must not let HDF5 write on a full disk. Its stderr must stay empty. */
  int fds[2], errs[2];
  ck_assert_int_eq(pipe(fds), 0);
  ck_assert_int_eq(pipe(errs), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(errs[0]);
    dup2(errs[1], STDERR_FILENO);
    char msg[600];
    disk_limit = 4096;
    stab_status st = stab_trace_open(path, m, NULL, &t);
    snprintf(msg, sizeof msg, "%d %d %s", (int)st, t == NULL, stab_last_error());
    exit(write(fds[1], msg, strlen(msg) + 1) > 0 ? 0 : 1);
  }
  close(fds[1]);
  close(errs[1]);
  char msg[600] = "", noise[4096] = "";
  ck_assert_int_gt(read(fds[0], msg, sizeof msg - 1), 0);
  close(fds[0]);
  ssize_t got = 0, r;
  while (got < (ssize_t)sizeof noise - 1 && (r = read(errs[0], noise + got, sizeof noise - 1 - (size_t)got)) > 0) got += r;
  close(errs[0]);
  int status = 0, st = 0, null_out = 0, used = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the process ended with status 0x%x after a failed "
                "open (signal %d)", status, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ck_assert_msg(got == 0, "the process printed at exit: %.300s", noise);
  ck_assert_msg(sscanf(msg, "%d %d %n", &st, &null_out, &used) == 2, "child said: %s", msg);
  ck_assert_msg(st == STAB_EIO && null_out, "open on a full disk: status %d, out %s NULL", st, null_out ? "" : "not");
  ck_assert_msg(strstr(msg + used, path) && strstr(msg + used, "No space left on device"), "message: %s", msg + used);
  ck_assert_msg(!beyond_path_holds(msg + used, path, ".tmp") && !beyond_path_holds(msg + used, path, "0x"),
                "the message names the temporary file or an address: %s", msg + used);
  hid_t f = open_read(path, 0);
  int64_t *steps;
  ck_assert(read_dataset(f, "step", 1, (void **)&steps) == 1);
  ck_assert_int_eq(steps[0], 42);
  free(steps);
  H5Fclose(f);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", tmpdir);
  ck_assert_msg(system(cmd) == 0, "a temporary file was left in %s", tmpdir);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* Whether text holds LeakSanitizer's own lines only: "==PID==Running thread N was not
 * suspended. False leaks are possible.", its "Suppressions used:" table and rules of dashes. */
static int lsan_lines_only(const char *text) {
  for (const char *line = text; *line;) {
    const char *end = strchr(line, '\n');
    size_t n = end ? (size_t)(end - line) : strlen(line);
    char buf[256];
    snprintf(buf, sizeof buf, "%.*s", (int)(n < sizeof buf - 1 ? n : sizeof buf - 1), line);
    char name[200];
    unsigned long count, bytes;
    int ours = (buf[0] == '=' && strstr(buf, "False leaks are possible.")) || strspn(buf, "-") == n ||
               !strcmp(buf, "Suppressions used:") || strstr(buf, "count      bytes template") ||
               sscanf(buf, " %lu %lu %199s", &count, &bytes, name) == 3;
    if (!ours) return 0;
    line += n + (end ? 1 : 0);
  }
  return 1;
}

/* A child forked from a process with an open trace (background writer: flush_every 0) holds a
 * copy of it: appending or flushing there fails naming the parent's pid, closing returns at once
 * (no join of a thread it does not have, no destroy of sync objects its parent's writer holds),
 * and the child leaving with exit() after its parent closed the trace touches nothing (HDF5's
 * own handler at exit wrote the child's stale copy over the file): the parent's file holds
 * every row it appended, none of the child's. */
enum { FORK_ROWS = 3000 };
START_TEST(test_forked_child) {
  make_tmpdir();
  model md;
  model_init(&md, 23, D);
  stab_monitor_params mp = stab_monitor_default_params();
  mp.metrics.spectral.threads = 1; /* see test_create_failure: a child of a threaded process */
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(&mp, &m));
  for (size_t i = 0; i < md.n; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &md.layers[i], NULL));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  stab_trace *t = NULL;
  const char *path = tmp_path("forked.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, NULL, &t));
  for (int64_t s = 1; s <= 3; s++) TU_ASSERT_OK(stab_trace_append(t, s, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_flush(t));
  TU_ASSERT_OK(stab_trace_append(t, 4, 0.0, NULL, NULL)); /* staged, not written */
  int errs[2], go[2];
  ck_assert_int_eq(pipe(errs), 0);
  ck_assert_int_eq(pipe(go), 0);
  fflush(NULL);
  pid_t parent = getpid(), pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(errs[0]);
    close(go[1]);
    dup2(errs[1], STDERR_FILENO); /* HDF5 at exit must have nothing to say either */
    alarm(30); /* a hang becomes a death by SIGALRM, which the parent reports */
    char want[64];
    snprintf(want, sizeof want, "belongs to process %ld", (long)parent);
    int bad = 0;
    if (stab_trace_append(t, 5, 0.0, NULL, NULL) != STAB_ESTATE || !strstr(stab_last_error(), want)) bad |= 1;
    if (stab_trace_flush(t) != STAB_ESTATE || !strstr(stab_last_error(), want)) bad |= 2;
    if (stab_trace_steps(t) != 4) bad |= 4;
    char c;
    if (read(go[0], &c, 1) != 1) bad |= 16; /* the parent has closed the trace */
    if (stab_trace_close(t) != STAB_OK) bad |= 8;
    exit(bad ? 10 + bad : 0); /* exit(), not _exit(): the atexit handlers run, HDF5's too */
  }
  close(errs[1]);
  close(go[0]);
  /* enough rows that the file grows past what the child's copy of HDF5 knows of it */
  for (int64_t s = 5; s <= FORK_ROWS; s++) TU_ASSERT_OK(stab_trace_append(t, s, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  ck_assert_int_eq(write(go[1], "g", 1), 1);
  close(go[1]);
  char noise[4096] = "";
  ssize_t got = 0, r;
  while (got < (ssize_t)sizeof noise - 1 && (r = read(errs[0], noise + got, sizeof noise - 1 - (size_t)got)) > 0) got += r;
  close(errs[0]);
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  /* LeakSanitizer, in the sanitizer build, says at the child's exit that the threads it
   * inherited the memory of are not running, and which suppressions it used: its own lines */
  if (getenv("STAB_SANITIZED") && got > 0 && lsan_lines_only(noise)) got = 0;
  ck_assert_msg(got == 0, "the child printed: %.300s", noise);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status 0x%x (signal %d, exit %d)", status,
                WIFSIGNALED(status) ? WTERMSIG(status) : 0, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  hid_t f = open_read(path, 0);
  int64_t *steps;
  ck_assert_int_eq(read_dataset(f, "step", 1, (void **)&steps), FORK_ROWS);
  for (int64_t s = 0; s < FORK_ROWS; s++) ck_assert_int_eq(steps[s], s + 1);
  free(steps);
  H5Fclose(f);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- storage shared between layers ------------------------------------------------------ */

/* The shares_storage_with names of a group, joined by ' ' into buf ("" when it has none). */
static void shared_with(hid_t f, const char *group, char *buf, size_t len) {
  layer_string(f, group, "shares_storage_with", buf, len); /* format 4: space-separated already */
}

/* f32 values as 16-bit patterns: bf16 (the high halves), also finite numbers of about the same
 * size read as f16 (the f16 exponent is the bf16 one's high bits). n16 NULL: as they are. */
static const float *as_stored(const float *x, size_t n, uint16_t **n16) {
  if (!n16) return x;
  *n16 = malloc(n * sizeof **n16);
  ck_assert(*n16 != NULL);
  for (size_t i = 0; i < n; i++) {
    uint32_t bits;
    memcpy(&bits, &x[i], sizeof bits);
    (*n16)[i] = (uint16_t)(bits >> 16);
  }
  return (const float *)(const void *)*n16;
}

/* A tied table (one buffer as embedding and LM head), q and k inside an out-major fused qkv
 * (llm.c: contiguous blocks), and in HF's in-major [d][3d] c_attn, where q, k and v interleave
 * row by row: a linear over v alone shares nothing with the attention over q and k although
 * their address ranges overlap. Summing param_count_unique counts each number once. Loop index:
 * the layers stored as F32, BF16, F16 (2-byte elements: the same counts of parameters). */
START_TEST(test_shared_storage) {
  enum { C = 8 };
  static const stab_dtype dtypes[] = {STAB_DTYPE_F32, STAB_DTYPE_BF16, STAB_DTYPE_F16};
  const stab_dtype dt = dtypes[_i];
  float *table32 = tu_floats(V * C), *qkv32 = tu_floats(3 * C * C), *conv32 = tu_floats(3 * C * C),
        *other32 = tu_floats(C * C);
  tu_rng r;
  tu_rng_init(&r, 3);
  tu_fill_gauss(table32, 1, V * C, V * C, 1.0, &r);
  tu_fill_gauss(qkv32, 1, 3 * C * C, 3 * C * C, 0.2, &r);
  tu_fill_gauss(conv32, 1, 3 * C * C, 3 * C * C, 0.2, &r);
  tu_fill_gauss(other32, 1, C * C, C * C, 0.2, &r);
  uint16_t *h[4] = {NULL};
  const int wide = dt != STAB_DTYPE_F32;
  /* offsets below count elements: cast to the 16-bit arrays' element pointers first */
  const float *table = as_stored(table32, V * C, wide ? &h[0] : NULL);
  const float *qkv = as_stored(qkv32, 3 * C * C, wide ? &h[1] : NULL);
  const float *conv = as_stored(conv32, 3 * C * C, wide ? &h[2] : NULL);
  const float *other = as_stored(other32, C * C, wide ? &h[3] : NULL);
#define EL(p, k) (wide ? (const float *)(const void *)((const uint16_t *)(const void *)(p) + (k)) : (p) + (k))
  stab_layer layers[] = {
      {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = C, .weight = table},
      {.name = "qkv", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = 3 * C, .weight = qkv},
      {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = 2, .weight = qkv,
       .weight_k = EL(qkv, C * C)},
      {.name = "v", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C,
       .weight = EL(conv, 2 * C)},
      {.name = "hf_attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = 2,
       .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3 * C, .weight = conv, .weight_k = EL(conv, C)},
      {.name = "c_attn", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = 3 * C, .layout = STAB_LAYOUT_IN_MAJOR,
       .weight = conv},
      {.name = "other", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .weight = other},
      {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = C, .weight = table},
  };
  static const struct {
    const char *group, *with;
    int64_t unique;
  } want[] = {
      {"layers/wte", "lm_head", V * C},
      {"layers/qkv", "attn", 3 * C * C},
      {"layers/attn", "qkv", 0},
      {"layers/v", "c_attn", C * C},
      {"layers/hf_attn", "c_attn", 2 * C * C},
      {"layers/c_attn", "v hf_attn", 0},
      {"layers/other", "", C * C},
      {"layers/lm_head", "wte", 0},
  };
#undef EL
  make_tmpdir();
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
    layers[i].dtype = dt;
    TU_ASSERT_OK(stab_monitor_add_layer(m, &layers[i], NULL), "dtype %d, %s", (int)dt, layers[i].name);
  }
  stab_trace *t = NULL;
  const char *path = tmp_path("shared.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, NULL, &t));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_OK(stab_trace_append(t, 1, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  hid_t f = open_read(path, 0);
  int64_t sum = 0, distinct = V * C + 3 * C * C + 3 * C * C + C * C;
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char got[256];
    shared_with(f, want[i].group, got, sizeof got);
    ck_assert_msg(strcmp(got, want[i].with) == 0, "dtype %d: %s shares storage with '%s', expected '%s'", (int)dt,
                  want[i].group, got, want[i].with);
    int64_t u = layer_int(f, want[i].group, "param_count_unique");
    ck_assert_msg(u == want[i].unique, "dtype %d: %s: param_count_unique %lld, expected %lld", (int)dt, want[i].group,
                  (long long)u, (long long)want[i].unique);
    sum += u;
  }
  ck_assert_int_eq(sum, distinct);
  H5Fclose(f);
  stab_monitor_free(m);
  free(table32), free(qkv32), free(conv32), free(other32);
  for (int k = 0; k < 4; k++) free(h[k]);
  remove_tmpdir();
}
END_TEST

/* Grouped-query attention (4 query heads, 2 key heads): the trace counts k as the 2 heads it
 * has (param_count q + k, not twice q), and the storage k spans ends where k does, so a layer
 * stored right after it shares nothing with the attention. */
START_TEST(test_gqa_storage) {
  enum { C = 16, KD = 4 }; /* KD: the head width */
  float *buf = tu_floats(C * C + 2 * KD * C + C * C); /* q [16][16], k [8][16], then another matrix */
  tu_rng r;
  tu_rng_init(&r, 5);
  tu_fill_gauss(buf, 1, C * C + 2 * KD * C + C * C, C * C + 2 * KD * C + C * C, 0.2, &r);
  const float *q = buf, *k = buf + C * C, *after = k + 2 * KD * C;
  const stab_layer layers[] = {
      {.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = 4, .kv_heads = 2, .weight = q,
       .weight_k = k},
      {.name = "k_proj", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = 2 * KD, .weight = k},
      {.name = "after", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = C, .weight = after},
  };
  make_tmpdir();
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  for (size_t i = 0; i < 3; i++) TU_ASSERT_OK(stab_monitor_add_layer(m, &layers[i], NULL));
  stab_trace *t = NULL;
  const char *path = tmp_path("gqa.h5");
  TU_ASSERT_OK(stab_trace_open(path, m, NULL, &t));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  TU_ASSERT_OK(stab_trace_append(t, 1, 0.0, NULL, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  hid_t f = open_read(path, 0);
  ck_assert_int_eq(layer_int(f, "layers/attn", "param_count"), C * C + 2 * KD * C);
  ck_assert_int_eq(layer_int(f, "layers/attn", "param_count_unique"), C * C + 2 * KD * C); /* registered first: q and k */
  ck_assert_int_eq(layer_int(f, "layers/after", "param_count_unique"), C * C);
  char got[256];
  shared_with(f, "layers/after", got, sizeof got);
  ck_assert_msg(strcmp(got, "") == 0, "after shares storage with '%s'", got);
  shared_with(f, "layers/k_proj", got, sizeof got);
  ck_assert_str_eq(got, "attn");
  H5Fclose(f);
  stab_monitor_free(m);
  /* key heads that do not divide the heads, and grouped-query in-major, are refused */
  stab_layer bad = layers[0];
  bad.kv_heads = 3;
  stab_metrics out;
  TU_ASSERT_STATUS(stab_layer_metrics(&bad, NULL, NULL, &out, NULL), STAB_ERANGE);
  bad.kv_heads = 2, bad.layout = STAB_LAYOUT_IN_MAJOR;
  TU_ASSERT_STATUS(stab_layer_metrics(&bad, NULL, NULL, &out, NULL), STAB_EINVAL);
  free(buf);
  remove_tmpdir();
}
END_TEST

START_TEST(test_arguments) {
  make_tmpdir();
  model md;
  model_init(&md, 18, D);
  stab_monitor *m = make_monitor(&md);
  stab_trace *t = NULL;
  const char *path = tmp_path("args.h5");
  stab_trace_params p = stab_trace_default_params();
  ck_assert_int_eq(p.flush_every, 0);
  ck_assert(p.flush_seconds == 1.0); /* the default a kill -9 loses at most of (docs/manual/trace.md) */
  ck_assert_int_eq(p.on_error, STAB_TRACE_STOP);
  ck_assert_int_eq(p.append, 0);
  TU_ASSERT_STATUS(stab_trace_open(path, m, NULL, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_trace_open(NULL, m, NULL, &t), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_trace_open(path, NULL, NULL, &t), STAB_EINVAL);
  p.flush_every = -1;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);
  p = stab_trace_default_params();
  const double bad_seconds[] = {-1.0, NAN, INFINITY, 1e6};
  for (size_t k = 0; k < 4; k++) {
    p.flush_seconds = bad_seconds[k];
    TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL, "flush_seconds %g", bad_seconds[k]);
    ck_assert_msg(strstr(stab_last_error(), "flush_seconds"), "message: %s", stab_last_error());
    ck_assert_ptr_null(t);
  }
  p = stab_trace_default_params();
  /* "step" names each group's copy of /step */
  const char *bad[][2] = {{"loss", "a/b"}, {"loss", "loss"}, {"loss", ""}, {"loss", "step"}};
  for (size_t k = 0; k < 4; k++) {
    p.scalars = bad[k], p.n_scalars = 2;
    TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL, "scalars %zu", k);
    ck_assert_ptr_null(t);
  }
  p = stab_trace_default_params();
  const char *clash[] = {"sigma"}, *step[] = {"step"};
  p.layer_extras = clash, p.n_layer_extras = 1;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);
  p.layer_extras = step;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "'step' is taken"), "message: %s", stab_last_error());
  p.layer_extras = NULL;
  TU_ASSERT_STATUS(stab_trace_open(path, m, &p, &t), STAB_EINVAL);

  /* "a/b" and "a.b" would share a group */
  stab_layer l = md.layers[4];
  l.name = "blocks.0.fc";
  TU_ASSERT_OK(stab_monitor_add_layer(m, &l, NULL));
  TU_ASSERT_STATUS(stab_trace_open(path, m, NULL, &t), STAB_EEXIST);
  ck_assert_msg(strstr(stab_last_error(), "blocks/0/fc") && strstr(stab_last_error(), "blocks.0.fc"), "message: %s",
                stab_last_error());

  TU_ASSERT_OK(stab_trace_close(NULL));
  ck_assert_int_eq(stab_trace_steps(NULL), 0);
  ck_assert_int_eq(stab_trace_failed(NULL), 0);
  TU_ASSERT_STATUS(stab_trace_append(NULL, 0, 0.0, NULL, NULL), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_trace_flush(NULL), STAB_EINVAL);
  stab_monitor_free(m);
  model_free(&md);
  remove_tmpdir();
}
END_TEST

static Suite *trace_suite(void) {
  Suite *s = suite_create("trace");
  TCase *tc = tcase_create("write");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_schema_and_values, 0, 3);
  tcase_add_test(tc, test_flush_visible);
  tcase_add_test(tc, test_append_resume);
  tcase_add_test(tc, test_append_keeps_reference);
  tcase_add_test(tc, test_append_drops_redone_rows);
  tcase_add_test(tc, test_append_mismatch);
  tcase_add_test(tc, test_disk_left_as_found);
  tcase_add_test(tc, test_one_writer);
  tcase_add_test(tc, test_writers_race);
  tcase_add_test(tc, test_steps_increase);
  tcase_add_loop_test(tc, test_kill9, 0, (int)(sizeof kill_at_write / sizeof kill_at_write[0]));
  tcase_add_test(tc, test_kill9_default_policy);
  tcase_add_test(tc, test_stage_until_flush);
  tcase_add_test(tc, test_flush_by_time);
  suite_add_tcase(s, tc);
  tc = tcase_create("failures");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_no_directory);
  tcase_add_loop_test(tc, test_write_failure, 0, 2);
  tcase_add_loop_test(tc, test_delayed_write_failure, 0, 3);
  tcase_add_test(tc, test_create_failure);
  tcase_add_test(tc, test_forked_child);
  tcase_add_test(tc, test_arguments);
  tcase_add_loop_test(tc, test_shared_storage, 0, 3);
  tcase_add_test(tc, test_gqa_storage);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(trace_suite());
  srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose names every test */
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
