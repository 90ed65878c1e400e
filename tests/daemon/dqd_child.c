/* Runs the dquantd under test (see spawn.h). */
#include "dqd_child.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

pid_t dqd_spawn(const char *const args[], int *out_fd, int *err_fd)
{
    const char *exe = getenv("DQUANTD");
    if (!exe) {
        fprintf(stderr, "DQUANTD is not set (run through meson test)\n");
        abort();
    }
    const char *argv[64] = {exe};
    int argc = 1;
    for (int i = 0; args && args[i] && argc < 63; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    if (out_fd) {
        if (pipe(po) < 0)
            abort();
        posix_spawn_file_actions_adddup2(&fa, po[1], 1);
        posix_spawn_file_actions_addclose(&fa, po[0]);
    }
    if (err_fd) {
        if (pipe(pe) < 0)
            abort();
        posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
        posix_spawn_file_actions_addclose(&fa, pe[0]);
    }
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "cannot run %s: %s\n", exe, strerror(rc));
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

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
        usleep(10000);
    }
}

char *dqd_read_all(int fd)
{
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = realloc(buf, cap);
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

int dqd_wait_socket(const char *path, int timeout_ms)
{
    long end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof sa);
        sa.sun_family = AF_UNIX;
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (ok)
            return 0;
        usleep(20000);
    }
    return -1;
}

const char *dqd_tmpdir(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/dqd-test-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    return dir;
}
