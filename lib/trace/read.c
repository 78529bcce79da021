/* read.c — the one reader of stabmeter traces (include/stabmeter/trace_read.h): a trace of any
 * format_version 1 to 4 opened, checked against the schema, its names listed and its columns read
 * a range of rows at a time. stabmeter-export, the Python package's read_trace (and through it the
 * notebooks) and the fuzz target tests/fuzz/fuzz_trace.c all read through it.
 * One concern, reading a trace, past 800 lines: most of it is the schema of four formats checked
 * object by object against damaged files (every HDF5 call checked, every message naming the
 * object), then the lazily read attributes and the row reads. */
#include "core/core.h"
#include "trace/hdf5_lock.h"

#include <hdf5.h>

#include <ctype.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* The writer's metric datasets in its order (lib/trace/trace.c); a layer's other datasets (attention
 * head bounds, layer extras) follow them in name order. */
static const char *const metric_order[] = {
    "forward",       "dependency",   "update",       "forward_tight", "dependency_tight",
    "update_tight",  "spread",       "sigma",        "sigma_rel_err", "sigma_update",
    "sigma_update_rel_err", "rel_update", "passes",  "update_passes", "flags",
    "forward_ratio", "dependency_ratio", "update_ratio"}; /* format_version 3 on */
enum { N_ORDERED = sizeof metric_order / sizeof metric_order[0], N_REQUIRED = 3 };

/* Metadata read attempts while the writer runs: see open_file. */
enum { LIVE_READ_ATTEMPTS = 24 };

/* One column of the trace as the reader shows it. */
typedef struct {
  char *name; /* the dataset's name in its group: "forward", "head0_bound", "loss" ... (format 4:
                 the metric, or head<h>_bound for column `at` of /layers/head_bound) */
  hid_t d;    /* format 4's layer columns: a (step, layer) or (step, head) dataset of trace.wide */
  hsize_t at; /* in d, when two-dimensional: the column (the layer's, or the head's) */
  int shared; /* d is one of trace.wide: not closed with the column */
} trace_column;

typedef struct {
  char *group;        /* the layer's name: its group under /layers before format 4 ('/' of the
                         registered name already '.'), its value of /layers/layer since */
  char *kind;
  size_t index;       /* format 4: its position along the layer dimension */
  trace_column *cols; /* the writer's metric order, then the others by name */
  size_t n_cols;
  stab_trace_attr *attrs; /* read by stab_trace_read_layer_attrs; the strings are the reader's */
  size_t n_attrs;
} trace_layer;

struct stab_trace_reader {
  char *path;
  int fd;              /* the file as stab_input_open opened it, held while the trace is open */
  dev_t dev;           /* and its identity, so that an output file can be told from it */
  ino_t ino;
  int live;            /* its writer was running at the open (it holds the write lock) */
  hid_t file, step;
  int swmr;            /* opened with SWMR_READ */
  int64_t version;     /* format_version: 1, 2 (each group also holds a copy of /step, "step"), 3
                          (ratios), 4 (one (step, layer) dataset per metric under /layers) */
  hsize_t rows;        /* len(/step): the rows every dataset has (others may be longer) */
  trace_column wall;   /* /wall_time; wall.d < 0 when not read */
  trace_column *scalars; /* by name */
  size_t n_scalars;
  trace_layer *layers; /* by name, numbers in names compared as numbers */
  size_t n_layers;
  hid_t *wide;         /* format 4: the two-dimensional datasets of /layers open */
  size_t n_wide;
  char *run_config;    /* read by stab_trace_read_run_config */
  int attrs_read;      /* every layer's attrs read */
  char **strings;      /* what the attributes' text points to, freed at close */
  size_t n_strings;
};

/* The reader is `trace` in what follows, the filter its params. */
typedef stab_trace_reader trace;
typedef stab_trace_read_params trace_filter;

/* ---- messages -------------------------------------------------------------------------- */

/* A trace that breaks the schema, a file that is not one, or one HDF5 cannot read:
 * STAB_EFORMAT, the message "PATH: ..." (for stab_last_error). */
static stab_status bad_as(trace *t, stab_status status, const char *fmt, va_list ap) {
  char msg[1024];
  int n = snprintf(msg, sizeof msg, "%s: ", t->path);
  if (n >= 0 && (size_t)n < sizeof msg) vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
  return stabi_fail(status, "%s", msg);
}

static stab_status bad(trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static stab_status bad(trace *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  stab_status rc = bad_as(t, STAB_EFORMAT, fmt, ap);
  va_end(ap);
  return rc;
}

/* A read of rows that failed: STAB_EIO, the message as bad's. */
static stab_status bad_read(trace *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static stab_status bad_read(trace *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  stab_status rc = bad_as(t, STAB_EIO, fmt, ap);
  va_end(ap);
  return rc;
}

static stab_status oom(trace *t) {
  (void)t;
  return stabi_fail(STAB_ENOMEM, "out of memory");
}

static herr_t deepest_cb(unsigned n, const H5E_error2_t *e, void *data) {
  (void)n;
  if (e->desc && e->desc[0]) snprintf(data, 200, "%s", e->desc);
  return 0;
}

/* The innermost message of HDF5's error stack: why the last call failed. */
static const char *h5_reason(void) {
  static _Thread_local char buf[200];
  snprintf(buf, sizeof buf, "no HDF5 message");
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, deepest_cb, buf);
  for (char *c = buf; *c; c++)
    if (*c == '\n') *c = ' ';
  return buf;
}

/* Each public call that reaches HDF5 runs between quiet_begin and quiet_end: under the process's
 * HDF5 lock (hdf5_lock.h: a trace's writer thread may be writing), with HDF5's printing of its
 * error stack off (the messages are ours, its reason quoted in them) and the caller's setting
 * given back after. */
typedef struct {
  H5E_auto2_t fn;
  void *data;
} quiet;

static quiet quiet_begin(void) {
  quiet q = {NULL, NULL};
  stabi_trace_hdf5_lock_take();
  H5Eget_auto2(H5E_DEFAULT, &q.fn, &q.data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  return q;
}

static void quiet_end(const quiet *q) {
  H5Eset_auto2(H5E_DEFAULT, q->fn, q->data);
  stabi_trace_hdf5_lock_give();
}

static void trace_init(trace *t) {
  memset(t, 0, sizeof *t);
  t->file = t->step = t->wall.d = H5I_INVALID_HID;
  t->fd = -1;
}

/* ---- names ----------------------------------------------------------------------------- */

/* strcmp, except that runs of digits compare as numbers: h.2 before h.10. */
static int natural_cmp(const char *a, const char *b) {
  const char *a0 = a, *b0 = b;
  while (*a && *b) {
    if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
      while (a[0] == '0' && isdigit((unsigned char)a[1])) a++;
      while (b[0] == '0' && isdigit((unsigned char)b[1])) b++;
      size_t na = 0, nb = 0;
      while (isdigit((unsigned char)a[na])) na++;
      while (isdigit((unsigned char)b[nb])) nb++;
      if (na != nb) return na < nb ? -1 : 1;
      int c = memcmp(a, b, na);
      if (c) return c;
      a += na, b += nb;
    } else if (*a != *b) {
      return (unsigned char)*a - (unsigned char)*b;
    } else {
      a++, b++;
    }
  }
  if (*a || *b) return (unsigned char)*a - (unsigned char)*b;
  return strcmp(a0, b0); /* "h.01" and "h.1" */
}

static size_t metric_rank(const char *name) {
  for (size_t i = 0; i < N_ORDERED; i++)
    if (!strcmp(name, metric_order[i])) return i;
  return N_ORDERED;
}

static int column_cmp(const void *pa, const void *pb) {
  const trace_column *a = pa, *b = pb;
  size_t ra = metric_rank(a->name), rb = metric_rank(b->name);
  if (ra != rb) return ra < rb ? -1 : 1;
  return natural_cmp(a->name, b->name);
}

static int layer_cmp(const void *pa, const void *pb) {
  return natural_cmp(((const trace_layer *)pa)->group, ((const trace_layer *)pb)->group);
}

static int column_name_cmp(const void *pa, const void *pb) {
  return natural_cmp(((const trace_column *)pa)->name, ((const trace_column *)pb)->name);
}

static int metric_wanted(const trace_filter *o, const char *name) {
  if (!o->metrics) return 1;
  for (size_t i = 0; i < o->n_metrics; i++)
    if (!strcmp(o->metrics[i], name)) return 1;
  return 0;
}

static int layer_wanted(const trace_filter *o, const char *group) {
  if (!o->n_layer_globs) return 1;
  for (size_t i = 0; i < o->n_layer_globs; i++)
    if (!fnmatch(o->layer_globs[i], group, 0)) return 1;
  return 0;
}

typedef struct {
  char **names;
  size_t n, cap;
  int oom;
} link_names;

static herr_t add_link(hid_t g, const char *name, const H5L_info_t *info, void *data) {
  (void)g, (void)info;
  link_names *l = data;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **p = realloc(l->names, cap * sizeof *p);
    if (!p) return l->oom = 1, -1;
    l->names = p, l->cap = cap;
  }
  if (!(l->names[l->n] = strdup(name))) return l->oom = 1, -1;
  l->n++;
  return 0;
}

static int strcmp_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names of the links of group g, in name order, into *names (malloc'd). They are visited in
 * the storage's own order and sorted here: in the name order HDF5 1.10 builds a table of every
 * link first, and when reading one fails it frees the table's unfilled entries (garbage
 * pointers: a crash under ASan, found by byte-flipping and by fuzz_trace). */
static int list_links(trace *t, hid_t g, const char *where, char ***names, size_t *n) {
  link_names l = {NULL, 0, 0, 0};
  hsize_t at = 0;
  herr_t r = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, &at, add_link, &l);
  *names = l.names, *n = l.n;
  if (r < 0) return l.oom ? oom(t) : bad(t, "cannot list %s: %s", where, h5_reason());
  if (l.n) qsort(l.names, l.n, sizeof *l.names, strcmp_ptr);
  return 0;
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* ---- reading the schema ------------------------------------------------------------------ */

/* A string attribute of obj (fixed-length or variable-length) into *out (malloc'd). */
static int string_attr_dup(trace *t, hid_t obj, const char *where, const char *name, char **out) {
  int rc = 0;
  hid_t a = H5I_INVALID_HID, type = H5I_INVALID_HID, mem = H5I_INVALID_HID;
  *out = NULL;
  if (H5Aexists(obj, name) <= 0) return bad(t, "%s has no attribute '%s'", where, name);
  if ((a = H5Aopen(obj, name, H5P_DEFAULT)) < 0 || (type = H5Aget_type(a)) < 0) {
    rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
    goto out;
  }
  if (H5Tget_class(type) != H5T_STRING) {
    rc = bad(t, "the attribute '%s' of %s is not a string", name, where);
    goto out;
  }
  /* HDF5 converts no string between character sets: read it in the one it is stored in. */
  if ((mem = H5Tcopy(H5T_C_S1)) >= 0 && H5Tset_cset(mem, H5Tget_cset(type)) < 0) {
    rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
    goto out;
  }
  if (H5Tis_variable_str(type) > 0) {
    char *s = NULL;
    if (mem < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Aread(a, mem, &s) < 0) {
      rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
      goto out;
    }
    if (!(*out = strdup(s ? s : ""))) rc = oom(t);
    H5free_memory(s);
  } else {
    size_t size = H5Tget_size(type);
    char *s = calloc(size + 1, 1);
    if (!s) {
      rc = oom(t);
      goto out;
    }
    if (mem < 0 || H5Tset_size(mem, size + 1) < 0 || H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0 ||
        H5Aread(a, mem, s) < 0) {
      free(s);
      rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
      goto out;
    }
    *out = s;
  }
out:
  if (mem >= 0) H5Tclose(mem);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  return rc;
}

/* The same into buf (len bytes: a longer value is cut). */
static int string_attr(trace *t, hid_t obj, const char *where, const char *name, char *buf, size_t len) {
  char *s = NULL;
  int rc = string_attr_dup(t, obj, where, name, &s);
  if (!rc) snprintf(buf, len, "%s", s);
  free(s);
  return rc;
}

static int int_attr(trace *t, hid_t obj, const char *where, const char *name, int64_t *v) {
  if (H5Aexists(obj, name) <= 0) return bad(t, "%s has no attribute '%s'", where, name);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT), type = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
  int rc = 0;
  if (type < 0 || H5Tget_class(type) != H5T_INTEGER) rc = bad(t, "the attribute '%s' of %s is not an integer", name, where);
  else if (H5Aread(a, H5T_NATIVE_INT64, v) < 0)
    rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  return rc;
}

/* Opens the one-dimensional dataset loc/name (path is its full path, for messages) into *d,
 * checking its type class and that it holds at least `rows` rows (rows = -1: any). *n gets its
 * length. */
static int open_1d(trace *t, hid_t loc, const char *name, const char *path, H5T_class_t cls,
                   hsize_t rows, int check_rows, hid_t *d, hsize_t *n) {
  hid_t s = H5I_INVALID_HID, type = H5I_INVALID_HID;
  int rc = 0;
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0) return bad(t, "%s is missing", path);
  if ((*d = H5Dopen2(loc, name, H5P_DEFAULT)) < 0) return bad(t, "%s is not a dataset", path);
  if (t->swmr && H5Drefresh(*d) < 0) return bad(t, "cannot refresh %s: %s", path, h5_reason());
  if ((type = H5Dget_type(*d)) < 0 || H5Tget_class(type) != cls) {
    rc = bad(t, "%s is not %s", path, cls == H5T_INTEGER ? "an integer dataset" : "a floating-point dataset");
    goto out;
  }
  if ((s = H5Dget_space(*d)) < 0 || H5Sget_simple_extent_ndims(s) != 1 || H5Sget_simple_extent_dims(s, n, NULL) < 0) {
    rc = bad(t, "%s is not one-dimensional", path);
    goto out;
  }
  if (check_rows && *n < rows)
    rc = bad(t, "%s has %llu rows, /step has %llu: the lengths disagree", path, (unsigned long long)*n,
             (unsigned long long)rows);
out:
  if (s >= 0) H5Sclose(s);
  if (type >= 0) H5Tclose(type);
  return rc;
}

static int new_column(trace *t, hid_t g, const char *where, const char *name, trace_column *c) {
  char path[1024];
  hsize_t n;
  snprintf(path, sizeof path, "%s/%s", where, name);
  c->d = H5I_INVALID_HID;
  if (!(c->name = strdup(name))) return oom(t);
  return open_1d(t, g, name, path, H5T_FLOAT, t->rows, 1, &c->d, &n);
}

/* Opens the group /name of the file into *g and lists its links. */
static int open_group(trace *t, const char *name, hid_t *g, char ***names, size_t *n) {
  char where[32];
  snprintf(where, sizeof where, "/%s", name);
  if (H5Lexists(t->file, name, H5P_DEFAULT) <= 0) return bad(t, "the group %s is missing", where);
  if ((*g = H5Gopen2(t->file, name, H5P_DEFAULT)) < 0) return bad(t, "%s is not a group", where);
  return list_links(t, *g, where, names, n);
}

/* From format_version 2 every group holds a copy of /step named step (so that a netCDF reader
 * opening the group alone has its coordinate): it is not a column. */
static int is_step_copy(const trace *t, const char *name) { return t->version >= 2 && !strcmp(name, "step"); }

static int open_scalars(trace *t, const trace_filter *o) {
  hid_t g = H5I_INVALID_HID;
  char **names = NULL;
  size_t n = 0;
  int rc = 0;
  if ((rc = open_group(t, "scalars", &g, &names, &n))) goto out;
  if (n && !(t->scalars = calloc(n, sizeof *t->scalars))) {
    rc = oom(t);
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (!is_step_copy(t, names[i]) && metric_wanted(o, names[i]))
      rc = new_column(t, g, "/scalars", names[i], &t->scalars[t->n_scalars++]);
  if (!rc) qsort(t->scalars, t->n_scalars, sizeof *t->scalars, column_name_cmp);
out:
  free_names(names, n);
  if (g >= 0) H5Gclose(g);
  return rc;
}

static int open_layer(trace *t, const trace_filter *o, hid_t layers, const char *group, trace_layer *l) {
  char where[600], kind[64];
  char **names = NULL;
  size_t n = 0;
  int rc = 0;
  snprintf(where, sizeof where, "/layers/%s", group);
  hid_t g = H5Gopen2(layers, group, H5P_DEFAULT);
  if (g < 0) return bad(t, "%s is not a group", where);
  if (!(l->group = strdup(group))) {
    rc = oom(t);
    goto out;
  }
  if ((rc = string_attr(t, g, where, "kind", kind, sizeof kind))) goto out;
  if (!(l->kind = strdup(kind))) {
    rc = oom(t);
    goto out;
  }
  if ((rc = list_links(t, g, where, &names, &n))) goto out;
  for (size_t k = 0; k < N_REQUIRED; k++) {
    size_t i = 0;
    while (i < n && strcmp(names[i], metric_order[k])) i++;
    if (i == n) {
      rc = bad(t, "%s/%s is missing", where, metric_order[k]);
      goto out;
    }
  }
  if (n && !(l->cols = calloc(n, sizeof *l->cols))) {
    rc = oom(t);
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (!is_step_copy(t, names[i]) && metric_wanted(o, names[i]))
      rc = new_column(t, g, where, names[i], &l->cols[l->n_cols++]);
  if (!rc) qsort(l->cols, l->n_cols, sizeof *l->cols, column_cmp);
out:
  free_names(names, n);
  H5Gclose(g);
  return rc;
}

static int open_layers(trace *t, const trace_filter *o) {
  hid_t g = H5I_INVALID_HID;
  char **names = NULL;
  size_t n = 0;
  int rc = 0;
  if ((rc = open_group(t, "layers", &g, &names, &n))) goto out;
  for (size_t k = 0; k < o->n_layer_globs; k++) { /* a pattern that matches nothing is a typo */
    size_t i = 0;
    while (i < n && fnmatch(o->layer_globs[k], names[i], 0)) i++;
    if (i == n) {
      rc = bad(t, "--layers '%s' matches no layer", o->layer_globs[k]);
      goto out;
    }
  }
  if (n && !(t->layers = calloc(n, sizeof *t->layers))) {
    rc = oom(t);
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++) {
    if (!layer_wanted(o, names[i])) continue;
    trace_layer *l = &t->layers[t->n_layers++];
    rc = open_layer(t, o, g, names[i], l);
    if (!rc && o->metrics && !l->n_cols) { /* none of its datasets asked for: left out */
      free(l->group), free(l->kind), free(l->cols);
      memset(l, 0, sizeof *l);
      t->n_layers--;
    }
  }
  if (!rc) qsort(t->layers, t->n_layers, sizeof *t->layers, layer_cmp);
out:
  free_names(names, n);
  if (g >= 0) H5Gclose(g);
  return rc;
}

/* ---- format 4: a (step, layer) dataset per metric ----------------------------------------- */

/* The datasets of /layers that describe the layers, not rows of them (lib/trace/trace.c). */
static int is_static_v4(const char *name) {
  static const char *const names[] = {"step", "layer", "kind", "layout", "description", "shares_storage_with",
                                      "d_in", "d_out", "param_count", "param_count_unique", "head", "head_layer"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(name, names[i])) return 1;
  return 0;
}

/* The one-dimensional dataset /layers/name of n values: strings (s, each to H5free_memory) or
 * int64 (v). */
static int read_array_v4(trace *t, hid_t g, const char *name, size_t n, char **s, int64_t *v) {
  char path[64];
  hsize_t len = 0;
  hid_t d = H5I_INVALID_HID;
  snprintf(path, sizeof path, "/layers/%s", name);
  int rc = open_1d(t, g, name, path, s ? H5T_STRING : H5T_INTEGER, 0, 0, &d, &len);
  if (!rc && len != n) rc = bad(t, "%s has %llu values, /layers/layer %zu", path, (unsigned long long)len, n);
  hid_t type = H5I_INVALID_HID;
  hid_t ftype = !rc && s ? H5Dget_type(d) : H5I_INVALID_HID; /* its character set: HDF5 converts none */
  if (!rc && s && (ftype < 0 || (type = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 ||
                   H5Tset_cset(type, H5Tget_cset(ftype)) < 0))
    rc = oom(t);
  if (ftype >= 0) H5Tclose(ftype);
  if (!rc && n && H5Dread(d, s ? type : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, s ? (void *)s : (void *)v) < 0)
    rc = bad(t, "cannot read %s: %s", path, h5_reason());
  if (type >= 0) H5Tclose(type);
  if (d >= 0) H5Dclose(d);
  return rc;
}

/* Opens the two-dimensional dataset /layers/name of `width` columns into t->wide. */
static int open_wide(trace *t, hid_t g, const char *name, hsize_t width, hid_t *d) {
  char path[600];
  hsize_t dims[2];
  snprintf(path, sizeof path, "/layers/%s", name);
  if ((*d = H5Dopen2(g, name, H5P_DEFAULT)) < 0) return bad(t, "%s is not a dataset", path);
  t->wide[t->n_wide++] = *d;
  if (t->swmr && H5Drefresh(*d) < 0) return bad(t, "cannot refresh %s: %s", path, h5_reason());
  hid_t s = H5Dget_space(*d), type = H5Dget_type(*d);
  int ok = s >= 0 && type >= 0 && H5Tget_class(type) == H5T_FLOAT && H5Sget_simple_extent_ndims(s) == 2 &&
           H5Sget_simple_extent_dims(s, dims, NULL) >= 0;
  if (s >= 0) H5Sclose(s);
  if (type >= 0) H5Tclose(type);
  if (!ok) return bad(t, "%s is not a two-dimensional floating-point dataset", path);
  if (dims[1] != width) return bad(t, "%s has %llu columns, %llu expected", path, (unsigned long long)dims[1], (unsigned long long)width);
  if (dims[0] < t->rows)
    return bad(t, "%s has %llu rows, /step has %llu: the lengths disagree", path, (unsigned long long)dims[0],
               (unsigned long long)t->rows);
  return 0;
}

/* Format 4: each layer's columns are its column of every (step, layer) dataset of /layers, and
 * head<h>_bound its heads' columns of head_bound, so that format 4 reads as format 3's. */
static int open_layers_v4(trace *t, const trace_filter *o) {
  hid_t g = H5I_INVALID_HID;
  char **names = NULL, **layer = NULL, **kind = NULL, **hl = NULL;
  int64_t *hn = NULL;
  size_t n = 0, nl = 0, nh = 0;
  hsize_t dims = 0;
  int rc = 0;
  if ((rc = open_group(t, "layers", &g, &names, &n))) goto out;
  { /* the layer count: /layers/layer's length */
    hid_t d = H5I_INVALID_HID;
    if ((rc = open_1d(t, g, "layer", "/layers/layer", H5T_STRING, 0, 0, &d, &dims))) goto out;
    H5Dclose(d);
    nl = (size_t)dims;
  }
  if (H5Lexists(g, "head_layer", H5P_DEFAULT) > 0) {
    hid_t d = H5I_INVALID_HID;
    if ((rc = open_1d(t, g, "head_layer", "/layers/head_layer", H5T_STRING, 0, 0, &d, &dims))) goto out;
    H5Dclose(d);
    nh = (size_t)dims;
  }
  if (!(layer = calloc(nl + 1, sizeof *layer)) || !(kind = calloc(nl + 1, sizeof *kind)) ||
      !(hl = calloc(nh + 1, sizeof *hl)) || !(hn = calloc(nh + 1, sizeof *hn)) || !(t->wide = calloc(n + 1, sizeof *t->wide)) ||
      (nl && !(t->layers = calloc(nl, sizeof *t->layers)))) {
    rc = oom(t);
    goto out;
  }
  if ((rc = read_array_v4(t, g, "layer", nl, layer, NULL)) || (rc = read_array_v4(t, g, "kind", nl, kind, NULL))) goto out;
  if (nh && ((rc = read_array_v4(t, g, "head_layer", nh, hl, NULL)) || (rc = read_array_v4(t, g, "head", nh, NULL, hn))))
    goto out;
  for (size_t k = 0; k < N_REQUIRED; k++)
    if (H5Lexists(g, metric_order[k], H5P_DEFAULT) <= 0) {
      rc = bad(t, "/layers/%s is missing", metric_order[k]);
      goto out;
    }
  for (size_t k = 0; k < o->n_layer_globs; k++) { /* a pattern that matches nothing is a typo */
    size_t i = 0;
    while (i < nl && (!layer[i] || fnmatch(o->layer_globs[k], layer[i], 0))) i++;
    if (i == nl) {
      rc = bad(t, "--layers '%s' matches no layer", o->layer_globs[k]);
      goto out;
    }
  }
  for (size_t i = 0; i < nl && !rc; i++) {
    if (!layer[i] || !kind[i]) {
      rc = bad(t, "/layers/layer or /layers/kind has an empty value");
      break;
    }
    if (!layer_wanted(o, layer[i])) continue;
    trace_layer *l = &t->layers[t->n_layers++];
    l->index = i;
    if (!(l->group = strdup(layer[i])) || !(l->kind = strdup(kind[i])) || !(l->cols = calloc(n + nh + 1, sizeof *l->cols)))
      rc = oom(t);
  }
  /* the datasets, and each wanted layer's columns of them */
  for (size_t k = 0; k < n && !rc; k++) {
    if (is_static_v4(names[k])) continue;
    const int heads = !strcmp(names[k], "head_bound");
    if (!heads && !metric_wanted(o, names[k])) continue;
    hid_t d = H5I_INVALID_HID;
    if ((rc = open_wide(t, g, names[k], heads ? nh : nl, &d))) break;
    for (size_t li = 0; li < t->n_layers && !rc; li++) {
      trace_layer *l = &t->layers[li];
      const size_t i = l->index;
      for (size_t c = 0; c < (heads ? nh : 1) && !rc; c++) {
        char hname[48];
        if (heads) {
          if (!hl[c] || strcmp(hl[c], l->group)) continue;
          snprintf(hname, sizeof hname, "head%" PRId64 "_bound", hn[c]);
          if (!metric_wanted(o, hname)) continue;
        }
        trace_column *col = &l->cols[l->n_cols++];
        col->d = d, col->shared = 1, col->at = heads ? c : i;
        if (!(col->name = strdup(heads ? hname : names[k]))) rc = oom(t);
      }
    }
  }
  for (size_t li = 0; li < t->n_layers && !rc; li++) {
    trace_layer *l = &t->layers[li];
    qsort(l->cols, l->n_cols, sizeof *l->cols, column_cmp);
    if (o->metrics && !l->n_cols) { /* none of its datasets asked for: left out */
      free(l->group), free(l->kind), free(l->cols);
      memmove(l, l + 1, (t->n_layers - li - 1) * sizeof *l);
      t->n_layers--, li--;
    }
  }
  if (!rc) qsort(t->layers, t->n_layers, sizeof *t->layers, layer_cmp);
out:
  for (size_t i = 0; layer && i < nl; i++) H5free_memory(layer[i]);
  for (size_t i = 0; kind && i < nl; i++) H5free_memory(kind[i]);
  for (size_t i = 0; hl && i < nh; i++) H5free_memory(hl[i]);
  free(layer), free(kind), free(hl), free(hn);
  free_names(names, n);
  if (g >= 0) H5Gclose(g);
  return rc;
}

/* Every name of --metrics must select something: one that matches nothing is a typo. */
static int check_metrics(trace *t, const trace_filter *o) {
  for (size_t i = 0; i < o->n_metrics; i++) {
    int found = t->wall.d >= 0 && !strcmp(o->metrics[i], "wall_time");
    for (size_t s = 0; s < t->n_scalars && !found; s++) found = !strcmp(o->metrics[i], t->scalars[s].name);
    for (size_t l = 0; l < t->n_layers && !found; l++)
      for (size_t c = 0; c < t->layers[l].n_cols && !found; c++)
        found = !strcmp(o->metrics[i], t->layers[l].cols[c].name);
    if (!found)
      return bad(t, "--metrics: no dataset '%s' (in /scalars, or in a layer%s); wall_time is /wall_time",
                 o->metrics[i], o->n_layer_globs ? " that --layers selects" : "");
  }
  return 0;
}

/* 1 when another process holds a write lock on the file open at fd: the trace's writer runs
 * (lib/trace/trace.c locks the whole file while it writes, an open-file-description lock). */
static int writer_running(int fd) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET; /* l_start = l_len = 0: the whole file */
#ifdef F_OFD_GETLK
  if (fcntl(fd, F_OFD_GETLK, &fl) == 0) return fl.l_type != F_UNLCK;
#endif
  return fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

static int open_file(trace *t, const char *path) {
  /* H5Fopen of a FIFO would block for ever, of /dev/zero read on without end: regular files only */
  stab_status st = stab_input_open(path, 0, &t->fd, NULL);
  if (st != STAB_OK) return st;
  struct stat sb;
  if (fstat(t->fd, &sb) == 0) t->dev = sb.st_dev, t->ino = sb.st_ino;
  /* A checksum that does not match is retried, with a sleep doubling from 1 ns each time, in
   * case a running writer was caught in the middle of writing that piece of metadata: HDF5's
   * default of 100 attempts waits for ever (2^100 ns) on a trace that is simply damaged. With
   * its writer gone a mismatch is final, one attempt; with a writer running, enough attempts
   * for it to finish writing (2^LIVE_READ_ATTEMPTS ns, 17 ms, per piece). */
  t->live = writer_running(t->fd);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0 || H5Pset_metadata_read_attempts(fapl, t->live ? LIVE_READ_ATTEMPTS : 1) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return bad(t, "cannot set up HDF5's file access: %s", h5_reason());
  }
  /* A trace written by stabmeter is in SWMR mode while its writer runs (and after it was
   * killed); any other HDF5 file opens plainly. */
  t->swmr = 1;
  t->file = H5Fopen(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, fapl);
  if (t->file < 0) {
    t->swmr = 0;
    t->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  }
  H5Pclose(fapl);
  if (t->file < 0) {
    if (H5Fis_hdf5(path) <= 0) return bad(t, "not an HDF5 file, so not a stabmeter trace");
    return bad(t, "cannot open it: %s", h5_reason());
  }
  return 0;
}

/* Rows never written read as the fill value, so a /step whose extent says 2^60 rows is valid
 * HDF5 and would be read without end. Unless a filter compresses it, each row of /step
 * takes at least its 8 bytes of the file (as it is now: a running writer grows it). */
static int check_rows_fit(trace *t) {
  hid_t dcpl = H5Dget_create_plist(t->step);
  int n = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1, compressed = n < 0;
  for (int i = 0; i < n && !compressed; i++) { /* Fletcher32 only adds a checksum */
    unsigned flags, info;
    size_t nv = 0;
    compressed = H5Pget_filter2(dcpl, (unsigned)i, &flags, &nv, NULL, 0, NULL, &info) != H5Z_FILTER_FLETCHER32;
  }
  if (dcpl >= 0) H5Pclose(dcpl);
  struct stat sb;
  if (compressed || fstat(t->fd, &sb) != 0 || sb.st_size < 0) return 0;
  if (t->rows > (uint64_t)sb.st_size / 8)
    return bad(t, "/step has %llu rows, more than a %lld-byte file can hold (8 bytes each)",
               (unsigned long long)t->rows, (long long)sb.st_size);
  return 0;
}

/* Opens t (from trace_init, its path set) as stab_trace_read_open describes. */
static int open_trace(trace *t, const trace_filter *o) {
  char format[64];
  int64_t version;
  hsize_t n;
  int rc;
  if ((rc = open_file(t, t->path))) return rc;
  if ((rc = string_attr(t, t->file, "the root group", "format", format, sizeof format))) return rc;
  if (strcmp(format, "stabmeter-trace"))
    return bad(t, "the attribute format of the root group is '%s', not 'stabmeter-trace'", format);
  if ((rc = int_attr(t, t->file, "the root group", "format_version", &version))) return rc;
  if (version < 1 || version > 4)
    return bad(t, "format_version %" PRId64 ": this program reads versions 1 to 4", version);
  t->version = version;

  /* /step first: its length is the row count, and the writer extends every other dataset
   * before it, so each of them then holds at least that many rows. */
  if ((rc = open_1d(t, t->file, "step", "/step", H5T_INTEGER, 0, 0, &t->step, &t->rows))) return rc;
  if ((rc = check_rows_fit(t))) return rc;
  t->wall.d = H5I_INVALID_HID;
  if ((rc = open_1d(t, t->file, "wall_time", "/wall_time", H5T_FLOAT, t->rows, 1, &t->wall.d, &n))) return rc;
  if (!metric_wanted(o, "wall_time")) {
    H5Dclose(t->wall.d);
    t->wall.d = H5I_INVALID_HID;
  } else if (!(t->wall.name = strdup("wall_time"))) {
    return oom(t);
  }
  if ((rc = open_scalars(t, o)) || (rc = (t->version >= 4 ? open_layers_v4 : open_layers)(t, o))) return rc;
  return check_metrics(t, o);
}

static void free_column(trace_column *c) {
  if (c->d >= 0 && !c->shared) H5Dclose(c->d);
  free(c->name);
}

/* Closes and frees everything t holds, leaving it as trace_init does. */
static void close_trace(trace *t) {
  for (size_t i = 0; i < t->n_scalars; i++) free_column(&t->scalars[i]);
  for (size_t l = 0; l < t->n_layers; l++) {
    for (size_t c = 0; c < t->layers[l].n_cols; c++) free_column(&t->layers[l].cols[c]);
    free(t->layers[l].cols);
    free(t->layers[l].group);
    free(t->layers[l].kind);
    free(t->layers[l].attrs);
  }
  free_column(&t->wall);
  free(t->scalars);
  free(t->layers);
  for (size_t k = 0; k < t->n_wide; k++) H5Dclose(t->wide[k]);
  free(t->wide);
  if (t->step >= 0) H5Dclose(t->step);
  if (t->file >= 0) H5Fclose(t->file);
  if (t->fd >= 0) close(t->fd);
  for (size_t i = 0; i < t->n_strings; i++) free(t->strings[i]);
  free(t->strings);
  free(t->run_config);
  free(t->path);
  trace_init(t);
}

stab_trace_read_params stab_trace_read_default_params(void) {
  stab_trace_read_params p;
  memset(&p, 0, sizeof p);
  return p;
}

stab_status stab_trace_read_open(const char *path, const stab_trace_read_params *params,
                                 stab_trace_reader **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_trace_read_open: NULL %s", path ? "out" : "path");
  const stab_trace_read_params every = stab_trace_read_default_params();
  const trace_filter *o = params ? params : &every;
  if ((o->n_layer_globs && !o->layer_globs) || (o->n_metrics && !o->metrics))
    return stabi_fail(STAB_EINVAL, "stab_trace_read_open: %s is NULL with a count of %zu",
                      o->n_metrics && !o->metrics ? "metrics" : "layer_globs",
                      o->n_metrics && !o->metrics ? o->n_metrics : o->n_layer_globs);
  for (size_t i = 0; i < o->n_layer_globs; i++)
    if (!o->layer_globs[i]) return stabi_fail(STAB_EINVAL, "stab_trace_read_open: layer_globs[%zu] is NULL", i);
  for (size_t i = 0; i < o->n_metrics; i++)
    if (!o->metrics[i]) return stabi_fail(STAB_EINVAL, "stab_trace_read_open: metrics[%zu] is NULL", i);
  trace *t = malloc(sizeof *t);
  if (!t) return stabi_fail(STAB_ENOMEM, "out of memory");
  trace_init(t);
  if (!(t->path = strdup(path))) {
    free(t);
    return stabi_fail(STAB_ENOMEM, "out of memory");
  }
  quiet q = quiet_begin();
  int rc = open_trace(t, o);
  if (rc) close_trace(t);
  quiet_end(&q);
  if (rc) {
    free(t);
    return (stab_status)rc;
  }
  *out = t;
  return STAB_OK;
}

void stab_trace_read_close(stab_trace_reader *r) {
  if (!r) return;
  quiet q = quiet_begin();
  close_trace(r);
  quiet_end(&q);
  free(r);
}

/* ---- what the trace holds ------------------------------------------------------------------ */

int stab_trace_read_format_version(const stab_trace_reader *r) { return r ? (int)r->version : 0; }

int64_t stab_trace_read_rows(const stab_trace_reader *r) { return r ? (int64_t)r->rows : 0; }

int stab_trace_read_live(const stab_trace_reader *r) { return r ? r->live : 0; }

int stab_trace_read_is_file(const stab_trace_reader *r, const char *path) {
  struct stat sb;
  return r && path && r->fd >= 0 && stat(path, &sb) == 0 && sb.st_dev == r->dev && sb.st_ino == r->ino;
}

int stab_trace_read_has_wall_time(const stab_trace_reader *r) { return r && r->wall.d >= 0; }

size_t stab_trace_read_scalar_count(const stab_trace_reader *r) { return r ? r->n_scalars : 0; }

const char *stab_trace_read_scalar_name(const stab_trace_reader *r, size_t index) {
  return r && index < r->n_scalars ? r->scalars[index].name : NULL;
}

size_t stab_trace_read_layer_count(const stab_trace_reader *r) { return r ? r->n_layers : 0; }

const char *stab_trace_read_layer_name(const stab_trace_reader *r, size_t layer) {
  return r && layer < r->n_layers ? r->layers[layer].group : NULL;
}

const char *stab_trace_read_layer_kind(const stab_trace_reader *r, size_t layer) {
  return r && layer < r->n_layers ? r->layers[layer].kind : NULL;
}

size_t stab_trace_read_metric_count(const stab_trace_reader *r, size_t layer) {
  return r && layer < r->n_layers ? r->layers[layer].n_cols : 0;
}

const char *stab_trace_read_metric_name(const stab_trace_reader *r, size_t layer, size_t metric) {
  return r && layer < r->n_layers && metric < r->layers[layer].n_cols ? r->layers[layer].cols[metric].name : NULL;
}

stab_status stab_trace_read_run_config(stab_trace_reader *r, const char **json) {
  if (!r || !json) return stabi_fail(STAB_EINVAL, "stab_trace_read_run_config: NULL %s", r ? "json" : "reader");
  *json = NULL;
  if (!r->run_config) {
    quiet q = quiet_begin();
    char *text = NULL;
    int rc = H5Aexists(r->file, "run_config") > 0 ? string_attr_dup(r, r->file, "the root group", "run_config", &text) : 0;
    quiet_end(&q);
    if (rc) return (stab_status)rc;
    if (!text && !(text = strdup("{}"))) return oom(r);
    r->run_config = text;
  }
  *json = r->run_config;
  return STAB_OK;
}

/* ---- the layers' attributes ---------------------------------------------------------------- */

/* Keeps s (malloc'd) until close; NULL when memory runs out (s is then freed). */
static const char *keep_string(trace *t, char *s) {
  char **p = realloc(t->strings, (t->n_strings + 1) * sizeof *p);
  if (!p) {
    free(s);
    return NULL;
  }
  t->strings = p;
  return t->strings[t->n_strings++] = s;
}

static int attr_cmp(const void *pa, const void *pb) {
  return strcmp(((const stab_trace_attr *)pa)->name, ((const stab_trace_attr *)pb)->name);
}

/* Adds the attribute name = text (kept) or value to l. */
static int add_attr(trace *t, trace_layer *l, size_t cap, const char *name, char *text, int64_t value) {
  stab_trace_attr *a = &l->attrs[l->n_attrs];
  if (l->n_attrs >= cap) { /* the caller counted: never */
    free(text);
    return 0;
  }
  char *n = strdup(name);
  if (!n || !(a->name = keep_string(t, n)) || (text && !(a->text = keep_string(t, text)))) {
    if (!n) free(text);
    return oom(t);
  }
  a->value = text ? 0 : value;
  l->n_attrs++;
  return 0;
}

typedef struct {
  trace *t;
  trace_layer *l;
  const char *where;
  size_t cap;
  int rc;
} attr_walk;

/* One attribute of a layer group (formats 1 to 3): scalar strings and integers are kept. */
static herr_t group_attr(hid_t g, const char *name, const H5A_info_t *info, void *data) {
  (void)info;
  attr_walk *w = data;
  hid_t a = H5Aopen(g, name, H5P_DEFAULT), type = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
  hid_t space = a >= 0 ? H5Aget_space(a) : H5I_INVALID_HID;
  H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
  int scalar = space >= 0 && H5Sget_simple_extent_type(space) == H5S_SCALAR;
  if (space >= 0) H5Sclose(space);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  if (a < 0) {
    w->rc = bad(w->t, "cannot read the attribute '%s' of %s: %s", name, w->where, h5_reason());
  } else if (scalar && cls == H5T_STRING) {
    char *s = NULL;
    if (!(w->rc = string_attr_dup(w->t, g, w->where, name, &s))) w->rc = add_attr(w->t, w->l, w->cap, name, s, 0);
  } else if (scalar && cls == H5T_INTEGER) {
    int64_t v = 0;
    if (!(w->rc = int_attr(w->t, g, w->where, name, &v))) w->rc = add_attr(w->t, w->l, w->cap, name, NULL, v);
  }
  return w->rc ? -1 : 0;
}

static int read_attrs_group(trace *t, trace_layer *l) {
  char where[600];
  snprintf(where, sizeof where, "/layers/%s", l->group);
  hid_t g = H5Gopen2(t->file, where, H5P_DEFAULT);
  if (g < 0) return bad(t, "%s is not a group", where);
  H5O_info_t info;
  int rc = 0;
  if (H5Oget_info2(g, &info, H5O_INFO_NUM_ATTRS) < 0) {
    rc = bad(t, "cannot list the attributes of %s: %s", where, h5_reason());
  } else if (info.num_attrs && !(l->attrs = calloc(info.num_attrs, sizeof *l->attrs))) {
    rc = oom(t);
  } else {
    attr_walk w = {t, l, where, (size_t)info.num_attrs, 0};
    hsize_t at = 0;
    if (H5Aiterate2(g, H5_INDEX_NAME, H5_ITER_NATIVE, &at, group_attr, &w) < 0)
      rc = w.rc ? w.rc : bad(t, "cannot list the attributes of %s: %s", where, h5_reason());
  }
  H5Gclose(g);
  return rc;
}

/* Format 4: the one-dimensional string and integer datasets of /layers along the layer
 * dimension (as long as /layers/layer), each a column of attributes. */
static int read_attrs_v4(trace *t) {
  hid_t g = H5I_INVALID_HID;
  char **names = NULL;
  size_t n = 0, nl = 0;
  int rc = 0;
  char **s = NULL;
  int64_t *v = NULL;
  if ((rc = open_group(t, "layers", &g, &names, &n))) goto out;
  {
    hid_t d = H5I_INVALID_HID;
    hsize_t dims = 0;
    if ((rc = open_1d(t, g, "layer", "/layers/layer", H5T_STRING, 0, 0, &d, &dims))) goto out;
    H5Dclose(d);
    nl = (size_t)dims;
  }
  for (size_t l = 0; l < t->n_layers && !rc; l++)
    if (n && !(t->layers[l].attrs = calloc(n, sizeof *t->layers[l].attrs))) rc = oom(t);
  if (!rc && (!(s = calloc(nl + 1, sizeof *s)) || !(v = calloc(nl + 1, sizeof *v)))) rc = oom(t);
  for (size_t k = 0; k < n && !rc; k++) {
    if (!strcmp(names[k], "layer") || !strcmp(names[k], "step")) continue;
    /* what is along the layer dimension: one-dimensional, a string or an integer, nl long */
    hid_t d = H5Dopen2(g, names[k], H5P_DEFAULT);
    if (d < 0) continue; /* a group: no attribute */
    hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    hsize_t dims[2] = {0, 0};
    H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    int fits = space >= 0 && H5Sget_simple_extent_ndims(space) == 1 && H5Sget_simple_extent_dims(space, dims, NULL) == 1 &&
               dims[0] == nl && (cls == H5T_STRING || cls == H5T_INTEGER);
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    if (!fits) continue;
    const int text = cls == H5T_STRING;
    memset(s, 0, (nl + 1) * sizeof *s);
    if ((rc = read_array_v4(t, g, names[k], nl, text ? s : NULL, text ? NULL : v))) break;
    for (size_t l = 0; l < t->n_layers && !rc; l++) {
      const size_t i = t->layers[l].index;
      char *copy = text ? strdup(s[i] ? s[i] : "") : NULL;
      if (text && !copy) rc = oom(t);
      else rc = add_attr(t, &t->layers[l], n, names[k], copy, text ? 0 : v[i]);
    }
    for (size_t i = 0; text && i < nl; i++) H5free_memory(s[i]);
  }
out:
  free(s), free(v);
  free_names(names, n);
  if (g >= 0) H5Gclose(g);
  return rc;
}

stab_status stab_trace_read_layer_attrs(stab_trace_reader *r, size_t layer, const stab_trace_attr **attrs,
                                        size_t *n) {
  if (!r || !attrs || !n) return stabi_fail(STAB_EINVAL, "stab_trace_read_layer_attrs: NULL argument");
  *attrs = NULL, *n = 0;
  if (layer >= r->n_layers)
    return stabi_fail(STAB_ERANGE, "%s: layer %zu: the trace reads %zu layers", r->path, layer, r->n_layers);
  if (!r->attrs_read) {
    quiet q = quiet_begin();
    int rc = 0;
    if (r->version >= 4) rc = read_attrs_v4(r);
    for (size_t l = 0; l < r->n_layers && !rc && r->version < 4; l++) rc = read_attrs_group(r, &r->layers[l]);
    quiet_end(&q);
    if (rc) { /* none kept: the next call tries again */
      for (size_t l = 0; l < r->n_layers; l++) {
        free(r->layers[l].attrs);
        r->layers[l].attrs = NULL, r->layers[l].n_attrs = 0;
      }
      return (stab_status)rc;
    }
    for (size_t l = 0; l < r->n_layers; l++)
      if (r->layers[l].n_attrs) qsort(r->layers[l].attrs, r->layers[l].n_attrs, sizeof *r->layers[l].attrs, attr_cmp);
    r->attrs_read = 1;
  }
  *attrs = r->layers[layer].attrs, *n = r->layers[layer].n_attrs;
  return STAB_OK;
}

/* ---- reading rows ----------------------------------------------------------------------- */

/* Rows [first, first + count) of d: one-dimensional (wide 0), or its column `at`. */
static int read_column(trace *t, hid_t d, int wide, hsize_t at, const char *what, hsize_t first, hsize_t count,
                       hid_t type, void *buf) {
  const hsize_t start[2] = {first, at}, n[2] = {count, 1};
  hid_t fs = H5Dget_space(d), mem = H5Screate_simple(1, &count, NULL);
  int ok = fs >= 0 && mem >= 0 &&
           H5Sselect_hyperslab(fs, H5S_SELECT_SET, wide ? start : &first, NULL, wide ? n : &count, NULL) >= 0 &&
           H5Dread(d, type, mem, fs, H5P_DEFAULT, buf) >= 0;
  int rc = ok ? 0 : bad_read(t, "cannot read rows of %s: %s", what, h5_reason()); /* before H5Sclose clears it */
  if (mem >= 0) H5Sclose(mem);
  if (fs >= 0) H5Sclose(fs);
  return rc;
}

/* The checks every read makes: r, out, and rows [first, first + count) inside the trace. */
static stab_status check_rows(const trace *r, const char *who, int64_t first, size_t count, const void *out) {
  if (!r || (count && !out)) return stabi_fail(STAB_EINVAL, "%s: NULL %s", who, r ? "out" : "reader");
  if (first < 0 || (uint64_t)first > r->rows || count > r->rows - (uint64_t)first)
    return stabi_fail(STAB_ERANGE, "%s: %s: %zu rows from row %" PRId64 ": the trace has %llu", who, r->path, count,
                      first, (unsigned long long)r->rows);
  return STAB_OK;
}

/* Reads a column under quiet; count 0 reads nothing. */
static stab_status read_quiet(trace *r, hid_t d, int wide, hsize_t at, const char *what, int64_t first, size_t count,
                              hid_t type, void *out) {
  if (!count) return STAB_OK;
  quiet q = quiet_begin();
  int rc = read_column(r, d, wide, at, what, (hsize_t)first, (hsize_t)count, type, out);
  quiet_end(&q);
  return (stab_status)rc;
}

stab_status stab_trace_read_steps(stab_trace_reader *r, int64_t first, size_t count, int64_t *out) {
  stab_status st = check_rows(r, "stab_trace_read_steps", first, count, out);
  return st ? st : read_quiet(r, r->step, 0, 0, "/step", first, count, H5T_NATIVE_INT64, out);
}

stab_status stab_trace_read_wall_time(stab_trace_reader *r, int64_t first, size_t count, double *out) {
  stab_status st = check_rows(r, "stab_trace_read_wall_time", first, count, out);
  if (st) return st;
  if (r->wall.d < 0) return stabi_fail(STAB_ERANGE, "%s: wall_time is not among the columns read", r->path);
  return read_quiet(r, r->wall.d, 0, 0, "/wall_time", first, count, H5T_NATIVE_DOUBLE, out);
}

stab_status stab_trace_read_scalar(stab_trace_reader *r, size_t index, int64_t first, size_t count, double *out) {
  stab_status st = check_rows(r, "stab_trace_read_scalar", first, count, out);
  if (st) return st;
  if (index >= r->n_scalars)
    return stabi_fail(STAB_ERANGE, "%s: scalar %zu: the trace reads %zu scalars", r->path, index, r->n_scalars);
  char what[600];
  snprintf(what, sizeof what, "/scalars/%s", r->scalars[index].name);
  return read_quiet(r, r->scalars[index].d, 0, 0, what, first, count, H5T_NATIVE_DOUBLE, out);
}

stab_status stab_trace_read_metric(stab_trace_reader *r, size_t layer, size_t metric, int64_t first, size_t count,
                                   double *out) {
  stab_status st = check_rows(r, "stab_trace_read_metric", first, count, out);
  if (st) return st;
  if (layer >= r->n_layers || metric >= r->layers[layer].n_cols)
    return stabi_fail(STAB_ERANGE, "%s: layer %zu, metric %zu: out of range (%zu layers)", r->path, layer, metric,
                      r->n_layers);
  const trace_layer *l = &r->layers[layer];
  const trace_column *col = &l->cols[metric];
  char what[600];
  snprintf(what, sizeof what, "/layers/%s/%s", l->group, col->name);
  return read_quiet(r, col->d, col->shared, col->at, what, first, count, H5T_NATIVE_DOUBLE, out);
}
