/* stored_rows.c — rows of a stored matrix as f32, whatever the dtype the layer functions read
 * natively (F32, F16, BF16). F32 rows are used where they are; 16-bit rows are converted into
 * a small buffer the caller owns, so a pass over a BF16 tensor needs no f32 copy of it. */
#include "engine/engine.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_F16C_KERNEL 1
#endif

const char *stabi_dtype_name(stab_dtype dtype) {
  switch (dtype) {
  case STAB_DTYPE_F32: return "F32";
  case STAB_DTYPE_F16: return "F16";
  case STAB_DTYPE_BF16: return "BF16";
  case STAB_DTYPE_OTHER: return "OTHER";
  case STAB_DTYPE_QUANT: return "QUANT";
  }
  return NULL;
}

float stab_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    /* zero or subnormal: mant * 2^-24, exact in f32 */
    f = (float)mant * 0x1p-24f;
    return sign ? -f : f;
  }
  uint32_t bits;
  if (exp == 31) bits = sign | 0x7f800000u | (mant << 13); /* inf, or NaN keeping its payload */
  else bits = sign | ((exp + 112u) << 23) | (mant << 13);
  memcpy(&f, &bits, sizeof f);
  return f;
}

float stab_bf16_to_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* bf16 is the high half of an f32: widening is a shift, which the compiler vectorises (the
 * memcpy keeps the 2-byte loads free of alignment and aliasing assumptions). */
static void bf16_to_f32(const unsigned char *p, size_t n, float *out) {
  /* -O2's cheap vectoriser leaves a loop of unknown count scalar: asked for, it is 8x faster */
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    const uint32_t bits = (uint32_t)h << 16;
    memcpy(&out[i], &bits, sizeof bits);
  }
}

#ifdef HAVE_F16C_KERNEL
/* vcvtph2ps converts binary16 exactly, subnormals, infinities and NaN payloads included (NaNs
 * quietened, as stab_f16_to_f32 does not: only signalling NaNs differ, and both are NaN). */
__attribute__((target("f16c,avx"))) static void f16_to_f32_f16c(const unsigned char *p, size_t n,
                                                                float *out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i))));
  for (; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    out[i] = stab_f16_to_f32(h);
  }
}
#endif

#ifdef HAVE_F16C_KERNEL
/* F16C by CPUID leaf 1 (ECX bit 29), with the AVX state the OS saves: clang's
 * __builtin_cpu_supports knows no "f16c" (clang 14 refuses to compile it). */
static int f16c_supported(void) {
  unsigned a, b, c, d;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

static void f16_to_f32(const unsigned char *p, size_t n, float *out) {
#ifdef HAVE_F16C_KERNEL
  if (f16c_supported()) {
    f16_to_f32_f16c(p, n, out);
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    memcpy(&h, p + 2 * i, sizeof h);
    out[i] = stab_f16_to_f32(h);
  }
}

void stabi_to_f32(const void *p, stab_dtype dtype, size_t n, float *out) {
  switch (dtype) {
  case STAB_DTYPE_BF16: bf16_to_f32(p, n, out); return;
  case STAB_DTYPE_F16: f16_to_f32(p, n, out); return;
  default: memcpy(out, p, n * sizeof *out); return;
  }
}

void stabi_tile_f32(const void *p, stab_dtype dtype, size_t ld, size_t r0, size_t nrows, size_t cols,
                    float *tile) {
  for (size_t i = 0; i < nrows; i++)
    stabi_to_f32(stabi_elem_ptr(p, dtype, (r0 + i) * ld), dtype, cols, tile + i * cols);
}

const float *stabi_row_f32(const void *p, stab_dtype dtype, size_t ld, size_t i, size_t cols, float *buf) {
  if (dtype == STAB_DTYPE_F32) return (const float *)p + i * ld;
  stabi_to_f32(stabi_elem_ptr(p, dtype, i * ld), dtype, cols, buf);
  return buf;
}
