/* export.c — a stabmeter trace (HDF5; its datasets are described in docs/manual/metrics.md) as CSV or
 * JSON lines, in long form (one value a row) or wide (one step a row, one column per
 * layer.metric), for tools that do not read HDF5: gnuplot, spreadsheets, pandas without h5py. The trace is
 * opened for SWMR reading, so a trace whose writer is still running (or was killed) exports the
 * rows flushed so far (the reading is the library's, stab_trace_read_*). Values are written so
 * that they read back as the same doubles. */
#include "stabmeter.h"

#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { FORMAT_CSV, FORMAT_JSONL } out_format;

typedef struct {
  out_format format;
  int wide;                 /* --wide: one row per step, one column per layer.metric */
  const char *out;          /* NULL: stdout */
  const char **layer_globs; /* --layers, any of them */
  size_t n_layer_globs;
  char **metrics;           /* --metrics, split at commas; NULL: every dataset */
  size_t n_metrics;
  int has_lo, has_hi;       /* --steps A:B, inclusive */
  int64_t lo, hi;
  const char *path;
} options;

/* ---- messages -------------------------------------------------------------------------- */

static int oom(void) {
  cli_error("out of memory");
  return CLI_FAILED;
}

/* The library's failure as export reports it: its message (naming the trace and the object at
 * fault), and exit 1 for memory, 2 for the input. */
static int read_failed(stab_status st) {
  cli_error("%s", stab_last_error());
  return st == STAB_ENOMEM ? CLI_FAILED : CLI_USAGE;
}

/* ---- the trace, a block of rows at a time ------------------------------------------------ */

/* Rows read from every column at a time: the memory is BLOCK_ROWS x columns x 8 bytes (5.6 MB
 * for the 682 columns of 40 linear layers), whatever the trace's length. */
enum { BLOCK_ROWS = 1024 };

typedef struct {
  stab_trace_reader *r;
  const char *path;
  int64_t rows;
  int wall;          /* wall_time is read */
  size_t n_scalars, n_layers;
  size_t n_values;   /* columns: wall_time (when read), the scalars, then every layer's metrics */
  int64_t *steps;    /* BLOCK_ROWS */
  double *v;         /* n_values x BLOCK_ROWS: column c's row i at v[c * BLOCK_ROWS + i] */
} trace;

/* Opens the trace at path as filter selects, and the block's memory. Returns the exit status. */
static int trace_open(trace *t, const char *path, const stab_trace_read_params *filter) {
  memset(t, 0, sizeof *t);
  t->path = path;
  stab_status st = stab_trace_read_open(path, filter, &t->r);
  if (st != STAB_OK) return read_failed(st);
  t->rows = stab_trace_read_rows(t->r);
  t->wall = stab_trace_read_has_wall_time(t->r);
  t->n_scalars = stab_trace_read_scalar_count(t->r);
  t->n_layers = stab_trace_read_layer_count(t->r);
  t->n_values = (size_t)t->wall + t->n_scalars;
  for (size_t l = 0; l < t->n_layers; l++) t->n_values += stab_trace_read_metric_count(t->r, l);
  if (!(t->steps = malloc(BLOCK_ROWS * sizeof *t->steps)) ||
      !(t->v = malloc((t->n_values ? t->n_values : 1) * BLOCK_ROWS * sizeof *t->v)))
    return oom();
  return 0;
}

static void trace_close(trace *t) {
  stab_trace_read_close(t->r);
  free(t->steps);
  free(t->v);
  memset(t, 0, sizeof *t);
}

/* Rows [first, first + count) (count <= BLOCK_ROWS) of every column into the block. */
static int trace_read_block(trace *t, int64_t first, size_t count) {
  stab_status st = stab_trace_read_steps(t->r, first, count, t->steps);
  double *v = t->v;
  if (!st && t->wall) st = stab_trace_read_wall_time(t->r, first, count, v), v += BLOCK_ROWS;
  for (size_t s = 0; s < t->n_scalars && !st; s++, v += BLOCK_ROWS) st = stab_trace_read_scalar(t->r, s, first, count, v);
  for (size_t l = 0; l < t->n_layers && !st; l++)
    for (size_t c = 0; c < stab_trace_read_metric_count(t->r, l) && !st; c++, v += BLOCK_ROWS)
      st = stab_trace_read_metric(t->r, l, c, first, count, v);
  return st ? read_failed(st) : 0;
}

/* ---- options --------------------------------------------------------------------------- */

#ifndef STAB_DOCDIR /* set by Makefile.am: where docs/manual/metrics.md is installed */
#define STAB_DOCDIR "/usr/local/share/doc/stabmeter"
#endif

static void usage(void) {
  printf("Usage: %s [OPTION]... TRACE\n"
         "Writes a stabmeter trace (HDF5) as CSV or JSON lines, in long form (one value per row)\n"
         "or wide (one step per row). The datasets and what they measure are described in\n"
         "docs/manual/metrics.md (installed as " STAB_DOCDIR "/docs/manual/metrics.md).\n"
         "\n"
         "Options:\n"
         "      --format FORMAT  csv (default) or jsonl.\n"
         "                       csv, long: a header line 'step,layer,kind,metric,value', then one\n"
         "                       row per value: per step, wall_time and every /scalars dataset\n"
         "                       (empty layer, kind 'scalar'), then every layer's datasets.\n"
         "                       jsonl, long: one object per step, {\"step\": S, \"wall_time\": W,\n"
         "                       \"scalars\": {NAME: V, ...}, \"layers\": {LAYER: {\"kind\": K,\n"
         "                       METRIC: V, ...}, ...}}.\n"
         "      --wide           one row per step and one column per value: the CSV header is\n"
         "                       step, wall_time, the scalars, then LAYER.METRIC for each of a\n"
         "                       layer's datasets (e.g. step,wall_time,loss,lr,lm_head.forward,\n"
         "                       ...), the columns in the order of the long form. With jsonl,\n"
         "                       one flat object per step with the same keys ({\"step\": S,\n"
         "                       \"wall_time\": W, \"loss\": V, \"LAYER.METRIC\": V, ...}).\n"
         "                       pandas.read_csv, spreadsheets and gnuplot (set datafile\n"
         "                       separator comma) read it as it is; for the exact doubles,\n"
         "                       pandas needs float_precision='round_trip' (read_json:\n"
         "                       precise_float=True): its default parsers are off by up to\n"
         "                       about 1e-11 relative. Two columns of one name (a layer and\n"
         "                       metric that run together like another's) are an error: use\n"
         "                       the long form.\n"
         "  -o, --output FILE    write to FILE (default: standard output): written beside it and\n"
         "                       renamed over it once complete, so a failed export leaves FILE as\n"
         "                       it was; FILE may not be the trace itself (nor a link to it). A\n"
         "                       FILE that is not a regular file (/dev/stdout, a FIFO) is written\n"
         "                       in place\n"
         "      --layers GLOB    only layers whose group name (under /layers) matches the shell\n"
         "                       pattern GLOB; repeat for several. Run-level values are kept.\n"
         "      --metrics LIST   only these datasets, comma-separated, e.g. forward,update,loss\n"
         "                       (layer metrics, scalars and wall_time alike)\n"
         "      --steps A:B      only rows whose step is in A..B, both included; A: or :B leave\n"
         "                       one side open, A alone is one step\n"
         "  -h, --help           print this help and exit\n"
         "  -V, --version        print the version and exit\n"
         "\n"
         "A --layers pattern or a --metrics name that matches nothing is an error (exit 2).\n"
         "Rows are in the trace's order; layers and scalars in name order (numbers in names\n"
         "compared as numbers), a layer's metrics in the writer's order (forward, dependency,\n"
         "update, ...). Values are the shortest decimals that read back as the same double. In\n"
         "CSV, NaN is 'nan' and infinities 'inf' and '-inf' (what pandas.read_csv and gnuplot\n"
         "read as such), and fields holding ',', '\"' or a line break are quoted (RFC 4180); in\n"
         "JSON lines NaN is null and infinities 1e999 and -1e999 (read back as inf).\n"
         "\n"
         "The trace must be a regular file. A trace whose writer runs is read as it stands (its\n"
         "flushed rows). What HDF5 checksums is verified on the way: the metadata (groups, names,\n"
         "attributes, dataset layouts and chunk indexes); a damaged piece is an error naming the\n"
         "object. The values themselves carry no checksum in traces of this version, so a changed\n"
         "byte inside them cannot be detected. HDF5 loops for ever, or crashes, on some damaged\n"
         "files: reading the trace's groups and attributes is bounded to 60 s (environment\n"
         "STAB_EXPORT_OPEN_SECONDS), and a crash inside the reading is reported; either way the\n"
         "file counts as damaged and nothing is written.\n"
         "\n"
         "Exit status:\n"
         "  0  success\n"
         "  1  failure (e.g. writing the output)\n"
         "  2  bad usage, or bad input: a trace that is missing or not a regular file, a file\n"
         "     that is not a stabmeter trace or is damaged (the message names the dataset or\n"
         "     attribute at fault), a filter that matches nothing\n",
         cli_name);
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
  enum { O_FORMAT = 256, O_LAYERS, O_METRICS, O_STEPS, O_WIDE };
  static const struct option longs[] = {
      {"format", required_argument, 0, O_FORMAT}, {"output", required_argument, 0, 'o'},
      {"layers", required_argument, 0, O_LAYERS}, {"metrics", required_argument, 0, O_METRICS},
      {"steps", required_argument, 0, O_STEPS},   {"wide", no_argument, 0, O_WIDE},
      {"help", no_argument, 0, 'h'},              {"version", no_argument, 0, 'V'},
      {0, 0, 0, 0}};
  static const char *const formats[] = {"csv", "jsonl", NULL};
  int c, which;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS "o:", longs, NULL)) != -1) {
    switch (c) {
    case O_FORMAT:
      if (cli_choice("--format", optarg, formats, &which)) return CLI_USAGE;
      o->format = which ? FORMAT_JSONL : FORMAT_CSV;
      break;
    case O_WIDE: o->wide = 1; break;
    case 'o': o->out = optarg; break;
    case O_LAYERS: {
      const char **g = realloc(o->layer_globs, (o->n_layer_globs + 1) * sizeof *g);
      if (!g) return oom();
      o->layer_globs = g;
      g[o->n_layer_globs++] = optarg;
      break;
    }
    case O_METRICS:
      if (split_metrics(optarg, o))
        return cli_bad_value("--metrics", optarg, "dataset names separated by commas");
      break;
    case O_STEPS:
      if (parse_steps(optarg, o))
        return cli_bad_value("--steps", optarg, "A:B, A:, :B or A, with integers A <= B");
      break;
    case 'h': usage(); return -1;
    case 'V': cli_version(); return -1;
    default: return cli_getopt_error(c, argv);
    }
  }
  if (optind != argc - 1) return cli_usage_error("%s", optind >= argc ? "no trace given" : "more than one trace given");
  o->path = argv[optind];
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
  const double *v = t->v + r; /* the next column's value of row r: v[0], then v += BLOCK_ROWS */
  if (format == FORMAT_CSV) {
    if (t->wall) csv_row(f, step, "", "scalar", "wall_time", *v), v += BLOCK_ROWS;
    for (size_t s = 0; s < t->n_scalars; s++, v += BLOCK_ROWS)
      csv_row(f, step, "", "scalar", stab_trace_read_scalar_name(t->r, s), *v);
    for (size_t l = 0; l < t->n_layers; l++)
      for (size_t c = 0; c < stab_trace_read_metric_count(t->r, l); c++, v += BLOCK_ROWS)
        csv_row(f, step, stab_trace_read_layer_name(t->r, l), stab_trace_read_layer_kind(t->r, l),
                stab_trace_read_metric_name(t->r, l, c), *v);
    return;
  }
  char buf[40];
  int first = 1;
  fprintf(f, "{\"step\": %" PRId64, step);
  if (t->wall) fprintf(f, ", \"wall_time\": %s", number(*v, 1, buf, sizeof buf)), v += BLOCK_ROWS;
  fputs(", \"scalars\": {", f);
  for (size_t s = 0; s < t->n_scalars; s++, v += BLOCK_ROWS) json_member(f, &first, stab_trace_read_scalar_name(t->r, s), *v);
  fputs("}, \"layers\": {", f);
  for (size_t l = 0; l < t->n_layers; l++) {
    if (l) fputs(", ", f);
    json_string(f, stab_trace_read_layer_name(t->r, l));
    fputs(": {\"kind\": ", f);
    json_string(f, stab_trace_read_layer_kind(t->r, l));
    first = 0;
    for (size_t c = 0; c < stab_trace_read_metric_count(t->r, l); c++, v += BLOCK_ROWS)
      json_member(f, &first, stab_trace_read_metric_name(t->r, l, c), *v);
    fputc('}', f);
  }
  fputs("}}\n", f);
}

/* ---- the wide form ---------------------------------------------------------------------------- */

/* The wide form's column names after "step", in the long form's order: wall_time, the scalars,
 * then LAYER.METRIC per layer; n of them, each malloc'd (the caller frees them and the array),
 * or NULL when memory runs out. */
static char **wide_names(const trace *t, size_t *n) {
  char **names = calloc(t->n_values ? t->n_values : 1, sizeof *names);
  if (!names) return NULL;
  size_t i = 0;
  int ok = 1;
  if (t->wall) ok = (names[i++] = strdup("wall_time")) != NULL;
  for (size_t s = 0; s < t->n_scalars && ok; s++) ok = (names[i++] = strdup(stab_trace_read_scalar_name(t->r, s))) != NULL;
  for (size_t l = 0; l < t->n_layers && ok; l++)
    for (size_t c = 0; c < stab_trace_read_metric_count(t->r, l) && ok; c++) {
      const char *layer = stab_trace_read_layer_name(t->r, l), *metric = stab_trace_read_metric_name(t->r, l, c);
      size_t len = strlen(layer) + strlen(metric) + 2;
      if ((ok = (names[i] = malloc(len)) != NULL)) snprintf(names[i++], len, "%s.%s", layer, metric);
    }
  *n = i;
  if (!ok) {
    for (size_t j = 0; j < i; j++) free(names[j]);
    free(names);
    return NULL;
  }
  return names;
}

static int strcmp_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A column name that would appear twice (a layer "a" with metric "b.c" and a layer "a.b" with
 * "c"; a scalar named like a layer's column, or "step"): readers would silently keep one, so it
 * is refused, naming it. Returns 0, or the message and 2. */
static int wide_check(const trace *t, char **names, size_t n) {
  char **sorted = malloc((n + 1) * sizeof *sorted);
  if (!sorted) return oom();
  memcpy(sorted, names, n * sizeof *names);
  sorted[n++] = "step";
  qsort(sorted, n, sizeof *sorted, strcmp_ptr);
  int rc = 0;
  for (size_t i = 1; i < n && !rc; i++)
    if (!strcmp(sorted[i - 1], sorted[i])) {
      cli_error("%s: --wide: two columns would be named '%s' (layer and metric names run together "
                "alike); export it in long form, or leave one out with --layers or --metrics", t->path, sorted[i]);
      rc = CLI_USAGE;
    }
  free(sorted);
  return rc;
}

/* The header: CSV only (JSON lines name every value in its row). */
static void wide_header(FILE *f, char **names, size_t n, out_format format) {
  if (format != FORMAT_CSV) return;
  fputs("step", f);
  for (size_t i = 0; i < n; i++) {
    fputc(',', f);
    csv_field(f, names[i]);
  }
  fputc('\n', f);
}

/* One step: the values in the order of wide_names. */
static void wide_row(FILE *f, const trace *t, char **names, out_format format, size_t r) {
  char buf[40];
  size_t i = 0;
  int json = format == FORMAT_JSONL;
#define VALUE(v)                                                     \
  do {                                                               \
    if (json) {                                                      \
      fputs(", ", f);                                                \
      json_string(f, names[i]);                                      \
      fprintf(f, ": %s", number((v), 1, buf, sizeof buf));           \
    } else {                                                         \
      fprintf(f, ",%s", number((v), 0, buf, sizeof buf));            \
    }                                                                \
    i++;                                                             \
  } while (0)
  fprintf(f, json ? "{\"step\": %" PRId64 : "%" PRId64, t->steps[r]);
  for (size_t c = 0; c < t->n_values; c++) VALUE(t->v[c * BLOCK_ROWS + r]); /* wide_names' order */
#undef VALUE
  fputs(json ? "}\n" : "\n", f);
}

/* ---- the rows ---------------------------------------------------------------------------------- */

/* Every row the step filter keeps, in the trace's order; names: the wide form's columns, or NULL
 * for the long form. */
static int export_rows(trace *t, const options *o, char **names, size_t n_names, FILE *f) {
  if (names) wide_header(f, names, n_names, o->format);
  else if (o->format == FORMAT_CSV) fputs("step,layer,kind,metric,value\n", f);
  for (int64_t first = 0; first < t->rows; first += BLOCK_ROWS) {
    size_t count = t->rows - first < BLOCK_ROWS ? (size_t)(t->rows - first) : BLOCK_ROWS;
    int rc = trace_read_block(t, first, count);
    if (rc) return rc;
    for (size_t r = 0; r < count; r++) {
      int64_t s = t->steps[r];
      if ((o->has_lo && s < o->lo) || (o->has_hi && s > o->hi)) continue;
      if (names) wide_row(f, t, names, o->format, r);
      else write_row(f, t, o->format, r);
    }
    if (ferror(f)) break;
  }
  return 0;
}

/* ---- HDF5's failures on damaged files, contained --------------------------------------------- */

/* HDF5 1.10.8 trusts the sizes it finds in a file's global heap, where the attributes'
 * variable-length strings live and which has no checksum: one damaged byte there can make it
 * loop for ever, or copy a wild number of bytes and crash (fuzz_trace finds both within
 * minutes; tests/programs/hostile_inputs.sh replays such files). Export cannot mend HDF5, so it contains
 * it: the reading of the structure (attributes, groups, dataset headers: well under a second for
 * any trace) is bounded to OPEN_LIMIT_SECONDS, and a crash while reading the trace, structure or
 * rows, is reported as what it is, a damaged file (exit 2), with the temporary output removed.
 * Everything the handlers use is made ready beforehand: they only write, unlink and _exit. */
enum { OPEN_LIMIT_SECONDS = 60 };
static char timeout_msg[1200], crash_msg[1200];
static size_t timeout_len, crash_len;
static char crash_tmp[4096]; /* the temporary output while it exists, else "" */

static void say(const char *s, size_t n) {
  ssize_t w = write(STDERR_FILENO, s, n);
  (void)w;
}

static void open_timed_out(int sig) {
  (void)sig;
  say(timeout_msg, timeout_len);
  if (crash_tmp[0]) unlink(crash_tmp);
  _exit(2);
}

static void reading_crashed(int sig) {
  const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : "SIGILL";
  say(crash_msg, crash_len);
  say(name, strlen(name));
  say(")\n", 2);
  if (crash_tmp[0]) unlink(crash_tmp);
  _exit(2);
}

/* The length of what snprintf put in buf (all of it, or as much as fits). */
static size_t msg_len(const char *buf, size_t size, int k) { return k > 0 && (size_t)k < size ? (size_t)k : strlen(buf); }

/* Arms both: the bound on the structure (STAB_EXPORT_OPEN_SECONDS seconds, else
 * OPEN_LIMIT_SECONDS; alarm(0) ends it) and the crash handlers, for the rest of the run. */
static void guard_reading(const char *path) {
  const char *env = getenv("STAB_EXPORT_OPEN_SECONDS");
  char *end;
  unsigned long limit = env ? strtoul(env, &end, 10) : 0;
  if (!env || *end || limit == 0 || limit > 86400) limit = OPEN_LIMIT_SECONDS;
  int k = snprintf(timeout_msg, sizeof timeout_msg,
                   "%s: %s: reading the trace's groups and attributes took more than %lu s: a damaged file "
                   "(HDF5 loops on some); nothing written\n", cli_name, path, limit);
  timeout_len = msg_len(timeout_msg, sizeof timeout_msg, k);
  k = snprintf(crash_msg, sizeof crash_msg,
               "%s: %s: HDF5 crashed reading the trace: a damaged file (HDF5 1.10.8 trusts sizes it finds in "
               "parts of the file that carry no checksum); nothing written (", cli_name, path);
  crash_len = msg_len(crash_msg, sizeof crash_msg, k);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = open_timed_out;
  sigaction(SIGALRM, &sa, NULL);
  sa.sa_handler = reading_crashed;
  sa.sa_flags = SA_RESETHAND; /* a second fault inside the handler ends the process as usual */
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
  sigaction(SIGFPE, &sa, NULL);
  sigaction(SIGILL, &sa, NULL);
  alarm((unsigned)limit);
}

/* ---- the output file ----------------------------------------------------------------------- */

/* Where the rows go. A regular file (new or existing) is written as a temporary beside it,
 * renamed over it once everything is written: an existing file is replaced only on success,
 * and on failure only the temporary is removed, never a file export did not create. Anything
 * else that exists at the path (a terminal, /dev/null, a FIFO) is written in place. */
typedef struct {
  FILE *f;
  const char *name; /* for messages: the path given, or "the standard output" */
  char *target;     /* the path renamed over (symbolic links resolved); NULL: no temporary */
  char *tmp;        /* the temporary, while it exists */
} output;

static int output_open(output *out, const char *path, const trace *t) {
  memset(out, 0, sizeof *out);
  if (!path) {
    out->f = stdout, out->name = "the standard output";
    return 0;
  }
  out->name = path;
  struct stat sb;
  int exists = stat(path, &sb) == 0;
  /* The same file however it is reached (the path itself, a symbolic link, a hard link): writing
   * it would destroy the trace being read. */
  if (exists && stab_trace_read_is_file(t->r, path)) {
    cli_error("%s: is the trace being exported (%s): refusing to write over it; nothing written",
            path, t->path);
    return 2;
  }
  if (exists && !S_ISREG(sb.st_mode)) {
    if (!(out->f = fopen(path, "w"))) {
      cli_error("cannot write %s: %s", path, strerror(errno));
      return 1;
    }
    return 0;
  }
  /* Beside the file the path leads to, so that the rename stays on its file system and a
   * symbolic link keeps pointing at the new contents. */
  out->target = exists ? realpath(path, NULL) : strdup(path);
  if (!out->target || !(out->tmp = malloc(strlen(out->target) + 16))) return oom();
  sprintf(out->tmp, "%s.XXXXXX", out->target);
  int fd = mkstemp(out->tmp);
  if (fd < 0) {
    cli_error("cannot create %s: %s", path, strerror(errno));
    free(out->tmp), out->tmp = NULL;
    return 1;
  }
  if (strlen(out->tmp) < sizeof crash_tmp) strcpy(crash_tmp, out->tmp); /* removed if HDF5 crashes */
  /* mkstemp's 0600: a replaced file keeps its permissions, a new one gets the umask's */
  mode_t mask = umask(0);
  umask(mask);
  if (fchmod(fd, exists ? sb.st_mode & 07777 : 0666 & ~mask) != 0 || !(out->f = fdopen(fd, "w"))) {
    cli_error("cannot create %s: %s", path, strerror(errno));
    close(fd);
    return 1;
  }
  return 0;
}

/* Finishes the output after export_rows returned rc: flushed and checked, the temporary renamed
 * into place on success, removed otherwise. Returns the exit status. */
static int output_close(output *out, int rc) {
  if (out->f) {
    int werr = ferror(out->f) || fflush(out->f) != 0;
    int e = errno;
    if (out->f != stdout && fclose(out->f) != 0) werr = 1, e = errno;
    out->f = NULL;
    if (!rc && werr) {
      cli_error("cannot write %s: %s", out->name, strerror(e));
      rc = 1;
    }
  }
  if (out->tmp) {
    if (!rc && rename(out->tmp, out->target) != 0) {
      cli_error("cannot write %s: renaming %s into place: %s", out->name, out->tmp, strerror(errno));
      rc = 1;
    }
    if (rc) unlink(out->tmp); /* no half-written file; the one at the path is untouched */
    crash_tmp[0] = '\0';
  }
  free(out->tmp), free(out->target);
  memset(out, 0, sizeof *out);
  return rc;
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  cli_init("stabmeter-export");
  options o;
  memset(&o, 0, sizeof o);
  trace t;
  memset(&t, 0, sizeof t);
  output out;
  memset(&out, 0, sizeof out);
  char **names = NULL; /* --wide: the columns */
  size_t n_names = 0;
  int rc = parse(argc, argv, &o);
  if (rc) {
    rc = rc < 0 ? CLI_OK : rc; /* -1: --help or --version done */
    goto out;
  }
  const stab_trace_read_params filter = {o.layer_globs, o.n_layer_globs, (const char *const *)o.metrics,
                                         o.n_metrics};
  guard_reading(o.path);
  rc = trace_open(&t, o.path, &filter);
  alarm(0);
  if (rc) goto out;
  if (o.wide) {
    if (!(names = wide_names(&t, &n_names))) {
      rc = oom();
      goto out;
    }
    if ((rc = wide_check(&t, names, n_names))) goto out;
  }
  if ((rc = output_open(&out, o.out, &t))) {
    rc = output_close(&out, rc);
    goto out;
  }
  rc = output_close(&out, export_rows(&t, &o, names, n_names, out.f));
out:
  for (size_t i = 0; i < n_names; i++) free(names[i]);
  free(names);
  trace_close(&t);
  for (size_t i = 0; i < o.n_metrics; i++) free(o.metrics[i]);
  free(o.metrics);
  free(o.layer_globs);
  return rc;
}
