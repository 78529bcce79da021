/* checkpoint.h — the trainer's checkpoints: the weights as safetensors (DIR/step-N.safetensors,
 * DIR/model.safetensors) and, with AdamW, its moments beside them (.adamw, safetensors too),
 * written and read through the library's safetensors writer and reader (stabmeter/formats.h).
 * The __metadata__ says what a resumed run must agree with: the step, the head's tying, the
 * heads, the attention scale, the optimizer, learning rate and seed. Harness code. */
#ifndef STAB_TRAINER_CHECKPOINT_H
#define STAB_TRAINER_CHECKPOINT_H

#include <stddef.h>

#include "model.h"
#include "options.h"

/* A checkpoint holds one or more copies of the model's tensor table: the weights (prefix ""),
 * or AdamW's moments ("exp_avg." and "exp_avg_sq."), each a flat buffer laid out like
 * m->params. */
typedef struct {
  const char *prefix;
  float *data; /* (n_params) */
} ckpt_part;

/* o->out/name (and, with exp_avg, its moments beside it: moments_path), creating o->out;
 * steps: the optimizer steps the weights have taken. Returns 0, or 1 with the message (naming
 * the file) on stderr. */
int checkpoint_save(const model *m, float *exp_avg, float *exp_avg_sq, const options *o, const char *name,
                    size_t steps);

/* Reads a file written by checkpoint_save into the parts' buffers: every tensor of the model
 * must be there under each part's prefix, F32, with its shape, and the metadata must fit the
 * model (tied, heads, attn_scale) and, when o is not NULL, the run (optimizer, lr, seed).
 * *steps receives the metadata's step count. Returns 0; 2 for a file that is missing, not a
 * regular file, not safetensors or not a checkpoint of this model (err names the file and the
 * tensor or field); 1 when it cannot be read (out of memory; the file shrank while read). */
int checkpoint_load(const model *m, const char *path, const ckpt_part *parts, size_t n_parts, size_t *steps,
                    const options *o, char *err, size_t errlen);

/* The AdamW moments file of a checkpoint: "x/step-000100.safetensors" -> "x/step-000100.adamw".
 * 0, or -1 when it does not fit buf. */
int moments_path(char *buf, size_t n, const char *checkpoint);

#endif /* STAB_TRAINER_CHECKPOINT_H */
