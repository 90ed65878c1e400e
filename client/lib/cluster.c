/* libdquant-client: dqc_cluster, one handle over many dquantd members (see "multi-node" in
 * dquant/client.h). Placement is rendezvous hashing; every operation is a walk down a key's
 * preference list: reads stop at the first member that has the key, writes at R acknowledgements.
 * Members are dqc_client handles; DNS membership comes from cluster_dns.c. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "client_internal.h"
#include "cluster_dns.h"

#define KEYB DQC_CHUNK_KEY_BYTES
#define DNS_FAILURE_REFRESH_MS 1000 /* a failed member triggers a DNS refresh at most this often */
#define LEASE_ID_BITS 48            /* a cluster lease id: member serial << 48 | the daemon's id */

enum { MEMBERS_STATIC, MEMBERS_SRV, MEMBERS_DNS };

typedef struct member {
    char *id, *addr;
    uint64_t seed;      /* XXH3 of id: the member's rendezvous seed */
    uint32_t serial;    /* names the member in lease ids */
    dqc_client *c;      /* NULL until connected */
    int64_t down_until; /* monotonic ms; <= now: up */
    uint32_t backoff_ms;
    uint64_t requests, failures;
    struct dqc_cluster *cl; /* for the on_connect hook */
} member;

typedef struct model_reg {
    dqc_model_spec spec; /* name, profile_name, profile point to copies below */
    char *name, *profile_name;
    void *profile;
    void *calib; /* the KVQ calibration (dqc_register_model_calibrated), NULL: none */
    size_t calib_len;
    uint32_t chunk_tokens;
} model_reg;

struct dqc_cluster {
    dqc_cluster_options opts; /* node.client_name, node.secret and dns_server point to copies below */
    char *client_name, *dns_server;
    uint8_t *secret;

    int mode;       /* MEMBERS_* */
    char *dns_name; /* SRV / DNS */
    uint16_t dns_port;
    int64_t next_refresh_ms, last_refresh_ms;
    int refresh_soon; /* a member failed: refresh DNS once DNS_FAILURE_REFRESH_MS has passed */

    member **m;
    size_t n;
    uint32_t next_serial;

    model_reg *models;
    size_t nmodels;

    dqc_raw_result raw; /* scratch for copies between members */
    int conn_rc;        /* the code of the last failed connect (member_conn) */
    dqc_cluster_stats stats;
    char err[DQC_ERR_MAX];
};

/* ---- small things ---- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static int cfail(dqc_cluster *cl, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cfail(dqc_cluster *cl, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cl->err, sizeof cl->err, fmt, ap);
    va_end(ap);
    return code;
}

/* The member's own message for a failed call, with its name in front. */
static int mfail(dqc_cluster *cl, const member *m, int code)
{
    return cfail(cl, code, "%s: %s", m->id, m->c ? dqc_last_error(m->c) : dqc_strerror(code));
}

#define CHECK_CL(cl)                    \
    do {                                \
        if (!(cl))                      \
            return DQ_INVALID_ARGUMENT; \
        (cl)->err[0] = 0;               \
    } while (0)

#define CHECK_ARG(cl, cond, ...)                                  \
    do {                                                          \
        if (!(cond))                                              \
            return cfail((cl), DQ_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

/* Codes after which the member, not the request, is at fault: it is marked down. */
static int member_failure(int rc)
{
    return rc == DQ_CONNECTION || rc == DQ_TIMEOUT || rc == DQ_IO || rc == DQ_PROTOCOL || rc == DQ_SHUTTING_DOWN;
}

/* Codes that say this member lacks the key (or holds another version, or has no room) while
 * another member may be fine: the walk goes on. */
static int member_lacks(int rc)
{
    return rc == DQ_NOT_FOUND || rc == DQ_ORDER || rc == DQ_OUT_OF_BOUNDS || rc == DQ_RESOURCE_EXHAUSTED ||
           rc == DQ_BUSY;
}

/* ---- options ---- */

void dqc_cluster_options_default(dqc_cluster_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    dqc_options_default(&o->node);
    o->node.connect_timeout_ms = 1000;
    o->node.io_timeout_ms = 10000;
    o->node.reconnect_attempts = 1;
    o->replicas = 1;
    o->write_quorum = 0;
    o->read_spares = 1;
    o->down_backoff_ms = 250;
    o->down_backoff_max_ms = 8000;
    o->dns_refresh_ms = 10000;
    o->dns_server = NULL;
    o->connect_now = 1;
    o->repair = 1;
}

static uint32_t replicas(const dqc_cluster *cl)
{
    return cl->opts.replicas;
}

static uint32_t quorum(const dqc_cluster *cl)
{
    return cl->opts.write_quorum ? cl->opts.write_quorum : cl->opts.replicas;
}

static uint32_t walk_limit(const dqc_cluster *cl)
{
    return cl->opts.replicas + cl->opts.read_spares;
}

/* ---- members ---- */

static void model_free(model_reg *r)
{
    free(r->name);
    free(r->profile_name);
    free(r->profile);
    free(r->calib);
}

/* Registers every remembered model on a fresh connection (the on_connect hook of each member's
 * dqc_client, and after its first connect). Only a transport failure is returned: a member that
 * refuses a model answers the requests that use it with its reason. */
static int replay_models(dqc_client *c, void *ctx)
{
    member *m = ctx;
    for (size_t i = 0; i < m->cl->nmodels; i++) {
        const model_reg *r = &m->cl->models[i];
        int rc = dqc_register_model_calibrated(c, &r->spec, r->chunk_tokens, r->calib, r->calib_len, NULL, NULL);
        if (member_failure(rc))
            return rc;
    }
    return 0;
}

static void mark_down(dqc_cluster *cl, member *m)
{
    int64_t now = now_ms();
    if (m->down_until > now)
        return; /* already down: one failure, one backoff step */
    m->failures++;
    cl->stats.marked_down++;
    uint32_t b = m->backoff_ms ? m->backoff_ms : cl->opts.down_backoff_ms;
    m->down_until = now + b;
    uint64_t next = (uint64_t)b * 2;
    m->backoff_ms = next > cl->opts.down_backoff_max_ms ? cl->opts.down_backoff_max_ms : (uint32_t)next;
    if (cl->mode != MEMBERS_STATIC)
        cl->refresh_soon = 1;
}

static void mark_up(member *m)
{
    m->down_until = 0;
    m->backoff_ms = 0;
}

/* Accounts for a call's result on member m. */
static void note(dqc_cluster *cl, member *m, int rc)
{
    m->requests++;
    if (rc == 0)
        mark_up(m);
    else if (member_failure(rc))
        mark_down(cl, m);
}

/* m's connection, made now when it has none (its models registered on it). NULL after a failure
 * (m marked down, cl->err says why). */
static dqc_client *member_conn(dqc_cluster *cl, member *m)
{
    if (m->c)
        return m->c;
    char err[DQC_ERR_MAX];
    dqc_client *c = NULL;
    int rc = dqc_connect_ex(m->addr, &cl->opts.node, &c, err, sizeof err);
    if (rc == 0) {
        c->on_connect = replay_models;
        c->on_connect_ctx = m;
        rc = replay_models(c, m);
        if (rc) {
            snprintf(err, sizeof err, "%s", dqc_last_error(c));
            dqc_free(c);
            c = NULL;
        }
    }
    if (rc) {
        m->requests++;
        mark_down(cl, m);
        cl->conn_rc = rc;
        cfail(cl, rc, "%s: %s", m->id, err);
        return NULL;
    }
    m->c = c;
    return c;
}

static void member_free(member *m)
{
    if (!m)
        return;
    dqc_free(m->c);
    free(m->id);
    free(m->addr);
    free(m);
}

static member *member_new(dqc_cluster *cl, const char *id, const char *addr)
{
    member *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->id = dup_str(id);
    m->addr = dup_str(addr);
    if (!m->id || !m->addr) {
        member_free(m);
        return NULL;
    }
    m->seed = XXH3_64bits(id, strlen(id));
    m->serial = ++cl->next_serial & 0xFFFF;
    m->cl = cl;
    return m;
}

/* A members list: ids[i] / addrs[i]. */
typedef struct mlist {
    dqc__dns_member *v;
    size_t n;
} mlist;

/* Makes the members exactly list's, keeping the members (connection, state) whose id stays; a
 * member whose address changed is reconnected. */
static int apply_members(dqc_cluster *cl, const mlist *list)
{
    member **nm = calloc(list->n ? list->n : 1, sizeof *nm);
    char *fresh = calloc(list->n ? list->n : 1, 1);
    char *kept = calloc(cl->n ? cl->n : 1, 1);
    if (!nm || !fresh || !kept) {
        free(nm);
        free(fresh);
        free(kept);
        return cfail(cl, DQ_NOMEM, "out of memory for %zu members", list->n);
    }
    for (size_t i = 0; i < list->n; i++) {
        for (size_t j = 0; j < cl->n && !nm[i]; j++) {
            if (!kept[j] && strcmp(cl->m[j]->id, list->v[i].id) == 0) {
                nm[i] = cl->m[j];
                kept[j] = 1;
            }
        }
        if (!nm[i]) {
            nm[i] = member_new(cl, list->v[i].id, list->v[i].addr);
            fresh[i] = 1;
            if (!nm[i]) {
                for (size_t k = 0; k < i; k++)
                    if (fresh[k])
                        member_free(nm[k]);
                free(nm);
                free(fresh);
                free(kept);
                return cfail(cl, DQ_NOMEM, "out of memory for a member");
            }
        }
    }
    uint64_t changes = 0;
    for (size_t i = 0; i < list->n; i++) {
        changes += fresh[i];
        if (!fresh[i] && strcmp(nm[i]->addr, list->v[i].addr) != 0) {
            char *a = dup_str(list->v[i].addr);
            if (a) { /* the same member at another address: reconnect there */
                free(nm[i]->addr);
                nm[i]->addr = a;
                dqc_free(nm[i]->c);
                nm[i]->c = NULL;
            }
        }
    }
    for (size_t j = 0; j < cl->n; j++) {
        if (!kept[j]) {
            member_free(cl->m[j]);
            changes++;
        }
    }
    free(fresh);
    free(kept);
    free(cl->m);
    cl->m = nm;
    cl->n = list->n;
    cl->stats.member_changes += changes;
    return 0;
}

/* "a,b,c" into list (trimmed, empty entries skipped, duplicates dropped). */
static int parse_static(dqc_cluster *cl, const char *s, mlist *list)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    list->v = calloc(cap, sizeof *list->v);
    list->n = 0;
    if (!list->v)
        return cfail(cl, DQ_NOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        const char *e = strchr(p, ',');
        if (!e)
            e = p + strlen(p);
        while (p < e && (*p == ' ' || *p == '\t' || *p == '\n'))
            p++;
        const char *q = e;
        while (q > p && (q[-1] == ' ' || q[-1] == '\t' || q[-1] == '\n'))
            q--;
        size_t len = (size_t)(q - p);
        if (len >= sizeof list->v[0].id) {
            free(list->v);
            return cfail(cl, DQ_INVALID_ARGUMENT, "member address of %zu characters (at most %zu)", len,
                         sizeof list->v[0].id - 1);
        }
        if (len) {
            char a[sizeof list->v[0].id];
            memcpy(a, p, len);
            a[len] = 0;
            int dup = 0;
            for (size_t i = 0; i < list->n; i++)
                dup |= strcmp(list->v[i].id, a) == 0;
            if (!dup) {
                snprintf(list->v[list->n].id, sizeof list->v[0].id, "%s", a);
                snprintf(list->v[list->n].addr, sizeof list->v[0].addr, "%s", a);
                list->n++;
            }
        }
        p = *e ? e + 1 : e;
    }
    if (!list->n) {
        free(list->v);
        return cfail(cl, DQ_INVALID_ARGUMENT, "no member in \"%s\"", s);
    }
    /* Each address must be one dqc_connect accepts: checked by connecting to nothing yet. */
    for (size_t i = 0; i < list->n; i++) {
        const char *a = list->v[i].addr;
        if (strncmp(a, "unix:", 5) != 0 && a[0] != '/' && strncmp(a, "tcp://", 6) != 0) {
            int rc = cfail(cl, DQ_INVALID_ARGUMENT,
                           "member \"%s\": expected unix:/path, tcp://host:port, srv:NAME or dns:NAME:PORT", a);
            free(list->v);
            return rc;
        }
    }
    return 0;
}

/* Resolves the DNS members now into list. */
static int resolve(dqc_cluster *cl, mlist *list)
{
    list->v = calloc(DQC_DNS_MAX_MEMBERS, sizeof *list->v);
    list->n = 0;
    if (!list->v)
        return cfail(cl, DQ_NOMEM, "out of memory");
    char err[DQC_ERR_MAX];
    int rc = dqc__dns_resolve(cl->dns_server, cl->mode == MEMBERS_SRV, cl->dns_name, cl->dns_port, list->v, &list->n,
                              err, sizeof err);
    cl->last_refresh_ms = now_ms();
    cl->next_refresh_ms = cl->last_refresh_ms + cl->opts.dns_refresh_ms;
    cl->refresh_soon = 0;
    if (rc) {
        cl->stats.dns_failures++;
        free(list->v);
        list->v = NULL;
        return cfail(cl, rc, "%s", err);
    }
    cl->stats.dns_refreshes++;
    return 0;
}

/* Parses a members string into the handle's mode and, for a static list, its members. */
static int set_members(dqc_cluster *cl, const char *s)
{
    CHECK_ARG(cl, s && *s, "members: an address list, srv:NAME or dns:NAME:PORT is required");
    mlist list = {0};
    int rc;
    if (strncmp(s, "srv:", 4) == 0 || strncmp(s, "dns:", 4) == 0) {
        int srv = s[0] == 's';
        const char *name = s + 4;
        char *host = NULL;
        uint16_t port = 0;
        if (srv) {
            host = dup_str(name);
        } else {
            const char *colon = strrchr(name, ':');
            char *end = NULL;
            long p = colon ? strtol(colon + 1, &end, 10) : 0;
            if (!colon || colon == name || !colon[1] || *end || p <= 0 || p > 65535)
                return cfail(cl, DQ_INVALID_ARGUMENT, "members \"%s\": expected dns:NAME:PORT", s);
            host = malloc((size_t)(colon - name) + 1);
            if (host) {
                memcpy(host, name, (size_t)(colon - name));
                host[colon - name] = 0;
            }
            port = (uint16_t)p;
        }
        if (!host)
            return cfail(cl, DQ_NOMEM, "out of memory");
        if (!*host || strchr(host, ',')) {
            free(host);
            return cfail(cl, DQ_INVALID_ARGUMENT, "members \"%s\": expected one DNS name", s);
        }
        char *old_name = cl->dns_name;
        int old_mode = cl->mode;
        uint16_t old_port = cl->dns_port;
        cl->dns_name = host;
        cl->mode = srv ? MEMBERS_SRV : MEMBERS_DNS;
        cl->dns_port = port;
        rc = resolve(cl, &list);
        if (rc) {
            free(cl->dns_name);
            cl->dns_name = old_name;
            cl->mode = old_mode;
            cl->dns_port = old_port;
            return rc;
        }
        free(old_name);
    } else {
        rc = parse_static(cl, s, &list);
        if (rc)
            return rc;
        free(cl->dns_name);
        cl->dns_name = NULL;
        cl->mode = MEMBERS_STATIC;
    }
    rc = apply_members(cl, &list);
    free(list.v);
    return rc;
}

/* Work every call does first: DNS membership when due. A failed refresh keeps the members. */
static void tick(dqc_cluster *cl)
{
    if (cl->mode == MEMBERS_STATIC)
        return;
    int64_t now = now_ms();
    if (now < cl->next_refresh_ms && !(cl->refresh_soon && now >= cl->last_refresh_ms + DNS_FAILURE_REFRESH_MS))
        return;
    mlist list = {0};
    char saved[DQC_ERR_MAX];
    memcpy(saved, cl->err, sizeof saved);
    if (resolve(cl, &list) == 0)
        apply_members(cl, &list);
    free(list.v);
    memcpy(cl->err, saved, sizeof saved);
}

int dqc_cluster_set_members(dqc_cluster *cl, const char *members)
{
    CHECK_CL(cl);
    return set_members(cl, members);
}

int dqc_cluster_refresh(dqc_cluster *cl)
{
    CHECK_CL(cl);
    if (cl->mode == MEMBERS_STATIC)
        return 0;
    mlist list = {0};
    int rc = resolve(cl, &list);
    if (rc == 0)
        rc = apply_members(cl, &list);
    free(list.v);
    return rc;
}

/* ---- create / free ---- */

void dqc_cluster_free(dqc_cluster *cl)
{
    if (!cl)
        return;
    for (size_t i = 0; i < cl->n; i++)
        member_free(cl->m[i]);
    free(cl->m);
    for (size_t i = 0; i < cl->nmodels; i++)
        model_free(&cl->models[i]);
    free(cl->models);
    dqc_raw_result_free(&cl->raw);
    free(cl->client_name);
    free(cl->dns_server);
    free(cl->dns_name);
    if (cl->secret) {
        explicit_bzero(cl->secret, cl->opts.node.secret_len);
        free(cl->secret);
    }
    free(cl);
}

int dqc_cluster_create(const char *members, const dqc_cluster_options *opts, dqc_cluster **out, char *errbuf,
                       size_t errbuf_len)
{
    if (errbuf && errbuf_len)
        errbuf[0] = 0;
    if (!out)
        return DQ_INVALID_ARGUMENT;
    *out = NULL;
    dqc_cluster *cl = calloc(1, sizeof *cl);
    if (!cl)
        return DQ_NOMEM;
    dqc_cluster_options_default(&cl->opts);
    if (opts) {
        size_t n = opts->size && opts->size < sizeof cl->opts ? opts->size : sizeof cl->opts;
        memcpy(&cl->opts, opts, n);
        cl->opts.size = sizeof cl->opts;
    }
    dqc_cluster_options *o = &cl->opts;
    int rc = DQ_INVALID_ARGUMENT;
    if (o->replicas < 1 || o->replicas > 64) {
        cfail(cl, rc, "replicas %u: expected 1..64", o->replicas);
        goto fail;
    }
    if (o->write_quorum > o->replicas) {
        cfail(cl, rc, "write_quorum %u exceeds replicas %u", o->write_quorum, o->replicas);
        goto fail;
    }
    if (o->read_spares > 64 || !o->down_backoff_ms || o->down_backoff_max_ms < o->down_backoff_ms ||
        !o->dns_refresh_ms) {
        cfail(cl, rc, "bad option: read_spares <= 64, 0 < down_backoff_ms <= down_backoff_max_ms, dns_refresh_ms > 0");
        goto fail;
    }
    rc = DQ_NOMEM;
    if (o->node.client_name && !(cl->client_name = dup_str(o->node.client_name)))
        goto fail;
    o->node.client_name = cl->client_name;
    if (o->node.secret && o->node.secret_len) {
        if (!(cl->secret = malloc(o->node.secret_len)))
            goto fail;
        memcpy(cl->secret, o->node.secret, o->node.secret_len);
        o->node.secret = cl->secret;
    } else {
        o->node.secret = NULL;
        o->node.secret_len = 0;
    }
    if (o->dns_server && !(cl->dns_server = dup_str(o->dns_server)))
        goto fail;
    o->dns_server = cl->dns_server;

    rc = set_members(cl, members);
    if (rc)
        goto fail;
    if (o->connect_now) {
        size_t up = 0;
        int first = 0;
        char first_err[DQC_ERR_MAX] = "";
        for (size_t i = 0; i < cl->n; i++) {
            if (member_conn(cl, cl->m[i])) {
                up++;
            } else if (!first) {
                /* Another attempt fixes neither a wrong secret nor a protocol version. */
                first = cl->conn_rc == DQ_UNAUTHENTICATED || cl->conn_rc == DQ_VERSION ? cl->conn_rc : DQ_CONNECTION;
                memcpy(first_err, cl->err, sizeof first_err);
            }
        }
        if (!up) {
            rc = cfail(cl, first ? first : DQ_CONNECTION, "no member answered (%zu tried; first: %s)", cl->n,
                       first_err);
            goto fail;
        }
    }
    cl->err[0] = 0;
    *out = cl;
    return 0;
fail:
    if (errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s", cl->err[0] ? cl->err : dqc_strerror(rc));
    dqc_cluster_free(cl);
    return rc;
}

const char *dqc_cluster_last_error(const dqc_cluster *cl)
{
    return cl ? cl->err : "no cluster";
}

size_t dqc_cluster_size(const dqc_cluster *cl)
{
    return cl ? cl->n : 0;
}

int dqc_cluster_member(const dqc_cluster *cl, size_t i, dqc_cluster_member_info *out)
{
    if (!cl || !out || i >= cl->n)
        return DQ_INVALID_ARGUMENT;
    const member *m = cl->m[i];
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", m->id);
    snprintf(out->addr, sizeof out->addr, "%s", m->addr);
    int64_t left = m->down_until - now_ms();
    out->up = left <= 0;
    out->retry_in_ms = left > 0 ? (uint32_t)left : 0;
    out->connected = m->c && m->c->fd >= 0;
    out->requests = m->requests;
    out->failures = m->failures;
    return 0;
}

dqc_client *dqc_cluster_client(dqc_cluster *cl, size_t i)
{
    if (!cl)
        return NULL;
    cl->err[0] = 0;
    if (i >= cl->n) {
        cfail(cl, DQ_INVALID_ARGUMENT, "member %zu of %zu", i, cl->n);
        return NULL;
    }
    return member_conn(cl, cl->m[i]);
}

int dqc_cluster_get_stats(const dqc_cluster *cl, dqc_cluster_stats *out)
{
    if (!cl || !out)
        return DQ_INVALID_ARGUMENT;
    *out = cl->stats;
    return 0;
}

/* ---- placement ---- */

/* The placement digest of a sequence ('s') or of a chunk tree ('c'). */
static uint64_t digest(char kind, const char *ns, const void *key, size_t len)
{
    if (!ns)
        ns = "";
    uint64_t nsh = XXH3_64bits_withSeed(ns, strlen(ns), (uint64_t)(unsigned char)kind);
    return XXH3_64bits_withSeed(key, len, nsh);
}

typedef struct weighted {
    uint64_t w;
    size_t i;
} weighted;

static int cmp_weight(const void *a, const void *b)
{
    const weighted *x = a, *y = b;
    return x->w < y->w ? 1 : x->w > y->w ? -1 : (x->i > y->i) - (x->i < y->i);
}

/* Every member by falling weight for digest d into order (cl->n entries, malloc'd). */
static int rank(const dqc_cluster *cl, uint64_t d, size_t **order)
{
    *order = NULL;
    weighted *w = malloc((cl->n ? cl->n : 1) * sizeof *w);
    size_t *o = malloc((cl->n ? cl->n : 1) * sizeof *o);
    if (!w || !o) {
        free(w);
        free(o);
        return DQ_NOMEM;
    }
    for (size_t i = 0; i < cl->n; i++) {
        w[i].w = XXH3_64bits_withSeed(&d, sizeof d, cl->m[i]->seed);
        w[i].i = i;
    }
    qsort(w, cl->n, sizeof *w, cmp_weight);
    for (size_t i = 0; i < cl->n; i++)
        o[i] = w[i].i;
    free(w);
    *order = o;
    return 0;
}

static size_t locate(const dqc_cluster *cl, uint64_t d, size_t *out, size_t n)
{
    size_t *o;
    if (!cl || !out || rank(cl, d, &o))
        return 0;
    size_t k = n < cl->n ? n : cl->n;
    memcpy(out, o, k * sizeof *out);
    free(o);
    return k;
}

size_t dqc_cluster_locate(const dqc_cluster *cl, const dqc_seq *seq, size_t *out, size_t n)
{
    if (!seq || (!seq->key && seq->key_len))
        return 0;
    return locate(cl, digest('s', seq->ns, seq->key, seq->key_len), out, n);
}

size_t dqc_cluster_locate_chunks(const dqc_cluster *cl, const char *ns, const uint8_t *root, size_t *out, size_t n)
{
    if (!root)
        return 0;
    return locate(cl, digest('c', ns, root, KEYB), out, n);
}

/* ---- walks down a preference list ---- */

typedef struct walk {
    size_t *order;
    size_t pos;
    uint32_t visited; /* members tried (not counting those skipped as down) */
} walk;

static int walk_init(dqc_cluster *cl, walk *w, uint64_t d)
{
    memset(w, 0, sizeof *w);
    tick(cl);
    if (!cl->n)
        return cfail(cl, DQ_CONNECTION, "the cluster has no member");
    return rank(cl, d, &w->order) ? cfail(cl, DQ_NOMEM, "out of memory") : 0;
}

/* The next member that is not marked down, connected, within limit tries; NULL when done. */
static member *walk_next(dqc_cluster *cl, walk *w, uint32_t limit, dqc_client **c)
{
    while (w->pos < cl->n && w->visited < limit) {
        member *m = cl->m[w->order[w->pos++]];
        if (m->down_until > now_ms())
            continue;
        w->visited++;
        *c = member_conn(cl, m);
        if (*c)
            return m;
    }
    return NULL;
}

/* What a walk saw besides success, for its final answer. */
typedef struct outcome {
    int answered;  /* some member answered (whatever it said) */
    int lack_code; /* the last member_lacks code, with its message in msg */
    char msg[DQC_ERR_MAX];
} outcome;

static void saw(dqc_cluster *cl, outcome *oc, const member *m, int rc)
{
    if (!member_failure(rc))
        oc->answered = 1;
    if (member_lacks(rc)) {
        oc->lack_code = rc;
        snprintf(oc->msg, sizeof oc->msg, "%.200s: %.300s", m->id, dqc_last_error(m->c));
    } else if (!oc->lack_code && member_failure(rc)) {
        snprintf(oc->msg, sizeof oc->msg, "%.200s: %.300s", m->id, m->c ? dqc_last_error(m->c) : cl->err);
    }
}

/* The answer of a walk that found no member with the key. */
static int walk_fail(dqc_cluster *cl, const outcome *oc, const char *op)
{
    if (oc->lack_code)
        return cfail(cl, oc->lack_code, "%s: %s", op, oc->msg);
    if (oc->answered)
        return cfail(cl, DQ_NOT_FOUND, "%s: no member holds it", op);
    return cfail(cl, DQ_CONNECTION, "%s: no member reachable (%s)", op, oc->msg[0] ? oc->msg : cl->err);
}

typedef int (*member_op)(dqc_cluster *cl, member *m, dqc_client *c, void *ctx);

/* A read: the members in order until one succeeds. Another error than a member failure or a lack
 * is the request's own and is returned at once. */
static int read_walk(dqc_cluster *cl, uint64_t d, member_op fn, void *ctx, const char *op)
{
    walk w;
    DQC_FORWARD(walk_init(cl, &w, d));
    outcome oc = {0};
    dqc_client *c;
    member *m;
    uint32_t tries = 0;
    int rc = 0;
    while ((m = walk_next(cl, &w, walk_limit(cl), &c))) {
        rc = fn(cl, m, c, ctx);
        note(cl, m, rc);
        if (rc == 0) {
            if (tries || w.pos > w.visited)
                cl->stats.failovers++;
            free(w.order);
            cl->err[0] = 0;
            return 0;
        }
        tries++;
        saw(cl, &oc, m, rc);
        if (!member_failure(rc) && !member_lacks(rc)) {
            free(w.order);
            return mfail(cl, m, rc);
        }
    }
    free(w.order);
    return walk_fail(cl, &oc, op);
}

/* A write: the first R members that are up, a member that fails or lacks the key replaced by the
 * next (within R + read_spares tries); done at R acknowledgements, successful at W. acked[] (R
 * entries, may be NULL) gets the members that acknowledged. */
static int write_walk(dqc_cluster *cl, uint64_t d, member_op fn, void *ctx, const char *op, member **acked,
                      uint32_t *nacked)
{
    walk w;
    DQC_FORWARD(walk_init(cl, &w, d));
    outcome oc = {0};
    dqc_client *c;
    member *m;
    uint32_t acks = 0;
    while (acks < replicas(cl) && (m = walk_next(cl, &w, walk_limit(cl), &c))) {
        int rc = fn(cl, m, c, ctx);
        note(cl, m, rc);
        if (rc == 0) {
            if (acked)
                acked[acks] = m;
            acks++;
            continue;
        }
        saw(cl, &oc, m, rc);
        if (!member_failure(rc) && !member_lacks(rc)) {
            free(w.order);
            return mfail(cl, m, rc);
        }
    }
    free(w.order);
    if (nacked)
        *nacked = acks;
    if (acks >= quorum(cl)) {
        if (acks < replicas(cl))
            cl->stats.degraded_writes++;
        cl->err[0] = 0;
        return 0;
    }
    if (acks)
        return cfail(cl, oc.lack_code ? oc.lack_code : DQ_CONNECTION, "%s: written to %u member(s), %u needed (%s)", op,
                     acks, quorum(cl), oc.msg);
    return walk_fail(cl, &oc, op);
}

/* Every member that may hold the key (R + read_spares, up ones): success when one succeeded. */
static int all_walk(dqc_cluster *cl, uint64_t d, member_op fn, void *ctx, const char *op)
{
    walk w;
    DQC_FORWARD(walk_init(cl, &w, d));
    outcome oc = {0};
    dqc_client *c;
    member *m;
    int ok = 0;
    while ((m = walk_next(cl, &w, walk_limit(cl), &c))) {
        int rc = fn(cl, m, c, ctx);
        note(cl, m, rc);
        if (rc == 0) {
            ok = 1;
            continue;
        }
        saw(cl, &oc, m, rc);
        if (!member_failure(rc) && !member_lacks(rc)) {
            free(w.order);
            return mfail(cl, m, rc);
        }
    }
    free(w.order);
    if (ok) {
        cl->err[0] = 0;
        return 0;
    }
    return walk_fail(cl, &oc, op);
}

/* ---- models ---- */

int dqc_cluster_register_model(dqc_cluster *cl, const dqc_model_spec *spec, uint32_t chunk_tokens, dqc_model_info *info,
                               uint32_t *chunk_tokens_out)
{
    return dqc_cluster_register_model_calibrated(cl, spec, chunk_tokens, NULL, 0, info, chunk_tokens_out);
}

int dqc_cluster_register_model_calibrated(dqc_cluster *cl, const dqc_model_spec *spec, uint32_t chunk_tokens,
                                          const void *calibration, size_t calibration_len, dqc_model_info *info,
                                          uint32_t *chunk_tokens_out)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, spec && spec->name && spec->name[0], "register_model: spec and its name are required");
    CHECK_ARG(cl, calibration || !calibration_len, "register_model: calibration is NULL with %zu bytes",
              calibration_len);
    tick(cl);
    /* Remembered first, so that a member connecting below gets it from the hook as well. */
    model_reg r = {0};
    r.spec = *spec;
    r.chunk_tokens = chunk_tokens;
    r.name = dup_str(spec->name);
    r.profile_name = spec->profile_name ? dup_str(spec->profile_name) : NULL;
    if (spec->profile && spec->profile_len) {
        r.profile = malloc(spec->profile_len);
        if (r.profile)
            memcpy(r.profile, spec->profile, spec->profile_len);
    }
    if (calibration_len) {
        r.calib = malloc(calibration_len);
        if (r.calib)
            memcpy(r.calib, calibration, calibration_len);
        r.calib_len = calibration_len;
    }
    if (!r.name || (spec->profile_name && !r.profile_name) || (spec->profile && spec->profile_len && !r.profile) ||
        (calibration_len && !r.calib)) {
        model_free(&r);
        return cfail(cl, DQ_NOMEM, "out of memory");
    }
    r.spec.name = r.name;
    r.spec.profile_name = r.profile_name;
    r.spec.profile = r.profile;
    size_t slot = cl->nmodels;
    for (size_t i = 0; i < cl->nmodels; i++)
        if (strcmp(cl->models[i].name, spec->name) == 0)
            slot = i;
    model_reg old = {0};
    if (slot == cl->nmodels) {
        model_reg *mr = realloc(cl->models, (cl->nmodels + 1) * sizeof *mr);
        if (!mr) {
            model_free(&r);
            return cfail(cl, DQ_NOMEM, "out of memory");
        }
        cl->models = mr;
        cl->nmodels++;
    } else {
        old = cl->models[slot];
    }
    cl->models[slot] = r;

    int answered = 0, rc = 0;
    outcome oc = {0};
    for (size_t i = 0; i < cl->n; i++) {
        member *m = cl->m[i];
        dqc_client *c = m->down_until > now_ms() ? NULL : member_conn(cl, m);
        if (!c)
            continue;
        dqc_model_info mi;
        uint32_t ct = 0;
        int mrc = dqc_register_model_calibrated(c, spec, chunk_tokens, calibration, calibration_len, &mi, &ct);
        note(cl, m, mrc);
        if (member_failure(mrc)) {
            saw(cl, &oc, m, mrc);
            continue;
        }
        if (mrc) {
            rc = mfail(cl, m, mrc);
            break;
        }
        if (!answered) {
            if (info)
                *info = mi;
            if (chunk_tokens_out)
                *chunk_tokens_out = ct;
        }
        answered = 1;
    }
    if (!rc && !answered)
        rc = cfail(cl, DQ_CONNECTION, "register_model: no member reachable (%s)", oc.msg[0] ? oc.msg : cl->err);
    if (rc && rc != DQ_CONNECTION) { /* refused: forget it (or go back to the earlier spec) */
        model_free(&cl->models[slot]);
        if (old.name)
            cl->models[slot] = old;
        else
            cl->models[slot] = cl->models[--cl->nmodels];
    } else {
        model_free(&old);
    }
    return rc;
}

/* ---- sequences ---- */

typedef struct put_ctx {
    const dqc_put_args *a;
    const uint8_t *prefix; /* put_on_prefix */
    size_t nprefix;
    uint64_t prefix_digest;
    member *source;      /* a member known to hold the whole prefix */
    dqc_put_result *res; /* may be NULL */
    int have_res;
    member *stale[64]; /* members that answered DQ_ORDER */
    uint32_t nstale;
} put_ctx;

static int copy_chunks(dqc_cluster *cl, member *src, member *dst, const char *ns, const char *model,
                       const uint8_t *keys, size_t from, size_t to);
static member *chunk_source(dqc_cluster *cl, uint64_t d, const char *ns, const char *model, const uint8_t *keys,
                            size_t n, const member *except);

static int op_put(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    put_ctx *p = ctx;
    dqc_put_result r;
    int rc;
    if (p->nprefix) {
        /* The sequence and its prefix chunks must share a daemon: copy what this one lacks. */
        dqc_lookup_result lr;
        rc = dqc_lookup(c, p->a->seq.ns, p->a->model, p->prefix, p->nprefix, 0, &lr);
        if (rc)
            return rc;
        if (lr.hits < p->nprefix) {
            if (!p->source)
                p->source = chunk_source(cl, p->prefix_digest, p->a->seq.ns, p->a->model, p->prefix, p->nprefix, m);
            if (!p->source)
                return dqc__fail(c, DQ_NOT_FOUND, "prefix chunk %llu not held by any member",
                                 (unsigned long long)lr.hits);
            rc = copy_chunks(cl, p->source, m, p->a->seq.ns, p->a->model, p->prefix, lr.hits, p->nprefix);
            if (rc)
                return rc;
        }
        rc = dqc_put_on_prefix(c, p->a, p->prefix, p->nprefix, &r);
    } else {
        rc = dqc_put(c, p->a, &r);
    }
    if (rc == DQ_ORDER && p->a->start_token > 0) {
        /* dquantd answers an append to a sequence it does not hold with ORDER too ("holds 0
         * tokens"): absent is a miss here, another length a stale copy. */
        dqc_get_args ga = {.seq = p->a->seq, .num_layers = 1, .tokens = 1, .dtype = DQ_DTYPE_BF16};
        dqc_get_result g = {0};
        char saved[DQC_ERR_MAX];
        memcpy(saved, c->err, sizeof saved);
        if (dqc_get(c, &ga, &g) == DQ_NOT_FOUND)
            rc = dqc__fail(c, DQ_NOT_FOUND, "sequence not held (an append to it at %llu was refused)",
                           (unsigned long long)p->a->start_token);
        else
            memcpy(c->err, saved, sizeof saved);
        dqc_get_result_free(&g);
    }
    if (rc == DQ_ORDER && p->nstale < sizeof p->stale / sizeof p->stale[0])
        p->stale[p->nstale++] = m;
    if (rc == 0 && !p->have_res) {
        if (p->res)
            *p->res = r;
        p->have_res = 1;
    }
    return rc;
}

/* After an acknowledged append: the members that answered DQ_ORDER hold another version of the
 * sequence, which they must never serve; a fresh sequence (start_token 0) is written there again. */
static void fix_stale(dqc_cluster *cl, put_ctx *p)
{
    for (uint32_t i = 0; i < p->nstale; i++) {
        member *m = p->stale[i];
        if (!m->c || dqc_delete(m->c, &p->a->seq) != 0)
            continue;
        if (p->a->start_token == 0 && !p->nprefix) {
            dqc_put_result r;
            note(cl, m, dqc_put(m->c, p->a, &r));
        }
    }
}

static int cluster_put(dqc_cluster *cl, const dqc_put_args *a, const uint8_t *prefix, size_t nprefix,
                       dqc_put_result *res, const char *op)
{
    CHECK_CL(cl);
    if (res)
        memset(res, 0, sizeof *res);
    CHECK_ARG(cl, a && (a->seq.key || !a->seq.key_len), "%s: args and the sequence key are required", op);
    CHECK_ARG(cl, !nprefix || prefix, "%s: prefix_keys is NULL with nprefix %zu", op, nprefix);
    put_ctx p = {.a = a, .prefix = prefix, .nprefix = nprefix, .res = res};
    if (nprefix)
        p.prefix_digest = digest('c', a->seq.ns, prefix, KEYB);
    uint32_t acks = 0;
    int rc = write_walk(cl, digest('s', a->seq.ns, a->seq.key, a->seq.key_len), op_put, &p, op, NULL, &acks);
    if (acks)
        fix_stale(cl, &p);
    return rc;
}

int dqc_cluster_put(dqc_cluster *cl, const dqc_put_args *args, dqc_put_result *res)
{
    return cluster_put(cl, args, NULL, 0, res, "put");
}

int dqc_cluster_put_on_prefix(dqc_cluster *cl, const dqc_put_args *args, const uint8_t *prefix_keys, size_t nprefix,
                              dqc_put_result *res)
{
    if (cl && !nprefix)
        return cfail(cl, DQ_INVALID_ARGUMENT, "put_on_prefix: at least one prefix key is required");
    return cluster_put(cl, args, prefix_keys, nprefix, res, "put_on_prefix");
}

typedef struct put_raw_ctx {
    const dqc_put_raw_args *a;
    dqc_put_result *res;
    int have_res;
} put_raw_ctx;

static int op_put_raw(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    (void)cl;
    (void)m;
    put_raw_ctx *p = ctx;
    dqc_put_result r;
    int rc = dqc_put_raw(c, p->a, &r);
    if (rc == 0 && !p->have_res) {
        if (p->res)
            *p->res = r;
        p->have_res = 1;
    }
    return rc;
}

int dqc_cluster_put_raw(dqc_cluster *cl, const dqc_put_raw_args *args, dqc_put_result *res)
{
    CHECK_CL(cl);
    if (res)
        memset(res, 0, sizeof *res);
    CHECK_ARG(cl, args && (args->seq.key || !args->seq.key_len), "put_raw: args and the sequence key are required");
    put_raw_ctx p = {.a = args, .res = res};
    return write_walk(cl, digest('s', args->seq.ns, args->seq.key, args->seq.key_len), op_put_raw, &p, "put_raw", NULL,
                      NULL);
}

typedef struct get_ctx {
    const dqc_get_args *a;
    const dqc_seq *seq;
    uint32_t first_layer, num_layers;
    dqc_get_result *res;
    dqc_raw_result *raw;
} get_ctx;

static int op_get(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    (void)cl;
    (void)m;
    get_ctx *g = ctx;
    if (g->raw)
        return dqc_get_raw(c, g->seq, g->first_layer, g->num_layers, g->raw);
    return dqc_get(c, g->a, g->res);
}

int dqc_cluster_get(dqc_cluster *cl, const dqc_get_args *args, dqc_get_result *res)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, args && res && (args->seq.key || !args->seq.key_len),
              "get: args, res and the sequence key are required");
    get_ctx g = {.a = args, .res = res};
    return read_walk(cl, digest('s', args->seq.ns, args->seq.key, args->seq.key_len), op_get, &g, "get");
}

int dqc_cluster_get_raw(dqc_cluster *cl, const dqc_seq *seq, uint32_t first_layer, uint32_t num_layers,
                        dqc_raw_result *res)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, seq && res && (seq->key || !seq->key_len), "get_raw: seq, res and the sequence key are required");
    get_ctx g = {.seq = seq, .first_layer = first_layer, .num_layers = num_layers, .raw = res};
    return read_walk(cl, digest('s', seq->ns, seq->key, seq->key_len), op_get, &g, "get_raw");
}

typedef struct seq_op_ctx {
    const dqc_seq *seq;
    int (*fn)(dqc_client *, const dqc_seq *);
} seq_op_ctx;

static int op_seq(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    (void)cl;
    (void)m;
    seq_op_ctx *s = ctx;
    return s->fn(c, s->seq);
}

static int seq_all(dqc_cluster *cl, const dqc_seq *seq, int (*fn)(dqc_client *, const dqc_seq *), const char *op)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, seq && (seq->key || !seq->key_len), "%s: seq is required", op);
    seq_op_ctx s = {.seq = seq, .fn = fn};
    return all_walk(cl, digest('s', seq->ns, seq->key, seq->key_len), op_seq, &s, op);
}

int dqc_cluster_delete(dqc_cluster *cl, const dqc_seq *seq)
{
    return seq_all(cl, seq, dqc_delete, "delete");
}

int dqc_cluster_pin(dqc_cluster *cl, const dqc_seq *seq)
{
    return seq_all(cl, seq, dqc_pin, "pin");
}

int dqc_cluster_unpin(dqc_cluster *cl, const dqc_seq *seq)
{
    return seq_all(cl, seq, dqc_unpin, "unpin");
}

/* ---- ATTEND: items grouped by member ---- */

typedef struct att_item {
    walk w;
    member *target; /* where it goes in this round; NULL: pick the next */
    uint32_t acks;
    int done, exhausted, have_out;
} att_item;

int dqc_cluster_attend(dqc_cluster *cl, const dqc_attend_args *a, float *out, float *lse)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, a && a->items && a->nitems && out, "attend: args, items and out are required");
    CHECK_ARG(cl, a->q_heads && a->head_dim, "attend: q_heads and head_dim must be positive");
    tick(cl);
    if (!cl->n)
        return cfail(cl, DQ_CONNECTION, "attend: the cluster has no member");
    const size_t n = a->nitems, orow = (size_t)a->q_heads * a->head_dim, lrow = a->q_heads;
    int write = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_ARG(cl, a->items[i].seq.key || !a->items[i].seq.key_len, "attend: item %zu: seq.key is NULL", i);
        write |= a->items[i].append_k != NULL;
    }
    const uint32_t need = write ? replicas(cl) : 1, ok_at = write ? quorum(cl) : 1;
    att_item *st = calloc(n, sizeof *st);
    dqc_attend_item *sub = malloc(n * sizeof *sub);
    size_t *idx = malloc(n * sizeof *idx);
    float *sout = malloc(n * orow * sizeof *sout);
    float *slse = malloc(n * lrow * sizeof *slse);
    int rc = 0;
    if (!st || !sub || !idx || !sout || !slse) {
        rc = cfail(cl, DQ_NOMEM, "attend: out of memory for %zu items", n);
        goto out;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const dqc_seq *s = &a->items[i].seq;
        if (rank(cl, digest('s', s->ns, s->key, s->key_len), &st[i].w.order))
            rc = cfail(cl, DQ_NOMEM, "attend: out of memory");
    }
    outcome oc = {0};
    uint32_t rounds = 0;
    while (!rc) {
        /* Each pending item's next member; the first item's member makes this round's group. */
        member *g = NULL;
        for (size_t i = 0; i < n; i++) {
            att_item *t = &st[i];
            if (t->done || t->exhausted)
                continue;
            if (!t->target) {
                dqc_client *c;
                t->target = walk_next(cl, &t->w, walk_limit(cl), &c);
                if (!t->target) {
                    t->exhausted = 1;
                    continue;
                }
            }
            if (!g)
                g = t->target;
        }
        if (!g)
            break;
        rounds++;
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (!st[i].done && !st[i].exhausted && st[i].target == g) {
                sub[k] = a->items[i];
                idx[k++] = i;
            }
        dqc_attend_args sa = *a;
        sa.items = sub;
        sa.nitems = k;
        int mrc = g->c ? dqc_attend(g->c, &sa, sout, lse ? slse : NULL) : DQ_CONNECTION;
        note(cl, g, mrc);
        for (size_t j = 0; j < k; j++) {
            att_item *t = &st[idx[j]];
            t->target = NULL;
            if (mrc)
                continue;
            if (!t->have_out) {
                memcpy(out + idx[j] * orow, sout + j * orow, orow * sizeof *out);
                if (lse)
                    memcpy(lse + idx[j] * lrow, slse + j * lrow, lrow * sizeof *lse);
                t->have_out = 1;
                if (t->w.visited > 1 || t->w.pos > t->w.visited)
                    cl->stats.failovers++;
            }
            if (++t->acks >= need)
                t->done = 1;
        }
        if (mrc) {
            saw(cl, &oc, g, mrc);
            if (!member_failure(mrc) && !member_lacks(mrc))
                rc = mfail(cl, g, mrc);
        }
    }
    for (size_t i = 0; i < n && !rc; i++) {
        if (st[i].acks >= ok_at)
            continue;
        if (st[i].acks)
            rc = cfail(cl, oc.lack_code ? oc.lack_code : DQ_CONNECTION,
                       "attend: item %zu appended on %u member(s), %u needed (%s)", i, st[i].acks, ok_at, oc.msg);
        else
            rc = walk_fail(cl, &oc, "attend");
    }
    if (!rc) {
        for (size_t i = 0; i < n; i++)
            if (write && st[i].acks < need) {
                cl->stats.degraded_writes++;
                break;
            }
        cl->err[0] = 0;
    }
out:
    if (st)
        for (size_t i = 0; i < n; i++)
            free(st[i].w.order);
    free(st);
    free(sub);
    free(idx);
    free(sout);
    free(slse);
    return rc;
}

/* ---- the shared KV tier ---- */

/* Copies chunks keys[from .. to) (a run of one prompt tree, from its first chunk) from src to dst,
 * as stored: GET_CHUNKS_RAW, then PUT_CHUNKS_RAW after keys[from - 1]. */
static int copy_chunks(dqc_cluster *cl, member *src, member *dst, const char *ns, const char *model,
                       const uint8_t *keys, size_t from, size_t to)
{
    if (from >= to)
        return 0;
    if (!src->c || !dst->c)
        return DQ_CONNECTION;
    int rc = dqc_get_chunks_raw(src->c, ns, keys + from * KEYB, to - from, &cl->raw);
    note(cl, src, rc);
    if (rc)
        return rc;
    rc = dqc_put_chunks_raw(dst->c, ns, model, keys + from * KEYB, to - from, from ? keys + (from - 1) * KEYB : NULL,
                            cl->raw.layers, cl->raw.nlayers, cl->raw.profile, cl->raw.profile_len, NULL);
    if (rc == 0) {
        cl->stats.repairs++;
        cl->stats.repaired_chunks += to - from;
    }
    return rc;
}

/* A member (not except) that holds all n leading keys, asked in placement order; NULL if none. */
static member *chunk_source(dqc_cluster *cl, uint64_t d, const char *ns, const char *model, const uint8_t *keys,
                            size_t n, const member *except)
{
    size_t *order;
    if (rank(cl, d, &order))
        return NULL;
    member *found = NULL;
    uint32_t tried = 0;
    for (size_t i = 0; i < cl->n && !found && tried < walk_limit(cl); i++) {
        member *m = cl->m[order[i]];
        if (m == except || m->down_until > now_ms())
            continue;
        tried++;
        dqc_client *c = member_conn(cl, m);
        if (!c)
            continue;
        dqc_lookup_result lr;
        int rc = dqc_lookup(c, ns, model, keys, n, 0, &lr);
        note(cl, m, rc);
        if (rc == 0 && lr.hits == n)
            found = m;
    }
    free(order);
    return found;
}

typedef struct chunks_ctx {
    const dqc_put_chunks_args *a; /* parent set to the last prefix key */
    const char *ns, *model;
    const uint8_t *prefix;
    size_t nprefix;
    uint64_t d;
    /* raw */
    const uint8_t *keys;
    size_t nkeys;
    const dqc_raw_layer *layers;
    size_t nlayers;
    const uint8_t *profile;
    size_t profile_len;
    dqc_put_chunks_result *res;
    int have_res;
    member *acked;
} chunks_ctx;

static int put_chunks_once(chunks_ctx *p, dqc_client *c, dqc_put_chunks_result *r)
{
    if (p->a)
        return dqc_put_chunks(c, p->a, r);
    return dqc_put_chunks_raw(c, p->ns, p->model, p->keys, p->nkeys,
                              p->nprefix ? p->prefix + (p->nprefix - 1) * KEYB : NULL, p->layers, p->nlayers,
                              p->profile, p->profile_len, r);
}

static int op_put_chunks(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    chunks_ctx *p = ctx;
    dqc_put_chunks_result r;
    int rc = put_chunks_once(p, c, &r);
    if (rc == DQ_NOT_FOUND && p->nprefix && cl->opts.repair) {
        /* The parent is not held here: copy the prefix from a member that has it, then again. */
        member *src = p->acked ? p->acked : chunk_source(cl, p->d, p->ns, p->model, p->prefix, p->nprefix, m);
        dqc_lookup_result lr;
        if (src && dqc_lookup(c, p->ns, p->model, p->prefix, p->nprefix, 0, &lr) == 0 &&
            copy_chunks(cl, src, m, p->ns, p->model, p->prefix, lr.hits, p->nprefix) == 0)
            rc = put_chunks_once(p, c, &r);
    }
    if (rc == 0) {
        if (!p->acked)
            p->acked = m;
        if (!p->have_res) {
            if (p->res)
                *p->res = r;
            p->have_res = 1;
        }
    }
    return rc;
}

int dqc_cluster_put_chunks(dqc_cluster *cl, const dqc_put_chunks_args *args, const uint8_t *prefix, size_t nprefix,
                           dqc_put_chunks_result *res)
{
    CHECK_CL(cl);
    if (res)
        memset(res, 0, sizeof *res);
    CHECK_ARG(cl, args && args->keys && args->nkeys, "put_chunks: args and at least one key are required");
    CHECK_ARG(cl, !nprefix || prefix, "put_chunks: prefix is NULL with nprefix %zu", nprefix);
    CHECK_ARG(cl, !args->parent || (nprefix && memcmp(args->parent, prefix + (nprefix - 1) * KEYB, KEYB) == 0),
              "put_chunks: parent must be the last prefix key (pass the prompt's keys before keys[0] as prefix)");
    dqc_put_chunks_args a = *args;
    a.parent = nprefix ? prefix + (nprefix - 1) * KEYB : NULL;
    chunks_ctx p = {.a = &a, .ns = args->ns, .model = args->model, .prefix = prefix, .nprefix = nprefix, .res = res};
    p.d = digest('c', args->ns, nprefix ? prefix : args->keys, KEYB);
    return write_walk(cl, p.d, op_put_chunks, &p, "put_chunks", NULL, NULL);
}

int dqc_cluster_put_chunks_raw(dqc_cluster *cl, const char *ns, const char *model, const uint8_t *prefix,
                               size_t nprefix, const uint8_t *keys, size_t nkeys, const dqc_raw_layer *layers,
                               size_t nlayers, const uint8_t *profile, size_t profile_len, dqc_put_chunks_result *res)
{
    CHECK_CL(cl);
    if (res)
        memset(res, 0, sizeof *res);
    CHECK_ARG(cl, keys && nkeys, "put_chunks_raw: at least one key is required");
    CHECK_ARG(cl, !nprefix || prefix, "put_chunks_raw: prefix is NULL with nprefix %zu", nprefix);
    chunks_ctx p = {.ns = ns,
                    .model = model,
                    .prefix = prefix,
                    .nprefix = nprefix,
                    .keys = keys,
                    .nkeys = nkeys,
                    .layers = layers,
                    .nlayers = nlayers,
                    .profile = profile,
                    .profile_len = profile_len,
                    .res = res};
    p.d = digest('c', ns, nprefix ? prefix : keys, KEYB);
    return write_walk(cl, p.d, op_put_chunks, &p, "put_chunks_raw", NULL, NULL);
}

/* Lease ids handed out by the cluster name the member that holds the lease. */
static uint64_t lease_encode(const member *m, uint64_t id)
{
    return (uint64_t)m->serial << LEASE_ID_BITS | id;
}

int dqc_cluster_lookup(dqc_cluster *cl, const char *ns, const char *model, const uint8_t *keys, size_t nkeys,
                       uint32_t lease_ms, dqc_lookup_result *res)
{
    CHECK_CL(cl);
    if (res)
        memset(res, 0, sizeof *res);
    CHECK_ARG(cl, model && model[0], "lookup: model name required");
    CHECK_ARG(cl, keys && nkeys, "lookup: at least one key is required");
    walk w;
    DQC_FORWARD(walk_init(cl, &w, digest('c', ns, keys, KEYB)));
    /* Members asked, with their hits: the first is asked with the lease, the others without. */
    member *asked[130];
    uint64_t hits[130];
    uint32_t nasked = 0, replica_slots = 0;
    dqc_lookup_result best = {0}, first = {0};
    member *best_m = NULL, *first_m = NULL;
    uint32_t known = 0; /* members that know the model */
    outcome oc = {0};
    dqc_client *c;
    member *m;
    int rc = 0;
    while ((m = walk_next(cl, &w, walk_limit(cl), &c))) {
        dqc_lookup_result r;
        int lease = first_m ? 0 : (int)lease_ms;
        rc = dqc_lookup(c, ns, model, keys, nkeys, (uint32_t)lease, &r);
        note(cl, m, rc);
        if (rc && rc != DQ_NOT_FOUND) {
            saw(cl, &oc, m, rc);
            if (!member_failure(rc)) {
                free(w.order);
                return mfail(cl, m, rc);
            }
            continue;
        }
        if (rc == DQ_NOT_FOUND) { /* the model is unknown there: nothing held */
            saw(cl, &oc, m, rc);
            memset(&r, 0, sizeof r);
        }
        oc.answered = 1;
        known += rc == 0;
        if (nasked < replicas(cl))
            replica_slots = nasked + 1;
        asked[nasked] = m;
        hits[nasked++] = r.hits;
        if (!first_m && rc == 0) {
            first_m = m;
            first = r;
        }
        if (!best_m || r.hits > best.hits) {
            best = r;
            best_m = m;
        }
        if (r.hits == nkeys)
            break;
    }
    free(w.order);
    rc = 0;
    if (!best_m || !known) /* no answer, or the model unknown everywhere */
        return walk_fail(cl, &oc, "lookup");
    if (best_m != asked[0] && best.hits)
        cl->stats.failovers++;
    /* The lease belongs with the answer: move it to the best member when that is another. */
    if (lease_ms && best.hits && best_m != first_m) {
        dqc_lookup_result r;
        int lrc = dqc_lookup(best_m->c, ns, model, keys, best.hits, lease_ms, &r);
        note(cl, best_m, lrc);
        if (lrc == 0)
            best.lease_id = r.lease_id, best.lease_ms = r.lease_ms;
        if (first_m && first.lease_id)
            dqc_release_lease(first_m->c, first.lease_id);
    } else if (best_m == first_m) {
        best.lease_id = first.lease_id;
        best.lease_ms = first.lease_ms;
    }
    /* Read repair: the replicas asked that lack chunks the best member has get them. */
    for (uint32_t i = 0; cl->opts.repair && i < replica_slots && i < nasked; i++)
        if (hits[i] < best.hits && asked[i] != best_m)
            copy_chunks(cl, best_m, asked[i], ns, model, keys, (size_t)hits[i], (size_t)best.hits);
    if (res) {
        *res = best;
        res->lease_id = best.lease_id ? lease_encode(best_m, best.lease_id) : 0;
        if (!best.chunk_tokens && first_m)
            res->chunk_tokens = first.chunk_tokens;
    }
    cl->err[0] = 0;
    return rc;
}

int dqc_cluster_release_lease(dqc_cluster *cl, uint64_t lease_id)
{
    CHECK_CL(cl);
    uint32_t serial = (uint32_t)(lease_id >> LEASE_ID_BITS);
    uint64_t id = lease_id & ((1ull << LEASE_ID_BITS) - 1);
    CHECK_ARG(cl, serial && id, "release_lease: %llu is not a lease id of this cluster", (unsigned long long)lease_id);
    for (size_t i = 0; i < cl->n; i++) {
        member *m = cl->m[i];
        if (m->serial != serial)
            continue;
        if (!m->c)
            return cfail(cl, DQ_NOT_FOUND, "release_lease: %s is not connected (its leases ended)", m->id);
        int rc = dqc_release_lease(m->c, id);
        note(cl, m, rc);
        return rc ? mfail(cl, m, rc) : 0;
    }
    return cfail(cl, DQ_NOT_FOUND, "release_lease: the member of lease %llu left the cluster",
                 (unsigned long long)lease_id);
}

typedef struct get_chunks_ctx {
    const char *ns;
    const uint8_t *keys;
    size_t nkeys;
    dq_dtype dtype;
    int raw;
    dqc_get_result *res;
    dqc_raw_result *rres;
} get_chunks_ctx;

static int op_get_chunks(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    (void)cl;
    (void)m;
    get_chunks_ctx *g = ctx;
    if (g->raw)
        return dqc_get_chunks_raw(c, g->ns, g->keys, g->nkeys, g->rres);
    return dqc_get_chunks(c, g->ns, g->keys, g->nkeys, g->dtype, g->res);
}

int dqc_cluster_get_chunks(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *keys, size_t nkeys,
                           dq_dtype dtype, dqc_get_result *res)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, keys && nkeys && res, "get_chunks: keys and res are required");
    get_chunks_ctx g = {.ns = ns, .keys = keys, .nkeys = nkeys, .dtype = dtype, .res = res};
    return read_walk(cl, digest('c', ns, root ? root : keys, KEYB), op_get_chunks, &g, "get_chunks");
}

int dqc_cluster_get_chunks_raw(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *keys, size_t nkeys,
                               dqc_raw_result *res)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, keys && nkeys && res, "get_chunks_raw: keys and res are required");
    get_chunks_ctx g = {.ns = ns, .keys = keys, .nkeys = nkeys, .raw = 1, .rres = res};
    return read_walk(cl, digest('c', ns, root ? root : keys, KEYB), op_get_chunks, &g, "get_chunks_raw");
}

int dqc_cluster_get_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key, dq_dtype dtype,
                          dqc_get_result *res)
{
    return dqc_cluster_get_chunks(cl, ns, root, key, 1, dtype, res);
}

typedef struct chunk_op_ctx {
    const char *ns;
    const uint8_t *key;
    int (*fn)(dqc_client *, const char *, const uint8_t *);
} chunk_op_ctx;

static int op_chunk(dqc_cluster *cl, member *m, dqc_client *c, void *ctx)
{
    (void)cl;
    (void)m;
    chunk_op_ctx *k = ctx;
    return k->fn(c, k->ns, k->key);
}

static int chunk_all(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key,
                     int (*fn)(dqc_client *, const char *, const uint8_t *), const char *op)
{
    CHECK_CL(cl);
    CHECK_ARG(cl, key, "%s: key is required", op);
    chunk_op_ctx k = {.ns = ns, .key = key, .fn = fn};
    return all_walk(cl, digest('c', ns, root ? root : key, KEYB), op_chunk, &k, op);
}

int dqc_cluster_delete_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key)
{
    return chunk_all(cl, ns, root, key, dqc_delete_chunk, "delete_chunk");
}

int dqc_cluster_pin_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key)
{
    return chunk_all(cl, ns, root, key, dqc_pin_chunk, "pin_chunk");
}

int dqc_cluster_unpin_chunk(dqc_cluster *cl, const char *ns, const uint8_t *root, const uint8_t *key)
{
    return chunk_all(cl, ns, root, key, dqc_unpin_chunk, "unpin_chunk");
}
