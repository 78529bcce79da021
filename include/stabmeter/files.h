/* stabmeter/files.h — the two rules of the library's files: how everything it reads is opened
 * (a regular file only, never blocking) and what a writer may do to a file already at its
 * output's path. Part of <stabmeter.h>. */
#ifndef STABMETER_FILES_H
#define STABMETER_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Input files                                                                         */

/* Opens the file at path for reading, the one way every reader of the library and every
 * stabmeter program opens a file it reads (checkpoints, traces, configs, corpora): only a
 * regular file (symbolic links followed) is opened. A FIFO, a device (/dev/zero, /dev/null, a
 * terminal), a socket or a directory is refused at once, without blocking and, when the path
 * already names one, without opening it; the message says what the path is.
 *  max_bytes  the largest size accepted, in bytes; 0: any size
 *  fd_out     receives the descriptor (read-only, close-on-exec; O_NONBLOCK is set, which
 *             changes nothing for a regular file); the caller closes it. -1 on failure
 *  size_out   receives the file's size in bytes at the open, or NULL
 * Errors: NULL path or fd_out STAB_EINVAL; a path that cannot be opened or stat'd (missing,
 * no permission), or that is not a regular file, STAB_EIO naming the path ("not a regular
 * file: it is a FIFO (named pipe)"); a file larger than max_bytes STAB_ERANGE naming the
 * path, its size and the limit. Thread-safe. */
stab_status stab_input_open(const char *path, uint64_t max_bytes, int *fd_out, uint64_t *size_out);

/* ---------------------------------------------------------------------------------- */
/* Output files: what may happen to results already there                              */

/* The one rule of every writer of results, the library's trace and the stabmeter programs
 * alike: a file already at an output's path is never replaced without a word. A writer adds to
 * it where it was asked to and that is meaningful (a trace: the same layers, rows after its
 * last; a table of runs: the same columns, rows of other runs), replaces it only when asked,
 * and otherwise refuses it, leaving it as it is. The values are those of
 * stab_trace_params.append. */
typedef enum {
  STAB_OUTPUT_REPLACE = 0, /* replace what is there (the caller was asked to) */
  STAB_OUTPUT_APPEND = 1,  /* keep it and add to it; the writer checks that what it adds fits */
  STAB_OUTPUT_NEW = 2      /* a new file: one already there is refused (STAB_EEXIST) and kept */
} stab_output_mode;

/* Says whether a writer may go on to write path with mode: STAB_OK when nothing is there, or
 * when mode is STAB_OUTPUT_APPEND or STAB_OUTPUT_REPLACE (the writer then appends or replaces
 * as its format says). With STAB_OUTPUT_NEW, anything at path (a file, a directory, a link to
 * something) is STAB_EEXIST, the message naming path and what (e.g. "a trace"; NULL: "a file")
 * and saying that it was kept; a symbolic link leading nowhere holds nothing and is STAB_OK.
 * Writes nothing. A check, not a lock: a writer that must not race another creates its file
 * with "only if nothing is there" (O_EXCL, RENAME_NOREPLACE), as stab_trace_open does.
 * Errors: NULL or empty path, unknown mode STAB_EINVAL; a path that cannot be looked at (a
 * component not searchable) STAB_EIO naming it; STAB_EEXIST as above. Thread-safe. */
stab_status stab_output_check(const char *path, stab_output_mode mode, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_FILES_H */
