/* dquantd metrics endpoint: a minimal HTTP/1.0-style responder on libuv.
 *
 *   GET /metrics  → 200, Prometheus text format 0.0.4
 *   GET /healthz  → 200 "ok"
 *   anything else → 404 / 405 / 400 / 431, then the connection closes.
 *
 * One request per connection, requests larger than 8 KiB are refused, and a connection is closed
 * after metrics_timeout_ms whatever it did. At most metrics_max_connections are open at once, and a
 * new one is always accepted: the oldest that has not sent its request yet is closed to make room,
 * so that connections which send nothing cannot keep a liveness probe of /healthz out. With
 * metrics_token set, /metrics answers 401 unless the request carries "Authorization: Bearer TOKEN";
 * /healthz never asks for it. Garbage costs nothing but a closed socket. */
#ifndef DQD_HTTP_H
#define DQD_HTTP_H

#include <stdint.h>

typedef struct dqd_ctx dqd_ctx;
typedef struct dqd_http dqd_http;

int dqd_http_start(dqd_ctx *ctx, const char *host, uint16_t port, dqd_http **out);
/* Closes the listener and every connection; the struct is freed once all handles have closed. */
void dqd_http_stop(dqd_http *h);

#endif
