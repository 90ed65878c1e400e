/* dquantd client I/O memory (see iomem.h). */
#include "iomem.h"

#include <assert.h>
#include <stddef.h>
#include <string.h>

void dqd_iomem_init(dqd_iomem *m, uint64_t limit)
{
    memset(m, 0, sizeof *m);
    m->limit = limit;
    m->reserve = limit / 8;
}

bool dqd_iomem_fits(const dqd_iomem *m, uint64_t need, bool holder)
{
    const uint64_t cap = holder ? m->limit - m->reserve : m->limit;
    return m->used <= cap && need <= cap - m->used;
}

void dqd_iomem_charge(dqd_iomem *m, uint64_t n)
{
    m->used += n;
    if (m->used > m->peak)
        m->peak = m->used;
}

void dqd_iomem_release(dqd_iomem *m, uint64_t n)
{
    assert(m->used >= n);
    m->used -= n;
    if (m->head && n && !m->kicked && m->kick) {
        m->kicked = true;
        m->kick(m->kick_arg);
    }
}

void dqd_iomem_wait(dqd_iomem *m, dqd_iomem_waiter *w)
{
    if (w->waiting)
        return;
    w->waiting = true;
    w->next = NULL;
    if (m->tail)
        m->tail->next = w;
    else
        m->head = w;
    m->tail = w;
    m->waits++;
}

/* Unlinks w from the singly linked list at *head (tail kept when given); false if it is not there. */
static bool unlink_from(dqd_iomem_waiter **head, dqd_iomem_waiter **tail, dqd_iomem_waiter *w)
{
    dqd_iomem_waiter *prev = NULL;
    for (dqd_iomem_waiter **pp = head; *pp; prev = *pp, pp = &(*pp)->next) {
        if (*pp != w)
            continue;
        *pp = w->next;
        if (tail && *tail == w)
            *tail = prev;
        return true;
    }
    return false;
}

void dqd_iomem_cancel(dqd_iomem *m, dqd_iomem_waiter *w)
{
    if (!w->waiting)
        return;
    /* Queued, or among those a wake in progress has still to wake. */
    bool found = unlink_from(&m->head, &m->tail, w) || unlink_from(&m->waking, NULL, w);
    assert(found);
    (void)found;
    w->waiting = false;
    w->next = NULL;
}

void dqd_iomem_wake(dqd_iomem *m)
{
    m->kicked = false;
    /* Those queued now; one that queues again while they are woken waits for the next wake. */
    m->waking = m->head;
    m->head = m->tail = NULL;
    while (m->waking) {
        dqd_iomem_waiter *w = m->waking;
        m->waking = w->next;
        w->waiting = false;
        w->next = NULL;
        w->wake(w);
    }
}
