/* Decode attention on the containers (DESIGN §2.7, seed Appendix A).
 *
 * Token-centric: a window's K streams are decoded once (all KV heads at a time) and their levels
 * feed the dot products of every query head of the group directly:
 *     q'·k̂_t = s_t·Σ_j q'_j m_{t,j} + o_t·Σ_j q'_j + Σ_j q'_j μ_j
 * then the V streams, with the scale folded into the attention weight and the offset accumulated
 * on the side:  Σ_t a_t v̂_t = Σ_t (a_t s_t) m_t + (Σ_t a_t o_t)·1.
 * The accumulator lives in the rotated domain and is un-rotated once per head; the BF16 tail is then
 * attended exactly in the original domain with the same running max and sum (online softmax). */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/attention.h"
#include "dquant/hot.h"
#include "dquant/vskip.h"
#include "dsp.h"
#include "vskip_internal.h"

/* dq_layer is opaque even inside the library; attention reads it through the public accessors. */

typedef struct attn_state {
    uint32_t qn, d, W;
    float *qr;                    /* [qn][d] rotated queries */
    float *accw;                  /* [qn][d] one window's contribution, float */
    double *acc;                  /* [qn][d] running accumulator */
    float *logit;                 /* [qn][W] logits, then weights */
    double *l, *off;              /* [qn] running sum of weights, running Σ a·(o + s·c) */
    float *m, *qsum, *qmu, *offw; /* [qn] */
} attn_state;

static void state_layout(attn_state *st, float *base, uint32_t qn, uint32_t d, uint32_t W)
{
    st->qn = qn;
    st->d = d;
    st->W = W;
    st->acc = (double *)(void *)base;
    st->l = st->acc + (size_t)qn * d;
    st->off = st->l + qn;
    float *f = (float *)(void *)(st->off + qn);
    st->qr = f;
    st->accw = st->qr + (size_t)qn * d;
    st->logit = st->accw + (size_t)qn * d;
    st->m = st->logit + (size_t)qn * W;
    st->qsum = st->m + qn;
    st->qmu = st->qsum + qn;
    st->offw = st->qmu + qn;
}

/* Softmax bookkeeping for one block of cnt logits per head: rescale the running state to the new
 * max and turn the block's logits into weights. */
static void softmax_block(attn_state *st, uint32_t cnt)
{
    for (uint32_t h = 0; h < st->qn; h++) {
        float *lg = st->logit + (size_t)h * st->W;
        float mb = -INFINITY;
        for (uint32_t t = 0; t < cnt; t++)
            mb = fmaxf(mb, lg[t]);
        float mnew = fmaxf(st->m[h], mb);
        if (mnew > st->m[h]) {
            double alpha = st->m[h] == -INFINITY ? 0.0 : exp((double)st->m[h] - (double)mnew);
            st->l[h] *= alpha;
            st->off[h] *= alpha;
            double *acc = st->acc + (size_t)h * st->d;
            for (uint32_t j = 0; j < st->d; j++)
                acc[j] *= alpha;
            st->m[h] = mnew;
        }
        float sum = 0;
        for (uint32_t t = 0; t < cnt; t++) {
            float p = expf(lg[t] - mnew);
            lg[t] = p;
            sum += p;
        }
        st->l[h] += sum;
    }
}

/* Where a layer's sealed windows and tail come from: window records (layer) or hot windows (hot,
 * dquant/hot.h); both give the same levels, scales and means, so the same computation. */
typedef struct attn_src {
    const dq_layer *layer; /* NULL: hot windows */
    const uint8_t *const *hot;
    size_t nwin;
    const uint16_t *tk, *tv;
    size_t T;
} attn_src;

/* The levels of one kind of window w into ws->levels ([W][n]): every token's, or where keep
 * (W flags; may be NULL) is set only those tokens', in the rows 0, 1, ... in token order (records:
 * through gather, room for W records of the kind); returns the first token's (fp16 s, fp16 o)
 * pair, *stride the bytes from one token's pair to the next. */
static const uint8_t *window_levels(const dq_codec *c, dq_workspace *ws, const dq__dsp *dsp, const attn_src *src,
                                    size_t w, dq_kind kind, const uint8_t *keep, uint8_t *gather, size_t *stride)
{
    const uint32_t n = c->n, W = c->profile.window;
    (void)dsp;
    if (src->layer) {
        const uint8_t *rec = dq_window_record(c, dq_layer_window(src->layer, w), kind, 0);
        const size_t rb = c->record_bytes[kind];
        if (!keep) {
            /* the window's records into the cache ahead of the decoder, which reads many streams
             * at once (scattered lines the hardware prefetcher does not follow) */
            for (size_t b = 0; b < (size_t)W * rb; b += 64)
                __builtin_prefetch(rec + b);
            dq__levels_decode(c, kind, rec, rb, W, ws->levels);
        } else {
            /* the kept records side by side, decoded in one call (the decoder runs many streams
             * at once) */
            uint32_t k = 0;
            for (uint32_t t = 0; t < W; t++)
                if (keep[t])
                    memcpy(gather + (size_t)k++ * rb, rec + (size_t)t * rb, rb);
            dq__levels_decode(c, kind, gather, rb, k, ws->levels);
        }
        *stride = rb;
        return rec;
    }
    size_t off[4];
    dq_hot_offsets(c, off);
    for (uint32_t t = 0, k = 0; t < W; t++)
        if (!keep || keep[t])
            dq_hot_levels(c, src->hot[w], kind, t, ws->levels + (size_t)k++ * n);
    *stride = 4;
    return src->hot[w] + off[kind];
}

/* The logits of window w for nh query heads (from qh0; rotated queries qr[nh][d] with their sums
 * qsum[nh]) into logit[h·ldl + t]; qmu[nh] is scratch (each head's q'·μ). */
static void window_logits(const dq_codec *c, dq_workspace *ws, const dq__dsp *dsp, const attn_src *src, size_t w,
                          const float *qr, const float *qsum, float *qmu, uint32_t nh, uint32_t qh0, uint32_t G,
                          float scale, float *logit, size_t ldl)
{
    const uint32_t n = c->n, d = c->head_dim, W = c->profile.window;
    /* levels are centered on the middle of the grid: m - c with c = (M - 1)/2 (exact in float) */
    const float ck = 0.5f * (float)(c->kt[DQ_KIND_K].levels - 1);
    float *mu = ws->f1;
    /* the key-mean block heads both a window record and a hot window */
    dq__mean_dequant(c, src->layer ? dq_window_mean(c, dq_layer_window(src->layer, w)) : src->hot[w], mu);
    for (uint32_t h = 0; h < nh; h++) {
        uint32_t kv = (qh0 + h) / G;
        float s = 0;
        const float *q = qr + (size_t)h * d;
        for (uint32_t j = 0; j < d; j++)
            s += q[j] * mu[kv * d + j];
        qmu[h] = s;
    }
    size_t stride;
    const uint8_t *krec = window_levels(c, ws, dsp, src, w, DQ_KIND_K, NULL, NULL, &stride);
    for (uint32_t t = 0; t < W; t++) {
        const uint8_t *rec = krec + (size_t)t * stride;
        const float s = dq_f16_to_f32(dq__get_u16(rec)), o = dq_f16_to_f32(dq__get_u16(rec + 2));
        const float mid = o + s * ck;
        const uint8_t *lev = ws->levels + (size_t)t * n;
        for (uint32_t h = 0; h < nh; h++) {
            uint32_t kv = (qh0 + h) / G;
            float dot = dsp->dot_u8(qr + (size_t)h * d, lev + (size_t)kv * d, d, ck);
            logit[(size_t)h * ldl + t] = scale * (s * dot + mid * qsum[h] + qmu[h]);
        }
    }
}

/* The sealed windows into the state. pre (may be NULL): the softmax weights already computed for
 * every query head against the state's max (its m), [q_heads][pre_ld], window w's at column w·W;
 * else each window's keys are scored here. keep (may be NULL): the sealed tokens whose values are attended (dquant/vskip.h), gather
 * then room for W value records; a window with none is not decoded at all. */
static void attend_windows(const dq_codec *c, dq_workspace *ws, const dq__dsp *dsp, const attn_src *src, attn_state *st,
                           uint32_t qh0, uint32_t G, float scale, const float *pre, size_t pre_ld, const uint8_t *keep,
                           uint8_t *gather)
{
    const uint32_t n = c->n, d = c->head_dim, W = c->profile.window;
    /* levels are centered on the middle of the grid: m - c with c = (M - 1)/2 (exact in float) */
    const float cv = 0.5f * (float)(c->kt[DQ_KIND_V].levels - 1);
    for (size_t w = 0; w < src->nwin; w++) {
        if (pre) {
            /* softmax_block's weights and sum when every head's max is known already */
            for (uint32_t h = 0; h < st->qn; h++) {
                float *lg = st->logit + (size_t)h * W, sum = 0;
                memcpy(lg, pre + (size_t)(qh0 + h) * pre_ld + w * W, sizeof(float) * W);
                for (uint32_t t = 0; t < W; t++)
                    sum += lg[t];
                st->l[h] += sum;
            }
        } else {
            window_logits(c, ws, dsp, src, w, st->qr, st->qsum, st->qmu, st->qn, qh0, G, scale, st->logit, W);
            softmax_block(st, W);
        }
        const uint8_t *kw = keep ? keep + w * W : NULL;
        if (kw && !memchr(kw, 1, W))
            continue;
        memset(st->accw, 0, sizeof(float) * st->qn * d);
        memset(st->offw, 0, sizeof(float) * st->qn);
        size_t stride;
        const uint8_t *vrec = window_levels(c, ws, dsp, src, w, DQ_KIND_V, kw, gather, &stride);
        for (uint32_t t = 0, k = 0; t < W; t++) {
            if (kw && !kw[t])
                continue;
            const uint8_t *rec = vrec + (size_t)t * stride;
            const float s = dq_f16_to_f32(dq__get_u16(rec)), o = dq_f16_to_f32(dq__get_u16(rec + 2));
            const float mid = o + s * cv;
            const uint8_t *lev = ws->levels + (size_t)k++ * n;
            for (uint32_t h = 0; h < st->qn; h++) {
                uint32_t kv = (qh0 + h) / G;
                float p = st->logit[(size_t)h * W + t];
                dsp->axpy_u8(st->accw + (size_t)h * d, p * s, lev + (size_t)kv * d, d, cv);
                st->offw[h] += p * mid;
            }
        }
        for (uint32_t h = 0; h < st->qn; h++) {
            double *acc = st->acc + (size_t)h * d;
            const float *aw = st->accw + (size_t)h * d;
            for (uint32_t j = 0; j < d; j++)
                acc[j] += aw[j];
            st->off[h] += st->offw[h];
        }
    }
}

static void fwht_d(double *x, uint32_t len)
{
    for (uint32_t h = 1; h < len; h <<= 1)
        for (uint32_t i = 0; i < len; i += h << 1)
            for (uint32_t j = i; j < i + h; j++) {
                double a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
}

/* Un-rotates the accumulators of query heads [qh0, qh0 + qn) (kv head of each) in place. */
static void unrotate_acc(const dq_codec *c, attn_state *st, uint32_t qh0, uint32_t G)
{
    const uint32_t d = c->head_dim;
    const double scale = 1.0 / sqrt((double)d);
    for (uint32_t h = 0; h < st->qn; h++) {
        uint32_t kv = (qh0 + h) / G;
        double *acc = st->acc + (size_t)h * d;
        for (uint32_t j = 0; j < d; j++)
            acc[j] += st->off[h];
        st->off[h] = 0;
        fwht_d(acc, d);
        for (uint32_t j = 0; j < d; j++)
            acc[j] *= c->signs ? scale * c->signs[kv * d + j] : scale;
    }
}

/* The BF16 tail, exactly, in blocks of W tokens (each block's weighted values summed in float, then
 * into the double accumulator, as attend_windows does per window). */
static void attend_tail(const dq_codec *c, const dq__dsp *dsp, const attn_src *src, attn_state *st, const float *q,
                        uint32_t qh0, uint32_t G, float scale)
{
    const uint32_t n = c->n, d = c->head_dim, W = st->W;
    const size_t T = src->T;
    const uint16_t *tk = src->tk, *tv = src->tv;
    for (size_t t0 = 0; t0 < T; t0 += W) {
        uint32_t cnt = (uint32_t)(T - t0 < W ? T - t0 : W);
        for (uint32_t t = 0; t < cnt; t++) {
            const uint16_t *k = tk + (t0 + t) * n;
            for (uint32_t h = 0; h < st->qn; h++) {
                uint32_t kv = (qh0 + h) / G;
                st->logit[(size_t)h * W + t] = scale * dsp->dot_bf16(q + (size_t)(qh0 + h) * d, k + (size_t)kv * d, d);
            }
        }
        softmax_block(st, cnt);
        memset(st->accw, 0, sizeof(float) * st->qn * d);
        for (uint32_t t = 0; t < cnt; t++) {
            const uint16_t *v = tv + (t0 + t) * n;
            for (uint32_t h = 0; h < st->qn; h++) {
                uint32_t kv = (qh0 + h) / G;
                dsp->axpy_bf16(st->accw + (size_t)h * d, st->logit[(size_t)h * W + t], v + (size_t)kv * d, d);
            }
        }
        for (uint32_t h = 0; h < st->qn; h++) {
            double *acc = st->acc + (size_t)h * d;
            const float *aw = st->accw + (size_t)h * d;
            for (uint32_t j = 0; j < d; j++)
                acc[j] += aw[j];
        }
    }
}

/* Baseline codecs: decode each window to floats (original domain), then exact attention. */
static int attend_decoded_windows(const dq_codec *c, dq_workspace *ws, const dq_layer *layer, attn_state *st,
                                  const float *q, uint32_t qh0, uint32_t G, float scale, float *blk)
{
    const uint32_t n = c->n, d = c->head_dim, W = c->profile.window;
    const size_t nwin = dq_layer_window_count(layer);
    for (size_t w = 0; w < nwin; w++) {
        const uint8_t *win = dq_layer_window(layer, w);
        DQ_FORWARD_IF_ERROR(dq_tokens_decode(c, ws, DQ_KIND_K, c->mean_bytes ? dq_window_mean(c, win) : NULL,
                                             dq_window_record(c, win, DQ_KIND_K, 0), c->record_bytes[0], W, blk,
                                             DQ_DTYPE_F32));
        for (uint32_t t = 0; t < W; t++)
            for (uint32_t h = 0; h < st->qn; h++) {
                const float *qq = q + (size_t)(qh0 + h) * d, *kk = blk + (size_t)t * n + (size_t)((qh0 + h) / G) * d;
                float s = 0;
                for (uint32_t j = 0; j < d; j++)
                    s += qq[j] * kk[j];
                st->logit[(size_t)h * W + t] = scale * s;
            }
        softmax_block(st, W);
        DQ_FORWARD_IF_ERROR(dq_tokens_decode(c, ws, DQ_KIND_V, NULL, dq_window_record(c, win, DQ_KIND_V, 0),
                                             c->record_bytes[1], W, blk, DQ_DTYPE_F32));
        for (uint32_t t = 0; t < W; t++)
            for (uint32_t h = 0; h < st->qn; h++) {
                double p = st->logit[(size_t)h * W + t];
                double *acc = st->acc + (size_t)h * d;
                const float *vv = blk + (size_t)t * n + (size_t)((qh0 + h) / G) * d;
                for (uint32_t j = 0; j < d; j++)
                    acc[j] += p * vv[j];
            }
    }
    return DQ_OK;
}

/* KVQ codecs: logits per window from dq__kvq_window_logits (PQ lookup tables, the factored
 * low-rank term), values decoded. c is the item's layer's codec (a per-layer view). */
static int attend_kvq_windows(const dq_codec *c, dq_workspace *ws, const dq_layer *layer, attn_state *st,
                              const float *q, uint32_t qh0, uint32_t G, float scale, float *blk)
{
    const uint32_t n = c->n, d = c->head_dim, W = c->profile.window;
    const size_t nwin = dq_layer_window_count(layer);
    for (size_t w = 0; w < nwin; w++) {
        const uint8_t *win = dq_layer_window(layer, w);
        DQ_FORWARD_IF_ERROR(dq__kvq_window_logits(c, ws, win, q, qh0, st->qn, G, scale, st->logit, W));
        softmax_block(st, W);
        DQ_FORWARD_IF_ERROR(dq__kvq_decode(c, ws, DQ_KIND_V, NULL, dq_window_record(c, win, DQ_KIND_V, 0),
                                           c->record_bytes[1], 0, W, blk, DQ_DTYPE_F32, 1));
        for (uint32_t t = 0; t < W; t++)
            for (uint32_t h = 0; h < st->qn; h++) {
                double p = st->logit[(size_t)h * W + t];
                double *acc = st->acc + (size_t)h * d;
                const float *vv = blk + (size_t)t * n + (size_t)((qh0 + h) / G) * d;
                for (uint32_t j = 0; j < d; j++)
                    acc[j] += p * vv[j];
            }
    }
    return DQ_OK;
}

int dq_attend_check_query(const float *q, uint32_t q_heads, uint32_t head_dim, float scale, uint32_t *bad_head,
                          double *norm)
{
    DQ_RETURN_IF(!q || !q_heads || !head_dim, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!isfinite(scale), DQ_INVALID_ARGUMENT);
    const double s = fabs((double)scale) > 1.0 ? fabs((double)scale) : 1.0, root_d = sqrt((double)head_dim);
    int64_t nonfinite = -1, range = -1;
    double range_norm = 0;
    for (uint32_t h = 0; h < q_heads; h++) {
        const float *qh = q + (size_t)h * head_dim;
        /* The largest |q_j| as its bits (an integer max vectorizes where a float one may not);
         * at or above the exponent of infinity it is NaN or Inf. */
        int32_t mb = 0;
        for (uint32_t j = 0; j < head_dim; j++) {
            int32_t b;
            memcpy(&b, &qh[j], sizeof b);
            b &= 0x7fffffff;
            mb = b > mb ? b : mb;
        }
        if (mb >= 0x7f800000) {
            nonfinite = h;
            break; /* NaN/Inf wins over any range error */
        }
        if (range >= 0)
            continue;
        float mx;
        memcpy(&mx, &mb, sizeof mx);
        /* ‖q_h‖₂ <= sqrt(d)·max|q_j|: the exact norm only when that bound is over the limit, in
         * double (a sum of squares of finite floats cannot overflow there) */
        if ((double)mx * root_d * s <= DQ_ATTEND_QUERY_MAX)
            continue;
        double ss = 0;
        for (uint32_t j = 0; j < head_dim; j++)
            ss += (double)qh[j] * (double)qh[j];
        const double x = sqrt(ss) * s;
        if (!(x <= DQ_ATTEND_QUERY_MAX)) {
            range = h;
            range_norm = x;
        }
    }
    if (nonfinite >= 0 || range >= 0) {
        if (bad_head)
            *bad_head = (uint32_t)(nonfinite >= 0 ? nonfinite : range);
        if (norm)
            *norm = nonfinite >= 0 ? INFINITY : range_norm;
        return nonfinite >= 0 ? DQ_NONFINITE : DQ_RANGE;
    }
    return DQ_OK;
}

static int check_items(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, const dq_attn_item *items,
                       size_t nitems)
{
    DQ_RETURN_IF(!c || !ws || !dq__ws_fits(ws, c) || (nitems && !items), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!q_heads || q_heads % c->profile.kv_heads, DQ_SHAPE);
    DQ_RETURN_IF(!isfinite(scale), DQ_INVALID_ARGUMENT);
    int rc = DQ_OK;
    for (size_t i = 0; i < nitems; i++) {
        DQ_RETURN_IF(!items[i].layer || !items[i].q || !items[i].out, DQ_INVALID_ARGUMENT);
        /* a layer of this codec or of another view of its root (per-layer calibration) */
        const dq_codec *lc = dq__layer_codec(items[i].layer);
        DQ_RETURN_IF(lc != c && lc->root != c->root, DQ_INVALID_ARGUMENT);
        int r = dq_attend_check_query(items[i].q, q_heads, c->head_dim, scale, NULL, NULL);
        DQ_RETURN_IF(r == DQ_NONFINITE, r); /* NaN/Inf anywhere in the batch wins over a range error */
        if (r < 0 && rc == DQ_OK)
            rc = r;
    }
    return rc;
}

/* Whether one head's result is finite (an empty layer's lse, -inf, is). */
static bool head_finite(const float *out, float lse, double l, uint32_t d)
{
    for (uint32_t j = 0; j < d; j++)
        if (!isfinite(out[j]))
            return false;
    return l > 0 ? isfinite(lse) : true;
}

/* The rotated query of a head reading KV head kv into qr[d]; returns Σ_j qr[j]. */
static float rotate_query(const dq_codec *c, const float *q, uint32_t kv, float *qr)
{
    const uint32_t d = c->head_dim;
    float s = 0;
    for (uint32_t j = 0; j < d; j++)
        qr[j] = c->signs ? q[j] * c->signs[kv * d + j] : q[j];
    dq__fwht(qr, d);
    for (uint32_t j = 0; j < d; j++) {
        qr[j] *= c->rot_scale;
        s += qr[j];
    }
    return s;
}

/* Writes the outputs and LSE of the state's heads (query heads qh0...); DQ_RANGE when one is not
 * finite. */
static int finish_heads(const attn_state *st, uint32_t qh0, float *out_all, float *lse_all)
{
    const uint32_t d = st->d;
    for (uint32_t h = 0; h < st->qn; h++) {
        float *out = out_all + (size_t)(qh0 + h) * d;
        const double *acc = st->acc + (size_t)h * d;
        double inv = st->l[h] > 0 ? 1.0 / st->l[h] : 0.0;
        for (uint32_t j = 0; j < d; j++)
            out[j] = (float)(acc[j] * inv);
        const float lse = st->l[h] > 0 ? (float)((double)st->m[h] + log(st->l[h])) : -INFINITY;
        if (lse_all)
            lse_all[qh0 + h] = lse;
        if (!head_finite(out, lse, st->l[h], d))
            return DQ_RANGE;
    }
    return DQ_OK;
}

/* One item: src's windows (records or hot windows, or baseline records through layer) and tail. */
static int attend_item(const dq_codec *c, dq_workspace *ws, const dq__dsp *dsp, uint32_t q_heads, uint32_t qc,
                       float scale, const attn_src *src, const float *q_in, float *out_all, float *lse_all, float *blk)
{
    const uint32_t d = c->head_dim, W = c->profile.window, G = q_heads / c->profile.kv_heads;
    const int dquant = dq__codec_has_levels(c);
    for (uint32_t qh0 = 0; qh0 < q_heads; qh0 += qc) {
        attn_state st;
        uint32_t qn = q_heads - qh0 < qc ? q_heads - qh0 : qc;
        state_layout(&st, ws->big, qn, d, W);
        /* the rotated queries serve the containers only: a layer that is all BF16 tail skips them */
        const int windows = src->nwin > 0;
        for (uint32_t h = 0; h < qn; h++) {
            st.qsum[h] = windows ? rotate_query(c, q_in + (size_t)(qh0 + h) * d, (qh0 + h) / G, st.qr + (size_t)h * d)
                                 : 0.0f;
            st.m[h] = -INFINITY;
            st.l[h] = 0;
            st.off[h] = 0;
            memset(st.acc + (size_t)h * d, 0, sizeof(double) * d);
        }
        if (dquant) {
            if (windows) {
                attend_windows(c, ws, dsp, src, &st, qh0, G, scale, NULL, 0, NULL, NULL);
                unrotate_acc(c, &st, qh0, G);
            }
        } else {
            /* baselines decode their windows; KVQ views score keys from their tables (a layer's codec
             * may be another view of c's root: per-layer calibration) */
            const dq_codec *lc = dq__layer_codec(src->layer);
            DQ_FORWARD_IF_ERROR(c->profile.codec_type == DQ_CODEC_KVQ
                                    ? attend_kvq_windows(lc, ws, src->layer, &st, q_in, qh0, G, scale, blk)
                                    : attend_decoded_windows(c, ws, src->layer, &st, q_in, qh0, G, scale, blk));
        }
        attend_tail(c, dsp, src, &st, q_in, qh0, G, scale);
        DQ_FORWARD_IF_ERROR(finish_heads(&st, qh0, out_all, lse_all));
    }
    return DQ_OK;
}

/* One item with value skipping on (dquant/vskip.h): every key scored first, for all query heads at
 * once (the union spans them), then the kept tokens' values attended per pass of qc heads from
 * those logits with each head's max known in advance (no rescaling), then the tail as always. */
static int attend_item_vskip(const dq_codec *c, dq_workspace *ws, const dq__dsp *dsp, uint32_t q_heads, uint32_t qc,
                             float scale, double tau, const attn_src *src, const float *q_in, float *out_all,
                             float *lse_all, dq_vskip_out *vo)
{
    const uint32_t n = c->n, d = c->head_dim, W = c->profile.window, G = q_heads / c->profile.kv_heads;
    const uint32_t kvh = c->profile.kv_heads, Mv = c->kt[DQ_KIND_V].levels;
    const size_t Ts = src->nwin * W, T = src->T;
    const dq_allocator *a = &c->alloc;
    /* one block: qr [q_heads][d], qsum, qmu, maxv [q_heads], L [q_heads][Ts], TL [q_heads][T],
     * amax [Ts], tmax [kv_heads][T], wts [q_heads][Ts] (floats); Z [q_heads] (doubles); keep [Ts];
     * gather [W records] */
    const size_t nf = (size_t)q_heads * (d + 3) + (size_t)q_heads * (Ts + T) + Ts + (size_t)kvh * T;
    const size_t gb = src->layer ? (size_t)W * c->record_bytes[DQ_KIND_V] : 0;
    const int bounds = vo && vo->bound;
    double *Z = dq__alloc(a, sizeof(double) * q_heads + sizeof(float) * (nf + (size_t)q_heads * Ts) + Ts + gb + 1);
    DQ_RETURN_IF(!Z, DQ_NOMEM);
    float *qr = (float *)(void *)(Z + q_heads), *qsum = qr + (size_t)q_heads * d, *qmu = qsum + q_heads;
    float *maxv = qmu + q_heads, *L = maxv + q_heads, *TL = L + (size_t)q_heads * Ts, *amax = TL + (size_t)q_heads * T;
    float *tmax = amax + Ts;
    float *wts = tmax + (size_t)kvh * T;
    uint8_t *keep = (uint8_t *)(wts + (size_t)q_heads * Ts), *gather = keep + Ts;
    for (uint32_t h = 0; h < q_heads; h++)
        qsum[h] = rotate_query(c, q_in + (size_t)h * d, h / G, qr + (size_t)h * d);
    for (size_t w = 0; w < src->nwin; w++) {
        window_logits(c, ws, dsp, src, w, qr, qsum, qmu, q_heads, 0, G, scale, L + w * W, Ts);
        if (!bounds)
            continue;
        /* each value stream's bound from its stored (s, o), no decoding */
        size_t off[4];
        const uint8_t *so = src->layer ? dq_window_record(c, dq_layer_window(src->layer, w), DQ_KIND_V, 0) : NULL;
        const size_t stride = src->layer ? c->record_bytes[DQ_KIND_V] : 4;
        if (!so) {
            dq_hot_offsets(c, off);
            so = src->hot[w] + off[DQ_KIND_V];
        }
        for (uint32_t t = 0; t < W; t++) {
            const uint8_t *r = so + (size_t)t * stride;
            amax[w * W + t] = dq__vskip_amax(dq_f16_to_f32(dq__get_u16(r)), dq_f16_to_f32(dq__get_u16(r + 2)), Mv);
        }
    }
    for (size_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < q_heads; h++)
            TL[(size_t)h * T + t] = scale *
                                    dsp->dot_bf16(q_in + (size_t)h * d, src->tk + t * n + (size_t)(h / G) * d, d);
        for (uint32_t kv = 0; kv < kvh && bounds; kv++) {
            /* the largest |value| as bits (sign cleared: finite BF16 order as integers) */
            uint16_t mb = 0;
            for (uint32_t j = 0; j < d; j++) {
                const uint16_t b = src->tv[t * n + (size_t)kv * d + j] & 0x7fffu;
                mb = b > mb ? b : mb;
            }
            tmax[(size_t)kv * T + t] = dq__bf16_f32(mb);
        }
    }
    int rc = dq__vskip_select(a, L, Ts, q_heads, Ts, TL, T, T, tau, keep, maxv, Z, NULL, wts);
    for (uint32_t qh0 = 0; qh0 < q_heads && rc == DQ_OK; qh0 += qc) {
        attn_state st;
        const uint32_t qn = q_heads - qh0 < qc ? q_heads - qh0 : qc;
        state_layout(&st, ws->big, qn, d, W);
        for (uint32_t h = 0; h < qn; h++) {
            st.m[h] = maxv[qh0 + h];
            st.l[h] = 0;
            st.off[h] = 0;
            memset(st.acc + (size_t)h * d, 0, sizeof(double) * d);
        }
        attend_windows(c, ws, dsp, src, &st, qh0, G, scale, wts, Ts, keep, gather);
        unrotate_acc(c, &st, qh0, G);
        attend_tail(c, dsp, src, &st, q_in, qh0, G, scale);
        rc = finish_heads(&st, qh0, out_all, lse_all);
    }
    if (rc == DQ_OK && vo) {
        vo->values_sealed = Ts;
        vo->values_decoded = 0;
        for (size_t t = 0; t < Ts; t++)
            vo->values_decoded += keep[t];
        if (vo->keep)
            memcpy(vo->keep, keep, Ts);
        if (bounds)
            for (uint32_t h = 0; h < q_heads; h++)
                vo->bound[h] = dq__vskip_bound(L + (size_t)h * Ts, wts + (size_t)h * Ts, amax, keep, Ts,
                                               TL + (size_t)h * T, tmax + (size_t)(h / G) * T, T, maxv[h], Z[h], W, d);
    }
    dq__free(a, Z);
    return rc;
}

/* Query heads of attention state that fit the workspace at once. */
static uint32_t heads_per_pass(const dq_codec *c, const dq_workspace *ws, uint32_t q_heads)
{
    const uint32_t per_head = 4 * c->head_dim + c->profile.window + 16; /* floats of state per query head */
    uint32_t qc = (uint32_t)(ws->big_len / per_head);
    return qc > q_heads ? q_heads : qc;
}

/* An attn_src over a layer's records, or over a hot item's windows. */
static attn_src layer_src(const dq_layer *layer)
{
    return (attn_src){.layer = layer,
                      .nwin = dq_layer_window_count(layer),
                      .tk = dq_layer_tail(layer, DQ_KIND_K),
                      .tv = dq_layer_tail(layer, DQ_KIND_V),
                      .T = dq_layer_tail_tokens(layer)};
}

static attn_src hot_src(const dq_hot_item *it)
{
    return (attn_src){.hot = it->windows, .nwin = it->nwin, .tk = it->tail_k, .tv = it->tail_v, .T = it->tail_tokens};
}

int dq_attend(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, const dq_attn_item *items,
              size_t nitems)
{
    DQ_FORWARD_IF_ERROR(check_items(c, ws, q_heads, scale, items, nitems));
    const dq__dsp *dsp = dq__dsp_get();
    const uint32_t qc = heads_per_pass(c, ws, q_heads);
    float *blk = NULL;
    if (!dq__codec_has_levels(c)) {
        blk = dq__alloc(&c->alloc, sizeof(float) * (size_t)c->profile.window * c->n);
        DQ_RETURN_IF(!blk, DQ_NOMEM);
    }
    int rc = DQ_OK;
    for (size_t i = 0; i < nitems && rc == DQ_OK; i++) {
        const dq_attn_item *it = &items[i];
        const attn_src src = layer_src(it->layer);
        rc = attend_item(c, ws, dsp, q_heads, qc, scale, &src, it->q, it->out, it->lse, blk);
    }
    dq__free(&c->alloc, blk);
    return rc;
}

static int check_hot_items(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, const dq_hot_item *items,
                           size_t nitems)
{
    DQ_RETURN_IF(!c || !ws || !dq__ws_fits(ws, c) || (nitems && !items), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq__codec_has_levels(c), DQ_UNSUPPORTED);
    DQ_RETURN_IF(!q_heads || q_heads % c->profile.kv_heads, DQ_SHAPE);
    DQ_RETURN_IF(!isfinite(scale), DQ_INVALID_ARGUMENT);
    int rc = DQ_OK;
    for (size_t i = 0; i < nitems; i++) {
        const dq_hot_item *it = &items[i];
        DQ_RETURN_IF(!it->q || !it->out || (it->nwin && !it->windows), DQ_INVALID_ARGUMENT);
        DQ_RETURN_IF(it->tail_tokens && (!it->tail_k || !it->tail_v), DQ_INVALID_ARGUMENT);
        for (size_t w = 0; w < it->nwin; w++)
            DQ_RETURN_IF(!it->windows[w], DQ_INVALID_ARGUMENT);
        int r = dq_attend_check_query(it->q, q_heads, c->head_dim, scale, NULL, NULL);
        DQ_RETURN_IF(r == DQ_NONFINITE, r);
        if (r < 0 && rc == DQ_OK)
            rc = r;
    }
    return rc;
}

int dq_hot_attend(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, const dq_hot_item *items,
                  size_t nitems)
{
    DQ_FORWARD_IF_ERROR(check_hot_items(c, ws, q_heads, scale, items, nitems));
    const dq__dsp *dsp = dq__dsp_get();
    const uint32_t qc = heads_per_pass(c, ws, q_heads);
    int rc = DQ_OK;
    for (size_t i = 0; i < nitems && rc == DQ_OK; i++) {
        const attn_src src = hot_src(&items[i]);
        rc = attend_item(c, ws, dsp, q_heads, qc, scale, &src, items[i].q, items[i].out, items[i].lse, NULL);
    }
    return rc;
}

/* With τ off: every value stream counted as decoded, bounds 0. */
static void vskip_out_exact(dq_vskip_out *vo, uint32_t q_heads, size_t sealed)
{
    if (!vo)
        return;
    vo->values_sealed = vo->values_decoded = sealed;
    if (vo->keep)
        memset(vo->keep, 1, sealed);
    if (vo->bound)
        for (uint32_t h = 0; h < q_heads; h++)
            vo->bound[h] = 0.0;
}

/* The items of dq_attend_vskip or dq_hot_attend_vskip (exactly one of items, hot is not NULL)
 * once checked. */
static int attend_vskip_items(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, double tau,
                              const dq_attn_item *items, const dq_hot_item *hot, dq_vskip_out *outs, size_t nitems)
{
    const int on = dq_vskip_enabled(tau);
    if (on)
        DQ_RETURN_IF(!dq__codec_has_levels(c), DQ_UNSUPPORTED);
    int rc = DQ_OK;
    if (!on) {
        rc = items ? dq_attend(c, ws, q_heads, scale, items, nitems)
                   : dq_hot_attend(c, ws, q_heads, scale, hot, nitems);
        for (size_t i = 0; i < nitems && rc == DQ_OK && outs; i++)
            vskip_out_exact(&outs[i], q_heads,
                            (items ? dq_layer_window_count(items[i].layer) : hot[i].nwin) * c->profile.window);
        return rc;
    }
    const dq__dsp *dsp = dq__dsp_get();
    const uint32_t qc = heads_per_pass(c, ws, q_heads);
    for (size_t i = 0; i < nitems && rc == DQ_OK; i++) {
        const attn_src src = items ? layer_src(items[i].layer) : hot_src(&hot[i]);
        const float *q = items ? items[i].q : hot[i].q;
        float *out = items ? items[i].out : hot[i].out, *lse = items ? items[i].lse : hot[i].lse;
        rc = attend_item_vskip(c, ws, dsp, q_heads, qc, scale, tau, &src, q, out, lse, outs ? &outs[i] : NULL);
    }
    return rc;
}

int dq_attend_vskip(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, double value_mass,
                    const dq_attn_item *items, dq_vskip_out *outs, size_t nitems)
{
    DQ_FORWARD_IF_ERROR(dq_vskip_enabled(value_mass));
    DQ_FORWARD_IF_ERROR(check_items(c, ws, q_heads, scale, items, nitems));
    return attend_vskip_items(c, ws, q_heads, scale, value_mass, nitems ? items : NULL, NULL, outs, nitems);
}

int dq_hot_attend_vskip(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, double value_mass,
                        const dq_hot_item *items, dq_vskip_out *outs, size_t nitems)
{
    DQ_FORWARD_IF_ERROR(dq_vskip_enabled(value_mass));
    DQ_FORWARD_IF_ERROR(check_hot_items(c, ws, q_heads, scale, items, nitems));
    return attend_vskip_items(c, ws, q_heads, scale, value_mass, NULL, items, outs, nitems);
}

int dq_attend_reference(const dq_codec *c, dq_workspace *ws, uint32_t q_heads, float scale, const dq_attn_item *items,
                        size_t nitems)
{
    DQ_FORWARD_IF_ERROR(check_items(c, ws, q_heads, scale, items, nitems));
    const uint32_t n = c->n, d = c->head_dim, G = q_heads / c->profile.kv_heads;
    const dq_allocator *a = &c->alloc;
    float *k = dq__alloc(a, sizeof(float) * n * 2);
    double *acc = dq__alloc(a, sizeof(double) * ((size_t)q_heads * d + 2 * q_heads));
    if (!k || !acc) {
        dq__free(a, k);
        dq__free(a, acc);
        return DQ_NOMEM;
    }
    float *v = k + n;
    double *m = acc + (size_t)q_heads * d, *l = m + q_heads;
    int rc = DQ_OK;
    for (size_t i = 0; i < nitems && rc >= 0; i++) {
        const dq_attn_item *it = &items[i];
        const size_t T = dq_layer_tokens(it->layer);
        memset(acc, 0, sizeof(double) * (size_t)q_heads * d);
        for (uint32_t h = 0; h < q_heads; h++) {
            m[h] = -INFINITY;
            l[h] = 0;
        }
        for (size_t t = 0; t < T && rc >= 0; t++) {
            int r1 = dq_layer_decode(it->layer, ws, DQ_KIND_K, t, 1, k, DQ_DTYPE_F32);
            int r2 = dq_layer_decode(it->layer, ws, DQ_KIND_V, t, 1, v, DQ_DTYPE_F32);
            if ((r1 < 0 && r1 != DQ_CORRUPT) || (r2 < 0 && r2 != DQ_CORRUPT)) {
                rc = r1 < 0 ? r1 : r2;
                break;
            }
            for (uint32_t h = 0; h < q_heads; h++) {
                const uint32_t kv = h / G;
                const float *q = it->q + (size_t)h * d;
                double s = 0;
                for (uint32_t j = 0; j < d; j++)
                    s += (double)q[j] * (double)k[kv * d + j];
                s *= (double)scale;
                double mnew = s > m[h] ? s : m[h];
                double alpha = m[h] == -INFINITY ? 0.0 : exp(m[h] - mnew);
                double p = exp(s - mnew);
                double *ac = acc + (size_t)h * d;
                for (uint32_t j = 0; j < d; j++)
                    ac[j] = ac[j] * alpha + p * (double)v[kv * d + j];
                l[h] = l[h] * alpha + p;
                m[h] = mnew;
            }
        }
        for (uint32_t h = 0; h < q_heads; h++) {
            for (uint32_t j = 0; j < d; j++)
                it->out[(size_t)h * d + j] = l[h] > 0 ? (float)(acc[(size_t)h * d + j] / l[h]) : 0.0f;
            if (it->lse)
                it->lse[h] = l[h] > 0 ? (float)(m[h] + log(l[h])) : -INFINITY;
        }
    }
    dq__free(a, k);
    dq__free(a, acc);
    return rc;
}
