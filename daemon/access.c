/* dquantd access sets (see access.h). */
#include "access.h"

#include <stdint.h>
#include <stdlib.h>

#include "dquant/error.h"

int dqd_access_init(dqd_access_set *as, size_t cap)
{
    as->n = as->acquired = 0;
    as->no_load = false;
    as->cap = cap ? cap : 1;
    as->ready = NULL;
    as->arg = NULL;
    as->items = malloc(as->cap * sizeof *as->items);
    if (!as->items) {
        as->cap = 0;
        return DQ_NOMEM;
    }
    return DQ_OK;
}

void dqd_access_add(dqd_access_set *as, dqd_seq *seq, dqd_access mode)
{
    if (as->n == as->cap) {
        /* Callers size the set for every item; never lose a reference even so. */
        dqd_seq_unref(seq);
        return;
    }
    as->items[as->n++] = (dqd_access_item){seq, mode};
}

static int cmp_item(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const dqd_access_item *)a)->seq;
    uintptr_t y = (uintptr_t)((const dqd_access_item *)b)->seq;
    return x < y ? -1 : x > y;
}

static void step(dqd_access_set *as)
{
    while (as->acquired < as->n) {
        as->waiter.mode = as->items[as->acquired].mode;
        if (!dqd_seq_acquire(as->items[as->acquired].seq, &as->waiter))
            return; /* on_granted continues */
        as->acquired++;
    }
    as->ready(as);
}

static void on_granted(dqd_waiter *w)
{
    dqd_access_set *as = (dqd_access_set *)((char *)w - offsetof(dqd_access_set, waiter));
    as->acquired++;
    step(as);
}

void dqd_access_start(dqd_access_set *as, dqd_access_ready_fn ready, void *arg)
{
    as->ready = ready;
    as->arg = arg;
    as->waiter.granted = on_granted;
    as->waiter.no_load = as->no_load;
    as->acquired = 0;
    if (as->n > 1) {
        qsort(as->items, as->n, sizeof *as->items, cmp_item);
        size_t m = 0;
        for (size_t i = 0; i < as->n; i++) {
            if (m && as->items[m - 1].seq == as->items[i].seq) {
                if (as->items[i].mode == DQD_ACCESS_WRITE)
                    as->items[m - 1].mode = DQD_ACCESS_WRITE;
                dqd_seq_unref(as->items[i].seq);
                continue;
            }
            as->items[m++] = as->items[i];
        }
        as->n = m;
    }
    for (size_t i = 0; i < as->n && !as->no_load; i++)
        dqd_seq_prefetch(as->items[i].seq);
    step(as);
}

dqd_access dqd_access_mode(const dqd_access_set *as, const dqd_seq *seq)
{
    dqd_access_item key = {(dqd_seq *)seq, DQD_ACCESS_READ};
    const dqd_access_item *it = bsearch(&key, as->items, as->n, sizeof *as->items, cmp_item);
    return it ? it->mode : DQD_ACCESS_READ;
}

void dqd_access_end(dqd_access_set *as)
{
    for (size_t i = 0; i < as->n; i++) {
        if (i < as->acquired)
            dqd_seq_release(as->items[i].seq, as->items[i].mode);
        dqd_seq_unref(as->items[i].seq);
    }
    free(as->items);
    as->items = NULL;
    as->n = as->cap = as->acquired = 0;
}
