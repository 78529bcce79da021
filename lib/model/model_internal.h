/* model_internal.h — what the model's rules (lib/model/) know of a checkpoint's conventions
 * beyond the public stabmeter/model.h, for the probe above them. Never installed. */
#ifndef STABMETER_MODEL_INTERNAL_H
#define STABMETER_MODEL_INTERNAL_H

#include "core/core.h"

/* What a checkpoint's __metadata__ says about its layout: 1 when f was written by stabmeter-train
 * (trainer/; __metadata__ "producer" starting "stabmeter-train"), whose GPT-2 names hold every
 * weight out-major (nn.Linear's [d_out][d_in]) where Hugging Face's GPT-2 stores its Conv1D
 * weights in-major; 0 for any other file, or NULL. stab_model_config_from_safetensors sets
 * stab_model_config.out_major from it. (model_config.c) */
int stabi_model_trainer_file(const stab_safetensors *f);

#endif /* STABMETER_MODEL_INTERNAL_H */
