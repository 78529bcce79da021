/* stabmeter.h — per-layer stability metrics of neural-network weights.
 *
 * The three metrics of every layer (forward, dependency and update stability, each
 * defined in docs/metrics.md, installed as $(docdir)/metrics.md) computed from f32 weights
 * in memory: pure functions for one layer,
 * and a monitor that a trainer creates once, registers its layers with, and asks for
 * the metrics every step without any allocation.
 *
 * Conventions used throughout:
 *  - Math is y = x W + b with W in R^{d_in x d_out}. In memory W is either out-major,
 *    [d_out][d_in] row-major (PyTorch nn.Linear, llm.c, GGUF), or in-major, [d_in][d_out].
 *  - Every function that can fail returns a stab_status (STAB_OK = 0, errors negative);
 *    results come back through output pointers. The library never prints, never exits,
 *    never aborts; a failure's detail is in stab_last_error() of the calling thread.
 *  - Weights are f32 (stab_layer_metrics also reads F16 and BF16 as stored: stab_layer.dtype);
 *    every sum accumulates in f64. Results do not depend on the number of threads.
 *  - A metric that does not exist for a kind, or is not yet measured, is NaN.
 */
#ifndef STABMETER_H
#define STABMETER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STAB_VERSION_MAJOR 0
#define STAB_VERSION_MINOR 9
#define STAB_VERSION_PATCH 0
#define STAB_VERSION_STRING "0.9.0"

/* The version of the library actually linked, "MAJOR.MINOR.PATCH". */
const char *stab_version(void);

/* ---------------------------------------------------------------------------------- */
/* Status codes                                                                        */

typedef enum {
  STAB_OK = 0,
  STAB_EINVAL = -1,   /* an argument is invalid: NULL where data is needed, unknown enum, bad tolerance */
  STAB_EDIM = -2,     /* a dimension is zero, inconsistent or so large that sizes overflow */
  STAB_ENOMEM = -3,   /* an allocation failed */
  STAB_ENOTFOUND = -4,/* no layer with that index or name */
  STAB_EEXIST = -5,   /* a layer with that name is already registered; or a file is already
                         where an output goes and was not to be replaced (stab_output_check) */
  STAB_ESTATE = -6,   /* a call out of order, e.g. an update measured with no snapshot taken */
  STAB_ELAPACK = -7,  /* LAPACK reported a failure (the message has its info code) */
  STAB_ERANGE = -8,   /* a value is out of its valid range (e.g. heads not dividing d_out) */
  STAB_EIO = -9,      /* a file could not be created, opened, sized, mapped, read or written (the
                         message names the path, with HDF5's or errno's own text) */
  STAB_EFORMAT = -10, /* a checkpoint file breaks its format's rules (the message names the file
                         and the field or byte offset at fault) */
  STAB_EBUSY = -11    /* another process is writing that trace (it holds the trace's lock) or
                         changed it while this one was opening it; nothing of it was touched */
} stab_status;

/* A static, human-readable name of a status, "unknown status" for anything else. */
const char *stab_strerror(stab_status status);

/* The message of the last failure on the calling thread (thread-local, overwritten by
 * the next failure on that thread), e.g. "stab_linear_metrics: d_in is 0". Never NULL. */
const char *stab_last_error(void);

/* Optional sink for diagnostics (failures and non-finite-weight warnings naming the
 * layer). Called from the thread that hit them (a monitor step's layers are measured on the
 * library's pooled threads); must not call back into the library.
 * Pass NULL to remove. Process-wide; set it before other threads use the library. */
typedef void (*stab_message_fn)(void *user, const char *message);
void stab_set_message_handler(stab_message_fn fn, void *user);

/* Decodes the UTF-8 sequence at the start of s (at most n bytes): its length in bytes (1 to
 * 4) and, when cp is not NULL, its code point; 0 when s does not start with a valid one. Strict
 * (RFC 3629): overlong forms, surrogates (U+D800..U+DFFF) and code points above U+10FFFF are
 * invalid. It is the test the checkpoint readers apply to names and the monitor to layer names;
 * a program that prints strings from a file (metadata values) can use it to escape them. */
int stab_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* ---------------------------------------------------------------------------------- */
/* Layer kinds and layouts                                                             */

/* Which kind a tensor is (docs/metrics.md has each kind's metrics):
 *  - a weight matrix with its bias: one linear layer (the bias in .bias, not a layer of its own);
 *  - a norm: RMSNorm has a gain; LayerNorm has a gain (its weight, kind gain) and a bias (its
 *    beta, kind bias: a bias with no weight matrix to pair with, the gain being no linear layer);
 *  - a tied token table is one tensor registered twice, as embedding and as lm_head, under two
 *    names and with the same .vocab, .width and .weight;
 *  - a fused q/k/v matrix is registered as its linear layer(s) and, for its q and k blocks, one
 *    attention layer (both reading the same memory). */
typedef enum {
  STAB_KIND_LINEAR = 0,    /* weight W (d_in x d_out), optional bias of length d_out */
  STAB_KIND_EMBEDDING = 1, /* token table: .vocab = V rows (one per token), .width = d */
  STAB_KIND_LM_HEAD = 2,   /* class table: .vocab = V classes (one row each), .width = d */
  STAB_KIND_GAIN = 3,      /* RMSNorm/LayerNorm gain gamma: d_in = d_out = d */
  STAB_KIND_BIAS = 4,      /* a bias with no weight to pair with (a LayerNorm's beta):
                              d_in = d_out = d */
  STAB_KIND_ATTENTION = 5  /* attention logits of query/key projections, per head */
} stab_kind;

/* "linear", "embedding", "lm_head", "gain", "bias", "attention"; NULL if unknown. */
const char *stab_kind_name(stab_kind kind);

typedef enum {
  /* The kind's usual layout: out-major for linear, lm_head and attention; one row per
   * token ([V][d]) for embedding and lm_head tables; ignored for gain and bias. */
  STAB_LAYOUT_NATURAL = 0,
  STAB_LAYOUT_OUT_MAJOR = 1, /* [d_out][d_in] row-major */
  STAB_LAYOUT_IN_MAJOR = 2   /* [d_in][d_out] row-major */
} stab_layout;

/* How stored numbers are encoded: a checkpoint tensor's type (stab_ckpt_tensor.dtype) and the
 * weights of a layer (stab_layer.dtype). The layer functions read F32, F16 and BF16 natively,
 * in host byte order (the in-memory layout of a uint16_t array of them, i.e. the files' own
 * little-endian bytes on a little-endian host). */
typedef enum {
  STAB_DTYPE_F32 = 0,
  STAB_DTYPE_F16 = 1,   /* IEEE binary16 */
  STAB_DTYPE_BF16 = 2,  /* bfloat16: the high half of an f32 */
  STAB_DTYPE_OTHER = 3, /* a valid type of the format that is not converted to f32 (integers,
                           bool, F64, FP8, GGUF's I-quants but IQ4_*): listed, never measured */
  STAB_DTYPE_QUANT = 4  /* a GGUF block-quantized type that converts to f32 (dtype_name says
                           which: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K, IQ4_NL, IQ4_XS) */
} stab_dtype;

/* ---------------------------------------------------------------------------------- */
/* Spectral norms                                                                      */

typedef enum {
  STAB_SPECTRAL_LANCZOS = 0, /* block Lanczos (blocks of 2) on the Gram matrix, full
                                reorthogonalisation (default) */
  STAB_SPECTRAL_POWER = 1,   /* power iteration on the Gram matrix */
  STAB_SPECTRAL_EXACT = 2    /* LAPACK dgesvd (values only) on an f64 copy: the reference */
} stab_spectral_method;

/* Bounds of the parameters below (every function taking them returns STAB_EINVAL outside).
 * TOL_MIN: f64 accumulation puts a floor of about 1e-14 under the relative error Lanczos can
 * certify (measured up to 1000 x 1000); below 1e-12 a tolerance would only make every estimate
 * run out of passes and be flagged not converged. KRYLOV_MAX: the basis takes krylov_dim x cols
 * doubles and the projected problem krylov_dim^2; more vectors than this gain nothing. */
#define STAB_SPECTRAL_TOL_MIN 1e-12
/* F32_TOL_MIN: the smallest tol that the fast passes honour. They keep products and partial
 * sums in f32 over short runs, each added into f64: sigma's actual error from them was at
 * most 2.5e-8 (Gaussian, spiked, low-rank, row- and column-scaled matrices up to 4096 x 4096),
 * and an estimate on them reports rel_err >= 1e-7. A smaller tol makes every pass of that
 * estimate all-f64 (about half the speed where memory is not the limit). */
#define STAB_SPECTRAL_F32_TOL_MIN 1e-6
#define STAB_SPECTRAL_MAX_PASSES 1000000
#define STAB_SPECTRAL_KRYLOV_MAX 1024

typedef struct {
  stab_spectral_method method;
  double tol;       /* target relative error of sigma, in [STAB_SPECTRAL_TOL_MIN, 0.5); default 1e-3.
                       Below STAB_SPECTRAL_F32_TOL_MIN the passes are all-f64 (slower) */
  int max_passes;   /* at most this many passes over the matrix, 1 to STAB_SPECTRAL_MAX_PASSES;
                       default 1000 */
  int krylov_dim;   /* Lanczos basis vectors kept before an explicit restart, 2 to
                       STAB_SPECTRAL_KRYLOV_MAX (rounded to whole blocks of 4 vectors, at
                       least 8); default 128 */
  int threads;      /* threads for a pass, >= 0; 0 = the CPUs this process may run on
                       (sched_getaffinity). A pass never uses more than it has row chunks (16),
                       nor threads for a matrix under 2^20 elements; a monitor step measures
                       its layers on this many threads, one matrix each. Threads sleep between
                       passes, and a pass never waits for one that is not running. Results are
                       bit-identical for every value. Default 0 */
  uint64_t seed;    /* seed of the cold-start vector; default 0x5eed */
} stab_spectral_params;

/* The defaults above. */
stab_spectral_params stab_spectral_default_params(void);

typedef struct {
  double sigma;     /* the estimate; power and Lanczos give lower bounds (Ritz values) */
  double rel_err;   /* estimated relative error of sigma; 0 for exact mode and for the zero matrix.
                       Lanczos and power: the residual bound, true of the eigenvalue nearest
                       the Ritz value, which is the top one unless the Krylov space has not
                       seen it yet (its record over families of matrices: docs/performance.md) */
  int passes;       /* passes made: products of W^T W with the current vector (power) or block
                       of 4 vectors (Lanczos), one read of the matrix each (in this version a
                       Lanczos pass still reads it twice, two vectors at a time) */
  int converged;    /* 1 when rel_err <= tol (always 1 in exact mode), 0 if max_passes ran out */
  int nonfinite;    /* 1 when the matrix holds NaN or Inf: sigma is then NaN */
} stab_sigma_result;

/* Workspace for spectral norms of matrices with rows <= max_rows and cols <= max_cols (the
 * stored shape; a transposed shape must fit on its own). It owns every buffer a computation needs, so stab_spectral_norm allocates
 * nothing. Not thread-safe: one workspace per concurrent caller.
 * Errors: out NULL or params outside their bounds STAB_EINVAL; a zero side, or a max_rows x
 * max_cols matrix of floats larger than memory can address, STAB_EDIM; STAB_ENOMEM. */
typedef struct stab_spectral_workspace stab_spectral_workspace;

stab_status stab_spectral_workspace_create(size_t max_rows, size_t max_cols,
                                           const stab_spectral_params *params,
                                           stab_spectral_workspace **out);
/* NULL is a no-op. */
void stab_spectral_workspace_free(stab_spectral_workspace *ws);

/* sigma(A) or, when b is not NULL, sigma(A - B) without forming A - B.
 *  a, b   rows x cols, row-major with row stride ld (>= cols; 0 means cols) elements; f32.
 *         Every function taking a matrix checks it alike: a NULL STAB_EINVAL; a zero side,
 *         ld < cols, or a span (rows - 1) * ld + cols of floats past what memory can address
 *         (more than PTRDIFF_MAX bytes) STAB_EDIM; the message names the argument
 *  v      warm-start vector of length cols, in f64, or NULL. On entry a previous estimate
 *         of the top right singular vector (all zeros or non-finite means cold start);
 *         on return the new estimate, unit-norm. Pass the same vector every step.
 *  out    the result. On a non-finite matrix out->nonfinite = 1, sigma NaN, return STAB_OK.
 * The shape must fit the workspace. In exact mode v is left untouched and passes is 1 (the
 * copy). Lanczos is exact (to rounding) on narrow matrices, but when depends on which side
 * is narrow and on v:
 *  - cols <= 32: always, warm start or not (the whole cols x cols Gram matrix is formed and
 *    its top eigenvalue taken; rel_err 0);
 *  - rows <= 128 with cols > rows (and rows <= krylov_dim, true of the default): only from a
 *    cold start (v NULL, all zeros or non-finite), where the Gram matrix of the rows side
 *    (rows x rows, from an f64 copy of A) is formed and its top eigenvalue taken (rel_err 0,
 *    passes 1). From a warm start the estimate stops at tol like any other matrix's: a lower
 *    bound within tol, in fewer passes.
 * cols is the stored row length, so an out-major attention head block (d_h rows of d) is the
 * second case: stab_layer_metrics (always cold) measures it exactly, a monitor (warm after its
 * first measurement of each layer) exactly once, then to tol. Power iteration always stops at
 * tol. */
stab_status stab_spectral_norm(stab_spectral_workspace *ws, const float *a, const float *b,
                               size_t rows, size_t cols, size_t ld, double *v,
                               stab_sigma_result *out);

/* The build of the pass kernel this process uses: "avx512", "avx2" (with FMA) or "generic",
 * the best the processor runs unless the environment variable STAB_KERNEL names another it
 * runs. Results differ between kernels by rounding only; within one they are reproducible. */
const char *stab_spectral_kernel(void);

/* One call without a workspace: creates one, computes, frees (allocates). params NULL means
 * the defaults; v may be NULL. Errors as stab_spectral_norm and stab_spectral_workspace_create
 * (out NULL STAB_EINVAL; on any error *out is NaN). */
stab_status stab_sigma(const float *a, size_t rows, size_t cols, size_t ld,
                       const stab_spectral_params *params, double *v, stab_sigma_result *out);

/* Sums a pass's products over the shards of a matrix, for stab_spectral_norm_reduced: on
 * entry y (n doubles: the pass's nv vectors of the shared length, one after the other) and
 * *quad (x_0^T G_k x_0) are this shard's; on return both must be the sums over every shard,
 * the same bits on every shard (else the shards' estimates part ways). Return STAB_OK, or a
 * failure, which stops the estimate and is returned by it. Stabmeter's MPI layer
 * (stabmeter_mpi.h) is one such; a caller with its own transport may write another. */
typedef stab_status (*stab_spectral_reduce_fn)(void *ctx, double *y, size_t n, double *quad);

/* sigma of a matrix split by rows among shards, W = [A_1; A_2; ...; A_P], this caller holding
 * A = A_k: the same Lanczos as stab_spectral_norm (warm start, stopping rule, error estimate,
 * f32 or f64 passes; exact when cols <= 32, and from a cold start when whole_rows <= 32, the
 * Krylov space run to its end: the few-rows Gram matrix of one process is not formed, a shard's
 * rows being some of W's) on G = W^T W = sum_k A_k^T A_k, each pass this
 * shard's product followed by reduce(ctx, ...). Every shard must call it with the same cols,
 * whole_rows, workspace params (threads aside) and v, and then takes the same decisions
 * (passes, restarts, stop, failure) and returns the same result, bit for bit.
 *  a           rows x cols, row stride ld (0 means cols), f32: this shard's rows, checked as
 *              stab_spectral_norm checks a; rows must fit the workspace
 *  whole_rows  the rows of W (the sum of every shard's rows), >= rows (else STAB_EDIM)
 *  reduce, ctx the sum over shards, called once per pass (never after a failure)
 *  v, out      as stab_spectral_norm's; on a failure of reduce, its status, sigma NaN
 * A shard split by columns is the same problem on W^T: pass A_k^T. The method must be
 * STAB_SPECTRAL_LANCZOS (else STAB_EINVAL). The argument checks above fail before the first
 * reduce, on this shard alone: a caller whose shards could disagree checks them together
 * first. Not thread-safe on one workspace. */
stab_status stab_spectral_norm_reduced(stab_spectral_workspace *ws, const float *a, size_t rows,
                                       size_t cols, size_t ld, size_t whole_rows,
                                       stab_spectral_reduce_fn reduce, void *ctx, double *v,
                                       stab_sigma_result *out);

/* ---------------------------------------------------------------------------------- */
/* Metrics of one layer                                                                */

enum {
  STAB_FLAG_NONFINITE_WEIGHT = 1 << 0, /* the weights (or bias, gain) hold NaN or Inf */
  STAB_FLAG_NONFINITE_UPDATE = 1 << 1, /* the update holds NaN or Inf */
  STAB_FLAG_NOT_CONVERGED = 1 << 2     /* a spectral estimate ran out of passes before tol */
};

typedef enum {
  STAB_TIGHT_CENTRED = 0, /* Dm <= 2 min(max_i ||w_i - mean||, max_i ||w_i||)_RMS, plus a
                             rounding margin, O(V d) (default) */
  STAB_TIGHT_EXACT = 1,   /* Dm exactly (plus a rounding margin), all pairs by blocked dgemm in
                             f64, O(V^2 d) */
  STAB_TIGHT_NONE = 2     /* tight values not computed (NaN) */
} stab_tight_method;

/* Every number measured for one layer. Fields that do not apply to the kind are NaN
 * (counts 0). See docs/metrics.md for each definition. */
typedef struct {
  double forward;          /* forward stability (lm_head: headline log V + 2 d R) */
  double dependency;       /* dependency stability; NaN for embedding, bias, attention */
  double update;           /* update stability; NaN when no update was given, and for
                              attention (no update is defined for the logit bound) */
  double forward_tight;    /* lm_head: log V + d Dm (an upper bound, see tight_method) */
  double dependency_tight; /* lm_head: d Dm */
  double update_tight;     /* lm_head: d dDm */
  double spread;           /* embedding: max_{i,j} ||E_i - E_j||_RMS (variant), by the tight
                              method (an upper bound, NaN with STAB_TIGHT_NONE);
                              lm_head: 4 d R (earlier revision); else NaN */
  double sigma;            /* linear: sigma(W); NaN for other kinds (attention: see per-head) */
  double sigma_rel_err;    /* estimated relative error of sigma */
  double sigma_update;     /* linear: sigma(dW) */
  double sigma_update_rel_err;
  double rel_update;       /* ||dW||_F / ||W||_F, W after the step (weight and bias together) */
  int passes;              /* passes over the weights by the spectral estimates */
  int update_passes;       /* passes over the update by its spectral estimate */
  int tight_method;        /* the stab_tight_method the tight values came from */
  int flags;               /* STAB_FLAG_* */
} stab_metrics;

/* A layer as the library sees it. Zero-initialise (designated initialisers), then fill what
 * the kind needs; every field the kind does not use stays 0 or NULL.
 *  linear:    d_in, d_out; weight W (d_in x d_out in `layout`), bias (d_out) or NULL
 *  embedding: vocab = V, width = d; weight the table, one token's vector per row [V][d]
 *             (layout NATURAL or IN_MAJOR), or per column [d][V] (OUT_MAJOR)
 *  lm_head:   vocab = V, width = d; weight the table, one class's vector per row [V][d]
 *             (layout NATURAL or OUT_MAJOR), or per column [d][V] (IN_MAJOR)
 *  gain:      d_in = d_out = d; weight gamma, d floats
 *  bias:      d_in = d_out = d; weight b, d floats
 *  attention: d_in = d, d_out = heads * d_h; weight = query projection, weight_k = key
 *             projection, each d_in x d_out in `layout` (the key d_in x kv_heads * d_h with
 *             grouped-query kv_heads); heads > 0; scale 0 means 1/sqrt(d_h).
 *             The bound covers the weights only: q and k biases are outside it (register
 *             them with their linear layers, e.g. the fused qkv's .bias)
 *
 * Tables. vocab and width say what the table is, not which side is the layer's input, so they
 * are the same two numbers for both kinds: a tied table is {.vocab = V, .width = d, .weight =
 * wte} as embedding and again as lm_head. d_in and d_out stay 0 for a table; given, they must
 * agree with the kind's math (embedding d_in = V, d_out = d; lm_head d_in = d, d_out = V),
 * else STAB_EINVAL. A table given d_in and d_out alone (the interface before 0.2.0, where one
 * pair swapped was accepted and gave plausible wrong values) is STAB_EINVAL, "use .vocab and
 * .width"; so are vocab or width on any other kind. stab_monitor_layer gives back d_in and
 * d_out filled in for every kind.
 *
 * ld is the row stride of the stored matrix in elements; 0 means the stored row length, i.e.
 * the rows are contiguous. Set it only to read a block of COLUMNS of a wider stored matrix;
 * a block of whole rows is contiguous: point weight at its first row and leave ld 0. For a
 * fused q/k/v of width C:
 *   llm.c qkvw, out-major [3C][C] (q, k, v are blocks of rows):
 *     q: {.d_in = C, .d_out = C, .weight = qkvw},  k: .weight = qkvw + C*C,  v: qkvw + 2*C*C;
 *     attention: {.d_in = C, .d_out = C, .heads = NH, .weight = qkvw, .weight_k = qkvw + C*C}
 *   HF GPT-2 Conv1D c_attn.weight, in-major [C][3C] (q, k, v are blocks of columns):
 *     q: {.d_in = C, .d_out = C, .layout = STAB_LAYOUT_IN_MAJOR, .ld = 3*C, .weight = w},
 *     k: .weight = w + C,  v: .weight = w + 2*C; attention likewise with .weight_k = w + C
 * WARNING: .ld = 3*C on llm.c's out-major qkvw is accepted and wrong. Its C rows of stride 3C
 * are rows 0, 3, 6, ... of the fused matrix (a third of q's rows, then k's, then v's): a
 * matrix of the right shape made of the wrong numbers, inside the buffer. The library cannot
 * tell it from a legitimate block (the first C input columns of an out-major [C][3C] matrix).
 *
 * Stored as F16 or BF16 (.dtype): weight, bias and weight_k point to 16-bit elements (cast the
 * uint16_t pointer: `.weight = (const float *)bf16`, no alignment beyond 2 bytes needed), and
 * ld and every offset into a fused matrix count elements, as for f32. The SIMD pass kernels
 * read BF16 as it is stored; other 16-bit passes convert a few rows at a time into a small f32
 * tile (about 128 KiB, at least 8 rows; a matrix of at most 2^20 elements, e.g. an attention
 * head's block, is converted once per estimate, 4 MiB). The metrics are bit-identical to those
 * of the same layer converted to f32 first (the conversion is exact; the sums are the same),
 * and no f32 copy of the tensor is made. Other dtypes (QUANT, OTHER) are not read natively:
 * convert them (stab_ckpt_read_f32). The monitor takes F32 layers only.
 *
 * Errors: NULL weight (or weight_k), a name that is not valid UTF-8, a dtype other than F32,
 * F16 or BF16, or table sizes given as above, or grouped-query attention in-major, STAB_EINVAL;
 * zero or inconsistent sizes, a stride below the stored row or a matrix past what memory can
 * address (the check of stab_spectral_norm) STAB_EDIM; heads not dividing d_out, kv_heads not
 * dividing heads, or a negative or non-finite scale, STAB_ERANGE. Every message names the
 * layer. */
typedef struct {
  const char *name;        /* copied by the monitor; any length; valid UTF-8 (else STAB_EINVAL),
                              or NULL outside a monitor */
  stab_kind kind;
  size_t d_in, d_out;      /* linear, attention, gain, bias: inputs and outputs (W is
                              d_in x d_out); embedding, lm_head: 0 (see vocab, width) */
  size_t vocab, width;     /* embedding, lm_head only: the table's V rows (tokens; positions
                              of a position table) or classes, and the length d of each */
  stab_layout layout;
  size_t ld;               /* row stride in elements, 0 = contiguous rows (see above) */
  const float *weight;
  const float *bias;       /* linear only; NULL if none */
  const float *weight_k;   /* attention only */
  size_t heads;            /* attention only */
  double scale;            /* attention only; 0 = 1/sqrt(d_h) */
  size_t kv_heads;         /* attention only: key heads, for grouped-query attention (weight_k
                              then has kv_heads * d_h outputs, query head h reading key head
                              h / (heads / kv_heads)); must divide heads; 0 = heads. Out-major
                              only (an in-major key of another width has another row stride) */
  stab_dtype dtype;        /* how weight, bias and weight_k are stored: STAB_DTYPE_F32 (0, the
                              default), F16 or BF16 (see "Stored as F16 or BF16" above) */
} stab_layer;

/* Options of a measurement. */
typedef struct {
  stab_spectral_params spectral;
  stab_tight_method tight;  /* lm_head tight bounds; default STAB_TIGHT_CENTRED */
} stab_metrics_params;

stab_metrics_params stab_metrics_default_params(void);

/* The metrics of one layer, without a monitor (allocates its workspace each call).
 *  layer     the layer, with weight the weights after the step (or the only weights)
 *  before    NULL (no update), or the same layer's weights before the step: update = f(W - before)
 *            (before->weight and ->bias are read with layer's shapes, layout and ld, and stored
 *            as before->dtype, which may differ from layer->dtype: a BF16 checkpoint against an
 *            F32 one; the rest of *before is ignored; attention has no update)
 *  params    NULL for defaults
 *  heads_out attention: NULL, or an array of layer->heads doubles receiving each head's bound
 * NaN weights give NaN metrics and a flag, with STAB_OK. */
stab_status stab_layer_metrics(const stab_layer *layer, const stab_layer *before,
                               const stab_metrics_params *params, stab_metrics *out,
                               double *heads_out);

/* Sums and maxima over the shards of a table split by vocabulary, for
 * stab_table_metrics_reduced: each replaces x[0..n) (this shard's) by its sum, or its maximum
 * (a NaN anywhere wins), over every shard, the same bits on every shard. Return STAB_OK or a
 * failure, which the measurement returns. */
typedef struct {
  stab_status (*sum)(void *ctx, double *x, size_t n);
  stab_status (*max)(void *ctx, double *x, size_t n);
  void *ctx;
} stab_shard_reduce;

/* stab_layer_metrics of an embedding or LM-head table split by vocabulary, this caller holding
 * shard: a table layer of shard->vocab of the whole table's whole_vocab tokens or classes
 * (same width, kind, layout and dtype on every shard). Every table metric of the whole table
 * (max row RMS, the centred diameter bound, log V, rel_update) from the shards' sums (the mean
 * item, sums of squares) and maxima, through reduce, in a fixed number of calls (2 sums and 3
 * maxima at most) that every shard makes alike. before: as stab_layer_metrics' (this shard's
 * weights before the step), or NULL. The tight method must be CENTRED or NONE (EXACT, all pairs
 * across shards, is STAB_EINVAL). Errors as stab_layer_metrics', whole_vocab < shard->vocab
 * STAB_EDIM, reduce or its functions NULL STAB_EINVAL, all before the first reduce call (a
 * caller whose shards could disagree checks them together first: stab_table_check_shard); a
 * failure of reduce, its status (metrics NaN). */
stab_status stab_table_metrics_reduced(const stab_layer *shard, size_t whole_vocab, const stab_layer *before,
                                       const stab_metrics_params *params, const stab_shard_reduce *reduce,
                                       stab_metrics *out);
/* The checks stab_table_metrics_reduced makes of its shard, whole_vocab, before and params
 * before its first reduce call, alone (cheap, no reduce): for shards to agree on first. */
stab_status stab_table_check_shard(const stab_layer *shard, size_t whole_vocab, const stab_layer *before,
                                   const stab_metrics_params *params);

/* stab_layer_metrics of a gain or a bias split among shards, this caller holding shard: a
 * vector layer of shard->d_out of the whole vector's whole_length entries (the same kind and
 * dtype on every shard). Every metric of the whole vector (a gain's max |g| and max |dg|, a
 * bias's RMS and the RMS of its update, rel_update) from the shards' maxima and sums of
 * squares, through reduce, in the same calls on every shard (a gain: one max and one sum; a
 * bias: one sum). before: this shard's entries before the step, or NULL, alike on every shard.
 * Errors as stab_table_metrics_reduced's: all before the first reduce call (a caller whose
 * shards could disagree checks them together first: stab_vector_check_shard); a failure of
 * reduce, its status (metrics NaN). Sums of squares make a bias's RMS equal one process's to
 * rounding (1e-15 relative), not bit for bit. */
stab_status stab_vector_metrics_reduced(const stab_layer *shard, size_t whole_length, const stab_layer *before,
                                        const stab_metrics_params *params, const stab_shard_reduce *reduce,
                                        stab_metrics *out);
/* The checks stab_vector_metrics_reduced makes before its first reduce call, alone. */
stab_status stab_vector_check_shard(const stab_layer *shard, size_t whole_length, const stab_layer *before,
                                    const stab_metrics_params *params);

/* A linear layer's metrics from its whole-layer quantities, measured however the caller likes
 * (split among ranks, on another device): the one place where stab_layer_metrics turns them
 * into a stab_metrics, so that a layer measured in parts gets its formulas exactly. */
typedef struct {
  size_t d_in, d_out;         /* the whole layer's inputs and outputs (W is d_out x d_in) */
  stab_sigma_result weight;   /* sigma(W) as stab_spectral_norm gives it */
  double bias_rms;            /* ||b||_RMS over the d_out entries; 0 without a bias. The RMS, not
                                 the sum of squares, since forward adds it as it is: a caller
                                 with sums of squares s gives sqrt(s / d_out) */
  int with_update;            /* 1: the fields below are read; 0: no update (NaN metrics) */
  stab_sigma_result update;   /* sigma(dW), dW = W - W before the step */
  double bias_update_rms;     /* ||db||_RMS; 0 without a bias */
  double weight_sumsq;        /* ||W||_F^2, the weights alone */
  double update_sumsq;        /* ||dW||_F^2, the weights alone */
} stab_linear_parts;

/* Fills *out as stab_layer_metrics does for a linear layer: sigma, sigma_rel_err and passes
 * from parts->weight; dependency = sqrt(d_in / d_out) sigma; forward = dependency + bias_rms;
 * with an update, sigma_update, its rel_err and update_passes from parts->update, update =
 * sqrt(d_in / d_out) sigma_update + bias_update_rms, rel_update = ||dW, db||_F / ||W, b||_F
 * (the bias's squares as rms^2 d_out); STAB_FLAG_NOT_CONVERGED when an estimate did not
 * converge; NaN with STAB_FLAG_NONFINITE_WEIGHT when the weights' estimate is nonfinite or
 * bias_rms is not finite, and with STAB_FLAG_NONFINITE_UPDATE when the update's estimate is
 * nonfinite or bias_update_rms or update_sumsq is not finite. Fields that do not apply are NaN, counts
 * 0. Pure arithmetic: no allocation, thread-safe. Errors: parts or out NULL STAB_EINVAL,
 * d_in or d_out 0 STAB_EDIM (out cleared to NaN). */
stab_status stab_linear_metrics_assemble(const stab_linear_parts *parts, stab_metrics *out);

/* Helpers that stand on their own: f64 accumulation, NaN propagates; NaN for a NULL pointer,
 * n = 0, stride 0 or a span ((n - 1) * stride + 1 floats) past what memory can address, with
 * the reason in stab_last_error(). */
/* ||x||_RMS of n floats (strided by `stride` elements, >= 1). */
double stab_rms(const float *x, size_t n, size_t stride);
/* ||a - b||_RMS (b may be NULL for ||a||_RMS). */
double stab_rms_diff(const float *a, const float *b, size_t n);
/* max_i |x_i - y_i| (y may be NULL). */
double stab_max_abs_diff(const float *x, const float *y, size_t n);

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
 * measurement) until the monitor is freed. F32 layers only (.dtype 0; F16 or BF16 is
 * STAB_EINVAL: measure those with stab_layer_metrics). Allocates everything the layer will need:
 * warm-start vectors, the snapshot copy in SNAPSHOT mode (rows x ld floats: a block of a
 * fused matrix copies the rows it spans), and grows the spectral workspace of each thread a
 * step measures layers on (one per thread, up to metrics.spectral.threads).
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

/* GIVEN mode: where this layer's update is (same shapes, layout and ld as its weights;
 * bias_update when the layer has a bias, else NULL). The pointers are kept and read by every
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

/* ---------------------------------------------------------------------------------- */
/* Steepest descent per kind (the articles' parametrisation)                           */

/* The articles' initial standard deviation of a layer's weights, so that forward stability
 * starts at ~1 (docs/metrics.md): linear sqrt(d_out/d_in) / (sqrt(d_in) + sqrt(d_out));
 * embedding 1; lm_head 1/d_in (d_in = d, the width); gain 1 (a constant: every gamma_i = 1,
 * not a std); bias 0. d_in and d_out in the kind's math, as stab_monitor_layer gives them back:
 * a table's are embedding (V, d), lm_head (d, V). NaN for an unknown kind (attention has no
 * weights of its own) or a zero dimension. */
double stab_init_std(stab_kind kind, size_t d_in, size_t d_out);

typedef enum {
  STAB_MSIGN_QUINTIC = 0, /* Muon's quintic Newton-Schulz, coefficients (3.4445, -4.7750,
                             2.0315): fast, approximate. After 5 steps a singular value s
                             of the input with s / ||G||_F >= 1e-2 maps into [0.68, 1.14],
                             any into [0, 1.21) (the scalar iteration in f64; checked in
                             tests/unit/check_steepest.c); the singular vectors are kept up to
                             f32 rounding */
  STAB_MSIGN_CUBIC = 1    /* the classic X <- 1.5 X - 0.5 X X^T X: converges to U V^T
                             (quadratically once near), slowly for tiny singular values */
} stab_msign_method;

/* Floats of work stab_msign needs for a rows x cols matrix: 2 m n + 2 m^2 with
 * m = min(rows, cols), n = max(rows, cols); 0 if that overflows. */
size_t stab_msign_work_size(size_t rows, size_t cols);

/* msign(G) = U V^T of G = U S V^T (the matrix sign, the orthogonal polar factor), approximated
 * by `steps` Newton-Schulz iterations on G / ||G||_F in f32 with cblas_sgemm.
 *  g, out   rows x cols, contiguous row-major; out may be g
 *  steps    >= 1 (Muon uses 5 quintic steps)
 *  work     stab_msign_work_size(rows, cols) floats, not aliasing g or out
 * The zero matrix gives zeros. Errors: NULL pointers or steps < 1 STAB_EINVAL, a zero side
 * STAB_EDIM, non-finite entries in g STAB_ERANGE (out then untouched). Thread-safe (no state;
 * BLAS may use its own threads). */
stab_status stab_msign(const float *g, size_t rows, size_t cols, stab_msign_method method,
                       int steps, float *out, float *work);

/* out_i = scale * g_i / ||g_i||_RMS for each of the rows g_i (length cols); a zero row gives
 * zeros. The steepest-descent direction of a table under the max-row-RMS norm: the embedding
 * (rows = tokens), the LM head stored [V][d] (its class vectors, the "columns" of the math),
 * and a bias (rows = 1). out may be g. STAB_EINVAL for NULL, STAB_EDIM for a zero side. */
stab_status stab_normalize_rows(const float *g, size_t rows, size_t cols, double scale,
                                float *out);

/* out_i = scale * sign(g_i) (0 for 0; NaN stays NaN): SignSGD's direction for gains. */
stab_status stab_sign(const float *g, size_t n, double scale, float *out);

/* ---------------------------------------------------------------------------------- */
/* Output files: what may happen to results already there                              */

/* The one rule of every writer of results, the library's trace and the stabmeter programs
 * alike: a file already at an output's path is never replaced without a word. A writer adds to
 * it where it was asked to and that is meaningful (a trace: the same layers, rows after its
 * last; a table of runs: the same columns, rows of other runs), replaces it only when asked,
 * and otherwise refuses it, leaving it as it is. The values are those of
 * stab_trace_params.append. */
typedef enum {
  STAB_OUTPUT_REPLACE = 0, /* replace what is there (the caller was asked to) */
  STAB_OUTPUT_APPEND = 1,  /* keep it and add to it; the writer checks that what it adds fits */
  STAB_OUTPUT_NEW = 2      /* a new file: one already there is refused (STAB_EEXIST) and kept */
} stab_output_mode;

/* Says whether a writer may go on to write path with mode: STAB_OK when nothing is there, or
 * when mode is STAB_OUTPUT_APPEND or STAB_OUTPUT_REPLACE (the writer then appends or replaces
 * as its format says). With STAB_OUTPUT_NEW, anything at path (a file, a directory, a link to
 * something) is STAB_EEXIST, the message naming path and what (e.g. "a trace"; NULL: "a file")
 * and saying that it was kept; a symbolic link leading nowhere holds nothing and is STAB_OK.
 * Writes nothing. A check, not a lock: a writer that must not race another creates its file
 * with "only if nothing is there" (O_EXCL, RENAME_NOREPLACE), as stab_trace_open does.
 * Errors: NULL or empty path, unknown mode STAB_EINVAL; a path that cannot be looked at (a
 * component not searchable) STAB_EIO naming it; STAB_EEXIST as above. Thread-safe. */
stab_status stab_output_check(const char *path, stab_output_mode mode, const char *what);

/* ---------------------------------------------------------------------------------- */
/* The trace: every measured step of a monitor, in an HDF5 file (docs/metrics.md)       */

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
 * (lib/trace/trace.c has it in full, with every interleaving of two writers): a new trace is
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
 * into the stage (docs/trace.md gives the figures, bench/trace_layers.sh measures them). */

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

/* ---------------------------------------------------------------------------------- */
/* Input files                                                                         */

/* Opens the file at path for reading, the one way every reader of the library and every
 * stabmeter program opens a file it reads (checkpoints, traces, configs, corpora): only a
 * regular file (symbolic links followed) is opened. A FIFO, a device (/dev/zero, /dev/null, a
 * terminal), a socket or a directory is refused at once, without blocking and, when the path
 * already names one, without opening it; the message says what the path is.
 *  max_bytes  the largest size accepted, in bytes; 0: any size
 *  fd_out     receives the descriptor (read-only, close-on-exec; O_NONBLOCK is set, which
 *             changes nothing for a regular file); the caller closes it. -1 on failure
 *  size_out   receives the file's size in bytes at the open, or NULL
 * Errors: NULL path or fd_out STAB_EINVAL; a path that cannot be opened or stat'd (missing,
 * no permission), or that is not a regular file, STAB_EIO naming the path ("not a regular
 * file: it is a FIFO (named pipe)"); a file larger than max_bytes STAB_ERANGE naming the
 * path, its size and the limit. Thread-safe. */
stab_status stab_input_open(const char *path, uint64_t max_bytes, int *fd_out, uint64_t *size_out);

/* ---------------------------------------------------------------------------------- */
/* Checkpoint readers                                                                  */
/*
 * A reader memory-maps a checkpoint read-only, validates its whole index up front (every
 * rule of the format: offsets inside the data and covering it without overlap or holes,
 * shapes agreeing with the byte ranges, known dtypes, unique names) and then hands out
 * tensors as views into the mapping. Nothing is read from the data until asked for, and
 * no allocation is larger than a small multiple of the file's index, so a hostile file
 * cannot make the reader allocate without bound. A malformed file gives STAB_EFORMAT
 * with a message naming the file and the field or byte offset at fault.
 * A reader is read-only after open: any number of threads may use it at once.
 *
 * The input guard: a file that shrinks under its mapping (truncated, or rewritten in place, by
 * another process) is an error, never a signal. The first time the library maps a file it
 * installs a SIGBUS handler (sigaction, SA_SIGINFO); a read of a mapping of the library's
 * past the file's new end, in any thread, reads a page of zeros, and the mapping is marked:
 * the reader's open, stab_ckpt_read_f32, stab_layer_metrics and the monitor on weights in it,
 * and stab_probe_measure then return STAB_EIO naming the file ("the file shrank while being
 * read"), and every later read of that mapping does too. A SIGBUS at any other address goes to
 * the handler installed before the library's (called as it was installed), else takes the
 * default action. A program that installs a SIGBUS handler of its own after opening a
 * checkpoint should call the one it replaces for addresses it does not know. Bytes a caller
 * reads itself from stab_ckpt_tensor.data after a shrink read as zeros; the library's next
 * read of that tensor reports it.
 */

/* stab_dtype (the element types of stored weights) is defined with the layers, above. */

/* Dimensions a tensor may have; a file with more is rejected (STAB_EFORMAT). */
#define STAB_CKPT_MAX_DIMS 8

/* One tensor of a checkpoint: a view into the reader's mapping, valid until it is closed. */
typedef struct {
  const char *name;          /* NUL-terminated; owned by the reader */
  const char *dtype_name;    /* as the file spells it: "F32", "BF16", "I64", ... */
  stab_dtype dtype;
  size_t elem_size;          /* bytes per element; 0 for GGUF's block-quantized types */
  size_t ndim;               /* 0 for a scalar */
  uint64_t shape[STAB_CKPT_MAX_DIMS]; /* row-major, outermost first */
  uint64_t count;            /* elements: the product of shape (1 for a scalar) */
  const unsigned char *data; /* count * elem_size bytes, little-endian, no alignment promised */
  uint64_t offset;           /* byte offset of data from the start of the file */
} stab_ckpt_tensor;

/* Elements [first, first + n) of t (flat, row-major) as f32, into out (n floats). F16 and
 * BF16 convert exactly (subnormals, infinities and NaNs included); F32 is copied;
 * STAB_DTYPE_QUANT dequantizes exactly as ggml does (the same f32 values, bit for bit),
 * decoding each block the range touches, so a range may start and end anywhere.
 * Errors: NULL pointers STAB_EINVAL; a range outside the tensor STAB_ERANGE; dtype
 * STAB_DTYPE_OTHER STAB_EINVAL; a STAB_DTYPE_QUANT tensor whose count is not whole blocks
 * STAB_EFORMAT; the file holding t shrank under its mapping STAB_EIO naming the tensor and the
 * file (the input guard, above; out then holds zeros where the file has gone). */
stab_status stab_ckpt_read_f32(const stab_ckpt_tensor *t, uint64_t first, size_t n, float *out);

/* Bytes of data t spans: count * elem_size, or for a block-quantized GGUF type (elem_size 0)
 * its blocks times the bytes per block; 0 for a NULL or empty tensor, or a block type this
 * library does not know. */
uint64_t stab_ckpt_nbytes(const stab_ckpt_tensor *t);

/* Hands the mapped pages that lie wholly inside t back to the kernel (madvise
 * MADV_DONTNEED): the process's resident memory drops by them, t stays valid, and a later
 * read maps them again from the page cache. For a caller that reads a checkpoint tensor by
 * tensor and wants its peak memory near the largest tensor rather than the file. NULL or
 * an empty tensor is a no-op. */
void stab_ckpt_release(const stab_ckpt_tensor *t);

/* Maps the pages of t in one go (madvise MADV_POPULATE_READ; MADV_WILLNEED on kernels before
 * 5.14), so that reading t then takes no page fault per page. Best effort: NULL, an empty
 * tensor or a failure changes nothing but speed. A file that shrank since it was opened
 * is reported by the library's next read (the input guard, above), not here. */
void stab_ckpt_prefetch(const stab_ckpt_tensor *t);

/* The exact f32 value of one IEEE binary16 / bfloat16 (bit patterns as stored). */
float stab_f16_to_f32(uint16_t h);
float stab_bf16_to_f32(uint16_t b);

/* A safetensors file: 8-byte little-endian header length N, N bytes of JSON (an object of
 * name -> {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
 * object of string -> string), then the data section the offsets are relative to. Every
 * string of the header (names, metadata keys and values) must be valid UTF-8 once its escapes
 * are decoded (no raw invalid bytes, no \u escape of a lone surrogate, no \u0000): JSON is
 * text, so a header that is not is malformed. */
typedef struct stab_safetensors stab_safetensors;

/* Maps and validates path. Errors: STAB_EIO (cannot open, stat or map; not a regular file),
 * STAB_EFORMAT (any rule broken), STAB_ENOMEM, STAB_EINVAL (NULL arguments). On failure
 * *out is NULL. */
stab_status stab_safetensors_open(const char *path, stab_safetensors **out);

/* Unmaps and frees. NULL is a no-op. */
void stab_safetensors_close(stab_safetensors *f);

/* Tensors in the order of their data in the file; the pointer is NULL past the end. */
size_t stab_safetensors_count(const stab_safetensors *f);
const stab_ckpt_tensor *stab_safetensors_tensor(const stab_safetensors *f, size_t index);

/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_safetensors_find(const stab_safetensors *f, const char *name, size_t *index);

/* "__metadata__" entries in key order; STAB_ENOTFOUND past the end. */
size_t stab_safetensors_metadata_count(const stab_safetensors *f);
stab_status stab_safetensors_metadata(const stab_safetensors *f, size_t index, const char **key,
                                      const char **value);

/* Bytes of the file (as mapped). */
uint64_t stab_safetensors_file_size(const stab_safetensors *f);

/* A Hugging Face model as one checkpoint: a directory holding model.safetensors, or a sharded
 * model (the index model.safetensors.index.json, {"metadata": {"total_size": bytes},
 * "weight_map": {tensor name: shard file name}}, and the shards beside it). Each shard is a
 * safetensors file opened and validated by stab_safetensors_open (headers only: opening reads
 * no tensor data, so a model of many shards opens in the time of their headers). The index is
 * validated too: strict JSON (no key twice), a "weight_map" object of strings, each shard a
 * plain file name of the index's directory (no '/', not "." or "..": a hostile index cannot
 * reach outside the model), every shard opening, each tensor in exactly the shard the index
 * names, no tensor the index does not list, none twice. Symbolic links are followed (the
 * Hugging Face cache's snapshots are links into its blobs); a FIFO, a device or a directory
 * in a shard's place is refused without blocking (see stab_input_open). Messages name the
 * index, the shard and the tensor. */
typedef struct stab_shard_index stab_shard_index;
typedef struct stab_sharded stab_sharded;

/* Reads and validates an index file alone (its JSON and names; no shard is opened).
 * Errors: STAB_EIO (cannot open; not a regular file), STAB_EFORMAT (not JSON, no weight_map
 * object, a value not a string, an unsafe shard name, a tensor twice, an empty map), STAB_ERANGE
 * (larger than 64 MiB), STAB_ENOMEM, STAB_EINVAL. On failure *out is NULL. */
stab_status stab_shard_index_open(const char *path, stab_shard_index **out);
/* NULL is a no-op. */
void stab_shard_index_close(stab_shard_index *ix);
/* The index's tensors in name order, each with the number of its shard (*shard, may be NULL);
 * NULL past the end. */
size_t stab_shard_index_count(const stab_shard_index *ix);
const char *stab_shard_index_tensor(const stab_shard_index *ix, size_t index, size_t *shard);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_shard_index_find(const stab_shard_index *ix, const char *name, size_t *index);
/* The distinct shard file names in name order (model-00001-of-00003.safetensors, ...): the
 * model's order. NULL past the end. */
size_t stab_shard_index_shard_count(const stab_shard_index *ix);
const char *stab_shard_index_shard(const stab_shard_index *ix, size_t shard);
/* metadata.total_size, or STAB_ENOTFOUND when the index has none (or not a whole number). */
stab_status stab_shard_index_total_size(const stab_shard_index *ix, uint64_t *bytes);
/* The path the index was opened by. */
const char *stab_shard_index_path(const stab_shard_index *ix);
/* Something odd but not wrong (a metadata.total_size that is not a number), or NULL. */
const char *stab_shard_index_warning(const stab_shard_index *ix);

/* Finds the index in file's directory (any *.safetensors.index.json) that lists file's name as
 * a shard: STAB_OK with *out (the caller closes it) and *shard (may be NULL) its number;
 * STAB_ENOTFOUND (no error recorded) when no index there lists it; an error of
 * stab_shard_index_open when an index there is malformed. For a caller given one shard of a
 * model: the tensors of the other shards are not in the file, but they are in the model. */
stab_status stab_shard_index_beside(const char *file, stab_shard_index **out, size_t *shard);

/* Opens path: a directory (model.safetensors, else model.safetensors.index.json, else the only
 * *.safetensors.index.json in it; transformers' own order), or an index file. Errors as
 * stab_shard_index_open and stab_safetensors_open, and STAB_EFORMAT for a directory with no
 * weights, a shard missing, unreadable or not safetensors (the message says which), a tensor
 * in no shard, in another shard than the index says, or in two. A metadata.total_size other
 * than the sum of the tensors' bytes does not refuse the model (it says nothing about any
 * tensor, and indexes whose value was written by hand exist): stab_sharded_warning says it. */
stab_status stab_sharded_open(const char *path, stab_sharded **out);
/* Unmaps every shard and frees. NULL is a no-op. */
void stab_sharded_close(stab_sharded *f);
/* The tensors shard by shard, each shard's in the order of its data: the order the same model
 * saved as one file lists them when the shards are consecutive cuts of it. NULL past the end. */
size_t stab_sharded_count(const stab_sharded *f);
const stab_ckpt_tensor *stab_sharded_tensor(const stab_sharded *f, size_t index);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_sharded_find(const stab_sharded *f, const char *name, size_t *index);
/* The shards (1 for a single model.safetensors), their paths, and the shard of tensor index
 * (SIZE_MAX out of range). */
size_t stab_sharded_shard_count(const stab_sharded *f);
const stab_safetensors *stab_sharded_shard(const stab_sharded *f, size_t shard);
const char *stab_sharded_shard_path(const stab_sharded *f, size_t shard);
size_t stab_sharded_shard_of(const stab_sharded *f, size_t index);
/* The model's directory (where config.json is). */
const char *stab_sharded_directory(const stab_sharded *f);
/* The index, or NULL for a directory with a single model.safetensors. */
const stab_shard_index *stab_sharded_index(const stab_sharded *f);
/* The total_size mismatch or the index's warning, or NULL. */
const char *stab_sharded_warning(const stab_sharded *f);
/* The first shard's "__metadata__" (transformers writes the same in every shard). */
size_t stab_sharded_metadata_count(const stab_sharded *f);
stab_status stab_sharded_metadata(const stab_sharded *f, size_t index, const char **key, const char **value);

/* The values of a Hugging Face config.json that say how to read the weights; 0 (or "" or -1)
 * where the file has no such key (or null). A key absent at the top level is looked up under
 * "text_config" (multimodal models keep their language model's values there). */
typedef struct {
  size_t num_attention_heads; /* query heads; GPT-2's n_head */
  size_t num_key_value_heads; /* key/value heads (grouped-query attention); 0: as many as query heads */
  size_t head_dim;            /* one head's width, when the config gives it (Gemma's is not hidden/heads) */
  size_t hidden_size;         /* GPT-2's n_embd */
  size_t num_hidden_layers;   /* GPT-2's n_layer */
  size_t vocab_size;
  int tie_word_embeddings;    /* 1 true, 0 false, -1 absent: transformers' default differs by model class */
  char model_type[64];        /* "llama", "gpt2", ... */
  char architecture[128];     /* architectures[0]: "LlamaForCausalLM", ... */
  size_t num_local_experts;   /* Mixtral */
  size_t num_experts;         /* Qwen2-MoE, OLMoE */
  size_t n_routed_experts;    /* DeepSeek-V2/V3 */
  size_t num_experts_per_tok; /* experts routed to per token */
} stab_hf_config;

/* Reads path (a regular file of at most 1 MiB) into *out. Errors (STAB_EFORMAT unless said),
 * each naming the file and the key: not JSON or not an object; a count that is not a whole
 * number (a string "abc", 12.5, -1, 0 for a size; 4.0 and 4e0 are the number 4, as JSON
 * numbers are); two names of one value that disagree
 * (num_attention_heads and n_head); num_key_value_heads not dividing num_attention_heads;
 * tie_word_embeddings not a boolean; model_type not a string; architectures not an array of
 * strings; STAB_EIO, STAB_ERANGE as stab_input_open; STAB_EINVAL for NULL arguments. On
 * failure *out is as for an empty config. Thread-safe. */
stab_status stab_hf_config_read(const char *path, stab_hf_config *out);

/* An llm.c GPT-2 checkpoint (train_gpt2.c's write_checkpoint): 256 int32 of header (magic
 * 20240326, version 3 = f32 or 5 = bf16, max_seq_len, vocab_size, num_layers, num_heads,
 * channels, padded_vocab_size), then every parameter in llm.c's order. The reader hands out
 * views named like the HF GPT-2 modules but split: wte (V, C; the padded rows V..Vp-1 left
 * out), wpe (maxT, C), and per block l: h.l.ln_1.{weight,bias}, h.l.attn.{q,k,v}.{weight,bias}
 * (the three (C, C) blocks of the fused qkv), h.l.attn.proj.*, h.l.ln_2.*, h.l.mlp.fc.* (4C, C),
 * h.l.mlp.proj.* (C, 4C); then ln_f.{weight,bias}. Matrices are out-major. The file's size
 * must be exactly the header plus the parameters its shapes describe. */
typedef struct {
  int version;          /* 3 (f32) or 5 (bf16) */
  size_t max_t, vocab, padded_vocab, layers, heads, channels;
} stab_llmc_config;

typedef struct stab_llmc stab_llmc;

/* Errors as stab_safetensors_open. */
stab_status stab_llmc_open(const char *path, stab_llmc **out);
/* NULL is a no-op. */
void stab_llmc_close(stab_llmc *f);
const stab_llmc_config *stab_llmc_config_of(const stab_llmc *f);
/* The views in llm.c's order; NULL past the end. */
size_t stab_llmc_count(const stab_llmc *f);
const stab_ckpt_tensor *stab_llmc_tensor(const stab_llmc *f, size_t index);
/* Index of a view by name, or STAB_ENOTFOUND. */
stab_status stab_llmc_find(const stab_llmc *f, const char *name, size_t *index);
/* 1 when path is a regular file starting with the llm.c magic (a format sniff; no validation,
 * no error recorded; never blocks: see stab_input_open). */
int stab_llmc_is(const char *path);

/* A GGUF file (llama.cpp's format, versions 2 and 3, little-endian): "GGUF", uint32
 * version, uint64 tensor count, uint64 metadata count, the metadata key/value pairs, the
 * tensor infos (name, dimensions ne[] with ne[0] the fastest-varying, GGML type, offset),
 * then, at a multiple of general.alignment (default 32), the data section the offsets are
 * relative to. The reader hands tensors out with shape[] outermost first, i.e. reversed
 * from ne[]: a matrix with ne = {d_in, d_out} comes out as shape {d_out, d_in}, out-major.
 * F32, F16 and BF16 tensors convert to f32 (stab_ckpt_read_f32), and so do the quantized
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS
 * (STAB_DTYPE_QUANT, dequantized exactly as ggml does); every other GGML type (Q8_1, Q8_K,
 * the grid-based I-quants IQ1_* IQ2_* IQ3_*, TQ*, MXFP4, integers, F64) is STAB_DTYPE_OTHER.
 * dtype_name is always the GGML type name; block-quantized types have elem_size 0 (their
 * bytes per element are not whole: stab_ckpt_nbytes gives the bytes) and a row (ne[0]) of
 * whole blocks. Tensors come in file order. Every count, string length, array
 * length, dimension, offset and byte range is checked against the file before anything is
 * allocated for it; a malformed file is STAB_EFORMAT with a message naming the file, the
 * field and its byte offset. Duplicate tensor names and duplicate keys are errors, and so are
 * names and keys that are not valid UTF-8 (stab_utf8_decode); string values are kept as the
 * file has them, whatever their bytes. */
typedef struct stab_gguf stab_gguf;

/* Types of metadata values, numbered as in the file. */
typedef enum {
  STAB_GGUF_UINT8 = 0, STAB_GGUF_INT8 = 1, STAB_GGUF_UINT16 = 2, STAB_GGUF_INT16 = 3,
  STAB_GGUF_UINT32 = 4, STAB_GGUF_INT32 = 5, STAB_GGUF_FLOAT32 = 6, STAB_GGUF_BOOL = 7,
  STAB_GGUF_STRING = 8, STAB_GGUF_ARRAY = 9, STAB_GGUF_UINT64 = 10, STAB_GGUF_INT64 = 11,
  STAB_GGUF_FLOAT64 = 12
} stab_gguf_type;

/* One metadata pair. Scalars are decoded; arrays are not (only their element type and
 * length are kept: tokenizer vocabularies are large and the probe needs none of them). */
typedef struct {
  const char *key;          /* NUL-terminated, owned by the reader */
  stab_gguf_type type;
  uint64_t u;               /* unsigned integer types and bool (0 or 1) */
  int64_t i;                /* signed integer types */
  double f;                 /* every numeric type and bool, as a double */
  const char *s;            /* STRING: the bytes, NUL-terminated (a NUL inside ends it early);
                               not necessarily UTF-8 */
  uint64_t len;             /* STRING: bytes in the file; ARRAY: elements */
  stab_gguf_type elem_type; /* ARRAY: the element type */
  uint64_t offset;          /* byte offset of the pair in the file */
} stab_gguf_kv;

/* Maps and validates path. Errors as stab_safetensors_open. On failure *out is NULL. */
stab_status stab_gguf_open(const char *path, stab_gguf **out);
/* Unmaps and frees. NULL is a no-op. */
void stab_gguf_close(stab_gguf *f);
/* The file's version (2 or 3) and data alignment in bytes. */
uint32_t stab_gguf_version(const stab_gguf *f);
uint64_t stab_gguf_alignment(const stab_gguf *f);
/* Tensors in file order; NULL past the end. */
size_t stab_gguf_count(const stab_gguf *f);
const stab_ckpt_tensor *stab_gguf_tensor(const stab_gguf *f, size_t index);
/* Index of a tensor by exact name, or STAB_ENOTFOUND. */
stab_status stab_gguf_find(const stab_gguf *f, const char *name, size_t *index);
/* Metadata pairs in file order; NULL past the end. */
size_t stab_gguf_metadata_count(const stab_gguf *f);
const stab_gguf_kv *stab_gguf_metadata(const stab_gguf *f, size_t index);
/* The pair with this key, or NULL. */
const stab_gguf_kv *stab_gguf_find_metadata(const stab_gguf *f, const char *key);
/* The value of key as a non-negative integer (any integer type). STAB_ENOTFOUND if absent
 * (last error untouched), STAB_EINVAL if it is not an integer or is negative. */
stab_status stab_gguf_get_uint(const stab_gguf *f, const char *key, uint64_t *out);
/* The GGML name of a tensor type ("F32", "Q4_K", ...); NULL for a number it does not know. */
const char *stab_gguf_type_name(uint32_t ggml_type);
/* The name of a metadata value type ("uint32", "string", ...); NULL if unknown. */
const char *stab_gguf_value_type_name(stab_gguf_type type);
/* 1 when path is a regular file starting with the GGUF magic (a format sniff; no validation,
 * no error recorded; never blocks: see stab_input_open). */
int stab_gguf_is(const char *path);

/* ---------------------------------------------------------------------------------- */
/* What a file is                                                                      */
/*
 * A checkpoint given to a reader that is not of its format gets a message about that format
 * ("header length 7022349238375811707 ... is larger than the file"), which tells the user
 * nothing. stab_ckpt_sniff says what the file is from its first bytes and its size, before
 * any reader parses it: it never decompresses, never unpickles, never follows an offset, and
 * reads at most STAB_SNIFF_BYTES bytes from the start of the file.
 */

/* The most bytes stab_ckpt_sniff reads, all from offset 0. */
#define STAB_SNIFF_BYTES 8192

typedef enum {
  STAB_FILE_UNKNOWN = 0,     /* binary, none of the below */
  STAB_FILE_EMPTY,           /* 0 bytes */
  STAB_FILE_SAFETENSORS,     /* an 8-byte little-endian header length below 2^32, then '{' */
  STAB_FILE_GGUF,            /* "GGUF" */
  STAB_FILE_LLMC,            /* an llm.c GPT-2 checkpoint: int32 magic 20240326 */
  STAB_FILE_LLMC_OTHER,      /* another llm.c file: tokenizer (20240328), token shard
                                (20240520), debug state (20240327) */
  STAB_FILE_PYTORCH_ZIP,     /* torch.save's zip: an entry data.pkl or DIR/data.pkl among those in
                                the bytes read */
  STAB_FILE_PYTORCH_LEGACY,  /* torch.save's format before 1.6: a pickled magic number */
  STAB_FILE_PICKLE,          /* any other pickle of protocol 2 to 5 */
  STAB_FILE_NPY,             /* "\x93NUMPY" */
  STAB_FILE_NPZ,             /* a zip whose entries in the bytes read all end in .npy */
  STAB_FILE_ZIP,             /* any other zip archive */
  STAB_FILE_ONNX,            /* named *.onnx and starting with ModelProto's ir_version field */
  STAB_FILE_GGML,            /* llama.cpp's formats before GGUF: GGML, GGMF, GGJT, GGLA, GGSN */
  STAB_FILE_HDF5,            /* the HDF5 signature, not a stabmeter trace as far as it shows */
  STAB_FILE_TRACE,           /* HDF5 holding the string "stabmeter-trace" in its first bytes */
  STAB_FILE_GZIP,
  STAB_FILE_ZSTD,
  STAB_FILE_XZ,
  STAB_FILE_BZIP2,
  STAB_FILE_LFS_POINTER,     /* a Git LFS pointer: text naming the real file by its hash */
  STAB_FILE_SHARD_INDEX,     /* a sharded checkpoint's JSON index (with "weight_map") */
  STAB_FILE_TEXT,            /* valid UTF-8 without NUL bytes (as far as it was read) */
  STAB_FILE_KIND_COUNT       /* the number of kinds, not a kind */
} stab_file_kind;

/* Says what the file at path is, opened through stab_input_open.
 *  path  a regular file (a FIFO or device is refused without blocking)
 *  kind  receives the kind; STAB_FILE_UNKNOWN on an I/O error
 * Returns STAB_OK for the kinds the library reads (SAFETENSORS, GGUF, LLMC), which are
 * then for the reader to validate. For every other kind, STAB_EFORMAT with a one-line message
 * (stab_last_error) naming the path, what the file is and what to do with it (convert a
 * PyTorch checkpoint to safetensors, read a trace with stabmeter-export, decompress a
 * compressed file, ...); an unknown binary file's message gives its first bytes in hex.
 * Errors: NULL path or kind STAB_EINVAL; a path that cannot be opened, is not a regular file or
 * cannot be read, STAB_EIO (the message of stab_input_open). Thread-safe. */
stab_status stab_ckpt_sniff(const char *path, stab_file_kind *kind);

/* What a kind is, as a noun phrase for a message ("a PyTorch checkpoint (zip)"); "?" for a
 * value outside the enum. Static storage. */
const char *stab_file_kind_name(stab_file_kind kind);

/* ---------------------------------------------------------------------------------- */
/* Tensor names across formats: llama.cpp's GGUF names and Hugging Face's              */

/* A GGUF file converted from a Hugging Face checkpoint by llama.cpp's convert_hf_to_gguf.py
 * names its tensors blk.N.attn_q.weight where the safetensors has
 * model.layers.N.self_attn.q_proj.weight, and some values change on the way. These map one
 * name to the other, for the architectures (GGUF general.architecture) whose converter maps
 * names plainly: "llama" (Llama, and HF Mistral, which converts as Llama), "qwen2", "gemma",
 * "phi3" (fused attn_qkv <-> self_attn.qkv_proj, ffn_up <-> mlp.gate_up_proj) and "gpt2" (HF
 * names with or without "transformer."; GGUF to HF gives them without). For the llama family:
 * token_embd <-> model.embed_tokens, output <-> lm_head, output_norm <-> model.norm, and in
 * block N (blk.N. <-> model.layers.N.) attn_q/attn_k/attn_v/attn_output <->
 * self_attn.q_proj/k_proj/v_proj/o_proj, ffn_gate/ffn_up/ffn_down <->
 * mlp.gate_proj/up_proj/down_proj, attn_norm <-> input_layernorm, ffn_norm <->
 * post_attention_layernorm. GPT-2: token_embd <-> wte, position_embd <-> wpe, output_norm <->
 * ln_f, output <-> lm_head, and in block N (blk.N. <-> h.N.) attn_qkv <-> attn.c_attn,
 * attn_output <-> attn.c_proj, ffn_up <-> mlp.c_fc, ffn_down <-> mlp.c_proj, attn_norm <->
 * ln_1, ffn_norm <-> ln_2. The ".weight" or ".bias" suffix is kept; a name without one, or of
 * a module not listed, has no mapping. */

/* The converter's q/k row permutation (LlamaModel.permute), for the llama architecture only:
 * Qwen2, Gemma, Phi-3 and GPT-2 keep HF's row order. */
typedef enum {
  STAB_QK_NONE = 0,  /* rows as HF has them */
  STAB_QK_QUERY = 1, /* q_proj: rows permuted within each of the <arch>.attention.head_count heads */
  STAB_QK_KEY = 2    /* k_proj: the same within each of the head_count_kv key heads */
} stab_qk_rows;

/* What the converter did to a tensor's values besides renaming it. */
typedef struct {
  stab_qk_rows rows; /* the q/k row permutation (stab_qk_permutation), weight and bias alike */
  int conv1d;        /* 1 for a GPT-2 Conv1D weight (c_attn, c_proj, c_fc): HF stores it
                        [d_in][d_out], the converter transposes it to GGUF's [d_out][d_in] (a
                        file written out-major under these names, as nanoGPT and
                        stabmeter-train do, is not transposed: tell by shape or producer) */
  float gguf_offset; /* the GGUF value is the HF value plus this: 1 for Gemma's norm weights
                        (HF stores w - 1, llama.cpp w), else 0 */
} stab_name_transform;

/* 1 when arch (a GGUF general.architecture) has a name map here, else 0 (NULL too). */
int stab_name_map_knows(const char *arch);

/* The Hugging Face name of GGUF tensor gguf_name of a model of architecture arch, into out
 * (cap bytes, NUL-terminated), and what the converter did to it into *how (NULL: not wanted).
 * Errors: NULL arguments or cap 0 STAB_EINVAL; an architecture or name with no mapping
 * STAB_ENOTFOUND (the message names which); out too small STAB_ERANGE. Thread-safe. */
stab_status stab_name_map_to_hf(const char *arch, const char *gguf_name, char *out, size_t cap,
                                stab_name_transform *how);

/* The GGUF name of Hugging Face tensor hf_name, as stab_name_map_to_hf the other way. */
stab_status stab_name_map_to_gguf(const char *arch, const char *hf_name, char *out, size_t cap,
                                  stab_name_transform *how);

/* The converter's row order for a q or k weight (or bias) of rows rows in heads heads (query
 * heads for q, key heads for k): perm[i] is the HF row stored as GGUF row i (rows entries).
 * Within each head of width dh, HF row s*dh/2 + j (rotary half s, pair j) becomes row 2j + s.
 * Errors: NULL perm or heads 0 STAB_EINVAL; rows 0 or not heads of an even width STAB_ERANGE.
 * Thread-safe. */
stab_status stab_qk_permutation(size_t rows, size_t heads, size_t *perm);

/* ---------------------------------------------------------------------------------- */
/* What each tensor of a model is: the kind rules                                      */
/*
 * One set of rules decides, from the names, shapes and dtypes of a model's tensors, which
 * layers they make: each tensor's kind and layout, biases folded into their weights, query/key
 * pairs (fused or not, grouped-query) as attention layers, a tied head, and the names the
 * trace gives them. stabmeter-probe describes every checkpoint with them, and a trainer can
 * register its own parameters by name the same way: fill one stab_ckpt_tensor per parameter
 * (name, dtype STAB_DTYPE_F32, elem_size 4, ndim and shape as PyTorch prints them, count, data
 * = the buffer; offset unused), describe, and register each entry with stab_model_entry_layer.
 *
 * The rules, applied to every tensor in order (the first that matches decides):
 *  1. dtype STAB_DTYPE_OTHER: not measured, with the type's name.
 *  2. a kind override GLOB=KIND (stab_model_config.kinds, first match): skip lists it as not
 *     measured; otherwise that kind, for a 2-D tensor (linear, embedding, lm_head) or a 1-D one
 *     (gain, bias), else not measured with the mismatch.
 *  3. 3-D [n_expert][rows][cols] whose module name's last component ends in "_exps" (llama.cpp's
 *     blk.N.ffn_{gate,up,down}_exps, stored ne = {cols, rows, n_expert}): a layer of experts,
 *     each expert slice a linear layer [rows][cols] out-major (see Experts below).
 *     Other 0-D, 3-D and up: not measured (no rule for them), override or not.
 *  4. 2-D, module name (the name without a trailing .weight or .bias) whose last component is
 *     wte wpe embed_tokens tok_embeddings token_embd word_embeddings position_embeddings
 *     token_type_embeddings embed_positions position_embd token_types: embedding, [V][d]
 *     (GGUF's ne = {d, V} is that same [V][d]).
 *  5. 2-D, last component lm_head, output or embed_out: lm_head, [V][d] (llama.cpp's
 *     output.weight; its blk.N.attn_output is a linear layer: the last component differs).
 *  6. 2-D otherwise: linear, out-major ([d_out][d_in], PyTorch nn.Linear, GGUF), except the HF
 *     GPT-2 Conv1D weights h.N.attn.c_attn, h.N.attn.c_proj, h.N.mlp.c_fc, h.N.mlp.c_proj, which
 *     are in-major when their shape is Conv1D's (c_attn [d][3d], c_fc wider than tall, mlp.c_proj
 *     taller than wide; nanoGPT stores the same names out-major) unless config.out_major; a
 *     layout override GLOB=in_major|out_major decides first. Routers (Mixtral's
 *     block_sparse_moe.gate, Qwen2-MoE's mlp.gate, GGUF ffn_gate_inp) and fused projections
 *     (Phi-3's gate_up_proj) are linear layers by this rule.
 *  7. 1-D X.bias where X.weight is a linear layer with d_out = its length: folded into it (so
 *     Qwen2's q/k/v biases are part of q_proj, k_proj, v_proj).
 *  8. 1-D whose module name has a component containing "norm" (any case) or starting with "ln":
 *     gain if it is X.weight or has no suffix, bias if X.bias (a LayerNorm shift); llama.cpp's
 *     attn_norm, ffn_norm, output_norm, attn_q_norm are such.
 *  9. 1-D X.bias otherwise: bias.
 * 10. anything else: not measured.
 * Attention: for each query weight by name, its key (first match of the suffixes):
 *   X.q_proj.weight  X.k_proj.weight  (HF Llama, Mistral, Qwen2, Gemma, OPT)  X.logits
 *   X.query.weight   X.key.weight     (HF BERT)                               X.logits
 *   X.wq.weight      X.wk.weight      (Meta Llama)                            X.logits
 *   X.attn_q.weight  X.attn_k.weight  (llama.cpp GGUF)                        X.attn_logits
 *   X.attn.q.weight  X.attn.k.weight  (llm.c, whose reader splits the fused qkv; naming LLMC only)
 *                                                                             X.attn.logits
 *   X.c_attn.weight, X.qkv_proj.weight, X.qkv.weight, X.attn_qkv.weight: fused q, k, v
 *                    (GPT-2, Phi-3, ViT, GGUF)                X.logits (X.attn_logits for GGUF's)
 * A fused tensor is q, k, v in that order along d_out: heads * d_h, kv_heads * d_h and
 * kv_heads * d_h outputs, split by heads with kv_heads or head_dim when the config has them
 * (Phi-3: (32 + 2*8) * 96 rows), else in three equal parts. Key heads of separate tensors
 * follow from the key's width (d_out(k) / d_h, d_h = d_out(q) / heads), and must agree with
 * config.kv_heads and head_dim when those are given. An attention pair that cannot be measured
 * (no head count, widths that heads do not divide) is an entry with the reason.
 * Experts: a 3-D expert tensor (rule 3), and the 2-D linear layers named X.experts.E.Y.weight
 * (E decimal digits: Mixtral's block_sparse_moe.experts.E.w1, Qwen2-MoE's, DeepSeek's and
 * OLMoE's mlp.experts.E.gate_proj ...; shared_experts are ordinary linears) of one X and Y with
 * the same shape, are one layer of experts: an entry with n_expert set, named X.experts.Y (the
 * 3-D tensor's module name for GGUF), followed at once by one entry per expert, in expert order,
 * named as a trainer registering each expert would: the tensor's (X.experts.E.Y) or, for a slice
 * of a 3-D tensor, the module name and the index (blk.0.ffn_up_exps.E), whose weight is a view
 * of the slice (stab_model_expert_view). The layer's entry reads nothing itself: its metrics are
 * its experts' (a report gives the worst expert per metric). Routers are linear layers (rule 6).
 * Tied head: with config.tie 1 or -1 (unknown), a model with no lm_head tensor (by rule 5, even
 * one not measured) and a token embedding (rule 4, not a position table, not overridden) is
 * tied: that embedding is an entry a second time, as lm_head, named "lm_head" (X.lm_head when
 * another entry is named lm_head already). With tie 0, never.
 * Names, as stabmeter-train's trace has them: the tensor name without a trailing ".weight"
 * (transformer.h.0.mlp.c_fc), a bias of its own keeping its ".bias" (it would clash with its
 * norm's gain), a name another entry already has keeping the tensor name; a tensor not measured
 * keeps its tensor name.
 * Order: one entry per tensor not folded, in the input's order (a layer of experts where its
 * first expert tensor is, its experts after it), then the attention entries, then the tied head.
 */

/* The naming scheme of the file the tensors come from, for the rules only one scheme has. */
typedef enum {
  STAB_NAMING_ANY = 0,  /* unknown, or a trainer's own names: the general rules */
  STAB_NAMING_HF = 1,   /* safetensors, Hugging Face / PyTorch names */
  STAB_NAMING_GGUF = 2, /* llama.cpp's GGUF names (blk.N.attn_q ...) */
  STAB_NAMING_LLMC = 3  /* llm.c's checkpoint as stab_llmc names its views */
} stab_naming;

/* GLOB=VALUE: tensors whose name matches glob (fnmatch, no flags) get value. */
typedef struct {
  const char *glob;
  const char *value; /* kinds: linear, embedding, lm_head, gain, bias or skip;
                        layouts: in_major or out_major */
} stab_model_override;

/* What is known of the model besides its tensors: plain values, 0 (or -1) for unknown. The
 * caller owns every pointer; they must outlive stab_model_describe only. */
typedef struct {
  stab_naming naming;
  int out_major;         /* 1: GPT-2 Conv1D-named matrices are out-major too (stabmeter-train's
                            files, nanoGPT); 0: by their shape (rule 6) */
  size_t heads;          /* attention heads; 0 unknown (attention entries then say so) */
  size_t kv_heads;       /* key/value heads (grouped-query attention); 0 unknown */
  size_t head_dim;       /* d_h; 0 unknown (d_out(q) / heads) */
  const char *heads_source; /* where heads came from, for the messages ("--heads", "config.json");
                               NULL: "the config" */
  const char *heads_error;  /* why heads is 0 when the metadata had an invalid count, for the
                               attention entries' reason; NULL otherwise */
  int tie;               /* -1 unknown (tied when there is no head tensor), 0 not tied, 1 tied */
  const char *const *other_names; /* n_other names of the model's tensors that are not in the
                                     list (another shard's): a head among them means the model
                                     has its head, so no tied head is made */
  size_t n_other;
  const stab_model_override *kinds;   /* nkinds kind overrides, first match wins */
  size_t nkinds;
  const stab_model_override *layouts; /* nlayouts layout overrides, for linear layers */
  size_t nlayouts;
} stab_model_config;

/* naming ANY, out_major 0, heads, kv_heads, head_dim 0, tie -1, no overrides. */
stab_model_config stab_model_default_config(void);

/* The head count of a GGUF file into cfg: <general.architecture>.attention.head_count, and
 * head_count_kv and key_length when present (a per-layer array is left unknown); naming GGUF.
 * A cfg->heads already set (a user's) is kept, as are kv_heads and head_dim.
 * Errors: NULL arguments STAB_EINVAL; a head count that is present but not 1 to
 * STAB_MODEL_MAX_HEADS, STAB_ERANGE (heads left 0; the message names the key and value). */
stab_status stab_model_config_from_gguf(const stab_gguf *f, stab_model_config *cfg);
/* The same from a safetensors file's __metadata__: heads from "heads", "num_attention_heads"
 * or "n_head" (the first present, decimal digits only), out_major when "producer" starts with
 * stabmeter-train; naming HF. Errors as above (a value that is not a whole number in range). */
stab_status stab_model_config_from_safetensors(const stab_safetensors *f, stab_model_config *cfg);

/* The scale of the attention logits q.k a checkpoint's model applies: 1/sqrt(d_h) (GPT-2,
 * Llama, every Hugging Face model) or 1/d_h (muP; stabmeter-train --attn-scale inverse). */
typedef enum { STAB_ATTN_SCALE_SQRT = 0, STAB_ATTN_SCALE_INVERSE = 1 } stab_attn_scale;

/* The attention scale a safetensors file's __metadata__ "attn_scale" names ("sqrt" or
 * "inverse", as stabmeter-train writes it) into *out; absent: STAB_ATTN_SCALE_SQRT (config.json
 * and GGUF have no such field). Errors: NULL arguments STAB_EINVAL; any other value
 * STAB_EFORMAT (the message names the value; *out is SQRT). */
stab_status stab_model_attn_scale_from_safetensors(const stab_safetensors *f, stab_attn_scale *out);

/* The factor stab_layer.scale takes for that scale and head width d_h: 1/sqrt(d_h) or 1/d_h;
 * 0 (the library's default, 1/sqrt(d_h)) when head_dim is 0. Thread-safe. */
double stab_attn_scale_of(stab_attn_scale scale, size_t head_dim);

/* What a Hugging Face config.json says (stab_hf_config_read) into cfg: the head count with its
 * key heads and head_dim (when cfg->heads is 0: a user's count is kept, and the key heads and
 * head width come only with the count they belong to), and tie from tie_word_embeddings.
 * Errors: NULL arguments STAB_EINVAL; num_attention_heads above STAB_MODEL_MAX_HEADS STAB_ERANGE
 * (heads left 0; the message names it). */
stab_status stab_model_config_from_hf(const stab_hf_config *hf, stab_model_config *cfg);

/* The largest head count accepted. */
#define STAB_MODEL_MAX_HEADS (1 << 20)

/* One layer of the model, or one tensor that is not measured (why_not set). Sizes are in the
 * kind's math (stab_layer's d_in, d_out: an embedding's d_in is V, an lm_head's d_out is V). */
typedef struct {
  const char *name;      /* the layer's name as a trace has it (see the rules); owned by the model */
  stab_kind kind;
  stab_layout layout;    /* linear, attention: OUT_MAJOR or IN_MAJOR; NATURAL for other kinds */
  size_t d_in, d_out;    /* attention: d_in = d, d_out = heads * d_h (the query's outputs) */
  const stab_ckpt_tensor *weight; /* the tensor read (attention: the query's; a tied head: the
                                     embedding's); for an entry not measured, the tensor */
  const stab_ckpt_tensor *bias;     /* linear: the folded X.bias, or NULL */
  const stab_ckpt_tensor *weight_k; /* attention: the key's tensor (weight itself when fused) */
  size_t ld;             /* attention: the stored row length of weight, in elements */
  size_t q_off, k_off;   /* attention: elements from the start of weight, weight_k to q and k */
  size_t heads;          /* attention: query heads */
  size_t kv_heads;       /* attention: key heads (fewer than heads: grouped-query) */
  int tied;              /* 1: a tied table entered a second time as lm_head */
  size_t n_expert;       /* a layer of experts: how many (its expert entries follow it); else 0 */
  size_t expert;         /* an expert's entry: its index (E of the name, or the slice); else
                            STAB_MODEL_NO_EXPERT */
  size_t group;          /* an expert's entry: the index of its layer's entry; else 0 */
  const char *why_not;   /* NULL, or why this tensor is not measured; owned by the model */
} stab_model_entry;

#define STAB_MODEL_NO_EXPERT ((size_t)-1)
/* The most experts one layer may have (DeepSeek-V3 has 256, Kimi K2 384); a 3-D tensor with
 * more is not measured, with the reason. A model's 3-D tensors have at most 32 times as many
 * experts in all (a hostile file must not make the model allocate without bound); past that, a
 * 3-D tensor is not measured either. */
#define STAB_MODEL_MAX_EXPERTS 4096

/* A 2-D view [rows][cols] of expert slice `expert` of the 3-D tensor t [n_expert][rows][cols]:
 * the same name, dtype and file, data and offset moved to the slice (for a block-quantized
 * type, whole blocks: GGUF rows are whole blocks), so that stab_ckpt_read_f32, _release and
 * _prefetch read that expert alone. Errors: NULL arguments, t not 3-D, expert out of range,
 * or a quantized slice that is not whole blocks, STAB_EINVAL. */
stab_status stab_model_expert_view(const stab_ckpt_tensor *t, size_t expert, stab_ckpt_tensor *view);

typedef struct stab_model stab_model;

/* Describes a model from its tensors by the rules above.
 *  tensors  n tensor views (a reader's, or the caller's own); only name, dtype, dtype_name,
 *           ndim, shape and count are read here. They must outlive the model (entries point
 *           at them)
 *  config   NULL for stab_model_default_config()
 *  out      receives the model; free with stab_model_free
 * Errors: NULL tensors (with n > 0) or out STAB_EINVAL; a NULL tensor or name STAB_EINVAL naming
 * its index; a kind override whose value is not linear, embedding, lm_head, gain, bias or skip,
 * or a layout override's not in_major or out_major, STAB_EINVAL naming it (never ignored);
 * STAB_ENOMEM. A tensor the rules cannot measure is an entry with why_not, not an
 * error. The model is read-only after this: any number of threads may use it. */
stab_status stab_model_describe(const stab_ckpt_tensor *const *tensors, size_t n,
                                const stab_model_config *config, stab_model **out);
/* NULL is a no-op. */
void stab_model_free(stab_model *m);
/* The layout rule 6 gives a 2-D linear tensor named name of shape [rows][cols] under config
 * (NULL: defaults): STAB_LAYOUT_IN_MAJOR for an HF GPT-2 Conv1D weight in Conv1D's shape (unless
 * config->out_major), a layout override's, else STAB_LAYOUT_OUT_MAJOR (also for a NULL name). */
stab_layout stab_model_linear_layout(const stab_model_config *config, const char *name, size_t rows, size_t cols);
/* 1 when the model has a head tensor (rule 5 or a kind override, measured or not, or one of
 * config.other_names), 0 when it has none (then tied, or with config.tie 0 missing). */
int stab_model_has_head(const stab_model *m);
/* Entries in the order of the rules (tensors, then attention, then the tied head); NULL past
 * the end. */
size_t stab_model_count(const stab_model *m);
const stab_model_entry *stab_model_entry_at(const stab_model *m, size_t index);

/* The stab_layer of entry e, reading weight, bias and weight_k: the values of e->weight,
 * e->bias and e->weight_k from their first element, all three stored as dtype (F32, F16 or
 * BF16: the tensors' own data when their dtype is one of these, or the caller's f32 copy;
 * the layer's .dtype). The offsets into a fused tensor are added here, in elements of dtype;
 * bias and weight_k are NULL when e has none. The layer is named e->name; an attention
 * entry's kv_heads is the layer's. A layer of experts is no stab_layer (register its
 * experts). Errors: NULL e, weight or out, an entry not measured or a layer of experts, a
 * dtype other than F32, F16 and BF16, STAB_EINVAL. */
stab_status stab_model_entry_layer(const stab_model_entry *e, stab_dtype dtype, const void *weight,
                                   const void *bias, const void *weight_k, stab_layer *out);

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
 * guard makes it STAB_EIO, see "Checkpoint readers".) */
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

/* The probe report as JSON (format "stabmeter-probe", format_version 2: docs/metrics.md),
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

#endif /* STABMETER_H */
