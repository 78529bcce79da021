/* mapped_file.c — a whole checkpoint file mapped read-only, with the path it was opened by,
 * shared by the checkpoint readers so that opening, checking and mapping a file fail the same
 * way with the same messages; and the input guard over every such mapping. */
#define _GNU_SOURCE /* BUS_ADRERR, MAP_ANONYMOUS */
#include "core/core.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the input guard ----------------------------------------------------------------------
 * A file that shrinks under its mapping (truncated, or rewritten in place, by another process)
 * makes a read past its new end raise SIGBUS in whichever thread reads: the caller's, the pass
 * pool's workers, OpenMP's. The library's handler, installed the first time a file is mapped,
 * maps a page of zeros over the faulting page of a mapping of ours and marks the mapping
 * tripped: the read finishes (with zeros), no thread is unwound, and every reader checks the
 * mark after reading (stabi_mapped_shrunk, stabi_guard_tripped_in) and returns STAB_EIO naming
 * the file. A SIGBUS at any other address goes to the handler that was there before (the
 * program's), or takes the default action, as if the library had installed nothing.
 *
 * The ranges live in chunks that are never freed, so that the handler reads them without a
 * lock while other threads map and unmap files: a slot is published by its lo (set last,
 * cleared first), and a chunk is linked once complete. */
enum { GUARD_SLOTS = 128 };
typedef struct guard_chunk {
  struct {
    _Atomic uintptr_t lo, hi; /* [lo, hi) mapped; lo 0: the slot is free */
    atomic_int tripped;       /* a read ran past the file's end */
    const char *path;         /* the mapping's (read under guard_lock only, never by the handler) */
  } slot[GUARD_SLOTS];
  struct guard_chunk *_Atomic next;
} guard_chunk;

static guard_chunk guard_first;
static pthread_mutex_t guard_lock = PTHREAD_MUTEX_INITIALIZER; /* registering and releasing */
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static struct sigaction guard_prev; /* the handler before ours */
static int guard_installed;
static atomic_ulong guard_trips;
static uintptr_t guard_page;

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
  const uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code == BUS_ADRERR)
    for (guard_chunk *c = &guard_first; c; c = atomic_load_explicit(&c->next, memory_order_acquire))
      for (size_t i = 0; i < GUARD_SLOTS; i++) {
        const uintptr_t lo = atomic_load_explicit(&c->slot[i].lo, memory_order_acquire);
        if (!lo || a < lo || a >= atomic_load_explicit(&c->slot[i].hi, memory_order_relaxed)) continue;
        /* mmap is a plain system call on Linux, safe here in practice (POSIX does not list it) */
        if (mmap((void *)(a & ~(guard_page - 1)), (size_t)guard_page, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
          break;
        atomic_store(&c->slot[i].tripped, 1);
        atomic_fetch_add(&guard_trips, 1);
        return; /* the read is retried and finds zeros */
      }
  /* not ours: whoever was there before */
  if ((guard_prev.sa_flags & SA_SIGINFO) && guard_prev.sa_sigaction) {
    guard_prev.sa_sigaction(sig, si, uctx);
    return;
  }
  if (guard_prev.sa_handler != SIG_DFL && guard_prev.sa_handler != SIG_IGN) {
    guard_prev.sa_handler(sig);
    return;
  }
  /* the default action: a fault retried kills the process with SIGBUS; a sent signal is resent */
  signal(sig, SIG_DFL);
  if (si->si_code <= 0) raise(sig);
}

static void guard_install(void) {
  long p = sysconf(_SC_PAGESIZE);
  guard_page = p > 0 ? (uintptr_t)p : 4096;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  guard_installed = sigaction(SIGBUS, &sa, &guard_prev) == 0;
}

/* Registers [lo, lo + len): the slot, or NULL when out of memory (the mapping is then unguarded). */
static atomic_int *guard_add(const void *lo, size_t len, const char *path) {
  pthread_once(&guard_once, guard_install);
  atomic_int *slot = NULL;
  pthread_mutex_lock(&guard_lock);
  for (guard_chunk *c = &guard_first; c && !slot; c = atomic_load(&c->next)) {
    for (size_t i = 0; i < GUARD_SLOTS && !slot; i++)
      if (!atomic_load(&c->slot[i].lo)) {
        atomic_store(&c->slot[i].tripped, 0);
        c->slot[i].path = path;
        atomic_store(&c->slot[i].hi, (uintptr_t)lo + len);
        atomic_store_explicit(&c->slot[i].lo, (uintptr_t)lo, memory_order_release);
        slot = &c->slot[i].tripped;
      }
    if (!slot && !atomic_load(&c->next)) {
      guard_chunk *n = calloc(1, sizeof *n);
      if (!n) break;
      atomic_store_explicit(&c->next, n, memory_order_release);
    }
  }
  pthread_mutex_unlock(&guard_lock);
  return slot;
}

/* Frees the slot of [lo, ...) (before the mapping goes). */
static void guard_remove(const void *lo) {
  pthread_mutex_lock(&guard_lock);
  for (guard_chunk *c = &guard_first; c; c = atomic_load(&c->next))
    for (size_t i = 0; i < GUARD_SLOTS; i++)
      if (atomic_load(&c->slot[i].lo) == (uintptr_t)lo) {
        atomic_store_explicit(&c->slot[i].lo, 0, memory_order_release);
        atomic_store(&c->slot[i].hi, 0);
      }
  pthread_mutex_unlock(&guard_lock);
}

unsigned long stabi_guard_trips(void) { return atomic_load(&guard_trips); }

const char *stabi_guard_tripped_in(const void *p, size_t len) {
  if (!atomic_load(&guard_trips) || !p) return NULL; /* the common case costs one load */
  const uintptr_t a = (uintptr_t)p, b = a + len;
  const char *hit = NULL;
  pthread_mutex_lock(&guard_lock);
  for (guard_chunk *c = &guard_first; c && !hit; c = atomic_load(&c->next))
    for (size_t i = 0; i < GUARD_SLOTS && !hit; i++) {
      const uintptr_t lo = atomic_load(&c->slot[i].lo), hi = atomic_load(&c->slot[i].hi);
      if (lo && atomic_load(&c->slot[i].tripped) && a < hi && b > lo) hit = c->slot[i].path;
    }
  pthread_mutex_unlock(&guard_lock);
  return hit;
}

stab_status stabi_mapped_shrunk(const stabi_mapped *m, const char *who) {
  if (!m->tripped || !atomic_load(m->tripped)) return STAB_OK;
  return stabi_fail(STAB_EIO, "%s%s%s: the file shrank while being read (truncated or rewritten in place by another "
                    "process): its values cannot be trusted", who ? who : "", who ? ": " : "", m->path);
}

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
  if (st == STAB_OK && m->map && !(m->tripped = guard_add(m->map, (size_t)m->size, m->path)))
    /* unguarded, a file shrinking under the reader would kill the process with SIGBUS
     * instead of giving STAB_EIO: refuse rather than read without the guard */
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory (the guard of its mapping)", path);
  if (st != STAB_OK) stabi_mapped_close(m);
  return st;
}

void stabi_mapped_close(stabi_mapped *m) {
  if (m->map && m->tripped) guard_remove(m->map);
  if (m->map) munmap(m->map, m->size);
  free(m->path);
  *m = (stabi_mapped){0};
}

stab_status stabi_guard_check(const void *p, size_t len, const char *who) {
  const char *path = stabi_guard_tripped_in(p, len);
  if (!path) return STAB_OK;
  return stabi_fail(STAB_EIO, "%s%s%s: the file shrank while being read (truncated or rewritten in place by another "
                    "process): its values cannot be trusted", who ? who : "", who ? ": " : "", path);
}
