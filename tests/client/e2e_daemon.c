/* Test and benchmark harness for a real dquantd (see e2e_daemon.h). */
#include "e2e_daemon.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dquant/error.h"
#include "frame.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *e2e_daemon_path(void)
{
    const char *p = getenv("DQUANTD");
    if (!p || !*p || access(p, X_OK) != 0)
        return NULL;
    return p;
}

uint16_t e2e_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    uint16_t port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

int e2e_raw_unix(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if (n >= sizeof sun.sun_path) {
        close(fd);
        return -1;
    }
    memcpy(sun.sun_path, path, n + 1);
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int e2e_raw_tcp(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void dump_log(const e2e_daemon *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[512];
    fprintf(stderr, "---- dquantd log (%s) ----\n", d->log);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fprintf(stderr, "----\n");
    fclose(f);
}

static void remove_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp)
        return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(dp))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(dp);
    rmdir(dir);
}

int e2e_daemon_start(e2e_daemon *d, const char *bin, const char *const *extra)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/dqc-e2e-XXXXXX");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, "e2e: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(d->sock, sizeof d->sock, "%s/d.sock", d->dir);
    snprintf(d->unix_addr, sizeof d->unix_addr, "unix:%s", d->sock);
    snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);

    for (int attempt = 0; attempt < 5; attempt++) {
        d->port = e2e_free_port();
        snprintf(d->tcp_addr, sizeof d->tcp_addr, "tcp://127.0.0.1:%u", d->port);
        char listen_tcp[80];
        snprintf(listen_tcp, sizeof listen_tcp, "tcp://127.0.0.1:%u", d->port);
        const char *argv[64];
        int n = 0;
        argv[n++] = bin;
        argv[n++] = "--listen";
        argv[n++] = d->unix_addr;
        argv[n++] = "--listen";
        argv[n++] = listen_tcp;
        argv[n++] = "--metrics";
        argv[n++] = "off";
        argv[n++] = "--log-level";
        argv[n++] = "warn";
        for (int i = 0; extra && extra[i] && n < 63; i++)
            argv[n++] = extra[i];
        argv[n] = NULL;

        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "e2e: fork: %s\n", strerror(errno));
            return -1;
        }
        if (pid == 0) {
            int lf = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (lf >= 0) {
                dup2(lf, 1);
                dup2(lf, 2);
                close(lf);
            }
            int nul = open("/dev/null", O_RDONLY);
            if (nul >= 0) {
                dup2(nul, 0);
                close(nul);
            }
            execv(bin, (char *const *)argv);
            _exit(127);
        }
        d->pid = pid;

        uint64_t deadline = now_ms() + 10000;
        int up = 0, exited = 0;
        while (now_ms() < deadline) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                exited = 1;
                d->pid = 0;
                break;
            }
            int fu = e2e_raw_unix(d->sock);
            int ft = fu >= 0 ? e2e_raw_tcp(d->port) : -1;
            if (fu >= 0)
                close(fu);
            if (ft >= 0) {
                close(ft);
                up = 1;
                break;
            }
            nap_ms(10);
        }
        if (up)
            return 0;
        if (!exited) {
            fprintf(stderr, "e2e: dquantd did not come up within 10 s\n");
            dump_log(d);
            e2e_daemon_stop(d);
            return -1;
        }
        /* Exited at once: most likely the port was taken meanwhile; try another. */
        if (attempt == 4) {
            fprintf(stderr, "e2e: dquantd exited at start\n");
            dump_log(d);
            remove_dir(d->dir);
            return -1;
        }
    }
    return -1;
}

int e2e_daemon_stop(e2e_daemon *d)
{
    int status = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        uint64_t deadline = now_ms() + 15000;
        int st = 0, done = 0;
        while (now_ms() < deadline) {
            pid_t r = waitpid(d->pid, &st, WNOHANG);
            if (r == d->pid) {
                done = 1;
                break;
            }
            nap_ms(10);
        }
        if (!done) {
            fprintf(stderr, "e2e: dquantd ignored SIGTERM for 15 s; killing it\n");
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
        }
        status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        if (status != 0) {
            fprintf(stderr, "e2e: dquantd (pid %d) ended with %s %d\n", (int)d->pid,
                    WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            dump_log(d);
        }
        d->pid = 0;
    }
    if (d->dir[0]) {
        remove_dir(d->dir);
        d->dir[0] = 0;
    }
    return status;
}

long e2e_daemon_rss_kb(const e2e_daemon *d)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)d->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* ---- raw frames ---- */

int e2e_raw_write(int fd, const void *buf, size_t len)
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

uint8_t *e2e_frame(const Dquant__Request *req, const void *payload, size_t plen, uint64_t id, size_t *len)
{
    size_t hlen = dquant__request__get_packed_size(req);
    uint8_t *buf = malloc(DQ_FRAME_HEADER_BYTES + hlen + plen);
    if (!buf)
        return NULL;
    dquant__request__pack(req, buf + DQ_FRAME_HEADER_BYTES);
    dq_frame_write_header(buf, buf + DQ_FRAME_HEADER_BYTES, (uint32_t)hlen, plen, id);
    if (plen)
        memcpy(buf + DQ_FRAME_HEADER_BYTES + hlen, payload, plen);
    *len = DQ_FRAME_HEADER_BYTES + hlen + plen;
    return buf;
}

int e2e_raw_send(int fd, const Dquant__Request *req, const void *payload, size_t plen, uint64_t id)
{
    size_t len;
    uint8_t *f = e2e_frame(req, payload, plen, id, &len);
    if (!f)
        return -1;
    int rc = e2e_raw_write(fd, f, len);
    free(f);
    return rc;
}

int e2e_raw_hello(int fd, uint64_t id, const char *secret)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = "e2e-raw";
    if (secret) {
        h.secret.data = (uint8_t *)secret;
        h.secret.len = strlen(secret);
    }
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    if (e2e_raw_send(fd, &req, NULL, 0, id))
        return DQ_CONNECTION;
    Dquant__Response *resp = NULL;
    uint64_t rid = 0;
    int rc = e2e_raw_recv(fd, 5000, &resp, &rid, NULL, NULL);
    if (rc)
        return DQ_CONNECTION;
    int code = DQ_PROTOCOL;
    if (rid == id && resp->body_case == DQUANT__RESPONSE__BODY_HELLO)
        code = 0;
    else if (rid == id && resp->body_case == DQUANT__RESPONSE__BODY_ERROR)
        code = resp->error->code;
    dquant__response__free_unpacked(resp, NULL);
    return code;
}

/* Reads exactly n bytes before the deadline. 0, 1 (EOF at the first byte), -1. */
static int read_exact(int fd, uint8_t *buf, size_t n, uint64_t deadline)
{
    size_t got = 0;
    while (got < n) {
        int64_t left = (int64_t)(deadline - now_ms());
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            return got == 0 ? 1 : -1;
        if (r < 0)
            return got == 0 && (errno == ECONNRESET) ? 1 : -1;
        got += (size_t)r;
    }
    return 0;
}

int e2e_raw_recv(int fd, int timeout_ms, Dquant__Response **resp, uint64_t *id, uint8_t **payload,
                 uint64_t *payload_len)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    uint8_t fh[DQ_FRAME_HEADER_BYTES];
    int rc = read_exact(fd, fh, sizeof fh, deadline);
    if (rc)
        return rc;
    const dq_frame_limits lim = {.max_header = 1u << 26, .max_payload = 1ull << 34};
    dq_frame_header h;
    int err;
    if (dq_frame_parse_header(fh, sizeof fh, &lim, &h, &err) != DQ_FRAME_OK)
        return -1;
    uint8_t *buf = malloc(DQ_FRAME_HEADER_BYTES + h.header_len + (size_t)h.payload_len);
    if (!buf)
        return -1;
    memcpy(buf, fh, sizeof fh);
    if (read_exact(fd, buf + sizeof fh, h.header_len + (size_t)h.payload_len, deadline)) {
        free(buf);
        return -1;
    }
    dq_frame f;
    size_t consumed;
    if (dq_frame_parse(buf, DQ_FRAME_HEADER_BYTES + h.header_len + (size_t)h.payload_len, &lim, &f, &consumed,
                       &err) != DQ_FRAME_OK) {
        free(buf);
        return -1;
    }
    *resp = dquant__response__unpack(NULL, h.header_len, f.header);
    if (!*resp) {
        free(buf);
        return -1;
    }
    if (id)
        *id = h.request_id;
    if (payload) {
        *payload = malloc(h.payload_len ? (size_t)h.payload_len : 1);
        if (h.payload_len)
            memcpy(*payload, f.payload, (size_t)h.payload_len);
    }
    if (payload_len)
        *payload_len = h.payload_len;
    free(buf);
    return 0;
}

int e2e_raw_wait_eof(int fd, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    uint8_t buf[4096];
    for (;;) {
        int64_t left = (int64_t)(deadline - now_ms());
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            return -1;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}
