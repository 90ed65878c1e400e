/* The KVQuant++ codec family (dquant/kvq.h) served by a real dquantd ($DQUANTD), through
 * libdquant-client, against the same codec in-process (libdquant: dq_codec_create_calibrated and
 * the per-layer views of dq_codec_layer) as the reference:
 *   - models of "lm3", "ip3", "pq16x8" (with a per-layer calibration sent by REGISTER_MODEL),
 *     "ip3+lr4", "ol3+d16" (calibrated outliers, delta coding), "lmh2" (Haar rotation) and
 *     "dq226p" (container format version 2): PUT then GET (bit-exact with dq_layer_decode of the
 *     same tokens), GET_RAW (the same window records and tails), ATTEND over every layer in one
 *     request (bit-exact with dq_attend of the layer's view), COMPRESS / DECOMPRESS of a model
 *     layer (the same records as dq_tokens_encode of that layer's view, decoded as
 *     dq_tokens_decode does);
 *   - the calibration is used per layer: one input compressed for two layers gives two record
 *     runs, each decoding as its own layer's view and differently from the other's;
 *   - bad calibrations (missing, truncated, a flipped byte, another layer count, one for a profile
 *     that takes none, one larger than --max-calibration-bytes) and unknown codec parameters
 *     ("pq0x8", "lm9", "ip1") get their error codes, and the daemon keeps serving;
 *   - the disk tier: sequences of a calibrated model spilled to disk and read back decode as before,
 *     also after a restart (the model registered again with the calibration kept on disk).
 * With $DQ_KVQ_BACKEND=cuda the same runs on dquantd-fakecuda's cuda backend, where KVQ models take
 * the host path (and "dq226p" the GPU tier). Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_check.h"
#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/kvq.h"
#include "dquant/layer.h"
#include "served.h"

#define L 3
#define QH 4
#define KVH 2
#define HD 64
#define ROW (KVH * HD)
#define CAL_TOKENS 512 /* calibration sample tokens per layer (>= 256 codes of pq16x8) */
#define MODEL "m"

static dqd_daemon D;

/* Keys and values with a different distribution in every layer (scale, offset, a few loud
 * channels), so that per-layer codebooks and outlier channels differ from layer to layer. */
static float val(uint32_t id, uint32_t l, uint64_t t, uint32_t j, int is_v)
{
    uint32_t h = id * 2654435761u ^ (uint32_t)(t * 40503u + j * 977u + l * 7919u + (uint32_t)is_v * 31u);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float u = (float)(h % 20001) / 10000.0f - 1.0f;
    float loud = (j % HD) % (5 + l) == 0 ? 4.0f + (float)l : 1.0f;
    return u * loud * (1.0f + 0.7f * (float)l) + (is_v ? 0.0f : 0.25f * (float)l);
}

/* [layers, n, KVH, HD] */
static float *kv(uint32_t id, uint32_t layers, uint64_t start, uint64_t n, int is_v)
{
    const srv_model m = {.kv_heads = KVH, .head_dim = HD, .val = val};
    return srv_kv(&m, id, layers, start, n, is_v);
}

/* ---- the in-process reference ---- */

typedef struct ref_codec {
    dq_profile p;
    uint8_t *calib; /* dq_kvq_free */
    size_t calib_len;
    dq_codec *codec;
    dq_workspace *ws;
    uint8_t pbytes[DQ_PROFILE_SERIALIZED_MAX];
    size_t plen;
} ref_codec;

/* The profile `name` for KVH x HD; calibrated over `layers` layers of sample K/V when it needs it. */
static void ref_make(ref_codec *r, const char *name, uint32_t layers)
{
    memset(r, 0, sizeof *r);
    /* the KVQ family, or a built-in profile of container format version 2 ("dq226p": on the cuda
     * backend on the GPU tier, without container attention) */
    if (dq_profile_kvq(name, KVH, HD, &r->p) != 0) {
        cr_assert_eq(dq_profile_builtin(name, KVH, HD, &r->p), 0, "dq_profile_builtin(%s)", name);
        cr_assert_eq(r->p.format_version, DQ_FORMAT_VERSION_PAIRS, "%s is not a version-2 profile", name);
    } else
        cr_assert_eq(r->p.codec_type, DQ_CODEC_KVQ);
    if (dq_profile_needs_calibration(&r->p)) {
        float *k = kv(99, layers, 0, CAL_TOKENS, 0), *v = kv(99, layers, 0, CAL_TOKENS, 1);
        cr_assert_eq(dq_kvq_calibrate(&r->p, layers, k, v, CAL_TOKENS, 7, &r->calib, &r->calib_len), 0);
        free(k);
        free(v);
        cr_assert_neq(r->p.kvq_calib_hash, 0);
        cr_assert_eq(r->p.kvq_layers, layers);
    }
    cr_assert_eq(dq_codec_create_calibrated(&r->p, r->calib, r->calib_len, NULL, &r->codec), 0);
    cr_assert_eq(dq_workspace_create(r->codec, &r->ws), 0);
    cr_assert_eq(dq_profile_serialize(&r->p, r->pbytes, sizeof r->pbytes, &r->plen), 0);
}

static void ref_free(ref_codec *r)
{
    dq_workspace_free(r->ws);
    dq_codec_free(r->codec);
    dq_kvq_free(r->calib);
    memset(r, 0, sizeof *r);
}

static const dq_codec *view(const ref_codec *r, uint32_t layer)
{
    const dq_codec *v = dq_codec_layer(r->codec, layer);
    cr_assert_not_null(v, "no view of layer %u", layer);
    return v;
}

static const dq_codec *model_view(const srv_model *m, uint32_t layer)
{
    return view(m->view_arg, layer);
}

/* The served model's checks (served.h) over r: every layer through its view, ATTEND bit for bit. */
static srv_model model_of(const ref_codec *r)
{
    srv_model m = srv_model_of(MODEL, L, QH, KVH, HD, r->codec, r->ws, r->pbytes, r->plen, val);
    m.view = model_view;
    m.view_arg = r;
    return m;
}

/* ---- the daemon ---- */

static void start_with(const char *const *extra)
{
    srv_start(&D, extra);
}

/* $DQ_KVQ_BACKEND=cuda: dquantd-fakecuda's cuda backend (meson test daemon-kvq-fakecuda), where
 * KVQ models take the host path while D-Quant models go to the (emulated) GPU. */
static bool on_cuda(void)
{
    const char *b = getenv("DQ_KVQ_BACKEND");
    return b && strcmp(b, "cuda") == 0;
}

static void start(void)
{
    static const char *const cpu[] = {"--workers", "2", NULL};
    static const char *const cuda[] = {"--workers", "2", "--backend", "cuda", "--gpu-memory", "8M", NULL};
    start_with(on_cuda() ? cuda : cpu);
}

/* On the cuda backend: the KVQ sequence `key` is held in host memory, while a D-Quant one goes to
 * the GPU (so that the check can fail). gpu: the sequence is D-Quant (format version 2: dq226p),
 * which lives on the GPU tier. */
static void check_host_path(dqc_client *c, bool gpu)
{
    if (!on_cuda())
        return;
    cr_assert_gt(stat_gauge(c, "gpu_budget"), 0, "no cuda backend");
    if (gpu) {
        cr_assert_eq(stat_gauge(c, "gpu_sequences"), 1, "the D-Quant sequence is not on the GPU");
        return;
    }
    cr_assert_eq(stat_gauge(c, "gpu_sequences"), 0, "a KVQ sequence is on the GPU");
    dqc_model_spec spec = {
        .name = "ctl", .layers = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "dq226"};
    OK(c, dqc_register_model(c, &spec, NULL));
    float *k = kv(6, 1, 0, 8, 0), *v = kv(6, 1, 0, 8, 1);
    dqc_put_args a = {.seq = {NULL, "ctl", 3},
                      .model = "ctl",
                      .num_layers = 1,
                      .tokens = 8,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    cr_assert_eq(stat_gauge(c, "gpu_sequences"), 1, "the D-Quant control sequence is not on the GPU");
    OK(c, dqc_delete(c, &a.seq));
    OK(c, dqc_unregister_model(c, "ctl"));
    free(k);
    free(v);
}

static void stop(void)
{
    srv_stop(&D);
}

static dqc_client *cli(void)
{
    return srv_connect(&D);
}

/* Registers `name` with r's profile: by name when it has no calibration (the daemon instantiates
 * it), else serialized with the calibration. Returns the call's code; *existed when asked. */
static int register_as(dqc_client *c, const char *name, uint32_t layers, const ref_codec *r, const char *pname,
                       int *existed)
{
    dqc_model_spec spec = {.name = name, .layers = layers, .q_heads = QH, .kv_heads = KVH, .head_dim = HD};
    if (r->calib) {
        spec.profile = r->pbytes;
        spec.profile_len = r->plen;
    } else {
        spec.profile_name = pname;
    }
    dqc_model_info info;
    int rc = dqc_register_model_calibrated(c, &spec, 0, r->calib, r->calib_len, &info, NULL);
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

/* COMPRESS / DECOMPRESS of x with model layer `layer` (srv_compress_check); the records
 * (malloc'd). */
static uint8_t *compress_check(dqc_client *c, const ref_codec *r, uint32_t layer, int kind, const float *x,
                               uint64_t ntok)
{
    const srv_model m = model_of(r);
    return srv_compress_check(c, &m, (int)layer, kind, x, ntok, NULL);
}

/* ---- serving each codec end to end ---- */

static void serve(const char *pname)
{
    ref_codec r;
    ref_make(&r, pname, L);
    const srv_model m = model_of(&r);
    dqc_client *c = cli();
    int existed = -1;
    OK(c, register_as(c, MODEL, L, &r, pname, &existed));
    cr_assert_eq(existed, 0);
    OK(c, register_as(c, MODEL, L, &r, pname, &existed));
    cr_assert_eq(existed, 1, "the same spec (and calibration) again is the model as it is");

    /* Two PUTs: the second seals windows across the first one's tail. */
    const uint32_t W = r.p.window;
    const uint64_t n1 = W + 3, n2 = W + 9;
    dq_layer *ref[L] = {0};
    srv_put(c, &m, "s", ref, 0, n1);
    srv_put(c, &m, "s", ref, n1, n2);
    srv_check_seq(c, &m, "s", ref, n1 + n2, pname);
    check_host_path(c, r.p.codec_type == DQ_CODEC_DQUANT);

    /* COMPRESS / DECOMPRESS of every layer, keys and values (two windows' worth and a bit). */
    const uint64_t ntok = W + 17;
    float *x = kv(3, L, 0, ntok, 0);
    uint8_t *rec[L];
    for (uint32_t l = 0; l < L; l++) {
        rec[l] = compress_check(c, &r, l, 0, x + l * ntok * ROW, ntok);
        free(compress_check(c, &r, l, 1, x + l * ntok * ROW, ntok));
    }
    if (r.calib) {
        /* The same input under layers 0 and 1: their codebooks differ, so do the records, and
         * DECOMPRESS decodes each run with the layer it is told. */
        uint8_t *r0 = compress_check(c, &r, 0, 0, x + ROW * 0, ntok);
        uint8_t *r1 = compress_check(c, &r, 1, 0, x + ROW * 0, ntok);
        const size_t rb = dq_codec_record_bytes(r.codec, DQ_KIND_K);
        cr_assert(memcmp(r0, r1, ntok * rb) != 0, "%s: layers 0 and 1 encode alike: no per-layer calibration", pname);
        dqc_decompress_args da = {.profile = r.pbytes,
                                  .profile_len = r.plen,
                                  .kind = 0,
                                  .tokens = ntok,
                                  .records = r1,
                                  .records_bytes = ntok * rb,
                                  .out_dtype = DQ_DTYPE_F32};
        dqc_decompress_result d0 = {0}, d1 = {0};
        OK(c, dqc_decompress_layer(c, &da, 0, &d0));
        OK(c, dqc_decompress_layer(c, &da, 1, &d1));
        cr_assert(memcmp(d0.x, d1.x, d0.bytes) != 0, "%s: layer 1's records decode alike under layer 0", pname);
        dqc_decompress_result_free(&d0);
        dqc_decompress_result_free(&d1);
        /* A layer outside the model (and its calibration). */
        dqc_compress_args ca = {
            .model = MODEL, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32, .x = x, .tokens = 4};
        dqc_compress_result cr = {0};
        FAILS(c, DQ_OUT_OF_BOUNDS, dqc_compress_layer(c, &ca, L, &cr));
        da.tokens = 1;
        da.records_bytes = rb;
        FAILS(c, DQ_OUT_OF_BOUNDS, dqc_decompress_layer(c, &da, L, &d0));
        dqc_compress_result_free(&cr);
        free(r0);
        free(r1); /* da.records until here */
    }
    for (uint32_t l = 0; l < L; l++)
        free(rec[l]);
    free(x);

    /* ATTEND with an appended token goes through the same per-layer view. */
    srv_attend_append(c, &m, "s", 2, ref[2], pname);

    OK(c, dqc_delete(c, &(dqc_seq){NULL, "s", 1}));
    OK(c, dqc_unregister_model(c, MODEL));
    for (uint32_t l = 0; l < L; l++)
        dq_layer_free(ref[l]);
    dqc_free(c);
    ref_free(&r);
}

TestSuite(kvq, .init = start, .fini = stop, .timeout = 120);

Test(kvq, serves_lm3)
{
    serve("lm3");
}

Test(kvq, serves_ip3_qjl)
{
    serve("ip3");
}

Test(kvq, serves_pq16x8_calibrated)
{
    serve("pq16x8");
}

Test(kvq, serves_ip3_lowrank4)
{
    serve("ip3+lr4");
}

/* Beyond the four the issue names: calibrated outlier channels with delta coding in windows, and
 * the Haar rotation. */
Test(kvq, serves_ol3_delta16_calibrated)
{
    serve("ol3+d16");
}

/* Container format version 2 (joint pairs): served like any profile; on the cuda backend on the
 * GPU tier (encoded and decoded on the device, ATTEND over the records on the host: no version-2
 * container attention kernel), with the same answers. */
Test(kvq, serves_dq226p_format2)
{
    serve("dq226p");
}

Test(kvq, serves_lmh2_haar)
{
    serve("lmh2");
}

/* The daemon answers a PUT/GET of a fresh model after each refusal. */
static void still_serving(dqc_client *c, const ref_codec *r, const char *why)
{
    static int round;
    char name[32], key[32];
    snprintf(name, sizeof name, "alive-%d", ++round);
    snprintf(key, sizeof key, "alive-%d", round);
    cr_assert_eq(register_as(c, name, L, r, "lm3", NULL), 0, "after %s: %s", why, dqc_last_error(c));
    float *k = kv(5, 1, 0, 4, 0), *v = kv(5, 1, 0, 4, 1);
    dqc_put_args a = {.seq = {NULL, key, strlen(key)},
                      .model = name,
                      .num_layers = 1,
                      .tokens = 4,
                      .kv_heads = KVH,
                      .head_dim = HD,
                      .dtype = DQ_DTYPE_F32,
                      .k = k,
                      .v = v};
    OK(c, dqc_put(c, &a, NULL));
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = a.seq, .num_layers = 1, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_get(c, &ga, &g));
    cr_assert_eq(g.tokens, 4, "after %s", why);
    dqc_get_result_free(&g);
    OK(c, dqc_delete(c, &a.seq));
    OK(c, dqc_unregister_model(c, name));
    free(k);
    free(v);
}

Test(kvq, bad_calibration)
{
    ref_codec pq, lm;
    ref_make(&pq, "pq16x8", L);
    ref_make(&lm, "lm3", L);
    dqc_client *c = cli();
    dqc_model_spec spec = {.name = "bad",
                           .layers = L,
                           .q_heads = QH,
                           .kv_heads = KVH,
                           .head_dim = HD,
                           .profile = pq.pbytes,
                           .profile_len = pq.plen};

    /* Missing: the calibrated profile alone, or the uncalibrated one by name. */
    FAILS(c, DQ_PROFILE, dqc_register_model_calibrated(c, &spec, 0, NULL, 0, NULL, NULL));
    still_serving(c, &lm, "a missing calibration");
    dqc_model_spec byname = {
        .name = "bad", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = "pq16x8"};
    FAILS(c, DQ_PROFILE, dqc_register_model(c, &byname, NULL));

    /* Truncated, and one byte flipped anywhere: refused with what dq_kvq_calibration_check says. */
    const size_t cuts[] = {pq.calib_len - 1, pq.calib_len / 2, 7};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        int want = dq_kvq_calibration_check(&pq.p, pq.calib, cuts[i], NULL);
        cr_assert_lt(want, 0, "a calibration cut to %zu bytes passes the local check", cuts[i]);
        FAILS(c, want, dqc_register_model_calibrated(c, &spec, 0, pq.calib, cuts[i], NULL, NULL));
    }
    still_serving(c, &lm, "a truncated calibration");
    uint8_t *flipped = malloc(pq.calib_len);
    const size_t at[] = {0, 5, pq.calib_len / 3, pq.calib_len - 1};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        memcpy(flipped, pq.calib, pq.calib_len);
        flipped[at[i]] ^= 0x10;
        int want = dq_kvq_calibration_check(&pq.p, flipped, pq.calib_len, NULL);
        cr_assert_lt(want, 0, "byte %zu flipped passes the local check", at[i]);
        FAILS(c, want, dqc_register_model_calibrated(c, &spec, 0, flipped, pq.calib_len, NULL, NULL));
    }
    free(flipped);
    still_serving(c, &lm, "a flipped calibration byte");

    /* Another model's layer count. */
    ref_codec four;
    ref_make(&four, "pq16x8", L + 1);
    dqc_model_spec spec4 = spec;
    spec4.profile = four.pbytes;
    spec4.profile_len = four.plen;
    FAILS(c, DQ_SHAPE, dqc_register_model_calibrated(c, &spec4, 0, four.calib, four.calib_len, NULL, NULL));
    /* Another calibration than the profile's (same shape, other sample: another hash). */
    FAILS(c, dq_kvq_calibration_check(&pq.p, four.calib, four.calib_len, NULL),
          dqc_register_model_calibrated(c, &spec, 0, four.calib, four.calib_len, NULL, NULL));
    ref_free(&four);
    /* A calibration for a profile that takes none. */
    byname.profile_name = "lm3";
    FAILS(c, DQ_PROFILE, dqc_register_model_calibrated(c, &byname, 0, pq.calib, pq.calib_len, NULL, NULL));
    still_serving(c, &lm, "a misplaced calibration");

    /* Registered, then again with other bytes under the same name: EXISTS; the same: existed. */
    OK(c, dqc_register_model_calibrated(c, &spec, 0, pq.calib, pq.calib_len, NULL, NULL));
    dqc_model_info info;
    OK(c, dqc_register_model_calibrated(c, &spec, 0, pq.calib, pq.calib_len, &info, NULL));
    cr_assert_eq(info.existed, 1);

    /* Unknown codec parameters. */
    const char *unknown[] = {"pq0x8", "lm9", "ip1", "pq16x0", "lm3+lr0x"};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        dq_profile p;
        cr_assert_eq(dq_profile_kvq(unknown[i], KVH, HD, &p), DQ_PROFILE, "%s locally", unknown[i]);
        dqc_model_spec u = {
            .name = "unknown", .layers = L, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .profile_name = unknown[i]};
        FAILS(c, DQ_PROFILE, dqc_register_model(c, &u, NULL));
        float x[4 * ROW] = {0};
        dqc_compress_args ca = {
            .profile_name = unknown[i], .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32, .x = x, .tokens = 4};
        dqc_compress_result cr = {0};
        FAILS(c, DQ_PROFILE, dqc_compress(c, &ca, &cr));
        dqc_compress_result_free(&cr);
    }
    still_serving(c, &lm, "unknown codec parameters");

    /* COMPRESS by a calibrated profile's name has no calibration to use; DECOMPRESS of a
     * calibrated profile no registered model holds neither. */
    float x[4 * ROW];
    for (int i = 0; i < 4 * ROW; i++)
        x[i] = val(4, 0, 0, (uint32_t)i, 0);
    dqc_compress_args ca = {
        .profile_name = "pq16x8", .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32, .x = x, .tokens = 4};
    dqc_compress_result cr = {0};
    FAILS(c, DQ_PROFILE, dqc_compress(c, &ca, &cr));
    ca.profile_name = NULL;
    ca.model = "bad";
    OK(c, dqc_compress(c, &ca, &cr));
    OK(c, dqc_unregister_model(c, "bad"));
    ref_codec other;
    ref_make(&other, "pq16x8", L + 1);
    dqc_decompress_args da = {.profile = other.pbytes,
                              .profile_len = other.plen,
                              .kind = 0,
                              .tokens = 4,
                              .records = cr.records,
                              .records_bytes = cr.records_bytes,
                              .out_dtype = DQ_DTYPE_F32};
    dqc_decompress_result dr = {0};
    FAILS(c, DQ_PROFILE, dqc_decompress(c, &da, &dr));
    ref_free(&other);
    dqc_compress_result_free(&cr);
    still_serving(c, &lm, "a calibrated profile without its model");

    dqc_free(c);
    ref_free(&pq);
    ref_free(&lm);
}

/* Daemons with their own flags. */
TestSuite(kvq_flags, .fini = stop, .timeout = 180);

/* --max-calibration-bytes bounds what REGISTER_MODEL takes. */
Test(kvq_flags, oversized_calibration)
{
    ref_codec pq, lm;
    ref_make(&pq, "pq16x8", L);
    ref_make(&lm, "lm3", L);
    char limit[32];
    snprintf(limit, sizeof limit, "%zu", pq.calib_len - 1);
    const char *const extra[] = {"--max-calibration-bytes", limit, NULL};
    start_with(extra);
    dqc_client *c = cli();
    dqc_model_spec spec = {.name = "big",
                           .layers = L,
                           .q_heads = QH,
                           .kv_heads = KVH,
                           .head_dim = HD,
                           .profile = pq.pbytes,
                           .profile_len = pq.plen};
    FAILS(c, DQ_TOO_LARGE, dqc_register_model_calibrated(c, &spec, 0, pq.calib, pq.calib_len, NULL, NULL));
    still_serving(c, &lm, "an oversized calibration");
    dqc_free(c);
    ref_free(&pq);
    ref_free(&lm);
}

/* The disk tier: sequences of a calibrated model evicted to disk come back decoding as before. */
Test(kvq_flags, disk_tier_roundtrip)
{
    ref_codec r;
    ref_make(&r, "pq16x8", L);
    const srv_model m = model_of(&r);
    char dir[200], disk[256];
    snprintf(dir, sizeof dir, "%s", dqd_tmpdir());
    snprintf(disk, sizeof disk, "%s/disk", dir);
    const char *const extra[] = {"--disk-dir", disk, "--host-memory", "4M", "--workers", "2", NULL};
    start_with(extra);
    dqc_client *c = cli();
    OK(c, register_as(c, MODEL, L, &r, "pq16x8", NULL));
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
    for (int i = 0; i < NSEQ; i++)
        srv_check_seq(c, &m, key[i], ref[i], T, key[i]);
    cr_assert_gt(stat_counter(c, "disk_loads"), 0, "nothing was read back from disk");
    dqc_free(c);

    /* A restart registers the model again from its records and their calibration file. */
    stop();
    start_with(extra);
    c = cli();
    cr_assert_eq(stat_counter(c, "disk_recovered"), NSEQ, "records recovered after the restart");
    for (int i = 0; i < NSEQ; i++)
        srv_check_seq(c, &m, key[i], ref[i], T, key[i]);
    int existed = 0;
    OK(c, register_as(c, MODEL, L, &r, "pq16x8", &existed));
    cr_assert_eq(existed, 1, "the recovered model is the one registered before");
    dqc_free(c);

    /* Without its calibration file the records cannot be served: dropped at the start, a miss. */
    stop();
    char cal[300];
    snprintf(cal, sizeof cal, "%s/kvqcal-%016llx.dqkc", disk, (unsigned long long)r.p.kvq_calib_hash);
    cr_assert_eq(unlink(cal), 0, "no calibration file %s", cal);
    start_with(extra);
    c = cli();
    cr_assert_eq(stat_counter(c, "disk_recovered"), 0);
    dqc_get_result g = {0};
    dqc_get_args ga = {.seq = {NULL, key[0], strlen(key[0])}, .dtype = DQ_DTYPE_F32};
    FAILS(c, DQ_NOT_FOUND, dqc_get(c, &ga, &g));
    OK(c, register_as(c, MODEL, L, &r, "pq16x8", &existed));
    cr_assert_eq(existed, 0);
    for (int i = 0; i < NSEQ; i++)
        for (uint32_t l = 0; l < L; l++)
            dq_layer_free(ref[i][l]);
    dqc_free(c);
    ref_free(&r);
    char cmd[300];
    stop();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}
