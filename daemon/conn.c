/* dquantd client connections (see conn.h). */
#include "conn.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctx.h"
#include "dquant/error.h"
#include "lane.h"
#include "logging.h"
#include "ncclpath.h"
#include "ops.h"
#include "tls.h"

#define RBUF_SIZE (64u * 1024u)
#define OFFLOAD_MIN (1u << 20) /* bytes of a frame still to come worth an I/O thread */
#define RD_STALL_MS 5          /* an I/O thread gives the connection back after this long without data */
#define DRAIN_MS 10000u
#define UNIX_SNDBUF (4 << 20) /* bytes asked for a Unix connection's send buffer */
#define PREAUTH_FRAME 8192u   /* largest frame before HELLO has succeeded: a HELLO with its secret */

typedef struct dqd_write {
    uv_write_t w;
    dqd_conn *c;
    uint8_t *head;
    uint8_t *out;
    size_t bytes;
} dqd_write;

static void process_input(dqd_conn *c);
static void flush(dqd_conn *c);
static void req_done(dqd_req *req);
static void tls_pump(dqd_conn *c);
static bool tls_send_output(dqd_conn *c);

/* Every byte a connection holds is counted twice: in c->held, its own backpressure, and in the
 * daemon's client I/O memory (iomem.h), the sum over all connections. */
static void hold(dqd_conn *c, uint64_t n)
{
    c->held += n;
    dqd_iomem_charge(&c->ctx->iomem, n);
}

static void unhold(dqd_conn *c, uint64_t n)
{
    assert(c->held >= n);
    c->held -= n;
    dqd_iomem_release(&c->ctx->iomem, n);
}

/* The only way a connection changes state: forward, one of OPEN → DRAINING → CLOSING → CLOSED or
 * OPEN → CLOSING (see conn.h). */
static void set_state(dqd_conn *c, dqd_conn_state to)
{
    assert((c->state == DQD_CONN_OPEN && (to == DQD_CONN_DRAINING || to == DQD_CONN_CLOSING)) ||
           (c->state == DQD_CONN_DRAINING && to == DQD_CONN_CLOSING) ||
           (c->state == DQD_CONN_CLOSING && to == DQD_CONN_CLOSED));
    c->state = to;
}

static void on_handle_closed(uv_handle_t *h)
{
    dqd_conn *c = h->data;
    assert(c->handles_open > 0);
    if (--c->handles_open > 0)
        return;
    set_state(c, DQD_CONN_CLOSED);
    c->on_closed(c, c->owner);
}

static void close_handles(dqd_conn *c)
{
    c->handles_open = 2;
    uv_close(&c->h.handle, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

void dqd_conn_close(dqd_conn *c)
{
    if (c->state >= DQD_CONN_CLOSING)
        return;
    set_state(c, DQD_CONN_CLOSING);
    dqd_iomem_cancel(&c->ctx->iomem, &c->mem_waiter);
    dqd_nccl_conn_closed(&c->sess);
    dqd_leases_release_owner(&c->ctx->leases, &c->sess); /* leases die with their connection */
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (c->offloaded) {
        /* The socket stays open until the I/O thread has given it back (rd_done). */
        atomic_store_explicit(&c->rd_cancel, true, memory_order_relaxed);
        c->close_deferred = true;
        return;
    }
    close_handles(c);
}

/* ---- deadlines: HELLO, a frame in progress, queued replies, idleness ----
 *
 * One timer per connection, armed for the earliest deadline; deadlines only move later with
 * activity, so the timer is not moved for every byte: when it fires the deadlines are computed
 * again, and it is re-armed earlier only where a new one may come first (a frame starts, replies
 * get queued, reading resumes). */

enum { DL_NONE, DL_HANDSHAKE, DL_FRAME, DL_WRITE, DL_IDLE };

static uint64_t now_ms(const dqd_conn *c)
{
    return uv_now(c->ctx->loop);
}

static bool frame_in_progress(const dqd_conn *c)
{
    return c->fbuf || c->rlen;
}

/* The earliest of c's deadlines (absolute ms in *at) and which one; DL_NONE when there is none. */
static int next_deadline(const dqd_conn *c, uint64_t *at)
{
    const dqd_config *cfg = c->ctx->cfg;
    int which = DL_NONE;
    uint64_t best = UINT64_MAX;
    uint64_t t[5] = {0};
    if (!c->sess.authed)
        t[DL_HANDSHAKE] = c->accepted_ms + cfg->handshake_timeout * 1000ull;
    if (frame_in_progress(c) && !c->stopped_ms)
        t[DL_FRAME] = c->frame_start_ms + cfg->frame_timeout * 1000ull +
                      (c->fbuf ? c->ftotal * 1000ull / cfg->frame_min_rate : 0);
    if (c->writes)
        t[DL_WRITE] = c->tx_ms + cfg->write_timeout * 1000ull;
    else if (cfg->idle_timeout && c->sess.authed && !c->q_head && !frame_in_progress(c) && !c->sess.nchan)
        t[DL_IDLE] = c->active_ms + cfg->idle_timeout * 1000ull;
    for (int i = DL_HANDSHAKE; i <= DL_IDLE; i++) {
        if (t[i] && t[i] < best) {
            best = t[i];
            which = i;
        }
    }
    *at = best;
    return which;
}

static void on_deadline(uv_timer_t *t);

/* Makes sure the timer fires by at (absolute ms). */
static void arm(dqd_conn *c, uint64_t at)
{
    if (c->state != DQD_CONN_OPEN || (c->timer_due_ms && c->timer_due_ms <= at))
        return;
    const uint64_t now = now_ms(c);
    c->timer_due_ms = at;
    uv_timer_start(&c->timer, on_deadline, at > now ? at - now : 0, 0);
}

/* After an event that may have brought a deadline forward. */
static void rearm(dqd_conn *c)
{
    uint64_t at;
    if (next_deadline(c, &at) != DL_NONE)
        arm(c, at);
}

/* Reply bytes written since the last look count as progress of the queued replies. */
static void observe_tx(dqd_conn *c, uint64_t now)
{
    const uint64_t written = c->tx_submitted - uv_stream_get_write_queue_size(&c->h.stream);
    if (written != c->tx_seen)
        c->tx_ms = now;
    c->tx_seen = written;
}

static void fail_and_drain(dqd_conn *c, int code, uint64_t request_id, const char *what);

static void timed_out(dqd_conn *c, int which)
{
    dqd_metrics *m = &c->ctx->metrics;
    const dqd_config *cfg = c->ctx->cfg;
    char what[128];
    switch (which) {
    case DL_HANDSHAKE:
        m->handshake_timeouts++;
        snprintf(what, sizeof what, "no successful HELLO within %u s", cfg->handshake_timeout);
        break;
    case DL_FRAME:
        m->frame_timeouts++;
        snprintf(what, sizeof what, "a frame not complete within %u s + %llu B/s", cfg->frame_timeout,
                 (unsigned long long)cfg->frame_min_rate);
        break;
    case DL_WRITE:
        m->write_timeouts++;
        snprintf(what, sizeof what, "queued replies not read for %u s", cfg->write_timeout);
        break;
    default:
        m->idle_timeouts++;
        snprintf(what, sizeof what, "idle for %u s", cfg->idle_timeout);
        break;
    }
    DQD_INFO_LIMITED("conn %llu: %s; closing", (unsigned long long)c->id, what);
    dqd_metrics_count_error(m, DQ_TIMEOUT);
    if (which == DL_HANDSHAKE || which == DL_FRAME)
        fail_and_drain(c, DQ_TIMEOUT, 0, what); /* it may still read why */
    else
        dqd_conn_close(c);
}

static void on_deadline(uv_timer_t *t)
{
    dqd_conn *c = t->data;
    c->timer_due_ms = 0;
    if (c->state != DQD_CONN_OPEN)
        return;
    const uint64_t now = now_ms(c);
    observe_tx(c, now);
    uint64_t at;
    int which = next_deadline(c, &at);
    if (which == DL_NONE)
        return;
    if (at <= now) {
        timed_out(c, which);
        return;
    }
    arm(c, at);
}

static void on_drain_timeout(uv_timer_t *t)
{
    dqd_conn *c = t->data;
    DQD_DEBUG("conn %llu: drain deadline passed, closing", (unsigned long long)c->id);
    dqd_conn_close(c);
}

void dqd_conn_drain(dqd_conn *c, uint64_t deadline_ms)
{
    if (c->state != DQD_CONN_OPEN)
        return;
    set_state(c, DQD_CONN_DRAINING);
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (c->offloaded)
        atomic_store_explicit(&c->rd_cancel, true, memory_order_relaxed);
    c->timer_due_ms = 0;
    uv_timer_start(&c->timer, on_drain_timeout, deadline_ms, 0);
    flush(c);
}

bool dqd_conn_reapable(const dqd_conn *c)
{
    return c->state == DQD_CONN_CLOSED && !c->q_head && !c->writes;
}

void dqd_conn_free(dqd_conn *c)
{
    assert(c->held == (c->fbuf ? c->ftotal : 0)); /* only a frame cut short is left */
    unhold(c, c->held);
    free(c->rbuf);
    dqd_tls_free(c->tls);
    dqd_framebuf_put(&c->ctx->frames, c->fbuf);
    free(c);
}

/* Before HELLO has succeeded a connection is read one frame at a time: nothing it sends after its
 * HELLO is buffered until that HELLO is answered. */
static bool over_limits(const dqd_conn *c)
{
    const dqd_config *cfg = c->ctx->cfg;
    return c->nreqs >= cfg->max_inflight || c->held >= cfg->max_output_queue || (!c->sess.authed && c->nreqs);
}

/* Where the next plaintext bytes go: the large frame in progress, else the staging buffer. */
static void plain_dest(dqd_conn *c, uv_buf_t *buf)
{
    if (c->fbuf) {
        buf->base = (char *)c->fbuf + c->fpad + c->fhave;
        buf->len = c->ftotal - c->fhave;
        return;
    }
    if (!c->rbuf)
        c->rbuf = malloc(RBUF_SIZE);
    if (!c->rbuf) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    buf->base = (char *)c->rbuf + c->rlen;
    buf->len = RBUF_SIZE - c->rlen;
    if (!c->sess.authed) {
        /* Never more than one frame's worth before HELLO: a longer frame is refused from its header
         * (process_input), a whole one stops reading until it is answered (over_limits). */
        assert(c->rlen < PREAUTH_FRAME);
        buf->len = c->rlen < PREAUTH_FRAME ? PREAUTH_FRAME - c->rlen : 0; /* 0: UV_ENOBUFS, closed */
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    dqd_conn *c = h->data;
    (void)suggested;
    if (c->tls)
        dqd_tls_inbuf(c->tls, &buf->base, &buf->len);
    else
        plain_dest(c, buf);
}

static void start_reading(dqd_conn *c);

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    dqd_conn *c = s->data;
    (void)buf;
    if (nread < 0) {
        if (nread == UV_EOF) {
            /* The client finished sending; answer what it asked, then close. */
            DQD_DEBUG("conn %llu: end of input", (unsigned long long)c->id);
            dqd_conn_drain(c, DRAIN_MS);
        } else {
            DQD_DEBUG("conn %llu: read error: %s", (unsigned long long)c->id, uv_strerror((int)nread));
            dqd_conn_close(c);
        }
        return;
    }
    if (nread == 0)
        return;
    if (c->tls) {
        if (dqd_tls_feed(c->tls, (size_t)nread) < 0) {
            dqd_conn_close(c);
            return;
        }
        tls_pump(c);
        return;
    }
    c->rd_stalled = false;
    c->ctx->metrics.bytes_in += (uint64_t)nread;
    c->active_ms = now_ms(c);
    const bool started = !frame_in_progress(c);
    if (started)
        c->frame_start_ms = c->active_ms;
    if (c->fbuf)
        c->fhave += (size_t)nread;
    else
        c->rlen += (size_t)nread;
    process_input(c);
    if (started || c->frame_start_ms == c->active_ms)
        rearm(c); /* a frame started with these bytes: its deadline may come first */
}

/* ---- I/O threads: the rest of a large frame ---- */

enum { RD_DONE, RD_STALLED, RD_EOF, RD_ERROR };

/* I/O thread: reads fbuf's missing bytes until the frame is complete, the peer closes or fails, no
 * byte comes for RD_STALL_MS, or the loop cancels. */
static void rd_task(void *arg, size_t i)
{
    dqd_conn *c = arg;
    (void)i;
    uint8_t *p = c->fbuf + c->fpad + c->fhave;
    size_t left = c->ftotal - c->fhave, got = 0;
    int st = RD_DONE;
    while (left) {
        if (atomic_load_explicit(&c->rd_cancel, memory_order_relaxed)) {
            st = RD_STALLED;
            break;
        }
        ssize_t n = read(c->rd_fd, p + got, left);
        if (n > 0) {
            got += (size_t)n;
            left -= (size_t)n;
            continue;
        }
        if (n == 0) {
            st = RD_EOF;
            break;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pf = {.fd = c->rd_fd, .events = POLLIN};
            int r = poll(&pf, 1, RD_STALL_MS);
            if (r == 0) {
                st = RD_STALLED;
                break;
            }
            if (r < 0 && errno != EINTR) {
                st = RD_ERROR;
                break;
            }
            continue;
        }
        st = RD_ERROR;
        break;
    }
    c->rd_got = got;
    c->rd_status = st;
}

/* Loop: the I/O thread gave the connection back. */
static void rd_done(void *arg)
{
    dqd_conn *c = arg;
    dqd_ctx *ctx = c->ctx;
    c->offloaded = false;
    ctx->io_busy--;
    c->fhave += c->rd_got;
    ctx->metrics.bytes_in += c->rd_got;
    if (c->rd_got)
        c->active_ms = now_ms(c);
    if (c->close_deferred) {
        c->close_deferred = false;
        close_handles(c);
        return;
    }
    if (c->state != DQD_CONN_OPEN)
        return; /* draining: the frame in progress is dropped with the connection */
    if (c->rd_status == RD_EOF) {
        DQD_DEBUG("conn %llu: end of input inside a frame", (unsigned long long)c->id);
        dqd_conn_drain(c, DRAIN_MS);
        return;
    }
    if (c->rd_status == RD_ERROR) {
        DQD_DEBUG("conn %llu: read error inside a frame", (unsigned long long)c->id);
        dqd_conn_close(c);
        return;
    }
    c->rd_stalled = c->rd_status == RD_STALLED;
    process_input(c);
}

/* Hands the rest of the frame in progress to an idle I/O thread; false: the loop reads it. */
static bool offload(dqd_conn *c)
{
    dqd_ctx *ctx = c->ctx;
    if (c->tls || !c->fbuf || c->ftotal - c->fhave < OFFLOAD_MIN || c->rd_stalled || !ctx->io_lane ||
        ctx->io_busy >= ctx->cfg->io_threads || c->state != DQD_CONN_OPEN || c->paused)
        return false;
    uv_os_fd_t fd;
    if (uv_fileno(&c->h.handle, &fd) < 0)
        return false;
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    c->rd_fd = fd;
    c->rd_got = 0;
    c->rd_status = RD_DONE;
    atomic_store_explicit(&c->rd_cancel, false, memory_order_relaxed);
    c->offloaded = true;
    ctx->io_busy++;
    if (dqd_lane_run(ctx->io_lane, rd_task, rd_done, c) < 0) {
        c->offloaded = false;
        ctx->io_busy--;
        return false;
    }
    ctx->metrics.frame_reads_offloaded++;
    return true;
}

/* Reading goes on: by an I/O thread if offload() hands it one, else by the loop. */
static void start_reading(dqd_conn *c)
{
    if (c->state != DQD_CONN_OPEN || c->paused || c->mem_wait || c->offloaded)
        return;
    if (c->stopped_ms) {
        /* The frame in progress is not late by the time the daemon did not read it. */
        c->frame_start_ms += now_ms(c) - c->stopped_ms;
        c->stopped_ms = 0;
        rearm(c);
    }
    if (offload(c) || c->reading)
        return;
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc < 0) {
        DQD_WARN("conn %llu: uv_read_start: %s", (unsigned long long)c->id, uv_strerror(rc));
        dqd_conn_close(c);
        return;
    }
    c->reading = true;
    if (c->tls)
        tls_pump(c); /* plaintext the session decrypted while reading was paused */
}

static void pause_reading(dqd_conn *c)
{
    if (c->paused)
        return;
    c->paused = true;
    c->ctx->metrics.backpressure_pauses++;
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (!c->stopped_ms)
        c->stopped_ms = now_ms(c);
}

static void maybe_resume(dqd_conn *c)
{
    if (!c->paused || c->state != DQD_CONN_OPEN || over_limits(c))
        return;
    c->paused = false;
    if (c->in_process)
        return; /* the outer process_input goes on and restarts reading */
    process_input(c);
}

/* The daemon's client I/O memory has no room for the next frame: stop reading until bytes are
 * released (mem_woken). */
static void wait_for_memory(dqd_conn *c)
{
    c->mem_wait = true;
    if (c->reading)
        uv_read_stop(&c->h.stream);
    c->reading = false;
    if (!c->stopped_ms)
        c->stopped_ms = now_ms(c);
    dqd_iomem_wait(&c->ctx->iomem, &c->mem_waiter);
}

static void mem_woken(dqd_iomem_waiter *w)
{
    dqd_conn *c = (dqd_conn *)((char *)w - offsetof(dqd_conn, mem_waiter));
    c->mem_wait = false;
    if (c->state == DQD_CONN_OPEN && !c->in_process)
        process_input(c);
}

/* req's operation asks for a reply buffer of bytes: counted against the connection and the daemon's
 * client I/O memory, refused when the latter has no room (this request's own frame aside, a
 * connection that holds nothing else may use the reserve). */
static int charge_reply(dqd_req *req, size_t bytes)
{
    dqd_conn *c = req->owner;
    dqd_iomem *m = &c->ctx->iomem;
    const bool holder = c->held > req->frame_bytes + req->charged;
    if (!dqd_iomem_fits(m, bytes, holder)) {
        m->refused++;
        return DQ_RESOURCE_EXHAUSTED;
    }
    hold(c, bytes);
    req->charged += bytes;
    return DQ_OK;
}

static void enqueue(dqd_conn *c, dqd_req *req)
{
    req->next = NULL;
    if (c->q_tail)
        c->q_tail->next = req;
    else
        c->q_head = req;
    c->q_tail = req;
    c->nreqs++;
}

/* Queues an error reply after the replies already owed, then closes. */
static void fail_and_drain(dqd_conn *c, int code, uint64_t request_id, const char *what)
{
    dqd_req *req = calloc(1, sizeof *req);
    if (req) {
        req->ctx = c->ctx;
        req->sess = &c->sess;
        req->owner = c;
        req->id = request_id;
        req->done = 1;
        req->err = code;
        req->close_after = 1;
        if (dqd_error_frame(request_id, code, what, &req->head, &req->head_len) == 0)
            hold(c, req->head_len);
        enqueue(c, req);
    }
    dqd_conn_drain(c, DRAIN_MS);
}

/* A framing error: the stream cannot be resynchronized. */
static void protocol_error(dqd_conn *c, int code, uint64_t request_id, const char *what)
{
    DQD_INFO_LIMITED("conn %llu: %s (%s); closing", (unsigned long long)c->id, what, dq_err_name(code));
    c->ctx->metrics.protocol_closes++;
    dqd_metrics_count_error(&c->ctx->metrics, code);
    fail_and_drain(c, code, request_id, what);
}

static uint64_t peek_request_id(const uint8_t *p, size_t len)
{
    if (len < DQ_FRAME_HEADER_BYTES)
        return 0;
    uint64_t id = 0;
    for (int i = 7; i >= 0; i--)
        id = id << 8 | p[24 + i];
    return id;
}

static size_t payload_pad(uint32_t header_len)
{
    return (64u - ((DQ_FRAME_HEADER_BYTES + header_len) & 63u)) & 63u;
}

/* A buffer for a frame of total bytes, held by the connection; NULL when out of memory. */
static uint8_t *frame_alloc(dqd_conn *c, size_t pad, size_t total)
{
    uint8_t *buf = dqd_framebuf_get(&c->ctx->frames, pad + total);
    if (buf)
        hold(c, total);
    return buf;
}

static void frame_free(dqd_conn *c, uint8_t *buf, size_t total)
{
    dqd_framebuf_put(&c->ctx->frames, buf);
    unhold(c, total);
}

/* A whole frame at buf + pad: check it, make the request and dispatch it. Takes buf and the
 * connection's hold on its total bytes. */
static void frame_ready(dqd_conn *c, uint8_t *buf, size_t pad, size_t total)
{
    dqd_ctx *ctx = c->ctx;
    dq_frame f;
    size_t consumed;
    int err = 0;
    dq_frame_status st = dq_frame_parse(buf + pad, total, &ctx->frame_limits, &f, &consumed, &err);
    if (st != DQ_FRAME_OK || consumed != total) {
        uint64_t id = peek_request_id(buf + pad, total);
        frame_free(c, buf, total);
        protocol_error(c, err < 0 ? err : DQ_PROTOCOL, id,
                       err == DQ_CORRUPT ? "header checksum mismatch" : "malformed frame");
        return;
    }
    dqd_req *req = calloc(1, sizeof *req);
    if (!req) {
        frame_free(c, buf, total);
        protocol_error(c, DQ_NOMEM, f.hdr.request_id, "out of memory");
        return;
    }
    ctx->metrics.frames_in++;
    req->sess = &c->sess;
    req->owner = c;
    req->on_done = req_done;
    req->charge = charge_reply;
    req->ctx = ctx;
    req->id = f.hdr.request_id;
    req->t0_ns = dqd_now_ns();
    req->frame = buf;
    req->frame_bytes = total;
    req->payload = f.payload;
    req->payload_len = f.hdr.payload_len;
    req->header = f.header;
    req->header_len = f.hdr.header_len;
    enqueue(c, req);
    ctx->reqs_inflight++;

    /* A real request unpacks into at most ~15x its encoded size (many tiny items); beyond this
     * bound the message is built to amplify memory, and unpacking fails instead. */
    dqd_pbmem_init(&req->pbmem, dqd_pbmem_cap(f.hdr.header_len));
    req->msg = dquant__request__unpack(&req->pbmem.a, f.hdr.header_len, f.header);
    if (!req->msg) {
        if (req->pbmem.nomem)
            dqd_req_fail(req, DQ_NOMEM, "out of memory unpacking the header");
        else
            dqd_req_fail(req, DQ_PROTOCOL, "the header message is not a valid dquant.Request");
        return;
    }
    dqd_ops_dispatch(req);
}

static void process_input(dqd_conn *c)
{
    dqd_ctx *ctx = c->ctx;
    if (c->offloaded)
        return; /* rd_done goes on with the frame */
    c->in_process = true;
    size_t off = 0;
    while (c->state == DQD_CONN_OPEN && !c->paused) {
        if (c->fbuf) {
            if (c->fhave < c->ftotal)
                break;
            uint8_t *buf = c->fbuf;
            size_t pad = c->fpad, total = c->ftotal;
            c->fbuf = NULL;
            c->frame_start_ms = now_ms(c); /* the next frame's bytes, if any, came with this one's */
            frame_ready(c, buf, pad, total);
        } else {
            const uint8_t *p = c->rbuf + off;
            size_t avail = c->rlen - off;
            if (avail == 0)
                break;
            dq_frame_header hdr;
            int err = 0;
            dq_frame_status st = dq_frame_parse_header(p, avail, &ctx->frame_limits, &hdr, &err);
            if (st == DQ_FRAME_INCOMPLETE)
                break;
            if (st == DQ_FRAME_ERROR) {
                protocol_error(c, err < 0 ? err : DQ_PROTOCOL, peek_request_id(p, avail),
                               err == DQ_TOO_LARGE ? "frame exceeds the configured limits"
                               : err == DQ_VERSION ? "unsupported wire version"
                                                   : "bad frame header");
                break;
            }
            uint64_t total64 = DQ_FRAME_HEADER_BYTES + (uint64_t)hdr.header_len + hdr.payload_len;
            if (total64 > ctx->cfg->max_frame) {
                protocol_error(c, DQ_TOO_LARGE, hdr.request_id, "frame exceeds max_frame");
                break;
            }
            if (!c->sess.authed && total64 > PREAUTH_FRAME) {
                protocol_error(c, DQ_TOO_LARGE, hdr.request_id,
                               "a frame before a successful HELLO is limited to 8192 bytes");
                break;
            }
            size_t total = (size_t)total64;
            size_t pad = payload_pad(hdr.header_len);
            if (total > RBUF_SIZE || avail >= total) {
                /* Its bytes are held from here on: they must fit the client I/O memory first. */
                if (!dqd_iomem_fits(&ctx->iomem, total, c->held > 0)) {
                    wait_for_memory(c);
                    break;
                }
            }
            if (total > RBUF_SIZE) {
                /* Large frame: give it its own buffer and let the socket fill it in place. */
                uint8_t *buf = frame_alloc(c, pad, total);
                if (!buf) {
                    protocol_error(c, DQ_NOMEM, hdr.request_id, "out of memory for a frame");
                    break;
                }
                memcpy(buf + pad, p, avail);
                c->fbuf = buf;
                c->fpad = pad;
                c->ftotal = total;
                c->fhave = avail;
                off += avail;
                continue;
            }
            if (avail < total)
                break;
            uint8_t *buf = frame_alloc(c, pad, total);
            if (!buf) {
                protocol_error(c, DQ_NOMEM, hdr.request_id, "out of memory for a frame");
                break;
            }
            memcpy(buf + pad, p, total);
            off += total;
            c->frame_start_ms = now_ms(c);
            frame_ready(c, buf, pad, total);
        }
        if (c->state == DQD_CONN_OPEN && over_limits(c))
            pause_reading(c);
    }
    if (off && c->rbuf) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
    c->in_process = false;
    if (c->state == DQD_CONN_OPEN && !c->paused)
        start_reading(c);
}

static void on_write(uv_write_t *w, int status)
{
    dqd_write *wr = w->data;
    dqd_conn *c = wr->c;
    c->writes--;
    unhold(c, wr->bytes);
    c->active_ms = c->tx_ms = now_ms(c);
    if (!c->writes)
        rearm(c);                   /* idle from now: its deadline may come before the one armed */
    if (status == 0 && wr->bytes) { /* a reply (TLS handshake and alert writes carry no bytes) */
        c->ctx->metrics.bytes_out += wr->bytes;
        c->ctx->metrics.frames_out++;
    }
    free(wr->head);
    free(wr->out);
    free(wr);
    if (status < 0 && status != UV_ECANCELED) {
        DQD_DEBUG("conn %llu: write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        dqd_conn_close(c);
    }
    flush(c);
}

static void send_reply(dqd_conn *c, dqd_req *req)
{
    size_t bytes = req->head_len + req->out_len;
    dqd_write *wr = malloc(sizeof *wr);
    if (!wr) {
        unhold(c, bytes);
        dqd_conn_close(c);
        return;
    }
    wr->c = c;
    wr->head = req->head;
    wr->out = req->out;
    wr->bytes = bytes;
    wr->w.data = wr;
    req->head = req->out = NULL;
    /* uv_buf_init takes an unsigned int; on Unix the struct itself holds a size_t. */
    uv_buf_t bufs[2];
    bufs[0].base = (char *)wr->head;
    bufs[0].len = req->head_len;
    bufs[1].base = (char *)wr->out;
    bufs[1].len = req->out_len;
    unsigned nbufs = req->out_len ? 2 : 1;
    size_t wire = bytes;
    if (c->tls) {
        /* The reply goes out sealed; wr->bytes keeps counting its plaintext against the budget. */
        const void *base[2] = {wr->head, wr->out};
        size_t len[2] = {req->head_len, req->out_len};
        size_t ctlen;
        uint8_t *ct = NULL;
        if (dqd_tls_seal(c->tls, base, len, nbufs) == 0)
            ct = dqd_tls_take_output(c->tls, &ctlen);
        free(wr->head);
        free(wr->out);
        wr->head = ct;
        wr->out = NULL;
        if (!ct) {
            free(wr);
            unhold(c, bytes);
            dqd_conn_close(c);
            return;
        }
        bufs[0].base = (char *)ct;
        bufs[0].len = ctlen;
        nbufs = 1;
        wire = ctlen;
    }
    if (!c->writes)
        c->tx_ms = now_ms(c); /* the write deadline runs from here */
    int rc = uv_write(&wr->w, &c->h.stream, bufs, nbufs, on_write);
    if (rc < 0) {
        DQD_DEBUG("conn %llu: uv_write: %s", (unsigned long long)c->id, uv_strerror(rc));
        free(wr->head);
        free(wr->out);
        free(wr);
        unhold(c, bytes);
        dqd_conn_close(c);
        return;
    }
    c->writes++;
    c->tx_submitted += wire; /* observe_tx compares it with libuv's queue, which holds what goes out */
    rearm(c);
}

static void flush(dqd_conn *c)
{
    while (c->q_head && c->q_head->done) {
        dqd_req *req = c->q_head;
        c->q_head = req->next;
        if (!c->q_head)
            c->q_tail = NULL;
        c->nreqs--;
        bool close_after = req->close_after;
        bool writable = c->state == DQD_CONN_OPEN || c->state == DQD_CONN_DRAINING;
        if (writable && req->head) {
            send_reply(c, req);
        } else {
            unhold(c, req->head_len + req->out_len);
            if (writable && !req->head)
                dqd_conn_close(c); /* the reply could not even be built */
        }
        dqd_req_free(req);
        if (close_after && c->state == DQD_CONN_OPEN)
            dqd_conn_drain(c, DRAIN_MS);
    }
    if (c->state == DQD_CONN_DRAINING && !c->q_head && !c->writes &&
        !(c->tls && dqd_tls_close_notify(c->tls) && tls_send_output(c)))
        dqd_conn_close(c);
    if (c->state == DQD_CONN_OPEN)
        maybe_resume(c);
    if (dqd_conn_reapable(c))
        c->on_closed(c, c->owner);
}

/* The request has its reply (or was failed), set as its on_done: an admitted NCCL request lets
 * the channel go on (with its NCCL reply, if any), then replies next in order are sent. */
static void req_done(dqd_req *req)
{
    dqd_conn *c = req->owner;
    assert(!req->done && c->held >= req->frame_bytes);
    if (req->nccl_admitted)
        dqd_nccl_release(req, req->nccl_reply.buf, req->nccl_reply.on_device, req->nccl_reply.len, req->nccl_reply.segs,
                         req->nccl_reply.nseg);
    req->nccl_reply.buf = NULL;
    req->nccl_reply.segs = NULL;
    req->done = 1;
    /* The reply takes the place of the request's frame and of the reply buffer charged for it. */
    hold(c, req->head_len + req->out_len);
    unhold(c, req->frame_bytes + req->charged);
    req->frame_bytes = 0;
    req->charged = 0;
    flush(c);
}

/* ---- TLS (tls.h): ciphertext in through on_read, plaintext into the frame buffers ---- */

/* Writes the session's pending ciphertext (handshake, alerts, close_notify): true when a write is
 * now in flight. A failure closes the connection. */
static bool tls_send_output(dqd_conn *c)
{
    size_t n;
    uint8_t *ct = dqd_tls_take_output(c->tls, &n);
    if (!ct) {
        if (n)
            dqd_conn_close(c);
        return false;
    }
    dqd_write *wr = calloc(1, sizeof *wr);
    if (!wr) {
        free(ct);
        dqd_conn_close(c);
        return false;
    }
    wr->c = c;
    wr->head = ct;
    wr->w.data = wr;
    uv_buf_t b = {.base = (char *)ct, .len = n};
    int rc = uv_write(&wr->w, &c->h.stream, &b, 1, on_write);
    if (rc < 0) {
        free(ct);
        free(wr);
        dqd_conn_close(c);
        return false;
    }
    c->writes++;
    return true;
}

/* Decrypts what the session holds into the frame buffers and processes it, as on_read does with
 * plaintext, until it needs more ciphertext or reading pauses. */
static void tls_pump(dqd_conn *c)
{
    if (c->tls_pumping)
        return;
    c->tls_pumping = true;
    while (c->state == DQD_CONN_OPEN && !c->paused) {
        uv_buf_t b;
        plain_dest(c, &b);
        if (!b.base) {
            dqd_conn_close(c);
            break;
        }
        ssize_t n = dqd_tls_read(c->tls, b.base, b.len);
        tls_send_output(c);
        if (n == DQD_TLS_AGAIN)
            break;
        if (n == DQD_TLS_EOF) {
            dqd_conn_drain(c, DRAIN_MS);
            break;
        }
        if (n < 0) {
            /* Logged once by tls.c; draining lets the alert go out before the close. */
            c->ctx->metrics.protocol_closes++;
            dqd_conn_drain(c, DRAIN_MS);
            break;
        }
        c->ctx->metrics.bytes_in += (uint64_t)n;
        c->active_ms = now_ms(c);
        const bool started = !frame_in_progress(c);
        if (started)
            c->frame_start_ms = c->active_ms;
        if (c->fbuf)
            c->fhave += (size_t)n;
        else
            c->rlen += (size_t)n;
        process_input(c);
        if (started || c->frame_start_ms == c->active_ms)
            rearm(c);
    }
    c->tls_pumping = false;
}

/* A TCP connection of a TLS daemon: its session (the handshake runs under the HELLO deadline,
 * --handshake-timeout). False: closed. */
static bool tls_start(dqd_conn *c)
{
    c->tls = dqd_tls_new(c->ctx->tls, c->id);
    if (!c->tls) {
        DQD_ERROR("conn %llu: out of memory for a TLS session", (unsigned long long)c->id);
        dqd_conn_close(c);
        return false;
    }
    return true;
}

dqd_conn *dqd_conn_create(dqd_ctx *ctx, bool tcp, bool require_secret, uint64_t id, dqd_conn_closed_fn on_closed,
                          void *owner)
{
    dqd_conn *c = calloc(1, sizeof *c);
    if (!c) {
        DQD_ERROR("out of memory accepting a connection");
        return NULL;
    }
    c->ctx = ctx;
    c->tcp = tcp;
    c->id = id;
    c->sess.id = id;
    c->sess.require_secret = require_secret;
    c->on_closed = on_closed;
    c->owner = owner;
    int rc = tcp ? uv_tcp_init(ctx->loop, &c->h.tcp) : uv_pipe_init(ctx->loop, &c->h.pipe, 0);
    if (rc < 0) {
        DQD_ERROR("cannot initialize a connection handle: %s", uv_strerror(rc));
        free(c);
        return NULL;
    }
    uv_timer_init(ctx->loop, &c->timer);
    c->h.handle.data = c;
    c->timer.data = c;
    c->mem_waiter.wake = mem_woken;
    return c;
}

void dqd_conn_accept(dqd_conn *c, uv_stream_t *listener)
{
    dqd_ctx *ctx = c->ctx;
    int rc = uv_accept(listener, &c->h.stream);
    if (rc < 0) {
        DQD_WARN("accept: %s", uv_strerror(rc));
        dqd_conn_close(c);
        return;
    }
    if (c->tcp) {
        uv_tcp_nodelay(&c->h.tcp, 1);
        struct sockaddr_storage ss;
        int sl = (int)sizeof ss;
        if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&ss, &sl) == 0)
            dqd_peer_from_sockaddr(&ss, &c->sess.peer);
    } else {
        /* A Unix stream holds at most the sender's send buffer in flight (212,992 bytes by
         * default): a larger one lets a large reply go out in fewer writes and wake-ups (the kernel
         * caps it at net.core.wmem_max; TCP keeps its autotuning). */
        int sndbuf = UNIX_SNDBUF;
        (void)uv_send_buffer_size(&c->h.handle, &sndbuf);
    }

    if (ctx->stopping || ctx->metrics.conns_open > ctx->cfg->max_connections) {
        ctx->metrics.conns_rejected++;
        int code = ctx->stopping ? DQ_SHUTTING_DOWN : DQ_RESOURCE_EXHAUSTED;
        dqd_metrics_count_error(&ctx->metrics, code);
        DQD_WARN_LIMITED("refusing connection %llu: %s", (unsigned long long)c->id,
                         ctx->stopping ? "shutting down" : "max_connections reached");
        fail_and_drain(c, code, 0, ctx->stopping ? "the server is shutting down" : "too many connections");
        return;
    }
    ctx->metrics.conns_accepted++;
    DQD_DEBUG("conn %llu accepted on %s", (unsigned long long)c->id, c->tcp ? "tcp" : "unix");
    c->accepted_ms = c->active_ms = now_ms(c);
    if (c->tcp && ctx->tls && !tls_start(c))
        return;
    start_reading(c);
    rearm(c);
}
