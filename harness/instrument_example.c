/* instrument_example.c — a trainer written without stabmeter in mind, with the monitor added.
 *
 * The trainer is a small MLP classifier in the style of llm.c's train_gpt2.c: every parameter in
 * one malloc'd float array with a pointer per tensor, linear weights out-major (OC, C) as in
 * nn.Linear, hand-written forward and backward passes, and AdamW updating the flat array in
 * place. The task: x ~ N(0, I) in R^16, label = argmax_k |<x, t_k>| for 4 fixed random
 * directions t_k, which no linear classifier can learn (|.| is symmetric in x) but the MLP can.
 *
 * Every line that monitoring adds ends with the comment "stabmeter" (tests/programs/instrument.sh counts
 * them, deletes them, and checks that what is left is the plain trainer, printing the same
 * losses). The only build change is pkg-config:
 *   cc -O2 -o train instrument_example.c -lm $(pkg-config --cflags --libs stabmeter)
 *   ./train [TRACE.h5]      (default example_trace.h5)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <stabmeter.h> /* stabmeter */

/* Dimension letters: B batch, C input channels, H hidden width, K classes. */
enum { B = 64, C = 16, H = 64, K = 4, STEPS = 400, EVAL = 2048 };

/* ---- parameters: one flat buffer, a pointer per tensor ---------------------------------- */

typedef struct {
  float *fc1w; /* (H, C) */
  float *fc1b; /* (H) */
  float *fc2w; /* (H, H) */
  float *fc2b; /* (H) */
  float *headw; /* (K, H), no bias */
} Params;

#define NUM_PARAMS (H * C + H + H * H + H + K * H)

static void point_params(Params *p, float *mem) {
  p->fc1w = mem, mem += H * C;
  p->fc1b = mem, mem += H;
  p->fc2w = mem, mem += H * H;
  p->fc2b = mem, mem += H;
  p->headw = mem;
}

/* ---- random numbers (xorshift*) ----------------------------------------------------------- */

static unsigned long long rng_state = 1337;

static float randf(void) { /* uniform in [0, 1) */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static float randn(void) { /* Box-Muller */
  float u = randf(), v = randf();
  return sqrtf(-2.0f * logf(1.0f - u)) * cosf(6.2831853f * v);
}

/* ---- the task ------------------------------------------------------------------------------ */

static float teacher[K * C]; /* (K, C) */

static void make_batch(float *x, int *y, int n) {
  for (int b = 0; b < n; b++) {
    float best = -1.0f;
    for (int i = 0; i < C; i++) x[b * C + i] = randn();
    for (int k = 0; k < K; k++) {
      float s = 0.0f;
      for (int i = 0; i < C; i++) s += teacher[k * C + i] * x[b * C + i];
      if (fabsf(s) > best) best = fabsf(s), y[b] = k;
    }
  }
}

/* ---- kernels --------------------------------------------------------------------------------- */

/* out (N, OC) = inp (N, IC) w^T + bias, w (OC, IC); bias may be NULL. */
static void linear_forward(float *out, const float *inp, const float *w, const float *bias, int N, int IC, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      float s = bias ? bias[o] : 0.0f;
      for (int i = 0; i < IC; i++) s += inp[n * IC + i] * w[o * IC + i];
      out[n * OC + o] = s;
    }
}

/* Accumulates dinp (N, IC), dw (OC, IC) and dbias (OC, may be NULL) from dout (N, OC). */
static void linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                            const float *w, int N, int IC, int OC) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      float d = dout[n * OC + o];
      if (dbias) dbias[o] += d;
      for (int i = 0; i < IC; i++) {
        if (dinp) dinp[n * IC + i] += d * w[o * IC + i];
        dw[o * IC + i] += d * inp[n * IC + i];
      }
    }
}

#define GELU_S 0.7978845608f /* sqrt(2/pi) */

static void gelu_forward(float *out, const float *inp, int n) {
  for (int i = 0; i < n; i++) {
    float x = inp[i];
    out[i] = 0.5f * x * (1.0f + tanhf(GELU_S * (x + 0.044715f * x * x * x)));
  }
}

static void gelu_backward(float *dinp, const float *inp, const float *dout, int n) {
  for (int i = 0; i < n; i++) {
    float x = inp[i], u = GELU_S * (x + 0.044715f * x * x * x), t = tanhf(u);
    float du = GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}

/* ---- the model ------------------------------------------------------------------------------- */

typedef struct {
  Params params, grads;
  float *params_memory, *grads_memory, *m_memory, *v_memory; /* (NUM_PARAMS) each */
  float *x, *h1a, *h1, *h2a, *h2, *probs;                     /* activations of one batch */
  float *dh1a, *dh1, *dh2a, *dh2, *dlogits;
  int *y;
} Model;

/* Mean cross-entropy of a batch of n <= EVAL; keeps the activations for backward. */
static float forward(Model *m, int n) {
  linear_forward(m->h1a, m->x, m->params.fc1w, m->params.fc1b, n, C, H);
  gelu_forward(m->h1, m->h1a, n * H);
  linear_forward(m->h2a, m->h1, m->params.fc2w, m->params.fc2b, n, H, H);
  gelu_forward(m->h2, m->h2a, n * H);
  linear_forward(m->probs, m->h2, m->params.headw, NULL, n, H, K);
  float loss = 0.0f;
  for (int b = 0; b < n; b++) {
    float *p = m->probs + b * K, mx = p[0], sum = 0.0f;
    for (int k = 1; k < K; k++) mx = p[k] > mx ? p[k] : mx;
    for (int k = 0; k < K; k++) p[k] = expf(p[k] - mx), sum += p[k];
    for (int k = 0; k < K; k++) p[k] /= sum;
    loss -= logf(p[m->y[b]]) / (float)n;
  }
  return loss;
}

static void backward(Model *m, int n) {
  for (size_t i = 0; i < NUM_PARAMS; i++) m->grads_memory[i] = 0.0f;
  for (int i = 0; i < n * H; i++) m->dh1[i] = m->dh1a[i] = m->dh2[i] = m->dh2a[i] = 0.0f;
  for (int b = 0; b < n; b++)
    for (int k = 0; k < K; k++)
      m->dlogits[b * K + k] = (m->probs[b * K + k] - (k == m->y[b] ? 1.0f : 0.0f)) / (float)n;
  linear_backward(m->dh2, m->grads.headw, NULL, m->dlogits, m->h2, m->params.headw, n, H, K);
  gelu_backward(m->dh2a, m->h2a, m->dh2, n * H);
  linear_backward(m->dh1, m->grads.fc2w, m->grads.fc2b, m->dh2a, m->h1, m->params.fc2w, n, H, H);
  gelu_backward(m->dh1a, m->h1a, m->dh1, n * H);
  linear_backward(NULL, m->grads.fc1w, m->grads.fc1b, m->dh1a, m->x, m->params.fc1w, n, C, H);
}

/* AdamW on the flat buffer, in place; t counts steps from 1. */
static void adamw_update(Model *m, float lr, float beta1, float beta2, float eps, float wd, int t) {
  for (size_t i = 0; i < NUM_PARAMS; i++) {
    float g = m->grads_memory[i];
    m->m_memory[i] = beta1 * m->m_memory[i] + (1.0f - beta1) * g;
    m->v_memory[i] = beta2 * m->v_memory[i] + (1.0f - beta2) * g * g;
    float mhat = m->m_memory[i] / (1.0f - powf(beta1, (float)t));
    float vhat = m->v_memory[i] / (1.0f - powf(beta2, (float)t));
    m->params_memory[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * m->params_memory[i]);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  Model m;
  m.params_memory = malloc(NUM_PARAMS * sizeof(float));
  m.grads_memory = malloc(NUM_PARAMS * sizeof(float));
  m.m_memory = calloc(NUM_PARAMS, sizeof(float));
  m.v_memory = calloc(NUM_PARAMS, sizeof(float));
  m.x = malloc(EVAL * C * sizeof(float));
  m.y = malloc(EVAL * sizeof(int));
  float **acts[] = {&m.h1a, &m.h1, &m.h2a, &m.h2, &m.dh1a, &m.dh1, &m.dh2a, &m.dh2};
  for (int i = 0; i < 8; i++) *acts[i] = malloc(EVAL * H * sizeof(float));
  m.probs = malloc(EVAL * K * sizeof(float));
  m.dlogits = malloc(EVAL * K * sizeof(float));
  point_params(&m.params, m.params_memory);
  point_params(&m.grads, m.grads_memory);
  /* init: N(0, 1/fan_in) weights, zero biases */
  for (int i = 0; i < K * C; i++) teacher[i] = randn();
  for (int i = 0; i < H * C; i++) m.params.fc1w[i] = randn() / sqrtf((float)C);
  for (int i = 0; i < H * H; i++) m.params.fc2w[i] = randn() / sqrtf((float)H);
  for (int i = 0; i < K * H; i++) m.params.headw[i] = randn() / sqrtf((float)H);
  for (int i = 0; i < H; i++) m.params.fc1b[i] = m.params.fc2b[i] = 0.0f;

  const char *trace_path = argc > 1 ? argv[1] : "example_trace.h5"; /* stabmeter */
  static const char *const scalar_names[] = {"loss", "lr"}; /* stabmeter */
  stab_layer layers[] = { /* stabmeter */
      {.name = "fc1", .kind = STAB_KIND_LINEAR, .d_in = C, .d_out = H, .weight = m.params.fc1w, .bias = m.params.fc1b}, /* stabmeter */
      {.name = "fc2", .kind = STAB_KIND_LINEAR, .d_in = H, .d_out = H, .weight = m.params.fc2w, .bias = m.params.fc2b}, /* stabmeter */
      {.name = "head", .kind = STAB_KIND_LM_HEAD, .vocab = K, .width = H, .weight = m.params.headw}}; /* stabmeter */
  stab_trace_params tp = stab_trace_default_params(); /* stabmeter */
  tp.scalars = scalar_names, tp.n_scalars = 2, tp.append = STAB_OUTPUT_NEW; /* a trace already there is kept: refused */ /* stabmeter */
  stab_monitor *mon = NULL; /* stabmeter */
  stab_trace *trace = NULL; /* stabmeter */
  int ok = stab_monitor_create(NULL, &mon) == STAB_OK; /* stabmeter */
  for (int i = 0; ok && i < 3; i++) ok = stab_monitor_add_layer(mon, &layers[i], NULL) == STAB_OK; /* stabmeter */
  if (!ok || stab_trace_open(trace_path, mon, &tp, &trace) != STAB_OK) { /* stabmeter */
    fprintf(stderr, "stabmeter: %s\n", stab_last_error()); /* stabmeter */
    return 1; /* stabmeter */
  } /* stabmeter */

  const float lr = 3e-3f;
  double t0 = now();
  for (int step = 1; step <= STEPS; step++) {
    make_batch(m.x, m.y, B);
    float loss = forward(&m, B);
    backward(&m, B);
    stab_monitor_snapshot(mon); /* stabmeter */
    adamw_update(&m, lr, 0.9f, 0.999f, 1e-8f, 0.01f, step);
    double scalars[2] = {loss, lr}; /* stabmeter */
    if (stab_monitor_measure(mon, 1) != STAB_OK || stab_trace_append(trace, step, now() - t0, scalars, NULL) != STAB_OK) /* stabmeter */
      fprintf(stderr, "stabmeter: %s\n", stab_last_error()); /* stabmeter */
    if (step == 1 || step % 50 == 0) printf("step %d: train loss %.6f\n", step, loss);
  }
  double took = now() - t0;

  /* held-out accuracy */
  make_batch(m.x, m.y, EVAL);
  float loss = forward(&m, EVAL);
  int right = 0;
  for (int b = 0; b < EVAL; b++) {
    int best = 0;
    for (int k = 1; k < K; k++) best = m.probs[b * K + k] > m.probs[b * K + best] ? k : best;
    right += best == m.y[b];
  }
  printf("held-out loss %.6f, accuracy %.4f\n", loss, (double)right / EVAL);
  fprintf(stderr, "trained %d steps in %.2f s\n", STEPS, took);
  if (stab_trace_close(trace) != STAB_OK) fprintf(stderr, "stabmeter: %s\n", stab_last_error()); /* stabmeter */
  stab_monitor_free(mon); /* stabmeter */
  for (int i = 0; i < 8; i++) free(*acts[i]);
  free(m.params_memory), free(m.grads_memory), free(m.m_memory), free(m.v_memory);
  free(m.x), free(m.y), free(m.probs), free(m.dlogits);
  return 0;
}
