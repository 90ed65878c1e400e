/* Runs the dquantd under test as a child process (see dqd_child.h). */
#define _GNU_SOURCE /* pipe2 */
#include "dqd_child.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DQD_MAX_ARGS 64

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

const char *dqd_path(void)
{
    const char *p = getenv("DQUANTD");
    if (!p || !*p || access(p, X_OK) != 0)
        return NULL;
    return p;
}

/* fork + exec of argv[0] with stdin from /dev/null; stdout and stderr to out_fd / err_fd when >= 0.
 * The child gets SIGTERM when this process dies. Returns the pid, -1 when fork failed. */
static pid_t run_child(const char *const argv[], int out_fd, int err_fd)
{
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
        _exit(127);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) {
        dup2(nul, 0);
        close(nul);
    }
    if (out_fd >= 0)
        dup2(out_fd, 1);
    if (err_fd >= 0)
        dup2(err_fd, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
}

pid_t dqd_spawn(const char *const args[], int *out_fd, int *err_fd)
{
    const char *exe = getenv("DQUANTD");
    if (!exe) {
        fprintf(stderr, "DQUANTD is not set (run through meson test)\n");
        abort();
    }
    const char *argv[DQD_MAX_ARGS] = {exe};
    int argc = 1;
    for (int i = 0; args && args[i] && argc < DQD_MAX_ARGS - 1; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;

    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if ((out_fd && pipe2(po, O_CLOEXEC) < 0) || (err_fd && pipe2(pe, O_CLOEXEC) < 0))
        abort();
    pid_t pid = run_child(argv, po[1], pe[1]);
    if (pid < 0) {
        fprintf(stderr, "cannot run %s: %s\n", exe, strerror(errno));
        abort();
    }
    if (out_fd) {
        close(po[1]);
        *out_fd = po[0];
    }
    if (err_fd) {
        close(pe[1]);
        *err_fd = pe[0];
    }
    return pid;
}

int dqd_wait(pid_t pid, int timeout_ms)
{
    long end = now_ms() + timeout_ms;
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0)
            return -1;
        if (now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        nap_ms(10);
    }
}

char *dqd_read_all(int fd)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    if (!buf)
        abort();
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            if (!buf)
                abort();
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    close(fd);
    return buf;
}

/* 1 when a Unix socket at path / the loopback port accepts a connection now. */
static int unix_accepts(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return 0;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

static int tcp_accepts(uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int dqd_wait_socket(const char *path, int timeout_ms)
{
    long end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        if (unix_accepts(path))
            return 0;
        nap_ms(20);
    }
    return -1;
}

/* A fresh private folder under /tmp (mkdtemp fills in the XXXXXX); NULL with errno set on failure. */
static char *fresh_dir(char *buf, size_t n)
{
    snprintf(buf, n, "/tmp/dqd-test-XXXXXX");
    return mkdtemp(buf);
}

const char *dqd_tmpdir(void)
{
    static char dir[64];
    if (!fresh_dir(dir, sizeof dir))
        abort();
    return dir;
}

uint16_t dqd_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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

/* ---- a daemon on private listeners ---- */

void dqd_dump_log(const dqd_daemon *d)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return;
    char line[4096];
    fprintf(stderr, "---- dquantd log (%s) ----\n", d->log);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fprintf(stderr, "----\n");
    fclose(f);
}

int dqd_log_contains(const dqd_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
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

static void release_dir(dqd_daemon *d)
{
    if (d->own_dir && d->dir[0])
        remove_dir(d->dir);
    d->dir[0] = 0;
    d->own_dir = 0;
}

int dqd_start(dqd_daemon *d, const dqd_opts *opts)
{
    const dqd_opts none = {0};
    const dqd_opts *o = opts ? opts : &none;
    memset(d, 0, sizeof *d);
    const char *bin = o->bin ? o->bin : dqd_path();
    if (!bin) {
        fprintf(stderr, "dqd_start: $DQUANTD is not set or not executable\n");
        return -1;
    }
    const char *name = o->name ? o->name : "d";
    if (o->dir) {
        snprintf(d->dir, sizeof d->dir, "%s", o->dir);
    } else {
        if (!fresh_dir(d->dir, sizeof d->dir)) {
            fprintf(stderr, "dqd_start: mkdtemp: %s\n", strerror(errno));
            return -1;
        }
        d->own_dir = 1;
    }
    snprintf(d->sock, sizeof d->sock, "%s/%s.sock", d->dir, name);
    snprintf(d->addr, sizeof d->addr, "unix:%s", d->sock);
    snprintf(d->log, sizeof d->log, "%s/%s.log", d->dir, name);
    d->stop_timeout_ms = o->stop_timeout_ms > 0 ? o->stop_timeout_ms : 15000;
    const int start_ms = o->start_timeout_ms > 0 ? o->start_timeout_ms : 20000;
    unlink(d->sock);
    unlink(d->log);

    /* A TCP port is picked before the daemon binds it: if another process took it meanwhile the
     * daemon exits at once, and another port is tried. */
    for (int attempt = 0; attempt < (o->tcp ? 5 : 1); attempt++) {
        const char *argv[DQD_MAX_ARGS];
        int n = 0;
        argv[n++] = bin;
        argv[n++] = "--listen";
        argv[n++] = d->addr;
        if (o->tcp) {
            d->port = dqd_free_port();
            snprintf(d->tcp_addr, sizeof d->tcp_addr, "tcp://127.0.0.1:%u", d->port);
            argv[n++] = "--listen";
            argv[n++] = d->tcp_addr;
        }
        argv[n++] = "--metrics";
        argv[n++] = "off";
        argv[n++] = "--log-level";
        argv[n++] = o->log_level ? o->log_level : "warn";
        for (int i = 0; o->extra && o->extra[i] && n < DQD_MAX_ARGS - 1; i++)
            argv[n++] = o->extra[i];
        argv[n] = NULL;

        int lf = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (lf < 0) {
            fprintf(stderr, "dqd_start: %s: %s\n", d->log, strerror(errno));
            release_dir(d);
            return -1;
        }
        pid_t pid = run_child(argv, lf, lf);
        close(lf);
        if (pid < 0) {
            fprintf(stderr, "dqd_start: fork: %s\n", strerror(errno));
            release_dir(d);
            return -1;
        }
        d->pid = pid;

        long deadline = now_ms() + start_ms;
        int exited = 0;
        while (now_ms() < deadline) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                exited = 1;
                d->pid = 0;
                break;
            }
            if (unix_accepts(d->sock) && (!o->tcp || tcp_accepts(d->port)))
                return 0;
            nap_ms(10);
        }
        if (!exited) {
            fprintf(stderr, "dqd_start: %s did not come up within %d ms\n", bin, start_ms);
            dqd_dump_log(d);
            dqd_stop(d);
            return -1;
        }
    }
    fprintf(stderr, "dqd_start: %s exited at start\n", bin);
    dqd_dump_log(d);
    release_dir(d);
    return -1;
}

int dqd_stop(dqd_daemon *d)
{
    int status = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        long deadline = now_ms() + (d->stop_timeout_ms > 0 ? d->stop_timeout_ms : 15000);
        int st = 0, done = 0;
        while (now_ms() < deadline) {
            if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
                done = 1;
                break;
            }
            nap_ms(10);
        }
        if (!done) {
            fprintf(stderr, "dqd_stop: dquantd (pid %d) ignored SIGTERM; killing it\n", (int)d->pid);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            dqd_dump_log(d);
        } else {
            status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            if (status != 0) {
                fprintf(stderr, "dqd_stop: dquantd (pid %d) ended with %s %d\n", (int)d->pid,
                        WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                dqd_dump_log(d);
            }
        }
        d->pid = 0;
    }
    release_dir(d);
    return status;
}

long dqd_rss_kb(const dqd_daemon *d)
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
