/* Test-side wire helpers: build request frames, talk to a dquantd over a blocking socket.
 * Used by the corpus generator and the server tests (the real client library lives in client/). */
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
uint8_t *wire_frame(const Dquant__Request *req, const uint8_t *payload, size_t payload_len, uint64_t id,
                    size_t *frame_len);

int wire_connect_unix(const char *path);
int wire_connect_tcp(uint16_t port);
int wire_send_all(int fd, const void *buf, size_t len);
/* Sends one request. */
int wire_send(int fd, const Dquant__Request *req, const wire_payload *pl, uint64_t id);
/* Receives one reply: 0, or -1 on EOF / error / timeout (5 s). *payload is malloc'd (may be NULL). */
int wire_recv(int fd, uint64_t *id, Dquant__Response **resp, uint8_t **payload, size_t *payload_len);
/* send + recv, checking the id. */
int wire_call(int fd, const Dquant__Request *req, const wire_payload *pl, Dquant__Response **resp,
              uint8_t **payload, size_t *payload_len);
/* The error code of a reply, 0 when it is not an error. */
int wire_error(const Dquant__Response *resp);

#endif
