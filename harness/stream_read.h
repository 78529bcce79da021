/* stream_read.h — the plain streaming read that the benchmarks hold a spectral pass against. */
#ifndef STAB_HARNESS_STREAM_READ_H
#define STAB_HARNESS_STREAM_READ_H

#include <stddef.h>

/* Sum of a[0..n), made to run at the speed of the reads, not of an add chain. */
double stream_read_sum(const float *a, size_t n);

#endif
