/* Value skipping (dquant/vskip.h): the per-head minimal sets by mass, their union, and the bound
 * on the output error. Selection is linear per head: weights are binned by their logit's distance
 * to the head's max (1/8 nat per bin), the cumulative mass of whole bins finds the one bin where
 * the target is crossed, and only that bin's tokens are sorted. Weights are expf(logit − max) in
 * float, as the attention's softmax computes them (so attention can take them as they are); sums
 * are in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/vskip.h"
#include "vskip_internal.h"

enum { VS_BINS = 1024, VS_PER_NAT = 8 };

typedef struct vs_tok {
    float l;
    uint32_t i;
} vs_tok;

/* Descending logit, then ascending index: the deterministic order of the greedy selection. */
static int vs_cmp(const void *pa, const void *pb)
{
    const vs_tok *a = pa, *b = pb;
    if (a->l != b->l)
        return a->l > b->l ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static size_t vs_bin(float max, float l)
{
    const double x = ((double)max - (double)l) * VS_PER_NAT;
    return x >= VS_BINS - 1 ? VS_BINS - 1 : (size_t)x;
}

int dq_vskip_enabled(double value_mass)
{
    DQ_RETURN_IF(!(value_mass >= 0.0 && value_mass <= 1.0), DQ_INVALID_ARGUMENT);
    return value_mass > 0.0 && value_mass < 1.0;
}

int dq__vskip_select(const dq_allocator *a, const float *logits, size_t stride, uint32_t heads, size_t tokens,
                     const float *fixed, size_t fixed_stride, size_t nfixed, double tau, uint8_t *keep, float *maxv,
                     double *Z, double *skipped, float *wts)
{
    memset(keep, 0, tokens);
    double *hist = dq__alloc(a, sizeof(double) * VS_BINS);
    vs_tok *bin = dq__alloc(a, sizeof(vs_tok) * (tokens ? tokens : 1));
    if (!hist || !bin) {
        dq__free(a, hist);
        dq__free(a, bin);
        return DQ_NOMEM;
    }
    for (uint32_t h = 0; h < heads; h++) {
        const float *L = logits + (size_t)h * stride, *F = fixed ? fixed + (size_t)h * fixed_stride : NULL;
        float M = -INFINITY;
        for (size_t t = 0; t < tokens; t++)
            M = L[t] > M ? L[t] : M;
        for (size_t t = 0; t < nfixed; t++)
            M = F[t] > M ? F[t] : M;
        maxv[h] = M;
        double z = 0, kept = 0;
        for (size_t t = 0; t < nfixed; t++)
            kept += expf(F[t] - M);
        memset(hist, 0, sizeof(double) * VS_BINS);
        float *wh = wts ? wts + (size_t)h * stride : NULL;
        for (size_t t = 0; t < tokens; t++) {
            const float w = expf(L[t] - M);
            hist[vs_bin(M, L[t])] += w;
            if (wh)
                wh[t] = w;
        }
        z = kept;
        for (size_t b = 0; b < VS_BINS; b++)
            z += hist[b];
        Z[h] = z;
        const double target = tau * z;
        if (kept >= target)
            continue;
        /* whole bins while they stay below the target; the crossing bin token by token */
        size_t bstar = VS_BINS - 1;
        for (size_t b = 0; b < VS_BINS; b++) {
            if (kept + hist[b] >= target) {
                bstar = b;
                break;
            }
            kept += hist[b];
        }
        size_t nb = 0;
        for (size_t t = 0; t < tokens; t++) {
            const size_t b = vs_bin(M, L[t]);
            if (b < bstar)
                keep[t] = 1;
            else if (b == bstar)
                bin[nb++] = (vs_tok){L[t], (uint32_t)t};
        }
        qsort(bin, nb, sizeof *bin, vs_cmp);
        for (size_t i = 0; i < nb && kept < target; i++) {
            keep[bin[i].i] = 1;
            kept += expf(bin[i].l - M);
        }
    }
    if (skipped)
        for (uint32_t h = 0; h < heads; h++) {
            const float *L = logits + (size_t)h * stride;
            double s = 0;
            for (size_t t = 0; t < tokens; t++)
                if (!keep[t])
                    s += expf(L[t] - maxv[h]);
            skipped[h] = Z[h] > 0 ? s / Z[h] : 0.0;
        }
    dq__free(a, hist);
    dq__free(a, bin);
    return DQ_OK;
}

int dq_vskip_select(const dq_codec *c, const float *logits, size_t stride, uint32_t heads, size_t tokens,
                    const float *fixed, size_t fixed_stride, size_t nfixed, double value_mass, uint8_t *keep,
                    double *skipped)
{
    DQ_RETURN_IF(!c || (tokens && (!logits || !keep)) || (nfixed && !fixed), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(heads > 1 && tokens && stride < tokens, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(heads > 1 && nfixed && fixed_stride < nfixed, DQ_INVALID_ARGUMENT);
    const int on = dq_vskip_enabled(value_mass);
    DQ_FORWARD_IF_ERROR(on);
    for (uint32_t h = 0; h < heads; h++) {
        for (size_t t = 0; t < tokens; t++)
            DQ_RETURN_IF(!isfinite(logits[(size_t)h * stride + t]), DQ_INVALID_ARGUMENT);
        for (size_t t = 0; t < nfixed; t++)
            DQ_RETURN_IF(!isfinite(fixed[(size_t)h * fixed_stride + t]), DQ_INVALID_ARGUMENT);
    }
    if (!on || !heads) {
        if (tokens)
            memset(keep, 1, tokens);
        if (skipped)
            for (uint32_t h = 0; h < heads; h++)
                skipped[h] = 0.0;
        return DQ_OK;
    }
    float *maxv = dq__alloc(&c->alloc, sizeof(float) * heads);
    double *Z = dq__alloc(&c->alloc, sizeof(double) * heads);
    int rc = DQ_NOMEM;
    if (maxv && Z)
        rc = dq__vskip_select(&c->alloc, logits, stride, heads, tokens, fixed, fixed_stride, nfixed, value_mass, keep,
                              maxv, Z, skipped, NULL);
    dq__free(&c->alloc, maxv);
    dq__free(&c->alloc, Z);
    return rc;
}

float dq__vskip_amax(float s, float o, uint32_t M)
{
    const double hi = (double)o + (double)s * (double)(M - 1);
    const double a = fmax(fabs((double)o), fabs(hi));
    return (float)(a * (1.0 + 0x1p-20));
}

double dq__vskip_bound(const float *logits, const float *wts, const float *amax, const uint8_t *keep, size_t tokens,
                       const float *tail, const float *tmax, size_t nfixed, float max, double Z, uint32_t W, uint32_t d)
{
    if (!(Z > 0))
        return 0.0;
    double skip = 0, A = 0, X = 0, Xl = 0;
    for (size_t t = 0; t < tokens + nfixed; t++) {
        const int sealed = t < tokens;
        const float l = sealed ? logits[t] : tail[t - tokens];
        const double x = (double)l - max, a = sealed ? amax[t] : tmax[t - tokens];
        const double w = sealed ? wts[t] : expf(l - max);
        A += w * a;
        X += w * (fabs(x) + 1.0) * a;
        Xl += w * (fabs(x) + 1.0);
        if (sealed && !keep[t])
            skip += w * a;
    }
    const double u = 0x1p-24, rd = sqrt((double)d);
    A /= Z;
    X /= Z;
    Xl /= Z;
    const double rho = 4.0 * u * rd * ((4.0 * W + 16.0) * A + 4.0 * X + Xl * A);
    return (1.0 + 0x1p-20) * rd * skip / Z + rho;
}
