/* gram_pass.c — y = W^T (W x) in a single pass over W, the work of every spectral
 * iteration. Reading W from memory is the bottleneck, so each row is used twice while it
 * is in cache (its dot with x, then the row scaled by that dot added into y), instead of
 * two BLAS gemv calls that would each stream all of W.
 *
 * Storage f32, arithmetic f64. Rows are split into chunks fixed by the shape alone; each
 * chunk accumulates into its own f64 vector and the chunks are summed in order, so the
 * result is bit-identical for any number of threads. */
#include "internal.h"

#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The vector helpers below are static inline: no value crosses an ABI boundary, so GCC's
 * note that AVX vectors change the calling convention does not apply. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* Compile the hot loops twice on x86-64: for AVX2+FMA machines and for the baseline;
 * the loader picks one at startup. Elsewhere the compiler's own target is used. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT_CLONES
#endif

static inline v4d load_f32(const float *p) {
  v4f f;
  memcpy(&f, p, sizeof f);
  return __builtin_convertvector(f, v4d);
}

static inline v4d load_f64(const double *p) {
  v4d d;
  memcpy(&d, p, sizeof d);
  return d;
}

static inline void store_f64(double *p, v4d d) { memcpy(p, &d, sizeof d); }

/* Element j..j+3 of row (a - b), or of a when b is NULL; b is a compile-time NULL in the
 * plain specialisation, so the test disappears there. */
static inline __attribute__((always_inline)) v4d row4(const float *a, const float *b, size_t j) {
  return b ? load_f32(a + j) - load_f32(b + j) : load_f32(a + j);
}

static inline __attribute__((always_inline)) double row1(const float *a, const float *b, size_t j) {
  return b ? (double)a[j] - (double)b[j] : (double)a[j];
}

static inline double hsum(v4d s) { return (s[0] + s[1]) + (s[2] + s[3]); }

/* Rows [r0, r1) of one chunk into acc (cols doubles, overwritten); returns the sum of the
 * squared dots. Four rows at a time so that x and acc are loaded once per four rows. */
static inline __attribute__((always_inline)) double
chunk_apply(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
            const double *x, double *acc) {
  const size_t cols4 = cols & ~(size_t)3;
  double quad = 0.0;
  memset(acc, 0, cols * sizeof *acc);
  size_t i = r0;
  for (; i + 4 <= r1; i += 4) {
    const float *a0 = a + i * ld, *a1 = a0 + ld, *a2 = a1 + ld, *a3 = a2 + ld;
    const float *b0 = NULL, *b1 = NULL, *b2 = NULL, *b3 = NULL;
    if (b) {
      b0 = b + i * ld;
      b1 = b0 + ld;
      b2 = b1 + ld;
      b3 = b2 + ld;
    }
    v4d s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t j = 0; j < cols4; j += 4) {
      v4d xv = load_f64(x + j);
      s0 += row4(a0, b0, j) * xv;
      s1 += row4(a1, b1, j) * xv;
      s2 += row4(a2, b2, j) * xv;
      s3 += row4(a3, b3, j) * xv;
    }
    double d0 = hsum(s0), d1 = hsum(s1), d2 = hsum(s2), d3 = hsum(s3);
    for (size_t j = cols4; j < cols; j++) {
      d0 += row1(a0, b0, j) * x[j];
      d1 += row1(a1, b1, j) * x[j];
      d2 += row1(a2, b2, j) * x[j];
      d3 += row1(a3, b3, j) * x[j];
    }
    quad += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
    const v4d e0 = {d0, d0, d0, d0}, e1 = {d1, d1, d1, d1};
    const v4d e2 = {d2, d2, d2, d2}, e3 = {d3, d3, d3, d3};
    for (size_t j = 0; j < cols4; j += 4) {
      v4d y = load_f64(acc + j);
      y += (e0 * row4(a0, b0, j) + e1 * row4(a1, b1, j)) +
           (e2 * row4(a2, b2, j) + e3 * row4(a3, b3, j));
      store_f64(acc + j, y);
    }
    for (size_t j = cols4; j < cols; j++)
      acc[j] += (d0 * row1(a0, b0, j) + d1 * row1(a1, b1, j)) +
                (d2 * row1(a2, b2, j) + d3 * row1(a3, b3, j));
  }
  for (; i < r1; i++) {
    const float *ai = a + i * ld, *bi = b ? b + i * ld : NULL;
    v4d s = {0};
    for (size_t j = 0; j < cols4; j += 4) s += row4(ai, bi, j) * load_f64(x + j);
    double d = hsum(s);
    for (size_t j = cols4; j < cols; j++) d += row1(ai, bi, j) * x[j];
    quad += d * d;
    const v4d e = {d, d, d, d};
    for (size_t j = 0; j < cols4; j += 4) store_f64(acc + j, load_f64(acc + j) + e * row4(ai, bi, j));
    for (size_t j = cols4; j < cols; j++) acc[j] += d * row1(ai, bi, j);
  }
  return quad;
}

HOT_CLONES
static double chunk_plain(const float *a, size_t r0, size_t r1, size_t cols, size_t ld,
                          const double *x, double *acc) {
  return chunk_apply(a, NULL, r0, r1, cols, ld, x, acc);
}

HOT_CLONES
static double chunk_diff(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                         size_t ld, const double *x, double *acc) {
  return chunk_apply(a, b, r0, r1, cols, ld, x, acc);
}

size_t stabi_chunk_count(size_t rows) {
  /* Enough chunks to keep two or more threads busy, few enough that summing them is cheap. */
  size_t c = rows / 64;
  if (c < 1) c = 1;
  if (c > STABI_MAX_CHUNKS) c = STABI_MAX_CHUNKS;
  return c;
}

/* Below this many elements a pass is too short to be worth waking other threads. */
#define PARALLEL_MIN_ELEMENTS ((size_t)1 << 16)

double stabi_gram_apply(const float *a, const float *b, size_t rows, size_t cols, size_t ld,
                        const double *x, double *y, double *partial, int threads) {
  const size_t nchunks = stabi_chunk_count(rows);
  double quad[STABI_MAX_CHUNKS];
  int nt = 1;
#ifdef _OPENMP
  nt = threads > 0 ? threads : omp_get_max_threads();
  if (rows * cols < PARALLEL_MIN_ELEMENTS || nchunks == 1) nt = 1;
#else
  (void)threads;
#endif
  /* With a single chunk it accumulates straight into y. */
  double *const acc0 = nchunks == 1 ? y : partial;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
#endif
  for (size_t k = 0; k < nchunks; k++) {
    const size_t r0 = k * rows / nchunks, r1 = (k + 1) * rows / nchunks;
    double *acc = acc0 + k * cols;
    quad[k] = b ? chunk_diff(a, b, r0, r1, cols, ld, x, acc)
                : chunk_plain(a, r0, r1, cols, ld, x, acc);
  }
  double total = 0.0;
  for (size_t k = 0; k < nchunks; k++) total += quad[k];
  if (nchunks > 1) {
    for (size_t j = 0; j < cols; j++) {
      double s = partial[j];
      for (size_t k = 1; k < nchunks; k++) s += partial[k * cols + j];
      y[j] = s;
    }
  }
  return total;
}
