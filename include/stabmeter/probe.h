/* stabmeter/probe.h — the probe as a library: open a checkpoint in any format the library reads,
 * measure every layer, and give the report (stabmeter-probe's JSON or table) or append it to a
 * trace. Part of <stabmeter.h>. */
#ifndef STABMETER_PROBE_H
#define STABMETER_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- The probe: a checkpoint's every layer measured ----------------------------------
 * What stabmeter-probe reports, as a library: open a checkpoint (a safetensors file, a Hugging
 * Face model directory or its model.safetensors.index.json, a GGUF file, an llm.c checkpoint;
 * the format from the file's first bytes, stab_ckpt_sniff), describe it by the kind rules
 * (stab_model_describe, with config.json beside it and the file's metadata), match an older
 * checkpoint's tensors to it (--prev: by name and shape, or between a GGUF file and the
 * safetensors it was converted from by llama.cpp's names), measure every row, and give the
 * report: the JSON stabmeter-probe --json prints, or its table, as text. Plan once
 * (stab_probe_open), measure (stab_probe_measure, all rows or a share), report. Tensors are read
 * where they are mapped, one layer at a time, their pages handed back after each. A probe is
 * used by one thread at a time (it runs its own measuring threads); probes are independent. */

typedef struct stab_probe stab_probe;

/* An event of stab_probe_params.file_fn, for a caller that watches the files the probe maps.
 * (A file truncated under its mapping needs no watch of the caller's: the library's input
 * guard makes it STAB_EIO, see "Checkpoint readers" in stabmeter/checkpoint.h.) */
typedef enum {
  STAB_PROBE_FILE_OPENING = 0, /* a reader is about to parse path from its mapping */
  STAB_PROBE_FILE_OPENED = 1,  /* done parsing path (opened or not) */
  STAB_PROBE_FILE_MAPPED = 2   /* the tensors of path span the mapped bytes [lo, lo + len) */
} stab_probe_file_event;

/* Called on the opening thread. A non-zero return stops stab_probe_open (STAB_ESTATE). */
typedef int (*stab_probe_file_fn)(void *user, stab_probe_file_event event, const char *path, const void *lo,
                                  size_t len);

/* What stab_probe_measure is about to do, for a progress line. */
typedef struct {
  size_t row;        /* the row about to be measured (stab_probe_row's index) */
  size_t count;      /* the rows of the probe */
  const char *name;  /* that row's name */
  double work_done;  /* the work of the rows measured so far in this call (stab_probe_row.work) */
  double work_total; /* the work of every row this call measures */
  int thread;        /* 0 .. threads-1: the measuring thread calling (one call at a time per thread) */
} stab_probe_progress;

/* Called from the measuring threads (several at once, each its own struct) before each row; a
 * non-zero return stops the measurement (STAB_ESTATE; rows measured so far keep their results). */
typedef int (*stab_probe_progress_fn)(void *user, const stab_probe_progress *progress);

/* Hands a note or warning to the caller, one line without a newline ("warning: ...",
 * "note: ..."), on the calling thread. */
typedef void (*stab_probe_note_fn)(void *user, const char *text);

typedef struct {
  double tol;                 /* relative tolerance of each spectral norm (default 1e-3) */
  int exact;                  /* 1: spectral norms by LAPACK SVD in f64 (the reference) */
  stab_tight_method tight;    /* the LM head's tight bound (default STAB_TIGHT_CENTRED) */
  int threads;                /* layers measured at once; 0: 2 when OpenMP has two threads or more
                                 and not exact, else 1 */
  size_t heads;               /* attention heads; 0: from the file's metadata or config.json */
  const char *prev;           /* the older checkpoint the update is against, or NULL */
  const stab_model_override *kinds; /* --kind GLOB=KIND, nkinds of them (copied) */
  size_t nkinds;
  const stab_model_override *layouts; /* --layout GLOB=in_major|out_major (copied) */
  size_t nlayouts;
  const char *const *filters; /* only the rows whose name or a tensor's matches one (fnmatch), or NULL */
  size_t nfilters;
  stab_probe_note_fn note_fn; /* notes and warnings, or NULL: dropped */
  stab_probe_file_fn file_fn; /* the files mapped, or NULL */
  void *user;                 /* for note_fn and file_fn */
} stab_probe_params;

stab_probe_params stab_probe_default_params(void);

/* Opens path (and params->prev) and describes it: one row per layer or tensor not measured, in
 * the checkpoint's order (a tied head last), filtered, matched to the reference. Nothing is
 * measured yet. Strings are copied.
 * Errors (the message names the file and the field or byte offset, as stabmeter-probe's):
 * NULL path, params or out STAB_EINVAL; a file that cannot be opened STAB_EIO; a malformed file
 * STAB_EFORMAT; a file of another kind (PyTorch, HDF5, text, ...) the sniffer's status; a
 * --filter that matches nothing, a reference none of whose tensors matches, a GGUF architecture
 * with no name map STAB_ENOTFOUND; a malformed config.json STAB_EFORMAT or STAB_ERANGE;
 * STAB_ENOMEM; file_fn stopping STAB_ESTATE. *out is NULL on failure. */
stab_status stab_probe_open(const char *path, const stab_probe_params *params, stab_probe **out);
/* NULL is a no-op. */
void stab_probe_free(stab_probe *p);

size_t stab_probe_count(const stab_probe *p);

/* One mapped byte range a row reads (weight, bias, key, the reference's weight and bias). */
typedef struct {
  const char *tensor;        /* the tensor's name */
  const char *file;          /* the file it is in (a shard's, for a sharded model) */
  uint64_t offset;           /* its first byte in that file */
  uint64_t bytes;
  const unsigned char *data; /* where it is mapped */
} stab_probe_read;

enum { STAB_PROBE_MAX_READS = 5, STAB_PROBE_EXPERT_METRICS = 5 };

/* A row of the report. Pointers are the probe's, valid until stab_probe_free. */
typedef struct {
  const char *name;        /* the layer's name, as stabmeter-train's trace names it */
  const char *tensor;      /* the tensor it is (an attention row: the query) */
  stab_kind kind;
  stab_layout layout;      /* linear and attention; STAB_LAYOUT_NATURAL for the others */
  const char *dtype;       /* the type the tensor is stored in ("BF16", "Q4_K", ...) */
  size_t ndim;             /* the row's shape, outermost first (a layer of HF experts: experts first) */
  uint64_t shape[3];
  uint64_t count;          /* the tensor's elements */
  size_t d_in, d_out;
  const char *bias;        /* the bias folded in, or NULL */
  const char *key_tensor;  /* attention: the key projection */
  size_t heads, kv_heads;  /* attention */
  const char *reference_tensor, *reference_dtype; /* with a reference: the counterpart, or NULL */
  int tied;                /* a tied embedding reported as lm_head */
  size_t n_expert;         /* a layer of experts: how many (its metrics are its worst expert's) */
  size_t expert;           /* an expert's index, or STAB_MODEL_NO_EXPERT */
  const char *expert_of;   /* an expert: its layer's name */
  size_t worst[STAB_PROBE_EXPERT_METRICS]; /* a layer of experts: the expert of the largest forward,
                                              dependency, update, sigma, rel_update (or NO_EXPERT) */
  const char *error;       /* why not measured, or NULL */
  const char *no_update;   /* with a reference: why the row has no update, or NULL */
  int measured;
  stab_metrics metrics;    /* NaN until measured */
  const double *head_bounds; /* attention: heads logit bounds, or NULL */
  double work;             /* the row's cost in a split across processes: the bytes it reads
                              times the sweeps expected; 0 for a row that reads nothing */
  stab_probe_read reads[STAB_PROBE_MAX_READS]; /* what measuring it reads, nreads of them */
  size_t nreads;
} stab_probe_row;

/* Row i into *out. Errors: NULL p or out, i out of range STAB_EINVAL. */
stab_status stab_probe_row_at(stab_probe *p, size_t i, stab_probe_row *out);

/* Measures the rows whose which[i] is non-zero (which: stab_probe_count bytes; NULL: every
 * row), skipping rows the rules do not measure (error set), rows measured already, and layers of
 * experts (their experts' rows are measured; the layer's metrics are its worst expert's). Two
 * layers at a time (params.threads); each layer's mapped pages are handed back after it.
 * progress_fn (or NULL) is called before each row. Errors: STAB_EINVAL; a row that cannot be
 * read or measured, the layer's message (the first when several fail); progress_fn stopping
 * STAB_ESTATE. */
stab_status stab_probe_measure(stab_probe *p, const unsigned char *which, stab_probe_progress_fn progress_fn,
                               void *user);

/* Sets row i's results as another process measured them (the MPI split): metrics, and for an
 * attention row its heads bounds (copied), measured 0 or 1. Errors: STAB_EINVAL. */
stab_status stab_probe_set_result(stab_probe *p, size_t i, const stab_metrics *m, const double *head_bounds,
                                  int measured);

/* The reference of the ratios to init: INIT, a checkpoint of the same model at initialisation
 * (or any earlier one), in any format stab_probe_open reads. INIT is opened and described as the
 * checkpoint is (same params: its own metadata, heads and attn_scale; not --prev, not the
 * filters), and each row is matched to INIT's row of the same kind, expert, d_in, d_out, heads
 * and experts that reads the tensor --prev takes as its counterpart (the same name, or between
 * a GGUF file and safetensors the name stab_name_map_to_hf / _to_gguf gives; a Gemma norm's
 * counterpart read plus one, as the GGUF file stores it). Rows without a counterpart get NaN
 * ratios: a warning through note_fn with their count and first names, counted as the report's
 * table counts layers (a layer of experts once). stabmeter-probe calls it with
 * --init INIT, or with --prev OLDER when there is no --init (the ratio to the earlier
 * checkpoint). Once per probe, before stab_probe_measure_init.
 * Errors: NULL p or path STAB_EINVAL; a second call STAB_ESTATE; INIT's errors as
 * stab_probe_open's (message starting with its path); no row with a counterpart STAB_ENOTFOUND.
 * On failure the probe is as before the call. */
stab_status stab_probe_set_init(stab_probe *p, const char *path);
/* The init reference's path as given, or NULL (none, or p NULL). */
const char *stab_probe_init_path(const stab_probe *p);

/* Measures the init reference's counterparts of the rows whose which[i] is non-zero (NULL:
 * every row): a second stab_probe_measure, on INIT's rows, with the same settings (so about
 * the time of measuring the checkpoint again). progress_fn is called with INIT's rows. Without
 * an init reference nothing is done (STAB_OK). Errors: those of stab_probe_measure. */
stab_status stab_probe_measure_init(stab_probe *p, const unsigned char *which, stab_probe_progress_fn progress_fn,
                                    void *user);

/* Row i against the init reference: NaN where not known. */
typedef struct {
  double forward_init, dependency_init; /* the counterpart's values (its units: the row's) */
  double forward_ratio, dependency_ratio; /* the row's value over init's (finite, init > 0) */
  size_t init_row; /* the counterpart's row in INIT's own order, or SIZE_MAX */
} stab_probe_ratio;

/* Row i's ratio to init into *out (all NaN without an init reference). update has no ratio:
 * INIT gives the values at one point, and an update is a pair of points. Errors: NULL p or
 * out, i out of range STAB_EINVAL. */
stab_status stab_probe_ratio_at(stab_probe *p, size_t i, stab_probe_ratio *out);

/* The order of the report's rows. */
typedef enum {
  STAB_PROBE_SORT_FILE = 0, STAB_PROBE_SORT_NAME, STAB_PROBE_SORT_FORWARD, STAB_PROBE_SORT_DEPENDENCY,
  STAB_PROBE_SORT_UPDATE, STAB_PROBE_SORT_SIGMA, STAB_PROBE_SORT_REL_UPDATE, STAB_PROBE_SORT_FORWARD_TIGHT,
  STAB_PROBE_SORT_DEPENDENCY_TIGHT, STAB_PROBE_SORT_UPDATE_TIGHT,
  STAB_PROBE_SORT_FORWARD_RATIO, STAB_PROBE_SORT_DEPENDENCY_RATIO /* with an init reference */
} stab_probe_sort;
/* "file", "name", "forward", ... (the --sort words); NULL past the last. */
const char *stab_probe_sort_name(int sort);

typedef struct {
  stab_probe_sort sort;    /* largest first, a row without the value last */
  size_t top;              /* only the first top rows; 0: every row */
  int experts;             /* a row per expert too, beside its layer's */
  int per_head;            /* the table: a row per attention head */
  int64_t step;            /* the step reported, or -1: none */
  const char *step_source; /* where step came from ("--step", ...), or NULL */
} stab_probe_report_options;

stab_probe_report_options stab_probe_default_report_options(void);

/* The probe report as JSON (format "stabmeter-probe", format_version 2: docs/manual/metrics.md),
 * exactly the text stabmeter-probe --json prints, ending in a newline: *text (NUL-terminated,
 * free() it) and *len bytes. options NULL: the defaults. Errors: NULL p, text or len
 * STAB_EINVAL; STAB_ENOMEM. */
stab_status stab_probe_json(stab_probe *p, const stab_probe_report_options *options, char **text, size_t *len);
/* The same report as stabmeter-probe's table (names shown with control bytes escaped). */
stab_status stab_probe_table(stab_probe *p, const stab_probe_report_options *options, char **text, size_t *len);

/* Where the checkpoint names its training step: its metadata (safetensors __metadata__ step,
 * global_step, stabmeter-train's steps; GGUF training.iteration_count) and its file or
 * directory name (step-000100.*, model_00000100.bin, checkpoint-500/); -1 when none. */
typedef struct {
  int64_t metadata_step;
  const char *metadata_source; /* "the checkpoint's __metadata__ step", ... or NULL */
  char metadata_problem[160];  /* a step key whose value is no whole number: why, else "" */
  int64_t name_step;
  const char *name_source;     /* "the file name" or "the directory's name" */
} stab_probe_steps;

stab_status stab_probe_steps_found(const stab_probe *p, stab_probe_steps *out);

/* Appends one step holding every measured row to the trace at path (created if missing), the
 * rows as layers under their names, run_config the probe's settings. Errors: those of
 * stab_trace_open and stab_trace_append (a trace of other layers STAB_EINVAL, another writer
 * STAB_EBUSY, a step not after the last STAB_ERANGE, ...), each message starting with path. */
stab_status stab_probe_trace_append(stab_probe *p, const char *path, int64_t step);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_PROBE_H */
