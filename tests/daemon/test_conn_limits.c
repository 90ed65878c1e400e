/* dquantd under hostile or broken clients (issue 18): what a connection may make the daemon hold,
 * before and after HELLO, how long it may stay silent or slow, what the metrics endpoint and the
 * authentication do under floods. Each test starts its own daemon with small limits; the full-size
 * figures come from dqd_abuse (abuse.c). */
#define _GNU_SOURCE /* POLLRDHUP */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "amplify.h"
#include "dqd_child.h"
#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "frame.h"
#include "wire.h"

/* Under AddressSanitizer freed memory waits in a quarantine, so the daemon's RSS says nothing about
 * what it holds: the RSS checks are left to the other builds (STATS still is checked). */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_MEANINGFUL 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_MEANINGFUL 0
#endif
#endif
#ifndef RSS_MEANINGFUL
#define RSS_MEANINGFUL 1
#endif

static dqd_daemon D;

static void nap_ms(long ms);

/* Starts a daemon and waits until the connections dqd_start made to see it come up are gone, so that
 * tests of --max-connections count their own only. */
static void start(const char *const extra[], int tcp)
{
    const dqd_opts o = {.tcp = tcp, .extra = extra, .stop_timeout_ms = 30000};
    cr_assert_eq(dqd_start(&D, &o), 0, "dquantd did not come up");
    nap_ms(200);
}

static void stop(void)
{
    if (!D.pid)
        return;
    int st = dqd_stop(&D);
    cr_assert_eq(st, 0, "dquantd must exit 0 on SIGTERM (no leaks, no crash), got %d", st);
}

TestSuite(connlimits, .fini = stop, .timeout = 120);

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

static int connect_unix(void)
{
    int fd = wire_connect_unix(D.sock);
    cr_assert_geq(fd, 0);
    return fd;
}

static int session(void)
{
    int fd = connect_unix();
    cr_assert_eq(wire_hello(fd, 1, NULL), 0);
    return fd;
}

/* One STATS value (counter or gauge) over fd. */
static double stat_of(int fd, const char *name)
{
    Dquant__Stats s = DQUANT__STATS__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_STATS;
    req.stats = &s;
    Dquant__Response *r;
    cr_assert_eq(wire_call(fd, &req, NULL, &r, NULL, NULL), 0, "no STATS reply");
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_STATS, "STATS failed: %d", wire_error(r));
    double v = -1;
    for (size_t i = 0; i < r->stats->n_counters; i++)
        if (strcmp(r->stats->counters[i]->key, name) == 0)
            v = (double)r->stats->counters[i]->value;
    for (size_t i = 0; i < r->stats->n_gauges; i++)
        if (strcmp(r->stats->gauges[i]->key, name) == 0)
            v = r->stats->gauges[i]->value;
    dquant__response__free_unpacked(r, NULL);
    cr_assert_geq(v, 0, "STATS has no %s", name);
    return v;
}

/* A PING round trip. */
static void ping(int fd)
{
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    Dquant__Response *r;
    cr_assert_eq(wire_call(fd, &req, NULL, &r, NULL, NULL), 0, "no PONG");
    cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_PONG, "PING failed: %d", wire_error(r));
    dquant__response__free_unpacked(r, NULL);
}

/* A DECOMPRESS frame of one value token under a profile of 8 x 1024 values with a container as small
 * as it allows: ~40 bytes of records in, 32 KiB of f32 out. */
static uint8_t *amplifying_frame(size_t *len, size_t *reply_bytes)
{
    size_t rb;
    uint8_t *f = amplify_decompress_frame(8, 7, len, reply_bytes, &rb);
    cr_assert_not_null(f, "cannot build the DECOMPRESS frame");
    return f;
}

/* Sends frame up to count times on fd while the daemon takes it within wait_ms each; whole frames
 * sent. */
static int send_while_taken(int fd, const uint8_t *frame, size_t len, int count, int wait_ms)
{
    int sent = 0;
    for (; sent < count; sent++) {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, wait_ms) <= 0)
            break;
        cr_assert_eq(wire_send_all(fd, frame, len), 0);
    }
    return sent;
}

/* ================= item 1: memory that replies make the daemon hold ================= */

/* 16 connections pipeline requests with 32 KiB replies and never read. Each may queue 4 MiB before
 * the daemon stops reading it (64 MiB together); the client I/O budget of 8 MiB bounds them all. */
Test(connlimits, io_memory_bounds_what_all_connections_hold)
{
    const char *extra[] = {"--max-payload", "1M", "--max-io-memory", "8M", "--max-output-queue", "4M", NULL};
    start(extra, 0);
    size_t flen, reply;
    uint8_t *frame = amplifying_frame(&flen, &reply);
    enum { CONNS = 16, PER_CONN = 1024 };
    int fds[CONNS];
    for (int i = 0; i < CONNS; i++)
        fds[i] = session();
    const long rss0 = dqd_rss_kb(&D);
    int sent[CONNS];
    for (int i = 0; i < CONNS; i++)
        sent[i] = send_while_taken(fds[i], frame, flen, PER_CONN, 500);
    nap_ms(1500);
    const long rss1 = dqd_rss_kb(&D);

    /* A fresh client is served meanwhile (the reserve for connections that hold nothing). */
    double t0 = now_s();
    int fd = session();
    ping(fd);
    cr_assert_lt(now_s() - t0, 10.0);
    if (RSS_MEANINGFUL)
        cr_assert_lt(rss1 - rss0, 32 * 1024, "RSS grew by %ld KiB for unread replies", rss1 - rss0);
    const double peak = stat_of(fd, "io_memory_peak"), budget = stat_of(fd, "io_memory_budget");
    cr_assert_eq(budget, 8 << 20);
    cr_assert_leq(peak, 8 << 20, "the daemon held %.0f bytes for clients, over its budget", peak);
    cr_assert_gt(stat_of(fd, "io_memory_waits") + stat_of(fd, "io_memory_refused"), 0);

    /* Every request is answered in order, with its reply or RESOURCE_EXHAUSTED, once read. */
    int replies = 0, refused = 0;
    for (int i = 0; i < sent[0]; i++) {
        Dquant__Response *r;
        size_t plen = 0;
        uint8_t *payload = NULL;
        cr_assert_eq(wire_recv_within(fds[0], 10000, NULL, &r, &payload, &plen), 0, "reply %d of %d", i, sent[0]);
        if (r->body_case == DQUANT__RESPONSE__BODY_DECOMPRESS) {
            cr_assert_eq(plen, reply);
            replies++;
        } else {
            cr_assert_eq(wire_error(r), DQ_RESOURCE_EXHAUSTED, "got %d", wire_error(r));
            cr_assert(strstr(r->error->message, "max_io_memory"), "%s", r->error->message);
            refused++;
        }
        free(payload);
        dquant__response__free_unpacked(r, NULL);
    }
    cr_assert_gt(replies, 0);
    for (int i = 0; i < CONNS; i++)
        close(fds[i]);
    /* What the closed connections held comes back. */
    double used = 0;
    for (int tries = 0; tries < 50; tries++) {
        used = stat_of(fd, "io_memory_used");
        if (used < 64 * 1024)
            break;
        nap_ms(100);
    }
    cr_assert_lt(used, 64 * 1024, "%.0f bytes still held after every abuser closed", used);
    close(fd);
    free(frame);
}

/* ================= item 2: what a connection may send before HELLO ================= */

#define SECRET "s3cret-of-the-tests"

/* 1 when the peer closes (EOF or reset) within timeout_ms, after whatever it sends first. */
static int closed_within(int fd, int timeout_ms)
{
    return wire_wait_eof(fd, timeout_ms) == 0;
}

/* The fixed header of a HELLO frame (wrong secret when secret is NULL) announcing payload bytes after
 * its header message; the header message follows in *msg (hlen bytes). */
static size_t hello_head(uint8_t *out, size_t cap, const char *secret, uint64_t payload, uint64_t id)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    h.secret.data = (uint8_t *)(secret ? secret : "wrong");
    h.secret.len = strlen(secret ? secret : "wrong");
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    size_t hlen = dquant__request__get_packed_size(&req);
    cr_assert_leq(DQ_FRAME_HEADER_BYTES + hlen, cap);
    dquant__request__pack(&req, out + DQ_FRAME_HEADER_BYTES);
    dq_frame_write_header(out, out + DQ_FRAME_HEADER_BYTES, (uint32_t)hlen, payload, id);
    return DQ_FRAME_HEADER_BYTES + hlen;
}

/* A connection that has not said HELLO announces a 256 MiB frame on a secret-protected listener: it is
 * refused from the header, before anything is allocated. */
Test(connlimits, large_frame_before_hello_is_refused_from_its_header)
{
    const char *extra[] = {"--secret", SECRET, NULL};
    start(extra, 1);
    uint8_t head[256];
    enum { CONNS = 4 };
    int fds[CONNS];
    for (int i = 0; i < CONNS; i++) {
        fds[i] = wire_connect_tcp(D.port);
        cr_assert_geq(fds[i], 0);
        size_t n = hello_head(head, sizeof head, NULL, 256u << 20, 5);
        cr_assert_eq(wire_send_all(fds[i], head, n), 0);
    }
    for (int i = 0; i < CONNS; i++) {
        Dquant__Response *r;
        uint64_t id;
        cr_assert_eq(wire_recv_within(fds[i], 5000, &id, &r, NULL, NULL), 0, "no answer to the header");
        cr_assert_eq(wire_error(r), DQ_TOO_LARGE);
        cr_assert_eq(id, 5);
        cr_assert(strstr(r->error->message, "before a successful HELLO"), "%s", r->error->message);
        dquant__response__free_unpacked(r, NULL);
        cr_assert(closed_within(fds[i], 5000));
        close(fds[i]);
    }
    /* Once authenticated, the same size is fine. */
    int fd = wire_connect_tcp(D.port);
    cr_assert_eq(wire_hello(fd, 1, SECRET), 0);
    cr_assert_lt(stat_of(fd, "io_memory_peak"), 64 * 1024, "nothing of the announced frames was held");
    close(fd);
}

/* ================= item 5: requests before HELLO ================= */

/* 20 PINGs pipelined before any HELLO (a listener without a secret): one UNAUTHENTICATED answer, then
 * the connection closes. */
Test(connlimits, requests_before_hello_are_answered_once_and_closed)
{
    start(NULL, 0);
    Dquant__Ping p = DQUANT__PING__INIT;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PING;
    req.ping = &p;
    size_t flen;
    uint8_t *f = wire_frame(&req, NULL, 0, 3, &flen);
    uint8_t *all = malloc(20 * flen);
    for (int i = 0; i < 20; i++)
        memcpy(all + (size_t)i * flen, f, flen);
    int fd = connect_unix();
    cr_assert_eq(wire_send_all(fd, all, 20 * flen), 0);
    int answered = 0;
    for (;;) {
        Dquant__Response *r;
        if (wire_recv_within(fd, 3000, NULL, &r, NULL, NULL) != 0)
            break;
        cr_assert_eq(wire_error(r), DQ_UNAUTHENTICATED);
        answered++;
        dquant__response__free_unpacked(r, NULL);
    }
    cr_assert_eq(answered, 1, "%d requests answered before HELLO", answered);
    close(fd);
    free(all);
    free(f);
    fd = session();
    cr_assert_eq(stat_of(fd, "errors.UNAUTHENTICATED"), 1);
    close(fd);
}

/* ================= item 3: silent, slow and idle connections ================= */

static long count_log(const char *needle)
{
    FILE *f = fopen(D.log, "r");
    cr_assert_not_null(f);
    char line[4096];
    long n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A HELLO + PING on a fresh connection: 1 when both are answered within timeout_ms. */
static int real_client_served(int timeout_ms)
{
    int fd = wire_connect_unix(D.sock);
    if (fd < 0)
        return 0;
    int ok = 0;
    Dquant__Response *r = NULL;
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    if (wire_send(fd, &req, NULL, 1) == 0 && wire_recv_within(fd, timeout_ms, NULL, &r, NULL, NULL) == 0)
        ok = r->body_case == DQUANT__RESPONSE__BODY_HELLO;
    if (r)
        dquant__response__free_unpacked(r, NULL);
    close(fd);
    return ok;
}

/* max-connections silent connections: a real client gets a slot once the handshake timeout has
 * closed them, each with a TIMEOUT error it may read. */
Test(connlimits, silent_connections_give_their_slots_back)
{
    const char *extra[] = {"--max-connections", "8", "--handshake-timeout", "1", NULL};
    start(extra, 0);
    int fds[8];
    for (int i = 0; i < 8; i++)
        fds[i] = connect_unix();
    nap_ms(100);
    for (int i = 0; i < 8; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        cr_assert_eq(poll(&p, 1, 0), 0, "silent connection %d was refused", i);
    }
    const double t0 = now_s();
    cr_assert_not(real_client_served(300), "the slots are all taken");
    double got = -1;
    while (now_s() - t0 < 6) {
        if (real_client_served(500)) {
            got = now_s() - t0;
            break;
        }
        nap_ms(50);
    }
    cr_assert_geq(got, 0, "no slot for a real client within 6 s");
    cr_assert_lt(got, 4.0, "a slot after %.2f s", got);
    for (int i = 0; i < 8; i++) {
        Dquant__Response *r;
        cr_assert_eq(wire_recv_within(fds[i], 2000, NULL, &r, NULL, NULL), 0);
        cr_assert_eq(wire_error(r), DQ_TIMEOUT);
        cr_assert(strstr(r->error->message, "HELLO"), "%s", r->error->message);
        dquant__response__free_unpacked(r, NULL);
        cr_assert(closed_within(fds[i], 2000));
        close(fds[i]);
    }
    int fd = session();
    cr_assert_eq(stat_of(fd, "handshake_timeouts"), 8);
    close(fd);
}

/* The lines for refused connections are limited: 40 refusals, at most DQD_LOGRATE_BURST (5) lines and
 * the rest counted. */
Test(connlimits, refusals_cannot_flood_the_log)
{
    const char *extra[] = {"--max-connections", "1", NULL};
    start(extra, 0);
    int holder = session();
    for (int i = 0; i < 40; i++) {
        int fd = connect_unix();
        Dquant__Response *r;
        cr_assert_eq(wire_recv_within(fd, 2000, NULL, &r, NULL, NULL), 0);
        cr_assert_eq(wire_error(r), DQ_RESOURCE_EXHAUSTED);
        dquant__response__free_unpacked(r, NULL);
        close(fd);
    }
    const long lines = count_log("refusing connection");
    cr_assert_leq(lines, 5, "%ld refusal lines", lines);
    cr_assert_geq(stat_of(holder, "log_lines_suppressed"), 35);
    cr_assert_eq(stat_of(holder, "connections_rejected"), 40);
    close(holder);
}

/* A frame whose bytes come one per 100 ms: closed once the frame timeout (1 s, plus its 64 KiB at
 * 1 MiB/s) has passed, for a frame in the staging buffer and for one in its own buffer. */
Test(connlimits, slow_frames_are_closed)
{
    const char *extra[] = {"--frame-timeout", "1", "--frame-min-rate", "1M", NULL};
    start(extra, 0);
    for (int big = 0; big < 2; big++) {
        int fd = session();
        uint8_t head[256];
        size_t n = hello_head(head, sizeof head, NULL, big ? 64u << 10 : 0, 9);
        const double t0 = now_s();
        double closed = -1;
        for (size_t i = 0; now_s() - t0 < 6; i++) {
            const uint8_t b = i < n ? head[i] : 0;
            if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) {
                closed = now_s() - t0;
                break;
            }
            struct pollfd p = {fd, POLLIN, 0};
            if (poll(&p, 1, 100) > 0) {
                Dquant__Response *r;
                cr_assert_eq(wire_recv_within(fd, 1000, NULL, &r, NULL, NULL), 0);
                cr_assert_eq(wire_error(r), DQ_TIMEOUT, "got %d", wire_error(r));
                dquant__response__free_unpacked(r, NULL);
                cr_assert(closed_within(fd, 2000));
                closed = now_s() - t0;
                break;
            }
        }
        cr_assert_geq(closed, 0.9, "closed after %.2f s", closed);
        cr_assert_lt(closed, 4.0, "closed after %.2f s (-1: still open after 6 s)", closed);
        close(fd);
    }
    int fd = session();
    cr_assert_eq(stat_of(fd, "frame_timeouts"), 2);
    close(fd);
}

/* An idle connection is closed after the idle timeout; one that keeps asking is not. */
Test(connlimits, idle_connections_are_closed)
{
    const char *extra[] = {"--idle-timeout", "1", NULL};
    start(extra, 0);
    int idle = session(), busy = session();
    const double t0 = now_s();
    while (now_s() - t0 < 2.5) {
        ping(busy);
        nap_ms(250);
    }
    cr_assert(closed_within(idle, 100), "the idle connection is closed");
    ping(busy);
    cr_assert_eq(stat_of(busy, "idle_timeouts"), 1);
    close(idle);
    close(busy);
}

/* 1 when the peer closes within timeout_ms, seen without reading what it sent (reading would let the
 * daemon write again). */
static int hung_up_within(int fd, int timeout_ms)
{
    struct pollfd p = {fd, POLLRDHUP, 0};
    return poll(&p, 1, timeout_ms) > 0 && (p.revents & (POLLRDHUP | POLLHUP));
}

/* Pushes what the socket takes now of buf[*off, len). */
static void push(int fd, const uint8_t *buf, size_t len, size_t *off)
{
    while (*off < len) {
        ssize_t w = send(fd, buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0)
            return;
        *off += (size_t)w;
    }
}

/* A client that asks for replies and stops reading them is closed after the write timeout, and what
 * its replies held comes back; one that reads slowly but steadily is not. */
Test(connlimits, unread_replies_are_closed_after_the_write_timeout)
{
    const char *extra[] = {"--write-timeout", "3", "--max-payload", "1M", "--max-output-queue", "16M", NULL};
    start(extra, 0);
    size_t flen, reply;
    uint8_t *frame = amplifying_frame(&flen, &reply);
    int slow = session(), stuck = session();
    /* Far more than the kernel buffers take (8 MiB here): the rest waits in the daemon. */
    const int count = (int)((48u << 20) / reply);
    const size_t total = (size_t)count * flen;
    uint8_t *all = malloc(total);
    for (int i = 0; i < count; i++)
        memcpy(all + (size_t)i * flen, frame, flen);
    /* slow reads 32 replies (1 MiB) every 200 ms for 5 s, then the rest. A Unix socket turns writable
     * again only once 3/4 of its send buffer has been read, so the daemon sees progress every 1.2 s
     * of that, within the 3 s. */
    size_t soff = 0, toff = 0;
    int replies = 0;
    const double t0 = now_s();
    while (replies < count && now_s() - t0 < 60) {
        const bool first_phase = now_s() - t0 < 5;
        if (first_phase)
            push(stuck, all, total, &toff);
        push(slow, all, total, &soff);
        for (int k = 0; k < 32 && replies < (int)(soff / flen); k++) {
            Dquant__Response *r;
            uint8_t *payload = NULL;
            size_t plen = 0;
            cr_assert_eq(wire_recv_within(slow, 5000, NULL, &r, &payload, &plen), 0,
                         "the slow reader lost its connection after %d replies", replies);
            cr_assert_eq(r->body_case, DQUANT__RESPONSE__BODY_DECOMPRESS, "%d", wire_error(r));
            cr_assert_eq(plen, reply);
            free(payload);
            dquant__response__free_unpacked(r, NULL);
            replies++;
        }
        if (first_phase)
            nap_ms(200);
    }
    cr_assert_eq(replies, count);
    cr_assert(hung_up_within(stuck, 8000), "the client that reads nothing is closed");
    int fd = session();
    cr_assert_eq(stat_of(fd, "write_timeouts"), 1);
    cr_assert_lt(stat_of(fd, "io_memory_used"), 1 << 20);
    close(fd);
    close(slow);
    close(stuck);
    free(all);
    free(frame);
}

/* ================= item 5: failed HELLOs ================= */

/* HELLO over a fresh TCP connection; returns its error code (0: accepted) and the message in msg. */
static int tcp_hello(const char *secret, char *msg, size_t msglen)
{
    int fd = wire_connect_tcp(D.port);
    cr_assert_geq(fd, 0);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = h.max_version = 1;
    h.secret.data = (uint8_t *)secret;
    h.secret.len = strlen(secret);
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    Dquant__Response *r;
    cr_assert_eq(wire_send(fd, &req, NULL, 1), 0);
    cr_assert_eq(wire_recv_within(fd, 3000, NULL, &r, NULL, NULL), 0, "no answer to HELLO");
    const int err = wire_error(r);
    snprintf(msg, msglen, "%s", err ? r->error->message : "");
    dquant__response__free_unpacked(r, NULL);
    if (err)
        cr_assert(closed_within(fd, 2000), "a failed HELLO closes the connection");
    close(fd);
    return err;
}

/* Wrong secrets from one address: 3 are checked, then HELLOs are refused unchecked (the right secret
 * too) until a token comes back (one a second here); their log lines are limited. */
Test(connlimits, failed_hellos_are_throttled_per_address)
{
    const char *extra[] = {"--secret", SECRET, "--auth-fail-burst", "3", "--auth-fail-per-min", "60", NULL};
    start(extra, 1);
    char msg[256];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(tcp_hello("guess", msg, sizeof msg), DQ_UNAUTHENTICATED);
        cr_assert(strstr(msg, "wrong or missing secret"), "%s", msg);
    }
    const double t0 = now_s();
    cr_assert_eq(tcp_hello("guess", msg, sizeof msg), DQ_UNAUTHENTICATED);
    cr_assert(strstr(msg, "too many failed authentications"), "%s", msg);
    cr_assert_eq(tcp_hello(SECRET, msg, sizeof msg), DQ_UNAUTHENTICATED, "throttled: unchecked");
    cr_assert(strstr(msg, "too many failed authentications"), "%s", msg);
    nap_ms((long)(1000 * (1.15 - (now_s() - t0))));
    cr_assert_eq(tcp_hello(SECRET, msg, sizeof msg), 0, "a token is back after a second: %s", msg);
    for (int i = 0; i < 30; i++)
        cr_assert_eq(tcp_hello("guess", msg, sizeof msg), DQ_UNAUTHENTICATED);
    const long lines = count_log("HELLO from");
    cr_assert_leq(lines, 10, "%ld lines for %d failed HELLOs", lines, 35);
    int fd = session(); /* the Unix socket needs no secret */
    cr_assert_leq(stat_of(fd, "auth_failures"), 5);
    cr_assert_geq(stat_of(fd, "auth_throttled"), 30);
    cr_assert_geq(stat_of(fd, "log_lines_suppressed"), 25);
    close(fd);
}

/* ================= item 4: the metrics endpoint ================= */

/* Sends request on a fresh connection to the metrics port and reads the answer until the server
 * closes (at most timeout_ms); malloc'd text, "" when nothing came. */
static char *http_exchange(uint16_t port, const char *request, int timeout_ms)
{
    int fd = wire_connect_tcp(port);
    cr_assert_geq(fd, 0);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    buf[0] = 0;
    if (wire_send_all(fd, request, strlen(request)) == 0) {
        const double t0 = now_s();
        for (;;) {
            const int left = timeout_ms - (int)((now_s() - t0) * 1000);
            struct pollfd p = {fd, POLLIN, 0};
            if (left <= 0 || poll(&p, 1, left) <= 0)
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
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

static uint16_t metrics_port;

static void start_with_metrics(const char *const more[])
{
    metrics_port = dqd_free_port();
    static char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%u", metrics_port);
    static const char *argv[16];
    int n = 0;
    argv[n++] = "--metrics";
    argv[n++] = hp;
    for (int i = 0; more && more[i] && n < 15; i++)
        argv[n++] = more[i];
    argv[n] = NULL;
    start(argv, 0);
}

/* 70 connections that send nothing (more than the old limit of 64): a /healthz probe is still
 * answered every time, and the idle ones are closed after the timeout. */
Test(connlimits, healthz_probe_gets_in_past_idle_connections)
{
    const char *more[] = {"--metrics-max-connections", "8", "--metrics-timeout-ms", "1000", NULL};
    start_with_metrics(more);
    enum { IDLE = 70 };
    int fds[IDLE];
    for (int i = 0; i < IDLE; i++) {
        fds[i] = wire_connect_tcp(metrics_port);
        cr_assert_geq(fds[i], 0);
    }
    nap_ms(100);
    for (int i = 0; i < 5; i++) {
        char *r = http_exchange(metrics_port, "GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n", 1000);
        cr_assert(strstr(r, "HTTP/1.1 200 OK") && strstr(r, "\r\n\r\nok\n"), "probe %d: '%s'", i, r);
        free(r);
    }
    /* the newest idle ones were evicted by the probes or closed by their time */
    for (int i = 0; i < IDLE; i++) {
        cr_assert(closed_within(fds[i], 2000), "idle metrics connection %d still open", i);
        close(fds[i]);
    }
    int fd = session();
    cr_assert_geq(stat_of(fd, "metrics_connections_evicted"), IDLE - 8);
    cr_assert_geq(stat_of(fd, "metrics_connections_timed_out"), 1);
    close(fd);
}

/* With a token, /metrics wants it and /healthz does not. */
Test(connlimits, metrics_token_guards_metrics_not_healthz)
{
    const char *more[] = {"--metrics-token", "t0ken-of-the-tests", NULL};
    start_with_metrics(more);
    char *r = http_exchange(metrics_port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 2000);
    cr_assert(strstr(r, "HTTP/1.1 401 Unauthorized") && strstr(r, "WWW-Authenticate: Bearer"), "%s", r);
    cr_assert_null(strstr(r, "dquant_"), "no metrics without the token");
    free(r);
    r = http_exchange(metrics_port, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer t0ken-of-the-test\r\n\r\n", 2000);
    cr_assert(strstr(r, "401"), "a prefix of the token is not the token: %s", r);
    free(r);
    r = http_exchange(metrics_port,
                      "GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization: bearer t0ken-of-the-tests\r\n\r\n", 2000);
    cr_assert(strstr(r, "HTTP/1.1 200 OK") && strstr(r, "dquant_metrics_unauthorized_total 2"), "%.300s", r);
    free(r);
    r = http_exchange(metrics_port, "GET /healthz HTTP/1.1\r\n\r\n", 2000);
    cr_assert(strstr(r, "HTTP/1.1 200 OK"), "%s", r);
    free(r);
}
