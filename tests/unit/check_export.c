/* check_export.c — harness/export against traces written through the library: every value of
 * the CSV and JSON-lines output parsed back (by the strict parsers below) and compared bit for
 * bit with what the monitor and the caller handed to stab_trace_append, NaN, infinities, -0,
 * subnormals and the extremes of double and int64 included; the filters; a trace read while
 * its writer runs; traces damaged with the HDF5 C API, each refused with exit status 2
 * and a message naming the file and the dataset or attribute at fault; an output that is the
 * trace itself (by its path, a symbolic or a hard link) refused with the trace untouched, and
 * an output that cannot be written never removed. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hdf5.h>

#include "stabmeter.h"
#include "testutil.h"

/* ---- the program under test ------------------------------------------------------------ */

static const char *export_program(void) {
  const char *p = getenv("EXPORT_PROGRAM");
  return p && p[0] ? p : "./harness/export";
}

static char tmpdir[64];

static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_export"); }

static void remove_tmpdir(void) { tu_tmpdir_remove(tmpdir); }

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

/* A whole file as a NUL-terminated string (the caller frees). */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
  size_t cap = 4096, n = 0;
  char *s = malloc(cap);
  ck_assert_ptr_nonnull(s);
  size_t k;
  while ((k = fread(s + n, 1, cap - n - 1, f)) > 0) {
    n += k;
    if (cap - n - 1 == 0) {
      s = realloc(s, cap *= 2);
      ck_assert_ptr_nonnull(s);
    }
  }
  fclose(f);
  s[n] = '\0';
  if (len) *len = n;
  return s;
}

/* Runs the export program with args (NULL-terminated), stdout to out, stderr to err (paths in
 * the test's directory); returns its exit status. */
static int run_export(const char *const *args, const char *out, const char *err) {
  const char *argv[32];
  size_t n = 0;
  argv[n++] = export_program();
  for (size_t i = 0; args[i]; i++) argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0) _exit(126);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status), "%s did not exit (signal %d)", argv[0], WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  ck_assert_msg(WEXITSTATUS(status) != 127, "cannot run %s (set EXPORT_PROGRAM)", argv[0]);
  return WEXITSTATUS(status);
}

/* run_export that must succeed; the failure message quotes the program's stderr. */
static void export_ok(const char *const *args, const char *out) {
  const char *err = tmp_path("stderr");
  int rc = run_export(args, out, err);
  if (rc != 0) {
    char *msg = slurp(err, NULL);
    ck_abort_msg("export exited %d: %s", rc, msg);
  }
}

/* ---- the trace and what it must hold ------------------------------------------------------- */

enum { D = 16, V = 24, HEADS = 3, DH = 4, NL = 7, NS = 3, NE = 1, MAXE = 8192 };

/* Layer names: '/' becomes '.' in the file; the odd one needs CSV quoting and JSON escapes. */
static const char *const names[NL] = {"blocks/0/fc", "h.10.fc", "h.2.fc", "wte", "ln_f", "attn",
                                      "odd, \"name\"\twith\nbreaks"};
static const char *const groups[NL] = {"blocks.0.fc", "h.10.fc", "h.2.fc", "wte", "ln_f", "attn",
                                       "odd, \"name\"\twith\nbreaks"};
/* The export's layer order: names, numbers compared as numbers. */
static const char *const group_order[NL] = {"attn", "blocks.0.fc", "h.2.fc", "h.10.fc", "ln_f",
                                            "odd, \"name\"\twith\nbreaks", "wte"};
static const char *const scalar_names[NS] = {"loss", "lr", "odd"};
static const char *const extra_names[NE] = {"act_rms"};
static const char *const metric_names[15] = {
    "forward", "dependency", "update", "forward_tight", "dependency_tight", "update_tight", "spread", "sigma",
    "sigma_rel_err", "sigma_update", "sigma_update_rel_err", "rel_update", "passes", "update_passes", "flags"};

/* Values that a decimal round trip could lose: signs of zero, subnormals, the extremes,
 * numbers that need all 17 digits, infinities and NaN. */
static double special(size_t i) {
  static const double v[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, DBL_MAX, -DBL_MAX, DBL_MIN,
                             4.9406564584124654e-324, -2.2250738585072009e-308, 0.1, 1.0 / 3.0,
                             1e-300, 123456789012345678.0, 1.0000000000000002, 5e-324 * 3, -1e308,
                             0.30000000000000004, 9007199254740993.0, 2.5};
  return v[i % (sizeof v / sizeof v[0])];
}

typedef struct {
  int64_t step;
  const char *layer, *kind, *metric; /* layer "" and kind "scalar" for run-level values */
  double v;
  int seen;
} entry;

typedef struct {
  entry e[MAXE];
  size_t n;
  int64_t steps[64];
  size_t rows;
} expected;

static void expect(expected *x, int64_t step, const char *layer, const char *kind, const char *metric, double v) {
  ck_assert_int_lt(x->n, MAXE);
  x->e[x->n++] = (entry){step, layer, kind, metric, v, 0};
}

typedef struct {
  float *w[NL], *b[NL];
  size_t len[NL], blen[NL];
  stab_monitor *m;
} model;

static void model_build(model *md, tu_rng *r) {
  memset(md, 0, sizeof *md);
  TU_ASSERT_OK(stab_monitor_create(NULL, &md->m));
  for (size_t i = 0; i < NL; i++) {
    stab_layer l = {.name = names[i]};
    switch (i) {
    case 0: l.kind = STAB_KIND_LINEAR, l.d_in = D, l.d_out = D, md->len[i] = D * D, md->blen[i] = D; break;
    case 1: l.kind = STAB_KIND_LINEAR, l.d_in = D, l.d_out = 2 * D, md->len[i] = 2 * D * D; break;
    case 2:
      l.kind = STAB_KIND_LINEAR, l.d_in = 2 * D, l.d_out = D, l.layout = STAB_LAYOUT_IN_MAJOR;
      md->len[i] = 2 * D * D;
      break;
    case 3: l.kind = STAB_KIND_EMBEDDING, l.vocab = V, l.width = D, md->len[i] = V * D; break;
    case 4: l.kind = STAB_KIND_GAIN, l.d_in = l.d_out = D, md->len[i] = D; break;
    case 5:
      l.kind = STAB_KIND_ATTENTION, l.d_in = D, l.d_out = HEADS * DH, l.heads = HEADS;
      md->len[i] = md->blen[i] = D * HEADS * DH;
      break;
    default: l.kind = STAB_KIND_BIAS, l.d_in = l.d_out = D, md->len[i] = D; break;
    }
    md->w[i] = tu_floats(md->len[i]);
    tu_fill_gauss(md->w[i], 1, md->len[i], md->len[i], 0.2, r);
    l.weight = md->w[i];
    if (md->blen[i]) {
      md->b[i] = tu_floats(md->blen[i]);
      tu_fill_gauss(md->b[i], 1, md->blen[i], md->blen[i], 0.2, r);
      if (l.kind == STAB_KIND_ATTENTION) l.weight_k = md->b[i];
      else l.bias = md->b[i];
    }
    TU_ASSERT_OK(stab_monitor_add_layer(md->m, &l, NULL), "layer %s", names[i]);
  }
}

static void model_free(model *md) {
  stab_monitor_free(md->m);
  for (size_t i = 0; i < NL; i++) free(md->w[i]), free(md->b[i]);
}

static stab_trace *open_trace(const char *path, const model *md, int flush_every) {
  stab_trace_params p = stab_trace_default_params();
  p.flush_every = flush_every;
  /* rows flushed by count alone: a sanitized export between two appends takes over the
   * default second, which flushed early (test_live_writer saw 5 rows where 3 were due) */
  p.flush_seconds = 0;
  p.scalars = scalar_names, p.n_scalars = NS;
  p.layer_extras = extra_names, p.n_layer_extras = NE;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(path, md->m, &p, &t));
  return t;
}

/* One optimizer-like step, a measurement, and a row appended; the row's values are recorded
 * in x as the monitor and this function handed them over. */
static void step_and_append(model *md, stab_trace *t, tu_rng *r, int64_t step, size_t k, expected *x) {
  TU_ASSERT_OK(stab_monitor_snapshot(md->m));
  for (size_t i = 0; i < NL; i++) {
    tu_add_relative_noise(md->w[i], 1, md->len[i], md->len[i], 0.01, r);
    if (md->b[i]) tu_add_relative_noise(md->b[i], 1, md->blen[i], md->blen[i], 0.01, r);
  }
  TU_ASSERT_OK(stab_monitor_measure(md->m, 1));
  double wall = k == 0 ? 0.0 : 0.001 * (double)k + 1.0 / 3.0;
  double scalars[NS] = {2.0 / (double)(k + 1), 1e-3 * (double)k, special(k)};
  double extras[NL * NE];
  for (size_t i = 0; i < NL; i++) extras[i] = special(k + 3 * i);
  TU_ASSERT_OK(stab_trace_append(t, step, wall, scalars, extras));
  x->steps[x->rows++] = step;
  expect(x, step, "", "scalar", "wall_time", wall);
  for (size_t s = 0; s < NS; s++) expect(x, step, "", "scalar", scalar_names[s], scalars[s]);
  for (size_t i = 0; i < NL; i++) {
    const stab_metrics *mt = stab_monitor_metrics(md->m, i);
    const stab_layer *l = stab_monitor_layer(md->m, i);
    const char *kind = stab_kind_name(l->kind);
    const double v[15] = {mt->forward, mt->dependency, mt->update, mt->forward_tight, mt->dependency_tight,
                          mt->update_tight, mt->spread, mt->sigma, mt->sigma_rel_err, mt->sigma_update,
                          mt->sigma_update_rel_err, mt->rel_update, mt->passes, mt->update_passes, mt->flags};
    for (size_t j = 0; j < 15; j++) expect(x, step, groups[i], kind, metric_names[j], v[j]);
    /* format 3's ratios, over the monitor's reference (check_trace checks them against the columns) */
    static const char *const ratio_names[3] = {"forward_ratio", "dependency_ratio", "update_ratio"};
    const stab_metrics *ref = stab_monitor_reference(md->m, i);
    const double rv[3] = {ref->forward, ref->dependency, ref->update};
    for (size_t j = 0; j < 3; j++) expect(x, step, groups[i], kind, ratio_names[j], isnan(v[j]) || isnan(rv[j]) ? NAN : v[j] / rv[j]);
    if (l->kind == STAB_KIND_ATTENTION) {
      static const char *const hb[HEADS] = {"head0_bound", "head1_bound", "head2_bound"};
      for (size_t h = 0; h < HEADS; h++) expect(x, step, groups[i], kind, hb[h], stab_monitor_head_bounds(md->m, i)[h]);
    }
    expect(x, step, groups[i], kind, extra_names[0], extras[i]);
  }
}

/* Steps are not 0..N-1: gaps, a negative one, and the int64 extremes. */
static int64_t step_number(size_t k, size_t rows) {
  if (k == 0) return INT64_MIN;
  if (k == rows - 1) return INT64_MAX;
  return k == 1 ? -7 : (int64_t)(10 * k + 3);
}

enum { ROWS = 12 };

static void write_trace(const char *path, expected *x) {
  tu_rng r;
  tu_rng_init(&r, 99);
  model md;
  model_build(&md, &r);
  stab_trace *t = open_trace(path, &md, 5); /* rows flushed in batches, the last at close */
  x->n = x->rows = 0;
  for (size_t k = 0; k < ROWS; k++) step_and_append(&md, t, &r, step_number(k, ROWS), k, x);
  TU_ASSERT_OK(stab_trace_close(t));
  model_free(&md);
}

/* ---- matching parsed values against what was written ---------------------------------------- */

static int same_bits(double a, double b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0; }

static void match(expected *x, int64_t step, const char *layer, const char *kind, const char *metric, double v,
                  const char *where) {
  for (size_t i = 0; i < x->n; i++) {
    entry *e = &x->e[i];
    if (e->step != step || strcmp(e->layer, layer) || strcmp(e->metric, metric)) continue;
    ck_assert_msg(!e->seen, "%s: step %lld layer '%s' metric %s exported twice", where, (long long)step, layer, metric);
    ck_assert_msg(!strcmp(e->kind, kind), "%s: layer '%s' has kind %s, expected %s", where, layer, kind, e->kind);
    ck_assert_msg(same_bits(e->v, v), "%s: step %lld layer '%s' %s = %.17g, written %.17g", where, (long long)step,
                  layer, metric, v, e->v);
    e->seen = 1;
    return;
  }
  ck_abort_msg("%s: step %lld layer '%s' metric '%s' was never written (or filtered out)", where, (long long)step,
               layer, metric);
}

/* Every entry that `keep` selects was seen, and nothing else; resets the marks. */
typedef int (*keep_fn)(const entry *e);
static int keep_all(const entry *e) { (void)e; return 1; }

static void all_seen(expected *x, keep_fn keep, const char *where) {
  for (size_t i = 0; i < x->n; i++) {
    entry *e = &x->e[i];
    ck_assert_msg(e->seen == keep(e), "%s: step %lld layer '%s' metric %s %s", where, (long long)e->step, e->layer,
                  e->metric, e->seen ? "exported though filtered out" : "missing from the export");
    e->seen = 0;
  }
}

/* ---- a strict CSV reader (RFC 4180) ---------------------------------------------------------- */

/* The next record's fields (at most max) from *p; returns their count, 0 at the end. A field is
 * copied into out[i] (cap bytes each), quotes removed. */
static size_t csv_record(const char **p, char out[][256], size_t max) {
  const char *s = *p;
  size_t n = 0;
  if (!*s) return 0;
  for (;;) {
    ck_assert_int_lt(n, max);
    char *o = out[n++];
    size_t k = 0;
    if (*s == '"') {
      s++;
      for (;;) {
        ck_assert_msg(*s, "CSV: a quoted field does not end");
        if (*s == '"' && s[1] == '"') o[k++] = '"', s += 2;
        else if (*s == '"') break;
        else o[k++] = *s++;
        ck_assert_int_lt(k, 255);
      }
      s++;
      ck_assert_msg(*s == ',' || *s == '\n', "CSV: text after a closing quote");
    } else {
      while (*s && *s != ',' && *s != '\n') {
        ck_assert_msg(*s != '"' && *s != '\r', "CSV: a quote or CR in an unquoted field");
        o[k++] = *s++;
        ck_assert_int_lt(k, 255);
      }
    }
    o[k] = '\0';
    if (*s == ',') {
      s++;
      continue;
    }
    ck_assert_msg(*s == '\n', "CSV: a record does not end with a line break");
    *p = s + 1;
    return n;
  }
}

static double parse_double(const char *s, const char *where) {
  char *end;
  double v = strtod(s, &end);
  ck_assert_msg(end != s && *end == '\0', "%s: '%s' is not a number", where, s);
  return v;
}

static int64_t parse_step(const char *s, const char *where) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  ck_assert_msg(end != s && *end == '\0' && errno == 0, "%s: step '%s' is not an int64", where, s);
  return v;
}

/* Parses a CSV export and matches every value; returns the data rows. fields_seen collects the
 * distinct layers of the first step in order (for the order check), if not NULL. */
static size_t check_csv(const char *path, expected *x, char (*layer_order)[256], size_t *n_order) {
  char *text = slurp(path, NULL);
  const char *p = text;
  char f[5][256];
  ck_assert_int_eq(csv_record(&p, f, 5), 5);
  static const char *const header[5] = {"step", "layer", "kind", "metric", "value"};
  for (size_t i = 0; i < 5; i++) ck_assert_str_eq(f[i], header[i]);
  size_t n, rows = 0, order = 0;
  int64_t first_step = 0;
  while ((n = csv_record(&p, f, 5)) > 0) {
    ck_assert_msg(n == 5, "CSV: a record of %zu fields", n);
    int64_t step = parse_step(f[0], "CSV");
    if (rows == 0) first_step = step;
    double v = parse_double(f[4], "CSV");
    if (isnan(v)) ck_assert_msg(!strcmp(f[4], "nan"), "CSV: NaN written '%s', not 'nan'", f[4]);
    match(x, step, f[1], f[2], f[3], v, "CSV");
    if (layer_order && step == first_step && f[1][0] && (order == 0 || strcmp(layer_order[order - 1], f[1])))
      snprintf(layer_order[order++], 256, "%s", f[1]);
    rows++;
  }
  if (n_order) *n_order = order;
  free(text);
  return rows;
}

/* ---- a strict JSON reader -------------------------------------------------------------------- */

typedef struct jv jv;
struct jv {
  enum { J_NULL, J_NUM, J_STR, J_OBJ, J_TRUE, J_FALSE } type;
  double num;
  int integral;   /* the number had no fraction or exponent */
  long long inum; /* its value then */
  char *str;
  char **keys;
  jv *vals;
  size_t n;
};

static void jv_free(jv *v) {
  free(v->str);
  for (size_t i = 0; i < v->n; i++) free(v->keys[i]), jv_free(&v->vals[i]);
  free(v->keys);
  free(v->vals);
}

static void skip_ws(const char **p) {
  while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++;
}

static char *j_string(const char **p) {
  const char *s = *p;
  ck_assert_msg(*s == '"', "JSON: a string expected at '%.20s'", s);
  s++;
  char *o = malloc(strlen(s) + 1);
  size_t k = 0;
  while (*s != '"') {
    unsigned char c = (unsigned char)*s;
    ck_assert_msg(c >= 0x20, "JSON: a raw control character 0x%02x in a string", c);
    if (c != '\\') {
      o[k++] = *s++;
      continue;
    }
    s++;
    switch (*s) {
    case '"': case '\\': case '/': o[k++] = *s; break;
    case 'b': o[k++] = '\b'; break;
    case 'f': o[k++] = '\f'; break;
    case 'n': o[k++] = '\n'; break;
    case 'r': o[k++] = '\r'; break;
    case 't': o[k++] = '\t'; break;
    case 'u': {
      unsigned u = 0;
      for (int i = 1; i <= 4; i++) {
        char h = s[i];
        ck_assert_msg(isxdigit((unsigned char)h), "JSON: a bad \\u escape");
        u = u * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
      }
      ck_assert_msg(u > 0 && u < 0x80, "JSON: \\u%04x outside the test's ASCII", u);
      o[k++] = (char)u;
      s += 4;
      break;
    }
    default: ck_abort_msg("JSON: a bad escape \\%c", *s);
    }
    s++;
  }
  o[k] = '\0';
  *p = s + 1;
  return o;
}

static void j_value(const char **p, jv *v);

static void j_number(const char **p, jv *v) {
  const char *s = *p, *start = s;
  if (*s == '-') s++;
  ck_assert_msg(isdigit((unsigned char)*s), "JSON: a value expected at '%.20s'", start);
  if (*s == '0') s++;
  else
    while (isdigit((unsigned char)*s)) s++;
  int integral = 1;
  if (*s == '.') {
    s++, integral = 0;
    ck_assert_msg(isdigit((unsigned char)*s), "JSON: no digit after '.'");
    while (isdigit((unsigned char)*s)) s++;
  }
  if (*s == 'e' || *s == 'E') {
    s++, integral = 0;
    if (*s == '+' || *s == '-') s++;
    ck_assert_msg(isdigit((unsigned char)*s), "JSON: no digit in an exponent");
    while (isdigit((unsigned char)*s)) s++;
  }
  char buf[64];
  ck_assert_int_lt(s - start, 63);
  snprintf(buf, sizeof buf, "%.*s", (int)(s - start), start);
  v->type = J_NUM;
  v->num = strtod(buf, NULL); /* 1e999 overflows to inf, as the export documents */
  v->integral = integral;
  if (integral) {
    errno = 0;
    v->inum = strtoll(buf, NULL, 10);
    ck_assert_msg(errno == 0, "JSON: integer %s out of int64", buf);
  }
  *p = s;
}

static void j_object(const char **p, jv *v) {
  const char *s = *p + 1;
  v->type = J_OBJ;
  skip_ws(&s);
  if (*s == '}') {
    *p = s + 1;
    return;
  }
  for (;;) {
    skip_ws(&s);
    v->keys = realloc(v->keys, (v->n + 1) * sizeof *v->keys);
    v->vals = realloc(v->vals, (v->n + 1) * sizeof *v->vals);
    v->keys[v->n] = j_string(&s);
    for (size_t i = 0; i < v->n; i++) ck_assert_msg(strcmp(v->keys[i], v->keys[v->n]), "JSON: key '%s' twice", v->keys[i]);
    memset(&v->vals[v->n], 0, sizeof v->vals[0]);
    v->n++;
    skip_ws(&s);
    ck_assert_msg(*s == ':', "JSON: ':' expected");
    s++;
    j_value(&s, &v->vals[v->n - 1]);
    skip_ws(&s);
    if (*s == ',') {
      s++;
      continue;
    }
    ck_assert_msg(*s == '}', "JSON: ',' or '}' expected at '%.20s'", s);
    *p = s + 1;
    return;
  }
}

static void j_value(const char **p, jv *v) {
  skip_ws(p);
  memset(v, 0, sizeof *v);
  const char *s = *p;
  if (*s == '{') j_object(p, v);
  else if (*s == '"') v->type = J_STR, v->str = j_string(p);
  else if (!strncmp(s, "null", 4)) v->type = J_NULL, *p += 4;
  else if (!strncmp(s, "true", 4)) v->type = J_TRUE, *p += 4;
  else if (!strncmp(s, "false", 5)) v->type = J_FALSE, *p += 5;
  else j_number(p, v); /* NaN, Infinity and arrays are refused here */
}

static const jv *j_get(const jv *o, const char *key) {
  for (size_t i = 0; i < o->n; i++)
    if (!strcmp(o->keys[i], key)) return &o->vals[i];
  return NULL;
}

static double j_double(const jv *v, const char *what) {
  ck_assert_msg(v->type == J_NUM || v->type == J_NULL, "JSON: %s is not a number or null", what);
  return v->type == J_NULL ? NAN : v->num;
}

/* Parses a JSON-lines export and matches every value; returns the lines. */
static size_t check_jsonl(const char *path, expected *x, int want_wall) {
  char *text = slurp(path, NULL), *save = NULL;
  size_t lines = 0;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    const char *p = line;
    jv o;
    j_value(&p, &o);
    skip_ws(&p);
    ck_assert_msg(*p == '\0' && o.type == J_OBJ, "JSONL: line %zu is not one object", lines + 1);
    const jv *step = j_get(&o, "step"), *wall = j_get(&o, "wall_time"), *sc = j_get(&o, "scalars"),
             *ly = j_get(&o, "layers");
    ck_assert_msg(step && step->type == J_NUM && step->integral, "JSONL: no integer step");
    ck_assert_msg(sc && sc->type == J_OBJ && ly && ly->type == J_OBJ, "JSONL: no scalars or layers object");
    ck_assert_int_eq(o.n, 3 + (wall != NULL));
    ck_assert_int_eq(wall != NULL, want_wall);
    int64_t s = step->inum;
    if (wall) match(x, s, "", "scalar", "wall_time", j_double(wall, "wall_time"), "JSONL");
    for (size_t i = 0; i < sc->n; i++) match(x, s, "", "scalar", sc->keys[i], j_double(&sc->vals[i], "a scalar"), "JSONL");
    for (size_t l = 0; l < ly->n; l++) {
      const jv *layer = &ly->vals[l], *kind = j_get(layer, "kind");
      ck_assert_msg(layer->type == J_OBJ && kind && kind->type == J_STR, "JSONL: layer '%s' has no kind", ly->keys[l]);
      for (size_t k = 0; k < layer->n; k++)
        if (strcmp(layer->keys[k], "kind"))
          match(x, s, ly->keys[l], kind->str, layer->keys[k], j_double(&layer->vals[k], layer->keys[k]), "JSONL");
    }
    jv_free(&o);
    lines++;
  }
  free(text);
  return lines;
}

/* ---- the wide form ---------------------------------------------------------------------------- */

/* A wide column's name for an entry: the scalar's own, or LAYER.METRIC. */
static void wide_name(const entry *e, char *buf, size_t n) {
  if (e->layer[0]) snprintf(buf, n, "%s.%s", e->layer, e->metric);
  else snprintf(buf, n, "%s", e->metric);
}

/* Matches the value of the wide column `name` at `step` against what was written. */
static void match_wide(expected *x, int64_t step, const char *name, double v, const char *where) {
  char buf[600];
  for (size_t i = 0; i < x->n; i++) {
    entry *e = &x->e[i];
    if (e->step != step) continue;
    wide_name(e, buf, sizeof buf);
    if (strcmp(buf, name)) continue;
    ck_assert_msg(!e->seen, "%s: step %lld column '%s' twice", where, (long long)step, name);
    ck_assert_msg(same_bits(e->v, v), "%s: step %lld column '%s' = %.17g, written %.17g", where, (long long)step,
                  name, v, e->v);
    e->seen = 1;
    return;
  }
  ck_abort_msg("%s: step %lld column '%s' was never written (or filtered out)", where, (long long)step, name);
}

enum { WIDE_MAX = 256 };
static char wide_fields[WIDE_MAX][256];
static char wide_header_copy[WIDE_MAX][256];

/* Parses a wide CSV export: the header (into wide_header_copy, *n_cols names after "step"),
 * then every row, each value matched. Returns the rows. */
static size_t check_wide_csv(const char *path, expected *x, size_t *n_cols) {
  char *text = slurp(path, NULL);
  const char *p = text;
  size_t n = csv_record(&p, wide_header_copy, WIDE_MAX), rows = 0, k;
  ck_assert_msg(n >= 1 && !strcmp(wide_header_copy[0], "step"), "wide CSV: the header does not start with step");
  while ((k = csv_record(&p, wide_fields, WIDE_MAX)) > 0) {
    ck_assert_msg(k == n, "wide CSV: row %zu has %zu fields, the header %zu", rows + 1, k, n);
    int64_t step = parse_step(wide_fields[0], "wide CSV");
    for (size_t c = 1; c < n; c++) {
      double v = parse_double(wide_fields[c], "wide CSV");
      if (isnan(v)) ck_assert_msg(!strcmp(wide_fields[c], "nan"), "wide CSV: NaN written '%s'", wide_fields[c]);
      match_wide(x, step, wide_header_copy[c], v, "wide CSV");
    }
    rows++;
  }
  free(text);
  *n_cols = n - 1;
  return rows;
}

/* Parses a wide JSON-lines export: flat objects, "step" then one key per column in the CSV's
 * order (wide_header_copy, when n_cols > 0). Returns the lines. */
static size_t check_wide_jsonl(const char *path, expected *x, size_t n_cols) {
  char *text = slurp(path, NULL), *save = NULL;
  size_t lines = 0;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    const char *p = line;
    jv o;
    j_value(&p, &o);
    skip_ws(&p);
    ck_assert_msg(*p == '\0' && o.type == J_OBJ && o.n >= 1, "wide JSONL: line %zu is not one object", lines + 1);
    ck_assert_msg(!strcmp(o.keys[0], "step") && o.vals[0].type == J_NUM && o.vals[0].integral,
                  "wide JSONL: the first key is not an integer step");
    if (n_cols) ck_assert_int_eq(o.n, n_cols + 1);
    for (size_t i = 1; i < o.n; i++) {
      ck_assert_msg(o.vals[i].type != J_OBJ, "wide JSONL: '%s' is nested", o.keys[i]);
      if (n_cols) ck_assert_str_eq(o.keys[i], wide_header_copy[i]);
      match_wide(x, o.vals[0].inum, o.keys[i], j_double(&o.vals[i], o.keys[i]), "wide JSONL");
    }
    jv_free(&o);
    lines++;
  }
  free(text);
  return lines;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static expected want; /* large: static */

START_TEST(test_round_trip) {
  make_tmpdir();
  const char *trace = tmp_path("t.h5"), *csv = tmp_path("t.csv"), *jsonl = tmp_path("t.jsonl");
  write_trace(trace, &want);
  /* every special value is among those written, in a scalar and in an extra */
  size_t specials = 0;
  for (size_t i = 0; i < want.n; i++) specials += same_bits(want.e[i].v, -0.0) || same_bits(want.e[i].v, 4.9406564584124654e-324);
  ck_assert_int_ge(specials, 4);

  const char *a1[] = {"-o", csv, trace, NULL};
  export_ok(a1, tmp_path("out"));
  char order[NL][256];
  size_t n_order = 0;
  size_t per_row = 1 + NS + NL * (15 + 3 + NE) + HEADS;
  ck_assert_int_eq(check_csv(csv, &want, order, &n_order), ROWS * per_row);
  all_seen(&want, keep_all, "CSV");
  ck_assert_int_eq(n_order, NL);
  for (size_t i = 0; i < NL; i++) ck_assert_str_eq(order[i], group_order[i]);

  const char *a2[] = {"--format", "jsonl", trace, NULL};
  export_ok(a2, jsonl);
  ck_assert_int_eq(check_jsonl(jsonl, &want, 1), ROWS);
  all_seen(&want, keep_all, "JSONL");

  /* a layer's metrics come in the writer's order: forward, dependency, update first */
  char *text = slurp(csv, NULL);
  const char *fwd = strstr(text, ",blocks.0.fc,linear,forward,"), *dep = strstr(text, ",blocks.0.fc,linear,dependency,"),
             *upd = strstr(text, ",blocks.0.fc,linear,update,"), *ft = strstr(text, ",blocks.0.fc,linear,forward_tight,");
  ck_assert_msg(fwd && dep && upd && ft && fwd < dep && dep < upd && upd < ft, "metric order");
  free(text);
  remove_tmpdir();
}
END_TEST

/* The filters, against the same selection made here on what was written. */
static int keep_filtered(const entry *e) {
  if (e->step < -7 || e->step > 63) return 0; /* --steps -7:63 */
  if (strcmp(e->metric, "forward") && strcmp(e->metric, "update") && strcmp(e->metric, "loss")) return 0;
  return !e->layer[0] || !fnmatch("h.*", e->layer, 0) || !strcmp(e->layer, "attn");
}

static int keep_one_step(const entry *e) { return e->step == 23 && (!e->layer[0] || !strcmp(e->layer, "wte")); }

static int keep_open_range(const entry *e) { return e->step >= 53; }

START_TEST(test_filters) {
  make_tmpdir();
  const char *trace = tmp_path("t.h5"), *out = tmp_path("out");
  write_trace(trace, &want);
  const char *a1[] = {"--layers", "h.*", "--layers", "attn", "--metrics", "forward,update,loss", "--steps", "-7:63", trace, NULL};
  export_ok(a1, out);
  check_csv(out, &want, NULL, NULL);
  all_seen(&want, keep_filtered, "CSV filtered");
  const char *a2[] = {"--format", "jsonl", "--layers", "h.*", "--layers", "attn", "--metrics", "forward,update,loss",
                      "--steps", "-7:63", trace, NULL};
  export_ok(a2, out);
  ck_assert_int_eq(check_jsonl(out, &want, 0), 6); /* steps -7, 23, 33, 43, 53, 63 */
  all_seen(&want, keep_filtered, "JSONL filtered");
  /* a layer none of whose datasets is asked for is left out of JSON lines, not listed empty */
  char *text = slurp(out, NULL);
  ck_assert_ptr_null(strstr(text, "\"wte\""));
  free(text);

  const char *a3[] = {"--steps", "23", "--layers", "wte", trace, NULL};
  export_ok(a3, out);
  check_csv(out, &want, NULL, NULL);
  all_seen(&want, keep_one_step, "--steps 23");
  const char *a4[] = {"--format", "jsonl", "--steps", "53:", trace, NULL};
  export_ok(a4, out);
  ck_assert_int_eq(check_jsonl(out, &want, 1), 7); /* 53, 63, ..., 103, INT64_MAX */
  all_seen(&want, keep_open_range, "--steps 53:");
  /* steps that select nothing: the header alone */
  const char *a5[] = {"--steps", "24:32", trace, NULL};
  export_ok(a5, out);
  text = slurp(out, NULL);
  ck_assert_str_eq(text, "step,layer,kind,metric,value\n");
  free(text);
  remove_tmpdir();
}
END_TEST

static int keep_wte_from_53(const entry *e) { return e->step >= 53 && (!e->layer[0] || !strcmp(e->layer, "wte")); }

/* --wide: every value, bit for bit, under the column LAYER.METRIC (or the scalar's name), in
 * the long form's order; with the filters and -o; as JSON lines, the same keys flat. */
START_TEST(test_wide) {
  make_tmpdir();
  const char *trace = tmp_path("t.h5"), *out = tmp_path("out"), *csv = tmp_path("wide.csv");
  write_trace(trace, &want);
  const char *a1[] = {"--wide", "-o", csv, trace, NULL};
  export_ok(a1, out);
  size_t n_cols = 0;
  ck_assert_int_eq(check_wide_csv(csv, &want, &n_cols), ROWS);
  all_seen(&want, keep_all, "wide CSV");
  ck_assert_int_eq(n_cols, 1 + NS + NL * (15 + 3 + NE) + HEADS);
  ck_assert_str_eq(wide_header_copy[1], "wall_time");
  ck_assert_str_eq(wide_header_copy[2], "loss");

  /* the columns come in the order of the long form's rows of one step */
  const char *a2[] = {trace, NULL};
  export_ok(a2, out);
  char *text = slurp(out, NULL);
  const char *p = text;
  char f[5][256], name[600];
  csv_record(&p, f, 5);
  size_t col = 1;
  int64_t first = INT64_MIN;
  while (csv_record(&p, f, 5) == 5 && parse_step(f[0], "CSV") == first) {
    if (f[1][0]) snprintf(name, sizeof name, "%s.%s", f[1], f[3]);
    else snprintf(name, sizeof name, "%s", f[3]);
    ck_assert_msg(col <= n_cols && !strcmp(name, wide_header_copy[col]), "wide column %zu is '%s', the long form's '%s'",
                  col, col <= n_cols ? wide_header_copy[col] : "(none)", name);
    col++;
  }
  ck_assert_int_eq(col, n_cols + 1);
  free(text);

  const char *a3[] = {"--wide", "--format", "jsonl", trace, NULL};
  export_ok(a3, out);
  ck_assert_int_eq(check_wide_jsonl(out, &want, n_cols), ROWS);
  all_seen(&want, keep_all, "wide JSONL");

  /* the filters select columns (--layers, --metrics) and rows (--steps) */
  const char *a4[] = {"--wide", "--layers", "h.*", "--layers", "attn", "--metrics", "forward,update,loss",
                      "--steps", "-7:63", "-o", csv, trace, NULL};
  export_ok(a4, out);
  ck_assert_int_eq(check_wide_csv(csv, &want, &n_cols), 6);
  all_seen(&want, keep_filtered, "wide CSV filtered");
  ck_assert_int_eq(n_cols, 1 + 3 * 2); /* loss; attn, h.2.fc, h.10.fc x forward, update */
  ck_assert_str_eq(wide_header_copy[1], "loss");
  ck_assert_str_eq(wide_header_copy[2], "attn.forward");
  ck_assert_str_eq(wide_header_copy[3], "attn.update");
  ck_assert_str_eq(wide_header_copy[4], "h.2.fc.forward");
  ck_assert_str_eq(wide_header_copy[7], "h.10.fc.update");
  const char *a5[] = {"--wide", "--format", "jsonl", "--steps", "53:", "--layers", "wte", trace, NULL};
  export_ok(a5, out);
  ck_assert_int_eq(check_wide_jsonl(out, &want, 0), 7);
  all_seen(&want, keep_wte_from_53, "wide JSONL --steps 53: --layers wte");
  /* steps that select nothing: the header alone */
  const char *a6[] = {"--wide", "--metrics", "loss", "--steps", "24:32", trace, NULL};
  export_ok(a6, out);
  text = slurp(out, NULL);
  ck_assert_str_eq(text, "step,loss\n");
  free(text);
  /* a filter that matches nothing is an error, as in long form */
  const char *a7[] = {"--wide", "--layers", "nope*", trace, NULL};
  const char *err = tmp_path("err");
  ck_assert_int_eq(run_export(a7, out, err), 2);
  remove_tmpdir();
}
END_TEST

/* Two columns of one name would make readers keep one silently: refused, naming it, with
 * nothing written. */
START_TEST(test_wide_collision) {
  make_tmpdir();
  const char *trace = tmp_path("c.h5"), *out = tmp_path("out"), *err = tmp_path("err"), *csv = tmp_path("c.csv");
  float g[4] = {1, 1, 1, 1};
  stab_monitor *m = NULL;
  TU_ASSERT_OK(stab_monitor_create(NULL, &m));
  stab_layer l = {.name = "wte", .kind = STAB_KIND_GAIN, .d_in = 4, .d_out = 4, .weight = g};
  TU_ASSERT_OK(stab_monitor_add_layer(m, &l, NULL));
  static const char *const scalars[] = {"wte.forward"};
  stab_trace_params p = stab_trace_default_params();
  p.scalars = scalars, p.n_scalars = 1;
  stab_trace *t = NULL;
  TU_ASSERT_OK(stab_trace_open(trace, m, &p, &t));
  TU_ASSERT_OK(stab_monitor_measure(m, 0));
  const double v[1] = {0.5};
  TU_ASSERT_OK(stab_trace_append(t, 1, 0.0, v, NULL));
  TU_ASSERT_OK(stab_trace_close(t));
  stab_monitor_free(m);
  const char *args[] = {"--wide", "-o", csv, trace, NULL};
  int rc = run_export(args, out, err);
  char *msg = slurp(err, NULL);
  ck_assert_msg(rc == 2 && strstr(msg, "'wte.forward'") && strstr(msg, "stabmeter-export: ") == msg,
                "exit %d, expected 2 naming the column: %s", rc, msg);
  free(msg);
  struct stat sb;
  ck_assert_msg(stat(csv, &sb) != 0, "%s was written", csv);
  /* the long form has no such trouble */
  const char *long_args[] = {"-o", csv, trace, NULL};
  export_ok(long_args, out);
  remove_tmpdir();
}
END_TEST

/* Read while the writer has the trace open: every flushed row, nothing staged. */
START_TEST(test_live_writer) {
  make_tmpdir();
  const char *trace = tmp_path("live.h5"), *out = tmp_path("out");
  tu_rng r;
  tu_rng_init(&r, 5);
  model md;
  model_build(&md, &r);
  stab_trace *t = open_trace(trace, &md, 3);
  want.n = want.rows = 0;
  const char *args[] = {"--format", "jsonl", trace, NULL};
  size_t expect_lines[] = {0, 0, 0, 3, 3, 3, 6};
  for (size_t k = 0; k <= 6; k++) {
    if (k) step_and_append(&md, t, &r, (int64_t)k, k, &want);
    export_ok(args, out);
    size_t n = check_jsonl(out, &want, 1);
    ck_assert_msg(n == expect_lines[k], "after %zu appends (flush every 3): %zu rows exported, %zu flushed", k, n,
                  expect_lines[k]);
    for (size_t i = 0; i < want.n; i++) want.e[i].seen = 0;
  }
  TU_ASSERT_OK(stab_trace_close(t));
  model_free(&md);
  remove_tmpdir();
}
END_TEST

/* ---- damaged traces ---------------------------------------------------------------------------- */

typedef enum {
  DAMAGE_NO_STEP, DAMAGE_STEP_FLOAT, DAMAGE_FORMAT, DAMAGE_NO_FORMAT, DAMAGE_VERSION, DAMAGE_SHORT_DATASET,
  DAMAGE_SHORT_WALL, DAMAGE_NO_FORWARD, DAMAGE_NO_KIND, DAMAGE_2D, DAMAGE_NO_LAYERS, DAMAGE_STRING_DATASET,
  DAMAGE_HUGE_EXTENT, N_DAMAGE
} damage;

static const struct {
  const char *what;    /* for messages */
  const char *mention; /* the message must name this */
} damages[N_DAMAGE] = {
    {"/step deleted", "/step"},
    {"/step float64", "/step"},
    {"format = \"other-trace\"", "format"},
    {"no format attribute", "format"},
    {"format_version 5", "format_version"},
    {"a layer dataset shorter than /step", "/layers/update"},
    {"/wall_time shorter than /step", "/wall_time"},
    {"no forward", "/layers/forward"},
    {"no kind of the layers", "/layers/kind"},
    {"a two-dimensional scalar", "/scalars/lr"},
    {"no /layers", "/layers"},
    {"a string dataset", "/layers/head_bound"},
    {"every dataset 2^40 rows long (unwritten rows read as the fill value)", "/step has 1099511627776 rows"},
};

/* H5Ovisit callback: every dataset extendable along the steps extended to *(hsize_t *)rows. */
static herr_t extend_dataset(hid_t f, const char *name, const H5O_info_t *info, void *rows) {
  if (info->type != H5O_TYPE_DATASET) return 0;
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT), s = H5Dget_space(d);
  ck_assert_int_ge(d, 0);
  hsize_t dims[2], max[2];
  H5Sget_simple_extent_dims(s, dims, max);
  H5Sclose(s);
  dims[0] = *(hsize_t *)rows;
  if (max[0] == H5S_UNLIMITED) ck_assert_int_ge(H5Dset_extent(d, dims), 0);
  H5Dclose(d);
  return 0;
}

static void put_string_attr(hid_t obj, const char *name, const char *value) {
  if (H5Aexists(obj, name) > 0) ck_assert_int_ge(H5Adelete(obj, name), 0);
  hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
  H5Tset_size(type, strlen(value) + 1);
  hid_t a = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert_int_ge(a, 0);
  ck_assert_int_ge(H5Awrite(a, type, value), 0);
  H5Aclose(a), H5Sclose(space), H5Tclose(type);
}

static void replace_dataset(hid_t f, const char *path, hid_t type, int rank) {
  ck_assert_int_ge(H5Ldelete(f, path, H5P_DEFAULT), 0);
  hsize_t dims[2] = {ROWS, 2};
  hid_t space = H5Screate_simple(rank, dims, NULL), d = H5Dcreate2(f, path, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ck_assert_int_ge(d, 0);
  H5Dclose(d), H5Sclose(space);
}

static void shorten(hid_t f, const char *path, hsize_t rows) {
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT), s = H5Dget_space(d);
  ck_assert_int_ge(d, 0);
  hsize_t dims[2];
  H5Sget_simple_extent_dims(s, dims, NULL);
  H5Sclose(s);
  dims[0] = rows;
  ck_assert_int_ge(H5Dset_extent(d, dims), 0);
  H5Dclose(d);
}

static void apply_damage(const char *path, damage k) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  switch (k) {
  case DAMAGE_NO_STEP: ck_assert_int_ge(H5Ldelete(f, "step", H5P_DEFAULT), 0); break;
  case DAMAGE_STEP_FLOAT: replace_dataset(f, "step", H5T_IEEE_F64LE, 1); break;
  case DAMAGE_FORMAT: put_string_attr(f, "format", "other-trace"); break;
  case DAMAGE_NO_FORMAT: ck_assert_int_ge(H5Adelete(f, "format"), 0); break;
  case DAMAGE_VERSION: {
    int64_t v = 5; /* versions 1 to 4 read */
    hid_t a = H5Aopen(f, "format_version", H5P_DEFAULT);
    ck_assert_int_ge(H5Awrite(a, H5T_NATIVE_INT64, &v), 0);
    H5Aclose(a);
    break;
  }
  case DAMAGE_SHORT_DATASET: shorten(f, "layers/update", ROWS - 1); break;
  case DAMAGE_SHORT_WALL: shorten(f, "wall_time", 3); break;
  case DAMAGE_NO_FORWARD: ck_assert_int_ge(H5Ldelete(f, "layers/forward", H5P_DEFAULT), 0); break;
  case DAMAGE_NO_KIND: ck_assert_int_ge(H5Ldelete(f, "layers/kind", H5P_DEFAULT), 0); break;
  case DAMAGE_2D: replace_dataset(f, "scalars/lr", H5T_IEEE_F64LE, 2); break;
  case DAMAGE_NO_LAYERS: ck_assert_int_ge(H5Ldelete(f, "layers", H5P_DEFAULT), 0); break;
  case DAMAGE_STRING_DATASET: {
    hid_t s = H5Tcopy(H5T_C_S1);
    H5Tset_size(s, 8);
    replace_dataset(f, "layers/head_bound", s, 2);
    H5Tclose(s);
    break;
  }
  case DAMAGE_HUGE_EXTENT: { /* before the fix: exported without end */
    hsize_t rows = (hsize_t)1 << 40;
    ck_assert_int_ge(H5Ovisit(f, H5_INDEX_NAME, H5_ITER_INC, extend_dataset, &rows), 0);
    break;
  }
  case N_DAMAGE: break;
  }
  ck_assert_int_ge(H5Fclose(f), 0);
}

START_TEST(test_damaged) {
  make_tmpdir();
  const char *trace = tmp_path("bad.h5"), *out = tmp_path("out"), *err = tmp_path("err");
  write_trace(trace, &want);
  apply_damage(trace, (damage)_i);
  { /* both formats share the reading: each damage is tried with one, in turn */
    const char *args[] = {"--format", _i % 2 ? "jsonl" : "csv", trace, NULL};
    int rc = run_export(args, out, err);
    char *msg = slurp(err, NULL), *o = slurp(out, NULL);
    ck_assert_msg(rc == 2, "%s: exit %d, expected 2 (stderr: %s)", damages[_i].what, rc, msg);
    ck_assert_msg(strstr(msg, trace) && strstr(msg, damages[_i].mention),
                  "%s: the message does not name the file and %s: %s", damages[_i].what, damages[_i].mention, msg);
    ck_assert_msg(strchr(msg, '\n') == msg + strlen(msg) - 1,
                  "%s: not one line of message (HDF5 printing its stack?): %s", damages[_i].what, msg);
    ck_assert_msg(o[0] == '\0', "%s: something was written to stdout", damages[_i].what);
    free(msg), free(o);
  }
  remove_tmpdir();
}
END_TEST

/* A writer killed in the middle of a flush leaves datasets longer than /step: they are read to
 * the length of /step, the rows every dataset has. */
START_TEST(test_longer_than_step) {
  make_tmpdir();
  const char *trace = tmp_path("t.h5"), *out = tmp_path("out");
  write_trace(trace, &want);
  hid_t f = H5Fopen(trace, H5F_ACC_RDWR, H5P_DEFAULT);
  ck_assert_int_ge(f, 0);
  shorten(f, "step", ROWS - 2);
  H5Fclose(f);
  const char *args[] = {"--format", "jsonl", trace, NULL};
  export_ok(args, out);
  ck_assert_int_eq(check_jsonl(out, &want, 1), ROWS - 2);
  remove_tmpdir();
}
END_TEST

START_TEST(test_bad_usage) {
  make_tmpdir();
  const char *trace = tmp_path("t.h5"), *out = tmp_path("out"), *err = tmp_path("err"), *text = tmp_path("text.h5");
  write_trace(trace, &want);
  FILE *tf = fopen(text, "w");
  ck_assert_ptr_nonnull(tf);
  fputs("step,layer\n1,x\n", tf);
  fclose(tf);
  /* try: a usage mistake, so the message is followed by the line pointing at --help */
  static const struct {
    const char *args[6];
    int rc, try;
    const char *mention;
  } cases[] = {
      {{"--format", "xml", "T", NULL}, 2, 1, "--format: bad value 'xml'"},
      {{"--steps", "5:1", "T", NULL}, 2, 1, "--steps: bad value '5:1'"},
      {{"--steps", "x:", "T", NULL}, 2, 1, "--steps: bad value 'x:'"},
      {{"--metrics", "forward,,update", "T", NULL}, 2, 1, "--metrics: bad value 'forward,,update'"},
      {{"--metrics", "forwardd", "T", NULL}, 2, 0, "forwardd"},
      {{"--layers", "nope*", "T", NULL}, 2, 0, "nope*"},
      {{"--bogus", "T", NULL}, 2, 1, "unknown option '--bogus'"},
      {{"--wide=yes", "T", NULL}, 2, 1, "'--wide' takes no value"},
      {{NULL}, 2, 1, "no trace"},
      {{"T", "T", NULL}, 2, 1, "more than one"},
      {{"NOFILE", NULL}, 2, 0, "NOFILE"},
      {{"TEXT", NULL}, 2, 0, "not an HDF5 file"},
      {{"-o", "NODIR", "T", NULL}, 1, 0, "NODIR"},
  };
  char nofile[128], nodir[128];
  snprintf(nofile, sizeof nofile, "%s/missing.h5", tmpdir);
  snprintf(nodir, sizeof nodir, "%s/no/such/dir/out.csv", tmpdir);
  static const char try_line[] = "Try 'stabmeter-export --help' for more information.\n";
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *args[6];
    const char *mention = cases[c].mention;
    for (size_t i = 0; i < 6; i++) {
      const char *a = cases[c].args[i];
      args[i] = !a ? NULL : !strcmp(a, "T") ? trace : !strcmp(a, "NOFILE") ? nofile : !strcmp(a, "TEXT") ? text
                          : !strcmp(a, "NODIR") ? nodir : a;
      if (!a) break;
    }
    if (!strcmp(mention, "NOFILE")) mention = nofile;
    if (!strcmp(mention, "NODIR")) mention = nodir;
    int rc = run_export(args, out, err);
    char *msg = slurp(err, NULL);
    ck_assert_msg(rc == cases[c].rc, "case %zu: exit %d, expected %d (%s)", c, rc, cases[c].rc, msg);
    ck_assert_msg(strstr(msg, mention), "case %zu: the message does not say '%s': %s", c, mention, msg);
    ck_assert_msg(!strncmp(msg, "stabmeter-export: ", 18), "case %zu: the message does not start with the program's name: %s", c, msg);
    /* one line (HDF5 prints none of its own; no usage dump), then the Try line for a usage mistake */
    size_t len = strlen(msg), tl = strlen(try_line);
    int has_try = len > tl && !strcmp(msg + len - tl, try_line);
    ck_assert_msg(has_try == cases[c].try, "case %zu: %s the line pointing at --help: %s", c,
                  cases[c].try ? "no" : "unexpected", msg);
    if (has_try) msg[len - tl] = '\0';
    ck_assert_msg(strchr(msg, '\n') == msg + strlen(msg) - 1, "case %zu: not one line: %s", c, msg);
    free(msg);
  }
  const char *help[] = {"--help", NULL}, *version[] = {"--version", NULL};
  export_ok(help, out);
  char *o = slurp(out, NULL);
  ck_assert_ptr_nonnull(strstr(o, "Usage: stabmeter-export "));
  ck_assert_ptr_nonnull(strstr(o, "--wide"));
  free(o);
  export_ok(version, out);
  o = slurp(out, NULL);
  ck_assert_ptr_nonnull(strstr(o, stab_version()));
  free(o);
  remove_tmpdir();
}
END_TEST

/* Before the fix the output was opened with fopen(out, "w") after the trace: -o TRACE cut the
 * trace to 0 bytes, then export hung in HDF5's read retries. */
START_TEST(test_output_is_input) {
  make_tmpdir();
  char trace[256], sym[256], hard[256], other[256];
  snprintf(trace, sizeof trace, "%s", tmp_path("t.h5"));
  snprintf(sym, sizeof sym, "%s", tmp_path("sym.h5"));
  snprintf(hard, sizeof hard, "%s", tmp_path("hard.h5"));
  snprintf(other, sizeof other, "%s", tmp_path("other.csv"));
  const char *out = tmp_path("stdout"), *err = tmp_path("stderr");
  write_trace(trace, &want);
  ck_assert_int_eq(symlink(trace, sym), 0);
  ck_assert_int_eq(link(trace, hard), 0);
  size_t len0;
  char *before = slurp(trace, &len0);
  const char *cases[][2] = {{trace, trace}, {trace, sym}, {trace, hard}, {sym, trace}, {hard, sym}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const char *args[] = {"-o", cases[c][1], cases[c][0], NULL};
    int rc = run_export(args, out, err);
    char *msg = slurp(err, NULL);
    ck_assert_msg(rc == 2, "export %s -o %s: exit %d, expected 2 (%s)", cases[c][0], cases[c][1], rc, msg);
    ck_assert_msg(strstr(msg, cases[c][1]) && strstr(msg, "is the trace being exported"),
                  "export %s -o %s: the message does not say why: %s", cases[c][0], cases[c][1], msg);
    free(msg);
    size_t len;
    char *after = slurp(trace, &len);
    ck_assert_msg(len == len0 && !memcmp(before, after, len), "export %s -o %s changed the trace", cases[c][0],
                  cases[c][1]);
    free(after);
  }
  free(before);
  /* an output that is another file is replaced, keeping its permissions */
  FILE *f = fopen(other, "w");
  ck_assert_ptr_nonnull(f);
  fputs("old contents\n", f);
  fclose(f);
  ck_assert_int_eq(chmod(other, 0640), 0);
  const char *args[] = {"--format", "jsonl", "-o", other, sym, NULL};
  export_ok(args, out);
  ck_assert_int_eq(check_jsonl(other, &want, 1), ROWS);
  struct stat sb;
  ck_assert_int_eq(stat(other, &sb), 0);
  ck_assert_int_eq(sb.st_mode & 07777, 0640);
  remove_tmpdir();
}
END_TEST

/* An output that is not a regular file is written in place, and a failed write never removes
 * it: before the fix, export -o LINK with LINK -> /dev/full removed LINK (and, as root,
 * export -o /dev/full would have removed the device). */
START_TEST(test_output_not_removed) {
  make_tmpdir();
  char trace[256], full[256];
  snprintf(trace, sizeof trace, "%s", tmp_path("t.h5"));
  snprintf(full, sizeof full, "%s", tmp_path("full"));
  const char *out = tmp_path("stdout"), *err = tmp_path("stderr");
  write_trace(trace, &want);
  ck_assert_int_eq(symlink("/dev/full", full), 0);
  const char *args[] = {"-o", full, trace, NULL};
  int rc = run_export(args, out, err);
  char *msg = slurp(err, NULL);
  ck_assert_msg(rc == 1 && strstr(msg, full), "export -o %s: exit %d, expected 1 naming it (%s)", full, rc, msg);
  free(msg);
  struct stat sb;
  ck_assert_msg(lstat(full, &sb) == 0 && S_ISLNK(sb.st_mode), "export removed %s, which it did not create", full);
  remove_tmpdir();
}
END_TEST

static Suite *export_suite(void) {
  Suite *s = suite_create("export");
  TCase *tc = tcase_create("values");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_filters);
  tcase_add_test(tc, test_wide);
  tcase_add_test(tc, test_wide_collision);
  tcase_add_test(tc, test_live_writer);
  tcase_add_test(tc, test_longer_than_step);
  suite_add_tcase(s, tc);
  tc = tcase_create("bad input");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_damaged, 0, N_DAMAGE);
  tcase_add_test(tc, test_bad_usage);
  tcase_add_test(tc, test_output_is_input);
  tcase_add_test(tc, test_output_not_removed);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(export_suite());
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
