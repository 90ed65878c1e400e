/* dquantd frame buffers (daemon/framebuf.h): alignment and capacity, reuse of a kept buffer by the
 * next frame that fits (and not by one four times smaller), the byte budget and the slot limit,
 * small buffers never kept, and buffers given back from several threads at once. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "framebuf.h"

#define MiB ((size_t)1 << 20)

static void fill(uint8_t *b, size_t n, uint8_t v)
{
    memset(b, v, n);
    cr_assert_eq(b[0], v);
    cr_assert_eq(b[n - 1], v);
}

Test(framebuf, aligned_with_room_and_small_ones_not_kept)
{
    dqd_framebufs fb;
    dqd_framebufs_init(&fb, 64 * MiB);
    const size_t sizes[] = {1, 63, 64, 65, 4096, MiB - 1, MiB, MiB + 1, 5 * MiB + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint8_t *b = dqd_framebuf_get(&fb, sizes[i]);
        cr_assert_not_null(b);
        cr_assert_eq((uintptr_t)b % 64, 0, "size %zu not 64-byte aligned", sizes[i]);
        cr_assert_geq(dqd_framebuf_capacity(b), sizes[i]);
        fill(b, sizes[i], (uint8_t)i);
        dqd_framebuf_put(&fb, b);
    }
    uint64_t kept, reused, fresh;
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    /* MiB - 1 rounds to MiB and is kept like the three larger ones; those after it reuse it or not */
    cr_assert_gt(kept, 0);
    cr_assert_eq(kept % MiB, 0, "kept %llu", (unsigned long long)kept);
    cr_assert_null(dqd_framebuf_get(&fb, 0));
    dqd_framebuf_put(&fb, NULL);
    dqd_framebufs_destroy(&fb);
}

Test(framebuf, reuse_fits_and_budget)
{
    dqd_framebufs fb;
    dqd_framebufs_init(&fb, 10 * MiB);
    uint8_t *a = dqd_framebuf_get(&fb, 4 * MiB), *b = dqd_framebuf_get(&fb, 4 * MiB),
            *c = dqd_framebuf_get(&fb, 4 * MiB);
    cr_assert(a && b && c);
    dqd_framebuf_put(&fb, a);
    dqd_framebuf_put(&fb, b);
    dqd_framebuf_put(&fb, c); /* 12 MiB would pass the 10 MiB budget: freed */
    uint64_t kept, reused, fresh;
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    cr_assert_eq(kept, 8 * MiB);
    cr_assert_eq(fresh, 3);
    uint8_t *d = dqd_framebuf_get(&fb, 4 * MiB - 100);
    cr_assert(d == a || d == b, "a kept buffer that fits is handed out");
    uint8_t *e = dqd_framebuf_get(&fb, MiB - 1); /* under 1 MiB: never from the kept ones */
    cr_assert(e != a && e != b);
    uint8_t *f = dqd_framebuf_get(&fb, 5 * MiB); /* larger than every kept one */
    cr_assert(f != a && f != b);
    uint8_t *g = dqd_framebuf_get(&fb, MiB); /* the other kept 4 MiB: not over 4x the need */
    cr_assert(g == a || g == b);
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    cr_assert_eq(reused, 2);
    cr_assert_eq(kept, 0);
    dqd_framebuf_put(&fb, d);
    dqd_framebuf_put(&fb, e); /* MiB - 1 has a capacity of 1 MiB: kept too */
    dqd_framebuf_put(&fb, f); /* 4 + 1 + 5 MiB */
    dqd_framebuf_put(&fb, g); /* 4 more would pass the budget: freed */
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    cr_assert_eq(kept, 10 * MiB);
    uint8_t *h = dqd_framebuf_get(&fb, MiB + 1); /* 4 MiB is within 4x of it: the smallest fit */
    cr_assert_eq(dqd_framebuf_capacity(h), 4 * MiB);
    uint8_t *i = dqd_framebuf_get(&fb, MiB + 1); /* 1 MiB is short, 5 MiB over 4x: a new one */
    cr_assert_eq(dqd_framebuf_capacity(i), 2 * MiB);
    dqd_framebuf_put(&fb, h);
    dqd_framebuf_put(&fb, i);
    dqd_framebufs_destroy(&fb);

    dqd_framebufs_init(&fb, 0); /* budget 0: nothing kept */
    a = dqd_framebuf_get(&fb, 2 * MiB);
    dqd_framebuf_put(&fb, a);
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    cr_assert_eq(kept, 0);
    dqd_framebufs_destroy(&fb);
}

Test(framebuf, slot_limit)
{
    dqd_framebufs fb;
    dqd_framebufs_init(&fb, 1024 * MiB);
    uint8_t *b[DQD_FRAMEBUF_SLOTS + 3];
    for (int i = 0; i < DQD_FRAMEBUF_SLOTS + 3; i++)
        cr_assert_not_null(b[i] = dqd_framebuf_get(&fb, MiB));
    for (int i = 0; i < DQD_FRAMEBUF_SLOTS + 3; i++)
        dqd_framebuf_put(&fb, b[i]);
    uint64_t kept, reused, fresh;
    dqd_framebufs_stats(&fb, &kept, &reused, &fresh);
    cr_assert_eq(kept, DQD_FRAMEBUF_SLOTS * MiB);
    dqd_framebufs_destroy(&fb);
}

static dqd_framebufs shared;

static void *churn(void *arg)
{
    const size_t base = (size_t)(uintptr_t)arg;
    for (int i = 0; i < 200; i++) {
        const size_t n = base + (size_t)(i % 3) * MiB;
        uint8_t *b = dqd_framebuf_get(&shared, n);
        cr_assert_not_null(b);
        b[0] = (uint8_t)i;
        b[n - 1] = (uint8_t)i;
        dqd_framebuf_put(&shared, b);
    }
    return NULL;
}

Test(framebuf, threads)
{
    dqd_framebufs_init(&shared, 32 * MiB);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)((size_t)(i + 1) * MiB)), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    uint64_t kept, reused, fresh;
    dqd_framebufs_stats(&shared, &kept, &reused, &fresh);
    cr_assert_eq(reused + fresh, 800);
    cr_assert_gt(reused, 0);
    cr_assert_leq(kept, 32 * MiB);
    dqd_framebufs_destroy(&shared);
}
