/* Hostile input through dquantd's real protocol (issue 18, items 6-8): extreme finite queries,
 * scales and appended tokens in ATTEND; names with a NUL or invalid UTF-8; the model registry's
 * share per client and UNREGISTER_MODEL. libdquant-client makes the ordinary calls, raw frames
 * (tests/support/wire.h) carry the bytes the client library cannot send. $DQ_INPUT_BACKEND (cuda,
 * for dquantd-fakecuda) is passed as --backend, so the cuda backend's path is checked too. Skipped
 * when $DQUANTD is unset. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "wire.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define T0 300 /* tokens put: two sealed windows of 128 and a BF16 tail of 44 */

static dqd_daemon D;

static void stop_daemon(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

static const char *backend(void)
{
    const char *b = getenv("DQ_INPUT_BACKEND");
    return b && *b ? b : "cpu";
}

static void start_daemon(const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    static const char *args[24];
    size_t n = 0;
    args[n++] = "--backend";
    args[n++] = backend();
    for (size_t i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    const dqd_opts o = {.extra = args};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
}

TestSuite(input, .fini = stop_daemon, .timeout = 240);

static dqc_client *cli_named(const char *name)
{
    dqc_options o;
    dqc_options_default(&o);
    o.client_name = name;
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(D.addr, &o, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect: %s", err);
    return c;
}

static int register_model(dqc_client *c, const char *name, uint32_t layers, dqc_model_info *info)
{
    dqc_model_spec spec = {
        .name = name, .layers = layers, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    return dqc_register_model(c, &spec, info);
}

/* Normal(0, 1) draws, seeded (Box-Muller on a 64-bit LCG). */
static float *normals(size_t count, uint64_t seed)
{
    float *x = malloc(count * sizeof *x);
    for (size_t i = 0; i < count; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((double)(seed >> 11) + 1.0) / 9007199254740994.0;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = (double)(seed >> 11) / 9007199254740992.0;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    return x;
}

static dqc_seq seq_of(const char *ns, const char *key)
{
    return (dqc_seq){.ns = ns, .key = key, .key_len = strlen(key)};
}

/* PUT T0 tokens of every layer of model "m" to (ns, key). */
static void put_seq(dqc_client *c, const char *ns, const char *key)
{
    float *k = normals((size_t)L * T0 * ROW, 11), *v = normals((size_t)L * T0 * ROW, 12);
    dqc_put_args a = {.seq = seq_of(ns, key),
                      .model = "m",
                      .num_layers = L,
                      .tokens = T0,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    free(k);
    free(v);
}

static uint64_t tokens_of(dqc_client *c, const char *ns, const char *key, uint32_t layer)
{
    dqc_get_args g = {.seq = seq_of(ns, key), .first_layer = layer, .num_layers = 1, .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    OK(c, dqc_get(c, &g, &r));
    uint64_t t = r.tokens;
    dqc_get_result_free(&r);
    return t;
}

/* One ATTEND item on layer 1 of (ns "t", key "s"); ak/av may be NULL. */
static int attend(dqc_client *c, const float *q, float scale, const float *ak, const float *av, float *out, float *lse)
{
    dqc_attend_item it = {.seq = seq_of("t", "s"), .layer = 1, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args a = {.items = &it,
                         .nitems = 1,
                         .q_heads = QH,
                         .kv_heads = KVH,
                         .head_dim = HD,
                         .dtype = DQ_DTYPE_F32,
                         .scale = scale};
    return dqc_attend(c, &a, out, lse);
}

static void expect_finite(const float *out, const float *lse)
{
    for (int i = 0; i < QH * HD; i++)
        cr_assert(isfinite(out[i]), "output %d is %g", i, (double)out[i]);
    for (int h = 0; h < QH; h++)
        cr_assert(isfinite(lse[h]), "lse %d is %g", h, (double)lse[h]);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i])));
    return m;
}

/* On the cuda backend the attended layer must be in (emulated) GPU memory, so that it is the cuda
 * path that is checked. */
static void expect_backend_path(dqc_client *c)
{
    if (strcmp(backend(), "cuda") == 0)
        cr_assert_gt(stat_gauge(c, "gpu_sequences"), 0.0, "the sequence is not on the GPU tier");
}

/* Issue 18.6: q or scale near the float maximum came back as NaN outputs and an infinite LSE with
 * no error. Now: RANGE with a message naming item and head, and exact finite results up to the
 * limit (‖q‖·max(1, scale) <= 2^64, dquant/attention.h). */
Test(input, attend_extreme_queries)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    put_seq(c, "t", "s");
    float *q = normals(QH * HD, 21);
    float out[QH * HD], lse[QH], ref[QH * HD], rlse[QH];
    OK(c, attend(c, q, 0, NULL, NULL, ref, rlse));
    expect_finite(ref, rlse);
    expect_backend_path(c);

    float qb[QH * HD];
    memcpy(qb, q, sizeof qb);
    for (int j = 0; j < HD; j++)
        qb[HD + j] = (j & 1) ? -3e37f : 3e37f;
    FAILS(c, DQ_RANGE, attend(c, qb, 0, NULL, NULL, out, lse));
    cr_assert(strstr(dqc_last_error(c), "item 0: q head 1"), "message: %s", dqc_last_error(c));
    FAILS(c, DQ_RANGE, attend(c, q, 3e38f, NULL, NULL, out, lse));

    /* a huge scale on a tiny query is an ordinary attention: scale·q is what counts */
    float qt[QH * HD];
    for (int i = 0; i < QH * HD; i++)
        qt[i] = q[i] * 1e-30f;
    OK(c, attend(c, qt, 1e30f / sqrtf(HD), NULL, NULL, out, lse));
    expect_finite(out, lse);
    cr_assert_lt(max_rel(out, ref, QH * HD), 1e-3, "scale 1e30 on q 1e-30 differs from the plain attention");
    cr_assert_lt(max_rel(lse, rlse, QH), 1e-3);

    /* just below the limit: every logit finite (about 1e19), the softmax one-hot, LSE finite */
    for (int i = 0; i < QH * HD; i++)
        qb[i] = q[i] > 0 ? 1e18f : -1e18f;
    OK(c, attend(c, qb, 1.0f, NULL, NULL, out, lse));
    expect_finite(out, lse);
    for (int h = 0; h < QH; h++)
        cr_assert_gt(lse[h], 1e18f, "head %d: lse %g", h, (double)lse[h]);
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0);
    free(q);
    dqc_free(c);
}

/* Issue 18.6, appends: a huge finite appended K/V is refused (RANGE; an f32 that rounds to a BF16
 * infinity is NONFINITE) and appends nothing; NaN anywhere in the batch wins over a range error. */
Test(input, attend_extreme_appends)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    put_seq(c, "t", "s");
    float *q = normals(QH * HD, 31), *ak = normals(ROW, 32), *av = normals(ROW, 33);
    float out[2 * QH * HD], lse[2 * QH];
    OK(c, attend(c, q, 0, ak, av, out, lse));
    expect_finite(out, lse);
    expect_backend_path(c);
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0 + 1);

    float big[ROW];
    memcpy(big, ak, sizeof big);
    big[5] = 1e30f;
    FAILS(c, DQ_RANGE, attend(c, q, 0, big, av, out, lse));
    FAILS(c, DQ_RANGE, attend(c, q, 0, ak, big, out, lse));
    big[5] = 3.4e38f; /* finite in f32, an infinity once rounded to BF16 */
    FAILS(c, DQ_NONFINITE, attend(c, q, 0, big, av, out, lse));
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0 + 1, "a refused append left a token");

    /* item 0: a query out of range; item 1: a NaN appended value. NONFINITE wins. */
    float qb[QH * HD], nan_v[ROW];
    memcpy(qb, q, sizeof qb);
    qb[3] = 1e38f;
    memcpy(nan_v, av, sizeof nan_v);
    nan_v[7] = NAN;
    dqc_attend_item it[2] = {{.seq = seq_of("t", "s"), .layer = 1, .q = qb},
                             {.seq = seq_of("t", "s"), .layer = 0, .q = q, .append_k = ak, .append_v = nan_v}};
    dqc_attend_args a = {
        .items = it, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    FAILS(c, DQ_NONFINITE, dqc_attend(c, &a, out, lse));
    cr_assert_eq(tokens_of(c, "t", "s", 0), T0);
    free(q);
    free(ak);
    free(av);
    dqc_free(c);
}

/* ---- raw frames ---- */

static int raw_conn(void)
{
    int fd = wire_connect_unix(D.sock);
    cr_assert_geq(fd, 0);
    cr_assert_eq(wire_hello(fd, 1, NULL), 0);
    return fd;
}

/* Sends req with every occurrence of the byte string from (in its header message) replaced by to
 * (as long), and returns the reply's error code (0: no error); *msg gets its message. */
static int call_patched(int fd, const Dquant__Request *req, const char *from, const char *to, size_t n, char *msg,
                        size_t msglen)
{
    size_t len;
    uint8_t *h = wire_pack(req, &len);
    for (uint8_t *p = h; (p = memmem(p, len - (size_t)(p - h), from, n)) != NULL; p += n)
        memcpy(p, to, n);
    cr_assert_eq(wire_send_header(fd, h, len, NULL, 0, 7), 0);
    free(h);
    Dquant__Response *r = NULL;
    uint64_t id = 0;
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0, "no reply");
    cr_assert_eq(id, 7);
    int code = wire_error(r);
    snprintf(msg, msglen, "%s", code ? r->error->message : "");
    dquant__response__free_unpacked(r, NULL);
    return code;
}

static int seq_call(int fd, Dquant__Request__BodyCase which, const char *ns, const char *key, const char *from,
                    const char *to, size_t n, char *msg, size_t msglen)
{
    Dquant__SeqRef s = DQUANT__SEQ_REF__INIT;
    s.ns = (char *)ns;
    s.key.data = (uint8_t *)key;
    s.key.len = strlen(key);
    Dquant__Delete del = DQUANT__DELETE__INIT;
    Dquant__Get get = DQUANT__GET__INIT;
    del.seq = get.seq = &s;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = which;
    if (which == DQUANT__REQUEST__BODY_DELETE)
        req.delete_ = &del;
    else
        req.get = &get;
    return call_patched(fd, &req, from, to, n, msg, msglen);
}

/* Issue 18.7: a namespace "tenantA\0x" was cut at the NUL and read and deleted tenantA's
 * sequences. Now every string of a request is checked on the wire: INVALID_ARGUMENT naming the
 * field, and tenantA's sequence is untouched. */
Test(input, names_with_a_nul_do_not_alias)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    put_seq(c, "tenantA", "s");
    int fd = raw_conn();
    char msg[256];
    /* "tenantA#x" with the '#' turned into a NUL on the wire */
    int rc = seq_call(fd, DQUANT__REQUEST__BODY_GET, "tenantA#x", "s", "A#x", "A\0x", 3, msg, sizeof msg);
    cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "GET in 'tenantA\\0x': %d %s", rc, msg);
    cr_assert(strstr(msg, "get.seq.ns: a NUL byte at byte 7"), "message: %s", msg);
    rc = seq_call(fd, DQUANT__REQUEST__BODY_DELETE, "tenantA#x", "s", "A#x", "A\0x", 3, msg, sizeof msg);
    cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "DELETE in 'tenantA\\0x': %d %s", rc, msg);
    cr_assert_eq(tokens_of(c, "tenantA", "s", 0), T0, "tenantA's sequence is gone");

    /* a model name and a client name with a NUL */
    Dquant__ModelSpec spec = DQUANT__MODEL_SPEC__INIT;
    spec.name = "m#evil";
    spec.layers = L;
    spec.q_heads = QH;
    spec.kv_heads = KVH;
    spec.head_dim = HD;
    spec.profile_name = "dq226";
    Dquant__RegisterModel rm = DQUANT__REGISTER_MODEL__INIT;
    rm.model = &spec;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &rm;
    rc = call_patched(fd, &req, "m#e", "m\0e", 3, msg, sizeof msg);
    cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "model 'm\\0evil': %d %s", rc, msg);
    cr_assert(strstr(msg, "register_model.model.name"), "message: %s", msg);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    h.client_name = "tenantA#x";
    req = (Dquant__Request)DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    int fd2 = wire_connect_unix(D.sock);
    cr_assert_geq(fd2, 0);
    rc = call_patched(fd2, &req, "A#x", "A\0x", 3, msg, sizeof msg);
    cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "client_name 'tenantA\\0x': %d %s", rc, msg);
    close(fd2);
    close(fd);
    cr_assert_eq(tokens_of(c, "tenantA", "s", 0), T0);
    dqc_free(c);
}

/* Issue 18.7: names that are not UTF-8 were accepted. Invalid sequences of every kind (a stray
 * continuation byte, an overlong NUL, a surrogate, a truncated sequence, a code point above
 * U+10FFFF) are refused in each name field; valid UTF-8 names work; sequence keys are bytes and
 * take any bytes, NUL and 0xff included. */
Test(input, names_must_be_utf8_keys_may_be_any_bytes)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    static const struct {
        const char *bytes;
        size_t n;
    } bad[] = {{"\x80", 1}, {"\xc0\x80", 2}, {"\xed\xa0\x80", 3}, {"\xe3\x81", 2}, {"\xf4\x90\x80\x80", 4}};
    int fd = raw_conn();
    char msg[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char ns[16] = "ns@@@@";
        const char *mark = "@@@@";
        char to[4] = {'x', 'x', 'x', 'x'};
        memcpy(to, bad[i].bytes, bad[i].n);
        int rc = seq_call(fd, DQUANT__REQUEST__BODY_GET, ns, "s", mark, to, 4, msg, sizeof msg);
        cr_assert_eq(rc, DQ_INVALID_ARGUMENT, "namespace with bad UTF-8 #%zu: %d %s", i, rc, msg);
        cr_assert(strstr(msg, "invalid UTF-8"), "message: %s", msg);
    }
    /* in a model name, a profile name and a PUT's model */
    dqc_model_spec spec = {
        .name = "m\xff", .layers = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_register_model(c, &spec, NULL));
    spec.name = "m2";
    spec.profile_name = "dq\xed\xa0\x80";
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_register_model(c, &spec, NULL));
    cr_assert(strstr(dqc_last_error(c), "profile_name"), "message: %s", dqc_last_error(c));
    float kv[ROW] = {0};
    dqc_put_args p = {.seq = seq_of("t", "s"),
                      .model = "m\xe3\x81",
                      .num_layers = 1,
                      .tokens = 1,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = kv,
                      .v = kv};
    FAILS(c, DQ_INVALID_ARGUMENT, dqc_put(c, &p, NULL));

    /* valid UTF-8 names work end to end */
    const char *ns = "t\xc3\xa9nant-\xe3\x83\x86-\xf0\x9f\x98\x80";
    put_seq(c, ns, "s");
    cr_assert_eq(tokens_of(c, ns, "s", 1), T0);
    dqc_get_args g = {.seq = seq_of("t\xc3\xa9nant", "s"), .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &g, &r));

    /* binary keys: NUL and 0xff bytes, and keys that differ only after a NUL, are distinct */
    static const uint8_t k1[] = {0x00, 0xff, 0x00, 'a'}, k2[] = {0x00, 0xff, 0x00, 'b'}, k3[] = {0x00};
    float *kk = normals((size_t)T0 * ROW, 41), *vv = normals((size_t)T0 * ROW, 42);
    const uint8_t *keys[] = {k1, k2, k3};
    const size_t lens[] = {sizeof k1, sizeof k2, sizeof k3}, ntok[] = {3, 5, 7};
    for (int i = 0; i < 3; i++) {
        dqc_put_args a = {.seq = {.ns = "bin", .key = keys[i], .key_len = lens[i]},
                          .model = "m",
                          .num_layers = 1,
                          .tokens = ntok[i],
                          .kv_heads = KVH,
                          .head_dim = HD,
                          .dtype = DQ_DTYPE_F32,
                          .k = kk,
                          .v = vv};
        OK(c, dqc_put(c, &a, NULL));
    }
    for (int i = 0; i < 3; i++) {
        dqc_get_args ga = {
            .seq = {.ns = "bin", .key = keys[i], .key_len = lens[i]}, .num_layers = 1, .dtype = DQ_DTYPE_F32};
        OK(c, dqc_get(c, &ga, &r));
        cr_assert_eq(r.tokens, ntok[i], "key %d: %llu tokens", i, (unsigned long long)r.tokens);
    }
    const dqc_seq s1 = {.ns = "bin", .key = k1, .key_len = sizeof k1};
    OK(c, dqc_delete(c, &s1));
    FAILS(c, DQ_NOT_FOUND, dqc_delete(c, &s1));
    dqc_get_args g2 = {.seq = {.ns = "bin", .key = k2, .key_len = sizeof k2}, .num_layers = 1, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &g2, &r));
    cr_assert_eq(r.tokens, 5);
    dqc_get_result_free(&r);
    free(kk);
    free(vv);
    close(fd);
    dqc_free(c);
}

/* ---- the model registry ---- */

/* Registers models "<prefix>0", "<prefix>1", ... until one fails; returns how many succeeded and
 * the failing code. */
static uint32_t fill(dqc_client *c, const char *prefix, uint32_t most, int *rc)
{
    uint32_t n = 0;
    *rc = 0;
    for (; n < most; n++) {
        char name[64];
        snprintf(name, sizeof name, "%s%u", prefix, n);
        *rc = register_model(c, name, 1, NULL);
        if (*rc)
            break;
    }
    return n;
}

/* Issue 18.8: 256 throw-away registrations locked REGISTER_MODEL for everyone. With the defaults
 * (max_models 256, max_models_per_client 64) one client holds 64 models, the next is refused for
 * that client alone, and a second client still registers. */
Test(input, registry_share_per_client)
{
    start_daemon(NULL);
    dqc_client *a = cli_named("tenantA"), *b = cli_named("tenantB");
    int rc;
    uint32_t held = fill(a, "a", 300, &rc);
    cr_assert_eq(rc, DQ_RESOURCE_EXHAUSTED, "registration %u failed with %s: %s", held, dqc_err_name(rc),
                 dqc_last_error(a));
    cr_assert_eq(held, 64, "one client held %u models", held);
    cr_assert(strstr(dqc_last_error(a), "client 'tenantA' holds 64 models"), "message: %s", dqc_last_error(a));
    fprintf(stderr, "registry: client tenantA held %u models before RESOURCE_EXHAUSTED\n", held);

    uint32_t b_held = fill(b, "b", 3, &rc);
    cr_assert_eq(rc, 0, "the second client could not register: %s: %s", dqc_err_name(rc), dqc_last_error(b));
    cr_assert_eq(b_held, 3);
    fprintf(stderr, "registry: then client tenantB registered %u models\n", b_held);

    /* an identical re-registration (the built-in fast path) counts for nobody */
    dqc_model_info info;
    OK(a, register_model(a, "a0", 1, &info));
    cr_assert(info.existed);
    OK(b, register_model(b, "a1", 1, &info));
    cr_assert(info.existed, "another client re-registers a model as it is");
    /* unregistering gives the place back */
    OK(a, dqc_unregister_model(a, "a63"));
    OK(a, register_model(a, "a-new", 1, &info));
    cr_assert(!info.existed);
    FAILS(a, DQ_RESOURCE_EXHAUSTED, register_model(a, "a-more", 1, NULL));
    cr_assert_eq(stat_gauge(a, "models"), 64.0 + 3.0);
    dqc_free(a);
    dqc_free(b);
}

/* The per-client share and the registry's size together (--max-models 5 --max-models-per-client
 * 3), and 0 for no per-client limit. */
Test(input, registry_limits_configured)
{
    const char *extra[] = {"--max-models", "5", "--max-models-per-client", "3", NULL};
    start_daemon(extra);
    dqc_client *a = cli_named("tenantA"), *b = cli_named("tenantB");
    int rc;
    cr_assert_eq(fill(a, "a", 10, &rc), 3);
    cr_assert_eq(rc, DQ_RESOURCE_EXHAUSTED);
    cr_assert_eq(fill(b, "b", 10, &rc), 2);
    cr_assert_eq(rc, DQ_RESOURCE_EXHAUSTED);
    cr_assert(strstr(dqc_last_error(b), "at most 5 models"), "message: %s", dqc_last_error(b));
    OK(a, dqc_unregister_model(a, "a0"));
    OK(b, register_model(b, "b2", 1, NULL));
    dqc_free(a);
    dqc_free(b);
    stop_daemon();

    const char *unlimited[] = {"--max-models", "6", "--max-models-per-client", "0", NULL};
    start_daemon(unlimited);
    a = cli_named("tenantA");
    cr_assert_eq(fill(a, "a", 10, &rc), 6);
    cr_assert_eq(rc, DQ_RESOURCE_EXHAUSTED);
    dqc_free(a);
}

static const uint8_t CHUNK_KEY[DQC_CHUNK_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void put_chunk(dqc_client *c, const char *model)
{
    float *k = normals((size_t)L * 128 * ROW, 51), *v = normals((size_t)L * 128 * ROW, 52);
    dqc_put_chunks_args a = {.ns = "t",
                             .model = model,
                             .keys = CHUNK_KEY,
                             .nkeys = 1,
                             .layers = L,
                             .chunk_tokens = 128,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .dtype = DQ_DTYPE_F32,
                             .k = k,
                             .v = v};
    OK(c, dqc_put_chunks(c, &a, NULL));
    free(k);
    free(v);
}

/* UNREGISTER_MODEL: BUSY while a sequence or a chunk of the model exists, NOT_FOUND for an unknown
 * name; afterwards the model is gone (PUT: NOT_FOUND) and its name free for another spec, and the
 * built-in fast path of an identical re-registration still answers "existed". */
Test(input, unregister_model)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    FAILS(c, DQ_NOT_FOUND, dqc_unregister_model(c, "nosuch"));
    put_seq(c, "t", "s");
    FAILS(c, DQ_BUSY, dqc_unregister_model(c, "m"));
    cr_assert(strstr(dqc_last_error(c), "1 sequences or chunks"), "message: %s", dqc_last_error(c));
    cr_assert_eq(tokens_of(c, "t", "s", 0), T0, "a refused unregister deleted data");
    const dqc_seq s = seq_of("t", "s");
    OK(c, dqc_delete(c, &s));
    OK(c, dqc_unregister_model(c, "m"));
    FAILS(c, DQ_NOT_FOUND, dqc_unregister_model(c, "m"));
    float kv[ROW] = {0};
    dqc_put_args p = {.seq = s,
                      .model = "m",
                      .num_layers = 1,
                      .tokens = 1,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = kv,
                      .v = kv};
    FAILS(c, DQ_NOT_FOUND, dqc_put(c, &p, NULL));
    cr_assert_eq(stat_gauge(c, "models"), 0.0);

    dqc_model_info info;
    OK(c, register_model(c, "m", L + 1, &info)); /* another spec under the freed name */
    cr_assert(!info.existed);
    OK(c, register_model(c, "m", L + 1, &info));
    cr_assert(info.existed, "the identical re-registration");
    FAILS(c, DQ_EXISTS, register_model(c, "m", L, NULL));
    OK(c, dqc_unregister_model(c, "m"));

    /* a chunk of the shared tier holds its model too */
    dqc_model_spec spec = {
        .name = "c", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    OK(c, dqc_register_model_ex(c, &spec, 128, NULL, NULL));
    put_chunk(c, "c");
    FAILS(c, DQ_BUSY, dqc_unregister_model(c, "c"));
    OK(c, dqc_delete_chunk(c, "t", CHUNK_KEY));
    OK(c, dqc_unregister_model(c, "c"));
    dqc_free(c);
}

/* A PUT_CHUNKS_RAW checks its records on the workers before any chunk of it exists; an
 * UNREGISTER_MODEL pipelined right behind it must find the model in use (BUSY), not free it under
 * the request. */
Test(input, unregister_waits_for_requests_in_flight)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    dqc_model_spec spec = {
        .name = "c", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    dqc_model_info info;
    OK(c, dqc_register_model_ex(c, &spec, 128, &info, NULL));
    put_chunk(c, "c");
    dqc_raw_result raw = {0};
    OK(c, dqc_get_chunks_raw(c, "t", CHUNK_KEY, 1, &raw));
    cr_assert_eq(raw.nlayers, L);
    OK(c, dqc_delete_chunk(c, "t", CHUNK_KEY));

    wire_payload pl = {0};
    Dquant__Tensor rec[L];
    Dquant__RawLayer rl[L], *rlp[L];
    uint64_t shape[L][1];
    for (uint32_t l = 0; l < L; l++) {
        shape[l][0] = raw.layers[l].records_bytes;
        wire_tensor(&pl, &rec[l], DQUANT__DTYPE__RAW, shape[l], 1, raw.layers[l].records, raw.layers[l].records_bytes);
        dquant__raw_layer__init(&rl[l]);
        rl[l].layer = l;
        rl[l].tokens = 128;
        rl[l].windows = 1;
        rl[l].records = &rec[l];
        rlp[l] = &rl[l];
    }
    ProtobufCBinaryData key = {DQC_CHUNK_KEY_BYTES, (uint8_t *)CHUNK_KEY};
    Dquant__PutChunksRaw pcr = DQUANT__PUT_CHUNKS_RAW__INIT;
    pcr.ns = "t";
    pcr.model = "c";
    pcr.n_keys = 1;
    pcr.keys = &key;
    pcr.n_layers = L;
    pcr.layers = rlp;
    pcr.profile.data = info.profile;
    pcr.profile.len = info.profile_len;
    Dquant__Request put = DQUANT__REQUEST__INIT;
    put.body_case = DQUANT__REQUEST__BODY_PUT_CHUNKS_RAW;
    put.put_chunks_raw = &pcr;
    Dquant__UnregisterModel um = DQUANT__UNREGISTER_MODEL__INIT;
    um.name = "c";
    Dquant__Request unreg = DQUANT__REQUEST__INIT;
    unreg.body_case = DQUANT__REQUEST__BODY_UNREGISTER_MODEL;
    unreg.unregister_model = &um;

    int fd = raw_conn();
    size_t l1, l2;
    uint8_t *f1 = wire_frame(&put, pl.p, pl.len, 10, &l1), *f2 = wire_frame(&unreg, NULL, 0, 11, &l2);
    uint8_t *both = malloc(l1 + l2);
    memcpy(both, f1, l1);
    memcpy(both + l1, f2, l2);
    cr_assert_eq(wire_send_all(fd, both, l1 + l2), 0); /* one write: the daemon reads both at once */
    Dquant__Response *r1, *r2;
    uint64_t id1, id2;
    cr_assert_eq(wire_recv(fd, &id1, &r1, NULL, NULL), 0);
    cr_assert_eq(wire_recv(fd, &id2, &r2, NULL, NULL), 0);
    cr_assert_eq(id1, 10);
    cr_assert_eq(r1->body_case, DQUANT__RESPONSE__BODY_PUT_CHUNKS, "PUT_CHUNKS_RAW: %d %s", wire_error(r1),
                 wire_error(r1) ? r1->error->message : "");
    cr_assert_eq(r1->put_chunks->stored, 1);
    cr_assert_eq(id2, 11);
    cr_assert_eq(wire_error(r2), DQ_BUSY, "UNREGISTER_MODEL behind the PUT: %d", wire_error(r2));
    dquant__response__free_unpacked(r1, NULL);
    dquant__response__free_unpacked(r2, NULL);
    OK(c, dqc_delete_chunk(c, "t", CHUNK_KEY));
    OK(c, dqc_unregister_model(c, "c"));
    free(both);
    free(f1);
    free(f2);
    wire_payload_free(&pl);
    dqc_raw_result_free(&raw);
    close(fd);
    dqc_free(c);
}
