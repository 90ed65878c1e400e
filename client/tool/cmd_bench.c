/* dquant bench: a load generator for dquantd. N connections (one thread each) send M requests
 * each (or for --duration seconds), drawn from a weighted mix of PUT / GET / ATTEND / PING / STATS
 * and PREFIX (an engine in front of the shared KV tier: LOOKUP a prompt's chunks, PUT_CHUNKS the
 * missing ones), and the tool prints the throughput and the latency percentiles of each kind, and
 * for PREFIX the hit rate seen by the client beside the daemon's own counters. Every connection is
 * a dqc_cluster: one --connect is a cluster of one daemon, several (or a DNS name) spread the keys
 * over many, with --replicas copies each. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_common.h"
#include "eval_rng.h"
#include "commands.h"

enum { OP_PUT, OP_GET, OP_ATTEND, OP_PING, OP_STATS, OP_PREFIX, NOPS };
static const char *const op_names[NOPS] = {"put", "get", "attend", "ping", "stats", "prefix"};

#define NERR 32 /* error codes 0 .. -31 */

typedef struct bench_cfg {
    cli_conn cc;
    char *members;             /* the --connect values, comma-separated (owned) */
    dqc_cluster_options copts; /* replicas, write quorum, spares, DNS server */
    double duration;           /* seconds of measured run; 0: --requests per connection */
    uint32_t timeline_ms;      /* > 0: latency per interval of this length */
    uint32_t connections;
    uint64_t requests;  /* per connection */
    uint64_t warmup;    /* per connection, not measured */
    uint32_t mix[NOPS]; /* weights */
    uint32_t mix_total;
    const char *model, *profile, *ns;
    uint32_t layers, q_heads, kv_heads, head_dim;
    uint64_t tokens;     /* per PUT */
    uint64_t get_tokens; /* per GET (the last ones); 0: whole sequence */
    int get_raw;
    dq_dtype get_dtype;
    uint32_t batch;          /* ATTEND items */
    uint32_t seqs;           /* sequences per connection */
    uint64_t prefill;        /* tokens per sequence before the run */
    uint64_t max_seq_tokens; /* a sequence this long is deleted and restarted */
    uint64_t ping_bytes;
    dq_dtype dtype;
    uint64_t seed;
    int quiet, pin;
    int mix_set;
    /* PREFIX */
    double share;           /* probability that a prompt shares a prefix with a base prompt */
    uint32_t prompts;       /* base prompts */
    uint64_t prompt_tokens; /* tokens per prompt */
    uint32_t chunk_tokens;  /* asked for at registration (0: the daemon's default) */
    uint32_t chunk;         /* the model's, as the daemon answered */
    uint32_t lease_ms;
    int get_hit;
    uint32_t nkeys_max; /* full chunks of a prompt */
    size_t pool_elems;  /* K/V source pool, shared by every connection */
    void *pool;
} bench_cfg;

/* What the PREFIX requests of one connection saw (measured requests only). */
typedef struct prefix_counts {
    uint64_t lookups, keys, hit_chunks, hit_tokens, missed_tokens, stored, deduped, gets;
} prefix_counts;

typedef struct worker {
    int id;
    const bench_cfg *cfg;
    pthread_t thread;
    dqc_cluster *cl;
    char (*keys)[64];
    uint64_t *len; /* tokens in each sequence; UINT64_MAX: unknown (restart it) */
    void *kv;      /* K and V of one PUT: [layers, tokens, kv_heads, head_dim] each */
    size_t kv_bytes;
    void *q; /* batch queries */
    float *out, *lse;
    dqc_attend_item *items;
    uint8_t *ping;
    dqc_get_result get;
    dqc_raw_result raw;
    dqc_stats_result stats;
    uint32_t *prompt;  /* token ids of the current PREFIX request */
    uint8_t *ckeys;    /* its chunk keys */
    void *ckv;         /* K then V of its missing chunks */
    uint64_t prompt_n; /* PREFIX requests made, warm-up included: fresh prompts never repeat */
    prefix_counts pc;
    uint64_t rng;
    uint64_t *lat;   /* ns per measured request */
    uint64_t *start; /* its start, ns after the measured run began */
    uint8_t *op;
    uint8_t *outcome; /* OUT_* */
    uint64_t nrec, cap;
    uint64_t bytes[NOPS];
    uint64_t misses[NOPS];
    uint64_t errs[NOPS][NERR];
    char first_err[NERR][200];
    int setup_rc;
    uint32_t conn_errors; /* consecutive requests that failed for want of the daemon */
} worker;

enum { OUT_OK, OUT_MISS, OUT_ERROR };

static pthread_barrier_t start_barrier;
static uint64_t run_t0, run_deadline; /* ns; set before the measured run starts */
static _Atomic uint64_t done_requests;
static _Atomic uint64_t failed_requests;
static _Atomic int abort_run;
/* A worker saw LOST_AFTER requests in a row fail for want of the daemon (the client's reconnects
 * failed): every worker stops, and the run fails. */
#define LOST_AFTER 3
static _Atomic int lost_daemon;
static char lost_why[256];
static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;

static dqc_seq seq_ref(const worker *w, uint32_t i)
{
    return (dqc_seq){.ns = w->cfg->ns, .key = w->keys[i], .key_len = strlen(w->keys[i])};
}

static void record_error(worker *w, int op, int rc)
{
    int idx = rc < 0 && rc > -NERR ? -rc : 0;
    if (w->errs[op][idx] == 0 && !w->first_err[idx][0])
        snprintf(w->first_err[idx], sizeof w->first_err[idx], "%s: %s", op_names[op], dqc_cluster_last_error(w->cl));
    w->errs[op][idx]++;
}

/* Deletes sequence i (whatever state it is in) and starts it over. */
static void restart_seq(worker *w, uint32_t i)
{
    dqc_seq s = seq_ref(w, i);
    dqc_cluster_delete(w->cl, &s); /* NOT_FOUND is fine */
    w->len[i] = 0;
    if (w->cfg->pin)
        dqc_cluster_pin(w->cl, &s);
}

static int do_put(worker *w, uint32_t i)
{
    const bench_cfg *cfg = w->cfg;
    if (w->len[i] == UINT64_MAX || w->len[i] + cfg->tokens > cfg->max_seq_tokens)
        restart_seq(w, i);
    dqc_put_args a = {
        .seq = seq_ref(w, i),
        .model = cfg->model,
        .start_token = w->len[i],
        .first_layer = 0,
        .num_layers = cfg->layers,
        .tokens = cfg->tokens,
        .kv_heads = cfg->kv_heads,
        .head_dim = cfg->head_dim,
        .dtype = cfg->dtype,
        .k = w->kv,
        .v = (const uint8_t *)w->kv + w->kv_bytes,
    };
    int rc = dqc_cluster_put(w->cl, &a, NULL);
    if (rc == 0)
        w->len[i] += cfg->tokens;
    else if (rc != DQ_RESOURCE_EXHAUSTED)
        w->len[i] = UINT64_MAX; /* maybe applied, maybe evicted: start it over next time */
    return rc;
}

static int do_get(worker *w, uint32_t i, uint64_t *bytes)
{
    const bench_cfg *cfg = w->cfg;
    dqc_seq s = seq_ref(w, i);
    if (cfg->get_raw) {
        int rc = dqc_cluster_get_raw(w->cl, &s, 0, 0, &w->raw);
        for (size_t l = 0; rc == 0 && l < w->raw.nlayers; l++)
            *bytes += w->raw.layers[l].records_bytes + 2 * w->raw.layers[l].tail_bytes;
        return rc;
    }
    uint64_t len = w->len[i] == UINT64_MAX ? 0 : w->len[i];
    uint64_t n = cfg->get_tokens && cfg->get_tokens < len ? cfg->get_tokens : len;
    dqc_get_args a = {
        .seq = s, .first_layer = 0, .num_layers = 0, .start_token = len - n, .tokens = n, .dtype = cfg->get_dtype};
    int rc = dqc_cluster_get(w->cl, &a, &w->get);
    if (rc == 0)
        *bytes += 2 * w->get.bytes;
    return rc;
}

static int do_attend(worker *w, uint64_t r)
{
    const bench_cfg *cfg = w->cfg;
    for (uint32_t b = 0; b < cfg->batch; b++) {
        uint32_t si = (uint32_t)((r + b) % cfg->seqs);
        w->items[b].seq = seq_ref(w, si);
        w->items[b].layer = (uint32_t)((r + b) % cfg->layers);
    }
    dqc_attend_args a = {.items = w->items,
                         .nitems = cfg->batch,
                         .q_heads = cfg->q_heads,
                         .kv_heads = cfg->kv_heads,
                         .head_dim = cfg->head_dim,
                         .dtype = cfg->dtype,
                         .scale = 0};
    return dqc_cluster_attend(w->cl, &a, w->out, w->lse);
}

/* Token i of base prompt b, or of fresh prompt f (tag 1): a function of the seed only, so every
 * connection sees the same base prompts and no two fresh prompts share a chunk. */
static uint32_t prompt_token(const bench_cfg *cfg, uint64_t tag, uint64_t id, uint64_t i)
{
    uint64_t st = cfg->seed ^ (tag << 62) ^ (id * 0x9E3779B97F4A7C15ull) ^ (i * 0xD1B54A32D192ED03ull);
    return (uint32_t)(rng_splitmix64(&st) % 32000u);
}

/* Fills chunk j's K and V (every layer) of the put buffer from the shared pool at offsets that
 * depend on the chunk's key only: identical prefixes give identical data on every connection. */
static void chunk_data(const bench_cfg *cfg, const uint8_t *key, size_t j, size_t nput, uint8_t *k, uint8_t *v)
{
    size_t es = dq_dtype_size(cfg->dtype);
    size_t row = (size_t)cfg->kv_heads * cfg->head_dim; /* elements per token */
    size_t per = (size_t)cfg->chunk * row;              /* per layer and chunk */
    uint64_t h;
    memcpy(&h, key, sizeof h);
    for (uint32_t l = 0; l < cfg->layers; l++) {
        for (int kv = 0; kv < 2; kv++) {
            uint64_t st = h ^ ((uint64_t)l << 1 | (uint64_t)kv);
            size_t off = (size_t)(rng_splitmix64(&st) % (cfg->pool_elems - per + 1));
            uint8_t *dst = (kv ? v : k) + ((size_t)l * nput * per + j * per) * es;
            memcpy(dst, (const uint8_t *)cfg->pool + off * es, per * es);
        }
    }
}

/* One engine request: draw a prompt (with probability --prefix-share its first s chunks, s
 * uniform in 1..all, are those of one of --prompts base prompts; the rest is fresh), LOOKUP its
 * full chunks (leased with --lease-ms), PUT_CHUNKS the ones after the first miss, optionally GET
 * one hit chunk, release the lease. */
static int do_prefix(worker *w, uint64_t *bytes, int measure)
{
    const bench_cfg *cfg = w->cfg;
    uint64_t r = w->prompt_n++;
    uint64_t fresh = ((uint64_t)w->id << 40) | r;
    uint64_t shared = 0, base = 0;
    uint32_t nk = cfg->nkeys_max;
    /* The draw of request r is the same on every connection (replicas behind a balancer seeing one
     * stream of popular prompts): connections that start together miss, and PUT, one new base
     * chunk at the same time, which is what the daemon's deduplication is for. */
    uint64_t st = cfg->seed * 0xD1B54A32D192ED03ull ^ (r + 1) * 0x9E3779B97F4A7C15ull;
    if (rng_unit_open(rng_splitmix64(&st)) < cfg->share) {
        base = rng_splitmix64(&st) % cfg->prompts;
        shared = (1 + rng_splitmix64(&st) % nk) * (uint64_t)cfg->chunk;
    }
    for (uint64_t i = 0; i < cfg->prompt_tokens; i++)
        w->prompt[i] = i < shared ? prompt_token(cfg, 0, base, i) : prompt_token(cfg, 1, fresh, i);
    size_t n = dqc_chunk_keys(cfg->ns, w->prompt, cfg->prompt_tokens, cfg->chunk, NULL, w->ckeys, nk);
    dqc_lookup_result lr = {0};
    int rc = dqc_cluster_lookup(w->cl, cfg->ns, cfg->model, w->ckeys, n, cfg->lease_ms, &lr);
    if (rc)
        return rc;
    prefix_counts pc = {.lookups = 1, .keys = n, .hit_chunks = lr.hits, .hit_tokens = lr.hit_tokens};
    pc.missed_tokens = (n - lr.hits) * cfg->chunk;
    size_t nput = n - lr.hits;
    if (nput) {
        size_t per = (size_t)cfg->layers * nput * cfg->chunk * cfg->kv_heads * cfg->head_dim;
        uint8_t *k = w->ckv, *v = (uint8_t *)w->ckv + per * dq_dtype_size(cfg->dtype);
        for (size_t j = 0; j < nput; j++)
            chunk_data(cfg, w->ckeys + (lr.hits + j) * DQC_CHUNK_KEY_BYTES, j, nput, k, v);
        dqc_put_chunks_args a = {
            .ns = cfg->ns,
            .model = cfg->model,
            .keys = w->ckeys + lr.hits * DQC_CHUNK_KEY_BYTES,
            .nkeys = nput,
            .layers = cfg->layers,
            .chunk_tokens = cfg->chunk,
            .kv_heads = cfg->kv_heads,
            .head_dim = cfg->head_dim,
            .dtype = cfg->dtype,
            .k = k,
            .v = v,
        };
        dqc_put_chunks_result pr = {0};
        /* The chunks before them are the prefix: placement follows the prompt's first chunk. */
        rc = dqc_cluster_put_chunks(w->cl, &a, w->ckeys, lr.hits, &pr);
        pc.stored = pr.stored;
        pc.deduped = pr.deduped;
        *bytes += 2 * per * dq_dtype_size(cfg->dtype);
    }
    if (!rc && cfg->get_hit && lr.hits) {
        size_t j = (size_t)(rng_xorshift64(&w->rng) % lr.hits);
        rc = dqc_cluster_get_chunk(w->cl, cfg->ns, w->ckeys, w->ckeys + j * DQC_CHUNK_KEY_BYTES, cfg->get_dtype,
                                   &w->get);
        if (rc == 0) {
            *bytes += 2 * w->get.bytes;
            pc.gets = 1;
        }
    }
    if (lr.lease_id) {
        int rl = dqc_cluster_release_lease(w->cl, lr.lease_id);
        if (!rc && rl != DQ_NOT_FOUND) /* NOT_FOUND: it expired first */
            rc = rl;
    }
    if (measure) {
        w->pc.lookups += pc.lookups;
        w->pc.keys += pc.keys;
        w->pc.hit_chunks += pc.hit_chunks;
        w->pc.hit_tokens += pc.hit_tokens;
        w->pc.missed_tokens += pc.missed_tokens;
        w->pc.stored += pc.stored;
        w->pc.deduped += pc.deduped;
        w->pc.gets += pc.gets;
    }
    return rc;
}

static int pick_op(worker *w)
{
    uint32_t x = (uint32_t)(rng_xorshift64(&w->rng) % w->cfg->mix_total);
    for (int op = 0; op < NOPS; op++) {
        if (x < w->cfg->mix[op])
            return op;
        x -= w->cfg->mix[op];
    }
    return OP_PING;
}

static void run_one(worker *w, uint64_t r, int measure)
{
    const bench_cfg *cfg = w->cfg;
    int op = pick_op(w);
    uint32_t si = (uint32_t)(rng_xorshift64(&w->rng) % cfg->seqs);
    uint64_t bytes = 0;
    uint64_t t0 = cli_now_ns();
    int rc;
    switch (op) {
    case OP_PUT:
        rc = do_put(w, si);
        bytes = 2 * w->kv_bytes;
        break;
    case OP_GET:
        rc = do_get(w, si, &bytes);
        break;
    case OP_ATTEND:
        rc = do_attend(w, r);
        bytes = (size_t)cfg->batch * cfg->q_heads * cfg->head_dim * (dq_dtype_size(cfg->dtype) + 4);
        break;
    case OP_PING:
    case OP_STATS: {
        /* Not routed: the members in turn. */
        dqc_client *mc = dqc_cluster_client(w->cl, (size_t)(r % dqc_cluster_size(w->cl)));
        if (!mc)
            rc = DQ_CONNECTION;
        else if (op == OP_PING)
            rc = dqc_ping(mc, w->ping, cfg->ping_bytes);
        else
            rc = dqc_stats(mc, &w->stats);
        bytes = op == OP_PING ? 2 * cfg->ping_bytes : 0;
        break;
    }
    default:
        rc = do_prefix(w, &bytes, measure);
        break;
    }
    uint64_t dt = cli_now_ns() - t0;
    if (rc == DQ_CONNECTION || rc == DQ_TIMEOUT || rc == DQ_SHUTTING_DOWN || rc == DQ_UNAUTHENTICATED) {
        if (++w->conn_errors >= LOST_AFTER && !atomic_exchange(&lost_daemon, 1)) {
            pthread_mutex_lock(&lost_mu);
            snprintf(lost_why, sizeof lost_why, "%s: %s", dqc_err_name(rc), dqc_cluster_last_error(w->cl));
            pthread_mutex_unlock(&lost_mu);
        }
    } else {
        w->conn_errors = 0;
    }
    if (!measure)
        return;
    if (w->nrec == w->cap) { /* --duration: the run's length is not known in requests */
        uint64_t cap = w->cap * 2;
        uint64_t *lat = realloc(w->lat, cap * sizeof *lat), *st = lat ? realloc(w->start, cap * sizeof *st) : NULL;
        if (lat)
            w->lat = lat;
        if (st)
            w->start = st;
        uint8_t *o = st ? realloc(w->op, cap) : NULL, *oc = o ? realloc(w->outcome, cap) : NULL;
        if (o)
            w->op = o;
        if (oc)
            w->outcome = oc;
        if (!oc) {
            fprintf(stderr, "dquant bench: out of memory for %llu request records\n", (unsigned long long)cap);
            exit(CLI_FAILED);
        }
        w->cap = cap;
    }
    uint8_t out = OUT_OK;
    if (rc == DQ_NOT_FOUND) { /* not held (evicted, or lost with a member): a miss, not a failure */
        w->misses[op]++;
        out = OUT_MISS;
    } else if (rc) {
        record_error(w, op, rc);
        atomic_fetch_add(&failed_requests, 1);
        out = OUT_ERROR;
    } else {
        w->bytes[op] += bytes;
    }
    w->lat[w->nrec] = dt;
    w->start[w->nrec] = t0 - run_t0;
    w->op[w->nrec] = (uint8_t)op;
    w->outcome[w->nrec] = out;
    w->nrec++;
    atomic_fetch_add(&done_requests, 1);
}

/* A connection of the benchmark: a dqc_cluster over the --connect members (one daemon: a cluster of
 * one). */
static int bench_connect(const bench_cfg *cfg, dqc_cluster **out)
{
    dqc_cluster_options o = cfg->copts;
    o.node.client_name = "dquant";
    if (cfg->cc.timeout_ms) {
        o.node.connect_timeout_ms = cfg->cc.timeout_ms;
        o.node.io_timeout_ms = cfg->cc.timeout_ms;
    }
    o.node.secret = cfg->cc.secret;
    o.node.secret_len = cfg->cc.secret_len;
    char err[512];
    int rc = dqc_cluster_create(cfg->members ? cfg->members : cfg->cc.addr, &o, out, err, sizeof err);
    if (rc)
        fprintf(stderr, "dquant bench: cannot connect to %s: %s: %s\n", cfg->members ? cfg->members : cfg->cc.addr,
                dqc_err_name(rc), err);
    return rc;
}

static int worker_setup(worker *w)
{
    const bench_cfg *cfg = w->cfg;
    w->rng = cfg->seed * 0x9E3779B97F4A7C15ull + (uint64_t)w->id * 0xD1B54A32D192ED03ull + 1;
    w->keys = calloc(cfg->seqs, sizeof *w->keys);
    w->len = calloc(cfg->seqs, sizeof *w->len);
    size_t es = dq_dtype_size(cfg->dtype);
    size_t kvcount = (size_t)cfg->layers * cfg->tokens * cfg->kv_heads * cfg->head_dim;
    w->kv_bytes = kvcount * es;
    w->kv = malloc(2 * w->kv_bytes);
    size_t qcount = (size_t)cfg->batch * cfg->q_heads * cfg->head_dim;
    w->q = malloc(qcount * es);
    w->out = malloc(qcount * sizeof(float));
    w->lse = malloc((size_t)cfg->batch * cfg->q_heads * sizeof(float));
    w->items = calloc(cfg->batch, sizeof *w->items);
    w->ping = malloc(cfg->ping_bytes ? cfg->ping_bytes : 1);
    w->cap = cfg->duration > 0 ? 65536 : cfg->requests;
    w->lat = malloc(w->cap * sizeof *w->lat);
    w->start = malloc(w->cap * sizeof *w->start);
    w->op = malloc(w->cap);
    w->outcome = malloc(w->cap);
    if (cfg->mix[OP_PREFIX]) {
        w->prompt = malloc((cfg->prompt_tokens ? cfg->prompt_tokens : 1) * sizeof *w->prompt);
        w->ckeys = malloc(((size_t)cfg->nkeys_max + 1) * DQC_CHUNK_KEY_BYTES);
        w->ckv = malloc(2 * ((size_t)cfg->layers * cfg->nkeys_max * cfg->chunk * cfg->kv_heads * cfg->head_dim + 1) *
                        es);
    }
    if (!w->keys || !w->len || !w->kv || !w->q || !w->out || !w->lse || !w->items || !w->ping || !w->lat || !w->op ||
        !w->start || !w->outcome || (cfg->mix[OP_PREFIX] && (!w->prompt || !w->ckeys || !w->ckv))) {
        fprintf(stderr, "dquant bench: out of memory\n");
        return DQ_NOMEM;
    }
    uint64_t st = w->rng;
    cli_fill_normal(w->kv, cfg->dtype, 2 * kvcount, &st);
    cli_fill_normal(w->q, cfg->dtype, qcount, &st);
    memset(w->ping, 0x5A, cfg->ping_bytes ? cfg->ping_bytes : 1);
    for (uint32_t b = 0; b < cfg->batch; b++)
        w->items[b].q = (const uint8_t *)w->q + (size_t)b * cfg->q_heads * cfg->head_dim * es;
    for (uint32_t i = 0; i < cfg->seqs; i++)
        snprintf(w->keys[i], sizeof w->keys[i], "bench-%ld-%d-%u", (long)getpid(), w->id, i);

    int rc = bench_connect(cfg, &w->cl);
    if (rc)
        return rc;
    /* Fresh sequences, filled to the prefill length (none when no request uses them). */
    for (uint32_t i = 0; i < cfg->seqs && cfg->mix[OP_PUT] + cfg->mix[OP_GET] + cfg->mix[OP_ATTEND]; i++) {
        restart_seq(w, i);
        while (w->len[i] < cfg->prefill) {
            rc = do_put(w, i);
            if (rc) {
                fprintf(stderr, "dquant bench: prefill of %s failed: %s\n", w->keys[i], dqc_cluster_last_error(w->cl));
                return rc;
            }
        }
    }
    return 0;
}

/* Phases, each closed by start_barrier: set up | main checks every setup | warm up | main reads
 * STATS | measure. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    w->setup_rc = worker_setup(w);
    pthread_barrier_wait(&start_barrier);
    pthread_barrier_wait(&start_barrier);
    if (atomic_load(&abort_run))
        return NULL;
    for (uint64_t r = 0; r < w->cfg->warmup && !atomic_load(&lost_daemon); r++)
        run_one(w, r, 0);
    pthread_barrier_wait(&start_barrier); /* warmed up */
    pthread_barrier_wait(&start_barrier); /* the clock starts */
    if (w->cfg->duration > 0) {
        for (uint64_t r = 0; cli_now_ns() < run_deadline && !atomic_load(&lost_daemon); r++)
            run_one(w, r, 1);
    } else {
        for (uint64_t r = 0; r < w->cfg->requests && !atomic_load(&lost_daemon); r++)
            run_one(w, r, 1);
    }
    return NULL;
}

static void worker_cleanup(worker *w)
{
    if (w->cl && w->keys) {
        for (uint32_t i = 0; i < w->cfg->seqs; i++) {
            dqc_seq s = seq_ref(w, i);
            dqc_cluster_delete(w->cl, &s);
        }
    }
    dqc_cluster_free(w->cl);
    dqc_get_result_free(&w->get);
    dqc_raw_result_free(&w->raw);
    dqc_stats_result_free(&w->stats);
    free(w->keys);
    free(w->len);
    free(w->kv);
    free(w->q);
    free(w->out);
    free(w->lse);
    free(w->items);
    free(w->ping);
    free(w->lat);
    free(w->start);
    free(w->op);
    free(w->outcome);
    free(w->prompt);
    free(w->ckeys);
    free(w->ckv);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array. */
static double pct(const uint64_t *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    if (k < 1)
        k = 1;
    return (double)v[k - 1];
}

/* Per interval of --timeline ms (by each request's start): requests, errors, misses and the
 * latency of the answered ones. lat: scratch of at least every record. */
static void print_timeline(const bench_cfg *cfg, const worker *ws, double wall, uint64_t *lat)
{
    uint64_t step = (uint64_t)cfg->timeline_ms * 1000000ull;
    uint64_t nint = (uint64_t)(wall * 1e9) / step + 1;
    printf("timeline (%u ms intervals):\n%-8s %8s %8s %7s %7s %10s %10s %10s\n", cfg->timeline_ms, "t_s", "requests",
           "req/s", "errors", "misses", "p50 us", "p99 us", "max us");
    for (uint64_t k = 0; k < nint; k++) {
        size_t n = 0;
        uint64_t all = 0, errs = 0, miss = 0;
        for (uint32_t i = 0; i < cfg->connections; i++)
            for (uint64_t r = 0; r < ws[i].nrec; r++) {
                if (ws[i].start[r] / step != k)
                    continue;
                all++;
                errs += ws[i].outcome[r] == OUT_ERROR;
                miss += ws[i].outcome[r] == OUT_MISS;
                if (ws[i].outcome[r] != OUT_ERROR)
                    lat[n++] = ws[i].lat[r];
            }
        if (!all)
            continue;
        qsort(lat, n, sizeof *lat, cmp_u64);
        printf("%-8.1f %8llu %8.0f %7llu %7llu %10.1f %10.1f %10.1f\n", (double)(k * step) / 1e9,
               (unsigned long long)all, (double)all / ((double)step / 1e9), (unsigned long long)errs,
               (unsigned long long)miss, pct(lat, n, 50) / 1e3, pct(lat, n, 99) / 1e3,
               n ? (double)lat[n - 1] / 1e3 : 0.0);
    }
}

static int parse_mix(const char *s, bench_cfg *cfg)
{
    memset(cfg->mix, 0, sizeof cfg->mix);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strpbrk(tok, "=:");
        if (!eq)
            return -1;
        *eq = 0;
        int op = -1;
        for (int i = 0; i < NOPS; i++)
            if (strcmp(tok, op_names[i]) == 0)
                op = i;
        uint32_t wgt;
        if (op < 0 || cli_u32(eq + 1, &wgt) || wgt > 1000000)
            return -1;
        cfg->mix[op] = wgt;
    }
    cfg->mix_total = 0;
    for (int i = 0; i < NOPS; i++)
        cfg->mix_total += cfg->mix[i];
    return cfg->mix_total ? 0 : -1;
}

static const char bench_help[] =
    "NAME\n"
    "       dquant bench - load generator for dquantd\n"
    "\n"
    "SYNOPSIS\n"
    "       dquant bench [-c N] [-n M] [--mix put=W,get=W,attend=W,ping=W,stats=W,prefix=W] [SHAPE OPTIONS]\n"
    "       dquant bench [-c N] [-n M] --prefix-share P [--prompts N] [--prompt-tokens T] [--lease-ms MS]\n"
    "       dquant bench --connect ADDR --connect ADDR ... [--replicas R] [--write-quorum W] [--duration S]\n"
    "\n"
    "DESCRIPTION\n"
    "       Opens N connections, one thread each; every connection registers nothing but uses the\n"
    "       model --model (registered once up front with --profile and the shape options), owns\n"
    "       --seqs sequences in namespace --ns, fills each with --prefill tokens, then sends M\n"
    "       requests drawn from the weighted --mix. PUT appends --tokens tokens to every layer of\n"
    "       one of its sequences (a sequence reaching --max-seq-tokens is deleted and restarted);\n"
    "       GET reads the last --get-tokens tokens of every layer (or the raw containers);\n"
    "       ATTEND sends --batch items over the connection's sequences and layers; PING echoes\n"
    "       --ping-bytes; STATS fetches the counters.\n"
    "       PREFIX is one request of an inference engine in front of the shared KV tier: it draws a\n"
    "       prompt of --prompt-tokens token ids that, with probability --prefix-share, starts with\n"
    "       the first s chunks (s uniform in 1 .. all full chunks) of one of --prompts base prompts\n"
    "       (the same on every connection) and is fresh after them, else is fresh throughout (a\n"
    "       fresh prompt shares no chunk with any other). The n-th PREFIX request of every\n"
    "       connection makes the same draw (share or not, base, s), as replicas of an engine seeing\n"
    "       one stream of popular prompts would; its fresh tokens differ. It computes the keys of\n"
    "       the prompt's full chunks (dqc_chunk_keys, namespace --ns, the model's chunk size),\n"
    "       LOOKUPs them (leased for --lease-ms), PUT_CHUNKS the ones after the first miss (K/V\n"
    "       picked from a pool by the chunk's key, so identical prefixes give identical data),\n"
    "       with --get-hit GETs one hit chunk, and releases the lease. Connections running at once\n"
    "       PUT the same new chunks, which the daemon deduplicates. A PREFIX request's latency and\n"
    "       MB/s cover all of it (K/V sent, the hit chunk received).\n"
    "       At the end two lines compare the client's figures (lookups, hit chunks and tokens,\n"
    "       missed tokens after the first miss, hit rate = hit / (hit + missed) tokens, chunks\n"
    "       stored and deduplicated) with the daemon's STATS counters over the measured run\n"
    "       (lookups, lookup_hit_tokens, lookup_missed_tokens, their hit rate, chunks_put,\n"
    "       chunk_dedupe_hits; /metrics exports them as dquant_lookup_* and\n"
    "       dquant_chunk_dedupe_hits_total); they agree when no other client uses the daemon.\n"
    "       Prints per kind and in total: requests, errors, misses, requests/s, MB/s of tensor\n"
    "       payload (PUT: raw K+V sent; GET: K+V received; ATTEND: queries sent + outputs\n"
    "       received) and latency p50/p99/p999/max of the answered requests (misses included). A\n"
    "       progress line goes to stderr every second while the run lasts (on a terminal; every\n"
    "       10 s otherwise).\n"
    "       The connections' sequences are deleted at the end.\n"
    "       Every connection is a multi-node client (dqc_cluster, see client.h): with --connect given\n"
    "       more than once, or as srv:NAME / dns:NAME:PORT, the keys are spread over the daemons\n"
    "       by rendezvous hashing with --replicas copies each; a daemon that fails is skipped and\n"
    "       the next one answers. A request answered NOT_FOUND (a sequence or chunk not held:\n"
    "       evicted, or lost with a daemon) is counted as a miss, apart from the errors. At the end\n"
    "       a line sums what the clients' cluster handles did (failovers, members marked down,\n"
    "       degraded writes, chunks repaired); the daemon counters of the PREFIX lines are summed\n"
    "       over the members.\n"
    "       When 3 requests in a row of one connection fail for want of the daemon (CONNECTION,\n"
    "       TIMEOUT, SHUTTING_DOWN or UNAUTHENTICATED: the client's reconnects failed), every\n"
    "       connection stops and the bench exits with status 1.\n"
    "\n"
    "OPTIONS\n"
    "   -c, --connections N\n"
    "       Connections (threads), default 2.\n"
    "   -n, --requests M\n"
    "       Measured requests per connection, default 1000.\n"
    "   --warmup W\n"
    "       Unmeasured requests per connection first, default 0.\n"
    "   --mix SPEC\n"
    "       Weights per kind (put, get, attend, ping, stats, prefix), default put=30,get=40,attend=30,\n"
    "       or prefix=1 when a PREFIX option is given without --mix.\n"
    "   --prefix-share P\n"
    "       PREFIX: probability in [0, 1] that a prompt shares a prefix with a base prompt\n"
    "       (default 0.5).\n"
    "   --prompts N, --prompt-tokens T\n"
    "       PREFIX: base prompts (default 16) and tokens per prompt (default 1024).\n"
    "   --chunk-tokens C\n"
    "       PREFIX: chunk size asked for when the model is registered (default 0: the daemon's,\n"
    "       256; a multiple of the profile's window).\n"
    "   --duration SECONDS\n"
    "       Measure for this long instead of --requests per connection.\n"
    "   --timeline MS\n"
    "       Also print, per interval of MS milliseconds of the measured run, the requests, errors,\n"
    "       misses and latency p50/p99/max (a failover shows as the intervals it slows down).\n"
    "   --replicas R, --write-quorum W, --read-spares S\n"
    "       Copies of every key (default 1), acknowledgements a write needs (default R), members\n"
    "       past the R replicas a read asks and a failed write falls back to (default 1).\n"
    "   --dns-server IP[:PORT]\n"
    "       The DNS server asked for srv:NAME / dns:NAME:PORT members (default: the system's).\n"
    "   --lease-ms MS\n"
    "       PREFIX: lease the hit chunks for MS ms between LOOKUP and the end of the request\n"
    "       (default 0: no lease).\n"
    "   --get-hit\n"
    "       PREFIX: GET one hit chunk (as --get-dtype; raw counts as bf16) per request with hits.\n"
    "   --model NAME, --profile NAME\n"
    "       Model used (default dquant-bench, registered with profile dq226 if new).\n"
    "   --layers L, --q-heads Q, --kv-heads H, --head-dim D\n"
    "       Shape: layers written per PUT and read per GET (default 1, 32, 8, 128).\n"
    "   --tokens T\n"
    "       Tokens per PUT (default 128).\n"
    "   --dtype f32|f16|bf16\n"
    "       Element type of PUT data and queries (default bf16).\n"
    "   --get-tokens T, --get-dtype f32|f16|bf16|raw\n"
    "       Tokens per GET (default 128; 0: all) and returned format (default bf16).\n"
    "   --batch B\n"
    "       ATTEND items per request (default 1).\n"
    "   --seqs S\n"
    "       Sequences per connection (default: B).\n"
    "   --prefill T, --max-seq-tokens T\n"
    "       Tokens written to each sequence before the run (default 1024) and the length at\n"
    "       which a sequence is restarted (default 32768).\n"
    "   --ping-bytes BYTES\n"
    "       PING payload (default 0).\n"
    "   --ns NAMESPACE\n"
    "       Namespace of the benchmark's sequences (default \"bench\").\n"
    "   --pin\n"
    "       Pin the benchmark's sequences.\n"
    "   --seed S\n"
    "       Seed of the data and of the request mix (default 1).\n"
    "   --quiet\n"
    "       No progress line.\n"
    "   --connect ADDR (repeated), --connect srv:NAME, --connect dns:NAME:PORT\n"
    "       The daemons of a cluster: a list, or a DNS name whose SRV (or A/AAAA) records list\n"
    "       them (a Kubernetes headless Service), re-resolved every 10 s.\n" CLI_CONN_HELP "\n"
    "EXIT STATUS\n"
    "       0 when every request was answered (misses included), 1 when any failed (see the error\n"
    "       summary) or the setup failed, 2 on a usage error.\n"
    "\n"
    "EXAMPLES\n"
    "       dquant bench -c 2 -n 5000 --mix put=10,get=45,attend=45 --batch 32\n"
    "       dquant bench -c 4 -n 100000 --mix ping=1 --connect tcp://127.0.0.1:7733\n"
    "       dquant bench -c 2 -n 300 --prefix-share 0.7 --prompts 8 --lease-ms 1000 --get-hit\n"
    "       dquant bench -c 8 --duration 60 --timeline 1000 --replicas 2 --write-quorum 1 \\\n"
    "           --connect tcp://10.0.0.1:7733 --connect tcp://10.0.0.2:7733 --connect tcp://10.0.0.3:7733\n";

enum {
    BO_WARMUP = CLI_OPT_FIRST_OWN,
    BO_MIX,
    BO_MODEL,
    BO_PROFILE,
    BO_LAYERS,
    BO_Q_HEADS,
    BO_KV_HEADS,
    BO_HEAD_DIM,
    BO_TOKENS,
    BO_DTYPE,
    BO_GET_TOKENS,
    BO_GET_DTYPE,
    BO_BATCH,
    BO_SEQS,
    BO_PREFILL,
    BO_MAX_SEQ,
    BO_PING_BYTES,
    BO_NS,
    BO_PIN,
    BO_SEED,
    BO_QUIET,
    BO_SHARE,
    BO_PROMPTS,
    BO_PROMPT_TOKENS,
    BO_CHUNK_TOKENS,
    BO_LEASE_MS,
    BO_GET_HIT,
    BO_REPLICAS,
    BO_WRITE_QUORUM,
    BO_READ_SPARES,
    BO_DNS_SERVER,
    BO_DURATION,
    BO_TIMELINE,
};

static int parse_args(int argc, char **argv, bench_cfg *cfg)
{
    static const struct option longopts[] = {
        CLI_CONN_LONGOPTS,
        {"connections", required_argument, NULL, 'c'},
        {"requests", required_argument, NULL, 'n'},
        {"warmup", required_argument, NULL, BO_WARMUP},
        {"mix", required_argument, NULL, BO_MIX},
        {"model", required_argument, NULL, BO_MODEL},
        {"profile", required_argument, NULL, BO_PROFILE},
        {"layers", required_argument, NULL, BO_LAYERS},
        {"q-heads", required_argument, NULL, BO_Q_HEADS},
        {"kv-heads", required_argument, NULL, BO_KV_HEADS},
        {"head-dim", required_argument, NULL, BO_HEAD_DIM},
        {"tokens", required_argument, NULL, BO_TOKENS},
        {"dtype", required_argument, NULL, BO_DTYPE},
        {"get-tokens", required_argument, NULL, BO_GET_TOKENS},
        {"get-dtype", required_argument, NULL, BO_GET_DTYPE},
        {"batch", required_argument, NULL, BO_BATCH},
        {"seqs", required_argument, NULL, BO_SEQS},
        {"prefill", required_argument, NULL, BO_PREFILL},
        {"max-seq-tokens", required_argument, NULL, BO_MAX_SEQ},
        {"ping-bytes", required_argument, NULL, BO_PING_BYTES},
        {"ns", required_argument, NULL, BO_NS},
        {"pin", no_argument, NULL, BO_PIN},
        {"seed", required_argument, NULL, BO_SEED},
        {"quiet", no_argument, NULL, BO_QUIET},
        {"prefix-share", required_argument, NULL, BO_SHARE},
        {"prompts", required_argument, NULL, BO_PROMPTS},
        {"prompt-tokens", required_argument, NULL, BO_PROMPT_TOKENS},
        {"chunk-tokens", required_argument, NULL, BO_CHUNK_TOKENS},
        {"lease-ms", required_argument, NULL, BO_LEASE_MS},
        {"get-hit", no_argument, NULL, BO_GET_HIT},
        {"replicas", required_argument, NULL, BO_REPLICAS},
        {"write-quorum", required_argument, NULL, BO_WRITE_QUORUM},
        {"read-spares", required_argument, NULL, BO_READ_SPARES},
        {"dns-server", required_argument, NULL, BO_DNS_SERVER},
        {"duration", required_argument, NULL, BO_DURATION},
        {"timeline", required_argument, NULL, BO_TIMELINE},
        {NULL, 0, NULL, 0},
    };
    const char *prog = "bench";
    int opt, bad = 0;
    const char *name = NULL;
    optind = 1;
    while (!bad && (opt = getopt_long(argc, argv, "c:n:", longopts, NULL)) != -1) {
        uint32_t u32 = 0;
        uint64_t u64 = 0;
        name = optarg;
        switch (opt) {
        case 'c':
            bad = cli_u32(optarg, &cfg->connections) || !cfg->connections || cfg->connections > 4096;
            break;
        case 'n':
            bad = cli_u64(optarg, &cfg->requests) || !cfg->requests;
            break;
        case BO_WARMUP:
            bad = cli_u64(optarg, &cfg->warmup);
            break;
        case BO_MIX:
            bad = parse_mix(optarg, cfg);
            cfg->mix_set |= 1;
            break;
        case BO_SHARE:
            bad = cli_double(optarg, &cfg->share) || !(cfg->share >= 0 && cfg->share <= 1);
            cfg->mix_set |= 2;
            break;
        case BO_PROMPTS:
            bad = cli_u32(optarg, &cfg->prompts) || !cfg->prompts;
            cfg->mix_set |= 2;
            break;
        case BO_PROMPT_TOKENS:
            bad = cli_u64(optarg, &cfg->prompt_tokens) || !cfg->prompt_tokens || cfg->prompt_tokens > (1u << 24);
            cfg->mix_set |= 2;
            break;
        case BO_CHUNK_TOKENS:
            bad = cli_u32(optarg, &cfg->chunk_tokens);
            cfg->mix_set |= 2;
            break;
        case BO_LEASE_MS:
            bad = cli_u32(optarg, &cfg->lease_ms);
            cfg->mix_set |= 2;
            break;
        case BO_GET_HIT:
            cfg->get_hit = 1;
            cfg->mix_set |= 2;
            break;
        case BO_MODEL:
            cfg->model = optarg;
            break;
        case BO_PROFILE:
            cfg->profile = optarg;
            break;
        case BO_LAYERS:
            bad = cli_u32(optarg, &cfg->layers) || !cfg->layers;
            break;
        case BO_Q_HEADS:
            bad = cli_u32(optarg, &cfg->q_heads) || !cfg->q_heads;
            break;
        case BO_KV_HEADS:
            bad = cli_u32(optarg, &cfg->kv_heads) || !cfg->kv_heads;
            break;
        case BO_HEAD_DIM:
            bad = cli_u32(optarg, &cfg->head_dim) || !cfg->head_dim;
            break;
        case BO_TOKENS:
            bad = cli_u64(optarg, &cfg->tokens) || !cfg->tokens;
            break;
        case BO_DTYPE:
            bad = dq_dtype_parse(optarg, &cfg->dtype) != DQ_OK;
            break;
        case BO_GET_TOKENS:
            bad = cli_u64(optarg, &cfg->get_tokens);
            break;
        case BO_GET_DTYPE:
            cfg->get_raw = strcmp(optarg, "raw") == 0;
            bad = !cfg->get_raw && dq_dtype_parse(optarg, &cfg->get_dtype) != DQ_OK;
            break;
        case BO_BATCH:
            bad = cli_u32(optarg, &cfg->batch) || !cfg->batch;
            break;
        case BO_SEQS:
            bad = cli_u32(optarg, &u32) || !u32;
            cfg->seqs = u32;
            break;
        case BO_PREFILL:
            bad = cli_u64(optarg, &cfg->prefill);
            break;
        case BO_MAX_SEQ:
            bad = cli_u64(optarg, &cfg->max_seq_tokens) || !cfg->max_seq_tokens;
            break;
        case BO_PING_BYTES:
            bad = cli_size(optarg, &u64) || u64 > (1u << 30);
            cfg->ping_bytes = u64;
            break;
        case BO_NS:
            cfg->ns = optarg;
            break;
        case BO_PIN:
            cfg->pin = 1;
            break;
        case BO_SEED:
            bad = cli_u64(optarg, &cfg->seed);
            break;
        case BO_QUIET:
            cfg->quiet = 1;
            break;
        case BO_REPLICAS:
            bad = cli_u32(optarg, &cfg->copts.replicas) || !cfg->copts.replicas || cfg->copts.replicas > 64;
            break;
        case BO_WRITE_QUORUM:
            bad = cli_u32(optarg, &cfg->copts.write_quorum) || !cfg->copts.write_quorum;
            break;
        case BO_READ_SPARES:
            bad = cli_u32(optarg, &cfg->copts.read_spares) || cfg->copts.read_spares > 64;
            break;
        case BO_DNS_SERVER:
            cfg->copts.dns_server = optarg;
            break;
        case BO_DURATION:
            bad = cli_double(optarg, &cfg->duration) || !(cfg->duration > 0 && cfg->duration <= 86400);
            break;
        case BO_TIMELINE:
            bad = cli_u32(optarg, &cfg->timeline_ms) || !cfg->timeline_ms;
            break;
        case CLI_OPT_HELP:
            fputs(bench_help, stdout);
            return CLI_OK;
        case CLI_OPT_CONNECT: { /* repeated: the members of a cluster */
            size_t have = cfg->members ? strlen(cfg->members) : 0;
            char *m = realloc(cfg->members, have + strlen(optarg) + 2);
            if (!m)
                return cli_error(CLI_FAILED, prog, "out of memory");
            snprintf(m + have, strlen(optarg) + 2, "%s%s", have ? "," : "", optarg);
            cfg->members = m;
            cfg->cc.addr = m;
            break;
        }
        default: {
            int rc;
            if (!cli_conn_option(&cfg->cc, opt, optarg, &rc))
                return CLI_USAGE;
            if (rc)
                return CLI_USAGE;
        }
        }
    }
    if (bad)
        return cli_error(CLI_USAGE, prog, "bad value '%s' (see --help)", name ? name : "");
    if (optind < argc)
        return cli_error(CLI_USAGE, prog, "unexpected argument '%s'", argv[optind]);
    if (cfg->mix_set == 2)
        parse_mix("prefix=1", cfg);
    if (!cfg->seqs)
        cfg->seqs = cfg->batch;
    if (cfg->prefill % cfg->tokens)
        cfg->prefill += cfg->tokens - cfg->prefill % cfg->tokens;
    if (cfg->max_seq_tokens < cfg->prefill + cfg->tokens)
        return cli_error(CLI_USAGE, prog, "--max-seq-tokens must leave room for --prefill plus one PUT");
    if (cfg->copts.write_quorum > cfg->copts.replicas)
        return cli_error(CLI_USAGE, prog, "--write-quorum %u exceeds --replicas %u", cfg->copts.write_quorum,
                         cfg->copts.replicas);
    return -1;
}

/* The daemon counters of the PREFIX report, summed over the members that answer STATS. */
enum { PC_LOOKUPS, PC_HIT, PC_MISSED, PC_PUT, PC_DEDUPE, NPC };
static const char *const pc_names[NPC] = {"lookups", "lookup_hit_tokens", "lookup_missed_tokens", "chunks_put",
                                          "chunk_dedupe_hits"};

static int daemon_counters(dqc_cluster *cl, uint64_t out[NPC])
{
    memset(out, 0, NPC * sizeof *out);
    int answered = 0;
    for (size_t i = 0; i < dqc_cluster_size(cl); i++) {
        dqc_client *c = dqc_cluster_client(cl, i);
        dqc_stats_result st = {0};
        if (!c || dqc_stats(c, &st) != 0)
            continue;
        answered++;
        for (int k = 0; k < NPC; k++) {
            uint64_t v = 0;
            dqc_stats_counter(&st, pc_names[k], &v);
            out[k] += v;
        }
        dqc_stats_result_free(&st);
    }
    return answered ? 0 : DQ_CONNECTION;
}

/* The client's PREFIX figures and the daemon's counters over the measured run, as key=value. */
static void print_prefix(const bench_cfg *cfg, const worker *ws, const uint64_t st0[NPC], const uint64_t st1[NPC])
{
    prefix_counts t = {0};
    for (uint32_t i = 0; i < cfg->connections; i++) {
        t.lookups += ws[i].pc.lookups;
        t.keys += ws[i].pc.keys;
        t.hit_chunks += ws[i].pc.hit_chunks;
        t.hit_tokens += ws[i].pc.hit_tokens;
        t.missed_tokens += ws[i].pc.missed_tokens;
        t.stored += ws[i].pc.stored;
        t.deduped += ws[i].pc.deduped;
        t.gets += ws[i].pc.gets;
    }
    double rate = t.hit_tokens + t.missed_tokens ? (double)t.hit_tokens / (double)(t.hit_tokens + t.missed_tokens) : 0;
    printf("  prefix: share %.2f, %u base prompts, %llu tokens per prompt, %u tokens per chunk, lease %u ms\n",
           cfg->share, cfg->prompts, (unsigned long long)cfg->prompt_tokens, cfg->chunk, cfg->lease_ms);
    printf("prefix client: lookups=%llu keys=%llu hit_chunks=%llu hit_tokens=%llu missed_tokens=%llu "
           "hit_rate=%.4f chunks_stored=%llu deduped=%llu get_chunks=%llu\n",
           (unsigned long long)t.lookups, (unsigned long long)t.keys, (unsigned long long)t.hit_chunks,
           (unsigned long long)t.hit_tokens, (unsigned long long)t.missed_tokens, rate, (unsigned long long)t.stored,
           (unsigned long long)t.deduped, (unsigned long long)t.gets);
    uint64_t dh = st1[PC_HIT] - st0[PC_HIT], dm = st1[PC_MISSED] - st0[PC_MISSED];
    printf("prefix daemon: lookups=%llu lookup_hit_tokens=%llu lookup_missed_tokens=%llu hit_rate=%.4f "
           "chunks_put=%llu chunk_dedupe_hits=%llu\n",
           (unsigned long long)(st1[PC_LOOKUPS] - st0[PC_LOOKUPS]), (unsigned long long)dh, (unsigned long long)dm,
           dh + dm ? (double)dh / (double)(dh + dm) : 0.0, (unsigned long long)(st1[PC_PUT] - st0[PC_PUT]),
           (unsigned long long)(st1[PC_DEDUPE] - st0[PC_DEDUPE]));
}

int dq_cmd_bench(int argc, char **argv)
{
    bench_cfg cfg = {
        .connections = 2,
        .requests = 1000,
        .model = "dquant-bench",
        .profile = "dq226",
        .ns = "bench",
        .layers = 1,
        .q_heads = 32,
        .kv_heads = 8,
        .head_dim = 128,
        .tokens = 128,
        .get_tokens = 128,
        .get_dtype = DQ_DTYPE_BF16,
        .batch = 1,
        .prefill = 1024,
        .max_seq_tokens = 32768,
        .dtype = DQ_DTYPE_BF16,
        .seed = 1,
        .share = 0.5,
        .prompts = 16,
        .prompt_tokens = 1024,
    };
    cli_conn_init(&cfg.cc);
    dqc_cluster_options_default(&cfg.copts);
    parse_mix("put=30,get=40,attend=30", &cfg);
    int status = parse_args(argc, argv, &cfg);
    if (status >= 0) {
        free(cfg.members);
        cli_conn_free(&cfg.cc);
        return status;
    }
    status = CLI_FAILED;
    worker *ws = NULL;
    uint64_t *lat = NULL;
    uint64_t st0[NPC] = {0}, st1[NPC] = {0};

    /* The model, registered once (an identical earlier registration is fine). */
    dqc_cluster *c = NULL;
    if (bench_connect(&cfg, &c))
        goto out;
    dqc_model_spec spec = {.name = cfg.model,
                           .layers = cfg.layers,
                           .q_heads = cfg.q_heads,
                           .kv_heads = cfg.kv_heads,
                           .head_dim = cfg.head_dim,
                           .profile_name = cfg.profile};
    int rc = dqc_cluster_register_model(c, &spec, cfg.chunk_tokens, NULL, &cfg.chunk);
    if (rc) {
        fprintf(stderr, "dquant bench: register model: %s: %s\n", dqc_err_name(rc), dqc_cluster_last_error(c));
        goto out;
    }
    dqc_server_info info = {0};
    for (size_t i = 0; i < dqc_cluster_size(c) && !info.version; i++) {
        dqc_client *mc = dqc_cluster_client(c, i);
        if (mc)
            dqc_server(mc, &info);
    }
    if (info.max_batch_items && cfg.batch > info.max_batch_items) {
        cli_error(CLI_USAGE, "bench", "--batch %u exceeds the daemon's limit of %u", cfg.batch, info.max_batch_items);
        status = CLI_USAGE;
        goto out;
    }
    if (cfg.mix[OP_PREFIX]) {
        cfg.nkeys_max = cfg.chunk ? (uint32_t)(cfg.prompt_tokens / cfg.chunk) : 0;
        if (!cfg.nkeys_max) {
            cli_error(CLI_USAGE, "bench", "--prompt-tokens %llu is shorter than one chunk (%u tokens)",
                      (unsigned long long)cfg.prompt_tokens, cfg.chunk);
            status = CLI_USAGE;
            goto out;
        }
        /* The K/V every chunk is cut from: 4 chunks' worth of one layer, the same on every connection. */
        cfg.pool_elems = (size_t)4 * cfg.chunk * cfg.kv_heads * cfg.head_dim;
        cfg.pool = malloc(cfg.pool_elems * dq_dtype_size(cfg.dtype));
        if (!cfg.pool)
            goto out;
        uint64_t st = cfg.seed * 0x9E3779B97F4A7C15ull + 7;
        cli_fill_normal(cfg.pool, cfg.dtype, cfg.pool_elems, &st);
    }

    ws = calloc(cfg.connections, sizeof *ws);
    if (!ws)
        goto out;
    atomic_store(&done_requests, 0);
    atomic_store(&failed_requests, 0);
    atomic_store(&abort_run, 0);
    atomic_store(&lost_daemon, 0);
    pthread_barrier_init(&start_barrier, NULL, cfg.connections + 1);
    uint32_t started = 0;
    for (uint32_t i = 0; i < cfg.connections; i++) {
        ws[i].id = (int)i;
        ws[i].cfg = &cfg;
        if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0)
            break;
        started++;
    }
    if (started != cfg.connections) {
        /* Cannot happen short of thread exhaustion; the barrier would never open. */
        fprintf(stderr, "dquant bench: could only start %u of %u threads\n", started, cfg.connections);
        exit(CLI_FAILED);
    }
    pthread_barrier_wait(&start_barrier); /* set up */
    int setup_failed = 0;
    for (uint32_t i = 0; i < cfg.connections; i++)
        setup_failed |= ws[i].setup_rc != 0;
    atomic_store(&abort_run, setup_failed);
    pthread_barrier_wait(&start_barrier);
    if (!setup_failed) {
        pthread_barrier_wait(&start_barrier); /* warmed up */
        if (daemon_counters(c, st0))
            fprintf(stderr, "dquant bench: stats: no member answered\n");
        run_t0 = cli_now_ns();
        run_deadline = run_t0 + (uint64_t)(cfg.duration * 1e9);
        if (cfg.duration > 0) { /* a mark for whoever times events against the run (tests/tool) */
            fprintf(stderr, "[bench] measuring for %.1f s\n", cfg.duration);
            fflush(stderr);
        }
        pthread_barrier_wait(&start_barrier);
    }
    uint64_t t0 = run_t0 ? run_t0 : cli_now_ns();
    uint64_t total = cfg.duration > 0 ? UINT64_MAX : cfg.requests * cfg.connections;
    int tty = isatty(2);
    uint64_t last_print = t0;
    int printed = 0;
    while (!setup_failed) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        uint64_t done = atomic_load(&done_requests);
        uint64_t now = cli_now_ns();
        if (done >= total || (cfg.duration > 0 && now >= run_deadline) || atomic_load(&lost_daemon))
            break;
        uint64_t every = tty ? 1000000000ull : 10000000000ull;
        if (!cfg.quiet && now - last_print >= every) {
            double el = (double)(now - t0) / 1e9;
            fprintf(stderr, "%s[bench] %.1f s  %llu/%llu requests  %.0f req/s  %llu errors%s", tty ? "\r" : "", el,
                    (unsigned long long)done, (unsigned long long)(cfg.duration > 0 ? 0 : total), (double)done / el,
                    (unsigned long long)atomic_load(&failed_requests), tty ? "   " : "\n");
            last_print = now;
            printed = 1;
        }
    }
    for (uint32_t i = 0; i < cfg.connections; i++)
        pthread_join(ws[i].thread, NULL);
    double wall = cli_seconds_since(t0);
    if (!setup_failed && daemon_counters(c, st1))
        fprintf(stderr, "dquant bench: stats: no member answered\n");
    if (printed && tty)
        fputc('\n', stderr);
    pthread_barrier_destroy(&start_barrier);
    if (setup_failed) {
        fprintf(stderr, "dquant bench: setup failed\n");
        goto out;
    }
    if (atomic_load(&lost_daemon)) {
        fprintf(stderr, "dquant bench: stopped after %llu of %llu requests: the daemon at %s is gone (%s)\n",
                (unsigned long long)atomic_load(&done_requests), (unsigned long long)total, cfg.cc.addr, lost_why);
        goto out;
    }

    /* Report. */
    uint64_t nrec = 0;
    for (uint32_t i = 0; i < cfg.connections; i++)
        nrec += ws[i].nrec;
    lat = malloc((nrec ? nrec : 1) * sizeof *lat);
    if (!lat)
        goto out;
    if (cfg.duration > 0)
        printf("dquant bench: %u connections for %.1f s to %s (%.3f s)\n", cfg.connections, cfg.duration, cfg.cc.addr,
               wall);
    else
        printf("dquant bench: %u connections x %llu requests to %s (%.3f s)\n", cfg.connections,
               (unsigned long long)cfg.requests, cfg.cc.addr, wall);
    printf("  shape: %u layers, %u q heads, %u kv heads x %u, %llu tokens per put, %s data; get %llu tokens as %s; "
           "attend batch %u\n",
           cfg.layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim, (unsigned long long)cfg.tokens,
           dq_dtype_name(cfg.dtype), (unsigned long long)cfg.get_tokens,
           cfg.get_raw ? "raw" : dq_dtype_name(cfg.get_dtype), cfg.batch);
    printf("%-8s %9s %7s %7s %11s %10s %10s %10s %10s %10s\n", "op", "requests", "errors", "misses", "req/s", "MB/s",
           "p50 us", "p99 us", "p999 us", "max us");
    uint64_t all_err = 0;
    for (int op = -1; op < NOPS; op++) {
        size_t n = 0;
        uint64_t bytes = 0, errs = 0, miss = 0;
        for (uint32_t i = 0; i < cfg.connections; i++) {
            for (uint64_t r = 0; r < ws[i].nrec; r++)
                if ((op < 0 || ws[i].op[r] == op) && ws[i].outcome[r] != OUT_ERROR)
                    lat[n++] = ws[i].lat[r];
            for (int o = 0; o < NOPS; o++) {
                if (op >= 0 && o != op)
                    continue;
                bytes += ws[i].bytes[o];
                miss += ws[i].misses[o];
                for (int e = 0; e < NERR; e++)
                    errs += ws[i].errs[o][e];
            }
        }
        if (op >= 0 && !cfg.mix[op])
            continue;
        if (op < 0)
            all_err = errs;
        qsort(lat, n, sizeof *lat, cmp_u64);
        printf("%-8s %9llu %7llu %7llu %11.1f %10.2f %10.1f %10.1f %10.1f %10.1f\n", op < 0 ? "total" : op_names[op],
               (unsigned long long)(n + errs), (unsigned long long)errs, (unsigned long long)miss, (double)n / wall,
               (double)bytes / wall / 1e6, pct(lat, n, 50) / 1e3, pct(lat, n, 99) / 1e3, pct(lat, n, 99.9) / 1e3,
               n ? (double)lat[n - 1] / 1e3 : 0.0);
    }
    if (cfg.timeline_ms)
        print_timeline(&cfg, ws, wall, lat);
    dqc_cluster_stats cs = {0};
    for (uint32_t i = 0; i < cfg.connections; i++) {
        dqc_cluster_stats one;
        if (dqc_cluster_get_stats(ws[i].cl, &one) == 0) {
            cs.failovers += one.failovers;
            cs.marked_down += one.marked_down;
            cs.degraded_writes += one.degraded_writes;
            cs.repairs += one.repairs;
            cs.repaired_chunks += one.repaired_chunks;
            cs.dns_refreshes += one.dns_refreshes;
            cs.member_changes += one.member_changes;
        }
    }
    printf("cluster: members=%zu replicas=%u write_quorum=%u failovers=%llu marked_down=%llu degraded_writes=%llu "
           "repairs=%llu repaired_chunks=%llu dns_refreshes=%llu\n",
           dqc_cluster_size(c), cfg.copts.replicas,
           cfg.copts.write_quorum ? cfg.copts.write_quorum : cfg.copts.replicas, (unsigned long long)cs.failovers,
           (unsigned long long)cs.marked_down, (unsigned long long)cs.degraded_writes, (unsigned long long)cs.repairs,
           (unsigned long long)cs.repaired_chunks, (unsigned long long)cs.dns_refreshes);
    if (all_err) {
        printf("errors:\n");
        for (int e = 0; e < NERR; e++) {
            uint64_t cnt = 0;
            const char *first = NULL;
            for (uint32_t i = 0; i < cfg.connections; i++) {
                for (int o = 0; o < NOPS; o++)
                    cnt += ws[i].errs[o][e];
                if (!first && ws[i].first_err[e][0])
                    first = ws[i].first_err[e];
            }
            if (cnt)
                printf("  %-20s %8llu  (first: %s)\n", dqc_err_name(-e), (unsigned long long)cnt, first ? first : "");
        }
    }
    if (cfg.mix[OP_PREFIX])
        print_prefix(&cfg, ws, st0, st1);
    status = all_err ? CLI_FAILED : CLI_OK;
out:
    dqc_cluster_free(c);
    free(cfg.pool);
    if (ws) {
        for (uint32_t i = 0; i < cfg.connections; i++)
            worker_cleanup(&ws[i]);
        free(ws);
    }
    free(lat);
    free(cfg.members);
    cli_conn_free(&cfg.cc);
    return status;
}
