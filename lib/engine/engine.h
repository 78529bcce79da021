/* engine.h — the spectral engine's internals (lib/engine/): stored numbers in the dtypes read
 * natively, the pass pool's threads, the Gram pass, the spectral workspace, and the sets of
 * vectors that norms and diameters are taken over. Never installed. */
#ifndef STABMETER_ENGINE_H
#define STABMETER_ENGINE_H

#include "core/core.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- stored numbers in the dtypes read natively (stored_rows.c) ----
 * F32, F16 and BF16 in host byte order. Pointers to 16-bit data travel as const float * in
 * stab_layer; inside the library they are const void * and offsets are in elements. */

/* Bytes per element: 4 (F32), 2 (F16, BF16); 0 for a dtype not read natively. Inline, as the
 * header's other helpers are, so that nothing here calls back into a file that includes it. */
static inline size_t stabi_dtype_size(stab_dtype dtype) {
  switch (dtype) {
  case STAB_DTYPE_F32: return 4;
  case STAB_DTYPE_F16:
  case STAB_DTYPE_BF16: return 2;
  case STAB_DTYPE_OTHER:
  case STAB_DTYPE_QUANT: break;
  }
  return 0;
}
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
const float *stabi_row_f32(const void *p, stab_dtype dtype, size_t ld, size_t i, size_t cols, float *buf);

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

/* The SIMD pass kernels' runs of rows (gram_simd.h: the accumulation's f32 sums span up to
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

/* ---- threads' scheduling priority (priority.c) ---- */

/* A thread's scheduling: policy (SCHED_OTHER, SCHED_BATCH, SCHED_IDLE or a real-time one),
 * sched_priority (real-time policies only) and nice value. */
typedef struct {
  int policy, priority, nice;
} stabi_sched;

pid_t stabi_thread_id(void);
/* The scheduling of thread tid (0: the calling one); 0 when it cannot be read. */
int stabi_sched_read(pid_t tid, stabi_sched *s);
/* Whether s ranks below a normal thread: SCHED_IDLE, or a positive nice value. */
int stabi_sched_below_normal(const stabi_sched *s);
int stabi_sched_same(const stabi_sched *a, const stabi_sched *b);
/* Gives thread tid (0: the calling one), which has `from`, the scheduling `to`; 0 when refused
 * (the thread may then have part of it). */
int stabi_sched_set(pid_t tid, const stabi_sched *from, const stabi_sched *to);

/* One background measurement at a time at idle priority (stab_monitor_measure_idle): enter
 * lowers the calling thread to SCHED_IDLE, unless this process may not raise it back
 * (stab_idle_priority_allowed) or hurry was already called with this ticket; leave, or hurry
 * with the same ticket from any thread, gives it back the scheduling it had. */
typedef struct {
  pthread_mutex_t lock;
  uint64_t ticket, hurried_ticket;
  int hurried, lowered;
  pid_t tid;                /* the thread that entered */
  stabi_sched saved, low;   /* what it had, and what it was given */
} stabi_idle_turn;

void stabi_idle_turn_init(stabi_idle_turn *t);
void stabi_idle_turn_destroy(stabi_idle_turn *t);
void stabi_idle_enter(stabi_idle_turn *t, uint64_t ticket);
void stabi_idle_leave(stabi_idle_turn *t);
void stabi_idle_hurry(stabi_idle_turn *t, uint64_t ticket);

/* The CPUs this process may run on (sched_getaffinity), at least 1. */
int stabi_pool_cpus(void);
/* threads as a params.threads value means: itself when > 0, 0 = stabi_pool_cpus(). */
int stabi_pool_threads(int threads);

/* ---- the pass over a matrix (gram_pass.c) ---- */

/* The fixed split of rows into chunks: fixed by the shape, never by the thread count, so
 * the order of every floating-point sum is the same for any number of threads. */
#define STABI_MAX_CHUNKS 16
size_t stabi_chunk_count(size_t rows, size_t cols);

/* Y = G X with G = (A - B)^T (A - B) (B may be NULL), A and B rows x cols with row stride
 * ld, in one pass: each row's dots with the nv (1, 2 or 4) vectors of X (x + v cols), then the
 * row scaled by them into per-chunk f64 accumulators while the row is in cache. Y holds nv x
 * cols doubles; partial holds stabi_chunk_count(rows, cols) * nv * cols (at least 2 * cols), and X
 * overlaps neither (the f32 copy of X is kept in one of them during the pass). f64 = 0: products
 * and partial sums in f32 runs added into f64 (gram_kernels.h says how long; the caller's tol is
 * then at least STAB_SPECTRAL_F32_TOL_MIN); 1: all in f64. Returns x_0^T G x_0. */
double stabi_gram_apply(const stabi_src *m, size_t rows, size_t cols, const double *x, double *y,
                        double *partial, const stabi_tiles *tiles, int threads, int nv, int f64);

/* ---- the pass kernels (gram_pass.c picks one; gram_avx2.c, gram_avx512.c) ----
 * What stabi_gram_apply runs on each chunk of rows, exposed for bench/pass_ceiling, which times
 * them without the pass around them. */

/* Rows [r0, r1) of one chunk: for nv vectors x_v (x + v cols), acc_v += sum_i d_iv r_i with
 * d_iv = <r_i, x_v> and r_i = a_i - b_i (acc holds nv x cols doubles, zeroed by the caller);
 * returns quad + sum_i d_i0^2, added row by row. A chunk stored as 16-bit numbers arrives as
 * successive tiles of whole 8-row blocks, each call carrying acc and quad on from the last,
 * so the sums are the very ones a single call over the f32 rows makes. Every build has the
 * same shape: blocks of 8 rows, then single rows. nv is 1, 2 or 4: a further vector reuses each
 * loaded element, so it costs far less than a pass (the f64 SIMD builds take 4 vectors as two
 * passes of 2 over the chunk's rows, which are then in cache: the precise path is not the fast
 * one). All in f64. */
typedef double (*stabi_chunk_fn)(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                                 size_t ld, const double *x, double *acc, int nv, double quad);

/* The same with f32 runs (gram_kernels.h says how long); x32 is x / xup[v] rounded to f32 once
 * per pass (nv x cols floats), xup[v] a power of two. */
typedef double (*stabi_chunk32_fn)(const float *a, const float *b, size_t r0, size_t r1, size_t cols,
                                   size_t ld, const float *x32, const double *xup, const double *x,
                                   double *acc, int nv, double quad);

typedef void (*stabi_dot4x4_fn)(const double *const x[4], const double *const y[4], size_t n, double s[4][4]);
typedef void (*stabi_sub4_fn)(const double *const q[4], const double c[4][4], double *const z[4], size_t nz,
                              size_t n);

/* One build of the kernels: AVX-512, AVX2+FMA or portable C. */
typedef struct {
  const char *name;            /* "avx512", "avx2", "generic": stab_spectral_kernel() */
  stabi_chunk_fn chunk;        /* f64, F32 rows (A, or A - B) */
  stabi_chunk_fn chunk_bf16;   /* f64, A stored as BF16 and no B, read as it is stored (b is
                                  ignored); NULL: such rows go through the f32 tiles */
  stabi_chunk32_fn chunk32;    /* f32 runs, F32 rows */
  stabi_chunk32_fn chunk32_bf16;
  stabi_dot4x4_fn dot4x4;      /* stabi_dot4x4 */
  stabi_sub4_fn sub4;          /* stabi_sub4 */
} stabi_gram_kernel;

/* The best build this processor runs, or the one named by the environment's STAB_KERNEL (for
 * comparisons; a name it cannot run falls back to the best). Chosen once; every thread gets
 * the same. */
const stabi_gram_kernel *stabi_gram_kernel_chosen(void);

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
/* 16-bit matrices up to this many elements (4 MiB as f32) are converted once per estimate
 * instead of once per pass: an attention head's block (128 x 4096 in Llama-7B) takes 30-60
 * passes, and converting it at each one cost more than the passes (1.8 s a layer of 32 heads
 * against 0.4 s). The kernels see the same numbers in the same order either way. */
#define STABI_WHOLE_FLOATS ((size_t)1 << 20)
/* Makes the f32 copy that stabi_spectral_norm_src converts a small 16-bit matrix (and the one
 * subtracted from it) into once per estimate hold rows x cols (never shrinks; nothing for the
 * exact method or a matrix too large for it, which go through the tiles), so that measuring
 * such a matrix allocates nothing: the monitor's promise. Kept by stabi_spectral_reserve. */
stab_status stabi_spectral_reserve_whole(stab_spectral_workspace *ws, size_t rows, size_t cols);
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
void stabi_set_row(const stabi_set *s, size_t t, const float **a, const float **b);

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

#endif /* STABMETER_ENGINE_H */
