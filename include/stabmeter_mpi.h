/* stabmeter_mpi.h — stabmeter's MPI layer: spectral norms of weight matrices sharded across the
 * ranks of an MPI communicator (tensor parallelism: each rank holds some rows or some columns
 * of a linear layer), the same Lanczos as one process holding the whole matrix, and a split
 * linear layer's every metric (stab_mpi_linear_*); replicated weights, split tables and vectors.
 * Link with pkg-config stabmeter_mpi (libstabmeter_mpi and MPI); libstabmeter never needs MPI.
 * Built by ./configure --with-mpi. docs/manual/mpi.md has the design and its costs. */
#ifndef STABMETER_MPI_H
#define STABMETER_MPI_H

#include <mpi.h>

#include "stabmeter.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which side of the whole rows x cols matrix (d_out x d_in, row-major) is split among ranks. */
typedef enum {
  STAB_MPI_SPLIT_ROWS = 0, /* each rank holds rows [begin, end): a row-major (end - begin) x cols
                              block (Megatron's column-parallel linear, W stored d_out x d_in) */
  STAB_MPI_SPLIT_COLS = 1  /* each rank holds columns [begin, end): a row-major rows x (end - begin)
                              block (Megatron's row-parallel linear) */
} stab_mpi_split;

/* One rank's shard of a whole matrix. Every rank gives the same split, rows and cols; the
 * ranks' [begin, end) cover [0, rows) (or [0, cols)) exactly once between them, in any order
 * and of any sizes, each non-empty. */
typedef struct {
  stab_mpi_split split;
  size_t rows, cols;  /* the whole matrix */
  size_t begin, end;  /* this rank's rows (split by rows) or columns (split by columns) */
} stab_mpi_shard;

/* A registered sharded matrix: its layout on every rank, the warm-start vector (replicated:
 * the whole matrix's top singular vector on the split side's other side) and every buffer its
 * estimates need. Opaque. */
typedef struct stab_mpi_sharded stab_mpi_sharded;

/* Registers this rank's shard. Collective over comm: every rank calls it, and every rank gets
 * the same status: when any rank's shard or params is wrong (a NULL, an empty or out-of-range
 * [begin, end), a whole shape or split or params differing from rank 0's, shards overlapping
 * or leaving a gap), all return it, with a message naming the first bad rank and what is wrong,
 * and *out NULL; nobody is left waiting. comm is duplicated (MPI_Comm_dup: its own tag space
 * and MPI_ERRORS_RETURN, so that an MPI failure comes back as STAB_EIO, not an abort); the
 * caller's comm is not otherwise touched. params as stab_spectral_workspace_create's (NULL: the
 * defaults), method Lanczos, the same on every rank except threads. Allocates: the workspace
 * for the shard, 20 (4 n + 2) bytes for the sum (n = cols split by rows, rows split by
 * columns), and split by columns a transposed f32 copy of the shard.
 * Errors: STAB_EINVAL, STAB_EDIM, STAB_ERANGE (shards not covering), STAB_ENOMEM, STAB_EIO. */
stab_status stab_mpi_sharded_create(MPI_Comm comm, const stab_mpi_shard *shard,
                                    const stab_spectral_params *params, stab_mpi_sharded **out);

/* sigma of the whole matrix from every rank's shard w (as stab_mpi_shard says, row stride ld
 * elements, 0 meaning the shard's row length; f32). Collective: every rank calls it, each
 * with its own shard, and every rank gets the same status and the same result, bit for bit,
 * from run to run and for any params.threads. The first call starts cold, later ones warm
 * from the last estimate's vector (as a monitor does from step to step). A NaN or Inf in any
 * rank's shard: STAB_OK with out->nonfinite = 1 and sigma NaN on every rank. A bad w or ld on
 * any rank: STAB_EINVAL or STAB_EDIM on every rank, the message naming the rank. Per pass,
 * one MPI_Allreduce of 3 doubles (the scales) and one of 4 n + 1 int64 at most (both or all
 * vectors of the block in one call), summed exactly in fixed point: docs/manual/mpi.md.
 * Not thread-safe on one handle. */
stab_status stab_mpi_sharded_sigma(stab_mpi_sharded *s, const float *w, size_t ld,
                                   stab_sigma_result *out);

/* Frees the handle and its communicator: collective as MPI_Comm_free is (every rank frees its
 * handle, before MPI_Finalize). NULL is a no-op. */
void stab_mpi_sharded_free(stab_mpi_sharded *s);

/* Replicated weights (data parallelism, ZeRO-1/2: every rank holds the same weights): measures
 * the monitor's layers, divided among the ranks by their cost (elements x the passes they
 * expect, from the shapes alone: a layer stays on its rank from step to step, and so keeps its
 * warm start), each rank measuring its share (stab_monitor_measure_some), then gathers every
 * layer's metrics and head bounds to every rank (stab_monitor_set_metrics). Collective: every
 * rank calls it with its own monitor, the same layers registered in the same order (their
 * count and shapes are checked: STAB_EINVAL on every rank otherwise), the same with_update,
 * and after its own stab_monitor_snapshot in SNAPSHOT mode. On return every rank's
 * stab_monitor_metrics are the same bits as one process's stab_monitor_measure on the same
 * weights. A failing layer fails every rank with its status and message ("rank R: ..."), the
 * other layers' metrics gathered all the same. Allocates per call (the assignment and the
 * gathered metrics: some 120 bytes a layer per rank). Runs on comm itself (a handful of
 * collectives a call, no duplicate kept): an MPI failure follows comm's error handler, and is
 * STAB_EIO where that returns. Per rank, time falls about as 1/P while the largest layer is well
 * under 1/P of the total. */
stab_status stab_mpi_monitor_measure(MPI_Comm comm, stab_monitor *m, int with_update);

/* An embedding or LM-head table split by vocabulary (rows of tokens or classes [vocab_begin,
 * vocab_begin + shard->vocab) of whole_vocab, on every rank a table layer of its own tokens, the
 * same width, kind, layout, dtype and params): the whole table's metrics, as stab_layer_metrics
 * gives them for the whole table (max row RMS, the centred diameter bound, log V, rel_update),
 * on every rank, the same bits. before: this rank's shard before the step, or NULL. Each call
 * completes its sums (the mean item: width doubles; sums of squares), exactly in fixed point,
 * and maxima (a NaN anywhere wins) over the ranks, at most a dozen small collectives besides
 * the checks. Collective over comm: every rank gets the same status; any
 * rank's bad shard or arguments fail every rank, with a message naming it; shards must cover the
 * vocabulary exactly once. The tight method must be CENTRED or NONE. Allocates some 3 x width
 * values and P x 48 bytes per call. */
stab_status stab_mpi_table_metrics(MPI_Comm comm, const stab_layer *shard, size_t vocab_begin, size_t whole_vocab,
                                   const stab_layer *before, const stab_metrics_params *params, stab_metrics *out);

/* A gain or a bias split by entries (entries [begin, begin + shard->d_out) of whole_length, on
 * every rank a vector layer of its own entries, the same kind and dtype; before given on every
 * rank or on none): the whole vector's metrics as stab_layer_metrics gives them (a gain's
 * max |g| and max |dg|, a bias's RMS and its update's, rel_update), on every rank, the same bits.
 * Collective as stab_mpi_table_metrics, with the same checks and errors; a few small
 * collectives a call. Replicated gains and biases (every rank holding the whole vector) need
 * none of this: stab_mpi_monitor_measure, or stab_layer_metrics on any rank. */
stab_status stab_mpi_vector_metrics(MPI_Comm comm, const stab_layer *shard, size_t begin, size_t whole_length,
                                    const stab_layer *before, const stab_metrics_params *params, stab_metrics *out);

/* A linear layer split among ranks (tensor parallelism), measured whole: its weights W, the
 * whole d_out x d_in matrix out-major, split by rows (column-parallel: each rank holds rows
 * [begin, end) and the matching bias entries) or by columns (row-parallel: each rank holds
 * columns [begin, end); the bias, added after the all-reduce, is replicated whole on every
 * rank). The handle keeps two sharded estimates (W's and the update's, each warm from its own
 * last vector), the shard-sized f32 buffer the update is formed in, and a sum. Opaque. */
typedef struct stab_mpi_linear stab_mpi_linear;

/* Registers this rank's shard of a linear layer. Collective over comm, as
 * stab_mpi_sharded_create (which it calls twice, and whose checks and errors it has):
 * shard->rows = d_out, shard->cols = d_in of the whole layer; has_bias 1 when the layer has a
 * bias (the same on every rank, else STAB_EINVAL on every rank); params as stab_layer_metrics'
 * (NULL: the defaults; the spectral method Lanczos; tight is not used). comm is duplicated.
 * Allocates: two stab_mpi_sharded, a shard of f32 (the update, and 16-bit weights converted)
 * and two rows of f32. Errors: STAB_EINVAL, STAB_EDIM, STAB_ERANGE, STAB_ENOMEM, STAB_EIO, the
 * same on every rank with *out NULL. */
stab_status stab_mpi_linear_create(MPI_Comm comm, const stab_mpi_shard *shard, int has_bias,
                                   const stab_metrics_params *params, stab_mpi_linear **out);

/* The whole layer's metrics, as stab_layer_metrics gives them for the whole layer (sigma, its
 * rel_err and passes, dependency, forward, sigma_update, update, rel_update, the flags: through
 * stab_linear_metrics_assemble), on every rank, the same bits. Collective: every rank calls it.
 *  shard_layer  this rank's part, a STAB_KIND_LINEAR layer out-major (layout NATURAL or
 *               OUT_MAJOR), dtype F32, F16 or BF16, row stride ld (0: contiguous): split by
 *               rows d_out = end - begin and d_in = the whole d_in, bias its d_out entries;
 *               split by columns d_in = end - begin and d_out = the whole d_out, bias the whole
 *               (replicated) vector, read on the rank holding column 0 only, so that it counts
 *               once (the other ranks' copies must still be given, and are not read)
 *  before       this rank's part before the step (weight and bias, read with shard_layer's
 *               shape and ld, dtype F32, F16 or BF16 of its own), or NULL: on every rank or on
 *               none
 * sigma(W) and sigma(dW) are the sharded Lanczos (stab_mpi_sharded_sigma: every pass one
 * collective), the first call cold and later ones warm, W's and dW's apart; 16-bit weights
 * are converted into the handle's buffer first, and dW = W - before is formed there in f32,
 * as one process's f32 passes (tol >= STAB_SPECTRAL_F32_TOL_MIN) form it; its f64 passes
 * subtract in f64, so at f64 tolerances sigma_update differs from one process's by the f32
 * rounding of the differences, at most 2^-24 ||dW||_F (none when they are exact in f32, as
 * for weights on a common grid). The sums of squares of W, dW, b and db (in f64 from the
 * stored values, as one process takes them) are summed over the ranks exactly in fixed point,
 * in one collective. Results equal one process's to rounding (1e-12 relative at f64
 * tolerances, sigma_update as above), not bit for bit. A NaN or Inf in any rank's weights or update: STAB_OK, the
 * flag and NaN on every rank. Any rank's bad argument (NULL, a shape or kind or dtype the
 * handle does not take, before on some ranks only, a bias where the handle has none or none
 * where it has one): the same status on every rank, the message naming the rank, metrics NaN;
 * nobody waits. Allocates nothing. Not thread-safe on one handle. */
stab_status stab_mpi_linear_measure(stab_mpi_linear *h, const stab_layer *shard_layer, const stab_layer *before,
                                    stab_metrics *out);

/* Every split linear layer of a step measured together: out[i] the same bits, on every rank,
 * as stab_mpi_linear_measure(h[i], shard_layers[i], befores ? befores[i] : NULL, &out[i])
 * called for i = 0, 1, ... in turn (the same warm starts, the same passes and stopping
 * decisions), for any params.threads; but every pass of every layer's estimates still running
 * (W's and dW's of each layer side by side, layers that have converged dropping out) is summed
 * over the ranks in ONE exchange, each layer's values on a fixed-point grid of their own, and
 * the calls' checks and sums of squares are merged likewise. Collectives per call, every
 * argument good and every value finite: 3 + 2 R (an MPI_Allreduce of the checks, per pass one
 * MAX of the grids' scales and one SUM of the values, and one of each for the sums of
 * squares), R = the largest pass count among the estimates (with an update, W's and dW's
 * count apart, except for 16-bit layers split by rows, whose update is formed in the buffer
 * their weights are converted in: there R takes W's passes plus dW's); one more per
 * exchange (a pass, or the sums of squares) that carries a NaN or an infinity; one more (a
 * broadcast of the message) when a rank fails.
 * n single calls make sum_i (10 + 2 (passes of W_i + of dW_i)) with updates, 8 + 2 passes
 * without. The estimates run in worker threads, one per layer (two with an update), taking
 * turns in layer order (one computes at a time, its passes as fast as a single call's, with
 * params.threads), that never call MPI: the calling thread does every exchange, so
 * MPI_THREAD_FUNNELED is enough;
 * when MPI was initialised with less (MPI_Init gives MPI_THREAD_SINGLE with Open MPI: use
 * MPI_Init_thread), on a communicator of one rank (where an exchange costs next to nothing),
 * or when a rank cannot start its threads, every rank runs the estimates one after another in
 * the calling thread, the same bits, 3 + 2 (sum of the passes) collectives.
 *  h             n handles, all created on communicators of the same ranks in the same order
 *                (duplicates of one: MPI_Comm_compare congruent), each given once, the same
 *                handles in the same order on every rank (else STAB_EINVAL on every rank)
 *  shard_layers  n layers, each as stab_mpi_linear_measure's shard_layer for its handle
 *  befores       NULL (no update for any layer), or n entries each NULL or the layer's before,
 *                each alike on every rank
 *  out           n metrics
 * A NaN or Inf in one layer's weights or update on any rank: that layer's metrics NaN with
 * the flag on every rank, the others measured. Any rank's bad argument: the same status on
 * every rank, the message naming the rank and the layer ("rank R: ...: layer i: ..."), every
 * out[i] NaN, nothing measured (warm starts kept); nobody waits. An MPI failure: STAB_EIO on
 * the ranks that see it, every out[i] NaN. n = 0: STAB_OK, no collective (h may be NULL).
 * h NULL or every h[i] NULL: STAB_EINVAL on this rank alone (no communicator to tell).
 * Allocates per call: the tasks and a thread each, and the exchanges' buffers, 20 (4 n + 1)
 * bytes per estimate (n its vectors' length). Not thread-safe on one handle. */
stab_status stab_mpi_linear_measure_batch(stab_mpi_linear *const *h, size_t n, const stab_layer *const *shard_layers,
                                          const stab_layer *const *befores, stab_metrics *out);

/* Frees the handle and its communicators: collective as MPI_Comm_free is. NULL is a no-op. */
void stab_mpi_linear_free(stab_mpi_linear *h);

/* ---- the same bytes on every rank -------------------------------------------------- */

/* A 64-bit non-cryptographic hash of n bytes (NULL with n = 0: the empty input), chained by
 * seed (pass a previous digest to hash a sequence of pieces; 0 to start). The same value on
 * every host (the bytes read as little-endian words). Four independent multiply-rotate lanes
 * over 32-byte blocks and splitmix64's finaliser: it reads memory at several GB/s, far less time
 * than fetching the bytes from a file system or measuring them takes; not a defence against
 * bytes chosen to collide. Thread-safe. */
uint64_t stab_mpi_digest(uint64_t seed, const void *bytes, size_t n);

/* Every rank of comm holds n digests of what it read, what[i] naming item i (a file, "the
 * weights"); the ranks agree that they read the same: one MPI_Allgather of the counts, then one
 * of the n digests. Collective. STAB_OK when every rank's digests equal rank 0's; else, on every
 * rank alike, STAB_EINVAL with *rank (>= 1) and *item the first that differs and the message
 * "WHO: WHAT: rank R read other bytes than rank 0 (64-bit hash ..., rank 0's ...)" (WHAT as the
 * calling rank names item i), or "rank R read N items, rank 0 M" when the counts differ (*item 0). STAB_ENOMEM when some rank has no room,
 * STAB_EIO when MPI fails. rank and item may be NULL; who prefixes the message (NULL: the
 * function's name). Allocates 8 n P bytes for the exchange. */
stab_status stab_mpi_same_digests(MPI_Comm comm, const char *who, const char *const *what, const uint64_t *digest,
                                  size_t n, int *rank, size_t *item);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_MPI_H */
