/* train.c — trains the byte-level transformer of model.c on the built-in corpus or a file,
 * with AdamW or the articles' steepest descent, and measures every layer's stability with a
 * stab_monitor every K steps (weights after the step, update of the step). Progress on
 * stderr, results on stdout; the final weights as safetensors in --out. */
#include "cli.h"
#include "clock.h"
#include "data.h"
#include "model.h"
#include "model_tp.h"
#include "optim.h"
#include "stabmeter.h"
#include "train_tp.h"
#include "train_world.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
  size_t width, depth, heads, context, batch, steps, warmup, metrics_every, corpus_bytes;
  size_t checkpoint_every;
  double lr, min_lr_frac;
  double alarm; /* --alarm X: a ratio to the layer's reference above X; 0 = none */
  double alarm_limit[8]; /* --alarm-limit KIND=X, per stab_kind: forward or dependency above X; 0 = none */
  optim_kind optimizer;
  int lr_given, warmup_given;
  uint64_t seed;
  int biases, untied;
  int attn_inverse;  /* --attn-scale inverse: logits scaled by 1/d_h, not 1/sqrt(d_h) */
  size_t head_dim;   /* --head-dim N: heads = width / N at every width; 0 without it */
  int heads_given;
  int print_metrics; /* the last measurement of every layer, as a table on stdout */
  size_t flush_every; /* trace rows written and flushed every this many measurements; 0: the
                        library's default (a writer thread, at most a second behind) */
  stab_trace_on_error trace_errors;
  const char *out, *data;
  const char *resume; /* a safetensors checkpoint of this trainer to start from */
  size_t sweep[16], n_sweep; /* --sweep-widths: train once per width, each into out/width-W */
  double sweep_lr[16];       /* --sweep-lrs: train once per learning rate, into out/lr-X */
  size_t n_sweep_lr;
  int replace;       /* --replace: an earlier run in --out is replaced (else refused, or with
                        --resume continued) */
  int data_parallel; /* --data-parallel: under mpirun, each rank a slice of every batch */
  size_t tensor_parallel; /* --tensor-parallel P: under mpirun -np P, each rank a slice of every
                             linear layer; 0 without it */
} options;

/* ---- options --------------------------------------------------------------------- */

#ifndef STAB_DOCDIR /* set by Makefile.am: where docs/manual/metrics.md is installed */
#define STAB_DOCDIR "/usr/local/share/doc/stabmeter"
#endif

static void usage(void) {
  printf("Usage: %s [OPTION]...\n"
         "Trains a byte-level decoder-only transformer (GPT-2 layout) on a built-in corpus or a\n"
         "file, and measures every layer's forward, dependency and update stability as it trains.\n"
         "The metrics and the trace's datasets are defined in docs/manual/metrics.md (installed\n"
         "as " STAB_DOCDIR "/docs/manual/metrics.md). Progress on stderr, results on stdout.\n"
         "\n"
         "Model:\n"
         "      --width D              width, 1..8192 (default 128)\n"
         "      --depth L              blocks, 1..256 (default 4)\n"
         "      --heads H              attention heads, dividing D (default 4)\n"
         "      --head-dim N           head dimension d_h instead: heads = D / N (N divides D; not\n"
         "                             with --heads); in --sweep-widths the heads grow with the\n"
         "                             width and d_h stays N, where fixed heads let d_h grow\n"
         "      --attn-scale S         the attention logits' scale: sqrt (1/sqrt(d_h), GPT-2,\n"
         "                             default) or inverse (1/d_h, muP). The logit bound is\n"
         "                             s d_h F_q F_k: with sqrt and fixed heads s d_h grows as\n"
         "                             sqrt(d_h) with the width; inverse, or a fixed --head-dim,\n"
         "                             keeps s d_h the same at every width\n"
         "      --context T            sequence length, 1..4096 (default 64)\n"
         "      --biases               biases in every linear layer\n"
         "      --untied               an LM head of its own instead of the embedding\n"
         "\n"
         "Training:\n"
         "      --batch B              sequences per step, 1..4096 (default 16)\n"
         "      --steps N              optimizer steps (default 300)\n"
         "      --optimizer NAME       adamw (std 0.02 init, default) or steepest (the articles'\n"
         "                             init and per-kind steepest descent: Muon, normalised SGD,\n"
         "                             SignSGD)\n"
         "      --lr X                 peak learning rate, in (0, 10) (default 3e-3 adamw, 0.1\n"
         "                             steepest)\n"
         "      --warmup N             linear warmup steps, then cosine to lr/10 (default N/10,\n"
         "                             at most 100)\n"
         "      --seed S               seed of the init and of the batches (default 1)\n"
         "      --resume FILE          start from a checkpoint of this program: weights, step, and\n"
         "                             with adamw the moments saved beside it (FILE without\n"
         "                             .safetensors, plus .adamw), so the run goes on as if never\n"
         "                             stopped; the trace's rows after the step are replaced.\n"
         "                             --optimizer, --lr and --seed must be the checkpoint's\n"
         "                             (the trace's run_config holds one set): others are\n"
         "                             refused (exit 2)\n"
         "      --data FILE            train on FILE (a regular file): bytes, or an llm.c .bin\n"
         "                             token file (default: the built-in corpus)\n"
         "      --corpus-bytes N       size of the built-in corpus, at most 2^32 (default 524288)\n"
         "\n"
         "Measurement and output:\n"
         "      --metrics-every K      measure every layer every K steps, 0 = never (default 1)\n"
         "      --out DIR              write DIR/trace.h5 (every measured step) and\n"
         "                             DIR/model.safetensors at the end (default: nothing);\n"
         "                             DIR is created, and must be a directory if it exists.\n"
         "                             An earlier run in DIR (its trace, model or step-N\n"
         "                             checkpoints) is never replaced unasked: refused (exit 2)\n"
         "                             unless --resume continues it or --replace is given\n"
         "      --replace              replace the earlier run in --out DIR: its trace, its\n"
         "                             model and every step-N checkpoint (removed before the\n"
         "                             first step); with a sweep, every run's and the CSV\n"
         "      --flush-every N        write and flush the trace every N measurements, 1..1000000\n"
         "                             (default: written in the background at most once a\n"
         "                             second; a crash loses at most the last second measured)\n"
         "      --trace-errors WHAT    after a trace write fails: stop (default) or continue\n"
         "                             without the trace\n"
         "      --print-metrics        print every layer's last metrics as a table at the end\n"
         "      --alarm X              report once per layer when its forward, dependency or\n"
         "                             update stability is more than X > 0 times its value at\n"
         "                             the first measured step (its reference; the update's per\n"
         "                             unit of learning rate, so that warmup is no alarm), or\n"
         "                             turns non-finite; non-finite weights are reported always\n"
         "      --alarm-limit KIND=X   report once per layer of KIND (linear, embedding, lm_head,\n"
         "                             gain, bias, attention) when its forward or dependency\n"
         "                             stability exceeds X > 0; repeatable, one per kind\n"
         "      --checkpoint-every N   also DIR/step-N.safetensors every N steps (default 0 =\n"
         "                             never); with adamw each checkpoint has its moments in\n"
         "                             step-N.adamw\n"
         "      --sweep-widths LIST    train the same model once per width (e.g. 64,128,256,512),\n"
         "                             each into DIR/width-W/, and print each layer kind's metrics\n"
         "                             against width with the fitted log-log slope (muP's\n"
         "                             coordinate check); needs --out DIR\n"
         "      --sweep-lrs LIST       train once per peak learning rate (e.g. 0.01,0.03,0.1,0.3,1),\n"
         "                             each into DIR/lr-X/ (with --sweep-widths, every width of\n"
         "                             each: DIR/lr-X/width-W/); a run whose loss turns non-finite\n"
         "                             is recorded as diverged and the sweep goes on; writes\n"
         "                             DIR/lr-sweep.csv (a row per run, as it ends; an existing\n"
         "                             one with the same columns gets the new rows after its\n"
         "                             own, one with others is refused) and prints the\n"
         "                             held-out loss per rate and width, and the best rate per\n"
         "                             width; needs --out DIR, not with --lr\n"
         "\n"
         "Parallel (a build configured --with-mpi):\n"
         "      --data-parallel        under mpirun -np P: every rank holds the whole model and\n"
         "                             trains on its share of each batch (B/P sequences, the\n"
         "                             first B%%P ranks one more); the gradients are summed in\n"
         "                             rank order, so every rank has the same weights after\n"
         "                             every step; the monitor's layers are divided among the\n"
         "                             ranks; rank 0 alone prints and writes --out\n"
         "      --tensor-parallel P    under mpirun -np P: every linear layer split among the P\n"
         "                             ranks (attention by heads, mlp.c_fc by rows, the\n"
         "                             projections by columns; the rest replicated), each rank\n"
         "                             running every batch; the monitor measures each split\n"
         "                             layer whole; rank 0 alone prints and writes --out, the\n"
         "                             same trace and checkpoints as one process (adamw only;\n"
         "                             P divides --heads and --width)\n"
         "  -h, --help                 print this help and exit\n"
         "  -V, --version              print the version and exit\n"
         "\n"
         "Exit status:\n"
         "  0  success\n"
         "  1  failure (e.g. the loss diverged, a write failed)\n"
         "  2  bad usage or bad input: an option value, a --data or --resume path that is\n"
         "     missing or not a regular file, a file that does not fit or was trained with\n"
         "     other settings, an --out that is not a directory or holds an earlier run\n",
         cli_name);
}

/* "0.01,0.1,1": 2 to 16 learning rates, each in (0, 10), increasing. */
static int parse_lrs(const char *s, options *o) {
  o->n_sweep_lr = 0;
  for (const char *p = s;;) {
    char *end;
    errno = 0;
    double lr = strtod(p, &end);
    if (errno || end == p || !(lr > 0 && lr < 10) || o->n_sweep_lr == 16 ||
        (o->n_sweep_lr && lr <= o->sweep_lr[o->n_sweep_lr - 1]))
      return -1;
    o->sweep_lr[o->n_sweep_lr++] = lr;
    if (!*end) return o->n_sweep_lr < 2 ? -1 : 0;
    if (*end != ',') return -1;
    p = end + 1;
  }
}

/* "64,128,256": up to 16 widths, each in 1..8192, increasing. */
static int parse_widths(const char *s, options *o) {
  o->n_sweep = 0;
  for (const char *p = s;;) {
    char *end;
    errno = 0;
    unsigned long long w = strtoull(p, &end, 10);
    if (errno || end == p || *p == '-' || !w || w > 8192 || o->n_sweep == 16 ||
        (o->n_sweep && w <= o->sweep[o->n_sweep - 1]))
      return -1;
    o->sweep[o->n_sweep++] = (size_t)w;
    if (!*end) return o->n_sweep < 2 ? -1 : 0;
    if (*end != ',') return -1;
    p = end + 1;
  }
}

/* --alarm-limit KIND=X: KIND as stab_kind_name spells it, X > 0. */
static int parse_alarm_limit(const char *arg, options *o) {
  const char *eq = strchr(arg, '=');
  char kinds[128] = "";
  size_t n = 0;
  for (int k = 0; stab_kind_name((stab_kind)k); k++) {
    const char *name = stab_kind_name((stab_kind)k);
    n += (size_t)snprintf(kinds + n, sizeof kinds - n, "%s%s", k ? ", " : "", name);
    if (eq && (size_t)(eq - arg) == strlen(name) && !strncmp(arg, name, strlen(name)))
      return cli_real("--alarm-limit", eq + 1, 0, 1, 1e300, 0, &o->alarm_limit[k]);
  }
  char want[192];
  snprintf(want, sizeof want, "KIND=X, KIND one of %s", kinds);
  return cli_bad_value("--alarm-limit", arg, want);
}

static int parse(int argc, char **argv, options *o) {
  enum { O_BIASES = 256, O_UNTIED, O_WARMUP, O_METRICS, O_CORPUS, O_DATA, O_CKPT, O_ALARM, O_PRINT,
         O_RESUME, O_FLUSH, O_TRACE_ERRORS, O_SWEEP, O_DATA_PARALLEL, O_TENSOR_PARALLEL,
         O_HEAD_DIM, O_ATTN_SCALE, O_SWEEP_LRS, O_ALARM_LIMIT, O_REPLACE };
  static const struct option longs[] = {
      {"width", required_argument, 0, 'w'},     {"depth", required_argument, 0, 'l'},
      {"heads", required_argument, 0, 'H'},     {"context", required_argument, 0, 'T'},
      {"batch", required_argument, 0, 'B'},     {"steps", required_argument, 0, 'n'},
      {"lr", required_argument, 0, 'r'},        {"optimizer", required_argument, 0, 'o'},
      {"seed", required_argument, 0, 'S'},      {"out", required_argument, 0, 'O'},
      {"biases", no_argument, 0, O_BIASES},     {"untied", no_argument, 0, O_UNTIED},
      {"warmup", required_argument, 0, O_WARMUP}, {"metrics-every", required_argument, 0, O_METRICS},
      {"corpus-bytes", required_argument, 0, O_CORPUS}, {"data", required_argument, 0, O_DATA},
      {"checkpoint-every", required_argument, 0, O_CKPT},
      {"alarm", required_argument, 0, O_ALARM},
      {"alarm-limit", required_argument, 0, O_ALARM_LIMIT},
      {"replace", no_argument, 0, O_REPLACE},
      {"print-metrics", no_argument, 0, O_PRINT},
      {"resume", required_argument, 0, O_RESUME},
      {"flush-every", required_argument, 0, O_FLUSH},
      {"trace-errors", required_argument, 0, O_TRACE_ERRORS},
      {"sweep-widths", required_argument, 0, O_SWEEP},
      {"sweep-lrs", required_argument, 0, O_SWEEP_LRS},
      {"data-parallel", no_argument, 0, O_DATA_PARALLEL},
      {"tensor-parallel", required_argument, 0, O_TENSOR_PARALLEL},
      {"head-dim", required_argument, 0, O_HEAD_DIM},
      {"attn-scale", required_argument, 0, O_ATTN_SCALE},
      {"help", no_argument, 0, 'h'},            {"version", no_argument, 0, 'V'},
      {0, 0, 0, 0}};
  *o = (options){.width = 128, .depth = 4, .heads = 4, .context = 64, .batch = 16, .steps = 300,
                 .metrics_every = 1, .corpus_bytes = 524288, .min_lr_frac = 0.1, .seed = 1,
                 .flush_every = 0, .trace_errors = STAB_TRACE_STOP};
  static const char *const trace_errors[] = {"stop", "continue", NULL};
  static const char *const optimizers[] = {"adamw", "steepest", NULL};
  static const char *const attn_scales[] = {"sqrt", "inverse", NULL};
  int c, which;
  unsigned long long v = 0;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS, longs, NULL)) != -1) {
    int rc = 0;
    switch (c) {
    case 'w': if (!(rc = cli_whole("--width", optarg, 1, 8192, &v))) o->width = v; break;
    case 'l': if (!(rc = cli_whole("--depth", optarg, 1, 256, &v))) o->depth = v; break;
    case 'H': if (!(rc = cli_whole("--heads", optarg, 1, 8192, &v))) o->heads = v, o->heads_given = 1; break;
    case O_HEAD_DIM: if (!(rc = cli_whole("--head-dim", optarg, 1, 8192, &v))) o->head_dim = v; break;
    case O_ATTN_SCALE:
      if (!(rc = cli_choice("--attn-scale", optarg, attn_scales, &which))) o->attn_inverse = which;
      break;
    case 'T': if (!(rc = cli_whole("--context", optarg, 1, 4096, &v))) o->context = v; break;
    case 'B': if (!(rc = cli_whole("--batch", optarg, 1, 4096, &v))) o->batch = v; break;
    case 'n': if (!(rc = cli_whole("--steps", optarg, 1, 100000000, &v))) o->steps = v; break;
    case O_WARMUP:
      if (!(rc = cli_whole("--warmup", optarg, 0, 100000000, &v))) o->warmup = v, o->warmup_given = 1;
      break;
    case O_METRICS: if (!(rc = cli_whole("--metrics-every", optarg, 0, 100000000, &v))) o->metrics_every = v; break;
    case O_CORPUS:
      if (!(rc = cli_whole("--corpus-bytes", optarg, 0, (unsigned long long)1 << 32, &v))) o->corpus_bytes = v;
      break;
    case O_CKPT: if (!(rc = cli_whole("--checkpoint-every", optarg, 0, 100000000, &v))) o->checkpoint_every = v; break;
    case O_FLUSH: if (!(rc = cli_whole("--flush-every", optarg, 1, 1000000, &v))) o->flush_every = v; break;
    case O_TRACE_ERRORS:
      if (!(rc = cli_choice("--trace-errors", optarg, trace_errors, &which)))
        o->trace_errors = which ? STAB_TRACE_CONTINUE : STAB_TRACE_STOP;
      break;
    case 'S': if (!(rc = cli_whole("--seed", optarg, 0, UINT64_MAX, &v))) o->seed = v; break;
    case 'r': rc = cli_real("--lr", optarg, 0, 1, 10, 1, &o->lr), o->lr_given = 1; break;
    case O_ALARM: rc = cli_real("--alarm", optarg, 0, 1, 1e300, 0, &o->alarm); break;
    case O_ALARM_LIMIT: rc = parse_alarm_limit(optarg, o); break;
    case 'o':
      if (!(rc = cli_choice("--optimizer", optarg, optimizers, &which)))
        o->optimizer = which ? OPTIM_STEEPEST : OPTIM_ADAMW;
      break;
    case 'O': o->out = optarg; break;
    case O_DATA: o->data = optarg; break;
    case O_RESUME: o->resume = optarg; break;
    case O_SWEEP:
      if (parse_widths(optarg, o))
        rc = cli_bad_value("--sweep-widths", optarg, "2 to 16 increasing widths in 1..8192, comma-separated");
      break;
    case O_SWEEP_LRS:
      if (parse_lrs(optarg, o))
        rc = cli_bad_value("--sweep-lrs", optarg, "2 to 16 increasing learning rates in (0, 10), comma-separated");
      break;
    case O_BIASES: o->biases = 1; break;
    case O_UNTIED: o->untied = 1; break;
    case O_PRINT: o->print_metrics = 1; break;
    case O_REPLACE: o->replace = 1; break;
    case O_DATA_PARALLEL:
      if (TRAIN_WITH_MPI) o->data_parallel = 1;
      else rc = cli_usage_error("--data-parallel: built without MPI: ./configure --with-mpi");
      break;
    case O_TENSOR_PARALLEL:
      if (!TRAIN_WITH_MPI) rc = cli_usage_error("--tensor-parallel: built without MPI: ./configure --with-mpi");
      else if (!(rc = cli_whole("--tensor-parallel", optarg, 1, 8192, &v))) o->tensor_parallel = v;
      break;
    case 'h': usage(); return -1;
    case 'V': cli_version(); return -1;
    default: return cli_getopt_error(c, argv);
    }
    if (rc) return rc;
  }
  if (optind < argc) return cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (o->head_dim) {
    if (o->heads_given)
      return cli_usage_error("--heads %zu and --head-dim %zu: one or the other (heads = width / head dim)",
                             o->heads, o->head_dim);
    if (o->width % o->head_dim)
      return cli_usage_error("--head-dim %zu does not divide --width %zu", o->head_dim, o->width);
    for (size_t i = 0; i < o->n_sweep; i++)
      if (o->sweep[i] % o->head_dim)
        return cli_usage_error("--sweep-widths: width %zu is not divisible by --head-dim %zu", o->sweep[i],
                               o->head_dim);
    o->heads = o->width / o->head_dim;
  }
  if (o->width % o->heads)
    return cli_usage_error("--width %zu is not divisible by --heads %zu", o->width, o->heads);
  if (o->checkpoint_every && !o->out) return cli_usage_error("--checkpoint-every needs --out DIR");
  if (o->tensor_parallel) {
    size_t P = o->tensor_parallel;
    if (o->data_parallel)
      return cli_usage_error("--tensor-parallel and --data-parallel: one or the other (each uses every rank)");
    /* Muon's step is msign of the whole matrix: a rank's slice of it is not a slice of msign */
    if (o->optimizer == OPTIM_STEEPEST)
      return cli_usage_error("--tensor-parallel with --optimizer steepest: its step needs each linear "
                             "layer's whole gradient (msign); use adamw");
    if (o->heads % P)
      return cli_usage_error("--tensor-parallel %zu does not divide --heads %zu: each rank takes whole heads", P,
                             o->heads);
    if (o->width % P)
      return cli_usage_error("--tensor-parallel %zu does not divide --width %zu", P, o->width);
    for (size_t i = 0; i < o->n_sweep; i++)
      if (o->sweep[i] % P)
        return cli_usage_error("--sweep-widths: width %zu is not divisible by --tensor-parallel %zu", o->sweep[i], P);
      else if (o->head_dim && (o->sweep[i] / o->head_dim) % P)
        return cli_usage_error("--sweep-widths: width %zu has %zu heads of --head-dim %zu, not divisible by "
                               "--tensor-parallel %zu", o->sweep[i], o->sweep[i] / o->head_dim, o->head_dim, P);
  }
  if (o->replace && !o->out) return cli_usage_error("--replace needs --out DIR (what it replaces)");
  if (o->replace && o->resume)
    return cli_usage_error("--replace and --resume: one or the other (--resume continues the run in --out, "
                           "--replace starts it again)");
  if (o->n_sweep && (!o->out || o->resume))
    return cli_usage_error("--sweep-widths needs --out DIR (and cannot --resume)");
  if (o->n_sweep_lr && (!o->out || o->resume))
    return cli_usage_error("--sweep-lrs needs --out DIR (and cannot --resume)");
  if (o->n_sweep_lr && o->lr_given)
    return cli_usage_error("--sweep-lrs and --lr: one or the other (the sweep gives each run its rate)");
  for (size_t i = 0; i < o->n_sweep && !o->head_dim; i++)
    if (o->sweep[i] % o->heads)
      return cli_usage_error("--sweep-widths: width %zu is not divisible by --heads %zu", o->sweep[i], o->heads);
  if (!o->lr_given) o->lr = o->optimizer == OPTIM_ADAMW ? 3e-3 : 0.1;
  if (!o->warmup_given) o->warmup = o->steps / 10 < 100 ? o->steps / 10 : 100;
  return 0;
}

/* Linear warmup to lr over `warmup` steps, then cosine down to lr * min_frac at the end. */
static double lr_at(const options *o, size_t step) {
  if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
  double span = (double)(o->steps - o->warmup), x = span > 0 ? (double)(step - o->warmup) / span : 1;
  double c = 0.5 * (1.0 + cos(M_PI * (x > 1 ? 1 : x)));
  return o->lr * (o->min_lr_frac + (1.0 - o->min_lr_frac) * c);
}

/* ---- the monitor ----------------------------------------------------------------- */

/* Registers every layer of the model: wte and wpe (embedding), per block ln_1 and ln_2
 * (gain), attn.c_attn (linear 3D x D, with its bias), the attention logits of its q and k
 * blocks, attn.c_proj, mlp.c_fc, mlp.c_proj (linear, with biases), ln_f (gain), lm_head (the
 * wte table when tied). Layer names are the tensor names without ".weight". */
static int register_layers(stab_monitor *mon, model *m, int external) {
  size_t D = m->c.width;
  char nm[96];
  stab_status st = STAB_OK;
  /* external: every layer whole, its metrics set from the ranks' measurements (train_tp.h);
   * the pointers, into the whole model's buffer, are not read but say which layers share
   * storage, as in one process's trace */
#define ADD(...)                                                                           \
  do {                                                                                     \
    stab_layer l_ = {__VA_ARGS__};                                                         \
    st = external ? stab_monitor_add_external(mon, &l_, NULL) : stab_monitor_add_layer(mon, &l_, NULL); \
    if (st != STAB_OK) goto fail;                                                          \
  } while (0)
  ADD(.name = "transformer.wte", .kind = STAB_KIND_EMBEDDING, .vocab = m->c.vocab, .width = D,
      .weight = model_wte(m, m->params));
  ADD(.name = "transformer.wpe", .kind = STAB_KIND_EMBEDDING, .vocab = m->c.context, .width = D,
      .weight = model_wpe(m, m->params));
  for (size_t l = 0; l < m->c.depth; l++) {
    model_block w = model_block_at(m, m->params, l);
#define NAME(s) (snprintf(nm, sizeof nm, "transformer.h.%zu.%s", l, s), nm)
    ADD(.name = NAME("ln_1"), .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = w.ln1w);
    ADD(.name = NAME("attn.c_attn"), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = 3 * D,
        .weight = w.qkvw, .bias = w.qkvb);
    ADD(.name = NAME("attn.logits"), .kind = STAB_KIND_ATTENTION, .d_in = D, .d_out = D,
        .heads = m->c.heads, .scale = model_attn_scale(&m->c), .weight = w.qkvw,
        .weight_k = w.qkvw + D * D);
    ADD(.name = NAME("attn.c_proj"), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D,
        .weight = w.attprojw, .bias = w.attprojb);
    ADD(.name = NAME("ln_2"), .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = w.ln2w);
    ADD(.name = NAME("mlp.c_fc"), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = 4 * D,
        .weight = w.fcw, .bias = w.fcb);
    ADD(.name = NAME("mlp.c_proj"), .kind = STAB_KIND_LINEAR, .d_in = 4 * D, .d_out = D,
        .weight = w.fcprojw, .bias = w.fcprojb);
#undef NAME
  }
  ADD(.name = "transformer.ln_f", .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D,
      .weight = model_lnf(m, m->params));
  ADD(.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = m->c.vocab, .width = D,
      .weight = model_head(m, m->params));
#undef ADD
  return 0;
fail:
  fprintf(stderr, "train: registering a layer with the monitor: %s (%s)\n", stab_last_error(),
          stab_strerror(st));
  return 1;
}

/* The largest of one metric over the layers (0 forward, 1 dependency, 2 update), and
 * where: the LM head is left out of forward and dependency (its headline values hold
 * log V and 2 d R, a different scale). A NaN from non-finite weights wins. */
static double worst(const stab_monitor *mon, int which, const char **name) {
  double best = -INFINITY;
  *name = "-";
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_layer *l = stab_monitor_layer(mon, i);
    const stab_metrics *x = stab_monitor_metrics(mon, i);
    if (which < 2 && l->kind == STAB_KIND_LM_HEAD) continue;
    double v = which == 0 ? x->forward : which == 1 ? x->dependency : x->update;
    int broken = x->flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE);
    if ((isnan(v) && broken) || v > best) {
      best = isnan(v) ? INFINITY : v;
      *name = l->name + (strncmp(l->name, "transformer.", 12) ? 0 : 12);
      if (isnan(v)) return NAN;
    }
  }
  return best;
}

/* What the alarms keep per monitor layer: which they have reported, and the learning rate of
 * the step the update's reference comes from. */
enum { SAID_RELATIVE = 1, SAID_LIMIT = 2 };
typedef struct {
  unsigned char said;
  double ref_lr; /* NaN until the monitor has an update reference */
} layer_alarm;

/* Reports, once per layer: non-finite weights or update (always); with --alarm X, a forward,
 * dependency or update stability more than X times the layer's reference (the monitor's: its
 * first finite value > 0), or turned non-finite, whatever the kind, its natural scale being
 * the reference's; with --alarm-limit KIND=X, a forward or dependency stability above X. The
 * update is judged per unit of learning rate: it grows with the rate through warmup, and an
 * alarm there would fire on every layer of a healthy run. lr: this step's. */
static void check_alarms(const stab_monitor *mon, const options *o, layer_alarm *la, size_t step, double lr,
                         int tty) {
  static const char *const metric[3] = {"forward", "dependency", "update"};
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_layer *l = stab_monitor_layer(mon, i);
    const stab_metrics *x = stab_monitor_metrics(mon, i), *ref = stab_monitor_reference(mon, i);
    layer_alarm *a = &la[i];
    if (isnan(a->ref_lr) && !isnan(ref->update)) a->ref_lr = lr; /* taken at this measurement */
    const char *kind = stab_kind_name(l->kind);
    const double value[3] = {x->forward, x->dependency, x->update}, base[3] = {ref->forward, ref->dependency, ref->update};
    if (!(a->said & SAID_RELATIVE)) {
      char what[320] = "";
      if (x->flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE))
        snprintf(what, sizeof what, "has non-finite weights or update: forward %.4g, dependency %.4g, update %.4g",
                 x->forward, x->dependency, x->update);
      for (int j = 0; j < 3 && !what[0] && o->alarm > 0; j++) {
        if (isnan(base[j])) continue; /* no reference yet: the metric is not defined, or not seen > 0 */
        if (!isfinite(value[j]))
          snprintf(what, sizeof what, "%s turned %g (its reference %.6g)", metric[j], value[j], base[j]);
        else if (j < 2 && value[j] / base[j] > o->alarm)
          snprintf(what, sizeof what, "%s %.6g is %.6g times its reference %.6g (--alarm %g)", metric[j], value[j],
                   value[j] / base[j], base[j], o->alarm);
        else if (j == 2 && (value[j] / lr) / (base[j] / a->ref_lr) > o->alarm)
          snprintf(what, sizeof what, "update %.6g at lr %.4g is %.6g times its reference %.6g at lr %.4g, per unit "
                   "of learning rate (--alarm %g)", value[j], lr, (value[j] / lr) / (base[j] / a->ref_lr), base[j],
                   a->ref_lr, o->alarm);
      }
      if (what[0]) {
        a->said |= SAID_RELATIVE;
        fputs(tty ? "\r\033[K" : "", stderr);
        cli_error("alarm at step %zu: %s (%s) %s", step, l->name, kind, what);
      }
    }
    const double limit = o->alarm_limit[l->kind];
    for (int j = 0; j < 2 && limit > 0 && !(a->said & SAID_LIMIT); j++)
      if (value[j] > limit) {
        a->said |= SAID_LIMIT;
        fputs(tty ? "\r\033[K" : "", stderr);
        cli_error("alarm at step %zu: %s (%s) %s %.6g exceeds --alarm-limit %s=%g", step, l->name, kind, metric[j],
                  value[j], kind, limit);
      }
  }
}

/* Per block: RMS of the residual stream after it and |cos(h, 1)|, averaged over positions
 * (the RMSNorm article's mean-drift signal). */
static void block_stats(const float *h, size_t N, size_t D, double *rms, double *cos1) {
  double r = 0, c = 0;
  for (size_t i = 0; i < N; i++) {
    double ss = 0, s = 0;
    for (size_t d = 0; d < D; d++) ss += (double)h[i * D + d] * h[i * D + d], s += h[i * D + d];
    r += sqrt(ss / (double)D);
    c += ss > 0 ? fabs(s) / sqrt(ss * (double)D) : 0;
  }
  *rms = r / (double)N, *cos1 = c / (double)N;
}

/* ---- trace ----------------------------------------------------------------------- */

/* The block a monitor layer belongs to ("transformer.h.<l>."), or -1 (embedding, final norm,
 * head): its rows of act_rms and act_cos1 come from that block's residual stream. */
static long layer_block(const char *name) {
  size_t l;
  int n = 0;
  if (sscanf(name, "transformer.h.%zu.%n", &l, &n) == 1 && n > 0) return (long)l;
  return -1;
}

/* The run's settings as the trace's run_config attribute (JSON), with the parallel layout: ranks
 * in all, how many hold a replica (data parallel) and how many share each layer (tensor
 * parallel): 1, 1, 1 for one process. */
static void run_config(char *buf, size_t n, const options *o, const model *m, int ranks) {
  int tp = o->tensor_parallel ? ranks : 1, dp = o->tensor_parallel ? 1 : ranks;
  snprintf(buf, n,
           "{\"program\": \"stabmeter train\", \"model\": {\"vocab\": %zu, \"width\": %zu, "
           "\"depth\": %zu, \"heads\": %zu, \"context\": %zu, \"biases\": %s, \"tied\": %s, "
           "\"parameters\": %zu, \"attn_scale\": \"%s\"}, \"optimizer\": \"%s\", \"lr\": %g, \"warmup\": %zu, "
           "\"min_lr_frac\": %g, \"batch\": %zu, \"steps\": %zu, \"seed\": %llu, "
           "\"metrics_every\": %zu, \"data\": \"%s\", \"ranks\": %d, \"data_parallel\": %d, "
           "\"tensor_parallel\": %d}",
           m->c.vocab, o->width, o->depth, o->heads, o->context, o->biases ? "true" : "false",
           o->untied ? "false" : "true", m->n_params, m->c.attn_inverse ? "inverse" : "sqrt",
           o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", o->lr, o->warmup, o->min_lr_frac,
           o->batch, o->steps, (unsigned long long)o->seed, o->metrics_every,
           o->data ? "file" : "built-in", ranks, dp, tp);
}

/* ---- checkpoint ------------------------------------------------------------------ */

static int mkdirs(const char *path) {
  char p[4096];
  if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return -1;
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      if (mkdir(p, 0777) && errno != EEXIST) return -1;
      *s = '/';
    }
  return mkdir(p, 0777) && errno != EEXIST ? -1 : 0;
}

/* What a path that is there but of the wrong type is, for the messages of check_out. */
static const char *path_type(mode_t mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISREG(mode) ? "a regular file"
         : S_ISCHR(mode) || S_ISBLK(mode) ? "a device" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

/* --out DIR, checked before the run spends any time: DIR must be a directory if it exists (or
 * be creatable: no component of it a file), and DIR/trace.h5, when a trace is written, a regular
 * file if it exists. Anything else is bad input: the message and 2; else 0. (mkdir of an
 * existing file fails with EEXIST, which mkdirs takes for a directory already there; and the
 * trace writer refuses a FIFO or a directory at its path only after the model is built.) */
static int check_out(const char *dir, int with_trace) {
  struct stat sb;
  char trace[4200];
  if (stat(dir, &sb) != 0) {
    if (errno != ENOTDIR) return 0; /* missing: created; other errors: said when creating it */
    cli_error("--out %s: cannot create the directory: a component of the path is not a directory", dir);
    return CLI_USAGE;
  }
  if (!S_ISDIR(sb.st_mode)) {
    cli_error("--out %s: not a directory: it is %s", dir, path_type(sb.st_mode));
    return CLI_USAGE;
  }
  snprintf(trace, sizeof trace, "%s/trace.h5", dir);
  if (with_trace && stat(trace, &sb) == 0 && !S_ISREG(sb.st_mode)) {
    cli_error("%s: not a regular file: it is %s; the trace cannot go there (remove it, or give "
              "another --out)", trace, path_type(sb.st_mode));
    return CLI_USAGE;
  }
  return 0;
}

/* 1 when name is one of the files a run of this program leaves in its --out: trace.h5,
 * model.safetensors and model.adamw, step-N.safetensors and step-N.adamw. */
static int run_file(const char *name) {
  if (!strcmp(name, "trace.h5") || !strcmp(name, "model.safetensors") || !strcmp(name, "model.adamw")) return 1;
  if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return 0;
  const char *ext = name + 5 + strspn(name + 5, "0123456789");
  return !strcmp(ext, ".safetensors") || !strcmp(ext, ".adamw");
}

/* The files of an earlier run in --out DIR, under the one rule for results already there
 * (stab_output_check): a new run (mode STAB_OUTPUT_NEW: neither --resume nor --replace) refuses
 * them all, named, before any time is spent, and keeps them; --resume (APPEND) continues that
 * run and --replace (REPLACE) replaces it, so both go on. Returns 0, or 2 with the message. */
static int check_earlier_run(const char *dir, stab_output_mode mode) {
  DIR *d = opendir(dir);
  if (!d) return 0; /* missing: created; other failures: said when creating it */
  char first[3][256], path[4400];
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!run_file(e->d_name) || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    if (stab_output_check(path, mode, "a result of an earlier run") != STAB_EEXIST) continue;
    if (n < 3) snprintf(first[n], sizeof first[n], "%s", e->d_name);
    n++;
  }
  closedir(d);
  if (!n) return 0;
  char list[900];
  snprintf(list, sizeof list, "%s%s%s%s%s%s", first[0], n > 1 ? ", " : "", n > 1 ? first[1] : "",
           n > 2 ? ", " : "", n > 2 ? first[2] : "", n > 3 ? ", ..." : "");
  cli_error("--out %s holds an earlier run (%zu file%s: %s): kept as it is; --resume CHECKPOINT continues it, "
            "--replace replaces it, or give another --out", dir, n, n == 1 ? "" : "s", list);
  return CLI_USAGE;
}

/* --replace: the earlier run's files in DIR removed (the trace but when keep_trace: the new
 * trace has replaced it already), so that none of its checkpoints is left beside the new run's.
 * Returns 0, or 1 with the message. */
static int remove_earlier_run(const char *dir, int keep_trace) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  char path[4400];
  int rc = 0;
  for (struct dirent *e; (e = readdir(d)) && !rc;) {
    if (!run_file(e->d_name) || (keep_trace && !strcmp(e->d_name, "trace.h5"))) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && errno != ENOENT) {
      cli_error("--replace: cannot remove %s: %s", path, strerror(errno));
      rc = 1;
    }
  }
  closedir(d);
  return rc;
}

/* What --out's files may meet: an earlier run replaced, continued or refused. */
static stab_output_mode out_mode(const options *o) {
  return o->replace ? STAB_OUTPUT_REPLACE : o->resume ? STAB_OUTPUT_APPEND : STAB_OUTPUT_NEW;
}

/* A checkpoint holds one or more copies of the model's tensor table: the weights (prefix ""),
 * or AdamW's moments ("exp_avg." and "exp_avg_sq."), each a flat buffer laid out like
 * m->params. */
typedef struct {
  const char *prefix;
  float *data; /* (n_params) */
} ckpt_part;

/* safetensors: 8-byte little-endian header length, the JSON header (name -> dtype, shape,
 * data_offsets; padded with spaces to a multiple of 8), then the F32 data of each part in
 * table order. A tied head is not stored (as in Hugging Face checkpoints: lm_head.weight is
 * transformer.wte.weight). */
static int save_safetensors(const model *m, const char *path, const options *o, size_t steps,
                            const ckpt_part *parts, size_t n_parts) {
  size_t cap = 256 + n_parts * m->n_tensors * 220, len = 0, off = 0;
  char *h = malloc(cap);
  if (!h) return -1;
  len += (size_t)snprintf(h + len, cap - len,
                          "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"stabmeter-train %s\","
                          "\"optimizer\":\"%s\",\"steps\":\"%zu\",\"tied\":\"%s\",\"heads\":\"%zu\","
                          "\"attn_scale\":\"%s\",\"lr\":\"%.17g\",\"seed\":\"%llu\"}",
                          stab_version(), o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest",
                          steps, m->c.untied ? "false" : "true", m->c.heads,
                          m->c.attn_inverse ? "inverse" : "sqrt", o->lr, (unsigned long long)o->seed);
  for (size_t p = 0; p < n_parts; p++)
    for (size_t i = 0; i < m->n_tensors; i++) {
      const model_tensor *t = &m->tensors[i];
      char shape[64];
      if (t->rows == 1) snprintf(shape, sizeof shape, "[%zu]", t->cols);
      else snprintf(shape, sizeof shape, "[%zu,%zu]", t->rows, t->cols);
      len += (size_t)snprintf(h + len, cap - len,
                              ",\"%s%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              parts[p].prefix, t->name, shape, off, off + t->size * 4);
      off += t->size * 4;
    }
  len += (size_t)snprintf(h + len, cap - len, "}");
  while (len % 8) h[len++] = ' ';
  /* Written beside and renamed over: a crash never leaves a half checkpoint under path. */
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int rc = -1;
  if (f) {
    unsigned char n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(n8, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
    /* tensors are stored in table order, contiguous: exactly the flat buffer */
    for (size_t p = 0; p < n_parts && ok; p++)
      ok = fwrite(parts[p].data, sizeof(float), m->n_params, f) == m->n_params;
    rc = (fclose(f) == 0 && ok && rename(tmp, path) == 0) ? 0 : -1;
    if (rc) remove(tmp);
  }
  free(h);
  return rc;
}

/* The AdamW moments file of a checkpoint: "x/step-000100.safetensors" -> "x/step-000100.adamw". */
static int moments_path(char *buf, size_t n, const char *checkpoint) {
  size_t len = strlen(checkpoint), ext = strlen(".safetensors");
  if (len > ext && !strcmp(checkpoint + len - ext, ".safetensors")) len -= ext;
  return snprintf(buf, n, "%.*s.adamw", (int)len, checkpoint) < (int)n ? 0 : -1;
}

/* DIR/name (and, with adamw, its moments beside it), creating DIR; the failure on stderr. */
static int checkpoint(const model *m, float *exp_avg, float *exp_avg_sq, const options *o, const char *name,
                      size_t steps) {
  char path[4200], mpath[4300];
  snprintf(path, sizeof path, "%s/%s", o->out, name);
  ckpt_part weights = {"", m->params};
  ckpt_part moments[2] = {{"exp_avg.", exp_avg}, {"exp_avg_sq.", exp_avg_sq}};
  if (mkdirs(o->out) || save_safetensors(m, path, o, steps, &weights, 1)) {
    cli_error("cannot write %s: %s", path, strerror(errno));
    return 1;
  }
  if (exp_avg && (moments_path(mpath, sizeof mpath, path) ||
                 save_safetensors(m, mpath, o, steps, moments, 2))) {
    cli_error("cannot write %s: %s", mpath, strerror(errno));
    return 1;
  }
  return 0;
}

/* Reads a file written by save_safetensors into the parts' buffers: every tensor of the model
 * must be there under each part's prefix, F32, with its shape. *steps receives the metadata's
 * step count. Returns 0, 2 for a path that is not a regular file that can be opened (see
 * stab_input_open) or a file that does not fit the model (the message names the file and the
 * tensor or field), 1 when it cannot be read. */
/* The run's settings that a resumed run must share with its checkpoint: a trace's run_config
 * holds one optimizer, learning rate and seed for all its rows, and the run would not go on as
 * if never stopped with others. A field the checkpoint lacks predates it: not checked. Returns
 * 0, or 2 with the message in err. */
static int check_settings(const char *h, const char *path, const options *o, char *err, size_t errlen) {
  char has[3][64] = {"", "", ""}, want[3][64];
  static const char *const key[3] = {"\"optimizer\":\"", "\"lr\":\"", "\"seed\":\""};
  static const char *const option[3] = {"--optimizer", "--lr", "--seed"};
  snprintf(want[0], sizeof want[0], "%s", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest");
  snprintf(want[1], sizeof want[1], "%g", o->lr);
  snprintf(want[2], sizeof want[2], "%llu", (unsigned long long)o->seed);
  for (int i = 0; i < 3; i++) {
    const char *f = strstr(h, key[i]);
    if (!f) continue;
    f += strlen(key[i]);
    snprintf(has[i], sizeof has[i], "%.*s", (int)strcspn(f, "\""), f);
    int same = i == 0 ? !strcmp(has[i], want[i])
               : i == 1 ? strtod(has[i], NULL) == o->lr
                        : strtoull(has[i], NULL, 10) == o->seed && has[i][0] >= '0' && has[i][0] <= '9';
    if (!same) {
      if (i == 1) snprintf(has[i], sizeof has[i], "%g", strtod(has[i], NULL));
      snprintf(err, errlen, "%s: __metadata__ %s is %s, the run has %s %s%s: a resumed run goes on with its "
               "checkpoint's optimizer, learning rate and seed (give %s %s, or start a new run)", path,
               i == 0 ? "optimizer" : i == 1 ? "lr" : "seed", has[i], option[i], want[i],
               i == 1 && !o->lr_given ? " (the default)" : "", option[i], has[i]);
      return 2;
    }
  }
  return 0;
}

static int load_safetensors(const model *m, const char *path, const ckpt_part *parts,
                            size_t n_parts, size_t *steps, const options *o, char *err, size_t errlen) {
  int fd;
  /* regular files only: a FIFO given as the checkpoint or found as its .adamw would block */
  if (stab_input_open(path, 0, &fd, NULL) != STAB_OK) return snprintf(err, errlen, "%s", stab_last_error()), 2;
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    return snprintf(err, errlen, "%s: %s", path, strerror(errno)), 1;
  }
  unsigned char n8[8];
  uint64_t n = 0;
  int rc = 2;
  char *h = NULL;
  if (fread(n8, 1, 8, f) != 8) {
    snprintf(err, errlen, "%s: shorter than the 8-byte header length", path);
    goto out;
  }
  for (int i = 0; i < 8; i++) n |= (uint64_t)n8[i] << (8 * i);
  if (n == 0 || n > (1u << 26) || !(h = malloc(n + 1)) || fread(h, 1, n, f) != n) {
    snprintf(err, errlen, "%s: header length %llu does not fit the file", path, (unsigned long long)n);
    goto out;
  }
  h[n] = 0;
  const char *st = strstr(h, "\"steps\":\"");
  if (!st || sscanf(st + 9, "%zu", steps) != 1) {
    snprintf(err, errlen, "%s: no __metadata__ steps: not a checkpoint of this program", path);
    goto out;
  }
  const char *tied = m->c.untied ? "\"tied\":\"false\"" : "\"tied\":\"true\"";
  if (!strstr(h, tied)) {
    snprintf(err, errlen, "%s: __metadata__ tied is not %s: the model has %s head", path,
             m->c.untied ? "false" : "true", m->c.untied ? "an untied" : "a tied");
    goto out;
  }
  /* No tensor's shape depends on the heads, so this is the only place a checkpoint trained
   * with other heads shows. (A checkpoint without the field predates it: not checked.) */
  const char *hd = strstr(h, "\"heads\":\"");
  size_t heads = 0;
  if (hd && (sscanf(hd + 9, "%zu", &heads) != 1 || heads != m->c.heads)) {
    snprintf(err, errlen, "%s: __metadata__ heads is %.*s, the model has --heads %zu", path,
             (int)strcspn(hd + 9, "\""), hd + 9, m->c.heads);
    goto out;
  }
  /* Nor on the attention scale; a checkpoint without the field predates it, so was trained
   * with 1/sqrt(d_h). */
  const char *sc = strstr(h, "\"attn_scale\":\"");
  const char *want_sc = m->c.attn_inverse ? "inverse" : "sqrt", *has_sc = sc ? sc + 14 : "sqrt";
  size_t sc_len = sc ? strcspn(has_sc, "\"") : 4;
  if (sc_len != strlen(want_sc) || strncmp(has_sc, want_sc, sc_len)) {
    snprintf(err, errlen, "%s: __metadata__ attn_scale is %.*s, the model has --attn-scale %s", path,
             (int)sc_len, has_sc, want_sc);
    goto out;
  }
  for (size_t p = 0; p < n_parts; p++)
    for (size_t i = 0; i < m->n_tensors; i++) {
      const model_tensor *t = &m->tensors[i];
      char key[128], shape[64], want[160];
      snprintf(key, sizeof key, "\"%s%s\":{", parts[p].prefix, t->name);
      if (t->rows == 1) snprintf(shape, sizeof shape, "[%zu]", t->cols);
      else snprintf(shape, sizeof shape, "[%zu,%zu]", t->rows, t->cols);
      snprintf(want, sizeof want, "\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[", shape);
      const char *k = strstr(h, key);
      unsigned long long a, b;
      if (!k || strncmp(k + strlen(key), want, strlen(want)) ||
          sscanf(k + strlen(key) + strlen(want), "%llu,%llu", &a, &b) != 2 ||
          b - a != t->size * sizeof(float)) {
        snprintf(err, errlen, "%s: tensor %s%s is missing or not F32 of shape %s", path,
                 parts[p].prefix, t->name, shape);
        goto out;
      }
      if (fseek(f, (long)(8 + n + a), SEEK_SET) ||
          fread(parts[p].data + t->offset, sizeof(float), t->size, f) != t->size) {
        snprintf(err, errlen, "%s: tensor %s%s: data_offsets [%llu, %llu] beyond the file", path,
                 parts[p].prefix, t->name, a, b);
        goto out;
      }
    }
  /* the settings after the shapes: a checkpoint of another model is said as such first */
  if (o && check_settings(h, path, o, err, errlen)) goto out;
  rc = 0;
out:
  free(h);
  fclose(f);
  return rc;
}

/* ---- main ------------------------------------------------------------------------ */

/* After an append or flush of the trace returned ts: 0 to go on, 1 to stop. The call that
 * fails returns the error in either --trace-errors mode; with continue the trace then turns
 * itself off and the run goes on (said once, here). was_failed: stab_trace_failed before. */
static int trace_went(stab_trace *trace, stab_status ts, int was_failed, const options *o, int tty,
                      const char *trace_path) {
  if (!was_failed && stab_trace_failed(trace) && o->trace_errors == STAB_TRACE_CONTINUE) {
    fputs(tty ? "\n" : "", stderr);
    cli_error("trace: %s", stab_last_error());
    cli_error("going on without the trace; the rows written before are in %s", trace_path);
  } else if (ts != STAB_OK) {
    fputs(tty ? "\n" : "", stderr);
    cli_error("trace: %s", stab_last_error());
    cli_error("stopping; the rows written before are in %s (--trace-errors continue goes on "
              "without the trace)", trace_path);
    return 1;
  }
  return 0;
}

static void fmt_time(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* Every rank's failure becomes every rank's: under --data-parallel the ranks agree on the
 * first failing rank's exit code, so that nobody waits in a collective that a failed rank will
 * never call. Called at the same points on every rank. One process: rc itself. */
static int together(train_world *w, int rc) { return w ? train_world_agree(w, rc) : rc; }

/* Mean loss over `batches` fixed batches of [lo, hi); this rank runs rows [b0, b0 + nb) of
 * each (all of them in one process), and the ranks' means are combined (collective: w, under
 * --data-parallel); with tp the split model runs every batch whole on every rank. */
static double eval_loss(model *m, model_tp *tp, train_world *w, const data_set *d, size_t lo, size_t hi,
                        size_t B, size_t b0, size_t nb, size_t T, int32_t *tok, int32_t *tgt,
                        size_t batches) {
  data_rng r = {12345};
  double s = 0;
  for (size_t i = 0; i < batches; i++) {
    data_batch(d, &r, lo, hi, B, T, tok, tgt);
    s += tp ? model_tp_forward(tp, tok, tgt, B, T) : model_forward(m, tok + b0 * T, tgt + b0 * T, nb, T);
  }
  s /= (double)batches;
  return w && train_world_mean(w, &s, 1, B) ? NAN : s;
}

/* Per layer kind and metric (forward, dependency, update): the sum of the logs and the count
 * of the finite positive values over the kind's layers and the measured steps of the last
 * quarter of a run; their geometric mean is what a width sweep compares across widths. */
enum { N_KINDS = 6 };
typedef struct {
  double log_sum[N_KINDS][3];
  size_t count[N_KINDS][3];
} kind_means;

static void kind_means_add(kind_means *k, const stab_monitor *mon) {
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_metrics *x = stab_monitor_metrics(mon, i);
    int kind = (int)stab_monitor_layer(mon, i)->kind;
    const double v[3] = {x->forward, x->dependency, x->update};
    for (int j = 0; j < 3; j++)
      if (kind >= 0 && kind < N_KINDS && isfinite(v[j]) && v[j] > 0)
        k->log_sum[kind][j] += log(v[j]), k->count[kind][j]++;
  }
}

static double kind_mean(const kind_means *k, int kind, int metric) {
  return k->count[kind][metric] ? exp(k->log_sum[kind][metric] / (double)k->count[kind][metric])
                                : NAN;
}

/* --tensor-parallel: the ranks' slices of the weights and of AdamW's moments put together into
 * m->params, whole_m and whole_v (on every rank), as one process holds them. Collective.
 * Returns 0, or 1 with the message on stderr. */
static int gather_whole(model_tp *part, model *m, const optim *opt, float *whole_m, float *whole_v) {
  if (model_tp_gather(part, part->local.params, m->params)) return 1;
  if (opt->m && (model_tp_gather(part, opt->m, whole_m) || model_tp_gather(part, opt->v, whole_v))) return 1;
  return 0;
}

/* How one run ended, for the sweeps. */
typedef struct {
  int diverged;      /* the loss turned non-finite at step steps_done (exit status 1) */
  size_t steps_done; /* optimizer steps taken */
  double first_loss; /* the first training batch's loss, before any step */
  double final_loss; /* the last training batch's loss; NaN if diverged */
  double heldout;    /* the held-out loss at the end; NaN if diverged */
} run_result;

/* One training run with the options o; the sweep gives each run its width and directory.
 * means, when not NULL, receives the last quarter's per-kind metrics, and res how the run
 * ended. Returns the exit status. */
static int train_run(const options *opts, const data_set *data, kind_means *means, run_result *res,
                     train_world *world) {
  const options o = *opts;
  int rc = 0;
  if (res) *res = (run_result){.first_loss = NAN, .final_loss = NAN, .heldout = NAN};
  /* The last tenth is held out for the final evaluation. */
  size_t split = data->n - data->n / 10, B = o.batch, T = o.context;
  /* --data-parallel: this rank's rows [b0, b0 + nb) of every batch; rank 0 alone writes.
   * --tensor-parallel: every rank every row, dpw NULL (the ranks' collectives are the split
   * model's and its monitor's). */
  size_t b0 = 0, nb = B, ranks = world ? (size_t)train_world_size(world) : 1;
  int writer = !world || train_world_rank(world) == 0, tensor = o.tensor_parallel > 0;
  train_world *dpw = tensor ? NULL : world;
  if (dpw) train_world_split(dpw, B, &b0, &nb);
  if (data->n / 10 < T + 1 || split < T + 1) {
    cli_error("%s is too short for context %zu (needs %zu tokens)", data->what, T,
            10 * (T + 1));
    rc = 2;
  } else if (dpw && B < ranks) {
    rc = cli_usage_error("--batch %zu is smaller than the %zu ranks: each needs a sequence", B, ranks);
  } else if (o.out) {
    rc = check_out(o.out, o.metrics_every != 0);
    if (!rc && writer) rc = check_earlier_run(o.out, out_mode(&o));
  }
  if ((rc = together(world, rc))) return rc;
  model m;
  model_config mc = {.vocab = data->vocab, .width = o.width, .depth = o.depth, .heads = o.heads,
                     .context = T, .biases = o.biases, .untied = o.untied,
                     .attn_inverse = o.attn_inverse};
  optim opt = {0};
  model_tp part = {0};           /* --tensor-parallel: this rank's part of m */
  model *mine = &m;              /* the parameters this rank trains: m, or tp.local */
  train_tp *ttp = NULL;          /* --tensor-parallel: the monitor's measurements across ranks */
  float *whole_m = NULL, *whole_v = NULL; /* --tensor-parallel: AdamW's moments in m's layout */
  stab_monitor *mon = NULL;
  layer_alarm *alarms = NULL;    /* per monitor layer: check_alarms's */
  stab_trace *trace = NULL;      /* DIR/trace.h5, with --out and a monitor */
  char trace_path[4096] = "";
  long *blocks = NULL;           /* per monitor layer: its block, or -1 */
  double *extras = NULL;         /* per monitor layer: act_rms, act_cos1 */
  int32_t *tok = malloc(B * T * sizeof *tok), *tgt = malloc(B * T * sizeof *tgt);
  /* the split model's activations are its own: m's are not needed then */
  if ((rc = model_create(&m, &mc)) || (!tensor && model_reserve(&m, nb, T)) || !tok || !tgt) {
    cli_error("%s", rc == -1 ? "bad model shape" : "out of memory for the model");
    rc = 1;
  }
  if ((rc = together(world, rc))) {
    free(tok), free(tgt), model_free(&m);
    return rc;
  }
  /* Until setup_end a failure is this rank's alone: it goes there, where every rank learns it. */
  rc = 1;
  model_init_params(&m, o.seed, o.optimizer == OPTIM_ADAMW);
  size_t start = 0;
  int moments_read = 0; /* --resume read the AdamW moments beside the checkpoint */
  if (o.resume) {
    char msg[1024];
    ckpt_part weights = {"", m.params};
    int lrc = load_safetensors(&m, o.resume, &weights, 1, &start, &o, msg, sizeof msg);
    if (!lrc && start >= o.steps)
      snprintf(msg, sizeof msg, "%s is at step %zu, not before --steps %zu", o.resume, start,
               o.steps), lrc = 2;
    if (lrc) {
      cli_error("cannot resume: %s", msg);
      rc = lrc;
      goto setup_end;
    }
  }
  if (tensor) {
    /* the whole model initialised (or loaded) as one process does, then this rank's slices */
    int trc = model_tp_create(&part, &m, world);
    whole_m = malloc(m.n_params * sizeof *whole_m);
    whole_v = malloc(m.n_params * sizeof *whole_v);
    if (trc == -1) { /* parse refused these already: a guard, not a path */
      cli_error("--tensor-parallel %zu: --heads %zu and --width %zu must be divisible by it", ranks, o.heads, o.width);
      rc = 2;
      goto setup_end;
    }
    if (trc || !whole_m || !whole_v) {
      cli_error("out of memory for the split model");
      goto setup_end;
    }
    mine = &part.local;
  }
  optim_params op = optim_default_params(o.optimizer);
  if (optim_create(&opt, &op, mine->tensors, mine->n_tensors, mine->n_params)) {
    cli_error("out of memory for the optimizer");
    goto setup_end;
  }
  if (o.resume) {
    /* AdamW goes on with the moments saved beside the checkpoint, as if never stopped;
     * without them it starts its moments (and their bias correction) again from 0. */
    char mpath[4300], msg[4600];
    const char *how = "";
    struct stat sb;
    if (opt.m && (moments_path(mpath, sizeof mpath, o.resume) || stat(mpath, &sb))) {
      how = " (no AdamW moments beside it: they start again from 0)";
    } else if (opt.m) {
      /* split: read whole, then this rank's slices */
      ckpt_part moments[2] = {{"exp_avg.", tensor ? whole_m : opt.m}, {"exp_avg_sq.", tensor ? whole_v : opt.v}};
      size_t mstep = 0;
      int lrc = load_safetensors(&m, mpath, moments, 2, &mstep, NULL, msg, sizeof msg);
      if (!lrc && tensor) model_tp_scatter(&part, whole_m, opt.m), model_tp_scatter(&part, whole_v, opt.v);
      if (!lrc && mstep != start)
        snprintf(msg, sizeof msg, "%s is at step %zu, its checkpoint at %zu", mpath, mstep, start),
            lrc = 2;
      if (lrc) {
        cli_error("cannot resume: %s", msg);
        rc = lrc;
        goto setup_end;
      }
      opt.step = (long)start;
      how = " with its AdamW moments";
      moments_read = 1;
    }
    cli_error("resuming from %s at step %zu%s", o.resume, start, how);
  }
  if (o.metrics_every) {
    stab_monitor_params mp = stab_monitor_default_params();
    if (stab_monitor_create(&mp, &mon) != STAB_OK || register_layers(mon, &m, tensor)) {
      cli_error("monitor: %s", stab_last_error());
      goto setup_end;
    }
  }
  /* collective: every rank gets here, each with its monitor (or none: --metrics-every 0) */
  if (tensor) {
    stab_monitor_params mp = stab_monitor_default_params();
    if ((rc = together(world, 0)) || (mon && (rc = train_tp_create(world, &part, &m, mon, &mp, &ttp)))) goto out;
    rc = 1;
  }
  cli_error("%s", data->what);
  cli_error("model V=%zu D=%zu L=%zu H=%zu T=%zu, %zu parameters (%s head%s); "
            "%s, lr %g, warmup %zu, batch %zu x %zu, %zu steps", m.c.vocab, o.width, o.depth, o.heads, T, m.n_params,
          o.untied ? "untied" : "tied", o.biases ? ", biases" : "",
          o.optimizer == OPTIM_ADAMW ? "adamw (init std 0.02)" : "steepest (articles' init)",
          o.lr, o.warmup, B, T, o.steps);
  if (mon && o.out && writer) {
    static const char *const scalars[] = {"loss", "lr"};
    static const char *const layer_extras[] = {"act_rms", "act_cos1"};
    char config[2048];
    size_t nl = stab_monitor_layer_count(mon);
    blocks = malloc(nl * sizeof *blocks);
    extras = malloc(2 * nl * sizeof *extras);
    if (!blocks || !extras) {
      cli_error("out of memory");
      goto setup_end;
    }
    for (size_t i = 0; i < nl; i++) blocks[i] = layer_block(stab_monitor_layer(mon, i)->name);
    if (snprintf(trace_path, sizeof trace_path, "%s/trace.h5", o.out) >= (int)sizeof trace_path ||
        mkdirs(o.out)) {
      cli_error("cannot create the directory %s: %s", o.out, strerror(errno));
      goto setup_end;
    }
    run_config(config, sizeof config, &o, &m, (int)ranks);
    stab_trace_params tp = stab_trace_default_params();
    tp.flush_every = (int)o.flush_every;
    tp.run_config = config;
    tp.scalars = scalars;
    tp.n_scalars = 2;
    tp.layer_extras = layer_extras;
    tp.n_layer_extras = 2;
    tp.on_error = o.trace_errors;
    tp.append = (int)out_mode(&o); /* a resumed run continues its trace, */
    tp.resume_step = (int64_t)start; /* replacing the rows of the steps it redoes */
    stab_status ts = stab_trace_open(trace_path, mon, &tp, &trace);
    if (ts != STAB_OK) {
      cli_error("trace: %s", stab_last_error());
      /* a trace another run is writing, one of another model, or one that appeared since
       * check_earlier_run: the input, not a failure */
      if (ts == STAB_EBUSY || ts == STAB_EINVAL || ts == STAB_EEXIST) rc = 2;
      goto setup_end;
    }
    /* Until it is closed the file is marked open for writing (SWMR), and a plain HDF5 open
     * (h5dump, ncdump, xarray) refuses it: say what reads it, and how to repair it after a kill. */
    fprintf(stderr, "train: trace: %s; while this runs or if it is killed, h5py (swmr=True) and stabmeter-export "
            "read it; after a kill, `h5clear -s %s` lets h5dump, ncdump and xarray open it\n", trace_path, trace_path);
    /* A resumed run's trace should hold the steps measured before its checkpoint; when it does
     * not (the trace failed or was replaced while checkpoints went on), the gap stays. */
    size_t before = o.resume ? start - start % o.metrics_every : 0; /* the last step measured */
    int64_t last = 0;
    if (before > 0 && stab_trace_last_step(trace, &last) != STAB_OK)
      cli_error("warning: %s has no rows up to step %zu, where the run resumes: steps "
                      "%zu..%zu will be missing from it", trace_path, start, o.metrics_every, before);
    else if (before > 0 && last < (int64_t)before)
      cli_error("warning: %s ends at step %lld, the run resumes from step %zu: steps "
                      "%lld..%zu will be missing from it", trace_path, (long long)last, start,
              (long long)last + 1, before);
  }
  /* --replace: the new trace is in place (a trace another run holds was refused above); now no
   * checkpoint of the earlier run is left beside this one's */
  if (o.replace && o.out && writer && remove_earlier_run(o.out, trace != NULL)) goto setup_end;
  if (mon)
    cli_error("monitor: %zu layers every %zu steps, %.1f MB",
            stab_monitor_layer_count(mon), o.metrics_every, (stab_monitor_memory(mon) + train_tp_memory(ttp)) / 1e6);
  if (o.optimizer == OPTIM_STEEPEST && !o.untied)
    cli_error("warning: steepest with a tied head: the head is the embedding (init "
                    "std 1, not the articles' 1/d), so the first logits are large; --untied "
                    "follows the articles");
  alarms = mon ? calloc(stab_monitor_layer_count(mon), sizeof *alarms) : NULL;
  if (mon && !alarms) {
    cli_error("out of memory");
    goto setup_end;
  }
  for (size_t i = 0; mon && i < stab_monitor_layer_count(mon); i++) {
    alarms[i].ref_lr = NAN;
    /* A resumed run's alarms judge by the run's first measurement, as its trace does: the
     * reference of the trace's rows (the update's taken at the first measured step, the trace
     * starting with the run). */
    stab_metrics ref;
    if (trace && o.resume && stab_trace_reference(trace, i, &ref) == STAB_OK) {
      stab_monitor_set_reference(mon, i, &ref);
      if (!isnan(ref.update)) alarms[i].ref_lr = lr_at(&o, o.metrics_every - 1);
    }
  }
  if (tensor)
    cli_error("tensor parallel: %zu rank%s, each %zu of the %zu heads and %zu of the %zu MLP columns, every "
              "sequence of every batch", ranks, ranks == 1 ? "" : "s", part.Hl, o.heads, part.Fl, 4 * o.width);
  else if (world && B % ranks)
    cli_error("data parallel: %zu ranks, each %zu or %zu of the %zu sequences of every batch", ranks,
              B / ranks + 1, B / ranks, B);
  else if (world)
    cli_error("data parallel: %zu rank%s, each %zu of the %zu sequences of every batch", ranks,
              ranks == 1 ? "" : "s", B / ranks, B);
  rc = 0;
setup_end:
  if ((rc = together(world, rc))) goto out;
  rc = 1;
  if (o.resume && world) {
    /* every rank read its own copy of the checkpoint: the same bytes, or nobody trains (each
     * rank's share of every step would be measured on other weights) */
    const uint64_t at = start;
    const float *mom = tensor ? whole_m : opt.m, *mom2 = tensor ? whole_v : opt.v;
    const char *what[] = {"its step", "the weights", "the AdamW exp_avg", "the AdamW exp_avg_sq"};
    const void *bytes[] = {&at, m.params, mom, mom2};
    const size_t sizes[] = {sizeof at, m.n_params * sizeof *m.params, m.n_params * sizeof *mom,
                            m.n_params * sizeof *mom2};
    if ((rc = train_world_same_input(world, o.resume, what, bytes, sizes, moments_read ? 4 : 2))) goto out;
    rc = 1;
  }
  int tty = isatty(STDERR_FILENO);
  size_t every_line = o.steps / 20 ? o.steps / 20 : 1;
  data_rng rng = {o.seed * 0x9e3779b97f4a7c15ull + 7};
  int measured = 0;
  double t0 = monotonic_seconds(), last_draw = 0, first_loss = NAN, loss = NAN, measure_time = 0;
  for (size_t step = 0; step < start; step++) /* the batches of the steps already taken */
    data_batch(data, &rng, 0, split, B, T, tok, tgt);
  for (size_t step = start; step < o.steps; step++) {
    double lr = lr_at(&o, step);
    data_batch(data, &rng, 0, split, B, T, tok, tgt);
    loss = tensor ? model_tp_forward(&part, tok, tgt, B, T) : model_forward(&m, tok + b0 * T, tgt + b0 * T, nb, T);
    /* the batch's loss, the same bits on every rank: all stop together when it is not finite */
    if (dpw && train_world_mean(dpw, &loss, 1, B)) goto out;
    if (step == start) first_loss = loss;
    if (!isfinite(loss)) {
      fputs(tty ? "\n" : "", stderr);
      cli_error("the loss is %g at step %zu: stopping", loss, step);
      if (res) res->diverged = 1, res->steps_done = step, res->first_loss = first_loss;
      goto out;
    }
    model_zero_grad(mine);
    if (tensor ? model_tp_backward(&part) : (model_backward(&m), 0)) goto out;
    if (dpw && train_world_sum_gradients(dpw, m.grads, m.n_params, B)) goto out;
    int measure = mon && (step + 1) % o.metrics_every == 0;
    double tm = monotonic_seconds();
    int failed = 0; /* this rank's; every rank learns it before the next collective */
    if (measure && (stab_monitor_snapshot(mon) != STAB_OK || (ttp && train_tp_snapshot(ttp) != STAB_OK))) {
      cli_error("snapshot: %s", stab_last_error());
      failed = 1;
    }
    if (measure && (rc = together(world, failed))) goto out;
    rc = 1;
    measure_time += monotonic_seconds() - tm;
    int st = optim_step(&opt, mine->params, mine->grads, (float)lr);
    if (st != STAB_OK) { /* every rank alike: the gradients are the same bits on every rank */
      fputs(tty ? "\n" : "", stderr);
      cli_error("optimizer step %zu: %s", step, stab_last_error());
      goto out;
    }
    if (measure) {
      measured = 1;
      tm = monotonic_seconds();
      /* every rank gets the same status, and every metric */
      if ((ttp ? train_tp_measure(ttp, mon, 1) : world ? train_world_measure(world, mon, 1) : stab_monitor_measure(mon, 1)) != STAB_OK) {
        cli_error("measure: %s", stab_last_error());
        goto out;
      }
      if (writer) check_alarms(mon, &o, alarms, step + 1, lr, tty);
      if (means && step + 1 > o.steps - o.steps / 4) kind_means_add(means, mon);
      double act[512]; /* act_rms of each block, then act_cos1 of each (depth <= 256) */
      const double *act_rms = act, *act_cos1 = act + o.depth;
      for (size_t l = 0; l < o.depth; l++)
        block_stats(tensor ? model_tp_residual(&part, (int)l) : model_residual(&m, (int)l), (tensor ? B : nb) * T,
                    o.width, &act[l], &act[o.depth + l]);
      /* the ranks' means over their rows, as means over the batch */
      if (dpw && train_world_mean(dpw, act, 2 * o.depth, B)) goto out;
      if (trace) {
        /* /step counts the steps done; the loss is that of the batch before this update. */
        const double scalars[2] = {loss, lr};
        for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
          extras[2 * i] = blocks[i] >= 0 ? act_rms[blocks[i]] : NAN;
          extras[2 * i + 1] = blocks[i] >= 0 ? act_cos1[blocks[i]] : NAN;
        }
        int was_failed = stab_trace_failed(trace);
        stab_status ts = stab_trace_append(trace, (int64_t)(step + 1), monotonic_seconds() - t0, scalars, extras);
        failed = trace_went(trace, ts, was_failed, &o, tty, trace_path);
      }
      measure_time += monotonic_seconds() - tm;
    }
    int saving = o.checkpoint_every && (step + 1) % o.checkpoint_every == 0 && step + 1 < o.steps;
    /* split: every rank's slices gathered into the whole model (collective) */
    if (saving && tensor && gather_whole(&part, &m, &opt, whole_m, whole_v)) goto out;
    /* Every step the checkpoint holds is in the trace before the checkpoint exists: a run killed
     * after it and resumed from it leaves no gap in the trace. */
    if (saving && trace && !failed) {
      int was_failed = stab_trace_failed(trace);
      failed = trace_went(trace, stab_trace_flush(trace), was_failed, &o, tty, trace_path);
    }
    if (saving && writer && !failed) {
      char name[64];
      snprintf(name, sizeof name, "step-%06zu.safetensors", step + 1);
      failed = checkpoint(&m, tensor ? whole_m : opt.m, tensor ? whole_v : opt.v, &o, name, step + 1);
    }
    /* the trace and the checkpoints are rank 0's: the others learn here how they went */
    if (((measure && o.out) || saving) && (rc = together(world, failed))) goto out;
    rc = 1;
    double t = monotonic_seconds(), el = t - t0;
    int last = step + 1 == o.steps;
    if ((tty && (t - last_draw > 0.1 || last)) || (!tty && ((step + 1) % every_line == 0 || last))) {
      char eta[32], worst_s[256] = "";
      fmt_time(eta, sizeof eta, el / (double)(step + 1 - start) * (double)(o.steps - step - 1));
      if (mon && measured) {
        const char *nf, *nd, *nu;
        double f = worst(mon, 0, &nf), dp = worst(mon, 1, &nd), u = worst(mon, 2, &nu);
        snprintf(worst_s, sizeof worst_s, " | max fwd %.3g %s, dep %.3g %s, upd %.3g %s", f, nf,
                 dp, nd, u, nu);
      }
      fprintf(stderr, "%sstep %zu/%zu | loss %.4f | lr %.2e | %.0f tok/s%s | ETA %s%s",
              tty ? "\r\033[K" : "", step + 1, o.steps, loss, lr,
              (double)(step + 1 - start) * B * T / el, worst_s, eta, tty ? "" : "\n");
      last_draw = t;
    }
  }
  double elapsed = monotonic_seconds() - t0;
  if (tty) fputc('\n', stderr);
  double val = eval_loss(&m, tensor ? &part : NULL, dpw, data, split, data->n, B, b0, nb, T, tok, tgt, 8);
  printf("loss: initial %.4f, final %.4f (train batch), held-out %.4f (%.3f bits/token)\n",
         first_loss, loss, val, val / log(2.0));
  if (res) res->steps_done = o.steps, res->first_loss = first_loss, res->final_loss = loss, res->heldout = val;
  printf("time: %.1f s for %zu steps (%.0f tokens/s), %.1f%% of it measuring\n", elapsed,
         o.steps - start, (double)(o.steps - start) * B * T / elapsed,
         100.0 * measure_time / elapsed);
  if (mon && measured && o.print_metrics) {
    printf("%-28s %-9s %10s %10s %10s %10s\n", "layer", "kind", "forward", "dependency", "update",
           "rel_update");
    for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
      const stab_metrics *x = stab_monitor_metrics(mon, i);
      const stab_layer *l = stab_monitor_layer(mon, i);
      printf("%-28s %-9s %10.4g %10.4g %10.4g %10.3g\n", l->name, stab_kind_name(l->kind),
             x->forward, x->dependency, x->update, x->rel_update);
    }
  }
  if (mon && measured) {
    /* Where the measuring time goes: passes over the weights of the last measurement. */
    size_t pi = 0, ui = 0;
    for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
      if (stab_monitor_metrics(mon, i)->passes > stab_monitor_metrics(mon, pi)->passes) pi = i;
      if (stab_monitor_metrics(mon, i)->update_passes > stab_monitor_metrics(mon, ui)->update_passes)
        ui = i;
    }
    printf("monitor: %zu layers, %.1f MB; last measurement: most passes %d (%s), most update "
           "passes %d (%s)\n", stab_monitor_layer_count(mon), stab_monitor_memory(mon) / 1e6,
           stab_monitor_metrics(mon, pi)->passes, stab_monitor_layer(mon, pi)->name,
           stab_monitor_metrics(mon, ui)->update_passes, stab_monitor_layer(mon, ui)->name);
  }
  int failed = 0; /* this rank's, learnt by every rank before they return */
  if (tensor) {
    /* The replicated tensors' gradients come from the same bits on every rank (the sums in rank
     * order), so their weights should be the same bits; checked, not assumed. */
    float *rep = malloc((model_tp_replicated(&part, part.local.params, NULL) + 1) * sizeof *rep);
    size_t n = rep ? model_tp_replicated(&part, part.local.params, rep) : 0;
    uint64_t hash;
    int differing;
    if (!rep) cli_error("out of memory");
    if (train_world_same_bits(world, rep, n * sizeof *rep, &hash, &differing) || !rep) {
      free(rep);
      goto out;
    }
    free(rep);
    if (differing >= 0) {
      cli_error("rank %d's replicated weights differ from rank 0's after step %zu", differing, o.steps);
      goto out;
    }
    printf("tensor parallel: %zu rank%s, the replicated weights the same on every rank (FNV-1a %016llx)\n", ranks,
           ranks == 1 ? "" : "s", (unsigned long long)hash);
    if (o.out && gather_whole(&part, &m, &opt, whole_m, whole_v)) goto out;
  } else if (world) {
    /* The sums in rank order should leave every rank the same weights; checked, not assumed
     * (a BLAS that picks other kernels on another node would break it). */
    uint64_t hash;
    int differing;
    if (train_world_same_bits(world, m.params, m.n_params * sizeof *m.params, &hash, &differing)) goto out;
    if (differing >= 0) {
      cli_error("rank %d's weights differ from rank 0's after step %zu", differing, o.steps);
      goto out;
    }
    printf("data parallel: %zu rank%s, the same weights on every rank (FNV-1a %016llx)\n", ranks,
           ranks == 1 ? "" : "s", (unsigned long long)hash);
  }
  if (trace) {
    int64_t rows = stab_trace_steps(trace);
    int was_failed = stab_trace_failed(trace);
    stab_status ts = stab_trace_close(trace);
    trace = NULL;
    if (ts != STAB_OK && !was_failed) {
      cli_error("trace: %s", stab_last_error());
      failed = 1;
    } else {
      printf("trace: %s, %lld measured steps%s (read it with h5py, or h5dump -d /step %s)\n",
             trace_path, (long long)rows, was_failed ? " before a write failed" : "", trace_path);
    }
  }
  if (o.out && writer && !failed) {
    failed = checkpoint(&m, tensor ? whole_m : opt.m, tensor ? whole_v : opt.v, &o, "model.safetensors", o.steps);
    if (!failed) printf("checkpoint: %s/model.safetensors\n", o.out);
  }
  if ((rc = together(world, failed))) goto out;
  rc = 0;
out:
  if (trace && stab_trace_close(trace) != STAB_OK)
    cli_error("trace: %s", stab_last_error());
  free(blocks);
  free(extras);
  free(alarms);
  train_tp_free(ttp); /* collective: every rank reaches out, with its handle or none */
  stab_monitor_free(mon);
  optim_free(&opt);
  model_tp_free(&part);
  free(whole_m), free(whole_v);
  model_free(&m);
  free(tok), free(tgt);
  return rc;
}

/* The width sweep's result: per layer kind and metric, the last quarter's geometric mean at
 * each width and the least-squares slope of log(metric) against log(width). A slope near 0
 * means the metric does not change with width, which is what a stable parametrisation gives. */
static void print_sweep(const options *o, double lr, const kind_means *means) {
  static const char *const metric[3] = {"forward", "dependency", "update"};
  char rate[40] = "";
  if (o->n_sweep_lr) snprintf(rate, sizeof rate, ", lr %g", lr);
  printf("sweep (%s%s): geometric mean over each kind's layers and the measured steps of the last "
         "quarter, against width\n%-10s %-10s", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", rate,
         "kind", "metric");
  for (size_t w = 0; w < o->n_sweep; w++) printf(" %9zu", o->sweep[w]);
  printf("  log-log slope\n");
  for (int k = 0; k < N_KINDS; k++)
    for (int j = 0; j < 3; j++) {
      double sx = 0, sy = 0, sxx = 0, sxy = 0;
      size_t n = 0;
      for (size_t w = 0; w < o->n_sweep; w++) {
        double v = kind_mean(&means[w], k, j);
        if (!isfinite(v)) continue;
        double x = log((double)o->sweep[w]), y = log(v);
        sx += x, sy += y, sxx += x * x, sxy += x * y, n++;
      }
      if (!n) continue; /* no layer of this kind, or a metric it does not have */
      printf("%-10s %-10s", stab_kind_name((stab_kind)k), metric[j]);
      for (size_t w = 0; w < o->n_sweep; w++) printf(" %9.4g", kind_mean(&means[w], k, j));
      double den = (double)n * sxx - sx * sx;
      if (n >= 2 && den > 0) printf("  %+.3f\n", ((double)n * sxy - sx * sy) / den);
      else printf("  -\n");
    }
}

/* The learning-rate sweep's table: the held-out loss of every run, a row per width and a column
 * per rate ("div@N": the loss turned non-finite at step N), and the rate of the lowest loss. */
static void print_lr_sweep(const options *o, const size_t *widths, size_t n_w, const run_result *res) {
  printf("learning-rate sweep (%s): held-out loss at the end, per width and peak learning rate\n%-7s",
         o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", "width");
  for (size_t l = 0; l < o->n_sweep_lr; l++) printf(" %9g", o->sweep_lr[l]);
  printf("  best lr\n");
  for (size_t w = 0; w < n_w; w++) {
    printf("%-7zu", widths[w]);
    size_t best = SIZE_MAX;
    for (size_t l = 0; l < o->n_sweep_lr; l++) {
      const run_result *r = &res[l * n_w + w];
      char cell[32];
      if (r->diverged) snprintf(cell, sizeof cell, "div@%zu", r->steps_done);
      else snprintf(cell, sizeof cell, "%.4f", r->heldout);
      printf(" %9s", cell);
      if (!r->diverged && isfinite(r->heldout) && (best == SIZE_MAX || r->heldout < res[best * n_w + w].heldout))
        best = l;
    }
    if (best == SIZE_MAX) printf("  -\n");
    else printf("  %g\n", o->sweep_lr[best]);
  }
}

/* One line of DIR/lr-sweep.csv, flushed, so that a sweep stopped part way keeps the runs done. */
static int csv_row(FILE *csv, const char *path, const options *o, size_t width, double lr, const run_result *r) {
  fprintf(csv, "%s,%zu,%g,%s,%zu,%.6g,%.6g,%.6g,%llu\n", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", width,
          lr, r->diverged ? "diverged" : "ok", r->steps_done, r->final_loss, r->heldout, r->first_loss,
          (unsigned long long)o->seed);
  if (fflush(csv) || ferror(csv)) {
    cli_error("%s: cannot write: %s", path, strerror(errno));
    return 1;
  }
  return 0;
}

/* --sweep-widths and/or --sweep-lrs: one run per (learning rate, width), into DIR/lr-X/width-W/
 * (a level the sweep does not vary left out of the path). A run that diverges ends a width
 * sweep alone (its slopes need every width) but not a learning-rate sweep, where diverging is
 * one of the outcomes measured. Returns the exit status. */
static const char csv_header[] =
    "optimizer,width,lr,status,steps_done,final_train_loss,heldout_loss,initial_train_loss,seed\n";

/* The directory of the sweep's run at rate lr and width into dir; -1 when too long. */
static int sweep_dir(char *dir, size_t n, const options *o, double lr, size_t width) {
  int len = o->n_sweep_lr && o->n_sweep ? snprintf(dir, n, "%s/lr-%g/width-%zu", o->out, lr, width)
            : o->n_sweep_lr             ? snprintf(dir, n, "%s/lr-%g", o->out, lr)
                                        : snprintf(dir, n, "%s/width-%zu", o->out, width);
  return len < (int)n ? 0 : -1;
}

/* Before any run: every run's directory checked for an earlier run (check_earlier_run), and
 * DIR/lr-sweep.csv under the same rule: kept and appended to when its columns are this
 * program's (the rows of other runs, which the seed column tells apart), refused when they
 * are not, replaced with --replace. *append: 1 to append to it. Returns 0 or the exit status. */
static int sweep_check(const options *o, const char *csv_path, int *append) {
  size_t n_lr = o->n_sweep_lr ? o->n_sweep_lr : 1, n_w = o->n_sweep ? o->n_sweep : 1;
  char dir[4096];
  *append = 0;
  for (size_t l = 0; l < n_lr; l++)
    for (size_t w = 0; w < n_w; w++) {
      double lr = o->n_sweep_lr ? o->sweep_lr[l] : o->lr;
      if (sweep_dir(dir, sizeof dir, o, lr, o->n_sweep ? o->sweep[w] : o->width)) {
        cli_error("--out is too long");
        return CLI_USAGE;
      }
      int rc = check_earlier_run(dir, out_mode(o));
      if (rc) return rc;
    }
  if (!o->n_sweep_lr || stab_output_check(csv_path, out_mode(o), "the table of an earlier sweep") == STAB_OK) {
    struct stat sb;
    *append = o->n_sweep_lr && !o->replace && stat(csv_path, &sb) == 0;
    return 0;
  }
  /* there, and not to be replaced: appended to when it has this program's columns */
  char line[256] = "";
  FILE *f = fopen(csv_path, "r");
  if (f && fgets(line, sizeof line, f) && !strcmp(line, csv_header)) {
    fclose(f);
    *append = 1;
    return 0;
  }
  if (f) fclose(f);
  line[strcspn(line, "\n")] = 0;
  cli_error("%s: its columns are not this sweep's (%s%s%s): kept as it is; --replace replaces it, or give "
            "another --out", csv_path, f ? "header '" : "cannot read it: ", f ? line : strerror(errno), f ? "'" : "");
  return CLI_USAGE;
}

static int sweep(const options *o, const data_set *data, train_world *dp) {
  size_t n_lr = o->n_sweep_lr ? o->n_sweep_lr : 1, n_w = o->n_sweep ? o->n_sweep : 1;
  const size_t *widths = o->n_sweep ? o->sweep : &o->width;
  kind_means *means = calloc(n_lr * n_w, sizeof *means);
  run_result *res = calloc(n_lr * n_w, sizeof *res);
  int writer = !dp || train_world_rank(dp) == 0, rc = 0;
  FILE *csv = NULL;
  char dir[4096], csv_path[4200];
  int append = 0;
  snprintf(csv_path, sizeof csv_path, "%s/lr-sweep.csv", o->out);
  if (!means || !res) {
    cli_error("out of memory");
    rc = 1;
  } else if (writer && !(rc = check_out(o->out, 0)) && !(rc = sweep_check(o, csv_path, &append)) && o->n_sweep_lr) {
    int no_dir = mkdirs(o->out);
    if (no_dir || !(csv = fopen(csv_path, append ? "a" : "w"))) {
      cli_error("%s: cannot create: %s", no_dir ? o->out : csv_path, strerror(errno));
      rc = 1;
    } else if (!append) {
      fputs(csv_header, csv);
    }
  }
  rc = together(dp, rc);
  for (size_t l = 0; l < n_lr && !rc; l++) {
    int all_ran = 1;
    for (size_t w = 0; w < n_w && !rc; w++) {
      options one = *o;
      one.width = widths[w];
      if (o->n_sweep && o->head_dim) one.heads = one.width / o->head_dim; /* a fixed head dimension */
      if (o->n_sweep_lr) one.lr = o->sweep_lr[l], one.lr_given = 1;
      if (sweep_dir(dir, sizeof dir, o, one.lr, one.width)) {
        cli_error("--out is too long");
        rc = 2;
        break;
      }
      one.out = dir;
      size_t at = l * n_w + w;
      if (o->n_sweep_lr) {
        cli_error("sweep: lr %g, width %zu (%zu of %zu) into %s", one.lr, one.width, at + 1, n_lr * n_w, dir);
        printf("== lr %g, width %zu: %s\n", one.lr, one.width, dir);
      } else {
        cli_error("sweep: width %zu (%zu of %zu) into %s", one.width, at + 1, n_w, dir);
        printf("== width %zu: %s\n", one.width, dir);
      }
      fflush(stdout);
      rc = train_run(&one, data, &means[at], &res[at], dp);
      if (rc == 1 && res[at].diverged && o->n_sweep_lr) rc = 0, all_ran = 0; /* an outcome, not a failure */
      if (!rc && csv && csv_row(csv, csv_path, o, one.width, one.lr, &res[at])) rc = 1;
      if (o->n_sweep_lr) rc = together(dp, rc);
    }
    if (!rc && o->n_sweep && all_ran) print_sweep(o, o->n_sweep_lr ? o->sweep_lr[l] : o->lr, &means[l * n_w]);
  }
  if (!rc && o->n_sweep_lr) {
    print_lr_sweep(o, widths, n_w, res);
    if (writer) printf("lr sweep: %s\n", csv_path);
  }
  if (csv && fclose(csv) && !rc) {
    cli_error("%s: cannot write: %s", csv_path, strerror(errno));
    rc = 1;
  }
  free(means);
  free(res);
  return rc;
}

/* The options, the data and the runs, with the world when there is one (every rank does all of
 * it, with the same options: checked); *world receives the one --data-parallel starts when no
 * launcher did. Returns the exit status. */
static int run(int argc, char **argv, train_world **world) {
  options o;
  int rc = together(*world, parse(argc, argv, &o));
  if (rc) return rc < 0 ? CLI_OK : rc; /* -1: --help or --version done */
  int parallel = o.data_parallel || o.tensor_parallel;
  if (!*world && parallel && train_world_start(&argc, &argv, world)) return CLI_FAILED;
  if (*world && train_world_size(*world) > 1 && !parallel) {
    rc = cli_usage_error("started on %d ranks: --data-parallel or --tensor-parallel trains one model on all of "
                         "them (without either, run one process)", train_world_size(*world));
  } else if (*world && o.tensor_parallel && (size_t)train_world_size(*world) != o.tensor_parallel) {
    rc = cli_usage_error("--tensor-parallel %zu needs %zu ranks (mpirun -np %zu): started on %d", o.tensor_parallel,
                         o.tensor_parallel, o.tensor_parallel, train_world_size(*world));
  } else if (*world) {
    /* one model on every rank: a rank given other options would train another (MPMD launches) */
    char all[8192];
    size_t len = 0;
    for (int i = 1; i < argc && len < sizeof all; i++)
      len += (size_t)snprintf(all + len, sizeof all - len, "%s", argv[i]) + 1;
    uint64_t hash;
    int differing;
    if (train_world_same_bits(*world, all, len < sizeof all ? len : sizeof all, &hash, &differing)) return CLI_FAILED;
    if (differing >= 0)
      rc = cli_usage_error("rank %d was given other options than rank 0: every rank needs the same", differing);
  }
  if ((rc = together(*world, rc))) return rc;
  data_set data;
  char err[1024];
  if (o.data) {
    rc = data_load(&data, o.data, err, sizeof err);
    if (rc) cli_error("%s", err);
  } else if (data_builtin(&data, o.corpus_bytes, 1)) {
    cli_error("out of memory for the corpus");
    rc = 1;
  }
  int mine = rc; /* this rank's data is there to free */
  if ((rc = together(*world, rc))) {
    if (!mine) data_free(&data);
    return rc;
  }
  /* one rank under mpirun without --data-parallel or --tensor-parallel: the one-process run,
   * MPI unused */
  train_world *dp = parallel ? *world : NULL;
  if (!o.n_sweep && !o.n_sweep_lr) rc = train_run(&o, &data, NULL, NULL, dp);
  else rc = sweep(&o, &data, dp);
  data_free(&data);
  return rc;
}

int main(int argc, char **argv) {
  cli_init("stabmeter-train");
  train_world *world = NULL;
  /* Under a launcher MPI starts before the options are read, so that a bad option on one rank
   * stops every rank (with MPI built in; run without mpirun, nothing of it happens). */
  int rc = train_world_launched() && train_world_start(&argc, &argv, &world) ? CLI_FAILED
           : run(argc, argv, &world);
  train_world_finish(world);
  return rc;
}
