/* stream_read.h — the reads that the benchmarks hold a spectral pass against. */
#ifndef STAB_HARNESS_STREAM_READ_H
#define STAB_HARNESS_STREAM_READ_H

#include <stddef.h>

/* Sum of a[0..n) by 16-byte loads, made to run at the speed of the reads, not of an add
 * chain (harness/bench's stream_GBps). */
double stream_read_sum(const float *a, size_t n);

/* The same with the widest loads this processor has (stream_read_wide_name(): "512-bit" with
 * AVX-512F, "256-bit" with AVX, else "128-bit", the loop above). */
double stream_read_wide_sum(const float *a, size_t n);
const char *stream_read_wide_name(void);
/* stream_read_sum over a[0..n) by `threads` threads, one contiguous slice each (as a pass
 * splits its rows): the sum of the slices' sums. */
double stream_read_threads(const float *a, size_t n, int threads);

/* The reference read of a matrix is the faster of the two reads below over its bytes, each
 * the best of its repeats in one run (harness/bench). */

/* Seconds of one stream_read_wide_sum over a[0..n) by `threads` threads, one contiguous slice
 * each (as a pass splits its rows). */
double reference_wide_read(const float *a, size_t n, int threads);

/* Seconds of one cblas_sgemv y = W x of the rows x cols f32 matrix w (contiguous rows) with
 * `threads` OpenBLAS threads (the BLAS's setting is put back after). x: cols floats, y: rows. */
double reference_sgemv(const float *w, size_t rows, size_t cols, int threads, const float *x,
                       float *y);

#endif
