/* dquantd TLS for TCP connections (OpenSSL): one server context built from the configuration and,
 * per connection, an SSL object on two memory BIOs. conn.c feeds it the ciphertext its uv read
 * callback receives, reads plaintext out of it into its frame buffers, and writes the ciphertext it
 * produces (handshake records, sealed replies, alerts, close_notify) with uv_write, so the event
 * loop never blocks and the TLS layer sees every byte (no I/O thread reads a TLS socket).
 *
 * Authentication: with a client CA (--tls-client-ca) the handshake requires a client certificate
 * signed by it, and a connection whose handshake completed counts as authenticated: its HELLO
 * needs no shared secret (the certificate replaces the secret on those listeners). */
#ifndef DQD_TLS_H
#define DQD_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"

typedef struct dqd_tls_ctx dqd_tls_ctx;
typedef struct dqd_tls dqd_tls;

/* Results of dqd_tls_read besides a byte count. */
#define DQD_TLS_AGAIN 0   /* needs more ciphertext */
#define DQD_TLS_EOF (-1)  /* the peer closed the TLS session (close_notify) */
#define DQD_TLS_FAIL (-2) /* handshake or record error (logged once); the connection must close */

/* The server context of cfg's tls_cert / tls_key (and tls_client_ca); *out NULL when no
 * certificate is configured. Returns 0, or DQ_INVALID_ARGUMENT with the reason logged (unreadable
 * or mismatched certificate and key, bad CA file). */
int dqd_tls_ctx_create(const dqd_config *cfg, dqd_tls_ctx **out);
void dqd_tls_ctx_free(dqd_tls_ctx *t);
/* True when the context requires verified client certificates. */
bool dqd_tls_ctx_mutual(const dqd_tls_ctx *t);

/* A server-side session for connection id (for log lines); NULL when out of memory. */
dqd_tls *dqd_tls_new(dqd_tls_ctx *t, uint64_t id);
void dqd_tls_free(dqd_tls *s);
/* Where the uv read callback may put ciphertext (a buffer the session owns). */
void dqd_tls_inbuf(dqd_tls *s, char **base, size_t *len);
/* Hands the session n bytes of ciphertext received into its inbuf. */
int dqd_tls_feed(dqd_tls *s, size_t n);
/* Decrypts up to cap bytes into dst, driving the handshake first: a byte count, DQD_TLS_AGAIN,
 * DQD_TLS_EOF or DQD_TLS_FAIL. */
ssize_t dqd_tls_read(dqd_tls *s, void *dst, size_t cap);
/* True once, the first time it is called after the handshake has completed. */
bool dqd_tls_just_established(dqd_tls *s);
/* Encrypts the n plaintext pieces (base, len) into the pending output. 0 or DQD_TLS_FAIL. */
int dqd_tls_seal(dqd_tls *s, const void *const *base, const size_t *len, unsigned n);
/* Queues close_notify once (after a completed handshake): true when it did. */
bool dqd_tls_close_notify(dqd_tls *s);
/* The ciphertext waiting to be sent, malloc'd (the caller frees it), NULL with *len 0 when none
 * (or *len != 0 when out of memory). */
uint8_t *dqd_tls_take_output(dqd_tls *s, size_t *len);

#endif
