/* The fixed-width family (dq_profile_fixed: "fixed226", "fixed196", "fixedkAvB") served by a real
 * dquantd ($DQUANTD) through libdquant-client, against libdquant in-process as the reference:
 *   - REGISTER_MODEL by name gives the library's profile (the same serialized bytes and bits/value);
 *   - PUT then GET (bit-exact with dq_layer_decode), GET_RAW (the same window records and tails,
 *     records that pass dq_window_check), ATTEND over every layer (bit-exact with dq_attend), also
 *     with an appended token, COMPRESS / DECOMPRESS (the records of dq_tokens_encode, decoded as
 *     dq_tokens_decode does); DECOMPRESS of records whose base-M groups overflow is DQ_CORRUPT;
 *   - unknown fixed-width names are refused with DQ_PROFILE and the daemon keeps serving;
 *   - the disk tier: sequences spilled to disk and read back, also after a restart, decode as before.
 * With $DQ_FIXED_BACKEND=cuda the same runs on dquantd-fakecuda's cuda backend, where the family
 * takes the host path with the default --gpu-attention-layout containers; with $DQ_FIXED_LAYOUT=hot
 * or hot-only it lives on the (emulated) GPU tier as hot windows (beside its records, or alone),
 * and the same answers are checked, the stats showing the GPU tier held and attended it, and the
 * disk test spilling GPU -> host -> disk and back. ATTEND must equal dq_attend bit for bit (the
 * emulation's hot attention is dq_hot_attend), or on a real GPU within $DQ_FIXED_ATTEND_TOL
 * (relative, tests/cuda/daemon_gpu.sh).
 * The container format version 2 (joint pairs: "dq226p", "dq196p") is checked the same way: unlike
 * the family it lives on the GPU tier with every layout (encoded and decoded on the device; ATTEND
 * on the host with containers, as libdquant-cuda has no version-2 container attention), and
 * hot-only records are rebuilt on the GPU.
 * Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"

#define L 2
#define QH 4
#define KVH 2
#define HD 128 /* the hot kernel takes head_dim 128 and 256 */
#define ROW (KVH * HD)
#define MODEL "fx"

static dqd_daemon D;

static float val(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v)
{
    uint32_t h = id * 2654435761u ^ (uint32_t)(t * 40503u + j * 977u + l * 7919u + (uint32_t)is_v * 31u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (float)(h % 20001) / 10000.0f - 1.0f;
    return u * (1.0f + 0.5f * (float)l) + (is_v ? 0.0f : 0.3f * (float)(j % 7));
}

/* [layers, n, KVH, HD] */
static float *kv(uint32_t id, uint32_t layers, uint64_t start, uint64_t n, int is_v)
{
    float *x = malloc(layers * n * ROW * sizeof *x);
    cr_assert(x);
    for (uint32_t l = 0; l < layers; l++)
        for (uint64_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < ROW; j++)
                x[(l * n + t) * ROW + j] = val(id, l, start + t, j, is_v);
    return x;
}

typedef struct ref_codec {
    dq_profile p;
    dq_codec *codec;
    dq_workspace *ws;
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
} ref_codec;

static void ref_make(ref_codec *r, const char *name)
{
    memset(r, 0, sizeof *r);
    if (dq_profile_fixed(name, KVH, HD, &r->p) != 0) {
        cr_assert_eq(dq_profile_builtin(name, KVH, HD, &r->p), 0, "dq_profile_builtin(%s)", name);
        cr_assert_eq(r->p.format_version, DQ_FORMAT_VERSION_PAIRS, "%s is not a version-2 profile", name);
    } else {
        cr_assert_eq(r->p.codec_type, DQ_CODEC_FIXED);
    }
    cr_assert_eq(dq_codec_create(&r->p, NULL, &r->codec), 0);
    cr_assert_eq(dq_workspace_create(r->codec, &r->ws), 0);
    cr_assert_eq(dq_profile_serialize(&r->p, r->pbytes, sizeof r->pbytes, &r->plen), 0);
}

static void ref_free(ref_codec *r)
{
    dq_workspace_free(r->ws);
    dq_codec_free(r->codec);
    memset(r, 0, sizeof *r);
}

/* ATTEND outputs (n values, then nl LSEs) equal the reference: bit for bit, or within the relative
 * tolerance $DQ_FIXED_ATTEND_TOL when set (a real GPU's dqcu_attend_hot: float rounding). */
static bool same_attend(const float *out, const float *want, size_t n, const float *lse, const float *wlse, size_t nl)
{
    const char *t = getenv("DQ_FIXED_ATTEND_TOL");
    if (!t || !*t)
        return memcmp(out, want, n * sizeof *out) == 0 && memcmp(lse, wlse, nl * sizeof *lse) == 0;
    const double tol = strtod(t, NULL);
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)out[i] - want[i]) <= tol * (1.0 + fabs((double)want[i]))))
            return false;
    for (size_t i = 0; i < nl; i++)
        if (!(fabs((double)lse[i] - wlse[i]) <= tol * (1.0 + fabs((double)wlse[i]))))
            return false;
    return true;
}

static void start_with(const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
}

static bool on_cuda(void)
{
    const char *b = getenv("DQ_FIXED_BACKEND");
    return b && strcmp(b, "cuda") == 0;
}

/* $DQ_FIXED_LAYOUT on the cuda backend: hot or hot-only (the family on the GPU tier), else NULL */
static const char *layout(void)
{
    const char *l = getenv("DQ_FIXED_LAYOUT");
    return on_cuda() && l && *l && strcmp(l, "containers") != 0 ? l : NULL;
}

static bool hot_only(void)
{
    return layout() && strcmp(layout(), "hot-only") == 0;
}

/* A container format version 2 profile (not the fixed-width family). */
static bool pairs(const ref_codec *r)
{
    return r->p.format_version == DQ_FORMAT_VERSION_PAIRS;
}

/* Whether r's sequences live on the (emulated) GPU tier: the family with the hot layouts, version 2
 * with every layout. */
static bool gpu_tier(const ref_codec *r)
{
    return on_cuda() && (layout() || pairs(r));
}

static void start(void)
{
    static const char *const cpu[] = {"--workers", "2", NULL};
    const char *const cuda[] = {
        "--workers", "2", "--backend", "cuda", "--gpu-memory", "8M", layout() ? "--gpu-attention-layout" : NULL,
        layout(),    NULL};
    start_with(on_cuda() ? cuda : cpu);
}

static void stop(void)
{
    if (D.pid) {
        int st = dqd_stop(&D);
        cr_expect_eq(st, 0, "the daemon exited with %d", st);
    }
}

static dqc_client *cli(void)
{
    dqc_client *c = NULL;
    char err[256];
    cr_assert_eq(dqc_connect_ex(D.addr, NULL, &c, err, sizeof err), 0, "connect: %s", err);
    return c;
}

static int register_as(dqc_client *c, const char *name, const ref_codec *r, int *existed)
{
    dqc_model_spec spec = {
        .name = name, .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = r->p.name};
    dqc_model_info info;
    int rc = dqc_register_model(c, &spec, &info);
    if (rc == 0) {
        cr_assert_eq(info.profile_len, r->plen, "the daemon's profile has %zu bytes, ours %zu", info.profile_len,
                     r->plen);
        cr_assert(memcmp(info.profile, r->pbytes, r->plen) == 0, "the daemon uses another profile");
        cr_assert_float_eq(info.bits_per_value, dq_profile_bits_per_value_mean(&r->p), 1e-9);
        if (existed)
            *existed = info.existed;
    }
    return rc;
}

static void put(dqc_client *c, const char *key, dq_layer **ref, const ref_codec *r, uint64_t start, uint64_t n)
{
    float *k = kv(1, L, start, n, 0), *v = kv(1, L, start, n, 1);
    dqc_put_args a = {.seq = {NULL, key, strlen(key)},
                      .model = MODEL,
                      .start_token = start,
                      .num_layers = L,
                      .tokens = n,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    for (uint32_t l = 0; l < L; l++) {
        if (!ref[l])
            cr_assert_eq(dq_layer_create(r->codec, &ref[l]), 0);
        cr_assert_eq(dq_layer_append(ref[l], r->ws, k + l * n * ROW, v + l * n * ROW, DQ_DTYPE_F32, n, NULL), 0);
    }
    free(k);
    free(v);
}

/* GET (f32), GET_RAW and one ATTEND over every layer of `key` equal the reference exactly. */
static void check_seq(dqc_client *c, const char *key, dq_layer *const *ref, const ref_codec *r, uint64_t tokens,
                      const char *what)
{
    const dqc_seq s = {NULL, key, strlen(key)};
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = s, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, tokens, "%s", what);
    cr_assert_eq(g.num_layers, L);
    float *want = malloc(tokens * ROW * sizeof *want);
    for (uint32_t l = 0; l < L; l++)
        for (int kind = 0; kind < 2; kind++) {
            cr_assert_eq(dq_layer_decode(ref[l], r->ws, (dq_kind)kind, 0, tokens, want, DQ_DTYPE_F32), 0);
            const float *got = (const float *)(kind ? g.v : g.k) + l * tokens * ROW;
            cr_assert(memcmp(got, want, tokens * ROW * sizeof *want) == 0, "%s: GET layer %u %s differs", what, l,
                      kind ? "V" : "K");
        }
    free(want);
    dqc_get_result_free(&g);

    dqc_raw_result raw = {0};
    OK(c, dqc_get_raw(c, &s, 0, 0, &raw));
    cr_assert_eq(raw.nlayers, L);
    cr_assert_eq(raw.profile_len, r->plen);
    cr_assert(memcmp(raw.profile, r->pbytes, r->plen) == 0, "%s: GET_RAW's profile differs", what);
    const size_t wb = dq_codec_window_bytes(r->codec);
    for (uint32_t l = 0; l < L; l++) {
        const dqc_raw_layer *rl = &raw.layers[l];
        cr_assert_eq(rl->windows, dq_layer_window_count(ref[l]), "%s layer %u", what, l);
        cr_assert_eq(rl->tail_tokens, dq_layer_tail_tokens(ref[l]), "%s layer %u", what, l);
        for (size_t w = 0; w < rl->windows; w++) {
            cr_assert(memcmp(rl->records + w * wb, dq_layer_window(ref[l], w), wb) == 0,
                      "%s: layer %u window %zu differs", what, l, w);
            cr_assert_eq(dq_window_check(r->codec, rl->records + w * wb), 0);
        }
        const size_t tb = rl->tail_tokens * ROW * 2;
        cr_assert(!tb || memcmp(rl->tail_k, dq_layer_tail(ref[l], DQ_KIND_K), tb) == 0, "%s layer %u tail", what, l);
        cr_assert(!tb || memcmp(rl->tail_v, dq_layer_tail(ref[l], DQ_KIND_V), tb) == 0, "%s layer %u tail", what, l);
    }
    dqc_raw_result_free(&raw);

    float q[L][QH * HD], out[L][QH * HD], lse[L][QH], rout[QH * HD], rlse[QH];
    dqc_attend_item it[L];
    for (uint32_t l = 0; l < L; l++) {
        for (int i = 0; i < QH * HD; i++)
            q[l][i] = 0.5f * val(500 + l, l, 0, (uint32_t)i, 0);
        it[l] = (dqc_attend_item){.seq = s, .layer = l, .q = q[l]};
    }
    dqc_attend_args aa = {
        .items = it, .nitems = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, &out[0][0], &lse[0][0]));
    for (uint32_t l = 0; l < L; l++) {
        dq_attn_item ri = {ref[l], q[l], rout, rlse};
        cr_assert_eq(dq_attend(r->codec, r->ws, QH, 1.0f / sqrtf(HD), &ri, 1), 0);
        cr_assert(same_attend(out[l], rout, QH * HD, lse[l], rlse, QH), "%s: ATTEND of layer %u differs from dq_attend",
                  what, l);
    }
}

/* COMPRESS of ntok tokens of one kind equals dq_tokens_encode's records, DECOMPRESS
 * dq_tokens_decode's values; the records with a base-M group overflowed decompress as DQ_CORRUPT. */
static void compress_check(dqc_client *c, const ref_codec *r, int kind, const float *x, uint64_t ntok)
{
    const size_t rb = dq_codec_record_bytes(r->codec, (dq_kind)kind), mb = dq_codec_mean_bytes(r->codec);
    const uint32_t W = r->p.window;
    const uint64_t blocks = (ntok + W - 1) / W;
    const bool header = kind == 0;
    uint8_t *rec = calloc(ntok, rb), *means = calloc(blocks, mb);
    float *dec = malloc(ntok * ROW * sizeof *dec);
    for (uint64_t b = 0; b < blocks; b++) {
        const uint64_t t0 = b * W, cnt = ntok - t0 < W ? ntok - t0 : W;
        cr_assert_eq(dq_tokens_encode(r->codec, r->ws, (dq_kind)kind, x + t0 * ROW, DQ_DTYPE_F32, cnt,
                                      header ? means + b * mb : NULL, rec + t0 * rb, rb, NULL),
                     0);
        cr_assert_eq(dq_tokens_decode(r->codec, r->ws, (dq_kind)kind, header ? means + b * mb : NULL, rec + t0 * rb, rb,
                                      cnt, dec + t0 * ROW, DQ_DTYPE_F32),
                     0);
    }
    dqc_compress_args ca = {
        .model = MODEL, .kv_heads = KVH, .head_dim = HD, .kind = kind, .dtype = DQ_DTYPE_F32, .x = x, .tokens = ntok};
    dqc_compress_result cr = {0};
    OK(c, dqc_compress(c, &ca, &cr));
    cr_assert_eq(cr.profile_len, r->plen);
    cr_assert(memcmp(cr.profile, r->pbytes, r->plen) == 0);
    cr_assert_eq(cr.records_bytes, ntok * rb);
    cr_assert(memcmp(cr.records, rec, ntok * rb) == 0, "COMPRESS kind %d: records differ", kind);
    cr_assert_eq(cr.means_bytes, header ? blocks * mb : 0);
    cr_assert(!header || memcmp(cr.means, means, blocks * mb) == 0, "COMPRESS: window headers differ");

    dqc_decompress_args da = {.profile = cr.profile,
                              .profile_len = cr.profile_len,
                              .kind = kind,
                              .tokens = ntok,
                              .means = cr.means,
                              .means_bytes = cr.means_bytes,
                              .records = cr.records,
                              .records_bytes = cr.records_bytes,
                              .out_dtype = DQ_DTYPE_F32};
    dqc_decompress_result dr = {0};
    OK(c, dqc_decompress(c, &da, &dr));
    cr_assert_eq(dr.bytes, ntok * ROW * sizeof(float));
    cr_assert(memcmp(dr.x, dec, dr.bytes) == 0, "DECOMPRESS kind %d differs from dq_tokens_decode", kind);
    dqc_decompress_result_free(&dr);

    uint8_t *bad = malloc(ntok * rb);
    memcpy(bad, cr.records, ntok * rb);
    uint8_t lev[ROW];
    int want;
    if (pairs(r)) {
        /* token 1's rANS state zeroed: below L, corrupt */
        memset(bad + rb + 4, 0, 4);
        want = dq_stream_decode_levels(r->codec, (dq_kind)kind, bad + rb, lev);
        cr_assert_eq(want, DQ_CORRUPT);
    } else {
        /* every bit of token 1's first group set: at least 2^w - 1 >= M^k unless M is a power of two */
        uint32_t k, w;
        dq_fixed_packing(ROW, r->p.levels[kind], &k, &w);
        for (uint32_t b = 0; b < w; b++)
            bad[rb + 4 + b / 8] |= (uint8_t)(1u << (b % 8));
        want = dq_stream_decode_levels(r->codec, (dq_kind)kind, bad + rb, lev);
        cr_assert_eq(want, (r->p.levels[kind] & (r->p.levels[kind] - 1)) ? DQ_CORRUPT : DQ_OK);
    }
    da.records = bad;
    if (want == DQ_CORRUPT)
        FAILS(c, DQ_CORRUPT, dqc_decompress(c, &da, &dr));
    else
        OK(c, dqc_decompress(c, &da, &dr));
    dqc_decompress_result_free(&dr);
    free(bad);
    dqc_compress_result_free(&cr);
    free(rec);
    free(means);
    free(dec);
}

static void serve(const char *pname)
{
    ref_codec r;
    ref_make(&r, pname);
    dqc_client *c = cli();
    int existed = -1;
    OK(c, register_as(c, MODEL, &r, &existed));
    cr_assert_eq(existed, 0);
    const uint32_t W = r.p.window;
    const uint64_t n1 = W + 3, n2 = W + 9;
    dq_layer *ref[L] = {0};
    put(c, "s", ref, &r, 0, n1);
    put(c, "s", ref, &r, n1, n2);
    const uint64_t items0 = stat_counter(c, "gpu_hot_attend_items");
    const uint64_t cpu0 = stat_counter(c, "gpu_records_rebuilt_cpu");
    const uint64_t gpu0 = stat_counter(c, "gpu_records_rebuilt_gpu");
    if (layout()) {
        /* both layers' sealed windows held as hot windows on the GPU (without records: hot-only) */
        const uint64_t wins = L * ((n1 + n2 - r.p.residual) / W + 1);
        cr_assert_eq(stat_gauge(c, "gpu_sequences"), 1, "%s: the sequence is not on the GPU", pname);
        cr_assert_eq(stat_gauge(c, "gpu_hot_windows"), wins, "%s: hot windows", pname);
        cr_assert_eq(stat_gauge(c, "gpu_hot_only_windows"), hot_only() ? wins : 0, "%s: hot-only windows", pname);
    }
    check_seq(c, "s", ref, &r, n1 + n2, pname);
    if (on_cuda()) {
        cr_assert_gt(stat_gauge(c, "gpu_budget"), 0, "no cuda backend");
        cr_assert_eq(stat_gauge(c, "gpu_sequences"), gpu_tier(&r) ? 1 : 0, "%s: the sequence's tier", pname);
    }
    if (layout()) {
        /* ATTEND ran over the hot windows; hot-only records (GET, GET_RAW) were rebuilt on the CPU
         * for the family (the GPU rebuild takes rANS records only), on the GPU for version 2 */
        /* DQCU_FAKE_HOT_MAX_TOKENS: the emulated hot kernel refuses the launch, and the daemon
         * attends on the host (libdquant on the records) */
        const bool refused = getenv("DQCU_FAKE_HOT_MAX_TOKENS") != NULL;
        cr_assert_eq(stat_counter(c, "gpu_hot_attend_items") - items0, refused ? 0 : L, "%s: ATTEND over hot windows",
                     pname);
        const char *rebuilt = pairs(&r) ? "gpu_records_rebuilt_gpu" : "gpu_records_rebuilt_cpu";
        cr_assert(hot_only() ? stat_counter(c, rebuilt) > (pairs(&r) ? gpu0 : cpu0)
                             : stat_counter(c, "gpu_records_rebuilt") == 0,
                  "%s: records rebuilt (%s)", pname, rebuilt);
        cr_assert_eq(stat_counter(c, pairs(&r) ? "gpu_records_rebuilt_cpu" : "gpu_records_rebuilt_gpu"),
                     pairs(&r) ? cpu0 : 0, "%s: records rebuilt on the other side", pname);
    }
    const uint64_t ntok = W + 17;
    float *x = kv(3, 1, 0, ntok, 0);
    compress_check(c, &r, 0, x, ntok);
    compress_check(c, &r, 1, x, ntok);
    free(x);
    /* ATTEND with an appended token */
    float ak[ROW], av[ROW], q[QH * HD], out[QH * HD], lse[QH], rout[QH * HD], rlse[QH];
    for (int i = 0; i < ROW; i++) {
        ak[i] = val(7, 1, 0, (uint32_t)i, 0);
        av[i] = val(7, 1, 0, (uint32_t)i, 1);
    }
    for (int i = 0; i < QH * HD; i++)
        q[i] = val(8, 1, 0, (uint32_t)i, 0);
    dqc_attend_item it = {.seq = {NULL, "s", 1}, .layer = 1, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
    cr_assert_eq(dq_layer_append(ref[1], r.ws, ak, av, DQ_DTYPE_F32, 1, NULL), 0);
    dq_attn_item ri = {ref[1], q, rout, rlse};
    cr_assert_eq(dq_attend(r.codec, r.ws, QH, 1.0f / sqrtf(HD), &ri, 1), 0);
    cr_assert(same_attend(out, rout, QH * HD, lse, rlse, QH), "%s: ATTEND with an append differs", pname);
    OK(c, dqc_delete(c, &(dqc_seq){NULL, "s", 1}));
    OK(c, dqc_unregister_model(c, MODEL));
    for (uint32_t l = 0; l < L; l++)
        dq_layer_free(ref[l]);
    dqc_free(c);
    ref_free(&r);
}

TestSuite(fixed, .init = start, .fini = stop, .timeout = 120);

Test(fixed, serves_fixed226)
{
    serve("fixed226");
}

Test(fixed, serves_fixed196)
{
    serve("fixed196");
}

Test(fixed, serves_explicit_levels)
{
    serve("fixedk6v3");
}

Test(fixed, serves_dq226p_format2)
{
    serve("dq226p");
}

Test(fixed, serves_dq196p_format2)
{
    serve("dq196p");
}

Test(fixed, unknown_names)
{
    dqc_client *c = cli();
    const char *bad[] = {"fixed999", "fixedk1v3", "fixedk6v300", "fixedk6"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dqc_model_spec u = {
            .name = "unknown", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = bad[i]};
        FAILS(c, DQ_PROFILE, dqc_register_model(c, &u, NULL));
    }
    dqc_free(c);
    serve("fixed226"); /* still serving */
}

TestSuite(fixed_flags, .fini = stop, .timeout = 180);

/* The disk tier: sequences evicted to disk come back decoding as before, also after a restart. */
static void disk_tier_roundtrip(const char *pname)
{
    ref_codec r;
    ref_make(&r, pname);
    char dir[200], disk[256];
    snprintf(dir, sizeof dir, "%s", dqd_tmpdir());
    snprintf(disk, sizeof disk, "%s/disk", dir);
    /* on the GPU tier (DQ_FIXED_LAYOUT) 1 MiB of it, so that sequences go GPU -> host -> disk */
    const char *const extra[] = {"--disk-dir",
                                 disk,
                                 "--host-memory",
                                 "2M",
                                 "--workers",
                                 "2",
                                 gpu_tier(&r) ? "--backend" : NULL,
                                 "cuda",
                                 "--gpu-memory",
                                 "1M",
                                 layout() ? "--gpu-attention-layout" : NULL,
                                 layout(),
                                 NULL};
    start_with(extra);
    dqc_client *c = cli();
    OK(c, register_as(c, MODEL, &r, NULL));
    enum { NSEQ = 24 };
    const uint64_t T = 2 * r.p.window + 11;
    dq_layer *ref[NSEQ][L];
    memset(ref, 0, sizeof ref);
    char key[NSEQ][16];
    for (int i = 0; i < NSEQ; i++) {
        snprintf(key[i], sizeof key[i], "d%d", i);
        put(c, key[i], ref[i], &r, 0, T);
    }
    cr_assert_gt(stat_counter(c, "disk_spills"), 0, "nothing was spilled: the test proves nothing");
    if (gpu_tier(&r))
        cr_assert_gt(stat_counter(c, "gpu_demotions"), 0, "nothing left the GPU tier");
    for (int i = 0; i < NSEQ; i++)
        check_seq(c, key[i], ref[i], &r, T, key[i]);
    cr_assert_gt(stat_counter(c, "disk_loads"), 0, "nothing was read back from disk");
    if (layout())
        cr_assert_gt(stat_gauge(c, "gpu_hot_windows"), 0, "ATTEND brought nothing back to the GPU tier");
    if (gpu_tier(&r))
        cr_assert_gt(stat_counter(c, "gpu_promotions"), 0, "nothing came back to the GPU tier");
    dqc_free(c);

    stop();
    start_with(extra);
    c = cli();
    cr_assert_eq(stat_counter(c, "disk_recovered"), NSEQ, "records recovered after the restart");
    for (int i = 0; i < NSEQ; i++)
        check_seq(c, key[i], ref[i], &r, T, key[i]);
    for (int i = 0; i < NSEQ; i++)
        for (uint32_t l = 0; l < L; l++)
            dq_layer_free(ref[i][l]);
    dqc_free(c);
    ref_free(&r);
    stop();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(fixed_flags, disk_tier_roundtrip)
{
    disk_tier_roundtrip("fixed226");
}

/* Version 2 through every tier: GPU -> host -> disk and back on the cuda backend (any layout). */
Test(fixed_flags, disk_tier_roundtrip_dq226p)
{
    disk_tier_roundtrip("dq226p");
}
