/* The daemon's client I/O memory budget (daemon/iomem.c): room, reserve, waiters. */
#include <criterion/criterion.h>

#include "iomem.h"

Test(iomem, holders_leave_the_reserve_to_connections_that_hold_nothing)
{
    dqd_iomem m;
    dqd_iomem_init(&m, 800);
    cr_assert_eq(m.reserve, 100);
    cr_assert(dqd_iomem_fits(&m, 700, true));
    cr_assert_not(dqd_iomem_fits(&m, 701, true));
    cr_assert(dqd_iomem_fits(&m, 800, false));
    cr_assert_not(dqd_iomem_fits(&m, 801, false));
    dqd_iomem_charge(&m, 650);
    cr_assert(dqd_iomem_fits(&m, 50, true));
    cr_assert_not(dqd_iomem_fits(&m, 51, true));
    cr_assert(dqd_iomem_fits(&m, 150, false));
    dqd_iomem_charge(&m, 140); /* 790: past what holders may fill */
    cr_assert_not(dqd_iomem_fits(&m, 0, true));
    cr_assert(dqd_iomem_fits(&m, 10, false));
    cr_assert_not(dqd_iomem_fits(&m, UINT64_MAX, false));
    dqd_iomem_release(&m, 790);
    cr_assert_eq(m.used, 0);
    cr_assert_eq(m.peak, 790);
}

typedef struct waiter {
    dqd_iomem_waiter w;
    dqd_iomem *m;
    int woken;
    int requeue;           /* queue again when woken, this many times */
    struct waiter *victim; /* cancel it when woken */
    int *order, *norder, id;
} waiter;

static void on_wake(dqd_iomem_waiter *w)
{
    waiter *x = (waiter *)w;
    x->woken++;
    x->order[(*x->norder)++] = x->id;
    if (x->victim)
        dqd_iomem_cancel(x->m, &x->victim->w);
    if (x->requeue-- > 0)
        dqd_iomem_wait(x->m, &x->w);
}

static int kicks;
static void kick(void *arg)
{
    (void)arg;
    kicks++;
}

Test(iomem, waiters_are_woken_in_order_once_per_wait)
{
    dqd_iomem m;
    dqd_iomem_init(&m, 1000);
    m.kick = kick;
    int order[16], n = 0;
    waiter a = {.w.wake = on_wake, .m = &m, .order = order, .norder = &n, .id = 1, .requeue = 1};
    waiter b = {.w.wake = on_wake, .m = &m, .order = order, .norder = &n, .id = 2};
    waiter c = {.w.wake = on_wake, .m = &m, .order = order, .norder = &n, .id = 3};
    waiter d = {.w.wake = on_wake, .m = &m, .order = order, .norder = &n, .id = 4};
    b.victim = &c; /* b's wake closes c, which was queued behind it */
    dqd_iomem_charge(&m, 500);
    dqd_iomem_release(&m, 100);
    cr_assert_eq(kicks, 0, "nobody waits: no kick");
    dqd_iomem_wait(&m, &a.w);
    dqd_iomem_wait(&m, &b.w);
    dqd_iomem_wait(&m, &a.w); /* queued already: no-op */
    dqd_iomem_wait(&m, &c.w);
    dqd_iomem_wait(&m, &d.w);
    cr_assert_eq(m.waits, 4);
    dqd_iomem_release(&m, 100);
    dqd_iomem_release(&m, 100);
    cr_assert_eq(kicks, 1, "one kick until the waiters are woken");
    dqd_iomem_wake(&m);
    /* a, b (which cancels c), d; a queued again, but is woken by the next wake only */
    cr_assert_eq(n, 3);
    cr_assert_eq(order[0], 1);
    cr_assert_eq(order[1], 2);
    cr_assert_eq(order[2], 4);
    cr_assert_eq(c.woken, 0);
    cr_assert(a.w.waiting);
    dqd_iomem_release(&m, 100);
    cr_assert_eq(kicks, 2);
    dqd_iomem_wake(&m);
    cr_assert_eq(a.woken, 2);
    cr_assert_null(m.head);
    cr_assert_null(m.tail);
}
