/* check_priority.c — threads' priority (lib/engine/priority.c and pass_pool.c, built into this
 * program: their functions are internal). The idle turn of a background measurement: entered at
 * SCHED_IDLE, back to its own policy on leave or on a hurry for its ticket, never lowered after
 * a hurry for its ticket, lowered after a hurry for another. The pool's workers run a job's tasks
 * at the scheduling policy of the thread that runs the job: a caller at SCHED_IDLE has its tasks run at SCHED_IDLE by whichever thread claims them,
 * a caller at normal priority never has a task run by a worker left idle by an earlier job, and
 * a caller raised back while it waits for a worker's task raises that worker.
 * Nothing here depends on speed: the first task waits (on a condition variable, not a clock)
 * until another thread has run one, so a worker always takes part. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/engine.h"

enum { TASKS = 16 };

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t ran;
  int others_ran;        /* tasks run by a thread other than the caller */
  int wait_for_worker;   /* task 0 waits until others_ran > 0 */
  pid_t caller;
  int policy[TASKS];     /* sched_getscheduler of the thread that ran task k */
  pid_t tid[TASKS];
} job;

static pid_t thread_id(void) { return (pid_t)syscall(SYS_gettid); }

static void task(void *arg, size_t k, int slot) {
  (void)slot;
  job *j = arg;
  const pid_t me = thread_id();
  j->policy[k] = sched_getscheduler(0);
  j->tid[k] = me;
  pthread_mutex_lock(&j->lock);
  if (me != j->caller) {
    j->others_ran++;
    pthread_cond_broadcast(&j->ran);
  }
  if (k == 0 && j->wait_for_worker)
    while (j->others_ran == 0) pthread_cond_wait(&j->ran, &j->lock);
  pthread_mutex_unlock(&j->lock);
}

/* Runs TASKS tasks on 2 threads from the calling thread; the policies each task saw into j. */
static void run_job(job *j, int wait_for_worker) {
  memset(j, 0, sizeof *j);
  pthread_mutex_init(&j->lock, NULL);
  pthread_cond_init(&j->ran, NULL);
  j->caller = thread_id();
  j->wait_for_worker = wait_for_worker;
  stabi_pool_run(TASKS, 2, task, j);
  pthread_mutex_destroy(&j->lock);
  pthread_cond_destroy(&j->ran);
}

static void assert_all(const job *j, int policy, const char *what) {
  for (int k = 0; k < TASKS; k++)
    ck_assert_msg(j->policy[k] == policy, "%s: task %d ran at policy %d on thread %d (caller %d), want %d", what, k,
                  j->policy[k], (int)j->tid[k], (int)j->caller, policy);
}

/* The idle caller runs in a thread of its own: without CAP_SYS_NICE a thread cannot leave
 * SCHED_IDLE, and the test's main thread must stay normal. */
static void *idle_caller(void *arg) {
  job *j = arg;
  struct sched_param sp = {0};
  if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
    j->others_ran = -1 - errno;
    return NULL;
  }
  run_job(j, 1);
  return NULL;
}

/* Whether this process may take a thread out of SCHED_IDLE (root, CAP_SYS_NICE, RLIMIT_NICE). */
static void *probe_raise(void *arg) {
  struct sched_param sp = {0};
  *(int *)arg = sched_setscheduler(0, SCHED_IDLE, &sp) == 0 && sched_setscheduler(0, SCHED_OTHER, &sp) == 0;
  return NULL;
}

START_TEST(test_workers_follow_the_callers_policy) {
  job j;
  pthread_t t;
  /* a normal caller first: the worker exists and is normal */
  run_job(&j, 1);
  ck_assert_int_gt(j.others_ran, 0);
  assert_all(&j, SCHED_OTHER, "normal caller");

  ck_assert_int_eq(pthread_create(&t, NULL, idle_caller, &j), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(j.others_ran >= 0, "SCHED_IDLE refused: errno %d", -1 - j.others_ran);
  ck_assert_int_gt(j.others_ran, 0);
  assert_all(&j, SCHED_IDLE, "caller at SCHED_IDLE");

  /* a normal caller again: the worker, idle since the last job, is raised back, or (without
   * the right to raise a thread) takes no task of this one; it must not run one at SCHED_IDLE */
  int can_raise = 0;
  ck_assert_int_eq(pthread_create(&t, NULL, probe_raise, &can_raise), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  run_job(&j, can_raise);
  assert_all(&j, SCHED_OTHER, "normal caller after an idle one");
  if (can_raise) ck_assert_int_gt(j.others_ran, 0);
  else fprintf(stderr, "check_priority: this process may not raise a thread from SCHED_IDLE: the raise "
                       "back is checked only as the worker staying out\n");
}
END_TEST

/* ---- a caller raised while it waits raises its workers ---- */

typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  pid_t caller, worker;  /* worker: the thread blocked in its first task */
  int worker_started, released, refused;
} held_job;

static void held_task(void *arg, size_t k, int slot) {
  (void)k;
  (void)slot;
  held_job *j = arg;
  const pid_t me = thread_id();
  pthread_mutex_lock(&j->lock);
  if (me == j->caller) {
    while (!j->worker_started) pthread_cond_wait(&j->changed, &j->lock);
  } else if (!j->worker_started) {
    j->worker = me;
    j->worker_started = 1;
    pthread_cond_broadcast(&j->changed);
    while (!j->released) pthread_cond_wait(&j->changed, &j->lock);
  }
  pthread_mutex_unlock(&j->lock);
}

static void *held_caller(void *arg) {
  held_job *j = arg;
  struct sched_param sp = {0};
  j->caller = thread_id();
  if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
    pthread_mutex_lock(&j->lock);
    j->refused = 1;
    j->worker_started = 1;
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->lock);
    return NULL;
  }
  stabi_pool_run(TASKS, 2, held_task, j);
  return NULL;
}

START_TEST(test_raised_caller_raises_its_workers) {
  int can_raise = 0;
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, probe_raise, &can_raise), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  if (!can_raise) {
    fprintf(stderr, "check_priority: this process may not raise a thread from SCHED_IDLE: skipped\n");
    return;
  }
  held_job j;
  memset(&j, 0, sizeof j);
  pthread_mutex_init(&j.lock, NULL);
  pthread_cond_init(&j.changed, NULL);
  ck_assert_int_eq(pthread_create(&t, NULL, held_caller, &j), 0);
  pthread_mutex_lock(&j.lock);
  while (!j.worker_started) pthread_cond_wait(&j.changed, &j.lock);
  pthread_mutex_unlock(&j.lock);
  ck_assert_msg(!j.refused, "SCHED_IDLE refused");
  ck_assert_int_eq(sched_getscheduler(j.worker), SCHED_IDLE);
  /* the trainer waits: it raises the caller, as stabmeter.torch's Monitor does */
  struct sched_param sp = {0};
  ck_assert_int_eq(sched_setscheduler(j.caller, SCHED_OTHER, &sp), 0);
  /* the caller checks every few milliseconds while it waits; 30 s is only a bound on a hang */
  int policy = SCHED_IDLE;
  for (int i = 0; i < 30000 && (policy = sched_getscheduler(j.worker)) == SCHED_IDLE; i++) usleep(1000);
  pthread_mutex_lock(&j.lock);
  j.released = 1;
  pthread_cond_broadcast(&j.changed);
  pthread_mutex_unlock(&j.lock);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(policy == SCHED_OTHER, "the worker's task still ran at policy %d after its caller was raised", policy);
  pthread_mutex_destroy(&j.lock);
  pthread_cond_destroy(&j.changed);
}
END_TEST

/* ---- the idle turn ---- */

typedef struct {
  stabi_idle_turn *turn;
  uint64_t ticket;
  pthread_mutex_t lock;
  pthread_cond_t changed;
  int entered, release;
  pid_t tid;
  int policy_in, policy_out; /* the thread's policy after enter, after leave */
} turn_thread;

static void *in_turn(void *arg) {
  turn_thread *t = arg;
  stabi_idle_enter(t->turn, t->ticket);
  pthread_mutex_lock(&t->lock);
  t->tid = thread_id();
  t->policy_in = sched_getscheduler(0);
  t->entered = 1;
  pthread_cond_broadcast(&t->changed);
  while (!t->release) pthread_cond_wait(&t->changed, &t->lock);
  pthread_mutex_unlock(&t->lock);
  stabi_idle_leave(t->turn);
  t->policy_out = sched_getscheduler(0);
  return NULL;
}

/* Starts a thread that enters the turn with ticket and waits; returns once it has entered. */
static void start_turn(turn_thread *t, stabi_idle_turn *turn, uint64_t ticket, pthread_t *th) {
  memset(t, 0, sizeof *t);
  t->turn = turn;
  t->ticket = ticket;
  pthread_mutex_init(&t->lock, NULL);
  pthread_cond_init(&t->changed, NULL);
  ck_assert_int_eq(pthread_create(th, NULL, in_turn, t), 0);
  pthread_mutex_lock(&t->lock);
  while (!t->entered) pthread_cond_wait(&t->changed, &t->lock);
  pthread_mutex_unlock(&t->lock);
}

static void end_turn(turn_thread *t, pthread_t th) {
  pthread_mutex_lock(&t->lock);
  t->release = 1;
  pthread_cond_broadcast(&t->changed);
  pthread_mutex_unlock(&t->lock);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  pthread_mutex_destroy(&t->lock);
  pthread_cond_destroy(&t->changed);
}

START_TEST(test_idle_turn) {
  const char *why = NULL;
  const int allowed = stab_idle_priority_allowed(&why);
  ck_assert_ptr_nonnull(why);
  int can_raise = 0;
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, probe_raise, &can_raise), 0);
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(allowed == can_raise, "stab_idle_priority_allowed says %d (%s), a thread here %s be raised back",
                allowed, why, can_raise ? "can" : "cannot");
  stabi_idle_turn turn;
  stabi_idle_turn_init(&turn);
  turn_thread t;
  const int low = allowed ? SCHED_IDLE : SCHED_OTHER;

  /* entered: idle (where allowed) until it leaves */
  start_turn(&t, &turn, 1, &th);
  ck_assert_int_eq(t.policy_in, low);
  end_turn(&t, th);
  ck_assert_int_eq(t.policy_out, SCHED_OTHER);

  /* hurried while it runs: back to its own policy at once, and after it leaves */
  start_turn(&t, &turn, 2, &th);
  ck_assert_int_eq(t.policy_in, low);
  stabi_idle_hurry(&turn, 2);
  ck_assert_int_eq(sched_getscheduler(t.tid), SCHED_OTHER);
  end_turn(&t, th);
  ck_assert_int_eq(t.policy_out, SCHED_OTHER);

  /* hurried before it starts: never lowered */
  stabi_idle_hurry(&turn, 3);
  start_turn(&t, &turn, 3, &th);
  ck_assert_int_eq(t.policy_in, SCHED_OTHER);
  end_turn(&t, th);

  /* a hurry for an earlier ticket does not keep the next one from idle priority */
  start_turn(&t, &turn, 4, &th);
  ck_assert_int_eq(t.policy_in, low);
  stabi_idle_hurry(&turn, 3);
  ck_assert_int_eq(sched_getscheduler(t.tid), low);
  end_turn(&t, th);
  ck_assert_int_eq(t.policy_out, SCHED_OTHER);
  stabi_idle_turn_destroy(&turn);
}
END_TEST

int main(void) {
  Suite *s = suite_create("priority");
  TCase *tc = tcase_create("priority");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_workers_follow_the_callers_policy);
  tcase_add_test(tc, test_raised_caller_raises_its_workers);
  tcase_add_test(tc, test_idle_turn);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
