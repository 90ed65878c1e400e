/* Hostile input through dquantd's real protocol (issue 18, items 6-8): extreme finite queries,
 * scales and appended tokens in ATTEND; names with a NUL or invalid UTF-8; the model registry's
 * share per client and UNREGISTER_MODEL. libdquant-client makes the ordinary calls, raw frames
 * (tests/support/wire.h) carry the bytes the client library cannot send. $DQ_INPUT_BACKEND (cuda,
 * for dquantd-fakecuda) is passed as --backend, so the cuda backend's path is checked too. Skipped
 * when $DQUANTD is unset. */
#define _GNU_SOURCE /* memmem */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/client.h"
#include "wire.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define T0 300 /* tokens put: two sealed windows of 128 and a BF16 tail of 44 */

static dqd_daemon D;

static void stop_daemon(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

static const char *backend(void)
{
    const char *b = getenv("DQ_INPUT_BACKEND");
    return b && *b ? b : "cpu";
}

static void start_daemon(const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    static const char *args[24];
    size_t n = 0;
    args[n++] = "--backend";
    args[n++] = backend();
    for (size_t i = 0; extra && extra[i] && n < 23; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    const dqd_opts o = {.extra = args};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
}

TestSuite(input, .fini = stop_daemon, .timeout = 240);

static dqc_client *cli_named(const char *name)
{
    dqc_options o;
    dqc_options_default(&o);
    o.client_name = name;
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(D.addr, &o, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect: %s", err);
    return c;
}

static int register_model(dqc_client *c, const char *name, uint32_t layers, dqc_model_info *info)
{
    dqc_model_spec spec = {
        .name = name, .layers = layers, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    return dqc_register_model(c, &spec, info);
}

/* Normal(0, 1) draws, seeded (Box-Muller on a 64-bit LCG). */
static float *normals(size_t count, uint64_t seed)
{
    float *x = malloc(count * sizeof *x);
    for (size_t i = 0; i < count; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((double)(seed >> 11) + 1.0) / 9007199254740994.0;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = (double)(seed >> 11) / 9007199254740992.0;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
    }
    return x;
}

static dqc_seq seq_of(const char *ns, const char *key)
{
    return (dqc_seq){.ns = ns, .key = key, .key_len = strlen(key)};
}

/* PUT T0 tokens of every layer of model "m" to (ns, key). */
static void put_seq(dqc_client *c, const char *ns, const char *key)
{
    float *k = normals((size_t)L * T0 * ROW, 11), *v = normals((size_t)L * T0 * ROW, 12);
    dqc_put_args a = {.seq = seq_of(ns, key),
                      .model = "m",
                      .num_layers = L,
                      .tokens = T0,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    free(k);
    free(v);
}

static uint64_t tokens_of(dqc_client *c, const char *ns, const char *key, uint32_t layer)
{
    dqc_get_args g = {.seq = seq_of(ns, key), .first_layer = layer, .num_layers = 1, .dtype = DQ_DTYPE_F32};
    dqc_get_result r = {0};
    OK(c, dqc_get(c, &g, &r));
    uint64_t t = r.tokens;
    dqc_get_result_free(&r);
    return t;
}

/* One ATTEND item on layer 1 of (ns "t", key "s"); ak/av may be NULL. */
static int attend(dqc_client *c, const float *q, float scale, const float *ak, const float *av, float *out, float *lse)
{
    dqc_attend_item it = {.seq = seq_of("t", "s"), .layer = 1, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args a = {.items = &it,
                         .nitems = 1,
                         .q_heads = QH,
                         .kv_heads = KVH,
                         .head_dim = HD,
                         .dtype = DQ_DTYPE_F32,
                         .scale = scale};
    return dqc_attend(c, &a, out, lse);
}

static void expect_finite(const float *out, const float *lse)
{
    for (int i = 0; i < QH * HD; i++)
        cr_assert(isfinite(out[i]), "output %d is %g", i, (double)out[i]);
    for (int h = 0; h < QH; h++)
        cr_assert(isfinite(lse[h]), "lse %d is %g", h, (double)lse[h]);
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / (1.0 + fabs((double)b[i])));
    return m;
}

/* On the cuda backend the attended layer must be in (emulated) GPU memory, so that it is the cuda
 * path that is checked. */
static void expect_backend_path(dqc_client *c)
{
    if (strcmp(backend(), "cuda") == 0)
        cr_assert_gt(stat_gauge(c, "gpu_sequences"), 0.0, "the sequence is not on the GPU tier");
}

/* Issue 18.6: q or scale near the float maximum came back as NaN outputs and an infinite LSE with
 * no error. Now: RANGE with a message naming item and head, and exact finite results up to the
 * limit (‖q‖·max(1, scale) <= 2^64, dquant/attention.h). */
Test(input, attend_extreme_queries)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    put_seq(c, "t", "s");
    float *q = normals(QH * HD, 21);
    float out[QH * HD], lse[QH], ref[QH * HD], rlse[QH];
    OK(c, attend(c, q, 0, NULL, NULL, ref, rlse));
    expect_finite(ref, rlse);
    expect_backend_path(c);

    float qb[QH * HD];
    memcpy(qb, q, sizeof qb);
    for (int j = 0; j < HD; j++)
        qb[HD + j] = (j & 1) ? -3e37f : 3e37f;
    FAILS(c, DQ_RANGE, attend(c, qb, 0, NULL, NULL, out, lse));
    cr_assert(strstr(dqc_last_error(c), "item 0: q head 1"), "message: %s", dqc_last_error(c));
    FAILS(c, DQ_RANGE, attend(c, q, 3e38f, NULL, NULL, out, lse));

    /* a huge scale on a tiny query is an ordinary attention: scale·q is what counts */
    float qt[QH * HD];
    for (int i = 0; i < QH * HD; i++)
        qt[i] = q[i] * 1e-30f;
    OK(c, attend(c, qt, 1e30f / sqrtf(HD), NULL, NULL, out, lse));
    expect_finite(out, lse);
    cr_assert_lt(max_rel(out, ref, QH * HD), 1e-3, "scale 1e30 on q 1e-30 differs from the plain attention");
    cr_assert_lt(max_rel(lse, rlse, QH), 1e-3);

    /* just below the limit: every logit finite (about 1e19), the softmax one-hot, LSE finite */
    for (int i = 0; i < QH * HD; i++)
        qb[i] = q[i] > 0 ? 1e18f : -1e18f;
    OK(c, attend(c, qb, 1.0f, NULL, NULL, out, lse));
    expect_finite(out, lse);
    for (int h = 0; h < QH; h++)
        cr_assert_gt(lse[h], 1e18f, "head %d: lse %g", h, (double)lse[h]);
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0);
    free(q);
    dqc_free(c);
}

/* Issue 18.6, appends: a huge finite appended K/V is refused (RANGE; an f32 that rounds to a BF16
 * infinity is NONFINITE) and appends nothing; NaN anywhere in the batch wins over a range error. */
Test(input, attend_extreme_appends)
{
    start_daemon(NULL);
    dqc_client *c = cli_named("input");
    OK(c, register_model(c, "m", L, NULL));
    put_seq(c, "t", "s");
    float *q = normals(QH * HD, 31), *ak = normals(ROW, 32), *av = normals(ROW, 33);
    float out[2 * QH * HD], lse[2 * QH];
    OK(c, attend(c, q, 0, ak, av, out, lse));
    expect_finite(out, lse);
    expect_backend_path(c);
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0 + 1);

    float big[ROW];
    memcpy(big, ak, sizeof big);
    big[5] = 1e30f;
    FAILS(c, DQ_RANGE, attend(c, q, 0, big, av, out, lse));
    FAILS(c, DQ_RANGE, attend(c, q, 0, ak, big, out, lse));
    big[5] = 3.4e38f; /* finite in f32, an infinity once rounded to BF16 */
    FAILS(c, DQ_NONFINITE, attend(c, q, 0, big, av, out, lse));
    cr_assert_eq(tokens_of(c, "t", "s", 1), T0 + 1, "a refused append left a token");

    /* item 0: a query out of range; item 1: a NaN appended value. NONFINITE wins. */
    float qb[QH * HD], nan_v[ROW];
    memcpy(qb, q, sizeof qb);
    qb[3] = 1e38f;
    memcpy(nan_v, av, sizeof nan_v);
    nan_v[7] = NAN;
    dqc_attend_item it[2] = {{.seq = seq_of("t", "s"), .layer = 1, .q = qb},
                             {.seq = seq_of("t", "s"), .layer = 0, .q = q, .append_k = ak, .append_v = nan_v}};
    dqc_attend_args a = {
        .items = it, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    FAILS(c, DQ_NONFINITE, dqc_attend(c, &a, out, lse));
    cr_assert_eq(tokens_of(c, "t", "s", 0), T0);
    free(q);
    free(ak);
    free(av);
    dqc_free(c);
}
