/* libdquant-client-nccl where no GPU is needed: what dqc_nccl_setup says to a daemon that does not
 * offer NCCL (the CPU backend), what the *_dev calls say without a communicator, their argument
 * checks, and that none of it disturbs the socket calls. Built against the real library where NCCL
 * is found, against the emulation of CUDA and NCCL (tests/daemon/fakecuda) everywhere else. The
 * GPU-to-GPU path itself is exercised by tests/nccl/nccl_gpu.sh on a two-GPU host. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "dquant/client.h"
#include "dquant/client_nccl.h"
#include "dqd_child.h"

static dqd_daemon D;
static dqc_client *C;

static void stop_all(void)
{
    dqc_free(C);
    C = NULL;
    if (D.pid)
        dqd_stop(&D);
}

static void start_all(void)
{
    const char *bin = dqd_path();
    if (!bin)
        cr_skip_test("$DQUANTD is not set (build the dquantd target to run this test)");
    const char *extra[] = {"--backend", "cpu", NULL};
    const dqd_opts dopts = {.extra = extra};
    cr_assert_eq(dqd_start(&D, &dopts), 0, "could not start %s", bin);
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = 10000;
    char err[256];
    int rc = dqc_connect_ex(D.addr, &o, &C, err, sizeof err);
    cr_assert_eq(rc, 0, "connect %s: %s: %s", D.addr, dqc_err_name(rc), err);
}

TestSuite(nccl_client, .init = start_all, .fini = stop_all, .timeout = 60);

static const uint16_t ZEROS[64];
static const char KEY[] = "nccl-seq";

static dqc_put_args put_args(void)
{
    dqc_put_args a = {
        .seq = {.ns = "t", .key = KEY, .key_len = sizeof KEY - 1},
        .model = "m",
        .num_layers = 1,
        .tokens = 1,
        .kv_heads = 1,
        .head_dim = 32,
        .dtype = DQ_DTYPE_BF16,
        .k = ZEROS,
        .v = ZEROS,
    };
    return a;
}

/* The socket path still answers after whatever the NCCL calls did. */
static void socket_still_works(void)
{
    cr_assert_eq(dqc_ping(C, "abc", 3), 0, "ping after the NCCL calls: %s", dqc_last_error(C));
    cr_assert_eq(dqc_reconnect_count(C), 0, "the NCCL calls must not cost the connection");
}

Test(nccl_client, setup_refused_by_a_daemon_without_nccl)
{
    dqc_server_info info;
    cr_assert_eq(dqc_server(C, &info), 0);
    for (size_t i = 0; i < info.nfeatures; i++)
        cr_assert_str_neq(info.features[i], "nccl", "the CPU backend must not offer nccl");

    int rc = dqc_nccl_setup(C, 0);
    cr_assert_eq(rc, DQ_UNSUPPORTED, "nccl_setup: %s (%s)", dqc_err_name(rc), dqc_last_error(C));
    const char *why = "does not offer NCCL";
    cr_assert(strstr(dqc_last_error(C), why), "message \"%s\" should say \"%s\"", dqc_last_error(C), why);
    cr_assert(strstr(dqc_last_error(C), "cpu"), "message \"%s\" should name the backend", dqc_last_error(C));
    /* Refused before asking: nothing about the handle changed. */
    socket_still_works();
}

Test(nccl_client, dev_calls_without_setup)
{
    int expect = DQ_IO;
    const char *why = "NCCL not set up";
    char buf[64];

    dqc_put_args pa = put_args();
    dqc_put_result pr = {.tokens = 99};
    int rc = dqc_put_dev(C, &pa, &pr);
    cr_assert_eq(rc, expect, "put_dev: %s (%s)", dqc_err_name(rc), dqc_last_error(C));
    cr_assert(strstr(dqc_last_error(C), why), "put_dev message \"%s\"", dqc_last_error(C));
    cr_assert_eq(pr.tokens, 0, "a failed put_dev leaves its result empty");

    dqc_get_args ga = {.seq = pa.seq, .dtype = DQ_DTYPE_BF16};
    dqc_get_result gr = {0};
    rc = dqc_get_dev(C, &ga, buf, buf + 32, 32, &gr);
    cr_assert_eq(rc, expect, "get_dev: %s (%s)", dqc_err_name(rc), dqc_last_error(C));
    cr_assert(strstr(dqc_last_error(C), why), "get_dev message \"%s\"", dqc_last_error(C));
    cr_assert_null(gr.k);

    dqc_attend_item it = {.seq = pa.seq, .layer = 0, .q = ZEROS};
    dqc_attend_args aa = {.items = &it, .nitems = 1, .q_heads = 1, .head_dim = 32, .dtype = DQ_DTYPE_BF16};
    float out[32], lse[1];
    rc = dqc_attend_dev(C, &aa, out, lse);
    cr_assert_eq(rc, expect, "attend_dev: %s (%s)", dqc_err_name(rc), dqc_last_error(C));
    cr_assert(strstr(dqc_last_error(C), why), "attend_dev message \"%s\"", dqc_last_error(C));

    /* A refused setup leaves the calls refused the same way. */
    cr_assert_eq(dqc_nccl_setup(C, 0), DQ_UNSUPPORTED);
    rc = dqc_put_dev(C, &pa, NULL);
    cr_assert_eq(rc, expect, "put_dev after a refused setup: %s (%s)", dqc_err_name(rc), dqc_last_error(C));

    /* Nothing was stored: the sequence does not exist on the daemon. */
    dqc_get_result g2 = {0};
    rc = dqc_get(C, &ga, &g2);
    cr_assert_eq(rc, DQ_NOT_FOUND, "get: %s (%s)", dqc_err_name(rc), dqc_last_error(C));
    dqc_get_result_free(&g2);
    socket_still_works();
}

Test(nccl_client, argument_checks)
{
    char buf[64];
    dqc_put_args pa = put_args();
    dqc_get_args ga = {.seq = pa.seq, .dtype = DQ_DTYPE_BF16};
    dqc_get_result gr = {0};
    dqc_attend_item it = {.seq = pa.seq, .q = ZEROS};
    dqc_attend_args aa = {.items = &it, .nitems = 1, .q_heads = 1, .head_dim = 32, .dtype = DQ_DTYPE_BF16};
    float out[32], lse[1];

    /* No handle: no message to leave, just the code. */
    cr_assert_eq(dqc_nccl_setup(NULL, 0), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_put_dev(NULL, &pa, NULL), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_get_dev(NULL, &ga, buf, buf, 8, &gr), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dqc_attend_dev(NULL, &aa, out, lse), DQ_INVALID_ARGUMENT);

    /* Each bad call is refused with its own message, before the missing communicator is noticed. */
#define EXPECT_ARG(call, text)                                                                              \
    do {                                                                                                    \
        int rc_ = (call);                                                                                   \
        cr_expect_eq(rc_, DQ_INVALID_ARGUMENT, "%s: %s (%s)", #call, dqc_err_name(rc_), dqc_last_error(C)); \
        cr_expect(strstr(dqc_last_error(C), (text)), "%s: message \"%s\" should contain \"%s\"", #call,     \
                  dqc_last_error(C), (text));                                                               \
    } while (0)
    EXPECT_ARG(dqc_nccl_setup(C, -1), "nccl_setup: CUDA device -1");
    EXPECT_ARG(dqc_put_dev(C, NULL, NULL), "put_dev: args is NULL");
    dqc_put_args p1 = pa;
    p1.model = NULL;
    EXPECT_ARG(dqc_put_dev(C, &p1, NULL), "put_dev: model name required");
    dqc_put_args p2 = pa;
    p2.v = NULL;
    EXPECT_ARG(dqc_put_dev(C, &p2, NULL), "put_dev: k and v are required");
    dqc_put_args p3 = pa;
    p3.tokens = 0;
    EXPECT_ARG(dqc_put_dev(C, &p3, NULL), "must be positive");
    EXPECT_ARG(dqc_get_dev(C, NULL, buf, buf, 8, &gr), "get_dev: args, k_dev, v_dev and res are required");
    EXPECT_ARG(dqc_get_dev(C, &ga, NULL, buf, 8, &gr), "get_dev: args, k_dev, v_dev and res are required");
    EXPECT_ARG(dqc_get_dev(C, &ga, buf, buf, 8, NULL), "get_dev: args, k_dev, v_dev and res are required");
    dqc_get_args g1 = ga;
    g1.dtype = (dq_dtype)7;
    EXPECT_ARG(dqc_get_dev(C, &g1, buf, buf, 8, &gr), "get_dev: unsupported dtype 7");
    EXPECT_ARG(dqc_attend_dev(C, &aa, out, NULL), "attend_dev: args, out_dev and lse_dev are required");
    EXPECT_ARG(dqc_attend_dev(C, &aa, NULL, lse), "attend_dev: args, out_dev and lse_dev are required");
    dqc_attend_args a1 = aa;
    a1.nitems = 0;
    EXPECT_ARG(dqc_attend_dev(C, &a1, out, lse), "attend_dev: at least one item is required");
    dqc_attend_item i2 = it;
    i2.append_k = ZEROS;
    dqc_attend_args a2 = aa;
    a2.items = &i2;
    EXPECT_ARG(dqc_attend_dev(C, &a2, out, lse), "attend_dev: item 0: append_k and append_v go together");
#undef EXPECT_ARG
    socket_still_works();
}
