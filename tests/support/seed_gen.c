/* seed_gen.c — writes the smallest valid checkpoints of each reader's format for the fuzzers'
 * seed corpora (tests/fuzz/fuzz.sh adds the larger model-shaped files of tests/support/st_gen): small
 * inputs let libFuzzer spend its mutations on the index rather than on data bytes.
 * Usage: seed_gen DIR   writes DIR/safetensors/, DIR/llmc/, DIR/gguf/ and DIR/gguf_split/ (DIR must exist).
 * safetensors: every dtype the format names, a scalar and a zero-sized tensor, metadata with
 * escapes, and F16/BF16/F32 data holding every class of value (zeros, subnormals, infinities,
 * NaNs); llmc: one-block models in f32 and bf16 with every header field distinct; gguf: one
 * block of each quantized type the library decodes (a file each, and all in one file), so that
 * the fuzzer starts inside the block decoders. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <string.h>

#include "gguf_writer.h"
#include "st_writer.h"

static unsigned char buf[4096];

/* Bit patterns as little-endian bytes at buf + at; returns the byte count. */
static size_t put16(size_t at, const uint16_t *v, size_t n) {
  for (size_t i = 0; i < n; i++) buf[at + 2 * i] = (unsigned char)v[i], buf[at + 2 * i + 1] = (unsigned char)(v[i] >> 8);
  return 2 * n;
}
static size_t put32(size_t at, const uint32_t *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (int k = 0; k < 4; k++) buf[at + 4 * i + k] = (unsigned char)(v[i] >> (8 * k));
  return 4 * n;
}

static int safetensors(const char *dir) {
  char path[1024];
  /* zero, -0, smallest and largest subnormal, smallest normal, 1, largest, +-inf, quiet and
   * signalling NaN, a negative normal */
  static const uint16_t f16[12] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00,
                                   0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xc000};
  static const uint16_t bf16[12] = {0x0000, 0x8000, 0x0001, 0x007f, 0x0080, 0x3f80,
                                    0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xc000};
  static const uint32_t f32[6] = {0x00000000u, 0x80000001u, 0x3f800000u, 0x7f800000u, 0x7fc00000u, 0xff7fffffu};
  size_t a = put16(0, f16, 12), b = put16(a, bf16, 12), c = put32(a + b, f32, 6);
  stw_tensor special[] = {
      {"f16", "F16", 2, {3, 4}, buf, a},
      {"empty", "BF16", 2, {0, 5}, NULL, 0}, /* at the same offset as the next one */
      {"bf16", "BF16", 2, {4, 3}, buf + a, b},
      {"f32", "F32", 1, {6}, buf + a + b, c},
      {"scalar", "F32", 0, {0}, buf, 4},
      {"empty_last", "F16", 1, {0}, NULL, 0},
  };
  snprintf(path, sizeof path, "%s/safetensors/specials.safetensors", dir);
  if (stw_write(path, special, sizeof special / sizeof special[0],
                "\"format\": \"pt\", \"caf\\u00e9\": \"\\ud83d\\ude00 \\\"q\\\" \\\\ \\/ \\b\\f\\n\\r\\t\"")) return 1;

  /* every dtype of the format, one element or two each; 8 bytes of data per tensor at most */
  static const struct {
    const char *name;
    size_t size;
  } dtypes[] = {{"F64", 8}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U64", 8},      {"U32", 4},
                {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F32", 4}, {"F16", 2}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
                {"BF16", 2}};
  enum { ND = sizeof dtypes / sizeof dtypes[0] };
  stw_tensor all[ND];
  for (size_t i = 0; i < ND; i++) all[i] = (stw_tensor){dtypes[i].name, dtypes[i].name, 1, {8 / dtypes[i].size}, buf, 8};
  snprintf(path, sizeof path, "%s/safetensors/every_dtype.safetensors", dir);
  if (stw_write(path, all, ND, NULL)) return 1;

  /* the smallest file: one element, no metadata; and one with no tensors at all */
  snprintf(path, sizeof path, "%s/safetensors/one.safetensors", dir);
  stw_tensor one = {"w", "F32", 2, {1, 1}, buf + a + b + 8, 4};
  if (stw_write(path, &one, 1, NULL)) return 1;
  snprintf(path, sizeof path, "%s/safetensors/no_tensors.safetensors", dir);
  return stw_write(path, NULL, 0, "\"k\": \"v\"");
}

/* A one-block GPT-2: T = 2, V = 3 padded to 4, C = 4 in 2 heads. */
static int llmc(const char *dir, int bf16) {
  enum { T = 2, V = 3, Vp = 4, L = 1, NH = 2, C = 4 };
  const uint32_t hdr[8] = {20240326, bf16 ? 5 : 3, T, V, L, NH, C, Vp};
  const size_t n = (size_t)Vp * C + T * C + L * (13 * C + 12 * C * C) + 2 * C;
  uint32_t h[256] = {0};
  memcpy(h, hdr, sizeof hdr);
  size_t at = put32(0, h, 256);
  for (size_t i = 0; i < n; i++) {
    uint32_t x = 0x3c000000u + (uint32_t)i * 0x00012345u; /* small distinct normals */
    if (bf16) {
      uint16_t b = (uint16_t)(x >> 16);
      at += put16(at, &b, 1);
    } else at += put32(at, &x, 1);
  }
  char path[1024];
  snprintf(path, sizeof path, "%s/llmc/tiny_%s.bin", dir, bf16 ? "bf16" : "f32");
  FILE *f = fopen(path, "wb");
  if (!f) return 1;
  int ok = fwrite(buf, 1, at, f) == at;
  return (fclose(f) == 0 && ok) ? 0 : 1;
}

/* GGML numbers, block elements and bytes of the decoded quantized types. */
static const struct {
  const char *name;
  uint32_t type, block, bytes;
} quants[] = {{"q4_0", 2, 32, 18},    {"q4_1", 3, 32, 20},   {"q5_0", 6, 32, 22},     {"q5_1", 7, 32, 24},
              {"q8_0", 8, 32, 34},    {"q2_k", 10, 256, 84}, {"q3_k", 11, 256, 110},  {"q4_k", 12, 256, 144},
              {"q5_k", 13, 256, 176}, {"q6_k", 14, 256, 210}, {"iq4_nl", 20, 32, 18}, {"iq4_xs", 23, 256, 136}};
enum { NQ = sizeof quants / sizeof quants[0] };

/* Block bytes: a spread of quants; every f16 a block may hold read as 1.0 or so (0x3c..). */
static void block_bytes(unsigned char *b, size_t n) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 37 + 11);
  for (size_t i = 1; i < n; i += 2) b[i] = 0x3c; /* high bytes of any aligned f16: ~1 */
}

static int gguf(const char *dir) {
  char path[1024];
  gw_file all;
  gw_init(&all);
  for (size_t k = 0; k < NQ; k++) {
    block_bytes(buf, quants[k].bytes);
    gw_file one;
    gw_init(&one);
    uint64_t ne[2] = {quants[k].block, 1};
    gw_tensor(&one, "w", 2, ne, quants[k].type, buf, quants[k].bytes);
    gw_tensor(&all, quants[k].name, 2, ne, quants[k].type, buf, quants[k].bytes);
    snprintf(path, sizeof path, "%s/gguf/%s.gguf", dir, quants[k].name);
    if (gw_write(&one, path)) return 1;
  }
  snprintf(path, sizeof path, "%s/gguf/every_quant.gguf", dir);
  return gw_write(&all, path);
}

/* A split model as fuzz_gguf_split reads one input: a little-endian uint32 n, n bytes of shard 1
 * (m-00001-of-00002.gguf), the rest shard 2. Shard k of n as gguf-split writes it: split.no,
 * split.count (uint16), split.tensors.count (int32), the model's metadata in the first. */
static int split_shard(const char *path, int k, int n, int32_t said, const char *const *names, size_t nt) {
  gw_file f;
  gw_init(&f);
  if (k == 0) gw_kv_str(&f, "general.architecture", "llama"), gw_kv_u32(&f, "llama.attention.head_count", 2);
  gw_kv_u16(&f, "split.no", (uint16_t)k);
  gw_kv_u16(&f, "split.count", (uint16_t)n);
  gw_kv_i32(&f, "split.tensors.count", said);
  float w[4 * 4];
  for (int i = 0; i < 16; i++) w[i] = (float)(i % 5) - 2.0f;
  const uint64_t ne[2] = {4, 4};
  for (size_t i = 0; i < nt; i++) gw_tensor(&f, names[i], 2, ne, 0, w, sizeof w);
  return gw_write(&f, path);
}

/* The two shards' files joined into one input. */
static int join_split(const char *dir, const char *name, const char *a, const char *b) {
  char path[1024];
  unsigned char *x = NULL, *y = NULL;
  long nx = -1, ny = -1;
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  if (fa && !fseek(fa, 0, SEEK_END) && (nx = ftell(fa)) >= 0) rewind(fa);
  if (fb && !fseek(fb, 0, SEEK_END) && (ny = ftell(fb)) >= 0) rewind(fb);
  int rc = nx < 0 || ny < 0 || !(x = malloc((size_t)nx + 1)) || !(y = malloc((size_t)ny + 1)) ||
           fread(x, 1, (size_t)nx, fa) != (size_t)nx || fread(y, 1, (size_t)ny, fb) != (size_t)ny;
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  snprintf(path, sizeof path, "%s/gguf_split/%s", dir, name);
  FILE *o = rc ? NULL : fopen(path, "wb");
  unsigned char len[4] = {(unsigned char)nx, (unsigned char)(nx >> 8), (unsigned char)(nx >> 16), (unsigned char)(nx >> 24)};
  rc = rc || !o || fwrite(len, 1, 4, o) != 4 || fwrite(x, 1, (size_t)nx, o) != (size_t)nx ||
       fwrite(y, 1, (size_t)ny, o) != (size_t)ny;
  if (o && fclose(o)) rc = 1;
  free(x), free(y);
  remove(a), remove(b);
  return rc;
}

static int gguf_split(const char *dir) {
  static const char *const first[] = {"token_embd.weight"}, *const rest[] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                                                             "output.weight"};
  static const char *const twice[] = {"token_embd.weight", "output.weight"};
  char a[1024], b[1024];
  snprintf(a, sizeof a, "%s/gguf_split/a.tmp", dir);
  snprintf(b, sizeof b, "%s/gguf_split/b.tmp", dir);
  /* a valid split; split.tensors.count off by one; shard 2 saying it is shard 1; split.count 3
   * (a shard missing); a tensor in both shards; no tensors in the first (--no-tensor-first-split) */
  return split_shard(a, 0, 2, 4, first, 1) || split_shard(b, 1, 2, 4, rest, 3) || join_split(dir, "valid", a, b) ||
         split_shard(a, 0, 2, 5, first, 1) || split_shard(b, 1, 2, 5, rest, 3) || join_split(dir, "count_off", a, b) ||
         split_shard(a, 0, 2, 4, first, 1) || split_shard(b, 0, 2, 4, rest, 3) || join_split(dir, "same_no", a, b) ||
         split_shard(a, 0, 3, 4, first, 1) || split_shard(b, 1, 3, 4, rest, 3) || join_split(dir, "missing", a, b) ||
         split_shard(a, 0, 2, 3, twice, 2) || split_shard(b, 1, 2, 3, rest + 2, 1) || join_split(dir, "twice", a, b) ||
         split_shard(a, 0, 2, 3, NULL, 0) || split_shard(b, 1, 2, 3, rest, 3) || join_split(dir, "empty_first", a, b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: seed_gen DIR (writes DIR/safetensors/, DIR/llmc/ and DIR/gguf/)\n");
    return 2;
  }
  char sub[1024];
  const char *subs[] = {"safetensors", "llmc", "gguf", "gguf_split"};
  for (int k = 0; k < 4; k++) { /* an existing directory is fine: seeds are overwritten */
    snprintf(sub, sizeof sub, "%s/%s", argv[1], subs[k]);
    if (mkdir(sub, 0777) != 0 && errno != EEXIST) return perror(sub), 1;
  }
  if (safetensors(argv[1]) || llmc(argv[1], 0) || llmc(argv[1], 1) || gguf(argv[1]) || gguf_split(argv[1])) {
    perror("seed_gen");
    return 1;
  }
  return 0;
}
