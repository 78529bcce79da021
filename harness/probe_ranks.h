/* probe_ranks.h — stabmeter-probe as one of the ranks of an MPI job (mpirun -np P): every rank
 * reads every header and decides the same split of the rows (probe_split.h), measures its own
 * rows, and rank 0 gathers the results and prints the one report. Built with configure
 * --with-mpi, the functions are probe_mpi.c's; without, or when the probe was not started by
 * a launcher, the probe is the one rank of one, and none of them does anything. */
#ifndef STAB_PROBE_RANKS_H
#define STAB_PROBE_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "stabmeter.h"

typedef struct {
  int rank, size;
  int active;       /* MPI was started (a launcher's environment) */
  int agreed;       /* probe_ranks_agree was called */
  FILE *own_stderr; /* the process's stderr; on ranks > 0, stderr is a capture until the end */
  char *captured;   /* the capture's text */
  size_t captured_len;
  char tripped[4096]; /* rank 0: the file a rank's guard caught shrinking */
  uint64_t *digests;  /* probe_ranks_digest's: one per file, then the rows' description */
  const char **what;  /* (ndigests) what each digest is of */
  size_t ndigests;
} probe_ranks;

/* A file's mapped tensor bytes, as the library's file_fn hands them over. */
typedef struct {
  const char *path;
  const void *lo;
  size_t len;
} probe_mapped;

/* Where one row's results live: filled by the rank that measures the row, received by rank 0. */
typedef struct {
  stab_metrics *m;
  double *head_bounds; /* heads of them, or NULL */
  size_t heads;
  int *measured;
} probe_result;

#ifdef STAB_PROBE_MPI
/* Starts MPI when a launcher started the process (OMPI_COMM_WORLD_SIZE, PMIX_RANK or
 * PMI_SIZE in the environment); else, or built without MPI, rank 0 of 1. On ranks > 0,
 * stdout goes to /dev/null and stderr into a capture (rank 0 speaks for all, and prints a
 * rank's messages when that rank alone failed). Call right after cli_init. 0, or 1 after a
 * message. */
int probe_ranks_start(probe_ranks *job, int *argc, char ***argv);

/* Collective: every rank's status after reading the checkpoints (0 or an exit status). The
 * first non-zero one in rank order, the same on every rank; when the ranks disagree, rank 0
 * prints the messages of the ranks whose status differs from its own. */
int probe_ranks_agree(probe_ranks *job, int rc);

/* Not collective, on more than one rank only: hashes every byte of the files' tensor spans (each
 * span read once, its pages handed back after) and the rows as the headers describe them (names,
 * kinds, types, shapes, heads, reasons), kept in job for probe_ranks_same_bytes. Call before
 * anything protects or measures the mappings. 0, or 1 after a message (no memory). */
int probe_ranks_digest(probe_ranks *job, const probe_mapped *spans, size_t nspans, const stab_probe_row *rows, size_t n);

/* Collective, after probe_ranks_agree gave 0 on every rank: the ranks read the same bytes. One
 * exchange (stab_mpi_same_digests) compares every rank's digests with rank 0's. 0 when they
 * agree; else rank 0 prints which rank and which file differ and every rank gets 2. */
int probe_ranks_same_bytes(probe_ranks *job);

/* Collective, after probe_ranks_agree gave 0 on every rank: rank 0 receives the results of
 * every row another rank owns (owner[i], the same on every rank), and every rank's outcome:
 * *failed when any rank failed to measure a row (rank 0 prints their messages), *tripped the
 * file the first rank whose guard caught a file shrinking named (else NULL). Ranks > 0 get
 * their own outcome back. 0, or 1 after a message. */
int probe_ranks_gather(probe_ranks *job, const probe_result *res, size_t n, const int *owner, int *failed,
                       const char **tripped);

/* Collective, on every path out: rank 0's exit status on every rank (after probe_ranks_agree
 * when it was not called yet), then MPI_Finalize. Returns the status to exit with. */
int probe_ranks_finish(probe_ranks *job, int rc);

/* The stream for a rank's own debugging lines (STAB_PROBE_SHOW_READS): the real stderr. */
FILE *probe_ranks_stderr(const probe_ranks *job);
#else
/* One process: rank 0 of 1, nothing to agree on or to gather. */
static inline int probe_ranks_start(probe_ranks *job, int *argc, char ***argv) {
  (void)argc, (void)argv;
  *job = (probe_ranks){.rank = 0, .size = 1};
  return 0;
}
static inline int probe_ranks_agree(probe_ranks *job, int rc) { return job->agreed = 1, rc; }
static inline int probe_ranks_digest(probe_ranks *job, const probe_mapped *spans, size_t nspans,
                                     const stab_probe_row *rows, size_t n) {
  (void)job, (void)spans, (void)nspans, (void)rows, (void)n;
  return 0;
}
static inline int probe_ranks_same_bytes(probe_ranks *job) { return (void)job, 0; }
static inline int probe_ranks_gather(probe_ranks *job, const probe_result *res, size_t n, const int *owner,
                                     int *failed, const char **tripped) {
  (void)job, (void)res, (void)n, (void)owner, (void)failed, (void)tripped;
  return 0;
}
static inline int probe_ranks_finish(probe_ranks *job, int rc) { return (void)job, rc; }
static inline FILE *probe_ranks_stderr(const probe_ranks *job) { return (void)job, stderr; }
#endif

#endif
