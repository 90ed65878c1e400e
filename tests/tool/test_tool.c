/* The `dquant` tool ($DQUANT_CLI) against a real dquantd ($DQUANTD, on a private Unix socket and a
 * loopback TCP port): every operator subcommand, the load generator, the manual pages and the
 * exit status of usage errors. Skipped when either is unset. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/error.h"
#include "dquant/kvq.h"

static dqd_daemon D;

static void stop_daemon(void)
{
    if (D.pid)
        cr_expect_eq(dqd_stop(&D), 0, "dquantd must exit 0 on SIGTERM");
}

static void start_daemon(void)
{
    const char *bin = dqd_path();
    if (!bin)
        cr_skip_test("$DQUANTD is not set (build the dquantd target to run this test)");
    const dqd_opts o = {.tcp = 1};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start %s", bin);
}

TestSuite(tool, .fini = stop_daemon, .timeout = 240);

static int run_cli(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* `dquant register --calibration FILE`: a KVQ model with its per-layer calibration (made here by
 * libdquant), refused without it or with a damaged one. */
Test(tool, register_with_a_kvq_calibration)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    start_daemon();
    enum { LAYERS = 2, KVH = 2, HD = 64, TOK = 300 };
    dq_profile p;
    cr_assert_eq(dq_profile_kvq("pq8x4", KVH, HD, &p), 0);
    float *k = malloc(sizeof(float) * LAYERS * TOK * KVH * HD), *v = malloc(sizeof(float) * LAYERS * TOK * KVH * HD);
    for (size_t i = 0; i < (size_t)LAYERS * TOK * KVH * HD; i++) {
        k[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        v[i] = (float)((i * 40503u + 7) % 1000) / 500.0f - 1.0f;
    }
    uint8_t *calib = NULL;
    size_t clen = 0;
    cr_assert_eq(dq_kvq_calibrate(&p, LAYERS, k, v, TOK, 1, &calib, &clen), 0);
    free(k);
    free(v);
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
    cr_assert_eq(dq_profile_serialize(&p, pbytes, sizeof pbytes, &plen), 0);
    char pf[sizeof D.dir + 16], cf[sizeof D.dir + 16], bad[sizeof D.dir + 16];
    snprintf(pf, sizeof pf, "%s/kvq.prof", D.dir);
    snprintf(cf, sizeof cf, "%s/kvq.cal", D.dir);
    snprintf(bad, sizeof bad, "%s/bad.cal", D.dir);
    write_bytes(pf, pbytes, plen);
    write_bytes(cf, calib, clen);
    write_bytes(bad, calib, clen - 3);
    const int bad_rc = dq_kvq_calibration_check(&p, calib, clen - 3, NULL);
    cr_assert_lt(bad_rc, 0);
    dq_kvq_free(calib);

    char cmd[2048], out[4096];
    const char *reg = "%s register --connect %s --model kvq --layers 2 --q-heads 4 --kv-heads 2 --head-dim 64 "
                      "--profile-file %s %s %s 2>&1";
    snprintf(cmd, sizeof cmd, reg, tool, D.addr, pf, "", "");
    cr_assert_eq(run_cli(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "PROFILE") && strstr(out, "calibration"), "%s", out);
    snprintf(cmd, sizeof cmd, reg, tool, D.addr, pf, "--calibration", bad);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, dq_err_name(bad_rc)), "%s", out);
    snprintf(cmd, sizeof cmd, reg, tool, D.addr, pf, "--calibration", "/nonexistent/kvq.cal");
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    snprintf(cmd, sizeof cmd, reg, tool, D.addr, pf, "--calibration", cf);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "model kvq: registered"), "%s", out);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "model kvq: already registered"), "%s", out);
}

Test(tool, subcommands_against_a_daemon)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    start_daemon();
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "%s ping --connect %s --count 3 --size 1K 2>&1", tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "3 sent, 3 ok") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd,
             "%s register --connect %s --model cli --layers 2 --q-heads 4 --kv-heads 2 --head-dim 64 2>&1", tool,
             D.tcp_addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "registered") != NULL, "%s", out);

    /* lookup: the keys of a 600-token prompt's 2 full chunks (256 each), none held yet */
    char tf[sizeof D.dir + 16];
    snprintf(tf, sizeof tf, "%s/prompt.txt", D.dir);
    FILE *tok = fopen(tf, "w");
    cr_assert_not_null(tok);
    for (int i = 0; i < 600; i++)
        fprintf(tok, "%d%c", i * 7 % 32000, i % 16 == 15 ? '\n' : ' ');
    fclose(tok);
    snprintf(cmd, sizeof cmd, "%s lookup --connect %s --model cli --tokens %s 2>&1", tool, D.addr, tf);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "0 of 2 chunks, 0 tokens\n");
    snprintf(cmd, sizeof cmd, "%s lookup --connect %s --model nope --tokens %s 2>&1", tool, D.addr, tf);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "NOT_FOUND") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd,
             "%s put --connect %s --model cli --key k1 --layers 2 --tokens 300 --kv-heads 2 --head-dim 64 "
             "--random 5 2>&1",
             tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "sequence now 300 tokens") != NULL, "%s", out);

    char kf[sizeof D.dir + 16];
    snprintf(kf, sizeof kf, "%s/k.bin", D.dir);
    snprintf(cmd, sizeof cmd, "%s get --connect %s --key k1 --layer 1 --layers 1 --dtype bf16 --out-k %s 2>&1", tool,
             D.addr, kf);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    FILE *f = fopen(kf, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    cr_assert_eq(ftell(f), 300 * 2 * 64 * 2);
    fclose(f);

    snprintf(cmd, sizeof cmd, "%s get --connect %s --key k1 --raw 2>&1", tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "2 windows") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd,
             "%s attend --connect %s --key k1 --key k1 --layer 0 --q-heads 4 --head-dim 64 --random 3 2>&1", tool,
             D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "item 1") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd, "%s stats --connect %s --gauge sequences 2>&1", tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "1\n");

    /* a model with a sequence stays; once the sequence is deleted it can go */
    char unreg[1024];
    snprintf(unreg, sizeof unreg, "%s unregister --connect %s --client-name ops --model cli 2>&1", tool, D.addr);
    cr_assert_eq(run_cli(unreg, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "BUSY") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd, "%s delete --connect %s --key k1 2>&1", tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 1, "%s", out); /* gone */
    cr_assert(strstr(out, "NOT_FOUND") != NULL, "%s", out);

    cr_assert_eq(run_cli(unreg, out, sizeof out), 0, "%s", out);
    cr_assert_str_eq(out, "model cli: unregistered\n");
    cr_assert_eq(run_cli(unreg, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "NOT_FOUND") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd,
             "%s bench --connect %s -c 2 -n 60 --mix put=30,get=30,attend=30,ping=5,stats=5 --layers 2 "
             "--kv-heads 2 --head-dim 64 --q-heads 4 --tokens 64 --prefill 256 --batch 2 --quiet 2>&1",
             tool, D.addr);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "total") != NULL && strstr(out, "p999") != NULL, "%s", out);

    snprintf(cmd, sizeof cmd, "%s put --help", tool);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "SYNOPSIS") != NULL);
    snprintf(cmd, sizeof cmd, "%s put --tokens nope 2>&1", tool);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    snprintf(cmd, sizeof cmd, "%s frobnicate 2>&1", tool);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
}

/* Sockets process pid has open (listeners and connections). */
static int count_sockets(pid_t pid)
{
    char dir[64], path[320], link[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t len = readlink(path, link, sizeof link - 1);
        if (len > 0) {
            link[len] = 0;
            n += strncmp(link, "socket:", 7) == 0;
        }
    }
    closedir(d);
    return n;
}

/* The daemon is killed under a bench that would run for hours: the bench stops within seconds and
 * exits 1, saying why (libdquant-client stops retrying at once after repeated failed reconnects). */
Test(tool, bench_stops_when_the_daemon_goes)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    start_daemon();
    int err[2];
    cr_assert_eq(pipe(err), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(err[1], 2);
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        execl(tool, tool, "bench", "--connect", D.addr, "-c", "2", "-n", "100000000", "--mix", "ping=1", (char *)NULL);
        _exit(127);
    }
    close(err[1]);
    /* Until its three connections (the registering one and two workers) are up, then a little longer. */
    const int base = count_sockets(D.pid);
    for (int i = 0; i < 200 && count_sockets(D.pid) < base + 3; i++)
        usleep(50000);
    usleep(300000);
    kill(D.pid, SIGKILL);
    waitpid(D.pid, NULL, 0);
    D.pid = 0;
    int st = -1;
    for (int i = 0; i < 200; i++) {
        int s;
        if (waitpid(pid, &s, WNOHANG) == pid) {
            st = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
            break;
        }
        usleep(50000);
    }
    if (st < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    char *text = dqd_read_all(err[0]);
    cr_assert_eq(st, 1, "bench still running 10 s after the daemon died (status %d): %s", st, text);
    cr_assert(strstr(text, "the daemon at") && strstr(text, "is gone"), "%s", text);
    free(text);
    dqd_stop(&D); /* removes its directory */
}

/* `dquant eval --claims` prints every claim row (table and JSON), and the protocol's usage errors
 * exit 2. Needs no daemon; the data cases skip without $DQ_DATA_DIR/tinystories-656k. */
Test(tool, eval_claims_prints_every_row)
{
    const char *tool = getenv("DQUANT_CLI");
    if (!tool || access(tool, X_OK) != 0)
        cr_skip_test("$DQUANT_CLI is not set");
    char cmd[4096], out[65536], path[2048];
    snprintf(cmd, sizeof cmd, "%s eval --ppl 2>&1", tool);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "--ppl needs --dataset"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s eval --claims --ppl --dataset x 2>&1", tool);
    cr_assert_eq(run_cli(cmd, out, sizeof out), 2, "%s", out);
    const char *data = getenv("DQ_DATA_DIR");
    snprintf(path, sizeof path, "%s/tinystories-656k/kv/kv_f16.bin", data ? data : "../shared/data");
    if (access(path, R_OK) != 0)
        cr_skip_test("%s absent (real-model data not available)", path);
    snprintf(cmd, sizeof cmd, "%s eval --claims --dataset tinystories-656k --data %s --claims-chunks 0 2>&1", tool,
             data ? data : "../shared/data");
    cr_assert_eq(run_cli(cmd, out, sizeof out), 0, "%s", out);
    const char *ids[] = {"awq", "delta", "lowrank", "pq", "kmeans", "kv_asym", "bucketize", "huffman"};
    for (int i = 0; i < 8; i++) {
        char row[16], note[32];
        snprintf(row, sizeof row, "| %d | ", i + 1);
        snprintf(note, sizeof note, "%d. (%s) ", i + 1, ids[i]);
        cr_assert(strstr(out, row), "row %d missing:\n%s", i + 1, out);
        cr_assert(strstr(out, note), "note of %s missing:\n%s", ids[i], out);
    }
    cr_assert_null(strstr(out, "| not run |"), "%s", out);
}
