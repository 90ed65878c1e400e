/* libdquant-client against a scripted server thread (a real socket, real frames, real protobuf):
 * the paths a well-behaved dquantd never takes — replies with a bad checksum, the wrong request id,
 * tensors outside the payload, connections closed mid-request, no reply at all — plus the retry
 * policy (idempotent calls are repeated after a reconnect, PUT is not) and the HELLO handshake. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dquant.pb-c.h"
#include "dquant/client.h"
#include "frame.h"

typedef enum fault {
    F_NONE,
    F_CLOSE_BEFORE_REPLY, /* close the connection instead of answering request #fault_at */
    F_BAD_CRC,
    F_WRONG_ID,
    F_TENSOR_OOB,
    F_NO_REPLY,
    F_ERROR_REPLY,
    F_SHORT_REPLY, /* send half a reply, then close */
    F_WRONG_BODY,
} fault;

typedef struct server {
    char path[108];
    int lfd;
    pthread_t thread;
    _Atomic int stop;
    _Atomic int fault;
    _Atomic int fault_once;     /* 1: the fault hits the next request only; 0: every request */
    _Atomic int total_requests; /* over all connections */
    _Atomic int connections;    /* accepted so far */
    _Atomic int puts;           /* PUT requests that were answered */
    const char *secret;         /* required in HELLO when set */
    uint64_t max_payload;       /* announced in HELLO (0: 64 MiB) */
} server;

static server srv;

static int read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 50) == 0) {
            if (atomic_load(&srv.stop))
                return -1;
            continue;
        }
        ssize_t r = read(fd, p, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Sends resp with payload; the fault (if any) is applied on the way out. */
static int send_reply(int fd, const Dquant__Response *resp, const void *payload, size_t plen, uint64_t id, fault f)
{
    size_t hlen = dquant__response__get_packed_size(resp);
    uint8_t *buf = malloc(32 + hlen + plen);
    dquant__response__pack(resp, buf + 32);
    dq_frame_write_header(buf, buf + 32, (uint32_t)hlen, plen, f == F_WRONG_ID ? id + 7 : id);
    if (f == F_BAD_CRC)
        buf[12] ^= 1;
    if (plen)
        memcpy(buf + 32 + hlen, payload, plen);
    size_t n = 32 + hlen + plen;
    if (f == F_SHORT_REPLY)
        n /= 2;
    int rc = write_full(fd, buf, n);
    free(buf);
    return rc;
}

static void reply_error(int fd, uint64_t id, int code, const char *name, const char *msg)
{
    Dquant__Error e = DQUANT__ERROR__INIT;
    e.code = code;
    e.name = (char *)name;
    e.message = (char *)msg;
    Dquant__Response r = DQUANT__RESPONSE__INIT;
    r.body_case = DQUANT__RESPONSE__BODY_ERROR;
    r.error = &e;
    send_reply(fd, &r, NULL, 0, id, F_NONE);
}

/* Serves one connection until it closes or a fault ends it. Returns 0 to keep accepting. */
static void serve(int fd)
{
    const dq_frame_limits lim = {.max_header = 1 << 20, .max_payload = 1 << 26};
    int hello_ok = 0;
    for (;;) {
        uint8_t fh[32];
        if (read_full(fd, fh, 32))
            return;
        dq_frame_header h;
        int err;
        if (dq_frame_parse_header(fh, 32, &lim, &h, &err) != DQ_FRAME_OK)
            return;
        size_t rest = h.header_len + (size_t)h.payload_len;
        uint8_t *buf = malloc(32 + rest);
        memcpy(buf, fh, 32);
        if (read_full(fd, buf + 32, rest)) {
            free(buf);
            return;
        }
        dq_frame f;
        size_t consumed;
        cr_assert_eq(dq_frame_parse(buf, 32 + rest, &lim, &f, &consumed, &err), DQ_FRAME_OK,
                     "the client sent a bad frame (%d)", err);
        Dquant__Request *req = dquant__request__unpack(NULL, h.header_len, f.header);
        cr_assert_not_null(req);
        const uint8_t *payload = f.payload;
        uint64_t id = h.request_id;

        if (req->body_case == DQUANT__REQUEST__BODY_HELLO) {
            const Dquant__Hello *hq = req->hello;
            cr_assert_eq(hq->min_version, 1);
            cr_assert_eq(hq->max_version, 1);
            if (srv.secret &&
                (hq->secret.len != strlen(srv.secret) || memcmp(hq->secret.data, srv.secret, hq->secret.len) != 0)) {
                reply_error(fd, id, DQ_UNAUTHENTICATED, "UNAUTHENTICATED", "bad secret");
                dquant__request__free_unpacked(req, NULL);
                free(buf);
                return;
            }
            Dquant__HelloReply hr = DQUANT__HELLO_REPLY__INIT;
            char *profiles[2] = {"dq226", "dq196"};
            hr.version = 1;
            hr.server_version = "scripted-0";
            hr.backend = "cpu";
            hr.max_payload_bytes = srv.max_payload ? srv.max_payload : 1 << 26;
            hr.max_frame_bytes = hr.max_payload_bytes + (1 << 20) + 32;
            hr.max_batch_items = 64;
            hr.n_profiles = 2;
            hr.profiles = profiles;
            Dquant__Response r = DQUANT__RESPONSE__INIT;
            r.body_case = DQUANT__RESPONSE__BODY_HELLO;
            r.hello = &hr;
            send_reply(fd, &r, NULL, 0, id, F_NONE);
            hello_ok = 1;
            dquant__request__free_unpacked(req, NULL);
            free(buf);
            continue;
        }
        cr_assert(hello_ok, "request before HELLO");
        atomic_fetch_add(&srv.total_requests, 1);
        fault flt = (fault)atomic_load(&srv.fault);
        if (atomic_exchange(&srv.fault_once, 0))
            atomic_store(&srv.fault, F_NONE);

        if (flt == F_CLOSE_BEFORE_REPLY || flt == F_NO_REPLY) {
            dquant__request__free_unpacked(req, NULL);
            free(buf);
            if (flt == F_NO_REPLY) {
                /* Hold the connection open without answering until the client gives up. */
                struct pollfd p = {.fd = fd, .events = POLLIN};
                while (!atomic_load(&srv.stop) && poll(&p, 1, 50) == 0) {
                }
            }
            return;
        }
        if (flt == F_ERROR_REPLY) {
            reply_error(fd, id, DQ_NOT_FOUND, "NOT_FOUND", "no sequence 'x' in namespace 'y'");
            dquant__request__free_unpacked(req, NULL);
            free(buf);
            continue;
        }

        Dquant__Response r = DQUANT__RESPONSE__INIT;
        uint8_t *out = NULL;
        size_t olen = 0;
        Dquant__Pong pong = DQUANT__PONG__INIT;
        Dquant__PutReply pr = DQUANT__PUT_REPLY__INIT;
        Dquant__GetReply gr = DQUANT__GET_REPLY__INIT;
        Dquant__AttendReply ar = DQUANT__ATTEND_REPLY__INIT;
        Dquant__StatsReply sr = DQUANT__STATS_REPLY__INIT;
        Dquant__Empty empty = DQUANT__EMPTY__INIT;
        Dquant__Tensor tk = DQUANT__TENSOR__INIT, tv = DQUANT__TENSOR__INIT;
        uint64_t kshape[4], oshape[3], lshape[2];
        Dquant__StatsReply__CountersEntry ce = DQUANT__STATS_REPLY__COUNTERS_ENTRY__INIT;
        Dquant__StatsReply__CountersEntry ce2 = DQUANT__STATS_REPLY__COUNTERS_ENTRY__INIT;
        Dquant__StatsReply__CountersEntry *ces[2] = {&ce, &ce2};
        Dquant__StatsReply__GaugesEntry ge = DQUANT__STATS_REPLY__GAUGES_ENTRY__INIT;
        Dquant__StatsReply__GaugesEntry *ges[1] = {&ge};

        switch (req->body_case) {
        case DQUANT__REQUEST__BODY_PING:
            pong.data = req->ping->data;
            r.body_case = DQUANT__RESPONSE__BODY_PONG;
            r.pong = &pong;
            break;
        case DQUANT__REQUEST__BODY_PUT: {
            const Dquant__Put *p = req->put;
            cr_assert_not_null(p->k);
            cr_assert_eq(p->k->n_shape, 4);
            cr_assert_eq(p->v->offset, p->k->length);
            cr_assert_eq(h.payload_len, p->k->length + p->v->length);
            pr.tokens = p->start_token + p->tokens;
            pr.stored_bytes = p->k->length;
            r.body_case = DQUANT__RESPONSE__BODY_PUT;
            r.put = &pr;
            atomic_fetch_add(&srv.puts, 1);
            break;
        }
        case DQUANT__REQUEST__BODY_GET: {
            /* k: f32 [1, tokens, 2, 4] with value i; v = -i. */
            uint64_t t = req->get->tokens ? req->get->tokens : 3;
            kshape[0] = 1;
            kshape[1] = t;
            kshape[2] = 2;
            kshape[3] = 4;
            size_t cnt = t * 8;
            olen = 2 * cnt * 4;
            out = malloc(olen);
            for (size_t i = 0; i < cnt; i++) {
                ((float *)out)[i] = (float)i;
                ((float *)out)[cnt + i] = -(float)i;
            }
            tk.dtype = DQUANT__DTYPE__F32;
            tk.n_shape = 4;
            tk.shape = kshape;
            tk.offset = 0;
            tk.length = cnt * 4;
            tv = tk;
            tv.offset = flt == F_TENSOR_OOB ? olen - 4 : cnt * 4;
            gr.start_token = req->get->start_token;
            gr.tokens = t;
            gr.k = &tk;
            gr.v = &tv;
            r.body_case = DQUANT__RESPONSE__BODY_GET;
            r.get = &gr;
            break;
        }
        case DQUANT__REQUEST__BODY_ATTEND: {
            /* out[i, h, d] = first q value of item i; lse[i, h] = i. */
            const Dquant__Attend *a = req->attend;
            size_t items = a->n_items, qh = a->items[0]->q->shape[0], hd = a->items[0]->q->shape[1];
            olen = items * qh * hd * 4 + items * qh * 4;
            out = malloc(olen);
            for (size_t i = 0; i < items; i++) {
                const Dquant__Tensor *q = a->items[i]->q;
                cr_assert_eq(q->dtype, DQUANT__DTYPE__F32);
                float q0;
                memcpy(&q0, payload + q->offset, 4);
                for (size_t j = 0; j < qh * hd; j++)
                    ((float *)out)[i * qh * hd + j] = q0;
                for (size_t j = 0; j < qh; j++)
                    ((float *)out)[items * qh * hd + i * qh + j] = (float)i;
                if (a->items[i]->append_k)
                    cr_assert_eq(a->items[i]->append_k->shape[0], 1);
            }
            oshape[0] = items;
            oshape[1] = qh;
            oshape[2] = hd;
            lshape[0] = items;
            lshape[1] = qh;
            tk.dtype = tv.dtype = DQUANT__DTYPE__F32;
            tk.n_shape = 3;
            tk.shape = oshape;
            tk.length = items * qh * hd * 4;
            tv.n_shape = 2;
            tv.shape = lshape;
            tv.offset = tk.length;
            tv.length = items * qh * 4;
            ar.out = &tk;
            ar.lse = &tv;
            r.body_case = DQUANT__RESPONSE__BODY_ATTEND;
            r.attend = &ar;
            break;
        }
        case DQUANT__REQUEST__BODY_STATS:
            ce.key = "requests";
            ce.value = (uint64_t)atomic_load(&srv.total_requests);
            ce2.key = "connections";
            ce2.value = (uint64_t)atomic_load(&srv.connections);
            ge.key = "store_bytes";
            ge.value = 1.5;
            sr.n_counters = 2;
            sr.counters = ces;
            sr.n_gauges = 1;
            sr.gauges = ges;
            r.body_case = DQUANT__RESPONSE__BODY_STATS;
            r.stats = &sr;
            break;
        case DQUANT__REQUEST__BODY_DELETE:
        case DQUANT__REQUEST__BODY_PIN:
        case DQUANT__REQUEST__BODY_UNPIN:
            r.body_case = DQUANT__RESPONSE__BODY_OK;
            r.ok = &empty;
            break;
        default:
            reply_error(fd, id, DQ_UNSUPPORTED, "UNSUPPORTED", "not scripted");
            dquant__request__free_unpacked(req, NULL);
            free(buf);
            continue;
        }
        if (flt == F_WRONG_BODY) {
            r.body_case = DQUANT__RESPONSE__BODY_OK;
            r.ok = &empty;
        }
        int rc = send_reply(fd, &r, out, olen, id, flt);
        free(out);
        dquant__request__free_unpacked(req, NULL);
        free(buf);
        if (rc || flt == F_SHORT_REPLY)
            return;
    }
}

static void *server_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&srv.stop)) {
        struct pollfd p = {.fd = srv.lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(srv.lfd, NULL, NULL);
        if (fd < 0)
            continue;
        atomic_fetch_add(&srv.connections, 1);
        serve(fd);
        close(fd);
    }
    return NULL;
}

static void start_server(void)
{
    memset(&srv, 0, sizeof srv);
    snprintf(srv.path, sizeof srv.path, "/tmp/dqc-faults-%d.sock", (int)getpid());
    unlink(srv.path);
    srv.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_geq(srv.lfd, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", srv.path);
    cr_assert_eq(bind(srv.lfd, (struct sockaddr *)&sun, sizeof sun), 0);
    cr_assert_eq(listen(srv.lfd, 16), 0);
    cr_assert_eq(pthread_create(&srv.thread, NULL, server_main, NULL), 0);
}

static void stop_server(void)
{
    atomic_store(&srv.stop, 1);
    pthread_join(srv.thread, NULL);
    close(srv.lfd);
    unlink(srv.path);
}

static dqc_client *connect_ok(int io_timeout_ms)
{
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = io_timeout_ms;
    o.reconnect_backoff_ms = 1;
    if (srv.secret) {
        o.secret = srv.secret;
        o.secret_len = strlen(srv.secret);
    }
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(addr, &o, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect: %s", err);
    return c;
}

/* once: the fault hits only the next request the server sees (not a retry of it); otherwise
 * every request until changed. */
static void set_fault(fault f, int once)
{
    atomic_store(&srv.fault_once, once);
    atomic_store(&srv.fault, f);
}

TestSuite(client_faults, .init = start_server, .fini = stop_server, .timeout = 30);

Test(client_faults, hello_reports_server_info)
{
    dqc_client *c = connect_ok(2000);
    dqc_server_info in;
    cr_assert_eq(dqc_server(c, &in), 0);
    cr_assert_eq(in.version, 1);
    cr_assert_str_eq(in.server_version, "scripted-0");
    cr_assert_str_eq(in.backend, "cpu");
    cr_assert_eq(in.max_batch_items, 64);
    cr_assert_eq(in.nprofiles, 2);
    cr_assert_str_eq(in.profiles[1], "dq196");
    cr_assert_eq(dqc_ping(c, "abc", 3), 0);
    dqc_free(c);
}

Test(client_faults, every_operation_round_trips)
{
    dqc_client *c = connect_ok(2000);
    float k[2 * 3 * 2 * 4], v[2 * 3 * 2 * 4];
    for (size_t i = 0; i < 48; i++)
        k[i] = v[i] = (float)i;
    dqc_put_args pa = {.seq = {"ns", "key", 3},
                       .model = "m",
                       .start_token = 5,
                       .num_layers = 2,
                       .tokens = 3,
                       .kv_heads = 2,
                       .head_dim = 4,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    dqc_put_result pr;
    cr_assert_eq(dqc_put(c, &pa, &pr), 0, "%s", dqc_last_error(c));
    cr_assert_eq(pr.tokens, 8);
    cr_assert_eq(pr.stored_bytes, sizeof k);

    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {"ns", "key", 3}, .tokens = 5, .dtype = DQ_DTYPE_F32};
    cr_assert_eq(dqc_get(c, &ga, &g), 0, "%s", dqc_last_error(c));
    cr_assert_eq(g.tokens, 5);
    cr_assert_eq(g.num_layers, 1);
    cr_assert_eq(g.kv_heads, 2);
    cr_assert_eq(g.head_dim, 4);
    cr_assert_eq(g.bytes, 5 * 8 * 4);
    float x;
    memcpy(&x, (const uint8_t *)g.k + 4 * 39, 4);
    cr_assert_eq(x, 39.0f);
    memcpy(&x, (const uint8_t *)g.v + 4 * 39, 4);
    cr_assert_eq(x, -39.0f);
    /* A second GET reuses the result's memory. */
    void *mem = g.mem_;
    ga.tokens = 2;
    cr_assert_eq(dqc_get(c, &ga, &g), 0);
    cr_assert_eq(g.mem_, mem);
    cr_assert_eq(g.tokens, 2);
    dqc_get_result_free(&g);
    dqc_get_result_free(&g);
    dqc_get_result_free(NULL);

    float q[3][2 * 4];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 8; j++)
            q[i][j] = (float)(10 * i + 1);
    float ak[8] = {0}, av[8] = {0};
    dqc_attend_item items[3] = {
        {.seq = {NULL, "a", 1}, .layer = 0, .q = q[0]},
        {.seq = {NULL, "b", 1}, .layer = 1, .q = q[1], .append_k = ak, .append_v = av},
        {.seq = {NULL, "c", 1}, .layer = 2, .q = q[2]},
    };
    dqc_attend_args aa = {
        .items = items, .nitems = 3, .q_heads = 2, .kv_heads = 2, .head_dim = 4, .dtype = DQ_DTYPE_F32};
    float out[3 * 8], lse[3 * 2];
    cr_assert_eq(dqc_attend(c, &aa, out, lse), 0, "%s", dqc_last_error(c));
    cr_assert_eq(out[0], 1.0f);
    cr_assert_eq(out[8], 11.0f);
    cr_assert_eq(out[23], 21.0f);
    cr_assert_eq(lse[5], 2.0f);

    dqc_stats_result s = {0};
    cr_assert_eq(dqc_stats(c, &s), 0);
    cr_assert_eq(s.ncounters, 2);
    cr_assert_str_eq(s.counters[0].name, "connections"); /* sorted */
    uint64_t reqs = 0;
    cr_assert_eq(dqc_stats_counter(&s, "requests", &reqs), 0);
    cr_assert_eq(reqs, 5);
    double gv = 0;
    cr_assert_eq(dqc_stats_gauge(&s, "store_bytes", &gv), 0);
    cr_assert_eq(gv, 1.5);
    cr_assert_eq(dqc_stats_counter(&s, "nope", &reqs), DQ_NOT_FOUND);
    dqc_stats_result_free(&s);

    dqc_seq seq = {"ns", "key", 3};
    cr_assert_eq(dqc_pin(c, &seq), 0);
    cr_assert_eq(dqc_unpin(c, &seq), 0);
    cr_assert_eq(dqc_delete(c, &seq), 0);
    dqc_free(c);
}

Test(client_faults, invalid_arguments_never_reach_the_wire)
{
    dqc_client *c = connect_ok(2000);
    int before = atomic_load(&srv.total_requests);
    dqc_put_args pa = {.seq = {"", "k", 1},
                       .model = "m",
                       .num_layers = 1,
                       .tokens = 1,
                       .kv_heads = 1,
                       .head_dim = 4,
                       .dtype = DQ_DTYPE_F32};
    cr_assert_eq(dqc_put(c, &pa, NULL), DQ_INVALID_ARGUMENT); /* no k/v */
    cr_assert(strstr(dqc_last_error(c), "k and v") != NULL, "%s", dqc_last_error(c));
    pa.dtype = (dq_dtype)7;
    float kv[4];
    pa.k = pa.v = kv;
    cr_assert_eq(dqc_put(c, &pa, NULL), DQ_INVALID_ARGUMENT);
    dqc_seq bad = {"", NULL, 3};
    cr_assert_eq(dqc_delete(c, &bad), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_ping(c, NULL, 3), DQ_INVALID_ARGUMENT);
    dqc_attend_item it = {.seq = {NULL, "a", 1}, .q = kv, .append_k = kv};
    dqc_attend_args aa = {.items = &it, .nitems = 1, .q_heads = 1, .kv_heads = 1, .head_dim = 4};
    float out[4];
    cr_assert_eq(dqc_attend(c, &aa, out, NULL), DQ_INVALID_ARGUMENT); /* append_k without append_v */
    it.append_k = NULL;
    aa.nitems = 65;
    cr_assert_eq(dqc_attend(c, &aa, out, NULL), DQ_TOO_LARGE); /* over max_batch_items */
    cr_assert_eq(atomic_load(&srv.total_requests), before);
    cr_assert_eq(dqc_put(NULL, &pa, NULL), DQ_INVALID_ARGUMENT);
    dqc_free(c);
    dqc_free(NULL);
}

Test(client_faults, bad_addresses)
{
    dqc_client *c = (dqc_client *)1;
    char err[256];
    cr_assert_eq(dqc_connect_ex("http://x", NULL, &c, err, sizeof err), DQ_INVALID_ARGUMENT);
    cr_assert_null(c);
    cr_assert(strstr(err, "expected") != NULL, "%s", err);
    cr_assert_eq(dqc_connect("tcp://127.0.0.1", NULL, &c), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_connect("tcp://127.0.0.1:0", NULL, &c), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_connect("tcp://[::1:99", NULL, &c), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_connect("unix:", NULL, &c), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_connect("unix:/nonexistent/dqc.sock", NULL, &c), DQ_CONNECTION);
    cr_assert_eq(dqc_connect(NULL, NULL, &c), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_connect("unix:/x", NULL, NULL), DQ_INVALID_ARGUMENT);
}

Test(client_faults, idempotent_calls_survive_a_dropped_connection)
{
    dqc_client *c = connect_ok(2000);
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_ping(c, "x", 1), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), 1);
    cr_assert_eq(atomic_load(&srv.connections), 2);
    dqc_stats_result s = {0};
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_stats(c, &s), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), 2);
    dqc_stats_result_free(&s);
    dqc_free(c);
}

Test(client_faults, put_is_not_repeated_after_a_break_in_flight)
{
    dqc_client *c = connect_ok(2000);
    float kv[8] = {0};
    dqc_put_args pa = {.seq = {"", "k", 1},
                       .model = "m",
                       .num_layers = 1,
                       .tokens = 1,
                       .kv_heads = 2,
                       .head_dim = 4,
                       .dtype = DQ_DTYPE_F32,
                       .k = kv,
                       .v = kv};
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_put(c, &pa, NULL), DQ_CONNECTION);
    cr_assert_eq(atomic_load(&srv.puts), 0);
    cr_assert_eq(atomic_load(&srv.connections), 1, "PUT must not be resent");
    /* The next PUT reconnects first (nothing was sent on a dead connection) and succeeds. */
    set_fault(F_NONE, 0);
    cr_assert_eq(dqc_put(c, &pa, NULL), 0, "%s", dqc_last_error(c));
    cr_assert_eq(atomic_load(&srv.puts), 1);
    cr_assert_eq(dqc_reconnect_count(c), 1);

    /* ATTEND with an append is not repeated either; without one it is. */
    dqc_attend_item it = {.seq = {NULL, "a", 1}, .q = kv, .append_k = kv, .append_v = kv};
    dqc_attend_args aa = {.items = &it, .nitems = 1, .q_heads = 2, .kv_heads = 2, .head_dim = 4, .dtype = DQ_DTYPE_F32};
    float out[8];
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_attend(c, &aa, out, NULL), DQ_CONNECTION);
    it.append_k = it.append_v = NULL;
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_attend(c, &aa, out, NULL), 0, "%s", dqc_last_error(c));
    dqc_free(c);
}

Test(client_faults, no_auto_reconnect_means_connection_errors)
{
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_options o;
    dqc_options_default(&o);
    o.auto_reconnect = 0;
    dqc_client *c = NULL;
    cr_assert_eq(dqc_connect(addr, &o, &c), 0);
    set_fault(F_CLOSE_BEFORE_REPLY, 1);
    cr_assert_eq(dqc_ping(c, "x", 1), DQ_CONNECTION);
    set_fault(F_NONE, 0);
    cr_assert_eq(dqc_ping(c, "x", 1), DQ_CONNECTION);
    cr_assert(strstr(dqc_last_error(c), "auto-reconnect is off") != NULL, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect(c), 0);
    cr_assert_eq(dqc_ping(c, "x", 1), 0);
    dqc_free(c);
}

Test(client_faults, corrupt_replies_are_protocol_errors)
{
    dqc_client *c = connect_ok(2000);
    const fault faults[] = {F_BAD_CRC, F_WRONG_ID, F_WRONG_BODY};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        set_fault(faults[i], 0);
        cr_assert_eq(dqc_ping(c, "x", 1), DQ_PROTOCOL, "fault %d: %s", (int)faults[i], dqc_last_error(c));
        set_fault(F_NONE, 0);
        cr_assert_eq(dqc_ping(c, "y", 1), 0, "after fault %d: %s", (int)faults[i], dqc_last_error(c));
    }
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {"", "k", 1}, .tokens = 3, .dtype = DQ_DTYPE_F32};
    set_fault(F_TENSOR_OOB, 0);
    cr_assert_eq(dqc_get(c, &ga, &g), DQ_PROTOCOL);
    cr_assert(strstr(dqc_last_error(c), "outside") != NULL, "%s", dqc_last_error(c));
    cr_assert_null(g.k);
    cr_assert_eq(g.tokens, 0);
    ga.dtype = DQ_DTYPE_BF16; /* the script answers f32 */
    set_fault(F_NONE, 0);
    cr_assert_eq(dqc_get(c, &ga, &g), DQ_PROTOCOL);
    dqc_get_result_free(&g);
    dqc_free(c);
}

Test(client_faults, truncated_reply_is_retried_for_idempotent_calls)
{
    dqc_client *c = connect_ok(2000);
    set_fault(F_SHORT_REPLY, 1);
    cr_assert_eq(dqc_ping(c, "hello", 5), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), 1);
    dqc_free(c);
}

Test(client_faults, server_errors_carry_code_and_message)
{
    dqc_client *c = connect_ok(2000);
    set_fault(F_ERROR_REPLY, 0);
    dqc_seq s = {"y", "x", 1};
    cr_assert_eq(dqc_delete(c, &s), DQ_NOT_FOUND);
    cr_assert(strstr(dqc_last_error(c), "NOT_FOUND") != NULL, "%s", dqc_last_error(c));
    cr_assert(strstr(dqc_last_error(c), "namespace 'y'") != NULL, "%s", dqc_last_error(c));
    set_fault(F_NONE, 0);
    cr_assert_eq(dqc_delete(c, &s), 0);
    cr_assert_eq(dqc_reconnect_count(c), 0); /* an error reply keeps the connection */
    cr_assert_str_eq(dqc_err_name(DQ_NOT_FOUND), "NOT_FOUND");
    cr_assert_str_eq(dqc_strerror(DQ_TIMEOUT), "timed out");
    cr_assert_str_eq(dqc_err_name(12345), "UNKNOWN");
    dqc_free(c);
}

Test(client_faults, no_reply_times_out_and_closes)
{
    dqc_client *c = connect_ok(300);
    set_fault(F_NO_REPLY, 1);
    cr_assert_eq(dqc_ping(c, "x", 1), DQ_TIMEOUT);
    cr_assert(strstr(dqc_last_error(c), "300 ms") != NULL, "%s", dqc_last_error(c));
    /* The late connection is dropped: the next call starts a fresh one. */
    set_fault(F_NONE, 0);
    cr_assert_eq(dqc_ping(c, "x", 1), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), 1);
    dqc_free(c);
}

Test(client_faults, secret_is_sent_and_checked)
{
    srv.secret = "s3cret";
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(addr, NULL, &c, err, sizeof err), DQ_UNAUTHENTICATED);
    cr_assert_null(c);
    cr_assert(strstr(err, "bad secret") != NULL, "%s", err);
    dqc_options o;
    dqc_options_default(&o);
    o.secret = "wrong!";
    o.secret_len = 6;
    cr_assert_eq(dqc_connect(addr, &o, &c), DQ_UNAUTHENTICATED);
    c = connect_ok(2000);
    cr_assert_eq(dqc_ping(c, NULL, 0), 0);
    dqc_free(c);
    srv.secret = NULL;
}

Test(client_faults, old_options_struct_keeps_new_defaults)
{
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_options o;
    dqc_options_default(&o);
    o.size = offsetof(dqc_options, auto_reconnect); /* a caller built against an older header */
    o.max_reply_payload = 1;                        /* beyond its size: must be ignored */
    dqc_client *c = NULL;
    cr_assert_eq(dqc_connect(addr, &o, &c), 0);
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {"", "k", 1}, .tokens = 3, .dtype = DQ_DTYPE_F32};
    cr_assert_eq(dqc_get(c, &ga, &g), 0, "%s", dqc_last_error(c));
    dqc_get_result_free(&g);
    dqc_free(c);
}

Test(client_faults, limits_are_enforced_on_both_sides)
{
    /* Requests over the server's announced payload limit never reach the wire. */
    srv.max_payload = 1024;
    dqc_client *c = connect_ok(2000);
    float kv[3 * 64] = {0};
    dqc_put_args pa = {.seq = {"", "k", 1},
                       .model = "m",
                       .num_layers = 1,
                       .tokens = 3,
                       .kv_heads = 2,
                       .head_dim = 32,
                       .dtype = DQ_DTYPE_F32,
                       .k = kv,
                       .v = kv};
    int before = atomic_load(&srv.total_requests);
    cr_assert_eq(dqc_put(c, &pa, NULL), DQ_TOO_LARGE); /* K and V of 768 bytes each */
    pa.tokens = 2;
    cr_assert_eq(dqc_put(c, &pa, NULL), 0, "%s", dqc_last_error(c)); /* 2 x 512 bytes: exactly the limit */
    cr_assert_eq(atomic_load(&srv.total_requests), before + 1);
    dqc_free(c);
    srv.max_payload = 0;

    /* Replies over the client's limit are refused and the connection is dropped. */
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_options o;
    dqc_options_default(&o);
    o.max_reply_payload = 64;
    cr_assert_eq(dqc_connect(addr, &o, &c), 0);
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {"", "k", 1}, .tokens = 3, .dtype = DQ_DTYPE_F32}; /* 96 bytes each of K, V */
    cr_assert_eq(dqc_get(c, &ga, &g), DQ_TOO_LARGE, "%s", dqc_last_error(c));
    ga.tokens = 1; /* 2 x 32 bytes */
    cr_assert_eq(dqc_get(c, &ga, &g), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), 1);
    dqc_get_result_free(&g);
    dqc_free(c);
}

/* The daemon goes away: the first call after the break and the next each try a whole reconnect;
 * then calls fail at once until the backoff (here 10 ms x 2^5) has passed, instead of each sleeping
 * through 5 attempts again; once the server is back, the handle reconnects by itself. */
Test(client_faults, repeated_reconnect_failures_hold_off)
{
    char addr[128];
    snprintf(addr, sizeof addr, "unix:%s", srv.path);
    dqc_options o;
    dqc_options_default(&o);
    o.reconnect_backoff_ms = 10;
    dqc_client *c = NULL;
    cr_assert_eq(dqc_connect(addr, &o, &c), 0);
    cr_assert_eq(dqc_ping(c, "x", 1), 0);
    stop_server();

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(dqc_ping(c, "x", 1), DQ_CONNECTION);
    cr_assert_eq(dqc_ping(c, "x", 1), DQ_CONNECTION, "a second whole reconnect");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double two = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert_geq(two, 0.29, "two reconnects of 5 attempts, 10+20+40+80 ms apart: %.3f s", two);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(dqc_ping(c, "x", 1), DQ_CONNECTION);
        cr_assert(strstr(dqc_last_error(c), "2 reconnects failed") && strstr(dqc_last_error(c), "next one in"), "%s",
                  dqc_last_error(c));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double twenty = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert_lt(twenty, 0.1, "20 calls within the hold-off took %.3f s", twenty);

    start_server();
    struct timespec nap = {0, 400 * 1000000L};
    nanosleep(&nap, NULL); /* past the 320 ms */
    uint64_t before = dqc_reconnect_count(c);
    cr_assert_eq(dqc_ping(c, "x", 1), 0, "%s", dqc_last_error(c));
    cr_assert_eq(dqc_reconnect_count(c), before + 1);
    dqc_free(c);
}
