/* The frame-buffer cache of large requests: reuse by size, the byte limit, least recently
 * released first out, idle buffers given back. */
#include <criterion/criterion.h>
#include <string.h>

#include "framecache.h"

#define MiB ((size_t)1 << 20)

Test(framecache, reuses_a_released_buffer_of_a_fitting_size)
{
    dqd_framecache fc;
    dqd_framecache_init(&fc, 64 * MiB);
    size_t cap;
    uint8_t *a = dqd_framecache_get(&fc, 3 * MiB + 5, &cap);
    cr_assert_not_null(a);
    cr_assert_eq(cap, 4 * MiB, "sizes are rounded up to 2 MiB");
    cr_assert_eq((uintptr_t)a % 64, 0);
    memset(a, 0x5a, 3 * MiB + 5); /* writable over the whole request */
    dqd_framecache_put(&fc, a, cap, 100);
    cr_assert_eq(fc.bytes, 4 * MiB);

    size_t cap2;
    uint8_t *b = dqd_framecache_get(&fc, 4 * MiB, &cap2);
    cr_assert_eq(b, a, "a released buffer that fits is reused");
    cr_assert_eq(cap2, cap);
    cr_assert_eq(fc.hits, 1);
    cr_assert_eq(fc.misses, 1);
    cr_assert_eq(fc.bytes, 0);
    dqd_framecache_put(&fc, b, cap2, 200);

    /* far smaller than the cached buffer: a new one, the large one stays */
    uint8_t *c = dqd_framecache_get(&fc, 1 * MiB, &cap);
    cr_assert_neq(c, a);
    cr_assert_eq(cap, 2 * MiB);
    cr_assert_eq(fc.misses, 2);
    /* larger than anything cached: a new one */
    uint8_t *d = dqd_framecache_get(&fc, 5 * MiB, &cap2);
    cr_assert_neq(d, a);
    cr_assert_eq(fc.misses, 3);
    dqd_framecache_put(&fc, c, 2 * MiB, 300);
    dqd_framecache_put(&fc, d, cap2, 400);
    /* the smallest that fits is the one taken */
    uint8_t *e = dqd_framecache_get(&fc, 4 * MiB - 1, &cap);
    cr_assert_eq(e, a);
    dqd_framecache_put(&fc, e, cap, 500);
    dqd_framecache_trim(&fc, 0, 0);
    cr_assert_eq(fc.n, 0);
    cr_assert_eq(fc.bytes, 0);
}

Test(framecache, keeps_within_its_limit_dropping_the_oldest)
{
    dqd_framecache fc;
    dqd_framecache_init(&fc, 8 * MiB);
    size_t cap[4];
    uint8_t *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = dqd_framecache_get(&fc, 2 * MiB, &cap[i]);
        cr_assert_not_null(p[i]);
    }
    for (int i = 0; i < 4; i++)
        dqd_framecache_put(&fc, p[i], cap[i], 10 + (uint64_t)i);
    cr_assert_eq(fc.bytes, 8 * MiB);
    size_t c5;
    uint8_t *big = dqd_framecache_get(&fc, 4 * MiB, &c5); /* none fits: new */
    cr_assert_eq(fc.n, 4);
    dqd_framecache_put(&fc, big, c5, 50);
    cr_assert_eq(fc.bytes, 8 * MiB, "over the limit: the two oldest went");
    cr_assert_eq(fc.n, 3);
    for (size_t i = 0; i < fc.n; i++)
        cr_assert(fc.slot[i].p != p[0] && fc.slot[i].p != p[1], "slot %zu kept an old buffer", i);
    /* more than the limit is never kept */
    uint8_t *huge = dqd_framecache_get(&fc, 9 * MiB, &c5);
    dqd_framecache_put(&fc, huge, c5, 60);
    cr_assert_eq(fc.bytes, 8 * MiB);
    /* a zero limit keeps nothing */
    dqd_framecache_trim(&fc, 0, 0);
    dqd_framecache_init(&fc, 0);
    uint8_t *z = dqd_framecache_get(&fc, MiB, &c5);
    dqd_framecache_put(&fc, z, c5, 1);
    cr_assert_eq(fc.n, 0);
    cr_assert_eq(fc.bytes, 0);
}

Test(framecache, trim_gives_back_idle_buffers)
{
    dqd_framecache fc;
    dqd_framecache_init(&fc, 64 * MiB);
    size_t ca, cb;
    uint8_t *a = dqd_framecache_get(&fc, MiB, &ca), *b = dqd_framecache_get(&fc, 3 * MiB, &cb);
    dqd_framecache_put(&fc, a, ca, 1000);
    dqd_framecache_put(&fc, b, cb, 5000);
    dqd_framecache_trim(&fc, 6000, 2000); /* a idle 5000, b 1000 */
    cr_assert_eq(fc.n, 1);
    cr_assert_eq(fc.slot[0].p, b);
    cr_assert_eq(fc.bytes, cb);
    dqd_framecache_trim(&fc, 8000, 2000);
    cr_assert_eq(fc.n, 0);
    cr_assert_eq(fc.bytes, 0);
    dqd_framecache_put(&fc, NULL, 0, 0); /* nothing */
    cr_assert_eq(fc.n, 0);
}
