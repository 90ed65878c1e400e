/* dquantd frame buffers for large requests (see framecache.h). */
#include "framecache.h"

#include <string.h>
#include <sys/mman.h>

#define GRAIN ((size_t)2 << 20)

void dqd_framecache_init(dqd_framecache *fc, uint64_t limit)
{
    memset(fc, 0, sizeof *fc);
    fc->limit = limit;
}

static void drop(dqd_framecache *fc, size_t i)
{
    munmap(fc->slot[i].p, fc->slot[i].cap);
    fc->bytes -= fc->slot[i].cap;
    fc->slot[i] = fc->slot[--fc->n];
}

uint8_t *dqd_framecache_get(dqd_framecache *fc, size_t bytes, size_t *cap)
{
    if (bytes > SIZE_MAX - GRAIN)
        return NULL;
    const size_t want = (bytes + GRAIN - 1) / GRAIN * GRAIN;
    /* the smallest cached buffer that fits and is not much larger */
    size_t best = fc->n;
    for (size_t i = 0; i < fc->n; i++) {
        const size_t c = fc->slot[i].cap;
        if (c >= want && c - want <= want / 2 && (best == fc->n || c < fc->slot[best].cap))
            best = i;
    }
    if (best < fc->n) {
        uint8_t *p = fc->slot[best].p;
        *cap = fc->slot[best].cap;
        fc->bytes -= *cap;
        fc->slot[best] = fc->slot[--fc->n];
        fc->hits++;
        return p;
    }
    fc->misses++;
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, want, MADV_HUGEPAGE); /* fewer page faults when THP is in madvise mode */
#endif
    *cap = want;
    return p;
}

void dqd_framecache_put(dqd_framecache *fc, uint8_t *p, size_t cap, uint64_t now_ns)
{
    if (!p)
        return;
    if (cap > fc->limit) {
        munmap(p, cap);
        return;
    }
    /* room: the least recently released go first */
    while (fc->n == DQD_FRAMECACHE_SLOTS || fc->bytes + cap > fc->limit) {
        size_t old = 0;
        for (size_t i = 1; i < fc->n; i++)
            if (fc->slot[i].released_ns < fc->slot[old].released_ns)
                old = i;
        drop(fc, old);
    }
    fc->slot[fc->n++] = (dqd_framebuf){p, cap, now_ns};
    fc->bytes += cap;
}

void dqd_framecache_trim(dqd_framecache *fc, uint64_t now_ns, uint64_t idle_ns)
{
    for (size_t i = fc->n; i-- > 0;)
        if (idle_ns == 0 || now_ns - fc->slot[i].released_ns >= idle_ns)
            drop(fc, i);
}
