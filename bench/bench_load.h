/* bench_load.h — the bench's loaded_slowdown: a cold and a warm estimate timed idle, then
 * again while child processes keep every online CPU busy (bench_load.c). */
#ifndef STAB_BENCH_LOAD_H
#define STAB_BENCH_LOAD_H

#include <stddef.h>

#include "stabmeter.h"

/* What keeps the CPUs busy beside the timed estimates. */
typedef enum {
  LOAD_SPIN = 0,  /* one child per online CPU in a plain loop, like `yes >/dev/null` */
  LOAD_BLAS = 1   /* one child doing sgemm after sgemm on as many OpenBLAS threads: a trainer
                     whose BLAS threads spin between its products */
} load_kind;

typedef struct {
  double idle_cold_s, loaded_cold_s;  /* best of the repeats each */
  double idle_warm_s, loaded_warm_s;
  int cpus;                           /* online CPUs, one spinner each (LOAD_SPIN) */
  double load_before, load_after;     /* 1-minute load average around the loaded timings */
} load_result;

/* Times stab_spectral_norm on a (rows x cols, contiguous) from a cold start, and on a2 from
 * the warm vector v_warm (cols doubles), `repeats` times each (best kept), first with nothing
 * added, then with the load of `kind` running; the children are killed and reaped before it
 * returns, also when a call fails, and they die with the bench if it is killed. v: cols doubles
 * of scratch. Returns 0, or -1 with a message on stderr. */
int bench_loaded_slowdown(stab_spectral_workspace *ws, const float *a, const float *a2, size_t rows,
                          size_t cols, const double *v_warm, double *v, int repeats, load_kind kind,
                          load_result *out);

#endif /* STAB_BENCH_LOAD_H */
