/* mpi_tables.c — stab_mpi_table_metrics and stab_mpi_vector_metrics: embedding and LM-head
 * tables split by vocabulary, gains and biases by entries, each rank holding a part, against
 * stab_layer_metrics on the whole layer (every rank builds it from the same seed): every metric
 * to 1e-12 relative, the same bits on every rank. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_check.h"

static void fill(float *x, size_t n, uint64_t seed, float amp) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = amp * (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0) + 0.1f * amp * (float)(i % 7);
  }
}

static int close_or_same(double got, double want) {
  if (isnan(want)) return isnan(got);
  return got == want || fabs(got - want) <= 1e-12 * fabs(want);
}

static int same_on_every_rank_bits(const stab_metrics *m) {
  stab_metrics zero = *m;
  unsigned char *b = (unsigned char *)&zero, lo[sizeof zero], hi[sizeof zero];
  MPI_Allreduce(b, lo, (int)sizeof zero, MPI_UNSIGNED_CHAR, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(b, hi, (int)sizeof zero, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD);
  return memcmp(lo, hi, sizeof zero) == 0;
}

/* Rank r's tokens: shares proportional to weight[r], each non-empty. */
static void tokens(size_t V, const int *weight, size_t *begin, size_t *count) {
  int total = 0;
  for (int r = 0; r < ranks; r++) total += weight[r];
  size_t at = 0;
  for (int r = 0; r <= rank; r++) {
    size_t share = r == ranks - 1 ? V - at : V * (size_t)weight[r] / (size_t)total;
    if (share == 0) share = 1;
    *begin = at;
    *count = share;
    at += share;
  }
}

/* A whole table and its state before a step; this rank's shard points into both (rows of a
 * natural table, or columns, ld = V, of an in-major LM head). nan_row: a token made NaN, or -1. */
static void table_case(const char *name, stab_kind kind, stab_layout layout, size_t V, size_t d, const int *weight,
                       long nan_row) {
  float *w = malloc(V * d * sizeof *w), *w0 = malloc(V * d * sizeof *w0);
  fill(w0, V * d, V + d, 1.0f);
  fill(w, V * d, V + d + 1, 0.01f);
  for (size_t i = 0; i < V * d; i++) w[i] += w0[i];
  const int cols = layout == STAB_LAYOUT_IN_MAJOR; /* stored [d][V]: tokens are columns */
  if (nan_row >= 0) w[cols ? (size_t)nan_row : (size_t)nan_row * d] = NAN;
  stab_layer whole = {.name = name, .kind = kind, .vocab = V, .width = d, .layout = layout, .weight = w};
  stab_layer whole0 = whole;
  whole0.weight = w0;
  stab_metrics want, got;
  CHECK(stab_layer_metrics(&whole, &whole0, NULL, &want, NULL) == STAB_OK, "%s: single-process", name);
  size_t b = 0, n = 0;
  tokens(V, weight, &b, &n);
  stab_layer mine = whole, mine0 = whole0;
  mine.vocab = n;
  mine.weight = cols ? w + b : w + b * d;
  mine0.weight = cols ? w0 + b : w0 + b * d;
  mine.ld = mine0.ld = cols ? V : 0;
  stab_status st = stab_mpi_table_metrics(MPI_COMM_WORLD, &mine, b, V, &mine0, NULL, &got);
  CHECK(st == STAB_OK, "%s: %s", name, stab_last_error());
  CHECK(same_on_every_rank_bits(&got), "%s: the ranks' metrics differ", name);
  const double g[] = {got.forward, got.dependency, got.update, got.forward_tight, got.dependency_tight,
                      got.update_tight, got.spread, got.rel_update};
  const double e[] = {want.forward, want.dependency, want.update, want.forward_tight, want.dependency_tight,
                      want.update_tight, want.spread, want.rel_update};
  for (int k = 0; k < 8; k++)
    CHECK(close_or_same(g[k], e[k]), "%s: metric %d: sharded %.17g, single-process %.17g", name, k, g[k], e[k]);
  CHECK(got.flags == want.flags && got.tight_method == want.tight_method, "%s: flags %d vs %d", name, got.flags,
        want.flags);
  if (nan_row >= 0) CHECK(got.flags & STAB_FLAG_NONFINITE_WEIGHT, "%s: no NaN flag", name);
  free(w);
  free(w0);
}

void table_cases(void) {
  static const int even[3] = {1, 1, 1}, uneven[3] = {1, 3, 2}, one_token[3] = {0, 1, 1};
  table_case("wte, uneven", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 203, 48, uneven, -1);
  table_case("lm_head, even", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 150, 40, even, -1);
  table_case("lm_head in-major (tokens as columns)", STAB_KIND_LM_HEAD, STAB_LAYOUT_IN_MAJOR, 130, 24, uneven, -1);
  table_case("wte, a shard of one token", STAB_KIND_EMBEDDING, STAB_LAYOUT_NATURAL, 90, 16, one_token, -1);
  table_case("lm_head, NaN in the last rank's tokens", STAB_KIND_LM_HEAD, STAB_LAYOUT_NATURAL, 120, 32, even, 119);
  /* a gap in the vocabulary on one rank: every rank refuses */
  float w[64 * 8] = {0};
  size_t b = 0, n = 0;
  tokens(64, even, &b, &n);
  stab_layer mine = {.name = "gap", .kind = STAB_KIND_EMBEDDING, .vocab = rank == ranks - 1 ? n - 1 : n, .width = 8,
                     .weight = w + b * 8};
  stab_metrics out;
  stab_status st = stab_mpi_table_metrics(MPI_COMM_WORLD, &mine, b, 64, NULL, NULL, &out);
  CHECK(st == STAB_ERANGE && strstr(stab_last_error(), "cover"), "gap: %d '%s'", (int)st, stab_last_error());
  /* a bad shard (NULL weights) on rank 0 only: every rank gets its error */
  mine.vocab = n;
  if (rank == 0) mine.weight = NULL;
  st = stab_mpi_table_metrics(MPI_COMM_WORLD, &mine, b, 64, NULL, NULL, &out);
  CHECK(st != STAB_OK && strstr(stab_last_error(), "rank 0: "), "NULL weight on rank 0: %d '%s'", (int)st,
        stab_last_error());
}

/* A whole gain or bias and its state before a step; this rank's part points into both.
 * nan_at: an entry made NaN (in the weights, or with in_update in the update), or -1. */
static void vector_case(const char *name, stab_kind kind, size_t n, const int *weight, long nan_at, int in_update,
                        int with_before) {
  float *w = malloc(n * sizeof *w), *w0 = malloc(n * sizeof *w0);
  fill(w0, n, n + 3, 1.0f);
  fill(w, n, n + 4, 0.01f);
  for (size_t i = 0; i < n; i++) w[i] += w0[i];
  if (nan_at >= 0) (in_update ? w0 : w)[nan_at] = NAN;
  stab_layer whole = {.name = name, .kind = kind, .d_in = n, .d_out = n, .weight = w};
  stab_layer whole0 = whole;
  whole0.weight = w0;
  stab_metrics want, got;
  CHECK(stab_layer_metrics(&whole, with_before ? &whole0 : NULL, NULL, &want, NULL) == STAB_OK, "%s: single", name);
  size_t b = 0, c = 0;
  tokens(n, weight, &b, &c);
  stab_layer mine = whole, mine0 = whole0;
  mine.d_in = mine.d_out = mine0.d_in = mine0.d_out = c;
  mine.weight = w + b;
  mine0.weight = w0 + b;
  stab_status st = stab_mpi_vector_metrics(MPI_COMM_WORLD, &mine, b, n, with_before ? &mine0 : NULL, NULL, &got);
  CHECK(st == STAB_OK, "%s: %s", name, stab_last_error());
  CHECK(same_on_every_rank_bits(&got), "%s: the ranks' metrics differ", name);
  const double g[] = {got.forward, got.dependency, got.update, got.rel_update};
  const double e[] = {want.forward, want.dependency, want.update, want.rel_update};
  for (int k = 0; k < 4; k++)
    CHECK(close_or_same(g[k], e[k]), "%s: metric %d: sharded %.17g, single-process %.17g", name, k, g[k], e[k]);
  CHECK(got.flags == want.flags, "%s: flags %d vs %d", name, got.flags, want.flags);
  if (nan_at >= 0) CHECK(got.flags != 0, "%s: no NaN flag", name);
  free(w);
  free(w0);
}

void vector_cases(void) {
  static const int even[3] = {1, 1, 1}, uneven[3] = {1, 3, 2}, one_entry[3] = {0, 1, 1};
  vector_case("ln_1 gain, uneven", STAB_KIND_GAIN, 203, uneven, -1, 0, 1);
  vector_case("c_fc bias, even", STAB_KIND_BIAS, 150, even, -1, 0, 1);
  vector_case("bias, no update", STAB_KIND_BIAS, 77, uneven, -1, 0, 0);
  vector_case("gain, no update", STAB_KIND_GAIN, 77, even, -1, 0, 0);
  vector_case("gain, a shard of one entry", STAB_KIND_GAIN, 40, one_entry, -1, 0, 1);
  vector_case("bias, NaN in the last rank's weights", STAB_KIND_BIAS, 60, even, 59, 0, 1);
  vector_case("gain, NaN in rank 0's update", STAB_KIND_GAIN, 60, even, 0, 1, 1);
  /* before on rank 0 only: every rank refuses (their reduce calls would differ) */
  float w[32] = {0}, w0[32] = {0};
  size_t b = 0, c = 0;
  tokens(32, even, &b, &c);
  stab_layer mine = {.name = "half", .kind = STAB_KIND_BIAS, .d_in = c, .d_out = c, .weight = w + b};
  stab_layer mine0 = mine;
  mine0.weight = w0 + b;
  stab_metrics out;
  stab_status st = stab_mpi_vector_metrics(MPI_COMM_WORLD, &mine, b, 32, rank == 0 ? &mine0 : NULL, NULL, &out);
  CHECK(ranks == 1 || (st == STAB_EINVAL && strstr(stab_last_error(), "some ranks")), "before on rank 0: %d '%s'",
        (int)st, stab_last_error());
  /* a table handed to the vector function, on the last rank: every rank refuses */
  if (rank == ranks - 1) mine.kind = STAB_KIND_EMBEDDING, mine.vocab = c, mine.width = 1;
  st = stab_mpi_vector_metrics(MPI_COMM_WORLD, &mine, b, 32, NULL, NULL, &out);
  CHECK(st == STAB_EINVAL && strstr(stab_last_error(), "not a gain or bias"), "a table: %d '%s'", (int)st,
        stab_last_error());
}
