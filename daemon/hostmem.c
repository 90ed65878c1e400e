/* dquantd host-memory accounting (see hostmem.h). Each block carries a 64-byte header holding its
 * size, which keeps the 64-byte alignment the codec asks for and lets free() subtract exactly what
 * alloc() added. */
#include "hostmem.h"

#include <stdlib.h>
#include <string.h>

#define HDR 64u

uint64_t dqd_hostmem_cost(size_t size)
{
    return ((uint64_t)size + HDR + 63u) & ~(uint64_t)63u;
}

static void *hook_alloc(void *opaque, size_t size)
{
    return dqd_hostmem_alloc(opaque, size);
}

static void hook_free(void *opaque, void *p)
{
    dqd_hostmem_free(opaque, p);
}

void dqd_hostmem_init(dqd_hostmem *m)
{
    atomic_init(&m->used, 0);
    atomic_init(&m->peak, 0);
    atomic_init(&m->allocs, 0);
    m->alloc.alloc = hook_alloc;
    m->alloc.free = hook_free;
    m->alloc.opaque = m;
}

void *dqd_hostmem_alloc(dqd_hostmem *m, size_t size)
{
    if (size == 0 || size > SIZE_MAX - 2 * HDR)
        return NULL;
    uint64_t cost = dqd_hostmem_cost(size);
    uint8_t *base = aligned_alloc(HDR, (size_t)cost);
    if (!base)
        return NULL;
    memcpy(base, &cost, sizeof cost);
    uint64_t now = atomic_fetch_add_explicit(&m->used, cost, memory_order_relaxed) + cost;
    atomic_fetch_add_explicit(&m->allocs, 1, memory_order_relaxed);
    uint64_t peak = atomic_load_explicit(&m->peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&m->peak, &peak, now, memory_order_relaxed, memory_order_relaxed)) {
    }
    return base + HDR;
}

void *dqd_hostmem_calloc(dqd_hostmem *m, size_t size)
{
    void *p = dqd_hostmem_alloc(m, size);
    if (p)
        memset(p, 0, size);
    return p;
}

void dqd_hostmem_free(dqd_hostmem *m, void *p)
{
    if (!p)
        return;
    uint8_t *base = (uint8_t *)p - HDR;
    uint64_t cost;
    memcpy(&cost, base, sizeof cost);
    atomic_fetch_sub_explicit(&m->used, cost, memory_order_relaxed);
    atomic_fetch_sub_explicit(&m->allocs, 1, memory_order_relaxed);
    free(base);
}

uint64_t dqd_hostmem_used(const dqd_hostmem *m)
{
    return atomic_load_explicit(&((dqd_hostmem *)m)->used, memory_order_relaxed);
}
