/* mpi_check.h — what tests/unit/mpi_sharded's files share: the check counter each rank keeps (rank 0
 * prints the total in Check's format) and the rank of this process. */
#ifndef MPI_CHECK_H
#define MPI_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "stabmeter_mpi.h"

extern int rank, ranks, checks, failures;

#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    checks++;                                                             \
    if (!(cond)) {                                                        \
      failures++;                                                         \
      fprintf(stderr, "rank %d: %s:%d: FAIL ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                       \
      fputc('\n', stderr);                                                \
    }                                                                     \
  } while (0)

/* mpi_data.c: x[0..n) uniform in [-amp, amp) from seed (salt: each file's own stream). */
void mpi_fill(float *x, size_t n, uint64_t seed, uint64_t salt, float amp);
/* mpi_data.c: the bfloat16 of x, rounded to nearest even (x finite). */
uint16_t mpi_to_bf16(float x);
/* mpi_data.c: rank me's share [*begin, *end) of [0, extent), proportional to weight[me] (ranks
 * entries), each share non-empty. */
void mpi_share_of(int me, size_t extent, const int *weight, size_t *begin, size_t *end);

/* mpi_replicated.c: the monitor over replicated weights against one process's monitor. */
void replicated_cases(void);
/* mpi_tables.c: tables split by vocabulary against stab_layer_metrics on the whole table. */
void table_cases(void);
/* mpi_tables.c: gains and biases split by entries against stab_layer_metrics on the whole. */
void vector_cases(void);
/* mpi_linear.c: linear layers split by rows or columns against stab_layer_metrics on the whole. */
void linear_cases(void);
/* mpi_sums.c: the collectives' sums and maxima against references in long double. */
void sum_cases(void);
/* mpi_batch.c: a step's split layers measured together against the single calls. */
void batch_cases(void);

#endif
