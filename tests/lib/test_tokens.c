/* Token level (codec.h: dq_tokens_encode / dq_tokens_decode): the key-mean block format (fp16
 * scale + INT8 per rotated channel) and its accuracy, decoding as unrotate(o + s·m + μ) from the
 * records, output dtypes, and argument checks. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x70c3u);
}

static void suite_fini(void)
{
}

TestSuite(tokens, .init = suite_init, .fini = suite_fini);

struct tok_param {
    char name[16];
    uint32_t kv_heads, head_dim, ntok;
};

ParameterizedTestParameters(tokens, key_window)
{
    static struct tok_param p[] = {
        {"dq226", 2, 128, 128}, {"dq226", 2, 128, 1},  {"dq226", 2, 128, 37},
        {"dq196", 8, 128, 128}, {"dq226", 1, 16, 128}, {"dq196", 4, 64, 100},
    };
    return cr_make_param_array(struct tok_param, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(struct tok_param *tp, tokens, key_window)
{
    dq_codec *codec = dqt_codec_builtin(tp->name, tp->kv_heads, tp->head_dim);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec), T = tp->ntok;
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), mb = dq_codec_mean_bytes(codec);
    float *x = dqt_xmalloc((size_t)T * n * sizeof *x), *out = dqt_xmalloc((size_t)T * n * sizeof *out);
    float *y = dqt_xmalloc(n * sizeof *y), *mu = dqt_xmalloc(n * sizeof *mu);
    double *mean = dqt_xmalloc(n * sizeof *mean);
    uint8_t *mblock = dqt_xmalloc(mb), *recs = dqt_xmalloc((size_t)T * rk);
    for (uint32_t j = 0; j < n; j++)
        mean[j] = 0;
    for (int trial = 0; trial < 3; trial++) {
        /* Keys with large channel offsets (trial 2: a few huge channels, like real outlier keys). */
        for (uint32_t j = 0; j < n; j++) {
            double off = 3.0 * dqt_normal(&rng) * (trial == 2 && j % 37 == 0 ? 40.0 : 1.0);
            for (uint32_t t = 0; t < T; t++)
                x[(size_t)t * n + j] = (float)(off + dqt_normal(&rng));
        }
        memset(mblock, 0xcc, mb);
        cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, T, mblock, recs, rk, NULL), DQ_OK);

        /* The mean block: fp16 scale, then one int8 per rotated channel; μ = scale · q. */
        const float scale = dq_f16_to_f32((uint16_t)(mblock[0] | mblock[1] << 8));
        cr_assert(isfinite(scale) && scale >= 0, "mean scale %g", (double)scale);
        dq__mean_dequant(codec, mblock, mu);
        for (uint32_t j = 0; j < n; j++) {
            const float want = scale * (float)(int8_t)mblock[2 + j];
            cr_assert(fabsf(mu[j] - want) <= 1e-6f * fabsf(want), "μ[%u] = %g, scale·q = %g", j, (double)mu[j],
                      (double)want);
        }
        /* ... and it is the window's rotated channel mean to INT8 precision. */
        for (uint32_t j = 0; j < n; j++)
            mean[j] = 0;
        for (uint32_t t = 0; t < T; t++) {
            memcpy(y, x + (size_t)t * n, n * sizeof *y);
            dq_rotate(codec, y);
            for (uint32_t j = 0; j < n; j++)
                mean[j] += y[j] / (double)T;
        }
        double amax = 0;
        for (uint32_t j = 0; j < n; j++)
            amax = fmax(amax, fabs(mean[j]));
        cr_assert(scale <= amax / 120.0, "mean scale %g wastes the INT8 range (max |mean| = %g)", (double)scale, amax);
        for (uint32_t j = 0; j < n; j++)
            cr_assert(fabs(mu[j] - mean[j]) <= 0.5 * scale * 1.01 + 1e-4 * amax, "channel %u: μ %g, mean %g", j,
                      (double)mu[j], mean[j]);

        /* Token decode = unrotate(o + s·m + μ) of each record. */
        cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_K, mblock, recs, rk, T, out, DQ_DTYPE_F32), DQ_OK);
        double err = 0, energy = 0;
        for (uint32_t t = 0; t < T; t++) {
            cr_assert_eq(dq_stream_decode(codec, DQ_KIND_K, recs + (size_t)t * rk, y), DQ_OK);
            for (uint32_t j = 0; j < n; j++)
                y[j] += mu[j];
            dq_unrotate(codec, y);
            const double r = dqt_rel_l2_f(out + (size_t)t * n, y, n);
            cr_assert(r <= 1e-6, "token %u: dq_tokens_decode differs from unrotate(o + s·m + μ) by %.3g", t, r);
            for (uint32_t j = 0; j < n; j++) {
                const double dx = (double)x[(size_t)t * n + j] - out[(size_t)t * n + j];
                err += dx * dx;
                energy += (double)x[(size_t)t * n + j] * x[(size_t)t * n + j];
            }
        }
        cr_assert_lt(err / energy, 0.05, "keys with channel offsets reconstruct with NMSE %.4f", err / energy);

        /* Other output dtypes are the f32 result converted. */
        uint16_t *o16 = dqt_xmalloc((size_t)T * n * 2);
        cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_K, mblock, recs, rk, T, o16, DQ_DTYPE_F16), DQ_OK);
        for (size_t i = 0; i < (size_t)T * n; i++)
            cr_assert_eq(o16[i], dq_f32_to_f16(out[i]), "f16 output %zu", i);
        cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_K, mblock, recs, rk, T, o16, DQ_DTYPE_BF16), DQ_OK);
        for (size_t i = 0; i < (size_t)T * n; i++)
            cr_assert_eq(o16[i], dq_f32_to_bf16(out[i]), "bf16 output %zu", i);
        free(o16);
    }
    free(x);
    free(out);
    free(y);
    free(mu);
    free(mean);
    free(mblock);
    free(recs);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Values: no mean; decode = unrotate(o + s·m); any token count; strided records. */
Test(tokens, values)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec), T = 300;
    const size_t rv = dq_codec_record_bytes(codec, DQ_KIND_V), stride = rv + 5;
    float *x = dqt_xmalloc((size_t)T * n * sizeof *x), *out = dqt_xmalloc((size_t)T * n * sizeof *out);
    float *y = dqt_xmalloc(n * sizeof *y);
    uint8_t *recs = dqt_xmalloc((T - 1) * stride + rv);
    for (size_t i = 0; i < (size_t)T * n; i++)
        x[i] = (float)dqt_normal(&rng);
    cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, T, NULL, recs, stride, NULL), DQ_OK);
    cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_V, NULL, recs, stride, T, out, DQ_DTYPE_F32), DQ_OK);
    for (uint32_t t = 0; t < T; t++) {
        cr_assert_eq(dq_stream_decode(codec, DQ_KIND_V, recs + t * stride, y), DQ_OK);
        dq_unrotate(codec, y);
        cr_assert(dqt_rel_l2_f(out + (size_t)t * n, y, n) <= 1e-6, "token %u differs from unrotate(o + s·m)", t);
    }
    const double rel = dqt_rel_l2_f(out, x, (size_t)T * n);
    cr_assert_lt(rel, 0.45, "Gaussian values reconstruct with relative error %.3f", rel);
    free(x);
    free(out);
    free(y);
    free(recs);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The "bf16" baseline stores the values as they are: BF16 input gives the same records as the same
 * values in F32 (each record the input's bits, little-endian), decodes back exactly, and a non-finite
 * value is refused. */
Test(tokens, bf16_baseline_from_bf16)
{
    dq_profile p;
    cr_assert_eq(dq_profile_baseline("bf16", 2, 64, &p), DQ_OK);
    dq_codec *codec = NULL;
    cr_assert_eq(dq_codec_create(&p, NULL, &codec), DQ_OK);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec), T = 70;
    const size_t rb = dq_codec_record_bytes(codec, DQ_KIND_V), stride = rb + 3;
    cr_assert_geq(rb, 2u * n);
    uint16_t *xb = dqt_xmalloc((size_t)T * n * 2), *back = dqt_xmalloc((size_t)T * n * 2);
    float *xf = dqt_xmalloc((size_t)T * n * sizeof *xf);
    for (size_t i = 0; i < (size_t)T * n; i++) {
        xb[i] = dq_f32_to_bf16((float)dqt_normal(&rng) * 3.0f);
        xf[i] = dq_bf16_to_f32(xb[i]);
    }
    uint8_t *rec_b = dqt_xmalloc((size_t)T * stride), *rec_f = dqt_xmalloc((size_t)T * stride);
    memset(rec_b, 0xa5, (size_t)T * stride);
    memset(rec_f, 0xa5, (size_t)T * stride);
    for (int kind = 0; kind < 2; kind++) {
        cr_assert_eq(dq_tokens_encode(codec, ws, (dq_kind)kind, xb, DQ_DTYPE_BF16, T, NULL, rec_b, stride, NULL),
                     DQ_OK);
        cr_assert_eq(dq_tokens_encode(codec, ws, (dq_kind)kind, xf, DQ_DTYPE_F32, T, NULL, rec_f, stride, NULL), DQ_OK);
        cr_assert_eq(memcmp(rec_b, rec_f, (size_t)T * stride), 0, "kind %d: BF16 and F32 input differ", kind);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t j = 0; j < n; j++) {
                const uint8_t *r = rec_b + (size_t)t * stride + 2 * j;
                cr_assert_eq((uint16_t)(r[0] | r[1] << 8), xb[(size_t)t * n + j], "token %u value %u", t, j);
            }
        cr_assert_eq(dq_tokens_decode(codec, ws, (dq_kind)kind, NULL, rec_b, stride, T, back, DQ_DTYPE_BF16), DQ_OK);
        cr_assert_eq(memcmp(back, xb, (size_t)T * n * 2), 0, "kind %d: decoded values differ", kind);
        float *backf = dqt_xmalloc((size_t)T * n * sizeof *backf);
        cr_assert_eq(dq_tokens_decode(codec, ws, (dq_kind)kind, NULL, rec_b, stride, T, backf, DQ_DTYPE_F32), DQ_OK);
        cr_assert_eq(memcmp(backf, xf, (size_t)T * n * sizeof *xf), 0, "kind %d: values decoded to F32 differ", kind);
        free(backf);
    }
    xb[(size_t)(T - 1) * n + 5] = 0x7fc0; /* NaN */
    cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, xb, DQ_DTYPE_BF16, T, NULL, rec_b, stride, NULL), DQ_NONFINITE);
    free(xb);
    free(back);
    free(xf);
    free(rec_b);
    free(rec_f);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

Test(tokens, argument_checks)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec), W = dq_codec_profile(codec)->window;
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), rv = dq_codec_record_bytes(codec, DQ_KIND_V);
    float *x = dqt_xmalloc((size_t)(W + 1) * n * sizeof *x);
    for (size_t i = 0; i < (size_t)(W + 1) * n; i++)
        x[i] = (float)dqt_normal(&rng);
    uint8_t *mean = dqt_xmalloc(dq_codec_mean_bytes(codec)), *recs = dqt_xmalloc((size_t)(W + 1) * rk);
    cr_assert_lt(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, W + 1, mean, recs, rk, NULL), 0,
                 "a key window of W + 1 tokens accepted");
    cr_assert_lt(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, 4, NULL, recs, rk, NULL), 0,
                 "keys without a mean block accepted");
    cr_assert_lt(dq_tokens_encode(codec, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, mean, recs, rv, NULL), 0,
                 "values with a mean block accepted");
    cr_assert_lt(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, 4, mean, recs, rk - 1, NULL), 0,
                 "a record stride below the record size accepted");
    cr_assert_lt(dq_tokens_encode(codec, ws, DQ_KIND_V, x, (dq_dtype)3, 4, NULL, recs, rv, NULL), 0,
                 "an unknown dtype accepted");
    cr_assert_lt(dq_tokens_encode(codec, ws, (dq_kind)2, x, DQ_DTYPE_F32, 4, NULL, recs, rv, NULL), 0,
                 "an unknown kind accepted");
    dq_codec *other = dqt_codec_builtin("dq196", 2, 128);
    cr_assert_lt(dq_tokens_encode(other, ws, DQ_KIND_V, x, DQ_DTYPE_F32, 4, NULL, recs, rv, NULL), 0,
                 "a workspace of another codec accepted");
    dq_codec_free(other);
    free(x);
    free(mean);
    free(recs);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
