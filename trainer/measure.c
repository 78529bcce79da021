/* measure.c — what the trainer measures besides the loss: every layer registered with the
 * monitor, the worst layers for the progress line, the alarms, the residual stream's per-block
 * statistics, the trace's run_config, and the per-kind means a width sweep compares.
 * Harness code: messages on stderr through cli.h. */
#include "measure.h"

#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Registers every layer of the model: wte and wpe (embedding), per block ln_1 and ln_2
 * (gain), the fused attn.c_attn as three linear layers attn.c_attn.q, .k and .v (D x D each,
 * its rows of the fused matrix and its third of the bias), the attention logits of the q and k
 * blocks, attn.c_proj, mlp.c_fc, mlp.c_proj (linear, with biases), ln_f (gain), lm_head (the
 * wte table when tied). Layer names are the tensor names without ".weight", the fused
 * tensor's parts with .q, .k, .v: the names stabmeter-probe gives the trainer's checkpoint
 * (docs/manual/metrics.md, one policy for a fused q/k/v everywhere). */
int register_layers(stab_monitor *mon, model *m, int external) {
  size_t D = m->c.width;
  char nm[96];
  stab_status st = STAB_OK;
  /* external: every layer whole, its metrics set from the ranks' measurements (train_tp.h);
   * the pointers, into the whole model's buffer, are not read but say which layers share
   * storage, as in one process's trace */
#define ADD(...)                                                                           \
  do {                                                                                     \
    stab_layer l_ = {__VA_ARGS__};                                                         \
    st = external ? stab_monitor_add_external(mon, &l_, NULL) : stab_monitor_add_layer(mon, &l_, NULL); \
    if (st != STAB_OK) goto fail;                                                          \
  } while (0)
  ADD(.name = "transformer.wte", .kind = STAB_KIND_EMBEDDING, .vocab = m->c.vocab, .width = D,
      .weight = model_wte(m, m->params));
  ADD(.name = "transformer.wpe", .kind = STAB_KIND_EMBEDDING, .vocab = m->c.context, .width = D,
      .weight = model_wpe(m, m->params));
  for (size_t l = 0; l < m->c.depth; l++) {
    model_block w = model_block_at(m, m->params, l);
#define NAME(s) (snprintf(nm, sizeof nm, "transformer.h.%zu.%s", l, s), nm)
    ADD(.name = NAME("ln_1"), .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = w.ln1w);
    static const char *const qkv[3] = {"attn.c_attn.q", "attn.c_attn.k", "attn.c_attn.v"};
    for (size_t j = 0; j < 3; j++) /* q rows 0..D-1 of qkvw (3D, D), k rows D..2D-1, v 2D..3D-1 */
      ADD(.name = NAME(qkv[j]), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D, .weight = w.qkvw + j * D * D,
          .bias = w.qkvb ? w.qkvb + j * D : NULL);
    ADD(.name = NAME("attn.logits"), .kind = STAB_KIND_ATTENTION, .d_in = D, .d_out = D,
        .heads = m->c.heads, .scale = model_attn_scale(&m->c), .weight = w.qkvw,
        .weight_k = w.qkvw + D * D);
    ADD(.name = NAME("attn.c_proj"), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = D,
        .weight = w.attprojw, .bias = w.attprojb);
    ADD(.name = NAME("ln_2"), .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D, .weight = w.ln2w);
    ADD(.name = NAME("mlp.c_fc"), .kind = STAB_KIND_LINEAR, .d_in = D, .d_out = 4 * D,
        .weight = w.fcw, .bias = w.fcb);
    ADD(.name = NAME("mlp.c_proj"), .kind = STAB_KIND_LINEAR, .d_in = 4 * D, .d_out = D,
        .weight = w.fcprojw, .bias = w.fcprojb);
#undef NAME
  }
  ADD(.name = "transformer.ln_f", .kind = STAB_KIND_GAIN, .d_in = D, .d_out = D,
      .weight = model_lnf(m, m->params));
  ADD(.name = "lm_head", .kind = STAB_KIND_LM_HEAD, .vocab = m->c.vocab, .width = D,
      .weight = model_head(m, m->params));
#undef ADD
  return 0;
fail:
  fprintf(stderr, "train: registering a layer with the monitor: %s (%s)\n", stab_last_error(),
          stab_strerror(st));
  return 1;
}

/* The largest of one metric over the layers (0 forward, 1 dependency, 2 update), and
 * where: the LM head is left out of forward and dependency (its headline values hold
 * log V and 2 d R, a different scale). A NaN from non-finite weights wins. */
double worst(const stab_monitor *mon, int which, const char **name) {
  double best = -INFINITY;
  *name = "-";
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_layer *l = stab_monitor_layer(mon, i);
    const stab_metrics *x = stab_monitor_metrics(mon, i);
    if (which < 2 && l->kind == STAB_KIND_LM_HEAD) continue;
    double v = which == 0 ? x->forward : which == 1 ? x->dependency : x->update;
    int broken = x->flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE);
    if ((isnan(v) && broken) || v > best) {
      best = isnan(v) ? INFINITY : v;
      *name = l->name + (strncmp(l->name, "transformer.", 12) ? 0 : 12);
      if (isnan(v)) return NAN;
    }
  }
  return best;
}


/* Reports, once per layer: non-finite weights or update (always); with --alarm X, a forward,
 * dependency or update stability more than X times the layer's reference (the monitor's: its
 * first finite value > 0), or turned non-finite, whatever the kind, its natural scale being
 * the reference's; with --alarm-limit KIND=X, a forward or dependency stability above X. The
 * update is judged per unit of learning rate: it grows with the rate through warmup, and an
 * alarm there would fire on every layer of a healthy run. lr: this step's. */
void check_alarms(const stab_monitor *mon, const options *o, layer_alarm *la, size_t step, double lr,
                         int tty) {
  static const char *const metric[3] = {"forward", "dependency", "update"};
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_layer *l = stab_monitor_layer(mon, i);
    const stab_metrics *x = stab_monitor_metrics(mon, i), *ref = stab_monitor_reference(mon, i);
    layer_alarm *a = &la[i];
    if (isnan(a->ref_lr) && !isnan(ref->update)) a->ref_lr = lr; /* taken at this measurement */
    const char *kind = stab_kind_name(l->kind);
    const double value[3] = {x->forward, x->dependency, x->update}, base[3] = {ref->forward, ref->dependency, ref->update};
    if (!(a->said & SAID_RELATIVE)) {
      char what[320] = "";
      if (x->flags & (STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE))
        snprintf(what, sizeof what, "has non-finite weights or update: forward %.4g, dependency %.4g, update %.4g",
                 x->forward, x->dependency, x->update);
      for (int j = 0; j < 3 && !what[0] && o->alarm > 0; j++) {
        if (isnan(base[j])) continue; /* no reference yet: the metric is not defined, or not seen > 0 */
        if (!isfinite(value[j]))
          snprintf(what, sizeof what, "%s turned %g (its reference %.6g)", metric[j], value[j], base[j]);
        else if (j < 2 && value[j] / base[j] > o->alarm)
          snprintf(what, sizeof what, "%s %.6g is %.6g times its reference %.6g (--alarm %g)", metric[j], value[j],
                   value[j] / base[j], base[j], o->alarm);
        else if (j == 2 && (value[j] / lr) / (base[j] / a->ref_lr) > o->alarm)
          snprintf(what, sizeof what, "update %.6g at lr %.4g is %.6g times its reference %.6g at lr %.4g, per unit "
                   "of learning rate (--alarm %g)", value[j], lr, (value[j] / lr) / (base[j] / a->ref_lr), base[j],
                   a->ref_lr, o->alarm);
      }
      if (what[0]) {
        a->said |= SAID_RELATIVE;
        fputs(tty ? "\r\033[K" : "", stderr);
        cli_error("alarm at step %zu: %s (%s) %s", step, l->name, kind, what);
      }
    }
    const double limit = o->alarm_limit[l->kind];
    for (int j = 0; j < 2 && limit > 0 && !(a->said & SAID_LIMIT); j++)
      if (value[j] > limit) {
        a->said |= SAID_LIMIT;
        fputs(tty ? "\r\033[K" : "", stderr);
        cli_error("alarm at step %zu: %s (%s) %s %.6g exceeds --alarm-limit %s=%g", step, l->name, kind, metric[j],
                  value[j], kind, limit);
      }
  }
}

/* Per block: RMS of the residual stream after it and |cos(h, 1)|, averaged over positions
 * (the RMSNorm article's mean-drift signal). */
void block_stats(const float *h, size_t N, size_t D, double *rms, double *cos1) {
  double r = 0, c = 0;
  for (size_t i = 0; i < N; i++) {
    double ss = 0, s = 0;
    for (size_t d = 0; d < D; d++) ss += (double)h[i * D + d] * h[i * D + d], s += h[i * D + d];
    r += sqrt(ss / (double)D);
    c += ss > 0 ? fabs(s) / sqrt(ss * (double)D) : 0;
  }
  *rms = r / (double)N, *cos1 = c / (double)N;
}

/* ---- trace ----------------------------------------------------------------------- */

/* The block a monitor layer belongs to ("transformer.h.<l>."), or -1 (embedding, final norm,
 * head): its rows of act_rms and act_cos1 come from that block's residual stream. */
long layer_block(const char *name) {
  size_t l;
  int n = 0;
  if (sscanf(name, "transformer.h.%zu.%n", &l, &n) == 1 && n > 0) return (long)l;
  return -1;
}

/* The run's settings as the trace's run_config attribute (JSON), with the parallel layout: ranks
 * in all, how many hold a replica (data parallel) and how many share each layer (tensor
 * parallel): 1, 1, 1 for one process. */
void run_config(char *buf, size_t n, const options *o, const model *m, int ranks) {
  int tp = o->tensor_parallel ? ranks : 1, dp = o->tensor_parallel ? 1 : ranks;
  snprintf(buf, n,
           "{\"program\": \"stabmeter train\", \"model\": {\"vocab\": %zu, \"width\": %zu, "
           "\"depth\": %zu, \"heads\": %zu, \"context\": %zu, \"biases\": %s, \"tied\": %s, "
           "\"parameters\": %zu, \"attn_scale\": \"%s\"}, \"optimizer\": \"%s\", \"lr\": %g, \"warmup\": %zu, "
           "\"min_lr_frac\": %g, \"batch\": %zu, \"steps\": %zu, \"seed\": %llu, "
           "\"metrics_every\": %zu, \"data\": \"%s\", \"ranks\": %d, \"data_parallel\": %d, "
           "\"tensor_parallel\": %d}",
           m->c.vocab, o->width, o->depth, o->heads, o->context, o->biases ? "true" : "false",
           o->untied ? "false" : "true", m->n_params, m->c.attn_inverse ? "inverse" : "sqrt",
           o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest", o->lr, o->warmup, o->min_lr_frac,
           o->batch, o->steps, (unsigned long long)o->seed, o->metrics_every,
           o->data ? "file" : "built-in", ranks, dp, tp);
}

void kind_means_add(kind_means *k, const stab_monitor *mon) {
  for (size_t i = 0; i < stab_monitor_layer_count(mon); i++) {
    const stab_metrics *x = stab_monitor_metrics(mon, i);
    int kind = (int)stab_monitor_layer(mon, i)->kind;
    const double v[3] = {x->forward, x->dependency, x->update};
    for (int j = 0; j < 3; j++)
      if (kind >= 0 && kind < N_KINDS && isfinite(v[j]) && v[j] > 0)
        k->log_sum[kind][j] += log(v[j]), k->count[kind][j]++;
  }
}

double kind_mean(const kind_means *k, int kind, int metric) {
  return k->count[kind][metric] ? exp(k->log_sum[kind][metric] / (double)k->count[kind][metric])
                                : NAN;
}
