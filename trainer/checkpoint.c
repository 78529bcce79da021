/* checkpoint.c — the trainer's checkpoints through the library's safetensors writer and
 * reader: what the trainer adds is the layout (the model's tensor table under a prefix per
 * part), the metadata, and the checks that a checkpoint fits the model and run resuming it.
 * Harness code: messages on stderr (saving) or in err (loading). */
#include "checkpoint.h"

#include "cli.h"
#include "out_dir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The safetensors file of the parts: __metadata__ (format, producer, optimizer, steps, tied,
 * heads, attn_scale, lr, seed, in this order), then each part's tensors in table order, F32,
 * gains and biases 1-D: the data is each part's flat buffer as it is. A tied head is not stored
 * (as in Hugging Face checkpoints: lm_head.weight is transformer.wte.weight). */
static int save(const model *m, const char *path, const options *o, size_t steps, const ckpt_part *parts,
                size_t n_parts) {
  char producer[96], step_s[32], heads[32], lr[40], seed[32];
  snprintf(producer, sizeof producer, "stabmeter-train %s", stab_version());
  snprintf(step_s, sizeof step_s, "%zu", steps);
  snprintf(heads, sizeof heads, "%zu", m->c.heads);
  snprintf(lr, sizeof lr, "%.17g", o->lr);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
  const char *const meta[] = {"format", "pt", "producer", producer,
                              "optimizer", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest",
                              "steps", step_s, "tied", m->c.untied ? "false" : "true", "heads", heads,
                              "attn_scale", m->c.attn_inverse ? "inverse" : "sqrt", "lr", lr, "seed", seed};
  size_t n = n_parts * m->n_tensors;
  stab_safetensors_entry *e = calloc(n, sizeof *e);
  char(*names)[128] = calloc(n, sizeof *names);
  if (!e || !names) {
    free(e), free(names);
    cli_error("%s: out of memory", path);
    return 1;
  }
  for (size_t p = 0, k = 0; p < n_parts; p++)
    for (size_t i = 0; i < m->n_tensors; i++, k++) {
      const model_tensor *t = &m->tensors[i];
      snprintf(names[k], sizeof names[k], "%s%s", parts[p].prefix, t->name);
      e[k] = (stab_safetensors_entry){.name = names[k], .dtype = "F32", .data = parts[p].data + t->offset};
      if (t->rows == 1) e[k].ndim = 1, e[k].shape[0] = t->cols;
      else e[k].ndim = 2, e[k].shape[0] = t->rows, e[k].shape[1] = t->cols;
    }
  stab_status st = stab_safetensors_write(path, meta, sizeof meta / sizeof *meta / 2, e, n);
  if (st != STAB_OK) cli_error("cannot write the checkpoint: %s", stab_last_error());
  free(e), free(names);
  return st != STAB_OK;
}

int moments_path(char *buf, size_t n, const char *checkpoint) {
  size_t len = strlen(checkpoint), ext = strlen(".safetensors");
  if (len > ext && !strcmp(checkpoint + len - ext, ".safetensors")) len -= ext;
  return snprintf(buf, n, "%.*s.adamw", (int)len, checkpoint) < (int)n ? 0 : -1;
}

int checkpoint_save(const model *m, float *exp_avg, float *exp_avg_sq, const options *o, const char *name,
                    size_t steps) {
  char path[4200], mpath[4300];
  snprintf(path, sizeof path, "%s/%s", o->out, name);
  ckpt_part weights = {"", m->params};
  ckpt_part moments[2] = {{"exp_avg.", exp_avg}, {"exp_avg_sq.", exp_avg_sq}};
  if (mkdirs(o->out)) {
    cli_error("cannot write %s: cannot create the directory %s: %s", path, o->out, strerror(errno));
    return 1;
  }
  if (save(m, path, o, steps, &weights, 1)) return 1;
  if (!exp_avg) return 0;
  if (moments_path(mpath, sizeof mpath, path)) {
    cli_error("cannot write the moments of %s: the path is too long", path);
    return 1;
  }
  return save(m, mpath, o, steps, moments, 2);
}

/* The value of the checkpoint's __metadata__ key, or NULL when it has none. */
static const char *meta(const stab_safetensors *f, const char *key) {
  const char *k, *v;
  for (size_t i = 0; stab_safetensors_metadata(f, i, &k, &v) == STAB_OK; i++)
    if (!strcmp(k, key)) return v;
  return NULL;
}

/* 1 when s is a decimal count (digits only) that fits a size_t, into *out. */
static int parse_count(const char *s, size_t *out) {
  if (!s || !*s || strspn(s, "0123456789") != strlen(s)) return 0;
  errno = 0;
  unsigned long long v = strtoull(s, NULL, 10);
  if (errno || v > (unsigned long long)(size_t)-1) return 0;
  *out = (size_t)v;
  return 1;
}

/* The run's settings that a resumed run must share with its checkpoint: a trace's run_config
 * holds one optimizer, learning rate and seed for all its rows, and the run would not go on as
 * if never stopped with others. A field the checkpoint lacks predates it: not checked. Returns
 * 0, or 2 with the message in err. */
static int check_settings(const stab_safetensors *f, const char *path, const options *o, char *err, size_t errlen) {
  char has[3][64] = {"", "", ""}, want[3][64];
  static const char *const key[3] = {"optimizer", "lr", "seed"};
  static const char *const option[3] = {"--optimizer", "--lr", "--seed"};
  snprintf(want[0], sizeof want[0], "%s", o->optimizer == OPTIM_ADAMW ? "adamw" : "steepest");
  snprintf(want[1], sizeof want[1], "%g", o->lr);
  snprintf(want[2], sizeof want[2], "%llu", (unsigned long long)o->seed);
  for (int i = 0; i < 3; i++) {
    const char *v = meta(f, key[i]);
    if (!v) continue;
    snprintf(has[i], sizeof has[i], "%s", v);
    int same = i == 0 ? !strcmp(has[i], want[i])
               : i == 1 ? strtod(has[i], NULL) == o->lr
                        : strtoull(has[i], NULL, 10) == o->seed && has[i][0] >= '0' && has[i][0] <= '9';
    if (!same) {
      if (i == 1) snprintf(has[i], sizeof has[i], "%g", strtod(has[i], NULL));
      snprintf(err, errlen, "%s: __metadata__ %s is %s, the run has %s %s%s: a resumed run goes on with its "
               "checkpoint's optimizer, learning rate and seed (give %s %s, or start a new run)", path, key[i],
               has[i], option[i], want[i], i == 1 && !o->lr_given ? " (the default)" : "", option[i], has[i]);
      return 2;
    }
  }
  return 0;
}

/* The model's settings no tensor's shape shows: the head's tying, the heads and the attention
 * scale. Returns 0, or 2 with the message in err. */
static int check_model(const stab_safetensors *f, const char *path, const model *m, char *err, size_t errlen) {
  const char *tied = meta(f, "tied"), *want_tied = m->c.untied ? "false" : "true";
  if (!tied || strcmp(tied, want_tied)) {
    snprintf(err, errlen, "%s: __metadata__ tied is not %s: the model has %s head", path, want_tied,
             m->c.untied ? "an untied" : "a tied");
    return 2;
  }
  /* No tensor's shape depends on the heads, so this is the only place a checkpoint trained
   * with other heads shows. (A checkpoint without the field predates it: not checked.) */
  const char *hd = meta(f, "heads");
  size_t heads = 0;
  if (hd && (!parse_count(hd, &heads) || heads != m->c.heads)) {
    snprintf(err, errlen, "%s: __metadata__ heads is %s, the model has --heads %zu", path, hd, m->c.heads);
    return 2;
  }
  /* Nor on the attention scale; a checkpoint without the field predates it, so was trained
   * with 1/sqrt(d_h). */
  const char *sc = meta(f, "attn_scale"), *want_sc = m->c.attn_inverse ? "inverse" : "sqrt";
  if (!sc) sc = "sqrt";
  if (strcmp(sc, want_sc)) {
    snprintf(err, errlen, "%s: __metadata__ attn_scale is %s, the model has --attn-scale %s", path, sc, want_sc);
    return 2;
  }
  return 0;
}

/* Every tensor of the model under each part's prefix, F32 of its shape, read into the part's
 * buffer. Returns 0, or 2 (a tensor missing or of another type or shape) or 1 (the file shrank
 * while read) with the message in err. */
static int read_parts(const stab_safetensors *f, const char *path, const model *m, const ckpt_part *parts,
                      size_t n_parts, char *err, size_t errlen) {
  for (size_t p = 0; p < n_parts; p++)
    for (size_t i = 0; i < m->n_tensors; i++) {
      const model_tensor *t = &m->tensors[i];
      char name[128], shape[64];
      snprintf(name, sizeof name, "%s%s", parts[p].prefix, t->name);
      if (t->rows == 1) snprintf(shape, sizeof shape, "[%zu]", t->cols);
      else snprintf(shape, sizeof shape, "[%zu,%zu]", t->rows, t->cols);
      size_t k;
      const stab_ckpt_tensor *ct = stab_safetensors_find(f, name, &k) == STAB_OK ? stab_safetensors_tensor(f, k) : NULL;
      int fits = ct && ct->dtype == STAB_DTYPE_F32 && ct->ndim == (t->rows == 1 ? 1u : 2u) &&
                 (t->rows == 1 ? ct->shape[0] == t->cols : ct->shape[0] == t->rows && ct->shape[1] == t->cols);
      if (!fits) {
        snprintf(err, errlen, "%s: tensor %s is missing or not F32 of shape %s", path, name, shape);
        return 2;
      }
      if (stab_ckpt_read_f32(ct, 0, t->size, parts[p].data + t->offset) != STAB_OK) {
        snprintf(err, errlen, "%s", stab_last_error());
        return 1;
      }
    }
  return 0;
}

int checkpoint_load(const model *m, const char *path, const ckpt_part *parts, size_t n_parts, size_t *steps,
                    const options *o, char *err, size_t errlen) {
  stab_safetensors *f = NULL;
  /* the library's reader: regular files only (a FIFO given as the checkpoint or found as its
   * .adamw would block), every rule of the format checked before a tensor is read */
  stab_status st = stab_safetensors_open(path, &f);
  if (st != STAB_OK) {
    snprintf(err, errlen, "%s", stab_last_error());
    return st == STAB_ENOMEM ? 1 : 2;
  }
  int rc = 2;
  const char *s = meta(f, "steps");
  if (!s) snprintf(err, errlen, "%s: no __metadata__ steps: not a checkpoint of this program", path);
  else if (!parse_count(s, steps))
    snprintf(err, errlen, "%s: __metadata__ steps is \"%.40s\", not a step count: not a checkpoint of this program",
             path, s);
  else if (!check_model(f, path, m, err, errlen) && !(rc = read_parts(f, path, m, parts, n_parts, err, errlen)))
    /* the settings after the shapes: a checkpoint of another model is said as such first */
    rc = o ? check_settings(f, path, o, err, errlen) : 0;
  stab_safetensors_close(f);
  return rc;
}
