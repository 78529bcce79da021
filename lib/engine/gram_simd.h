/* gram_simd.h — the SIMD pass kernels, written once for any vector width: not a header of
 * declarations but a body of code that gram_avx2.c (4 doubles, 8 floats a vector) and
 * gram_avx512.c (8 and 16) each include once, after defining the vector operations below.
 *
 * Why one body included twice: the AVX2 and AVX-512 kernels are the same code but for the
 * vector width, the intrinsics' names and how many sums fit in the registers (16 ymm, 32 zmm);
 * written out twice, every change had to be made twice, bit for bit. A function-like macro
 * per kernel would hide the code from the compiler's messages and the debugger; here every
 * kernel is ordinary C whose names (simd_chunk, simd_chunk32, ...) can be grepped, and each
 * build is its own translation unit, so the same static names serve both. The builds differ
 * only in what their file defines.
 *
 * What the including file defines (the functions SIMD_INLINE, each one instruction or a few
 * inside the loops):
 *   SIMD_INLINE, SIMD_FN      attributes of the helpers (always inlined) and of the kernels:
 *                             the instruction set, by target(...)
 *   vd, vf, VD_LANES, VF_LANES  a vector of doubles and one of floats, and their lanes;
 *                             VF_LANES = 2 VD_LANES
 *   vd_zero vd_loadu vd_storeu vd_set1 vd_add vd_fmadd vd_fnmadd
 *   vf_zero vf_loadu vf_set1 vf_fmadd      the intrinsics of that width
 *   vd_sum(v)                 the lanes of v summed, in a fixed order
 *   vf_widen_lo/hi(v)         the low / high half of v's lanes as a vd
 *   load_vd(a, b, j, bf)      VD_LANES elements of row a (minus row b when b is not NULL; bf:
 *                             a is BF16 and b NULL) from column j, as doubles
 *   load_vf(a, b, j, bf)      VF_LANES of them as floats
 *   dot_rows(nv)              rows swept at once by the f32 kernel's dots (nv x that many sums
 *                             in registers)
 *   acc_tiles(nv)             vectors of columns a tile of the f32 accumulation spans (nv x
 *                             that many sums in registers)
 *   vf_reg(v)                 v, kept in a register: an element loaded once for several FMAs
 *                             (GCC otherwise folds the load into each FMA, and the loads, not
 *                             the FMAs, bound the loop)
 * The loops over the rows of a block and the nv vectors are unrolled by pragma: left as loops,
 * GCC -O2 keeps their vector arrays on the stack. Blocks of 8 rows instead of 4 took a pass
 * over 4096^2 from 33 to 44 GB/s: x and the accumulator are loaded and stored half as often. */

/* ---- the lanes of a float vector, widened ---- */

/* the f32 lanes of t widened, times up (a power of two: exact), added into acc[0..VF_LANES) */
SIMD_INLINE void vf_add_into(double *acc, vf t, double up) {
  const vd u = vd_set1(up);
  vd_storeu(acc, vd_fmadd(vf_widen_lo(t), u, vd_loadu(acc)));
  vd_storeu(acc + VD_LANES, vd_fmadd(vf_widen_hi(t), u, vd_loadu(acc + VD_LANES)));
}

/* the lanes of s widened to f64 and summed, in a fixed order */
SIMD_INLINE double vf_sum(vf s) { return vd_sum(vd_add(vf_widen_lo(s), vf_widen_hi(s))); }

/* ---- f64: every element converted to f64, every product and sum in f64 ---- */

/* Blocks of 8 rows: x and acc are loaded once per 8 rows. With 32 zmm registers the sums of 8
 * rows for two vectors fit; in 16 ymm registers they do not, and blocks of 8 are still faster
 * than blocks of 4 (4096^2, two vectors: 3.0 against 3.6 ms a pass). */
SIMD_INLINE double simd_chunk_body(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                                   size_t ld, const double *x, double *acc, const int nv, double quad,
                                   const int BF) {
  enum { R = 8 };
  const size_t cv = cols & ~(size_t)(VD_LANES - 1);
  size_t i = r0;
  for (; i + R <= r1; i += R) {
    const float *A[R], *B[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      A[r] = row_at(a, i + (size_t)r, ld, BF);
      B[r] = b ? b + (i + (size_t)r) * ld : NULL;
    }
    vd s[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) s[v][r] = vd_zero();
    size_t j = 0;
    for (; j < cv; j += VD_LANES) {
      vd xv[2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) xv[v] = vd_loadu(x + (size_t)v * cols + j);
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        vd w = load_vd(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) s[v][r] = vd_fmadd(w, xv[v], s[v][r]);
      }
    }
    double d[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        d[v][r] = vd_sum(s[v][r]);
        for (size_t t = j; t < cols; t++) d[v][r] += elem_t(A[r], B[r], t, BF) * x[(size_t)v * cols + t];
      }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) quad += d[0][r] * d[0][r];
    vd e[2][R];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) e[v][r] = vd_set1(d[v][r]);
    for (j = 0; j < cv; j += VD_LANES) {
      vd t[2][2];
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) t[v][0] = t[v][1] = vd_zero();
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        vd w = load_vd(A[r], B[r], j, BF);
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) t[v][r & 1] = vd_fmadd(e[v][r], w, t[v][r & 1]);
      }
#pragma GCC unroll 2
      for (int v = 0; v < nv; v++) {
        double *av = acc + (size_t)v * cols + j;
        vd_storeu(av, vd_add(vd_loadu(av), vd_add(t[v][0], t[v][1])));
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
      vd s = vd_zero();
      size_t j = 0;
      for (; j < cv; j += VD_LANES) s = vd_fmadd(load_vd(ai, bi, j, BF), vd_loadu(xv + j), s);
      double d = vd_sum(s);
      for (; j < cols; j++) d += elem_t(ai, bi, j, BF) * xv[j];
      if (v == 0) quad += d * d;
      const vd e = vd_set1(d);
      for (j = 0; j < cv; j += VD_LANES)
        vd_storeu(av + j, vd_fmadd(e, load_vd(ai, bi, j, BF), vd_loadu(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

/* b and nv are literals in each call, so their tests vanish from the loops; four vectors are
 * two passes of two over rows then in cache. */
SIMD_FN double simd_chunk(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                          const double *x, double *acc, int nv, double quad) {
  if (nv == 4) {
    double q = simd_chunk(a, b, r0, r1, cols, ld, x, acc, 2, quad);
    simd_chunk(a, b, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  if (nv == 2)
    return b ? simd_chunk_body(a, b, r0, r1, cols, ld, x, acc, 2, quad, 0)
             : simd_chunk_body(a, NULL, r0, r1, cols, ld, x, acc, 2, quad, 0);
  return b ? simd_chunk_body(a, b, r0, r1, cols, ld, x, acc, 1, quad, 0)
           : simd_chunk_body(a, NULL, r0, r1, cols, ld, x, acc, 1, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
SIMD_FN double simd_chunk_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                               const double *x, double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) {
    double q = simd_chunk_bf16(a, NULL, r0, r1, cols, ld, x, acc, 2, quad);
    simd_chunk_bf16(a, NULL, r0, r1, cols, ld, x + 2 * cols, acc + 2 * cols, 2, 0.0);
    return q;
  }
  return nv == 2 ? simd_chunk_body(a, NULL, r0, r1, cols, ld, x, acc, 2, quad, 1)
                 : simd_chunk_body(a, NULL, r0, r1, cols, ld, x, acc, 1, quad, 1);
}

/* ---- f32 runs ----
 * Runs of up to STABI_RUN_ROWS rows (whole 8-row blocks), each in two sweeps over its rows:
 *   1. the dots of all the run's rows, swept over the columns dot_rows(nv) rows at a time so
 *      that the nv x dot_rows sums stay in registers (x read from L1 once a sweep, W once from
 *      memory). At each dot run's end each sum's lanes are widened and summed in f64 (a
 *      transposed reduction, VD_LANES sums at once, measured no faster: these sums are few).
 *   2. the accumulation, by tiles of acc_tiles(nv) x VF_LANES columns: each tile's nv x
 *      acc_tiles sums stay in registers over all the run's rows (now in L2, walked with one
 *      pointer a row), and are added into the f64 accumulator once a tile. While a run
 *      accumulates from L2, the next run's rows are prefetched into L2, a line for each line
 *      the tile reads, so that memory keeps streaming while the arithmetic runs.
 * The run, fixed by the chunk's first row, is a run of the accumulation's f32 sums
 * (STABI_RUN_ROWS terms, within the 256 of docs/manual/metrics.md). */

/* the next row of a (stride ld elements, f32 or bf16) */
SIMD_INLINE const float *row_next(const float *p, size_t ld, int bf) {
  return (const float *)(const void *)((const unsigned char *)(const void *)p + (bf ? 2 : 4) * ld);
}

/* The dots of rows A[0..RS) (minus B's) with the nv vectors of x32 over columns [j0, j1): one
 * run of each lane; the lanes' sums widened, summed in f64, scaled by xup and added into
 * d[v][q + r]. */
SIMD_INLINE void dots_run(const float *const *A, const float *const *B, size_t j0, size_t j1, size_t cols,
                          const float *x32, const double *xup, double d[4][STABI_RUN_ROWS], int q,
                          const int nv, const int RS, const int BF) {
  enum { L = VF_LANES };
  vf s[4][8];
#pragma GCC unroll 4
  for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
    for (int r = 0; r < RS; r++) s[v][r] = vf_zero();
  for (size_t j = j0; j < j1; j += L) {
    vf xv[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) xv[v] = vf_loadu(x32 + (size_t)v * cols + j);
#pragma GCC unroll 8
    for (int r = 0; r < RS; r++) {
      const vf w = vf_reg(load_vf(A[r], B ? B[r] : NULL, j, BF));
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) s[v][r] = vf_fmadd(w, xv[v], s[v][r]);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < nv; v++)
#pragma GCC unroll 8
    for (int r = 0; r < RS; r++) d[v][q + r] += vf_sum(s[v][r]) * xup[v];
}

/* The accumulation of one tile: columns [j, j + T L) of the SR rows from a (b), scaled by
 * e[v][r], summed in f32 and added into acc once (times up[v]); the lines of the same columns
 * of the npre rows from pa (pb) on their way to L2. */
SIMD_INLINE void acc_tile(const float *ar, const float *br, const float *pa, const float *pb, int npre, size_t j,
                          size_t ld, int SR, float e[4][STABI_RUN_ROWS], const double *up, double *acc,
                          size_t cols, const int nv, const int T, const int BF) {
  enum { L = VF_LANES };
  vf s[4][16];
#pragma GCC unroll 4
  for (int v = 0; v < nv; v++)
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) s[v][t] = vf_zero();
  for (int r = 0; r < SR; r++) {
    if (r < npre) {
      const char *p = (const char *)(const void *)pa + (BF ? 2 : 4) * j;
      const int la = T * L * (BF ? 2 : 4) / 64; /* lines of the tile in a row */
#pragma GCC unroll 16
      for (int k = 0; k < la; k++) _mm_prefetch(p + 64 * k, _MM_HINT_T1);
      if (pb) {
        const char *q = (const char *)(const void *)(pb + j);
#pragma GCC unroll 16
        for (int k = 0; k < T * L * 4 / 64; k++) _mm_prefetch(q + 64 * k, _MM_HINT_T1);
        pb += ld;
      }
      pa = row_next(pa, ld, BF);
    }
    vf ev[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) ev[v] = vf_set1(e[v][r]);
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
      const vf w = vf_reg(load_vf(ar, br, j + (size_t)(t * L), BF));
#pragma GCC unroll 4
      for (int v = 0; v < nv; v++) s[v][t] = vf_fmadd(ev[v], w, s[v][t]);
    }
    ar = row_next(ar, ld, BF);
    if (br) br += ld;
  }
#pragma GCC unroll 4
  for (int v = 0; v < nv; v++)
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) vf_add_into(acc + (size_t)v * cols + j + (size_t)(t * L), s[v][t], up[v]);
}

SIMD_INLINE double simd_chunk32_body(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                                     size_t ld, const float *x32, const double *xup, const double *x,
                                     double *acc, const int nv, double quad, const int BF) {
  enum { R = 8, L = VF_LANES, S = STABI_RUN_ROWS };
  const int RS = dot_rows(nv);
  const int T = acc_tiles(nv); /* nv x T independent sums: enough to hide the FMA latency */
  const size_t cf = cols & ~(size_t)(L - 1), run = (size_t)RUN_TERMS * L;
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
    for (size_t j0 = 0; j0 < cf; j0 += run) {
      const size_t j1 = cf - j0 < run ? cf : j0 + run;
      for (int q = 0; q < SR; q += RS) {
        const float *A[8], *B[8];
#pragma GCC unroll 8
        for (int r = 0; r < RS; r++) {
          A[r] = row_at(a, i + (size_t)(q + r), ld, BF);
          B[r] = b ? b + (i + (size_t)(q + r)) * ld : NULL;
        }
        dots_run(A, b ? B : NULL, j0, j1, cols, x32, xup, d, q, nv, RS, BF);
      }
    }
    for (int r = 0; r < SR; r++) {
      const float *ar = row_at(a, i + (size_t)r, ld, BF), *br = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = cf; t < cols; t++)
        for (int v = 0; v < nv; v++) d[v][r] += elem_t(ar, br, t, BF) * x[(size_t)v * cols + t];
    }
    float e[4][S];
    double up[4];
    run_scale(d, nv, SR, e, up);
    for (int r = 0; r < SR; r++) quad += d[0][r] * d[0][r];
    /* the next run's rows, prefetched while this one accumulates */
    const size_t inext = i + (size_t)SR;
    const int npre = inext >= r1 ? 0 : r1 - inext < (size_t)S ? (int)(r1 - inext) : S;
    const float *ar = row_at(a, i, ld, BF), *br = b ? b + i * ld : NULL;
    const float *pa = row_at(a, inext, ld, BF), *pb = b ? b + inext * ld : NULL;
    size_t j = 0;
    for (; j + (size_t)(T * L) <= cf; j += (size_t)(T * L))
      acc_tile(ar, br, pa, pb, npre, j, ld, SR, e, up, acc, cols, nv, T, BF);
    for (; j < cf; j += L)
      acc_tile(ar, br, pa, pb, 0, j, ld, SR, e, up, acc, cols, nv, 1, BF);
    for (int r = 0; r < SR; r++) {
      const float *rr = row_at(a, i + (size_t)r, ld, BF), *rb = b ? b + (i + (size_t)r) * ld : NULL;
      for (size_t t = cf; t < cols; t++)
        for (int v = 0; v < nv; v++) acc[(size_t)v * cols + t] += d[v][r] * elem_t(rr, rb, t, BF);
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
      for (size_t j0 = 0; j0 < cf; j0 += run) {
        const size_t j1 = cf - j0 < run ? cf : j0 + run;
        vf s = vf_zero();
        for (size_t j = j0; j < j1; j += L) s = vf_fmadd(load_vf(ai, bi, j, BF), vf_loadu(xv + j), s);
        d += vf_sum(s) * xup[v];
      }
      for (size_t j = cf; j < cols; j++) d += elem_t(ai, bi, j, BF) * x[(size_t)v * cols + j];
      if (v == 0) quad += d * d;
      const vd e = vd_set1(d);
      size_t j = 0;
      for (; j + VD_LANES <= cols; j += VD_LANES)
        vd_storeu(av + j, vd_fmadd(e, load_vd(ai, bi, j, BF), vd_loadu(av + j)));
      for (; j < cols; j++) av[j] += d * elem_t(ai, bi, j, BF);
    }
  }
  return quad;
}

/* b, nv and BF are literals in each call, so their tests vanish from the loops. */
SIMD_FN double simd_chunk32(const float *a, const float *b, size_t r0, size_t r1, size_t cols, size_t ld,
                            const float *x32, const double *xup, const double *x, double *acc, int nv,
                            double quad) {
  if (b) {
    if (nv == 4) return simd_chunk32_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
    if (nv == 2) return simd_chunk32_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
    return simd_chunk32_body(a, b, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
  }
  if (nv == 4) return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 0);
  if (nv == 2) return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 0);
  return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 0);
}

/* A stored as BF16, no B (b is ignored). */
SIMD_FN double simd_chunk32_bf16(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                                 size_t ld, const float *x32, const double *xup, const double *x,
                                 double *acc, int nv, double quad) {
  (void)b;
  if (nv == 4) return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 4, quad, 1);
  if (nv == 2) return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 2, quad, 1);
  return simd_chunk32_body(a, NULL, r0, r1, cols, ld, x32, xup, x, acc, 1, quad, 1);
}

/* ---- the 16 dots of two blocks of 4 f64 rows (spectral.c's rows-side Gram) ---- */

SIMD_FN void simd_dot4x4(const double *const x[4], const double *const y[4], size_t n, double s[4][4]) {
  vd acc[4][4];
#pragma GCC unroll 4
  for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
    for (int b = 0; b < 4; b++) acc[a][b] = vd_zero();
  size_t t = 0;
  for (; t + VD_LANES <= n; t += VD_LANES) {
    vd xv[4], yv[4];
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++) {
      xv[a] = vd_loadu(x[a] + t);
      yv[a] = vd_loadu(y[a] + t);
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; a++)
#pragma GCC unroll 4
      for (int b = 0; b < 4; b++) acc[a][b] = vd_fmadd(xv[a], yv[b], acc[a][b]);
  }
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      double r = vd_sum(acc[a][b]);
      for (size_t u = t; u < n; u++) r += x[a][u] * y[b][u];
      s[a][b] = r;
    }
}

/* ---- z_v -= sum_a c[a][v] q_a for four q and up to four z (spectral.c's Gram-Schmidt) ---- */

SIMD_FN void simd_sub4(const double *const q[4], const double c[4][4], double *const z[4], size_t nz,
                       size_t n) {
  vd cv[4][4];
  for (int a = 0; a < 4; a++)
    for (size_t v = 0; v < nz; v++) cv[a][v] = vd_set1(c[a][v]);
  size_t t = 0;
  for (; t + VD_LANES <= n; t += VD_LANES) {
    const vd q0 = vd_loadu(q[0] + t), q1 = vd_loadu(q[1] + t);
    const vd q2 = vd_loadu(q[2] + t), q3 = vd_loadu(q[3] + t);
    for (size_t v = 0; v < nz; v++) {
      vd zv = vd_loadu(z[v] + t);
      zv = vd_fnmadd(cv[0][v], q0, zv);
      zv = vd_fnmadd(cv[1][v], q1, zv);
      zv = vd_fnmadd(cv[2][v], q2, zv);
      zv = vd_fnmadd(cv[3][v], q3, zv);
      vd_storeu(z[v] + t, zv);
    }
  }
  for (; t < n; t++)
    for (size_t v = 0; v < nz; v++)
      z[v][t] = (((z[v][t] - c[0][v] * q[0][t]) - c[1][v] * q[1][t]) - c[2][v] * q[2][t]) - c[3][v] * q[3][t];
}
