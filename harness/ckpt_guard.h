/* ckpt_guard.h — keeps a program alive when a checkpoint file shrinks under its read-only
 * mapping (another process truncating or rewriting it in place): a read past the new end of
 * the file raises SIGBUS, in whichever thread made it (the library's OpenMP threads too).
 * The guard's handler maps a page of zeros over the faulting page of a registered range and
 * notes which file it was, so the read finishes with zeros; the caller checks
 * ckpt_guard_tripped() after each read and discards the results. A SIGBUS anywhere else
 * takes the default action (the process dies), as without the guard. The library installs
 * no handler: this is the program's choice. One guard per process, not reentrant. */
#ifndef STAB_CKPT_GUARD_H
#define STAB_CKPT_GUARD_H

#include <stddef.h>

/* Installs the SIGBUS handler. 0, or -1 with errno. */
int ckpt_guard_install(void);

/* Registers the mapped bytes [lo, lo + len) as file's (path is kept, not copied). Any number of
 * ranges (one per mapped file); 0, or -1 when out of memory. */
int ckpt_guard_add(const char *path, const void *lo, size_t len);

/* While path is being opened (its mapping's address not known yet), any SIGBUS with an
 * address is taken as that file shrinking. NULL ends it. */
void ckpt_guard_opening(const char *path);

/* The path of the file a read ran past the end of since the last ckpt_guard_clear(), or
 * NULL if none did. */
const char *ckpt_guard_tripped(void);
void ckpt_guard_clear(void);

/* Forgets every range (before their mappings are unmapped). */
void ckpt_guard_reset(void);

#endif
