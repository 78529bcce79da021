/* testutil.c — the shared helpers of the Check tests (see testutil.h): RNG, matrix
 * families and the independent references, all in f64 (or long double) and none of
 * them calling into the library under test. */
#include "testutil.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lapacke.h>

/* ---- RNG -------------------------------------------------------------------------- */

void tu_rng_init(tu_rng *r, uint64_t seed) {
  r->state = seed;
  r->has_spare = 0;
  r->spare = 0.0;
}

uint64_t tu_rng_u64(tu_rng *r) {
  uint64_t z = (r->state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double tu_rng_uniform(tu_rng *r) {
  return ((double)(tu_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double tu_rng_gauss(tu_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  double u1 = tu_rng_uniform(r), u2 = tu_rng_uniform(r);
  double rad = sqrt(-2.0 * log(u1)), theta = 6.283185307179586476925 * u2;
  r->spare = rad * sin(theta);
  r->has_spare = 1;
  return rad * cos(theta);
}

/* ---- allocation ------------------------------------------------------------------- */

float *tu_floats(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  ck_assert_msg(p != NULL, "test allocation of %zu floats failed", n);
  return p;
}

double *tu_doubles(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  ck_assert_msg(p != NULL, "test allocation of %zu doubles failed", n);
  return p;
}

float *tu_matrix_padded(size_t rows, size_t cols, size_t ld) {
  float *a = tu_floats(rows * ld);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = cols; j < ld; j++) a[i * ld + j] = NAN;
  return a;
}

/* ---- matrix families -------------------------------------------------------------- */

void tu_fill_gauss(float *a, size_t rows, size_t cols, size_t ld, double std, tu_rng *r) {
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) a[i * ld + j] = (float)(std * tu_rng_gauss(r));
}

static void unit_gauss(double *x, size_t n, tu_rng *r) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) {
    x[i] = tu_rng_gauss(r);
    s += x[i] * x[i];
  }
  s = sqrt(s);
  for (size_t i = 0; i < n; i++) x[i] /= s;
}

void tu_fill_lowrank(float *a, size_t rows, size_t cols, size_t ld, size_t rank, double noise,
                     tu_rng *r) {
  double *acc = tu_doubles(rows * cols);      // (rows, cols)
  double *u = tu_doubles(rows), *v = tu_doubles(cols);
  double s = 10.0;
  for (size_t k = 0; k < rank; k++, s *= 0.5) {
    unit_gauss(u, rows, r);
    unit_gauss(v, cols, r);
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < cols; j++) acc[i * cols + j] += s * u[i] * v[j];
  }
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++)
      a[i * ld + j] = (float)(acc[i * cols + j] + noise * tu_rng_gauss(r));
  free(acc);
  free(u);
  free(v);
}

void tu_fill_diag(float *a, size_t rows, size_t cols, size_t ld, const double *diag) {
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) a[i * ld + j] = i == j ? (float)diag[i] : 0.0f;
}

void tu_fill_orthonormal(float *a, size_t rows, size_t cols, size_t ld, tu_rng *r) {
  size_t m = rows >= cols ? rows : cols, n = rows >= cols ? cols : rows; // m >= n
  double *q = tu_doubles(m * n);  // (m, n) column-major
  double *tau = tu_doubles(n);
  for (size_t i = 0; i < m * n; i++) q[i] = tu_rng_gauss(r);
  lapack_int info = LAPACKE_dgeqrf(LAPACK_COL_MAJOR, (lapack_int)m, (lapack_int)n, q,
                                   (lapack_int)m, tau);
  ck_assert_msg(info == 0, "LAPACKE_dgeqrf info %d", (int)info);
  info = LAPACKE_dorgqr(LAPACK_COL_MAJOR, (lapack_int)m, (lapack_int)n, (lapack_int)n, q,
                        (lapack_int)m, tau);
  ck_assert_msg(info == 0, "LAPACKE_dorgqr info %d", (int)info);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++)
      a[i * ld + j] = (float)(rows >= cols ? q[i + j * m] : q[j + i * m]);
  free(q);
  free(tau);
}

void tu_fill_householder(float *a, size_t n, size_t ld, tu_rng *r) {
  double *u = tu_doubles(n);
  unit_gauss(u, n, r);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) a[i * ld + j] = (float)((i == j ? 1.0 : 0.0) - 2.0 * u[i] * u[j]);
  free(u);
}

void tu_fill_rank1(float *a, size_t rows, size_t cols, size_t ld, tu_rng *r) {
  double *u = tu_doubles(rows), *v = tu_doubles(cols);
  for (size_t i = 0; i < rows; i++) u[i] = tu_rng_gauss(r);
  for (size_t j = 0; j < cols; j++) v[j] = tu_rng_gauss(r);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) a[i * ld + j] = (float)(u[i] * v[j]);
  free(u);
  free(v);
}

void tu_add_relative_noise(float *a, size_t rows, size_t cols, size_t ld, double rel,
                           tu_rng *r) {
  double *g = tu_doubles(rows * cols);
  double na = 0.0, ng = 0.0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      double x = a[i * ld + j];
      na += x * x;
      g[i * cols + j] = tu_rng_gauss(r);
      ng += g[i * cols + j] * g[i * cols + j];
    }
  double scale = rel * sqrt(na) / sqrt(ng);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) a[i * ld + j] = (float)(a[i * ld + j] + scale * g[i * cols + j]);
  free(g);
}

void tu_random_unit_rms(double *x, size_t n, tu_rng *r) {
  unit_gauss(x, n, r);
  double s = sqrt((double)n);
  for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* ---- f64 copies ------------------------------------------------------------------- */

double *tu_to_double(const float *a, const float *b, size_t rows, size_t cols, size_t ld,
                     int transpose) {
  double *d = tu_doubles(rows * cols);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) {
      double x = (double)a[i * ld + j] - (b ? (double)b[i * ld + j] : 0.0);
      if (transpose)
        d[j * rows + i] = x;
      else
        d[i * cols + j] = x;
    }
  return d;
}

/* ---- references ------------------------------------------------------------------- */

double ref_sigma_d(const double *a, size_t rows, size_t cols) {
  size_t k = rows < cols ? rows : cols;
  double *copy = tu_doubles(rows * cols), *s = tu_doubles(k), *superb = tu_doubles(k + 1);
  memcpy(copy, a, rows * cols * sizeof *copy);
  /* The row-major rows x cols matrix read column-major is its cols x rows transpose:
   * same singular values, and LAPACKE makes no transposed copy. */
  double u_dummy = 0.0, vt_dummy = 0.0;
  lapack_int info = LAPACKE_dgesvd(LAPACK_COL_MAJOR, 'N', 'N', (lapack_int)cols,
                                   (lapack_int)rows, copy, (lapack_int)cols, s, &u_dummy, 1,
                                   &vt_dummy, 1, superb);
  ck_assert_msg(info == 0, "reference LAPACKE_dgesvd (%zu x %zu) info %d", rows, cols, (int)info);
  double sigma = s[0];
  free(copy);
  free(s);
  free(superb);
  return sigma;
}

double ref_sigma_vectors(const float *a, size_t rows, size_t cols, size_t ld, double *u,
                         double *v) {
  size_t k = rows < cols ? rows : cols;
  double *d = tu_to_double(a, NULL, rows, cols, ld, 0);  // (rows, cols) row-major
  double *s = tu_doubles(k), *superb = tu_doubles(k + 1);
  double *uu = tu_doubles(rows * k), *vt = tu_doubles(k * cols);  // (rows, k), (k, cols)
  lapack_int info = LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', (lapack_int)rows,
                                   (lapack_int)cols, d, (lapack_int)cols, s, uu, (lapack_int)k,
                                   vt, (lapack_int)cols, superb);
  ck_assert_msg(info == 0, "reference LAPACKE_dgesvd with vectors (%zu x %zu) info %d", rows,
                cols, (int)info);
  if (u)
    for (size_t i = 0; i < rows; i++) u[i] = uu[i * k];
  if (v)
    for (size_t j = 0; j < cols; j++) v[j] = vt[j];
  double sigma = s[0];
  free(d);
  free(s);
  free(superb);
  free(uu);
  free(vt);
  return sigma;
}

double ref_sigma(const float *a, size_t rows, size_t cols, size_t ld) {
  return ref_sigma_diff(a, NULL, rows, cols, ld);
}

double ref_sigma_diff(const float *a, const float *b, size_t rows, size_t cols, size_t ld) {
  double *d = tu_to_double(a, b, rows, cols, ld, 0);
  double sigma = ref_sigma_d(d, rows, cols);
  free(d);
  return sigma;
}

double ref_rms(const float *x, size_t n, size_t stride) {
  long double s = 0.0L;
  for (size_t i = 0; i < n; i++) {
    long double v = x[i * stride];
    s += v * v;
  }
  return (double)sqrtl(s / (long double)n);
}

double ref_rms_diff(const float *a, const float *b, size_t n) {
  long double s = 0.0L;
  for (size_t i = 0; i < n; i++) {
    long double v = (long double)a[i] - (b ? (long double)b[i] : 0.0L);
    s += v * v;
  }
  return (double)sqrtl(s / (long double)n);
}

double ref_frob_d(const double *a, size_t n) {
  long double s = 0.0L;
  for (size_t i = 0; i < n; i++) s += (long double)a[i] * a[i];
  return (double)sqrtl(s);
}

double ref_max_row_rms_d(const double *a, size_t rows, size_t cols) {
  double best = 0.0;
  for (size_t i = 0; i < rows; i++) {
    long double s = 0.0L;
    for (size_t j = 0; j < cols; j++) s += (long double)a[i * cols + j] * a[i * cols + j];
    double r = (double)sqrtl(s / (long double)cols);
    if (r > best) best = r;
  }
  return best;
}

double ref_diameter_rows_d(const double *a, size_t rows, size_t cols) {
  double best = 0.0;
  for (size_t i = 0; i < rows; i++)
    for (size_t t = i + 1; t < rows; t++) {
      double s = 0.0;
      for (size_t j = 0; j < cols; j++) {
        double d = a[i * cols + j] - a[t * cols + j];
        s += d * d;
      }
      if (s > best) best = s;
    }
  return sqrt(best / (double)cols);
}

double ref_centred_radius_rows_d(const double *a, size_t rows, size_t cols) {
  double *mean = tu_doubles(cols);
  for (size_t j = 0; j < cols; j++) {
    long double s = 0.0L;
    for (size_t i = 0; i < rows; i++) s += a[i * cols + j];
    mean[j] = (double)(s / (long double)rows);
  }
  double best = 0.0;
  for (size_t i = 0; i < rows; i++) {
    long double s = 0.0L;
    for (size_t j = 0; j < cols; j++) {
      long double d = (long double)a[i * cols + j] - mean[j];
      s += d * d;
    }
    double r = (double)sqrtl(s / (long double)cols);
    if (r > best) best = r;
  }
  free(mean);
  return best;
}

void tu_matvec(const float *a, size_t rows, size_t cols, size_t ld, const double *x,
               double *y) {
  for (size_t i = 0; i < rows; i++) {
    double s = 0.0;
    for (size_t j = 0; j < cols; j++) s += (double)a[i * ld + j] * x[j];
    y[i] = s;
  }
}

void tu_matvec_t(const float *a, size_t rows, size_t cols, size_t ld, const double *x,
                 double *y) {
  for (size_t j = 0; j < cols; j++) y[j] = 0.0;
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < cols; j++) y[j] += (double)a[i * ld + j] * x[i];
}

double tu_norm2(const double *x, size_t n) {
  long double s = 0.0L;
  for (size_t i = 0; i < n; i++) s += (long double)x[i] * x[i];
  return (double)sqrtl(s);
}

double tu_rms_d(const double *x, size_t n) { return tu_norm2(x, n) / sqrt((double)n); }

/* ---- tolerances ------------------------------------------------------------------- */

double tu_rel(double got, double want) {
  return want == 0.0 ? fabs(got) : fabs(got - want) / fabs(want);
}

double tu_tol_exact(size_t rows, size_t cols) {
  size_t n = rows > cols ? rows : cols;
  return 32.0 * (double)(n < 8 ? 8 : n) * DBL_EPSILON;
}

double tu_round_slack(size_t rows, size_t cols) {
  return 256.0 * (double)(rows + cols) * DBL_EPSILON + 0.5 * (64 + 8 + 4) * (FLT_EPSILON / 2);
}

const char *tu_ctx_fmt(const char *fmt, ...) {
  /* a ring of buffers, so that a context built from another context stays intact */
  static _Thread_local char bufs[8][512];
  static _Thread_local unsigned next;
  char *buf = bufs[next++ % 8];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof bufs[0], fmt, ap);
  va_end(ap);
  return buf[0] ? buf : "-";
}

void tu_tmpdir_make(char *dir, size_t len, const char *tag) {
  const char *base = getenv("TMPDIR");
  if (!base || !base[0] || strlen(base) + strlen(tag) + 9 > len) base = "/tmp";
  snprintf(dir, len, "%s/%s.XXXXXX", base, tag);
  ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
}

void tu_tmpdir_remove(const char *dir) {
  char cmd[600];
  ck_assert_msg(strlen(dir) < 500 && !strchr(dir, '\''), "tu_tmpdir_remove: odd path %s", dir);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  ck_assert_int_eq(system(cmd), 0);
}

const char *tu_path_in(const char *dir, const char *name) {
  static char paths[16][512];
  static unsigned next;
  char *p = paths[next++ % 16];
  int n = snprintf(p, sizeof paths[0], "%s/%s", dir, name);
  ck_assert_msg(n >= 0 && (size_t)n < sizeof paths[0], "tu_path_in: %s/%s is too long", dir, name);
  return p;
}

/* ---- metrics bit for bit ---------------------------------------------------------- */

void tu_assert_same_double(const char *what, const char *field, double got, double want) {
  if (isnan(got) && isnan(want)) return;
  ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s: %s = %.17g, expected %.17g bit for bit", what, field, got,
                want);
}

void tu_assert_same_metrics(const char *what, const stab_metrics *got, const stab_metrics *want) {
  tu_assert_same_double(what, "forward", got->forward, want->forward);
  tu_assert_same_double(what, "dependency", got->dependency, want->dependency);
  tu_assert_same_double(what, "update", got->update, want->update);
  tu_assert_same_double(what, "forward_tight", got->forward_tight, want->forward_tight);
  tu_assert_same_double(what, "dependency_tight", got->dependency_tight, want->dependency_tight);
  tu_assert_same_double(what, "update_tight", got->update_tight, want->update_tight);
  tu_assert_same_double(what, "spread", got->spread, want->spread);
  tu_assert_same_double(what, "sigma", got->sigma, want->sigma);
  tu_assert_same_double(what, "sigma_rel_err", got->sigma_rel_err, want->sigma_rel_err);
  tu_assert_same_double(what, "sigma_update", got->sigma_update, want->sigma_update);
  tu_assert_same_double(what, "sigma_update_rel_err", got->sigma_update_rel_err, want->sigma_update_rel_err);
  tu_assert_same_double(what, "rel_update", got->rel_update, want->rel_update);
  ck_assert_msg(got->passes == want->passes && got->update_passes == want->update_passes,
                "%s: passes %d/%d, expected %d/%d", what, got->passes, got->update_passes, want->passes,
                want->update_passes);
  ck_assert_msg(got->tight_method == want->tight_method && got->flags == want->flags,
                "%s: tight_method %d flags %d, expected %d and %d", what, got->tight_method, got->flags,
                want->tight_method, want->flags);
}
