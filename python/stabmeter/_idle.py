"""Monitor(background=True)'s measurement at idle priority: while the training runs, the
measuring thread takes only the CPU time the training leaves (Linux's SCHED_IDLE), so that a
step is not slowed by a measurement running beside it; once the training waits for the
measurement (the monitor's next call), the thread is raised back to the priority it had, so
that the wait is never longer than a normal-priority measurement would make it. The library's
pool workers take the measuring thread's priority as they go (lib/engine/pass_pool.c).

Only where the process may raise a thread back: root, CAP_SYS_NICE, or RLIMIT_NICE >= 20 (an
unprivileged thread can enter SCHED_IDLE but never leave it, and a measurement left idle on a
busy machine could keep the training waiting for seconds). Elsewhere, and off Linux, the
measurement runs at normal priority, as before; idle_priority() says which and why."""

import os
import threading

_probe = None  # (allowed, reason), once per process


def _try(result):
    """On a throwaway thread: into SCHED_IDLE and back out."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as e:
        result.append((False, "SCHED_IDLE refused (%s)" % e.strerror))
        return
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as e:
        result.append((False, "a thread cannot be raised back from SCHED_IDLE here (%s: it needs root, "
                              "CAP_SYS_NICE or RLIMIT_NICE >= 20)" % e.strerror))
        return
    result.append((True, "SCHED_IDLE while the training runs, raised back when it waits"))


def idle_priority():
    """(allowed, reason): whether background measurements run at idle priority in this process."""
    global _probe
    if _probe is None:
        if not hasattr(os, "SCHED_IDLE") or not hasattr(os, "sched_setscheduler"):
            _probe = (False, "no SCHED_IDLE on this system")
        else:
            result = []
            t = threading.Thread(target=_try, args=(result,), name="stabmeter-idle-probe")
            t.start()
            t.join()
            _probe = result[0] if result else (False, "the probe thread failed")
    return _probe


class IdleTurn:
    """One background measurement's priority: lowered by the measuring thread as it starts
    (enter), restored by it as it ends (leave), or by the waiting thread as soon as it waits
    (hurry), whichever comes first. The lock orders them: a hurry before enter keeps the thread
    at its priority, and a raise is never lost to a lowering that comes after it."""

    def __init__(self, allowed):
        self._allowed = allowed
        self._lock = threading.Lock()
        self._hurried = False
        self._tid = None
        self._saved = None  # (policy, param) the thread had before it was lowered
        self.policy_seen = None  # the thread's policy while it measured (tests read it)

    def enter(self):
        with self._lock:
            self._tid = threading.get_native_id()
            if self._allowed and not self._hurried:
                saved = (os.sched_getscheduler(0), os.sched_getparam(0))
                try:
                    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                    self._saved = saved
                except OSError:
                    pass  # measured at the priority it has
            self.policy_seen = os.sched_getscheduler(0)

    def _restore(self, tid):
        saved, self._saved = self._saved, None
        if saved is not None:
            try:
                os.sched_setscheduler(tid, saved[0], saved[1])
            except OSError:
                pass  # the probe raised a thread back in this process: only a changed limit gets here

    def leave(self):
        with self._lock:
            self._restore(0)

    def hurry(self):
        """The training waits: the measuring thread back to its priority, if it was lowered."""
        with self._lock:
            self._hurried = True
            if self._saved is not None:
                self._restore(self._tid)
