/* libdquant-client over TLS (see client_internal.h): OpenSSL on the handle's non-blocking socket,
 * with the same timeouts as the plaintext path. The server's certificate is always verified. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"

struct dqc__tls {
    SSL_CTX *ctx; /* per handle, built at the first connect */
    SSL *ssl;     /* per connection */
};

static const char *ssl_reason(char *buf, size_t n)
{
    unsigned long e = ERR_peek_last_error();
    if (!e)
        snprintf(buf, n, "unknown TLS error");
    else
        ERR_error_string_n(e, buf, n);
    return buf;
}

/* OpenSSL writes to the socket with write(): a peer that closed would raise SIGPIPE in the
 * caller's process. SIGPIPE is blocked around each SSL call that may write, and one it raised is
 * consumed, so the call fails with EPIPE instead (the plaintext path uses MSG_NOSIGNAL). */
typedef struct nopipe {
    sigset_t old;
    int pending;
} nopipe;

static void nopipe_begin(nopipe *np)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigemptyset(&pend);
    sigpending(&pend);
    np->pending = sigismember(&pend, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &np->old);
}

static void nopipe_end(nopipe *np)
{
    int saved = errno;
    if (!np->pending) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) > 0) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &np->old, NULL);
    errno = saved;
}

/* Alerts by which a server refuses the client's certificate (or its absence). */
static int cert_refused(unsigned long e)
{
    if (ERR_GET_LIB(e) != ERR_LIB_SSL)
        return 0;
    switch (ERR_GET_REASON(e)) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
        return 1;
    default:
        return 0;
    }
}

/* A failed SSL call: its code and message on the handle. */
static int tls_fail(dqc_client *c, int ret, const char *what)
{
    SSL *ssl = c->tls->ssl;
    int err = SSL_get_error(ssl, ret);
    char why[256];
    int rc;
    if (err == SSL_ERROR_SSL) {
        long vr = SSL_get_verify_result(ssl);
        if (vr != X509_V_OK)
            rc = dqc__fail(c, DQ_UNAUTHENTICATED, "%s %s: server certificate not trusted: %s", what, c->addr,
                           X509_verify_cert_error_string(vr));
        else if (cert_refused(ERR_peek_last_error()))
            rc = dqc__fail(c, DQ_UNAUTHENTICATED, "%s %s: the server refused the client certificate (%s)", what,
                           c->addr, ssl_reason(why, sizeof why));
        else
            rc = dqc__fail(c, DQ_PROTOCOL, "%s %s: %s", what, c->addr, ssl_reason(why, sizeof why));
    } else if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && errno == 0)) {
        rc = dqc__fail(c, DQ_CONNECTION, "%s closed the connection", c->addr);
    } else {
        int e = errno;
        rc = dqc__fail(c, DQ_CONNECTION, "%s %s: %s", what, c->addr, e ? strerror(e) : ssl_reason(why, sizeof why));
    }
    ERR_clear_error();
    return rc;
}

static int make_ctx(dqc_client *c)
{
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        return dqc__fail(c, DQ_NOMEM, "TLS: cannot create a context");
    c->tls->ctx = ctx;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    const char *ca = c->opts.tls_ca;
    if (ca ? SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1 : SSL_CTX_set_default_verify_paths(ctx) != 1)
        goto bad;
    if (c->opts.tls_cert) {
        const char *key = c->opts.tls_key ? c->opts.tls_key : c->opts.tls_cert;
        if (SSL_CTX_use_certificate_chain_file(ctx, c->opts.tls_cert) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1)
            goto bad;
    }
    return 0;
bad:
    dqc__fail(c, DQ_INVALID_ARGUMENT, "TLS: cannot load the CA, certificate or key: %s", ssl_reason(why, sizeof why));
    ERR_clear_error();
    return DQ_INVALID_ARGUMENT;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* After SSL_ERROR_WANT_*: waits for the socket up to timeout_ms. 0, or DQ_TIMEOUT / DQ_IO. */
static int wait_ssl(dqc_client *c, int err, int timeout_ms)
{
    return dqc__wait_fd(c->fd, err == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN, timeout_ms);
}

int dqc__tls_open(dqc_client *c)
{
    if (!c->tls) {
        c->tls = calloc(1, sizeof *c->tls);
        if (!c->tls)
            return dqc__fail(c, DQ_NOMEM, "out of memory");
    }
    if (!c->tls->ctx)
        DQC_FORWARD(make_ctx(c));
    ERR_clear_error();
    SSL *ssl = SSL_new(c->tls->ctx);
    if (!ssl || SSL_set_fd(ssl, c->fd) != 1) {
        SSL_free(ssl);
        return dqc__fail(c, DQ_NOMEM, "TLS: cannot create a session");
    }
    c->tls->ssl = ssl;
    const char *name = c->opts.tls_server_name ? c->opts.tls_server_name : c->host;
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
    } else {
        SSL_set_tlsext_host_name(ssl, name);
        SSL_set1_host(ssl, name);
    }
    int64_t deadline = c->opts.connect_timeout_ms > 0 ? mono_ms() + c->opts.connect_timeout_ms : 0;
    for (;;) {
        nopipe np;
        nopipe_begin(&np);
        int r = SSL_connect(ssl);
        nopipe_end(&np);
        if (r == 1)
            return 0;
        int err = SSL_get_error(ssl, r);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
            return tls_fail(c, r, "TLS handshake with");
        int left = 0;
        if (deadline) {
            int64_t l = deadline - mono_ms();
            if (l <= 0)
                return dqc__fail(c, DQ_TIMEOUT, "TLS handshake with %s: timed out after %d ms", c->addr,
                                 c->opts.connect_timeout_ms);
            left = (int)l;
        }
        int rc = wait_ssl(c, err, left);
        if (rc == DQ_TIMEOUT)
            continue; /* the deadline check above reports it */
        if (rc)
            return dqc__fail(c, rc, "TLS handshake with %s: poll: %s", c->addr, strerror(errno));
    }
}

void dqc__tls_close(dqc_client *c)
{
    if (!c->tls || !c->tls->ssl)
        return;
    nopipe np;
    nopipe_begin(&np);
    (void)SSL_shutdown(c->tls->ssl); /* best effort: the socket is non-blocking */
    nopipe_end(&np);
    SSL_free(c->tls->ssl);
    c->tls->ssl = NULL;
    ERR_clear_error();
}

void dqc__tls_free(dqc_client *c)
{
    if (!c->tls)
        return;
    dqc__tls_close(c);
    SSL_CTX_free(c->tls->ctx);
    free(c->tls);
    c->tls = NULL;
}

int dqc__tls_send(dqc_client *c, struct iovec *iov, size_t niov, int *sent)
{
    for (size_t i = 0; i < niov; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            ERR_clear_error();
            int chunk = left > (1u << 30) ? (1 << 30) : (int)left;
            nopipe np;
            nopipe_begin(&np);
            int n = SSL_write(c->tls->ssl, p, chunk);
            nopipe_end(&np);
            if (n > 0) {
                *sent = 1;
                p += n;
                left -= (size_t)n;
                continue;
            }
            int err = SSL_get_error(c->tls->ssl, n);
            if (err == SSL_ERROR_SYSCALL) {
                /* The server hung up: its alert (a refused certificate) says why, when it came. */
                int e = errno;
                uint8_t b;
                ERR_clear_error();
                int r = SSL_read(c->tls->ssl, &b, 1);
                if (r <= 0 && SSL_get_error(c->tls->ssl, r) == SSL_ERROR_SSL)
                    return tls_fail(c, r, "send to");
                ERR_clear_error();
                errno = e;
            }
            if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
                return tls_fail(c, n, "send to");
            int rc = wait_ssl(c, err, c->opts.io_timeout_ms);
            if (rc == DQ_TIMEOUT)
                return dqc__fail(c, DQ_TIMEOUT, "send to %s: no progress for %d ms", c->addr, c->opts.io_timeout_ms);
            if (rc)
                return dqc__fail(c, rc, "send to %s: poll: %s", c->addr, strerror(errno));
        }
    }
    return 0;
}

int dqc__tls_recv(dqc_client *c, void *buf, size_t len, int timeout_ms)
{
    uint8_t *p = buf;
    while (len) {
        ERR_clear_error();
        int want = len > INT_MAX ? INT_MAX : (int)len;
        nopipe np;
        nopipe_begin(&np);
        int n = SSL_read(c->tls->ssl, p, want); /* may answer a key update */
        nopipe_end(&np);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        int err = SSL_get_error(c->tls->ssl, n);
        if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE)
            return tls_fail(c, n, "receive from");
        int rc = wait_ssl(c, err, timeout_ms);
        if (rc == DQ_TIMEOUT)
            return dqc__fail(c, DQ_TIMEOUT, "no reply from %s for %d ms", c->addr, timeout_ms);
        if (rc)
            return dqc__fail(c, rc, "receive from %s: poll: %s", c->addr, strerror(errno));
    }
    return 0;
}

int dqc__tls_alive(dqc_client *c)
{
    if (!c->tls->ssl || SSL_pending(c->tls->ssl) > 0)
        return 0;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n;
    do {
        n = poll(&p, 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n == 0)
        return 1;
    /* Readable: a record that is not data (a ticket, a key update) leaves it alive; data out of
     * turn, close_notify or EOF do not. */
    uint8_t b;
    ERR_clear_error();
    int r = SSL_peek(c->tls->ssl, &b, 1);
    int err = r > 0 ? SSL_ERROR_NONE : SSL_get_error(c->tls->ssl, r);
    ERR_clear_error();
    return r <= 0 && err == SSL_ERROR_WANT_READ;
}
