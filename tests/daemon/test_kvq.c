/* The KVQuant++ codec family (dquant/kvq.h) served by a real dquantd ($DQUANTD), through
 * libdquant-client, against the same codec in-process (libdquant: dq_codec_create_calibrated and
 * the per-layer views of dq_codec_layer) as the reference:
 *   - models of "lm3", "ip3", "pq16x8" (with a per-layer calibration sent by REGISTER_MODEL),
 *     "ip3+lr4", "ol3+d16" (calibrated outliers, delta coding) and "lmh2" (Haar rotation): PUT then GET (bit-exact with dq_layer_decode of the same tokens), GET_RAW (the
 *     same window records and tails), ATTEND over every layer in one request (bit-exact with
 *     dq_attend of the layer's view), COMPRESS / DECOMPRESS of a model layer (the same records as
 *     dq_tokens_encode of that layer's view, decoded as dq_tokens_decode does);
 *   - the calibration is used per layer: one input compressed for two layers gives two record
 *     runs, each decoding as its own layer's view and differently from the other's;
 *   - bad calibrations (missing, truncated, a flipped byte, another layer count, one for a profile
 *     that takes none, one larger than --max-calibration-bytes) and unknown codec parameters
 *     ("pq0x8", "lm9", "ip1") get their error codes, and the daemon keeps serving;
 *   - the disk tier: sequences of a calibrated model spilled to disk and read back decode as before,
 *     also after a restart (the model registered again with the calibration kept on disk).
 * With $DQ_KVQ_BACKEND=cuda the same runs on dquantd-fakecuda's cuda backend, where KVQ models take
 * the host path. Skipped when $DQUANTD is unset. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_check.h"
#include "dqd_child.h"
#include "dquant/attention.h"
#include "dquant/client.h"
#include "dquant/codec.h"
#include "dquant/kvq.h"
#include "dquant/layer.h"

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
    float *x = malloc(layers * n * ROW * sizeof *x);
    cr_assert(x);
    for (uint32_t l = 0; l < layers; l++)
        for (uint64_t t = 0; t < n; t++)
            for (uint32_t j = 0; j < ROW; j++)
                x[(l * n + t) * ROW + j] = val(id, l, start + t, j, is_v);
    return x;
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

/* ---- the daemon ---- */

static void start_with(const char *const *extra)
{
    if (!dqd_path())
        cr_skip_test("$DQUANTD is not set");
    const dqd_opts o = {.extra = extra};
    cr_assert_eq(dqd_start(&D, &o), 0, "could not start the daemon");
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

/* One PUT of tokens [start, start + n) of every layer of sequence `key`, and the same appended to
 * the reference layers. */
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
            cr_assert_eq(dq_layer_create(view(r, l), &ref[l]), 0);
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
    for (uint32_t l = 0; l < L; l++) {
        for (int kind = 0; kind < 2; kind++) {
            cr_assert_eq(dq_layer_decode(ref[l], r->ws, (dq_kind)kind, 0, tokens, want, DQ_DTYPE_F32), 0);
            const float *got = (const float *)(kind ? g.v : g.k) + l * tokens * ROW;
            cr_assert(memcmp(got, want, tokens * ROW * sizeof *want) == 0, "%s: GET layer %u %s differs", what, l,
                      kind ? "V" : "K");
        }
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
        for (size_t w = 0; w < rl->windows; w++)
            cr_assert(memcmp(rl->records + w * wb, dq_layer_window(ref[l], w), wb) == 0,
                      "%s: layer %u window %zu differs", what, l, w);
        size_t tb = rl->tail_tokens * ROW * 2;
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
        cr_assert_eq(dq_attend(view(r, l), r->ws, QH, 1.0f / sqrtf(HD), &ri, 1), 0);
        cr_assert(memcmp(out[l], rout, sizeof rout) == 0 && memcmp(lse[l], rlse, sizeof rlse) == 0,
                  "%s: ATTEND of layer %u differs from dq_attend over its view", what, l);
    }
}

/* COMPRESS of x (ntok tokens of one kind) with model layer `layer`; the records and window headers
 * equal dq_tokens_encode's with that layer's view, and DECOMPRESS of them equals
 * dq_tokens_decode's. Returns the records (malloc'd, *rb_out bytes each). */
static uint8_t *compress_check(dqc_client *c, const ref_codec *r, uint32_t layer, int kind, const float *x,
                               uint64_t ntok)
{
    const dq_codec *vw = view(r, layer);
    const size_t rb = dq_codec_record_bytes(r->codec, (dq_kind)kind), mb = dq_codec_mean_bytes(r->codec);
    const uint32_t W = r->p.window;
    const uint64_t blocks = (ntok + W - 1) / W;
    const bool header = kind == 0 && mb;
    uint8_t *rec = calloc(ntok, rb), *means = calloc(blocks, mb ? mb : 1);
    float *dec = malloc(ntok * ROW * sizeof *dec);
    for (uint64_t b = 0; b < blocks; b++) {
        uint64_t t0 = b * W, cnt = ntok - t0 < W ? ntok - t0 : W;
        cr_assert_eq(dq_tokens_encode(vw, r->ws, (dq_kind)kind, x + t0 * ROW, DQ_DTYPE_F32, cnt,
                                      header ? means + b * mb : NULL, rec + t0 * rb, rb, NULL),
                     0);
        cr_assert_eq(dq_tokens_decode(vw, r->ws, (dq_kind)kind, header ? means + b * mb : NULL, rec + t0 * rb, rb, cnt,
                                      dec + t0 * ROW, DQ_DTYPE_F32),
                     0);
    }

    dqc_compress_args ca = {
        .model = MODEL, .kv_heads = KVH, .head_dim = HD, .kind = kind, .dtype = DQ_DTYPE_F32, .x = x, .tokens = ntok};
    dqc_compress_result cr = {0};
    OK(c, dqc_compress_layer(c, &ca, layer, &cr));
    cr_assert_eq(cr.profile_len, r->plen);
    cr_assert(memcmp(cr.profile, r->pbytes, r->plen) == 0);
    cr_assert_eq(cr.records_bytes, ntok * rb);
    cr_assert(memcmp(cr.records, rec, ntok * rb) == 0, "COMPRESS layer %u kind %d: records differ", layer, kind);
    cr_assert_eq(cr.means_bytes, header ? blocks * mb : 0);
    cr_assert(!header || memcmp(cr.means, means, blocks * mb) == 0, "COMPRESS layer %u: window headers differ", layer);

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
    OK(c, dqc_decompress_layer(c, &da, layer, &dr));
    cr_assert_eq(dr.bytes, ntok * ROW * sizeof(float));
    cr_assert(memcmp(dr.x, dec, dr.bytes) == 0, "DECOMPRESS layer %u kind %d differs from dq_tokens_decode", layer,
              kind);
    dqc_decompress_result_free(&dr);
    dqc_compress_result_free(&cr);
    free(means);
    free(dec);
    return rec;
}

/* ---- serving each codec end to end ---- */

static void serve(const char *pname)
{
    ref_codec r;
    ref_make(&r, pname, L);
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
    put(c, "s", ref, &r, 0, n1);
    put(c, "s", ref, &r, n1, n2);
    check_seq(c, "s", ref, &r, n1 + n2, pname);
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
    float ak[ROW], av[ROW], q[QH * HD], out[QH * HD], lse[QH], rout[QH * HD], rlse[QH];
    for (int i = 0; i < ROW; i++) {
        ak[i] = val(7, 2, 0, (uint32_t)i, 0);
        av[i] = val(7, 2, 0, (uint32_t)i, 1);
    }
    for (int i = 0; i < QH * HD; i++)
        q[i] = val(8, 2, 0, (uint32_t)i, 0);
    dqc_attend_item it = {.seq = {NULL, "s", 1}, .layer = 2, .q = q, .append_k = ak, .append_v = av};
    dqc_attend_args aa = {
        .items = &it, .nitems = 1, .q_heads = QH, .kv_heads = KVH, .head_dim = HD, .dtype = DQ_DTYPE_F32};
    OK(c, dqc_attend(c, &aa, out, lse));
    cr_assert_eq(dq_layer_append(ref[2], r.ws, ak, av, DQ_DTYPE_F32, 1, NULL), 0);
    dq_attn_item ri = {ref[2], q, rout, rlse};
    cr_assert_eq(dq_attend(view(&r, 2), r.ws, QH, 1.0f / sqrtf(HD), &ri, 1), 0);
    cr_assert(memcmp(out, rout, sizeof out) == 0 && memcmp(lse, rlse, sizeof lse) == 0,
              "%s: ATTEND with an append differs", pname);

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
        put(c, key[i], ref[i], &r, 0, T);
    }
    cr_assert_gt(stat_counter(c, "disk_spills"), 0, "nothing was spilled: the test proves nothing");
    for (int i = 0; i < NSEQ; i++)
        check_seq(c, key[i], ref[i], &r, T, key[i]);
    cr_assert_gt(stat_counter(c, "disk_loads"), 0, "nothing was read back from disk");
    dqc_free(c);

    /* A restart registers the model again from its records and their calibration file. */
    stop();
    start_with(extra);
    c = cli();
    cr_assert_eq(stat_counter(c, "disk_recovered"), NSEQ, "records recovered after the restart");
    for (int i = 0; i < NSEQ; i++)
        check_seq(c, key[i], ref[i], &r, T, key[i]);
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
