/* gguf_quant.c — the tests' own reference decoder and simple quantizers of GGUF's block
 * layouts, shared by check_probe_gguf (random blocks decoded, weights round-tripped) and
 * gguf_convert (whole checkpoints quantized). Independent of the library's dequantizer. */
#include "gguf_quant.h"

#include <math.h>
#include <string.h>

#include "stabmeter.h"

/* Each element is read field by field with get_bits (bits numbered little-endian through the
 * block), from the layout as ggml-common.h defines it, and combined with the float operations
 * ggml's dequantize_row uses, so the library's output must match bit for bit. */

static unsigned get_bits(const unsigned char *p, unsigned bit, unsigned width) {
  unsigned v = 0;
  for (unsigned k = 0; k < width; k++) v |= (unsigned)((p[(bit + k) / 8] >> ((bit + k) % 8)) & 1) << k;
  return v;
}
static float f16_at(const unsigned char *p, unsigned byte) { return stab_f16_to_f32((uint16_t)get_bits(p, 8 * byte, 16)); }
static int sbits(unsigned v, unsigned width) { return v >= (1u << (width - 1)) ? (int)v - (1 << width) : (int)v; }

static const int iq4nl_table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 32-element blocks: element e's 4-bit quant is nibble e / 16 of byte e % 16 of qs */
static unsigned nib32(const unsigned char *b, unsigned qs_byte, unsigned e) {
  return get_bits(b, 8 * (qs_byte + e % 16) + 4 * (e / 16), 4);
}
/* K-quants' six-bit scale (what = 0) or minimum (what = 1) of sub-block s (Q4_K, Q5_K) */
static int k4_field(const unsigned char *b, unsigned s, int what) {
  const unsigned at = 8 * 4; /* scales[12] at byte 4 */
  if (s < 4) return (int)get_bits(b, at + 8 * (s + 4 * (unsigned)what), 6);
  return (int)(get_bits(b, at + 8 * (s + 4) + 4 * (unsigned)what, 4) |
               get_bits(b, at + 8 * (s - 4 + 4 * (unsigned)what) + 6, 2) << 4);
}

float gq_element(int type, const unsigned char *b, unsigned e) {
  switch (type) {
  case 8: return (float)sbits(get_bits(b, 16 + 8 * e, 8), 8) * f16_at(b, 0);
  case 2: return (float)((int)nib32(b, 2, e) - 8) * f16_at(b, 0);
  case 3: return (float)nib32(b, 4, e) * f16_at(b, 0) + f16_at(b, 2);
  case 6: return (float)((int)(nib32(b, 6, e) | get_bits(b, 16 + e, 1) << 4) - 16) * f16_at(b, 0);
  case 7: return (float)(nib32(b, 8, e) | get_bits(b, 32 + e, 1) << 4) * f16_at(b, 0) + f16_at(b, 2);
  case 20: return f16_at(b, 0) * (float)iq4nl_table[nib32(b, 2, e)];
  case 14: { /* Q6_K */
    unsigned h = e / 128, g = e % 128 / 32, l = e % 32;
    int q = (int)(get_bits(b, 8 * (64 * h + l + 32 * (g & 1)) + 4 * (g >> 1), 4) |
                  get_bits(b, 8 * (128 + 32 * h + l) + 2 * g, 2) << 4) - 32;
    int sc = sbits(get_bits(b, 8 * (192 + 8 * h + 2 * g + l / 16), 8), 8);
    return f16_at(b, 208) * (float)sc * (float)q;
  }
  case 12: case 13: { /* Q4_K, Q5_K */
    unsigned s = e / 32, l = e % 32, qs = type == 12 ? 16 : 48;
    unsigned q = get_bits(b, 8 * (qs + 32 * (s / 2) + l) + 4 * (s % 2), 4);
    if (type == 13) q += get_bits(b, 8 * (16 + l) + s, 1) * 16;
    float d = f16_at(b, 0) * (float)k4_field(b, s, 0), m = f16_at(b, 2) * (float)k4_field(b, s, 1);
    return d * (float)q - m;
  }
  case 10: case 11: { /* Q2_K, Q3_K: the 2-bit quants alike, scale index k */
    unsigned h = e / 128, g = e % 128 / 32, l = e % 32, k = 8 * h + 2 * g + l / 16;
    unsigned qs = type == 10 ? 16 : 32;
    int q = (int)get_bits(b, 8 * (qs + 32 * h + l) + 2 * g, 2);
    if (type == 10) {
      unsigned sc = get_bits(b, 8 * k, 8);
      return f16_at(b, 80) * (float)(sc & 15) * (float)q - f16_at(b, 82) * (float)(sc >> 4);
    }
    int scale = (int)(get_bits(b, 8 * (96 + k % 8) + 4 * (k / 8), 4) | get_bits(b, 8 * (104 + k % 4) + 2 * (k / 4), 2) << 4);
    int hbit = (int)get_bits(b, 8 * l + 4 * h + g, 1);
    return f16_at(b, 108) * (float)(scale - 32) * (float)(q - (hbit ? 0 : 4));
  }
  case 23: { /* IQ4_XS */
    unsigned s = e / 32, j = e % 32;
    int ls = (int)(get_bits(b, 32 + 4 * s, 4) | get_bits(b, 16 + 2 * s, 2) << 4);
    unsigned q = get_bits(b, 8 * (8 + 16 * s + j % 16) + 4 * (j / 16), 4);
    return f16_at(b, 0) * (float)(ls - 32) * (float)iq4nl_table[q];
  }
  }
  return NAN; /* a type with no reference decoder */
}

const gq_type gq_types[GQ_NTYPES] = {
    {8, "Q8_0", 32, 34, {0}, 1},        {2, "Q4_0", 32, 18, {0}, 1},       {3, "Q4_1", 32, 20, {0, 2}, 2},
    {6, "Q5_0", 32, 22, {0}, 1},        {7, "Q5_1", 32, 24, {0, 2}, 2},    {14, "Q6_K", 256, 210, {208}, 1},
    {12, "Q4_K", 256, 144, {0, 2}, 2},  {13, "Q5_K", 256, 176, {0, 2}, 2}, {10, "Q2_K", 256, 84, {80, 82}, 2},
    {11, "Q3_K", 256, 110, {108}, 1},   {20, "IQ4_NL", 32, 18, {0}, 1},    {23, "IQ4_XS", 256, 136, {0}, 1},
};

/* The smallest f16 at or above x > 0 (positive f16 values grow with their bit patterns). */
uint16_t gq_f16_at_least(float x) {
  unsigned lo = 0, hi = 0x7bff; /* the largest finite */
  while (lo < hi) {
    unsigned mid = (lo + hi) / 2;
    if (stab_f16_to_f32((uint16_t)mid) >= x) hi = mid;
    else lo = mid + 1;
  }
  return (uint16_t)lo;
}

/* ---- round trips: weights quantized by the test, probed ------------------------------- */
/* Simple reference quantizers (round to nearest on a grid chosen to cover the block, scales
 * rounded up to f16 so that no quant clamps), writing each field with set_bits at the bit
 * offsets gq_element reads; the dequantized block comes from gq_element, and each element's
 * bound is half its grid step (plus f32 rounding of the offset arithmetic). */

static void set_bits(unsigned char *p, unsigned bit, unsigned width, unsigned v) {
  for (unsigned k = 0; k < width; k++) {
    unsigned char m = (unsigned char)(1u << ((bit + k) % 8));
    if ((v >> k) & 1) p[(bit + k) / 8] |= m;
    else p[(bit + k) / 8] &= (unsigned char)~m;
  }
}
static float put_half(unsigned char *b, unsigned byte, float x) { /* the f16 >= x (x >= 0) */
  uint16_t h = gq_f16_at_least(x);
  set_bits(b, 8 * byte, 16, h);
  return stab_f16_to_f32(h);
}
static int nearest(double x, int lo, int hi) {
  long q = lrint(x);
  return (int)(q < lo ? lo : q > hi ? hi : q);
}

/* The block of q->block weights w into b (q->bytes), its dequantized values into deq and each
 * element's error bound into bnd. */
int gq_quantize(const gq_type *q, const float *w, unsigned char *b, float *deq, double *bnd) {
  memset(b, 0, q->bytes);
  double step[256], off[256]; /* per element: grid step and offset (deq = step q - off) */
  switch (q->type) {
  case 8: case 2: case 6: { /* Q8_0, Q4_0, Q5_0: d (q - bias) */
    const int top = q->type == 8 ? 127 : q->type == 2 ? 7 : 15, bias = q->type == 8 ? 0 : top + 1;
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(w[j]));
    const float d = put_half(b, 0, amax / (float)top * 1.001f);
    for (int j = 0; j < 32; j++) {
      unsigned u = (unsigned)(nearest(w[j] / d, -top - 1, top) + bias);
      if (q->type == 8) set_bits(b, 16 + 8 * j, 8, u & 255);
      else set_bits(b, 8 * ((q->type == 2 ? 2 : 6) + j % 16) + 4 * (j / 16), 4, u & 15);
      if (q->type == 6) set_bits(b, 16 + j, 1, u >> 4);
      step[j] = d, off[j] = 0;
    }
    break;
  }
  case 3: case 7: { /* Q4_1, Q5_1: d q + m */
    const int top = q->type == 3 ? 15 : 31;
    float lo = w[0], hi = w[0];
    for (int j = 0; j < 32; j++) lo = fminf(lo, w[j]), hi = fmaxf(hi, w[j]);
    /* m: the f16 at or below lo (lo < 0 here: the negated f16 at least -lo) */
    uint16_t mh = (uint16_t)(gq_f16_at_least(-lo) | 0x8000u);
    set_bits(b, 16, 16, mh);
    const float m = stab_f16_to_f32(mh), d = put_half(b, 0, (hi - m) / (float)top * 1.001f);
    for (int j = 0; j < 32; j++) {
      unsigned u = (unsigned)nearest((w[j] - m) / d, 0, top);
      set_bits(b, 8 * ((q->type == 3 ? 4 : 8) + j % 16) + 4 * (j / 16), 4, u & 15);
      if (q->type == 7) set_bits(b, 32 + j, 1, u >> 4);
      step[j] = d, off[j] = -m;
    }
    break;
  }
  case 14: { /* Q6_K: d sc_k (q - 32), 16 sub-blocks of 16 */
    float sub[16], smax = 0;
    for (int k = 0; k < 16; k++) {
      sub[k] = 0;
      for (int l = 0; l < 16; l++) sub[k] = fmaxf(sub[k], fabsf(w[16 * k + l]) / 31.0f);
      smax = fmaxf(smax, sub[k]);
    }
    const float d = put_half(b, 208, smax / 127.0f * 1.001f);
    for (int k = 0; k < 16; k++) {
      int sc = (int)ceilf(sub[k] / d * 1.0001f);
      if (sc > 127) sc = 127;
      set_bits(b, 8 * (192 + k), 8, (unsigned)sc);
      for (int l = 0; l < 16; l++) step[16 * k + l] = d * (float)sc, off[16 * k + l] = 0;
    }
    for (unsigned e = 0; e < 256; e++) {
      unsigned h = e / 128, g = e % 128 / 32, l = e % 32;
      unsigned u = (unsigned)(nearest(step[e] > 0 ? w[e] / step[e] : 0, -32, 31) + 32);
      set_bits(b, 8 * (64 * h + l + 32 * (g & 1)) + 4 * (g >> 1), 4, u & 15);
      set_bits(b, 8 * (128 + 32 * h + l) + 2 * g, 2, u >> 4);
    }
    break;
  }
  case 12: { /* Q4_K: (d sc_s) q - (dmin m_s), 8 sub-blocks of 32 */
    float lo[8], hi[8], lmax = 0, rmax = 0;
    for (int s = 0; s < 8; s++) {
      lo[s] = 0, hi[s] = 0;
      for (int l = 0; l < 32; l++) lo[s] = fminf(lo[s], w[32 * s + l]), hi[s] = fmaxf(hi[s], w[32 * s + l]);
      lmax = fmaxf(lmax, -lo[s]);
    }
    const float dmin = put_half(b, 2, lmax / 63.0f * 1.001f);
    int mins[8], scs[8];
    float offs[8];
    for (int s = 0; s < 8; s++) {
      mins[s] = dmin > 0 ? (int)ceilf(-lo[s] / dmin * 1.0001f) : 0;
      if (mins[s] > 63) mins[s] = 63;
      offs[s] = dmin * (float)mins[s];
      rmax = fmaxf(rmax, (hi[s] + offs[s]) / 15.0f);
    }
    const float d = put_half(b, 0, rmax / 63.0f * 1.001f);
    for (int s = 0; s < 8; s++) {
      scs[s] = (int)ceilf((hi[s] + offs[s]) / 15.0f / d * 1.0001f);
      if (scs[s] > 63) scs[s] = 63;
      for (int what = 0; what < 2; what++) {
        unsigned v = (unsigned)(what ? mins[s] : scs[s]), at = 8 * 4;
        if (s < 4) set_bits(b, at + 8 * ((unsigned)s + 4 * (unsigned)what), 6, v);
        else {
          set_bits(b, at + 8 * ((unsigned)s + 4) + 4 * (unsigned)what, 4, v & 15);
          set_bits(b, at + 8 * ((unsigned)s - 4 + 4 * (unsigned)what) + 6, 2, v >> 4);
        }
      }
      const float st = d * (float)scs[s];
      for (int l = 0; l < 32; l++) {
        unsigned u = (unsigned)nearest(st > 0 ? (w[32 * s + l] + offs[s]) / st : 0, 0, 15);
        set_bits(b, 8 * (16 + 32 * ((unsigned)s / 2) + (unsigned)l) + 4 * ((unsigned)s % 2), 4, u);
        step[32 * s + l] = st, off[32 * s + l] = offs[s];
      }
    }
    break;
  }
  default: return -1;
  }
  for (unsigned e = 0; e < q->block; e++) {
    deq[e] = gq_element(q->type, b, e);
    bnd[e] = step[e] / 2 + 1e-6 * (fabs(w[e]) + off[e] + step[e]);
  }
  return 0;
}
