/* norms.c — RMS norms and maxima of stored data (f32; 16-bit rows converted first), accumulated in f64, with NaN propagating to
 * every result it touches (a max never hides a NaN). */
#include "engine/engine.h"

#include <string.h>

static inline double elem(const float *a, const float *b, size_t k) {
  return b ? (double)a[k] - (double)b[k] : (double)a[k];
}

/* The arguments of the helpers below: NaN for invalid ones, with the reason in
 * stab_last_error() (they return a value, not a status). A vector of n elements with a stride
 * is a matrix of n rows of one element, so the one matrix check applies. */
static int valid_vector(const char *who, const char *what, const float *x, size_t n, size_t stride) {
  if (stride == 0) {
    stabi_fail(STAB_EDIM, "%s: stride is 0", who);
    return 0;
  }
  return stabi_check_matrix(who, what, x, n, 1, &stride) == STAB_OK;
}

double stab_rms(const float *x, size_t n, size_t stride) {
  if (!valid_vector("stab_rms", "x", x, n, stride)) return NAN;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    double v = x[i * stride];
    s += v * v;
  }
  return sqrt(s / (double)n);
}

double stab_rms_diff(const float *a, const float *b, size_t n) {
  if (!valid_vector("stab_rms_diff", "a", a, n, 1)) return NAN;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    double v = elem(a, b, i);
    s += v * v;
  }
  return sqrt(s / (double)n);
}

double stab_max_abs_diff(const float *x, const float *y, size_t n) {
  if (!valid_vector("stab_max_abs_diff", "x", x, n, 1)) return NAN;
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = stabi_nanmax(m, fabs(elem(x, y, i)));
  return m;
}

/* Read once per measured step for every linear layer (rel_update), so vectorised: the simd
 * pragma fixes one summation order per build, keeping results reproducible. */
double stabi_sumsq(const stabi_src *m, size_t rows, size_t cols, float *ra, float *rb) {
  double s = 0.0;
  for (size_t i = 0; i < rows; i++) {
    const float *ai = stabi_row_f32(m->a, m->at, m->ld, i, cols, ra);
    if (m->b) {
      const float *bi = stabi_row_f32(m->b, m->bt, m->ld, i, cols, rb);
#pragma omp simd reduction(+ : s)
      for (size_t t = 0; t < cols; t++) {
        double v = (double)ai[t] - (double)bi[t];
        s += v * v;
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (size_t t = 0; t < cols; t++) s += (double)ai[t] * (double)ai[t];
    }
  }
  return s;
}


/* Lanes of the running sums: r_t goes to lane t % 8; lanes are added pairwise at the end. */
#define LANES 8

static double lanes_total(const double *l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

void stabi_set_row(const stabi_set *s, size_t t, const float **a, const float **b) {
  const size_t len = s->items_are_rows ? s->coords : s->items;
  *a = stabi_row_f32(s->a, s->at, s->ld, t, len, s->ra);
  *b = s->b ? stabi_row_f32(s->b, s->bt, s->ld, t, len, s->rb) : NULL;
}

double stabi_item_sumsq(const float *a, const float *b, const double *c, size_t n,
                        double *centred) {
  double z[LANES] = {0.0}, q[LANES] = {0.0};
  size_t t = 0;
  /* Four variants so that neither b nor c is tested per element. */
  if (!b && !c) {
    for (; t + LANES <= n; t += LANES)
#pragma GCC unroll 8
      for (int k = 0; k < LANES; k++) {
        double v = a[t + (size_t)k];
        z[k] += v * v;
      }
  } else if (!c) {
    for (; t + LANES <= n; t += LANES)
#pragma GCC unroll 8
      for (int k = 0; k < LANES; k++) {
        double v = (double)a[t + (size_t)k] - (double)b[t + (size_t)k];
        z[k] += v * v;
      }
  } else if (!b) {
    for (; t + LANES <= n; t += LANES)
#pragma GCC unroll 8
      for (int k = 0; k < LANES; k++) {
        double v = a[t + (size_t)k], w = v - c[t + (size_t)k];
        z[k] += v * v;
        q[k] += w * w;
      }
  } else {
    for (; t + LANES <= n; t += LANES)
#pragma GCC unroll 8
      for (int k = 0; k < LANES; k++) {
        double v = (double)a[t + (size_t)k] - (double)b[t + (size_t)k], w = v - c[t + (size_t)k];
        z[k] += v * v;
        q[k] += w * w;
      }
  }
  double zs = lanes_total(z), qs = lanes_total(q);
  for (; t < n; t++) {
    double v = elem(a, b, t), w = c ? v - c[t] : v;
    zs += v * v;
    qs += w * w;
  }
  if (centred) *centred = c ? qs : zs;
  return zs;
}

double stabi_set_max_rms(const stabi_set *s, double *work) {
  double m = 0.0;
  const float *a, *b;
  if (s->items_are_rows) {
    for (size_t i = 0; i < s->items; i++) {
      stabi_set_row(s, i, &a, &b);
      m = stabi_nanmax(m, stabi_item_sumsq(a, b, NULL, s->coords, NULL));
    }
  } else {
    /* Items are columns: sweep the rows in memory order, one sum of squares per column. */
    memset(work, 0, s->items * sizeof *work);
    for (size_t t = 0; t < s->coords; t++) {
      stabi_set_row(s, t, &a, &b);
      for (size_t i = 0; i < s->items; i++) {
        double v = elem(a, b, i);
        work[i] += v * v;
      }
    }
    for (size_t i = 0; i < s->items; i++) m = stabi_nanmax(m, work[i]);
  }
  if (s->shards) stabi_items_complete(s->shards, 1, &m, 1);
  return sqrt(m / (double)s->coords);
}
