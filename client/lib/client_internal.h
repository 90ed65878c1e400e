/* libdquant-client internals shared by client.c (connection, framing, calls), client_ops.c (one
 * function per operation) and client_nccl.c (the NCCL data path, built as libdquant-client-nccl).
 *
 * libdquant-client-nccl is a separate shared library so that libdquant-client needs neither CUDA nor
 * NCCL. It calls the functions marked DQC_PRIVATE below, which libdquant-client exports under the
 * version node DQUANT_CLIENT_PRIVATE_<version> (libdquant-client.map.in): a libdquant-client-nccl of
 * another version fails to load instead of misreading struct dqc_client. Nothing else may use them. */
#ifndef DQUANT_CLIENT_INTERNAL_H
#define DQUANT_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dquant.pb-c.h"
#include "dquant/client.h"

#define DQC_ERR_MAX 512

/* The private ABI between libdquant-client and libdquant-client-nccl (see the top of this file). */
#if defined(DQC_BUILDING_CLIENT) && defined(__GNUC__)
#define DQC_PRIVATE __attribute__((visibility("default")))
#else
#define DQC_PRIVATE
#endif

typedef enum dqc__addr_kind { DQC_ADDR_UNIX = 1, DQC_ADDR_TCP = 2 } dqc__addr_kind;

struct dqc__nccl; /* client_nccl.c */

struct dqc_client {
    dqc__addr_kind kind;
    char *addr;        /* as given, for messages */
    char *path;        /* unix: socket path ('@' first: abstract namespace) */
    char *host, *port; /* tcp */

    dqc_options opts; /* client_name and secret point to the copies below */
    char *client_name;
    uint8_t *secret;

    int use_tls;          /* a tls:// address */
    struct dqc__tls *tls; /* client_tls.c: the context (per handle) and the session (per connection) */
    char *tls_paths[4];   /* copies of opts.tls_ca, tls_cert, tls_key, tls_server_name */
    int fd;               /* -1: not connected */
    uint64_t next_id;
    uint64_t reconnects;
    /* Automatic reconnection after failed ones (client.c): calls fail at once until retry_at_ms,
     * the backoff having gone on doubling over failed_cycles reconnects; reconnect_err is why the
     * last one failed. */
    int64_t retry_at_ms;
    uint32_t failed_cycles;
    int reconnect_rc;
    char reconnect_err[256];
    uint64_t conn_gen;                /* counts established connections: state tied to one connection (the
                                         NCCL communicator) remembers it and is void once it changes */
    struct dqc__nccl *nccl;           /* NULL until dqc_nccl_setup (libdquant-client-nccl) */
    void (*nccl_free)(dqc_client *c); /* set with nccl; dqc_free calls it once the socket is
                                         closed, so that the daemon lets go of its side first */
    dqc_server_info info;
    int (*on_connect)(dqc_client *c, void *ctx); /* NULL, or run on every new connection after HELLO
                                                    (cluster.c registers its models there); its
                                                    calls do not reconnect, a failure fails the
                                                    connect */
    void *on_connect_ctx;

    uint8_t *sbuf; /* packed request header message */
    size_t sbuf_cap;
    uint8_t *rbuf; /* reply header message */
    size_t rbuf_cap;
    uint8_t *pbuf; /* reply payload when the caller keeps no block */
    size_t pbuf_cap;

    char err[DQC_ERR_MAX];
};

/* Sets the handle's last error message and returns code. */
DQC_PRIVATE int dqc__fail(dqc_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A public call's handle: NULL leaves no message to record, only the code. */
#define DQC_CHECK_HANDLE(c)             \
    do {                                \
        if (!(c))                       \
            return DQ_INVALID_ARGUMENT; \
    } while (0)

/* Validates a public argument at the boundary: on failure records the message and returns. */
#define DQC_CHECK_ARG(c, cond, ...)                                  \
    do {                                                             \
        if (!(cond))                                                 \
            return dqc__fail((c), DQ_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)

/* Returns the error code of an expression that failed. */
#define DQC_FORWARD(expr)     \
    do {                      \
        int dqc__rc = (expr); \
        if (dqc__rc != 0)     \
            return dqc__rc;   \
    } while (0)

/* A reply: the unpacked header message and the payload bytes. */
typedef struct dqc__reply {
    Dquant__Response *resp; /* owned: dqc__reply_free */
    const uint8_t *payload; /* in *blk (or the handle's scratch); NULL when payload_len is 0 */
    uint64_t payload_len;
} dqc__reply;

/* Sends req with the payload gathered from iov[0..niov) and waits for the reply whose body must be
 * `want` (an Error reply is turned into its code and message). The payload is read into *blk
 * (grown as needed, *blk_cap updated) or, with blk NULL, into the handle's scratch buffer.
 * idempotent: the request may be repeated on a new connection after a break in flight.
 * On success rep->resp must be released with dqc__reply_free. */
int dqc__call(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov, int idempotent,
              Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep);
DQC_PRIVATE void dqc__reply_free(dqc__reply *rep);

/* A call bound to one connection, with work between writing the frame and reading the reply (the
 * NCCL sends must be issued then: the daemon receives them before it answers). */
typedef struct dqc__xfer {
    uint64_t conn_gen;                           /* the call fails with DQ_IO, sending nothing, unless c->conn_gen still
                                                    equals it after connecting (a reconnect voids the communicator) */
    int (*after_send)(dqc_client *c, void *ctx); /* NULL, or run once the whole frame is written;
                                                    a failure closes the connection */
    void *ctx;
} dqc__xfer;

/* dqc__call bound to x->conn_gen, never repeated on another connection. */
DQC_PRIVATE int dqc__call_xfer(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov,
                               Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep,
                               const dqc__xfer *x);

/* ---- TLS (client_tls.c) ---- */

/* Handshakes on the connected c->fd (connect timeout), verifying the server. 0 or an error set
 * with dqc__fail (DQ_UNAUTHENTICATED for certificate failures). */
int dqc__tls_open(dqc_client *c);
/* Sends close_notify (best effort) and frees the session; the handle's context stays. */
void dqc__tls_close(dqc_client *c);
/* Frees the context too (dqc_free). */
void dqc__tls_free(dqc_client *c);
/* send_all / recv_all / conn_alive over the session. */
int dqc__tls_send(dqc_client *c, struct iovec *iov, size_t niov, int *sent);
int dqc__tls_recv(dqc_client *c, void *buf, size_t len, int timeout_ms);
int dqc__tls_alive(dqc_client *c);

/* Waits until fd is ready for events, at most timeout_ms (<= 0: forever): 0, DQ_TIMEOUT, or an
 * errno-derived code. */
int dqc__wait_fd(int fd, short events, int timeout_ms);

/* Element size of a wire dtype (RAW: 1), 0 when invalid. */
size_t dqc__wire_dtype_size(int dtype);

/* Checks a reply tensor: present, in the payload, of dtype `dtype`, and when ndim > 0 with that
 * many dimensions; each shape[i] that is not UINT64_MAX must match; length must equal
 * product(shape) · element size. *bytes = its length. */
DQC_PRIVATE int dqc__tensor_check(dqc_client *c, const Dquant__Tensor *t, const char *what, uint64_t payload_len,
                                  int dtype, size_t ndim, const uint64_t *shape, size_t *bytes);

/* Copies a protobuf bytes field into a fixed profile buffer (DQ_PROTOCOL when too long). */
int dqc__copy_profile(dqc_client *c, const ProtobufCBinaryData *src, uint8_t *dst, size_t *len);

/* ---- requests shared by the socket and the NCCL variants (client_ops.c) ---- */

/* A PUT request around the caller's k and v: k at offset 0, v at `bytes`. Points into itself:
 * build it in place and do not copy it. */
typedef struct dqc__put_req {
    Dquant__Request req;
    Dquant__Put put;
    Dquant__SeqRef seq;
    Dquant__Tensor k, v;
    uint64_t shape[4];
    size_t bytes; /* of k, and of v */
} dqc__put_req;

/* Validates a (op names the call in messages) and builds r; nccl flags both tensors. */
DQC_PRIVATE int dqc__put_build(dqc_client *c, const char *op, const dqc_put_args *a, int nccl, dqc__put_req *r);
/* Copies the PutReply into res (may be NULL). */
DQC_PRIVATE void dqc__put_result(const dqc__reply *rep, dqc_put_result *res);

/* A GET request for a typed format. Points into itself, like dqc__put_req. */
typedef struct dqc__get_req {
    Dquant__Request req;
    Dquant__Get get;
    Dquant__SeqRef seq;
} dqc__get_req;

DQC_PRIVATE int dqc__get_build(dqc_client *c, const char *op, const dqc_get_args *a, dqc__get_req *r);
/* Checks the k and v tensors of a typed GET reply, located within payload_len bytes (the frame's
 * payload, or the NCCL payload); *bytes = the size of each. */
DQC_PRIVATE int dqc__get_check(dqc_client *c, const char *op, const dqc_get_args *a, const Dquant__GetReply *r,
                               uint64_t payload_len, size_t *bytes);
/* Fills res's metadata (start_token, tokens, num_layers, kv_heads, head_dim, dtype, bytes) from a
 * reply dqc__get_check accepted; k, v and the result's memory are left alone. */
DQC_PRIVATE void dqc__get_meta(const Dquant__GetReply *r, dq_dtype dtype, size_t bytes, dqc_get_result *res);

/* An ATTEND request around the caller's items: per item q, then append_k and append_v, back to back
 * in iov order from offset 0. */
typedef struct dqc__attend_req {
    Dquant__Request req;
    Dquant__Attend at;
    struct iovec *iov; /* niov pieces in offset order (points into blk_) */
    size_t niov;
    uint64_t payload;   /* bytes of all pieces */
    size_t nappend;     /* items that append */
    uint64_t oshape[3]; /* out [nitems, q_heads, head_dim]; lse is [nitems, q_heads] */
    size_t obytes, lbytes;
    void *blk_; /* owned: dqc__attend_free */
} dqc__attend_req;

DQC_PRIVATE int dqc__attend_build(dqc_client *c, const char *op, const dqc_attend_args *a, int nccl,
                                  dqc__attend_req *r);
DQC_PRIVATE void dqc__attend_free(dqc__attend_req *r);

/* Sends NCCL_SETUP for the client's CUDA device and waits for its reply (idempotent). Built here
 * because a request message refers to the protobuf-c descriptors, which only this library holds. */
DQC_PRIVATE int dqc__nccl_setup_call(dqc_client *c, int cuda_device, dqc__reply *rep);

#endif
