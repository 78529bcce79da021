/* gram_pass.c — y = W^T (W x), for one, two or four vectors x, in a single pass over W: the
 * work of every spectral iteration. Reading W from memory is the cost, so each block of rows is
 * used twice while it is in cache (the rows' dots with x, then the rows scaled by those dots
 * added into y), instead of two BLAS gemv calls that would each stream all of W.
 *
 * Storage f32 (the SIMD builds also read BF16 directly; other 16-bit matrices, and BF16 with a
 * B, arrive as f32 tiles of whole 8-row blocks). Two arithmetics, each in three builds picked at
 * run time (AVX-512 in gram_avx512.c, AVX2+FMA in gram_avx2.c, both generated from gram_simd.h,
 * and portable C here):
 *   - f32 runs (the default): products and partial sums in f32 over short runs, each run added
 *     into f64 (gram_kernels.h: "f32 runs"). In f64 the loop was bound by the f32 -> f64
 *     conversions (two per element): 21 GB/s for two vectors where the memory gives 45-49.
 *   - f64 (the precise path, for tolerances below STAB_SPECTRAL_F32_TOL_MIN): every element
 *     converted to f64, every product and sum in f64.
 * Rows are split into chunks fixed by the shape alone; each chunk accumulates into its own
 * f64 vector and the chunks are summed in order, so on one machine the result is
 * bit-identical for any number of threads. This file holds the portable kernels, the choice of
 * a build, and the pass that splits the rows into chunks. */
#include "engine/gram_kernels.h"

#include <stdlib.h>
#include <string.h>

/* ---- portable C ----
 * The chunk kernels' contract is stabi_chunk_fn's (engine.h). */

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
    double d[4][STABI_RUN_ROWS]; /* a block is a run of the accumulation */
    float e[4][STABI_RUN_ROWS];
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
    run_scale(d, nv, R, e, up);
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

/* ---- the choice of a build ---- */

static const stabi_gram_kernel generic = {"generic", chunk_generic, NULL, chunk32_generic, NULL,
                                          dot4x4_generic, sub4_generic};

/* best first */
static const stabi_gram_kernel *const kernels[] = {
#ifdef HAVE_X86_KERNELS
    &stabi_gram_avx512,
    &stabi_gram_avx2,
#endif
    &generic,
};

static int supported(const stabi_gram_kernel *k) {
#ifdef HAVE_X86_KERNELS
  if (k == &stabi_gram_avx512) return __builtin_cpu_supports("avx512f");
  if (k == &stabi_gram_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  (void)k;
  return 1;
}

const stabi_gram_kernel *stabi_gram_kernel_chosen(void) {
  static const stabi_gram_kernel *chosen;
  const stabi_gram_kernel *k = __atomic_load_n(&chosen, __ATOMIC_ACQUIRE);
  if (k) return k;
  const size_t n = sizeof kernels / sizeof kernels[0];
  const char *want = getenv("STAB_KERNEL");
  for (size_t i = 0; i < n && !k; i++)
    if (want && strcmp(want, kernels[i]->name) == 0 && supported(kernels[i])) k = kernels[i];
  for (size_t i = 0; i < n && !k; i++)
    if (supported(kernels[i])) k = kernels[i];
  __atomic_store_n(&chosen, k, __ATOMIC_RELEASE);
  return k;
}

const char *stab_spectral_kernel(void) { return stabi_gram_kernel_chosen()->name; }

void stabi_dot4x4(const double *const x[4], const double *const y[4], size_t n, double s[4][4]) {
  stabi_gram_kernel_chosen()->dot4x4(x, y, n, s);
}

void stabi_sub4(const double *const q[4], const double c[4][4], double *const z[4], size_t nz, size_t n) {
  stabi_gram_kernel_chosen()->sub4(q, c, z, nz, n);
}

/* Below this many elements (4 MiB of f32) a pass is too short to be worth waking other
 * threads: waking a sleeping worker (a futex wake, a context switch) takes tens of
 * microseconds, about a whole pass of 2^18 elements, and the worker would find few chunks
 * left. (With OpenMP's barrier at the end of every parallel pass this rule also kept the
 * demo's 39 layers of 256..1024 wide from waiting on descheduled threads: 2040 ms with two
 * threads under a load of 2.5, against 77 ms on one; the pool never waits for a thread that
 * has not started, so the rule is now only about cost.) */
#define PARALLEL_MIN_ELEMENTS ((size_t)1 << 20)

size_t stabi_chunk_count(size_t rows, size_t cols) {
  /* A matrix that one thread passes over alone is one chunk: each chunk's accumulator is
   * zeroed, written and summed into y, nv x cols doubles a chunk, which on the monitor's
   * 256 x 1024 layers (4 chunks of 64 rows) made a step about 8% slower. */
  if (rows * cols < PARALLEL_MIN_ELEMENTS) return 1;
  /* Enough chunks to keep two or more threads busy, few enough that summing them is cheap. */
  size_t c = rows / 64;
  if (c < 1) c = 1;
  if (c > STABI_MAX_CHUNKS) c = STABI_MAX_CHUNKS;
  return c;
}

/* One chunk of rows [r0, r1), in f64 or in f32 runs (x32: x as f32, NULL for f64). F32 rows
 * are read where they are; 16-bit rows (or a mix: a BF16 matrix against an F32 one) are
 * converted tile by tile into this thread's tile pair. */
static double chunk(const stabi_gram_kernel *kn, const stabi_src *m, size_t r0, size_t r1, size_t cols,
                    const double *x, const float *x32, const double *xup, double *acc, int nv,
                    float *tile) {
  memset(acc, 0, (size_t)nv * cols * sizeof *acc);
  const int direct_bf16 = m->at == STAB_DTYPE_BF16 && !m->b && kn->chunk_bf16;
  if (stabi_src_is_f32(m) || direct_bf16) {
    const float *a = m->a, *b = m->b;
    if (x32)
      return (direct_bf16 ? kn->chunk32_bf16 : kn->chunk32)(a, b, r0, r1, cols, m->ld, x32, xup, x, acc, nv, 0.0);
    return (direct_bf16 ? kn->chunk_bf16 : kn->chunk)(a, b, r0, r1, cols, m->ld, x, acc, nv, 0.0);
  }
  const size_t step = stabi_tile_rows(cols);
  float *ta = tile, *tb = m->b ? tile + step * cols : NULL;
  double quad = 0.0;
  for (size_t i = r0; i < r1; i += step) {
    size_t k = r1 - i < step ? r1 - i : step;
    stabi_tile_f32(m->a, m->at, m->ld, i, k, cols, ta);
    if (tb) stabi_tile_f32(m->b, m->bt, m->ld, i, k, cols, tb);
    quad = x32 ? kn->chunk32(ta, tb, 0, k, cols, cols, x32, xup, x, acc, nv, quad)
               : kn->chunk(ta, tb, 0, k, cols, cols, x, acc, nv, quad);
  }
  return quad;
}

/* One pass's chunks as pool tasks: task k is chunk k, into its own accumulator. */
typedef struct {
  const stabi_gram_kernel *kn;
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

/* y[j] += p[j]: the chunks' accumulators summed in chunk order (asked to vectorise: -O2's cheap
 * vectoriser leaves a loop of unknown count scalar) */
static void add_into(double *restrict y, const double *restrict p, size_t n) {
#pragma omp simd
  for (size_t j = 0; j < n; j++) y[j] += p[j];
}

double stabi_gram_apply(const stabi_src *m, size_t rows, size_t cols, const double *x, double *y,
                        double *partial, const stabi_tiles *tiles, int threads, int nv, int f64) {
  const size_t nchunks = stabi_chunk_count(rows, cols), span = (size_t)nv * cols;
  const stabi_gram_kernel *kn = stabi_gram_kernel_chosen();
  /* x / xup rounded to f32 once, where the pass writes only at its end: in y while the
   * chunks accumulate into partial, in partial while the single chunk accumulates into y. */
  float *x32 = NULL;
  double xup[4] = {1.0, 1.0, 1.0, 1.0};
  if (!f64) {
    x32 = (float *)(void *)(nchunks == 1 ? partial : y);
    for (int v = 0; v < nv; v++) {
      const double *xv = x + (size_t)v * cols;
      double mx = 0.0; /* not fmax: a libm call per element, 1% of a monitor step */
      for (size_t j = 0; j < cols; j++) {
        const double a = fabs(xv[j]);
        mx = a > mx ? a : mx; /* NaN left out, as fmax leaves it */
      }
      const int e = pow2_exponent(mx);
      const double down = pow2(-e); /* 2^-e, normal: the product is the quotient, bit for bit */
      xup[v] = pow2(e);
      float *const xs = x32 + (size_t)v * cols;
#pragma omp simd
      for (size_t j = 0; j < cols; j++) xs[j] = (float)(xv[j] * down);
    }
  }
  const int tiled = !stabi_src_is_f32(m);
  double quad[STABI_MAX_CHUNKS];
  int nt = stabi_pool_threads(threads);
  if (nchunks == 1) nt = 1;
  if (tiled && nt > tiles->slots) nt = tiles->slots; /* one tile pair per thread */
  /* With a single chunk it accumulates straight into y. */
  pass_job job = {kn, m, rows, cols, nchunks, span, x, x32, xup, nchunks == 1 ? y : partial, quad, tiles, nv};
  stabi_pool_run(nchunks, nt, pass_task, &job);
  double total = 0.0;
  for (size_t k = 0; k < nchunks; k++) total += quad[k];
  if (nchunks > 1) { /* y_j = ((p0_j + p1_j) + p2_j) + ..., chunk by chunk: contiguous, vectorised */
    memcpy(y, partial, span * sizeof *y);
    for (size_t k = 1; k < nchunks; k++) add_into(y, partial + k * span, span);
  }
  /* Past f32's range (elements above about 1e37, sums above 3e38) a pass in f32 runs can
   * overflow where f64 would not: such a pass is made again in f64, which also tells a
   * matrix holding NaN or Inf (non-finite either way) from one that is merely large. */
  if (!f64) {
    double bad = total * 0.0; /* NaN if any is NaN or infinite, else 0: a loop that vectorises */
#pragma omp simd reduction(+ : bad)
    for (size_t j = 0; j < span; j++) bad += y[j] * 0.0;
    if (bad != 0.0) return stabi_gram_apply(m, rows, cols, x, y, partial, tiles, threads, nv, 1);
  }
  return total;
}
