/* gram_kernels.h — what every build of the pass kernels shares (the portable one in
 * gram_pass.c, the SIMD ones generated from gram_simd.h in gram_avx2.c and gram_avx512.c):
 * the length of the f32 runs, the power-of-two scaling that keeps f32 in range, and the
 * reading of one stored element. Private to those files. */
#ifndef STABMETER_GRAM_KERNELS_H
#define STABMETER_GRAM_KERNELS_H

#include "engine/engine.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86_KERNELS 1
/* The SIMD builds (gram_avx2.c, gram_avx512.c): used only where the processor has them. */
extern const stabi_gram_kernel stabi_gram_avx2;
extern const stabi_gram_kernel stabi_gram_avx512;
#endif

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
 * vector (xup) and the dots of a block per vector (block_scale, run_scale) by powers of two,
 * which are exact, so that the f32 numbers are at most 1 in magnitude. A power of two 2^e with
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

/* ---- one stored element ---- */

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

#endif /* STABMETER_GRAM_KERNELS_H */
