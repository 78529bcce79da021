/* check_optim.c — the trainer's optimizers (trainer/optim.c): one steepest step moves every
 * layer by lr in its own stability norm, as measured by stab_layer_metrics (linear within
 * the quintic msign band, the other kinds exactly); AdamW's first step in closed form; both
 * lower the loss on a fixed batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "optim.h"
#include "stabmeter.h"
#include "testutil.h"

enum { V = 64, D = 32, L = 2, H = 4, T = 16, B = 4 };

static void setup(model *m, int biases, int untied, int32_t *tok, int32_t *tgt) {
  model_config c = {.vocab = V, .width = D, .depth = L, .heads = H, .context = T,
                    .biases = biases, .untied = untied};
  ck_assert_int_eq(model_create(m, &c), 0);
  model_init_params(m, 9, 0);
  tu_rng r;
  tu_rng_init(&r, 10);
  /* learnable: the target is the previous token (a copy task) */
  for (size_t i = 0; i < B * T; i++) tok[i] = (int32_t)(tu_rng_u64(&r) % V);
  for (size_t i = 0; i < B * T; i++) tgt[i] = i % T ? tok[i - 1] : 0;
}

/* Loop index: bit 0 biases, bit 1 untied. */
START_TEST(test_steepest_step_sizes) {
  int biases = _i & 1, untied = (_i >> 1) & 1;
  model m;
  int32_t tok[B * T], tgt[B * T];
  setup(&m, biases, untied, tok, tgt);
  model_forward(&m, tok, tgt, B, T);
  model_zero_grad(&m);
  model_backward(&m);
  optim o;
  optim_params p = optim_default_params(OPTIM_STEEPEST);
  ck_assert_int_eq(optim_create(&o, &p, m.tensors, m.n_tensors, m.n_params), 0);
  float *before = malloc(m.n_params * sizeof(float));
  memcpy(before, m.params, m.n_params * sizeof(float));
  const float lr = 0.01f;
  TU_ASSERT_OK(optim_step(&o, m.params, m.grads, lr));
  for (size_t i = 0; i < m.n_tensors; i++) {
    const model_tensor *t = &m.tensors[i];
    size_t rows = t->rows / t->blocks, n = rows * t->cols;
    for (size_t b = 0; b < t->blocks; b++) {
      stab_layer l = {.name = t->name, .kind = t->kind, .weight = m.params + t->offset + b * n};
      stab_layer l0 = {.weight = before + t->offset + b * n};
      double want = lr, lo = 1.0 - 1e-4, hi = 1.0 + 1e-4;
      switch (t->kind) {
      case STAB_KIND_LINEAR: l.d_in = t->cols, l.d_out = rows, lo = 0.68, hi = 1.21; break;
      case STAB_KIND_EMBEDDING: l.vocab = t->rows, l.width = t->cols; break;
      case STAB_KIND_LM_HEAD: l.vocab = t->rows, l.width = t->cols, want = 2 * lr; break;
      default: /* gain, bias: a vector; a fused bias is one vector */
        l.d_in = l.d_out = t->size;
        l.weight = m.params + t->offset, l0.weight = before + t->offset;
        b = t->blocks;
      }
      stab_metrics x;
      TU_ASSERT_OK(stab_layer_metrics(&l, &l0, NULL, &x, NULL));
      ck_assert_msg(x.update >= lo * want && x.update <= hi * want,
                    "%s block %zu (%s): update stability %g, expected %g x [%g, %g]", t->name, b,
                    stab_kind_name(t->kind), x.update, want, lo, hi);
    }
  }
  free(before);
  optim_free(&o);
  model_free(&m);
}
END_TEST

START_TEST(test_adamw_first_step) {
  model m;
  int32_t tok[B * T], tgt[B * T];
  setup(&m, 1, 1, tok, tgt);
  model_forward(&m, tok, tgt, B, T);
  model_zero_grad(&m);
  model_backward(&m);
  optim o;
  optim_params p = optim_default_params(OPTIM_ADAMW);
  ck_assert_int_eq(optim_create(&o, &p, m.tensors, m.n_tensors, m.n_params), 0);
  float *before = malloc(m.n_params * sizeof(float));
  memcpy(before, m.params, m.n_params * sizeof(float));
  const float lr = 1e-3f;
  TU_ASSERT_OK(optim_step(&o, m.params, m.grads, lr));
  /* After bias correction the first moments are g and g^2: dw = -lr (g / (|g| + eps) + wd w). */
  for (size_t i = 0; i < m.n_tensors; i++) {
    const model_tensor *t = &m.tensors[i];
    int decay = t->kind != STAB_KIND_GAIN && t->kind != STAB_KIND_BIAS;
    for (size_t e = t->offset; e < t->offset + t->size; e += 7) {
      double g = m.grads[e];
      double want = -lr * (g / (fabs(g) + p.eps) + (decay ? p.weight_decay * before[e] : 0.0));
      double got = (double)m.params[e] - before[e];
      ck_assert_msg(fabs(got - want) <= 1e-6 * fabs(before[e]) + 1e-3 * lr,
                    "%s[%zu]: dw %g, expected %g", t->name, e - t->offset, got, want);
    }
  }
  free(before);
  optim_free(&o);
  model_free(&m);
}
END_TEST

/* Loop index: 0 adamw, 1 steepest; both with biases and an untied head. */
START_TEST(test_loss_falls) {
  model m;
  int32_t tok[B * T], tgt[B * T];
  setup(&m, 1, 1, tok, tgt);
  if (_i == 0) model_init_params(&m, 9, 1);
  optim o;
  optim_params p = optim_default_params(_i ? OPTIM_STEEPEST : OPTIM_ADAMW);
  ck_assert_int_eq(optim_create(&o, &p, m.tensors, m.n_tensors, m.n_params), 0);
  float first = NAN, last = NAN;
  for (int step = 0; step < 40; step++) {
    last = model_forward(&m, tok, tgt, B, T);
    if (step == 0) first = last;
    model_zero_grad(&m);
    model_backward(&m);
    TU_ASSERT_OK(optim_step(&o, m.params, m.grads, _i ? 0.05f : 1e-2f));
  }
  ck_assert_msg(last < 0.5f * first, "%s on a fixed batch: loss %g -> %g",
                _i ? "steepest" : "adamw", first, last);
  optim_free(&o);
  model_free(&m);
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("steps");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_steepest_step_sizes, 0, 4);
  tcase_add_test(tc, test_adamw_first_step);
  tcase_add_loop_test(tc, test_loss_falls, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(optim_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
