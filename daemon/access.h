/* dquantd access sets: the sequences one request needs, acquired in a global order (by address)
 * so that requests holding several sequences (ATTEND batches) cannot deadlock, each with the
 * strongest mode any of its items asks for. Loop thread only. */
#ifndef DQD_ACCESS_H
#define DQD_ACCESS_H

#include <stdbool.h>
#include <stddef.h>

#include "store.h"

typedef struct dqd_access_set dqd_access_set;
typedef void (*dqd_access_ready_fn)(dqd_access_set *as);

typedef struct dqd_access_item {
    dqd_seq *seq;
    dqd_access mode;
} dqd_access_item;

struct dqd_access_set {
    dqd_access_item *items; /* sorted by address once started */
    size_t n, cap, acquired;
    dqd_waiter waiter;
    dqd_access_ready_fn ready;
    void *arg;
    bool no_load; /* set after init: the request needs no layers (store.h: a stub stays on disk) */
};

int dqd_access_init(dqd_access_set *as, size_t cap);
/* Adds a sequence whose reference the set takes over. */
void dqd_access_add(dqd_access_set *as, dqd_seq *seq, dqd_access mode);
/* Sorts, merges duplicates, then acquires everything; ready(as) runs once all is held, either
 * before this returns or later from the store's grant queue. Sequences on disk that the request
 * needs start being read back at once, all of them together (dqd_seq_prefetch). */
void dqd_access_start(dqd_access_set *as, dqd_access_ready_fn ready, void *arg);
/* Mode held for seq (after start merged duplicates). */
dqd_access dqd_access_mode(const dqd_access_set *as, const dqd_seq *seq);
/* Releases what is held, drops the references, frees the arrays. Safe on an unstarted set. */
void dqd_access_end(dqd_access_set *as);

#endif
