/* dquantd layer appends that can be undone: the building block of all-or-nothing PUTs (many
 * layers) and ATTEND batches with appends (many sequences).
 *
 * dq_layer_append is atomic for one layer; a request touching several layers applies each with
 * dqd_append_apply and, if any fails, rolls the applied ones back with dqd_append_rollback.
 * Layers are append-only, so the previous state is the first nwin0 windows (still in the layer)
 * plus the previous BF16 tail: kept in the layer when no window was sealed, else copied by apply
 * beforehand (only when the append can seal a window, so usually nothing is copied).
 *
 * Runs on a worker thread; the caller holds write access to the sequence. */
#ifndef DQD_APPEND_H
#define DQD_APPEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/layer.h"
#include "registry.h"

typedef struct dqd_append {
    bool created; /* the layer did not exist before */
    bool applied; /* the append succeeded */
    size_t tokens0, nwin0, tail0;
    uint16_t *tail_k; /* snapshot of the previous tail when the append may seal a window */
    uint16_t *tail_v;
} dqd_append;

/* Appends ntok tokens (k, v: [ntok, kv_heads, head_dim] of dtype) to *slot, model layer `layer`,
 * creating the layer with that layer's codec view (dqd_codec_view) if *slot is NULL. On failure
 * the slot is as before (a created layer is freed again). */
int dqd_append_apply(dqd_append *a, dqd_codec *codec, uint32_t layer, dq_workspace *ws, dq_layer **slot, const void *k,
                     const void *v, dq_dtype dtype, size_t ntok, dq_encode_stats *stats);
/* Records a client encoded itself (PUT_RAW): windows whole window records, then tail_tokens (< W)
 * BF16 tail tokens of K and V ([tail_tokens, kv_heads, head_dim], any alignment). */
typedef struct dqd_raw_in {
    const uint8_t *records;
    size_t windows;
    const void *tail_k, *tail_v;
    size_t tail_tokens;
} dqd_raw_in;

/* Appends in to *slot (created if NULL) as stored: the layer must hold no tail (DQ_ORDER). The
 * tail is checked first (DQ_NONFINITE, DQ_RANGE), then every record (DQ_CORRUPT, *bad_window the
 * first bad one's index); nothing is re-encoded. On failure the slot is as before. Undone by
 * dqd_append_rollback like any append. */
int dqd_append_raw(dqd_append *a, dqd_codec *codec, uint32_t layer, dq_workspace *ws, dq_layer **slot,
                   const dqd_raw_in *in, size_t *bad_window);
/* Undoes an applied append (no-op otherwise). DQ_NOMEM / DQ_CORRUPT if the previous state cannot
 * be rebuilt: the caller must then drop the whole sequence. */
int dqd_append_rollback(dqd_append *a, dqd_codec *codec, uint32_t layer, dq_layer **slot);
/* Frees the snapshot. */
void dqd_append_clear(dqd_append *a);

#endif
