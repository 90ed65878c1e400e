/* Members of a dqc_cluster from DNS (cluster.c): SRV records, or A/AAAA records of one name, asked
 * through libresolv on a private resolver state (no global state, any thread). */
#ifndef DQUANT_CLUSTER_DNS_H
#define DQUANT_CLUSTER_DNS_H

#include <stddef.h>
#include <stdint.h>

#define DQC_DNS_MAX_MEMBERS 256

typedef struct dqc__dns_member {
    char id[256];   /* TARGET:PORT (SRV) or IP:PORT (A/AAAA): what placement hashes */
    char addr[300]; /* tcp://IP:PORT, or tcp://TARGET:PORT when the target has no address record */
} dqc__dns_member;

/* Resolves name: its SRV records (srv != 0; port ignored) or its A and AAAA records (each with
 * port). server: "IP" or "IP:PORT" of the DNS server to ask, or NULL for the system's resolver.
 * Fills out[0 .. *n) (at most DQC_DNS_MAX_MEMBERS, sorted by id, no duplicates). Returns 0,
 * DQ_NOT_FOUND (no such name, or no record of the type), DQ_TIMEOUT (no answer), DQ_INVALID_ARGUMENT
 * (bad server), DQ_IO (another resolver failure); err (errlen bytes) says what. */
int dqc__dns_resolve(const char *server, int srv, const char *name, uint16_t port, dqc__dns_member *out, size_t *n,
                     char *err, size_t errlen);

#endif
