/* dquantd GPU threads (see lane.h). */
#include "lane.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <uv.h>

#include "ctx.h"
#include "dquant/error.h"
#include "logging.h"

typedef struct lane_task {
    struct lane_task *next;
    dqd_task_fn fn;
    dqd_tasks_done_fn done;
    void *arg;
} lane_task;

struct dqd_lane {
    dqd_ctx *ctx;
    uv_async_t async; /* threads -> loop: tasks finished */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lane_task *head, *tail;  /* queued, in posting order */
    lane_task *fin;          /* finished, newest first */
    _Atomic uint32_t queued; /* tasks in head.., read without the lock by polling threads */
    _Atomic bool stop;
    uint64_t spin_ns;
    uint32_t nthreads;
    pthread_t *threads;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *lane_main(void *arg)
{
    dqd_lane *L = arg;
    uint64_t awake_until = 0;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        if (L->head) {
            lane_task *t = L->head;
            L->head = t->next;
            if (!L->head)
                L->tail = NULL;
            atomic_fetch_sub_explicit(&L->queued, 1, memory_order_relaxed);
            pthread_mutex_unlock(&L->mu);
            t->fn(t->arg, 0);
            pthread_mutex_lock(&L->mu);
            t->next = L->fin;
            L->fin = t;
            uv_async_send(&L->async);
            awake_until = dqd_now_ns() + L->spin_ns;
            continue;
        }
        if (atomic_load_explicit(&L->stop, memory_order_acquire))
            break;
        if (dqd_now_ns() < awake_until) {
            /* just finished a task: poll for the next one for a while instead of sleeping */
            pthread_mutex_unlock(&L->mu);
            while (!atomic_load_explicit(&L->queued, memory_order_acquire) &&
                   !atomic_load_explicit(&L->stop, memory_order_acquire) && dqd_now_ns() < awake_until)
                for (int i = 0; i < 64; i++)
                    cpu_relax();
            pthread_mutex_lock(&L->mu);
            awake_until = 0;
            continue;
        }
        pthread_cond_wait(&L->cv, &L->mu);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

static void on_finished(uv_async_t *a)
{
    dqd_lane *L = a->data;
    pthread_mutex_lock(&L->mu);
    lane_task *t = L->fin;
    L->fin = NULL;
    pthread_mutex_unlock(&L->mu);
    /* oldest first */
    lane_task *order = NULL;
    while (t) {
        lane_task *n = t->next;
        t->next = order;
        order = t;
        t = n;
    }
    dqd_ctx *ctx = L->ctx;
    while (order) {
        lane_task *n = order->next;
        ctx->tasks_inflight--;
        order->done(order->arg);
        free(order);
        order = n;
    }
    dqd_ctx_check_idle(ctx);
}

static void on_closed(uv_handle_t *h)
{
    dqd_lane *L = h->data;
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
    free(L->threads);
    free(L);
}

int dqd_lane_start(dqd_ctx *ctx, uint32_t threads, uint32_t spin_us, dqd_lane **out)
{
    *out = NULL;
    dqd_lane *L = calloc(1, sizeof *L);
    pthread_t *th = calloc(threads ? threads : 1, sizeof *th);
    if (!L || !th) {
        free(L);
        free(th);
        return DQ_NOMEM;
    }
    L->ctx = ctx;
    L->threads = th;
    L->spin_ns = (uint64_t)spin_us * 1000u;
    atomic_init(&L->queued, 0);
    atomic_init(&L->stop, false);
    if (dqd_handoff_init(ctx->loop, &L->mu, &L->cv, &L->async, on_finished) < 0) {
        free(th);
        free(L);
        return DQ_INTERNAL;
    }
    L->async.data = L;
    uv_unref((uv_handle_t *)&L->async); /* tasks keep the server busy, not this handle */
    for (uint32_t i = 0; i < threads; i++) {
        if (pthread_create(&th[i], NULL, lane_main, L) != 0) {
            DQD_WARN("cannot start GPU thread %u of %u; running with %u", i + 1, threads, i);
            break;
        }
        L->nthreads++;
    }
    if (!L->nthreads) {
        uv_close((uv_handle_t *)&L->async, on_closed);
        return DQ_INTERNAL;
    }
    *out = L;
    return DQ_OK;
}

int dqd_lane_run(dqd_lane *L, dqd_task_fn fn, dqd_tasks_done_fn done, void *arg)
{
    lane_task *t = malloc(sizeof *t);
    if (!t)
        return DQ_NOMEM;
    *t = (lane_task){NULL, fn, done, arg};
    L->ctx->tasks_inflight++;
    pthread_mutex_lock(&L->mu);
    if (L->tail)
        L->tail->next = t;
    else
        L->head = t;
    L->tail = t;
    atomic_fetch_add_explicit(&L->queued, 1, memory_order_release);
    pthread_cond_signal(&L->cv);
    pthread_mutex_unlock(&L->mu);
    return DQ_OK;
}

void dqd_lane_stop(dqd_lane *L)
{
    if (!L)
        return;
    pthread_mutex_lock(&L->mu);
    atomic_store_explicit(&L->stop, true, memory_order_release);
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    for (uint32_t i = 0; i < L->nthreads; i++)
        pthread_join(L->threads[i], NULL);
    uv_close((uv_handle_t *)&L->async, on_closed);
}
