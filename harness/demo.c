/* demo.c — the main job until the trainer exists: builds a synthetic GPT-2-shaped model
 * (llm.c layout: fused qkv, out-major linears with biases, RMSNorm gains, untied LM head),
 * registers every layer with a monitor, takes one random step, and prints every layer's
 * three metrics as a table, with the time the measurements took. */
#include "cli.h"
#include "clock.h"
#include "stabmeter.h"
#include "synth.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t vocab, width, depth, heads;
  int gpt2_init;     /* std 0.02 everywhere instead of the articles' per-kind init */
  double step;       /* relative size of the random step */
  uint64_t seed;
  stab_spectral_method method;
} options;

/* One parameter tensor of the model: its storage and what it is. */
typedef struct {
  char name[64];
  float *w;
  size_t n;
} tensor;

/* A new tensor of count floats: all `fill` when fill is non-zero, else std * N(0, 1). */
static int new_tensor(tensor *t, synth_rng *rng, const char *name, size_t count, double std,
                      double fill) {
  snprintf(t->name, sizeof t->name, "%s", name);
  t->n = count;
  if (!(t->w = malloc(count * sizeof(float)))) {
    cli_error("out of memory for %s (%zu floats)", name, count);
    return 1;
  }
  if (fill != 0.0)
    for (size_t e = 0; e < count; e++) t->w[e] = (float)fill;
  else
    synth_gaussian(t->w, count, std, rng);
  return 0;
}

#ifndef STAB_DOCDIR /* set by Makefile.am: where docs/manual/metrics.md is installed */
#define STAB_DOCDIR "/usr/local/share/doc/stabmeter"
#endif

static void usage(void) {
  printf("Usage: %s [OPTION]...\n"
         "Builds a synthetic GPT-2-shaped model (llm.c layout: fused qkv, biases, RMSNorm gains,\n"
         "untied LM head), measures every layer's forward, dependency and update stability before\n"
         "and after one random step, and prints them as a table with the time the measurements\n"
         "took. The metrics are defined in docs/manual/metrics.md (installed as\n"
         STAB_DOCDIR "/docs/manual/metrics.md).\n"
         "\n"
         "Options:\n"
         "      --width D      model width, 1..8192, divisible by --heads (default 256)\n"
         "      --depth L      blocks, 1..256 (default 4)\n"
         "      --heads H      attention heads (default 4)\n"
         "      --vocab V      vocabulary, 2..1000000 (default 256)\n"
         "      --init KIND    articles (the per-kind init of metrics.md, default) or\n"
         "                     gpt2 (std 0.02 everywhere)\n"
         "      --step X       relative size of the random step, ||dW||_F/||W||_F, in [0, 1)\n"
         "                     (default 1e-3)\n"
         "      --method M     spectral norm estimate: lanczos (default), power or exact\n"
         "      --seed S       seed of the weights and of the step (default 1)\n"
         "  -h, --help         print this help and exit\n"
         "  -V, --version      print the version and exit\n"
         "\n"
         "Exit status:\n"
         "  0  the table was printed\n"
         "  1  a failure (out of memory, a measurement failed)\n"
         "  2  bad usage\n",
         cli_name);
}

static int parse(int argc, char **argv, options *o) {
  static const struct option longs[] = {
      {"width", required_argument, 0, 'w'}, {"depth", required_argument, 0, 'l'},
      {"heads", required_argument, 0, 'H'}, {"vocab", required_argument, 0, 'v'},
      {"init", required_argument, 0, 'i'},  {"step", required_argument, 0, 's'},
      {"method", required_argument, 0, 'm'}, {"seed", required_argument, 0, 'S'},
      {"help", no_argument, 0, 'h'},        {"version", no_argument, 0, 'V'},
      {0, 0, 0, 0}};
  static const char *const inits[] = {"articles", "gpt2", NULL};
  static const char *const methods[] = {"lanczos", "power", "exact", NULL};
  static const stab_spectral_method method_of[] = {STAB_SPECTRAL_LANCZOS, STAB_SPECTRAL_POWER,
                                                   STAB_SPECTRAL_EXACT};
  *o = (options){256, 256, 4, 4, 0, 1e-3, 1, STAB_SPECTRAL_LANCZOS};
  int c, rc = 0, which;
  unsigned long long v = 0;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS, longs, NULL)) != -1) {
    switch (c) {
    case 'w': if (!(rc = cli_whole("--width", optarg, 1, 8192, &v))) o->width = v; break;
    case 'l': if (!(rc = cli_whole("--depth", optarg, 1, 256, &v))) o->depth = v; break;
    case 'H': if (!(rc = cli_whole("--heads", optarg, 1, 8192, &v))) o->heads = v; break;
    case 'v': if (!(rc = cli_whole("--vocab", optarg, 2, 1000000, &v))) o->vocab = v; break;
    case 'S': if (!(rc = cli_whole("--seed", optarg, 0, UINT64_MAX, &v))) o->seed = v; break;
    case 's': rc = cli_real("--step", optarg, 0, 0, 1, 1, &o->step); break;
    case 'i': if (!(rc = cli_choice("--init", optarg, inits, &which))) o->gpt2_init = which == 1; break;
    case 'm': if (!(rc = cli_choice("--method", optarg, methods, &which))) o->method = method_of[which]; break;
    case 'h': usage(); return -1;
    case 'V': cli_version(); return -1;
    default: return cli_getopt_error(c, argv);
    }
    if (rc) return rc;
  }
  if (optind < argc) return cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (o->width % o->heads)
    return cli_usage_error("--width %zu is not divisible by --heads %zu", o->width, o->heads);
  return 0;
}

/* The articles' initial std of a linear layer: forward stability ~ 1. */
static double linear_std(size_t d_in, size_t d_out) {
  return sqrt((double)d_out / (double)d_in) / (sqrt((double)d_in) + sqrt((double)d_out));
}

static int add(stab_monitor *m, const stab_layer *l) {
  stab_status st = stab_monitor_add_layer(m, l, NULL);
  if (st != STAB_OK) {
    cli_error("registering '%s': %s", l->name, stab_last_error());
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  cli_init("stabmeter-demo");
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return rc < 0 ? CLI_OK : rc; /* -1: --help or --version done */
  const size_t V = o.vocab, D = o.width, L = o.depth;
  /* Parameters, llm.c order. Shapes: wte (V, D); per block ln1 (D), qkv (3D, D) + (3D),
   * attproj (D, D) + (D), ln2 (D), fc (4D, D) + (4D), fcproj (D, 4D) + (D); lnf (D); head (V, D). */
  size_t ntensors = 2 + 10 * L + 1, k = 0;
  tensor *t = calloc(ntensors, sizeof *t);
  synth_rng rng;
  synth_seed(&rng, o.seed);
  stab_monitor_params mp = stab_monitor_default_params();
  mp.metrics.spectral.method = o.method;
  stab_monitor *m = NULL;
  if (!t || stab_monitor_create(&mp, &m) != STAB_OK) {
    cli_error("%s", t ? stab_last_error() : "out of memory");
    return 1;
  }
  const double g = 0.02;
  if (new_tensor(&t[k], &rng, "wte", V * D, o.gpt2_init ? g : 1.0, 0.0)) return 1;
  stab_layer emb = {.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = V, .width = D, .weight = t[k].w};
  if (add(m, &emb)) return 1;
  k++;
  char nm[64], nb[64];
  for (size_t l = 0; l < L; l++) {
    struct { const char *what; size_t din, dout; int gain; } lin[] = {
        {"attn.qkv", D, 3 * D, 0}, {"attn.proj", D, D, 0}, {"mlp.fc", D, 4 * D, 0}, {"mlp.proj", 4 * D, D, 0}};
    snprintf(nm, sizeof nm, "h%zu.ln1", l);
    if (new_tensor(&t[k], &rng, nm, D, 0, 1.0)) return 1;
    stab_layer ln = {.name = t[k].name, .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = t[k].w};
    if (add(m, &ln)) return 1;
    k++;
    for (int j = 0; j < 4; j++) {
      if (j == 2) {
        snprintf(nm, sizeof nm, "h%zu.ln2", l);
        if (new_tensor(&t[k], &rng, nm, D, 0, 1.0)) return 1;
        stab_layer ln2 = {.name = t[k].name, .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = t[k].w};
        if (add(m, &ln2)) return 1;
        k++;
      }
      size_t din = lin[j].din, dout = lin[j].dout;
      /* q, k and v are three linear maps D -> D inside one fused (3D, D) matrix */
      double std = o.gpt2_init ? g : linear_std(din, j == 0 ? D : dout);
      snprintf(nm, sizeof nm, "h%zu.%s.weight", l, lin[j].what);
      if (new_tensor(&t[k], &rng, nm, din * dout, std, 0.0)) return 1;
      snprintf(nb, sizeof nb, "h%zu.%s.bias", l, lin[j].what);
      if (new_tensor(&t[k + 1], &rng, nb, dout, 0, 0.0)) return 1;
      if (j == 0) {
        const char *part[3] = {"q", "k", "v"};
        for (int p = 0; p < 3; p++) {
          snprintf(nm, sizeof nm, "h%zu.attn.%s", l, part[p]);
          stab_layer q = {.name = nm, .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D,
                          .weight = t[k].w + (size_t)p * D * D, .bias = t[k + 1].w + (size_t)p * D};
          if (add(m, &q)) return 1;
        }
        snprintf(nm, sizeof nm, "h%zu.attn.logits", l);
        stab_layer at = {.name = nm, .kind = STAB_KIND_ATTENTION, .d_in = D, .d_out = D, .heads = o.heads,
                         .weight = t[k].w, .weight_k = t[k].w + D * D};
        if (add(m, &at)) return 1;
      } else {
        snprintf(nm, sizeof nm, "h%zu.%s", l, lin[j].what);
        stab_layer li = {.name = nm, .kind = STAB_KIND_LINEAR, .d_in = din, .d_out = dout,
                         .weight = t[k].w, .bias = t[k + 1].w};
        if (add(m, &li)) return 1;
      }
      k += 2;
    }
  }
  if (new_tensor(&t[k], &rng, "lnf", D, 0, 1.0)) return 1;
  stab_layer lnf = {.name = "lnf", .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = t[k].w};
  if (add(m, &lnf)) return 1;
  k++;
  if (new_tensor(&t[k], &rng, "lm_head", V * D, o.gpt2_init ? g : 1.0 / (double)D, 0.0)) return 1;
  stab_layer head = {.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = V, .width = D, .weight = t[k].w};
  if (add(m, &head)) return 1;
  k++;

  /* Step 0: the model at init, cold start. */
  double t0 = monotonic_seconds();
  if (stab_monitor_measure(m, 0) != STAB_OK || stab_monitor_snapshot(m) != STAB_OK) {
    cli_error("%s", stab_last_error());
    return 1;
  }
  double cold = monotonic_seconds() - t0;
  /* One random step: every tensor moves by o.step of its own size (biases, zero at init,
   * by o.step absolute RMS). */
  for (size_t i = 0; i < k; i++) {
    double ss = 0.0;
    for (size_t e = 0; e < t[i].n; e++) ss += (double)t[i].w[e] * t[i].w[e];
    double rms = sqrt(ss / (double)t[i].n);
    double std = o.step * (rms > 0 ? rms : 1.0);
    for (size_t e = 0; e < t[i].n; e++) t[i].w[e] += (float)(std * synth_normal(&rng));
  }
  t0 = monotonic_seconds();
  stab_status st = stab_monitor_measure(m, 1);
  double warm = monotonic_seconds() - t0;
  if (st != STAB_OK) {
    cli_error("%s", stab_last_error());
    return 1;
  }

  printf("stabmeter %s demo: synthetic model V=%zu D=%zu L=%zu H=%zu, %s init, one random step "
         "of relative size %g\n\n", stab_version(), V, D, L, o.heads, o.gpt2_init ? "gpt2 (std 0.02)" : "articles'",
         o.step);
  printf("%-18s %-9s %11s %10s %10s %10s %9s %8s %6s\n", "layer", "kind", "d_in x d_out", "forward",
         "dependency", "update", "sigma", "rel_err", "passes");
  int passes = 0;
  for (size_t i = 0; i < stab_monitor_layer_count(m); i++) {
    const stab_layer *l = stab_monitor_layer(m, i);
    const stab_metrics *x = stab_monitor_metrics(m, i);
    char shape[32];
    if (l->kind == STAB_KIND_GAIN || l->kind == STAB_KIND_BIAS) snprintf(shape, sizeof shape, "%zu", l->d_out);
    else snprintf(shape, sizeof shape, "%zux%zu", l->d_in, l->d_out);
    printf("%-18s %-9s %11s %10.4g %10.4g %10.4g %9.4g %8.1e %6d%s\n", l->name, stab_kind_name(l->kind), shape,
           x->forward, x->dependency, x->update, x->sigma, x->sigma_rel_err, x->passes + x->update_passes,
           x->flags ? "  (flagged)" : "");
    passes += x->passes + x->update_passes;
  }
  printf("\nLM head tight bounds (centred): forward %.4g, dependency %.4g, update %.4g\n",
         stab_monitor_metrics(m, stab_monitor_layer_count(m) - 1)->forward_tight,
         stab_monitor_metrics(m, stab_monitor_layer_count(m) - 1)->dependency_tight,
         stab_monitor_metrics(m, stab_monitor_layer_count(m) - 1)->update_tight);
  printf("%zu layers: cold measurement %.1f ms; after the step, with updates and warm starts, "
         "%.1f ms (%d passes); monitor memory %.1f MB\n",
         stab_monitor_layer_count(m), 1e3 * cold, 1e3 * warm, passes, stab_monitor_memory(m) / 1e6);
  stab_monitor_free(m);
  for (size_t i = 0; i < k; i++) free(t[i].w);
  free(t);
  return 0;
}
