/* stabmeter/monitor.h — the per-step monitor: a trainer creates it once, registers its layers
 * with it, then asks for every layer's metrics each step, with no allocation. Part of
 * <stabmeter.h>. */
#ifndef STABMETER_MONITOR_H
#define STABMETER_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* The per-step monitor                                                                */

typedef enum {
  STAB_UPDATE_NONE = 0,     /* only forward and dependency are measured */
  STAB_UPDATE_SNAPSHOT = 1, /* the monitor keeps a copy of every weight; the trainer calls
                               stab_monitor_snapshot() before its optimizer step */
  STAB_UPDATE_GIVEN = 2     /* the trainer hands dW (its update buffer) per step with
                               stab_monitor_set_update() */
} stab_update_mode;

typedef struct {
  stab_metrics_params metrics;
  stab_update_mode update_mode; /* default STAB_UPDATE_SNAPSHOT */
} stab_monitor_params;

stab_monitor_params stab_monitor_default_params(void);

typedef struct stab_monitor stab_monitor;

/* A monitor with no layers yet. params NULL means the defaults; they are copied. */
stab_status stab_monitor_create(const stab_monitor_params *params, stab_monitor **out);

/* NULL is a no-op. Does not touch the trainer's weights. */
void stab_monitor_free(stab_monitor *m);

/* Registers a layer; the weight pointers must stay valid (and are read at every
 * measurement) until the monitor is freed. Stored as F32, F16 or BF16 (.dtype; layer.h, "Stored
 * as F16 or BF16"): a 16-bit layer's metrics are the same bits as those of a monitor of the same
 * layer converted to f32. Allocates everything the layer will need: warm-start vectors, the
 * snapshot copy in SNAPSHOT mode (rows x ld elements in the layer's dtype, a byte copy: a block
 * of a fused matrix copies the rows it spans; a 16-bit layer's takes half an f32 copy's memory),
 * and grows the buffers of each thread a step measures layers on (one per thread, up to
 * metrics.spectral.threads): the spectral workspace and, for 16-bit layers, f32 rows and the
 * f32 copy of a block of at most 2^20 elements that its estimates convert once each.
 * index may be NULL. Names must be non-empty, valid UTF-8 (STAB_EINVAL) and unique (STAB_EEXIST). On failure the
 * monitor is as it was. */
stab_status stab_monitor_add_layer(stab_monitor *m, const stab_layer *layer, size_t *index);

size_t stab_monitor_layer_count(const stab_monitor *m);

/* The registered layer: the caller's descriptor with its name the monitor's copy and d_in,
 * d_out filled in for every kind (a table's in its kind's math: embedding V x d, lm_head
 * d x V, as the trace records them; vocab and width as given). NULL if index is out of range. */
const stab_layer *stab_monitor_layer(const stab_monitor *m, size_t index);

/* Index of a layer by name, or STAB_ENOTFOUND. */
stab_status stab_monitor_find(const stab_monitor *m, const char *name, size_t *index);

/* SNAPSHOT mode: copies every layer's current weights (call just before the optimizer
 * step). Allocates nothing. */
stab_status stab_monitor_snapshot(stab_monitor *m);

/* GIVEN mode: where this layer's update is (same shapes, layout, ld and dtype as its weights:
 * a 16-bit layer's update is 16-bit too, cast as its weights are; bias_update when the layer
 * has a bias, else NULL). The pointers are kept and read by every
 * later stab_monitor_measure(m, 1) until set again: a trainer whose update buffer stays put
 * sets them once. Attention layers have no update and need none. */
stab_status stab_monitor_set_update(stab_monitor *m, size_t index, const float *weight_update,
                                    const float *bias_update);

/* Measures every layer from the live weights, warm-starting each spectral estimate from
 * the previous measurement (the first is a cold start: see stab_spectral_norm for what that
 * changes for matrices with at most 32 rows). with_update: also the update metrics (SNAPSHOT: needs a snapshot
 * taken since the last measurement with update, which uses it up; GIVEN: every non-attention
 * layer's update set). Allocates nothing. A layer with
 * non-finite weights gets NaN metrics and a flag (and a message naming it); the others are
 * unaffected. The layers are measured on metrics.spectral.threads threads (0: the CPUs this
 * process may run on), one layer each, largest first; the metrics are the same bits as on one
 * thread. The calling thread takes part and returns when every layer is done. When layers
 * fail, the status and the calling thread's stab_last_error() are those of the first failing
 * layer in registration order. */
stab_status stab_monitor_measure(stab_monitor *m, int with_update);

/* ---- measuring while the training runs ----
 * A binding that measures on a thread of its own while the training goes on (stabmeter.torch's
 * Monitor(background=True, priority='idle')) saves only the CPU time the training leaves idle. These run that
 * measurement at idle priority (Linux's SCHED_IDLE) until the training waits for it. */

/* Whether this process may run a measurement at idle priority: a thread can enter SCHED_IDLE
 * and be raised back out of it (CAP_SYS_NICE, which root has unless a container drops it, or
 * RLIMIT_NICE >= 20; an unprivileged thread can enter it but never leave it). Found once per
 * process, on a thread of its own. why, when not NULL: a static string saying why, or why not.
 * 1 or 0. */
int stab_idle_priority_allowed(const char **why);

/* stab_monitor_measure(m, with_update) when measure, then stab_monitor_snapshot(m) when
 * snapshot (not after a failed measurement), on the calling thread at SCHED_IDLE where
 * stab_idle_priority_allowed() says so (else at its own priority), from the moment
 * stab_monitor_hurry(m, ticket) is called with this call's ticket at the priority the thread
 * had, which it has again when this returns. The pool's threads that measure layers with it
 * take its priority as it goes. ticket: a number that differs from the previous call's. The
 * metrics are the same bits as stab_monitor_measure's. Returns as those calls would. */
stab_status stab_monitor_measure_idle(stab_monitor *m, uint64_t ticket, int measure, int with_update, int snapshot);

/* From any thread: the measurement of ticket is waited for, so it runs at its thread's own
 * priority from now on; if it has not started yet, it never leaves it. NULL m: nothing. */
void stab_monitor_hurry(stab_monitor *m, uint64_t ticket);

/* stab_monitor_measure of some layers only: those i with which[i] nonzero (which: one byte per
 * registered layer; NULL measures all, as stab_monitor_measure). The others keep their last
 * metrics and warm-start vectors. The checks are those of stab_monitor_measure, over every
 * layer; with_update uses up the snapshot as it does. For processes that each measure a share
 * of one model held whole by all of them (stabmeter_mpi.h's stab_mpi_monitor_measure). */
stab_status stab_monitor_measure_some(stab_monitor *m, int with_update, const unsigned char *which);

/* The metrics of the last measurement of a layer; NULL if index is out of range. */
const stab_metrics *stab_monitor_metrics(const stab_monitor *m, size_t index);

/* Attention layers: the per-head logit bounds of the last measurement (heads values);
 * NULL for other kinds. */
const double *stab_monitor_head_bounds(const stab_monitor *m, size_t index);

/* Records metrics measured elsewhere (stab_layer_metrics on weights that are not kept in
 * memory, e.g. a checkpoint read tensor by tensor) as a layer's last measurement, for
 * stab_monitor_metrics and stab_trace_append. head_bounds: attention, heads values (NULL
 * sets them NaN); ignored for other kinds. Copies; allocates nothing. Errors: NULL monitor
 * or metrics STAB_EINVAL, index out of range STAB_ERANGE. */
stab_status stab_monitor_set_metrics(stab_monitor *m, size_t index, const stab_metrics *metrics,
                                     const double *head_bounds);

/* Registers a layer whose metrics come from elsewhere (stab_monitor_set_metrics): a layer split
 * across processes and measured by them together (stabmeter_mpi.h's stab_mpi_linear_measure),
 * recorded whole in this monitor's trace under its name, kind and whole shape. The descriptor
 * is checked as stab_monitor_add_layer checks it, except that no pointer is read, then or
 * later: weight (and an attention's weight_k) may be NULL, and a non-NULL bias only says that
 * the layer has one (the trace's parameter count and description). Addresses given are
 * compared, never read: a trace records layers whose ranges overlap as sharing storage (a
 * tied head, an attention inside its fused qkv), so a caller holding the whole model's
 * buffer somewhere can give pointers into it to get one process's trace. stab_monitor_snapshot,
 * stab_monitor_measure and stab_monitor_measure_some skip it (GIVEN mode needs no update for
 * it); its metrics are NaN until set. Allocates its name (and an attention's head bounds): no
 * warm vectors, snapshot or workspace. Errors as stab_monitor_add_layer's; on failure the
 * monitor is as it was. */
stab_status stab_monitor_add_external(stab_monitor *m, const stab_layer *layer, size_t *index);

/* A layer's reference: the forward, dependency and update stability of the first measurement
 * (stab_monitor_measure, _measure_some or stab_monitor_set_metrics) where each was finite and
 * > 0, each metric on its own (update is NaN at a step measured without one; a bias that starts
 * at 0 gets its reference at its first non-zero measurement). A metric not seen so yet is NaN;
 * the other fields are NaN (counts and flags 0). value / reference is the "ratio to init" the
 * trace records and an alarm judges: kinds and widths have natural scales of their own (an
 * attention logit bound near 20 at init, mlp.c_proj's sqrt(d_in/d_out) = 2), the ratio none.
 * Kept in the monitor's own memory (nothing is allocated per step); valid until the monitor is
 * freed. NULL if index is out of range. */
const stab_metrics *stab_monitor_reference(const stab_monitor *m, size_t index);

/* Sets a layer's reference (a resumed run: its trace's, stab_trace_reference, so that its ratios
 * are those of the run never stopped). Only forward, dependency and update are read; one that is
 * not finite and > 0 (NaN) is left to the next measurement to set, as at creation. Replaces the
 * reference whole. Copies; allocates nothing. Errors: NULL monitor or reference STAB_EINVAL,
 * index out of range STAB_ERANGE. */
stab_status stab_monitor_set_reference(stab_monitor *m, size_t index, const stab_metrics *reference);

/* Bytes the monitor has allocated (snapshots, warm vectors, workspaces). */
size_t stab_monitor_memory(const stab_monitor *m);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_MONITOR_H */
