/* run.h — one training run of the trainer: the model, its optimizer and monitor set up, the
 * steps (each measured every --metrics-every, traced, checkpointed every --checkpoint-every),
 * and the end of the run (held-out loss, reports, the last checkpoint); in one process, or on
 * every rank of a data- or tensor-parallel world. Harness code. */
#ifndef STAB_TRAINER_RUN_H
#define STAB_TRAINER_RUN_H

#include <stddef.h>

#include "data.h"
#include "measure.h"
#include "options.h"
#include "train_world.h"

/* How one run ended, for the sweeps. */
typedef struct {
  int diverged;      /* the loss turned non-finite at step steps_done (exit status 1) */
  size_t steps_done; /* optimizer steps taken */
  double first_loss; /* the first training batch's loss, before any step */
  double final_loss; /* the last training batch's loss; NaN if diverged */
  double heldout;    /* the held-out loss at the end; NaN if diverged */
} run_result;

/* One training run with the options o; the sweep gives each run its width and directory.
 * means, when not NULL, receives the last quarter's per-kind metrics, and res how the run
 * ended. world: the ranks of a --data-parallel or --tensor-parallel run, NULL for one process
 * (every rank calls it, with the same options). Returns the exit status. */
int train_run(const options *o, const data_set *data, kind_means *means, run_result *res, train_world *world);

/* Every rank's failure becomes every rank's: under --data-parallel the ranks agree on the
 * first failing rank's exit code, so that nobody waits in a collective that a failed rank will
 * never call. Called at the same points on every rank. One process: rc itself. */
static inline int together(train_world *w, int rc) { return w ? train_world_agree(w, rc) : rc; }

#endif /* STAB_TRAINER_RUN_H */
