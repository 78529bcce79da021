/* mpi_collective.c — the MPI layer's collectives: every rank agreeing on one status (so a
 * failure on one rank never leaves the others waiting in a later collective), and sums and
 * maxima over ranks that give every rank the same bits, on every run.
 *
 * Why not MPI_Allreduce on doubles: MPI does not promise that every rank gets the same bits,
 * nor the same bits from run to run (the reduction tree may depend on the message size, the
 * topology and the algorithm the library picks), because floating-point addition is not
 * associative. Lanczos takes decisions from these sums (stop, restart); ranks that part ways
 * by one rounding would call different collectives and hang.
 *
 * So the sums are made in integers, where addition is associative: every rank rounds its
 * values to one grid of fixed-point numbers (int64, a power-of-two step agreed on first by an
 * MPI_MAX of the magnitudes, which is exact), and MPI_Allreduce adds the integers exactly, in
 * whatever order and tree it likes. The only roundings are each term's, to the grid, and the
 * sum's conversion back to double: both the same on every rank and in every run, and neither
 * depends on P beyond the grid's step. The grid keeps 62 - ceil(log2 P) bits below the
 * largest magnitude, so that P terms cannot overflow: a term's rounding is at most 2^-(62 -
 * ceil(log2 P)) of the largest value (2^-61 at P = 2, 2^-52 at P = 1024), finer than f64's
 * own rounding of a sum in rank order. Cost per sum: one MPI_Allreduce (MAX) of a few doubles
 * for the scales, one (SUM) of n int64 - as much as an all-reduce of the doubles would move,
 * with MPI's own bandwidth-optimal algorithms at any P. A value that is not finite on any rank
 * takes a third, rare exchange: which elements saw NaN or which infinities (MPI_BOR), so that
 * the result is what IEEE addition would give (NaN, or the infinity). Maxima: each double
 * mapped to an int64 of the same order (NaN above everything), one MPI_MAX: exact.
 * docs/manual/mpi.md weighs the cost. */
#include "mpi/mpi_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One all-reduce of two ints when every rank succeeded: MINLOC over (failed ? 0 : 1, rank)
 * finds the lowest failing rank, which then broadcasts its status and message. Nothing is
 * allocated, so that a rank out of memory still takes part. */
stab_status stabi_mpi_agree(MPI_Comm comm, stab_status mine, const char *who) {
  int rank = 0;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_rank failed", who);
  struct { int ok, rank; } me = {mine == STAB_OK, rank}, first;
  if (MPI_Allreduce(&me, &first, 1, MPI_2INT, MPI_MINLOC, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' status failed", who);
  if (first.ok) return STAB_OK;
  struct { int status; char message[244]; } why;
  memset(&why, 0, sizeof why);
  if (rank == first.rank) {
    why.status = (int)mine;
    strncpy(why.message, stab_last_error(), sizeof why.message - 1);
  }
  if (MPI_Bcast(&why, (int)sizeof why, MPI_BYTE, first.rank, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: rank %d failed, and MPI_Bcast of its message failed", who, first.rank);
  return stabi_fail((stab_status)why.status, "rank %d: %s", first.rank, why.message);
}

stab_status stabi_mpi_sum_init(stabi_mpi_sum *s, MPI_Comm comm, size_t max_n) {
  memset(s, 0, sizeof *s);
  s->comm = comm;
  if (MPI_Comm_size(comm, &s->ranks) != MPI_SUCCESS || s->ranks < 1)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Comm_size failed");
  s->max_n = max_n;
  const size_t per = max_n + 2; /* a pass's vectors, its quadratic form, and a flag */
  if (per > (size_t)INT32_MAX)
    return stabi_fail(STAB_EDIM, "stab_mpi: %zu values per rank is too many for one MPI call", per);
  s->fixed = malloc(per * sizeof *s->fixed);
  s->scale = malloc(per * sizeof *s->scale);
  s->kinds = malloc(per * sizeof *s->kinds);
  if (!s->fixed || !s->scale || !s->kinds) {
    stabi_mpi_sum_free(s);
    return stabi_fail(STAB_ENOMEM, "stab_mpi: cannot allocate %zu values for the sums over ranks", per);
  }
  /* P terms of magnitude up to 2^bits sum to at most 2^62: no int64 overflow */
  int log2p = 0;
  while (log2p < 62 && ((int64_t)1 << log2p) < s->ranks) log2p++;
  s->bits = 62 - log2p;
  return STAB_OK;
}

void stabi_mpi_sum_free(stabi_mpi_sum *s) {
  free(s->fixed);
  free(s->scale);
  free(s->kinds);
  s->fixed = NULL;
  s->scale = NULL;
  s->kinds = NULL;
}

/* What a value that is not finite brings to a sum, as bits to OR over ranks. */
enum { SAW_POS_INF = 1, SAW_NEG_INF = 2, SAW_NAN = 4 };

static int kind_of(double x) { return isnan(x) ? SAW_NAN : isinf(x) ? (x > 0 ? SAW_POS_INF : SAW_NEG_INF) : 0; }

/* The exponent e with every finite |value| of a group below 2^e (frexp's), from its maximum. */
static int group_exponent(double max_abs) {
  int e = 0;
  (void)frexp(max_abs, &e);
  return e;
}

/* Each segment's x[0..nx) share one grid (the entries of a vector), each of its c[0..nc) has
 * its own (scalars of unrelated size); all are replaced by their sums over the ranks. The
 * segments travel together: one MAX of every grid's scale, one SUM of every value, so that a
 * segment gets the same bits as when it is summed alone. flag: NULL, or a value maxed over
 * the ranks with the scales (a caller's status, for free). */
static stab_status segmented_sum(stabi_mpi_sum *s, const stabi_mpi_segment *seg, size_t nseg, double *flag) {
  size_t n = 0, ns = 0;
  for (size_t g = 0; g < nseg; g++) {
    n += seg[g].nx + seg[g].nc;
    ns += 1 + seg[g].nc;
  }
  if (n > s->max_n + 1)
    return stabi_fail(STAB_EDIM, "stab_mpi: a sum of %zu values exceeds the %zu reserved", n, s->max_n + 1);
  if (ns + 1 + (flag != NULL) > s->max_n + 2)
    return stabi_fail(STAB_EDIM, "stab_mpi: a sum of %zu scales exceeds the %zu reserved", ns, s->max_n);
  /* the scales' exchange: each vector's max |x|, each scalar's |c|, and whether anything is not finite */
  double *m = s->scale;
  int odd = 0;
  for (size_t g = 0, at = 0; g < nseg; g++) {
    double mx = 0.0;
    for (size_t i = 0; i < seg[g].nx; i++) {
      const double x = seg[g].x[i];
      if (!isfinite(x)) odd = 1;
      else if (fabs(x) > mx) mx = fabs(x);
    }
    m[at++] = mx;
    for (size_t k = 0; k < seg[g].nc; k++) {
      const double c = seg[g].c[k];
      if (!isfinite(c)) odd = 1;
      m[at++] = isfinite(c) ? fabs(c) : 0.0;
    }
  }
  m[ns] = odd;
  if (flag) m[ns + 1] = *flag;
  const size_t nm = ns + 1 + (flag != NULL);
  if (MPI_Allreduce(MPI_IN_PLACE, m, (int)nm, MPI_DOUBLE, MPI_MAX, s->comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Allreduce of a sum's %zu scales failed", nm);
  if (flag) *flag = m[ns + 1];
  for (size_t g = 0, at = 0, v = 0; g < nseg; g++) {
    const int ex = group_exponent(m[at++]);
    for (size_t i = 0; i < seg[g].nx; i++) {
      const double x = seg[g].x[i];
      s->fixed[v++] = isfinite(x) ? llrint(ldexp(x, s->bits - ex)) : 0;
    }
    for (size_t k = 0; k < seg[g].nc; k++, at++) {
      const double c = seg[g].c[k];
      s->fixed[v++] = isfinite(c) ? llrint(ldexp(c, s->bits - group_exponent(m[at]))) : 0;
    }
  }
  if (MPI_Allreduce(MPI_IN_PLACE, s->fixed, (int)n, MPI_INT64_T, MPI_SUM, s->comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Allreduce of a sum's %zu values failed", n);
  /* odd is the same on every rank (a max), so every rank takes this exchange or none does; a
   * segment with nothing odd anywhere has no flag set, and keeps its sums */
  const int any_odd = m[ns] != 0.0;
  if (any_odd) {
    for (size_t g = 0, v = 0; g < nseg; g++) {
      for (size_t i = 0; i < seg[g].nx; i++) s->kinds[v++] = kind_of(seg[g].x[i]);
      for (size_t k = 0; k < seg[g].nc; k++) s->kinds[v++] = kind_of(seg[g].c[k]);
    }
    if (MPI_Allreduce(MPI_IN_PLACE, s->kinds, (int)n, MPI_INT, MPI_BOR, s->comm) != MPI_SUCCESS)
      return stabi_fail(STAB_EIO, "stab_mpi: MPI_Allreduce of a sum's %zu NaN and infinity flags failed", n);
  }
  for (size_t g = 0, at = 0, v = 0; g < nseg; g++) {
    const size_t nx = seg[g].nx, nc = seg[g].nc;
    const int ex = group_exponent(m[at]);
    for (size_t i = 0; i < nx + nc; i++, v++) {
      const int e = i < nx ? ex : group_exponent(m[at + 1 + (i - nx)]);
      double r = ldexp((double)s->fixed[v], e - s->bits);
      if (any_odd && s->kinds[v]) {
        const int k = s->kinds[v];
        r = (k & SAW_NAN) || (k & SAW_POS_INF && k & SAW_NEG_INF) ? NAN : k & SAW_POS_INF ? INFINITY : -INFINITY;
      }
      if (i < nx) seg[g].x[i] = r;
      else seg[g].c[i - nx] = r;
    }
    at += 1 + nc;
  }
  return STAB_OK;
}

static stab_status fixed_sum(stabi_mpi_sum *s, double *x, size_t nx, double *c, size_t nc) {
  const stabi_mpi_segment one = {x, nx, c, nc};
  return segmented_sum(s, &one, 1, NULL);
}

stab_status stabi_mpi_sum_segments(stabi_mpi_sum *s, const stabi_mpi_segment *seg, size_t nseg, double *flag) {
  return segmented_sum(s, seg, nseg, flag);
}

stab_status stabi_mpi_sum_reduce(void *ctx, double *y, size_t n, double *quad) {
  stabi_mpi_sum *s = ctx;
  if (n > s->max_n)
    return stabi_fail(STAB_EDIM, "stab_mpi: a pass of %zu doubles exceeds the %zu reserved", n, s->max_n);
  return fixed_sum(s, y, n, quad, 1);
}

stab_status stabi_mpi_sum_each(stabi_mpi_sum *s, double *x, size_t n) { return fixed_sum(s, NULL, 0, x, n); }

/* A double's bits as an int64 that orders as the double does (-0 as +0), NaN above all. */
static int64_t ordered(double x) {
  if (isnan(x)) return INT64_MAX;
  int64_t b;
  memcpy(&b, &x, sizeof b);
  return b >= 0 ? b : INT64_MIN - b;
}

static double unordered(int64_t k) {
  if (k == INT64_MAX) return NAN;
  const int64_t b = k >= 0 ? k : INT64_MIN - k;
  double x;
  memcpy(&x, &b, sizeof x);
  return x;
}

stab_status stabi_mpi_max(stabi_mpi_sum *s, double *x, size_t n) {
  if (n > s->max_n + 1)
    return stabi_fail(STAB_EDIM, "stab_mpi: a maximum of %zu values exceeds the %zu reserved", n, s->max_n + 1);
  for (size_t i = 0; i < n; i++) s->fixed[i] = ordered(x[i]);
  if (MPI_Allreduce(MPI_IN_PLACE, s->fixed, (int)n, MPI_INT64_T, MPI_MAX, s->comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "stab_mpi: MPI_Allreduce of %zu maxima failed", n);
  for (size_t i = 0; i < n; i++) x[i] = unordered(s->fixed[i]);
  return STAB_OK;
}
