/* pass_ceiling.c — how fast one pass of the spectral engine could ever go on this machine,
 * against the reference read that harness/bench's bandwidth target compares it with.
 *
 * A pass (y = W^T (W x), lib/engine/gram_pass.c) does per element of W, per vector, two FMAs: in f32
 * runs (the default kernels) or in f64 after two f32 -> f64 conversions (the precise path).
 * This program times the library's own kernels (stabi_gram_kernel_chosen(), linked from the
 * library's internal build), each arithmetic for 1, 2 and 4 vectors, with 1 and 2 threads, three ways,
 * all interleaved and each the best of its repeats:
 *   - in cache: every thread passes over its own 16 x COLS block (256 KiB at 4096 columns,
 *     inside L2) again and again: the arithmetic's ceiling, with no memory traffic at all;
 *   - from memory: a pass over ROWS x COLS split between the threads as a pass splits it;
 *   - the wide read of that same ROWS x COLS matrix (bench/stream_read.c, the reference
 *     read's read loop; harness/bench also times sgemv and keeps the faster).
 * If the in-cache ceiling is below the target fraction of the read, no arrangement of the
 * memory traffic can bring a pass to the target: only less arithmetic per element could.
 *
 * Built (make bench/pass_ceiling) and run by bench/pass_ceiling.sh; not part of the library. */
#include "engine/engine.h"

#include "clock.h"
#include "stream_read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h> /* its own threads: gram_pass.c no longer uses OpenMP */
#endif

static volatile double sink;

static void fill(float *a, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    a[i] = (float)((double)(z >> 11) * 0x1.0p-53 - 0.5);
  }
}

int main(int argc, char **argv) {
  size_t rows = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096;
  size_t cols = argc > 2 ? strtoul(argv[2], NULL, 10) : 4096;
  int repeats = argc > 3 ? atoi(argv[3]) : 20;
  enum { SMALL = 16 };
  if (rows < 2 * SMALL || cols < 8 || repeats < 1) {
    fprintf(stderr, "usage: pass_ceiling [ROWS >= 32] [COLS >= 8] [REPEATS >= 1]\n");
    return 2;
  }
  const stabi_gram_kernel *kn = stabi_gram_kernel_chosen();
  float *w = malloc(rows * cols * sizeof *w);
  float *hot = malloc(2 * SMALL * cols * sizeof *hot); /* one small block a thread */
  double *x = malloc(4 * cols * sizeof *x), *acc = malloc(2 * 4 * cols * sizeof *acc);
  float *x32 = malloc(4 * cols * sizeof *x32);
  if (!w || !hot || !x || !acc || !x32) {
    fprintf(stderr, "pass_ceiling: out of memory for %zux%zu\n", rows, cols);
    return 1;
  }
  fill(w, rows * cols, 1);
  fill(hot, 2 * SMALL * cols, 2);
  for (size_t j = 0; j < 4 * cols; j++) x[j] = 1.0 / (double)(j % cols + 1 + j / cols);
  for (size_t j = 0; j < 4 * cols; j++) x32[j] = (float)x[j];
  static const double xup[4] = {1.0, 1.0, 1.0, 1.0};
  /* Enough in-cache passes that each timing reads as many bytes as one pass over W. */
  const int hot_reps = (int)(rows / SMALL);
  const double big = (double)rows * (double)cols * sizeof(float);
  const double small = (double)SMALL * (double)cols * sizeof(float);

  printf("pass_ceiling: kernel %s, W %zux%zu (%.0f MiB), in-cache block %dx%zu (%.0f KiB) a "
         "thread, %s read, best of %d\n",
         kn->name, rows, cols, big / 1048576.0, SMALL, cols, small / 1024.0, stream_read_wide_name(),
         repeats);
  printf("%-7s %-7s %-5s %12s %12s %12s %10s %10s\n", "threads", "vectors", "arith", "in-cache",
         "pass", "read", "ceiling", "achieved");
  for (int threads = 1; threads <= 2; threads++)
    for (int nv = 1; nv <= 4; nv *= 2)
      for (int f64 = 0; f64 <= 1; f64++) {
        double t_hot = INFINITY, t_pass = INFINITY, t_read = INFINITY;
        for (int r = 0; r < repeats; r++)
          for (int what = 0; what < 3; what++) {
            double t0 = monotonic_seconds(), s = 0.0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : s)
#endif
            {
              int k = 0, nt = 1;
#ifdef _OPENMP
              k = omp_get_thread_num();
              nt = omp_get_num_threads();
#endif
              size_t r0 = (size_t)k * rows / (size_t)nt, r1 = (size_t)(k + 1) * rows / (size_t)nt;
              double *my_acc = acc + (size_t)k * 4 * cols;
              const float *a = what == 0 ? hot + (size_t)k * SMALL * cols : w;
              size_t a0 = what == 0 ? 0 : r0, a1 = what == 0 ? SMALL : r1;
              /* the kernel accumulates: each call starts from zeros, as a pass's chunk does */
              if (what == 2)
                s += stream_read_wide_sum(w + r0 * cols, (r1 - r0) * cols);
              else
                for (int h = 0; h < (what == 0 ? hot_reps / nt : 1); h++) {
                  memset(my_acc, 0, (size_t)nv * cols * sizeof *my_acc);
                  s += f64 ? kn->chunk(a, NULL, a0, a1, cols, cols, x, my_acc, nv, 0.0)
                           : kn->chunk32(a, NULL, a0, a1, cols, cols, x32, xup, x, my_acc, nv, 0.0);
                }
            }
            double t = monotonic_seconds() - t0;
            sink = s;
            double *best = what == 0 ? &t_hot : what == 1 ? &t_pass : &t_read;
            if (t < *best) *best = t;
          }
        double hot_bytes = small * (double)((hot_reps / threads) * threads);
        double g_hot = hot_bytes / t_hot * 1e-9, g_pass = big / t_pass * 1e-9, g_read = big / t_read * 1e-9;
        printf("%-7d %-7d %-5s %9.1f GB/s %7.1f GB/s %7.1f GB/s %9.0f%% %9.0f%%\n", threads, nv,
               f64 ? "f64" : "f32", g_hot, g_pass, g_read, 100.0 * g_hot / g_read, 100.0 * g_pass / g_read);
      }
  printf("in-cache: the pass's arithmetic alone; pass: from memory; read: a wide-vector read of W.\n"
         "ceiling = in-cache / read: the most a pass could reach against the read; the block\n"
         "Lanczos pass of harness/bench is the 2-vector f32 row.\n");
  free(w);
  free(hot);
  free(x);
  free(x32);
  free(acc);
  return 0;
}
