/* mpi_sums.c — mpi_collective.c's sums and maxima over ranks against references every rank
 * computes itself: each rank generates every rank's values from one seed, so it knows the
 * exact answer (the sum in long double, whose 64-bit significand holds the P terms' sum far
 * below the fixed-point grid's step), and checks its result is within the grid's rounding of
 * it and has the same bits as every other rank's. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/mpi_internal.h"
#include "mpi_check.h"

/* the same sequence on every rank: a 64-bit LCG, top bits as a double in [-1, 1) */
static double draw(uint64_t *s) {
  *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(int64_t)(*s & ~(uint64_t)0x3ff) / 9223372036854775808.0;
}

/* 1 when every rank's n values have the same bits */
static int same_everywhere(const double *x, size_t n) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a of the bytes */
  const unsigned char *p = (const unsigned char *)x;
  for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ p[i]) * 1099511628211ULL;
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

/* the grid's step for a group whose largest magnitude is m, as documented: 2^(e - bits) with
 * m < 2^e and bits = 62 - ceil(log2 P) (not read from the implementation, which could coarsen it) */
static double step_of(double m) {
  int e = 0, log2p = 0;
  (void)frexp(m, &e);
  while ((1 << log2p) < ranks) log2p++;
  return ldexp(1.0, e - (62 - log2p));
}

/* a vector of n entries on one grid, magnitudes 10^-mag .. 1 spread over the entries */
static void vector_case(const char *name, size_t n, double mag, uint64_t seed) {
  stabi_mpi_sum s;
  CHECK(stabi_mpi_sum_init(&s, MPI_COMM_WORLD, n) == STAB_OK, "%s: init: %s", name, stab_last_error());
  double *all = malloc((size_t)ranks * (n + 1) * sizeof *all), *y = malloc(n * sizeof *y);
  uint64_t st = seed;
  for (size_t k = 0; k < (size_t)ranks * (n + 1); k++) {
    const double u = draw(&st), w = draw(&st);
    all[k] = u * pow(10.0, -mag * fabs(w));
  }
  memcpy(y, all + (size_t)rank * (n + 1), n * sizeof *y);
  double quad = all[(size_t)rank * (n + 1) + n] * 1e-7; /* another scale: its own grid */
  CHECK(stabi_mpi_sum_reduce(&s, y, n, &quad) == STAB_OK, "%s: reduce: %s", name, stab_last_error());
  double m = 0.0, mq = 0.0;
  for (int r = 0; r < ranks; r++) {
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(all[(size_t)r * (n + 1) + i]));
    mq = fmax(mq, fabs(all[(size_t)r * (n + 1) + n] * 1e-7));
  }
  const double step = step_of(m), stepq = step_of(mq);
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    long double ref = 0.0L;
    for (int r = 0; r < ranks; r++) ref += all[(size_t)r * (n + 1) + i];
    /* each term rounded to the grid (half a step), then the sum to double (half an ulp) */
    const double err = fabs((double)((long double)y[i] - ref));
    const double allowed = 0.5 * ranks * step + 0.5 * fabs((double)ref) * DBL_EPSILON;
    if (err / allowed > worst) worst = err / allowed;
  }
  CHECK(worst <= 1.0, "%s: an entry %.3g times its allowed error (grid step %.3g)", name, worst, step);
  long double refq = 0.0L;
  for (int r = 0; r < ranks; r++) refq += all[(size_t)r * (n + 1) + n] * 1e-7;
  CHECK(fabs((double)((long double)quad - refq)) <= 0.5 * ranks * stepq + 0.5 * fabs((double)refq) * DBL_EPSILON,
        "%s: quadratic form %.17g, reference %.17Lg", name, quad, refq);
  CHECK(same_everywhere(y, n) && same_everywhere(&quad, 1), "%s: ranks differ", name);
  free(all);
  free(y);
  stabi_mpi_sum_free(&s);
}

/* scalars of unrelated sizes, each on its own grid; then values that are not finite */
static void scalar_cases(void) {
  stabi_mpi_sum s;
  enum { N = 9 };
  CHECK(stabi_mpi_sum_init(&s, MPI_COMM_WORLD, N) == STAB_OK, "scalars: init: %s", stab_last_error());
  /* rank r's value of scalar k: base[k] times (r + 1), negated on odd ranks for some */
  static const double base[N] = {1e-300, 3e300 / 4, 0.0, -2.5, 4.9e-324, 1.0, 7e-20, -1e150, 1e-5};
  double x[N];
  for (int k = 0; k < N; k++) x[k] = base[k] * (rank + 1) * (k % 3 == 1 && rank % 2 ? -1.0 : 1.0);
  CHECK(stabi_mpi_sum_each(&s, x, N) == STAB_OK, "scalars: %s", stab_last_error());
  for (int k = 0; k < N; k++) {
    long double ref = 0.0L;
    double m = 0.0;
    for (int r = 0; r < ranks; r++) {
      const double v = base[k] * (r + 1) * (k % 3 == 1 && r % 2 ? -1.0 : 1.0);
      ref += v;
      m = fmax(m, fabs(v));
    }
    const double allowed = 0.5 * ranks * step_of(m) + 0.5 * fabs((double)ref) * DBL_EPSILON;
    CHECK(fabs((double)((long double)x[k] - ref)) <= allowed, "scalar %d: %.17g, reference %.17Lg", k, x[k], ref);
  }
  CHECK(same_everywhere(x, N), "scalars: ranks differ");

  /* NaN on the last rank at 0; +inf on rank 0 and -inf on the last at 1 (NaN); +inf on rank 0
   * alone at 2; -inf on every rank at 3; the rest finite and still summed */
  const int last = ranks - 1;
  for (int k = 0; k < N; k++) x[k] = k + 0.5;
  if (rank == last) x[0] = NAN;
  if (rank == 0) x[1] = INFINITY;
  if (rank == last) x[1] = -INFINITY;
  if (rank == 0) x[2] = INFINITY;
  x[3] = -INFINITY;
  CHECK(stabi_mpi_sum_each(&s, x, N) == STAB_OK, "not finite: %s", stab_last_error());
  CHECK(isnan(x[0]) && isnan(x[1]), "NaN and opposite infinities: %g %g", x[0], x[1]);
  CHECK(x[2] == INFINITY && x[3] == -INFINITY, "infinities: %g %g", x[2], x[3]);
  for (int k = 4; k < N; k++) CHECK(x[k] == ranks * (k + 0.5), "finite beside: %d: %.17g", k, x[k]);

  /* maxima: negatives, zeros of both signs, an infinity, a NaN on one rank */
  double y[N];
  for (int k = 0; k < N; k++) y[k] = -(double)(rank + 1) * (k + 1);
  y[1] = rank == last ? 0.0 : -0.0;
  y[2] = rank == 0 ? INFINITY : 1.0;
  y[3] = rank == last ? NAN : 2.0;
  y[4] = rank == 0 ? -INFINITY : -3.0;
  y[5] = rank == 0 ? DBL_MAX : -DBL_MAX;
  CHECK(stabi_mpi_max(&s, y, N) == STAB_OK, "max: %s", stab_last_error());
  CHECK(y[0] == -1.0 && y[1] == 0.0 && y[2] == INFINITY && isnan(y[3]), "max: %g %g %g %g", y[0], y[1], y[2], y[3]);
  CHECK(y[4] == (ranks > 1 ? -3.0 : -INFINITY) && y[5] == DBL_MAX, "max: %g %g", y[4], y[5]);
  for (int k = 6; k < N; k++) CHECK(y[k] == -(double)(k + 1), "max %d: %g", k, y[k]);
  CHECK(same_everywhere(y, N), "max: ranks differ");

  /* too many values for the buffers: a failure on every rank, before any collective */
  double big[N + 2] = {0};
  CHECK(stabi_mpi_sum_each(&s, big, N + 2) == STAB_EDIM, "too many values: not refused");
  stabi_mpi_sum_free(&s);
}

void sum_cases(void) {
  vector_case("sum: 1000 entries of one size", 1000, 0.0, 11);
  vector_case("sum: 4000 entries over 12 decades", 4000, 12.0, 12);
  vector_case("sum: one entry", 1, 3.0, 13);
  scalar_cases();
}
