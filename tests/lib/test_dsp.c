/* checkasm-style comparison of the dsp table (lib/src/dsp.h): every entry the CPU-specific init
 * installs must match the portable C reference on random inputs — bit-identical levels and corrupt
 * counts for decode_levels (valid and damaged streams, 1..37 streams, odd strides, unaligned
 * records), dot_u8 / axpy_u8 (centred levels), dot_bf16 / axpy_bf16 (the BF16 tail) and sumsq_bf16
 * (the token checks) within 1e-6 relative. The C reference itself is checked against
 * the spec decoder and against double-precision sums, so the two cannot agree on a wrong answer. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"
#include "dsp.h"

static dqt_rng rng;
static dq__dsp c_dsp, fast_dsp;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0xd5bu);
    dq__dsp_init_c(&c_dsp);
    dq__dsp_init_c(&fast_dsp);
    dq__dsp_init_x86(&fast_dsp);
}

static void suite_fini(void)
{
}

TestSuite(dsp, .init = suite_init, .fini = suite_fini);

Test(dsp, table)
{
    const char *name = dq__dsp_name();
    cr_assert_not_null(name);
    fprintf(stderr, "dsp: %s; overridden: decode_levels %s, axpy_u8 %s, dot_u8 %s\n", name,
            fast_dsp.decode_levels != c_dsp.decode_levels ? "yes" : "no",
            fast_dsp.axpy_u8 != c_dsp.axpy_u8 ? "yes" : "no", fast_dsp.dot_u8 != c_dsp.dot_u8 ? "yes" : "no");
    cr_assert_not_null(c_dsp.decode_levels);
    cr_assert_not_null(c_dsp.axpy_u8);
    cr_assert_not_null(c_dsp.dot_u8);
    cr_assert_not_null(c_dsp.dot_bf16);
    cr_assert_not_null(c_dsp.axpy_bf16);
    cr_assert_not_null(c_dsp.sumsq_bf16);
    cr_assert_not_null(c_dsp.fwht);
    const dq__dsp *g = dq__dsp_get();
    cr_assert_not_null(g);
    cr_assert_eq(g, dq__dsp_get(), "dq__dsp_get returns different tables");
    cr_assert(g->decode_levels == fast_dsp.decode_levels && g->axpy_u8 == fast_dsp.axpy_u8 &&
                  g->dot_u8 == fast_dsp.dot_u8 && g->dot_bf16 == fast_dsp.dot_bf16 &&
                  g->axpy_bf16 == fast_dsp.axpy_bf16 && g->sumsq_bf16 == fast_dsp.sumsq_bf16 &&
                  g->fwht == fast_dsp.fwht,
              "the process table is not init_c + init_x86");
}

struct dec_param {
    char name[16];
    uint32_t kv_heads, head_dim;
};

ParameterizedTestParameters(dsp, decode_levels)
{
    static struct dec_param p[] = {
        {"dq226", 8, 128}, {"dq196", 8, 128}, {"dq226", 2, 128}, {"dq226", 1, 16}, {"dq196", 4, 16}, {"dq226", 1, 64},
    };
    return cr_make_param_array(struct dec_param, p, sizeof p / sizeof p[0]);
}

static void damage(uint8_t *rec, size_t rb)
{
    switch (dqt_below(&rng, 5)) {
    case 0:
        rec[4 + dqt_below(&rng, (uint32_t)(rb - 4))] ^= (uint8_t)(1u << dqt_below(&rng, 8));
        break;
    case 1:
        memset(rec + 4, 0, 4);
        break;
    case 2:
        memset(rec + 4, 0xff, rb - 4);
        break;
    case 3:
        for (size_t i = 0; i < rb; i++)
            rec[i] = (uint8_t)dqt_next(&rng);
        break;
    default:
        rec[rb - 1] ^= 0x80;
        break;
    }
}

ParameterizedTest(struct dec_param *dp, dsp, decode_levels)
{
    dq_codec *codec = dqt_codec_builtin(dp->name, dp->kv_heads, dp->head_dim);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t n = dq_codec_stream_len(codec);
    float *y = dqt_xmalloc(n * sizeof *y);
    enum { POOL = 40, MAXCOUNT = 37 };
    static const size_t pads[] = {0, 1, 3, 7, 13};

    for (int k = 0; k < 2; k++) {
        const size_t rb = dq_codec_record_bytes(codec, (dq_kind)k);
        const uint32_t C = (uint32_t)(rb - 4);
        const dq__rans_dec *dec = &codec->kt[k].dec;
        uint8_t *pool = dqt_xmalloc(POOL * rb);
        for (int i = 0; i < POOL; i++) {
            double sc = pow(10.0, -1.0 + 2.0 * dqt_uniform(&rng));
            for (uint32_t j = 0; j < n; j++)
                y[j] = (float)(sc * dqt_normal(&rng) + (i % 7 == 0 ? 3.0 : 0.0));
            if (i % 11 == 0)
                for (uint32_t j = 0; j < n; j++)
                    y[j] = 1.5f; /* constant streams too */
            cr_assert_eq(dq_stream_encode(codec, ws, (dq_kind)k, y, pool + i * rb, NULL), DQ_OK);
        }
        uint8_t *one = dqt_xmalloc(n);
        for (uint32_t count = 1; count <= MAXCOUNT; count++) {
            for (size_t pi = 0; pi < sizeof pads / sizeof pads[0]; pi++) {
                for (int corrupt = 0; corrupt < 2; corrupt++) {
                    const size_t stride = rb + pads[pi];
                    const size_t off = pi & 1; /* odd base address for half the cases */
                    const size_t bytes = off + (count - 1) * stride + rb;
                    uint8_t *buf = dqt_xmalloc(bytes);
                    for (size_t i = 0; i < bytes; i++)
                        buf[i] = (uint8_t)dqt_next(&rng); /* junk between records */
                    uint8_t *recs = buf + off;
                    size_t expect_bad = 0;
                    uint8_t *valid = dqt_xmalloc(count);
                    for (uint32_t i = 0; i < count; i++) {
                        uint8_t *r = recs + i * stride;
                        memcpy(r, pool + dqt_below(&rng, POOL) * rb, rb);
                        if (corrupt && dqt_below(&rng, 3) == 0)
                            damage(r, rb);
                    }
                    uint8_t *lc = dqt_xmalloc((size_t)count * n), *lf = dqt_xmalloc((size_t)count * n);
                    memset(lc, 0xee, (size_t)count * n);
                    memset(lf, 0xdd, (size_t)count * n);
                    /* The spec of the C entry: each stream as dq__rans_decode sees it. */
                    for (uint32_t i = 0; i < count; i++) {
                        int rc = dq__rans_decode(dec, recs + i * stride + 4, C, n, one);
                        expect_bad += rc != DQ_OK;
                        valid[i] = rc == DQ_OK;
                        uint8_t *ref = dqt_xmalloc(n);
                        dqt_ref_decode rd = dqt_ref_rans_decode(dq_codec_profile(codec)->freq[k],
                                                                dq_codec_profile(codec)->levels[k],
                                                                recs + i * stride + 4, C, n, ref);
                        cr_assert_eq(rd.valid, rc == DQ_OK, "dq__rans_decode verdict differs from the spec");
                        if (rd.valid)
                            cr_assert(memcmp(ref, one, n) == 0, "dq__rans_decode symbols differ from the spec");
                        free(ref);
                        memcpy(lc + (size_t)i * n, one, n); /* reused below as the expectation */
                    }
                    uint8_t *expect = dqt_xmalloc((size_t)count * n);
                    memcpy(expect, lc, (size_t)count * n);
                    memset(lc, 0xee, (size_t)count * n);
                    size_t bc = c_dsp.decode_levels(dec, recs, stride, count, C, n, lc);
                    size_t bf = fast_dsp.decode_levels(dec, recs, stride, count, C, n, lf);
                    cr_assert_eq(bc, expect_bad, "%s kind %d count %u stride %zu: C counts %zu corrupt, expected %zu",
                                 dp->name, k, count, stride, bc, expect_bad);
                    cr_assert_eq(bf, bc, "%s kind %d count %u stride %zu: fast counts %zu corrupt, C %zu", dp->name, k,
                                 count, stride, bf, bc);
                    for (uint32_t i = 0; i < count; i++) {
                        /* A corrupt stream's levels are garbage, but the same garbage in C and fast. */
                        if (valid[i])
                            cr_assert(memcmp(lc + (size_t)i * n, expect + (size_t)i * n, n) == 0,
                                      "%s kind %d: C entry, stream %u of %u differs from dq__rans_decode", dp->name, k,
                                      i, count);
                        cr_assert(memcmp(lf + (size_t)i * n, lc + (size_t)i * n, n) == 0,
                                  "%s kind %d count %u stride %zu: fast levels of stream %u differ", dp->name, k, count,
                                  stride, i);
                    }
                    free(expect);
                    free(valid);
                    free(lc);
                    free(lf);
                    free(buf);
                }
            }
        }
        free(one);
        free(pool);
    }
    free(y);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

static const size_t vec_lens[] = {0,   1,   2,   3,    4,    5,    7,    8,    9,    15,   16,  17,  31,
                                  32,  33,  63,  64,   65,   100,  127,  128,  129,  255,  256, 257, 511,
                                  512, 513, 999, 1000, 1023, 1024, 1025, 2047, 2048, 4096, 4099};

Test(dsp, dot_u8)
{
    const size_t maxlen = 4099 + 8;
    float *qb = dqt_xmalloc(maxlen * sizeof *qb);
    uint8_t *lb = dqt_xmalloc(maxlen);
    for (size_t li = 0; li < sizeof vec_lens / sizeof vec_lens[0]; li++) {
        const size_t len = vec_lens[li];
        for (int trial = 0; trial < 24; trial++) {
            const size_t qoff = trial % 4, loff = (trial / 4) % 6;
            float *q = qb + qoff;
            uint8_t *lev = lb + loff;
            const uint32_t maxlev = trial % 3 == 0 ? 256 : 32;
            const float center = trial % 2 ? 0.0f : (float)(maxlev - 1) / 2.0f;
            double scale = pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng));
            for (size_t j = 0; j < len; j++) {
                q[j] = (float)(scale * dqt_normal(&rng));
                lev[j] = (uint8_t)dqt_below(&rng, maxlev);
            }
            double exact = 0, mag = 0;
            for (size_t j = 0; j < len; j++) {
                exact += (double)q[j] * (lev[j] - (double)center);
                mag += fabs((double)q[j] * (lev[j] - (double)center));
            }
            float c = c_dsp.dot_u8(q, lev, len, center);
            float f = fast_dsp.dot_u8(q, lev, len, center);
            /* Any summation order of len float terms stays within len·2^-24 of Σ|terms|. */
            cr_assert(fabs((double)c - exact) <= (len + 1) * 0x1p-24 * mag + 1e-38, "C dot len %zu: %.9g vs %.9g", len,
                      (double)c, exact);
            cr_assert(fabs((double)f - (double)c) <= 1e-6 * mag + 1e-38,
                      "fast dot len %zu (q+%zu, lev+%zu): %.9g, C %.9g", len, qoff, loff, (double)f, (double)c);
        }
    }
    free(qb);
    free(lb);
}

Test(dsp, axpy_u8)
{
    const size_t maxlen = 4099 + 8;
    float *ab = dqt_xmalloc(maxlen * sizeof *ab), *cb = dqt_xmalloc(maxlen * sizeof *cb),
          *fb = dqt_xmalloc(maxlen * sizeof *fb);
    uint8_t *lb = dqt_xmalloc(maxlen);
    for (size_t li = 0; li < sizeof vec_lens / sizeof vec_lens[0]; li++) {
        const size_t len = vec_lens[li];
        for (int trial = 0; trial < 24; trial++) {
            const size_t aoff = trial % 4, loff = (trial / 4) % 6;
            uint8_t *lev = lb + loff;
            const uint32_t maxlev = trial % 3 == 0 ? 256 : 32;
            const float center = trial % 2 ? 0.0f : (float)(maxlev - 1) / 2.0f;
            const float w = (float)(pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng)) * dqt_normal(&rng));
            for (size_t j = 0; j < maxlen - 8; j++)
                ab[j] = (float)dqt_normal(&rng);
            memcpy(cb, ab, maxlen * sizeof *ab);
            memcpy(fb, ab, maxlen * sizeof *ab);
            for (size_t j = 0; j < len; j++)
                lev[j] = (uint8_t)dqt_below(&rng, maxlev);
            c_dsp.axpy_u8(cb + aoff, w, lev, len, center);
            fast_dsp.axpy_u8(fb + aoff, w, lev, len, center);
            for (size_t j = 0; j < maxlen; j++) {
                if (j < aoff || j >= aoff + len) {
                    cr_assert(memcmp(&cb[j], &ab[j], sizeof(float)) == 0, "C axpy len %zu wrote element %zu", len, j);
                    cr_assert(memcmp(&fb[j], &ab[j], sizeof(float)) == 0, "fast axpy len %zu wrote outside (%zu)", len,
                              j);
                    continue;
                }
                const double a0 = ab[j], t = (double)w * (lev[j - aoff] - (double)center);
                const double mag = fabs(a0) + fabs(t);
                cr_assert(fabs((double)cb[j] - (a0 + t)) <= 0x1p-23 * mag, "C axpy [%zu]: %.9g vs %.9g", j,
                          (double)cb[j], a0 + t);
                cr_assert(fabs((double)fb[j] - (double)cb[j]) <= 1e-6 * mag, "fast axpy len %zu [%zu]: %.9g, C %.9g",
                          len, j, (double)fb[j], (double)cb[j]);
            }
        }
    }
    free(ab);
    free(cb);
    free(fb);
    free(lb);
}

/* The BF16 pattern nearest v (finite inputs only: the tail never holds anything else). */
static uint16_t bf16_of(double v)
{
    return dq_f32_to_bf16((float)v);
}

Test(dsp, dot_bf16)
{
    const size_t maxlen = 4099 + 8;
    float *qb = dqt_xmalloc(maxlen * sizeof *qb);
    uint16_t *kb = dqt_xmalloc(maxlen * sizeof *kb);
    for (size_t li = 0; li < sizeof vec_lens / sizeof vec_lens[0]; li++) {
        const size_t len = vec_lens[li];
        for (int trial = 0; trial < 24; trial++) {
            const size_t qoff = trial % 4, koff = (trial / 4) % 6;
            float *q = qb + qoff;
            uint16_t *k = kb + koff;
            const double qs = pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng)), ks = pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng));
            for (size_t j = 0; j < len; j++) {
                q[j] = (float)(qs * dqt_normal(&rng));
                k[j] = bf16_of(ks * dqt_normal(&rng));
            }
            double exact = 0, mag = 0;
            for (size_t j = 0; j < len; j++) {
                const double t = (double)q[j] * (double)dq_bf16_to_f32(k[j]);
                exact += t;
                mag += fabs(t);
            }
            float c = c_dsp.dot_bf16(q, k, len);
            float f = fast_dsp.dot_bf16(q, k, len);
            cr_assert(fabs((double)c - exact) <= (len + 1) * 0x1p-24 * mag + 1e-38, "C dot_bf16 len %zu: %.9g vs %.9g",
                      len, (double)c, exact);
            cr_assert(fabs((double)f - (double)c) <= 1e-6 * mag + 1e-38,
                      "fast dot_bf16 len %zu (q+%zu, k+%zu): %.9g, C %.9g", len, qoff, koff, (double)f, (double)c);
        }
    }
    free(qb);
    free(kb);
}

Test(dsp, sumsq_bf16)
{
    const size_t maxlen = 4099 + 8;
    uint16_t *xb = dqt_xmalloc(maxlen * sizeof *xb);
    for (size_t li = 0; li < sizeof vec_lens / sizeof vec_lens[0]; li++) {
        const size_t len = vec_lens[li];
        for (int trial = 0; trial < 24; trial++) {
            uint16_t *x = xb + trial % 6;
            const double xs = pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng));
            for (size_t j = 0; j < len; j++)
                x[j] = bf16_of(xs * dqt_normal(&rng));
            double exact = 0;
            for (size_t j = 0; j < len; j++)
                exact += (double)dq_bf16_to_f32(x[j]) * (double)dq_bf16_to_f32(x[j]);
            float c = c_dsp.sumsq_bf16(x, len);
            float f = fast_dsp.sumsq_bf16(x, len);
            cr_assert(fabs((double)c - exact) <= (len + 1) * 0x1p-24 * exact, "C sumsq_bf16 len %zu: %.9g vs %.9g", len,
                      (double)c, exact);
            cr_assert(fabs((double)f - (double)c) <= 1e-6 * exact, "fast sumsq_bf16 len %zu (x+%d): %.9g, C %.9g", len,
                      trial % 6, (double)f, (double)c);
            if (len > 0) {
                /* a non-finite value anywhere: the sum is +inf or NaN, never a finite number */
                const size_t at = (size_t)trial * 7919 % len;
                const uint16_t saved = x[at];
                x[at] = trial % 3 == 0 ? 0x7f80 : trial % 3 == 1 ? 0xff80 : 0x7fc1;
                cr_assert(!isfinite(c_dsp.sumsq_bf16(x, len)), "C sumsq_bf16 len %zu: finite with %#x at %zu", len,
                          x[at], at);
                cr_assert(!isfinite(fast_dsp.sumsq_bf16(x, len)), "fast sumsq_bf16 len %zu: finite with %#x at %zu",
                          len, x[at], at);
                x[at] = saved;
            }
        }
    }
    free(xb);
}

Test(dsp, axpy_bf16)
{
    const size_t maxlen = 4099 + 8;
    float *ab = dqt_xmalloc(maxlen * sizeof *ab), *cb = dqt_xmalloc(maxlen * sizeof *cb),
          *fb = dqt_xmalloc(maxlen * sizeof *fb);
    uint16_t *vb = dqt_xmalloc(maxlen * sizeof *vb);
    for (size_t li = 0; li < sizeof vec_lens / sizeof vec_lens[0]; li++) {
        const size_t len = vec_lens[li];
        for (int trial = 0; trial < 24; trial++) {
            const size_t aoff = trial % 4, voff = (trial / 4) % 6;
            uint16_t *v = vb + voff;
            const float w = (float)(pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng)) * dqt_normal(&rng));
            for (size_t j = 0; j < maxlen - 8; j++)
                ab[j] = (float)dqt_normal(&rng);
            memcpy(cb, ab, maxlen * sizeof *ab);
            memcpy(fb, ab, maxlen * sizeof *ab);
            for (size_t j = 0; j < len; j++)
                v[j] = bf16_of(dqt_normal(&rng) * 4.0);
            c_dsp.axpy_bf16(cb + aoff, w, v, len);
            fast_dsp.axpy_bf16(fb + aoff, w, v, len);
            for (size_t j = 0; j < maxlen; j++) {
                if (j < aoff || j >= aoff + len) {
                    cr_assert(memcmp(&cb[j], &ab[j], sizeof(float)) == 0, "C axpy_bf16 len %zu wrote element %zu", len,
                              j);
                    cr_assert(memcmp(&fb[j], &ab[j], sizeof(float)) == 0, "fast axpy_bf16 len %zu wrote outside (%zu)",
                              len, j);
                    continue;
                }
                const double a0 = ab[j], t = (double)w * (double)dq_bf16_to_f32(v[j - aoff]);
                const double mag = fabs(a0) + fabs(t);
                cr_assert(fabs((double)cb[j] - (a0 + t)) <= 0x1p-23 * mag, "C axpy_bf16 [%zu]: %.9g vs %.9g", j,
                          (double)cb[j], a0 + t);
                cr_assert(fabs((double)fb[j] - (double)cb[j]) <= 1e-6 * mag,
                          "fast axpy_bf16 len %zu [%zu]: %.9g, C %.9g", len, j, (double)fb[j], (double)cb[j]);
            }
        }
    }
    free(ab);
    free(cb);
    free(fb);
    free(vb);
}

/* The transform: the fast version gives the C version's bits for every power-of-two length, at any
 * alignment, with values of very different magnitudes (where any reordering would show); and the C
 * version is the transform (checked against the Hadamard matrix in double on small lengths). */
Test(dsp, fwht)
{
    float *buf = dqt_xmalloc((2048 + 8) * sizeof *buf), *ref = dqt_xmalloc(2048 * sizeof *ref);
    for (uint32_t len = 1; len <= 2048; len <<= 1) {
        for (int trial = 0; trial < 12; trial++) {
            float *x = buf + trial % 5;
            for (uint32_t j = 0; j < len; j++)
                x[j] = (float)(dqt_normal(&rng) * pow(10.0, -6.0 + 12.0 * dqt_uniform(&rng)));
            memcpy(ref, x, len * sizeof *ref);
            double want[64];
            if (len <= 64)
                for (uint32_t i = 0; i < len; i++) {
                    want[i] = 0;
                    for (uint32_t j = 0; j < len; j++)
                        want[i] += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * ref[j];
                }
            c_dsp.fwht(ref, len);
            fast_dsp.fwht(x, len);
            cr_assert(memcmp(x, ref, len * sizeof *x) == 0, "fast fwht len %u (offset %d) differs from C", len,
                      trial % 5);
            double mag = 0;
            for (uint32_t j = 0; j < len; j++)
                mag = fmax(mag, fabs((double)x[j]));
            for (uint32_t i = 0; len <= 64 && i < len; i++)
                cr_assert(fabs(want[i] - ref[i]) <= len * 0x1p-22 * mag * len, "C fwht len %u [%u]: %.9g vs %.9g", len,
                          i, (double)ref[i], want[i]);
        }
    }
    free(buf);
    free(ref);
}
