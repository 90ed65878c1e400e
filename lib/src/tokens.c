/* Token blocks and windows: rotation, the INT8 key window mean, and record layout. */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "codec_internal.h"
#include "dsp.h"

/* Loads token t of x as floats and rotates it. Returns 0 or DQ_RANGE. */
static int load_rotated(const dq_codec *codec, const void *x, dq_dtype dtype, size_t t, float *y)
{
    const uint32_t n = codec->n;
    for (uint32_t j = 0; j < n; j++)
        y[j] = dq__load_elem(x, dtype, t * n + j);
    dq_rotate(codec, y);
    for (uint32_t j = 0; j < n; j++)
        if (!(fabsf(y[j]) <= DQ_TOKEN_MAX_ABS))
            return DQ_RANGE;
    return DQ_OK;
}

int dq__mean_compute(const dq_codec *codec, const float *y, size_t ntok, uint8_t *mean_block, float *sum)
{
    const uint32_t n = codec->n;
    int8_t *q = (int8_t *)(mean_block + 2);
    /* The sum per channel with the tokens added in order (as the GPU's window-mean kernel adds
     * them), accumulated token by token so that the loop runs over contiguous channels. */
    for (uint32_t j = 0; j < n; j++)
        sum[j] = 0.0f;
    for (size_t t = 0; t < ntok; t++) {
        const float *restrict yt = y + t * n;
        float *restrict st = sum;
        for (uint32_t j = 0; j < n; j++)
            st[j] += yt[j];
    }
    /* the mean's largest magnitude sets the scale, then each mean is quantized */
    float maxabs = 0;
    for (uint32_t j = 0; j < n; j++) {
        float a = fabsf(sum[j] / (float)ntok);
        if (a > maxabs)
            maxabs = a;
    }
    uint16_t sh = dq_f32_to_f16(maxabs / 127.0f);
    float sf = dq_f16_to_f32(sh);
    dq__put_u16(mean_block, sh);
    for (uint32_t j = 0; j < n; j++) {
        float m = sum[j] / (float)ntok;
        float r = sf > 0 ? rintf(m / sf) : 0.0f;
        if (r > 127.0f)
            r = 127.0f;
        if (r < -127.0f)
            r = -127.0f;
        q[j] = (int8_t)r;
    }
    return DQ_OK;
}

void dq__mean_dequant(const dq_codec *codec, const uint8_t *mean_block, float *mu)
{
    const float sf = dq_f16_to_f32(dq__get_u16(mean_block));
    const int8_t *q = (const int8_t *)(mean_block + 2);
    for (uint32_t j = 0; j < codec->n; j++)
        mu[j] = (float)q[j] * sf;
}

int dq_tokens_encode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype, size_t ntok,
                     uint8_t *mean, uint8_t *records, size_t record_stride, dq_encode_stats *stats)
{
    DQ_RETURN_IF(!codec || !ws || !dq__ws_fits(ws, codec) || !x || !records || (kind != DQ_KIND_K && kind != DQ_KIND_V),
                 DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    const uint32_t n = codec->n, W = codec->profile.window;
    DQ_RETURN_IF(record_stride < codec->record_bytes[kind], DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(kind == DQ_KIND_K && (!mean || ntok < 1 || ntok > W) && codec->mean_bytes, DQ_SHAPE);
    DQ_RETURN_IF(kind == DQ_KIND_V && mean, DQ_INVALID_ARGUMENT);
    if (codec->profile.codec_type == DQ_CODEC_KVQ)
        return dq__kvq_encode(codec, ws, kind, x, dtype, ntok, mean, records, record_stride);
    if (!dq__codec_has_levels(codec))
        return dq__baseline_encode(codec, ws, kind, x, dtype, ntok, mean, records, record_stride);
    DQ_FORWARD_IF_ERROR(dq_check_finite(x, dtype, ntok * n));

    float *y = ws->big;
    if (kind == DQ_KIND_K) {
        for (size_t t = 0; t < ntok; t++)
            DQ_FORWARD_IF_ERROR(load_rotated(codec, x, dtype, t, y + t * n));
        dq__mean_compute(codec, y, ntok, mean, ws->f1);
        float *mu = ws->f1;
        dq__mean_dequant(codec, mean, mu);
        for (size_t t = 0; t < ntok; t++) {
            float *yt = y + t * n;
            for (uint32_t j = 0; j < n; j++)
                yt[j] = yt[j] - mu[j];
            DQ_FORWARD_IF_ERROR(dq__stream_encode_ex(codec, ws, kind, yt, records + t * record_stride, stats, NULL));
        }
        return DQ_OK;
    }
    /* values: validate the whole range first, then encode. Up to a window of tokens stays rotated
     * in the window scratch; longer ranges are rotated again token by token. */
    const bool keep = ntok <= ws->big_len / n;
    for (size_t t = 0; t < ntok; t++)
        DQ_FORWARD_IF_ERROR(load_rotated(codec, x, dtype, t, keep ? y + t * n : ws->f1));
    for (size_t t = 0; t < ntok; t++) {
        float *yt = keep ? y + t * n : ws->f1;
        if (!keep)
            load_rotated(codec, x, dtype, t, yt);
        DQ_FORWARD_IF_ERROR(dq__stream_encode_ex(codec, ws, kind, yt, records + t * record_stride, stats, NULL));
    }
    return DQ_OK;
}

int dq_tokens_decode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const uint8_t *mean, const uint8_t *records,
                     size_t record_stride, size_t ntok, void *out, dq_dtype dtype)
{
    DQ_RETURN_IF(!codec || !ws || !dq__ws_fits(ws, codec) || !records || !out ||
                     (kind != DQ_KIND_K && kind != DQ_KIND_V),
                 DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    DQ_RETURN_IF(kind == DQ_KIND_K && !mean && codec->mean_bytes, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(record_stride < codec->record_bytes[kind], DQ_INVALID_ARGUMENT);
    if (codec->profile.codec_type == DQ_CODEC_KVQ)
        return dq__kvq_decode(codec, ws, kind, mean, records, record_stride, 0, ntok, out, dtype, 1);
    if (!dq__codec_has_levels(codec))
        return dq__baseline_decode(codec, ws, kind, mean, records, record_stride, ntok, out, dtype);
    const uint32_t n = codec->n, W = codec->profile.window;
    float *mu = ws->f1, *y = ws->f0;
    if (kind == DQ_KIND_K)
        dq__mean_dequant(codec, mean, mu);
    size_t corrupt = 0;
    for (size_t t0 = 0; t0 < ntok; t0 += W) {
        size_t cnt = ntok - t0 < W ? ntok - t0 : W;
        const uint8_t *rec0 = records + t0 * record_stride;
        corrupt += dq__levels_decode(codec, kind, rec0, record_stride, cnt, ws->levels);
        for (size_t t = 0; t < cnt; t++) {
            const uint8_t *rec = rec0 + t * record_stride;
            const float s = dq_f16_to_f32(dq__get_u16(rec)), o = dq_f16_to_f32(dq__get_u16(rec + 2));
            /* restrict: the levels are bytes, which the compiler would otherwise assume y aliases */
            const uint8_t *restrict lev = ws->levels + t * n;
            float *restrict yt = y;
            if (kind == DQ_KIND_K) {
                const float *restrict mt = mu;
                for (uint32_t j = 0; j < n; j++)
                    yt[j] = (o + s * (float)lev[j]) + mt[j];
            } else {
                for (uint32_t j = 0; j < n; j++)
                    yt[j] = o + s * (float)lev[j];
            }
            dq_unrotate(codec, y);
            size_t base = (t0 + t) * n;
            if (dtype == DQ_DTYPE_F32) {
                memcpy((float *)out + base, y, n * sizeof(float));
            } else if (dtype == DQ_DTYPE_BF16) {
                uint16_t *restrict ob = (uint16_t *)out + base;
                for (uint32_t j = 0; j < n; j++)
                    ob[j] = dq__f32_bf16(yt[j]);
            } else {
                for (uint32_t j = 0; j < n; j++)
                    dq__store_elem(out, dtype, base + j, y[j]);
            }
        }
    }
    return corrupt ? DQ_CORRUPT : DQ_OK;
}

const uint8_t *dq_window_mean(const dq_codec *codec, const uint8_t *window)
{
    (void)codec;
    return window;
}

const uint8_t *dq_window_record(const dq_codec *codec, const uint8_t *window, dq_kind kind, size_t t)
{
    const size_t W = codec->profile.window;
    size_t off = codec->mean_bytes;
    if (kind == DQ_KIND_V)
        off += W * codec->record_bytes[0];
    return window + off + t * codec->record_bytes[kind == DQ_KIND_V];
}

int dq_window_encode(const dq_codec *codec, dq_workspace *ws, const void *k, const void *v, dq_dtype dtype,
                     uint8_t *window, dq_encode_stats *stats)
{
    DQ_RETURN_IF(!codec || !ws || !k || !v || !window, DQ_INVALID_ARGUMENT);
    const size_t W = codec->profile.window;
    DQ_FORWARD_IF_ERROR(dq_check_finite(v, dtype, W * codec->n));
    uint8_t *krec = (uint8_t *)dq_window_record(codec, window, DQ_KIND_K, 0);
    uint8_t *vrec = (uint8_t *)dq_window_record(codec, window, DQ_KIND_V, 0);
    DQ_FORWARD_IF_ERROR(
        dq_tokens_encode(codec, ws, DQ_KIND_K, k, dtype, W, window, krec, codec->record_bytes[0], stats));
    return dq_tokens_encode(codec, ws, DQ_KIND_V, v, dtype, W, NULL, vrec, codec->record_bytes[1], stats);
}
