/* train.c — stabmeter-train's options and main: trains the byte-level transformer of model.c
 * on the built-in corpus or a file, with AdamW or the articles' steepest descent, measuring
 * every layer's stability with a stab_monitor every K steps (one run: run.c), or sweeps widths
 * and learning rates (a run each, compared in sweep.c). Progress on stderr, results on stdout; the
 * final weights as safetensors in --out (checkpoint.c). */
#include "cli.h"
#include "data.h"
#include "options.h"
#include "run.h"
#include "stabmeter.h"
#include "sweep.h"
#include "train_world.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
