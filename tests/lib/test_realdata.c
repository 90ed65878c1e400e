/* Real KV caches (bytellama-19m, $DQ_DATA_DIR): D-Quant (dq226 at 2 × 128) against fixed-width
 * min–max coding at matched storage with identical preprocessing (seed Appendix B): rotation,
 * the same INT8 window mean for keys, per-token min–max grid with M = floor(2^(8C/n)) levels,
 * nearest rounding, least-squares refit, fp16 metadata. D-Quant must have the lower NMSE.
 * And decode attention with the model's own queries against exact attention. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"

enum { SEQS = 2, LAYERS = 6, TOKENS = 1024, KV_HEADS = 2, HEAD_DIM = 128, N = KV_HEADS * HEAD_DIM };

enum { Q_HEADS = 4 };

static uint16_t *data;    /* kv_f16.bin: [SEQS][2][LAYERS][TOKENS][N] */
static uint16_t *queries; /* q_f16.bin: [1][LAYERS][TOKENS][Q_HEADS][HEAD_DIM] */

static uint16_t *load(const char *name, size_t count)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/bytellama-19m/%s", dqt_data_dir(), name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint16_t *buf = dqt_xmalloc(count * 2);
    size_t got = fread(buf, 2, count, f);
    fclose(f);
    if (got != count) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void suite_init(void)
{
    data = load("kv_f16.bin", (size_t)SEQS * 2 * LAYERS * TOKENS * N);
    queries = load("q_f16.bin", (size_t)LAYERS * TOKENS * Q_HEADS * HEAD_DIM);
}

static void suite_fini(void)
{
    free(data);
    free(queries);
    data = queries = NULL;
}

TestSuite(realdata, .init = suite_init, .fini = suite_fini);

static const uint16_t *slab(int seq, int kv, int layer)
{
    return data + (((size_t)seq * 2 + kv) * LAYERS + layer) * TOKENS * N;
}

static float half(double x)
{
    return dq_f16_to_f32(dq_f64_to_f16(x));
}

/* Fixed-width per-token coding of y[n] on M levels; writes the reconstruction. */
static void fixed_width(const float *y, uint32_t n, uint32_t M, float *yhat, uint8_t *m)
{
    float lo = y[0], hi = y[0];
    for (uint32_t i = 1; i < n; i++) {
        lo = fminf(lo, y[i]);
        hi = fmaxf(hi, y[i]);
    }
    if (hi == lo) {
        for (uint32_t i = 0; i < n; i++)
            yhat[i] = half(lo);
        return;
    }
    double s = ((double)hi - lo) / (M - 1), o = lo;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < n; i++) {
            long q = s > 0 ? lround((y[i] - o) / s) : 0;
            m[i] = (uint8_t)(q < 0 ? 0 : q > (long)M - 1 ? M - 1 : q);
        }
        if (pass == 1)
            break;
        /* Least-squares refit of (s, o) for these levels, then fp16 metadata. */
        double sm = 0, sy = 0, smm = 0, smy = 0;
        for (uint32_t i = 0; i < n; i++) {
            sm += m[i];
            sy += y[i];
            smm += (double)m[i] * m[i];
            smy += (double)m[i] * y[i];
        }
        double var = smm - sm * sm / n;
        if (var > 0) {
            s = (smy - sm * sy / n) / var;
            o = (sy - s * sm) / n;
        } else {
            s = 0;
            o = sy / n;
        }
        s = half(s);
        o = half(o);
    }
    for (uint32_t i = 0; i < n; i++)
        yhat[i] = (float)o + (float)s * (float)m[i];
}

Test(realdata, dquant_beats_fixed_width)
{
    if (!data)
        cr_skip("real-data test skipped: %s/bytellama-19m/kv_f16.bin is absent (set DQ_DATA_DIR)", dqt_data_dir());

    dq_codec *codec = dqt_codec_builtin("dq226", KV_HEADS, HEAD_DIM);
    const dq_profile *p = dq_codec_profile(codec);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const uint32_t W = p->window;
    const size_t rk = dq_codec_record_bytes(codec, DQ_KIND_K), rv = dq_codec_record_bytes(codec, DQ_KIND_V);
    uint32_t Mfix[2];
    for (int k = 0; k < 2; k++)
        Mfix[k] = (uint32_t)floor(pow(2.0, 8.0 * p->container_bytes[k] / N));
    fprintf(stderr, "real data: dq226 at %u×%u: C %u/%u, M %u/%u; fixed width at matched storage: M %u/%u\n", KV_HEADS,
            HEAD_DIM, p->container_bytes[0], p->container_bytes[1], p->levels[0], p->levels[1], Mfix[0], Mfix[1]);
    cr_assert_eq(Mfix[0], 6, "K: matched fixed width should have 6 levels (seed Appendix B)");
    cr_assert_eq(Mfix[1], 3, "V: matched fixed width should have 3 levels (seed Appendix B)");

    uint8_t *mean = dqt_xmalloc(dq_codec_mean_bytes(codec));
    uint8_t *krec = dqt_xmalloc((size_t)W * rk), *vrec = dqt_xmalloc((size_t)TOKENS * rv);
    float *x = dqt_xmalloc((size_t)TOKENS * N * sizeof *x), *xd = dqt_xmalloc((size_t)TOKENS * N * sizeof *xd);
    float *mu = dqt_xmalloc(N * sizeof *mu), *y = dqt_xmalloc(N * sizeof *y), *yh = dqt_xmalloc(N * sizeof *yh);
    uint8_t *lev = dqt_xmalloc(N);
    double err_dq[2] = {0}, err_fw[2] = {0}, energy[2] = {0};

    for (int layer = 0; layer < LAYERS; layer++) {
        double le_dq[2] = {0}, le_fw[2] = {0}, le[2] = {0};
        for (int kv = 0; kv < 2; kv++) {
            const uint16_t *src = slab(0, kv, layer);
            for (size_t i = 0; i < (size_t)TOKENS * N; i++)
                x[i] = dq_f16_to_f32(src[i]);
            if (kv == 0) {
                for (uint32_t w0 = 0; w0 < TOKENS; w0 += W) {
                    cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_K, src + (size_t)w0 * N, DQ_DTYPE_F16, W, mean,
                                                  krec, rk, NULL),
                                 DQ_OK);
                    cr_assert_eq(
                        dq_tokens_decode(codec, ws, DQ_KIND_K, mean, krec, rk, W, xd + (size_t)w0 * N, DQ_DTYPE_F32),
                        DQ_OK);
                    /* Baseline: the same dequantized INT8 window mean. */
                    dq__mean_dequant(codec, mean, mu);
                    for (uint32_t t = w0; t < w0 + W; t++) {
                        memcpy(y, x + (size_t)t * N, N * sizeof *y);
                        dq_rotate(codec, y);
                        for (uint32_t j = 0; j < N; j++)
                            y[j] -= mu[j];
                        fixed_width(y, N, Mfix[0], yh, lev);
                        for (uint32_t j = 0; j < N; j++)
                            le_fw[0] += ((double)y[j] - yh[j]) * ((double)y[j] - yh[j]);
                    }
                }
            } else {
                cr_assert_eq(dq_tokens_encode(codec, ws, DQ_KIND_V, src, DQ_DTYPE_F16, TOKENS, NULL, vrec, rv, NULL),
                             DQ_OK);
                cr_assert_eq(dq_tokens_decode(codec, ws, DQ_KIND_V, NULL, vrec, rv, TOKENS, xd, DQ_DTYPE_F32), DQ_OK);
                for (uint32_t t = 0; t < TOKENS; t++) {
                    memcpy(y, x + (size_t)t * N, N * sizeof *y);
                    dq_rotate(codec, y);
                    fixed_width(y, N, Mfix[1], yh, lev);
                    for (uint32_t j = 0; j < N; j++)
                        le_fw[1] += ((double)y[j] - yh[j]) * ((double)y[j] - yh[j]);
                }
            }
            for (size_t i = 0; i < (size_t)TOKENS * N; i++) {
                le_dq[kv] += ((double)x[i] - xd[i]) * ((double)x[i] - xd[i]);
                le[kv] += (double)x[i] * x[i];
            }
        }
        for (int kv = 0; kv < 2; kv++) {
            err_dq[kv] += le_dq[kv];
            err_fw[kv] += le_fw[kv];
            energy[kv] += le[kv];
        }
        fprintf(stderr, "layer %d: K NMSE D-Quant %.5f fixed-width %.5f | V NMSE D-Quant %.5f fixed-width %.5f\n",
                layer, le_dq[0] / le[0], le_fw[0] / le[0], le_dq[1] / le[1], le_fw[1] / le[1]);
    }
    const double dqk = err_dq[0] / energy[0], fwk = err_fw[0] / energy[0];
    const double dqv = err_dq[1] / energy[1], fwv = err_fw[1] / energy[1];
    fprintf(stderr, "all layers: K NMSE D-Quant %.5f vs fixed-width %.5f (ratio %.3f) at %.3f bits/value\n", dqk, fwk,
            dqk / fwk, dq_profile_bits_per_value(p, DQ_KIND_K));
    fprintf(stderr, "all layers: V NMSE D-Quant %.5f vs fixed-width %.5f (ratio %.3f) at %.3f bits/value\n", dqv, fwv,
            dqv / fwv, dq_profile_bits_per_value(p, DQ_KIND_V));
    cr_assert_lt(dqk, fwk, "keys: D-Quant NMSE %.5f not below fixed-width %.5f at matched storage", dqk, fwk);
    cr_assert_lt(dqv, fwv, "values: D-Quant NMSE %.5f not below fixed-width %.5f at matched storage", dqv, fwv);

    free(mean);
    free(krec);
    free(vrec);
    free(x);
    free(xd);
    free(mu);
    free(y);
    free(yh);
    free(lev);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The model's queries at several positions attend causally over the compressed cache: dq_attend
 * matches dq_attend_reference to 1e-5, and the error against exact attention over the original
 * cache is printed and loosely bounded. */
Test(realdata, attention_with_real_queries)
{
    if (!data || !queries)
        cr_skip("real-data attention skipped: %s/bytellama-19m/{kv,q}_f16.bin absent (set DQ_DATA_DIR)",
                dqt_data_dir());
    dq_codec *codec = dqt_codec_builtin("dq226", KV_HEADS, HEAD_DIM);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    static const size_t positions[] = {1, 128, 129, 300, 700, 1024};
    const uint32_t g = Q_HEADS / KV_HEADS;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    float q[Q_HEADS * HEAD_DIM], out[Q_HEADS * HEAD_DIM], lse[Q_HEADS], rout[Q_HEADS * HEAD_DIM], rlse[Q_HEADS];
    double *logit = dqt_xmalloc(TOKENS * sizeof *logit);
    double sum = 0, worst = 0, worst_lse = 0;
    int count = 0;
    for (int layer = 0; layer < LAYERS; layer++) {
        const uint16_t *K = slab(0, 0, layer), *V = slab(0, 1, layer);
        double lsum = 0;
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
            const size_t T = positions[pi];
            dq_layer *l = NULL;
            cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
            cr_assert_eq(dq_layer_append(l, ws, K, V, DQ_DTYPE_F16, T, NULL), DQ_OK);
            const uint16_t *qs = queries + ((size_t)layer * TOKENS + (T - 1)) * Q_HEADS * HEAD_DIM;
            for (uint32_t i = 0; i < Q_HEADS * HEAD_DIM; i++)
                q[i] = dq_f16_to_f32(qs[i]);
            dq_attn_item it = {l, q, out, lse}, rt = {l, q, rout, rlse};
            cr_assert_eq(dq_attend(codec, ws, Q_HEADS, scale, &it, 1), DQ_OK);
            cr_assert_eq(dq_attend_reference(codec, ws, Q_HEADS, scale, &rt, 1), DQ_OK);
            for (uint32_t h = 0; h < Q_HEADS; h++) {
                const double r = dqt_rel_l2_f(out + h * HEAD_DIM, rout + h * HEAD_DIM, HEAD_DIM);
                cr_assert(r <= 1e-5, "layer %d T=%zu head %u: dq_attend vs reference %.3g", layer, T, h, r);
                cr_assert(fabs((double)lse[h] - rlse[h]) <= 1e-5 * fmax(1.0, fabs(rlse[h])));

                /* Exact attention over the original cache, in double. */
                const uint32_t kh = h / g;
                double m = -INFINITY, z = 0, num = 0, den = 0;
                for (size_t t = 0; t < T; t++) {
                    double d = 0;
                    for (uint32_t j = 0; j < HEAD_DIM; j++)
                        d += (double)q[h * HEAD_DIM + j] * dq_f16_to_f32(K[t * N + kh * HEAD_DIM + j]);
                    logit[t] = scale * d;
                    m = fmax(m, logit[t]);
                }
                for (size_t t = 0; t < T; t++)
                    z += exp(logit[t] - m);
                for (uint32_t j = 0; j < HEAD_DIM; j++) {
                    double a = 0;
                    for (size_t t = 0; t < T; t++)
                        a += exp(logit[t] - m) / z * dq_f16_to_f32(V[t * N + kh * HEAD_DIM + j]);
                    num += (out[h * HEAD_DIM + j] - a) * (out[h * HEAD_DIM + j] - a);
                    den += a * a;
                }
                const double rel = sqrt(num / den);
                cr_assert_lt(rel, 1.0, "layer %d T=%zu head %u: %.3f relative error against exact attention", layer, T,
                             h, rel);
                const double dlse = fabs((double)lse[h] - (m + log(z)));
                worst_lse = fmax(worst_lse, dlse);
                cr_assert(dlse < 3.0, "layer %d T=%zu head %u: lse %.4f vs exact %.4f", layer, T, h, (double)lse[h],
                          m + log(z));
                lsum += rel;
                sum += rel;
                worst = fmax(worst, rel);
                count++;
            }
            dq_layer_free(l);
        }
        fprintf(stderr, "layer %d: attention output error vs exact, mean over positions and heads %.4f\n", layer,
                lsum / (Q_HEADS * (sizeof positions / sizeof positions[0])));
    }
    fprintf(stderr,
            "real-query attention error vs exact: mean %.4f, worst %.4f over %d heads; worst |lse - exact| %.3f\n",
            sum / count, worst, count, worst_lse);
    cr_assert_lt(sum / count, 0.3, "mean attention error %.3f against the unquantized cache", sum / count);
    free(logit);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
