/* libdquant-client-nccl: the NCCL data path (dqc_nccl_setup, dqc_put_dev, dqc_get_dev, dqc_attend_dev;
 * dquant/client_nccl.h). A library of its own, on top of libdquant-client's private ABI
 * (client_internal.h), so that libdquant-client itself needs neither CUDA nor NCCL.
 *
 * Requests and replies still travel on the socket; only the tensors flagged `nccl` move on a
 * two-rank communicator shared with the daemon (daemon rank 0, client rank 1), one ncclSend or
 * ncclRecv per tensor in offset order: to the daemon right after the request frame, from it right
 * after the reply frame (proto/dquant.proto). A transfer that fails or misses its deadline leaves
 * the two sides unable to tell which bytes the other consumed, so it aborts the communicator: the
 * *_dev calls then fail until dqc_nccl_setup makes a new one. The communicator belongs to one
 * connection; a reconnect voids it the same way. */
#include "client_internal.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dquant/client_nccl.h"

/* How long an error reply waits for sends already issued: the daemon receives a request's NCCL
 * payload before it looks at the request, so after any reply the sends are done or never will be. */
#define DQC_NCCL_ERROR_GRACE_MS 1000
/* How long dqc_free and a new setup give a healthy communicator to finalize before aborting it. */
#define DQC_NCCL_FINALIZE_MS 2000
/* The deadline when the daemon states none. */
#define DQC_NCCL_DEFAULT_MS 10000

struct dqc__nccl {
    ncclComm_t comm;     /* NULL: none (never set up, or aborted) */
    cudaStream_t stream; /* non-blocking stream of every transfer (NULL with comm) */
    int device;          /* the client's CUDA device */
    int server_device;
    uint32_t server_timeout_ms; /* the daemon's deadline for one transfer (0: not stated) */
    uint64_t conn_gen;          /* the connection the communicator belongs to */
    char why[256];              /* why there is no communicator (after a failure) */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Polling backoff: the transfers of interest take microseconds to milliseconds, and a sleep costs
 * at least the timer slack (~50 µs), so yield the CPU for the first couple of milliseconds, then
 * sleep, longer once the wait is clearly a long one. */
static void backoff(unsigned *spins)
{
    unsigned s = (*spins)++;
    if (s < 2000) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, s < 20000 ? 50000 : 500000};
    nanosleep(&ts, NULL);
}

/* The caller's current device is restored on the way out: the library changes no state of theirs. */
typedef struct dev_guard {
    int prev;
    int changed;
} dev_guard;

static cudaError_t dev_enter(int dev, dev_guard *g)
{
    g->changed = 0;
    cudaError_t e = cudaGetDevice(&g->prev);
    if (e != cudaSuccess)
        return e;
    if (g->prev != dev) {
        e = cudaSetDevice(dev);
        if (e == cudaSuccess)
            g->changed = 1;
    }
    return e;
}

static void dev_leave(const dev_guard *g)
{
    if (g->changed)
        cudaSetDevice(g->prev);
}

/* Waits for a non-blocking communicator's pending work (init, finalize, group launch) to leave
 * ncclInProgress. Returns its state; ncclInProgress once the deadline (ms since now) passed. */
static ncclResult_t comm_settle(ncclComm_t comm, int64_t deadline)
{
    unsigned spins = 0;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclInProgress || now_ms() >= deadline)
            return st;
        backoff(&spins);
    }
}

/* Lets go of the communicator: finalized and destroyed when healthy (the daemon's side does the
 * same), aborted when broken or when finalizing does not finish in time. */
static void comm_release(struct dqc__nccl *n, int graceful)
{
    if (!n->comm && !n->stream)
        return;
    dev_guard g;
    int entered = dev_enter(n->device, &g) == cudaSuccess;
    if (n->comm) {
        int done = 0;
        if (graceful) {
            ncclResult_t r = ncclCommFinalize(n->comm);
            if (r == ncclSuccess || r == ncclInProgress)
                r = comm_settle(n->comm, now_ms() + DQC_NCCL_FINALIZE_MS);
            done = r == ncclSuccess && ncclCommDestroy(n->comm) == ncclSuccess;
        }
        if (!done)
            ncclCommAbort(n->comm);
        n->comm = NULL;
    }
    if (n->stream) {
        cudaStreamDestroy(n->stream);
        n->stream = NULL;
    }
    if (entered)
        dev_leave(&g);
}

/* A transfer failed: aborts the communicator, remembers why for the calls that follow, and sets
 * the handle's message. Returns code. */
static int nccl_broken(dqc_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int nccl_broken(dqc_client *c, int code, const char *fmt, ...)
{
    struct dqc__nccl *n = c->nccl;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->why, sizeof n->why, fmt, ap);
    va_end(ap);
    comm_release(n, 0);
    return dqc__fail(c, code, "%s (NCCL communicator aborted; call dqc_nccl_setup again)", n->why);
}

static const char *nccl_err(struct dqc__nccl *n, ncclResult_t r)
{
    const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
    return last && last[0] ? last : ncclGetErrorString(r);
}

/* The deadline for one transfer of `bytes`: the daemon's own (it gives up then and aborts its
 * side, after which nothing can complete) plus a second of slack, plus one second per GB as the
 * daemon allows itself. */
static int64_t xfer_deadline(dqc_client *c, uint64_t bytes)
{
    const struct dqc__nccl *n = c->nccl;
    int64_t ms = n->server_timeout_ms ? (int64_t)n->server_timeout_ms + 1000
                                      : (c->opts.io_timeout_ms > 0 ? c->opts.io_timeout_ms : DQC_NCCL_DEFAULT_MS);
    return now_ms() + ms + (int64_t)(bytes / 1000000000u) * 1000;
}

/* Checks that the *_dev calls may use the communicator. */
static int nccl_ready(dqc_client *c, const char *op)
{
    struct dqc__nccl *n = c->nccl;
    if (!n || (!n->comm && !n->why[0]))
        return dqc__fail(c, DQ_IO, "%s: NCCL not set up (call dqc_nccl_setup first)", op);
    if (n->comm && (c->fd < 0 || c->conn_gen != n->conn_gen)) {
        /* The daemon dropped its side with the connection. */
        snprintf(n->why, sizeof n->why, "the connection to %s was closed or re-established since dqc_nccl_setup",
                 c->addr);
        comm_release(n, 0);
    }
    if (!n->comm)
        return dqc__fail(c, DQ_IO, "%s: NCCL not set up: %s (call dqc_nccl_setup again)", op, n->why);
    return 0;
}

/* Checks that p..p+len is memory NCCL can use on the communicator's device. */
static int dev_ptr_check(dqc_client *c, const char *op, const char *what, const void *p)
{
    struct cudaPointerAttributes at;
    memset(&at, 0, sizeof at);
    cudaError_t e = cudaPointerGetAttributes(&at, p);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* not sticky; keep it from surfacing in the caller's next call */
        return dqc__fail(c, DQ_INVALID_ARGUMENT, "%s: %s: %s", op, what, cudaGetErrorString(e));
    }
    DQC_CHECK_ARG(c, at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged,
                  "%s: %s is not device memory (the *_dev calls take pointers on CUDA device %d)", op, what,
                  c->nccl->device);
    DQC_CHECK_ARG(c, at.type != cudaMemoryTypeDevice || at.device == c->nccl->device,
                  "%s: %s is on CUDA device %d; NCCL was set up on device %d", op, what, at.device, c->nccl->device);
    return 0;
}

/* Issues one ncclSend (recv 0) or ncclRecv (recv 1) per non-empty tensor (ops: where each lives on
 * this side), in order, in one group. Empty tensors carry no operation on either side. */
static int post_ops(dqc_client *c, const char *op, const struct iovec *ops, size_t nops, int recv)
{
    struct dqc__nccl *n = c->nccl;
    dev_guard g;
    cudaError_t ce = dev_enter(n->device, &g);
    if (ce != cudaSuccess)
        return nccl_broken(c, DQ_IO, "%s: CUDA device %d: %s", op, n->device, cudaGetErrorString(ce));
    ncclResult_t first = ncclGroupStart();
    for (size_t i = 0; first == ncclSuccess && i < nops; i++) {
        if (!ops[i].iov_len)
            continue;
        first = recv ? ncclRecv(ops[i].iov_base, ops[i].iov_len, ncclUint8, 0, n->comm, n->stream)
                     : ncclSend(ops[i].iov_base, ops[i].iov_len, ncclUint8, 0, n->comm, n->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* always closes the group, even after a failed call */
    dev_leave(&g);
    if (first == ncclSuccess)
        first = end;
    if (first != ncclSuccess && first != ncclInProgress)
        return nccl_broken(c, DQ_IO, "%s: posting NCCL %s failed: %s", op, recv ? "receives" : "sends",
                           nccl_err(n, first));
    return 0;
}

/* Waits until everything posted on the stream has finished, or the deadline passes. A non-blocking
 * communicator reports ncclInProgress until the group is actually on the stream: only then does
 * an idle stream mean done. */
static int wait_ops(dqc_client *c, const char *op, const char *what, int64_t deadline, int code_late)
{
    struct dqc__nccl *n = c->nccl;
    unsigned spins = 0;
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess)
            st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return nccl_broken(c, DQ_IO, "%s: NCCL %s failed: %s", op, what, nccl_err(n, st));
        if (st == ncclSuccess) {
            cudaError_t e = cudaStreamQuery(n->stream);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady)
                return nccl_broken(c, DQ_IO, "%s: NCCL %s: CUDA error %s", op, what, cudaGetErrorString(e));
        }
        if (now_ms() >= deadline)
            return nccl_broken(c, code_late, "%s: NCCL %s did not finish in time", op, what);
        backoff(&spins);
    }
}

typedef struct send_ctx {
    const char *op;
    const struct iovec *ops;
    size_t nops;
    int posted;
} send_ctx;

static int after_send(dqc_client *c, void *ctx)
{
    send_ctx *s = ctx;
    s->posted = 1;
    return post_ops(c, s->op, s->ops, s->nops, 0);
}

/* Sends req with its NCCL payload (ops, `bytes` in all) and waits for the reply and for the sends.
 * On success rep must be released with dqc__reply_free. */
static int nccl_call(dqc_client *c, const char *op, Dquant__Request *req, const struct iovec *ops, size_t nops,
                     uint64_t bytes, Dquant__Response__BodyCase want, dqc__reply *rep)
{
    struct dqc__nccl *n = c->nccl;
    req->nccl_payload = bytes;
    send_ctx s = {.op = op, .ops = ops, .nops = nops};
    dqc__xfer x = {.conn_gen = n->conn_gen, .after_send = nops ? after_send : NULL, .ctx = &s};
    int rc = dqc__call_xfer(c, req, NULL, 0, want, NULL, NULL, rep, &x);
    if (rc) {
        if (!n->comm)
            return rc; /* posting the sends failed: already aborted */
        char msg[DQC_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", c->err);
        if (c->fd < 0 || c->conn_gen != n->conn_gen) {
            nccl_broken(c, rc, "%s: %s (the connection is gone, and with it the daemon's communicator)", op, msg);
            return rc;
        }
        /* An error reply: keep the communicator if the daemon consumed what was sent. */
        if (s.posted && wait_ops(c, op, "sends", now_ms() + DQC_NCCL_ERROR_GRACE_MS, rc) != 0) {
            dqc__fail(c, rc,
                      "%s; and the NCCL sends of the request did not complete: communicator aborted "
                      "(call dqc_nccl_setup again)",
                      msg);
            return rc;
        }
        dqc__fail(c, rc, "%s", msg);
        return rc;
    }
    if (s.posted && (rc = wait_ops(c, op, "sends", xfer_deadline(c, bytes), DQ_TIMEOUT)) != 0) {
        dqc__reply_free(rep);
        return rc;
    }
    return 0;
}

/* Checks the NCCL tensors t[0..nt) of a reply (each already checked against nccl_payload): the
 * non-empty ones flagged and tiling [0, nccl_payload) in increasing offset order without gaps (an
 * empty tensor carries no transfer and need not be flagged). Fills order[] with the indices sorted
 * by offset. */
static int tiling_check(dqc_client *c, const char *op, const Dquant__Tensor *const *t, const char *const *names,
                        size_t nt, uint64_t nccl_payload, size_t *order)
{
    for (size_t i = 0; i < nt; i++) {
        if (t[i]->length && !t[i]->nccl)
            return dqc__fail(c, DQ_PROTOCOL, "%s: reply tensor %s is not flagged nccl", op, names[i]);
        order[i] = i;
    }
    for (size_t i = 1; i < nt; i++)
        for (size_t j = i; j > 0 && t[order[j]]->offset < t[order[j - 1]]->offset; j--) {
            size_t tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    uint64_t at = 0;
    for (size_t i = 0; i < nt; i++) {
        const Dquant__Tensor *x = t[order[i]];
        if (!x->length)
            continue;
        if (x->offset != at)
            return dqc__fail(c, DQ_PROTOCOL, "%s: reply tensor %s at NCCL offset %llu, expected %llu", op,
                             names[order[i]], (unsigned long long)x->offset, (unsigned long long)at);
        at += x->length;
    }
    if (at != nccl_payload)
        return dqc__fail(c, DQ_PROTOCOL, "%s: reply tensors cover %llu of the %llu NCCL bytes", op,
                         (unsigned long long)at, (unsigned long long)nccl_payload);
    return 0;
}

/* Receives a reply's NCCL payload: ops[order[i]] in that order. With sink set, everything goes to
 * one scratch device buffer instead (the caller's buffers are too small) so that the channel stays
 * in step. */
static int recv_payload(dqc_client *c, const char *op, const struct iovec *ops, const size_t *order, size_t nops,
                        uint64_t total, int sink)
{
    struct dqc__nccl *n = c->nccl;
    struct iovec sorted[4];
    void *scratch = NULL;
    uint64_t off = 0;
    if (sink && total) {
        dev_guard g;
        cudaError_t e = dev_enter(n->device, &g);
        if (e == cudaSuccess)
            e = cudaMallocAsync(&scratch, (size_t)total, n->stream);
        dev_leave(&g);
        if (e != cudaSuccess)
            return nccl_broken(c, DQ_NOMEM, "%s: no device memory to drain a %llu-byte reply: %s", op,
                               (unsigned long long)total, cudaGetErrorString(e));
    }
    for (size_t i = 0; i < nops; i++) {
        sorted[i] = ops[order[i]];
        if (sink) {
            sorted[i].iov_base = (uint8_t *)scratch + off;
            off += sorted[i].iov_len;
        }
    }
    int rc = post_ops(c, op, sorted, nops, 1);
    if (!rc)
        rc = wait_ops(c, op, "receives", xfer_deadline(c, total), DQ_TIMEOUT);
    if (scratch) {
        /* After a failure the communicator was aborted and its stream destroyed: nothing uses
         * the buffer any more. */
        if (n->stream)
            cudaFreeAsync(scratch, n->stream);
        else
            cudaFree(scratch);
    }
    return rc;
}

/* ---- setup and teardown ---- */

static int server_offers_nccl(const dqc_client *c)
{
    for (size_t i = 0; i < c->info.nfeatures; i++)
        if (strcmp(c->info.features[i], "nccl") == 0)
            return 1;
    return 0;
}

/* dqc_free's hook (c->nccl_free). */
static void nccl_free(dqc_client *c)
{
    if (!c->nccl)
        return;
    /* The socket is closed by now: the daemon finalizes or aborts its side as it sees the close. */
    comm_release(c->nccl, c->nccl->comm != NULL);
    free(c->nccl);
    c->nccl = NULL;
    c->nccl_free = NULL;
}

int dqc_nccl_setup(dqc_client *c, int cuda_device)
{
    DQC_CHECK_HANDLE(c);
    c->err[0] = 0;
    DQC_CHECK_ARG(c, cuda_device >= 0, "nccl_setup: CUDA device %d", cuda_device);
    if (!server_offers_nccl(c))
        return dqc__fail(c, DQ_UNSUPPORTED,
                         "nccl_setup: the server at %s does not offer NCCL (backend %s; it needs the cuda backend "
                         "and an NCCL build)",
                         c->addr, c->info.backend[0] ? c->info.backend : "unknown");
    if (!c->nccl) {
        c->nccl = calloc(1, sizeof *c->nccl);
        if (!c->nccl)
            return dqc__fail(c, DQ_NOMEM, "nccl_setup: no memory");
        c->nccl_free = nccl_free;
    }
    struct dqc__nccl *n = c->nccl;
    /* A communicator the daemon still holds is finalized on both sides; one it dropped is aborted. */
    comm_release(n, n->comm && c->fd >= 0 && c->conn_gen == n->conn_gen);
    snprintf(n->why, sizeof n->why, "dqc_nccl_setup failed");
    n->device = cuda_device;

    /* The device is checked before the daemon is asked, so that it never waits for a client that
     * cannot join. */
    dev_guard g;
    cudaError_t ce = dev_enter(cuda_device, &g);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        dev_leave(&g);
        n->stream = NULL;
        return dqc__fail(c, ce == cudaErrorInvalidDevice ? DQ_INVALID_ARGUMENT : DQ_IO,
                         "nccl_setup: CUDA device %d: %s", cuda_device, cudaGetErrorString(ce));
    }

    dqc__reply rep;
    int rc = dqc__nccl_setup_call(c, cuda_device, &rep);
    if (rc) {
        dev_leave(&g);
        comm_release(n, 0);
        return rc;
    }
    const Dquant__NcclSetupReply *r = rep.resp->nccl_setup;
    ncclUniqueId id;
    if (r->unique_id.len != sizeof id || r->nranks != 2 || r->rank != 1) {
        rc = dqc__fail(c, DQ_PROTOCOL,
                       "nccl_setup: reply with a %zu-byte id (expected %zu), nranks %u, rank %u "
                       "(expected 2 and 1)",
                       r->unique_id.len, sizeof id, r->nranks, r->rank);
        dqc__reply_free(&rep);
        dev_leave(&g);
        comm_release(n, 0);
        return rc;
    }
    memcpy(&id, r->unique_id.data, sizeof id);
    n->server_device = r->server_device;
    n->server_timeout_ms = r->timeout_ms;
    n->conn_gen = c->conn_gen;
    dqc__reply_free(&rep);

    /* The daemon joins as rank 0 meanwhile. Non-blocking, so that a daemon that never joins costs
     * the I/O timeout, not a hang. */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t nr = ncclCommInitRankConfig(&comm, 2, id, 1, &cfg);
    int timeout = c->opts.io_timeout_ms > 0 ? c->opts.io_timeout_ms : DQC_NCCL_DEFAULT_MS * 6;
    if ((nr == ncclSuccess || nr == ncclInProgress) && comm)
        nr = comm_settle(comm, now_ms() + timeout);
    dev_leave(&g);
    if (nr != ncclSuccess) {
        char why[256];
        const char *last = comm ? ncclGetLastError(comm) : NULL;
        snprintf(why, sizeof why, "%s",
                 nr == ncclInProgress ? "not finished within the I/O timeout"
                 : last && last[0]    ? last
                                      : ncclGetErrorString(nr));
        n->comm = comm;
        comm_release(n, 0);
        snprintf(n->why, sizeof n->why, "joining the daemon's communicator failed");
        return dqc__fail(c, nr == ncclInProgress ? DQ_TIMEOUT : DQ_IO,
                         "nccl_setup: joining the daemon's NCCL communicator (device %d here, %d there): %s",
                         cuda_device, n->server_device, why);
    }
    n->comm = comm;
    n->why[0] = 0;
    return 0;
}

/* ---- operations ---- */

int dqc_put_dev(dqc_client *c, const dqc_put_args *a, dqc_put_result *res)
{
    DQC_CHECK_HANDLE(c);
    c->err[0] = 0;
    if (res)
        memset(res, 0, sizeof *res);
    dqc__put_req pr;
    DQC_FORWARD(dqc__put_build(c, "put_dev", a, 1, &pr));
    DQC_FORWARD(nccl_ready(c, "put_dev"));
    DQC_FORWARD(dev_ptr_check(c, "put_dev", "k", a->k));
    DQC_FORWARD(dev_ptr_check(c, "put_dev", "v", a->v));
    struct iovec ops[2] = {{(void *)a->k, pr.bytes}, {(void *)a->v, pr.bytes}};
    dqc__reply rep;
    DQC_FORWARD(nccl_call(c, "put_dev", &pr.req, ops, 2, 2 * (uint64_t)pr.bytes, DQUANT__RESPONSE__BODY_PUT, &rep));
    int rc = 0;
    if (rep.resp->nccl_payload)
        rc = nccl_broken(c, DQ_PROTOCOL, "put_dev: the PUT reply announces %llu NCCL bytes",
                         (unsigned long long)rep.resp->nccl_payload);
    else
        dqc__put_result(&rep, res);
    dqc__reply_free(&rep);
    return rc;
}

/* A reply whose NCCL bytes this side cannot place: the daemon sends them anyway, so the channel is
 * out of step and is torn down, keeping the reason already recorded. */
static int out_of_step(dqc_client *c, dqc__reply *rep, int rc)
{
    char msg[DQC_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", c->err);
    dqc__reply_free(rep);
    nccl_broken(c, rc, "%s", msg);
    return rc;
}

int dqc_get_dev(dqc_client *c, const dqc_get_args *a, void *k_dev, void *v_dev, size_t capacity, dqc_get_result *res)
{
    DQC_CHECK_HANDLE(c);
    c->err[0] = 0;
    DQC_CHECK_ARG(c, a && res && k_dev && v_dev, "get_dev: args, k_dev, v_dev and res are required");
    res->start_token = res->tokens = 0;
    res->num_layers = res->kv_heads = res->head_dim = 0;
    res->k = res->v = NULL;
    res->bytes = 0;
    dqc__get_req gr;
    DQC_FORWARD(dqc__get_build(c, "get_dev", a, &gr));
    DQC_FORWARD(nccl_ready(c, "get_dev"));
    DQC_FORWARD(dev_ptr_check(c, "get_dev", "k_dev", k_dev));
    DQC_FORWARD(dev_ptr_check(c, "get_dev", "v_dev", v_dev));
    gr.req.nccl_reply = 1;
    dqc__reply rep;
    DQC_FORWARD(nccl_call(c, "get_dev", &gr.req, NULL, 0, 0, DQUANT__RESPONSE__BODY_GET, &rep));
    const Dquant__GetReply *r = rep.resp->get;
    uint64_t total = rep.resp->nccl_payload;
    size_t kb = 0, order[2];
    int rc = dqc__get_check(c, "get_dev", a, r, total, &kb);
    if (!rc) {
        const Dquant__Tensor *t[2] = {r->k, r->v};
        const char *names[2] = {"k", "v"};
        rc = tiling_check(c, "get_dev", t, names, 2, total, order);
    }
    if (rc)
        return out_of_step(c, &rep, rc);
    int sink = kb > capacity;
    struct iovec ops[2] = {{k_dev, kb}, {v_dev, kb}};
    rc = recv_payload(c, "get_dev", ops, order, 2, total, sink);
    if (!rc && sink)
        rc = dqc__fail(c, DQ_TOO_LARGE, "get_dev: k and v are %zu bytes each; the buffers hold %zu", kb, capacity);
    if (!rc)
        dqc__get_meta(r, a->dtype, kb, res);
    dqc__reply_free(&rep);
    return rc;
}

int dqc_attend_dev(dqc_client *c, const dqc_attend_args *a, float *out_dev, float *lse_dev)
{
    DQC_CHECK_HANDLE(c);
    c->err[0] = 0;
    DQC_CHECK_ARG(c, a && out_dev && lse_dev, "attend_dev: args, out_dev and lse_dev are required");
    dqc__attend_req ar;
    DQC_FORWARD(dqc__attend_build(c, "attend_dev", a, 1, &ar));
    int rc = nccl_ready(c, "attend_dev");
    for (size_t i = 0; !rc && i < a->nitems; i++) {
        const dqc_attend_item *it = &a->items[i];
        rc = dev_ptr_check(c, "attend_dev", "an item's q", it->q);
        if (!rc && it->append_k)
            rc = dev_ptr_check(c, "attend_dev", "an item's append_k", it->append_k);
        if (!rc && it->append_v)
            rc = dev_ptr_check(c, "attend_dev", "an item's append_v", it->append_v);
    }
    if (!rc)
        rc = dev_ptr_check(c, "attend_dev", "out_dev", out_dev);
    if (!rc)
        rc = dev_ptr_check(c, "attend_dev", "lse_dev", lse_dev);
    if (rc) {
        dqc__attend_free(&ar);
        return rc;
    }
    /* The request's pieces, in offset order, are exactly the sends. */
    ar.req.nccl_reply = 1;
    dqc__reply rep;
    rc = nccl_call(c, "attend_dev", &ar.req, ar.iov, ar.niov, ar.payload, DQUANT__RESPONSE__BODY_ATTEND, &rep);
    dqc__attend_free(&ar);
    if (rc)
        return rc;
    const Dquant__AttendReply *r = rep.resp->attend;
    uint64_t total = rep.resp->nccl_payload;
    size_t ob = 0, lb = 0, order[2];
    rc = dqc__tensor_check(c, r->out, "out", total, DQUANT__DTYPE__F32, 3, ar.oshape, &ob);
    if (!rc)
        rc = dqc__tensor_check(c, r->lse, "lse", total, DQUANT__DTYPE__F32, 2, ar.oshape, &lb);
    if (!rc) {
        const Dquant__Tensor *t[2] = {r->out, r->lse};
        const char *names[2] = {"out", "lse"};
        rc = tiling_check(c, "attend_dev", t, names, 2, total, order);
    }
    if (rc)
        return out_of_step(c, &rep, rc);
    struct iovec rops[2] = {{out_dev, ob}, {lse_dev, lb}};
    rc = recv_payload(c, "attend_dev", rops, order, 2, total, 0);
    dqc__reply_free(&rep);
    return rc;
}
