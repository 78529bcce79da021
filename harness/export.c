/* export.c — a stabmeter trace (HDF5, SPEC.md "Trace") as CSV in long form or as JSON lines,
 * for tools that do not read HDF5: gnuplot, spreadsheets, pandas without h5py. The trace is
 * opened for SWMR reading, so a trace whose writer is still running (or was killed) exports the
 * rows flushed so far (the reading is harness/trace_reader.c). Values are written so that they
 * read back as the same doubles. */
#include "stabmeter.h"

#include "trace_reader.h"

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
  fprintf(stderr, "export: out of memory\n");
  return 1;
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
          "  -o, --output FILE   write to FILE (default: standard output): written beside it and\n"
          "                      renamed over it once complete, so a failed export leaves FILE as it\n"
          "                      was; FILE may not be the trace itself (nor a link to it). A FILE\n"
          "                      that is not a regular file (/dev/stdout, a FIFO) is written in place\n"
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
          "The trace must be a regular file. A trace whose writer runs is read as it stands (its\n"
          "flushed rows). What HDF5 checksums is verified on the way: the metadata (groups, names,\n"
          "attributes, dataset layouts and chunk indexes); a damaged piece is an error naming the\n"
          "object. The values themselves carry no checksum in traces of this version, so a changed\n"
          "byte inside them cannot be detected.\n"
          "HDF5 loops for ever, or crashes, on some damaged files: reading the trace's groups and\n"
          "attributes is bounded to 60 s (environment STAB_EXPORT_OPEN_SECONDS), and a crash inside\n"
          "the reading is reported; either way the file counts as damaged and nothing is written.\n"
          "Exit status: 0 success, 1 failure (e.g. writing the output), 2 bad usage, a path that is\n"
          "not a regular file, or a file that is not a stabmeter trace or is damaged (the message\n"
          "names the dataset or attribute at fault).\n");
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

static void write_row(FILE *f, trace *t, out_format format, size_t r) {
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
    const trace_layer *ly = &t->layers[l];
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

static int export_rows(trace *t, const options *o, FILE *f) {
  if (o->format == FORMAT_CSV) fputs("step,layer,kind,metric,value\n", f);
  for (hsize_t first = 0; first < t->rows; first += TRACE_BLOCK_ROWS) {
    hsize_t count = t->rows - first < TRACE_BLOCK_ROWS ? t->rows - first : TRACE_BLOCK_ROWS;
    int rc = trace_read_block(t, first, count);
    if (rc) {
      fprintf(stderr, "export: %s\n", t->msg);
      return rc;
    }
    for (size_t r = 0; r < count; r++) {
      int64_t s = t->steps[r];
      if ((o->has_lo && s < o->lo) || (o->has_hi && s > o->hi)) continue;
      write_row(f, t, o->format, r);
    }
    if (ferror(f)) break;
  }
  return 0;
}

/* ---- HDF5's failures on damaged files, contained --------------------------------------------- */

/* HDF5 1.10.8 trusts the sizes it finds in a file's global heap, where the attributes'
 * variable-length strings live and which has no checksum: one damaged byte there can make it
 * loop for ever, or copy a wild number of bytes and crash (fuzz_trace finds both within
 * minutes; tests/hostile_inputs.sh replays such files). Export cannot mend HDF5, so it contains
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
                   "export: %s: reading the trace's groups and attributes took more than %lu s: a damaged file "
                   "(HDF5 loops on some); nothing written\n", path, limit);
  timeout_len = msg_len(timeout_msg, sizeof timeout_msg, k);
  k = snprintf(crash_msg, sizeof crash_msg,
               "export: %s: HDF5 crashed reading the trace: a damaged file (HDF5 1.10.8 trusts sizes it finds in "
               "parts of the file that carry no checksum); nothing written (", path);
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
  if (exists && sb.st_dev == t->dev && sb.st_ino == t->ino) {
    fprintf(stderr, "export: %s: is the trace being exported (%s): refusing to write over it; nothing written\n",
            path, t->path);
    return 2;
  }
  if (exists && !S_ISREG(sb.st_mode)) {
    if (!(out->f = fopen(path, "w"))) {
      fprintf(stderr, "export: cannot write %s: %s\n", path, strerror(errno));
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
    fprintf(stderr, "export: cannot create %s: %s\n", path, strerror(errno));
    free(out->tmp), out->tmp = NULL;
    return 1;
  }
  if (strlen(out->tmp) < sizeof crash_tmp) strcpy(crash_tmp, out->tmp); /* removed if HDF5 crashes */
  /* mkstemp's 0600: a replaced file keeps its permissions, a new one gets the umask's */
  mode_t mask = umask(0);
  umask(mask);
  if (fchmod(fd, exists ? sb.st_mode & 07777 : 0666 & ~mask) != 0 || !(out->f = fdopen(fd, "w"))) {
    fprintf(stderr, "export: cannot create %s: %s\n", path, strerror(errno));
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
      fprintf(stderr, "export: cannot write %s: %s\n", out->name, strerror(e));
      rc = 1;
    }
  }
  if (out->tmp) {
    if (!rc && rename(out->tmp, out->target) != 0) {
      fprintf(stderr, "export: cannot write %s: renaming %s into place: %s\n", out->name, out->tmp, strerror(errno));
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
  options o;
  memset(&o, 0, sizeof o);
  trace t;
  trace_init(&t);
  output out;
  memset(&out, 0, sizeof out);
  int rc = parse(argc, argv, &o);
  if (rc) goto out;
  const trace_filter filter = {o.layer_globs, o.n_layer_globs, o.metrics, o.n_metrics};
  guard_reading(o.path);
  rc = trace_open(&t, o.path, &filter);
  alarm(0);
  if (rc) {
    fprintf(stderr, "export: %s\n", t.msg);
    goto out;
  }
  if ((rc = output_open(&out, o.out, &t))) {
    rc = output_close(&out, rc);
    goto out;
  }
  rc = output_close(&out, export_rows(&t, &o, out.f));
out:
  trace_close(&t);
  for (size_t i = 0; i < o.n_metrics; i++) free(o.metrics[i]);
  free(o.metrics);
  free(o.layer_globs);
  return rc;
}
