/* image.c — a new trace file: built in memory by HDF5, its image written by us to a temporary
 * file beside the trace (with the superblock checksum HDF5 1.10.8 leaves wrong repaired), opened
 * for SWMR writing and published under the trace's path as lock.c's protocol says. */
#include "trace/trace_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the new file's image -------------------------------------------------------------- */

/* Bob Jenkins' lookup3 hash ("hashlittle"), which HDF5 uses as its metadata checksum. */
static uint32_t rot32(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

static uint32_t lookup3(const unsigned char *k, size_t n) {
  uint32_t a, b, c;
  a = b = c = 0xdeadbeefu + (uint32_t)n;
  for (; n > 12; n -= 12, k += 12) {
    a += k[0] | (uint32_t)k[1] << 8 | (uint32_t)k[2] << 16 | (uint32_t)k[3] << 24;
    b += k[4] | (uint32_t)k[5] << 8 | (uint32_t)k[6] << 16 | (uint32_t)k[7] << 24;
    c += k[8] | (uint32_t)k[9] << 8 | (uint32_t)k[10] << 16 | (uint32_t)k[11] << 24;
    a -= c, a ^= rot32(c, 4), c += b;
    b -= a, b ^= rot32(a, 6), a += c;
    c -= b, c ^= rot32(b, 8), b += a;
    a -= c, a ^= rot32(c, 16), c += b;
    b -= a, b ^= rot32(a, 19), a += c;
    c -= b, c ^= rot32(b, 4), b += a;
  }
  if (n == 0) return c;
  uint32_t w[3] = {0, 0, 0}; /* the last 1..12 bytes, little-endian words, zero-padded */
  for (size_t i = 0; i < n; i++) w[i / 4] |= (uint32_t)k[i] << (8 * (i % 4));
  a += w[0], b += w[1], c += w[2];
  c ^= b, c -= rot32(b, 14);
  a ^= c, a -= rot32(c, 11);
  b ^= a, b -= rot32(a, 25);
  c ^= b, c -= rot32(b, 16);
  a ^= c, a -= rot32(c, 4);
  b ^= a, b -= rot32(a, 14);
  c ^= b, c -= rot32(b, 24);
  return c;
}

/* HDF5 1.10.8's H5Fget_file_image clears the superblock's status flags in the image of a file
 * open for writing but keeps the checksum of the flags it had, so the image does not open
 * ("incorrect metadata checksum"). The checksum of a version 2 or 3 superblock (signature,
 * version, sizes of offsets and lengths, flags, four addresses) is computed again here: right
 * whichever way HDF5 left it. */
static void fix_superblock(unsigned char *img, size_t n) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n < 12 || memcmp(img, sig, 8) != 0 || img[8] < 2) return;
  size_t body = 12 + 4 * (size_t)img[9];
  if (body + 4 > n) return;
  uint32_t c = lookup3(img, body);
  for (int i = 0; i < 4; i++) img[body + i] = (unsigned char)(c >> (8 * i));
}

/* Writes all of buf to fd at offset 0. 0, or the errno. */
static int write_all(int fd, const unsigned char *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = pwrite(fd, buf + done, n - done, (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    done += (size_t)w;
  }
  return 0;
}

/* A new trace. It is built in memory (HDF5's core driver) and written to its temporary file by
 * us, so that HDF5 never writes a file being created: a disk that is full at the start fails
 * here, with the system's message, before HDF5 has a file to leave half-closed (see reserve.c).
 * The temporary file, "<path>.<pid>.tmp", is created O_EXCL and locked at once; HDF5 opens it,
 * starts SWMR writing, and stabi_trace_publish (lock.c) makes it the trace. *tmp receives its
 * name (to remove on failure); *again as stabi_trace_publish says.
 * Migrating (old >= 0: the trace at path, of format old_version, open and locked by old_fd), the
 * new file gets old's rows, creation time and run_config, and is renamed over path at once: the
 * lock of the inode path names is held, so no other writer can be replacing it. */
stab_status stabi_trace_create_new(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, char **tmp,
                                   int *again, hid_t old, int64_t old_version) {
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  unsigned char *image = NULL;
  char *run_config = NULL;
  char created[32];
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  else snprintf(created, sizeof created, "unknown");
  hid_t mem = H5Pcopy(fapl);
  if (mem < 0 || H5Pset_fapl_core(mem, (size_t)1 << 16, 0) < 0) {
    st = stabi_trace_h5fail(who, path, "cannot set up HDF5's in-memory file");
    goto out;
  }
  if (old >= 0) {
    stabi_trace_get_string(old, "created_utc", b->str, created, sizeof created);
    hid_t a = H5Aexists(old, "run_config") > 0 ? H5Aopen(old, "run_config", H5P_DEFAULT) : H5I_INVALID_HID;
    if (a >= 0 && H5Aread(a, b->str, &run_config) < 0) run_config = NULL;
    if (a >= 0) H5Aclose(a);
  }
  st = stabi_trace_create_file(t, b, mem, gnames, created, old >= 0 ? (run_config ? run_config : "{}") : b->p->run_config);
  if (st == STAB_OK && old >= 0) st = stabi_trace_migrate_rows(t, b, old, old_version, gnames);
  if (st != STAB_OK) goto out;
  for (size_t k = 0; k < t->n_cols; k++)
    if (t->cols[k].d >= 0) H5Dclose(t->cols[k].d), t->cols[k].d = H5I_INVALID_HID;
  /* H5Fget_file_image does not flush HDF5's metadata cache itself: without this flush the
   * image would hold the superblock alone */
  ssize_t size = H5Fflush(t->file, H5F_SCOPE_GLOBAL) < 0 ? -1 : H5Fget_file_image(t->file, NULL, 0);
  if (size <= 0) {
    st = stabi_trace_h5fail(who, path, "cannot take the new file's image");
    goto out;
  }
  if (!(image = malloc((size_t)size))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory for the new file (%lld bytes)", who, (long long)size);
    goto out;
  }
  if (H5Fget_file_image(t->file, image, (size_t)size) != size) {
    st = stabi_trace_h5fail(who, path, "cannot take the new file's image");
    goto out;
  }
  fix_superblock(image, (size_t)size);
  H5Fclose(t->file); /* memory only: nothing to write, nothing to fail */
  t->file = H5I_INVALID_HID;

  size_t len = strlen(path) + 48;
  if (!(*tmp = malloc(len))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  int fd = -1;
  for (unsigned n = 0; fd < 0 && n < 100; n++) { /* another name if a killed writer left one */
    if (n == 0) snprintf(*tmp, len, "%s.%ld.tmp", path, (long)getpid());
    else snprintf(*tmp, len, "%s.%ld.%u.tmp", path, (long)getpid(), n);
    fd = open(*tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    st = stabi_fail(STAB_EIO, "%s: %s: cannot create the new trace beside it (%s): %s", who, path, *tmp,
                    strerror(errno));
    free(*tmp), *tmp = NULL; /* not ours: never removed */
    goto out;
  }
  t->lock_fd = fd;
  int e = stabi_trace_lock_fd(fd); /* no one else knows this file yet: only a system failure stops it */
  if (!e) e = write_all(fd, image, (size_t)size);
  if (e) {
    st = stabi_fail(STAB_EIO, "%s: %s: cannot write the new trace: %s", who, path, strerror(e));
    goto out;
  }
  if ((st = stabi_trace_open_disk(t, b, fapl, gnames, *tmp)) != STAB_OK) goto out;
  if (H5Fstart_swmr_write(t->file) < 0) {
    st = stabi_trace_h5fail(who, path, "cannot start SWMR writing");
    goto out;
  }
  if (old < 0) st = stabi_trace_publish(t, who, *tmp, b->p->append, again);
  else if (rename(*tmp, path) != 0)
    st = stabi_fail(STAB_EIO, "%s: %s: cannot rename the migrated trace to it: %s", who, path, strerror(errno));
out:
  if (run_config) H5free_memory(run_config);
  free(image);
  if (mem >= 0) H5Pclose(mem);
  return st;
}
