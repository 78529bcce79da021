/* fma_peak.c — how many f32 multiply-adds this machine's cores retire a second: the arithmetic
 * ceiling of a spectral pass, beside the read ceilings of stream_read.c.
 *
 * Why harness/bench needs it: a pass of nv vectors makes 2 nv FMAs per element of W (nv dots,
 * then nv scaled rows accumulated), where sgemv, the in-cache reference, makes one. When the
 * matrix sits in cache the pass's rate is bounded by FMAs, not by reads, at
 * peak / (2 nv) elements a second; a target above that is above this machine's arithmetic.
 *
 * The loop: 12 independent FMA chains of the widest vectors the library's kernels use (12 is
 * more than the latency (4 cycles) times the FMA units (2) of the cores we run on, so that no
 * chain waits on itself), kept in registers by naming them; nothing is loaded or stored in it. */
#include "fma_peak.h"

#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "clock.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_FMA 1
#endif

/* one round: each chain a = a * m + c, 12 chains, `rounds` times; returns a sum of the chains
 * so that none can be dropped. m and c keep the values finite and away from subnormals. */
#define FMA_ROUND(fma)                                                                          \
  do {                                                                                          \
    a0 = fma(a0, m, c), a1 = fma(a1, m, c), a2 = fma(a2, m, c), a3 = fma(a3, m, c);             \
    a4 = fma(a4, m, c), a5 = fma(a5, m, c), a6 = fma(a6, m, c), a7 = fma(a7, m, c);             \
    a8 = fma(a8, m, c), a9 = fma(a9, m, c), a10 = fma(a10, m, c), a11 = fma(a11, m, c);         \
  } while (0)
enum { CHAINS = 12 };

#ifdef HAVE_X86_FMA
__attribute__((target("avx512f"), noinline)) static float chains512(long rounds) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-3f);
  __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4);
  __m512 a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8);
  __m512 a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11), a11 = _mm512_set1_ps(12);
  for (long k = 0; k < rounds; k++) FMA_ROUND(_mm512_fmadd_ps);
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                           _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"), noinline)) static float chains256(long rounds) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-3f);
  __m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3), a3 = _mm256_set1_ps(4);
  __m256 a4 = _mm256_set1_ps(5), a5 = _mm256_set1_ps(6), a6 = _mm256_set1_ps(7), a7 = _mm256_set1_ps(8);
  __m256 a8 = _mm256_set1_ps(9), a9 = _mm256_set1_ps(10), a10 = _mm256_set1_ps(11), a11 = _mm256_set1_ps(12);
  for (long k = 0; k < rounds; k++) FMA_ROUND(_mm256_fmadd_ps);
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}
#endif

/* the lanes of the widest FMA this processor has, and the function that runs its chains;
 * 0 lanes where there is no vector FMA the kernels use */
static int widest(float (**fn)(long)) {
#ifdef HAVE_X86_FMA
  if (__builtin_cpu_supports("avx512f")) {
    *fn = chains512;
    return 16;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    *fn = chains256;
    return 8;
  }
#endif
  *fn = 0;
  return 0;
}

static volatile float fma_sink;

double fma_peak_rate(int threads) {
  float (*fn)(long) = 0;
  const int lanes = widest(&fn);
  if (!lanes || threads < 1) return NAN;
  /* 24M FMAs a run (several ms), best of REPEATS for each thread on its own clock, the threads'
   * rates summed: a thread that starts late or is descheduled for one run does not count */
  enum { ROUNDS = 2000000, REPEATS = 10 };
  double total = 0.0;
  float sum = 0.0f;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total, sum)
#endif
  {
    double best = INFINITY;
    for (int r = 0; r < REPEATS; r++) {
      const double t0 = monotonic_seconds();
      sum += fn(ROUNDS);
      const double t = monotonic_seconds() - t0;
      if (t < best) best = t;
    }
    total += (double)ROUNDS * CHAINS * lanes / best;
  }
  fma_sink = sum;
  return total;
}
