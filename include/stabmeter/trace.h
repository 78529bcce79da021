/* stabmeter/trace.h — the trace: every step a monitor measured, appended to an HDF5 file (the
 * file's layout, the one-writer protocol, flushing and what a crash loses are described below).
 * Part of <stabmeter.h>. */
#ifndef STABMETER_TRACE_H
#define STABMETER_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"
#include "monitor.h"
#include "files.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* The trace: every measured step of a monitor, in an HDF5 file (docs/manual/metrics.md)       */

/* The file (format_version 4). Every dataset indexed by step is float64 unless said, chunked
 * and extendable along the steps, row i of each belonging to /step[i]; a value that does not
 * exist is NaN. Its objects do not grow with the layers: a layer is a column, not a group.
 *   /                   attrs format = "stabmeter-trace", format_version = 4 (int), library_version,
 *                       created_utc ("YYYY-MM-DDTHH:MM:SSZ"), run_config (JSON text, "{}" if none)
 *   /step               int64 [step], the caller's step numbers
 *   /wall_time          [step] seconds since the run began, as the caller gives them
 *   /scalars/<name>     [step] one per declared scalar (loss, learning rate ...); step: /step again
 *   /layers/            the layers, in the monitor's order along the layer dimension:
 *     step              int64 [step], a copy of /step (below)
 *     layer             string [layer], each layer's name, '/' replaced by '.' (unique)
 *     kind              string [layer], stab_kind_name
 *     layout            string [layer]: "out_major" or "in_major" (the stored matrix of linear and
 *                       attention, and of an embedding or lm_head whose vectors are columns),
 *                       "rows" (one token's or class's vector per row, and gain and bias)
 *     description       string [layer], its kind and stored shape in words ("linear layer y = x W,
 *                       d_in 768 -> d_out 3072, stored out-major [d_out][d_in]; no bias")
 *     shares_storage_with  string [layer], the other layers holding some of its floats, separated
 *                       by spaces ("" if none); found from the address ranges of each layer's
 *                       weight, weight_k and bias, row by row where rows are strided (ld)
 *     d_in d_out        int64 [layer], as stab_monitor_layer gives them (a table's in its kind's math)
 *     param_count       int64 [layer]
 *     param_count_unique  int64 [layer]: its floats that no layer registered before it holds, so
 *                       that the sum counts each float once (a tied table counts for the first of
 *                       embedding and lm_head registered; q and k inside a fused qkv linear for
 *                       whichever came first)
 *     forward dependency update forward_tight dependency_tight update_tight spread sigma
 *     sigma_rel_err sigma_update sigma_update_rel_err rel_update passes update_passes flags
 *                       [step, layer] the stab_metrics fields (counts and flags as exact float64)
 *     forward_ratio dependency_ratio update_ratio
 *                       [step, layer] the metric over the layer's reference: its first finite
 *                       value > 0 in the run, each metric on its own (stab_trace_reference;
 *                       stab_monitor_reference); NaN where the value or the reference is NaN
 *                       (before the first measurement with an update, update_ratio). No
 *                       dataset says the reference's step: it is the first row where the
 *                       metric is finite and > 0, the ratio 1 there (unless the monitor had
 *                       measured before the trace was opened)
 *     <extra>           [step, layer] one per declared layer extra (activation RMS ...)
 *     head_bound        [step, head], only when a layer is attention: the logit bound of each
 *                       head of every attention layer, the heads of one layer side by side in
 *                       the layers' order
 *     head              int64 [head], the head's number h = 0 .. heads-1 in its layer
 *     head_layer        string [head], its layer's name (as in layer)
 * Chunks: 256 rows of the one-dimensional datasets; of a [step, layer] one at most 1024 layers
 * wide and 8192 values (rows = 8192 / width, a power of two from 1 to 256), so that a flush
 * rewrites a bounded amount per layer whatever the layer count.
 * netCDF view. /step is an HDF5 dimension scale named "step" (hdf5_hl H5DS) attached to
 * /wall_time; /scalars and /layers hold their own copy of it, "step", the scale of their
 * datasets' first dimension; /layers/layer is the scale "layer" of the layer dimension,
 * /layers/head the scale "head". So a group opened alone (xarray: open_dataset(path,
 * group="layers"), engine "h5netcdf" or "netcdf4"; ncdump) has step and layer as coordinates,
 * each metric a variable (step, layer). A program listing a group's series skips "step" and
 * the datasets without a step dimension. Every dataset has the string attribute long_name (the
 * definition in words) and those of numbers units (CF: "1" dimensionless; "nats" for the loss;
 * "s" for wall_time); a metric whose units or words differ between the kinds present (forward
 * is in nats for an lm_head) has units_<kind> and long_name_<kind> for each kind present
 * instead of units, and a long_name common to all. A scalar or extra whose name the library
 * does not know (it knows loss, lr, grad_norm, act_rms, act_cos1) gets its name as long_name
 * and no units. Names of scalars and extras may not be "step", a metric's, a ratio's or one of
 * the datasets above.
 * Older formats. Version 1 (a group per layer of one-dimensional datasets), 2 (netCDF scales,
 * units, descriptions) and 3 (ratios) are read by every reader as before. Appending to one
 * (stab_trace_open with append) rewrites it in this format first: the new file is built in
 * memory with every row of the old one (the ratios of a version 1 or 2 trace filled from its
 * rows), written beside it under a temporary name and renamed over it while the old file's
 * lock is held, so that a writer killed during it leaves the old trace as it was. This reads
 * the whole old trace once, in time and memory that grow with its rows and layers.
 * Strings are variable-length UTF-8. The number of rows is the length of /step: every flush
 * writes the other datasets first and /step after, so a writer killed (or failing) in the
 * middle of one may leave other datasets longer than /step, never shorter. A reader takes
 * len(/step) rows; the next open with append cuts the others back. Steps strictly increase
 * along /step (stab_trace_append refuses any other). A new trace is built under a temporary
 * name beside it ("<path>.<pid>.tmp") and published at path once complete, so a writer killed
 * inside stab_trace_open leaves no half-made trace at path (only that temporary file).
 *
 * Readers. While the writer runs the file is in SWMR mode (HDF5 >= 1.10): open it with
 * H5F_ACC_RDONLY | H5F_ACC_SWMR_READ (h5py: h5py.File(path, "r", swmr=True)) and refresh the
 * datasets to follow it. After the writer is killed (kill -9, power loss with the data on
 * disk) the file keeps every step flushed before, and the same SWMR-read open reads it as is,
 * with nothing to repair. A plain (non-SWMR) open of a file whose writer did not close it
 * fails in HDF5 1.10 with "file is already open for write" (h5dump, h5ls, ncdump, xarray's
 * open_dataset with either engine); `h5clear -s FILE` clears that mark (never while the
 * writer runs), and stab_trace_open with append clears it itself. xarray follows a running
 * trace through h5netcdf in SWMR mode: xr.open_dataset(xr.backends.H5NetCDFStore(
 * h5netcdf.File(path, "r", swmr=True), group="layers")); netCDF-C has no SWMR read.
 *
 * One writer at a time. An open trace holds a lock (fcntl, open-file-description, whole file)
 * on its file until closed or its writer dies, and every stab_trace_open keeps one protocol
 * (lib/trace/lock.c has it in full, with every interleaving of two writers): a new trace is
 * published only where nothing is (renameat2 RENAME_NOREPLACE, or link), a finished trace is
 * replaced only by a writer holding its lock, and a trace is appended to only after its lock is
 * taken, each time checking that the path still names the file locked. So of two writers
 * started together on one path (creating, replacing or appending) exactly one opens it; the
 * other gets STAB_EBUSY naming the path, and no file another writer holds is ever replaced.
 * Replacing a trace needs write permission on it (to lock it).
 *
 * A full disk. HDF5 1.10.8 does not recover from a write of its own that fails (its close
 * fails too, and at exit it prints "infinite loop closing library" or crashes in
 * H5F__close_cb), so it is never given a full disk: a new trace is built in memory and written
 * by this library, and before each flush the most it can add (when the rows start new chunks,
 * per dataset the new chunks' bytes plus 8 bytes per chunk it holds, at most 9 KiB of index
 * per 1024 new chunks; plus 256 KiB, which is all a flush within the chunks needs) is allocated beyond the file's end
 * (fallocate, FALLOC_FL_KEEP_SIZE; given back at close). When that fails the trace fails
 * (STAB_EIO, "no room on the disk"), before HDF5 writes, and closes cleanly with every row
 * flushed before. A trace can thus stop while a few MB are still free.
 *
 * Flushing. Rows are staged in memory and written at a flush, one hyperslab per dataset; a
 * flush writes every dataset's header, index and last chunks, and costs about as much for a
 * chunk's rows as for one. An append flushes
 * when flush_seconds (default 1) have passed since the last flush, when the stage holds 256
 * rows, or every flush_every appends if that is set; stab_trace_flush and close write
 * everything and return once it is in the file.
 * By default (flush_every 0) a flush hands the staged rows to the trace's writer thread and
 * returns: an append costs a copy of the row (a value per layer and metric), and the flushes,
 * one a second, run beside the caller. At most one
 * batch is in flight: a flush first waits for the one before. A failure of the writer (a full
 * disk) is returned by the next append, flush or close, naming the path; its rows and those
 * staged are dropped, every row flushed before stays. With flush_every >= 1 there is no
 * thread: the caller's thread writes, and an append that flushes costs the whole flush.
 * What a kill -9 (or a crash) loses: the rows appended after the last completed flush, which
 * span at most flush_seconds of appends plus the one batch being written: with the defaults,
 * about the last second of steps. The library has no timer: rows staged before a long pause
 * (evaluation, a checkpoint) stay in memory until the next append, stab_trace_flush or close;
 * call stab_trace_flush before one.
 * The writer thread and HDF5: Debian's HDF5 is built without thread safety, so the library
 * makes its own HDF5 calls one at a time (one lock for every trace of the process); a program
 * whose other threads call HDF5 themselves while a trace is open uses flush_every >= 1. After
 * fork() the child must not use a trace its parent opened.
 * Cost. Opening, appending and closing cost time linear in the layers: the file has the same
 * objects whatever the layer count (about 35 datasets), a flush writes each [step, layer]
 * dataset's new rows in one hyperslab, and an append copies one value per layer and metric
 * into the stage (docs/manual/trace.md gives the figures, bench/trace_layers.sh measures them). */

typedef struct stab_trace stab_trace;

/* What the trace does after a write failure (disk full, file removed, permissions). Either way
 * the failing call returns the error (with the writer thread, the next append, flush or close
 * after the failure), the rows staged but not yet written are dropped, and every row flushed
 * before stays in the file. A full disk (or quota) is caught before HDF5 writes (see
 * "A full disk" above) and leaves nothing behind. What is still true: a write that fails inside
 * HDF5 for another reason (an I/O error, a file system without fallocate that fills up) leaves
 * HDF5 holding data it could not write, closing fails too, and HDF5 1.10.8 then misbehaves when
 * the process exits ("infinite loop closing library", or a crash in H5F__close_cb; a plain
 * HDF5 program does the same). A trainer that must survive that can leave with _exit. */
typedef enum {
  STAB_TRACE_STOP = 0,    /* every later append returns the same error (default) */
  STAB_TRACE_CONTINUE = 1 /* the trace is disabled: later appends return STAB_OK and do nothing;
                             stab_trace_failed() says it happened */
} stab_trace_on_error;

typedef struct {
  int flush_every;        /* 0: a writer thread writes the rows in the background, when
                             flush_seconds have passed or 256 rows are staged (see "Flushing");
                             >= 1: the caller's thread writes and flushes them every this many
                             appends (above 256, every 256), or sooner by flush_seconds. A row is
                             in the file, safe from a crash and seen by readers, once flushed.
                             Staging takes min(flush_every, 256) x values a row x 8 bytes (a
                             row: about 20 values a layer; with 0, twice 256 x values x 8:
                             2 MB for 49 layers). Default 0 */
  double flush_seconds;   /* seconds: an append at least this long after the last flush (or the
                             open) flushes every staged row, itself included; 0: no time limit.
                             So a kill -9 loses about the rows of the last flush_seconds of
                             appends (see "Flushing" above: rows wait for an append,
                             stab_trace_flush or close), and flushes come at most one per
                             flush_seconds whatever the step rate. 0 .. 86400. Default 1.0 */
  const char *run_config; /* JSON text stored as the root attribute run_config, or NULL ("{}");
                             copied. Not changed when appending */
  const char *const *scalars; /* names of the /scalars datasets, n_scalars of them, copied. They
                             are declared here because SWMR forbids creating datasets later */
  size_t n_scalars;
  const char *const *layer_extras; /* names of extra per-layer datasets (e.g. "act_rms",
                             "act_cos1"), n_layer_extras of them, copied */
  size_t n_layer_extras;
  stab_trace_on_error on_error; /* default STAB_TRACE_STOP */
  int append;             /* what happens to a file already at path (stab_output_mode):
                             0 (STAB_OUTPUT_REPLACE): create the file, replacing any file there
                             once it is complete (default, as before the modes were named).
                             1 (STAB_OUTPUT_APPEND): resume an existing trace (created if
                             missing), adding rows after its last; it is refused if its layers
                             (names in the monitor's order, kinds, d_in, d_out, heads), scalars or
                             layer extras differ from these. A trace of format 1 to 3 is
                             rewritten as format 4 first (see "Older formats").
                             2 (STAB_OUTPUT_NEW): create the file; anything already at path is
                             refused (STAB_EEXIST) and left as it is, also when another writer
                             publishes a trace there while this one builds its own. Other values
                             STAB_EINVAL */
  int64_t resume_step;    /* with append: when > 0, the rows whose step is greater than this are
                             removed first, so a run resumed from an earlier checkpoint replaces
                             the steps it redoes instead of repeating them; 0 keeps every row
                             (default). Ignored without append */
} stab_trace_params;

/* The defaults above (no scalars, no extras, run_config NULL). */
stab_trace_params stab_trace_default_params(void);

/* Creates the trace file at path (or, with append, opens it) for the layers of m, writes
 * everything but the rows, and starts SWMR writing. m is read here (its layers) and at each
 * append (its metrics); its layers must not change while the trace is open. params NULL
 * means the defaults. Allocates every buffer appends need. Names (scalars, extras) must be
 * non-empty, without '/', unique, and extras must not be a metric's name.
 * Not thread-safe: one thread at a time per trace (the library makes its own HDF5 calls one at a time, since HDF5 need not be built thread-safe;
 * the writer thread of flush_every 0 is the library's own, see "Flushing").
 * Errors: NULL argument, bad name, flush_every < 0, flush_seconds outside 0 .. 86400 (or NaN),
 * unknown on_error or append STAB_EINVAL; with append STAB_OUTPUT_NEW, anything at path
 * STAB_EEXIST naming it (stab_output_check; the file is not opened); two layers
 * that map to one group ("a/b" and "a.b") STAB_EEXIST; an existing trace that does not match
 * (the message names the first difference, e.g. the layer), or a file at path that is not a
 * stabmeter trace at all (not HDF5: refused before anything is written to it), STAB_EINVAL; another writer holds
 * the trace, or kept replacing it while this one opened it, STAB_EBUSY naming the path; any
 * HDF5 or system failure (no room on the disk included) STAB_EIO with the path and what failed
 * in words; STAB_ENOMEM. On failure *out is NULL and nothing is left open; a new trace's
 * temporary file is removed and the file at path is untouched (with append, a trace whose
 * writer was killed keeps the cleared mark and cut-back rows). */
stab_status stab_trace_open(const char *path, const stab_monitor *m,
                            const stab_trace_params *params, stab_trace **out);

/* Appends one row: step, wall_time (seconds), the scalars and every layer's last metrics
 * (stab_monitor_metrics, and stab_monitor_head_bounds for attention) of the monitor given to
 * open, as they are now, with forward, dependency and update over the reference
 * stab_trace_reference gives. The row is staged; the staged rows are written and flushed when
 * flush_seconds have passed since the last flush, when the stage is full or every flush_every
 * appends (see "Flushing"). Allocates nothing itself.
 *  scalars       n_scalars values in declaration order, or NULL (all NaN)
 *  layer_extras  n_layers x n_layer_extras values, one row per layer in monitor order, or NULL
 * step must be greater than the last row's (the last appended, or the trace's last when opened
 * with append): else STAB_ERANGE naming both steps, the row is not added, and the trace goes on
 * as before (not a write failure).
 * Errors: t NULL STAB_EINVAL; step not increasing STAB_ERANGE; a write failure STAB_EIO naming
 * the path: from the append whose flush failed, or with the writer thread from the first call
 * after the failed write (then see stab_trace_on_error). */
stab_status stab_trace_append(stab_trace *t, int64_t step, double wall_time, const double *scalars,
                              const double *layer_extras);

/* What layer index's ratios (forward_ratio, dependency_ratio, update_ratio) divide by, into out:
 * per metric, the first finite value > 0 among the rows the trace held when opened with append
 * (after the rows a resume removed), else the monitor's stab_monitor_reference. Only forward,
 * dependency and update are set (NaN: none yet); the other fields NaN. A resumed run hands it to
 * stab_monitor_set_reference right after the open, so that its monitor (alarms) divides by the
 * run's first measurement, as the trace does. Errors: NULL t or out STAB_EINVAL, index not a
 * layer of the monitor STAB_ERANGE. */
stab_status stab_trace_reference(const stab_trace *t, size_t index, stab_metrics *out);

/* Writes every row appended so far to the file now (readers and a crash see them), and
 * returns once they are there (it waits for the writer thread). A disabled trace (CONTINUE
 * after a failure) returns STAB_OK; a failure of the writer not yet returned is returned. */
stab_status stab_trace_flush(stab_trace *t);

/* Rows in the trace, the rows it held when opened and the rows staged included; after a
 * failure, the rows flushed before it. 0 for NULL. */
int64_t stab_trace_steps(const stab_trace *t);

/* The step of the last row: the last appended, else the trace's last when opened (after the
 * rows a resume removed); a row dropped by a write failure still counts (later appends must
 * come after it). STAB_ENOTFOUND (last error untouched) when the trace has no row; t or step
 * NULL STAB_EINVAL. */
stab_status stab_trace_last_step(const stab_trace *t, int64_t *step);

/* 1 once a call has returned a write failure (either on_error; with the writer thread, the call
 * after the failure), else 0; 0 for NULL. */
int stab_trace_failed(const stab_trace *t);

/* Writes the staged rows, ends the writer thread, closes the file (which flushes it) and frees
 * t. NULL is a no-op returning STAB_OK. Returns STAB_EIO if the last writes (or a background
 * write no call has returned yet) or the close failed; t is freed all the same.
 * fork(): a trace belongs to the process that opened it. In a child forked from that process
 * stab_trace_append and stab_trace_flush return STAB_ESTATE ("the trace belongs to process
 * N"), and stab_trace_close frees the child's copy of t only (no HDF5 call, no writer thread
 * joined, the lock left to the parent), returning STAB_OK; the child's copies of HDF5's
 * descriptors of open traces point at /dev/null from the fork on, so that nothing the child
 * does, its exit included, writes to the parent's file. */
stab_status stab_trace_close(stab_trace *t);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_TRACE_H */
