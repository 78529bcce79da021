/* probe_split.c — see probe_split.h. */
#include "probe_split.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t root_of(size_t *parent, size_t i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

/* The lower index becomes the root, so a group's root is its first row. */
static void join(size_t *parent, size_t a, size_t b) {
  a = root_of(parent, a), b = root_of(parent, b);
  if (a < b) parent[b] = a;
  else if (b < a) parent[a] = b;
}

typedef struct {
  uintptr_t lo, hi;
  size_t item;
} placed_span;

static int by_start(const void *pa, const void *pb) {
  const placed_span *a = pa, *b = pb;
  if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
  return a->item < b->item ? -1 : a->item > b->item;
}

/* Every item's non-empty spans, sorted by start: *count of them. NULL when out of memory. */
static placed_span *sorted_spans(const probe_item *items, size_t n, size_t *count) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += items[i].nspan;
  placed_span *s = malloc((k ? k : 1) * sizeof *s);
  if (!s) return NULL;
  k = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < items[i].nspan; j++)
      if (items[i].span[j].hi > items[i].span[j].lo)
        s[k++] = (placed_span){(uintptr_t)items[i].span[j].lo, (uintptr_t)items[i].span[j].hi, i};
  qsort(s, k, sizeof *s, by_start);
  *count = k;
  return s;
}

typedef struct {
  double cost;
  size_t first; /* the group's first row */
} group;

static int costliest_first(const void *pa, const void *pb) {
  const group *a = pa, *b = pb;
  if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
  return a->first < b->first ? -1 : a->first > b->first;
}

int probe_split(const probe_item *items, size_t n, int ranks, int *owner) {
  size_t *parent = malloc((n ? n : 1) * sizeof *parent), ns = 0;
  group *groups = malloc((n ? n : 1) * sizeof *groups);
  double *load = calloc(ranks > 0 ? (size_t)ranks : 1, sizeof *load);
  placed_span *s = parent && groups && load ? sorted_spans(items, n, &ns) : NULL;
  if (!s) {
    free(parent), free(groups), free(load);
    return -1;
  }
  for (size_t i = 0; i < n; i++) parent[i] = i;
  for (size_t i = 0; i < n; i++)
    if (items[i].with < n) join(parent, i, items[i].with);
  /* a sweep by start: a span beginning before the furthest end so far overlaps an earlier one */
  uintptr_t end = 0;
  size_t end_item = 0;
  for (size_t k = 0; k < ns; k++) {
    if (k && s[k].lo < end) join(parent, s[k].item, end_item);
    if (!k || s[k].hi > end) end = s[k].hi, end_item = s[k].item;
  }
  /* groups in row order, their costs summed in row order (the same bits on every rank) */
  size_t ng = 0;
  for (size_t i = 0; i < n; i++) {
    size_t r = root_of(parent, i);
    if (r == i) groups[ng++] = (group){0, i};
  }
  for (size_t i = 0; i < n; i++) {
    size_t r = root_of(parent, i), lo = 0, hi = ng;
    while (hi - lo > 1) { /* groups are sorted by first row: find r's */
      size_t mid = lo + (hi - lo) / 2;
      if (groups[mid].first <= r) lo = mid;
      else hi = mid;
    }
    groups[lo].cost += items[i].cost;
  }
  qsort(groups, ng, sizeof *groups, costliest_first);
  for (size_t g = 0; g < ng; g++) {
    int least = 0;
    for (int p = 1; p < ranks; p++)
      if (load[p] < load[least]) least = p;
    load[least] += groups[g].cost;
    owner[groups[g].first] = least;
  }
  for (size_t i = 0; i < n; i++) owner[i] = owner[root_of(parent, i)];
  free(parent), free(groups), free(load), free(s);
  return 0;
}

long long probe_split_fence(const probe_item *items, size_t n, const int *owner, int rank) {
  long p = sysconf(_SC_PAGESIZE);
  if (p <= 0) return -1;
  const uintptr_t page = (uintptr_t)p;
  size_t ns = 0;
  placed_span *s = sorted_spans(items, n, &ns);
  if (!s) return -1;
  /* own spans widened to whole pages, merged, in order; the rest are the other ranks' */
  size_t nown = 0;
  placed_span *own = malloc((ns ? ns : 1) * sizeof *own);
  if (!own) {
    free(s);
    return -1;
  }
  for (size_t k = 0; k < ns; k++) {
    if (owner[s[k].item] != rank) continue;
    uintptr_t lo = s[k].lo / page * page, hi = (s[k].hi + page - 1) / page * page;
    if (nown && lo <= own[nown - 1].hi) {
      if (hi > own[nown - 1].hi) own[nown - 1].hi = hi;
    } else {
      own[nown++] = (placed_span){lo, hi, s[k].item};
    }
  }
  int rc = 0;
  size_t o = 0;
  long long fenced = 0; /* bytes; pages of overlapping spans (one rank's) counted again */
  for (size_t k = 0; k < ns && !rc; k++) {
    if (owner[s[k].item] == rank) continue;
    /* the whole pages inside the span, less every page an own span touches */
    uintptr_t lo = (s[k].lo + page - 1) / page * page, hi = s[k].hi / page * page;
    while (o < nown && own[o].hi <= lo) o++; /* lo only grows: spans are sorted by start */
    for (size_t j = o; lo < hi && !rc; j++) {
      uintptr_t stop = j < nown && own[j].lo < hi ? own[j].lo : hi;
      if (stop > lo && !(rc = mprotect((void *)lo, stop - lo, PROT_NONE))) fenced += (long long)(stop - lo);
      if (j >= nown || own[j].lo >= hi) break;
      lo = own[j].hi > lo ? own[j].hi : lo;
    }
  }
  free(s), free(own);
  return rc ? -1 : fenced;
}
