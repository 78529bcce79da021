/* probe.c — stabmeter-probe: the stability metrics of every layer of a checkpoint on disk
 * (safetensors, GGUF or llm.c), optionally with the update against an older checkpoint. The
 * library's probe (stab_probe_*: the kind rules, the readers, the matching, the measuring and
 * the report, the input guard against a file shrinking under its mapping) does the work; the
 * program parses the options, shows progress, decides the step of a trace, splits the rows among
 * the ranks of an MPI job, and prints the library's table or JSON. Definitions in
 * docs/manual/metrics.md. */
#include "cli.h"
#include "clock.h"
#include "probe_ranks.h"
#include "probe_split.h"
#include "stabmeter.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Where the definitions are: the repository's docs/manual/metrics.md, installed under the doc
 * directory (the build sets STAB_DOCDIR to $(docdir)). */
#ifndef STAB_DOCDIR
#define STAB_DOCDIR "/usr/local/share/doc/stabmeter"
#endif

typedef struct {
  const char *checkpoint, *reference;
  const char *init; /* --init: the reference of the ratios (else --prev's file) */
  const char *hdf5; /* --hdf5: the trace to append this checkpoint's step to */
  int64_t step;     /* --step, the checkpoint's metadata, its file name; or -1 */
  const char *step_from; /* where step came from, for the messages and the report */
  int sort;         /* stab_probe_sort */
  size_t top;       /* --top N, or 0: every row */
  size_t heads;     /* --heads, or 0: from the file's metadata or config.json */
  int per_head;     /* --per-head: a table row per attention head */
  int experts;      /* --experts: a row per expert too, beside its layer's */
  int json, quiet;
  double tol;
  int exact;
  stab_tight_method tight;
  const char **filters;
  size_t nfilters;
  stab_model_override *kinds, *layouts; /* globs owned */
  size_t nkinds, nlayouts;
} options;
#define MAX_HEADS STAB_MODEL_MAX_HEADS

/* ---- options ----------------------------------------------------------------------- */

static void usage(void) {
  printf("Usage: stabmeter-probe [OPTION]... CHECKPOINT\n"
         "Stability metrics of every layer of a checkpoint: safetensors (a file, or a Hugging Face\n"
         "model directory or its model.safetensors.index.json: every shard as one model, heads and\n"
         "the tied head from its config.json), GGUF v2/v3 (F32, F16, BF16,\n"
         "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS tensors, dequantized as ggml does;\n"
         "other quantized types listed as unsupported), or llm.c GPT-2 (magic 20240326, f32 or bf16;\n"
         "fused qkv split into q, k, v plus each block's attention logit bound h.N.attn.logits; wte\n"
         "reported as embedding and as the tied lm_head, padding rows left out). Definitions and units:\n"
         "docs/manual/metrics.md (installed as " STAB_DOCDIR "/docs/manual/metrics.md).\n\n"
         "Options:\n"
         "  --prev OLDER        also the update metrics against OLDER (tensors matched by name and\n"
         "                      shape); exit 2 when no tensor matches, a warning naming the layers\n"
         "                      without a counterpart when some do not. A GGUF file against the\n"
         "                      safetensors it was converted from (or the reverse): llama.cpp's\n"
         "                      names mapped (llama, qwen2, gemma, phi3, gpt2), its q/k row order\n"
         "                      and Conv1D transposes undone, so update is the quantization error\n"
         "                      Also the ratio to the earlier checkpoint (forward_ratio,\n"
         "                      dependency_ratio: this value over OLDER's) unless --init is given\n"
         "  --init INIT         the ratio to init: forward_ratio and dependency_ratio are this\n"
         "                      checkpoint's value over INIT's (INIT: the same model at\n"
         "                      initialisation or any earlier checkpoint, any format read here;\n"
         "                      layers matched as --prev matches them, with kind and shape; --json\n"
         "                      adds forward_init and\n"
         "                      dependency_init). INIT is measured too: about twice the time. With\n"
         "                      --prev, INIT is the ratios' reference and OLDER the update's\n"
         "  --json              the probe report as JSON instead of the table\n"
         "  --sort METRIC       rows by METRIC, largest first: forward, dependency, update, sigma,\n"
         "                      rel_update, forward_tight, dependency_tight, update_tight,\n"
         "                      forward_ratio, dependency_ratio (with --init or --prev); or file\n"
         "                      (the checkpoint's order, the default) or name; a layer without the\n"
         "                      value comes last\n"
         "  --top N             only the first N rows of that order (alone: the N largest forward)\n"
         "  --tol X             relative tolerance of each spectral norm, 1e-12 to 0.5 (default 1e-3)\n"
         "  --exact             spectral norms by LAPACK SVD in f64 (slow; the reference)\n"
         "  --tight M           LM-head tight bound: centred (default, O(V d)), exact (all pairs,\n"
         "                      O(V^2 d)) or none\n"
         "  --filter GLOB       only layers whose name, or the name of a tensor they read, matches\n"
         "                      (repeatable; exit 2 when one matches nothing)\n"
         "  --kind GLOB=KIND    force the kind of tensors whose name matches: linear, embedding,\n"
         "                      lm_head, gain, bias or skip\n"
         "  --layout GLOB=L     force a linear layout: in_major or out_major\n"
         "  --hdf5 FILE         also append the results to the trace FILE (created if missing) as one\n"
         "                      step: probing a series of checkpoints builds a trace\n"
         "  --step N            that step's number (default: the checkpoint's metadata, i.e.\n"
         "                      safetensors __metadata__ step or global_step, steps of\n"
         "                      stabmeter-train, GGUF training.iteration_count; else the file name,\n"
         "                      e.g. step-000100.* or model_00000100.bin)\n"
         "  --heads H           attention heads, for the logit bounds of query/key pairs (default:\n"
         "                      GGUF metadata, safetensors __metadata__, or config.json beside the file)\n"
         "  --per-head          a table row per attention head (the JSON always has head_bounds)\n"
         "  --experts           a row per expert too (table and JSON), beside its layer's row, which\n"
         "                      has the worst expert per metric and its index\n"
         "  --quiet             no progress on stderr\n"
         "  -h, --help          this text\n"
         "  -V, --version       the version\n\n"
         "Layers are named as stabmeter-train's trace names them, so a report and a trace join\n"
         "without renaming: a tensor's name without its trailing .weight (a bias that stands alone\n"
         "keeps .bias); attention logit bounds X.logits; a tied head lm_head.\n"
         "Kinds by name and shape (first match): 2-D *wte, wpe, embed_tokens, tok_embeddings,\n"
         "token_embd, word_embeddings, position_embd, ...* embedding; *lm_head, output, embed_out*\n"
         "lm_head; other 2-D linear, out-major except HF GPT-2 Conv1D h.N.{attn.c_attn,attn.c_proj,\n"
         "mlp.c_fc,mlp.c_proj} in Conv1D's shape (in-major; c_attn [d][3d], c_fc wider than tall,\n"
         "mlp.c_proj taller than wide); a fused q/k/v (*c_attn, qkv_proj, qkv, attn_qkv,\n"
         "in_proj_weight*) three linear layers M.q, M.k, M.v (M its module: h.0.attn.c_attn.q),\n"
         "each with its slice of the bias; 1-D X.bias with a linear X.weight folded into it; 1-D\n"
         "*norm*/ln* weights gain, their .bias bias; other 1-D .bias bias. Experts: 3-D *_exps\n"
         "(GGUF [n_expert][rows][cols]) and HF X.experts.E.Y linears are a layer of experts each.\n"
         "Integer dtypes, scalars and other 3-D+ tensors are listed as not measured. With no\n"
         "lm_head tensor in the model, the token embedding is reported also as lm_head (tied),\n"
         "unless config.json says tie_word_embeddings false.\n"
         "The table ends with the largest value of each metric per kind and its layer, and the\n"
         "units: RMS ratio (1) for every kind but lm_head, whose values are in nats.\n\n"
         "Across ranks (built with configure --with-mpi): mpirun -np P stabmeter-probe CHECKPOINT\n"
         "[OPTION]... splits the checkpoint's tensors among the P ranks (by bytes times expected\n"
         "work, from the headers alone; a query/key pair, a tied head, a fused qkv and a layer's\n"
         "experts stay on one rank), each rank reading only its own tensors' bytes; rank 0 prints\n"
         "the report, the same bytes as one process prints, and every rank exits with its status.\n"
         "Progress and warnings come from rank 0 only. Run without mpirun, the probe is one process.\n"
         "STAB_PROBE_SHOW_READS=1 in the environment prints on stderr the byte ranges each rank reads\n"
         "and, on more than one rank, makes the other ranks' pages unreadable to prove it.\n\n"
         "Exit status: 0 success, 1 failure, 2 bad usage or bad input (a malformed or unreadable\n"
         "checkpoint, a --filter or --prev that matches nothing).\n");
}

static int add_override(stab_model_override **list, size_t *n, const char *arg, const char *opt, const char *const *allowed) {
  const char *eq = strrchr(arg, '=');
  size_t i = 0;
  while (eq && allowed[i] && strcmp(allowed[i], eq + 1)) i++;
  if (!eq || eq == arg || !allowed[i]) { /* the whole argument quoted: GLOB=VALUE is one value */
    char want[160] = "GLOB=VALUE, VALUE one of";
    for (size_t k = 0; allowed[k]; k++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", k ? ", " : " ", allowed[k]);
    return cli_bad_value(opt, arg, want);
  }
  stab_model_override *p = realloc(*list, (*n + 1) * sizeof *p);
  char *g = strndup(arg, (size_t)(eq - arg));
  if (!p || !g) {
    free(g);
    if (p) *list = p;
    cli_error("out of memory");
    return CLI_FAILED;
  }
  *list = p;
  p[*n].glob = g;
  p[*n].value = allowed[i];
  (*n)++;
  return 0;
}

static int parse(int argc, char **argv, options *o) {
  enum { O_PREV = 256, O_INIT, O_JSON, O_TOL, O_EXACT, O_TIGHT, O_FILTER, O_KIND, O_LAYOUT, O_QUIET, O_HDF5, O_STEP,
         O_HEADS, O_PER_HEAD, O_SORT, O_TOP, O_EXPERTS };
  static const struct option longs[] = {
      {"prev", required_argument, 0, O_PREV},   {"json", no_argument, 0, O_JSON},
      {"tol", required_argument, 0, O_TOL},     {"exact", no_argument, 0, O_EXACT},
      {"tight", required_argument, 0, O_TIGHT}, {"filter", required_argument, 0, O_FILTER},
      {"kind", required_argument, 0, O_KIND},   {"layout", required_argument, 0, O_LAYOUT},
      {"quiet", no_argument, 0, O_QUIET},       {"help", no_argument, 0, 'h'},
      {"hdf5", required_argument, 0, O_HDF5},   {"step", required_argument, 0, O_STEP},
      {"heads", required_argument, 0, O_HEADS}, {"per-head", no_argument, 0, O_PER_HEAD},
      {"sort", required_argument, 0, O_SORT},   {"top", required_argument, 0, O_TOP},
      {"experts", no_argument, 0, O_EXPERTS},   {"version", no_argument, 0, 'V'},
      {"init", required_argument, 0, O_INIT},
      {0, 0, 0, 0}};
  static const char *const kinds[] = {"linear", "embedding", "lm_head", "gain", "bias", "skip", NULL};
  static const char *const layouts[] = {"in_major", "out_major", NULL};
  static const char *const tights[] = {"centred", "exact", "none", NULL};
  static const stab_tight_method tight_of[] = {STAB_TIGHT_CENTRED, STAB_TIGHT_EXACT, STAB_TIGHT_NONE};
  memset(o, 0, sizeof *o);
  o->tol = 1e-3;
  o->step = -1;
  o->sort = STAB_PROBE_SORT_FILE;
  const char *sort_names[16] = {NULL}; /* the library's words, NULL-terminated for cli_choice */
  for (int i = 0; i < 15 && stab_probe_sort_name(i); i++) sort_names[i] = stab_probe_sort_name(i);
  int c, rc, sort_given = 0;
  unsigned long long v;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS, longs, NULL)) != -1) {
    switch (c) {
    case O_PREV:
      if (!*optarg) return cli_bad_value("--prev", optarg, "a path");
      o->reference = optarg;
      break;
    case O_INIT:
      if (!*optarg) return cli_bad_value("--init", optarg, "a path");
      o->init = optarg;
      break;
    case O_JSON: o->json = 1; break;
    case O_HDF5:
      if (!*optarg) return cli_bad_value("--hdf5", optarg, "a path");
      o->hdf5 = optarg;
      break;
    case O_PER_HEAD: o->per_head = 1; break;
    case O_EXPERTS: o->experts = 1; break;
    case O_HEADS:
      if ((rc = cli_whole("--heads", optarg, 1, MAX_HEADS, &v))) return rc;
      o->heads = (size_t)v;
      break;
    case O_STEP:
      if ((rc = cli_whole("--step", optarg, 0, INT64_MAX, &v))) return rc;
      o->step = (int64_t)v;
      o->step_from = "--step";
      break;
    case O_SORT:
      if ((rc = cli_choice("--sort", optarg, sort_names, &o->sort))) return rc;
      sort_given = 1;
      break;
    case O_TOP:
      if ((rc = cli_whole("--top", optarg, 1, SIZE_MAX, &v))) return rc;
      o->top = (size_t)v;
      break;
    case O_QUIET: o->quiet = 1; break;
    case O_EXACT: o->exact = 1; break;
    case O_TOL:
      /* the library's own bounds: below STAB_SPECTRAL_TOL_MIN every layer would only run out
       * of passes and be reported not converged */
      if ((rc = cli_real("--tol", optarg, STAB_SPECTRAL_TOL_MIN, 0, 0.5, 1, &o->tol))) return rc;
      break;
    case O_TIGHT: {
      int i;
      if ((rc = cli_choice("--tight", optarg, tights, &i))) return rc;
      o->tight = tight_of[i];
      break;
    }
    case O_FILTER: {
      const char **p = realloc(o->filters, (o->nfilters + 1) * sizeof *p);
      if (!p) return cli_error("out of memory"), CLI_FAILED;
      o->filters = p;
      p[o->nfilters++] = optarg;
      break;
    }
    case O_KIND:
      if ((rc = add_override(&o->kinds, &o->nkinds, optarg, "--kind", kinds))) return rc;
      break;
    case O_LAYOUT:
      if ((rc = add_override(&o->layouts, &o->nlayouts, optarg, "--layout", layouts))) return rc;
      break;
    case 'h': usage(); return -1;
    case 'V': cli_version(); return -1;
    default: return cli_getopt_error(c, argv);
    }
  }
  if (optind != argc - 1)
    return cli_usage_error("%s", optind >= argc ? "no checkpoint given" : "more than one checkpoint given");
  if (!argv[optind][0]) return cli_usage_error("the checkpoint's path is empty");
  o->checkpoint = argv[optind];
  /* --top alone: the largest forward values, the number every kind has */
  if (o->top && !sort_given) o->sort = STAB_PROBE_SORT_FORWARD;
  if ((o->sort == STAB_PROBE_SORT_FORWARD_RATIO || o->sort == STAB_PROBE_SORT_DEPENDENCY_RATIO) && !o->init &&
      !o->reference)
    return cli_usage_error("--sort %s: the ratio is to --init INIT (or --prev OLDER): give one", stab_probe_sort_name(o->sort));
  if (o->step >= 0 && !o->hdf5) return cli_usage_error("--step is the step of the --hdf5 trace; give --hdf5 FILE too");
  return 0;
}

/* ---- the step (--hdf5) -------------------------------------------------------------- */

/* o->step and o->step_from: --step, else the metadata's, else the file name's (the library's
 * stab_probe_steps_found). With --hdf5 the choice is said on stderr (unless --quiet), a
 * disagreement between the sources is a warning, and no step at all is bad input (2). */
static int decide_step(options *o, const stab_probe *p) {
  stab_probe_steps found;
  if (stab_probe_steps_found(p, &found) != STAB_OK) {
    cli_error("%s", stab_last_error());
    return CLI_FAILED;
  }
  const int64_t meta = found.metadata_step, named = found.name_step;
  const char *meta_from = found.metadata_source, *name_is = found.name_source;
  if (o->hdf5 && found.metadata_problem[0])
    cli_error("warning: %s: %s; not used as the step", o->checkpoint, found.metadata_problem);
  if (o->step < 0 && meta >= 0) o->step = meta, o->step_from = meta_from;
  else if (o->step < 0 && named >= 0) o->step = named, o->step_from = name_is;
  if (!o->hdf5) return 0;
  if (o->step < 0) {
    cli_error("%s: no step in its metadata or its file name (e.g. step-000100.safetensors); give --step N",
              o->checkpoint);
    return CLI_USAGE;
  }
  if (meta >= 0 && meta != o->step)
    cli_error("warning: %s: step %lld from %s, but %s says %lld", o->checkpoint, (long long)o->step, o->step_from,
              meta_from, (long long)meta);
  else if (named >= 0 && named != o->step)
    cli_error("warning: %s: step %lld from %s, but %s says %lld", o->checkpoint, (long long)o->step,
              o->step_from, name_is, (long long)named);
  if (!o->quiet) cli_error("%s: step %lld, from %s", o->hdf5, (long long)o->step, o->step_from);
  return 0;
}

/* ---- the library's callbacks: notes, progress ------------------------------------------ */

/* What the callbacks share with main. */
typedef struct {
  const options *o;
  const probe_ranks *job;
  int out_of_memory; /* collect_files could not keep a file's span (said) */
  char **paths;    /* copies of the files' paths: they outlive a probe that failed to open */
  size_t npaths;
  probe_mapped *spans; /* every file's mapped tensor bytes (the ranks hash them to agree) */
  size_t nspans;
  double t0, last; /* the progress line's clock */
  const char *what; /* "" or "init ": whose layers the progress line counts */
} probe_watch;

static void print_note(void *user, const char *text) {
  (void)user;
  cli_error("%s", text);
}

/* A copy of path that lives as long as the watch (one per file, however often it is named). */
static const char *kept_path(probe_watch *w, const char *path) {
  for (size_t i = 0; i < w->npaths; i++)
    if (!strcmp(w->paths[i], path)) return w->paths[i];
  char **list = realloc(w->paths, (w->npaths + 1) * sizeof *list), *copy = strdup(path);
  if (!list || !copy) {
    if (list) w->paths = list;
    free(copy);
    return NULL;
  }
  w->paths = list;
  return w->paths[w->npaths++] = copy;
}

/* Under mpirun, every file's mapped tensor bytes are kept for the ranks' digest. */
static int collect_files(void *user, stab_probe_file_event event, const char *path, const void *lo, size_t len) {
  probe_watch *w = user;
  if (event != STAB_PROBE_FILE_MAPPED || w->job->size < 2) return 0;
  const char *kept = kept_path(w, path);
  probe_mapped *more = kept ? realloc(w->spans, (w->nspans + 1) * sizeof *more) : NULL;
  if (!more) {
    cli_error("out of memory");
    w->out_of_memory = 1;
    return 1;
  }
  w->spans = more;
  w->spans[w->nspans++] = (probe_mapped){kept, lo, len};
  return 0;
}

/* Past a second, "layer i/n, elapsed, ETA" once a second, from rank 0's first thread. */
static int show_progress(void *user, const stab_probe_progress *pr) {
  probe_watch *w = user;
  if (pr->thread != 0 || w->job->rank != 0 || w->o->quiet) return 0;
  double t = monotonic_seconds();
  if (t - w->t0 > 1.0 && t - w->last > 1.0) {
    double eta = pr->work_done > 0 ? (t - w->t0) * (pr->work_total - pr->work_done) / pr->work_done : 0;
    cli_error("%slayer %zu/%zu %s, %.1f s, ETA %.0f s", w->what, pr->row + 1, pr->count, pr->name, t - w->t0, eta);
    w->last = t;
  }
  return 0;
}

/* ---- across ranks (mpirun) ----------------------------------------------------------- */

static int is_expert_layer(const stab_probe_row *r) { return r->n_expert > 0; }
static int is_expert(const stab_probe_row *r) { return r->expert != STAB_MODEL_NO_EXPERT; }

/* Row r as the split across ranks sees it (probe_split.h): the mapped bytes it reads and its
 * cost (the library's: the bytes it reads times the sweeps expected, the update's again with
 * --prev). A layer of experts reads nothing of its own (its experts' rows do) and stays with
 * them; a row not measured costs nothing. */
static probe_item split_item(const stab_probe_row *r, size_t layer_of_experts) {
  probe_item it = {.with = SIZE_MAX};
  if (is_expert(r) && layer_of_experts != SIZE_MAX) it.with = layer_of_experts;
  for (size_t k = 0; k < r->nreads && k < PROBE_MAX_SPANS; k++)
    it.span[it.nspan++] = (probe_span){r->reads[k].data, r->reads[k].data + r->reads[k].bytes};
  it.cost = r->work;
  return it;
}

/* The rows' owners among job's ranks, and their items (*items, for the fence). NULL when out
 * of memory. */
static int *split_rows(const stab_probe_row *rows, size_t n, int ranks, probe_item **items) {
  int *owner = malloc((n ? n : 1) * sizeof *owner);
  *items = malloc((n ? n : 1) * sizeof **items);
  if (!owner || !*items) {
    free(owner), free(*items), *items = NULL;
    return NULL;
  }
  size_t layer = SIZE_MAX; /* the experts' rows follow their layer's */
  for (size_t i = 0; i < n; i++) {
    if (is_expert_layer(&rows[i])) layer = i;
    else if (!is_expert(&rows[i])) layer = SIZE_MAX;
    (*items)[i] = split_item(&rows[i], layer);
  }
  if (probe_split(*items, n, ranks, owner)) {
    free(owner), free(*items), *items = NULL;
    return NULL;
  }
  return owner;
}

/* STAB_PROBE_SHOW_READS: on the real stderr, one line per tensor this rank reads (file, byte
 * range, name), and with more than one rank every page of the other ranks' tensors made
 * unreadable (probe_split_fence), so that a stray read kills the rank instead of fetching
 * pages unseen. A rank's lines say what it reads; the fence proves it reads nothing else.
 * 0, or 1 after a message. */
static int show_reads(const probe_ranks *job, const stab_probe_row *rows, size_t n, const int *owner,
                      const probe_item *items) {
  FILE *err = probe_ranks_stderr(job);
  for (size_t i = 0; i < n; i++) {
    if (owner[i] != job->rank) continue;
    for (size_t k = 0; k < rows[i].nreads; k++) {
      const stab_probe_read *rd = &rows[i].reads[k];
      fprintf(err, "%s: rank %d of %d reads %s bytes %llu-%llu (%s, row %s)\n", cli_name, job->rank, job->size,
              rd->file, (unsigned long long)rd->offset, (unsigned long long)(rd->offset + rd->bytes), rd->tensor,
              rows[i].name);
    }
  }
  if (job->size == 1) return 0;
  long long fenced = probe_split_fence(items, n, owner, job->rank);
  if (fenced < 0) {
    cli_error("STAB_PROBE_SHOW_READS: cannot protect the other ranks' tensors: %s", strerror(errno));
    return 1;
  }
  fprintf(err, "%s: rank %d of %d fenced %lld bytes of the other ranks' tensors\n", cli_name, job->rank, job->size,
          fenced);
  return 0;
}

/* Where the gather puts each row's results: this rank's own rows copied from the probe (the
 * ones it sends), the other ranks' received into them (rank 0, which then sets them). */
typedef struct {
  stab_metrics *m;
  double **head_bounds;
  int *measured;
  probe_result *results;
} gathered;

static void gathered_free(gathered *g, size_t n) {
  for (size_t i = 0; g->head_bounds && i < n; i++) free(g->head_bounds[i]);
  free(g->m), free(g->head_bounds), free(g->measured), free(g->results);
}

/* 0, or -1 when out of memory. */
static int gathered_init(gathered *g, const stab_probe_row *rows, size_t n) {
  g->m = calloc(n ? n : 1, sizeof *g->m);
  g->head_bounds = calloc(n ? n : 1, sizeof *g->head_bounds);
  g->measured = calloc(n ? n : 1, sizeof *g->measured);
  g->results = calloc(n ? n : 1, sizeof *g->results);
  if (!g->m || !g->head_bounds || !g->measured || !g->results) return -1;
  for (size_t i = 0; i < n; i++) {
    if (rows[i].head_bounds && !(g->head_bounds[i] = calloc(rows[i].heads, sizeof **g->head_bounds))) return -1;
    g->results[i] = (probe_result){&g->m[i], g->head_bounds[i], rows[i].head_bounds ? rows[i].heads : 0,
                                   &g->measured[i]};
  }
  return 0;
}

/* ---- main -------------------------------------------------------------------------- */

/* The rows as the library describes them, after measuring or not. 0, or 1 after a message. */
static int fetch_rows(stab_probe *p, stab_probe_row *rows, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (stab_probe_row_at(p, i, &rows[i]) != STAB_OK) {
      cli_error("%s", stab_last_error());
      return 1;
    }
  return 0;
}

int main(int argc, char **argv) {
  cli_init("stabmeter-probe");
  /* under mpirun: one rank of many (probe_ranks.h); every path out goes through
   * probe_ranks_finish, so that every rank ends with rank 0's status */
  probe_ranks job;
  if (probe_ranks_start(&job, &argc, &argv)) return probe_ranks_finish(&job, 1);
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return probe_ranks_finish(&job, rc < 0 ? CLI_OK : rc); /* < 0: --help or --version done */
  probe_watch watch = {.o = &o, .job = &job, .what = ""};
  stab_probe_params params = stab_probe_default_params();
  params.tol = o.tol, params.exact = o.exact, params.tight = o.tight, params.heads = o.heads;
  params.prev = o.reference;
  params.kinds = o.kinds, params.nkinds = o.nkinds, params.layouts = o.layouts, params.nlayouts = o.nlayouts;
  params.filters = o.filters, params.nfilters = o.nfilters;
  params.note_fn = print_note, params.file_fn = collect_files, params.user = &watch;
  stab_probe *p = NULL;
  stab_probe_row *rows = NULL;
  size_t n = 0;
  int *owner = NULL;
  probe_item *items = NULL;
  unsigned char *mine = NULL;
  gathered g = {0};
  char *text = NULL;
  size_t len = 0;
  /* A file that shrinks under the library's mappings is STAB_EIO naming it (its input guard):
   * bad input, exit status 2, no report. */
  stab_status st = stab_probe_open(o.checkpoint, &params, &p);
  if (st != STAB_OK) {
    if (!watch.out_of_memory) cli_error("%s", stab_last_error());
    rc = st == STAB_ENOMEM || watch.out_of_memory ? CLI_FAILED : CLI_USAGE;
    goto out;
  }
  /* the ratios' reference: --init, else the --prev file (the ratio to the earlier checkpoint) */
  if ((o.init || o.reference) && (st = stab_probe_set_init(p, o.init ? o.init : o.reference)) != STAB_OK) {
    if (!watch.out_of_memory) cli_error("%s %s", o.init ? "--init" : "--prev", stab_last_error());
    rc = st == STAB_ENOMEM || watch.out_of_memory ? CLI_FAILED : CLI_USAGE;
    goto out;
  }
  if ((rc = decide_step(&o, p))) goto out;
  n = stab_probe_count(p);
  if (!(rows = calloc(n ? n : 1, sizeof *rows)) || !(mine = calloc(n ? n : 1, 1))) goto oom;
  if ((rc = fetch_rows(p, rows, n))) goto out;
  /* the rows each rank measures, from the headers alone: every rank knows every owner */
  if (!(owner = split_rows(rows, n, job.size, &items)) || gathered_init(&g, rows, n)) goto oom;
  for (size_t i = 0; i < n; i++) mine[i] = owner[i] == job.rank;
  /* under mpirun each rank hashes what it read (every file's tensor bytes, the rows): before
   * anything protects or measures them */
  if ((rc = probe_ranks_digest(&job, watch.spans, watch.nspans, rows, n))) goto out;
  if (getenv("STAB_PROBE_SHOW_READS") && (rc = show_reads(&job, rows, n, owner, items))) goto out;
  /* every rank has read the same headers alike, or all stop here with the first one's status */
  if ((rc = probe_ranks_agree(&job, rc))) goto out;
  /* and the same bytes: a node whose copy of the model differs stops every rank, nothing measured */
  if ((rc = probe_ranks_same_bytes(&job))) goto out;

  watch.t0 = watch.last = monotonic_seconds();
  int failed = 0;
  char shrunk[1024] = ""; /* the input guard's message: a file shrank under this rank's reads */
  st = stab_probe_measure(p, mine, show_progress, &watch);
  if (st == STAB_EIO) snprintf(shrunk, sizeof shrunk, "%s", stab_last_error());
  else if (st != STAB_OK) cli_error("%s", stab_last_error());
  if (st != STAB_OK) failed = 1;
  /* rank 0 receives the other ranks' rows and outcomes (nothing to do for one process) */
  if (job.size > 1) {
    if ((rc = fetch_rows(p, rows, n))) goto out;
    for (size_t i = 0; i < n; i++) {
      if (!mine[i]) continue;
      g.m[i] = rows[i].metrics, g.measured[i] = rows[i].measured;
      if (g.head_bounds[i]) memcpy(g.head_bounds[i], rows[i].head_bounds, rows[i].heads * sizeof *g.head_bounds[i]);
    }
  }
  const char *tripped = shrunk[0] ? shrunk : NULL;
  if (probe_ranks_gather(&job, g.results, n, owner, &failed, &tripped)) failed = 1;
  if (job.rank != 0) goto out; /* rank 0 reports, and its status is every rank's */
  if (tripped) { /* the numbers read were zeros: nothing of this run stands */
    cli_error("%s; no report", tripped);
    rc = CLI_USAGE;
    goto out;
  }
  if (failed) {
    rc = 1;
    goto out;
  }
  for (size_t i = 0; i < n; i++)
    if (!mine[i] && stab_probe_set_result(p, i, &g.m[i], g.head_bounds[i], g.measured[i]) != STAB_OK) {
      cli_error("%s", stab_last_error());
      rc = 1;
      goto out;
    }
  /* the init reference's counterparts, on rank 0 alone (its results are the report's); the
   * progress line's ETA over this second pass alone */
  const double t_start = watch.t0;
  watch.t0 = monotonic_seconds(), watch.what = "init ";
  st = stab_probe_measure_init(p, NULL, show_progress, &watch);
  watch.t0 = t_start;
  if (st != STAB_OK) {
    rc = st == STAB_EIO ? CLI_USAGE : 1; /* EIO: a file shrank (the input guard) */
    cli_error("%s", stab_last_error());
    goto out;
  }
  if (!o.quiet && monotonic_seconds() - watch.t0 > 1.0)
    cli_error("%zu tensors in %.1f s", n, monotonic_seconds() - watch.t0);
  if (o.hdf5 && (st = stab_probe_trace_append(p, o.hdf5, o.step)) != STAB_OK) {
    cli_error("%s", stab_last_error());
    /* another writer holds the trace, or it does not fit: a step not after its last, other layers */
    rc = st == STAB_EINVAL || st == STAB_EEXIST || st == STAB_EBUSY || st == STAB_ERANGE ? CLI_USAGE : CLI_FAILED;
    goto out;
  }
  stab_probe_report_options ro = stab_probe_default_report_options();
  ro.sort = (stab_probe_sort)o.sort, ro.top = o.top, ro.experts = o.experts, ro.per_head = o.per_head;
  ro.step = o.step, ro.step_source = o.step_from;
  st = o.json ? stab_probe_json(p, &ro, &text, &len) : stab_probe_table(p, &ro, &text, &len);
  if (st != STAB_OK) {
    cli_error("%s", stab_last_error());
    rc = 1;
    goto out;
  }
  if (fwrite(text, 1, len, stdout) != len || fflush(stdout) != 0 || ferror(stdout)) {
    cli_error("error writing the output");
    rc = 1;
  }
  goto out;
oom:
  cli_error("out of memory");
  rc = 1;
out:
  free(text), free(rows), free(owner), free(items), free(mine);
  gathered_free(&g, n);
  stab_probe_free(p);
  for (size_t i = 0; i < watch.npaths; i++) free(watch.paths[i]);
  free(watch.paths), free(watch.spans);
  for (size_t i = 0; i < o.nkinds; i++) free((char *)o.kinds[i].glob);
  for (size_t i = 0; i < o.nlayouts; i++) free((char *)o.layouts[i].glob);
  free(o.kinds), free(o.layouts), free(o.filters);
  return probe_ranks_finish(&job, rc);
}
