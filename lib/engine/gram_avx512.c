/* gram_avx512.c — the pass kernels for AVX-512F: gram_simd.h's code with eight doubles and
 * sixteen floats a vector, in 32 zmm registers. gram_pass.c runs them where the processor has
 * AVX-512F, first choice (STAB_KERNEL=avx512 forces them). */
#include "engine/gram_kernels.h"

#ifdef HAVE_X86_KERNELS
#include <immintrin.h>

#define SIMD_INLINE __attribute__((always_inline, target("avx512f"))) static inline
#define SIMD_FN __attribute__((target("avx512f"))) static

typedef __m512d vd;
typedef __m512 vf;
enum { VD_LANES = 8, VF_LANES = 16 };

SIMD_INLINE vd vd_zero(void) { return _mm512_setzero_pd(); }
SIMD_INLINE vd vd_loadu(const double *p) { return _mm512_loadu_pd(p); }
SIMD_INLINE void vd_storeu(double *p, vd v) { _mm512_storeu_pd(p, v); }
SIMD_INLINE vd vd_set1(double x) { return _mm512_set1_pd(x); }
SIMD_INLINE vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
SIMD_INLINE vd vd_fmadd(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
SIMD_INLINE vd vd_fnmadd(vd a, vd b, vd c) { return _mm512_fnmadd_pd(a, b, c); }
SIMD_INLINE double vd_sum(vd v) { return _mm512_reduce_add_pd(v); }

SIMD_INLINE vf vf_reg(vf v) {
  __asm__("" : "+v"(v));
  return v;
}
SIMD_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
SIMD_INLINE vf vf_loadu(const float *p) { return _mm512_loadu_ps(p); }
SIMD_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
SIMD_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
SIMD_INLINE vd vf_widen_lo(vf v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
SIMD_INLINE vd vf_widen_hi(vf v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

SIMD_INLINE vd load_vd(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(a + j));
  return b ? _mm512_sub_pd(v, _mm512_cvtps_pd(_mm256_loadu_ps(b + j))) : v;
}

SIMD_INLINE vf load_vf(const float *a, const float *b, size_t j, int bf) {
  if (bf) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)((const unsigned char *)(const void *)a + 2 * j));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m512 v = _mm512_loadu_ps(a + j);
  return b ? _mm512_sub_ps(v, _mm512_loadu_ps(b + j)) : v;
}

/* The f32 kernel in 32 zmm registers: the dots swept 8 rows at a time (4 for four vectors: at
 * most 16 sums), the accumulation by tiles of 4 vectors of columns (8 for one vector). */
SIMD_INLINE int dot_rows(int nv) { return nv == 4 ? 4 : 8; }
SIMD_INLINE int acc_tiles(int nv) { return nv == 1 ? 16 : nv == 2 ? 8 : 4; }

#include "engine/gram_simd.h"

const stabi_gram_kernel stabi_gram_avx512 = {"avx512",    simd_chunk,  simd_chunk_bf16, simd_chunk32,
                                             simd_chunk32_bf16, simd_dot4x4, simd_sub4};
#endif /* HAVE_X86_KERNELS */
