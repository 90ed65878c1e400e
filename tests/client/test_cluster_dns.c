/* dqc_cluster members from DNS, against a dnsmasq started by the test on a loopback port
 * (Debian: dnsmasq-base, installed by scripts/setup.sh; the test skips with a message without
 * it) and dquantd processes ($DQUANTD):
 *  - SRV records (srv:NAME): the members and their addresses; a record added while the client
 *    runs (dnsmasq restarted with the new records) joins at the next refresh and reads keep
 *    working (the keys it takes are found on the next member); a record removed leaves; a DNS
 *    server that stops answering keeps the members;
 *  - A records of a headless-Service-like name (dns:NAME:PORT) from a hosts folder dnsmasq
 *    re-reads by itself (inotify): daemons on 127.0.0.2, .3, then .4 of one port. */
#define _GNU_SOURCE /* pipe2 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dqd_child.h"
#include "dquant/client.h"

#define NODES 4
#define MODEL "m"
#define NS "t"
#define COK(cl, expr)                                                                               \
    do {                                                                                            \
        int rc_ = (expr);                                                                           \
        cr_assert_eq(rc_, 0, "%s -> %s: %s", #expr, dqc_err_name(rc_), dqc_cluster_last_error(cl)); \
    } while (0)

static dqd_daemon D[NODES];
static uint16_t P[NODES];
static pid_t dns_pid;
static uint16_t dns_port;
static char dir[64], conf[128], hostsdir[128];
static int expect_hosts; /* start_dns waits until dnsmasq has read the hosts folder */

static void stop_all(void)
{
    if (dns_pid > 0) {
        kill(dns_pid, SIGTERM);
        waitpid(dns_pid, NULL, 0);
        dns_pid = 0;
    }
    for (int i = 0; i < NODES; i++)
        if (D[i].pid)
            dqd_stop(&D[i]);
}

TestSuite(cluster_dns, .fini = stop_all, .timeout = 120);

static const char *dnsmasq_path(void)
{
    static const char *const paths[] = {"/usr/sbin/dnsmasq", "/usr/bin/dnsmasq", "/sbin/dnsmasq"};
    const char *env = getenv("DNSMASQ");
    if (env && access(env, X_OK) == 0)
        return env;
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The records: SRV targets n<i>.dq.test at 127.0.0.1:P[i] for each i with srv[i] set. */
static void write_conf(const int *srv)
{
    FILE *f = fopen(conf, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "port=%u\nlisten-address=127.0.0.1\nbind-interfaces\nno-resolv\nno-hosts\nlocal=/dq.test/\n"
            "hostsdir=%s\n",
            dns_port, hostsdir);
    for (int i = 0; i < NODES; i++)
        if (srv && srv[i])
            fprintf(f, "srv-host=_dquant._tcp.dq.test,n%d.dq.test,%u\nhost-record=n%d.dq.test,127.0.0.1\n", i, P[i], i);
    fclose(f);
    chmod(conf, 0644);
}

/* Starts dnsmasq on the configuration file (it is read once: a change of SRV records restarts it);
 * waits until it says it started. */
static void start_dns(void)
{
    char log[160], confarg[160];
    snprintf(log, sizeof log, "%s/dnsmasq.log", dir);
    snprintf(confarg, sizeof confarg, "--conf-file=%s", conf);
    const char *argv[] = {dnsmasq_path(), "-k", confarg, "--pid-file=", "--log-facility=-", NULL};
    int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(lf, 0);
    pid_t parent = getpid();
    fflush(NULL);
    dns_pid = fork();
    if (dns_pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
            _exit(127);
        dup2(lf, 1);
        dup2(lf, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(lf);
    char buf[4096];
    for (int t = 0; t < 100; t++) {
        FILE *f = fopen(log, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        if (strstr(buf, "started, version") && strstr(buf, "cleared cache") && (!expect_hosts || strstr(buf, "read ")))
            return;
        int st;
        if (waitpid(dns_pid, &st, WNOHANG) == dns_pid) {
            dns_pid = 0;
            cr_assert_fail("dnsmasq exited:\n%s", buf);
        }
        nap(50);
    }
    cr_assert_fail("dnsmasq did not start:\n%s", buf);
}

static void stop_dns(void)
{
    kill(dns_pid, SIGTERM);
    waitpid(dns_pid, NULL, 0);
    dns_pid = 0;
}

static void setup_dns(void)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    if (!dnsmasq_path())
        cr_skip_test("dnsmasq not found: the DNS discovery tests need it (Debian: apt-get install dnsmasq-base; "
                     "scripts/setup.sh installs it)");
    snprintf(dir, sizeof dir, "%s", dqd_tmpdir());
    chmod(dir, 0755); /* dnsmasq reads the hosts folder after dropping its privileges */
    snprintf(conf, sizeof conf, "%s/dnsmasq.conf", dir);
    snprintf(hostsdir, sizeof hostsdir, "%s/hosts", dir);
    cr_assert_eq(mkdir(hostsdir, 0755), 0);
    dns_port = dqd_free_port();
    cr_assert_neq(dns_port, 0);
}

static void start_node(int i, const char *ip, uint16_t port)
{
    char listen[64];
    snprintf(listen, sizeof listen, "tcp://%s:%u", ip, port);
    const char *extra[] = {"--listen", listen, NULL};
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D[i], &o), 0, "could not start node %d on %s", i, listen);
}

static dqc_cluster *cluster(const char *members)
{
    dqc_cluster_options o;
    dqc_cluster_options_default(&o);
    char server[32];
    snprintf(server, sizeof server, "127.0.0.1:%u", dns_port);
    o.dns_server = server;
    o.dns_refresh_ms = 300;
    dqc_cluster *cl = NULL;
    char err[512];
    int rc = dqc_cluster_create(members, &o, &cl, err, sizeof err);
    cr_assert_eq(rc, 0, "create %s: %s: %s", members, dqc_err_name(rc), err);
    dqc_model_spec spec = {
        .name = MODEL, .layers = 1, .q_heads = 2, .kv_heads = 1, .head_dim = 64, .profile_name = "dq226"};
    COK(cl, dqc_cluster_register_model(cl, &spec, 0, NULL, NULL));
    return cl;
}

static int put(dqc_cluster *cl, int i)
{
    char key[16];
    snprintf(key, sizeof key, "s%d", i);
    float x[64 * 64];
    for (int j = 0; j < 64 * 64; j++)
        x[j] = (float)((i * 31 + j * 7) % 101) / 101.0f - 0.5f;
    dqc_put_args a = {.seq = {NS, key, strlen(key)},
                      .model = MODEL,
                      .num_layers = 1,
                      .tokens = 64,
                      .kv_heads = 1,
                      .head_dim = 64,
                      .dtype = DQ_DTYPE_F32,
                      .k = x,
                      .v = x};
    return dqc_cluster_put(cl, &a, NULL);
}

static int get(dqc_cluster *cl, int i)
{
    char key[16];
    snprintf(key, sizeof key, "s%d", i);
    dqc_get_args a = {.seq = {NS, key, strlen(key)}, .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    int rc = dqc_cluster_get(cl, &a, &r);
    if (rc == 0)
        cr_assert_eq(r.tokens, 64);
    dqc_get_result_free(&r);
    return rc;
}

static int has_member(dqc_cluster *cl, const char *id)
{
    for (size_t i = 0; i < dqc_cluster_size(cl); i++) {
        dqc_cluster_member_info mi;
        dqc_cluster_member(cl, i, &mi);
        if (strcmp(mi.id, id) == 0)
            return 1;
    }
    return 0;
}

Test(cluster_dns, srv_records_and_a_change_while_running)
{
    setup_dns();
    for (int i = 0; i < NODES; i++) {
        P[i] = dqd_free_port();
        start_node(i, "127.0.0.1", P[i]);
    }
    int srv[NODES] = {1, 1, 1, 0};
    write_conf(srv);
    start_dns();
    dqc_cluster *cl = cluster("srv:_dquant._tcp.dq.test.");
    cr_assert_eq(dqc_cluster_size(cl), 3);
    char id[64];
    for (int i = 0; i < 3; i++) {
        snprintf(id, sizeof id, "n%d.dq.test:%u", i, P[i]);
        cr_assert(has_member(cl, id), "member %s missing", id);
    }
    dqc_cluster_member_info mi;
    dqc_cluster_member(cl, 0, &mi);
    cr_assert(strncmp(mi.addr, "tcp://127.0.0.1:", 16) == 0, "connected at the target's address: %s", mi.addr);
    enum { K = 24 };
    for (int i = 0; i < K; i++)
        COK(cl, put(cl, i));

    /* A 4th record while the client runs: it joins at the next refresh; reads keep working. */
    srv[3] = 1;
    stop_dns();
    write_conf(srv);
    start_dns();
    nap(400);
    for (int i = 0; i < K; i++)
        COK(cl, get(cl, i));
    cr_assert_eq(dqc_cluster_size(cl), 4);
    snprintf(id, sizeof id, "n3.dq.test:%u", P[3]);
    cr_assert(has_member(cl, id));
    dqc_cluster_stats st;
    dqc_cluster_get_stats(cl, &st);
    cr_assert_geq(st.dns_refreshes, 2);
    cr_assert_eq(st.member_changes, 4, "3 members, then 1 more");

    /* The DNS server gone: refreshes fail, the members stay. */
    stop_dns();
    nap(400);
    for (int i = 0; i < K; i++)
        COK(cl, get(cl, i));
    dqc_cluster_get_stats(cl, &st);
    cr_assert_geq(st.dns_failures, 1);
    cr_assert_eq(dqc_cluster_size(cl), 4);
    cr_assert_neq(dqc_cluster_refresh(cl), 0);

    /* A record removed: the member leaves. */
    srv[1] = 0;
    write_conf(srv);
    start_dns();
    COK(cl, dqc_cluster_refresh(cl));
    cr_assert_eq(dqc_cluster_size(cl), 3);
    snprintf(id, sizeof id, "n1.dq.test:%u", P[1]);
    cr_assert(!has_member(cl, id));
    for (int i = 0; i < K; i++) {
        int rc = get(cl, i);
        cr_assert(rc == 0 || rc == DQ_NOT_FOUND, "%s", dqc_cluster_last_error(cl)); /* R = 1: n1's are gone */
    }
    /* A name with no record: a clear error. */
    dqc_cluster *none = NULL;
    char err[256];
    dqc_cluster_options o;
    dqc_cluster_options_default(&o);
    char server[32];
    snprintf(server, sizeof server, "127.0.0.1:%u", dns_port);
    o.dns_server = server;
    cr_assert_eq(dqc_cluster_create("srv:_nothing._tcp.dq.test.", &o, &none, err, sizeof err), DQ_NOT_FOUND, "%s", err);
    printf("SRV: 3 members, a 4th record joined while running (%llu DNS refreshes), a removed one left; "
           "%llu refreshes failed while the server was down, members kept\n",
           (unsigned long long)st.dns_refreshes, (unsigned long long)st.dns_failures);
    dqc_cluster_free(cl);
}

Test(cluster_dns, a_records_of_a_headless_service)
{
    setup_dns();
    write_conf(NULL);
    uint16_t port = dqd_free_port();
    char hosts[160];
    snprintf(hosts, sizeof hosts, "%s/dquantd", hostsdir);
    FILE *f = fopen(hosts, "w");
    cr_assert_not_null(f);
    fprintf(f, "127.0.0.2 dquantd.dq.test\n127.0.0.3 dquantd.dq.test\n");
    fclose(f);
    chmod(hosts, 0644);
    start_node(0, "127.0.0.2", port);
    start_node(1, "127.0.0.3", port);
    start_node(2, "127.0.0.4", port);
    expect_hosts = 1;
    start_dns();
    char name[64];
    snprintf(name, sizeof name, "dns:dquantd.dq.test.:%u", port);
    dqc_cluster *cl = cluster(name);
    cr_assert_eq(dqc_cluster_size(cl), 2);
    char id[64];
    snprintf(id, sizeof id, "127.0.0.3:%u", port);
    cr_assert(has_member(cl, id));
    for (int i = 0; i < 16; i++)
        COK(cl, put(cl, i));
    /* A pod joins: the hosts file changes, dnsmasq re-reads it, the client refreshes by itself. */
    f = fopen(hosts, "a");
    cr_assert_not_null(f);
    fprintf(f, "127.0.0.4 dquantd.dq.test\n");
    fclose(f);
    long t0 = (long)time(NULL);
    while (dqc_cluster_size(cl) < 3 && (long)time(NULL) - t0 < 10) {
        nap(100);
        for (int i = 0; i < 16; i++)
            COK(cl, get(cl, i));
    }
    cr_assert_eq(dqc_cluster_size(cl), 3, "the third A record was not picked up");
    for (int i = 16; i < 32; i++)
        COK(cl, put(cl, i));
    for (int i = 0; i < 32; i++)
        COK(cl, get(cl, i));
    printf("A records: 2 members, a 3rd address added to the hosts file joined while running\n");
    dqc_cluster_free(cl);
}
