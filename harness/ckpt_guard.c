/* ckpt_guard.c — see ckpt_guard.h. */
#define _GNU_SOURCE
#include "ckpt_guard.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* a sharded model registers a range per shard: DeepSeek-V3 has 163 shards, so 1024 leaves room
 * for a checkpoint and its --prev of the largest models published */
#define MAX_RANGES 1024

static struct {
  const char *path;
  uintptr_t lo, hi;
} ranges[MAX_RANGES];
static volatile sig_atomic_t nranges;
static const char *volatile opening;
static const char *volatile tripped;
static uintptr_t page_size;

/* Runs in the faulting thread. mmap is a plain system call on Linux and safe here in
 * practice (POSIX does not list it among the async-signal-safe functions). */
static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
  (void)uctx;
  uintptr_t a = (uintptr_t)si->si_addr;
  const char *who = NULL;
  for (sig_atomic_t i = 0; i < nranges && !who; i++)
    if (a >= ranges[i].lo && a < ranges[i].hi) who = ranges[i].path;
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
  if (nranges == MAX_RANGES) return -1;
  ranges[nranges].path = path;
  ranges[nranges].lo = (uintptr_t)lo;
  ranges[nranges].hi = (uintptr_t)lo + len;
  nranges = nranges + 1; /* published after the range is complete */
  return 0;
}

void ckpt_guard_opening(const char *path) { opening = path; }
const char *ckpt_guard_tripped(void) { return tripped; }
void ckpt_guard_clear(void) { tripped = NULL; }
void ckpt_guard_reset(void) { nranges = 0; }
