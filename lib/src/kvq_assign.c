/* KVQ toolbox: attention-weighted bit assignment (seed §3.1). Tokens the queries attend to most get
 * the higher bit width; the importance of a token is the largest softmax weight any (query, head)
 * pair gives it. */
#include <math.h>
#include <stdlib.h>

#include "codec_internal.h"
#include "kvq_internal.h"

typedef struct ranked {
    double w;
    size_t t;
} ranked;

/* descending weight, then ascending token (a total order: the choice is deterministic) */
static int cmp_ranked(const void *x, const void *y)
{
    const ranked *a = x, *b = y;
    if (a->w != b->w)
        return a->w > b->w ? -1 : 1;
    return a->t < b->t ? -1 : a->t > b->t;
}

int dq_kvq_assign_bits(const float *k, size_t tokens, uint32_t kv_heads, uint32_t head_dim, const float *q,
                       uint32_t q_heads, size_t nq, float frac_hi, uint8_t *tier)
{
    DQ_RETURN_IF(!k || !q || !tier || tokens == 0 || nq == 0, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(kv_heads == 0 || head_dim == 0 || q_heads == 0 || q_heads % kv_heads, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!(frac_hi >= 0.0f && frac_hi <= 1.0f), DQ_INVALID_ARGUMENT);
    const size_t kstride = (size_t)kv_heads * head_dim, qstride = (size_t)q_heads * head_dim;
    DQ_RETURN_IF(tokens > SIZE_MAX / sizeof(ranked) / kstride || nq > SIZE_MAX / sizeof(float) / qstride,
                 DQ_INVALID_ARGUMENT);
    for (size_t i = 0; i < tokens * kstride; i++)
        DQ_RETURN_IF(!isfinite(k[i]), DQ_NONFINITE);
    for (size_t i = 0; i < nq * qstride; i++)
        DQ_RETURN_IF(!isfinite(q[i]), DQ_NONFINITE);
    ranked *r = malloc(tokens * sizeof *r);
    double *logit = malloc(tokens * sizeof *logit);
    if (!r || !logit) {
        free(r);
        free(logit);
        return DQ_NOMEM;
    }
    for (size_t t = 0; t < tokens; t++)
        r[t] = (ranked){0.0, t};
    const uint32_t group = q_heads / kv_heads;
    const double scale = 1.0 / sqrt((double)head_dim);
    for (size_t iq = 0; iq < nq; iq++) {
        for (uint32_t h = 0; h < q_heads; h++) {
            const float *qh = q + iq * qstride + (size_t)h * head_dim;
            const size_t koff = (size_t)(h / group) * head_dim; /* GQA: the KV head of this query head */
            double mx = -INFINITY, sum = 0;
            for (size_t t = 0; t < tokens; t++) {
                const float *kt = k + t * kstride + koff;
                double s = 0;
                for (uint32_t j = 0; j < head_dim; j++)
                    s += (double)qh[j] * kt[j];
                logit[t] = s * scale;
                mx = fmax(mx, logit[t]);
            }
            for (size_t t = 0; t < tokens; t++) {
                logit[t] = exp(logit[t] - mx);
                sum += logit[t];
            }
            for (size_t t = 0; t < tokens; t++)
                r[t].w = fmax(r[t].w, logit[t] / sum);
        }
    }
    qsort(r, tokens, sizeof *r, cmp_ranked);
    const size_t n_hi = (size_t)floor((double)frac_hi * (double)tokens + 0.5);
    for (size_t i = 0; i < tokens; i++)
        tier[r[i].t] = i < n_hi;
    free(r);
    free(logit);
    return DQ_OK;
}
