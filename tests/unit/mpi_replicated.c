/* mpi_replicated.c — stab_mpi_monitor_measure: every rank holds the same model; after each step
 * every rank's metrics must be the same bits as a single-process monitor's on the same weights
 * (registered in the same process: both read the very same arrays). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"

#define NLAYERS 8

typedef struct {
  stab_layer l[NLAYERS];
  float *buf[NLAYERS][3]; /* weight, bias or weight_k */
  size_t len[NLAYERS][3];
} model;

static float *part(model *md, int i, int k, size_t n) {
  md->len[i][k] = n;
  md->buf[i][k] = malloc(n * sizeof(float));
  if (md->buf[i][k]) mpi_fill(md->buf[i][k], n, (uint64_t)(i * 3 + k + 1), 1, 1.0f);
  return md->buf[i][k];
}

/* Kinds and shapes the monitor measures differently, costs from 32 to 18000 elements. */
static void build(model *md) {
  memset(md, 0, sizeof *md);
  md->l[0] = (stab_layer){.name = "fc", .kind = STAB_KIND_LINEAR, .d_in = 64, .d_out = 96};
  md->l[0].weight = part(md, 0, 0, 64 * 96);
  md->l[0].bias = part(md, 0, 1, 96);
  md->l[1] = (stab_layer){.name = "proj", .kind = STAB_KIND_LINEAR, .d_in = 96, .d_out = 40};
  md->l[1].weight = part(md, 1, 0, 96 * 40);
  md->l[2] = (stab_layer){.name = "narrow", .kind = STAB_KIND_LINEAR, .d_in = 130, .d_out = 20};
  md->l[2].weight = part(md, 2, 0, 130 * 20);
  md->l[3] = (stab_layer){.name = "wte", .kind = STAB_KIND_EMBEDDING, .vocab = 200, .width = 32};
  md->l[3].weight = part(md, 3, 0, 200 * 32);
  md->l[4] = (stab_layer){.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = 150, .width = 32};
  md->l[4].weight = part(md, 4, 0, 150 * 32);
  md->l[5] = (stab_layer){.name = "ln_f", .kind = STAB_KIND_GAIN, .d_in = 32, .d_out = 32};
  md->l[5].weight = part(md, 5, 0, 32);
  md->l[6] = (stab_layer){.name = "b_out", .kind = STAB_KIND_BIAS, .d_in = 32, .d_out = 32};
  md->l[6].weight = part(md, 6, 0, 32);
  md->l[7] = (stab_layer){.name = "attn", .kind = STAB_KIND_ATTENTION, .d_in = 32, .d_out = 32, .heads = 4};
  md->l[7].weight = part(md, 7, 0, 32 * 32);
  md->l[7].weight_k = part(md, 7, 2, 32 * 32);
}

static void release(model *md) {
  for (int i = 0; i < NLAYERS; i++)
    for (int k = 0; k < 3; k++) free(md->buf[i][k]);
}

/* An optimizer step: a small seeded change to every weight. */
static void step(model *md, int t) {
  for (int i = 0; i < NLAYERS; i++)
    for (int k = 0; k < 3; k++) {
      float *x = md->buf[i][k];
      if (!x) continue;
      float *d = malloc(md->len[i][k] * sizeof *d);
      if (!d) continue;
      mpi_fill(d, md->len[i][k], (uint64_t)(1000 * t + 10 * i + k), 1, 1e-2f);
      for (size_t j = 0; j < md->len[i][k]; j++) x[j] += d[j];
      free(d);
    }
}

static stab_monitor *monitor_of(model *md, int layers) {
  stab_monitor *m = NULL;
  stab_monitor_params p = stab_monitor_default_params();
  p.metrics.spectral.threads = 1 + rank % 2; /* threads may differ between ranks */
  if (stab_monitor_create(&p, &m) != STAB_OK) return NULL;
  for (int i = 0; i < layers; i++)
    if (stab_monitor_add_layer(m, &md->l[i], NULL) != STAB_OK) {
      stab_monitor_free(m);
      return NULL;
    }
  return m;
}

static int same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* Every field of every layer, and the head bounds, bit for bit. */
static void compare(const char *when, const stab_monitor *got, const stab_monitor *want) {
  for (size_t i = 0; i < NLAYERS; i++) {
    const stab_metrics *g = stab_monitor_metrics(got, i), *w = stab_monitor_metrics(want, i);
    CHECK(g && w && same_bits(g, w, sizeof *g), "%s: layer %zu: sigma %.17g vs %.17g, update %.17g vs %.17g, forward "
          "%.17g vs %.17g, flags %d vs %d", when, i, g->sigma, w->sigma, g->update, w->update, g->forward, w->forward,
          g->flags, w->flags);
    const double *gh = stab_monitor_head_bounds(got, i), *wh = stab_monitor_head_bounds(want, i);
    if (wh) CHECK(gh && same_bits(gh, wh, 4 * sizeof *gh), "%s: layer %zu: head bounds differ", when, i);
  }
}

/* The same model stored as BF16 (the f32 numbers truncated), read in place by every rank. */
static void to_bf16(const model *md, model *bf, uint16_t *h[NLAYERS][3]) {
  *bf = *md;
  for (int i = 0; i < NLAYERS; i++) {
    bf->l[i].dtype = STAB_DTYPE_BF16;
    for (int k = 0; k < 3; k++) {
      h[i][k] = NULL;
      if (!md->buf[i][k] || !(h[i][k] = malloc(md->len[i][k] * sizeof(uint16_t)))) continue;
      for (size_t j = 0; j < md->len[i][k]; j++) {
        uint32_t bits;
        memcpy(&bits, &md->buf[i][k][j], sizeof bits);
        h[i][k][j] = (uint16_t)(bits >> 16);
      }
    }
    bf->l[i].weight = (const float *)(const void *)h[i][0];
    bf->l[i].bias = h[i][1] ? (const float *)(const void *)h[i][1] : NULL;
    bf->l[i].weight_k = h[i][2] ? (const float *)(const void *)h[i][2] : NULL;
  }
}

/* A BF16 model: every rank's metrics the bits of one process's monitor of the same layers, over
 * steps taken in bf16 (a few units in the last place); a rank holding one layer in another dtype
 * is refused on every rank, naming the dtype. */
static void replicated_bf16_cases(const model *md) {
  model bf;
  uint16_t *h[NLAYERS][3];
  to_bf16(md, &bf, h);
  stab_monitor *rep = monitor_of(&bf, NLAYERS), *ref = monitor_of(&bf, NLAYERS);
  CHECK(rep && ref, "replicated bf16: monitors: %s", stab_last_error());
  if (rep && ref) {
    stab_status st = stab_mpi_monitor_measure(MPI_COMM_WORLD, rep, 0);
    CHECK(st == STAB_OK, "replicated bf16: first measure: %s", stab_last_error());
    CHECK(stab_monitor_measure(ref, 0) == STAB_OK, "replicated bf16: reference measure");
    compare("bf16, cold", rep, ref);
    for (int t = 1; t <= 2; t++) {
      CHECK(stab_monitor_snapshot(rep) == STAB_OK && stab_monitor_snapshot(ref) == STAB_OK, "bf16 snapshots");
      for (int i = 0; i < NLAYERS; i++)
        for (int k = 0; k < 3; k++)
          for (size_t j = 0; h[i][k] && j < md->len[i][k]; j++)
            if ((h[i][k][j] & 0x7fffu) >= 8u) h[i][k][j] = (uint16_t)(h[i][k][j] + (int)((j * 7 + (size_t)t) % 5) - 2);
      st = stab_mpi_monitor_measure(MPI_COMM_WORLD, rep, 1);
      CHECK(st == STAB_OK, "replicated bf16: step %d: %s", t, stab_last_error());
      CHECK(stab_monitor_measure(ref, 1) == STAB_OK, "replicated bf16: reference step %d", t);
      CHECK(stab_monitor_metrics(ref, 0)->update > 0, "replicated bf16: step %d: update %g", t,
            stab_monitor_metrics(ref, 0)->update);
      char when[32];
      snprintf(when, sizeof when, "bf16, step %d", t);
      compare(when, rep, ref);
    }
  }
  stab_monitor_free(rep);
  stab_monitor_free(ref);
  /* the last rank holds layer 0 as F32: the same shape, another dtype */
  model odd = bf;
  if (rank == ranks - 1) odd.l[0] = md->l[0];
  stab_monitor *m = monitor_of(&odd, NLAYERS);
  if (m) {
    stab_status st = stab_mpi_monitor_measure(MPI_COMM_WORLD, m, 0);
    CHECK(ranks == 1 ? st == STAB_OK : st == STAB_EINVAL && strstr(stab_last_error(), "dtype"),
          "dtypes differ: %d '%s'", (int)st, stab_last_error());
  }
  stab_monitor_free(m);
  for (int i = 0; i < NLAYERS; i++)
    for (int k = 0; k < 3; k++) free(h[i][k]);
}

void replicated_cases(void) {
  model md;
  build(&md);
  stab_monitor *rep = monitor_of(&md, NLAYERS), *ref = monitor_of(&md, NLAYERS);
  CHECK(rep && ref, "replicated: monitors: %s", stab_last_error());
  if (rep && ref) {
    stab_status st = stab_mpi_monitor_measure(MPI_COMM_WORLD, rep, 0);
    CHECK(st == STAB_OK, "replicated: first measure: %s", stab_last_error());
    CHECK(stab_monitor_measure(ref, 0) == STAB_OK, "replicated: reference measure");
    compare("cold", rep, ref);
    for (int t = 1; t <= 3; t++) {
      CHECK(stab_monitor_snapshot(rep) == STAB_OK && stab_monitor_snapshot(ref) == STAB_OK, "snapshots");
      step(&md, t);
      if (t == 3) md.buf[1][0][5] = NAN; /* a layer goes bad, on every rank (replicated) */
      st = stab_mpi_monitor_measure(MPI_COMM_WORLD, rep, 1);
      CHECK(st == STAB_OK, "replicated: step %d: %s", t, stab_last_error());
      CHECK(stab_monitor_measure(ref, 1) == STAB_OK, "replicated: reference step %d", t);
      char when[32];
      snprintf(when, sizeof when, "step %d", t);
      compare(when, rep, ref);
    }
    CHECK(stab_monitor_metrics(rep, 1)->flags & STAB_FLAG_NONFINITE_WEIGHT, "replicated: the NaN layer's flag");
    /* with_update and no snapshot: the monitor's own error, on every rank */
    st = stab_mpi_monitor_measure(MPI_COMM_WORLD, rep, 1);
    CHECK(st == STAB_ESTATE && strstr(stab_last_error(), "no snapshot"), "replicated: no snapshot: %d '%s'", (int)st,
          stab_last_error());
  }
  stab_monitor_free(rep);
  stab_monitor_free(ref);
  /* stab_monitor_measure_some leaves the other layers as they were */
  stab_monitor *some = monitor_of(&md, NLAYERS);
  if (some) {
    unsigned char which[NLAYERS] = {0};
    which[2] = 1;
    CHECK(stab_monitor_measure_some(some, 0, which) == STAB_OK, "measure_some");
    CHECK(stab_monitor_metrics(some, 2)->sigma > 0 && stab_monitor_metrics(some, 0)->passes == 0 &&
          isnan(stab_monitor_metrics(some, 3)->forward), "measure_some measured other layers: %d %g",
          stab_monitor_metrics(some, 0)->passes, stab_monitor_metrics(some, 3)->forward);
  }
  stab_monitor_free(some);
  /* one rank with a layer fewer: every rank refuses */
  stab_monitor *odd = monitor_of(&md, rank == ranks - 1 ? NLAYERS - 1 : NLAYERS);
  if (odd) {
    stab_status st = stab_mpi_monitor_measure(MPI_COMM_WORLD, odd, 0);
    CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "layers"), "layer counts differ: %d '%s'", (int)st,
          stab_last_error());
  }
  stab_monitor_free(odd);
  replicated_bf16_cases(&md);
  release(&md);
}
