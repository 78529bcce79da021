/* data.c — the built-in corpus generator, the file readers and batch sampling of data.h. */
#include "data.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stabmeter.h"

static uint64_t next(data_rng *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static size_t pick(data_rng *r, size_t n) { return (size_t)(next(r) % n); }

/* ---- the built-in corpus --------------------------------------------------------- */

static const char *names[] = {"alice", "bob", "carol", "dave", "erin", "frank", "grace",
                              "heidi", "ivan", "judy", "mallory", "oscar", "peggy", "trent"};
static const char *cities[] = {"paris", "lima", "oslo", "cairo", "tokyo", "quito", "rome",
                               "delhi", "accra", "perth"};
static const char *jobs[] = {"baker", "pilot", "doctor", "farmer", "painter", "teacher",
                             "sailor", "writer"};
static const char *adjs[] = {"small", "old", "red", "quiet", "happy", "tall", "green",
                             "bright", "lazy", "clever"};
static const char *nouns[] = {"cat", "dog", "bird", "horse", "fox", "child", "robot", "king"};
static const char *nouns_pl[] = {"cats", "dogs", "birds", "horses", "foxes", "children",
                                 "robots", "kings"};
static const char *verbs[] = {"sees", "likes", "follows", "finds", "helps", "watches"};
static const char *verbs_pl[] = {"see", "like", "follow", "find", "help", "watch"};
static const char *places[] = {"in the garden", "near the river", "under the tree",
                               "on the hill", "at the market"};

#define N(a) (sizeof a / sizeof *a)

typedef struct {
  char *buf;
  size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n > 0 && t->len + (size_t)n < t->cap) t->len += (size_t)n;
  else t->len = t->cap; /* full: the caller stops */
}

/* A noun phrase with its number: "the old cat" or "two foxes". */
static int noun_phrase(text *t, data_rng *r) {
  int plural = pick(r, 3) == 0;
  size_t k = pick(r, N(nouns));
  const char *adj = pick(r, 2) ? adjs[pick(r, N(adjs))] : NULL;
  if (plural) {
    static const char *counts[] = {"two", "three", "some", "many"};
    put(t, "%s %s%s%s", counts[pick(r, N(counts))], adj ? adj : "", adj ? " " : "", nouns_pl[k]);
  } else {
    put(t, "the %s%s%s", adj ? adj : "", adj ? " " : "", nouns[k]);
  }
  return plural;
}

int data_builtin(data_set *d, size_t n_bytes, uint64_t seed) {
  memset(d, 0, sizeof *d);
  text t = {malloc(n_bytes + 256), 0, n_bytes + 256};
  if (!t.buf) return -2;
  data_rng r = {seed};
  /* Facts fixed by the seed, repeated across the text: a model can learn them. */
  size_t home[N(names)], job[N(names)], age[N(names)];
  for (size_t i = 0; i < N(names); i++)
    home[i] = pick(&r, N(cities)), job[i] = pick(&r, N(jobs)), age[i] = 20 + pick(&r, 60);
  while (t.len < n_bytes) {
    size_t kind = pick(&r, 10), p = pick(&r, N(names));
    if (kind < 4) { /* grammar with agreement of number */
      int pl = noun_phrase(&t, &r);
      size_t v = pick(&r, N(verbs));
      put(&t, " %s ", pl ? verbs_pl[v] : verbs[v]);
      noun_phrase(&t, &r);
      if (pick(&r, 2)) put(&t, " %s", places[pick(&r, N(places))]);
      put(&t, ".\n");
    } else if (kind < 7) { /* facts */
      switch (pick(&r, 4)) {
      case 0: put(&t, "%s lives in %s.\n", names[p], cities[home[p]]); break;
      case 1: put(&t, "%s is a %s.\n", names[p], jobs[job[p]]); break;
      case 2: put(&t, "%s is %zu years old.\n", names[p], age[p]); break;
      default:
        put(&t, "the %s from %s is %s.\n", jobs[job[p]], cities[home[p]], names[p]);
      }
    } else if (kind < 9) { /* arithmetic */
      size_t a = pick(&r, 50), b = pick(&r, 50);
      if (pick(&r, 2)) put(&t, "%zu + %zu = %zu.\n", a, b, a + b);
      else put(&t, "%zu - %zu = %zu.\n", a + b, b, a);
    } else { /* counting: a pattern with long-range structure */
      size_t s = pick(&r, 90), n = 3 + pick(&r, 5);
      put(&t, "count:");
      for (size_t i = 0; i < n; i++) put(&t, " %zu", s + i);
      put(&t, ".\n");
    }
  }
  d->n = n_bytes;
  d->vocab = 256;
  if (!(d->tokens = malloc(n_bytes * sizeof *d->tokens))) {
    free(t.buf);
    return -2;
  }
  for (size_t i = 0; i < n_bytes; i++) d->tokens[i] = (unsigned char)t.buf[i];
  free(t.buf);
  snprintf(d->what, sizeof d->what, "built-in corpus (%zu bytes, seed %llu)", n_bytes,
           (unsigned long long)seed);
  return 0;
}

/* ---- files ----------------------------------------------------------------------- */

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return code;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

#define LLMC_MAGIC 20240520
#define LLMC_HEADER 256

int data_load(data_set *d, const char *path, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  int fd;
  uint64_t size;
  /* A FIFO, a device or a directory is refused here, before any read: /dev/zero would
   * otherwise be read into memory without end. */
  stab_status st = stab_input_open(path, DATA_MAX_BYTES, &fd, &size);
  if (st != STAB_OK)
    return fail(err, errlen, 2, "%s%s", stab_last_error(),
                st == STAB_ERANGE ? " (a corpus is read whole into memory: at most 1 GiB)" : "");
  /* The size at the open bounds the read: a file that grows meanwhile is cut there. */
  unsigned char *raw = malloc(size ? (size_t)size : 1);
  size_t len = 0;
  int rc = 0;
  if (!raw) { rc = fail(err, errlen, 1, "%s: out of memory", path); goto out; }
  while (len < size) {
    ssize_t got = read(fd, raw + len, (size_t)size - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) { rc = fail(err, errlen, 1, "%s: cannot read: %s", path, strerror(errno)); goto out; }
    if (got == 0) break; /* it shrank: what is there */
    len += (size_t)got;
  }
  if (len == 0) { rc = fail(err, errlen, 2, "%s: the file is empty", path); goto out; }
  if (!ends_with(path, ".bin")) {
    if (!(d->tokens = malloc(len * sizeof *d->tokens))) {
      rc = fail(err, errlen, 1, "%s: out of memory", path);
      goto out;
    }
    for (size_t i = 0; i < len; i++) d->tokens[i] = raw[i];
    d->n = len, d->vocab = 256;
    snprintf(d->what, sizeof d->what, "%s (%zu bytes)", path, len);
    goto out;
  }
  /* llm.c token file */
  if (len < LLMC_HEADER * 4) {
    rc = fail(err, errlen, 2, "%s: %zu bytes, shorter than the llm.c header of %d int32", path,
              len, LLMC_HEADER);
    goto out;
  }
  int32_t h[LLMC_HEADER];
  memcpy(h, raw, sizeof h); /* little-endian hosts only, as llm.c */
  if (h[0] != LLMC_MAGIC) {
    rc = fail(err, errlen, 2, "%s: header[0] (magic) is %d, not %d: not an llm.c token file",
              path, h[0], LLMC_MAGIC);
    goto out;
  }
  if (h[1] != 1 && h[1] != 2) {
    rc = fail(err, errlen, 2, "%s: header[1] (version) is %d, expected 1 (uint16 tokens) or 2 "
              "(uint32 tokens)", path, h[1]);
    goto out;
  }
  size_t width = h[1] == 1 ? 2 : 4;
  if (h[2] <= 0 || (size_t)h[2] != (len - LLMC_HEADER * 4) / width ||
      (len - LLMC_HEADER * 4) % width) {
    rc = fail(err, errlen, 2, "%s: header[2] (token count) is %d but the file holds %zu bytes of "
              "tokens (%zu-byte tokens)", path, h[2], len - LLMC_HEADER * 4, width);
    goto out;
  }
  size_t n = (size_t)h[2];
  if (!(d->tokens = malloc(n * sizeof *d->tokens))) {
    rc = fail(err, errlen, 1, "%s: out of memory", path);
    goto out;
  }
  const unsigned char *p = raw + LLMC_HEADER * 4;
  uint32_t mx = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    if (width == 2) v = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
    else v = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
             (uint32_t)p[4 * i + 3] << 24;
    if (v >= (1u << 24)) {
      free(d->tokens), d->tokens = NULL;
      rc = fail(err, errlen, 2, "%s: token %zu is %u, beyond 2^24", path, i, v);
      goto out;
    }
    d->tokens[i] = (int32_t)v;
    mx = v > mx ? v : mx;
  }
  d->n = n, d->vocab = (size_t)mx + 1;
  snprintf(d->what, sizeof d->what, "%s (llm.c v%d, %zu tokens, vocab %zu)", path, h[1], n,
           d->vocab);
out:
  free(raw);
  close(fd);
  return rc;
}

void data_free(data_set *d) {
  if (!d) return;
  free(d->tokens);
  memset(d, 0, sizeof *d);
}

void data_batch(const data_set *d, data_rng *r, size_t lo, size_t hi, size_t B, size_t T,
                int32_t *tok, int32_t *tgt) {
  size_t span = hi - lo - T; /* offsets lo .. hi - T - 1 */
  for (size_t b = 0; b < B; b++) {
    const int32_t *s = d->tokens + lo + pick(r, span);
    memcpy(tok + b * T, s, T * sizeof *tok);
    memcpy(tgt + b * T, s + 1, T * sizeof *tgt);
  }
}
