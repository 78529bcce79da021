/* check_probe_gguf.c — the GGUF reader: values read back exactly from files written by
 * tests/support/gguf_writer (every F16 and BF16 bit pattern against its closed form, F32 bit for
 * bit, shapes reversed from ne[]), metadata of every value type, arrays skipped, alignment,
 * quantized tensors of every decoded type against an independent decoder of their bit layout
 * and in round trips through the probe, and every malformed-file case, each asserting
 * STAB_EFORMAT and a message naming the file, the field and the byte offset. The malformed
 * files are also the regression corpus in tests/corpus/gguf/ (with EXPECTED, the message
 * each must give, which tests/programs/probe.sh checks against the probe), replayed here. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_quant.h"
#include "gguf_writer.h"
#include "reader_checks.h"
#include "stabmeter.h"
#include "testutil.h"

static char tmpdir[256];

static void make_tmpdir(void) { tu_tmpdir_make(tmpdir, sizeof tmpdir, "check_probe_gguf"); }

static void remove_tmpdir(void) { tu_tmpdir_remove(tmpdir); }

static const char *tmp_path(const char *name) { return tu_path_in(tmpdir, name); }

START_TEST(test_values_and_metadata) {
  make_tmpdir();
  gw_file w;
  gw_init(&w);
  gw_kv_str(&w, "general.architecture", "llama");
  gw_kv_u32(&w, "llama.attention.head_count", 4);
  gw_kv_u8(&w, "t.u8", 200);
  gw_kv_i8(&w, "t.i8", -100);
  gw_kv_u16(&w, "t.u16", 60000);
  gw_kv_i16(&w, "t.i16", -30000);
  gw_kv_i32(&w, "t.i32", -2000000000);
  gw_kv_u64(&w, "t.u64", 18000000000000000000ull);
  gw_kv_i64(&w, "t.i64", -9000000000000000000ll);
  gw_kv_f32(&w, "t.f32", 0.1f);
  gw_kv_f64(&w, "t.f64", -2.5e300);
  gw_kv_bool(&w, "t.bool", 1);
  const char *toks[] = {"<s>", "", "hello"};
  gw_kv_str_array(&w, "tokenizer.ggml.tokens", toks, 3);
  const uint32_t ids[] = {7, 8, 9, 10, 11};
  gw_kv_u32_array(&w, "t.ids", ids, 5);
  gw_kv_str(&w, "t.after", "still read");
  /* F32 ne = {3, 5}: 5 rows of 3; F16 and BF16 every bit pattern; a Q4_0 and an I32 */
  float a[15];
  for (int i = 0; i < 15; i++) a[i] = (float)i - 7.25f;
  a[3] = -0.0f, a[4] = NAN, a[5] = 1e-45f;
  unsigned char *all = malloc(2 * 65536);
  for (unsigned i = 0; i < 65536; i++) all[2 * i] = (unsigned char)(i & 255), all[2 * i + 1] = (unsigned char)(i >> 8);
  gw_tensor(&w, "blk.0.attn_q.weight", 2, (uint64_t[]){3, 5}, GW_F32, a, sizeof a);
  gw_tensor(&w, "f16", 2, (uint64_t[]){256, 256}, GW_F16, all, 2 * 65536);
  gw_tensor(&w, "bf16", 3, (uint64_t[]){256, 128, 2}, GW_BF16, all, 2 * 65536);
  gw_tensor(&w, "q", 2, (uint64_t[]){64, 3}, GW_Q4_0, NULL, 3 * 2 * 18);
  gw_tensor(&w, "ids", 1, (uint64_t[]){4}, 26, ids, 16);
  gw_tensor(&w, "empty", 2, (uint64_t[]){0, 4}, GW_F32, NULL, 0);
  ck_assert_int_eq(gw_write(&w, tmp_path("m.gguf")), 0);
  free(all);

  ck_assert_int_eq(stab_gguf_is(tmp_path("m.gguf")), 1);
  stab_gguf *f = NULL;
  TU_ASSERT_OK(stab_gguf_open(tmp_path("m.gguf"), &f));
  ck_assert_uint_eq(stab_gguf_version(f), 3);
  ck_assert_uint_eq(stab_gguf_alignment(f), 32);
  ck_assert_uint_eq(stab_gguf_count(f), 6);
  /* file order, shapes reversed from ne[] */
  const stab_ckpt_tensor *t = stab_gguf_tensor(f, 0);
  ck_assert_str_eq(t->name, "blk.0.attn_q.weight");
  ck_assert_str_eq(t->dtype_name, "F32");
  ck_assert_uint_eq(t->ndim, 2);
  ck_assert_uint_eq(t->shape[0], 5);
  ck_assert_uint_eq(t->shape[1], 3);
  ck_assert_uint_eq(t->count, 15);
  ck_assert_uint_eq(t->offset % 32, 0);
  float got[15];
  TU_ASSERT_OK(stab_ckpt_read_f32(t, 0, 15, got));
  ck_assert(memcmp(got, a, sizeof a) == 0); /* -0, NaN and the subnormal bit for bit */
  float *out = malloc(65536 * sizeof *out);
  for (int bf = 0; bf < 2; bf++) {
    size_t i;
    TU_ASSERT_OK(stab_gguf_find(f, bf ? "bf16" : "f16", &i));
    t = stab_gguf_tensor(f, i);
    ck_assert_int_eq(t->dtype, bf ? STAB_DTYPE_BF16 : STAB_DTYPE_F16);
    ck_assert_uint_eq(t->ndim, bf ? 3 : 2);
    ck_assert_uint_eq(t->shape[0], bf ? 2 : 256);
    ck_assert_uint_eq(t->shape[1], bf ? 128 : 256);
    ck_assert_uint_eq(t->offset % 32, 0);
    reader_check_all_halves(t, bf, out);
  }
  free(out);
  size_t i;
  TU_ASSERT_OK(stab_gguf_find(f, "q", &i));
  t = stab_gguf_tensor(f, i);
  ck_assert_str_eq(t->dtype_name, "Q4_0");
  ck_assert_int_eq(t->dtype, STAB_DTYPE_QUANT);
  ck_assert_uint_eq(t->elem_size, 0);
  ck_assert_uint_eq(t->count, 192);
  TU_ASSERT_OK(stab_ckpt_read_f32(t, 0, 1, got)); /* zero bytes: d = 0 */
  ck_assert(got[0] == 0.0f);
  TU_ASSERT_OK(stab_gguf_find(f, "ids", &i));
  ck_assert_str_eq(stab_gguf_tensor(f, i)->dtype_name, "I32");
  ck_assert_uint_eq(stab_gguf_tensor(f, i)->elem_size, 4);
  TU_ASSERT_OK(stab_gguf_find(f, "empty", &i));
  ck_assert_uint_eq(stab_gguf_tensor(f, i)->count, 0);
  ck_assert_int_eq(stab_gguf_find(f, "missing", &i), STAB_ENOTFOUND);
  ck_assert_ptr_null(stab_gguf_tensor(f, 6));

  /* metadata: every type decoded, arrays skipped with the pair after them intact */
  ck_assert_uint_eq(stab_gguf_metadata_count(f), 15);
  const stab_gguf_kv *kv = stab_gguf_metadata(f, 0);
  ck_assert_str_eq(kv->key, "general.architecture");
  ck_assert_int_eq(kv->type, STAB_GGUF_STRING);
  ck_assert_str_eq(kv->s, "llama");
  uint64_t u;
  TU_ASSERT_OK(stab_gguf_get_uint(f, "llama.attention.head_count", &u));
  ck_assert_uint_eq(u, 4);
  ck_assert_uint_eq(stab_gguf_find_metadata(f, "t.u8")->u, 200);
  ck_assert_int_eq(stab_gguf_find_metadata(f, "t.i8")->i, -100);
  ck_assert_uint_eq(stab_gguf_find_metadata(f, "t.u16")->u, 60000);
  ck_assert_int_eq(stab_gguf_find_metadata(f, "t.i16")->i, -30000);
  ck_assert_int_eq(stab_gguf_find_metadata(f, "t.i32")->i, -2000000000);
  ck_assert(stab_gguf_find_metadata(f, "t.u64")->u == 18000000000000000000ull);
  ck_assert(stab_gguf_find_metadata(f, "t.i64")->i == -9000000000000000000ll);
  ck_assert(stab_gguf_find_metadata(f, "t.f32")->f == (double)0.1f);
  ck_assert(stab_gguf_find_metadata(f, "t.f64")->f == -2.5e300);
  ck_assert_int_eq(stab_gguf_find_metadata(f, "t.bool")->type, STAB_GGUF_BOOL);
  ck_assert_uint_eq(stab_gguf_find_metadata(f, "t.bool")->u, 1);
  kv = stab_gguf_find_metadata(f, "tokenizer.ggml.tokens");
  ck_assert_int_eq(kv->type, STAB_GGUF_ARRAY);
  ck_assert_int_eq(kv->elem_type, STAB_GGUF_STRING);
  ck_assert_uint_eq(kv->len, 3);
  kv = stab_gguf_find_metadata(f, "t.ids");
  ck_assert_int_eq(kv->elem_type, STAB_GGUF_UINT32);
  ck_assert_uint_eq(kv->len, 5);
  ck_assert_str_eq(stab_gguf_find_metadata(f, "t.after")->s, "still read");
  ck_assert_ptr_null(stab_gguf_find_metadata(f, "absent"));
  ck_assert_int_eq(stab_gguf_get_uint(f, "absent", &u), STAB_ENOTFOUND);
  TU_ASSERT_STATUS(stab_gguf_get_uint(f, "t.i8", &u), STAB_EINVAL);
  TU_ASSERT_STATUS(stab_gguf_get_uint(f, "t.f32", &u), STAB_EINVAL);
  TU_ASSERT_OK(stab_gguf_get_uint(f, "t.u64", &u));
  ck_assert_str_eq(stab_gguf_type_name(12), "Q4_K");
  ck_assert_str_eq(stab_gguf_type_name(30), "BF16");
  ck_assert_ptr_null(stab_gguf_type_name(4)); /* removed from ggml */
  ck_assert_ptr_null(stab_gguf_type_name(100000));
  ck_assert_str_eq(stab_gguf_value_type_name(STAB_GGUF_FLOAT64), "float64");
  stab_gguf_close(f);
  stab_gguf_close(NULL);
  TU_ASSERT_STATUS(stab_gguf_open(tmp_path("absent.gguf"), &f), STAB_EIO);
  ck_assert_ptr_null(f);
  TU_ASSERT_STATUS(stab_gguf_open(NULL, &f), STAB_EINVAL);
  ck_assert_int_eq(stab_gguf_is(tmp_path("absent.gguf")), 0);
  remove_tmpdir();
}
END_TEST

/* general.alignment moves every offset to its multiples, and the data with them. */
START_TEST(test_alignment) {
  make_tmpdir();
  for (uint32_t align = 1; align <= 256; align *= 4) {
    gw_file w;
    gw_init(&w);
    gw_kv_u32(&w, "general.alignment", align);
    float x[3] = {1, 2, 3}, y[5] = {4, 5, 6, 7, 8};
    gw_tensor(&w, "x", 1, (uint64_t[]){3}, GW_F32, x, sizeof x);
    gw_tensor(&w, "y", 1, (uint64_t[]){5}, GW_F32, y, sizeof y);
    ck_assert_int_eq(gw_write(&w, tmp_path("a.gguf")), 0);
    stab_gguf *f = NULL;
    TU_ASSERT_OK(stab_gguf_open(tmp_path("a.gguf"), &f));
    ck_assert_uint_eq(stab_gguf_alignment(f), align);
    float got[5];
    const stab_ckpt_tensor *t = stab_gguf_tensor(f, 1);
    ck_assert_uint_eq(t->offset % align, 0);
    TU_ASSERT_OK(stab_ckpt_read_f32(t, 0, 5, got));
    ck_assert(memcmp(got, y, sizeof y) == 0);
    stab_gguf_close(f);
  }
  remove_tmpdir();
}
END_TEST

/* A string value that is not UTF-8 is kept as the file has it (names and keys must be). */
START_TEST(test_string_value_bytes_kept) {
  make_tmpdir();
  gw_file w;
  gw_init(&w);
  gw_kv_str(&w, "general.name", "caf\xe9 \xe2\x80\xae");
  gw_tensor(&w, "t\xc3\xa9", 1, (uint64_t[]){1}, GW_F32, (float[]){1.0f}, 4);
  ck_assert_int_eq(gw_write(&w, tmp_path("v.gguf")), 0);
  stab_gguf *f = NULL;
  TU_ASSERT_OK(stab_gguf_open(tmp_path("v.gguf"), &f));
  ck_assert_str_eq(stab_gguf_metadata(f, 0)->s, "caf\xe9 \xe2\x80\xae");
  ck_assert_str_eq(stab_gguf_tensor(f, 0)->name, "t\xc3\xa9");
  stab_gguf_close(f);
  remove_tmpdir();
}
END_TEST

/* ---- malformed files --------------------------------------------------------------- */

static void header(gw_buf *b, uint64_t nt, uint64_t nkv) {
  gw_put(b, "GGUF", 4);
  gw_u32(b, 3);
  gw_u64(b, nt);
  gw_u64(b, nkv);
}

/* A tensor info: name, n_dims, ne..., type, offset. */
static void info(gw_buf *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type, uint64_t off) {
  gw_str(b, name);
  gw_u32(b, nd);
  for (uint32_t d = 0; d < nd; d++) gw_u64(b, ne[d]);
  gw_u32(b, type);
  gw_u64(b, off);
}

/* One F32 tensor of ne[0] elements at offset off, with data bytes of data. */
static void one_tensor(gw_buf *b, const char *name, uint64_t n, uint32_t type, uint64_t off, size_t data) {
  header(b, 1, 0);
  info(b, name, 1, &n, type, off);
  gw_pad(b, 32);
  for (size_t i = 0; i < data; i++) gw_u8(b, 0);
}

/* A well-formed two-tensor file (for the truncated cases). */
static void good(gw_buf *b) {
  header(b, 2, 1);
  gw_str(b, "general.architecture"), gw_u32(b, GW_STRING), gw_str(b, "llama");
  info(b, "a", 2, (uint64_t[]){4, 4}, GW_F32, 0);
  info(b, "b", 1, (uint64_t[]){8}, GW_F32, 64);
  gw_pad(b, 32);
  for (int i = 0; i < 96; i++) gw_u8(b, (uint8_t)i);
}

typedef struct {
  const char *file, *want;
  int kind; /* builder below */
  long long cut; /* >= 0: the file is cut to this many bytes; < -1: cut that many from the end */
} bad_case;

static void build(const bad_case *c, gw_buf *b) {
  switch (c->kind) {
  case 0: good(b); break;
  case 1: gw_put(b, "GGUX", 4), gw_u32(b, 3), gw_u64(b, 0), gw_u64(b, 0); break;
  case 2: gw_put(b, "GGUF", 4), gw_u32(b, 1), gw_u64(b, 0), gw_u64(b, 0); break;
  case 3: gw_put(b, "GGUF", 4), gw_u32(b, 0x03000000u), gw_u64(b, 0), gw_u64(b, 0); break;
  case 4: header(b, 1ull << 40, 0), info(b, "a", 1, (uint64_t[]){1}, GW_F32, 0); break;
  case 5: header(b, 0, 1ull << 40), gw_str(b, "k"), gw_u32(b, GW_UINT8), gw_u8(b, 1); break;
  case 6: header(b, 0, 1), gw_u64(b, 1ull << 40), gw_put(b, "key", 3), gw_u32(b, 0), gw_u8(b, 0); break;
  case 7: header(b, 0, 1), gw_str(b, "k"), gw_u32(b, GW_STRING), gw_u64(b, 1ull << 50), gw_put(b, "abc", 3); break;
  case 8: header(b, 0, 1), gw_str(b, "k"), gw_u32(b, GW_ARRAY), gw_u32(b, GW_UINT32), gw_u64(b, 1ull << 60); break;
  case 9:
    header(b, 0, 1), gw_str(b, "k"), gw_u32(b, GW_ARRAY), gw_u32(b, GW_STRING), gw_u64(b, 1ull << 40);
    gw_str(b, "x");
    break;
  case 10:
    header(b, 0, 1), gw_str(b, "k"), gw_u32(b, GW_ARRAY);
    for (int d = 0; d < 12; d++) gw_u32(b, GW_ARRAY), gw_u64(b, 1);
    gw_u32(b, GW_UINT8), gw_u64(b, 0);
    break;
  case 11: header(b, 0, 1), gw_str(b, "k"), gw_u32(b, 13), gw_u8(b, 0); break;
  case 12: header(b, 0, 1), gw_str(b, "k"), gw_u32(b, GW_BOOL), gw_u8(b, 2); break;
  case 13: header(b, 0, 1), gw_str(b, "general.alignment"), gw_u32(b, GW_UINT32), gw_u32(b, 48); break;
  case 14: header(b, 0, 1), gw_str(b, "general.alignment"), gw_u32(b, GW_UINT64), gw_u64(b, 32); break;
  case 15:
    header(b, 0, 2), gw_str(b, "a"), gw_u32(b, GW_UINT8), gw_u8(b, 1);
    gw_str(b, "a"), gw_u32(b, GW_UINT8), gw_u8(b, 2);
    break;
  case 16: one_tensor(b, "", 1, GW_F32, 0, 4); break;
  case 17: header(b, 1, 0), gw_u64(b, 3), gw_put(b, "a\0b", 3), gw_u32(b, 1), gw_u64(b, 1), gw_u32(b, 0), gw_u64(b, 0);
    gw_pad(b, 32), gw_u32(b, 0);
    break;
  case 18: header(b, 1, 0), info(b, "a", 5, (uint64_t[]){1, 1, 1, 1, 1}, GW_F32, 0), gw_pad(b, 32), gw_u32(b, 0); break;
  case 19: header(b, 1, 0), info(b, "a", 0, NULL, GW_F32, 0), gw_pad(b, 32), gw_u32(b, 0); break;
  case 20: header(b, 1, 0), info(b, "a", 2, (uint64_t[]){1, (uint64_t)-1}, GW_F32, 0), gw_pad(b, 32); break;
  case 21:
    header(b, 1, 0), info(b, "a", 3, (uint64_t[]){1ull << 32, 1ull << 32, 16}, GW_F32, 0), gw_pad(b, 32);
    gw_u32(b, 0);
    break;
  case 22: header(b, 1, 0), info(b, "a", 1, (uint64_t[]){1ull << 62}, GW_F64, 0), gw_pad(b, 32); break;
  case 23: one_tensor(b, "a", 1, 4, 0, 4); break;
  case 24: one_tensor(b, "a", 1, 1000, 0, 4); break;
  case 25: one_tensor(b, "a", 16, GW_Q4_0, 0, 18); break;
  case 26: one_tensor(b, "a", 1, GW_F32, 4, 8); break;
  case 27: one_tensor(b, "a", 16, GW_F32, 4096, 64); break;
  case 28:
    header(b, 2, 0), info(b, "a", 1, (uint64_t[]){16}, GW_F32, 0), info(b, "b", 1, (uint64_t[]){16}, GW_F32, 32);
    gw_pad(b, 32);
    for (int i = 0; i < 96; i++) gw_u8(b, 0);
    break;
  case 29:
    header(b, 2, 0), info(b, "w", 1, (uint64_t[]){8}, GW_F32, 0), info(b, "w", 1, (uint64_t[]){8}, GW_F32, 32);
    gw_pad(b, 32);
    for (int i = 0; i < 64; i++) gw_u8(b, 0);
    break;
  case 30: header(b, 1, 0), info(b, "a", 1, (uint64_t[]){8}, GW_F32, 0); break; /* ends before the padding */
  case 31: gw_put(b, "GGUF", 4), gw_u32(b, 3), gw_u32(b, 0); break;
  case 32: header(b, 0, 1), gw_str(b, "general.architecture"), gw_u32(b, GW_STRING), gw_str(b, "llama"); break;
  case 33: one_tensor(b, "w\xc3(", 1, GW_F32, 0, 4); break; /* 0xc3 needs a continuation byte */
  case 34: header(b, 0, 1), gw_str(b, "k\xff"), gw_u32(b, GW_UINT8), gw_u8(b, 1); break;
  case 35: one_tensor(b, "\xed\xa0\x80", 1, GW_F32, 0, 4); break; /* a surrogate, U+D800 */
  case 36: one_tensor(b, "\xe2\x80\xae\xc0\xae", 1, GW_F32, 0, 4); break; /* U+202E, then an overlong '.' */
  }
}

/* Offsets of good(): header 24, pair 8 + 20 key + 4 type + 8 + 5 string = 45 -> infos at 69;
 * 'a' info 8 + 1 + 4 + 16 + 4 + 8 = 41 -> 'b' at 110 (+ 33 = 143), data at 160, 256 bytes. */
static const bad_case bad_cases[] = {
    {"bad_magic.gguf", "byte 0: bad magic 47 47 55 58", 1, -1},
    {"version_1.gguf", "byte 4: version 1 is not supported", 2, -1},
    {"big_endian.gguf", "byte 4: version 3 is a big-endian GGUF file", 3, -1},
    {"short.gguf", "fewer than the 24-byte GGUF header", 31, -1},
    {"tensor_count_beyond_file.gguf", "byte 8: tensor count 1099511627776 cannot fit", 4, -1},
    {"metadata_count_beyond_file.gguf", "byte 16: metadata count 1099511627776 cannot fit", 5, -1},
    {"key_length_beyond_file.gguf", "byte 24: a metadata key: string length 1099511627776 is beyond the file", 6, -1},
    {"string_length_beyond_file.gguf", "byte 37: a metadata string: string length 1125899906842624 is beyond the file", 7, -1},
    {"array_length_beyond_file.gguf", "byte 33: metadata 'k': array of 1152921504606846976 uint32 is beyond the file", 8, -1},
    {"string_array_beyond_file.gguf", "metadata 'k': array of 1099511627776 strings is beyond the file", 9, -1},
    {"nested_arrays.gguf", "metadata 'k': arrays nested more than 8 deep", 10, -1},
    {"unknown_value_type.gguf", "byte 33: metadata 'k': unknown value type 13", 11, -1},
    {"bool_not_0_1.gguf", "metadata 'k': bool value 2 is neither 0 nor 1", 12, -1},
    {"alignment_not_power_of_2.gguf", "byte 24: general.alignment is 48, not a power of two", 13, -1},
    {"alignment_not_uint32.gguf", "general.alignment has type uint64, not uint32", 14, -1},
    {"duplicate_key.gguf", "byte 38: duplicate metadata key 'a' (pairs 0 and 1)", 15, -1},
    {"empty_name.gguf", "byte 24: tensor 0's name is empty", 16, -1},
    {"nul_in_name.gguf", "byte 24: tensor 0's name holds a NUL byte", 17, -1},
    {"five_dims.gguf", "tensor 'a': n_dims 5 (must be 1 to 4)", 18, -1},
    {"zero_dims.gguf", "tensor 'a': n_dims 0", 19, -1},
    {"negative_dim.gguf", "tensor 'a': ne[1] is negative (-1)", 20, -1},
    {"shape_overflow.gguf", "tensor 'a': the product of ne[] overflows 64 bits", 21, -1},
    {"byte_size_overflow.gguf", "tensor 'a': its byte size overflows 64 bits", 22, -1},
    {"removed_type.gguf", "tensor 'a': unknown GGML type 4", 23, -1},
    {"unknown_type.gguf", "tensor 'a': unknown GGML type 1000", 24, -1},
    {"block_not_dividing.gguf", "tensor 'a': ne[0] = 16 is not a multiple of Q4_0's block of 32", 25, -1},
    {"misaligned_offset.gguf", "byte 24: tensor 'a': offset 4 is not a multiple of the alignment 32", 26, -1},
    {"offset_outside_data.gguf", "tensor 'a': offset 4096 + 64 bytes is outside the data section of 64 bytes", 27, -1},
    {"overlapping.gguf", "tensor 'b': data [32, 96) overlaps tensor 'a' [0, 64)", 28, -1},
    {"duplicate_name.gguf", "duplicate tensor name 'w' (tensors 0 and 1)", 29, -1},
    {"truncated_padding.gguf", "the file ends inside the padding before the data section", 30, -1},
    {"truncated_data.gguf", "byte 110: tensor 'b': offset 64 + 32 bytes is outside the data section of 88 bytes", 0, -8},
    {"truncated_infos.gguf", "byte 123: a tensor's ne[]: the file ends 7 bytes in", 0, 130},
    {"truncated_metadata.gguf", "byte 56: a metadata string: string length 5 is beyond the file (2 bytes left)", 32, 66},
    {"name_not_utf8.gguf", "byte 33: tensor 0's name is not valid UTF-8 (byte 0xc3 at index 1)", 33, -1},
    {"key_not_utf8.gguf", "byte 33: a metadata key is not valid UTF-8 (byte 0xff at index 1)", 34, -1},
    {"name_surrogate.gguf", "byte 32: tensor 0's name is not valid UTF-8 (byte 0xed at index 0)", 35, -1},
    {"name_overlong.gguf", "byte 35: tensor 0's name is not valid UTF-8 (byte 0xc0 at index 3)", 36, -1},
};
enum { NBAD = sizeof bad_cases / sizeof bad_cases[0] };

static void write_case(const bad_case *c, const char *path) {
  gw_buf b = {0};
  build(c, &b);
  if (c->cut >= 0) b.n = (size_t)c->cut;
  else if (c->cut < -1) b.n -= (size_t)(-c->cut);
  ck_assert_int_eq(gw_save(&b, path), 0);
  gw_free(&b);
}

START_TEST(test_bad_files) {
  make_tmpdir();
  const char *corpus_out = getenv("STAB_WRITE_CORPUS_GGUF"); /* regenerates the committed corpus */
  FILE *expected = NULL;
  if (corpus_out) {
    char p[512];
    snprintf(p, sizeof p, "%s/EXPECTED", corpus_out);
    ck_assert_ptr_nonnull(expected = fopen(p, "w"));
  }
  for (int k = 0; k < NBAD; k++) {
    const bad_case *c = &bad_cases[k];
    const char *path = tmp_path(c->file);
    write_case(c, path);
    if (corpus_out) {
      char p[512];
      snprintf(p, sizeof p, "%s/%s", corpus_out, c->file);
      write_case(c, p);
      fprintf(expected, "%s\t%s\n", c->file, c->want);
    }
    stab_gguf *f = (stab_gguf *)&f; /* must come back NULL */
    stab_status st = stab_gguf_open(path, &f);
    reader_assert_refused(c->file, path, st, STAB_EFORMAT, f == NULL, c->want);
  }
  if (expected) ck_assert_int_eq(fclose(expected), 0);
  /* the well-formed base of the truncated cases opens */
  gw_buf b = {0};
  good(&b);
  ck_assert_int_eq(gw_save(&b, tmp_path("good.gguf")), 0);
  gw_free(&b);
  stab_gguf *f = NULL;
  TU_ASSERT_OK(stab_gguf_open(tmp_path("good.gguf"), &f));
  ck_assert_uint_eq(stab_gguf_tensor(f, 1)->offset, 160 + 64);
  stab_gguf_close(f);
  remove_tmpdir();
}
END_TEST

/* Every committed corpus file fails cleanly with its expected message, and every case above
 * is in the corpus. */
START_TEST(test_corpus_replay) {
  const char *srcdir = getenv("srcdir");
  char dir[512], path[2048], line[1024];
  snprintf(dir, sizeof dir, "%s/tests/corpus/gguf", srcdir ? srcdir : ".");
  snprintf(path, sizeof path, "%s/EXPECTED", dir);
  FILE *e = fopen(path, "r");
  ck_assert_msg(e != NULL, "no %s (regenerate: STAB_WRITE_CORPUS_GGUF=%s)", path, dir);
  int files = 0;
  while (fgets(line, sizeof line, e)) {
    char *tab = strchr(line, '\t');
    ck_assert_ptr_nonnull(tab);
    *tab = '\0';
    tab[strcspn(tab + 1, "\n") + 1] = '\0';
    snprintf(path, sizeof path, "%s/%s", dir, line);
    stab_gguf *f = (stab_gguf *)&f; /* must come back NULL */
    stab_status st = stab_gguf_open(path, &f);
    reader_assert_refused(path, path, st, STAB_EFORMAT, f == NULL, tab + 1);
    files++;
  }
  fclose(e);
  for (int k = 0; k < NBAD; k++) {
    snprintf(path, sizeof path, "%s/%s", dir, bad_cases[k].file);
    ck_assert_msg(access(path, R_OK) == 0, "corpus lacks %s (regenerate: STAB_WRITE_CORPUS_GGUF=%s)", path, dir);
  }
  ck_assert_int_eq(files, NBAD);
}
END_TEST

/* The reference decoder (gq_element) and quantizers (gq_quantize) of each block layout are in
 * tests/support/gguf_quant.c, shared with tests/support/gguf_convert. */

static uint64_t qrng = 0x9e3779b97f4a7c15ull;
static uint32_t qrand(void) {
  qrng ^= qrng << 13, qrng ^= qrng >> 7, qrng ^= qrng << 17;
  return (uint32_t)(qrng >> 16);
}
/* a random finite f16 of modest size (exponent 1..20 of 31: |x| < 64), either sign */
static uint16_t rand_half(void) {
  return (uint16_t)((qrand() & 0x8000u) | ((1 + qrand() % 20) << 10) | (qrand() & 0x3ffu));
}

/* Random blocks of every type (random quants, random finite f16 scales) written as a tensor
 * of rows x cols; the library's f32 must equal the reference decoder's bit for bit, read
 * whole and in ranges that start and end inside blocks. */
START_TEST(test_quant_layouts) {
  make_tmpdir();
  enum { ROWS = 3, BLOCKS_PER_ROW = 2 };
  unsigned char *data[GQ_NTYPES];
  gw_file w;
  gw_init(&w);
  for (int k = 0; k < GQ_NTYPES; k++) {
    const gq_type *q = &gq_types[k];
    size_t nb = ROWS * BLOCKS_PER_ROW, bytes = nb * q->bytes;
    data[k] = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) data[k][i] = (unsigned char)qrand();
    for (size_t blk = 0; blk < nb; blk++)
      for (unsigned h = 0; h < q->nhalves; h++) {
        uint16_t v = rand_half();
        data[k][blk * q->bytes + q->halves[h]] = (unsigned char)v;
        data[k][blk * q->bytes + q->halves[h] + 1] = (unsigned char)(v >> 8);
      }
    gw_tensor(&w, q->name, 2, (uint64_t[]){BLOCKS_PER_ROW * q->block, ROWS}, (uint32_t)q->type, data[k], bytes);
  }
  ck_assert_int_eq(gw_write(&w, tmp_path("quant.gguf")), 0);
  stab_gguf *f = NULL;
  TU_ASSERT_OK(stab_gguf_open(tmp_path("quant.gguf"), &f));
  for (int k = 0; k < GQ_NTYPES; k++) {
    const gq_type *q = &gq_types[k];
    size_t i, n = ROWS * BLOCKS_PER_ROW * q->block;
    TU_ASSERT_OK(stab_gguf_find(f, q->name, &i));
    const stab_ckpt_tensor *t = stab_gguf_tensor(f, i);
    ck_assert_str_eq(t->dtype_name, q->name);
    ck_assert_int_eq(t->dtype, STAB_DTYPE_QUANT);
    ck_assert_uint_eq(t->shape[0], ROWS);
    ck_assert_uint_eq(t->shape[1], BLOCKS_PER_ROW * q->block);
    ck_assert_uint_eq(stab_ckpt_nbytes(t), ROWS * BLOCKS_PER_ROW * q->bytes);
    float *want = malloc(n * sizeof *want), *got = malloc(n * sizeof *got);
    for (size_t e = 0; e < n; e++) want[e] = gq_element(q->type, data[k] + e / q->block * q->bytes, (unsigned)(e % q->block));
    TU_ASSERT_OK(stab_ckpt_read_f32(t, 0, n, got));
    for (size_t e = 0; e < n; e++)
      ck_assert_msg(memcmp(&got[e], &want[e], sizeof got[e]) == 0, "%s element %zu: library %a, reference %a",
                    q->name, e, (double)got[e], (double)want[e]);
    /* ranges off the block boundaries: inside one block, across two, from mid-block to the end,
     * from a block's start to its middle; nothing written past the range */
    const size_t ranges[][2] = {{3, 5}, {q->block - 7, 20}, {q->block + 1, n - q->block - 1}, {n - 1, 1}, {q->block, 5}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
      memset(got, 0xff, n * sizeof *got);
      TU_ASSERT_OK(stab_ckpt_read_f32(t, ranges[r][0], ranges[r][1], got));
      ck_assert_msg(memcmp(got, want + ranges[r][0], ranges[r][1] * sizeof *got) == 0, "%s range [%zu, +%zu)",
                    q->name, ranges[r][0], ranges[r][1]);
      for (size_t e = ranges[r][1]; e < n; e++)
        ck_assert_msg(((const unsigned char *)(got + e))[0] == 0xff, "%s range [%zu, +%zu) wrote element %zu", q->name,
                      ranges[r][0], ranges[r][1], e);
    }
    TU_ASSERT_STATUS(stab_ckpt_read_f32(t, n - 1, 2, got), STAB_ERANGE);
    free(want), free(got), free(data[k]);
  }
  stab_gguf_close(f);
  remove_tmpdir();
}
END_TEST

/* The probe on a GGUF file whose linear layer the test quantized itself: every element within
 * the quantizer's bound of its weight, and the probe's sigma (--exact) that of LAPACK in f64 on
 * the test's own dequantized matrix. */
START_TEST(test_quant_round_trip) {
  make_tmpdir();
  const int types[] = {8, 2, 3, 6, 7, 14, 12};
  enum { D_OUT = 24, D_IN = 512, N = D_OUT * D_IN };
  float *w = malloc(N * sizeof *w), *deq = malloc(N * sizeof *deq);
  double *bnd = malloc(N * sizeof *bnd);
  for (int i = 0; i < N; i++) w[i] = (float)((int)(qrand() % 20001) - 10000) * 1e-4f;
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    const gq_type *q = NULL;
    for (int i = 0; i < GQ_NTYPES; i++)
      if (gq_types[i].type == types[k]) q = &gq_types[i];
    const size_t nblocks = N / q->block;
    unsigned char *data = malloc(nblocks * q->bytes);
    for (size_t b = 0; b < nblocks; b++) {
      ck_assert_int_eq(gq_quantize(q, w + b * q->block, data + b * q->bytes, deq + b * q->block, bnd + b * q->block), 0);
      for (size_t j = b * q->block; j < (b + 1) * q->block; j++)
        ck_assert_msg(fabs((double)w[j] - deq[j]) <= bnd[j], "%s element %zu: |%g - %g| > %g", q->name, j,
                      (double)w[j], (double)deq[j], bnd[j]);
    }
    gw_file g;
    gw_init(&g);
    gw_kv_str(&g, "general.architecture", "llama");
    gw_tensor(&g, "blk.0.ffn_up.weight", 2, (uint64_t[]){D_IN, D_OUT}, (uint32_t)q->type, data, nblocks * q->bytes);
    const char *path = tmp_path("rt.gguf");
    ck_assert_int_eq(gw_write(&g, path), 0);
    free(data);
    /* the library reads back the test's own dequantized matrix */
    stab_gguf *f = NULL;
    TU_ASSERT_OK(stab_gguf_open(path, &f));
    float *got = malloc(N * sizeof *got);
    TU_ASSERT_OK(stab_ckpt_read_f32(stab_gguf_tensor(f, 0), 0, N, got));
    ck_assert_msg(memcmp(got, deq, N * sizeof *got) == 0, "%s: read back differs from the test's dequantization", q->name);
    free(got);
    stab_gguf_close(f);
    const char *bd = getenv("builddir");
    char cmd[2048], out[65536];
    snprintf(cmd, sizeof cmd, "%s/harness/probe --json --exact '%s'", bd ? bd : ".", path);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = '\0';
    ck_assert_int_eq(pclose(p), 0);
    char want_dtype[64];
    snprintf(want_dtype, sizeof want_dtype, "\"dtype\": \"%s\"", q->name);
    const char *row = strstr(out, "\"tensor\": \"blk.0.ffn_up.weight\"");
    ck_assert_msg(row && strstr(row, want_dtype), "%s: no row with %s in %s", q->name, want_dtype, out);
    const char *s = strstr(row, "\"sigma\": ");
    ck_assert_ptr_nonnull(s);
    double sigma = strtod(s + 9, NULL), ref = ref_sigma(deq, D_OUT, D_IN, D_IN);
    ck_assert_msg(fabs(sigma - ref) <= 1e-9 * ref, "%s: probe sigma %.17g, LAPACK %.17g", q->name, sigma, ref);
  }
  free(w), free(deq), free(bnd);
  remove_tmpdir();
}
END_TEST

/* A quantized tensor whose data does not fit its type and shape is refused, naming it: a row
 * that is not whole blocks, and blocks that run past the file. */
START_TEST(test_quant_malformed) {
  make_tmpdir();
  static unsigned char zeros[4096];
  gw_file w;
  gw_init(&w);
  gw_tensor(&w, "blk.0.attn_q.weight", 2, (uint64_t[]){100, 2}, 12, zeros, 144);
  ck_assert_int_eq(gw_write(&w, tmp_path("row.gguf")), 0);
  stab_gguf *f = (stab_gguf *)&f;
  TU_ASSERT_STATUS(stab_gguf_open(tmp_path("row.gguf"), &f), STAB_EFORMAT);
  ck_assert_ptr_null(f);
  ck_assert_msg(strstr(stab_last_error(), "tensor 'blk.0.attn_q.weight': ne[0] = 100 is not a multiple of Q4_K's block of 256"),
                "%s", stab_last_error());
  /* 2 rows of Q6_K need 420 bytes; the file holds 210 */
  gw_init(&w);
  gw_tensor(&w, "blk.0.ffn_down.weight", 2, (uint64_t[]){256, 2}, 14, zeros, 210);
  ck_assert_int_eq(gw_write(&w, tmp_path("short.gguf")), 0);
  TU_ASSERT_STATUS(stab_gguf_open(tmp_path("short.gguf"), &f), STAB_EFORMAT);
  ck_assert_msg(strstr(stab_last_error(), "tensor 'blk.0.ffn_down.weight': offset 0 + 420 bytes is outside the data section of 210 bytes"),
                "%s", stab_last_error());
  /* a hand-made view of part of a block: refused, never read past its data */
  stab_ckpt_tensor t = {.name = "cut", .dtype_name = "Q8_0", .dtype = STAB_DTYPE_QUANT, .ndim = 1, .shape = {40},
                        .count = 40, .data = zeros};
  float out[40];
  TU_ASSERT_STATUS(stab_ckpt_read_f32(&t, 0, 8, out), STAB_EFORMAT);
  ck_assert_msg(strstr(stab_last_error(), "'cut': 40 elements of Q8_0 are not a whole number of 32-element blocks"), "%s",
                stab_last_error());
  /* a type not decoded stays refused with its name */
  gw_init(&w);
  gw_tensor(&w, "iq2", 1, (uint64_t[]){256}, 16, zeros, 66);
  ck_assert_int_eq(gw_write(&w, tmp_path("iq2.gguf")), 0);
  TU_ASSERT_OK(stab_gguf_open(tmp_path("iq2.gguf"), &f));
  ck_assert_int_eq(stab_gguf_tensor(f, 0)->dtype, STAB_DTYPE_OTHER);
  TU_ASSERT_STATUS(stab_ckpt_read_f32(stab_gguf_tensor(f, 0), 0, 1, out), STAB_EINVAL);
  ck_assert_msg(strstr(stab_last_error(), "'iq2' has dtype IQ2_XXS"), "%s", stab_last_error());
  stab_gguf_close(f);
  remove_tmpdir();
}
END_TEST

/* <arch>.attention.head_count stored per layer (an array, as GGUF allows and llama.cpp writes for
 * models whose layers differ): every attention row is not measured, its reason naming the key. */
START_TEST(test_head_count_per_layer) {
  make_tmpdir();
  gw_file w;
  gw_init(&w);
  gw_kv_str(&w, "general.architecture", "llama");
  static const uint32_t per_layer[2] = {2, 2};
  gw_kv_u32_array(&w, "llama.attention.head_count", per_layer, 2);
  float q[8 * 8];
  for (int i = 0; i < 64; i++) q[i] = (float)((i * 37) % 11) - 5.0f;
  const uint64_t ne[2] = {8, 8};
  gw_tensor(&w, "blk.0.attn_q.weight", 2, ne, GW_F32, q, sizeof q);
  gw_tensor(&w, "blk.0.attn_k.weight", 2, ne, GW_F32, q, sizeof q);
  ck_assert_int_eq(gw_write(&w, tmp_path("h.gguf")), 0);
  stab_probe_params pp = stab_probe_default_params();
  stab_probe *p = NULL;
  ck_assert_msg(stab_probe_open(tmp_path("h.gguf"), &pp, &p) == STAB_OK, "%s", stab_last_error());
  int seen = 0;
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    if (r.kind != STAB_KIND_ATTENTION) continue;
    seen = 1;
    ck_assert_msg(r.error && strstr(r.error, "llama.attention.head_count") && strstr(r.error, "per layer") &&
                      strstr(r.error, "--heads"),
                  "attention row's reason: '%s'", r.error ? r.error : "(none)");
  }
  ck_assert_msg(seen, "no attention row");
  stab_probe_free(p);
  /* --heads decides instead */
  pp.heads = 2;
  ck_assert_int_eq(stab_probe_open(tmp_path("h.gguf"), &pp, &p), STAB_OK);
  for (size_t i = 0; i < stab_probe_count(p); i++) {
    stab_probe_row r;
    ck_assert_int_eq(stab_probe_row_at(p, i, &r), STAB_OK);
    if (r.kind == STAB_KIND_ATTENTION) ck_assert_msg(!r.error && r.heads == 2, "with --heads 2: %s", r.error);
  }
  stab_probe_free(p);
  remove_tmpdir();
}
END_TEST

static Suite *probe_gguf_suite(void) {
  Suite *s = suite_create("probe_gguf");
  TCase *tc = tcase_create("values");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_values_and_metadata);
  tcase_add_test(tc, test_alignment);
  tcase_add_test(tc, test_string_value_bytes_kept);
  tcase_add_test(tc, test_head_count_per_layer);
  suite_add_tcase(s, tc);
  tc = tcase_create("quantized");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_quant_layouts);
  tcase_add_test(tc, test_quant_round_trip);
  tcase_add_test(tc, test_quant_malformed);
  suite_add_tcase(s, tc);
  tc = tcase_create("malformed");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_bad_files);
  tcase_add_test(tc, test_corpus_replay);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(probe_gguf_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
