/* bench.c — harness/bench's command line and main: how fast and how well stabmeter estimates
 * sigma(W) of f32 matrices.
 *
 * For each size, on a seeded Gaussian W (std 1/sqrt(cols)): cold Lanczos and power
 * iteration to the tolerance, LAPACK sgesvd (values only) as the time to beat and the
 * reference sigma, the read bandwidth one library pass reaches (f32, and BF16 read as stored)
 * against the reference read (bench/stream_read.h: the faster of a wide-vector read and
 * OpenBLAS sgemv of the same bytes, same run) and a plain streaming read, and the passes a
 * warm start needs after an update of relative size 1e-3. Results (a table, or one JSON object
 * with --json) on stdout, progress on stderr. bench.h says which file does what.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"
#include "bench_arpack.h"
#include "cli.h"
#include "fma_peak.h"
#include "stabmeter.h"

static const char *const default_sizes = "512x512,1024x1024,2048x2048,4096x4096,768x3072,3072x768";
static const char *const quick_sizes = "256x256,512x512,256x1024,1024x256";

/* ---------------------------------------------------------------------------------- */
/* Small helpers                                                                       */

/* The 1-minute load average (Linux /proc/loadavg), NaN where there is none. Other work on
 * the machine shows up directly in the timings, so the run records it. */
static double load_average(void)
{
  double x = NAN;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &x) != 1)
      x = NAN;
    fclose(f);
  }
  return x;
}

/* ---------------------------------------------------------------------------------- */
/* Command line                                                                        */

static void usage(void)
{
  printf("Usage: %s [OPTION]...\n"
         "Times stabmeter's spectral norm of seeded Gaussian f32 matrices (std 1/sqrt(cols)):\n"
         "cold Lanczos and power iteration against LAPACK sgesvd, the bandwidth of one pass\n"
         "(f32, and BF16 read as stored; with the given threads and with one) against the\n"
         "reference read (the faster of a wide-vector read loop and OpenBLAS sgemv of the same\n"
         "bytes) and a plain streaming read, and the passes of a warm start after an update.\n"
         "Results on stdout, progress on stderr.\n"
         "\n"
         "Options:\n"
         "  -s, --sizes LIST      comma-separated ROWSxCOLS, each side in 1..65536; a size\n"
         "                        ending in :spiked is a Gaussian plus a rank-one spike,\n"
         "                        s2/s1 = 0.836 (default %s)\n"
         "  -q, --quick           the small list %s\n"
         "  -t, --threads N       threads of a pass and of the streaming read, 0..4096 (default\n"
         "                        0: the CPUs this process may run on)\n"
         "      --tol X           target relative error of sigma, in (0, 0.5) (default 1e-3)\n"
         "      --max-passes N    pass limit of the cold and warm estimates (default 1000)\n"
         "      --repeats N       timings of one pass and of the stream read: best of N (default\n"
         "                        10, 5 with --quick; small matrices get more, up to 1000, so\n"
         "                        that each timing reads 1 GiB)\n"
         "      --cold-repeats N  cold and warm estimates: best of N, within 5 s each (default 3)\n"
         "      --seed N          seed of the matrices (default 1)\n"
         "      --update X        ||dW||_F / ||W||_F of the warm-start update, in (0, 1)\n"
         "                        (default 1e-3)\n"
         "      --no-lapack       skip sgesvd (no speedup, no actual errors)\n"
         "      --exact-f64       also dgesvd on an f64 copy, and use it as the reference\n"
         "                        (always when built with ARPACK: its ladder, the oracle power\n"
         "                        iteration and the equal-error comparison need it)\n"
         "      --exact-warm      also the SVD of W + dW, for the actual warm errors\n"
         "      --no-load         skip loaded_slowdown (the cold and warm estimates timed again\n"
         "                        beside a spinning child per CPU, and beside OpenBLAS sgemm)\n"
         "      --accuracy N      instead: N matrices in five families (Gaussian, spiked,\n"
         "                        low-rank + noise, near-equal top pair, wide and tall), how\n"
         "                        often the actual error (against dgesvd) exceeds the reported\n"
         "                        one and tol; near-equal pairs also warm-started from their\n"
         "                        first and from their second right singular vector\n"
         "  -j, --json            one JSON object on stdout instead of the table\n"
         "  -h, --help            print this help and exit\n"
         "  -V, --version         print the version and exit\n"
         "\n"
         "Exit status:\n"
         "  0  everything ran (whatever the targets say)\n"
         "  1  something failed\n"
         "  2  bad usage\n",
         cli_name, default_sizes, quick_sizes);
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi)
    return -1;
  *out = x;
  return 0;
}

/* "512x512,768x3072" into a new array; -1 on a malformed list. */
static int parse_sizes(const char *list, shape **out, size_t *n)
{
  size_t cap = 1;
  for (const char *p = list; *p; p++)
    cap += *p == ',';
  shape *s = malloc(cap * sizeof *s);
  char *copy = strdup(list);
  size_t k = 0;
  int rc = -1;
  if (!s || !copy)
    goto out;
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *x = strpbrk(tok, "xX"), *kind = strchr(tok, ':');
    long rows, cols;
    if (!x)
      goto out;
    s[k].spiked = 0;
    if (kind) {
      if (strcmp(kind, ":spiked"))
        goto out;
      *kind = '\0';
      s[k].spiked = 1;
    }
    *x = '\0';
    /* 65536 keeps rows * cols * 8 (the f64 copy) far from overflow and LAPACK's int. */
    if (parse_long(tok, 1, 65536, &rows) || parse_long(x + 1, 1, 65536, &cols))
      goto out;
    s[k].rows = (size_t)rows;
    s[k].cols = (size_t)cols;
    k++;
  }
  if (k == 0)
    goto out;
  *out = s;
  *n = k;
  s = NULL;
  rc = 0;
out:
  free(s);
  free(copy);
  return rc;
}

int main(int argc, char **argv)
{
  enum { OPT_TOL = 256, OPT_MAX_PASSES, OPT_REPEATS, OPT_COLD_REPEATS, OPT_SEED, OPT_UPDATE,
         OPT_NO_LAPACK, OPT_EXACT_F64, OPT_EXACT_WARM, OPT_ACCURACY, OPT_NO_LOAD };
  static const struct option longopts[] = {
      {"sizes", required_argument, NULL, 's'},
      {"quick", no_argument, NULL, 'q'},
      {"threads", required_argument, NULL, 't'},
      {"tol", required_argument, NULL, OPT_TOL},
      {"max-passes", required_argument, NULL, OPT_MAX_PASSES},
      {"repeats", required_argument, NULL, OPT_REPEATS},
      {"cold-repeats", required_argument, NULL, OPT_COLD_REPEATS},
      {"seed", required_argument, NULL, OPT_SEED},
      {"update", required_argument, NULL, OPT_UPDATE},
      {"no-lapack", no_argument, NULL, OPT_NO_LAPACK},
      {"exact-f64", no_argument, NULL, OPT_EXACT_F64},
      {"exact-warm", no_argument, NULL, OPT_EXACT_WARM},
      {"accuracy", required_argument, NULL, OPT_ACCURACY},
      {"no-load", no_argument, NULL, OPT_NO_LOAD},
      {"json", no_argument, NULL, 'j'},
      {"help", no_argument, NULL, 'h'},
      {"version", no_argument, NULL, 'V'},
      {NULL, 0, NULL, 0}};
  options o = {.sizes = NULL, .n_sizes = 0, .threads = 0, .tol = 1e-3, .max_passes = 1000,
               .repeats = 0 /* 10, or 5 with --quick */, .cold_repeats = 3, .seed = 1, .update = 1e-3, .json = 0,
               .lapack = 1, .exact_f64 = 0, .exact_warm = 0, .loaded = 1};
  const char *sizes = default_sizes;
  int quick = 0, c;
  long accuracy = 0;

  cli_init("stabmeter-bench");
  unsigned long long v = 0;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS "s:qt:j", longopts, NULL)) != -1) {
    int rc = 0;
    switch (c) {
    case 's': sizes = optarg; break;
    case 'q': quick = 1; break;
    case 't': if (!(rc = cli_whole("--threads", optarg, 0, 4096, &v))) o.threads = (int)v; break;
    case OPT_TOL: rc = cli_real("--tol", optarg, 0.0, 1, 0.5, 1, &o.tol); break;
    case OPT_MAX_PASSES:
      if (!(rc = cli_whole("--max-passes", optarg, 1, 1000000, &v))) o.max_passes = (int)v;
      break;
    case OPT_REPEATS: if (!(rc = cli_whole("--repeats", optarg, 1, 100000, &v))) o.repeats = (int)v; break;
    case OPT_COLD_REPEATS:
      if (!(rc = cli_whole("--cold-repeats", optarg, 1, 1000, &v))) o.cold_repeats = (int)v;
      break;
    case OPT_SEED: if (!(rc = cli_whole("--seed", optarg, 0, UINT64_MAX, &v))) o.seed = (uint64_t)v; break;
    case OPT_UPDATE: rc = cli_real("--update", optarg, 0.0, 1, 1.0, 1, &o.update); break;
    case OPT_NO_LAPACK: o.lapack = 0; break;
    case OPT_EXACT_F64: o.exact_f64 = 1; break;
    case OPT_EXACT_WARM: o.exact_warm = 1; break;
    case OPT_NO_LOAD: o.loaded = 0; break;
    case OPT_ACCURACY: if (!(rc = cli_whole("--accuracy", optarg, 1, 1000000, &v))) accuracy = (long)v; break;
    case 'j': o.json = 1; break;
    case 'h': usage(); return CLI_OK;
    case 'V': return cli_version();
    default: return cli_getopt_error(c, argv);
    }
    if (rc)
      return rc;
  }
  if (optind < argc)
    return cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (accuracy)
    return accuracy_sweep(&o, accuracy);
  if (quick && sizes == default_sizes)
    sizes = quick_sizes;
  if (parse_sizes(sizes, &o.sizes, &o.n_sizes))
    return cli_bad_value("--sizes", sizes, "ROWSxCOLS[,ROWSxCOLS]..., each side in 1..65536, e.g. 512x512,768x3072");
  if (o.repeats == 0)
    o.repeats = quick ? 5 : 10;
  /* ARPACK's and the power iteration's errors reach 1e-5 and below, where sgesvd's own error
   * would decide the comparison: they need dgesvd (f64) as the reference */
  if (o.lapack && arpack_available())
    o.exact_f64 = 1;

  /* The streaming read uses as many threads as a pass does. */
#ifdef _OPENMP
  o.stream_threads = o.threads > 0 ? o.threads : omp_get_max_threads();
#else
  if (o.threads > 1)
    progress("%s: built without OpenMP: the library and the stream read use one thread\n", cli_name);
  o.stream_threads = 1;
#endif

  /* The FMA rate: the arithmetic ceiling that the in-cache passes are held against. */
  o.fma_rate = fma_peak_rate(o.stream_threads);
  progress("%s: f32 FMA rate %.1f G a second with %d thread%s\n", cli_name, o.fma_rate * 1e-9,
           o.stream_threads, o.stream_threads == 1 ? "" : "s");

  size_result *res = calloc(o.n_sizes, sizeof *res);
  if (!res) {
    cli_error("out of memory");
    free(o.sizes);
    return 1;
  }
  int failed = 0;
  o.load_start = load_average();
  if (o.load_start > 0.5)
    progress("%s: load average %.2f: other work on this machine will disturb the timings\n", cli_name,
             o.load_start);
  for (size_t i = 0; i < o.n_sizes; i++)
    if (bench_size(&o, o.sizes[i], i, &res[i]))
      failed = 1;

  o.load_end = load_average();
  bench_report(&o, res, o.n_sizes);
  fflush(stdout);

  free(res);
  free(o.sizes);
  return failed || ferror(stdout) ? 1 : 0;
}
