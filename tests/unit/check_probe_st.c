/* check_probe_st.c — the safetensors reader and the f16/bf16 conversion: values read back
 * exactly from files written by tests/support/st_writer (every f16 and bf16 bit pattern against its
 * closed form), metadata, lookup, and every malformed-file case, each asserting the status
 * and that the message names the file and the field at fault. The malformed files are also
 * the regression corpus in tests/corpus/safetensors/, replayed here. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reader_checks.h"
#include "st_writer.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[256];

static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_st"); }

static void remove_tmpdir(void) { tu_tmpdir_remove(tmpdir); }

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

static void check_all_patterns(int bf16) {
  make_tmpdir();
  uint16_t *bits = malloc(65536 * sizeof *bits);
  unsigned char *bytes = malloc(2 * 65536);
  for (unsigned i = 0; i < 65536; i++) bytes[2 * i] = (unsigned char)(i & 255), bytes[2 * i + 1] = (unsigned char)(i >> 8);
  stw_tensor t = {"all", bf16 ? "BF16" : "F16", 2, {256, 256}, bytes, 2 * 65536};
  ck_assert_int_eq(stw_write(tmp_path("all.safetensors"), &t, 1, NULL), 0);
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(tmp_path("all.safetensors"), &f));
  const stab_ckpt_tensor *x = stab_safetensors_tensor(f, 0);
  ck_assert_int_eq(x->dtype, bf16 ? STAB_DTYPE_BF16 : STAB_DTYPE_F16);
  float *out = malloc(65536 * sizeof *out);
  reader_check_all_halves(x, bf16, out);
  stab_ckpt_release(x); /* 128 KiB: whole pages are dropped, and must read back the same */
  float *again = malloc(65536 * sizeof *again);
  TU_ASSERT_OK(stab_ckpt_read_f32(x, 0, 65536, again));
  ck_assert(memcmp(again, out, 65536 * sizeof *out) == 0);
  free(again);
  /* the scalar conversion agrees with the block one */
  for (unsigned i = 0; i < 65536; i++) {
    float single = bf16 ? stab_bf16_to_f32((uint16_t)i) : stab_f16_to_f32((uint16_t)i);
    ck_assert_msg(isnan(out[i]) ? isnan(single) : memcmp(&single, &out[i], 4) == 0,
                  "pattern 0x%04x: scalar and block differ", i);
  }
  /* and the writer's encoders invert the conversion on every finite pattern */
  for (unsigned i = 0; i < 65536; i++)
    if (!isnan(out[i])) {
      uint16_t back = bf16 ? stw_bf16(out[i]) : stw_f16(out[i]);
      ck_assert_msg(back == i, "pattern 0x%04x re-encodes as 0x%04x", i, back);
    }
  TU_ASSERT_STATUS(stab_ckpt_read_f32(x, 65000, 537, out), STAB_ERANGE);
  stab_safetensors_close(f);
  free(out), free(bytes), free(bits);
  remove_tmpdir();
}

START_TEST(test_f16_all_patterns) { check_all_patterns(0); }
END_TEST

START_TEST(test_bf16_all_patterns) { check_all_patterns(1); }
END_TEST

START_TEST(test_f32_and_layout) {
  make_tmpdir();
  tu_rng r;
  tu_rng_init(&r, 5);
  enum { A = 7 * 13 };
  float a[A], b[5] = {1.0f, -0.0f, INFINITY, NAN, 1e-45f};
  for (int i = 0; i < A; i++) a[i] = (float)tu_rng_gauss(&r);
  int64_t ids[3] = {1, -2, 3};
  float scalar = 2.5f;
  stw_tensor t[] = {{"layer.weight", "F32", 2, {7, 13}, a, sizeof a},
                    {"odd", "F32", 1, {5}, b, sizeof b},
                    {"ids", "I64", 1, {3}, ids, sizeof ids},
                    {"empty", "F32", 2, {0, 4}, NULL, 0},
                    {"scalar", "F32", 0, {0}, &scalar, 4}};
  ck_assert_int_eq(stw_write(tmp_path("m.safetensors"), t, 5,
                             "\"format\": \"pt\", \"note\": \"tab\\there \\u00e9 \\ud83d\\ude00 \\\"q\\\"\""), 0);
  stab_safetensors *f = NULL;
  TU_ASSERT_OK(stab_safetensors_open(tmp_path("m.safetensors"), &f));
  ck_assert_uint_eq(stab_safetensors_count(f), 5);
  size_t idx;
  TU_ASSERT_OK(stab_safetensors_find(f, "layer.weight", &idx));
  const stab_ckpt_tensor *x = stab_safetensors_tensor(f, idx);
  ck_assert_str_eq(x->name, "layer.weight");
  ck_assert_str_eq(x->dtype_name, "F32");
  ck_assert_uint_eq(x->ndim, 2);
  ck_assert_uint_eq(x->shape[0], 7);
  ck_assert_uint_eq(x->shape[1], 13);
  ck_assert_uint_eq(x->count, A);
  float got[A];
  TU_ASSERT_OK(stab_ckpt_read_f32(x, 0, A, got));
  ck_assert(memcmp(got, a, sizeof a) == 0);
  /* released pages come back with the same bytes */
  stab_ckpt_release(x);
  stab_ckpt_release(NULL);
  TU_ASSERT_OK(stab_ckpt_read_f32(x, 0, A, got));
  ck_assert(memcmp(got, a, sizeof a) == 0);
  /* prefetched pages read the same too; NULL is a no-op */
  stab_ckpt_release(x);
  stab_ckpt_prefetch(x);
  stab_ckpt_prefetch(NULL);
  TU_ASSERT_OK(stab_ckpt_read_f32(x, 0, A, got));
  ck_assert(memcmp(got, a, sizeof a) == 0);
  TU_ASSERT_OK(stab_safetensors_find(f, "odd", &idx));
  TU_ASSERT_OK(stab_ckpt_read_f32(stab_safetensors_tensor(f, idx), 0, 5, got));
  ck_assert(memcmp(got, b, sizeof b) == 0); /* NaN, -0 and the subnormal bit for bit */
  TU_ASSERT_OK(stab_safetensors_find(f, "ids", &idx));
  ck_assert_int_eq(stab_safetensors_tensor(f, idx)->dtype, STAB_DTYPE_OTHER);
  ck_assert_str_eq(stab_safetensors_tensor(f, idx)->dtype_name, "I64");
  TU_ASSERT_STATUS(stab_ckpt_read_f32(stab_safetensors_tensor(f, idx), 0, 1, got), STAB_EINVAL);
  TU_ASSERT_OK(stab_safetensors_find(f, "empty", &idx));
  ck_assert_uint_eq(stab_safetensors_tensor(f, idx)->count, 0);
  TU_ASSERT_OK(stab_safetensors_find(f, "scalar", &idx));
  ck_assert_uint_eq(stab_safetensors_tensor(f, idx)->ndim, 0);
  ck_assert_uint_eq(stab_safetensors_tensor(f, idx)->count, 1);
  TU_ASSERT_OK(stab_ckpt_read_f32(stab_safetensors_tensor(f, idx), 0, 1, got));
  ck_assert(got[0] == 2.5f);
  ck_assert_int_eq(stab_safetensors_find(f, "missing", &idx), STAB_ENOTFOUND);
  /* tensors come in data order */
  for (size_t i = 1; i < 5; i++)
    ck_assert(stab_safetensors_tensor(f, i)->offset >= stab_safetensors_tensor(f, i - 1)->offset);
  ck_assert_ptr_null(stab_safetensors_tensor(f, 5));
  /* metadata in key order, escapes decoded */
  ck_assert_uint_eq(stab_safetensors_metadata_count(f), 2);
  const char *k, *v;
  TU_ASSERT_OK(stab_safetensors_metadata(f, 0, &k, &v));
  ck_assert_str_eq(k, "format");
  ck_assert_str_eq(v, "pt");
  TU_ASSERT_OK(stab_safetensors_metadata(f, 1, &k, &v));
  ck_assert_str_eq(k, "note");
  ck_assert_str_eq(v, "tab\there \xc3\xa9 \xf0\x9f\x98\x80 \"q\"");
  ck_assert_int_eq(stab_safetensors_metadata(f, 2, &k, &v), STAB_ENOTFOUND);
  stab_safetensors_close(f);
  stab_safetensors_close(NULL);
  TU_ASSERT_STATUS(stab_safetensors_open(tmp_path("absent.safetensors"), &f), STAB_EIO);
  ck_assert_ptr_null(f);
  TU_ASSERT_STATUS(stab_safetensors_open(tmpdir, &f), STAB_EIO);
  TU_ASSERT_STATUS(stab_safetensors_open(NULL, &f), STAB_EINVAL);
  remove_tmpdir();
}
END_TEST

/* ---- malformed files --------------------------------------------------------------- */

typedef struct {
  const char *file;    /* name in the corpus */
  const char *header;  /* NULL: raw bytes only (see nbytes_total) */
  long long hlen;      /* -1: strlen(header) */
  size_t data;         /* zero data bytes after the header */
  long long truncate;  /* >= 0: the file is cut to this many bytes */
  const char *want;    /* a substring the message must hold */
} bad_case;

#define T1 "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}"
static const bad_case bad_cases[] = {
    {"empty.safetensors", "", 0, 0, 0, "fewer than the 8-byte header length"},
    {"short.safetensors", "", 0, 0, 5, "fewer than the 8-byte header length"},
    {"hlen_beyond_file.safetensors", "{" T1 "}", 4096, 4, -1, "larger than the"},
    {"hlen_zero.safetensors", "", 0, 4, -1, "is zero"},
    {"truncated_data.safetensors", "{" T1 "}", -1, 4, 71, "outside the data section"},
    {"truncated_header.safetensors", "{\"a\": {\"dtype\"", -1, 0, -1, "header ends"},
    {"not_object_array.safetensors", "[1, 2]", -1, 0, -1, "not a JSON object"},
    {"not_object_string.safetensors", "\"abc\"", -1, 0, -1, "not a JSON object"},
    {"trailing_comma.safetensors", "{" T1 ",}", -1, 4, -1, "a tensor name"},
    {"missing_colon.safetensors", "{\"a\" {}}", -1, 0, -1, "':' after a tensor name"},
    {"unterminated_string.safetensors", "{\"a: 1}", -1, 0, -1, "unterminated string"},
    {"bytes_after_object.safetensors", "{" T1 "} x", -1, 4, -1, "bytes after the header object"},
    {"float_in_shape.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "floating-point"},
    {"exponent_offset.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4e0]}}", -1, 4, -1,
     "data_offsets[1] is not an integer"},
    {"negative_offset.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", -1, 4, -1,
     "data_offsets[0] is negative"},
    {"leading_zero.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [01], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "leading zero"},
    {"offset_overflow.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 99999999999999999999]}}", -1, 4, -1,
     "data_offsets[1] does not fit in 64 bits"},
    {"offsets_outside.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [100], \"data_offsets\": [0, 400]}}", -1, 4,
     -1, "outside the data section"},
    {"offsets_reversed.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", -1, 4, -1,
     "data_offsets [4, 0]"},
    {"overlap.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
     "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", -1, 12, -1, "overlap tensor 'a'"},
    {"hole.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
     "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", -1, 12, -1, "[4, 8) belong to no tensor"},
    {"trailing_data.safetensors", "{" T1 "}", -1, 8, -1, "[4, 8) belong to no tensor"},
    {"shape_overflow.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 16], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "product of shape overflows"},
    {"shape_bytes_overflow.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 2], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "overflows 64 bits"},
    {"shape_mismatch.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", -1, 8, -1,
     "shape holds 3 F32 elements (12 bytes) but data_offsets [0, 8] span 8 bytes"},
    {"unknown_dtype.safetensors", "{\"a\": {\"dtype\": \"F33\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "unknown dtype \"F33\""},
    {"dtype_not_string.safetensors", "{\"a\": {\"dtype\": 4, \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "expected dtype"},
    {"duplicate_name.safetensors", "{" T1 ", \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", -1,
     8, -1, "duplicate tensor name 'a'"},
    {"duplicate_key.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "duplicate key \"dtype\""},
    {"duplicate_metadata.safetensors", "{\"__metadata__\": {}, \"__metadata__\": {}}", -1, 0, -1,
     "duplicate \"__metadata__\""},
    {"duplicate_metadata_key.safetensors", "{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}", -1, 0, -1,
     "__metadata__: duplicate key 'k'"},
    {"metadata_not_string.safetensors", "{\"__metadata__\": {\"k\": 1}}", -1, 0, -1, "a __metadata__ value"},
    {"metadata_not_object.safetensors", "{\"__metadata__\": [\"k\"]}", -1, 0, -1, "opening __metadata__"},
    {"unknown_key.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"extra\": 1}}", -1, 4, -1,
     "unknown key \"extra\""},
    {"missing_offsets.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", -1, 4, -1,
     "missing \"data_offsets\""},
    {"offsets_three.safetensors", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", -1, 4, -1,
     "closing data_offsets"},
    {"bad_escape.safetensors", "{\"a\\x\": {}}", -1, 0, -1, "invalid escape"},
    {"control_char.safetensors", "{\"a\tb\": {}}", -1, 0, -1, "control character"},
    {"invalid_utf8.safetensors", "{\"a\xff\": {}}", -1, 0, -1, "invalid UTF-8"},
    {"lone_surrogate.safetensors", "{\"a\\ud800\": {}}", -1, 0, -1, "unpaired surrogate"},
    {"nul_escape.safetensors", "{\"a\\u0000\": {}}", -1, 0, -1, "\\u0000"},
    {"metadata_value_not_utf8.safetensors", "{\"__metadata__\": {\"k\": \"caf\xe9\"}}", -1, 0, -1,
     "header byte 27: invalid UTF-8 in a __metadata__ value"},
    {"metadata_key_surrogate.safetensors", "{\"__metadata__\": {\"\\udc00\": \"v\"}}", -1, 0, -1,
     "unpaired surrogate"},
    {"metadata_value_overlong.safetensors", "{\"__metadata__\": {\"k\": \"\xc0\xae\"}}", -1, 0, -1,
     "invalid UTF-8 in a __metadata__ value"},
    {"empty_name.safetensors", "{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "empty tensor name"},
    {"too_many_dims.safetensors",
     "{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", -1, 4, -1,
     "more than 8 dimensions"},
    {"nested_arrays.safetensors", "{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", -1, 0, -1,
     "opening the tensor's entry"},
};
enum { NBAD = sizeof bad_cases / sizeof bad_cases[0] };

/* Writes case k at path. */
static void write_case(const bad_case *c, const char *path) {
  size_t hl = strlen(c->header);
  ck_assert_int_eq(stw_write_raw(path, c->hlen < 0 ? hl : (uint64_t)c->hlen, c->header, NULL, c->data), 0);
  if (c->truncate >= 0) ck_assert_int_eq(truncate(path, (off_t)c->truncate), 0);
}

START_TEST(test_bad_files) {
  make_tmpdir();
  const char *corpus_out = getenv("STAB_WRITE_CORPUS"); /* regenerates the committed corpus */
  for (int k = 0; k < NBAD; k++) {
    const bad_case *c = &bad_cases[k];
    const char *path = tmp_path(c->file);
    write_case(c, path);
    if (corpus_out) {
      char p[512];
      snprintf(p, sizeof p, "%s/%s", corpus_out, c->file);
      write_case(c, p);
    }
    stab_safetensors *f = (stab_safetensors *)&f; /* must come back NULL */
    stab_status st = stab_safetensors_open(path, &f);
    reader_assert_refused(c->file, path, st, STAB_EFORMAT, f == NULL, c->want);
  }
  remove_tmpdir();
}
END_TEST

/* Every committed corpus file fails cleanly, and every case above is in the corpus. */
START_TEST(test_corpus_replay) {
  const char *srcdir = getenv("srcdir");
  char dir[512], path[1024];
  snprintf(dir, sizeof dir, "%s/tests/corpus/safetensors", srcdir ? srcdir : ".");
  DIR *d = opendir(dir);
  ck_assert_msg(d != NULL, "no corpus at %s", dir);
  struct dirent *e;
  int files = 0;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    stab_safetensors *f = (stab_safetensors *)&f; /* must come back NULL */
    stab_status st = stab_safetensors_open(path, &f);
    reader_assert_refused(path, path, st, STAB_EFORMAT, f == NULL, "");
    files++;
  }
  closedir(d);
  for (int k = 0; k < NBAD; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, bad_cases[k].file);
    ck_assert_msg(access(path, R_OK) == 0, "corpus lacks %s (regenerate: STAB_WRITE_CORPUS=%s)", path, dir);
  }
  ck_assert_int_ge(files, NBAD);
}
END_TEST

/* ---- llm.c ------------------------------------------------------------------------- */

typedef struct {
  const char *file;
  int32_t h[8];      /* magic, version, maxT, V, L, NH, C, Vp */
  long long delta;   /* bytes of parameters added (+) or cut (-) from the exact size */
  const char *want;
} llmc_case;

static uint64_t llmc_bytes(const int32_t *h) {
  uint64_t Vp = (uint64_t)h[7], T = (uint64_t)h[2], L = (uint64_t)h[4], C = (uint64_t)h[6];
  return (Vp * C + T * C + L * (13 * C + 12 * C * C) + 2 * C) * (h[1] == 5 ? 2 : 4);
}

static void write_llmc(const char *path, const int32_t *h8, long long delta) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  int32_t h[256] = {0};
  memcpy(h, h8, 8 * sizeof *h);
  ck_assert_int_eq(fwrite(h, sizeof h, 1, f), 1);
  uint64_t n = h8[4] < 100 && h8[6] < 100 && h8[7] < 1000 ? llmc_bytes(h8) : 0;
  n = (uint64_t)((long long)n + delta);
  for (uint64_t i = 0; i < n; i++) fputc(0, f);
  ck_assert_int_eq(fclose(f), 0);
}

#define MG 20240326
static const llmc_case llmc_cases[] = {
    {"bad_version.bin", {MG, 4, 4, 6, 1, 2, 4, 8}, 0, "header int 1 (version) is 4"},
    {"zero_layers.bin", {MG, 3, 4, 6, 0, 2, 4, 8}, 0, "header int 4 (num_layers) is 0"},
    {"negative_channels.bin", {MG, 3, 4, 6, 1, 2, -4, 8}, 0, "header int 6 (channels) is -4"},
    {"vocab_above_padded.bin", {MG, 3, 4, 9, 1, 2, 4, 8}, 0, "exceeds int 7 (padded_vocab_size 8)"},
    {"heads_not_dividing.bin", {MG, 3, 4, 6, 1, 3, 4, 8}, 0, "not a multiple of int 5 (num_heads 3)"},
    {"truncated.bin", {MG, 3, 4, 6, 1, 2, 4, 8}, -4, "truncated"},
    {"truncated_bf16.bin", {MG, 5, 4, 6, 1, 2, 4, 8}, -2, "truncated"},
    {"trailing.bin", {MG, 3, 4, 6, 1, 2, 4, 8}, 4, "4 bytes after the parameters"},
    {"huge_shapes.bin", {MG, 3, 1 << 24, 1 << 24, 1 << 24, 1, 1 << 24, 1 << 24}, 0, "truncated"},
};
enum { NLLMC = sizeof llmc_cases / sizeof llmc_cases[0] };

START_TEST(test_llmc_bad_files) {
  make_tmpdir();
  const char *corpus_out = getenv("STAB_WRITE_CORPUS_LLMC");
  for (int k = 0; k < NLLMC; k++) {
    const llmc_case *c = &llmc_cases[k];
    const char *path = tmp_path(c->file);
    write_llmc(path, c->h, c->delta);
    if (corpus_out) {
      char p[512];
      snprintf(p, sizeof p, "%s/%s", corpus_out, c->file);
      write_llmc(p, c->h, c->delta);
    }
    stab_llmc *f = (stab_llmc *)&f; /* must come back NULL */
    stab_status st = stab_llmc_open(path, &f);
    reader_assert_refused(c->file, path, st, STAB_EFORMAT, f == NULL, c->want);
    ck_assert_int_eq(stab_llmc_is(path), 1);
  }
  /* a short file and a wrong magic */
  ck_assert_int_eq(stw_write_raw(tmp_path("short.bin"), 20240326, "", NULL, 100), 0);
  TU_ASSERT_STATUS(stab_llmc_open(tmp_path("short.bin"), &(stab_llmc *){NULL}), STAB_EFORMAT);
  int32_t h[8] = {1234, 3, 8, 50, 2, 2, 16, 64};
  write_llmc(tmp_path("magic.bin"), h, 0);
  stab_llmc *f = NULL;
  TU_ASSERT_STATUS(stab_llmc_open(tmp_path("magic.bin"), &f), STAB_EFORMAT);
  ck_assert(strstr(stab_last_error(), "magic") != NULL);
  ck_assert_int_eq(stab_llmc_is(tmp_path("magic.bin")), 0);
  remove_tmpdir();
}
END_TEST

/* The views: names, shapes and offsets against llm.c's layout, padding rows left out. */
START_TEST(test_llmc_views) {
  make_tmpdir();
  int32_t h[8] = {MG, 3, 8, 50, 2, 2, 16, 64};
  write_llmc(tmp_path("ok.bin"), h, 0);
  stab_llmc *f = NULL;
  TU_ASSERT_OK(stab_llmc_open(tmp_path("ok.bin"), &f));
  const stab_llmc_config *c = stab_llmc_config_of(f);
  ck_assert_uint_eq(c->vocab, 50);
  ck_assert_uint_eq(c->padded_vocab, 64);
  ck_assert_uint_eq(stab_llmc_count(f), 2 + 2 * 16 + 2);
  size_t i;
  TU_ASSERT_OK(stab_llmc_find(f, "wte", &i));
  ck_assert_uint_eq(stab_llmc_tensor(f, i)->shape[0], 50);
  ck_assert_uint_eq(stab_llmc_tensor(f, i)->offset, 1024);
  TU_ASSERT_OK(stab_llmc_find(f, "h.1.attn.k.weight", &i));
  const stab_ckpt_tensor *t = stab_llmc_tensor(f, i);
  /* wte 64*16, wpe 8*16, ln1w 2*16, ln1b 2*16, qkvw layer 1 block k */
  uint64_t want = 1024 + 4 * (64 * 16 + 8 * 16 + 2 * 16 + 2 * 16 + (1 * 3 + 1) * 16 * 16);
  ck_assert_uint_eq(t->offset, want);
  ck_assert_uint_eq(t->shape[0], 16);
  ck_assert_uint_eq(t->shape[1], 16);
  TU_ASSERT_OK(stab_llmc_find(f, "ln_f.bias", &i));
  t = stab_llmc_tensor(f, i);
  ck_assert_uint_eq(t->offset + 4 * t->count, 1024 + llmc_bytes(h));
  ck_assert_int_eq(stab_llmc_find(f, "lm_head", &i), STAB_ENOTFOUND);
  stab_llmc_close(f);
  stab_llmc_close(NULL);
  remove_tmpdir();
}
END_TEST

START_TEST(test_llmc_corpus_replay) {
  const char *srcdir = getenv("srcdir");
  char path[1024];
  for (int k = 0; k < NLLMC; k++) {
    snprintf(path, sizeof path, "%s/tests/corpus/llmc/%s", srcdir ? srcdir : ".", llmc_cases[k].file);
    stab_llmc *f = NULL;
    ck_assert_msg(stab_llmc_open(path, &f) == STAB_EFORMAT, "%s: %s", path, stab_last_error());
  }
}
END_TEST

static Suite *probe_st_suite(void) {
  Suite *s = suite_create("probe_st");
  TCase *tc = tcase_create("values");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_f16_all_patterns);
  tcase_add_test(tc, test_bf16_all_patterns);
  tcase_add_test(tc, test_f32_and_layout);
  suite_add_tcase(s, tc);
  tc = tcase_create("malformed");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_corpus_replay);
  suite_add_tcase(s, tc);
  tc = tcase_create("llmc");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_llmc_bad_files);
  tcase_add_test(tc, test_llmc_views);
  tcase_add_test(tc, test_llmc_corpus_replay);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(probe_st_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
