/* dquantd NCCL data path (see ncclpath.h). Built only with NCCL (DQD_HAVE_NCCL). */
#include "ncclpath.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ctx.h"
#include "dquant/error.h"
#include "gpu.h"
#include "logging.h"

#ifndef DQD_HAVE_NCCL
#error "nccl.c needs NCCL (meson defines DQD_HAVE_NCCL); see ncclpath_none.c"
#endif

typedef enum { CH_JOINING, CH_READY, CH_BROKEN } ch_state;
typedef enum { JOB_RECV, JOB_SEND } job_kind;

typedef struct nc_job {
    struct nc_job *next;
    job_kind kind;
    dqd_req *req; /* RECV: the request whose payload this is; NULL for SEND */
    void (*run)(dqd_req *req);
    uint8_t *dev;   /* device buffer (RECV: allocated by the thread) */
    uint8_t *host;  /* SEND: host source (owned, uploaded by the thread); RECV: host copy made */
    bool want_host; /* RECV: copy the payload to the host afterwards (ATTEND) */
    uint64_t bytes;
    dqd_seg *segs; /* owned */
    size_t nseg;
    int rc;
    char msg[160];
} nc_job;

struct dqd_nchan {
    dqd_ctx *ctx;
    dqd_session *sess; /* NULL once the connection has gone */
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ncclUniqueId id;
    int device;
    uint32_t timeout_ms;
    _Atomic int state;               /* ch_state, written by the thread */
    _Atomic bool stop;               /* the connection went: abort and end */
    bool comm_aborted;               /* (thread) */
    nc_job *queue_head, *queue_tail; /* loop → thread (mu) */
    nc_job *done_head, *done_tail;   /* thread → loop (mu) */
    bool thread_done;                /* (mu) */
    /* loop thread only */
    dqd_req *wait_head, *wait_tail; /* admitted requests not yet started (linked through nccl_next) */
    bool busy;                      /* a request or a reply transfer holds the channel */
    uint64_t transfers, bytes_in, bytes_out;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

bool dqd_nccl_offered(const dqd_ctx *ctx)
{
    return ctx->gpu != NULL;
}

void dqd_nccl_free_payload(dqd_ctx *ctx, void *dev)
{
    if (dev)
        dqd_gpu_free_transient(ctx->gpu, dev);
}

/* ---- the channel thread ---- */

/* Aborts the communicator (the peer's pending operations then fail too) and breaks the channel. */
static void chan_abort(dqd_nchan *ch, ncclComm_t comm)
{
    if (!ch->comm_aborted)
        ncclCommAbort(comm);
    ch->comm_aborted = true;
    atomic_store(&ch->state, CH_BROKEN);
}

static void job_fail(nc_job *j, int rc, const char *what, const char *detail)
{
    j->rc = rc;
    snprintf(j->msg, sizeof j->msg, "NCCL %s: %s", what, detail);
}

/* Waits for the communicator's pending work (ev recorded after it, or NULL: the communicator
 * itself, while it forms) with the deadline; aborts and breaks the channel on anything but success. */
static int wait_comm(dqd_nchan *ch, ncclComm_t comm, cudaEvent_t ev, uint64_t deadline, nc_job *j, const char *what)
{
    uint32_t spins = 0;
    for (;;) {
        ncclResult_t as = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &as);
        if (r != ncclSuccess || (as != ncclSuccess && as != ncclInProgress)) {
            const char *e = ncclGetErrorString(r != ncclSuccess ? r : as);
            const char *last = ncclGetLastError(comm);
            char detail[128];
            snprintf(detail, sizeof detail, "%s%s%s", e, last && last[0] ? ": " : "", last ? last : "");
            job_fail(j, DQ_IO, what, detail);
            break;
        }
        if (as == ncclSuccess) {
            if (!ev)
                return DQ_OK;
            cudaError_t q = cudaEventQuery(ev);
            if (q == cudaSuccess) {
                /* The stream also moves past a transfer that failed (the peer went): the
                 * communicator's error, read again now that the event has completed, decides.
                 * Read only before the event, a failure in between passed for a completed
                 * transfer (with whatever the buffers held). */
                as = ncclSuccess;
                if (ncclCommGetAsyncError(comm, &as) == ncclSuccess && as == ncclSuccess)
                    return DQ_OK;
                continue;
            }
            if (q != cudaErrorNotReady) {
                (void)cudaGetLastError();
                job_fail(j, DQ_INTERNAL, what, cudaGetErrorString(q));
                break;
            }
        }
        if (atomic_load(&ch->stop)) {
            job_fail(j, DQ_CONNECTION, what, "the client's connection closed");
            break;
        }
        if (now_ms() > deadline) {
            job_fail(j, DQ_TIMEOUT, what, "the peer did not complete the transfer in time");
            break;
        }
        /* Spin briefly (transfers of a few MB finish in microseconds), then sleep. */
        if (++spins < 2000)
            sched_yield();
        else
            usleep(50);
    }
    chan_abort(ch, comm);
    return j->rc;
}

/* Issues a group of point-to-point operations and waits for them. */
static int transfer(dqd_nchan *ch, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ev, nc_job *j)
{
    const uint64_t deadline = now_ms() + ch->timeout_ms + j->bytes / 1000000u;
    const char *what = j->kind == JOB_RECV ? "receive" : "send";
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < j->nseg && r == ncclSuccess; i++) {
        uint8_t *p = j->dev + j->segs[i].offset;
        size_t n = (size_t)j->segs[i].length;
        r = j->kind == JOB_RECV ? ncclRecv(p, n, ncclUint8, 1, comm, stream)
                                : ncclSend(p, n, ncclUint8, 1, comm, stream);
    }
    ncclResult_t g = ncclGroupEnd();
    if (r == ncclSuccess)
        r = g;
    if (r != ncclSuccess && r != ncclInProgress) {
        job_fail(j, DQ_IO, what, ncclGetErrorString(r));
        chan_abort(ch, comm);
        return j->rc;
    }
    /* Non-blocking communicator: the group is enqueued once the async error leaves ncclInProgress. */
    if (wait_comm(ch, comm, NULL, deadline, j, what) < 0)
        return j->rc;
    if (cudaEventRecord(ev, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        job_fail(j, DQ_INTERNAL, what, "cudaEventRecord failed");
        return j->rc;
    }
    return wait_comm(ch, comm, ev, deadline, j, what);
}

static void run_job(dqd_nchan *ch, ncclComm_t comm, cudaStream_t stream, cudaEvent_t ev, nc_job *j)
{
    if (atomic_load(&ch->state) != CH_READY) {
        job_fail(j, DQ_IO, j->kind == JOB_RECV ? "receive" : "send",
                 "the connection's NCCL communicator is broken (NCCL_SETUP again)");
        return;
    }
    /* From the device's stream-ordered pool, like every transient buffer (dqd_gpu_free_transient). */
    cudaError_t e = cudaSuccess;
    if (j->kind == JOB_RECV || j->host)
        e = cudaMallocAsync((void **)&j->dev, j->bytes, stream);
    if (e == cudaSuccess && j->kind == JOB_SEND && j->host)
        e = cudaMemcpyAsync(j->dev, j->host, j->bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        j->dev = NULL;
        job_fail(j, e == cudaErrorMemoryAllocation ? DQ_NOMEM : DQ_INTERNAL, "buffer", cudaGetErrorString(e));
        /* The peer is already sending or waiting: the communicator cannot stay in step. */
        chan_abort(ch, comm);
        return;
    }
    if (transfer(ch, comm, stream, ev, j) < 0)
        return;
    if (j->kind == JOB_RECV && j->want_host) {
        j->host = malloc(j->bytes);
        if (!j->host) {
            job_fail(j, DQ_NOMEM, "receive", "out of memory");
            return;
        }
        e = cudaMemcpyAsync(j->host, j->dev, j->bytes, cudaMemcpyDeviceToHost, stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            job_fail(j, DQ_INTERNAL, "receive", cudaGetErrorString(e));
        }
    }
}

/* Appends j to the list (head, tail); the caller holds ch->mu. */
static void job_append(nc_job **head, nc_job **tail, nc_job *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void post_done(dqd_nchan *ch, nc_job *j)
{
    pthread_mutex_lock(&ch->mu);
    job_append(&ch->done_head, &ch->done_tail, j);
    pthread_mutex_unlock(&ch->mu);
    uv_async_send(&ch->async);
}

static void *chan_main(void *arg)
{
    dqd_nchan *ch = arg;
    ncclComm_t comm = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t ev = NULL;
    nc_job setup = {0};
    if (cudaSetDevice(ch->device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        atomic_store(&ch->state, CH_BROKEN);
        DQD_ERROR("NCCL channel: cannot set up CUDA on device %d", ch->device);
    } else {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&comm, 2, ch->id, 0, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            DQD_WARN("NCCL channel: ncclCommInitRankConfig: %s", ncclGetErrorString(r));
            if (comm)
                chan_abort(ch, comm);
            atomic_store(&ch->state, CH_BROKEN);
        } else if (wait_comm(ch, comm, NULL, now_ms() + ch->timeout_ms, &setup, "setup") < 0) {
            DQD_WARN("NCCL channel: %s", setup.msg);
        } else {
            atomic_store(&ch->state, CH_READY);
            DQD_INFO("NCCL channel ready on device %d", ch->device);
        }
    }

    for (;;) {
        pthread_mutex_lock(&ch->mu);
        while (!ch->queue_head && !atomic_load(&ch->stop))
            pthread_cond_wait(&ch->cv, &ch->mu);
        nc_job *j = ch->queue_head;
        if (j) {
            ch->queue_head = j->next;
            if (!ch->queue_head)
                ch->queue_tail = NULL;
        }
        pthread_mutex_unlock(&ch->mu);
        if (!j)
            break;
        run_job(ch, comm, stream, ev, j);
        post_done(ch, j);
    }

    if (comm)
        chan_abort(ch, comm); /* the client may be gone mid-operation: never wait for it */
    if (ev)
        cudaEventDestroy(ev);
    if (stream)
        cudaStreamDestroy(stream);
    (void)cudaGetLastError();
    pthread_mutex_lock(&ch->mu);
    ch->thread_done = true;
    pthread_mutex_unlock(&ch->mu);
    uv_async_send(&ch->async);
    return NULL;
}

/* ---- loop side ---- */

static void start_next(dqd_nchan *ch);

static void chan_closed(uv_handle_t *h)
{
    dqd_nchan *ch = h->data;
    pthread_mutex_destroy(&ch->mu);
    pthread_cond_destroy(&ch->cv);
    free(ch);
}

static void free_job(dqd_ctx *ctx, nc_job *j)
{
    if (j->dev)
        dqd_nccl_free_payload(ctx, j->dev);
    free(j->host);
    free(j->segs);
    free(j);
}

static void on_async(uv_async_t *a)
{
    dqd_nchan *ch = a->data;
    dqd_ctx *ctx = ch->ctx;
    pthread_mutex_lock(&ch->mu);
    nc_job *list = ch->done_head;
    ch->done_head = ch->done_tail = NULL;
    bool ended = ch->thread_done;
    pthread_mutex_unlock(&ch->mu);
    while (list) {
        nc_job *j = list;
        list = j->next;
        ch->transfers++;
        if (j->kind == JOB_RECV) {
            dqd_req *req = j->req;
            if (j->rc < 0) {
                ctx->metrics.nccl_failures++;
                char msg[sizeof j->msg];
                int rc = j->rc;
                memcpy(msg, j->msg, sizeof msg);
                free_job(ctx, j);
                dqd_req_fail(req, rc, "%s", msg);
                continue;
            }
            ch->bytes_in += j->bytes;
            ctx->metrics.nccl_bytes_in += j->bytes;
            if (j->want_host) {
                req->hpayload = j->host;
                j->host = NULL;
            } else {
                req->dpayload = j->dev;
                j->dev = NULL;
            }
            void (*run)(dqd_req *) = j->run;
            free_job(ctx, j);
            run(req);
        } else {
            if (j->rc < 0) {
                ctx->metrics.nccl_failures++;
                DQD_WARN("NCCL reply transfer failed: %s", j->msg);
            } else {
                ch->bytes_out += j->bytes;
                ctx->metrics.nccl_bytes_out += j->bytes;
            }
            free_job(ctx, j);
            ch->busy = false;
            start_next(ch);
        }
    }
    if (ended) {
        pthread_join(ch->thread, NULL);
        uv_close((uv_handle_t *)&ch->async, chan_closed);
    }
}

static void push_job(dqd_nchan *ch, nc_job *j)
{
    pthread_mutex_lock(&ch->mu);
    job_append(&ch->queue_head, &ch->queue_tail, j);
    pthread_cond_signal(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

/* Starts the next waiting request: its receive, or straight its operation. */
static void start_next(dqd_nchan *ch)
{
    while (!ch->busy && ch->wait_head) {
        dqd_req *req = ch->wait_head;
        ch->wait_head = req->nccl_next;
        if (!ch->wait_head)
            ch->wait_tail = NULL;
        req->nccl_next = NULL;
        ch->busy = true;
        void (*run)(dqd_req *) = req->nccl_run;
        if (!req->msg->nccl_payload) {
            run(req);
            continue;
        }
        nc_job *j = calloc(1, sizeof *j);
        if (!j || dqd_nccl_segments(req->msg, &j->segs, &j->nseg) < 0) {
            free(j);
            /* The client is sending: without a receive the channel is out of step for good. */
            atomic_store(&ch->state, CH_BROKEN);
            dqd_req_fail(req, DQ_NOMEM, "out of memory");
            continue;
        }
        j->kind = JOB_RECV;
        j->req = req;
        j->run = run;
        j->bytes = req->msg->nccl_payload;
        j->want_host = req->op == DQD_OP_ATTEND;
        push_job(ch, j);
        return;
    }
}

void dqd_nccl_admit(dqd_req *req, void (*run)(dqd_req *req))
{
    dqd_session *c = req->sess;
    dqd_nchan *ch = c->nchan;
    if (!ch) {
        dqd_req_fail(req, DQ_IO, "this connection has no NCCL communicator (NCCL_SETUP first)");
        return;
    }
    if (atomic_load(&ch->state) == CH_BROKEN) {
        dqd_req_fail(req, DQ_IO, "this connection's NCCL communicator is broken (NCCL_SETUP again)");
        return;
    }
    req->nccl_admitted = true;
    req->nccl_run = run;
    req->nccl_next = NULL;
    if (ch->wait_tail)
        ch->wait_tail->nccl_next = req;
    else
        ch->wait_head = req;
    ch->wait_tail = req;
    start_next(ch);
}

void dqd_nccl_release(dqd_req *req, void *buf, bool on_device, uint64_t len, dqd_seg *segs, size_t nseg)
{
    dqd_ctx *ctx = req->ctx;
    dqd_nchan *ch = req->sess->nchan;
    req->nccl_admitted = false;
    if (!ch || !ch->busy) {
        /* The channel went (connection closed, NCCL_SETUP replaced it): nothing to send to. */
        if (buf && on_device)
            dqd_nccl_free_payload(ctx, buf);
        else
            free(buf);
        free(segs);
        return;
    }
    if (!buf || !len) {
        free(segs);
        ch->busy = false;
        start_next(ch);
        return;
    }
    nc_job *j = calloc(1, sizeof *j);
    if (!j) {
        if (on_device)
            dqd_nccl_free_payload(ctx, buf);
        else
            free(buf);
        free(segs);
        /* The client waits for these bytes and will time out; the channel cannot be trusted. */
        atomic_store(&ch->state, CH_BROKEN);
        ch->busy = false;
        start_next(ch);
        return;
    }
    j->kind = JOB_SEND;
    j->bytes = len;
    j->segs = segs;
    j->nseg = nseg;
    if (on_device)
        j->dev = buf;
    else
        j->host = buf;
    push_job(ch, j); /* busy until the send is done (on_async) */
}

/* Stops a channel's thread (it aborts whatever is in flight) and fails the requests still waiting;
 * the channel frees itself when the thread has ended. */
static void chan_shutdown(dqd_nchan *ch)
{
    ch->sess = NULL;
    while (ch->wait_head) {
        dqd_req *req = ch->wait_head;
        ch->wait_head = req->nccl_next;
        req->nccl_next = NULL;
        req->nccl_admitted = false;
        dqd_req_fail(req, DQ_CONNECTION, "the NCCL communicator was closed");
    }
    ch->wait_tail = NULL;
    ch->busy = true; /* admits nothing more */
    pthread_mutex_lock(&ch->mu);
    atomic_store(&ch->stop, true);
    pthread_cond_signal(&ch->cv);
    pthread_mutex_unlock(&ch->mu);
}

void dqd_nccl_break(dqd_session *c)
{
    if (c->nchan) {
        atomic_store(&c->nchan->state, CH_BROKEN);
        pthread_mutex_lock(&c->nchan->mu);
        pthread_cond_signal(&c->nchan->cv);
        pthread_mutex_unlock(&c->nchan->mu);
    }
}

void dqd_nccl_conn_closed(dqd_session *c)
{
    if (c->nchan) {
        chan_shutdown(c->nchan);
        c->nchan = NULL;
    }
}

void dqd_op_nccl_setup(dqd_req *req)
{
    dqd_ctx *ctx = req->ctx;
    dqd_session *c = req->sess;
    if (!dqd_nccl_offered(ctx)) {
        dqd_req_fail(req, DQ_UNSUPPORTED, "the NCCL data path needs the cuda backend (this daemon runs '%s')",
                     ctx->backend_name);
        return;
    }
    if (c->nchan && c->nchan->busy) {
        dqd_req_fail(req, DQ_BUSY, "an NCCL transfer is in progress on this connection");
        return;
    }
    dqd_nchan *ch = calloc(1, sizeof *ch);
    if (!ch) {
        dqd_req_fail(req, DQ_NOMEM, "out of memory");
        return;
    }
    ncclResult_t r = ncclGetUniqueId(&ch->id);
    if (r != ncclSuccess) {
        free(ch);
        dqd_req_fail(req, DQ_INTERNAL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return;
    }
    ch->ctx = ctx;
    ch->sess = c;
    ch->device = (int)ctx->cfg->gpu_device;
    ch->timeout_ms = ctx->cfg->nccl_timeout_ms;
    atomic_init(&ch->state, CH_JOINING);
    atomic_init(&ch->stop, false);
    if (dqd_handoff_init(ctx->loop, &ch->mu, &ch->cv, &ch->async, on_async) < 0) {
        free(ch);
        dqd_req_fail(req, DQ_INTERNAL, "cannot create the channel's wake-up handle");
        return;
    }
    ch->async.data = ch;
    if (pthread_create(&ch->thread, NULL, chan_main, ch) != 0) {
        uv_close((uv_handle_t *)&ch->async, chan_closed);
        dqd_req_fail(req, DQ_INTERNAL, "cannot start the channel's thread");
        return;
    }
    if (c->nchan)
        chan_shutdown(c->nchan);
    c->nchan = ch;
    ctx->metrics.nccl_setups++;

    const Dquant__NcclSetup *s = req->msg->nccl_setup;
    DQD_INFO("conn %llu: NCCL setup, client GPU %d, daemon GPU %d", (unsigned long long)c->id, s->client_device,
             ch->device);
    Dquant__NcclSetupReply rep = DQUANT__NCCL_SETUP_REPLY__INIT;
    rep.unique_id.data = (uint8_t *)ch->id.internal;
    rep.unique_id.len = sizeof ch->id.internal;
    rep.nranks = 2;
    rep.rank = 1;
    rep.server_device = ch->device;
    rep.timeout_ms = ch->timeout_ms;
    Dquant__Response resp = DQUANT__RESPONSE__INIT;
    resp.body_case = DQUANT__RESPONSE__BODY_NCCL_SETUP;
    resp.nccl_setup = &rep;
    dqd_req_reply(req, &resp, NULL, 0);
}
