/* llmc_recipe.c — llm.c's GPT-2 measured by the names in its checkpoint: the parameters read as
 * train_gpt2.c reads them (one float buffer after the 256-int header), their names and kinds
 * from the library's llm.c reader and kind rules, the monitor around one optimizer step.
 *   cc -O2 -o llmc_recipe llmc_recipe.c $(pkg-config --cflags --libs stabmeter)
 *   ./llmc_recipe gpt2_124M.bin next.bin trace.h5
 * The step is simulated: where train_gpt2.c calls gpt2_update, the weights of next.bin (a later
 * checkpoint of the same model) are read over params_memory in place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stabmeter.h>

// llm.c's gpt2_build_from_checkpoint, shortened: the header, then every parameter (f32).
// params NULL: into a new buffer; else over the buffer of the model whose header is given.
static float *read_checkpoint(const char *path, int header[256], float *params) {
 int h[256];
 FILE *f = fopen(path, "rb");
 if (f == NULL) { return NULL; }
 int ok = fread(h, sizeof(int), 256, f) == 256 && h[0] == 20240326 && h[1] == 3;
 if (!ok || (params != NULL && memcmp(h, header, 8 * sizeof(int)) != 0)) {
  fclose(f);
  return NULL;
 }
 memcpy(header, h, sizeof(h));
 size_t maxT = h[2], L = h[4], C = h[6], Vp = h[7];
 size_t num_parameters = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C;
 if (params == NULL) { params = malloc(num_parameters * sizeof(float)); }
 size_t got = params ? fread(params, sizeof(float), num_parameters, f) : 0;
 fclose(f);
 return got == num_parameters ? params : NULL;
}

// A reader's view is at byte t->offset of the file; params_memory holds the file from byte 1024.
static float *param(float *params_memory, const stab_ckpt_tensor *t) {
  return t ? params_memory + (t->offset - 1024) / sizeof(float) : NULL;
}

static int fail(const char *what) {
  fprintf(stderr, "llmc_recipe: %s: %s\n", what, stab_last_error());
  return 1;
}

int main(int argc, char *argv[]) {
  if (argc != 4) {
    fprintf(stderr, "usage: llmc_recipe MODEL.bin NEXT.bin TRACE.h5\n");
    return 2;
  }
  int header[256];
  float *params_memory = read_checkpoint(argv[1], header, NULL);
  if (params_memory == NULL) {
    fprintf(stderr, "llmc_recipe: %s: not an llm.c f32 checkpoint (version 3)\n", argv[1]);
    return 2;
  }

  // the names: the reader splits qkvw into h.l.attn.{q,k,v}; wte's padded rows are left out
  stab_llmc *ckpt;
  if (stab_llmc_open(argv[1], &ckpt) != STAB_OK) { return fail("stab_llmc_open"); }
  size_t n = stab_llmc_count(ckpt);
  const stab_ckpt_tensor **tensors = malloc(n * sizeof(*tensors));
  for (size_t i = 0; i < n; i++) { tensors[i] = stab_llmc_tensor(ckpt, i); }
  stab_model_config cfg = stab_model_default_config();
  cfg.naming = STAB_NAMING_LLMC;
  cfg.heads = header[5]; // NH
  stab_model *described;
  if (stab_model_describe(tensors, n, &cfg, &described) != STAB_OK) { return fail("describe"); }

  // one layer per entry, reading params_memory, where the optimizer writes
  stab_monitor *monitor;
  if (stab_monitor_create(NULL, &monitor) != STAB_OK) { return fail("stab_monitor_create"); }
  for (size_t i = 0; i < stab_model_count(described); i++) {
    const stab_model_entry *e = stab_model_entry_at(described, i);
    if (e->why_not) { continue; }
    float *w = param(params_memory, e->weight);
    float *b = param(params_memory, e->bias);
    float *k = param(params_memory, e->weight_k);
    stab_layer layer;
    if (stab_model_entry_layer(e, STAB_DTYPE_F32, w, b, k, &layer) != STAB_OK ||
        stab_monitor_add_layer(monitor, &layer, NULL) != STAB_OK) { return fail(e->name); }
  }
  stab_model_free(described);
  free(tensors);
  stab_llmc_close(ckpt);
  stab_trace *trace;
  if (stab_trace_open(argv[3], monitor, NULL, &trace) != STAB_OK) { return fail(argv[3]); }

  // the training loop's step 1, around the optimizer
  int step = 1;
  stab_monitor_snapshot(monitor);
  if (read_checkpoint(argv[2], header, params_memory) == NULL) { // gpt2_update(&model, ...)
    fprintf(stderr, "llmc_recipe: %s: not a checkpoint of the same model\n", argv[2]);
    return 2;
  }
  if (stab_monitor_measure(monitor, 1) != STAB_OK ||
      stab_trace_append(trace, step, 0.0, NULL, NULL) != STAB_OK) { return fail("step 1"); }

  if (stab_trace_close(trace) != STAB_OK) { return fail(argv[3]); }
  stab_monitor_free(monitor);
  free(params_memory);
  return 0;
}
