/* dquantd tiers: where each layer of a sequence lives — host memory (dq_layer, seq->layers[i]) or
 * GPU memory (dqd_glayer, seq->glayers[i]; cuda backend only) — and the operations whose work
 * depends on it. Operations call these on a (sequence, layer) and never look at the backend
 * themselves: on the cpu backend every layer is on the host and the GPU paths are never taken.
 *
 * Loop thread: dqd_tier_gpu_ok, dqd_tier_precheck, dqd_tier_place_layers, dqd_tier_host_need,
 * dqd_tier_moves_run, dqd_tier_free_device. Worker threads (the caller holds the access the
 * operation needs): the rest. */
#ifndef DQD_TIER_H
#define DQD_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "access.h"
#include "append.h"
#include "dquant/types.h"
#include "gpu.h"
#include "store.h"
#include "tensor.h"

typedef struct dqd_ctx dqd_ctx;

/* Whether the layers of model m may live on the GPU (a cuda backend runs and takes its shape). */
bool dqd_tier_gpu_ok(const dqd_ctx *ctx, const dqd_model *m);
/* Whether appended tokens are checked before the append (dq_check_tokens): the GPU appends of a
 * batch are all-or-nothing only when their input was checked first. */
bool dqd_tier_precheck(const dqd_ctx *ctx);

/* Tokens [first, first + count) of K or V of the layer to out ([count, kv_heads, head_dim] of
 * dtype): host memory, or device memory with dqd_tier_decode_dev (an NCCL reply). Identical bytes
 * from either tier; DQ_CORRUPT when a container is invalid, DQ_NOMEM. */
int dqd_tier_decode(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, dq_kind kind, size_t first, size_t count,
                    void *out, dq_dtype dtype);
int dqd_tier_decode_dev(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, dq_kind kind, size_t first, size_t count,
                        void *dout, dq_dtype dtype);
/* The layer as GET_RAW sends it to dst: window records back to back, then tail K, then tail V
 * (dqd_seq_layer_windows / _tail give the sizes). A layer that does not exist copies nothing. */
int dqd_tier_copy_raw(dqd_ctx *ctx, const dqd_seq *seq, uint32_t layer, uint8_t *dst);

/* Device memory outside the budget for one request's reply (NCCL): allocated on a worker, freed on
 * the loop thread (stream-ordered, never waits). DQ_UNSUPPORTED on the cpu backend. */
int dqd_tier_alloc_device(dqd_ctx *ctx, size_t bytes, void **out);
void dqd_tier_free_device(dqd_ctx *ctx, void *p);

/* One layer's append that can be undone, in the tier dqd_tier_place_layers chose for it. */
typedef struct dqd_tier_append {
    bool gpu;        /* appended on the GPU */
    bool promote;    /* its host layer moves to the GPU first ... */
    bool promoted;   /* ... and did */
    bool spill;      /* its GPU layer moves to the host first (no GPU room for the append) ... */
    bool spilled;    /* ... and did */
    dqd_append host; /* the append on the host (append.h) */
    dqd_gappend dev; /* the append on the GPU (gpu.h); dev.broken: the layer could not be restored */
} dqd_tier_append;

/* Places layers [first, first + n) of seq for appends of ntok tokens each (t: n zeroed entries):
 * on the GPU when the model may live there and the GPU budget can make room for all of them
 * (host layers promoted), else only the layers already there if their growth fits, else those
 * spill to the host; everything on the host otherwise. GPU room is reserved (*gpu_reserved, to be
 * released with dqd_store_gpu_unreserve) and the victims to move first are in mv
 * (dqd_tier_moves_run). Returns 0 or DQ_NOMEM. */
int dqd_tier_place_layers(dqd_ctx *ctx, dqd_seq *seq, uint32_t first, uint32_t n, uint64_t ntok, dqd_tier_append *t,
                          uint64_t *gpu_reserved, dqd_gpu_moves *mv);
/* Host bytes to reserve (dqd_store_reserve) for the placed append t of ntok tokens to the layer. */
uint64_t dqd_tier_host_need(const dqd_seq *seq, uint32_t layer, const dqd_tier_append *t, uint64_t ntok);
/* Appends ntok tokens (k, v: [ntok, kv_heads, head_dim] of dtype; in device memory, already
 * checked, when dev) to the layer in its tier, moving it first when t says so. Same checks, same
 * all-or-nothing result and same bytes in either tier; stats (may be NULL) is added to. */
int dqd_tier_append_apply(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t, const void *k, const void *v,
                          dq_dtype dtype, size_t ntok, bool dev, dq_encode_stats *stats);
/* PUT_RAW: appends records as they are (dqd_append_raw) to the layer on the host, moving a GPU
 * layer to the host first when t->spill says so (the caller sets spill for every layer on the
 * GPU; raw appends are always placed on the host, and the GPU tier takes the layer back as usual
 * when a later write promotes it). Undone by dqd_tier_append_rollback. */
int dqd_tier_append_raw(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t, const dqd_raw_in *in,
                        size_t *bad_window);
/* Undoes an applied append (no-op otherwise); a failure means the sequence must be dropped. */
int dqd_tier_append_rollback(dqd_ctx *ctx, dqd_seq *seq, uint32_t layer, dqd_tier_append *t);
/* Whether the append was applied (1) or not (0). */
static inline unsigned dqd_tier_append_applied(const dqd_tier_append *t)
{
    return t->host.applied + t->dev.applied;
}
void dqd_tier_append_clear(dqd_tier_append *t);

/* One item of a batch (ATTEND): a (sequence, layer) with a query and perhaps one token appended
 * first; the tier of its layer and its undoable append. */
typedef struct dqd_tier_item {
    dqd_seq *seq;
    dqd_codec *codec;
    uint32_t layer;
    dqd_tensor q, ak, av;
    bool append;
    bool gpu;     /* its layer is (after the appends) in GPU memory */
    bool promote; /* the appends move its layer to the GPU first (one item per layer) */
    bool promoted;
    bool spill; /* the appends move its (GPU) layer to the host before appending there */
    bool spilled;
    bool checked; /* its k and v passed dq_check_tokens already */
    bool batched; /* its GPU append went with others' (one dqd_gpu_append_tokens) */
    dqd_append txn;
    dqd_gappend gtxn;
    int rc;
} dqd_tier_item;

/* An item by its (sequence, layer), to sort the items of one layer together (qsort with
 * dqd_layer_key_cmp: by sequence, layer, then item). */
typedef struct dqd_layer_key {
    uintptr_t seq;
    uint32_t layer;
    size_t item;
} dqd_layer_key;
int dqd_layer_key_cmp(const void *a, const void *b);
static inline bool dqd_layer_key_same(const dqd_layer_key *a, const dqd_layer_key *b)
{
    return a->seq == b->seq && a->layer == b->layer;
}

/* Places every (sequence, layer) of a batch: its items run on the GPU if the layer is there
 * already; else, for models the GPU takes, the layer moves there (an existing host layer, only
 * when as holds its sequence exclusively) or is created there (a new layer with an append) when
 * the GPU budget can make room for all of those; else it stays on the host. When not even the
 * resident layers' appends fit, those layers spill to the host. Sets items' gpu, promote and
 * spill, reserves the GPU room (*gpu_reserved) and lists the victims to move first in mv.
 * Returns 0 or DQ_NOMEM. */
int dqd_tier_place_items(dqd_ctx *ctx, dqd_tier_item *items, size_t n, const dqd_access_set *as, uint64_t *gpu_reserved,
                         dqd_gpu_moves *mv);

/* The GPU part of a batch's appends, on this worker's stream: every promotion first, then the
 * appends of the GPU items among items[append_idx[0..nappend)] (single tokens that fit their
 * layer's tail in one launch per codec). Stops at the first failure (its rc set). Unless fused
 * (the attention follows on the same stream) or something failed, waits for the device. */
void dqd_tier_items_append_gpu(dqd_ctx *ctx, dqd_tier_item *items, size_t n, const size_t *append_idx, size_t nappend,
                               bool fused);
/* A host item's append (spilling its GPU layer to the host first when it says so); it->rc. */
void dqd_tier_item_append_host(dqd_ctx *ctx, dqd_tier_item *it);
/* Host bytes to reserve for a host item's append of one token (spilled to the host first or not). */
uint64_t dqd_tier_item_host_need(const dqd_tier_item *it);
/* Undoes an item's applied append in its tier; a failure means the sequence must be dropped. */
int dqd_tier_item_rollback(dqd_ctx *ctx, dqd_tier_item *it);
void dqd_tier_item_clear(dqd_tier_item *it);
/* Attention for every GPU item (items[i].gpu): q at qf + i * q_heads * head_dim, out and lse
 * likewise ([n, q_heads, head_dim] and [n, q_heads], F32, host memory); an item whose layer does
 * not exist gets zeros and -inf. Each item's rc is set. */
void dqd_tier_items_attend_gpu(dqd_ctx *ctx, dqd_tier_item *items, size_t n, uint32_t q_heads, uint32_t head_dim,
                               float scale, const float *qf, float *out, float *lse);

/* Input that came on NCCL, in device memory: the checks dq_layer_append makes, on the GPU, for
 * appends of `layers` layers of ntok tokens (as dqd_gpu_check_tokens: DQ_NONFINITE with
 * *bad_layer = UINT32_MAX, else the code of the first failing layer), or a copy to host memory. */
int dqd_tier_check_device(dqd_ctx *ctx, dqd_codec *codec, const void *k, const void *v, dq_dtype dtype, size_t layers,
                          size_t ntok, uint32_t *bad_layer);
int dqd_tier_to_host(dqd_ctx *ctx, void *dst, const void *src, size_t bytes);

/* rc: 0, or DQ_NOMEM when the moves could not be queued (the victims are then released as they
 * were, so the room was not made). */
typedef void (*dqd_moves_done_fn)(void *arg, int rc);

/* Runs the moves a GPU reservation asked for (dqd_store_gpu_reserve) on the workers — one task per
 * GPU layer of each victim, so a big sequence moves to the host in parallel — finishes mv
 * (dqd_store_gpu_moves_finish) and calls done(arg, rc) on the loop thread, possibly before
 * returning (at once when mv is empty). */
void dqd_tier_moves_run(dqd_ctx *ctx, dqd_gpu_moves *mv, dqd_moves_done_fn done, void *arg);

#endif
