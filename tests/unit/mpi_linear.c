/* mpi_linear.c — stab_mpi_linear_*: a linear layer split by rows or by columns among the ranks,
 * measured step after step, against stab_layer_metrics on the whole layer (every rank builds
 * the whole layer's weights at every step from the same seed): at f64 tolerances every metric
 * to 1e-12 relative, at the default tolerance within the reported errors; the same bits on
 * every rank; warm starts (within tol like the cold first step); NaN on one rank; failures on
 * one rank reaching every rank. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"

static void share(size_t extent, const int *weight, size_t *begin, size_t *end) {
  mpi_share_of(rank, extent, weight, begin, end);
}

static int same_on_every_rank(const stab_metrics *m) {
  unsigned char lo[sizeof *m], hi[sizeof *m];
  MPI_Allreduce(m, lo, (int)sizeof *m, MPI_UNSIGNED_CHAR, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(m, hi, (int)sizeof *m, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD);
  return memcmp(lo, hi, sizeof *m) == 0;
}

/* got against want: NaN for NaN, else within rel (plus err, the estimates' reported errors) */
static int near(double got, double want, double rel) {
  if (isnan(want)) return isnan(got);
  return got == want || fabs(got - want) <= rel * fabs(want);
}

enum { NO_NAN = 0, NAN_IN_WEIGHTS = 1, NAN_IN_UPDATE = 2, NAN_IN_BIAS = 3 };

typedef struct {
  const char *name;
  stab_mpi_split split;
  size_t d_out, d_in;
  const int *weight;  /* the ranks' shares */
  int bias, bf16;     /* a bias; weights BF16, without a bias (before stays F32) */
  double tol;         /* the spectral tolerance */
  int nan;            /* NO_NAN, or NaN put in the last rank's part at step 2 (NAN_IN_BIAS:
                         split by rows) */
  int grid;           /* F32 weights on the grid of 2^-20 below 4: W - before exact in f32 */
} linear_spec;

/* x on the grid of 2^-20 (|x| < 4: 22 bits, so that differences of two are exact in f32) */
static float on_grid(float x) { return (float)(nearbyint((double)x * 0x1p20) * 0x1p-20); }

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* Three steps of a whole layer: W_0, then W_t = W_{t-1} + dW_t, the updates along one
 * direction with a little noise (as a trainer's momentum makes them), so that warm starts
 * help both estimates. Each step measured whole in one process and split among the ranks. */
static void linear_case(const linear_spec *c) {
  const size_t n = c->d_out * c->d_in, steps = 3;
  float *w = malloc((steps + 1) * n * sizeof *w), *b = malloc((steps + 1) * c->d_out * sizeof *b);
  float *dir = malloc(n * sizeof *dir), *noise = malloc(n * sizeof *noise);
  uint16_t *w16 = malloc((steps + 1) * n * sizeof *w16);
  mpi_fill(w, n, c->d_out + 7 * c->d_in, 11, 1.0f);
  for (size_t i = 0; i < c->d_out; i++)
    for (size_t j = 0; j < c->d_in; j++) w[i * c->d_in + j] += 0.5f * (float)(sin(0.1 * (double)(i + 1)) * cos(0.07 * (double)j));
  if (c->grid)
    for (size_t i = 0; i < n; i++) w[i] = on_grid(w[i]);
  mpi_fill(b, c->d_out, c->d_out + 1, 11, 0.2f);
  /* the update's direction: a rank-one spike over noise, its top singular values well apart
   * (on a flat spectrum, tol 1e-9 leaves errors of 1e-10, and warm starts gain nothing) */
  mpi_fill(dir, n, 3 * c->d_in + 1, 11, 0.002f);
  for (size_t i = 0; i < c->d_out; i++)
    for (size_t j = 0; j < c->d_in; j++) dir[i * c->d_in + j] += 0.003f * (float)(cos(0.13 * (double)(i + 1)) * sin(0.05 * (double)(j + 2)));
  for (size_t t = 1; t <= steps; t++) {
    mpi_fill(noise, n, 100 + t, 11, 0.0005f);
    for (size_t i = 0; i < n; i++) {
      w[t * n + i] = w[(t - 1) * n + i] + (1.0f + 0.1f * (float)t) * dir[i] + noise[i];
      if (c->grid) w[t * n + i] = on_grid(w[t * n + i]);
    }
    for (size_t i = 0; i < c->d_out; i++) b[t * c->d_out + i] = b[(t - 1) * c->d_out + i] + 0.01f * (float)t;
  }
  stab_mpi_shard sh = {c->split, c->d_out, c->d_in, 0, 0};
  share(c->split == STAB_MPI_SPLIT_ROWS ? c->d_out : c->d_in, c->weight, &sh.begin, &sh.end);
  const int by_rows = c->split == STAB_MPI_SPLIT_ROWS;
  size_t last_begin = 0, last_end = 0; /* the last rank's part, where the NaN goes (on every rank's whole copy) */
  mpi_share_of(ranks - 1, by_rows ? c->d_out : c->d_in, c->weight, &last_begin, &last_end);
  if (c->nan == NAN_IN_WEIGHTS) w[2 * n + (by_rows ? last_begin * c->d_in : last_begin)] = NAN;
  if (c->nan == NAN_IN_BIAS) b[2 * c->d_out + last_begin] = NAN; /* split by rows: the last rank's entry */
  /* step 2's before: W_1 with a NaN in the last rank's part (W_1 itself, step 1's weights, stays finite) */
  float *w1_nan = malloc(n * sizeof *w1_nan);
  memcpy(w1_nan, w + n, n * sizeof *w1_nan);
  if (c->nan == NAN_IN_UPDATE) w1_nan[by_rows ? (last_end - 1) * c->d_in : last_end - 1] = NAN;
  for (size_t i = 0; i < (steps + 1) * n; i++) w16[i] = mpi_to_bf16(w[i]);
  stab_metrics_params p = stab_metrics_default_params();
  p.spectral.tol = c->tol;
  p.spectral.threads = 1 + rank % 2; /* threads may differ between ranks */
  stab_mpi_linear *h = NULL;
  stab_status st = stab_mpi_linear_create(MPI_COMM_WORLD, &sh, c->bias, &p, &h);
  CHECK(st == STAB_OK, "%s: create: %s", c->name, stab_last_error());
  int cold_passes = 0, cold_update_passes = 0;
  for (size_t t = 1; h && t <= steps; t++) {
    /* the whole layer after step t, and before it: W_{t-1} in F32 */
    stab_layer whole = {.name = c->name, .kind = STAB_KIND_LINEAR, .d_in = c->d_in, .d_out = c->d_out,
                        .weight = c->bf16 ? (const float *)(w16 + t * n) : w + t * n,
                        .bias = c->bias ? b + t * c->d_out : NULL, /* BF16 cases have none */
                        .dtype = c->bf16 ? STAB_DTYPE_BF16 : STAB_DTYPE_F32};
    const int nan_before = c->nan == NAN_IN_UPDATE && t == 2;
    stab_layer whole0 = {.weight = nan_before ? w1_nan : w + (t - 1) * n,
                         .bias = c->bias ? b + (t - 1) * c->d_out : NULL};
    stab_metrics want, got;
    CHECK(stab_layer_metrics(&whole, &whole0, &p, &want, NULL) == STAB_OK, "%s: single-process: %s", c->name,
          stab_last_error());
    /* this rank's part: pointers into the whole, row stride the whole d_in */
    stab_layer mine = whole, mine0 = whole0;
    const size_t off = by_rows ? sh.begin * c->d_in : sh.begin, elem = c->bf16 ? 2 : 4;
    mine.weight = (const float *)((const char *)whole.weight + off * elem);
    mine0.weight = whole0.weight + off;
    mine.ld = mine0.ld = c->d_in;
    if (by_rows) {
      mine.d_out = sh.end - sh.begin;
      if (mine.bias) mine.bias += sh.begin, mine0.bias += sh.begin;
    } else {
      mine.d_in = sh.end - sh.begin; /* the bias stays whole: replicated */
    }
    st = stab_mpi_linear_measure(h, &mine, &mine0, &got);
    CHECK(st == STAB_OK, "%s step %zu: %s", c->name, t, stab_last_error());
    CHECK(same_on_every_rank(&got), "%s step %zu: the ranks' metrics differ", c->name, t);
    const int f64 = c->tol < STAB_SPECTRAL_F32_TOL_MIN;
    const double es = f64 ? 1e-12 : got.sigma_rel_err + want.sigma_rel_err + 1e-12;
    double eu = f64 ? 1e-12 : got.sigma_update_rel_err + want.sigma_update_rel_err + 1e-12;
    double eu_abs = 0.0; /* the f32 rounding of W - before, off the grid at f64 tolerances */
    if (f64 && !c->grid) {
      /* each difference rounded to f32 (2^-24 relative) moves sigma by at most 2^-24 ||dW||_F,
       * where one process subtracts in f64 */
      double dw2 = 0.0;
      for (size_t i = 0; i < n; i++) {
        const double a = c->bf16 ? (double)from_bf16(w16[t * n + i]) : (double)w[t * n + i];
        const double d = a - (double)whole0.weight[i];
        dw2 += d * d;
      }
      eu_abs = 0x1p-24 * sqrt(dw2);
    }
    const double kf = sqrt((double)c->d_in / (double)c->d_out);
    const double g[] = {got.sigma, got.dependency, got.forward, got.sigma_update, got.update, got.rel_update};
    const double e[] = {want.sigma, want.dependency, want.forward, want.sigma_update, want.update, want.rel_update};
    const double tol[] = {es, es, es, eu + eu_abs / fabs(e[3]), eu + kf * eu_abs / fabs(e[4]), 1e-12};
    static const char *what[] = {"sigma", "dependency", "forward", "sigma_update", "update", "rel_update"};
    for (int k = 0; k < 6; k++)
      CHECK(near(g[k], e[k], tol[k]), "%s step %zu: %s: split %.17g, one process %.17g (rel %.3g, allowed %.3g)",
            c->name, t, what[k], g[k], e[k], fabs(g[k] - e[k]) / fabs(e[k]), tol[k]);
    CHECK(got.flags == want.flags, "%s step %zu: flags %d, one process %d", c->name, t, got.flags, want.flags);
    if (!(got.flags & STAB_FLAG_NONFINITE_WEIGHT))
      CHECK(got.sigma_rel_err <= c->tol, "%s step %zu: rel_err %.3g", c->name, t, got.sigma_rel_err);
    if (c->nan != NO_NAN && t == 2)
      CHECK(got.flags & (c->nan == NAN_IN_UPDATE ? STAB_FLAG_NONFINITE_UPDATE : STAB_FLAG_NONFINITE_WEIGHT),
            "%s step 2: no NaN flag (flags %d)", c->name, got.flags);
    if (t == 1) { /* run to run: a fresh handle on the same parts, the same bits */
      stab_mpi_linear *again = NULL;
      stab_metrics m2;
      CHECK(stab_mpi_linear_create(MPI_COMM_WORLD, &sh, c->bias, &p, &again) == STAB_OK &&
                stab_mpi_linear_measure(again, &mine, &mine0, &m2) == STAB_OK && !memcmp(&m2, &got, sizeof got),
            "%s: a second handle's step 1 differs", c->name);
      stab_mpi_linear_free(again);
      cold_passes = got.passes;
      cold_update_passes = got.update_passes;
    } else if (t == steps && c->nan == NO_NAN) {
      /* warm: not fewer passes than cold (an honest warm start waits for its random vectors,
       * spectral.c "Warm starts"), but never out of passes */
      CHECK(got.passes > 0 && got.passes < p.spectral.max_passes && got.update_passes > 0 &&
                got.update_passes < p.spectral.max_passes,
            "%s: warm passes %d and %d at step 3, cold %d and %d at step 1", c->name, got.passes,
            got.update_passes, cold_passes, cold_update_passes);
    }
  }
  stab_mpi_linear_free(h);
  free(w);
  free(b);
  free(dir);
  free(noise);
  free(w16);
  free(w1_nan);
}

/* Failures on one rank: every rank gets the status, the message naming the rank; none waits. */
static void failure_cases(void) {
  static const int even[3] = {1, 1, 1};
  const size_t d_out = 24, d_in = 20;
  float w[24 * 20], bias[24];
  mpi_fill(w, d_out * d_in, 5, 11, 1.0f);
  mpi_fill(bias, d_out, 6, 11, 0.1f);
  char last[32];
  snprintf(last, sizeof last, "rank %d: ", ranks - 1);
  stab_mpi_shard good = {STAB_MPI_SPLIT_ROWS, d_out, d_in, 0, 0};
  share(d_out, even, &good.begin, &good.end);
  stab_mpi_shard bad = good;
  if (rank == ranks - 1) bad.end = d_out + 1; /* past the whole layer's rows */
  stab_mpi_linear *h = (stab_mpi_linear *)&checks; /* must come back NULL */
  stab_status st = stab_mpi_linear_create(MPI_COMM_WORLD, &bad, 1, NULL, &h);
  CHECK(st == STAB_ERANGE && !h && strstr(stab_last_error(), last), "bad shard on the last rank: %d, '%s'", (int)st,
        stab_last_error());
  h = NULL;
  st = stab_mpi_linear_create(MPI_COMM_WORLD, &good, rank == 0, NULL, &h);
  CHECK(st == STAB_EINVAL && !h && strstr(stab_last_error(), "has_bias"), "has_bias on rank 0 only: %d, '%s'",
        (int)st, stab_last_error());
  st = stab_mpi_linear_create(MPI_COMM_WORLD, &good, 1, NULL, &h);
  CHECK(st == STAB_OK, "create: %s", stab_last_error());
  if (!h) return;
  const size_t rows = good.end - good.begin;
  stab_layer mine = {.kind = STAB_KIND_LINEAR, .d_in = d_in, .d_out = rows, .weight = w + good.begin * d_in,
                     .bias = bias + good.begin};
  stab_layer mine0 = mine;
  stab_metrics out;
  stab_layer wrong = mine;
  if (rank == ranks - 1) wrong.d_in = d_in - 1;
  st = stab_mpi_linear_measure(h, &wrong, &mine0, &out);
  CHECK(st == STAB_EDIM && strstr(stab_last_error(), last) && isnan(out.sigma), "a wrong d_in on the last rank: %d, '%s'",
        (int)st, stab_last_error());
  st = stab_mpi_linear_measure(h, &mine, rank == 0 ? NULL : &mine0, &out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "some ranks"), "before on some ranks only: %d, '%s'", (int)st,
        stab_last_error());
  wrong = mine;
  if (rank == 0) wrong.bias = NULL;
  st = stab_mpi_linear_measure(h, &wrong, NULL, &out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "rank 0: "), "no bias on rank 0: %d, '%s'", (int)st,
        stab_last_error());
  st = stab_mpi_linear_measure(h, rank == ranks - 1 ? NULL : &mine, NULL, &out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "shard_layer is NULL"), "NULL layer: %d, '%s'", (int)st,
        stab_last_error());
  /* and the handle still works after them all: every rank took the same road */
  st = stab_mpi_linear_measure(h, &mine, NULL, &out);
  CHECK(st == STAB_OK && out.sigma > 0 && same_on_every_rank(&out), "after the failures: %d, '%s'", (int)st,
        stab_last_error());
  stab_mpi_linear_free(h);
}

void linear_cases(void) {
  static const int even[3] = {1, 1, 1}, uneven[3] = {1, 3, 2}, one[3] = {0, 1, 1};
  const double f64 = 1e-9, def = stab_spectral_default_params().tol;
  const linear_spec cases[] = {
      {"rows, even, bias", STAB_MPI_SPLIT_ROWS, 96, 64, even, 1, 0, f64, NO_NAN, 1},
      {"columns, even, bias", STAB_MPI_SPLIT_COLS, 64, 96, even, 1, 0, f64, NO_NAN, 1},
      {"rows, uneven, no bias", STAB_MPI_SPLIT_ROWS, 101, 67, uneven, 0, 0, f64, NO_NAN, 1},
      {"columns, uneven, bias", STAB_MPI_SPLIT_COLS, 67, 101, uneven, 1, 0, f64, NO_NAN, 1},
      {"rows, a shard of one row, bias", STAB_MPI_SPLIT_ROWS, 50, 70, one, 1, 0, f64, NO_NAN, 1},
      {"columns, off the grid (dW rounded to f32)", STAB_MPI_SPLIT_COLS, 70, 50, uneven, 1, 0, f64, NO_NAN, 0},
      {"rows, default tol, bias", STAB_MPI_SPLIT_ROWS, 160, 120, uneven, 1, 0, def, NO_NAN, 0},
      {"columns, default tol, no bias", STAB_MPI_SPLIT_COLS, 120, 160, uneven, 0, 0, def, NO_NAN, 0},
      {"rows, BF16 against F32 before", STAB_MPI_SPLIT_ROWS, 80, 64, uneven, 0, 1, f64, NO_NAN, 0},
      {"columns, BF16 against F32 before", STAB_MPI_SPLIT_COLS, 64, 80, even, 0, 1, def, NO_NAN, 0},
      {"rows, NaN in the last rank's weights", STAB_MPI_SPLIT_ROWS, 48, 40, even, 1, 0, f64, NAN_IN_WEIGHTS, 1},
      {"columns, NaN in the last rank's update", STAB_MPI_SPLIT_COLS, 40, 48, uneven, 1, 0, f64, NAN_IN_UPDATE, 1},
      {"rows, NaN in the last rank's bias", STAB_MPI_SPLIT_ROWS, 40, 48, uneven, 1, 0, def, NAN_IN_BIAS, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) linear_case(&cases[i]);
  failure_cases();
}
