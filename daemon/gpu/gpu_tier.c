/* dquantd GPU tier moves (see gpu_tier.h). */
#include "gpu_tier.h"

#include <stdlib.h>

#include "ctx.h"
#include "dquant/error.h"
#include "gpu.h"
#include "work.h"

typedef struct move_job {
    size_t victim;
    uint32_t layer;
    int rc;
} move_job;

typedef struct moves_run {
    dqd_ctx *ctx;
    dqd_gpu_moves *mv;
    move_job *jobs;
    size_t njobs;
    dqd_moves_done_fn done;
    void *arg;
} moves_run;

static void move_task(void *arg, size_t i)
{
    moves_run *r = arg;
    move_job *j = &r->jobs[i];
    dqd_seq *seq = r->mv->seqs[j->victim];
    /* The victim is held exclusively, so its layers are this task's alone. */
    j->rc = dqd_gpu_demote(r->ctx->gpu, seq->model->codec, &seq->glayers[j->layer], &seq->layers[j->layer]);
}

static void moves_done(void *arg)
{
    moves_run *r = arg;
    dqd_gpu_moves *mv = r->mv;
    for (size_t v = 0; v < mv->n; v++)
        mv->rc[v] = 0;
    for (size_t i = 0; i < r->njobs; i++)
        if (r->jobs[i].rc < 0 && mv->rc[r->jobs[i].victim] == 0)
            mv->rc[r->jobs[i].victim] = r->jobs[i].rc;
    dqd_store_gpu_moves_finish(r->ctx->store, mv);
    dqd_moves_done_fn done = r->done;
    void *dctx = r->arg;
    free(r->jobs);
    free(r);
    done(dctx, DQ_OK);
}

void dqd_gpu_moves_run(dqd_ctx *ctx, dqd_gpu_moves *mv, dqd_moves_done_fn done, void *arg)
{
    if (!mv->n) {
        done(arg, DQ_OK);
        return;
    }
    size_t njobs = 0;
    for (size_t v = 0; v < mv->n; v++)
        for (uint32_t l = 0; l < mv->seqs[v]->model->layers; l++)
            njobs += dqd_seq_glayer(mv->seqs[v], l) != NULL;
    moves_run *r = calloc(1, sizeof *r);
    move_job *jobs = calloc(njobs ? njobs : 1, sizeof *jobs);
    if (!r || !jobs) {
        free(r);
        free(jobs);
        dqd_store_gpu_moves_finish(ctx->store, mv);
        done(arg, DQ_NOMEM);
        return;
    }
    size_t k = 0;
    for (size_t v = 0; v < mv->n; v++)
        for (uint32_t l = 0; l < mv->seqs[v]->model->layers; l++)
            if (dqd_seq_glayer(mv->seqs[v], l))
                jobs[k++] = (move_job){v, l, 0};
    *r = (moves_run){ctx, mv, jobs, njobs, done, arg};
    if (!njobs) {
        moves_done(r);
        return;
    }
    if (dqd_tasks_run(ctx, njobs, move_task, moves_done, r) < 0) {
        free(jobs);
        free(r);
        dqd_store_gpu_moves_finish(ctx->store, mv);
        done(arg, DQ_NOMEM);
    }
}
