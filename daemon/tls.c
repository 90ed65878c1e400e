/* dquantd TLS (see tls.h). */
#include "tls.h"

#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "logging.h"

#define TLS_INBUF (64u * 1024u)

struct dqd_tls_ctx {
    SSL_CTX *ssl;
    bool mutual;
};

struct dqd_tls {
    SSL *ssl;
    BIO *rbio, *wbio; /* owned by ssl */
    uint64_t id;
    bool established, reported, failed, close_sent;
    char in[TLS_INBUF];
};

/* The first queued OpenSSL error as text; the queue is cleared. */
static const char *ssl_reason(char *buf, size_t n)
{
    unsigned long e = ERR_get_error();
    if (!e)
        snprintf(buf, n, "unknown error");
    else
        ERR_error_string_n(e, buf, n);
    ERR_clear_error();
    return buf;
}

int dqd_tls_ctx_create(const dqd_config *cfg, dqd_tls_ctx **out)
{
    *out = NULL;
    if (!cfg->tls_cert)
        return DQ_OK;
    char why[256];
    dqd_tls_ctx *t = calloc(1, sizeof *t);
    if (!t)
        return DQ_NOMEM;
    t->ssl = SSL_CTX_new(TLS_server_method());
    if (!t->ssl)
        goto fail;
    SSL_CTX_set_min_proto_version(t->ssl, TLS1_2_VERSION);
    /* No session tickets: nothing resumes, and a client sees no record it did not ask for. */
    SSL_CTX_set_num_tickets(t->ssl, 0);
    SSL_CTX_set_options(t->ssl, SSL_OP_NO_RENEGOTIATION);
    if (SSL_CTX_use_certificate_chain_file(t->ssl, cfg->tls_cert) != 1) {
        DQD_ERROR("tls: cannot use certificate '%s': %s", cfg->tls_cert, ssl_reason(why, sizeof why));
        goto fail;
    }
    const char *key = cfg->tls_key ? cfg->tls_key : cfg->tls_cert;
    if (SSL_CTX_use_PrivateKey_file(t->ssl, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(t->ssl) != 1) {
        DQD_ERROR("tls: cannot use key '%s' with the certificate: %s", key, ssl_reason(why, sizeof why));
        goto fail;
    }
    if (cfg->tls_client_ca) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(cfg->tls_client_ca);
        if (!names || SSL_CTX_load_verify_locations(t->ssl, cfg->tls_client_ca, NULL) != 1) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            DQD_ERROR("tls: cannot load client CA '%s': %s", cfg->tls_client_ca, ssl_reason(why, sizeof why));
            goto fail;
        }
        SSL_CTX_set_client_CA_list(t->ssl, names);
        SSL_CTX_set_verify(t->ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
        t->mutual = true;
    }
    *out = t;
    return DQ_OK;
fail:
    dqd_tls_ctx_free(t);
    return DQ_INVALID_ARGUMENT;
}

void dqd_tls_ctx_free(dqd_tls_ctx *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ssl);
    free(t);
}

bool dqd_tls_ctx_mutual(const dqd_tls_ctx *t)
{
    return t && t->mutual;
}

dqd_tls *dqd_tls_new(dqd_tls_ctx *t, uint64_t id)
{
    dqd_tls *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id = id;
    s->ssl = SSL_new(t->ssl);
    s->rbio = BIO_new(BIO_s_mem());
    s->wbio = BIO_new(BIO_s_mem());
    if (!s->ssl || !s->rbio || !s->wbio) {
        BIO_free(s->rbio);
        BIO_free(s->wbio);
        SSL_free(s->ssl);
        free(s);
        return NULL;
    }
    BIO_set_mem_eof_return(s->rbio, -1); /* empty: "retry", not end of file */
    SSL_set_bio(s->ssl, s->rbio, s->wbio);
    SSL_set_accept_state(s->ssl);
    return s;
}

void dqd_tls_free(dqd_tls *s)
{
    if (!s)
        return;
    SSL_free(s->ssl);
    free(s);
}

void dqd_tls_inbuf(dqd_tls *s, char **base, size_t *len)
{
    *base = s->in;
    *len = sizeof s->in;
}

int dqd_tls_feed(dqd_tls *s, size_t n)
{
    if (n > sizeof s->in)
        return DQD_TLS_FAIL;
    return BIO_write(s->rbio, s->in, (int)n) == (int)n ? 0 : DQD_TLS_FAIL;
}

static ssize_t fail_once(dqd_tls *s, const char *what)
{
    char why[256];
    ssl_reason(why, sizeof why);
    if (!s->failed)
        DQD_WARN("conn %llu: TLS %s failed: %s; closing", (unsigned long long)s->id, what, why);
    s->failed = true;
    return DQD_TLS_FAIL;
}

ssize_t dqd_tls_read(dqd_tls *s, void *dst, size_t cap)
{
    if (s->failed)
        return DQD_TLS_FAIL;
    int want = cap > INT_MAX ? INT_MAX : (int)cap;
    ERR_clear_error();
    int n = SSL_read(s->ssl, dst, want);
    if (SSL_is_init_finished(s->ssl))
        s->established = true;
    if (n > 0)
        return n;
    switch (SSL_get_error(s->ssl, n)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        return DQD_TLS_AGAIN;
    case SSL_ERROR_ZERO_RETURN:
        return DQD_TLS_EOF;
    default:
        return fail_once(s, s->established ? "read" : "handshake");
    }
}

bool dqd_tls_just_established(dqd_tls *s)
{
    if (!s->established || s->reported)
        return false;
    s->reported = true;
    DQD_DEBUG("conn %llu: TLS established (%s, %s)", (unsigned long long)s->id, SSL_get_version(s->ssl),
              SSL_get_cipher_name(s->ssl));
    return true;
}

int dqd_tls_seal(dqd_tls *s, const void *const *base, const size_t *len, unsigned n)
{
    if (s->failed)
        return DQD_TLS_FAIL;
    for (unsigned i = 0; i < n; i++) {
        const uint8_t *p = base[i];
        size_t left = len[i];
        while (left) {
            int chunk = left > (1u << 30) ? (1 << 30) : (int)left;
            ERR_clear_error();
            int w = SSL_write(s->ssl, p, chunk);
            if (w <= 0)
                return (int)fail_once(s, "write");
            p += w;
            left -= (size_t)w;
        }
    }
    return 0;
}

bool dqd_tls_close_notify(dqd_tls *s)
{
    if (s->close_sent || s->failed || !s->established)
        return false;
    s->close_sent = true;
    ERR_clear_error();
    (void)SSL_shutdown(s->ssl);
    ERR_clear_error();
    return BIO_ctrl_pending(s->wbio) > 0;
}

uint8_t *dqd_tls_take_output(dqd_tls *s, size_t *len)
{
    size_t n = BIO_ctrl_pending(s->wbio);
    *len = n;
    if (!n)
        return NULL;
    uint8_t *p = malloc(n);
    if (!p)
        return NULL;
    size_t got = 0;
    while (got < n) {
        size_t step = n - got > INT_MAX ? INT_MAX : n - got;
        int r = BIO_read(s->wbio, p + got, (int)step);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    *len = got;
    return p;
}
