/* Test and benchmark harness: runs a real dquantd on a temporary Unix socket and an ephemeral
 * loopback TCP port, and speaks raw frames to it where the client library would refuse to. */
#ifndef DQUANT_E2E_DAEMON_H
#define DQUANT_E2E_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dquant.pb-c.h"

typedef struct e2e_daemon {
    pid_t pid;                 /* 0: not running */
    char dir[64];              /* temporary directory (socket, log) */
    char sock[128];            /* Unix socket path */
    char unix_addr[160];       /* "unix:PATH" */
    char tcp_addr[64];         /* "tcp://127.0.0.1:PORT" */
    char log[128];             /* the daemon's stdout + stderr */
    uint16_t port;
} e2e_daemon;

/* The daemon binary named by $DQUANTD, or NULL when unset or not executable. */
const char *e2e_daemon_path(void);
/* A loopback TCP port that was free a moment ago (bound to port 0, then released). */
uint16_t e2e_free_port(void);
/* Starts bin with --listen unix:SOCK --listen tcp://127.0.0.1:PORT --metrics off --log-level warn
 * and the NULL-terminated extra arguments (may be NULL), then waits (10 s at most) until both
 * listeners accept connections. Returns 0, or -1 with the reason and the daemon's log on stderr. */
int e2e_daemon_start(e2e_daemon *d, const char *bin, const char *const *extra);
/* SIGTERM, then waits up to 15 s (SIGKILL after). Returns the exit status (128 + signal if killed
 * by one), or -1 if it was not running. Removes the temporary directory. */
int e2e_daemon_stop(e2e_daemon *d);
/* Resident set size of the daemon in KiB (from /proc), or -1. */
long e2e_daemon_rss_kb(const e2e_daemon *d);

/* ---- raw frames ---- */

/* A blocking Unix or TCP ("127.0.0.1", port) connection; -1 on failure. */
int e2e_raw_unix(const char *path);
int e2e_raw_tcp(uint16_t port);
/* Writes all of buf; 0 or -1. */
int e2e_raw_write(int fd, const void *buf, size_t len);
/* Packs req into a complete frame (fixed header + message + payload) in a malloc'd buffer. */
uint8_t *e2e_frame(const Dquant__Request *req, const void *payload, size_t plen, uint64_t id, size_t *len);
int e2e_raw_send(int fd, const Dquant__Request *req, const void *payload, size_t plen, uint64_t id);
/* Sends HELLO (version 1, optional secret) and reads its reply. Returns the reply's error code (0
 * for a HelloReply) or DQ_CONNECTION / DQ_PROTOCOL. */
int e2e_raw_hello(int fd, uint64_t id, const char *secret);
/* Reads one reply frame within timeout_ms. Returns 0 with *resp (free with
 * dquant__response__free_unpacked) and, when payload is not NULL, a malloc'd copy of the payload;
 * 1 on a clean EOF before any byte; -1 on timeout, a broken frame or an error. */
int e2e_raw_recv(int fd, int timeout_ms, Dquant__Response **resp, uint64_t *id, uint8_t **payload,
                 uint64_t *payload_len);
/* Waits until the peer closes (read returns 0, after discarding anything sent first). 0 when it
 * closed within timeout_ms, -1 otherwise. */
int e2e_raw_wait_eof(int fd, int timeout_ms);

#endif
