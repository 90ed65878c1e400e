/* Stream encoder and decoder (DESIGN §2.3–2.5): every stream of every distribution fits its
 * container, decodes to exactly the levels the encoder assigned, and reconstructs to o + s·m from
 * the record's fp16 metadata. 1e5 streams per profile (DQ_TEST_STREAMS overrides: the sanitizer
 * build sets a smaller count). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"

/* 1e5 streams per profile; the sanitizer build (-O0, ASan+UBSan) runs a quarter. */
#ifdef DQT_SANITIZED
#define DEFAULT_STREAMS 25000
#else
#define DEFAULT_STREAMS 100000
#endif

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x57ea3u);
}

static void suite_fini(void)
{
}

TestSuite(stream, .init = suite_init, .fini = suite_fini);

enum dist {
    DIST_GAUSS,
    DIST_STUDENT2,
    DIST_CAUCHY,
    DIST_CONSTANT,
    DIST_HUGE,
    DIST_TINY,
    DIST_OUTLIERS,
    DIST_TWO_VALUES,
    DIST_SPARSE,
    DIST_UNIFORM,
    DIST_MINUSCULE,
    DIST_COUNT
};

static const char *dist_name[DIST_COUNT] = {"gauss",    "student-t2", "cauchy", "constant", "huge",     "tiny",
                                            "outliers", "two-values", "sparse", "uniform",  "minuscule"};

static double clip(double v, double lim)
{
    return v > lim ? lim : v < -lim ? -lim : v;
}

/* A random finite fp16 value within the stream range, returned as float. */
static float random_half(void)
{
    for (;;) {
        uint16_t h = (uint16_t)dqt_next(&rng);
        float f = dq_f16_to_f32(h);
        if (isfinite(f) && fabsf(f) <= DQ_STREAM_MAX_ABS)
            return f;
    }
}

static void gen_stream(enum dist d, float *y, uint32_t n)
{
    double scale = pow(10.0, -2.0 + 4.0 * dqt_uniform(&rng));
    double mean = dqt_normal(&rng) * scale * 0.5;
    switch (d) {
    case DIST_GAUSS:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(mean + scale * dqt_normal(&rng));
        break;
    case DIST_STUDENT2:
        for (uint32_t i = 0; i < n; i++) {
            double u = 1.0 - dqt_uniform(&rng);
            double t = dqt_normal(&rng) / sqrt(-log(u) + 1e-300);
            y[i] = (float)clip(scale * t, DQ_STREAM_MAX_ABS);
        }
        break;
    case DIST_CAUCHY:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)clip(scale * tan(3.141592653589793 * (dqt_uniform(&rng) - 0.5)), DQ_STREAM_MAX_ABS);
        break;
    case DIST_CONSTANT: {
        float c = dqt_below(&rng, 4) == 0 ? 0.0f : random_half();
        for (uint32_t i = 0; i < n; i++)
            y[i] = c;
        break;
    }
    case DIST_HUGE:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)clip(12000.0 * dqt_normal(&rng), DQ_STREAM_MAX_ABS);
        y[dqt_below(&rng, n)] = DQ_STREAM_MAX_ABS;
        y[dqt_below(&rng, n)] = -DQ_STREAM_MAX_ABS;
        break;
    case DIST_TINY: {
        static const double centres[] = {0.0, 0.37, -1.0, 100.0};
        double c = centres[dqt_below(&rng, 4)];
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(c + 1e-6 * dqt_normal(&rng));
        break;
    }
    case DIST_OUTLIERS: {
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(scale * dqt_normal(&rng));
        uint32_t k = 1 + dqt_below(&rng, 8);
        for (uint32_t j = 0; j < k; j++) {
            double v = scale * (20.0 + 980.0 * dqt_uniform(&rng)) * (dqt_below(&rng, 2) ? 1 : -1);
            y[dqt_below(&rng, n)] = (float)clip(v, DQ_STREAM_MAX_ABS);
        }
        break;
    }
    case DIST_TWO_VALUES: {
        float a = (float)(scale * dqt_normal(&rng)), b = (float)(scale * dqt_normal(&rng));
        for (uint32_t i = 0; i < n; i++)
            y[i] = dqt_below(&rng, 2) ? a : b;
        break;
    }
    case DIST_SPARSE:
        for (uint32_t i = 0; i < n; i++)
            y[i] = dqt_below(&rng, 16) == 0 ? (float)(scale * dqt_normal(&rng)) : 0.0f;
        break;
    case DIST_UNIFORM:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(mean + scale * (2.0 * dqt_uniform(&rng) - 1.0));
        break;
    default: /* far below the smallest fp16 subnormal */
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(1e-30 * dqt_normal(&rng));
        break;
    }
}

struct stream_param {
    char name[16];
    int builtin;
    uint32_t kv_heads, head_dim;
    uint32_t container[2];
    uint32_t levels[2];
};

ParameterizedTestParameters(stream, random_streams)
{
    static struct stream_param p[] = {
        {"dq226", 1, 8, 128, {0, 0}, {0, 0}},    {"dq196", 1, 8, 128, {0, 0}, {0, 0}},
        {"tiny-d2", 0, 1, 2, {6, 6}, {8, 6}},    {"tiny-d4", 0, 1, 4, {7, 6}, {8, 6}},
        {"tiny-d16", 0, 1, 16, {11, 9}, {8, 6}},
    };
    return cr_make_param_array(struct stream_param, p, sizeof p / sizeof p[0]);
}

static dq_codec *param_codec(const struct stream_param *sp)
{
    if (sp->builtin)
        return dqt_codec_builtin(sp->name, sp->kv_heads, sp->head_dim);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = sp->kv_heads;
    pp.head_dim = sp->head_dim;
    pp.container_bytes[0] = sp->container[0];
    pp.container_bytes[1] = sp->container[1];
    pp.levels[0] = sp->levels[0];
    pp.levels[1] = sp->levels[1];
    pp.name = sp->name;
    return dqt_codec_make(&pp);
}

ParameterizedTest(struct stream_param *sp, stream, random_streams)
{
    dq_codec *codec = param_codec(sp);
    const dq_profile *prof = dq_codec_profile(codec);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    cr_assert_eq(n, sp->kv_heads * sp->head_dim);
    const long count = dqt_env_long("DQ_TEST_STREAMS", DEFAULT_STREAMS);

    float *y = dqt_xmalloc(n * sizeof *y), *dec = dqt_xmalloc(n * sizeof *dec);
    uint8_t *lev_enc = dqt_xmalloc(n), *lev_dec = dqt_xmalloc(n), *lev_ref = dqt_xmalloc(n);
    uint8_t *record[2];
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(dq_codec_record_bytes(codec, (dq_kind)k), 4 + (size_t)prof->container_bytes[k]);
        record[k] = dqt_xmalloc(dq_codec_record_bytes(codec, (dq_kind)k));
    }

    dq_encode_stats stats[2];
    memset(stats, 0, sizeof stats);
    double gauss_err[2] = {0}, gauss_energy[2] = {0};
    long per_dist[DIST_COUNT] = {0};
    for (long i = 0; i < count; i++) {
        const dq_kind kind = (dq_kind)(i & 1);
        const enum dist d = (enum dist)((i >> 1) % DIST_COUNT);
        const uint32_t C = prof->container_bytes[kind], M = prof->levels[kind];
        per_dist[d]++;
        gen_stream(d, y, n);

        uint64_t streams_before = stats[kind].streams;
        int rc = dq__stream_encode_ex(codec, ws, kind, y, record[kind], &stats[kind], lev_enc);
        cr_assert_eq(rc, DQ_OK, "%s stream %ld (%s, kind %d): encode returned %s", sp->name, i, dist_name[d], kind,
                     dq_err_name(rc));
        cr_assert_eq(stats[kind].streams, streams_before + 1, "stats.streams not counted");
        cr_assert_leq(stats[kind].max_payload_bytes, C, "%s: payload %u exceeds C = %u", sp->name,
                      stats[kind].max_payload_bytes, C);

        memset(lev_dec, 0xee, n);
        rc = dq_stream_decode_levels(codec, kind, record[kind], lev_dec);
        cr_assert_eq(rc, DQ_OK, "%s stream %ld (%s, kind %d): own container rejected: %s", sp->name, i, dist_name[d],
                     kind, dq_err_name(rc));
        for (uint32_t j = 0; j < n; j++) {
            cr_assert_lt(lev_enc[j], M, "%s: assigned level %u >= M", sp->name, lev_enc[j]);
            if (lev_dec[j] != lev_enc[j])
                cr_assert_fail("%s stream %ld (%s, kind %d): value %u decodes to level %u, encoder assigned %u",
                               sp->name, i, dist_name[d], kind, j, lev_dec[j], lev_enc[j]);
        }

        /* The spec decoder agrees: state rules and zero padding hold, payload within C. */
        dqt_ref_decode rd = dqt_ref_rans_decode(prof->freq[kind], M, record[kind] + 4, C, n, lev_ref);
        cr_assert(rd.valid, "%s stream %ld (%s): container breaks the format (state %#x, consumed %u of %u)", sp->name,
                  i, dist_name[d], rd.final_state, rd.consumed, C);
        cr_assert(memcmp(lev_ref, lev_enc, n) == 0, "%s stream %ld: spec decoder levels differ", sp->name, i);

        rc = dq_stream_decode(codec, kind, record[kind], dec);
        cr_assert_eq(rc, DQ_OK, "dq_stream_decode: %s", dq_err_name(rc));
        const float s = dqt_record_s(record[kind]), o = dqt_record_o(record[kind]);
        cr_assert(isfinite(s) && isfinite(o), "%s stream %ld (%s): metadata s=%g o=%g", sp->name, i, dist_name[d],
                  (double)s, (double)o);
        for (uint32_t j = 0; j < n; j++) {
            float want = o + s * (float)lev_enc[j];
            if (memcmp(&want, &dec[j], sizeof want) != 0)
                cr_assert_fail("%s stream %ld (%s): value %u decodes to %.9g, o + s·m = %.9g", sp->name, i,
                               dist_name[d], j, (double)dec[j], (double)want);
        }

        if (d == DIST_CONSTANT) {
            cr_assert(s == 0.0f, "%s: constant stream has s = %g", sp->name, (double)s);
            for (uint32_t j = 0; j < n; j++)
                cr_assert(dec[j] == y[j], "%s: constant %.9g decodes to %.9g", sp->name, (double)y[j], (double)dec[j]);
        }
        if (d == DIST_GAUSS) {
            double mean = 0;
            for (uint32_t j = 0; j < n; j++)
                mean += y[j];
            mean /= n;
            for (uint32_t j = 0; j < n; j++) {
                gauss_err[kind] += ((double)y[j] - dec[j]) * ((double)y[j] - dec[j]);
                gauss_energy[kind] += (y[j] - mean) * (y[j] - mean);
            }
        }
    }

    for (int k = 0; k < 2; k++) {
        double nmse = gauss_energy[k] > 0 ? gauss_err[k] / gauss_energy[k] : 0;
        fprintf(stderr,
                "%s kind %c: %llu streams, retries %llu, fallbacks %llu, max payload %u/%u B, mean payload %.1f B, "
                "Gaussian NMSE %.4f\n",
                sp->name, k ? 'V' : 'K', (unsigned long long)stats[k].streams, (unsigned long long)stats[k].retries,
                (unsigned long long)stats[k].fallbacks, stats[k].max_payload_bytes, prof->container_bytes[k],
                stats[k].streams ? (double)stats[k].payload_bytes / (double)stats[k].streams : 0.0, nmse);
        cr_assert_leq(stats[k].payload_bytes, stats[k].streams * prof->container_bytes[k]);
        if (sp->builtin) {
            /* The budget B = 8C − 32 with the exact integer costs leaves room for rANS's few extra
             * bits: redoing a stream is the exception, the all-cheapest fallback rarer still. */
            cr_assert_leq(stats[k].retries * 100, stats[k].streams, "%s kind %d: %llu retries in %llu streams",
                          sp->name, k, (unsigned long long)stats[k].retries, (unsigned long long)stats[k].streams);
            cr_assert_leq(stats[k].fallbacks * 1000, stats[k].streams, "%s kind %d: %llu fallbacks in %llu streams",
                          sp->name, k, (unsigned long long)stats[k].fallbacks, (unsigned long long)stats[k].streams);
        }
        if (sp->builtin && count >= 1000) {
            /* 1.5 × the uniform-quantizer error of the min–max grid over E[range] ≈ 6.5σ (n=1024):
             * drift may cost something, not break the stream down. */
            double step = 6.5 / (prof->levels[k] - 1);
            double bound = 1.5 * step * step / 12.0;
            cr_assert_lt(nmse, bound, "%s kind %d: Gaussian NMSE %.4f above %.4f", sp->name, k, nmse, bound);
        }
    }

    for (int k = 0; k < 2; k++)
        free(record[k]);
    free(y);
    free(dec);
    free(lev_enc);
    free(lev_dec);
    free(lev_ref);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Values at the edge of the documented stream range (DQ_STREAM_MAX_ABS) encode; one value past it
 * is DQ_RANGE. */
Test(stream, range_limits)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 8, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    float *y = dqt_xmalloc(n * sizeof *y), *dec = dqt_xmalloc(n * sizeof *dec);
    for (int k = 0; k < 2; k++) {
        uint8_t *rec = dqt_xmalloc(dq_codec_record_bytes(codec, (dq_kind)k));
        for (uint32_t j = 0; j < n; j++)
            y[j] = (float)clip(10000.0 * dqt_normal(&rng), DQ_STREAM_MAX_ABS);
        y[3] = DQ_STREAM_MAX_ABS;
        y[700] = -DQ_STREAM_MAX_ABS;
        cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)k, y, rec, NULL), DQ_OK,
                     "values within ±DQ_STREAM_MAX_ABS must encode (kind %d)", k);
        cr_assert_eq(dq_stream_decode(codec, (dq_kind)k, rec, dec), DQ_OK);
        cr_assert_lt(dqt_rel_l2_f(dec, y, n), 0.5, "kind %d: edge-range stream decodes to garbage", k);

        const float beyond[] = {nextafterf(DQ_STREAM_MAX_ABS, INFINITY),
                                -nextafterf(DQ_STREAM_MAX_ABS, INFINITY),
                                65520.0f,
                                -70000.0f,
                                -1e30f,
                                3.0e38f};
        for (size_t b = 0; b < sizeof beyond / sizeof beyond[0]; b++) {
            for (uint32_t j = 0; j < n; j++)
                y[j] = (float)dqt_normal(&rng);
            y[dqt_below(&rng, n)] = beyond[b];
            int rc = dq_stream_encode(codec, ws, (dq_kind)k, y, rec, NULL);
            cr_assert_eq(rc, DQ_RANGE, "kind %d: value %g gave %s, expected RANGE", k, (double)beyond[b],
                         dq_err_name(rc));
        }
        free(rec);
    }
    free(y);
    free(dec);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Constants of every kind, fp16 extremes and subnormals included, come back exactly. */
Test(stream, constants_exact)
{
    static const float consts[] = {0.0f,
                                   -0.0f,
                                   1.0f,
                                   -2.5f,
                                   DQ_STREAM_MAX_ABS,
                                   -DQ_STREAM_MAX_ABS,
                                   5.9604645e-08f /* 2^-24 */,
                                   6.1035156e-05f /* 2^-14 */,
                                   1234.0f,
                                   -0.099975586f};
    dq_codec *codec = dqt_codec_builtin("dq196", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    float *y = dqt_xmalloc(n * sizeof *y), *dec = dqt_xmalloc(n * sizeof *dec);
    for (int k = 0; k < 2; k++) {
        uint8_t *rec = dqt_xmalloc(dq_codec_record_bytes(codec, (dq_kind)k));
        for (size_t c = 0; c < sizeof consts / sizeof consts[0]; c++) {
            cr_assert_eq(dq_f16_to_f32(dq_f32_to_f16(consts[c])), consts[c], "test constant not fp16");
            for (uint32_t j = 0; j < n; j++)
                y[j] = consts[c];
            cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)k, y, rec, NULL), DQ_OK);
            cr_assert_eq(dqt_record_s(rec), 0.0f, "constant %g: s = %g", (double)consts[c], (double)dqt_record_s(rec));
            cr_assert_eq(dq_stream_decode(codec, (dq_kind)k, rec, dec), DQ_OK);
            for (uint32_t j = 0; j < n; j++)
                cr_assert_eq(dec[j], consts[c], "constant %.9g decodes to %.9g", (double)consts[c], (double)dec[j]);
        }
        free(rec);
    }
    free(y);
    free(dec);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Statistics are added to, not reset. */
Test(stream, stats_accumulate)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    float *y = dqt_xmalloc(n * sizeof *y);
    uint8_t *rec = dqt_xmalloc(dq_codec_record_bytes(codec, DQ_KIND_V));
    for (uint32_t j = 0; j < n; j++)
        y[j] = (float)dqt_normal(&rng);
    dq_encode_stats st;
    memset(&st, 0, sizeof st);
    cr_assert_eq(dq_stream_encode(codec, ws, DQ_KIND_V, y, rec, &st), DQ_OK);
    dq_encode_stats one = st;
    cr_assert_eq(one.streams, 1);
    cr_assert(one.payload_bytes >= 4 && one.payload_bytes <= dq_codec_profile(codec)->container_bytes[1]);
    cr_assert_eq(one.max_payload_bytes, one.payload_bytes);
    cr_assert_eq(dq_stream_encode(codec, ws, DQ_KIND_V, y, rec, &st), DQ_OK);
    cr_assert_eq(st.streams, 2);
    cr_assert_eq(st.payload_bytes, 2 * one.payload_bytes);
    cr_assert_eq(st.symbols_moved, 2 * one.symbols_moved);
    cr_assert_eq(st.max_payload_bytes, one.max_payload_bytes);
    cr_assert_eq(dq_stream_encode(codec, ws, DQ_KIND_V, y, rec, NULL), DQ_OK, "stats may be NULL");
    free(y);
    free(rec);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
