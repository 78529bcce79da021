/* check_sniff.c — stab_ckpt_sniff on files written here byte by byte: each kind from its
 * defining bytes (and the near misses that must not be taken for it: a safetensors header
 * length whose low byte is a pickle's 0x80, a gzip with a zero mtime, a NUL in text), the
 * status (STAB_OK only for what the readers read), and every prefix of every sample: a valid
 * kind and status, never a read past the file's end (the sanitizer build sees one). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stabmeter.h"
#include "testutil.h"

static char dir[256];

/* Writes n bytes to dir/name; returns the path (static, overwritten by the next call). */
static const char *put(const char *name, const void *bytes, size_t n) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
  ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
  return path;
}

typedef struct {
  const char *file;
  const char *bytes;
  size_t n;
  stab_file_kind kind;
} sample;

#define S(file, lit, kind) {file, lit, sizeof lit - 1, kind}
static const sample samples[] = {
    S("a.safetensors", "\x02\0\0\0\0\0\0\0{}", STAB_FILE_SAFETENSORS),
    /* a header of 0x0480 bytes: its first two bytes are those of a protocol-4 pickle */
    S("b.safetensors", "\x80\x04\0\0\0\0\0\0{\"a\"", STAB_FILE_SAFETENSORS),
    /* a length past the end is still safetensors (the reader says truncated) */
    S("c.safetensors", "\xff\xff\0\0\0\0\0\0{", STAB_FILE_SAFETENSORS),
    /* 2^32 and up: no header; eight characters and a '{' are text */
    S("d.safetensors", "abcdefgh{\"x\": 1}", STAB_FILE_TEXT),
    S("m.gguf", "GGUF\3\0\0\0", STAB_FILE_GGUF),
    S("model.bin", "\xc6\xd7\x34\x01\x03\0\0\0", STAB_FILE_LLMC),
    S("state.bin", "\xc7\xd7\x34\x01", STAB_FILE_LLMC_OTHER),
    S("tok.bin", "\xc8\xd7\x34\x01", STAB_FILE_LLMC_OTHER),
    S("shard.bin", "\x88\xd8\x34\x01", STAB_FILE_LLMC_OTHER),
    S("p.bin", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x10\0\0\0archive/data.pkl",
      STAB_FILE_PYTORCH_ZIP),
    S("q.pt", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x08\0\0\0data.pkl", STAB_FILE_PYTORCH_ZIP),
    /* data.pkl second, after an entry of 3 stored bytes and 4 bytes of extra field */
    S("r.pt", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\x03\0\0\0\x03\0\0\0\x09\0\x04\0r/versionXXXX3\n\n"
              "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x0a\0\0\0r/data.pkl",
      STAB_FILE_PYTORCH_ZIP),
    /* the same second entry after one whose sizes come later (flag bit 3): not looked for */
    S("s.pt", "PK\3\4\x14\0\x08\0\0\0\0\0\0\0\0\0\0\0\x03\0\0\0\x03\0\0\0\x09\0\x04\0r/versionXXXX3\n\n"
              "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x0a\0\0\0r/data.pkl",
      STAB_FILE_ZIP),
    /* .npy then another name: a zip, not an npz */
    S("f.zip", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x05\0\0\0w.npy"
               "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x04\0\0\0note",
      STAB_FILE_ZIP),
    S("a.npz", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x05\0\0\0w.npy", STAB_FILE_NPZ),
    /* the name's length points past the file: a zip, and nothing read beyond */
    S("e.zip", "PK\3\4\x14\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\xff\0\0\0data.pkl", STAB_FILE_ZIP),
    S("empty.zip", "PK\5\6\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", STAB_FILE_ZIP),
    S("old.pt", "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", STAB_FILE_PYTORCH_LEGACY),
    S("x.pkl", "\x80\x05\x95\x05\0\0\0\0\0\0\0}\x94.", STAB_FILE_PICKLE),
    S("y.pkl", "\x80\x02}q\0.", STAB_FILE_PICKLE),
    S("w.npy", "\x93NUMPY\1\0", STAB_FILE_NPY),
    S("m.onnx", "\x08\x07\x12\x07pytorch", STAB_FILE_ONNX),
    S("m.onnx.bin", "\x08\x07\x12\x07pytorch", STAB_FILE_UNKNOWN),
    S("ggml.bin", "lmgg", STAB_FILE_GGML),
    S("ggmf.bin", "fmgg\1\0\0\0", STAB_FILE_GGML),
    S("ggjt.bin", "tjgg\3\0\0\0", STAB_FILE_GGML),
    S("ggla.bin", "algg", STAB_FILE_GGML),
    S("h.h5", "\x89HDF\r\n\x1a\n\0\0", STAB_FILE_HDF5),
    S("t.h5", "\x89HDF\r\n\x1a\n\0\0...stabmeter-trace...", STAB_FILE_TRACE),
    S("a.gz", "\x1f\x8b\x08\0\0\0\0\0\0\x03", STAB_FILE_GZIP), /* gzip -n: a zero mtime */
    S("a.zst", "\x28\xb5\x2f\xfd\x04", STAB_FILE_ZSTD),
    S("a.xz", "\xfd" "7zXZ\0\0", STAB_FILE_XZ),
    S("a.bz2", "BZh91AY&SY", STAB_FILE_BZIP2),
    S("BZh.txt", "BZhx is text", STAB_FILE_TEXT),
    S("lfs.safetensors", "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n", STAB_FILE_LFS_POINTER),
    S("i.json", "\n {\"metadata\": {}, \"weight_map\": {\"a\": \"s1.safetensors\"}}", STAB_FILE_SHARD_INDEX),
    S("j.json", "{\"weights\": 1}", STAB_FILE_TEXT),
    S("u.txt", "na\xc3\xafve caf\xc3\xa9\t\x1b[1mbold\x1b[0m\r\n", STAB_FILE_TEXT),
    S("nul.txt", "text\0with a NUL", STAB_FILE_UNKNOWN),
    S("bell.txt", "ding\x07", STAB_FILE_UNKNOWN),
    S("overlong.txt", "\xc0\xaf", STAB_FILE_UNKNOWN),
    S("rand.bin", "\xc0\xee\x68\x49\x8e\xdc\xa4\xc3", STAB_FILE_UNKNOWN),
};

static int readable(stab_file_kind k) {
  return k == STAB_FILE_SAFETENSORS || k == STAB_FILE_GGUF || k == STAB_FILE_LLMC;
}

START_TEST(test_each_kind) {
  for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) {
    const sample *s = &samples[i];
    const char *path = put(s->file, s->bytes, s->n);
    stab_file_kind k = STAB_FILE_KIND_COUNT;
    stab_status st = stab_ckpt_sniff(path, &k);
    ck_assert_msg(k == s->kind, "%s: kind %d (%s), want %d (%s)", s->file, k, stab_file_kind_name(k), s->kind,
                  stab_file_kind_name(s->kind));
    if (readable(k)) {
      ck_assert_msg(st == STAB_OK, "%s: status %d", s->file, st);
    } else {
      ck_assert_msg(st == STAB_EFORMAT, "%s: status %d", s->file, st);
      /* the message names the file and the kind, on one line */
      ck_assert_msg(strstr(stab_last_error(), path) && strstr(stab_last_error(), stab_file_kind_name(k)) &&
                        !strchr(stab_last_error(), '\n'),
                    "%s: message '%s'", s->file, stab_last_error());
    }
  }
}
END_TEST

/* An unknown binary file's message gives its first bytes in hex (16 at most) and its size. */
START_TEST(test_unknown_hex) {
  unsigned char b[40];
  for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)(0xa0 + i);
  stab_file_kind k;
  TU_ASSERT_STATUS(stab_ckpt_sniff(put("hex.bin", b, sizeof b), &k), STAB_EFORMAT);
  ck_assert_int_eq(k, STAB_FILE_UNKNOWN);
  ck_assert_msg(strstr(stab_last_error(), "first bytes: a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 aa ab ac ad ae af; 40 bytes"),
                "%s", stab_last_error());
}
END_TEST

/* A text file longer than what is read, cut inside a UTF-8 sequence at the read's end: text. */
START_TEST(test_text_cut_at_read_end) {
  size_t n = STAB_SNIFF_BYTES + 100;
  char *b = malloc(n);
  ck_assert_ptr_nonnull(b);
  memset(b, 'a', n);
  memcpy(b + STAB_SNIFF_BYTES - 1, "\xe2\x82\xac", 3); /* the euro sign across the read's end */
  stab_file_kind k;
  stab_ckpt_sniff(put("long.txt", b, n), &k);
  ck_assert_int_eq(k, STAB_FILE_TEXT);
  /* the same cut at the file's own end is not valid UTF-8 */
  stab_ckpt_sniff(put("cut.txt", b, STAB_SNIFF_BYTES), &k);
  ck_assert_int_eq(k, STAB_FILE_UNKNOWN);
  /* nor is a byte that starts no sequence, just before the read's end */
  b[STAB_SNIFF_BYTES - 1] = (char)0xff;
  stab_ckpt_sniff(put("long.txt", b, n), &k);
  ck_assert_int_eq(k, STAB_FILE_UNKNOWN);
  free(b);
}
END_TEST

/* Every prefix of every sample: a kind of the enum, OK only for the readable kinds, else
 * EFORMAT; a 0-byte prefix is EMPTY. */
START_TEST(test_every_prefix) {
  for (size_t i = 0; i < sizeof samples / sizeof *samples; i++)
    for (size_t n = 0; n <= samples[i].n; n++) {
      stab_file_kind k = STAB_FILE_KIND_COUNT;
      stab_status st = stab_ckpt_sniff(put("prefix", samples[i].bytes, n), &k);
      ck_assert_msg(k < STAB_FILE_KIND_COUNT, "%s[0..%zu): kind %d", samples[i].file, n, k);
      ck_assert_msg(st == (readable(k) ? STAB_OK : STAB_EFORMAT), "%s[0..%zu): status %d", samples[i].file, n, st);
      if (n == 0) ck_assert_int_eq(k, STAB_FILE_EMPTY);
    }
}
END_TEST

START_TEST(test_arguments_and_names) {
  stab_file_kind k = STAB_FILE_TEXT;
  TU_ASSERT_STATUS(stab_ckpt_sniff(NULL, &k), STAB_EINVAL);
  ck_assert_int_eq(k, STAB_FILE_UNKNOWN);
  TU_ASSERT_STATUS(stab_ckpt_sniff(dir, NULL), STAB_EINVAL);
  k = STAB_FILE_TEXT;
  TU_ASSERT_STATUS(stab_ckpt_sniff(dir, &k), STAB_EIO); /* a directory */
  ck_assert_int_eq(k, STAB_FILE_UNKNOWN);
  ck_assert_msg(strstr(stab_last_error(), "directory"), "%s", stab_last_error());
  char missing[300];
  snprintf(missing, sizeof missing, "%s/missing", dir);
  TU_ASSERT_STATUS(stab_ckpt_sniff(missing, &k), STAB_EIO);
  /* every kind has a name of its own */
  for (int a = 0; a < STAB_FILE_KIND_COUNT; a++) {
    ck_assert_str_ne(stab_file_kind_name((stab_file_kind)a), "?");
    for (int b = 0; b < a; b++)
      ck_assert_str_ne(stab_file_kind_name((stab_file_kind)a), stab_file_kind_name((stab_file_kind)b));
  }
  ck_assert_str_eq(stab_file_kind_name(STAB_FILE_KIND_COUNT), "?");
  ck_assert_str_eq(stab_file_kind_name((stab_file_kind)-1), "?");
}
END_TEST

/* Removes what the tests wrote (each test writes only these names into dir). */
static void clean(void) {
  static const char *const extra[] = {"hex.bin", "long.txt", "cut.txt", "prefix"};
  char path[512];
  for (size_t i = 0; i < sizeof samples / sizeof *samples + 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, i < 4 ? extra[i] : samples[i - 4].file);
    unlink(path);
  }
  if (rmdir(dir) != 0) fprintf(stderr, "check_sniff: cannot remove %s: %s\n", dir, strerror(errno));
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/check_sniff.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  Suite *s = suite_create("sniff");
  TCase *tc = tcase_create("sniff");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_each_kind);
  tcase_add_test(tc, test_unknown_hex);
  tcase_add_test(tc, test_text_cut_at_read_end);
  tcase_add_test(tc, test_every_prefix);
  tcase_add_test(tc, test_arguments_and_names);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  clean();
  return failures ? 1 : 0;
}
