/* fuzz_sniff.c — libFuzzer target for the format sniff (lib/checkpoint/sniff.c): sniffs the input and
 * checks that the kind agrees with bytes the target tests on its own (the magic of each readable
 * kind, zip, HDF5, text without NUL bytes), that the status is STAB_OK exactly for the kinds the
 * readers read, and that a refusal names the file. Reads past the input are the sanitizers'. */
#define _GNU_SOURCE /* memmem */
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int has(const uint8_t *data, size_t size, const char *magic, size_t n) {
  return size >= n && !memcmp(data, magic, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_begin(data, size);
  stab_file_kind k = STAB_FILE_KIND_COUNT;
  stab_status st = stab_ckpt_sniff(path, &k);
  FUZZ_CHECK(k >= STAB_FILE_UNKNOWN && k < STAB_FILE_KIND_COUNT, "kind %d", (int)k);
  FUZZ_CHECK(strcmp(stab_file_kind_name(k), "?") != 0, "kind %d has no name", (int)k);
  int readable = k == STAB_FILE_SAFETENSORS || k == STAB_FILE_GGUF || k == STAB_FILE_LLMC;
  if (readable) {
    FUZZ_CHECK(st == STAB_OK, "status %d for %s", st, stab_file_kind_name(k));
  } else {
    FUZZ_CHECK(st == STAB_EFORMAT, "status %d for %s", st, stab_file_kind_name(k));
    FUZZ_CHECK(strstr(stab_last_error(), path) != NULL, "the message does not name the file: %s", stab_last_error());
    FUZZ_CHECK(strchr(stab_last_error(), '\n') == NULL, "a message of more than one line: %s", stab_last_error());
  }
  FUZZ_CHECK((k == STAB_FILE_EMPTY) == (size == 0), "%zu bytes taken for %s", size, stab_file_kind_name(k));
  if (k == STAB_FILE_SAFETENSORS)
    FUZZ_CHECK(size >= 9 && data[8] == '{' && !data[4] && !data[5] && !data[6] && !data[7], "not a safetensors start");
  if (k == STAB_FILE_GGUF) FUZZ_CHECK(has(data, size, "GGUF", 4), "GGUF without its magic");
  if (k == STAB_FILE_LLMC) FUZZ_CHECK(size >= 4 && fuzz_le32(data) == 20240326u, "llm.c without its magic");
  if (k == STAB_FILE_PYTORCH_ZIP || k == STAB_FILE_NPZ || k == STAB_FILE_ZIP)
    FUZZ_CHECK(has(data, size, "PK", 2), "a zip not starting with PK");
  if (k == STAB_FILE_HDF5 || k == STAB_FILE_TRACE)
    FUZZ_CHECK(size >= 8 && memmem(data, size < STAB_SNIFF_BYTES ? size : STAB_SNIFF_BYTES, "\x89HDF\r\n\x1a\n", 8),
               "HDF5 without its signature");
  if (k == STAB_FILE_TEXT || k == STAB_FILE_LFS_POINTER || k == STAB_FILE_SHARD_INDEX)
    FUZZ_CHECK(!memchr(data, 0, size < STAB_SNIFF_BYTES ? size : STAB_SNIFF_BYTES), "text with a NUL byte");
  /* a readable kind by its magic must be sniffed as such (a safetensors start wins over all) */
  if (size >= 9 && data[8] == '{' && !data[4] && !data[5] && !data[6] && !data[7] && fuzz_le32(data) >= 2)
    FUZZ_CHECK(k == STAB_FILE_SAFETENSORS, "a safetensors start taken for %s", stab_file_kind_name(k));
  else if (has(data, size, "GGUF", 4))
    FUZZ_CHECK(k == STAB_FILE_GGUF, "GGUF taken for %s", stab_file_kind_name(k));
  fuzz_end(size);
  return 0;
}
