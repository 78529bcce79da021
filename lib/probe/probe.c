/* probe.c — a checkpoint opened and described for the probe (stab_probe_open): opened through
 * its handle (lib/checkpoint/checkpoint.c decides the format), config.json beside it, the
 * library's kind rules over its tensors, the rows filtered and matched to an older
 * checkpoint's tensors (by name, or across GGUF and safetensors by llama.cpp's names), the
 * step its metadata or name gives, the rows as the caller sees them. Measuring is measure.c's,
 * the report report.c's. One concern, what the probe's rows are, past 800 lines. */
#include "probe/probe_internal.h"

#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* A note or warning for the caller (params.note_fn), formatted here: the library prints nothing. */
static void note(const stab_probe *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const stab_probe *p, const char *fmt, ...) {
  if (!p->params.note_fn) return;
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  p->params.note_fn(p->params.user, buf);
}

/* The caller's watch over the files (params.file_fn): 0, or non-zero to stop. */
static int file_event(const stab_probe *p, stab_probe_file_event ev, const char *path, const void *lo, size_t len) {
  return p->params.file_fn ? p->params.file_fn(p->params.user, ev, path, lo, len) : 0;
}

/* ---- the checkpoint: its handle, and what the probe reads beside it ------------------- */

/* The tensor of that name in c, or NULL. */
static const stab_ckpt_tensor *ck_find(const stabi_probe_ckpt *c, const char *name) {
  size_t i;
  return stab_checkpoint_find(c->ck, name, &i) == STAB_OK ? stab_checkpoint_tensor(c->ck, i) : NULL;
}
static void ck_close(stabi_probe_ckpt *c) {
  stab_checkpoint_close(c->ck);
  stab_shard_index_close(c->siblings);
  c->ck = NULL, c->siblings = NULL;
}
/* c's GGUF file (a split model's first shard, which holds its metadata), or NULL. */
static const stab_gguf *gguf_of(const stabi_probe_ckpt *c) { return stab_checkpoint_gguf(c->ck); }

/* The metrics of a row not measured: NaN, counts 0. */
static stab_metrics unmeasured(void) {
  stab_metrics m = {0};
  m.forward = m.dependency = m.update = m.forward_tight = m.dependency_tight = m.update_tight = m.spread = NAN;
  m.sigma = m.sigma_rel_err = m.sigma_update = m.sigma_update_rel_err = m.rel_update = NAN;
  return m;
}
/* 1 when c is safetensors: one file, or a sharded model of them. */
static int is_safetensors(const stabi_probe_ckpt *c) { return stab_checkpoint_format(c->ck) == STAB_FILE_SAFETENSORS; }

/* ---- the model: the library's kind rules over the checkpoint's tensors --------------- */

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
 * safetensors __metadata__, config.json), and one row per entry into p->rows (p->n of them).
 * Sets p->out_major_file. */
static stab_status describe(stab_probe *p) {
  char heads_error[320];
  const stabi_probe_ckpt *f = &p->cur;
  const stab_probe_params *o = &p->params;
  stab_model_config cfg = stab_model_default_config();
  size_t nt = stab_checkpoint_count(f->ck);
  const stab_ckpt_tensor **ts = malloc((nt ? nt : 1) * sizeof *ts);
  if (!ts) return stabi_fail(STAB_ENOMEM, "%s: out of memory describing %zu tensors", p->checkpoint, nt);
  for (size_t i = 0; i < nt; i++) ts[i] = stab_checkpoint_tensor(f->ck, i);
  cfg.kinds = o->kinds, cfg.nkinds = o->nkinds;
  cfg.layouts = o->layouts, cfg.nlayouts = o->nlayouts;
  if (o->heads) cfg.heads = o->heads, cfg.heads_source = "--heads";
  stab_status st = STAB_OK;
  if (stab_checkpoint_llmc(f->ck)) {
    /* llm.c's header says its head count (--heads does not change it) */
    cfg.naming = STAB_NAMING_LLMC;
    cfg.heads = stab_llmc_config_of(stab_checkpoint_llmc(f->ck))->heads, cfg.heads_source = "the llm.c header";
  } else if (gguf_of(f)) {
    st = stab_model_config_from_gguf(gguf_of(f), &cfg);
  } else {
    /* a sharded model's metadata is its first shard's; config.json (read and checked when the
     * checkpoint was opened) after __metadata__, and its tie_word_embeddings */
    st = stab_model_config_from_safetensors(stab_checkpoint_safetensors(f->ck), &cfg);
    if (st == STAB_OK) st = stab_model_config_from_hf(&f->cfg, &cfg);
    else cfg.tie = f->cfg.tie_word_embeddings;
  }
  if (st != STAB_OK) { /* an invalid count in the metadata: the attention rows say why */
    snprintf(heads_error, sizeof heads_error, "%s", stab_last_error());
    cfg.heads_error = heads_error;
  }
  p->out_major_file = cfg.out_major;
  /* stabmeter-train's __metadata__ attn_scale: the logit bound of an --attn-scale inverse model
   * is 1/d_h times q.k, not 1/sqrt(d_h) */
  stab_attn_scale scale = STAB_ATTN_SCALE_SQRT;
  if (is_safetensors(f) &&
      stab_model_attn_scale_from_safetensors(stab_checkpoint_safetensors(f->ck), &scale) != STAB_OK) {
    char why[320];
    snprintf(why, sizeof why, "%s", stab_last_error());
    free(ts);
    return stabi_fail(STAB_EFORMAT, "%s: %s",
                      stabi_checkpoint_directory(f->ck) ? stab_checkpoint_file_path(f->ck, 0) : p->checkpoint, why);
  }
  /* one shard of a model given alone: the names of the other shards' tensors (for the head) */
  size_t n_other = 0;
  const char **other = NULL;
  if (f->siblings && !(other = malloc((stab_shard_index_count(f->siblings) + 1) * sizeof *other))) {
    free(ts);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory", p->checkpoint);
  }
  for (size_t i = 0; f->siblings && i < stab_shard_index_count(f->siblings); i++) {
    const char *name = stab_shard_index_tensor(f->siblings, i, NULL);
    if (name && !ck_find(f, name)) other[n_other++] = name;
  }
  cfg.other_names = other, cfg.n_other = n_other;
  st = stab_model_describe(ts, nt, &cfg, &p->model);
  free(ts), free(other);
  if (st != STAB_OK) return st;
  /* config.json says the head is not the embedding: with no head tensor, the head is missing */
  if (cfg.tie == 0 && !stab_model_has_head(p->model))
    note(p, "warning: config.json says tie_word_embeddings false, but the checkpoint has no lm_head tensor: "
              "the head is missing, and no tied head is reported");
  size_t n = stab_model_count(p->model);
  if (!(p->rows = calloc(n ? n : 1, sizeof *p->rows)))
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for %zu rows", p->checkpoint, n);
  for (size_t i = 0; i < n; i++) {
    const stab_model_entry *e = stab_model_entry_at(p->model, i);
    stabi_probe_row *r = &p->rows[i];
    r->e = e;
    r->t = e->weight, r->bias = e->bias, r->tk = e->weight_k;
    r->name = e->name, r->error = e->why_not;
    r->kind = e->kind, r->layout = e->layout, r->d_in = e->d_in, r->d_out = e->d_out;
    r->heads = e->heads, r->kv_heads = e->kv_heads;
    r->ld = e->ld, r->q_off = e->q_off, r->k_off = e->k_off;
    r->offset = e->offset, r->bias_offset = e->bias_offset;
    r->tied = e->tied;
    r->expert_of = e->expert != STAB_MODEL_NO_EXPERT ? stab_model_entry_at(p->model, e->group)->name : NULL;
    for (size_t k = 0; k < N_EXPERT_METRICS; k++) r->worst[k] = STAB_MODEL_NO_EXPERT;
    r->m = unmeasured();
    r->init_row = SIZE_MAX;
    if (e->kind == STAB_KIND_ATTENTION && e->heads) r->scale = stab_attn_scale_of(scale, e->d_out / e->heads);
    p->n = i + 1;
    if (e->kind == STAB_KIND_ATTENTION && !e->why_not && !(r->head_bounds = calloc(e->heads, sizeof *r->head_bounds)))
      return stabi_fail(STAB_ENOMEM, "%s: out of memory", p->checkpoint);
  }
  p->n = n;
  return STAB_OK;
}

/* ---- opening -------------------------------------------------------------------- */

/* config.json of the model: in a sharded model's directory, else beside the file. None there is
 * nothing; one there that is not a readable regular file (a FIFO would block) is ignored with a
 * word why; a malformed one, or one with a wrong value, is bad input: its values decide heads
 * and the tied head, and a guess would be a wrong measurement. */
static stab_status read_config(const stab_probe *p, const char *path, stabi_probe_ckpt *f) {
  char cfg[4096];
  const char *slash = strrchr(path, '/');
  if (stabi_checkpoint_directory(f->ck)) snprintf(cfg, sizeof cfg, "%s/config.json", stabi_checkpoint_directory(f->ck));
  else snprintf(cfg, sizeof cfg, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
  struct stat sb;
  if (stat(cfg, &sb) != 0) {
    /* nothing there is nothing; a name there that leads nowhere (a symbolic link that loops or
     * dangles, a directory that cannot be searched) is a config.json not read, said */
    int e = errno;
    if (e == ENOENT && lstat(cfg, &sb) != 0) return STAB_OK;
    note(p, "warning: %s: cannot be read (%s); ignored", cfg, e == ENOENT ? "a symbolic link to nothing" : strerror(e));
    return STAB_OK;
  }
  stab_status st = stab_hf_config_read(cfg, &f->cfg);
  if (st == STAB_OK || st == STAB_EFORMAT || st == STAB_ERANGE || st == STAB_ENOMEM) return st;
  note(p, "%s; ignored", stab_last_error());
  return STAB_OK;
}

/* A single safetensors file that an index beside it lists as one of its shards: said, and kept
 * (f->siblings), so that the tied head is decided over the whole model. */
static stab_status find_siblings(const stab_probe *p, const char *path, stabi_probe_ckpt *f) {
  size_t k = 0;
  stab_status st = stab_shard_index_beside(path, &f->siblings, &k);
  if (st == STAB_OK) {
    const char *ix = stab_shard_index_path(f->siblings), *slash = strrchr(ix, '/');
    note(p, "note: %s is shard %zu of %zu of the model indexed by %s: its other tensors are in the other shards; "
              "probe the directory (%.*s) to measure the whole model", path, k + 1,
              stab_shard_index_shard_count(f->siblings), ix, slash ? (int)(slash - ix) : 1, slash ? ix : ".");
  } else if (st != STAB_ENOTFOUND) {
    note(p, "warning: %s; the file is probed alone", stab_last_error());
  }
  return st == STAB_ENOMEM ? st : STAB_OK;
}

/* Stops the opening: file_fn said so. */
static stab_status stopped(const char *path) {
  return stabi_fail(STAB_ESTATE, "%s: opening stopped by the caller's file_fn", path);
}

/* The checkpoint at path, opened through its handle (which decides the format: a folder, an
 * index, a file by its first bytes, a shard of a split GGUF model), the caller told of each
 * file's mapped bytes and of what opening found; a single safetensors file's siblings
 * (find_siblings) and the model's config.json (read_config). */
static stab_status open_checkpoint(const stab_probe *p, const char *path, stabi_probe_ckpt *f) {
  f->cfg.tie_word_embeddings = -1;
  if (file_event(p, STAB_PROBE_FILE_OPENING, path, NULL, 0)) return stopped(path); /* parsed from the mapping */
  stab_status st = stab_checkpoint_open(path, &f->ck);
  if (file_event(p, STAB_PROBE_FILE_OPENED, path, NULL, 0)) return stopped(path);
  if (st != STAB_OK) return st;
  /* from here on, the mapped bytes the tensors span, file by file */
  for (size_t k = 0; k < stab_checkpoint_file_count(f->ck); k++) {
    const void *lo;
    size_t len;
    if (stabi_checkpoint_file_span(f->ck, k, &lo, &len) &&
        file_event(p, STAB_PROBE_FILE_MAPPED, stab_checkpoint_file_path(f->ck, k), lo, len))
      return stopped(path);
  }
  if (stab_checkpoint_note(f->ck)) note(p, "%s", stab_checkpoint_note(f->ck));
  if (!is_safetensors(f)) return STAB_OK;
  if (!stabi_checkpoint_directory(f->ck) && (st = find_siblings(p, path, f)) != STAB_OK) return st;
  return read_config(p, path, f);
}

/* ---- the reference's counterparts ---------------------------------------------------- */


/* The GGUF file's general.architecture, or NULL. */
static const char *gguf_arch(const stab_gguf *g) {
  const stab_gguf_kv *kv = stab_gguf_find_metadata(g, "general.architecture");
  return kv && kv->type == STAB_GGUF_STRING ? kv->s : NULL;
}

/* Sets r's owned reason for having no update (the message names the tensor looked for): fmt
 * with one or two %s, a and b (b unused by a format with one). */
static const char *no_update_because(stabi_probe_row *r, const char *fmt, const char *a, const char *b) {
  char buf[700];
  snprintf(buf, sizeof buf, fmt, a, b);
  free(r->owned_no_update);
  r->owned_no_update = strdup(buf);
  return r->owned_no_update ? r->owned_no_update : "not found";
}

/* The counterpart of tensor name (of cur, a GGUF or a safetensors) in prev, the other format,
 * by the library's name map (arch: the GGUF file's architecture), into *how; its name in
 * tried. NULL when the name has no mapping or the mapped name is not in prev. */
static const stab_ckpt_tensor *converted_find(const stabi_probe_ckpt *cur, const stabi_probe_ckpt *prev, const char *arch, const char *name,
                                              stab_name_transform *how, char *tried, size_t cap) {
  stab_status st = gguf_of(cur) ? stab_name_map_to_hf(arch, name, tried, cap, how)
                           : stab_name_map_to_gguf(arch, name, tried, cap, how);
  if (st != STAB_OK) return tried[0] = '\0', NULL;
  const stab_ckpt_tensor *t = ck_find(prev, tried);
  if (!t && gguf_of(cur) && !strcmp(arch, "gpt2")) { /* HF GPT-2 under GPT2LMHeadModel's transformer. */
    char prefixed[600];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", tried);
    if ((t = ck_find(prev, prefixed))) {
      size_t k = strlen(prefixed) < cap ? strlen(prefixed) : cap - 1;
      memcpy(tried, prefixed, k), tried[k] = '\0';
    }
  }
  return t;
}

/* 1 when cur and ref are a GGUF file and a safetensors (either way round): their tensors are
 * matched through the name map. */
static int across_formats(const stabi_probe_ckpt *cur, const stabi_probe_ckpt *ref) {
  return (gguf_of(cur) != NULL) != (gguf_of(ref) != NULL) && (is_safetensors(cur) || is_safetensors(ref));
}

/* The counterpart in ref of tensor name of cur: the tensor of the same name, or across formats
 * (across_formats) the tensor of the mapped name (converted_find), what the converter did to it
 * into *how (all 0 for the same name). The one matching of --prev's update and of the ratios'
 * reference (--init, or the --prev file). NULL when there is none; the name looked for in
 * tried ("" when the name has no mapping). */
static const stab_ckpt_tensor *counterpart_tensor(const stabi_probe_ckpt *cur, const stabi_probe_ckpt *ref, const char *name,
                                                  stab_name_transform *how, char *tried, size_t cap) {
  memset(how, 0, sizeof *how);
  if (across_formats(cur, ref))
    return converted_find(cur, ref, gguf_arch(gguf_of(cur) ? gguf_of(cur) : gguf_of(ref)), name, how, tried, cap);
  snprintf(tried, cap, "%s", name);
  return ck_find(ref, name);
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
static const char *find_converted(const stabi_probe_ckpt *cur, const stabi_probe_ckpt *prev, stabi_probe_row *r) {
  const stab_gguf *g = gguf_of(cur) ? gguf_of(cur) : gguf_of(prev);
  const stabi_probe_ckpt *hf = gguf_of(cur) ? prev : cur;
  const char *arch = gguf_arch(g);
  char tried[512], btried[512];
  stab_name_transform how, bhow;
  const stab_ckpt_tensor *pt = counterpart_tensor(cur, prev, r->t->name, &how, tried, sizeof tried);
  if (!pt && !tried[0]) return "not found (no counterpart name: the tensor is not in the name map)";
  if (!pt) return no_update_because(r, "not found (looked for '%s')", tried, NULL);
  const stab_ckpt_tensor *pbias = NULL;
  if (r->bias && !(pbias = counterpart_tensor(cur, prev, r->bias->name, &bhow, btried, sizeof btried)))
    return no_update_because(r, "its bias is not found (looked for '%s')", btried[0] ? btried : r->bias->name, NULL);
  /* the HF side is in-major when it has Conv1D's layout: the row's own, or the rule's for it
   * (out-major throughout in a file of stabmeter-train, as its __metadata__ says) */
  stab_model_config hf_rules = stab_model_default_config();
  hf_rules.out_major = stabi_model_trainer_file(stab_checkpoint_safetensors(hf->ck));
  int hf_in_major = gguf_of(cur) ? pt->ndim == 2 && stab_model_linear_layout(&hf_rules, pt->name, (size_t)pt->shape[0],
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
  r->prev_heads = heads, r->prev_to_gguf = gguf_of(cur) != NULL, r->prev_transposed = transposed;
  /* the GGUF value is the HF one plus the offset: the reference moved to the current's side */
  r->prev_offset = gguf_of(cur) ? how.gguf_offset : -how.gguf_offset;
  return NULL;
}

/* The reference checkpoint's tensors row r's update is measured against (--prev): the same
 * names, the same shapes, a dtype the probe reads, into r->prev_t and r->prev_bias; between a
 * GGUF file and a safetensors, the converted names (find_converted). NULL when found, else why
 * not (for the row's message). Attention rows have no update (the articles define none for
 * the logit bound). */
static const char *find_counterpart(const stabi_probe_ckpt *cur, const stabi_probe_ckpt *prev, stabi_probe_row *r) {
  if (across_formats(cur, prev)) return find_converted(cur, prev, r);
  char tried[512];
  stab_name_transform how;
  const stab_ckpt_tensor *pt = counterpart_tensor(cur, prev, r->t->name, &how, tried, sizeof tried);
  const stab_ckpt_tensor *pbias = r->bias ? counterpart_tensor(cur, prev, r->bias->name, &how, tried, sizeof tried) : NULL;
  if (!pt) return "not found";
  /* a slice of a 3-D expert tensor: the same expert's slice of the reference's */
  if (stabi_is_expert(r) && r->t->ndim == 2 && pt->ndim == 3) {
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

/* ---- the rows' names, --filter and --prev ------------------------------------------- */

/* 1 when glob matches row r's name or the name of a tensor it reads (weight, bias, key). */
static int row_matches(const stabi_probe_row *r, const char *glob) {
  return !fnmatch(glob, r->name, 0) || !fnmatch(glob, r->t->name, 0) ||
         (r->bias && !fnmatch(glob, r->bias->name, 0)) || (r->tk && !fnmatch(glob, r->tk->name, 0));
}

static void row_free(stabi_probe_row *r) { free(r->head_bounds), free(r->owned_no_update); }

/* --filter: keeps the rows some filter matches (row_matches), in their order; *tied_src
 * follows the tied head's embedding (SIZE_MAX when either is dropped: the head, if kept, is
 * then measured alone). A filter that matches nothing is a typo, as in stabmeter-export: the
 * message names it, and the status is STAB_ENOTFOUND with nothing kept. */
static stab_status filter_rows(const stab_probe *p, stabi_probe_row *rows, size_t *n, size_t *tied_src) {
  const stab_probe_params *o = &p->params;
  if (!o->nfilters) return STAB_OK;
  for (size_t k = 0; k < o->nfilters; k++) {
    size_t i = 0;
    while (i < *n && !row_matches(&rows[i], o->filters[k])) i++;
    if (i == *n) {
      return stabi_fail(STAB_ENOTFOUND, "--filter '%s' matches no layer or tensor name of %s (names like '%s', '%s')",
                        o->filters[k], p->checkpoint, *n ? rows[0].name : "", *n > 1 ? rows[*n - 1].name : "");
    }
  }
  char *keeps = calloc(*n ? *n : 1, 1);
  if (!keeps) return stabi_fail(STAB_ENOMEM, "%s: out of memory filtering %zu rows", p->checkpoint, *n);
  for (size_t i = 0; i < *n; i++)
    for (size_t k = 0; k < o->nfilters && !keeps[i]; k++) keeps[i] = (char)row_matches(&rows[i], o->filters[k]);
  /* a layer of experts and its experts go together (the layer's metrics are theirs): rows are
   * still one per entry here, so an expert's group is the index of its layer's row */
  for (size_t i = 0; i < *n; i++)
    if (stabi_is_expert(&rows[i]) && keeps[i]) keeps[rows[i].e->group] = 1;
  for (size_t i = 0; i < *n; i++)
    if (stabi_is_expert(&rows[i]) && keeps[rows[i].e->group]) keeps[i] = 1;
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
  return STAB_OK;
}

/* Rows without a counterpart counted as the report's table shows them: a layer of experts is
 * one layer (without one when it or one of its experts, the rows after it, has none), an
 * expert no layer of its own. asked[i]: row i is matched at all, miss[i]: it found none. The
 * layers asked, those missing and the first three of their names (a list of cap bytes). */
static void count_layers(const stabi_probe_row *rows, size_t n, const char *asked, const char *miss, size_t *n_asked,
                         size_t *n_missing, char *first, size_t cap) {
  *n_asked = *n_missing = 0;
  first[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    if (stabi_is_expert(&rows[i])) continue;
    int a = asked[i], m = asked[i] && miss[i];
    for (size_t j = i + 1; j < n && stabi_is_expert(&rows[j]); j++) a |= asked[j], m |= asked[j] && miss[j];
    if (!a) continue;
    ++*n_asked;
    if (!m) continue;
    size_t len = strlen(first);
    if (++*n_missing <= 3) snprintf(first + len, cap - len, "%s%s", len ? ", " : "", rows[i].name);
  }
}

/* --prev: finds each row's counterpart in the reference checkpoint. None at all means the two
 * files are not two checkpoints of one model (or the wrong file was given): 2 and a message
 * naming both (STAB_ENOTFOUND). Some missing: a warning with their count and first names; those
 * layers have no update (their reason goes to the report's errors). */
static stab_status match_reference(const stab_probe *p, const stabi_probe_ckpt *cur, const stabi_probe_ckpt *prev,
                                   stabi_probe_row *rows, size_t n) {
  const char *reference = p->reference, *checkpoint = p->checkpoint;
  size_t missing_rows = 0, missing_name = 0;
  char first[256] = "";
  /* a GGUF file against a safetensors: only through a name map of the GGUF's architecture */
  const stab_gguf *g = gguf_of(cur) && is_safetensors(prev) ? gguf_of(cur) : gguf_of(prev) && is_safetensors(cur) ? gguf_of(prev) : NULL;
  if (g && !stab_name_map_knows(gguf_arch(g))) {
    return stabi_fail(STAB_ENOTFOUND, "--prev %s: %s is GGUF and %s safetensors, and the GGUF architecture '%s' has "
                      "no name map to Hugging Face names (llama, qwen2, gemma, phi3 and gpt2 have one): no tensor can be "
                      "matched", reference, gguf_of(cur) ? checkpoint : reference, gguf_of(cur) ? reference : checkpoint,
                      gguf_arch(g) ? gguf_arch(g) : "(none: no general.architecture)");
  }
  char *asked = calloc(n ? n : 1, 1), *miss = calloc(n ? n : 1, 1);
  if (!asked || !miss) {
    free(asked), free(miss);
    return stabi_fail(STAB_ENOMEM, "--prev %s: out of memory", reference);
  }
  for (size_t i = 0; i < n; i++) {
    stabi_probe_row *r = &rows[i];
    /* a layer of experts: its experts' rows are matched (count_layers counts it with them) */
    if (r->error || r->kind == STAB_KIND_ATTENTION || stabi_is_expert_layer(r)) continue;
    asked[i] = 1;
    if (!(r->no_update = find_counterpart(cur, prev, r))) continue;
    miss[i] = 1, missing_rows++;
    missing_name += !strncmp(r->no_update, "not found", 9);
  }
  size_t n_asked, n_missing;
  count_layers(rows, n, asked, miss, &n_asked, &n_missing, first, sizeof first);
  free(asked), free(miss);
  if (n_asked && n_missing == n_asked) {
    return stabi_fail(STAB_ENOTFOUND, "--prev %s: none of the %zu layers of %s has a counterpart there (%s): not "
              "an earlier checkpoint of the same model", reference, n_asked, checkpoint,
              missing_name == missing_rows ? (g ? "no tensor of the converted name" : "no tensor of the same name")
                                    : (g ? "no tensor of the converted name and shape" : "no tensor of the same name and shape"));
  }
  if (n_missing)
    note(p, "warning: --prev %s: %zu of %zu layers have no counterpart there, so no update: %s%s", reference,
         n_missing, n_asked, first, n_missing > 3 ? ", ..." : "");
  return STAB_OK;
}

/* ---- the step ------------------------------------------------------------------------ */

/* The step a checkpoint's file or directory name states, or -1. Only names that say "this is
 * step N": the word "step" or "checkpoint" (any case, at the start of the name or after a
 * character that is not a letter or digit) followed by an optional '-', '_' or '.' and digits
 * that end there (step-000100.safetensors as harness/train names them, the Hugging Face
 * Trainer's checkpoint-500), the last such in the name; or llm.c's model_00005000.bin (the whole
 * stem "model_" and digits). Never any other number of the name: a model's version or size
 * (tinyllama-1.1b-chat-v1.0) or a shard's index (model-00001-of-00003) is no step. */
static int64_t step_from_name(const char *path) {
  static const char *const words[] = {"step", "checkpoint", NULL};
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  int64_t step = -1;
  for (const char *p = base; *p; p++) {
    if (p > base && ((p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z')))
      continue;
    for (size_t w = 0; words[w]; w++) {
      size_t n = strlen(words[w]);
      if (strncasecmp(p, words[w], n)) continue;
      const char *q = p + n;
      if (*q == '-' || *q == '_' || *q == '.') q++;
      int64_t v = 0;
      int digits = 0;
      while (*q >= '0' && *q <= '9' && digits < 18) v = v * 10 + (*q++ - '0'), digits++;
      int letter_after = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z');
      if (digits && !(*q >= '0' && *q <= '9') && !letter_after) step = v;
    }
  }
  if (step >= 0) return step;
  size_t stem = strcspn(base, ".");
  if (stem <= 6 || strncmp(base, "model_", 6) || stem - 6 > 18) return -1;
  for (size_t k = 6; k < stem; k++)
    if (base[k] < '0' || base[k] > '9') return -1;
  for (size_t k = 6; k < stem; k++) step = (step < 0 ? 0 : step * 10) + (base[k] - '0');
  return step;
}

/* The training step the checkpoint's own metadata gives, or -1: safetensors __metadata__
 * "step" or "global_step", or "steps" in a file of stabmeter-train (the steps taken, which is
 * the step its trace records these weights at); GGUF training.iteration_count (llama.cpp's
 * training files; general.* has no step). llm.c's header has none. A key present with a value
 * that is not a whole number is -1 with why saying so. */
static int64_t step_from_metadata(const stab_probe *p, const stabi_probe_ckpt *f, const char **from, char *why, size_t cap) {
  static const char *const keys[] = {"step", "global_step", "steps", NULL};
  static const char *const said[] = {"the checkpoint's __metadata__ step", "the checkpoint's __metadata__ global_step",
                                     "the checkpoint's __metadata__ steps (stabmeter-train's)"};
  unsigned long long v;
  why[0] = '\0';
  for (size_t j = 0; keys[j]; j++) {
    if (!strcmp(keys[j], "steps") && !p->out_major_file) continue; /* another producer's "steps" may be the total */
    const stab_safetensors *s = stab_checkpoint_safetensors(f->ck); /* a sharded model's: its first shard's */
    for (size_t i = 0; i < stab_safetensors_metadata_count(s); i++) {
      const char *k, *val;
      stab_safetensors_metadata(s, i, &k, &val);
      if (strcmp(k, keys[j])) continue;
      if (whole_number(val, 0, INT64_MAX, &v)) {
        *from = said[j];
        return (int64_t)v;
      }
      snprintf(why, cap, "__metadata__ %s is '%.40s', not a whole number", k, val);
      return -1;
    }
  }
  if (gguf_of(f)) {
    uint64_t u;
    stab_status st = stab_gguf_get_uint(gguf_of(f), "training.iteration_count", &u);
    if (st == STAB_OK && u <= INT64_MAX) {
      *from = "the checkpoint's GGUF training.iteration_count";
      return (int64_t)u;
    }
    if (st != STAB_ENOTFOUND) snprintf(why, cap, "GGUF training.iteration_count is not a whole number");
  }
  return -1;
}

stab_status stab_probe_steps_found(const stab_probe *p, stab_probe_steps *out) {
  if (!p || !out) return stabi_fail(STAB_EINVAL, "stab_probe_steps_found: NULL %s", p ? "out" : "probe");
  memset(out, 0, sizeof *out);
  out->metadata_step =
      step_from_metadata(p, &p->cur, &out->metadata_source, out->metadata_problem, sizeof out->metadata_problem);
  out->name_step = step_from_name(p->checkpoint);
  out->name_source = "the file name";
  if (out->name_step < 0 && stabi_checkpoint_directory(p->cur.ck)) {
    /* a sharded model: its directory's name (the Hugging Face Trainer's checkpoint-500/), a
     * trailing '/' aside */
    char d[4096];
    snprintf(d, sizeof d, "%s", stabi_checkpoint_directory(p->cur.ck));
    for (size_t k = strlen(d); k > 1 && d[k - 1] == '/'; k--) d[k - 1] = '\0';
    if ((out->name_step = step_from_name(d)) >= 0) out->name_source = "the directory's name";
  }
  return STAB_OK;
}

/* ---- the probe ---------------------------------------------------------------------- */

stab_probe_params stab_probe_default_params(void) {
  stab_probe_params p = {0};
  p.tol = 1e-3;
  p.tight = STAB_TIGHT_CENTRED;
  return p;
}

static char *copy_of(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *c = malloc(n);
  return c ? memcpy(c, s, n) : NULL;
}

/* The caller's overrides and filters copied into p (the params keep pointing at the copies). */
static stab_status copy_params(stab_probe *p, const stab_probe_params *params) {
  p->params = *params;
  size_t no = params->nkinds + params->nlayouts;
  p->overrides = calloc(no ? no : 1, sizeof *p->overrides);
  p->filters = calloc(params->nfilters ? params->nfilters : 1, sizeof *p->filters);
  if (!p->overrides || !p->filters) return stabi_fail(STAB_ENOMEM, "stab_probe_open: out of memory");
  for (size_t i = 0; i < no; i++) {
    const stab_model_override *from = i < params->nkinds ? &params->kinds[i] : &params->layouts[i - params->nkinds];
    if (!from->glob || !from->value) return stabi_fail(STAB_EINVAL, "stab_probe_open: override %zu has a NULL glob or value", i);
    p->overrides[i].glob = copy_of(from->glob), p->overrides[i].value = copy_of(from->value);
    if (!p->overrides[i].glob || !p->overrides[i].value) return stabi_fail(STAB_ENOMEM, "stab_probe_open: out of memory");
  }
  for (size_t i = 0; i < params->nfilters; i++) {
    if (!params->filters[i]) return stabi_fail(STAB_EINVAL, "stab_probe_open: filter %zu is NULL", i);
    if (!(p->filters[i] = copy_of(params->filters[i]))) return stabi_fail(STAB_ENOMEM, "stab_probe_open: out of memory");
  }
  p->params.kinds = p->overrides, p->params.layouts = p->overrides + params->nkinds;
  p->params.filters = (const char *const *)p->filters;
  p->params.prev = p->reference;
  return STAB_OK;
}

stab_status stab_probe_open(const char *path, const stab_probe_params *params, stab_probe **out) {
  if (out) *out = NULL;
  if (!path || !params || !out)
    return stabi_fail(STAB_EINVAL, "stab_probe_open: NULL %s", !path ? "path" : !params ? "params" : "out");
  if (!*path || (params->prev && !*params->prev))
    return stabi_fail(STAB_EINVAL, "stab_probe_open: %s is an empty path", !*path ? "the checkpoint" : "params.prev");
  stab_probe *p = calloc(1, sizeof *p);
  if (!p) return stabi_fail(STAB_ENOMEM, "stab_probe_open: out of memory");
  p->tied_src = SIZE_MAX;
  p->prevc.cfg.tie_word_embeddings = -1;
  stab_status st = STAB_OK;
  if (!(p->checkpoint = copy_of(path)) || (params->prev && !(p->reference = copy_of(params->prev))))
    st = stabi_fail(STAB_ENOMEM, "stab_probe_open: out of memory");
  if (st == STAB_OK) st = copy_params(p, params);
  if (st == STAB_OK) st = open_checkpoint(p, p->checkpoint, &p->cur);
  if (st == STAB_OK && p->reference) p->has_prev = 1, st = open_checkpoint(p, p->reference, &p->prevc);
  /* the rows: the library's model of the checkpoint */
  if (st == STAB_OK) st = describe(p);
  /* a tied head is the last entry; it repeats its embedding's row */
  for (size_t i = 0; st == STAB_OK && p->n && p->rows[p->n - 1].tied && i + 1 < p->n && p->tied_src == SIZE_MAX; i++)
    if (p->rows[i].kind == STAB_KIND_EMBEDDING && p->rows[i].t == p->rows[p->n - 1].t) p->tied_src = i;
  if (st == STAB_OK) st = filter_rows(p, p->rows, &p->n, &p->tied_src);
  if (st == STAB_OK && p->reference) st = match_reference(p, &p->cur, &p->prevc, p->rows, p->n);
  if (st != STAB_OK) {
    stab_probe_free(p);
    return st;
  }
  *out = p;
  return STAB_OK;
}

/* ---- the ratios' reference (--init) --------------------------------------------------- */

/* Rows by the tensor they read, then kind, fused q/k/v part and expert: for finding a row's counterpart among
 * another probe's rows. tensor: the row's own tensor name, or for a key the name of its
 * counterpart there (counterpart_tensor). */
typedef struct {
  const stabi_probe_row *rows;
  size_t i;
  const char *tensor;
} row_ref;
static size_t expert_no(const stabi_probe_row *r) { return r->e ? r->e->expert : STAB_MODEL_NO_EXPERT; }
static int part_no(const stabi_probe_row *r) { return r->e ? r->e->part : 0; }
static int by_tensor_kind(const void *pa, const void *pb) {
  const row_ref *a = pa, *b = pb;
  const stabi_probe_row *x = &a->rows[a->i], *y = &b->rows[b->i];
  int c = strcmp(a->tensor, b->tensor);
  if (c) return c;
  if (x->kind != y->kind) return (int)x->kind - (int)y->kind;
  if (part_no(x) != part_no(y)) return part_no(x) - part_no(y); /* q, k, v of one fused tensor */
  return expert_no(x) < expert_no(y) ? -1 : expert_no(x) > expert_no(y);
}

/* Each row's counterpart among the init probe's rows: the row of the same kind (and expert)
 * reading the tensor --prev's update would be measured against (counterpart_tensor: the same
 * name, or across GGUF and safetensors the converted one; a tied head is not an untied model's
 * lm_head), with the same d_in, d_out, heads and experts (its shape). A row without one gets
 * no ratio; one whose counterpart the converter stored plus an offset (Gemma's norms) has the
 * counterpart read with it, as --prev's update does. The warning counts layers as the table
 * shows them (count_layers). */
static stab_status match_init(stab_probe *p, const char *path) {
  stab_probe *q = p->init;
  row_ref *ix = malloc((q->n ? q->n : 1) * sizeof *ix);
  char *asked = calloc(p->n ? p->n : 1, 1), *miss = calloc(p->n ? p->n : 1, 1);
  if (!ix || !asked || !miss) {
    free(ix), free(asked), free(miss);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  }
  size_t k = 0;
  for (size_t i = 0; i < q->n; i++)
    if (!q->rows[i].error) ix[k++] = (row_ref){q->rows, i, q->rows[i].t->name};
  qsort(ix, k, sizeof *ix, by_tensor_kind);
  const int same_as_prev = p->reference && !strcmp(p->reference, path);
  for (size_t i = 0; i < p->n; i++) {
    stabi_probe_row *r = &p->rows[i];
    r->init_row = SIZE_MAX;
    if (r->error) continue;
    char tried[512];
    stab_name_transform how;
    const stab_ckpt_tensor *ct = counterpart_tensor(&p->cur, &q->cur, r->t->name, &how, tried, sizeof tried);
    /* the key compares this probe's row against the other's: a one-row array of its own */
    row_ref key = {p->rows, i, ct ? ct->name : ""};
    const row_ref *hit = ct && k ? bsearch(&key, ix, k, sizeof *ix, by_tensor_kind) : NULL;
    stabi_probe_row *c = hit ? &q->rows[hit->i] : NULL;
    size_t ce = c && c->e ? c->e->n_expert : 0, re = r->e ? r->e->n_expert : 0;
    if (c && c->d_in == r->d_in && c->d_out == r->d_out && c->heads == r->heads && ce == re) {
      r->init_row = hit->i;
      /* the GGUF value is the HF one plus the offset: the counterpart read on this side */
      c->self_offset = gguf_of(&p->cur) ? how.gguf_offset : -how.gguf_offset;
      asked[i] = 1;
      continue;
    }
    /* the --prev file as the reference: its warning named the layers it lacks already (a
     * layer of experts, when one of its experts has no update) */
    int named = r->no_update != NULL;
    for (size_t j = i + 1; stabi_is_expert_layer(r) && j < p->n && stabi_is_expert(&p->rows[j]); j++)
      named |= p->rows[j].no_update != NULL;
    asked[i] = !(same_as_prev && named);
    miss[i] = 1;
  }
  free(ix);
  size_t n_asked, n_missing;
  char first[256];
  count_layers(p->rows, p->n, asked, miss, &n_asked, &n_missing, first, sizeof first);
  free(asked), free(miss);
  if (n_asked && n_missing == n_asked && !same_as_prev)
    return stabi_fail(STAB_ENOTFOUND, "%s: none of the %zu layers of %s has a counterpart there (a layer of the same "
                      "kind and shape reading the tensor of the %s name): not a checkpoint of the same model", path,
                      n_asked, p->checkpoint, across_formats(&p->cur, &q->cur) ? "converted" : "same");
  if (n_missing)
    note(p, "warning: %s: %zu of %zu layers have no counterpart there, so no ratio: %s%s", path, n_missing, n_asked,
         first, n_missing > 3 ? ", ..." : "");
  return STAB_OK;
}

stab_status stab_probe_set_init(stab_probe *p, const char *path) {
  if (!p || !path) return stabi_fail(STAB_EINVAL, "stab_probe_set_init: NULL %s", p ? "path" : "probe");
  if (!*path) return stabi_fail(STAB_EINVAL, "stab_probe_set_init: the path is empty");
  if (p->init) return stabi_fail(STAB_ESTATE, "stab_probe_set_init: %s: the probe has an init reference already", path);
  /* the init side is opened and described as the checkpoint is (its own metadata: heads,
   * attn_scale, config.json), without --prev or filters: rows are matched afterwards */
  stab_probe_params ip = p->params;
  ip.prev = NULL, ip.filters = NULL, ip.nfilters = 0;
  stab_status st = stab_probe_open(path, &ip, &p->init);
  if (st == STAB_OK) st = match_init(p, p->init->checkpoint);
  if (st != STAB_OK) {
    stab_probe_free(p->init);
    p->init = NULL;
    for (size_t i = 0; i < p->n; i++) p->rows[i].init_row = SIZE_MAX;
  }
  return st;
}

const char *stab_probe_init_path(const stab_probe *p) { return p && p->init ? p->init->checkpoint : NULL; }

void stab_probe_free(stab_probe *p) {
  if (!p) return;
  stab_probe_free(p->init);
  for (size_t i = 0; p->rows && i < p->n; i++) row_free(&p->rows[i]);
  free(p->rows);
  stab_model_free(p->model);
  ck_close(&p->cur);
  ck_close(&p->prevc);
  for (size_t i = 0; p->overrides && i < p->params.nkinds + p->params.nlayouts; i++) free((char *)p->overrides[i].glob), free((char *)p->overrides[i].value);
  for (size_t i = 0; p->filters && i < p->params.nfilters; i++) free(p->filters[i]);
  free(p->overrides), free(p->filters), free(p->checkpoint), free(p->reference);
  free(p);
}

size_t stab_probe_count(const stab_probe *p) { return p ? p->n : 0; }

/* A tensor's bytes per element, quantized types included (their blocks' bytes over their
 * elements). */
static double bytes_per_element(const stab_ckpt_tensor *t) {
  return t && t->count ? (double)stab_ckpt_nbytes(t) / (double)t->count : 0;
}

stab_status stab_probe_row_at(stab_probe *p, size_t i, stab_probe_row *out) {
  if (!p || !out || i >= p->n)
    return stabi_fail(STAB_EINVAL, "stab_probe_row_at: %s", !p || !out ? "NULL argument" : "row out of range");
  stabi_probe_expert_layers(p);
  const stabi_probe_row *r = &p->rows[i];
  stab_probe_row w = {0};
  w.name = r->name, w.tensor = r->t->name, w.kind = r->kind;
  w.layout = r->kind == STAB_KIND_LINEAR || r->kind == STAB_KIND_ATTENTION ? r->layout : STAB_LAYOUT_NATURAL;
  w.dtype = r->t->dtype_name;
  if (stabi_is_expert_layer(r) && r->t->ndim == 2) w.shape[w.ndim++] = r->e->n_expert;
  for (size_t d = 0; d < r->t->ndim && w.ndim < 3; d++) w.shape[w.ndim++] = r->t->shape[d];
  w.count = r->t->count, w.d_in = r->d_in, w.d_out = r->d_out;
  w.bias = r->bias ? r->bias->name : NULL;
  w.key_tensor = r->kind == STAB_KIND_ATTENTION && r->tk ? r->tk->name : NULL;
  w.heads = r->heads, w.kv_heads = r->kv_heads;
  w.reference_tensor = r->prev_t ? r->prev_t->name : NULL;
  w.reference_dtype = r->prev_t ? r->prev_t->dtype_name : NULL;
  w.tied = r->tied;
  w.n_expert = r->e ? r->e->n_expert : 0;
  w.expert = r->e ? r->e->expert : STAB_MODEL_NO_EXPERT;
  w.expert_of = r->expert_of;
  memcpy(w.worst, r->worst, sizeof w.worst);
  w.error = r->error, w.no_update = r->no_update;
  w.measured = r->measured, w.metrics = r->m;
  w.head_bounds = r->kind == STAB_KIND_ATTENTION ? r->head_bounds : NULL;
  /* what measuring it reads: nothing for a row not measured or a layer of experts (its
   * experts' rows read) */
  if (!r->error && !stabi_is_expert_layer(r)) {
    const stab_ckpt_tensor *ts[STAB_PROBE_MAX_READS] = {r->t, r->bias, r->tk, r->prev_t, r->prev_bias};
    for (size_t k = 0; k < STAB_PROBE_MAX_READS; k++) {
      if (!ts[k] || !stab_ckpt_nbytes(ts[k])) continue;
      stab_probe_read *rd = &w.reads[w.nreads++];
      rd->tensor = ts[k]->name, rd->data = ts[k]->data, rd->bytes = stab_ckpt_nbytes(ts[k]);
      rd->file = stabi_checkpoint_file_at(k < 3 ? p->cur.ck : p->prevc.ck, ts[k], &rd->offset);
    }
    w.work = stabi_probe_row_work(r) * bytes_per_element(r->t);
    if (r->prev_t) w.work += stabi_probe_row_work(r) * bytes_per_element(r->prev_t);
  }
  *out = w;
  return STAB_OK;
}
