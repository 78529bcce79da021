/* report.c — the probe's report as text: the JSON stabmeter-probe --json prints
 * (stab_probe_json) and its table (stab_probe_table), rows in the checkpoint's order or sorted
 * by a metric, the largest value per kind and metric, the rows not measured and why. Written
 * into a memory stream, so that the program prints it and a binding parses it, the same bytes. */
#include "probe/probe_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sort_names[] = {"file",       "name",          "forward",          "dependency",
                                         "update",     "sigma",         "rel_update",       "forward_tight",
                                         "dependency_tight", "update_tight", "forward_ratio",
                                         "dependency_ratio", NULL};

const char *stab_probe_sort_name(int sort) {
  return sort >= 0 && sort < (int)(sizeof sort_names / sizeof sort_names[0]) ? sort_names[sort] : NULL;
}

static const char *const expert_metric_names[] = {"forward", "dependency", "update", "sigma", "rel_update"};

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

/* ---- the order of the rows (--sort, --top) and the summary ---------------------------- */

/* The value --sort METRIC orders by (STAB_PROBE_SORT_FORWARD ...). */
static double sort_value(const stabi_probe_row *r, int sort) {
  switch (sort) {
  case STAB_PROBE_SORT_FORWARD: return r->m.forward;
  case STAB_PROBE_SORT_DEPENDENCY: return r->m.dependency;
  case STAB_PROBE_SORT_UPDATE: return r->m.update;
  case STAB_PROBE_SORT_SIGMA: return r->m.sigma;
  case STAB_PROBE_SORT_REL_UPDATE: return r->m.rel_update;
  case STAB_PROBE_SORT_FORWARD_TIGHT: return r->m.forward_tight;
  case STAB_PROBE_SORT_DEPENDENCY_TIGHT: return r->m.dependency_tight;
  case STAB_PROBE_SORT_UPDATE_TIGHT: return r->m.update_tight;
  case STAB_PROBE_SORT_FORWARD_RATIO: return r->ratio.forward_ratio;
  case STAB_PROBE_SORT_DEPENDENCY_RATIO: return r->ratio.dependency_ratio;
  default: return NAN;
  }
}

/* A measured row as the sort sees it: no shared context, so that two probes may report at once. */
typedef struct {
  const char *name;
  double value; /* sort_value's */
  size_t row;
  int sort;
} sort_key;

/* Largest first, a row without the value (NaN) after every row with one; ties (and --sort
 * name's equal names) in the checkpoint's order, so the order is the same on every run. */
static int by_sort(const void *pa, const void *pb) {
  const sort_key *a = pa, *b = pb;
  if (a->sort == STAB_PROBE_SORT_NAME) {
    int c = strcmp(a->name, b->name);
    if (c) return c;
  } else if (a->sort != STAB_PROBE_SORT_FILE) {
    double x = a->value, y = b->value;
    if (isnan(x) != isnan(y)) return isnan(x) ? 1 : -1;
    if (x != y && !isnan(x)) return x > y ? -1 : 1;
  }
  return a->row < b->row ? -1 : a->row > b->row;
}

/* The measured rows in the order the report shows them (--sort), at most --top of them:
 * indices into rows, *count of them. NULL when out of memory. */
static size_t *report_order(const stab_probe_report_options *o, const stabi_probe_row *rows, size_t n, size_t *count) {
  size_t *idx = malloc((n ? n : 1) * sizeof *idx), k = 0;
  sort_key *keys = malloc((n ? n : 1) * sizeof *keys);
  if (!idx || !keys) {
    free(idx), free(keys);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (rows[i].measured && (o->experts || !stabi_is_expert(&rows[i])))
      keys[k++] = (sort_key){rows[i].name, sort_value(&rows[i], (int)o->sort), i, (int)o->sort};
  qsort(keys, k, sizeof *keys, by_sort);
  for (size_t j = 0; j < k; j++) idx[j] = keys[j].row;
  free(keys);
  *count = o->top && o->top < k ? o->top : k;
  return idx;
}

/* The summary: per kind, the layer with the largest forward, dependency and update. */
static const stab_kind summary_kinds[] = {STAB_KIND_LINEAR, STAB_KIND_EMBEDDING, STAB_KIND_LM_HEAD,
                                          STAB_KIND_GAIN,   STAB_KIND_BIAS,      STAB_KIND_ATTENTION};
static const char *const summary_metrics[] = {"forward", "dependency", "update"};
enum { N_SUMMARY_KINDS = sizeof summary_kinds / sizeof summary_kinds[0], N_SUMMARY_METRICS = 3 };

/* The unit of a row's forward, dependency and update (docs/manual/metrics.md): the LM head bounds a
 * loss, in nats; every other kind is an RMS ratio (the attention row bounds a logit). */
static const char *unit_of(stab_kind kind) { return kind == STAB_KIND_LM_HEAD ? "nats" : "1"; }

/* The row of that kind with the largest value of metric m (0 forward, 1 dependency, 2 update),
 * or SIZE_MAX when none has one: dependency is not defined for an embedding, a bias or the
 * attention logits, update not for the logits nor without --prev (has_update 0). A layer whose
 * weights (or update) hold NaN or Inf is the worst there is, its value NaN: a summary must not
 * hide it behind the finite ones. */
static size_t worst_row(const stabi_probe_row *rows, size_t n, stab_kind kind, int m, int has_update) {
  if (m == 1 && (kind == STAB_KIND_EMBEDDING || kind == STAB_KIND_BIAS || kind == STAB_KIND_ATTENTION)) return SIZE_MAX;
  if (m == 2 && (kind == STAB_KIND_ATTENTION || !has_update)) return SIZE_MAX;
  size_t best = SIZE_MAX;
  double bv = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    const stabi_probe_row *r = &rows[i];
    if (!r->measured || r->kind != kind || stabi_is_expert(r)) continue; /* the layer's row has its worst */
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
static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  const size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    const unsigned char c = (unsigned char)s[i];
    int len = stab_utf8_decode(s + i, n - i, NULL);
    if (len == 0) fputs("\\ufffd", out), len = 1;
    else if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
    else if (c == '\n') fputs("\\n", out);
    else if (c == '\t') fputs("\\t", out);
    else if (c < 0x20 || c == 0x7f) fprintf(out, "\\u%04x", c);
    else fwrite(s + i, 1, (size_t)len, out);
    i += (size_t)len;
  }
  fputc('"', out);
}

static void json_number(FILE *out, double x) {
  if (isfinite(x)) fprintf(out, "%.17g", x);
  else fputs("null", out);
}

static const char *layout_name(const stabi_probe_row *r) {
  if (r->kind == STAB_KIND_LINEAR || r->kind == STAB_KIND_ATTENTION)
    return r->layout == STAB_LAYOUT_IN_MAJOR ? "in_major" : "out_major";
  return "rows";
}

/* A row's shape, outermost first, into dims (at most 3); the count of dimensions. A layer of HF
 * experts is its expert count and one expert's matrix; a 3-D expert tensor its own shape. */
static size_t row_shape(const stabi_probe_row *r, uint64_t dims[3]) {
  size_t k = 0;
  if (stabi_is_expert_layer(r) && r->t->ndim == 2) dims[k++] = r->e->n_expert;
  for (size_t d = 0; d < r->t->ndim && k < 3; d++) dims[k++] = r->t->shape[d];
  return k;
}

/* The checkpoint's own metadata as a JSON object: safetensors' __metadata__ (strings), GGUF's
 * pairs (numbers, strings, booleans; an array as {"array": type, "length": n}), llm.c's header. */
static void print_json_metadata(FILE *out, const stab_checkpoint *ck) {
  const stab_safetensors *st = stab_checkpoint_safetensors(ck); /* a sharded model's: its first shard's */
  const stab_gguf *gg = stab_checkpoint_gguf(ck);
  const stab_llmc *lc = stab_checkpoint_llmc(ck);
  fputs("{", out);
  for (size_t i = 0; i < stab_safetensors_metadata_count(st); i++) {
    const char *k, *v;
    stab_safetensors_metadata(st, i, &k, &v);
    fputs(i ? ", " : "", out);
    json_string(out, k);
    fputs(": ", out);
    json_string(out, v);
  }
  for (size_t i = 0; gg && i < stab_gguf_metadata_count(gg); i++) {
    const stab_gguf_kv *kv = stab_gguf_metadata(gg, i);
    fputs(i ? ", " : "", out);
    json_string(out, kv->key);
    fputs(": ", out);
    switch (kv->type) {
    case STAB_GGUF_STRING: json_string(out, kv->s); break;
    case STAB_GGUF_BOOL: fputs(kv->u ? "true" : "false", out); break;
    case STAB_GGUF_ARRAY:
      fprintf(out, "{\"array\": \"%s\", \"length\": %llu}",
             stab_gguf_value_type_name(kv->elem_type) ? stab_gguf_value_type_name(kv->elem_type) : "?",
             (unsigned long long)kv->len);
      break;
    case STAB_GGUF_FLOAT32: case STAB_GGUF_FLOAT64: json_number(out, kv->f); break;
    case STAB_GGUF_INT8: case STAB_GGUF_INT16: case STAB_GGUF_INT32: case STAB_GGUF_INT64:
      fprintf(out, "%lld", (long long)kv->i);
      break;
    default: fprintf(out, "%llu", (unsigned long long)kv->u); break;
    }
  }
  if (lc) {
    const stab_llmc_config *c = stab_llmc_config_of(lc);
    fprintf(out, "\"version\": %d, \"max_seq_len\": %zu, \"vocab_size\": %zu, \"padded_vocab_size\": %zu, "
           "\"num_layers\": %zu, \"num_heads\": %zu, \"channels\": %zu", c->version, c->max_t, c->vocab,
           c->padded_vocab, c->layers, c->heads, c->channels);
  }
  fputs("}", out);
}

/* The message of a row in the errors: why it was not measured, or why it has no update. */
static void error_message(const stabi_probe_row *r, char *buf, size_t cap) {
  if (r->error) snprintf(buf, cap, "%s", r->error);
  else snprintf(buf, cap, "no update: %s in the reference checkpoint", r->no_update);
}

static void print_json(FILE *out, const stab_probe *p, const stab_probe_report_options *o, const size_t *order,
                       size_t count) {
  const stabi_probe_row *rows = p->rows;
  const size_t n = p->n;
  const stab_checkpoint *ck = p->cur.ck;
  fprintf(out, "{\"format\": \"stabmeter-probe\", \"format_version\": 2, \"checkpoint\": ");
  json_string(out, p->checkpoint);
  fprintf(out, ", \"reference\": ");
  if (p->reference) json_string(out, p->reference);
  else fputs("null", out);
  if (o->step >= 0) {
    fprintf(out, ", \"step\": %lld, \"step_source\": ", (long long)o->step);
    json_string(out, o->step_source);
  } else {
    fputs(", \"step\": null, \"step_source\": null", out);
  }
  fprintf(out, ", \"ratio_reference\": "); /* --init, or --prev alone */
  if (p->init) json_string(out, p->init->checkpoint);
  else fputs("null", out);
  fprintf(out, ", \"sort\": \"%s\", \"top\": ", stab_probe_sort_name(o->sort));
  if (o->top) fprintf(out, "%zu", o->top);
  else fputs("null", out);
  fprintf(out, ", \"metadata\": ");
  print_json_metadata(out, ck);
  fprintf(out, ", \"layers\": [");
  for (size_t j = 0; j < count; j++) {
    const stabi_probe_row *r = &rows[order[j]];
    const stab_metrics *m = &r->m;
    fprintf(out, "%s\n  {\"name\": ", j ? "," : "");
    json_string(out, r->name);
    fprintf(out, ", \"tensor\": ");
    json_string(out, r->t->name);
    fprintf(out, ", \"kind\": \"%s\", \"unit\": \"%s\", \"shape\": [", stab_kind_name(r->kind), unit_of(r->kind));
    uint64_t dims[3];
    size_t nd = row_shape(r, dims);
    for (size_t d = 0; d < nd; d++) fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    fprintf(out, "], \"dtype\": \"%s\", \"layout\": \"%s\", \"d_in\": %zu, \"d_out\": %zu", r->t->dtype_name,
           layout_name(r), r->d_in, r->d_out);
    const struct { const char *k; double v; } vals[] = {
        {"forward", m->forward},           {"dependency", m->dependency},
        {"update", m->update},             {"sigma", m->sigma},
        {"sigma_rel_err", m->sigma_rel_err}, {"sigma_update", m->sigma_update},
        {"sigma_update_rel_err", m->sigma_update_rel_err}, {"rel_update", m->rel_update},
        {"forward_tight", m->forward_tight}, {"dependency_tight", m->dependency_tight},
        {"update_tight", m->update_tight}, {"spread", m->spread}};
    for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
      fprintf(out, ", \"%s\": ", vals[k].k);
      json_number(out, vals[k].v);
    }
    if (p->init) { /* against the init reference: its values, and this row's over them */
      const struct { const char *k; double v; } rv[] = {
          {"forward_init", r->ratio.forward_init}, {"dependency_init", r->ratio.dependency_init},
          {"forward_ratio", r->ratio.forward_ratio}, {"dependency_ratio", r->ratio.dependency_ratio}};
      for (size_t k = 0; k < sizeof rv / sizeof rv[0]; k++) {
        fprintf(out, ", \"%s\": ", rv[k].k);
        json_number(out, rv[k].v);
      }
    }
    fprintf(out, ", \"passes\": %d, \"update_passes\": %d, \"tight_method\": \"%s\", \"bias\": ", m->passes,
           m->update_passes, m->tight_method == STAB_TIGHT_EXACT ? "exact" : m->tight_method == STAB_TIGHT_NONE ? "none" : "centred");
    if (r->bias) json_string(out, r->bias->name);
    else fputs("null", out);
    if (p->reference) { /* --prev: the tensor the update is against (another name across formats) */
      fputs(", \"reference_tensor\": ", out);
      if (r->prev_t) json_string(out, r->prev_t->name);
      else fputs("null", out);
      fputs(", \"reference_dtype\": ", out);
      if (r->prev_t) json_string(out, r->prev_t->dtype_name);
      else fputs("null", out);
    }
    if (r->kind == STAB_KIND_ATTENTION) {
      fprintf(out, ", \"key_tensor\": ");
      json_string(out, r->tk->name);
      fprintf(out, ", \"heads\": %zu, \"head_bounds\": [", r->heads);
      for (size_t h = 0; h < r->heads; h++) {
        if (h) fputs(", ", out);
        json_number(out, r->head_bounds[h]);
      }
      fputc(']', out);
    }
    if (stabi_is_expert_layer(r)) {
      fprintf(out, ", \"experts\": %zu, \"worst_expert\": {", r->e->n_expert);
      for (size_t k = 0; k < N_EXPERT_METRICS; k++) {
        fprintf(out, "%s\"%s\": ", k ? ", " : "", expert_metric_names[k]);
        if (r->worst[k] == STAB_MODEL_NO_EXPERT) fputs("null", out);
        else fprintf(out, "%zu", r->worst[k]);
      }
      fputc('}', out);
    } else if (stabi_is_expert(r)) {
      fprintf(out, ", \"expert\": %zu, \"expert_of\": ", r->e->expert);
      json_string(out, r->expert_of);
    }
    fprintf(out, ", \"tied\": %s, \"flags\": [", r->tied ? "true" : "false");
    int f = 0;
    if (m->flags & STAB_FLAG_NONFINITE_WEIGHT) fprintf(out, "%s\"nonfinite_weight\"", f++ ? ", " : "");
    if (m->flags & STAB_FLAG_NONFINITE_UPDATE) fprintf(out, "%s\"nonfinite_update\"", f++ ? ", " : "");
    if (m->flags & STAB_FLAG_NOT_CONVERGED) fprintf(out, "%s\"not_converged\"", f++ ? ", " : "");
    fprintf(out, "]}");
  }
  /* the largest value per kind and metric, over every layer measured (--top aside) */
  fprintf(out, "],\n \"summary\": {");
  int kinds = 0;
  for (size_t k = 0; k < N_SUMMARY_KINDS; k++) {
    int metrics = 0;
    for (int m = 0; m < N_SUMMARY_METRICS; m++) {
      size_t w = worst_row(rows, n, summary_kinds[k], m, p->reference != NULL);
      if (w == SIZE_MAX) continue;
      if (!metrics++) fprintf(out, "%s\n  \"%s\": {", kinds++ ? "," : "", stab_kind_name(summary_kinds[k]));
      fprintf(out, "%s\"%s\": {\"layer\": ", metrics > 1 ? ", " : "", summary_metrics[m]);
      json_string(out, rows[w].name);
      fprintf(out, ", \"value\": ");
      json_number(out, m == 0 ? rows[w].m.forward : m == 1 ? rows[w].m.dependency : rows[w].m.update);
      fprintf(out, ", \"unit\": \"%s\"", unit_of(summary_kinds[k]));
      if (stabi_is_expert_layer(&rows[w]) && rows[w].worst[m] != STAB_MODEL_NO_EXPERT) fprintf(out, ", \"expert\": %zu", rows[w].worst[m]);
      fputc('}', out);
    }
    if (metrics) fputc('}', out);
  }
  fprintf(out, "},\n \"errors\": [");
  int first = 1;
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].error && !rows[i].no_update) continue;
    char why[1024];
    error_message(&rows[i], why, sizeof why);
    fprintf(out, "%s\n  {\"name\": ", first ? "" : ",");
    first = 0;
    json_string(out, rows[i].name);
    fprintf(out, ", \"message\": ");
    json_string(out, why);
    fprintf(out, "}");
  }
  fprintf(out, "]}\n");
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

static void print_table(FILE *out, const stab_probe *p, const stab_probe_report_options *o, const size_t *order,
                        size_t count) {
  const stabi_probe_row *rows = p->rows;
  const size_t n = p->n;
  const stab_safetensors *st = stab_checkpoint_safetensors(p->cur.ck); /* a sharded model's: its first shard's */
  const stab_gguf *gg = stab_checkpoint_gguf(p->cur.ck);
  const stab_llmc *lc = stab_checkpoint_llmc(p->cur.ck);
  fprintf(out, "checkpoint %s%s%s\n", p->checkpoint, p->reference ? ", update against " : "",
         p->reference ? p->reference : "");
  if (p->init) fprintf(out, "ratios (fwd_ratio, dep_ratio) to %s\n", p->init->checkpoint);
  for (size_t i = 0; i < stab_safetensors_metadata_count(st); i++) {
    const char *k, *v;
    char sk[256], sv[1024];
    stab_safetensors_metadata(st, i, &k, &v);
    fprintf(out, "metadata %s = %s\n", shown(k, sk, sizeof sk), shown(v, sv, sizeof sv));
  }
  for (size_t i = 0; gg && i < stab_gguf_metadata_count(gg); i++) {
    const stab_gguf_kv *kv = stab_gguf_metadata(gg, i);
    char v[128];
    char sk[256], sv[512];
    gguf_value_text(kv, v, sizeof v);
    fprintf(out, "metadata %s = %s\n", shown(kv->key, sk, sizeof sk), shown(v, sv, sizeof sv));
  }
  if (lc) {
    const stab_llmc_config *c = stab_llmc_config_of(lc);
    fprintf(out, "llm.c checkpoint version %d (%s): max_seq_len %zu, vocab %zu (padded %zu, padding rows left out), "
           "layers %zu, heads %zu, channels %zu\n", c->version, c->version == 5 ? "bf16" : "f32", c->max_t, c->vocab,
           c->padded_vocab, c->layers, c->heads, c->channels);
  }
  if (o->step >= 0) fprintf(out, "step %lld, from %s\n", (long long)o->step, o->step_source);
  if (o->sort != STAB_PROBE_SORT_FILE || o->top) {
    size_t measured = 0;
    for (size_t i = 0; i < n; i++) measured += rows[i].measured && (o->experts || !stabi_is_expert(&rows[i]));
    fprintf(out, "%zu of %zu layers, %s%s%s\n", count, measured,
           o->sort == STAB_PROBE_SORT_FILE ? "in the checkpoint's order" : o->sort == STAB_PROBE_SORT_NAME ? "by name" : "by ",
           o->sort > STAB_PROBE_SORT_NAME ? stab_probe_sort_name(o->sort) : "", o->sort > STAB_PROBE_SORT_NAME ? ", largest first" : "");
  }
  int w = 5;
  for (size_t j = 0; j < count; j++)
    if ((int)strlen(rows[order[j]].name) + (o->per_head ? 8 : 0) > w)
      w = (int)strlen(rows[order[j]].name) + (o->per_head ? 8 : 0);
  fprintf(out, "\n%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  %s", w, "layer", "kind", "shape", "dtype", "forward",
         "dependency", "update", "sigma", "rel_err", p->init ? "" : "notes\n");
  if (p->init) fprintf(out, "%9s %9s  notes\n", "fwd_ratio", "dep_ratio");
  for (size_t j = 0; j < count; j++) {
    const stabi_probe_row *r = &rows[order[j]];
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
    if (r->e && r->e->part && r->d_in) { /* a fused q/k/v's part: which block of the tensor it reads */
      const int in_major = r->layout == STAB_LAYOUT_IN_MAJOR;
      const size_t first = in_major ? r->offset : r->offset / r->d_in;
      size_t k = strlen(notes);
      snprintf(notes + k, sizeof notes - k, "%c: %s %zu-%zu ", "qkv"[r->e->part - 1], in_major ? "columns" : "rows", first,
               first + r->d_out - 1);
    }
    if (stabi_is_expert_layer(r)) {
      size_t k = strlen(notes);
      k += (size_t)snprintf(notes + k, sizeof notes - k, "%zu experts, worst:", r->e->n_expert);
      for (size_t x = 0; x < EXPERT_REL_UPDATE && k < sizeof notes; x++)
        if (r->worst[x] != STAB_MODEL_NO_EXPERT)
          k += (size_t)snprintf(notes + k, sizeof notes - k, " %s %zu", expert_metric_names[x], r->worst[x]);
      if (k < sizeof notes - 1) strcat(notes, " ");
    } else if (stabi_is_expert(r)) {
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
    char ratios[64] = "";
    if (p->init) {
      char fr[24], dr[24]; /* fmt_num: at most 12 bytes */
      fmt_num(fr, sizeof fr, r->ratio.forward_ratio);
      fmt_num(dr, sizeof dr, r->ratio.dependency_ratio);
      snprintf(ratios, sizeof ratios, "%9s %9s  ", fr, dr);
    }
    fprintf(out, "%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  %s%s\n", w, shown(r->name, name, sizeof name),
           stab_kind_name(r->kind), shape, r->t->dtype_name, a[0], a[1], a[2], a[3], e, ratios, notes);
    for (size_t h = 0; o->per_head && r->kind == STAB_KIND_ATTENTION && h < r->heads; h++) {
      char hn[1100], b[24], hs[48];
      snprintf(hn, sizeof hn, "%s.head%zu", name, h);
      snprintf(hs, sizeof hs, "%zux%zu", r->d_out / r->heads, r->d_in);
      fmt_num(b, sizeof b, r->head_bounds[h]);
      fprintf(out, "%-*s  %-9s  %-13s %-5s %11s %11s %11s %11s %8s  %skey head %zu\n", w, hn, "attention", hs,
             r->t->dtype_name, b, "-", "-", "-", "-", p->init ? "        -         -  " : "", h / (r->heads / r->kv_heads));
    }
  }
  /* the largest value per kind and metric, over every layer measured (--top aside) */
  int any = 0;
  for (size_t k = 0; k < N_SUMMARY_KINDS; k++)
    for (int m = 0; m < N_SUMMARY_METRICS; m++) {
      size_t i = worst_row(rows, n, summary_kinds[k], m, p->reference != NULL);
      if (i == SIZE_MAX) continue;
      char v[24], name[1024];
      double x = m == 0 ? rows[i].m.forward : m == 1 ? rows[i].m.dependency : rows[i].m.update;
      if (!any++) fprintf(out, "\nlargest per kind and metric:\n");
      if (isnan(x)) snprintf(v, sizeof v, "NaN");
      else fmt_num(v, sizeof v, x);
      char which[48] = "";
      if (stabi_is_expert_layer(&rows[i]) && rows[i].worst[m] != STAB_MODEL_NO_EXPERT)
        snprintf(which, sizeof which, " (expert %zu)", rows[i].worst[m]);
      fprintf(out, "  %-9s  %-10s  %11s %-4s  %s%s%s\n", stab_kind_name(summary_kinds[k]), summary_metrics[m], v,
             unit_of(summary_kinds[k]), shown(rows[i].name, name, sizeof name), which,
             isnan(x) ? " (non-finite weights)" : "");
    }
  if (count)
    fprintf(out, "\nunits: forward, dependency, update: RMS ratio (1), nats for lm_head rows; sigma: spectral norm of the "
           "stored matrix (1); rel_err: relative (1). Definitions: docs/manual/metrics.md\n");
  any = 0;
  for (size_t i = 0; i < n; i++)
    if (rows[i].error || rows[i].no_update) {
      if (!any++) fprintf(out, "\nnot measured%s:\n", p->reference ? " (or without an update)" : "");
      char name[1024], why[1024], msg[1024];
      error_message(&rows[i], msg, sizeof msg);
      fprintf(out, "  %s: %s\n", shown(rows[i].name, name, sizeof name), shown(msg, why, sizeof why));
    }
}


stab_probe_report_options stab_probe_default_report_options(void) {
  stab_probe_report_options o = {0};
  o.sort = STAB_PROBE_SORT_FILE;
  o.step = -1;
  return o;
}

typedef void (*report_writer)(FILE *out, const stab_probe *p, const stab_probe_report_options *o, const size_t *order,
                              size_t count);

/* One report into *text: the rows in order, written by write into a memory stream. */
static stab_status report(stab_probe *p, const stab_probe_report_options *options, char **text, size_t *len,
                          report_writer write, const char *who) {
  if (text) *text = NULL;
  if (len) *len = 0;
  if (!p || !text || !len) return stabi_fail(STAB_EINVAL, "%s: NULL %s", who, !p ? "probe" : !text ? "text" : "len");
  stab_probe_report_options o = options ? *options : stab_probe_default_report_options();
  if (!stab_probe_sort_name((int)o.sort)) return stabi_fail(STAB_EINVAL, "%s: sort %d is none of stab_probe_sort", who, (int)o.sort);
  if (o.step >= 0 && !o.step_source) o.step_source = "the caller";
  stabi_probe_ratios(p); /* the layers of experts too */
  size_t count = 0, *order = report_order(&o, p->rows, p->n, &count);
  char *buf = NULL;
  size_t size = 0;
  FILE *out = order ? open_memstream(&buf, &size) : NULL;
  if (!out) {
    free(order);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for the report", who);
  }
  write(out, p, &o, order, count);
  int bad = ferror(out);
  if (fclose(out) != 0 || bad) {
    free(order), free(buf);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory writing the report", who);
  }
  free(order);
  *text = buf, *len = size;
  return STAB_OK;
}

stab_status stab_probe_json(stab_probe *p, const stab_probe_report_options *options, char **text, size_t *len) {
  return report(p, options, text, len, print_json, "stab_probe_json");
}

stab_status stab_probe_table(stab_probe *p, const stab_probe_report_options *options, char **text, size_t *len) {
  return report(p, options, text, len, print_table, "stab_probe_table");
}
