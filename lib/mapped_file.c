/* mapped_file.c — a whole checkpoint file mapped read-only, with the path it was opened by,
 * shared by the checkpoint readers so that opening, checking and mapping a file fail the same
 * way with the same messages. */
#include "internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Maps the regular file at path read-only, whole, into *map and *size; see stabi_mapped_open
 * for the statuses. The descriptor is closed either way. */
static stab_status map_file(const char *path, uint64_t min_bytes, const char *what, unsigned char **map,
                            uint64_t *size) {
  *map = NULL;
  *size = 0;
  int fd;
  uint64_t n;
  stab_status st = stab_input_open(path, 0, &fd, &n);
  if (st != STAB_OK) return st;
  if (n < min_bytes || n == 0) {
    st = stabi_fail(STAB_EFORMAT, "%s: truncated: %llu bytes, fewer than %s", path,
                    (unsigned long long)n, what);
    goto out;
  }
  if (n > (uint64_t)SIZE_MAX) {
    st = stabi_fail(STAB_EIO, "%s: too large to map", path);
    goto out;
  }
  void *m = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) {
    st = stabi_fail(STAB_EIO, "%s: cannot map: %s", path, strerror(errno));
    goto out;
  }
  *map = m;
  *size = n;
out:
  close(fd);
  return st;
}

stab_status stabi_mapped_open(stabi_mapped *m, const char *path, uint64_t min_bytes, const char *what) {
  *m = (stabi_mapped){0};
  if (!(m->path = strdup(path))) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  stab_status st = map_file(path, min_bytes, what, &m->map, &m->size);
  if (st != STAB_OK) stabi_mapped_close(m);
  return st;
}

void stabi_mapped_close(stabi_mapped *m) {
  if (m->map) munmap(m->map, m->size);
  free(m->path);
  *m = (stabi_mapped){0};
}
