/* trace_internal.h — what the files of the HDF5 trace writer (lib/trace/) share: the layout's
 * constants, the handle (struct stab_trace) and its datasets, and the functions one file calls
 * in another. Never installed. Each file calls only files listed before it; trace.c, the handle
 * and the public calls (stab_trace_*), calls down into them and none calls it:
 *   schema.c     the datasets' names, their words (units, long names) and chunks
 *   hdf5_util.c  calling HDF5: one thread at a time, its errors in our words, attributes
 *   lock.c       one writer per trace: the lock, and the protocol that publishes a new file
 *   reserve.c    disk space for the next flush, reserved before HDF5 needs it
 *   create.c     a new file's datasets, dimension scales and words
 *   open.c       a file on disk opened, checked against the monitor and read back
 *   migrate.c    a trace of format 1 to 3 rewritten as format 4
 *   image.c      a new file built in memory, written whole (superblock repaired), published
 *   writer.c     staged rows written to the file, by the caller or by the writer thread
 *   trace.c      the handle: open, append, flush, close, and a forked child's copy */
#ifndef STABMETER_TRACE_INTERNAL_H
#define STABMETER_TRACE_INTERNAL_H

#include "metrics/metrics.h"
#include "trace/hdf5_lock.h"

#include <hdf5.h>

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

/* Rows per chunk, at most. A flush writes every dirty chunk whole, so a smaller chunk makes the
 * per-step flush cheaper, and a larger one makes long traces need fewer chunk-index entries. A
 * chunk of a per-layer dataset spans at most CHUNK_LAYERS layers and about CHUNK_VALUES values
 * (rows = CHUNK_VALUES / layers, a power of two from 1 to CHUNK_ROWS): a flush of one row then
 * rewrites at most CHUNK_VALUES / layers rows of each dataset, whatever the layer count. */
enum { CHUNK_ROWS = 256, CHUNK_LAYERS = 1024, CHUNK_VALUES = 8192 };

/* The format this library writes. 2: /step a dimension scale, and each group (/scalars, every
 * layer's) a copy of it named step that is the scale of the group's datasets; units, long_name
 * and description attributes; storage sharing. 3: each layer's forward_ratio, dependency_ratio
 * and update_ratio. 4: one two-dimensional dataset (step, layer) per metric under /layers, the
 * layer names a dimension scale, the layers' attributes one-dimensional datasets along it, the
 * attention heads' bounds one dataset (step, head). A version 1, 2 or 3 trace appended to is
 * rewritten as version 4 beside it and renamed over it (migrate.c). */
enum { FORMAT_VERSION = 4 };

/* The stab_metrics fields every layer records (schema.c: stabi_trace_metric_names). */
enum { N_METRICS = 15 };
/* The metrics a layer's ratio to its reference is recorded for (schema.c:
 * stabi_trace_ratio_names): the first N_RATIOS metrics. */
enum { N_RATIOS = 3 };
/* The datasets of /layers along the layer dimension (schema.c: stabi_trace_static_names): the
 * first STATIC_STRINGS hold strings, the others int64. */
enum { N_STATIC = 9, STATIC_STRINGS = 5 };

/* A row of the table of words (schema.c), which says what each dataset means. */
enum { ANY = -1, NOT_LAYER = -2 };
typedef struct {
  const char *name;
  int kind; /* a stab_kind, ANY, or NOT_LAYER for /step, /wall_time and /scalars */
  const char *units, *long_name;
} wording;

/* A dataset rows are appended to: `width` values a row (1; the layers; the attention heads).
 * Its staged rows are stage[off * cap + r * width + c]. */
typedef struct {
  hid_t d;
  size_t width, off;
  int rank;           /* 1: /step, /wall_time, the scalars; 2: (step, layer) or (step, head) */
} column;

/* The datasets of a trace, in cols: /step, /wall_time, the scalars, /scalars/step and
 * /layers/step (int64, written from the steps like /step), then under /layers the metrics
 * (N_METRICS), their ratios (N_RATIOS), head_bound when any layer has heads, the extras. */
enum { COL_STEP = 0, COL_WALL = 1, FIRST_SCALAR = 2 };

struct stab_trace {
  char *path;
  const stab_monitor *m;
  size_t n_layers, n_scalars, n_extras;
  hid_t file;
  int lock_fd;        /* holds the writer's lock on the file (lock.c), -1 if none */
  column *cols;       /* (n_cols) */
  size_t n_cols;
  size_t first_copy;  /* cols[first_copy], [first_copy + 1]: /scalars/step, /layers/step */
  size_t first_metric;/* cols of /layers/forward ...; the ratios follow the metrics */
  size_t head_col;    /* cols of /layers/head_bound, 0 when no layer has heads */
  size_t first_extra; /* cols of the first layer extra */
  size_t n_heads;     /* attention heads of all layers: head_bound's width */
  size_t *head_first; /* (n_layers) layer i's first column of head_bound */
  size_t width;       /* values a staged row takes, all datasets */
  size_t cap;         /* rows the stage holds, min(flush_every, STAGE_ROWS) (STAGE_ROWS when
                         flush_every is 0): a full stage is flushed */
  double flush_seconds; /* an append this long after the last flush flushes (0: never by time) */
  double last_flush;  /* monotonic seconds when the last flush (or the open) ended, or the last
                         rows were handed to the writer */
  /* The writer thread (flush_every 0): a flush hands the stage to it (swapping stage and out)
   * and returns; the thread writes out while appends fill the other stage. mu guards out_rows,
   * quit, written, error and message while it runs; cv signals both ways. */
  int background;     /* the writer thread runs */
  pthread_t writer;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double *out;        /* (width, cap) the rows being written, laid out as stage */
  int64_t *out_step;  /* (cap) */
  size_t out_rows;    /* rows in out, 0 once written (or dropped by a failure) */
  int quit;           /* close: the thread ends once out is written */
  double *stage;      /* (width, cap) rows not yet written, dataset by dataset (column); the
                         int64 ones' place unused (steps are stage_step) */
  int64_t *stage_step;/* (cap) */
  size_t staged;      /* rows in the stage */
  int64_t written;    /* rows in the file, all flushed */
  int64_t last_step;  /* the step of the last row in the file or staged, if has_last */
  int has_last;
  int64_t file_version; /* format_version of the file opened: 1 to 3 until migrated */
  stab_metrics *reference; /* (n_layers) forward, dependency, update: the first finite value > 0
                         of each among the rows the file held when opened (NaN: none, and the
                         monitor's reference is used) */
  off_t reserved;     /* the file's blocks are allocated up to this offset (reserve.c) */
  int no_reserve;     /* the file system cannot reserve space (no fallocate) */
  stab_trace_on_error on_error;
  stab_status error;  /* the write failure that stopped the trace, STAB_OK if none */
  int reported;       /* a call has returned that failure (CONTINUE returns it once) */
  char message[512];  /* its message, repeated by every later append in STOP mode */
  pid_t pid;          /* the process that opened it: a forked child holds a copy (trace.c: foreign) */
  int h5_fd;          /* HDF5's descriptor of the file (trace.c: in_child), -1 if unknown */
  stab_trace *next_open; /* the list of the traces open in the process (trace.c: open_traces) */
};

/* What creating, opening, checking and migrating a file need to know, and the messages' who
 * and path. */
typedef struct {
  const char *who, *path;
  const stab_trace_params *p;
  hid_t str;          /* variable-length UTF-8 string type */
  const stabi_sharing *share; /* which layers share storage */
} builder;

/* ---- the schema (schema.c) ---- */

extern const char *const stabi_trace_metric_names[N_METRICS];
extern const char *const stabi_trace_ratio_names[N_RATIOS];
extern const char *const stabi_trace_static_names[N_STATIC];
extern const char *const stabi_trace_head_names[2];
/* The reference's value of metric j < N_RATIOS, as a place and as a value. */
double *stabi_trace_reference_field(stab_metrics *r, size_t j);
double stabi_trace_reference_value(const stab_metrics *r, size_t j);
/* value over reference: NaN where either is NaN. */
double stabi_trace_ratio_of(double value, double reference);
/* The metrics of m in file order (N_METRICS values into v). */
void stabi_trace_metric_values(const stab_metrics *m, double *v);
/* The words of dataset `name` of a layer of `kind` (NOT_LAYER: /step, /wall_time, /scalars);
 * NULL when unknown. */
const wording *stabi_trace_wording_of(const char *name, int kind);
/* /layers/description of a layer: its kind and stored shape in words. */
void stabi_trace_describe_layer(const stab_layer *l, const stabi_shape *sh, char *buf, size_t len);
/* A layer's name in the trace ('/' read as '.'), malloc'ed; NULL when out of memory. */
char *stabi_trace_group_name(const char *name);
const char *stabi_trace_layout_name(const stab_layer *l);
int64_t stabi_trace_param_count(const stab_layer *l);
/* Heads of layer l whose bounds the trace records. */
size_t stabi_trace_layer_heads(const stab_layer *l);
/* The name of the per-layer dataset of cols[k] (k >= first_metric, not head_bound). */
const char *stabi_trace_column_name(const stab_trace *t, size_t k, const char *const *extras);
/* The declared names (scalars, layer extras) checked: one link name each, unique, not taken. */
stab_status stabi_trace_check_names(const char *who, const char *what, const char *const *names, size_t n,
                                    int not_metric);
/* No two of the monitor's layers with the same name in the trace. */
stab_status stabi_trace_check_unique(const char *who, const stab_monitor *m, char *const *gnames, size_t n);
/* The chunk of a dataset of `width` values a row: rows x values. */
void stabi_trace_chunk_of(size_t width, size_t *rows, size_t *values);

/* ---- calling HDF5 (hdf5_util.c) ---- */

/* One thread in HDF5 at a time, in the whole process (hdf5_lock.h, shared with the reader):
 * held around every HDF5 call. */
/* The caller's setting of HDF5's automatic error printing, off between quiet_begin and
 * quiet_end. */
typedef struct {
  H5E_auto2_t fn;
  void *data;
} quiet;
void stabi_trace_quiet_begin(quiet *q);
void stabi_trace_quiet_end(const quiet *q);
/* An HDF5 failure as STAB_EIO, with HDF5's own message; called before any other HDF5 call. */
__attribute__((format(printf, 3, 4)))
stab_status stabi_trace_h5fail(const char *who, const char *path, const char *fmt, ...);
/* Variable-length UTF-8 strings. */
hid_t stabi_trace_string_type(void);
/* Attributes of one value: < 0 on failure (put: HDF5's message still on the error stack; get:
 * missing or unreadable). stabi_trace_set_string replaces an attribute that exists. */
herr_t stabi_trace_put_string(hid_t obj, const char *name, hid_t str, const char *value);
herr_t stabi_trace_put_int(hid_t obj, const char *name, int64_t value);
herr_t stabi_trace_set_string(hid_t obj, const char *name, hid_t str, const char *value);
herr_t stabi_trace_get_string(hid_t obj, const char *name, hid_t str, char *buf, size_t len);
herr_t stabi_trace_get_int(hid_t obj, const char *name, int64_t *value);

/* ---- one writer per trace (lock.c) ---- */

/* The write lock of the open file fd: 0, or the errno (EAGAIN / EACCES: held by another). */
int stabi_trace_lock_fd(int fd);
/* The regular file at path opened and locked, path checked to still name it: *fd, or -1 with
 * *again set (start the open again); STAB_EBUSY when another writer holds it. */
stab_status stabi_trace_lock_path(const char *who, const char *path, const char *what, int *fd, int *again);
/* The complete temporary file tmp made the trace at t->path; *again: start the open again. */
stab_status stabi_trace_publish(stab_trace *t, const char *who, const char *tmp, int append, int *again);

/* ---- disk space (reserve.c) ---- */

/* Room on the disk for a flush of `rows` rows, allocated past the file's end; STAB_EIO when none. */
stab_status stabi_trace_reserve(stab_trace *t, const char *who, size_t rows);
/* The reserve given back (after HDF5 closed the file). */
void stabi_trace_unreserve(stab_trace *t);

/* ---- a new file's datasets (create.c) ---- */

/* The new trace, without rows, built in t->file, created with fapl. */
stab_status stabi_trace_create_file(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames,
                                    const char *created, const char *run_config);

/* ---- a file on disk opened and checked (open.c) ---- */

/* The links of group g (where names it in messages). */
stab_status stabi_trace_link_count(const builder *b, hid_t g, const char *where, hsize_t *n);
/* The rows of a dataset (its length along the steps). */
stab_status stabi_trace_dataset_rows(const builder *b, hid_t d, hsize_t *n);
/* Sets column k's rows. */
herr_t stabi_trace_set_rows(const stab_trace *t, size_t k, hsize_t rows);
/* The trace file `disk` opened with HDF5 and checked; of format 1 to 3, only opened. */
stab_status stabi_trace_open_disk(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, const char *disk);

/* ---- formats 1 to 3 (migrate.c) ---- */

/* The new trace t (its columns created, no rows) filled with the rows of the old trace old. */
stab_status stabi_trace_migrate_rows(stab_trace *t, const builder *b, hid_t old, int64_t version,
                                     char *const *gnames);

/* ---- a new file (image.c) ---- */

/* A new trace (old < 0), or the trace old of format old_version migrated, built in memory,
 * written to *tmp beside the path, opened for SWMR writing and published. */
stab_status stabi_trace_create_new(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, char **tmp,
                                   int *again, hid_t old, int64_t old_version);

/* ---- rows to the file, the writer thread (writer.c) ---- */

/* The clock of the flush policy, in seconds (monotonic). */
double stabi_trace_now_seconds(void);
/* Starts the writer thread (t->background says whether it runs). */
void stabi_trace_start_writer(stab_trace *t);
/* Waits until the writer has written the batch it holds; t->mu held. */
void stabi_trace_wait_written(stab_trace *t);
/* The writer's failure, or STAB_OK. */
stab_status stabi_trace_writer_error(stab_trace *t);
/* The staged rows flushed: handed to the writer thread, or written here. */
stab_status stabi_trace_write_out(stab_trace *t, const char *who);

#endif
