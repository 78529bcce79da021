/* layer.c — what a layer is: the stab_layer descriptor's kinds and their names, the checks
 * every function that takes a layer makes of it (its name, kind, layout, dtype, sizes, stride
 * and heads), and the stored matrix they resolve it to (stabi_shape). The dtypes' names and
 * sizes describe stored numbers, which the engine reads below this wing:
 * lib/engine/stored_rows.c. */
#include "metrics/metrics.h"

#include <stdio.h>
#include <string.h>

const char *stab_kind_name(stab_kind kind) {
  switch (kind) {
  case STAB_KIND_LINEAR: return "linear";
  case STAB_KIND_EMBEDDING: return "embedding";
  case STAB_KIND_LM_HEAD: return "lm_head";
  case STAB_KIND_GAIN: return "gain";
  case STAB_KIND_BIAS: return "bias";
  case STAB_KIND_ATTENTION: return "attention";
  }
  return NULL;
}

stab_status stabi_check_name(const char *who, const char *name) {
  size_t n = strlen(name), bad = stabi_utf8_invalid_at(name, n);
  if (bad != (size_t)-1)
    return stabi_fail(STAB_EINVAL, "%s: layer name is not valid UTF-8 (byte %zu of %zu is 0x%02x)",
                      who, bad, n, (unsigned)(unsigned char)name[bad]);
  return STAB_OK;
}

/* Sets the stored shape of the d_in x d_out matrix of sh, out-major or in-major. */
static void matrix_shape(int out_major, stabi_shape *sh) {
  sh->rows = out_major ? sh->d_out : sh->d_in;
  sh->cols = out_major ? sh->d_in : sh->d_out;
}

static int is_table(stab_kind kind) { return kind == STAB_KIND_EMBEDDING || kind == STAB_KIND_LM_HEAD; }

/* The layer's d_in and d_out in its kind's math, into sh. A table is described by what it is
 * (vocab V rows or classes, width d) because its d_in and d_out trade places between the two
 * kinds: given as d_in/d_out, a tied table registered as embedding and as lm_head took one pair
 * swapped, and either swap was accepted and gave plausible wrong values. So a table with only
 * d_in/d_out (the interface before 0.2.0) is refused rather than guessed at, and d_in/d_out
 * given beside vocab/width must agree with them. */
static stab_status layer_dims(const stab_layer *l, const char *who, const char *name, stabi_shape *sh) {
  const char *kind = stab_kind_name(l->kind);
  if (!is_table(l->kind)) {
    if (l->vocab || l->width)
      return stabi_fail(STAB_EINVAL,
                        "%s: layer '%s' (%s) has vocab %zu and width %zu: those are for embedding and "
                        "lm_head tables; a %s takes d_in and d_out",
                        who, name, kind, l->vocab, l->width, kind);
    if (l->d_in == 0 || l->d_out == 0)
      return stabi_fail(STAB_EDIM, "%s: layer '%s' (%s) has d_in %zu and d_out %zu; both must be > 0",
                        who, name, kind, l->d_in, l->d_out);
    sh->d_in = l->d_in;
    sh->d_out = l->d_out;
    return STAB_OK;
  }
  if (!l->vocab && !l->width && (l->d_in || l->d_out))
    return stabi_fail(STAB_EINVAL,
                      "%s: layer '%s' (%s) gives its table as d_in %zu, d_out %zu: use .vocab (V, the "
                      "table's rows or classes) and .width (d, the length of each row) and leave d_in "
                      "and d_out 0 (changed in stabmeter 0.2.0)",
                      who, name, kind, l->d_in, l->d_out);
  if (l->vocab == 0 || l->width == 0)
    return stabi_fail(STAB_EDIM, "%s: layer '%s' (%s) has vocab %zu and width %zu; both must be > 0",
                      who, name, kind, l->vocab, l->width);
  const int head = l->kind == STAB_KIND_LM_HEAD;
  sh->d_in = head ? l->width : l->vocab;
  sh->d_out = head ? l->vocab : l->width;
  if ((l->d_in && l->d_in != sh->d_in) || (l->d_out && l->d_out != sh->d_out))
    return stabi_fail(STAB_EINVAL,
                      "%s: layer '%s' (%s): d_in %zu and d_out %zu contradict vocab %zu and width %zu "
                      "(for %s d_in = %s = %zu, d_out = %s = %zu); leave d_in and d_out 0",
                      who, name, kind, l->d_in, l->d_out, l->vocab, l->width, kind, head ? "width" : "vocab",
                      sh->d_in, head ? "vocab" : "width", sh->d_out);
  return STAB_OK;
}

stab_status stabi_layer_shape(const stab_layer *l, const char *who, stabi_shape *sh) {
  if (!l) return stabi_fail(STAB_EINVAL, "%s: layer is NULL", who);
  memset(sh, 0, sizeof *sh);
  if (l->name) { /* before any message quotes it */
    stab_status st = stabi_check_name(who, l->name);
    if (st != STAB_OK) return st;
  }
  const char *name = stabi_layer_name(l);
  if (!stab_kind_name(l->kind))
    return stabi_fail(STAB_EINVAL, "%s: layer '%s' has unknown kind %d", who, name, (int)l->kind);
  if (l->layout != STAB_LAYOUT_NATURAL && l->layout != STAB_LAYOUT_OUT_MAJOR &&
      l->layout != STAB_LAYOUT_IN_MAJOR)
    return stabi_fail(STAB_EINVAL, "%s: layer '%s' has unknown layout %d", who, name,
                      (int)l->layout);
  if (!l->weight) return stabi_fail(STAB_EINVAL, "%s: layer '%s' has no weight (NULL)", who, name);
  if (!stabi_dtype_name(l->dtype))
    return stabi_fail(STAB_EINVAL, "%s: layer '%s' has unknown dtype %d", who, name, (int)l->dtype);
  if (!stabi_dtype_size(l->dtype))
    return stabi_fail(STAB_EINVAL,
                      "%s: layer '%s' has dtype %s, which the layer functions do not read: only F32, "
                      "F16 and BF16 (convert it to f32 first, e.g. with stab_ckpt_read_f32)",
                      who, name, stabi_dtype_name(l->dtype));
  stab_status st = layer_dims(l, who, name, sh);
  if (st != STAB_OK) return st;
  switch (l->kind) {
  case STAB_KIND_LINEAR:
  case STAB_KIND_ATTENTION:
    matrix_shape(l->layout != STAB_LAYOUT_IN_MAJOR, sh);
    break;
  case STAB_KIND_EMBEDDING: /* d_in = V: natural [V][d] is in-major */
    matrix_shape(l->layout == STAB_LAYOUT_OUT_MAJOR, sh);
    sh->items_are_rows = l->layout != STAB_LAYOUT_OUT_MAJOR;
    break;
  case STAB_KIND_LM_HEAD: /* d_out = V: natural [V][d] is out-major */
    matrix_shape(l->layout != STAB_LAYOUT_IN_MAJOR, sh);
    sh->items_are_rows = l->layout != STAB_LAYOUT_IN_MAJOR;
    break;
  case STAB_KIND_GAIN:
  case STAB_KIND_BIAS:
    if (l->d_in != l->d_out)
      return stabi_fail(STAB_EDIM, "%s: %s '%s' has d_in %zu and d_out %zu; both are its length",
                        who, stab_kind_name(l->kind), name, l->d_in, l->d_out);
    sh->rows = 1;
    sh->cols = l->d_out;
    break;
  }
  char what[96];
  snprintf(what, sizeof what, "layer '%.60s'", name);
  sh->ld = l->ld;
  st = stabi_check_extent(who, what, sh->rows, sh->cols, &sh->ld, NULL);
  if (st != STAB_OK) return st;
  if (l->kind == STAB_KIND_ATTENTION) {
    if (!l->weight_k)
      return stabi_fail(STAB_EINVAL, "%s: attention '%s' has no key projection (weight_k)", who,
                        name);
    if (l->heads == 0 || l->d_out % l->heads != 0)
      return stabi_fail(STAB_ERANGE, "%s: attention '%s': %zu heads do not divide d_out %zu", who,
                        name, l->heads, l->d_out);
    if (!(l->scale >= 0.0) || !isfinite(l->scale))
      return stabi_fail(STAB_ERANGE, "%s: attention '%s': scale %g is not a finite value >= 0",
                        who, name, l->scale);
    sh->heads = l->heads;
    sh->dh = l->d_out / l->heads;
    sh->kv_heads = l->kv_heads ? l->kv_heads : l->heads;
    if (sh->kv_heads > l->heads || l->heads % sh->kv_heads)
      return stabi_fail(STAB_ERANGE, "%s: attention '%s': %zu key heads do not divide %zu heads", who, name,
                        l->kv_heads, l->heads);
    if (sh->kv_heads != l->heads && l->layout == STAB_LAYOUT_IN_MAJOR)
      return stabi_fail(STAB_EINVAL, "%s: attention '%s': grouped-query attention (%zu key heads) with in-major "
                        "weights (the key's row stride differs from the query's)", who, name, l->kv_heads);
    if (l->layout != STAB_LAYOUT_IN_MAJOR) { /* head h: rows h*dh .. */
      sh->block_rows = sh->dh;
      sh->block_cols = sh->cols;
      sh->block_step = sh->dh * sh->ld;
    } else { /* head h: columns h*dh .. */
      sh->block_rows = sh->rows;
      sh->block_cols = sh->dh;
      sh->block_step = sh->dh;
    }
  }
  return STAB_OK;
}
