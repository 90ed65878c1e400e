/* Fixed-width min–max coding with D-Quant's preprocessing, at matched storage (fixedwidth.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "dquant/types.h"
#include "fixedwidth.h"

uint32_t fixedwidth_levels(const dq_profile *p, dq_kind kind)
{
    const double n = (double)p->kv_heads * p->head_dim;
    const double rate = 8.0 * p->container_bytes[kind] / n;
    if (rate >= 8.0)
        return 256;
    /* 2^rate is exact when rate is an integer; otherwise floor is far from any boundary */
    const uint32_t m = (uint32_t)floor(exp2(rate));
    return m < 2 ? 0 : m;
}

double fixedwidth_bits_per_value(const dq_profile *p, dq_kind kind)
{
    const double n = (double)p->kv_heads * p->head_dim;
    const uint32_t m = fixedwidth_levels(p, kind);
    double bits = (m ? log2((double)m) : 0.0) + 32.0 / n;
    if (kind == DQ_KIND_K)
        bits += 8.0 * (2.0 + n) / (n * p->window);
    return bits;
}

/* Mirrors lib/src/tokens.c: per channel the float sum of the tokens in order divided by the count,
 * one fp16 scale max|mean|/127, means rounded to int8 in [-127, 127]. */
void fixedwidth_window_mean(const float *y, size_t ntok, uint32_t n, uint8_t *block)
{
    float maxabs = 0;
    for (uint32_t j = 0; j < n; j++) {
        float sum = 0;
        for (size_t t = 0; t < ntok; t++)
            sum += y[t * n + j];
        const float a = fabsf(sum / (float)ntok);
        if (a > maxabs)
            maxabs = a;
    }
    const uint16_t sh = dq_f32_to_f16(maxabs / 127.0f);
    const float sf = dq_f16_to_f32(sh);
    block[0] = (uint8_t)sh;
    block[1] = (uint8_t)(sh >> 8);
    for (uint32_t j = 0; j < n; j++) {
        float sum = 0;
        for (size_t t = 0; t < ntok; t++)
            sum += y[t * n + j];
        float r = sf > 0 ? rintf(sum / (float)ntok / sf) : 0.0f;
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        block[2 + j] = (uint8_t)(int8_t)r;
    }
}

static void mean_dequant(const uint8_t *block, uint32_t n, float *mu)
{
    const float sf = dq_f16_to_f32((uint16_t)(block[0] | block[1] << 8));
    for (uint32_t j = 0; j < n; j++)
        mu[j] = (float)(int8_t)block[2 + j] * sf;
}

static float to_half(double v)
{
    return dq_f16_to_f32(dq_f64_to_f16(v));
}

static void assign_nearest(const float *y, uint32_t n, double s, double o, uint32_t top, uint8_t *m)
{
    for (uint32_t i = 0; i < n; i++) {
        double q = s > 0 ? nearbyint(((double)y[i] - o) / s) : 0.0;
        m[i] = (uint8_t)(q < 0 ? 0 : q > top ? top : q);
    }
}

/* One stream y[n] on M levels: min–max grid, nearest, least-squares refit, fp16, nearest again.
 * Writes the reconstruction o + s·m (as the decoder would compute it, in float). */
static void code_stream(const float *y, uint32_t n, uint32_t M, uint8_t *m, float *yhat)
{
    float lo = y[0], hi = y[0];
    for (uint32_t i = 1; i < n; i++) {
        lo = fminf(lo, y[i]);
        hi = fmaxf(hi, y[i]);
    }
    const uint32_t top = M - 1;
    double s = ((double)hi - lo) / top, o = lo;
    assign_nearest(y, n, s, o, top, m);
    double sm = 0, sy = 0, smm = 0, smy = 0;
    for (uint32_t i = 0; i < n; i++) {
        sm += m[i];
        sy += y[i];
        smm += (double)m[i] * m[i];
        smy += (double)m[i] * y[i];
    }
    const double var = smm - sm * sm / n;
    if (var > 0) {
        s = (smy - sm * sy / n) / var;
        o = (sy - s * sm) / n;
    } else {
        s = 0;
        o = sy / n;
    }
    const float sh = to_half(s), oh = to_half(o);
    assign_nearest(y, n, sh, oh, top, m);
    for (uint32_t i = 0; i < n; i++)
        yhat[i] = oh + sh * (float)m[i];
}

int fixedwidth_roundtrip(const dq_profile *p, dq_kind kind, const float *x, size_t ntok, float *xhat)
{
    if (!p || !x || !xhat || p->codec_type != DQ_CODEC_DQUANT || (kind != DQ_KIND_K && kind != DQ_KIND_V))
        return DQ_PROFILE;
    const uint32_t M = fixedwidth_levels(p, kind);
    if (M < 2)
        return DQ_PROFILE;
    if (dq_check_finite(x, DQ_DTYPE_F32, ntok * (size_t)p->kv_heads * p->head_dim) != DQ_OK)
        return DQ_NONFINITE;
    dq_codec *c = NULL;
    int rc = dq_codec_create(p, NULL, &c);
    if (rc != DQ_OK)
        return rc;
    const uint32_t n = dq_codec_stream_len(c), W = p->window;
    float *y = malloc((size_t)W * n * sizeof *y), *mu = calloc(n, sizeof *mu);
    uint8_t *m = malloc(n), *block = malloc(2 + (size_t)n);
    if (!y || !mu || !m || !block) {
        rc = DQ_NOMEM;
        goto out;
    }
    for (size_t first = 0; first < ntok; first += W) {
        const size_t cnt = ntok - first < W ? ntok - first : W;
        memcpy(y, x + first * n, cnt * n * sizeof *y);
        for (size_t t = 0; t < cnt; t++)
            dq_rotate(c, y + t * n);
        if (kind == DQ_KIND_K) {
            fixedwidth_window_mean(y, cnt, n, block);
            mean_dequant(block, n, mu);
        }
        for (size_t t = 0; t < cnt; t++) {
            float *yt = y + t * n, *out = xhat + (first + t) * n;
            for (uint32_t j = 0; j < n; j++)
                yt[j] -= mu[j];
            code_stream(yt, n, M, m, out);
            for (uint32_t j = 0; j < n; j++)
                out[j] += mu[j];
            dq_unrotate(c, out);
        }
    }
out:
    free(y);
    free(mu);
    free(m);
    free(block);
    dq_codec_free(c);
    return rc;
}
