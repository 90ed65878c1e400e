/* Test-side wire helpers (see wire.h). */
#include "wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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

uint8_t *wire_frame(const Dquant__Request *req, const uint8_t *payload, size_t payload_len, uint64_t id,
                    size_t *frame_len)
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

int wire_connect_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int wire_connect_tcp(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int wire_send_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_send(int fd, const Dquant__Request *req, const wire_payload *pl, uint64_t id)
{
    size_t flen;
    uint8_t *f = wire_frame(req, pl ? pl->p : NULL, pl ? pl->len : 0, id, &flen);
    int rc = wire_send_all(fd, f, flen);
    free(f);
    return rc;
}

static int recv_all(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, 5000);
        if (r <= 0)
            return -1;
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int wire_recv(int fd, uint64_t *id, Dquant__Response **resp, uint8_t **payload, size_t *payload_len)
{
    uint8_t h[DQ_FRAME_HEADER_BYTES];
    *resp = NULL;
    if (payload)
        *payload = NULL;
    if (recv_all(fd, h, sizeof h) < 0)
        return -1;
    dq_frame_limits lim = {1u << 24, 1ull << 32};
    dq_frame_header hdr;
    int err;
    if (dq_frame_parse_header(h, sizeof h, &lim, &hdr, &err) != DQ_FRAME_OK)
        return -1;
    uint8_t *msg = malloc(hdr.header_len);
    uint8_t *pl = hdr.payload_len ? malloc(hdr.payload_len) : NULL;
    if (recv_all(fd, msg, hdr.header_len) < 0 || (pl && recv_all(fd, pl, hdr.payload_len) < 0)) {
        free(msg);
        free(pl);
        return -1;
    }
    *resp = dquant__response__unpack(NULL, hdr.header_len, msg);
    free(msg);
    if (!*resp) {
        free(pl);
        return -1;
    }
    *id = hdr.request_id;
    if (payload) {
        *payload = pl;
        *payload_len = hdr.payload_len;
    } else {
        free(pl);
    }
    return 0;
}

int wire_call(int fd, const Dquant__Request *req, const wire_payload *pl, Dquant__Response **resp,
              uint8_t **payload, size_t *payload_len)
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
