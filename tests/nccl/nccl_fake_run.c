/* Runs nccl_bench against dquantd on the CPU, as tests/nccl/nccl_gpu.sh runs it on a two-GPU host:
 * both built against the emulation of CUDA and NCCL in tests/daemon/fakecuda.
 *
 *   nccl_fake_run --dquantd BIN --bench BIN [--daemon-arg ARG]... [--timeout S] -- BENCH_ARGS...
 *
 * Starts the daemon (--backend cuda and the daemon arguments) on a private socket, runs the bench
 * with --addr unix:SOCK and BENCH_ARGS, then stops the daemon with SIGTERM. Exit 0 only if the
 * bench exited 0 and the daemon, alive throughout, exited 0 (the fake CUDA's leak check makes a
 * process that did not free its device memory exit 99). The daemon's log is shown on failure. */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"

extern char **environ;

static void usage(void)
{
    fprintf(stderr, "usage: nccl_fake_run --dquantd BIN --bench BIN [--daemon-arg ARG]... [--timeout S] -- "
                    "BENCH_ARGS...\n");
    exit(64);
}

int main(int argc, char **argv)
{
    const char *dquantd = NULL, *bench = NULL;
    const char *dargs[40] = {"--backend", "cuda"};
    int nd = 2, timeout_s = 500, i = 1;
    while (i < argc && strcmp(argv[i], "--") != 0) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (strcmp(argv[i], "--dquantd") == 0)
            dquantd = v;
        else if (strcmp(argv[i], "--bench") == 0)
            bench = v;
        else if (strcmp(argv[i], "--daemon-arg") == 0 && nd < 38)
            dargs[nd++] = v;
        else if (strcmp(argv[i], "--timeout") == 0)
            timeout_s = atoi(v);
        else
            usage();
        i += 2;
    }
    if (!dquantd || !bench || i >= argc)
        usage();
    i++; /* past "--" */
    dargs[nd] = NULL;

    dqd_daemon d;
    const dqd_opts o = {.bin = dquantd, .extra = dargs};
    if (dqd_start(&d, &o) != 0)
        return 1;
    char **bargv = calloc((size_t)(argc - i) + 4, sizeof *bargv);
    if (!bargv)
        return 1;
    int nb = 0;
    bargv[nb++] = (char *)bench;
    bargv[nb++] = "--addr";
    bargv[nb++] = d.addr;
    for (; i < argc; i++)
        bargv[nb++] = argv[i];
    bargv[nb] = NULL;

    int rc = 0;
    pid_t pid;
    int e = posix_spawn(&pid, bench, NULL, NULL, bargv, environ);
    free(bargv);
    if (e) {
        fprintf(stderr, "nccl_fake_run: cannot start %s: %s\n", bench, strerror(e));
        rc = 1;
    } else {
        int st = 0;
        time_t t0 = time(NULL);
        pid_t w;
        while ((w = waitpid(pid, &st, WNOHANG)) == 0 && time(NULL) - t0 < timeout_s) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (w == 0) {
            fprintf(stderr, "nccl_fake_run: the bench did not finish within %d s; killing it\n", timeout_s);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            rc = 1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "nccl_fake_run: the bench ended with %s %d\n", WIFEXITED(st) ? "exit status" : "signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            rc = 1;
        }
    }
    if (rc)
        dqd_dump_log(&d);
    /* A daemon that died meanwhile ends with its own status; the log is shown when it is not 0. */
    int ds = dqd_stop(&d);
    if (ds != 0) {
        fprintf(stderr, "nccl_fake_run: dquantd exit status %d on SIGTERM (99: device memory not freed)\n", ds);
        rc = 1;
    }
    if (!rc)
        fprintf(stderr, "nccl_fake_run: bench and daemon OK\n");
    return rc;
}
