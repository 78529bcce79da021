/* reserve.c — disk space for the next flush, allocated beyond the file's end before HDF5 needs
 * it (HDF5 1.10.8 does not recover from a failed write), and given back at close. */
#define _GNU_SOURCE /* fallocate */
#include "trace/trace_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- disk space, reserved before HDF5 needs it ----------------------------------------- */

/* HDF5 1.10.8 does not recover from a failed write: the file's flush fails, so does its close,
 * and the library then crashes or reports an "infinite loop closing library" at exit. So HDF5
 * must never meet a full disk: the bytes a flush may add are allocated beforehand, beyond the
 * file's end (fallocate, FALLOC_FL_KEEP_SIZE: the size HDF5 sees does not change), and when they
 * cannot be, the trace fails by itself before HDF5 writes anything (the file stays as the last
 * flush left it and closes cleanly). Where the file system has no fallocate, nothing is
 * reserved and a full disk reaches HDF5 as before. The reserve is given back at close. */

/* The most a flush of `rows` rows can add to the file. Each dataset's rows fill chunks of
 * stabi_trace_chunk_of's rows (schema.c); a flush may start new rows of chunks (each
 * ceil(width / values) chunks): their bytes, plus the growth of the dataset's chunk index. That index is an extensible array whose
 * blocks grow with it (16 addresses at first, about as many as it holds later, in pages of
 * 1024): a block that chunk k may start holds at most k + 16 addresses of 8 bytes, capped at a
 * page; a KiB more covers the block headers and a new super block. A flush that starts no chunk
 * rewrites what exists in place. The constant covers HDF5's metadata and small-data
 * aggregators' blocks and the object headers' growth. */
static off_t reserve_bytes(const stab_trace *t, size_t rows) {
  off_t sum = (off_t)256 * 1024;
  const size_t w = (size_t)t->written;
  for (size_t k = 0; k < t->n_cols && rows; k++) {
    size_t cr, cv;
    stabi_trace_chunk_of(t->cols[k].width, &cr, &cv);
    const size_t across = (t->cols[k].width + cv - 1) / cv, now = (w + cr - 1) / cr, then = (w + rows + cr - 1) / cr;
    if (then == now) continue;
    const size_t chunks = (then - now) * (across ? across : 1), last = then * (across ? across : 1);
    const size_t index = (8 * (last + 16 < 1024 ? last + 16 : 1024) + 1024) * (chunks / 1024 + 1);
    sum += (off_t)(chunks * cr * cv * 8 + index);
  }
  return sum;
}

/* Makes sure reserve_bytes(rows) past the end of the file are allocated, for a flush of `rows`
 * rows. STAB_EIO naming the path and the system's words when the disk (or the quota) has no
 * room. */
stab_status stabi_trace_reserve(stab_trace *t, const char *who, size_t rows) {
  if (t->no_reserve || t->lock_fd < 0) return STAB_OK;
  struct stat sb;
  if (fstat(t->lock_fd, &sb) != 0)
    return stabi_fail(STAB_EIO, "%s: %s: cannot stat it: %s", who, t->path, strerror(errno));
  const off_t r = reserve_bytes(t, rows);
  if (sb.st_size + r <= t->reserved) return STAB_OK;
  /* twice what is needed, so that most flushes make no call; on a nearly full disk, what is */
  for (int k = 2; k >= 1; k--) {
    int rc;
    while ((rc = fallocate(t->lock_fd, FALLOC_FL_KEEP_SIZE, sb.st_size, k * r)) != 0 && errno == EINTR) {}
    if (rc == 0) {
      if (sb.st_size + k * r > t->reserved) t->reserved = sb.st_size + k * r;
      return STAB_OK;
    }
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      t->no_reserve = 1;
      return STAB_OK;
    }
    if (errno != ENOSPC && errno != EDQUOT) break;
  }
  return stabi_fail(STAB_EIO, "%s: %s: no room on the disk for the next rows (they need up to %lld bytes): %s",
                    who, t->path, (long long)r, strerror(errno));
}

/* Gives back the reserve beyond the file's end (after HDF5 closed it: its size is final).
 * Truncating to the size the file has frees the blocks past its end; a hole punched there
 * would not (ext4 ignores a punch beyond the end of the file: a 556 KB trace kept 1.8 MB). */
void stabi_trace_unreserve(stab_trace *t) {
  struct stat sb;
  if (t->lock_fd < 0 || t->reserved <= 0 || fstat(t->lock_fd, &sb) != 0 || sb.st_size >= t->reserved) return;
  while (ftruncate(t->lock_fd, sb.st_size) != 0 && errno == EINTR) {
    /* another failure leaves the blocks allocated until the file is truncated or removed:
     * space, never data */
  }
  t->reserved = 0;
}
