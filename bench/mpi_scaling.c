/* mpi_scaling.c — what measuring a model costs per step on P MPI ranks, measured on this
 * machine, and a model of P up to 1024 on a real interconnect. Run under mpirun by
 * bench/mpi_scaling.sh, once per P.
 *
 * Measured, on a GPT-2-shaped model (llm.c's layers: the token table, 4 linears and 2 gains a
 * block, the final gain; width C, MLP 4C):
 *   - data parallel: every rank holds the whole model; stab_mpi_monitor_measure per training
 *     step (snapshot, a small weight change, the metrics and the updates), the slowest rank's
 *     time;
 *   - tensor parallel: each of a block's 4 linears split Megatron's way (c_attn and c_fc by
 *     output rows, attn.c_proj and mlp.c_proj by input columns), stab_mpi_sharded_sigma warm
 *     per step after a small change of the shard, and the per-pass exchange alone (the same two
 *     MPI_Allreduce calls the library makes: 3 doubles MAX, then the block's vectors as int64
 *     SUM), so that a pass splits into local work and communication.
 *   - a step's split layers batched: B blocks' linears (q, k, v and mlp.c_fc split by output
 *     rows, attn.c_proj and mlp.c_proj by input columns: 6 a block), the metrics with the
 *     updates per step, by stab_mpi_linear_measure_batch and by stab_mpi_linear_measure on
 *     each layer in turn (twin handles, the same bits checked), the slowest rank's time and
 *     the collectives each way (counted through MPI's profiling interface).
 * Modelled: the tensor-parallel pass at P ranks, local work shrinking as 1/P from this run's
 * figure and the exchange as an all-reduce on a network of latency alpha and bandwidth beta
 * (2 ceil(log2 P) alpha per call, 2 (P - 1)/P bytes/beta: recursive doubling's latency and a
 * ring's bandwidth), and where the exchange starts to cost more than the local pass. */
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "stabmeter.h"
#include "mpi_count.h"
#include "stabmeter_mpi.h"

static int rank, ranks;

static void usage(FILE *f) {
  fprintf(f, "usage: mpirun -np P mpi_scaling [--width C] [--blocks L] [--vocab V] [--steps N]\n"
             "         [--threads T] [--alpha US] [--beta GBPS] [--batch-blocks B] [--batch-only]\n"
             "  C 768, L 12, V 50257 (GPT-2 124M), N 6 measured steps after a cold one, T 1 thread\n"
             "  per rank; the model's network: alpha microseconds a message (default 1.0), beta GB/s\n"
             "  a link (default 12.5: InfiniBand EDR, 100 Gb/s); B 4 blocks of split linears measured\n"
             "  batched and one by one (0: not), --batch-only that part alone\n");
}

/* Element i of a seeded matrix, the same on every rank whatever its shard. */
static float element(uint64_t seed, uint64_t i) {
  uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ULL ^ seed * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebULL;
  z ^= z >> 29;
  return (float)(0.02 * 3.4641 * ((double)(z >> 11) * 0x1.0p-53 - 0.5)); /* std 0.02 */
}

/* A training step's change to element (i, j) of a rows x cols matrix (i*cols + j = first + k),
 * about 1e-3 of the weights' size: a rank-one direction kept from step to step, whose norm is
 * some 5 times the rest, plus noise that is new each step. Updates have such a leading
 * direction (momentum keeps it); independent noise alone would be a gapless matrix each step,
 * where no warm start helps, and would time the update estimates cold. */
static void change(float *w, size_t n, uint64_t first, size_t cols, int step) {
  const double big = 3.0 / sqrt((double)(cols > n / cols ? cols : n / cols + 1));
  for (size_t k = 0; k < n; k++) {
    const uint64_t g = first + k, i = g / cols, j = g % cols;
    const double u = element(7, i) / 0.02, v = element(11, j) / 0.02; /* std 1 */
    w[k] += 0.001f * (float)(0.02 * big * u * v + 0.3 * element(1000003u + (uint64_t)step, g));
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* the slowest rank's seconds */
static double slowest(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

static void fail(const char *what) {
  if (rank == 0) fprintf(stderr, "mpi_scaling: %s: %s\n", what, stab_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct {
  size_t width, blocks, vocab;
  int steps, threads;
  double alpha, beta;
  size_t batch_blocks;
  int batch_only;
} options;

/* Data parallel: the whole model on every rank, its layers divided among the ranks. */
static void replicated(const options *o) {
  const size_t C = o->width, L = o->blocks;
  const size_t n_layers = 1 + 6 * L + 1;
  float **w = calloc(n_layers, sizeof *w);
  size_t *len = calloc(n_layers, sizeof *len), *cols = calloc(n_layers, sizeof *cols);
  char (*names)[48] = calloc(n_layers, sizeof *names);
  stab_monitor_params mp = stab_monitor_default_params();
  mp.metrics.spectral.threads = o->threads;
  stab_monitor *m = NULL;
  if (!w || !len || !cols || !names || stab_monitor_create(&mp, &m) != STAB_OK) fail("monitor");
  static const char *const lin_name[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  const size_t lin[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}; /* d_in, d_out */
  size_t n = 0;
  for (size_t b = 0; b <= L + 1; b++) {
    const size_t parts = b == 0 || b == L + 1 ? 1 : 6;
    for (size_t k = 0; k < parts; k++, n++) {
      stab_layer l;
      memset(&l, 0, sizeof l);
      l.name = names[n];
      if (b == 0) {
        snprintf(names[n], sizeof names[n], "wte");
        l.kind = STAB_KIND_EMBEDDING, l.vocab = o->vocab, l.width = C, len[n] = o->vocab * C;
      } else if (b == L + 1) {
        snprintf(names[n], sizeof names[n], "ln_f");
        l.kind = STAB_KIND_GAIN, l.d_in = l.d_out = C, len[n] = C;
      } else if (k < 4) {
        snprintf(names[n], sizeof names[n], "h.%zu.%s", b - 1, lin_name[k]);
        l.kind = STAB_KIND_LINEAR, l.d_in = lin[k][0], l.d_out = lin[k][1], len[n] = lin[k][0] * lin[k][1];
      } else {
        snprintf(names[n], sizeof names[n], "h.%zu.ln_%zu", b - 1, k - 3);
        l.kind = STAB_KIND_GAIN, l.d_in = l.d_out = C, len[n] = C;
      }
      cols[n] = l.kind == STAB_KIND_LINEAR ? l.d_in : l.kind == STAB_KIND_EMBEDDING ? C : len[n];
      w[n] = malloc(len[n] * sizeof **w);
      if (!w[n]) fail("out of memory");
      for (size_t i = 0; i < len[n]; i++) w[n][i] = element(n + 1, i) + (l.kind == STAB_KIND_GAIN ? 1.0f : 0.0f);
      l.weight = w[n];
      if (stab_monitor_add_layer(m, &l, NULL) != STAB_OK) fail("a layer");
    }
  }
  double weights = 0;
  for (size_t i = 0; i < n; i++) weights += (double)len[i];
  double *t = malloc((size_t)o->steps * sizeof *t);
  if (!t) fail("out of memory");
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = monotonic_seconds();
  if (stab_mpi_monitor_measure(MPI_COMM_WORLD, m, 0) != STAB_OK) fail("cold measure");
  const double cold = slowest(monotonic_seconds() - t0);
  for (int s = 0; s < o->steps; s++) {
    if (stab_monitor_snapshot(m) != STAB_OK) fail("snapshot");
    for (size_t i = 0; i < n; i++) change(w[i], len[i], 0, cols[i], s);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = monotonic_seconds();
    if (stab_mpi_monitor_measure(MPI_COMM_WORLD, m, 1) != STAB_OK) fail("measure");
    t[s] = slowest(monotonic_seconds() - t0);
  }
  if (rank == 0)
    printf("data parallel, P=%d, %d thread(s) a rank: %zu layers (%.1f M weights): cold %.1f ms, a step "
           "(weights and updates) %.1f ms (median of %d)\n",
           ranks, o->threads, n, weights / 1e6, cold * 1e3, median(t, o->steps) * 1e3,
           o->steps);
  stab_monitor_free(m);
  for (size_t i = 0; i < n; i++) free(w[i]);
  free(w);
  free(len);
  free(cols);
  free(names);
  free(t);
}

/* The per-pass exchange alone: the library's two calls for a block of nv vectors of n. */
static double exchange_seconds(size_t n, int nv) {
  const size_t k = (size_t)nv * n + 1;
  int64_t *q = calloc(k, sizeof *q);
  double s[3] = {1, 2, 0};
  enum { REPS = 64 };
  double t[REPS];
  if (!q) fail("out of memory");
  for (int r = 0; r < REPS; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = monotonic_seconds();
    MPI_Allreduce(MPI_IN_PLACE, s, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, q, (int)k, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    t[r] = slowest(monotonic_seconds() - t0);
  }
  free(q);
  return median(t, REPS);
}

static int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) k++;
  return k;
}

/* Tensor parallel: one block's linears, each split among the ranks. */
static void sharded(const options *o) {
  const size_t C = o->width;
  static const char *const name[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  const size_t shape[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}}; /* rows (d_out), cols (d_in) */
  const stab_mpi_split split[4] = {STAB_MPI_SPLIT_ROWS, STAB_MPI_SPLIT_COLS, STAB_MPI_SPLIT_ROWS, STAB_MPI_SPLIT_COLS};
  if (rank == 0)
    printf("tensor parallel, P=%d: a block's linears split Megatron's way, warm estimates after a step\n"
           "  %-12s %11s %6s %9s %9s %9s %9s\n",
           ranks, "layer", "shape", "split", "a step", "passes", "exchange", "local");
  for (int k = 0; k < 4; k++) {
    const size_t R = shape[k][0], K = shape[k][1], whole = split[k] == STAB_MPI_SPLIT_ROWS ? R : K;
    stab_mpi_shard sh = {split[k], R, K, whole * (size_t)rank / (size_t)ranks,
                         whole * (size_t)(rank + 1) / (size_t)ranks};
    const size_t sr = split[k] == STAB_MPI_SPLIT_ROWS ? sh.end - sh.begin : R;
    const size_t sc = split[k] == STAB_MPI_SPLIT_ROWS ? K : sh.end - sh.begin;
    float *w = malloc(sr * sc * sizeof *w);
    if (!w) fail("out of memory");
    for (size_t i = 0; i < sr; i++)
      for (size_t j = 0; j < sc; j++) {
        const size_t gi = split[k] == STAB_MPI_SPLIT_ROWS ? sh.begin + i : i;
        const size_t gj = split[k] == STAB_MPI_SPLIT_ROWS ? j : sh.begin + j;
        w[i * sc + j] = element(100 + (uint64_t)k, gi * K + gj);
      }
    stab_spectral_params sp = stab_spectral_default_params();
    sp.threads = o->threads;
    stab_mpi_sharded *s = NULL;
    if (stab_mpi_sharded_create(MPI_COMM_WORLD, &sh, &sp, &s) != STAB_OK) fail("sharded create");
    stab_sigma_result r;
    if (stab_mpi_sharded_sigma(s, w, sc, &r) != STAB_OK) fail("cold sigma");
    double *t = malloc((size_t)o->steps * sizeof *t);
    if (!t) fail("out of memory");
    int passes = 0;
    for (int st = 0; st < o->steps; st++) {
      for (size_t i = 0; i < sr; i++) {
        const size_t gi = split[k] == STAB_MPI_SPLIT_ROWS ? sh.begin + i : i, gj = split[k] == STAB_MPI_SPLIT_ROWS ? 0 : sh.begin;
        change(w + i * sc, sc, gi * K + gj, K, st);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = monotonic_seconds();
      if (stab_mpi_sharded_sigma(s, w, sc, &r) != STAB_OK) fail("warm sigma");
      t[st] = slowest(monotonic_seconds() - t0);
      passes += r.passes;
    }
    const double step = median(t, o->steps), per_pass = step * o->steps / passes;
    /* the vectors of a pass live on the side that is not split: d_in split by rows, d_out by columns */
    const size_t n = split[k] == STAB_MPI_SPLIT_ROWS ? K : R;
    const double ex = exchange_seconds(n, 2);
    if (rank == 0) {
      char sh_s[32];
      snprintf(sh_s, sizeof sh_s, "%zux%zu", R, K);
      printf("  %-12s %11s %6s %7.2f ms %9.1f %6.1f us %6.2f ms\n", name[k], sh_s,
             split[k] == STAB_MPI_SPLIT_ROWS ? "rows" : "cols", step * 1e3, (double)passes / o->steps, ex * 1e6,
             (per_pass - ex) * 1e3);
      /* the model: local work as 1/P of this run's whole matrix, the exchange on the network */
      if (k == 2) {
        const double local_whole = (per_pass - ex) * ranks, bytes = 8.0 * (2.0 * (double)n + 1);
        printf("  model of %s's warm pass on P ranks, network alpha %.2f us, beta %.1f GB/s "
               "(local work from this run, as 1/P):\n    %6s %11s %11s %7s\n",
               name[k], o->alpha, o->beta, "P", "local", "exchange", "ratio");
        int crossed = 0;
        for (int p = 1; p <= 1024; p *= 2) {
          const double loc = local_whole / p;
          const double net = p == 1 ? 0.0 : 2 * (2 * ceil_log2(p) * o->alpha * 1e-6) + 2.0 * (p - 1) / p * bytes / (o->beta * 1e9);
          printf("    %6d %8.1f us %8.1f us %7.2f%s\n", p, loc * 1e6, net * 1e6, net / loc,
                 !crossed && net > loc ? "  <- the exchange costs more than the local pass from here" : "");
          if (net > loc) crossed = 1;
        }
      }
    }
    stab_mpi_sharded_free(s);
    free(w);
    free(t);
  }
}

/* A step's split linears: every layer's metrics with its update, batched and one by one. */
static void batched(const options *o) {
  const size_t C = o->width, B = o->batch_blocks, per = 6, n = B * per;
  static const char *const name[6] = {"attn.q", "attn.k", "attn.v", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  const size_t shape[6][2] = {{C, C}, {C, C}, {C, C}, {C, C}, {4 * C, C}, {C, 4 * C}}; /* d_out, d_in */
  const stab_mpi_split split[6] = {STAB_MPI_SPLIT_ROWS, STAB_MPI_SPLIT_ROWS, STAB_MPI_SPLIT_ROWS,
                                   STAB_MPI_SPLIT_COLS, STAB_MPI_SPLIT_ROWS, STAB_MPI_SPLIT_COLS};
  stab_mpi_linear **hb = calloc(n, sizeof *hb), **hs = calloc(n, sizeof *hs);
  float **w = calloc(n, sizeof *w), **w0 = calloc(n, sizeof *w0);
  stab_layer *l = calloc(n, sizeof *l), *l0 = calloc(n, sizeof *l0);
  const stab_layer **lp = calloc(n, sizeof *lp), **bp = calloc(n, sizeof *bp);
  stab_metrics *mb = calloc(n, sizeof *mb), *ms = calloc(n, sizeof *ms);
  size_t *len = calloc(n, sizeof *len), *first = calloc(n, sizeof *first), *ld = calloc(n, sizeof *ld);
  double *tb = calloc((size_t)o->steps, sizeof *tb), *ts = calloc((size_t)o->steps, sizeof *ts);
  if (!hb || !hs || !w || !w0 || !l || !l0 || !lp || !bp || !mb || !ms || !len || !first || !ld || !tb || !ts)
    fail("out of memory");
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.threads = o->threads;
  double weights = 0;
  for (size_t i = 0; i < n; i++) {
    const int k = (int)(i % per);
    const size_t R = shape[k][0], K = shape[k][1], whole = split[k] == STAB_MPI_SPLIT_ROWS ? R : K;
    stab_mpi_shard sh = {split[k], R, K, whole * (size_t)rank / (size_t)ranks, whole * (size_t)(rank + 1) / (size_t)ranks};
    const size_t sr = split[k] == STAB_MPI_SPLIT_ROWS ? sh.end - sh.begin : R;
    const size_t sc = split[k] == STAB_MPI_SPLIT_ROWS ? K : sh.end - sh.begin;
    len[i] = sr * sc;
    ld[i] = sc;
    w[i] = malloc(len[i] * sizeof **w);
    w0[i] = malloc(len[i] * sizeof **w0);
    if (!w[i] || !w0[i]) fail("out of memory");
    for (size_t a = 0; a < sr; a++)
      for (size_t b = 0; b < sc; b++) {
        const size_t gi = split[k] == STAB_MPI_SPLIT_ROWS ? sh.begin + a : a;
        const size_t gj = split[k] == STAB_MPI_SPLIT_ROWS ? b : sh.begin + b;
        w[i][a * sc + b] = element(300 + i, gi * K + gj);
      }
    first[i] = split[k] == STAB_MPI_SPLIT_ROWS ? sh.begin * K : sh.begin;
    l[i] = (stab_layer){.name = name[k], .kind = STAB_KIND_LINEAR, .d_out = sr, .d_in = sc, .weight = w[i]};
    l0[i] = (stab_layer){.weight = w0[i]};
    lp[i] = &l[i];
    bp[i] = &l0[i];
    weights += (double)R * (double)K;
    if (stab_mpi_linear_create(MPI_COMM_WORLD, &sh, 0, &mp, &hb[i]) != STAB_OK ||
        stab_mpi_linear_create(MPI_COMM_WORLD, &sh, 0, &mp, &hs[i]) != STAB_OK)
      fail("linear create");
  }
  /* the cold step, untimed: both sets warm from then on */
  if (stab_mpi_linear_measure_batch(hb, n, lp, NULL, mb) != STAB_OK) fail("cold batch");
  for (size_t i = 0; i < n; i++)
    if (stab_mpi_linear_measure(hs[i], lp[i], NULL, &ms[i]) != STAB_OK) fail("cold single");
  long cb = 0, cs = 0;
  double bytes = 0;
  int same = 1, passes = 0, most = 0;
  for (int s = 0; s < o->steps; s++) {
    for (size_t i = 0; i < n; i++) { /* a step: before = the weights, then their change */
      memcpy(w0[i], w[i], len[i] * sizeof **w);
      const int k = (int)(i % per);
      const size_t sr = l[i].d_out, sc = l[i].d_in, K = shape[k][1];
      for (size_t a = 0; a < sr; a++) change(w[i] + a * sc, sc, first[i] + a * K, K, s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    mpi_collectives = 0;
    mpi_counting = 1;
    double t0 = monotonic_seconds();
    for (size_t i = 0; i < n; i++)
      if (stab_mpi_linear_measure(hs[i], lp[i], bp[i], &ms[i]) != STAB_OK) fail("single");
    ts[s] = slowest(monotonic_seconds() - t0);
    mpi_counting = 0;
    cs += mpi_collectives;
    MPI_Barrier(MPI_COMM_WORLD);
    mpi_collectives = 0;
    mpi_reduced_bytes = 0;
    mpi_counting = 1;
    t0 = monotonic_seconds();
    if (stab_mpi_linear_measure_batch(hb, n, lp, bp, mb) != STAB_OK) fail("batch");
    tb[s] = slowest(monotonic_seconds() - t0);
    mpi_counting = 0;
    cb += mpi_collectives;
    if (s == 0) bytes = mpi_reduced_bytes; /* the batch's: the same vectors as the single calls' */
    for (size_t i = 0; i < n; i++) {
      same = same && !memcmp(&mb[i], &ms[i], sizeof mb[i]);
      passes += mb[i].passes + mb[i].update_passes;
      const int r = mb[i].passes > mb[i].update_passes ? mb[i].passes : mb[i].update_passes;
      if (r > most) most = r;
    }
  }
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (rank == 0)
    printf("a step's split linears, P=%d, %d thread(s) a rank: %zu blocks x 6 = %zu linears (%.1f M weights), "
           "weights and updates, warm (%d steps; %.1f passes a step in all, the largest %d)%s:\n"
           "  one by one  %7.2f ms a step (median), %6.1f collectives a step\n"
           "  batched     %7.2f ms a step (median), %6.1f collectives a step; the same bits: %s\n",
           ranks, o->threads, B, n, weights / 1e6, o->steps, (double)passes / o->steps, most,
           provided >= MPI_THREAD_FUNNELED ? "" : " (MPI_THREAD_SINGLE: the estimates in turn)",
           median(ts, o->steps) * 1e3, (double)cs / o->steps, median(tb, o->steps) * 1e3, (double)cb / o->steps,
           same ? "yes" : "NO");
  /* the model: a step's local work as 1/P of this run's batched step times P, each collective
   * an all-reduce of latency 2 ceil(log2 P) alpha, the bytes (the same either way) over the
   * ring's bandwidth */
  if (rank == 0) {
    const double local_whole = median(tb, o->steps) * ranks, per_b = (double)cb / o->steps, per_s = (double)cs / o->steps;
    printf("  model of this step on P ranks, network alpha %.2f us, beta %.1f GB/s (local work from the batched "
           "step, as 1/P; %.0f kB all-reduced a step):\n    %6s %10s %12s %12s %8s %8s\n",
           o->alpha, o->beta, bytes / 1e3, "P", "local", "one by one", "batched", "ratio 1", "ratio b");
    int crossed_s = 0, crossed_b = 0;
    for (int p = 1; p <= 1024; p *= 2) {
      const double loc = local_whole / p, lat = p == 1 ? 0.0 : 2 * ceil_log2(p) * o->alpha * 1e-6;
      const double bw = p == 1 ? 0.0 : 2.0 * (p - 1) / p * bytes / (o->beta * 1e9);
      const double ns = per_s * lat + bw, nb = per_b * lat + bw;
      printf("    %6d %7.2f ms %9.2f ms %9.2f ms %8.2f %8.2f%s%s\n", p, loc * 1e3, ns * 1e3, nb * 1e3, ns / loc,
             nb / loc, !crossed_s && ns > loc ? "  <- one by one: the exchanges cost more than the local work" : "",
             !crossed_b && nb > loc ? "  <- batched: the exchanges cost more than the local work" : "");
      if (ns > loc) crossed_s = 1;
      if (nb > loc) crossed_b = 1;
    }
  }
  for (size_t i = 0; i < n; i++) {
    stab_mpi_linear_free(hb[i]);
    stab_mpi_linear_free(hs[i]);
    free(w[i]);
    free(w0[i]);
  }
  free(hb), free(hs), free(w), free(w0), free(l), free(l0), free(lp), free(bp);
  free(mb), free(ms), free(len), free(first), free(ld), free(tb), free(ts);
}

int main(int argc, char **argv) {
  /* FUNNELED: stab_mpi_linear_measure_batch's worker threads never call MPI */
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  static const struct option opts[] = {{"width", required_argument, 0, 'c'}, {"blocks", required_argument, 0, 'l'},
                                       {"vocab", required_argument, 0, 'v'}, {"steps", required_argument, 0, 's'},
                                       {"threads", required_argument, 0, 't'}, {"alpha", required_argument, 0, 'a'},
                                       {"beta", required_argument, 0, 'b'}, {"help", no_argument, 0, 'h'},
                                       {"batch-blocks", required_argument, 0, 'B'},
                                       {"batch-only", no_argument, 0, 'O'}, {0, 0, 0, 0}};
  options o = {768, 12, 50257, 6, 1, 1.0, 12.5, 4, 0};
  int c, bad = 0;
  char *end;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    long v = 0;
    double d = 0;
    if (c == 'a' || c == 'b') d = strtod(optarg, &end);
    else if (c != 'h' && c != '?' && c != 'O') v = strtol(optarg, &end, 10);
    if (c != 'h' && c != '?' && c != 'O' &&
        (*end || (c == 'a' || c == 'b' ? !(d > 0) : v < (c == 'l' || c == 'B' ? 0 : 1))))
      bad = 1;
    switch (c) {
    case 'c': o.width = (size_t)v; break;
    case 'l': o.blocks = (size_t)v; break;
    case 'v': o.vocab = (size_t)v; break;
    case 's': o.steps = (int)v; break;
    case 't': o.threads = (int)v; break;
    case 'a': o.alpha = d; break;
    case 'b': o.beta = d; break;
    case 'B': o.batch_blocks = (size_t)v; break;
    case 'O': o.batch_only = 1; break;
    case 'h':
      if (rank == 0) usage(stdout);
      MPI_Finalize();
      return 0;
    default: bad = 1;
    }
  }
  if (bad || optind != argc) {
    if (rank == 0) usage(stderr);
    MPI_Finalize();
    return 2;
  }
  double load = NAN;
  (void)getloadavg(&load, 1);
  if (rank == 0) printf("mpi_scaling (stabmeter %s): P=%d, load average %.2f\n", stab_version(), ranks, load);
  if (!o.batch_only) {
    replicated(&o);
    sharded(&o);
  }
  if (o.batch_blocks > 0) batched(&o);
  MPI_Finalize();
  return 0;
}
