/* `dquant bench` with the prefix-sharing mix (PREFIX requests against the shared KV tier) against
 * a real dquantd with /metrics on loopback: a run at --prefix-share 0 and one at 0.7, 300 requests
 * each on 2 connections. The daemon's lookup counters must be exported, agree with what the bench
 * measured on its side (client and STATS lines), show a clearly higher hit rate with sharing, and
 * count the chunks the two connections PUT at the same time as dedupe hits. Skipped when
 * $DQUANT_CLI or $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dqd_child.h"
#include "wire.h"

static dqd_daemon D;

static void stop_daemon(void)
{
    if (D.pid)
        cr_expect_eq(dqd_stop(&D), 0, "dquantd must exit 0 on SIGTERM");
}

TestSuite(bench_prefix, .fini = stop_daemon, .timeout = 60);

static int run_cli(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The body of GET /metrics (HTTP/1.0: the daemon closes after the reply). */
static void scrape(uint16_t port, char *buf, size_t cap)
{
    int fd = wire_connect_tcp(port);
    cr_assert_geq(fd, 0, "cannot connect to the metrics port %u", port);
    const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    cr_assert_eq(wire_send_all(fd, req, strlen(req)), 0);
    size_t len = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t n = recv(fd, buf + len, cap - len - 1, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
        cr_assert_lt(len + 1, cap, "metrics reply too long");
    }
    buf[len] = 0;
    close(fd);
    cr_assert(strstr(buf, "200 OK") != NULL, "%s", buf);
}

/* The value of the sample line "NAME VALUE" (a line start, then a space). */
static double metric(const char *body, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = body; (p = strstr(p, name)) != NULL; p += n) {
        if ((p == body || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    }
    cr_assert_fail("metric %s missing from /metrics:\n%s", name, body);
    return NAN;
}

typedef struct figures {
    unsigned long long lookups, keys, hit_chunks, hit_tokens, missed_tokens, stored, deduped, gets;
    double rate;
    unsigned long long d_lookups, d_hit, d_missed, d_put, d_dedupe;
    double d_rate;
} figures;

static figures run_bench(const char *tool, double share, const char *ns)
{
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd,
             "%s bench --connect %s -c 2 -n 150 --prefix-share %.2f --prompts 8 --prompt-tokens 512 "
             "--chunk-tokens 128 --lease-ms 2000 --get-hit --ns %s --layers 1 --kv-heads 1 --head-dim 64 "
             "--q-heads 2 --quiet 2>&1",
             tool, D.addr, share, ns);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
    figures f = {0};
    const char *c = strstr(out, "prefix client: ");
    const char *d = strstr(out, "prefix daemon: ");
    cr_assert(c && d, "%s", out);
    cr_assert_eq(sscanf(c,
                        "prefix client: lookups=%llu keys=%llu hit_chunks=%llu hit_tokens=%llu missed_tokens=%llu "
                        "hit_rate=%lf chunks_stored=%llu deduped=%llu get_chunks=%llu",
                        &f.lookups, &f.keys, &f.hit_chunks, &f.hit_tokens, &f.missed_tokens, &f.rate, &f.stored,
                        &f.deduped, &f.gets),
                 9, "%s", out);
    cr_assert_eq(sscanf(d,
                        "prefix daemon: lookups=%llu lookup_hit_tokens=%llu lookup_missed_tokens=%llu hit_rate=%lf "
                        "chunks_put=%llu chunk_dedupe_hits=%llu",
                        &f.d_lookups, &f.d_hit, &f.d_missed, &f.d_rate, &f.d_put, &f.d_dedupe),
                 6, "%s", out);
    /* Nothing else talks to this daemon: its counters over the run are the client's figures. */
    cr_assert_eq(f.lookups, 300, "%s", out);
    cr_assert_eq(f.keys, 300 * 4, "%s", out);
    cr_assert_eq(f.d_lookups, f.lookups, "%s", out);
    cr_assert_eq(f.d_hit, f.hit_tokens, "%s", out);
    cr_assert_eq(f.d_missed, f.missed_tokens, "%s", out);
    cr_assert_eq(f.hit_tokens, f.hit_chunks * 128, "%s", out);
    cr_assert_eq(f.hit_tokens + f.missed_tokens, f.keys * 128, "%s", out);
    cr_assert_eq(f.d_put, f.stored, "%s", out);
    cr_assert_eq(f.d_dedupe, f.deduped, "%s", out);
    cr_assert_eq(f.stored + f.deduped, f.keys - f.hit_chunks, "every missing chunk is PUT: %s", out);
    cr_assert_float_eq(f.rate, f.d_rate, 1e-9, "%s", out);
    return f;
}

Test(bench_prefix, hit_rate_on_metrics)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set (build the dquantd target to run this test)");
    uint16_t port = dqd_free_port();
    cr_assert_neq(port, 0);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", port);
    const char *extra[] = {"--metrics", listen, NULL};
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start dquantd");
    static char body[1 << 18];

    /* No sharing: every lookup misses, nothing is deduplicated. */
    figures f0 = run_bench(tool, 0, "p0");
    cr_assert_eq(f0.hit_tokens, 0);
    cr_assert_eq(f0.deduped, 0);
    scrape(port, body, sizeof body);
    cr_assert_eq(metric(body, "dquant_lookups_total"), 300);
    cr_assert_eq(metric(body, "dquant_lookup_hit_tokens_total"), 0);
    cr_assert_eq(metric(body, "dquant_lookup_missed_tokens_total"), (double)f0.missed_tokens);
    cr_assert_eq(metric(body, "dquant_lookup_hit_rate"), 0);
    cr_assert_eq(metric(body, "dquant_chunk_dedupe_hits_total"), 0);

    /* 70% of the prompts share 1..4 chunks with one of 8 base prompts. */
    figures f7 = run_bench(tool, 0.7, "p7");
    cr_assert_gt(f7.hit_tokens, 0);
    cr_assert_gt(f7.rate, f0.rate + 0.2, "hit rate %.4f at share 0.7 vs %.4f at 0", f7.rate, f0.rate);
    cr_assert_lt(f7.rate, 0.7, "a prompt shares at most its full chunks, and the first time misses");
    cr_assert_gt(f7.gets, 0);
    cr_assert_gt(f7.deduped, 0, "the two connections PUT the same new base chunks at once");
    scrape(port, body, sizeof body);
    double hit = metric(body, "dquant_lookup_hit_tokens_total");
    double miss = metric(body, "dquant_lookup_missed_tokens_total");
    double rate = metric(body, "dquant_lookup_hit_rate");
    cr_assert_eq(metric(body, "dquant_lookups_total"), 600);
    cr_assert_eq(hit, (double)f7.hit_tokens);
    cr_assert_eq(miss, (double)(f0.missed_tokens + f7.missed_tokens));
    cr_assert_gt(rate, 0);
    cr_assert_lt(rate, 1);
    cr_assert_float_eq(rate, hit / (hit + miss), 1e-9);
    cr_assert_eq(metric(body, "dquant_chunk_dedupe_hits_total"), (double)f7.deduped);
    cr_assert_eq(metric(body, "dquant_chunks_put_total"), (double)(f0.stored + f7.stored));
    cr_assert_eq(metric(body, "dquant_leases_active"), 0, "every lease was released");
}
