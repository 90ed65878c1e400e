/* dquantd requests: one frame's request from arrival to reply.
 *
 * A request owns its frame buffer (the payload tensors point into it) and its unpacked header.
 * An operation finishes it exactly once with dqd_req_reply or dqd_req_fail; the input is freed
 * then, the reply frame is built and on_done, which the connection set, hands it back; the
 * connection sends replies in request order. If the connection has gone meanwhile the reply is
 * dropped. Nothing here calls up into the connection or the server. */
#ifndef DQD_REQUEST_H
#define DQD_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "authlimit.h"
#include "dquant.pb-c.h"
#include "opcode.h"
#include "pbmem.h"
#include "validate.h"

typedef struct dqd_ctx dqd_ctx;
typedef struct dqd_req dqd_req;

/* What the operations may know of the connection a request came on (the connection embeds it
 * and outlives its requests). */
typedef struct dqd_session {
    uint64_t id;             /* the connection's id, for logs */
    bool require_secret;     /* its listener wants HELLO with the shared secret */
    bool authed;             /* HELLO succeeded */
    dqd_peer peer;           /* the TCP peer's address (authlimit.h); family 0 on a Unix socket */
    struct dqd_nchan *nchan; /* NCCL data path (ncclpath.h), NULL until NCCL_SETUP */
    uint32_t leases;         /* live LOOKUP leases (lease.h), owned by this session */
    char client_name[129];   /* HELLO's client_name (validated: UTF-8, no NUL, <= 128 bytes) */
} dqd_session;

struct dqd_req {
    dqd_ctx *ctx;
    dqd_session *sess;
    /* Called once when the request is finished (reply or error frame in head/out); set by the
     * connection, which queues the reply. */
    void (*on_done)(dqd_req *req);
    /* Set by the connection: counts bytes of a reply buffer against its memory (iomem.h) before
     * dqd_req_out_alloc allocates them; DQ_RESOURCE_EXHAUSTED when they do not fit. NULL: no limit. */
    int (*charge)(dqd_req *req, size_t bytes);
    uint64_t charged;     /* bytes charged so far; the connection settles them with the reply */
    bool out_refused;     /* a reply buffer did not fit: a DQ_NOMEM failure says so instead */
    void *owner;          /* the connection */
    struct dqd_req *next; /* connection queue, arrival order */
    uint64_t id;
    dqd_op op;
    uint64_t t0_ns;

    uint8_t *frame;     /* owned; 64-byte aligned payload inside */
    size_t frame_bytes; /* accounted against the connection's queue */
    const uint8_t *payload;
    uint64_t payload_len;
    const uint8_t *header; /* the header message as received (in frame) */
    uint32_t header_len;
    Dquant__Request *msg;
    dqd_pbmem pbmem; /* msg's allocator (pbmem.h) */

    int done;
    int err;         /* 0, or the error code replied */
    int close_after; /* close the connection once this reply is sent */
    uint8_t *head;   /* fixed header + packed Response */
    size_t head_len;
    uint8_t *out; /* reply payload (owned, may be NULL) */
    size_t out_len;

    /* NCCL data path (ncclpath.h) */
    bool nccl_admitted; /* holds its connection's NCCL channel until its reply */
    void (*nccl_run)(struct dqd_req *req);
    struct dqd_req *nccl_next; /* the channel's waiting list */
    void *dpayload;            /* the NCCL payload received into device memory (owned) */
    uint8_t *hpayload;         /* or a host copy of it (owned) */
    /* An admitted request's NCCL reply, for on_done to hand to the channel (dqd_nccl_release):
     * buf (device memory when on_device, else malloc'd; owned), len bytes, tiled by segs. */
    struct {
        void *buf;
        bool on_device;
        uint64_t len;
        dqd_seg *segs;
        size_t nseg;
    } nccl_reply;
};

/* Replies with resp and the payload out (ownership taken, freed with free(); may be NULL).
 * If the reply frame cannot be built (too large, no memory) an error reply is sent instead. */
void dqd_req_reply(dqd_req *req, Dquant__Response *resp, uint8_t *out, size_t out_len);
/* A reply whose payload buf (len bytes, device memory when on_device, else malloc'd host memory;
 * ownership taken) goes on the connection's NCCL channel instead of the socket (the request asked
 * for nccl_reply): its tensors are marked `nccl`, Response.nccl_payload = len. */
void dqd_req_reply_nccl(dqd_req *req, Dquant__Response *resp, void *buf, bool on_device, size_t len);
/* Where the request's tensors are (the frame's payload, the NCCL payload once received). */
void dqd_req_payload(const dqd_req *req, dqd_payload *pl);
/* Replies Error{code, dq_err_name(code), message}. */
void dqd_req_fail(dqd_req *req, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Frees a request with whatever it still owns. */
void dqd_req_free(dqd_req *req);

/* Fills a reply tensor (shape copied into shape_store, which must live until the reply is packed). */
void dqd_reply_tensor(Dquant__Tensor *t, uint64_t *shape_store, Dquant__DType dtype, const uint64_t *shape, size_t ndim,
                      uint64_t offset, uint64_t length);
/* 64-byte aligned output buffer for replies (free with free()); NULL if len is 0 or no memory. */
uint8_t *dqd_out_alloc(size_t len);
/* dqd_out_alloc for req's reply, charged to its connection's memory first: NULL when the bytes do not
 * fit there (then a DQ_NOMEM failure of req is sent as DQ_RESOURCE_EXHAUSTED) or no memory. */
uint8_t *dqd_req_out_alloc(dqd_req *req, size_t len);

/* Builds a complete error frame in head (used where no request exists, e.g. framing errors). */
int dqd_error_frame(uint64_t request_id, int code, const char *message, uint8_t **head, size_t *head_len);

#endif
