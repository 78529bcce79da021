/* probe_mpi.c — stabmeter-probe under mpirun (probe_ranks.h): MPI started only when a launcher
 * started the process, one agreement on the status after the checkpoints are read, one gather
 * of the results to rank 0, one broadcast of the exit status. Built only with configure
 * --with-mpi. Results travel as bytes: every rank runs the same program on the same kind of
 * machine, as an MPI job does. */
#define _GNU_SOURCE /* open_memstream */
#include "cli.h"
#include "probe_ranks.h"
#include "stabmeter_mpi.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The variables the launchers set in every process they start: Open MPI's mpirun, PMIx
 * launchers (srun --mpi=pmix, prterun), and MPICH's Hydra or srun's PMI-2. */
static int launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

/* n bytes for one of the small arrays of a collective (a few per rank). Out of memory there,
 * this rank could not take part and the others would wait for it: the job is ended instead,
 * with exit status 1. */
static void *small_array(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p) {
    cli_error("out of memory for %zu bytes during a collective: ending the job", n);
    MPI_Abort(MPI_COMM_WORLD, CLI_FAILED);
  }
  return p;
}

/* A fresh capture of stderr (ranks > 0). 0, or -1. */
static int capture(probe_ranks *job) {
  if (stderr != job->own_stderr) fclose(stderr);
  free(job->captured);
  job->captured = NULL, job->captured_len = 0;
  FILE *f = open_memstream(&job->captured, &job->captured_len);
  if (!f) {
    stderr = job->own_stderr;
    return -1;
  }
  stderr = f;
  return 0;
}

/* What this rank said on stderr since the last capture (ranks > 0), into *text, *len. */
static void captured_text(probe_ranks *job, const char **text, size_t *len) {
  if (stderr == job->own_stderr) {
    *text = "", *len = 0;
    return;
  }
  fflush(stderr);
  *text = job->captured ? job->captured : "", *len = job->captured_len;
}

int probe_ranks_start(probe_ranks *job, int *argc, char ***argv) {
  *job = (probe_ranks){.rank = 0, .size = 1, .own_stderr = stderr};
  if (!launched()) return 0;
  int provided;
  /* only the main thread calls MPI; the measuring threads never do */
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    cli_error("cannot start MPI (started by a launcher: OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_SIZE is set)");
    return 1;
  }
  job->active = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &job->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job->size);
  if (job->rank == 0) return 0;
  if (!freopen("/dev/null", "w", stdout) || capture(job)) {
    cli_error("rank %d: cannot redirect its output: %s", job->rank, strerror(errno));
    return 1;
  }
  return 0;
}

/* Rank 0 gets every rank's len bytes of text: texts (the ranks' one after another) and
 * offsets (size + 1 of them). Collective. 0, or -1 when rank 0 has no room for them (then
 * nobody sends: rank 0 says so to all first, as MPI needs the counts to match). */
static int gather_text(const probe_ranks *job, const char *text, size_t len, char **texts, int **offsets) {
  *texts = NULL, *offsets = NULL;
  const int cap = INT_MAX / 2 / job->size; /* every rank's text fits an int in all */
  int mine = len > (size_t)cap ? cap : (int)len, *lens = NULL, go = 1;
  if (job->rank == 0) {
    lens = small_array((size_t)job->size * sizeof *lens);
    *offsets = small_array(((size_t)job->size + 1) * sizeof **offsets);
  }
  MPI_Gather(&mine, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (job->rank == 0) {
    int total = 0;
    for (int r = 0; r < job->size; r++) (*offsets)[r] = total, total += lens[r];
    (*offsets)[job->size] = total;
    go = (*texts = malloc(total ? (size_t)total : 1)) != NULL;
  }
  MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (go) MPI_Gatherv(text, mine, MPI_BYTE, *texts, lens, *offsets, MPI_BYTE, 0, MPI_COMM_WORLD);
  free(lens);
  return go ? 0 : -1;
}

int probe_ranks_agree(probe_ranks *job, int rc) {
  job->agreed = 1;
  if (!job->active) return rc;
  int *all = small_array((size_t)job->size * sizeof *all);
  MPI_Allgather(&rc, 1, MPI_INT, all, 1, MPI_INT, MPI_COMM_WORLD);
  int agreed = 0, same = 1;
  for (int r = 0; r < job->size; r++) {
    if (!agreed) agreed = all[r];
    same &= all[r] == all[0];
  }
  if (!same) { /* a rank alone failed (a file it cannot read): its words, from rank 0 */
    const char *text;
    size_t len;
    char *texts;
    int *offsets;
    captured_text(job, &text, &len);
    if (gather_text(job, text, len, &texts, &offsets) == 0 && job->rank == 0)
      for (int r = 1; r < job->size; r++)
        if (all[r] != all[0]) fwrite(texts + offsets[r], 1, (size_t)(offsets[r + 1] - offsets[r]), stderr);
    free(texts), free(offsets);
  }
  free(all);
  /* what the ranks say from here is their measurement's (without room for a new capture, the
   * real stderr: every rank must go on alike) */
  if (job->rank > 0) (void)capture(job);
  return agreed;
}

/* The rows as the headers describe them, hashed: what a rank would measure and how. */
static uint64_t digest_rows(const stab_probe_row *rows, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; i++) {
    const stab_probe_row *r = &rows[i];
    const char *strs[] = {r->name, r->tensor, r->dtype, r->bias, r->key_tensor, r->reference_tensor, r->error, r->no_update};
    for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++)
      h = stab_mpi_digest(h, strs[k] ? strs[k] : "", strs[k] ? strlen(strs[k]) + 1 : 0);
    const uint64_t nums[] = {r->kind, r->layout, r->ndim, r->shape[0], r->shape[1], r->shape[2], r->heads, r->kv_heads,
                             (uint64_t)r->tied, r->n_expert, r->expert};
    h = stab_mpi_digest(h, nums, sizeof nums);
  }
  return h;
}

int probe_ranks_digest(probe_ranks *job, const probe_mapped *spans, size_t nspans, const stab_probe_row *rows, size_t n) {
  if (!job->active || job->size < 2) return 0;
  free(job->digests), free(job->what);
  job->ndigests = 0;
  job->digests = malloc((nspans + 1) * sizeof *job->digests);
  job->what = malloc((nspans + 1) * sizeof *job->what);
  if (!job->digests || !job->what) {
    cli_error("rank %d: out of memory for the checkpoint's digests", job->rank);
    return 1;
  }
  const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  for (size_t k = 0; k < nspans; k++) {
    /* in pieces of 64 MiB, each handed back once hashed: the digest costs one read of the
     * file, not its size in memory */
    const unsigned char *p = spans[k].lo;
    uint64_t h = 0;
    for (size_t off = 0; off < spans[k].len;) {
      size_t piece = spans[k].len - off < ((size_t)64 << 20) ? spans[k].len - off : (size_t)64 << 20;
      h = stab_mpi_digest(h, p + off, piece);
      uintptr_t a = ((uintptr_t)(p + off) + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
      uintptr_t b = ((uintptr_t)(p + off + piece)) & ~((uintptr_t)page - 1);
      if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
      off += piece;
    }
    job->digests[k] = h;
    job->what[k] = spans[k].path;
  }
  job->digests[nspans] = digest_rows(rows, n);
  job->what[nspans] = "rows (the layers its headers describe: names, kinds, types, shapes, heads)";
  job->ndigests = nspans + 1;
  return 0;
}

int probe_ranks_same_bytes(probe_ranks *job) {
  if (!job->active || job->size < 2) return 0;
  stab_status st = stab_mpi_same_digests(MPI_COMM_WORLD, "stabmeter-probe", job->what,
                                         job->digests, job->ndigests, NULL, NULL);
  free(job->digests), free(job->what);
  job->digests = NULL, job->what = NULL, job->ndigests = 0;
  if (st == STAB_OK) return 0;
  if (job->rank == 0)
    fprintf(stderr, "%s%s\n", stab_last_error(),
            st == STAB_EINVAL ? ": the ranks must read the same checkpoint (a node's own copy that is stale, or "
                                "another model?); nothing measured"
                              : "");
  return st == STAB_EINVAL ? 2 : 1;
}

/* A record of one row: its index, measured, head count, the metrics, then the head bounds. */
typedef struct {
  uint64_t row;
  int32_t measured;
  int32_t heads;
  stab_metrics m;
} record;

/* A rank's outcome, ahead of its records: then the tripped path, then its messages. */
typedef struct {
  int32_t failed;
  int32_t tripped_len; /* -1: none */
  int32_t text_len;
  int32_t records;
} outcome;

static size_t record_size(size_t heads) { return sizeof(record) + heads * sizeof(double); }

/* This rank's outcome and records as one buffer, *len bytes. NULL when out of memory. */
static unsigned char *pack(const probe_ranks *job, const probe_result *res, size_t n, const int *owner, int failed,
                           const char *tripped, const char *text, size_t text_len, size_t *len) {
  size_t tl = tripped ? strlen(tripped) : 0, total = sizeof(outcome) + tl + text_len, k = 0;
  for (size_t i = 0; i < n; i++)
    if (owner[i] == job->rank) total += record_size(res[i].heads), k++;
  unsigned char *buf = malloc(total), *p = buf;
  if (!buf) return NULL;
  outcome oc = {failed, tripped ? (int32_t)tl : -1, (int32_t)text_len, (int32_t)k};
  memcpy(p, &oc, sizeof oc), p += sizeof oc;
  if (tl) memcpy(p, tripped, tl), p += tl;
  if (text_len) memcpy(p, text, text_len), p += text_len;
  for (size_t i = 0; i < n; i++) {
    if (owner[i] != job->rank) continue;
    record r = {i, *res[i].measured, (int32_t)res[i].heads, *res[i].m};
    memcpy(p, &r, sizeof r), p += sizeof r;
    if (res[i].heads) memcpy(p, res[i].head_bounds, res[i].heads * sizeof(double)), p += res[i].heads * sizeof(double);
  }
  *len = total;
  return buf;
}

/* Rank 0: rank src's buffer of len bytes into res and the outcome. 0, or 1 after a message
 * (a buffer that is not what rank src had to send). */
static int unpack(probe_ranks *job, int src, const unsigned char *p, size_t len, const probe_result *res, size_t n,
                  const int *owner, int *failed, const char **tripped) {
  outcome oc;
  const unsigned char *end = p + len;
  if (len < sizeof oc) goto bad;
  memcpy(&oc, p, sizeof oc), p += sizeof oc;
  if (oc.tripped_len < -1 || oc.text_len < 0 || (size_t)(end - p) < (size_t)(oc.tripped_len > 0 ? oc.tripped_len : 0) + (size_t)oc.text_len) goto bad;
  if (oc.tripped_len >= 0 && !*tripped) {
    size_t tl = (size_t)oc.tripped_len < sizeof job->tripped ? (size_t)oc.tripped_len : sizeof job->tripped - 1;
    memcpy(job->tripped, p, tl), job->tripped[tl] = '\0';
    *tripped = job->tripped;
  }
  p += oc.tripped_len > 0 ? oc.tripped_len : 0;
  fwrite(p, 1, (size_t)oc.text_len, stderr); /* the rank's failures, as one process says them */
  p += oc.text_len;
  *failed |= oc.failed != 0;
  for (int32_t k = 0; k < oc.records; k++) {
    record r;
    if ((size_t)(end - p) < sizeof r) goto bad;
    memcpy(&r, p, sizeof r), p += sizeof r;
    if (r.row >= n || owner[r.row] != src || r.heads < 0 || (size_t)r.heads != res[r.row].heads ||
        (size_t)(end - p) < (size_t)r.heads * sizeof(double))
      goto bad;
    *res[r.row].m = r.m;
    *res[r.row].measured = r.measured;
    if (r.heads) memcpy(res[r.row].head_bounds, p, (size_t)r.heads * sizeof(double));
    p += (size_t)r.heads * sizeof(double);
  }
  if (p == end) return 0;
bad:
  cli_error("rank %d sent results that are not its rows' (%zu bytes): not the same program or checkpoint?", src, len);
  return 1;
}

int probe_ranks_gather(probe_ranks *job, const probe_result *res, size_t n, const int *owner, int *failed,
                       const char **tripped) {
  if (!job->active) return 0;
  const char *text;
  size_t text_len, len = 0;
  captured_text(job, &text, &text_len);
  unsigned char *buf = pack(job, res, n, owner, *failed, *tripped, text, text_len, &len), *all = NULL;
  long long mine = buf && len <= INT_MAX ? (long long)len : -1, *lens = NULL;
  int go = 1, *counts = NULL, *offsets = NULL;
  if (job->rank == 0) {
    lens = small_array((size_t)job->size * sizeof *lens);
    counts = small_array((size_t)job->size * sizeof *counts), offsets = small_array((size_t)job->size * sizeof *offsets);
  }
  MPI_Gather(&mine, 1, MPI_LONG_LONG, lens, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  if (job->rank == 0) {
    long long total = 0;
    for (int r = 0; go && r < job->size; r++) {
      if (lens[r] < 0 || lens[r] > INT_MAX - total) go = 0;
      else offsets[r] = (int)total, counts[r] = (int)lens[r], total += lens[r];
    }
    go = go && (all = malloc(total ? (size_t)total : 1)) != NULL;
  }
  /* the counts must match on both ends: nobody sends unless rank 0 can take every buffer */
  MPI_Bcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (go) MPI_Gatherv(buf, (int)len, MPI_BYTE, all, counts, offsets, MPI_BYTE, 0, MPI_COMM_WORLD);
  int rc = !go;
  if (job->rank == 0) {
    if (!go) cli_error("cannot gather the results of %d ranks (out of memory, or over 2 GiB of them)", job->size);
    /* rank 0's own results are in place; its own outcome stands as given */
    for (int r = 1; r < job->size && !rc; r++)
      rc = unpack(job, r, all + offsets[r], (size_t)counts[r], res, n, owner, failed, tripped);
  }
  free(buf), free(all), free(lens), free(counts), free(offsets);
  return rc;
}

int probe_ranks_finish(probe_ranks *job, int rc) {
  if (!job->active) return rc;
  if (!job->agreed) rc = probe_ranks_agree(job, rc);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  fflush(stdout);
  if (stderr != job->own_stderr) {
    fclose(stderr);
    stderr = job->own_stderr;
  }
  free(job->captured);
  job->captured = NULL;
  /* digests a rank took before another's failure stopped every rank short of comparing them */
  free(job->digests), free(job->what);
  job->digests = NULL, job->what = NULL, job->ndigests = 0;
  MPI_Finalize();
  return rc;
}

FILE *probe_ranks_stderr(const probe_ranks *job) { return job->own_stderr ? job->own_stderr : stderr; }
