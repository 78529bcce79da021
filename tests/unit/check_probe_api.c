/* check_probe_api.c — the probe as a library (stab_probe_*) on the checkpoints tests/support/st_gen and
 * tests/support/gguf_convert write: rows and kinds and, in exact mode, forward, dependency and update
 * against st_gen's own references (brute force, independent of the probe); a missing and a
 * malformed file's status and message; --prev matching, by name and across GGUF and
 * safetensors; a subset measured then the rest equal to measuring all; results handed over
 * with stab_probe_set_result; and the JSON text byte for byte what stabmeter-probe --json
 * prints for the same checkpoint and options (the program is builddir/harness/probe); the ratio
 * to init (stab_probe_set_init) against the brute force and a plain probe of the init file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char dir[512];

/* Runs cmd (a shell line), which must exit 0. */
static void run(const char *cmd) {
  if (system(cmd) != 0) {
    fprintf(stderr, "failed: %s\n", cmd);
    exit(1);
  }
}

/* dir/name */
static const char *at(const char *name) {
  static char path[4][1024];
  static int k;
  k = (k + 1) % 4;
  snprintf(path[k], sizeof path[k], "%s/%s", dir, name);
  return path[k];
}

static void setup(void) {
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/check_probe_api.XXXXXX", tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror(dir);
    exit(1);
  }
  const char *bd = getenv("builddir");
  char cmd[4096];
  /* GPT-2 names in F32 (tied head, fused c_attn, a 4-D buffer, an I64 tensor) and Llama names
   * in BF16 (untied head, grouped-query attention, a 3-D tensor), each with its .prev and .ref;
   * and the Llama file as llama.cpp's converter would write it in Q8_0 */
  snprintf(cmd, sizeof cmd, "%s/tests/support/st_gen %s gpt2 F32 >/dev/null && %s/tests/support/st_gen %s llama BF16 >/dev/null && "
           "%s/tests/support/gguf_convert --heads 4 --kv-heads 2 %s %s Q8_0 2>/dev/null",
           bd ? bd : ".", at("g"), bd ? bd : ".", at("l/l"), bd ? bd : ".", at("l/l.safetensors"), at("l.gguf"));
  char mk[1100];
  snprintf(mk, sizeof mk, "mkdir -p %s", at("l"));
  run(mk);
  run(cmd);
}

static void teardown(void) {
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static stab_probe *open_probe(const char *path, const char *prev, int exact) {
  stab_probe_params pp = stab_probe_default_params();
  pp.prev = prev;
  pp.exact = exact;
  stab_probe *p = NULL;
  stab_status st = stab_probe_open(path, &pp, &p);
  ck_assert_msg(st == STAB_OK, "stab_probe_open %s: %s", path, stab_last_error());
  ck_assert_ptr_nonnull(p);
  return p;
}

/* The row whose name (or, attention aside, tensor) is name and whose kind is kind; -1 if none. */
static long find_row(stab_probe *p, const char *name, const char *kind) {
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    if (strcmp(stab_kind_name(r.kind), kind)) continue;
    if (!strcmp(r.name, name) || (r.kind != STAB_KIND_ATTENTION && !strcmp(r.tensor, name))) return (long)i;
  }
  return -1;
}

/* |got - want| <= tol |want|, NaN only for NaN. */
static void near(double got, double want, double tol, const char *what, const char *name) {
  if (isnan(want)) {
    ck_assert_msg(isnan(got), "%s %s: want NaN, got %.17g", name, what, got);
    return;
  }
  ck_assert_msg(fabs(got - want) <= tol * fabs(want), "%s %s: got %.17g, want %.17g", name, what, got, want);
}

/* Every line of st_gen's .ref (NAME KIND FORWARD DEPENDENCY UPDATE) is a measured row of that
 * kind with those values: exact mode against the brute force. */
static void against_ref(stab_probe *p, const char *ref) {
  FILE *f = fopen(ref, "r");
  ck_assert_msg(f != NULL, "no %s", ref);
  char name[512], kind[32];
  double fw, dep, up;
  int lines = 0;
  while (fscanf(f, "%511s %31s %lf %lf %lf", name, kind, &fw, &dep, &up) == 5) {
    long i = find_row(p, name, kind);
    ck_assert_msg(i >= 0, "%s: no %s row %s", ref, kind, name);
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(p, (size_t)i, &r), STAB_OK);
    ck_assert_msg(r.measured, "%s not measured", name);
    near(r.metrics.forward, fw, 1e-9, "forward", name);
    near(r.metrics.dependency, dep, 1e-9, "dependency", name);
    near(r.metrics.update, up, 1e-9, "update", name);
    lines++;
  }
  fclose(f);
  ck_assert_int_gt(lines, 5);
}

START_TEST(rows_kinds_and_values) {
  stab_probe *p = open_probe(at("g.safetensors"), at("g.prev.safetensors"), 1);
  stab_probe_row r;
  /* before measuring: rows described, nothing measured */
  ck_assert_int_gt((int)stab_probe_count(p), 10);
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    ck_assert_int_eq(r.measured, 0);
  }
  long head = find_row(p, "lm_head", "lm_head"), wte = find_row(p, "wte", "embedding");
  ck_assert_int_ge(head, 0);
  ck_assert_int_ge(wte, 0);
  ck_assert_int_eq(stab_probe_row_at(p, (size_t)head, &r), STAB_OK);
  ck_assert_int_eq(r.tied, 1);
  ck_assert_str_eq(r.tensor, "wte.weight");
  /* the fused c_attn is three layers: k, the second, reads the tensor's middle 16 columns */
  ck_assert_int_lt(find_row(p, "h.0.attn.c_attn", "linear"), 0);
  long qkv = find_row(p, "h.0.attn.c_attn.k", "linear");
  ck_assert_int_ge(qkv, 0);
  ck_assert_int_eq(stab_probe_row_at(p, (size_t)qkv, &r), STAB_OK);
  ck_assert_str_eq(r.tensor, "h.0.attn.c_attn.weight");
  ck_assert_uint_eq(r.d_in, 16);
  ck_assert_uint_eq(r.d_out, 16);
  ck_assert_ptr_nonnull(r.bias); /* the bias folded into its linear layer */
  ck_assert_str_eq(r.bias, "h.0.attn.c_attn.bias");
  ck_assert_str_eq(r.reference_tensor, "h.0.attn.c_attn.weight");
  ck_assert_ptr_null(r.no_update);
  ck_assert_int_ge(r.nreads, 4); /* weight, bias, and the reference's two */
  /* tensors not measured keep their reason */
  int not_measured = 0;
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    if (!r.error || strcmp(r.tensor, "position_ids")) continue;
    ck_assert_ptr_nonnull(strstr(r.error, "I64"));
    not_measured++;
  }
  ck_assert_int_eq(not_measured, 1);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  against_ref(p, at("g.ref"));
  stab_probe_free(p);
  /* BF16 read in place, grouped-query attention, an untied head */
  p = open_probe(at("l/l.safetensors"), at("l/l.prev.safetensors"), 1);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  against_ref(p, at("l/l.ref"));
  ck_assert_int_eq(stab_probe_row_at(p, (size_t)find_row(p, "lm_head", "lm_head"), &r), STAB_OK);
  ck_assert_int_eq(r.tied, 0);
  ck_assert_str_eq(r.dtype, "BF16");
  stab_probe_free(p);
  stab_probe_free(NULL);
}
END_TEST

START_TEST(missing_and_malformed_files) {
  stab_probe_params pp = stab_probe_default_params();
  stab_probe *p = (stab_probe *)&pp; /* must be set to NULL on failure */
  stab_status st = stab_probe_open(at("none.safetensors"), &pp, &p);
  ck_assert_int_ne(st, STAB_OK);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(stab_last_error(), at("none.safetensors")) != NULL, "message: %s", stab_last_error());
  /* a header length past the end of the file */
  const char *hdr = "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}";
  ck_assert_int_eq(stw_write_raw(at("bad.safetensors"), 1000, hdr, NULL, 16), 0);
  st = stab_probe_open(at("bad.safetensors"), &pp, &p);
  ck_assert_int_eq(st, STAB_EFORMAT);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(stab_last_error(), "bad.safetensors") != NULL, "message: %s", stab_last_error());
  /* a reference that is another model: nothing matches */
  pp.prev = at("g.safetensors");
  st = stab_probe_open(at("l/l.safetensors"), &pp, &p);
  ck_assert_int_eq(st, STAB_ENOTFOUND);
  ck_assert_msg(strstr(stab_last_error(), "none of the") != NULL, "message: %s", stab_last_error());
  /* a filter that matches nothing */
  const char *filter = "no.such.layer*";
  pp.prev = NULL, pp.filters = &filter, pp.nfilters = 1;
  st = stab_probe_open(at("g.safetensors"), &pp, &p);
  ck_assert_int_eq(st, STAB_ENOTFOUND);
  ck_assert_msg(strstr(stab_last_error(), "--filter 'no.such.layer*' matches no layer") != NULL, "message: %s",
                stab_last_error());
  ck_assert_int_eq(stab_probe_open(NULL, &pp, &p), STAB_EINVAL);
}
END_TEST

START_TEST(prev_across_formats) {
  /* the GGUF file against the safetensors it was converted from: counterparts by llama.cpp's
   * names, q/k rows put back. Rows of 16 are no whole Q8_0 blocks, so the converter wrote F16,
   * which holds every BF16 value of these small weights exactly: once the converter's q/k
   * permutation is undone, the update is exactly 0 (a row order missed would not be) */
  stab_probe *p = open_probe(at("l.gguf"), at("l/l.safetensors"), 0);
  long q = find_row(p, "blk.0.attn_q", "linear");
  ck_assert_int_ge(q, 0);
  stab_probe_row r;
  ck_assert_int_eq(stab_probe_row_at(p, (size_t)q, &r), STAB_OK);
  ck_assert_str_eq(r.dtype, "F16");
  ck_assert_str_eq(r.reference_tensor, "model.layers.0.self_attn.q_proj.weight");
  ck_assert_str_eq(r.reference_dtype, "BF16");
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  const char *const permuted[] = {"blk.0.attn_q", "blk.0.attn_k"};
  for (size_t k = 0; k < 2; k++) {
    long i = find_row(p, permuted[k], "linear");
    ck_assert_int_ge(i, 0);
    ck_assert_int_eq(stab_probe_row_at(p, (size_t)i, &r), STAB_OK);
    ck_assert_msg(r.measured && r.metrics.update == 0 && r.metrics.rel_update == 0, "%s: update %g, rel_update %g",
                  r.name, r.metrics.update, r.metrics.rel_update);
    ck_assert_double_gt(r.metrics.forward, 0);
  }
  stab_probe_free(p);
}
END_TEST

/* Every row's results, bit for bit. */
static void same_results(stab_probe *a, stab_probe *b) {
  ck_assert_uint_eq(stab_probe_count(a), stab_probe_count(b));
  for (size_t i = 0; i < stab_probe_count(a); i++) {
    stab_probe_row x, y;
    ck_assert_int_eq(stab_probe_row_at(a, i, &x), STAB_OK);
    ck_assert_int_eq(stab_probe_row_at(b, i, &y), STAB_OK);
    ck_assert_int_eq(x.measured, y.measured);
    ck_assert_msg(!memcmp(&x.metrics, &y.metrics, sizeof x.metrics), "row %s differs", x.name);
    if (x.head_bounds) ck_assert(!memcmp(x.head_bounds, y.head_bounds, x.heads * sizeof *x.head_bounds));
  }
}

/* The probe's JSON with default options. Free it. */
static char *json_of(stab_probe *p, size_t *len) {
  char *text = NULL;
  ck_assert_int_eq(stab_probe_json(p, NULL, &text, len), STAB_OK);
  ck_assert_ptr_nonnull(text);
  ck_assert_uint_eq(strlen(text), *len);
  return text;
}

/* A share measured, then the rest, equals every row measured at once; the results handed to a
 * fresh probe row by row (another process's, as the MPI gather hands them) give the same JSON.
 * The count of head bounds handed over. */
static size_t subset_then_rest(const char *path, const char *prev) {
  stab_probe *all = open_probe(path, prev, 0);
  ck_assert_int_eq(stab_probe_measure(all, NULL, NULL, NULL), STAB_OK);
  stab_probe *part = open_probe(path, prev, 0);
  size_t n = stab_probe_count(part);
  unsigned char *which = calloc(n, 1);
  ck_assert_ptr_nonnull(which);
  for (size_t i = 0; i < n; i += 2) which[i] = 1; /* every other row; the tied head alone or not */
  ck_assert_int_eq(stab_probe_measure(part, which, NULL, NULL), STAB_OK);
  size_t measured = 0, heads = 0;
  for (size_t i = 0; i < n; i++) {
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(part, i, &r), STAB_OK);
    ck_assert_msg(!r.measured || which[i], "row %s measured outside the subset", r.name);
    measured += (size_t)r.measured;
  }
  ck_assert_uint_gt(measured, 0);
  ck_assert_int_eq(stab_probe_measure(part, NULL, NULL, NULL), STAB_OK); /* the rest */
  same_results(all, part);
  stab_probe *fresh = open_probe(path, prev, 0);
  for (size_t i = 0; i < n; i++) {
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(all, i, &r), STAB_OK);
    heads += r.head_bounds && r.measured ? r.heads : 0;
    ck_assert_int_eq(stab_probe_set_result(fresh, i, &r.metrics, r.head_bounds, r.measured), STAB_OK);
  }
  size_t la, lf;
  char *ja = json_of(all, &la), *jf = json_of(fresh, &lf);
  ck_assert_msg(la == lf && !memcmp(ja, jf, la), "%s: the results handed over report otherwise", path);
  ck_assert_int_eq(stab_probe_set_result(fresh, n, NULL, NULL, 1), STAB_EINVAL);
  free(ja), free(jf), free(which);
  stab_probe_free(all), stab_probe_free(part), stab_probe_free(fresh);
  return heads;
}

START_TEST(subset_then_rest_and_set_result) {
  subset_then_rest(at("g.safetensors"), at("g.prev.safetensors"));                      /* a tied head */
  ck_assert_uint_gt(subset_then_rest(at("l/l.safetensors"), at("l/l.prev.safetensors")), 0); /* attention */
}
END_TEST

/* stabmeter-probe's stdout for args, into *len bytes (malloc'ed). */
static char *program_stdout(const char *args, size_t *len) {
  const char *bd = getenv("builddir");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s/harness/probe --quiet %s", bd ? bd : ".", args);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  size_t k;
  while ((k = fread(buf + n, 1, cap - n, f)) > 0)
    if ((n += k) == cap) ck_assert_ptr_nonnull(buf = realloc(buf, cap *= 2));
  ck_assert_msg(pclose(f) == 0, "%s failed", cmd);
  *len = n;
  return buf;
}

START_TEST(json_is_the_programs) {
  char args[4096];
  size_t lp, ll;
  /* the default report, with a reference (the program's --prev alone: the ratios to it too) */
  stab_probe *p = open_probe(at("g.safetensors"), at("g.prev.safetensors"), 0);
  ck_assert_int_eq(stab_probe_set_init(p, at("g.prev.safetensors")), STAB_OK);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  ck_assert_int_eq(stab_probe_measure_init(p, NULL, NULL, NULL), STAB_OK);
  char *lib = json_of(p, &ll);
  snprintf(args, sizeof args, "--json %s --prev %s", at("g.safetensors"), at("g.prev.safetensors"));
  char *prog = program_stdout(args, &lp);
  ck_assert_msg(lp == ll && !memcmp(prog, lib, ll), "the library's JSON (%zu bytes) is not the program's (%zu bytes)",
                ll, lp);
  free(lib), free(prog);
  /* sorted and cut, the options the report takes */
  stab_probe_report_options ro = stab_probe_default_report_options();
  ro.sort = STAB_PROBE_SORT_UPDATE, ro.top = 3;
  ck_assert_int_eq(stab_probe_json(p, &ro, &lib, &ll), STAB_OK);
  snprintf(args, sizeof args, "--json --sort update --top 3 %s --prev %s", at("g.safetensors"),
           at("g.prev.safetensors"));
  prog = program_stdout(args, &lp);
  ck_assert_msg(lp == ll && !memcmp(prog, lib, ll), "sorted: the library's JSON is not the program's");
  free(lib), free(prog);
  /* and the table */
  ck_assert_int_eq(stab_probe_table(p, NULL, &lib, &ll), STAB_OK);
  snprintf(args, sizeof args, "%s --prev %s", at("g.safetensors"), at("g.prev.safetensors"));
  prog = program_stdout(args, &lp);
  ck_assert_msg(lp == ll && !memcmp(prog, lib, ll), "the library's table is not the program's");
  free(lib), free(prog);
  stab_probe_free(p);
  /* a GGUF file: its metadata in the report */
  p = open_probe(at("l.gguf"), NULL, 0);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  lib = json_of(p, &ll);
  snprintf(args, sizeof args, "--json %s", at("l.gguf"));
  prog = program_stdout(args, &lp);
  ck_assert_msg(lp == ll && !memcmp(prog, lib, ll), "GGUF: the library's JSON is not the program's");
  ck_assert_ptr_nonnull(strstr(lib, "\"general.architecture\": \"llama\""));
  free(lib), free(prog);
  ck_assert_int_eq(stab_probe_json(NULL, NULL, &lib, &ll), STAB_EINVAL);
  stab_probe_free(p);
}
END_TEST

/* The ratio to init: INIT the checkpoint itself in exact mode gives st_gen's brute-force values
 * as the init values and ratios of exactly 1; INIT the older file gives a plain probe's values
 * of that file (its rows in the same order: init_row indexes them) and this row's over them;
 * the errors leave the probe as it was; the JSON is the program's with --init. */
START_TEST(ratio_to_init) {
  stab_probe *p = open_probe(at("g.safetensors"), NULL, 1);
  stab_probe_ratio q;
  ck_assert_ptr_null(stab_probe_init_path(p));
  ck_assert_int_eq(stab_probe_set_init(p, NULL), STAB_EINVAL);
  ck_assert_int_eq(stab_probe_set_init(p, at("missing.safetensors")), STAB_EIO);
  ck_assert_ptr_nonnull(strstr(stab_last_error(), "missing.safetensors"));
  ck_assert_int_eq(stab_probe_set_init(p, at("l.gguf")), STAB_ENOTFOUND); /* other names */
  ck_assert_ptr_nonnull(strstr(stab_last_error(), "none of the"));
  ck_assert_ptr_null(stab_probe_init_path(p));
  ck_assert_int_eq(stab_probe_set_init(p, at("g.safetensors")), STAB_OK);
  ck_assert_str_eq(stab_probe_init_path(p), at("g.safetensors"));
  ck_assert_int_eq(stab_probe_set_init(p, at("g.safetensors")), STAB_ESTATE);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  ck_assert_int_eq(stab_probe_ratio_at(p, 0, &q), STAB_OK);
  ck_assert_msg(isnan(q.forward_init) && isnan(q.forward_ratio), "init values before measure_init");
  ck_assert_int_eq(stab_probe_measure_init(p, NULL, NULL, NULL), STAB_OK);
  ck_assert_int_eq(stab_probe_ratio_at(p, stab_probe_count(p), &q), STAB_EINVAL);
  FILE *f = fopen(at("g.ref"), "r");
  ck_assert_ptr_nonnull(f);
  char name[512], kind[32];
  double fw, dep, up;
  int lines = 0;
  while (fscanf(f, "%511s %31s %lf %lf %lf", name, kind, &fw, &dep, &up) == 5) {
    long i = find_row(p, name, kind);
    ck_assert_int_ge(i, 0);
    ck_assert_int_eq(stab_probe_ratio_at(p, (size_t)i, &q), STAB_OK);
    near(q.forward_init, fw, 1e-9, "forward_init", name);
    near(q.dependency_init, dep, 1e-9, "dependency_init", name);
    ck_assert_msg(q.forward_ratio == 1.0, "%s forward_ratio to itself %.17g", name, q.forward_ratio);
    ck_assert_msg(isnan(dep) ? isnan(q.dependency_ratio) : q.dependency_ratio == 1.0, "%s dependency_ratio %.17g", name,
                  q.dependency_ratio);
    lines++;
  }
  fclose(f);
  ck_assert_int_gt(lines, 5);
  stab_probe_free(p);
  /* against the older file: a plain probe of it is the reference */
  p = open_probe(at("g.safetensors"), NULL, 0);
  stab_probe *old = open_probe(at("g.prev.safetensors"), NULL, 0);
  ck_assert_int_eq(stab_probe_set_init(p, at("g.prev.safetensors")), STAB_OK);
  ck_assert_int_eq(stab_probe_measure(p, NULL, NULL, NULL), STAB_OK);
  ck_assert_int_eq(stab_probe_measure_init(p, NULL, NULL, NULL), STAB_OK);
  ck_assert_int_eq(stab_probe_measure(old, NULL, NULL, NULL), STAB_OK);
  size_t matched = 0;
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    stab_probe_row r, o;
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    ck_assert_int_eq(stab_probe_ratio_at(p, i, &q), STAB_OK);
    if (!r.measured) continue;
    ck_assert_msg(q.init_row != SIZE_MAX, "%s: no counterpart", r.name);
    ck_assert_int_eq(stab_probe_row_at(old, q.init_row, &o), STAB_OK);
    ck_assert_str_eq(o.name, r.name);
    ck_assert_msg(q.forward_init == o.metrics.forward, "%s forward_init %.17g, plain %.17g", r.name, q.forward_init,
                  o.metrics.forward);
    near(q.forward_ratio, r.metrics.forward / o.metrics.forward, 1e-15, "forward_ratio", r.name);
    near(q.dependency_ratio, r.metrics.dependency / o.metrics.dependency, 1e-15, "dependency_ratio", r.name);
    matched++;
  }
  ck_assert_int_gt((int)matched, 5);
  char args[4096], *lib, *prog;
  size_t ll, lp;
  lib = json_of(p, &ll);
  snprintf(args, sizeof args, "--json %s --init %s", at("g.safetensors"), at("g.prev.safetensors"));
  prog = program_stdout(args, &lp);
  ck_assert_msg(lp == ll && !memcmp(prog, lib, ll), "--init: the library's JSON is not the program's");
  free(lib), free(prog);
  stab_probe_free(old);
  stab_probe_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("probe_api");
  TCase *tc = tcase_create("probe_api");
  tcase_add_unchecked_fixture(tc, setup, teardown); /* the files once, for every test */
  tcase_set_timeout(tc, 0);
  tcase_add_test(tc, rows_kinds_and_values);
  tcase_add_test(tc, missing_and_malformed_files);
  tcase_add_test(tc, prev_across_formats);
  tcase_add_test(tc, subset_then_rest_and_set_result);
  tcase_add_test(tc, json_is_the_programs);
  tcase_add_test(tc, ratio_to_init);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
