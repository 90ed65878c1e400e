/* End-to-end tests: libdquant-client against a real dquantd ($DQUANTD) started on a temporary Unix
 * socket and an ephemeral loopback TCP port. Results are checked against libdquant run in-process
 * on the same data (GET bit-exact with dq_layer_decode, ATTEND against dq_attend), and the
 * daemon's promises are checked through STATS: eviction order and pinning, all-or-nothing PUTs
 * under memory pressure, no state left behind by clients that vanish mid-frame, lying lengths
 * refused without allocating, authentication. Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dquant/client.h"
#include "dquant/dquant.h"
#include "client_check.h"
#include "dqd_child.h"
#include "frame.h"
#include "wire.h"

static dqd_daemon D;

static void stop_daemon(void)
{
    if (D.pid)
        dqd_stop(&D);
}

static void start_daemon(const char *const *extra)
{
    const char *bin = dqd_path();
    if (!bin)
        cr_skip_test("$DQUANTD is not set (build the dquantd target to run the end-to-end tests)");
    const dqd_opts o = {.tcp = 1, .extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start %s", bin);
}

TestSuite(e2e, .fini = stop_daemon, .timeout = 240);

static dqc_client *cli_opts(const char *addr, const char *secret)
{
    dqc_options o;
    dqc_options_default(&o);
    o.io_timeout_ms = 60000;
    o.reconnect_backoff_ms = 5;
    if (secret) {
        o.secret = secret;
        o.secret_len = strlen(secret);
    }
    dqc_client *c = NULL;
    char err[256];
    int rc = dqc_connect_ex(addr, &o, &c, err, sizeof err);
    cr_assert_eq(rc, 0, "connect %s: %s: %s", addr, dqc_err_name(rc), err);
    return c;
}

static dqc_client *cli(const char *addr)
{
    return cli_opts(addr, NULL);
}

/* ---- data ---- */

typedef struct rng {
    uint64_t s;
} rng;

static double uniform(rng *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(r->s >> 11) + 0.5) / 9007199254740992.0;
}

static float normal(rng *r)
{
    return (float)(sqrt(-2.0 * log(uniform(r))) * cos(6.283185307179586 * uniform(r)));
}

/* count values of dtype: N(0,1) scaled per channel (keys get outlier channels, like real K). */
static void *random_tensor(dq_dtype dt, size_t count, uint64_t seed, int keys)
{
    rng r = {seed * 2654435761u + 17};
    float *f = malloc(count * sizeof *f);
    for (size_t i = 0; i < count; i++)
        f[i] = normal(&r) * (keys && i % 64 == 3 ? 8.0f : 1.0f) + (keys ? 0.5f : 0.0f);
    if (dt == DQ_DTYPE_F32)
        return f;
    void *o = malloc(count * 2);
    cr_assert_eq(dq_convert(f, DQ_DTYPE_F32, o, dt, count), 0);
    free(f);
    return o;
}

static size_t dsize(dq_dtype d)
{
    return d == DQ_DTYPE_F32 ? 4 : 2;
}

/* The test model: n = 2 x 64 keeps containers small and encoding fast. */
#define L 2
#define QH 4
#define KVH 2
#define HD 64
#define NV (KVH * HD)

static void register_small(dqc_client *c, const char *name, uint32_t layers, dqc_model_info *info)
{
    dqc_model_spec spec = {
        .name = name, .layers = layers, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    OK(c, dqc_register_model(c, &spec, info));
}

static dqc_seq seq(const char *ns, const char *key)
{
    return (dqc_seq){.ns = ns, .key = key, .key_len = strlen(key)};
}

static int put_chunk(dqc_client *c, dqc_seq s, const char *model, uint64_t start, uint32_t first_layer, uint32_t layers,
                     uint64_t tokens, dq_dtype dt, const void *k, const void *v)
{
    dqc_put_args a = {.seq = s,
                      .model = model,
                      .start_token = start,
                      .first_layer = first_layer,
                      .num_layers = layers,
                      .tokens = tokens,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = dt,
                      .k = k,
                      .v = v};
    return dqc_put(c, &a, NULL);
}

/* The store-describing part of STATS, for before/after comparisons. */
typedef struct store_view {
    double sequences, pinned, tokens_stored, stored_bytes, used;
    uint64_t tokens_put, evictions;
} store_view;

static store_view view(dqc_client *c)
{
    dqc_stats_result s = {0};
    OK(c, dqc_stats(c, &s));
    store_view v = {0};
    cr_assert_eq(dqc_stats_gauge(&s, "sequences", &v.sequences), 0);
    cr_assert_eq(dqc_stats_gauge(&s, "sequences_pinned", &v.pinned), 0);
    cr_assert_eq(dqc_stats_gauge(&s, "tokens_stored", &v.tokens_stored), 0);
    cr_assert_eq(dqc_stats_gauge(&s, "stored_bytes", &v.stored_bytes), 0);
    cr_assert_eq(dqc_stats_gauge(&s, "host_memory_used", &v.used), 0);
    cr_assert_eq(dqc_stats_counter(&s, "tokens_put", &v.tokens_put), 0);
    cr_assert_eq(dqc_stats_counter(&s, "evictions", &v.evictions), 0);
    dqc_stats_result_free(&s);
    return v;
}

static void assert_same_store(store_view a, store_view b, const char *when)
{
    cr_assert_eq(a.sequences, b.sequences, "%s: sequences %g -> %g", when, a.sequences, b.sequences);
    cr_assert_eq(a.pinned, b.pinned, "%s: pinned %g -> %g", when, a.pinned, b.pinned);
    cr_assert_eq(a.tokens_stored, b.tokens_stored, "%s: tokens %g -> %g", when, a.tokens_stored, b.tokens_stored);
    cr_assert_eq(a.stored_bytes, b.stored_bytes, "%s: stored bytes %g -> %g", when, a.stored_bytes, b.stored_bytes);
    cr_assert_eq(a.used, b.used, "%s: host memory %g -> %g", when, a.used, b.used);
    cr_assert_eq(a.tokens_put, b.tokens_put, "%s: tokens_put %llu -> %llu", when, (unsigned long long)a.tokens_put,
                 (unsigned long long)b.tokens_put);
    cr_assert_eq(a.evictions, b.evictions, "%s: evictions", when);
}

/* ================= round trips of every operation, over both transports ================= */

ParameterizedTestParameters(e2e, every_operation_round_trips)
{
    static int transports[] = {0, 1}; /* unix, tcp */
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *tcp, e2e, every_operation_round_trips)
{
    start_daemon(NULL);
    dqc_client *c = cli(*tcp ? D.tcp_addr : D.addr);

    dqc_server_info in;
    OK(c, dqc_server(c, &in));
    cr_assert_eq(in.version, 1);
    cr_assert_gt(in.max_payload_bytes, 0);
    cr_assert_gt(in.max_batch_items, 0);
    cr_assert_gt(in.nprofiles, 0);

    uint8_t blob[1000];
    for (size_t i = 0; i < sizeof blob; i++)
        blob[i] = (uint8_t)(i * 31);
    OK(c, dqc_ping(c, blob, sizeof blob));
    OK(c, dqc_ping(c, NULL, 0));

    /* REGISTER_MODEL: new, identical again, different spec. */
    dqc_model_info mi;
    register_small(c, "m", L, &mi);
    cr_assert_eq(mi.existed, 0);
    cr_assert_gt(mi.profile_len, 0);
    cr_assert(mi.bits_per_value > 1.5 && mi.bits_per_value < 4.0, "bits/value %g", mi.bits_per_value);
    dq_profile prof;
    cr_assert_eq(dq_profile_deserialize(mi.profile, mi.profile_len, &prof), 0);
    cr_assert_eq(prof.kv_heads, KVH);
    cr_assert_eq(prof.head_dim, HD);
    dqc_model_info mi2;
    register_small(c, "m", L, &mi2);
    cr_assert_eq(mi2.existed, 1);
    cr_assert_eq(mi2.profile_len, mi.profile_len);
    cr_assert_arr_eq(mi2.profile, mi.profile, mi.profile_len);
    dqc_model_spec other = {
        .name = "m", .layers = L + 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    FAILS(c, DQ_EXISTS, dqc_register_model(c, &other, NULL));
    /* A serialized profile works too. */
    dqc_model_spec byprof = {.name = "m-prof",
                             .layers = 1,
                             .q_heads = QH,
                             .kv_heads = KVH,
                             .head_dim = HD,
                             .profile = mi.profile,
                             .profile_len = mi.profile_len};
    OK(c, dqc_register_model(c, &byprof, NULL));

    /* PUT 200 tokens into 2 layers: one sealed window (W = R = 128) and a 72-token tail each. */
    const size_t T = 200, cnt = (size_t)L * T * NV;
    float *k = random_tensor(DQ_DTYPE_F32, cnt, 1, 1), *v = random_tensor(DQ_DTYPE_F32, cnt, 2, 0);
    dqc_put_args pa = {.seq = seq("ns1", "seq-a"),
                       .model = "m",
                       .start_token = 0,
                       .first_layer = 0,
                       .num_layers = L,
                       .tokens = T,
                       .kv_heads = KVH,
                       .head_dim = HD,
                       .dtype = DQ_DTYPE_F32,
                       .k = k,
                       .v = v};
    dqc_put_result pr;
    OK(c, dqc_put(c, &pa, &pr));
    cr_assert_eq(pr.tokens, T);
    cr_assert_gt(pr.stored_bytes, 0);
    cr_assert_eq(pr.streams_encoded, (uint64_t)L * 2 * 128, "streams %llu", (unsigned long long)pr.streams_encoded);
    FAILS(c, DQ_ORDER, dqc_put(c, &pa, NULL)); /* start_token 0 again */
    pa.model = "no-such-model";
    pa.start_token = T;
    cr_assert_neq(dqc_put(c, &pa, NULL), 0);
    pa.model = "m";

    /* GET f32: shape, and the reconstruction is close (tail tokens to BF16 precision). */
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = seq("ns1", "seq-a"), .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, T);
    cr_assert_eq(g.start_token, 0);
    cr_assert_eq(g.num_layers, L);
    cr_assert_eq(g.kv_heads, KVH);
    cr_assert_eq(g.head_dim, HD);
    cr_assert_eq(g.bytes, cnt * 4);
    double err = 0, ref = 0, tail_err = 0;
    for (size_t i = 0; i < cnt; i++) {
        float x;
        memcpy(&x, (const uint8_t *)g.v + 4 * i, 4);
        size_t t = (i / NV) % T;
        err += (x - v[i]) * (x - v[i]);
        ref += v[i] * v[i];
        if (t >= 128)
            tail_err = fmax(tail_err, fabs(x - v[i]) / (fabs(v[i]) + 1e-3));
    }
    cr_assert_lt(sqrt(err / ref), 0.35, "relative RMSE of V %g", sqrt(err / ref));
    cr_assert_leq(tail_err, 1.0 / 128, "tail error %g", tail_err);
    /* Other dtypes and a sub-range. */
    ga.dtype = DQ_DTYPE_BF16;
    ga.first_layer = 1;
    ga.num_layers = 1;
    ga.start_token = 50;
    ga.tokens = 100;
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, 100);
    cr_assert_eq(g.start_token, 50);
    cr_assert_eq(g.num_layers, 1);
    cr_assert_eq(g.bytes, 100 * NV * 2);
    ga.dtype = DQ_DTYPE_F16;
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.bytes, 100 * NV * 2);
    ga.start_token = 150;
    ga.tokens = 100; /* past the end */
    cr_assert_neq(dqc_get(c, &ga, &g), 0);
    cr_assert_null(g.k);
    dqc_get_result_free(&g);

    /* GET_RAW. */
    dqc_raw_result raw = {0};
    dqc_seq sa = seq("ns1", "seq-a");
    OK(c, dqc_get_raw(c, &sa, 0, 0, &raw));
    cr_assert_eq(raw.nlayers, L);
    cr_assert_eq(raw.profile_len, mi.profile_len);
    for (size_t i = 0; i < raw.nlayers; i++) {
        cr_assert_eq(raw.layers[i].layer, i);
        cr_assert_eq(raw.layers[i].tokens, T);
        cr_assert_eq(raw.layers[i].windows, 1);
        cr_assert_eq(raw.layers[i].tail_tokens, T - 128);
        cr_assert_eq(raw.layers[i].tail_bytes, (T - 128) * NV * 2);
        cr_assert_gt(raw.layers[i].records_bytes, 0);
    }
    dqc_raw_result_free(&raw);

    /* ATTEND: two items, both layers. */
    float *q = random_tensor(DQ_DTYPE_F32, 2 * QH * HD, 3, 0);
    dqc_attend_item items[2] = {{.seq = sa, .layer = 0, .q = q}, {.seq = sa, .layer = 1, .q = q + QH * HD}};
    dqc_attend_args aa = {
        .items = items, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    float out[2 * QH * HD], lse[2 * QH];
    OK(c, dqc_attend(c, &aa, out, lse));
    for (size_t i = 0; i < 2 * QH * HD; i++)
        cr_assert(isfinite(out[i]));
    for (size_t i = 0; i < 2 * QH; i++)
        cr_assert(isfinite(lse[i]) && lse[i] > 0);

    /* COMPRESS / DECOMPRESS (keys, 130 tokens: two mean blocks). */
    float *x = random_tensor(DQ_DTYPE_F32, 130 * NV, 4, 1);
    dqc_compress_args ca = {.profile_name = "dq226",
                            .kv_heads = KVH,
                            .head_dim = HD,
                            .kind = 0,
                            .dtype = DQ_DTYPE_F32,
                            .x = x,
                            .tokens = 130};
    dqc_compress_result cr = {0};
    OK(c, dqc_compress(c, &ca, &cr));
    cr_assert_eq(cr.tokens, 130);
    cr_assert_eq(cr.profile_len, mi.profile_len);
    cr_assert_eq(cr.records_bytes % 130, 0);
    cr_assert_eq(cr.means_bytes, 2 * (2 + NV));
    dqc_decompress_args da = {.profile = cr.profile,
                              .profile_len = cr.profile_len,
                              .kind = 0,
                              .tokens = 130,
                              .means = cr.means,
                              .means_bytes = cr.means_bytes,
                              .records = cr.records,
                              .records_bytes = cr.records_bytes,
                              .out_dtype = DQ_DTYPE_F32};
    dqc_decompress_result dr = {0};
    OK(c, dqc_decompress(c, &da, &dr));
    cr_assert_eq(dr.shape[0], 130);
    cr_assert_eq(dr.shape[1], KVH);
    cr_assert_eq(dr.shape[2], HD);
    cr_assert_eq(dr.bytes, 130 * NV * 4);
    err = ref = 0;
    for (size_t i = 0; i < 130 * NV; i++) {
        float y;
        memcpy(&y, (const uint8_t *)dr.x + 4 * i, 4);
        err += (y - x[i]) * (y - x[i]);
        ref += (x[i] - 0.5) * (x[i] - 0.5);
    }
    cr_assert_lt(sqrt(err / ref), 0.35, "relative RMSE of decompressed keys %g", sqrt(err / ref));
    /* By model name, values. */
    ca.model = "m";
    ca.profile_name = NULL;
    ca.kind = 1;
    OK(c, dqc_compress(c, &ca, &cr));
    cr_assert_null(cr.means);
    dqc_compress_result_free(&cr);
    dqc_decompress_result_free(&dr);

    /* Namespaces: the same key in two namespaces is two sequences. */
    OK(c, put_chunk(c, seq("ns2", "seq-a"), "m", 0, 0, 1, 10, DQ_DTYPE_F32, k, v));
    dqc_get_args g1 = {.seq = seq("ns2", "seq-a"), .num_layers = 1, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &g1, &g));
    cr_assert_eq(g.tokens, 10);
    g1.seq = seq("ns1", "seq-a");
    OK(c, dqc_get(c, &g1, &g));
    cr_assert_eq(g.tokens, T);
    dqc_get_result_free(&g);

    /* PIN / UNPIN / DELETE. */
    OK(c, dqc_pin(c, &sa));
    cr_assert_eq(stat_gauge(c, "sequences_pinned"), 1);
    OK(c, dqc_unpin(c, &sa));
    cr_assert_eq(stat_gauge(c, "sequences_pinned"), 0);
    cr_assert_eq(stat_gauge(c, "sequences"), 2);
    OK(c, dqc_delete(c, &sa));
    FAILS(c, DQ_NOT_FOUND, dqc_delete(c, &sa));
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &g1, &g));
    dqc_seq missing = seq("ns1", "never");
    FAILS(c, DQ_NOT_FOUND, dqc_pin(c, &missing));
    cr_assert_eq(stat_gauge(c, "sequences"), 1);

    /* STATS. */
    cr_assert_geq(stat_counter(c, "connections_total"), 1);
    cr_assert_eq(stat_gauge(c, "connections_open"), 1);
    cr_assert_geq(stat_counter(c, "tokens_put"), (uint64_t)L * T + 10);

    dqc_free(c);
    free(k);
    free(v);
    free(q);
    free(x);
    cr_assert_eq(dqd_stop(&D), 0, "dquantd must exit 0 on SIGTERM");
}

/* ================= GET is bit-exact with libdquant on the same data ================= */

/* Builds the sequence in the daemon and the same layers in-process, chunk by chunk. */
typedef struct twin {
    dq_codec *codec;
    dq_workspace *ws;
    dq_layer *layers[L];
    size_t tokens;
} twin;

static void twin_build(dqc_client *c, twin *tw, dqc_seq s, const char *model, dq_dtype dt, const size_t *chunks,
                       size_t nchunks, uint64_t seed)
{
    dqc_model_info mi;
    register_small(c, model, L, &mi);
    dq_profile prof;
    cr_assert_eq(dq_profile_deserialize(mi.profile, mi.profile_len, &prof), 0);
    cr_assert_eq(dq_codec_create(&prof, NULL, &tw->codec), 0);
    cr_assert_eq(dq_workspace_create(tw->codec, &tw->ws), 0);
    for (int l = 0; l < L; l++)
        cr_assert_eq(dq_layer_create(tw->codec, &tw->layers[l]), 0);
    tw->tokens = 0;
    for (size_t i = 0; i < nchunks; i++) {
        size_t T = chunks[i], per = T * NV;
        uint8_t *k = random_tensor(dt, (size_t)L * per, seed + 2 * i, 1);
        uint8_t *v = random_tensor(dt, (size_t)L * per, seed + 2 * i + 1, 0);
        OK(c, put_chunk(c, s, model, tw->tokens, 0, L, T, dt, k, v));
        for (int l = 0; l < L; l++)
            cr_assert_eq(dq_layer_append(tw->layers[l], tw->ws, k + (size_t)l * per * dsize(dt),
                                         v + (size_t)l * per * dsize(dt), dt, T, NULL),
                         0);
        tw->tokens += T;
        free(k);
        free(v);
    }
}

static void twin_free(twin *tw)
{
    for (int l = 0; l < L; l++)
        dq_layer_free(tw->layers[l]);
    dq_workspace_free(tw->ws);
    dq_codec_free(tw->codec);
}

ParameterizedTestParameters(e2e, get_is_bit_exact_with_libdquant)
{
    static dq_dtype dts[] = {DQ_DTYPE_F32, DQ_DTYPE_F16, DQ_DTYPE_BF16};
    return cr_make_param_array(dq_dtype, dts, 3);
}

ParameterizedTest(dq_dtype *in_dt, e2e, get_is_bit_exact_with_libdquant)
{
    start_daemon(NULL);
    dqc_client *c = cli(D.addr);
    const size_t chunks[] = {100, 77, 123, 300, 1};
    twin tw;
    dqc_seq s = seq("", "exact");
    twin_build(c, &tw, s, "m", *in_dt, chunks, 5, 100 + (uint64_t)*in_dt);
    cr_assert_eq(tw.tokens, 601);

    const struct {
        dq_dtype dt;
        size_t first, count;
    } reads[] = {{DQ_DTYPE_F32, 0, 601}, {DQ_DTYPE_BF16, 37, 400}, {DQ_DTYPE_F16, 128, 256}, {DQ_DTYPE_F32, 600, 1}};
    dqc_get_result g = {0};
    for (size_t r = 0; r < sizeof reads / sizeof reads[0]; r++) {
        dqc_get_args ga = {.seq = s,
                           .first_layer = 0,
                           .num_layers = L,
                           .start_token = reads[r].first,
                           .tokens = reads[r].count,
                           .dtype = reads[r].dt};
        OK(c, dqc_get(c, &ga, &g));
        size_t per = reads[r].count * NV * dsize(reads[r].dt);
        cr_assert_eq(g.bytes, L * per);
        uint8_t *ref = malloc(per);
        for (int l = 0; l < L; l++) {
            for (int kind = 0; kind < 2; kind++) {
                cr_assert_eq(dq_layer_decode(tw.layers[l], tw.ws, (dq_kind)kind, reads[r].first, reads[r].count, ref,
                                             reads[r].dt),
                             0);
                const uint8_t *got = (const uint8_t *)(kind ? g.v : g.k) + (size_t)l * per;
                cr_assert(memcmp(got, ref, per) == 0, "read %zu layer %d %s: GET differs from dq_layer_decode", r, l,
                          kind ? "V" : "K");
            }
        }
        free(ref);
    }
    dqc_get_result_free(&g);

    /* GET_RAW: the very window records and BF16 tail the library holds. */
    dqc_raw_result raw = {0};
    OK(c, dqc_get_raw(c, &s, 0, 0, &raw));
    cr_assert_eq(raw.nlayers, L);
    size_t wb = dq_codec_window_bytes(tw.codec);
    for (int l = 0; l < L; l++) {
        const dqc_raw_layer *rl = &raw.layers[l];
        size_t nw = dq_layer_window_count(tw.layers[l]);
        cr_assert_eq(rl->windows, nw);
        cr_assert_eq(rl->records_bytes, nw * wb);
        for (size_t w = 0; w < nw; w++)
            cr_assert(memcmp(rl->records + w * wb, dq_layer_window(tw.layers[l], w), wb) == 0, "layer %d window %zu", l,
                      w);
        size_t tt = dq_layer_tail_tokens(tw.layers[l]);
        cr_assert_eq(rl->tail_tokens, tt);
        cr_assert(memcmp(rl->tail_k, dq_layer_tail(tw.layers[l], DQ_KIND_K), tt * NV * 2) == 0);
        cr_assert(memcmp(rl->tail_v, dq_layer_tail(tw.layers[l], DQ_KIND_V), tt * NV * 2) == 0);
        /* ... and a layer restored from them decodes identically. */
        dq_layer *back = NULL;
        cr_assert_eq(dq_layer_restore(tw.codec, rl->records, nw, rl->tail_k, rl->tail_v, tt, &back), 0);
        float *a = malloc(601 * NV * 4), *b = malloc(601 * NV * 4);
        cr_assert_eq(dq_layer_decode(back, tw.ws, DQ_KIND_K, 0, 601, a, DQ_DTYPE_F32), 0);
        cr_assert_eq(dq_layer_decode(tw.layers[l], tw.ws, DQ_KIND_K, 0, 601, b, DQ_DTYPE_F32), 0);
        cr_assert(memcmp(a, b, 601 * NV * 4) == 0);
        free(a);
        free(b);
        dq_layer_free(back);
    }
    dqc_raw_result_free(&raw);
    twin_free(&tw);
    dqc_free(c);
}

/* ================= ATTEND matches dq_attend on the same data ================= */

typedef struct attend_case {
    dq_dtype qdt;
    float scale;
} attend_case;

ParameterizedTestParameters(e2e, attend_matches_dq_attend)
{
    static attend_case cases[] = {{DQ_DTYPE_F32, 0.0f}, {DQ_DTYPE_BF16, 0.0f}, {DQ_DTYPE_F32, 0.05f}};
    return cr_make_param_array(attend_case, cases, 3);
}

static void assert_close(const float *got, const float *want, size_t n, const char *what)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        worst = fmax(worst, d);
        cr_assert(isfinite(got[i]), "%s[%zu] not finite", what, i);
    }
    cr_assert_leq(worst, 1e-5, "%s: worst relative difference %g from dq_attend", what, worst);
    cr_log_info("%s: worst relative difference from dq_attend %g", what, worst);
}

ParameterizedTest(attend_case *ac, e2e, attend_matches_dq_attend)
{
    start_daemon(NULL);
    dqc_client *c = cli(D.addr);
    const size_t chunks[] = {300, 301};
    twin tw;
    dqc_seq s = seq("att", "s");
    twin_build(c, &tw, s, "m", DQ_DTYPE_BF16, chunks, 2, 7);

    enum { NI = 3 };
    void *q = random_tensor(ac->qdt, NI * QH * HD, 9, 0);
    float qf[NI * QH * HD];
    cr_assert_eq(dq_convert(q, ac->qdt, qf, DQ_DTYPE_F32, NI * QH * HD), 0);
    const uint32_t layer_of[NI] = {0, 1, 0};
    dqc_attend_item items[NI];
    for (int i = 0; i < NI; i++)
        items[i] = (dqc_attend_item){
            .seq = s, .layer = layer_of[i], .q = (const uint8_t *)q + (size_t)i * QH * HD * dsize(ac->qdt)};
    dqc_attend_args aa = {.items = items,
                          .nitems = NI,
                          .q_heads = QH,
                          .kv_heads = KVH,
                          .head_dim = HD,
                          .dtype = ac->qdt,
                          .scale = ac->scale};
    float out[NI * QH * HD], lse[NI * QH];
    OK(c, dqc_attend(c, &aa, out, lse));

    float rout[NI * QH * HD], rlse[NI * QH];
    dq_attn_item ri[NI];
    for (int i = 0; i < NI; i++)
        ri[i] = (dq_attn_item){
            .layer = tw.layers[layer_of[i]], .q = qf + i * QH * HD, .out = rout + i * QH * HD, .lse = rlse + i * QH};
    float scale = ac->scale > 0 ? ac->scale : 1.0f / sqrtf((float)HD);
    cr_assert_eq(dq_attend(tw.codec, tw.ws, QH, scale, ri, NI), 0);
    assert_close(out, rout, NI * QH * HD, "out");
    assert_close(lse, rlse, NI * QH, "lse");

    /* With an append: the token joins layer 0 first, in the daemon as in-process. */
    void *ak = random_tensor(ac->qdt, NV, 11, 1), *av = random_tensor(ac->qdt, NV, 12, 0);
    dqc_attend_item one = {.seq = s, .layer = 0, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args a1 = {.items = &one,
                          .nitems = 1,
                          .q_heads = QH,
                          .kv_heads = KVH,
                          .head_dim = HD,
                          .dtype = ac->qdt,
                          .scale = ac->scale};
    OK(c, dqc_attend(c, &a1, out, lse));
    cr_assert_eq(dq_layer_append(tw.layers[0], tw.ws, ak, av, ac->qdt, 1, NULL), 0);
    cr_assert_eq(dq_attend(tw.codec, tw.ws, QH, scale, ri, 1), 0);
    assert_close(out, rout, QH * HD, "out after append");
    assert_close(lse, rlse, QH, "lse after append");

    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = s, .first_layer = 0, .num_layers = 1, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, 602);
    ga.first_layer = 1;
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, 601);
    dqc_get_result_free(&g);

    /* Errors inside a batch: a missing sequence fails the request. */
    dqc_attend_item bad[2] = {{.seq = s, .layer = 0, .q = q}, {.seq = seq("att", "missing"), .layer = 0, .q = q}};
    dqc_attend_args ab = {.items = bad, .nitems = 2, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = ac->qdt};
    FAILS(c, DQ_NOT_FOUND, dqc_attend(c, &ab, out, lse));
    free(q);
    free(ak);
    free(av);
    twin_free(&tw);
    dqc_free(c);
}

/* ================= eviction order and pinning ================= */

#define EV_MAX 200

typedef struct lru_model {
    int order[EV_MAX]; /* ids, least recently used first */
    int n;
    int pinned[EV_MAX];
    int gone[EV_MAX];
} lru_model;

static void lru_touch(lru_model *m, int id)
{
    int j = 0;
    for (int i = 0; i < m->n; i++)
        if (m->order[i] != id)
            m->order[j++] = m->order[i];
    m->order[j++] = id;
    m->n = j;
}

static void lru_drop(lru_model *m, int id)
{
    int j = 0;
    for (int i = 0; i < m->n; i++)
        if (m->order[i] != id)
            m->order[j++] = m->order[i];
    m->n = j;
    m->gone[id] = 1;
}

static dqc_seq ev_seq(int id, char *buf)
{
    snprintf(buf, 32, "ev-%03d", id);
    return seq("ev", buf);
}

/* Applies `evicted` evictions to the model (the least recently used unpinned sequences), then
 * checks every sequence against it, touching the survivors in LRU order (which keeps the order). */
static void lru_expect(dqc_client *c, lru_model *m, int evicted, int total_ids)
{
    for (int e = 0; e < evicted; e++) {
        int victim = -1;
        for (int i = 0; i < m->n && victim < 0; i++)
            if (!m->pinned[m->order[i]])
                victim = m->order[i];
        cr_assert_geq(victim, 0, "the daemon evicted a pinned sequence");
        lru_drop(m, victim);
    }
    char buf[32];
    dqc_get_result g = {0};
    for (int id = 0; id < total_ids; id++) {
        if (!m->gone[id])
            continue;
        dqc_get_args ga = {.seq = ev_seq(id, buf), .tokens = 1, .dtype = DQ_DTYPE_BF16};
        FAILS(c, DQ_NOT_FOUND, dqc_get(c, &ga, &g));
    }
    int order[EV_MAX], n = m->n;
    memcpy(order, m->order, sizeof order);
    for (int i = 0; i < n; i++) {
        dqc_get_args ga = {.seq = ev_seq(order[i], buf), .tokens = 1, .dtype = DQ_DTYPE_BF16};
        int rc = dqc_get(c, &ga, &g);
        cr_assert_eq(rc, 0, "sequence %d (LRU position %d of %d) should still be stored: %s", order[i], i, n,
                     dqc_last_error(c));
    }
    dqc_get_result_free(&g);
}

Test(e2e, eviction_is_lru_and_spares_pinned_sequences)
{
    const char *extra[] = {"--host-memory", "3M", "--workers", "1", NULL};
    start_daemon(extra);
    dqc_client *c = cli(D.addr);
    register_small(c, "m1", 1, NULL);
    const size_t T = 256;
    float *k = random_tensor(DQ_DTYPE_F32, T * NV, 21, 1), *v = random_tensor(DQ_DTYPE_F32, T * NV, 22, 0);
    lru_model m = {0};
    char buf[32];
    int next = 0;

    /* Fill until the first eviction. */
    store_view before = view(c);
    for (;;) {
        cr_assert_lt(next, EV_MAX, "no eviction with a 3 MiB budget");
        OK(c, put_chunk(c, ev_seq(next, buf), "m1", 0, 0, 1, T, DQ_DTYPE_F32, k, v));
        lru_touch(&m, next++);
        store_view now = view(c);
        if (now.evictions > before.evictions) {
            lru_expect(c, &m, (int)(now.evictions - before.evictions), next);
            before = now;
            break;
        }
    }
    cr_assert_geq(m.n, 3, "the budget holds only %d sequences", m.n);
    cr_log_info("first eviction after %d sequences (%llu evicted)", next, (unsigned long long)before.evictions);

    /* Reading the oldest makes it the newest: the next eviction takes the one after it. */
    int oldest = m.order[0];
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = ev_seq(oldest, buf), .tokens = 1, .dtype = DQ_DTYPE_BF16};
    OK(c, dqc_get(c, &ga, &g));
    lru_touch(&m, oldest);
    dqc_get_result_free(&g);
    OK(c, put_chunk(c, ev_seq(next, buf), "m1", 0, 0, 1, T, DQ_DTYPE_F32, k, v));
    lru_touch(&m, next++);
    store_view now = view(c);
    cr_assert_gt(now.evictions, before.evictions);
    lru_expect(c, &m, (int)(now.evictions - before.evictions), next);
    cr_assert(!m.gone[oldest]);
    before = now;

    /* A pinned sequence is skipped even when it is the least recently used. */
    int p = m.order[0];
    dqc_seq ps = ev_seq(p, buf);
    OK(c, dqc_pin(c, &ps));
    m.pinned[p] = 1;
    lru_expect(c, &m, 0, next); /* re-establish the order after PIN */
    cr_assert_eq(m.order[0], p);
    OK(c, put_chunk(c, ev_seq(next, buf), "m1", 0, 0, 1, T, DQ_DTYPE_F32, k, v));
    lru_touch(&m, next++);
    now = view(c);
    cr_assert_gt(now.evictions, before.evictions);
    lru_expect(c, &m, (int)(now.evictions - before.evictions), next);
    cr_assert(!m.gone[p], "the pinned sequence was evicted");
    before = now;

    /* Everything pinned: a PUT that needs room fails and changes nothing. */
    for (int i = 0; i < m.n; i++) {
        dqc_seq s = ev_seq(m.order[i], buf);
        OK(c, dqc_pin(c, &s));
        m.pinned[m.order[i]] = 1;
    }
    lru_expect(c, &m, 0, next);
    before = view(c);
    int failed = 0;
    for (int tries = 0; tries < 20 && !failed; tries++) {
        int rc = put_chunk(c, ev_seq(next, buf), "m1", 0, 0, 1, T, DQ_DTYPE_F32, k, v);
        if (rc == DQ_RESOURCE_EXHAUSTED) {
            failed = 1;
            break;
        }
        OK(c, rc); /* there was still room: keep it pinned and go on */
        dqc_seq s = ev_seq(next, buf);
        OK(c, dqc_pin(c, &s));
        m.pinned[next] = 1;
        lru_touch(&m, next++);
        before = view(c);
    }
    cr_assert(failed, "PUTs kept succeeding with every sequence pinned");
    store_view after = view(c);
    assert_same_store(before, after, "failed PUT with everything pinned");
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &(dqc_get_args){.seq = ev_seq(next, buf), .dtype = DQ_DTYPE_BF16}, &g));
    lru_expect(c, &m, 0, next);

    /* Unpinning makes room again. */
    dqc_seq s0 = ev_seq(m.order[0], buf);
    OK(c, dqc_unpin(c, &s0));
    m.pinned[m.order[0]] = 0;
    OK(c, put_chunk(c, ev_seq(next, buf), "m1", 0, 0, 1, T, DQ_DTYPE_F32, k, v));
    dqc_get_result_free(&g);
    free(k);
    free(v);
    dqc_free(c);
}

/* ================= RESOURCE_EXHAUSTED leaves the store unchanged ================= */

Test(e2e, resource_exhausted_leaves_the_store_unchanged)
{
    const char *extra[] = {"--host-memory", "3M", "--workers", "1", NULL};
    start_daemon(extra);
    dqc_client *c = cli(D.addr);
    register_small(c, "m", L, NULL);
    const size_t T = 200, BIG = 30000;
    float *k = random_tensor(DQ_DTYPE_F32, (size_t)L * BIG * NV, 31, 1);
    float *v = random_tensor(DQ_DTYPE_F32, (size_t)L * BIG * NV, 32, 0);
    dqc_seq a = seq("re", "a");
    OK(c, put_chunk(c, a, "m", 0, 0, L, T, DQ_DTYPE_F32, k, v));
    dqc_get_result g0 = {0}, g1 = {0};
    dqc_get_args ga = {.seq = a, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g0));
    store_view before = view(c);

    /* A new sequence larger than the whole budget. */
    FAILS(c, DQ_RESOURCE_EXHAUSTED, put_chunk(c, seq("re", "huge"), "m", 0, 0, L, BIG, DQ_DTYPE_F32, k, v));
    assert_same_store(before, view(c), "huge new sequence");
    /* An append to the existing one that cannot fit either. */
    FAILS(c, DQ_RESOURCE_EXHAUSTED, put_chunk(c, a, "m", T, 0, L, BIG, DQ_DTYPE_F32, k, v));
    assert_same_store(before, view(c), "huge append");
    /* A multi-layer PUT where only the second layer's data is bad: nothing is written. */
    float *bad = malloc((size_t)L * 10 * NV * 4);
    memcpy(bad, k, (size_t)L * 10 * NV * 4);
    bad[10 * NV + 5] = NAN;
    FAILS(c, DQ_NONFINITE, put_chunk(c, a, "m", T, 0, L, 10, DQ_DTYPE_F32, bad, v));
    assert_same_store(before, view(c), "non-finite second layer");
    free(bad);

    /* The sequence is exactly as it was, and still appendable at its old length. */
    OK(c, dqc_get(c, &ga, &g1));
    cr_assert_eq(g1.tokens, T);
    cr_assert(memcmp(g0.k, g1.k, g0.bytes) == 0 && memcmp(g0.v, g1.v, g0.bytes) == 0);
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &(dqc_get_args){.seq = seq("re", "huge"), .dtype = DQ_DTYPE_F32}, &g1));
    OK(c, put_chunk(c, a, "m", T, 0, L, 10, DQ_DTYPE_F32, k, v));
    dqc_get_result_free(&g0);
    dqc_get_result_free(&g1);
    free(k);
    free(v);
    dqc_free(c);
}

/* ================= 1,000 clients vanishing mid-frame ================= */

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint8_t *hello_frame(size_t *len, uint64_t id)
{
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = "vanishing";
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_HELLO;
    req.hello = &h;
    return wire_frame(&req, NULL, 0, id, len);
}

/* *head_len: bytes before the payload (fixed header + message). */
static uint8_t *put_frame(size_t *len, size_t *head_len, const char *key, size_t tokens, const float *k, const float *v)
{
    Dquant__SeqRef sr = DQUANT__SEQ_REF__INIT;
    sr.ns = "vanish";
    sr.key.data = (uint8_t *)key;
    sr.key.len = strlen(key);
    uint64_t shape[4] = {1, tokens, KVH, HD};
    size_t bytes = tokens * NV * 4;
    Dquant__Tensor tk = DQUANT__TENSOR__INIT, tv = DQUANT__TENSOR__INIT;
    tk.dtype = tv.dtype = DQUANT__DTYPE__F32;
    tk.n_shape = tv.n_shape = 4;
    tk.shape = tv.shape = shape;
    tk.length = tv.length = bytes;
    tv.offset = bytes;
    Dquant__Put p = DQUANT__PUT__INIT;
    p.seq = &sr;
    p.model = "m";
    p.num_layers = 1;
    p.tokens = tokens;
    p.k = &tk;
    p.v = &tv;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &p;
    uint8_t *payload = malloc(2 * bytes);
    memcpy(payload, k, bytes);
    memcpy(payload + bytes, v, bytes);
    uint8_t *f = wire_frame(&req, payload, 2 * bytes, 2, len);
    free(payload);
    *head_len = *len - 2 * bytes;
    return f;
}

Test(e2e, a_thousand_clients_vanishing_mid_frame_leave_no_state)
{
    start_daemon(NULL);
    dqc_client *c = cli(D.addr);
    register_small(c, "m", L, NULL);
    float *k = random_tensor(DQ_DTYPE_F32, 300 * NV, 41, 1), *v = random_tensor(DQ_DTYPE_F32, 300 * NV, 42, 0);
    OK(c, put_chunk(c, seq("vanish", "kept"), "m", 0, 0, 1, 300, DQ_DTYPE_F32, k, v));
    store_view before = view(c);
    uint64_t accepted_before = stat_counter(c, "connections_total");

    size_t hlen, plen, phead;
    uint8_t *hello = hello_frame(&hlen, 1);
    uint8_t *put = put_frame(&plen, &phead, "ghost", 300, k, v);
    uint64_t st = 0x1234567;
    enum { CLIENTS = 1000, BATCH = 50 };
    int modes[5] = {0};
    for (int base = 0; base < CLIENTS; base += BATCH) {
        int fds[BATCH];
        for (int i = 0; i < BATCH; i++) {
            int id = base + i;
            fds[i] = id % 2 ? wire_connect_tcp(D.port) : wire_connect_unix(D.sock);
            cr_assert_geq(fds[i], 0, "client %d could not connect", id);
            int mode = (int)(xorshift(&st) % 5);
            modes[mode]++;
            switch (mode) {
            case 0: /* nothing at all */
                break;
            case 1: /* part of the HELLO frame */
                wire_send_all(fds[i], hello, 1 + xorshift(&st) % (hlen - 1));
                break;
            case 2:   /* HELLO, then the PUT cut in its fixed header or message (or right after) */
            case 3:   /* HELLO, then the PUT cut inside its payload */
            case 4: { /* HELLO, then the whole PUT but one byte */
                cr_assert_eq(wire_send_all(fds[i], hello, hlen), 0);
                size_t cut = mode == 2   ? 1 + xorshift(&st) % phead
                             : mode == 3 ? phead + 1 + xorshift(&st) % (plen - phead - 2)
                                         : plen - 1;
                wire_send_all(fds[i], put, cut);
                break;
            }
            }
        }
        for (int i = 0; i < BATCH; i++) {
            if (i % 3 == 0)
                shutdown(fds[i], SHUT_WR); /* some half-close first */
            close(fds[i]);
        }
    }
    free(hello);
    free(put);
    for (int m = 0; m < 5; m++)
        cr_assert_gt(modes[m], 100, "mode %d used only %d times", m, modes[m]);

    /* The daemon notices every close: only this client remains, and the store is as it was. */
    double open = 0;
    for (int i = 0; i < 500; i++) {
        open = stat_gauge(c, "connections_open");
        if (open == 1)
            break;
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(open, 1, "%g connections still open", open);
    cr_assert_geq(stat_counter(c, "connections_total"), accepted_before + CLIENTS);
    assert_same_store(before, view(c), "after 1000 vanishing clients");
    dqc_get_result g = {0};
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &(dqc_get_args){.seq = seq("vanish", "ghost"), .dtype = DQ_DTYPE_F32}, &g));
    /* ... and it still works, on a fresh connection too. */
    OK(c, put_chunk(c, seq("vanish", "kept"), "m", 300, 0, 1, 10, DQ_DTYPE_F32, k, v));
    dqc_client *c2 = cli(D.tcp_addr);
    OK(c2, dqc_ping(c2, "x", 1));
    dqc_free(c2);
    dqc_get_result_free(&g);
    free(k);
    free(v);
    dqc_free(c);
}

/* ================= lying lengths are refused without allocating ================= */

typedef struct lie {
    uint32_t header_len;
    uint64_t payload_len;
} lie;

Test(e2e, lying_lengths_are_refused_without_allocation)
{
    start_daemon(NULL);
    dqc_client *c = cli(D.addr);
    dqc_server_info in;
    OK(c, dqc_server(c, &in));
    uint64_t maxp = in.max_payload_bytes;
    uint64_t max_header = in.max_frame_bytes - 32 - maxp; /* max_frame = 32 + max_header + max_payload */
    const lie lies[] = {
        {0, 0},
        {(uint32_t)max_header + 1, 0},
        {0x7FFFFFFFu, 0},
        {0xFFFFFFFFu, 0},
        {8, maxp + 1},
        {8, 0x7FFFFFFFull > maxp ? 0x7FFFFFFFull : maxp + 2},
        {8, 0xFFFFFFFFull},
        {8, 1ull << 40},
        {8, 0x7FFFFFFFFFFFFFFFull},
        {8, 0xFFFFFFFFFFFFFFFFull},
        {0xFFFFFFFFu, 0xFFFFFFFFFFFFFFFFull},
    };
    uint64_t closes_before = stat_counter(c, "protocol_closes");
    long rss0 = dqd_rss_kb(&D);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
            int fd = wire_connect_unix(D.sock);
            cr_assert_geq(fd, 0);
            cr_assert_eq(wire_hello(fd, 1, NULL), 0);
            uint8_t h[32];
            dq_frame_write_header(h, (const uint8_t *)"\x5a\x00", 2, 0, 77);
            for (int b = 0; b < 4; b++)
                h[8 + b] = (uint8_t)(lies[i].header_len >> (8 * b));
            for (int b = 0; b < 8; b++)
                h[16 + b] = (uint8_t)(lies[i].payload_len >> (8 * b));
            cr_assert_eq(wire_send_all(fd, h, sizeof h), 0);
            /* An error reply may come first; then the daemon must close. */
            Dquant__Response *resp = NULL;
            uint64_t id = 0;
            int rc = wire_recv_within(fd, 5000, &id, &resp, NULL, NULL);
            if (rc == 0) {
                cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR, "lie %zu: not an error reply", i);
                int code = resp->error->code;
                cr_assert(code == DQ_TOO_LARGE || code == DQ_PROTOCOL, "lie %zu: error %d", i, code);
                dquant__response__free_unpacked(resp, NULL);
            }
            cr_assert_eq(wire_wait_eof(fd, 5000), 0, "lie %zu: the connection stays open", i);
            close(fd);
        }
    }
    long rss1 = dqd_rss_kb(&D);
    cr_assert_lt(rss1 - rss0, 32 * 1024, "dquantd grew by %ld KiB answering lying frames", rss1 - rss0);
    cr_assert_geq(stat_counter(c, "protocol_closes"), closes_before + 3 * (sizeof lies / sizeof lies[0]));

    /* Garbage framing: bad magic, version, flags, CRC — closed as well. */
    for (int kind = 0; kind < 4; kind++) {
        int fd = wire_connect_unix(D.sock);
        cr_assert_eq(wire_hello(fd, 1, NULL), 0);
        Dquant__Ping p = DQUANT__PING__INIT;
        Dquant__Request req = DQUANT__REQUEST__INIT;
        req.body_case = DQUANT__REQUEST__BODY_PING;
        req.ping = &p;
        size_t len;
        uint8_t *f = wire_frame(&req, NULL, 0, 2, &len);
        f[kind == 0 ? 0 : kind == 1 ? 4 : kind == 2 ? 6 : 12] ^= 0x40;
        cr_assert_eq(wire_send_all(fd, f, len), 0);
        free(f);
        cr_assert_eq(wire_wait_eof(fd, 5000), 0, "garbage kind %d: the connection stays open", kind);
        close(fd);
    }

    /* Lying tensor lengths inside a well-formed frame: an error reply, and the connection lives. */
    int fd = wire_connect_unix(D.sock);
    cr_assert_eq(wire_hello(fd, 1, NULL), 0);
    register_small(c, "m", L, NULL);
    float kv[2 * NV] = {0};
    Dquant__SeqRef sr = DQUANT__SEQ_REF__INIT;
    sr.key.data = (uint8_t *)"liar";
    sr.key.len = 4;
    uint64_t shape[4] = {1, 1, KVH, HD};
    Dquant__Tensor tk = DQUANT__TENSOR__INIT, tv = DQUANT__TENSOR__INIT;
    tk.dtype = tv.dtype = DQUANT__DTYPE__F32;
    tk.n_shape = tv.n_shape = 4;
    tk.shape = tv.shape = shape;
    tk.length = NV * 4;
    tv.length = NV * 4;
    tv.offset = 0xFFFFFFFFFFFFFF00ull; /* offset + length wraps around */
    Dquant__Put p = DQUANT__PUT__INIT;
    p.seq = &sr;
    p.model = "m";
    p.num_layers = 1;
    p.tokens = 1;
    p.k = &tk;
    p.v = &tv;
    Dquant__Request req = DQUANT__REQUEST__INIT;
    req.body_case = DQUANT__REQUEST__BODY_PUT;
    req.put = &p;
    cr_assert_eq(wire_send_bytes(fd, &req, kv, sizeof kv, 5), 0);
    Dquant__Response *resp = NULL;
    uint64_t id = 0;
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(id, 5);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR);
    cr_assert_eq(resp->error->code, DQ_OUT_OF_BOUNDS, "got %s", resp->error->name);
    dquant__response__free_unpacked(resp, NULL);
    tv.offset = NV * 4;
    tv.length = 0xFFFFFFFFFFFFFFF0ull; /* a length no payload has */
    cr_assert_eq(wire_send_bytes(fd, &req, kv, sizeof kv, 6), 0);
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR);
    dquant__response__free_unpacked(resp, NULL);
    Dquant__Ping ping = DQUANT__PING__INIT;
    Dquant__Request pr = DQUANT__REQUEST__INIT;
    pr.body_case = DQUANT__REQUEST__BODY_PING;
    pr.ping = &ping;
    cr_assert_eq(wire_send_bytes(fd, &pr, NULL, 0, 7), 0);
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_PONG);
    dquant__response__free_unpacked(resp, NULL);
    close(fd);
    cr_assert_eq(stat_gauge(c, "sequences"), 0);
    dqc_free(c);
}

/* ================= protocol details: HELLO first, unknown bodies, pipelining ================= */

Test(e2e, hello_first_unknown_bodies_and_pipelining)
{
    start_daemon(NULL);
    int fd = wire_connect_unix(D.sock);
    cr_assert_geq(fd, 0);
    Dquant__Ping ping = DQUANT__PING__INIT;
    Dquant__Request pr = DQUANT__REQUEST__INIT;
    pr.body_case = DQUANT__REQUEST__BODY_PING;
    pr.ping = &ping;
    Dquant__Response *resp = NULL;
    uint64_t id = 0;

    /* Before HELLO. */
    cr_assert_eq(wire_send_bytes(fd, &pr, NULL, 0, 1), 0);
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(id, 1);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR);
    cr_assert_eq(resp->error->code, DQ_UNAUTHENTICATED);
    cr_assert_str_eq(resp->error->name, "UNAUTHENTICATED");
    dquant__response__free_unpacked(resp, NULL);
    close(fd);

    fd = wire_connect_unix(D.sock);
    cr_assert_eq(wire_hello(fd, 1, NULL), 0);
    /* An unknown body: field 99 (varint 1) and nothing else. */
    const uint8_t unknown[] = {0x98, 0x06, 0x01};
    uint8_t f[32 + sizeof unknown];
    dq_frame_write_header(f, unknown, sizeof unknown, 0, 2);
    memcpy(f + 32, unknown, sizeof unknown);
    cr_assert_eq(wire_send_all(fd, f, sizeof f), 0);
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(id, 2);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR);
    cr_assert_eq(resp->error->code, DQ_UNSUPPORTED, "got %d", resp->error->code);
    dquant__response__free_unpacked(resp, NULL);

    /* Pipelined: five requests in one write, replies in order. */
    uint8_t *all = NULL;
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        char data[8];
        snprintf(data, sizeof data, "p%d", i);
        ping.data.data = (uint8_t *)data;
        ping.data.len = strlen(data);
        Dquant__Stats stq = DQUANT__STATS__INIT;
        Dquant__Request sq = DQUANT__REQUEST__INIT;
        sq.body_case = DQUANT__REQUEST__BODY_STATS;
        sq.stats = &stq;
        size_t len;
        uint8_t *one = wire_frame(i == 3 ? &sq : &pr, NULL, 0, 100 + (uint64_t)i, &len);
        all = realloc(all, total + len);
        memcpy(all + total, one, len);
        total += len;
        free(one);
    }
    cr_assert_eq(wire_send_all(fd, all, total), 0);
    free(all);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
        cr_assert_eq(id, 100 + (uint64_t)i);
        if (i == 3) {
            cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_STATS);
        } else {
            char data[8];
            snprintf(data, sizeof data, "p%d", i);
            cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_PONG);
            cr_assert_eq(resp->pong->data.len, strlen(data));
            cr_assert(memcmp(resp->pong->data.data, data, strlen(data)) == 0);
        }
        dquant__response__free_unpacked(resp, NULL);
    }
    close(fd);

    /* A HELLO offering only an unsupported version range. */
    fd = wire_connect_unix(D.sock);
    Dquant__Hello h = DQUANT__HELLO__INIT;
    h.min_version = 7;
    h.max_version = 9;
    Dquant__Request hr = DQUANT__REQUEST__INIT;
    hr.body_case = DQUANT__REQUEST__BODY_HELLO;
    hr.hello = &h;
    cr_assert_eq(wire_send_bytes(fd, &hr, NULL, 0, 1), 0);
    cr_assert_eq(wire_recv_within(fd, 5000, &id, &resp, NULL, NULL), 0);
    cr_assert_eq(resp->body_case, DQUANT__RESPONSE__BODY_ERROR);
    cr_assert_eq(resp->error->code, DQ_VERSION);
    dquant__response__free_unpacked(resp, NULL);
    close(fd);
}

/* ================= authentication ================= */

Test(e2e, tcp_listeners_require_the_secret)
{
    const char *extra[] = {"--secret", "s3cret-e2e", NULL};
    start_daemon(extra);
    dqc_client *c = NULL;
    char err[256];
    dqc_options o;
    dqc_options_default(&o);
    o.reconnect_attempts = 1;
    FAILS(c, DQ_UNAUTHENTICATED, dqc_connect_ex(D.tcp_addr, &o, &c, err, sizeof err));
    cr_assert_null(c);
    o.secret = "s3cret-e2f";
    o.secret_len = 10;
    FAILS(c, DQ_UNAUTHENTICATED, dqc_connect_ex(D.tcp_addr, &o, &c, err, sizeof err));
    o.secret = "s3cret-e2"; /* a prefix is not the secret */
    o.secret_len = 9;
    FAILS(c, DQ_UNAUTHENTICATED, dqc_connect_ex(D.tcp_addr, &o, &c, err, sizeof err));

    /* Raw: a wrong secret gets an error and a closed connection; requests before HELLO are refused. */
    int fd = wire_connect_tcp(D.port);
    cr_assert_eq(wire_hello(fd, 1, "nope"), DQ_UNAUTHENTICATED);
    cr_assert_eq(wire_wait_eof(fd, 5000), 0, "the connection stays open after a wrong secret");
    close(fd);

    c = cli_opts(D.tcp_addr, "s3cret-e2e");
    OK(c, dqc_ping(c, "ok", 2));
    cr_assert_geq(stat_counter(c, "auth_failures"), 4);
    dqc_free(c);
    /* The Unix socket does not ask for it. */
    c = cli(D.addr);
    OK(c, dqc_ping(c, "ok", 2));
    dqc_free(c);
}

/* ================= reconnect across a daemon restart ================= */

Test(e2e, client_reconnects_across_a_daemon_restart)
{
    start_daemon(NULL);
    const char *bin = dqd_path();
    dqc_client *c = cli(D.addr);
    register_small(c, "m", L, NULL);
    OK(c, dqc_ping(c, "a", 1));

    /* Restart on the same socket path. */
    dqd_daemon old = D;
    kill(old.pid, SIGTERM);
    int st = 0;
    waitpid(old.pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    D.pid = 0;
    FAILS(c, DQ_CONNECTION, dqc_ping(c, "b", 1)); /* nobody listens: reconnect attempts fail */

    const dqd_opts again = {.dir = old.dir, .log_level = "error"};
    cr_assert_eq(dqd_start(&D, &again), 0, "could not restart %s", bin);
    cr_assert_str_eq(D.sock, old.sock);
    D.own_dir = old.own_dir; /* the new daemon took over the first one's directory */
    uint64_t before = dqc_reconnect_count(c);
    OK(c, dqc_ping(c, "c", 1));
    cr_assert_eq(dqc_reconnect_count(c), before + 1);
    /* A fresh daemon has no models: register again and PUT (PUT reconnects first if needed). */
    register_small(c, "m", L, NULL);
    float *k = random_tensor(DQ_DTYPE_F32, 4 * NV, 51, 1);
    OK(c, put_chunk(c, seq("", "after-restart"), "m", 0, 0, 1, 4, DQ_DTYPE_F32, k, k));
    free(k);
    dqc_free(c);
}
