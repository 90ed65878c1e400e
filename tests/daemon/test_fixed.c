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
 * and the same answers are checked, the stats showing the GPU tier encoded (dqcu_encode_windows),
 * held and attended it, and the disk test spilling GPU -> host -> disk and back. ATTEND must equal
 * dq_attend bit for bit (the emulation's hot attention is dq_hot_attend), or on a real GPU within
 * $DQ_FIXED_ATTEND_TOL (relative, tests/cuda/daemon_gpu.sh).
 * The container format version 2 (joint pairs: "dq226p", "dq196p") is checked the same way, a
 * zeroed rANS state being its corrupt record: unlike the family it lives on the GPU tier with every
 * layout (encoded and decoded on the device; ATTEND with containers by the device's container
 * attention, v7 decoding the pairs: gpu_host_attend_items stays 0), and hot-only records are
 * rebuilt on the GPU.
 * Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_check.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/layer.h"
#include "served.h"

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

/* The served model's checks (served.h) over r: ATTEND bit for bit, or within the relative tolerance
 * $DQ_FIXED_ATTEND_TOL when set (a real GPU's dqcu_attend_hot: float rounding). */
static srv_model model_of(const ref_codec *r)
{
    const char *t = getenv("DQ_FIXED_ATTEND_TOL");
    srv_model m = srv_model_of(MODEL, L, QH, KVH, HD, r->codec, r->ws, r->pbytes, r->plen, val);
    m.attend_tol = t && *t ? strtod(t, NULL) : 0.0;
    m.window_check = true;
    return m;
}

static float *kv(uint32_t id, uint32_t layers, uint64_t start, uint64_t n, int is_v)
{
    const srv_model m = {.kv_heads = KVH, .head_dim = HD, .val = val};
    return srv_kv(&m, id, layers, start, n, is_v);
}

static void start_with(const char *const *extra)
{
    srv_start(&D, extra);
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
    srv_stop(&D);
}

static dqc_client *cli(void)
{
    return srv_connect(&D);
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

/* COMPRESS / DECOMPRESS of ntok tokens of one kind (srv_compress_check); then the records with a
 * base-M group overflowed (the family) or a rANS state zeroed (version 2) decompress as
 * DQ_CORRUPT. */
static void compress_check(dqc_client *c, const ref_codec *r, int kind, const float *x, uint64_t ntok)
{
    const srv_model m = model_of(r);
    const size_t rb = dq_codec_record_bytes(r->codec, (dq_kind)kind), mb = dq_codec_mean_bytes(r->codec);
    const uint32_t W = r->p.window;
    const uint64_t blocks = (ntok + W - 1) / W;
    uint8_t *means = NULL;
    uint8_t *rec = srv_compress_check(c, &m, -1, kind, x, ntok, &means);
    dqc_decompress_args da = {.profile = r->pbytes,
                              .profile_len = r->plen,
                              .kind = kind,
                              .tokens = ntok,
                              .means = means,
                              .means_bytes = means ? blocks * mb : 0,
                              .records_bytes = ntok * rb,
                              .out_dtype = DQ_DTYPE_F32};
    dqc_decompress_result dr = {0};

    uint8_t *bad = malloc(ntok * rb);
    cr_assert(bad);
    memcpy(bad, rec, ntok * rb);
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
    free(rec);
    free(means);
}

static void serve(const char *pname)
{
    ref_codec r;
    ref_make(&r, pname);
    const srv_model m = model_of(&r);
    dqc_client *c = cli();
    int existed = -1;
    OK(c, register_as(c, MODEL, &r, &existed));
    cr_assert_eq(existed, 0);
    const uint32_t W = r.p.window;
    const uint64_t n1 = W + 3, n2 = W + 9;
    dq_layer *ref[L] = {0};
    const uint64_t enc0 = stat_counter(c, "gpu_windows_encoded");
    srv_put(c, &m, "s", ref, 0, n1);
    srv_put(c, &m, "s", ref, n1, n2);
    const uint64_t items0 = stat_counter(c, "gpu_hot_attend_items");
    const uint64_t host0 = stat_counter(c, "gpu_host_attend_items");
    const uint64_t cpu0 = stat_counter(c, "gpu_records_rebuilt_cpu");
    const uint64_t gpu0 = stat_counter(c, "gpu_records_rebuilt_gpu");
    if (gpu_tier(&r)) {
        /* both layers' sealed windows on the GPU: records (containers), hot windows beside them
         * (hot) or hot windows alone (hot-only) */
        const uint64_t wins = L * ((n1 + n2 - r.p.residual) / W + 1);
        cr_assert_eq(stat_gauge(c, "gpu_sequences"), 1, "%s: the sequence is not on the GPU", pname);
        cr_assert_eq(stat_gauge(c, "gpu_hot_windows"), layout() ? wins : 0, "%s: hot windows", pname);
        cr_assert_eq(stat_gauge(c, "gpu_hot_only_windows"), hot_only() ? wins : 0, "%s: hot-only windows", pname);
        /* sealed by the device's encoder (dqcu_encode_windows, version 2 included), not on the
         * host and uploaded */
        cr_assert_eq(stat_counter(c, "gpu_windows_encoded") - enc0, wins, "%s: windows encoded on the GPU", pname);
    } else {
        cr_assert_eq(stat_counter(c, "gpu_windows_encoded"), enc0, "%s: windows encoded on the GPU", pname);
    }
    srv_check_seq(c, &m, "s", ref, n1 + n2, pname);
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
    } else if (gpu_tier(&r)) {
        /* version 2 with containers: records on the GPU, nothing to rebuild */
        cr_assert_eq(stat_counter(c, "gpu_records_rebuilt"), 0, "%s: records rebuilt", pname);
    }
    /* ATTEND over records on the GPU tier: version 2 (the built-ins' 8 levels or fewer) on the
     * device's container attention, the fixed-width family on the host (where the hot kernel refused) */
    const bool host_att = layout() && getenv("DQCU_FAKE_HOT_MAX_TOKENS") != NULL && !pairs(&r);
    cr_assert_eq(stat_counter(c, "gpu_host_attend_items") - host0, host_att ? L : 0,
                 "%s: ATTEND items computed on the host", pname);
    const uint64_t ntok = W + 17;
    float *x = kv(3, 1, 0, ntok, 0);
    compress_check(c, &r, 0, x, ntok);
    compress_check(c, &r, 1, x, ntok);
    free(x);
    /* ATTEND with an appended token */
    srv_attend_append(c, &m, "s", 1, ref[1], pname);
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
    const srv_model m = model_of(&r);
    char dir[200], disk[256];
    snprintf(dir, sizeof dir, "%s", dqd_tmpdir());
    snprintf(disk, sizeof disk, "%s/disk", dir);
    /* on the GPU tier (DQ_FIXED_LAYOUT, version 2) 1 MiB of it, so that sequences go GPU -> host ->
     * disk */
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
        srv_put(c, &m, key[i], ref[i], 0, T);
    }
    cr_assert_gt(stat_counter(c, "disk_spills"), 0, "nothing was spilled: the test proves nothing");
    if (gpu_tier(&r))
        cr_assert_gt(stat_counter(c, "gpu_demotions"), 0, "nothing left the GPU tier");
    for (int i = 0; i < NSEQ; i++)
        srv_check_seq(c, &m, key[i], ref[i], T, key[i]);
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
        srv_check_seq(c, &m, key[i], ref[i], T, key[i]);
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
