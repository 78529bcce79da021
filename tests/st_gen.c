/* st_gen.c — test helper for tests/probe.sh: writes a small model checkpoint in safetensors
 * (GPT-2 HF names, tied, with Conv1D in-major weights, a 4-D mask buffer and an integer
 * tensor; or Llama names with an untied lm_head), the same model one random step earlier,
 * and the expected metrics of every layer computed by stab_layer_metrics in exact mode from
 * the values as stored (after f16/bf16 rounding). Its kinds and layouts are written out by
 * hand here, independently of the probe's rule table.
 * Usage: st_gen OUT_PREFIX gpt2|llama F32|F16|BF16 [NONFINITE]
 * writes OUT_PREFIX.safetensors, OUT_PREFIX.prev.safetensors and OUT_PREFIX.ref, one line
 * per layer: name kind forward dependency update (nan where undefined). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static const spec *find(const spec *s, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s[i].name, name)) return &s[i];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[2], "gpt2") && strcmp(argv[2], "llama"))) {
    fprintf(stderr, "usage: st_gen OUT_PREFIX gpt2|llama F32|F16|BF16 [NONFINITE]\n");
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
      {"model.layers.0.mlp.down_proj.weight", NULL, 2, {D, 40}, STAB_KIND_LINEAR, 0, "model.layers.0.mlp.down_proj.bias", NULL, NULL},
      {"model.layers.0.mlp.down_proj.bias", NULL, 1, {D}, -1, 0, NULL, NULL, NULL},
      {"model.layers.0.experts", NULL, 3, {2, 4, 4}, -1, 0, NULL, NULL, NULL},
      {"model.norm.weight", NULL, 1, {D}, STAB_KIND_GAIN, 0, NULL, NULL, NULL},
      {"lm_head.weight", NULL, 2, {V, D}, STAB_KIND_LM_HEAD, 0, NULL, NULL, NULL},
  };
  int gpt2 = !strcmp(argv[2], "gpt2");
  spec *s = gpt2 ? g : l;
  size_t n = gpt2 ? sizeof g / sizeof g[0] : sizeof l / sizeof l[0];
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
  snprintf(path, sizeof path, "%s.safetensors", argv[1]);
  if (write_file(path, s, n, dtype, 1)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.prev.safetensors", argv[1]);
  if (write_file(path, s, n, dtype, 0)) return perror(path), 1;
  snprintf(path, sizeof path, "%s.ref", argv[1]);
  FILE *ref = fopen(path, "w");
  if (!ref) return perror(path), 1;
  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.method = STAB_SPECTRAL_EXACT;
  for (size_t i = 0; i < n; i++) {
    if (s[i].kind < 0) continue;
    for (int tied = 0; tied < 2; tied++) {
      int kind = s[i].kind;
      if (tied) {
        if (!gpt2 || strcmp(s[i].name, "wte.weight")) break;
        kind = STAB_KIND_LM_HEAD; /* the tied head of the GPT-2 model */
      }
      stab_layer L = {.name = s[i].name, .kind = kind, .weight = s[i].after};
      stab_layer B = L;
      B.weight = s[i].before;
      size_t r = s[i].shape[0], c = s[i].ndim == 2 ? s[i].shape[1] : 0;
      if (kind == STAB_KIND_LINEAR) {
        L.layout = s[i].in_major ? STAB_LAYOUT_IN_MAJOR : STAB_LAYOUT_OUT_MAJOR;
        L.d_in = s[i].in_major ? r : c, L.d_out = s[i].in_major ? c : r;
        if (s[i].bias) L.bias = find(s, n, s[i].bias)->after, B.bias = find(s, n, s[i].bias)->before;
      } else if (kind == STAB_KIND_EMBEDDING) L.d_in = r, L.d_out = c;
      else if (kind == STAB_KIND_LM_HEAD) L.d_in = c, L.d_out = r;
      else L.d_in = L.d_out = r;
      B.layout = L.layout, B.d_in = L.d_in, B.d_out = L.d_out;
      stab_metrics m;
      if (stab_layer_metrics(&L, &B, &mp, &m, NULL) != STAB_OK) {
        fprintf(stderr, "st_gen: %s: %s\n", s[i].name, stab_last_error());
        return 1;
      }
      fprintf(ref, "%s %s %.17g %.17g %.17g\n", s[i].name, stab_kind_name(kind), m.forward, m.dependency, m.update);
    }
  }
  fclose(ref);
  for (size_t i = 0; i < n; i++) free(s[i].after), free(s[i].before);
  return 0;
}
