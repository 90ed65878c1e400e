/* dquantd over its socket: the protocol as a client sees it. Each test starts its own daemon. */
#include <criterion/criterion.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dquant/error.h"
#include "dquant/types.h"
#include "frame.h"
#include "dqd_child.h"
#include "wire.h"

#define LAYERS 3
#define QH 8
#define KV 2
#define HD 64
#define N (KV * HD)

static dqd_daemon D;
static const char *const sock = D.sock;
static uint16_t tcp_port, http_port;

static uint16_t pick_port(int salt)
{
    /* below the kernel's ephemeral range (32768..), so no client socket holds it */
    return (uint16_t)(12000 + ((unsigned)getpid() * 13u + (unsigned)salt * 7919u) % 20000u);
}

/* Starts a daemon on a private Unix socket with extra flags (NULL-terminated). */
static void start(const char *const extra[])
{
    const dqd_opts o = {.stop_timeout_ms = 30000, .extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "dquantd did not come up");
}

static void stop(void)
{
    if (!D.pid)
        return;
    int st = dqd_stop(&D);
    cr_assert_eq(st, 0, "dquantd must exit 0 on SIGTERM (no leaks, no crash), got %d", st);
}

TestSuite(server, .fini = stop, .timeout = 120);

static int connect_daemon(void)
{
    int fd = wire_connect_unix(sock);
    cr_assert_geq(fd, 0);
    return fd;
}

static Dquant__Response *call(int fd, const Dquant__Request *req, const wire_payload *pl, uint8_t **out,
                              size_t *out_len)
{
    Dquant__Response *resp;
    cr_assert_eq(wire_call(fd, req, pl, &resp, out, out_len), 0, "no reply");
    return resp;
}

static void hello(int fd, const char *secret)
{
    int rc = wire_hello(fd, 1, secret);
    cr_assert_eq(rc, 0, "HELLO failed: %d", rc);
}

static void register_model(int fd)
{
    Dquant__ModelSpec spec = DQUANT__MODEL_SPEC__INIT;
    spec.name = "tiny";
    spec.layers = LAYERS;
    spec.q_heads = QH;
    spec.kv_heads = KV;
    spec.head_dim = HD;
    spec.profile_name = "dq226";
    Dquant__RegisterModel rm = DQUANT__REGISTER_MODEL__INIT;
    rm.model = &spec;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &rm;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_REGISTER_MODEL, "register failed: %d", wire_error(r));
    cr_assert_gt(r->register_model->profile.len, 0);
    cr_assert_gt(r->register_model->bits_per_value, 1.0);
    cr_assert_lt(r->register_model->bits_per_value, 4.0);
    dquant__response__free_unpacked(r, NULL);
}

static int session(void)
{
    int fd = connect_daemon();
    hello(fd, NULL);
    register_model(fd);
    return fd;
}

/* Normal(0, 1) draws (Box-Muller), like real K/V after rotation. */
static float *random_kv(size_t count, unsigned seed)
{
    float *x = malloc(count * sizeof(float));
    srand(seed);
    for (size_t i = 0; i < count; i++) {
        double u1 = ((double)rand() + 1.0) / ((double)RAND_MAX + 2.0), u2 = (double)rand() / RAND_MAX;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    return x;
}

static Dquant__SeqRef seqref(const char *ns, const char *key)
{
    Dquant__SeqRef s = DQUANT__SEQ_REF__INIT;
    s.ns = (char *)ns;
    s.key.data = (uint8_t *)key;
    s.key.len = strlen(key);
    return s;
}

/* A PUT request of k/v (f32 [nl, t, KV, HD]); req and its parts point into the struct. */
typedef struct put_msg {
    Dquant__SeqRef seq;
    wire_payload pl;
    Dquant__Tensor tk, tv;
    uint64_t shape[4];
    Dquant__Put p;
    Dquant__Request req;
} put_msg;

static void put_msg_init(put_msg *m, const char *key, uint32_t first, uint32_t nl, uint64_t start, uint64_t t,
                         const float *k, const float *v)
{
    memset(m, 0, sizeof *m);
    m->seq = seqref("ns", key);
    m->shape[0] = nl;
    m->shape[1] = t;
    m->shape[2] = KV;
    m->shape[3] = HD;
    size_t bytes = (size_t)(nl * t * N * sizeof(float));
    wire_tensor(&m->pl, &m->tk, DQUANT__DTYPE__F32, m->shape, 4, k, bytes);
    wire_tensor(&m->pl, &m->tv, DQUANT__DTYPE__F32, m->shape, 4, v, bytes);
    m->p = (Dquant__Put)DQUANT__PUT__INIT;
    m->p.seq = &m->seq;
    m->p.model = "tiny";
    m->p.start_token = start;
    m->p.first_layer = first;
    m->p.num_layers = nl;
    m->p.tokens = t;
    m->p.k = &m->tk;
    m->p.v = &m->tv;
    m->req = (Dquant__Request)DQUANT__REQUEST__INIT;
    m->req.body_case = DQUANT__REQUEST__BODY_PUT;
    m->req.put = &m->p;
}

/* PUT k/v (f32 [nl, t, KV, HD]); returns the reply's error code (0 on success) and *tokens. */
static int put(int fd, const char *key, uint32_t first, uint32_t nl, uint64_t start, uint64_t t, const float *k,
               const float *v, uint64_t *tokens)
{
    put_msg m;
    put_msg_init(&m, key, first, nl, start, t, k, v);
    Dquant__Response *r = call(fd, &m.req, &m.pl, NULL, NULL);
    wire_payload_free(&m.pl);
    int err = wire_error(r);
    if (!err) {
        cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_PUT);
        if (tokens)
            *tokens = r->put->tokens;
    }
    dquant__response__free_unpacked(r, NULL);
    return err;
}

/* GET f32 of layers [first, first+nl), all tokens; returns the error code. */
static int get_f32(int fd, const char *key, uint32_t first, uint32_t nl, uint64_t *tokens, float **k, float **v)
{
    Dquant__SeqRef seq = seqref("ns", key);
    Dquant__Get g = DQUANT__GET__INIT;
    g.seq = &seq;
    g.first_layer = first;
    g.num_layers = nl;
    g.format = DQUANT__GET_FORMAT__GET_F32;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &g;
    uint8_t *out;
    size_t out_len;
    Dquant__Response *r = call(fd, &req, NULL, &out, &out_len);
    int err = wire_error(r);
    if (!err) {
        Dquant__GetReply *gr = r->get;
        cr_assert_eq(gr->k->n_shape, 4);
        cr_assert_eq(gr->k->shape[0], nl);
        cr_assert_eq(gr->k->shape[2], KV);
        cr_assert_eq(gr->k->shape[3], HD);
        cr_assert_eq(gr->k->dtype, DQUANT__DTYPE__F32);
        *tokens = gr->tokens;
        size_t len = (size_t)gr->k->length;
        cr_assert_leq(gr->k->offset + len, out_len);
        cr_assert_leq(gr->v->offset + len, out_len);
        *k = malloc(len ? len : 1);
        *v = malloc(len ? len : 1);
        if (len) {
            memcpy(*k, out + gr->k->offset, len);
            memcpy(*v, out + gr->v->offset, len);
        }
    }
    free(out);
    dquant__response__free_unpacked(r, NULL);
    return err;
}

static double rel_rmse(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den ? den : 1));
}

static uint64_t stat_counter(int fd, const char *name)
{
    Dquant__Stats s = DQUANT__STATS__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &s;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_STATS);
    uint64_t v = 0;
    for (size_t i = 0; i < r->stats->n_counters; i++)
        if (strcmp(r->stats->counters[i]->key, name) == 0)
            v = r->stats->counters[i]->value;
    for (size_t i = 0; i < r->stats->n_gauges; i++)
        if (strcmp(r->stats->gauges[i]->key, name) == 0)
            v = (uint64_t)r->stats->gauges[i]->value;
    dquant__response__free_unpacked(r, NULL);
    return v;
}

static bool peer_closed(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0)
        return false;
    char c;
    return recv(fd, &c, 1, 0) == 0;
}

Test(server, hello_first)
{
    start(NULL);
    int fd = connect_daemon();
    Dquant__Stats s = DQUANT__STATS__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &s;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_UNAUTHENTICATED);
    cr_assert_str_eq(r->error->name, "UNAUTHENTICATED");
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd), "a request before HELLO closes the connection");
    close(fd);

    /* a HELLO of versions the server does not speak fails, and another may follow */
    fd = connect_daemon();
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 2;
    h.max_version = 3;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_VERSION);
    dquant__response__free_unpacked(r, NULL);

    h.min_version = 1;
    h.max_version = 2;
    r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_HELLO);
    cr_assert_eq(r->hello->version, 1);
    cr_assert_str_eq(r->hello->backend, "cpu");
    cr_assert_gt(r->hello->max_payload_bytes, 0);
    bool has_dq226 = false;
    for (size_t i = 0; i < r->hello->n_profiles; i++)
        has_dq226 |= strcmp(r->hello->profiles[i], "dq226") == 0;
    cr_assert(has_dq226);
    dquant__response__free_unpacked(r, NULL);
    cr_assert_eq(stat_counter(fd, "errors.UNAUTHENTICATED"), 1);

    /* a body this server does not know (field 99): UNSUPPORTED, and the connection stays usable */
    const uint8_t unknown[] = {0x98, 0x06, 0x01};
    uint8_t f[DQ_FRAME_HEADER_BYTES + sizeof unknown];
    dq_frame_write_header(f, unknown, sizeof unknown, 0, 42);
    memcpy(f + DQ_FRAME_HEADER_BYTES, unknown, sizeof unknown);
    cr_assert_eq(wire_send_all(fd, f, sizeof f), 0);
    uint64_t id;
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0);
    cr_assert_eq(id, 42);
    cr_assert_eq(wire_error(r), DQ_UNSUPPORTED);
    dquant__response__free_unpacked(r, NULL);
    cr_assert_eq(stat_counter(fd, "errors.UNSUPPORTED"), 1);
    close(fd);
}

Test(server, register_model_twice)
{
    start(NULL);
    int fd = session();
    register_model(fd); /* identical: existed */
    Dquant__ModelSpec spec = DQUANT__MODEL_SPEC__INIT;
    spec.name = "tiny";
    spec.layers = LAYERS + 1;
    spec.q_heads = QH;
    spec.kv_heads = KV;
    spec.head_dim = HD;
    Dquant__RegisterModel rm = DQUANT__REGISTER_MODEL__INIT;
    rm.model = &spec;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_REGISTER_MODEL;
    req.register_model = &rm;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_EXISTS);
    dquant__response__free_unpacked(r, NULL);
    spec.name = "odd";
    spec.head_dim = 48;
    r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_SHAPE);
    dquant__response__free_unpacked(r, NULL);
    close(fd);
}

Test(server, put_get_roundtrip)
{
    start(NULL);
    int fd = session();
    const size_t T = 200;
    float *k = random_kv(2 * T * N, 1), *v = random_kv(2 * T * N, 2);
    uint64_t tokens;
    cr_assert_eq(put(fd, "s1", 1, 2, 0, 100, k, v, &tokens), 0);
    cr_assert_eq(tokens, 100);
    /* second chunk: layers 1-2, tokens 100..200 (k/v layout [layer][token]) */
    float *k2 = malloc(2 * 100 * N * 4), *v2 = malloc(2 * 100 * N * 4);
    for (int l = 0; l < 2; l++) {
        memcpy(k2 + l * 100 * N, k + (l * T + 100) * N, 100 * N * 4);
        memcpy(v2 + l * 100 * N, v + (l * T + 100) * N, 100 * N * 4);
    }
    float *k1 = malloc(2 * 100 * N * 4), *v1 = malloc(2 * 100 * N * 4);
    for (int l = 0; l < 2; l++) {
        memcpy(k1 + l * 100 * N, k + l * T * N, 100 * N * 4);
        memcpy(v1 + l * 100 * N, v + l * T * N, 100 * N * 4);
    }
    /* redo the first chunk from k1/v1 on a fresh key so the layout is [layer][token] */
    cr_assert_eq(put(fd, "s2", 1, 2, 0, 100, k1, v1, &tokens), 0);
    cr_assert_eq(put(fd, "s2", 1, 2, 100, 100, k2, v2, &tokens), 0);
    cr_assert_eq(tokens, 200);

    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "s2", 1, 2, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, 200);
    double ek = rel_rmse(gk, k, 2 * T * N), ev = rel_rmse(gv, v, 2 * T * N);
    cr_assert_lt(ek, 0.35, "key error %f", ek);
    cr_assert_lt(ev, 0.45, "value error %f", ev);
    /* tokens 128..199 are still in the BF16 tail: within bf16 rounding */
    double et = rel_rmse(gk + 128 * N, k + 128 * N, 72 * N);
    cr_assert_lt(et, 0.01, "tail error %f", et);
    free(gk);
    free(gv);

    /* layer 0 was never written: an empty range */
    cr_assert_eq(get_f32(fd, "s2", 0, 1, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, 0);
    free(gk);
    free(gv);

    /* GET_RAW: one sealed window and a 72-token tail per layer */
    Dquant__SeqRef seq = seqref("ns", "s2");
    Dquant__Get g = DQUANT__GET__INIT;
    g.seq = &seq;
    g.first_layer = 1;
    g.num_layers = 2;
    g.format = DQUANT__GET_FORMAT__GET_RAW;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_GET;
    req.get = &g;
    uint8_t *out;
    size_t out_len;
    Dquant__Response *r = call(fd, &req, NULL, &out, &out_len);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_GET, "%d", wire_error(r));
    cr_assert_gt(r->get->profile.len, 0);
    cr_assert_eq(r->get->n_raw, 2);
    for (size_t i = 0; i < 2; i++) {
        Dquant__RawLayer *rl = r->get->raw[i];
        cr_assert_eq(rl->layer, 1 + i);
        cr_assert_eq(rl->tokens, 200);
        cr_assert_eq(rl->windows, 1);
        cr_assert_eq(rl->tail_k->shape[0], 72);
        cr_assert_eq(rl->tail_k->length, 72 * N * 2);
        cr_assert_leq(rl->tail_v->offset + rl->tail_v->length, out_len);
        cr_assert_gt(rl->records->length, 0);
    }
    free(out);
    dquant__response__free_unpacked(r, NULL);

    cr_assert_eq(stat_counter(fd, "tokens_stored"), 600, "s1: 2 x 100, s2: 2 x 200");
    cr_assert_lt(stat_counter(fd, "stored_bytes"), stat_counter(fd, "bf16_equivalent_bytes"));
    free(k);
    free(v);
    free(k1);
    free(v1);
    free(k2);
    free(v2);
    close(fd);
}

/* Frames of 1 MiB and up land in buffers kept from earlier frames (framebuf.h): the second large
 * PUT reuses the first one's buffer, and its data is its own. */
Test(server, large_frames_reuse_buffers)
{
    start(NULL);
    int fd = session();
    const size_t T = 1200; /* 1200 tokens x 128 values x 4 bytes x 2: a 1.2 MB payload */
    float *k = random_kv(2 * T * N, 11), *v = random_kv(2 * T * N, 12);
    uint64_t tokens;
    cr_assert_eq(put(fd, "big1", 0, 1, 0, T, k, v, &tokens), 0);
    cr_assert_eq(stat_counter(fd, "frame_buffers_reused"), 0);
    cr_assert_eq(stat_counter(fd, "frame_buffers_fresh"), 1);
    cr_assert_geq(stat_counter(fd, "frame_cache_bytes"), T * N * 8);
    cr_assert_eq(put(fd, "big2", 0, 1, 0, T, k + T * N, v + T * N, &tokens), 0);
    cr_assert_eq(stat_counter(fd, "frame_buffers_reused"), 1);
    cr_assert_eq(stat_counter(fd, "frame_buffers_fresh"), 1);
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "big2", 0, 1, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, T);
    double ek = rel_rmse(gk, k + T * N, T * N), ev = rel_rmse(gv, v + T * N, T * N);
    cr_assert_lt(ek, 0.35, "key error %f", ek);
    cr_assert_lt(ev, 0.45, "value error %f", ev);
    free(gk);
    free(gv);
    free(k);
    free(v);
    close(fd);
}

/* The frame of a PUT of t tokens of layer 0 (f32), ready to send in pieces. */
static uint8_t *put_frame(const char *key, uint64_t t, const float *k, const float *v, uint64_t id, size_t *len)
{
    put_msg m;
    put_msg_init(&m, key, 0, 1, 0, t, k, v);
    uint8_t *fr = wire_frame(&m.req, m.pl.p, m.pl.len, id, len);
    wire_payload_free(&m.pl);
    cr_assert_not_null(fr);
    return fr;
}

static void expect_put_reply(int fd, uint64_t id)
{
    uint64_t rid;
    Dquant__Response *r;
    cr_assert_eq(wire_recv(fd, &rid, &r, NULL, NULL), 0, "no reply to PUT %llu", (unsigned long long)id);
    cr_assert_eq(rid, id);
    cr_assert_eq(wire_error(r), 0, "PUT %llu failed: %d", (unsigned long long)id, wire_error(r));
    dquant__response__free_unpacked(r, NULL);
}

/* layer 0 of key decoded equals ref (n values each) exactly */
static void expect_same_layer(int fd, const char *key, uint64_t t, const float *rk, const float *rv)
{
    uint64_t tokens;
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, key, 0, 1, &tokens, &gk, &gv), 0, "GET %s", key);
    cr_assert_eq(tokens, t);
    cr_assert(memcmp(gk, rk, t * N * sizeof(float)) == 0 && memcmp(gv, rv, t * N * sizeof(float)) == 0,
              "%s decodes differently from the reference PUT", key);
    free(gk);
    free(gv);
}

#define FRAME3M_T 3000 /* tokens: 3000 x 128 values x 4 bytes x 2, a 3 MB payload */

/* Random k/v of FRAME3M_T tokens PUT as layer 0 of "ref", and what the daemon decodes of it. */
typedef struct ref_layer {
    float *k, *v, *rk, *rv;
} ref_layer;

static ref_layer ref_put(int fd, unsigned seed)
{
    ref_layer r = {random_kv(FRAME3M_T * N, seed), random_kv(FRAME3M_T * N, seed + 1), NULL, NULL};
    uint64_t tokens;
    cr_assert_eq(put(fd, "ref", 0, 1, 0, FRAME3M_T, r.k, r.v, &tokens), 0);
    cr_assert_eq(get_f32(fd, "ref", 0, 1, &tokens, &r.rk, &r.rv), 0);
    cr_assert_eq(tokens, FRAME3M_T);
    cr_assert_lt(rel_rmse(r.rk, r.k, FRAME3M_T * N), 0.35);
    return r;
}

static void ref_free(ref_layer *r)
{
    free(r->k);
    free(r->v);
    free(r->rk);
    free(r->rv);
}

/* Large frames are read by the I/O threads (io_threads, default 4): four connections' 3 MB PUTs
 * sent side by side in 256 KiB pieces, and one sent with pauses longer than a thread waits for
 * data (the loop takes the connection back, then a thread again), all decode exactly as the same
 * PUT sent in one write; a client that vanishes in the middle of a frame changes nothing. */
Test(server, large_frames_read_by_io_threads)
{
    start(NULL);
    int fd = session();
    const size_t T = FRAME3M_T;
    ref_layer r = ref_put(fd, 21);
    const float *k = r.k, *v = r.v, *rk = r.rk, *rv = r.rv;
    uint64_t tokens;
    const uint64_t offloaded0 = stat_counter(fd, "frame_reads_offloaded");
    cr_assert_geq(offloaded0, 1, "the reference PUT's frame was read by an I/O thread");

    /* four connections side by side */
    enum { C = 4 };
    int fds[C];
    uint8_t *fr[C];
    size_t len[C], off[C];
    char key[C][16];
    for (int i = 0; i < C; i++) {
        fds[i] = session();
        snprintf(key[i], sizeof key[i], "side%d", i);
        fr[i] = put_frame(key[i], T, k, v, 100 + (uint64_t)i, &len[i]);
        off[i] = 0;
    }
    for (bool more = true; more;) {
        more = false;
        for (int i = 0; i < C; i++) {
            size_t n = len[i] - off[i] < (256u << 10) ? len[i] - off[i] : (256u << 10);
            if (!n)
                continue;
            cr_assert_eq(wire_send_all(fds[i], fr[i] + off[i], n), 0);
            off[i] += n;
            more = true;
        }
    }
    for (int i = 0; i < C; i++) {
        expect_put_reply(fds[i], 100 + (uint64_t)i);
        expect_same_layer(fd, key[i], T, rk, rv);
        free(fr[i]);
        close(fds[i]);
    }

    /* pauses: 1.5 MB, 50 ms, 1 MB, 50 ms, the rest */
    size_t n;
    uint8_t *slow = put_frame("slow", T, k, v, 7, &n);
    cr_assert_eq(wire_send_all(fd, slow, 1500000), 0);
    usleep(50000);
    cr_assert_eq(wire_send_all(fd, slow + 1500000, 1000000), 0);
    usleep(50000);
    cr_assert_eq(wire_send_all(fd, slow + 2500000, n - 2500000), 0);
    expect_put_reply(fd, 7);
    expect_same_layer(fd, "slow", T, rk, rv);
    cr_assert_geq(stat_counter(fd, "frame_reads_offloaded"), offloaded0 + C + 2,
                  "each connection's frame, and the slow one twice");

    /* a client gone in the middle of a frame: nothing stored, the daemon goes on */
    int gone = session();
    cr_assert_eq(wire_send_all(gone, slow, n / 2), 0);
    usleep(20000);
    close(gone);
    usleep(50000);
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "gone", 0, 1, &tokens, &gk, &gv), DQ_NOT_FOUND);
    cr_assert_eq(put(fd, "after", 0, 1, 0, T, k, v, &tokens), 0);
    expect_same_layer(fd, "after", T, rk, rv);
    free(slow);
    ref_free(&r);
    close(fd);
}

/* --io-threads 0: the event loop reads every frame, in pieces as they come */
Test(server, large_frames_without_io_threads)
{
    const char *const extra[] = {"--io-threads", "0", NULL};
    start(extra);
    int fd = session();
    const size_t T = FRAME3M_T;
    ref_layer r = ref_put(fd, 23);
    const float *k = r.k, *v = r.v, *rk = r.rk, *rv = r.rv;
    size_t n;
    uint8_t *slow = put_frame("slow", T, k, v, 9, &n);
    cr_assert_eq(wire_send_all(fd, slow, n / 3), 0);
    usleep(20000);
    cr_assert_eq(wire_send_all(fd, slow + n / 3, n - n / 3), 0);
    expect_put_reply(fd, 9);
    expect_same_layer(fd, "slow", T, rk, rv);
    cr_assert_eq(stat_counter(fd, "frame_reads_offloaded"), 0);
    free(slow);
    ref_free(&r);
    close(fd);
}

Test(server, bad_puts_are_refused_and_counted)
{
    start(NULL);
    int fd = session();
    float *k = random_kv(2 * 16 * N, 3), *v = random_kv(2 * 16 * N, 4);
    uint64_t tokens;
    cr_assert_eq(put(fd, "s", 0, 2, 0, 16, k, v, &tokens), 0);
    cr_assert_eq(put(fd, "s", 0, 2, 0, 16, k, v, &tokens), DQ_ORDER, "start_token must equal the length");
    cr_assert_eq(put(fd, "s", 0, 2, 17, 16, k, v, &tokens), DQ_ORDER);
    k[2 * 16 * N - 1] = INFINITY;
    cr_assert_eq(put(fd, "s", 0, 2, 16, 16, k, v, &tokens), DQ_NONFINITE);
    k[2 * 16 * N - 1] = NAN;
    cr_assert_eq(put(fd, "t", 0, 2, 0, 16, k, v, &tokens), DQ_NONFINITE);
    k[2 * 16 * N - 1] = 0;
    /* NONFINITE wins, as if the whole input were checked before any layer: over an earlier layer's
     * RANGE, and over a RANGE in K of the same layer (lib's dq_layer_append checks K first) */
    const float v_last = v[2 * 16 * N - 1];
    k[5] = 1e30f;
    cr_assert_eq(put(fd, "s", 0, 2, 16, 16, k, v, &tokens), DQ_RANGE);
    v[2 * 16 * N - 1] = NAN;
    cr_assert_eq(put(fd, "s", 0, 2, 16, 16, k, v, &tokens), DQ_NONFINITE, "NaN in v of layer 1, RANGE in layer 0");
    k[5] = 0;
    k[16 * N + 3] = -1e30f;
    cr_assert_eq(put(fd, "s", 0, 2, 16, 16, k, v, &tokens), DQ_NONFINITE, "NaN in v and RANGE in k of layer 1");
    k[16 * N + 3] = 0;
    v[2 * 16 * N - 1] = v_last;
    cr_assert_eq(put(fd, "s", 2, 2, 16, 16, k, v, &tokens), DQ_OUT_OF_BOUNDS, "layers 2..3 of 3");

    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "s", 0, 2, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, 16, "failed PUTs left no trace");
    free(gk);
    free(gv);
    cr_assert_eq(get_f32(fd, "t", 0, 2, &tokens, &gk, &gv), DQ_NOT_FOUND, "a failed first PUT creates nothing");

    /* unknown model, lying tensors */
    Dquant__SeqRef seq = seqref("ns", "u");
    wire_payload pl = {0};
    Dquant__Tensor tk, tv;
    uint64_t shape[4] = {1, 16, KV, HD};
    wire_tensor(&pl, &tk, DQUANT__DTYPE__F32, shape, 4, k, 16 * N * 4);
    wire_tensor(&pl, &tv, DQUANT__DTYPE__F32, shape, 4, v, 16 * N * 4);
    Dquant__Put p = DQUANT__PUT__INIT;
    p.seq = &seq;
    p.model = "nosuch";
    p.num_layers = 1;
    p.tokens = 16;
    p.k = &tk;
    p.v = &tv;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &p;
    Dquant__Response *r = call(fd, &req, &pl, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_NOT_FOUND);
    dquant__response__free_unpacked(r, NULL);
    p.model = "tiny";
    tv.offset = pl.len; /* lies: points past the payload */
    r = call(fd, &req, &pl, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_OUT_OF_BOUNDS);
    dquant__response__free_unpacked(r, NULL);
    tv.offset = tk.offset;
    uint64_t wrong[4] = {1, 16, 4, 32};
    tk.shape = wrong;
    tv.shape = wrong;
    r = call(fd, &req, &pl, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_SHAPE);
    dquant__response__free_unpacked(r, NULL);
    wire_payload_free(&pl);

    cr_assert_eq(stat_counter(fd, "errors.ORDER"), 2);
    cr_assert_eq(stat_counter(fd, "errors.NONFINITE"), 4);
    cr_assert_eq(stat_counter(fd, "errors.RANGE"), 1);
    cr_assert_eq(stat_counter(fd, "errors.SHAPE"), 1);
    cr_assert_eq(stat_counter(fd, "errors.put"), 11);
    free(k);
    free(v);
    close(fd);
}

Test(server, multi_layer_put_is_all_or_nothing)
{
    start(NULL);
    int fd = session();
    float *k = random_kv(2 * 128 * N, 5), *v = random_kv(2 * 128 * N, 6);
    uint64_t tokens;
    cr_assert_eq(put(fd, "a", 0, 2, 0, 10, k, v, &tokens), 0);
    float *k0, *v0;
    cr_assert_eq(get_f32(fd, "a", 0, 2, &tokens, &k0, &v0), 0);

    /* Layer 1 of the next PUT cannot be encoded (beyond fp16 metadata) once its window seals,
     * after layer 0 has been appended: layer 0 must be rolled back. */
    for (size_t i = 0; i < 118 * N; i++)
        k[118 * N + i] = (i & 1) ? 3e38f : -3e38f;
    int err = put(fd, "a", 0, 2, 10, 118, k, v, &tokens);
    cr_assert_neq(err, 0, "an unencodable layer fails the whole PUT");
    float *k1, *v1;
    cr_assert_eq(get_f32(fd, "a", 0, 2, &tokens, &k1, &v1), 0);
    cr_assert_eq(tokens, 10);
    cr_assert_eq(memcmp(k0, k1, 2 * 10 * N * 4), 0);
    cr_assert_eq(memcmp(v0, v1, 2 * 10 * N * 4), 0);
    cr_assert_eq(put(fd, "b", 0, 2, 0, 128, k, v, &tokens), err);
    cr_assert_eq(get_f32(fd, "b", 0, 2, &tokens, &k1, &v1), DQ_NOT_FOUND);
    free(k0);
    free(v0);
    free(k1);
    free(v1);
    free(k);
    free(v);
    close(fd);
}

/* softmax(scale q.k) v per query head over decoded f32 K/V [T, KV, HD] */
static void reference_attention(const float *q, const float *k, const float *v, size_t T, float scale, float *out,
                                float *lse)
{
    for (int h = 0; h < QH; h++) {
        int g = h / (QH / KV);
        double mx = -INFINITY;
        double *s = malloc(T * sizeof(double));
        for (size_t t = 0; t < T; t++) {
            double d = 0;
            for (int j = 0; j < HD; j++)
                d += (double)q[h * HD + j] * k[(t * KV + g) * HD + j];
            s[t] = d * scale;
            if (s[t] > mx)
                mx = s[t];
        }
        double sum = 0;
        for (size_t t = 0; t < T; t++)
            sum += exp(s[t] - mx);
        for (int j = 0; j < HD; j++) {
            double acc = 0;
            for (size_t t = 0; t < T; t++)
                acc += exp(s[t] - mx) * v[(t * KV + g) * HD + j];
            out[h * HD + j] = (float)(acc / sum);
        }
        lse[h] = (float)(mx + log(sum));
        free(s);
    }
}

Test(server, attend_matches_decoded_cache)
{
    start(NULL);
    int fd = session();
    const size_t T = 300;
    float *k = random_kv(T * N, 7), *v = random_kv(T * N, 8);
    uint64_t tokens;
    cr_assert_eq(put(fd, "x", 2, 1, 0, T, k, v, &tokens), 0);
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "x", 2, 1, &tokens, &gk, &gv), 0);

    float *q = random_kv(2 * QH * HD, 9);
    float ak[N], av[N];
    for (int i = 0; i < N; i++) {
        ak[i] = 0.5f;
        av[i] = -0.25f;
    }
    Dquant__SeqRef seq = seqref("ns", "x");
    wire_payload pl = {0};
    Dquant__Tensor tq0, tq1, tak, tav;
    uint64_t qs[2] = {QH, HD}, kvs[3] = {1, KV, HD};
    wire_tensor(&pl, &tq0, DQUANT__DTYPE__F32, qs, 2, q, QH * HD * 4);
    wire_tensor(&pl, &tq1, DQUANT__DTYPE__F32, qs, 2, q + QH * HD, QH * HD * 4);
    wire_tensor(&pl, &tak, DQUANT__DTYPE__F32, kvs, 3, ak, sizeof ak);
    wire_tensor(&pl, &tav, DQUANT__DTYPE__F32, kvs, 3, av, sizeof av);
    Dquant__AttendItem i0 = DQUANT__ATTEND_ITEM__INIT, i1 = DQUANT__ATTEND_ITEM__INIT;
    i0.seq = &seq;
    i0.layer = 2;
    i0.q = &tq0;
    i1.seq = &seq;
    i1.layer = 0; /* never written: out 0, lse -inf */
    i1.q = &tq1;
    Dquant__AttendItem *items[2] = {&i0, &i1};
    Dquant__Attend a = DQUANT__ATTEND__INIT;
    a.items = items;
    a.n_items = 2;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_ATTEND;
    req.attend = &a;
    uint8_t *out;
    size_t out_len;
    Dquant__Response *r = call(fd, &req, &pl, &out, &out_len);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_ATTEND, "%d", wire_error(r));
    cr_assert_eq(r->attend->out->shape[0], 2);
    cr_assert_eq(r->attend->out->shape[1], QH);
    const float *o = (const float *)(out + r->attend->out->offset);
    const float *lse = (const float *)(out + r->attend->lse->offset);
    float ro[QH * HD], rl[QH];
    reference_attention(q, gk, gv, T, 1.0f / sqrtf(HD), ro, rl);
    double e = rel_rmse(o, ro, QH * HD);
    cr_assert_lt(e, 1e-3, "attention on containers vs decoded cache: %g", e);
    for (int h = 0; h < QH; h++)
        cr_assert_lt(fabsf(lse[h] - rl[h]), 1e-3f, "lse head %d: %f vs %f", h, lse[h], rl[h]);
    for (int i = 0; i < QH * HD; i++)
        cr_assert_eq(o[QH * HD + i], 0.0f);
    cr_assert(isinf(lse[QH]) && lse[QH] < 0);
    free(out);
    dquant__response__free_unpacked(r, NULL);

    /* with an appended token: the layer grows by one */
    i0.append_k = &tak;
    i0.append_v = &tav;
    a.n_items = 1;
    r = call(fd, &req, &pl, &out, &out_len);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_ATTEND, "%d", wire_error(r));
    free(out);
    dquant__response__free_unpacked(r, NULL);
    free(gk);
    free(gv);
    cr_assert_eq(get_f32(fd, "x", 2, 1, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, T + 1);
    cr_assert_eq(gk[T * N], 0.5f);
    cr_assert_eq(gv[T * N + 5], -0.25f);

    /* two appends to one layer in one batch are refused, nothing appended */
    i1.layer = 2;
    i1.append_k = &tak;
    i1.append_v = &tav;
    a.n_items = 2;
    r = call(fd, &req, &pl, &out, &out_len);
    cr_assert_eq(wire_error(r), DQ_INVALID_ARGUMENT);
    free(out);
    dquant__response__free_unpacked(r, NULL);
    free(gk);
    free(gv);
    cr_assert_eq(get_f32(fd, "x", 2, 1, &tokens, &gk, &gv), 0);
    cr_assert_eq(tokens, T + 1);

    wire_payload_free(&pl);
    free(gk);
    free(gv);
    free(q);
    free(k);
    free(v);
    close(fd);
}

Test(server, compress_decompress_roundtrip)
{
    start(NULL);
    int fd = session();
    const size_t T = 300;
    float *x = random_kv(T * N, 10);
    for (uint32_t kind = 0; kind < 2; kind++) {
        wire_payload pl = {0};
        Dquant__Tensor tx;
        uint64_t xs[3] = {T, KV, HD};
        wire_tensor(&pl, &tx, DQUANT__DTYPE__F32, xs, 3, x, T * N * 4);
        Dquant__Compress c = DQUANT__COMPRESS__INIT;
        c.profile_name = "dq226";
        c.kv_heads = KV;
        c.head_dim = HD;
        c.kind = kind;
        c.x = &tx;
        Dquant__Request req = DQUANT__REQUEST__INIT;
        req.body_case = DQUANT__REQUEST__BODY_COMPRESS;
        req.compress = &c;
        uint8_t *out;
        size_t out_len;
        Dquant__Response *r = call(fd, &req, &pl, &out, &out_len);
        wire_payload_free(&pl);
        cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_COMPRESS, "%d", wire_error(r));
        Dquant__CompressReply *cr = r->compress;
        cr_assert_eq(cr->tokens, T);
        cr_assert_eq(cr->means->shape[0], kind == 0 ? 3u : 0u, "keys: one mean block per 128 tokens");
        cr_assert_lt(cr->bits_per_value, 4.0);

        Dquant__Tensor tm, tr;
        wire_tensor(&pl, &tm, DQUANT__DTYPE__RAW, cr->means->shape, cr->means->n_shape, out + cr->means->offset,
                    cr->means->length);
        wire_tensor(&pl, &tr, DQUANT__DTYPE__RAW, cr->records->shape, cr->records->n_shape, out + cr->records->offset,
                    cr->records->length);
        Dquant__Decompress d = DQUANT__DECOMPRESS__INIT;
        d.profile = cr->profile;
        d.kind = kind;
        d.tokens = T;
        d.means = kind == 0 ? &tm : NULL;
        d.records = &tr;
        d.out_dtype = DQUANT__DTYPE__F32;
        Dquant__Request req2 = DQUANT__REQUEST__INIT;
        req2.body_case = DQUANT__REQUEST__BODY_DECOMPRESS;
        req2.decompress = &d;
        uint8_t *out2;
        size_t out2_len;
        Dquant__Response *r2 = call(fd, &req2, &pl, &out2, &out2_len);
        cr_assert_eq(r2->body_case, DQUANT__RESPONSE__BODY_DECOMPRESS, "%d", wire_error(r2));
        cr_assert_eq(r2->decompress->x->length, T * N * 4);
        double e = rel_rmse((const float *)(out2 + r2->decompress->x->offset), x, T * N);
        cr_assert_lt(e, kind ? 0.45 : 0.35, "kind %u error %f", kind, e);

        /* a corrupted profile is refused */
        uint8_t bad[512];
        memcpy(bad, cr->profile.data, cr->profile.len);
        bad[cr->profile.len / 2] ^= 0x55;
        d.profile.data = bad;
        Dquant__Response *r3 = call(fd, &req2, &pl, NULL, NULL);
        cr_assert_lt(wire_error(r3), 0);
        dquant__response__free_unpacked(r3, NULL);

        free(out);
        free(out2);
        dquant__response__free_unpacked(r, NULL);
        dquant__response__free_unpacked(r2, NULL);
        wire_payload_free(&pl);
    }
    free(x);
    close(fd);
}

static int seq_op(int fd, Dquant__Request__BodyCase which, const char *key)
{
    Dquant__SeqRef seq = seqref("ns", key);
    Dquant__Delete del = DQUANT__DELETE__INIT;
    Dquant__Pin pin = DQUANT__PIN__INIT;
    Dquant__Unpin unpin = DQUANT__UNPIN__INIT;
    del.seq = pin.seq = unpin.seq = &seq;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = which;
    if (which == DQUANT__REQUEST__BODY_DELETE)
        req.delete_ = &del;
    else if (which == DQUANT__REQUEST__BODY_PIN)
        req.pin = &pin;
    else
        req.unpin = &unpin;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    int err = wire_error(r);
    if (!err)
        cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_OK);
    dquant__response__free_unpacked(r, NULL);
    return err;
}

Test(server, delete_and_namespaces)
{
    start(NULL);
    int fd = session();
    float *k = random_kv(8 * N, 1), *v = random_kv(8 * N, 2);
    uint64_t tokens;
    cr_assert_eq(put(fd, "d", 0, 1, 0, 8, k, v, &tokens), 0);
    cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_PIN, "nosuch"), DQ_NOT_FOUND);
    cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_PIN, "d"), 0);
    cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_UNPIN, "d"), 0);
    cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_DELETE, "d"), 0);
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "d", 0, 1, &tokens, &gk, &gv), DQ_NOT_FOUND);
    cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_DELETE, "d"), DQ_NOT_FOUND);
    cr_assert_eq(put(fd, "d", 0, 1, 0, 8, k, v, &tokens), 0, "the key can be used again");
    free(k);
    free(v);
    close(fd);
}

Test(server, eviction_under_budget)
{
    const char *extra[] = {"--host-memory", "4M", NULL};
    start(extra);
    int fd = session();
    const size_t T = 256;
    float *k = random_kv(T * N, 1), *v = random_kv(T * N, 2);
    uint64_t tokens;
    char key[16];
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof key, "e%d", i);
        cr_assert_eq(put(fd, key, 0, 1, 0, T, k, v, &tokens), 0, "%s", key);
        if (i == 0)
            cr_assert_eq(seq_op(fd, DQUANT__REQUEST__BODY_PIN, key), 0);
    }
    cr_assert_gt(stat_counter(fd, "evictions"), 0, "60 x ~90 KB does not fit in 4 MB");
    cr_assert_leq(stat_counter(fd, "host_memory_used"), 4u << 20);
    float *gk, *gv;
    cr_assert_eq(get_f32(fd, "e0", 0, 1, &tokens, &gk, &gv), 0, "pinned: never evicted");
    free(gk);
    free(gv);
    cr_assert_eq(get_f32(fd, "e1", 0, 1, &tokens, &gk, &gv), DQ_NOT_FOUND, "least recently used: evicted");
    cr_assert_eq(get_f32(fd, "e59", 0, 1, &tokens, &gk, &gv), 0, "most recent: kept");
    free(gk);
    free(gv);

    /* a PUT larger than the whole budget fails and evicts nothing */
    uint64_t ev = stat_counter(fd, "evictions");
    uint64_t seqs = stat_counter(fd, "sequences");
    const size_t BIG = 20000; /* 3 layers x 156 windows: more than the whole budget */
    float *bk = random_kv(3 * BIG * N, 3), *bv = random_kv(3 * BIG * N, 4);
    cr_assert_eq(put(fd, "big", 0, 3, 0, BIG, bk, bv, &tokens), DQ_RESOURCE_EXHAUSTED);
    cr_assert_eq(stat_counter(fd, "evictions"), ev);
    cr_assert_eq(stat_counter(fd, "sequences"), seqs);
    cr_assert_eq(get_f32(fd, "big", 0, 1, &tokens, &gk, &gv), DQ_NOT_FOUND);
    free(bk);
    free(bv);
    free(k);
    free(v);
    close(fd);
}

Test(server, garbage_closes_the_connection)
{
    start(NULL);
    int fd = connect_daemon();
    const char junk[] = "GET / HTTP/1.1\r\nHost: dquant\r\n\r\nand more garbage that is no frame at all";
    cr_assert_eq(wire_send_all(fd, junk, sizeof junk), 0);
    uint64_t id;
    Dquant__Response *r;
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0, "an error reply before the close");
    cr_assert_eq(wire_error(r), DQ_PROTOCOL);
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd));
    close(fd);

    /* a good frame with a bad CRC */
    fd = connect_daemon();
    hello(fd, NULL);
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    size_t flen;
    uint8_t *f = wire_frame(&req, NULL, 0, 77, &flen);
    f[12] ^= 0xff;
    cr_assert_eq(wire_send_all(fd, f, flen), 0);
    free(f);
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0);
    cr_assert_eq(wire_error(r), DQ_CORRUPT);
    cr_assert_eq(id, 77);
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd));
    close(fd);

    /* other clients are unaffected */
    fd = connect_daemon();
    hello(fd, NULL);
    cr_assert_eq(stat_counter(fd, "protocol_closes"), 2);
    close(fd);
}

Test(server, lengths_over_limits)
{
    const char *extra[] = {"--max-payload", "64K", NULL};
    start(extra);
    int fd = connect_daemon();
    hello(fd, NULL);
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    size_t flen;
    uint8_t *f = wire_frame(&req, NULL, 0, 5, &flen);
    uint8_t hdr[DQ_FRAME_HEADER_BYTES + 64];
    memcpy(hdr, f, flen);
    /* claim a 1 TB payload: refused from the header alone, nothing allocated */
    uint64_t huge = 1ull << 40;
    for (int i = 0; i < 8; i++)
        hdr[16 + i] = (uint8_t)(huge >> (8 * i));
    cr_assert_eq(wire_send_all(fd, hdr, flen), 0);
    free(f);
    uint64_t id;
    Dquant__Response *r;
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0);
    cr_assert_eq(wire_error(r), DQ_TOO_LARGE);
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd));
    close(fd);
}

Test(server, pipelined_replies_in_order_with_backpressure)
{
    const char *extra[] = {"--max-output-queue", "4K", "--max-inflight", "4", NULL};
    start(extra);
    int fd = session();
    const size_t T = 64;
    float *k = random_kv(T * N, 1), *v = random_kv(T * N, 2);
    uint64_t tokens;
    cr_assert_eq(put(fd, "p", 0, 1, 0, T, k, v, &tokens), 0);

    /* 200 GETs (64 KB each) without reading: the daemon must stop reading, not buffer 12 MB */
    Dquant__SeqRef seq = seqref("ns", "p");
    Dquant__Get g = DQUANT__GET__INIT;
    g.seq = &seq;
    g.num_layers = 1;
    g.format = DQUANT__GET_FORMAT__GET_F32;
    Dquant__Ping ping = DQUANT__PING__INIT;
    Dquant__Request rg = DQUANT__REQUEST__INIT, rp = DQUANT__REQUEST__INIT;
    rg.body_case = DQUANT__REQUEST__BODY_GET;
    rg.get = &g;
    rp.body_case = DQUANT__REQUEST__BODY_PING;
    rp.ping = &ping;
    int sent = 0;
    for (int i = 0; i < 200; i++) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        if (poll(&pfd, 1, 200) <= 0)
            break; /* our send buffer is full: the daemon stopped reading */
        cr_assert_eq(wire_send(fd, (i % 3) ? &rg : &rp, NULL, 5000 + (uint64_t)i), 0);
        sent++;
    }
    cr_assert_gt(sent, 8);
    for (int i = 0; i < sent; i++) {
        uint64_t id;
        Dquant__Response *r;
        uint8_t *out;
        size_t out_len;
        cr_assert_eq(wire_recv(fd, &id, &r, &out, &out_len), 0, "reply %d", i);
        cr_assert_eq(id, 5000 + (uint64_t)i, "replies come back in request order");
        cr_assert_eq(r->body_case, (i % 3) ? DQUANT__RESPONSE__BODY_GET : DQUANT__RESPONSE__BODY_PONG);
        if (i % 3)
            cr_assert_eq(out_len, 2 * T * N * 4);
        free(out);
        dquant__response__free_unpacked(r, NULL);
    }
    cr_assert_gt(stat_counter(fd, "backpressure_pauses"), 0);
    free(k);
    free(v);
    close(fd);
}

Test(server, vanishing_clients)
{
    start(NULL);
    int fd = session();
    close(fd);
    /* clients that vanish mid-frame and right after a request */
    const size_t T = 512;
    float *k = random_kv(LAYERS * T * N, 1), *v = random_kv(LAYERS * T * N, 2);
    for (int round = 0; round < 4; round++) {
        fd = connect_daemon();
        hello(fd, NULL);
        Dquant__SeqRef seq = seqref("ns", "gone");
        wire_payload pl = {0};
        Dquant__Tensor tk, tv;
        uint64_t shape[4] = {LAYERS, T, KV, HD};
        wire_tensor(&pl, &tk, DQUANT__DTYPE__F32, shape, 4, k, LAYERS * T * N * 4);
        wire_tensor(&pl, &tv, DQUANT__DTYPE__F32, shape, 4, v, LAYERS * T * N * 4);
        Dquant__Put p = DQUANT__PUT__INIT;
        p.seq = &seq;
        p.model = "tiny";
        p.num_layers = LAYERS;
        p.tokens = T;
        p.start_token = 0;
        p.k = &tk;
        p.v = &tv;
        Dquant__Request req = DQUANT__REQUEST__INIT;
        req.body_case = DQUANT__REQUEST__BODY_PUT;
        req.put = &p;
        size_t flen;
        uint8_t *f = wire_frame(&req, pl.p, pl.len, 9, &flen);
        size_t cut = round % 2 ? flen / 2 : flen;
        wire_send_all(fd, f, cut);
        close(fd);
        free(f);
        wire_payload_free(&pl);
    }
    fd = connect_daemon();
    hello(fd, NULL);
    uint64_t tokens;
    float *gk, *gv;
    int err = get_f32(fd, "gone", 0, 1, &tokens, &gk, &gv);
    if (err == 0) {
        cr_assert_eq(tokens, T, "only whole PUTs apply, and only the first of the same range");
        free(gk);
        free(gv);
    } else {
        cr_assert_eq(err, DQ_NOT_FOUND);
    }
    free(k);
    free(v);
    close(fd);
}

Test(server, secret_on_tcp)
{
    tcp_port = pick_port(1);
    static char listen_tcp[64];
    snprintf(listen_tcp, sizeof listen_tcp, "tcp://127.0.0.1:%u", tcp_port);
    const char *extra[] = {"--listen", listen_tcp, "--secret", "open sesame", NULL};
    start(extra);
    /* start() waits for the Unix socket; the TCP listener may come up a moment later (CI under ASan) */
    int fd = wire_connect_tcp(tcp_port);
    for (int i = 0; i < 200 && fd < 0; i++) {
        usleep(10000);
        fd = wire_connect_tcp(tcp_port);
    }
    cr_assert_geq(fd, 0);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.secret.data = (uint8_t *)"open sesame?";
    h.secret.len = 12;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    Dquant__Response *r = call(fd, &req, NULL, NULL, NULL);
    cr_assert_eq(wire_error(r), DQ_UNAUTHENTICATED);
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd), "a wrong secret closes the connection");
    close(fd);

    fd = wire_connect_tcp(tcp_port);
    hello(fd, "open sesame");
    cr_assert_eq(stat_counter(fd, "auth_failures"), 1);
    close(fd);

    fd = connect_daemon(); /* the Unix socket needs no secret */
    hello(fd, NULL);
    close(fd);
}

static char *http_get(uint16_t port, const char *request)
{
    int fd = wire_connect_tcp(port);
    cr_assert_geq(fd, 0);
    cr_assert_eq(wire_send_all(fd, request, strlen(request)), 0);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

Test(server, metrics_endpoint)
{
    http_port = pick_port(2);
    static char metrics[64];
    snprintf(metrics, sizeof metrics, "127.0.0.1:%u", http_port);
    const char *extra[] = {"--metrics", metrics, NULL};
    start(extra);
    int fd = session();
    float *k = random_kv(8 * N, 1), *v = random_kv(8 * N, 2);
    uint64_t tokens;
    cr_assert_eq(put(fd, "m", 0, 1, 0, 8, k, v, &tokens), 0);
    cr_assert_eq(put(fd, "m", 0, 1, 0, 8, k, v, &tokens), DQ_ORDER);
    char *body = http_get(http_port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    cr_assert(strstr(body, "HTTP/1.1 200 OK"), "%s", body);
    cr_assert(strstr(body, "dquant_requests_total{op=\"put\"} 2"), "%s", body);
    cr_assert(strstr(body, "dquant_errors_total{code=\"ORDER\"} 1"));
    cr_assert(strstr(body, "dquant_request_duration_seconds_bucket{op=\"put\",le=\"+Inf\"} 2"));
    cr_assert(strstr(body, "dquant_tokens_stored 8"));
    cr_assert(strstr(body, "dquant_connections 1"));
    free(body);
    body = http_get(http_port, "GET /healthz HTTP/1.0\r\n\r\n");
    cr_assert(strstr(body, "200 OK") && strstr(body, "\r\n\r\nok\n"), "%s", body);
    free(body);
    body = http_get(http_port, "\x01\x02garbage\r\n\r\n");
    cr_assert(strstr(body, "400 Bad Request"), "%s", body);
    free(body);
    body = http_get(http_port, "POST /metrics HTTP/1.1\r\n\r\n");
    cr_assert(strstr(body, "405"), "%s", body);
    free(body);
    body = http_get(http_port, "GET /nope HTTP/1.1\r\n\r\n");
    cr_assert(strstr(body, "404"), "%s", body);
    free(body);
    free(k);
    free(v);
    close(fd);
}

Test(server, sigterm_finishes_inflight_work)
{
    start(NULL);
    int fd = session();
    const size_t T = 2048;
    float *k = random_kv(LAYERS * T * N, 1), *v = random_kv(LAYERS * T * N, 2);
    Dquant__SeqRef seq = seqref("ns", "late");
    wire_payload pl = {0};
    Dquant__Tensor tk, tv;
    uint64_t shape[4] = {LAYERS, T, KV, HD};
    wire_tensor(&pl, &tk, DQUANT__DTYPE__F32, shape, 4, k, LAYERS * T * N * 4);
    wire_tensor(&pl, &tv, DQUANT__DTYPE__F32, shape, 4, v, LAYERS * T * N * 4);
    Dquant__Put p = DQUANT__PUT__INIT;
    p.seq = &seq;
    p.model = "tiny";
    p.num_layers = LAYERS;
    p.tokens = T;
    p.k = &tk;
    p.v = &tv;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &p;
    cr_assert_eq(wire_send(fd, &req, &pl, 1), 0);
    Dquant__Ping ping = DQUANT__PING__INIT;
    Dquant__Request rp = DQUANT__REQUEST__INIT;
    rp.body_case = DQUANT__REQUEST__BODY_PING;
    rp.ping = &ping;
    cr_assert_eq(wire_send(fd, &rp, NULL, 2), 0);
    usleep(100000); /* both frames are in; the PUT is (most likely) still encoding */
    kill(D.pid, SIGTERM);

    uint64_t id;
    Dquant__Response *r;
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0, "the PUT in flight is answered");
    cr_assert_eq(id, 1);
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_PUT, "%d", wire_error(r));
    cr_assert_eq(r->put->tokens, T);
    dquant__response__free_unpacked(r, NULL);
    cr_assert_eq(wire_recv(fd, &id, &r, NULL, NULL), 0);
    cr_assert_eq(id, 2);
    dquant__response__free_unpacked(r, NULL);
    cr_assert(peer_closed(fd), "then the connection closes");
    close(fd);
    int st = dqd_wait(D.pid, 30000);
    D.pid = 0;
    dqd_stop(&D); /* removes its directory */
    cr_assert_eq(st, 0);
    wire_payload_free(&pl);
    free(k);
    free(v);
}
