/* train_tp.h — the monitor of a tensor-parallel run (model_tp.h): every layer of the whole model
 * measured across the ranks, its metrics those of the whole layer, on every rank. The trace's
 * monitor holds every layer external (stab_monitor_add_external: the whole model's names, kinds
 * and shapes, as one process registers them); its metrics come from
 *  - the split linear layers (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj): one
 *    stab_mpi_linear each, by rows (column-parallel) or columns (row-parallel), the update from
 *    this rank's copy of its slices before the step;
 *  - the attention logits: each rank measures its own heads (each head's q and k rows are on one
 *    rank), and the heads' bounds are gathered in rank order (the layer's forward is their max);
 *  - the replicated layers (embeddings, norms, LM head): a monitor of their own on every rank,
 *    divided among the ranks by stab_mpi_monitor_measure.
 * train_tp.c, built with ./configure --with-mpi only.
 * Harness code: failures come back as a status with stab_last_error(), or 1 with a message. */
#ifndef STAB_HARNESS_TRAIN_TP_H
#define STAB_HARNESS_TRAIN_TP_H

#include "model_tp.h"
#include "stabmeter.h"
#include "train_world.h"

typedef struct train_tp train_tp;

#if TRAIN_WITH_MPI

/* Collective. trace: every layer registered external with pointers into whole->params (which
 * layer reads which tensor: register_layers); mp the trace monitor's params. Returns 0, or 1
 * with the message on stderr (every rank agrees on it afterwards: train_world_agree). */
int train_tp_create(train_world *w, const model_tp *tp, const model *whole, const stab_monitor *trace,
                    const stab_monitor_params *mp, train_tp **out);

/* The weights before the step: call where stab_monitor_snapshot is called. Allocates nothing. */
stab_status train_tp_snapshot(train_tp *t);

/* Collective: every layer's metrics into trace (stab_monitor_set_metrics), the same bits on every
 * rank. The status of the first failure, the same on every rank. */
stab_status train_tp_measure(train_tp *t, stab_monitor *trace, int with_update);

/* Bytes it holds (its monitors, the copy of the slices). */
size_t train_tp_memory(const train_tp *t);

/* Collective (frees communicators). NULL is a no-op. */
void train_tp_free(train_tp *t);

#else

static inline int train_tp_create(train_world *w, const model_tp *tp, const model *whole, const stab_monitor *trace,
                                  const stab_monitor_params *mp, train_tp **out) {
  return (void)w, (void)tp, (void)whole, (void)trace, (void)mp, *out = NULL, 1;
}
static inline stab_status train_tp_snapshot(train_tp *t) { return (void)t, STAB_EINVAL; }
static inline stab_status train_tp_measure(train_tp *t, stab_monitor *trace, int with_update) {
  return (void)t, (void)trace, (void)with_update, STAB_EINVAL;
}
static inline size_t train_tp_memory(const train_tp *t) { return (void)t, 0; }
static inline void train_tp_free(train_tp *t) { (void)t; }

#endif

#endif /* STAB_HARNESS_TRAIN_TP_H */
