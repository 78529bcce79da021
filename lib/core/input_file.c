/* input_file.c — the one way the library and its programs open a file they read: regular files
 * only, refused at once otherwise, so that no reader blocks on a FIFO with no writer or reads a
 * device such as /dev/zero without end. */
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Why a path was refused: one of these, with errno's value or the file's type and size. */
typedef enum { INPUT_OK, INPUT_CANNOT_OPEN, INPUT_CANNOT_STAT, INPUT_NOT_REGULAR, INPUT_TOO_LARGE } input_result;

typedef struct {
  int err;      /* errno, for CANNOT_OPEN and CANNOT_STAT */
  mode_t mode;  /* NOT_REGULAR: what the path is */
  uint64_t size;
} input_why;

/* Opens path read-only if it is a regular file of at most max_bytes (0: any size). Sets no
 * message: the sniffs below must stay quiet, stab_input_open words the result. */
static input_result input_open(const char *path, uint64_t max_bytes, int *fd_out, input_why *why) {
  struct stat sb;
  *fd_out = -1;
  /* stat first, so that a device is refused without being opened at all (opening one can have
   * effects of its own: a tape rewinds, a terminal becomes the controlling one). */
  if (stat(path, &sb) != 0) return why->err = errno, INPUT_CANNOT_OPEN;
  if (!S_ISREG(sb.st_mode)) return why->mode = sb.st_mode, INPUT_NOT_REGULAR;
  /* The path may have been replaced since the stat: O_NONBLOCK keeps the open of a FIFO from
   * waiting for a writer, O_NOCTTY a terminal from becoming ours, and the fstat decides on
   * what was opened. The flag changes nothing for a regular file. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return why->err = errno, INPUT_CANNOT_OPEN;
  input_result r = INPUT_OK;
  if (fstat(fd, &sb) != 0) why->err = errno, r = INPUT_CANNOT_STAT;
  else if (!S_ISREG(sb.st_mode)) why->mode = sb.st_mode, r = INPUT_NOT_REGULAR;
  else if ((why->size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0) > max_bytes && max_bytes) r = INPUT_TOO_LARGE;
  if (r != INPUT_OK) close(fd);
  else *fd_out = fd;
  return r;
}

/* What a path that is not a regular file is, for the message. */
static const char *file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

stab_status stab_input_open(const char *path, uint64_t max_bytes, int *fd_out, uint64_t *size_out) {
  if (fd_out) *fd_out = -1;
  if (size_out) *size_out = 0;
  if (!path || !fd_out) return stabi_fail(STAB_EINVAL, "stab_input_open: NULL %s", path ? "fd_out" : "path");
  input_why why = {0};
  switch (input_open(path, max_bytes, fd_out, &why)) {
  case INPUT_OK: break;
  case INPUT_CANNOT_OPEN: return stabi_fail(STAB_EIO, "%s: cannot open: %s", path, strerror(why.err));
  case INPUT_CANNOT_STAT: return stabi_fail(STAB_EIO, "%s: cannot stat: %s", path, strerror(why.err));
  case INPUT_NOT_REGULAR:
    return stabi_fail(STAB_EIO, "%s: not a regular file: it is %s", path, file_type(why.mode));
  case INPUT_TOO_LARGE:
    return stabi_fail(STAB_ERANGE, "%s: %llu bytes, more than the limit of %llu bytes", path,
                      (unsigned long long)why.size, (unsigned long long)max_bytes);
  }
  if (size_out) *size_out = why.size;
  return STAB_OK;
}

int stabi_input_starts_with(const char *path, const void *magic, size_t n) {
  unsigned char buf[16];
  input_why why = {0};
  int fd;
  if (!path || n > sizeof buf || input_open(path, 0, &fd, &why) != INPUT_OK) return 0;
  ssize_t got = pread(fd, buf, n, 0);
  close(fd);
  return got == (ssize_t)n && !memcmp(buf, magic, n);
}
