/* priority.c — threads' scheduling priority: reading and setting a thread's policy and nice
 * value (the pool's workers take their caller's, pass_pool.c), whether this process may run
 * work at idle priority, and the idle turn of a background measurement
 * (stab_monitor_measure_idle).
 *
 * Why idle priority, and why here in C: a binding that measures on a thread of its own while
 * the training runs (stabmeter.torch's Monitor(background=True, priority='idle')) saves only the CPU time the
 * training leaves idle; at normal priority the measurement shares the cores with the training
 * and lands in its step. At SCHED_IDLE it takes only idle time, and once the training waits for
 * it (stab_monitor_hurry) it must run at full priority at once. The switch is made inside the
 * library's call, not by the binding around it: a Python thread at SCHED_IDLE that returns from
 * a call must take the GIL, and CPython's main thread, asked for the GIL, gives it up and waits
 * until that thread has taken it, so on cores other programs kept busy the training stalled on
 * a starved thread (bench: the step 1.5x a synchronous monitor's, beside two spinning shells).
 *
 * Only where the process may raise a thread back: an unprivileged thread can enter SCHED_IDLE
 * but never leave it (Linux asks for CAP_SYS_NICE or RLIMIT_NICE >= 20), and a measurement left
 * at idle priority on a busy machine could keep the training waiting for seconds. */
#define _GNU_SOURCE /* SCHED_IDLE */
#include "engine/engine.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

pid_t stabi_thread_id(void) { return (pid_t)syscall(SYS_gettid); }

int stabi_sched_read(pid_t tid, stabi_sched *s) {
  struct sched_param sp;
  s->policy = sched_getscheduler(tid);
  if (s->policy < 0 || sched_getparam(tid, &sp) != 0) return 0;
  s->priority = sp.sched_priority;
  errno = 0;
  s->nice = getpriority(PRIO_PROCESS, (id_t)tid); /* Linux: the nice of that one thread */
  return !(s->nice == -1 && errno != 0);
}

int stabi_sched_below_normal(const stabi_sched *s) {
#ifdef SCHED_IDLE
  if (s->policy == SCHED_IDLE) return 1;
#endif
  return (s->policy == SCHED_OTHER || s->policy == SCHED_BATCH) && s->nice > 0;
}

int stabi_sched_same(const stabi_sched *a, const stabi_sched *b) {
  return a->policy == b->policy && a->priority == b->priority && a->nice == b->nice;
}

int stabi_sched_set(pid_t tid, const stabi_sched *from, const stabi_sched *to) {
  const struct sched_param sp = {.sched_priority = to->priority};
  /* the nice value first when lowering, last when raising (SCHED_IDLE ignores it) */
  if (to->nice > from->nice && setpriority(PRIO_PROCESS, (id_t)tid, to->nice) != 0) return 0;
  if ((to->policy != from->policy || to->priority != from->priority) && sched_setscheduler(tid, to->policy, &sp) != 0)
    return 0;
  if (to->nice < from->nice && setpriority(PRIO_PROCESS, (id_t)tid, to->nice) != 0) return 0;
  return 1;
}

/* ---- may this process work at idle priority ---- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int idle_allowed;
static const char *idle_why = "not probed";

static void *probe_thread(void *unused) {
  (void)unused;
#ifdef SCHED_IDLE
  stabi_sched was, idle;
  if (!stabi_sched_read(0, &was)) {
    idle_why = "a thread's scheduling cannot be read here";
    return NULL;
  }
  idle = was;
  idle.policy = SCHED_IDLE;
  idle.priority = 0;
  if (!stabi_sched_set(0, &was, &idle)) {
    idle_why = "SCHED_IDLE is refused here";
    return NULL;
  }
  if (!stabi_sched_set(0, &idle, &was)) {
    idle_why = "a thread cannot be raised back from SCHED_IDLE here (that needs CAP_SYS_NICE, which root "
               "has unless a container drops it, or RLIMIT_NICE >= 20)";
    return NULL;
  }
  idle_allowed = 1;
  idle_why = "SCHED_IDLE while the training runs, raised back when it waits";
#else
  idle_why = "no SCHED_IDLE on this system";
#endif
  return NULL;
}

/* On a thread of its own, which it may leave at SCHED_IDLE for good. */
static void probe(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, probe_thread, NULL) != 0) {
    idle_why = "no thread could be created to find out";
    return;
  }
  pthread_join(t, NULL);
}

int stab_idle_priority_allowed(const char **why) {
  pthread_once(&probe_once, probe);
  if (why) *why = idle_why;
  return idle_allowed;
}

/* ---- the idle turn of one background measurement at a time ---- */

void stabi_idle_turn_init(stabi_idle_turn *t) {
  memset(t, 0, sizeof *t); /* no ticket entered, none hurried, nothing lowered */
  pthread_mutex_init(&t->lock, NULL);
}

void stabi_idle_turn_destroy(stabi_idle_turn *t) { pthread_mutex_destroy(&t->lock); }

void stabi_idle_enter(stabi_idle_turn *t, uint64_t ticket) {
  if (!stab_idle_priority_allowed(NULL)) return;
  pthread_mutex_lock(&t->lock);
  t->tid = stabi_thread_id();
  t->ticket = ticket;
  if (!(t->hurried && t->hurried_ticket == ticket) && stabi_sched_read(t->tid, &t->saved)) {
    stabi_sched idle = t->saved;
#ifdef SCHED_IDLE
    idle.policy = SCHED_IDLE;
#endif
    idle.priority = 0;
    t->lowered = stabi_sched_set(t->tid, &t->saved, &idle);
    if (t->lowered) t->low = idle;
  }
  pthread_mutex_unlock(&t->lock);
}

/* Under the lock: the thread back to what it had, if it was lowered. */
static void restore(stabi_idle_turn *t) {
  if (!t->lowered) return;
  t->lowered = 0;
  (void)stabi_sched_set(t->tid, &t->low, &t->saved); /* allowed: the probe raised a thread back */
}

void stabi_idle_leave(stabi_idle_turn *t) {
  pthread_mutex_lock(&t->lock);
  restore(t);
  pthread_mutex_unlock(&t->lock);
}

void stabi_idle_hurry(stabi_idle_turn *t, uint64_t ticket) {
  pthread_mutex_lock(&t->lock);
  t->hurried = 1;
  t->hurried_ticket = ticket;
  if (t->ticket == ticket) restore(t);
  pthread_mutex_unlock(&t->lock);
}
