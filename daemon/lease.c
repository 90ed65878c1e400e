/* dquantd leases (see lease.h): a list, scanned on release and expiry; leases are few (a per
 * connection cap) and short. */
#include "lease.h"

#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"

struct dqd_lease {
    uint64_t id;
    uint64_t expires_ns;
    const void *owner;
    uint32_t *owner_count;
    dqd_seq **seqs;
    size_t n;
    dqd_lease *next;
};

void dqd_leases_init(dqd_leases *ls)
{
    memset(ls, 0, sizeof *ls);
    ls->next_id = 1;
    ls->next_expiry_ns = UINT64_MAX;
}

static void lease_end(dqd_leases *ls, dqd_lease **pp)
{
    dqd_lease *l = *pp;
    *pp = l->next;
    for (size_t i = 0; i < l->n; i++)
        dqd_seq_unref(l->seqs[i]);
    (*l->owner_count)--;
    ls->active--;
    free(l->seqs);
    free(l);
}

static void recompute_next(dqd_leases *ls)
{
    ls->next_expiry_ns = UINT64_MAX;
    for (dqd_lease *l = ls->head; l; l = l->next)
        if (l->expires_ns < ls->next_expiry_ns)
            ls->next_expiry_ns = l->expires_ns;
}

void dqd_leases_destroy(dqd_leases *ls)
{
    while (ls->head)
        lease_end(ls, &ls->head);
    ls->next_expiry_ns = UINT64_MAX;
}

int dqd_lease_add(dqd_leases *ls, const void *owner, uint32_t *owner_count, dqd_seq **seqs, size_t n,
                  uint64_t expires_ns, uint64_t *id)
{
    dqd_lease *l = calloc(1, sizeof *l);
    if (l)
        l->seqs = malloc((n ? n : 1) * sizeof *l->seqs);
    if (!l || !l->seqs) {
        free(l);
        for (size_t i = 0; i < n; i++)
            dqd_seq_unref(seqs[i]);
        return DQ_NOMEM;
    }
    memcpy(l->seqs, seqs, n * sizeof *seqs);
    l->n = n;
    l->id = ls->next_id++;
    l->expires_ns = expires_ns;
    l->owner = owner;
    l->owner_count = owner_count;
    l->next = ls->head;
    ls->head = l;
    ls->active++;
    (*owner_count)++;
    if (expires_ns < ls->next_expiry_ns)
        ls->next_expiry_ns = expires_ns;
    *id = l->id;
    return DQ_OK;
}

int dqd_lease_release(dqd_leases *ls, const void *owner, uint64_t id)
{
    for (dqd_lease **pp = &ls->head; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id && (*pp)->owner == owner) {
            lease_end(ls, pp);
            recompute_next(ls);
            return DQ_OK;
        }
    }
    return DQ_NOT_FOUND;
}

void dqd_leases_release_owner(dqd_leases *ls, const void *owner)
{
    for (dqd_lease **pp = &ls->head; *pp;) {
        if ((*pp)->owner == owner)
            lease_end(ls, pp);
        else
            pp = &(*pp)->next;
    }
    recompute_next(ls);
}

void dqd_leases_expire(dqd_leases *ls, uint64_t now_ns)
{
    if (now_ns < ls->next_expiry_ns)
        return;
    for (dqd_lease **pp = &ls->head; *pp;) {
        if ((*pp)->expires_ns <= now_ns) {
            lease_end(ls, pp);
            ls->expiries++;
        } else {
            pp = &(*pp)->next;
        }
    }
    recompute_next(ls);
}
