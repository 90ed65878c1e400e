/* The hot layout (dquant/hot.h): transcoding is lossless (levels, reconstruction and attention
 * bit-identical to the window records'), the layout's size, and bad input (short, corrupt, wrong
 * codec, bad arguments) gives clear errors. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x4071a7u);
}

TestSuite(hot, .init = suite_init);

/* Criterion passes parameters to another process: no pointers in them (the profile by index). */
static const char *const profiles[] = {"dq226", "dq196", "dq226p", "dq196p"};

typedef struct hot_shape {
    int profile; /* index in profiles; with levels_k != 0 a custom profile */
    uint32_t kv_heads, head_dim;
    uint32_t levels_k, levels_v; /* 0: the profile's */
    uint32_t window;             /* custom profiles: 0 for the default */
} hot_shape;

static dq_codec *shape_codec(const hot_shape *hs)
{
    if (!hs->levels_k)
        return dqt_codec_builtin(profiles[hs->profile], hs->kv_heads, hs->head_dim);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = hs->kv_heads;
    pp.head_dim = hs->head_dim;
    pp.levels[0] = hs->levels_k;
    pp.levels[1] = hs->levels_v;
    /* containers at ~0.7 bytes per value: room for any of these level counts */
    pp.container_bytes[0] = pp.container_bytes[1] = hs->kv_heads * hs->head_dim * 7 / 10 + 8;
    if (hs->window)
        pp.window = hs->window;
    return dqt_codec_make(&pp);
}

ParameterizedTestParameters(hot, round_trip)
{
    static hot_shape shapes[] = {
        {0, 8, 128, 0, 0, 0}, /* dq226 in production: n = 1024, 3 + 3 bits */
        {1, 2, 64, 0, 0, 0},  /* dq196: M 7/5, 3 bits each */
        {0, 1, 16, 0, 0, 0},  /* n = 16: half a group, zero-padded */
        {0, 2, 32, 32, 2, 0}, /* 5 and 1 bits: codes straddling words, one-bit codes */
        {0, 1, 64, 16, 9, 0}, /* 4 bits, and 4 bits for M = 9 */
        {0, 1, 64, 8, 6, 37}, /* an odd window: the last value pair's high half is the missing token */
        {2, 8, 128, 0, 0, 0}, /* format version 2 (joint pairs) */
        {3, 2, 64, 0, 0, 0},
    };
    return cr_make_param_array(hot_shape, shapes, sizeof shapes / sizeof shapes[0]);
}

ParameterizedTest(hot_shape *hs, hot, round_trip)
{
    dq_codec *codec = shape_codec(hs);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const dq_profile *p = dq_codec_profile(codec);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t W = p->window;
    float *k = dqt_xmalloc(W * n * sizeof(float)), *v = dqt_xmalloc(W * n * sizeof(float));
    uint8_t *win = dqt_xmalloc(dq_codec_window_bytes(codec));
    const size_t hb = dq_hot_window_bytes(codec);
    cr_assert_gt(hb, 0);
    uint8_t *hot = dqt_xmalloc(hb);
    float *a = dqt_xmalloc(W * n * sizeof(float)), *b = dqt_xmalloc(W * n * sizeof(float));
    uint8_t *la = dqt_xmalloc(n), *lb = dqt_xmalloc(n);
    for (int rep = 0; rep < 3; rep++) {
        dqt_random_kv(&rng, n, W, k, v);
        cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
        memset(hot, 0xa5, hb); /* every byte must be written */
        cr_assert_eq(dq_hot_transcode(codec, win, hot), DQ_OK);
        cr_assert_eq(dq_hot_check(codec, hot, hb), DQ_OK);
        if (W % 2) {
            /* the missing token W's half of the last value pair word must stay zero */
            size_t off[4];
            dq_hot_offsets(codec, off);
            uint8_t *half = hot + off[3] + 4 * (W / 2) + 2;
            cr_assert_eq(half[0] | half[1], 0);
            half[0] = 1;
            cr_assert_eq(dq_hot_check(codec, hot, hb), DQ_CORRUPT);
            half[0] = 0;
        }
        for (int kind = 0; kind < 2; kind++) {
            const dq_kind kd = (dq_kind)kind;
            for (size_t t = 0; t < W; t++) {
                cr_assert_eq(dq_stream_decode_levels(codec, kd, dq_window_record(codec, win, kd, t), la), DQ_OK);
                cr_assert_eq(dq_hot_levels(codec, hot, kd, t, lb), DQ_OK);
                cr_assert(memcmp(la, lb, n) == 0, "levels of token %zu kind %d differ", t, kind);
            }
            const uint8_t *mean = kd == DQ_KIND_K ? dq_window_mean(codec, win) : NULL;
            const dq_dtype dts[] = {DQ_DTYPE_F32, DQ_DTYPE_BF16, DQ_DTYPE_F16};
            for (size_t di = 0; di < 3; di++) {
                const size_t es = dq_dtype_size(dts[di]);
                cr_assert_eq(dq_tokens_decode(codec, ws, kd, mean, dq_window_record(codec, win, kd, 0),
                                              dq_codec_record_bytes(codec, kd), W, a, dts[di]),
                             DQ_OK);
                cr_assert_eq(dq_hot_decode(codec, ws, hot, kd, 0, W, b, dts[di]), DQ_OK);
                cr_assert(memcmp(a, b, W * n * es) == 0, "reconstruction differs (kind %d, dtype %d)", kind,
                          (int)dts[di]);
                /* a sub-range lands at its own offset */
                const size_t first = W / 3, cnt = W / 2;
                cr_assert_eq(dq_hot_decode(codec, ws, hot, kd, first, cnt, b, dts[di]), DQ_OK);
                cr_assert(memcmp((uint8_t *)a + first * n * es, b, cnt * n * es) == 0);
            }
        }
    }
    free(k);
    free(v);
    free(win);
    free(hot);
    free(a);
    free(b);
    free(la);
    free(lb);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The layout's size for dq226 at n = 1024: the mean block (1026 B padded to 1040), 8 B of s/o
 * per token, 3 + 3 bits per value: 100 368 B per 128 tokens = 784.1 B per token, against the
 * record's 73 986 B (578.0) and BF16's 4096 B. */
Test(hot, footprint)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 8, 128);
    cr_assert_eq(dq_hot_bits(codec, DQ_KIND_K), 3);
    cr_assert_eq(dq_hot_bits(codec, DQ_KIND_V), 3);
    cr_assert_eq(dq_hot_bits(codec, (dq_kind)2), 0);
    size_t off[4];
    cr_assert_eq(dq_hot_offsets(codec, off), 100368);
    cr_assert_eq(off[0], 1040);
    cr_assert_eq(off[1], 1040 + 512);
    cr_assert_eq(off[2], 2064);
    cr_assert_eq(off[3], 2064 + 49152);
    cr_assert_eq(dq_hot_window_bytes(codec), 100368);
    const double per_tok = 100368.0 / 128, rec = (double)dq_codec_window_bytes(codec) / 128;
    cr_assert_float_eq(rec, 578.015625, 1e-9);
    cr_assert(per_tok / rec > 1.3 && per_tok / rec < 1.4, "hot / record %.3f", per_tok / rec);
    cr_assert(4096.0 / per_tok >= 5.0, "BF16 / hot %.3f", 4096.0 / per_tok);
    dq_codec_free(codec);
}

/* A layer's windows transcoded: dq_hot_attend's outputs and LSE equal dq_attend's exactly (the same
 * levels in the same computation), over windows and a tail, GQA groups 1, 2 and 4. */
Test(hot, attention_matches_records)
{
    const uint32_t KVH = 2, D = 128, n = KVH * D;
    dq_codec *codec = dqt_codec_builtin("dq226", KVH, D);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const size_t W = dq_codec_profile(codec)->window, T = 3 * W + 77;
    float *k = dqt_xmalloc(T * n * sizeof(float)), *v = dqt_xmalloc(T * n * sizeof(float));
    for (size_t t0 = 0; t0 < T; t0 += W)
        dqt_random_kv(&rng, n, T - t0 < W ? T - t0 : W, k + t0 * n, v + t0 * n);
    dq_layer *layer;
    cr_assert_eq(dq_layer_create(codec, &layer), DQ_OK);
    cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    const size_t nwin = dq_layer_window_count(layer), hb = dq_hot_window_bytes(codec);
    cr_assert_eq(nwin, 3);
    uint8_t *hot = dqt_xmalloc(nwin * hb);
    const uint8_t *hp[3];
    for (size_t w = 0; w < nwin; w++) {
        cr_assert_eq(dq_hot_transcode(codec, dq_layer_window(layer, w), hot + w * hb), DQ_OK);
        hp[w] = hot + w * hb;
    }
    for (uint32_t G = 1; G <= 4; G *= 2) {
        const uint32_t QH = KVH * G;
        float *q = dqt_xmalloc(2 * QH * D * sizeof(float));
        float *o1 = dqt_xmalloc(2 * QH * D * sizeof(float)), *o2 = dqt_xmalloc(2 * QH * D * sizeof(float));
        float l1[16], l2[16];
        for (size_t i = 0; i < 2 * QH * D; i++)
            q[i] = (float)dqt_normal(&rng);
        const float scale = 1.0f / sqrtf((float)D);
        dq_attn_item it[2] = {{layer, q, o1, l1}, {layer, q + QH * D, o1 + QH * D, l1 + QH}};
        cr_assert_eq(dq_attend(codec, ws, QH, scale, it, 2), DQ_OK);
        /* item 0 over the windows and the tail; item 1 over the windows alone */
        dq_hot_item hi[2] = {
            {hp, nwin, dq_layer_tail(layer, DQ_KIND_K), dq_layer_tail(layer, DQ_KIND_V), dq_layer_tail_tokens(layer), q,
             o2, l2},
            {hp, nwin, NULL, NULL, 0, q + QH * D, o2 + QH * D, l2 + QH},
        };
        cr_assert_eq(dq_hot_attend(codec, ws, QH, scale, hi, 2), DQ_OK);
        cr_assert(memcmp(o1, o2, QH * D * sizeof(float)) == 0, "outputs differ (G %u)", G);
        cr_assert(memcmp(l1, l2, QH * sizeof(float)) == 0, "LSE differs (G %u)", G);
        /* item 1 had no tail: it must differ from dq_attend's (which had one) yet be finite */
        cr_assert(memcmp(o1 + QH * D, o2 + QH * D, QH * D * sizeof(float)) != 0);
        for (size_t i = 0; i < QH * D; i++)
            cr_assert(isfinite(o2[QH * D + i]));
        free(q);
        free(o1);
        free(o2);
    }
    free(hot);
    free(k);
    free(v);
    dq_layer_free(layer);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

Test(hot, bad_input)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 64);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t W = dq_codec_profile(codec)->window, hb = dq_hot_window_bytes(codec);
    float *k = dqt_xmalloc(W * n * sizeof(float)), *v = dqt_xmalloc(W * n * sizeof(float));
    dqt_random_kv(&rng, n, W, k, v);
    uint8_t *win = dqt_xmalloc(dq_codec_window_bytes(codec)), *hot = dqt_xmalloc(hb), *bad = dqt_xmalloc(hb);
    cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
    cr_assert_eq(dq_hot_transcode(codec, win, hot), DQ_OK);
    size_t off[4];
    dq_hot_offsets(codec, off);

    /* short */
    cr_assert_eq(dq_hot_check(codec, hot, hb - 1), DQ_TRUNCATED);
    cr_assert_eq(dq_hot_check(codec, hot, 0), DQ_TRUNCATED);
    cr_assert_eq(dq_hot_check(codec, NULL, hb), DQ_INVALID_ARGUMENT);
    /* a value code >= M (M_V = 6: code 7 in channel 0 of token 5: pair 2, high half) */
    memcpy(bad, hot, hb);
    bad[off[3] + 4 * 2 + 2] |= 7;
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_CORRUPT);
    /* a nonzero code past n cannot happen here (n = 128): padding of the mean block instead */
    memcpy(bad, hot, hb);
    bad[off[0] - 1] = 1;
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_CORRUPT);
    /* negative scale, infinite offset, infinite mean scale */
    memcpy(bad, hot, hb);
    bad[off[0] + 4 * 3 + 1] |= 0x80;
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_CORRUPT);
    memcpy(bad, hot, hb);
    bad[off[1] + 4 * 9 + 2] = 0x00;
    bad[off[1] + 4 * 9 + 3] = 0x7c;
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_CORRUPT);
    memcpy(bad, hot, hb);
    bad[0] = 0x00;
    bad[1] = 0x7c;
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_CORRUPT);

    /* a corrupt record: still transcoded in full, reported */
    uint8_t *cw = dqt_xmalloc(dq_codec_window_bytes(codec));
    memcpy(cw, win, dq_codec_window_bytes(codec));
    uint8_t *rec = (uint8_t *)dq_window_record(codec, cw, DQ_KIND_V, 7);
    rec[4] ^= 0xff;
    rec[5] ^= 0x5a;
    cr_assert_eq(dq_hot_transcode(codec, cw, bad), DQ_CORRUPT);
    cr_assert(memcmp(bad + off[2], hot + off[2], off[3] - off[2]) == 0, "the keys are untouched");
    free(cw);

    /* arguments */
    float out[2 * 64 * 128];
    cr_assert_eq(dq_hot_transcode(codec, NULL, bad), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_hot_transcode(NULL, win, bad), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_hot_levels(codec, hot, DQ_KIND_K, W, (uint8_t *)out), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_hot_decode(codec, ws, hot, DQ_KIND_K, W - 1, 2, out, DQ_DTYPE_F32), DQ_OUT_OF_BOUNDS);
    cr_assert_eq(dq_hot_decode(codec, ws, hot, DQ_KIND_K, 0, 1, out, (dq_dtype)7), DQ_DTYPE);
    cr_assert_eq(dq_hot_decode(codec, ws, hot, (dq_kind)3, 0, 1, out, DQ_DTYPE_F32), DQ_INVALID_ARGUMENT);

    /* attention: shapes, queries, missing pointers */
    const uint8_t *hp[1] = {hot};
    float q[4 * 64], lse[4];
    for (size_t i = 0; i < 4 * 64; i++)
        q[i] = (float)dqt_normal(&rng);
    dq_hot_item it = {hp, 1, NULL, NULL, 0, q, out, lse};
    cr_assert_eq(dq_hot_attend(codec, ws, 4, 0.125f, &it, 1), DQ_OK);
    cr_assert_eq(dq_hot_attend(codec, ws, 3, 0.125f, &it, 1), DQ_SHAPE);
    cr_assert_eq(dq_hot_attend(codec, ws, 4, NAN, &it, 1), DQ_INVALID_ARGUMENT);
    q[70] = INFINITY;
    cr_assert_eq(dq_hot_attend(codec, ws, 4, 0.125f, &it, 1), DQ_NONFINITE);
    q[70] = 1e30f;
    cr_assert_eq(dq_hot_attend(codec, ws, 4, 1.0f, &it, 1), DQ_RANGE);
    q[70] = 0.5f;
    it.tail_tokens = 3; /* tail pointers missing */
    cr_assert_eq(dq_hot_attend(codec, ws, 4, 0.125f, &it, 1), DQ_INVALID_ARGUMENT);
    it.tail_tokens = 0;
    const uint8_t *nullwin[1] = {NULL};
    it.windows = nullwin;
    cr_assert_eq(dq_hot_attend(codec, ws, 4, 0.125f, &it, 1), DQ_INVALID_ARGUMENT);

    /* a baseline codec has no hot layout */
    dq_codec *base = dqt_codec_builtin("int2", 2, 64);
    cr_assert_eq(dq_hot_window_bytes(base), 0);
    cr_assert_eq(dq_hot_bits(base, DQ_KIND_K), 0);
    cr_assert_eq(dq_hot_transcode(base, win, bad), DQ_UNSUPPORTED);
    cr_assert_eq(dq_hot_check(base, hot, hb), DQ_UNSUPPORTED);
    dq_codec_free(base);

    free(k);
    free(v);
    free(win);
    free(hot);
    free(bad);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
