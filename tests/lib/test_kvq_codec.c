/* The KVQuant++ codec family through the public interface (dquant/kvq.h, DQ_CODEC_KVQ): profile
 * names and their serialization, encode/decode through dq_tokens_* and through layers (the GET
 * path), the Lloyd–Max distortion bound, unbiased inner products of the IP keys, outliers against
 * plain Lloyd–Max at equal bits, PQ and low-rank attention against decode-then-attend, delta coding
 * on a drifting stream with per-window random access, the calibration blob's validation, per-layer
 * views, and dq_attend against dq_attend_reference. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"
#include "dquant/kvq.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x6b7671u);
}

TestSuite(kvq, .init = suite_init);

#define H 2u
#define D 64u
#define N (H * D)
#define W 128u

static float *gauss(size_t count, double sd)
{
    float *x = dqt_xmalloc(count * sizeof *x);
    for (size_t i = 0; i < count; i++)
        x[i] = (float)(sd * dqt_normal(&rng));
    return x;
}

static dq_profile profile(const char *name)
{
    dq_profile p;
    int rc = dq_profile_kvq(name, H, D, &p);
    cr_assert_eq(rc, DQ_OK, "%s: %s", name, dq_err_name(rc));
    return p;
}

/* Planted outlier channels: per layer its own set, std 12 there, 1 elsewhere. */
static float *outlier_data(size_t layers, size_t T, uint32_t salt)
{
    float *x = gauss(layers * T * N, 1.0);
    for (size_t l = 0; l < layers; l++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t i = 0; i < 6; i++) {
                uint32_t ch = (7u * i + 11u * (uint32_t)l + salt + 3u * h) % D;
                for (size_t t = 0; t < T; t++)
                    x[(l * T + t) * N + h * D + ch] *= 12.0f;
            }
    return x;
}

/* A calibrated codec (or a plain one) for a profile name; calibration on `layers` layers. */
static dq_codec *make_codec(const char *name, uint32_t layers, const float *k, const float *v, size_t T,
                            dq_profile *pout)
{
    dq_profile p = profile(name);
    dq_codec *c = NULL;
    if (layers) {
        uint8_t *blob = NULL;
        size_t len = 0;
        cr_assert_eq(dq_kvq_calibrate(&p, layers, k, v, T, 7, &blob, &len), DQ_OK, "%s", name);
        cr_assert_eq(dq_codec_create_calibrated(&p, blob, len, NULL, &c), DQ_OK, "%s", name);
        dq_kvq_free(blob);
    } else {
        cr_assert_eq(dq_codec_create(&p, NULL, &c), DQ_OK, "%s", name);
    }
    if (pout)
        *pout = p;
    return c;
}

/* Mean over tokens and heads of |x − x̂|² / |x|². */
static double rel_mse(const float *x, const float *y, size_t T)
{
    double s = 0;
    for (size_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            double e = 0, nx = 0;
            for (uint32_t j = 0; j < D; j++) {
                double a = x[t * N + h * D + j], b = y[t * N + h * D + j];
                e += (a - b) * (a - b);
                nx += a * a;
            }
            s += e / nx;
        }
    return s / (double)(T * H);
}

static double mse(const float *x, const float *y, size_t count)
{
    double s = 0;
    for (size_t i = 0; i < count; i++)
        s += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    return s / (double)count;
}

/* Encodes T (<= W) tokens of one kind through dq_tokens_encode and decodes them back. */
static void roundtrip(const dq_codec *c, dq_workspace *ws, dq_kind kind, const float *x, size_t T, float *out)
{
    const size_t rb = dq_codec_record_bytes(c, kind), mb = dq_codec_mean_bytes(c);
    uint8_t *hdr = kind == DQ_KIND_K && mb ? dqt_xmalloc(mb) : NULL;
    uint8_t *rec = dqt_xmalloc(T * rb);
    cr_assert_eq(dq_tokens_encode(c, ws, kind, x, DQ_DTYPE_F32, T, hdr, rec, rb, NULL), DQ_OK);
    cr_assert_eq(dq_tokens_decode(c, ws, kind, hdr, rec, rb, T, out, DQ_DTYPE_F32), DQ_OK);
    free(hdr);
    free(rec);
}

/* ---- profiles ---- */

static const char *const good_names[] = {
    "lm1",           "lm2",
    "lm3",           "lm4",
    "lm8",           "lmh3",
    "ip2",           "ip3",
    "ip4",           "iph3",
    "ol2",           "ol3",
    "ol7",           "ol2+o32",
    "pq8x4",         "pq16x8",
    "pq64x1",        "lm3+lr4",
    "ip3+lr4",       "lm2+d16",
    "ol3+d8",        "pq8x4+d16",
    "lm3+d128",      "ip3+lr2+d32",
    "ol3+o8+lr1+d4", "pq16x8+lr4+d64",
};

Test(kvq, names_parse_validate_and_round_trip)
{
    for (size_t i = 0; i < sizeof good_names / sizeof good_names[0]; i++) {
        const char *nm = good_names[i];
        dq_profile p = profile(nm), q, b;
        cr_assert_eq(p.codec_type, DQ_CODEC_KVQ);
        cr_assert_eq(dq_profile_validate(&p), DQ_OK, "%s", nm);
        cr_assert_eq(dq_profile_builtin(nm, H, D, &b), DQ_OK, "%s", nm);
        uint8_t buf[DQ_PROFILE_SERIALIZED_MAX], buf2[DQ_PROFILE_SERIALIZED_MAX];
        size_t len = 0, len2 = 0;
        cr_assert_eq(dq_profile_serialize(&p, buf, sizeof buf, &len), DQ_OK, "%s", nm);
        cr_assert_eq(dq_profile_deserialize(buf, len, &q), DQ_OK, "%s", nm);
        cr_assert_eq(dq_profile_serialize(&q, buf2, sizeof buf2, &len2), DQ_OK);
        cr_assert(len == len2 && memcmp(buf, buf2, len) == 0, "%s", nm);
        cr_assert(q.kvq_variant == p.kvq_variant && q.kvq_rotation == p.kvq_rotation &&
                  q.kvq_outliers == p.kvq_outliers && q.kvq_pq_m == p.kvq_pq_m && q.kvq_rank == p.kvq_rank &&
                  q.kvq_anchor == p.kvq_anchor && q.kvq_tau == p.kvq_tau && q.bits[0] == p.bits[0] &&
                  q.bits[1] == p.bits[1] && strcmp(q.name, nm) == 0);
        /* every truncation is refused; a flipped checksum byte too */
        for (size_t l = 0; l < len; l++)
            cr_assert_lt(dq_profile_deserialize(buf, l, &q), 0, "%s len %zu", nm, l);
        buf[len - 1] ^= 1;
        cr_assert_eq(dq_profile_deserialize(buf, len, &q), DQ_CORRUPT);
        cr_assert_eq(dq_profile_needs_calibration(&p), p.kvq_variant >= DQ_KVQ_OUTLIER);
    }
}

Test(kvq, serialized_calibration_fields_round_trip)
{
    dq_profile p = profile("ol3+d8");
    p.kvq_layers = 5;
    p.kvq_calib_hash = 0x0123456789abcdefull;
    p.kvq_tau = 0.25f;
    uint8_t buf[DQ_PROFILE_SERIALIZED_MAX];
    size_t len = 0;
    dq_profile q;
    cr_assert_eq(dq_profile_serialize(&p, buf, sizeof buf, &len), DQ_OK);
    cr_assert_eq(len, 148u);
    cr_assert_eq(dq_profile_deserialize(buf, len, &q), DQ_OK);
    cr_assert(q.kvq_layers == 5 && q.kvq_calib_hash == 0x0123456789abcdefull && q.kvq_tau == 0.25f);
    /* the other codecs keep their layout: a baseline serializes to 108 bytes as before */
    dq_profile t;
    cr_assert_eq(dq_profile_baseline("turbo2", H, D, &t), DQ_OK);
    cr_assert_eq(dq_profile_serialize(&t, buf, sizeof buf, &len), DQ_OK);
    cr_assert_eq(len, 108u);
    /* KVQ fields on another codec type are refused */
    t.kvq_rank = 2;
    cr_assert_eq(dq_profile_validate(&t), DQ_PROFILE);
}

Test(kvq, bad_names_and_fields)
{
    static const char *const bad[] = {"lm0",        "lm9",    "ip1",     "ol1",        "ol8",      "pq3x4",
                                      "pq8x9",      "pq8",    "pqx4",    "lm3+lr",     "lm3+d0",   "lm3+x2",
                                      "lm3+d4+lr2", "lm3+o4", "ol3+o64", "ol3+o0",     "lm3+lr65", "lm3+d129",
                                      "foo",        "lm",     "lm3+",    "lm3+lr2+lr2"};
    dq_profile p;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(dq_profile_kvq(bad[i], H, D, &p), DQ_PROFILE, "%s", bad[i]);
    cr_assert_eq(dq_profile_kvq("lm3", H, 48, &p), DQ_PROFILE);
    cr_assert_eq(dq_profile_kvq(NULL, H, D, &p), DQ_INVALID_ARGUMENT);
    p = profile("lm3");
    p.container_bytes[0]++;
    cr_assert_eq(dq_profile_validate(&p), DQ_PROFILE);
    p = profile("lm3");
    p.kvq_layers = 2; /* layers without a hash */
    cr_assert_eq(dq_profile_validate(&p), DQ_PROFILE);
    p = profile("lm3");
    p.kvq_tau = 0.5f; /* tau without delta coding */
    cr_assert_eq(dq_profile_validate(&p), DQ_PROFILE);
    /* profiles that need tables cannot make a plain codec */
    dq_codec *c = NULL;
    p = profile("ol3");
    cr_assert_eq(dq_codec_create(&p, NULL, &c), DQ_PROFILE);
    cr_assert_eq(dq_codec_create_calibrated(&p, NULL, 0, NULL, &c), DQ_PROFILE);
    cr_assert_null(c);
}

Test(kvq, bits_per_value_counts_every_byte)
{
    struct {
        const char *name;
        double k, v;
    } cases[] = {
        /* lm: per head fp16 norm + d·b bits */
        {"lm2", 8.0 * (2 * H + N * 2 / 8) / N, 8.0 * (2 * H + N * 2 / 8) / N},
        /* ip keys: norm + residual norm, (b−1)·d + d bits */
        {"ip3", 8.0 * (4 * H + N * 3 / 8) / N, 8.0 * (2 * H + N * 3 / 8) / N},
        /* ol: two norms per head, d/4 at b+1 and 3d/4 at b−1 */
        {"ol3", 8.0 * (4 * H + (H * (16 * 4 + 48 * 2)) / 8) / N, 8.0 * (4 * H + (H * (16 * 4 + 48 * 2)) / 8) / N},
        /* pq: norm + M·B bits per head */
        {"pq16x8", 8.0 * (2 * H + H * 16) / N, 8.0 * (2 * H + H * 16) / N},
        /* low rank: R fp16 per key record + R × n fp16 per window of W keys */
        {"lm2+lr4", 8.0 * (2 * H + 8 + N * 2 / 8) / N + 8.0 * (2 * 4 * N) / (N * W), 8.0 * (2 * H + N * 2 / 8) / N},
        /* delta: the anchor flag lives in the first norm's sign bit: no extra byte */
        {"lm2+d16", 8.0 * (2 * H + N * 2 / 8) / N, 8.0 * (2 * H + N * 2 / 8) / N},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dq_profile p = profile(cases[i].name);
        cr_assert_float_eq(dq_profile_bits_per_value(&p, DQ_KIND_K), cases[i].k, 1e-12, "%s", cases[i].name);
        cr_assert_float_eq(dq_profile_bits_per_value(&p, DQ_KIND_V), cases[i].v, 1e-12, "%s", cases[i].name);
        dq_codec *c = NULL;
        if (!dq_profile_needs_calibration(&p)) {
            cr_assert_eq(dq_codec_create(&p, NULL, &c), DQ_OK);
            cr_assert_eq(dq_codec_window_bytes(c),
                         dq_codec_mean_bytes(c) + (size_t)W * (p.container_bytes[0] + p.container_bytes[1]));
            dq_codec_free(c);
        }
    }
}

/* ---- distortion ---- */

Test(kvq, lloyd_max_bound_tokens_and_layer)
{
    const size_t T = 2 * W + 40;
    float *k = gauss(T * N, 2.0), *v = gauss(T * N, 0.7), *out = dqt_xmalloc(T * N * sizeof(float));
    static const char *const names[] = {"lm1", "lm2", "lm3", "lm4", "lmh1", "lmh2", "lmh3", "lmh4"};
    double prev = INFINITY;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        dq_profile p;
        dq_codec *c = make_codec(names[i], 0, NULL, NULL, 0, &p);
        dq_workspace *ws = NULL;
        cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
        const double bound = sqrt(3.0) * M_PI / 2 * pow(4.0, -(double)p.bits[0]);
        for (int kind = 0; kind < 2; kind++) {
            const float *x = kind ? v : k;
            roundtrip(c, ws, (dq_kind)kind, x, W, out);
            double e = rel_mse(x, out, W);
            cr_assert_lt(e, bound, "%s kind %d: %g >= %g", names[i], kind, e, bound);
            if (i % 4 && kind == 0)
                cr_assert_lt(e, prev, "%s: more bits, less error", names[i]);
            if (kind == 0)
                prev = i % 4 == 3 ? INFINITY : e;
        }
        /* the GET path: a layer, sealed windows and the tail */
        dq_layer *l = NULL;
        cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
        cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, 100, NULL), DQ_OK);
        cr_assert_eq(dq_layer_append(l, ws, k + 100 * N, v + 100 * N, DQ_DTYPE_F32, T - 100, NULL), DQ_OK);
        cr_assert_eq(dq_layer_sealed_tokens(l), 2 * W);
        for (int kind = 0; kind < 2; kind++) {
            const float *x = kind ? v : k;
            cr_assert_eq(dq_layer_decode(l, ws, (dq_kind)kind, 0, T, out, DQ_DTYPE_F32), DQ_OK);
            cr_assert_lt(rel_mse(x, out, 2 * W), bound, "%s layer", names[i]);
            /* a sub-range decodes to the same values */
            float *part = dqt_xmalloc(30 * N * sizeof(float));
            cr_assert_eq(dq_layer_decode(l, ws, (dq_kind)kind, 110, 30, part, DQ_DTYPE_F32), DQ_OK);
            cr_assert(memcmp(part, out + 110 * N, 30 * N * sizeof(float)) == 0);
            free(part);
        }
        dq_layer_free(l);
        dq_workspace_free(ws);
        dq_codec_free(c);
    }
    free(k);
    free(v);
    free(out);
}

Test(kvq, ip_keys_unbiased_over_seeds)
{
    /* E over the rotation seed (which also draws S) of <y, x̂> is <y, x>; plain Lloyd–Max shrinks it
     * (its reconstruction is biased towards the centroids' norm). 16 tokens × 2 heads per seed,
     * y = x + independent noise so that <y, x> is large. */
    const size_t T = 16;
    float *x = gauss(T * N, 1.0), *y = gauss(T * N, 1.0), *out = dqt_xmalloc(T * N * sizeof(float));
    for (size_t i = 0; i < T * N; i++)
        y[i] += x[i];
    double truth = 0;
    for (size_t i = 0; i < T * N; i++)
        truth += (double)x[i] * y[i];
    const int seeds = 200;
    double s_ip = 0, s2_ip = 0, s_lm = 0;
    for (int s = 1; s <= seeds; s++) {
        for (int variant = 0; variant < 2; variant++) {
            dq_profile p = profile(variant ? "lm2" : "ip3");
            p.rotation_seed = 0x1000u + (uint64_t)s * 7919u;
            dq_codec *c = NULL;
            dq_workspace *ws = NULL;
            cr_assert_eq(dq_codec_create(&p, NULL, &c), DQ_OK);
            cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
            roundtrip(c, ws, DQ_KIND_K, x, T, out);
            double ip = 0;
            for (size_t i = 0; i < T * N; i++)
                ip += (double)out[i] * y[i];
            if (variant) {
                s_lm += ip;
            } else {
                s_ip += ip;
                s2_ip += ip * ip;
            }
            dq_workspace_free(ws);
            dq_codec_free(c);
        }
    }
    const double mean = s_ip / seeds, sd = sqrt(s2_ip / seeds - mean * mean), se = sd / sqrt((double)seeds);
    const double lm = s_lm / seeds;
    cr_log_info("ip3: mean sum <y,x^> %.3f (truth %.3f, se %.3f, bias %+.2f%%); lm2 mean %.3f (bias %+.2f%%)", mean,
                truth, se, 100 * (mean / truth - 1), lm, 100 * (lm / truth - 1));
    cr_assert_lt(fabs(mean - truth), 4 * se + 0.002 * fabs(truth), "ip3 biased: %g vs %g", mean, truth);
    cr_assert_lt(lm, truth - 10 * se, "lm2 shrinks the inner product: %g vs %g", lm, truth);
    free(x);
    free(y);
    free(out);
}

Test(kvq, outliers_beat_lloyd_max_at_equal_bits)
{
    const size_t T = 256;
    float *k = outlier_data(1, T, 0), *v = outlier_data(1, T, 5), *out = dqt_xmalloc(W * N * sizeof(float));
    dq_profile po, pl;
    dq_codec *ol = make_codec("ol2+o32", 1, k, v, T, &po), *lm = make_codec("lm2", 0, NULL, NULL, 0, &pl);
    /* the same coordinate bits (32 at 3 + 32 at 1 = 64 at 2), one more fp16 norm per head: 16 bits
     * over 64 coordinates */
    cr_assert_float_eq(dq_profile_bits_per_value(&po, DQ_KIND_K) - dq_profile_bits_per_value(&pl, DQ_KIND_K), 0.25,
                       1e-12);
    dq_workspace *wo = NULL, *wl = NULL;
    cr_assert_eq(dq_workspace_create(ol, &wo), DQ_OK);
    cr_assert_eq(dq_workspace_create(lm, &wl), DQ_OK);
    for (int kind = 0; kind < 2; kind++) {
        const float *x = (kind ? v : k) + 128 * N; /* tokens not used alone for calibration order */
        roundtrip(ol, wo, (dq_kind)kind, x, W, out);
        double eo = mse(x, out, W * N);
        roundtrip(lm, wl, (dq_kind)kind, x, W, out);
        double el = mse(x, out, W * N);
        cr_log_info("kind %d: ol2+o32 mse %.4f, lm2 mse %.4f", kind, eo, el);
        cr_assert_lt(eo, 0.6 * el, "kind %d: outliers %g vs plain %g", kind, eo, el);
    }
    dq_workspace_free(wo);
    dq_workspace_free(wl);
    dq_codec_free(ol);
    dq_codec_free(lm);
    free(k);
    free(v);
    free(out);
}

/* ---- attention ---- */

static float *attend_pair(const dq_codec *c, dq_workspace *ws, const dq_layer *l, const float *q, uint32_t qh,
                          int reference)
{
    float *out = dqt_xmalloc((size_t)qh * D * sizeof(float)), *lse = dqt_xmalloc(qh * sizeof(float));
    dq_attn_item it = {l, q, out, lse};
    int rc = reference ? dq_attend_reference(c, ws, qh, 1.0f / sqrtf((float)D), &it, 1)
                       : dq_attend(c, ws, qh, 1.0f / sqrtf((float)D), &it, 1);
    cr_assert_eq(rc, DQ_OK, "%s", dq_err_name(rc));
    free(lse);
    return out;
}

static void check_attend(const dq_codec *root, const dq_codec *c, const float *k, const float *v, size_t T,
                         const char *what)
{
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(root, &ws), DQ_OK);
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
    cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    const uint32_t qh = 2 * H;
    float *q = gauss((size_t)qh * D, 1.0);
    float *a = attend_pair(root, ws, l, q, qh, 0), *b = attend_pair(root, ws, l, q, qh, 1);
    double e = 0, nb = 0;
    for (size_t i = 0; i < (size_t)qh * D; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        nb += (double)b[i] * b[i];
    }
    cr_assert_lt(sqrt(e / nb), 2e-5, "%s: dq_attend vs reference rel %g", what, sqrt(e / nb));
    free(a);
    free(b);
    free(q);
    dq_layer_free(l);
    dq_workspace_free(ws);
}

Test(kvq, attend_matches_reference_every_variant)
{
    const size_t T = 2 * W + 77, CT = 256;
    float *k = outlier_data(1, T, 1), *v = outlier_data(1, T, 9);
    float *ck = outlier_data(2, CT, 1), *cv = outlier_data(2, CT, 9);
    static const char *const names[] = {"lm3",     "lmh2",   "ip3",     "iph2",      "ol3",
                                        "pq8x4",   "pq16x8", "lm2+lr4", "ip3+lr2",   "pq8x4+lr2",
                                        "lm3+d16", "ip3+d8", "ol3+d32", "pq8x4+d16", "pq16x8+lr4+d64"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        dq_profile p = profile(names[i]);
        dq_codec *c = make_codec(names[i], dq_profile_needs_calibration(&p) ? 2 : 0, ck, cv, CT, NULL);
        check_attend(c, dq_codec_layer(c, 1), k, v, T, names[i]);
        dq_codec_free(c);
    }
    free(k);
    free(v);
    free(ck);
    free(cv);
}

Test(kvq, pq_lookup_attention_equals_decode_then_attend)
{
    /* dq_attend scores PQ keys through per-query tables; recompute from the decoded keys here */
    const size_t T = W, CT = 512;
    float *ck = gauss(CT * N, 1.0), *cv = gauss(CT * N, 1.0);
    dq_codec *c = make_codec("pq16x8", 1, ck, cv, CT, NULL);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    float *k = gauss(T * N, 1.0), *v = gauss(T * N, 1.0), *kd = dqt_xmalloc(T * N * 4), *vd = dqt_xmalloc(T * N * 4);
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
    cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    cr_assert_eq(dq_layer_tail_tokens(l), 0);
    cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_K, 0, T, kd, DQ_DTYPE_F32), DQ_OK);
    cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_V, 0, T, vd, DQ_DTYPE_F32), DQ_OK);
    /* PQ at 2 bits/coordinate beats scalar Lloyd–Max at 2 bits on isotropic data? Not claimed;
     * it must be a real quantizer though: relative error well below 1 */
    cr_assert_lt(rel_mse(k, kd, T), 0.5);
    float *q = gauss(H * D, 1.0);
    float *a = attend_pair(c, ws, l, q, H, 0);
    const double sc = 1.0 / sqrt((double)D);
    for (uint32_t h = 0; h < H; h++) {
        double lg[W], mx = -INFINITY, sum = 0;
        for (size_t t = 0; t < T; t++) {
            double s = 0;
            for (uint32_t j = 0; j < D; j++)
                s += (double)q[h * D + j] * kd[t * N + h * D + j];
            lg[t] = s * sc;
            mx = fmax(mx, lg[t]);
        }
        for (size_t t = 0; t < T; t++)
            sum += (lg[t] = exp(lg[t] - mx));
        for (uint32_t j = 0; j < D; j++) {
            double o = 0;
            for (size_t t = 0; t < T; t++)
                o += lg[t] * vd[t * N + h * D + j];
            cr_assert_float_eq(a[h * D + j], o / sum, 1e-4, "head %u ch %u", h, j);
        }
    }
    free(a);
    free(q);
    dq_layer_free(l);
    dq_workspace_free(ws);
    dq_codec_free(c);
    free(k);
    free(v);
    free(kd);
    free(vd);
    free(ck);
    free(cv);
}

Test(kvq, low_rank_reduces_window_error)
{
    /* keys with a shared low-rank drift per window: the quantization error keeps its structure */
    const size_t T = W;
    float *k = gauss(T * N, 0.3), *basis = gauss(3 * N, 1.0);
    for (size_t t = 0; t < T; t++)
        for (uint32_t r = 0; r < 3; r++) {
            double a = 3.0 * dqt_normal(&rng);
            for (uint32_t j = 0; j < N; j++)
                k[t * N + j] += (float)(a * basis[r * N + j]);
        }
    float *o1 = dqt_xmalloc(T * N * 4), *o2 = dqt_xmalloc(T * N * 4);
    static const char *const pairs[][2] = {{"lm2", "lm2+lr4"}, {"ip3", "ip3+lr4"}, {"lm4", "lm4+lr8"}};
    for (size_t i = 0; i < 3; i++) {
        dq_codec *a = make_codec(pairs[i][0], 0, NULL, NULL, 0, NULL),
                 *b = make_codec(pairs[i][1], 0, NULL, NULL, 0, NULL);
        dq_workspace *wa = NULL, *wb = NULL;
        cr_assert_eq(dq_workspace_create(a, &wa), DQ_OK);
        cr_assert_eq(dq_workspace_create(b, &wb), DQ_OK);
        roundtrip(a, wa, DQ_KIND_K, k, T, o1);
        roundtrip(b, wb, DQ_KIND_K, k, T, o2);
        double e1 = mse(k, o1, T * N), e2 = mse(k, o2, T * N);
        cr_log_info("%s mse %.5f, %s mse %.5f (%.1f%% lower)", pairs[i][0], e1, pairs[i][1], e2, 100 * (1 - e2 / e1));
        cr_assert_lt(e2, 0.99 * e1, "%s: %g vs %g", pairs[i][1], e2, e1);
        dq_workspace_free(wa);
        dq_workspace_free(wb);
        dq_codec_free(a);
        dq_codec_free(b);
    }
    free(k);
    free(basis);
    free(o1);
    free(o2);
}

/* A slowly drifting, strongly correlated stream with a jump at token 300. */
static float *drift_stream(size_t T)
{
    float *x = dqt_xmalloc(T * N * sizeof(float));
    for (uint32_t j = 0; j < N; j++)
        x[j] = (float)dqt_normal(&rng);
    for (size_t t = 1; t < T; t++)
        for (uint32_t j = 0; j < N; j++)
            x[t * N + j] = t == 300 ? (float)(3.0 * dqt_normal(&rng))
                                    : x[(t - 1) * N + j] + (float)(0.08 * dqt_normal(&rng));
    return x;
}

Test(kvq, delta_coding_drifting_stream_and_random_access)
{
    const size_t T = 2 * W + 60;
    float *k = drift_stream(T), *v = drift_stream(T);
    float *all = dqt_xmalloc(T * N * 4), *part = dqt_xmalloc(T * N * 4);
    static const char *const pairs[][2] = {{"lm3", "lm3+d128"}, {"ip3", "ip3+d32"}, {"lm2", "lm2+d64"}};
    for (size_t i = 0; i < 3; i++) {
        double e[2];
        for (int s = 0; s < 2; s++) {
            dq_codec *c = make_codec(pairs[i][s], 0, NULL, NULL, 0, NULL);
            dq_workspace *ws = NULL;
            dq_layer *l = NULL;
            cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
            cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
            cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
            const size_t S = dq_layer_sealed_tokens(l);
            cr_assert_eq(S, 2 * W);
            cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_K, 0, S, all, DQ_DTYPE_F32), DQ_OK);
            e[s] = mse(k, all, S * N);
            /* random access: any range of any window decodes to what the whole decode gave */
            const size_t starts[] = {0, 1, 37, 127, 128, 129, 200, 255};
            for (size_t r = 0; r < sizeof starts / sizeof starts[0]; r++) {
                size_t cnt = S - starts[r] < 9 ? S - starts[r] : 9;
                cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_K, starts[r], cnt, part, DQ_DTYPE_F32), DQ_OK);
                cr_assert(memcmp(part, all + starts[r] * N, cnt * N * sizeof(float)) == 0, "%s from %zu", pairs[i][s],
                          starts[r]);
            }
            if (s == 1) {
                /* window starts are anchors (flag: bit 15 of the first norm); the jump at token 300
                 * lies in the tail, so the windows' later records are deltas */
                const dq_profile *p = dq_codec_profile(c);
                const uint8_t *w1 = dq_layer_window(l, 1);
                cr_assert(dq_window_record(c, w1, DQ_KIND_K, 0)[1] & 0x80u);
                cr_assert(!(dq_window_record(c, w1, DQ_KIND_K, 1)[1] & 0x80u));
                cr_assert_gt(p->kvq_tau, 0);
            }
            dq_layer_free(l);
            dq_workspace_free(ws);
            dq_codec_free(c);
        }
        cr_log_info("%s mse %.5f, %s mse %.5f (%.2fx)", pairs[i][0], e[0], pairs[i][1], e[1], e[0] / e[1]);
        cr_assert_lt(e[1], e[0], "%s: delta %g vs plain %g", pairs[i][1], e[1], e[0]);
    }
    free(k);
    free(v);
    free(all);
    free(part);
}

Test(kvq, delta_adaptive_anchor_at_a_jump)
{
    /* a jump inside the first window: the record there is an anchor although 300 % 128 != 0 */
    const size_t T = W;
    float *k = drift_stream(3 * W), *v = drift_stream(3 * W);
    dq_codec *c = make_codec("lm3+d128", 0, NULL, NULL, 0, NULL);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const size_t rb = dq_codec_record_bytes(c, DQ_KIND_K);
    uint8_t *rec = dqt_xmalloc(T * rb);
    /* tokens 240..367: the jump is token 300, index 60 of this run */
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_K, k + 240 * N, DQ_DTYPE_F32, T, NULL, rec, rb, NULL), DQ_OK);
    cr_assert(rec[1] & 0x80u);
    cr_assert(rec[60 * rb + 1] & 0x80u, "adaptive anchor at the jump");
    cr_assert(!(rec[59 * rb + 1] & 0x80u) && !(rec[61 * rb + 1] & 0x80u));
    /* a run that does not start at an anchor cannot be decoded on its own */
    float *out = dqt_xmalloc(T * N * 4);
    cr_assert_eq(dq_tokens_decode(c, ws, DQ_KIND_K, NULL, rec + rb, rb, 4, out, DQ_DTYPE_F32), DQ_CORRUPT);
    cr_assert_eq(dq_tokens_decode(c, ws, DQ_KIND_K, NULL, rec + 60 * rb, rb, 4, out, DQ_DTYPE_F32), DQ_OK);
    free(out);
    free(rec);
    dq_workspace_free(ws);
    dq_codec_free(c);
    free(k);
    free(v);
}

/* ---- calibration ---- */

Test(kvq, calibration_blob_errors_are_clean)
{
    const size_t T = 96;
    float *k = outlier_data(2, T, 2), *v = outlier_data(2, T, 4);
    static const char *const names[] = {"ol3", "pq8x2", "lm3"};
    for (size_t ni = 0; ni < 3; ni++) {
        dq_profile p = profile(names[ni]);
        uint8_t *blob = NULL;
        size_t len = 0;
        uint32_t layers = 0;
        cr_assert_eq(dq_kvq_calibrate(&p, 2, k, v, T, 1, &blob, &len), DQ_OK);
        cr_assert(p.kvq_layers == 2 && p.kvq_calib_hash != 0);
        cr_assert_eq(memcmp(blob, "DQKC", 4), 0);
        cr_assert_eq(dq_kvq_calibration_check(&p, blob, len, &layers), DQ_OK);
        cr_assert_eq(layers, 2);
        uint8_t *copy = dqt_xmalloc(len + 1);
        /* every single flipped byte is refused */
        for (size_t i = 0; i < len; i++) {
            memcpy(copy, blob, len);
            copy[i] ^= (uint8_t)(1u << (i % 8));
            int rc = dq_kvq_calibration_check(&p, copy, len, NULL);
            cr_assert_lt(rc, 0, "%s: flip at %zu accepted", names[ni], i);
            dq_codec *c = NULL;
            cr_assert_lt(dq_codec_create_calibrated(&p, copy, len, NULL, &c), 0);
            cr_assert_null(c);
        }
        /* every truncation */
        for (size_t l = 0; l < len; l++) {
            int rc = dq_kvq_calibration_check(&p, blob, l, NULL);
            cr_assert(rc == DQ_TRUNCATED || rc == DQ_CORRUPT, "%s: len %zu: %s", names[ni], l, dq_err_name(rc));
        }
        memcpy(copy, blob, len);
        copy[len] = 0;
        cr_assert_eq(dq_kvq_calibration_check(&p, copy, len + 1, NULL), DQ_CORRUPT);
        /* wrong layer count or hash in the profile, another shape */
        dq_profile q = p;
        q.kvq_layers = 3;
        cr_assert_eq(dq_kvq_calibration_check(&q, blob, len, NULL), DQ_PROFILE);
        q = p;
        q.kvq_calib_hash ^= 1;
        cr_assert_eq(dq_kvq_calibration_check(&q, blob, len, NULL), DQ_PROFILE);
        cr_assert_eq(dq_profile_kvq(names[ni], 2 * H, D, &q), DQ_OK);
        q.kvq_layers = p.kvq_layers;
        q.kvq_calib_hash = p.kvq_calib_hash;
        cr_assert_eq(dq_kvq_calibration_check(&q, blob, len, NULL), DQ_PROFILE);
        cr_assert_eq(dq_kvq_calibration_check(&p, NULL, len, NULL), DQ_INVALID_ARGUMENT);
        free(copy);
        dq_kvq_free(blob);
    }
    /* calibration input errors */
    dq_profile p = profile("ol3");
    uint8_t *blob = NULL;
    size_t len = 0;
    cr_assert_eq(dq_kvq_calibrate(&p, 2, k, v, 63, 1, &blob, &len), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_calibrate(&p, 0, k, v, T, 1, &blob, &len), DQ_INVALID_ARGUMENT);
    p = profile("pq8x8");
    cr_assert_eq(dq_kvq_calibrate(&p, 2, k, v, T, 1, &blob, &len), DQ_INVALID_ARGUMENT); /* < 256 tokens */
    p = profile("ol3");
    k[5 * N + 3] = NAN;
    cr_assert_eq(dq_kvq_calibrate(&p, 2, k, v, T, 1, &blob, &len), DQ_NONFINITE);
    cr_assert_null(blob);
    cr_assert_eq(p.kvq_layers, 0);
    dq_profile b;
    cr_assert_eq(dq_profile_baseline("int2", H, D, &b), DQ_OK);
    k[5 * N + 3] = 0;
    cr_assert_eq(dq_kvq_calibrate(&b, 2, k, v, T, 1, &blob, &len), DQ_PROFILE);
    free(k);
    free(v);
}

Test(kvq, per_layer_views_use_their_own_tables)
{
    const size_t T = 128;
    float *k = outlier_data(3, T, 0), *v = outlier_data(3, T, 3);
    dq_profile p;
    dq_codec *c = make_codec("ol3", 3, k, v, T, &p);
    const dq_codec *v0 = dq_codec_layer(c, 0), *v1 = dq_codec_layer(c, 1), *v2 = dq_codec_layer(c, 2);
    cr_assert(v0 && v1 && v2 && v0 != v1 && v1 != v2);
    cr_assert_null(dq_codec_layer(c, 3));
    cr_assert_eq(dq_codec_record_bytes(v1, DQ_KIND_K), dq_codec_record_bytes(c, DQ_KIND_K));
    cr_assert(memcmp(dq_codec_profile(v1), dq_codec_profile(c), sizeof(dq_profile)) == 0);
    /* a workspace of the root serves every view; each layer's data is best coded by its view */
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    float *out = dqt_xmalloc(W * N * 4);
    double e[3][3];
    for (int l = 0; l < 3; l++)
        for (int cv = 0; cv < 3; cv++) {
            roundtrip(dq_codec_layer(c, (uint32_t)cv), ws, DQ_KIND_K, k + (size_t)l * T * N, W, out);
            e[l][cv] = mse(k + (size_t)l * T * N, out, W * N);
        }
    for (int l = 0; l < 3; l++)
        for (int cv = 0; cv < 3; cv++)
            if (cv != l)
                cr_assert_lt(e[l][l], 0.8 * e[l][cv], "layer %d: own view %g, view %d %g", l, e[l][l], cv, e[l][cv]);
    /* dq_attend over layers of different views in one call */
    dq_layer *l0 = NULL, *l2 = NULL;
    cr_assert_eq(dq_layer_create(v0, &l0), DQ_OK);
    cr_assert_eq(dq_layer_create(v2, &l2), DQ_OK);
    cr_assert_eq(dq_layer_append(l0, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
    cr_assert_eq(dq_layer_append(l2, ws, k + 2 * T * N, v + 2 * T * N, DQ_DTYPE_F32, T, NULL), DQ_OK);
    float *q = gauss(H * D, 1.0), *o[4];
    for (int i = 0; i < 4; i++)
        o[i] = dqt_xmalloc(H * D * 4);
    dq_attn_item items[2] = {{l0, q, o[0], NULL}, {l2, q, o[1], NULL}};
    dq_attn_item refs[2] = {{l0, q, o[2], NULL}, {l2, q, o[3], NULL}};
    cr_assert_eq(dq_attend(c, ws, H, 0.125f, items, 2), DQ_OK);
    cr_assert_eq(dq_attend_reference(c, ws, H, 0.125f, refs, 2), DQ_OK);
    for (int i = 0; i < 2; i++)
        for (uint32_t j = 0; j < H * D; j++)
            cr_assert_float_eq(o[i][j], o[i + 2][j], 1e-4 + 1e-4 * fabsf(o[i + 2][j]));
    /* a layer of another codec is refused */
    dq_codec *other = make_codec("ol3", 3, k, v, T, NULL);
    dq_layer *lx = NULL;
    cr_assert_eq(dq_layer_create(dq_codec_layer(other, 0), &lx), DQ_OK);
    dq_attn_item bad = {lx, q, o[0], NULL};
    cr_assert_eq(dq_attend(c, ws, H, 0.125f, &bad, 1), DQ_INVALID_ARGUMENT);
    /* freeing a view is a no-op; a plain codec is its own view */
    dq_codec_free((dq_codec *)v1);
    dq_codec *lm = make_codec("lm3", 0, NULL, NULL, 0, NULL);
    cr_assert_eq(dq_codec_layer(lm, 7), lm);
    for (int i = 0; i < 4; i++)
        free(o[i]);
    free(q);
    free(out);
    dq_layer_free(lx);
    dq_layer_free(l0);
    dq_layer_free(l2);
    dq_workspace_free(ws);
    dq_codec_free(other);
    dq_codec_free(lm);
    dq_codec_free(c);
    free(k);
    free(v);
}

Test(kvq, window_check_and_restore)
{
    const size_t T = W;
    float *k = drift_stream(T), *v = drift_stream(T), *a = dqt_xmalloc(T * N * 4), *b = dqt_xmalloc(T * N * 4);
    static const char *const names[] = {"lm3+d16", "ip3+lr4", "lm2"};
    for (size_t i = 0; i < 3; i++) {
        dq_codec *c = make_codec(names[i], 0, NULL, NULL, 0, NULL);
        dq_workspace *ws = NULL;
        cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
        const size_t wb = dq_codec_window_bytes(c);
        uint8_t *win = dqt_xmalloc(wb), *bad = dqt_xmalloc(wb);
        cr_assert_eq(dq_window_encode(c, ws, k, v, DQ_DTYPE_F32, win, NULL), DQ_OK);
        cr_assert_eq(dq_window_check(c, win), DQ_OK);
        /* restored windows decode as encoded */
        dq_layer *l = NULL, *r = NULL;
        cr_assert_eq(dq_layer_create(c, &l), DQ_OK);
        cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, T, NULL), DQ_OK);
        cr_assert_eq(dq_layer_restore(c, dq_layer_window(l, 0), 1, NULL, NULL, 0, &r), DQ_OK);
        cr_assert_eq(dq_layer_decode(l, ws, DQ_KIND_K, 0, T, a, DQ_DTYPE_F32), DQ_OK);
        cr_assert_eq(dq_layer_decode(r, ws, DQ_KIND_K, 0, T, b, DQ_DTYPE_F32), DQ_OK);
        cr_assert(memcmp(a, b, T * N * 4) == 0);
        /* an infinite norm, a negative norm, a lost anchor flag (or a stray one) */
        uint8_t *rec = (uint8_t *)dq_window_record(c, bad, DQ_KIND_V, 5);
        memcpy(bad, win, wb);
        rec[2] = 0x00;
        rec[3] = 0x7c;
        cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT, "%s", names[i]);
        memcpy(bad, win, wb);
        rec[3] |= 0x80;
        cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT, "%s", names[i]);
        memcpy(bad, win, wb);
        uint8_t *first = (uint8_t *)dq_window_record(c, bad, DQ_KIND_K, 0);
        first[1] ^= 0x80;
        cr_assert_eq(dq_window_check(c, bad), DQ_CORRUPT, "%s", names[i]);
        dq_layer *x = NULL;
        cr_assert_eq(dq_layer_restore(c, bad, 1, NULL, NULL, 0, &x), DQ_CORRUPT);
        cr_assert_null(x);
        dq_layer_free(l);
        dq_layer_free(r);
        free(win);
        free(bad);
        dq_workspace_free(ws);
        dq_codec_free(c);
    }
    free(k);
    free(v);
    free(a);
    free(b);
}

Test(kvq, pq_views_have_their_own_codebooks)
{
    /* two layers of different statistics: each view's codebook fits its own layer better; the
     * root encodes as layer 0 */
    const size_t T = 256;
    float *k = outlier_data(2, T, 0), *v = outlier_data(2, T, 6);
    for (size_t i = 0; i < T * N; i++) /* layer 1: isotropic */
        k[T * N + i] = (float)dqt_normal(&rng);
    dq_codec *c = make_codec("pq16x4", 2, k, v, T, NULL);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(c, &ws), DQ_OK);
    const size_t rb = dq_codec_record_bytes(c, DQ_KIND_K);
    uint8_t *r0 = dqt_xmalloc(W * rb), *r1 = dqt_xmalloc(W * rb), *rr = dqt_xmalloc(W * rb);
    float *out = dqt_xmalloc(W * N * 4);
    double e[2][2];
    for (int l = 0; l < 2; l++)
        for (int cv = 0; cv < 2; cv++) {
            roundtrip(dq_codec_layer(c, (uint32_t)cv), ws, DQ_KIND_K, k + (size_t)l * T * N, W, out);
            e[l][cv] = mse(k + (size_t)l * T * N, out, W * N);
        }
    cr_log_info("pq16x4 mse: layer 0 by views 0/1 %.4f/%.4f, layer 1 %.4f/%.4f", e[0][0], e[0][1], e[1][0], e[1][1]);
    cr_assert_lt(e[0][0], e[0][1]);
    cr_assert_lt(e[1][1], e[1][0]);
    cr_assert_eq(dq_tokens_encode(dq_codec_layer(c, 0), ws, DQ_KIND_K, k, DQ_DTYPE_F32, W, NULL, r0, rb, NULL), DQ_OK);
    cr_assert_eq(dq_tokens_encode(dq_codec_layer(c, 1), ws, DQ_KIND_K, k, DQ_DTYPE_F32, W, NULL, r1, rb, NULL), DQ_OK);
    cr_assert_eq(dq_tokens_encode(c, ws, DQ_KIND_K, k, DQ_DTYPE_F32, W, NULL, rr, rb, NULL), DQ_OK);
    cr_assert(memcmp(r0, r1, W * rb) != 0);
    cr_assert(memcmp(r0, rr, W * rb) == 0);
    free(r0);
    free(r1);
    free(rr);
    free(out);
    dq_workspace_free(ws);
    dq_codec_free(c);
    free(k);
    free(v);
}

Test(kvq, delta_profiles_calibrate_outliers_on_deltas)
{
    /* channel 5: a slow drift of large amplitude (large variance, small deltas); channel 9: fast
     * noise of moderate amplitude (the largest deltas). One outlier per head: "ol3+o1" picks 5,
     * "ol3+o1+d8" picks 9 (blob offset 48: layer 0, keys, head 0's channel, u16). */
    const size_t T = 200;
    float *k = gauss(T * N, 0.1), *v = gauss(T * N, 0.1);
    for (size_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < H; h++) {
            k[t * N + h * D + 5] += (float)(20.0 * sin((double)t / 40.0));
            k[t * N + h * D + 9] += (float)(2.0 * dqt_normal(&rng));
        }
    static const struct {
        const char *name;
        uint16_t want;
    } cases[] = {{"ol3+o1", 5}, {"ol3+o1+d8", 9}};
    for (size_t i = 0; i < 2; i++) {
        dq_profile p = profile(cases[i].name);
        uint8_t *blob = NULL;
        size_t len = 0;
        cr_assert_eq(dq_kvq_calibrate(&p, 1, k, v, T, 1, &blob, &len), DQ_OK);
        cr_assert_eq(len, 48u + 2 * 2 * H + 8);
        const uint16_t ch = (uint16_t)(blob[48] | blob[49] << 8), ch1 = (uint16_t)(blob[50] | blob[51] << 8);
        cr_assert_eq(ch, cases[i].want, "%s picked channel %u", cases[i].name, ch);
        cr_assert_eq(ch1, cases[i].want, "%s head 1 picked channel %u", cases[i].name, ch1);
        dq_kvq_free(blob);
    }
    free(k);
    free(v);
}
