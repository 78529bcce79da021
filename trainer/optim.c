/* optim.c — AdamW and the per-kind steepest descent of optim.h. */
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

optim_params optim_default_params(optim_kind kind) {
  return (optim_params){.kind = kind, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = kind == OPTIM_ADAMW ? 0.1f : 0.0f, .ns_steps = 5};
}

int optim_create(optim *o, const optim_params *p, const model_tensor *tensors, size_t n_tensors,
                 size_t n_params) {
  memset(o, 0, sizeof *o);
  o->p = *p, o->tensors = tensors, o->n_tensors = n_tensors, o->n_params = n_params;
  size_t biggest = 0, work = 0;
  for (size_t i = 0; i < n_tensors; i++) {
    const model_tensor *t = &tensors[i];
    biggest = t->size > biggest ? t->size : biggest;
    if (t->kind == STAB_KIND_LINEAR) {
      size_t w = stab_msign_work_size(t->rows / t->blocks, t->cols);
      work = w > work ? w : work;
    }
  }
  if (p->kind == OPTIM_ADAMW) {
    o->m = calloc(n_params, sizeof(float));
    o->v = calloc(n_params, sizeof(float));
    if (!o->m || !o->v) goto oom;
  } else {
    o->dir = malloc((biggest ? biggest : 1) * sizeof(float));
    o->work = malloc((work ? work : 1) * sizeof(float));
    if (!o->dir || !o->work) goto oom;
  }
  return 0;
oom:
  optim_free(o);
  return -2;
}

void optim_free(optim *o) {
  if (!o) return;
  free(o->m), free(o->v), free(o->dir), free(o->work);
  memset(o, 0, sizeof *o);
}

static int decays(stab_kind k) {
  return k == STAB_KIND_LINEAR || k == STAB_KIND_EMBEDDING || k == STAB_KIND_LM_HEAD;
}

static void adamw_tensor(float *w, const float *g, float *m, float *v, size_t n, float lr,
                         float wd, const optim_params *p, long step) {
  float c1 = 1.0f - powf(p->beta1, (float)step), c2 = 1.0f - powf(p->beta2, (float)step);
  for (size_t i = 0; i < n; i++) {
    m[i] = p->beta1 * m[i] + (1.0f - p->beta1) * g[i];
    v[i] = p->beta2 * v[i] + (1.0f - p->beta2) * g[i] * g[i];
    float mh = m[i] / c1, vh = v[i] / c2;
    w[i] -= lr * (mh / (sqrtf(vh) + p->eps) + wd * w[i]);
  }
}

/* The steepest-descent direction of one tensor, of size 1 in its layer's stability norm, in
 * o->dir. */
static int steepest_direction(optim *o, const model_tensor *t, const float *g) {
  stab_status st = STAB_OK;
  switch (t->kind) {
  case STAB_KIND_LINEAR: {
    size_t rows = t->rows / t->blocks, n = rows * t->cols;
    float scale = sqrtf((float)rows / (float)t->cols); /* sqrt(d_out / d_in) */
    for (size_t b = 0; b < t->blocks && st == STAB_OK; b++) {
      st = stab_msign(g + b * n, rows, t->cols, STAB_MSIGN_QUINTIC, o->p.ns_steps, o->dir + b * n,
                      o->work);
      for (size_t i = 0; i < n; i++) o->dir[b * n + i] *= scale;
    }
    break;
  }
  case STAB_KIND_EMBEDDING: st = stab_normalize_rows(g, t->rows, t->cols, 1.0, o->dir); break;
  case STAB_KIND_LM_HEAD:
    st = stab_normalize_rows(g, t->rows, t->cols, 1.0 / (double)t->cols, o->dir);
    break;
  case STAB_KIND_GAIN: st = stab_sign(g, t->size, 1.0, o->dir); break;
  case STAB_KIND_BIAS: st = stab_normalize_rows(g, 1, t->size, 1.0, o->dir); break;
  default: break;
  }
  return st;
}

int optim_step(optim *o, float *params, const float *grads, float lr) {
  o->step++;
  for (size_t i = 0; i < o->n_tensors; i++) {
    const model_tensor *t = &o->tensors[i];
    float *w = params + t->offset;
    const float *g = grads + t->offset;
    float wd = decays(t->kind) ? o->p.weight_decay : 0.0f;
    if (o->p.kind == OPTIM_ADAMW) {
      adamw_tensor(w, g, o->m + t->offset, o->v + t->offset, t->size, lr, wd, &o->p, o->step);
      continue;
    }
    int st = steepest_direction(o, t, g);
    if (st != STAB_OK) return st;
    for (size_t e = 0; e < t->size; e++) w[e] -= lr * (o->dir[e] + wd * w[e]);
  }
  return STAB_OK;
}
