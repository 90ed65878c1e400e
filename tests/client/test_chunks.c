/* The shared KV tier end to end: libdquant-client against a real dquantd ($DQUANTD). Chunks keyed by
 * prefix (dqc_chunk_keys), PUT_CHUNKS with dedupe, LOOKUP of the leading chunks held, chunks shared
 * by clients in different processes, GET of chunks against a plain sequence holding the same
 * tokens, and the bad inputs that must store nothing. Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "wire.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define CT 128 /* chunk_tokens: one window of dq226 */
#define ROW (KVH * HD)
#define MODEL "m"
#define NS "tenant"

static dqd_daemon D;

/* A clean exit: under ASan a leak or error in the daemon fails the test. */
static void stop_daemon(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

/* $DQ_CHUNKS_BACKEND (e.g. cuda, for dquantd-fakecuda) is passed as --backend. */
static void start_daemon(const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    static const char *args[16];
    size_t n = 0;
    const char *backend = getenv("DQ_CHUNKS_BACKEND");
    if (backend) {
        args[n++] = "--backend";
        args[n++] = backend;
    }
    for (size_t i = 0; extra && extra[i] && n < 15; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    const dqd_opts o = {.extra = args};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
}

TestSuite(chunks, .fini = stop_daemon, .timeout = 240);

static dqc_client *cli(void)
{
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(D.addr, NULL, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect: %s", err);
    return c;
}

static void register_model(dqc_client *c, uint32_t chunk_tokens)
{
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    uint32_t got = 0;
    OK(c, dqc_register_model_ex(c, &spec, chunk_tokens, NULL, &got));
    cr_assert_eq(got, chunk_tokens ? chunk_tokens : 256u);
}

/* K/V of a prompt as the model would produce them: a function of the token id and its position, so
 * that two prompts with a common prefix have the same K/V over that prefix. [L, ntok, KVH, HD]. */
static float *kv_of(const uint32_t *tok, size_t ntok, int is_v)
{
    float *x = malloc(L * ntok * ROW * sizeof *x);
    for (size_t l = 0; l < L; l++)
        for (size_t t = 0; t < ntok; t++)
            for (size_t j = 0; j < ROW; j++) {
                uint32_t h = tok[t] * 2654435761u ^ (uint32_t)(t * 40503u + j * 977u + l * 7919u + (size_t)is_v * 31u);
                h ^= h >> 15;
                h *= 2246822519u;
                h ^= h >> 13;
                x[(l * ntok + t) * ROW + j] = (float)(h % 20001) / 10000.0f - 1.0f + (is_v ? 0.0f : 0.25f);
            }
    return x;
}

static uint32_t *prompt(size_t n, uint32_t seed)
{
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = (uint32_t)(i * 31 + seed) % 50000;
    return t;
}

/* PUT_CHUNKS of the chunks [first, first + n) of a prompt (keys from dqc_chunk_keys). */
static int put_chunks(dqc_client *c, const uint32_t *tok, const uint8_t *keys, size_t first, size_t n,
                      dqc_put_chunks_result *res)
{
    float *k = kv_of(tok, (first + n) * CT, 0), *v = kv_of(tok, (first + n) * CT, 1);
    /* the rows of chunks first.. of every layer */
    float *ks = malloc(L * n * CT * ROW * sizeof *ks), *vs = malloc(L * n * CT * ROW * sizeof *vs);
    for (size_t l = 0; l < L; l++) {
        memcpy(ks + l * n * CT * ROW, k + ((l * (first + n) + first) * CT) * ROW, n * CT * ROW * sizeof *ks);
        memcpy(vs + l * n * CT * ROW, v + ((l * (first + n) + first) * CT) * ROW, n * CT * ROW * sizeof *vs);
    }
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys + first * DQC_CHUNK_KEY_BYTES,
                             .nkeys = n,
                             .parent = first ? keys + (first - 1) * DQC_CHUNK_KEY_BYTES : NULL,
                             .layers = L,
                             .chunk_tokens = CT,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = ks,
                             .v = vs};
    int rc = dqc_put_chunks(c, &a, res);
    free(k);
    free(v);
    free(ks);
    free(vs);
    return rc;
}

/* A daemon (default flags) with the model registered; a prompt of ntok tokens (*tok) and the keys of
 * its nkeys full chunks. */
static dqc_client *with_prompt(size_t ntok, uint32_t seed, uint32_t **tok, uint8_t *keys, size_t nkeys)
{
    start_daemon(NULL);
    dqc_client *c = cli();
    register_model(c, CT);
    *tok = prompt(ntok, seed);
    cr_assert_eq(dqc_chunk_keys(NS, *tok, ntok, CT, NULL, keys, nkeys), nkeys);
    return c;
}

Test(chunks, common_prefix_hits_exactly_the_common_full_chunks)
{
    start_daemon(NULL);
    dqc_client *c = cli();
    register_model(c, CT);
    /* A: 4 full chunks + 40 tokens; B: the same first 300 tokens, then different ones. */
    const size_t na = 4 * CT + 40, nb = 5 * CT;
    uint32_t *a = prompt(na, 1), *b = prompt(nb, 1);
    for (size_t i = 300; i < nb; i++)
        b[i] = 60000 + (uint32_t)i;
    uint8_t ka[8 * 16], kb[8 * 16];
    cr_assert_eq(dqc_chunk_keys(NS, a, na, CT, NULL, ka, 8), 4u);
    cr_assert_eq(dqc_chunk_keys(NS, b, nb, CT, NULL, kb, 8), 5u);
    cr_assert(memcmp(ka, kb, 2 * 16) == 0, "the two common full chunks have the same keys");
    cr_assert(memcmp(ka + 2 * 16, kb + 2 * 16, 16) != 0, "chunk 2 differs from token 300 on");
    /* another namespace gives other keys */
    uint8_t kx[16];
    cr_assert_eq(dqc_chunk_keys("other", a, CT, CT, NULL, kx, 1), 1u);
    cr_assert(memcmp(kx, ka, 16) != 0);

    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, NS, MODEL, kb, 5, 0, &lr));
    cr_assert_eq(lr.hits, 0u);
    dqc_put_chunks_result pr;
    OK(c, put_chunks(c, a, ka, 0, 4, &pr));
    cr_assert_eq(pr.stored, 4u);
    cr_assert_eq(pr.deduped, 0u);

    OK(c, dqc_lookup(c, NS, MODEL, kb, 5, 0, &lr));
    cr_assert_eq(lr.hits, 2u, "B shares exactly 2 full chunks with A (got %llu)", (unsigned long long)lr.hits);
    cr_assert_eq(lr.hit_tokens, 2u * CT);
    cr_assert_eq(lr.chunk_tokens, CT);
    OK(c, dqc_lookup(c, NS, MODEL, ka, 4, 0, &lr));
    cr_assert_eq(lr.hits, 4u);
    /* the count stops at the first miss */
    uint8_t gap[3 * 16];
    memcpy(gap, ka, 16);
    memcpy(gap + 16, kb + 2 * 16, 16);
    memcpy(gap + 32, ka + 32, 16);
    OK(c, dqc_lookup(c, NS, MODEL, gap, 3, 0, &lr));
    cr_assert_eq(lr.hits, 1u);
    /* the keys in another namespace: tenants are isolated */
    OK(c, dqc_lookup(c, "other", MODEL, ka, 4, 0, &lr));
    cr_assert_eq(lr.hits, 0u);

    /* B's own tail after the common prefix: PUT_CHUNKS of chunks 2..4 with chunk 1 as parent */
    OK(c, put_chunks(c, b, kb, 2, 3, &pr));
    cr_assert_eq(pr.stored, 3u);
    OK(c, dqc_lookup(c, NS, MODEL, kb, 5, 0, &lr));
    cr_assert_eq(lr.hits, 5u);

    cr_assert_eq(stat_counter(c, "lookups"), 6u);
    cr_assert_eq(stat_counter(c, "lookup_hit_tokens"), (0 + 2 + 4 + 1 + 0 + 5) * (uint64_t)CT);
    cr_assert_eq(stat_counter(c, "lookup_missed_tokens"), (5 + 3 + 0 + 2 + 4 + 0) * (uint64_t)CT);
    cr_assert_eq(stat_counter(c, "chunks_put"), 7u);
    cr_assert_eq(stat_gauge(c, "chunks_stored"), 7.0);
    cr_assert_float_eq(stat_gauge(c, "lookup_hit_rate"), 12.0 / 26.0, 1e-12);
    free(a);
    free(b);
    dqc_free(c);
}

Test(chunks, two_processes_share_chunks)
{
    uint32_t *tok;
    uint8_t keys[3 * 16];
    dqc_client *c = with_prompt(3 * CT, 7, &tok, keys, 3);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* another engine: its own connection in its own process */
        dqc_client *o = NULL;
        if (dqc_connect(D.addr, NULL, &o) != 0)
            _exit(10);
        dqc_put_chunks_result r;
        int rc = put_chunks(o, tok, keys, 0, 3, &r);
        dqc_free(o);
        _exit(rc == 0 && r.stored == 3 ? 0 : 11);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: %d", st);

    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, NS, MODEL, keys, 3, 0, &lr));
    cr_assert_eq(lr.hits, 3u);
    /* this process's PUT of the same prefix encodes nothing */
    dqc_put_chunks_result pr;
    OK(c, put_chunks(c, tok, keys, 0, 3, &pr));
    cr_assert_eq(pr.stored, 0u);
    cr_assert_eq(pr.deduped, 3u);
    cr_assert_eq(pr.streams_encoded, 0u);
    cr_assert_eq(stat_counter(c, "chunk_dedupe_hits"), 3u);
    /* and reads the other process's chunk */
    dqc_get_result g = {0};
    OK(c, dqc_get_chunk(c, NS, keys + 16, DQ_DTYPE_F32, &g));
    cr_assert_eq(g.tokens, CT);
    cr_assert_eq(g.num_layers, L);
    dqc_get_result_free(&g);
    free(tok);
    dqc_free(c);
}

typedef struct racer {
    const uint32_t *tok;
    const uint8_t *keys;
    pthread_barrier_t *bar;
    dqc_put_chunks_result res;
    int rc;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    dqc_client *c = NULL;
    r->rc = dqc_connect(D.addr, NULL, &c);
    pthread_barrier_wait(r->bar);
    if (r->rc == 0)
        r->rc = put_chunks(c, r->tok, r->keys, 0, 3, &r->res);
    dqc_free(c);
    return NULL;
}

Test(chunks, concurrent_puts_store_a_chunk_once)
{
    uint32_t *tok;
    uint8_t keys[3 * 16];
    dqc_client *c = with_prompt(3 * CT, 3, &tok, keys, 3);
    enum { N = 4 };
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, N);
    racer r[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        r[i] = (racer){.tok = tok, .keys = keys, .bar = &bar};
        pthread_create(&th[i], NULL, race, &r[i]);
    }
    uint64_t stored = 0, deduped = 0, streams = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(r[i].rc, 0, "racer %d: %s", i, dqc_err_name(r[i].rc));
        stored += r[i].res.stored;
        deduped += r[i].res.deduped;
        streams += r[i].res.streams_encoded;
    }
    pthread_barrier_destroy(&bar);
    cr_assert_eq(stored, 3u, "each chunk encoded once (stored %llu)", (unsigned long long)stored);
    cr_assert_eq(deduped, 3u * (N - 1));
    cr_assert_eq(stat_counter(c, "chunks_put"), 3u);
    cr_assert_eq(stat_counter(c, "chunk_dedupe_hits"), 3u * (N - 1));
    cr_assert_eq(stat_gauge(c, "chunks_stored"), 3.0);
    /* one encode per chunk: 2 streams (K, V) per token per layer */
    cr_assert_eq(streams, 3u * CT * L * 2);
    cr_assert_eq(stat_counter(c, "streams_encoded"), streams);
    free(tok);
    dqc_free(c);
}

Test(chunks, get_of_chunks_equals_the_same_tokens_as_a_sequence)
{
    uint32_t *tok;
    uint8_t keys[2 * 16];
    dqc_client *c = with_prompt(2 * CT, 11, &tok, keys, 2);
    OK(c, put_chunks(c, tok, keys, 0, 2, NULL));
    float *k = kv_of(tok, 2 * CT, 0), *v = kv_of(tok, 2 * CT, 1);
    dqc_put_args pa = {.seq = {NS, "plain", 5},
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = 2 * CT,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    OK(c, dqc_put(c, &pa, NULL));
    /* a sequence key equal to a chunk key does not alias it */
    dqc_seq alias = {NS, keys, 16};
    FAILS(c, DQ_NOT_FOUND, dqc_delete(c, &alias));

    dqc_raw_result seq = {0}, ch = {0};
    OK(c, dqc_get_raw(c, &pa.seq, 0, 0, &seq));
    cr_assert_eq(seq.nlayers, L);
    for (size_t i = 0; i < 2; i++) {
        OK(c, dqc_get_chunk_raw(c, NS, keys + i * 16, &ch));
        cr_assert_eq(ch.nlayers, L);
        cr_assert_eq(ch.profile_len, seq.profile_len);
        for (size_t l = 0; l < L; l++) {
            const dqc_raw_layer *a = &seq.layers[l], *b = &ch.layers[l];
            cr_assert_eq(b->tokens, CT);
            cr_assert_eq(b->tail_tokens, 0u, "a chunk is whole windows");
            cr_assert_eq(b->records_bytes * 2, a->records_bytes);
            cr_assert(memcmp(a->records + i * b->records_bytes, b->records, b->records_bytes) == 0,
                      "chunk %zu layer %zu: the containers equal the sequence's", i, l);
        }
    }
    /* both chunks in one GET_RAW: per layer their windows one after the other, the sequence's bytes */
    dqc_raw_result both = {0};
    OK(c, dqc_get_chunks_raw(c, NS, keys, 2, &both));
    cr_assert_eq(both.nlayers, L);
    cr_assert_eq(both.profile_len, seq.profile_len);
    cr_assert(memcmp(both.profile, seq.profile, seq.profile_len) == 0);
    for (size_t l = 0; l < L; l++) {
        const dqc_raw_layer *a = &seq.layers[l], *b = &both.layers[l];
        cr_assert_eq(b->tokens, 2 * CT);
        cr_assert_eq(b->windows, a->windows);
        cr_assert_eq(b->tail_tokens, 0u);
        cr_assert_eq(b->records_bytes, a->records_bytes);
        cr_assert(memcmp(a->records, b->records, a->records_bytes) == 0, "layer %zu: the chunks' records", l);
    }
    FAILS(c, DQ_NOT_FOUND, dqc_get_chunks_raw(c, NS, (const uint8_t[32]){0}, 2, &both));
    dqc_raw_result_free(&both);
    dqc_get_result gs = {0}, gc = {0};
    dqc_get_args ga = {.seq = pa.seq, .start_token = CT, .tokens = CT, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &gs));
    OK(c, dqc_get_chunk(c, NS, keys + 16, DQ_DTYPE_F32, &gc));
    cr_assert_eq(gc.bytes, gs.bytes);
    cr_assert(memcmp(gc.k, gs.k, gs.bytes) == 0 && memcmp(gc.v, gs.v, gs.bytes) == 0);
    /* both chunks in one GET: the sequence's tokens 0..2*CT, bit for bit */
    ga.start_token = 0;
    ga.tokens = 2 * CT;
    OK(c, dqc_get(c, &ga, &gs));
    OK(c, dqc_get_chunks(c, NS, keys, 2, DQ_DTYPE_F32, &gc));
    cr_assert_eq(gc.tokens, 2u * CT);
    cr_assert_eq(gc.num_layers, L);
    cr_assert_eq(gc.bytes, gs.bytes);
    cr_assert(memcmp(gc.k, gs.k, gs.bytes) == 0 && memcmp(gc.v, gs.v, gs.bytes) == 0);
    uint8_t bad[2 * 16];
    memcpy(bad, keys, 16);
    memset(bad + 16, 7, 16);
    FAILS(c, DQ_NOT_FOUND, dqc_get_chunks(c, NS, bad, 2, DQ_DTYPE_F32, &gc));
    dqc_get_result_free(&gs);
    dqc_get_result_free(&gc);
    dqc_raw_result_free(&seq);
    dqc_raw_result_free(&ch);
    free(k);
    free(v);
    free(tok);
    dqc_free(c);
}

/* A raw PUT_CHUNKS / LOOKUP through the wire, for what the client refuses to send. */
static int raw_call(Dquant__Request *req, const wire_payload *pl)
{
    int fd = wire_connect_unix(D.sock);
    cr_assert_geq(fd, 0);
    cr_assert_eq(wire_hello(fd, 1, NULL), 0);
    Dquant__Response *resp = NULL;
    cr_assert_eq(wire_call(fd, req, pl, &resp, NULL, NULL), 0);
    int rc = wire_error(resp);
    dquant__response__free_unpacked(resp, NULL);
    close(fd);
    return rc;
}

Test(chunks, bad_input_gets_its_error_and_stores_nothing)
{
    const char *const extra[] = {"--max-lookup-keys", "8", "--max-lease-ms", "5000", "--max-leases", "2", NULL};
    start_daemon(extra);
    dqc_client *c = cli();
    dqc_model_spec spec = {
        .name = "bad", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_register_model_ex(c, &spec, 100, NULL, NULL)); /* not a multiple of W */
    register_model(c, CT);
    uint32_t *tok = prompt(9 * CT, 5);
    uint8_t keys[9 * 16];
    cr_assert_eq(dqc_chunk_keys(NS, tok, 9 * CT, CT, NULL, keys, 9), 9u);

    /* token count not nkeys x chunk_tokens */
    float *k = kv_of(tok, 2 * CT, 0), *v = kv_of(tok, 2 * CT, 1);
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys,
                             .nkeys = 1,
                             .layers = L,
                             .chunk_tokens = 2 * CT,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = k,
                             .v = v};
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_put_chunks(c, &a, NULL));
    /* a missing parent */
    a.chunk_tokens = CT;
    a.parent = keys + 5 * 16;
    FAILS(c, DQ_NOT_FOUND, dqc_put_chunks(c, &a, NULL));
    cr_assert(strstr(dqc_last_error(c), "parent chunk not held"), "%s", dqc_last_error(c));
    /* an unknown model */
    a.parent = NULL;
    a.model = "nope";
    FAILS(c, DQ_NOT_FOUND, dqc_put_chunks(c, &a, NULL));
    /* more keys than max_lookup_keys, a lease */
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_lookup(c, NS, MODEL, keys, 9, 0, NULL));
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_lookup(c, NS, MODEL, keys, 1, 5001, NULL)); /* over max_lease_ms */
    /* NaN in the second chunk: the first one stays, nothing of the second */
    a.model = MODEL;
    a.nkeys = 2;
    a.chunk_tokens = CT;
    k[(size_t)CT * ROW + 5] = 0.0f / 0.0f; /* layer 0, token CT: the second chunk */
    dqc_put_chunks_result pr;
    FAILS(c, DQ_NONFINITE, dqc_put_chunks(c, &a, &pr));
    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, NS, MODEL, keys, 2, 0, &lr));
    cr_assert_eq(lr.hits, 1u);
    cr_assert_eq(stat_gauge(c, "chunks_stored"), 1.0);
    /* no hits: no lease */
    OK(c, dqc_lookup(c, NS, MODEL, keys + 5 * 16, 1, 5000, &lr));
    cr_assert_eq(lr.lease_id, 0u);
    /* at most max_leases live leases per connection */
    OK(c, dqc_lookup(c, NS, MODEL, keys, 2, 5000, &lr));
    cr_assert_neq(lr.lease_id, 0u);
    OK(c, dqc_lookup(c, NS, MODEL, keys, 2, 5000, &lr));
    FAILS(c, DQ_RESOURCE_EXHAUSTED, dqc_lookup(c, NS, MODEL, keys, 2, 5000, NULL));
    OK(c, dqc_release_lease(c, lr.lease_id));
    FAILS(c, DQ_NOT_FOUND, dqc_release_lease(c, lr.lease_id));
    OK(c, dqc_lookup(c, NS, MODEL, keys, 2, 5000, NULL));

    /* keys of the wrong length, on the wire */
    uint8_t short_key[15] = {0};
    ProtobufCBinaryData bk[2] = {{16, keys}, {15, short_key}};
    Dquant__Lookup l = DQUANT__LOOKUP__INIT;
    l.ns = (char *)NS;
    l.model = (char *)MODEL;
    l.n_keys = 2;
    l.keys = bk;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_LOOKUP;
    req.lookup = &l;
    cr_assert_eq(raw_call(&req, NULL), DQ_INVALID_ARGUMENT);
    wire_payload pl = {0};
    uint64_t shape[4] = {L, 2 * CT, KVH, HD};
    Dquant__Tensor tk, tv;
    wire_tensor(&pl, &tk, DQUANT__DTYPE__F32, shape, 4, k, (size_t)L * 2 * CT * ROW * 4);
    wire_tensor(&pl, &tv, DQUANT__DTYPE__F32, shape, 4, v, (size_t)L * 2 * CT * ROW * 4);
    Dquant__PutChunks pc = DQUANT__PUT_CHUNKS__INIT;
    pc.ns = (char *)NS;
    pc.model = (char *)MODEL;
    pc.n_keys = 2;
    pc.keys = bk;
    pc.k = &tk;
    pc.v = &tv;
    req.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS;
    req.put_chunks = &pc;
    cr_assert_eq(raw_call(&req, &pl), DQ_INVALID_ARGUMENT);
    /* a parent of the wrong length */
    bk[1].len = 16;
    bk[1].data = keys + 16;
    pc.parent.len = 3;
    pc.parent.data = short_key;
    cr_assert_eq(raw_call(&req, &pl), DQ_INVALID_ARGUMENT);
    /* a chunk SeqRef with a key that is not 16 bytes */
    Dquant__SeqRef ref = DQUANT__SEQ_REF__INIT;
    ref.ns = (char *)NS;
    ref.key.data = short_key;
    ref.key.len = 15;
    ref.kind = DQUANT__SEQ_KIND__CHUNK;
    Dquant__Delete del = DQUANT__DELETE__INIT;
    del.seq = &ref;
    req.body_case = DQUANT__REQUEST__BODY_DELETE;
    req.delete_ = &del;
    cr_assert_eq(raw_call(&req, NULL), DQ_INVALID_ARGUMENT);
    wire_payload_free(&pl);

    cr_assert_eq(stat_gauge(c, "chunks_stored"), 1.0, "nothing stored by the bad requests");
    cr_assert_eq(stat_counter(c, "chunks_put"), 1u);
    free(k);
    free(v);
    free(tok);
    dqc_free(c);
}

static int hits_of(dqc_client *c, const uint8_t *key)
{
    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, NS, MODEL, key, 1, 0, &lr));
    return (int)lr.hits;
}

/* PUTs of fresh plain sequences until fewer than `chunks` chunks are stored (watched through STATS,
 * which touches nothing); the number of PUTs. */
static int fill_until(dqc_client *c, int *next, double chunks)
{
    enum { T = 512 };
    static float *k, *v;
    if (!k) {
        uint32_t *tok = prompt(T, 99);
        k = kv_of(tok, T, 0);
        v = kv_of(tok, T, 1);
        free(tok);
    }
    int n = 0;
    while (stat_gauge(c, "chunks_stored") >= chunks) {
        cr_assert_lt(n, 400, "no chunk evicted after %d PUTs", n);
        char key[32];
        snprintf(key, sizeof key, "fill-%d", (*next)++);
        dqc_put_args pa = {.seq = {NS, key, strlen(key)},
                           .model = MODEL,
                           .num_layers = L,
                           .tokens = T,
                           .kv_heads = KVH,
                           .head_dim = HD,
                           .dtype = DQ_DTYPE_F32,
                           .k = k,
                           .v = v};
        OK(c, dqc_put(c, &pa, NULL));
        n++;
    }
    return n;
}

/* A daemon with a 3 MiB host budget (cpu backend) holding two single chunks: A (tokens *ta, key ka),
 * then B (key kb). */
static dqc_client *two_chunks_under_pressure(uint32_t seed, uint32_t **ta, uint8_t ka[16], uint8_t kb[16])
{
    if (getenv("DQ_CHUNKS_BACKEND"))
        cr_skip_test("host-memory pressure: the cpu backend's test (on the cuda backend the GPU tier holds them)");
    const char *const extra[] = {"--host-memory", "3M", "--workers", "1", NULL};
    start_daemon(extra);
    dqc_client *c = cli();
    register_model(c, CT);
    uint32_t *tb = prompt(CT, seed + 1);
    *ta = prompt(CT, seed);
    dqc_chunk_keys(NS, *ta, CT, CT, NULL, ka, 1);
    dqc_chunk_keys(NS, tb, CT, CT, NULL, kb, 1);
    OK(c, put_chunks(c, *ta, ka, 0, 1, NULL));
    OK(c, put_chunks(c, tb, kb, 0, 1, NULL));
    free(tb);
    return c;
}

Test(chunks, a_lease_survives_eviction_pressure_and_expires)
{
    uint32_t *ta;
    uint8_t ka[16], kb[16];
    dqc_client *c = two_chunks_under_pressure(21, &ta, ka, kb);
    /* long enough to outlast the fill below on a loaded 2-core machine under ASan (1.5 s did not:
     * the lease ran out mid-fill and the leased chunk went too) */
    const uint32_t lease_ms = 5000;
    dqc_lookup_result lr;
    OK(c, dqc_lookup(c, NS, MODEL, ka, 1, lease_ms, &lr));
    cr_assert_eq(lr.hits, 1u);
    cr_assert_neq(lr.lease_id, 0u);
    cr_assert_eq(lr.lease_ms, lease_ms);
    cr_assert_eq(stat_gauge(c, "leases_active"), 1.0);
    /* B becomes the most recently used: without the lease, A would go first */
    cr_assert_eq(hits_of(c, kb), 1);

    int next = 0;
    int n = fill_until(c, &next, 2.0);
    cr_assert_eq(stat_gauge(c, "chunks_stored"), 1.0);
    cr_assert_gt(stat_counter(c, "evictions"), 0u);
    cr_assert_eq(hits_of(c, ka), 1, "the leased chunk stayed while %d PUTs evicted the unleased one", n);
    cr_log_info("unleased chunk evicted after %d PUTs; leased one kept", n);

    /* the lease runs out: A is evictable again */
    usleep((lease_ms + 100) * 1000);
    cr_assert_eq(stat_gauge(c, "leases_active"), 0.0);
    cr_assert_eq(stat_counter(c, "lease_expiries"), 1u);
    fill_until(c, &next, 1.0);
    cr_assert_eq(hits_of(c, ka), 0);

    /* leases die with their connection */
    OK(c, put_chunks(c, ta, ka, 0, 1, NULL));
    dqc_client *o = cli();
    OK(o, dqc_lookup(o, NS, MODEL, ka, 1, 60000, &lr));
    cr_assert_neq(lr.lease_id, 0u);
    FAILS(c, DQ_NOT_FOUND, dqc_release_lease(c, lr.lease_id)); /* someone else's */
    cr_assert_eq(stat_gauge(c, "leases_active"), 1.0);
    dqc_free(o);
    for (int i = 0; i < 100 && stat_gauge(c, "leases_active") != 0.0; i++)
        usleep(10000);
    cr_assert_eq(stat_gauge(c, "leases_active"), 0.0);
    cr_assert_eq(stat_counter(c, "lease_expiries"), 1u, "a connection's end is not an expiry");
    free(ta);
    dqc_free(c);
}

Test(chunks, delete_pin_unpin_of_chunks)
{
    uint32_t *ta;
    uint8_t ka[16], kb[16];
    dqc_client *c = two_chunks_under_pressure(31, &ta, ka, kb);
    /* a sequence of the same key is another entry */
    dqc_seq same = {NS, ka, 16};
    FAILS(c, DQ_NOT_FOUND, dqc_pin(c, &same));
    OK(c, dqc_pin_chunk(c, NS, ka));
    cr_assert_eq(stat_gauge(c, "sequences_pinned"), 1.0);
    /* B is the most recently used; pressure evicts B, never the pinned A */
    cr_assert_eq(hits_of(c, kb), 1);
    int next = 0;
    fill_until(c, &next, 2.0);
    cr_assert_eq(hits_of(c, ka), 1);
    FAILS(c, DQ_NOT_FOUND, dqc_get_chunk_raw(c, NS, kb, &(dqc_raw_result){0}));
    OK(c, dqc_unpin_chunk(c, NS, ka));
    cr_assert_eq(stat_gauge(c, "sequences_pinned"), 0.0);
    OK(c, dqc_delete_chunk(c, NS, ka));
    cr_assert_eq(hits_of(c, ka), 0);
    cr_assert_eq(stat_gauge(c, "chunks_stored"), 0.0);
    FAILS(c, DQ_NOT_FOUND, dqc_delete_chunk(c, NS, ka));
    FAILS(c, DQ_NOT_FOUND, dqc_unpin_chunk(c, NS, kb));
    /* deleted, it is stored again by the next PUT_CHUNKS (not deduped) */
    dqc_put_chunks_result pr;
    OK(c, put_chunks(c, ta, ka, 0, 1, &pr));
    cr_assert_eq(pr.stored, 1u);
    free(ta);
    dqc_free(c);
}

Test(chunks, attend_over_prefix_chunks_and_private_tail_equals_one_sequence)
{
    enum { TAIL = 100, N = 2 * CT + TAIL };
    uint32_t *tok;
    uint8_t keys[2 * 16];
    dqc_client *c = with_prompt(N, 41, &tok, keys, 2);
    OK(c, put_chunks(c, tok, keys, 0, 2, NULL));
    float *k = kv_of(tok, N, 0), *v = kv_of(tok, N, 1);
    /* the plain sequence holds all N tokens */
    dqc_put_args pa = {.seq = {NS, "plain", 5},
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = N,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    OK(c, dqc_put(c, &pa, NULL));
    /* the prefixed one: the chunks, then its own TAIL tokens (rows 2*CT.. of every layer) */
    float *kt = malloc(L * TAIL * ROW * sizeof *kt), *vt = malloc(L * TAIL * ROW * sizeof *vt);
    for (size_t l = 0; l < L; l++) {
        memcpy(kt + l * TAIL * ROW, k + (l * N + 2 * CT) * ROW, TAIL * ROW * sizeof *kt);
        memcpy(vt + l * TAIL * ROW, v + (l * N + 2 * CT) * ROW, TAIL * ROW * sizeof *vt);
    }
    dqc_put_args pp = {.seq = {NS, "on-prefix", 9},
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = TAIL,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = kt,
                       .v = vt};
    const double seqs_before = stat_gauge(c, "sequences");
    uint8_t missing[2 * 16];
    memcpy(missing, keys, 16);
    memset(missing + 16, 0x5a, 16);
    FAILS(c, DQ_NOT_FOUND, dqc_put_on_prefix(c, &pp, missing, 2, NULL));
    cr_assert(strstr(dqc_last_error(c), "prefix chunk 1 not held"), "%s", dqc_last_error(c));
    cr_assert_eq(stat_gauge(c, "sequences"), seqs_before, "the failed PUT left nothing");
    OK(c, dqc_put_on_prefix(c, &pp, keys, 2, NULL));
    /* prefix_chunks only on the creating PUT */
    pp.start_token = TAIL;
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_put_on_prefix(c, &pp, keys, 2, NULL));
    pp.start_token = 0;

    float q[L][QH * HD];
    for (size_t l = 0; l < L; l++)
        for (size_t i = 0; i < QH * HD; i++)
            q[l][i] = (float)((i * 37 + l * 11) % 101) / 50.0f - 1.0f;
    for (uint32_t l = 0; l < L; l++) {
        dqc_attend_item it[2] = {{.seq = pa.seq, .layer = l, .q = q[l]}, {.seq = pp.seq, .layer = l, .q = q[l]}};
        dqc_attend_args aa = {
            .items = it, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
        float out[2 * QH * HD], lse[2 * QH];
        OK(c, dqc_attend(c, &aa, out, lse));
        double worst = 0, scale = 0;
        for (size_t i = 0; i < QH * HD; i++)
            scale = fmax(scale, fabs((double)out[i]));
        for (size_t i = 0; i < QH * HD; i++)
            worst = fmax(worst, fabs((double)out[i] - out[QH * HD + i]) / scale);
        cr_assert_lt(worst, 1e-5, "layer %u: out differs by %g relative", l, worst);
        for (size_t h = 0; h < QH; h++)
            cr_assert_float_eq(lse[h], lse[QH + h], 1e-5 * fabs(lse[h]) + 1e-6, "layer %u head %zu lse", l, h);
        cr_log_info("layer %u: prefix+tail vs one sequence: max rel diff %.3g", l, worst);
    }
    /* on the cuda backend (dquantd-fakecuda) the chunks and sequences sit in GPU memory */
    cr_log_info("backend %s: %g sequences hold GPU layers", getenv("DQUANTD"), stat_gauge(c, "gpu_sequences"));
    /* the chunks stay while the sequence is built on them */
    FAILS(c, DQ_BUSY, dqc_delete_chunk(c, NS, keys));
    OK(c, dqc_delete(c, &pp.seq));
    OK(c, dqc_delete_chunk(c, NS, keys));
    free(kt);
    free(vt);
    free(k);
    free(v);
    free(tok);
    dqc_free(c);
}

/* A million keys are 18 MB of header: past the frame limits (TOO_LARGE) before validation. With a
 * header limit that lets 65537 keys through (the default 1 MiB holds about 58000), validation
 * refuses them against max_lookup_keys. */
Test(chunks, a_million_lookup_keys_are_refused_whole)
{
    const char *const extra[] = {"--max-header", "4M", NULL};
    start_daemon(extra);
    dqc_client *c = cli();
    register_model(c, CT);
    const size_t n = 1000000;
    uint8_t *keys = calloc(n, 16);
    cr_assert(keys);
    int rc = dqc_lookup(c, NS, MODEL, keys, n, 1000, NULL);
    cr_log_info("a million keys: %s: %s", dqc_err_name(rc), dqc_last_error(c));
    cr_assert(rc == DQ_INVALID_ARGUMENT || rc == DQ_TOO_LARGE, "%s", dqc_err_name(rc));
    /* one past the default max_lookup_keys (65536), in a frame the limits let through */
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_lookup(c, NS, MODEL, keys, 65537, 1000, NULL));
    cr_assert(strstr(dqc_last_error(c), "65536"), "%s", dqc_last_error(c));
    /* the connection (or a reconnected one) still answers, nothing was leased */
    cr_assert_eq(stat_gauge(c, "leases_active"), 0.0);
    cr_assert_eq(stat_counter(c, "lookups"), 0u);
    free(keys);
    dqc_free(c);
}
