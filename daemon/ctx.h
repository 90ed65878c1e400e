/* dquantd context: the services every operation shares (configuration, limits, memory accounting,
 * model registry, store, metrics, frame-buffer cache, the cuda backend and the thread pools).
 *
 * It sits below the operations and the connections: they reach the daemon's state only through
 * it, and the server (server.h), which owns a context, is used by main.c alone. Everything here
 * runs on the loop thread. */
#ifndef DQD_CTX_H
#define DQD_CTX_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "frame.h"
#include "framebuf.h"
#include "authlimit.h"
#include "hostmem.h"
#include "iomem.h"
#include "lease.h"
#include "metrics.h"
#include "registry.h"
#include "store.h"
#include "validate.h"

typedef struct dqd_lane dqd_lane;
typedef struct dqd_gpu dqd_gpu;

typedef struct dqd_ctx {
    uv_loop_t *loop;
    const dqd_config *cfg;
    dqd_limits limits;
    dq_frame_limits frame_limits;
    dqd_hostmem mem;
    dqd_registry *reg;
    dqd_store *store;
    dqd_leases leases; /* LOOKUP leases on chunks (lease.h) */
    dqd_metrics metrics;
    dqd_framebufs frames;    /* every frame's buffer (framebuf.h) */
    dqd_iomem iomem;         /* what client connections hold (iomem.h) */
    dqd_authlimit auth;      /* failed HELLOs per peer address (authlimit.h) */
    dqd_gpu *gpu;            /* the cuda backend; NULL on the cpu backend */
    dqd_lane *lane;          /* GPU threads (lane.h); NULL without the cuda backend or with gpu_threads 0 */
    dqd_lane *io_lane;       /* I/O threads reading large frames (conn.c); NULL with io_threads 0 */
    uint32_t io_busy;        /* connections an I/O thread is reading for */
    struct dqd_tls_ctx *tls; /* TLS of the TCP listeners (tls.h); NULL: plaintext */
    const char *backend_name;
    uint64_t start_ns;

    uint64_t tasks_inflight; /* worker tasks queued or running */
    uint64_t reqs_inflight;  /* requests dispatched and not finished */
    bool stopping;           /* shutting down: no new requests */

    /* Set by the owner (server.c): called whenever work finishes, so that a pending shutdown
     * completes once nothing is left. */
    void (*on_idle)(void *arg);
    void *idle_arg;
} dqd_ctx;

/* Sets up store, registry, metrics and the backend from cfg (which must outlive the context). */
int dqd_ctx_init(dqd_ctx *ctx, uv_loop_t *loop, const dqd_config *cfg);
/* Frees what init made, after uv_run has returned. */
void dqd_ctx_destroy(dqd_ctx *ctx);
/* Work finished (a task, a request): tells the owner, which may complete a shutdown. */
void dqd_ctx_check_idle(dqd_ctx *ctx);
void dqd_ctx_gauges(const dqd_ctx *ctx, dqd_gauges *g);

uint64_t dqd_now_ns(void);

/* The lock, condition variable and loop wake-up of a thread that hands finished work back to the
 * loop (cb runs on the loop). Returns 0, or -1 with nothing left initialized. */
int dqd_handoff_init(uv_loop_t *loop, pthread_mutex_t *mu, pthread_cond_t *cv, uv_async_t *async, uv_async_cb cb);

#endif
