/* dqd_abuse: measures what a hostile or broken client costs a dquantd (issue 18). Each scenario
 * starts its own daemon (the binary named by --dquantd or $DQUANTD), runs the abuse, prints one
 * JSON line with the figures, and stops the daemon. Not a test (it takes minutes and gigabytes at
 * the default limits): the reproducible harness behind the figures quoted in the commit messages
 * of the connection hardening.
 *
 *   dqd_abuse [--dquantd PATH] [--dquant PATH] [--daemon-arg ARG]... SCENARIO...
 *
 *   replies    64 connections pipeline DECOMPRESS requests whose replies are 256 KiB each (one token
 *              of a client-supplied profile of 65536 values) and never read: the daemon's RSS
 *              growth, and how long a fresh client's PING then takes.
 *   preauth    12 connections to a secret-protected TCP listener announce a 256 MiB frame without
 *              HELLO and send its bytes: the daemon's RSS growth.
 *   silent     --max-connections 64 silent connections: how long a real client needs to get a slot,
 *              and how many log lines the refusals wrote; then how long a frame sent one byte per
 *              100 ms stays open.
 *   metrics    70 idle connections to the metrics port re-opened every 4.5 s; /healthz probed once a
 *              second for 12 s: probes answered.
 *   auth       wrong-secret HELLOs from 4 threads for 3 s: failures answered per second, how many
 *              were checked against the secret, WARN lines logged, and whether a client with the
 *              right secret from another address (127.0.0.2) gets in; then 200 pipelined PINGs
 *              before HELLO: how many were answered.
 *   bench      `dquant bench` against a daemon killed after 1 s: seconds until bench exits, and
 *              its exit status. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "frame.h"
#include "amplify.h"
#include "wire.h"

#define MAX_DAEMON_ARGS 32

static const char *dquantd_bin, *dquant_bin;
static const char *daemon_args[MAX_DAEMON_ARGS];
static int ndaemon_args;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts a daemon with the scenario's flags, then the --daemon-arg ones (which override them). */
static void start(dqd_daemon *d, int tcp, const char *const *flags)
{
    static const char *argv[2 * MAX_DAEMON_ARGS + 1];
    int n = 0;
    for (int i = 0; flags && flags[i] && n < MAX_DAEMON_ARGS; i++)
        argv[n++] = flags[i];
    for (int i = 0; i < ndaemon_args; i++)
        argv[n++] = daemon_args[i];
    argv[n] = NULL;
    const dqd_opts o = {.bin = dquantd_bin, .tcp = tcp, .extra = argv, .stop_timeout_ms = 60000};
    if (dqd_start(d, &o) != 0) {
        fprintf(stderr, "dqd_abuse: the daemon did not start\n");
        exit(1);
    }
}

static long count_log_lines(const dqd_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return -1;
    char line[4096];
    long n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Samples the daemon's RSS until it has not grown for stable_ms (or max_ms passed); the peak. */
static long settle_rss(const dqd_daemon *d, int stable_ms, int max_ms)
{
    long peak = dqd_rss_kb(d);
    double t0 = now_s(), last_growth = t0;
    while ((now_s() - t0) * 1000 < max_ms && (now_s() - last_growth) * 1000 < stable_ms) {
        nap_ms(100);
        long r = dqd_rss_kb(d);
        if (r > peak + 1024) {
            peak = r;
            last_growth = now_s();
        } else if (r > peak) {
            peak = r;
        }
    }
    return peak;
}

/* A TCP connection to the daemon's loopback port from another loopback address (127.0.0.2): another
 * peer as far as the daemon can tell. */
static int connect_from_other_address(const dqd_daemon *d)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET, .sin_port = htons(d->port)};
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof src) < 0 ||
        connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* A PING round trip on a fresh connection (HELLO first): seconds, or -1 when it failed within
 * timeout_ms. tcp: 1 over TCP, 2 over TCP from another address. */
static double fresh_ping(const dqd_daemon *d, int timeout_ms, const char *secret, int tcp)
{
    double t0 = now_s();
    int fd = tcp == 2 ? connect_from_other_address(d) : tcp ? wire_connect_tcp(d->port) : wire_connect_unix(d->sock);
    if (fd < 0)
        return -1;
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    if (secret) {
        h.secret.data = (uint8_t *)secret;
        h.secret.len = strlen(secret);
    }
    Dquant__Request hr = DQUANT__REQUEST__INIT;
    hr.body_case = DQUANT__REQUEST__BODY_HELLO;
    hr.hello = &h;
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request pr = DQUANT__REQUEST__INIT;
    pr.body_case = DQUANT__REQUEST__BODY_PING;
    pr.ping = &p;
    double result = -1;
    Dquant__Response *r = NULL;
    if (wire_send(fd, &hr, NULL, 1) == 0 && wire_recv_within(fd, timeout_ms, NULL, &r, NULL, NULL) == 0 &&
        !wire_error(r)) {
        dquant__response__free_unpacked(r, NULL);
        r = NULL;
        if (wire_send(fd, &pr, NULL, 2) == 0 && wire_recv_within(fd, timeout_ms, NULL, &r, NULL, NULL) == 0 &&
            r->body_case == DQUANT__RESPONSE__BODY_PONG)
            result = now_s() - t0;
    }
    if (result < 0)
        fprintf(stderr, "fresh ping: %s\n", r ? (r->error ? r->error->message : "unexpected reply") : "no reply");
    if (r)
        dquant__response__free_unpacked(r, NULL);
    close(fd);
    return result;
}

/* ---- replies ---- */

/* A DECOMPRESS of one value token under a profile of 64 x 1024 values whose container is as small as
 * the profile allows: ~100 bytes of records in, 256 KiB of f32 out. */
static uint8_t *decompress_frame(size_t *len)
{
    size_t reply, rb;
    uint8_t *f = amplify_decompress_frame(64, 7, len, &reply, &rb);
    if (!f) {
        fprintf(stderr, "dqd_abuse: cannot build the DECOMPRESS frame\n");
        exit(1);
    }
    fprintf(stderr, "replies: %zu-byte frames (%zu bytes of records) -> %zu-byte replies\n", *len, rb, reply);
    return f;
}

/* Connections that each send a stream of bytes (`unit` repeated, `head` first) as fast as the daemon
 * takes them, without reading. Peak RSS growth is sampled all along; the pump stops when every stream
 * is done or nothing moved for idle_ms. */
typedef struct pump {
    int n;
    int *fds;
    uint64_t *left; /* bytes still to send per connection */
    uint64_t *off;  /* position in the stream */
    uint64_t sent;
    long peak_kb;
} pump;

static uint8_t stream_byte(const uint8_t *head, size_t hlen, const uint8_t *unit, size_t ulen, uint64_t pos)
{
    return pos < hlen ? head[pos] : unit[(pos - hlen) % ulen];
}

static void pump_run(pump *p, const dqd_daemon *d, const uint8_t *head, size_t hlen, const uint8_t *unit, size_t ulen,
                     int idle_ms)
{
    uint8_t buf[65536];
    double last_move = now_s(), last_sample = 0;
    p->peak_kb = dqd_rss_kb(d);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < p->n; i++) {
            if (p->fds[i] < 0 || !p->left[i])
                continue;
            busy = 1;
            size_t len = p->left[i] < sizeof buf ? (size_t)p->left[i] : sizeof buf;
            for (size_t j = 0; j < len; j++)
                buf[j] = stream_byte(head, hlen, unit, ulen, p->off[i] + j);
            ssize_t w = send(p->fds[i], buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                p->off[i] += (uint64_t)w;
                p->left[i] -= (uint64_t)w;
                p->sent += (uint64_t)w;
                last_move = now_s();
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                p->left[i] = 0; /* the daemon closed it */
            }
        }
        if (now_s() - last_sample > 0.1) {
            long r = dqd_rss_kb(d);
            if (r > p->peak_kb)
                p->peak_kb = r;
            last_sample = now_s();
        }
        if (!busy || (now_s() - last_move) * 1000 > idle_ms)
            break;
        nap_ms(1);
    }
}

static void scenario_replies(void)
{
    enum { CONNS = 64, PER_CONN = 2048 };
    dqd_daemon d;
    start(&d, 0, NULL);
    size_t flen;
    uint8_t *frame = decompress_frame(&flen);
    long rss0 = dqd_rss_kb(&d);
    int fds[CONNS];
    uint64_t left[CONNS], off[CONNS];
    for (int i = 0; i < CONNS; i++) {
        fds[i] = wire_connect_unix(d.sock);
        if (fds[i] < 0 || wire_hello(fds[i], 1, NULL) != 0) {
            fprintf(stderr, "replies: connection %d failed\n", i);
            exit(1);
        }
        left[i] = (uint64_t)PER_CONN * flen;
        off[i] = 0;
    }
    pump p = {CONNS, fds, left, off, 0, 0};
    pump_run(&p, &d, NULL, 0, frame, flen, 3000);
    long peak = settle_rss(&d, 3000, 30000);
    if (peak < p.peak_kb)
        peak = p.peak_kb;
    uint64_t frames = 0;
    for (int i = 0; i < CONNS; i++)
        frames += off[i] / flen;
    double ping = fresh_ping(&d, 10000, NULL, 0);
    printf("{\"scenario\":\"replies\",\"connections\":%d,\"frames_sent\":%llu,\"request_bytes\":%llu,"
           "\"reply_bytes_asked_mb\":%.1f,\"rss_growth_mb\":%.1f,\"fresh_ping_s\":%.4f}\n",
           CONNS, (unsigned long long)frames, (unsigned long long)p.sent, (double)frames * 0.25,
           (double)(peak - rss0) / 1024.0, ping);
    fflush(stdout);
    for (int i = 0; i < CONNS; i++)
        close(fds[i]);
    free(frame);
    dqd_stop(&d);
}

/* ---- preauth ---- */

static void scenario_preauth(void)
{
    enum { CONNS = 12 };
    const uint64_t announce = 256ull << 20;
    const char *flags[] = {"--secret", "s3cret-for-abuse", NULL};
    dqd_daemon d;
    start(&d, 1, flags);
    long rss0 = dqd_rss_kb(&d);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    size_t hlen = dquant__request__get_packed_size(&req);
    uint8_t head[DQ_FRAME_HEADER_BYTES + 64];
    dquant__request__pack(&req, head + DQ_FRAME_HEADER_BYTES);
    dq_frame_write_header(head, head + DQ_FRAME_HEADER_BYTES, (uint32_t)hlen, announce - DQ_FRAME_HEADER_BYTES - hlen,
                          1);
    const uint8_t zero = 0;
    int fds[CONNS];
    uint64_t left[CONNS], off[CONNS];
    for (int i = 0; i < CONNS; i++) {
        fds[i] = wire_connect_tcp(d.port);
        left[i] = announce;
        off[i] = 0;
    }
    pump p = {CONNS, fds, left, off, 0, 0};
    pump_run(&p, &d, head, DQ_FRAME_HEADER_BYTES + hlen, &zero, 1, 3000);
    int closed = 0;
    for (int i = 0; i < CONNS; i++) {
        char c;
        ssize_t r = recv(fds[i], &c, 1, MSG_DONTWAIT);
        closed += r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || r > 0;
    }
    printf("{\"scenario\":\"preauth\",\"connections\":%d,\"announced_mb\":%llu,\"bytes_sent_mb\":%.1f,"
           "\"answered_or_closed\":%d,\"rss_growth_mb\":%.1f}\n",
           CONNS, (unsigned long long)(announce >> 20), (double)p.sent / 1048576.0, closed,
           (double)(p.peak_kb - rss0) / 1024.0);
    fflush(stdout);
    for (int i = 0; i < CONNS; i++)
        close(fds[i]);
    dqd_stop(&d);
}

/* ---- silent ---- */

static void scenario_silent(void)
{
    enum { MAXC = 64 };
    const double cap_s = 40.0;
    const char *flags[] = {"--max-connections", "64", NULL};
    dqd_daemon d;
    start(&d, 0, flags);
    /* Exactly MAXC held: one the daemon refuses (it answers at once) is opened again. */
    int fds[MAXC];
    for (int i = 0, tries = 0; i < MAXC && tries < 10 * MAXC; tries++) {
        fds[i] = wire_connect_unix(d.sock);
        struct pollfd p = {fds[i], POLLIN, 0};
        if (poll(&p, 1, 50) > 0) {
            close(fds[i]);
            nap_ms(50);
            continue;
        }
        i++;
    }
    /* A real client tries once every 100 ms until a PING gets through. */
    double t0 = now_s(), got = -1;
    int attempts = 0;
    while (now_s() - t0 < cap_s) {
        attempts++;
        if (fresh_ping(&d, 2000, NULL, 0) >= 0) {
            got = now_s() - t0;
            break;
        }
        nap_ms(100);
    }
    long refusal_lines = count_log_lines(&d, "refus");
    for (int i = 0; i < MAXC; i++)
        close(fds[i]);
    nap_ms(300);

    /* A frame of 1 MiB sent one byte per 100 ms. */
    int fd = wire_connect_unix(d.sock);
    wire_hello(fd, 1, NULL);
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    size_t flen;
    uint8_t *f = wire_frame(&req, NULL, 0, 9, &flen);
    uint8_t hdr[DQ_FRAME_HEADER_BYTES + 16];
    memcpy(hdr, f, flen);
    dq_frame_write_header(hdr, f + DQ_FRAME_HEADER_BYTES, (uint32_t)(flen - DQ_FRAME_HEADER_BYTES), 1 << 20, 9);
    free(f);
    double s0 = now_s(), slow_closed = -1;
    for (size_t i = 0; now_s() - s0 < cap_s; i++) {
        if (send(fd, i < flen ? &hdr[i] : (const uint8_t *)"\0", 1, MSG_NOSIGNAL) != 1) {
            slow_closed = now_s() - s0;
            break;
        }
        struct pollfd pp = {fd, POLLIN, 0};
        if (poll(&pp, 1, 100) > 0) {
            char c[256];
            if (recv(fd, c, sizeof c, 0) <= 0) {
                slow_closed = now_s() - s0;
                break;
            }
        }
    }
    close(fd);
    printf("{\"scenario\":\"silent\",\"max_connections\":%d,\"silent_connections\":%d,\"slot_after_s\":%.2f,"
           "\"client_attempts\":%d,\"refusal_log_lines\":%ld,\"slow_frame_closed_after_s\":%.2f,\"cap_s\":%.0f}\n",
           MAXC, MAXC, got, attempts, refusal_lines, slow_closed, cap_s);
    fflush(stdout);
    dqd_stop(&d);
}

/* ---- metrics ---- */

typedef struct metrics_flood {
    uint16_t port;
    atomic_int stop;
} metrics_flood;

static int tcp_nb_connect(uint16_t port)
{
    int fd = wire_connect_tcp(port);
    return fd;
}

static void *metrics_flooder(void *arg)
{
    metrics_flood *m = arg;
    enum { N = 70 };
    int fds[N];
    double opened[N];
    for (int i = 0; i < N; i++) {
        fds[i] = tcp_nb_connect(m->port);
        opened[i] = now_s();
    }
    while (!atomic_load(&m->stop)) {
        for (int i = 0; i < N; i++) {
            if (now_s() - opened[i] >= 4.5) {
                if (fds[i] >= 0)
                    close(fds[i]);
                fds[i] = tcp_nb_connect(m->port);
                opened[i] = now_s();
            }
        }
        nap_ms(20);
    }
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return NULL;
}

/* GET path on a fresh connection; 1 when a 200 came back within timeout_ms. */
static int http_ok(uint16_t port, const char *path, const char *extra_header, int timeout_ms)
{
    int fd = wire_connect_tcp(port);
    if (fd < 0)
        return 0;
    char req[512];
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: probe\r\n%s\r\n", path, extra_header ? extra_header : "");
    int ok = 0;
    if (wire_send_all(fd, req, strlen(req)) == 0) {
        char buf[256];
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) > 0) {
            ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
            if (n > 0) {
                buf[n] = 0;
                ok = strstr(buf, " 200 ") != NULL;
            }
        }
    }
    close(fd);
    return ok;
}

static void scenario_metrics(void)
{
    uint16_t port = dqd_free_port();
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%u", port);
    const char *flags[] = {"--metrics", hp, NULL};
    dqd_daemon d;
    start(&d, 0, flags);
    metrics_flood m = {.port = port};
    pthread_t th;
    pthread_create(&th, NULL, metrics_flooder, &m);
    nap_ms(500);
    int ok = 0;
    const int probes = 12;
    for (int i = 0; i < probes; i++) {
        ok += http_ok(port, "/healthz", NULL, 1000); /* a Kubernetes probe's default timeout: 1 s */
        nap_ms(1000);
    }
    atomic_store(&m.stop, 1);
    pthread_join(th, NULL);
    printf("{\"scenario\":\"metrics\",\"idle_connections\":70,\"reopen_s\":4.5,\"probes\":%d,\"answered\":%d}\n",
           probes, ok);
    fflush(stdout);
    dqd_stop(&d);
}

/* ---- auth ---- */

typedef struct auth_flood {
    uint16_t port;
    double until;
    atomic_long answered, closed_early;
} auth_flood;

static void *auth_flooder(void *arg)
{
    auth_flood *a = arg;
    while (now_s() < a->until) {
        int fd = wire_connect_tcp(a->port);
        if (fd < 0)
            continue;
        int rc = wire_hello(fd, 1, "not the secret");
        if (rc == DQ_UNAUTHENTICATED)
            atomic_fetch_add(&a->answered, 1);
        else
            atomic_fetch_add(&a->closed_early, 1);
        close(fd);
    }
    return NULL;
}

static void scenario_auth(void)
{
    const char *flags[] = {"--secret", "s3cret-for-abuse", NULL};
    dqd_daemon d;
    start(&d, 1, flags);
    auth_flood a = {.port = d.port, .until = now_s() + 3.0};
    pthread_t th[4];
    double t0 = now_s();
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, auth_flooder, &a);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    double secs = now_s() - t0;
    long warn_lines = count_log_lines(&d, "WARN");
    double good = fresh_ping(&d, 5000, "s3cret-for-abuse", 2);
    /* How many of the guesses were checked against the secret (STATS over the Unix socket). */
    long checked = -1;
    int sfd = wire_connect_unix(d.sock);
    Dquant__Stats st = DQUANT__STATS__INIT;
    Dquant__Request sreq = DQUANT__REQUEST__INIT;
    sreq.body_case = DQUANT__REQUEST__BODY_STATS;
    sreq.stats = &st;
    Dquant__Response *sr = NULL;
    if (wire_hello(sfd, 1, NULL) == 0 && wire_call(sfd, &sreq, NULL, &sr, NULL, NULL) == 0 &&
        sr->body_case == DQUANT__RESPONSE__BODY_STATS)
        for (size_t i = 0; i < sr->stats->n_counters; i++)
            if (!strcmp(sr->stats->counters[i]->key, "auth_failures"))
                checked = (long)sr->stats->counters[i]->value;
    if (sr)
        dquant__response__free_unpacked(sr, NULL);
    close(sfd);

    /* 200 PINGs before any HELLO, in one write, on the Unix socket (no secret there). */
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    size_t flen;
    uint8_t *f = wire_frame(&req, NULL, 0, 1, &flen);
    uint8_t *all = malloc(200 * flen);
    for (int i = 0; i < 200; i++)
        memcpy(all + (size_t)i * flen, f, flen);
    int fd = wire_connect_unix(d.sock);
    wire_send_all(fd, all, 200 * flen);
    int answered = 0;
    for (;;) {
        Dquant__Response *r;
        if (wire_recv_within(fd, 2000, NULL, &r, NULL, NULL) != 0)
            break;
        answered++;
        dquant__response__free_unpacked(r, NULL);
    }
    close(fd);
    free(all);
    free(f);
    printf("{\"scenario\":\"auth\",\"seconds\":%.2f,\"failures_answered\":%ld,\"failures_per_s\":%.0f,"
           "\"secrets_checked\":%ld,\"closed_without_answer\":%ld,\"warn_lines\":%ld,"
           "\"other_address_right_secret_ping_s\":%.4f,\"pre_hello_pings_answered\":%d}\n",
           secs, atomic_load(&a.answered), (double)atomic_load(&a.answered) / secs, checked,
           atomic_load(&a.closed_early), warn_lines, good, answered);
    fflush(stdout);
    dqd_stop(&d);
}

/* ---- bench ---- */

static void scenario_bench(void)
{
    if (!dquant_bin) {
        fprintf(stderr, "bench: --dquant PATH is needed\n");
        exit(2);
    }
    dqd_daemon d;
    start(&d, 0, NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execl(dquant_bin, dquant_bin, "bench", "-c", "2", "-n", "100000000", "--mix", "ping=1", "--connect", d.addr,
              (char *)NULL);
        _exit(127);
    }
    nap_ms(1000);
    kill(d.pid, SIGKILL);
    waitpid(d.pid, NULL, 0);
    d.pid = 0;
    double t0 = now_s(), cap = 60.0;
    int st = -1;
    while (now_s() - t0 < cap) {
        int s;
        if (waitpid(pid, &s, WNOHANG) == pid) {
            st = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
            break;
        }
        nap_ms(20);
    }
    double secs = now_s() - t0;
    if (st < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    printf("{\"scenario\":\"bench\",\"exited\":%s,\"exit_after_s\":%.2f,\"status\":%d,\"cap_s\":%.0f}\n",
           st >= 0 ? "true" : "false", secs, st, cap);
    fflush(stdout);
    dqd_stop(&d);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    dquantd_bin = getenv("DQUANTD");
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (!strcmp(argv[i], "--dquantd") && i + 1 < argc)
            dquantd_bin = argv[++i];
        else if (!strcmp(argv[i], "--dquant") && i + 1 < argc)
            dquant_bin = argv[++i];
        else if (!strcmp(argv[i], "--daemon-arg") && i + 1 < argc && ndaemon_args < MAX_DAEMON_ARGS - 1)
            daemon_args[ndaemon_args++] = argv[++i];
        else
            break;
    }
    if (!dquantd_bin || i == argc) {
        fprintf(stderr, "usage: dqd_abuse [--dquantd PATH] [--dquant PATH] [--daemon-arg ARG]... "
                        "replies|preauth|silent|metrics|auth|bench...\n");
        return 2;
    }
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "replies"))
            scenario_replies();
        else if (!strcmp(argv[i], "preauth"))
            scenario_preauth();
        else if (!strcmp(argv[i], "silent"))
            scenario_silent();
        else if (!strcmp(argv[i], "metrics"))
            scenario_metrics();
        else if (!strcmp(argv[i], "auth"))
            scenario_auth();
        else if (!strcmp(argv[i], "bench"))
            scenario_bench();
        else {
            fprintf(stderr, "dqd_abuse: unknown scenario '%s'\n", argv[i]);
            return 2;
        }
    }
    return 0;
}
