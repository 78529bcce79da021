/* stabmeter/trace_read.h — reading a trace back: the one reader of stabmeter traces, for every
 * format_version (1 to 4), used by stabmeter-export and the Python package's read_trace. It
 * opens and checks the file, lists the steps, scalars, layers and each layer's metrics, and
 * reads any column over any range of rows. Part of <stabmeter.h>. */
#ifndef STABMETER_TRACE_READ_H
#define STABMETER_TRACE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Reading a trace (docs/manual/trace.md, "Reading a trace")                           */

/* What a reader shows of a trace, whatever its format_version (trace.h gives format 4's
 * layout; docs/manual/trace.md the older ones):
 *  rows        len(/step): every column has this many rows (a dataset may be longer while its
 *              writer runs: the rows past /step's are not shown)
 *  steps       /step, int64, the caller's step numbers, one per row
 *  wall_time   /wall_time, float64 seconds
 *  scalars     each /scalars dataset (loss, lr ...), float64, in name order (numbers in names
 *              compared as numbers: h.2 before h.10)
 *  layers      each layer, in name order likewise: its name (as the trace stores it, '/'
 *              already '.'), its kind (stab_kind_name), its attributes, and its metrics
 *  metrics     a layer's columns, float64: the writer's metrics in its order (forward,
 *              dependency, update, forward_tight ... update_ratio, those the file has), then
 *              the others in name order: the layer extras (act_rms ...) and, for attention, one
 *              head<h>_bound per head (format 4's /layers/head_bound column of that head)
 * A value the writer did not have is NaN, as in the file.
 * A trace whose writer is running (it holds the trace's lock) or was killed is read as it
 * stands, through HDF5's SWMR reading: its flushed rows. What HDF5 checksums (the metadata) is
 * verified on the way; the values carry no checksum. */

typedef struct stab_trace_reader stab_trace_reader;

/* What to read: a subset of the layers and of the columns. A pattern or a name that selects
 * nothing is an error (a typo), naming it. */
typedef struct {
  const char *const *layer_globs; /* only layers whose name matches any of these shell patterns
                                     (fnmatch, e.g. "h.*.attn"), n_layer_globs of them; 0: every
                                     layer. Run-level values (steps, scalars) are kept */
  size_t n_layer_globs;
  const char *const *metrics;     /* only these columns by name, n_metrics of them: layer
                                     metrics, scalars and "wall_time" alike; NULL: every column.
                                     A layer left with no column is left out */
  size_t n_metrics;
} stab_trace_read_params;

/* Every layer, every column. */
stab_trace_read_params stab_trace_read_default_params(void);

/* Opens the trace at path, checks it against the schema (the format attributes, /step,
 * /wall_time, /scalars, /layers, each layer's kind and its forward, dependency and update,
 * every column's type and length) and opens the columns params selects (NULL: the defaults;
 * they are copied). The file stays open (a descriptor and HDF5's handle) until
 * stab_trace_read_close; the rows are read on demand, so memory does not grow with them.
 * Only a regular file is opened (stab_input_open): a FIFO or a device is refused without
 * blocking.
 * Errors: NULL path or out, NULL globs or metrics with a count STAB_EINVAL; a path that is
 * missing or not a regular file STAB_EIO (stab_input_open's message); a file that is not HDF5,
 * not a stabmeter trace, of a format_version other than 1 to 4, that breaks the schema or
 * that HDF5 cannot read (damaged), or a pattern or name that selects nothing, STAB_EFORMAT;
 * STAB_ENOMEM ("out of memory"). Every message but the last starts with the path and names the
 * object at fault ("t.h5: /layers/fc has no attribute 'kind'"). On failure *out is NULL.
 * Thread safety: one thread at a time per reader; readers and traces being written (their writer
 * threads included) may be used from different threads at once: the library makes its HDF5
 * calls one at a time, the reader's and the writer's alike (HDF5 need not be built thread-safe;
 * a program whose own threads call HDF5 meanwhile must be built against a thread-safe HDF5).
 * HDF5's own printing of errors is off during each call and restored after it. */
stab_status stab_trace_read_open(const char *path, const stab_trace_read_params *params,
                                 stab_trace_reader **out);

/* Closes the file and frees r. NULL is a no-op. */
void stab_trace_read_close(stab_trace_reader *r);

/* The trace's format_version: 1, 2 (each group holds a copy of /step), 3 (ratios) or 4 (one
 * (step, layer) dataset per metric); 0 for NULL. */
int stab_trace_read_format_version(const stab_trace_reader *r);

/* The rows, len(/step) at the open; 0 for NULL. */
int64_t stab_trace_read_rows(const stab_trace_reader *r);

/* 1 when the trace's writer was running at the open (it held the trace's lock), else 0. */
int stab_trace_read_live(const stab_trace_reader *r);

/* 1 when path names the very file the reader holds open (the same device and inode: through a
 * symbolic or hard link too), else 0: a program that writes what it read refuses to write
 * over the trace itself. */
int stab_trace_read_is_file(const stab_trace_reader *r, const char *path);

/* The root attribute run_config (JSON text, "{}" when the trace has none) into *json, owned by
 * r (valid until close). Read at the first call. Errors: NULL argument STAB_EINVAL; the
 * attribute unreadable or not a string STAB_EFORMAT naming it; STAB_ENOMEM. */
stab_status stab_trace_read_run_config(stab_trace_reader *r, const char **json);

/* 1 when /wall_time is among the selected columns (params.metrics NULL, or naming it). */
int stab_trace_read_has_wall_time(const stab_trace_reader *r);

/* The selected scalars: their count, and the name of scalar index (NULL when out of range). */
size_t stab_trace_read_scalar_count(const stab_trace_reader *r);
const char *stab_trace_read_scalar_name(const stab_trace_reader *r, size_t index);

/* The selected layers: their count, and layer index's name and kind (NULL when out of range).
 * The strings are owned by r. */
size_t stab_trace_read_layer_count(const stab_trace_reader *r);
const char *stab_trace_read_layer_name(const stab_trace_reader *r, size_t layer);
const char *stab_trace_read_layer_kind(const stab_trace_reader *r, size_t layer);

/* Layer layer's selected metric columns: their count (0 when out of range), and the name of
 * column metric (NULL when out of range), in the order given above. */
size_t stab_trace_read_metric_count(const stab_trace_reader *r, size_t layer);
const char *stab_trace_read_metric_name(const stab_trace_reader *r, size_t layer, size_t metric);

/* One attribute of a layer: what the monitor knew of it when the trace was written. */
typedef struct {
  const char *name; /* "kind", "layout", "description", "shares_storage_with", "d_in", "d_out",
                       "param_count", "param_count_unique" (format 4 and 3; older traces have
                       fewer), "name" (format 1 to 3: the layer's name as registered, '/' kept) */
  const char *text; /* a string attribute's value (UTF-8 as written); NULL for an integer one */
  int64_t value;    /* an integer attribute's value; 0 for a string one */
} stab_trace_attr;

/* Layer layer's attributes into *attrs (n of them, in name order; owned by r, valid until
 * close): format 4's string and integer datasets along the layer dimension of /layers, a
 * format 1 to 3 layer group's string and integer attributes. Read at the first call for any
 * layer. Errors: NULL argument STAB_EINVAL; layer out of range STAB_ERANGE; one unreadable
 * STAB_EFORMAT naming it; STAB_ENOMEM. */
stab_status stab_trace_read_layer_attrs(stab_trace_reader *r, size_t layer,
                                        const stab_trace_attr **attrs, size_t *n);

/* Rows [first, first + count) of a column into out (count values; count 0 reads nothing):
 * the steps (int64), wall_time, scalar index, or layer layer's metric column (float64).
 * Errors: NULL r or out (with count > 0) STAB_EINVAL; a scalar, layer or metric out of range,
 * no wall_time selected, or rows past stab_trace_read_rows STAB_ERANGE; a read that fails
 * (a damaged file) STAB_EIO naming the dataset ("t.h5: cannot read rows of /layers/fc/forward:
 * ..."). out is unspecified after a failure. */
stab_status stab_trace_read_steps(stab_trace_reader *r, int64_t first, size_t count, int64_t *out);
stab_status stab_trace_read_wall_time(stab_trace_reader *r, int64_t first, size_t count, double *out);
stab_status stab_trace_read_scalar(stab_trace_reader *r, size_t index, int64_t first, size_t count,
                                   double *out);
stab_status stab_trace_read_metric(stab_trace_reader *r, size_t layer, size_t metric, int64_t first,
                                   size_t count, double *out);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_TRACE_READ_H */
