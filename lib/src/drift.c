#include <math.h>
#include <pthread.h>
#include <string.h>

#include "drift.h"

static float g_exp2[512];
static pthread_once_t g_exp2_once = PTHREAD_ONCE_INIT;

static void exp2_init(void)
{
    for (int i = 0; i < 512; i++)
        g_exp2[i] = (float)exp2(i / 512.0);
}

const float *dq__exp2_table(void)
{
    pthread_once(&g_exp2_once, exp2_init);
    return g_exp2;
}

float dq__drift_lambda(int hi, uint32_t j)
{
    const float *e = dq__exp2_table();
    uint32_t k = 5 * j; /* 40·j/4096 = 5·j/512 */
    return ldexpf(e[k & 511u], hi - 40 + (int)(k >> 9));
}

static inline uint32_t float_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

static inline float key_float(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void dq__sort_floats(const float *x, uint32_t n, float *out, uint32_t *tmp)
{
    uint32_t *a = tmp, *b = (uint32_t *)(void *)out;
    /* LSD radix, 4 × 8 bits, the four histograms counted in one pass over the keys; a pass whose
     * byte is constant is skipped. The data ends in `out` after an even number of executed
     * passes, otherwise it is copied there. */
    uint32_t counts[4][256] = {{0}};
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t k = float_key(x[i]);
        a[i] = k;
        counts[0][k & 0xffu]++;
        counts[1][(k >> 8) & 0xffu]++;
        counts[2][(k >> 16) & 0xffu]++;
        counts[3][k >> 24]++;
    }
    int in_tmp = 1;
    for (int pass = 0; pass < 4; pass++) {
        uint32_t shift = 8u * (uint32_t)pass;
        uint32_t *count = counts[pass];
        if (count[(a[0] >> shift) & 0xffu] == n)
            continue;
        uint32_t sum = 0;
        for (int v = 0; v < 256; v++) {
            uint32_t c = count[v];
            count[v] = sum;
            sum += c;
        }
        for (uint32_t i = 0; i < n; i++)
            b[count[(a[i] >> shift) & 0xffu]++] = a[i];
        uint32_t *t = a;
        a = b;
        b = t;
        in_tmp = !in_tmp;
    }
    uint32_t *outu = (uint32_t *)(void *)out;
    if (in_tmp)
        memcpy(outu, a, n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        out[i] = key_float(outu[i]);
}

/* Envelope for one λ: levels lv[0..k] and thresholds thr[1..k] (non-decreasing). */
typedef struct envelope {
    uint32_t k;
    uint8_t lv[32];
    float thr[32];
} envelope;

static inline float swap_point(const dq__kind_tables *kt, float s, float lam, uint32_t a, uint32_t b)
{
    float mid = s * (float)(a + b) * 0.5f;
    float pen = (lam * (kt->cost[b] - kt->cost[a])) / ((2.0f * s) * (float)(b - a));
    return mid + pen;
}

static void build_envelope(const dq__kind_tables *kt, float s, float lam, envelope *env)
{
    uint32_t k = 0;
    env->lv[0] = 0;
    for (uint32_t m = 1; m < kt->levels; m++) {
        float t = swap_point(kt, s, lam, env->lv[k], m);
        while (k >= 1 && t <= env->thr[k]) {
            k--;
            t = swap_point(kt, s, lam, env->lv[k], m);
        }
        k++;
        env->lv[k] = (uint8_t)m;
        env->thr[k] = t;
    }
    for (uint32_t i = 2; i <= k; i++)
        if (env->thr[i] < env->thr[i - 1])
            env->thr[i] = env->thr[i - 1];
    env->k = k;
}

/* Number of sorted values with fl(x - o) <= t. (A branch-free version measured slower: the
 * branches' speculation runs ahead of the dependent loads.) */
static inline uint32_t count_le(const float *xs, uint32_t n, float o, float t)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) >> 1;
        if (xs[mid] - o <= t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int64_t envelope_cost(const dq__kind_tables *kt, const envelope *env, const float *xs, uint32_t n, float o)
{
    int64_t cost = (int64_t)n * kt->cost_q16[env->lv[0]];
    for (uint32_t i = 1; i <= env->k; i++) {
        uint32_t above = n - count_le(xs, n, o, env->thr[i]);
        cost += (int64_t)above * (kt->cost_q16[env->lv[i]] - kt->cost_q16[env->lv[i - 1]]);
    }
    return cost;
}

/* Version 2: the pairs' assignment for one λ, Σ r over the pairs (Q16); levels may be NULL. Per
 * pair (y1, y2) = (x_2i − o, x_2i+1 − o) the argmin over (a, b) of
 *     c(a, b) = (d1[a] + d2[b]) + lr[a·M + b],  d[m] = (y − s·m)², lr = λ·r_ab (float, no contraction),
 * the lowest a·M + b on ties: the exact Lagrangian assignment under the pair costs.
 *
 * Pruned without changing the result: with C0 = c(a1, b1) at the nearest levels, the argmin has
 * c <= C0, and float rounding is monotone, so its a satisfies (d1[a] + min d2) + min lr <= C0 and
 * its b (min d1 + d2[b]) + min lr <= C0 (a candidate tied with it passes too). Only those rows and
 * columns are searched, in the same order. */
static int64_t pair_assign(const dq__kind_tables *kt, const float *x, uint32_t n, float s, float o, float lam,
                           uint8_t *levels)
{
    const uint32_t M = kt->levels, P = M * M;
    float lr[DQ_RANS2_MAX_PAIRS], lv[32];
    /* (first entries outside the loops: M >= 2 always, which cppcheck cannot see) */
    lr[0] = lam * kt->pair_cost[0];
    float lrmin = lr[0];
    for (uint32_t k = 1; k < P; k++) {
        lr[k] = lam * kt->pair_cost[k];
        lrmin = lr[k] < lrmin ? lr[k] : lrmin;
    }
    lv[0] = s * 0.0f;
    for (uint32_t m = 1; m < M; m++)
        lv[m] = s * (float)m;
    int64_t cost = 0;
    for (uint32_t i = 0; i + 1 < n; i += 2) {
        const float y1 = x[i] - o, y2 = x[i + 1] - o;
        float d1[32], d2[32];
        uint32_t a1 = 0, b1 = 0;
        d1[0] = (y1 - lv[0]) * (y1 - lv[0]);
        d2[0] = (y2 - lv[0]) * (y2 - lv[0]);
        for (uint32_t m = 1; m < M; m++) {
            const float e1 = y1 - lv[m], e2 = y2 - lv[m];
            d1[m] = e1 * e1;
            d2[m] = e2 * e2;
            a1 = d1[m] < d1[a1] ? m : a1;
            b1 = d2[m] < d2[b1] ? m : b1;
        }
        const float c0 = (d1[a1] + d2[b1]) + lr[a1 * M + b1];
        uint8_t ca[32], cb[32];
        uint32_t na = 0, nb = 0;
        for (uint32_t m = 0; m < M; m++) {
            if ((d1[m] + d2[b1]) + lrmin <= c0)
                ca[na++] = (uint8_t)m;
            if ((d1[a1] + d2[m]) + lrmin <= c0)
                cb[nb++] = (uint8_t)m;
        }
        float best = INFINITY;
        uint32_t arg = 0;
        for (uint32_t ia = 0; ia < na; ia++) {
            const uint32_t a = ca[ia];
            const float *row = lr + a * M;
            for (uint32_t ib = 0; ib < nb; ib++) {
                const uint32_t b = cb[ib];
                const float c = (d1[a] + d2[b]) + row[b];
                if (c < best) {
                    best = c;
                    arg = a * M + b;
                }
            }
        }
        cost += kt->pair_cost_q16[arg];
        if (levels) {
            levels[i] = (uint8_t)(arg / M);
            levels[i + 1] = (uint8_t)(arg % M);
        }
    }
    return cost;
}

dq__drift_result dq__drift(const dq__kind_tables *kt, const float *x, const float *xs, uint32_t n, float s, float o,
                           int64_t budget_q16, uint8_t *levels)
{
    const uint32_t M = kt->levels;
    /* hi = ceil(log2(8·(max D - min D))). max D sits at an end level and an extreme value. */
    float lv0 = o, lvM = o + s * (float)(M - 1);
    float xmin = xs[0], xmax = xs[n - 1];
    float d;
    float maxd = 0;
    d = xmin - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmin - lvM;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lvM;
    maxd = fmaxf(maxd, d * d);
    float mind = INFINITY;
    for (uint32_t m = 0; m < M; m++) {
        float lv = o + s * (float)m;
        uint32_t p = count_le(xs, n, 0.0f, lv); /* xs[p-1] <= lv < xs[p] */
        if (p > 0) {
            d = xs[p - 1] - lv;
            mind = fminf(mind, d * d);
        }
        if (p < n) {
            d = xs[p] - lv;
            mind = fminf(mind, d * d);
        }
    }
    float span = 8.0f * (maxd - mind);
    int hi = 0;
    if (span > 0 && isfinite(span)) {
        int e;
        float mant = frexpf(span, &e);
        hi = mant == 0.5f ? e - 1 : e;
    }

    uint32_t jlo = 0, jhi = DQ_DRIFT_GRID;
    if (kt->pairs) {
        /* the same λ grid and bisection, the cost counted over the pairs */
        for (int t = 0; t < DQ_DRIFT_STEPS; t++) {
            uint32_t jm = (jlo + jhi) >> 1;
            if (pair_assign(kt, x, n, s, o, dq__drift_lambda(hi, jm), NULL) <= budget_q16)
                jhi = jm;
            else
                jlo = jm;
        }
        const int64_t cost = pair_assign(kt, x, n, s, o, dq__drift_lambda(hi, jhi), levels);
        dq__drift_result r = {cost, cost <= budget_q16, jhi};
        return r;
    }
    envelope env;
    for (int t = 0; t < DQ_DRIFT_STEPS; t++) {
        uint32_t jm = (jlo + jhi) >> 1;
        build_envelope(kt, s, dq__drift_lambda(hi, jm), &env);
        if (envelope_cost(kt, &env, xs, n, o) <= budget_q16)
            jhi = jm;
        else
            jlo = jm;
    }
    build_envelope(kt, s, dq__drift_lambda(hi, jhi), &env);
    /* A value's envelope index is the number of thresholds below it, counted threshold by
     * threshold over blocks of values so that the compares vectorize. */
    int32_t cost_of[32];
    for (uint32_t c = 0; c <= env.k; c++)
        cost_of[c] = kt->cost_q16[env.lv[c]];
    int64_t cost = 0;
    for (uint32_t i0 = 0; i0 < n; i0 += 64) {
        const uint32_t m = n - i0 < 64 ? n - i0 : 64;
        float y[64];
        uint8_t c[64];
        for (uint32_t i = 0; i < m; i++) {
            y[i] = x[i0 + i] - o;
            c[i] = 0;
        }
        for (uint32_t j = 1; j <= env.k; j++) {
            const float t = env.thr[j];
            for (uint32_t i = 0; i < m; i++)
                c[i] += y[i] > t;
        }
        for (uint32_t i = 0; i < m; i++) {
            levels[i0 + i] = env.lv[c[i]];
            cost += cost_of[c[i]];
        }
    }
    dq__drift_result r = {cost, cost <= budget_q16, jhi};
    return r;
}

void dq__refit(const float *x, const uint8_t *levels, uint32_t n, double *s, double *o)
{
    /* Lane partials in the order of a 32-lane warp holding value i in lane i mod 32. */
    double px[32] = {0}, pxm[32] = {0};
    int64_t sm = 0, smm = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l = i & 31u;
        px[l] += (double)x[i];
        pxm[l] += (double)x[i] * (double)levels[i];
        sm += levels[i];
        smm += (int64_t)levels[i] * levels[i];
    }
    for (uint32_t off = 16; off >= 1; off >>= 1) {
        for (uint32_t l = 0; l < off; l++) {
            px[l] = px[l] + px[l + off];
            pxm[l] = pxm[l] + pxm[l + off];
        }
    }
    double sx = px[0], sxm = pxm[0];
    double dn = (double)n;
    double det = dn * (double)smm - (double)sm * (double)sm;
    double ns, no;
    if (det > 0) {
        ns = (dn * sxm - (double)sm * sx) / det;
        no = (sx - ns * (double)sm) / dn;
    } else {
        ns = *s;
        no = (sx - ns * (double)sm) / dn;
    }
    if (!(ns >= 0) || !isfinite(ns) || !isfinite(no) || (det > 0 && !(ns > 0)))
        return;
    *s = ns;
    *o = no;
}

double dq__sum_lanes_d(const double *v, uint32_t n)
{
    double p[32] = {0};
    for (uint32_t i = 0; i < n; i++)
        p[i & 31u] += v[i];
    for (uint32_t off = 16; off >= 1; off >>= 1)
        for (uint32_t l = 0; l < off; l++)
            p[l] = p[l] + p[l + off];
    return p[0];
}
