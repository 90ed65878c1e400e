/* dquantd authentication throttle (see authlimit.h). */
#include "authlimit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

void dqd_authlimit_init(dqd_authlimit *a, uint32_t burst, uint32_t per_min)
{
    memset(a, 0, sizeof *a);
    a->burst = burst;
    a->per_ms = per_min / 60000.0;
    a->overflow.tokens = a->burst;
}

void dqd_peer_from_sockaddr(const void *sa, dqd_peer *p)
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(p, 0, sizeof *p);
    sa_family_t fam;
    memcpy(&fam, (const char *)sa + offsetof(struct sockaddr, sa_family), sizeof fam);
    if (fam == AF_INET) {
        struct sockaddr_in in4;
        memcpy(&in4, sa, sizeof in4);
        p->family = 4;
        memcpy(p->addr, &in4.sin_addr, 4);
    } else if (fam == AF_INET6) {
        struct sockaddr_in6 in6;
        memcpy(&in6, sa, sizeof in6);
        const uint8_t *b = in6.sin6_addr.s6_addr;
        if (memcmp(b, v4mapped, sizeof v4mapped) == 0) {
            p->family = 4;
            memcpy(p->addr, b + 12, 4);
        } else {
            p->family = 6;
            memcpy(p->addr, b, 8); /* the /64 */
        }
    }
}

void dqd_peer_format(const dqd_peer *p, char *buf, size_t len)
{
    char tmp[INET6_ADDRSTRLEN];
    if (p->family == 4 && inet_ntop(AF_INET, p->addr, tmp, sizeof tmp)) {
        snprintf(buf, len, "%s", tmp);
    } else if (p->family == 6 && inet_ntop(AF_INET6, p->addr, tmp, sizeof tmp)) {
        snprintf(buf, len, "%s/64", tmp);
    } else {
        snprintf(buf, len, "local");
    }
}

static uint32_t peer_hash(const dqd_peer *p)
{
    uint32_t h = 2166136261u ^ p->family; /* FNV-1a */
    for (size_t i = 0; i < sizeof p->addr; i++)
        h = (h ^ p->addr[i]) * 16777619u;
    return h;
}

static void refill(const dqd_authlimit *a, dqd_authbucket *b, uint64_t now_ms)
{
    if (now_ms > b->t_ms) {
        b->tokens += (double)(now_ms - b->t_ms) * a->per_ms;
        if (b->tokens > a->burst)
            b->tokens = a->burst;
    }
    b->t_ms = now_ms;
}

/* p's bucket, up to date; a new one in a free slot (or one whose bucket is full again, which is the
 * same as none) when create, else NULL; the overflow bucket when there is no room. */
static dqd_authbucket *bucket(dqd_authlimit *a, const dqd_peer *p, uint64_t now_ms, bool create)
{
    const uint32_t h = peer_hash(p);
    dqd_authbucket *free_slot = NULL;
    for (uint32_t i = 0; i < DQD_AUTHLIMIT_PROBE; i++) {
        dqd_authbucket *b = &a->slots[(h + i) % DQD_AUTHLIMIT_SLOTS];
        if (b->peer.family && memcmp(&b->peer, p, sizeof *p) == 0) {
            refill(a, b, now_ms);
            return b;
        }
        if (!free_slot) {
            if (b->peer.family)
                refill(a, b, now_ms);
            if (!b->peer.family || b->tokens >= a->burst)
                free_slot = b;
        }
    }
    dqd_authbucket *b = free_slot;
    if (!b) {
        refill(a, &a->overflow, now_ms);
        return &a->overflow;
    }
    if (!create)
        return NULL;
    b->peer = *p;
    b->tokens = a->burst;
    b->t_ms = now_ms;
    return b;
}

bool dqd_authlimit_allowed(dqd_authlimit *a, const dqd_peer *p, uint64_t now_ms)
{
    if (!p->family)
        return true;
    const dqd_authbucket *b = bucket(a, p, now_ms, false);
    return !b || b->tokens >= 1.0;
}

void dqd_authlimit_failed(dqd_authlimit *a, const dqd_peer *p, uint64_t now_ms)
{
    if (!p->family)
        return;
    dqd_authbucket *b = bucket(a, p, now_ms, true);
    b->tokens = b->tokens >= 1.0 ? b->tokens - 1.0 : 0.0;
}
