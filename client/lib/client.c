/* libdquant-client: handle lifecycle, addresses, connecting with timeouts, HELLO, framing of
 * requests and replies, and the retry policy. The operations themselves are in client_ops.c, the
 * NCCL data path in client_nccl.c (libdquant-client-nccl). */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "frame.h"

#define DQC_VERSION_STRING "0.1.0"
#define DQC_HELLO_TIMEOUT_MS 10000
#define DQC_UNIX_SNDBUF (4 << 20) /* bytes asked for a Unix socket's send buffer */
#define DQC_HOLDOFF_MAX_MS 30000  /* longest wait between automatic reconnects that keep failing */

/* ---- errors ---- */

const char *dqc_strerror(int err)
{
    switch (err) {
#define DQC__STR(name, value, msg) \
    case value:                    \
        return msg;
        DQ_ERRNO_MAP(DQC__STR)
#undef DQC__STR
    }
    return "unknown error";
}

const char *dqc_err_name(int err)
{
    switch (err) {
#define DQC__NAME(name, value, msg) \
    case value:                     \
        return #name;
        DQ_ERRNO_MAP(DQC__NAME)
#undef DQC__NAME
    }
    return "UNKNOWN";
}

const char *dqc_version(void)
{
    return DQC_VERSION_STRING;
}

int dqc__fail(dqc_client *c, int code, const char *fmt, ...)
{
    if (c) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *dqc_last_error(const dqc_client *client)
{
    return client ? client->err : "no client";
}

uint64_t dqc_reconnect_count(const dqc_client *client)
{
    return client ? client->reconnects : 0;
}

/* errno of a failed socket call → dq_error. */
static int errno_code(int e)
{
    switch (e) {
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case ENOTCONN:
    case ENOENT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case ESHUTDOWN:
        return DQ_CONNECTION;
    case ETIMEDOUT:
        return DQ_TIMEOUT;
    case EACCES:
    case EPERM:
        return DQ_PERMISSION;
    case ENOMEM:
    case ENOBUFS:
        return DQ_NOMEM;
    default:
        return DQ_IO;
    }
}

/* ---- options and time ---- */

void dqc_options_default(dqc_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
    opts->connect_timeout_ms = 5000;
    opts->io_timeout_ms = 60000;
    opts->client_name = NULL;
    opts->secret = NULL;
    opts->secret_len = 0;
    opts->auto_reconnect = 1;
    opts->reconnect_attempts = 5;
    opts->reconnect_backoff_ms = 20;
    opts->max_reply_header = 64u << 20;
    opts->max_reply_payload = 64ull << 30;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Waits until fd is ready for events, at most timeout_ms (<= 0: forever).
 * Returns 0, DQ_TIMEOUT or DQ_IO. */
static int wait_fd(int fd, short events, int timeout_ms)
{
    int64_t deadline = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    for (;;) {
        int left = -1;
        if (timeout_ms > 0) {
            int64_t l = deadline - now_ms();
            left = l > 0 ? (int)l : 0;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left);
        if (n > 0)
            return 0; /* ready, or an error/hangup the next syscall reports */
        if (n == 0)
            return DQ_TIMEOUT;
        if (errno != EINTR)
            return DQ_IO;
    }
}

int dqc__wait_fd(int fd, short events, int timeout_ms)
{
    return wait_fd(fd, events, timeout_ms);
}

/* ---- addresses ---- */

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* "unix:PATH", "unix://PATH", "/PATH", "tcp://HOST:PORT", "tcp://[V6]:PORT", "tls://" likewise. */
static int parse_addr(dqc_client *c, const char *addr)
{
    if (strncmp(addr, "unix:", 5) == 0 || addr[0] == '/') {
        const char *p = addr[0] == '/' ? addr : addr + 5;
        if (strncmp(p, "//", 2) == 0)
            p += 2;
        size_t n = strlen(p);
        DQC_CHECK_ARG(c, n > 0 && n < sizeof(((struct sockaddr_un *)0)->sun_path), "bad unix socket path in \"%s\"",
                      addr);
        c->kind = DQC_ADDR_UNIX;
        c->path = dup_n(p, n);
        return c->path ? 0 : DQ_NOMEM;
    }
    c->use_tls = strncmp(addr, "tls://", 6) == 0;
    if (strncmp(addr, "tcp://", 6) == 0 || c->use_tls) {
        const char *h = addr + 6, *hend, *port;
        if (*h == '[') {
            hend = strchr(h, ']');
            DQC_CHECK_ARG(c, hend && hend[1] == ':', "bad IPv6 address in \"%s\"", addr);
            port = hend + 2;
            h++;
        } else {
            hend = strrchr(h, ':');
            DQC_CHECK_ARG(c, hend, "missing port in \"%s\"", addr);
            port = hend + 1;
        }
        char *end = NULL;
        long pn = strtol(port, &end, 10);
        DQC_CHECK_ARG(c, hend != h && *port && !*end && pn > 0 && pn <= 65535, "bad host or port in \"%s\"", addr);
        c->kind = DQC_ADDR_TCP;
        c->host = dup_n(h, (size_t)(hend - h));
        c->port = dup_n(port, strlen(port));
        return c->host && c->port ? 0 : DQ_NOMEM;
    }
    return dqc__fail(c, DQ_INVALID_ARGUMENT, "address \"%s\": expected unix:/path, tcp://host:port or tls://host:port",
                     addr);
}

/* ---- connecting ---- */

static void close_conn(dqc_client *c)
{
    if (c->fd >= 0) {
        dqc__tls_close(c);
        close(c->fd);
        c->fd = -1;
    }
}

/* Non-blocking connect of fd to sa with the connect timeout. */
static int connect_fd(dqc_client *c, int fd, const struct sockaddr *sa, socklen_t salen)
{
    int64_t deadline = c->opts.connect_timeout_ms > 0 ? now_ms() + c->opts.connect_timeout_ms : 0;
    for (;;) {
        if (connect(fd, sa, salen) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN && c->kind == DQC_ADDR_UNIX) {
            /* A Unix listener with a full backlog: try again until the deadline. */
            if (deadline && now_ms() >= deadline)
                return dqc__fail(c, DQ_TIMEOUT, "connect %s: listen backlog full until timeout", c->addr);
            sleep_ms(1);
            continue;
        }
        if (errno != EINPROGRESS)
            return dqc__fail(c, errno_code(errno), "connect %s: %s", c->addr, strerror(errno));
        break;
    }
    int left = 0;
    if (deadline) {
        int64_t l = deadline - now_ms();
        left = l > 0 ? (int)l : 1;
    }
    int rc = wait_fd(fd, POLLOUT, left);
    if (rc == DQ_TIMEOUT)
        return dqc__fail(c, DQ_TIMEOUT, "connect %s: timed out after %d ms", c->addr, c->opts.connect_timeout_ms);
    if (rc)
        return dqc__fail(c, rc, "connect %s: poll: %s", c->addr, strerror(errno));
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
        soerr = errno;
    if (soerr)
        return dqc__fail(c, errno_code(soerr), "connect %s: %s", c->addr, strerror(soerr));
    return 0;
}

static int open_socket(dqc_client *c)
{
    if (c->kind == DQC_ADDR_UNIX) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof sun);
        sun.sun_family = AF_UNIX;
        size_t n = strlen(c->path);
        memcpy(sun.sun_path, c->path, n);
        socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
        if (c->path[0] == '@') {
            sun.sun_path[0] = 0; /* abstract namespace: exact length, no terminator */
            salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
        }
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return dqc__fail(c, errno_code(errno), "socket: %s", strerror(errno));
        /* A Unix stream holds at most the sender's send buffer in flight, and the daemon's reads
         * return one buffer's worth each (212,992 bytes by default): ask for more, so a large PUT
         * costs the daemon fewer reads and wake-ups (the kernel caps it at net.core.wmem_max). */
        int sndbuf = DQC_UNIX_SNDBUF;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        int rc = connect_fd(c, fd, (const struct sockaddr *)&sun, salen);
        if (rc) {
            close(fd);
            return rc;
        }
        c->fd = fd;
        return 0;
    }

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(c->host, c->port, &hints, &res);
    if (gai != 0)
        return dqc__fail(c, DQ_CONNECTION, "resolve %s: %s", c->addr, gai_strerror(gai));
    int rc = DQ_CONNECTION;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            rc = dqc__fail(c, errno_code(errno), "socket: %s", strerror(errno));
            continue;
        }
        rc = connect_fd(c, fd, ai->ai_addr, ai->ai_addrlen);
        if (rc == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            c->fd = fd;
            break;
        }
        close(fd);
    }
    freeaddrinfo(res);
    return rc;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

static int exchange(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov,
                    uint64_t payload_len, Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep,
                    int *sent, const dqc__xfer *x);

static int do_hello(dqc_client *c)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = DQ_WIRE_VERSION;
    h.max_version = DQ_WIRE_VERSION;
    h.client_name = c->client_name;
    h.secret.data = c->secret;
    h.secret.len = c->secret ? c->opts.secret_len : 0;
#ifdef DQC_HAVE_NCCL
    /* Built together with libdquant-client-nccl. */
    static char *features[] = {"nccl"};
    h.features = features;
    h.n_features = 1;
#endif
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;

    dqc__reply rep;
    int sent = 0;
    int saved = c->opts.io_timeout_ms;
    if (saved <= 0 || saved > DQC_HELLO_TIMEOUT_MS)
        c->opts.io_timeout_ms = DQC_HELLO_TIMEOUT_MS;
    int rc = exchange(c, &req, NULL, 0, 0, DQUANT__RESPONSE__BODY_HELLO, NULL, NULL, &rep, &sent, NULL);
    c->opts.io_timeout_ms = saved;
    if (rc)
        return rc;

    const Dquant__HelloReply *hr = rep.resp->hello;
    if (hr->version < DQ_WIRE_VERSION || hr->version > DQ_WIRE_VERSION) {
        dqc__reply_free(&rep);
        close_conn(c);
        return dqc__fail(c, DQ_VERSION, "server chose protocol version %u; this client speaks %u", hr->version,
                         DQ_WIRE_VERSION);
    }
    dqc_server_info *in = &c->info;
    memset(in, 0, sizeof *in);
    in->version = hr->version;
    copy_str(in->server_version, sizeof in->server_version, hr->server_version);
    copy_str(in->backend, sizeof in->backend, hr->backend);
    in->max_frame_bytes = hr->max_frame_bytes;
    in->max_payload_bytes = hr->max_payload_bytes;
    in->max_batch_items = hr->max_batch_items;
    for (size_t i = 0; i < hr->n_profiles && in->nprofiles < DQC_INFO_LIST; i++)
        copy_str(in->profiles[in->nprofiles++], DQC_INFO_STR, hr->profiles[i]);
    for (size_t i = 0; i < hr->n_features && in->nfeatures < DQC_INFO_LIST; i++)
        copy_str(in->features[in->nfeatures++], DQC_INFO_STR, hr->features[i]);
    dqc__reply_free(&rep);
    return 0;
}

/* One connection attempt: socket, connect, HELLO. */
static int connect_once(dqc_client *c)
{
    close_conn(c);
    DQC_FORWARD(open_socket(c));
    int rc = c->use_tls ? dqc__tls_open(c) : 0;
    if (rc == 0)
        rc = do_hello(c);
    if (rc) {
        close_conn(c);
        return rc;
    }
    c->conn_gen++;
    if (c->on_connect) {
        int saved = c->opts.auto_reconnect;
        c->opts.auto_reconnect = 0;
        rc = c->on_connect(c, c->on_connect_ctx);
        c->opts.auto_reconnect = saved;
        if (rc)
            close_conn(c);
    }
    return rc;
}

/* Reconnects with the configured attempts and backoff. Errors that another attempt cannot fix
 * (authentication, version) end it early. When every attempt fails a second time in a row, the
 * backoff goes on doubling past this call: until it has passed (retry_at_ms), automatic reconnects
 * are not tried. */
static int reconnect(dqc_client *c)
{
    uint32_t attempts = c->opts.reconnect_attempts ? c->opts.reconnect_attempts : 1;
    uint32_t delay = c->opts.reconnect_backoff_ms;
    int rc = DQ_CONNECTION;
    for (uint32_t i = 0; i < attempts; i++) {
        if (i > 0) {
            sleep_ms(delay);
            delay = delay ? (delay < 2000 ? delay * 2 : delay) : 0;
        }
        rc = connect_once(c);
        if (rc == 0) {
            c->reconnects++;
            c->failed_cycles = 0;
            c->retry_at_ms = 0;
            return 0;
        }
        if (rc == DQ_UNAUTHENTICATED || rc == DQ_VERSION || rc == DQ_NOMEM || rc == DQ_PERMISSION)
            break;
    }
    /* After the first failed reconnect the next call tries again at once (a daemon that restarts
     * is found); after k >= 2 in a row, not for backoff x 2^(attempts + k - 2), at most
     * DQC_HOLDOFF_MAX_MS. */
    c->failed_cycles++;
    uint64_t hold = c->failed_cycles >= 2 ? c->opts.reconnect_backoff_ms : 0;
    for (uint32_t k = 0; k < attempts + c->failed_cycles - 2 && hold < DQC_HOLDOFF_MAX_MS; k++)
        hold *= 2;
    if (hold > DQC_HOLDOFF_MAX_MS)
        hold = DQC_HOLDOFF_MAX_MS;
    c->retry_at_ms = hold ? now_ms() + (int64_t)hold : 0;
    c->reconnect_rc = rc;
    const size_t n = strnlen(c->err, sizeof c->reconnect_err - 1);
    memcpy(c->reconnect_err, c->err, n);
    c->reconnect_err[n] = 0;
    return rc;
}

int dqc_reconnect(dqc_client *client)
{
    DQC_CHECK_HANDLE(client);
    client->err[0] = 0;
    return reconnect(client);
}

/* True when the idle connection is still usable: no pending bytes, no EOF, no error. Anything
 * readable while no reply is due means the server closed it (or sent something out of turn). */
static int conn_alive(dqc_client *c)
{
    if (c->tls)
        return dqc__tls_alive(c);
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n;
    do {
        n = poll(&p, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
        return 1;
    return 0;
}

static int ensure_connected(dqc_client *c)
{
    if (c->fd >= 0 && conn_alive(c))
        return 0;
    close_conn(c);
    if (!c->opts.auto_reconnect)
        return dqc__fail(c, DQ_CONNECTION, "not connected to %s (auto-reconnect is off)", c->addr);
    const int64_t now = now_ms();
    if (c->retry_at_ms && now < c->retry_at_ms)
        return dqc__fail(
            c, c->reconnect_rc == DQ_UNAUTHENTICATED || c->reconnect_rc == DQ_VERSION ? c->reconnect_rc : DQ_CONNECTION,
            "not connected to %s: %u reconnects failed, the last with: %s; next one in %lld ms", c->addr,
            c->failed_cycles, c->reconnect_err, (long long)(c->retry_at_ms - now));
    return reconnect(c);
}

void dqc_free(dqc_client *client)
{
    if (!client)
        return;
    close_conn(client);
    if (client->nccl_free)
        client->nccl_free(client);
    free(client->addr);
    free(client->path);
    free(client->host);
    free(client->port);
    free(client->client_name);
    dqc__tls_free(client);
    for (int i = 0; i < 4; i++)
        free(client->tls_paths[i]);
    if (client->secret) {
        explicit_bzero(client->secret, client->opts.secret_len);
        free(client->secret);
    }
    free(client->sbuf);
    free(client->rbuf);
    free(client->pbuf);
    free(client);
}

int dqc_connect_ex(const char *addr, const dqc_options *opts, dqc_client **out, char *errbuf, size_t errbuf_len)
{
    if (errbuf && errbuf_len)
        errbuf[0] = 0;
    if (!out) {
        if (errbuf && errbuf_len)
            snprintf(errbuf, errbuf_len, "out is NULL");
        return DQ_INVALID_ARGUMENT;
    }
    *out = NULL;
    if (!addr) {
        if (errbuf && errbuf_len)
            snprintf(errbuf, errbuf_len, "address is NULL");
        return DQ_INVALID_ARGUMENT;
    }
    dqc_client *c = calloc(1, sizeof *c);
    if (!c)
        return DQ_NOMEM;
    c->fd = -1;
    c->next_id = 1;

    /* Options from an older, smaller struct keep the defaults for the fields it lacks. */
    dqc_options_default(&c->opts);
    if (opts) {
        size_t n = opts->size && opts->size < sizeof c->opts ? opts->size : sizeof c->opts;
        memcpy(&c->opts, opts, n);
        c->opts.size = sizeof c->opts;
    }
    int rc = DQ_NOMEM;
    const char *name = c->opts.client_name ? c->opts.client_name : "libdquant-client";
    c->client_name = dup_n(name, strlen(name));
    c->addr = dup_n(addr, strlen(addr));
    if (!c->client_name || !c->addr)
        goto fail;
    c->opts.client_name = c->client_name;
    if (c->opts.secret && c->opts.secret_len) {
        c->secret = malloc(c->opts.secret_len);
        if (!c->secret)
            goto fail;
        memcpy(c->secret, c->opts.secret, c->opts.secret_len);
        c->opts.secret = c->secret;
    } else {
        c->opts.secret = NULL;
        c->opts.secret_len = 0;
    }
    const char **tls_opt[4] = {&c->opts.tls_ca, &c->opts.tls_cert, &c->opts.tls_key, &c->opts.tls_server_name};
    for (int i = 0; i < 4; i++) {
        if (!*tls_opt[i])
            continue;
        c->tls_paths[i] = dup_n(*tls_opt[i], strlen(*tls_opt[i]));
        if (!c->tls_paths[i])
            goto fail;
        *tls_opt[i] = c->tls_paths[i];
    }
    rc = parse_addr(c, addr);
    if (rc)
        goto fail;
    rc = connect_once(c);
    if (rc)
        goto fail;
    c->err[0] = 0;
    *out = c;
    return 0;
fail:
    if (errbuf && errbuf_len)
        snprintf(errbuf, errbuf_len, "%s", c->err[0] ? c->err : dqc_strerror(rc));
    dqc_free(c);
    return rc;
}

int dqc_connect(const char *addr, const dqc_options *opts, dqc_client **out)
{
    return dqc_connect_ex(addr, opts, out, NULL, 0);
}

int dqc_server(const dqc_client *client, dqc_server_info *out)
{
    if (!client || !out)
        return DQ_INVALID_ARGUMENT;
    *out = client->info;
    return 0;
}

/* ---- framing ---- */

static int grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf)
        return 0;
    size_t n = need ? need : 1;
    void *p = realloc(*buf, n);
    if (!p)
        return DQ_NOMEM;
    *buf = p;
    *cap = n;
    return 0;
}

/* Writes every byte of iov[0..niov), waiting up to the I/O timeout for each bit of progress.
 * *sent becomes 1 once any byte has been accepted by the kernel. */
static int send_all(dqc_client *c, struct iovec *iov, size_t niov, int *sent)
{
    if (c->tls)
        return dqc__tls_send(c, iov, niov, sent);
    size_t i = 0;
    while (i < niov) {
        if (iov[i].iov_len == 0) {
            i++;
            continue;
        }
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov + i;
        m.msg_iovlen = niov - i < 1024 ? niov - i : 1024;
        ssize_t n = sendmsg(c->fd, &m, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(c->fd, POLLOUT, c->opts.io_timeout_ms);
                if (rc == DQ_TIMEOUT)
                    return dqc__fail(c, DQ_TIMEOUT, "send to %s: no progress for %d ms", c->addr,
                                     c->opts.io_timeout_ms);
                if (rc)
                    return dqc__fail(c, rc, "send to %s: poll: %s", c->addr, strerror(errno));
                continue;
            }
            return dqc__fail(c, errno_code(errno), "send to %s: %s", c->addr, strerror(errno));
        }
        if (n > 0)
            *sent = 1;
        size_t left = (size_t)n;
        while (i < niov && left >= iov[i].iov_len) {
            left -= iov[i].iov_len;
            i++;
        }
        if (left) {
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
        }
    }
    return 0;
}

/* Reads exactly len bytes into buf. */
static int recv_all(dqc_client *c, void *buf, size_t len, int timeout_ms)
{
    if (c->tls)
        return dqc__tls_recv(c, buf, len, timeout_ms);
    uint8_t *p = buf;
    while (len) {
        ssize_t n = recv(c->fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return dqc__fail(c, DQ_CONNECTION, "%s closed the connection", c->addr);
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(c->fd, POLLIN, timeout_ms);
            if (rc == DQ_TIMEOUT)
                return dqc__fail(c, DQ_TIMEOUT, "no reply from %s for %d ms", c->addr, timeout_ms);
            if (rc)
                return dqc__fail(c, rc, "receive from %s: poll: %s", c->addr, strerror(errno));
            continue;
        }
        return dqc__fail(c, errno_code(errno), "receive from %s: %s", c->addr, strerror(errno));
    }
    return 0;
}

/* Receives one reply frame for request `id`. */
static int recv_reply(dqc_client *c, uint64_t id, int timeout_ms, void **blk, size_t *blk_cap, dqc__reply *rep)
{
    uint8_t fh[DQ_FRAME_HEADER_BYTES];
    DQC_FORWARD(recv_all(c, fh, sizeof fh, timeout_ms));
    dq_frame_limits lim = {.max_header = c->opts.max_reply_header, .max_payload = c->opts.max_reply_payload};
    dq_frame_header h;
    int err = 0;
    if (dq_frame_parse_header(fh, sizeof fh, &lim, &h, &err) != DQ_FRAME_OK)
        return dqc__fail(c, err == DQ_TOO_LARGE ? DQ_TOO_LARGE : DQ_PROTOCOL, "bad reply frame from %s (%s)", c->addr,
                         dqc_err_name(err));
    if (h.request_id != id)
        return dqc__fail(c, DQ_PROTOCOL, "reply for request %llu while waiting for %llu",
                         (unsigned long long)h.request_id, (unsigned long long)id);
    if (grow((void **)&c->rbuf, &c->rbuf_cap, h.header_len))
        return dqc__fail(c, DQ_NOMEM, "no memory for a %u-byte reply header", h.header_len);
    DQC_FORWARD(recv_all(c, c->rbuf, h.header_len, timeout_ms));
    if ((uint32_t)XXH32(c->rbuf, h.header_len, 0) != h.header_crc)
        return dqc__fail(c, DQ_PROTOCOL, "reply header checksum mismatch from %s", c->addr);

    uint8_t *payload = NULL;
    if (h.payload_len) {
        void **b = blk ? blk : (void **)&c->pbuf;
        size_t *bc = blk ? blk_cap : &c->pbuf_cap;
        if (grow(b, bc, (size_t)h.payload_len))
            return dqc__fail(c, DQ_NOMEM, "no memory for a %llu-byte reply payload", (unsigned long long)h.payload_len);
        payload = *b;
        DQC_FORWARD(recv_all(c, payload, (size_t)h.payload_len, timeout_ms));
    }
    rep->resp = dquant__response__unpack(NULL, h.header_len, c->rbuf);
    if (!rep->resp)
        return dqc__fail(c, DQ_PROTOCOL, "unparseable reply header from %s", c->addr);
    rep->payload = payload;
    rep->payload_len = h.payload_len;
    return 0;
}

/* Sends one request and receives its reply on the current connection. Any transport or framing
 * failure closes the connection. */
static int exchange(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov,
                    uint64_t payload_len, Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep,
                    int *sent, const dqc__xfer *x)
{
    memset(rep, 0, sizeof *rep);
    *sent = 0;
    size_t hlen = dquant__request__get_packed_size(req);
    DQC_CHECK_ARG(c, hlen > 0 && hlen <= UINT32_MAX, "request header of %zu bytes", hlen);
    if (grow((void **)&c->sbuf, &c->sbuf_cap, hlen))
        return dqc__fail(c, DQ_NOMEM, "no memory for a %zu-byte request header", hlen);
    dquant__request__pack(req, c->sbuf);

    uint8_t fh[DQ_FRAME_HEADER_BYTES];
    uint64_t id = c->next_id++;
    dq_frame_write_header(fh, c->sbuf, (uint32_t)hlen, payload_len, id);

    struct iovec stack_iov[16];
    struct iovec *all = stack_iov;
    if (niov + 2 > sizeof stack_iov / sizeof stack_iov[0]) {
        all = malloc((niov + 2) * sizeof *all);
        if (!all)
            return dqc__fail(c, DQ_NOMEM, "no memory for %zu payload pieces", niov);
    }
    all[0] = (struct iovec){.iov_base = fh, .iov_len = sizeof fh};
    all[1] = (struct iovec){.iov_base = c->sbuf, .iov_len = hlen};
    for (size_t i = 0; i < niov; i++)
        all[i + 2] = iov[i];
    int rc = send_all(c, all, niov + 2, sent);
    if (all != stack_iov)
        free(all);

    if (rc == DQ_CONNECTION && *sent) {
        /* The server may have refused the request and closed while we were still sending: its
         * Error reply, if any, is the better answer. */
        char saved[DQC_ERR_MAX];
        memcpy(saved, c->err, sizeof saved);
        dqc__reply r2;
        memset(&r2, 0, sizeof r2);
        if (recv_reply(c, id, 200, NULL, NULL, &r2) == 0 && r2.resp->body_case == DQUANT__RESPONSE__BODY_ERROR) {
            *rep = r2;
            rc = 0;
            close_conn(c); /* the reply is all that is left of this connection */
        } else {
            dqc__reply_free(&r2);
            memcpy(c->err, saved, sizeof saved);
        }
    } else if (rc == 0) {
        if (x && x->after_send)
            rc = x->after_send(c, x->ctx);
        if (rc == 0)
            rc = recv_reply(c, id, c->opts.io_timeout_ms, blk, blk_cap, rep);
    }
    if (rc) {
        dqc__reply_free(rep);
        close_conn(c);
        return rc;
    }

    Dquant__Response *resp = rep->resp;
    if (resp->body_case == DQUANT__RESPONSE__BODY_ERROR) {
        const Dquant__Error *e = resp->error;
        int code = e->code < 0 ? e->code : DQ_PROTOCOL;
        if (e->code >= 0)
            dqc__fail(c, code, "server error reply with non-negative code %d: %s", e->code,
                      e->message ? e->message : "");
        else
            dqc__fail(c, code, "%s: %s", e->name && e->name[0] ? e->name : dqc_err_name(code),
                      e->message && e->message[0] ? e->message : dqc_strerror(code));
        dqc__reply_free(rep);
        /* Replies after which the server closes: do not wait for the next call to find out. */
        if (code == DQ_UNAUTHENTICATED || code == DQ_PROTOCOL || code == DQ_TOO_LARGE)
            close_conn(c);
        return code;
    }
    if (resp->body_case != want) {
        int got = (int)resp->body_case;
        dqc__reply_free(rep);
        close_conn(c);
        return dqc__fail(c, DQ_PROTOCOL, "reply body %d to a request expecting %d", got, (int)want);
    }
    return 0;
}

void dqc__reply_free(dqc__reply *rep)
{
    if (rep && rep->resp) {
        dquant__response__free_unpacked(rep->resp, NULL);
        rep->resp = NULL;
    }
}

static int call(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov, int idempotent,
                Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep, const dqc__xfer *x)
{
    c->err[0] = 0;
    uint64_t payload_len = 0;
    for (size_t i = 0; i < niov; i++) {
        DQC_CHECK_ARG(c, !iov[i].iov_len || iov[i].iov_base, "payload piece %zu is NULL", i);
        payload_len += iov[i].iov_len;
    }
    for (int attempt = 0;; attempt++) {
        DQC_FORWARD(ensure_connected(c));
        /* The server's stated limits are checked here: an oversize frame would only get the
         * connection closed. */
        if (c->info.max_payload_bytes && payload_len > c->info.max_payload_bytes)
            return dqc__fail(c, DQ_TOO_LARGE, "payload of %llu bytes exceeds the server's limit of %llu",
                             (unsigned long long)payload_len, (unsigned long long)c->info.max_payload_bytes);
        size_t hlen = dquant__request__get_packed_size(req);
        if (c->info.max_frame_bytes && DQ_FRAME_HEADER_BYTES + hlen + payload_len > c->info.max_frame_bytes)
            return dqc__fail(c, DQ_TOO_LARGE, "frame of %llu bytes exceeds the server's limit of %llu",
                             (unsigned long long)(DQ_FRAME_HEADER_BYTES + hlen + payload_len),
                             (unsigned long long)c->info.max_frame_bytes);
        if (x && x->conn_gen != c->conn_gen)
            return dqc__fail(c, DQ_IO,
                             "NCCL not set up: the connection to %s was re-established since dqc_nccl_setup "
                             "(call dqc_nccl_setup again)",
                             c->addr);
        int sent = 0;
        int rc = exchange(c, req, iov, niov, payload_len, want, blk, blk_cap, rep, &sent, x);
        if (rc != DQ_CONNECTION)
            return rc;
        /* Broken connection: repeat only what cannot be applied twice with a different effect,
         * or what never reached the kernel. A call bound to a connection dies with it. */
        if (x || !c->opts.auto_reconnect || attempt >= 1 || (sent && !idempotent))
            return rc;
    }
}

int dqc__call(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov, int idempotent,
              Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep)
{
    return call(c, req, iov, niov, idempotent, want, blk, blk_cap, rep, NULL);
}

int dqc__call_xfer(dqc_client *c, const Dquant__Request *req, const struct iovec *iov, size_t niov,
                   Dquant__Response__BodyCase want, void **blk, size_t *blk_cap, dqc__reply *rep, const dqc__xfer *x)
{
    return call(c, req, iov, niov, 0, want, blk, blk_cap, rep, x);
}

/* ---- tensors ---- */

size_t dqc__wire_dtype_size(int dtype)
{
    switch (dtype) {
    case DQUANT__DTYPE__F32:
        return 4;
    case DQUANT__DTYPE__F16:
    case DQUANT__DTYPE__BF16:
        return 2;
    case DQUANT__DTYPE__RAW:
        return 1;
    default:
        return 0;
    }
}

int dqc__tensor_check(dqc_client *c, const Dquant__Tensor *t, const char *what, uint64_t payload_len, int dtype,
                      size_t ndim, const uint64_t *shape, size_t *bytes)
{
    if (!t)
        return dqc__fail(c, DQ_PROTOCOL, "reply lacks tensor %s", what);
    if ((int)t->dtype != dtype)
        return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s has dtype %d, expected %d", what, (int)t->dtype, dtype);
    if (t->offset > payload_len || t->length > payload_len - t->offset)
        return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s [%llu, +%llu) outside the %llu-byte payload", what,
                         (unsigned long long)t->offset, (unsigned long long)t->length, (unsigned long long)payload_len);
    if (ndim && t->n_shape != ndim)
        return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s has %zu dimensions, expected %zu", what, t->n_shape, ndim);
    uint64_t count = 1;
    for (size_t i = 0; i < t->n_shape; i++) {
        if (ndim && shape && shape[i] != UINT64_MAX && t->shape[i] != shape[i])
            return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s: dimension %zu is %llu, expected %llu", what, i,
                             (unsigned long long)t->shape[i], (unsigned long long)shape[i]);
        if (t->shape[i] && count > UINT64_MAX / t->shape[i])
            return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s: shape overflows", what);
        count *= t->shape[i];
    }
    size_t es = dqc__wire_dtype_size(dtype);
    if (t->n_shape && (count > UINT64_MAX / es || count * es != t->length))
        return dqc__fail(c, DQ_PROTOCOL, "reply tensor %s: %llu bytes for %llu elements of %zu bytes", what,
                         (unsigned long long)t->length, (unsigned long long)count, es);
    *bytes = (size_t)t->length;
    return 0;
}

int dqc__copy_profile(dqc_client *c, const ProtobufCBinaryData *src, uint8_t *dst, size_t *len)
{
    if (src->len > DQC_PROFILE_MAX)
        return dqc__fail(c, DQ_PROTOCOL, "profile of %zu bytes in reply (limit %d)", src->len, DQC_PROFILE_MAX);
    if (src->len)
        memcpy(dst, src->data, src->len);
    *len = src->len;
    return 0;
}
