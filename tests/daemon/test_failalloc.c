/* Allocation failures in the request path (issue 18): against dquantd-failalloc (failalloc/), every
 * allocation that PUT, GET, ATTEND, PUT_CHUNKS, LOOKUP and DELETE make is failed in turn, the first
 * on one run of the request, the second on the next, until a run makes no more. Each time the
 * request must be answered NOMEM or RESOURCE_EXHAUSTED (or succeed, where the allocation was
 * optional; or the connection closes, where the reply itself could not be allocated), the same
 * request must then succeed with the right result, and the daemon's host memory accounting must be
 * back at its baseline. Under ASan the daemon's clean exit adds the leak check. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#define DQD_FAILALLOC_IMPL /* the control block only, not the wrappers */
#include "failalloc.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define CT 128 /* chunk tokens: one window of dq226 */
#define T 256  /* tokens per PUT */
#define NCH 2  /* chunks per PUT_CHUNKS */
#define ROW (KVH * HD)
#define MODEL "m"
#define NS "fa"
#define MAX_SITES 2000

static dqd_daemon D;
static dqd_fa_ctl *ctl;
static dqc_client *C;
static float *K, *V, *Q;

static void stop_daemon(void)
{
    dqc_free(C);
    C = NULL;
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
    free(K);
    free(V);
    free(Q);
}

static float *data(size_t n, uint32_t seed)
{
    float *x = malloc(n * sizeof *x);
    uint32_t h = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        h ^= h << 13;
        h ^= h >> 17;
        h ^= h << 5;
        x[i] = (float)(h % 20001) / 10000.0f - 1.0f;
    }
    return x;
}

static void start(void)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    char path[] = "/tmp/dqd-failalloc-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, sizeof *ctl), 0);
    ctl = mmap(NULL, sizeof *ctl, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(ctl, MAP_FAILED);
    close(fd);
    setenv("DQD_FAIL_ALLOC_CTL", path, 1);
    /* One worker: one codec workspace, whatever order the requests of a dropped connection and of
     * its successor run in (the pool would otherwise grow by one, for good, and look like a leak). */
    static const char *const extra[] = {"--workers", "1", NULL};
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
    unlink(path); /* the daemon maps it at its first allocation, long done */
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &C, err, sizeof err), 0, "connect: %s", err);
    dqc_model_spec spec = {
        .name = MODEL, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    OK(C, dqc_register_model_ex(C, &spec, CT, NULL, NULL));
    K = data((size_t)L * T * ROW, 1);
    V = data((size_t)L * T * ROW, 2);
    Q = data((size_t)L * QH * HD, 3);
}

TestSuite(failalloc, .init = start, .fini = stop_daemon, .timeout = 280);

static void arm(int64_t k)
{
    __atomic_store_n(&ctl->fired, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&ctl->countdown, k, __ATOMIC_SEQ_CST);
}

/* Disarms; 1 when the armed allocation failed. */
static int disarm(void)
{
    __atomic_store_n(&ctl->countdown, 0, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&ctl->fired, __ATOMIC_SEQ_CST) != 0;
}

static void reconnect(void)
{
    dqc_free(C);
    C = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &C, err, sizeof err), 0, "connect: %s", err);
}

static double used(void)
{
    return stat_gauge(C, "host_memory_used");
}

/* Host memory once it stops moving (workers give workspaces back after the reply has gone), or
 * once it equals want: at most 2 s. */
static double settled(double want)
{
    double v = used();
    for (int i = 0; i < 100 && v != want; i++) {
        usleep(20000);
        double w = used();
        if (w == v && want < 0)
            break;
        v = w;
    }
    return v;
}

static dqc_seq seq(const char *key)
{
    return (dqc_seq){.ns = NS, .key = key, .key_len = strlen(key)};
}

static int put(const char *key)
{
    dqc_put_args a = {.seq = seq(key),
                      .model = MODEL,
                      .num_layers = L,
                      .tokens = T,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = K,
                      .v = V};
    return dqc_put(C, &a, NULL);
}

static uint8_t keys[NCH * DQC_CHUNK_KEY_BYTES];

static int put_chunks(void)
{
    dqc_put_chunks_args a = {.ns = NS,
                             .model = MODEL,
                             .keys = keys,
                             .nkeys = NCH,
                             .layers = L,
                             .chunk_tokens = CT,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = K,
                             .v = V};
    dqc_put_chunks_result r;
    int rc = dqc_put_chunks(C, &a, &r);
    if (rc == 0)
        cr_assert_eq(r.stored + r.deduped, NCH);
    return rc;
}

static void chunk_keys(void)
{
    uint32_t tok[NCH * CT];
    for (size_t i = 0; i < NCH * CT; i++)
        tok[i] = (uint32_t)i * 7u + 3u;
    cr_assert_eq(dqc_chunk_keys(NS, tok, NCH * CT, CT, NULL, keys, NCH), NCH);
}

/* What the unarmed run of a GET / ATTEND returned, to compare the runs after a failure with. */
static float ref_get[2][L * T * ROW], ref_att[L * QH * HD];

static int get_seq(int keep)
{
    dqc_get_args a = {.seq = seq("s"), .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    int rc = dqc_get(C, &a, &r);
    if (rc == 0) {
        cr_assert_eq(r.tokens, T);
        cr_assert_eq(r.bytes, sizeof ref_get[0]);
        if (keep) {
            memcpy(ref_get[0], r.k, r.bytes);
            memcpy(ref_get[1], r.v, r.bytes);
        } else {
            cr_assert(memcmp(ref_get[0], r.k, r.bytes) == 0 && memcmp(ref_get[1], r.v, r.bytes) == 0,
                      "GET after a failure returned other data");
        }
    }
    dqc_get_result_free(&r);
    return rc;
}

static int attend(int keep)
{
    dqc_attend_item it[L];
    for (uint32_t l = 0; l < L; l++)
        it[l] = (dqc_attend_item){.seq = seq("s"), .layer = l, .q = Q + l * QH * HD};
    dqc_attend_args a = {
        .items = it, .nitems = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    float out[L * QH * HD];
    int rc = dqc_attend(C, &a, out, NULL);
    if (rc == 0) {
        if (keep)
            memcpy(ref_att, out, sizeof out);
        else
            cr_assert(memcmp(ref_att, out, sizeof out) == 0, "ATTEND after a failure returned other data");
    }
    return rc;
}

static uint64_t lease;

enum op { OP_PUT, OP_GET, OP_ATTEND, OP_PUT_CHUNKS, OP_LOOKUP, OP_DELETE };
static const char *const op_names[] = {"PUT", "GET", "ATTEND", "PUT_CHUNKS", "LOOKUP", "DELETE"};

/* One run of the request; armed runs may fail. */
static int run_op(enum op op, int keep)
{
    switch (op) {
    case OP_PUT:
        return put("p");
    case OP_GET:
        return get_seq(keep);
    case OP_ATTEND:
        return attend(keep);
    case OP_PUT_CHUNKS:
        return put_chunks();
    case OP_LOOKUP: {
        dqc_lookup_result r;
        int rc = dqc_lookup(C, NS, MODEL, keys, NCH, 1000, &r);
        if (rc == 0) {
            cr_assert_eq(r.hits, NCH);
            lease = r.lease_id; /* released by undo(), once disarmed */
        }
        return rc;
    }
    case OP_DELETE:
        return dqc_delete(C, &(dqc_seq){.ns = NS, .key = "d", .key_len = 1});
    }
    return DQ_INTERNAL;
}

/* Puts back what a successful run changed, so that every run starts from the same store. */
static void undo(enum op op)
{
    dqc_get_args a = {.seq = seq("d"), .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    switch (op) {
    case OP_PUT:
        OK(C, dqc_delete(C, &(dqc_seq){.ns = NS, .key = "p", .key_len = 1}));
        break;
    case OP_PUT_CHUNKS:
        for (size_t i = NCH; i-- > 0;)
            OK(C, dqc_delete_chunk(C, NS, keys + i * DQC_CHUNK_KEY_BYTES));
        break;
    case OP_DELETE:
        FAILS(C, DQ_NOT_FOUND, dqc_get(C, &a, &r));
        dqc_get_result_free(&r);
        OK(C, put("d"));
        break;
    case OP_LOOKUP:
        if (lease)
            OK(C, dqc_release_lease(C, lease));
        lease = 0;
        break;
    default:
        break;
    }
}

static void sweep(enum op op)
{
    chunk_keys();
    OK(C, put("s"));
    OK(C, put("d"));
    if (op == OP_LOOKUP)
        OK(C, put_chunks());
    OK(C, run_op(op, 1)); /* the reference answers */
    undo(op);
    for (int warm = 0; warm < 2; warm++) { /* pools and caches at their steady size */
        OK(C, run_op(op, 0));
        undo(op);
    }
    const double base = settled(-1);
    unsigned answered = 0, absorbed = 0, dropped = 0, applied = 0, k;
    for (k = 1; k <= MAX_SITES; k++) {
        arm(k);
        int rc = run_op(op, 0);
        int fired = disarm();
        if (!fired) { /* the run needed fewer than k allocations: all of them were failed once */
            OK(C, rc);
            undo(op);
            break;
        }
        int dropped_now = rc == DQ_CONNECTION || dqc_reconnect_count(C) > 0;
        if (dropped_now) {
            /* the reply could not be allocated: the daemon closes the connection */
            dropped++;
            reconnect();
        } else if (rc == 0) {
            absorbed++;
        } else {
            cr_assert(rc == DQ_NOMEM || rc == DQ_RESOURCE_EXHAUSTED, "%s, allocation %u failed: %s (%s)", op_names[op],
                      k, dqc_err_name(rc), dqc_last_error(C));
            answered++;
        }
        if (dropped_now) {
            /* the request may have been carried out before its reply was lost */
            int again = run_op(op, 0);
            cr_assert(again == 0 || (op == OP_PUT && again == DQ_ORDER) || (op == OP_DELETE && again == DQ_NOT_FOUND),
                      "%s after a lost reply: %s", op_names[op], dqc_err_name(again));
        } else if (rc != 0) { /* no trace: the next run must succeed, with the same answer */
            int again = run_op(op, 0);
            if (again == DQ_CONNECTION) { /* answered, then closed: a frame it could not take in */
                reconnect();
                again = run_op(op, 0);
            }
            if ((op == OP_PUT && again == DQ_ORDER) || (op == OP_DELETE && again == DQ_NOT_FOUND)) {
                /* Known (issue 18): the request was carried out and the reply frame's allocation
                 * failed, so the error answer hides a change. Tolerated for that one site only. */
                applied++;
                cr_assert_leq(applied, 1u, "%s, allocation %u failed (%s) but the request took effect", op_names[op], k,
                              dqc_err_name(rc));
            } else {
                cr_assert_eq(again, 0, "%s after allocation %u failed (%s): %s (%s)", op_names[op], k, dqc_err_name(rc),
                             dqc_err_name(again), dqc_last_error(C));
            }
        }
        undo(op);
        double now = settled(base);
        cr_assert_eq(now, base, "%s, allocation %u failed: host memory %.0f, baseline %.0f", op_names[op], k, now,
                     base);
    }
    cr_assert_leq(k, MAX_SITES, "%s: more than %d allocations", op_names[op], MAX_SITES);
    /* on stderr, not cr_log_warn: a warning makes Criterion's runner exit 1 with every test passed */
    fprintf(stderr,
            "failalloc %s: %u allocations failed in turn: %u answered NOMEM/RESOURCE_EXHAUSTED, %u absorbed, "
            "%u closed the connection, %u took effect behind the error; host memory back at %.0f bytes each time\n",
            op_names[op], k - 1, answered, absorbed, dropped, applied, base);
    cr_assert_gt(answered, 0u, "%s: no failure was answered with an error", op_names[op]);
}

Test(failalloc, put)
{
    sweep(OP_PUT);
}
Test(failalloc, get)
{
    sweep(OP_GET);
}
Test(failalloc, attend)
{
    sweep(OP_ATTEND);
}
Test(failalloc, put_chunks)
{
    sweep(OP_PUT_CHUNKS);
}
Test(failalloc, lookup)
{
    sweep(OP_LOOKUP);
}
Test(failalloc, delete)
{
    sweep(OP_DELETE);
}
