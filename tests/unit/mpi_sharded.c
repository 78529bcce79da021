/* mpi_sharded.c — libstabmeter_mpi under mpirun (tests/programs/mpi.sh runs it on 2 and 3 ranks): the
 * sharded spectral norms here, the replicated monitor in mpi_replicated.c, tables split by
 * vocabulary in mpi_tables.c, linear layers split by rows or columns in mpi_linear.c. Every
 * case against the single-process library on the whole matrix, which every rank builds from
 * the same seed, and against LAPACK (dgesvd, the exact method). Prints
 * a summary in Check's format ("Checks: N, Failures: F, Errors: 0") on rank 0, the line the
 * quickstart counts; exits 1 when any rank saw a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "mpi_check.h"

int rank, ranks, checks, failures;

/* A seeded rows x cols matrix, uniform in [-1, 1) plus a rank-one spike that keeps the top two
 * singular values apart (so that the single-process estimates converge well inside tol). */
static float *seeded_matrix(size_t rows, size_t cols, uint64_t seed) {
  float *w = malloc(rows * cols * sizeof *w);
  if (!w) return NULL;
  uint64_t s = seed;
  for (size_t i = 0; i < rows * cols; i++) {
    s += 0x9e3779b97f4a7c15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    w[i] = (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) w[i * cols + j] += 0.5f * (float)sin(0.1 * (double)(i + 1)) * (float)cos(0.07 * (double)j);
  return w;
}

/* Splits [0, extent) among the ranks, rank r's share proportional to weight[r]; every share
 * non-empty (extent >= ranks). */
static void split(size_t extent, const int *weight, size_t *begin, size_t *end) {
  int total = 0;
  for (int r = 0; r < ranks; r++) total += weight[r];
  size_t at = 0;
  for (int r = 0; r <= rank; r++) {
    size_t share = r == ranks - 1 ? extent - at : extent * (size_t)weight[r] / (size_t)total;
    if (share == 0) share = 1;
    *begin = at;
    *end = at + share;
    at += share;
  }
}

/* This rank's shard of the whole w, packed: rows [b, e) or columns [b, e). */
static float *shard_of(const float *w, size_t rows, size_t cols, stab_mpi_split sp, size_t b, size_t e) {
  size_t n = e - b;
  float *s = malloc((sp == STAB_MPI_SPLIT_ROWS ? n * cols : rows * n) * sizeof *s);
  if (!s) return NULL;
  if (sp == STAB_MPI_SPLIT_ROWS)
    memcpy(s, w + b * cols, n * cols * sizeof *s);
  else
    for (size_t i = 0; i < rows; i++) memcpy(s + i * n, w + i * cols + b, n * sizeof *s);
  return s;
}

static uint64_t bits(double x) {
  uint64_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* 1 when x has the same bits on every rank. */
static int same_on_every_rank(double x) {
  uint64_t mine = bits(x), lo = 0, hi = 0;
  MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* The sum over one shard: nothing to add. */
static stab_status one_shard(void *ctx, double *y, size_t n, double *quad) {
  (void)ctx, (void)y, (void)n, (void)quad;
  return STAB_OK;
}

/* Passes of the sharded path's own algorithm in one process: Lanczos on the whole matrix, as
 * a single shard (rows split), or on its transpose (columns split, the d_out side). The
 * single-process stab_sigma may take another road (a cold start on at most 128 rows forms the
 * rows-side Gram matrix in one pass), so its pass count is no yardstick. */
static int one_shard_passes(const float *w, size_t rows, size_t cols, stab_mpi_split sp,
                            const stab_spectral_params *p) {
  const size_t r = sp == STAB_MPI_SPLIT_ROWS ? rows : cols, c = sp == STAB_MPI_SPLIT_ROWS ? cols : rows;
  float *m = malloc(r * c * sizeof *m);
  if (!m) return -1;
  for (size_t i = 0; i < r; i++)
    for (size_t j = 0; j < c; j++) m[i * c + j] = sp == STAB_MPI_SPLIT_ROWS ? w[i * cols + j] : w[j * cols + i];
  stab_spectral_workspace *ws = NULL;
  stab_sigma_result res;
  int passes = -1;
  if (stab_spectral_workspace_create(r, c, p, &ws) == STAB_OK &&
      stab_spectral_norm_reduced(ws, m, r, c, 0, r, one_shard, NULL, NULL, &res) == STAB_OK)
    passes = res.passes;
  stab_spectral_workspace_free(ws);
  free(m);
  return passes;
}

/* The whole case: the sharded estimate (cold, then warm on the same matrix), on every rank
 * the same bits, equal to the single-process estimate to 1e-12 at f64 tolerances (within both
 * reported errors otherwise) and to LAPACK within its reported error; a second handle gives
 * the same bits again (run to run). */
static void sharded_case(const char *name, stab_mpi_split sp, size_t rows, size_t cols,
                         const int *weight, double tol, uint64_t seed) {
  float *w = seeded_matrix(rows, cols, seed);
  stab_mpi_shard sh = {sp, rows, cols, 0, 0};
  split(sp == STAB_MPI_SPLIT_ROWS ? rows : cols, weight, &sh.begin, &sh.end);
  float *mine = shard_of(w, rows, cols, sp, sh.begin, sh.end);
  stab_spectral_params p = stab_spectral_default_params();
  p.tol = tol;
  p.threads = 1 + rank % 2; /* threads may differ between ranks */
  stab_sigma_result ref, exact, got, again, warm;
  CHECK(stab_sigma(w, rows, cols, 0, &p, NULL, &ref) == STAB_OK, "%s: single-process sigma", name);
  stab_spectral_params pe = p;
  pe.method = STAB_SPECTRAL_EXACT;
  CHECK(stab_sigma(w, rows, cols, 0, &pe, NULL, &exact) == STAB_OK, "%s: LAPACK sigma", name);
  stab_mpi_sharded *s = NULL, *s2 = NULL;
  stab_status st = stab_mpi_sharded_create(MPI_COMM_WORLD, &sh, &p, &s);
  CHECK(st == STAB_OK, "%s: create: %s", name, stab_last_error());
  if (st == STAB_OK) {
    const size_t ld = sp == STAB_MPI_SPLIT_ROWS ? cols : sh.end - sh.begin;
    st = stab_mpi_sharded_sigma(s, mine, ld, &got);
    CHECK(st == STAB_OK, "%s: sigma: %s", name, stab_last_error());
    CHECK(same_on_every_rank(got.sigma) && same_on_every_rank(got.rel_err) &&
          same_on_every_rank((double)got.passes), "%s: the ranks' results differ", name);
    CHECK(got.converged && !got.nonfinite, "%s: converged %d nonfinite %d", name, got.converged, got.nonfinite);
    if (tol < STAB_SPECTRAL_F32_TOL_MIN)
      CHECK(rel(got.sigma, ref.sigma) <= 1e-12, "%s: sharded %.17g, single-process %.17g (rel %.3g)", name,
            got.sigma, ref.sigma, rel(got.sigma, ref.sigma));
    else
      CHECK(rel(got.sigma, ref.sigma) <= got.rel_err + ref.rel_err, "%s: sharded %.17g +- %.3g, single %.17g +- %.3g",
            name, got.sigma, got.rel_err, ref.sigma, ref.rel_err);
    CHECK(rel(got.sigma, exact.sigma) <= fmax(got.rel_err, 1e-13), "%s: sharded %.17g +- %.3g, LAPACK %.17g", name,
          got.sigma, got.rel_err, exact.sigma);
    /* the same decisions as one process running the same algorithm: the sums differ from its
     * by rounding only */
    const int one = one_shard_passes(w, rows, cols, sp, &p);
    CHECK(abs(got.passes - one) <= 1, "%s: %d passes, one shard in one process %d", name, got.passes, one);
    /* warm from the first estimate's vector: the same matrix, the same value within its claim
     * (not fewer passes: an honest warm start waits for its random vectors, spectral.c "Warm
     * starts", and on a whole matrix of at most 32 rows runs to the end as a cold one) */
    CHECK(stab_mpi_sharded_sigma(s, mine, ld, &warm) == STAB_OK, "%s: warm sigma: %s", name, stab_last_error());
    CHECK(same_on_every_rank(warm.sigma), "%s: the ranks' warm results differ", name);
    CHECK(rel(warm.sigma, exact.sigma) <= fmax(warm.rel_err, 1e-13) && warm.rel_err <= p.tol,
          "%s: warm %.17g +- %.3g in %d passes (cold %d), LAPACK %.17g", name, warm.sigma, warm.rel_err,
          warm.passes, got.passes, exact.sigma);
    /* run to run: a fresh handle, the same bits */
    CHECK(stab_mpi_sharded_create(MPI_COMM_WORLD, &sh, &p, &s2) == STAB_OK, "%s: second create", name);
    if (s2) {
      CHECK(stab_mpi_sharded_sigma(s2, mine, ld, &again) == STAB_OK, "%s: second sigma", name);
      CHECK(bits(again.sigma) == bits(got.sigma) && again.passes == got.passes, "%s: run to run %.17g vs %.17g",
            name, again.sigma, got.sigma);
    }
  }
  stab_mpi_sharded_free(s2);
  stab_mpi_sharded_free(s);
  free(mine);
  free(w);
}

/* NaN in the last rank's shard: every rank reports it, nobody waits. */
static void nonfinite_case(stab_mpi_split sp) {
  const size_t rows = 64, cols = 48;
  float *w = seeded_matrix(rows, cols, 7);
  static const int even[3] = {1, 1, 1};
  stab_mpi_shard sh = {sp, rows, cols, 0, 0};
  split(sp == STAB_MPI_SPLIT_ROWS ? rows : cols, even, &sh.begin, &sh.end);
  float *mine = shard_of(w, rows, cols, sp, sh.begin, sh.end);
  if (rank == ranks - 1) mine[3] = NAN;
  stab_mpi_sharded *s = NULL;
  CHECK(stab_mpi_sharded_create(MPI_COMM_WORLD, &sh, NULL, &s) == STAB_OK, "nonfinite: create");
  stab_sigma_result got;
  const size_t ld = sp == STAB_MPI_SPLIT_ROWS ? cols : sh.end - sh.begin;
  CHECK(s && stab_mpi_sharded_sigma(s, mine, ld, &got) == STAB_OK, "nonfinite: sigma: %s", stab_last_error());
  CHECK(s && got.nonfinite == 1 && isnan(got.sigma), "nonfinite (split %d): nonfinite %d sigma %g", (int)sp,
        got.nonfinite, got.sigma);
  stab_mpi_sharded_free(s);
  free(mine);
  free(w);
}

/* A bad registration on one rank: every rank gets the same error, naming it. */
static void expect_create_fails(const char *name, const stab_mpi_shard *sh, stab_status want, const char *says) {
  stab_mpi_sharded *s = (stab_mpi_sharded *)&checks; /* must come back NULL */
  stab_status st = stab_mpi_sharded_create(MPI_COMM_WORLD, sh, NULL, &s);
  CHECK(st == want && s == NULL, "%s: status %d (want %d), handle %p", name, (int)st, (int)want, (void *)s);
  CHECK(strstr(stab_last_error(), says) != NULL, "%s: message '%s' lacks '%s'", name, stab_last_error(), says);
  if (st == STAB_OK) stab_mpi_sharded_free(s);
}

static void registration_cases(void) {
  static const int even[3] = {1, 1, 1};
  const size_t rows = 30, cols = 40;
  stab_mpi_shard good = {STAB_MPI_SPLIT_ROWS, rows, cols, 0, 0};
  split(rows, even, &good.begin, &good.end);
  char last[32];
  snprintf(last, sizeof last, "rank %d: ", ranks - 1);

  stab_mpi_shard sh = good;
  if (rank == ranks - 1) sh.end = rows + 1; /* past the end */
  expect_create_fails("past the end", &sh, STAB_ERANGE, last);

  sh = good;
  if (rank == ranks - 1) sh.begin = 0; /* overlaps rank 0's */
  expect_create_fails("overlap", &sh, STAB_ERANGE, "overlap");

  sh = good;
  if (rank == ranks - 1) sh.end = sh.end - 1; /* a gap at the end */
  expect_create_fails("gap", &sh, STAB_ERANGE, "cover");

  sh = good;
  if (rank == 1) sh.cols = cols + 1; /* another whole shape */
  expect_create_fails("shape", &sh, STAB_EINVAL, "rank 1 registers");

  sh = good;
  expect_create_fails("NULL shard", rank == ranks - 1 ? NULL : &sh, STAB_EINVAL, "shard is NULL");

  /* an estimate given a NULL shard on one rank: every rank fails, none waits */
  stab_mpi_sharded *s = NULL;
  CHECK(stab_mpi_sharded_create(MPI_COMM_WORLD, &good, NULL, &s) == STAB_OK, "create for the NULL w case");
  if (s) {
    float *w = seeded_matrix(rows, cols, 3);
    stab_sigma_result out;
    stab_status st = stab_mpi_sharded_sigma(s, rank == 0 ? NULL : w + good.begin * cols, cols, &out);
    CHECK(st == STAB_EINVAL && isnan(out.sigma), "NULL w on rank 0: status %d", (int)st);
    CHECK(strstr(stab_last_error(), "rank 0: ") && strstr(stab_last_error(), "w is NULL"), "NULL w: '%s'",
          stab_last_error());
    st = stab_mpi_sharded_sigma(s, w + good.begin * cols, rank == ranks - 1 ? cols - 1 : cols, &out);
    CHECK(st == STAB_EDIM, "short ld on the last rank: status %d", (int)st);
    free(w);
  }
  stab_mpi_sharded_free(s);
}

/* The ranks' failures summed, Check's summary line from rank 0, MPI finalised: main's exit. */
static int finish(void) {
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%d%%: Checks: %d, Failures: %d, Errors: 0 (%d ranks)\n",
           checks ? 100 * (checks - total) / checks : 0, checks, total, ranks);
  MPI_Finalize();
  return total ? 1 : 0;
}

int main(int argc, char **argv) {
  /* FUNNELED: stab_mpi_linear_measure_batch's workers never call MPI, the main thread does.
   * STAB_MPI_THREAD_SINGLE=1 (tests/programs/mpi.sh): SINGLE, where the batch runs its estimates in
   * turn in this thread, and only the batch's cases */
  const int single = getenv("STAB_MPI_THREAD_SINGLE") && !strcmp(getenv("STAB_MPI_THREAD_SINGLE"), "1");
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (ranks < 2 || ranks > 3) {
    if (rank == 0) fprintf(stderr, "mpi_sharded: run on 2 or 3 ranks\n");
    MPI_Finalize();
    return 2;
  }
  if (single) {
    batch_cases();
    return finish();
  }
  static const int even[3] = {1, 1, 1}, uneven[3] = {1, 3, 2}, one_row[3] = {0, 1, 1};
  const double f64 = 1e-9; /* below STAB_SPECTRAL_F32_TOL_MIN: all-f64 passes */
  sharded_case("rows, even", STAB_MPI_SPLIT_ROWS, 96, 80, even, f64, 1);
  sharded_case("columns, even", STAB_MPI_SPLIT_COLS, 80, 96, even, f64, 2);
  sharded_case("rows, uneven", STAB_MPI_SPLIT_ROWS, 101, 67, uneven, f64, 3);
  sharded_case("columns, uneven", STAB_MPI_SPLIT_COLS, 67, 101, uneven, f64, 4);
  sharded_case("a shard of one row", STAB_MPI_SPLIT_ROWS, 50, 70, one_row, f64, 5);
  sharded_case("a shard of one column", STAB_MPI_SPLIT_COLS, 70, 50, one_row, f64, 6);
  sharded_case("rows, 20 columns (the exact narrow path)", STAB_MPI_SPLIT_ROWS, 90, 20, uneven, f64, 7);
  sharded_case("rows, default tol", STAB_MPI_SPLIT_ROWS, 200, 150, uneven, 1e-3, 8);
  sharded_case("columns, default tol", STAB_MPI_SPLIT_COLS, 150, 200, uneven, 1e-3, 9);
  /* few rows: the cold estimate runs to the end of the Krylov space when the whole matrix has
   * at most 32 rows, and stops at tol otherwise, whatever one shard has */
  sharded_case("rows, 40 x 64 (stops at tol)", STAB_MPI_SPLIT_ROWS, 40, 64, even, 1e-3, 10);
  sharded_case("rows, 30 x 64 (to the end)", STAB_MPI_SPLIT_ROWS, 30, 64, even, 1e-3, 11);
  nonfinite_case(STAB_MPI_SPLIT_ROWS);
  nonfinite_case(STAB_MPI_SPLIT_COLS);
  registration_cases();
  replicated_cases();
  table_cases();
  vector_cases();
  linear_cases();
  sum_cases();
  batch_cases();
  return finish();
}
