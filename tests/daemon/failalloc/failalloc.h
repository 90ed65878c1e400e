/* Allocation-failure injection for dquantd-failalloc (tests/daemon/meson.build): force-included
 * (-include) into every daemon source of that build only, it routes malloc, calloc, realloc,
 * aligned_alloc and strdup through failalloc.c, which makes one chosen allocation fail. The
 * daemon's own allocators (hostmem.c, whose hooks libdquant allocates through, and pbmem.c, which
 * unpacks every request header) call these too, so every allocation of the request path is
 * covered. The shipped dquantd is built without it.
 *
 * Control, read once at the first allocation:
 *   DQD_FAIL_ALLOC=N          the Nth allocation of the process fails (once).
 *   DQD_FAIL_ALLOC_CTL=FILE   FILE (at least sizeof(dqd_fa_ctl) bytes) is mapped shared: a test
 *                             arms countdown = k before a request, and the kth allocation after
 *                             that fails and bumps fired (tests/daemon/test_failalloc.c). */
#ifndef DQD_FAILALLOC_H
#define DQD_FAILALLOC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct dqd_fa_ctl {
    int64_t countdown; /* > 0: the allocation that takes it to 0 fails */
    int64_t fired;     /* allocations failed on purpose so far */
    int64_t calls;     /* allocations seen while armed */
} dqd_fa_ctl;

void *dqd_fa_malloc(size_t size);
void *dqd_fa_calloc(size_t n, size_t size);
void *dqd_fa_realloc(void *p, size_t size);
void *dqd_fa_aligned_alloc(size_t align, size_t size);
char *dqd_fa_strdup(const char *s);

#ifndef DQD_FAILALLOC_IMPL
#define malloc(n) dqd_fa_malloc(n)
#define calloc(n, s) dqd_fa_calloc(n, s)
#define realloc(p, n) dqd_fa_realloc(p, n)
#define aligned_alloc(a, n) dqd_fa_aligned_alloc(a, n)
#define strdup(s) dqd_fa_strdup(s)
#endif

#endif
