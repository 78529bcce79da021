/* export.c — a stabmeter trace (HDF5, SPEC.md "Trace") as CSV in long form or as JSON lines,
 * for tools that do not read HDF5: gnuplot, spreadsheets, pandas without h5py. The trace is
 * opened for SWMR reading, so a trace whose writer is still running (or was killed) exports the
 * rows flushed so far. Values are written so that they read back as the same doubles. */
#include "stabmeter.h"

#include <hdf5.h>

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Rows read from every dataset at a time: the memory is BLOCK_ROWS x datasets x 8 bytes
 * (5.6 MB for the 682 datasets of 40 linear layers), whatever the trace's length. */
enum { BLOCK_ROWS = 1024 };

/* The writer's metric datasets in its order (lib/trace.c); a layer's other datasets (attention
 * head bounds, layer extras) follow them in name order. */
static const char *const metric_order[] = {
    "forward",       "dependency",   "update",       "forward_tight", "dependency_tight",
    "update_tight",  "spread",       "sigma",        "sigma_rel_err", "sigma_update",
    "sigma_update_rel_err", "rel_update", "passes",  "update_passes", "flags"};
enum { N_ORDERED = sizeof metric_order / sizeof metric_order[0], N_REQUIRED = 3 };

typedef enum { FORMAT_CSV, FORMAT_JSONL } out_format;

typedef struct {
  out_format format;
  const char *out;          /* NULL: stdout */
  const char **layer_globs; /* --layers, any of them */
  size_t n_layer_globs;
  char **metrics;           /* --metrics, split at commas; NULL: every dataset */
  size_t n_metrics;
  int has_lo, has_hi;       /* --steps A:B, inclusive */
  int64_t lo, hi;
  const char *path;
} options;

typedef struct {
  char *name; /* the dataset's name in its group: "forward", "head0_bound", "loss" ... */
  hid_t d;
  double *v;  /* BLOCK_ROWS values of the current block */
} column;

typedef struct {
  char *group; /* the group's name under /layers ('/' of the layer name already '.') */
  char *kind;
  column *cols;
  size_t n_cols;
} layer;

typedef struct {
  const char *path;
  hid_t file, step, mem;
  int swmr;          /* opened with SWMR_READ */
  hsize_t rows;      /* len(/step): the rows every dataset has (others may be longer) */
  column wall;       /* /wall_time; wall.d < 0 when not exported */
  column *scalars;
  size_t n_scalars;
  layer *layers;
  size_t n_layers;
  int64_t *steps;    /* BLOCK_ROWS */
} trace;

/* ---- messages -------------------------------------------------------------------------- */

/* A trace that breaks the schema, or a file that is not one: exit status 2. */
static int bad(const trace *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "export: %s: ", t->path);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 2;
}

static int oom(void) {
  fprintf(stderr, "export: out of memory\n");
  return 1;
}

static herr_t deepest_cb(unsigned n, const H5E_error2_t *e, void *data) {
  (void)n;
  if (e->desc && e->desc[0]) snprintf(data, 200, "%s", e->desc);
  return 0;
}

/* The innermost message of HDF5's error stack: why the last call failed. */
static const char *h5_reason(void) {
  static char buf[200];
  snprintf(buf, sizeof buf, "no HDF5 message");
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, deepest_cb, buf);
  for (char *c = buf; *c; c++)
    if (*c == '\n') *c = ' ';
  return buf;
}

/* ---- options --------------------------------------------------------------------------- */

static void usage(FILE *f) {
  fprintf(f,
          "Usage: export [OPTIONS] TRACE\n"
          "Writes a stabmeter trace (HDF5) as CSV in long form or as JSON lines.\n\n"
          "  --format csv|jsonl  csv (default): a header line 'step,layer,kind,metric,value', then one\n"
          "                      row per value: per step, wall_time and every /scalars dataset (empty\n"
          "                      layer, kind 'scalar'), then every layer's datasets. NaN is 'nan',\n"
          "                      infinities 'inf' and '-inf'; fields holding ',', '\"' or a line break\n"
          "                      are quoted (RFC 4180).\n"
          "                      jsonl: one object per step, {\"step\": S, \"wall_time\": W, \"scalars\":\n"
          "                      {NAME: V, ...}, \"layers\": {LAYER: {\"kind\": K, METRIC: V, ...}, ...}};\n"
          "                      NaN is null, infinities 1e999 and -1e999 (read back as inf).\n"
          "  -o, --output FILE   write to FILE (default: standard output)\n"
          "  --layers GLOB       only layers whose group name (under /layers) matches the shell\n"
          "                      pattern GLOB; repeat for several. Run-level rows are kept.\n"
          "  --metrics LIST      only these datasets, comma-separated, e.g. forward,update,loss\n"
          "                      (layer metrics, scalars and wall_time alike)\n"
          "  --steps A:B         only rows whose step is in A..B, both included; A: or :B leave\n"
          "                      one side open, A alone is one step\n"
          "  --help, --version\n\n"
          "Rows are in the trace's order; layers and scalars in name order (numbers in names\n"
          "compared as numbers), a layer's metrics in the writer's order (forward, dependency,\n"
          "update, ...). Values are the shortest decimals that read back as the same double.\n"
          "Exit status: 0 success, 1 failure (e.g. writing the output), 2 bad usage or a file that\n"
          "is not a stabmeter trace (the message names the dataset or attribute at fault).\n");
}

static int parse_i64(const char *s, int64_t *v) {
  char *end;
  errno = 0;
  long long x = strtoll(s, &end, 10);
  if (errno || end == s || *end) return -1;
  *v = x;
  return 0;
}

static int parse_steps(const char *arg, options *o) {
  const char *colon = strchr(arg, ':');
  char lo[64] = "", hi[64] = "";
  if (strlen(arg) >= sizeof lo) return -1;
  if (!colon) {
    snprintf(lo, sizeof lo, "%s", arg);
    snprintf(hi, sizeof hi, "%s", arg);
  } else {
    snprintf(lo, sizeof lo, "%.*s", (int)(colon - arg), arg);
    snprintf(hi, sizeof hi, "%s", colon + 1);
  }
  if ((o->has_lo = lo[0] != '\0') && parse_i64(lo, &o->lo)) return -1;
  if ((o->has_hi = hi[0] != '\0') && parse_i64(hi, &o->hi)) return -1;
  return o->has_lo && o->has_hi && o->lo > o->hi ? -1 : 0;
}

static int split_metrics(const char *arg, options *o) {
  for (const char *s = arg;; s++) {
    size_t n = strcspn(s, ",");
    if (n == 0) return -1; /* an empty name: ",," or a trailing comma */
    char **m = realloc(o->metrics, (o->n_metrics + 1) * sizeof *m);
    if (!m) return -1;
    o->metrics = m;
    if (!(m[o->n_metrics] = strndup(s, n))) return -1;
    o->n_metrics++;
    s += n;
    if (!*s) return 0;
  }
}

static int parse(int argc, char **argv, options *o) {
  enum { O_FORMAT = 256, O_LAYERS, O_METRICS, O_STEPS };
  static const struct option longs[] = {
      {"format", required_argument, 0, O_FORMAT}, {"output", required_argument, 0, 'o'},
      {"layers", required_argument, 0, O_LAYERS}, {"metrics", required_argument, 0, O_METRICS},
      {"steps", required_argument, 0, O_STEPS},   {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, 'V'},           {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "o:", longs, NULL)) != -1) {
    switch (c) {
    case O_FORMAT:
      if (!strcmp(optarg, "csv")) o->format = FORMAT_CSV;
      else if (!strcmp(optarg, "jsonl")) o->format = FORMAT_JSONL;
      else {
        fprintf(stderr, "export: --format must be csv or jsonl, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'o': o->out = optarg; break;
    case O_LAYERS: {
      const char **g = realloc(o->layer_globs, (o->n_layer_globs + 1) * sizeof *g);
      if (!g) return oom();
      o->layer_globs = g;
      g[o->n_layer_globs++] = optarg;
      break;
    }
    case O_METRICS:
      if (split_metrics(optarg, o)) {
        fprintf(stderr, "export: --metrics needs dataset names separated by commas, not '%s'\n", optarg);
        return 2;
      }
      break;
    case O_STEPS:
      if (parse_steps(optarg, o)) {
        fprintf(stderr, "export: --steps needs A:B, A:, :B or A with integers A <= B, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'h': usage(stdout); exit(0);
    case 'V': printf("export (stabmeter) %s\n", stab_version()); exit(0);
    default: usage(stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "export: %s\n", optind >= argc ? "no trace given" : "more than one trace given");
    usage(stderr);
    return 2;
  }
  o->path = argv[optind];
  return 0;
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
  const column *a = pa, *b = pb;
  size_t ra = metric_rank(a->name), rb = metric_rank(b->name);
  if (ra != rb) return ra < rb ? -1 : 1;
  return natural_cmp(a->name, b->name);
}

static int layer_cmp(const void *pa, const void *pb) {
  return natural_cmp(((const layer *)pa)->group, ((const layer *)pb)->group);
}

static int column_name_cmp(const void *pa, const void *pb) {
  return natural_cmp(((const column *)pa)->name, ((const column *)pb)->name);
}

static int metric_wanted(const options *o, const char *name) {
  if (!o->metrics) return 1;
  for (size_t i = 0; i < o->n_metrics; i++)
    if (!strcmp(o->metrics[i], name)) return 1;
  return 0;
}

static int layer_wanted(const options *o, const char *group) {
  if (!o->n_layer_globs) return 1;
  for (size_t i = 0; i < o->n_layer_globs; i++)
    if (!fnmatch(o->layer_globs[i], group, 0)) return 1;
  return 0;
}

/* The names of the links of group g, in name order, into *names (malloc'd). */
static int list_links(const trace *t, hid_t g, const char *where, char ***names, size_t *n) {
  H5G_info_t info;
  *names = NULL, *n = 0;
  if (H5Gget_info(g, &info) < 0) return bad(t, "cannot list %s: %s", where, h5_reason());
  if (!info.nlinks) return 0;
  if (!(*names = calloc(info.nlinks, sizeof **names))) return oom();
  for (hsize_t i = 0; i < info.nlinks; i++) {
    ssize_t len = H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, NULL, 0, H5P_DEFAULT);
    if (len < 0) return bad(t, "cannot list %s: %s", where, h5_reason());
    if (!((*names)[i] = malloc((size_t)len + 1))) return oom();
    (*n)++;
    if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, (*names)[i], (size_t)len + 1, H5P_DEFAULT) < 0)
      return bad(t, "cannot list %s: %s", where, h5_reason());
  }
  return 0;
}

static void free_names(char **names, size_t n) {
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

/* ---- reading the schema ------------------------------------------------------------------ */

/* A string attribute of obj (fixed-length or variable-length) into buf. */
static int string_attr(const trace *t, hid_t obj, const char *where, const char *name, char *buf, size_t len) {
  int rc = 0;
  hid_t a = H5I_INVALID_HID, type = H5I_INVALID_HID, mem = H5I_INVALID_HID;
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
    snprintf(buf, len, "%s", s ? s : "");
    H5free_memory(s);
  } else {
    size_t size = H5Tget_size(type);
    char *s = calloc(size + 1, 1);
    if (!s) {
      rc = oom();
      goto out;
    }
    if (mem < 0 || H5Tset_size(mem, size + 1) < 0 || H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0 ||
        H5Aread(a, mem, s) < 0) {
      free(s);
      rc = bad(t, "cannot read the attribute '%s' of %s: %s", name, where, h5_reason());
      goto out;
    }
    snprintf(buf, len, "%s", s);
    free(s);
  }
out:
  if (mem >= 0) H5Tclose(mem);
  if (type >= 0) H5Tclose(type);
  if (a >= 0) H5Aclose(a);
  return rc;
}

static int int_attr(const trace *t, hid_t obj, const char *where, const char *name, int64_t *v) {
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
static int open_1d(const trace *t, hid_t loc, const char *name, const char *path, H5T_class_t cls,
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

static int new_column(const trace *t, hid_t g, const char *where, const char *name, column *c) {
  char path[1024];
  hsize_t n;
  snprintf(path, sizeof path, "%s/%s", where, name);
  c->d = H5I_INVALID_HID;
  if (!(c->name = strdup(name)) || !(c->v = malloc(BLOCK_ROWS * sizeof *c->v)))
    return oom();
  return open_1d(t, g, name, path, H5T_FLOAT, t->rows, 1, &c->d, &n);
}

/* Opens the group /name of the file into *g and lists its links. */
static int open_group(const trace *t, const char *name, hid_t *g, char ***names, size_t *n) {
  char where[32];
  snprintf(where, sizeof where, "/%s", name);
  if (H5Lexists(t->file, name, H5P_DEFAULT) <= 0) return bad(t, "the group %s is missing", where);
  if ((*g = H5Gopen2(t->file, name, H5P_DEFAULT)) < 0) return bad(t, "%s is not a group", where);
  return list_links(t, *g, where, names, n);
}

static int open_scalars(trace *t, const options *o) {
  hid_t g = H5I_INVALID_HID;
  char **names = NULL;
  size_t n = 0;
  int rc = 0;
  if ((rc = open_group(t, "scalars", &g, &names, &n))) goto out;
  if (n && !(t->scalars = calloc(n, sizeof *t->scalars))) {
    rc = oom();
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (metric_wanted(o, names[i])) rc = new_column(t, g, "/scalars", names[i], &t->scalars[t->n_scalars++]);
  if (!rc) qsort(t->scalars, t->n_scalars, sizeof *t->scalars, column_name_cmp);
out:
  free_names(names, n);
  if (g >= 0) H5Gclose(g);
  return rc;
}

static int open_layer(trace *t, const options *o, hid_t layers, const char *group, layer *l) {
  char where[600], kind[64];
  char **names = NULL;
  size_t n = 0;
  int rc = 0;
  snprintf(where, sizeof where, "/layers/%s", group);
  hid_t g = H5Gopen2(layers, group, H5P_DEFAULT);
  if (g < 0) return bad(t, "%s is not a group", where);
  if (!(l->group = strdup(group))) {
    rc = oom();
    goto out;
  }
  if ((rc = string_attr(t, g, where, "kind", kind, sizeof kind))) goto out;
  if (!(l->kind = strdup(kind))) {
    rc = oom();
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
    rc = oom();
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++)
    if (metric_wanted(o, names[i])) rc = new_column(t, g, where, names[i], &l->cols[l->n_cols++]);
  if (!rc) qsort(l->cols, l->n_cols, sizeof *l->cols, column_cmp);
out:
  free_names(names, n);
  H5Gclose(g);
  return rc;
}

static int open_layers(trace *t, const options *o) {
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
    rc = oom();
    goto out;
  }
  for (size_t i = 0; i < n && !rc; i++) {
    if (!layer_wanted(o, names[i])) continue;
    layer *l = &t->layers[t->n_layers++];
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

/* Every name of --metrics must select something: one that matches nothing is a typo. */
static int check_metrics(const trace *t, const options *o) {
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

static int open_trace(trace *t, const options *o) {
  char format[64];
  int64_t version;
  hsize_t n;
  int rc;
  FILE *probe = fopen(t->path, "rb");
  if (!probe) return bad(t, "%s", strerror(errno));
  fclose(probe);
  /* A trace written by stabmeter is in SWMR mode while its writer runs; any other HDF5 file
   * opens plainly. */
  t->swmr = 1;
  t->file = H5Fopen(t->path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, H5P_DEFAULT);
  if (t->file < 0) {
    t->swmr = 0;
    t->file = H5Fopen(t->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  if (t->file < 0) {
    if (H5Fis_hdf5(t->path) <= 0) return bad(t, "not an HDF5 file, so not a stabmeter trace");
    return bad(t, "cannot open it: %s", h5_reason());
  }
  if ((rc = string_attr(t, t->file, "the root group", "format", format, sizeof format))) return rc;
  if (strcmp(format, "stabmeter-trace"))
    return bad(t, "the attribute format of the root group is '%s', not 'stabmeter-trace'", format);
  if ((rc = int_attr(t, t->file, "the root group", "format_version", &version))) return rc;
  if (version != 1) return bad(t, "format_version %" PRId64 ": this program reads version 1", version);

  /* /step first: its length is the row count, and the writer extends every other dataset
   * before it, so each of them then holds at least that many rows. */
  if ((rc = open_1d(t, t->file, "step", "/step", H5T_INTEGER, 0, 0, &t->step, &t->rows))) return rc;
  t->wall.d = H5I_INVALID_HID;
  if ((rc = open_1d(t, t->file, "wall_time", "/wall_time", H5T_FLOAT, t->rows, 1, &t->wall.d, &n))) return rc;
  if (!metric_wanted(o, "wall_time")) {
    H5Dclose(t->wall.d);
    t->wall.d = H5I_INVALID_HID;
  } else if (!(t->wall.name = strdup("wall_time")) || !(t->wall.v = malloc(BLOCK_ROWS * sizeof *t->wall.v))) {
    return oom();
  }
  if ((rc = open_scalars(t, o)) || (rc = open_layers(t, o))) return rc;
  if ((rc = check_metrics(t, o))) return rc;
  const hsize_t block = BLOCK_ROWS;
  if (!(t->steps = malloc(BLOCK_ROWS * sizeof *t->steps)) || (t->mem = H5Screate_simple(1, &block, NULL)) < 0)
    return oom();
  return 0;
}

static void free_column(column *c) {
  if (c->d >= 0) H5Dclose(c->d);
  free(c->name);
  free(c->v);
}

static void close_trace(trace *t) {
  for (size_t i = 0; i < t->n_scalars; i++) free_column(&t->scalars[i]);
  for (size_t l = 0; l < t->n_layers; l++) {
    for (size_t c = 0; c < t->layers[l].n_cols; c++) free_column(&t->layers[l].cols[c]);
    free(t->layers[l].cols);
    free(t->layers[l].group);
    free(t->layers[l].kind);
  }
  free_column(&t->wall);
  free(t->scalars);
  free(t->layers);
  free(t->steps);
  if (t->mem >= 0) H5Sclose(t->mem);
  if (t->step >= 0) H5Dclose(t->step);
  if (t->file >= 0) H5Fclose(t->file);
}

/* ---- reading rows ----------------------------------------------------------------------- */

static int read_rows(const trace *t, hid_t d, const char *what, hsize_t first, hsize_t count, hid_t type,
                     void *buf) {
  const hsize_t zero = 0;
  hid_t fs = H5Dget_space(d);
  int ok = fs >= 0 && H5Sselect_hyperslab(fs, H5S_SELECT_SET, &first, NULL, &count, NULL) >= 0 &&
           H5Sselect_hyperslab(t->mem, H5S_SELECT_SET, &zero, NULL, &count, NULL) >= 0 &&
           H5Dread(d, type, t->mem, fs, H5P_DEFAULT, buf) >= 0;
  if (!ok) fprintf(stderr, "export: %s: cannot read rows of %s: %s\n", t->path, what, h5_reason());
  if (fs >= 0) H5Sclose(fs);
  return ok ? 0 : 1;
}

static int read_block(const trace *t, hsize_t first, hsize_t count) {
  char what[600];
  if (read_rows(t, t->step, "/step", first, count, H5T_NATIVE_INT64, t->steps)) return 1;
  if (t->wall.d >= 0 && read_rows(t, t->wall.d, "/wall_time", first, count, H5T_NATIVE_DOUBLE, t->wall.v)) return 1;
  for (size_t s = 0; s < t->n_scalars; s++) {
    snprintf(what, sizeof what, "/scalars/%s", t->scalars[s].name);
    if (read_rows(t, t->scalars[s].d, what, first, count, H5T_NATIVE_DOUBLE, t->scalars[s].v)) return 1;
  }
  for (size_t l = 0; l < t->n_layers; l++)
    for (size_t c = 0; c < t->layers[l].n_cols; c++) {
      const column *col = &t->layers[l].cols[c];
      snprintf(what, sizeof what, "/layers/%s/%s", t->layers[l].group, col->name);
      if (read_rows(t, col->d, what, first, count, H5T_NATIVE_DOUBLE, col->v)) return 1;
    }
  return 0;
}

/* ---- writing ----------------------------------------------------------------------------- */

/* The shortest decimal that strtod reads back as exactly v (15, 16 or 17 significant digits).
 * -0 is "-0.0", so that readers that take "-0" for the integer 0 keep its sign. */
static const char *number(double v, int json, char *buf, size_t len) {
  if (isnan(v)) return json ? "null" : "nan";
  if (isinf(v)) return v > 0 ? (json ? "1e999" : "inf") : (json ? "-1e999" : "-inf");
  if (v == 0 && signbit(v)) return "-0.0";
  for (int p = 15; p <= 17; p++) {
    snprintf(buf, len, "%.*g", p, v);
    if (strtod(buf, NULL) == v) break;
  }
  return buf;
}

static void csv_field(FILE *f, const char *s) {
  if (!s[strcspn(s, ",\"\r\n")]) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static void csv_row(FILE *f, int64_t step, const char *group, const char *kind, const char *metric, double v) {
  char buf[40];
  fprintf(f, "%" PRId64 ",", step);
  csv_field(f, group);
  fputc(',', f);
  csv_field(f, kind);
  fputc(',', f);
  csv_field(f, metric);
  fprintf(f, ",%s\n", number(v, 0, buf, sizeof buf));
}

/* A JSON string: quote, backslash and control characters escaped, other bytes as they are. */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void json_member(FILE *f, int *first, const char *name, double v) {
  char buf[40];
  if (!*first) fputs(", ", f);
  *first = 0;
  json_string(f, name);
  fprintf(f, ": %s", number(v, 1, buf, sizeof buf));
}

static void write_row(FILE *f, const trace *t, out_format format, size_t r) {
  int64_t step = t->steps[r];
  if (format == FORMAT_CSV) {
    if (t->wall.d >= 0) csv_row(f, step, "", "scalar", "wall_time", t->wall.v[r]);
    for (size_t s = 0; s < t->n_scalars; s++) csv_row(f, step, "", "scalar", t->scalars[s].name, t->scalars[s].v[r]);
    for (size_t l = 0; l < t->n_layers; l++)
      for (size_t c = 0; c < t->layers[l].n_cols; c++)
        csv_row(f, step, t->layers[l].group, t->layers[l].kind, t->layers[l].cols[c].name, t->layers[l].cols[c].v[r]);
    return;
  }
  char buf[40];
  int first = 1;
  fprintf(f, "{\"step\": %" PRId64, step);
  if (t->wall.d >= 0) fprintf(f, ", \"wall_time\": %s", number(t->wall.v[r], 1, buf, sizeof buf));
  fputs(", \"scalars\": {", f);
  for (size_t s = 0; s < t->n_scalars; s++) json_member(f, &first, t->scalars[s].name, t->scalars[s].v[r]);
  fputs("}, \"layers\": {", f);
  for (size_t l = 0; l < t->n_layers; l++) {
    const layer *ly = &t->layers[l];
    if (l) fputs(", ", f);
    json_string(f, ly->group);
    fputs(": {\"kind\": ", f);
    json_string(f, ly->kind);
    first = 0;
    for (size_t c = 0; c < ly->n_cols; c++) json_member(f, &first, ly->cols[c].name, ly->cols[c].v[r]);
    fputc('}', f);
  }
  fputs("}}\n", f);
}

static int export_rows(const trace *t, const options *o, FILE *f) {
  if (o->format == FORMAT_CSV) fputs("step,layer,kind,metric,value\n", f);
  for (hsize_t first = 0; first < t->rows; first += BLOCK_ROWS) {
    hsize_t count = t->rows - first < BLOCK_ROWS ? t->rows - first : BLOCK_ROWS;
    if (read_block(t, first, count)) return 1;
    for (size_t r = 0; r < count; r++) {
      int64_t s = t->steps[r];
      if ((o->has_lo && s < o->lo) || (o->has_hi && s > o->hi)) continue;
      write_row(f, t, o->format, r);
    }
    if (ferror(f)) break;
  }
  return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  options o;
  memset(&o, 0, sizeof o);
  trace t;
  memset(&t, 0, sizeof t);
  t.file = t.step = t.mem = t.wall.d = H5I_INVALID_HID;
  FILE *f = NULL;
  int rc = parse(argc, argv, &o);
  if (rc) goto out;
  t.path = o.path;
  /* The messages are ours: HDF5 prints nothing, its reason is quoted in them. */
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if ((rc = open_trace(&t, &o))) goto out;
  f = o.out ? fopen(o.out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "export: cannot create %s: %s\n", o.out, strerror(errno));
    rc = 1;
    goto out;
  }
  rc = export_rows(&t, &o, f);
  int werr = ferror(f) || fflush(f) != 0;
  if (o.out && fclose(f) != 0) werr = 1;
  f = NULL;
  if (!rc && werr) {
    fprintf(stderr, "export: cannot write %s: %s\n", o.out ? o.out : "the standard output", strerror(errno));
    rc = 1;
  }
  if (rc && o.out) remove(o.out); /* no half-written file */
out:
  if (f && f != stdout) fclose(f);
  close_trace(&t);
  for (size_t i = 0; i < o.n_metrics; i++) free(o.metrics[i]);
  free(o.metrics);
  free(o.layer_globs);
  return rc;
}
