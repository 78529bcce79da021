/* testutil.h — shared helpers of the Check tests: a seeded deterministic RNG, matrix
 * families with known spectra, and independent f64 references (LAPACKE SVD, brute-force
 * norms, diameters and matrix-vector products) to check the library against.
 *
 * Stored matrices follow the library's convention: row-major, rows x cols, row stride ld
 * (>= cols) elements. Every helper that returns a pointer allocates it with malloc (the
 * caller frees) and fails the running test, rather than returning NULL, when out of memory.
 */
#ifndef STAB_TESTUTIL_H
#define STAB_TESTUTIL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <check.h>

#include "stabmeter.h"

/* ---- RNG: splitmix64 + Box-Muller ------------------------------------------------- */

typedef struct {
  uint64_t state;
  int has_spare;  /* Box-Muller makes two normals per draw; the second waits here */
  double spare;
} tu_rng;

void tu_rng_init(tu_rng *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng *r);
double tu_rng_uniform(tu_rng *r); /* in (0, 1), never 0 or 1 */
double tu_rng_gauss(tu_rng *r);   /* standard normal */

/* ---- allocation ------------------------------------------------------------------- */

float *tu_floats(size_t n);   /* n zero floats */
double *tu_doubles(size_t n); /* n zero doubles */
/* A rows x ld buffer whose padding columns (cols..ld-1) hold NaN, so that a reader that
 * strays out of the rows x cols block turns its result into NaN. */
float *tu_matrix_padded(size_t rows, size_t cols, size_t ld);

/* ---- matrix families (write the rows x cols block, leave padding alone) ----------- */

/* i.i.d. N(0, std^2). */
void tu_fill_gauss(float *a, size_t rows, size_t cols, size_t ld, double std, tu_rng *r);
/* sum_{k<rank} s_k u_k v_k^T with s_k = 10 / 2^k and unit Gaussian u_k, v_k, plus
 * N(0, noise^2) entries: a clear spectral gap. */
void tu_fill_lowrank(float *a, size_t rows, size_t cols, size_t ld, size_t rank, double noise,
                     tu_rng *r);
/* Zeros with diag[i] at (i, i), i < min(rows, cols). */
void tu_fill_diag(float *a, size_t rows, size_t cols, size_t ld, const double *diag);
/* Orthonormal columns (rows >= cols) or rows (rows < cols): the Q of LAPACKE dgeqrf +
 * dorgqr of a Gaussian matrix. Every singular value is 1 up to f32 rounding. */
void tu_fill_orthonormal(float *a, size_t rows, size_t cols, size_t ld, tu_rng *r);
/* The Householder reflection I - 2 u u^T / (u^T u) of a Gaussian u, n x n. */
void tu_fill_householder(float *a, size_t n, size_t ld, tu_rng *r);
/* u v^T with Gaussian u, v. */
void tu_fill_rank1(float *a, size_t rows, size_t cols, size_t ld, tu_rng *r);
/* a += scale * N(0, 1) entries with scale chosen so that ||added||_F = rel * ||a||_F. */
void tu_add_relative_noise(float *a, size_t rows, size_t cols, size_t ld, double rel,
                           tu_rng *r);
/* n floats of exactly RMS 1 up to f32 rounding, Gaussian direction, in f64. */
void tu_random_unit_rms(double *x, size_t n, tu_rng *r);

/* ---- f64 copies ------------------------------------------------------------------- */

/* The stored block of A - B (B may be NULL) as a contiguous f64 matrix, each difference
 * formed in f64 (exact for f32 inputs). transpose = 1 returns the cols x rows transpose. */
double *tu_to_double(const float *a, const float *b, size_t rows, size_t cols, size_t ld,
                     int transpose);

/* ---- references ------------------------------------------------------------------- */

/* Largest singular value by LAPACKE_dgesvd (values only) on an f64 copy. */
double ref_sigma(const float *a, size_t rows, size_t cols, size_t ld);
/* sigma(A - B) of the explicitly formed f64 difference. */
double ref_sigma_diff(const float *a, const float *b, size_t rows, size_t cols, size_t ld);
/* sigma of a contiguous f64 matrix (not modified). */
double ref_sigma_d(const double *a, size_t rows, size_t cols);
/* sigma with its top left (u, length rows) and right (v, length cols) singular vectors,
 * by LAPACKE_dgesvd in f64. Either vector may be NULL. */
double ref_sigma_vectors(const float *a, size_t rows, size_t cols, size_t ld, double *u,
                         double *v);

/* RMS of n values with stride, in long double. */
double ref_rms(const float *x, size_t n, size_t stride);
/* ||a - b||_RMS with b possibly NULL, in long double. */
double ref_rms_diff(const float *a, const float *b, size_t n);
/* ||a||_F of a contiguous f64 matrix of n entries. */
double ref_frob_d(const double *a, size_t n);
/* max_i ||row_i||_RMS of a contiguous f64 matrix. */
double ref_max_row_rms_d(const double *a, size_t rows, size_t cols);
/* max_{i,j} ||row_i - row_j||_RMS by brute force over all pairs (no cancellation). */
double ref_diameter_rows_d(const double *a, size_t rows, size_t cols);
/* max_i ||row_i - mean_row||_RMS. */
double ref_centred_radius_rows_d(const double *a, size_t rows, size_t cols);

/* y = A x (A stored f32 rows x cols with ld, x length cols, y length rows), in f64. */
void tu_matvec(const float *a, size_t rows, size_t cols, size_t ld, const double *x,
               double *y);
/* y = A^T x (x length rows, y length cols), in f64. */
void tu_matvec_t(const float *a, size_t rows, size_t cols, size_t ld, const double *x,
                 double *y);
double tu_norm2(const double *x, size_t n);
double tu_rms_d(const double *x, size_t n);

/* ---- tolerances and assertions ---------------------------------------------------- */

/* |got - want| / |want| (|got| when want is 0). */
double tu_rel(double got, double want);
/* Tolerance of an f64 SVD-backed value of a rows x cols matrix: k n DBL_EPSILON. */
double tu_tol_exact(size_t rows, size_t cols);
/* How far a Ritz value may exceed the true sigma through the passes' rounding: f64's, plus
 * the f32 runs of lib/engine/gram_pass.c (at most 64 products a dot lane, 8 rows an accumulation, so
 * about (64 + 8 + 4) u32 relative on G x where |W|^T |W| |x| is not far above G x; half of it
 * on sigma). */
double tu_round_slack(size_t rows, size_t cols);

/* got is finite and within relative tolerance tol of want. */
#define TU_ASSERT_REL(got, want, tol, ...)                                                  \
  do {                                                                                      \
    double tu_g_ = (got), tu_w_ = (want), tu_t_ = (tol);                                    \
    ck_assert_msg(isfinite(tu_g_) && fabs(tu_g_ - tu_w_) <= tu_t_ * fabs(tu_w_),           \
                  "%s: %s = %.17g, expected %.17g (rel err %.3g > %.3g)", tu_ctx(__VA_ARGS__), \
                  #got, tu_g_, tu_w_, tu_rel(tu_g_, tu_w_), tu_t_);                         \
  } while (0)

/* got <= bound * (1 + slack) and finite. */
#define TU_ASSERT_LE(got, bound, slack, ...)                                                \
  do {                                                                                      \
    double tu_g_ = (got), tu_b_ = (bound), tu_s_ = (slack);                                 \
    ck_assert_msg(isfinite(tu_g_) && tu_g_ <= tu_b_ + tu_s_ * fabs(tu_b_),                 \
                  "%s: %s = %.17g exceeds %s = %.17g (by rel %.3g, slack %.3g)",            \
                  tu_ctx(__VA_ARGS__), #got, tu_g_, #bound, tu_b_, tu_rel(tu_g_, tu_b_), tu_s_); \
  } while (0)

#define TU_ASSERT_NAN(x, ...)                                                               \
  do {                                                                                      \
    double tu_x_ = (x);                                                                     \
    ck_assert_msg(isnan(tu_x_), "%s: %s = %.17g, expected NaN", tu_ctx(__VA_ARGS__), #x, tu_x_); \
  } while (0)

/* Status is not STAB_OK (any error) and stab_last_error() says something. */
#define TU_ASSERT_FAILS(call, ...)                                                          \
  do {                                                                                      \
    int tu_st_ = (int)(call);                                                               \
    ck_assert_msg(tu_st_ < 0, "%s: %s returned %d, expected an error", tu_ctx(__VA_ARGS__), \
                  #call, tu_st_);                                                           \
    ck_assert_msg(stab_last_error() != NULL && stab_last_error()[0] != '\0',                \
                  "%s: %s failed with %d but stab_last_error() is empty", tu_ctx(__VA_ARGS__), \
                  #call, tu_st_);                                                           \
  } while (0)

/* Status is exactly `want` and stab_last_error() says something. */
#define TU_ASSERT_STATUS(call, want, ...)                                                   \
  do {                                                                                      \
    int tu_st_ = (int)(call);                                                               \
    ck_assert_msg(tu_st_ == (int)(want), "%s: %s returned %d, expected %s (%d)",            \
                  tu_ctx(__VA_ARGS__), #call, tu_st_, #want, (int)(want));                   \
    ck_assert_msg(stab_last_error() != NULL && stab_last_error()[0] != '\0',                \
                  "%s: %s failed but stab_last_error() is empty", tu_ctx(__VA_ARGS__), #call); \
  } while (0)

#define TU_ASSERT_OK(call, ...)                                                             \
  do {                                                                                      \
    int tu_st_ = (int)(call);                                                               \
    ck_assert_msg(tu_st_ == 0, "%s: %s returned %d (%s)", tu_ctx(__VA_ARGS__), #call, tu_st_, \
                  stab_last_error());                                                       \
  } while (0)

/* Every field of got equal to want's bit for bit (any NaN equals any NaN: a NaN's payload is
 * not a metric), passes included; what names the layer or case in the message. For metrics
 * that must not depend on how the weights were stored or registered (16-bit against f32, a
 * monitor against stab_layer_metrics). */
void tu_assert_same_metrics(const char *what, const stab_metrics *got, const stab_metrics *want);
/* One such value: what's field got equal to want bit for bit (NaN equals NaN). */
void tu_assert_same_double(const char *what, const char *field, double got, double want);

/* ---- temporary directories ------------------------------------------------------- */

/* A new empty directory $TMPDIR/<tag>.XXXXXX (/tmp when TMPDIR is unset or long) into dir
 * (len bytes); fails the running test when it cannot be made. */
void tu_tmpdir_make(char *dir, size_t len, const char *tag);
/* Removes dir and everything in it. */
void tu_tmpdir_remove(const char *dir);
/* "dir/name" in static storage: a ring of 16 buffers, so that the last 16 paths stay valid
 * at once (a source and a destination, a file and its .prev, ...). */
const char *tu_path_in(const char *dir, const char *name);

/* The optional trailing arguments of the assertions: a printf-style context string (for
 * loop tests and tables), "" when absent. Returns a thread-local buffer. */
const char *tu_ctx_fmt(const char *fmt, ...);
#define tu_ctx(...) tu_ctx_fmt("" __VA_ARGS__)

#endif /* STAB_TESTUTIL_H */
