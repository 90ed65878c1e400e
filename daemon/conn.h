/* dquantd client connections: framing, ordered replies, backpressure, close and reap.
 *
 * States: OPEN (reading frames) → DRAINING (not reading; in-flight requests finish and their
 * replies are sent, then close) → CLOSING (handles closing) → CLOSED (waiting for the reaper;
 * freed once no request refers to it). A connection is never freed inside one of its callbacks.
 *
 * Backpressure: reading stops while the connection holds max_inflight unanswered requests or
 * max_output_queue bytes (frames in progress + reply buffers of its requests + replies not yet
 * written), and resumes when it drains; it also stops while the daemon's client I/O memory
 * (iomem.h: the same bytes, summed over every connection) has no room for the next frame.
 *
 * Before HELLO has succeeded a connection may send one frame of at most 8 KiB (a HELLO and its
 * secret) and nothing else is read until it is answered; anything but HELLO is answered
 * UNAUTHENTICATED and the connection closed (ops.c).
 *
 * Frames are assembled in a 64 KiB staging buffer, or directly in their own buffer when
 * larger, sized only from a fixed header that dq_frame_parse_header has checked against the limits.
 * While 1 MiB or more of such a frame is still to come and an I/O thread is idle (io_threads), that
 * thread reads it straight from the socket, so one event loop does not copy every connection's
 * large PUT; when the data stalls (no byte for RD_STALL_MS) the loop takes the connection back. */
#ifndef DQD_CONN_H
#define DQD_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "frame.h"
#include "iomem.h"
#include "request.h"

typedef struct dqd_ctx dqd_ctx;
typedef struct dqd_conn dqd_conn;

/* Called when a closed connection has no request left that refers to it: the owner may free it. */
typedef void (*dqd_conn_closed_fn)(dqd_conn *c, void *arg);

typedef enum dqd_conn_state {
    DQD_CONN_OPEN = 0,
    DQD_CONN_DRAINING = 1,
    DQD_CONN_CLOSING = 2,
    DQD_CONN_CLOSED = 3,
} dqd_conn_state;

struct dqd_conn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_timer_t timer; /* OPEN: the next deadline (conn.c); DRAINING: the drain deadline */
    dqd_ctx *ctx;
    dqd_conn_closed_fn on_closed;
    void *owner; /* on_closed's argument */
    bool tcp;    /* else a Unix socket */
    uint64_t id;
    dqd_conn_state state;
    int handles_open;
    bool reading;  /* uv_read_start active */
    bool paused;   /* backpressure */
    bool mem_wait; /* waiting for room in the client I/O memory */
    dqd_iomem_waiter mem_waiter;
    bool in_process;  /* inside process_input (no re-entry) */
    dqd_session sess; /* what its requests' operations see (request.h) */
    bool reap_queued;

    uint8_t *rbuf; /* staging buffer */
    size_t rlen;
    uint8_t *fbuf; /* a large frame received in place */
    size_t fpad, ftotal, fhave;

    /* An I/O thread reading the rest of fbuf (conn.c): set and cleared on the loop; the thread
     * touches only the socket, fbuf's missing bytes and rd_got/rd_status. */
    bool offloaded;
    bool rd_stalled;        /* its data stalled: the loop reads until the next chunk arrives */
    bool close_deferred;    /* dqd_conn_close waits for the thread */
    _Atomic bool rd_cancel; /* the loop asks the thread to give the connection back */
    int rd_fd;
    size_t rd_got;
    int rd_status;

    struct dqd_tls *tls; /* TLS session (tls.h); NULL: plaintext */
    bool tls_pumping;    /* inside tls_pump (no re-entry) */

    dqd_req *q_head, *q_tail; /* requests in arrival order, until their reply is written out */
    uint32_t nreqs;
    uint64_t held;   /* bytes of frames in progress, reply buffers charged and replies not yet written */
    uint32_t writes; /* uv_write requests in flight */

    /* Deadlines (conn.c), in uv_now() milliseconds. */
    uint64_t accepted_ms;    /* HELLO must succeed by accepted_ms + handshake_timeout */
    uint64_t active_ms;      /* the last byte in or out: idle_timeout runs from it */
    uint64_t frame_start_ms; /* the frame in progress started (shifted by the time reading stopped) */
    uint64_t stopped_ms;     /* reading stopped by the daemon (backpressure) since; 0: reading */
    uint64_t tx_ms;          /* the last time queued reply bytes went out, or were first queued */
    uint64_t tx_submitted;   /* reply bytes handed to uv_write */
    uint64_t tx_seen;        /* of them written when last looked at */
    uint64_t timer_due_ms;   /* when the deadline timer fires; 0: not armed */

    struct dqd_conn *prev, *next; /* the owner's list */
    struct dqd_conn *reap_next;
};

/* A connection with its handles initialized (not yet accepted); NULL when out of memory or a
 * handle cannot be initialized. on_closed(c, owner) tells the owner when it can be freed. */
dqd_conn *dqd_conn_create(dqd_ctx *ctx, bool tcp, bool require_secret, uint64_t id, dqd_conn_closed_fn on_closed,
                          void *owner);
/* Accepts the pending connection of listener into c and starts reading (or refuses it: shutdown,
 * max_connections). */
void dqd_conn_accept(dqd_conn *c, uv_stream_t *listener);
/* Stop reading; close once every request has been answered (shutdown, protocol error). */
void dqd_conn_drain(dqd_conn *c, uint64_t deadline_ms);
/* Close now; requests in flight finish and their replies are dropped. */
void dqd_conn_close(dqd_conn *c);
bool dqd_conn_reapable(const dqd_conn *c);
void dqd_conn_free(dqd_conn *c);

#endif
