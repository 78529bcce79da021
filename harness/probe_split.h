/* probe_split.h — which of P ranks measures each row of stabmeter-probe's report, decided from
 * the checkpoint's header alone, so that every rank computes the same answer without talking.
 * Rows that read overlapping bytes (a query and key pair and its attention row, a tied head and
 * its embedding, a fused qkv and its slices, a 3-D experts tensor and its slices) or that the
 * caller ties together (the experts of one layer) form one group that stays on one rank, so that
 * no two ranks read the same tensor; groups go, costliest first, to the rank with the least cost
 * so far (longest processing time first; ties to the lower row and the lower rank). */
#ifndef STAB_PROBE_SPLIT_H
#define STAB_PROBE_SPLIT_H

#include <stddef.h>

/* The mapped bytes [lo, hi) of one tensor a row reads. */
typedef struct {
  const unsigned char *lo, *hi;
} probe_span;

enum { PROBE_MAX_SPANS = 5 }; /* weight, bias, key, and the reference's weight and bias */

/* One row to place. */
typedef struct {
  probe_span span[PROBE_MAX_SPANS];
  size_t nspan;
  double cost; /* bytes times the sweeps expected; 0 for a row not measured */
  size_t with; /* an earlier row this one must share a rank with, or (size_t)-1 */
} probe_item;

/* owner[i], in [0, ranks), for each of the n items. 0, or -1 when out of memory. */
int probe_split(const probe_item *items, size_t n, int ranks, int *owner);

/* Makes every whole page of the other ranks' spans unreadable (PROT_NONE), leaving readable
 * every page that holds a byte of one of rank's own spans: a read of another rank's tensor
 * then kills the process instead of fetching its pages unseen. A debugging aid
 * (STAB_PROBE_SHOW_READS), for a mapping nothing else writes. The bytes made unreadable, or -1
 * (errno set). */
long long probe_split_fence(const probe_item *items, size_t n, const int *owner, int rank);

#endif
