/* stabmeter/steepest.h — helpers for a trainer that takes steepest-descent steps per kind (the
 * articles' parametrisation): each kind's initial weight scale, the matrix sign by Newton-Schulz,
 * row normalisation and sign. No metric uses them. Part of <stabmeter.h>. */
#ifndef STABMETER_STEEPEST_H
#define STABMETER_STEEPEST_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "layer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------- */
/* Steepest descent per kind (the articles' parametrisation)                           */

/* The articles' initial standard deviation of a layer's weights, so that forward stability
 * starts at ~1 (docs/manual/metrics.md): linear sqrt(d_out/d_in) / (sqrt(d_in) + sqrt(d_out));
 * embedding 1; lm_head 1/d_in (d_in = d, the width); gain 1 (a constant: every gamma_i = 1,
 * not a std); bias 0. d_in and d_out in the kind's math, as stab_monitor_layer gives them back:
 * a table's are embedding (V, d), lm_head (d, V). NaN for an unknown kind (attention has no
 * weights of its own) or a zero dimension. */
double stab_init_std(stab_kind kind, size_t d_in, size_t d_out);

typedef enum {
  STAB_MSIGN_QUINTIC = 0, /* Muon's quintic Newton-Schulz, coefficients (3.4445, -4.7750,
                             2.0315): fast, approximate. After 5 steps a singular value s
                             of the input with s / ||G||_F >= 1e-2 maps into [0.68, 1.14],
                             any into [0, 1.21) (the scalar iteration in f64; checked in
                             tests/unit/check_steepest.c); the singular vectors are kept up to
                             f32 rounding */
  STAB_MSIGN_CUBIC = 1    /* the classic X <- 1.5 X - 0.5 X X^T X: converges to U V^T
                             (quadratically once near), slowly for tiny singular values */
} stab_msign_method;

/* Floats of work stab_msign needs for a rows x cols matrix: 2 m n + 2 m^2 with
 * m = min(rows, cols), n = max(rows, cols); 0 if that overflows. */
size_t stab_msign_work_size(size_t rows, size_t cols);

/* msign(G) = U V^T of G = U S V^T (the matrix sign, the orthogonal polar factor), approximated
 * by `steps` Newton-Schulz iterations on G / ||G||_F in f32 with cblas_sgemm.
 *  g, out   rows x cols, contiguous row-major; out may be g
 *  steps    >= 1 (Muon uses 5 quintic steps)
 *  work     stab_msign_work_size(rows, cols) floats, not aliasing g or out
 * The zero matrix gives zeros. Errors: NULL pointers or steps < 1 STAB_EINVAL, a zero side
 * STAB_EDIM, non-finite entries in g STAB_ERANGE (out then untouched). Thread-safe (no state;
 * BLAS may use its own threads). */
stab_status stab_msign(const float *g, size_t rows, size_t cols, stab_msign_method method,
                       int steps, float *out, float *work);

/* out_i = scale * g_i / ||g_i||_RMS for each of the rows g_i (length cols); a zero row gives
 * zeros. The steepest-descent direction of a table under the max-row-RMS norm: the embedding
 * (rows = tokens), the LM head stored [V][d] (its class vectors, the "columns" of the math),
 * and a bias (rows = 1). out may be g. STAB_EINVAL for NULL, STAB_EDIM for a zero side. */
stab_status stab_normalize_rows(const float *g, size_t rows, size_t cols, double scale,
                                float *out);

/* out_i = scale * sign(g_i) (0 for 0; NaN stays NaN): SignSGD's direction for gains. */
stab_status stab_sign(const float *g, size_t n, double scale, float *out);

#ifdef __cplusplus
}
#endif

#endif /* STABMETER_STEEPEST_H */
