/* name_monitor.c — test helper for tests/programs/entry_points.sh: the C monitor registering a
 * model by its parameters' names, as docs/manual/instrumenting.md ("Registering layers by name")
 * shows a trainer doing it: one stab_ckpt_tensor filled by hand per parameter, pointing at the
 * trainer's own f32 buffer, described with stab_model_describe, every entry registered with
 * stab_model_entry_layer; then one step: snapshot, the weights of AFTER read over the buffers in
 * place (the optimizer's step), measure, one trace row at STEP.
 * Usage: name_monitor BEFORE AFTER HEADS STEP TRACE.h5 (BEFORE, AFTER any checkpoint the probe
 * reads, with the same tensors; only F32, F16 and BF16 tensors get a buffer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stabmeter.h"

static int fail(const char *what) {
  fprintf(stderr, "name_monitor: %s: %s\n", what, stab_last_error());
  return 1;
}

static int is_float(const stab_ckpt_tensor *t) {
  return t->dtype == STAB_DTYPE_F32 || t->dtype == STAB_DTYPE_F16 || t->dtype == STAB_DTYPE_BF16;
}

/* Every float tensor of path into the buffers of own[], found by name. */
static int read_values(const char *path, stab_ckpt_tensor *own, size_t n) {
  stab_checkpoint *ck;
  if (stab_checkpoint_open(path, &ck) != STAB_OK) return fail(path);
  for (size_t i = 0; i < n; i++) {
    size_t j;
    if (!own[i].data) continue;
    if (stab_checkpoint_find(ck, own[i].name, &j) != STAB_OK ||
        stab_checkpoint_tensor(ck, j)->count != own[i].count ||
        stab_checkpoint_read_f32(ck, j, 0, (size_t)own[i].count, (float *)own[i].data) != STAB_OK) {
      fprintf(stderr, "name_monitor: %s: tensor %s missing or unreadable\n", path, own[i].name);
      stab_checkpoint_close(ck);
      return 1;
    }
  }
  stab_checkpoint_close(ck);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: name_monitor BEFORE AFTER HEADS STEP TRACE.h5\n");
    return 2;
  }
  stab_checkpoint *ck;
  if (stab_checkpoint_open(argv[1], &ck) != STAB_OK) return fail(argv[1]);
  size_t n = stab_checkpoint_count(ck);
  stab_ckpt_tensor *own = calloc(n ? n : 1, sizeof *own);
  const stab_ckpt_tensor **tp = calloc(n ? n : 1, sizeof *tp);
  char **names = calloc(n ? n : 1, sizeof *names);
  if (!own || !tp || !names) return 1;
  /* the trainer's parameters: name, shape and an f32 buffer; other types as the file has them */
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *t = stab_checkpoint_tensor(ck, i);
    names[i] = strdup(t->name);
    own[i] = *t;
    own[i].name = names[i], own[i].offset = 0, own[i].data = NULL;
    if (is_float(t)) {
      own[i].dtype = STAB_DTYPE_F32, own[i].dtype_name = "F32", own[i].elem_size = 4;
      own[i].data = malloc((size_t)(t->count ? t->count : 1) * sizeof(float));
      if (!own[i].data) return 1;
    } else {
      own[i].dtype = STAB_DTYPE_OTHER, own[i].dtype_name = "other";
    }
    tp[i] = &own[i];
  }
  stab_checkpoint_close(ck);
  if (read_values(argv[1], own, n)) return 1;

  stab_model_config cfg = stab_model_default_config();
  cfg.heads = (size_t)strtoul(argv[3], NULL, 10);
  stab_model *model;
  if (stab_model_describe(tp, n, &cfg, &model) != STAB_OK) return fail("stab_model_describe");
  stab_monitor *mon;
  if (stab_monitor_create(NULL, &mon) != STAB_OK) return fail("stab_monitor_create");
  for (size_t i = 0; i < stab_model_count(model); i++) {
    const stab_model_entry *e = stab_model_entry_at(model, i);
    stab_layer L;
    if (e->why_not || e->n_expert) continue;
    if (stab_model_entry_layer(e, STAB_DTYPE_F32, e->weight->data, e->bias ? e->bias->data : NULL,
                               e->weight_k ? e->weight_k->data : NULL, &L) != STAB_OK ||
        stab_monitor_add_layer(mon, &L, NULL) != STAB_OK)
      return fail(e->name);
  }
  stab_model_free(model);
  stab_trace *trace;
  if (stab_trace_open(argv[5], mon, NULL, &trace) != STAB_OK) return fail(argv[5]);
  if (stab_monitor_snapshot(mon) != STAB_OK) return fail("snapshot");
  if (read_values(argv[2], own, n)) return 1;
  if (stab_monitor_measure(mon, 1) != STAB_OK) return fail("measure");
  if (stab_trace_append(trace, strtoll(argv[4], NULL, 10), 0.0, NULL, NULL) != STAB_OK) return fail("append");
  if (stab_trace_close(trace) != STAB_OK) return fail(argv[5]);
  stab_monitor_free(mon);
  for (size_t i = 0; i < n; i++) free((void *)own[i].data), free(names[i]);
  free(own), free(tp), free(names);
  return 0;
}
