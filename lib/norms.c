/* norms.c — RMS norms and maxima of f32 data, accumulated in f64, with NaN propagating to
 * every result it touches (a max never hides a NaN). */
#include "internal.h"

#include <string.h>

static inline double elem(const float *a, const float *b, size_t k) {
  return b ? (double)a[k] - (double)b[k] : (double)a[k];
}

double stab_rms(const float *x, size_t n, size_t stride) {
  if (!x || n == 0 || stride == 0) return NAN;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    double v = x[i * stride];
    s += v * v;
  }
  return sqrt(s / (double)n);
}

double stab_rms_diff(const float *a, const float *b, size_t n) {
  if (!a || n == 0) return NAN;
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    double v = elem(a, b, i);
    s += v * v;
  }
  return sqrt(s / (double)n);
}

double stab_max_abs_diff(const float *x, const float *y, size_t n) {
  if (!x || n == 0) return NAN;
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = stabi_nanmax(m, fabs(elem(x, y, i)));
  return m;
}

/* Read once per measured step for every linear layer (rel_update), so vectorised: the simd
 * pragma fixes one summation order per build, keeping results reproducible. */
double stabi_sumsq(const float *a, const float *b, size_t rows, size_t cols, size_t ld) {
  double s = 0.0;
  for (size_t i = 0; i < rows; i++) {
    const float *ai = a + i * ld;
    if (b) {
      const float *bi = b + i * ld;
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


double stabi_set_max_rms(const stabi_set *s, double *work) {
  double m = 0.0;
  if (s->items_are_rows) {
    for (size_t i = 0; i < s->items; i++) {
      double q = 0.0;
      for (size_t t = 0; t < s->coords; t++) {
        double v = elem(s->a, s->b, i * s->ld + t);
        q += v * v;
      }
      m = stabi_nanmax(m, q);
    }
  } else {
    /* Items are columns: sweep the rows in memory order, one sum of squares per column. */
    memset(work, 0, s->items * sizeof *work);
    for (size_t t = 0; t < s->coords; t++)
      for (size_t i = 0; i < s->items; i++) {
        double v = elem(s->a, s->b, t * s->ld + i);
        work[i] += v * v;
      }
    for (size_t i = 0; i < s->items; i++) m = stabi_nanmax(m, work[i]);
  }
  return sqrt(m / (double)s->coords);
}
