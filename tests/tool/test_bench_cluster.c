/* `dquant bench` through the multi-node client (dqc_cluster) against three dquantd on loopback
 * ports, for a bounded time ($DQ_CLUSTER_BENCH_SECONDS, default 20; 60 for the documented run)
 * while one daemon is killed with SIGKILL a quarter into the run and restarted, empty, half-way:
 *  - R = 2, W = 1: no request fails and none misses; the latency per second is printed, with the
 *    p99 of the intervals from the kill to 2 s after the restart beside the steady ones;
 *  - R = 1: the dead daemon's keys are misses (NOT_FOUND, fewer LOOKUP hits), nothing else fails.
 * The mix is PUT / GET / ATTEND and the prefix-sharing PREFIX requests of the shared tier. With a
 * 3 s --timeout a request that hung would fail with TIMEOUT. Skipped when $DQUANT_CLI or $DQUANTD
 * is unset. */
#define _GNU_SOURCE /* pipe2 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"

#define NODES 3

static dqd_daemon D[NODES];
static uint16_t P[NODES];

static void stop_all(void)
{
    for (int i = 0; i < NODES; i++)
        if (D[i].pid)
            cr_expect_eq(dqd_stop(&D[i]), 0, "node %d must exit 0 on SIGTERM", i);
}

TestSuite(bench_cluster, .fini = stop_all, .timeout = 300);

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void start_node(int i)
{
    char listen[64];
    snprintf(listen, sizeof listen, "tcp://127.0.0.1:%u", P[i]);
    const char *extra[] = {"--listen", listen, NULL};
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D[i], &o), 0, "could not start node %d", i);
}

/* The bench as a child, its stdout and stderr into one pipe (*fd). */
static pid_t spawn_bench(const char *const argv[], int *fd)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(127);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    *fd = p[0];
    return pid;
}

/* Appends what fd has within timeout_ms to buf (len, cap); 0 at EOF, 1 otherwise. */
static int read_some(int fd, char *buf, size_t *len, size_t cap, int timeout_ms)
{
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0)
        return 1;
    ssize_t n = read(fd, buf + *len, cap - *len - 1);
    if (n < 0 && errno == EINTR)
        return 1;
    if (n <= 0)
        return 0;
    *len += (size_t)n;
    buf[*len] = 0;
    return 1;
}

typedef struct run {
    unsigned long long requests, errors, misses;
    double fail_p99_ms, steady_p99_ms;
    unsigned long long marked_down, failovers, degraded, repaired;
    double hit_rate;
} run;

/* One bench run with node `victim` killed at 1/4 and restarted at 1/2 of the measured time. */
static run bench_with_failover(const char *tool, int replicas, int seconds, int victim, const char *model)
{
    char members[3][64], dur[16], r[16];
    for (int i = 0; i < NODES; i++)
        snprintf(members[i], sizeof members[i], "tcp://127.0.0.1:%u", P[i]);
    snprintf(dur, sizeof dur, "%d", seconds);
    snprintf(r, sizeof r, "%d", replicas);
    const char *argv[] = {tool,
                          "bench",
                          "--connect",
                          members[0],
                          "--connect",
                          members[1],
                          "--connect",
                          members[2],
                          "--replicas",
                          r,
                          "--write-quorum",
                          "1",
                          "--timeout",
                          "3000",
                          "--model",
                          model,
                          "-c",
                          "4",
                          "--duration",
                          dur,
                          "--timeline",
                          "1000",
                          "--mix",
                          "put=25,get=30,attend=25,prefix=20",
                          "--prefix-share",
                          "0.6",
                          "--prompts",
                          "8",
                          "--prompt-tokens",
                          "512",
                          "--chunk-tokens",
                          "128",
                          "--layers",
                          "2",
                          "--kv-heads",
                          "2",
                          "--head-dim",
                          "64",
                          "--q-heads",
                          "4",
                          "--tokens",
                          "64",
                          "--prefill",
                          "256",
                          "--seqs",
                          "8",
                          NULL};
    int fd;
    pid_t pid = spawn_bench(argv, &fd);
    static char out[1 << 20];
    size_t len = 0;
    out[0] = 0;
    long deadline = now_ms() + 120000;
    while (!strstr(out, "[bench] measuring") && now_ms() < deadline)
        cr_assert(read_some(fd, out, &len, sizeof out, 200), "the bench ended before measuring:\n%s", out);
    long t0 = now_ms();
    long kill_at = t0 + seconds * 1000 / 4, restart_at = t0 + seconds * 1000 / 2;
    int killed = 0, restarted = 0;
    while (read_some(fd, out, &len, sizeof out, 50)) {
        long now = now_ms();
        if (!killed && now >= kill_at) {
            kill(D[victim].pid, SIGKILL);
            waitpid(D[victim].pid, NULL, 0);
            D[victim].pid = 0;
            dqd_stop(&D[victim]);
            killed = 1;
        }
        if (killed && !restarted && now >= restart_at) {
            start_node(victim);
            restarted = 1;
        }
        cr_assert_lt(now, deadline + seconds * 1000, "the bench does not end:\n%s", out);
    }
    close(fd);
    int st;
    waitpid(pid, &st, 0);
    cr_assert(killed && restarted, "the run ended before the restart:\n%s", out);
    printf("---- bench, R = %d, node %d killed at %.1f s and restarted at %.1f s ----\n%s", replicas, victim,
           (kill_at - t0) / 1000.0, (restart_at - t0) / 1000.0, out);
    cr_assert(WIFEXITED(st), "%s", out);

    run res = {0};
    const char *tot = strstr(out, "\ntotal ");
    cr_assert_not_null(tot, "%s", out);
    cr_assert_eq(sscanf(tot, "\ntotal %llu %llu %llu", &res.requests, &res.errors, &res.misses), 3, "%s", out);
    const char *cl = strstr(out, "cluster: ");
    cr_assert_not_null(cl, "%s", out);
    cr_assert_eq(sscanf(cl,
                        "cluster: members=%*u replicas=%*u write_quorum=%*u failovers=%llu marked_down=%llu "
                        "degraded_writes=%llu repairs=%*u repaired_chunks=%llu",
                        &res.failovers, &res.marked_down, &res.degraded, &res.repaired),
                 4, "%s", out);
    const char *pc = strstr(out, "prefix client: ");
    cr_assert_not_null(pc, "%s", out);
    const char *hr = strstr(pc, "hit_rate=");
    cr_assert_not_null(hr);
    res.hit_rate = strtod(hr + 9, NULL);
    /* The timeline: p99 of the intervals from the kill to 2 s after the restart, and of the others. */
    const char *tl = strstr(out, "timeline (1000 ms intervals):");
    cr_assert_not_null(tl, "%s", out);
    tl = strchr(strchr(tl, '\n') + 1, '\n') + 1;
    double kill_s = (kill_at - t0) / 1000.0, back_s = (restart_at - t0) / 1000.0 + 2;
    int lines = 0;
    for (const char *p = tl; *p && *p != 'c'; p = strchr(p, '\n') + 1) {
        double t, rps, p50, p99, mx;
        unsigned long long n, e, m;
        if (sscanf(p, "%lf %llu %lf %llu %llu %lf %lf %lf", &t, &n, &rps, &e, &m, &p50, &p99, &mx) != 8)
            break;
        lines++;
        double *dst = t + 1 > kill_s && t < back_s ? &res.fail_p99_ms : &res.steady_p99_ms;
        if (p99 / 1000 > *dst)
            *dst = p99 / 1000;
        if (!strchr(p, '\n'))
            break;
    }
    cr_assert_geq(lines, seconds - 1, "%s", out);
    return res;
}

static int seconds(void)
{
    const char *s = getenv("DQ_CLUSTER_BENCH_SECONDS");
    int v = s ? atoi(s) : 20;
    return v >= 8 ? v : 8;
}

static const char *setup(void)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set (build the dquantd target to run this test)");
    for (int i = 0; i < NODES; i++) {
        P[i] = dqd_free_port();
        cr_assert_neq(P[i], 0);
        start_node(i);
    }
    return tool;
}

Test(bench_cluster, r2_no_failure_while_a_node_dies_and_returns)
{
    const char *tool = setup();
    int secs = seconds();
    run r = bench_with_failover(tool, 2, secs, 1, "m-r2");
    cr_assert_gt(r.requests, 100);
    cr_assert_eq(r.errors, 0, "R = 2: no request may fail");
    cr_assert_eq(r.misses, 0, "R = 2: every key has a live replica");
    cr_assert_geq(r.marked_down, 1, "the dead node was noticed");
    cr_assert_gt(r.failovers + r.degraded, 0);
    printf("R=2 failover over %d s: %llu requests, 0 failed, 0 missed; p99 per 1 s interval: %.1f ms during the "
           "failover (kill to 2 s after the restart), %.1f ms otherwise; %llu failovers, %llu degraded writes, %llu "
           "chunks repaired\n",
           secs, r.requests, r.fail_p99_ms, r.steady_p99_ms, r.failovers, r.degraded, r.repaired);
}

Test(bench_cluster, r1_dead_node_keys_are_misses)
{
    const char *tool = setup();
    int secs = seconds();
    run r = bench_with_failover(tool, 1, secs, 2, "m-r1");
    cr_assert_gt(r.requests, 100);
    cr_assert_eq(r.errors, 0, "R = 1: a dead node's keys are misses, not errors");
    cr_assert_gt(r.misses, 0, "R = 1: the dead node's sequences were lost");
    cr_assert_geq(r.marked_down, 1);
    printf("R=1 over %d s: %llu requests, 0 failed, %llu misses (NOT_FOUND), prefix hit rate %.3f; p99 %.1f ms during "
           "the failover, %.1f ms otherwise\n",
           secs, r.requests, r.misses, r.hit_rate, r.fail_p99_ms, r.steady_p99_ms);
}
