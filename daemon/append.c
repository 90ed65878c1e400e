/* dquantd undoable layer appends (see append.h). */
#include "append.h"

#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "logging.h"

void dqd_append_clear(dqd_append *a)
{
    free(a->tail_k);
    free(a->tail_v);
    a->tail_k = a->tail_v = NULL;
}

int dqd_append_apply(dqd_append *a, dqd_codec *codec, uint32_t layer_index, dq_workspace *ws, dq_layer **slot,
                     const void *k, const void *v, dq_dtype dtype, size_t ntok, dq_encode_stats *stats)
{
    memset(a, 0, sizeof *a);
    int rc;
    if (!*slot) {
        const dq_codec *view = dqd_codec_view(codec, layer_index);
        rc = view ? dq_layer_create(view, slot) : DQ_OUT_OF_BOUNDS;
        if (rc < 0)
            return rc;
        a->created = true;
    }
    dq_layer *layer = *slot;
    a->tokens0 = dq_layer_tokens(layer);
    a->nwin0 = dq_layer_window_count(layer);
    a->tail0 = dq_layer_tail_tokens(layer);

    /* A window is sealed when the tail reaches R tokens: only then does the tail change in place. */
    if (!a->created && a->tail0 && a->tail0 + ntok >= codec->profile.residual) {
        size_t elems = a->tail0 * codec->n;
        a->tail_k = malloc(elems * sizeof(uint16_t));
        a->tail_v = malloc(elems * sizeof(uint16_t));
        if (!a->tail_k || !a->tail_v) {
            dqd_append_clear(a);
            return DQ_NOMEM;
        }
        memcpy(a->tail_k, dq_layer_tail(layer, DQ_KIND_K), elems * sizeof(uint16_t));
        memcpy(a->tail_v, dq_layer_tail(layer, DQ_KIND_V), elems * sizeof(uint16_t));
    }

    rc = dq_layer_append(layer, ws, k, v, dtype, ntok, stats);
    if (rc < 0) {
        if (a->created) {
            dq_layer_free(layer);
            *slot = NULL;
            a->created = false;
        }
        dqd_append_clear(a);
        return rc;
    }
    a->applied = true;
    return DQ_OK;
}

int dqd_append_raw(dqd_append *a, dqd_codec *codec, uint32_t layer_index, dq_workspace *ws, dq_layer **slot,
                   const dqd_raw_in *in, size_t *bad_window)
{
    memset(a, 0, sizeof *a);
    const size_t elems = in->tail_tokens * codec->n;
    uint16_t *tk = NULL, *tv = NULL;
    int rc = DQ_OK;
    if (in->tail_tokens) {
        /* The payload gives no alignment: copy the (short) tail before reading it as BF16. */
        tk = malloc(elems * sizeof *tk);
        tv = malloc(elems * sizeof *tv);
        if (!tk || !tv) {
            rc = DQ_NOMEM;
            goto out;
        }
        memcpy(tk, in->tail_k, elems * sizeof *tk);
        memcpy(tv, in->tail_v, elems * sizeof *tv);
        rc = dq_check_tokens(ws, tk, DQ_DTYPE_BF16, in->tail_tokens);
        if (rc == DQ_OK)
            rc = dq_check_tokens(ws, tv, DQ_DTYPE_BF16, in->tail_tokens);
        if (rc < 0)
            goto out;
    }
    if (!*slot) {
        const dq_codec *view = dqd_codec_view(codec, layer_index);
        rc = view ? dq_layer_create(view, slot) : DQ_OUT_OF_BOUNDS;
        if (rc < 0)
            goto out;
        a->created = true;
    }
    dq_layer *layer = *slot;
    a->tokens0 = dq_layer_tokens(layer);
    a->nwin0 = dq_layer_window_count(layer);
    a->tail0 = dq_layer_tail_tokens(layer);
    rc = dq_layer_append_windows(layer, in->records, in->windows, bad_window);
    if (rc == DQ_OK && in->tail_tokens) {
        /* Checked above and shorter than R: copied as is, nothing sealed; only DQ_NOMEM is left. */
        rc = dq_layer_append(layer, ws, tk, tv, DQ_DTYPE_BF16, in->tail_tokens, NULL);
        if (rc < 0 && dq_layer_window_count(layer) != a->nwin0) {
            a->applied = true;
            if (dqd_append_rollback(a, codec, layer_index, slot) < 0)
                rc = DQ_INTERNAL; /* the layer could not be put back: the caller drops the sequence */
        }
    }
    if (rc < 0) {
        if (a->created && *slot) {
            dq_layer_free(*slot);
            *slot = NULL;
            a->created = false;
        }
        a->applied = false;
        goto out;
    }
    a->applied = true;
out:
    free(tk);
    free(tv);
    return rc;
}

int dqd_append_rollback(dqd_append *a, dqd_codec *codec, uint32_t layer_index, dq_layer **slot)
{
    if (!a->applied)
        return DQ_OK;
    dq_layer *layer = *slot;
    if (a->created) {
        dq_layer_free(layer);
        *slot = NULL;
        a->applied = false;
        return DQ_OK;
    }

    const uint16_t *tk, *tv;
    if (dq_layer_window_count(layer) == a->nwin0) {
        /* Nothing sealed: the old tail is the head of the current one. */
        tk = dq_layer_tail(layer, DQ_KIND_K);
        tv = dq_layer_tail(layer, DQ_KIND_V);
    } else {
        tk = a->tail_k;
        tv = a->tail_v;
    }
    static const uint16_t none[1];
    if (!a->tail0)
        tk = tv = none;
    if (!tk || !tv)
        return DQ_INTERNAL;

    uint8_t *windows = NULL;
    if (a->nwin0) {
        windows = malloc(a->nwin0 * codec->window_bytes);
        if (!windows)
            return DQ_NOMEM;
        for (size_t i = 0; i < a->nwin0; i++)
            memcpy(windows + i * codec->window_bytes, dq_layer_window(layer, i), codec->window_bytes);
    }
    dq_layer *fresh = NULL;
    const dq_codec *view = dqd_codec_view(codec, layer_index);
    int rc = !view ? DQ_OUT_OF_BOUNDS
                   : dq_layer_restore(view, windows ? windows : (const uint8_t *)none, a->nwin0, tk, tv, a->tail0,
                                      &fresh);
    free(windows);
    if (rc < 0) {
        DQD_ERROR("cannot roll back a layer to %zu tokens: %s", a->tokens0, dq_strerror(rc));
        return rc;
    }
    dq_layer_free(layer);
    *slot = fresh;
    a->applied = false;
    return DQ_OK;
}
