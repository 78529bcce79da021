/* measure.h — what the trainer measures besides the loss, around the library's monitor: the
 * layers it registers, the worst of them, the alarms, the residual stream's per-block
 * statistics (the trace's layer extras), the trace's run_config, and the per-kind means of a
 * width sweep. Harness code. */
#ifndef STAB_TRAINER_MEASURE_H
#define STAB_TRAINER_MEASURE_H

#include <stddef.h>

#include "model.h"
#include "options.h"
#include "stabmeter.h"

/* Every layer of the model registered with mon (external: whole layers whose metrics come from
 * the ranks' measurements, train_tp.h). Returns 0, or 1 with the message on stderr. */
int register_layers(stab_monitor *mon, model *m, int external);

/* The largest of one metric over the layers (0 forward, 1 dependency, 2 update), the head left
 * out of forward and dependency; *name where (without "transformer."). NaN wins. */
double worst(const stab_monitor *mon, int which, const char **name);

/* What the alarms keep per monitor layer: which they have reported, and the learning rate of
 * the step the update's reference comes from. */
enum { SAID_RELATIVE = 1, SAID_LIMIT = 2 };
typedef struct {
  unsigned char said;
  double ref_lr; /* NaN until the monitor has an update reference */
} layer_alarm;

/* The alarms of one measurement (step, its learning rate lr), each said once per layer on
 * stderr; tty: stderr is a terminal (the progress line cleared first). */
void check_alarms(const stab_monitor *mon, const options *o, layer_alarm *la, size_t step, double lr, int tty);

/* RMS of the residual stream h (N, D) and |cos(h, 1)|, averaged over its N positions. */
void block_stats(const float *h, size_t N, size_t D, double *rms, double *cos1);

/* The block a monitor layer belongs to ("transformer.h.<l>."), or -1. */
long layer_block(const char *name);

/* The trace's run_config attribute (JSON) into buf (n bytes): the settings and the parallel
 * layout of ranks. */
void run_config(char *buf, size_t n, const options *o, const model *m, int ranks);

/* Per layer kind and metric (forward, dependency, update): the sum of the logs and the count
 * of the finite positive values over the kind's layers and the measured steps of the last
 * quarter of a run; their geometric mean is what a width sweep compares across widths. */
enum { N_KINDS = 6 };
typedef struct {
  double log_sum[N_KINDS][3];
  size_t count[N_KINDS][3];
} kind_means;

/* The monitor's last measurement added to k. */
void kind_means_add(kind_means *k, const stab_monitor *mon);
/* The geometric mean of one kind's metric (0 forward, 1 dependency, 2 update), NaN when none. */
double kind_mean(const kind_means *k, int kind, int metric);

#endif /* STAB_TRAINER_MEASURE_H */
