/* llmc.c — the llm.c GPT-2 checkpoint reader: a 256-int32 header, then the parameters
 * in llm.c's order, f32 (version 3) or bf16 (version 5). Its fused per-block tensors are
 * handed out split by layer, qkv into q, k and v, and the padded vocabulary rows of wte are
 * left out, all as views into the read-only mapping. */
#include "checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LLMC_MAGIC 20240326
#define HEADER_BYTES 1024
#define NAME_BYTES 40

struct stab_llmc {
  stabi_mapped file;
  stab_llmc_config cfg;
  stab_ckpt_tensor *tensors;
  char (*names)[NAME_BYTES];
  size_t count;
};

static int32_t load_i32(const unsigned char *p) {
  uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
  int32_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

void stab_llmc_close(stab_llmc *f) {
  if (!f) return;
  stabi_mapped_close(&f->file);
  free(f->tensors);
  free(f->names);
  free(f);
}

/* Appends a view of rows x cols elements (cols 0: a vector of rows) at element offset off
 * of the parameter area. */
static void add_view(stab_llmc *f, const char *name, uint64_t off, uint64_t rows, uint64_t cols) {
  stab_ckpt_tensor *t = &f->tensors[f->count];
  snprintf(f->names[f->count], NAME_BYTES, "%s", name);
  size_t es = f->cfg.version == 5 ? 2 : 4;
  memset(t, 0, sizeof *t);
  t->name = f->names[f->count];
  t->dtype_name = es == 2 ? "BF16" : "F32";
  t->dtype = es == 2 ? STAB_DTYPE_BF16 : STAB_DTYPE_F32;
  t->elem_size = es;
  t->ndim = cols ? 2 : 1;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->count = rows * (cols ? cols : 1);
  t->offset = HEADER_BYTES + off * es;
  t->data = f->file.map + t->offset;
  f->count++;
}

stab_status stab_llmc_open(const char *path, stab_llmc **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_llmc_open: NULL path or output");
  stab_llmc *f = calloc(1, sizeof *f);
  if (!f) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  stab_status st = stabi_mapped_open(&f->file, path, HEADER_BYTES, "the 1024-byte llm.c header");
  if (st != STAB_OK) goto out;
  int32_t h[8];
  for (int k = 0; k < 8; k++) h[k] = load_i32(f->file.map + 4 * k);
  if (h[0] != LLMC_MAGIC) {
    st = stabi_fail(STAB_EFORMAT, "%s: header int 0 (magic) is %d, not %d", path, h[0], LLMC_MAGIC);
    goto out;
  }
  if (h[1] != 3 && h[1] != 5) {
    st = stabi_fail(STAB_EFORMAT, "%s: header int 1 (version) is %d, not 3 (f32) or 5 (bf16)", path, h[1]);
    goto out;
  }
  static const char *const field[8] = {"magic", "version", "max_seq_len", "vocab_size", "num_layers",
                                       "num_heads", "channels", "padded_vocab_size"};
  for (int k = 2; k < 8; k++)
    if (h[k] <= 0 || h[k] > (1 << 24)) {
      st = stabi_fail(STAB_EFORMAT, "%s: header int %d (%s) is %d, outside 1..16777216", path, k, field[k], h[k]);
      goto out;
    }
  stab_llmc_config *c = &f->cfg;
  c->version = h[1], c->max_t = (size_t)h[2], c->vocab = (size_t)h[3], c->layers = (size_t)h[4];
  c->heads = (size_t)h[5], c->channels = (size_t)h[6], c->padded_vocab = (size_t)h[7];
  if (c->vocab > c->padded_vocab) {
    st = stabi_fail(STAB_EFORMAT, "%s: header int 3 (vocab_size %zu) exceeds int 7 (padded_vocab_size %zu)", path,
                    c->vocab, c->padded_vocab);
    goto out;
  }
  if (c->channels % c->heads) {
    st = stabi_fail(STAB_EFORMAT, "%s: header int 6 (channels %zu) is not a multiple of int 5 (num_heads %zu)", path,
                    c->channels, c->heads);
    goto out;
  }
  /* Every product below stays under 2^63: each factor is at most 2^24 and at most three
   * multiply (L * 4C * C < 2^24 * 2^26 * 2^24 overflows, so bound in long double first). */
  const uint64_t Vp = c->padded_vocab, T = c->max_t, L = c->layers, C = c->channels;
  long double want = (long double)Vp * C + (long double)T * C + (long double)L * (13.0L * C + 12.0L * C * C) + 2.0L * C;
  size_t es = c->version == 5 ? 2 : 4;
  if (want * es + HEADER_BYTES > (long double)f->file.size) {
    st = stabi_fail(STAB_EFORMAT, "%s: truncated: the header's shapes need %.0Lf bytes of parameters, the file has "
                    "%llu after the header", path, want * es, (unsigned long long)(f->file.size - HEADER_BYTES));
    goto out;
  }
  uint64_t params = Vp * C + T * C + L * (13 * C + 12 * C * C) + 2 * C; /* exact now: fits the file */
  if (params * es + HEADER_BYTES != f->file.size) {
    st = stabi_fail(STAB_EFORMAT, "%s: %llu bytes after the parameters the header describes (%llu bytes)", path,
                    (unsigned long long)(f->file.size - HEADER_BYTES - params * es), (unsigned long long)(params * es));
    goto out;
  }
  size_t nt = 2 + L * 16 + 2;
  if (!(f->tensors = calloc(nt, sizeof *f->tensors)) || !(f->names = calloc(nt, sizeof *f->names))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  /* llm.c's order; every offset in elements. Shapes as llm.c comments them. */
  uint64_t off = 0;
  add_view(f, "wte", off, c->vocab, C); /* (Vp, C): rows V..Vp-1 are padding, left out */
  off += Vp * C;
  add_view(f, "wpe", off, T, C); /* (maxT, C) */
  off += T * C;
  uint64_t ln1w = off, ln1b = ln1w + L * C, qkvw = ln1b + L * C, qkvb = qkvw + L * 3 * C * C,
           attw = qkvb + L * 3 * C, attb = attw + L * C * C, ln2w = attb + L * C, ln2b = ln2w + L * C,
           fcw = ln2b + L * C, fcb = fcw + L * 4 * C * C, fcpw = fcb + L * 4 * C, fcpb = fcpw + L * C * 4 * C,
           lnfw = fcpb + L * C, lnfb = lnfw + C;
  char nm[NAME_BYTES];
  static const char qkv[3] = {'q', 'k', 'v'};
  for (uint64_t l = 0; l < L; l++) {
    snprintf(nm, sizeof nm, "h.%llu.ln_1.weight", (unsigned long long)l), add_view(f, nm, ln1w + l * C, C, 0);
    snprintf(nm, sizeof nm, "h.%llu.ln_1.bias", (unsigned long long)l), add_view(f, nm, ln1b + l * C, C, 0);
    for (int p = 0; p < 3; p++) { /* qkvw (L, 3C, C): q, k, v are consecutive (C, C) blocks */
      snprintf(nm, sizeof nm, "h.%llu.attn.%c.weight", (unsigned long long)l, qkv[p]);
      add_view(f, nm, qkvw + l * 3 * C * C + (uint64_t)p * C * C, C, C);
      snprintf(nm, sizeof nm, "h.%llu.attn.%c.bias", (unsigned long long)l, qkv[p]);
      add_view(f, nm, qkvb + l * 3 * C + (uint64_t)p * C, C, 0);
    }
    snprintf(nm, sizeof nm, "h.%llu.attn.proj.weight", (unsigned long long)l), add_view(f, nm, attw + l * C * C, C, C);
    snprintf(nm, sizeof nm, "h.%llu.attn.proj.bias", (unsigned long long)l), add_view(f, nm, attb + l * C, C, 0);
    snprintf(nm, sizeof nm, "h.%llu.ln_2.weight", (unsigned long long)l), add_view(f, nm, ln2w + l * C, C, 0);
    snprintf(nm, sizeof nm, "h.%llu.ln_2.bias", (unsigned long long)l), add_view(f, nm, ln2b + l * C, C, 0);
    snprintf(nm, sizeof nm, "h.%llu.mlp.fc.weight", (unsigned long long)l), add_view(f, nm, fcw + l * 4 * C * C, 4 * C, C);
    snprintf(nm, sizeof nm, "h.%llu.mlp.fc.bias", (unsigned long long)l), add_view(f, nm, fcb + l * 4 * C, 4 * C, 0);
    snprintf(nm, sizeof nm, "h.%llu.mlp.proj.weight", (unsigned long long)l), add_view(f, nm, fcpw + l * C * 4 * C, C, 4 * C);
    snprintf(nm, sizeof nm, "h.%llu.mlp.proj.bias", (unsigned long long)l), add_view(f, nm, fcpb + l * C, C, 0);
  }
  add_view(f, "ln_f.weight", lnfw, C, 0);
  add_view(f, "ln_f.bias", lnfb, C, 0);
out:
  if (f->file.map && stabi_mapped_shrunk(&f->file, NULL) != STAB_OK) st = STAB_EIO; /* the header read as zeros */
  if (st != STAB_OK) {
    stab_llmc_close(f);
    return st;
  }
  *out = f;
  return STAB_OK;
}

const stab_llmc_config *stab_llmc_config_of(const stab_llmc *f) { return f ? &f->cfg : NULL; }
size_t stab_llmc_count(const stab_llmc *f) { return f ? f->count : 0; }
const stab_ckpt_tensor *stab_llmc_tensor(const stab_llmc *f, size_t index) {
  return f && index < f->count ? &f->tensors[index] : NULL;
}

stab_status stab_llmc_find(const stab_llmc *f, const char *name, size_t *index) {
  if (!f || !name) return stabi_fail(STAB_EINVAL, "stab_llmc_find: NULL reader or name");
  /* The order of the views is fixed (wte, wpe, 16 per block, ln_f.weight, ln_f.bias), so the
   * name says where to look: "h.L." in block L's 16 views, anything else in the four others.
   * A scan of every view would make a caller that finds each view in turn quadratic in the
   * block count, which the header sets (a 1 MB file can declare 20000 blocks). */
  size_t cand[16], nc = 0;
  if (name[0] == 'h' && name[1] == '.' && name[2] >= '0' && name[2] <= '9') {
    char *end;
    errno = 0;
    unsigned long long l = strtoull(name + 2, &end, 10);
    if (errno == 0 && *end == '.' && l < f->cfg.layers)
      for (size_t k = 0; k < 16; k++) cand[nc++] = 2 + (size_t)l * 16 + k;
  } else {
    cand[nc++] = 0, cand[nc++] = 1, cand[nc++] = f->count - 2, cand[nc++] = f->count - 1;
  }
  for (size_t k = 0; k < nc; k++) /* a name with leading zeros or junk lands here and fails */
    if (!strcmp(f->tensors[cand[k]].name, name)) {
      if (index) *index = cand[k];
      return STAB_OK;
    }
  return STAB_ENOTFOUND;
}

int stab_llmc_is(const char *path) {
  /* the magic as stored: an int32, little-endian */
  const unsigned char magic[4] = {LLMC_MAGIC & 0xff, (LLMC_MAGIC >> 8) & 0xff, (LLMC_MAGIC >> 16) & 0xff,
                                  (LLMC_MAGIC >> 24) & 0xff};
  return stabi_input_starts_with(path, magic, sizeof magic);
}
