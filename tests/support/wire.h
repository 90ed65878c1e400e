/* Test-side wire helpers: build request frames and talk to a dquantd over a blocking socket where
 * the client library would refuse to (malformed, pipelined or unauthenticated requests). Used by
 * the daemon's server tests and corpus generator, the client's end-to-end tests and the NCCL bench
 * (the real client library lives in client/lib). */
#ifndef DQD_TEST_WIRE_H
#define DQD_TEST_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "dquant.pb-c.h"

/* A payload under construction; tensors are appended 64-byte aligned. */
typedef struct wire_payload {
    uint8_t *p;
    size_t len, cap;
} wire_payload;

/* Appends bytes and fills t (dtype, shape[ndim], offset, length). shape must outlive t. */
void wire_tensor(wire_payload *pl, Dquant__Tensor *t, Dquant__DType dtype, uint64_t *shape, size_t ndim,
                 const void *data, size_t len);
void wire_payload_free(wire_payload *pl);

/* A complete frame (malloc'd) for a request and payload. */
uint8_t *wire_frame(const Dquant__Request *req, const void *payload, size_t payload_len, uint64_t id,
                    size_t *frame_len);

/* The header message of a request, packed (malloc'd; *len its bytes), for tests that change bytes
 * protobuf-c would never write (a NUL inside a string) before sending it with wire_send_header. */
uint8_t *wire_pack(const Dquant__Request *req, size_t *len);
/* Sends one frame of an already packed header message and the payload bytes. 0 or -1. */
int wire_send_header(int fd, const uint8_t *header, size_t header_len, const void *payload, size_t payload_len,
                     uint64_t id);

/* A blocking connection to a Unix socket or to 127.0.0.1:port (TCP_NODELAY); -1 on failure. */
int wire_connect_unix(const char *path);
int wire_connect_tcp(uint16_t port);
/* Writes all of buf (never raising SIGPIPE); 0 or -1. */
int wire_send_all(int fd, const void *buf, size_t len);
/* Sends one request with the payload pl (may be NULL) / the payload bytes. 0 or -1. */
int wire_send(int fd, const Dquant__Request *req, const wire_payload *pl, uint64_t id);
int wire_send_bytes(int fd, const Dquant__Request *req, const void *payload, size_t payload_len, uint64_t id);
/* Receives one reply frame (its header checksum checked) within timeout_ms. Returns 0 with *resp
 * (free with dquant__response__free_unpacked), *id, and when payload is not NULL the payload in a
 * malloc'd *payload (NULL when empty); 1 on a clean EOF (or reset) before any byte; -1 on timeout,
 * a broken frame or an error. id, payload_len may be NULL. */
int wire_recv_within(int fd, int timeout_ms, uint64_t *id, Dquant__Response **resp, uint8_t **payload,
                     size_t *payload_len);
/* wire_recv_within with 5 s; EOF is -1 too. */
int wire_recv(int fd, uint64_t *id, Dquant__Response **resp, uint8_t **payload, size_t *payload_len);
/* send + recv, checking the id. */
int wire_call(int fd, const Dquant__Request *req, const wire_payload *pl, Dquant__Response **resp, uint8_t **payload,
              size_t *payload_len);
/* The error code of a reply, 0 when it is not an error. */
int wire_error(const Dquant__Response *resp);
/* Sends HELLO (version 1, client name "wire", optional secret) as request id and reads its reply.
 * Returns the reply's error code (0 for a HelloReply) or DQ_CONNECTION / DQ_PROTOCOL. */
int wire_hello(int fd, uint64_t id, const char *secret);
/* Waits until the peer closes (discarding anything sent first). 0 when it closed within timeout_ms,
 * -1 otherwise. */
int wire_wait_eof(int fd, int timeout_ms);

#endif
