/* validate.c — the checks of the arguments every public entry point shares: a matrix (its
 * pointer, shape and row stride) and spectral parameters (a layer's own checks, its name among
 * them, are lib/metrics/layer.c's). One place for each, so that two functions given the same
 * matrix cannot disagree about whether it is valid (stab_sigma once accepted a stride that
 * stab_layer_metrics refused, then read past the buffer). */
#include "core/core.h"

#include <stdint.h>

stab_status stabi_check_extent(const char *who, const char *what, size_t rows, size_t cols,
                               size_t *ld, size_t *span) {
  if (rows == 0 || cols == 0)
    return stabi_fail(STAB_EDIM, "%s: %s is %zu x %zu; both sizes must be > 0", who, what, rows, cols);
  if (*ld == 0) *ld = cols;
  if (*ld < cols)
    return stabi_fail(STAB_EDIM, "%s: %s: row stride ld %zu is below its row length %zu", who, what,
                      *ld, cols);
  /* The last element read is (rows - 1) * ld + cols - 1: the span must be addressable as
   * floats, i.e. (rows - 1) * ld + cols fit in size_t and, times sizeof(float), in a pointer
   * difference (beyond PTRDIFF_MAX no array can exist). */
  const size_t max_elems = (size_t)PTRDIFF_MAX / sizeof(float);
  if (cols > max_elems || !stabi_mul_fits(rows - 1, *ld) || (rows - 1) * *ld > max_elems - cols)
    return stabi_fail(STAB_EDIM,
                      "%s: %s: %zu rows of stride %zu (row length %zu) span more than %zu floats", who,
                      what, rows, *ld, cols, max_elems);
  if (span) *span = (rows - 1) * *ld + cols;
  return STAB_OK;
}

stab_status stabi_check_matrix(const char *who, const char *what, const float *a, size_t rows,
                               size_t cols, size_t *ld) {
  if (!a) return stabi_fail(STAB_EINVAL, "%s: %s is NULL", who, what);
  return stabi_check_extent(who, what, rows, cols, ld, NULL);
}

stab_status stabi_spectral_check(const stab_spectral_params *p, const char *who) {
  if (!p) return stabi_fail(STAB_EINVAL, "%s: spectral params are NULL", who);
  if (p->method != STAB_SPECTRAL_LANCZOS && p->method != STAB_SPECTRAL_POWER &&
      p->method != STAB_SPECTRAL_EXACT)
    return stabi_fail(STAB_EINVAL, "%s: unknown spectral method %d", who, (int)p->method);
  if (!(p->tol >= STAB_SPECTRAL_TOL_MIN && p->tol < 0.5))
    return stabi_fail(STAB_EINVAL, "%s: tol %g is outside [%g, 0.5)", who, p->tol,
                      STAB_SPECTRAL_TOL_MIN);
  if (p->max_passes < 1 || p->max_passes > STAB_SPECTRAL_MAX_PASSES)
    return stabi_fail(STAB_EINVAL, "%s: max_passes %d is outside [1, %d]", who, p->max_passes,
                      STAB_SPECTRAL_MAX_PASSES);
  if (p->krylov_dim < 2 || p->krylov_dim > STAB_SPECTRAL_KRYLOV_MAX)
    return stabi_fail(STAB_EINVAL, "%s: krylov_dim %d is outside [2, %d]", who, p->krylov_dim,
                      STAB_SPECTRAL_KRYLOV_MAX);
  if (p->threads < 0)
    return stabi_fail(STAB_EINVAL, "%s: threads %d is negative", who, p->threads);
  return STAB_OK;
}

size_t stabi_krylov_basis(const stab_spectral_params *p) {
  /* krylov_dim is validated to at most STAB_SPECTRAL_KRYLOV_MAX (even), so rounding up to
   * even cannot overflow */
  size_t k = ((size_t)p->krylov_dim + 1) & ~(size_t)1;
  return k < 4 ? 4 : k;
}
