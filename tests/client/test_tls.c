/* TLS end to end (issue 18): libdquant-client over tls:// against a real dquantd ($DQUANTD) with
 * --tls-cert/--tls-key, without and with client certificates (--tls-client-ca). Certificates are
 * made at test time with the openssl CLI in a private directory: a CA, a server certificate for
 * 127.0.0.1 and localhost, a client certificate, and a second CA that trusts nothing here.
 * Results over TLS are checked byte for byte against the same calls over the daemon's plaintext
 * Unix socket. Also: clients refused (no certificate, untrusted server, plaintext to a TLS port),
 * plaintext non-loopback listeners refused at start, and PUT throughput TLS vs plaintext TCP. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "dquant/dquant.h"

static dqd_daemon D, P;
static char certs[256];

static void stop_daemons(void)
{
    if (D.pid)
        dqd_stop(&D);
    if (P.pid)
        dqd_stop(&P);
}

TestSuite(tls, .fini = stop_daemons, .timeout = 180);

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[2400];
    snprintf(full, sizeof full, "cd '%s' && { %s; } >>openssl.log 2>&1", certs, cmd);
    cr_assert_eq(system(full), 0, "failed: %s (see %s/openssl.log)", cmd, certs);
}

#define EC "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

/* CA (ca.pem), server (server.pem/key: IP 127.0.0.1, DNS localhost), client (client.pem/key),
 * and an unrelated CA (other.pem). */
static void make_certs(void)
{
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        cr_skip_test("the openssl CLI is not installed");
    snprintf(certs, sizeof certs, "%s", dqd_tmpdir());
    sh("openssl req -x509 " EC " -keyout ca.key -out ca.pem -days 2 -subj /CN=dquant-test-ca");
    sh("openssl req -x509 " EC " -keyout other.key -out other.pem -days 2 -subj /CN=other-ca");
    sh("printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' >server.ext");
    sh("openssl req " EC " -keyout server.key -out server.csr -subj /CN=dquantd");
    sh("openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext "
       "-out server.pem");
    sh("printf 'extendedKeyUsage=clientAuth\\n' >client.ext");
    sh("openssl req " EC " -keyout client.key -out client.csr -subj /CN=engine-1");
    sh("openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext "
       "-out client.pem");
}

static const char *cpath(const char *name)
{
    static char buf[8][300];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 300, "%s/%s", certs, name);
    return p;
}

/* A daemon with TLS on its TCP port; mutual: client certificates of ca.pem required. */
static void start_tls(int mutual, const char *secret)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    make_certs();
    const char *extra[12] = {"--tls-cert", cpath("server.pem"), "--tls-key", cpath("server.key")};
    int n = 4;
    if (mutual) {
        extra[n++] = "--tls-client-ca";
        extra[n++] = cpath("ca.pem");
    }
    if (secret) {
        extra[n++] = "--secret";
        extra[n++] = secret;
    }
    extra[n] = NULL;
    const dqd_opts o = {.tcp = 1, .extra = extra, .name = "tls"};
    cr_assert_eq(dqd_start(&D, &o), 0);
}

static char tls_addr[80];

static int try_connect(const char *addr, const char *ca, const char *cert, const char *key, const char *secret,
                       dqc_client **out, char *err, size_t errlen)
{
    dqc_options o;
    dqc_options_default(&o);
    o.connect_timeout_ms = 5000;
    o.io_timeout_ms = 10000;
    o.reconnect_attempts = 1;
    o.tls_ca = ca;
    o.tls_cert = cert;
    o.tls_key = key;
    if (secret) {
        o.secret = secret;
        o.secret_len = strlen(secret);
    }
    return dqc_connect_ex(addr, &o, out, err, errlen);
}

static dqc_client *connect_ok(const char *addr, const char *ca, const char *cert, const char *key)
{
    dqc_client *c = NULL;
    char err[512];
    int rc = try_connect(addr, ca, cert, key, NULL, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect %s: %s: %s", addr, dqc_err_name(rc), err);
    return c;
}

#define L 2
#define KVH 2
#define QH 4
#define HD 64
#define NV (KVH * HD)
#define T 200

static float *data(size_t n, uint32_t seed)
{
    float *f = malloc(n * sizeof *f);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        f[i] = (float)((int32_t)(s >> 8) % 2000) / 700.0f + (i % 64 == 3 ? 3.0f : 0.0f);
    }
    return f;
}

/* PUT over tc, then GET and ATTEND over tc and over the plaintext Unix socket: identical bytes. */
static void round_trip(dqc_client *tc, const char *seqkey)
{
    dqc_client *uc = connect_ok(D.addr, NULL, NULL, NULL);
    dqc_model_spec spec = {
        .name = "m", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    OK(tc, dqc_register_model(tc, &spec, NULL));
    size_t cnt = (size_t)L * T * NV;
    float *k = data(cnt, 1), *v = data(cnt, 2);
    dqc_seq s = {.ns = "tls", .key = seqkey, .key_len = strlen(seqkey)};
    dqc_put_args pa = {.seq = s,
                       .model = "m",
                       .num_layers = L,
                       .tokens = T,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    dqc_put_result pr;
    OK(tc, dqc_put(tc, &pa, &pr));
    cr_assert_eq(pr.tokens, T);
    dqc_get_args ga = {.seq = s, .dtype = DQ_DTYPE_F32};
    dqc_get_result g1 = {0}, g2 = {0};
    OK(tc, dqc_get(tc, &ga, &g1));
    OK(uc, dqc_get(uc, &ga, &g2));
    cr_assert_eq(g1.bytes, cnt * 4);
    cr_assert_eq(g2.bytes, g1.bytes);
    cr_assert_eq(memcmp(g1.k, g2.k, g1.bytes), 0, "K over TLS differs from K over the Unix socket");
    cr_assert_eq(memcmp(g1.v, g2.v, g1.bytes), 0, "V over TLS differs from V over the Unix socket");
    double err = 0, ref = 0;
    for (size_t i = 0; i < cnt; i++) {
        float x;
        memcpy(&x, (const uint8_t *)g1.v + 4 * i, 4);
        err += (x - v[i]) * (x - v[i]);
        ref += v[i] * v[i];
    }
    cr_assert_lt(err / ref, 0.1, "relative MSE of V %g", err / ref);
    dqc_get_result_free(&g1);
    dqc_get_result_free(&g2);

    float *q = data(2 * QH * HD, 3);
    dqc_attend_item items[2] = {{.seq = s, .layer = 0, .q = q}, {.seq = s, .layer = 1, .q = q + QH * HD}};
    dqc_attend_args aa = {
        .items = items, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    float o1[2 * QH * HD], l1[2 * QH], o2[2 * QH * HD], l2[2 * QH];
    OK(tc, dqc_attend(tc, &aa, o1, l1));
    OK(uc, dqc_attend(uc, &aa, o2, l2));
    cr_assert_eq(memcmp(o1, o2, sizeof o1), 0);
    cr_assert_eq(memcmp(l1, l2, sizeof l1), 0);
    cr_assert_gt(l1[0], 0);
    /* The connection stays usable across idle periods (no stray records make it look dead). */
    OK(tc, dqc_ping(tc, "x", 1));
    OK(tc, dqc_ping(tc, "x", 1));
    free(k);
    free(v);
    free(q);
    dqc_free(uc);
}

Test(tls, round_trip_server_cert)
{
    start_tls(0, NULL);
    snprintf(tls_addr, sizeof tls_addr, "tls://127.0.0.1:%u", D.port);
    dqc_client *c = connect_ok(tls_addr, cpath("ca.pem"), NULL, NULL);
    round_trip(c, "a");
    dqc_free(c);
    /* The server name can be given apart from the address (SNI and verification). */
    dqc_options o;
    dqc_options_default(&o);
    o.tls_ca = cpath("ca.pem");
    o.tls_server_name = "localhost";
    OK(NULL, dqc_connect(tls_addr, &o, &c));
    OK(c, dqc_ping(c, "x", 1));
    dqc_free(c);
    o.tls_server_name = "not-the-server";
    char err[512];
    cr_assert_eq(dqc_connect_ex(tls_addr, &o, &c, err, sizeof err), DQ_UNAUTHENTICATED, "%s", err);
}

Test(tls, untrusted_server_refused)
{
    start_tls(0, NULL);
    snprintf(tls_addr, sizeof tls_addr, "tls://127.0.0.1:%u", D.port);
    dqc_client *c = NULL;
    char err[512];
    int rc = try_connect(tls_addr, cpath("other.pem"), NULL, NULL, NULL, &c, err, sizeof err);
    cr_assert_eq(rc, DQ_UNAUTHENTICATED, "%s: %s", dqc_err_name(rc), err);
    cr_assert_null(c);
    cr_assert(strstr(err, "not trusted"), "%s", err);
    /* The daemon keeps serving. */
    c = connect_ok(tls_addr, cpath("ca.pem"), NULL, NULL);
    OK(c, dqc_ping(c, "x", 1));
    dqc_free(c);
}

Test(tls, plaintext_client_refused)
{
    start_tls(0, NULL);
    char addr[80];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", D.port);
    dqc_client *c = NULL;
    char err[512];
    time_t t0 = time(NULL);
    int rc = try_connect(addr, NULL, NULL, NULL, NULL, &c, err, sizeof err);
    cr_assert(rc == DQ_CONNECTION || rc == DQ_PROTOCOL, "%s: %s", dqc_err_name(rc), err);
    cr_assert_leq(time(NULL) - t0, 3, "the refusal took %lld s", (long long)(time(NULL) - t0));
    usleep(200 * 1000);
    cr_assert(dqd_log_contains(&D, "TLS handshake failed"));
    snprintf(tls_addr, sizeof tls_addr, "tls://127.0.0.1:%u", D.port);
    c = connect_ok(tls_addr, cpath("ca.pem"), NULL, NULL);
    OK(c, dqc_ping(c, "x", 1));
    dqc_free(c);
}

Test(tls, mutual_round_trip_and_refusal)
{
    start_tls(1, "s3cret");
    snprintf(tls_addr, sizeof tls_addr, "tls://127.0.0.1:%u", D.port);
    /* A verified client certificate authenticates in place of the secret. */
    dqc_client *c = connect_ok(tls_addr, cpath("ca.pem"), cpath("client.pem"), cpath("client.key"));
    round_trip(c, "b");
    dqc_free(c);

    /* No certificate: refused even with the right secret. */
    char err[512];
    c = NULL;
    int rc = try_connect(tls_addr, cpath("ca.pem"), NULL, NULL, "s3cret", &c, err, sizeof err);
    cr_assert_eq(rc, DQ_UNAUTHENTICATED, "%s: %s", dqc_err_name(rc), err);
    cr_assert_null(c);
    /* A certificate of another CA: refused. */
    rc = try_connect(tls_addr, cpath("ca.pem"), cpath("other.pem"), cpath("other.key"), NULL, &c, err, sizeof err);
    cr_assert_eq(rc, DQ_UNAUTHENTICATED, "%s: %s", dqc_err_name(rc), err);
    cr_assert_null(c);
    usleep(200 * 1000);
    cr_assert(dqd_log_contains(&D, "TLS handshake failed"));
}

static int start_status(const char *const args[], char **errout)
{
    int efd = -1;
    pid_t pid = dqd_spawn(args, NULL, &efd);
    *errout = dqd_read_all(efd);
    return dqd_wait(pid, 10000);
}

Test(tls, plaintext_non_loopback_refused)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    char listen[64];
    snprintf(listen, sizeof listen, "tcp://0.0.0.0:%u", dqd_free_port());
    char *err = NULL;
    const char *a1[] = {"--listen", listen, "--secret", "s", "--metrics", "off", NULL};
    cr_assert_eq(start_status(a1, &err), 2, "%s", err);
    cr_assert(strstr(err, "refusing plaintext TCP"), "%s", err);
    free(err);
    /* The secret rule stays: --allow-plaintext alone is not enough. */
    const char *a2[] = {"--listen", listen, "--allow-plaintext", "--metrics", "off", NULL};
    cr_assert_eq(start_status(a2, &err), 2, "%s", err);
    cr_assert(strstr(err, "needs a shared secret"), "%s", err);
    free(err);
    /* Explicitly allowed, with a secret: it serves. */
    const char *a3[] = {"--listen", listen, "--secret", "s", "--allow-plaintext", NULL};
    const dqd_opts o = {.extra = a3, .name = "plain"};
    cr_assert_eq(dqd_start(&P, &o), 0);
}

/* PUT MB/s over TLS and over plaintext TCP, on loopback (printed; TLS must stay within 10x). */
static double put_mbps(const char *addr, const char *ca)
{
    dqc_client *c = connect_ok(addr, ca, NULL, NULL);
    const uint32_t layers = 8, tokens = 1024;
    dqc_model_spec spec = {
        .name = "big", .layers = layers, .q_heads = 16, .kv_heads = 8, .head_dim = 128, .profile_name = "dq226"};
    OK(c, dqc_register_model(c, &spec, NULL));
    size_t cnt = (size_t)layers * tokens * 8 * 128;
    uint16_t *k = malloc(cnt * 2), *v = malloc(cnt * 2);
    float *f = data(cnt, 9);
    cr_assert_eq(dq_convert(f, DQ_DTYPE_F32, k, DQ_DTYPE_BF16, cnt), 0);
    cr_assert_eq(dq_convert(f, DQ_DTYPE_F32, v, DQ_DTYPE_BF16, cnt), 0);
    free(f);
    const int reps = 6;
    static int round;
    round++;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < reps; r++) {
        char key[16];
        snprintf(key, sizeof key, "p%d-%d", round, r);
        dqc_put_args pa = {.seq = {.ns = "bench", .key = key, .key_len = strlen(key)},
                           .model = "big",
                           .num_layers = layers,
                           .tokens = tokens,
                           .kv_heads = 8,
                           .head_dim = 128,
                           .dtype = DQ_DTYPE_BF16,
                           .k = k,
                           .v = v};
        OK(c, dqc_put(c, &pa, NULL));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    free(k);
    free(v);
    dqc_free(c);
    return (double)reps * (double)cnt * 4.0 / s / 1e6;
}

Test(tls, put_throughput)
{
    start_tls(0, NULL);
    const dqd_opts o = {.tcp = 1, .name = "plain"};
    cr_assert_eq(dqd_start(&P, &o), 0);
    snprintf(tls_addr, sizeof tls_addr, "tls://127.0.0.1:%u", D.port);
    double plain = put_mbps(P.tcp_addr, NULL), tls = put_mbps(tls_addr, cpath("ca.pem"));
    double plain2 = put_mbps(P.tcp_addr, NULL), tls2 = put_mbps(tls_addr, cpath("ca.pem"));
    (void)plain2;
    (void)tls2;
    fprintf(stderr,
            "tls: PUT throughput on loopback (BF16, 8 layers x 1024 tokens x 8x128, 6 PUTs): "
            "plaintext TCP %.0f MB/s, TLS %.0f MB/s (ratio %.2f)\n",
            plain, tls, tls / plain);
    cr_assert_gt(tls, plain / 10, "TLS %.0f MB/s vs plaintext %.0f MB/s", tls, plain);
}
