/* NaN and ±Inf are input errors (DESIGN §2.5): DQ_NONFINITE from every entry point, for f32, f16
 * and bf16 input, with outputs and layers left untouched. Values too large for the fp16 metadata
 * after rotation are DQ_RANGE, equally without side effects. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"

static dqt_rng rng;
static dq_codec *codec;
static dq_workspace *ws;
static uint32_t n;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x4a4au);
    codec = dqt_codec_builtin("dq226", 2, 128);
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    n = dq_codec_stream_len(codec);
}

static void suite_fini(void)
{
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

TestSuite(nonfinite, .init = suite_init, .fini = suite_fini);

/* The bad values of each dtype, as raw bit patterns (f32 through its bits). */
static const uint32_t bad_f32[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u};
static const uint16_t bad_f16[] = {0x7e00u, 0xfe00u, 0x7c01u, 0x7c00u, 0xfc00u};
static const uint16_t bad_bf16[] = {0x7fc0u, 0xffc0u, 0x7f81u, 0x7f80u, 0xff80u};
#define NBAD 5

/* Fills ntok tokens of dtype with N(0,1) and plants bad value b at element pos. */
static void *make_input(dq_dtype dt, size_t count, size_t pos, int b)
{
    void *x = dqt_xmalloc(count * dq_dtype_size(dt));
    for (size_t i = 0; i < count; i++) {
        float v = (float)dqt_normal(&rng);
        if (dt == DQ_DTYPE_F32)
            ((float *)x)[i] = v;
        else if (dt == DQ_DTYPE_F16)
            ((uint16_t *)x)[i] = dq_f32_to_f16(v);
        else
            ((uint16_t *)x)[i] = dq_f32_to_bf16(v);
    }
    if (b >= 0) {
        if (dt == DQ_DTYPE_F32)
            memcpy((float *)x + pos, &bad_f32[b], 4);
        else if (dt == DQ_DTYPE_F16)
            ((uint16_t *)x)[pos] = bad_f16[b];
        else
            ((uint16_t *)x)[pos] = bad_bf16[b];
    }
    return x;
}

Test(nonfinite, check_finite)
{
    for (int dt = 0; dt < 3; dt++) {
        for (int b = 0; b < NBAD; b++) {
            for (size_t pos = 0; pos < 40; pos += 13) {
                void *x = make_input((dq_dtype)dt, 40, pos, b);
                cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, 40), DQ_NONFINITE, "dtype %d bad %d at %zu", dt, b, pos);
                cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, pos), DQ_OK, "dtype %d: prefix before %zu", dt, pos);
                free(x);
            }
        }
        void *x = make_input((dq_dtype)dt, 1000, 0, -1);
        cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, 1000), DQ_OK);
        free(x);
        /* across the blocks the test runs in (256 values), and in a last partial block */
        const size_t far[] = {255, 256, 257, 511, 512, 767, 999};
        for (size_t f = 0; f < sizeof far / sizeof far[0]; f++) {
            const size_t pos = far[f];
            x = make_input((dq_dtype)dt, 1000, pos, (int)(f % NBAD));
            cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, 1000), DQ_NONFINITE, "dtype %d at %zu", dt, pos);
            cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, pos + 1), DQ_NONFINITE, "dtype %d ending at %zu", dt, pos);
            cr_assert_eq(dq_check_finite(x, (dq_dtype)dt, pos), DQ_OK, "dtype %d: prefix before %zu", dt, pos);
            free(x);
        }
    }
    /* Largest finite values are finite. */
    float big[2] = {3.4028235e38f, -3.4028235e38f};
    uint16_t h[2] = {0x7bffu, 0xfbffu}, bf[2] = {0x7f7fu, 0xff7fu};
    cr_assert_eq(dq_check_finite(big, DQ_DTYPE_F32, 2), DQ_OK);
    cr_assert_eq(dq_check_finite(h, DQ_DTYPE_F16, 2), DQ_OK);
    cr_assert_eq(dq_check_finite(bf, DQ_DTYPE_BF16, 2), DQ_OK);
}

Test(nonfinite, stream_encode)
{
    float *y = dqt_xmalloc(n * sizeof *y);
    for (int k = 0; k < 2; k++) {
        uint8_t *rec = dqt_xmalloc(dq_codec_record_bytes(codec, (dq_kind)k));
        for (int b = 0; b < NBAD; b++) {
            for (uint32_t j = 0; j < n; j++)
                y[j] = (float)dqt_normal(&rng);
            memcpy(&y[dqt_below(&rng, n)], &bad_f32[b], 4);
            dq_encode_stats st;
            memset(&st, 0, sizeof st);
            int rc = dq_stream_encode(codec, ws, (dq_kind)k, y, rec, &st);
            cr_assert_eq(rc, DQ_NONFINITE, "kind %d, bits %#x: %s", k, bad_f32[b], dq_err_name(rc));
            cr_assert_eq(st.streams, 0, "a rejected stream was counted");
        }
        free(rec);
    }
    free(y);
}

/* dq_tokens_encode: every dtype, every bad value, K and V; outputs untouched. */
Test(nonfinite, tokens_encode)
{
    const size_t ntok = 24;
    for (int k = 0; k < 2; k++) {
        const size_t rb = dq_codec_record_bytes(codec, (dq_kind)k), mb = dq_codec_mean_bytes(codec);
        uint8_t *recs = dqt_xmalloc(ntok * rb), *mean = dqt_xmalloc(mb);
        for (int dt = 0; dt < 3; dt++) {
            for (int b = 0; b < NBAD; b++) {
                /* The last element too: validation must cover the whole input. */
                size_t pos = b == 0 ? ntok * n - 1 : dqt_below(&rng, (uint32_t)(ntok * n));
                void *x = make_input((dq_dtype)dt, ntok * n, pos, b);
                memset(recs, 0xa5, ntok * rb);
                memset(mean, 0x5a, mb);
                int rc = dq_tokens_encode(codec, ws, (dq_kind)k, x, (dq_dtype)dt, ntok, k == 0 ? mean : NULL, recs, rb,
                                          NULL);
                cr_assert_eq(rc, DQ_NONFINITE, "kind %d dtype %d bad %d at %zu: %s", k, dt, b, pos, dq_err_name(rc));
                for (size_t i = 0; i < ntok * rb; i++)
                    cr_assert_eq(recs[i], 0xa5, "records written before validation (byte %zu)", i);
                for (size_t i = 0; i < mb; i++)
                    cr_assert_eq(mean[i], 0x5a, "mean block written before validation (byte %zu)", i);
                free(x);
            }
            /* And a clean input of the same dtype encodes. */
            void *x = make_input((dq_dtype)dt, ntok * n, 0, -1);
            cr_assert_eq(
                dq_tokens_encode(codec, ws, (dq_kind)k, x, (dq_dtype)dt, ntok, k == 0 ? mean : NULL, recs, rb, NULL),
                DQ_OK);
            free(x);
        }
        free(recs);
        free(mean);
    }
}

/* Huge finite values: DQ_RANGE, outputs untouched. A spike a in one channel rotates to ±a/sqrt(d)
 * in every channel of its head, so the token limit DQ_TOKEN_MAX_ABS applies to a/sqrt(d). */
Test(nonfinite, tokens_encode_range)
{
    {
        const size_t rb = dq_codec_record_bytes(codec, DQ_KIND_V);
        uint8_t *rec = dqt_xmalloc(rb);
        float *x = make_input(DQ_DTYPE_F32, n, 0, -1);
        x[5] = 0.95f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f);
        cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 1, NULL, rec, rb, NULL), DQ_OK,
                     "a token within DQ_TOKEN_MAX_ABS after rotation refused");
        x[5] = 1.05f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f);
        cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 1, NULL, rec, rb, NULL), DQ_RANGE,
                     "a token beyond DQ_TOKEN_MAX_ABS after rotation accepted");
        const size_t rbk = dq_codec_record_bytes(codec, DQ_KIND_K);
        uint8_t *mean = dqt_xmalloc(dq_codec_mean_bytes(codec)), *krec = dqt_xmalloc(rbk);
        cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, 1, mean, krec, rbk, NULL), DQ_RANGE);
        free(mean);
        free(krec);
        free(x);
        free(rec);
    }
    const size_t ntok = 8;
    const size_t rb = dq_codec_record_bytes(codec, DQ_KIND_V);
    uint8_t *recs = dqt_xmalloc(ntok * rb);
    float *x = make_input(DQ_DTYPE_F32, ntok * n, 0, -1);
    x[3 * n + 17] = 3.0e38f;
    memset(recs, 0xa5, ntok * rb);
    int rc = dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, ntok, NULL, recs, rb, NULL);
    cr_assert_eq(rc, DQ_RANGE, "3e38 gave %s", dq_err_name(rc));
    for (size_t i = 0; i < ntok * rb; i++)
        cr_assert_eq(recs[i], 0xa5, "records written before the range check (byte %zu)", i);
    free(x);
    free(recs);
}

static void decode_all(const dq_layer *layer, float *k, float *v)
{
    size_t t = dq_layer_tokens(layer);
    if (t == 0)
        return;
    cr_assert_eq(dq_layer_decode(layer, ws, DQ_KIND_K, 0, t, k, DQ_DTYPE_F32), DQ_OK);
    cr_assert_eq(dq_layer_decode(layer, ws, DQ_KIND_V, 0, t, v, DQ_DTYPE_F32), DQ_OK);
}

/* dq_layer_append is all-or-nothing: a bad value anywhere in K or V, in a chunk that would seal a
 * window, leaves the layer bit-for-bit as it was. */
Test(nonfinite, layer_append_unchanged)
{
    dq_layer *layer = NULL;
    cr_assert_eq(dq_layer_create(codec, &layer), DQ_OK);
    const size_t first = 200;
    float *k0 = make_input(DQ_DTYPE_F32, first * n, 0, -1), *v0 = make_input(DQ_DTYPE_F32, first * n, 0, -1);
    cr_assert_eq(dq_layer_append(layer, ws, k0, v0, DQ_DTYPE_F32, first, NULL), DQ_OK);
    free(k0);
    free(v0);

    const size_t cap = 600;
    float *kb = dqt_xmalloc(cap * n * sizeof *kb), *vb = dqt_xmalloc(cap * n * sizeof *vb);
    float *ka = dqt_xmalloc(cap * n * sizeof *ka), *va = dqt_xmalloc(cap * n * sizeof *va);
    decode_all(layer, kb, vb);
    const size_t tokens = dq_layer_tokens(layer), stored = dq_layer_stored_bytes(layer);
    const size_t wins = dq_layer_window_count(layer);

    const size_t chunk = 100; /* 200 + 100 crosses the seal at 256 */
    for (int dt = 0; dt < 3; dt++) {
        for (int b = 0; b < NBAD; b++) {
            for (int which = 0; which < 2; which++) {
                size_t pos = dqt_below(&rng, (uint32_t)(chunk * n));
                void *k = make_input((dq_dtype)dt, chunk * n, pos, which == 0 ? b : -1);
                void *v = make_input((dq_dtype)dt, chunk * n, pos, which == 1 ? b : -1);
                dq_encode_stats st;
                memset(&st, 0, sizeof st);
                int rc = dq_layer_append(layer, ws, k, v, (dq_dtype)dt, chunk, &st);
                cr_assert_eq(rc, DQ_NONFINITE, "dtype %d bad %d in %c: %s", dt, b, which ? 'V' : 'K', dq_err_name(rc));
                cr_assert_eq(dq_layer_tokens(layer), tokens, "token count changed by a failed append");
                cr_assert_eq(dq_layer_stored_bytes(layer), stored);
                cr_assert_eq(dq_layer_window_count(layer), wins);
                decode_all(layer, ka, va);
                cr_assert(memcmp(ka, kb, tokens * n * sizeof *ka) == 0, "keys changed by a failed append");
                cr_assert(memcmp(va, vb, tokens * n * sizeof *va) == 0, "values changed by a failed append");
                free(k);
                free(v);
            }
        }
    }
    /* A range error is all-or-nothing as well. */
    float *k = make_input(DQ_DTYPE_F32, chunk * n, 0, -1), *v = make_input(DQ_DTYPE_F32, chunk * n, 0, -1);
    v[(chunk - 1) * n] = 1e30f;
    cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, chunk, NULL), DQ_RANGE);
    cr_assert_eq(dq_layer_tokens(layer), tokens);
    decode_all(layer, ka, va);
    cr_assert(memcmp(ka, kb, tokens * n * sizeof *ka) == 0);
    cr_assert(memcmp(va, vb, tokens * n * sizeof *va) == 0);
    /* The same chunk cleaned up appends. */
    v[(chunk - 1) * n] = 1.0f;
    cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, chunk, NULL), DQ_OK);
    cr_assert_eq(dq_layer_tokens(layer), tokens + chunk);
    free(k);
    free(v);
    free(ka);
    free(va);
    free(kb);
    free(vb);
    dq_layer_free(layer);
}

/* A query with NaN is refused. */
Test(nonfinite, attend_query)
{
    dq_layer *layer = NULL;
    cr_assert_eq(dq_layer_create(codec, &layer), DQ_OK);
    float *k = make_input(DQ_DTYPE_F32, 130 * n, 0, -1), *v = make_input(DQ_DTYPE_F32, 130 * n, 0, -1);
    cr_assert_eq(dq_layer_append(layer, ws, k, v, DQ_DTYPE_F32, 130, NULL), DQ_OK);
    const uint32_t qh = 4, d = 128;
    float q[4 * 128], out[4 * 128], lse[4];
    for (uint32_t i = 0; i < qh * d; i++)
        q[i] = (float)dqt_normal(&rng);
    q[200] = NAN;
    dq_attn_item it = {layer, q, out, lse};
    int rc = dq_attend(codec, ws, qh, 1.0f / sqrtf((float)d), &it, 1);
    cr_assert_eq(rc, DQ_NONFINITE, "NaN query: %s", dq_err_name(rc));
    free(k);
    free(v);
    dq_layer_free(layer);
}

/* dq_check_tokens gives the verdict dq_layer_append gives, without a layer: NaN/Inf of every dtype,
 * a finite f32 that overflows BF16, a rotated value beyond the range, and clean tokens. */
Test(nonfinite, check_tokens_matches_append)
{
    const size_t ntok = 3;
    dq_layer *layer = NULL;
    cr_assert_eq(dq_layer_create(codec, &layer), DQ_OK);
    for (int dt = 0; dt < 3; dt++) {
        for (int b = -1; b < NBAD; b++) {
            size_t pos = dqt_below(&rng, (uint32_t)(ntok * n));
            void *x = make_input((dq_dtype)dt, ntok * n, pos, b);
            void *clean = make_input((dq_dtype)dt, ntok * n, 0, -1);
            int want = b < 0 ? DQ_OK : DQ_NONFINITE;
            cr_assert_eq(dq_check_tokens(ws, x, (dq_dtype)dt, ntok), want, "dtype %d bad %d", dt, b);
            cr_assert_eq(dq_layer_append(layer, ws, x, clean, (dq_dtype)dt, ntok, NULL), want);
            free(x);
            free(clean);
        }
    }
    float *x = make_input(DQ_DTYPE_F32, ntok * n, 0, -1);
    x[n + 9] = 3.4e38f; /* finite in f32, Inf once rounded to BF16 */
    cr_assert_eq(dq_check_tokens(ws, x, DQ_DTYPE_F32, ntok), DQ_NONFINITE);
    x[n + 9] = 1.05f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f);
    cr_assert_eq(dq_check_tokens(ws, x, DQ_DTYPE_F32, ntok), DQ_RANGE);
    x[n + 9] = 0.95f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f);
    cr_assert_eq(dq_check_tokens(ws, x, DQ_DTYPE_F32, ntok), DQ_OK);
    cr_assert_eq(dq_check_tokens(ws, x, (dq_dtype)99, ntok), DQ_DTYPE);
    cr_assert_eq(dq_check_tokens(ws, NULL, DQ_DTYPE_F32, ntok), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_check_tokens(NULL, x, DQ_DTYPE_F32, ntok), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_check_tokens(ws, NULL, DQ_DTYPE_F32, 0), DQ_OK);
    /* BF16 (the one-pass path): a token out of range before a non-finite one gives DQ_NONFINITE,
     * out of range alone DQ_RANGE, both in any token */
    uint16_t *xb = dqt_xmalloc(ntok * n * sizeof *xb);
    for (size_t t = 0; t < ntok; t++) {
        for (size_t j = 0; j < ntok * n; j++)
            xb[j] = dq_f32_to_bf16(0.01f * (float)((j * 7) % 13) - 0.06f);
        cr_assert_eq(dq_check_tokens(ws, xb, DQ_DTYPE_BF16, ntok), DQ_OK);
        xb[t * n + 3] = dq_f32_to_bf16(1.05f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f));
        cr_assert_eq(dq_check_tokens(ws, xb, DQ_DTYPE_BF16, ntok), DQ_RANGE, "token %zu", t);
        xb[(ntok - 1) * n + n - 1] = 0x7fc0;
        cr_assert_eq(dq_check_tokens(ws, xb, DQ_DTYPE_BF16, ntok), DQ_NONFINITE, "token %zu", t);
    }
    free(xb);
    free(x);
    dq_layer_free(layer);
}

/* Near the range limit dq_check_tokens (which skips the rotation for heads whose norm is below the
 * limit) agrees with the encoder's own check of the rotated token (dq_tokens_encode): spikes and
 * whole-head scalings on both sides of the limit, in f32 and bf16. */
Test(nonfinite, check_tokens_agrees_with_the_encoder_near_the_limit)
{
    const size_t rb = dq_codec_record_bytes(codec, DQ_KIND_V);
    uint8_t *rec = dqt_xmalloc(rb);
    uint16_t *xb = dqt_xmalloc(n * sizeof *xb);
    int seen[2] = {0, 0};
    for (int trial = 0; trial < 400; trial++) {
        float *x = make_input(DQ_DTYPE_F32, n, 0, -1);
        const uint32_t h0 = dqt_below(&rng, n / 128) * 128;
        const float f = 0.5f + 1.5f * (float)dqt_uniform(&rng);
        if (trial % 3 == 1) {
            /* one spike: rotates to ±a/sqrt(d) over its head */
            x[h0 + dqt_below(&rng, 128)] = f * DQ_TOKEN_MAX_ABS * sqrtf(128.0f);
        } else if (trial % 3 == 2) {
            /* a token that rotates into a spike of f times the limit: its head's norm is the spike's */
            memset(x, 0, n * sizeof *x);
            x[h0 + dqt_below(&rng, 128)] = f * DQ_TOKEN_MAX_ABS;
            dq_unrotate(codec, x);
        } else {
            /* a whole head scaled to a norm near the limit */
            double ss = 0;
            for (uint32_t j = 0; j < 128; j++)
                ss += (double)x[h0 + j] * x[h0 + j];
            for (uint32_t j = 0; j < 128; j++)
                x[h0 + j] = (float)(x[h0 + j] * f * DQ_TOKEN_MAX_ABS / sqrt(ss));
        }
        int want = dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 1, NULL, rec, rb, NULL);
        cr_assert(want == DQ_OK || want == DQ_RANGE, "encoder: %s", dq_err_name(want));
        cr_assert_eq(dq_check_tokens(ws, x, DQ_DTYPE_F32, 1), want, "trial %d (f %.3f)", trial, (double)f);
        for (uint32_t j = 0; j < n; j++)
            xb[j] = dq_f32_to_bf16(x[j]);
        want = dq_tokens_encode(codec, ws, DQ_KIND_V, xb, DQ_DTYPE_BF16, 1, NULL, rec, rb, NULL);
        cr_assert_eq(dq_check_tokens(ws, xb, DQ_DTYPE_BF16, 1), want, "trial %d bf16", trial);
        seen[want == DQ_RANGE]++;
        free(x);
    }
    cr_assert(seen[0] > 50 && seen[1] > 50, "both verdicts exercised (%d ok, %d range)", seen[0], seen[1]);
    free(rec);
    free(xb);
}
