/* ckpt_guard.c — see ckpt_guard.h. */
#define _GNU_SOURCE
#include "ckpt_guard.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A range per mapped file, as many as there are files (a sharded model registers one per shard,
 * and its --prev and --init as many again): blocks of ranges linked as they fill, each published
 * to the handler only once complete, never moved or freed while the process runs (reset reuses
 * them), so the handler reads no memory that changes under it. */
#define BLOCK_RANGES 256

typedef struct range_block {
  struct {
    const char *path;
    uintptr_t lo, hi;
  } r[BLOCK_RANGES];
  struct range_block *volatile next;
} range_block;

static range_block first_block;
static volatile sig_atomic_t nranges; /* published ranges, over all blocks */
static const char *volatile opening;
static const char *volatile tripped;
static uintptr_t page_size;

/* Runs in the faulting thread. mmap is a plain system call on Linux and safe here in
 * practice (POSIX does not list it among the async-signal-safe functions). */
static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
  (void)uctx;
  uintptr_t a = (uintptr_t)si->si_addr;
  const char *who = NULL;
  const range_block *b = &first_block;
  for (sig_atomic_t i = 0, n = nranges; i < n && b && !who; i++) {
    const size_t k = (size_t)i % BLOCK_RANGES;
    if (a >= b->r[k].lo && a < b->r[k].hi) who = b->r[k].path;
    if (k == BLOCK_RANGES - 1) b = b->next;
  }
  if (!who && si->si_code == BUS_ADRERR) who = opening;
  if (who) {
    void *page = (void *)(a & ~(page_size - 1));
    if (mmap(page, (size_t)page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
      tripped = who;
      return; /* the read is retried and finds zeros */
    }
  }
  /* not a checkpoint's page: the default action, as if there were no guard */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, NULL);
}

int ckpt_guard_install(void) {
  long p = sysconf(_SC_PAGESIZE);
  page_size = p > 0 ? (uintptr_t)p : 4096;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGBUS, &sa, NULL);
}

int ckpt_guard_add(const char *path, const void *lo, size_t len) {
  if (nranges == SIG_ATOMIC_MAX) return -1;
  range_block *b = &first_block;
  for (sig_atomic_t i = nranges; i >= BLOCK_RANGES; i -= BLOCK_RANGES) {
    if (!b->next) {
      range_block *more = calloc(1, sizeof *more);
      if (!more) return -1;
      b->next = more; /* linked before any of its ranges is published */
    }
    b = b->next;
  }
  const size_t k = (size_t)nranges % BLOCK_RANGES;
  b->r[k].path = path;
  b->r[k].lo = (uintptr_t)lo;
  b->r[k].hi = (uintptr_t)lo + len;
  nranges = nranges + 1; /* published after the range is complete */
  return 0;
}

void ckpt_guard_opening(const char *path) { opening = path; }
const char *ckpt_guard_tripped(void) { return tripped; }
void ckpt_guard_clear(void) { tripped = NULL; }
void ckpt_guard_reset(void) { nranges = 0; }
