/* options.h — the trainer's settings, as its command line gives them (parsed in train.c) and
 * every part of a run reads them (run.c, checkpoint.c, measure.c). Harness code. */
#ifndef STAB_TRAINER_OPTIONS_H
#define STAB_TRAINER_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "optim.h"
#include "stabmeter.h"

typedef struct {
  size_t width, depth, heads, context, batch, steps, warmup, metrics_every, corpus_bytes;
  size_t checkpoint_every;
  double lr, min_lr_frac;
  double alarm; /* --alarm X: a ratio to the layer's reference above X; 0 = none */
  double alarm_limit[8]; /* --alarm-limit KIND=X, per stab_kind: forward or dependency above X; 0 = none */
  optim_kind optimizer;
  int lr_given, warmup_given;
  uint64_t seed;
  int biases, untied;
  int attn_inverse;  /* --attn-scale inverse: logits scaled by 1/d_h, not 1/sqrt(d_h) */
  size_t head_dim;   /* --head-dim N: heads = width / N at every width; 0 without it */
  int heads_given;
  int print_metrics; /* the last measurement of every layer, as a table on stdout */
  size_t flush_every; /* trace rows written and flushed every this many measurements; 0: the
                        library's default (a writer thread, at most a second behind) */
  stab_trace_on_error trace_errors;
  const char *out, *data;
  const char *resume; /* a safetensors checkpoint of this trainer to start from */
  size_t sweep[16], n_sweep; /* --sweep-widths: train once per width, each into out/width-W */
  double sweep_lr[16];       /* --sweep-lrs: train once per learning rate, into out/lr-X */
  size_t n_sweep_lr;
  int replace;       /* --replace: an earlier run in --out is replaced (else refused, or with
                        --resume continued) */
  int data_parallel; /* --data-parallel: under mpirun, each rank a slice of every batch */
  size_t tensor_parallel; /* --tensor-parallel P: under mpirun -np P, each rank a slice of every
                             linear layer; 0 without it */
} options;

#endif /* STAB_TRAINER_OPTIONS_H */
