/* dquantd client I/O memory: one budget (max_io_memory) for every byte that client connections make
 * the daemon hold — request frames being received or waiting for their operation, reply buffers of
 * operations in progress, and replies queued for sending. Each connection counts its own share
 * (conn.c, which also pauses a connection past max_output_queue); this is the sum over all of them,
 * so that many connections cannot multiply the per-connection bound.
 *
 * It is enforced by backpressure: a connection charges a frame's bytes before allocating its buffer,
 * and when they do not fit it stops reading and waits (dqd_iomem_wait) until bytes are released. A
 * reply buffer is charged when its operation allocates it (dqd_req_out_alloc); one that does not fit
 * is never allocated, and the request fails with RESOURCE_EXHAUSTED. The last eighth of the budget
 * is kept for connections that hold nothing else, so that clients which stop reading their replies
 * cannot lock a fresh client out.
 *
 * Loop thread only. */
#ifndef DQD_IOMEM_H
#define DQD_IOMEM_H

#include <stdbool.h>
#include <stdint.h>

/* A connection waiting for room: wake(w) is called from dqd_iomem_wake, once per wait. */
typedef struct dqd_iomem_waiter {
    void (*wake)(struct dqd_iomem_waiter *w);
    struct dqd_iomem_waiter *next;
    bool waiting;
} dqd_iomem_waiter;

typedef struct dqd_iomem {
    uint64_t limit, reserve; /* reserve: bytes past limit - reserve that only non-holders may take */
    uint64_t used, peak;
    uint64_t waits;   /* times a connection waited for room */
    uint64_t refused; /* reply buffers refused */
    dqd_iomem_waiter *head, *tail;
    dqd_iomem_waiter *waking; /* the rest of those a dqd_iomem_wake in progress wakes */
    /* Set by the owner: called (once until the next dqd_iomem_wake) when bytes are released while
     * connections wait, so that they are woken from the loop rather than inside the release. */
    void (*kick)(void *arg);
    void *kick_arg;
    bool kicked;
} dqd_iomem;

void dqd_iomem_init(dqd_iomem *m, uint64_t limit);
/* Whether need more bytes fit: a holder (a connection that holds other bytes already) may fill the
 * budget up to limit - reserve, one holding nothing up to limit. */
bool dqd_iomem_fits(const dqd_iomem *m, uint64_t need, bool holder);
void dqd_iomem_charge(dqd_iomem *m, uint64_t n);
/* Gives n bytes back; kicks the owner when connections are waiting. */
void dqd_iomem_release(dqd_iomem *m, uint64_t n);
/* Queues w until the next dqd_iomem_wake (no-op if it is queued already). */
void dqd_iomem_wait(dqd_iomem *m, dqd_iomem_waiter *w);
/* Takes w off the queue (a closing connection). */
void dqd_iomem_cancel(dqd_iomem *m, dqd_iomem_waiter *w);
/* Wakes every connection queued now, in the order they queued; one that still does not fit queues
 * again, for the next wake. */
void dqd_iomem_wake(dqd_iomem *m);

#endif
