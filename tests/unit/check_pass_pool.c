/* check_pass_pool.c — the threads that share a pass (lib/engine/pass_pool.c), seen through the public
 * calls: the same bits for every thread count and dtype, several user threads using the library
 * at once, and a fork after the pool has threads. Nothing here depends on how fast anything
 * runs: a hang is caught by alarm() in the child and by Check's timeout. */
#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stabmeter.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Shapes over 2^20 elements (smaller passes never use threads): more chunks than threads,
 * wide and tall, contiguous and strided. */
static const struct {
  size_t rows, cols, ld;
} shapes[] = {{1500, 800, 800}, {700, 2000, 2000}, {4100, 300, 310}};

static const int thread_counts[] = {1, 2, 3, 8};
enum { N_COUNTS = sizeof thread_counts / sizeof thread_counts[0] };

static int same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

/* sigma(A) or sigma(A - B), cold, with these threads; v receives the top vector. */
static stab_sigma_result sigma_with(const float *a, const float *b, size_t rows, size_t cols, size_t ld,
                                    int threads, double *v) {
  stab_spectral_params p = stab_spectral_default_params();
  p.threads = threads;
  stab_spectral_workspace *ws = NULL;
  stab_sigma_result res;
  TU_ASSERT_OK(stab_spectral_workspace_create(rows, cols, &p, &ws));
  memset(v, 0, cols * sizeof *v);
  TU_ASSERT_OK(stab_spectral_norm(ws, a, b, rows, cols, ld, v, &res));
  stab_spectral_workspace_free(ws);
  return res;
}

START_TEST(test_threads_same_bits) {
  const size_t rows = shapes[_i].rows, cols = shapes[_i].cols, ld = shapes[_i].ld;
  tu_rng r;
  tu_rng_init(&r, 7100 + (uint64_t)_i);
  float *a = tu_matrix_padded(rows, cols, ld), *b = tu_matrix_padded(rows, cols, ld);
  /* low rank plus noise: a gap, so few passes (a cheap test); B another such matrix */
  tu_fill_lowrank(a, rows, cols, ld, 3, 0.05, &r);
  tu_fill_lowrank(b, rows, cols, ld, 3, 0.05, &r);
  /* the f64 SVD reference of the narrowest shape only: it costs a second a shape */
  const int with_ref = cols <= 300;
  const double ref = with_ref ? ref_sigma(a, rows, cols, ld) : NAN;
  const double ref_b = with_ref ? ref_sigma_diff(a, b, rows, cols, ld) : NAN;
  for (int with_b = 0; with_b < 2; with_b++) {
    double *v[N_COUNTS];
    stab_sigma_result res[N_COUNTS];
    for (int t = 0; t < N_COUNTS; t++) {
      v[t] = tu_doubles(cols);
      res[t] = sigma_with(a, with_b ? b : NULL, rows, cols, ld, thread_counts[t], v[t]);
    }
    const char *ctx = tu_ctx("%zux%zu ld %zu%s", rows, cols, ld, with_b ? " A-B" : "");
    if (with_ref) TU_ASSERT_REL(res[0].sigma, with_b ? ref_b : ref, 1e-3, "%s", ctx);
    for (int t = 1; t < N_COUNTS; t++) {
      ck_assert_msg(same_bits(res[0].sigma, res[t].sigma) && same_bits(res[0].rel_err, res[t].rel_err) &&
                        res[0].passes == res[t].passes,
                    "%s: sigma %.17g rel_err %.3g passes %d with 1 thread, %.17g %.3g %d with %d", ctx,
                    res[0].sigma, res[0].rel_err, res[0].passes, res[t].sigma, res[t].rel_err, res[t].passes,
                    thread_counts[t]);
      ck_assert_msg(memcmp(v[0], v[t], cols * sizeof(double)) == 0, "%s: v differs between 1 and %d threads",
                    ctx, thread_counts[t]);
    }
    for (int t = 0; t < N_COUNTS; t++) free(v[t]);
  }
  free(a);
  free(b);
}
END_TEST

/* f32 -> bf16, round to nearest even (finite values). */
static uint16_t to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* BF16 weights minus F32 ones (the update against an F32 `before`) go through each thread's own
 * pair of f32 tiles: the tiles of different threads must never mix, whatever thread runs which
 * chunk. sigma(W) alone reads the BF16 in place. */
START_TEST(test_bf16_tiles_same_bits) {
  enum { DIN = 1200, DOUT = 1000 };
  tu_rng r;
  tu_rng_init(&r, 7200);
  float *w = tu_floats((size_t)DIN * DOUT), *w0 = tu_floats((size_t)DIN * DOUT);
  uint16_t *h = malloc(sizeof *h * DIN * DOUT);
  ck_assert_ptr_nonnull(h);
  /* low rank plus noise, and an update of low rank: few passes */
  tu_fill_lowrank(w, DIN, DOUT, DOUT, 3, 0.05, &r);
  tu_fill_lowrank(w0, DIN, DOUT, DOUT, 2, 0.0, &r);
  for (size_t i = 0; i < (size_t)DIN * DOUT; i++) {
    h[i] = to_bf16(w[i]);
    w0[i] = w[i] - 0.1f * w0[i];
  }
  stab_layer l = {.name = "bf16", .kind = STAB_KIND_LINEAR, .d_in = DIN, .d_out = DOUT,
                  .weight = (const float *)(const void *)h, .dtype = STAB_DTYPE_BF16};
  stab_layer before = l;
  before.weight = w0;
  before.dtype = STAB_DTYPE_F32;
  stab_metrics got[N_COUNTS];
  for (int t = 0; t < N_COUNTS; t++) {
    stab_metrics_params p = stab_metrics_default_params();
    p.spectral.threads = thread_counts[t];
    TU_ASSERT_OK(stab_layer_metrics(&l, &before, &p, &got[t], NULL));
  }
  ck_assert(isfinite(got[0].sigma) && isfinite(got[0].sigma_update));
  for (int t = 1; t < N_COUNTS; t++)
    ck_assert_msg(same_bits(got[0].sigma, got[t].sigma) && same_bits(got[0].sigma_update, got[t].sigma_update) &&
                      same_bits(got[0].update, got[t].update) && got[0].passes == got[t].passes &&
                      got[0].update_passes == got[t].update_passes,
                  "BF16: sigma %.17g / update %.17g with 1 thread, %.17g / %.17g with %d", got[0].sigma,
                  got[0].sigma_update, got[t].sigma, got[t].sigma_update, thread_counts[t]);
  free(w);
  free(w0);
  free(h);
}
END_TEST

/* ---- several user threads at once ------------------------------------------------- */

enum { CALLERS = 4, ROUNDS = 3, CR = 1100, CC = 1000 };

typedef struct {
  const float *a;
  int threads;
  double sigma[ROUNDS], v0[ROUNDS];
  int passes[ROUNDS];
  int failed;
} caller;

static void *caller_main(void *arg) {
  caller *c = arg;
  double *v = malloc(CC * sizeof *v);
  if (!v) {
    c->failed = 1;
    return NULL;
  }
  for (int k = 0; k < ROUNDS; k++) {
    stab_spectral_params p = stab_spectral_default_params();
    p.threads = c->threads;
    stab_sigma_result res;
    memset(v, 0, CC * sizeof *v);
    if (stab_sigma(c->a, CR, CC, CC, &p, v, &res) != STAB_OK) c->failed = 1;
    c->sigma[k] = res.sigma;
    c->passes[k] = res.passes;
    c->v0[k] = v[0];
  }
  free(v);
  return NULL;
}

START_TEST(test_concurrent_callers) {
  tu_rng r;
  tu_rng_init(&r, 7300);
  float *a[CALLERS];
  double want[CALLERS], v0[CALLERS];
  int want_passes[CALLERS];
  double *v = tu_doubles(CC);
  for (int c = 0; c < CALLERS; c++) {
    a[c] = tu_floats((size_t)CR * CC);
    tu_fill_gauss(a[c], CR, CC, CC, 1.0 + c, &r);
    stab_sigma_result res = sigma_with(a[c], NULL, CR, CC, CC, 1, v);
    want[c] = res.sigma;
    want_passes[c] = res.passes;
    v0[c] = v[0];
  }
  /* two threads each, as many as the pool may lend, and one caller asking for 8 */
  caller cs[CALLERS];
  pthread_t th[CALLERS];
  for (int c = 0; c < CALLERS; c++) {
    memset(&cs[c], 0, sizeof cs[c]);
    cs[c].a = a[c];
    cs[c].threads = c == CALLERS - 1 ? 8 : 2;
    ck_assert_int_eq(pthread_create(&th[c], NULL, caller_main, &cs[c]), 0);
  }
  for (int c = 0; c < CALLERS; c++) ck_assert_int_eq(pthread_join(th[c], NULL), 0);
  for (int c = 0; c < CALLERS; c++) {
    ck_assert_msg(!cs[c].failed, "caller %d: a call failed", c);
    for (int k = 0; k < ROUNDS; k++)
      ck_assert_msg(same_bits(cs[c].sigma[k], want[c]) && cs[c].passes[k] == want_passes[c] &&
                        same_bits(cs[c].v0[k], v0[c]),
                    "caller %d round %d: sigma %.17g (%d passes), serial %.17g (%d)", c, k, cs[c].sigma[k],
                    cs[c].passes[k], want[c], want_passes[c]);
  }
  for (int c = 0; c < CALLERS; c++) free(a[c]);
  free(v);
}
END_TEST

/* ---- fork ------------------------------------------------------------------------- */

/* A process that used threaded passes forks; the child, which has none of the parent's threads,
 * computes the same sigma with threads again and exits. libgomp's team did not survive this:
 * the child waited forever for threads that were not there. */
START_TEST(test_fork_after_use) {
  enum { R = 1500, C = 800 };
  tu_rng r;
  tu_rng_init(&r, 7400);
  float *a = tu_floats((size_t)R * C);
  tu_fill_gauss(a, R, C, C, 1.0, &r);
  double *v = tu_doubles(C);
  const stab_sigma_result parent = sigma_with(a, NULL, R, C, C, 2, v);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(60); /* a hang ends the child with SIGALRM instead of stalling the suite */
    stab_spectral_params p = stab_spectral_default_params();
    p.threads = 2;
    stab_sigma_result child;
    int ok = stab_sigma(a, R, C, C, &p, NULL, &child) == STAB_OK && same_bits(child.sigma, parent.sigma);
    _exit(ok ? 0 : 3);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the child %s %d (3: wrong sigma; SIGALRM = %d: it hung)",
                WIFEXITED(status) ? "exited" : "was killed by signal",
                WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), SIGALRM);
  /* and the parent's pool still serves it */
  const stab_sigma_result again = sigma_with(a, NULL, R, C, C, 2, v);
  ck_assert(same_bits(again.sigma, parent.sigma));
  free(a);
  free(v);
}
END_TEST

static Suite *pool_suite(void) {
  Suite *s = suite_create("pass_pool");
  TCase *tc = tcase_create("same_bits");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_threads_same_bits, 0, (int)(sizeof shapes / sizeof shapes[0]));
  tcase_add_test(tc, test_bf16_tiles_same_bits);
  suite_add_tcase(s, tc);

  tc = tcase_create("callers");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_concurrent_callers);
  tcase_add_test(tc, test_fork_after_use);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(pool_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
