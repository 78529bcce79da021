/* sweep.h — the trainer's width and learning-rate sweeps (--sweep-widths, --sweep-lrs): a run
 * each (run.h), compared. Harness code. */
#ifndef STAB_TRAINER_SWEEP_H
#define STAB_TRAINER_SWEEP_H

#include "data.h"
#include "options.h"
#include "train_world.h"

/* One run per (learning rate, width) of o's sweeps, into o->out/lr-X/width-W (a level the sweep
 * does not vary left out), on every rank of dp (NULL: one process); the comparison on stdout.
 * Returns the exit status. */
int sweep(const options *o, const data_set *data, train_world *dp);

#endif /* STAB_TRAINER_SWEEP_H */
