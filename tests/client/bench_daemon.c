/* bench_daemon: dquantd through libdquant-client, against references measured in the same run.
 *
 *   PUT     dq226, n = 1024 (8 KV heads x 128): raw BF16 bytes/s accepted over loopback, vs
 *           libdquant's own encoder in-process (dq_layer_append in as many threads as clients).
 *   GET     decompressed (BF16) and raw containers, bytes/s, vs memcpy of the same bytes and vs
 *           redis-server GET of a value of the same size (when redis-server is on PATH).
 *   ATTEND  one layer over sequences of --attend-tokens tokens, 1 and --attend-seqs sequences per
 *           request, latency p50/p99, vs dq_attend in-process on the very same containers
 *           (fetched with GET_RAW and restored with dq_layer_restore).
 *   RATE    PING and 4 KiB GET (one token of K+V in BF16) requests/s from --clients connections,
 *           vs `redis-benchmark -t ping,get -d 4096` with as many clients (when present).
 *
 * Usage: bench_daemon [--dquantd PATH | --connect ADDR] [--quick] [--seconds S] [--clients C]
 *                     [--attend-tokens T] [--attend-seqs S] [--attend-reps N] [--attend-seconds S]
 *                     [--no-redis]
 * With --dquantd (default: $DQUANTD) the daemon is started on a temporary socket and a loopback
 * port and stopped at the end; with --connect a running daemon is used. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dquant/client.h"
#include "dquant/dquant.h"
#include "dqd_child.h"
#include "wire.h"

#define KVH 8
#define HD 128
#define NV (KVH * HD)
#define QH 32

typedef struct bench_opts {
    const char *dquantd;
    const char *connect;
    double seconds;
    int clients;
    uint64_t attend_tokens;
    int attend_seqs;
    int attend_reps;
    double attend_seconds;
    int redis;
} bench_opts;

static bench_opts O = {.seconds = 3,
                       .clients = 2,
                       .attend_tokens = 32768,
                       .attend_seqs = 32,
                       .attend_reps = 20,
                       .attend_seconds = 60,
                       .redis = 1};
static const char *ADDR; /* the daemon's address used by the benchmark */
static dqd_daemon DAEMON;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, dqc_client *c, int rc)
{
    fprintf(stderr, "bench_daemon: %s failed: %s: %s\n", what, dqc_err_name(rc), c ? dqc_last_error(c) : "");
    if (DAEMON.pid)
        dqd_stop(&DAEMON);
    exit(1);
}

static dqc_client *connect_or_die(void)
{
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = 600000;
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(ADDR, &o, &c, err, sizeof err);
    if (rc) {
        fprintf(stderr, "bench_daemon: connect %s: %s\n", ADDR, err);
        if (DAEMON.pid)
            dqd_stop(&DAEMON);
        exit(1);
    }
    return c;
}

static uint16_t *random_bf16(size_t count, uint64_t seed)
{
    uint16_t *b = malloc(count * 2);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; i += 2) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = ((double)(s >> 11) + 0.5) / 9007199254740992.0;
        double r = sqrt(-2 * log(u1));
        b[i] = dq_f32_to_bf16((float)(r * cos(6.283185307179586 * u2)));
        if (i + 1 < count)
            b[i + 1] = dq_f32_to_bf16((float)(r * sin(6.283185307179586 * u2)));
    }
    return b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t k = (size_t)ceil(p / 100.0 * (double)n);
    return v[k ? k - 1 : 0];
}

static void register_model(dqc_client *c)
{
    dqc_model_spec spec = {
        .name = "bench-n1024", .layers = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    int rc = dqc_register_model(c, &spec, NULL);
    if (rc)
        die("register model", c, rc);
}

static int put_tokens(dqc_client *c, dqc_seq s, uint64_t start, uint64_t tokens, const uint16_t *k, const uint16_t *v)
{
    dqc_put_args a = {.seq = s,
                      .model = "bench-n1024",
                      .start_token = start,
                      .num_layers = 1,
                      .tokens = tokens,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_BF16,
                      .k = k,
                      .v = v};
    return dqc_put(c, &a, NULL);
}

/* ======================= PUT: daemon vs in-process encoder ======================= */

#define PUT_CHUNK 1024
#define PUT_SEQ_MAX 8192

typedef struct put_worker {
    int id;
    pthread_t th;
    const uint16_t *k, *v;
    double deadline;
    uint64_t tokens; /* accepted */
    int inproc;
    int rc;
} put_worker;

static void *put_daemon_main(void *arg)
{
    put_worker *w = arg;
    dqc_client *c = connect_or_die();
    char key[64];
    uint64_t len = 0, gen = 0;
    snprintf(key, sizeof key, "put-%d-%llu", w->id, (unsigned long long)gen);
    while (now_s() < w->deadline) {
        if (len + PUT_CHUNK > PUT_SEQ_MAX) {
            dqc_seq s = {"bench", key, strlen(key)};
            dqc_delete(c, &s);
            snprintf(key, sizeof key, "put-%d-%llu", w->id, (unsigned long long)++gen);
            len = 0;
        }
        dqc_seq s = {"bench", key, strlen(key)};
        w->rc = put_tokens(c, s, len, PUT_CHUNK, w->k, w->v);
        if (w->rc) {
            fprintf(stderr, "bench_daemon: PUT: %s\n", dqc_last_error(c));
            break;
        }
        len += PUT_CHUNK;
        w->tokens += PUT_CHUNK;
    }
    dqc_seq s = {"bench", key, strlen(key)};
    dqc_delete(c, &s);
    dqc_free(c);
    return NULL;
}

static const dq_codec *put_codec;

static void *put_inproc_main(void *arg)
{
    put_worker *w = arg;
    dq_workspace *ws = NULL;
    dq_layer *layer = NULL;
    dq_workspace_create(put_codec, &ws);
    dq_layer_create(put_codec, &layer);
    while (now_s() < w->deadline) {
        if (dq_layer_tokens(layer) + PUT_CHUNK > PUT_SEQ_MAX) {
            dq_layer_free(layer);
            dq_layer_create(put_codec, &layer);
        }
        w->rc = dq_layer_append(layer, ws, w->k, w->v, DQ_DTYPE_BF16, PUT_CHUNK, NULL);
        if (w->rc)
            break;
        w->tokens += PUT_CHUNK;
    }
    dq_layer_free(layer);
    dq_workspace_free(ws);
    return NULL;
}

static double run_put(int inproc, const uint16_t *k, const uint16_t *v)
{
    put_worker ws[64];
    int n = O.clients;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        ws[i] = (put_worker){.id = i, .k = k, .v = v, .deadline = t0 + O.seconds, .inproc = inproc};
        pthread_create(&ws[i].th, NULL, inproc ? put_inproc_main : put_daemon_main, &ws[i]);
    }
    uint64_t tokens = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(ws[i].th, NULL);
        if (ws[i].rc)
            die(inproc ? "dq_layer_append" : "PUT", NULL, ws[i].rc);
        tokens += ws[i].tokens;
    }
    double dt = now_s() - t0;
    return (double)tokens * NV * 2 * 2 / dt; /* K and V, 2 bytes each */
}

static void bench_put(void)
{
    dq_profile p;
    dq_codec *codec = NULL;
    if (dq_profile_builtin("dq226", KVH, HD, &p) || dq_codec_create(&p, NULL, &codec)) {
        fprintf(stderr, "bench_daemon: no dq226 codec\n");
        exit(1);
    }
    put_codec = codec;
    uint16_t *k = random_bf16((size_t)PUT_CHUNK * NV, 1), *v = random_bf16((size_t)PUT_CHUNK * NV, 2);
    double ref = run_put(1, k, v);
    double got = run_put(0, k, v);
    printf("PUT     dq226 n=1024, %d-token BF16 chunks, %d client(s) / thread(s)\n", PUT_CHUNK, O.clients);
    printf("        daemon: %8.1f MB/s of BF16 K+V accepted   in-process dq_layer_append: %8.1f MB/s   "
           "ratio %.3f\n",
           got / 1e6, ref / 1e6, got / ref);
    free(k);
    free(v);
    dq_codec_free(codec);
}

/* ======================= redis-server and a minimal RESP client ======================= */

typedef struct redis {
    pid_t pid;
    uint16_t port;
    int fd;
} redis;

static int redis_start(redis *r)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    if (!O.redis || system("command -v redis-server >/dev/null 2>&1") != 0)
        return -1;
    r->port = dqd_free_port();
    char port[16];
    snprintf(port, sizeof port, "%u", r->port);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--protected-mode", "yes", (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    for (int i = 0; i < 500; i++) {
        r->fd = wire_connect_tcp(r->port);
        if (r->fd >= 0)
            return 0;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    r->pid = 0;
    return -1;
}

static void redis_stop(redis *r)
{
    if (r->fd >= 0)
        close(r->fd);
    if (r->pid > 0) {
        kill(r->pid, SIGTERM);
        waitpid(r->pid, NULL, 0);
    }
    r->pid = 0;
    r->fd = -1;
}

/* Reads until `want` bytes are in buf. */
static int read_n(int fd, uint8_t *buf, size_t want)
{
    size_t got = 0;
    while (got < want) {
        ssize_t n = recv(fd, buf + got, want - got, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)n;
    }
    return 0;
}

/* Reads one line ending in \r\n into buf (NUL-terminated, without the CRLF). */
static int read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char ch;
        if (read_n(fd, (uint8_t *)&ch, 1))
            return -1;
        if (ch == '\n' && n && buf[n - 1] == '\r') {
            buf[n - 1] = 0;
            return 0;
        }
        if (n + 1 < cap)
            buf[n++] = ch;
    }
}

static int redis_set(redis *r, const char *key, const void *val, size_t len)
{
    char head[128];
    int hn = snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(key), key, len);
    if (wire_send_all(r->fd, head, (size_t)hn) || wire_send_all(r->fd, val, len) || wire_send_all(r->fd, "\r\n", 2))
        return -1;
    char line[256];
    return read_line(r->fd, line, sizeof line) || strcmp(line, "+OK") ? -1 : 0;
}

/* GET key into buf (cap bytes); returns the value's length or -1. */
static long redis_get(redis *r, const char *key, uint8_t *buf, size_t cap)
{
    char req[128];
    int n = snprintf(req, sizeof req, "*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n", strlen(key), key);
    if (wire_send_all(r->fd, req, (size_t)n))
        return -1;
    char line[64];
    if (read_line(r->fd, line, sizeof line) || line[0] != '$')
        return -1;
    long len = atol(line + 1);
    if (len < 0 || (size_t)len > cap)
        return -1;
    if (read_n(r->fd, buf, (size_t)len))
        return -1;
    uint8_t crlf[2];
    return read_n(r->fd, crlf, 2) ? -1 : len;
}

/* Bytes/s of repeated redis GETs of a value of `bytes` bytes. */
static double redis_get_rate(redis *r, size_t bytes)
{
    uint8_t *val = malloc(bytes), *buf = malloc(bytes);
    memset(val, 0xA5, bytes);
    if (redis_set(r, "bench-value", val, bytes)) {
        free(val);
        free(buf);
        return 0;
    }
    uint64_t n = 0;
    double t0 = now_s(), t;
    while ((t = now_s()) - t0 < O.seconds) {
        if (redis_get(r, "bench-value", buf, bytes) != (long)bytes)
            break;
        n++;
    }
    free(val);
    free(buf);
    return (double)n * (double)bytes / (t - t0);
}

static double memcpy_rate(size_t bytes)
{
    uint8_t *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    uint64_t n = 0;
    double t0 = now_s(), t;
    volatile uint8_t sink = 0;
    while ((t = now_s()) - t0 < O.seconds) {
        memcpy(b, a, bytes);
        sink ^= b[n % bytes];
        n++;
    }
    (void)sink;
    free(a);
    free(b);
    return (double)n * (double)bytes / (t - t0);
}

/* ======================= GET: decompressed and raw ======================= */

#define GET_SEQ_TOKENS 8192
#define GET_TOKENS 1024

static void bench_get(dqc_client *c, redis *r)
{
    uint16_t *k = random_bf16((size_t)PUT_CHUNK * NV, 3), *v = random_bf16((size_t)PUT_CHUNK * NV, 4);
    dqc_seq s = {"bench", "get-seq", 7};
    dqc_delete(c, &s);
    for (uint64_t t = 0; t < GET_SEQ_TOKENS; t += PUT_CHUNK) {
        int rc = put_tokens(c, s, t, PUT_CHUNK, k, v);
        if (rc)
            die("PUT (GET setup)", c, rc);
    }
    free(k);
    free(v);

    /* Decompressed: 1024 tokens of K and V as BF16 per request. */
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = s, .start_token = 2048, .tokens = GET_TOKENS, .dtype = DQ_DTYPE_BF16};
    uint64_t n = 0, bytes = 0;
    double t0 = now_s(), t;
    while ((t = now_s()) - t0 < O.seconds) {
        int rc = dqc_get(c, &ga, &g);
        if (rc)
            die("GET", c, rc);
        bytes += 2 * g.bytes;
        n++;
    }
    double dec = (double)bytes / (t - t0);
    size_t req_bytes = 2 * g.bytes;
    dqc_get_result_free(&g);

    /* Raw: every window record of the layer. */
    dqc_raw_result raw = {0};
    n = bytes = 0;
    t0 = now_s();
    while ((t = now_s()) - t0 < O.seconds) {
        int rc = dqc_get_raw(c, &s, 0, 1, &raw);
        if (rc)
            die("GET_RAW", c, rc);
        bytes += raw.layers[0].records_bytes + 2 * raw.layers[0].tail_bytes;
        n++;
    }
    double rawr = (double)bytes / (t - t0);
    size_t raw_bytes = raw.layers[0].records_bytes + 2 * raw.layers[0].tail_bytes;
    dqc_raw_result_free(&raw);

    double mc_dec = memcpy_rate(req_bytes), mc_raw = memcpy_rate(raw_bytes);
    double rd_dec = r->fd >= 0 ? redis_get_rate(r, req_bytes) : 0,
           rd_raw = r->fd >= 0 ? redis_get_rate(r, raw_bytes) : 0;
    printf("GET     decompressed: %d tokens of K+V as BF16 (%zu bytes) per request, 1 connection\n", GET_TOKENS,
           req_bytes);
    printf("        daemon: %8.1f MB/s   memcpy: %9.1f MB/s (ratio %.4f)", dec / 1e6, mc_dec / 1e6, dec / mc_dec);
    if (rd_dec > 0)
        printf("   redis GET: %8.1f MB/s (ratio %.3f)", rd_dec / 1e6, dec / rd_dec);
    printf("\n");
    printf("GET_RAW window records of a %d-token layer (%zu bytes) per request, 1 connection\n", GET_SEQ_TOKENS,
           raw_bytes);
    printf("        daemon: %8.1f MB/s   memcpy: %9.1f MB/s (ratio %.4f)", rawr / 1e6, mc_raw / 1e6, rawr / mc_raw);
    if (rd_raw > 0)
        printf("   redis GET: %8.1f MB/s (ratio %.3f)", rd_raw / 1e6, rawr / rd_raw);
    printf("\n");
    if (r->fd < 0)
        printf("        (redis-server not found or disabled: no redis reference)\n");
}

/* ======================= ATTEND: latency vs in-process dq_attend ======================= */

typedef struct fill_worker {
    pthread_t th;
    int first, step;
    const uint16_t *k, *v;
    int rc;
} fill_worker;

static void *fill_main(void *arg)
{
    fill_worker *w = arg;
    dqc_client *c = connect_or_die();
    for (int i = w->first; i < O.attend_seqs && !w->rc; i += w->step) {
        char key[32];
        snprintf(key, sizeof key, "att-%d", i);
        dqc_seq s = {"bench", key, strlen(key)};
        dqc_delete(c, &s);
        for (uint64_t t = 0; t < O.attend_tokens && !w->rc; t += PUT_CHUNK) {
            uint64_t n = O.attend_tokens - t < PUT_CHUNK ? O.attend_tokens - t : PUT_CHUNK;
            w->rc = put_tokens(c, s, t, n, w->k, w->v);
            if (w->rc)
                fprintf(stderr, "bench_daemon: fill: %s\n", dqc_last_error(c));
        }
    }
    dqc_free(c);
    return NULL;
}

static void bench_attend(dqc_client *c)
{
    int S = O.attend_seqs;
    uint16_t *k = random_bf16((size_t)PUT_CHUNK * NV, 5), *v = random_bf16((size_t)PUT_CHUNK * NV, 6);
    double t0 = now_s();
    fill_worker fw[64];
    for (int i = 0; i < O.clients; i++) {
        fw[i] = (fill_worker){.first = i, .step = O.clients, .k = k, .v = v};
        pthread_create(&fw[i].th, NULL, fill_main, &fw[i]);
    }
    for (int i = 0; i < O.clients; i++) {
        pthread_join(fw[i].th, NULL);
        if (fw[i].rc)
            die("PUT (ATTEND setup)", NULL, fw[i].rc);
    }
    fprintf(stderr, "bench_daemon: filled %d sequences of %llu tokens in %.1f s\n", S,
            (unsigned long long)O.attend_tokens, now_s() - t0);
    free(k);
    free(v);

    /* The same containers in-process. */
    dq_profile p;
    dq_codec *codec = NULL;
    dq_workspace *ws = NULL;
    dq_profile_builtin("dq226", KVH, HD, &p);
    dq_codec_create(&p, NULL, &codec);
    dq_workspace_create(codec, &ws);
    dq_layer **layers = calloc((size_t)S, sizeof *layers);
    dqc_raw_result raw = {0};
    for (int i = 0; i < S; i++) {
        char key[32];
        snprintf(key, sizeof key, "att-%d", i);
        dqc_seq s = {"bench", key, strlen(key)};
        int rc = dqc_get_raw(c, &s, 0, 1, &raw);
        if (rc)
            die("GET_RAW (ATTEND setup)", c, rc);
        const dqc_raw_layer *rl = &raw.layers[0];
        rc = dq_layer_restore(codec, rl->records, rl->windows, rl->tail_k, rl->tail_v, rl->tail_tokens, &layers[i]);
        if (rc) {
            fprintf(stderr, "bench_daemon: dq_layer_restore: %s\n", dq_strerror(rc));
            exit(1);
        }
    }
    dqc_raw_result_free(&raw);

    float *q = malloc((size_t)S * QH * HD * sizeof *q);
    uint16_t *qb = random_bf16((size_t)S * QH * HD, 7);
    dq_convert(qb, DQ_DTYPE_BF16, q, DQ_DTYPE_F32, (size_t)S * QH * HD);
    free(qb);
    float *out = malloc((size_t)S * QH * HD * sizeof *out), *lse = malloc((size_t)S * QH * sizeof *lse);
    dqc_attend_item *items = calloc((size_t)S, sizeof *items);
    dq_attn_item *ri = calloc((size_t)S, sizeof *ri);
    char(*keys)[32] = calloc((size_t)S, sizeof *keys);
    for (int i = 0; i < S; i++) {
        snprintf(keys[i], sizeof keys[i], "att-%d", i);
        items[i] = (dqc_attend_item){
            .seq = {"bench", keys[i], strlen(keys[i])}, .layer = 0, .q = q + (size_t)i * QH * HD};
        ri[i] = (dq_attn_item){.layer = layers[i],
                               .q = q + (size_t)i * QH * HD,
                               .out = out + (size_t)i * QH * HD,
                               .lse = lse + (size_t)i * QH};
    }
    int batches[2] = {1, S};
    double *lat_d = malloc((size_t)O.attend_reps * sizeof *lat_d),
           *lat_r = malloc((size_t)O.attend_reps * sizeof *lat_r);
    printf("ATTEND  one layer, %llu-token sequences, %d q heads x %d (GQA over %d KV heads), q in f32\n",
           (unsigned long long)O.attend_tokens, QH, HD, KVH);
    for (int b = 0; b < (S > 1 ? 2 : 1); b++) {
        int nb = batches[b];
        dqc_attend_args aa = {.items = items,
                              .nitems = (size_t)nb,
                              .q_heads = QH,
                              .kv_heads = KVH,
                              .head_dim = HD,
                              .dtype = DQ_DTYPE_F32};
        /* --attend-reps requests, unless they take longer than --attend-seconds (3 at least). */
        int reps = 0;
        double start = now_s();
        for (int r = 0; r < O.attend_reps && (r < 3 || now_s() - start < O.attend_seconds); r++, reps++) {
            double t = now_s();
            int rc = dqc_attend(c, &aa, out, lse);
            lat_d[r] = now_s() - t;
            if (rc)
                die("ATTEND", c, rc);
            t = now_s();
            rc = dq_attend(codec, ws, QH, 1.0f / sqrtf((float)HD), ri, (size_t)nb);
            lat_r[r] = now_s() - t;
            if (rc) {
                fprintf(stderr, "bench_daemon: dq_attend: %s\n", dq_strerror(rc));
                exit(1);
            }
        }
        double d50 = percentile(lat_d, (size_t)reps, 50), d99 = percentile(lat_d, (size_t)reps, 99);
        double r50 = percentile(lat_r, (size_t)reps, 50), r99 = percentile(lat_r, (size_t)reps, 99);
        printf("        %2d seq/request: daemon p50 %9.3f ms p99 %9.3f ms   in-process dq_attend p50 %9.3f ms p99 "
               "%9.3f ms   ratio p50 %.3f p99 %.3f  (%d requests)\n",
               nb, d50 * 1e3, d99 * 1e3, r50 * 1e3, r99 * 1e3, d50 / r50, d99 / r99, reps);
    }
    for (int i = 0; i < S; i++) {
        dq_layer_free(layers[i]);
        dqc_delete(c, &items[i].seq);
    }
    free(layers);
    free(lat_d);
    free(lat_r);
    free(items);
    free(ri);
    free(keys);
    free(q);
    free(out);
    free(lse);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* ======================= request rates: PING and 4 KiB GET ======================= */

typedef struct rate_worker {
    pthread_t th;
    int get;
    double deadline;
    uint64_t n;
    int rc;
} rate_worker;

static void *rate_main(void *arg)
{
    rate_worker *w = arg;
    dqc_client *c = connect_or_die();
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {"bench", "get-seq", 7}, .start_token = 4000, .tokens = 1, .dtype = DQ_DTYPE_BF16};
    while (!w->rc && now_s() < w->deadline) {
        for (int i = 0; i < 64 && !w->rc; i++) {
            w->rc = w->get ? dqc_get(c, &ga, &g) : dqc_ping(c, NULL, 0);
            w->n++;
        }
    }
    if (w->rc)
        fprintf(stderr, "bench_daemon: %s: %s\n", w->get ? "GET" : "PING", dqc_last_error(c));
    dqc_get_result_free(&g);
    dqc_free(c);
    return NULL;
}

static double run_rate(int get)
{
    rate_worker ws[64];
    double t0 = now_s();
    for (int i = 0; i < O.clients; i++) {
        ws[i] = (rate_worker){.get = get, .deadline = t0 + O.seconds};
        pthread_create(&ws[i].th, NULL, rate_main, &ws[i]);
    }
    uint64_t n = 0;
    for (int i = 0; i < O.clients; i++) {
        pthread_join(ws[i].th, NULL);
        if (ws[i].rc)
            die(get ? "GET" : "PING", NULL, ws[i].rc);
        n += ws[i].n;
    }
    return (double)n / (now_s() - t0);
}

/* Parses `redis-benchmark --csv` output for the rps of one test. */
static double redis_benchmark_rps(uint16_t port, const char *test_name, const char *tests, uint64_t requests)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "redis-benchmark -h 127.0.0.1 -p %u -t %s -d 4096 -c %d -n %llu --csv 2>/dev/null", port,
             tests, O.clients, (unsigned long long)requests);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    char line[512];
    double rps = 0;
    char want[64];
    snprintf(want, sizeof want, "\"%s\",\"", test_name);
    while (fgets(line, sizeof line, p))
        if (strncmp(line, want, strlen(want)) == 0)
            rps = atof(line + strlen(want));
    pclose(p);
    return rps;
}

static void bench_rates(redis *r)
{
    double ping = run_rate(0), get = run_rate(1);
    double rping = 0, rget = 0;
    int have_rb = r->pid > 0 && system("command -v redis-benchmark >/dev/null 2>&1") == 0;
    if (have_rb) {
        uint64_t reqs = (uint64_t)(fmax(ping, get) * O.seconds);
        if (reqs < 10000)
            reqs = 10000;
        rping = redis_benchmark_rps(r->port, "PING_MBULK", "ping", reqs);
        rget = redis_benchmark_rps(r->port, "GET", "get", reqs);
    }
    printf("RATE    %d connections, one request in flight each\n", O.clients);
    printf("        PING: daemon %9.0f req/s", ping);
    if (rping > 0)
        printf("   redis-benchmark PING_MBULK %9.0f req/s (ratio %.3f)", rping, ping / rping);
    printf("\n        GET 4 KiB (1 token K+V, BF16): daemon %9.0f req/s", get);
    if (rget > 0)
        printf("   redis-benchmark GET -d 4096 %9.0f req/s (ratio %.3f)", rget, get / rget);
    printf("\n");
    if (!have_rb)
        printf("        (redis-benchmark not run: redis-server/redis-benchmark not found or disabled)\n");
}

/* ======================= main ======================= */

static void usage(void)
{
    printf("usage: bench_daemon [--dquantd PATH | --connect ADDR] [--quick] [--seconds S] [--clients C]\n"
           "                    [--attend-tokens T] [--attend-seqs S] [--attend-reps N] [--attend-seconds S]\n"
           "                    [--no-redis]\n"
           "  --dquantd PATH     start this daemon (default $DQUANTD) on a temporary socket + loopback port\n"
           "  --connect ADDR     use a running daemon instead (unix:/path or tcp://host:port)\n"
           "  --seconds S        duration of each throughput measurement (default 3)\n"
           "  --clients C        connections / threads for PUT, fill and rate tests (default 2 = cores)\n"
           "  --attend-tokens T  tokens per ATTEND sequence (default 32768)\n"
           "  --attend-seqs S    sequences per batched ATTEND (default 32)\n"
           "  --attend-reps N    ATTEND requests timed per batch size (default 20) ...\n"
           "  --attend-seconds S ... unless they take longer than S seconds (default 60; 3 requests at least)\n"
           "  --quick            --seconds 1 --attend-tokens 4096 --attend-seqs 4 --attend-reps 10\n"
           "  --no-redis         skip the redis references\n");
}

int main(int argc, char **argv)
{
    O.dquantd = getenv("DQUANTD");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dquantd") && val) {
            O.dquantd = val;
            i++;
        } else if (!strcmp(a, "--connect") && val) {
            O.connect = val;
            i++;
        } else if (!strcmp(a, "--seconds") && val) {
            O.seconds = atof(val);
            i++;
        } else if (!strcmp(a, "--clients") && val) {
            O.clients = atoi(val);
            i++;
        } else if (!strcmp(a, "--attend-tokens") && val) {
            O.attend_tokens = strtoull(val, NULL, 10);
            i++;
        } else if (!strcmp(a, "--attend-seqs") && val) {
            O.attend_seqs = atoi(val);
            i++;
        } else if (!strcmp(a, "--attend-reps") && val) {
            O.attend_reps = atoi(val);
            i++;
        } else if (!strcmp(a, "--attend-seconds") && val) {
            O.attend_seconds = atof(val);
            i++;
        } else if (!strcmp(a, "--quick")) {
            O.seconds = 1;
            O.attend_tokens = 4096;
            O.attend_seqs = 4;
            O.attend_reps = 10;
        } else if (!strcmp(a, "--no-redis")) {
            O.redis = 0;
        } else if (!strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            usage();
            return 2;
        }
    }
    if (O.seconds <= 0 || O.clients < 1 || O.clients > 64 || O.attend_tokens < 1 || O.attend_seqs < 1 ||
        O.attend_reps < 1) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (O.connect) {
        ADDR = O.connect;
    } else {
        if (!O.dquantd) {
            fprintf(stderr, "bench_daemon: give --dquantd PATH (or set $DQUANTD) or --connect ADDR\n");
            return 2;
        }
        char workers[16];
        snprintf(workers, sizeof workers, "%d", O.clients);
        const char *extra[] = {"--workers", workers, "--host-memory", "8G", NULL};
        const dqd_opts o = {.bin = O.dquantd, .tcp = 1, .extra = extra};
        if (dqd_start(&DAEMON, &o))
            return 1;
        ADDR = DAEMON.addr;
    }
    dqc_client *c = connect_or_die();
    dqc_server_info info;
    dqc_server(c, &info);
    printf("bench_daemon: dquantd %s (backend %s) at %s; %d client(s); %ld CPU(s)\n", info.server_version, info.backend,
           ADDR, O.clients, sysconf(_SC_NPROCESSORS_ONLN));
    register_model(c);
    redis rd;
    if (redis_start(&rd))
        rd.fd = -1;

    bench_put();
    bench_get(c, &rd);
    bench_rates(&rd);
    bench_attend(c);

    dqc_seq s = {"bench", "get-seq", 7};
    dqc_delete(c, &s);
    dqc_free(c);
    redis_stop(&rd);
    if (DAEMON.pid && dqd_stop(&DAEMON) != 0)
        fprintf(stderr, "bench_daemon: dquantd did not exit cleanly\n");
    return 0;
}
