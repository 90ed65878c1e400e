/* The dquantd command line: --help, --version, bad flags, SIGTERM, systemd readiness. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "dqd_child.h"

static int run(const char *const args[], char **out, char **err)
{
    int ofd, efd;
    pid_t pid = dqd_spawn(args, &ofd, &efd);
    *out = dqd_read_all(ofd);
    *err = dqd_read_all(efd);
    return dqd_wait(pid, 10000);
}

Test(cli, help)
{
    char *out, *err;
    const char *args[] = {"--help", NULL};
    cr_assert_eq(run(args, &out, &err), 0);
    cr_assert(strstr(out, "SYNOPSIS"), "man-style sections");
    cr_assert(strstr(out, "--listen ADDR"));
    cr_assert(strstr(out, "--max-output-queue"));
    cr_assert(strstr(out, "INI: [store] host_memory"), "every flag names its INI key");
    cr_assert(strstr(out, "SIGTERM"));
    free(out);
    free(err);
}

Test(cli, version)
{
    char *out, *err;
    const char *args[] = {"--version", NULL};
    cr_assert_eq(run(args, &out, &err), 0);
    cr_assert(strncmp(out, "dquantd ", 8) == 0, "%s", out);
    cr_assert(strstr(out, "wire protocol 1"));
    free(out);
    free(err);
}

Test(cli, bad_flags_exit_2_with_a_message)
{
    static const char *const cases[][3] = {
        {"--bogus", NULL, "unknown option '--bogus'"},
        {"--max-frame", "abc", "invalid size 'abc'"},
        {"--listen", "tcp://0.0.0.0:7733", "needs a shared secret"},
        {"--config", "/nonexistent.ini", "cannot open config file"},
        {"--workers", NULL, "needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[3] = {cases[i][0], cases[i][1], NULL};
        char *out, *err;
        cr_assert_eq(run(args, &out, &err), 2, "%s", cases[i][0]);
        cr_assert(strstr(err, cases[i][2]), "stderr '%s' lacks '%s'", err, cases[i][2]);
        cr_assert(strncmp(err, "dquantd: ", 9) == 0);
        free(out);
        free(err);
    }
}

Test(cli, listener_in_use_exits_1)
{
    const char *dir = dqd_tmpdir();
    char sock[128], listen[160];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(listen, sizeof listen, "unix:%s", sock);
    const char *args[] = {"--listen", listen, "--metrics", "off", NULL};
    pid_t first = dqd_spawn(args, NULL, NULL);
    cr_assert_eq(dqd_wait_socket(sock, 5000), 0);
    char *out, *err;
    cr_assert_eq(run(args, &out, &err), 1, "a second daemon on the same socket");
    cr_assert(strstr(err, "another server is accepting on it"), "%s", err);
    free(out);
    free(err);
    kill(first, SIGTERM);
    cr_assert_eq(dqd_wait(first, 10000), 0);
    rmdir(dir);
}

Test(cli, sigterm_exits_0_and_removes_the_socket)
{
    const char *dir = dqd_tmpdir();
    char sock[128], listen[160];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(listen, sizeof listen, "unix:%s", sock);
    const char *args[] = {"--listen", listen, "--metrics", "off", NULL};
    int efd;
    pid_t pid = dqd_spawn(args, NULL, &efd);
    cr_assert_eq(dqd_wait_socket(sock, 5000), 0, "the daemon came up");
    kill(pid, SIGTERM);
    cr_assert_eq(dqd_wait(pid, 10000), 0);
    char *err = dqd_read_all(efd);
    cr_assert(strstr(err, "received SIGTERM"), "%s", err);
    free(err);
    struct stat st;
    cr_assert_lt(stat(sock, &st), 0, "the socket file is gone");
    rmdir(dir);
}

Test(cli, sigint_exits_0)
{
    const char *dir = dqd_tmpdir();
    char sock[128], listen[160];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(listen, sizeof listen, "unix:%s", sock);
    const char *args[] = {"--listen", listen, "--metrics", "off", NULL};
    pid_t pid = dqd_spawn(args, NULL, NULL);
    cr_assert_eq(dqd_wait_socket(sock, 5000), 0);
    kill(pid, SIGINT);
    cr_assert_eq(dqd_wait(pid, 10000), 0);
    rmdir(dir);
}

Test(cli, notifies_systemd_when_ready)
{
    const char *dir = dqd_tmpdir();
    char sock[80], listen[160], notify[80];
    snprintf(sock, sizeof sock, "%s/d.sock", dir);
    snprintf(listen, sizeof listen, "unix:%s", sock);
    snprintf(notify, sizeof notify, "%s/notify", dir);
    int nfd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", notify);
    cr_assert_eq(bind(nfd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {10, 0};
    setsockopt(nfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);

    setenv("NOTIFY_SOCKET", notify, 1);
    const char *args[] = {"--listen", listen, "--metrics", "off", NULL};
    pid_t pid = dqd_spawn(args, NULL, NULL);
    unsetenv("NOTIFY_SOCKET");
    char buf[256] = {0};
    ssize_t n = recv(nfd, buf, sizeof buf - 1, 0);
    cr_assert_gt(n, 0, "no notification");
    cr_assert(strstr(buf, "READY=1"), "%s", buf);
    cr_assert_eq(dqd_wait_socket(sock, 5000), 0, "ready means accepting");
    kill(pid, SIGTERM);
    memset(buf, 0, sizeof buf);
    n = recv(nfd, buf, sizeof buf - 1, 0);
    cr_assert_gt(n, 0);
    cr_assert(strstr(buf, "STOPPING=1"), "%s", buf);
    cr_assert_eq(dqd_wait(pid, 10000), 0);
    close(nfd);
    unlink(notify);
    rmdir(dir);
}
