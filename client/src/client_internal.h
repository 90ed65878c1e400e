/* libdquant-client internals shared by client.c (connection, framing, calls) and client_ops.c
 * (one function per operation). */
#ifndef DQUANT_CLIENT_INTERNAL_H
#define DQUANT_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "dquant.pb-c.h"
#include "dquant/client.h"

#define DQC_ERR_MAX 512

typedef enum dqc__addr_kind { DQC_ADDR_UNIX = 1, DQC_ADDR_TCP = 2 } dqc__addr_kind;

struct dqc_client {
    dqc__addr_kind kind;
    char *addr;                 /* as given, for messages */
    char *path;                 /* unix: socket path ('@' first: abstract namespace) */
    char *host, *port;          /* tcp */

    dqc_options opts;           /* client_name and secret point to the copies below */
    char *client_name;
    uint8_t *secret;

    int fd;                     /* -1: not connected */
    uint64_t next_id;
    uint64_t reconnects;
    dqc_server_info info;

    uint8_t *sbuf;              /* packed request header message */
    size_t sbuf_cap;
    uint8_t *rbuf;              /* reply header message */
    size_t rbuf_cap;
    uint8_t *pbuf;              /* reply payload when the caller keeps no block */
    size_t pbuf_cap;

    char err[DQC_ERR_MAX];
};

/* Sets the handle's last error message and returns code. */
int dqc__fail(dqc_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Validates a public argument at the boundary: on failure records the message and returns. */
#define DQC_CHECK_ARG(c, cond, ...)                                   \
    do {                                                              \
        if (!(cond))                                                  \
            return dqc__fail((c), DQ_INVALID_ARGUMENT, __VA_ARGS__);  \
    } while (0)

/* Returns the error code of an expression that failed. */
#define DQC_FORWARD(expr)           \
    do {                            \
        int dqc__rc = (expr);       \
        if (dqc__rc != 0)           \
            return dqc__rc;         \
    } while (0)

/* A reply: the unpacked header message and the payload bytes. */
typedef struct dqc__reply {
    Dquant__Response *resp;     /* owned: dqc__reply_free */
    const uint8_t *payload;     /* in *blk (or the handle's scratch); NULL when payload_len is 0 */
    uint64_t payload_len;
} dqc__reply;

/* Sends req with the payload gathered from iov[0..niov) and waits for the reply whose body must be
 * `want` (an Error reply is turned into its code and message). The payload is read into *blk
 * (grown as needed, *blk_cap updated) or, with blk NULL, into the handle's scratch buffer.
 * idempotent: the request may be repeated on a new connection after a break in flight.
 * On success rep->resp must be released with dqc__reply_free. */
int dqc__call(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov, int idempotent,
              Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep);
void dqc__reply_free(dqc__reply *rep);

/* Element size of a wire dtype (RAW: 1), 0 when invalid. */
size_t dqc__wire_dtype_size(int dtype);

/* Checks a reply tensor: present, in the payload, of dtype `dtype`, and when ndim > 0 with that
 * many dimensions; each shape[i] that is not UINT64_MAX must match; length must equal
 * product(shape) · element size. *bytes = its length. */
int dqc__tensor_check(dqc_client *c, const Dquant__Tensor *t, const char *what, uint64_t payload_len, int dtype,
                      size_t ndim, const uint64_t *shape, size_t *bytes);

/* Copies a protobuf bytes field into a fixed profile buffer (DQ_PROTOCOL when too long). */
int dqc__copy_profile(dqc_client *c, const ProtobufCBinaryData *src, uint8_t *dst, size_t *len);

#endif
