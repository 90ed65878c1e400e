/* The one harness that runs the dquantd under test as a child process, for tests/daemon,
 * tests/client, tests/nccl and the benchmarks beside them.
 *
 * Two levels: any run of the daemon binary (dqd_spawn: the command-line tests read its output and
 * exit status), and a daemon serving on private listeners (dqd_start / dqd_stop: a fresh Unix
 * socket, optionally an ephemeral loopback TCP port, its log in a file). Children get SIGTERM when
 * the process that started them dies, so a test killed for its time limit leaves no daemon behind.
 * Raw frames to a daemon: wire.h. */
#ifndef DQD_TEST_CHILD_H
#define DQD_TEST_CHILD_H

#include <stdint.h>
#include <sys/types.h>

/* ---- any run of the daemon binary ---- */

/* The daemon binary named by $DQUANTD, or NULL when unset or not executable. */
const char *dqd_path(void);
/* Starts $DQUANTD (aborts when unset) with args (NULL-terminated, without argv[0]); stdout /
 * stderr go to pipes returned in *out_fd / *err_fd (NULL: inherited). Returns the pid. */
pid_t dqd_spawn(const char *const args[], int *out_fd, int *err_fd);
/* Waits for the child: its exit status, 128 + signal if killed, -1 on timeout (then it is killed). */
int dqd_wait(pid_t pid, int timeout_ms);
/* Reads a pipe to EOF and closes it (malloc'd, NUL-terminated). */
char *dqd_read_all(int fd);
/* Polls until a Unix socket at path accepts connections. 0 or -1 on timeout. */
int dqd_wait_socket(const char *path, int timeout_ms);
/* A fresh private directory under /tmp (static buffer). */
const char *dqd_tmpdir(void);
/* A loopback TCP port that was free a moment ago (bound to port 0, then released); 0 on failure. */
uint16_t dqd_free_port(void);

/* ---- a daemon on private listeners ---- */

typedef struct dqd_opts {
    const char *bin;          /* NULL: $DQUANTD */
    const char *dir;          /* where the socket and log go; NULL: a fresh directory under /tmp,
                                 removed by dqd_stop (a given one is kept, with the log) */
    const char *name;         /* base name of the socket and log (NAME.sock, NAME.log); NULL: "d" */
    int tcp;                  /* also listen on an ephemeral loopback TCP port */
    const char *log_level;    /* NULL: "warn" */
    int start_timeout_ms;     /* 0: 20000 */
    int stop_timeout_ms;      /* 0: 15000 */
    const char *const *extra; /* further arguments, NULL-terminated; may be NULL */
} dqd_opts;

typedef struct dqd_daemon {
    pid_t pid; /* 0: not running */
    char dir[200];
    char sock[256];    /* Unix socket path */
    char addr[264];    /* "unix:PATH" */
    char tcp_addr[64]; /* "tcp://127.0.0.1:PORT", "" without opts.tcp */
    uint16_t port;     /* 0 without opts.tcp */
    char log[256];     /* the daemon's stdout + stderr */
    int own_dir;       /* dir is removed by dqd_stop */
    int stop_timeout_ms;
} dqd_daemon;

/* Starts the daemon with --listen unix:SOCK [--listen tcp://127.0.0.1:PORT] --metrics off
 * --log-level LEVEL and opts->extra (opts may be NULL: the defaults), then waits until every
 * listener accepts connections. Returns 0, or -1 with the reason and the daemon's log on stderr
 * (nothing left running). */
int dqd_start(dqd_daemon *d, const dqd_opts *opts);
/* SIGTERM, then waits (SIGKILL after the stop timeout). Returns the exit status (128 + signal if
 * a signal ended it; the log goes to stderr unless it is 0), or -1 if it was not running or
 * ignored SIGTERM. Removes a directory dqd_start made. */
int dqd_stop(dqd_daemon *d);
/* Resident set size of the daemon in KiB (from /proc), or -1. */
long dqd_rss_kb(const dqd_daemon *d);
/* 1 when a line of the daemon's log contains needle. */
int dqd_log_contains(const dqd_daemon *d, const char *needle);
/* Copies the daemon's log to stderr. */
void dqd_dump_log(const dqd_daemon *d);

#endif
