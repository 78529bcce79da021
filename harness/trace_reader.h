/* trace_reader.h — a stabmeter trace (HDF5; its datasets are described in docs/manual/metrics.md) as
 * harness/export reads it: the file opened (regular files only, by stab_input_open), every
 * dataset of the schema checked and opened, then the rows read a block at a time. Shared with
 * the trace reader's fuzz target. Harness code: nothing is printed; a failure's message is in
 * the trace's msg. */
#ifndef STAB_HARNESS_TRACE_READER_H
#define STAB_HARNESS_TRACE_READER_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Rows read from every dataset at a time: the memory is TRACE_BLOCK_ROWS x datasets x 8 bytes
 * (5.6 MB for the 682 datasets of 40 linear layers), whatever the trace's length. */
enum { TRACE_BLOCK_ROWS = 1024 };

typedef struct {
  char *name; /* the dataset's name in its group: "forward", "head0_bound", "loss" ... (format 4:
                 the metric, or head<h>_bound for column `at` of /layers/head_bound) */
  hid_t d;    /* format 4's layer columns: a (step, layer) or (step, head) dataset of trace.wide */
  hsize_t at; /* in d, when two-dimensional: the column (the layer's, or the head's) */
  int shared; /* d is one of trace.wide: not closed with the column */
  double *v;  /* TRACE_BLOCK_ROWS values of the current block */
} trace_column;

typedef struct {
  char *group; /* the group's name under /layers ('/' of the layer name already '.') */
  char *kind;
  trace_column *cols; /* the writer's metric order, then the others by name */
  size_t n_cols;
} trace_layer;

/* What to read. Names that select nothing are an error (a typo). */
typedef struct {
  const char *const *layer_globs; /* layers whose group name matches any of these shell patterns; */
  size_t n_layer_globs;           /* none: every layer */
  char *const *metrics;           /* only these datasets (layer metrics, scalars, wall_time); */
  size_t n_metrics;               /* metrics NULL: every dataset */
} trace_filter;

typedef struct {
  const char *path;
  int fd;              /* the file as stab_input_open opened it, held while the trace is open */
  dev_t dev;           /* and its identity, so that an output file can be told from it */
  ino_t ino;
  int live;            /* its writer was running at the open (it holds the write lock) */
  hid_t file, step, mem;
  int swmr;            /* opened with SWMR_READ */
  int64_t version;     /* format_version: 1, 2 (each group also holds a copy of /step, "step"), 3
                          (ratios), 4 (one (step, layer) dataset per metric under /layers) */
  hsize_t rows;        /* len(/step): the rows every dataset has (others may be longer) */
  trace_column wall;   /* /wall_time; wall.d < 0 when not read */
  trace_column *scalars; /* by name */
  size_t n_scalars;
  trace_layer *layers; /* by group name, numbers in names compared as numbers */
  size_t n_layers;
  int64_t *steps;      /* TRACE_BLOCK_ROWS */
  hid_t *wide;         /* format 4: the two-dimensional datasets of /layers open */
  size_t n_wide;
  char msg[1024];      /* why the last call failed: "PATH: what, where" */
} trace;

/* An empty trace, every id invalid: what trace_close leaves. */
void trace_init(trace *t);

/* Opens the trace at path (kept as a pointer) and every dataset that o selects, checking the
 * schema: the format attributes, /step, /wall_time, /scalars, /layers, each layer's kind and
 * required metrics, types, ranks and lengths. A trace whose writer runs is read as SWMR, its
 * flushed rows. Returns 0; 2 for a path that is not a regular file, a file that is not a
 * stabmeter trace or that HDF5 cannot read (damaged: the message names the object); 1 when
 * memory runs out. t must come from trace_init; on failure trace_close it all the same. */
int trace_open(trace *t, const char *path, const trace_filter *o);

/* Reads rows [first, first + count) (count <= TRACE_BLOCK_ROWS, first + count <= t->rows) of
 * every open dataset into t->steps and the columns' v. 0, or 2 when a read fails (the message
 * names the dataset). HDF5 checks the checksums of the metadata it reads on the way; the
 * values themselves carry none unless their datasets have the Fletcher32 filter. */
int trace_read_block(trace *t, hsize_t first, hsize_t count);

/* Closes and frees everything t holds, leaving it as trace_init does. */
void trace_close(trace *t);

#endif /* STAB_HARNESS_TRACE_READER_H */
