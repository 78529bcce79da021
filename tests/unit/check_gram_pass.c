/* check_gram_pass.c — the pass y = W^T (W x) of lib/engine/gram_pass.c (built into this program: its
 * functions are internal) against a brute-force long double product, for 1, 2 and 4 vectors,
 * F32 (A and A - B), BF16 read as stored and F16 through the tiles, on ragged shapes: the
 * f32-run kernels within the error bound their run lengths give (and not absurdly below it),
 * the f64 kernels within f64 rounding; and bit-identical results for 1, 2 and 3 threads.
 * tests/programs/kernels.sh runs it again under each STAB_KERNEL. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

/* Deterministic numbers: splitmix64, uniform in [lo, lo + 1). */
static double uniform(uint64_t *s, double lo) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (double)(z >> 11) * 0x1.0p-53;
}

static void *xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  ck_assert_msg(p != NULL, "out of memory for %zu bytes", n);
  return p;
}

/* A matrix as the pass reads it (src), and the numbers it stands for. */
typedef struct {
  stabi_src src;
  double *r;       /* rows x cols: r_ij = a_ij - b_ij, exact in f64 */
  void *store_a, *store_b;
} test_matrix;

/* dtype F32 (with_b: A - B), BF16 (high halves of f32 numbers) or F16 (normal half floats);
 * lo: the numbers' range [lo, lo + 1) before any scaling. */
static test_matrix make_matrix(size_t rows, size_t cols, stab_dtype dtype, int with_b, double lo,
                               uint64_t seed) {
  test_matrix m = {0};
  const size_t n = rows * cols;
  m.r = xmalloc(n * sizeof *m.r);
  if (dtype == STAB_DTYPE_F32) {
    float *a = xmalloc(n * sizeof *a), *b = with_b ? xmalloc(n * sizeof *b) : NULL;
    for (size_t i = 0; i < n; i++) {
      a[i] = (float)uniform(&seed, lo);
      if (b) b[i] = (float)(a[i] + 0.25 * uniform(&seed, -0.5)); /* an update of W */
      m.r[i] = b ? (double)a[i] - (double)b[i] : a[i];
    }
    m.store_a = a, m.store_b = b;
    m.src = (stabi_src){a, b, STAB_DTYPE_F32, STAB_DTYPE_F32, cols};
    return m;
  }
  uint16_t *h = xmalloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++) {
    if (dtype == STAB_DTYPE_BF16) {
      float f = (float)uniform(&seed, lo);
      uint32_t bits;
      memcpy(&bits, &f, sizeof bits);
      h[i] = (uint16_t)(bits >> 16);
    } else { /* F16: sign, exponent 10..16 (2^-5 .. 2^1), any mantissa */
      uint16_t sign = lo < 0 && uniform(&seed, 0.0) < 0.5 ? 0x8000 : 0;
      uint16_t e = (uint16_t)(10 + (int)(uniform(&seed, 0.0) * 7));
      uint16_t mant = (uint16_t)(uniform(&seed, 0.0) * 1024);
      h[i] = (uint16_t)(sign | e << 10 | mant);
    }
  }
  float *f = xmalloc(n * sizeof *f);
  stabi_to_f32(h, dtype, n, f); /* exact: every 16-bit value is an f32 value */
  for (size_t i = 0; i < n; i++) m.r[i] = f[i];
  free(f);
  m.store_a = h;
  m.src = (stabi_src){h, NULL, dtype, STAB_DTYPE_F32, cols};
  return m;
}

static void free_matrix(test_matrix *m) {
  free(m->r);
  free(m->store_a);
  free(m->store_b);
}

/* y = W^T (W x) by stabi_gram_apply, with the workspace spectral.c would give it. */
static double pass(const test_matrix *m, size_t rows, size_t cols, const double *x, double *y, int nv,
                   int f64, int threads) {
  const size_t nchunks = stabi_chunk_count(rows, cols);
  double *partial = xmalloc(nchunks * 4 * cols * sizeof *partial);
  stabi_tiles tiles;
  tiles.floats = stabi_tile_floats(cols);
  tiles.slots = threads;
  tiles.buf = xmalloc(tiles.floats * 2 * (size_t)threads * sizeof(float));
  double q = stabi_gram_apply(&m->src, rows, cols, x, y, partial, &tiles, threads, nv, f64);
  free(partial);
  free(tiles.buf);
  return q;
}

/* The f32 runs' bound on |y~_j - y_j|, in units of u32 = 2^-24 times
 * s_j = sum_i |r_ij| sum_k |r_ik x_k| (gram_kernels.h: a dot's lane sums at most 64 products, the
 * accumulation STABI_RUN_ROWS = 32 rows in the SIMD builds, 8 in the portable one; x, each dot and
 * each A - B are rounded to f32 once):
 *   dot:          (64 + 1) u32 sum_k |r_ik x_k|, and 1 more for A - B;
 *   accumulation: (32 + 1) u32 |d_i| |r_ij| (32 roundings in a lane, d rounded to f32), |d_i| <=
 *                 sum_k |r_ik x_k|, and 1 more for A - B;
 * 104 covers their sum (101) and the f64 steps. */
#define F32_BOUND_UNITS 104.0
#define U32 0x1.0p-24

/* Checks one pass against the brute force; returns max_j |err_j| / bound_j. */
static double check_pass(const char *what, const test_matrix *m, size_t rows, size_t cols, int nv,
                         int f64, uint64_t seed) {
  double *x = xmalloc(4 * cols * sizeof *x), *y = xmalloc(4 * cols * sizeof *y);
  long double *d = xmalloc(rows * sizeof *d), *a = xmalloc(rows * sizeof *a);
  for (size_t j = 0; j < 4 * cols; j++) x[j] = uniform(&seed, -0.5) / sqrt((double)cols);
  double q = pass(m, rows, cols, x, y, nv, f64, 1);
  double worst = 0.0;
  for (int v = 0; v < nv; v++) {
    const double *xv = x + (size_t)v * cols;
    long double quad = 0;
    for (size_t i = 0; i < rows; i++) {
      long double s = 0, t = 0;
      for (size_t k = 0; k < cols; k++) {
        s += (long double)m->r[i * cols + k] * xv[k];
        t += fabsl((long double)m->r[i * cols + k] * xv[k]);
      }
      d[i] = s, a[i] = t, quad += s * s;
    }
    if (v == 0) {
      long double qa = 0;
      for (size_t i = 0; i < rows; i++) qa += a[i] * a[i];
      double qb = (f64 ? 1e-13 : 2 * F32_BOUND_UNITS * U32) * (double)qa;
      ck_assert_msg(fabs(q - (double)quad) <= qb, "%s nv %d: x0^T G x0 = %.17g, expected %.17g (bound %g)",
                    what, nv, q, (double)quad, qb);
    }
    for (size_t j = 0; j < cols; j++) {
      long double yj = 0, sj = 0;
      for (size_t i = 0; i < rows; i++) {
        yj += (long double)m->r[i * cols + j] * d[i];
        sj += fabsl((long double)m->r[i * cols + j]) * a[i];
      }
      double err = fabs(y[(size_t)v * cols + j] - (double)yj);
      double bound = (f64 ? 1e-13 : F32_BOUND_UNITS * U32) * (double)sj;
      ck_assert_msg(err <= bound, "%s nv %d %s: y[%zu] = %.17g, expected %.17g (error %g > bound %g)",
                    what, nv, f64 ? "f64" : "f32", j, y[(size_t)v * cols + j], (double)yj, err, bound);
      if (sj > 0) worst = fmax(worst, err / bound);
    }
  }
  free(x), free(y), free(d), free(a);
  return worst;
}

static const struct {
  size_t rows, cols;
} shapes[] = {
    {1, 37},    /* a single row, no whole block */
    {13, 100},  /* one block and 5 single rows; cols not a multiple of 16 */
    {8, 16},    /* exactly one block of one vector width */
    {203, 77},  /* ragged blocks: 25 of 8 rows and 3 single rows (one chunk: a small matrix) */
    {64, 2061}, /* dot lanes over several runs (1024 columns a run with 16 lanes), and a tail */
    {1027, 1021}, /* past 2^20 elements: 16 chunks of ragged sizes, summed in order */
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static const struct {
  stab_dtype dtype;
  int with_b;
  const char *name;
} kinds[] = {
    {STAB_DTYPE_F32, 0, "F32"},
    {STAB_DTYPE_F32, 1, "F32 A-B"},
    {STAB_DTYPE_BF16, 0, "BF16"},
    {STAB_DTYPE_F16, 0, "F16"},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

/* Mixed signs: the bound holds for nv = 1, 2, 4 in both arithmetics. */
START_TEST(test_pass_within_bound) {
  const size_t s = (size_t)_i % NSHAPES, k = (size_t)_i / NSHAPES;
  const size_t rows = shapes[s].rows, cols = shapes[s].cols;
  test_matrix m = make_matrix(rows, cols, kinds[k].dtype, kinds[k].with_b, -0.5, 100 + (uint64_t)_i);
  char what[96];
  snprintf(what, sizeof what, "%s %zux%zu (kernel %s)", kinds[k].name, rows, cols, stab_spectral_kernel());
  for (int nv = 1; nv <= 4; nv *= 2)
    for (int f64 = 0; f64 <= 1; f64++) check_pass(what, &m, rows, cols, nv, f64, 7 + (uint64_t)nv);
  free_matrix(&m);
}
END_TEST

/* Positive numbers, no cancellation, one block of rows (nothing averages the dots' errors
 * away): the rounding errors of the f32 runs show. The bound grows with the run length, random
 * roundings with its square root: the worst error was 0.8e-3 to 3e-3 of the bound (every
 * build, dtype and nv). It must reach 2e-4 of it (the bound is not absurdly loose, and the
 * path is f32: f64's errors stay near 1e-11 of it), while the f64 path stays within its own. */
START_TEST(test_pass_bound_not_loose) {
  const size_t rows = 8, cols = 2061;
  for (size_t k = 0; k < NKINDS; k++) {
    if (kinds[k].with_b) continue; /* A - B has mixed signs */
    test_matrix m = make_matrix(rows, cols, kinds[k].dtype, 0, 0.0, 300 + (uint64_t)k);
    char what[96];
    snprintf(what, sizeof what, "positive %s %zux%zu (kernel %s)", kinds[k].name, rows, cols,
             stab_spectral_kernel());
    for (int nv = 1; nv <= 4; nv *= 2) {
      double worst = check_pass(what, &m, rows, cols, nv, 0, 11);
      ck_assert_msg(worst >= 2e-4, "%s nv %d: worst error %.3g of the f32 bound: the bound is loose or "
                    "the pass is not f32", what, nv, worst);
      check_pass(what, &m, rows, cols, nv, 1, 11);
    }
    free_matrix(&m);
  }
}
END_TEST

/* 1100 x 1024 elements, past the size below which a pass stays on one thread: 1, 2 and 3
 * threads give the same bits, for every dtype, both arithmetics, 4 vectors. */
START_TEST(test_pass_threads_bit_identical) {
  const size_t rows = 1100, cols = 1024;
  for (size_t k = 0; k < NKINDS; k++) {
    test_matrix m = make_matrix(rows, cols, kinds[k].dtype, kinds[k].with_b, -0.5, 500 + (uint64_t)k);
    double *x = xmalloc(4 * cols * sizeof *x), *y[3];
    uint64_t seed = 9;
    for (size_t j = 0; j < 4 * cols; j++) x[j] = uniform(&seed, -0.5);
    for (int f64 = 0; f64 <= 1; f64++) {
      double q[3];
      for (int t = 0; t < 3; t++) {
        y[t] = xmalloc(4 * cols * sizeof *y[t]);
        q[t] = pass(&m, rows, cols, x, y[t], 4, f64, t + 1);
      }
      for (int t = 1; t < 3; t++) {
        ck_assert_msg(memcmp(&q[0], &q[t], sizeof q[0]) == 0 && memcmp(y[0], y[t], 4 * cols * sizeof(double)) == 0,
                      "%s %s: 1 and %d threads differ", kinds[k].name, f64 ? "f64" : "f32", t + 1);
      }
      for (int t = 0; t < 3; t++) free(y[t]);
    }
    free(x);
    free_matrix(&m);
  }
}
END_TEST

/* Numbers near f32's limits, which f64 holds: the pass scales by powers of two, and redoes in
 * f64 what still overflows. */
START_TEST(test_pass_range) {
  const size_t rows = 40, cols = 50;
  /* 6e38: elements up to 3e38, whose dots overflow f32 */
  static const double scales[] = {1e-30, 1e30, 6e38};
  for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
    test_matrix m = make_matrix(rows, cols, STAB_DTYPE_F32, 0, -0.5, 700 + s);
    float *a = m.store_a;
    for (size_t i = 0; i < rows * cols; i++) {
      a[i] = (float)(a[i] * scales[s]);
      m.r[i] = a[i];
    }
    char what[64];
    snprintf(what, sizeof what, "F32 x %g", scales[s]);
    for (int nv = 1; nv <= 4; nv *= 2) check_pass(what, &m, rows, cols, nv, 0, 13);
    free_matrix(&m);
  }
}
END_TEST

/* The f64 vector kernels of spectral.c (this build's: tests/programs/kernels.sh runs each): the 16 dots
 * of two blocks of four vectors and Gram-Schmidt's update of up to four by four, against long
 * double sums, within f64's rounding bounds (lengths around the SIMD widths and their tails). */
START_TEST(test_vector_kernels) {
  static const size_t lengths[] = {1, 3, 4, 7, 8, 9, 15, 16, 17, 33, 256, 1001};
  uint64_t z = 99;
  for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
    const size_t n = lengths[k];
    double *x = malloc(8 * n * sizeof *x), *zz = malloc(4 * n * sizeof *zz), *z0 = malloc(4 * n * sizeof *z0);
    ck_assert(x && zz && z0);
    for (size_t i = 0; i < 8 * n; i++) {
      z = z * 6364136223846793005ull + 1442695040888963407ull;
      x[i] = (double)(z >> 11) * 0x1.0p-53 - 0.5;
    }
    const double *xa[4] = {x, x + n, x + 2 * n, x + 3 * n}, *ya[4] = {x + 4 * n, x + 5 * n, x + 6 * n, x + 7 * n};
    double s[4][4];
    stabi_dot4x4(xa, ya, n, s);
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++) {
        long double ref = 0.0L, mag = 0.0L;
        for (size_t t = 0; t < n; t++) {
          ref += (long double)xa[a][t] * ya[b][t];
          mag += fabsl((long double)xa[a][t] * ya[b][t]);
        }
        ck_assert_msg(fabsl(s[a][b] - ref) <= (long double)(n + 2) * 0x1.0p-52L * mag + 1e-300L,
                      "dot4x4 n %zu [%d][%d]: %.17g, long double %.17Lg", n, a, b, s[a][b], ref);
      }
    /* z_v -= sum_a c[a][v] q_a for v < nz, the q_a the first four vectors of x, the z_v copies
     * of the last four, c arbitrary: against long double, within f64's rounding of each term */
    for (size_t nz = 1; nz <= 4; nz++) {
      memcpy(zz, x + 4 * n, 4 * n * sizeof *zz);
      memcpy(z0, zz, 4 * n * sizeof *z0);
      double c[4][4];
      for (int a = 0; a < 4; a++)
        for (int v = 0; v < 4; v++) c[a][v] = 0.25 * (a + 1) - 0.125 * v;
      double *const zp[4] = {zz, zz + n, zz + 2 * n, zz + 3 * n};
      stabi_sub4(xa, c, zp, nz, n);
      for (size_t v = 0; v < 4; v++) {
        if (v >= nz) { /* past nz: untouched */
          ck_assert_msg(memcmp(zz + v * n, z0 + v * n, n * sizeof *zz) == 0, "sub4 nz %zu touched z_%zu", nz, v);
          continue;
        }
        for (size_t t = 0; t < n; t++) {
          long double want = z0[v * n + t], mag = fabsl(want);
          for (int a = 0; a < 4; a++) {
            want -= (long double)c[a][v] * xa[a][t];
            mag += fabsl((long double)c[a][v] * xa[a][t]);
          }
          ck_assert_msg(fabsl(zz[v * n + t] - want) <= 5 * 0x1.0p-53L * mag,
                        "sub4 n %zu nz %zu: z_%zu[%zu] %.17g, want %.17Lg", n, nz, v, t, zz[v * n + t], want);
        }
      }
    }
    free(x);
    free(zz);
    free(z0);
  }
}
END_TEST

static Suite *gram_pass_suite(void) {
  Suite *s = suite_create("gram_pass");
  TCase *tc = tcase_create("accuracy");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_pass_within_bound, 0, (int)(NSHAPES * NKINDS));
  tcase_add_test(tc, test_pass_bound_not_loose);
  tcase_add_test(tc, test_pass_range);
  tcase_add_test(tc, test_vector_kernels);
  suite_add_tcase(s, tc);
  tc = tcase_create("threads");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_pass_threads_bit_identical);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(gram_pass_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
