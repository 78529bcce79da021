/* gguf_quant.h — the tests' own reference decoder and simple quantizers of GGUF's block
 * layouts (ggml-common.h), independent of the library's dequantizer. The quantizers are ours:
 * valid encodings that ggml decodes, not llama.cpp's (no importance matrix, no search for the
 * best scales), enough to see what quantization does and to check the library bit for bit. */
#ifndef STAB_GGUF_QUANT_H
#define STAB_GGUF_QUANT_H

#include <stdint.h>

/* One block type: its GGML number and name, elements per block, bytes per block, and where
 * its f16 scale fields are (for tests that fill blocks with random bytes but finite scales). */
typedef struct {
  int type;
  const char *name;
  unsigned block, bytes;
  unsigned halves[3]; /* byte offsets of the f16 fields (0 ends the list unless first) */
  unsigned nhalves;
} gq_type;

/* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q6_K, Q4_K, Q5_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS. */
enum { GQ_NTYPES = 12 };
extern const gq_type gq_types[GQ_NTYPES];

/* Element e of the block at b of GGML type `type`, decoded field by field with the float
 * operations ggml's dequantize_row uses (so the same f32 bits); NaN for a type not listed. */
float gq_element(int type, const unsigned char *b, unsigned e);

/* The block of q->block weights w into b (q->bytes bytes), its decoded values into deq and each
 * element's error bound into bnd (half its grid step plus f32 rounding). Round to nearest on a
 * grid that covers the block, scales rounded up to f16 so that no quant clamps. Types with a
 * quantizer: Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q6_K, Q4_K; 0, or -1 for another type. */
int gq_quantize(const gq_type *q, const float *w, unsigned char *b, float *deq, double *bnd);

/* The smallest f16 at or above x > 0 (as its bits). */
uint16_t gq_f16_at_least(float x);

#endif
