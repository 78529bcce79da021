/* train_world.c — data parallelism for the trainer on MPI (train_world.h): every rank holds the
 * whole model and a slice of each global batch; gradients and statistics are summed in rank
 * order, never with MPI_Allreduce, so that every rank ends each step with the same bits in its
 * weights and takes the same decisions (stop on NaN, measure, fail). Built with --with-mpi. */
#include "train_world.h"
#include "cli.h"
#include "stabmeter_mpi.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct train_world {
  MPI_Comm comm;   /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
  int rank, size;
  FILE *captured;  /* ranks > 0: their stderr, until the next agreement */
  int stderr_fd;   /* ranks > 0: the stderr they were started with, or -1 */
  int *ints;       /* (size) */
  int *counts, *displs; /* (size) each: the slices of a flat buffer, one per rank */
  int *rcounts, *rdispls; /* (size) each: every rank's copy of this rank's slice */
  float *sums;     /* (size x the largest slice) the gradients this rank sums */
  size_t sums_cap;
  double *all;     /* (size x n) gathered statistics */
  size_t all_cap;
};

int train_world_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

/* Ranks > 0 say nothing themselves: their output would interleave with rank 0's, and rank 0
 * speaks for them (train_world_agree). stderr goes to an unlinked temporary file, not to
 * --out. */
static int silence(train_world *w) {
  int fd;
  if (!freopen("/dev/null", "w", stdout) || !(w->captured = tmpfile()) ||
      (fd = fileno(w->captured)) < 0 || (w->stderr_fd = dup(STDERR_FILENO)) < 0 ||
      dup2(fd, STDERR_FILENO) < 0) {
    cli_error("rank %d: cannot redirect its output: %s", w->rank, strerror(errno));
    return 1;
  }
  return 0;
}

int train_world_start(int *argc, char ***argv, train_world **out) {
  *out = NULL;
  int inited = 0, provided = 0;
  /* FUNNELED: the monitor's batched split layers run their estimates on worker threads while
   * this thread alone calls MPI (stab_mpi_linear_measure_batch; under SINGLE it measures them
   * one after another, the same bits, more collectives) */
  if (MPI_Initialized(&inited) != MPI_SUCCESS ||
      (!inited && MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)) {
    cli_error("MPI_Init_thread failed");
    return 1;
  }
  train_world *w = calloc(1, sizeof *w);
  int rc = 1;
  if (w) w->stderr_fd = -1;
  if (!w || MPI_Comm_dup(MPI_COMM_WORLD, &w->comm) != MPI_SUCCESS) {
    cli_error("%s", w ? "MPI_Comm_dup of MPI_COMM_WORLD failed" : "out of memory");
    free(w);
    MPI_Finalize();
    return 1;
  }
  MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(w->comm, &w->rank);
  MPI_Comm_size(w->comm, &w->size);
  size_t P = (size_t)w->size;
  w->ints = malloc(P * sizeof *w->ints);
  w->counts = malloc(P * sizeof *w->counts);
  w->displs = malloc(P * sizeof *w->displs);
  w->rcounts = malloc(P * sizeof *w->rcounts);
  w->rdispls = malloc(P * sizeof *w->rdispls);
  int bad = !w->ints || !w->counts || !w->displs || !w->rcounts || !w->rdispls;
  if (bad) cli_error("rank %d: out of memory", w->rank);
  else if (w->rank > 0) bad = silence(w);
  *out = w;
  /* everyone learns whether everyone is ready: nobody waits for a rank that gave up */
  rc = train_world_agree(w, bad);
  return rc ? 1 : 0;
}

void train_world_finish(train_world *w) {
  if (!w) return;
  fflush(stdout);
  MPI_Comm_free(&w->comm);
  /* what comes after (a sanitizer's report at exit) is not the trainer's: let it be seen */
  if (w->stderr_fd >= 0 && dup2(w->stderr_fd, STDERR_FILENO) >= 0) close(w->stderr_fd);
  if (w->captured) fclose(w->captured);
  free(w->ints), free(w->counts), free(w->displs), free(w->rcounts), free(w->rdispls), free(w->sums), free(w->all);
  free(w);
  MPI_Finalize();
}

int train_world_rank(const train_world *w) { return w->rank; }
int train_world_size(const train_world *w) { return w->size; }

/* Rank 0 prints what rank r wrote since the last agreement (its tail, up to 4 kB), each line
 * marked "[rank r]". Collective. */
static void forward_messages(train_world *w, int r) {
  char text[4096];
  int len = 0;
  if (w->rank == r && w->captured) {
    fflush(w->captured);
    long end = ftell(w->captured);
    long from = end > (long)sizeof text - 1 ? end - (long)sizeof text + 1 : 0;
    if (end > 0 && fseek(w->captured, from, SEEK_SET) == 0)
      len = (int)fread(text, 1, (size_t)(end - from), w->captured);
    fseek(w->captured, 0, SEEK_END);
  }
  if (MPI_Bcast(&len, 1, MPI_INT, r, w->comm) != MPI_SUCCESS ||
      MPI_Bcast(text, len, MPI_CHAR, r, w->comm) != MPI_SUCCESS) {
    if (w->rank == 0) cli_error("rank %d failed; its messages could not be fetched", r);
    return;
  }
  if (w->rank != 0) return;
  if (!len) cli_error("rank %d failed without a message", r);
  for (int i = 0; i < len;) {
    int j = i;
    while (j < len && text[j] != '\n') j++;
    fprintf(stderr, "[rank %d] %.*s\n", r, j - i, text + i);
    i = j + 1;
  }
}

int train_world_agree(train_world *w, int rc) {
  if (MPI_Allgather(&rc, 1, MPI_INT, w->ints, 1, MPI_INT, w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Allgather of the ranks' status failed", w->rank);
    return CLI_FAILED;
  }
  for (int r = 0; r < w->size; r++)
    if (w->ints[r]) {
      if (r > 0) forward_messages(w, r);
      if (w->rank == 0 && r > 0) cli_error("rank %d failed (exit %d): every rank stops", r, w->ints[r]);
      return w->ints[r];
    }
  /* all well: what the ranks said so far was not needed */
  if (w->captured) {
    fflush(w->captured);
    if (ftruncate(fileno(w->captured), 0) == 0) rewind(w->captured);
  }
  return 0;
}

void train_world_split(const train_world *w, size_t B, size_t *begin, size_t *count) {
  size_t P = (size_t)w->size, r = (size_t)w->rank, q = B / P, extra = B % P;
  *count = q + (r < extra);
  *begin = r * q + (r < extra ? r : extra);
}

/* Each rank's share of a batch of B, as a weight of its means in the batch's mean. */
static double share(const train_world *w, int r, size_t B) {
  size_t P = (size_t)w->size, q = B / P;
  return (double)(q + ((size_t)r < B % P)) / (double)B;
}

/* The slices of n elements the ranks sum: n / P each, the first n % P one more. */
static void slices(train_world *w, size_t n) {
  size_t P = (size_t)w->size, q = n / P, extra = n % P, off = 0;
  for (size_t r = 0; r < P; r++) {
    w->counts[r] = (int)(q + (r < extra));
    w->displs[r] = (int)off;
    off += (size_t)w->counts[r];
  }
}

/* g on every rank becomes the sum over ranks r of weight_r g_r in f64 in rank order (weight_r
 * the share of a batch of B, or 1 when B is 0): reduce-scatter then all-gather on one flat
 * buffer, each rank summing its 1/P of the elements. */
static int sum_in_rank_order(train_world *w, float *g, size_t n, size_t B) {
  size_t P = (size_t)w->size;
  if (n > INT_MAX) {
    cli_error("rank %d: %zu parameters are more than one MPI call carries (%d)", w->rank, n, INT_MAX);
    return 1;
  }
  slices(w, n);
  size_t mine = (size_t)w->counts[w->rank];
  if (P * (n / P + 1) > w->sums_cap) {
    float *s = realloc(w->sums, P * (n / P + 1) * sizeof *s);
    if (!s) {
      cli_error("rank %d: out of memory for the gradient sums", w->rank);
      return 1;
    }
    w->sums = s, w->sums_cap = P * (n / P + 1);
  }
  /* every rank's copy of my slice, rank r's at r * mine */
  for (size_t r = 0; r < P; r++) w->rcounts[r] = (int)mine, w->rdispls[r] = (int)(r * mine);
  if (MPI_Alltoallv(g, w->counts, w->displs, MPI_FLOAT, w->sums, w->rcounts, w->rdispls, MPI_FLOAT,
                    w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Alltoallv of the gradients failed", w->rank);
    return 1;
  }
  float *slice = g + w->displs[w->rank];
  for (size_t i = 0; i < mine; i++) {
    double s = 0;
    for (size_t r = 0; r < P; r++) s += (B ? share(w, (int)r, B) : 1.0) * (double)w->sums[r * mine + i];
    slice[i] = (float)s;
  }
  /* in place: my slice is already where it belongs in g */
  if (MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, g, w->counts, w->displs, MPI_FLOAT, w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Allgatherv of the summed gradients failed", w->rank);
    return 1;
  }
  return 0;
}

int train_world_sum_gradients(train_world *w, float *g, size_t n, size_t B) {
  return sum_in_rank_order(w, g, n, B);
}

int train_world_sum(train_world *w, float *x, size_t n) { return sum_in_rank_order(w, x, n, 0); }

int train_world_allgather(train_world *w, const void *mine, size_t bytes, void *all) {
  if (bytes > INT_MAX ||
      MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Allgather of %zu bytes failed", w->rank, bytes);
    return 1;
  }
  return 0;
}

MPI_Comm train_world_comm(const train_world *w) { return w->comm; }

int train_world_mean(train_world *w, double *v, size_t n, size_t B) {
  size_t P = (size_t)w->size;
  if (P * n > w->all_cap) {
    double *a = realloc(w->all, P * n * sizeof *a);
    if (!a) {
      cli_error("rank %d: out of memory", w->rank);
      return 1;
    }
    w->all = a, w->all_cap = P * n;
  }
  if (n > INT_MAX || MPI_Allgather(v, (int)n, MPI_DOUBLE, w->all, (int)n, MPI_DOUBLE, w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Allgather of %zu statistics failed", w->rank, n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    double s = 0;
    for (size_t r = 0; r < P; r++) s += share(w, (int)r, B) * w->all[r * n + i];
    v[i] = s;
  }
  return 0;
}

stab_status train_world_measure(train_world *w, stab_monitor *m, int with_update) {
  return stab_mpi_monitor_measure(w->comm, m, with_update);
}

int train_world_same_bits(train_world *w, const void *p, size_t bytes, uint64_t *hash, int *differing) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  uint64_t *all = malloc((size_t)w->size * sizeof *all);
  int bad = !all;
  if (bad) cli_error("rank %d: out of memory", w->rank);
  if (train_world_agree(w, bad)) return free(all), 1;
  if (MPI_Allgather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, w->comm) != MPI_SUCCESS) {
    cli_error("rank %d: MPI_Allgather of the hashes failed", w->rank);
    free(all);
    return 1;
  }
  *hash = all[0];
  *differing = -1;
  for (int r = 1; r < w->size && *differing < 0; r++)
    if (all[r] != all[0]) *differing = r;
  free(all);
  return 0;
}

int train_world_same_input(train_world *w, const char *file, const char *const *what, const void *const *bytes,
                           const size_t *sizes, size_t n) {
  uint64_t *d = malloc((n ? n : 1) * sizeof *d);
  char **names = malloc((n ? n : 1) * sizeof *names);
  int bad = !d || !names;
  for (size_t i = 0; !bad && i < n; i++) {
    d[i] = stab_mpi_digest(0, bytes[i], sizes[i]);
    size_t len = strlen(file) + strlen(what[i]) + 8;
    if (!(names[i] = malloc(len))) bad = 1, n = i;
    else snprintf(names[i], len, "%s (%s)", file, what[i]);
  }
  if (bad) cli_error("rank %d: out of memory", w->rank);
  int rc = 1;
  if (!train_world_agree(w, bad)) {
    stab_status st = stab_mpi_same_digests(w->comm, "cannot resume", (const char *const *)names, d, n, NULL, NULL);
    if (st == STAB_OK) rc = 0;
    else {
      if (w->rank == 0)
        cli_error("%s%s", stab_last_error(),
                  st == STAB_EINVAL ? ": every rank must resume from the same checkpoint (a node's own copy that is "
                                      "stale?); nothing trained"
                                    : "");
      rc = st == STAB_EINVAL ? 2 : 1;
    }
  }
  for (size_t i = 0; names && i < n; i++) free(names[i]);
  free(names), free(d);
  return rc;
}
