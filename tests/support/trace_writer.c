/* trace_writer.c — writes a trace for tests that read it from outside (trace_h5py.sh) and
 * times appends (--bench). The model is small and deterministic; --expect writes the values of
 * the last row, one "dataset value" line each, for the reader to compare with what it reads. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "stabmeter.h"

static void usage(FILE *f) {
  fprintf(f, "usage: trace_writer [--steps N] [--flush-every K] [--delay-ms M] [--layers L]\n"
             "                    [--expect FILE] [--bench] [--append --first-step S] PATH\n"
             "  default: 4 layers of every kind (one named blocks/0/fc), 20 steps, flush every step\n"
             "  (--flush-every 0: the library's default, a writer thread at most once a second);\n"
             "  --layers L: L linear layers 32 x 32 instead; --bench: time the appends alone;\n"
             "  --append: add the steps S .. S+N-1 to the trace at PATH (an older one, say)\n");
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"steps", required_argument, 0, 's'},
                                       {"flush-every", required_argument, 0, 'f'},
                                       {"delay-ms", required_argument, 0, 'd'},
                                       {"layers", required_argument, 0, 'l'},
                                       {"expect", required_argument, 0, 'e'},
                                       {"bench", no_argument, 0, 'b'},
                                       {"append", no_argument, 0, 'a'},
                                       {"first-step", required_argument, 0, 'F'},
                                       {"help", no_argument, 0, 'h'},
                                       {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
  long steps = 20, flush_every = 1, delay_ms = 0, n_linear = 0, first = 0;
  const char *expect = NULL;
  int bench = 0, append = 0, c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (c) {
    case 's': steps = strtol(optarg, NULL, 10); break;
    case 'f': flush_every = strtol(optarg, NULL, 10); break;
    case 'd': delay_ms = strtol(optarg, NULL, 10); break;
    case 'l': n_linear = strtol(optarg, NULL, 10); break;
    case 'e': expect = optarg; break;
    case 'b': bench = 1; break;
    case 'a': append = 1; break;
    case 'F': first = strtol(optarg, NULL, 10); break;
    case 'h': usage(stdout); return 0;
    case 'V': printf("trace_writer (stabmeter) %s\n", stab_version()); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (optind + 1 != argc || steps < 1 || flush_every < 0 || n_linear < 0) {
    usage(stderr);
    return 2;
  }
  const char *path = argv[optind];

  /* Weights: a deterministic pattern, nudged every step so that update metrics exist. */
  enum { D = 32, V = 50, H = 2 };
  size_t n_layers = n_linear ? (size_t)n_linear : 4;
  const size_t per = n_linear ? (size_t)D * D : (size_t)2 * V * D; /* floats a layer's weights take */
  float *w = calloc(n_layers * per, sizeof *w);
  stab_monitor *m = NULL;
  if (!w || stab_monitor_create(NULL, &m) != STAB_OK) return 1;
  for (size_t i = 0; i < n_layers * per; i++) w[i] = (float)sin(0.37 * (double)i + 1.0) * 0.2f;
  for (size_t i = 0; i < n_layers; i++) {
    char name[32];
    stab_layer l;
    memset(&l, 0, sizeof l);
    l.weight = w + i * per;
    if (n_linear) {
      snprintf(name, sizeof name, "h.%zu.fc", i);
      l.kind = STAB_KIND_LINEAR, l.d_in = D, l.d_out = D;
    } else if (i == 0) {
      snprintf(name, sizeof name, "blocks/0/fc");
      l.kind = STAB_KIND_LINEAR, l.d_in = D, l.d_out = D;
    } else if (i == 1) {
      snprintf(name, sizeof name, "wte");
      l.kind = STAB_KIND_EMBEDDING, l.vocab = V, l.width = D;
    } else if (i == 2) {
      snprintf(name, sizeof name, "ln_f");
      l.kind = STAB_KIND_GAIN, l.d_in = D, l.d_out = D;
    } else {
      snprintf(name, sizeof name, "attn");
      l.kind = STAB_KIND_ATTENTION, l.d_in = D, l.d_out = D, l.heads = H;
      l.weight_k = l.weight + D * D;
    }
    l.name = name;
    if (stab_monitor_add_layer(m, &l, NULL) != STAB_OK) {
      fprintf(stderr, "trace_writer: %s\n", stab_last_error());
      return 1;
    }
  }

  static const char *const scalars[] = {"loss", "lr"};
  static const char *const extras[] = {"act_rms"};
  stab_trace_params p = stab_trace_default_params();
  p.flush_every = (int)flush_every;
  p.scalars = scalars, p.n_scalars = 2;
  p.layer_extras = extras, p.n_layer_extras = 1;
  p.run_config = "{\"model\": \"trace_writer\"}";
  p.append = append;
  stab_trace *t = NULL;
  double t_open = monotonic_seconds();
  if (stab_trace_open(path, m, &p, &t) != STAB_OK) {
    fprintf(stderr, "trace_writer: %s\n", stab_last_error());
    return 1;
  }
  double *ex = malloc(n_layers * sizeof *ex);
  if (!ex) return 1;
  double t0 = monotonic_seconds(), in_append = 0;
  t_open = t0 - t_open;
  int rc = 0;
  if (bench && stab_monitor_measure(m, 0) != STAB_OK) rc = 1;
  for (long s = 0; s < steps && rc == 0; s++) {
    if (!bench) {
      if (stab_monitor_snapshot(m) != STAB_OK) rc = 1;
      for (size_t i = 0; i < n_layers * per; i += 7) w[i] += 1e-3f * (float)((s + i) % 5);
      if (stab_monitor_measure(m, 1) != STAB_OK) rc = 1;
    }
    double sc[2] = {1.0 / (double)(s + 1), 1e-3};
    for (size_t i = 0; i < n_layers; i++) ex[i] = (double)i + 0.5 * (double)s;
    double a = monotonic_seconds();
    if (stab_trace_append(t, first + s, a - t0, sc, ex) != STAB_OK) rc = 1;
    in_append += monotonic_seconds() - a;
    if (delay_ms) {
      struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  if (rc) fprintf(stderr, "trace_writer: %s\n", stab_last_error());
  if (expect && rc == 0) {
    FILE *f = fopen(expect, "w");
    if (!f) return 1;
    fprintf(f, "rows %lld\n", (long long)stab_trace_steps(t));
    for (size_t i = 0; i < n_layers; i++) {
      const stab_layer *l = stab_monitor_layer(m, i);
      const stab_metrics *mt = stab_monitor_metrics(m, i);
      char g[64];
      snprintf(g, sizeof g, "%s", l->name);
      for (char *q = g; *q; q++)
        if (*q == '/') *q = '.';
      fprintf(f, "layers/%s/forward %.17g\n", g, mt->forward);
      fprintf(f, "layers/%s/update %.17g\n", g, mt->update);
      fprintf(f, "layers/%s/act_rms %.17g\n", g, ex[i]);
      if (l->kind == STAB_KIND_ATTENTION)
        for (size_t h = 0; h < l->heads; h++)
          fprintf(f, "layers/%s/head%zu_bound %.17g\n", g, h, stab_monitor_head_bounds(m, i)[h]);
    }
    fprintf(f, "scalars/loss %.17g\n", 1.0 / (double)steps);
    fclose(f);
  }
  double t_close = monotonic_seconds();
  if (stab_trace_close(t) != STAB_OK) {
    fprintf(stderr, "trace_writer: %s\n", stab_last_error());
    rc = 1;
  }
  t_close = monotonic_seconds() - t_close;
  /* One line a run, for bench/trace_layers.sh: seconds for the open, every append and the close
   * (the last write of the rows still staged included), and the same per layer. */
  if (bench)
    printf("%zu layers, flush every %ld, %ld appends: open %.3f s, appends %.3f s (%.1f us each), close %.3f s; "
           "per layer: open %.2f us, append %.3f us, close %.2f us\n",
           n_layers, flush_every, steps, t_open, in_append, 1e6 * in_append / (double)steps, t_close,
           1e6 * t_open / (double)n_layers, 1e6 * in_append / (double)steps / (double)n_layers,
           1e6 * t_close / (double)n_layers);
  stab_monitor_free(m);
  free(ex);
  free(w);
  return rc;
}
