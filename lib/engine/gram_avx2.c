/* gram_avx2.c — the pass kernels for AVX2 + FMA: gram_simd.h's code with four doubles and
 * eight floats a vector, in 16 ymm registers. gram_pass.c runs them where the processor has
 * AVX2 and FMA (STAB_KERNEL=avx2 forces them). */
#include "engine/gram_kernels.h"

#ifdef HAVE_X86_KERNELS
#include <immintrin.h>

#define SIMD_INLINE __attribute__((always_inline, target("avx2,fma"))) static inline
#define SIMD_FN __attribute__((target("avx2,fma"))) static

typedef __m256d vd;
typedef __m256 vf;
enum { VD_LANES = 4, VF_LANES = 8 };

SIMD_INLINE vd vd_zero(void) { return _mm256_setzero_pd(); }
SIMD_INLINE vd vd_loadu(const double *p) { return _mm256_loadu_pd(p); }
SIMD_INLINE void vd_storeu(double *p, vd v) { _mm256_storeu_pd(p, v); }
SIMD_INLINE vd vd_set1(double x) { return _mm256_set1_pd(x); }
SIMD_INLINE vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
SIMD_INLINE vd vd_fmadd(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
SIMD_INLINE vd vd_fnmadd(vd a, vd b, vd c) { return _mm256_fnmadd_pd(a, b, c); }
SIMD_INLINE double vd_sum(vd v) { /* (v0 + v2) + (v1 + v3) */
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(s) + _mm_cvtsd_f64(_mm_unpackhi_pd(s, s));
}

SIMD_INLINE vf vf_reg(vf v) {
  __asm__("" : "+x"(v));
  return v;
}
SIMD_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
SIMD_INLINE vf vf_loadu(const float *p) { return _mm256_loadu_ps(p); }
SIMD_INLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
SIMD_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
SIMD_INLINE vd vf_widen_lo(vf v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
SIMD_INLINE vd vf_widen_hi(vf v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

SIMD_INLINE vd load_vd(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m128i h = _mm_loadl_epi64((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
  }
  __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(a + j));
  return b ? _mm256_sub_pd(v, _mm256_cvtps_pd(_mm_loadu_ps(b + j))) : v;
}

SIMD_INLINE vf load_vf(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  __m256 v = _mm256_loadu_ps(a + j);
  return b ? _mm256_sub_ps(v, _mm256_loadu_ps(b + j)) : v;
}

/* The f32 kernel in 16 ymm registers: the dots swept 8 / nv rows at a time (8 sums), the
 * accumulation by tiles of 8 sums in all. */
SIMD_INLINE int dot_rows(int nv) { return 8 / nv; }
SIMD_INLINE int acc_tiles(int nv) { return nv == 4 ? 2 : nv == 2 ? 4 : 8; }

#include "engine/gram_simd.h"

const stabi_gram_kernel stabi_gram_avx2 = {"avx2",       simd_chunk,  simd_chunk_bf16, simd_chunk32,
                                           simd_chunk32_bf16, simd_dot4x4, simd_sub4};
#endif /* HAVE_X86_KERNELS */
