/* dquantd metrics endpoint: a minimal HTTP/1.0-style responder on libuv.
 *
 *   GET /metrics  → 200, Prometheus text format 0.0.4
 *   GET /healthz  → 200 "ok"
 *   anything else → 404 / 405 / 400 / 431, then the connection closes.
 *
 * One request per connection, requests larger than 8 KiB are refused, a client gets 5 seconds to
 * send its request, and at most 64 are served at once: garbage costs nothing but a closed socket. */
#ifndef DQD_HTTP_H
#define DQD_HTTP_H

#include <stdint.h>

typedef struct dqd_ctx dqd_ctx;
typedef struct dqd_http dqd_http;

int dqd_http_start(dqd_ctx *ctx, const char *host, uint16_t port, dqd_http **out);
/* Closes the listener and every connection; the struct is freed once all handles have closed. */
void dqd_http_stop(dqd_http *h);

#endif
