/* DNS members of a dqc_cluster through libresolv: res_nsearch on a resolver state of our own (the
 * system's configuration, or one server given by the caller), answers parsed with ns_parserr. */
#include "cluster_dns.h"

#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"

#define DNS_ANSWER_MAX 65536

/* "IP" or "IP:PORT" (IPv4) into sa. 0 or -1. */
static int parse_server(const char *s, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strchr(s, ':');
    size_t hl = colon ? (size_t)(colon - s) : strlen(s);
    if (hl == 0 || hl >= sizeof host)
        return -1;
    memcpy(host, s, hl);
    host[hl] = 0;
    long port = 53;
    if (colon) {
        char *end = NULL;
        port = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || port <= 0 || port > 65535)
            return -1;
    }
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static int query_error(res_state st, const char *name, const char *type, char *err, size_t errlen)
{
    switch (st->res_h_errno) {
    case HOST_NOT_FOUND:
        snprintf(err, errlen, "DNS: no such name %s", name);
        return DQ_NOT_FOUND;
    case NO_DATA:
        snprintf(err, errlen, "DNS: %s has no %s record", name, type);
        return DQ_NOT_FOUND;
    case TRY_AGAIN:
        snprintf(err, errlen, "DNS: no answer for %s %s (server unreachable or failing)", name, type);
        return DQ_TIMEOUT;
    default:
        snprintf(err, errlen, "DNS: query %s %s failed (h_errno %d)", name, type, st->res_h_errno);
        return DQ_IO;
    }
}

/* The addresses (A, then AAAA when there is no A) of host, as "IP" strings (IPv6 in brackets). */
static size_t host_addrs(res_state st, unsigned char *buf, const char *host, char (*ips)[48], size_t max)
{
    size_t n = 0;
    static const int types[2] = {ns_t_a, ns_t_aaaa};
    for (int t = 0; t < 2 && n == 0; t++) {
        int len = res_nsearch(st, host, ns_c_in, types[t], buf, DNS_ANSWER_MAX);
        ns_msg msg;
        if (len < 0 || ns_initparse(buf, len, &msg) < 0)
            continue;
        for (int i = 0; i < ns_msg_count(msg, ns_s_an) && n < max; i++) {
            ns_rr rr;
            if (ns_parserr(&msg, ns_s_an, i, &rr) < 0 || (int)ns_rr_type(rr) != types[t])
                continue;
            char ip[INET6_ADDRSTRLEN];
            if (types[t] == ns_t_a && ns_rr_rdlen(rr) == 4 && inet_ntop(AF_INET, ns_rr_rdata(rr), ip, sizeof ip))
                snprintf(ips[n++], sizeof ips[0], "%s", ip);
            else if (types[t] == ns_t_aaaa && ns_rr_rdlen(rr) == 16 &&
                     inet_ntop(AF_INET6, ns_rr_rdata(rr), ip, sizeof ip))
                snprintf(ips[n++], sizeof ips[0], "[%s]", ip);
        }
    }
    return n;
}

static int cmp_member(const void *a, const void *b)
{
    return strcmp(((const dqc__dns_member *)a)->id, ((const dqc__dns_member *)b)->id);
}

static void add_member(dqc__dns_member *out, size_t *n, const char *id, const char *addr)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(out[i].id, id) == 0)
            return;
    if (*n >= DQC_DNS_MAX_MEMBERS)
        return;
    snprintf(out[*n].id, sizeof out[*n].id, "%s", id);
    snprintf(out[*n].addr, sizeof out[*n].addr, "%s", addr);
    (*n)++;
}

int dqc__dns_resolve(const char *server, int srv, const char *name, uint16_t port, dqc__dns_member *out, size_t *n,
                     char *err, size_t errlen)
{
    *n = 0;
    err[0] = 0;
    struct sockaddr_in sa;
    if (server && parse_server(server, &sa) != 0) {
        snprintf(err, errlen, "DNS server \"%s\": expected IPv4[:PORT]", server);
        return DQ_INVALID_ARGUMENT;
    }
    struct __res_state *st = calloc(1, sizeof *st);
    unsigned char *buf = malloc(DNS_ANSWER_MAX);
    if (!st || !buf) {
        free(st);
        free(buf);
        return DQ_NOMEM;
    }
    int rc = 0;
    if (res_ninit(st) != 0) {
        snprintf(err, errlen, "DNS: cannot initialize the resolver");
        free(st);
        free(buf);
        return DQ_IO;
    }
    if (server) {
        /* One server of ours: get_nsaddr() in glibc uses nsaddr_list[0] when its family is set. */
        st->nscount = 1;
        st->nsaddr_list[0] = sa;
    }
    st->retrans = 1; /* seconds per try */
    st->retry = 2;

    const int type = srv ? ns_t_srv : ns_t_a;
    if (!srv) {
        char ips[DQC_DNS_MAX_MEMBERS][48];
        size_t k = host_addrs(st, buf, name, ips, DQC_DNS_MAX_MEMBERS);
        if (k == 0)
            rc = query_error(st, name, "A/AAAA", err, errlen);
        for (size_t i = 0; i < k; i++) {
            char id[256], addr[300];
            snprintf(id, sizeof id, "%.47s:%u", ips[i], port);
            snprintf(addr, sizeof addr, "tcp://%.47s:%u", ips[i], port);
            add_member(out, n, id, addr);
        }
    } else {
        int len = res_nsearch(st, name, ns_c_in, type, buf, DNS_ANSWER_MAX);
        ns_msg msg;
        if (len < 0) {
            rc = query_error(st, name, "SRV", err, errlen);
        } else if (ns_initparse(buf, len, &msg) < 0) {
            snprintf(err, errlen, "DNS: unparseable answer for %s SRV", name);
            rc = DQ_IO;
        } else {
            /* Copy the records first: looking their targets up reuses buf. */
            int count = ns_msg_count(msg, ns_s_an);
            char(*targets)[NS_MAXDNAME] = calloc(count > 0 ? (size_t)count : 1, sizeof *targets);
            uint16_t *ports = calloc(count > 0 ? (size_t)count : 1, sizeof *ports);
            int nt = 0;
            for (int i = 0; targets && ports && i < count; i++) {
                ns_rr rr;
                if (ns_parserr(&msg, ns_s_an, i, &rr) < 0 || ns_rr_type(rr) != ns_t_srv || ns_rr_rdlen(rr) < 7)
                    continue;
                const unsigned char *rd = ns_rr_rdata(rr);
                ports[nt] = ns_get16(rd + 4);
                if (dn_expand(ns_msg_base(msg), ns_msg_end(msg), rd + 6, targets[nt], NS_MAXDNAME) < 0)
                    continue;
                nt++;
            }
            if (!targets || !ports)
                rc = DQ_NOMEM;
            for (int i = 0; rc == 0 && i < nt; i++) {
                char ip[1][48], id[256], addr[300];
                /* Absolute: the target is a full name, not one for the search list. */
                char fq[NS_MAXDNAME + 2];
                snprintf(fq, sizeof fq, "%s.", targets[i]);
                snprintf(id, sizeof id, "%.240s:%u", targets[i], ports[i]);
                if (host_addrs(st, buf, fq, ip, 1))
                    snprintf(addr, sizeof addr, "tcp://%.47s:%u", ip[0], ports[i]);
                else
                    snprintf(addr, sizeof addr, "tcp://%.240s:%u", targets[i], ports[i]);
                add_member(out, n, id, addr);
            }
            if (rc == 0 && nt == 0) {
                snprintf(err, errlen, "DNS: %s has no SRV record", name);
                rc = DQ_NOT_FOUND;
            }
            free(targets);
            free(ports);
        }
    }
    res_nclose(st);
    free(st);
    free(buf);
    if (rc == 0)
        qsort(out, *n, sizeof *out, cmp_member);
    return rc;
}
