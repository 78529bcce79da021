/* diameter.c — the diameter max_{i,j} ||r_i - r_j||_RMS of a set of vectors (the class
 * vectors of an LM head, the rows of an embedding table): a cheap O(n d) upper bound through
 * the mean, and the exact value over all pairs by blocked dgemm in f64, O(n^2 d). */
#include "engine/engine.h"

#include <cblas.h>
#include <float.h>
#include <string.h>

/* Element k of a stored row as f32 (b NULL: of a alone). */
static inline double elem(const float *a, const float *b, size_t k) {
  return b ? (double)a[k] - (double)b[k] : (double)a[k];
}

double stabi_set_diameter_centred(const stabi_set *s, double *work, double *max_sumsq) {
  double *mean = work, *dist = work + s->coords;
  const size_t n = s->items, d = s->coords;
  const float *a, *b;
  memset(mean, 0, d * sizeof *mean);
  if (s->items_are_rows) {
    /* row by row in memory order, without elem()'s tests in the loop, so that it vectorises */
    for (size_t i = 0; i < n; i++) {
      const float *ai, *bi;
      stabi_set_row(s, i, &ai, &bi);
      if (bi)
        for (size_t t = 0; t < d; t++) mean[t] += (double)ai[t] - (double)bi[t];
      else
        for (size_t t = 0; t < d; t++) mean[t] += (double)ai[t];
    }
  } else {
    for (size_t t = 0; t < d; t++) {
      stabi_set_row(s, t, &a, &b);
      for (size_t i = 0; i < n; i++) mean[t] += elem(a, b, i);
    }
  }
  /* a shard of a larger set: the whole set's mean */
  if (s->shards) stabi_items_complete(s->shards, 0, mean, d);
  const double n_all = s->shards ? (double)s->shards->whole_items : (double)n;
  for (size_t t = 0; t < d; t++) mean[t] /= n_all;
  double far = 0.0, norm = 0.0; /* max ||r_i - c||^2 and max ||r_i||^2 */
  if (s->items_are_rows) {
    for (size_t i = 0; i < n; i++) {
      double q;
      stabi_set_row(s, i, &a, &b);
      double z = stabi_item_sumsq(a, b, mean, d, &q);
      far = stabi_nanmax(far, q);
      norm = stabi_nanmax(norm, z);
    }
  } else {
    memset(dist, 0, n * sizeof *dist);
    for (size_t t = 0; t < d; t++) {
      stabi_set_row(s, t, &a, &b);
      for (size_t i = 0; i < n; i++) {
        double v = elem(a, b, i) - mean[t];
        dist[i] += v * v;
      }
    }
    for (size_t i = 0; i < n; i++) far = stabi_nanmax(far, dist[i]);
    memset(dist, 0, n * sizeof *dist);
    for (size_t t = 0; t < d; t++) {
      stabi_set_row(s, t, &a, &b);
      for (size_t i = 0; i < n; i++) {
        double v = elem(a, b, i);
        dist[i] += v * v;
      }
    }
    for (size_t i = 0; i < n; i++) norm = stabi_nanmax(norm, dist[i]);
  }
  if (s->shards) {
    double fn[2] = {far, norm};
    stabi_items_complete(s->shards, 1, fn, 2);
    far = fn[0];
    norm = fn[1];
  }
  if (max_sumsq) *max_sumsq = norm;
  /* Rounding margin: each squared distance carries a relative error below (d+2) eps. */
  double margin = 1.0 + (double)(d + 4) * DBL_EPSILON;
  return 2.0 * sqrt(fmin(far, norm) * margin / (double)d);
}

/* Items [i0, i0+nb) as an nb x d row-major f64 block, with their squared norms. */
static void gather(const stabi_set *s, size_t i0, size_t nb, double *blk, double *sq) {
  const size_t d = s->coords;
  const float *a, *b;
  if (s->items_are_rows) {
    for (size_t i = 0; i < nb; i++) {
      stabi_set_row(s, i0 + i, &a, &b);
      for (size_t t = 0; t < d; t++) blk[i * d + t] = elem(a, b, t);
    }
  } else {
    /* only the block's items of each stored row: the whole row would be converted n / nb
     * times over for the pairs of blocks */
    for (size_t t = 0; t < d; t++) {
      a = stabi_row_f32(stabi_elem_ptr(s->a, s->at, i0), s->at, s->ld, t, nb, s->ra);
      b = s->b ? stabi_row_f32(stabi_elem_ptr(s->b, s->bt, i0), s->bt, s->ld, t, nb, s->rb) : NULL;
      for (size_t i = 0; i < nb; i++) blk[i * d + t] = elem(a, b, i);
    }
  }
  for (size_t i = 0; i < nb; i++) {
    double q = 0.0;
    for (size_t t = 0; t < d; t++) q += blk[i * d + t] * blk[i * d + t];
    sq[i] = q;
  }
}

#define BLOCK 256

size_t stabi_set_work(size_t items, size_t coords, int exact) {
  /* saturates at SIZE_MAX, which no allocation satisfies (stabi_mul's 0 would under-allocate) */
  if (items > (size_t)-1 - coords) return (size_t)-1;
  size_t w = items + coords;
  if (exact) {
    size_t nb = items < BLOCK ? items : BLOCK;
    if (!stabi_mul_fits(nb, coords) || nb * coords > ((size_t)-1 - nb * nb - 2 * nb) / 2)
      return (size_t)-1;
    size_t e = 2 * nb * coords + nb * nb + 2 * nb;
    if (e > w) w = e;
  }
  return w;
}

double stabi_set_diameter_exact(const stabi_set *s, double *work) {
  const size_t n = s->items, d = s->coords;
  const size_t nb_max = n < BLOCK ? n : BLOCK;
  double *bi = work, *bj = bi + nb_max * d, *g = bj + nb_max * d;
  double *si = g + nb_max * nb_max, *sj = si + nb_max;
  double best = 0.0, maxsq = 0.0;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t ni = n - i0 < BLOCK ? n - i0 : BLOCK;
    gather(s, i0, ni, bi, si);
    for (size_t i = 0; i < ni; i++) maxsq = stabi_nanmax(maxsq, si[i]);
    for (size_t j0 = i0; j0 < n; j0 += BLOCK) {
      size_t nj = n - j0 < BLOCK ? n - j0 : BLOCK;
      gather(s, j0, nj, bj, sj);
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)d, 1.0, bi,
                  (int)d, bj, (int)d, 0.0, g, (int)nj);
      for (size_t i = 0; i < ni; i++)
        for (size_t j = 0; j < nj; j++)
          best = stabi_nanmax(best, si[i] + sj[j] - 2.0 * g[i * nj + j]);
    }
  }
  /* Each ||r_i||^2 + ||r_j||^2 - 2<r_i, r_j> is off by at most ~ (d+4) eps (|r_i|^2 + |r_j|^2):
   * adding that keeps the result an upper bound even when the diameter is tiny. */
  best += 2.0 * (double)(d + 4) * DBL_EPSILON * 2.0 * maxsq;
  return sqrt(best / (double)d);
}
