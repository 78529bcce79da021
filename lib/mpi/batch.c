/* mpi_batch.c — every split linear layer of a step measured together: the layers' Lanczos
 * estimates run side by side, one worker thread each, and every pass of all of them is summed
 * over the ranks in one exchange (mpi_collective.c's segmented sum), so that a step costs
 * about max(passes) collectives instead of sum(passes) over the layers.
 *
 * Why threads and not a resumable Lanczos: the engine (spectral.c) keeps its state in locals
 * across a loop with restarts, a run-to-the-end rule and two kinds of start; turned inside out
 * it would be a second engine to keep equal to the first. A worker running the engine itself,
 * whose reduce callback posts its vector and sleeps until the calling thread has summed every
 * posted vector, runs the very code stab_mpi_linear_measure runs, so the bits cannot part.
 * The workers take turns, one computing at a time, in layer order: a pass's local work runs
 * as it does in the single calls (with params.threads of the pass pool, not many estimates
 * fighting for two cores and their caches), only the exchanges are shared.
 * Only the calling thread calls MPI (MPI_THREAD_FUNNELED is enough); under
 * MPI_THREAD_SINGLE, on one rank, or when a rank cannot start its threads, every rank runs
 * the estimates one after another in the calling thread instead: the same bits, more
 * collectives. */
#include "mpi/mpi_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char who[] = "stab_mpi_linear_measure_batch";

/* A task waits its turn (READY), computes (RUNNING) until it posts a pass (POSTED) or ends
 * (DONE); QUIT: told to end without running. */
enum { READY, RUNNING, POSTED, DONE, QUIT };

typedef struct batch batch;

/* One worker's estimates: W's, and the update's chained after it when both read the layer's
 * buffer (16-bit weights split by rows, converted there, and the update formed there). */
typedef struct {
  batch *b;
  size_t layer;
  int count;                 /* estimates: 1, or 2 chained */
  stab_mpi_sharded *s[2];
  const float *a[2];         /* the engine's matrix; a[1] of a chain is formed after the first */
  size_t lda[2];
  stab_sigma_result *out[2];
  /* the pass waiting to be summed, under the batch's lock */
  double *y, *quad;
  size_t n;
  int state;
  stab_status reduce_status;
  /* the worker's outcome; its message copied from its own thread's stab_last_error() */
  stab_status status;
  char message[240];
  pthread_cond_t turn;       /* this worker: its state moved */
  pthread_t thread;
  int started;
} task;

struct batch {
  pthread_mutex_t lock;
  pthread_cond_t posted;     /* the calling thread: a round's last turn has ended */
  int round_over;
  task *tasks;
  size_t ntasks;
  stab_mpi_linear *const *h;
  const stab_layer *const *l;
  const stab_layer *const *before;
  const size_t *ld;
  double (*q)[4];            /* per layer: ||W||^2, ||dW||^2, ||b||^2, ||db||^2 of this rank's part */
};

/* Runs a task's estimates, every pass summed through fn(ctx). */
static void run_task(task *t, stab_spectral_reduce_fn fn, void *ctx) {
  batch *b = t->b;
  const size_t i = t->layer;
  for (int e = 0; e < t->count; e++) {
    if (e == 1) { /* the chain's update, in the buffer W's estimate has done with */
      stab_mpi_linear *h = b->h[i];
      stabi_mpi_linear_update(h, b->l[i], b->before[i], b->ld[i], b->q[i]);
      stabi_mpi_sharded_source(t->s[1], h->buf, h->scols, &t->a[1], &t->lda[1]);
    }
    t->status = stabi_mpi_sharded_run(t->s[e], t->a[e], t->lda[e], fn, ctx, t->out[e]);
    if (t->status != STAB_OK) { /* unless an exchange's failure is already the message */
      if (!t->message[0]) snprintf(t->message, sizeof t->message, "%s: layer %zu: %.190s", who, i, stab_last_error());
      return;
    }
  }
}

/* A worker's turn has ended (it posted a pass, or ended): the next task waiting in this round
 * takes it, straight from this worker (one thread switch a turn); after the last, the
 * calling thread. Under the lock. */
static void pass_turn(batch *b, task *t) {
  for (task *u = t + 1; u < b->tasks + b->ntasks; u++)
    if (u->state == READY) {
      u->state = RUNNING;
      pthread_cond_signal(&u->turn);
      return;
    }
  b->round_over = 1;
  pthread_cond_signal(&b->posted);
}

/* A worker's reduce: post the pass, sleep until it is summed and the worker's turn comes. */
static stab_status post_and_wait(void *ctx, double *y, size_t n, double *quad) {
  task *t = ctx;
  batch *b = t->b;
  pthread_mutex_lock(&b->lock);
  t->y = y;
  t->n = n;
  t->quad = quad;
  t->state = POSTED;
  pass_turn(b, t);
  while (t->state != RUNNING) pthread_cond_wait(&t->turn, &b->lock);
  const stab_status st = t->reduce_status;
  pthread_mutex_unlock(&b->lock);
  return st;
}

static void *worker(void *arg) {
  task *t = arg;
  batch *b = t->b;
  pthread_mutex_lock(&b->lock);
  while (t->state == READY) pthread_cond_wait(&t->turn, &b->lock);
  const int go = t->state == RUNNING;
  pthread_mutex_unlock(&b->lock);
  if (go) run_task(t, post_and_wait, t);
  pthread_mutex_lock(&b->lock);
  const int had_turn = t->state == RUNNING;
  t->state = DONE;
  if (had_turn) pass_turn(b, t);
  pthread_mutex_unlock(&b->lock);
  return NULL;
}

/* Tells every worker started, all waiting for their first turn, to quit, and joins them:
 * none is left behind. */
static void quit_and_join(batch *b, task *t, size_t nt) {
  pthread_mutex_lock(&b->lock);
  for (size_t k = 0; k < nt; k++) {
    t[k].state = QUIT;
    pthread_cond_signal(&t[k].turn);
  }
  pthread_mutex_unlock(&b->lock);
  for (size_t k = 0; k < nt; k++)
    if (t[k].started) pthread_join(t[k].thread, NULL);
}

/* The calling thread's loop: a round gives each task not yet ended its turn, in task order,
 * each posting a pass or ending; then every posted pass is summed in one exchange.
 * Until all have ended. Each exchange's tasks are the same on every rank, in task order, since
 * every rank's engines take the same decisions from the same sums. A failed exchange is its
 * tasks' reduce's status, which their engines stop on and return. */
static void coordinate(batch *b, task *t, size_t nt, stabi_mpi_sum *sum, stabi_mpi_segment *seg, task **posted) {
  for (;;) {
    size_t np = 0, j = 0;
    pthread_mutex_lock(&b->lock);
    while (j < nt && t[j].state == DONE) j++;
    if (j < nt) { /* the round: the first task's turn, then each hands it on (pass_turn) */
      b->round_over = 0;
      t[j].state = RUNNING;
      pthread_cond_signal(&t[j].turn);
      while (!b->round_over) pthread_cond_wait(&b->posted, &b->lock);
    }
    for (j = 0; j < nt; j++)
      if (t[j].state == POSTED) posted[np++] = &t[j];
    pthread_mutex_unlock(&b->lock);
    if (np == 0) return;
    for (size_t k = 0; k < np; k++) seg[k] = (stabi_mpi_segment){posted[k]->y, posted[k]->n, posted[k]->quad, 1};
    const stab_status rs = stabi_mpi_sum_segments(sum, seg, np, NULL);
    pthread_mutex_lock(&b->lock);
    for (size_t k = 0; k < np; k++) {
      posted[k]->reduce_status = rs;
      if (rs != STAB_OK && !posted[k]->message[0]) /* the worker's thread has its own last error */
        snprintf(posted[k]->message, sizeof posted[k]->message, "%s: layer %zu: %.190s", who, posted[k]->layer,
                 stab_last_error());
      posted[k]->state = READY; /* summed: its next turn comes in the next round */
    }
    pthread_mutex_unlock(&b->lock);
  }
}

/* Every rank learns the lowest failing rank's status and message: code is P - that rank, from
 * a MAX already exchanged (0: none failed). */
static stab_status spread_failure(MPI_Comm comm, int ranks, int rank, int64_t code, stab_status mine,
                                  const char *message) {
  const int first = ranks - (int)code;
  struct { int status; char message[244]; } why;
  memset(&why, 0, sizeof why);
  if (rank == first) {
    why.status = (int)mine;
    strncpy(why.message, message, sizeof why.message - 1);
  }
  if (MPI_Bcast(&why, (int)sizeof why, MPI_BYTE, first, comm) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: rank %d failed, and MPI_Bcast of its message failed", who, first);
  return stabi_fail((stab_status)why.status, "rank %d: %s", first, why.message);
}

/* A 62-bit digest of a sequence, so that its MAX and the MAX of its negation over the ranks
 * are equal when every rank has the same sequence (FNV-1a over the values' bytes). */
static int64_t digest(int64_t h, uint64_t x) {
  uint64_t d = (uint64_t)h;
  for (int k = 0; k < 8; k++) d = (d ^ ((x >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
  return (int64_t)(d & ((UINT64_C(1) << 62) - 1));
}

/* On one rank alone: the arguments, the handles' communicators against comm's, no handle
 * twice. */
static stab_status check_local(stab_mpi_linear *const *h, size_t n, const stab_layer *const *l,
                               const stab_layer *const *before, const stab_metrics *out, MPI_Comm comm,
                               size_t *ld) {
  if (!l) return stabi_fail(STAB_EINVAL, "%s: shard_layers is NULL", who);
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  char name[64];
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof name, "%s: layer %zu", who, i);
    if (!h[i]) return stabi_fail(STAB_EINVAL, "%s: its handle is NULL", name);
    int cmp = MPI_UNEQUAL;
    if (MPI_Comm_compare(comm, h[i]->comm, &cmp) != MPI_SUCCESS)
      return stabi_fail(STAB_EIO, "%s: MPI_Comm_compare failed", name);
    if (cmp != MPI_IDENT && cmp != MPI_CONGRUENT)
      return stabi_fail(STAB_EINVAL, "%s: its handle was created on a communicator of other ranks, or of "
                        "the same ranks in another order, than the other layers' handles", name);
    for (size_t j = 0; j < i; j++)
      if (h[j] == h[i]) return stabi_fail(STAB_EINVAL, "%s: its handle is layer %zu's too", name, j);
    stab_status st = stabi_mpi_linear_check(h[i], l[i], before ? before[i] : NULL, &out[i], &ld[i], name);
    if (st != STAB_OK) return st;
  }
  return STAB_OK;
}

/* Where the ranks' calls differ (their count, their handles' order, their befores), once
 * every rank's own arguments passed: the same verdict on every rank from MAXes exchanged. */
static stab_status check_alike(MPI_Comm comm, stab_mpi_linear *const *h, size_t n, const stab_layer *const *before,
                               const int64_t *mx) {
  if (mx[1] != -mx[2])
    return stabi_fail(STAB_EINVAL, "%s: n is %lld on some ranks and %lld on others", who, (long long)mx[1],
                      (long long)-mx[2]);
  if (mx[3] == -mx[4] && mx[5] == -mx[6]) return STAB_OK;
  /* a digest differs: the rare path, one more exchange to name the first layer that differs */
  int64_t *per = malloc(4 * (n ? n : 1) * sizeof *per);
  stab_status st = per ? STAB_OK : stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  st = stabi_mpi_agree(comm, st, who);
  if (st != STAB_OK) {
    free(per);
    return st;
  }
  for (size_t i = 0; i < n; i++) {
    const int64_t with = before && before[i];
    per[4 * i] = (int64_t)h[i]->id;
    per[4 * i + 1] = -(int64_t)h[i]->id;
    per[4 * i + 2] = with;
    per[4 * i + 3] = -with;
  }
  if (MPI_Allreduce(MPI_IN_PLACE, per, (int)(4 * n), MPI_INT64_T, MPI_MAX, comm) != MPI_SUCCESS)
    st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the layers' handles failed", who);
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    if (per[4 * i] != -per[4 * i + 1])
      st = stabi_fail(STAB_EINVAL, "%s: layer %zu is not the same handle on every rank (the handles given in "
                      "another order, or other handles)", who, i);
    else if (per[4 * i + 2] != -per[4 * i + 3])
      st = stabi_fail(STAB_EINVAL, "%s: layer %zu: before is given on some ranks and NULL on others", who, i);
  }
  free(per);
  return st;
}

stab_status stab_mpi_linear_measure_batch(stab_mpi_linear *const *h, size_t n, const stab_layer *const *shard_layers,
                                          const stab_layer *const *befores, stab_metrics *out) {
  if (out)
    for (size_t i = 0; i < n; i++) stabi_mpi_linear_clear(&out[i]);
  if (n == 0) return STAB_OK;
  if (!h) return stabi_fail(STAB_EINVAL, "%s: h is NULL", who); /* no communicator to tell */
  /* the batch runs on the handle created first: the same one on every rank that gives the same
   * handles, in whatever order, so that a wrong order is told, not hung on */
  stab_mpi_linear *first = NULL;
  for (size_t i = 0; i < n; i++)
    if (h[i] && (!first || h[i]->id < first->id)) first = h[i];
  if (!first) return stabi_fail(STAB_EINVAL, "%s: every handle is NULL", who);
  const MPI_Comm comm = first->comm;
  int rank = 0, ranks = 1;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS || MPI_Comm_size(comm, &ranks) != MPI_SUCCESS)
    return stabi_fail(STAB_EIO, "%s: MPI_Comm_rank or MPI_Comm_size failed", who);

  /* per layer at most two tasks; buffers for the largest exchange: every task's block of 4 */
  size_t *ld = calloc(n, sizeof *ld);
  double(*q)[4] = calloc(n, sizeof *q);
  stab_linear_parts *parts = calloc(n, sizeof *parts);
  task *t = calloc(2 * n, sizeof *t);
  task **posted = calloc(2 * n, sizeof *posted);
  stabi_mpi_segment *seg = calloc(2 * n, sizeof *seg);
  stabi_mpi_sum sum = {0};
  batch b = {.h = h, .l = shard_layers, .before = befores, .ld = ld, .q = q};
  pthread_mutex_init(&b.lock, NULL);
  pthread_cond_init(&b.posted, NULL);
  size_t nt = 0;
  b.tasks = t;
  stab_status st = ld && q && parts && t && posted && seg ? STAB_OK : stabi_fail(STAB_ENOMEM, "%s: out of memory "
                                                                                 "for %zu layers", who, n);
  if (st == STAB_OK) st = check_local(h, n, shard_layers, befores, out, comm, ld);
  if (st == STAB_OK) { /* the tasks, and their sums' room */
    size_t room = 0;
    for (size_t i = 0; i < n; i++) {
      const stab_layer *bf = befores ? befores[i] : NULL;
      const int chain = bf && h[i]->shard.split == STAB_MPI_SPLIT_ROWS && shard_layers[i]->dtype != STAB_DTYPE_F32;
      task *w = &t[nt++];
      *w = (task){.b = &b, .layer = i, .count = 1 + chain, .s = {h[i]->w, h[i]->dw},
                  .out = {&parts[i].weight, &parts[i].update}};
      room += 4 * h[i]->w->n + 1;
      if (bf && !chain) {
        t[nt++] = (task){.b = &b, .layer = i, .count = 1, .s = {h[i]->dw}, .out = {&parts[i].update}};
        room += 4 * h[i]->dw->n + 1;
      }
    }
    b.ntasks = nt;
    st = stabi_mpi_sum_init(&sum, comm, room);
  }
  /* the workers, before the exchange that tells whether every rank has them */
  for (size_t k = 0; k < nt; k++) pthread_cond_init(&t[k].turn, NULL); /* state READY: 0 */
  /* on one rank an exchange costs next to nothing: the hand-offs would cost more than they save */
  int provided = MPI_THREAD_SINGLE, threads_ok = nt > 1 && ranks > 1;
  if (MPI_Query_thread(&provided) != MPI_SUCCESS || provided < MPI_THREAD_FUNNELED) threads_ok = 0;
  for (size_t k = 0; st == STAB_OK && threads_ok && k < nt; k++) {
    t[k].started = pthread_create(&t[k].thread, NULL, worker, &t[k]) == 0;
    threads_ok = t[k].started;
  }

  /* the one exchange of the checks: the lowest failing rank, and digests of what must be alike */
  int64_t mx[8] = {st != STAB_OK ? ranks - rank : 0, (int64_t)n, -(int64_t)n, 0, 0, 0, 0, !threads_ok};
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    mx[3] = digest(mx[3], h[i]->id);
    mx[5] = digest(mx[5], befores && befores[i]);
  }
  mx[4] = -mx[3];
  mx[6] = -mx[5];
  const stab_status mine = st;
  char why[244];
  snprintf(why, sizeof why, "%s", stab_last_error());
  if (MPI_Allreduce(MPI_IN_PLACE, mx, 8, MPI_INT64_T, MPI_MAX, comm) != MPI_SUCCESS)
    st = stabi_fail(STAB_EIO, "%s: MPI_Allreduce of the ranks' checks failed", who);
  else if (mx[0] > 0)
    st = spread_failure(comm, ranks, rank, mx[0], mine, why);
  else
    st = check_alike(comm, h, n, befores, mx);
  const int run_threads = st == STAB_OK && mx[7] == 0;
  if (!run_threads) quit_and_join(&b, t, nt);

  if (st == STAB_OK) { /* this rank's part, the shards' reads of the step in the calling thread */
    for (size_t k = 0; k < nt; k++) {
      const size_t i = t[k].layer;
      stab_mpi_linear *hi = h[i];
      const stab_layer *bf = befores ? befores[i] : NULL;
      if (t[k].s[0] == hi->w) {
        const float *w = NULL;
        size_t wld = 0;
        stabi_mpi_linear_weights(hi, shard_layers[i], ld[i], &w, &wld);
        stabi_mpi_sharded_source(hi->w, w, wld, &t[k].a[0], &t[k].lda[0]);
        stabi_mpi_linear_bias_sums(hi, shard_layers[i], bf, q[i]);
      } else { /* the update's own task: W's buffer use, if any, ended with its transpose */
        stabi_mpi_linear_update(hi, shard_layers[i], bf, ld[i], q[i]);
        stabi_mpi_sharded_source(hi->dw, hi->buf, hi->scols, &t[k].a[0], &t[k].lda[0]);
      }
    }
    if (run_threads) {
      coordinate(&b, t, nt, &sum, seg, posted);
      for (size_t k = 0; k < nt; k++) pthread_join(t[k].thread, NULL);
    } else {
      for (size_t k = 0; k < nt; k++) run_task(&t[k], stabi_mpi_sum_reduce, &sum);
    }
    /* the first failing layer on this rank, and the sums of squares with the ranks' verdict */
    stab_status fail = STAB_OK;
    for (size_t k = 0; k < nt && fail == STAB_OK; k++)
      if (t[k].status != STAB_OK) {
        fail = t[k].status;
        snprintf(why, sizeof why, "%s", t[k].message);
      }
    for (size_t i = 0; i < n; i++) seg[i] = (stabi_mpi_segment){NULL, 0, q[i], 4};
    double flag = fail != STAB_OK ? ranks - rank : 0;
    st = stabi_mpi_sum_segments(&sum, seg, n, &flag);
    if (st == STAB_OK && flag > 0) st = spread_failure(comm, ranks, rank, (int64_t)flag, fail, why);
    for (size_t i = 0; i < n && st == STAB_OK; i++) {
      stab_status fs = stabi_mpi_linear_finish(h[i], &parts[i], q[i], befores && befores[i], &out[i]);
      if (fs != STAB_OK) st = fs;
    }
    if (st != STAB_OK)
      for (size_t i = 0; i < n; i++) stabi_mpi_linear_clear(&out[i]);
  }
  stabi_mpi_sum_free(&sum);
  for (size_t k = 0; k < nt; k++) pthread_cond_destroy(&t[k].turn);
  pthread_cond_destroy(&b.posted);
  pthread_mutex_destroy(&b.lock);
  free(seg);
  free(posted);
  free(t);
  free(parts);
  free(q);
  free(ld);
  return st;
}
