/* One stream: FitMinMax → Drift → Refit → fp16 s, o → Drift → rANS, with the length check that
 * makes every stream fit its container (seed Algorithm 1, DESIGN §2.4). */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "drift.h"

#define DQ_MAX_RETRIES 8

/* Drift statistics: how many values sit off their nearest grid level rintf((x - o) / s) clamped
 * to [0, M - 1], and by how many levels at most. Without branches or a call per value, so that the
 * loop vectorizes: the quotient is clamped to [-1, M] first (each end rounds and clamps as
 * before), then rounded to nearest even by adding and subtracting 1.5 · 2^23. */
static void count_moves(const float *x, const uint8_t *lev, uint32_t n, float s, float o, uint32_t M, uint64_t *moved,
                        uint32_t *max_move)
{
    uint32_t cnt = 0, mx = 0;
    const float top = (float)(M - 1), hi = (float)M;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t nl = 0;
        if (s > 0) {
            /* comparisons, not fminf/fmaxf: those are calls without -ffinite-math-only */
            float v = (x[i] - o) / s;
            v = v < -1.0f ? -1.0f : v > hi ? hi : v;
            float u = (v + 0x1.8p23f) - 0x1.8p23f;
            u = u < 0.0f ? 0.0f : u > top ? top : u;
            nl = (uint32_t)u;
        }
        const uint32_t mv = nl > lev[i] ? nl - lev[i] : lev[i] - nl;
        cnt += mv != 0;
        mx = mv > mx ? mv : mx;
    }
    *moved += cnt;
    if (mx > *max_move)
        *max_move = mx;
}

/* The all-cheapest assignment: the cheapest level (version 2: the cheapest pair) everywhere. */
static void fill_cheapest(const dq__kind_tables *kt, uint8_t *lev, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        lev[i] = (uint8_t)kt->cheap[i & 1u];
}

int dq__stream_encode_ex(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const float *x, uint8_t *record,
                         dq_encode_stats *stats, uint8_t *levels_out)
{
    DQ_RETURN_IF(!codec || !ws || !x || !record || (kind != DQ_KIND_K && kind != DQ_KIND_V) || ws->codec != codec,
                 DQ_INVALID_ARGUMENT);
    if (codec->profile.codec_type == DQ_CODEC_FIXED)
        return dq__fixed_stream_encode(codec, kind, x, record, stats, levels_out);
    DQ_RETURN_IF(codec->profile.codec_type != DQ_CODEC_DQUANT, DQ_UNSUPPORTED);
    const dq__kind_tables *kt = &codec->kt[kind];
    const uint32_t n = codec->n, M = kt->levels, C = kt->container;
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return DQ_NONFINITE;

    float *xs = ws->f0;
    uint8_t *lev = ws->b0;
    dq__sort_floats(x, n, xs, ws->u0);
    const float xmin = xs[0], xmax = xs[n - 1];
    DQ_RETURN_IF(!(fabsf(xmin) <= DQ_STREAM_MAX_ABS) || !(fabsf(xmax) <= DQ_STREAM_MAX_ABS), DQ_RANGE);

    /* FitMinMax */
    float s = (xmax - xmin) / (float)(M - 1);
    float o = xmin;
    int64_t budget = (int64_t)kt->budget_q16;
    uint16_t sh, oh;
    if (s > 0) {
        dq__drift(kt, x, xs, n, s, o, budget, lev);
        double ds = s, dof = o;
        dq__refit(x, lev, n, &ds, &dof);
        sh = dq_f64_to_f16(ds);
        oh = dq_f64_to_f16(dof);
        if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
            /* a degenerate refit outside fp16: the min–max grid always fits (|x| <= 30000) */
            sh = dq_f64_to_f16((double)s);
            oh = dq_f64_to_f16((double)o);
        }
    } else {
        sh = 0;
        oh = dq_f64_to_f16((double)xmin);
    }
    DQ_RETURN_IF((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u, DQ_RANGE);
    sh &= 0x7fffu; /* s >= 0; never store -0 */
    const float sf = dq_f16_to_f32(sh), of = dq_f16_to_f32(oh);

    uint32_t retries = 0, used = 0;
    int fallback = 0;
    for (;;) {
        int feasible;
        if (sf > 0) {
            dq__drift_result r = dq__drift(kt, x, xs, n, sf, of, budget, lev);
            feasible = r.feasible;
        } else {
            feasible = 0;
        }
        if (!feasible) {
            fill_cheapest(kt, lev, n);
            fallback = sf > 0; /* s = 0: the cheapest level is the exact answer, not a fallback */
        }
        used = dq__kt_encode(kt, lev, n, ws->b1, record + 4);
        if (used <= C)
            break;
        if (!feasible || retries >= DQ_MAX_RETRIES) {
            /* Profile validation guarantees the all-cheapest assignment fits. */
            fill_cheapest(kt, lev, n);
            used = dq__kt_encode(kt, lev, n, ws->b1, record + 4);
            fallback = 1;
            DQ_RETURN_IF(used > C, DQ_INTERNAL);
            break;
        }
        retries++;
        budget -= ((int64_t)(used - C) * 8 + 8 * (int64_t)retries) << 16;
    }
    assert(used >= DQ_RANS_STATE_BYTES && used <= C); /* every stream fits its container */
    dq__put_u16(record, sh);
    dq__put_u16(record + 2, oh);
    if (levels_out)
        memcpy(levels_out, lev, n);
    if (stats) {
        stats->streams++;
        stats->retries += retries > 0;
        stats->fallbacks += (uint64_t)fallback;
        stats->payload_bytes += used;
        if (used > stats->max_payload_bytes)
            stats->max_payload_bytes = used;
        count_moves(x, lev, n, sf, of, M, &stats->symbols_moved, &stats->max_move);
    }
    return DQ_OK;
}

int dq_stream_encode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const float *y, uint8_t *record,
                     dq_encode_stats *stats)
{
    return dq__stream_encode_ex(codec, ws, kind, y, record, stats, NULL);
}

int dq_stream_decode_levels(const dq_codec *codec, dq_kind kind, const uint8_t *record, uint8_t *levels)
{
    DQ_RETURN_IF(!codec || !record || !levels || (kind != DQ_KIND_K && kind != DQ_KIND_V), DQ_INVALID_ARGUMENT);
    if (codec->profile.codec_type == DQ_CODEC_FIXED)
        return dq__fixed_unpack(codec, kind, record + 4, levels);
    DQ_RETURN_IF(codec->profile.codec_type != DQ_CODEC_DQUANT, DQ_UNSUPPORTED);
    const dq__kind_tables *kt = &codec->kt[kind];
    return dq__kt_decode(kt, record + 4, codec->n, levels);
}

int dq_stream_decode(const dq_codec *codec, dq_kind kind, const uint8_t *record, float *y)
{
    DQ_RETURN_IF(!codec || !record || !y || (kind != DQ_KIND_K && kind != DQ_KIND_V), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(codec), DQ_UNSUPPORTED);
    const uint32_t n = codec->n;
    /* Decode levels into the tail of y's own storage would alias; decode symbol by symbol. */
    uint8_t buf[256];
    const float s = dq_f16_to_f32(dq__get_u16(record)), o = dq_f16_to_f32(dq__get_u16(record + 2));
    int rc = DQ_OK;
    if (n <= sizeof buf) {
        rc = dq_stream_decode_levels(codec, kind, record, buf);
        for (uint32_t i = 0; i < n; i++)
            y[i] = o + s * (float)buf[i];
        return rc;
    }
    /* Large streams: levels into the float buffer's bytes first, then expand back to front. */
    uint8_t *lev = (uint8_t *)y;
    rc = dq_stream_decode_levels(codec, kind, record, lev);
    for (uint32_t i = n; i-- > 0;)
        y[i] = o + s * (float)lev[i];
    return rc;
}
