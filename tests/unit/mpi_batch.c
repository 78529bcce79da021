/* mpi_batch.c — stab_mpi_linear_measure_batch: a step's split layers measured together,
 * against stab_mpi_linear_measure on twin handles called one after another (the same bits,
 * step after step, NaN in one layer of one rank included), the collectives a call makes
 * (counted here through MPI's profiling interface) within the documented bound, and failures
 * on one rank reaching every rank. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"
#include "mpi_count.h"

static int same_on_every_rank(const void *m, size_t size) {
  unsigned char *lo = malloc(size), *hi = malloc(size);
  MPI_Allreduce(m, lo, (int)size, MPI_UNSIGNED_CHAR, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(m, hi, (int)size, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD);
  const int same = memcmp(lo, hi, size) == 0;
  free(lo);
  free(hi);
  return same;
}

typedef struct {
  const char *name;
  stab_mpi_split split;
  size_t d_out, d_in;
  const int *weight; /* the ranks' shares */
  int bias, bf16, update;
  double tol;
} layer_spec;

/* One layer's weights over the steps (whole, on every rank, from its seed), and this rank's
 * part of them as the batch and the single calls are given it. */
typedef struct {
  const layer_spec *c;
  stab_mpi_shard sh;
  float *w, *b;      /* (steps + 1) x d_out x d_in, (steps + 1) x d_out */
  uint16_t *w16;     /* w in BF16 */
  stab_mpi_linear *batch, *single;
} layer_run;

enum { STEPS = 3, NAN_LAYER = 1, NAN_STEP = 2 };

static void make_layer(layer_run *r, const layer_spec *c, size_t k) {
  const size_t n = c->d_out * c->d_in;
  r->c = c;
  r->w = malloc((STEPS + 1) * n * sizeof *r->w);
  r->b = malloc((STEPS + 1) * c->d_out * sizeof *r->b);
  r->w16 = malloc((STEPS + 1) * n * sizeof *r->w16);
  float *dir = malloc(n * sizeof *dir);
  mpi_fill(r->w, n, 17 + k, 5, 1.0f);
  for (size_t i = 0; i < c->d_out; i++) /* a top singular value well apart */
    for (size_t j = 0; j < c->d_in; j++) r->w[i * c->d_in + j] += 0.6f * (float)(sin(0.1 * (double)(i + 1)) * cos(0.07 * (double)j));
  mpi_fill(dir, n, 40 + k, 5, 0.002f);
  for (size_t i = 0; i < c->d_out; i++)
    for (size_t j = 0; j < c->d_in; j++) dir[i * c->d_in + j] += 0.003f * (float)(cos(0.13 * (double)(i + 1)) * sin(0.05 * (double)(j + 2)));
  mpi_fill(r->b, c->d_out, 60 + k, 5, 0.2f);
  for (size_t t = 1; t <= STEPS; t++) {
    for (size_t i = 0; i < n; i++) r->w[t * n + i] = r->w[(t - 1) * n + i] + (1.0f + 0.1f * (float)t) * dir[i];
    for (size_t i = 0; i < c->d_out; i++) r->b[t * c->d_out + i] = r->b[(t - 1) * c->d_out + i] + 0.01f * (float)t;
  }
  for (size_t i = 0; i < (STEPS + 1) * n; i++) r->w16[i] = mpi_to_bf16(r->w[i]);
  free(dir);
  r->sh = (stab_mpi_shard){c->split, c->d_out, c->d_in, 0, 0};
  mpi_share_of(rank, c->split == STAB_MPI_SPLIT_ROWS ? c->d_out : c->d_in, c->weight, &r->sh.begin, &r->sh.end);
  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.tol = c->tol;
  p.spectral.threads = 1 + (int)((rank + k) % 2); /* threads differing between ranks and layers */
  CHECK(stab_mpi_linear_create(MPI_COMM_WORLD, &r->sh, c->bias, &p, &r->batch) == STAB_OK &&
            stab_mpi_linear_create(MPI_COMM_WORLD, &r->sh, c->bias, &p, &r->single) == STAB_OK,
        "%s: create: %s", c->name, stab_last_error());
}

static void free_layer(layer_run *r) {
  stab_mpi_linear_free(r->batch);
  stab_mpi_linear_free(r->single);
  free(r->w);
  free(r->b);
  free(r->w16);
}

/* This rank's part of step t (and of its before, W_{t-1} in F32): pointers into the whole. */
static void part_of(const layer_run *r, size_t t, stab_layer *mine, stab_layer *mine0) {
  const layer_spec *c = r->c;
  const size_t n = c->d_out * c->d_in, by_rows = c->split == STAB_MPI_SPLIT_ROWS;
  const size_t off = by_rows ? r->sh.begin * c->d_in : r->sh.begin;
  *mine = (stab_layer){.name = c->name, .kind = STAB_KIND_LINEAR, .d_in = c->d_in, .d_out = c->d_out,
                       .ld = c->d_in, .dtype = c->bf16 ? STAB_DTYPE_BF16 : STAB_DTYPE_F32};
  mine->weight = c->bf16 ? (const float *)(r->w16 + t * n + off) : r->w + t * n + off;
  mine->bias = c->bias ? r->b + t * c->d_out : NULL;
  *mine0 = (stab_layer){.weight = r->w + (t - 1) * n + off, .ld = c->d_in,
                        .bias = c->bias ? r->b + (t - 1) * c->d_out : NULL};
  if (by_rows) {
    mine->d_out = r->sh.end - r->sh.begin;
    if (c->bias) mine->bias += r->sh.begin, mine0->bias += r->sh.begin;
  } else {
    mine->d_in = r->sh.end - r->sh.begin;
  }
}

static int provided_level(void) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided;
}

/* The documented bound: 3 + 2 R collectives, R the largest pass count among the estimates
 * (a chained one, BF16 split by rows with an update, counting W's and dW's together), plus
 * one per exchange carrying a NaN; without threads 3 + 2 (sum of the passes). */
static long bound(const layer_run *r, const stab_metrics *m, size_t n, int nan_passes) {
  long R = 0, total = 0;
  for (size_t i = 0; i < n; i++) {
    const int chain = r[i].c->update && r[i].c->bf16 && r[i].c->split == STAB_MPI_SPLIT_ROWS;
    const long pw = m[i].passes, pd = r[i].c->update ? m[i].update_passes : 0;
    const long here = chain ? pw + pd : (pw > pd ? pw : pd);
    if (here > R) R = here;
    total += pw + pd;
  }
  return provided_level() >= MPI_THREAD_FUNNELED ? 3 + 2 * R + nan_passes : 3 + 2 * total + nan_passes;
}

static void batch_steps(void) {
  static const int even[3] = {1, 1, 1}, uneven[3] = {1, 3, 2}, one_row[3] = {0, 1, 1};
  const double f64 = 1e-9, def = stab_spectral_default_params().tol;
  static const layer_spec specs[] = {
      {"rows, even, bias, update", STAB_MPI_SPLIT_ROWS, 96, 64, NULL, 1, 0, 1, 0},
      {"columns, uneven, bias, update (NaN at step 2)", STAB_MPI_SPLIT_COLS, 67, 101, NULL, 1, 0, 1, 0},
      {"rows, a shard of one row, bias, no update", STAB_MPI_SPLIT_ROWS, 50, 70, NULL, 1, 0, 0, 0},
      {"columns, BF16, update", STAB_MPI_SPLIT_COLS, 64, 80, NULL, 0, 1, 1, 0},
      {"rows, BF16, update (chained)", STAB_MPI_SPLIT_ROWS, 80, 64, NULL, 0, 1, 1, 0},
      {"rows, default tol, update", STAB_MPI_SPLIT_ROWS, 160, 120, NULL, 0, 0, 1, 0},
      {"columns, 24 x 12 (few passes)", STAB_MPI_SPLIT_COLS, 24, 12, NULL, 1, 0, 1, 0},
  };
  enum { N = sizeof specs / sizeof specs[0] };
  layer_spec c[N];
  memcpy(c, specs, sizeof c);
  const int *shares[N] = {even, uneven, one_row, even, uneven, uneven, even};
  const double tols[N] = {f64, f64, f64, def, f64, def, def};
  layer_run r[N];
  for (size_t i = 0; i < N; i++) {
    c[i].weight = shares[i];
    c[i].tol = tols[i];
    make_layer(&r[i], &c[i], i);
  }
  /* step 2: a NaN in one layer's part on the last rank only */
  {
    const layer_run *z = &r[NAN_LAYER];
    size_t lb = 0, le = 0;
    mpi_share_of(ranks - 1, z->c->d_in, z->c->weight, &lb, &le);
    z->w[NAN_STEP * z->c->d_out * z->c->d_in + lb] = NAN; /* split by columns: row 0, its first column */
  }
  stab_mpi_linear *hb[N], *hs[N];
  for (size_t i = 0; i < N; i++) hb[i] = r[i].batch, hs[i] = r[i].single;
  for (size_t t = 1; t <= STEPS; t++) {
    stab_layer mine[N], mine0[N];
    const stab_layer *lp[N], *bp[N];
    for (size_t i = 0; i < N; i++) {
      part_of(&r[i], t, &mine[i], &mine0[i]);
      lp[i] = &mine[i];
      bp[i] = c[i].update ? &mine0[i] : NULL;
    }
    stab_metrics got[N], want[N];
    mpi_collectives = 0;
    mpi_counting = 1;
    stab_status st = stab_mpi_linear_measure_batch(hb, N, lp, bp, got);
    mpi_counting = 0;
    const long batched = mpi_collectives;
    CHECK(st == STAB_OK, "step %zu: batch: %s", t, stab_last_error());
    mpi_collectives = 0;
    mpi_counting = 1;
    for (size_t i = 0; i < N; i++) {
      stab_status si = stab_mpi_linear_measure(hs[i], lp[i], bp[i], &want[i]);
      CHECK(si == STAB_OK, "step %zu: %s: single: %s", t, c[i].name, stab_last_error());
    }
    mpi_counting = 0;
    const long single = mpi_collectives;
    for (size_t i = 0; i < N; i++) {
      CHECK(!memcmp(&got[i], &want[i], sizeof got[i]),
            "step %zu: %s: batch sigma %.17g update %.17g passes %d/%d, single %.17g %.17g %d/%d", t, c[i].name,
            got[i].sigma, got[i].sigma_update, got[i].passes, got[i].update_passes, want[i].sigma,
            want[i].sigma_update, want[i].passes, want[i].update_passes);
      /* the NaN layer: its weights at step 2, its update (from step 2's weights) at step 3 */
      const int nan_w = t == NAN_STEP && i == NAN_LAYER, nan_u = t == NAN_STEP + 1 && i == NAN_LAYER;
      const int flags = got[i].flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE);
      CHECK(nan_w   ? flags & STAB_FLAG_NONFINITE_WEIGHT && isnan(got[i].sigma)
            : nan_u ? flags == STAB_FLAG_NONFINITE_UPDATE && isnan(got[i].sigma_update) && got[i].sigma > 0
                    : flags == 0 && got[i].sigma > 0,
            "step %zu: %s: flags %d sigma %g", t, c[i].name, got[i].flags, got[i].sigma);
    }
    CHECK(same_on_every_rank(got, sizeof got), "step %zu: the ranks' metrics differ", t);
    /* a NaN costs a third collective in each exchange that meets it: the sums of squares, and
     * the passes that meet it: step 2's W and dW of the NaN layer, in one exchange when
     * batched, two in turn; step 3's dW */
    const int in_turn = provided_level() < MPI_THREAD_FUNNELED;
    const long most = bound(r, got, N, t == NAN_STEP ? 2 + in_turn : t == NAN_STEP + 1 ? 2 : 0);
    CHECK(batched <= most, "step %zu: %ld collectives, documented at most %ld", t, batched, most);
    CHECK(batched < single, "step %zu: batched %ld collectives, one by one %ld", t, batched, single);
    if (rank == 0 && getenv("STAB_BATCH_SHOW")) {
      fprintf(stderr, "step %zu: collectives batched %ld (bound %ld), one by one %ld; passes", t, batched, most, single);
      for (size_t i = 0; i < N; i++) fprintf(stderr, " %d/%d", got[i].passes, got[i].update_passes);
      fputc('\n', stderr);
    }
  }
  for (size_t i = 0; i < N; i++) free_layer(&r[i]);
}

/* Failures on one rank reach every rank with the rank and the layer named; nobody waits; and
 * the handles work afterwards, every rank having taken the same road. */
static void batch_failures(void) {
  static const int even[3] = {1, 1, 1};
  const size_t d_out = 24, d_in = 40;
  float w[24 * 40], bias[24];
  mpi_fill(w, d_out * d_in, 9, 5, 1.0f);
  mpi_fill(bias, d_out, 10, 5, 0.1f);
  stab_mpi_shard sh = {STAB_MPI_SPLIT_ROWS, d_out, d_in, 0, 0};
  mpi_share_of(rank, d_out, even, &sh.begin, &sh.end);
  enum { N = 3 };
  stab_mpi_linear *h[N] = {NULL, NULL, NULL}, *self = NULL;
  for (int i = 0; i < N; i++)
    CHECK(stab_mpi_linear_create(MPI_COMM_WORLD, &sh, 1, NULL, &h[i]) == STAB_OK, "create: %s", stab_last_error());
  /* a whole layer on this rank alone: a handle of another communicator */
  const stab_mpi_shard whole = {STAB_MPI_SPLIT_ROWS, d_out, d_in, 0, d_out};
  CHECK(stab_mpi_linear_create(MPI_COMM_SELF, &whole, 1, NULL, &self) == STAB_OK, "create on SELF: %s",
        stab_last_error());
  if (!h[0] || !h[1] || !h[2] || !self) return;
  const size_t rows = sh.end - sh.begin;
  stab_layer good = {.kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = rows, .weight = w + sh.begin * d_in,
                     .bias = bias + sh.begin};
  stab_layer wrong = good;
  if (rank == ranks - 1) wrong.d_in = d_in - 1;
  const stab_layer *l[N] = {&good, &good, &good}, *bf[N] = {&good, &good, &good};
  stab_metrics out[N];
  char last[32];
  snprintf(last, sizeof last, "rank %d: ", ranks - 1);

  CHECK(stab_mpi_linear_measure_batch(NULL, 0, NULL, NULL, NULL) == STAB_OK, "n = 0: %s", stab_last_error());
  l[2] = &wrong;
  stab_status st = stab_mpi_linear_measure_batch(h, N, l, bf, out);
  CHECK(st == STAB_EDIM && strstr(stab_last_error(), last) && strstr(stab_last_error(), "layer 2") &&
            isnan(out[0].sigma) && isnan(out[2].sigma),
        "a wrong d_in in layer 2 on the last rank: %d, '%s'", (int)st, stab_last_error());
  l[2] = &good;
  const stab_layer *some[N] = {&good, rank == 0 ? NULL : &good, &good};
  st = stab_mpi_linear_measure_batch(h, N, l, some, out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "layer 1: before is given on some ranks"),
        "before of layer 1 on some ranks only: %d, '%s'", (int)st, stab_last_error());
  stab_mpi_linear *swapped[N] = {h[0], h[1], h[2]};
  if (rank == ranks - 1) swapped[0] = h[1], swapped[1] = h[0];
  st = stab_mpi_linear_measure_batch(swapped, N, l, bf, out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "layer 0 is not the same handle"),
        "handles in another order on the last rank: %d, '%s'", (int)st, stab_last_error());
  stab_mpi_linear *twice[N] = {h[0], h[1], h[rank == 0 ? 0 : 2]};
  st = stab_mpi_linear_measure_batch(twice, N, l, bf, out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "rank 0: ") && strstr(stab_last_error(), "layer 0's too"),
        "a handle twice on rank 0: %d, '%s'", (int)st, stab_last_error());
  stab_mpi_linear *mixed[N] = {h[0], self, h[2]};
  stab_layer whole_layer = {.kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = d_out, .weight = w, .bias = bias};
  const stab_layer *lm[N] = {&good, &whole_layer, &good}, *bm[N] = {&good, &whole_layer, &good};
  st = stab_mpi_linear_measure_batch(mixed, N, lm, bm, out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "layer 1: its handle was created on a communicator"),
        "a handle of MPI_COMM_SELF among MPI_COMM_WORLD's: %d, '%s'", (int)st, stab_last_error());
  /* and the handles still work, the same bits as the single call on a fresh twin */
  stab_mpi_linear *twin = NULL;
  stab_metrics want;
  CHECK(stab_mpi_linear_create(MPI_COMM_WORLD, &sh, 1, NULL, &twin) == STAB_OK, "twin: %s", stab_last_error());
  st = stab_mpi_linear_measure_batch(h, N, l, NULL, out);
  CHECK(st == STAB_OK && stab_mpi_linear_measure(twin, &good, NULL, &want) == STAB_OK &&
            !memcmp(&out[2], &want, sizeof want) && same_on_every_rank(out, sizeof out),
        "after the failures: %d, '%s'", (int)st, stab_last_error());
  stab_mpi_linear_free(twin);
  stab_mpi_linear_free(self);
  for (int i = 0; i < N; i++) stab_mpi_linear_free(h[i]);
}

void batch_cases(void) {
  batch_steps();
  batch_failures();
}
