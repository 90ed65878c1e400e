/* A CPU emulation of the NCCL subset in nccl.h (next to this file): two-rank communicators between
 * two processes of one machine, so that dquantd's NCCL data path, libdquant-client's and nccl_bench
 * run, and are tested, without GPUs. Device memory is host memory (fake_cuda.c).
 *
 *   - ncclGetUniqueId names an abstract Unix socket. Rank 0 listens on it, rank 1 connects
 *     (retrying until rank 0 listens). A thread per communicator forms the connection, so a
 *     non-blocking ncclCommInitRankConfig returns ncclInProgress and ncclCommGetAsyncError says
 *     ncclInProgress until it is formed (or failed); then the thread moves the bytes.
 *   - ncclSend / ncclRecv (in a group or alone) become operations of that thread, which performs
 *     the sends in order and the receives in order, concurrently, each send preceded by its length.
 *     A receive matched by a send of another length aborts the process (NCCL would corrupt or hang).
 *   - Each operation is also an item on the stream it was issued on (fake_internal.h): the work
 *     issued on the stream before it runs first, cudaEventQuery / cudaStreamQuery answer
 *     cudaErrorNotReady until the transfer is done, cudaStreamSynchronize waits for it. On a
 *     non-blocking communicator the thread puts the group on its streams, and until then
 *     ncclGroupEnd's ncclInProgress stands in ncclCommGetAsyncError, as NCCL may do: an event
 *     recorded or a stream queried before that sees the transfers as done before they are, so a
 *     caller that does not wait for ncclSuccess first gets stale data here, not by luck.
 *   - The peer's process dying or its communicator going closes the socket: pending and later
 *     operations fail, and ncclCommGetAsyncError reports ncclRemoteError (ncclSystemError for other
 *     socket errors). A peer that goes while nothing is pending is noticed by the next operation.
 *     ncclCommAbort stops the thread, closes the socket and completes what is pending with an
 *     error, which unblocks the streams waiting for it.
 *   - Strict: buffers must be device memory (when issued and when the transfer starts), peers and
 *     ranks 0 and 1, no operation on a non-blocking communicator before it is formed nor after
 *     ncclCommFinalize. ncclAllReduce: ncclSum of ncclFloat only (nccl_bench's barrier). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "fake_internal.h"
#include "nccl.h"

#define FAIL(...)                                   \
    do {                                            \
        fprintf(stderr, "fake NCCL: " __VA_ARGS__); \
        fputc('\n', stderr);                        \
        abort();                                    \
    } while (0)

#define ID_PREFIX "dq-fake-nccl:"
#define CONFIG_MAGIC 0xcafebeefu
#define HELLO_MAGIC 0x4451464eu /* "DQFN": the connection's first frame, both ways */
#define DATA_MAGIC 0x44514e43u  /* "DQNC": before each send's bytes */
/* How long rank 1 keeps trying to reach rank 0, and rank 0 waits for it (callers abort sooner). */
#define FORM_TIMEOUT_MS 120000
#define CHUNK ((size_t)1 << 20)

typedef struct frame {
    uint32_t magic;
    uint32_t arg; /* hello: rank */
    uint64_t len; /* hello: nranks; data: bytes that follow */
} frame;

typedef struct nop {
    struct nop *next;      /* in a group, then in the communicator's incoming / send / receive queue */
    struct ncclComm *comm; /* until done */
    cudaStream_t stream;
    bool send;
    bool on_stream; /* its stream item exists */
    uint8_t *buf;
    size_t len, off; /* off: bytes moved (thread) */
    frame hdr;
    size_t hdr_off;
    bool allreduce; /* one of the two halves of an ncclAllReduce */
    /* the all-reduce's receive lands in buf (host scratch); then sum_dst = sum_own + buf */
    float *sum_dst;
    const float *sum_own;
    size_t sum_n;
    bool done; /* (done_mu) */
    ncclResult_t result;
} nop;

typedef enum { FORMING, READY, FAILED } comm_state;

struct ncclComm {
    int rank;
    bool blocking;
    struct sockaddr_un addr;
    socklen_t addrlen;
    int listener, sock, wake; /* wake: eventfd */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* mu */
    comm_state state;
    ncclResult_t err; /* FAILED: the asynchronous error */
    bool launching;   /* a group of a non-blocking communicator is not on its streams yet */
    bool finalizing, stopping;
    size_t pending;         /* operations launched and not done */
    nop *in_head, *in_tail; /* launched, not yet taken by the thread */
    char msg[256];          /* ncclGetLastError; written once, when it fails */
    /* thread */
    nop *sq_head, *sq_tail, *rq_head, *rq_tail;
    bool hup; /* the peer closed while nothing was pending */
};

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;
static __thread char last_msg[256];
static __thread int group_depth;
static __thread nop *group_head, *group_tail;

static ncclResult_t fail_call(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail_call(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return r;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    if (comm) {
        pthread_mutex_lock(&comm->mu);
        bool failed = comm->state == FAILED;
        pthread_mutex_unlock(&comm->mu);
        if (failed)
            return comm->msg; /* never rewritten once failed */
    }
    return last_msg;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_uint counter;
    if (!id)
        return fail_call(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, ID_PREFIX "%d-%u-%lx", (int)getpid(), atomic_fetch_add(&counter, 1) + 1,
             (unsigned long)ts.tv_nsec ^ (unsigned long)ts.tv_sec);
    return ncclSuccess;
}

/* ---- operations: completion ---- */

static bool op_ready(void *arg)
{
    nop *op = arg;
    pthread_mutex_lock(&done_mu);
    bool d = op->done;
    pthread_mutex_unlock(&done_mu);
    return d;
}

/* The stream item: waits for the transfer, finishes an all-reduce, releases the operation. */
static void op_wait(void *arg)
{
    nop *op = arg;
    pthread_mutex_lock(&done_mu);
    while (!op->done)
        pthread_cond_wait(&done_cv, &done_mu);
    pthread_mutex_unlock(&done_mu);
    if (op->sum_dst) {
        if (op->result == ncclSuccess) {
            dq_fake_check_dev(op->sum_dst, op->sum_n * sizeof(float), "ncclAllReduce recvbuff");
            dq_fake_check_dev(op->sum_own, op->sum_n * sizeof(float), "ncclAllReduce sendbuff");
            const float *peer = (const float *)op->buf;
            for (size_t i = 0; i < op->sum_n; i++)
                op->sum_dst[i] = op->sum_own[i] + peer[i];
        }
        free(op->buf);
    }
    free(op);
}

static void put_on_stream(nop *op)
{
    op->on_stream = true;
    dq_fake_stream_wait(op->stream, op_ready, op_wait, op);
}

/* Marks op done; its stream item may free it from then on. */
static void op_done(struct ncclComm *c, nop *op, ncclResult_t r)
{
    pthread_mutex_lock(&done_mu);
    op->result = r;
    op->comm = NULL;
    op->done = true;
    pthread_cond_broadcast(&done_cv);
    pthread_mutex_unlock(&done_mu);
    pthread_mutex_lock(&c->mu);
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void fail_list(struct ncclComm *c, nop *list, ncclResult_t r)
{
    while (list) {
        nop *op = list;
        list = op->next;
        if (!op->on_stream)
            put_on_stream(op);
        op_done(c, op, r);
    }
}

/* The communicator fails (first reason wins): what is queued completes with the error. Thread. */
static void comm_fail(struct ncclComm *c, ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void comm_fail(struct ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    pthread_mutex_lock(&c->mu);
    if (c->state != FAILED) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->msg, sizeof c->msg, fmt, ap);
        va_end(ap);
        c->err = r;
        c->state = FAILED;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    nop *s = c->sq_head, *q = c->rq_head;
    c->sq_head = c->sq_tail = c->rq_head = c->rq_tail = NULL;
    fail_list(c, s, r);
    fail_list(c, q, r);
}

/* ---- the communicator's thread ---- */

static void wake(struct ncclComm *c)
{
    uint64_t one = 1;
    ssize_t w = write(c->wake, &one, sizeof one);
    (void)w;
}

static bool stopping(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    bool s = c->stopping;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Waits for events on fd (or only for the wake-up, fd < 0) up to timeout_ms. 1: ready, 0: timed
 * out, -1: the communicator is being stopped. */
static int wait_fd(struct ncclComm *c, int fd, short events, int timeout_ms)
{
    struct pollfd p[2] = {{c->wake, POLLIN, 0}, {fd, events, 0}};
    int n = poll(p, fd >= 0 ? 2 : 1, timeout_ms);
    if (p[0].revents & POLLIN) {
        uint64_t v;
        ssize_t r = read(c->wake, &v, sizeof v);
        (void)r;
    }
    if (stopping(c))
        return -1;
    return n > 0 && fd >= 0 && p[1].revents ? 1 : 0;
}

/* Moves len bytes of the handshake (non-blocking socket) by the deadline. 0, or -1 with errno
 * (ECANCELED: stopped, ETIMEDOUT, ECONNRESET: closed). */
static int hello_io(struct ncclComm *c, bool out, void *buf, size_t len, uint64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = out ? send(c->sock, (uint8_t *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(c->sock, (uint8_t *)buf + off, len - off, MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0) {
            errno = ECONNRESET;
            return -1;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        uint64_t t = now_ms();
        if (t >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        int w = wait_fd(c, c->sock, out ? POLLOUT : POLLIN, (int)(deadline - t));
        if (w < 0) {
            errno = ECANCELED;
            return -1;
        }
    }
    return 0;
}

/* Rank 0 accepts, rank 1 connects; then both say which rank they are. */
static void form(struct ncclComm *c)
{
    const uint64_t deadline = now_ms() + FORM_TIMEOUT_MS;
    if (c->rank == 0) {
        for (;;) {
            c->sock = accept4(c->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c->sock >= 0)
                break;
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                comm_fail(c, ncclSystemError, "accept on %s: %s", c->addr.sun_path + 1, strerror(errno));
                return;
            }
            uint64_t t = now_ms();
            if (t >= deadline) {
                comm_fail(c, ncclSystemError, "rank 1 did not connect to %s within %d ms", c->addr.sun_path + 1,
                          FORM_TIMEOUT_MS);
                return;
            }
            if (wait_fd(c, c->listener, POLLIN, (int)(deadline - t)) < 0)
                return;
        }
        close(c->listener);
        c->listener = -1;
    } else {
        for (;;) {
            c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (c->sock < 0) {
                comm_fail(c, ncclSystemError, "socket: %s", strerror(errno));
                return;
            }
            if (connect(c->sock, (struct sockaddr *)&c->addr, c->addrlen) == 0)
                break;
            int e = errno;
            close(c->sock);
            c->sock = -1;
            /* Rank 0 not listening yet (refused), or its backlog full (EAGAIN): try again. */
            if (e != ECONNREFUSED && e != EAGAIN && e != ENOENT && e != EINTR) {
                comm_fail(c, ncclSystemError, "connect to %s: %s", c->addr.sun_path + 1, strerror(e));
                return;
            }
            if (now_ms() >= deadline) {
                comm_fail(c, ncclSystemError, "rank 0 was not listening on %s within %d ms", c->addr.sun_path + 1,
                          FORM_TIMEOUT_MS);
                return;
            }
            if (wait_fd(c, -1, 0, 2) < 0)
                return;
        }
    }
    frame mine = {HELLO_MAGIC, (uint32_t)c->rank, 2}, theirs;
    if (hello_io(c, true, &mine, sizeof mine, deadline) < 0 ||
        hello_io(c, false, &theirs, sizeof theirs, deadline) < 0) {
        if (errno != ECANCELED)
            comm_fail(c, errno == ECONNRESET ? ncclRemoteError : ncclSystemError, "forming the communicator: %s",
                      strerror(errno));
        return;
    }
    if (theirs.magic != HELLO_MAGIC || theirs.len != 2 || theirs.arg != (uint32_t)(1 - c->rank))
        FAIL("the peer of rank %d on %s says it is rank %u of %llu (magic %#x): both sides must use one id, ranks 0 "
             "and 1 of 2",
             c->rank, c->addr.sun_path + 1, theirs.arg, (unsigned long long)theirs.len, theirs.magic);
    pthread_mutex_lock(&c->mu);
    if (c->state == FORMING)
        c->state = READY;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void push(nop **head, nop **tail, nop *op)
{
    op->next = NULL;
    if (*tail)
        (*tail)->next = op;
    else
        *head = op;
    *tail = op;
}

static nop *pop(nop **head, nop **tail)
{
    nop *op = *head;
    *head = op->next;
    if (!*head)
        *tail = NULL;
    return op;
}

/* Takes the launched operations: on their streams (non-blocking communicators), then queued. */
static void take_incoming(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    nop *list = c->in_head;
    c->in_head = c->in_tail = NULL;
    bool failed = c->state == FAILED;
    ncclResult_t err = c->err;
    pthread_mutex_unlock(&c->mu);
    if (failed) {
        fail_list(c, list, err);
    } else {
        while (list) {
            nop *op = list;
            list = op->next;
            if (!op->on_stream)
                put_on_stream(op);
            if (op->send)
                push(&c->sq_head, &c->sq_tail, op);
            else
                push(&c->rq_head, &c->rq_tail, op);
        }
    }
    pthread_mutex_lock(&c->mu);
    if (!c->in_head)
        c->launching = false;
    pthread_mutex_unlock(&c->mu);
}

static const char *what(const nop *op)
{
    return op->allreduce ? "ncclAllReduce" : op->send ? "ncclSend" : "ncclRecv";
}

/* A socket error while moving op's bytes. */
static void io_failed(struct ncclComm *c, const nop *op, int e)
{
    bool remote = e == 0 || e == EPIPE || e == ECONNRESET;
    comm_fail(c, remote ? ncclRemoteError : ncclSystemError, "%s of %zu bytes (rank %d, %zu moved): %s", what(op),
              op->len, c->rank, op->off, e == 0 ? "the peer closed the connection" : strerror(e));
}

/* Moves the front send's bytes until the socket is full. False once the communicator failed. */
static bool progress_send(struct ncclComm *c)
{
    while (c->sq_head) {
        nop *op = c->sq_head;
        if (op->hdr_off == 0 && op->off == 0)
            dq_fake_check_dev(op->buf, op->len, "ncclSend buffer when the transfer starts");
        while (op->hdr_off < sizeof op->hdr || op->off < op->len) {
            ssize_t n;
            if (op->hdr_off < sizeof op->hdr)
                n = send(c->sock, (uint8_t *)&op->hdr + op->hdr_off, sizeof op->hdr - op->hdr_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
            else
                n = send(c->sock, op->buf + op->off, op->len - op->off < CHUNK ? op->len - op->off : CHUNK,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return true;
            if (n < 0) {
                io_failed(c, op, errno);
                return false;
            }
            if (op->hdr_off < sizeof op->hdr)
                op->hdr_off += (size_t)n;
            else
                op->off += (size_t)n;
        }
        pop(&c->sq_head, &c->sq_tail);
        op_done(c, op, ncclSuccess);
    }
    return true;
}

static bool progress_recv(struct ncclComm *c)
{
    while (c->rq_head) {
        nop *op = c->rq_head;
        if (op->hdr_off == 0 && !op->sum_dst)
            dq_fake_check_dev(op->buf, op->len, "ncclRecv buffer when the transfer starts");
        while (op->hdr_off < sizeof op->hdr || op->off < op->len) {
            ssize_t n;
            if (op->hdr_off < sizeof op->hdr)
                n = recv(c->sock, (uint8_t *)&op->hdr + op->hdr_off, sizeof op->hdr - op->hdr_off, MSG_DONTWAIT);
            else
                n = recv(c->sock, op->buf + op->off, op->len - op->off < CHUNK ? op->len - op->off : CHUNK,
                         MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return true;
            if (n <= 0) {
                io_failed(c, op, n == 0 ? 0 : errno);
                return false;
            }
            if (op->hdr_off < sizeof op->hdr) {
                op->hdr_off += (size_t)n;
                if (op->hdr_off == sizeof op->hdr && (op->hdr.magic != DATA_MAGIC || op->hdr.len != op->len))
                    FAIL("%s of %zu bytes on rank %d was matched by a send of %llu bytes (magic %#x): the two "
                         "sides' operations are out of step",
                         what(op), op->len, c->rank, (unsigned long long)op->hdr.len, op->hdr.magic);
            } else {
                op->off += (size_t)n;
            }
        }
        pop(&c->rq_head, &c->rq_tail);
        op_done(c, op, ncclSuccess);
    }
    return true;
}

static void *comm_main(void *arg)
{
    struct ncclComm *c = arg;
    form(c);
    for (;;) {
        take_incoming(c);
        pthread_mutex_lock(&c->mu);
        bool stop = c->stopping, failed = c->state != READY;
        pthread_mutex_unlock(&c->mu);
        if (stop)
            return NULL;
        short ev = 0;
        if (!failed) {
            ev = (short)((c->sq_head ? POLLOUT : 0) | (c->rq_head ? POLLIN : 0) | (c->hup ? 0 : POLLRDHUP));
            /* A closed socket reports POLLHUP whatever is asked: watch it only when there is work. */
            if (c->hup && !c->sq_head && !c->rq_head)
                ev = 0;
        }
        struct pollfd p[2] = {{c->wake, POLLIN, 0}, {c->sock, ev, 0}};
        int n = poll(p, ev ? 2 : 1, -1);
        if (n < 0)
            continue;
        if (p[0].revents & POLLIN) {
            uint64_t v;
            ssize_t r = read(c->wake, &v, sizeof v);
            (void)r;
        }
        if (!ev || !p[1].revents)
            continue;
        if (c->sq_head && (p[1].revents & (POLLOUT | POLLERR | POLLHUP)) && !progress_send(c))
            continue;
        if (c->rq_head && (p[1].revents & (POLLIN | POLLERR | POLLHUP | POLLRDHUP)) && !progress_recv(c))
            continue;
        if (!c->rq_head && !c->sq_head && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))
            c->hup = true; /* the next operation finds out */
    }
}

/* ---- communicators ---- */

static ncclResult_t comm_init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, bool blocking)
{
    if (!out)
        return fail_call(ncclInvalidArgument, "ncclCommInitRank: NULL comm");
    *out = NULL;
    if (nranks != 2)
        return fail_call(ncclInvalidArgument, "the fake NCCL has two-rank communicators only (nranks %d)", nranks);
    if (rank != 0 && rank != 1)
        return fail_call(ncclInvalidArgument, "rank %d of 2", rank);
    if (strncmp(id.internal, ID_PREFIX, strlen(ID_PREFIX)) != 0 || !memchr(id.internal, 0, sizeof id.internal))
        return fail_call(ncclInvalidArgument, "not an id from ncclGetUniqueId");
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return fail_call(ncclSystemError, "out of memory");
    c->rank = rank;
    c->blocking = blocking;
    c->listener = c->sock = -1;
    c->addr.sun_family = AF_UNIX;
    size_t nl = strlen(id.internal);
    if (nl + 1 >= sizeof c->addr.sun_path)
        nl = sizeof c->addr.sun_path - 2;
    memcpy(c->addr.sun_path + 1, id.internal, nl); /* abstract: leading NUL, no file */
    c->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    c->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake < 0) {
        free(c);
        return fail_call(ncclSystemError, "eventfd: %s", strerror(errno));
    }
    if (rank == 0) {
        /* Listening before returning: rank 1 may try any time after the id is out. */
        c->listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->listener < 0 || bind(c->listener, (struct sockaddr *)&c->addr, c->addrlen) < 0 ||
            listen(c->listener, 4) < 0) {
            int e = errno;
            if (c->listener >= 0)
                close(c->listener);
            close(c->wake);
            free(c);
            return fail_call(ncclSystemError, "rank 0 cannot listen on %s: %s%s", id.internal, strerror(e),
                             e == EADDRINUSE ? " (an id serves one communicator)" : "");
        }
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->state = FORMING;
    int e = pthread_create(&c->thread, NULL, comm_main, c);
    if (e) {
        if (c->listener >= 0)
            close(c->listener);
        close(c->wake);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return fail_call(ncclSystemError, "pthread_create: %s", strerror(e));
    }
    *out = c;
    if (!blocking)
        return ncclInProgress;
    pthread_mutex_lock(&c->mu);
    while (c->state == FORMING)
        pthread_cond_wait(&c->cv, &c->mu);
    ncclResult_t r = c->state == READY ? ncclSuccess : c->err;
    pthread_mutex_unlock(&c->mu);
    if (r != ncclSuccess) {
        snprintf(last_msg, sizeof last_msg, "%s", c->msg);
        ncclCommAbort(c);
        *out = NULL;
    }
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return comm_init(comm, nranks, commId, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config)
{
    if (config && config->magic != CONFIG_MAGIC)
        return fail_call(ncclInvalidArgument, "ncclConfig_t not initialized with NCCL_CONFIG_INITIALIZER");
    bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    return comm_init(comm, nranks, commId, rank, blocking);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!comm || !asyncError)
        return fail_call(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    pthread_mutex_lock(&comm->mu);
    if (comm->state == FAILED)
        *asyncError = comm->err;
    else if (comm->state == FORMING || comm->launching || (comm->finalizing && comm->pending))
        *asyncError = ncclInProgress;
    else
        *asyncError = ncclSuccess;
    pthread_mutex_unlock(&comm->mu);
    return ncclSuccess;
}

/* Stops the thread and frees the communicator; what is pending completes with an error. */
static void comm_free(struct ncclComm *c)
{
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_mutex_unlock(&c->mu);
    wake(c);
    pthread_join(c->thread, NULL);
    /* The thread is gone: nothing touches the buffers of what is still pending from here on. */
    if (c->sock >= 0)
        close(c->sock);
    if (c->listener >= 0)
        close(c->listener);
    close(c->wake);
    nop *in = c->in_head, *s = c->sq_head, *q = c->rq_head;
    c->in_head = c->sq_head = c->rq_head = NULL;
    fail_list(c, in, ncclSystemError);
    fail_list(c, s, ncclSystemError);
    fail_list(c, q, ncclSystemError);
    if (c->pending)
        FAIL("internal: %zu operations unaccounted for", c->pending);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (comm)
        comm_free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return fail_call(ncclInvalidArgument, "ncclCommFinalize: NULL comm");
    pthread_mutex_lock(&comm->mu);
    if (comm->finalizing) {
        pthread_mutex_unlock(&comm->mu);
        return fail_call(ncclInvalidUsage, "ncclCommFinalize called twice");
    }
    comm->finalizing = true;
    if (!comm->blocking) {
        pthread_mutex_unlock(&comm->mu);
        return ncclInProgress;
    }
    while (comm->pending && comm->state != FAILED)
        pthread_cond_wait(&comm->cv, &comm->mu);
    ncclResult_t r = comm->state == FAILED ? comm->err : ncclSuccess;
    pthread_mutex_unlock(&comm->mu);
    return r;
}

/* As NCCL: waits for what is pending (which a failed communicator no longer has), then frees. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return fail_call(ncclInvalidArgument, "ncclCommDestroy: NULL comm");
    pthread_mutex_lock(&comm->mu);
    while (comm->pending && comm->state != FAILED)
        pthread_cond_wait(&comm->cv, &comm->mu);
    pthread_mutex_unlock(&comm->mu);
    comm_free(comm);
    return ncclSuccess;
}

/* ---- groups and operations ---- */

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

/* Launches the group's operations: the work issued before them on their streams first (the GPU
 * would run it first), then to the communicators' threads. */
static ncclResult_t launch_group(void)
{
    nop *list = group_head;
    group_head = group_tail = NULL;
    bool any_nonblocking = false;
    for (nop *op = list; op; op = op->next)
        dq_fake_stream_flush(op->stream);
    while (list) {
        nop *op = list;
        list = op->next;
        op->next = NULL;
        struct ncclComm *c = op->comm;
        any_nonblocking |= !c->blocking;
        pthread_mutex_lock(&c->mu);
        c->pending++;
        if (c->blocking) {
            /* A blocking communicator's operations are on their streams when ncclGroupEnd returns. */
            pthread_mutex_unlock(&c->mu);
            put_on_stream(op);
            pthread_mutex_lock(&c->mu);
        } else {
            c->launching = true;
        }
        push(&c->in_head, &c->in_tail, op);
        pthread_mutex_unlock(&c->mu);
        wake(c);
    }
    return any_nonblocking ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0)
        return fail_call(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    return launch_group();
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* Checks an operation's communicator and peer. */
static ncclResult_t check_comm(const char *op, ncclComm_t comm, int peer)
{
    if (!comm)
        return fail_call(ncclInvalidArgument, "%s: NULL comm", op);
    pthread_mutex_lock(&comm->mu);
    comm_state st = comm->state;
    ncclResult_t err = comm->err;
    bool fin = comm->finalizing;
    pthread_mutex_unlock(&comm->mu);
    if (st == FAILED)
        return fail_call(err, "%s: the communicator failed: %s", op, comm->msg);
    if (st == FORMING)
        return fail_call(ncclInvalidUsage,
                         "%s on a communicator still forming (wait for ncclCommGetAsyncError to "
                         "leave ncclInProgress)",
                         op);
    if (fin)
        return fail_call(ncclInvalidUsage, "%s on a finalized communicator", op);
    if (peer != 1 - comm->rank)
        return fail_call(ncclInvalidArgument, "%s: peer %d from rank %d of 2", op, peer, comm->rank);
    return ncclSuccess;
}

static nop *new_op(ncclComm_t comm, cudaStream_t stream, bool send, void *buf, size_t len)
{
    nop *op = calloc(1, sizeof *op);
    if (!op)
        FAIL("out of host memory");
    op->comm = comm;
    op->stream = stream;
    op->send = send;
    op->buf = buf;
    op->len = len;
    op->hdr = (frame){DATA_MAGIC, 0, len};
    return op;
}

/* Adds to the caller's group, or launches at once outside one (a group of one, as NCCL). */
static ncclResult_t add(nop *a, nop *b)
{
    push(&group_head, &group_tail, a);
    if (b)
        push(&group_head, &group_tail, b);
    return group_depth > 0 ? ncclSuccess : launch_group();
}

static ncclResult_t p2p(bool send, void *buf, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                        cudaStream_t stream)
{
    const char *name = send ? "ncclSend" : "ncclRecv";
    ncclResult_t r = check_comm(name, comm, peer);
    if (r != ncclSuccess)
        return r;
    size_t es = type_size(datatype);
    if (!es)
        return fail_call(ncclInvalidArgument, "%s: data type %d", name, (int)datatype);
    if (count && !buf)
        return fail_call(ncclInvalidArgument, "%s: NULL buffer", name);
    dq_fake_check_dev(buf, count * es, send ? "ncclSend buffer" : "ncclRecv buffer");
    return add(new_op(comm, stream, send, buf, count * es), NULL);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(true, (void *)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

/* Two ranks: send ours, receive theirs into scratch, and the receive's stream item adds them. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = check_comm("ncclAllReduce", comm, comm ? 1 - comm->rank : 0);
    if (r != ncclSuccess)
        return r;
    if (datatype != ncclFloat || op != ncclSum)
        FAIL("ncclAllReduce: only ncclSum of ncclFloat is emulated (datatype %d, op %d)", (int)datatype, (int)op);
    if (count && (!sendbuff || !recvbuff))
        return fail_call(ncclInvalidArgument, "ncclAllReduce: NULL buffer");
    size_t len = count * sizeof(float);
    dq_fake_check_dev(sendbuff, len, "ncclAllReduce sendbuff");
    dq_fake_check_dev(recvbuff, len, "ncclAllReduce recvbuff");
    float *scratch = malloc(len ? len : 1);
    if (!scratch)
        FAIL("out of host memory");
    nop *s = new_op(comm, stream, true, (void *)sendbuff, len);
    nop *q = new_op(comm, stream, false, scratch, len);
    s->allreduce = q->allreduce = true;
    q->sum_dst = recvbuff;
    q->sum_own = sendbuff;
    q->sum_n = count;
    return add(s, q);
}
