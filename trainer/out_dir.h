/* out_dir.h — the trainer's --out directory: created on demand (mkdirs), checked before a run
 * spends any time (check_out), and an earlier run's files there refused, continued or replaced
 * (check_earlier_run, remove_earlier_run) as out_mode says. Harness code. */
#ifndef STAB_TRAINER_OUT_DIR_H
#define STAB_TRAINER_OUT_DIR_H

#include "options.h"
#include "stabmeter.h"

/* path and every directory above it, created when missing; 0, or -1 with errno. */
int mkdirs(const char *path);

/* --out DIR before the run: DIR a directory or creatable, DIR/trace.h5 (with_trace) a regular
 * file if there. Returns 0, or 2 with the message. */
int check_out(const char *dir, int with_trace);

/* An earlier run's files in DIR under mode (see out_mode): refused (2, with the message, the
 * files kept) for a new run, accepted (0) for --resume and --replace. */
int check_earlier_run(const char *dir, stab_output_mode mode);

/* --replace: the earlier run's files in DIR removed (but trace.h5 when keep_trace). Returns 0,
 * or 1 with the message. */
int remove_earlier_run(const char *dir, int keep_trace);

/* What --out's files may meet: an earlier run replaced, continued or refused. */
stab_output_mode out_mode(const options *o);

#endif /* STAB_TRAINER_OUT_DIR_H */
