/* dquantd server: the top of the daemon (used by main.c alone). It owns the context (ctx.h: the
 * services the operations share), the listeners, the connection list with its reaper, the metrics
 * endpoint and the graceful-shutdown sequence.
 *
 * Everything here runs on the loop thread. */
#ifndef DQD_SERVER_H
#define DQD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "ctx.h"

typedef struct dqd_server dqd_server;
typedef struct dqd_conn dqd_conn;
typedef struct dqd_http dqd_http;

typedef struct dqd_listener {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    dqd_server *srv;
    dqd_listen_addr addr;
    bool require_secret;
    bool open;       /* handle initialized and not yet closed */
    bool bound_unix; /* we created the socket file and remove it at exit */
} dqd_listener;

struct dqd_server {
    dqd_ctx ctx;
    dqd_http *http;

    dqd_listener listeners[DQD_MAX_LISTENERS];
    uint32_t nlisteners;

    uv_signal_t sig_term, sig_int;
    uv_idle_t reaper;
    uv_timer_t shutdown_timer;
    bool handles_ready;

    dqd_conn *conns; /* open or closing connections */
    dqd_conn *reap;  /* closed connections waiting to be freed */
    uint64_t next_conn_id;

    bool finished;
};

/* Sets up the context (store, registry, metrics, backend) from cfg (which must outlive the server). */
int dqd_server_init(dqd_server *srv, uv_loop_t *loop, const dqd_config *cfg);
/* Opens every listener and the metrics endpoint; logs and returns an error if one fails. */
int dqd_server_start(dqd_server *srv);
/* Graceful stop: no new connections, finish in-flight requests, flush, then close everything so
 * that uv_run returns. Idempotent. */
void dqd_server_stop(dqd_server *srv);
/* Frees what init made, after uv_run has returned. */
void dqd_server_destroy(dqd_server *srv);

#endif
