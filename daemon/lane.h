/* dquantd GPU threads: a few threads of their own for short GPU tasks that follow one another, such
 * as the 36 ATTEND calls of a decode step whose items are all on the GPU.
 *
 * libuv's pool wakes a sleeping worker for every task (~45 µs on the H200 host between the loop
 * handing an ATTEND over and its GPU task starting: tests/bench/GPU_NOTES.md, session 4). A GPU
 * thread that has just finished a task keeps polling for the next one for spin_us (a decode step's
 * calls come ~150 µs apart) before it sleeps, so the next call finds it awake. Each thread has its
 * own CUDA stream and staging (gpu.h: per-thread work state), so tasks of different requests still
 * overlap on the device when several threads are busy.
 *
 * dqd_lane_run runs fn(arg, 0) on one of the threads, then done(arg) on the loop thread; the task
 * counts in ctx->tasks_inflight like a pool task. Loop thread only, except the threads' own work. */
#ifndef DQD_LANE_H
#define DQD_LANE_H

#include <stdint.h>

#include "work.h"

typedef struct dqd_lane dqd_lane;

/* Starts threads (>= 1) on ctx's loop. Returns 0, DQ_NOMEM or DQ_INTERNAL (nothing started). */
int dqd_lane_start(dqd_ctx *ctx, uint32_t threads, uint32_t spin_us, dqd_lane **out);
/* Returns 0 or DQ_NOMEM (nothing queued, done not called). */
int dqd_lane_run(dqd_lane *lane, dqd_task_fn fn, dqd_tasks_done_fn done, void *arg);
/* Stops and joins the threads (no task may be queued or running: the server is idle) and closes the
 * loop handle; the lane is freed once the loop has closed it. NULL is a no-op. */
void dqd_lane_stop(dqd_lane *lane);

#endif
