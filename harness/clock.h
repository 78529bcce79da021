/* clock.h — the harness programs' stopwatch: elapsed seconds for progress lines, timings and
 * the traces' wall_time column. */
#ifndef STAB_HARNESS_CLOCK_H
#define STAB_HARNESS_CLOCK_H

/* Seconds since an arbitrary fixed point, on CLOCK_MONOTONIC: only differences mean anything,
 * and they do not jump when the system's time of day is set. */
double monotonic_seconds(void);

#endif
