/* dq_hot_rebuild (dquant/hot.h), the inverse of dq_hot_transcode: every window record of random
 * and of real KV (bytellama-19m and bytellama-n1024 from $DQ_DATA_DIR, skipped when absent),
 * transcoded and rebuilt, equals the original bit for bit, for dq226, dq196, custom level counts and
 * stream lengths that are not multiples of 32; a corrupt hot window (dq_hot_check fails) or one
 * whose levels fit no container gives a clear error and a zeroed window, never a record. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x4e6b1dull);
}

TestSuite(hot_rebuild, .init = suite_init);

static const char *const profiles[] = {"dq226", "dq196", "dq226p", "dq196p"};

typedef struct rb_shape {
    int profile; /* index in profiles; with levels_k != 0 a custom profile */
    uint32_t kv_heads, head_dim;
    uint32_t levels_k, levels_v;
} rb_shape;

static dq_codec *shape_codec(const rb_shape *rs)
{
    if (!rs->levels_k)
        return dqt_codec_builtin(profiles[rs->profile], rs->kv_heads, rs->head_dim);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = rs->kv_heads;
    pp.head_dim = rs->head_dim;
    pp.levels[0] = rs->levels_k;
    pp.levels[1] = rs->levels_v;
    pp.container_bytes[0] = pp.container_bytes[1] = rs->kv_heads * rs->head_dim * 7 / 10 + 8;
    return dqt_codec_make(&pp);
}

/* Transcodes win, rebuilds it into a buffer prefilled with garbage and compares byte for byte. */
static void check_round_trip(const dq_codec *codec, const uint8_t *win, const char *what, size_t index)
{
    const size_t wb = dq_codec_window_bytes(codec), hb = dq_hot_window_bytes(codec);
    uint8_t *hot = dqt_xmalloc(hb), *back = dqt_xmalloc(wb);
    cr_assert_eq(dq_hot_transcode(codec, win, hot), DQ_OK, "%s window %zu: transcode", what, index);
    memset(back, 0x5c, wb);
    const int rc = dq_hot_rebuild(codec, hot, hb, back);
    cr_assert_eq(rc, DQ_OK, "%s window %zu: rebuild %s", what, index, dq_err_name(rc));
    size_t first = wb;
    for (size_t i = 0; i < wb && first == wb; i++)
        if (back[i] != win[i])
            first = i;
    cr_assert_eq(first, wb, "%s window %zu: rebuilt record differs at byte %zu of %zu", what, index, first, wb);
    free(hot);
    free(back);
}

/* Random windows: Gaussian channels with offsets (the key mean matters), a constant stream (s = 0),
 * a stream with one outlier (an extreme grid, most values in the central levels) and heavy tails. */
static void random_window(uint32_t n, size_t W, float *k, float *v, int rep)
{
    for (uint32_t j = 0; j < n; j++) {
        const float off = (float)(1.5 * dqt_normal(&rng));
        for (size_t t = 0; t < W; t++) {
            k[t * n + j] = off + (float)dqt_normal(&rng);
            const double z = dqt_normal(&rng);
            v[t * n + j] = (float)(rep == 2 ? z * z * z : z * (1.0 + 0.5 * (j % 3)));
        }
    }
    for (uint32_t j = 0; j < n; j++) {
        v[3 * n + j] = 0.75f; /* token 3: a constant value stream */
        k[4 * n + j] = 0.0f;  /* token 4: keys all zero but one outlier */
        v[5 * n + j] = j ? 0.01f : 0.0f;
    }
    k[4 * n + n / 2] = 40.0f;
}

ParameterizedTestParameters(hot_rebuild, random)
{
    static rb_shape shapes[] = {
        {0, 8, 128, 0, 0}, /* dq226 in production: n = 1024 */
        {1, 8, 128, 0, 0}, /* dq196 at n = 1024 */
        {1, 2, 64, 0, 0},  /* dq196, n = 128 */
        {0, 1, 16, 0, 0},  /* n = 16: half a group */
        {1, 3, 16, 0, 0},  /* n = 48: a group and a half */
        {0, 5, 16, 0, 0},  /* n = 80 */
        {0, 2, 32, 32, 2}, /* 5 and 1 bits: codes straddling words, one-bit codes */
        {0, 3, 32, 16, 9}, /* n = 96, 4 bits for M = 9 */
        {2, 8, 128, 0, 0}, /* format version 2 (joint pairs) */
        {3, 3, 16, 0, 0},
    };
    return cr_make_param_array(rb_shape, shapes, sizeof shapes / sizeof shapes[0]);
}

ParameterizedTest(rb_shape *rs, hot_rebuild, random)
{
    dq_codec *codec = shape_codec(rs);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t W = dq_codec_profile(codec)->window;
    float *k = dqt_xmalloc(W * n * sizeof(float)), *v = dqt_xmalloc(W * n * sizeof(float));
    uint8_t *win = dqt_xmalloc(dq_codec_window_bytes(codec));
    for (int rep = 0; rep < 3; rep++) {
        random_window(n, W, k, v, rep);
        cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
        check_round_trip(codec, win, "random", (size_t)rep);
    }
    free(k);
    free(v);
    free(win);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

static uint16_t *load(const char *model, const char *name, size_t count)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", dqt_data_dir(), model, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint16_t *buf = dqt_xmalloc(count * 2);
    const size_t got = fread(buf, 2, count, f);
    fclose(f);
    if (got != count) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Every window of a set of layers: slabs[i] is [tokens, stride] fp16 of K (i even) or V (i odd);
 * the codec's n channels starting at channel first of each token are its streams. Returns the
 * number of windows checked. */
static size_t real_windows(const dq_codec *codec, const uint16_t *const *slabs, size_t nslab, size_t tokens,
                           size_t stride, size_t first, const char *what)
{
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t W = dq_codec_profile(codec)->window;
    uint16_t *k = dqt_xmalloc(W * n * 2), *v = dqt_xmalloc(W * n * 2);
    uint8_t *win = dqt_xmalloc(dq_codec_window_bytes(codec));
    size_t count = 0;
    for (size_t s = 0; s + 1 < nslab; s += 2) {
        for (size_t w = 0; (w + 1) * W <= tokens; w++) {
            for (size_t t = 0; t < W; t++) {
                memcpy(k + t * n, slabs[s] + (w * W + t) * stride + first, n * 2);
                memcpy(v + t * n, slabs[s + 1] + (w * W + t) * stride + first, n * 2);
            }
            cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F16, win, NULL), DQ_OK);
            check_round_trip(codec, win, what, count);
            count++;
        }
    }
    free(k);
    free(v);
    free(win);
    dq_workspace_free(ws);
    return count;
}

/* bytellama-19m: kv_f16.bin [2 seq][2 kind][6 layer][1024 token][2 × 128]; 96 windows per profile,
 * and the same data cut to n = 48 (3 heads × 16: channels 0..47 of each token). */
Test(hot_rebuild, bytellama_19m)
{
    enum { SEQS = 2, LAYERS = 6, TOKENS = 1024, N = 256 };
    uint16_t *data = load("bytellama-19m", "kv_f16.bin", (size_t)SEQS * 2 * LAYERS * TOKENS * N);
    if (!data)
        cr_skip("real-data test skipped: %s/bytellama-19m/kv_f16.bin is absent (set DQ_DATA_DIR)", dqt_data_dir());
    const uint16_t *slabs[SEQS * LAYERS * 2];
    size_t ns = 0;
    for (size_t seq = 0; seq < SEQS; seq++)
        for (size_t l = 0; l < LAYERS; l++)
            for (size_t kind = 0; kind < 2; kind++)
                slabs[ns++] = data + ((seq * 2 + kind) * LAYERS + l) * TOKENS * N;
    for (size_t p = 0; p < 2; p++) {
        dq_codec *codec = dqt_codec_builtin(profiles[p], 2, 128);
        cr_assert_eq(real_windows(codec, slabs, ns, TOKENS, N, 0, profiles[p]), 96);
        dq_codec_free(codec);
        codec = dqt_codec_builtin(profiles[p], 3, 16);
        cr_assert_eq(real_windows(codec, slabs, ns, TOKENS, N, 0, profiles[p]), 96);
        dq_codec_free(codec);
    }
    free(data);
}

/* bytellama-n1024: kv_f16.bin [2 kind][4 layer][512 token][8 × 128], the production n = 1024;
 * 16 windows per profile. */
Test(hot_rebuild, bytellama_n1024)
{
    enum { LAYERS = 4, TOKENS = 512, N = 1024 };
    uint16_t *data = load("bytellama-n1024", "kv_f16.bin", (size_t)2 * LAYERS * TOKENS * N);
    if (!data)
        cr_skip("real-data test skipped: %s/bytellama-n1024/kv_f16.bin is absent (set DQ_DATA_DIR)", dqt_data_dir());
    const uint16_t *slabs[LAYERS * 2];
    for (size_t l = 0; l < LAYERS; l++)
        for (size_t kind = 0; kind < 2; kind++)
            slabs[2 * l + kind] = data + (kind * LAYERS + l) * TOKENS * N;
    for (size_t p = 0; p < 2; p++) {
        dq_codec *codec = dqt_codec_builtin(profiles[p], 8, 128);
        cr_assert_eq(real_windows(codec, slabs, 2 * LAYERS, TOKENS, N, 0, profiles[p]), 16);
        dq_codec_free(codec);
    }
    free(data);
}

static int all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return 0;
    return 1;
}

/* Corrupt hot windows: the error of dq_hot_check, and the output zeroed. Levels dq_hot_check
 * accepts but no container of C bytes can hold (every value at the rarest level): DQ_CORRUPT.
 * Arguments and a codec without a hot layout. */
Test(hot_rebuild, bad_input)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 3, 16); /* n = 48: padding channels exist */
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t W = dq_codec_profile(codec)->window, hb = dq_hot_window_bytes(codec);
    const size_t wb = dq_codec_window_bytes(codec);
    float *k = dqt_xmalloc(W * n * sizeof(float)), *v = dqt_xmalloc(W * n * sizeof(float));
    random_window(n, W, k, v, 0);
    uint8_t *win = dqt_xmalloc(wb), *back = dqt_xmalloc(wb), *hot = dqt_xmalloc(hb), *bad = dqt_xmalloc(hb);
    cr_assert_eq(dq_window_encode(codec, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
    cr_assert_eq(dq_hot_transcode(codec, win, hot), DQ_OK);
    size_t off[4];
    dq_hot_offsets(codec, off);
    const uint32_t bk = dq_hot_bits(codec, DQ_KIND_K);

    /* short */
    memset(back, 0xee, wb);
    cr_assert_eq(dq_hot_rebuild(codec, hot, hb - 1, back), DQ_TRUNCATED);
    cr_assert(all_zero(back, wb));
    /* each corruption dq_hot_check reports: the rebuild reports it too, and writes no record */
    struct {
        size_t at;
        uint8_t or_mask;
    } flips[] = {
        {off[0] - 1, 0x01},                              /* mean block padding */
        {1, 0x7c},                                       /* mean scale infinite */
        {off[0] + 4 * 9 + 1, 0x80},                      /* a key s negative */
        {off[1] + 4 * 2 + 3, 0x7c},                      /* a value o infinite */
        {off[3] + 4 * 5, 0x07},                          /* a value code 7 >= M_V = 6 */
        {off[2] + 4 * ((1 * bk + 1) * W + 3) + 3, 0x80}, /* group 1, bit 63: channel 53 >= n */
    };
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(bad, hot, hb);
        bad[flips[i].at] |= flips[i].or_mask;
        const int crc = dq_hot_check(codec, bad, hb);
        cr_assert_eq(crc, DQ_CORRUPT, "flip %zu: check %s", i, dq_err_name(crc));
        memset(back, 0xee, wb);
        cr_assert_eq(dq_hot_rebuild(codec, bad, hb, back), DQ_CORRUPT, "flip %zu", i);
        cr_assert(all_zero(back, wb), "flip %zu: a partial record was left", i);
    }
    /* valid codes, impossible levels: every key at the least probable level needs far more than C */
    const dq_profile *p = dq_codec_profile(codec);
    uint32_t rare = 0;
    for (uint32_t m = 1; m < p->levels[0]; m++)
        if (p->freq[0][m] < p->freq[0][rare])
            rare = m;
    memcpy(bad, hot, hb);
    memset(bad + off[2], 0, off[3] - off[2]);
    for (size_t t = 0; t < W; t++)
        for (uint32_t j = 0; j < n; j++) {
            const size_t g = j / 32, pos = (size_t)(j % 32) * bk;
            const uint64_t val = (uint64_t)rare << (pos % 32);
            uint8_t *w0 = bad + off[2] + 4 * ((g * bk + pos / 32) * W + t);
            for (int byte = 0; byte < 4; byte++)
                w0[byte] |= (uint8_t)(val >> (8 * byte));
            if (val >> 32)
                w0[4 * W] |= (uint8_t)(val >> 32);
        }
    cr_assert_eq(dq_hot_check(codec, bad, hb), DQ_OK);
    memset(back, 0xee, wb);
    cr_assert_eq(dq_hot_rebuild(codec, bad, hb, back), DQ_CORRUPT);
    cr_assert(all_zero(back, wb));

    /* arguments, and a codec that is not D-Quant */
    cr_assert_eq(dq_hot_rebuild(NULL, hot, hb, back), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_hot_rebuild(codec, NULL, hb, back), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_hot_rebuild(codec, hot, hb, NULL), DQ_INVALID_ARGUMENT);
    dq_codec *base = dqt_codec_builtin("int2", 3, 16);
    cr_assert_eq(dq_hot_rebuild(base, hot, hb, back), DQ_UNSUPPORTED);
    dq_codec_free(base);
    /* and the untouched window still rebuilds */
    cr_assert_eq(dq_hot_rebuild(codec, hot, hb, back), DQ_OK);
    cr_assert(memcmp(back, win, wb) == 0);

    free(k);
    free(v);
    free(win);
    free(back);
    free(hot);
    free(bad);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The fixed-width family (dq_profile_fixed): a rebuild packs the hot window's levels base-M again
 * (the encoder's packer), byte for byte the record; codes >= M are refused. */
Test(hot_rebuild, fixed_family)
{
    static const struct {
        const char *name;
        uint32_t kv_heads, head_dim;
    } cases[] = {
        {"fixed226", 8, 128},  /* M 6 / 3 at n = 1024: 3 + 2 bits */
        {"fixed196", 8, 128},  /* M 3 / 2: 2 + 1 bits */
        {"fixed226", 3, 16},   /* n = 48: a group and a half */
        {"fixedk7v5", 2, 64},  /* 3 + 3 bits, base-7 groups */
        {"fixedk17v2", 5, 16}, /* 5 + 1 bits: codes straddling words */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dq_codec *codec = dqt_codec_builtin(cases[c].name, cases[c].kv_heads, cases[c].head_dim);
        cr_assert_eq(dq_codec_profile(codec)->codec_type, DQ_CODEC_FIXED, "%s", cases[c].name);
        dq_workspace *ws;
        cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
        const uint32_t n = dq_codec_stream_len(codec);
        const size_t W = dq_codec_profile(codec)->window, T = 3 * W;
        float *k = dqt_xmalloc(T * n * sizeof(float)), *v = dqt_xmalloc(T * n * sizeof(float));
        for (int rep = 0; rep < 3; rep++)
            random_window(n, W, k + rep * W * n, v + rep * W * n, rep);
        dq_layer *layer;
        cr_assert_eq(dq_layer_create(codec, &layer), DQ_OK);
        cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
        cr_assert_geq(dq_layer_window_count(layer), 2);
        for (size_t w = 0; w < dq_layer_window_count(layer); w++)
            check_round_trip(codec, dq_layer_window(layer, w), cases[c].name, w);

        /* a value code of M (>= M, within its b bits) in channel 0 of token 1: no record holds it */
        const size_t wb = dq_codec_window_bytes(codec), hb = dq_hot_window_bytes(codec);
        const uint32_t M = dq_codec_profile(codec)->levels[1], b = dq_hot_bits(codec, DQ_KIND_V);
        uint8_t *hot = dqt_xmalloc(hb), *back = dqt_xmalloc(wb);
        cr_assert_eq(dq_hot_transcode(codec, dq_layer_window(layer, 0), hot), DQ_OK);
        if (M < (1u << b)) {
            size_t off[4];
            dq_hot_offsets(codec, off);
            uint8_t *w0 = hot + off[3] + 4 * 1;
            w0[0] = (uint8_t)((w0[0] & ~((1u << b) - 1)) | M);
            memset(back, 0x5c, wb);
            cr_assert_eq(dq_hot_rebuild(codec, hot, hb, back), DQ_CORRUPT, "%s", cases[c].name);
            cr_assert(all_zero(back, wb));
        }
        free(hot);
        free(back);
        free(k);
        free(v);
        dq_layer_free(layer);
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
}
