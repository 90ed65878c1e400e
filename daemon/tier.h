/* dquantd tiers: where each layer of a sequence lives — host memory (dq_layer, seq->layers[i]) or
 * GPU memory (dqd_glayer, seq->glayers[i]; cuda backend only) — and the operations whose work
 * depends on it. Operations call these on a (sequence, layer) and never look at the backend
 * themselves: on the cpu backend every layer is on the host and the GPU paths are never taken.
 *
 * Loop thread: dqd_tier_gpu_ok, dqd_tier_moves_run, dqd_tier_free_device. Worker threads (the
 * caller holds the access the operation needs): the rest. */
#ifndef DQD_TIER_H
#define DQD_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/types.h"
#include "store.h"

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

/* rc: 0, or DQ_NOMEM when the moves could not be queued (the victims are then released as they
 * were, so the room was not made). */
typedef void (*dqd_moves_done_fn)(void *arg, int rc);

/* Runs the moves a GPU reservation asked for (dqd_store_gpu_reserve) on the workers — one task per
 * GPU layer of each victim, so a big sequence moves to the host in parallel — finishes mv
 * (dqd_store_gpu_moves_finish) and calls done(arg, rc) on the loop thread, possibly before
 * returning (at once when mv is empty). */
void dqd_tier_moves_run(dqd_ctx *ctx, dqd_gpu_moves *mv, dqd_moves_done_fn done, void *arg);

#endif
