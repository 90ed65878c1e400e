/* One layer of one sequence: sealed windows plus the BF16 tail. Appends are all-or-nothing:
 * everything that can fail (validation, allocation, encoding) happens before the layer changes.
 * Inputs are rounded to BF16 first (the tail's precision), so a layer's bytes depend only on the
 * BF16 token sequence, never on how it was split into appends. */
#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "codec_internal.h"
#include "dsp.h"
#include "dquant/layer.h"

struct dq_layer {
    const dq_codec *codec;
    uint8_t **windows;
    size_t nwin, cap;
    uint16_t *tail[2]; /* R tokens each, K and V */
    size_t tail_len;
};

const dq_codec *dq__layer_codec(const dq_layer *layer)
{
    return layer->codec;
}

int dq_layer_create(const dq_codec *codec, dq_layer **out)
{
    DQ_RETURN_IF(!codec || !out, DQ_INVALID_ARGUMENT);
    *out = NULL;
    const dq_allocator *a = &codec->alloc;
    dq_layer *l = dq__alloc(a, sizeof *l);
    DQ_RETURN_IF(!l, DQ_NOMEM);
    memset(l, 0, sizeof *l);
    l->codec = codec;
    size_t tail_bytes = (size_t)codec->profile.residual * codec->n * sizeof(uint16_t);
    l->tail[0] = dq__alloc(a, tail_bytes);
    l->tail[1] = dq__alloc(a, tail_bytes);
    if (!l->tail[0] || !l->tail[1]) {
        dq__free(a, l->tail[0]);
        dq__free(a, l->tail[1]);
        dq__free(a, l);
        return DQ_NOMEM;
    }
    *out = l;
    return DQ_OK;
}

void dq_layer_free(dq_layer *layer)
{
    if (!layer)
        return;
    const dq_allocator *a = &layer->codec->alloc;
    for (size_t i = 0; i < layer->nwin; i++)
        dq__free(a, layer->windows[i]);
    dq__free(a, layer->windows);
    dq__free(a, layer->tail[0]);
    dq__free(a, layer->tail[1]);
    dq__free(a, layer);
}

size_t dq_layer_tokens(const dq_layer *layer)
{
    return layer->nwin * layer->codec->profile.window + layer->tail_len;
}

size_t dq_layer_sealed_tokens(const dq_layer *layer)
{
    return layer->nwin * layer->codec->profile.window;
}

size_t dq_layer_tail_tokens(const dq_layer *layer)
{
    return layer->tail_len;
}

size_t dq_layer_stored_bytes(const dq_layer *layer)
{
    return layer->nwin * layer->codec->window_bytes + layer->tail_len * layer->codec->n * 2 * sizeof(uint16_t);
}

size_t dq_layer_allocated_bytes(const dq_layer *layer)
{
    const dq_codec *c = layer->codec;
    return sizeof *layer + layer->nwin * c->window_bytes + layer->cap * sizeof(uint8_t *) +
           2 * (size_t)c->profile.residual * c->n * sizeof(uint16_t);
}

size_t dq_layer_window_count(const dq_layer *layer)
{
    return layer->nwin;
}

const uint8_t *dq_layer_window(const dq_layer *layer, size_t i)
{
    return i < layer->nwin ? layer->windows[i] : NULL;
}

const uint16_t *dq_layer_tail(const dq_layer *layer, dq_kind kind)
{
    return layer->tail[kind == DQ_KIND_V];
}

/* Input token t of x (n values of dtype) rounded to BF16 into dst. */
static void input_token_bf16(const void *x, dq_dtype dtype, size_t n, size_t t, uint16_t *dst)
{
    if (dtype == DQ_DTYPE_BF16) {
        memcpy(dst, (const uint16_t *)x + t * n, n * sizeof(uint16_t));
        return;
    }
    for (size_t j = 0; j < n; j++)
        dst[j] = dq__f32_bf16(dq__load_elem(x, dtype, t * n + j));
}

/* Token i of the concatenation [tail, input] as BF16 into dst (n values). */
static void fetch_token(const dq_layer *l, int kind, const void *x, dq_dtype dtype, size_t i, uint16_t *dst)
{
    const uint32_t n = l->codec->n;
    if (i < l->tail_len)
        memcpy(dst, l->tail[kind] + i * n, n * sizeof(uint16_t));
    else
        input_token_bf16(x, dtype, n, i - l->tail_len, dst);
}

/* Whether every head of the BF16 token xb has a 2-norm of at most DQ__TOKEN_NORM_LIMIT. Such a
 * head cannot leave the range after rotation (an orthonormal map; the 0.1% margin covers the
 * rounding of the sums and of the transform), whatever order the squares are summed in. A
 * non-finite value makes its head's sum +inf or NaN, which fails. */
static bool token_small(const dq__dsp *dsp, const uint16_t *xb, uint32_t n, uint32_t d)
{
    const float lim2 = DQ__TOKEN_NORM_LIMIT * DQ__TOKEN_NORM_LIMIT;
    for (uint32_t h0 = 0; h0 < n; h0 += d)
        if (!(dsp->sumsq_bf16(xb + h0, d) <= lim2))
            return false;
    return true;
}

/* Every new token, rounded to BF16, must be finite and within the codec's range after rotation. */
int dq_check_tokens(dq_workspace *ws, const void *x, dq_dtype dtype, size_t ntok)
{
    DQ_RETURN_IF(!ws || (ntok && !x), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    const dq_codec *c = ws->codec;
    const dq__dsp *dsp = dq__dsp_get();
    const uint32_t n = c->n, d = c->head_dim;
    /* The usual case in one pass: BF16 tokens whose heads are all small (finite sums, so finite
     * values). Anything else goes through the checks below, in their order of precedence. */
    if (dtype == DQ_DTYPE_BF16) {
        size_t t = 0;
        while (t < ntok && token_small(dsp, (const uint16_t *)x + t * n, n, d))
            t++;
        if (t == ntok)
            return DQ_OK;
    }
    DQ_FORWARD_IF_ERROR(dq_check_finite(x, dtype, ntok * n));
    /* Tokens with a head above the limit are rotated and checked value by value, as the encoder
     * sees them. */
    uint16_t *xb16 = (uint16_t *)(void *)ws->f1; /* n BF16 values fit in n floats */
    float *y = ws->f0;
    for (size_t t = 0; t < ntok; t++) {
        const uint16_t *xb = (const uint16_t *)x + t * n;
        if (dtype != DQ_DTYPE_BF16) {
            input_token_bf16(x, dtype, n, t, xb16);
            if (dq_check_finite(xb16, DQ_DTYPE_BF16, n) != DQ_OK) /* finite, but rounds to an infinity */
                return DQ_NONFINITE;
            xb = xb16;
        }
        if (token_small(dsp, xb, n, d))
            continue;
        for (uint32_t j = 0; j < n; j++)
            y[j] = dq__bf16_f32(xb[j]);
        dq_rotate(c, y);
        for (uint32_t j = 0; j < n; j++)
            if (!(fabsf(y[j]) <= DQ_TOKEN_MAX_ABS))
                return DQ_RANGE;
    }
    return DQ_OK;
}

int dq_layer_append(dq_layer *layer, dq_workspace *ws, const void *k, const void *v, dq_dtype dtype, size_t ntok,
                    dq_encode_stats *stats)
{
    DQ_RETURN_IF(!layer || !ws || !dq__ws_fits(ws, layer->codec) || (ntok && (!k || !v)), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    if (ntok == 0)
        return DQ_OK;
    const dq_codec *c = layer->codec;
    const dq_allocator *a = &c->alloc;
    const size_t n = c->n, W = c->profile.window, R = c->profile.residual;
    DQ_RETURN_IF(ntok > ((size_t)1 << 40) / n, DQ_SHAPE);
    DQ_FORWARD_IF_ERROR(dq_check_tokens(ws, k, dtype, ntok));
    DQ_FORWARD_IF_ERROR(dq_check_tokens(ws, v, dtype, ntok));
    assert(layer->tail_len < R && layer->nwin <= layer->cap);

    const size_t total = layer->tail_len + ntok;
    const size_t nseal = total >= R ? (total - R) / W + 1 : 0;

    /* Allocate everything first. */
    uint8_t **grown = NULL;
    size_t newcap = layer->cap;
    if (layer->nwin + nseal > layer->cap) {
        newcap = layer->cap ? layer->cap : 8;
        while (newcap < layer->nwin + nseal)
            newcap *= 2;
        grown = dq__alloc(a, newcap * sizeof(uint8_t *));
        DQ_RETURN_IF(!grown, DQ_NOMEM);
    }
    uint8_t **fresh = NULL;
    int rc = DQ_OK;
    dq_encode_stats st = {0};
    if (nseal) {
        fresh = dq__alloc(a, nseal * sizeof(uint8_t *));
        if (!fresh) {
            dq__free(a, grown);
            return DQ_NOMEM;
        }
        memset(fresh, 0, nseal * sizeof(uint8_t *));
        for (size_t w = 0; w < nseal && rc == DQ_OK; w++) {
            fresh[w] = dq__alloc(a, c->window_bytes);
            if (!fresh[w])
                rc = DQ_NOMEM;
        }
        /* Encode sealed windows from the concatenation [tail, input]. */
        uint16_t *sk = ws->stage, *sv = ws->stage + W * n;
        for (size_t w = 0; w < nseal && rc == DQ_OK; w++) {
            for (size_t t = 0; t < W; t++) {
                fetch_token(layer, 0, k, dtype, w * W + t, sk + t * n);
                fetch_token(layer, 1, v, dtype, w * W + t, sv + t * n);
            }
            rc = dq_window_encode(c, ws, sk, sv, DQ_DTYPE_BF16, fresh[w], &st);
        }
        if (rc != DQ_OK) {
            for (size_t w = 0; w < nseal; w++)
                dq__free(a, fresh[w]);
            dq__free(a, fresh);
            dq__free(a, grown);
            return rc;
        }
    }

    /* Commit: nothing below can fail. */
    if (grown) {
        if (layer->nwin)
            memcpy(grown, layer->windows, layer->nwin * sizeof(uint8_t *));
        dq__free(a, layer->windows);
        layer->windows = grown;
        layer->cap = newcap;
    }
    for (size_t w = 0; w < nseal; w++)
        layer->windows[layer->nwin++] = fresh[w];
    dq__free(a, fresh);
    const size_t consumed = nseal * W;
    const size_t new_tail = total - consumed;
    /* the tail buffers hold R tokens; R >= W, so at least R - W of the total stay in the tail */
    assert(consumed <= total && new_tail < R && layer->nwin <= layer->cap);
    /* Tail tokens are concatenation[consumed, total). Old tail tokens that survive move down first. */
    for (int kind = 0; kind < 2; kind++) {
        const void *x = kind == 0 ? k : v;
        uint16_t *tail = layer->tail[kind];
        size_t keep_old = layer->tail_len > consumed ? layer->tail_len - consumed : 0;
        if (keep_old)
            memmove(tail, tail + consumed * n, keep_old * n * sizeof(uint16_t));
        size_t first_new = consumed > layer->tail_len ? consumed - layer->tail_len : 0;
        assert(first_new <= ntok && keep_old + (ntok - first_new) == new_tail);
        for (size_t t = first_new; t < ntok; t++)
            input_token_bf16(x, dtype, n, t, tail + (keep_old + t - first_new) * n);
    }
    layer->tail_len = new_tail;
    if (stats) {
        stats->streams += st.streams;
        stats->retries += st.retries;
        stats->fallbacks += st.fallbacks;
        stats->payload_bytes += st.payload_bytes;
        stats->symbols_moved += st.symbols_moved;
        if (st.max_payload_bytes > stats->max_payload_bytes)
            stats->max_payload_bytes = st.max_payload_bytes;
        if (st.max_move > stats->max_move)
            stats->max_move = st.max_move;
    }
    return DQ_OK;
}

int dq_layer_decode(const dq_layer *layer, dq_workspace *ws, dq_kind kind, size_t first, size_t count, void *out,
                    dq_dtype dtype)
{
    DQ_RETURN_IF(!layer || !ws || !dq__ws_fits(ws, layer->codec) || (count && !out) ||
                     (kind != DQ_KIND_K && kind != DQ_KIND_V),
                 DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!dq_dtype_size(dtype), DQ_DTYPE);
    const dq_codec *c = layer->codec;
    const size_t n = c->n, W = c->profile.window, esz = dq_dtype_size(dtype);
    const size_t total = dq_layer_tokens(layer), sealed = dq_layer_sealed_tokens(layer);
    DQ_RETURN_IF(first > total || count > total - first, DQ_OUT_OF_BOUNDS);
    int rc = DQ_OK;
    size_t t = first, end = first + count;
    while (t < end && t < sealed) {
        size_t w = t / W, off = t % W;
        size_t cnt = W - off < end - t ? W - off : end - t;
        const uint8_t *win = layer->windows[w];
        int r;
        if (c->profile.codec_type == DQ_CODEC_KVQ) /* from the window's first record: delta anchors */
            r = dq__kvq_decode(c, ws, kind, kind == DQ_KIND_K && c->mean_bytes ? dq_window_mean(c, win) : NULL,
                               dq_window_record(c, win, kind, 0), c->record_bytes[kind], off, cnt,
                               (uint8_t *)out + (t - first) * n * esz, dtype, 1);
        else
            r = dq_tokens_decode(c, ws, kind, kind == DQ_KIND_K ? dq_window_mean(c, win) : NULL,
                                 dq_window_record(c, win, kind, off), c->record_bytes[kind], cnt,
                                 (uint8_t *)out + (t - first) * n * esz, dtype);
        if (r == DQ_CORRUPT)
            rc = r;
        else if (r < 0)
            return r;
        t += cnt;
    }
    if (t < end) {
        const uint16_t *src = layer->tail[kind] + (t - sealed) * n;
        rc = rc ? rc : dq_convert(src, DQ_DTYPE_BF16, (uint8_t *)out + (t - first) * n * esz, dtype, (end - t) * n);
    }
    return rc;
}

int dq_window_check(const dq_codec *codec, const uint8_t *window)
{
    DQ_RETURN_IF(!codec || !window, DQ_INVALID_ARGUMENT);
    if (codec->profile.codec_type == DQ_CODEC_KVQ)
        return dq__kvq_window_check(codec, window);
    if (!dq__codec_has_levels(codec))
        return DQ_OK; /* baselines have no redundancy to check */
    const size_t n = codec->n, W = codec->profile.window;
    const uint16_t mh = (uint16_t)(window[0] | window[1] << 8);
    DQ_RETURN_IF((mh & 0x7c00u) == 0x7c00u, DQ_CORRUPT);
    uint8_t lev[256];
    uint8_t *buf = lev;
    if (n > sizeof lev) {
        buf = dq__alloc(&codec->alloc, n);
        DQ_RETURN_IF(!buf, DQ_NOMEM);
    }
    int rc = DQ_OK;
    for (int kind = 0; kind < 2 && rc == DQ_OK; kind++) {
        for (size_t t = 0; t < W; t++) {
            const uint8_t *rec = dq_window_record(codec, window, (dq_kind)kind, t);
            uint16_t sh = (uint16_t)(rec[0] | rec[1] << 8), oh = (uint16_t)(rec[2] | rec[3] << 8);
            /* Decoding checks state, length and padding (fixed width: each group's value and the
             * padding); levels are discarded. */
            if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u || (sh & 0x8000u) ||
                dq_stream_decode_levels(codec, (dq_kind)kind, rec, buf) != DQ_OK) {
                rc = DQ_CORRUPT;
                break;
            }
        }
    }
    if (buf != lev)
        dq__free(&codec->alloc, buf);
    return rc;
}

int dq_layer_append_windows(dq_layer *layer, const uint8_t *windows, size_t nwin, size_t *bad_window)
{
    DQ_RETURN_IF(!layer || (nwin && !windows), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(layer->tail_len != 0, DQ_ORDER);
    const dq_codec *codec = layer->codec;
    const dq_allocator *a = &codec->alloc;
    for (size_t w = 0; w < nwin; w++) {
        int rc = dq_window_check(codec, windows + w * codec->window_bytes);
        if (rc < 0) {
            if (bad_window)
                *bad_window = w;
            return rc;
        }
    }
    if (!nwin)
        return DQ_OK;
    DQ_RETURN_IF(nwin > SIZE_MAX / 2 - layer->nwin, DQ_NOMEM);
    uint8_t **grown = NULL;
    size_t newcap = layer->cap;
    if (layer->nwin + nwin > layer->cap) {
        newcap = layer->cap ? layer->cap : 8;
        while (newcap < layer->nwin + nwin)
            newcap *= 2;
        grown = dq__alloc(a, newcap * sizeof(uint8_t *));
        DQ_RETURN_IF(!grown, DQ_NOMEM);
    }
    const size_t base = layer->nwin;
    uint8_t **slots = grown ? grown : layer->windows;
    size_t made = 0;
    for (; made < nwin; made++) {
        uint8_t *blk = dq__alloc(a, codec->window_bytes);
        if (!blk)
            break;
        memcpy(blk, windows + made * codec->window_bytes, codec->window_bytes);
        slots[base + made] = blk;
    }
    if (made < nwin) {
        for (size_t i = 0; i < made; i++)
            dq__free(a, slots[base + i]);
        dq__free(a, grown);
        return DQ_NOMEM;
    }
    if (grown) {
        if (layer->nwin)
            memcpy(grown, layer->windows, layer->nwin * sizeof(uint8_t *));
        dq__free(a, layer->windows);
        layer->windows = grown;
        layer->cap = newcap;
    }
    layer->nwin += nwin;
    return DQ_OK;
}

static int restore(const dq_codec *codec, const uint8_t *windows, size_t nwin, const uint16_t *tail_k,
                   const uint16_t *tail_v, size_t tail_tokens, bool check, dq_layer **out)
{
    DQ_RETURN_IF(!codec || !out || (nwin && !windows) || (tail_tokens && (!tail_k || !tail_v)), DQ_INVALID_ARGUMENT);
    *out = NULL;
    const size_t n = codec->n;
    DQ_RETURN_IF(tail_tokens >= codec->profile.residual, DQ_SHAPE);
    /* Verify every container before taking anything. */
    for (size_t w = 0; check && w < nwin; w++)
        DQ_FORWARD_IF_ERROR(dq_window_check(codec, windows + w * codec->window_bytes));
    DQ_RETURN_IF(dq_check_finite(tail_k, DQ_DTYPE_BF16, tail_tokens * n) ||
                     dq_check_finite(tail_v, DQ_DTYPE_BF16, tail_tokens * n),
                 DQ_CORRUPT);
    dq_layer *l;
    DQ_FORWARD_IF_ERROR(dq_layer_create(codec, &l));
    if (nwin) {
        l->windows = dq__alloc(&codec->alloc, nwin * sizeof(uint8_t *));
        if (!l->windows) {
            dq_layer_free(l);
            return DQ_NOMEM;
        }
        l->cap = nwin;
        for (size_t w = 0; w < nwin; w++) {
            uint8_t *blk = dq__alloc(&codec->alloc, codec->window_bytes);
            if (!blk) {
                dq_layer_free(l);
                return DQ_NOMEM;
            }
            memcpy(blk, windows + w * codec->window_bytes, codec->window_bytes);
            l->windows[l->nwin++] = blk;
        }
    }
    if (tail_tokens) {
        memcpy(l->tail[0], tail_k, tail_tokens * n * sizeof(uint16_t));
        memcpy(l->tail[1], tail_v, tail_tokens * n * sizeof(uint16_t));
    }
    l->tail_len = tail_tokens;
    *out = l;
    return DQ_OK;
}

int dq_layer_restore(const dq_codec *codec, const uint8_t *windows, size_t nwin, const uint16_t *tail_k,
                     const uint16_t *tail_v, size_t tail_tokens, dq_layer **out)
{
    return restore(codec, windows, nwin, tail_k, tail_v, tail_tokens, true, out);
}

int dq_layer_restore_unchecked(const dq_codec *codec, const uint8_t *windows, size_t nwin, const uint16_t *tail_k,
                               const uint16_t *tail_v, size_t tail_tokens, dq_layer **out)
{
    return restore(codec, windows, nwin, tail_k, tail_v, tail_tokens, false, out);
}
