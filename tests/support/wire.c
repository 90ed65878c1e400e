/* Test-side wire helpers (see wire.h). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dquant/error.h"
#include "frame.h"

void wire_tensor(wire_payload *pl, Dquant__Tensor *t, Dquant__DType dtype, uint64_t *shape, size_t ndim,
                 const void *data, size_t len)
{
    size_t off = (pl->len + 63) & ~(size_t)63;
    size_t need = off + len;
    if (need > pl->cap) {
        size_t cap = pl->cap ? pl->cap : 4096;
        while (cap < need)
            cap *= 2;
        pl->p = realloc(pl->p, cap);
        if (!pl->p)
            abort();
        pl->cap = cap;
    }
    if (off > pl->len)
        memset(pl->p + pl->len, 0, off - pl->len);
    if (len)
        memcpy(pl->p + off, data, len);
    pl->len = need;
    dquant__tensor__init(t);
    t->dtype = dtype;
    t->shape = shape;
    t->n_shape = ndim;
    t->offset = off;
    t->length = len;
}

void wire_payload_free(wire_payload *pl)
{
    free(pl->p);
    pl->p = NULL;
    pl->len = pl->cap = 0;
}

uint8_t *wire_frame(const Dquant__Request *req, const void *payload, size_t payload_len, uint64_t id, size_t *frame_len)
{
    size_t hlen = dquant__request__get_packed_size(req);
    uint8_t *f = malloc(DQ_FRAME_HEADER_BYTES + hlen + payload_len + 1);
    if (!f)
        abort();
    dquant__request__pack(req, f + DQ_FRAME_HEADER_BYTES);
    dq_frame_write_header(f, f + DQ_FRAME_HEADER_BYTES, (uint32_t)hlen, payload_len, id);
    if (payload_len)
        memcpy(f + DQ_FRAME_HEADER_BYTES + hlen, payload, payload_len);
    *frame_len = DQ_FRAME_HEADER_BYTES + hlen + payload_len;
    return f;
}

uint8_t *wire_pack(const Dquant__Request *req, size_t *len)
{
    *len = dquant__request__get_packed_size(req);
    uint8_t *h = malloc(*len + 1);
    if (!h)
        abort();
    dquant__request__pack(req, h);
    return h;
}

int wire_send_header(int fd, const uint8_t *header, size_t header_len, const void *payload, size_t payload_len,
                     uint64_t id)
{
    uint8_t *f = malloc(DQ_FRAME_HEADER_BYTES + header_len + payload_len + 1);
    if (!f)
        abort();
    memcpy(f + DQ_FRAME_HEADER_BYTES, header, header_len);
    dq_frame_write_header(f, f + DQ_FRAME_HEADER_BYTES, (uint32_t)header_len, payload_len, id);
    if (payload_len)
        memcpy(f + DQ_FRAME_HEADER_BYTES + header_len, payload, payload_len);
    int rc = wire_send_all(fd, f, DQ_FRAME_HEADER_BYTES + header_len + payload_len);
    free(f);
    return rc;
}

int wire_connect_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return -1;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int wire_connect_tcp(uint16_t port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int wire_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_send_bytes(int fd, const Dquant__Request *req, const void *payload, size_t payload_len, uint64_t id)
{
    size_t flen;
    uint8_t *f = wire_frame(req, payload, payload_len, id, &flen);
    int rc = wire_send_all(fd, f, flen);
    free(f);
    return rc;
}

int wire_send(int fd, const Dquant__Request *req, const wire_payload *pl, uint64_t id)
{
    return wire_send_bytes(fd, req, pl ? pl->p : NULL, pl ? pl->len : 0, id);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is readable before the deadline: 0, or -1 on timeout or error. */
static int wait_readable(int fd, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r > 0)
            return 0;
        if (r == 0 || errno != EINTR)
            return -1;
    }
}

/* Reads exactly n bytes before the deadline. 0, 1 (EOF or reset at the first byte), -1. */
static int read_exact(int fd, uint8_t *buf, size_t n, int64_t deadline)
{
    size_t got = 0;
    while (got < n) {
        if (wait_readable(fd, deadline))
            return -1;
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return got == 0 ? 1 : -1;
        if (r < 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

int wire_recv_within(int fd, int timeout_ms, uint64_t *id, Dquant__Response **resp, uint8_t **payload,
                     size_t *payload_len)
{
    const int64_t deadline = now_ms() + timeout_ms;
    *resp = NULL;
    if (payload)
        *payload = NULL;
    uint8_t h[DQ_FRAME_HEADER_BYTES];
    int rc = read_exact(fd, h, sizeof h, deadline);
    if (rc)
        return rc;
    const dq_frame_limits lim = {.max_header = 1u << 26, .max_payload = 1ull << 34};
    dq_frame_header hdr;
    int err;
    if (dq_frame_parse_header(h, sizeof h, &lim, &hdr, &err) != DQ_FRAME_OK)
        return -1;
    const size_t total = DQ_FRAME_HEADER_BYTES + hdr.header_len + (size_t)hdr.payload_len;
    uint8_t *buf = malloc(total);
    if (!buf)
        return -1;
    memcpy(buf, h, sizeof h);
    dq_frame f;
    size_t consumed;
    if (read_exact(fd, buf + sizeof h, total - sizeof h, deadline) != 0 ||
        dq_frame_parse(buf, total, &lim, &f, &consumed, &err) != DQ_FRAME_OK ||
        !(*resp = dquant__response__unpack(NULL, hdr.header_len, f.header))) {
        free(buf);
        return -1;
    }
    if (id)
        *id = hdr.request_id;
    if (payload && hdr.payload_len) {
        *payload = malloc((size_t)hdr.payload_len);
        if (!*payload)
            abort();
        memcpy(*payload, f.payload, (size_t)hdr.payload_len);
    }
    if (payload_len)
        *payload_len = (size_t)hdr.payload_len;
    free(buf);
    return 0;
}

int wire_recv(int fd, uint64_t *id, Dquant__Response **resp, uint8_t **payload, size_t *payload_len)
{
    return wire_recv_within(fd, 5000, id, resp, payload, payload_len) == 0 ? 0 : -1;
}

int wire_call(int fd, const Dquant__Request *req, const wire_payload *pl, Dquant__Response **resp, uint8_t **payload,
              size_t *payload_len)
{
    static uint64_t next_id = 1000;
    uint64_t id = ++next_id, got;
    if (wire_send(fd, req, pl, id) < 0)
        return -1;
    if (wire_recv(fd, &got, resp, payload, payload_len) < 0)
        return -1;
    return got == id ? 0 : -1;
}

int wire_error(const Dquant__Response *resp)
{
    return resp && resp->body_case == DQUANT__RESPONSE__BODY_ERROR ? resp->error->code : 0;
}

int wire_hello(int fd, uint64_t id, const char *secret)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = "wire";
    if (secret) {
        h.secret.data = (uint8_t *)secret;
        h.secret.len = strlen(secret);
    }
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    if (wire_send(fd, &req, NULL, id))
        return DQ_CONNECTION;
    Dquant__Response *resp = NULL;
    uint64_t rid = 0;
    if (wire_recv_within(fd, 5000, &rid, &resp, NULL, NULL))
        return DQ_CONNECTION;
    int code = DQ_PROTOCOL;
    if (rid == id && resp->body_case == DQUANT__RESPONSE__BODY_HELLO)
        code = 0;
    else if (rid == id && resp->body_case == DQUANT__RESPONSE__BODY_ERROR)
        code = resp->error->code;
    dquant__response__free_unpacked(resp, NULL);
    return code;
}

int wire_wait_eof(int fd, int timeout_ms)
{
    const int64_t deadline = now_ms() + timeout_ms;
    uint8_t buf[4096];
    for (;;) {
        if (wait_readable(fd, deadline))
            return -1;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}
