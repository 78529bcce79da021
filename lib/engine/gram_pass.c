/* gram_pass.c — y = W^T (W x), for one, two or four vectors x, in a single pass over W: the
 * work of every spectral iteration. Reading W from memory is the cost, so each block of rows is
 * used twice while it is in cache (the rows' dots with x, then the rows scaled by those dots
 * added into y), instead of two BLAS gemv calls that would each stream all of W.
 *
 * Storage f32 (the SIMD builds also read BF16 directly; other 16-bit matrices, and BF16 with a
 * B, arrive as f32 tiles of whole 8-row blocks). Two arithmetics, each in three builds picked at
 * run time (AVX-512, AVX2+FMA and portable C):
 *   - f32 runs (the default): products and partial sums in f32 over short runs, each run added
 *     into f64 (see "f32 runs" below). In f64 the loop was bound by the f32 -> f64
 *     conversions (two per element): 21 GB/s for two vectors where the memory gives 45-49.
 *   - f64 (the precise path, for tolerances below STAB_SPECTRAL_F32_TOL_MIN): every element
 *     converted to f64, every product and sum in f64.
 * Rows are split into chunks fixed by the shape alone; each chunk accumulates into its own
 * f64 vector and the chunks are summed in order, so on one machine the result is
 * bit-identical for any number of threads. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_KERNELS 1
#endif

/* Rows [r0, r1) of one chunk: for nv vectors x_v (x + v cols), acc_v += sum_i d_iv r_i with
 * d_iv = <r_i, x_v> and r_i = a_i - b_i (acc holds nv x cols doubles, zeroed by the caller);
 * returns quad + sum_i d_i0^2, added row by row. A chunk stored as 16-bit numbers arrives as
 * successive tiles of whole 8-row blocks, each call carrying acc and quad on from the last,
 * so the sums are the very ones a single call over the f32 rows makes. Every build has the
 * same shape: blocks of 8 rows, then single rows. nv is 1, 2 or 4: a further vector reuses each
 * loaded element, so it costs far less than a pass (the f64 SIMD builds take 4 vectors as two
 * passes of 2 over the chunk's rows, which are then in cache: the precise path is not the fast
 * one). */
typedef double (*chunk_fn)(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                           size_t ld, const double *x, double *acc, int nv, double quad);

/* The same with f32 runs; x32 is x rounded to f32 once per pass (nv x cols floats). */
typedef double (*chunk32_fn)(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                             size_t ld, const float *x32, const double *xup, const double *x,
                             double *acc, int nv, double quad);

/* ---- f32 runs ----
 * A run is a sum kept in f32 before it is added into f64; each f32 kernel keeps two kinds:
 *   - the row dots d_iv = <r_i, x_v>: each SIMD lane (each of the portable build's four
 *     partial sums) accumulates the products of every 16th (AVX2: 8th, portable: 4th) column
 *     in f32 (by FMA in the SIMD builds) over at most RUN_TERMS of its columns, i.e. runs of
 *     RUN_TERMS x lanes columns starting at column 0; at each run's end the lanes are widened
 *     and summed into the row's f64 dot. Columns past the last whole vector are summed in f64.
 *   - the accumulation of d_iv r_i into y: each lane sums the rows of a run (d rounded to f32,
 *     the products in f32), and that sum is added into the chunk's f64 accumulator: runs of
 *     STABI_RUN_ROWS = 32 rows in the SIMD builds, of 8 (a block) in the portable one, aligned to
 *     the chunk's first row (fixed by the shape; a tile holds whole runs), so the thread count
 *     never moves a run. Single rows past the last block, and columns past the last whole
 *     vector, are accumulated in f64.
 * Both are inside the 256 terms a run may hold (docs/manual/metrics.md): for a row of n columns,
 * |d - d~| <= (RUN_TERMS + 2) u32 sum_j |r_ij x_j| + O(n u64) with u32 = 2^-24 (the bound
 * tests/unit/check_gram_pass holds them to). Measured, sigma moved by at most 2.5e-8 relative
 * (2.4e-10 on a Gaussian 4096 x 4096): unchanged at the default tolerance, and far below
 * STAB_SPECTRAL_F32_TOL_MIN. 64 rather than 256: a run's end costs about 8 operations a
 * lane sum, 12% of a run of 64 FMAs, and 4 times shorter runs halve the typical error. */
#define RUN_TERMS 64

/* f32 spans about 1e-38 .. 3e38 where a matrix's f64 pass would not care: x is scaled per
 * vector (xup) and the dots of a block per vector (block_scale) by powers of two, which are
 * exact, so that the f32 numbers are at most 1 in magnitude. A power of two 2^e with
 * m = f 2^e, 0.5 <= f < 1 (1 for 0 or a non-finite m, which the pass's own check catches);
 * e within +-1000 so that both 2^e and 2^-e are normal doubles. */
static inline double pow2(int e) { /* 2^e for |e| <= 1000, from its bits (no libm call) */
  uint64_t bits = (uint64_t)(e + 1023) << 52;
  double p;
  memcpy(&p, &bits, sizeof p);
  return p;
}

static inline int pow2_exponent(double m) {
  if (!(m > 0.0) || !isfinite(m)) return 0;
  uint64_t bits;
  memcpy(&bits, &m, sizeof bits);
  int e = (int)((bits >> 52) & 0x7ff) - 1022; /* m = f 2^e, 0.5 <= f < 1 (subnormal m: e -1022) */
  return e > 1000 ? 1000 : e < -1000 ? -1000 : e;
}

static inline double pow2_above(double m) { return pow2(pow2_exponent(m)); }

/* e[v][r] = d[v][r] / up[v] as f32, with up[v] = pow2_above(max_r |d[v][r]|): what the
 * accumulation of a block of R rows multiplies the rows by. */
static inline void block_scale(double d[4][8], int nv, int R, float e[4][8], double up[4]) {
  for (int v = 0; v < nv; v++) {
    double m = 0.0;
    for (int r = 0; r < R; r++) {
      double a = fabs(d[v][r]);
      m = a > m ? a : m;
    }
    const int x = pow2_exponent(m);
    const double down = pow2(-x);
    up[v] = pow2(x);
    for (int r = 0; r < R; r++) e[v][r] = (float)(d[v][r] * down);
  }
}

/* e[v][r] = d[v][r] / up[v] as f32 for the R rows of a run, up[v] = pow2_above(max_r |d[v][r]|). */
static inline void run_scale(double d[4][STABI_RUN_ROWS], int nv, int R, float e[4][STABI_RUN_ROWS], double up[4]) {
  for (int v = 0; v < nv; v++) {
    double m = 0.0;
    for (int r = 0; r < R; r++) {
      double a = fabs(d[v][r]);
      m = a > m ? a : m;
    }
    const int x = pow2_exponent(m);
    const double down = pow2(-x);
    up[v] = pow2(x);
    for (int r = 0; r < R; r++) e[v][r] = (float)(d[v][r] * down);
  }
}

/* ---- portable C ---- */

static inline double elem(const float *a, const float *b, size_t j) {
  return b ? (double)a[j] - (double)b[j] : (double)a[j];
}

/* The SIMD builds also read A stored as BF16 (with no B) straight from memory, widening each
 * element as it is loaded: half the bytes of f32, and no tile to write and read back. BF is a
 * literal in every call, so the f32 code is what it was. A bf16 matrix travels as a const
 * float * to its first element, like stab_layer.weight. */

/* element j of bf16 data at a, as f32's value (a bf16 is the high half of an f32) */
static inline double bf16_at(const float *a, size_t j) {
  uint16_t h;
  memcpy(&h, (const unsigned char *)(const void *)a + 2 * j, sizeof h);
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* row i (stride ld elements) of a, f32 or bf16 */
static inline const float *row_at(const float *a, size_t i, size_t ld, int bf) {
  if (!bf) return a + i * ld;
  return (const float *)(const void *)((const unsigned char *)(const void *)a + 2 * i * ld);
}

static inline double elem_t(const float *a, const float *b, size_t j, int bf) {
  return bf ? bf16_at(a, j) : elem(a, b, j);
}

static double chunk_generic(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                            size_t ld, const double *x, double *acc, int nv, double quad) {
  for (size_t i = r0; i < r1; i++) {
    const float *ai = a + i * ld, *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const double *xv = x + (size_t)v * cols;
      double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
      size_t j = 0;
      for (; j + 4 <= cols; j += 4) {
        s0 += elem(ai, bi, j) * xv[j];
        s1 += elem(ai, bi, j + 1) * xv[j + 1];
        s2 += elem(ai, bi, j + 2) * xv[j + 2];
        s3 += elem(ai, bi, j + 3) * xv[j + 3];
      }
      double d = (s0 + s1) + (s2 + s3);
      for (; j < cols; j++) d += elem(ai, bi, j) * xv[j];
      if (v == 0) quad += d * d;
      double *av = acc + (size_t)v * cols;
      for (j = 0; j < cols; j++) av[j] += d * elem(ai, bi, j);
    }
  }
  return quad;
}

/* f32 runs, portable: four partial sums a dot (lanes of 1), blocks of 8 rows for the
 * accumulation. */
static inline float elem32(const float *a, const float *b, size_t j) { return b ? a[j] - b[j] : a[j]; }

static double chunk32_generic(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                              size_t ld, const float *x32, const double *xup, const double *x, double *acc,
                              int nv, double quad) {
  enum { R = 8, L = 4 };
  const size_t c4 = cols & ~(size_t)(L - 1);
  size_t i = r0;
  for (; i + R <= r1; i += R) {
    double d[4][R];
    float e[4][R];
    for (int v = 0; v < nv; v++)
      for (int r = 0; r < R; r++) {
        const float *ar = a + (i + (size_t)r) * ld, *br = b ? b + (i + (size_t)r) * ld : NULL;
        const float *xv = x32 + (size_t)v * cols;
        double dv = 0.0;
        for (size_t j0 = 0; j0 < c4; j0 += (size_t)RUN_TERMS * L) {
          const size_t j1 = c4 - j0 < (size_t)RUN_TERMS * L ? c4 : j0 + (size_t)RUN_TERMS * L;
          float s[L] = {0};
          for (size_t j = j0; j < j1; j += L)
            for (int l = 0; l < L; l++) s[l] += elem32(ar, br, j + (size_t)l) * xv[j + (size_t)l];
          dv += (((double)s[0] + (double)s[1]) + ((double)s[2] + (double)s[3])) * xup[v];
        }
        for (size_t j = c4; j < cols; j++) dv += elem(ar, br, j) * x[(size_t)v * cols + j];
        d[v][r] = dv;
      }
    double up[4];
    block_scale(d, nv, R, e, up);
    for (int r = 0; r < R; r++) quad += d[0][r] * d[0][r];
    for (int v = 0; v < nv; v++) {
      double *av = acc + (size_t)v * cols;
      for (size_t j = 0; j < c4; j++) {
        float t = 0.0f;
        for (int r = 0; r < R; r++) {
          const float *ar = a + (i + (size_t)r) * ld, *br = b ? b + (i + (size_t)r) * ld : NULL;
          t += e[v][r] * elem32(ar, br, j);
        }
        av[j] += (double)t * up[v];
      }
      for (size_t j = c4; j < cols; j++)
        for (int r = 0; r < R; r++) {
          const float *ar = a + (i + (size_t)r) * ld, *br = b ? b + (i + (size_t)r) * ld : NULL;
          av[j] += d[v][r] * elem(ar, br, j);
        }
    }
  }
  /* single rows: the dots in f32 runs, the accumulation in f64 (one row is no run) */
  for (; i < r1; i++) {
    const float *ai = a + i * ld, *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const float *xv = x32 + (size_t)v * cols;
      double d = 0.0;
      for (size_t j0 = 0; j0 < c4; j0 += (size_t)RUN_TERMS * L) {
        const size_t j1 = c4 - j0 < (size_t)RUN_TERMS * L ? c4 : j0 + (size_t)RUN_TERMS * L;
        float s[L] = {0};
        for (size_t j = j0; j < j1; j += L)
          for (int l = 0; l < L; l++) s[l] += elem32(ai, bi, j + (size_t)l) * xv[j + (size_t)l];
        d += (((double)s[0] + (double)s[1]) + ((double)s[2] + (double)s[3])) * xup[v];
      }
      for (size_t j = c4; j < cols; j++) d += elem(ai, bi, j) * x[(size_t)v * cols + j];
      if (v == 0) quad += d * d;
      double *av = acc + (size_t)v * cols;
      for (size_t j = 0; j < cols; j++) av[j] += d * elem(ai, bi, j);
    }
  }
  return quad;
}

#ifdef HAVE_X86_KERNELS

/* The two SIMD builds share one shape. Written out twice rather than generated by macros so
 * that each stays readable and greppable. The loops over the rows of a block and the nv
 * vectors are unrolled by pragma: left as loops, GCC -O2 keeps their vector arrays on the
 * stack. Blocks of 8 rows instead of 4 took a pass over 4096^2 from 33 to 44 GB/s: x and the
 * accumulator are loaded and stored half as often. */

/* ---- AVX2 + FMA: four doubles a vector ---- */

#define AVX2 __attribute__((always_inline, target("avx2,fma"))) static inline

AVX2 __m256d load4(const float *a, const float *b, size_t j) {
  __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(a + j));
  return b ? _mm256_sub_pd(v, _mm256_cvtps_pd(_mm_loadu_ps(b + j))) : v;
}

AVX2 __m256d load4_t(const float *a, const float *b, size_t j, int bf) {
  if (!bf) return load4(a, b, j);
  __m128i h = _mm_loadl_epi64((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
  return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
}

AVX2 double hsum4(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(s) + _mm_cvtsd_f64(_mm_unpackhi_pd(s, s));
}

/* Blocks of R rows (R = 4 or 8): x and acc are loaded once per R rows. */
AVX2 double chunk_avx2_body(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                            size_t ld, const double *x, double *acc, const int nv, const int R,
                            double quad, const int BF) {
  const size_t c4 = cols & ~(size_t)3;
  size_t i = r0;
  for (; i + (size_t)R <= r1; i += (size_t)R) {
    const float *A[8], *B[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      A[r] = row_at(a, i + (size_t)r, ld, BF);
      B[r] = b ? b + (i + (size_t)r) * ld : NULL;
    }
    __m256d s[2][8];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) s[v][r] = _mm256_setzero_pd();
    size_t j = 0;
    for (; j < c4; j += 4) {
      __m256d xv[2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) xv[v] = _mm256_loadu_pd(x + (size_t)v * cols + j);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m256d w = load4_t(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) s[v][r] = _mm256_fmadd_pd(w, xv[v], s[v][r]);
      }
    }
    double d[2][8];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        d[v][r] = hsum4(s[v][r]);
        for (size_t t = j; t < cols; t++) d[v][r] += elem_t(A[r], B[r], t, BF) * x[(size_t)v * cols + t];
      }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) quad += d[0][r] * d[0][r];
    __m256d e[2][8];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) e[v][r] = _mm256_set1_pd(d[v][r]);
    for (j = 0; j < c4; j += 4) {
      __m256d t[2][2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) t[v][0] = t[v][1] = _mm256_setzero_pd();
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m256d w = load4_t(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) t[v][r & 1] = _mm256_fmadd_pd(e[v][r], w, t[v][r & 1]);
      }
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) {
        double *av = acc + (size_t)v * cols + j;
        _mm256_storeu_pd(av, _mm256_add_pd(_mm256_loadu_pd(av), _mm256_add_pd(t[v][0], t[v][1])));
      }
    }
    for (; j < cols; j++)
      for (int v = 0; v < nv; v++)
        for (int r = 0; r < R; r++) acc[(size_t)v * cols + j] += d[v][r] * elem_t(A[r], B[r], j, BF);
  }
  for (; i < r1; i++) {
    const float *ai = row_at(a, i, ld, BF), *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const double *xv = x + (size_t)v * cols;
      double *av = acc + (size_t)v * cols;
      __m256d s = _mm256_setzero_pd();
      size_t j = 0;
      for (; j < c4; j += 4) s = _mm256_fmadd_pd(load4_t(ai, bi, j, BF), _mm256_loadu_pd(xv + j), s);
      double d = hsum4(s);
      for (; j < cols; j++) d += elem_t(ai, bi, j, BF) * xv[j];
      if (v == 0) quad += d * d;
      const __m256d e = _mm256_set1_pd(d);
      for (j = 0; j < c4; j += 4)
        _mm256_storeu_pd(av + j, _mm256_fmadd_pd(e, load4_t(ai, bi, j, BF), _mm256_loadu_pd(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

/* b, nv and R are literals in each call, so their tests vanish from the loops. Blocks of 8
 * rows even for two vectors, whose sums then overflow the 16 ymm registers: still faster than
 * blocks of 4 (4096^2, two vectors: 3.0 against 3.6 ms a pass). */
__attribute__((target("avx2,fma"))) static double
chunk_avx2(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
           const double *x, double *acc, int nv, double quad) {
  if (nv == 4) {
    double q = chunk_avx2(a, b, r0, r1, cols, ld, x, acc, 2, quad);
    chunk_avx2(a, b, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  if (nv == 2)
    return b ? chunk_avx2_body(a, b, r0, r1, cols, ld, x, acc, 2, 8, quad, 0)
             : chunk_avx2_body(a, NULL, r0, r1, cols, ld, x, acc, 2, 8, quad, 0);
  return b ? chunk_avx2_body(a, b, r0, r1, cols, ld, x, acc, 1, 8, quad, 0)
           : chunk_avx2_body(a, NULL, r0, r1, cols, ld, x, acc, 1, 8, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
__attribute__((target("avx2,fma"))) static double
chunk_avx2_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                const double *x, double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) {
    double q = chunk_avx2_bf16(a, NULL, r0, r1, cols, ld, x, acc, 2, quad);
    chunk_avx2_bf16(a, NULL, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  return nv == 2 ? chunk_avx2_body(a, NULL, r0, r1, cols, ld, x, acc, 2, 8, quad, 1)
                 : chunk_avx2_body(a, NULL, r0, r1, cols, ld, x, acc, 1, 8, quad, 1);
}

/* ---- AVX2 + FMA, f32 runs: eight floats a vector ---- */

AVX2 __m256 load8f_t(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  __m256 v = _mm256_loadu_ps(a + j);
  return b ? _mm256_sub_ps(v, _mm256_loadu_ps(b + j)) : v;
}

/* the 8 lanes of s widened to f64 and summed, in a fixed order */
AVX2 double sum8(__m256 s) {
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(s));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(s, 1));
  return hsum4(_mm256_add_pd(lo, hi));
}

/* acc[0..8) += t up, widened (up a power of two: exact) */
AVX2 void add8(double *acc, __m256 t, double up) {
  const __m256d u = _mm256_set1_pd(up);
  __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(t));
  __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(t, 1));
  _mm256_storeu_pd(acc, _mm256_fmadd_pd(lo, u, _mm256_loadu_pd(acc)));
  _mm256_storeu_pd(acc + 4, _mm256_fmadd_pd(hi, u, _mm256_loadu_pd(acc + 4)));
}

/* The AVX-512 build's shape (see there) in 16 ymm registers: runs of STABI_RUN_ROWS rows, the
 * dots swept RS = 8 / nv rows at a time (8 sums), the accumulation by tiles whose 8 sums stay in
 * registers over the run's rows, the next run prefetched into L2 meanwhile. */
AVX2 double chunk32_avx2_body(const float *a, const float *b, size_t r0, size_t r1,
                                  size_t cols, size_t ld, const float *x32, const double *xup,
                                  const double *x, double *acc, const int nv, double quad, const int BF) {
  enum { R = 8, L = 8, S = STABI_RUN_ROWS };
  const int RS = R / nv;
  const int T = nv == 4 ? 2 : nv == 2 ? 4 : 8; /* nv x T sums, 8 of them: the FMA latency hidden */
  const size_t c8 = cols & ~(size_t)(L - 1), run = (size_t)RUN_TERMS * L;
  size_t i = r0;
  while (i + R <= r1) {
    const int SR = (int)((r1 - i) / R < (size_t)(S / R) ? (r1 - i) / R * R : (size_t)S);
    double d[4][S];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++)
      for (int r = 0; r < SR; r++) d[v][r] = 0.0;
    /* column runs outermost: a run of x (nv x 1024 floats, 16 KiB for four vectors) stays in
     * L1 over all the rows' sweeps, where a whole x (64 KiB for four vectors of 4096) would
     * be read from L2 at every sweep; each row's runs are still added in column order */
    for (size_t j0 = 0; j0 < c8; j0 += run) {
      const size_t j1 = c8 - j0 < run ? c8 : j0 + run;
      for (int q = 0; q < SR; q += RS) {
        const float *A[8], *B[8];
#pragma GCC unroll 8
        for (int r = 0; r < RS; r++) {
          A[r] = row_at(a, i + (size_t)(q + r), ld, BF);
          B[r] = b ? b + (i + (size_t)(q + r)) * ld : NULL;
        }
        __m256 s[4][8];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) s[v][r] = _mm256_setzero_ps();
        for (size_t j = j0; j < j1; j += L) {
          __m256 xv[4];
#pragma GCC unroll 4
          for (int v = 0; v < nv; v++) xv[v] = _mm256_loadu_ps(x32 + (size_t)v * cols + j);
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) {
            __m256 w = load8f_t(A[r], B[r], j, BF);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) s[v][r] = _mm256_fmadd_ps(w, xv[v], s[v][r]);
          }
        }
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) d[v][q + r] += sum8(s[v][r]) * xup[v];
      }
    }
    for (int r = 0; r < SR; r++) {
      const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = c8; t < cols; t++)
        for (int v = 0; v < nv; v++) d[v][r] += elem_t(ar, br, t, BF) * x[(size_t)v * cols + t];
    }
    float e[4][S];
    double up[4];
    run_scale(d, nv, SR, e, up);
    for (int r = 0; r < SR; r++) quad += d[0][r] * d[0][r];
    size_t j = 0;
    for (; j + (size_t)(T * L) <= c8; j += (size_t)(T * L)) {
      __m256 s[4][8];
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[v][t] = _mm256_setzero_ps();
      for (int r = 0; r < SR; r++) {
        const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
        if (i + (size_t)(SR + r) < r1) { /* the next run's row, this tile's columns, on its way to L2 */
          const char *pa = (const char *)(const void *)row_at(a, i + (size_t)(SR + r), ld, BF) + (BF ? 2 : 4) * j;
          for (int k = 0; k < T * L * (BF ? 2 : 4); k += 64) _mm_prefetch(pa + k, _MM_HINT_T1);
          if (b) {
            const char *pb = (const char *)(const void *)(b + (i + (size_t)(SR + r)) * ld + j);
            for (int k = 0; k < T * L * 4; k += 64) _mm_prefetch(pb + k, _MM_HINT_T1);
          }
        }
        if (nv == 1) { /* 8 sums and 8 loaded rows would not fit in 16 ymm: each row used at once */
          const __m256 ev = _mm256_set1_ps(e[0][r]);
#pragma GCC unroll 8
          for (int t = 0; t < T; t++) s[0][t] = _mm256_fmadd_ps(ev, load8f_t(ar, br, j + (size_t)(t * L), BF), s[0][t]);
          continue;
        }
        __m256 w[8];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) w[t] = load8f_t(ar, br, j + (size_t)(t * L), BF);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
          const __m256 ev = _mm256_set1_ps(e[v][r]);
#pragma GCC unroll 8
          for (int t = 0; t < T; t++) s[v][t] = _mm256_fmadd_ps(ev, w[t], s[v][t]);
        }
      }
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) add8(acc + (size_t)v * cols + j + (size_t)(t * L), s[v][t], up[v]);
    }
    for (; j < c8; j += L) {
      __m256 s[4];
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) s[v] = _mm256_setzero_ps();
      for (int r = 0; r < SR; r++) {
        const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
        const __m256 w = load8f_t(ar, br, j, BF);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) s[v] = _mm256_fmadd_ps(_mm256_set1_ps(e[v][r]), w, s[v]);
      }
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) add8(acc + (size_t)v * cols + j, s[v], up[v]);
    }
    for (int r = 0; r < SR; r++) {
      const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = c8; t < cols; t++)
        for (int v = 0; v < nv; v++) acc[(size_t)v * cols + t] += d[v][r] * elem_t(ar, br, t, BF);
    }
    i += (size_t)SR;
  }
  /* single rows: the dots in f32 runs, the accumulation in f64 (one row is no run) */
  for (; i < r1; i++) {
    const float *ai = row_at(a, i, ld, BF), *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const float *xv = x32 + (size_t)v * cols;
      double *av = acc + (size_t)v * cols;
      double d = 0.0;
      for (size_t j0 = 0; j0 < c8; j0 += run) {
        const size_t j1 = c8 - j0 < run ? c8 : j0 + run;
        __m256 s = _mm256_setzero_ps();
        for (size_t j = j0; j < j1; j += L) s = _mm256_fmadd_ps(load8f_t(ai, bi, j, BF), _mm256_loadu_ps(xv + j), s);
        d += sum8(s) * xup[v];
      }
      for (size_t j = c8; j < cols; j++) d += elem_t(ai, bi, j, BF) * x[(size_t)v * cols + j];
      if (v == 0) quad += d * d;
      const __m256d e = _mm256_set1_pd(d);
      size_t j = 0;
      for (; j + 4 <= cols; j += 4)
        _mm256_storeu_pd(av + j, _mm256_fmadd_pd(e, load4_t(ai, bi, j, BF), _mm256_loadu_pd(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

/* b, nv and BF are literals in each call, so their tests vanish from the loops. */
__attribute__((target("avx2,fma"))) static double
chunk32_avx2(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
             const float *x32, const double *xup, const double *x, double *acc, int nv, double quad) {
  if (b) {
    if (nv == 4) return chunk32_avx2_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
    if (nv == 2) return chunk32_avx2_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
    return chunk32_avx2_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
  }
  if (nv == 4) return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
  if (nv == 2) return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
  return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
__attribute__((target("avx2,fma"))) static double
chunk32_avx2_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                  const float *x32, const double *xup, const double *x, double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 1);
  if (nv == 2) return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 1);
  return chunk32_avx2_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 1);
}

/* ---- AVX-512: eight doubles a vector ---- */

#define AVX512 __attribute__((always_inline, target("avx512f"))) static inline

AVX512 __m512d load8(const float *a, const float *b, size_t j) {
  __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(a + j));
  return b ? _mm512_sub_pd(v, _mm512_cvtps_pd(_mm256_loadu_ps(b + j))) : v;
}

AVX512 __m512d load8_t(const float *a, const float *b, size_t j, int bf) {
  if (!bf) return load8(a, b, j);
  __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
}

/* Blocks of 8 rows: with 32 zmm registers the sums of 8 rows for two vectors fit. */
AVX512 double chunk_avx512_body(const float *a, const float *b, size_t r0, size_t r1,
                                size_t cols, size_t ld, const double *x, double *acc,
                                const int nv, double quad, const int BF) {
  enum { R = 8 };
  const size_t c8 = cols & ~(size_t)7;
  size_t i = r0;
  for (; i + R <= r1; i += R) {
    const float *A[R], *B[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      A[r] = row_at(a, i + (size_t)r, ld, BF);
      B[r] = b ? b + (i + (size_t)r) * ld : NULL;
    }
    __m512d s[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) s[v][r] = _mm512_setzero_pd();
    size_t j = 0;
    for (; j < c8; j += 8) {
      __m512d xv[2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) xv[v] = _mm512_loadu_pd(x + (size_t)v * cols + j);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m512d w = load8_t(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) s[v][r] = _mm512_fmadd_pd(w, xv[v], s[v][r]);
      }
    }
    double d[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        d[v][r] = _mm512_reduce_add_pd(s[v][r]);
        for (size_t t = j; t < cols; t++) d[v][r] += elem_t(A[r], B[r], t, BF) * x[(size_t)v * cols + t];
      }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) quad += d[0][r] * d[0][r];
    __m512d e[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) e[v][r] = _mm512_set1_pd(d[v][r]);
    for (j = 0; j < c8; j += 8) {
      __m512d t[2][2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) t[v][0] = t[v][1] = _mm512_setzero_pd();
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m512d w = load8_t(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) t[v][r & 1] = _mm512_fmadd_pd(e[v][r], w, t[v][r & 1]);
      }
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) {
        double *av = acc + (size_t)v * cols + j;
        _mm512_storeu_pd(av, _mm512_add_pd(_mm512_loadu_pd(av), _mm512_add_pd(t[v][0], t[v][1])));
      }
    }
    for (; j < cols; j++)
      for (int v = 0; v < nv; v++)
        for (int r = 0; r < R; r++) acc[(size_t)v * cols + j] += d[v][r] * elem_t(A[r], B[r], j, BF);
  }
  for (; i < r1; i++) {
    const float *ai = row_at(a, i, ld, BF), *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const double *xv = x + (size_t)v * cols;
      double *av = acc + (size_t)v * cols;
      __m512d s = _mm512_setzero_pd();
      size_t j = 0;
      for (; j < c8; j += 8) s = _mm512_fmadd_pd(load8_t(ai, bi, j, BF), _mm512_loadu_pd(xv + j), s);
      double d = _mm512_reduce_add_pd(s);
      for (; j < cols; j++) d += elem_t(ai, bi, j, BF) * xv[j];
      if (v == 0) quad += d * d;
      const __m512d e = _mm512_set1_pd(d);
      for (j = 0; j < c8; j += 8)
        _mm512_storeu_pd(av + j, _mm512_fmadd_pd(e, load8_t(ai, bi, j, BF), _mm512_loadu_pd(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

__attribute__((target("avx512f"))) static double
chunk_avx512(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
             const double *x, double *acc, int nv, double quad) {
  if (nv == 4) {
    double q = chunk_avx512(a, b, r0, r1, cols, ld, x, acc, 2, quad);
    chunk_avx512(a, b, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  if (nv == 2)
    return b ? chunk_avx512_body(a, b, r0, r1, cols, ld, x, acc, 2, quad, 0)
             : chunk_avx512_body(a, NULL, r0, r1, cols, ld, x, acc, 2, quad, 0);
  return b ? chunk_avx512_body(a, b, r0, r1, cols, ld, x, acc, 1, quad, 0)
           : chunk_avx512_body(a, NULL, r0, r1, cols, ld, x, acc, 1, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
__attribute__((target("avx512f"))) static double
chunk_avx512_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                  const double *x, double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) {
    double q = chunk_avx512_bf16(a, NULL, r0, r1, cols, ld, x, acc, 2, quad);
    chunk_avx512_bf16(a, NULL, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  return nv == 2 ? chunk_avx512_body(a, NULL, r0, r1, cols, ld, x, acc, 2, quad, 1)
                 : chunk_avx512_body(a, NULL, r0, r1, cols, ld, x, acc, 1, quad, 1);
}

/* ---- AVX-512, f32 runs: sixteen floats a vector ---- */

AVX512 __m512 load16_t(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m512 v = _mm512_loadu_ps(a + j);
  return b ? _mm512_sub_ps(v, _mm512_loadu_ps(b + j)) : v;
}

/* the 16 lanes of s widened to f64 and summed, in a fixed order */
AVX512 double sum16(__m512 s) {
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
  __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

/* acc[0..16) += t up, widened (up a power of two: exact) */
AVX512 void add16(double *acc, __m512 t, double up) {
  const __m512d u = _mm512_set1_pd(up);
  __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(t));
  __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(t), 1)));
  _mm512_storeu_pd(acc, _mm512_fmadd_pd(lo, u, _mm512_loadu_pd(acc)));
  _mm512_storeu_pd(acc + 8, _mm512_fmadd_pd(hi, u, _mm512_loadu_pd(acc + 8)));
}

/* Runs of up to STABI_RUN_ROWS rows (whole 8-row blocks). First the dots of all the run's rows,
 * swept over the columns RS rows at a time so that the nv x RS sums stay in the 32 zmm
 * registers (four vectors: 4 rows a sweep, x read from cache once a sweep, W once from
 * memory). Then the accumulation, by tiles of T x 16 columns: each tile's nv x T sums stay in
 * registers over all the run's rows (now in L2), and are added into the f64 accumulator once
 * a tile. Before, every 8-row block's sums went through the f64 accumulator (widen, load, FMA,
 * store for each vector and 16 columns): as many operations as the block's products, and the
 * accumulator (nv x cols doubles, 128 KiB for four vectors of 4096) streamed through L2 every 8
 * rows. While a run accumulates from L2, the next run's rows are prefetched into L2, so that
 * memory keeps streaming while the arithmetic runs (without, the two took turns). The run,
 * fixed by the chunk's first row, is a run of the accumulation's f32 sums (STABI_RUN_ROWS
 * terms, within the 256 of docs/manual/metrics.md). */
AVX512 double chunk32_avx512_body(const float *a, const float *b, size_t r0, size_t r1,
                                  size_t cols, size_t ld, const float *x32, const double *xup,
                                  const double *x, double *acc, const int nv, double quad, const int BF) {
  enum { R = 8, L = 16, S = STABI_RUN_ROWS };
  const int RS = nv == 4 ? 4 : 8;
  const int T = nv == 1 ? 8 : 4; /* nv x T independent sums: enough to hide the FMA latency */
  const size_t c16 = cols & ~(size_t)(L - 1), run = (size_t)RUN_TERMS * L;
  size_t i = r0;
  while (i + R <= r1) {
    const int SR = (int)((r1 - i) / R < (size_t)(S / R) ? (r1 - i) / R * R : (size_t)S);
    double d[4][S];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++)
      for (int r = 0; r < SR; r++) d[v][r] = 0.0;
    /* column runs outermost: a run of x (nv x 1024 floats, 16 KiB for four vectors) stays in
     * L1 over all the rows' sweeps, where a whole x (64 KiB for four vectors of 4096) would
     * be read from L2 at every sweep; each row's runs are still added in column order */
    for (size_t j0 = 0; j0 < c16; j0 += run) {
      const size_t j1 = c16 - j0 < run ? c16 : j0 + run;
      for (int q = 0; q < SR; q += RS) {
        const float *A[8], *B[8];
#pragma GCC unroll 8
        for (int r = 0; r < RS; r++) {
          A[r] = row_at(a, i + (size_t)(q + r), ld, BF);
          B[r] = b ? b + (i + (size_t)(q + r)) * ld : NULL;
        }
        __m512 s[4][8];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) s[v][r] = _mm512_setzero_ps();
        for (size_t j = j0; j < j1; j += L) {
          __m512 xv[4];
#pragma GCC unroll 4
          for (int v = 0; v < nv; v++) xv[v] = _mm512_loadu_ps(x32 + (size_t)v * cols + j);
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) {
            __m512 w = load16_t(A[r], B[r], j, BF);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) s[v][r] = _mm512_fmadd_ps(w, xv[v], s[v][r]);
          }
        }
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
          for (int r = 0; r < RS; r++) d[v][q + r] += sum16(s[v][r]) * xup[v];
      }
    }
    for (int r = 0; r < SR; r++) {
      const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = c16; t < cols; t++)
        for (int v = 0; v < nv; v++) d[v][r] += elem_t(ar, br, t, BF) * x[(size_t)v * cols + t];
    }
    float e[4][S];
    double up[4];
    run_scale(d, nv, SR, e, up);
    for (int r = 0; r < SR; r++) quad += d[0][r] * d[0][r];
    size_t j = 0;
    for (; j + (size_t)(T * L) <= c16; j += (size_t)(T * L)) {
      __m512 s[4][8];
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) s[v][t] = _mm512_setzero_ps();
      for (int r = 0; r < SR; r++) {
        const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
        if (i + (size_t)(SR + r) < r1) { /* the next run's row, this tile's columns, on its way to L2 */
          const char *pa = (const char *)(const void *)row_at(a, i + (size_t)(SR + r), ld, BF) + (BF ? 2 : 4) * j;
          for (int k = 0; k < T * L * (BF ? 2 : 4); k += 64) _mm_prefetch(pa + k, _MM_HINT_T1);
          if (b) {
            const char *pb = (const char *)(const void *)(b + (i + (size_t)(SR + r)) * ld + j);
            for (int k = 0; k < T * L * 4; k += 64) _mm_prefetch(pb + k, _MM_HINT_T1);
          }
        }
        __m512 w[8];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) w[t] = load16_t(ar, br, j + (size_t)(t * L), BF);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
          const __m512 ev = _mm512_set1_ps(e[v][r]);
#pragma GCC unroll 8
          for (int t = 0; t < T; t++) s[v][t] = _mm512_fmadd_ps(ev, w[t], s[v][t]);
        }
      }
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) add16(acc + (size_t)v * cols + j + (size_t)(t * L), s[v][t], up[v]);
    }
    for (; j < c16; j += L) {
      __m512 s[4];
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) s[v] = _mm512_setzero_ps();
      for (int r = 0; r < SR; r++) {
        const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
        const __m512 w = load16_t(ar, br, j, BF);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) s[v] = _mm512_fmadd_ps(_mm512_set1_ps(e[v][r]), w, s[v]);
      }
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) add16(acc + (size_t)v * cols + j, s[v], up[v]);
    }
    for (int r = 0; r < SR; r++) {
      const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = c16; t < cols; t++)
        for (int v = 0; v < nv; v++) acc[(size_t)v * cols + t] += d[v][r] * elem_t(ar, br, t, BF);
    }
    i += (size_t)SR;
  }
  /* single rows: the dots in f32 runs, the accumulation in f64 (one row is no run) */
  for (; i < r1; i++) {
    const float *ai = row_at(a, i, ld, BF), *bi = b ? b + i * ld : NULL;
    for (int v = 0; v < nv; v++) {
      const float *xv = x32 + (size_t)v * cols;
      double *av = acc + (size_t)v * cols;
      double d = 0.0;
      for (size_t j0 = 0; j0 < c16; j0 += run) {
        const size_t j1 = c16 - j0 < run ? c16 : j0 + run;
        __m512 s = _mm512_setzero_ps();
        for (size_t j = j0; j < j1; j += L) s = _mm512_fmadd_ps(load16_t(ai, bi, j, BF), _mm512_loadu_ps(xv + j), s);
        d += sum16(s) * xup[v];
      }
      for (size_t j = c16; j < cols; j++) d += elem_t(ai, bi, j, BF) * x[(size_t)v * cols + j];
      if (v == 0) quad += d * d;
      const __m512d e = _mm512_set1_pd(d);
      size_t j = 0;
      for (; j + 8 <= cols; j += 8)
        _mm512_storeu_pd(av + j, _mm512_fmadd_pd(e, load8_t(ai, bi, j, BF), _mm512_loadu_pd(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

/* b, nv and BF are literals in each call, so their tests vanish from the loops. */
__attribute__((target("avx512f"))) static double
chunk32_avx512(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
               const float *x32, const double *xup, const double *x, double *acc, int nv, double quad) {
  if (b) {
    if (nv == 4) return chunk32_avx512_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
    if (nv == 2) return chunk32_avx512_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
    return chunk32_avx512_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
  }
  if (nv == 4) return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
  if (nv == 2) return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
  return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
__attribute__((target("avx512f"))) static double
chunk32_avx512_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                    const float *x32, const double *xup, const double *x, double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 1);
  if (nv == 2) return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 1);
  return chunk32_avx512_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 1);
}


/* ---- the 16 dots of two blocks of 4 f64 rows (spectral.c's rows-side Gram) ---- */

__attribute__((target("avx512f"))) static void dot4x4_avx512(const double *const x[4], const double *const y[4],
                                                            size_t n, double s[4][4]) {
  __m512d acc[4][4];
#pragma GCC unroll 4
  for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) acc[a][b] = _mm512_setzero_pd();
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m512d xv[4], yv[4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
      xv[a] = _mm512_loadu_pd(x[a] + t);
      yv[a] = _mm512_loadu_pd(y[a] + t);
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
      for (int b = 0; b < 4; b++) acc[a][b] = _mm512_fmadd_pd(xv[a], yv[b], acc[a][b]);
  }
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      double r = _mm512_reduce_add_pd(acc[a][b]);
      for (size_t u = t; u < n; u++) r += x[a][u] * y[b][u];
      s[a][b] = r;
    }
}

__attribute__((target("avx2,fma"))) static void dot4x4_avx2(const double *const x[4], const double *const y[4],
                                                           size_t n, double s[4][4]) {
  __m256d acc[4][4];
#pragma GCC unroll 4
  for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) acc[a][b] = _mm256_setzero_pd();
  size_t t = 0;
  for (; t + 4 <= n; t += 4) {
    __m256d xv[4], yv[4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
      xv[a] = _mm256_loadu_pd(x[a] + t);
      yv[a] = _mm256_loadu_pd(y[a] + t);
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
      for (int b = 0; b < 4; b++) acc[a][b] = _mm256_fmadd_pd(xv[a], yv[b], acc[a][b]);
  }
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      double r = hsum4(acc[a][b]);
      for (size_t u = t; u < n; u++) r += x[a][u] * y[b][u];
      s[a][b] = r;
    }
}


/* ---- z_v -= sum_a c[a][v] q_a for four q and up to four z (spectral.c's Gram-Schmidt) ---- */

__attribute__((target("avx512f"))) static void sub4_avx512(const double *const q[4], const double c[4][4],
                                                          double *const z[4], size_t nz, size_t n) {
  __m512d cv[4][4];
  for (int a = 0; a < 4; a++)
    for (size_t v = 0; v < nz; v++) cv[a][v] = _mm512_set1_pd(c[a][v]);
  size_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m512d q0 = _mm512_loadu_pd(q[0] + t), q1 = _mm512_loadu_pd(q[1] + t);
    const __m512d q2 = _mm512_loadu_pd(q[2] + t), q3 = _mm512_loadu_pd(q[3] + t);
    for (size_t v = 0; v < nz; v++) {
      __m512d zv = _mm512_loadu_pd(z[v] + t);
      zv = _mm512_fnmadd_pd(cv[0][v], q0, zv);
      zv = _mm512_fnmadd_pd(cv[1][v], q1, zv);
      zv = _mm512_fnmadd_pd(cv[2][v], q2, zv);
      zv = _mm512_fnmadd_pd(cv[3][v], q3, zv);
      _mm512_storeu_pd(z[v] + t, zv);
    }
  }
  for (; t < n; t++)
    for (size_t v = 0; v < nz; v++)
      z[v][t] = (((z[v][t] - c[0][v] * q[0][t]) - c[1][v] * q[1][t]) - c[2][v] * q[2][t]) - c[3][v] * q[3][t];
}

__attribute__((target("avx2,fma"))) static void sub4_avx2(const double *const q[4], const double c[4][4],
                                                         double *const z[4], size_t nz, size_t n) {
  __m256d cv[4][4];
  for (int a = 0; a < 4; a++)
    for (size_t v = 0; v < nz; v++) cv[a][v] = _mm256_set1_pd(c[a][v]);
  size_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const __m256d q0 = _mm256_loadu_pd(q[0] + t), q1 = _mm256_loadu_pd(q[1] + t);
    const __m256d q2 = _mm256_loadu_pd(q[2] + t), q3 = _mm256_loadu_pd(q[3] + t);
    for (size_t v = 0; v < nz; v++) {
      __m256d zv = _mm256_loadu_pd(z[v] + t);
      zv = _mm256_fnmadd_pd(cv[0][v], q0, zv);
      zv = _mm256_fnmadd_pd(cv[1][v], q1, zv);
      zv = _mm256_fnmadd_pd(cv[2][v], q2, zv);
      zv = _mm256_fnmadd_pd(cv[3][v], q3, zv);
      _mm256_storeu_pd(z[v] + t, zv);
    }
  }
  for (; t < n; t++)
    for (size_t v = 0; v < nz; v++)
      z[v][t] = (((z[v][t] - c[0][v] * q[0][t]) - c[1][v] * q[1][t]) - c[2][v] * q[2][t]) - c[3][v] * q[3][t];
}

#endif /* HAVE_X86_KERNELS */

static void dot4x4_generic(const double *const x[4], const double *const y[4], size_t n,
                           double s[4][4]) {
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      double p[4] = {0.0, 0.0, 0.0, 0.0};
      size_t t = 0;
      for (; t + 4 <= n; t += 4)
        for (int l = 0; l < 4; l++) p[l] += x[a][t + (size_t)l] * y[b][t + (size_t)l];
      double r = (p[0] + p[1]) + (p[2] + p[3]);
      for (; t < n; t++) r += x[a][t] * y[b][t];
      s[a][b] = r;
    }
}

static void sub4_generic(const double *const q[4], const double c[4][4], double *const z[4], size_t nz,
                         size_t n) {
  for (size_t t = 0; t < n; t++)
    for (size_t v = 0; v < nz; v++)
      z[v][t] = (((z[v][t] - c[0][v] * q[0][t]) - c[1][v] * q[1][t]) - c[2][v] * q[2][t]) - c[3][v] * q[3][t];
}

/* ---- dispatch ---- */

typedef void (*sub4_fn)(const double *const q[4], const double c[4][4], double *const z[4], size_t nz, size_t n);
typedef void (*dot4x4_fn)(const double *const x[4], const double *const y[4], size_t n, double s[4][4]);

static const struct kernel {
  const char *name;
  chunk_fn fn;        /* f64 */
  chunk_fn bf16_fn;   /* f64, A in BF16 and no B, read as it is stored; NULL: through the tiles */
  chunk32_fn fn32;    /* f32 runs */
  chunk32_fn bf16_fn32;
  dot4x4_fn dot4x4;   /* f64 */
  sub4_fn sub4;       /* f64 */
} kernels[] = {
#ifdef HAVE_X86_KERNELS
    {"avx512", chunk_avx512, chunk_avx512_bf16, chunk32_avx512, chunk32_avx512_bf16, dot4x4_avx512, sub4_avx512},
    {"avx2", chunk_avx2, chunk_avx2_bf16, chunk32_avx2, chunk32_avx2_bf16, dot4x4_avx2, sub4_avx2},
#endif
    {"generic", chunk_generic, NULL, chunk32_generic, NULL, dot4x4_generic, sub4_generic},
};

static int supported(const struct kernel *k) {
#ifdef HAVE_X86_KERNELS
  if (k->fn == chunk_avx512) return __builtin_cpu_supports("avx512f");
  if (k->fn == chunk_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  (void)k;
  return 1;
}

/* The best kernel this processor runs, or the one named by STAB_KERNEL (for comparisons;
 * a name it cannot run falls back to the best). Chosen once; every thread picks the same. */
static const struct kernel *kernel(void) {
  static const struct kernel *chosen;
  const struct kernel *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
  if (k) return k;
  const size_t n = sizeof kernels / sizeof kernels[0];
  const char *want = getenv("STAB_KERNEL");
  for (size_t i = 0; i < n && !k; i++)
    if (want && strcmp(want, kernels[i].name) == 0 && supported(&kernels[i])) k = &kernels[i];
  for (size_t i = 0; i < n && !k; i++)
    if (supported(&kernels[i])) k = &kernels[i];
  __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
  return k;
}

const char *stab_spectral_kernel(void) { return kernel()->name; }

void stabi_dot4x4(const double *const x[4], const double *const y[4], size_t n, double s[4][4]) {
  kernel()->dot4x4(x, y, n, s);
}

void stabi_sub4(const double *const q[4], const double c[4][4], double *const z[4], size_t nz, size_t n) {
  kernel()->sub4(q, c, z, nz, n);
}

size_t stabi_chunk_count(size_t rows) {
  /* Enough chunks to keep two or more threads busy, few enough that summing them is cheap. */
  size_t c = rows / 64;
  if (c < 1) c = 1;
  if (c > STABI_MAX_CHUNKS) c = STABI_MAX_CHUNKS;
  return c;
}

/* Below this many elements (4 MiB of f32) a pass is too short to be worth waking other
 * threads: waking a sleeping worker (a futex wake, a context switch) takes tens of
 * microseconds, about a whole pass of 2^18 elements, and the worker would find few chunks
 * left. (With OpenMP's barrier at the end of every parallel pass this rule also kept the
 * demo's 39 layers of 256..1024 wide from waiting on descheduled threads: 2040 ms with two
 * threads under a load of 2.5, against 77 ms on one; the pool never waits for a thread that
 * has not started, so the rule is now only about cost.) */
#define PARALLEL_MIN_ELEMENTS ((size_t)1 << 20)

/* One chunk of rows [r0, r1), in f64 or in f32 runs (x32: x as f32, NULL for f64). F32 rows
 * are read where they are; 16-bit rows (or a mix: a BF16 matrix against an F32 one) are
 * converted tile by tile into this thread's tile pair. */
static double chunk(const struct kernel *kn, const stabi_src *m, size_t r0, size_t r1, size_t cols,
                    const double *x, const float *x32, const double *xup, double *acc, int nv,
                    float *tile) {
  memset(acc, 0, (size_t)nv * cols * sizeof *acc);
  const int direct_bf16 = m->at == STAB_DTYPE_BF16 && !m->b && kn->bf16_fn;
  if (stabi_src_is_f32(m) || direct_bf16) {
    const float *a = m->a, *b = m->b;
    if (x32)
      return (direct_bf16 ? kn->bf16_fn32 : kn->fn32)(a, b, r0, r1, cols, m->ld, x32, xup, x, acc, nv, 0.0);
    return (direct_bf16 ? kn->bf16_fn : kn->fn)(a, b, r0, r1, cols, m->ld, x, acc, nv, 0.0);
  }
  const size_t step = stabi_tile_rows(cols);
  float *ta = tile, *tb = m->b ? tile + step * cols : NULL;
  double quad = 0.0;
  for (size_t i = r0; i < r1; i += step) {
    size_t k = r1 - i < step ? r1 - i : step;
    stabi_tile_f32(m->a, m->at, m->ld, i, k, cols, ta);
    if (tb) stabi_tile_f32(m->b, m->bt, m->ld, i, k, cols, tb);
    quad = x32 ? kn->fn32(ta, tb, 0, k, cols, cols, x32, xup, x, acc, nv, quad)
               : kn->fn(ta, tb, 0, k, cols, cols, x, acc, nv, quad);
  }
  return quad;
}

/* One pass's chunks as pool tasks: task k is chunk k, into its own accumulator. */
typedef struct {
  const struct kernel *kn;
  const stabi_src *m;
  size_t rows, cols, nchunks, span;
  const double *x;
  const float *x32;   /* x rounded to f32 (scaled by xup), NULL for an f64 pass */
  const double *xup;
  double *acc0, *quad;
  const stabi_tiles *tiles;
  int nv;
} pass_job;

static void pass_task(void *arg, size_t k, int slot) {
  const pass_job *j = arg;
  const size_t r0 = k * j->rows / j->nchunks, r1 = (k + 1) * j->rows / j->nchunks;
  /* 16-bit rows go through the tile pair of this thread's slot */
  float *tile = stabi_src_is_f32(j->m) ? NULL : j->tiles->buf + (size_t)slot * 2 * j->tiles->floats;
  j->quad[k] = chunk(j->kn, j->m, r0, r1, j->cols, j->x, j->x32, j->xup, j->acc0 + k * j->span, j->nv, tile);
}

double stabi_gram_apply(const stabi_src *m, size_t rows, size_t cols, const double *x, double *y,
                        double *partial, const stabi_tiles *tiles, int threads, int nv, int f64) {
  const size_t nchunks = stabi_chunk_count(rows), span = (size_t)nv * cols;
  const struct kernel *kn = kernel();
  /* x / xup rounded to f32 once, where the pass writes only at its end: in y while the
   * chunks accumulate into partial, in partial while the single chunk accumulates into y. */
  float *x32 = NULL;
  double xup[4] = {1.0, 1.0, 1.0, 1.0};
  if (!f64) {
    x32 = (float *)(void *)(nchunks == 1 ? partial : y);
    for (int v = 0; v < nv; v++) {
      const double *xv = x + (size_t)v * cols;
      double mx = 0.0;
      for (size_t j = 0; j < cols; j++) mx = fmax(mx, fabs(xv[j]));
      xup[v] = pow2_above(mx);
      for (size_t j = 0; j < cols; j++) x32[(size_t)v * cols + j] = (float)(xv[j] / xup[v]);
    }
  }
  const int tiled = !stabi_src_is_f32(m);
  double quad[STABI_MAX_CHUNKS];
  int nt = stabi_pool_threads(threads);
  if (rows * cols < PARALLEL_MIN_ELEMENTS || nchunks == 1) nt = 1;
  if (tiled && nt > tiles->slots) nt = tiles->slots; /* one tile pair per thread */
  /* With a single chunk it accumulates straight into y. */
  pass_job job = {kn, m, rows, cols, nchunks, span, x, x32, xup, nchunks == 1 ? y : partial, quad, tiles, nv};
  stabi_pool_run(nchunks, nt, pass_task, &job);
  double total = 0.0;
  for (size_t k = 0; k < nchunks; k++) total += quad[k];
  if (nchunks > 1) {
    for (size_t j = 0; j < span; j++) {
      double s = partial[j];
      for (size_t k = 1; k < nchunks; k++) s += partial[k * span + j];
      y[j] = s;
    }
  }
  /* Past f32's range (elements above about 1e37, sums above 3e38) a pass in f32 runs can
   * overflow where f64 would not: such a pass is made again in f64, which also tells a
   * matrix holding NaN or Inf (non-finite either way) from one that is merely large. */
  if (!f64) {
    int finite = isfinite(total);
    for (size_t j = 0; j < span && finite; j++) finite = isfinite(y[j]);
    if (!finite) return stabi_gram_apply(m, rows, cols, x, y, partial, tiles, threads, nv, 1);
  }
  return total;
}
