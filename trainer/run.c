/* run.c — one training run, in the order it happens: the input checked, the model and its
 * optimizer set up (from a checkpoint with --resume, split across ranks with
 * --tensor-parallel), the monitor and the trace; then one function per step (forward,
 * backward, the monitor's snapshot, the optimizer's step, the measurement and its trace row,
 * the checkpoint, the progress line); then the end of the run (held-out loss, reports, the
 * ranks' weights checked alike, the trace closed, the last checkpoint).
 * Harness code: messages on stderr through cli.h, results on stdout. */
#include "run.h"

#include "checkpoint.h"
#include "cli.h"
#include "clock.h"
#include "model_tp.h"
#include "out_dir.h"
#include "train_tp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* Linear warmup to lr over `warmup` steps, then cosine down to lr * min_frac at the end. */
static double lr_at(const options *o, size_t step) {
  if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
  double span = (double)(o->steps - o->warmup), x = span > 0 ? (double)(step - o->warmup) / span : 1;
  double c = 0.5 * (1.0 + cos(M_PI * (x > 1 ? 1 : x)));
  return o->lr * (o->min_lr_frac + (1.0 - o->min_lr_frac) * c);
}

/* After an append or flush of the trace returned ts: 0 to go on, 1 to stop. The call that
 * fails returns the error in either --trace-errors mode; with continue the trace then turns
 * itself off and the run goes on (said once, here). was_failed: stab_trace_failed before. */
static int trace_went(stab_trace *trace, stab_status ts, int was_failed, const options *o, int tty,
                      const char *trace_path) {
  if (!was_failed && stab_trace_failed(trace) && o->trace_errors == STAB_TRACE_CONTINUE) {
    fputs(tty ? "\n" : "", stderr);
    cli_error("trace: %s", stab_last_error());
    cli_error("going on without the trace; the rows written before are in %s", trace_path);
  } else if (ts != STAB_OK) {
    fputs(tty ? "\n" : "", stderr);
    cli_error("trace: %s", stab_last_error());
    cli_error("stopping; the rows written before are in %s (--trace-errors continue goes on "
              "without the trace)", trace_path);
    return 1;
  }
  return 0;
}

static void fmt_time(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) s = 0;
  long t = (long)(s + 0.5);
  snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}


/* Mean loss over `batches` fixed batches of [lo, hi); this rank runs rows [b0, b0 + nb) of
 * each (all of them in one process), and the ranks' means are combined (collective: w, under
 * --data-parallel); with tp the split model runs every batch whole on every rank. */
static double eval_loss(model *m, model_tp *tp, train_world *w, const data_set *d, size_t lo, size_t hi,
                        size_t B, size_t b0, size_t nb, size_t T, int32_t *tok, int32_t *tgt,
                        size_t batches) {
  data_rng r = {12345};
  double s = 0;
  for (size_t i = 0; i < batches; i++) {
    data_batch(d, &r, lo, hi, B, T, tok, tgt);
    s += tp ? model_tp_forward(tp, tok, tgt, B, T) : model_forward(m, tok + b0 * T, tgt + b0 * T, nb, T);
  }
  s /= (double)batches;
  return w && train_world_mean(w, &s, 1, B) ? NAN : s;
}

/* --tensor-parallel: the ranks' slices of the weights and of AdamW's moments put together into
 * m->params, whole_m and whole_v (on every rank), as one process holds them. Collective.
 * Returns 0, or 1 with the message on stderr. */
static int gather_whole(model_tp *part, model *m, const optim *opt, float *whole_m, float *whole_v) {
  if (model_tp_gather(part, part->local.params, m->params)) return 1;
  if (opt->m && (model_tp_gather(part, opt->m, whole_m) || model_tp_gather(part, opt->v, whole_v))) return 1;
  return 0;
}

/* ---- the run's state ------------------------------------------------------------- */

/* Everything one run holds, from setup to the end; every pointer starts NULL and the end
 * (release) frees what is there. */
typedef struct {
  options o;               /* the run's settings (a copy: the sweep's per run) */
  const data_set *data;
  train_world *world;      /* every rank of a parallel run, or NULL */
  /* --data-parallel: this rank's rows [b0, b0 + nb) of every batch; rank 0 alone writes.
   * --tensor-parallel: every rank every row, dpw NULL (the ranks' collectives are the split
   * model's and its monitor's). */
  train_world *dpw;
  size_t split;            /* the data's tokens [0, split) train, the last tenth is held out */
  size_t B, T, b0, nb, ranks;
  int writer, tensor;
  model m;
  optim opt;
  model_tp part;           /* --tensor-parallel: this rank's part of m */
  model *mine;             /* the parameters this rank trains: m, or part.local */
  train_tp *ttp;           /* --tensor-parallel: the monitor's measurements across ranks */
  float *whole_m, *whole_v; /* --tensor-parallel: AdamW's moments in m's layout */
  stab_monitor *mon;
  layer_alarm *alarms;     /* per monitor layer: check_alarms's */
  stab_trace *trace;       /* DIR/trace.h5, with --out and a monitor */
  char trace_path[4096];
  long *blocks;            /* per monitor layer: its block, or -1 */
  double *extras;          /* per monitor layer: act_rms, act_cos1 */
  int32_t *tok, *tgt;      /* (B, T) a batch's tokens and targets */
  size_t start;            /* the step the run starts at: 0, or its checkpoint's */
  int moments_read;        /* --resume read the AdamW moments beside the checkpoint */
  /* the steps' progress */
  int tty;                 /* stderr is a terminal: one progress line, redrawn */
  size_t every_line;       /* not a terminal: a progress line every this many steps */
  data_rng rng;
  int measured;            /* the monitor has measured once */
  double t0, last_draw, first_loss, loss, measure_time;
} run_state;

/* The data long enough, the batch and --out fit for the run. Returns 0 or the exit status,
 * this rank's. */
static int check_input(run_state *s) {
  const options *o = &s->o;
  if (s->data->n / 10 < s->T + 1 || s->split < s->T + 1) {
    cli_error("%s is too short for context %zu (needs %zu tokens)", s->data->what, s->T, 10 * (s->T + 1));
    return 2;
  }
  if (s->dpw && s->B < s->ranks)
    return cli_usage_error("--batch %zu is smaller than the %zu ranks: each needs a sequence", s->B, s->ranks);
  int rc = 0;
  if (o->out) {
    rc = check_out(o->out, o->metrics_every != 0);
    if (!rc && s->writer) rc = check_earlier_run(o->out, out_mode(o));
  }
  return rc;
}

/* ---- setup ----------------------------------------------------------------------- */

/* --resume: the weights and the step of the checkpoint. Returns 0 or the exit status. */
static int resume_weights(run_state *s) {
  const options *o = &s->o;
  char msg[1024];
  ckpt_part weights = {"", s->m.params};
  int lrc = checkpoint_load(&s->m, o->resume, &weights, 1, &s->start, o, msg, sizeof msg);
  if (!lrc && s->start >= o->steps)
    snprintf(msg, sizeof msg, "%s is at step %zu, not before --steps %zu", o->resume, s->start, o->steps), lrc = 2;
  if (lrc) cli_error("cannot resume: %s", msg);
  return lrc;
}

/* --tensor-parallel: the whole model initialised (or loaded) as one process does, then this
 * rank's slices. Returns 0 or the exit status. */
static int split_model(run_state *s) {
  const options *o = &s->o;
  int trc = model_tp_create(&s->part, &s->m, s->world);
  s->whole_m = malloc(s->m.n_params * sizeof *s->whole_m);
  s->whole_v = malloc(s->m.n_params * sizeof *s->whole_v);
  if (trc == -1) { /* parse refused these already: a guard, not a path */
    cli_error("--tensor-parallel %zu: --heads %zu and --width %zu must be divisible by it", s->ranks, o->heads,
              o->width);
    return 2;
  }
  if (trc || !s->whole_m || !s->whole_v) {
    cli_error("out of memory for the split model");
    return 1;
  }
  s->mine = &s->part.local;
  return 0;
}

/* --resume with AdamW: it goes on with the moments saved beside the checkpoint, as if never
 * stopped; without them it starts its moments (and their bias correction) again from 0. The
 * resuming said either way. Returns 0 or the exit status. */
static int resume_moments(run_state *s) {
  const options *o = &s->o;
  char mpath[4300], msg[4600];
  const char *how = "";
  struct stat sb;
  if (s->opt.m && (moments_path(mpath, sizeof mpath, o->resume) || stat(mpath, &sb))) {
    how = " (no AdamW moments beside it: they start again from 0)";
  } else if (s->opt.m) {
    /* split: read whole, then this rank's slices */
    ckpt_part moments[2] = {{"exp_avg.", s->tensor ? s->whole_m : s->opt.m},
                            {"exp_avg_sq.", s->tensor ? s->whole_v : s->opt.v}};
    size_t mstep = 0;
    int lrc = checkpoint_load(&s->m, mpath, moments, 2, &mstep, NULL, msg, sizeof msg);
    if (!lrc && s->tensor)
      model_tp_scatter(&s->part, s->whole_m, s->opt.m), model_tp_scatter(&s->part, s->whole_v, s->opt.v);
    if (!lrc && mstep != s->start)
      snprintf(msg, sizeof msg, "%s is at step %zu, its checkpoint at %zu", mpath, mstep, s->start), lrc = 2;
    if (lrc) {
      cli_error("cannot resume: %s", msg);
      return lrc;
    }
    s->opt.step = (long)s->start;
    how = " with its AdamW moments";
    s->moments_read = 1;
  }
  cli_error("resuming from %s at step %zu%s", o->resume, s->start, how);
  return 0;
}

/* The parameters (initialised, or read with --resume), their split with --tensor-parallel,
 * the optimizer (and its moments with --resume) and the monitor with every layer. Returns 0
 * or the exit status, this rank's. */
static int setup_model(run_state *s) {
  const options *o = &s->o;
  int rc;
  model_init_params(&s->m, o->seed, o->optimizer == OPTIM_ADAMW);
  if (o->resume && (rc = resume_weights(s))) return rc;
  if (s->tensor && (rc = split_model(s))) return rc;
  optim_params op = optim_default_params(o->optimizer);
  if (optim_create(&s->opt, &op, s->mine->tensors, s->mine->n_tensors, s->mine->n_params)) {
    cli_error("out of memory for the optimizer");
    return 1;
  }
  if (o->resume && (rc = resume_moments(s))) return rc;
  if (o->metrics_every) {
    stab_monitor_params mp = stab_monitor_default_params();
    if (stab_monitor_create(&mp, &s->mon) != STAB_OK || register_layers(s->mon, &s->m, s->tensor)) {
      cli_error("monitor: %s", stab_last_error());
      return 1;
    }
  }
  return 0;
}

/* DIR/trace.h5 opened (a resumed run's continued) with the monitor's layers, the loss and
 * learning rate, and each layer's act_rms and act_cos1. Returns 0 or the exit status. */
static int open_trace(run_state *s) {
  const options *o = &s->o;
  static const char *const scalars[] = {"loss", "lr"};
  static const char *const layer_extras[] = {"act_rms", "act_cos1"};
  char config[2048];
  size_t nl = stab_monitor_layer_count(s->mon);
  s->blocks = malloc(nl * sizeof *s->blocks);
  s->extras = malloc(2 * nl * sizeof *s->extras);
  if (!s->blocks || !s->extras) {
    cli_error("out of memory");
    return 1;
  }
  for (size_t i = 0; i < nl; i++) s->blocks[i] = layer_block(stab_monitor_layer(s->mon, i)->name);
  if (snprintf(s->trace_path, sizeof s->trace_path, "%s/trace.h5", o->out) >= (int)sizeof s->trace_path ||
      mkdirs(o->out)) {
    cli_error("cannot create the directory %s: %s", o->out, strerror(errno));
    return 1;
  }
  run_config(config, sizeof config, o, &s->m, (int)s->ranks);
  stab_trace_params tp = stab_trace_default_params();
  tp.flush_every = (int)o->flush_every;
  tp.run_config = config;
  tp.scalars = scalars;
  tp.n_scalars = 2;
  tp.layer_extras = layer_extras;
  tp.n_layer_extras = 2;
  tp.on_error = o->trace_errors;
  tp.append = (int)out_mode(o);      /* a resumed run continues its trace, */
  tp.resume_step = (int64_t)s->start; /* replacing the rows of the steps it redoes */
  stab_status ts = stab_trace_open(s->trace_path, s->mon, &tp, &s->trace);
  if (ts != STAB_OK) {
    cli_error("trace: %s", stab_last_error());
    /* a trace another run is writing, one of another model, or one that appeared since
     * check_earlier_run: the input, not a failure */
    return ts == STAB_EBUSY || ts == STAB_EINVAL || ts == STAB_EEXIST ? 2 : 1;
  }
  /* Until it is closed the file is marked open for writing (SWMR), and a plain HDF5 open
   * (h5dump, ncdump, xarray) refuses it: say what reads it, and how to repair it after a kill. */
  fprintf(stderr, "train: trace: %s; while this runs or if it is killed, h5py (swmr=True) and stabmeter-export "
          "read it; after a kill, `h5clear -s %s` lets h5dump, ncdump and xarray open it\n", s->trace_path,
          s->trace_path);
  /* A resumed run's trace should hold the steps measured before its checkpoint; when it does
   * not (the trace failed or was replaced while checkpoints went on), the gap stays. */
  size_t before = o->resume ? s->start - s->start % o->metrics_every : 0; /* the last step measured */
  int64_t last = 0;
  if (before > 0 && stab_trace_last_step(s->trace, &last) != STAB_OK)
    cli_error("warning: %s has no rows up to step %zu, where the run resumes: steps "
              "%zu..%zu will be missing from it", s->trace_path, s->start, o->metrics_every, before);
  else if (before > 0 && last < (int64_t)before)
    cli_error("warning: %s ends at step %lld, the run resumes from step %zu: steps "
              "%lld..%zu will be missing from it", s->trace_path, (long long)last, s->start,
              (long long)last + 1, before);
  return 0;
}

/* The alarms' state per monitor layer. A resumed run's alarms judge by the run's first
 * measurement, as its trace does: the reference of the trace's rows (the update's taken at
 * the first measured step, the trace starting with the run). Returns 0, or 1 with the message. */
static int prepare_alarms(run_state *s) {
  const options *o = &s->o;
  s->alarms = s->mon ? calloc(stab_monitor_layer_count(s->mon), sizeof *s->alarms) : NULL;
  if (s->mon && !s->alarms) {
    cli_error("out of memory");
    return 1;
  }
  for (size_t i = 0; s->mon && i < stab_monitor_layer_count(s->mon); i++) {
    s->alarms[i].ref_lr = NAN;
    stab_metrics ref;
    if (s->trace && o->resume && stab_trace_reference(s->trace, i, &ref) == STAB_OK) {
      stab_monitor_set_reference(s->mon, i, &ref);
      if (!isnan(ref.update)) s->alarms[i].ref_lr = lr_at(o, o->metrics_every - 1);
    }
  }
  return 0;
}

/* What the run is, on stderr; the trace opened, an earlier run's files replaced (--replace),
 * the alarms prepared. Returns 0 or the exit status, this rank's. */
static int setup_outputs(run_state *s) {
  const options *o = &s->o;
  int rc;
  cli_error("%s", s->data->what);
  cli_error("model V=%zu D=%zu L=%zu H=%zu T=%zu, %zu parameters (%s head%s); "
            "%s, lr %g, warmup %zu, batch %zu x %zu, %zu steps", s->m.c.vocab, o->width, o->depth, o->heads, s->T,
            s->m.n_params, o->untied ? "untied" : "tied", o->biases ? ", biases" : "",
            o->optimizer == OPTIM_ADAMW ? "adamw (init std 0.02)" : "steepest (articles' init)",
            o->lr, o->warmup, s->B, s->T, o->steps);
  if (s->mon && o->out && s->writer && (rc = open_trace(s))) return rc;
  /* --replace: the new trace is in place (a trace another run holds was refused above); now no
   * checkpoint of the earlier run is left beside this one's */
  if (o->replace && o->out && s->writer && remove_earlier_run(o->out, s->trace != NULL)) return 1;
  if (s->mon)
    cli_error("monitor: %zu layers every %zu steps, %.1f MB", stab_monitor_layer_count(s->mon), o->metrics_every,
              (stab_monitor_memory(s->mon) + train_tp_memory(s->ttp)) / 1e6);
  if (o->optimizer == OPTIM_STEEPEST && !o->untied)
    cli_error("warning: steepest with a tied head: the head is the embedding (init "
              "std 1, not the articles' 1/d), so the first logits are large; --untied "
              "follows the articles");
  if (prepare_alarms(s)) return 1;
  size_t B = s->B, ranks = s->ranks;
  if (s->tensor)
    cli_error("tensor parallel: %zu rank%s, each %zu of the %zu heads and %zu of the %zu MLP columns, every "
              "sequence of every batch", ranks, ranks == 1 ? "" : "s", s->part.Hl, o->heads, s->part.Fl,
              4 * o->width);
  else if (s->world && B % ranks)
    cli_error("data parallel: %zu ranks, each %zu or %zu of the %zu sequences of every batch", ranks,
              B / ranks + 1, B / ranks, B);
  else if (s->world)
    cli_error("data parallel: %zu rank%s, each %zu of the %zu sequences of every batch", ranks,
              ranks == 1 ? "" : "s", B / ranks, B);
  return 0;
}

/* --resume on several ranks: every rank read its own copy of the checkpoint: the same bytes,
 * or nobody trains (each rank's share of every step would be measured on other weights).
 * Collective. Returns 0 or the exit status. */
static int same_checkpoint_everywhere(run_state *s) {
  const uint64_t at = s->start;
  const float *mom = s->tensor ? s->whole_m : s->opt.m, *mom2 = s->tensor ? s->whole_v : s->opt.v;
  const char *what[] = {"its step", "the weights", "the AdamW exp_avg", "the AdamW exp_avg_sq"};
  const void *bytes[] = {&at, s->m.params, mom, mom2};
  const size_t sizes[] = {sizeof at, s->m.n_params * sizeof *s->m.params, s->m.n_params * sizeof *mom,
                          s->m.n_params * sizeof *mom2};
  return train_world_same_input(s->world, s->o.resume, what, bytes, sizes, s->moments_read ? 4 : 2);
}

/* ---- one step -------------------------------------------------------------------- */

/* The measurement after step's update (lr its rate): the monitor's metrics (every rank the
 * same), the alarms, the sweep's means, the residual stream's statistics and the trace's row.
 * *failed: the trace's write stopped the run (this rank's). Returns 0, or 1 to stop. */
static int measure_step(run_state *s, size_t step, double lr, kind_means *means, int *failed) {
  const options *o = &s->o;
  s->measured = 1;
  double tm = monotonic_seconds();
  /* every rank gets the same status, and every metric */
  stab_status ms = s->ttp ? train_tp_measure(s->ttp, s->mon, 1)
                   : s->world ? train_world_measure(s->world, s->mon, 1) : stab_monitor_measure(s->mon, 1);
  if (ms != STAB_OK) {
    cli_error("measure: %s", stab_last_error());
    return 1;
  }
  if (s->writer) check_alarms(s->mon, o, s->alarms, step + 1, lr, s->tty);
  if (means && step + 1 > o->steps - o->steps / 4) kind_means_add(means, s->mon);
  double act[512]; /* act_rms of each block, then act_cos1 of each (depth <= 256) */
  const double *act_rms = act, *act_cos1 = act + o->depth;
  for (size_t l = 0; l < o->depth; l++)
    block_stats(s->tensor ? model_tp_residual(&s->part, (int)l) : model_residual(&s->m, (int)l),
                (s->tensor ? s->B : s->nb) * s->T, o->width, &act[l], &act[o->depth + l]);
  /* the ranks' means over their rows, as means over the batch */
  if (s->dpw && train_world_mean(s->dpw, act, 2 * o->depth, s->B)) return 1;
  if (s->trace) {
    /* /step counts the steps done; the loss is that of the batch before this update. */
    const double scalars[2] = {s->loss, lr};
    for (size_t i = 0; i < stab_monitor_layer_count(s->mon); i++) {
      s->extras[2 * i] = s->blocks[i] >= 0 ? act_rms[s->blocks[i]] : NAN;
      s->extras[2 * i + 1] = s->blocks[i] >= 0 ? act_cos1[s->blocks[i]] : NAN;
    }
    int was_failed = stab_trace_failed(s->trace);
    stab_status ts = stab_trace_append(s->trace, (int64_t)(step + 1), monotonic_seconds() - s->t0, scalars,
                                       s->extras);
    *failed = trace_went(s->trace, ts, was_failed, o, s->tty, s->trace_path);
  }
  s->measure_time += monotonic_seconds() - tm;
  return 0;
}

/* --checkpoint-every: DIR/step-N.safetensors after step's update (the split model gathered
 * first, collectively). Every step the checkpoint holds is in the trace before the checkpoint
 * exists: a run killed after it and resumed from it leaves no gap in the trace. *failed: the
 * trace's flush or the checkpoint failed (this rank's). Returns 0, or 1 to stop. */
static int checkpoint_step(run_state *s, size_t step, int *failed) {
  if (s->tensor && gather_whole(&s->part, &s->m, &s->opt, s->whole_m, s->whole_v)) return 1;
  if (s->trace && !*failed) {
    int was_failed = stab_trace_failed(s->trace);
    *failed = trace_went(s->trace, stab_trace_flush(s->trace), was_failed, &s->o, s->tty, s->trace_path);
  }
  if (s->writer && !*failed) {
    char name[64];
    snprintf(name, sizeof name, "step-%06zu.safetensors", step + 1);
    *failed = checkpoint_save(&s->m, s->tensor ? s->whole_m : s->opt.m, s->tensor ? s->whole_v : s->opt.v, &s->o,
                              name, step + 1);
  }
  return 0;
}

/* The progress line after step (lr its rate): redrawn on a terminal, every_line steps
 * otherwise; the worst layers once measured. */
static void draw_progress(run_state *s, size_t step, double lr) {
  const options *o = &s->o;
  double t = monotonic_seconds(), el = t - s->t0;
  int last = step + 1 == o->steps;
  if (!((s->tty && (t - s->last_draw > 0.1 || last)) || (!s->tty && ((step + 1) % s->every_line == 0 || last))))
    return;
  char eta[32], worst_s[256] = "";
  fmt_time(eta, sizeof eta, el / (double)(step + 1 - s->start) * (double)(o->steps - step - 1));
  if (s->mon && s->measured) {
    const char *nf, *nd, *nu;
    double f = worst(s->mon, 0, &nf), dp = worst(s->mon, 1, &nd), u = worst(s->mon, 2, &nu);
    snprintf(worst_s, sizeof worst_s, " | max fwd %.3g %s, dep %.3g %s, upd %.3g %s", f, nf, dp, nd, u, nu);
  }
  fprintf(stderr, "%sstep %zu/%zu | loss %.4f | lr %.2e | %.0f tok/s%s | ETA %s%s", s->tty ? "\r\033[K" : "",
          step + 1, o->steps, s->loss, lr, (double)(step + 1 - s->start) * s->B * s->T / el, worst_s, eta,
          s->tty ? "" : "\n");
  s->last_draw = t;
}

/* One optimizer step: the batch's loss and gradients (summed across ranks), the monitor's
 * snapshot before the update and its measurement after, the trace's row, the checkpoint, the
 * progress line. Returns 0 to go on, or the exit status to stop with (every rank alike). */
static int train_step(run_state *s, size_t step, kind_means *means, run_result *res) {
  const options *o = &s->o;
  size_t B = s->B, T = s->T;
  int rc;
  double lr = lr_at(o, step);
  data_batch(s->data, &s->rng, 0, s->split, B, T, s->tok, s->tgt);
  s->loss = s->tensor ? model_tp_forward(&s->part, s->tok, s->tgt, B, T)
                      : model_forward(&s->m, s->tok + s->b0 * T, s->tgt + s->b0 * T, s->nb, T);
  /* the batch's loss, the same bits on every rank: all stop together when it is not finite */
  if (s->dpw && train_world_mean(s->dpw, &s->loss, 1, B)) return 1;
  if (step == s->start) s->first_loss = s->loss;
  if (!isfinite(s->loss)) {
    fputs(s->tty ? "\n" : "", stderr);
    cli_error("the loss is %g at step %zu: stopping", s->loss, step);
    if (res) res->diverged = 1, res->steps_done = step, res->first_loss = s->first_loss;
    return 1;
  }
  model_zero_grad(s->mine);
  if (s->tensor ? model_tp_backward(&s->part) : (model_backward(&s->m), 0)) return 1;
  if (s->dpw && train_world_sum_gradients(s->dpw, s->m.grads, s->m.n_params, B)) return 1;
  int measure = s->mon && (step + 1) % o->metrics_every == 0;
  double tm = monotonic_seconds();
  int failed = 0; /* this rank's; every rank learns it before the next collective */
  if (measure && (stab_monitor_snapshot(s->mon) != STAB_OK || (s->ttp && train_tp_snapshot(s->ttp) != STAB_OK))) {
    cli_error("snapshot: %s", stab_last_error());
    failed = 1;
  }
  if (measure && (rc = together(s->world, failed))) return rc;
  s->measure_time += monotonic_seconds() - tm;
  int st = optim_step(&s->opt, s->mine->params, s->mine->grads, (float)lr);
  if (st != STAB_OK) { /* every rank alike: the gradients are the same bits on every rank */
    fputs(s->tty ? "\n" : "", stderr);
    cli_error("optimizer step %zu: %s", step, stab_last_error());
    return 1;
  }
  if (measure && measure_step(s, step, lr, means, &failed)) return 1;
  int saving = o->checkpoint_every && (step + 1) % o->checkpoint_every == 0 && step + 1 < o->steps;
  if (saving && checkpoint_step(s, step, &failed)) return 1;
  /* the trace and the checkpoints are rank 0's: the others learn here how they went */
  if (((measure && o->out) || saving) && (rc = together(s->world, failed))) return rc;
  draw_progress(s, step, lr);
  return 0;
}

/* ---- the end of the run ---------------------------------------------------------- */

/* The held-out loss, the time, and with a monitor its last measurement (--print-metrics) and
 * where its time went, on stdout; res filled. */
static void report_run(run_state *s, run_result *res) {
  const options *o = &s->o;
  double elapsed = monotonic_seconds() - s->t0;
  if (s->tty) fputc('\n', stderr);
  double val = eval_loss(&s->m, s->tensor ? &s->part : NULL, s->dpw, s->data, s->split, s->data->n, s->B, s->b0,
                         s->nb, s->T, s->tok, s->tgt, 8);
  printf("loss: initial %.4f, final %.4f (train batch), held-out %.4f (%.3f bits/token)\n", s->first_loss, s->loss,
         val, val / log(2.0));
  if (res) res->steps_done = o->steps, res->first_loss = s->first_loss, res->final_loss = s->loss, res->heldout = val;
  printf("time: %.1f s for %zu steps (%.0f tokens/s), %.1f%% of it measuring\n", elapsed, o->steps - s->start,
         (double)(o->steps - s->start) * s->B * s->T / elapsed, 100.0 * s->measure_time / elapsed);
  stab_monitor *mon = s->mon;
  if (!mon || !s->measured) return;
  if (o->print_metrics) {
    printf("%-28s %-9s %10s %10s %10s %10s\n", "layer", "kind", "forward", "dependency", "update", "rel_update");
    for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
      const stab_metrics *x = stab_monitor_metrics(mon, i);
      const stab_layer *l = stab_monitor_layer(mon, i);
      printf("%-28s %-9s %10.4g %10.4g %10.4g %10.3g\n", l->name, stab_kind_name(l->kind), x->forward,
             x->dependency, x->update, x->rel_update);
    }
  }
  /* Where the measuring time goes: passes over the weights of the last measurement. */
  size_t pi = 0, ui = 0;
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    if (stab_monitor_metrics(mon, i)->passes > stab_monitor_metrics(mon, pi)->passes) pi = i;
    if (stab_monitor_metrics(mon, i)->update_passes > stab_monitor_metrics(mon, ui)->update_passes) ui = i;
  }
  printf("monitor: %zu layers, %.1f MB; last measurement: most passes %d (%s), most update "
         "passes %d (%s)\n", stab_monitor_layer_count(mon), stab_monitor_memory(mon) / 1e6,
         stab_monitor_metrics(mon, pi)->passes, stab_monitor_layer(mon, pi)->name,
         stab_monitor_metrics(mon, ui)->update_passes, stab_monitor_layer(mon, ui)->name);
}

/* Several ranks: their weights checked to be the same bits where they should be (collective),
 * and with --tensor-parallel, the whole model gathered for the last checkpoint. Returns 0, or
 * 1 to stop. */
static int check_ranks_alike(run_state *s) {
  const options *o = &s->o;
  size_t ranks = s->ranks;
  uint64_t hash;
  int differing;
  if (s->tensor) {
    /* The replicated tensors' gradients come from the same bits on every rank (the sums in rank
     * order), so their weights should be the same bits; checked, not assumed. */
    float *rep = malloc((model_tp_replicated(&s->part, s->part.local.params, NULL) + 1) * sizeof *rep);
    size_t n = rep ? model_tp_replicated(&s->part, s->part.local.params, rep) : 0;
    if (!rep) cli_error("out of memory");
    if (train_world_same_bits(s->world, rep, n * sizeof *rep, &hash, &differing) || !rep) {
      free(rep);
      return 1;
    }
    free(rep);
    if (differing >= 0) {
      cli_error("rank %d's replicated weights differ from rank 0's after step %zu", differing, o->steps);
      return 1;
    }
    printf("tensor parallel: %zu rank%s, the replicated weights the same on every rank (FNV-1a %016llx)\n", ranks,
           ranks == 1 ? "" : "s", (unsigned long long)hash);
    if (o->out && gather_whole(&s->part, &s->m, &s->opt, s->whole_m, s->whole_v)) return 1;
  } else if (s->world) {
    /* The sums in rank order should leave every rank the same weights; checked, not assumed
     * (a BLAS that picks other kernels on another node would break it). */
    if (train_world_same_bits(s->world, s->m.params, s->m.n_params * sizeof *s->m.params, &hash, &differing))
      return 1;
    if (differing >= 0) {
      cli_error("rank %d's weights differ from rank 0's after step %zu", differing, o->steps);
      return 1;
    }
    printf("data parallel: %zu rank%s, the same weights on every rank (FNV-1a %016llx)\n", ranks,
           ranks == 1 ? "" : "s", (unsigned long long)hash);
  }
  return 0;
}

/* The trace closed and the last checkpoint (DIR/model.safetensors) written, each said on
 * stdout. Returns this rank's failure (1) or 0. */
static int close_outputs(run_state *s) {
  const options *o = &s->o;
  int failed = 0;
  if (s->trace) {
    int64_t rows = stab_trace_steps(s->trace);
    int was_failed = stab_trace_failed(s->trace);
    stab_status ts = stab_trace_close(s->trace);
    s->trace = NULL;
    if (ts != STAB_OK && !was_failed) {
      cli_error("trace: %s", stab_last_error());
      failed = 1;
    } else {
      printf("trace: %s, %lld measured steps%s (read it with h5py, or h5dump -d /step %s)\n", s->trace_path,
             (long long)rows, was_failed ? " before a write failed" : "", s->trace_path);
    }
  }
  if (o->out && s->writer && !failed) {
    failed = checkpoint_save(&s->m, s->tensor ? s->whole_m : s->opt.m, s->tensor ? s->whole_v : s->opt.v, o,
                             "model.safetensors", o->steps);
    if (!failed) printf("checkpoint: %s/model.safetensors\n", o->out);
  }
  return failed;
}

/* Everything the run holds, freed (collective with --tensor-parallel: every rank gets here). */
static void release(run_state *s) {
  if (s->trace && stab_trace_close(s->trace) != STAB_OK) cli_error("trace: %s", stab_last_error());
  free(s->blocks);
  free(s->extras);
  free(s->alarms);
  train_tp_free(s->ttp); /* collective: every rank reaches here, with its handle or none */
  stab_monitor_free(s->mon);
  optim_free(&s->opt);
  model_tp_free(&s->part);
  free(s->whole_m), free(s->whole_v);
  model_free(&s->m);
  free(s->tok), free(s->tgt);
}

/* ---- the run --------------------------------------------------------------------- */

int train_run(const options *opts, const data_set *data, kind_means *means, run_result *res, train_world *world) {
  run_state state = {0}, *s = &state;
  s->o = *opts, s->data = data, s->world = world;
  const options *o = &s->o;
  if (res) *res = (run_result){.first_loss = NAN, .final_loss = NAN, .heldout = NAN};
  s->split = data->n - data->n / 10, s->B = o->batch, s->T = o->context;
  s->b0 = 0, s->nb = s->B, s->ranks = world ? (size_t)train_world_size(world) : 1;
  s->writer = !world || train_world_rank(world) == 0, s->tensor = o->tensor_parallel > 0;
  s->dpw = s->tensor ? NULL : world;
  s->mine = &s->m;
  if (s->dpw) train_world_split(s->dpw, s->B, &s->b0, &s->nb);
  int rc = check_input(s);
  if ((rc = together(world, rc))) return rc;
  model_config mc = {.vocab = data->vocab, .width = o->width, .depth = o->depth, .heads = o->heads,
                     .context = s->T, .biases = o->biases, .untied = o->untied, .attn_inverse = o->attn_inverse};
  s->tok = malloc(s->B * s->T * sizeof *s->tok), s->tgt = malloc(s->B * s->T * sizeof *s->tgt);
  /* the split model's activations are its own: m's are not needed then */
  if ((rc = model_create(&s->m, &mc)) || (!s->tensor && model_reserve(&s->m, s->nb, s->T)) || !s->tok || !s->tgt) {
    cli_error("%s", rc == -1 ? "bad model shape" : "out of memory for the model");
    rc = 1;
  }
  if ((rc = together(world, rc))) {
    free(s->tok), free(s->tgt), model_free(&s->m);
    return rc;
  }
  /* Until the setup's end a failure is this rank's alone: there every rank learns it. */
  rc = setup_model(s);
  if (!rc && s->tensor) {
    /* collective: every rank gets here, each with its monitor (or none: --metrics-every 0) */
    stab_monitor_params mp = stab_monitor_default_params();
    if ((rc = together(world, 0)) || (s->mon && (rc = train_tp_create(world, &s->part, &s->m, s->mon, &mp, &s->ttp))))
      goto out;
  }
  if (!rc) rc = setup_outputs(s);
  if ((rc = together(world, rc))) goto out;
  if (o->resume && world && (rc = same_checkpoint_everywhere(s))) goto out;
  s->tty = isatty(STDERR_FILENO);
  s->every_line = o->steps / 20 ? o->steps / 20 : 1;
  s->rng = (data_rng){o->seed * 0x9e3779b97f4a7c15ull + 7};
  s->t0 = monotonic_seconds(), s->last_draw = 0, s->first_loss = NAN, s->loss = NAN, s->measure_time = 0;
  for (size_t step = 0; step < s->start; step++) /* the batches of the steps already taken */
    data_batch(data, &s->rng, 0, s->split, s->B, s->T, s->tok, s->tgt);
  for (size_t step = s->start; step < o->steps; step++)
    if ((rc = train_step(s, step, means, res))) goto out;
  report_run(s, res);
  if ((rc = check_ranks_alike(s))) goto out;
  rc = together(world, close_outputs(s));
out:
  release(s);
  return rc;
}
