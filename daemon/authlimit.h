/* dquantd authentication throttle: failed HELLOs (wrong or missing secret) are counted per peer
 * address in a token bucket of `burst` tokens that refills at `per_min` a minute. A peer with no
 * token left has its HELLOs refused without the secret being looked at, until a token comes back,
 * so guessing the secret goes at per_min guesses a minute per address at most, and a flood of wrong
 * HELLOs costs an answer and a close each. IPv6 peers count per /64 (the block one host is given).
 * The table keeps DQD_AUTHLIMIT_SLOTS peers; a peer that finds no slot shares one overflow bucket
 * with every other such peer, so that many addresses cannot get around the limit either.
 *
 * Loop thread only. */
#ifndef DQD_AUTHLIMIT_H
#define DQD_AUTHLIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DQD_AUTHLIMIT_SLOTS 1024
#define DQD_AUTHLIMIT_PROBE 8

/* A peer: an IPv4 address (family 4, in addr[0..4)) or an IPv6 /64 (family 6, addr[0..8));
 * family 0: not a network peer (a Unix socket), never limited. */
typedef struct dqd_peer {
    uint8_t family;
    uint8_t addr[16];
} dqd_peer;

typedef struct dqd_authbucket {
    dqd_peer peer;
    double tokens;
    uint64_t t_ms; /* when tokens was last brought up to date */
} dqd_authbucket;

typedef struct dqd_authlimit {
    double burst, per_ms;
    dqd_authbucket slots[DQD_AUTHLIMIT_SLOTS];
    dqd_authbucket overflow;
} dqd_authlimit;

void dqd_authlimit_init(dqd_authlimit *a, uint32_t burst, uint32_t per_min);
/* Fills *p from a socket address (struct sockaddr_storage or smaller); family 0 if it is neither
 * IPv4 nor IPv6. IPv4-mapped IPv6 addresses count as IPv4. */
void dqd_peer_from_sockaddr(const void *sa, dqd_peer *p);
/* "192.0.2.1", "2001:db8::/64", "local". */
void dqd_peer_format(const dqd_peer *p, char *buf, size_t len);
/* Whether p may try a HELLO now (has a token). */
bool dqd_authlimit_allowed(dqd_authlimit *a, const dqd_peer *p, uint64_t now_ms);
/* p's HELLO failed: takes a token. */
void dqd_authlimit_failed(dqd_authlimit *a, const dqd_peer *p, uint64_t now_ms);

#endif
