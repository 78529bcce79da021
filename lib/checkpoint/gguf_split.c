/* gguf_split.c — a GGUF model split by llama.cpp's gguf-split as one checkpoint: the files
 * PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf, each a valid GGUF file whose
 * metadata says split.no (0-based), split.count and split.tensors.count (the whole model's
 * tensors); the model's own metadata is the first shard's. From any shard (or a directory
 * holding one such set) every shard is opened, checked against the others, and its tensors
 * listed shard after shard, so the model is decided from all of them, as a sharded Hugging
 * Face model is (sharded.c). A missing shard is an error naming the file. */
#include "checkpoint/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* gguf-split numbers shards with %05d; more than this many would not be its files. */
#define SPLIT_MAX 99999

struct stabi_gguf_split {
  stab_gguf **shards;  /* (nshards) shard k is split.no k */
  char **paths;        /* (nshards) */
  uint64_t *bases;     /* (nshards) earlier shards' bytes: where each starts in the whole */
  size_t nshards;
  const stab_ckpt_tensor **tensors; /* (count) shard after shard, each in its file's order */
  size_t *shard_of;    /* (count) */
  size_t *by_name;     /* (count) sorted by name */
  size_t count;
};

void stabi_gguf_split_close(stabi_gguf_split *s) {
  if (!s) return;
  for (size_t k = 0; k < s->nshards; k++) stab_gguf_close(s->shards[k]), free(s->paths[k]);
  free(s->shards), free(s->paths), free(s->bases);
  free(s->tensors), free(s->shard_of), free(s->by_name);
  free(s);
}

stab_status stabi_gguf_split_info(const stab_gguf *g, const char *path, size_t *no, size_t *count) {
  uint64_t n = 0, k = 0;
  stab_status st = stab_gguf_get_uint(g, "split.count", &n);
  if (st == STAB_ENOTFOUND) {
    if (stab_gguf_find_metadata(g, "split.no"))
      return stabi_fail(STAB_EFORMAT, "%s: metadata split.no without split.count", path);
    *no = 0, *count = 1;
    return STAB_OK;
  }
  if (st != STAB_OK) return stabi_fail(STAB_EFORMAT, "%s", stab_last_error());
  if (n == 0 || n > SPLIT_MAX)
    return stabi_fail(STAB_EFORMAT, "%s: metadata split.count is %llu (1 to %d shards)", path, (unsigned long long)n,
                      SPLIT_MAX);
  st = stab_gguf_get_uint(g, "split.no", &k);
  if (st == STAB_ENOTFOUND) return stabi_fail(STAB_EFORMAT, "%s: metadata split.count without split.no", path);
  if (st != STAB_OK) return stabi_fail(STAB_EFORMAT, "%s", stab_last_error());
  if (k >= n)
    return stabi_fail(STAB_EFORMAT, "%s: metadata split.no is %llu, not below split.count %llu", path,
                      (unsigned long long)k, (unsigned long long)n);
  *no = (size_t)k, *count = (size_t)n;
  return STAB_OK;
}

/* The tensors of the whole model, one shard after another. */
static stab_status list_tensors(stabi_gguf_split *s) {
  size_t total = 0;
  for (size_t k = 0; k < s->nshards; k++) total += stab_gguf_count(s->shards[k]);
  s->tensors = malloc((total ? total : 1) * sizeof *s->tensors);
  s->shard_of = malloc((total ? total : 1) * sizeof *s->shard_of);
  s->by_name = malloc((total ? total : 1) * sizeof *s->by_name);
  if (!s->tensors || !s->shard_of || !s->by_name)
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for %zu tensors", s->paths[0], total);
  for (size_t k = 0; k < s->nshards; k++)
    for (size_t i = 0; i < stab_gguf_count(s->shards[k]); i++) {
      s->tensors[s->count] = stab_gguf_tensor(s->shards[k], i);
      s->shard_of[s->count] = k, s->by_name[s->count] = s->count;
      s->count++;
    }
  stabi_name_ref *refs = malloc((s->count ? s->count : 1) * sizeof *refs);
  if (!refs) return stabi_fail(STAB_ENOMEM, "%s: out of memory for %zu tensors", s->paths[0], total);
  for (size_t i = 0; i < s->count; i++) refs[i].name = s->tensors[i]->name, refs[i].index = i;
  qsort(refs, s->count, sizeof *refs, stabi_cmp_name_ref);
  for (size_t i = 0; i < s->count; i++) s->by_name[i] = refs[i].index;
  free(refs);
  for (size_t i = 1; i < s->count; i++) {
    size_t a = s->by_name[i - 1], b = s->by_name[i];
    if (!strcmp(s->tensors[a]->name, s->tensors[b]->name))
      return stabi_fail(STAB_EFORMAT, "%s and %s both hold tensor '%s'", s->paths[s->shard_of[a]],
                        s->paths[s->shard_of[b]], s->tensors[a]->name);
  }
  return STAB_OK;
}

/* Shard k's path: path with its "-%05d-of-%05d.gguf" ending renumbered, or NULL (no memory). */
static char *sibling(const char *path, size_t stem, size_t k, size_t n) {
  size_t len = stem + 32;
  char *p = malloc(len);
  if (p) snprintf(p, len, "%.*s-%05zu-of-%05zu.gguf", (int)stem, path, k + 1, n);
  return p;
}

stab_status stabi_gguf_split_open(const char *path, stab_gguf *first, stabi_gguf_split **out) {
  *out = NULL;
  size_t no, n;
  stab_status st = stabi_gguf_split_info(first, path, &no, &n);
  if (st != STAB_OK) return st;
  /* the shards are found as llama.cpp finds them (llama_split_prefix): by the name's ending */
  char want[40];
  snprintf(want, sizeof want, "-%05zu-of-%05zu.gguf", no + 1, n);
  size_t len = strlen(path), wl = strlen(want);
  if (len < wl || strcmp(path + len - wl, want))
    return stabi_fail(STAB_EFORMAT, "%s: shard %zu of %zu of a split GGUF model (metadata split.no %zu, split.count %zu), "
                      "but its name does not end in '%s', so its other shards cannot be found: name the shards as "
                      "gguf-split does (PREFIX%s)", path, no + 1, n, no, n, want, want);
  stabi_gguf_split *s = calloc(1, sizeof *s);
  if (!s || !(s->shards = calloc(n, sizeof *s->shards)) || !(s->paths = calloc(n, sizeof *s->paths)) ||
      !(s->bases = calloc(n, sizeof *s->bases))) {
    stabi_gguf_split_close(s);
    return stabi_fail(STAB_ENOMEM, "%s: out of memory for %zu shards", path, n);
  }
  s->nshards = n;
  uint64_t tensors_said = 0;
  int said = 0;
  for (size_t k = 0; k < n && st == STAB_OK; k++) {
    if (!(s->paths[k] = sibling(path, len - wl, k, n))) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
      break;
    }
    if (k == no) {
      s->shards[k] = first;
    } else {
      struct stat sb;
      if (stat(s->paths[k], &sb) != 0) {
        int e = errno;
        st = stabi_fail(e == ENOENT ? STAB_ENOTFOUND : STAB_EIO,
                        "%s: shard %zu of %zu of the split GGUF model %s is missing (%s): every shard is needed to "
                        "read the model (its metadata is in shard 1, its tensors in all %zu)", s->paths[k], k + 1, n,
                        path, strerror(e), n);
        break;
      }
      if (!S_ISREG(sb.st_mode)) {
        st = stabi_fail(STAB_EIO, "%s: shard %zu of %zu of the split GGUF model %s is not a regular file", s->paths[k],
                        k + 1, n, path);
        break;
      }
      if ((st = stab_gguf_open(s->paths[k], &s->shards[k])) != STAB_OK) break;
    }
    size_t kno, kn;
    if ((st = stabi_gguf_split_info(s->shards[k], s->paths[k], &kno, &kn)) != STAB_OK) break;
    if (kn != n || kno != k) {
      st = stabi_fail(STAB_EFORMAT, "%s: metadata says shard %zu of %zu (split.no %zu, split.count %zu), but it is "
                      "named as shard %zu of %zu beside %s", s->paths[k], kno + 1, kn, kno, kn, k + 1, n, path);
      break;
    }
    uint64_t t;
    stab_status ts = stab_gguf_get_uint(s->shards[k], "split.tensors.count", &t);
    if (ts == STAB_OK) {
      if (said && t != tensors_said) {
        st = stabi_fail(STAB_EFORMAT, "%s: metadata split.tensors.count is %llu, but %s says %llu", s->paths[k],
                        (unsigned long long)t, s->paths[0], (unsigned long long)tensors_said);
        break;
      }
      tensors_said = t, said = 1;
    } else if (ts != STAB_ENOTFOUND) {
      st = stabi_fail(STAB_EFORMAT, "%s", stab_last_error());
      break;
    }
    if (k) s->bases[k] = s->bases[k - 1] + stabi_gguf_file_size(s->shards[k - 1]);
  }
  if (st == STAB_OK) st = list_tensors(s);
  if (st == STAB_OK && said && tensors_said != s->count)
    st = stabi_fail(STAB_EFORMAT, "%s: metadata split.tensors.count is %llu, but the %zu shards hold %zu tensors",
                    s->paths[0], (unsigned long long)tensors_said, n, s->count);
  if (st != STAB_OK) {
    s->shards[no] = NULL; /* the caller's */
    stabi_gguf_split_close(s);
    return st;
  }
  *out = s;
  return STAB_OK;
}

/* 1 when name is some "PREFIX-00001-of-NNNNN.gguf". */
static int first_shard_name(const char *name) {
  size_t n = strlen(name);
  static const char tail[] = "-00001-of-00000.gguf";
  if (n <= sizeof tail - 1) return 0;
  const char *t = name + n - (sizeof tail - 1);
  if (strncmp(t, "-00001-of-", 10) || strcmp(t + 15, ".gguf")) return 0;
  for (int i = 10; i < 15; i++)
    if (t[i] < '0' || t[i] > '9') return 0;
  return 1;
}

stab_status stabi_gguf_split_first_in(const char *dir, char **first) {
  *first = NULL;
  DIR *d = opendir(dir);
  if (!d) return STAB_ENOTFOUND;
  stab_status st = STAB_ENOTFOUND;
  char *other = NULL;
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) { /* a Hugging Face model's: not ours */
      st = STAB_ENOTFOUND;
      free(*first), free(other), *first = other = NULL;
      break;
    }
    if (!first_shard_name(e->d_name)) continue;
    size_t len = strlen(dir) + n + 2;
    char *p = malloc(len);
    if (!p) {
      st = stabi_fail(STAB_ENOMEM, "%s: out of memory", dir);
      break;
    }
    snprintf(p, len, "%s/%s", dir, e->d_name);
    if (!*first) *first = p, st = STAB_OK;
    else if (!other) other = p;
    else free(p);
  }
  closedir(d);
  if (st == STAB_OK && other) {
    st = stabi_fail(STAB_EINVAL, "%s holds more than one split GGUF model (%s, %s): name the one to probe", dir, *first,
                    other);
    free(*first), *first = NULL;
  }
  free(other);
  return st;
}

size_t stabi_gguf_split_count(const stabi_gguf_split *s) { return s->count; }
const stab_ckpt_tensor *stabi_gguf_split_tensor(const stabi_gguf_split *s, size_t i) {
  return i < s->count ? s->tensors[i] : NULL;
}
stab_status stabi_gguf_split_find(const stabi_gguf_split *s, const char *name, size_t *index) {
  size_t lo = 0, hi = s->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = strcmp(s->tensors[s->by_name[mid]]->name, name);
    if (r == 0) {
      *index = s->by_name[mid];
      return STAB_OK;
    }
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return STAB_ENOTFOUND;
}
size_t stabi_gguf_split_shard_count(const stabi_gguf_split *s) { return s->nshards; }
const stab_gguf *stabi_gguf_split_shard(const stabi_gguf_split *s, size_t k) { return k < s->nshards ? s->shards[k] : NULL; }
const char *stabi_gguf_split_shard_path(const stabi_gguf_split *s, size_t k) { return k < s->nshards ? s->paths[k] : NULL; }
size_t stabi_gguf_split_shard_of(const stabi_gguf_split *s, size_t i) { return i < s->count ? s->shard_of[i] : 0; }
uint64_t stabi_gguf_split_base(const stabi_gguf_split *s, size_t k) { return k < s->nshards ? s->bases[k] : 0; }
