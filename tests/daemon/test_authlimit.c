/* The authentication throttle (daemon/authlimit.c): per-address buckets, IPv6 /64s, the shared
 * overflow bucket. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>

#include "authlimit.h"

static dqd_peer v4(const char *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    cr_assert_eq(inet_pton(AF_INET, s, &a.sin_addr), 1);
    dqd_peer p;
    dqd_peer_from_sockaddr(&a, &p);
    return p;
}

static dqd_peer v6(const char *s)
{
    struct sockaddr_in6 a = {.sin6_family = AF_INET6};
    cr_assert_eq(inet_pton(AF_INET6, s, &a.sin6_addr), 1);
    dqd_peer p;
    dqd_peer_from_sockaddr(&a, &p);
    return p;
}

Test(authlimit, addresses)
{
    char buf[64];
    dqd_peer a = v4("192.0.2.7"), m = v6("::ffff:192.0.2.7"), x = v6("2001:db8:1:2:aaaa::1"),
             y = v6("2001:db8:1:2:bbbb::9"), z = v6("2001:db8:1:3::1");
    cr_assert_eq(memcmp(&a, &m, sizeof a), 0, "an IPv4-mapped address is its IPv4 address");
    cr_assert_eq(memcmp(&x, &y, sizeof x), 0, "one /64");
    cr_assert_neq(memcmp(&x, &z, sizeof x), 0);
    dqd_peer_format(&a, buf, sizeof buf);
    cr_assert_str_eq(buf, "192.0.2.7");
    dqd_peer_format(&x, buf, sizeof buf);
    cr_assert_str_eq(buf, "2001:db8:1:2::/64");
    struct sockaddr un = {.sa_family = AF_UNIX};
    dqd_peer u;
    dqd_peer_from_sockaddr(&un, &u);
    cr_assert_eq(u.family, 0);
}

Test(authlimit, burst_then_rate_per_address)
{
    static dqd_authlimit lim;
    dqd_authlimit_init(&lim, 3, 60); /* one a second */
    dqd_peer a = v4("192.0.2.1"), b = v4("192.0.2.2"), local = {0};
    uint64_t t = 1000;
    for (int i = 0; i < 3; i++) {
        cr_assert(dqd_authlimit_allowed(&lim, &a, t));
        dqd_authlimit_failed(&lim, &a, t);
    }
    cr_assert_not(dqd_authlimit_allowed(&lim, &a, t));
    cr_assert(dqd_authlimit_allowed(&lim, &b, t), "another address is not affected");
    cr_assert_not(dqd_authlimit_allowed(&lim, &a, t + 999));
    cr_assert(dqd_authlimit_allowed(&lim, &a, t + 1000), "a token a second");
    dqd_authlimit_failed(&lim, &a, t + 1000);
    cr_assert_not(dqd_authlimit_allowed(&lim, &a, t + 1500));
    for (int i = 0; i < 100; i++)
        dqd_authlimit_failed(&lim, &local, t);
    cr_assert(dqd_authlimit_allowed(&lim, &local, t), "Unix sockets are never limited");
}

/* More failing addresses than slots: those without one share the overflow bucket, so spreading the
 * guesses over many addresses does not multiply them. */
Test(authlimit, many_addresses_share_the_overflow_bucket)
{
    static dqd_authlimit lim;
    dqd_authlimit_init(&lim, 2, 1);
    uint64_t t = 5000;
    unsigned allowed = 0;
    for (unsigned i = 0; i < 4 * DQD_AUTHLIMIT_SLOTS; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET};
        sa.sin_addr.s_addr = htonl(0x0a000000u + i);
        dqd_peer p;
        dqd_peer_from_sockaddr(&sa, &p);
        while (dqd_authlimit_allowed(&lim, &p, t)) {
            dqd_authlimit_failed(&lim, &p, t);
            allowed++;
        }
    }
    /* every slot's burst, and the overflow bucket's once */
    cr_assert_leq(allowed, 2 * DQD_AUTHLIMIT_SLOTS + 2, "%u guesses", allowed);
    cr_assert_geq(allowed, DQD_AUTHLIMIT_SLOTS, "%u guesses", allowed);
}
