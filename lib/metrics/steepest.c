/* steepest.c — the pieces of the articles' steepest descent that a trainer needs per layer
 * kind: the initial std, msign by Newton–Schulz (Muon), row normalisation and sign. */
#include "metrics/metrics.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <string.h>

double stab_init_std(stab_kind kind, size_t d_in, size_t d_out) {
  if (d_in == 0 || d_out == 0) return NAN;
  double i = (double)d_in, o = (double)d_out;
  switch (kind) {
  case STAB_KIND_LINEAR: return sqrt(o / i) / (sqrt(i) + sqrt(o));
  case STAB_KIND_EMBEDDING: return 1.0;
  case STAB_KIND_LM_HEAD: return 1.0 / i;
  case STAB_KIND_GAIN: return 1.0;
  case STAB_KIND_BIAS: return 0.0;
  default: return NAN;
  }
}

size_t stab_msign_work_size(size_t rows, size_t cols) {
  size_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
  size_t mn = stabi_mul(m, n), mm = stabi_mul(m, m);
  if ((m && n && (!mn || !mm)) || mn > ((size_t)-1) / 4 / sizeof(float)) return 0;
  return 2 * mn + 2 * mm;
}

stab_status stab_msign(const float *g, size_t rows, size_t cols, stab_msign_method method,
                       int steps, float *out, float *work) {
  static const char who[] = "stab_msign";
  size_t ld = 0;
  stab_status st = stabi_check_matrix(who, "g", g, rows, cols, &ld);
  if (st != STAB_OK) return st;
  if (!out || !work || steps < 1)
    return stabi_fail(STAB_EINVAL, "%s: %s", who, steps < 1 ? "steps < 1" : !out ? "out is NULL" : "work is NULL");
  if (method != STAB_MSIGN_QUINTIC && method != STAB_MSIGN_CUBIC)
    return stabi_fail(STAB_EINVAL, "%s: unknown method %d", who, (int)method);
  /* cblas_sgemm takes int sizes: a longer side would be cut short, not refused */
  if (rows > INT_MAX || cols > INT_MAX || !stab_msign_work_size(rows, cols))
    return stabi_fail(STAB_EDIM, "%s: g is %zu x %zu: a side above %d, or work that overflows", who, rows, cols,
                      INT_MAX);
  /* Iterate on the wide orientation, X (m, n) with m <= n, so that X X^T is the small m x m. */
  int trans = rows > cols;
  size_t m = trans ? cols : rows, n = trans ? rows : cols;
  float *x = work;          // (m, n)
  float *y = x + m * n;     // (m, n) the next iterate
  float *a = y + m * n;     // (m, m) X X^T
  float *b = a + m * m;     // (m, m) polynomial in A
  double ss = 0;
  for (size_t i = 0; i < rows * cols; i++) ss += (double)g[i] * g[i];
  if (!isfinite(ss))
    return stabi_fail(STAB_ERANGE, "stab_msign: the %zu x %zu matrix holds NaN or Inf", rows, cols);
  if (ss == 0) {
    memset(out, 0, rows * cols * sizeof(float));
    return STAB_OK;
  }
  /* Dividing by ||G||_F puts every singular value in (0, 1], inside both basins. */
  float inv = (float)(1.0 / sqrt(ss));
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++)
      x[trans ? j * n + i : i * n + j] = g[i * cols + j] * inv;
  const float qa = 3.4445f, qb = -4.7750f, qc = 2.0315f;
  for (int s = 0; s < steps; s++) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)m, (int)n, 1.0f, x, (int)n,
                x, (int)n, 0.0f, a, (int)m);
    if (method == STAB_MSIGN_QUINTIC) {
      /* B = b A + c A^2; Y = a X + B X */
      memcpy(b, a, m * m * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)m, (int)m, qc, a,
                  (int)m, a, (int)m, qb, b, (int)m);
      memcpy(y, x, m * n * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, 1.0f, b,
                  (int)m, x, (int)n, qa, y, (int)n);
    } else {
      /* Y = 1.5 X - 0.5 A X */
      memcpy(y, x, m * n * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)m, -0.5f, a,
                  (int)m, x, (int)n, 1.5f, y, (int)n);
    }
    float *t = x;
    x = y, y = t;
  }
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) out[i * cols + j] = x[trans ? j * n + i : i * n + j];
  return STAB_OK;
}

stab_status stab_normalize_rows(const float *g, size_t rows, size_t cols, double scale,
                                float *out) {
  size_t ld = 0;
  stab_status st = stabi_check_matrix("stab_normalize_rows", "g", g, rows, cols, &ld);
  if (st != STAB_OK) return st;
  if (!out) return stabi_fail(STAB_EINVAL, "stab_normalize_rows: out is NULL");
  for (size_t i = 0; i < rows; i++) {
    const float *r = g + i * cols;
    double ss = 0;
    for (size_t j = 0; j < cols; j++) ss += (double)r[j] * r[j];
    double f = ss > 0 ? scale / sqrt(ss / (double)cols) : 0.0;
    for (size_t j = 0; j < cols; j++) out[i * cols + j] = (float)(r[j] * f);
  }
  return STAB_OK;
}

stab_status stab_sign(const float *g, size_t n, double scale, float *out) {
  if (!g || !out) return stabi_fail(STAB_EINVAL, "stab_sign: %s is NULL", !g ? "g" : "out");
  size_t ld = 0;
  if (n > 0) { /* n = 0 is nothing to do */
    stab_status st = stabi_check_extent("stab_sign", "g", 1, n, &ld, NULL);
    if (st != STAB_OK) return st;
  }
  float s = (float)scale;
  for (size_t i = 0; i < n; i++) out[i] = g[i] > 0 ? s : g[i] < 0 ? -s : g[i] * s;
  return STAB_OK;
}
