/* mpi_agree.c — ranks that must work on the same bytes (one checkpoint read on every node, a
 * run resumed on every rank) agree that they do, before anything is measured or trained: each
 * rank hashes what it read (stab_mpi_digest) and one exchange compares the hashes
 * (stab_mpi_same_digests), naming the rank and the item that differ. */
#include "mpi/mpi_internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P1 0x9e3779b97f4a7c15ull
#define P2 0xbf58476d1ce4e5b9ull
#define P3 0x94d049bb133111ebull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t load64(const unsigned char *p) {
  uint64_t v;
  memcpy(&v, p, sizeof v); /* one unaligned load */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v); /* little-endian words on every host: one digest */
#endif
  return v;
}
/* splitmix64's finaliser: every input bit reaches every output bit */
static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * P2;
  z = (z ^ (z >> 27)) * P3;
  return z ^ (z >> 31);
}

uint64_t stab_mpi_digest(uint64_t seed, const void *bytes, size_t n) {
  const unsigned char *p = bytes;
  /* four independent lanes over 32-byte blocks (the multiplies overlap), then the tail */
  uint64_t h[4] = {seed ^ P1, rotl(seed, 17) ^ P2, rotl(seed, 31) ^ P3, ~seed};
  size_t i = 0;
  for (; p && i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) h[k] = rotl(h[k] + load64(p + i + 8 * k) * P2, 31) * P1; /* one multiply a lane's chain */
  uint64_t t = (uint64_t)n * P3;
  for (; p && i + 8 <= n; i += 8) t = rotl((t ^ load64(p + i)) * P1, 31) * P2;
  for (; p && i < n; i++) t = (t ^ p[i]) * P1;
  return mix(mix(h[0]) ^ rotl(mix(h[1]), 16) ^ rotl(mix(h[2]), 32) ^ rotl(mix(h[3]), 48) ^ mix(t));
}

stab_status stab_mpi_same_digests(MPI_Comm comm, const char *who, const char *const *what, const uint64_t *digest,
                                  size_t n, int *rank, size_t *item) {
  if (rank) *rank = -1;
  if (item) *item = 0;
  who = who ? who : "stab_mpi_same_digests";
  if (n && (!what || !digest)) return stabi_fail(STAB_EINVAL, "%s: NULL names or digests", who);
  int me = 0, size = 1;
  if (MPI_Comm_rank(comm, &me) != MPI_SUCCESS || MPI_Comm_size(comm, &size) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: not a usable communicator", who);
  /* one exchange of the counts (a rank that read another number of files is told so), then of
   * the digests themselves */
  uint64_t mine = n, *counts = malloc((size_t)size * sizeof *counts), *all = NULL;
  int ok = counts != NULL, all_ok;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) return free(counts), stabi_fail(STAB_ENOMEM, "%s: out of memory on some rank", who);
  if (MPI_Allgather(&mine, 1, MPI_UINT64_T, counts, 1, MPI_UINT64_T, comm) != MPI_SUCCESS)
    return free(counts), stabi_fail(STAB_EIO, "%s: MPI_Allgather of the counts failed", who);
  for (int r = 1; r < size; r++)
    if (counts[r] != counts[0]) {
      if (rank) *rank = r;
      stab_status st = stabi_fail(STAB_EINVAL, "%s: rank %d read %llu items, rank 0 %llu: the ranks did not read the same "
                                  "files", who, r, (unsigned long long)counts[r], (unsigned long long)counts[0]);
      free(counts);
      return st;
    }
  free(counts);
  if (!n) return STAB_OK;
  all = malloc((size_t)size * n * sizeof *all);
  ok = all != NULL && n <= (size_t)(INT_MAX / size);
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
  if (!all_ok) return free(all), stabi_fail(STAB_ENOMEM, "%s: no room for %zu digests on some rank", who, n);
  if (MPI_Allgather(digest, (int)n, MPI_UINT64_T, all, (int)n, MPI_UINT64_T, comm) != MPI_SUCCESS)
    return free(all), stabi_fail(STAB_EIO, "%s: MPI_Allgather of the digests failed", who);
  stab_status st = STAB_OK;
  for (size_t i = 0; i < n && st == STAB_OK; i++)
    for (int r = 1; r < size; r++)
      if (all[(size_t)r * n + i] != all[i]) {
        if (rank) *rank = r;
        if (item) *item = i;
        st = stabi_fail(STAB_EINVAL, "%s: %s: rank %d read other bytes than rank 0 (64-bit hash %016llx, rank 0's %016llx)",
                        who, what[i] ? what[i] : "(unnamed)", r, (unsigned long long)all[(size_t)r * n + i],
                        (unsigned long long)all[i]);
        break;
      }
  free(all);
  return st;
}
