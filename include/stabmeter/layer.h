/* stabmeter/layer.h — what a layer is (its kind, layout and stored type; stab_layer) and its
 * metrics, measured one layer at a time, whole (stab_layer_metrics) or split among processes
 * (the _reduced functions, stab_linear_metrics_assemble). Part of <stabmeter.h>. */
#ifndef STABMETER_LAYER_H
#define STABMETER_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "spectral.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Layer kinds and layouts                                                             */

/* Which kind a tensor is (docs/manual/metrics.md has each kind's metrics):
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
 * (counts 0). See docs/manual/metrics.md for each definition. */
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
 * convert them (stab_ckpt_read_f32). The monitor takes 16-bit layers as they are stored too:
 * its snapshot is a 16-bit copy, and its buffers are made at registration (monitor.h).
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

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_LAYER_H */
