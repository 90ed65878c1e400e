/* dquantd worker pool (see work.h). */
#include "work.h"

#include <stdlib.h>
#include <uv.h>

#include "ctx.h"
#include "dquant/error.h"
#include "logging.h"

typedef struct task_group task_group;

typedef struct task_slot {
    uv_work_t work;
    task_group *group;
    size_t index;
} task_slot;

struct task_group {
    dqd_ctx *ctx;
    dqd_task_fn fn;
    dqd_tasks_done_fn done;
    void *arg;
    size_t left;
    task_slot slots[];
};

static void on_work(uv_work_t *w)
{
    task_slot *slot = w->data;
    slot->group->fn(slot->group->arg, slot->index);
}

static void on_after_work(uv_work_t *w, int status)
{
    task_slot *slot = w->data;
    task_group *g = slot->group;
    /* status is UV_ECANCELED only for uv_cancel, which the daemon never calls. */
    if (status < 0)
        DQD_ERROR("worker task failed to run: %s", uv_strerror(status));
    g->ctx->tasks_inflight--;
    if (--g->left)
        return;
    dqd_ctx *ctx = g->ctx;
    g->done(g->arg);
    free(g);
    dqd_ctx_check_idle(ctx);
}

int dqd_tasks_run(dqd_ctx *ctx, size_t n, dqd_task_fn fn, dqd_tasks_done_fn done, void *arg)
{
    if (n == 0 || n > SIZE_MAX / sizeof(task_slot) - 1)
        return DQ_INVALID_ARGUMENT;
    task_group *g = malloc(sizeof *g + n * sizeof(task_slot));
    if (!g)
        return DQ_NOMEM;
    g->ctx = ctx;
    g->fn = fn;
    g->done = done;
    g->arg = arg;
    g->left = n;
    for (size_t i = 0; i < n; i++) {
        task_slot *s = &g->slots[i];
        s->group = g;
        s->index = i;
        s->work.data = s;
        ctx->tasks_inflight++;
        int rc = uv_queue_work(ctx->loop, &s->work, on_work, on_after_work);
        if (rc < 0) {
            /* Only invalid arguments make uv_queue_work fail; run the task here rather than lose it. */
            DQD_ERROR("uv_queue_work: %s", uv_strerror(rc));
            on_work(&s->work);
            ctx->tasks_inflight--;
            if (--g->left == 0) {
                g->done(g->arg);
                free(g);
                return DQ_OK;
            }
        }
    }
    return DQ_OK;
}

size_t dqd_tasks_split(const dqd_ctx *ctx, size_t n)
{
    size_t cap = (size_t)ctx->cfg->workers * 2;
    if (cap < 1)
        cap = 1;
    return n < cap ? (n ? n : 1) : cap;
}
