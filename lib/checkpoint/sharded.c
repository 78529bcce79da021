/* sharded.c — a Hugging Face model as one checkpoint: a directory with model.safetensors,
 * or a sharded model's index (model.safetensors.index.json: tensor name -> shard file) and its
 * shards. Each shard is opened and validated by the safetensors reader (headers only: no tensor
 * data is read), and the index is checked against what the shards hold, tensor by tensor, so a
 * model with a missing, extra or misplaced tensor is refused with the index, shard and tensor
 * named. Shard names are plain file names in the index's directory: a hostile index cannot make
 * the reader open anything outside the model. */
#include "checkpoint/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The largest index read: real ones are a few megabytes (DeepSeek-V3's, ninety thousand tensors,
 * under 9 MB); the bound keeps a hostile one's parse tree small. */
#define INDEX_MAX_BYTES ((uint64_t)64 << 20)
#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"
#define INDEX_SUFFIX ".safetensors.index.json"

struct stab_shard_index {
  char *path;
  char **names;     /* (count) tensor names, sorted */
  size_t *shard_of; /* (count) index into shards */
  size_t count;
  char **shards;    /* (nshards) distinct shard file names, sorted: the model's order */
  size_t nshards;
  int has_total;
  uint64_t total_size; /* metadata.total_size when has_total */
  char warning[512];   /* empty, or what is odd but not wrong */
};

struct stab_sharded {
  char *dir;                     /* where the shards and config.json are */
  stab_shard_index *index;       /* NULL: a single model.safetensors */
  stab_safetensors **shards;     /* (nshards) in the index's shard order */
  char **shard_paths;            /* (nshards) */
  size_t nshards;
  const stab_ckpt_tensor **tensors; /* (count) shard by shard, each in its file's order */
  size_t *shard_of;              /* (count) */
  size_t *by_name;               /* (count) indices sorted by name, for find */
  size_t count;
  char warning[512];
};

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* dir/name, or NULL when out of memory. */
static char *join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* The directory part of path ("." when it has none). */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* ---- the index ------------------------------------------------------------------------ */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Why a shard name is not a plain file name of the index's directory, or NULL. */
static const char *unsafe_name(const char *s) {
  if (!s[0]) return "is empty";
  if (strchr(s, '/')) return "holds a '/' (shards must be files of the index's own directory)";
  if (!strcmp(s, ".") || !strcmp(s, "..")) return "is a directory's name";
  return NULL;
}

void stab_shard_index_close(stab_shard_index *ix) {
  if (!ix) return;
  for (size_t i = 0; i < ix->count; i++) free(ix->names[i]);
  for (size_t i = 0; i < ix->nshards; i++) free(ix->shards[i]);
  free(ix->names), free(ix->shard_of), free(ix->shards), free(ix->path);
  free(ix);
}

/* metadata.total_size, kept to be compared with the shards; anything odd about it is a warning,
 * not a refusal: it says nothing about any tensor, and indexes with none, or with a value some
 * tool wrote by hand, exist. */
static void read_total_size(stab_shard_index *ix, const stabi_json *root) {
  const stabi_json *meta = stabi_json_get(root, "metadata"), *t = stabi_json_get(meta, "total_size");
  if (meta && meta->type != STABI_JSON_OBJECT && meta->type != STABI_JSON_NULL)
    snprintf(ix->warning, sizeof ix->warning, "%s: \"metadata\" is %s, not an object; ignored", ix->path,
             stabi_json_type_name(meta));
  else if (t && t->type == STABI_JSON_NUMBER && t->is_uint)
    ix->has_total = 1, ix->total_size = t->u;
  else if (t && t->type != STABI_JSON_NULL)
    snprintf(ix->warning, sizeof ix->warning, "%s: \"metadata.total_size\" is %s, not a whole number of bytes; ignored",
             ix->path, stabi_json_type_name(t));
}

stab_status stab_shard_index_open(const char *path, stab_shard_index **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_shard_index_open: NULL path or output");
  stab_shard_index *ix = calloc(1, sizeof *ix);
  stabi_json root = {0};
  stabi_name_ref *refs = NULL;
  stab_status st = STAB_OK;
  if (!ix || !(ix->path = strdup(path))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  if ((st = stabi_json_read(path, INDEX_MAX_BYTES, &root)) != STAB_OK) goto out;
  const stabi_json *map = stabi_json_get(&root, "weight_map");
  if (root.type != STABI_JSON_OBJECT || !map || map->type != STABI_JSON_OBJECT) {
    st = stabi_fail(STAB_EFORMAT, "%s: not a sharded checkpoint's index: %s", path,
                    root.type != STABI_JSON_OBJECT ? "the top level is not an object"
                    : !map ? "no \"weight_map\" object (tensor name -> shard file)"
                           : "\"weight_map\" is not an object (tensor name -> shard file)");
    goto out;
  }
  read_total_size(ix, &root);
  size_t n = map->n;
  if (!(ix->names = calloc(n ? n : 1, sizeof *ix->names)) || !(ix->shard_of = calloc(n ? n : 1, sizeof *ix->shard_of)) ||
      !(ix->shards = calloc(n ? n : 1, sizeof *ix->shards)) || !(refs = malloc((n ? n : 1) * sizeof *refs))) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory for %zu tensors", path, n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    const stabi_json *v = &map->items[i];
    const char *why;
    if (v->type != STABI_JSON_STRING) {
      st = stabi_fail(STAB_EFORMAT, "%s: byte %zu: tensor '%.200s': the shard is %s, not a file name (a string)", path,
                      v->at, map->keys[i], stabi_json_type_name(v));
      goto out;
    }
    if ((why = unsafe_name(v->s))) {
      st = stabi_fail(STAB_EFORMAT, "%s: tensor '%.200s': shard name '%.200s' %s", path, map->keys[i], v->s, why);
      goto out;
    }
    if (!map->keys[i][0]) {
      st = stabi_fail(STAB_EFORMAT, "%s: byte %zu: an empty tensor name", path, v->at);
      goto out;
    }
    refs[i] = (stabi_name_ref){v->s, i};
  }
  /* the distinct shards, sorted: shard numbers are zero-padded, so this is their order */
  qsort(refs, n, sizeof *refs, stabi_cmp_name_ref);
  for (size_t i = 0; i < n; i++) {
    if (!ix->nshards || strcmp(refs[i].name, ix->shards[ix->nshards - 1])) {
      if (!(ix->shards[ix->nshards] = strdup(refs[i].name))) {
        st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
        goto out;
      }
      ix->nshards++;
    }
    ix->shard_of[refs[i].index] = ix->nshards - 1;
  }
  /* the tensors, sorted by name (their keys are unique: the parser refuses a key twice) */
  for (size_t i = 0; i < n; i++) refs[i] = (stabi_name_ref){map->keys[i], i};
  qsort(refs, n, sizeof *refs, stabi_cmp_name_ref);
  size_t *shard_by_key = malloc((n ? n : 1) * sizeof *shard_by_key);
  if (!shard_by_key) {
    st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
    goto out;
  }
  for (size_t i = 0; i < n; i++) shard_by_key[i] = ix->shard_of[refs[i].index];
  for (size_t i = 0; i < n; i++) {
    ix->shard_of[i] = shard_by_key[i];
    /* the key moves to the index: the tree frees only what is left in it */
    ix->names[i] = map->keys[refs[i].index];
    ((stabi_json *)map)->keys[refs[i].index] = NULL;
    ix->count++;
  }
  free(shard_by_key);
  if (!n) {
    st = stabi_fail(STAB_EFORMAT, "%s: \"weight_map\" is empty: a model with no tensors", path);
    goto out;
  }
out:
  free(refs);
  stabi_json_free(&root);
  if (st != STAB_OK) {
    stab_shard_index_close(ix);
    return st;
  }
  *out = ix;
  return STAB_OK;
}

size_t stab_shard_index_count(const stab_shard_index *ix) { return ix ? ix->count : 0; }

const char *stab_shard_index_tensor(const stab_shard_index *ix, size_t i, size_t *shard) {
  if (!ix || i >= ix->count) return NULL;
  if (shard) *shard = ix->shard_of[i];
  return ix->names[i];
}

size_t stab_shard_index_shard_count(const stab_shard_index *ix) { return ix ? ix->nshards : 0; }

const char *stab_shard_index_shard(const stab_shard_index *ix, size_t i) {
  return ix && i < ix->nshards ? ix->shards[i] : NULL;
}

stab_status stab_shard_index_find(const stab_shard_index *ix, const char *name, size_t *index) {
  if (!ix || !name) return stabi_fail(STAB_EINVAL, "stab_shard_index_find: NULL index or name");
  char *const *hit = bsearch(&name, ix->names, ix->count, sizeof *ix->names, cmp_str);
  if (!hit) return STAB_ENOTFOUND;
  if (index) *index = (size_t)(hit - ix->names);
  return STAB_OK;
}

stab_status stab_shard_index_total_size(const stab_shard_index *ix, uint64_t *bytes) {
  if (!ix || !ix->has_total) return STAB_ENOTFOUND;
  if (bytes) *bytes = ix->total_size;
  return STAB_OK;
}

const char *stab_shard_index_path(const stab_shard_index *ix) { return ix ? ix->path : NULL; }

const char *stab_shard_index_warning(const stab_shard_index *ix) {
  return ix && ix->warning[0] ? ix->warning : NULL;
}

/* ---- the model ------------------------------------------------------------------------- */

void stab_sharded_close(stab_sharded *f) {
  if (!f) return;
  for (size_t i = 0; i < f->nshards; i++) {
    stab_safetensors_close(f->shards[i]);
    free(f->shard_paths[i]);
  }
  free(f->shards), free(f->shard_paths), free(f->tensors), free(f->shard_of), free(f->by_name);
  stab_shard_index_close(f->index);
  free(f->dir);
  free(f);
}

/* Opens shard k, saying what went wrong in the index's terms. */
static stab_status open_shard(stab_sharded *f, size_t k, const char *first_tensor, size_t listed) {
  const char *ipath = f->index ? f->index->path : f->dir;
  stab_status st = stab_safetensors_open(f->shard_paths[k], &f->shards[k]);
  if (st == STAB_OK || !f->index) return st;
  char inner[1024];
  snprintf(inner, sizeof inner, "%s", stab_last_error());
  /* a shard of another format (an index of PyTorch .bin shards): what it is, and what to do */
  stab_file_kind kind;
  if (st == STAB_EFORMAT && stab_ckpt_sniff(f->shard_paths[k], &kind) != STAB_OK && kind != STAB_FILE_UNKNOWN)
    snprintf(inner, sizeof inner, "%s", stab_last_error());
  struct stat sb;
  const char *what = stat(f->shard_paths[k], &sb) != 0 ? "is missing or unreadable"
                     : !S_ISREG(sb.st_mode)            ? "is not a regular file"
                     : st == STAB_EFORMAT              ? "is not a valid safetensors file"
                                                       : "cannot be read";
  return stabi_fail(st, "%s: shard '%s' (holding tensor '%.200s'%s) %s: %s", ipath, f->index->shards[k], first_tensor,
                    listed > 1 ? " and others" : "", what, inner);
}

/* The shards against the index: each tensor in exactly the shard the index names. */
static stab_status check_against_index(stab_sharded *f) {
  const stab_shard_index *ix = f->index;
  size_t *seen = malloc((ix->count ? ix->count : 1) * sizeof *seen); /* shard + 1 it was found in; 0 none */
  if (!seen) return stabi_fail(STAB_ENOMEM, "%s: out of memory", ix->path);
  memset(seen, 0, ix->count * sizeof *seen);
  stab_status st = STAB_OK;
  for (size_t i = 0; i < f->count && st == STAB_OK; i++) {
    const char *name = f->tensors[i]->name;
    size_t k = f->shard_of[i], at;
    if (stab_shard_index_find(ix, name, &at) != STAB_OK)
      st = stabi_fail(STAB_EFORMAT, "%s: shard '%s' holds tensor '%.200s', which the index does not list", ix->path,
                      ix->shards[k], name);
    else if (seen[at])
      st = stabi_fail(STAB_EFORMAT, "%s: tensor '%.200s' is in two shards, '%s' and '%s'", ix->path, name,
                      ix->shards[seen[at] - 1], ix->shards[k]);
    else if (ix->shard_of[at] != k)
      st = stabi_fail(STAB_EFORMAT, "%s: tensor '%.200s' is in shard '%s', but the index says shard '%s'", ix->path,
                      name, ix->shards[k], ix->shards[ix->shard_of[at]]);
    else
      seen[at] = k + 1;
  }
  for (size_t i = 0; i < ix->count && st == STAB_OK; i++)
    if (!seen[i])
      st = stabi_fail(STAB_EFORMAT, "%s: tensor '%.200s': the index names shard '%s', which does not hold it", ix->path,
                      ix->names[i], ix->shards[ix->shard_of[i]]);
  free(seen);
  if (st != STAB_OK || !ix->has_total) return st;
  uint64_t sum = 0;
  for (size_t i = 0; i < f->count; i++) sum += stab_ckpt_nbytes(f->tensors[i]);
  if (sum != ix->total_size)
    snprintf(f->warning, sizeof f->warning, "%s: \"metadata.total_size\" is %llu bytes, but the shards' tensors hold "
             "%llu; ignored (the tensors were checked one by one)", ix->path, (unsigned long long)ix->total_size,
             (unsigned long long)sum);
  return STAB_OK;
}

/* The index inside a directory: model.safetensors.index.json, else the only *.safetensors.index.json;
 * NULL with *st set when there is none (STAB_ENOTFOUND) or more than one. */
static char *index_in(const char *dir, stab_status *st) {
  char *p = join(dir, INDEX_NAME);
  struct stat sb;
  *st = STAB_OK;
  if (!p) return *st = stabi_fail(STAB_ENOMEM, "%s: out of memory", dir), NULL;
  if (stat(p, &sb) == 0) return p;
  free(p), p = NULL;
  DIR *d = opendir(dir);
  if (!d) return *st = stabi_fail(STAB_EIO, "%s: cannot list the directory: %s", dir, strerror(errno)), NULL;
  size_t found = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!ends_with(e->d_name, INDEX_SUFFIX)) continue;
    if (found++ == 0) p = join(dir, e->d_name);
  }
  closedir(d);
  if (found == 1 && p) return p;
  free(p);
  if (found > 1)
    *st = stabi_fail(STAB_EFORMAT, "%s: %zu files named *%s: give the probe the one to read", dir, found, INDEX_SUFFIX);
  else *st = found ? stabi_fail(STAB_ENOMEM, "%s: out of memory", dir) : STAB_ENOTFOUND;
  return NULL;
}

stab_status stab_sharded_open(const char *path, stab_sharded **out) {
  if (out) *out = NULL;
  if (!path || !out) return stabi_fail(STAB_EINVAL, "stab_sharded_open: NULL path or output");
  stab_sharded *f = calloc(1, sizeof *f);
  char *index_path = NULL;
  stab_status st = STAB_OK;
  if (!f) return stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
  struct stat sb;
  if (stat(path, &sb) != 0) {
    st = stabi_fail(STAB_EIO, "%s: cannot open: %s", path, strerror(errno));
    goto out;
  }
  if (S_ISDIR(sb.st_mode)) {
    /* transformers' own order: a single model.safetensors first, else the index */
    if (!(f->dir = strdup(path))) goto oom;
    for (size_t k = strlen(f->dir); k > 1 && f->dir[k - 1] == '/'; k--) f->dir[k - 1] = '\0'; /* "d/": d/shard */
    char *single = join(f->dir, SINGLE_NAME);
    if (!single) goto oom;
    if (stat(single, &sb) == 0) {
      f->nshards = 1;
      if (!(f->shards = calloc(1, sizeof *f->shards)) || !(f->shard_paths = calloc(1, sizeof *f->shard_paths))) {
        free(single);
        goto oom;
      }
      f->shard_paths[0] = single;
    } else {
      free(single);
      if (!(index_path = index_in(f->dir, &st))) {
        if (st == STAB_ENOTFOUND) {
          /* PyTorch weights are the other thing a model directory holds: said, with what to do */
          char *bin = join(f->dir, "pytorch_model.bin"), *binx = join(f->dir, "pytorch_model.bin.index.json");
          int torch = (bin && stat(bin, &sb) == 0) || (binx && stat(binx, &sb) == 0);
          free(bin), free(binx);
          st = stabi_fail(STAB_EFORMAT, "%s: a directory with neither %s nor %s (a Hugging Face model's weights)%s",
                          path, SINGLE_NAME, INDEX_NAME,
                          torch ? "; it has PyTorch weights (pytorch_model.bin): convert them to safetensors, e.g. "
                                  "with transformers' save_pretrained(..., safe_serialization=True)" : "");
        }
        goto out;
      }
    }
  } else {
    index_path = strdup(path);
    if (!index_path || !(f->dir = dir_of(path))) goto oom;
  }
  if (index_path) {
    if ((st = stab_shard_index_open(index_path, &f->index)) != STAB_OK) goto out;
    f->nshards = f->index->nshards;
    if (!(f->shards = calloc(f->nshards, sizeof *f->shards)) ||
        !(f->shard_paths = calloc(f->nshards, sizeof *f->shard_paths)))
      goto oom;
    for (size_t k = 0; k < f->nshards; k++)
      if (!(f->shard_paths[k] = join(f->dir, f->index->shards[k]))) goto oom;
  }
  /* each shard's first tensor by name and how many the index lists there, for the messages:
   * one pass, not one per shard (an index may name as many shards as tensors) */
  size_t total = 0, *first = calloc(f->nshards, sizeof *first), *listed = calloc(f->nshards, sizeof *listed);
  if (!first || !listed) {
    free(first), free(listed);
    goto oom;
  }
  for (size_t i = f->index ? f->index->count : 0; i-- > 0;) {
    first[f->index->shard_of[i]] = i;
    listed[f->index->shard_of[i]]++;
  }
  for (size_t k = 0; k < f->nshards && st == STAB_OK; k++) {
    st = open_shard(f, k, f->index ? f->index->names[first[k]] : "?", listed[k]);
    if (st == STAB_OK) total += stab_safetensors_count(f->shards[k]);
  }
  free(first), free(listed);
  if (st != STAB_OK) goto out;
  if (!(f->tensors = malloc((total ? total : 1) * sizeof *f->tensors)) ||
      !(f->shard_of = malloc((total ? total : 1) * sizeof *f->shard_of)) ||
      !(f->by_name = malloc((total ? total : 1) * sizeof *f->by_name)))
    goto oom;
  for (size_t k = 0; k < f->nshards; k++)
    for (size_t i = 0; i < stab_safetensors_count(f->shards[k]); i++) {
      f->tensors[f->count] = stab_safetensors_tensor(f->shards[k], i);
      f->shard_of[f->count++] = k;
    }
  stabi_name_ref *refs = malloc((f->count ? f->count : 1) * sizeof *refs);
  if (!refs) goto oom;
  for (size_t i = 0; i < f->count; i++) refs[i] = (stabi_name_ref){f->tensors[i]->name, i};
  qsort(refs, f->count, sizeof *refs, stabi_cmp_name_ref);
  for (size_t i = 0; i < f->count; i++) f->by_name[i] = refs[i].index;
  free(refs);
  if (f->index) {
    if ((st = check_against_index(f)) != STAB_OK) goto out;
    if (!f->warning[0] && f->index->warning[0]) snprintf(f->warning, sizeof f->warning, "%s", f->index->warning);
  }
  goto out;
oom:
  st = stabi_fail(STAB_ENOMEM, "%s: out of memory", path);
out:
  free(index_path);
  if (st != STAB_OK) {
    stab_sharded_close(f);
    return st;
  }
  *out = f;
  return STAB_OK;
}

size_t stab_sharded_count(const stab_sharded *f) { return f ? f->count : 0; }

const stab_ckpt_tensor *stab_sharded_tensor(const stab_sharded *f, size_t index) {
  return f && index < f->count ? f->tensors[index] : NULL;
}

stab_status stab_sharded_find(const stab_sharded *f, const char *name, size_t *index) {
  if (!f || !name) return stabi_fail(STAB_EINVAL, "stab_sharded_find: NULL reader or name");
  size_t lo = 0, hi = f->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = strcmp(f->tensors[f->by_name[mid]]->name, name);
    if (r == 0) {
      if (index) *index = f->by_name[mid];
      return STAB_OK;
    }
    if (r < 0) lo = mid + 1;
    else hi = mid;
  }
  return STAB_ENOTFOUND;
}

size_t stab_sharded_shard_count(const stab_sharded *f) { return f ? f->nshards : 0; }

const stab_safetensors *stab_sharded_shard(const stab_sharded *f, size_t shard) {
  return f && shard < f->nshards ? f->shards[shard] : NULL;
}

const char *stab_sharded_shard_path(const stab_sharded *f, size_t shard) {
  return f && shard < f->nshards ? f->shard_paths[shard] : NULL;
}

size_t stab_sharded_shard_of(const stab_sharded *f, size_t index) {
  return f && index < f->count ? f->shard_of[index] : SIZE_MAX;
}

const char *stab_sharded_directory(const stab_sharded *f) { return f ? f->dir : NULL; }

const stab_shard_index *stab_sharded_index(const stab_sharded *f) { return f ? f->index : NULL; }

const char *stab_sharded_warning(const stab_sharded *f) { return f && f->warning[0] ? f->warning : NULL; }

size_t stab_sharded_metadata_count(const stab_sharded *f) {
  return f && f->nshards ? stab_safetensors_metadata_count(f->shards[0]) : 0;
}

stab_status stab_sharded_metadata(const stab_sharded *f, size_t index, const char **key, const char **value) {
  if (!f || !f->nshards) return STAB_ENOTFOUND;
  return stab_safetensors_metadata(f->shards[0], index, key, value);
}

stab_status stab_shard_index_beside(const char *file, stab_shard_index **out, size_t *shard) {
  if (out) *out = NULL;
  if (!file || !out) return stabi_fail(STAB_EINVAL, "stab_shard_index_beside: NULL file or output");
  char *dir = dir_of(file);
  if (!dir) return stabi_fail(STAB_ENOMEM, "%s: out of memory", file);
  const char *base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
  stab_status st = STAB_ENOTFOUND;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && st == STAB_ENOTFOUND && (e = readdir(d));) {
    if (!ends_with(e->d_name, INDEX_SUFFIX)) continue;
    char *p = join(dir, e->d_name);
    stab_shard_index *ix = NULL;
    if (!p) st = stabi_fail(STAB_ENOMEM, "%s: out of memory", file);
    else if ((st = stab_shard_index_open(p, &ix)) == STAB_OK) {
      st = STAB_ENOTFOUND;
      for (size_t k = 0; k < ix->nshards; k++)
        if (!strcmp(ix->shards[k], base)) {
          if (shard) *shard = k;
          *out = ix, ix = NULL, st = STAB_OK;
          break;
        }
      stab_shard_index_close(ix);
    }
    free(p);
  }
  if (d) closedir(d);
  free(dir);
  return st;
}
