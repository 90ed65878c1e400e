/* Certified value skipping (dquant/vskip.h): τ off is bit-identical to dq_attend/dq_hot_attend;
 * with τ on the returned per-head bound holds (‖out_τ − out‖₂ <= bound) on random caches (dq226
 * and the fixed-width fixed226) and on
 * bytellama-19m's real KV with the model's queries; the kept set is the union of the heads'
 * minimal sets (checked by brute force); records and hot windows give the same results; bad τ is
 * DQ_INVALID_ARGUMENT. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x5c1bu);
}

TestSuite(vskip, .init = suite_init);

/* A layer of T tokens: keys with per-channel offsets, values with a mean, appended in two pieces
 * (windows and a tail). */
static dq_layer *random_layer(const dq_codec *codec, dq_workspace *ws, size_t T)
{
    const uint32_t n = dq_codec_stream_len(codec);
    float *k = dqt_xmalloc((T ? T : 1) * n * sizeof(float)), *v = dqt_xmalloc((T ? T : 1) * n * sizeof(float));
    float *off = dqt_xmalloc(n * sizeof(float));
    for (uint32_t j = 0; j < n; j++)
        off[j] = (float)(1.5 * dqt_normal(&rng));
    for (size_t t = 0; t < T; t++)
        for (uint32_t j = 0; j < n; j++) {
            k[t * n + j] = off[j] + (float)dqt_normal(&rng);
            v[t * n + j] = (float)(dqt_normal(&rng) + 0.3 * off[j]);
        }
    dq_layer *l = NULL;
    cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
    const size_t a = T / 3;
    if (a)
        cr_assert_eq(dq_layer_append(l, ws, k, v, DQ_DTYPE_F32, a, NULL), DQ_OK);
    if (T > a)
        cr_assert_eq(dq_layer_append(l, ws, k + a * n, v + a * n, DQ_DTYPE_F32, T - a, NULL), DQ_OK);
    free(k);
    free(v);
    free(off);
    return l;
}

static void random_query(float *q, size_t len, double sigma)
{
    for (size_t i = 0; i < len; i++)
        q[i] = (float)(sigma * dqt_normal(&rng));
}

/* The layer's windows as hot windows (hot: nwin · dq_hot_window_bytes) and its hot item. */
static dq_hot_item hot_item(const dq_codec *codec, const dq_layer *l, uint8_t **hot, const uint8_t ***ptrs,
                            const float *q, float *out, float *lse)
{
    const size_t nwin = dq_layer_window_count(l), hb = dq_hot_window_bytes(codec);
    *hot = dqt_xmalloc((nwin ? nwin : 1) * hb);
    *ptrs = dqt_xmalloc((nwin ? nwin : 1) * sizeof(**ptrs));
    for (size_t w = 0; w < nwin; w++) {
        cr_assert_eq(dq_hot_transcode(codec, dq_layer_window(l, w), *hot + w * hb), DQ_OK);
        (*ptrs)[w] = *hot + w * hb;
    }
    return (dq_hot_item){.windows = *ptrs,
                         .nwin = nwin,
                         .tail_k = dq_layer_tail(l, DQ_KIND_K),
                         .tail_v = dq_layer_tail(l, DQ_KIND_V),
                         .tail_tokens = dq_layer_tail_tokens(l),
                         .q = q,
                         .out = out,
                         .lse = lse};
}

static double l2_diff(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s);
}

static double l2(const float *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * a[i];
    return sqrt(s);
}

Test(vskip, off_is_bit_identical)
{
    enum { KVH = 2, D = 64, QH = 8 };
    dq_codec *codec = dqt_codec_builtin("dq226", KVH, D);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    const float scale = 1.0f / sqrtf((float)D);
    static const size_t lengths[] = {0, 5, 128, 200, 700};
    static const double offs[] = {0.0, 1.0};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        dq_layer *l = random_layer(codec, ws, lengths[li]);
        float q[QH * D], out[QH * D], lse[QH], out2[QH * D], lse2[QH];
        random_query(q, QH * D, 2.0);
        dq_attn_item it = {l, q, out, lse}, it2 = {l, q, out2, lse2};
        cr_assert_eq(dq_attend(codec, ws, QH, scale, &it, 1), DQ_OK);
        for (size_t oi = 0; oi < 2; oi++) {
            double bound[QH];
            uint8_t keep[1024];
            dq_vskip_out vo = {.bound = bound, .keep = keep};
            memset(out2, 0xff, sizeof out2);
            cr_assert_eq(dq_attend_vskip(codec, ws, QH, scale, offs[oi], &it2, &vo, 1), DQ_OK);
            cr_assert(memcmp(out, out2, sizeof out) == 0 && memcmp(lse, lse2, sizeof lse) == 0, "T=%zu tau=%g",
                      lengths[li], offs[oi]);
            cr_assert_eq(vo.values_sealed, dq_layer_window_count(l) * 128);
            cr_assert_eq(vo.values_decoded, vo.values_sealed);
            for (uint32_t h = 0; h < QH; h++)
                cr_assert_eq(bound[h], 0.0);
            /* hot windows likewise against dq_hot_attend */
            uint8_t *hot;
            const uint8_t **ptrs;
            float hout[QH * D], hlse[QH], hout2[QH * D], hlse2[QH];
            dq_hot_item hi = hot_item(codec, l, &hot, &ptrs, q, hout, hlse), hi2 = hi;
            hi2.out = hout2;
            hi2.lse = hlse2;
            cr_assert_eq(dq_hot_attend(codec, ws, QH, scale, &hi, 1), DQ_OK);
            cr_assert_eq(dq_hot_attend_vskip(codec, ws, QH, scale, offs[oi], &hi2, &vo, 1), DQ_OK);
            cr_assert(memcmp(hout, hout2, sizeof hout) == 0 && memcmp(hlse, hlse2, sizeof hlse) == 0);
            cr_assert(memcmp(hout, out, sizeof out) == 0);
            free(hot);
            free(ptrs);
        }
        dq_layer_free(l);
    }
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* Checks one item at one τ on records and hot windows: the bound holds per head, LSE is dq_attend's,
 * both sources agree bit for bit, keep and the count agree. Returns the fraction of value streams
 * decoded; *rel gets the worst relative error over heads. */
static double check_item(const dq_codec *codec, dq_workspace *ws, const dq_layer *l, uint32_t qh, uint32_t d,
                         float scale, const float *q, double tau, double *rel, double *brel, int *skipped_any)
{
    const size_t sealed = dq_layer_window_count(l) * dq_codec_profile(codec)->window;
    float *ex = dqt_xmalloc(qh * d * sizeof(float)), *out = dqt_xmalloc(qh * d * sizeof(float));
    float *hout = dqt_xmalloc(qh * d * sizeof(float));
    float exl[64], lse[64], hlse[64];
    double bound[64], hbound[64];
    uint8_t *keep = dqt_xmalloc(sealed + 1), *hkeep = dqt_xmalloc(sealed + 1);
    dq_attn_item ie = {l, q, ex, exl}, it = {l, q, out, lse};
    cr_assert_eq(dq_attend(codec, ws, qh, scale, &ie, 1), DQ_OK);
    dq_vskip_out vo = {.bound = bound, .keep = keep}, hvo = {.bound = hbound, .keep = hkeep};
    cr_assert_eq(dq_attend_vskip(codec, ws, qh, scale, tau, &it, &vo, 1), DQ_OK);
    cr_assert_eq(vo.values_sealed, sealed);
    uint64_t cnt = 0;
    for (size_t t = 0; t < sealed; t++)
        cnt += keep[t];
    cr_assert_eq(cnt, vo.values_decoded);
    *rel = *brel = 0;
    for (uint32_t h = 0; h < qh; h++) {
        const double e = l2_diff(out + h * d, ex + h * d, d), nrm = l2(ex + h * d, d);
        cr_assert(e <= bound[h], "tau %g head %u: error %.6g above the bound %.6g", tau, h, e, bound[h]);
        cr_assert(fabs((double)lse[h] - exl[h]) <= 1e-5 * fmax(1.0, fabs((double)exl[h])), "lse %g vs %g", lse[h],
                  exl[h]);
        if (nrm > 0) {
            *rel = fmax(*rel, e / nrm);
            *brel = fmax(*brel, bound[h] / nrm);
        }
    }
    if (vo.values_decoded < sealed)
        *skipped_any = 1;
    uint8_t *hot;
    const uint8_t **ptrs;
    dq_hot_item hi = hot_item(codec, l, &hot, &ptrs, q, hout, hlse);
    cr_assert_eq(dq_hot_attend_vskip(codec, ws, qh, scale, tau, &hi, &hvo, 1), DQ_OK);
    cr_assert(memcmp(hout, out, qh * d * sizeof(float)) == 0, "hot windows differ from records at tau %g", tau);
    cr_assert(memcmp(hlse, lse, qh * sizeof(float)) == 0);
    cr_assert(memcmp(hbound, bound, qh * sizeof(double)) == 0);
    cr_assert(memcmp(hkeep, keep, sealed) == 0);
    cr_assert_eq(hvo.values_decoded, vo.values_decoded);
    free(hot);
    free(ptrs);
    free(ex);
    free(out);
    free(hout);
    free(keep);
    free(hkeep);
    return sealed ? (double)vo.values_decoded / sealed : 1.0;
}

Test(vskip, bound_holds_random)
{
    static const double taus[] = {0.3, 0.9, 0.99, 0.999, 0.99999};
    static const struct {
        const char *profile;
        uint32_t kvh, d, qh;
        size_t T;
        double sigma;
    } cases[] = {{"dq226", 2, 64, 8, 700, 3.0},
                 {"dq226", 1, 128, 4, 1100, 4.0},
                 {"dq226", 4, 64, 4, 300, 1.0},
                 {"dq226", 2, 128, 2, 130, 6.0},
                 {"fixed226", 2, 128, 8, 600, 3.0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        dq_codec *codec = dqt_codec_builtin(cases[ci].profile, cases[ci].kvh, cases[ci].d);
        dq_workspace *ws = NULL;
        cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
        dq_layer *l = random_layer(codec, ws, cases[ci].T);
        const uint32_t qh = cases[ci].qh, d = cases[ci].d;
        float *q = dqt_xmalloc(qh * d * sizeof(float));
        random_query(q, qh * d, cases[ci].sigma);
        const float scale = 1.0f / sqrtf((float)d);
        int skipped = 0, any_diff = 0;
        for (size_t ti = 0; ti < sizeof taus / sizeof taus[0]; ti++) {
            double rel, brel;
            const double frac = check_item(codec, ws, l, qh, d, scale, q, taus[ti], &rel, &brel, &skipped);
            any_diff |= rel > 0;
            cr_log_info("case %zu tau %g: %.1f%% of value streams decoded, worst relative error %.3g (bound %.3g)", ci,
                        taus[ti], 100 * frac, rel, brel);
        }
        cr_assert(skipped && any_diff, "case %zu: no τ skipped anything", ci);
        free(q);
        dq_layer_free(l);
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
}

/* bytellama-19m (2 KV heads × 128, 4 query heads): the model's own query at the last position of
 * 1024-token prefixes of every layer. */
Test(vskip, bound_holds_real)
{
    enum { SEQS = 2, LAYERS = 6, TOKENS = 1024, KVH = 2, D = 128, N = KVH * D, QH = 4 };
    char path[4096];
    snprintf(path, sizeof path, "%s/bytellama-19m/kv_f16.bin", dqt_data_dir());
    FILE *f = fopen(path, "rb");
    snprintf(path, sizeof path, "%s/bytellama-19m/q_f16.bin", dqt_data_dir());
    FILE *fq = fopen(path, "rb");
    if (!f || !fq) {
        if (f)
            fclose(f);
        if (fq)
            fclose(fq);
        cr_skip("real-data value skipping skipped: %s/bytellama-19m/{kv,q}_f16.bin absent (set DQ_DATA_DIR)",
                dqt_data_dir());
    }
    const size_t nkv = (size_t)SEQS * 2 * LAYERS * TOKENS * N, nq = (size_t)LAYERS * TOKENS * QH * D;
    uint16_t *kv = dqt_xmalloc(nkv * 2), *qs = dqt_xmalloc(nq * 2);
    cr_assert_eq(fread(kv, 2, nkv, f), nkv);
    cr_assert_eq(fread(qs, 2, nq, fq), nq);
    fclose(f);
    fclose(fq);
    dq_codec *codec = dqt_codec_builtin("dq226", KVH, D);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    static const double taus[] = {0.9, 0.99, 0.999};
    const float scale = 1.0f / sqrtf((float)D);
    float q[QH * D];
    static const size_t lengths[] = {1000, 1024};
    for (size_t ti = 0; ti < sizeof taus / sizeof taus[0]; ti++) {
        double frac = 0, worst = 0, wbound = 0, mean = 0;
        int count = 0, skipped = 0;
        for (int layer = 0; layer < LAYERS; layer++)
            for (size_t li = 0; li < 2; li++) {
                const size_t T = lengths[li];
                const uint16_t *K = kv + ((size_t)0 * 2 * LAYERS + layer) * TOKENS * N;
                const uint16_t *V = kv + ((size_t)1 * LAYERS + layer) * TOKENS * N;
                dq_layer *l = NULL;
                cr_assert_eq(dq_layer_create(codec, &l), DQ_OK);
                cr_assert_eq(dq_layer_append(l, ws, K, V, DQ_DTYPE_F16, T, NULL), DQ_OK);
                const uint16_t *qp = qs + ((size_t)layer * TOKENS + (T - 1)) * QH * D;
                for (uint32_t i = 0; i < QH * D; i++)
                    q[i] = dq_f16_to_f32(qp[i]);
                double rel, brel;
                frac += check_item(codec, ws, l, QH, D, scale, q, taus[ti], &rel, &brel, &skipped);
                worst = fmax(worst, rel);
                wbound = fmax(wbound, brel);
                mean += rel;
                count++;
                dq_layer_free(l);
            }
        cr_log_info("bytellama-19m tau %g: %.1f%% of value streams decoded (mean over %d), relative error mean of "
                    "worst heads %.3g, worst %.3g, worst bound %.3g",
                    taus[ti], 100 * frac / count, count, mean / count, worst, wbound);
        cr_assert(skipped, "tau %g skipped nothing on real data", taus[ti]);
    }
    free(kv);
    free(qs);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}

/* The brute-force selection: per head, tokens by descending logit then ascending index until the
 * fixed mass plus theirs reaches τ of the whole; the union. */
static void brute_select(const float *L, size_t stride, uint32_t heads, size_t T, const float *F, size_t nf, double tau,
                         uint8_t *keep)
{
    memset(keep, 0, T);
    size_t *ord = dqt_xmalloc((T ? T : 1) * sizeof(size_t));
    for (uint32_t h = 0; h < heads; h++) {
        const float *l = L + h * stride, *fx = F ? F + h * nf : NULL;
        double M = -INFINITY;
        for (size_t t = 0; t < T; t++)
            M = fmax(M, l[t]);
        for (size_t t = 0; t < nf; t++)
            M = fmax(M, fx[t]);
        double Z = 0, kept = 0;
        for (size_t t = 0; t < nf; t++)
            kept += exp(fx[t] - M);
        Z = kept;
        for (size_t t = 0; t < T; t++)
            Z += exp(l[t] - M);
        for (size_t t = 0; t < T; t++)
            ord[t] = t;
        /* insertion sort: descending logit, ascending index */
        for (size_t i = 1; i < T; i++) {
            size_t x = ord[i], j = i;
            while (j > 0 && (l[ord[j - 1]] < l[x] || (l[ord[j - 1]] == l[x] && ord[j - 1] > x))) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = x;
        }
        for (size_t i = 0; i < T && kept < tau * Z; i++) {
            keep[ord[i]] = 1;
            kept += exp(l[ord[i]] - M);
        }
    }
    free(ord);
}

Test(vskip, kept_set_is_union_of_minimal_sets)
{
    dq_codec *codec = dqt_codec_builtin("dq226", 1, 64);
    enum { MAXT = 600, MAXH = 6, MAXF = 40 };
    float *L = dqt_xmalloc(MAXH * MAXT * sizeof(float)), F[MAXH * MAXF];
    uint8_t keep[MAXT], want[MAXT];
    double skipped[MAXH];
    for (int trial = 0; trial < 400; trial++) {
        const uint32_t heads = 1 + dqt_below(&rng, MAXH);
        const size_t T = dqt_below(&rng, MAXT + 1), nf = dqt_below(&rng, 3) ? 0 : dqt_below(&rng, MAXF + 1);
        const int ties = trial % 3 == 0;
        const double spread = 0.5 + 20 * dqt_uniform(&rng);
        for (size_t i = 0; i < (size_t)heads * T; i++)
            L[i] = ties ? (float)dqt_below(&rng, 6) : (float)(spread * dqt_normal(&rng));
        for (size_t i = 0; i < (size_t)heads * nf; i++)
            F[i] = (float)(spread * dqt_normal(&rng));
        const double tau = trial % 5 == 0 ? 0.999 : dqt_uniform(&rng);
        if (!(tau > 0))
            continue;
        cr_assert_eq(dq_vskip_select(codec, L, T, heads, T, nf ? F : NULL, nf, nf, tau, keep, skipped), DQ_OK);
        brute_select(L, T, heads, T, F, nf, tau, want);
        cr_assert(memcmp(keep, want, T) == 0, "trial %d: heads %u T %zu fixed %zu tau %g ties %d", trial, heads, T, nf,
                  tau, ties);
        /* each head's mass outside the union is at most 1 − τ */
        for (uint32_t h = 0; h < heads; h++)
            cr_assert(skipped[h] >= 0 && skipped[h] <= 1 - tau + 1e-12, "skipped %g at tau %g", skipped[h], tau);
    }
    /* τ off keeps everything */
    for (size_t i = 0; i < 10; i++)
        L[i] = (float)i;
    memset(keep, 0, sizeof keep);
    cr_assert_eq(dq_vskip_select(codec, L, 10, 1, 10, NULL, 0, 0, 1.0, keep, skipped), DQ_OK);
    for (size_t i = 0; i < 10; i++)
        cr_assert_eq(keep[i], 1);
    cr_assert_eq(skipped[0], 0.0);
    free(L);
    dq_codec_free(codec);
}

Test(vskip, bad_tau_and_codec)
{
    enum { KVH = 2, D = 64, QH = 4 };
    dq_codec *codec = dqt_codec_builtin("dq226", KVH, D);
    dq_workspace *ws = NULL;
    cr_assert_eq(dq_workspace_create(codec, &ws), DQ_OK);
    dq_layer *l = random_layer(codec, ws, 300);
    float q[QH * D], out[QH * D];
    random_query(q, QH * D, 1.0);
    dq_attn_item it = {l, q, out, NULL};
    uint8_t *hot;
    const uint8_t **ptrs;
    dq_hot_item hi = hot_item(codec, l, &hot, &ptrs, q, out, NULL);
    float L[4] = {0, 1, 2, 3};
    uint8_t keep[4];
    static const double bad[] = {NAN, -0.1, 1.5, -INFINITY, INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(dq_vskip_enabled(bad[i]), DQ_INVALID_ARGUMENT);
        cr_assert_eq(dq_attend_vskip(codec, ws, QH, 0.125f, bad[i], &it, NULL, 1), DQ_INVALID_ARGUMENT);
        cr_assert_eq(dq_hot_attend_vskip(codec, ws, QH, 0.125f, bad[i], &hi, NULL, 1), DQ_INVALID_ARGUMENT);
        cr_assert_eq(dq_vskip_select(codec, L, 4, 1, 4, NULL, 0, 0, bad[i], keep, NULL), DQ_INVALID_ARGUMENT);
    }
    cr_assert_eq(dq_vskip_enabled(0.0), 0);
    cr_assert_eq(dq_vskip_enabled(1.0), 0);
    cr_assert_eq(dq_vskip_enabled(0.999), 1);
    /* a logit that is not finite, a missing pointer */
    L[2] = NAN;
    cr_assert_eq(dq_vskip_select(codec, L, 4, 1, 4, NULL, 0, 0, 0.9, keep, NULL), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_vskip_select(codec, NULL, 4, 1, 4, NULL, 0, 0, 0.9, keep, NULL), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_vskip_select(NULL, L, 4, 1, 4, NULL, 0, 0, 0.9, keep, NULL), DQ_INVALID_ARGUMENT);
    /* the query checks of dq_attend come first as there */
    q[3] = NAN;
    cr_assert_eq(dq_attend_vskip(codec, ws, QH, 0.125f, 0.9, &it, NULL, 1), DQ_NONFINITE);
    q[3] = 0;
    /* baseline codecs: τ on is unsupported, τ off is dq_attend */
    dq_codec *base = dqt_codec_builtin("int2", KVH, D);
    dq_workspace *bws = NULL;
    cr_assert_eq(dq_workspace_create(base, &bws), DQ_OK);
    dq_layer *bl = random_layer(base, bws, 200);
    dq_attn_item bt = {bl, q, out, NULL};
    cr_assert_eq(dq_attend_vskip(base, bws, QH, 0.125f, 0.9, &bt, NULL, 1), DQ_UNSUPPORTED);
    cr_assert_eq(dq_attend_vskip(base, bws, QH, 0.125f, 0.0, &bt, NULL, 1), DQ_OK);
    dq_layer_free(bl);
    dq_workspace_free(bws);
    dq_codec_free(base);
    free(hot);
    free(ptrs);
    dq_layer_free(l);
    dq_workspace_free(ws);
    dq_codec_free(codec);
}
