/* output_file.c — the one rule for a result already at the path a writer is about to write (a
 * trace, a checkpoint, a table of runs): kept and refused unless the caller was asked to add to
 * it or to replace it. The library's trace writer and every stabmeter program decide with it,
 * so that no run's results are replaced without a word. */
#include "core/core.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

stab_status stab_output_check(const char *path, stab_output_mode mode, const char *what) {
  static const char who[] = "stab_output_check";
  if (!path || !path[0]) return stabi_fail(STAB_EINVAL, "%s: path is NULL or empty", who);
  if (mode != STAB_OUTPUT_REPLACE && mode != STAB_OUTPUT_APPEND && mode != STAB_OUTPUT_NEW)
    return stabi_fail(STAB_EINVAL, "%s: %s: unknown mode %d", who, path, (int)mode);
  if (mode != STAB_OUTPUT_NEW) return STAB_OK;
  struct stat sb;
  /* lstat: a symbolic link counts as something there, even one leading nowhere */
  if (lstat(path, &sb) != 0) {
    if (errno == ENOENT) return STAB_OK;
    return stabi_fail(STAB_EIO, "%s: cannot tell whether it is there: %s", path, strerror(errno));
  }
  if (S_ISLNK(sb.st_mode) && stat(path, &sb) != 0) return STAB_OK; /* a dangling link holds nothing */
  return stabi_fail(STAB_EEXIST, "%s: %s is already there: kept as it is (nothing was written to it); "
                    "appending to it or replacing it must be asked for", path, what && what[0] ? what : "a file");
}
