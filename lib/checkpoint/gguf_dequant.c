/* gguf_dequant.c — GGUF's block-quantized tensors to f32, exactly as ggml dequantizes them:
 * one decoder per block layout (ggml-common.h's block_q4_0 ... block_iq4_xs), each writing
 * the block's elements with the same float operations in the same order as ggml, so that the
 * f32 values are bit for bit those llama.cpp computes with. A range of elements decodes the
 * blocks it touches, one at a time, into a block-sized scratch: no allocation. */
#include "checkpoint/checkpoint_internal.h"

#include <string.h>

#define QK_K 256 /* elements of a K-quant or IQ4_XS super-block */

static inline uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline float half(const unsigned char *p) { return stab_f16_to_f32(le16(p)); }

/* ---- 32-element blocks: one scale (and a minimum) per block ---------------------------- */

/* Q8_0 {f16 d; int8 qs[32]}: d * q. */
static void decode_q8_0(const unsigned char *b, float *y) {
  const float d = half(b);
  for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q4_0 {f16 d; u8 qs[16]}: element j in the low nibble of qs[j], j + 16 in its high nibble,
 * both offset by 8. */
static void decode_q4_0(const unsigned char *b, float *y) {
  const float d = half(b);
  const unsigned char *qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = (float)((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
  }
}

/* Q4_1 {f16 d; f16 m; u8 qs[16]}: nibbles as Q4_0, unsigned, d * q + m. */
static void decode_q4_1(const unsigned char *b, float *y) {
  const float d = half(b), m = half(b + 2);
  const unsigned char *qs = b + 4;
  for (int j = 0; j < 16; j++) {
    y[j] = (float)(qs[j] & 0x0f) * d + m;
    y[j + 16] = (float)(qs[j] >> 4) * d + m;
  }
}

/* Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}: nibbles as Q4_0, the fifth bit of element j is bit j of
 * the little-endian uint32 qh; offset by 16. */
static void decode_q5_0(const unsigned char *b, float *y) {
  const float d = half(b);
  const uint32_t qh = le32(b + 2);
  const unsigned char *qs = b + 6;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    y[j] = (float)(lo - 16) * d;
    y[j + 16] = (float)(hi - 16) * d;
  }
}

/* Q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: bits as Q5_0, unsigned, d * q + m. */
static void decode_q5_1(const unsigned char *b, float *y) {
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = le32(b + 4);
  const unsigned char *qs = b + 8;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    y[j] = (float)lo * d + m;
    y[j + 16] = (float)hi * d + m;
  }
}

/* IQ4_NL's 16 non-uniform levels (ggml's kvalues_iq4nl), shared with IQ4_XS. */
static const int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* IQ4_NL {f16 d; u8 qs[16]}: nibbles as Q4_0, each an index into the levels. */
static void decode_iq4_nl(const unsigned char *b, float *y) {
  const float d = half(b);
  const unsigned char *qs = b + 2;
  for (int j = 0; j < 16; j++) {
    y[j] = d * (float)iq4_levels[qs[j] & 0x0f];
    y[j + 16] = d * (float)iq4_levels[qs[j] >> 4];
  }
}

/* ---- 256-element super-blocks with sub-block scales ------------------------------------ */

/* Q6_K {u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d}: two halves of 128; in a half, element
 * 32g + l (g < 4) takes ql[l + 32 (g & 1)]'s nibble g >> 1 as its low 4 bits and bits 2g, 2g+1
 * of qh[l] as its high 2, offset by 32; its scale is scales[8 half + 2g + l / 16]. */
static void decode_q6_k(const unsigned char *b, float *y) {
  const float d = half(b + 208);
  const unsigned char *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(const void *)(b + 192);
  for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128)
    for (int l = 0; l < 32; l++) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * (float)sc[s] * (float)q1;
      y[l + 32] = d * (float)sc[s + 2] * (float)q2;
      y[l + 64] = d * (float)sc[s + 4] * (float)q3;
      y[l + 96] = d * (float)sc[s + 6] * (float)q4;
    }
}

/* Q4_K and Q5_K pack 8 six-bit scales and 8 six-bit minimums in 12 bytes: sub-block j < 4
 * has them in the low 6 bits of bytes j and j + 4; j >= 4 has its low 4 bits in byte j + 4
 * (scale: low nibble, minimum: high nibble) and its top 2 in the top bits of bytes j - 4
 * (scale) and j (minimum). */
static void scale_min_k4(int j, const unsigned char *s, int *scale, int *min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: 8 sub-blocks of 32; sub-blocks 2i and
 * 2i + 1 take the low and high nibbles of qs[32i .. 32i + 31]; (d sc) q - (dmin m). */
static void decode_q4_k(const unsigned char *b, float *y) {
  const float d = half(b), dmin = half(b + 2);
  const unsigned char *scales = b + 4, *q = b + 16;
  for (int i = 0; i < 4; i++, q += 32, y += 64) {
    int sc, m;
    scale_min_k4(2 * i, scales, &sc, &m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    scale_min_k4(2 * i + 1, scales, &sc, &m);
    const float d2 = d * (float)sc, m2 = dmin * (float)m;
    for (int l = 0; l < 32; l++) y[l] = d1 * (float)(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
  }
}

/* Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K's layout plus a fifth
 * bit per element, bit k of qh[l] for element l of sub-block k. */
static void decode_q5_k(const unsigned char *b, float *y) {
  const float d = half(b), dmin = half(b + 2);
  const unsigned char *scales = b + 4, *qh = b + 16, *q = b + 48;
  for (int i = 0; i < 4; i++, q += 32, y += 64) {
    int sc, m;
    scale_min_k4(2 * i, scales, &sc, &m);
    const float d1 = d * (float)sc, m1 = dmin * (float)m;
    scale_min_k4(2 * i + 1, scales, &sc, &m);
    const float d2 = d * (float)sc, m2 = dmin * (float)m;
    const int lo_bit = 1 << (2 * i), hi_bit = 2 << (2 * i);
    for (int l = 0; l < 32; l++) y[l] = d1 * (float)((q[l] & 0x0f) + (qh[l] & lo_bit ? 16 : 0)) - m1;
    for (int l = 0; l < 32; l++) y[l + 32] = d2 * (float)((q[l] >> 4) + (qh[l] & hi_bit ? 16 : 0)) - m2;
  }
}

/* Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: 16 sub-blocks of 16, each scale byte a
 * 4-bit scale (low) and 4-bit minimum (high); in half h, group g (< 4) of 32 elements takes
 * bits 2g, 2g+1 of qs[32h .. 32h + 31]; (d sc) q - (dmin m). */
static void decode_q2_k(const unsigned char *b, float *y) {
  const float d = half(b + 80), dmin = half(b + 82);
  const unsigned char *sc = b, *q = b + 16;
  for (int h = 0; h < 2; h++, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; part++, sc++) {
        const float dl = d * (float)(*sc & 0x0f), ml = dmin * (float)(*sc >> 4);
        for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[16 * part + l] >> shift) & 3) - ml;
      }
}

/* Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 six-bit scales offset by 32 (scale
 * k's low 4 bits are nibble k / 8 of byte k % 8, its top 2 bits 2 (k / 4), 2 (k / 4) + 1 of byte
 * 8 + k % 4); low 2 bits of the quants as Q2_K; group n (< 8) of 32 elements takes bit n of
 * hmask[l], and a clear bit subtracts 4. */
static void decode_q3_k(const unsigned char *b, float *y) {
  const float d = half(b + 108);
  const unsigned char *hm = b, *q = b + 32, *s = b + 96;
  int scale[16];
  for (int k = 0; k < 16; k++)
    scale[k] = (((s[k % 8] >> (4 * (k / 8))) & 0x0f) | (((s[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
  int k = 0;
  unsigned bit = 1;
  for (int h = 0; h < 2; h++, q += 32)
    for (int shift = 0; shift < 8; shift += 2, bit <<= 1)
      for (int part = 0; part < 2; part++, k++) {
        const float dl = d * (float)scale[k];
        for (int l = 0; l < 16; l++) {
          const int i = 16 * part + l;
          *y++ = dl * (float)(((q[i] >> shift) & 3) - (hm[i] & bit ? 0 : 4));
        }
      }
}

/* IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: 8 sub-blocks of 32 laid out as
 * IQ4_NL blocks, sub-block i's six-bit scale (offset by 32) is nibble i % 2 of scales_l[i / 2]
 * with bits 2i, 2i+1 of scales_h on top. */
static void decode_iq4_xs(const unsigned char *b, float *y) {
  const float d = half(b);
  const unsigned scales_h = le16(b + 2);
  const unsigned char *scales_l = b + 4, *qs = b + 8;
  for (int i = 0; i < 8; i++, qs += 16, y += 32) {
    const int ls = ((scales_l[i / 2] >> (4 * (i % 2))) & 0x0f) | (int)(((scales_h >> (2 * i)) & 3u) << 4);
    const float dl = d * (float)(ls - 32);
    for (int j = 0; j < 16; j++) {
      y[j] = dl * (float)iq4_levels[qs[j] & 0x0f];
      y[j + 16] = dl * (float)iq4_levels[qs[j] >> 4];
    }
  }
}

/* ---- the table and the range reader --------------------------------------------------- */

static const stabi_quant_type quant_types[] = {
    {"Q4_0", 32, 18, decode_q4_0},    {"Q4_1", 32, 20, decode_q4_1},     {"Q5_0", 32, 22, decode_q5_0},
    {"Q5_1", 32, 24, decode_q5_1},    {"Q8_0", 32, 34, decode_q8_0},     {"Q2_K", QK_K, 84, decode_q2_k},
    {"Q3_K", QK_K, 110, decode_q3_k}, {"Q4_K", QK_K, 144, decode_q4_k},  {"Q5_K", QK_K, 176, decode_q5_k},
    {"Q6_K", QK_K, 210, decode_q6_k}, {"IQ4_NL", 32, 18, decode_iq4_nl}, {"IQ4_XS", QK_K, 136, decode_iq4_xs},
};

const stabi_quant_type *stabi_quant_find(const char *name) {
  if (!name) return NULL;
  for (size_t i = 0; i < sizeof quant_types / sizeof quant_types[0]; i++)
    if (!strcmp(name, quant_types[i].name)) return &quant_types[i];
  return NULL;
}

stab_status stabi_dequant(const stab_ckpt_tensor *t, const stabi_quant_type *q, uint64_t first, size_t n,
                          float *out) {
  /* the readers refuse a row that is not whole blocks; a tensor made by hand is checked too,
   * so that the last block never reads past the data */
  if (t->count % q->block)
    return stabi_fail(STAB_EFORMAT, "'%s': %llu elements of %s are not a whole number of %u-element blocks",
                      t->name ? t->name : "?", (unsigned long long)t->count, q->name, q->block);
  float scratch[QK_K];
  while (n) {
    const uint64_t blk = first / q->block, at = first % q->block;
    const size_t k = q->block - at < n ? (size_t)(q->block - at) : n;
    const unsigned char *src = t->data + blk * q->bytes;
    if (at == 0 && k == q->block) q->decode(src, out); /* whole block: straight into out */
    else {
      q->decode(src, scratch);
      memcpy(out, scratch + at, k * sizeof *out);
    }
    out += k, first += k, n -= k;
  }
  return STAB_OK;
}
