/* The fixed-width family (dq_profile_fixed, codec_type DQ_CODEC_FIXED): profile names and packing,
 * reconstructions equal to an independent implementation of the evaluation's fixed-width coder
 * (written here from its description: rotation, INT8 key mean, min–max grid, nearest, refit, fp16,
 * nearest), containers equal to an independent base-M packer, corruption detected, attention and
 * the hot layout identical to the records', and bad input refused with clear codes. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0xf1dedu);
}

TestSuite(fixed, .init = suite_init);

/* ---- the independent reference ---- */

static float ref_half(double v)
{
    return dq_f16_to_f32(dq_f64_to_f16(v));
}

static void ref_nearest(const float *y, uint32_t n, double s, double o, uint32_t top, uint8_t *m)
{
    for (uint32_t i = 0; i < n; i++) {
        double q = s > 0 ? nearbyint(((double)y[i] - o) / s) : 0.0;
        m[i] = (uint8_t)(q < 0 ? 0 : q > top ? top : q);
    }
}

/* One stream: levels m and its reconstruction o + s·m (fp16 s, o). */
static void ref_stream(const float *y, uint32_t n, uint32_t M, uint8_t *m, float *yhat, float *s_out, float *o_out)
{
    float lo = y[0], hi = y[0];
    for (uint32_t i = 1; i < n; i++) {
        lo = fminf(lo, y[i]);
        hi = fmaxf(hi, y[i]);
    }
    const uint32_t top = M - 1;
    double s = ((double)hi - lo) / top, o = lo;
    ref_nearest(y, n, s, o, top, m);
    double sm = 0, sy = 0, smm = 0, smy = 0;
    for (uint32_t i = 0; i < n; i++) {
        sm += m[i];
        sy += y[i];
        smm += (double)m[i] * m[i];
        smy += (double)m[i] * y[i];
    }
    const double var = smm - sm * sm / n;
    if (var > 0) {
        s = (smy - sm * sy / n) / var;
        o = (sy - s * sm) / n;
    } else {
        s = 0;
        o = sy / n;
    }
    const float sh = ref_half(s), oh = ref_half(o);
    ref_nearest(y, n, sh, oh, top, m);
    for (uint32_t i = 0; i < n; i++)
        yhat[i] = oh + sh * (float)m[i];
    *s_out = sh;
    *o_out = oh;
}

/* ntok tokens of one kind (at most one window of keys) through the reference: xhat in the original
 * domain, levels [ntok][n]. */
static void ref_roundtrip(const dq_codec *c, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *lev)
{
    const uint32_t n = dq_codec_stream_len(c), M = dq_codec_profile(c)->levels[kind];
    float *y = dqt_xmalloc(ntok * n * sizeof(float)), *mu = calloc(n, sizeof(float));
    memcpy(y, x, ntok * n * sizeof(float));
    for (size_t t = 0; t < ntok; t++)
        dq_rotate(c, y + t * n);
    if (kind == DQ_KIND_K) {
        /* per channel the float sum in token order / count; scale max|mean| / 127 in fp16; int8 */
        float maxabs = 0;
        for (uint32_t j = 0; j < n; j++) {
            float sum = 0;
            for (size_t t = 0; t < ntok; t++)
                sum += y[t * n + j];
            maxabs = fmaxf(maxabs, fabsf(sum / (float)ntok));
        }
        const float sf = dq_f16_to_f32(dq_f32_to_f16(maxabs / 127.0f));
        for (uint32_t j = 0; j < n; j++) {
            float sum = 0;
            for (size_t t = 0; t < ntok; t++)
                sum += y[t * n + j];
            float r = sf > 0 ? rintf(sum / (float)ntok / sf) : 0.0f;
            r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
            mu[j] = (float)(int8_t)r * sf;
        }
    }
    for (size_t t = 0; t < ntok; t++) {
        float *yt = y + t * n, *out = xhat + t * n, s, o;
        for (uint32_t j = 0; j < n; j++)
            yt[j] -= mu[j];
        ref_stream(yt, n, M, lev + t * n, out, &s, &o);
        for (uint32_t j = 0; j < n; j++)
            out[j] += mu[j];
        dq_unrotate(c, out);
    }
    free(y);
    free(mu);
}

/* The packing written out: groups of k levels, value Σ m_i M^i, w bits each, LSB first. */
static void ref_pack(const uint8_t *lev, uint32_t n, uint32_t M, uint32_t k, uint32_t w, uint8_t *out, uint32_t C)
{
    memset(out, 0, C);
    uint32_t bit = 0;
    for (uint32_t g = 0; g < n; g += k) {
        uint64_t v = 0, p = 1;
        for (uint32_t i = 0; i < k && g + i < n; i++, p *= M)
            v += lev[g + i] * p;
        for (uint32_t b = 0; b < w; b++, bit++)
            if (v >> b & 1)
                out[bit / 8] |= (uint8_t)(1u << (bit % 8));
    }
}

/* ---- profiles ---- */

Test(fixed, profiles)
{
    dq_profile p;
    /* dq226 at n = 1024: C 331 / 231 → M = floor(2^2.586) = 6, floor(2^1.805) = 3 */
    cr_assert_eq(dq_profile_fixed("fixed226", 8, 128, &p), DQ_OK);
    cr_assert_eq(p.codec_type, DQ_CODEC_FIXED);
    cr_assert_eq(p.levels[0], 6);
    cr_assert_eq(p.levels[1], 3);
    cr_assert_eq(p.container_bytes[0], 334); /* 205 groups of 5 levels in 13 bits */
    cr_assert_eq(p.container_bytes[1], 205); /* 205 groups of 5 levels in 8 bits */
    cr_assert_eq(p.window, 128);
    cr_assert_eq(p.rotation_seed, 0x5eed);
    cr_assert_str_eq(p.name, "fixed226");
    /* the same through dq_profile_builtin */
    dq_profile b;
    cr_assert_eq(dq_profile_builtin("fixed226", 8, 128, &b), DQ_OK);
    cr_assert(memcmp(&p, &b, sizeof p) == 0);
    /* dq196: C 287 / 199 → M 4, 2 */
    cr_assert_eq(dq_profile_fixed("fixed196", 8, 128, &p), DQ_OK);
    cr_assert_eq(p.levels[0], 4);
    cr_assert_eq(p.levels[1], 2);
    cr_assert_eq(p.container_bytes[0], 256);
    cr_assert_eq(p.container_bytes[1], 128);
    /* explicit levels */
    cr_assert_eq(dq_profile_fixed("fixedk8v5", 2, 64, &p), DQ_OK);
    cr_assert_eq(p.levels[0], 8);
    cr_assert_eq(p.levels[1], 5);
    cr_assert_eq(p.container_bytes[0], 48);
    cr_assert_eq(dq_profile_fixed("fixedk256v2", 1, 16, &p), DQ_OK);
    cr_assert_eq(p.container_bytes[0], 16);
    cr_assert_eq(p.container_bytes[1], 2);
    /* bits per value: every byte counted, as D-Quant's */
    cr_assert_eq(dq_profile_fixed("fixed226", 8, 128, &p), DQ_OK);
    cr_assert_float_eq(dq_profile_bits_per_value(&p, DQ_KIND_V), 8.0 * 209 / 1024, 1e-12);
    cr_assert_float_eq(dq_profile_bits_per_value(&p, DQ_KIND_K), 8.0 * 338 / 1024 + 8.0 * 1026 / (1024.0 * 128), 1e-12);

    /* serialization round trip */
    uint8_t buf[DQ_PROFILE_SERIALIZED_MAX];
    size_t len;
    cr_assert_eq(dq_profile_serialize(&p, buf, sizeof buf, &len), DQ_OK);
    dq_profile q;
    cr_assert_eq(dq_profile_deserialize(buf, len, &q), DQ_OK);
    cr_assert(memcmp(&p, &q, sizeof p) == 0);
    cr_assert_eq(dq_profile_deserialize(buf, len - 1, &q), DQ_TRUNCATED);

    /* names that are not profiles */
    const char *bad[] = {"fixed",      "fixed999", "fixed22",    "fixedk1v3", "fixedk6v257", "fixedk6",
                         "fixedk6v3x", "fixedkv3", "fixedk-6v3", "fixed226x", "fixe226"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(dq_profile_fixed(bad[i], 8, 128, &q), DQ_PROFILE, "%s", bad[i]);
    cr_assert_eq(dq_profile_fixed("fixed226", 8, 100, &q), DQ_PROFILE);
    cr_assert_eq(dq_profile_fixed(NULL, 8, 128, &q), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_profile_builtin("fixed999", 8, 128, &q), DQ_PROFILE);
    cr_assert_str_eq(dq_profile_fixed_names()[0], "fixed226");

    /* validation: containers must be the packing's, D-Quant fields zero */
    dq_profile v = p;
    v.container_bytes[0]++;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
    v = p;
    v.freq[0][0] = 1;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
    v = p;
    v.alpha = 1.4f;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
    v = p;
    v.levels[1] = 1;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
    v = p;
    v.levels[1] = 300;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
    v = p;
    v.kvq_rank = 1;
    cr_assert_eq(dq_profile_validate(&v), DQ_PROFILE);
}

Test(fixed, packing)
{
    uint32_t k, w;
    cr_assert_eq(dq_fixed_packing(1024, 6, &k, &w), 334);
    cr_assert_eq(k, 5);
    cr_assert_eq(w, 13);
    cr_assert_eq(dq_fixed_packing(1024, 3, &k, &w), 205);
    cr_assert_eq(k, 5);
    cr_assert_eq(w, 8);
    cr_assert_eq(dq_fixed_packing(1024, 8, &k, &w), 384);
    cr_assert_eq(k, 1);
    cr_assert_eq(w, 3);
    cr_assert_eq(dq_fixed_packing(1024, 2, &k, &w), 128);
    cr_assert_eq(dq_fixed_packing(7, 256, &k, &w), 7);
    cr_assert_eq(w, 8);
    cr_assert_eq(dq_fixed_packing(1024, 1, &k, &w), 0);
    cr_assert_eq(dq_fixed_packing(1024, 257, &k, &w), 0);
    cr_assert_eq(dq_fixed_packing(0, 6, &k, &w), 0);
    /* the fewest bytes over every group size whose base-M numbers fit 32 bits, smallest k on ties */
    for (uint32_t n = 1; n <= 1100; n += 13)
        for (uint32_t M = 2; M <= 256; M++) {
            const uint32_t C = dq_fixed_packing(n, M, &k, &w);
            uint32_t best = 0, bk = 0;
            for (uint32_t kk = 1; pow((double)M, kk) <= 4294967296.0; kk++) {
                uint32_t ww = (uint32_t)ceil(kk * log2((double)M) - 1e-9);
                const uint32_t cc = (uint32_t)(((n + kk - 1) / kk * ww + 7) / 8);
                if (!best || cc < best) {
                    best = cc;
                    bk = kk;
                }
            }
            cr_assert(C == best && k == bk, "n %u M %u: C %u k %u, expected %u %u", n, M, C, k, best, bk);
            cr_assert(w <= 32 && pow((double)M, k) <= ldexp(1.0, (int)w) && pow((double)M, k) > ldexp(1.0, (int)w - 1));
        }
}

/* ---- round trip against the reference ---- */

typedef struct fx_shape {
    char name[16];
    uint32_t kv_heads, head_dim;
} fx_shape;

ParameterizedTestParameters(fixed, matches_reference)
{
    static fx_shape shapes[] = {
        {"fixed226", 8, 128}, /* production: M 6 / 3 */
        {"fixed196", 2, 64},  /* M 4 / 2 at this shape's storage */
        {"fixedk7v5", 1, 16}, {"fixedk256v2", 2, 32}, {"fixedk32v17", 1, 64},
    };
    return cr_make_param_array(fx_shape, shapes, sizeof shapes / sizeof shapes[0]);
}

ParameterizedTest(fx_shape *fs, fixed, matches_reference)
{
    dq_codec *c = dqt_codec_builtin(fs->name, fs->kv_heads, fs->head_dim);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const dq_profile *p = dq_codec_profile(c);
    const uint32_t n = dq_codec_stream_len(c);
    const size_t W = p->window;
    float *x = dqt_xmalloc(W * n * sizeof(float)), *a = dqt_xmalloc(W * n * sizeof(float));
    float *b = dqt_xmalloc(W * n * sizeof(float));
    uint8_t *lev = dqt_xmalloc(W * n), *dl = dqt_xmalloc(n), *mean = dqt_xmalloc(dq_codec_mean_bytes(c));
    for (int kind = 0; kind < 2; kind++) {
        const dq_kind kd = (dq_kind)kind;
        const size_t rb = dq_codec_record_bytes(c, kd);
        const uint32_t M = p->levels[kind], C = p->container_bytes[kind];
        uint32_t k, w;
        cr_assert_eq(dq_fixed_packing(n, M, &k, &w), C);
        uint8_t *recs = dqt_xmalloc(W * rb), *packed = dqt_xmalloc(C);
        /* a full window and a partial one (its own mean); channel offsets and a constant token */
        const size_t counts[2] = {W, W / 3 + 1};
        for (int r = 0; r < 2; r++) {
            const size_t T = counts[r];
            for (uint32_t j = 0; j < n; j++) {
                const double off = 2.0 * dqt_normal(&rng), sc = 0.5 + (j % 5);
                for (size_t t = 0; t < T; t++)
                    x[t * n + j] = (float)(off + sc * dqt_normal(&rng));
            }
            for (uint32_t j = 0; j < n; j++)
                x[1 * n + j] = 0.75f; /* a constant token (not constant once rotated) */
            cr_assert_eq(dq_tokens_encode(c, ws, kd, x, DQ_DTYPE_F32, T, kd == DQ_KIND_K ? mean : NULL, recs, rb, NULL),
                         DQ_OK);
            cr_assert_eq(dq_tokens_decode(c, ws, kd, kd == DQ_KIND_K ? mean : NULL, recs, rb, T, a, DQ_DTYPE_F32),
                         DQ_OK);
            ref_roundtrip(c, kd, x, T, b, lev);
            cr_assert(memcmp(a, b, T * n * sizeof(float)) == 0, "%s kind %d: reconstruction differs", fs->name, kind);
            for (size_t t = 0; t < T; t++) {
                cr_assert_eq(dq_stream_decode_levels(c, kd, recs + t * rb, dl), DQ_OK);
                cr_assert(memcmp(dl, lev + t * n, n) == 0, "levels of token %zu differ", t);
                ref_pack(lev + t * n, n, M, k, w, packed, C);
                cr_assert(memcmp(packed, recs + t * rb + 4, C) == 0, "container of token %zu differs", t);
            }
        }
        free(recs);
        free(packed);
    }
    free(x);
    free(a);
    free(b);
    free(lev);
    free(dl);
    free(mean);
    dq_workspace_free(ws);
    dq_codec_free(c);
}

/* ---- windows: check, corruption, layers, attention, hot layout ---- */

Test(fixed, corrupt_windows)
{
    /* n = 128: K M 6 (groups of 8 in 21 bits: 16 groups, 42 bytes), V M 5 (groups of 3 in 7 bits:
     * 43 groups, the last of 2 levels, 301 bits in 38 bytes, 3 padding bits) */
    dq_codec *c = dqt_codec_builtin("fixedk6v5", 1, 128);
    const dq_profile *p = dq_codec_profile(c);
    uint32_t pk, pw;
    cr_assert_eq(dq_fixed_packing(128, 6, &pk, &pw), 42);
    cr_assert(pk == 8 && pw == 21);
    cr_assert_eq(dq_fixed_packing(128, 5, &pk, &pw), 38);
    cr_assert(pk == 3 && pw == 7);
    cr_assert_eq(p->container_bytes[0], 42);
    cr_assert_eq(p->container_bytes[1], 38);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const uint32_t n = 128;
    const size_t W = p->window, wb = dq_codec_window_bytes(c);
    float *k = dqt_xmalloc(W * n * sizeof(float)), *v = dqt_xmalloc(W * n * sizeof(float));
    dqt_random_kv(&rng, n, W, k, v);
    uint8_t *win = dqt_xmalloc(wb), *bad = dqt_xmalloc(wb), lev[128];
    cr_assert_eq(dq_window_encode(c, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
    cr_assert_eq(dq_window_check(c, win), DQ_OK);

    /* key group 0 = 6^8 = 0x19a100 (21 bits hold up to 0x1fffff): not 8 base-6 digits */
    memcpy(bad, win, wb);
    uint8_t *rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_K, 4);
    rec[4] = 0x00;
    rec[5] = 0xa1;
    rec[6] = (uint8_t)((rec[6] & 0xe0) | 0x19);
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    cr_assert_eq(dq_stream_decode_levels(c, DQ_KIND_K, rec, lev), DQ_CORRUPT);
    for (uint32_t j = 0; j < n; j++)
        cr_assert_lt(lev[j], 6);
    /* value group 0 = 5^3 = 125 (7 bits) */
    memcpy(bad, win, wb);
    rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 9);
    rec[4] = (uint8_t)((rec[4] & 0x80) | 125);
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    /* the last value group (bits 294..300) holds 2 levels: 25 is one too many */
    memcpy(bad, win, wb);
    rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 11);
    rec[4 + 36] = (uint8_t)((rec[4 + 36] & 0x3f) | (25 & 3) << 6);
    rec[4 + 37] = (uint8_t)((rec[4 + 37] & 0xe0) | 25 >> 2);
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    /* a padding bit past the last value group (bit 303) */
    memcpy(bad, win, wb);
    rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 0);
    rec[4 + 37] |= 0x80;
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    /* negative s, infinite o, infinite mean scale */
    memcpy(bad, win, wb);
    ((uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 3))[1] |= 0x80;
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    memcpy(bad, win, wb);
    rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_K, 3);
    rec[2] = 0x00;
    rec[3] = 0x7c;
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    memcpy(bad, win, wb);
    bad[0] = 0x00;
    bad[1] = 0xfc;
    cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT);
    /* a corrupt window is refused by a layer, a valid one restored */
    dq_layer *layer;
    cr_assert_eq(dq_layer_create(c, &layer), DQ_OK);
    size_t at = 99;
    memcpy(bad, win, wb);
    rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 9);
    rec[4] |= 0x7f;
    cr_assert_eq(dq_layer_append_windows(layer, bad, 1, &at), DQ_CORRUPT);
    cr_assert_eq(at, 0);
    cr_assert_eq(dq_layer_append_windows(layer, win, 1, NULL), DQ_OK);
    float *out = dqt_xmalloc(W * n * sizeof(float)), *ref = dqt_xmalloc(W * n * sizeof(float));
    cr_assert_eq(dq_layer_decode(layer, ws, DQ_KIND_V, 0, W, out, DQ_DTYPE_F32), DQ_OK);
    cr_assert_eq(dq_tokens_decode(c, ws, DQ_KIND_V, NULL, dq_window_record(c, win, DQ_KIND_V, 0),
                                  dq_codec_record_bytes(c, DQ_KIND_V), W, ref, DQ_DTYPE_F32),
                 DQ_OK);
    cr_assert(memcmp(out, ref, W * n * sizeof(float)) == 0);
    /* random flips: either refused or decoding to levels below M, never out of bounds */
    for (int trial = 0; trial < 400; trial++) {
        memcpy(bad, win, wb);
        bad[dqt_below(&rng, (uint32_t)wb)] ^= (uint8_t)(1u << dqt_below(&rng, 8));
        const int rc = dq_window_check(c, bad);
        cr_assert(rc == DQ_OK || rc == DQ_CORRUPT);
        for (int kind = 0; kind < 2; kind++)
            for (size_t t = 0; t < W; t += 17) {
                const int r = dq_stream_decode_levels(c, (dq_kind)kind, dq_window_record(c, bad, (dq_kind)kind, t),
                                                      lev);
                cr_assert(r == DQ_OK || r == DQ_CORRUPT);
                cr_assert(r == DQ_OK || rc == DQ_CORRUPT, "a stream the check passed is corrupt");
                for (uint32_t j = 0; j < n; j++)
                    cr_assert_lt(lev[j], p->levels[kind]);
            }
    }
    free(out);
    free(ref);
    dq_layer_free(layer);
    free(k);
    free(v);
    free(win);
    free(bad);
    dq_workspace_free(ws);
    dq_codec_free(c);
}

/* A layer of fixed226: dq_attend close to the exact reference over the decoded tokens; its windows
 * transcoded to the hot layout give dq_attend's outputs and LSE exactly and the same decode. */
Test(fixed, attention_and_hot)
{
    const uint32_t KVH = 2, D = 128, n = KVH * D;
    dq_codec *c = dqt_codec_builtin("fixed226", KVH, D);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const dq_profile *p = dq_codec_profile(c);
    cr_assert_eq(dq_hot_bits(c, DQ_KIND_K), 3); /* M 6 */
    cr_assert_eq(dq_hot_bits(c, DQ_KIND_V), 2); /* M 3 */
    const size_t W = p->window, T = 3 * W + 41;
    float *k = dqt_xmalloc(T * n * sizeof(float)), *v = dqt_xmalloc(T * n * sizeof(float));
    for (size_t t0 = 0; t0 < T; t0 += W)
        dqt_random_kv(&rng, n, T - t0 < W ? T - t0 : W, k + t0 * n, v + t0 * n);
    dq_layer *layer;
    cr_assert_eq(dq_layer_create(c, &layer), DQ_OK);
    cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    const size_t nwin = dq_layer_window_count(layer), hb = dq_hot_window_bytes(c);
    cr_assert_eq(nwin, 3);
    uint8_t *hot = dqt_xmalloc(nwin * hb);
    const uint8_t *hp[3];
    float *a = dqt_xmalloc(W * n * sizeof(float)), *b = dqt_xmalloc(W * n * sizeof(float));
    for (size_t w = 0; w < nwin; w++) {
        memset(hot + w * hb, 0x5a, hb);
        cr_assert_eq(dq_hot_transcode(c, dq_layer_window(layer, w), hot + w * hb), DQ_OK);
        cr_assert_eq(dq_hot_check(c, hot + w * hb, hb), DQ_OK);
        hp[w] = hot + w * hb;
        for (int kind = 0; kind < 2; kind++) {
            cr_assert_eq(dq_layer_decode(layer, ws, (dq_kind)kind, w * W, W, a, DQ_DTYPE_F32), DQ_OK);
            cr_assert_eq(dq_hot_decode(c, ws, hp[w], (dq_kind)kind, 0, W, b, DQ_DTYPE_F32), DQ_OK);
            cr_assert(memcmp(a, b, W * n * sizeof(float)) == 0, "hot decode differs (window %zu kind %d)", w, kind);
        }
    }
    for (uint32_t G = 1; G <= 4; G *= 2) {
        const uint32_t QH = KVH * G;
        float *q = dqt_xmalloc(QH * D * sizeof(float));
        float *o1 = dqt_xmalloc(QH * D * sizeof(float)), *o2 = dqt_xmalloc(QH * D * sizeof(float));
        float *o3 = dqt_xmalloc(QH * D * sizeof(float)), l1[8], l2[8], l3[8];
        for (size_t i = 0; i < QH * D; i++)
            q[i] = (float)dqt_normal(&rng);
        const float scale = 1.0f / sqrtf((float)D);
        dq_attn_item it = {layer, q, o1, l1};
        cr_assert_eq(dq_attend(c, ws, QH, scale, &it, 1), DQ_OK);
        dq_attn_item ir = {layer, q, o3, l3};
        cr_assert_eq(dq_attend_reference(c, ws, QH, scale, &ir, 1), DQ_OK);
        for (size_t i = 0; i < QH * D; i++)
            cr_assert(fabsf(o1[i] - o3[i]) <= 1e-4f * (1.0f + fabsf(o3[i])), "G %u [%zu]: %g vs %g", G, i, o1[i],
                      o3[i]);
        for (uint32_t h = 0; h < QH; h++)
            cr_assert(fabsf(l1[h] - l3[h]) <= 1e-4f * (1.0f + fabsf(l3[h])));
        dq_hot_item hi = {
            hp, nwin, dq_layer_tail(layer, DQ_KIND_K), dq_layer_tail(layer, DQ_KIND_V), dq_layer_tail_tokens(layer), q,
            o2, l2};
        cr_assert_eq(dq_hot_attend(c, ws, QH, scale, &hi, 1), DQ_OK);
        cr_assert(memcmp(o1, o2, QH * D * sizeof(float)) == 0, "hot outputs differ (G %u)", G);
        cr_assert(memcmp(l1, l2, QH * sizeof(float)) == 0, "hot LSE differs (G %u)", G);
        free(q);
        free(o1);
        free(o2);
        free(o3);
    }
    /* a hot code >= M (value M 3: code 3 in channel 0 of token 2) is refused */
    size_t off[4];
    dq_hot_offsets(c, off);
    uint8_t *hb2 = dqt_xmalloc(hb);
    memcpy(hb2, hp[0], hb);
    hb2[off[3] + 4 * 2] |= 3;
    cr_assert_eq(dq_hot_check(c, hb2, hb), DQ_CORRUPT);
    free(hb2);
    free(a);
    free(b);
    free(hot);
    free(k);
    free(v);
    dq_layer_free(layer);
    dq_workspace_free(ws);
    dq_codec_free(c);
}

/* Bad input: non-finite and out-of-range values, bad arguments. */
Test(fixed, bad_input)
{
    dq_codec *c = dqt_codec_builtin("fixed226", 1, 32);
    dq_workspace *ws;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const size_t rb = dq_codec_record_bytes(c, DQ_KIND_V);
    float y[32];
    uint8_t rec[64], lev[32];
    for (int i = 0; i < 32; i++)
        y[i] = (float)i / 7.0f;
    cr_assert_eq(dq_stream_encode(c, ws, DQ_KIND_V, y, rec, NULL), DQ_OK);
    cr_assert_eq(dq_stream_decode_levels(c, DQ_KIND_V, rec, lev), DQ_OK);
    y[5] = NAN;
    cr_assert_eq(dq_stream_encode(c, ws, DQ_KIND_V, y, rec, NULL), DQ_NONFINITE);
    y[5] = 40000.0f;
    cr_assert_eq(dq_stream_encode(c, ws, DQ_KIND_V, y, rec, NULL), DQ_RANGE);
    float x[4 * 32];
    for (int i = 0; i < 4 * 32; i++)
        x[i] = 0.0f;
    x[40] = INFINITY;
    uint8_t recs[4 * 128];
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, NULL, recs, rb, NULL), DQ_NONFINITE);
    x[40] = 1e6f;
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, NULL, recs, rb, NULL), DQ_RANGE);
    x[40] = 0.0f;
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, NULL, recs, rb - 1, NULL), DQ_INVALID_ARGUMENT);
    cr_assert_eq(
        dq_tokens_encode(c, ws, DQ_KIND_K, x, DQ_DTYPE_F32, 4, NULL, recs, dq_codec_record_bytes(c, DQ_KIND_K), NULL),
        DQ_SHAPE);
    /* an all-zero stream: s = 0, o = 0, reconstructed exactly */
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, NULL, recs, rb, NULL), DQ_OK);
    cr_assert_eq(dqt_record_s(recs), 0.0f);
    float back[4 * 32];
    cr_assert_eq(dq_tokens_decode(c, ws, DQ_KIND_V, NULL, recs, rb, 4, back, DQ_DTYPE_F32), DQ_OK);
    for (int i = 0; i < 4 * 32; i++)
        cr_assert_eq(back[i], 0.0f);
    dq_workspace_free(ws);
    dq_codec_free(c);
}
