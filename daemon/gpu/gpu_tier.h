/* dquantd GPU tier on the loop thread: runs the moves a GPU reservation asked for
 * (dqd_store_gpu_reserve) on the workers — one task per GPU layer of each victim, so a big
 * sequence moves to the host in parallel — then settles them in the store and lets the operation
 * that needed the room continue. */
#ifndef DQD_GPU_TIER_H
#define DQD_GPU_TIER_H

#include "store.h"

typedef struct dqd_ctx dqd_ctx;

/* rc: 0, or DQ_NOMEM when the moves could not be queued (the victims are then released as they
 * were, so the room was not made). */
typedef void (*dqd_moves_done_fn)(void *arg, int rc);

/* Moves every victim in mv to the host, finishes mv (dqd_store_gpu_moves_finish) and calls
 * done(arg, rc) on the loop thread, possibly before returning (at once when mv is empty). */
void dqd_gpu_moves_run(dqd_ctx *ctx, dqd_gpu_moves *mv, dqd_moves_done_fn done, void *arg);

#endif
