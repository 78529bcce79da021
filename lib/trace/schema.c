/* schema.c — what a trace holds, by name and in words: the metric datasets in file order and
 * their ratios, the datasets along the layer dimension, the names a caller may declare, each
 * dataset's units and long_name (docs/manual/trace.md) and every dataset's chunk shape. No HDF5
 * call here: create.c writes what this file says, open.c and migrate.c check it. */
#define _GNU_SOURCE /* qsort_r */
#include "trace/trace_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The stab_metrics fields every layer records, in file order. */

const char *const stabi_trace_metric_names[N_METRICS] = {
    "forward",       "dependency",    "update",         "forward_tight",
    "dependency_tight", "update_tight", "spread",        "sigma",
    "sigma_rel_err", "sigma_update",  "sigma_update_rel_err", "rel_update",
    "passes",        "update_passes", "flags"};

/* The metrics a layer's ratio to its reference is recorded for (stab_monitor_reference), in
 * file order after the metrics; metric j's ratio is stabi_trace_ratio_names[j], j < N_RATIOS
 * being the first metrics of stabi_trace_metric_names. */

const char *const stabi_trace_ratio_names[N_RATIOS] = {"forward_ratio", "dependency_ratio", "update_ratio"};

/* The reference's value of metric j < N_RATIOS. */
double *stabi_trace_reference_field(stab_metrics *r, size_t j) {
  return j == 0 ? &r->forward : j == 1 ? &r->dependency : &r->update;
}

double stabi_trace_reference_value(const stab_metrics *r, size_t j) {
  return j == 0 ? r->forward : j == 1 ? r->dependency : r->update;
}

/* value over reference: NaN where either is NaN (and where no reference was seen yet). */
double stabi_trace_ratio_of(double value, double reference) {
  return isnan(value) || isnan(reference) ? NAN : value / reference;
}

void stabi_trace_metric_values(const stab_metrics *m, double *v) {
  v[0] = m->forward;
  v[1] = m->dependency;
  v[2] = m->update;
  v[3] = m->forward_tight;
  v[4] = m->dependency_tight;
  v[5] = m->update_tight;
  v[6] = m->spread;
  v[7] = m->sigma;
  v[8] = m->sigma_rel_err;
  v[9] = m->sigma_update;
  v[10] = m->sigma_update_rel_err;
  v[11] = m->rel_update;
  v[12] = m->passes;
  v[13] = m->update_passes;
  v[14] = m->flags;
}

/* ---- what each dataset means, in words ------------------------------------------------- */

/* The units and long_name attributes of every dataset the library knows (CF conventions: "1" is
 * dimensionless; the LM head's values bound a loss, in nats), after docs/manual/metrics.md. The first
 * row whose name matches and whose kind is the layer's, or ANY, applies; kind-specific rows
 * come first. A dataset with a declared name this table lacks (a scalar or a layer extra the
 * trainer made up) gets its name as long_name and no units: we do not know them. */

static const wording words[] = {
    {"step", NOT_LAYER, "1", "optimizer step"},
    {"wall_time", NOT_LAYER, "s", "seconds since the run began"},
    {"loss", NOT_LAYER, "nats", "training loss (mean cross-entropy of the batch)"},
    {"lr", NOT_LAYER, "1", "learning rate"},
    {"grad_norm", NOT_LAYER, "1", "gradient norm"},
    {"forward", STAB_KIND_LINEAR, "1", "forward stability: max ||x W + b||_RMS over ||x||_RMS = 1 "
                                       "(sqrt(d_in/d_out) sigma(W) + ||b||_RMS)"},
    {"forward", STAB_KIND_EMBEDDING, "1", "forward stability: max_i ||E_i||_RMS, the largest row RMS of the table"},
    {"forward", STAB_KIND_LM_HEAD, "nats", "forward stability: bound on the loss, log V + 2 d R, R = max_i ||w_i||_RMS"},
    {"forward", STAB_KIND_GAIN, "1", "forward stability: max_i |gamma_i|"},
    {"forward", STAB_KIND_BIAS, "1", "forward stability: ||b||_RMS"},
    {"forward", STAB_KIND_ATTENTION, "1", "attention logit bound: max over heads of s d_h F_q F_k, bounding |s <q, k>| "
                                          "over ||x||_RMS = 1 (q and k biases not included)"},
    {"dependency", STAB_KIND_LINEAR, "1", "dependency stability: Lipschitz constant sqrt(d_in/d_out) sigma(W)"},
    {"dependency", STAB_KIND_LM_HEAD, "nats", "dependency stability: 2 d R, the loss's Lipschitz bound in x"},
    {"dependency", STAB_KIND_GAIN, "1", "dependency stability: max_i |gamma_i|"},
    {"dependency", ANY, "1", "dependency stability: not defined for this kind (NaN)"},
    {"update", STAB_KIND_LINEAR, "1", "update stability: max ||x dW + db||_RMS over ||x||_RMS = 1 "
                                      "(sqrt(d_in/d_out) sigma(dW) + ||db||_RMS)"},
    {"update", STAB_KIND_EMBEDDING, "1", "update stability: max_i ||dE_i||_RMS"},
    {"update", STAB_KIND_LM_HEAD, "nats", "update stability: 2 d dR, bound on the loss's change"},
    {"update", STAB_KIND_GAIN, "1", "update stability: max_i |dgamma_i|"},
    {"update", STAB_KIND_BIAS, "1", "update stability: ||db||_RMS"},
    {"update", ANY, "1", "update stability: not defined for this kind (NaN)"},
    {"forward_tight", STAB_KIND_LM_HEAD, "nats", "tighter forward bound: log V + d Dm, Dm the class vectors' RMS diameter"},
    {"dependency_tight", STAB_KIND_LM_HEAD, "nats", "tighter dependency bound: d Dm"},
    {"update_tight", STAB_KIND_LM_HEAD, "nats", "tighter update bound: d dDm"},
    {"forward_tight", ANY, "1", "tighter forward bound: lm_head only (NaN)"},
    {"dependency_tight", ANY, "1", "tighter dependency bound: lm_head only (NaN)"},
    {"update_tight", ANY, "1", "tighter update bound: lm_head only (NaN)"},
    {"spread", STAB_KIND_EMBEDDING, "1", "spread: max_{i,j} ||E_i - E_j||_RMS (an upper bound)"},
    {"spread", STAB_KIND_LM_HEAD, "nats", "spread: 4 d R, the earlier revision's dependency bound over two labels"},
    {"spread", ANY, "1", "spread: embedding and lm_head only (NaN)"},
    {"sigma", STAB_KIND_LINEAR, "1", "sigma(W), the weight's largest singular value (estimate, a lower bound)"},
    {"sigma", ANY, "1", "sigma(W): linear only (NaN)"},
    {"sigma_rel_err", ANY, "1", "estimated relative error of sigma"},
    {"sigma_update", STAB_KIND_LINEAR, "1", "sigma(dW), the update's largest singular value (estimate)"},
    {"sigma_update", ANY, "1", "sigma(dW): linear only (NaN)"},
    {"sigma_update_rel_err", ANY, "1", "estimated relative error of sigma_update"},
    {"rel_update", ANY, "1", "relative update ||dW||_F / ||W||_F, weights after the step, bias included"},
    {"passes", ANY, "1", "count of passes over the weights by the spectral estimates"},
    {"update_passes", ANY, "1", "count of passes over the update by its spectral estimate"},
    {"flags", ANY, "1", "bit flags: 1 non-finite weight, 2 non-finite update, 4 spectral estimate not converged"},
    {"forward_ratio", ANY, "1", "forward stability over its value at the first measured step where it was finite "
                                "and > 0 (ratio to init)"},
    {"dependency_ratio", ANY, "1", "dependency stability over its value at the first measured step where it was "
                                   "finite and > 0 (ratio to init)"},
    {"update_ratio", ANY, "1", "update stability over its value at the first measured step where it was finite "
                               "and > 0 (ratio to init)"},
    {"act_rms", ANY, "1", "RMS of the hidden state (residual stream) of this layer's block"},
    {"act_cos1", ANY, "1", "|cos(h, 1)|: the hidden state's angle to the all-ones vector (mean drift)"},
    /* head<h>_bound, looked up under this name */
    {"head_bound", STAB_KIND_ATTENTION, "1", "logit bound of one head: s d_h F_q,h F_k,h, bounding |s <q_h, k_h>|"},
};

/* The wording of dataset `name` of a layer of `kind` (NOT_LAYER: /step, /wall_time, /scalars);
 * NULL when unknown. */
const wording *stabi_trace_wording_of(const char *name, int kind) {
  for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
    const wording *w = &words[i];
    if (strcmp(w->name, name) != 0) continue;
    if (w->kind == kind || (w->kind == ANY && kind != NOT_LAYER)) return w;
  }
  return NULL;
}

/* The description attribute of a layer's group: its kind and stored shape in words, from the
 * storage the monitor resolved (sh), so that it says what the numbers were computed from. */
void stabi_trace_describe_layer(const stab_layer *l, const stabi_shape *sh, char *buf, size_t len) {
  const int out_major = l->layout != STAB_LAYOUT_IN_MAJOR;
  const size_t d_in = out_major ? sh->cols : sh->rows, d_out = out_major ? sh->rows : sh->cols;
  char stride[64] = "";
  if (sh->ld != sh->cols) snprintf(stride, sizeof stride, ", rows %zu floats apart (ld)", sh->ld);
  switch (l->kind) {
  case STAB_KIND_LINEAR:
    snprintf(buf, len, "linear layer y = x W%s, d_in %zu -> d_out %zu, stored %s%s; %s", l->bias ? " + b" : "", d_in,
             d_out, out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride,
             l->bias ? "with a bias of length d_out" : "no bias");
    return;
  case STAB_KIND_ATTENTION:
    if (sh->kv_heads && sh->kv_heads != sh->heads) /* grouped-query: k is narrower */
      snprintf(buf, len, "attention logits s <q, k> of %zu heads of width %zu sharing %zu key heads, q = x W_q and "
               "k = x W_k, d_in %zu -> d_out %zu (q) and %zu (k), stored %s%s; q and k biases are outside the bound",
               sh->heads, sh->dh, sh->kv_heads, d_in, d_out, sh->kv_heads * sh->dh,
               out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride);
    else
      snprintf(buf, len, "attention logits s <q, k> of %zu heads of width %zu, q = x W_q and k = x W_k, "
               "d_in %zu -> d_out %zu each, stored %s%s; q and k biases are outside the bound", sh->heads, sh->dh,
               d_in, d_out, out_major ? "out-major [d_out][d_in]" : "in-major [d_in][d_out]", stride);
    return;
  case STAB_KIND_EMBEDDING:
    snprintf(buf, len, "embedding table E, V %zu ids (tokens or positions) of width d %zu, stored %s%s", sh->items_are_rows ? sh->rows : sh->cols,
             sh->items_are_rows ? sh->cols : sh->rows,
             sh->items_are_rows ? "[V][d], one row per id" : "[d][V], one column per id", stride);
    return;
  case STAB_KIND_LM_HEAD:
    snprintf(buf, len, "LM head, V %zu classes of width d %zu (loss logsumexp_i <x, w_i - w_t>), stored %s%s",
             sh->items_are_rows ? sh->rows : sh->cols, sh->items_are_rows ? sh->cols : sh->rows,
             sh->items_are_rows ? "[V][d], one row per class" : "[d][V], one column per class", stride);
    return;
  case STAB_KIND_GAIN:
    snprintf(buf, len, "RMSNorm or LayerNorm gain gamma of length d %zu (the square linear layer diag(gamma))", sh->cols);
    return;
  case STAB_KIND_BIAS:
    snprintf(buf, len, "bias vector of length d %zu with no weight to pair with", sh->cols);
    return;
  }
  snprintf(buf, len, "layer of kind %d", (int)l->kind);
}

/* ---- names ----------------------------------------------------------------------------- */

/* A layer's group name: '/' is HDF5's path separator, so it becomes '.'. */
char *stabi_trace_group_name(const char *name) {
  size_t n = strlen(name) + 1;
  char *g = malloc(n);
  if (!g) return NULL;
  for (size_t i = 0; i < n; i++) g[i] = name[i] == '/' ? '.' : name[i];
  return g;
}

const char *stabi_trace_layout_name(const stab_layer *l) {
  switch (l->kind) {
  case STAB_KIND_LINEAR:
  case STAB_KIND_ATTENTION: return l->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "out_major";
  case STAB_KIND_EMBEDDING: return l->layout == STAB_LAYOUT_OUT_MAJOR ? "out_major" : "rows";
  case STAB_KIND_LM_HEAD: return l->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "rows";
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS: break;
  }
  return "rows";
}

int64_t stabi_trace_param_count(const stab_layer *l) {
  int64_t io = (int64_t)l->d_in * (int64_t)l->d_out;
  switch (l->kind) {
  case STAB_KIND_LINEAR: return io + (l->bias ? (int64_t)l->d_out : 0);
  case STAB_KIND_ATTENTION: /* q, and k of kv_heads heads of the same width */
    return io + (int64_t)l->d_in * (int64_t)(l->d_out / (l->heads ? l->heads : 1) * (l->kv_heads ? l->kv_heads : l->heads));
  case STAB_KIND_EMBEDDING:
  case STAB_KIND_LM_HEAD: return io;
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS: break;
  }
  return (int64_t)l->d_in;
}

/* Heads of layer l whose bounds the trace records. */
size_t stabi_trace_layer_heads(const stab_layer *l) { return l->kind == STAB_KIND_ATTENTION ? l->heads : 0; }

/* The datasets of /layers along the layer dimension (format 4), written once at creation:
 * layer (the names, the dimension's scale), then what format 3 kept in each layer's attributes.
 * The first STATIC_STRINGS hold strings, the others int64. With heads, head (each head's number
 * in its layer, the scale of the head dimension) and head_layer (its layer's name). */

const char *const stabi_trace_static_names[N_STATIC] = {"layer", "kind", "layout", "description", "shares_storage_with",
                                                        "d_in", "d_out", "param_count", "param_count_unique"};
const char *const stabi_trace_head_names[2] = {"head", "head_layer"};

/* The name of the per-layer dataset of cols[k] (k >= first_metric, not head_bound). */
const char *stabi_trace_column_name(const stab_trace *t, size_t k, const char *const *extras) {
  k -= t->first_metric;
  if (k < N_METRICS) return stabi_trace_metric_names[k];
  if (k < N_METRICS + N_RATIOS) return stabi_trace_ratio_names[k - N_METRICS];
  return extras[k - (t->first_extra - t->first_metric)];
}

/* A declared name is one link name: not empty, no '/', not "." and unique in its list. */
stab_status stabi_trace_check_names(const char *who, const char *what, const char *const *names,
                                    size_t n, int not_metric) {
  if (n && !names) return stabi_fail(STAB_EINVAL, "%s: %s is NULL but its count is %zu", who, what, n);
  for (size_t i = 0; i < n; i++) {
    const char *s = names[i];
    if (!s || !s[0]) return stabi_fail(STAB_EINVAL, "%s: %s[%zu] is empty", who, what, i);
    if (strchr(s, '/') || strcmp(s, ".") == 0)
      return stabi_fail(STAB_EINVAL, "%s: %s[%zu] '%s' is not a valid dataset name", who, what, i, s);
    if (strcmp(s, "step") == 0) /* every group links /step under that name */
      return stabi_fail(STAB_EINVAL, "%s: %s[%zu] 'step' is taken: each group holds /step under that name", who,
                        what, i);
    for (size_t j = 0; j < i; j++)
      if (strcmp(names[j], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is declared twice", who, what, s);
    if (!not_metric) continue;
    for (size_t k = 0; k < N_METRICS; k++)
      if (strcmp(stabi_trace_metric_names[k], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is the name of a metric", who, what, s);
    for (size_t k = 0; k < N_RATIOS; k++)
      if (strcmp(stabi_trace_ratio_names[k], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is the name of a metric's ratio", who, what, s);
    if (strncmp(s, "head", 4) == 0 && strstr(s, "_bound"))
      return stabi_fail(STAB_EINVAL, "%s: %s '%s' may clash with an attention head's dataset", who, what, s);
    for (size_t k = 0; k < N_STATIC + 2; k++)
      if (strcmp(k < N_STATIC ? stabi_trace_static_names[k] : stabi_trace_head_names[k - N_STATIC], s) == 0)
        return stabi_fail(STAB_EINVAL, "%s: %s '%s' is taken: /layers/%s describes the layers", who, what, s, s);
  }
  return STAB_OK;
}

static int name_order(const void *a, const void *b, void *names) {
  char *const *g = names;
  const size_t i = *(const size_t *)a, j = *(const size_t *)b;
  int c = strcmp(g[i], g[j]);
  return c ? c : (i > j) - (i < j);
}

/* Two layers whose names become the same layer name in the trace ('/' read as '.') are
 * refused, naming both in the monitor's order. Sorted, so that it costs n log n comparisons
 * (a pass over every pair took seconds at 20,000 layers). */
stab_status stabi_trace_check_unique(const char *who, const stab_monitor *m, char *const *gnames, size_t n) {
  if (n < 2) return STAB_OK;
  size_t *order = malloc(n * sizeof *order);
  if (!order) return stabi_fail(STAB_ENOMEM, "%s: out of memory", who);
  for (size_t i = 0; i < n; i++) order[i] = i;
  qsort_r(order, n, sizeof *order, name_order, (void *)gnames);
  stab_status st = STAB_OK;
  for (size_t k = 1; k < n && st == STAB_OK; k++)
    if (strcmp(gnames[order[k - 1]], gnames[order[k]]) == 0)
      st = stabi_fail(STAB_EEXIST, "%s: layers '%s' and '%s' would both be the trace's layer '%s' (a '/' is read as '.')", who,
                      stab_monitor_layer(m, order[k - 1])->name, stab_monitor_layer(m, order[k])->name, gnames[order[k]]);
  free(order);
  return st;
}

/* ---- chunks ---------------------------------------------------------------------------- */

/* The chunk of a dataset of `width` values a row: rows x values (see CHUNK_VALUES). */
void stabi_trace_chunk_of(size_t width, size_t *rows, size_t *values) {
  size_t c = width < CHUNK_LAYERS ? width : CHUNK_LAYERS, r = CHUNK_ROWS;
  if (c == 0) c = 1;
  while (r > 1 && r * c > CHUNK_VALUES) r /= 2;
  *rows = r, *values = c;
}
