/* dquantd worker pool: codec work (encode, decode, attention, copies) runs as tasks on libuv's
 * thread pool, sized to the configured worker count; the loop thread never encodes.
 *
 * dqd_tasks_run runs fn(arg, 0..n-1) on the workers, in any order and concurrently, then done(arg)
 * once on the loop thread after the last one. Tasks already queued always run to completion, so a
 * request whose client has vanished still finishes and only its reply is dropped. */
#ifndef DQD_WORK_H
#define DQD_WORK_H

#include <stddef.h>

typedef struct dqd_ctx dqd_ctx;

typedef void (*dqd_task_fn)(void *arg, size_t index);
typedef void (*dqd_tasks_done_fn)(void *arg);

/* Returns 0, or DQ_NOMEM (nothing queued, done not called). n must be >= 1. */
int dqd_tasks_run(dqd_ctx *ctx, size_t n, dqd_task_fn fn, dqd_tasks_done_fn done, void *arg);

/* How many tasks to split n independent units into: at most 2 per worker, at least 1. */
size_t dqd_tasks_split(const dqd_ctx *ctx, size_t n);

#endif
