/* Corrupted, truncated and garbage input (DESIGN §2.3: "a corrupted container decodes to garbage,
 * never to a crash or an out-of-bounds read"). Every record lives in a malloc block of exactly
 * record_bytes so the sanitizer build catches any read past it. The library's verdict must equal
 * the spec decoder's, and the scalar and fast multi-stream decoders must agree on every byte. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"
#include "dsp.h"

#ifdef DQT_SANITIZED
#define DEFAULT_TRIALS 1500
#else
#define DEFAULT_TRIALS 6000
#endif

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0xc0441u);
}

static void suite_fini(void)
{
}

TestSuite(corrupt, .init = suite_init, .fini = suite_fini);

enum mutation {
    MUT_FLIP_BIT,
    MUT_FLIP_BITS,
    MUT_RANDOM_BYTES,
    MUT_ZERO_STATE,
    MUT_STATE_FF,
    MUT_GARBAGE,
    MUT_ALL_FF,
    MUT_ALL_00,
    MUT_TRUNCATE,
    MUT_SHIFT,
    MUT_PADDING,
    MUT_STATE_ONLY,
    MUT_COUNT
};

static const char *mut_name[MUT_COUNT] = {"flip-bit", "flip-bits", "random-bytes", "zero-state",
                                          "state-ff", "garbage",   "all-ff",       "all-00",
                                          "truncate", "shift",     "padding",      "state-only"};

struct codec_param {
    char name[16];
    int builtin;
    uint32_t kv_heads, head_dim;
    uint32_t container[2];
};

ParameterizedTestParameters(corrupt, records)
{
    static struct codec_param p[] = {
        {"dq226", 1, 8, 128, {0, 0}},    {"dq196", 1, 8, 128, {0, 0}}, {"dq226", 1, 2, 128, {0, 0}},
        {"tiny-d16", 0, 1, 16, {11, 9}}, {"tiny-d2", 0, 1, 2, {6, 6}},
    };
    return cr_make_param_array(struct codec_param, p, sizeof p / sizeof p[0]);
}

static dq_codec *param_codec(const struct codec_param *cp)
{
    if (cp->builtin)
        return dqt_codec_builtin(cp->name, cp->kv_heads, cp->head_dim);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = cp->kv_heads;
    pp.head_dim = cp->head_dim;
    pp.container_bytes[0] = cp->container[0];
    pp.container_bytes[1] = cp->container[1];
    pp.name = cp->name;
    return dqt_codec_make(&pp);
}

/* Applies a mutation; returns 1 when the result must be rejected whatever the bytes. */
static int mutate(enum mutation m, uint8_t *rec, size_t rb, uint32_t used)
{
    const size_t C = rb - 4;
    uint8_t *c = rec + 4;
    switch (m) {
    case MUT_FLIP_BIT: {
        size_t bit = dqt_below(&rng, (uint32_t)(rb * 8));
        rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        return 0;
    }
    case MUT_FLIP_BITS: {
        uint32_t k = 2 + dqt_below(&rng, 15);
        for (uint32_t i = 0; i < k; i++) {
            size_t bit = dqt_below(&rng, (uint32_t)(rb * 8));
            rec[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        return 0;
    }
    case MUT_RANDOM_BYTES: {
        uint32_t k = 1 + dqt_below(&rng, 8);
        for (uint32_t i = 0; i < k; i++)
            rec[dqt_below(&rng, (uint32_t)rb)] = (uint8_t)dqt_next(&rng);
        return 0;
    }
    case MUT_ZERO_STATE:
        memset(c, 0, 4);
        return 1;
    case MUT_STATE_FF:
        memset(c, 0xff, 4);
        return 1;
    case MUT_GARBAGE:
        for (size_t i = 0; i < rb; i++)
            rec[i] = (uint8_t)dqt_next(&rng);
        return 0;
    case MUT_ALL_FF:
        memset(rec, 0xff, rb);
        return 1;
    case MUT_ALL_00:
        memset(rec, 0, rb);
        return 1;
    case MUT_TRUNCATE: {
        size_t from = dqt_below(&rng, (uint32_t)C);
        memset(c + from, 0, C - from);
        return 0;
    }
    case MUT_SHIFT:
        if (dqt_below(&rng, 2)) {
            memmove(c, c + 1, C - 1);
            c[C - 1] = 0;
        } else {
            memmove(c + 1, c, C - 1);
        }
        return 0;
    case MUT_PADDING:
        if (used >= C) { /* no padding in this container: flip the last byte instead */
            c[C - 1] ^= 0x01;
            return 0;
        }
        c[used + dqt_below(&rng, (uint32_t)(C - used))] ^= (uint8_t)(1u << dqt_below(&rng, 8));
        return 1;
    default: {
        uint32_t x = DQ_RANS_L + dqt_below(&rng, 255u * DQ_RANS_L);
        memset(c, 0, C);
        for (int b = 0; b < 4; b++)
            c[b] = (uint8_t)(x >> (8 * b));
        return 0;
    }
    }
}

ParameterizedTest(struct codec_param *cp, corrupt, records)
{
    dq_codec *codec = param_codec(cp);
    const dq_profile *prof = dq_codec_profile(codec);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    dq__dsp c_dsp, fast_dsp;
    dq__dsp_init_c(&c_dsp);
    dq__dsp_init_c(&fast_dsp);
    dq__dsp_init_x86(&fast_dsp);

    enum { POOL = 32, BATCH = 37 };
    const long trials = dqt_env_long("DQ_TEST_CORRUPT_TRIALS", DEFAULT_TRIALS);
    float *y = dqt_xmalloc(n * sizeof *y), *vals = dqt_xmalloc(n * sizeof *vals);
    uint8_t *lev = dqt_xmalloc(n), *lev_ref = dqt_xmalloc(n), *lev_c = dqt_xmalloc(n), *lev_f = dqt_xmalloc(n);

    for (int k = 0; k < 2; k++) {
        const dq_kind kind = (dq_kind)k;
        const size_t rb = dq_codec_record_bytes(codec, kind);
        const uint32_t C = prof->container_bytes[k], M = prof->levels[k];
        const dq__rans_dec *dec = &codec->kt[k].dec;
        uint8_t *pool = dqt_xmalloc(POOL * rb);
        uint32_t used[POOL];
        for (int i = 0; i < POOL; i++) {
            double sc = pow(10.0, -2.0 + 4.0 * dqt_uniform(&rng));
            for (uint32_t j = 0; j < n; j++)
                y[j] = (float)(sc * dqt_normal(&rng));
            dq_encode_stats st;
            memset(&st, 0, sizeof st);
            cr_assert_eq(dq_stream_encode(codec, ws, kind, y, pool + i * rb, &st), DQ_OK);
            used[i] = st.max_payload_bytes;
            cr_assert(used[i] >= 4 && used[i] <= C, "payload %u outside [4, %u]", used[i], C);
        }

        /* Batches for the multi-stream decoders: exact-size blocks, odd stride. */
        const size_t stride = rb + 3;
        const size_t batch_bytes = (BATCH - 1) * stride + rb;
        uint8_t *batch = dqt_xmalloc(batch_bytes);
        uint8_t *blev_c = dqt_xmalloc((size_t)BATCH * n), *blev_f = dqt_xmalloc((size_t)BATCH * n);
        size_t batch_fill = 0, batch_corrupt = 0;

        long rejected[MUT_COUNT] = {0}, tried[MUT_COUNT] = {0};
        for (long t = 0; t < trials; t++) {
            const int src = (int)dqt_below(&rng, POOL);
            const enum mutation mu = (enum mutation)(t % MUT_COUNT);
            uint8_t *rec = dqt_xmalloc(rb);
            memcpy(rec, pool + src * rb, rb);
            const int must_fail = mutate(mu, rec, rb, used[src]);

            memset(lev, 0xee, n);
            int rc = dq_stream_decode_levels(codec, kind, rec, lev);
            cr_assert(rc == DQ_OK || rc == DQ_CORRUPT, "%s %s: decode returned %s", cp->name, mut_name[mu],
                      dq_err_name(rc));
            for (uint32_t j = 0; j < n; j++)
                cr_assert_lt(lev[j], M, "%s %s: level %u >= M written", cp->name, mut_name[mu], lev[j]);
            if (must_fail)
                cr_assert_eq(rc, DQ_CORRUPT, "%s kind %d: %s container accepted", cp->name, k, mut_name[mu]);

            /* Same verdict as the spec decoder, same symbols when valid. */
            dqt_ref_decode rd = dqt_ref_rans_decode(prof->freq[k], M, rec + 4, C, n, lev_ref);
            cr_assert_eq(rc == DQ_OK, rd.valid, "%s kind %d %s: library says %s, spec decoder says %s", cp->name, k,
                         mut_name[mu], dq_err_name(rc), rd.valid ? "valid" : "corrupt");
            if (rd.valid)
                cr_assert(memcmp(lev, lev_ref, n) == 0, "%s %s: levels differ from the spec decoder", cp->name,
                          mut_name[mu]);

            /* dq_stream_decode gives the same verdict and o + s·m where the metadata is finite. */
            int rc2 = dq_stream_decode(codec, kind, rec, vals);
            cr_assert_eq(rc2, rc, "%s %s: decode_levels %s but decode %s", cp->name, mut_name[mu], dq_err_name(rc),
                         dq_err_name(rc2));
            const float s = dqt_record_s(rec), o = dqt_record_o(rec);
            if (rc == DQ_OK && isfinite(s) && isfinite(o))
                for (uint32_t j = 0; j < n; j++) {
                    float want = o + s * (float)lev[j];
                    cr_assert(memcmp(&want, &vals[j], sizeof want) == 0, "%s: value %u is %g, expected %g", cp->name, j,
                              (double)vals[j], (double)want);
                }

            /* Scalar and fast single-stream decode. */
            memset(lev_c, 0xee, n);
            memset(lev_f, 0xdd, n);
            size_t bad_c = c_dsp.decode_levels(dec, rec, rb, 1, C, n, lev_c);
            size_t bad_f = fast_dsp.decode_levels(dec, rec, rb, 1, C, n, lev_f);
            cr_assert_eq(bad_c, (size_t)(rc != DQ_OK), "%s %s: C decoder counts %zu corrupt, public decoder %s",
                         cp->name, mut_name[mu], bad_c, dq_err_name(rc));
            cr_assert_eq(bad_f, bad_c, "%s %s: fast decoder counts %zu corrupt, C decoder %zu", cp->name, mut_name[mu],
                         bad_f, bad_c);
            cr_assert(memcmp(lev_c, lev, n) == 0, "%s %s: C dsp levels differ from dq_stream_decode_levels", cp->name,
                      mut_name[mu]);
            cr_assert(memcmp(lev_f, lev_c, n) == 0, "%s %s: fast levels differ from C levels", cp->name, mut_name[mu]);

            tried[mu]++;
            rejected[mu] += rc != DQ_OK;

            memcpy(batch + batch_fill * stride, rec, rb);
            batch_corrupt += rc != DQ_OK;
            if (++batch_fill == BATCH) {
                memset(blev_c, 0xee, (size_t)BATCH * n);
                memset(blev_f, 0xdd, (size_t)BATCH * n);
                size_t bc = c_dsp.decode_levels(dec, batch, stride, BATCH, C, n, blev_c);
                size_t bf = fast_dsp.decode_levels(dec, batch, stride, BATCH, C, n, blev_f);
                cr_assert_eq(bc, batch_corrupt, "%s: batch of %d: C decoder counts %zu corrupt, expected %zu", cp->name,
                             BATCH, bc, batch_corrupt);
                cr_assert_eq(bf, bc, "%s: batch: fast decoder counts %zu corrupt, C decoder %zu", cp->name, bf, bc);
                cr_assert(memcmp(blev_c, blev_f, (size_t)BATCH * n) == 0, "%s: batch levels differ (C vs fast)",
                          cp->name);
                batch_fill = batch_corrupt = 0;
            }
            free(rec);
        }
        for (int mu = 0; mu < MUT_COUNT; mu++)
            fprintf(stderr, "%s kind %c %-12s rejected %4ld / %4ld\n", cp->name, k ? 'V' : 'K', mut_name[mu],
                    rejected[mu], tried[mu]);
        /* Single bit flips almost always break the final-state or padding rule. Tiny containers
         * (n = 2) have few states to land on, so only the large ones are held to it. */
        if (n >= 256 && tried[MUT_FLIP_BIT] > 0) {
            /* A flip in the 4 metadata bytes is not a container error: discount them. */
            double frac_container = (double)C / (double)rb;
            double rate = (double)rejected[MUT_FLIP_BIT] / (double)tried[MUT_FLIP_BIT] / frac_container;
            cr_assert_gt(rate, 0.9, "%s kind %d: only %.1f%% of single bit flips detected", cp->name, k, 100 * rate);
        }
        free(batch);
        free(blev_c);
        free(blev_f);
        free(pool);
    }
    free(y);
    free(vals);
    free(lev);
    free(lev_ref);
    free(lev_c);
    free(lev_f);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Token-level decode of a window with one bad record reports DQ_CORRUPT and still writes all. */
Test(corrupt, tokens_decode_reports_corrupt)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 2, 128);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    const size_t ntok = 16, rb = dq_codec_record_bytes(codec, DQ_KIND_K);
    float *x = dqt_xmalloc(ntok * n * sizeof *x), *out = dqt_xmalloc(ntok * n * sizeof *out);
    uint8_t *mean = dqt_xmalloc(dq_codec_mean_bytes(codec)), *recs = dqt_xmalloc(ntok * rb);
    for (size_t i = 0; i < ntok * n; i++)
        x[i] = (float)dqt_normal(&rng);
    cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, x, DQ_DTYPE_F32, ntok, mean, recs, rb, NULL), DQ_OK);
    cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_K, mean, recs, rb, ntok, out, DQ_DTYPE_F32), DQ_OK);
    memset(recs + 5 * rb + 4, 0, 4); /* token 5: zero state */
    for (size_t i = 0; i < ntok * n; i++)
        out[i] = NAN;
    cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_K, mean, recs, rb, ntok, out, DQ_DTYPE_F32), DQ_CORRUPT);
    for (size_t i = 0; i < ntok * n; i++)
        if (i / n != 5)
            cr_assert(isfinite(out[i]), "token %zu not written after a corrupt neighbour", i / n);
    free(x);
    free(out);
    free(mean);
    free(recs);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

static void check_deserialize_rejects(const uint8_t *src, size_t len, const char *what)
{
    uint8_t *buf = dqt_xmalloc(len);
    memcpy(buf, src, len);
    dq_profile out;
    int rc = dq_profile_deserialize(buf, len, &out);
    cr_assert_lt(rc, 0, "%s: garbled profile accepted", what);
    free(buf);
}

/* Truncated, bit-flipped and garbage profiles: an error, never a crash or an accepted bad table. */
Test(corrupt, profile_deserialize)
{
    dq_profile profs[3];
    cr_assert_eq(dq_profile_builtin("dq226", 8, 128, &profs[0]), DQ_OK);
    cr_assert_eq(dq_profile_builtin("dq196", 2, 128, &profs[1]), DQ_OK);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = 1;
    pp.head_dim = 16;
    pp.levels[0] = 32;
    pp.levels[1] = 2;
    pp.container_bytes[0] = 40;
    pp.container_bytes[1] = 12;
    pp.name = "custom-edge";
    cr_assert_eq(dq_profile_make(&pp, &profs[2]), DQ_OK);

    for (int i = 0; i < 3; i++) {
        uint8_t ser[DQ_PROFILE_SERIALIZED_MAX];
        size_t len = 0;
        cr_assert_eq(dq_profile_serialize(&profs[i], ser, sizeof ser, &len), DQ_OK);
        cr_assert(len > 8 && len <= DQ_PROFILE_SERIALIZED_MAX);
        for (size_t cut = 0; cut < len; cut++) {
            char what[96];
            snprintf(what, sizeof what, "profile %d cut to %zu of %zu bytes", i, cut, len);
            check_deserialize_rejects(ser, cut, what);
        }
        for (size_t bit = 0; bit < len * 8; bit++) {
            char what[96];
            snprintf(what, sizeof what, "profile %d with bit %zu flipped", i, bit);
            ser[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            check_deserialize_rejects(ser, len, what);
            ser[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        }
        /* Random multi-byte damage and garbage of random length: no crash; anything accepted
         * is a valid profile. */
        for (int t = 0; t < 3000; t++) {
            size_t l = t % 2 ? len : dqt_below(&rng, DQ_PROFILE_SERIALIZED_MAX + 64);
            uint8_t *buf = dqt_xmalloc(l);
            if (t % 2) {
                memcpy(buf, ser, l);
                uint32_t k = 1 + dqt_below(&rng, 6);
                for (uint32_t j = 0; j < k; j++)
                    buf[dqt_below(&rng, (uint32_t)l)] = (uint8_t)dqt_next(&rng);
            } else {
                for (size_t j = 0; j < l; j++)
                    buf[j] = (uint8_t)dqt_next(&rng);
                if (l >= 4)
                    memcpy(buf, ser, 4); /* keep the magic so parsing goes deeper */
            }
            dq_profile out;
            int rc = dq_profile_deserialize(buf, l, &out);
            cr_assert(rc <= 0);
            if (rc == DQ_OK)
                cr_assert_eq(dq_profile_validate(&out), DQ_OK, "deserialize accepted an invalid profile");
            free(buf);
        }
    }
}
