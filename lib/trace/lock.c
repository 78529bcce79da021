/* lock.c — one writer per trace: the lock a writer holds on the file for as long as the trace is
 * open, and the protocol by which a new trace takes its path without ever replacing a file
 * another writer holds. */
#define _GNU_SOURCE /* F_OFD_SETLK, renameat2 */
#include "trace/trace_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- one writer per trace: the lock protocol ------------------------------------------- */

/* HDF5 1.10 gives up its own file lock once SWMR writing starts, and a resume clears the mark a
 * killed writer leaves: the trace needs a lock of its own. It is an open-file-description lock
 * (Linux F_OFD_SETLK, whole file, write) held on a descriptor of ours for as long as the trace
 * is open: HDF5 closing its own descriptors does not drop it (a POSIX record lock would go), it
 * does not touch HDF5's flock, and the kernel drops it when the writer dies.
 *
 * The protocol. A lock belongs to an inode, and a path can be made to name another inode by
 * rename, so every writer (1) locks the inode before writing it, and (2) changes what the path
 * names only while holding the lock of the inode it names, or with an atomic "only if nothing
 * is there":
 *  - new trace, path absent: the trace is built under a temporary name in the same directory
 *    (created O_EXCL, locked at once, HDF5 started in SWMR mode on it), then published with
 *    renameat2(RENAME_NOREPLACE), or link() + unlink() where the file system refuses that flag.
 *    EEXIST means another writer published first: start again from the top (which now finds
 *    the path present).
 *  - new trace, path present (replacing a finished trace): after building the temporary file,
 *    lock the file at path, check that path still names the inode locked (stat against fstat:
 *    dev and ino), and rename over it while holding that lock. Busy: STAB_EBUSY. Not the same
 *    inode any more: another writer replaced it meanwhile; start again from the top.
 *  - append, path present: lock the file at path, check that path still names it (as above),
 *    then let HDF5 open it. Path absent: a new trace, as above, except that a path present by
 *    the time of publishing (another writer's new trace, perhaps finished already) is never
 *    replaced: start again, which appends to it.
 * Two writers on one path, every interleaving (the winner is whoever takes a lock first or
 * publishes first; the other gets STAB_EBUSY and leaves nothing behind):
 *  - create/create: both NOREPLACE; one rename succeeds, the other's fails with EEXIST, it
 *    starts again, finds the path locked by the winner: busy.
 *  - create/replace: the creator publishes first: the replacer then locks the creator's inode
 *    (busy) or had locked the old inode, and rechecking finds a new inode: again, then busy.
 *    The replacer renames first: the creator's NOREPLACE fails, then busy.
 *  - replace/replace: both lock the old inode; one gets it, renames, and only then drops the
 *    old lock; the other either fails to lock (busy) or locks the dead old inode and its
 *    recheck sees the winner's inode: again, then busy.
 *  - append/replace, append/append: whoever locks the inode at path first holds it; the
 *    other is busy, or (having locked an inode since replaced) sees the recheck fail: again.
 * A writer killed at any step: before publishing, it leaves its temporary file (named with its
 * pid) and no lock; after, a trace at path whose lock the kernel dropped, to be appended to (the
 * SWMR mark is cleared) or replaced. Nothing a live writer holds is ever renamed over.
 * "Start again" is tried three times, then STAB_EBUSY. The protocol binds writers using this
 * library; anything else renaming or deleting files in the directory is not excluded. */
#ifdef F_OFD_SETLK
#define LOCK_SET F_OFD_SETLK
#else
#define LOCK_SET F_SETLK
#endif

/* Takes the write lock of the open file fd. 0, or the errno (EAGAIN / EACCES: held by another). */
int stabi_trace_lock_fd(int fd) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET; /* l_start = l_len = 0: the whole file */
  return fcntl(fd, LOCK_SET, &fl) == 0 ? 0 : errno;
}

static stab_status busy(const char *who, const char *path) {
  return stabi_fail(STAB_EBUSY, "%s: %s: another process is writing this trace (it holds its lock)", who, path);
}

/* Opens and locks the regular file at path for writing, and checks that path still names the
 * inode locked. *fd is the locked descriptor, or -1 with *again set when path changed (or
 * vanished) under us; STAB_EBUSY when another writer holds it. what: "append to" / "replace". */
stab_status stabi_trace_lock_path(const char *who, const char *path, const char *what, int *fd, int *again) {
  *fd = -1;
  int f = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC); /* non-blocking: a FIFO must not hang us */
  if (f < 0) {
    if (errno == ENOENT) return *again = 1, STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot open it to lock it (to %s it): %s", who, path, what, strerror(errno));
  }
  struct stat held, now;
  if (fstat(f, &held) != 0 || !S_ISREG(held.st_mode)) {
    close(f);
    return stabi_fail(STAB_EIO, "%s: %s: not a regular file: cannot %s it", who, path, what);
  }
  int e = stabi_trace_lock_fd(f);
  if (e) {
    close(f);
    if (e == EAGAIN || e == EACCES) return busy(who, path);
    return stabi_fail(STAB_EIO, "%s: %s: cannot lock it: %s", who, path, strerror(e));
  }
  if (stat(path, &now) != 0 || now.st_dev != held.st_dev || now.st_ino != held.st_ino) {
    close(f); /* locked an inode that path no longer names */
    return *again = 1, STAB_OK;
  }
  *fd = f;
  return STAB_OK;
}

/* Makes the complete temporary file tmp (locked by t) the trace at t->path, never replacing a
 * file another writer holds (see the protocol above). A writer asked to append that finds a
 * trace there now (another writer published it meanwhile and may have finished) appends to it
 * instead: *again. *again: start the open again. */
stab_status stabi_trace_publish(stab_trace *t, const char *who, const char *tmp, int append, int *again) {
  struct stat sb;
  int present = stat(t->path, &sb) == 0; /* a file, reached through symbolic links */
  if (present && append) return *again = 1, STAB_OK; /* to append (or, STAB_OUTPUT_NEW, to refuse) */
  if (!present && lstat(t->path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
    /* a symbolic link to nothing: no writer can hold it, and renaming replaces the link itself
     * (a file made at its target meanwhile is left where it is) */
    if (rename(tmp, t->path) == 0) return STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
  }
  if (lstat(t->path, &sb) != 0) {
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, t->path, RENAME_NOREPLACE) == 0) return STAB_OK;
    if (errno == EEXIST) return *again = 1, STAB_OK;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      return stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
#endif
    /* a file system without RENAME_NOREPLACE: link() fails with EEXIST as atomically */
    if (link(tmp, t->path) == 0) {
      unlink(tmp);
      return STAB_OK;
    }
    if (errno == EEXIST) return *again = 1, STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot link the new trace to it: %s", who, t->path, strerror(errno));
  }
  int old = -1;
  stab_status st = stabi_trace_lock_path(who, t->path, "replace", &old, again);
  if (st != STAB_OK || old < 0) return st;
  if (rename(tmp, t->path) != 0)
    st = stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
  close(old); /* only now may another writer lock the replaced file, and find it replaced */
  return st;
}
