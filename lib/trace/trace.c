/* trace.c — the HDF5 trace writer: every measured step of a monitor appended as one row of
 * extendable datasets (docs/manual/trace.md), one per metric, indexed by step and layer, so that the
 * file's objects, and what opening, flushing and closing it costs, grow with the metrics and
 * not with the layers. Written in SWMR mode so that a reader can follow the file while training
 * runs and a killed writer loses nothing it had flushed. /step and the layer names are dimension
 * scales and every dataset says its units, so that netCDF tools (xarray, ncdump) read the trace
 * as labelled data. Traces of formats 1 to 3 (a group of one-dimensional datasets per layer)
 * appended to are rewritten in this layout first (migrate). */
#define _GNU_SOURCE /* F_OFD_SETLK, fallocate, renameat2 */
#include "metrics/metrics.h"
#include "trace/hdf5_lock.h"

#include <hdf5.h>
#include <hdf5_hl.h> /* H5DS: /step as a dimension scale */

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Rows per chunk, at most. A flush writes every dirty chunk whole, so a smaller chunk makes the
 * per-step flush cheaper, and a larger one makes long traces need fewer chunk-index entries. A
 * chunk of a per-layer dataset spans at most CHUNK_LAYERS layers and about CHUNK_VALUES values
 * (rows = CHUNK_VALUES / layers, a power of two from 1 to CHUNK_ROWS): a flush of one row then
 * rewrites at most CHUNK_VALUES / layers rows of each dataset, whatever the layer count. */
enum { CHUNK_ROWS = 256, CHUNK_LAYERS = 1024, CHUNK_VALUES = 8192 };

/* Rows are staged in memory and reach the file only at a flush: one write of many rows per
 * dataset costs little more than one of a row, and rows written but not flushed could reach
 * the disk in any order when HDF5 evicts its cache. A flush comes at least this often. No
 * more than a chunk, so that the rows of one flush start at most one new chunk per dataset
 * (reserve_bytes counts on it). */
enum { STAGE_ROWS = 256 };

/* The format this library writes. 2: /step a dimension scale, and each group (/scalars, every
 * layer's) a copy of it named step that is the scale of the group's datasets; units, long_name
 * and description attributes; storage sharing. 3: each layer's forward_ratio, dependency_ratio
 * and update_ratio. 4: one two-dimensional dataset (step, layer) per metric under /layers, the
 * layer names a dimension scale, the layers' attributes one-dimensional datasets along it, the
 * attention heads' bounds one dataset (step, head). A version 1, 2 or 3 trace appended to is
 * rewritten as version 4 beside it and renamed over it (migrate). */
enum { FORMAT_VERSION = 4 };

/* The longest flush_seconds accepted (a day): beyond it a kill loses more than anyone means to
 * keep in memory only; 0 turns the clock off instead. */
enum { FLUSH_SECONDS_MAX = 86400 };

/* One thread in HDF5 at a time, in the whole process: HDF5 is thread-safe only when built so
 * (Debian 12's is, H5is_library_threadsafe says 1; a source build by default is not), and a
 * trace's writer thread writes while the caller opens or closes another trace. Held
 * around every HDF5 call of this file; fork waits for it (after_fork), so that a child never
 * starts with it held by a writer thread it does not have. */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void hdf5_lock_take(void) { stabi_hdf5_lock(); } /* shared with the reader: hdf5_lock.h */
static void hdf5_lock_give(void) { stabi_hdf5_unlock(); }
static void in_child(void);
static void after_fork(void) { pthread_atfork(hdf5_lock_take, hdf5_lock_give, in_child); }

/* The clock of the flush policy: monotonic, so that a clock set back never holds rows back. */
static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The stab_metrics fields every layer records, in file order. */
enum { N_METRICS = 15 };
static const char *const metric_names[N_METRICS] = {
    "forward",       "dependency",    "update",         "forward_tight",
    "dependency_tight", "update_tight", "spread",        "sigma",
    "sigma_rel_err", "sigma_update",  "sigma_update_rel_err", "rel_update",
    "passes",        "update_passes", "flags"};

/* The metrics a layer's ratio to its reference is recorded for (stab_monitor_reference), in
 * file order after the metrics; metric j's ratio is ratio_names[j], j < N_RATIOS being the first
 * metrics of metric_names. */
enum { N_RATIOS = 3, FIRST_HEAD = N_METRICS + N_RATIOS };
static const char *const ratio_names[N_RATIOS] = {"forward_ratio", "dependency_ratio", "update_ratio"};

/* The reference's value of metric j < N_RATIOS. */
static double *reference_field(stab_metrics *r, size_t j) {
  return j == 0 ? &r->forward : j == 1 ? &r->dependency : &r->update;
}

static double reference_value(const stab_metrics *r, size_t j) {
  return j == 0 ? r->forward : j == 1 ? r->dependency : r->update;
}

/* value over reference: NaN where either is NaN (and where no reference was seen yet). */
static double ratio_of(double value, double reference) {
  return isnan(value) || isnan(reference) ? NAN : value / reference;
}

static void metric_values(const stab_metrics *m, double *v) {
  v[0] = m->forward;
  v[1] = m->dependency;
  v[2] = m->update;
  v[3] = m->forward_tight;
  v[4] = m->dependency_tight;
  v[5] = m->update_tight;
  v[6] = m->spread;
  v[7] = m->sigma;
  v[8] = m->sigma_rel_err;
  v[9] = m->sigma_update;
  v[10] = m->sigma_update_rel_err;
  v[11] = m->rel_update;
  v[12] = m->passes;
  v[13] = m->update_passes;
  v[14] = m->flags;
}

/* ---- what each dataset means, in words ------------------------------------------------ */

/* The units and long_name attributes of every dataset the library knows (CF conventions: "1" is
 * dimensionless; the LM head's values bound a loss, in nats), after docs/manual/metrics.md. The first
 * row whose name matches and whose kind is the layer's, or ANY, applies; kind-specific rows
 * come first. A dataset with a declared name this table lacks (a scalar or a layer extra the
 * trainer made up) gets its name as long_name and no units: we do not know them. */
enum { ANY = -1, NOT_LAYER = -2 };
typedef struct {
  const char *name;
  int kind; /* a stab_kind, ANY, or NOT_LAYER for /step, /wall_time and /scalars */
  const char *units, *long_name;
} wording;

static const wording words[] = {
    {"step", NOT_LAYER, "1", "optimizer step"},
    {"wall_time", NOT_LAYER, "s", "seconds since the run began"},
    {"loss", NOT_LAYER, "nats", "training loss (mean cross-entropy of the batch)"},
    {"lr", NOT_LAYER, "1", "learning rate"},
    {"grad_norm", NOT_LAYER, "1", "gradient norm"},
    {"forward", STAB_KIND_LINEAR, "1", "forward stability: max ||x W + b||_RMS over ||x||_RMS = 1 "
                                       "(sqrt(d_in/d_out) sigma(W) + ||b||_RMS)"},
    {"forward", STAB_KIND_EMBEDDING, "1", "forward stability: max_i ||E_i||_RMS, the largest row RMS of the table"},
    {"forward", STAB_KIND_LM_HEAD, "nats", "forward stability: bound on the loss, log V + 2 d R, R = max_i ||w_i||_RMS"},
    {"forward", STAB_KIND_GAIN, "1", "forward stability: max_i |gamma_i|"},
    {"forward", STAB_KIND_BIAS, "1", "forward stability: ||b||_RMS"},
    {"forward", STAB_KIND_ATTENTION, "1", "attention logit bound: max over heads of s d_h F_q F_k, bounding |s <q, k>| "
                                          "over ||x||_RMS = 1 (q and k biases not included)"},
    {"dependency", STAB_KIND_LINEAR, "1", "dependency stability: Lipschitz constant sqrt(d_in/d_out) sigma(W)"},
    {"dependency", STAB_KIND_LM_HEAD, "nats", "dependency stability: 2 d R, the loss's Lipschitz bound in x"},
    {"dependency", STAB_KIND_GAIN, "1", "dependency stability: max_i |gamma_i|"},
    {"dependency", ANY, "1", "dependency stability: not defined for this kind (NaN)"},
    {"update", STAB_KIND_LINEAR, "1", "update stability: max ||x dW + db||_RMS over ||x||_RMS = 1 "
                                      "(sqrt(d_in/d_out) sigma(dW) + ||db||_RMS)"},
    {"update", STAB_KIND_EMBEDDING, "1", "update stability: max_i ||dE_i||_RMS"},
    {"update", STAB_KIND_LM_HEAD, "nats", "update stability: 2 d dR, bound on the loss's change"},
    {"update", STAB_KIND_GAIN, "1", "update stability: max_i |dgamma_i|"},
    {"update", STAB_KIND_BIAS, "1", "update stability: ||db||_RMS"},
    {"update", ANY, "1", "update stability: not defined for this kind (NaN)"},
    {"forward_tight", STAB_KIND_LM_HEAD, "nats", "tighter forward bound: log V + d Dm, Dm the class vectors' RMS diameter"},
    {"dependency_tight", STAB_KIND_LM_HEAD, "nats", "tighter dependency bound: d Dm"},
    {"update_tight", STAB_KIND_LM_HEAD, "nats", "tighter update bound: d dDm"},
    {"forward_tight", ANY, "1", "tighter forward bound: lm_head only (NaN)"},
    {"dependency_tight", ANY, "1", "tighter dependency bound: lm_head only (NaN)"},
    {"update_tight", ANY, "1", "tighter update bound: lm_head only (NaN)"},
    {"spread", STAB_KIND_EMBEDDING, "1", "spread: max_{i,j} ||E_i - E_j||_RMS (an upper bound)"},
    {"spread", STAB_KIND_LM_HEAD, "nats", "spread: 4 d R, the earlier revision's dependency bound over two labels"},
    {"spread", ANY, "1", "spread: embedding and lm_head only (NaN)"},
    {"sigma", STAB_KIND_LINEAR, "1", "sigma(W), the weight's largest singular value (estimate, a lower bound)"},
    {"sigma", ANY, "1", "sigma(W): linear only (NaN)"},
    {"sigma_rel_err", ANY, "1", "estimated relative error of sigma"},
    {"sigma_update", STAB_KIND_LINEAR, "1", "sigma(dW), the update's largest singular value (estimate)"},
    {"sigma_update", ANY, "1", "sigma(dW): linear only (NaN)"},
    {"sigma_update_rel_err", ANY, "1", "estimated relative error of sigma_update"},
    {"rel_update", ANY, "1", "relative update ||dW||_F / ||W||_F, weights after the step, bias included"},
    {"passes", ANY, "1", "count of passes over the weights by the spectral estimates"},
    {"update_passes", ANY, "1", "count of passes over the update by its spectral estimate"},
    {"flags", ANY, "1", "bit flags: 1 non-finite weight, 2 non-finite update, 4 spectral estimate not converged"},
    {"forward_ratio", ANY, "1", "forward stability over its value at the first measured step where it was finite "
                                "and > 0 (ratio to init)"},
    {"dependency_ratio", ANY, "1", "dependency stability over its value at the first measured step where it was "
                                   "finite and > 0 (ratio to init)"},
    {"update_ratio", ANY, "1", "update stability over its value at the first measured step where it was finite "
                               "and > 0 (ratio to init)"},
    {"act_rms", ANY, "1", "RMS of the hidden state (residual stream) of this layer's block"},
    {"act_cos1", ANY, "1", "|cos(h, 1)|: the hidden state's angle to the all-ones vector (mean drift)"},
    /* head<h>_bound, looked up under this name */
    {"head_bound", STAB_KIND_ATTENTION, "1", "logit bound of one head: s d_h F_q,h F_k,h, bounding |s <q_h, k_h>|"},
};

/* The wording of dataset `name` of a layer of `kind` (NOT_LAYER: /step, /wall_time, /scalars);
 * NULL when unknown. */
static const wording *wording_of(const char *name, int kind) {
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    const wording *w = &words[i];
    if (strcmp(w->name, name) != 0) continue;
    if (w->kind == kind || (w->kind == ANY && kind != NOT_LAYER)) return w;
  }
  return NULL;
}

/* The description attribute of a layer's group: its kind and stored shape in words, from the
 * storage the monitor resolved (sh), so that it says what the numbers were computed from. */
static void describe_layer(const stab_layer *l, const stabi_shape *sh, char *buf, size_t len) {
  const int out_major = l->layout != STAB_LAYOUT_IN_MAJOR;
  const size_t d_in = out_major ? sh->cols : sh->rows, d_out = out_major ? sh->rows : sh->cols;
  char stride[64] = "";
  if (sh->ld != sh->cols) snprintf(stride, sizeof stride, ", rows %zu floats apart (ld)", sh->ld);
  switch (l->kind) {
  case STAB_KIND_LINEAR:
    snprintf(buf, len, "linear layer y = x W%s, d_in %zu -> d_out %zu, stored %s%s; %s", l->bias ? " + b" : "", d_in,
             d_out, out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride,
             l->bias ? "with a bias of length d_out" : "no bias");
    return;
  case STAB_KIND_ATTENTION:
    if (sh->kv_heads && sh->kv_heads != sh->heads) /* grouped-query: k is narrower */
      snprintf(buf, len, "attention logits s <q, k> of %zu heads of width %zu sharing %zu key heads, q = x W_q and "
               "k = x W_k, d_in %zu -> d_out %zu (q) and %zu (k), stored %s%s; q and k biases are outside the bound",
               sh->heads, sh->dh, sh->kv_heads, d_in, d_out, sh->kv_heads * sh->dh,
               out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride);
    else
      snprintf(buf, len, "attention logits s <q, k> of %zu heads of width %zu, q = x W_q and k = x W_k, "
               "d_in %zu -> d_out %zu each, stored %s%s; q and k biases are outside the bound", sh->heads, sh->dh,
               d_in, d_out, out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride);
    return;
  case STAB_KIND_EMBEDDING:
    snprintf(buf, len, "embedding table E, V %zu ids (tokens or positions) of width d %zu, stored %s%s", sh->items_are_rows ? sh->rows : sh->cols,
             sh->items_are_rows ? sh->cols : sh->rows,
             sh->items_are_rows ? "[V][d], one row per id" : "[d][V], one column per id", stride);
    return;
  case STAB_KIND_LM_HEAD:
    snprintf(buf, len, "LM head, V %zu classes of width d %zu (loss logsumexp_i <x, w_i - w_t>), stored %s%s",
             sh->items_are_rows ? sh->rows : sh->cols, sh->items_are_rows ? sh->cols : sh->rows,
             sh->items_are_rows ? "[V][d], one row per class" : "[d][V], one column per class", stride);
    return;
  case STAB_KIND_GAIN:
    snprintf(buf, len, "RMSNorm or LayerNorm gain gamma of length d %zu (the square linear layer diag(gamma))", sh->cols);
    return;
  case STAB_KIND_BIAS:
    snprintf(buf, len, "bias vector of length d %zu with no weight to pair with", sh->cols);
    return;
  }
  snprintf(buf, len, "layer of kind %d", (int)l->kind);
}

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
  int lock_fd;        /* holds the writer's lock on the file (see lock_fd), -1 if none */
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
  off_t reserved;     /* the file's blocks are allocated up to this offset (see reserve) */
  int no_reserve;     /* the file system cannot reserve space (no fallocate) */
  stab_trace_on_error on_error;
  stab_status error;  /* the write failure that stopped the trace, STAB_OK if none */
  int reported;       /* a call has returned that failure (CONTINUE returns it once) */
  char message[512];  /* its message, repeated by every later append in STOP mode */
  pid_t pid;          /* the process that opened it: a forked child holds a copy (see foreign) */
  int h5_fd;          /* HDF5's descriptor of the file (see in_child), -1 if unknown */
  stab_trace *next_open; /* the list of open_traces */
};

/* Every trace open in this process (guarded by hdf5_lock), for in_child. */
static stab_trace *open_traces;

/* In a forked child, at once: HDF5 there holds a copy of each open trace's state, which its
 * atexit handler would write over the parent's file when the child exits (a trace the parent
 * went on appending to was left unreadable, "addr overflow"). Each HDF5 descriptor now names
 * /dev/null, and the child's copy of the lock's descriptor is closed; only system calls here. */
static void in_child(void) {
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (stab_trace *t = open_traces; t; t = t->next_open) {
    if (t->h5_fd >= 0 && null_fd >= 0) dup2(null_fd, t->h5_fd);
    if (t->lock_fd >= 0) close(t->lock_fd);
    t->lock_fd = -1;
  }
  if (null_fd >= 0) close(null_fd);
  open_traces = NULL; /* none is this process's */
  hdf5_lock_give();
}

static void start_writer(stab_trace *t);

/* A child forked from the process that opened t holds a copy of t: the same file, lock and
 * HDF5 state, sync objects perhaps held by a writer thread it does not have. The trace is the
 * parent's: in the child every call but stab_trace_close fails with this, and the close frees
 * the child's memory only (destroy). */
static stab_status foreign(const stab_trace *t, const char *who) {
  if (t->pid == getpid()) return STAB_OK;
  return stabi_fail(STAB_ESTATE, "%s: %s: the trace belongs to process %ld, which opened it; this process (%ld) "
                    "was forked from it and may only close its copy", who, t->path, (long)t->pid, (long)getpid());
}

stab_trace_params stab_trace_default_params(void) {
  stab_trace_params p;
  memset(&p, 0, sizeof p);
  p.flush_every = 0;
  p.flush_seconds = 1.0;
  p.on_error = STAB_TRACE_STOP;
  return p;
}

/* ---- HDF5 errors --------------------------------------------------------------------- */

/* The library never prints: HDF5's automatic error printing is off while we call it, and the
 * caller's own setting is back when we return. */
typedef struct {
  H5E_auto2_t fn;
  void *data;
} quiet;

static void quiet_begin(quiet *q) {
  q->fn = NULL;
  q->data = NULL;
  H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data);
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void quiet_end(const quiet *q) { H5Eset_auto2(H5E_DEFAULT, q->fn, q->data); }

typedef struct {
  int n;
  char outer[160], inner[240];
} walk_state;

/* HDF5's file drivers describe a failed system call in one long line: "file write failed:
 * time = ..., filename = '<path>.<pid>.tmp', file descriptor = 3, errno = 28, error message =
 * 'No space left on device', buf = 0x..., total write size = 48, ...". The user gave neither
 * the temporary name nor cares for addresses and sizes: keep what failed and the system's
 * words ("file write failed: No space left on device"). Other messages are kept as they are. */
static void plain_words(char *s) {
  static const char em[] = "error message = '";
  char *m = strstr(s, em);
  if (!m) return;
  char why[128];
  const char *w = m + sizeof em - 1;
  size_t n = strcspn(w, "'");
  snprintf(why, sizeof why, "%.*s", (int)(n < sizeof why ? n : sizeof why - 1), w);
  /* what failed: the text before the first "key = value" detail */
  char *cut = s + strlen(s);
  static const char *const keys[] = {" time = ", " name = ", " filename = ", " errno = "};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    char *c = strstr(s, keys[k]);
    if (c && c < cut) cut = c;
  }
  while (cut > s && (cut[-1] == ' ' || cut[-1] == ',' || cut[-1] == ':')) cut--;
  char out[240];
  snprintf(out, sizeof out, "%.*s%s%s", (int)(cut - s), s, cut > s ? ": " : "", why);
  strcpy(s, out); /* out is at most as long as the buffer s lives in (240) */
}

/* Walked from the API call down: the first record says what was asked, the last (deepest) says
 * why it failed, e.g. the errno text of a file that cannot be created. */
static herr_t walk_cb(unsigned n, const H5E_error2_t *e, void *data) {
  walk_state *w = data;
  (void)n;
  const char *desc = e->desc && e->desc[0] ? e->desc : "(no description)";
  if (w->n == 0) snprintf(w->outer, sizeof w->outer, "%s", desc);
  snprintf(w->inner, sizeof w->inner, "%s", desc);
  for (char *c = w->inner; *c; c++) /* the file drivers' messages span lines */
    if (*c == '\n') *c = ' ';
  w->n++;
  return 0;
}

/* Records an HDF5 failure as STAB_EIO with the path, what failed (printf-style) and HDF5's own
 * message in words (plain_words). Called at the failure, before any other HDF5 call: each API
 * call clears the error stack on entry. */
__attribute__((format(printf, 3, 4)))
static stab_status h5fail(const char *who, const char *path, const char *fmt, ...) {
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  walk_state w;
  memset(&w, 0, sizeof w);
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk_cb, &w);
  if (w.n == 0) return stabi_fail(STAB_EIO, "%s: %s: %s (no HDF5 message)", who, path, what);
  plain_words(w.inner);
  if (w.n == 1) return stabi_fail(STAB_EIO, "%s: %s: %s: %s", who, path, what, w.inner);
  return stabi_fail(STAB_EIO, "%s: %s: %s: %s (%s)", who, path, what, w.inner, w.outer);
}

/* ---- names ----------------------------------------------------------------------------- */

/* A layer's group name: '/' is HDF5's path separator, so it becomes '.'. */
static char *group_name(const char *name) {
  size_t n = strlen(name) + 1;
  char *g = malloc(n);
  if (!g) return NULL;
  for (size_t i = 0; i < n; i++) g[i] = name[i] == '/' ? '.' : name[i];
  return g;
}

static const char *layout_name(const stab_layer *l) {
  switch (l->kind) {
  case STAB_KIND_LINEAR:
  case STAB_KIND_ATTENTION: return l->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "out_major";
  case STAB_KIND_EMBEDDING: return l->layout == STAB_LAYOUT_OUT_MAJOR ? "out_major" : "rows";
  case STAB_KIND_LM_HEAD: return l->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "rows";
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS: break;
  }
  return "rows";
}

static int64_t param_count(const stab_layer *l) {
  int64_t io = (int64_t)l->d_in * (int64_t)l->d_out;
  switch (l->kind) {
  case STAB_KIND_LINEAR: return io + (l->bias ? (int64_t)l->d_out : 0);
  case STAB_KIND_ATTENTION: /* q, and k of kv_heads heads of the same width */
    return io + (int64_t)l->d_in * (int64_t)(l->d_out / (l->heads ? l->heads : 1) * (l->kv_heads ? l->kv_heads : l->heads));
  case STAB_KIND_EMBEDDING:
  case STAB_KIND_LM_HEAD: return io;
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS: break;
  }
  return (int64_t)l->d_in;
}

/* Heads of layer l whose bounds the trace records. */
static size_t layer_heads(const stab_layer *l) { return l->kind == STAB_KIND_ATTENTION ? l->heads : 0; }

/* The datasets of /layers along the layer dimension (format 4), written once at creation:
 * layer (the names, the dimension's scale), then what format 3 kept in each layer's attributes.
 * The first STATIC_STRINGS hold strings, the others int64. With heads, head (each head's number
 * in its layer, the scale of the head dimension) and head_layer (its layer's name). */
enum { N_STATIC = 9, STATIC_STRINGS = 5 };
static const char *const static_names[N_STATIC] = {"layer", "kind", "layout", "description", "shares_storage_with",
                                                   "d_in", "d_out", "param_count", "param_count_unique"};
static const char *const head_names[2] = {"head", "head_layer"};

/* The name of the per-layer dataset of cols[k] (k >= first_metric, not head_bound). */
static const char *column_name(const stab_trace *t, size_t k, const char *const *extras) {
  k -= t->first_metric;
  if (k < N_METRICS) return metric_names[k];
  if (k < N_METRICS + N_RATIOS) return ratio_names[k - N_METRICS];
  return extras[k - (t->first_extra - t->first_metric)];
}

/* A declared name is one link name: not empty, no '/', not "." and unique in its list. */
static stab_status check_names(const char *who, const char *what, const char *const *names,
                               size_t n, int not_metric) {
  if (n && !names) return stabi_fail(STAB_EINVAL, "%s: %s is NULL but its count is %zu", who, what, n);
  for (size_t i = 0; i < n; i++) {
    const char *s = names[i];
    if (!s || !s[0]) return stabi_fail(STAB_EINVAL, "%s: %s[%zu] is empty", who, what, i);
    if (strchr(s, '/') || strcmp(s, ".") == 0)
      return stabi_fail(STAB_EINVAL, "%s: %s[%zu] '%s' is not a valid dataset name", who, what, i, s);
    if (strcmp(s, "step") == 0) /* every group links /step under that name */
      return stabi_fail(STAB_EINVAL, "%s: %s[%zu] 'step' is taken: each group holds /step under that name", who,
                        what, i);
    for (size_t j = 0; j < i; j++)
      if (strcmp(names[j], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is declared twice", who, what, s);
    if (!not_metric) continue;
    for (size_t k = 0; k < N_METRICS; k++)
      if (strcmp(metric_names[k], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is the name of a metric", who, what, s);
    for (size_t k = 0; k < N_RATIOS; k++)
      if (strcmp(ratio_names[k], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is the name of a metric's ratio", who, what, s);
    if (strncmp(s, "head", 4) == 0 && strstr(s, "_bound"))
      return stabi_fail(STAB_EINVAL, "%s: %s '%s' may clash with an attention head's dataset", who, what, s);
    for (size_t k = 0; k < N_STATIC + 2; k++)
      if (strcmp(k < N_STATIC ? static_names[k] : head_names[k - N_STATIC], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is taken: /layers/%s describes the layers", who, what, s, s);
  }
  return STAB_OK;
}

/* ---- attributes ------------------------------------------------------------------------ */

static hid_t string_type(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return t;
  if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
    H5Tclose(t);
    return H5I_INVALID_HID;
  }
  return t;
}

/* An attribute holding one value of type `mem` (stored as `file_type`). Returns < 0 on failure
 * with HDF5's message still on the error stack. */
static herr_t put_attr(hid_t obj, const char *name, hid_t file_type, hid_t mem, const void *value) {
  herr_t rc = -1;
  hid_t space = H5I_INVALID_HID, a = H5I_INVALID_HID;
  if ((space = H5Screate(H5S_SCALAR)) < 0) goto out;
  if ((a = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT)) < 0) goto out;
  if (H5Awrite(a, mem, value) < 0) goto out;
  rc = 0;
out:
  /* On failure, closing would clear the error stack before h5fail reads it. */
  if (rc == 0) {
    rc = H5Aclose(a);
    if (H5Sclose(space) < 0) rc = -1;
  }
  return rc;
}

static herr_t put_string(hid_t obj, const char *name, hid_t str, const char *value) {
  return put_attr(obj, name, str, str, &value);
}

static herr_t put_int(hid_t obj, const char *name, int64_t value) {
  return put_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

/* Reads a string attribute into buf (truncated to len). Returns < 0 when missing or unreadable. */
static herr_t get_string(hid_t obj, const char *name, hid_t str, char *buf, size_t len) {
  herr_t rc = -1;
  char *value = NULL;
  buf[0] = '\0';
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  if (H5Aread(a, str, &value) >= 0 && value) {
    snprintf(buf, len, "%s", value);
    H5free_memory(value);
    rc = 0;
  }
  H5Aclose(a);
  return rc;
}

static herr_t get_int(hid_t obj, const char *name, int64_t *value) {
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  herr_t rc = H5Aread(a, H5T_NATIVE_INT64, value);
  H5Aclose(a);
  return rc;
}

/* ---- one writer per trace: the lock protocol ------------------------------------------ */

/* HDF5 1.10 gives up its own file lock once SWMR writing starts, and a resume clears the mark a
 * killed writer leaves: the trace needs a lock of its own. It is an open-file-description lock
 * (Linux F_OFD_SETLK, whole file, write) held on a descriptor of ours for as long as the trace
 * is open: HDF5 closing its own descriptors does not drop it (a POSIX record lock would go), it
 * does not touch HDF5's flock, and the kernel drops it when the writer dies.
 *
 * The protocol. A lock belongs to an inode, and a path can be made to name another inode by
 * rename, so every writer (1) locks the inode before writing it, and (2) changes what the path
 * names only while holding the lock of the inode it names, or with an atomic "only if nothing
 * is there":
 *  - new trace, path absent: the trace is built under a temporary name in the same directory
 *    (created O_EXCL, locked at once, HDF5 started in SWMR mode on it), then published with
 *    renameat2(RENAME_NOREPLACE), or link() + unlink() where the file system refuses that flag.
 *    EEXIST means another writer published first: start again from the top (which now finds
 *    the path present).
 *  - new trace, path present (replacing a finished trace): after building the temporary file,
 *    lock the file at path, check that path still names the inode locked (stat against fstat:
 *    dev and ino), and rename over it while holding that lock. Busy: STAB_EBUSY. Not the same
 *    inode any more: another writer replaced it meanwhile; start again from the top.
 *  - append, path present: lock the file at path, check that path still names it (as above),
 *    then let HDF5 open it. Path absent: a new trace, as above, except that a path present by
 *    the time of publishing (another writer's new trace, perhaps finished already) is never
 *    replaced: start again, which appends to it.
 * Two writers on one path, every interleaving (the winner is whoever takes a lock first or
 * publishes first; the other gets STAB_EBUSY and leaves nothing behind):
 *  - create/create: both NOREPLACE; one rename succeeds, the other's fails with EEXIST, it
 *    starts again, finds the path locked by the winner: busy.
 *  - create/replace: the creator publishes first: the replacer then locks the creator's inode
 *    (busy) or had locked the old inode, and rechecking finds a new inode: again, then busy.
 *    The replacer renames first: the creator's NOREPLACE fails, then busy.
 *  - replace/replace: both lock the old inode; one gets it, renames, and only then drops the
 *    old lock; the other either fails to lock (busy) or locks the dead old inode and its
 *    recheck sees the winner's inode: again, then busy.
 *  - append/replace, append/append: whoever locks the inode at path first holds it; the
 *    other is busy, or (having locked an inode since replaced) sees the recheck fail: again.
 * A writer killed at any step: before publishing, it leaves its temporary file (named with its
 * pid) and no lock; after, a trace at path whose lock the kernel dropped, to be appended to (the
 * SWMR mark is cleared) or replaced. Nothing a live writer holds is ever renamed over.
 * "Start again" is tried three times, then STAB_EBUSY. The protocol binds writers using this
 * library; anything else renaming or deleting files in the directory is not excluded. */
#ifdef F_OFD_SETLK
#define LOCK_SET F_OFD_SETLK
#else
#define LOCK_SET F_SETLK
#endif

enum { OPEN_ATTEMPTS = 3 };

/* Takes the write lock of the open file fd. 0, or the errno (EAGAIN / EACCES: held by another). */
static int lock_fd(int fd) {
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET; /* l_start = l_len = 0: the whole file */
  return fcntl(fd, LOCK_SET, &fl) == 0 ? 0 : errno;
}

static stab_status busy(const char *who, const char *path) {
  return stabi_fail(STAB_EBUSY, "%s: %s: another process is writing this trace (it holds its lock)", who, path);
}

/* Opens and locks the regular file at path for writing, and checks that path still names the
 * inode locked. *fd is the locked descriptor, or -1 with *again set when path changed (or
 * vanished) under us; STAB_EBUSY when another writer holds it. what: "append to" / "replace". */
static stab_status lock_path(const char *who, const char *path, const char *what, int *fd, int *again) {
  *fd = -1;
  int f = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC); /* non-blocking: a FIFO must not hang us */
  if (f < 0) {
    if (errno == ENOENT) return *again = 1, STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot open it to lock it (to %s it): %s", who, path, what, strerror(errno));
  }
  struct stat held, now;
  if (fstat(f, &held) != 0 || !S_ISREG(held.st_mode)) {
    close(f);
    return stabi_fail(STAB_EIO, "%s: %s: not a regular file: cannot %s it", who, path, what);
  }
  int e = lock_fd(f);
  if (e) {
    close(f);
    if (e == EAGAIN || e == EACCES) return busy(who, path);
    return stabi_fail(STAB_EIO, "%s: %s: cannot lock it: %s", who, path, strerror(e));
  }
  if (stat(path, &now) != 0 || now.st_dev != held.st_dev || now.st_ino != held.st_ino) {
    close(f); /* locked an inode that path no longer names */
    return *again = 1, STAB_OK;
  }
  *fd = f;
  return STAB_OK;
}

/* Makes the complete temporary file tmp (locked by t) the trace at t->path, never replacing a
 * file another writer holds (see the protocol above). A writer asked to append that finds a
 * trace there now (another writer published it meanwhile and may have finished) appends to it
 * instead: *again. *again: start the open again. */
static stab_status publish(stab_trace *t, const char *who, const char *tmp, int append, int *again) {
  struct stat sb;
  int present = stat(t->path, &sb) == 0; /* a file, reached through symbolic links */
  if (present && append) return *again = 1, STAB_OK; /* to append (or, STAB_OUTPUT_NEW, to refuse) */
  if (!present && lstat(t->path, &sb) == 0 && S_ISLNK(sb.st_mode)) {
    /* a symbolic link to nothing: no writer can hold it, and renaming replaces the link itself
     * (a file made at its target meanwhile is left where it is) */
    if (rename(tmp, t->path) == 0) return STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
  }
  if (lstat(t->path, &sb) != 0) {
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, t->path, RENAME_NOREPLACE) == 0) return STAB_OK;
    if (errno == EEXIST) return *again = 1, STAB_OK;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      return stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
#endif
    /* a file system without RENAME_NOREPLACE: link() fails with EEXIST as atomically */
    if (link(tmp, t->path) == 0) {
      unlink(tmp);
      return STAB_OK;
    }
    if (errno == EEXIST) return *again = 1, STAB_OK;
    return stabi_fail(STAB_EIO, "%s: %s: cannot link the new trace to it: %s", who, t->path, strerror(errno));
  }
  int old = -1;
  stab_status st = lock_path(who, t->path, "replace", &old, again);
  if (st != STAB_OK || old < 0) return st;
  if (rename(tmp, t->path) != 0)
    st = stabi_fail(STAB_EIO, "%s: %s: cannot rename the new trace to it: %s", who, t->path, strerror(errno));
  close(old); /* only now may another writer lock the replaced file, and find it replaced */
  return st;
}

/* ---- disk space, reserved before HDF5 needs it ---------------------------------------- */

/* HDF5 1.10.8 does not recover from a failed write: the file's flush fails, so does its close,
 * and the library then crashes or reports an "infinite loop closing library" at exit. So HDF5
 * must never meet a full disk: the bytes a flush may add are allocated beforehand, beyond the
 * file's end (fallocate, FALLOC_FL_KEEP_SIZE: the size HDF5 sees does not change), and when they
 * cannot be, the trace fails by itself before HDF5 writes anything (the file stays as the last
 * flush left it and closes cleanly). Where the file system has no fallocate, nothing is
 * reserved and a full disk reaches HDF5 as before. The reserve is given back at close. */

/* The chunk of a dataset of `width` values a row: rows x values (see CHUNK_VALUES). */
static void chunk_of(size_t width, size_t *rows, size_t *values) {
  size_t c = width < CHUNK_LAYERS ? width : CHUNK_LAYERS, r = CHUNK_ROWS;
  if (c == 0) c = 1;
  while (r > 1 && r * c > CHUNK_VALUES) r /= 2;
  *rows = r, *values = c;
}

/* The most a flush of `rows` rows can add to the file. Each dataset's rows fill chunks of
 * chunk_of's rows; a flush may start new rows of chunks (each ceil(width / values) chunks): their
 * bytes, plus the growth of the dataset's chunk index. That index is an extensible array whose
 * blocks grow with it (16 addresses at first, about as many as it holds later, in pages of
 * 1024): a block that chunk k may start holds at most k + 16 addresses of 8 bytes, capped at a
 * page; a KiB more covers the block headers and a new super block. A flush that starts no chunk
 * rewrites what exists in place. The constant covers HDF5's metadata and small-data
 * aggregators' blocks and the object headers' growth. */
static off_t reserve_bytes(const stab_trace *t, size_t rows) {
  off_t sum = (off_t)256 * 1024;
  const size_t w = (size_t)t->written;
  for (size_t k = 0; k < t->n_cols && rows; k++) {
    size_t cr, cv;
    chunk_of(t->cols[k].width, &cr, &cv);
    const size_t across = (t->cols[k].width + cv - 1) / cv, now = (w + cr - 1) / cr, then = (w + rows + cr - 1) / cr;
    if (then == now) continue;
    const size_t chunks = (then - now) * (across ? across : 1), last = then * (across ? across : 1);
    const size_t index = (8 * (last + 16 < 1024 ? last + 16 : 1024) + 1024) * (chunks / 1024 + 1);
    sum += (off_t)(chunks * cr * cv * 8 + index);
  }
  return sum;
}

/* Makes sure reserve_bytes(rows) past the end of the file are allocated, for a flush of `rows`
 * rows. STAB_EIO naming the path and the system's words when the disk (or the quota) has no
 * room. */
static stab_status reserve(stab_trace *t, const char *who, size_t rows) {
  if (t->no_reserve || t->lock_fd < 0) return STAB_OK;
  struct stat sb;
  if (fstat(t->lock_fd, &sb) != 0)
    return stabi_fail(STAB_EIO, "%s: %s: cannot stat it: %s", who, t->path, strerror(errno));
  const off_t r = reserve_bytes(t, rows);
  if (sb.st_size + r <= t->reserved) return STAB_OK;
  /* twice what is needed, so that most flushes make no call; on a nearly full disk, what is */
  for (int k = 2; k >= 1; k--) {
    int rc;
    while ((rc = fallocate(t->lock_fd, FALLOC_FL_KEEP_SIZE, sb.st_size, k * r)) != 0 && errno == EINTR) {}
    if (rc == 0) {
      if (sb.st_size + k * r > t->reserved) t->reserved = sb.st_size + k * r;
      return STAB_OK;
    }
    if (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL) {
      t->no_reserve = 1;
      return STAB_OK;
    }
    if (errno != ENOSPC && errno != EDQUOT) break;
  }
  return stabi_fail(STAB_EIO, "%s: %s: no room on the disk for the next rows (they need up to %lld bytes): %s",
                    who, t->path, (long long)r, strerror(errno));
}

/* Gives back the reserve beyond the file's end (after HDF5 closed it: its size is final).
 * Truncating to the size the file has frees the blocks past its end; a hole punched there
 * would not (ext4 ignores a punch beyond the end of the file: a 556 KB trace kept 1.8 MB). */
static void unreserve(stab_trace *t) {
  struct stat sb;
  if (t->lock_fd < 0 || t->reserved <= 0 || fstat(t->lock_fd, &sb) != 0 || sb.st_size >= t->reserved) return;
  while (ftruncate(t->lock_fd, sb.st_size) != 0 && errno == EINTR) {
    /* another failure leaves the blocks allocated until the file is truncated or removed:
     * space, never data */
  }
  t->reserved = 0;
}

/* ---- creating and checking the file ---------------------------------------------------- */

typedef struct {
  const char *who, *path;
  const stab_trace_params *p;
  hid_t str;          /* variable-length UTF-8 string type */
  const stabi_sharing *share; /* which layers share storage */
} builder;

/* Creates cols[k] as loc/name: one-dimensional (rank 1), or (step, width) (rank 2), extendable
 * along the steps, chunked as chunk_of says; float64 with NaN as its fill value, or int64. */
static stab_status new_column(stab_trace *t, const builder *b, hid_t loc, const char *name, size_t k, int is_int) {
  column *c = &t->cols[k];
  size_t cr, cv;
  chunk_of(c->rank == 2 ? c->width : 1, &cr, &cv);
  const hsize_t dims[2] = {0, c->width}, max[2] = {H5S_UNLIMITED, c->width ? c->width : H5S_UNLIMITED},
                chunk[2] = {cr, cv};
  const double nan = NAN;
  stab_status st = STAB_OK;
  hid_t space = H5Screate_simple(c->rank, dims, max), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (space < 0 || dcpl < 0 || H5Pset_chunk(dcpl, c->rank, chunk) < 0 ||
      (!is_int && H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan) < 0) ||
      (c->d = H5Dcreate2(loc, name, is_int ? H5T_STD_I64LE : H5T_IEEE_F64LE, space, H5P_DEFAULT, dcpl,
                         H5P_DEFAULT)) < 0)
    st = h5fail(b->who, b->path, "cannot create dataset '%s'", name);
  if (space >= 0) H5Sclose(space);
  if (dcpl >= 0) H5Pclose(dcpl);
  return st;
}

/* ---- the description: dimension scales, units, words ----------------------------------- */

static herr_t set_string(hid_t obj, const char *name, hid_t str, const char *value) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return -1;
  return put_string(obj, name, str, value);
}

/* Dataset d (where/name, for messages) gets `scale` as the scale of its dimension dim. */
static stab_status attach(const builder *b, hid_t d, hid_t scale, unsigned dim, const char *where, const char *name) {
  htri_t on = H5DSis_attached(d, scale, dim);
  if (on < 0 || (!on && H5DSattach_scale(d, scale, dim) < 0))
    return h5fail(b->who, b->path, "cannot attach a dimension scale to %s/%s", where, name);
  return STAB_OK;
}

static stab_status make_scale(const builder *b, hid_t d, const char *where, const char *name) {
  htri_t is = H5DSis_scale(d);
  if (is < 0 || (!is && H5DSset_scale(d, name) < 0))
    return h5fail(b->who, b->path, "cannot make %s/%s a dimension scale", where, name);
  return STAB_OK;
}

/* Dataset d's units and long_name (key names its row in words) for a dataset of /step,
 * /wall_time or /scalars (kind NOT_LAYER). */
static stab_status describe_dataset(const builder *b, hid_t d, const char *where, const char *name, const char *key,
                                    int kind) {
  const wording *w = wording_of(key, kind);
  if (set_string(d, "long_name", b->str, w ? w->long_name : name) < 0 ||
      (w && set_string(d, "units", b->str, w->units) < 0))
    return h5fail(b->who, b->path, "cannot write the units of %s/%s", where, name);
  return STAB_OK;
}

/* The units and long_name of a per-layer dataset (key: its row in words), whose layers may be
 * of several kinds with different words (forward is in nats for an LM head): the words every
 * kind present shares are units and long_name; where kinds differ, units_<kind> and
 * long_name_<kind> for each kind present, and long_name the words before the first ':'. */
static stab_status describe_per_layer(const stab_trace *t, const builder *b, hid_t d, const char *name,
                                      const char *key) {
  const wording *first = NULL;
  int same_units = 1, same_words = 1, present[STAB_KIND_ATTENTION + 1] = {0};
  for (size_t i = 0; i < t->n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    const wording *w = (size_t)l->kind > STAB_KIND_ATTENTION ? NULL : wording_of(key, (int)l->kind);
    if (!w || present[l->kind]) continue; /* a kind the dataset says nothing of: head_bound of a linear layer */
    present[l->kind] = 1;
    if (!first) first = w;
    same_units &= strcmp(w->units, first->units) == 0;
    same_words &= w == first;
  }
  char text[160];
  const char *lname = first ? first->long_name : name;
  if (first && !same_words) {
    size_t n = strcspn(first->long_name, ":");
    snprintf(text, sizeof text, "%.*s (in words for each kind: long_name_<kind>)", (int)n, first->long_name);
    lname = text;
  }
  if (set_string(d, "long_name", b->str, lname) < 0 || (first && same_units && set_string(d, "units", b->str, first->units) < 0))
    return h5fail(b->who, b->path, "cannot write the units of /layers/%s", name);
  for (int k = 0; k <= STAB_KIND_ATTENTION && first && (!same_units || !same_words); k++) {
    const wording *w = present[k] ? wording_of(key, k) : NULL;
    if (!w) continue;
    char an[64];
    snprintf(an, sizeof an, "units_%s", stab_kind_name((stab_kind)k));
    if (!same_units && set_string(d, an, b->str, w->units) < 0) return h5fail(b->who, b->path, "cannot write %s", an);
    snprintf(an, sizeof an, "long_name_%s", stab_kind_name((stab_kind)k));
    if (!same_words && set_string(d, an, b->str, w->long_name) < 0)
      return h5fail(b->who, b->path, "cannot write %s", an);
  }
  return STAB_OK;
}

/* A one-dimensional dataset loc/name of n values, written whole: strings (str) or int64. */
static stab_status put_array(const builder *b, hid_t loc, const char *name, const char *const *strings,
                             const int64_t *ints, size_t n, hid_t *out) {
  hsize_t dim = n;
  stab_status st = STAB_OK;
  hid_t space = H5Screate_simple(1, &dim, NULL);
  *out = space < 0 ? H5I_INVALID_HID
                   : H5Dcreate2(loc, name, strings ? b->str : H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (*out < 0 || (n && H5Dwrite(*out, strings ? b->str : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 strings ? (const void *)strings : (const void *)ints) < 0))
    st = h5fail(b->who, b->path, "cannot write /layers/%s", name);
  if (space >= 0) H5Sclose(space);
  return st;
}

/* What each layer is, along the layer dimension (static_names), and with heads, the head
 * dimension. layers is /layers; lstep its copy of /step. The other datasets of /layers are
 * then attached to the scales (describe_columns). */
static stab_status create_statics(stab_trace *t, const builder *b, hid_t layers, char *const *gnames, hid_t *scale,
                                  hid_t *head) {
  const size_t n = t->n_layers, nh = t->n_heads;
  stab_status st = STAB_OK;
  const char **s = calloc((n ? n : 1) * STATIC_STRINGS, sizeof *s);
  char *text = malloc((n ? n : 1) * 512);
  int64_t *v = malloc((n ? n : 1) * (N_STATIC - STATIC_STRINGS) * sizeof *v);
  int64_t *hv = malloc((nh ? nh : 1) * sizeof *hv);
  const char **hl = malloc((nh ? nh : 1) * sizeof *hl);
  char **with = calloc(n ? n : 1, sizeof *with);
  if (!s || !text || !v || !hv || !hl || !with) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    describe_layer(l, stabi_monitor_shape(t->m, i), text + i * 512, 512);
    size_t len = 1;
    for (size_t k = 0; k < b->share->n_with[i]; k++) len += strlen(gnames[b->share->with[i][k]]) + 1;
    if (!(with[i] = malloc(len))) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
      goto out;
    }
    with[i][0] = '\0';
    for (size_t k = 0; k < b->share->n_with[i]; k++) {
      if (k) strcat(with[i], " ");
      strcat(with[i], gnames[b->share->with[i][k]]);
    }
    const char *row[STATIC_STRINGS] = {gnames[i], stab_kind_name(l->kind), layout_name(l), text + i * 512, with[i]};
    for (size_t k = 0; k < STATIC_STRINGS; k++) s[k * n + i] = row[k];
    const int64_t num[N_STATIC - STATIC_STRINGS] = {(int64_t)l->d_in, (int64_t)l->d_out, param_count(l),
                                                    b->share->unique[i]};
    for (size_t k = 0; k < N_STATIC - STATIC_STRINGS; k++) v[k * n + i] = num[k];
    for (size_t h = 0; h < layer_heads(l); h++) hv[t->head_first[i] + h] = (int64_t)h, hl[t->head_first[i] + h] = gnames[i];
  }
  for (size_t k = 0; k < N_STATIC && st == STAB_OK; k++) {
    hid_t d = H5I_INVALID_HID;
    st = k < STATIC_STRINGS ? put_array(b, layers, static_names[k], s + k * n, NULL, n, &d)
                            : put_array(b, layers, static_names[k], NULL, v + (k - STATIC_STRINGS) * n, n, &d);
    if (st == STAB_OK && k == 0) st = make_scale(b, d, "/layers", "layer");
    else if (st == STAB_OK) st = attach(b, d, *scale, 0, "/layers", static_names[k]);
    if (st == STAB_OK && d >= 0) {
      static const char *const said[N_STATIC] = {
          "layer name (a '/' of the monitor's name as '.')", "layer kind", "how the weight is stored",
          "the layer's kind and stored shape in words", "the other layers sharing some of its storage (space-separated)",
          "input width", "output width", "parameters the layer's metrics read",
          "parameters no other layer of the trace reads"};
      if (set_string(d, "long_name", b->str, said[k]) < 0 || (k >= STATIC_STRINGS && set_string(d, "units", b->str, "1") < 0))
        st = h5fail(b->who, b->path, "cannot describe /layers/%s", static_names[k]);
    }
    if (k == 0 && st == STAB_OK) *scale = d; /* closed by create_file */
    else if (d >= 0) H5Dclose(d);
  }
  if (st == STAB_OK && nh) {
    hid_t d = H5I_INVALID_HID;
    if ((st = put_array(b, layers, head_names[0], NULL, hv, nh, head)) == STAB_OK)
      st = make_scale(b, *head, "/layers", "head");
    if (st == STAB_OK && set_string(*head, "long_name", b->str, "attention head's number in its layer") < 0)
      st = h5fail(b->who, b->path, "cannot describe /layers/head");
    if (st == STAB_OK) st = put_array(b, layers, head_names[1], hl, NULL, nh, &d);
    if (st == STAB_OK) st = attach(b, d, *head, 0, "/layers", head_names[1]);
    if (st == STAB_OK && set_string(d, "long_name", b->str, "the attention head's layer") < 0)
      st = h5fail(b->who, b->path, "cannot describe /layers/head_layer");
    if (d >= 0) H5Dclose(d);
  }
out:
  if (with)
    for (size_t i = 0; i < n; i++) free(with[i]);
  free(with), free(s), free(text), free(v), free(hv), free(hl);
  return st;
}

/* Builds the new trace, without rows, in the file t->file, created with fapl (in memory: see
 * create_new). Every column is created and described: /step and the groups' copies of it are
 * the step dimension's scales, /layers/layer the layer dimension's, /layers/head the heads'. */
static stab_status create_file(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames,
                               const char *created, const char *run_config) {
  const stab_trace_params *p = b->p;
  stab_status st = STAB_OK;
  hid_t scalars = H5I_INVALID_HID, layers = H5I_INVALID_HID, scale = H5I_INVALID_HID, head = H5I_INVALID_HID;
  t->file = H5Fcreate(b->path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  if (t->file < 0) return h5fail(b->who, b->path, "cannot create the file");

  if (put_string(t->file, "format", b->str, "stabmeter-trace") < 0 || put_int(t->file, "format_version", FORMAT_VERSION) < 0 ||
      put_string(t->file, "library_version", b->str, stab_version()) < 0 ||
      put_string(t->file, "created_utc", b->str, created) < 0 ||
      put_string(t->file, "run_config", b->str, run_config ? run_config : "{}") < 0)
    return h5fail(b->who, b->path, "cannot write the root attributes");

  if ((st = new_column(t, b, t->file, "step", COL_STEP, 1)) != STAB_OK) return st;
  if ((st = new_column(t, b, t->file, "wall_time", COL_WALL, 0)) != STAB_OK) return st;
  if ((scalars = H5Gcreate2(t->file, "scalars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0 ||
      (layers = H5Gcreate2(t->file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)) < 0) {
    st = h5fail(b->who, b->path, "cannot create the groups /scalars and /layers");
    goto out;
  }
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++) st = new_column(t, b, scalars, p->scalars[s], FIRST_SCALAR + s, 0);
  if (st == STAB_OK) st = new_column(t, b, scalars, "step", t->first_copy, 1);
  if (st == STAB_OK) st = new_column(t, b, layers, "step", t->first_copy + 1, 1);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++)
    st = new_column(t, b, layers, k == t->head_col && k ? "head_bound" : column_name(t, k, p->layer_extras), k, 0);
  if (st == STAB_OK) st = create_statics(t, b, layers, gnames, &scale, &head);

  /* the scales and the words */
  const hid_t step = t->cols[COL_STEP].d, sstep = t->cols[t->first_copy].d, lstep = t->cols[t->first_copy + 1].d;
  if (st == STAB_OK) st = make_scale(b, step, "", "step");
  if (st == STAB_OK) st = describe_dataset(b, step, "", "step", "step", NOT_LAYER);
  if (st == STAB_OK) st = attach(b, t->cols[COL_WALL].d, step, 0, "", "wall_time");
  if (st == STAB_OK) st = describe_dataset(b, t->cols[COL_WALL].d, "", "wall_time", "wall_time", NOT_LAYER);
  if (st == STAB_OK) st = make_scale(b, sstep, "/scalars", "step");
  if (st == STAB_OK) st = describe_dataset(b, sstep, "/scalars", "step", "step", NOT_LAYER);
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++) {
    st = attach(b, t->cols[FIRST_SCALAR + s].d, sstep, 0, "/scalars", p->scalars[s]);
    if (st == STAB_OK) st = describe_dataset(b, t->cols[FIRST_SCALAR + s].d, "/scalars", p->scalars[s], p->scalars[s], NOT_LAYER);
  }
  if (st == STAB_OK) st = make_scale(b, lstep, "/layers", "step");
  if (st == STAB_OK) st = describe_dataset(b, lstep, "/layers", "step", "step", NOT_LAYER);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++) {
    const int heads = k == t->head_col && k;
    const char *name = heads ? "head_bound" : column_name(t, k, p->layer_extras);
    st = attach(b, t->cols[k].d, lstep, 0, "/layers", name);
    if (st == STAB_OK) st = attach(b, t->cols[k].d, heads ? head : scale, 1, "/layers", name);
    if (st == STAB_OK) st = describe_per_layer(t, b, t->cols[k].d, name, name);
  }
out:
  if (scalars >= 0) H5Gclose(scalars);
  if (layers >= 0) H5Gclose(layers);
  if (scale >= 0) H5Dclose(scale);
  if (head >= 0) H5Dclose(head);
  return st;
}

/* Opens dataset `name` of loc into cols[k], or says which one the trace lacks; checks its
 * rank and width. */
static stab_status open_column(stab_trace *t, const builder *b, hid_t loc, const char *where, const char *name,
                               size_t k) {
  column *c = &t->cols[k];
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: %s has no dataset '%s'", b->who, b->path,
                      where, name);
  if ((c->d = H5Dopen2(loc, name, H5P_DEFAULT)) < 0) return h5fail(b->who, b->path, "cannot open %s/%s", where, name);
  hsize_t dims[2];
  hid_t s = H5Dget_space(c->d);
  int rank = s < 0 ? -1 : H5Sget_simple_extent_ndims(s);
  if (rank == c->rank) H5Sget_simple_extent_dims(s, dims, NULL);
  if (s >= 0) H5Sclose(s);
  if (rank != c->rank || (rank == 2 && dims[1] != c->width))
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: %s/%s is not %s", b->who, b->path, where, name,
                      c->rank == 1 ? "one-dimensional" : c->width == t->n_layers ? "(step, layer) of the monitor's layers"
                                                                                 : "(step, head) of the monitor's heads");
  return STAB_OK;
}

static stab_status link_count(const builder *b, hid_t g, const char *where, hsize_t *n) {
  H5G_info_t info;
  if (H5Gget_info(g, &info) < 0) return h5fail(b->who, b->path, "cannot list %s", where);
  *n = info.nlinks;
  return STAB_OK;
}

/* Reads the one-dimensional dataset loc/name of n values: strings (into *strings, to free with
 * free_strings) or int64 (ints). */
static stab_status read_array(const builder *b, hid_t loc, const char *name, size_t n, char **strings, int64_t *ints) {
  if (H5Lexists(loc, name, H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers has no dataset '%s'", b->who, b->path, name);
  hid_t d = H5Dopen2(loc, name, H5P_DEFAULT), s = d < 0 ? H5I_INVALID_HID : H5Dget_space(d);
  hsize_t dim = 0;
  stab_status st = STAB_OK;
  if (s < 0 || H5Sget_simple_extent_ndims(s) != 1 || H5Sget_simple_extent_dims(s, &dim, NULL) < 0 || dim != n)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers/%s has %llu values, the monitor %zu", b->who,
                    b->path, name, (unsigned long long)dim, n);
  else if (n && H5Dread(d, strings ? b->str : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                        strings ? (void *)strings : (void *)ints) < 0)
    st = h5fail(b->who, b->path, "cannot read /layers/%s", name);
  if (s >= 0) H5Sclose(s);
  if (d >= 0) H5Dclose(d);
  return st;
}

static void free_strings(char **s, size_t n) {
  for (size_t i = 0; i < n; i++) H5free_memory(s[i]);
}

/* A version 4 trace's layers against the monitor's: the same names in the same order, each of
 * the same kind and shape, the same heads and extras. */
static stab_status check_layers(stab_trace *t, const builder *b, hid_t layers, char *const *gnames) {
  const size_t n = t->n_layers, nh = t->n_heads;
  stab_status st = STAB_OK;
  char **names = calloc(n ? n : 1, sizeof *names), **kinds = calloc(n ? n : 1, sizeof *kinds);
  char **hl = calloc(nh ? nh : 1, sizeof *hl);
  int64_t *d_in = malloc((n ? n : 1) * sizeof *d_in), *d_out = malloc((n ? n : 1) * sizeof *d_out);
  if (!names || !kinds || !hl || !d_in || !d_out) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
    goto out;
  }
  if ((st = read_array(b, layers, "layer", n, names, NULL)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "kind", n, kinds, NULL)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "d_in", n, NULL, d_in)) != STAB_OK) goto out;
  if ((st = read_array(b, layers, "d_out", n, NULL, d_out)) != STAB_OK) goto out;
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    if (!names[i] || strcmp(names[i], gnames[i]) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: its layer %zu is '%s', the monitor's '%s' (the "
                      "same layers in the same order)", b->who, b->path, i, names[i] ? names[i] : "", gnames[i]);
    else if (!kinds[i] || strcmp(kinds[i], stab_kind_name(l->kind)) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %s in the trace, %s in the monitor",
                      b->who, b->path, l->name, kinds[i] ? kinds[i] : "", stab_kind_name(l->kind));
    else if (d_in[i] != (int64_t)l->d_in || d_out[i] != (int64_t)l->d_out)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %lld x %lld (d_in x d_out) in the "
                      "trace, %zu x %zu in the monitor", b->who, b->path, l->name, (long long)d_in[i],
                      (long long)d_out[i], l->d_in, l->d_out);
  }
  if (st == STAB_OK && nh && (st = read_array(b, layers, "head_layer", nh, hl, NULL)) == STAB_OK)
    for (size_t i = 0; i < n && st == STAB_OK; i++)
      for (size_t h = 0; h < layer_heads(stab_monitor_layer(t->m, i)) && st == STAB_OK; h++)
        if (!hl[t->head_first[i] + h] || strcmp(hl[t->head_first[i] + h], gnames[i]) != 0)
          st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: other attention heads than the monitor's",
                          b->who, b->path);
out:
  if (names) free_strings(names, n);
  if (kinds) free_strings(kinds, n);
  if (hl) free_strings(hl, nh);
  free(names), free(kinds), free(hl), free(d_in), free(d_out);
  return st;
}

/* The rows of a dataset (its length along the steps). */
static stab_status dataset_rows(const builder *b, hid_t d, hsize_t *n) {
  hsize_t dims[2];
  hid_t s = H5Dget_space(d);
  int rank = s < 0 ? -1 : H5Sget_simple_extent_ndims(s);
  if (rank < 1 || rank > 2 || H5Sget_simple_extent_dims(s, dims, NULL) < 0) {
    stab_status st = h5fail(b->who, b->path, "a dataset is not one- or two-dimensional");
    if (s >= 0) H5Sclose(s);
    return st;
  }
  H5Sclose(s);
  *n = dims[0];
  return STAB_OK;
}

/* Sets column k's rows (its length along the steps). */
static herr_t set_rows(const stab_trace *t, size_t k, hsize_t rows) {
  const hsize_t dims[2] = {rows, t->cols[k].width};
  return H5Dset_extent(t->cols[k].d, dims);
}

/* Cuts every dataset back to the rows whose step is at most b->p->resume_step: the steps a
 * resumed run is about to redo. Steps only grow along /step, so those rows are a prefix. */
static stab_status drop_rows_after(stab_trace *t, const builder *b, hsize_t *rows) {
  int64_t *steps = malloc(*rows * sizeof *steps);
  if (!steps) return stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
  stab_status st = STAB_OK;
  if (H5Dread(t->cols[COL_STEP].d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps) < 0) {
    st = h5fail(b->who, b->path, "cannot read /step");
    goto out;
  }
  hsize_t keep = 0;
  while (keep < *rows && steps[keep] <= b->p->resume_step) keep++;
  for (size_t k = 0; keep < *rows && k < t->n_cols; k++)
    if (set_rows(t, k, keep) < 0) {
      st = h5fail(b->who, b->path, "cannot remove the rows after the resumed step");
      goto out;
    }
  *rows = keep;
out:
  free(steps);
  return st;
}

/* The step of the last of the file's rows, into t->last_step: later appends must come after it. */
static stab_status read_last_step(stab_trace *t, const builder *b, hsize_t rows) {
  hsize_t at = rows - 1, one = 1;
  hid_t fs = H5Dget_space(t->cols[COL_STEP].d), ms = H5Screate_simple(1, &one, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, &at, NULL, &one, NULL);
  if (rc >= 0) rc = H5Dread(t->cols[COL_STEP].d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, &t->last_step);
  stab_status st = rc < 0 ? h5fail(b->who, b->path, "cannot read the last step") : STAB_OK;
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  t->has_last = st == STAB_OK;
  return st;
}

/* Reads rows [first, first + n) of the two-dimensional dataset d (width values a row) into buf. */
static herr_t read_rows_2d(hid_t d, hsize_t first, hsize_t n, hsize_t width, hid_t type, void *buf) {
  const hsize_t start[2] = {first, 0}, count[2] = {n, width};
  hid_t fs = H5Dget_space(d), ms = H5Screate_simple(2, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  if (rc >= 0) rc = H5Dread(d, type, ms, fs, H5P_DEFAULT, buf);
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  return rc;
}

/* The reference of every layer from the file's rows (rows of them, after any cut back): the
 * first finite value > 0 of forward, dependency and update, as the monitor keeps it, so that a
 * resumed run divides by its first measurement, not by the first after the resume. Read a few
 * rows at a time, until every layer has its references: mostly the first rows. */
static stab_status read_references(stab_trace *t, const builder *b, hsize_t rows) {
  const size_t n = t->n_layers, block = n ? (CHUNK_VALUES * 8 + n - 1) / n : 1;
  for (size_t i = 0; i < n; i++) stabi_layer_measure_clear(&t->reference[i]);
  double *buf = malloc(block * (n ? n : 1) * sizeof *buf);
  if (!buf) return stabi_fail(STAB_ENOMEM, "%s: out of memory", b->who);
  stab_status st = STAB_OK;
  for (size_t j = 0; j < N_RATIOS && st == STAB_OK; j++) {
    size_t missing = n;
    for (hsize_t r0 = 0; r0 < rows && missing && st == STAB_OK; r0 += block) {
      const hsize_t m = rows - r0 < block ? rows - r0 : block;
      if (read_rows_2d(t->cols[t->first_metric + j].d, r0, m, n, H5T_NATIVE_DOUBLE, buf) < 0) {
        st = h5fail(b->who, b->path, "cannot read /layers/%s", metric_names[j]);
        break;
      }
      for (size_t i = 0; i < n; i++) {
        double *ref = reference_field(&t->reference[i], j);
        for (hsize_t r = 0; r < m && isnan(*ref); r++)
          if (isfinite(buf[r * n + i]) && buf[r * n + i] > 0) *ref = buf[r * n + i], missing--;
      }
    }
  }
  free(buf);
  return st;
}

static stab_status migrate_rows(stab_trace *t, const builder *b, hid_t old, int64_t version, char *const *gnames);

/* Opens the trace file `disk` (path itself, or the new trace's temporary file) with HDF5, checks
 * it against the monitor and the params and opens every dataset. t->lock_fd holds its lock. A
 * trace of format 1 to 3 is left open as it is (t->file_version says so), for migrate. */
static stab_status open_disk(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, const char *disk) {
  const stab_trace_params *p = b->p;
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  hid_t scalars = H5I_INVALID_HID, layers = H5I_INVALID_HID;
  if ((st = reserve(t, who, 0)) != STAB_OK) return st; /* cutting rows back writes too */
  t->file = H5Fopen(disk, H5F_ACC_RDWR, fapl);
  if (t->file < 0) {
    /* A writer killed in SWMR mode leaves the file marked as open for writing. Its data are
     * consistent (SWMR orders every flush), so the mark is cleared as h5clear -s does. */
    hbool_t clear = 1;
    H5Eclear2(H5E_DEFAULT);
    if (H5Pexist(fapl, "clear_status_flags") > 0 && H5Pset(fapl, "clear_status_flags", &clear) >= 0)
      t->file = H5Fopen(disk, H5F_ACC_RDWR, fapl);
    if (t->file < 0) return h5fail(who, path, "cannot open the trace to append");
  }

  char format[64];
  int64_t version = 0;
  if (get_string(t->file, "format", b->str, format, sizeof format) < 0 || strcmp(format, "stabmeter-trace") != 0 ||
      get_int(t->file, "format_version", &version) < 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no format = \"stabmeter-trace\")", who, path);
  if (version < 1 || version > FORMAT_VERSION)
    return stabi_fail(STAB_EINVAL, "%s: %s: trace format_version %lld, this library writes %d (and migrates 1 to 3)",
                      who, path, (long long)version, FORMAT_VERSION);
  t->file_version = version;
  if (version < FORMAT_VERSION) return STAB_OK;
  if ((st = open_column(t, b, t->file, "the root", "step", COL_STEP)) != STAB_OK) return st;
  if ((st = open_column(t, b, t->file, "the root", "wall_time", COL_WALL)) != STAB_OK) return st;
  if (H5Lexists(t->file, "scalars", H5P_DEFAULT) <= 0 || H5Lexists(t->file, "layers", H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no /scalars or /layers)", who, path);
  if ((scalars = H5Gopen2(t->file, "scalars", H5P_DEFAULT)) < 0 ||
      (layers = H5Gopen2(t->file, "layers", H5P_DEFAULT)) < 0) {
    st = h5fail(who, path, "cannot open /scalars or /layers");
    goto out;
  }
  hsize_t have = 0;
  for (size_t s = 0; s < t->n_scalars && st == STAB_OK; s++)
    st = open_column(t, b, scalars, "/scalars", p->scalars[s], FIRST_SCALAR + s);
  if (st == STAB_OK) st = open_column(t, b, scalars, "/scalars", "step", t->first_copy);
  if (st == STAB_OK) st = link_count(b, scalars, "/scalars", &have);
  if (st == STAB_OK && have != t->n_scalars + 1)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu scalars, %zu declared", who, path,
                    (unsigned long long)(have - 1), t->n_scalars);
  if (st == STAB_OK) st = open_column(t, b, layers, "/layers", "step", t->first_copy + 1);
  if (st == STAB_OK) st = check_layers(t, b, layers, gnames);
  for (size_t k = t->first_metric; k < t->n_cols && st == STAB_OK; k++)
    st = open_column(t, b, layers, "/layers", k == t->head_col && k ? "head_bound" : column_name(t, k, p->layer_extras), k);
  const hsize_t expected = 1 + N_STATIC + (t->n_heads ? 2 : 0) + (t->n_cols - t->first_metric);
  if (st == STAB_OK) st = link_count(b, layers, "/layers", &have);
  if (st == STAB_OK && have != expected)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /layers has %llu datasets, %llu expected (other "
                    "layer extras)", who, path, (unsigned long long)have, (unsigned long long)expected);
  if (st != STAB_OK) goto out;

  /* Every flush writes /step last, so its length is the row count; a flush cut short by a kill
   * or a failure may have left other datasets longer, and they are cut back to it here. */
  hsize_t rows;
  if ((st = dataset_rows(b, t->cols[COL_STEP].d, &rows)) != STAB_OK) goto out;
  for (size_t k = 1; k < t->n_cols; k++) {
    hsize_t n;
    if ((st = dataset_rows(b, t->cols[k].d, &n)) != STAB_OK) goto out;
    if (n < rows) {
      st = stabi_fail(STAB_EIO, "%s: %s: damaged trace: a dataset has %llu rows, /step %llu", who, path,
                      (unsigned long long)n, (unsigned long long)rows);
      goto out;
    }
    if (n > rows && set_rows(t, k, rows) < 0) {
      st = h5fail(who, path, "cannot cut back a row left incomplete");
      goto out;
    }
  }
  if (p->resume_step > 0 && rows > 0 && (st = drop_rows_after(t, b, &rows)) != STAB_OK) goto out;
  t->written = (int64_t)rows;
  if (rows > 0 && (st = read_last_step(t, b, rows)) != STAB_OK) goto out;
  st = read_references(t, b, rows);
out:
  if (scalars >= 0) H5Gclose(scalars);
  if (layers >= 0) H5Gclose(layers);
  return st;
}

/* ---- formats 1 to 3: migration ---------------------------------------------------------- */

/* A trace of format 1 to 3 holds a group per layer under /layers, of one-dimensional datasets
 * (forward, ..., head<h>_bound, the extras; from format 2 a copy of /step, from 3 the ratios).
 * Appending to one rewrites it as format 4: a new file is built in memory with the monitor's
 * layers (create_file), filled with the old file's rows here, written beside the trace and
 * renamed over it while the old file's lock is held (create_new). A writer killed before the
 * rename leaves the old trace as it was (and its temporary file); after it, the new one. */

/* Rows copied at a time: about a million values of one dataset. */
enum { MIGRATE_VALUES = 1 << 20 };

/* Reads rows [first, first + n) of the one-dimensional dataset at path in old into buf. */
static stab_status read_old(const builder *b, hid_t old, const char *path, hsize_t first, hsize_t n, hid_t type,
                            void *buf) {
  hid_t d = H5Dopen2(old, path, H5P_DEFAULT), fs = d < 0 ? H5I_INVALID_HID : H5Dget_space(d);
  hid_t ms = H5Screate_simple(1, &n, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, &first, NULL, &n, NULL);
  if (rc >= 0) rc = H5Dread(d, type, ms, fs, H5P_DEFAULT, buf);
  stab_status st = rc < 0 ? h5fail(b->who, b->path, "cannot read %s of the trace to migrate", path) : STAB_OK;
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
  if (d >= 0) H5Dclose(d);
  return st;
}

/* The old trace against the monitor, as format 3's writer checked it: every layer's group, of
 * the same kind and shape, with the metrics, heads and extras the monitor's trace has, and
 * nothing else; the declared scalars. */
static stab_status check_old(stab_trace *t, const builder *b, hid_t old, char *const *gnames) {
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  hsize_t have = 0;
  if (H5Lexists(old, "step", H5P_DEFAULT) <= 0 || H5Lexists(old, "wall_time", H5P_DEFAULT) <= 0 ||
      H5Lexists(old, "scalars", H5P_DEFAULT) <= 0 || H5Lexists(old, "layers", H5P_DEFAULT) <= 0)
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (no /step, /wall_time, /scalars or /layers)", who, path);
  for (size_t s = 0; s < t->n_scalars; s++) {
    char p[600];
    snprintf(p, sizeof p, "scalars/%s", b->p->scalars[s]);
    if (H5Lexists(old, p, H5P_DEFAULT) <= 0)
      return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: /scalars has no dataset '%s'", who, path,
                        b->p->scalars[s]);
  }
  hid_t g = H5Gopen2(old, "scalars", H5P_DEFAULT);
  if (g < 0) return h5fail(who, path, "cannot open /scalars");
  st = link_count(b, g, "/scalars", &have);
  htri_t copy = H5Lexists(g, "step", H5P_DEFAULT);
  H5Gclose(g);
  if (st == STAB_OK && have != t->n_scalars + (copy > 0))
    return stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu scalars, %zu declared", who, path,
                      (unsigned long long)(have - (copy > 0)), t->n_scalars);
  if ((g = H5Gopen2(old, "layers", H5P_DEFAULT)) < 0) return h5fail(who, path, "cannot open /layers");
  if ((st = link_count(b, g, "/layers", &have)) == STAB_OK && have != t->n_layers)
    st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has %llu layers, the monitor %zu", who, path,
                    (unsigned long long)have, t->n_layers);
  for (size_t i = 0; i < t->n_layers && st == STAB_OK; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    if (H5Lexists(g, gnames[i], H5P_DEFAULT) <= 0) {
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: it has no layer '%s'", who, path, l->name);
      break;
    }
    hid_t lg = H5Gopen2(g, gnames[i], H5P_DEFAULT);
    char kind[32];
    int64_t d_in = -1, d_out = -1;
    if (lg < 0) {
      st = h5fail(who, path, "cannot open a layer's group");
      break;
    }
    if (get_string(lg, "kind", b->str, kind, sizeof kind) < 0 || get_int(lg, "d_in", &d_in) < 0 ||
        get_int(lg, "d_out", &d_out) < 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no kind, d_in or d_out", who, path,
                      l->name);
    else if (strcmp(kind, stab_kind_name(l->kind)) != 0)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %s in the trace, %s in the monitor",
                      who, path, l->name, kind, stab_kind_name(l->kind));
    else if (d_in != (int64_t)l->d_in || d_out != (int64_t)l->d_out)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' is %lld x %lld (d_in x d_out) in the "
                      "trace, %zu x %zu in the monitor", who, path, l->name, (long long)d_in, (long long)d_out, l->d_in,
                      l->d_out);
    /* its datasets: the metrics, heads and extras, besides a copy of /step and ratios (whole,
     * or those an upgrade to format 3 cut short made) */
    hsize_t n = 0, extra = 0;
    if (st == STAB_OK) st = link_count(b, lg, "a layer", &n);
    const char *need[N_METRICS + 64];
    size_t n_need = 0;
    for (size_t k = 0; k < N_METRICS; k++) need[n_need++] = metric_names[k];
    for (size_t k = 0; k < t->n_extras && n_need < sizeof need / sizeof need[0]; k++) need[n_need++] = b->p->layer_extras[k];
    for (size_t k = 0; k < n_need && st == STAB_OK; k++)
      if (H5Lexists(lg, need[k], H5P_DEFAULT) <= 0)
        st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no dataset '%s'", who, path,
                        l->name, need[k]);
    for (size_t h = 0; h < layer_heads(l) && st == STAB_OK; h++) {
      char hn[40];
      snprintf(hn, sizeof hn, "head%zu_bound", h);
      if (H5Lexists(lg, hn, H5P_DEFAULT) <= 0)
        st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has no dataset '%s'", who, path,
                        l->name, hn);
    }
    extra += H5Lexists(lg, "step", H5P_DEFAULT) > 0;
    for (size_t j = 0; j < N_RATIOS; j++) extra += H5Lexists(lg, ratio_names[j], H5P_DEFAULT) > 0;
    if (st == STAB_OK && n != N_METRICS + layer_heads(l) + t->n_extras + extra)
      st = stabi_fail(STAB_EINVAL, "%s: %s: the trace does not match: layer '%s' has %llu datasets in the trace, %zu "
                      "expected (other heads or layer extras)", who, path, l->name, (unsigned long long)(n - extra),
                      N_METRICS + layer_heads(l) + t->n_extras);
    H5Gclose(lg);
  }
  H5Gclose(g);
  return st;
}

/* The old dataset holding column c of cols[k] (a layer's, or a head's), into buf. ratio: the
 * metric j whose ratio it is when the old trace has no ratios (format 1 or 2), else -1. */
static void old_name(const stab_trace *t, const builder *b, char *const *gnames, size_t k, size_t c, int64_t version,
                     char *buf, size_t len, int *ratio) {
  *ratio = -1;
  if (k == t->head_col && k) {
    size_t i = 0;
    while (i + 1 < t->n_layers && t->head_first[i + 1] <= c) i++;
    snprintf(buf, len, "layers/%s/head%zu_bound", gnames[i], c - t->head_first[i]);
    return;
  }
  const size_t j = k - t->first_metric;
  if (j >= N_METRICS && j < N_METRICS + N_RATIOS && version < 3) {
    *ratio = (int)(j - N_METRICS);
    snprintf(buf, len, "layers/%s/%s", gnames[c], metric_names[j - N_METRICS]);
    return;
  }
  snprintf(buf, len, "layers/%s/%s", gnames[c], column_name(t, k, b->p->layer_extras));
}

/* Fills the new trace t (its columns created, no rows) with the rows of the old trace old, of
 * format `version`: the rows of its /step (a dataset longer than /step was cut short by a kill),
 * copied as they are; format 1 and 2's missing ratios made from the rows as format 3's upgrade
 * made them (each metric over its first finite value > 0 in the file). */
static stab_status migrate_rows(stab_trace *t, const builder *b, hid_t old, int64_t version, char *const *gnames) {
  stab_status st = check_old(t, b, old, gnames);
  if (st != STAB_OK) return st;
  hsize_t rows = 0;
  hid_t sd = H5Dopen2(old, "step", H5P_DEFAULT);
  if (sd < 0) return h5fail(b->who, b->path, "cannot open /step");
  st = dataset_rows(b, sd, &rows);
  H5Dclose(sd);
  if (st != STAB_OK) return st;
  double *ref = malloc((t->n_layers ? t->n_layers : 1) * N_RATIOS * sizeof *ref);
  double *col = malloc((rows ? rows : 1) * sizeof *col);
  size_t most = 1;
  for (size_t k = 0; k < t->n_cols; k++) most = t->cols[k].width > most ? t->cols[k].width : most;
  const size_t block = MIGRATE_VALUES / most ? MIGRATE_VALUES / most : 1;
  double *buf = malloc(block * most * sizeof *buf);
  double *one = malloc(block * sizeof *one);
  if (!ref || !col || !buf || !one) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory to migrate the trace", b->who);
    goto out;
  }
  char name[700];
  if (version < 3) /* the references the ratios divide by, over all the rows */
    for (size_t i = 0; i < t->n_layers && st == STAB_OK; i++)
      for (size_t j = 0; j < N_RATIOS && st == STAB_OK; j++) {
        snprintf(name, sizeof name, "layers/%s/%s", gnames[i], metric_names[j]);
        double *r = &ref[i * N_RATIOS + j];
        *r = NAN;
        if (rows && (st = read_old(b, old, name, 0, rows, H5T_NATIVE_DOUBLE, col)) != STAB_OK) break;
        for (hsize_t q = 0; q < rows && isnan(*r); q++)
          if (isfinite(col[q]) && col[q] > 0) *r = col[q];
      }
  for (size_t k = 0; k < t->n_cols && st == STAB_OK; k++) {
    const column *c = &t->cols[k];
    const int is_int = k == COL_STEP || k == t->first_copy || k == t->first_copy + 1;
    if (set_rows(t, k, rows) < 0) {
      st = h5fail(b->who, b->path, "cannot size the migrated trace's datasets");
      break;
    }
    for (hsize_t r0 = 0; r0 < rows && st == STAB_OK; r0 += block) {
      const hsize_t n = rows - r0 < block ? rows - r0 : block;
      if (c->rank == 1) {
        const char *src = is_int ? "step" : k == COL_WALL ? "wall_time" : NULL;
        if (!src) snprintf(name, sizeof name, "scalars/%s", b->p->scalars[k - FIRST_SCALAR]), src = name;
        st = read_old(b, old, src, r0, n, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, buf);
      } else {
        for (size_t q = 0; q < c->width && st == STAB_OK; q++) {
          int ratio;
          old_name(t, b, gnames, k, q, version, name, sizeof name, &ratio);
          st = read_old(b, old, name, r0, n, H5T_NATIVE_DOUBLE, one);
          for (hsize_t r = 0; r < n; r++)
            buf[r * c->width + q] = ratio < 0 ? one[r] : ratio_of(one[r], ref[q * N_RATIOS + (size_t)ratio]);
        }
      }
      if (st != STAB_OK) break;
      const hsize_t start[2] = {r0, 0}, count[2] = {n, c->width};
      hid_t fs = H5Dget_space(c->d), ms = H5Screate_simple(c->rank, count, NULL);
      herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
      if (rc >= 0) rc = H5Dwrite(c->d, is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, buf);
      if (rc < 0) st = h5fail(b->who, b->path, "cannot write the migrated rows");
      if (fs >= 0) H5Sclose(fs);
      if (ms >= 0) H5Sclose(ms);
    }
  }
out:
  free(ref), free(col), free(buf), free(one);
  return st;
}

/* ---- the handle ------------------------------------------------------------------------ */

/* Closes every HDF5 object of t's file (whatever was opened), gives back the disk space
 * reserved and drops the lock. who NULL: silently (after another failure); else the first
 * failing close becomes STAB_EIO. t stays allocated, ready for another open attempt. */
static stab_status close_file(stab_trace *t, const char *who) {
  stab_status st = STAB_OK;
  if (t->cols)
    for (size_t k = 0; k < t->n_cols; k++) {
      if (t->cols[k].d >= 0 && H5Dclose(t->cols[k].d) < 0 && who && st == STAB_OK)
        st = h5fail(who, t->path, "cannot close a dataset");
      t->cols[k].d = H5I_INVALID_HID;
    }
  /* Closing the file flushes it. */
  if (t->file >= 0 && H5Fclose(t->file) < 0 && who && st == STAB_OK)
    st = h5fail(who, t->path, "cannot close the file");
  t->file = H5I_INVALID_HID;
  unreserve(t);
  if (t->lock_fd >= 0) close(t->lock_fd); /* after the close: the file is complete */
  t->lock_fd = -1;
  t->written = 0;
  t->has_last = 0;
  return st;
}

/* Closes t's file and frees t; in a forked child (foreign) frees t only: the file, its lock
 * and HDF5's state are the parent's. */
static stab_status destroy(stab_trace *t, const char *who) {
  if (!t) return STAB_OK;
  if (t->pid != getpid()) {
    if (t->lock_fd >= 0) close(t->lock_fd); /* the child's copy (in_child closed it already) */
    t->lock_fd = -1;
    t->file = H5I_INVALID_HID;
    t->cols = (free(t->cols), NULL); /* the parent's dataset ids: none is closed here */
  }
  stab_status st = close_file(t, who);
  free(t->cols);
  free(t->head_first);
  free(t->reference);
  free(t->stage);
  free(t->stage_step);
  free(t->out);
  free(t->out_step);
  free(t->path);
  free(t);
  return st;
}

/* ---- the new file's image --------------------------------------------------------------- */

/* Bob Jenkins' lookup3 hash ("hashlittle"), which HDF5 uses as its metadata checksum. */
static uint32_t rot32(uint32_t x, int k) { return (x << k) | (x >> (32 - k)); }

static uint32_t lookup3(const unsigned char *k, size_t n) {
  uint32_t a, b, c;
  a = b = c = 0xdeadbeefu + (uint32_t)n;
  for (; n > 12; n -= 12, k += 12) {
    a += k[0] | (uint32_t)k[1] << 8 | (uint32_t)k[2] << 16 | (uint32_t)k[3] << 24;
    b += k[4] | (uint32_t)k[5] << 8 | (uint32_t)k[6] << 16 | (uint32_t)k[7] << 24;
    c += k[8] | (uint32_t)k[9] << 8 | (uint32_t)k[10] << 16 | (uint32_t)k[11] << 24;
    a -= c, a ^= rot32(c, 4), c += b;
    b -= a, b ^= rot32(a, 6), a += c;
    c -= b, c ^= rot32(b, 8), b += a;
    a -= c, a ^= rot32(c, 16), c += b;
    b -= a, b ^= rot32(a, 19), a += c;
    c -= b, c ^= rot32(b, 4), b += a;
  }
  if (n == 0) return c;
  uint32_t w[3] = {0, 0, 0}; /* the last 1..12 bytes, little-endian words, zero-padded */
  for (size_t i = 0; i < n; i++) w[i / 4] |= (uint32_t)k[i] << (8 * (i % 4));
  a += w[0], b += w[1], c += w[2];
  c ^= b, c -= rot32(b, 14);
  a ^= c, a -= rot32(c, 11);
  b ^= a, b -= rot32(a, 25);
  c ^= b, c -= rot32(b, 16);
  a ^= c, a -= rot32(c, 4);
  b ^= a, b -= rot32(a, 14);
  c ^= b, c -= rot32(b, 24);
  return c;
}

/* HDF5 1.10.8's H5Fget_file_image clears the superblock's status flags in the image of a file
 * open for writing but keeps the checksum of the flags it had, so the image does not open
 * ("incorrect metadata checksum"). The checksum of a version 2 or 3 superblock (signature,
 * version, sizes of offsets and lengths, flags, four addresses) is computed again here: right
 * whichever way HDF5 left it. */
static void fix_superblock(unsigned char *img, size_t n) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n < 12 || memcmp(img, sig, 8) != 0 || img[8] < 2) return;
  size_t body = 12 + 4 * (size_t)img[9];
  if (body + 4 > n) return;
  uint32_t c = lookup3(img, body);
  for (int i = 0; i < 4; i++) img[body + i] = (unsigned char)(c >> (8 * i));
}

/* Writes all of buf to fd at offset 0. 0, or the errno. */
static int write_all(int fd, const unsigned char *buf, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t w = pwrite(fd, buf + done, n - done, (off_t)done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 ? errno : EIO;
    done += (size_t)w;
  }
  return 0;
}

/* A new trace. It is built in memory (HDF5's core driver) and written to its temporary file by
 * us, so that HDF5 never writes a file being created: a disk that is full at the start fails
 * here, with the system's message, before HDF5 has a file to leave half-closed (see reserve).
 * The temporary file, "<path>.<pid>.tmp", is created O_EXCL and locked at once; HDF5 opens it,
 * starts SWMR writing, and publish makes it the trace. *tmp receives its name (to remove on
 * failure); *again as publish says.
 * Migrating (old >= 0: the trace at path, of format old_version, open and locked by old_fd), the
 * new file gets old's rows, creation time and run_config, and is renamed over path at once: the
 * lock of the inode path names is held, so no other writer can be replacing it. */
static stab_status create_new(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, char **tmp,
                              int *again, hid_t old, int64_t old_version) {
  const char *who = b->who, *path = b->path;
  stab_status st = STAB_OK;
  unsigned char *image = NULL;
  char *run_config = NULL;
  char created[32];
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm)) strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
  else snprintf(created, sizeof created, "unknown");
  hid_t mem = H5Pcopy(fapl);
  if (mem < 0 || H5Pset_fapl_core(mem, (size_t)1 << 16, 0) < 0) {
    st = h5fail(who, path, "cannot set up HDF5's in-memory file");
    goto out;
  }
  if (old >= 0) {
    get_string(old, "created_utc", b->str, created, sizeof created);
    hid_t a = H5Aexists(old, "run_config") > 0 ? H5Aopen(old, "run_config", H5P_DEFAULT) : H5I_INVALID_HID;
    if (a >= 0 && H5Aread(a, b->str, &run_config) < 0) run_config = NULL;
    if (a >= 0) H5Aclose(a);
  }
  st = create_file(t, b, mem, gnames, created, old >= 0 ? (run_config ? run_config : "{}") : b->p->run_config);
  if (st == STAB_OK && old >= 0) st = migrate_rows(t, b, old, old_version, gnames);
  if (st != STAB_OK) goto out;
  for (size_t k = 0; k < t->n_cols; k++)
    if (t->cols[k].d >= 0) H5Dclose(t->cols[k].d), t->cols[k].d = H5I_INVALID_HID;
  /* H5Fget_file_image does not flush HDF5's metadata cache itself: without this flush the
   * image would hold the superblock alone */
  ssize_t size = H5Fflush(t->file, H5F_SCOPE_GLOBAL) < 0 ? -1 : H5Fget_file_image(t->file, NULL, 0);
  if (size <= 0) {
    st = h5fail(who, path, "cannot take the new file's image");
    goto out;
  }
  if (!(image = malloc((size_t)size))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory for the new file (%lld bytes)", who, (long long)size);
    goto out;
  }
  if (H5Fget_file_image(t->file, image, (size_t)size) != size) {
    st = h5fail(who, path, "cannot take the new file's image");
    goto out;
  }
  fix_superblock(image, (size_t)size);
  H5Fclose(t->file); /* memory only: nothing to write, nothing to fail */
  t->file = H5I_INVALID_HID;

  size_t len = strlen(path) + 48;
  if (!(*tmp = malloc(len))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  int fd = -1;
  for (unsigned n = 0; fd < 0 && n < 100; n++) { /* another name if a killed writer left one */
    if (n == 0) snprintf(*tmp, len, "%s.%ld.tmp", path, (long)getpid());
    else snprintf(*tmp, len, "%s.%ld.%u.tmp", path, (long)getpid(), n);
    fd = open(*tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    st = stabi_fail(STAB_EIO, "%s: %s: cannot create the new trace beside it (%s): %s", who, path, *tmp,
                    strerror(errno));
    free(*tmp), *tmp = NULL; /* not ours: never removed */
    goto out;
  }
  t->lock_fd = fd;
  int e = lock_fd(fd); /* no one else knows this file yet: only a system failure stops it */
  if (!e) e = write_all(fd, image, (size_t)size);
  if (e) {
    st = stabi_fail(STAB_EIO, "%s: %s: cannot write the new trace: %s", who, path, strerror(e));
    goto out;
  }
  if ((st = open_disk(t, b, fapl, gnames, *tmp)) != STAB_OK) goto out;
  if (H5Fstart_swmr_write(t->file) < 0) {
    st = h5fail(who, path, "cannot start SWMR writing");
    goto out;
  }
  if (old < 0) st = publish(t, who, *tmp, b->p->append, again);
  else if (rename(*tmp, path) != 0)
    st = stabi_fail(STAB_EIO, "%s: %s: cannot rename the migrated trace to it: %s", who, path, strerror(errno));
out:
  if (run_config) H5free_memory(run_config);
  free(image);
  if (mem >= 0) H5Pclose(mem);
  return st;
}

/* 1 when the file fd starts with HDF5's signature, where this library writes it. */
static int hdf5_signature(int fd) {
  static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  unsigned char head[8];
  return pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head && memcmp(head, sig, sizeof sig) == 0;
}

/* An existing trace, to append to: locked (see the protocol), then opened by HDF5. A file that
 * is not HDF5 at all (a checkpoint given as the trace, say) is refused before anything, the
 * disk reserve included, touches it. */
static stab_status open_existing(stab_trace *t, const builder *b, hid_t fapl, char *const *gnames, char **tmp,
                                  int *again) {
  stab_status st = lock_path(b->who, b->path, "append to", &t->lock_fd, again);
  if (st != STAB_OK || t->lock_fd < 0) return st;
  if (!hdf5_signature(t->lock_fd))
    return stabi_fail(STAB_EINVAL, "%s: %s: not a stabmeter trace (not an HDF5 file): nothing was written to it",
                      b->who, b->path);
  if ((st = open_disk(t, b, fapl, gnames, b->path)) != STAB_OK) return st;
  if (t->file_version < FORMAT_VERSION) { /* an older format: rewritten as this one (migrate) */
    const hid_t old = t->file;
    const int old_fd = t->lock_fd;
    t->file = H5I_INVALID_HID, t->lock_fd = -1;
    unreserve(&(stab_trace){.lock_fd = old_fd, .reserved = t->reserved});
    t->reserved = 0;
    st = create_new(t, b, fapl, gnames, tmp, again, old, t->file_version);
    H5Fclose(old);
    close(old_fd); /* after the rename: only now may another writer lock the old file, and find it replaced */
    return st;
  }
  if (H5Fstart_swmr_write(t->file) < 0) return h5fail(b->who, b->path, "cannot start SWMR writing");
  return STAB_OK;
}

static int name_order(const void *a, const void *b, void *names) {
  char *const *g = names;
  const size_t i = *(const size_t *)a, j = *(const size_t *)b;
  int c = strcmp(g[i], g[j]);
  return c ? c : (i > j) - (i < j);
}

/* Two layers whose names become the same layer name in the trace ('/' read as '.') are
 * refused, naming both in the monitor's order. Sorted, so that it costs n log n comparisons
 * (a pass over every pair took seconds at 20,000 layers). */
static stab_status check_unique(const char *who, const stab_monitor *m, char *const *gnames, size_t n) {
  if (n < 2) return STAB_OK;
  size_t *order = malloc(n * sizeof *order);
  if (!order) return stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) order[i] = i;
  qsort_r(order, n, sizeof *order, name_order, (void *)gnames);
  stab_status st = STAB_OK;
  for (size_t k = 1; k < n && st == STAB_OK; k++)
    if (strcmp(gnames[order[k - 1]], gnames[order[k]]) == 0)
      st = stabi_fail(STAB_EEXIST, "%s: layers '%s' and '%s' would both be the trace's layer '%s' (a '/' is read as '.')", who,
                      stab_monitor_layer(m, order[k - 1])->name, stab_monitor_layer(m, order[k])->name, gnames[order[k]]);
  free(order);
  return st;
}

stab_status stab_trace_open(const char *path, const stab_monitor *m, const stab_trace_params *params,
                            stab_trace **out) {
  static const char who[] = "stab_trace_open";
  if (!out) return stabi_fail(STAB_EINVAL, "%s: out is NULL", who);
  *out = NULL;
  if (!path || !path[0] || !m)
    return stabi_fail(STAB_EINVAL, "%s: %s", who, !m ? "monitor is NULL" : "path is NULL or empty");
  stab_trace_params p = params ? *params : stab_trace_default_params();
  if (p.flush_every < 0) return stabi_fail(STAB_EINVAL, "%s: flush_every is %d, must be >= 0", who, p.flush_every);
  if (!(p.flush_seconds >= 0 && p.flush_seconds <= FLUSH_SECONDS_MAX)) /* NaN fails too */
    return stabi_fail(STAB_EINVAL, "%s: flush_seconds is %g, must be 0 .. %g", who, p.flush_seconds,
                      (double)FLUSH_SECONDS_MAX);
  if (p.on_error != STAB_TRACE_STOP && p.on_error != STAB_TRACE_CONTINUE)
    return stabi_fail(STAB_EINVAL, "%s: unknown on_error %d", who, (int)p.on_error);
  if (p.append != STAB_OUTPUT_REPLACE && p.append != STAB_OUTPUT_APPEND && p.append != STAB_OUTPUT_NEW)
    return stabi_fail(STAB_EINVAL, "%s: append is %d: 0 (replace), 1 (append) or 2 (new only)", who, p.append);
  stab_status st = check_names(who, "scalars", p.scalars, p.n_scalars, 0);
  if (st == STAB_OK) st = check_names(who, "layer_extras", p.layer_extras, p.n_layer_extras, 1);
  if (st != STAB_OK) return st;

  const size_t n_layers = stab_monitor_layer_count(m);
  stab_trace *t = calloc(1, sizeof *t);
  char **gnames = n_layers ? calloc(n_layers, sizeof *gnames) : NULL;
  stabi_sharing share;
  memset(&share, 0, sizeof share);
  builder b = {who, path, &p, H5I_INVALID_HID, &share};
  hid_t fapl = H5I_INVALID_HID;
  char *tmp = NULL;
  quiet q;
  pthread_once(&fork_once, after_fork);
  hdf5_lock_take();
  quiet_begin(&q);
  if (!t || (n_layers && !gnames)) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  t->file = H5I_INVALID_HID;
  t->lock_fd = -1;
  t->pid = getpid();
  t->h5_fd = -1;
  t->m = m;
  t->n_layers = n_layers;
  t->n_scalars = p.n_scalars;
  t->n_extras = p.n_layer_extras;
  t->on_error = p.on_error;
  t->path = malloc(strlen(path) + 1);
  t->head_first = malloc((n_layers ? n_layers : 1) * sizeof *t->head_first);
  t->reference = malloc((n_layers ? n_layers : 1) * sizeof *t->reference);
  if (!t->path || !t->head_first || !t->reference) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  strcpy(t->path, path);
  for (size_t i = 0; i < n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(m, i);
    t->head_first[i] = t->n_heads;
    t->n_heads += layer_heads(l);
    if (!(gnames[i] = group_name(l->name))) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
      goto out;
    }
    if (strcmp(gnames[i], ".") == 0) {
      st = stabi_fail(STAB_EINVAL, "%s: layer '%s' cannot be a layer name in the trace", who, l->name);
      goto out;
    }
  }
  if ((st = check_unique(who, m, gnames, n_layers)) != STAB_OK) goto out;
  /* the columns: see COL_STEP */
  t->first_copy = FIRST_SCALAR + p.n_scalars;
  t->first_metric = t->first_copy + 2;
  t->head_col = t->n_heads ? t->first_metric + N_METRICS + N_RATIOS : 0;
  t->first_extra = t->first_metric + N_METRICS + N_RATIOS + (t->n_heads ? 1 : 0);
  t->n_cols = t->first_extra + p.n_layer_extras;
  t->cols = malloc(t->n_cols * sizeof *t->cols);
  if (!t->cols) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  for (size_t k = 0; k < t->n_cols; k++) {
    column *c = &t->cols[k];
    c->d = H5I_INVALID_HID;
    c->rank = k >= t->first_metric ? 2 : 1;
    c->width = c->rank == 1 ? 1 : k == t->head_col ? t->n_heads : n_layers;
    c->off = t->width;
    t->width += c->width;
  }
  t->cap = p.flush_every >= 1 && p.flush_every < STAGE_ROWS ? (size_t)p.flush_every : STAGE_ROWS;
  t->flush_seconds = p.flush_seconds;
  t->stage = malloc(t->width * t->cap * sizeof *t->stage);
  t->stage_step = malloc(t->cap * sizeof *t->stage_step);
  if (p.flush_every == 0) { /* the writer thread's half */
    t->out = malloc(t->width * t->cap * sizeof *t->out);
    t->out_step = malloc(t->cap * sizeof *t->out_step);
  }
  if (!t->stage || !t->stage_step || (p.flush_every == 0 && (!t->out || !t->out_step))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
    goto out;
  }
  if ((st = stabi_sharing_find(m, who, &share)) != STAB_OK) goto out;

  if ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 ||
      H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST) < 0 || (b.str = string_type()) < 0) {
    st = h5fail(who, path, "cannot set up HDF5 properties");
    goto out;
  }
  for (int attempt = 1;; attempt++) {
    int again = 0;
    struct stat sb;
    if (p.append == STAB_OUTPUT_NEW && (st = stab_output_check(path, STAB_OUTPUT_NEW, "a trace")) != STAB_OK) break;
    if (p.append == STAB_OUTPUT_APPEND && stat(path, &sb) == 0) st = open_existing(t, &b, fapl, gnames, &tmp, &again);
    else st = create_new(t, &b, fapl, gnames, &tmp, &again, H5I_INVALID_HID, 0);
    if (st != STAB_OK || !again) break;
    /* another writer changed the path meanwhile: drop what was made, look again */
    close_file(t, NULL);
    if (tmp) unlink(tmp), free(tmp), tmp = NULL;
    if (attempt == OPEN_ATTEMPTS) {
      st = stabi_fail(STAB_EBUSY, "%s: %s: other processes kept replacing it while this one opened it", who, path);
      break;
    }
  }
out:
  if (gnames)
    for (size_t i = 0; i < n_layers; i++) free(gnames[i]);
  free(gnames);
  if (fapl >= 0) H5Pclose(fapl);
  if (b.str >= 0) H5Tclose(b.str);
  stabi_sharing_free(&share);
  if (st != STAB_OK) {
    destroy(t, NULL);
    if (tmp) unlink(tmp); /* ours (O_EXCL), not yet published: a published one is never removed */
  }
  free(tmp);
  if (st == STAB_OK) {
    void *h = NULL; /* the sec2 driver's handle is its descriptor */
    t->h5_fd = H5Fget_vfd_handle(t->file, H5P_DEFAULT, &h) >= 0 && h ? *(int *)h : -1;
    t->next_open = open_traces;
    open_traces = t;
  }
  quiet_end(&q);
  hdf5_lock_give();
  if (st == STAB_OK) {
    t->last_flush = now_seconds(); /* the first rows wait at most flush_seconds, as later ones */
    if (p.flush_every == 0) start_writer(t);
    *out = t;
  }
  return st;
}

/* ---- appending ------------------------------------------------------------------------- */

/* Dataset k's `rows` rows of stage (laid out as t->stage) and steps, written after the file's
 * `written` rows. */
static stab_status write_column(stab_trace *t, size_t k, const char *who, const double *stage,
                                const int64_t *steps, size_t rows) {
  const column *c = &t->cols[k];
  const hsize_t at[2] = {(hsize_t)t->written, 0}, count[2] = {rows, c->width}, n[2] = {at[0] + rows, c->width};
  if (H5Dset_extent(c->d, n) < 0) return h5fail(who, t->path, "cannot extend a dataset");
  hid_t fs = H5Dget_space(c->d), ms = H5Screate_simple(c->rank, count, NULL);
  herr_t rc = fs < 0 || ms < 0 ? -1 : H5Sselect_hyperslab(fs, H5S_SELECT_SET, at, NULL, count, NULL);
  if (rc >= 0)
    rc = k == COL_STEP || k == t->first_copy || k == t->first_copy + 1
             ? H5Dwrite(c->d, H5T_NATIVE_INT64, ms, fs, H5P_DEFAULT, steps)
             : H5Dwrite(c->d, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, stage + c->off * t->cap);
  /* HDF5's message is taken before H5Sclose clears it. */
  stab_status st = rc < 0 ? h5fail(who, t->path, "cannot write rows") : STAB_OK;
  if (fs >= 0 && H5Sclose(fs) < 0 && st == STAB_OK) st = h5fail(who, t->path, "cannot write rows");
  if (ms >= 0) H5Sclose(ms);
  return st;
}

/* Writes rows and flushes them, in two steps: every dataset but /step, flush, then /step,
 * flush. HDF5 writes a flush's metadata in its own order, so a writer killed during a single
 * flush could leave /step longer than another dataset; this way the length of /step never
 * counts a row that is not everywhere. Called from the caller's thread (flush_every >= 1) or
 * the writer thread, never both; takes hdf5_lock. */
static stab_status write_rows(stab_trace *t, const char *who, const double *stage, const int64_t *steps,
                              size_t rows) {
  quiet q;
  hdf5_lock_take();
  quiet_begin(&q);
  stab_status st = reserve(t, who, rows);
  for (size_t k = 1; k < t->n_cols && st == STAB_OK; k++) st = write_column(t, k, who, stage, steps, rows);
  if (st == STAB_OK && H5Fflush(t->file, H5F_SCOPE_LOCAL) < 0) st = h5fail(who, t->path, "cannot flush");
  if (st == STAB_OK) st = write_column(t, 0, who, stage, steps, rows);
  if (st == STAB_OK && H5Fflush(t->file, H5F_SCOPE_LOCAL) < 0) st = h5fail(who, t->path, "cannot flush");
  quiet_end(&q);
  hdf5_lock_give();
  return st;
}

/* A write failed: the trace keeps the failure (STOP) or turns itself off (CONTINUE). The rows
 * staged are dropped: the trace holds what reached the file. Caller's thread, mu not held. */
static stab_status stop(stab_trace *t, stab_status st) {
  t->error = st;
  t->staged = 0;
  snprintf(t->message, sizeof t->message, "%s", stab_last_error());
  return st;
}

/* ---- the writer thread ----------------------------------------------------------------- */

/* Writes each batch handed to it (out), records a failure for the caller's next call, and ends
 * at close once nothing is left. Rows of a batch that failed are dropped, as the stage is in the
 * caller's thread. */
static void *writer_main(void *arg) {
  stab_trace *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    while (!t->out_rows && !t->quit) pthread_cond_wait(&t->cv, &t->mu);
    if (!t->out_rows) break;
    const size_t rows = t->out_rows;
    const double *out = t->out;
    const int64_t *steps = t->out_step;
    pthread_mutex_unlock(&t->mu);
    /* out, written, dsets and the file are this thread's while out_rows is set */
    stab_status st = write_rows(t, "stab_trace_append (rows written in the background)", out, steps, rows);
    pthread_mutex_lock(&t->mu);
    if (st == STAB_OK) {
      t->written += (int64_t)rows;
    } else if (t->error == STAB_OK) {
      t->error = st;
      snprintf(t->message, sizeof t->message, "%s", stab_last_error()); /* this thread's */
    }
    t->out_rows = 0;
    pthread_cond_broadcast(&t->cv);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

/* Starts the writer thread; without one (no thread to be had), the caller's thread writes, as
 * with flush_every >= 1. */
static void start_writer(stab_trace *t) {
  if (pthread_mutex_init(&t->mu, NULL) != 0) return;
  if (pthread_cond_init(&t->cv, NULL) != 0) {
    pthread_mutex_destroy(&t->mu);
    return;
  }
  if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    return;
  }
  t->background = 1;
}

/* Waits until the writer has written the batch it holds; mu held. */
static void wait_written(stab_trace *t) {
  while (t->out_rows) pthread_cond_wait(&t->cv, &t->mu);
}

/* The writer's failure, or STAB_OK. */
static stab_status writer_error(stab_trace *t) {
  pthread_mutex_lock(&t->mu);
  stab_status st = t->error;
  pthread_mutex_unlock(&t->mu);
  return st;
}

/* Flushes the staged rows: hands them to the writer thread (after it has written the batch
 * before: at most one batch is in flight, so once this returns every row staged before the
 * previous flush is in the file), or writes them here. A failure, this one's or the writer's
 * with the previous batch, drops the staged rows and is returned. */
static stab_status write_out(stab_trace *t, const char *who) {
  if (t->background) {
    pthread_mutex_lock(&t->mu);
    wait_written(t);
    stab_status st = t->error;
    if (st == STAB_OK && t->staged) {
      double *stage = t->stage;
      int64_t *steps = t->stage_step;
      t->stage = t->out, t->stage_step = t->out_step;
      t->out = stage, t->out_step = steps;
      t->out_rows = t->staged;
      pthread_cond_signal(&t->cv);
    }
    t->staged = 0; /* handed over, or dropped by the failure */
    pthread_mutex_unlock(&t->mu);
    t->last_flush = now_seconds();
    return st;
  }
  if (!t->staged) return STAB_OK;
  stab_status st = write_rows(t, who, t->stage, t->stage_step, t->staged);
  if (st != STAB_OK) return stop(t, st);
  t->written += (int64_t)t->staged;
  t->staged = 0;
  t->last_flush = now_seconds();
  return STAB_OK;
}

/* The failure the trace stopped on, as a call returns it: the first call to learn of it (the
 * failing one, or with the writer thread the next one) returns it, later ones too in STOP mode
 * and STAB_OK in CONTINUE mode. Caller's thread, after the writer's failure is in t->error. */
static stab_status failed(stab_trace *t) {
  if (t->reported && t->on_error == STAB_TRACE_CONTINUE) return STAB_OK;
  t->reported = 1;
  return stabi_fail(t->error, "%s", t->message);
}

/* ---- appending ------------------------------------------------------------------------- */

/* What layer i's ratios divide by: per metric, the file's reference when it has one, else the
 * monitor's (the first measurement of this run). */
static void trace_reference(const stab_trace *t, size_t i, stab_metrics *out) {
  const stab_metrics *mine = stab_monitor_reference(t->m, i);
  *out = t->reference[i];
  for (size_t j = 0; j < N_RATIOS; j++) {
    double *r = reference_field(out, j);
    if (isnan(*r)) *r = reference_value(mine, j);
  }
}

stab_status stab_trace_reference(const stab_trace *t, size_t index, stab_metrics *out) {
  static const char who[] = "stab_trace_reference";
  if (!t || !out) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, !t ? "trace" : "out");
  if (index >= t->n_layers)
    return stabi_fail(STAB_ERANGE, "%s: index %zu, the trace has %zu layers", who, index, t->n_layers);
  trace_reference(t, index, out);
  return STAB_OK;
}

stab_status stab_trace_append(stab_trace *t, int64_t step, double wall_time, const double *scalars,
                              const double *layer_extras) {
  static const char who[] = "stab_trace_append";
  if (!t) return stabi_fail(STAB_EINVAL, "%s: trace is NULL", who);
  if (foreign(t, who) != STAB_OK) return STAB_ESTATE;
  if ((t->background ? writer_error(t) : t->error) != STAB_OK) {
    t->staged = 0;
    return failed(t);
  }
  /* Readers and a resume (which keeps the rows up to a step) rely on /step increasing. Not a
   * write failure: the row is refused and the trace goes on. */
  if (t->has_last && step <= t->last_step)
    return stabi_fail(STAB_ERANGE, "%s: %s: step %lld is not after the last step %lld (steps must increase)", who,
                      t->path, (long long)step, (long long)t->last_step);
  t->last_step = step;
  t->has_last = 1;

  const size_t r = t->staged, cap = t->cap;
  /* row(k) is dataset k's row r in the stage */
#define row(k) (t->stage + t->cols[k].off * cap + r * t->cols[k].width)
  t->stage_step[r] = step;
  *row(COL_WALL) = wall_time;
  for (size_t s = 0; s < t->n_scalars; s++) *row(FIRST_SCALAR + s) = scalars ? scalars[s] : NAN;
  for (size_t i = 0; i < t->n_layers; i++) {
    const stab_layer *l = stab_monitor_layer(t->m, i);
    double v[N_METRICS];
    metric_values(stab_monitor_metrics(t->m, i), v);
    for (size_t j = 0; j < N_METRICS; j++) row(t->first_metric + j)[i] = v[j];
    stab_metrics ref;
    trace_reference(t, i, &ref);
    for (size_t j = 0; j < N_RATIOS; j++) row(t->first_metric + N_METRICS + j)[i] = ratio_of(v[j], reference_value(&ref, j));
    if (layer_heads(l)) {
      const double *h = stab_monitor_head_bounds(t->m, i);
      for (size_t j = 0; j < l->heads; j++) row(t->head_col)[t->head_first[i] + j] = h[j];
    }
    for (size_t e = 0; e < t->n_extras; e++)
      row(t->first_extra + e)[i] = layer_extras ? layer_extras[i * t->n_extras + e] : NAN;
  }
#undef row
  /* Flushing costs about the same for one row as for 256 (it is per dataset), so rows wait in
   * the stage for flush_seconds: a kill then loses at most that span of appends, and the
   * flushes cost at most one per flush_seconds of the caller's time, whatever its step rate. */
  if (++t->staged < cap && !(t->flush_seconds > 0 && now_seconds() - t->last_flush >= t->flush_seconds))
    return STAB_OK;
  return write_out(t, who) == STAB_OK ? STAB_OK : failed(t);
}

stab_status stab_trace_flush(stab_trace *t) {
  if (!t) return stabi_fail(STAB_EINVAL, "stab_trace_flush: trace is NULL");
  if (foreign(t, "stab_trace_flush") != STAB_OK) return STAB_ESTATE;
  if ((t->background ? writer_error(t) : t->error) != STAB_OK) {
    t->staged = 0;
    return failed(t);
  }
  stab_status st = write_out(t, "stab_trace_flush");
  if (st == STAB_OK && t->background) { /* written, not only handed over */
    pthread_mutex_lock(&t->mu);
    wait_written(t);
    st = t->error;
    pthread_mutex_unlock(&t->mu);
  }
  return st == STAB_OK ? STAB_OK : failed(t);
}

int64_t stab_trace_steps(const stab_trace *t) {
  if (!t) return 0;
  if (!t->background || t->pid != getpid()) return t->written + (int64_t)t->staged; /* a child: no lock */
  stab_trace *w = (stab_trace *)t; /* the lock only: nothing t shows changes */
  pthread_mutex_lock(&w->mu);
  int64_t n = t->written + (t->error == STAB_OK ? (int64_t)(t->staged + t->out_rows) : 0);
  pthread_mutex_unlock(&w->mu);
  return n;
}

stab_status stab_trace_last_step(const stab_trace *t, int64_t *step) {
  if (!t || !step) return stabi_fail(STAB_EINVAL, "stab_trace_last_step: %s is NULL", !t ? "trace" : "step");
  if (!t->has_last) return STAB_ENOTFOUND;
  *step = t->last_step;
  return STAB_OK;
}

/* From the caller's side: a failure of the writer thread happens at the call that returns it,
 * so that a program sees stab_trace_failed turn to 1 at that call, as without the thread. */
int stab_trace_failed(const stab_trace *t) { return t && t->reported; }

stab_status stab_trace_close(stab_trace *t) {
  if (!t) return STAB_OK;
  if (t->pid != getpid()) { /* a forked child's copy: no thread, lock or HDF5 call of the parent's */
    destroy(t, NULL);
    return STAB_OK;
  }
  stab_status st = STAB_OK;
  if (t->background) {
    if (writer_error(t) == STAB_OK) write_out(t, "stab_trace_close"); /* the last rows */
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->writer, NULL); /* it writes the last batch first */
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    t->background = 0;
    /* a failure no call has returned yet: the last batch's, or one after the last append */
    if (t->error != STAB_OK && !t->reported) st = failed(t);
  } else {
    st = t->error == STAB_OK ? write_out(t, "stab_trace_close") : STAB_OK;
  }
  quiet q;
  hdf5_lock_take();
  quiet_begin(&q);
  for (stab_trace **p = &open_traces; *p; p = &(*p)->next_open)
    if (*p == t) {
      *p = t->next_open;
      break;
    }
  stab_status closed = destroy(t, "stab_trace_close");
  quiet_end(&q);
  hdf5_lock_give();
  if (st == STAB_OK) st = closed;
  return st;
}
