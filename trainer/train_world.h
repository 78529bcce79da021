/* train_world.h — the trainer's seam to data parallelism under mpirun: the ranks, the split of
 * a global batch among them, the deterministic sums of gradients and statistics, and the
 * agreement on failures that keeps every rank in the same collectives. train_world.c holds it,
 * built only with ./configure --with-mpi; without MPI there is no world and train.c's
 * single-process path is the only one (TRAIN_WITH_MPI 0).
 * Harness code: failures come back as exit codes and messages on stderr (rank 0's). */
#ifndef STAB_HARNESS_TRAIN_WORLD_H
#define STAB_HARNESS_TRAIN_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "stabmeter.h"

#ifndef TRAIN_WITH_MPI
#define TRAIN_WITH_MPI 0
#endif

/* The ranks of MPI_COMM_WORLD as the trainer sees them. Opaque. */
typedef struct train_world train_world;

#if TRAIN_WITH_MPI

/* 1 when this process was started by an MPI launcher (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's
 * PMIX_RANK, MPICH and Slurm's PMI_SIZE): then MPI is initialised before the options are read,
 * so that a bad option on one rank reaches the others. Otherwise MPI is touched only when
 * --data-parallel asks for it. */
int train_world_launched(void);

/* MPI_Init and the world. On every rank but 0, stdout goes to /dev/null and stderr to a
 * private temporary file, so that one rank speaks: train_world_agree forwards a failing rank's
 * messages to rank 0. Returns 0, or 1 with the message on stderr (MPI_Init failed). */
int train_world_start(int *argc, char ***argv, train_world **out);

/* MPI_Finalize and frees the world (NULL: a no-op). Every rank calls it. */
void train_world_finish(train_world *w);

int train_world_rank(const train_world *w);
int train_world_size(const train_world *w);

/* Collective: every rank gives its exit code (0: fine so far) and every rank gets the lowest
 * failing rank's code (0 when none failed). When that rank is not 0, rank 0 prints what it
 * wrote on stderr since the last agreement, each line marked with its rank. */
int train_world_agree(train_world *w, int rc);

/* This rank's rows [*begin, *begin + *count) of a global batch of B sequences: B / P each, the
 * first B % P ranks one more. */
void train_world_split(const train_world *w, size_t B, size_t *begin, size_t *count);

/* Collective: g (n floats, this rank's gradient of the mean loss over its rows of a batch of B)
 * becomes on every rank the gradient of the whole batch's mean loss, sum over ranks r of
 * count_r / B times rank r's g, added in f64 in rank order: the same bits on every rank and
 * from run to run. Reduce-scatter then all-gather on one flat buffer: each rank sums its
 * 1/P of the elements (MPI_Alltoallv), then every rank receives every sum (MPI_Allgatherv).
 * Returns 0, or 1 with the message on stderr (MPI failed or n is too large). */
int train_world_sum_gradients(train_world *w, float *g, size_t n, size_t B);

/* Collective: x (n floats on every rank) becomes on every rank the sum of every rank's x, added
 * in f64 in rank order (as the gradients are): the same bits on every rank, unlike
 * MPI_Allreduce, whose order may differ between ranks. Tensor parallelism's all-reduce of the
 * activations and of their gradients. Returns 0, or 1 with the message on stderr. */
int train_world_sum(train_world *w, float *x, size_t n);

/* Collective: every rank's `bytes` bytes at mine, in rank order, into all (size x bytes) on
 * every rank. Returns 0, or 1 with the message on stderr. */
int train_world_allgather(train_world *w, const void *mine, size_t bytes, void *all);

/* The world's communicator, for code that calls MPI or stabmeter_mpi itself (the
 * tensor-parallel monitor); declared where mpi.h was included first. */
#ifdef MPI_VERSION
MPI_Comm train_world_comm(const train_world *w);
#endif

/* Collective: v (n doubles, this rank's means over its rows of a batch of B) becomes on every
 * rank the means over the whole batch: the weighted sum in rank order, as for the gradients.
 * Returns 0 or 1 (message on stderr). */
int train_world_mean(train_world *w, double *v, size_t n, size_t B);

/* stab_mpi_monitor_measure on the world: each rank measures its share of the layers, every
 * rank gets every metric. */
stab_status train_world_measure(train_world *w, stab_monitor *m, int with_update);

/* Collective: a 64-bit FNV-1a hash of the bytes at p on every rank (the weights, the options);
 * *hash receives rank 0's, *differing the lowest rank whose hash differs from it, or -1 when
 * all agree. Returns 0 or 1 (message on stderr). */
int train_world_same_bits(train_world *w, const void *p, size_t bytes, uint64_t *hash, int *differing);

/* Collective, right after a resume loaded its checkpoint on every rank: the ranks loaded the same
 * bytes. Each rank hashes the n pieces it read (stab_mpi_digest of bytes[i], named what[i]) and
 * one exchange compares them with rank 0's (stab_mpi_same_digests). 0 when they agree; 2 after
 * rank 0 named the rank, the file and the piece that differ; 1 on another failure. */
int train_world_same_input(train_world *w, const char *file, const char *const *what, const void *const *bytes,
                           const size_t *sizes, size_t n);

#else /* without MPI there is never a world: train.c passes NULL, and these are not reached */

static inline int train_world_launched(void) { return 0; }
static inline int train_world_start(int *argc, char ***argv, train_world **out) {
  return (void)argc, (void)argv, *out = NULL, 1;
}
static inline int train_world_rank(const train_world *w) { return (void)w, 0; }
static inline int train_world_size(const train_world *w) { return (void)w, 1; }
static inline int train_world_agree(train_world *w, int rc) { return (void)w, rc; }
static inline void train_world_split(const train_world *w, size_t B, size_t *begin, size_t *count) {
  (void)w, *begin = 0, *count = B;
}
static inline void train_world_finish(train_world *w) { (void)w; }
static inline int train_world_sum_gradients(train_world *w, float *g, size_t n, size_t B) {
  return (void)w, (void)g, (void)n, (void)B, 1;
}
static inline int train_world_sum(train_world *w, float *x, size_t n) { return (void)w, (void)x, (void)n, 1; }
static inline int train_world_allgather(train_world *w, const void *mine, size_t bytes, void *all) {
  return (void)w, (void)mine, (void)bytes, (void)all, 1;
}
static inline int train_world_mean(train_world *w, double *v, size_t n, size_t B) {
  return (void)w, (void)v, (void)n, (void)B, 1;
}
static inline stab_status train_world_measure(train_world *w, stab_monitor *m, int with_update) {
  return (void)w, (void)m, (void)with_update, STAB_EINVAL;
}
static inline int train_world_same_bits(train_world *w, const void *p, size_t bytes, uint64_t *hash,
                                        int *differing) {
  return (void)w, (void)p, (void)bytes, *hash = 0, *differing = -1, 1;
}
static inline int train_world_same_input(train_world *w, const char *file, const char *const *what,
                                         const void *const *bytes, const size_t *sizes, size_t n) {
  return (void)w, (void)file, (void)what, (void)bytes, (void)sizes, (void)n, 1;
}

#endif

#endif /* STAB_HARNESS_TRAIN_WORLD_H */
