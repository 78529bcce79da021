/* hf_gen.c — writes a Llama-shaped model in the Hugging Face layout (config.json,
 * model.safetensors.index.json, model-0000K-of-0000N.safetensors) with random BF16 weights, for
 * timing the probe at scale (bench/probe_speed.sh --model). Streamed: a few MiB of buffer
 * whatever the model's size, values from a counter-based PRNG so that threads fill a buffer
 * in parallel. Never committed: it writes gigabytes.
 *
 * Usage: hf_gen DIR llama7b|tinyllama|tiny [--shards N] [--seed S]
 *   llama7b    Llama-2-7B's shapes: V 32000, d 4096, ff 11008, 32 layers, 32 heads (13.5 GB)
 *   tinyllama  TinyLlama-1.1B's: V 32000, d 2048, ff 5632, 22 layers, 32 heads, 4 KV heads (2.2 GB)
 *   tiny       a toy of the same layout (V 256, d 64, ff 160, 2 layers, 4 heads, 2 KV heads)
 * Weights: linears, embedding and head approximately N(0, 0.02^2) (a sum of four uniforms,
 * within 3.5 sigma), norm gains 1 + N(0, 0.02^2)-ish, rounded to nearest-even BF16. Each block
 * sits wholly in one shard; the shards are about equal in size. The index is written last, so
 * a directory with an index is complete. A target with too little free space is refused
 * before anything is written. Exit 0, 1 on an I/O failure or too little space, 2 bad usage. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

typedef struct {
  const char *name;
  size_t vocab, d, ff, layers, heads, kv_heads;
} preset;

static const preset presets[] = {
    {"llama7b", 32000, 4096, 11008, 32, 32, 32},
    {"tinyllama", 32000, 2048, 5632, 22, 32, 4},
    {"tiny", 256, 64, 160, 2, 4, 2},
};

enum { MAX_NAME = 80 };

/* One tensor of the model: name, 1-D or 2-D shape (rows x cols, cols 0 for 1-D), the std of
 * its values around `mean`, and the shard it goes into. */
typedef struct {
  char name[MAX_NAME];
  uint64_t rows, cols;
  double mean, std;
  int block;      /* the transformer block it belongs to, -1 for embed/norm/head */
  int shard;      /* 0-based */
  uint64_t begin; /* data offset within its shard */
} tensor;

static uint64_t count_of(const tensor *t) { return t->cols ? t->rows * t->cols : t->rows; }

static void add(tensor *ts, size_t *n, const char *name, uint64_t rows, uint64_t cols, double mean, int block) {
  tensor *t = &ts[(*n)++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->rows = rows, t->cols = cols, t->mean = mean, t->std = 0.02, t->block = block;
}

/* The model's tensors in Llama's order and names. Returns how many (at most cap). */
static size_t model_tensors(const preset *p, tensor *ts) {
  size_t n = 0;
  const uint64_t dh = p->d / p->heads, kv = p->kv_heads * dh;
  char name[MAX_NAME];
  add(ts, &n, "model.embed_tokens.weight", p->vocab, p->d, 0.0, -1);
  for (size_t l = 0; l < p->layers; l++) {
    const int b = (int)l;
#define BLOCK(suffix, r, c, mean)                                          \
  snprintf(name, sizeof name, "model.layers.%zu.%s", l, suffix);          \
  add(ts, &n, name, r, c, mean, b)
    BLOCK("input_layernorm.weight", p->d, 0, 1.0);
    BLOCK("self_attn.q_proj.weight", p->d, p->d, 0.0);
    BLOCK("self_attn.k_proj.weight", kv, p->d, 0.0);
    BLOCK("self_attn.v_proj.weight", kv, p->d, 0.0);
    BLOCK("self_attn.o_proj.weight", p->d, p->d, 0.0);
    BLOCK("post_attention_layernorm.weight", p->d, 0, 1.0);
    BLOCK("mlp.gate_proj.weight", p->ff, p->d, 0.0);
    BLOCK("mlp.up_proj.weight", p->ff, p->d, 0.0);
    BLOCK("mlp.down_proj.weight", p->d, p->ff, 0.0);
#undef BLOCK
  }
  add(ts, &n, "model.norm.weight", p->d, 0, 1.0, -1);
  add(ts, &n, "lm_head.weight", p->vocab, p->d, 0.0, -1);
  return n;
}

/* Splits the tensors into `shards` runs of about equal bytes, never splitting a block: a
 * shard ends once its bytes reach its share of the total. */
static void assign_shards(tensor *ts, size_t n, int shards) {
  uint64_t total = 0, done = 0;
  for (size_t i = 0; i < n; i++) total += 2 * count_of(&ts[i]);
  int s = 0;
  for (size_t i = 0; i < n; i++) {
    /* a new shard starts only between blocks (or before the final norm and head) */
    int boundary = i > 0 && (ts[i].block != ts[i - 1].block);
    if (boundary && s < shards - 1 && done >= total / (uint64_t)shards * (uint64_t)(s + 1)) s++;
    ts[i].shard = s;
    done += 2 * count_of(&ts[i]);
  }
}

/* ---- values: counter-based, so any element is computable on its own ---- */

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Four 16-bit uniforms summed: mean 2 * 65535, variance 4 * (65536^2 - 1) / 12. */
static uint16_t bf16_value(uint64_t key, uint64_t i, double mean, double std) {
  uint64_t z = mix(key + i * 0x9e3779b97f4a7c15ull);
  double s = (double)(z & 0xffff) + (double)((z >> 16) & 0xffff) + (double)((z >> 32) & 0xffff) + (double)(z >> 48);
  const double centre = 2.0 * 65535.0, sd = 65536.0 / 1.7320508075688772; /* sqrt(4/12) * 65536 */
  float x = (float)(mean + std * (s - centre) / sd);
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest even (no NaN can arise here) */
  return (uint16_t)(bits >> 16);
}

/* ---- files ---- */

static int fail_io(const char *what, const char *path) {
  fprintf(stderr, "hf_gen: %s '%s': %s\n", what, path, strerror(errno));
  return 1;
}

static void shard_name(char *buf, size_t cap, int k, int shards) {
  snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, shards);
}

/* The safetensors header of shard k (its tensors' begin offsets set), padded with spaces to a
 * multiple of 8 bytes so the data that follows is 8-aligned. Returns its length, 0 if cap is short. */
static size_t shard_header(tensor *ts, size_t n, int k, char *buf, size_t cap) {
  size_t len = 0;
  uint64_t off = 0;
  len += (size_t)snprintf(buf + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (size_t i = 0; i < n && len < cap; i++) {
    if (ts[i].shard != k) continue;
    uint64_t bytes = 2 * count_of(&ts[i]);
    ts[i].begin = off;
    if (ts[i].cols)
      len += (size_t)snprintf(buf + len, cap - len,
                              ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64 ",%" PRIu64 "],\"data_offsets\":[%" PRIu64
                              ",%" PRIu64 "]}",
                              ts[i].name, ts[i].rows, ts[i].cols, off, off + bytes);
    else
      len += (size_t)snprintf(buf + len, cap - len,
                              ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" PRIu64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                              ts[i].name, ts[i].rows, off, off + bytes);
    off += bytes;
  }
  if (len + 8 >= cap) return 0;
  buf[len++] = '}';
  while (len % 8) buf[len++] = ' ';
  buf[len] = '\0';
  return len;
}

enum { CHUNK = 1 << 21 }; /* elements per buffer: 4 MiB */

static int write_shard(const char *dir, tensor *ts, size_t n, int k, int shards, uint64_t seed, uint16_t *buf) {
  char name[64], path[4096];
  shard_name(name, sizeof name, k, shards);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t cap = 1 << 20;
  char *header = malloc(cap);
  if (!header) return fprintf(stderr, "hf_gen: out of memory\n"), 1;
  size_t hlen = shard_header(ts, n, k, header, cap);
  FILE *f = hlen ? fopen(path, "wb") : NULL;
  if (!hlen) fprintf(stderr, "hf_gen: header of %s too long\n", name);
  if (!f) {
    free(header);
    return hlen ? fail_io("cannot create", path) : 1;
  }
  unsigned char len8[8];
  for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
  int bad = fwrite(len8, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen;
  free(header);
  for (size_t i = 0; i < n && !bad; i++) {
    if (ts[i].shard != k) continue;
    const uint64_t total = count_of(&ts[i]), key = mix(seed ^ mix(i + 1));
    for (uint64_t e = 0; e < total && !bad; e += CHUNK) {
      const size_t m = total - e < CHUNK ? (size_t)(total - e) : CHUNK;
#pragma omp parallel for schedule(static)
      for (size_t j = 0; j < m; j++) buf[j] = bf16_value(key, e + j, ts[i].mean, ts[i].std);
      /* little-endian on disk: swap on a big-endian host */
      const uint16_t one = 1;
      if (*(const unsigned char *)&one != 1)
        for (size_t j = 0; j < m; j++) buf[j] = (uint16_t)((buf[j] >> 8) | (buf[j] << 8));
      bad = fwrite(buf, 2, m, f) != m;
    }
  }
  if (fclose(f) != 0 || bad) return fail_io("cannot write", path);
  return 0;
}

static int write_text(const char *dir, const char *file, const char *text) {
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return fail_io("cannot create", tmp);
  int bad = fputs(text, f) < 0;
  if (fclose(f) != 0 || bad) return fail_io("cannot write", tmp);
  if (rename(tmp, path) != 0) return fail_io("cannot rename to", path);
  return 0;
}

static int usage(void) {
  fprintf(stderr, "usage: hf_gen DIR llama7b|tinyllama|tiny [--shards N] [--seed S]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const char *dir = argv[1];
  const preset *p = NULL;
  for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
    if (!strcmp(argv[2], presets[i].name)) p = &presets[i];
  if (!p) return usage();
  int shards = 3;
  uint64_t seed = 1;
  for (int a = 3; a < argc; a++) {
    char *end;
    if (!strcmp(argv[a], "--shards") && a + 1 < argc) {
      long v = strtol(argv[++a], &end, 10);
      if (*end || v < 1 || v > 99) return usage();
      shards = (int)v;
    } else if (!strcmp(argv[a], "--seed") && a + 1 < argc) {
      seed = strtoull(argv[++a], &end, 10);
      if (*end) return usage();
    } else {
      return usage();
    }
  }
  size_t cap = 1 + 9 * p->layers + 2;
  tensor *ts = calloc(cap, sizeof *ts);
  uint16_t *buf = malloc((size_t)CHUNK * sizeof *buf);
  if (!ts || !buf) return fprintf(stderr, "hf_gen: out of memory\n"), 1;
  size_t n = model_tensors(p, ts);
  assign_shards(ts, n, shards);
  uint64_t total = 0, params = 0;
  for (size_t i = 0; i < n; i++) total += 2 * count_of(&ts[i]), params += count_of(&ts[i]);

  if (mkdir(dir, 0777) != 0 && errno != EEXIST) return fail_io("cannot create directory", dir);
  /* Up front: a disk that fills halfway leaves gigabytes of useless shards. A model already
   * there (being rewritten) counts as free. */
  struct statvfs sv;
  if (statvfs(dir, &sv) != 0) return fail_io("cannot stat the file system of", dir);
  uint64_t avail = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize, old = 0;
  for (int k = 0; k < shards; k++) {
    char name[64], path[4096];
    struct stat st;
    shard_name(name, sizeof name, k, shards);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (stat(path, &st) == 0) old += (uint64_t)st.st_size;
  }
  const uint64_t margin = 256ull << 20;
  if (avail + old < total + margin) {
    fprintf(stderr,
            "hf_gen: %s needs %.2f GB in '%s' (plus 0.25 GB to spare), and its file system has %.2f GB free: "
            "choose another directory or free some space\n",
            p->name, total / 1e9, dir, (avail + old) / 1e9);
    return 1;
  }
  /* the index goes last: remove an old one first, so an interrupted run leaves none */
  char ipath[4096];
  snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
  if (remove(ipath) != 0 && errno != ENOENT) return fail_io("cannot remove", ipath);

  char config[2048];
  snprintf(config, sizeof config,
           "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
           "  \"hidden_size\": %zu,\n  \"intermediate_size\": %zu,\n  \"num_hidden_layers\": %zu,\n"
           "  \"num_attention_heads\": %zu,\n  \"num_key_value_heads\": %zu,\n  \"head_dim\": %zu,\n"
           "  \"vocab_size\": %zu,\n  \"tie_word_embeddings\": false,\n  \"rms_norm_eps\": 1e-05,\n"
           "  \"torch_dtype\": \"bfloat16\",\n  \"stabmeter_generator\": \"hf_gen %s seed %" PRIu64 " shards %d\"\n}\n",
           p->d, p->ff, p->layers, p->heads, p->kv_heads, p->d / p->heads, p->vocab, p->name, seed, shards);
  if (write_text(dir, "config.json", config)) return 1;
  for (int k = 0; k < shards; k++)
    if (write_shard(dir, ts, n, k, shards, seed, buf)) return 1;

  size_t icap = 256 + n * (MAX_NAME + 48), len = 0;
  char *index = malloc(icap);
  if (!index) return fprintf(stderr, "hf_gen: out of memory\n"), 1;
  len += (size_t)snprintf(index + len, icap - len, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {", total);
  for (size_t i = 0; i < n; i++) {
    char name[64];
    shard_name(name, sizeof name, ts[i].shard, shards);
    len += (size_t)snprintf(index + len, icap - len, "%s\n    \"%s\": \"%s\"", i ? "," : "", ts[i].name, name);
  }
  snprintf(index + len, icap - len, "\n  }\n}\n");
  if (write_text(dir, "model.safetensors.index.json", index)) return 1;
  printf("%s: %s, %" PRIu64 " parameters, %.2f GB in %d shards\n", dir, p->name, params, total / 1e9, shards);
  free(index), free(ts), free(buf);
  return 0;
}
