/* shared_storage.c — which of a monitor's layers hold the same numbers: a tied embedding and LM
 * head (one table registered under two kinds), an attention layer whose q and k point into a
 * registered fused qkv linear. Found from addresses alone (byte ranges, each layer's elements
 * 4 or 2 bytes as its dtype stores them), so that a trace can say which groups share storage
 * and how many of each layer's parameters no earlier layer counted. */
#include "metrics/metrics.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One end of a run of bytes a layer stores: [addr, addr + n) starts (delta +1) or ends (-1). */
typedef struct {
  uintptr_t addr;
  int delta;
  size_t layer;
} edge;

typedef struct {
  edge *e;
  size_t n, cap;
} edges;

static int add_run(edges *es, const void *p, size_t n, size_t layer) {
  if (!p || n == 0) return 0;
  if (es->n + 2 > es->cap) {
    size_t cap = es->cap ? 2 * es->cap : 64;
    edge *g = realloc(es->e, cap * sizeof *g);
    if (!g) return -1;
    es->e = g, es->cap = cap;
  }
  es->e[es->n++] = (edge){(uintptr_t)p, +1, layer};
  es->e[es->n++] = (edge){(uintptr_t)p + n, -1, layer};
  return 0;
}

/* A stored matrix, rows x cols elements of esz bytes with row stride ld elements: one run when
 * its rows are contiguous, else one run per row (the gaps belong to other tensors, e.g. k and v
 * beside q in HF's in-major fused [d][3d] c_attn). */
static int add_matrix(edges *es, const void *p, size_t rows, size_t cols, size_t ld, size_t esz, size_t layer) {
  if (ld == cols) return add_run(es, p, rows * cols * esz, layer);
  for (size_t r = 0; r < rows; r++)
    if (add_run(es, (const unsigned char *)p + r * ld * esz, cols * esz, layer)) return -1;
  return 0;
}

static int add_layer(edges *es, const stab_layer *l, const stabi_shape *sh, size_t i) {
  const size_t esz = stabi_dtype_size(l->dtype);
  if (add_matrix(es, l->weight, sh->rows, sh->cols, sh->ld, esz, i)) return -1;
  /* the key: kv_heads heads' rows of the query's width (out-major; in-major is never grouped) */
  if (l->kind == STAB_KIND_ATTENTION &&
      add_matrix(es, l->weight_k, sh->kv_heads == sh->heads ? sh->rows : sh->rows / sh->heads * sh->kv_heads, sh->cols,
                 sh->ld, esz, i))
    return -1;
  /* a linear layer's bias has one value per output */
  if (l->kind == STAB_KIND_LINEAR && l->bias && add_run(es, l->bias, l->d_out * esz, i)) return -1;
  return 0;
}

static int edge_cmp(const void *a, const void *b) {
  uintptr_t x = ((const edge *)a)->addr, y = ((const edge *)b)->addr;
  return x < y ? -1 : x > y;
}

/* Records that layers a and b share stored numbers (once). */
static int note_pair(stabi_sharing *s, size_t *cap, size_t a, size_t b) {
  for (size_t k = 0; k < s->n_with[a]; k++)
    if (s->with[a][k] == b) return 0;
  if (s->n_with[a] == cap[a]) {
    size_t c = cap[a] ? 2 * cap[a] : 4;
    size_t *g = realloc(s->with[a], c * sizeof *g);
    if (!g) return -1;
    s->with[a] = g, cap[a] = c;
  }
  s->with[a][s->n_with[a]++] = b;
  return 0;
}

static int size_cmp(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

void stabi_sharing_free(stabi_sharing *s) {
  if (!s) return;
  if (s->with)
    for (size_t i = 0; i < s->n_layers; i++) free(s->with[i]);
  free(s->with);
  free(s->n_with);
  free(s->unique);
  memset(s, 0, sizeof *s);
}

/* A sweep along the address line: between two consecutive run ends, the layers whose runs
 * cover that stretch all hold its bytes; the first registered of them counts them, as elements
 * of its own dtype. */
stab_status stabi_sharing_find(const stab_monitor *m, const char *who, stabi_sharing *out) {
  memset(out, 0, sizeof *out);
  const size_t n = stab_monitor_layer_count(m);
  edges es = {NULL, 0, 0};
  size_t *cover = NULL, *active = NULL, *at = NULL, *cap = NULL, n_active = 0;
  uint64_t *bytes = NULL;
  out->n_layers = n;
  if (n == 0) return STAB_OK;
  out->unique = calloc(n, sizeof *out->unique);
  out->with = calloc(n, sizeof *out->with);
  out->n_with = calloc(n, sizeof *out->n_with);
  cover = calloc(n, sizeof *cover);   /* runs of each layer covering the current stretch */
  active = malloc(n * sizeof *active);/* the layers with cover > 0, in no order */
  at = malloc(n * sizeof *at);        /* each active layer's place in active */
  cap = calloc(n, sizeof *cap);
  bytes = calloc(n, sizeof *bytes);
  int failed = !out->unique || !out->with || !out->n_with || !cover || !active || !at || !cap || !bytes;
  for (size_t i = 0; i < n && !failed; i++)
    failed = add_layer(&es, stab_monitor_layer(m, i), stabi_monitor_shape(m, i), i) != 0;
  if (!failed) qsort(es.e, es.n, sizeof *es.e, edge_cmp);
  for (size_t k = 0; k < es.n && !failed;) {
    uintptr_t here = es.e[k].addr;
    for (; k < es.n && es.e[k].addr == here; k++) { /* every end at this address, then the stretch */
      size_t l = es.e[k].layer;
      if (es.e[k].delta > 0 && cover[l]++ == 0) at[l] = n_active, active[n_active++] = l;
      if (es.e[k].delta < 0 && --cover[l] == 0) {
        size_t last = active[--n_active];
        active[at[l]] = last, at[last] = at[l];
      }
    }
    if (!n_active || k == es.n) continue;
    size_t owner = active[0];
    for (size_t a = 1; a < n_active; a++)
      if (active[a] < owner) owner = active[a];
    bytes[owner] += (uint64_t)(es.e[k].addr - here);
    for (size_t a = 0; a < n_active && !failed && n_active > 1; a++)
      for (size_t b = 0; b < n_active && !failed; b++)
        if (a != b) failed = note_pair(out, cap, active[a], active[b]) != 0;
  }
  for (size_t i = 0; i < n && !failed; i++) {
    out->unique[i] = (int64_t)(bytes[i] / stabi_dtype_size(stab_monitor_layer(m, i)->dtype));
    if (out->n_with[i]) qsort(out->with[i], out->n_with[i], sizeof *out->with[i], size_cmp);
  }
  free(es.e);
  free(cover);
  free(active);
  free(at);
  free(cap);
  free(bytes);
  if (failed) {
    stabi_sharing_free(out);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory comparing the layers' storage", who);
  }
  return STAB_OK;
}
