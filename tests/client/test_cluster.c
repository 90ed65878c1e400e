/* dqc_cluster, the multi-node client, against dquantd processes on loopback TCP ports ($DQUANTD):
 * rendezvous placement (even spread, ~1/N of the keys move when a member joins, none between the
 * others), failover with R = 2 while a member is killed with SIGKILL and after it restarts empty
 * (reads still answer the data written before, chunks are repaired onto it), misses with R = 1,
 * a hung member (SIGSTOP) failing over within the I/O timeout, a sequence on prefix chunks placed
 * on another member, and ATTEND batches spread over members giving the same bytes as one daemon.
 * The placement test needs no daemon; the others skip when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/kvq.h"

#define NMAX 5
#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define CT 128
#define ROW (KVH * HD)
#define MODEL "m"
#define NS "t"
#define KB DQC_CHUNK_KEY_BYTES

static dqd_daemon D[NMAX];
static uint16_t P[NMAX];

#define COK(cl, expr)                                                                                         \
    do {                                                                                                      \
        int rc_ = (expr);                                                                                     \
        cr_assert_eq(rc_, 0, "%s -> %s: %s", #expr, dqc_err_name(rc_), cl ? dqc_cluster_last_error(cl) : ""); \
    } while (0)

static void stop_all(void)
{
    for (int i = 0; i < NMAX; i++) {
        if (D[i].pid) {
            kill(D[i].pid, SIGCONT);
            dqd_stop(&D[i]);
        }
    }
}

TestSuite(cluster, .fini = stop_all, .timeout = 240);

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Node i on its loopback port P[i] (the same port again after a restart). */
static void start_node(int i)
{
    char listen[64];
    snprintf(listen, sizeof listen, "tcp://127.0.0.1:%u", P[i]);
    const char *extra[] = {"--listen", listen, NULL};
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D[i], &o), 0, "could not start node %d", i);
}

static void start_nodes(int n)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    for (int i = 0; i < n; i++) {
        P[i] = dqd_free_port();
        cr_assert_neq(P[i], 0);
        start_node(i);
    }
}

static void kill_node(int i)
{
    kill(D[i].pid, SIGKILL);
    waitpid(D[i].pid, NULL, 0);
    D[i].pid = 0;
    dqd_stop(&D[i]); /* removes its folder */
}

static char *members(int first, int n)
{
    static char s[1024];
    s[0] = 0;
    for (int i = first; i < first + n; i++)
        snprintf(s + strlen(s), sizeof s - strlen(s), "%stcp://127.0.0.1:%u", i > first ? "," : "", P[i]);
    return s;
}

/* The node index of cluster member i (by its address). */
static int node_of(dqc_cluster *cl, size_t i)
{
    dqc_cluster_member_info mi;
    cr_assert_eq(dqc_cluster_member(cl, i, &mi), 0);
    for (int k = 0; k < NMAX; k++) {
        char a[64];
        snprintf(a, sizeof a, "tcp://127.0.0.1:%u", P[k]);
        if (P[k] && strcmp(a, mi.addr) == 0)
            return k;
    }
    cr_assert_fail("member %zu (%s) is no node", i, mi.addr);
    return -1;
}

/* backoff_ms 0: 100 ms, doubling up to 400 ms. */
static dqc_cluster *cluster_with(const char *m, uint32_t r, uint32_t w, int io_ms, uint32_t backoff_ms)
{
    dqc_cluster_options o;
    dqc_cluster_options_default(&o);
    o.replicas = r;
    o.write_quorum = w;
    o.down_backoff_ms = backoff_ms ? backoff_ms : 100;
    o.down_backoff_max_ms = backoff_ms ? backoff_ms : 400;
    if (io_ms)
        o.node.io_timeout_ms = io_ms;
    dqc_cluster *cl = NULL;
    char err[512];
    int rc = dqc_cluster_create(m, &o, &cl, err, sizeof err);
    cr_assert_eq(rc, 0, "dqc_cluster_create(%s): %s: %s", m, dqc_err_name(rc), err);
    return cl;
}

static dqc_cluster *cluster(const char *m, uint32_t r, uint32_t w, int io_ms)
{
    return cluster_with(m, r, w, io_ms, 0);
}

static void register_model(dqc_cluster *cl)
{
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    uint32_t ct = 0;
    COK(cl, dqc_cluster_register_model(cl, &spec, CT, NULL, &ct));
    cr_assert_eq(ct, CT);
}

/* Deterministic K/V values: [L, n, KVH, HD] f32, a function of (seed, token position). */
static float *kv(uint32_t seed, uint64_t start, uint64_t n, int is_v)
{
    float *x = malloc(L * n * ROW * sizeof *x);
    for (uint64_t l = 0; l < L; l++)
        for (uint64_t t = 0; t < n; t++)
            for (uint64_t j = 0; j < ROW; j++) {
                uint32_t h = seed * 2654435761u ^ (uint32_t)((start + t) * 40503u + j * 977u + l * 7919u + is_v * 31u);
                h ^= h >> 15;
                h *= 2246822519u;
                h ^= h >> 13;
                x[(l * n + t) * ROW + j] = (float)(h % 20001) / 10000.0f - 1.0f;
            }
    return x;
}

static int put_seq(dqc_cluster *cl, const char *key, uint32_t seed, uint64_t start, uint64_t n)
{
    float *k = kv(seed, start, n, 0), *v = kv(seed, start, n, 1);
    dqc_put_args a = {.seq = {NS, key, strlen(key)},
                      .model = MODEL,
                      .start_token = start,
                      .num_layers = L,
                      .tokens = n,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    int rc = dqc_cluster_put(cl, &a, NULL);
    free(k);
    free(v);
    return rc;
}

/* GET of a whole sequence as f32 into a malloc'd copy (k then v); *bytes each. */
static int get_seq(dqc_cluster *cl, const char *key, float **kvout, size_t *bytes)
{
    dqc_get_args a = {.seq = {NS, key, strlen(key)}, .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    int rc = dqc_cluster_get(cl, &a, &r);
    if (rc == 0) {
        *bytes = r.bytes;
        *kvout = malloc(2 * r.bytes);
        memcpy(*kvout, r.k, r.bytes);
        memcpy((uint8_t *)*kvout + r.bytes, r.v, r.bytes);
    }
    dqc_get_result_free(&r);
    return rc;
}

/* Chunk keys of prompt p (nchunks full chunks) and its K/V, [L, nchunks·CT, KVH, HD]. */
static void prompt_keys(uint32_t p, size_t nchunks, uint8_t *keys)
{
    uint32_t *tok = malloc(nchunks * CT * sizeof *tok);
    for (size_t i = 0; i < nchunks * CT; i++)
        tok[i] = p * 7919u + (uint32_t)i * 31u;
    cr_assert_eq(dqc_chunk_keys(NS, tok, nchunks * CT, CT, NULL, keys, nchunks), nchunks);
    free(tok);
}

/* PUT_CHUNKS of chunks [first, first + n) of prompt p through the cluster. */
static int put_prompt_chunks(dqc_cluster *cl, uint32_t p, const uint8_t *keys, size_t first, size_t n)
{
    float *k = kv(1000 + p, first * CT, n * CT, 0), *v = kv(1000 + p, first * CT, n * CT, 1);
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys + first * KB,
                             .nkeys = n,
                             .layers = L,
                             .chunk_tokens = CT,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = k,
                             .v = v};
    int rc = dqc_cluster_put_chunks(cl, &a, keys, first, NULL);
    free(k);
    free(v);
    return rc;
}

/* A direct client of node i, for looking behind the cluster's back. */
static dqc_client *direct(int i)
{
    char addr[64], err[256];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", P[i]);
    dqc_client *c = NULL;
    int rc = dqc_connect_ex(addr, NULL, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect node %d: %s", i, err);
    return c;
}

/* ---- placement ---- */

static size_t owner(dqc_cluster *cl, uint32_t k, int chunks)
{
    size_t o = SIZE_MAX;
    char key[32];
    uint8_t root[KB] = {0};
    if (chunks) {
        memcpy(root, &k, sizeof k);
        cr_assert_eq(dqc_cluster_locate_chunks(cl, NS, root, &o, 1), 1);
    } else {
        snprintf(key, sizeof key, "req-%u", k);
        dqc_seq s = {NS, key, strlen(key)};
        cr_assert_eq(dqc_cluster_locate(cl, &s, &o, 1), 1);
    }
    return o;
}

static const char *member_id(dqc_cluster *cl, size_t i)
{
    static char id[8][DQC_MEMBER_ID_MAX];
    static int slot;
    dqc_cluster_member_info mi;
    cr_assert_eq(dqc_cluster_member(cl, i, &mi), 0);
    slot = (slot + 1) % 8;
    snprintf(id[slot], sizeof id[slot], "%s", mi.id);
    return id[slot];
}

Test(cluster, placement_spread_and_moves)
{
    enum { K = 60000 };
    dqc_cluster_options o;
    dqc_cluster_options_default(&o);
    o.connect_now = 0; /* placement only: nothing listens at these addresses */
    dqc_cluster *cl = NULL;
    const char *three = "tcp://10.0.0.1:7733,tcp://10.0.0.2:7733,tcp://10.0.0.3:7733";
    cr_assert_eq(dqc_cluster_create(three, &o, &cl, NULL, 0), 0);
    cr_assert_eq(dqc_cluster_size(cl), 3);
    for (int chunks = 0; chunks < 2; chunks++) {
        static char before[K][DQC_MEMBER_ID_MAX];
        size_t count[4] = {0};
        COK(cl, dqc_cluster_set_members(cl, three));
        for (uint32_t k = 0; k < K; k++) {
            size_t m = owner(cl, k, chunks);
            count[m]++;
            snprintf(before[k], sizeof before[k], "%s", member_id(cl, m));
        }
        double dev = 0;
        for (int m = 0; m < 3; m++) {
            double d = (double)count[m] / (K / 3.0) - 1;
            dev = d > dev ? d : -d > dev ? -d : dev;
        }
        cr_assert_lt(dev, 0.10, "3 members: %zu %zu %zu keys", count[0], count[1], count[2]);

        /* A 4th member: only the keys it wins move, and they all move to it. */
        COK(cl, dqc_cluster_set_members(cl, "tcp://10.0.0.1:7733,tcp://10.0.0.2:7733,tcp://10.0.0.3:7733,"
                                            "tcp://10.0.0.4:7733"));
        cr_assert_eq(dqc_cluster_size(cl), 4);
        size_t moved = 0, count4[4] = {0};
        for (uint32_t k = 0; k < K; k++) {
            size_t m = owner(cl, k, chunks);
            count4[m]++;
            const char *id = member_id(cl, m);
            if (strcmp(id, before[k]) != 0) {
                moved++;
                cr_assert_str_eq(id, "tcp://10.0.0.4:7733", "key %u moved between old members", k);
            }
        }
        double frac = (double)moved / K;
        cr_assert(frac >= 0.20 && frac <= 0.30, "adding a 4th member moved %.1f%% of the keys", 100 * frac);
        double dev4 = 0;
        for (int m = 0; m < 4; m++) {
            double d = (double)count4[m] / (K / 4.0) - 1;
            dev4 = d > dev4 ? d : -d > dev4 ? -d : dev4;
        }
        cr_assert_lt(dev4, 0.10);

        /* Removing a member moves its keys only. */
        COK(cl, dqc_cluster_set_members(cl, "tcp://10.0.0.1:7733,tcp://10.0.0.3:7733"));
        size_t moved_rm = 0;
        for (uint32_t k = 0; k < K; k++) {
            const char *id = member_id(cl, owner(cl, k, chunks));
            if (strcmp(id, before[k]) != 0) {
                moved_rm++;
                cr_assert_str_eq(before[k], "tcp://10.0.0.2:7733", "key %u left a member that stayed", k);
            }
        }
        printf("placement (%s, %d keys): 3 members %zu/%zu/%zu (max deviation %.1f%%); a 4th member took %.1f%% "
               "(max deviation %.1f%%); removing one moved %.1f%% (its own)\n",
               chunks ? "chunk trees" : "sequences", K, count[0], count[1], count[2], 100 * dev, 100 * frac, 100 * dev4,
               100.0 * (double)moved_rm / K);
    }
    dqc_cluster_stats st;
    cr_assert_eq(dqc_cluster_get_stats(cl, &st), 0);
    cr_assert_gt(st.member_changes, 3);
    dqc_cluster_free(cl);
}

Test(cluster, bad_input)
{
    dqc_cluster *cl = (dqc_cluster *)1;
    char err[256];
    dqc_cluster_options o;
    dqc_cluster_options_default(&o);
    o.connect_now = 0;
    cr_assert_eq(dqc_cluster_create("", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert_null(cl);
    cr_assert_eq(dqc_cluster_create("10.0.0.1:7733", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(err, "expected") != NULL, "%s", err);
    cr_assert_eq(dqc_cluster_create("dns:name.only", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(err, "dns:NAME:PORT") != NULL, "%s", err);
    o.replicas = 2;
    o.write_quorum = 3;
    cr_assert_eq(dqc_cluster_create("tcp://10.0.0.1:1", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(err, "write_quorum") != NULL, "%s", err);
    o.write_quorum = 0;
    o.replicas = 0;
    cr_assert_eq(dqc_cluster_create("tcp://10.0.0.1:1", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    o.replicas = 1;
    o.dns_server = "not-an-ip";
    cr_assert_eq(dqc_cluster_create("srv:_x._tcp.example.", &o, &cl, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(err, "DNS server") != NULL, "%s", err);
    o.dns_server = NULL;
    /* Nothing listens: refused at once, and creation says so. */
    o.connect_now = 1;
    uint16_t dead = dqd_free_port();
    char m[64];
    snprintf(m, sizeof m, "tcp://127.0.0.1:%u", dead);
    long t0 = now_ms();
    cr_assert_eq(dqc_cluster_create(m, &o, &cl, err, sizeof err), DQ_CONNECTION, "%s", err);
    cr_assert_lt(now_ms() - t0, 2000);
    cr_assert(strstr(err, "no member answered") != NULL, "%s", err);

    cr_assert_eq(dqc_cluster_put(NULL, NULL, NULL), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_cluster_lookup(NULL, NS, MODEL, NULL, 0, 0, NULL), DQ_INVALID_ARGUMENT);
    dqc_cluster_free(NULL);
    o.connect_now = 0;
    cr_assert_eq(dqc_cluster_create("tcp://10.0.0.1:1, tcp://10.0.0.2:1 ,tcp://10.0.0.1:1", &o, &cl, err, sizeof err),
                 0, "%s", err);
    cr_assert_eq(dqc_cluster_size(cl), 2, "duplicates dropped, spaces trimmed");
    uint8_t keys[2 * KB] = {1}, other[KB] = {2};
    float x = 0;
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys + KB,
                             .nkeys = 1,
                             .parent = other,
                             .layers = 1,
                             .chunk_tokens = CT,
                             .kv_heads = 1,
                             .head_dim = 1,
                             .dtype = DQ_DTYPE_F32,
                             .k = &x,
                             .v = &x};
    cr_assert_eq(dqc_cluster_put_chunks(cl, &a, keys, 1, NULL), DQ_INVALID_ARGUMENT);
    cr_assert(strstr(dqc_cluster_last_error(cl), "parent must be the last prefix key") != NULL, "%s",
              dqc_cluster_last_error(cl));
    cr_assert_eq(dqc_cluster_lookup(cl, NS, MODEL, keys, 0, 0, NULL), DQ_INVALID_ARGUMENT);
    dqc_cluster_member_info mi;
    cr_assert_eq(dqc_cluster_member(cl, 2, &mi), DQ_INVALID_ARGUMENT);
    cr_assert_null(dqc_cluster_client(cl, 7));
    dqc_cluster_free(cl);
}

/* ---- failures ---- */

#define NSEQ 24

Test(cluster, r2_survives_kill_and_empty_restart)
{
    start_nodes(3);
    dqc_cluster *cl = cluster(members(0, 3), 2, 1, 0);
    register_model(cl);
    char key[NSEQ][16];
    float *before[NSEQ];
    size_t bytes[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        snprintf(key[i], sizeof key[i], "s%d", i);
        COK(cl, put_seq(cl, key[i], (uint32_t)i, 0, 128));
        COK(cl, get_seq(cl, key[i], &before[i], &bytes[i]));
    }
    /* Every sequence is on its 2 first members. */
    for (int i = 0; i < NSEQ; i++) {
        size_t o[3];
        dqc_seq s = {NS, key[i], strlen(key[i])};
        cr_assert_eq(dqc_cluster_locate(cl, &s, o, 3), 3);
        for (int r = 0; r < 3; r++) {
            dqc_client *c = direct(node_of(cl, o[r]));
            dqc_get_args a = {.seq = s, .dtype = DQ_DTYPE_F32};
            dqc_get_result g = {0};
            int rc = dqc_get(c, &a, &g);
            cr_assert_eq(rc, r < 2 ? 0 : DQ_NOT_FOUND, "seq %d replica %d: %s", i, r, dqc_err_name(rc));
            dqc_get_result_free(&g);
            dqc_free(c);
        }
    }
    /* A prompt of 4 chunks, its tree on 2 members. */
    uint8_t keys[4 * KB];
    prompt_keys(7, 4, keys);
    COK(cl, put_prompt_chunks(cl, 7, keys, 0, 2));
    COK(cl, put_prompt_chunks(cl, 7, keys, 2, 2));
    size_t croot[3];
    cr_assert_eq(dqc_cluster_locate_chunks(cl, NS, keys, croot, 3), 3);
    int victim = node_of(cl, croot[0]);

    kill_node(victim);
    for (int i = 0; i < NSEQ; i++) {
        float *after;
        size_t b;
        long t0 = now_ms();
        COK(cl, get_seq(cl, key[i], &after, &b));
        cr_assert_lt(now_ms() - t0, 1500, "failover took %ld ms", now_ms() - t0);
        cr_assert_eq(b, bytes[i]);
        cr_assert_eq(memcmp(after, before[i], 2 * b), 0, "seq %d differs after the failover", i);
        free(after);
        COK(cl, put_seq(cl, key[i], (uint32_t)i, 128, 64)); /* appends keep working (W = 1) */
    }
    dqc_lookup_result lr;
    COK(cl, dqc_cluster_lookup(cl, NS, MODEL, keys, 4, 0, &lr));
    cr_assert_eq(lr.hits, 4, "the chunk tree's other replica answers");
    dqc_cluster_stats st;
    dqc_cluster_get_stats(cl, &st);
    cr_assert_geq(st.marked_down, 1);
    cr_assert_gt(st.failovers, 0);

    /* Back, empty: it must not answer for what it lost, the others do. */
    start_node(victim);
    usleep(500 * 1000); /* past the backoff */
    for (int i = 0; i < NSEQ; i++) {
        float *after;
        size_t b;
        COK(cl, get_seq(cl, key[i], &after, &b));
        cr_assert_eq(b, bytes[i] / 128 * 192, "seq %d: 192 tokens after the append", i);
        for (size_t l = 0; l < 2 * L; l++) /* k then v, per layer: the first 128 tokens as before */
            cr_assert_eq(memcmp(after + l * 192 * ROW, before[i] + l * 128 * ROW, 128 * ROW * sizeof(float)), 0,
                         "seq %d block %zu changed", i, l);
        free(after);
        free(before[i]);
    }
    dqc_client *dc = direct(victim);
    dqc_lookup_result dl;
    cr_assert_eq(dqc_lookup(dc, NS, MODEL, keys, 4, 0, &dl), 0, "%s", dqc_last_error(dc));
    cr_assert_eq(dl.hits, 0, "the restarted member is empty");
    COK(cl, dqc_cluster_lookup(cl, NS, MODEL, keys, 4, 0, &lr));
    cr_assert_eq(lr.hits, 4);
    cr_assert_eq(dqc_lookup(dc, NS, MODEL, keys, 4, 0, &dl), 0);
    cr_assert_eq(dl.hits, 4, "read repair copied the chunks back onto it");
    dqc_free(dc);
    dqc_cluster_get_stats(cl, &st);
    cr_assert_geq(st.repairs, 1);
    cr_assert_geq(st.repaired_chunks, 4);
    /* A chunk after the prefix goes to both replicas again. */
    uint8_t keys5[5 * KB];
    prompt_keys(7, 5, keys5);
    COK(cl, put_prompt_chunks(cl, 7, keys5, 4, 1));
    dc = direct(victim);
    cr_assert_eq(dqc_lookup(dc, NS, MODEL, keys5, 5, 0, &dl), 0);
    cr_assert_eq(dl.hits, 5);
    dqc_free(dc);
    printf("R=2: %d sequences read after a member was killed and after it restarted empty; %llu failovers, "
           "%llu chunks repaired\n",
           NSEQ, (unsigned long long)st.failovers, (unsigned long long)st.repaired_chunks);
    dqc_cluster_free(cl);
}

Test(cluster, r1_dead_member_means_misses)
{
    start_nodes(3);
    dqc_cluster *cl = cluster(members(0, 3), 1, 0, 0);
    register_model(cl);
    char key[NSEQ][16];
    for (int i = 0; i < NSEQ; i++) {
        snprintf(key[i], sizeof key[i], "s%d", i);
        COK(cl, put_seq(cl, key[i], (uint32_t)i, 0, 128));
    }
    uint8_t keys[8][2 * KB];
    for (int p = 0; p < 8; p++) {
        prompt_keys((uint32_t)p, 2, keys[p]);
        COK(cl, put_prompt_chunks(cl, (uint32_t)p, keys[p], 0, 2));
    }
    dqc_lookup_result nl;
    cr_assert_eq(dqc_cluster_lookup(cl, NS, "no-such-model", keys[0], 2, 0, &nl), DQ_NOT_FOUND,
                 "a model no member knows is NOT_FOUND, as from one daemon");
    size_t o;
    dqc_seq s0 = {NS, key[0], strlen(key[0])};
    dqc_cluster_locate(cl, &s0, &o, 1);
    int victim = node_of(cl, o);
    kill_node(victim);
    int misses = 0, expect = 0;
    for (int i = 0; i < NSEQ; i++) {
        dqc_seq s = {NS, key[i], strlen(key[i])};
        dqc_cluster_locate(cl, &s, &o, 1);
        expect += node_of(cl, o) == victim;
        float *x;
        size_t b;
        long t0 = now_ms();
        int rc = get_seq(cl, key[i], &x, &b);
        cr_assert_lt(now_ms() - t0, 1500);
        cr_assert(rc == 0 || rc == DQ_NOT_FOUND, "seq %d: %s: %s", i, dqc_err_name(rc), dqc_cluster_last_error(cl));
        if (rc == 0)
            free(x);
        misses += rc == DQ_NOT_FOUND;
    }
    cr_assert_eq(misses, expect, "exactly the dead member's sequences miss");
    cr_assert_gt(misses, 0);
    int fewer = 0, on_victim = 0;
    for (int p = 0; p < 8; p++) {
        dqc_lookup_result lr;
        COK(cl, dqc_cluster_lookup(cl, NS, MODEL, keys[p], 2, 0, &lr));
        dqc_cluster_locate_chunks(cl, NS, keys[p], &o, 1);
        on_victim += node_of(cl, o) == victim;
        fewer += lr.hits < 2;
    }
    cr_assert_eq(fewer, on_victim, "the dead member's chunk trees are misses, the others hits");
    /* New data lands on the next member. */
    for (int i = 0; i < NSEQ; i++) {
        dqc_cluster_delete(cl, &(dqc_seq){NS, key[i], strlen(key[i])});
        COK(cl, put_seq(cl, key[i], (uint32_t)i, 0, 64));
        float *x;
        size_t b;
        COK(cl, get_seq(cl, key[i], &x, &b));
        free(x);
    }
    printf("R=1: a dead member's %d of %d sequences and %d of 8 chunk trees were misses, nothing else failed\n", misses,
           NSEQ, fewer);
    dqc_cluster_free(cl);
}

Test(cluster, hung_member_fails_over_within_the_io_timeout)
{
    start_nodes(3);
    /* Marked down for 5 s: the second read must not wait for it again, however slow this machine. */
    dqc_cluster *cl = cluster_with(members(0, 3), 2, 1, 300, 5000);
    register_model(cl);
    COK(cl, put_seq(cl, "h", 5, 0, 128));
    size_t o;
    dqc_seq s = {NS, "h", 1};
    dqc_cluster_locate(cl, &s, &o, 1);
    int hung = node_of(cl, o);
    kill(D[hung].pid, SIGSTOP);
    float *x;
    size_t b;
    long t0 = now_ms();
    COK(cl, get_seq(cl, "h", &x, &b));
    long first = now_ms() - t0;
    free(x);
    t0 = now_ms();
    COK(cl, get_seq(cl, "h", &x, &b));
    long second = now_ms() - t0;
    free(x);
    kill(D[hung].pid, SIGCONT);
    cr_assert(first >= 250 && first < 1500, "first read after the hang: %ld ms (io timeout 300 ms)", first);
    cr_assert_lt(second, 200, "the hung member is skipped while marked down: %ld ms", second);
    printf("hung member: the first read failed over after %ld ms (io timeout 300 ms), the next took %ld ms\n", first,
           second);
    dqc_cluster_free(cl);
}

/* ---- a sequence on prefix chunks, ATTEND batches over members, against one daemon ---- */

static void put_ref_chunks(dqc_client *c, uint32_t p, const uint8_t *keys, size_t n)
{
    float *k = kv(1000 + p, 0, n * CT, 0), *v = kv(1000 + p, 0, n * CT, 1);
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys,
                             .nkeys = n,
                             .layers = L,
                             .chunk_tokens = CT,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = k,
                             .v = v};
    cr_assert_eq(dqc_put_chunks(c, &a, NULL), 0, "%s", dqc_last_error(c));
    free(k);
    free(v);
}

Test(cluster, prefix_sequences_and_attend_match_one_daemon)
{
    start_nodes(4); /* 0..2: the cluster; 3: the reference */
    dqc_cluster *cl = cluster(members(0, 3), 1, 0, 0);
    register_model(cl);
    dqc_client *ref = direct(3);
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    cr_assert_eq(dqc_register_model_ex(ref, &spec, CT, NULL, NULL), 0);

    uint8_t keys[3 * KB];
    prompt_keys(42, 3, keys);
    COK(cl, put_prompt_chunks(cl, 42, keys, 0, 3));
    put_ref_chunks(ref, 42, keys, 3);
    size_t croot;
    dqc_cluster_locate_chunks(cl, NS, keys, &croot, 1);
    /* A sequence placed away from its prefix's member. */
    char pkey[32] = "";
    for (int i = 0; !pkey[0]; i++) {
        char k[32];
        snprintf(k, sizeof k, "req-%d", i);
        size_t o;
        dqc_cluster_locate(cl, &(dqc_seq){NS, k, strlen(k)}, &o, 1);
        if (o != croot)
            snprintf(pkey, sizeof pkey, "%s", k);
    }
    float *k = kv(77, 0, 64, 0), *v = kv(77, 0, 64, 1);
    dqc_put_args pa = {.seq = {NS, pkey, strlen(pkey)},
                       .model = MODEL,
                       .num_layers = L,
                       .tokens = 64,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    COK(cl, dqc_cluster_put_on_prefix(cl, &pa, keys, 3, NULL));
    cr_assert_eq(dqc_put_on_prefix(ref, &pa, keys, 3, NULL), 0, "%s", dqc_last_error(ref));
    free(k);
    free(v);
    dqc_cluster_stats st;
    dqc_cluster_get_stats(cl, &st);
    cr_assert_eq(st.repaired_chunks, 3, "the prefix was copied to the sequence's member");

    /* Plain sequences on every member, then one batch over all of them. */
    enum { NS_PLAIN = 9, NITEMS = NS_PLAIN + 2 };
    char plain[NS_PLAIN][16];
    int per[3] = {0};
    for (int i = 0, cand = 0; i < NS_PLAIN; cand++) { /* 3 on each member */
        snprintf(plain[i], sizeof plain[i], "p%d", cand);
        size_t o;
        dqc_cluster_locate(cl, &(dqc_seq){NS, plain[i], strlen(plain[i])}, &o, 1);
        if (per[o] < NS_PLAIN / 3)
            per[o]++, i++;
    }
    for (int i = 0; i < NS_PLAIN; i++) {
        COK(cl, put_seq(cl, plain[i], (uint32_t)(100 + i), 0, 192));
        float *pk = kv((uint32_t)(100 + i), 0, 192, 0), *pv = kv((uint32_t)(100 + i), 0, 192, 1);
        dqc_put_args ra = {.seq = {NS, plain[i], strlen(plain[i])},
                           .model = MODEL,
                           .num_layers = L,
                           .tokens = 192,
                           .kv_heads = KVH,
                           .head_dim = HD,
                           .dtype = DQ_DTYPE_F32,
                           .k = pk,
                           .v = pv};
        cr_assert_eq(dqc_put(ref, &ra, NULL), 0);
        free(pk);
        free(pv);
    }
    float q[NITEMS][QH * HD];
    for (int i = 0; i < NITEMS; i++)
        for (int j = 0; j < QH * HD; j++)
            q[i][j] = (float)((i * 131 + j * 17) % 97) / 97.0f - 0.5f;
    dqc_attend_item items[NITEMS];
    int used[3] = {0};
    for (int i = 0; i < NITEMS; i++) {
        const char *key = i < NS_PLAIN ? plain[i] : pkey;
        items[i] = (dqc_attend_item){.seq = {NS, key, strlen(key)}, .layer = (uint32_t)(i % L), .q = q[i]};
        size_t o;
        dqc_cluster_locate(cl, &items[i].seq, &o, 1);
        used[o] = 1;
    }
    cr_assert(used[0] && used[1] && used[2], "the batch spans every member");
    dqc_attend_args aa = {
        .items = items, .nitems = NITEMS, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    float out[NITEMS * QH * HD], lse[NITEMS * QH], rout[NITEMS * QH * HD], rlse[NITEMS * QH];
    COK(cl, dqc_cluster_attend(cl, &aa, out, lse));
    cr_assert_eq(dqc_attend(ref, &aa, rout, rlse), 0, "%s", dqc_last_error(ref));
    cr_assert_eq(memcmp(out, rout, sizeof out), 0, "ATTEND over 3 members differs from one daemon's");
    cr_assert_eq(memcmp(lse, rlse, sizeof lse), 0);

    /* With appends: every item written to its replica, the same outputs again. */
    float ak[NITEMS][KVH * HD], av[NITEMS][KVH * HD];
    for (int i = 0; i < NITEMS; i++) {
        for (int j = 0; j < KVH * HD; j++) {
            ak[i][j] = (float)((i * 7 + j * 3) % 41) / 41.0f - 0.5f;
            av[i][j] = (float)((i * 5 + j * 11) % 43) / 43.0f - 0.5f;
        }
        items[i].append_k = ak[i];
        items[i].append_v = av[i];
    }
    COK(cl, dqc_cluster_attend(cl, &aa, out, lse));
    cr_assert_eq(dqc_attend(ref, &aa, rout, rlse), 0, "%s", dqc_last_error(ref));
    cr_assert_eq(memcmp(out, rout, sizeof out), 0, "ATTEND with appends differs from one daemon's");
    dqc_free(ref);
    printf("ATTEND of %d items over 3 members (a sequence on 3 prefix chunks of another member) = one daemon's, "
           "bit for bit\n",
           NITEMS);
    dqc_cluster_free(cl);
}

/* A KVQ model with a per-layer calibration (made here by libdquant) is registered on every member
 * with it, and again on a member that restarts empty, which then stores new sequences of it. */
Test(cluster, calibrated_model_is_replayed_on_a_restarted_member)
{
    start_nodes(2);
    dq_profile p;
    cr_assert_eq(dq_profile_kvq("pq8x4", KVH, HD, &p), 0);
    enum { TOK = 256 };
    float *ck = kv(90, 0, TOK, 0), *cv = kv(90, 0, TOK, 1);
    uint8_t *calib = NULL;
    size_t clen = 0;
    cr_assert_eq(dq_kvq_calibrate(&p, L, ck, cv, TOK, 3, &calib, &clen), 0);
    free(ck);
    free(cv);
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    cr_assert_eq(dq_profile_serialize(&p, pbytes, sizeof pbytes, &plen), 0);
    dqc_model_spec spec = {.name = MODEL,
                           .layers = L,
                           .q_heads = QH,
                           .kv_heads = KVH,
                           .head_dim = HD,
                           .profile = pbytes,
                           .profile_len = plen};

    dqc_cluster *cl = cluster(members(0, 2), 2, 2, 0);
    cr_assert_eq(dqc_cluster_register_model(cl, &spec, CT, NULL, NULL), DQ_PROFILE,
                 "the calibrated profile needs its calibration");
    COK(cl, dqc_cluster_register_model_calibrated(cl, &spec, CT, calib, clen, NULL, NULL));
    COK(cl, put_seq(cl, "a", 1, 0, 40));
    kill_node(1);
    start_node(1);
    usleep(500 * 1000);                  /* past the backoff */
    COK(cl, put_seq(cl, "b", 2, 0, 40)); /* W = 2: node 1 must hold the model again */
    float *got;
    size_t bytes;
    COK(cl, get_seq(cl, "b", &got, &bytes));
    dqc_client *c = direct(1);
    dqc_model_info info;
    cr_assert_eq(dqc_register_model_calibrated(c, &spec, CT, calib, clen, &info, NULL), 0, "%s", dqc_last_error(c));
    cr_assert_eq(info.existed, 1, "the restarted member got the calibrated model from the cluster");
    dqc_get_args ga = {.seq = {NS, "b", 1}, .dtype = DQ_DTYPE_F32};
    dqc_get_result g = {0};
    cr_assert_eq(dqc_get(c, &ga, &g), 0, "%s", dqc_last_error(c));
    cr_assert_eq(g.bytes, bytes);
    cr_assert_eq(memcmp(g.k, got, bytes), 0, "the restarted member's copy differs");
    dqc_get_result_free(&g);
    dqc_free(c);
    free(got);
    dq_kvq_free(calib);
    dqc_cluster_free(cl);
}
