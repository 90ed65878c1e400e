/* dquantd leases: LOOKUP may lease the chunks it found for a bounded time, so that a GET or ATTEND
 * that follows cannot miss them through eviction. A lease holds a store reference on each of its
 * chunks (store.h: a referenced entry is never evicted or freed; DELETE still takes it out of the
 * index). Leases end when released, when their owner (a connection) goes, or when they expire:
 * dqd_leases_expire runs before every request is dispatched, and every eviction happens inside a
 * request, so an expired lease never protects anything. Loop thread only. */
#ifndef DQD_LEASE_H
#define DQD_LEASE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct dqd_lease dqd_lease;

typedef struct dqd_leases {
    dqd_lease *head;
    uint64_t next_id;
    uint64_t next_expiry_ns; /* earliest expiry of a live lease; UINT64_MAX when none */
    uint64_t active;         /* live leases */
    uint64_t expiries;       /* leases that ran out (not released) */
} dqd_leases;

void dqd_leases_init(dqd_leases *ls);
/* Releases every lease. */
void dqd_leases_destroy(dqd_leases *ls);
/* A lease over seqs[0..n) (their references are taken over; the array is copied) for owner, whose
 * live-lease count *owner_count is kept up to date. Returns 0 with *id, or DQ_NOMEM (the
 * references are then dropped). */
int dqd_lease_add(dqd_leases *ls, const void *owner, uint32_t *owner_count, dqd_seq **seqs, size_t n,
                  uint64_t expires_ns, uint64_t *id);
/* Ends owner's lease id. DQ_NOT_FOUND when owner holds no such lease (expired, or someone else's). */
int dqd_lease_release(dqd_leases *ls, const void *owner, uint64_t id);
/* Ends every lease of owner (its connection closed). */
void dqd_leases_release_owner(dqd_leases *ls, const void *owner);
/* Ends the leases expired at now_ns; counted in expiries. */
void dqd_leases_expire(dqd_leases *ls, uint64_t now_ns);

#endif
