/* stream_read.c — the reads that harness/bench and bench/pass_ceiling hold a spectral pass
 * against: a plain 16-byte streaming read (the bench's historical stream_GBps), and the
 * reference read, the fastest of a read loop with the widest loads the processor has and
 * OpenBLAS's sgemv over the same bytes, timed in the same run. A 16-byte loop read only 20-44
 * GB/s where sgemv read the same 64 MiB at 45-49 GB/s on 2 threads, so a fraction of it
 * flattered the pass. */
#include "stream_read.h"

#include <math.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "clock.h"

#if defined(__GNUC__)
typedef float f32x4 __attribute__((vector_size(16)));

static f32x4 load4(const float *p) {
  f32x4 x;
  memcpy(&x, p, sizeof x); /* unaligned load */
  return x;
}
#endif

/* Eight independent 4-wide f32 accumulators (in registers; SSE2 is x86-64's baseline, so no
 * special flags) keep far more adds in flight than any memory system can feed. */
double stream_read_sum(const float *a, size_t n) {
  size_t i = 0;
  double s = 0.0;
#if defined(__GNUC__)
  f32x4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
  for (; i + 32 <= n; i += 32) {
    s0 += load4(a + i);
    s1 += load4(a + i + 4);
    s2 += load4(a + i + 8);
    s3 += load4(a + i + 12);
    s4 += load4(a + i + 16);
    s5 += load4(a + i + 20);
    s6 += load4(a + i + 24);
    s7 += load4(a + i + 28);
  }
  f32x4 t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
  s = (double)t[0] + t[1] + t[2] + t[3];
#endif
  for (; i < n; i++) s += a[i];
  return s;
}

/* ---- the wide read: 512-bit loads with AVX-512F, else 256-bit with AVX ---- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Four 64-byte loads an iteration into four accumulators: two cache lines in flight per
 * accumulator chain is more than the line fill buffers can serve. */
__attribute__((target("avx512f"))) static double wide_sum_avx512(const float *a, size_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(a + i));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(a + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_loadu_ps(a + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_loadu_ps(a + i + 48));
  }
  double s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
  for (; i < n; i++) s += a[i];
  return s;
}

__attribute__((target("avx"))) static double wide_sum_avx(const float *a, size_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_loadu_ps(a + i));
    s1 = _mm256_add_ps(s1, _mm256_loadu_ps(a + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_loadu_ps(a + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_loadu_ps(a + i + 24));
  }
  __m256 t = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  float l[8];
  _mm256_storeu_ps(l, t);
  double s = 0.0;
  for (int k = 0; k < 8; k++) s += l[k];
  for (; i < n; i++) s += a[i];
  return s;
}
#endif

const char *stream_read_wide_name(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return "512-bit";
  if (__builtin_cpu_supports("avx")) return "256-bit";
#endif
  return "128-bit";
}

double stream_read_wide_sum(const float *a, size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return wide_sum_avx512(a, n);
  if (__builtin_cpu_supports("avx")) return wide_sum_avx(a, n);
#endif
  return stream_read_sum(a, n);
}

/* ---- the reference ---- */

/* Keeps the sums alive so that the compiler cannot drop the reads. */
static volatile double sink;

/* Sum of a[0..n) by `threads` threads, one contiguous slice each (as a pass splits its rows),
 * with the 16-byte or the wide loop. */
static double split_sum(const float *a, size_t n, int threads, int wide) {
  double total = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t lo = n / (size_t)nt * (size_t)t;
    size_t hi = t == nt - 1 ? n : n / (size_t)nt * (size_t)(t + 1);
    total += wide ? stream_read_wide_sum(a + lo, hi - lo) : stream_read_sum(a + lo, hi - lo);
  }
#else
  (void)threads;
  total = wide ? stream_read_wide_sum(a, n) : stream_read_sum(a, n);
#endif
  return total;
}

double stream_read_threads(const float *a, size_t n, int threads) { return split_sum(a, n, threads, 0); }

double reference_wide_read(const float *a, size_t n, int threads) {
  double t0 = monotonic_seconds(), total = split_sum(a, n, threads, 1);
  double t = monotonic_seconds() - t0;
  sink = total;
  return t;
}

double reference_sgemv(const float *w, size_t rows, size_t cols, int threads, const float *x,
                       float *y) {
#ifdef OPENBLAS_VERSION
  const int blas_threads = openblas_get_num_threads();
  openblas_set_num_threads(threads);
#else
  (void)threads;
#endif
  double t0 = monotonic_seconds();
  cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)rows, (int)cols, 1.0f, w, (int)cols, x, 1, 0.0f, y, 1);
  double t = monotonic_seconds() - t0;
  sink = y[0];
#ifdef OPENBLAS_VERSION
  openblas_set_num_threads(blas_threads);
#endif
  return t;
}
