/* check_model.c — the trainer's transformer (trainer/model.c): the gradient of every
 * parameter tensor against central finite differences of the loss, with and without biases,
 * tied and untied heads, attention scaled by 1/sqrt(d_h) and by 1/d_h; the forward at 1/d_h
 * against 1/sqrt(d_h) on rescaled queries; causality of the attention; plain SGD on a fixed
 * batch lowers the loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "stabmeter.h"
#include "testutil.h"

enum { V = 64, D = 16, L = 2, H = 2, T = 8, B = 2 };

static void tiny_scaled(model *m, int biases, int untied, int attn_inverse, uint64_t seed, int32_t *tok,
                        int32_t *tgt) {
  model_config c = {.vocab = V, .width = D, .depth = L, .heads = H, .context = T,
                    .biases = biases, .untied = untied, .attn_inverse = attn_inverse};
  ck_assert_int_eq(model_create(m, &c), 0);
  model_init_params(m, seed, 0);
  tu_rng r;
  tu_rng_init(&r, seed + 17);
  /* Gains away from 1 and biases away from 0, so that their gradients mean something. */
  for (size_t i = 0; i < m->n_tensors; i++) {
    const model_tensor *t = &m->tensors[i];
    if (t->kind == STAB_KIND_GAIN || t->kind == STAB_KIND_BIAS)
      for (size_t e = 0; e < t->size; e++)
        m->params[t->offset + e] += (float)(0.2 * tu_rng_gauss(&r));
  }
  /* The articles' head (std 1/d) makes every upstream gradient ~1/d smaller, down to where
   * f32 rounding of the loss hides it; a head of std 1/sqrt(d) keeps the check sharp. */
  if (untied) {
    const model_tensor *h = model_find(m, "lm_head.weight");
    for (size_t e = 0; e < h->size; e++) m->params[h->offset + e] *= sqrtf((float)D);
  }
  for (size_t i = 0; i < B * T; i++) {
    tok[i] = (int32_t)(tu_rng_u64(&r) % V);
    tgt[i] = (int32_t)(tu_rng_u64(&r) % V);
  }
}

static void tiny(model *m, int biases, int untied, uint64_t seed, int32_t *tok, int32_t *tgt) {
  tiny_scaled(m, biases, untied, 0, seed, tok, tgt);
}

/* Loop index: bit 0 biases, bit 1 untied, bit 2 attention scale 1/d_h (muP) instead of
 * 1/sqrt(d_h); the seeds of 0..3 are those of before the scale was an option. */
START_TEST(test_gradient_check) {
  int biases = _i & 1, untied = (_i >> 1) & 1, inverse = (_i >> 2) & 1;
  model m;
  int32_t tok[B * T], tgt[B * T];
  tiny_scaled(&m, biases, untied, inverse, 100 + (uint64_t)_i, tok, tgt);
  ck_assert_float_eq_tol(model_attn_scale(&m.c), inverse ? 1.0f / (D / H) : 1.0f / sqrtf(D / H), 1e-7f);
  ck_assert_int_eq((int)m.n_tensors, 2 + L * (biases ? 10 : 6) + 1 + untied);
  float loss = model_forward(&m, tok, tgt, B, T);
  ck_assert(isfinite(loss));
  model_zero_grad(&m);
  model_backward(&m);
  float *grad = malloc(m.n_params * sizeof(float));
  memcpy(grad, m.grads, m.n_params * sizeof(float));
  tu_rng r;
  tu_rng_init(&r, 7);
  const double eps = 1e-2;
  double worst = 0, worst_dir = 0;
  float *u = malloc(m.n_params * sizeof(float)), *w0s = malloc(m.n_params * sizeof(float));
  for (size_t i = 0; i < m.n_tensors; i++) {
    const model_tensor *t = &m.tensors[i];
    double num = 0, den = 0, gmax = 0;
    size_t samples = t->size < 24 ? t->size : 24;
    for (size_t s = 0; s < samples; s++) {
      size_t e = t->offset + (samples == t->size ? s : tu_rng_u64(&r) % t->size);
      /* The embedding rows of tokens in the batch carry the gradient (tied: all rows). */
      if (untied && !strcmp(t->name, "transformer.wte.weight") && s % 2 == 0)
        e = t->offset + (size_t)tok[s % (B * T)] * D + tu_rng_u64(&r) % D;
      float w0 = m.params[e];
      m.params[e] = (float)(w0 + eps);
      double lp = model_forward(&m, tok, tgt, B, T);
      m.params[e] = (float)(w0 - eps);
      double lm = model_forward(&m, tok, tgt, B, T);
      m.params[e] = w0;
      double fd = (lp - lm) / (2 * eps);
      num += (grad[e] - fd) * (grad[e] - fd);
      den += fd * fd;
      gmax = fmax(gmax, fabs(grad[e]));
    }
    double rel = sqrt(num / den);
    worst = fmax(worst, rel);
    ck_assert_msg(gmax > 1e-6, "%s: gradient is zero at every sampled coordinate", t->name);
    ck_assert_msg(rel < 1e-2, "%s (biases %d untied %d inverse %d): |grad - fd| / |fd| = %.3g over %zu coords",
                  t->name, biases, untied, inverse, rel, samples);
    /* Directional derivative along u = grad + noise of the same size, scaled to RMS 1, with
     * the step h set so that the loss moves by about 3e-3 (at most 5% of the weights' RMS):
     * the f32 rounding of the loss (~1e-6) is then small next to the change, as it is not
     * for a single coordinate; the tolerance adds that rounding over the change. */
    for (int dir = 0; dir < 3; dir++) {
      float *w = m.params + t->offset;
      const float *gt = grad + t->offset;
      double gg = 0, ww = 0, uu = 0, dot = 0;
      for (size_t e = 0; e < t->size; e++) gg += (double)gt[e] * gt[e], ww += (double)w[e] * w[e];
      double noise = sqrt(gg / (double)t->size);
      for (size_t e = 0; e < t->size; e++) {
        u[e] = (float)(gt[e] + noise * tu_rng_gauss(&r));
        uu += (double)u[e] * u[e];
        w0s[e] = w[e];
      }
      for (size_t e = 0; e < t->size; e++) {
        u[e] = (float)(u[e] / sqrt(uu / (double)t->size));
        dot += (double)gt[e] * u[e];
      }
      double h = fmin(3e-3 / fabs(dot), 0.05 * fmax(sqrt(ww / (double)t->size), 0.05));
      double tol = 2e-3 + 2e-6 / (h * fabs(dot));
      for (size_t e = 0; e < t->size; e++) w[e] = (float)(w0s[e] + h * u[e]);
      double lp = model_forward(&m, tok, tgt, B, T);
      for (size_t e = 0; e < t->size; e++) w[e] = (float)(w0s[e] - h * u[e]);
      double lm = model_forward(&m, tok, tgt, B, T);
      memcpy(w, w0s, t->size * sizeof(float));
      double dd = (lp - lm) / (2 * h), drel = fabs(dd - dot) / fabs(dd);
      worst_dir = fmax(worst_dir, drel);
      ck_assert_msg(drel < tol, "%s (biases %d untied %d inverse %d): directional derivative %.6g, "
                    "<grad, u> %.6g (rel %.3g > %.3g)", t->name, biases, untied, inverse, dd, dot, drel, tol);
    }
  }
  printf("gradient check (biases %d, untied %d, attention scale %s): %zu tensors, worst relative "
         "error %.2e (24 coordinates each), %.2e (3 random directions each)\n",
         biases, untied, inverse ? "1/d_h" : "1/sqrt(d_h)", m.n_tensors, worst, worst_dir);
  free(grad), free(u), free(w0s);
  model_free(&m);
}
END_TEST

/* The forward with s = 1/d_h is the one with s = 1/sqrt(d_h) on q rows (and q biases) scaled
 * by 1/sqrt(d_h): s q.k is the same logit. Both models are built from the same seed. */
START_TEST(test_attn_scale_forward) {
  model a, b;
  int32_t tok[B * T], tgt[B * T];
  tiny_scaled(&a, 1, 0, 1, 5, tok, tgt);
  tiny_scaled(&b, 1, 0, 0, 5, tok, tgt);
  ck_assert_int_eq((int)a.n_params, (int)b.n_params);
  ck_assert(!memcmp(a.params, b.params, a.n_params * sizeof(float)));
  float q = 1.0f / sqrtf((float)(D / H));
  for (size_t l = 0; l < L; l++) {
    model_block w = model_block_at(&b, b.params, l);
    for (size_t e = 0; e < (size_t)D * D; e++) w.qkvw[e] *= q;
    for (size_t e = 0; e < (size_t)D; e++) w.qkvb[e] *= q;
  }
  float la = model_forward(&a, tok, tgt, B, T), lb = model_forward(&b, tok, tgt, B, T);
  const float *ga = model_logits(&a), *gb = model_logits(&b);
  double num = 0, den = 0;
  for (size_t i = 0; i < (size_t)B * T * V; i++)
    num += ((double)ga[i] - gb[i]) * ((double)ga[i] - gb[i]), den += (double)gb[i] * gb[i];
  ck_assert_msg(sqrt(num / den) < 1e-5, "logits of s = 1/d_h against scaled q: relative error %.3g",
                sqrt(num / den));
  ck_assert_msg(fabsf(la - lb) < 1e-5f * fabsf(lb), "loss %.9g against %.9g", la, lb);
  /* and the scale matters here: unscaled q gives another loss */
  model_free(&b);
  tiny_scaled(&b, 1, 0, 0, 5, tok, tgt);
  float lc = model_forward(&b, tok, tgt, B, T);
  ck_assert_msg(fabsf(la - lc) > 1e-4f, "loss %.9g at both scales", la);
  model_free(&a), model_free(&b);
}
END_TEST

START_TEST(test_causal) {
  model m;
  int32_t tok[B * T], tgt[B * T];
  tiny(&m, 1, 1, 3, tok, tgt);
  model_forward(&m, tok, NULL, B, T);
  float *before = malloc(B * T * V * sizeof(float));
  memcpy(before, model_logits(&m), B * T * V * sizeof(float));
  tok[T - 1] = (tok[T - 1] + 1) % V; /* last position of sequence 0 */
  model_forward(&m, tok, NULL, B, T);
  const float *after = model_logits(&m);
  for (size_t i = 0; i < B * T * V; i++) {
    size_t pos = i / V;
    if (pos == T - 1)
      continue;
    ck_assert_msg(before[i] == after[i], "logit %zu changed by a later token", i);
  }
  free(before);
  model_free(&m);
}
END_TEST

START_TEST(test_sgd_lowers_loss) {
  model m;
  int32_t tok[B * T], tgt[B * T];
  tiny(&m, _i & 1, (_i >> 1) & 1, 11, tok, tgt);
  float first = NAN, last = NAN;
  for (int step = 0; step < 60; step++) {
    last = model_forward(&m, tok, tgt, B, T);
    if (step == 0) first = last;
    model_zero_grad(&m);
    model_backward(&m);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] -= 0.5f * m.grads[i];
  }
  ck_assert_msg(last < 0.5f * first, "SGD on a fixed batch: loss %g -> %g", first, last);
  model_free(&m);
}
END_TEST

START_TEST(test_bad_input) {
  model m;
  model_config c = {.vocab = V, .width = 15, .depth = L, .heads = 2, .context = T};
  ck_assert_int_eq(model_create(&m, &c), -1);
  int32_t tok[B * T], tgt[B * T];
  tiny(&m, 0, 0, 5, tok, tgt);
  tok[3] = V;
  ck_assert(isnan(model_forward(&m, tok, tgt, B, T)));
  tok[3] = 0;
  ck_assert(isnan(model_forward(&m, tok, tgt, B, T + 1)));
  ck_assert(isfinite(model_forward(&m, tok, tgt, B, T)));
  model_free(&m);
}
END_TEST

static Suite *model_suite(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("gradients");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_gradient_check, 0, 8);
  tcase_add_test(tc, test_attn_scale_forward);
  tcase_add_test(tc, test_causal);
  tcase_add_loop_test(tc, test_sgd_lowers_loss, 0, 4);
  tcase_add_test(tc, test_bad_input);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(model_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failures = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failures ? 1 : 0;
}
