/* internal.h — declarations shared by the library's own files; never installed.
 * Internal functions are prefixed stabi_ so that only stab_* names are exported. */
#ifndef STABMETER_INTERNAL_H
#define STABMETER_INTERNAL_H

#include "stabmeter.h"

#include <math.h>
#include <stddef.h>

/* Records a failure for stab_last_error() and the message handler; returns status so that
 * a caller can write `return stabi_fail(STAB_EDIM, "...", ...);`. */
stab_status stabi_fail(stab_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Hands a warning (not a failure) to the message handler only. */
void stabi_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Makes msg the calling thread's stab_last_error() without calling the message handler: a
 * failure met on a pooled thread (and already handed to the handler there) reported again on
 * the thread that asked for the work. */
void stabi_set_last_error(const char *msg);

/* max that lets NaN win, unlike fmax: a NaN anywhere must reach the result. */
static inline double stabi_nanmax(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN;
  return a > b ? a : b;
}

/* 1 when a * b fits in size_t. */
static inline int stabi_mul_fits(size_t a, size_t b) { return a == 0 || b <= (size_t)-1 / a; }

/* a * b, or 0 when it overflows (callers pass sizes already known to be > 0). */
static inline size_t stabi_mul(size_t a, size_t b) { return stabi_mul_fits(a, b) ? a * b : 0; }

/* ---- argument checks shared by every public entry point (validate.c, utf8.c) ---- */

/* A matrix of rows x cols floats with row stride *ld (0 means cols, written back): both sizes
 * > 0, ld >= cols, and the span (rows - 1) * ld + cols addressable as floats (no overflow of
 * size_t, at most PTRDIFF_MAX bytes). who names the function, what the argument ("a", "layer
 * 'fc1'") in the message. span may be NULL. */
stab_status stabi_check_extent(const char *who, const char *what, size_t rows, size_t cols,
                               size_t *ld, size_t *span);
/* The same, and a not NULL (STAB_EINVAL). */
stab_status stabi_check_matrix(const char *who, const char *what, const float *a, size_t rows,
                               size_t cols, size_t *ld);
/* Spectral parameters within the bounds of stabmeter.h; who names the caller in the message. */
stab_status stabi_spectral_check(const stab_spectral_params *p, const char *who);
/* Lanczos basis vectors of validated parameters: krylov_dim rounded up to even, at least 4. */
size_t stabi_krylov_basis(const stab_spectral_params *p);
/* A layer name (not NULL) is valid UTF-8, else STAB_EINVAL naming the byte offset: names go
 * into messages, JSON reports and HDF5 UTF-8 strings, and the message does not echo the bytes. */
stab_status stabi_check_name(const char *who, const char *name);
/* Offset of the first byte of s[0..n) that does not start a valid UTF-8 sequence (see
 * stab_utf8_decode), or (size_t)-1 when all n bytes are valid. */
size_t stabi_utf8_invalid_at(const char *s, size_t n);
/* Code point cp (at most U+10FFFF, not a surrogate: the caller checked) as UTF-8 into o (room
 * for 4 bytes); the bytes written. */
size_t stabi_utf8_encode(char *o, uint32_t cp);
/* The value of hex digit ch (0-9, a-f, A-F), or -1. */
int stabi_hex_digit(char ch);

/* ---- stored numbers in the dtypes read natively (stored_rows.c) ----
 * F32, F16 and BF16 in host byte order. Pointers to 16-bit data travel as const float * in
 * stab_layer; inside the library they are const void * and offsets are in elements. */

/* Bytes per element: 4 (F32), 2 (F16, BF16); 0 for a dtype not read natively. */
size_t stabi_dtype_size(stab_dtype dtype);
/* "F32", "F16", "BF16", "OTHER", "QUANT"; NULL if unknown. */
const char *stabi_dtype_name(stab_dtype dtype);

/* p advanced by k elements of dtype (p NULL stays NULL). */
static inline const void *stabi_elem_ptr(const void *p, stab_dtype dtype, size_t k) {
  return p ? (const void *)((const unsigned char *)p + k * stabi_dtype_size(dtype)) : NULL;
}

/* n elements at p as f32 into out: exact (a 16-bit value is one f32 value). */
void stabi_to_f32(const void *p, stab_dtype dtype, size_t n, float *out);

/* Rows [r0, r0 + nrows) of cols elements (row stride ld elements) as f32 into tile, contiguous
 * (row stride cols). */
void stabi_tile_f32(const void *p, stab_dtype dtype, size_t ld, size_t r0, size_t nrows, size_t cols,
                    float *tile);

/* Row i (stride ld) of p as f32: in place for F32, else converted into buf (cols floats). */
static inline const float *stabi_row_f32(const void *p, stab_dtype dtype, size_t ld, size_t i, size_t cols,
                                         float *buf) {
  if (dtype == STAB_DTYPE_F32) return (const float *)p + i * ld;
  stabi_to_f32(stabi_elem_ptr(p, dtype, i * ld), dtype, cols, buf);
  return buf;
}

/* A stored matrix A, or A - B: each with its own dtype (a BF16 checkpoint against an F32 one),
 * one row stride ld in elements. b NULL: B = 0. */
typedef struct {
  const void *a, *b;
  stab_dtype at, bt;
  size_t ld;
} stabi_src;

static inline int stabi_src_is_f32(const stabi_src *m) {
  return m->at == STAB_DTYPE_F32 && (!m->b || m->bt == STAB_DTYPE_F32);
}

/* The f32 tiles a pass converts 16-bit rows into: `slots` of them (one per thread), each a
 * pair (A's rows, B's rows) of `floats` floats. */
typedef struct {
  float *buf;
  size_t floats;
  int slots;
} stabi_tiles;

/* The SIMD pass kernels' runs of rows (gram_pass.c: the accumulation's f32 sums span up to
 * this many rows, from a chunk's or a tile's first row); a multiple of 8, the row blocks of
 * every pass kernel. */
#define STABI_RUN_ROWS 32
/* Rows of cols elements a tile holds: a multiple of STABI_RUN_ROWS (so that a tile boundary is
 * never inside a block or a run: the sums are those of one call over the f32 rows, bit for
 * bit) of about STABI_TILE_FLOATS floats, at least STABI_RUN_ROWS. */
#define STABI_TILE_FLOATS ((size_t)32768)
static inline size_t stabi_tile_rows(size_t cols) {
  size_t r = STABI_TILE_FLOATS / cols / STABI_RUN_ROWS * STABI_RUN_ROWS;
  return r < STABI_RUN_ROWS ? STABI_RUN_ROWS : r;
}
/* Floats of one tile of rows of cols elements (stabi_tiles.floats), 0 past what memory holds. */
static inline size_t stabi_tile_floats(size_t cols) {
  const size_t f = stabi_mul(stabi_tile_rows(cols), cols);
  return f && f < STABI_TILE_FLOATS ? STABI_TILE_FLOATS : f;
}

/* ---- the threads that share a pass or a monitor step (pass_pool.c) ---- */

/* One task of a job: task k of n, run by the thread of this slot (0 the caller, 1.. the
 * workers that joined; slots are unique among the threads of one job, < its thread count). */
typedef void (*stabi_task_fn)(void *arg, size_t k, int slot);

/* Runs fn(arg, k, slot) once for every k in [0, n), on the calling thread and up to
 * threads - 1 pooled workers (created the first time they are wanted, asleep between jobs),
 * each task claimed by whichever thread is free, and returns once every task has ended, with
 * what they wrote visible. The caller never waits for a worker that has not started: one that
 * is not scheduled claims nothing. When the pool is busy with another job (another thread's,
 * or a task of an enclosing job), or threads cannot be created, the tasks run serially on the
 * caller, in order. Safe from any number of threads, and in the child of a fork. Returns the
 * threads that took part (1: serial). */
int stabi_pool_run(size_t n, int threads, stabi_task_fn fn, void *arg);

/* The CPUs this process may run on (sched_getaffinity), at least 1. */
int stabi_pool_cpus(void);
/* threads as a params.threads value means: itself when > 0, 0 = stabi_pool_cpus(). */
int stabi_pool_threads(int threads);

/* ---- the pass over a matrix (gram_pass.c) ---- */

/* The fixed split of rows into chunks: fixed by the shape, never by the thread count, so
 * the order of every floating-point sum is the same for any number of threads. */
#define STABI_MAX_CHUNKS 16
size_t stabi_chunk_count(size_t rows);

/* Y = G X with G = (A - B)^T (A - B) (B may be NULL), A and B rows x cols with row stride
 * ld, in one pass: each row's dots with the nv (1, 2 or 4) vectors of X (x + v cols), then the
 * row scaled by them into per-chunk f64 accumulators while the row is in cache. Y holds nv x
 * cols doubles; partial holds stabi_chunk_count(rows) * nv * cols (at least 2 * cols), and X
 * overlaps neither (the f32 copy of X is kept in one of them during the pass). f64 = 0: products
 * and partial sums in f32 runs added into f64 (gram_pass.c says how long; the caller's tol is
 * then at least STAB_SPECTRAL_F32_TOL_MIN); 1: all in f64. Returns x_0^T G x_0. */
double stabi_gram_apply(const stabi_src *m, size_t rows, size_t cols, const double *x, double *y,
                        double *partial, const stabi_tiles *tiles, int threads, int nv, int f64);

/* s[a][b] = <x_a, y_b> for four f64 vectors each side, n long, in f64 (with this processor's
 * kernel: FMA in the SIMD builds): the blocks of the rows-side Gram matrix spectral.c forms for
 * matrices with few rows, and Gram-Schmidt's coefficients. */
void stabi_dot4x4(const double *const x[4], const double *const y[4], size_t n, double s[4][4]);

/* z_v -= sum_{a < 4} c[a][v] q_a over n doubles for v < nz <= 4, the four terms subtracted in
 * order (FMA in the SIMD builds): classical Gram-Schmidt's update for four basis vectors. */
void stabi_sub4(const double *const q[4], const double c[4][4], double *const z[4], size_t nz, size_t n);

/* The relative error of sigma to report for an estimate whose own bound is err (theta its
 * eigenvalue of G): at least STABI_F32_PASS_REL_ERR when its passes were f32 runs (tol at or
 * above STAB_SPECTRAL_F32_TOL_MIN) and theta > 0. err is about the matrix the passes
 * applied, which the f32 runs perturb: a Krylov space that ends (rank 1, few rows) gave err 0
 * where sigma was 2.6e-9 off. */
#define STABI_F32_PASS_REL_ERR 1e-7
static inline double stabi_pass_rel_err(double err, double theta, double tol) {
  if (tol < STAB_SPECTRAL_F32_TOL_MIN || !(theta > 0.0) || !(err < STABI_F32_PASS_REL_ERR)) return err;
  return STABI_F32_PASS_REL_ERR;
}

/* ---- spectral workspace internals (spectral.c) ---- */

/* stab_spectral_norm_reduced's hook, held by the workspace during that call only: fn NULL
 * otherwise. whole_rows: rows of the whole matrix (the Lanczos run-to-the-end rule is about
 * it, not about one shard); status: the first failure of fn. */
typedef struct {
  stab_spectral_reduce_fn fn;
  void *ctx;
  size_t whole_rows;
  stab_status status;
} stabi_pass_reduce;

/* Grows the workspace to hold rows x cols matrices (never shrinks). */
stab_status stabi_spectral_reserve(stab_spectral_workspace *ws, size_t rows, size_t cols);
const stab_spectral_params *stabi_spectral_params(const stab_spectral_workspace *ws);
/* stab_spectral_norm of a stored matrix of any dtype read natively, already validated (the
 * layer's shape); out is reset first. Allocates nothing. */
stab_status stabi_spectral_norm_src(stab_spectral_workspace *ws, const stabi_src *m, size_t rows,
                                    size_t cols, double *v, stab_sigma_result *out);
size_t stabi_spectral_bytes(const stab_spectral_workspace *ws);

/* ---- sets of vectors stored as the rows or the columns of a matrix (norms.c, diameter.c) ----
 * An embedding table or an LM head is a set of vectors r_i = a_i - b_i (b NULL: a_i) of
 * `coords` numbers each: the rows of a matrix with row stride ld, or its columns. */
/* A set that is one shard of a larger one (a table split by vocabulary): its sums and maxima
 * are completed over the shards (stab_table_metrics_reduced); whole_items: the whole set's
 * items; status: the first failure of ops, after which every completed value is NaN. */
typedef struct {
  stab_shard_reduce ops;
  size_t whole_items;
  stab_status status;
} stabi_items_reduce;

static inline void stabi_items_complete(stabi_items_reduce *r, int max, double *x, size_t n) {
  if (r->status == STAB_OK) r->status = max ? r->ops.max(r->ops.ctx, x, n) : r->ops.sum(r->ops.ctx, x, n);
  if (r->status != STAB_OK)
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

typedef struct {
  const void *a, *b;
  stab_dtype at, bt;      /* how a and b are stored */
  size_t items, coords, ld;
  int items_are_rows;
  float *ra, *rb;         /* a stored row of a and of b as f32 (items or coords floats, whichever
                             a row holds), for 16-bit sets; unused for F32 */
  stabi_items_reduce *shards; /* NULL, or the set is this shard of a larger one */
} stabi_set;

/* Stored row t of the set (item t when items are rows; coordinate t of every item when they
 * are columns) as f32: *a, and *b (NULL when the set has no b). */
static inline void stabi_set_row(const stabi_set *s, size_t t, const float **a, const float **b) {
  const size_t len = s->items_are_rows ? s->coords : s->items;
  *a = stabi_row_f32(s->a, s->at, s->ld, t, len, s->ra);
  *b = s->b ? stabi_row_f32(s->b, s->bt, s->ld, t, len, s->rb) : NULL;
}

/* For one contiguous item r = a - b (b may be NULL) of n numbers: sum_t (r_t - c_t)^2 into
 * *centred (c may be NULL: then c = 0) and sum_t r_t^2 as the result. Eight running sums in
 * a fixed order, so the same result from every build (one sum chain was latency-bound). */
double stabi_item_sumsq(const float *a, const float *b, const double *c, size_t n,
                        double *centred);

/* max_i ||r_i||_RMS. work: `items` doubles (used when items are columns). */
double stabi_set_max_rms(const stabi_set *s, double *work);

/* Upper bound of the diameter max_{i,j} ||r_i - r_j||_RMS: 2 max_i ||r_i - c||_RMS with c
 * the mean item, never above 2 max_i ||r_i||_RMS. work: coords + items doubles. When
 * max_sumsq is not NULL it receives max_i ||r_i||^2, bit for bit the square that
 * stabi_set_max_rms takes the root of (the same sums in the same order), so a caller that
 * needs both reads the set twice instead of three times. */
double stabi_set_diameter_centred(const stabi_set *s, double *work, double *max_sumsq);

/* The diameter exactly (plus a rounding margin that keeps it an upper bound), all pairs by
 * blocked dgemm in f64. work: stabi_set_work(items, coords, 1) doubles. */
double stabi_set_diameter_exact(const stabi_set *s, double *work);

/* Doubles of workspace the functions above need for a set (exact: with the exact diameter);
 * SIZE_MAX when that does not fit in size_t. */
size_t stabi_set_work(size_t items, size_t coords, int exact);

/* Sum of squares of A - B (m->b may be NULL), rows x cols, in f64. ra, rb: cols floats each
 * (rows of 16-bit matrices are converted there), unused for F32. */
double stabi_sumsq(const stabi_src *m, size_t rows, size_t cols, float *ra, float *rb);

/* ---- one layer's metrics (layer_metrics.c) ---- */

/* Where a layer's numbers sit in memory, resolved and validated from its descriptor. */
typedef struct {
  size_t d_in, d_out;     /* the layer's sizes in its kind's math, y = x W with W d_in x d_out:
                             a table's from its vocab and width (embedding V x d, lm_head d x V),
                             every other kind's as given */
  size_t rows, cols, ld;  /* the stored matrix (gain, bias: 1 x d) */
  int items_are_rows;     /* embedding, lm_head: the token/class vectors are rows */
  size_t heads, dh;       /* attention: heads and head width */
  size_t kv_heads;        /* attention: key heads (heads unless grouped-query) */
  size_t block_rows, block_cols, block_step; /* attention: one head's block, and the offset
                                                in elements from one head to the next */
} stabi_shape;

/* Validates a layer (who names the caller in messages) and resolves its storage. */
stab_status stabi_layer_shape(const stab_layer *l, const char *who, stabi_shape *out);

/* ---- which registered layers share stored numbers (monitor.c, shared_storage.c) ---- */

/* The resolved storage of the monitor's layer i, as registered; NULL when i is out of range. */
const stabi_shape *stabi_monitor_shape(const stab_monitor *m, size_t i);

/* One tensor registered twice (a tied embedding and LM head), or a layer whose weights point
 * into another's (q and k inside a fused qkv linear), found from the address ranges of every
 * layer's stored numbers (weight, weight_k, bias), so that counting parameters per layer does
 * not count a float twice. */
typedef struct {
  int64_t *unique;  /* (n_layers) floats of the layer that no layer registered before it holds:
                       the sum over layers is the number of distinct floats */
  size_t **with;    /* (n_layers) the other layers holding at least one of its floats, ascending */
  size_t *n_with;   /* (n_layers) */
  size_t n_layers;
} stabi_sharing;

/* Fills *out for every layer of m (who names the caller in messages). STAB_ENOMEM. */
stab_status stabi_sharing_find(const stab_monitor *m, const char *who, stabi_sharing *out);
/* Frees what stabi_sharing_find allocated; a zeroed struct is a no-op. */
void stabi_sharing_free(stabi_sharing *s);

/* The update of a layer: dW = w - w_sub (w_sub NULL: dW = w), same for bias and key. */
typedef struct {
  const float *w, *w_sub, *b, *b_sub, *k, *k_sub;
  stab_dtype wt, sub_t;   /* how w, b, k and how w_sub, b_sub, k_sub are stored (0: F32) */
} stabi_delta;

/* Everything a measurement borrows. ws must fit the layer's blocks; work holds
 * stabi_layer_work() doubles. */
typedef struct {
  stab_spectral_workspace *ws;
  double *work;
  stab_tight_method tight;
  float *rowbuf;          /* 2 * stabi_layer_rowbuf() floats: rows of 16-bit layers as f32; NULL
                             for F32 layers (the monitor's), which are read in place */
  stabi_items_reduce *shards; /* a table split by vocabulary (stab_table_metrics_reduced), else NULL */
} stabi_ctx;

/* Floats of ctx->rowbuf a layer of this shape needs per operand (A, B). */
size_t stabi_layer_rowbuf(const stabi_shape *sh);

size_t stabi_layer_work(const stabi_shape *sh, stab_tight_method tight);
/* Doubles of warm-start state a layer keeps between measurements. */
size_t stabi_warm_len(const stab_layer *l, const stabi_shape *sh);

/* Measures one layer. delta NULL: no update. warm: stabi_warm_len() doubles kept by the
 * caller between steps (zeros the first time), or NULL for cold starts. heads_out: attention
 * per-head bounds (heads doubles) or NULL. */
/* Metrics before any measurement: every value NaN, no flags. */
void stabi_layer_measure_clear(stab_metrics *m);

stab_status stabi_layer_measure(const stabi_ctx *ctx, const stab_layer *l, const stabi_shape *sh,
                                const stabi_delta *delta, double *warm, stab_metrics *out,
                                double *heads_out);

/* ---- input files (input_file.c) ---- */

/* 1 when path is a regular file (opened as stab_input_open does) whose first n (<= 16) bytes
 * are magic, else 0. Records no error: it is a format sniff, and the open that follows reports. */
int stabi_input_starts_with(const char *path, const void *magic, size_t n);

/* ---- checkpoint files (mapped_file.c) ---- */

/* A checkpoint file as its reader holds it: the path every message names, and the whole
 * file mapped read-only. */
typedef struct {
  char *path;         /* the caller's path, copied */
  unsigned char *map; /* the file's size bytes, read-only */
  uint64_t size;      /* bytes */
  _Atomic int *tripped; /* the input guard's mark: non-zero once a read ran past the file's end
                         (the file shrank under the mapping); NULL: unguarded */
} stabi_mapped;

/* Copies path into m and maps the regular file there, whole. A file shorter than min_bytes is
 * STAB_EFORMAT, "fewer than <what>"; open, stat or map failures are STAB_EIO with errno's
 * text; no memory for the copy is STAB_ENOMEM. On failure m holds nothing. */
stab_status stabi_mapped_open(stabi_mapped *m, const char *path, uint64_t min_bytes, const char *what);
/* Unmaps and frees what m holds, leaving it empty; an empty m (zeroed, or closed) is fine. */
void stabi_mapped_close(stabi_mapped *m);
/* The input guard (mapped_file.c): every mapping of stabi_mapped_open is guarded against the
 * file shrinking under it; a read past the new end reads zeros and marks the mapping. STAB_OK,
 * or STAB_EIO "[who: ]path: the file shrank while being read" once it is marked. */
stab_status stabi_mapped_shrunk(const stabi_mapped *m, const char *who);
/* The path of a guarded mapping overlapping [p, p + len) that a read ran past the end of, else
 * NULL (one atomic load while no file ever shrank). The path lives as long as the mapping. */
const char *stabi_guard_tripped_in(const void *p, size_t len);
/* STAB_OK, or STAB_EIO "[who: ]path: the file shrank while being read" for that mapping. */
stab_status stabi_guard_check(const void *p, size_t len, const char *who);
/* How many reads ran past a guarded file's end so far, in the whole process. */
unsigned long stabi_guard_trips(void);

/* ---- a split GGUF model (ckpt_gguf_split.c) ---- */

/* The bytes of a GGUF file as mapped (0 for NULL). */
uint64_t stabi_gguf_file_size(const stab_gguf *g);

/* llama.cpp's gguf-split files, every shard of one model: PREFIX-0000k-of-0000N.gguf. */
typedef struct stabi_gguf_split stabi_gguf_split;
/* g's place in a split model: metadata split.no (0-based) into *no and split.count into *count;
 * a file without them is shard 0 of 1. Inconsistent values are STAB_EFORMAT naming path. */
stab_status stabi_gguf_split_info(const stab_gguf *g, const char *path, size_t *no, size_t *count);
/* Every shard of the split model whose shard `first` (opened from path, split.count > 1) is: the
 * siblings by name, each checked (its split.no and split.count, split.tensors.count the same in
 * all and equal to the tensors they hold, no tensor twice). On success *out owns first; on
 * failure first is still the caller's. A missing shard is STAB_ENOTFOUND naming it. */
stab_status stabi_gguf_split_open(const char *path, stab_gguf *first, stabi_gguf_split **out);
/* The first shard (PREFIX-00001-of-NNNNN.gguf) of the one split model in dir, malloc'ed into
 * *first; STAB_ENOTFOUND (no error recorded) when dir holds none, or holds safetensors; two
 * models there are STAB_EINVAL. */
stab_status stabi_gguf_split_first_in(const char *dir, char **first);
void stabi_gguf_split_close(stabi_gguf_split *s);
size_t stabi_gguf_split_count(const stabi_gguf_split *s);
const stab_ckpt_tensor *stabi_gguf_split_tensor(const stabi_gguf_split *s, size_t i);
stab_status stabi_gguf_split_find(const stabi_gguf_split *s, const char *name, size_t *index);
size_t stabi_gguf_split_shard_count(const stabi_gguf_split *s);
const stab_gguf *stabi_gguf_split_shard(const stabi_gguf_split *s, size_t k);
const char *stabi_gguf_split_shard_path(const stabi_gguf_split *s, size_t k);
size_t stabi_gguf_split_shard_of(const stabi_gguf_split *s, size_t i);
/* Shard k's first byte in the model as one sequence of bytes (the earlier shards' sizes). */
uint64_t stabi_gguf_split_base(const stabi_gguf_split *s, size_t k);

/* ---- GGUF block-quantized tensors (gguf_dequant.c) ---- */

/* One ggml block layout: its GGML name, elements and bytes per block, and the decoder that
 * writes a block's `block` elements as f32, exactly as ggml's dequantize_row does. */
typedef struct {
  const char *name;
  uint32_t block, bytes;
  void (*decode)(const unsigned char *blk, float *out);
} stabi_quant_type;

/* The layout named dtype_name ("Q4_K", ...), or NULL when it is not one decoded here. */
const stabi_quant_type *stabi_quant_find(const char *dtype_name);
/* Elements [first, first + n) of t, stored as q (the range already checked against t->count),
 * into out: decodes each block the range touches. STAB_EFORMAT when t->count is not whole
 * blocks. */
stab_status stabi_dequant(const stab_ckpt_tensor *t, const stabi_quant_type *q, uint64_t first, size_t n,
                          float *out);

/* ---- JSON files beside a checkpoint: config.json, a sharded model's index (json.c) ---- */

typedef enum {
  STABI_JSON_NULL, STABI_JSON_FALSE, STABI_JSON_TRUE, STABI_JSON_NUMBER, STABI_JSON_STRING,
  STABI_JSON_ARRAY, STABI_JSON_OBJECT
} stabi_json_type;

/* One JSON value; a tree owns its children. Kept small (48 bytes): a hostile file of N bytes
 * can hold N / 2 values, and the tree must stay within a small multiple of the file. */
typedef struct stabi_json {
  stabi_json_type type;
  int is_uint;               /* NUMBER written as a non-negative integer that fits 64 bits: u */
  size_t at;                 /* byte offset of the value in the text, for messages */
  size_t n;                  /* ARRAY, OBJECT: members */
  uint64_t u;
  union {
    double num;              /* NUMBER */
    char *s;                 /* STRING, decoded (valid UTF-8, no NUL) */
    struct {
      struct stabi_json *items; /* ARRAY, OBJECT: (n) values */
      char **keys;              /* OBJECT: (n) keys, decoded, unique */
    };
  };
} stabi_json;

/* Parses len bytes of text (path names it in messages) into *out: strict RFC 8259 (plus Python's
 * NaN, Infinity and -Infinity, as numbers), strings valid
 * UTF-8 without \u0000, no duplicate key in an object, nesting at most 64 deep. STAB_EFORMAT
 * naming path and the byte offset; STAB_ENOMEM. On failure *out holds nothing. */
stab_status stabi_json_parse(const char *text, size_t len, const char *path, stabi_json *out);
/* Reads the regular file at path (at most max_bytes; see stab_input_open) and parses it. */
stab_status stabi_json_read(const char *path, uint64_t max_bytes, stabi_json *out);
/* Frees what a parse allocated; a zeroed value is fine. */
void stabi_json_free(stabi_json *v);
/* The member key of an object, or NULL (not an object, or no such key). */
const stabi_json *stabi_json_get(const stabi_json *obj, const char *key);
/* "a string", "a number", ... for messages. */
const char *stabi_json_type_name(const stabi_json *v);

#endif /* STABMETER_INTERNAL_H */
