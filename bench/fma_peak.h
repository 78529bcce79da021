/* fma_peak.h — the f32 multiply-add rate of this machine (bench/fma_peak.c). */
#ifndef STAB_BENCH_FMA_PEAK_H
#define STAB_BENCH_FMA_PEAK_H

/* f32 multiply-adds a second (vector lanes counted one each) by `threads` threads at once, with
 * the widest vector FMA of the library's kernels (AVX-512F or AVX2+FMA), all in registers: the
 * best of a few runs of several milliseconds. NaN where there is no such FMA. */
double fma_peak_rate(int threads);

#endif
