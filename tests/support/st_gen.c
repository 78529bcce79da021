/* st_gen.c — test helper for tests/programs/probe.sh: writes a small model checkpoint in safetensors
 * (GPT-2 HF names, tied, with Conv1D in-major weights, a 4-D mask buffer and an integer
 * tensor; or Llama names with an untied lm_head), the same model one random step earlier,
 * and the expected metrics of every layer computed by stab_layer_metrics in exact mode from
 * the values as stored (after f16/bf16 rounding). Its kinds and layouts are written out by
 * hand here, independently of the probe's rule table.
 * Usage: st_gen OUT_PREFIX gpt2|llama F32|F16|BF16 [NONFINITE]
 * writes OUT_PREFIX.safetensors, OUT_PREFIX.prev.safetensors and OUT_PREFIX.ref, one line
 * per layer: name kind forward dependency update (nan where undefined); a layer is named by
 * its tensor, except the fused c_attn's q, k and v (h.0.attn.c_attn.q ..., as the probe names
 * them: the column blocks of the in-major [16][48] with their thirds of the bias).
 * st_gen OUT_PREFIX llmc F32|BF16 writes the same three files for an llm.c checkpoint
 * (OUT_PREFIX.bin, OUT_PREFIX.prev.bin, OUT_PREFIX.ref), V = 50 padded to 64 with padding
 * rows of 1e6 that must not reach any metric.
 * st_gen OUT_PREFIX gpt2-124m F32|F16|BF16 writes only OUT_PREFIX.safetensors: GPT-2 124M's
 * HF tensors (tied, 124,439,808 parameters) of i.i.d. N(0, 0.02^2), for timing the probe.
 * st_gen OUT_PREFIX gguf F32|F16|BF16 writes OUT_PREFIX.gguf, OUT_PREFIX.prev.gguf and
 * OUT_PREFIX.ref: a Llama-shaped GGUF with llama.cpp's tensor names (ne[] reversed from the
 * shapes below), tied (no output.weight), 4 query heads and 2 key/value heads in the metadata,
 * one Q8_0 tensor (all zeros: measured, shown as Q8_0) and one F32 rope_freqs that the probe
 * must list as not measured. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "st_writer.h"
#include "stabmeter.h"

typedef struct {
  const char *name, *dtype; /* dtype NULL: the model's float dtype */
  size_t ndim;
  uint64_t shape[4];
  int kind;        /* stab_kind, -1 not a layer of its own (bias folded, or not measured) */
  int in_major;
  const char *bias; /* linear: the folded bias's name */
  float *after, *before; /* count floats, as stored */
} spec;

static uint64_t rng = 12345;
static double gauss(void) {
  rng += 0x9e3779b97f4a7c15ull;
  uint64_t z = rng;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull, z ^= z >> 31;
  double u1 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
  rng += 0x9e3779b97f4a7c15ull;
  z = rng;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull, z ^= z >> 31;
  double u2 = ((double)(z >> 11) + 0.5) / 9007199254740992.0;
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static size_t count_of(const spec *s) {
  size_t n = 1;
  for (size_t d = 0; d < s->ndim; d++) n *= s->shape[d];
  return n;
}

/* Rounds x to what the dtype stores. */
static float stored(float x, const char *dtype) {
  uint16_t h;
  if (!strcmp(dtype, "F16")) return h = stw_f16(x), stab_f16_to_f32(h);
  if (!strcmp(dtype, "BF16")) return h = stw_bf16(x), stab_bf16_to_f32(h);
  return x;
}

static int write_file(const char *path, spec *s, size_t n, const char *dtype, int after) {
  stw_tensor *t = calloc(n, sizeof *t);
  void **bufs = calloc(n, sizeof *bufs);
  for (size_t i = 0; i < n; i++) {
    size_t c = count_of(&s[i]);
    const char *dt = s[i].dtype ? s[i].dtype : dtype;
    const float *x = after ? s[i].after : s[i].before;
    t[i] = (stw_tensor){s[i].name, dt, s[i].ndim, {s[i].shape[0], s[i].shape[1], s[i].shape[2], s[i].shape[3]}, NULL, 0};
    if (!strcmp(dt, "I64")) {
      int64_t *v = malloc(c * 8);
      for (size_t e = 0; e < c; e++) v[e] = (int64_t)e;
      bufs[i] = v, t[i].nbytes = c * 8;
    } else if (!strcmp(dt, "F32")) {
      float *v = malloc(c * 4);
      memcpy(v, x, c * 4);
      bufs[i] = v, t[i].nbytes = c * 4;
    } else {
      uint16_t *v = malloc(c * 2);
      stw_encode16(x, c, !strcmp(dt, "BF16"), v);
      bufs[i] = v, t[i].nbytes = c * 2;
    }
    t[i].data = bufs[i];
  }
  int rc = stw_write(path, t, n, after ? "\"format\": \"pt\", \"source\": \"st_gen\"" : NULL);
  for (size_t i = 0; i < n; i++) free(bufs[i]);
  free(bufs), free(t);
  return rc;
}

/* The same tensors as a GGUF file: shapes outermost first become ne[] fastest first. */
static int write_gguf(const char *path, spec *s, size_t n, const char *dtype, int after) {
  gw_file w;
  gw_init(&w);
  gw_kv_str(&w, "general.architecture", "llama");
  gw_kv_str(&w, "general.name", "st_gen");
  gw_kv_u32(&w, "llama.attention.head_count", 4);
  gw_kv_u32(&w, "llama.attention.head_count_kv", 2);
  gw_kv_f32(&w, "llama.rope.freq_base", 10000.0f);
  const char *toks[] = {"<s>", "</s>", "a", "b"};
  gw_kv_str_array(&w, "tokenizer.ggml.tokens", toks, 4);
  gw_kv_bool(&w, "tokenizer.ggml.add_bos_token", 1);
  for (size_t i = 0; i < n; i++) {
    size_t c = count_of(&s[i]);
    const char *dt = s[i].dtype ? s[i].dtype : dtype;
    uint64_t ne[4];
    for (size_t d = 0; d < s[i].ndim; d++) ne[d] = s[i].shape[s[i].ndim - 1 - d];
    const float *x = after ? s[i].after : s[i].before;
    if (!strcmp(dt, "Q8_0")) {
      gw_tensor(&w, s[i].name, (uint32_t)s[i].ndim, ne, GW_Q8_0, NULL, c / 32 * 34);
    } else if (!strcmp(dt, "F32")) {
      gw_tensor(&w, s[i].name, (uint32_t)s[i].ndim, ne, GW_F32, x, c * 4);
    } else {
      uint16_t *v = malloc(c * 2);
      stw_encode16(x, c, !strcmp(dt, "BF16"), v);
      gw_tensor(&w, s[i].name, (uint32_t)s[i].ndim, ne, !strcmp(dt, "BF16") ? GW_BF16 : GW_F16, v, c * 2);
      free(v);
    }
  }
  return gw_write(&w, path);
}

/* ---- attention logit bounds by brute force, independent of the library ---- */

/* Largest eigenvalue of the symmetric n x n matrix a (destroyed), by cyclic Jacobi rotations
 * until the off-diagonal part is below 1e-30 of the whole. */
static double jacobi_max(double *a, size_t n) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0, all = 0;
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < n; j++) all += a[i * n + j] * a[i * n + j], off += i != j ? a[i * n + j] * a[i * n + j] : 0;
    if (off <= 1e-30 * all) break;
    for (size_t p = 0; p < n; p++)
      for (size_t q = p + 1; q < n; q++) {
        if (a[p * n + q] == 0) continue;
        double theta = (a[q * n + q] - a[p * n + p]) / (2 * a[p * n + q]);
        double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1)), c = 1 / sqrt(t * t + 1), sn = t * c;
        for (size_t k = 0; k < n; k++) { /* A <- J^T A J */
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - sn * akq, a[k * n + q] = sn * akp + c * akq;
        }
        for (size_t k = 0; k < n; k++) {
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - sn * aqk, a[q * n + k] = sn * apk + c * aqk;
        }
      }
  }
  double mx = a[0];
  for (size_t i = 1; i < n; i++) mx = a[i * n + i] > mx ? a[i * n + i] : mx;
  return mx;
}

/* sigma of one head's block: outputs first .. first + dh - 1 of a matrix with d inputs and
 * row stride ld, stored out-major (rows are outputs) or in-major (columns are outputs). */
static double head_sigma(const float *m, size_t ld, int in_major, size_t first, size_t dh, size_t d) {
  double g[64] = {0}; /* dh <= 8 */
  for (size_t a = 0; a < dh; a++)
    for (size_t b = 0; b < dh; b++)
      for (size_t i = 0; i < d; i++) {
        double x = in_major ? m[i * ld + first + a] : m[(first + a) * ld + i];
        double y = in_major ? m[i * ld + first + b] : m[(first + b) * ld + i];
        g[a * dh + b] += x * y;
      }
  return sqrt(jacobi_max(g, dh));
}

/* The attention logit bound per head (docs/manual/metrics.md), s d_h F_q F_k with F = sqrt(d/d_h)
 * sigma, s = 1/sqrt(d_h): lines "<name> <h> <bound>" in heads_out, and the max as a .ref line of
 * kind attention. */
static void attention_ref(FILE *ref, FILE *heads_out, const char *name, const float *q, const float *k, size_t ld,
                          int in_major, size_t kfirst, size_t d, size_t heads, size_t kv, size_t dh) {
  double worst = 0;
  for (size_t h = 0; h < heads; h++) {
    double sq = head_sigma(q, ld, in_major, h * dh, dh, d), sk = head_sigma(k, ld, in_major, kfirst + (h / (heads / kv)) * dh, dh, d);
    double f = sqrt((double)d / (double)dh), bound = (1 / sqrt((double)dh)) * (double)dh * (f * sq) * (f * sk);
    fprintf(heads_out, "%s %zu %.17g\n", name, h, bound);
    worst = bound > worst ? bound : worst;
  }
  if (ref) fprintf(ref, "%s attention %.17g nan nan\n", name, worst);
}

static const spec *find(const spec *s, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s[i].name, name)) return &s[i];
  return NULL;
}

/* GPT-2 124M, HF names and shapes, random weights: the probe's worst case (no spectral gap). */
static int big(const char *prefix, const char *dtype) {
  enum { V = 50257, C = 768, T = 1024, L = 12 };
  spec s[2 + 12 * L + 2];
  static char names[12 * L][48];
  size_t n = 0, k = 0;
  s[n++] = (spec){"wte.weight", NULL, 2, {V, C}, 0, 0, NULL, NULL, NULL};
  s[n++] = (spec){"wpe.weight", NULL, 2, {T, C}, 0, 0, NULL, NULL, NULL};
  static const struct { const char *what; size_t ndim, r, c; } per[] = {
      {"ln_1.weight", 1, C, 0},          {"ln_1.bias", 1, C, 0},          {"attn.c_attn.weight", 2, C, 3 * C},
      {"attn.c_attn.bias", 1, 3 * C, 0}, {"attn.c_proj.weight", 2, C, C}, {"attn.c_proj.bias", 1, C, 0},
      {"ln_2.weight", 1, C, 0},          {"ln_2.bias", 1, C, 0},          {"mlp.c_fc.weight", 2, C, 4 * C},
      {"mlp.c_fc.bias", 1, 4 * C, 0},    {"mlp.c_proj.weight", 2, 4 * C, C}, {"mlp.c_proj.bias", 1, C, 0}};
  for (int l = 0; l < L; l++)
    for (int j = 0; j < 12; j++, k++) {
      snprintf(names[k], sizeof names[k], "h.%d.%s", l, per[j].what);
      s[n++] = (spec){names[k], NULL, per[j].ndim, {per[j].r, per[j].c}, 0, 0, NULL, NULL, NULL};
    }
  s[n++] = (spec){"ln_f.weight", NULL, 1, {C}, 0, 0, NULL, NULL, NULL};
  s[n++] = (spec){"ln_f.bias", NULL, 1, {C}, 0, 0, NULL, NULL, NULL};
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t c = count_of(&s[i]);
    total += c;
    if (!(s[i].after = malloc(c * sizeof(float)))) return perror("st_gen"), 1;
    for (size_t e = 0; e < c; e++) s[i].after[e] = (float)(0.02 * gauss());
  }
  char path[1024];
  snprintf(path, sizeof path, "%s.safetensors", prefix);
  if (write_file(path, s, n, dtype, 1)) return perror(path), 1;
  fprintf(stderr, "st_gen: %s: %zu tensors, %zu parameters\n", path, n, total);
  for (size_t i = 0; i < n; i++) free(s[i].after);
  return 0;
}

/* ---- llm.c ---- */

static int write_llmc(const char *path, const float *p, size_t n, int bf16, const int32_t *hdr) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int32_t h[256] = {0};
  memcpy(h, hdr, 8 * sizeof *h);
  int ok = fwrite(h, sizeof h, 1, f) == 1; /* the host is little-endian, as llm.c assumes */
  for (size_t i = 0; ok && i < n; i++) {
    if (bf16) {
      uint16_t b = stw_bf16(p[i]);
      ok = fwrite(&b, 2, 1, f) == 1;
    } else ok = fwrite(&p[i], 4, 1, f) == 1;
  }
  return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int ref_line(FILE *ref, const char *name, stab_layer *L, stab_layer *B) {
  stab_metrics m;
  double heads[8];
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.method = STAB_SPECTRAL_EXACT;
  if (stab_layer_metrics(L, L->kind == STAB_KIND_ATTENTION ? NULL : B, &mp, &m, heads) != STAB_OK) {
    fprintf(stderr, "st_gen: %s: %s\n", name, stab_last_error());
    return 1;
  }
  fprintf(ref, "%s %s %.17g %.17g %.17g\n", name, stab_kind_name(L->kind), m.forward, m.dependency, m.update);
  return 0;
}

static int llmc(const char *prefix, const char *dtype) {
  enum { V = 50, Vp = 64, T = 8, L = 2, NH = 2, C = 16 };
  int bf16 = !strcmp(dtype, "BF16");
  const int32_t hdr[8] = {20240326, bf16 ? 5 : 3, T, V, L, NH, C, Vp};
  const size_t n = (size_t)Vp * C + T * C + L * (13 * C + 12 * C * C) + 2 * C;
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  if (!a || !b) return 1;
  for (size_t i = 0; i < n; i++) {
    float x = (float)(0.3 * gauss());
    b[i] = stored(x, dtype);
    a[i] = stored((float)(x + 0.003 * gauss()), dtype);
  }
  for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) a[i] = b[i] = 1e6f; /* padding */
  char path[1024];
  snprintf(path, sizeof path, "%s.bin", prefix);
  if (write_llmc(path, a, n, bf16, hdr)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.prev.bin", prefix);
  if (write_llmc(path, b, n, bf16, hdr)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.ref", prefix);
  FILE *ref = fopen(path, "w");
  if (!ref) return perror(path), 1;
  /* offsets in llm.c's order, written out independently of the reader */
  size_t wte = 0, wpe = wte + (size_t)Vp * C, ln1w = wpe + (size_t)T * C, ln1b = ln1w + L * C, qkvw = ln1b + L * C,
         qkvb = qkvw + (size_t)L * 3 * C * C, attw = qkvb + L * 3 * C, attb = attw + (size_t)L * C * C,
         ln2w = attb + L * C, ln2b = ln2w + L * C, fcw = ln2b + L * C, fcb = fcw + (size_t)L * 4 * C * C,
         fcpw = fcb + L * 4 * C, fcpb = fcpw + (size_t)L * 4 * C * C, lnfw = fcpb + L * C, lnfb = lnfw + C;
  int rc = 0;
/* n1, n2: d_in and d_out, or for a table (embedding, lm_head) vocab and width */
#define LAYER(nm, k, n1, n2, off, boff)                                                             \
  do {                                                                                               \
    stab_layer x = {.kind = (k), .weight = a + (off), .bias = (boff) == (size_t)-1 ? NULL : a + (boff)}; \
    if ((k) == STAB_KIND_EMBEDDING || (k) == STAB_KIND_LM_HEAD) x.vocab = (n1), x.width = (n2);      \
    else x.d_in = (n1), x.d_out = (n2);                                                              \
    stab_layer y = x;                                                                                \
    y.weight = b + (off), y.bias = (boff) == (size_t)-1 ? NULL : b + (boff);                        \
    rc |= ref_line(ref, nm, &x, &y);                                                                 \
  } while (0)
  const size_t none = (size_t)-1;
  LAYER("wte", STAB_KIND_EMBEDDING, V, C, wte, none);
  LAYER("wte", STAB_KIND_LM_HEAD, V, C, wte, none);
  LAYER("wpe", STAB_KIND_EMBEDDING, T, C, wpe, none);
  char nm[64];
  for (size_t l = 0; l < L; l++) {
    snprintf(nm, sizeof nm, "h.%zu.ln_1.weight", l); LAYER(nm, STAB_KIND_GAIN, C, C, ln1w + l * C, none);
    snprintf(nm, sizeof nm, "h.%zu.ln_1.bias", l); LAYER(nm, STAB_KIND_BIAS, C, C, ln1b + l * C, none);
    for (size_t p = 0; p < 3; p++) {
      snprintf(nm, sizeof nm, "h.%zu.attn.%c.weight", l, "qkv"[p]);
      LAYER(nm, STAB_KIND_LINEAR, C, C, qkvw + (l * 3 + p) * C * C, qkvb + (l * 3 + p) * C);
    }
    snprintf(nm, sizeof nm, "h.%zu.attn.logits", l);
    stab_layer at = {.kind = STAB_KIND_ATTENTION, .d_in = C, .d_out = C, .heads = NH,
                     .weight = a + qkvw + l * 3 * C * C, .weight_k = a + qkvw + (l * 3 + 1) * C * C};
    rc |= ref_line(ref, nm, &at, NULL);
    snprintf(nm, sizeof nm, "h.%zu.attn.proj.weight", l); LAYER(nm, STAB_KIND_LINEAR, C, C, attw + l * C * C, attb + l * C);
    snprintf(nm, sizeof nm, "h.%zu.ln_2.weight", l); LAYER(nm, STAB_KIND_GAIN, C, C, ln2w + l * C, none);
    snprintf(nm, sizeof nm, "h.%zu.ln_2.bias", l); LAYER(nm, STAB_KIND_BIAS, C, C, ln2b + l * C, none);
    snprintf(nm, sizeof nm, "h.%zu.mlp.fc.weight", l); LAYER(nm, STAB_KIND_LINEAR, C, 4 * C, fcw + l * 4 * C * C, fcb + l * 4 * C);
    snprintf(nm, sizeof nm, "h.%zu.mlp.proj.weight", l); LAYER(nm, STAB_KIND_LINEAR, 4 * C, C, fcpw + l * 4 * C * C, fcpb + l * C);
  }
  LAYER("ln_f.weight", STAB_KIND_GAIN, C, C, lnfw, none);
  LAYER("ln_f.bias", STAB_KIND_BIAS, C, C, lnfb, none);
#undef LAYER
  fclose(ref);
  free(a), free(b);
  return rc;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[2], "gpt2-124m")) return big(argv[1], argv[3]);
  if (argc >= 4 && !strcmp(argv[2], "llmc")) return llmc(argv[1], argv[3]);
  if (argc < 4 || (strcmp(argv[2], "gpt2") && strcmp(argv[2], "llama") && strcmp(argv[2], "gguf"))) {
    fprintf(stderr, "usage: st_gen OUT_PREFIX gpt2|llama|gguf F32|F16|BF16 [NONFINITE]\n");
    return 2;
  }
  const char *dtype = argv[3];
  int nonfinite = argc > 4;
  enum { V = 50, D = 16, T = 8 };
  spec g[] = {
      {"wte.weight", NULL, 2, {V, D}, STAB_KIND_EMBEDDING, 0, NULL, NULL, NULL},
      {"wpe.weight", NULL, 2, {T, D}, STAB_KIND_EMBEDDING, 0, NULL, NULL, NULL},
      {"h.0.ln_1.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"h.0.ln_1.bias", NULL, 1, {D}, STAB_KIND_BIAS, 0, NULL, NULL, NULL},
      {"h.0.attn.bias", "F32", 4, {1, 1, T, T}, -1, 0, NULL, NULL, NULL},
      {"h.0.attn.c_attn.weight", NULL, 2, {D, 3 * D}, STAB_KIND_LINEAR, 1, "h.0.attn.c_attn.bias", NULL, NULL},
      {"h.0.attn.c_attn.bias", NULL, 1, {3 * D}, -1, 0, NULL, NULL, NULL},
      {"h.0.attn.c_proj.weight", NULL, 2, {D, D}, STAB_KIND_LINEAR, 1, "h.0.attn.c_proj.bias", NULL, NULL},
      {"h.0.attn.c_proj.bias", NULL, 1, {D}, -1, 0, NULL, NULL, NULL},
      {"h.0.mlp.c_fc.weight", NULL, 2, {D, 4 * D}, STAB_KIND_LINEAR, 1, "h.0.mlp.c_fc.bias", NULL, NULL},
      {"h.0.mlp.c_fc.bias", NULL, 1, {4 * D}, -1, 0, NULL, NULL, NULL},
      {"h.0.mlp.c_proj.weight", NULL, 2, {4 * D, D}, STAB_KIND_LINEAR, 1, "h.0.mlp.c_proj.bias", NULL, NULL},
      {"h.0.mlp.c_proj.bias", NULL, 1, {D}, -1, 0, NULL, NULL, NULL},
      {"ln_f.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"position_ids", "I64", 2, {1, T}, -1, 0, NULL, NULL, NULL},
  };
  spec l[] = {
      {"model.embed_tokens.weight", NULL, 2, {V, D}, STAB_KIND_EMBEDDING, 0, NULL, NULL, NULL},
      {"model.layers.0.input_layernorm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"model.layers.0.self_attn.q_proj.weight", NULL, 2, {24, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"model.layers.0.self_attn.k_proj.weight", NULL, 2, {12, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"model.layers.0.mlp.down_proj.weight", NULL, 2, {D, 40}, STAB_KIND_LINEAR, 0, "model.layers.0.mlp.down_proj.bias", NULL, NULL},
      {"model.layers.0.mlp.down_proj.bias", NULL, 1, {D}, -1, 0, NULL, NULL, NULL},
      {"model.layers.0.experts", NULL, 3, {2, 4, 4}, -1, 0, NULL, NULL, NULL},
      {"model.norm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"lm_head.weight", NULL, 2, {V, D}, STAB_KIND_LM_HEAD, 0, NULL, NULL, NULL},
  };
  /* llama.cpp names; shapes outermost first (attn_k: ne = {16, 8}, 2 heads of 4) */
  spec q[] = {
      {"token_embd.weight", NULL, 2, {V, D}, STAB_KIND_EMBEDDING, 0, NULL, NULL, NULL},
      {"rope_freqs.weight", "F32", 1, {2}, -1, 0, NULL, NULL, NULL},
      {"blk.0.attn_norm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"blk.0.attn_q.weight", NULL, 2, {D, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"blk.0.attn_k.weight", NULL, 2, {D / 2, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"blk.0.attn_v.weight", NULL, 2, {D / 2, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"blk.0.attn_output.weight", NULL, 2, {D, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"blk.0.ffn_norm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"blk.0.ffn_gate.weight", NULL, 2, {40, D}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"blk.0.ffn_up.weight", "Q8_0", 2, {40, 32}, -1, 0, NULL, NULL, NULL},
      {"blk.0.ffn_down.weight", NULL, 2, {D, 40}, STAB_KIND_LINEAR, 0, NULL, NULL, NULL},
      {"output_norm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
  };
  int gpt2 = !strcmp(argv[2], "gpt2"), gguf = !strcmp(argv[2], "gguf");
  spec *s = gpt2 ? g : gguf ? q : l;
  size_t n = gpt2 ? sizeof g / sizeof g[0] : gguf ? sizeof q / sizeof q[0] : sizeof l / sizeof l[0];
  const char *tied_name = gpt2 ? "wte.weight" : gguf ? "token_embd.weight" : NULL;
  for (size_t i = 0; i < n; i++) {
    size_t c = count_of(&s[i]);
    const char *dt = s[i].dtype ? s[i].dtype : dtype;
    s[i].after = malloc(c * sizeof(float));
    s[i].before = malloc(c * sizeof(float));
    double std = s[i].kind == STAB_KIND_GAIN ? 0.1 : s[i].kind == STAB_KIND_EMBEDDING ? 1.0 : 0.2;
    double mean = s[i].kind == STAB_KIND_GAIN ? 1.0 : 0.0;
    for (size_t e = 0; e < c; e++) {
      float b = (float)(mean + std * gauss());
      s[i].before[e] = stored(b, dt);
      s[i].after[e] = stored((float)(b + 0.01 * std * gauss()), dt);
    }
  }
  if (nonfinite) s[gpt2 ? 7 : 2].after[3] = NAN; /* one linear layer holds a NaN */
  char path[1024];
  snprintf(path, sizeof path, "%s.%s", argv[1], gguf ? "gguf" : "safetensors");
  if ((gguf ? write_gguf : write_file)(path, s, n, dtype, 1)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.prev.%s", argv[1], gguf ? "gguf" : "safetensors");
  if ((gguf ? write_gguf : write_file)(path, s, n, dtype, 0)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.ref", argv[1]);
  FILE *ref = fopen(path, "w");
  if (!ref) return perror(path), 1;
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.method = STAB_SPECTRAL_EXACT;
  for (size_t i = 0; i < n; i++) {
    if (s[i].kind < 0) continue;
    /* GPT-2's fused in-major c_attn [D][3D] is three layers, q, k and v: column blocks of the
     * stored rows of 3D (ld), each with its third of the bias, named as the probe names them */
    const size_t len = strlen(s[i].name);
    const int fused = s[i].kind == STAB_KIND_LINEAR && s[i].in_major && len > 13 && !strcmp(s[i].name + len - 13, "c_attn.weight");
    for (int part = 0; part < (fused ? 3 : 1); part++)
    for (int tied = 0; tied < 2; tied++) {
      int kind = s[i].kind;
      if (tied) {
        if (!tied_name || strcmp(s[i].name, tied_name)) break;
        kind = STAB_KIND_LM_HEAD; /* the tied head of the GPT-2 and GGUF models */
      }
      char pname[256];
      if (fused) snprintf(pname, sizeof pname, "%.*s.%c", (int)(len - 7), s[i].name, "qkv"[part]);
      else snprintf(pname, sizeof pname, "%s", s[i].name);
      stab_layer L = {.name = pname, .kind = kind, .weight = s[i].after};
      stab_layer B = L;
      B.weight = s[i].before;
      size_t r = s[i].shape[0], c = s[i].ndim == 2 ? s[i].shape[1] : 0;
      if (kind == STAB_KIND_LINEAR) {
        L.layout = s[i].in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR;
        L.d_in = s[i].in_major ? r : c, L.d_out = s[i].in_major ? c : r;
        if (s[i].bias) L.bias = find(s, n, s[i].bias)->after, B.bias = find(s, n, s[i].bias)->before;
        if (fused) {
          const size_t w = c / 3;
          L.d_out = w, L.ld = c;
          L.weight += part * w, B.weight += part * w;
          L.bias += part * w, B.bias += part * w;
        }
      } else if (kind == STAB_KIND_EMBEDDING || kind == STAB_KIND_LM_HEAD) L.vocab = r, L.width = c; /* [V][d] */
      else L.d_in = L.d_out = r;
      B.layout = L.layout, B.d_in = L.d_in, B.d_out = L.d_out, B.vocab = L.vocab, B.width = L.width, B.ld = L.ld;
      stab_metrics m;
      if (stab_layer_metrics(&L, &B, &mp, &m, NULL) != STAB_OK) {
        fprintf(stderr, "st_gen: %s: %s\n", pname, stab_last_error());
        return 1;
      }
      fprintf(ref, "%s %s %.17g %.17g %.17g\n", pname, stab_kind_name(kind), m.forward, m.dependency, m.update);
    }
  }
  /* attention, as stored: GPT-2's fused in-major c_attn (2 heads of 8: the probe needs
   * --heads 2), Llama's q_proj/k_proj (4 query heads of 6, 2 key heads; heads from the
   * config.json written beside), GGUF's attn_q/attn_k (4 heads of 4, 2 key heads) */
  snprintf(path, sizeof path, "%s.heads", argv[1]);
  FILE *hf = fopen(path, "w");
  if (!hf) return perror(path), 1;
  if (gpt2) {
    const float *w = find(s, n, "h.0.attn.c_attn.weight")->after;
    attention_ref(NULL, hf, "h.0.attn.logits", w, w, 3 * D, 1, D, D, 2, 2, D / 2);
  } else if (gguf) {
    attention_ref(ref, hf, "blk.0.attn_logits", find(s, n, "blk.0.attn_q.weight")->after,
                  find(s, n, "blk.0.attn_k.weight")->after, D, 0, 0, D, 4, 2, 4);
  } else {
    attention_ref(ref, hf, "model.layers.0.self_attn.logits", find(s, n, "model.layers.0.self_attn.q_proj.weight")->after,
                  find(s, n, "model.layers.0.self_attn.k_proj.weight")->after, D, 0, 0, D, 4, 2, 6);
    const char *slash = strrchr(argv[1], '/');
    snprintf(path, sizeof path, "%.*sconfig.json", slash ? (int)(slash - argv[1] + 1) : 0, argv[1]);
    FILE *cf = fopen(path, "w");
    if (!cf) return perror(path), 1;
    fprintf(cf, "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"hidden_size\": %d,\n"
                "  \"num_attention_heads\": 4,\n  \"num_key_value_heads\": 2\n}\n", D);
    if (fclose(cf)) return perror(path), 1;
  }
  if (fclose(hf)) return perror(path), 1;
  fclose(ref);
  for (size_t i = 0; i < n; i++) free(s[i].after), free(s[i].before);
  return 0;
}
