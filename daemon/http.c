/* dquantd metrics endpoint (see http.h). */
#include "http.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "ctx.h"
#include "dquant/error.h"
#include "logging.h"
#include "metrics.h"

#define HTTP_MAX_REQUEST 8192

typedef struct http_conn http_conn;

struct dqd_http {
    uv_tcp_t listener;
    dqd_ctx *ctx;
    http_conn *conns, *oldest; /* newest first */
    unsigned nconns;
    bool listener_open;
    bool stopping;
};

struct http_conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t write;
    dqd_http *http;
    http_conn *prev, *next;
    int handles;
    bool closing, responded;
    size_t len;
    char *resp;
    char buf[HTTP_MAX_REQUEST];
};

static void maybe_free_http(dqd_http *h)
{
    if (h->stopping && !h->listener_open && !h->conns)
        free(h);
}

static void on_conn_handle_closed(uv_handle_t *handle)
{
    http_conn *c = handle->data;
    if (--c->handles)
        return;
    dqd_http *h = c->http;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        h->oldest = c->prev;
    h->nconns--;
    free(c->resp);
    free(c);
    maybe_free_http(h);
}

static void conn_close(http_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    c->handles = 2;
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_written(uv_write_t *w, int status)
{
    (void)status;
    conn_close(w->data);
}

static void respond_with(http_conn *c, int code, const char *reason, const char *ctype, const char *extra,
                         const char *body, size_t blen, bool head_only)
{
    if (c->responded)
        return;
    c->responded = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    char hdr[384];
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n", code,
                     reason, ctype, blen, extra);
    size_t total = (size_t)n + (head_only ? 0 : blen);
    c->resp = malloc(total);
    if (!c->resp) {
        conn_close(c);
        return;
    }
    memcpy(c->resp, hdr, (size_t)n);
    if (!head_only && blen)
        memcpy(c->resp + n, body, blen);
    uv_buf_t b = uv_buf_init(c->resp, (unsigned)total);
    c->write.data = c;
    if (uv_write(&c->write, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0)
        conn_close(c);
}

static void respond(http_conn *c, int code, const char *reason, const char *ctype, const char *body, size_t blen,
                    bool head_only)
{
    respond_with(c, code, reason, ctype, "", body, blen, head_only);
}

static void respond_text(http_conn *c, int code, const char *reason, const char *body)
{
    respond(c, code, reason, "text/plain; charset=utf-8", body, strlen(body), false);
}

/* Whether the request's headers carry "Authorization: Bearer <token>" with the configured token
 * (compared in constant time, whatever the input). */
static bool authorized(const http_conn *c, const char *token, size_t token_len)
{
    const char *p = c->buf, *end = c->buf + c->len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            break;
        size_t len = (size_t)(eol - p);
        if (len && p[len - 1] == '\r')
            len--;
        static const char name[] = "authorization:";
        if (len > sizeof name - 1 && strncasecmp(p, name, sizeof name - 1) == 0) {
            const char *v = p + sizeof name - 1, *vend = p + len;
            while (v < vend && (*v == ' ' || *v == '\t'))
                v++;
            if (vend - v > 7 && strncasecmp(v, "bearer ", 7) == 0) {
                v += 7;
                while (v < vend && *v == ' ')
                    v++;
                const size_t given = (size_t)(vend - v);
                volatile uint8_t diff = (uint8_t)(given != token_len);
                for (size_t i = 0; i < token_len; i++)
                    diff |= (uint8_t)((i < given ? (uint8_t)v[i] : 0) ^ (uint8_t)token[i]);
                return diff == 0;
            }
        }
        p = eol + 1;
    }
    return false;
}

/* Parses the request line once the header block is complete. */
static void handle_request(http_conn *c)
{
    char *eol = memchr(c->buf, '\n', c->len);
    if (!eol) {
        respond_text(c, 400, "Bad Request", "bad request\n");
        return;
    }
    size_t line_len = (size_t)(eol - c->buf);
    if (line_len && c->buf[line_len - 1] == '\r')
        line_len--;
    char line[1024];
    if (line_len >= sizeof line) {
        respond_text(c, 414, "URI Too Long", "request line too long\n");
        return;
    }
    memcpy(line, c->buf, line_len);
    line[line_len] = 0;
    for (size_t i = 0; i < line_len; i++) {
        unsigned char ch = (unsigned char)line[i];
        if (ch < 0x20 || ch > 0x7e) {
            respond_text(c, 400, "Bad Request", "bad request\n");
            return;
        }
    }
    char *method = line;
    char *sp1 = strchr(method, ' ');
    if (!sp1) {
        respond_text(c, 400, "Bad Request", "bad request\n");
        return;
    }
    *sp1 = 0;
    char *path = sp1 + 1;
    char *sp2 = strchr(path, ' ');
    if (!sp2 || strncmp(sp2 + 1, "HTTP/1.", 7) != 0) {
        respond_text(c, 400, "Bad Request", "bad request\n");
        return;
    }
    *sp2 = 0;
    char *q = strchr(path, '?');
    if (q)
        *q = 0;
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        respond_text(c, 405, "Method Not Allowed", "only GET and HEAD\n");
        return;
    }
    if (strcmp(path, "/healthz") == 0) {
        respond(c, 200, "OK", "text/plain; charset=utf-8", "ok\n", 3, head);
    } else if (strcmp(path, "/metrics") == 0) {
        dqd_ctx *ctx = c->http->ctx;
        if (ctx->cfg->metrics_token && !authorized(c, ctx->cfg->metrics_token, ctx->cfg->metrics_token_len)) {
            ctx->metrics.http_unauthorized++;
            respond_with(c, 401, "Unauthorized", "text/plain; charset=utf-8",
                         "WWW-Authenticate: Bearer realm=\"dquantd\"\r\n", "a bearer token is required\n",
                         strlen("a bearer token is required\n"), head);
            return;
        }
        dqd_gauges g;
        dqd_ctx_gauges(ctx, &g);
        char *text;
        size_t len;
        if (dqd_metrics_render(&ctx->metrics, &g, &text, &len) < 0) {
            respond_text(c, 500, "Internal Server Error", "out of memory\n");
            return;
        }
        respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, len, head);
        free(text);
    } else {
        respond_text(c, 404, "Not Found", "try /metrics or /healthz\n");
    }
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    http_conn *c = handle->data;
    (void)suggested;
    buf->base = c->buf + c->len;
    buf->len = sizeof c->buf - c->len;
}

static bool headers_complete(const char *b, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (b[i] == '\n' && b[i + 1] == '\n')
            return true;
        if (i + 3 < len && b[i] == '\r' && b[i + 1] == '\n' && b[i + 2] == '\r' && b[i + 3] == '\n')
            return true;
    }
    return false;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    http_conn *c = s->data;
    (void)buf;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    c->len += (size_t)nread;
    if (headers_complete(c->buf, c->len))
        handle_request(c);
    else if (c->len == sizeof c->buf)
        respond_text(c, 431, "Request Header Fields Too Large", "request too large\n");
}

static void on_timeout(uv_timer_t *t)
{
    http_conn *c = t->data;
    c->http->ctx->metrics.http_timeouts++;
    conn_close(c);
}

/* Makes room for a new connection: closes the oldest that has not sent its request yet (the ones
 * answering are about to go by themselves). */
static void evict_one(dqd_http *h)
{
    for (http_conn *c = h->oldest; c; c = c->prev) {
        if (!c->closing && !c->responded) {
            h->ctx->metrics.http_evicted++;
            conn_close(c);
            return;
        }
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    dqd_http *h = server->data;
    if (status < 0 || h->stopping)
        return;
    http_conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    const dqd_config *cfg = h->ctx->cfg;
    unsigned open = 0;
    for (const http_conn *o = h->conns; o; o = o->next)
        open += !o->closing;
    if (open >= cfg->metrics_max_connections)
        evict_one(h);
    c->http = h;
    uv_tcp_init(server->loop, &c->tcp);
    uv_timer_init(server->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    else
        h->oldest = c;
    h->conns = c;
    h->nconns++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, cfg->metrics_timeout_ms, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        conn_close(c);
}

static void on_listener_closed(uv_handle_t *handle)
{
    dqd_http *h = handle->data;
    h->listener_open = false;
    maybe_free_http(h);
}

int dqd_http_start(dqd_ctx *ctx, const char *host, uint16_t port, dqd_http **out)
{
    dqd_http *h = calloc(1, sizeof *h);
    if (!h)
        return DQ_NOMEM;
    h->ctx = ctx;
    uv_tcp_init(ctx->loop, &h->listener);
    h->listener.data = h;
    h->listener_open = true;
    union {
        struct sockaddr sa;
        struct sockaddr_in in4;
        struct sockaddr_in6 in6;
    } addr;
    int rc = strchr(host, ':') ? uv_ip6_addr(host, port, &addr.in6) : uv_ip4_addr(host, port, &addr.in4);
    if (rc == 0)
        rc = uv_tcp_bind(&h->listener, &addr.sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 128, on_connection);
    if (rc < 0) {
        DQD_ERROR("cannot serve metrics on %s:%u: %s", host, port, uv_strerror(rc));
        h->stopping = true;
        uv_close((uv_handle_t *)&h->listener, on_listener_closed);
        return DQ_IO;
    }
    DQD_INFO("metrics on http://%s%s%s:%u/metrics", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
             port);
    *out = h;
    return DQ_OK;
}

void dqd_http_stop(dqd_http *h)
{
    if (!h || h->stopping)
        return;
    h->stopping = true;
    for (http_conn *c = h->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&h->listener, on_listener_closed);
}
