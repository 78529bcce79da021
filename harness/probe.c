/* probe.c — the stability metrics of every layer of a checkpoint on disk (safetensors,
 * GGUF or llm.c), optionally with the update against an older checkpoint: the model described
 * by the library's kind rules (stab_model_describe; the rule table is in stabmeter.h and
 * docs/probe.md), the metrics computed by the library, printed as an aligned table (rows in the checkpoint's order or sorted by a metric,
 * then the largest value per kind and metric, and the units) or as the probe report (JSON);
 * definitions in docs/metrics.md. Layers are named as stabmeter-train's trace names them. */
#include "ckpt_guard.h"
#include "cli.h"
#include "clock.h"
#include "probe_ranks.h"
#include "probe_split.h"
#include "stabmeter.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Where the definitions are: the repository's docs/metrics.md, installed under the doc
 * directory (the build sets STAB_DOCDIR to $(docdir)). */
#ifndef STAB_DOCDIR
#define STAB_DOCDIR "/usr/local/share/doc/stabmeter"
#endif

typedef struct {
  const char *glob;
  char value[16];
} override;

/* --sort: the checkpoint's order, name order, or a metric, largest first (sort_names order) */
enum { SORT_FILE, SORT_NAME, SORT_FORWARD, SORT_DEPENDENCY, SORT_UPDATE, SORT_SIGMA, SORT_REL_UPDATE,
       SORT_FORWARD_TIGHT, SORT_DEPENDENCY_TIGHT, SORT_UPDATE_TIGHT };
static const char *const sort_names[] = {"file",       "name",          "forward",          "dependency",
                                         "update",     "sigma",         "rel_update",       "forward_tight",
                                         "dependency_tight", "update_tight", NULL};

typedef struct {
  const char *checkpoint, *reference;
  const char *hdf5; /* --hdf5: the trace to append this checkpoint's step to */
  int64_t step;     /* --step, the checkpoint's metadata, its file name; or -1 */
  const char *step_from; /* where step came from, for the messages and the report */
  int sort;         /* SORT_* */
  size_t top;       /* --top N, or 0: every row */
  size_t heads;     /* --heads, or 0: from the file's metadata or config.json */
  int per_head;     /* --per-head: a table row per attention head */
  int experts;      /* --experts: a row per expert too, beside its layer's */
  int out_major_file; /* the checkpoint is harness/train's: GPT-2 names, nn.Linear layouts */
  int json, quiet;
  double tol;
  int exact;
  stab_tight_method tight;
  const char **filters;
  size_t nfilters;
  override *kinds, *layouts;
  size_t nkinds, nlayouts;
} options;

/* One row of the report: an entry of the model (a layer to measure, or a tensor not measured,
 * error set) and what the probe measured of it. */
typedef struct {
  const stab_model_entry *e;  /* the model's entry the row is */
  const stab_ckpt_tensor *t, *bias;
  const stab_ckpt_tensor *tk; /* attention: the key projection (t is the query) */
  const stab_ckpt_tensor *prev_t, *prev_bias; /* --prev: what the update is against, or NULL */
  const char *no_update; /* --prev: why the reference has no counterpart (static), or NULL */
  char *owned_no_update;  /* or owned (a counterpart name the message gives) */
  /* --prev across formats (find_converted): how prev_t is read into t's own order */
  size_t prev_heads;      /* q/k rows permuted by the converter, in that many heads; 0: none */
  int prev_to_gguf;       /* 1: t is the GGUF tensor (HF rows put in its order), 0: the reverse */
  int prev_transposed;    /* prev_t is t's transpose (an HF GPT-2 Conv1D weight) */
  float prev_offset;      /* added to prev_t's values (Gemma's norms: llama.cpp stores w + 1) */
  const char *name;           /* the row's name (the model's) */
  size_t heads;               /* attention */
  size_t kv_heads;            /* attention: key heads (fewer than heads: grouped-query) */
  size_t ld, q_off, k_off;    /* attention: row stride and where q and k start inside t, tk
                                 (a fused qkv tensor holds both) */
  double *head_bounds;        /* attention: per head, owned */
  stab_kind kind;
  stab_layout layout;
  size_t d_in, d_out;
  int tied;          /* a tied embedding reported as lm_head */
  const char *error; /* not measured: why (the model's) */
  stab_metrics m;
  int measured;
  /* experts: a layer's row has the worst expert per metric (EXPERT_*), its experts' rows the
   * layer's name; an expert slice's --prev counterpart is a view of the reference's slice */
  size_t worst[5];
  const char *expert_of;
  stab_ckpt_tensor prev_view;
} row;

/* The metrics a layer of experts reports as its worst expert's, in row.worst's order. */
enum { EXPERT_FORWARD, EXPERT_DEPENDENCY, EXPERT_UPDATE, EXPERT_SIGMA, EXPERT_REL_UPDATE, N_EXPERT_METRICS };
static const char *const expert_metric_names[] = {"forward", "dependency", "update", "sigma", "rel_update"};

/* A layer of experts (measured through its experts' rows), or one expert of one. */
static int is_expert_layer(const row *r) { return r->e && r->e->n_expert; }
static int is_expert(const row *r) { return r->e && r->e->expert != STAB_MODEL_NO_EXPERT; }

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* ---- checkpoints: safetensors, GGUF or llm.c, by the file's first bytes ------------- */

typedef struct {
  stab_safetensors *st;
  stab_gguf *gg;
  stab_llmc *lc;
  stab_sharded *sh;          /* a directory or an index: every shard */
  stab_shard_index *siblings; /* st is one shard of the model this index describes, or NULL */
  stab_hf_config cfg;        /* config.json of the model's directory (all 0 / -1: none) */
} ckpt;

static size_t ck_count(const ckpt *c) {
  return c->sh ? stab_sharded_count(c->sh) : c->st ? stab_safetensors_count(c->st)
         : c->gg ? stab_gguf_count(c->gg) : stab_llmc_count(c->lc);
}
static const stab_ckpt_tensor *ck_tensor(const ckpt *c, size_t i) {
  return c->sh ? stab_sharded_tensor(c->sh, i) : c->st ? stab_safetensors_tensor(c->st, i)
         : c->gg ? stab_gguf_tensor(c->gg, i) : stab_llmc_tensor(c->lc, i);
}
static const stab_ckpt_tensor *ck_find(const ckpt *c, const char *name) {
  size_t i;
  stab_status st = c->sh ? stab_sharded_find(c->sh, name, &i)
                   : c->st ? stab_safetensors_find(c->st, name, &i)
                   : c->gg ? stab_gguf_find(c->gg, name, &i)
                           : stab_llmc_find(c->lc, name, &i);
  return st == STAB_OK ? ck_tensor(c, i) : NULL;
}
/* safetensors' __metadata__ (a sharded model's: its first shard's) */
static size_t ck_meta_count(const ckpt *c) {
  return c->sh ? stab_sharded_metadata_count(c->sh) : c->st ? stab_safetensors_metadata_count(c->st) : 0;
}
static void ck_meta(const ckpt *c, size_t i, const char **k, const char **v) {
  if (c->sh) stab_sharded_metadata(c->sh, i, k, v);
  else stab_safetensors_metadata(c->st, i, k, v);
}
/* Where t's bytes sit in the checkpoint as one sequence of bytes: its offset in its file, after
 * the earlier shards' bytes for a sharded model (their offsets restart in every shard). */
static uint64_t ck_place(const ckpt *c, const stab_ckpt_tensor *t) {
  size_t i;
  if (!c->sh || stab_sharded_find(c->sh, t->name, &i) != STAB_OK) return t->offset;
  uint64_t base = 0;
  for (size_t k = 0; k < stab_sharded_shard_of(c->sh, i); k++)
    base += stab_safetensors_file_size(stab_sharded_shard(c->sh, k));
  return base + t->offset;
}
static void ck_close(ckpt *c) {
  stab_safetensors_close(c->st);
  stab_gguf_close(c->gg);
  stab_llmc_close(c->lc);
  stab_sharded_close(c->sh);
  stab_shard_index_close(c->siblings);
  c->st = NULL, c->gg = NULL, c->lc = NULL, c->sh = NULL, c->siblings = NULL;
}

/* A GGUF metadata value as text: numbers and strings as they are (a long string cut, line
 * breaks shown as \n), arrays by element type and length. */
static void gguf_value_text(const stab_gguf_kv *kv, char *buf, size_t cap) {
  switch (kv->type) {
  case STAB_GGUF_STRING: {
    size_t o = 0;
    int cut = strlen(kv->s) < kv->len; /* a NUL inside ends the C string */
    for (const char *p = kv->s; *p; p++) {
      if (o + 6 >= cap) {
        cut = 1;
        break;
      }
      if (*p == '\n') buf[o++] = '\\', buf[o++] = 'n';
      else if ((unsigned char)*p < 0x20) buf[o++] = '?';
      else buf[o++] = *p;
    }
    if (cut) memcpy(buf + o, "...", 3), o += 3;
    buf[o] = '\0';
    break;
  }
  case STAB_GGUF_ARRAY:
    snprintf(buf, cap, "[%llu x %s]", (unsigned long long)kv->len,
             stab_gguf_value_type_name(kv->elem_type) ? stab_gguf_value_type_name(kv->elem_type) : "?");
    break;
  case STAB_GGUF_BOOL: snprintf(buf, cap, "%s", kv->u ? "true" : "false"); break;
  case STAB_GGUF_FLOAT32: case STAB_GGUF_FLOAT64: snprintf(buf, cap, "%.9g", kv->f); break;
  case STAB_GGUF_INT8: case STAB_GGUF_INT16: case STAB_GGUF_INT32: case STAB_GGUF_INT64:
    snprintf(buf, cap, "%lld", (long long)kv->i);
    break;
  default: snprintf(buf, cap, "%llu", (unsigned long long)kv->u); break;
  }
}

/* ---- reading weights as f32 -------------------------------------------------------- */

typedef struct {
  float *buf;
  size_t cap;
} f32buf;

static int little_endian(void) {
  const uint16_t one = 1;
  return *(const unsigned char *)&one == 1;
}

/* The tensor as f32: the mapping itself for aligned F32 on a little-endian host (no copy),
 * else converted into b block by block (grown to the largest tensor, reused). A converted
 * tensor's mapped pages are handed back as each block is converted (unless keep_mapped: a
 * tied head reads them next), so that the copy does not sit beside the whole tensor mapped:
 * an unaligned F32 tensor (a safetensors header whose length is not a multiple of 4) peaked
 * at twice its size, a BF16 one at three times the file's. NULL on failure with a message on
 * stderr. */
static const float *as_f32(const stab_ckpt_tensor *t, f32buf *b, int keep_mapped) {
  if (t->dtype == STAB_DTYPE_F32 && little_endian() && ((uintptr_t)t->data % sizeof(float)) == 0)
    return (const float *)(const void *)t->data;
  size_t n = (size_t)t->count;
  if (n > b->cap) {
    float *p = realloc(b->buf, n * sizeof *p);
    if (!p) {
      cli_error("out of memory converting '%s' (%zu floats)", t->name, n);
      return NULL;
    }
    b->buf = p, b->cap = n;
  }
  enum { BLOCK = 1 << 16 };
  const long page = sysconf(_SC_PAGESIZE);
  const unsigned char *released = t->data; /* pages before this are handed back */
  for (size_t i = 0; i < n; i += BLOCK) {
    size_t k = n - i < BLOCK ? n - i : BLOCK;
    if (stab_ckpt_read_f32(t, i, k, b->buf + i) != STAB_OK) {
      cli_error("%s", stab_last_error());
      return NULL;
    }
    /* a quantized tensor's blocks do not map to whole elements: handed back once, below */
    if (keep_mapped || page <= 0 || !t->elem_size) continue;
    /* from the last page boundary released up to the end of this block: whole pages only
     * (stab_ckpt_release rounds inwards), each page released once */
    const unsigned char *end = t->data + (i + k) * t->elem_size;
    stab_ckpt_tensor done = *t;
    done.data = released;
    done.count = (uint64_t)(end - released) / t->elem_size;
    stab_ckpt_release(&done);
    released = (const unsigned char *)((uintptr_t)end / (uintptr_t)page * (uintptr_t)page);
    if (released < t->data) released = t->data;
  }
  if (!keep_mapped && !t->elem_size) stab_ckpt_release(t);
  return b->buf;
}

/* How the library can read t where it is mapped: F32 (4-byte aligned), F16 or BF16 on a
 * little-endian host, the file's bytes being the host's 16-bit values; -1 when it must be
 * converted to f32 first (quantized, unaligned F32, a big-endian host). */
static int readable_in_place(const stab_ckpt_tensor *t) {
  if (!t || !little_endian()) return -1;
  if (t->dtype == STAB_DTYPE_F32) return (uintptr_t)t->data % sizeof(float) == 0 ? STAB_DTYPE_F32 : -1;
  if (t->dtype == STAB_DTYPE_F16 || t->dtype == STAB_DTYPE_BF16) return (int)t->dtype;
  return -1;
}

/* The dtype a layer made of t, bias and tk (either may be NULL) is handed to the library in:
 * t's own when all three are read in place in it (a layer has one dtype), else F32 (converted).
 * Reading BF16 where it is mapped is what keeps the probe's memory bounded: as f32, Llama-7B's
 * 32000 x 4096 embedding alone is a 524 MB copy per measuring thread. */
static stab_dtype layer_dtype(const stab_ckpt_tensor *t, const stab_ckpt_tensor *bias, const stab_ckpt_tensor *tk) {
  int d = readable_in_place(t);
  if (d < 0 || (bias && readable_in_place(bias) != d) || (tk && readable_in_place(tk) != d)) return STAB_DTYPE_F32;
  return (stab_dtype)d;
}

/* t as the library reads it in dtype (from layer_dtype): its mapping when dtype is t's own,
 * else as_f32's conversion. */
static const float *weights_as(const stab_ckpt_tensor *t, stab_dtype dtype, f32buf *b, int keep_mapped) {
  if (readable_in_place(t) == (int)dtype) return (const float *)(const void *)t->data;
  return as_f32(t, b, keep_mapped);
}

/* ---- the order of the rows (--sort, --top) and the summary ---------------------------- */

/* The value --sort METRIC orders by (SORT_FORWARD ...). */
static double sort_value(const row *r, int sort) {
  switch (sort) {
  case SORT_FORWARD: return r->m.forward;
  case SORT_DEPENDENCY: return r->m.dependency;
  case SORT_UPDATE: return r->m.update;
  case SORT_SIGMA: return r->m.sigma;
  case SORT_REL_UPDATE: return r->m.rel_update;
  case SORT_FORWARD_TIGHT: return r->m.forward_tight;
  case SORT_DEPENDENCY_TIGHT: return r->m.dependency_tight;
  case SORT_UPDATE_TIGHT: return r->m.update_tight;
  default: return NAN;
  }
}

static const row *order_rows; /* qsort's context for by_sort */
static int order_sort;

/* Largest first, a row without the value (NaN) after every row with one; ties (and --sort
 * name's equal names) in the checkpoint's order, so the order is the same on every run. */
static int by_sort(const void *pa, const void *pb) {
  size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
  if (order_sort == SORT_NAME) {
    int c = strcmp(order_rows[a].name, order_rows[b].name);
    if (c) return c;
  } else if (order_sort != SORT_FILE) {
    double x = sort_value(&order_rows[a], order_sort), y = sort_value(&order_rows[b], order_sort);
    if (isnan(x) != isnan(y)) return isnan(x) ? 1 : -1;
    if (x != y && !isnan(x)) return x > y ? -1 : 1;
  }
  return a < b ? -1 : a > b;
}

/* The measured rows in the order the report shows them (--sort), at most --top of them:
 * indices into rows, *count of them. NULL when out of memory. */
static size_t *report_order(const options *o, const row *rows, size_t n, size_t *count) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx), k = 0;
  if (!idx) return NULL;
  for (size_t i = 0; i < n; i++)
    if (rows[i].measured && (o->experts || !is_expert(&rows[i]))) idx[k++] = i;
  order_rows = rows, order_sort = o->sort;
  qsort(idx, k, sizeof *idx, by_sort);
  *count = o->top && o->top < k ? o->top : k;
  return idx;
}

/* The summary: per kind, the layer with the largest forward, dependency and update. */
static const stab_kind summary_kinds[] = {STAB_KIND_LINEAR, STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD,
                                          STAB_KIND_GAIN,   STAB_KIND_BIAS,      STAB_KIND_ATTENTION};
static const char *const summary_metrics[] = {"forward", "dependency", "update"};
enum { N_SUMMARY_KINDS = sizeof summary_kinds / sizeof summary_kinds[0], N_SUMMARY_METRICS = 3 };

/* The unit of a row's forward, dependency and update (docs/metrics.md): the LM head bounds a
 * loss, in nats; every other kind is an RMS ratio (the attention row bounds a logit). */
static const char *unit_of(stab_kind kind) { return kind == STAB_KIND_LM_HEAD ? "nats" : "1"; }

/* The row of that kind with the largest value of metric m (0 forward, 1 dependency, 2 update),
 * or SIZE_MAX when none has one: dependency is not defined for an embedding, a bias or the
 * attention logits, update not for the logits nor without --prev (has_update 0). A layer whose
 * weights (or update) hold NaN or Inf is the worst there is, its value NaN: a summary must not
 * hide it behind the finite ones. */
static size_t worst_row(const row *rows, size_t n, stab_kind kind, int m, int has_update) {
  if (m == 1 && (kind == STAB_KIND_EMBEDDING || kind == STAB_KIND_BIAS || kind == STAB_KIND_ATTENTION)) return SIZE_MAX;
  if (m == 2 && (kind == STAB_KIND_ATTENTION || !has_update)) return SIZE_MAX;
  size_t best = SIZE_MAX;
  double bv = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    const row *r = &rows[i];
    if (!r->measured || r->kind != kind || is_expert(r)) continue; /* the layer's row has its worst */
    double v = m == 0 ? r->m.forward : m == 1 ? r->m.dependency : r->m.update;
    unsigned broken = m == 2 ? STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE : STAB_FLAG_NONFINITE_WEIGHT;
    if (isnan(v) && (r->m.flags & broken)) return i;
    if (!isnan(v) && v > bv) bv = v, best = i;
  }
  return best;
}

/* ---- output ------------------------------------------------------------------------ */

/* s as a JSON string. The readers refuse names and keys that are not UTF-8, but a GGUF string
 * value is kept as the file has it (a tokenizer's can be any bytes): each byte that does not
 * start a valid UTF-8 sequence is written as U+FFFD, the replacement character every decoder
 * emits for bytes that are not text. JSON has no way to carry raw bytes, and the output must
 * stay valid JSON whatever the file holds. */
static void json_string(const char *s) {
  putchar('"');
  const size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    int len = stab_utf8_decode(s + i, n - i, NULL);
    if (len == 0) fputs("\\ufffd", stdout), len = 1;
    else if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c == '\n') fputs("\\n", stdout);
    else if (c == '\t') fputs("\\t", stdout);
    else if (c < 0x20 || c == 0x7f) printf("\\u%04x", c);
    else fwrite(s + i, 1, (size_t)len, stdout);
    i += (size_t)len;
  }
  putchar('"');
}

static void json_number(double x) {
  if (isfinite(x)) printf("%.17g", x);
  else fputs("null", stdout);
}

static const char *layout_name(const row *r) {
  if (r->kind == STAB_KIND_LINEAR || r->kind == STAB_KIND_ATTENTION)
    return r->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "out_major";
  return "rows";
}

/* A row's shape, outermost first, into dims (at most 3); the count of dimensions. A layer of HF
 * experts is its expert count and one expert's matrix; a 3-D expert tensor its own shape. */
static size_t row_shape(const row *r, uint64_t dims[3]) {
  size_t k = 0;
  if (is_expert_layer(r) && r->t->ndim == 2) dims[k++] = r->e->n_expert;
  for (size_t d = 0; d < r->t->ndim && k < 3; d++) dims[k++] = r->t->shape[d];
  return k;
}

/* The checkpoint's own metadata as a JSON object: safetensors' __metadata__ (strings), GGUF's
 * pairs (numbers, strings, booleans; an array as {"array": type, "length": n}), llm.c's header. */
static void print_json_metadata(const ckpt *f) {
  fputs("{", stdout);
  for (size_t i = 0; i < ck_meta_count(f); i++) {
    const char *k, *v;
    ck_meta(f, i, &k, &v);
    fputs(i ? ", " : "", stdout);
    json_string(k);
    fputs(": ", stdout);
    json_string(v);
  }
  for (size_t i = 0; f->gg && i < stab_gguf_metadata_count(f->gg); i++) {
    const stab_gguf_kv *kv = stab_gguf_metadata(f->gg, i);
    fputs(i ? ", " : "", stdout);
    json_string(kv->key);
    fputs(": ", stdout);
    switch (kv->type) {
    case STAB_GGUF_STRING: json_string(kv->s); break;
    case STAB_GGUF_BOOL: fputs(kv->u ? "true" : "false", stdout); break;
    case STAB_GGUF_ARRAY:
      printf("{\"array\": \"%s\", \"length\": %llu}",
             stab_gguf_value_type_name(kv->elem_type) ? stab_gguf_value_type_name(kv->elem_type) : "?",
             (unsigned long long)kv->len);
      break;
    case STAB_GGUF_FLOAT32: case STAB_GGUF_FLOAT64: json_number(kv->f); break;
    case STAB_GGUF_INT8: case STAB_GGUF_INT16: case STAB_GGUF_INT32: case STAB_GGUF_INT64:
      printf("%lld", (long long)kv->i);
      break;
    default: printf("%llu", (unsigned long long)kv->u); break;
    }
  }
  if (f->lc) {
    const stab_llmc_config *c = stab_llmc_config_of(f->lc);
    printf("\"version\": %d, \"max_seq_len\": %zu, \"vocab_size\": %zu, \"padded_vocab_size\": %zu, "
           "\"num_layers\": %zu, \"num_heads\": %zu, \"channels\": %zu", c->version, c->max_t, c->vocab,
           c->padded_vocab, c->layers, c->heads, c->channels);
  }
  fputs("}", stdout);
}

/* The message of a row in the errors: why it was not measured, or why it has no update. */
static void error_message(const row *r, char *buf, size_t cap) {
  if (r->error) snprintf(buf, cap, "%s", r->error);
  else snprintf(buf, cap, "no update: %s in the reference checkpoint", r->no_update);
}

static void print_json(const options *o, const ckpt *ck, const row *rows, size_t n, const size_t *order,
                       size_t count) {
  printf("{\"format\": \"stabmeter-probe\", \"format_version\": 2, \"checkpoint\": ");
  json_string(o->checkpoint);
  printf(", \"reference\": ");
  if (o->reference) json_string(o->reference);
  else fputs("null", stdout);
  if (o->step >= 0) {
    printf(", \"step\": %lld, \"step_source\": ", (long long)o->step);
    json_string(o->step_from);
  } else {
    fputs(", \"step\": null, \"step_source\": null", stdout);
  }
  printf(", \"sort\": \"%s\", \"top\": ", sort_names[o->sort]);
  if (o->top) printf("%zu", o->top);
  else fputs("null", stdout);
  printf(", \"metadata\": ");
  print_json_metadata(ck);
  printf(", \"layers\": [");
  for (size_t j = 0; j < count; j++) {
    const row *r = &rows[order[j]];
    const stab_metrics *m = &r->m;
    printf("%s\n  {\"name\": ", j ? "," : "");
    json_string(r->name);
    printf(", \"tensor\": ");
    json_string(r->t->name);
    printf(", \"kind\": \"%s\", \"unit\": \"%s\", \"shape\": [", stab_kind_name(r->kind), unit_of(r->kind));
    uint64_t dims[3];
    size_t nd = row_shape(r, dims);
    for (size_t d = 0; d < nd; d++) printf("%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    printf("], \"dtype\": \"%s\", \"layout\": \"%s\", \"d_in\": %zu, \"d_out\": %zu", r->t->dtype_name,
           layout_name(r), r->d_in, r->d_out);
    const struct { const char *k; double v; } vals[] = {
        {"forward", m->forward},           {"dependency", m->dependency},
        {"update", m->update},             {"sigma", m->sigma},
        {"sigma_rel_err", m->sigma_rel_err}, {"sigma_update", m->sigma_update},
        {"sigma_update_rel_err", m->sigma_update_rel_err}, {"rel_update", m->rel_update},
        {"forward_tight", m->forward_tight}, {"dependency_tight", m->dependency_tight},
        {"update_tight", m->update_tight}, {"spread", m->spread}};
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
      printf(", \"%s\": ", vals[k].k);
      json_number(vals[k].v);
    }
    printf(", \"passes\": %d, \"update_passes\": %d, \"tight_method\": \"%s\", \"bias\": ", m->passes,
           m->update_passes, m->tight_method == STAB_TIGHT_EXACT ? "exact" : m->tight_method == STAB_TIGHT_NONE ? "none" : "centred");
    if (r->bias) json_string(r->bias->name);
    else fputs("null", stdout);
    if (o->reference) { /* --prev: the tensor the update is against (another name across formats) */
      fputs(", \"reference_tensor\": ", stdout);
      if (r->prev_t) json_string(r->prev_t->name);
      else fputs("null", stdout);
      fputs(", \"reference_dtype\": ", stdout);
      if (r->prev_t) json_string(r->prev_t->dtype_name);
      else fputs("null", stdout);
    }
    if (r->kind == STAB_KIND_ATTENTION) {
      printf(", \"key_tensor\": ");
      json_string(r->tk->name);
      printf(", \"heads\": %zu, \"head_bounds\": [", r->heads);
      for (size_t h = 0; h < r->heads; h++) {
        if (h) fputs(", ", stdout);
        json_number(r->head_bounds[h]);
      }
      putchar(']');
    }
    if (is_expert_layer(r)) {
      printf(", \"experts\": %zu, \"worst_expert\": {", r->e->n_expert);
      for (size_t k = 0; k < N_EXPERT_METRICS; k++) {
        printf("%s\"%s\": ", k ? ", " : "", expert_metric_names[k]);
        if (r->worst[k] == STAB_MODEL_NO_EXPERT) fputs("null", stdout);
        else printf("%zu", r->worst[k]);
      }
      putchar('}');
    } else if (is_expert(r)) {
      printf(", \"expert\": %zu, \"expert_of\": ", r->e->expert);
      json_string(r->expert_of);
    }
    printf(", \"tied\": %s, \"flags\": [", r->tied ? "true" : "false");
    int f = 0;
    if (m->flags & STAB_FLAG_NONFINITE_WEIGHT) printf("%s\"nonfinite_weight\"", f++ ? ", " : "");
    if (m->flags & STAB_FLAG_NONFINITE_UPDATE) printf("%s\"nonfinite_update\"", f++ ? ", " : "");
    if (m->flags & STAB_FLAG_NOT_CONVERGED) printf("%s\"not_converged\"", f++ ? ", " : "");
    printf("]}");
  }
  /* the largest value per kind and metric, over every layer measured (--top aside) */
  printf("],\n \"summary\": {");
  int kinds = 0;
  for (size_t k = 0; k < N_SUMMARY_KINDS; k++) {
    int metrics = 0;
    for (int m = 0; m < N_SUMMARY_METRICS; m++) {
      size_t w = worst_row(rows, n, summary_kinds[k], m, o->reference != NULL);
      if (w == SIZE_MAX) continue;
      if (!metrics++) printf("%s\n  \"%s\": {", kinds++ ? "," : "", stab_kind_name(summary_kinds[k]));
      printf("%s\"%s\": {\"layer\": ", metrics > 1 ? ", " : "", summary_metrics[m]);
      json_string(rows[w].name);
      printf(", \"value\": ");
      json_number(m == 0 ? rows[w].m.forward : m == 1 ? rows[w].m.dependency : rows[w].m.update);
      printf(", \"unit\": \"%s\"", unit_of(summary_kinds[k]));
      if (is_expert_layer(&rows[w]) && rows[w].worst[m] != STAB_MODEL_NO_EXPERT) printf(", \"expert\": %zu", rows[w].worst[m]);
      putchar('}');
    }
    if (metrics) putchar('}');
  }
  printf("},\n \"errors\": [");
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].error && !rows[i].no_update) continue;
    char why[1024];
    error_message(&rows[i], why, sizeof why);
    printf("%s\n  {\"name\": ", first ? "" : ",");
    first = 0;
    json_string(rows[i].name);
    printf(", \"message\": ");
    json_string(why);
    printf("}");
  }
  printf("]}\n");
}

static void fmt_num(char *buf, size_t cap, double x) {
  if (isnan(x)) snprintf(buf, cap, "-");
  else snprintf(buf, cap, "%.5g", x);
}

/* 1 for the code points a terminal acts on or that reorder the text around them: C1 controls
 * (U+0080..U+009F: CSI, OSC ...), the bidirectional marks, embeddings, overrides and isolates
 * (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069), and the line and paragraph
 * separators. A name holding U+202E would show its tail reversed, and so misname the layer. */
static int hidden_code_point(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

/* s as the table shows it: control bytes (a terminal would act on them, e.g. ESC) and bytes
 * that are not UTF-8 as \xNN, the code points above as \uNNNN; truncated to fit buf. Names and
 * metadata come from the file, so they are not trusted. */
static const char *shown(const char *s, char *buf, size_t cap) {
  size_t k = 0, i = 0, n = strlen(s);
  while (i < n && k + 7 < cap) {
    const unsigned char c = (unsigned char)s[i];
    uint32_t cp = 0;
    int len = stab_utf8_decode(s + i, n - i, &cp);
    if (len == 0 || c < 0x20 || c == 0x7f) {
      k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
      len = 1;
    } else if (hidden_code_point(cp)) {
      k += (size_t)snprintf(buf + k, cap - k, "\\u%04X", (unsigned)cp);
    } else {
      memcpy(buf + k, s + i, (size_t)len);
      k += (size_t)len;
    }
    i += (size_t)len;
  }
  buf[k] = 0;
  return buf;
}

static void print_table(const options *o, const ckpt *f, const row *rows, size_t n, const size_t *order,
                        size_t count) {
  printf("checkpoint %s%s%s\n", o->checkpoint, o->reference ? ", update against " : "",
         o->reference ? o->reference : "");
  for (size_t i = 0; i < ck_meta_count(f); i++) {
    const char *k, *v;
    char sk[256], sv[1024];
    ck_meta(f, i, &k, &v);
    printf("metadata %s = %s\n", shown(k, sk, sizeof sk), shown(v, sv, sizeof sv));
  }
  for (size_t i = 0; f->gg && i < stab_gguf_metadata_count(f->gg); i++) {
    const stab_gguf_kv *kv = stab_gguf_metadata(f->gg, i);
    char v[128];
    char sk[256], sv[512];
    gguf_value_text(kv, v, sizeof v);
    printf("metadata %s = %s\n", shown(kv->key, sk, sizeof sk), shown(v, sv, sizeof sv));
  }
  if (f->lc) {
    const stab_llmc_config *c = stab_llmc_config_of(f->lc);
    printf("llm.c checkpoint version %d (%s): max_seq_len %zu, vocab %zu (padded %zu, padding rows left out), "
           "layers %zu, heads %zu, channels %zu\n", c->version, c->version == 5 ? "bf16" : "f32", c->max_t, c->vocab,
           c->padded_vocab, c->layers, c->heads, c->channels);
  }
  if (o->step >= 0) printf("step %lld, from %s\n", (long long)o->step, o->step_from);
  if (o->sort != SORT_FILE || o->top) {
    size_t measured = 0;
    for (size_t i = 0; i < n; i++) measured += rows[i].measured && (o->experts || !is_expert(&rows[i]));
    printf("%zu of %zu layers, %s%s%s\n", count, measured,
           o->sort == SORT_FILE ? "in the checkpoint's order" : o->sort == SORT_NAME ? "by name" : "by ",
           o->sort > SORT_NAME ? sort_names[o->sort] : "", o->sort > SORT_NAME ? ", largest first" : "");
  }
  int w = 5;
  for (size_t j = 0; j < count; j++)
    if ((int)strlen(rows[order[j]].name) + (o->per_head ? 8 : 0) > w)
      w = (int)strlen(rows[order[j]].name) + (o->per_head ? 8 : 0);
  printf("\n%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  %s\n", w, "layer", "kind", "shape", "dtype", "forward",
         "dependency", "update", "sigma", "rel_err", "notes");
  for (size_t j = 0; j < count; j++) {
    const row *r = &rows[order[j]];
    char shape[48], a[4][24], e[24], notes[700] = "", name[1024];
    uint64_t dims[3];
    size_t nd = r->t->ndim >= 2 ? row_shape(r, dims) : 0;
    if (nd) {
      size_t k = 0;
      for (size_t d = 0; d < nd; d++) k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%llu", d ? "x" : "", (unsigned long long)dims[d]);
    } else {
      snprintf(shape, sizeof shape, "%llu", (unsigned long long)r->t->count);
    }
    fmt_num(a[0], sizeof a[0], r->m.forward);
    fmt_num(a[1], sizeof a[1], r->m.dependency);
    fmt_num(a[2], sizeof a[2], r->m.update);
    fmt_num(a[3], sizeof a[3], r->m.sigma);
    if (isnan(r->m.sigma_rel_err)) snprintf(e, sizeof e, "-");
    else snprintf(e, sizeof e, "%.1e", r->m.sigma_rel_err);
    if (r->layout == STAB_LAYOUT_IN_MAJOR && r->kind == STAB_KIND_LINEAR) strcat(notes, "in-major ");
    if (r->tied) {
      char tn[600];
      size_t k = strlen(notes);
      snprintf(notes + k, sizeof notes - k, "tied to %s ", shown(r->t->name, tn, sizeof tn));
    }
    if (r->bias) strcat(notes, "+bias ");
    if (is_expert_layer(r)) {
      size_t k = strlen(notes);
      k += (size_t)snprintf(notes + k, sizeof notes - k, "%zu experts, worst:", r->e->n_expert);
      for (size_t x = 0; x < EXPERT_REL_UPDATE && k < sizeof notes; x++)
        if (r->worst[x] != STAB_MODEL_NO_EXPERT)
          k += (size_t)snprintf(notes + k, sizeof notes - k, " %s %zu", expert_metric_names[x], r->worst[x]);
      if (k < sizeof notes - 1) strcat(notes, " ");
    } else if (is_expert(r)) {
      char gn[600];
      size_t k = strlen(notes);
      snprintf(notes + k, sizeof notes - k, "expert %zu of %s ", r->e->expert, shown(r->expert_of, gn, sizeof gn));
    }
    /* across formats: what the update is against, when its name or type differs */
    if (r->prev_t && (strcmp(r->prev_t->name, r->t->name) || strcmp(r->prev_t->dtype_name, r->t->dtype_name))) {
      char pn[600];
      size_t k = strlen(notes);
      snprintf(notes + k, sizeof notes - k, "vs %s %s ", shown(r->prev_t->name, pn, sizeof pn), r->prev_t->dtype_name);
    }
    if (r->m.flags & STAB_FLAG_NONFINITE_WEIGHT) strcat(notes, "NONFINITE-WEIGHT ");
    if (r->m.flags & STAB_FLAG_NONFINITE_UPDATE) strcat(notes, "NONFINITE-UPDATE ");
    if (r->m.flags & STAB_FLAG_NOT_CONVERGED) strcat(notes, "not-converged ");
    if (r->kind == STAB_KIND_ATTENTION) {
      size_t k = strlen(notes);
      if (r->kv_heads != r->heads) snprintf(notes + k, sizeof notes - k, "%zu heads, %zu key heads ", r->heads, r->kv_heads);
      else snprintf(notes + k, sizeof notes - k, "%zu heads ", r->heads);
    }
    printf("%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  %s\n", w, shown(r->name, name, sizeof name),
           stab_kind_name(r->kind), shape, r->t->dtype_name, a[0], a[1], a[2], a[3], e, notes);
    for (size_t h = 0; o->per_head && r->kind == STAB_KIND_ATTENTION && h < r->heads; h++) {
      char hn[1100], b[24], hs[48];
      snprintf(hn, sizeof hn, "%s.head%zu", name, h);
      snprintf(hs, sizeof hs, "%zux%zu", r->d_out / r->heads, r->d_in);
      fmt_num(b, sizeof b, r->head_bounds[h]);
      printf("%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  key head %zu\n", w, hn, "attention", hs,
             r->t->dtype_name, b, "-", "-", "-", "-", h / (r->heads / r->kv_heads));
    }
  }
  /* the largest value per kind and metric, over every layer measured (--top aside) */
  int any = 0;
  for (size_t k = 0; k < N_SUMMARY_KINDS; k++)
    for (int m = 0; m < N_SUMMARY_METRICS; m++) {
      size_t i = worst_row(rows, n, summary_kinds[k], m, o->reference != NULL);
      if (i == SIZE_MAX) continue;
      char v[24], name[1024];
      double x = m == 0 ? rows[i].m.forward : m == 1 ? rows[i].m.dependency : rows[i].m.update;
      if (!any++) printf("\nlargest per kind and metric:\n");
      if (isnan(x)) snprintf(v, sizeof v, "NaN");
      else fmt_num(v, sizeof v, x);
      char which[48] = "";
      if (is_expert_layer(&rows[i]) && rows[i].worst[m] != STAB_MODEL_NO_EXPERT)
        snprintf(which, sizeof which, " (expert %zu)", rows[i].worst[m]);
      printf("  %-9s  %-10s  %11s %-4s  %s%s%s\n", stab_kind_name(summary_kinds[k]), summary_metrics[m], v,
             unit_of(summary_kinds[k]), shown(rows[i].name, name, sizeof name), which,
             isnan(x) ? " (non-finite weights)" : "");
    }
  if (count)
    printf("\nunits: forward, dependency, update: RMS ratio (1), nats for lm_head rows; sigma: spectral norm of the "
           "stored matrix (1); rel_err: relative (1). Definitions: docs/metrics.md\n");
  any = 0;
  for (size_t i = 0; i < n; i++)
    if (rows[i].error || rows[i].no_update) {
      if (!any++) printf("\nnot measured%s:\n", o->reference ? " (or without an update)" : "");
      char name[1024], why[1024], msg[1024];
      error_message(&rows[i], msg, sizeof msg);
      printf("  %s: %s\n", shown(rows[i].name, name, sizeof name), shown(msg, why, sizeof why));
    }
}

/* ---- the model: the library's kind rules over the checkpoint's tensors --------------- */

#define MAX_HEADS STAB_MODEL_MAX_HEADS

/* 1 when s is a whole number in [lo, hi] written in decimal digits alone (no sign, no blanks,
 * no base prefix: strtoull would take "-1" as 18446744073709551615), into *v. */
static int whole_number(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *v) {
  if (!s || *s < '0' || *s > '9') return 0;
  unsigned long long x = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned d = (unsigned)(*s - '0');
    if (x > (ULLONG_MAX - d) / 10) return 0;
    x = x * 10 + d;
  }
  if (*s || x < lo || x > hi) return 0;
  *v = x;
  return 1;
}

/* The model of checkpoint f by the library's rules, with the user's overrides and head count and
 * what the file's metadata says (--heads first, then the GGUF metadata, the llm.c header, the
 * safetensors __metadata__, config.json), and one row per entry into *rows (n_rows of them).
 * Sets o->out_major_file. 0, or 1 after a message. */
static int describe(options *o, const ckpt *f, stab_model **model, row **rows, size_t *n_rows) {
  static char heads_error[320];
  stab_model_config cfg = stab_model_default_config();
  size_t nt = ck_count(f);
  const stab_ckpt_tensor **ts = malloc((nt ? nt : 1) * sizeof *ts);
  stab_model_override *ov = malloc((o->nkinds + o->nlayouts + 1) * sizeof *ov);
  if (!ts || !ov) {
    free(ts), free(ov);
    cli_error("out of memory");
    return 1;
  }
  for (size_t i = 0; i < nt; i++) ts[i] = ck_tensor(f, i);
  for (size_t i = 0; i < o->nkinds; i++) ov[i].glob = o->kinds[i].glob, ov[i].value = o->kinds[i].value;
  for (size_t i = 0; i < o->nlayouts; i++)
    ov[o->nkinds + i].glob = o->layouts[i].glob, ov[o->nkinds + i].value = o->layouts[i].value;
  cfg.kinds = ov, cfg.nkinds = o->nkinds;
  cfg.layouts = ov + o->nkinds, cfg.nlayouts = o->nlayouts;
  if (o->heads) cfg.heads = o->heads, cfg.heads_source = "--heads";
  stab_status st = STAB_OK;
  if (f->lc) {
    /* llm.c's header says its head count (--heads does not change it) */
    cfg.naming = STAB_NAMING_LLMC;
    cfg.heads = stab_llmc_config_of(f->lc)->heads, cfg.heads_source = "the llm.c header";
  } else if (f->gg) {
    st = stab_model_config_from_gguf(f->gg, &cfg);
  } else {
    /* a sharded model's metadata is its first shard's; config.json (read and checked when the
     * checkpoint was opened) after __metadata__, and its tie_word_embeddings */
    st = stab_model_config_from_safetensors(f->sh ? stab_sharded_shard(f->sh, 0) : f->st, &cfg);
    if (st == STAB_OK) st = stab_model_config_from_hf(&f->cfg, &cfg);
    else cfg.tie = f->cfg.tie_word_embeddings;
  }
  if (st != STAB_OK) { /* an invalid count in the metadata: the attention rows say why */
    snprintf(heads_error, sizeof heads_error, "%s", stab_last_error());
    cfg.heads_error = heads_error;
  }
  o->out_major_file = cfg.out_major;
  /* one shard of a model given alone: the names of the other shards' tensors (for the head) */
  size_t n_other = 0;
  const char **other = NULL;
  if (f->siblings && !(other = malloc((stab_shard_index_count(f->siblings) + 1) * sizeof *other))) {
    free(ts), free(ov);
    cli_error("out of memory");
    return 1;
  }
  for (size_t i = 0; f->siblings && i < stab_shard_index_count(f->siblings); i++) {
    const char *name = stab_shard_index_tensor(f->siblings, i, NULL);
    if (name && !ck_find(f, name)) other[n_other++] = name;
  }
  cfg.other_names = other, cfg.n_other = n_other;
  st = stab_model_describe(ts, nt, &cfg, model);
  free(ts), free(ov), free(other);
  if (st != STAB_OK) {
    cli_error("%s", stab_last_error());
    return 1;
  }
  /* config.json says the head is not the embedding: with no head tensor, the head is missing */
  if (cfg.tie == 0 && !stab_model_has_head(*model))
    cli_error("warning: config.json says tie_word_embeddings false, but the checkpoint has no lm_head tensor: "
              "the head is missing, and no tied head is reported");
  size_t n = stab_model_count(*model);
  if (!(*rows = calloc(n ? n : 1, sizeof **rows))) {
    cli_error("out of memory");
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = stab_model_entry_at(*model, i);
    row *r = &(*rows)[i];
    r->e = e;
    r->t = e->weight, r->bias = e->bias, r->tk = e->weight_k;
    r->name = e->name, r->error = e->why_not;
    r->kind = e->kind, r->layout = e->layout, r->d_in = e->d_in, r->d_out = e->d_out;
    r->heads = e->heads, r->kv_heads = e->kv_heads;
    r->ld = e->ld, r->q_off = e->q_off, r->k_off = e->k_off;
    r->tied = e->tied;
    r->expert_of = e->expert != STAB_MODEL_NO_EXPERT ? stab_model_entry_at(*model, e->group)->name : NULL;
    for (size_t k = 0; k < N_EXPERT_METRICS; k++) r->worst[k] = STAB_MODEL_NO_EXPERT;
    if (e->kind == STAB_KIND_ATTENTION && !e->why_not && !(r->head_bounds = calloc(e->heads, sizeof *r->head_bounds))) {
      *n_rows = i;
      cli_error("out of memory");
      return 1;
    }
  }
  *n_rows = n;
  return 0;
}

/* The logit bounds of attention row r, from q and k stored as dtype: the library's attention
 * metrics of the entry's layer (grouped-query heads included: .kv_heads). */
static stab_status measure_attention(row *r, const float *q, const float *k, stab_dtype dtype,
                                     const stab_metrics_params *mp) {
  stab_layer L;
  stab_status st = stab_model_entry_layer(r->e, dtype, q, NULL, k, &L);
  if (st != STAB_OK) return st;
  return stab_layer_metrics(&L, NULL, mp, &r->m, r->head_bounds);
}

/* ---- the trace (--hdf5) ------------------------------------------------------------ */

/* The step in a checkpoint's file name: "step" (any case) followed by an optional '-', '_'
 * or '.' and digits, the last such in the name (step-000100.safetensors, as harness/train
 * names them); else digits after a '_' or '-' that end the name before its extension (llm.c's
 * model_00005000.bin). -1 if neither. */
static int64_t step_from_name(const char *path) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int64_t step = -1;
  for (const char *p = base; *p; p++) {
    if (strncasecmp(p, "step", 4)) continue;
    const char *q = p + 4;
    if (*q == '-' || *q == '_' || *q == '.') q++;
    int64_t v = 0;
    int digits = 0;
    while (*q >= '0' && *q <= '9' && digits < 18) v = v * 10 + (*q++ - '0'), digits++;
    if (digits && !(*q >= '0' && *q <= '9')) step = v;
  }
  if (step >= 0) return step;
  size_t stem = strcspn(base, ".");
  size_t k = stem;
  while (k > 0 && base[k - 1] >= '0' && base[k - 1] <= '9') k--;
  if (k == stem || stem - k > 18 || k == 0 || (base[k - 1] != '_' && base[k - 1] != '-')) return -1;
  for (step = 0; k < stem; k++) step = step * 10 + (base[k] - '0');
  return step;
}

/* A row's sizes as stab_layer takes them. The row keeps d_in and d_out in its kind's math (the
 * report prints them); a table is registered by what it is, its V vectors (vocab) of width d. */
static void set_layer_sizes(stab_layer *L, const row *r) {
  if (r->kind == STAB_KIND_EMBEDDING || r->kind == STAB_KIND_LM_HEAD) {
    L->vocab = r->kind == STAB_KIND_EMBEDDING ? r->d_in : r->d_out;
    L->width = r->kind == STAB_KIND_EMBEDDING ? r->d_out : r->d_in;
  } else {
    L->d_in = r->d_in;
    L->d_out = r->d_out;
  }
}

/* Appends one step holding every measured row to the trace at o->hdf5 (created if missing):
 * a monitor with the rows as its layers carries the metrics to stab_trace_append, under the
 * rows' names (layer_names: a trace's names, unique). 0, or 2 for a trace that does
 * not match these layers or names that clash, another writer holds, or whose last step is not
 * before this one; 1 for other failures, with a message. */
/* Addresses standing for where each tensor sits in the checkpoint file, for the trace's record of
 * shared storage: the library finds which layers share storage (param_count_unique,
 * shares_storage_with) from the addresses they are registered with, and the probe measures from
 * buffers it reuses, so it registers each tensor at the address of its place in the file
 * instead, in a reservation that is never read or written (PROT_NONE): one float per byte of
 * the file. Tensors with disjoint bytes get disjoint ranges (a tensor of count elements of at
 * least one byte each spans at most its bytes' range); a tied head is its embedding's tensor,
 * an attention row reads inside its q and k tensors, so theirs overlap as their storage does. */
typedef struct {
  void *base;
  size_t bytes;
  const ckpt *ck; /* the places are its (ck_place: the shards one after another) */
} file_space;

static int file_space_reserve(file_space *fs, const ckpt *ck, const row *rows, size_t n) {
  uint64_t end = 0;
  fs->ck = ck;
  for (size_t i = 0; i < n; i++) {
    const stab_ckpt_tensor *ts[] = {rows[i].t, rows[i].bias, rows[i].tk};
    for (size_t k = 0; k < 3; k++)
      if (ts[k] && ck_place(ck, ts[k]) + ts[k]->count > end) end = ck_place(ck, ts[k]) + ts[k]->count;
  }
  fs->bytes = (size_t)(end ? end : 1) * sizeof(float);
  fs->base = mmap(NULL, fs->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return fs->base != MAP_FAILED;
}

static const float *file_address(const file_space *fs, const stab_ckpt_tensor *t, size_t elem_offset) {
  return t ? (const float *)fs->base + ck_place(fs->ck, t) + elem_offset : NULL;
}

static int write_trace(const options *o, const ckpt *ck, const row *rows, size_t n, int64_t step) {
  file_space fs;
  if (!file_space_reserve(&fs, ck, rows, n)) {
    cli_error("%s: cannot reserve address space for the trace's layers: %s", o->hdf5, strerror(errno));
    return 1;
  }
  stab_monitor_params mp = stab_monitor_default_params();
  mp.update_mode = STAB_UPDATE_NONE;
  stab_monitor *m = NULL;
  stab_trace *t = NULL;
  int rc = 0;
  stab_status st = stab_monitor_create(&mp, &m);
  for (size_t i = 0; i < n && st == STAB_OK; i++) {
    const row *r = &rows[i];
    /* a layer of experts is the report's; a trainer registers each expert, as the rows here */
    if (!r->measured || is_expert_layer(r)) continue;
    int attention = r->kind == STAB_KIND_ATTENTION;
    stab_layer L = {.name = r->name, .kind = r->kind, .heads = r->heads, .kv_heads = attention ? r->kv_heads : 0,
                    .weight = file_address(&fs, r->t, attention ? r->q_off : 0),
                    .weight_k = attention ? file_address(&fs, r->tk, r->k_off) : NULL,
                    .bias = r->kind == STAB_KIND_LINEAR ? file_address(&fs, r->bias, 0) : NULL,
                    .ld = attention ? r->ld : 0,
                    .layout = r->kind == STAB_KIND_LINEAR || attention ? r->layout : STAB_LAYOUT_NATURAL};
    set_layer_sizes(&L, r);
    size_t idx;
    if ((st = stab_monitor_add_layer(m, &L, &idx)) == STAB_OK) st = stab_monitor_set_metrics(m, idx, &r->m, r->head_bounds);
  }
  char config[512];
  snprintf(config, sizeof config, "{\"producer\": \"stabmeter-probe %s\", \"tol\": %g, \"exact\": %s, \"tight\": \"%s\"}",
           stab_version(), o->tol, o->exact ? "true" : "false",
           o->tight == STAB_TIGHT_EXACT ? "exact" : o->tight == STAB_TIGHT_NONE ? "none" : "centred");
  stab_trace_params tp = stab_trace_default_params();
  tp.append = 1;
  tp.run_config = config;
  if (st == STAB_OK) st = stab_trace_open(o->hdf5, m, &tp, &t);
  /* no wall time for a checkpoint on disk: NaN, as the schema has it for a missing value */
  if (st == STAB_OK) st = stab_trace_append(t, step, NAN, NULL, NULL);
  if (st == STAB_OK) st = stab_trace_close(t);
  else stab_trace_close(t);
  if (st != STAB_OK) {
    cli_error("%s: %s", o->hdf5, stab_last_error());
    /* another writer holds the trace, or it does not fit: a step not after its last, other layers */
    rc = st == STAB_EINVAL || st == STAB_EEXIST || st == STAB_EBUSY || st == STAB_ERANGE ? 2 : 1;
  }
  stab_monitor_free(m);
  munmap(fs.base, fs.bytes);
  return rc;
}

/* ---- options ----------------------------------------------------------------------- */

static void usage(void) {
  printf("Usage: stabmeter-probe [OPTION]... CHECKPOINT\n"
         "Stability metrics of every layer of a checkpoint: safetensors (a file, or a Hugging Face\n"
         "model directory or its model.safetensors.index.json: every shard as one model, heads and\n"
         "the tied head from its config.json), GGUF v2/v3 (F32, F16, BF16,\n"
         "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, IQ4_NL, IQ4_XS tensors, dequantized as ggml does;\n"
         "other quantized types listed as unsupported), or llm.c GPT-2 (magic 20240326, f32 or bf16;\n"
         "fused qkv split into q, k, v plus each block's attention logit bound h.N.attn.logits; wte\n"
         "reported as embedding and as the tied lm_head, padding rows left out). Definitions and units:\n"
         "docs/metrics.md (installed as " STAB_DOCDIR "/metrics.md).\n\n"
         "Options:\n"
         "  --prev OLDER        also the update metrics against OLDER (tensors matched by name and\n"
         "                      shape); exit 2 when no tensor matches, a warning naming the layers\n"
         "                      without a counterpart when some do not. A GGUF file against the\n"
         "                      safetensors it was converted from (or the reverse): llama.cpp's\n"
         "                      names mapped (llama, qwen2, gemma, phi3, gpt2), its q/k row order\n"
         "                      and Conv1D transposes undone, so update is the quantization error\n"
         "  --json              the probe report as JSON instead of the table\n"
         "  --sort METRIC       rows by METRIC, largest first: forward, dependency, update, sigma,\n"
         "                      rel_update, forward_tight, dependency_tight, update_tight; or file\n"
         "                      (the checkpoint's order, the default) or name; a layer without the\n"
         "                      value comes last\n"
         "  --top N             only the first N rows of that order (alone: the N largest forward)\n"
         "  --tol X             relative tolerance of each spectral norm, 1e-12 to 0.5 (default 1e-3)\n"
         "  --exact             spectral norms by LAPACK SVD in f64 (slow; the reference)\n"
         "  --tight M           LM-head tight bound: centred (default, O(V d)), exact (all pairs,\n"
         "                      O(V^2 d)) or none\n"
         "  --filter GLOB       only layers whose name, or the name of a tensor they read, matches\n"
         "                      (repeatable; exit 2 when one matches nothing)\n"
         "  --kind GLOB=KIND    force the kind of tensors whose name matches: linear, embedding,\n"
         "                      lm_head, gain, bias or skip\n"
         "  --layout GLOB=L     force a linear layout: in_major or out_major\n"
         "  --hdf5 FILE         also append the results to the trace FILE (created if missing) as one\n"
         "                      step: probing a series of checkpoints builds a trace\n"
         "  --step N            that step's number (default: the checkpoint's metadata, i.e.\n"
         "                      safetensors __metadata__ step or global_step, steps of\n"
         "                      stabmeter-train, GGUF training.iteration_count; else the file name,\n"
         "                      e.g. step-000100.* or model_00000100.bin)\n"
         "  --heads H           attention heads, for the logit bounds of query/key pairs (default:\n"
         "                      GGUF metadata, safetensors __metadata__, or config.json beside the file)\n"
         "  --per-head          a table row per attention head (the JSON always has head_bounds)\n"
         "  --experts           a row per expert too (table and JSON), beside its layer's row, which\n"
         "                      has the worst expert per metric and its index\n"
         "  --quiet             no progress on stderr\n"
         "  -h, --help          this text\n"
         "  -V, --version       the version\n\n"
         "Layers are named as stabmeter-train's trace names them, so a report and a trace join\n"
         "without renaming: a tensor's name without its trailing .weight (a bias that stands alone\n"
         "keeps .bias); attention logit bounds X.logits; a tied head lm_head.\n"
         "Kinds by name and shape (first match): 2-D *wte, wpe, embed_tokens, tok_embeddings,\n"
         "token_embd, word_embeddings, position_embd, ...* embedding; *lm_head, output, embed_out*\n"
         "lm_head; other 2-D linear, out-major except HF GPT-2 Conv1D h.N.{attn.c_attn,attn.c_proj,\n"
         "mlp.c_fc,mlp.c_proj} in Conv1D's shape (in-major; c_attn [d][3d], c_fc wider than tall,\n"
         "mlp.c_proj taller than wide); 1-D X.bias with a linear X.weight folded into it; 1-D\n"
         "*norm*/ln* weights gain, their .bias bias; other 1-D .bias bias. Experts: 3-D *_exps\n"
         "(GGUF [n_expert][rows][cols]) and HF X.experts.E.Y linears are a layer of experts each.\n"
         "Integer dtypes, scalars and other 3-D+ tensors are listed as not measured. With no\n"
         "lm_head tensor in the model, the token embedding is reported also as lm_head (tied),\n"
         "unless config.json says tie_word_embeddings false.\n"
         "The table ends with the largest value of each metric per kind and its layer, and the\n"
         "units: RMS ratio (1) for every kind but lm_head, whose values are in nats.\n\n"
         "Across ranks (built with configure --with-mpi): mpirun -np P stabmeter-probe CHECKPOINT\n"
         "[OPTION]... splits the checkpoint's tensors among the P ranks (by bytes times expected\n"
         "work, from the headers alone; a query/key pair, a tied head, a fused qkv and a layer's\n"
         "experts stay on one rank), each rank reading only its own tensors' bytes; rank 0 prints\n"
         "the report, the same bytes as one process prints, and every rank exits with its status.\n"
         "Progress and warnings come from rank 0 only. Run without mpirun, the probe is one process.\n"
         "STAB_PROBE_SHOW_READS=1 in the environment prints on stderr the byte ranges each rank reads\n"
         "and, on more than one rank, makes the other ranks' pages unreadable to prove it.\n\n"
         "Exit status: 0 success, 1 failure, 2 bad usage or bad input (a malformed or unreadable\n"
         "checkpoint, a --filter or --prev that matches nothing).\n");
}

static int add_override(override **list, size_t *n, const char *arg, const char *opt, const char *const *allowed) {
  const char *eq = strrchr(arg, '=');
  size_t i = 0;
  while (eq && allowed[i] && strcmp(allowed[i], eq + 1)) i++;
  if (!eq || eq == arg || !allowed[i]) { /* the whole argument quoted: GLOB=VALUE is one value */
    char want[160] = "GLOB=VALUE, VALUE one of";
    for (size_t k = 0; allowed[k]; k++)
      snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", k ? ", " : " ", allowed[k]);
    return cli_bad_value(opt, arg, want);
  }
  override *p = realloc(*list, (*n + 1) * sizeof *p);
  char *g = strndup(arg, (size_t)(eq - arg));
  if (!p || !g) {
    free(g);
    if (p) *list = p;
    cli_error("out of memory");
    return CLI_FAILED;
  }
  *list = p;
  p[*n].glob = g;
  snprintf(p[*n].value, sizeof p[*n].value, "%s", eq + 1);
  (*n)++;
  return 0;
}

static int parse(int argc, char **argv, options *o) {
  enum { O_PREV = 256, O_JSON, O_TOL, O_EXACT, O_TIGHT, O_FILTER, O_KIND, O_LAYOUT, O_QUIET, O_HDF5, O_STEP,
         O_HEADS, O_PER_HEAD, O_SORT, O_TOP, O_EXPERTS };
  static const struct option longs[] = {
      {"prev", required_argument, 0, O_PREV},   {"json", no_argument, 0, O_JSON},
      {"tol", required_argument, 0, O_TOL},     {"exact", no_argument, 0, O_EXACT},
      {"tight", required_argument, 0, O_TIGHT}, {"filter", required_argument, 0, O_FILTER},
      {"kind", required_argument, 0, O_KIND},   {"layout", required_argument, 0, O_LAYOUT},
      {"quiet", no_argument, 0, O_QUIET},       {"help", no_argument, 0, 'h'},
      {"hdf5", required_argument, 0, O_HDF5},   {"step", required_argument, 0, O_STEP},
      {"heads", required_argument, 0, O_HEADS}, {"per-head", no_argument, 0, O_PER_HEAD},
      {"sort", required_argument, 0, O_SORT},   {"top", required_argument, 0, O_TOP},
      {"experts", no_argument, 0, O_EXPERTS},   {"version", no_argument, 0, 'V'},
      {0, 0, 0, 0}};
  static const char *const kinds[] = {"linear", "embedding", "lm_head", "gain", "bias", "skip", NULL};
  static const char *const layouts[] = {"in_major", "out_major", NULL};
  static const char *const tights[] = {"centred", "exact", "none", NULL};
  static const stab_tight_method tight_of[] = {STAB_TIGHT_CENTRED, STAB_TIGHT_EXACT, STAB_TIGHT_NONE};
  memset(o, 0, sizeof *o);
  o->tol = 1e-3;
  o->step = -1;
  o->sort = SORT_FILE;
  int c, rc, sort_given = 0;
  unsigned long long v;
  while ((c = getopt_long(argc, argv, CLI_SHORTOPTS, longs, NULL)) != -1) {
    switch (c) {
    case O_PREV: o->reference = optarg; break;
    case O_JSON: o->json = 1; break;
    case O_HDF5: o->hdf5 = optarg; break;
    case O_PER_HEAD: o->per_head = 1; break;
    case O_EXPERTS: o->experts = 1; break;
    case O_HEADS:
      if ((rc = cli_whole("--heads", optarg, 1, MAX_HEADS, &v))) return rc;
      o->heads = (size_t)v;
      break;
    case O_STEP:
      if ((rc = cli_whole("--step", optarg, 0, INT64_MAX, &v))) return rc;
      o->step = (int64_t)v;
      o->step_from = "--step";
      break;
    case O_SORT:
      if ((rc = cli_choice("--sort", optarg, sort_names, &o->sort))) return rc;
      sort_given = 1;
      break;
    case O_TOP:
      if ((rc = cli_whole("--top", optarg, 1, SIZE_MAX, &v))) return rc;
      o->top = (size_t)v;
      break;
    case O_QUIET: o->quiet = 1; break;
    case O_EXACT: o->exact = 1; break;
    case O_TOL:
      /* the library's own bounds: below STAB_SPECTRAL_TOL_MIN every layer would only run out
       * of passes and be reported not converged */
      if ((rc = cli_real("--tol", optarg, STAB_SPECTRAL_TOL_MIN, 0, 0.5, 1, &o->tol))) return rc;
      break;
    case O_TIGHT: {
      int i;
      if ((rc = cli_choice("--tight", optarg, tights, &i))) return rc;
      o->tight = tight_of[i];
      break;
    }
    case O_FILTER: {
      const char **p = realloc(o->filters, (o->nfilters + 1) * sizeof *p);
      if (!p) return cli_error("out of memory"), CLI_FAILED;
      o->filters = p;
      p[o->nfilters++] = optarg;
      break;
    }
    case O_KIND:
      if ((rc = add_override(&o->kinds, &o->nkinds, optarg, "--kind", kinds))) return rc;
      break;
    case O_LAYOUT:
      if ((rc = add_override(&o->layouts, &o->nlayouts, optarg, "--layout", layouts))) return rc;
      break;
    case 'h': usage(); return -1;
    case 'V': cli_version(); return -1;
    default: return cli_getopt_error(c, argv);
    }
  }
  if (optind != argc - 1)
    return cli_usage_error("%s", optind >= argc ? "no checkpoint given" : "more than one checkpoint given");
  o->checkpoint = argv[optind];
  /* --top alone: the largest forward values, the number every kind has */
  if (o->top && !sort_given) o->sort = SORT_FORWARD;
  if (o->step >= 0 && !o->hdf5) return cli_usage_error("--step is the step of the --hdf5 trace; give --hdf5 FILE too");
  return 0;
}

/* The message for a checkpoint that shrank under its mapping (the guard caught the SIGBUS):
 * exit status 2, its data being gone. */
static int shrank(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    cli_error("%s: the file shrank to %lld bytes while it was being read (truncated or rewritten "
            "by another process?): its data past that is gone; no report", path, (long long)sb.st_size);
  else
    cli_error("%s: the file changed while it was being read (now: %s): its data past the new end is "
            "gone; no report", path, strerror(errno));
  return 2;
}

/* Registers with the guard the mapped bytes the tensors of one file span. 0, or 1 after a message. */
static int guard_file(const char *path, const stab_ckpt_tensor *(*tensor)(const void *, size_t), const void *reader,
                      size_t count) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (size_t i = 0; i < count; i++) {
    const stab_ckpt_tensor *t = tensor(reader, i);
    const uint64_t nb = stab_ckpt_nbytes(t);
    if (!nb) continue; /* empty, or a block type never read */
    lo = (uintptr_t)t->data < lo ? (uintptr_t)t->data : lo;
    hi = (uintptr_t)t->data + nb > hi ? (uintptr_t)t->data + nb : hi;
  }
  if (hi > lo && ckpt_guard_add(path, (const void *)lo, hi - lo)) {
    cli_error("%s: too many checkpoint files to guard", path);
    return 1;
  }
  return 0;
}
static const stab_ckpt_tensor *ckpt_tensor_of(const void *c, size_t i) { return ck_tensor(c, i); }
static const stab_ckpt_tensor *shard_tensor_of(const void *s, size_t i) { return stab_safetensors_tensor(s, i); }

/* config.json of the model: in a sharded model's directory, else beside the file. None there is
 * nothing; one there that is not a readable regular file (a FIFO would block) is ignored with a
 * word why; a malformed one, or one with a wrong value, is bad input: its values decide heads
 * and the tied head, and a guess would be a wrong measurement. 0, or the exit status. */
static int read_config(const char *path, ckpt *f) {
  char cfg[4096];
  const char *slash = strrchr(path, '/');
  if (f->sh) snprintf(cfg, sizeof cfg, "%s/config.json", stab_sharded_directory(f->sh));
  else snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
  struct stat sb;
  if (stat(cfg, &sb) != 0) return 0;
  stab_status st = stab_hf_config_read(cfg, &f->cfg);
  if (st == STAB_OK) return 0;
  if (st == STAB_EFORMAT || st == STAB_ERANGE) {
    cli_error("%s", stab_last_error());
    return 2;
  }
  cli_error("%s; ignored", stab_last_error());
  return st == STAB_ENOMEM;
}

/* A single safetensors file that an index beside it lists as one of its shards: said, and kept
 * (f->siblings), so that the tied head is decided over the whole model. 0, or 1 (no memory). */
static int find_siblings(const char *path, ckpt *f) {
  size_t k = 0;
  stab_status st = stab_shard_index_beside(path, &f->siblings, &k);
  if (st == STAB_OK) {
    const char *ix = stab_shard_index_path(f->siblings), *slash = strrchr(ix, '/');
    cli_error("note: %s is shard %zu of %zu of the model indexed by %s: its other tensors are in the other shards; "
              "probe the directory (%.*s) to measure the whole model", path, k + 1,
              stab_shard_index_shard_count(f->siblings), ix, slash ? (int)(slash - ix) : 1, slash ? ix : ".");
  } else if (st != STAB_ENOTFOUND) {
    cli_error("warning: %s; the file is probed alone", stab_last_error());
  }
  return st == STAB_ENOMEM;
}

static int open_checkpoint(const char *path, ckpt *f) {
  /* A directory or a sharded model's index: every shard, as one checkpoint. Otherwise the
   * format by the file's first bytes. A binary file of no known format named .gguf or
   * .safetensors is one with a broken header: its reader says which field is wrong. Any other
   * file is refused with what it is (a PyTorch checkpoint, a trace, text, ...). */
  f->cfg.tie_word_embeddings = -1;
  struct stat sb;
  stab_file_kind kind = STAB_FILE_UNKNOWN;
  stab_status st = STAB_OK;
  int sharded = (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || ends_with(path, ".index.json");
  if (!sharded) {
    st = stab_ckpt_sniff(path, &kind);
    if (kind == STAB_FILE_SHARD_INDEX) sharded = 1, st = STAB_OK;
  }
  if (st != STAB_OK && kind == STAB_FILE_UNKNOWN && ends_with(path, ".gguf")) kind = STAB_FILE_GGUF, st = STAB_OK;
  if (st != STAB_OK && kind == STAB_FILE_UNKNOWN && ends_with(path, ".safetensors"))
    kind = STAB_FILE_SAFETENSORS, st = STAB_OK;
  ckpt_guard_opening(path); /* the readers parse the index from the mapping */
  if (st == STAB_OK)
    st = sharded                  ? stab_sharded_open(path, &f->sh)
         : kind == STAB_FILE_LLMC ? stab_llmc_open(path, &f->lc)
         : kind == STAB_FILE_GGUF ? stab_gguf_open(path, &f->gg)
                                  : stab_safetensors_open(path, &f->st);
  ckpt_guard_opening(NULL);
  if (ckpt_guard_tripped()) return shrank(path);
  if (st != STAB_OK) {
    cli_error("%s", stab_last_error());
    return st == STAB_ENOMEM ? 1 : 2;
  }
  /* from here on, the mapped bytes the tensors span, file by file */
  if (f->sh) {
    for (size_t k = 0; k < stab_sharded_shard_count(f->sh); k++) {
      const stab_safetensors *s = stab_sharded_shard(f->sh, k);
      if (guard_file(stab_sharded_shard_path(f->sh, k), shard_tensor_of, s, stab_safetensors_count(s))) return 1;
    }
    if (stab_sharded_warning(f->sh)) cli_error("warning: %s", stab_sharded_warning(f->sh));
  } else if (guard_file(path, ckpt_tensor_of, f, ck_count(f))) {
    return 1;
  }
  if (f->st && find_siblings(path, f)) return 1;
  return f->st || f->sh ? read_config(path, f) : 0;
}

/* ---- main -------------------------------------------------------------------------- */

/* The conversion buffers of one measuring thread: weight, bias, the k tensor of an attention
 * row, and the reference checkpoint's weight and bias (--prev). */
typedef struct {
  f32buf w, b, k, pw, pb;
  f32buf pwx, pbx; /* the reference's weight and bias reordered into this checkpoint's order */
} row_buffers;

static void row_buffers_free(row_buffers *rb) {
  free(rb->w.buf), free(rb->b.buf), free(rb->k.buf), free(rb->pw.buf), free(rb->pb.buf);
  free(rb->pwx.buf), free(rb->pbx.buf);
}

/* 1 when c is safetensors: one file, or a sharded model of them. */
static int is_safetensors(const ckpt *c) { return c->st || c->sh; }

/* 1 when c is a file of harness/train (its __metadata__ producer): GPT-2 names, nn.Linear
 * layouts throughout. */
static int made_by_train(const ckpt *c) {
  for (size_t i = 0; i < ck_meta_count(c); i++) {
    const char *k, *v;
    ck_meta(c, i, &k, &v);
    if (!strcmp(k, "producer") && !strncmp(v, "stabmeter-train", 15)) return 1;
  }
  return 0;
}

/* The GGUF file's general.architecture, or NULL. */
static const char *gguf_arch(const stab_gguf *g) {
  const stab_gguf_kv *kv = stab_gguf_find_metadata(g, "general.architecture");
  return kv && kv->type == STAB_GGUF_STRING ? kv->s : NULL;
}

/* Sets r's owned reason for having no update (the message names the tensor looked for): fmt
 * with one or two %s, a and b (b unused by a format with one). */
static const char *no_update_because(row *r, const char *fmt, const char *a, const char *b) {
  char buf[700];
  snprintf(buf, sizeof buf, fmt, a, b);
  free(r->owned_no_update);
  r->owned_no_update = strdup(buf);
  return r->owned_no_update ? r->owned_no_update : "not found";
}

/* The counterpart of tensor name (of cur, a GGUF or a safetensors) in prev, the other format,
 * by the library's name map (arch: the GGUF file's architecture), into *how; its name in
 * tried. NULL when the name has no mapping or the mapped name is not in prev. */
static const stab_ckpt_tensor *converted_find(const ckpt *cur, const ckpt *prev, const char *arch, const char *name,
                                              stab_name_transform *how, char *tried, size_t cap) {
  stab_status st = cur->gg ? stab_name_map_to_hf(arch, name, tried, cap, how)
                           : stab_name_map_to_gguf(arch, name, tried, cap, how);
  if (st != STAB_OK) return tried[0] = '\0', NULL;
  const stab_ckpt_tensor *t = ck_find(prev, tried);
  if (!t && cur->gg && !strcmp(arch, "gpt2")) { /* HF GPT-2 under GPT2LMHeadModel's transformer. */
    char prefixed[600];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", tried);
    if ((t = ck_find(prev, prefixed))) {
      size_t k = strlen(prefixed) < cap ? strlen(prefixed) : cap - 1;
      memcpy(tried, prefixed, k), tried[k] = '\0';
    }
  }
  return t;
}

/* The key heads of a GGUF model: <arch>.attention.head_count_kv, else head_count (no
 * grouped-query attention); query heads: head_count. 0 when missing or invalid. */
static size_t gguf_heads(const stab_gguf *g, const char *arch, int key_heads) {
  char key[160];
  uint64_t h = 0;
  snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
  if (!key_heads || stab_gguf_get_uint(g, key, &h) != STAB_OK) {
    snprintf(key, sizeof key, "%s.attention.head_count", arch);
    if (stab_gguf_get_uint(g, key, &h) != STAB_OK) h = 0;
  }
  return h > 0 && h <= MAX_HEADS ? (size_t)h : 0;
}

/* --prev across formats: row r of cur (a GGUF file) against prev (the safetensors it was
 * converted from), or the other way round. The counterpart is the tensor of the mapped name
 * (stab_name_map_to_hf / _to_gguf), in the same orientation once the converter's changes are
 * undone: a GPT-2 Conv1D weight that HF stores in-major is transposed in the GGUF file, Llama's
 * q and k rows are permuted within each head (heads from the GGUF metadata), Gemma's norms are
 * stored plus one. How to read it back is left in r (prev_heads ...), for prev_as_f32. NULL
 * when found, else why not. */
static const char *find_converted(const ckpt *cur, const ckpt *prev, row *r) {
  const stab_gguf *g = cur->gg ? cur->gg : prev->gg;
  const ckpt *hf = cur->gg ? prev : cur;
  const char *arch = gguf_arch(g);
  char tried[512], btried[512];
  stab_name_transform how, bhow;
  const stab_ckpt_tensor *pt = converted_find(cur, prev, arch, r->t->name, &how, tried, sizeof tried);
  if (!pt && !tried[0]) return "not found (no counterpart name: the tensor is not in the name map)";
  if (!pt) return no_update_because(r, "not found (looked for '%s')", tried, NULL);
  const stab_ckpt_tensor *pbias = NULL;
  if (r->bias && !(pbias = converted_find(cur, prev, arch, r->bias->name, &bhow, btried, sizeof btried)))
    return no_update_because(r, "its bias is not found (looked for '%s')", btried[0] ? btried : r->bias->name, NULL);
  /* the HF side is in-major when it has Conv1D's layout: the row's own, or the rule's for it */
  stab_model_config hf_rules = stab_model_default_config();
  hf_rules.out_major = made_by_train(hf);
  int hf_in_major = cur->gg ? pt->ndim == 2 && stab_model_linear_layout(&hf_rules, pt->name, (size_t)pt->shape[0],
                                                                         (size_t)pt->shape[1]) == STAB_LAYOUT_IN_MAJOR
                            : r->layout == STAB_LAYOUT_IN_MAJOR && r->kind == STAB_KIND_LINEAR;
  int transposed = how.conv1d && hf_in_major && r->t->ndim == 2;
  int same = pt->dtype != STAB_DTYPE_OTHER && pt->ndim == r->t->ndim &&
             (transposed ? pt->shape[0] == r->t->shape[1] && pt->shape[1] == r->t->shape[0]
                         : !memcmp(pt->shape, r->t->shape, r->t->ndim * sizeof pt->shape[0])) &&
             (!r->bias || (pbias->dtype != STAB_DTYPE_OTHER && pbias->count == r->bias->count));
  if (!same) return no_update_because(r, "a different shape or dtype ('%s' is %s)", tried, pt->dtype_name);
  size_t heads = 0;
  if (how.rows != STAB_QK_NONE) {
    size_t rows = pt->ndim == 2 ? (size_t)pt->shape[0] : (size_t)pt->count;
    heads = gguf_heads(g, arch, how.rows == STAB_QK_KEY);
    if (!heads)
      return no_update_because(r, "no row order (the GGUF metadata has no valid %s.attention.head_count, needed to "
                                  "undo the converter's q/k row permutation of '%s')", arch, tried);
    if (rows % (2 * heads))
      return no_update_because(r, "no row order ('%s': its rows are not whole heads of an even width, from %s's "
                                  "head counts)", tried, arch);
  }
  r->prev_t = pt, r->prev_bias = pbias;
  r->prev_heads = heads, r->prev_to_gguf = cur->gg != NULL, r->prev_transposed = transposed;
  /* the GGUF value is the HF one plus the offset: the reference moved to the current's side */
  r->prev_offset = cur->gg ? how.gguf_offset : -how.gguf_offset;
  return NULL;
}

/* The reference checkpoint's tensors row r's update is measured against (--prev): the same
 * names, the same shapes, a dtype the probe reads, into r->prev_t and r->prev_bias; between a
 * GGUF file and a safetensors, the converted names (find_converted). NULL when found, else why
 * not (for the row's message). Attention rows have no update (the articles define none for
 * the logit bound). */
static const char *find_counterpart(const ckpt *cur, const ckpt *prev, row *r) {
  if ((cur->gg != NULL) != (prev->gg != NULL) && (is_safetensors(cur) || is_safetensors(prev))) return find_converted(cur, prev, r);
  const stab_ckpt_tensor *pt = ck_find(prev, r->t->name), *pbias = r->bias ? ck_find(prev, r->bias->name) : NULL;
  if (!pt) return "not found";
  /* a slice of a 3-D expert tensor: the same expert's slice of the reference's */
  if (is_expert(r) && r->t->ndim == 2 && pt->ndim == 3) {
    if (stab_model_expert_view(pt, r->e->expert, &r->prev_view) != STAB_OK) return "a different shape or dtype";
    pt = &r->prev_view;
  }
  if (r->bias && !pbias) return "its bias is not found";
  int same = pt->dtype != STAB_DTYPE_OTHER && pt->ndim == r->t->ndim &&
             !memcmp(pt->shape, r->t->shape, r->t->ndim * sizeof pt->shape[0]) &&
             (!r->bias || (pbias->dtype != STAB_DTYPE_OTHER && pbias->count == r->bias->count));
  if (!same) return "a different shape or dtype";
  r->prev_t = pt, r->prev_bias = pbias;
  return NULL;
}

/* The reference tensor pt (r's prev_t or prev_bias) as f32 in r's own order: as stored
 * (as_f32) when it is, else an f32 copy into out (one layer at a time) with the converter's
 * changes undone: transposed back, the q/k rows of each head put back in the order of the
 * current file (stab_qk_permutation), the offset added. NULL after a message on stderr. */
static const float *prev_as_f32(const row *r, const stab_ckpt_tensor *pt, f32buf *raw, f32buf *out) {
  const float *src = as_f32(pt, raw, 0);
  if (!src || (!r->prev_heads && !r->prev_transposed && r->prev_offset == 0.0f)) return src;
  const size_t n = (size_t)pt->count, rows = pt->ndim == 2 ? (size_t)pt->shape[0] : n, cols = n / rows;
  if (n > out->cap) {
    float *p = realloc(out->buf, n * sizeof *p);
    if (!p) return cli_error("out of memory reordering '%s' (%zu floats)", pt->name, n), NULL;
    out->buf = p, out->cap = n;
  }
  float *dst = out->buf;
  const float off = r->prev_offset;
  if (r->prev_transposed) { /* pt is [rows][cols]; the current tensor [cols][rows] */
    for (size_t i = 0; i < rows; i++)
      for (size_t j = 0; j < cols; j++) dst[j * rows + i] = src[i * cols + j] + off;
    return dst;
  }
  size_t *perm = NULL;
  if (r->prev_heads) {
    if (!(perm = malloc(rows * sizeof *perm))) return cli_error("out of memory reordering '%s'", pt->name), NULL;
    if (stab_qk_permutation(rows, r->prev_heads, perm) != STAB_OK) {
      cli_error("%s: %s", pt->name, stab_last_error());
      free(perm);
      return NULL;
    }
  }
  /* perm[i]: the HF row stored as GGUF row i */
  for (size_t i = 0; i < rows; i++) {
    size_t to = perm && !r->prev_to_gguf ? perm[i] : i, from = perm && r->prev_to_gguf ? perm[i] : i;
    for (size_t j = 0; j < cols; j++) dst[to * cols + j] = src[from * cols + j] + off;
  }
  free(perm);
  return dst;
}

/* Measures one row into r->m (r->measured = 1): 0, or 1 after a message on stderr. Its mapped
 * pages are handed back afterwards unless keep_mapped (a tied head comes next). The update is
 * against r->prev_t (find_counterpart), when set. Safe to run for different rows at once: each
 * thread brings its own buffers. */
static int measure_row(row *r, const stab_metrics_params *mp, row_buffers *rb, int keep_mapped) {
  stab_ckpt_prefetch(r->t), stab_ckpt_prefetch(r->bias);
  if (r->tk != r->t) stab_ckpt_prefetch(r->tk);
  /* F16 and BF16 go to the library as they are mapped (it converts a few rows at a time);
   * only quantized, unaligned or big-endian tensors are converted whole */
  const stab_dtype dt = layer_dtype(r->t, r->bias, r->tk);
  const float *w = weights_as(r->t, dt, &rb->w, keep_mapped);
  const float *b = r->bias ? weights_as(r->bias, dt, &rb->b, keep_mapped) : NULL;
  const float *wk = r->tk == r->t ? w : r->tk ? weights_as(r->tk, dt, &rb->k, keep_mapped) : NULL; /* a fused qkv: one tensor */
  if (!w || (r->bias && !b) || (r->tk && !wk)) return 1;
  stab_layer L = {.name = r->name, .kind = r->kind,
                  .layout = r->kind == STAB_KIND_LINEAR || r->kind == STAB_KIND_ATTENTION ? r->layout : STAB_LAYOUT_NATURAL,
                  .weight = w, .bias = b, .weight_k = wk, .heads = r->heads, .dtype = dt};
  set_layer_sizes(&L, r);
  stab_layer before = L, *bp = NULL;
  if (r->prev_t && !r->prev_heads && !r->prev_transposed && r->prev_offset == 0.0f) {
    /* as stored, in its own dtype: a BF16 checkpoint against an F32 one reads both in place */
    before.dtype = layer_dtype(r->prev_t, r->bias ? r->prev_bias : NULL, NULL);
    before.weight = weights_as(r->prev_t, before.dtype, &rb->pw, 0);
    before.bias = r->bias ? weights_as(r->prev_bias, before.dtype, &rb->pb, 0) : NULL;
    if (!before.weight || (r->bias && !before.bias)) return 1;
    bp = &before;
  } else if (r->prev_t) { /* reordered as the converter changed it: an f32 copy */
    before.dtype = STAB_DTYPE_F32;
    before.weight = prev_as_f32(r, r->prev_t, &rb->pw, &rb->pwx);
    before.bias = r->bias ? prev_as_f32(r, r->prev_bias, &rb->pb, &rb->pbx) : NULL;
    if (!before.weight || (r->bias && !before.bias)) return 1;
    bp = &before;
  }
  stab_status st = r->kind == STAB_KIND_ATTENTION ? measure_attention(r, w, wk, dt, mp)
                                                  : stab_layer_metrics(&L, bp, mp, &r->m, r->head_bounds);
  if (st != STAB_OK) {
    cli_error("%s: %s", r->name, stab_last_error());
    return 1;
  }
  r->measured = 1;
  /* the mapped pages of this layer are not needed again (a tied head's, after the head):
   * peak memory stays near the largest layers, not the file */
  if (!keep_mapped) {
    stab_ckpt_release(r->t), stab_ckpt_release(r->bias), stab_ckpt_release(r->tk);
    if (bp) stab_ckpt_release(r->prev_t), stab_ckpt_release(r->prev_bias);
  }
  return 0;
}

/* The share of the run a row stands for in the ETA: the numbers it reads, times how often.
 * An attention row reads its q and k blocks (counting only q's tensor put Llama-7B's 32
 * attention rows, last in the table, at 1/14 of the work for a quarter of the time: the ETA
 * said 2 s with 10 s to go); a table is swept twice where a linear layer's Lanczos makes 10 to
 * 30 passes (counted as a linear, Llama-7B's embedding, first, made the ETA 10 s at 1.3 s
 * into a 26.5 s run). */
static double row_work(const row *r) {
  if (r->kind == STAB_KIND_ATTENTION) return 2.0 * (double)r->d_in * (double)r->d_out;
  if (r->kind == STAB_KIND_EMBEDDING || r->kind == STAB_KIND_LM_HEAD) return 0.15 * (double)r->t->count;
  return (double)r->t->count;
}

/* ---- layers of experts ---------------------------------------------------------------- */

static double expert_metric(const stab_metrics *m, int k) {
  switch (k) {
  case EXPERT_FORWARD: return m->forward;
  case EXPERT_DEPENDENCY: return m->dependency;
  case EXPERT_UPDATE: return m->update;
  case EXPERT_SIGMA: return m->sigma;
  default: return m->rel_update;
  }
}

/* Each layer of experts' metrics: per metric, its worst expert's value and index (a NaN from
 * non-finite weights, or update, is the worst there is, as in the summary), from the rows of its
 * experts, which follow it; passes summed, flags joined. Measured when every expert was. */
static void expert_layers(row *rows, size_t n) {
  for (size_t i = 0; i < n; i++) {
    row *g = &rows[i];
    if (!is_expert_layer(g) || g->error) continue;
    stab_metrics m = g->m; /* the NaNs of a linear layer not measured */
    m.forward = m.dependency = m.update = m.sigma = m.rel_update = NAN;
    m.sigma_rel_err = m.sigma_update = m.sigma_update_rel_err = NAN;
    m.forward_tight = m.dependency_tight = m.update_tight = m.spread = NAN;
    m.passes = m.update_passes = m.flags = 0;
    int all = 1, broken[N_EXPERT_METRICS] = {0};
    size_t j = i + 1;
    for (; j < n && is_expert(&rows[j]); j++) {
      const row *x = &rows[j];
      if (!x->measured) {
        all = 0;
        continue;
      }
      m.passes += x->m.passes, m.update_passes += x->m.update_passes, m.flags |= x->m.flags;
      m.tight_method = x->m.tight_method;
      for (int k = 0; k < N_EXPERT_METRICS; k++) {
        double v = expert_metric(&x->m, k), cur = expert_metric(&m, k);
        unsigned bad = k == EXPERT_UPDATE || k == EXPERT_REL_UPDATE ? STAB_FLAG_NONFINITE_WEIGHT | STAB_FLAG_NONFINITE_UPDATE
                                                                   : STAB_FLAG_NONFINITE_WEIGHT;
        if (broken[k]) continue;
        int take = isnan(v) ? (x->m.flags & bad) != 0 : isnan(cur) || v > cur;
        if (!take) continue;
        broken[k] = isnan(v);
        g->worst[k] = x->e->expert;
        switch (k) {
        case EXPERT_FORWARD: m.forward = v; break;
        case EXPERT_DEPENDENCY: m.dependency = v; break;
        case EXPERT_UPDATE:
          m.update = v, m.sigma_update = x->m.sigma_update, m.sigma_update_rel_err = x->m.sigma_update_rel_err;
          break;
        case EXPERT_SIGMA: m.sigma = v, m.sigma_rel_err = x->m.sigma_rel_err; break;
        default: m.rel_update = v; break;
        }
      }
    }
    g->m = m;
    g->measured = all && j > i + 1;
    i = j - 1;
  }
}

/* ---- the rows' names, --filter and --prev ------------------------------------------- */

/* 1 when glob matches row r's name or the name of a tensor it reads (weight, bias, key). */
static int row_matches(const row *r, const char *glob) {
  return !fnmatch(glob, r->name, 0) || !fnmatch(glob, r->t->name, 0) ||
         (r->bias && !fnmatch(glob, r->bias->name, 0)) || (r->tk && !fnmatch(glob, r->tk->name, 0));
}

static void row_free(row *r) { free(r->head_bounds), free(r->owned_no_update); }

/* --filter: keeps the rows some filter matches (row_matches), in their order; *tied_src
 * follows the tied head's embedding (SIZE_MAX when either is dropped: the head, if kept, is
 * then measured alone). A filter that matches nothing is a typo, as in stabmeter-export: the
 * message names it, and the status is 2 with nothing kept. */
static int filter_rows(const options *o, row *rows, size_t *n, size_t *tied_src) {
  if (!o->nfilters) return 0;
  for (size_t k = 0; k < o->nfilters; k++) {
    size_t i = 0;
    while (i < *n && !row_matches(&rows[i], o->filters[k])) i++;
    if (i == *n) {
      cli_error("--filter '%s' matches no layer or tensor name of %s (names like '%s', '%s')", o->filters[k],
                o->checkpoint, *n ? rows[0].name : "", *n > 1 ? rows[*n - 1].name : "");
      return CLI_USAGE;
    }
  }
  char *keeps = calloc(*n ? *n : 1, 1);
  if (!keeps) {
    cli_error("out of memory");
    return CLI_FAILED;
  }
  for (size_t i = 0; i < *n; i++)
    for (size_t k = 0; k < o->nfilters && !keeps[i]; k++) keeps[i] = (char)row_matches(&rows[i], o->filters[k]);
  /* a layer of experts and its experts go together (the layer's metrics are theirs): rows are
   * still one per entry here, so an expert's group is the index of its layer's row */
  for (size_t i = 0; i < *n; i++)
    if (is_expert(&rows[i]) && keeps[i]) keeps[rows[i].e->group] = 1;
  for (size_t i = 0; i < *n; i++)
    if (is_expert(&rows[i]) && keeps[rows[i].e->group]) keeps[i] = 1;
  size_t kept = 0, src = SIZE_MAX;
  for (size_t i = 0; i < *n; i++) {
    int keep = keeps[i];
    if (!keep) {
      row_free(&rows[i]);
      continue;
    }
    if (i == *tied_src) src = kept;
    rows[kept++] = rows[i];
  }
  /* the tied head is the last row; its embedding must have been kept for the two to share a
   * mapping */
  *tied_src = kept && rows[kept - 1].tied ? src : SIZE_MAX;
  *n = kept;
  free(keeps);
  return 0;
}

/* --prev: finds each row's counterpart in the reference checkpoint. None at all means the two
 * files are not two checkpoints of one model (or the wrong file was given): 2 and a message
 * naming both. Some missing: a warning with their count and first names; those layers have no
 * update (their reason goes to the report's errors). */
static int match_reference(const options *o, const ckpt *cur, const ckpt *prev, row *rows, size_t n) {
  size_t asked = 0, found = 0, missing_name = 0;
  char first[256] = "";
  /* a GGUF file against a safetensors: only through a name map of the GGUF's architecture */
  const stab_gguf *g = cur->gg && is_safetensors(prev) ? cur->gg : prev->gg && is_safetensors(cur) ? prev->gg : NULL;
  if (g && !stab_name_map_knows(gguf_arch(g))) {
    cli_error("--prev %s: %s is GGUF and %s safetensors, and the GGUF architecture '%s' has no name map to Hugging "
              "Face names (llama, qwen2, gemma, phi3 and gpt2 have one): no tensor can be matched", o->reference,
              cur->gg ? o->checkpoint : o->reference, cur->gg ? o->reference : o->checkpoint,
              gguf_arch(g) ? gguf_arch(g) : "(none: no general.architecture)");
    return CLI_USAGE;
  }
  for (size_t i = 0; i < n; i++) {
    row *r = &rows[i];
    if (r->error || r->kind == STAB_KIND_ATTENTION || is_expert_layer(r)) continue;
    asked++;
    if (!(r->no_update = find_counterpart(cur, prev, r))) {
      found++;
      continue;
    }
    missing_name += !strncmp(r->no_update, "not found", 9);
    size_t len = strlen(first);
    if (asked - found <= 3)
      snprintf(first + len, sizeof first - len, "%s%s", len ? ", " : "", r->name);
  }
  if (asked && !found) {
    cli_error("--prev %s: none of the %zu layers of %s has a counterpart there (%s): not an earlier "
              "checkpoint of the same model", o->reference, asked, o->checkpoint,
              missing_name == asked ? (g ? "no tensor of the converted name" : "no tensor of the same name")
                                    : (g ? "no tensor of the converted name and shape" : "no tensor of the same name and shape"));
    return CLI_USAGE;
  }
  if (found < asked)
    cli_error("warning: --prev %s: %zu of %zu layers have no counterpart there, so no update: %s%s", o->reference,
              asked - found, asked, first, asked - found > 3 ? ", ..." : "");
  return 0;
}

/* ---- the step (--hdf5) -------------------------------------------------------------- */

/* The training step the checkpoint's own metadata gives, or -1: safetensors __metadata__
 * "step" or "global_step", or "steps" in a file of stabmeter-train (the steps taken, which is
 * the step its trace records these weights at); GGUF training.iteration_count (llama.cpp's
 * training files; general.* has no step). llm.c's header has none. A key present with a value
 * that is not a whole number is -1 with why saying so. */
static int64_t step_from_metadata(const options *o, const ckpt *f, const char **from, char *why, size_t cap) {
  static const char *const keys[] = {"step", "global_step", "steps", NULL};
  static const char *const said[] = {"the checkpoint's __metadata__ step", "the checkpoint's __metadata__ global_step",
                                     "the checkpoint's __metadata__ steps (stabmeter-train's)"};
  unsigned long long v;
  why[0] = '\0';
  for (size_t j = 0; keys[j]; j++) {
    if (!strcmp(keys[j], "steps") && !o->out_major_file) continue; /* another producer's "steps" may be the total */
    for (size_t i = 0; i < ck_meta_count(f); i++) {
      const char *k, *val;
      ck_meta(f, i, &k, &val);
      if (strcmp(k, keys[j])) continue;
      if (whole_number(val, 0, INT64_MAX, &v)) {
        *from = said[j];
        return (int64_t)v;
      }
      snprintf(why, cap, "__metadata__ %s is '%.40s', not a whole number", k, val);
      return -1;
    }
  }
  if (f->gg) {
    uint64_t u;
    stab_status st = stab_gguf_get_uint(f->gg, "training.iteration_count", &u);
    if (st == STAB_OK && u <= INT64_MAX) {
      *from = "the checkpoint's GGUF training.iteration_count";
      return (int64_t)u;
    }
    if (st != STAB_ENOTFOUND) snprintf(why, cap, "GGUF training.iteration_count is not a whole number");
  }
  return -1;
}

/* o->step and o->step_from: --step, else the metadata's, else the file name's. With --hdf5 the
 * choice is said on stderr (unless --quiet), a disagreement between the sources is a warning,
 * and no step at all is bad input (2). */
static int decide_step(options *o, const ckpt *f) {
  const char *meta_from = NULL;
  char why[160];
  int64_t meta = step_from_metadata(o, f, &meta_from, why, sizeof why), named = step_from_name(o->checkpoint);
  const char *name_is = "the file name";
  if (named < 0 && f->sh) {
    /* a sharded model: its directory's name (the Hugging Face Trainer's checkpoint-500/), a
     * trailing '/' aside */
    char d[4096];
    snprintf(d, sizeof d, "%s", stab_sharded_directory(f->sh));
    for (size_t k = strlen(d); k > 1 && d[k - 1] == '/'; k--) d[k - 1] = '\0';
    if ((named = step_from_name(d)) >= 0) name_is = "the directory's name";
  }
  if (o->hdf5 && why[0]) cli_error("warning: %s: %s; not used as the step", o->checkpoint, why);
  if (o->step < 0 && meta >= 0) o->step = meta, o->step_from = meta_from;
  else if (o->step < 0 && named >= 0) o->step = named, o->step_from = name_is;
  if (!o->hdf5) return 0;
  if (o->step < 0) {
    cli_error("%s: no step in its metadata or its file name (e.g. step-000100.safetensors); give --step N",
              o->checkpoint);
    return CLI_USAGE;
  }
  if (meta >= 0 && meta != o->step)
    cli_error("warning: %s: step %lld from %s, but %s says %lld", o->checkpoint, (long long)o->step, o->step_from,
              meta_from, (long long)meta);
  else if (named >= 0 && named != o->step)
    cli_error("warning: %s: step %lld from %s, but %s says %lld", o->checkpoint, (long long)o->step,
              o->step_from, name_is, (long long)named);
  if (!o->quiet) cli_error("%s: step %lld, from %s", o->hdf5, (long long)o->step, o->step_from);
  return 0;
}

/* ---- across ranks (mpirun) ----------------------------------------------------------- */

/* A tensor's bytes per element, quantized types included (their blocks' bytes over their
 * elements). */
static double bytes_per_element(const stab_ckpt_tensor *t) {
  return t && t->count ? (double)stab_ckpt_nbytes(t) / (double)t->count : 0;
}

/* Row r as the split across ranks sees it (probe_split.h): the mapped bytes it reads, and its
 * cost, the bytes it reads times the sweeps expected (row_work's weights), the update's again
 * with --prev. A layer of experts reads nothing of its own (its experts' rows do) and stays
 * with them; a row not measured costs nothing. */
static probe_item split_item(const row *rows, size_t i, size_t layer_of_experts) {
  const row *r = &rows[i];
  probe_item it = {.with = SIZE_MAX};
  if (is_expert(r) && layer_of_experts != SIZE_MAX) it.with = layer_of_experts;
  if (r->error || is_expert_layer(r)) return it;
  const stab_ckpt_tensor *ts[PROBE_MAX_SPANS] = {r->t, r->bias, r->tk, r->prev_t, r->prev_bias};
  for (size_t k = 0; k < PROBE_MAX_SPANS; k++)
    if (ts[k] && stab_ckpt_nbytes(ts[k]))
      it.span[it.nspan++] = (probe_span){ts[k]->data, ts[k]->data + stab_ckpt_nbytes(ts[k])};
  it.cost = row_work(r) * bytes_per_element(r->t);
  if (r->prev_t) it.cost += row_work(r) * bytes_per_element(r->prev_t);
  return it;
}

/* The rows' owners among job's ranks, and their items (*items, for the fence). NULL when out
 * of memory. */
static int *split_rows(const row *rows, size_t n, int ranks, probe_item **items) {
  int *owner = malloc((n ? n : 1) * sizeof *owner);
  *items = malloc((n ? n : 1) * sizeof **items);
  if (!owner || !*items) {
    free(owner), free(*items), *items = NULL;
    return NULL;
  }
  size_t layer = SIZE_MAX; /* the experts' rows follow their layer's */
  for (size_t i = 0; i < n; i++) {
    if (is_expert_layer(&rows[i])) layer = i;
    else if (!is_expert(&rows[i])) layer = SIZE_MAX;
    (*items)[i] = split_item(rows, i, layer);
  }
  if (probe_split(*items, n, ranks, owner)) {
    free(owner), free(*items), *items = NULL;
    return NULL;
  }
  return owner;
}

/* The file t's bytes are in (of checkpoint c, opened from path) and their offset there: found
 * by address, a tensor's mapping being its file's (a view into a 3-D experts tensor too). */
static const char *file_of(const ckpt *c, const char *path, const stab_ckpt_tensor *t, uint64_t *offset) {
  size_t files = c->sh ? stab_sharded_shard_count(c->sh) : 1;
  for (size_t k = 0; k < files; k++) {
    const stab_safetensors *s = c->sh ? stab_sharded_shard(c->sh, k) : c->st;
    const stab_ckpt_tensor *first = s ? stab_safetensors_tensor(s, 0) : ck_tensor(c, 0);
    if (!first) continue;
    const unsigned char *base = first->data - first->offset;
    if (s && (t->data < base || t->data >= base + stab_safetensors_file_size(s))) continue;
    *offset = (uint64_t)(t->data - base);
    return c->sh ? stab_sharded_shard_path(c->sh, k) : path;
  }
  *offset = t->offset;
  return path;
}

/* STAB_PROBE_SHOW_READS: on the real stderr, one line per tensor this rank reads (file, byte
 * range, name), and with more than one rank every page of the other ranks' tensors made
 * unreadable (probe_split_fence), so that a stray read kills the rank instead of fetching
 * pages unseen. A rank's lines say what it reads; the fence proves it reads nothing else.
 * 0, or 1 after a message. */
static int show_reads(const probe_ranks *job, const options *o, const ckpt *cur, const ckpt *prev, const row *rows,
                      size_t n, const int *owner, const probe_item *items) {
  FILE *err = probe_ranks_stderr(job);
  for (size_t i = 0; i < n; i++) {
    if (owner[i] != job->rank || !items[i].nspan) continue;
    const stab_ckpt_tensor *ts[PROBE_MAX_SPANS] = {rows[i].t, rows[i].bias, rows[i].tk, rows[i].prev_t, rows[i].prev_bias};
    for (size_t k = 0; k < PROBE_MAX_SPANS; k++) {
      if (!ts[k] || !stab_ckpt_nbytes(ts[k])) continue;
      uint64_t at;
      const char *file = k < 3 ? file_of(cur, o->checkpoint, ts[k], &at) : file_of(prev, o->reference, ts[k], &at);
      fprintf(err, "%s: rank %d of %d reads %s bytes %llu-%llu (%s, row %s)\n", cli_name, job->rank, job->size, file,
              (unsigned long long)at, (unsigned long long)(at + stab_ckpt_nbytes(ts[k])), ts[k]->name, rows[i].name);
    }
  }
  if (job->size == 1) return 0;
  long long fenced = probe_split_fence(items, n, owner, job->rank);
  if (fenced < 0) {
    cli_error("STAB_PROBE_SHOW_READS: cannot protect the other ranks' tensors: %s", strerror(errno));
    return 1;
  }
  fprintf(err, "%s: rank %d of %d fenced %lld bytes of the other ranks' tensors\n", cli_name, job->rank, job->size,
          fenced);
  return 0;
}

int main(int argc, char **argv) {
  cli_init("stabmeter-probe");
  /* under mpirun: one rank of many (probe_ranks.h); every path out goes through
   * probe_ranks_finish, so that every rank ends with rank 0's status */
  probe_ranks job;
  if (probe_ranks_start(&job, &argc, &argv)) return probe_ranks_finish(&job, 1);
  options o;
  int rc = parse(argc, argv, &o);
  if (rc) return probe_ranks_finish(&job, rc < 0 ? CLI_OK : rc); /* < 0: --help or --version done */
  if (ckpt_guard_install()) {
    cli_error("cannot install the SIGBUS handler: %s", strerror(errno));
    return probe_ranks_finish(&job, 1);
  }
  ckpt f = {0}, prevc = {0}, *prev = NULL;
  stab_model *model = NULL;
  row *rows = NULL;
  size_t n = 0, *order = NULL, shown_rows = 0;
  int *owner = NULL;
  probe_item *items = NULL;
  probe_result *results = NULL;
  if ((rc = open_checkpoint(o.checkpoint, &f))) goto out;
  if (o.reference) {
    prev = &prevc;
    if ((rc = open_checkpoint(o.reference, prev))) goto out;
  }

  /* the rows: the library's model of the checkpoint (sets o.out_major_file, which the step reads) */
  if (describe(&o, &f, &model, &rows, &n)) {
    rc = 1;
    goto out;
  }
  if ((rc = decide_step(&o, &f))) goto out;
  /* a tied head is the last entry; it repeats its embedding's row */
  size_t tied_src = SIZE_MAX;
  for (size_t i = 0; n && rows[n - 1].tied && i + 1 < n && tied_src == SIZE_MAX; i++)
    if (rows[i].kind == STAB_KIND_EMBEDDING && rows[i].t == rows[n - 1].t) tied_src = i;
  if ((rc = filter_rows(&o, rows, &n, &tied_src))) goto out;
  if (prev && (rc = match_reference(&o, &f, prev, rows, n))) goto out;
  /* the rows each rank measures, from the headers alone: every rank knows every owner */
  if (!(owner = split_rows(rows, n, job.size, &items)) || !(results = malloc((n ? n : 1) * sizeof *results))) goto oom;
  for (size_t i = 0; i < n; i++) /* where the gather puts what the other ranks measured */
    results[i] = (probe_result){&rows[i].m, rows[i].head_bounds, rows[i].head_bounds ? rows[i].heads : 0,
                                &rows[i].measured};
  if (getenv("STAB_PROBE_SHOW_READS") && (rc = show_reads(&job, &o, &f, prev, rows, n, owner, items))) goto out;
  /* every rank has read the same headers alike, or all stop here with the first one's status */
  if ((rc = probe_ranks_agree(&job, rc))) goto out;

  stab_metrics_params mp = stab_metrics_default_params();
  mp.spectral.tol = o.tol;
  if (o.exact) mp.spectral.method = STAB_SPECTRAL_EXACT;
  mp.tight = o.tight;
  double work = 0, done = 0, t0 = monotonic_seconds(), last = t0;
  for (size_t i = 0; i < n; i++)
    if (!rows[i].error && !is_expert_layer(&rows[i]) && owner[i] == job.rank) work += row_work(&rows[i]);
  /* Two layers are measured at a time, one thread each, instead of one layer with both
   * threads: most layers are small, their passes short, and the serial work between passes
   * (the Lanczos vectors, LAPACK on the small band matrix) left the second core idle. Results
   * are the same bits either way (a pass splits rows by shape, never by thread count). The
   * exact mode keeps one layer at a time: its dgesvd runs on OpenBLAS's own threads. */
  int layer_threads = 1;
#ifdef _OPENMP
  if (!o.exact && omp_get_max_threads() > 1) layer_threads = 2;
#endif
  if (layer_threads > 1) mp.spectral.threads = 1;
  int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(layer_threads)
#endif
  {
    row_buffers rb = {0};
    int me = 0;
#ifdef _OPENMP
    me = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
#endif
    for (size_t k = 0; k < n; k++) {
      /* A tied head (rows[n - 1]) is measured right after its embedding, by the same thread,
       * while the table is still mapped (its pages are released once, after the head): mapping
       * GPT-2's 154 MB wte a second time cost 5% of its probe. The report keeps the rows'
       * order. */
      if ((tied_src != SIZE_MAX && k == n - 1) || owner[k] != job.rank) continue; /* the head shares its rank */
      int stop;
#ifdef _OPENMP
#pragma omp atomic read
#endif
      stop = failed;
      if (stop) continue;
      for (size_t i = k; i != SIZE_MAX; i = i == tied_src ? n - 1 : SIZE_MAX) {
        row *r = &rows[i];
        if (r->error || is_expert_layer(r)) continue; /* a layer of experts: its experts' rows */
        double t = monotonic_seconds();
        if (me == 0 && job.rank == 0 && !o.quiet && t - t0 > 1.0 && t - last > 1.0) {
          double d;
#ifdef _OPENMP
#pragma omp atomic read
#endif
          d = done;
          double eta = d > 0 ? (t - t0) * (work - d) / d : 0;
          cli_error("layer %zu/%zu %s, %.1f s, ETA %.0f s", k + 1, n, r->name, t - t0, eta);
          last = t;
        }
        if (measure_row(r, &mp, &rb, i == tied_src) || ckpt_guard_tripped()) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
          failed = 1;
          break;
        }
#ifdef _OPENMP
#pragma omp atomic update
#endif
        done += row_work(r);
      }
    }
    row_buffers_free(&rb);
  }
  /* rank 0 receives the other ranks' rows and outcomes (nothing to do for one process) */
  const char *tripped = ckpt_guard_tripped();
  if (probe_ranks_gather(&job, results, n, owner, &failed, &tripped)) failed = 1;
  if (job.rank != 0) goto out; /* rank 0 reports, and its status is every rank's */
  if (tripped) { /* the numbers read were zeros: nothing of this run stands */
    rc = shrank(tripped);
    goto out;
  }
  if (failed) {
    rc = 1;
    goto out;
  }
  if (!o.quiet && monotonic_seconds() - t0 > 1.0)
    cli_error("%zu tensors in %.1f s", n, monotonic_seconds() - t0);
  expert_layers(rows, n);
  if (o.hdf5 && (rc = write_trace(&o, &f, rows, n, o.step))) goto out;
  if (!(order = report_order(&o, rows, n, &shown_rows))) goto oom;
  if (o.json) print_json(&o, &f, rows, n, order, shown_rows);
  else print_table(&o, &f, rows, n, order, shown_rows);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    cli_error("error writing the output");
    rc = 1;
  }
  goto out;
oom:
  cli_error("out of memory");
  rc = 1;
out:
  for (size_t i = 0; rows && i < n; i++) row_free(&rows[i]);
  free(rows), free(order), free(owner), free(items), free(results);
  stab_model_free(model);
  ckpt_guard_reset();
  ck_close(&f);
  ck_close(&prevc);
  for (size_t i = 0; i < o.nkinds; i++) free((char *)o.kinds[i].glob);
  for (size_t i = 0; i < o.nlayouts; i++) free((char *)o.layouts[i].glob);
  free(o.kinds), free(o.layouts), free(o.filters);
  return probe_ranks_finish(&job, rc);
}
