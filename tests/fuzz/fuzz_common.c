/* fuzz_common.c — see fuzz.h: the input as a memfd, and the full, checked read of a tensor
 * that every reader's target does. */
#define _GNU_SOURCE
#include "fuzz.h"

#include <math.h>
#include <sanitizer/allocator_interface.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s:%d: check '%s' failed: ", file, line, cond);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n(last library error: %s)\n", stab_last_error());
  abort();
}

uint32_t fuzz_le32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t fuzz_le64(const uint8_t *p) { return (uint64_t)fuzz_le32(p) | ((uint64_t)fuzz_le32(p + 4) << 32); }

/* Heap accounting through the sanitizer allocator's hooks: every malloc and free of the
 * process passes here, but only those between fuzz_begin and fuzz_end are the reader's. */
static int counting;
static size_t live, peak;

static void on_malloc(const volatile void *p, size_t n) {
  (void)p;
  if (!counting) return;
  live += n;
  if (live > peak) peak = live;
}

static void on_free(const volatile void *p) {
  if (!counting || !p) return;
  size_t n = __sanitizer_get_allocated_size(p);
  live -= n < live ? n : live; /* blocks allocated before fuzz_begin were never counted */
}

const char *fuzz_begin(const uint8_t *data, size_t size) {
  /* One memfd for every input: no temporary files to clean up, nothing on disk, and the
   * readers see a regular file they can stat and map like any checkpoint. */
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("stabmeter-fuzz-input", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "memfd_create failed");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    FUZZ_CHECK(__sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) > 0, "cannot install the malloc hooks");
  }
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "cannot empty the memfd");
  for (size_t done = 0; done < size;) {
    ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
    FUZZ_CHECK(w > 0, "cannot write the input to the memfd");
    done += (size_t)w;
  }
  live = peak = 0;
  counting = 1;
  return path;
}

void fuzz_end(size_t size) {
  counting = 0;
  size_t limit = FUZZ_HEAP_PER_BYTE * size + FUZZ_HEAP_SLACK;
  FUZZ_CHECK(peak <= limit, "%zu heap bytes live at once for a %zu-byte file (limit %zu)", peak, size, limit);
}

void fuzz_check_open_failure(stab_status st, const char *path, int out_is_null) {
  FUZZ_CHECK(st == STAB_EFORMAT || st == STAB_ENOMEM, "a malformed file gave status %d (%s), not STAB_EFORMAT", (int)st,
             stab_strerror(st));
  FUZZ_CHECK(out_is_null, "the output pointer is not NULL after a failed open");
  FUZZ_CHECK(strstr(stab_last_error(), path) != NULL, "the message does not name the file: %s", stab_last_error());
}

/* The f32 bits an IEEE binary16 stands for, by arithmetic rather than bit moves: the
 * reference the library's conversion is checked against. Infinities and NaNs keep their
 * payload in the top mantissa bits, as the library documents. */
static uint32_t f16_reference_bits(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, bits;
  int e = (h >> 10) & 31, m = h & 1023;
  if (e == 31) return sign | 0x7f800000u | ((uint32_t)m << 13);
  float v = e ? ldexpf((float)(m + 1024), e - 25) : ldexpf((float)m, -24);
  memcpy(&bits, &v, sizeof bits);
  return sign | bits;
}

static uint32_t stored_bits(const stab_ckpt_tensor *t, const uint8_t *p) {
  switch (t->dtype) {
  case STAB_DTYPE_F32: return fuzz_le32(p);
  case STAB_DTYPE_F16: return f16_reference_bits((uint16_t)(p[0] | (p[1] << 8)));
  case STAB_DTYPE_BF16: return (uint32_t)(p[0] | (p[1] << 8)) << 16;
  case STAB_DTYPE_QUANT: /* no element size: fuzz_gguf checks these by their blocks */
  case STAB_DTYPE_OTHER: break;
  }
  return 0;
}

void fuzz_check_tensor(const stab_ckpt_tensor *t, const uint8_t *data, size_t size) {
  /* An odd block length, so that blocks start at every alignment. */
  enum { BLOCK = 1021 };
  static float buf[BLOCK];
  FUZZ_CHECK(t != NULL, "a tensor index inside the count gave NULL");
  FUZZ_CHECK(t->name != NULL && t->dtype_name != NULL, "NULL name or dtype name");
  const char *nm = t->name;
  FUZZ_CHECK(t->ndim <= STAB_CKPT_MAX_DIMS, "'%s': ndim %zu", nm, t->ndim);
  uint64_t count = 1;
  for (size_t d = 0; d < t->ndim; d++) {
    FUZZ_CHECK(t->shape[d] == 0 || count <= UINT64_MAX / t->shape[d], "'%s': shape product overflows", nm);
    count *= t->shape[d];
  }
  FUZZ_CHECK(count == t->count, "'%s': count %llu, shape product %llu", nm, (unsigned long long)t->count,
             (unsigned long long)count);
  size_t es = t->dtype == STAB_DTYPE_F32 ? 4 : t->dtype == STAB_DTYPE_OTHER ? t->elem_size : 2;
  FUZZ_CHECK(t->elem_size == es && es > 0, "'%s': dtype %s with element size %zu", nm, t->dtype_name, t->elem_size);
  FUZZ_CHECK(count <= size / es, "'%s': %llu elements cannot fit a %zu-byte file", nm, (unsigned long long)count, size);
  uint64_t nbytes = count * es;
  FUZZ_CHECK(t->offset <= size && nbytes <= size - t->offset, "'%s': bytes [%llu, +%llu) outside the %zu-byte file", nm,
             (unsigned long long)t->offset, (unsigned long long)nbytes, size);
  FUZZ_CHECK(nbytes == 0 || memcmp(t->data, data + t->offset, nbytes) == 0,
             "'%s': the data pointer does not show the file's bytes at offset %llu", nm, (unsigned long long)t->offset);

  /* reads outside the tensor are refused, whatever the dtype */
  FUZZ_CHECK(stab_ckpt_read_f32(t, count, 1, buf) == STAB_ERANGE, "'%s': a read past the end was not refused", nm);
  FUZZ_CHECK(stab_ckpt_read_f32(t, UINT64_MAX, 2, buf) == STAB_ERANGE, "'%s': a read at 2^64-1 was not refused", nm);
  if (t->dtype == STAB_DTYPE_OTHER) {
    FUZZ_CHECK(stab_ckpt_read_f32(t, 0, 0, buf) == STAB_EINVAL, "'%s': dtype %s read as f32", nm, t->dtype_name);
    stab_ckpt_release(t);
    return;
  }
  for (int pass = 0; pass < 2; pass++) {
    for (uint64_t first = 0; first < count; first += BLOCK) {
      size_t n = count - first < BLOCK ? (size_t)(count - first) : BLOCK;
      stab_status st = stab_ckpt_read_f32(t, first, n, buf);
      FUZZ_CHECK(st == STAB_OK, "'%s': reading [%llu, +%zu) gave status %d", nm, (unsigned long long)first, n, (int)st);
      const uint8_t *p = data + t->offset + first * es;
      for (size_t i = 0; i < n; i++) {
        uint32_t got;
        memcpy(&got, &buf[i], sizeof got);
        uint32_t want = stored_bits(t, p + i * es);
        FUZZ_CHECK(got == want, "'%s' (%s) element %llu: f32 bits %08x, want %08x", nm, t->dtype_name,
                   (unsigned long long)(first + i), got, want);
      }
    }
    /* pass 2: the same values after the pages were handed back and mapped again */
    stab_ckpt_release(t);
  }
}
