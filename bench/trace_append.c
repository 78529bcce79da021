/* trace_append.c — what a trace append costs beside measuring the layers it records, in one run:
 * a GPT-2-124M-shaped monitor (llm.c's 12 blocks x 4 linears and the token table, 49 layers and
 * about 790 datasets a trace) measured every step (stab_monitor_measure; with --updates after a
 * snapshot and a weight change, as in training) and each step appended to a trace, in turn one
 * flushed at every append (flush_every 1, the library's default before flush_seconds) and one
 * with the default parameters. Each policy's append time is printed as a fraction of the
 * measuring time of the same steps. bench/trace_append.sh runs it. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "stabmeter.h"

/* GPT-2 124M as llm.c stores it: width C, MLP 4C, a vocabulary of V (padded tables aside). */
enum { C = 768, BLOCKS = 12, V = 50257 };

static void usage(FILE *f) {
  fprintf(f, "usage: trace_append [--steps N] [--sleep-ms M] [--updates] [--gains] [--extras] DIR\n"
             "  writes DIR/flush_every_1.h5 and DIR/default.h5 (the script removes them), N steps\n"
             "  (default 200) in all, half to each; --sleep-ms: a pause after each step (a trainer's own work);\n"
             "  --updates: snapshot, change the weights and measure the updates too (a training step;\n"
             "  default: the weights alone, warm-started, the cheapest measurement and so the\n"
             "  severest comparison); --gains: also the 25 LayerNorm gains; --extras: act_rms and\n"
             "  act_cos1 per layer\n");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double sum(const double *v, long n) {
  double s = 0;
  for (long i = 0; i < n; i++) s += v[i];
  return s;
}

/* The median and the largest of n values (sorts v). */
static void spread(double *v, long n, double *median, double *max) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  *median = v[n / 2];
  *max = v[n - 1];
}

static void load_average(char *buf, size_t len) {
  FILE *f = fopen("/proc/loadavg", "r");
  double a = NAN, b = NAN, c = NAN;
  if (f) {
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3) a = NAN;
    fclose(f);
  }
  snprintf(buf, len, "%.2f %.2f %.2f", a, b, c);
}

/* A layer's weights: Gaussian-like (sum of two uniforms), std 0.02 as GPT-2 initialises them. */
static float *weights(size_t n, unsigned long long *state) {
  float *w = malloc(n * sizeof *w);
  if (!w) return NULL;
  for (size_t i = 0; i < n; i++) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    double u1 = (double)(*state >> 40) / 16777216.0, u2 = (double)((*state >> 16) & 0xffffff) / 16777216.0;
    w[i] = (float)(0.02 * 2.449 * (u1 + u2 - 1.0)); /* variance of u1 + u2 - 1 is 1/6 */
  }
  return w;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"steps", required_argument, 0, 's'}, {"sleep-ms", required_argument, 0, 'z'},
                                       {"gains", no_argument, 0, 'g'},       {"extras", no_argument, 0, 'e'}, {"updates", no_argument, 0, 'u'},
                                       {"help", no_argument, 0, 'h'},        {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
  long steps = 200, sleep_ms = 0;
  int gains = 0, extras = 0, updates = 0, c;
  char *end;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 's': steps = strtol(optarg, &end, 10); if (*end || steps < 4) { usage(stderr); return 2; } break;
    case 'z': sleep_ms = strtol(optarg, &end, 10); if (*end || sleep_ms < 0) { usage(stderr); return 2; } break;
    case 'g': gains = 1; break;
    case 'e': extras = 1; break;
    case 'u': updates = 1; break;
    case 'h': usage(stdout); return 0;
    case 'V': printf("trace_append (stabmeter) %s\n", stab_version()); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 2;
  }
  const char *dir = argv[optind];

  /* The layers, in llm.c's order: wte, then per block c_attn, attn.c_proj, c_fc, mlp.c_proj
   * (and ln_1, ln_2 with --gains), then ln_f. Weights out-major [d_out][d_in] as llm.c's. */
  static const size_t lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* d_in, d_out */
  static const char *const lin_name[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  enum { MAX_LAYERS = 1 + BLOCKS * 6 + 1 };
  float *w[MAX_LAYERS];
  size_t len[MAX_LAYERS];
  char names[MAX_LAYERS][48];
  size_t n = 0;
  unsigned long long rng = 42;
  stab_monitor *m = NULL;
  if (stab_monitor_create(NULL, &m) != STAB_OK) {
    fprintf(stderr, "trace_append: %s\n", stab_last_error());
    return 1;
  }
  for (int b = -1; b <= BLOCKS; b++) {
    const int parts = b < 0 || b == BLOCKS ? 1 : 4 + 2 * gains;
    for (int k = 0; k < parts; k++) {
      stab_layer l;
      memset(&l, 0, sizeof l);
      l.name = names[n];
      if (b < 0) {
        snprintf(names[n], sizeof names[n], "wte");
        l.kind = STAB_KIND_EMBEDDING, l.vocab = V, l.width = C, len[n] = (size_t)V * C;
      } else if (b == BLOCKS) {
        if (!gains) continue;
        snprintf(names[n], sizeof names[n], "ln_f");
        l.kind = STAB_KIND_GAIN, l.d_in = l.d_out = C, len[n] = C;
      } else if (k < 4) {
        snprintf(names[n], sizeof names[n], "h.%d.%s", b, lin_name[k]);
        l.kind = STAB_KIND_LINEAR, l.d_in = lin[k][0], l.d_out = lin[k][1], l.layout = STAB_LAYOUT_OUT_MAJOR;
        len[n] = lin[k][0] * lin[k][1];
      } else {
        snprintf(names[n], sizeof names[n], "h.%d.ln_%d", b, k - 3);
        l.kind = STAB_KIND_GAIN, l.d_in = l.d_out = C, len[n] = C;
      }
      if (!(w[n] = weights(len[n], &rng))) {
        fprintf(stderr, "trace_append: out of memory\n");
        return 1;
      }
      if (l.kind == STAB_KIND_GAIN)
        for (size_t i = 0; i < len[n]; i++) w[n][i] += 1.0f;
      l.weight = w[n];
      if (stab_monitor_add_layer(m, &l, NULL) != STAB_OK) {
        fprintf(stderr, "trace_append: %s\n", stab_last_error());
        return 1;
      }
      n++;
    }
  }

  static const char *const scalar_names[] = {"loss", "lr"};
  static const char *const extra_names[] = {"act_rms", "act_cos1"};
  /* The two policies in turn, ROUNDS times each, PHASE steps at a time, so that a change of
   * load elsewhere meets both alike; one trace open at a time, as a trainer has (two would share
   * the library's HDF5 lock, and one's writer thread would hold up the other's appends). */
  enum { ROUNDS = 2 };
  static const char *const label[2] = {"flush every append (flush_every 1, flush_seconds 0)", "default parameters"};
  static const char *const key[2] = {"flush_every_1", "default"};
  const long phase = steps / (2 * ROUNDS) > 0 ? steps / (2 * ROUNDS) : 1;
  double *append_s[2], *measure_s[2], close_s[2] = {0, 0}, passes = 0, snapshot = 0;
  long done[2] = {0, 0};
  double *ex = malloc(n * 2 * sizeof *ex);
  int rc = ex ? 0 : 1;
  for (int k = 0; k < 2; k++) {
    append_s[k] = malloc((size_t)(phase * ROUNDS) * sizeof *append_s[k]);
    measure_s[k] = malloc((size_t)(phase * ROUNDS) * sizeof *measure_s[k]);
    if (!append_s[k] || !measure_s[k]) rc = 1;
  }
  /* /step, /wall_time, the scalars and their group's step; per layer its metrics, extras, step */
  const size_t n_dsets = 2 + 2 + 1 + n * (15 + (extras ? 2 : 0) + 1);
  char load0[64], load1[64];
  load_average(load0, sizeof load0);
  /* The first measurement is cold (no warm start): measured before, as a trainer's first step. */
  double t0 = monotonic_seconds();
  if (rc == 0 && stab_monitor_measure(m, 0) != STAB_OK) rc = 1;
  const double cold = monotonic_seconds() - t0;
  long s = 0;
  for (int round = 0; round < ROUNDS && rc == 0; round++)
    for (int k = 0; k < 2 && rc == 0; k++) {
      stab_trace_params p = stab_trace_default_params();
      if (k == 0) p.flush_every = 1, p.flush_seconds = 0;
      p.scalars = scalar_names, p.n_scalars = 2;
      p.layer_extras = extras ? extra_names : NULL, p.n_layer_extras = extras ? 2 : 0;
      p.append = round > 0;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s.h5", dir, key[k]);
      stab_trace *t = NULL;
      if (stab_trace_open(path, m, &p, &t) != STAB_OK) {
        rc = 1;
        break;
      }
      for (long i = 0; i < phase && rc == 0; i++, s++) {
        if (updates) {
          double a = monotonic_seconds();
          if (stab_monitor_snapshot(m) != STAB_OK) rc = 1;
          snapshot += monotonic_seconds() - a;
          for (size_t l = 0; l < n; l++) /* an optimizer step, small and sparse: not timed as measuring */
            for (size_t j = (size_t)s % 61; j < len[l]; j += 61) w[l][j] *= 1.0f - 1e-3f;
        }
        double b = monotonic_seconds();
        if (stab_monitor_measure(m, updates) != STAB_OK) rc = 1;
        measure_s[k][done[k]] = monotonic_seconds() - b;
        for (size_t l = 0; l < n; l++) passes += stab_monitor_metrics(m, l)->passes;
        for (size_t l = 0; l < 2 * n; l++) ex[l] = 0.5 + (double)s;
        const double sc[2] = {3.0 - 1e-3 * (double)s, 6e-4};
        double c0 = monotonic_seconds();
        if (rc == 0 && stab_trace_append(t, s, c0 - t0, sc, extras ? ex : NULL) != STAB_OK) rc = 1;
        append_s[k][done[k]++] = monotonic_seconds() - c0;
        if (sleep_ms) {
          struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
          nanosleep(&ts, NULL);
        }
      }
      double c0 = monotonic_seconds();
      if (stab_trace_close(t) != STAB_OK) rc = 1;
      close_s[k] += monotonic_seconds() - c0;
      fprintf(stderr, "trace_append: round %d of %d, %s: %ld steps\n", round + 1, ROUNDS, key[k], phase);
    }
  if (rc) {
    fprintf(stderr, "trace_append: %s\n", stab_last_error());
    return 1;
  }
  load_average(load1, sizeof load1);

  printf("%zu layers, %zu datasets a trace, %ld steps; load average %s at the start, %s at the end\n", n, n_dsets, s,
         load0, load1);
  if (sleep_ms) printf("pause after each step: %ld ms (a trainer's own work)\n", sleep_ms);
  printf("measure: stab_monitor_measure (%s), %.1f passes a step; cold first %.2f s",
         updates ? "weights and updates" : "weights, warm-started", passes / (double)s, cold);
  if (updates) printf("; the snapshot before it (not counted) %.2f ms", 1e3 * snapshot / (double)s);
  printf("\n");
  for (int k = 0; k < 2; k++) {
    const long nk = done[k];
    const double measure = sum(measure_s[k], nk) / (double)nk, mean = sum(append_s[k], nk) / (double)nk;
    double med, max, mmed, mmax;
    spread(measure_s[k], nk, &mmed, &mmax);
    spread(append_s[k], nk, &med, &max);
    printf("%s, %ld steps: measure mean %.2f ms (median %.2f); append mean %.3f ms, median %.3f, max %.2f; "
           "close %.1f ms\n", label[k], nk, 1e3 * measure, 1e3 * mmed, 1e3 * mean, 1e3 * med, 1e3 * max,
           1e3 * close_s[k] / ROUNDS);
    printf("append_over_measure %s: %.4f%s\n", key[k], mean / measure, k == 1 ? " (target <= 0.10)" : "");
  }
  for (size_t i = 0; i < n; i++) free(w[i]);
  for (int k = 0; k < 2; k++) free(append_s[k]), free(measure_s[k]);
  free(ex);
  stab_monitor_free(m);
  return rc;
}
