/* probe_internal.h — what the probe's files share (probe.c opens and describes, measure.c
 * measures and writes the trace, report.c writes the report): the checkpoint (a handle,
 * lib/checkpoint/checkpoint.c), the rows, and the probe itself. probe.c calls into measure.c
 * (the rows' work, the layers of experts), never the reverse. Never installed. */
#ifndef STABMETER_PROBE_INTERNAL_H
#define STABMETER_PROBE_INTERNAL_H

#include "metrics/metrics.h"
#include "checkpoint/checkpoint_internal.h"
#include "model/model_internal.h"

#include <stdint.h>

#define MAX_HEADS STAB_MODEL_MAX_HEADS

/* A checkpoint as the probe holds it: the handle (any format, every file of it), and what the
 * probe reads beside it. */
typedef struct {
  stab_checkpoint *ck;
  stab_shard_index *siblings; /* ck is one safetensors shard of the model this index describes,
                                 or NULL */
  stab_hf_config cfg;         /* config.json of the model's directory (all 0 / -1: none) */
} stabi_probe_ckpt;

/* The metrics a layer of experts reports as its worst expert's, in row.worst's order. */
enum { EXPERT_FORWARD, EXPERT_DEPENDENCY, EXPERT_UPDATE, EXPERT_SIGMA, EXPERT_REL_UPDATE, N_EXPERT_METRICS };

/* One row of the report: an entry of the model (a layer to measure, or a tensor not measured,
 * error set) and what the probe measured of it. */
typedef struct {
  const stab_model_entry *e;  /* the model's entry the row is */
  const stab_ckpt_tensor *t, *bias;
  const stab_ckpt_tensor *tk; /* attention: the key projection (t is the query) */
  const stab_ckpt_tensor *prev_t, *prev_bias; /* with a reference: what the update is against, or NULL */
  const char *no_update; /* with a reference: why it has no counterpart (static), or NULL */
  char *owned_no_update;  /* or owned (a counterpart name the message gives) */
  /* a reference across formats (find_converted): how prev_t is read into t's own order */
  size_t prev_heads;      /* q/k rows permuted by the converter, in that many heads; 0: none */
  int prev_to_gguf;       /* 1: t is the GGUF tensor (HF rows put in its order), 0: the reverse */
  int prev_transposed;    /* prev_t is t's transpose (an HF GPT-2 Conv1D weight) */
  float prev_offset;      /* added to prev_t's values (Gemma's norms: llama.cpp stores w + 1) */
  const char *name;           /* the row's name (the model's) */
  size_t heads;               /* attention */
  size_t kv_heads;            /* attention: key heads (fewer than heads: grouped-query) */
  size_t ld, q_off, k_off;    /* attention: row stride and where q and k start inside t, tk
                                 (a fused qkv tensor holds both); ld also a linear part's */
  size_t offset, bias_offset; /* linear: where a fused q/k/v part starts inside t and bias, in
                                 elements (stab_model_entry); else 0 */
  double *head_bounds;        /* attention: per head, owned */
  double scale;               /* attention: stab_layer.scale, from the checkpoint's attn_scale
                                 (0: the library's 1/sqrt(d_h)) */
  size_t init_row;            /* with an init reference: the counterpart's row there, or SIZE_MAX */
  float self_offset;          /* a row of an init reference: added to its values when measured (the
                                 counterpart of a GGUF file's Gemma norm, stored plus one there) */
  stab_probe_ratio ratio;     /* against it (stabi_probe_ratios), NaN without one */
  stab_kind kind;
  stab_layout layout;
  size_t d_in, d_out;
  int tied;          /* a tied embedding reported as lm_head */
  const char *error; /* not measured: why (the model's) */
  stab_metrics m;
  int measured;
  /* experts: a layer's row has the worst expert per metric (EXPERT_*), its experts' rows the
   * layer's name; an expert slice's reference counterpart is a view of the reference's slice */
  size_t worst[N_EXPERT_METRICS];
  const char *expert_of;
  stab_ckpt_tensor prev_view;
} stabi_probe_row;

/* A layer of experts (measured through its experts' rows), or one expert of one. */
static inline int stabi_is_expert_layer(const stabi_probe_row *r) { return r->e && r->e->n_expert; }
static inline int stabi_is_expert(const stabi_probe_row *r) { return r->e && r->e->expert != STAB_MODEL_NO_EXPERT; }

struct stab_probe {
  char *checkpoint, *reference; /* the paths as given */
  stab_probe_params params;     /* the overrides and filters owned below */
  stab_model_override *overrides; /* kinds then layouts, globs copied */
  char **filters;
  stabi_probe_ckpt cur, prevc;
  int has_prev;
  int out_major_file; /* the checkpoint is harness/train's: GPT-2 names, nn.Linear layouts */
  stab_model *model;
  stabi_probe_row *rows;
  size_t n;
  size_t tied_src;    /* the row of the embedding the tied head (the last row) repeats, or SIZE_MAX */
  int experts_stale;  /* the layers of experts are not yet their experts' worst */
  stab_probe *init;   /* the reference of the ratios (stab_probe_set_init), or NULL */
};

/* Every row's ratio to the init reference (row.ratio), from the rows as measured now: NaN
 * without a counterpart, or before stab_probe_measure_init measured it. */
void stabi_probe_ratios(stab_probe *p);

/* The share of the run a row stands for (stab_probe_row.work). */
double stabi_probe_row_work(const stabi_probe_row *r);
/* Each layer of experts' metrics from its experts' rows (when p->experts_stale). */
void stabi_probe_expert_layers(stab_probe *p);

#endif
