/* dquantd server: the shared state of one daemon (configuration, store, registry, metrics), its
 * listeners, the connection list with its reaper, and the graceful-shutdown sequence.
 *
 * Everything here runs on the loop thread. */
#ifndef DQD_SERVER_H
#define DQD_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "frame.h"
#include "framebuf.h"
#include "hostmem.h"
#include "metrics.h"
#include "registry.h"
#include "store.h"
#include "validate.h"

typedef struct dqd_server dqd_server;
typedef struct dqd_conn dqd_conn;
typedef struct dqd_http dqd_http;
typedef struct dqd_lane dqd_lane;
typedef struct dqd_gpu dqd_gpu;

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
    bool open;        /* handle initialized and not yet closed */
    bool bound_unix;  /* we created the socket file and remove it at exit */
} dqd_listener;

struct dqd_server {
    uv_loop_t *loop;
    const dqd_config *cfg;
    dqd_limits limits;
    dq_frame_limits frame_limits;
    dqd_hostmem mem;
    dqd_registry *reg;
    dqd_store *store;
    dqd_metrics metrics;
    dqd_framebufs frames;     /* every frame's buffer (framebuf.h) */
    dqd_http *http;
    dqd_gpu *gpu;             /* the cuda backend; NULL on the cpu backend */
    dqd_lane *lane;           /* GPU threads (lane.h); NULL without the cuda backend or with gpu_threads 0 */
    dqd_lane *io_lane;        /* I/O threads reading large frames (conn.c); NULL with io_threads 0 */
    uint32_t io_busy;         /* connections an I/O thread is reading for */
    const char *backend_name;
    uint64_t start_ns;

    dqd_listener listeners[DQD_MAX_LISTENERS];
    uint32_t nlisteners;

    uv_signal_t sig_term, sig_int;
    uv_idle_t reaper;
    uv_timer_t shutdown_timer;
    bool handles_ready;

    dqd_conn *conns;          /* open or closing connections */
    dqd_conn *reap;           /* closed connections waiting to be freed */
    uint64_t next_conn_id;
    uint64_t tasks_inflight;  /* worker tasks queued or running */
    uint64_t reqs_inflight;   /* requests dispatched and not finished */

    bool stopping;
    bool finished;
};

/* Sets up store, registry and metrics from cfg (which must outlive the server). */
int dqd_server_init(dqd_server *srv, uv_loop_t *loop, const dqd_config *cfg);
/* Opens every listener and the metrics endpoint; logs and returns an error if one fails. */
int dqd_server_start(dqd_server *srv);
/* Graceful stop: no new connections, finish in-flight requests, flush, then close everything so
 * that uv_run returns. Idempotent. */
void dqd_server_stop(dqd_server *srv);
/* Frees what init made, after uv_run has returned. */
void dqd_server_destroy(dqd_server *srv);

/* Connection lifecycle hooks (conn.c). */
void dqd_server_conn_closed(dqd_server *srv, dqd_conn *c);
/* Called whenever work finishes: completes a pending shutdown once nothing is left. */
void dqd_server_check_idle(dqd_server *srv);
void dqd_server_gauges(const dqd_server *srv, dqd_gauges *g);

uint64_t dqd_now_ns(void);

/* The lock, condition variable and loop wake-up of a thread that hands finished work back to the
 * loop (cb runs on the loop). Returns 0, or -1 with nothing left initialized. */
int dqd_handoff_init(uv_loop_t *loop, pthread_mutex_t *mu, pthread_cond_t *cv, uv_async_t *async, uv_async_cb cb);

#endif
