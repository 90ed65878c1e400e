/* dquantd context (see ctx.h). */
#include "ctx.h"

#include <assert.h>
#include <string.h>

#include "dquant/error.h"
#include "dquant/version.h"
#include "gpu.h"
#include "logging.h"

#ifndef DQD_VERSION
#define DQD_VERSION DQ_VERSION_STRING
#endif

uint64_t dqd_now_ns(void)
{
    return uv_hrtime();
}

int dqd_handoff_init(uv_loop_t *loop, pthread_mutex_t *mu, pthread_cond_t *cv, uv_async_t *async, uv_async_cb cb)
{
    pthread_mutex_init(mu, NULL);
    pthread_cond_init(cv, NULL);
    if (uv_async_init(loop, async, cb) < 0) {
        pthread_mutex_destroy(mu);
        pthread_cond_destroy(cv);
        return -1;
    }
    return 0;
}

int dqd_ctx_init(dqd_ctx *ctx, uv_loop_t *loop, const dqd_config *cfg)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->loop = loop;
    ctx->cfg = cfg;
    ctx->start_ns = dqd_now_ns();
    dqd_limits_default(&ctx->limits);
    ctx->limits.max_payload = cfg->max_payload;
    ctx->limits.max_batch_items = cfg->max_batch_items;
    ctx->limits.max_lookup_keys = cfg->max_lookup_keys;
    ctx->limits.max_lease_ms = cfg->max_lease_ms;
    ctx->limits.max_calibration = cfg->max_calibration;
    ctx->frame_limits.max_header = (uint32_t)cfg->max_header;
    ctx->frame_limits.max_payload = cfg->max_payload;
    dqd_hostmem_init(&ctx->mem);
    dqd_metrics_init(&ctx->metrics);
    dqd_leases_init(&ctx->leases);
    ctx->metrics.leases = &ctx->leases;
    dqd_framebufs_init(&ctx->frames, cfg->frame_cache);
    dqd_iomem_init(&ctx->iomem, cfg->max_io_memory);
    dqd_authlimit_init(&ctx->auth, cfg->auth_fail_burst, cfg->auth_fail_per_min);

    int rc = dqd_registry_create(&ctx->mem, cfg->max_models, &ctx->reg);
    if (rc < 0)
        return rc;
    dqd_registry_set_client_limit(ctx->reg, cfg->max_models_per_client);
    rc = dqd_store_create(&ctx->mem, cfg->host_memory, &ctx->store);
    if (rc < 0) {
        dqd_registry_destroy(ctx->reg);
        ctx->reg = NULL;
        return rc;
    }

    ctx->backend_name = "cpu";
    if (cfg->backend == DQD_BACKEND_CUDA) {
        char why[256] = "";
        rc = dqd_gpu_create(cfg, &ctx->mem, &ctx->gpu, why, sizeof why);
        if (rc == DQ_OK) {
            ctx->backend_name = "cuda";
            dqd_store_gpu_enable(ctx->store, dqd_gpu_budget(ctx->gpu), dqd_gpu_free_seq_layers, ctx->gpu);
            dqd_registry_on_codec_free(ctx->reg, dqd_gpu_forget_codec, ctx->gpu);
            DQD_INFO("backend cuda: %s; GPU budget %llu MiB", dqd_gpu_describe(ctx->gpu),
                     (unsigned long long)(dqd_gpu_budget(ctx->gpu) >> 20));
        } else {
            DQD_WARN("backend cuda requested, but %s; using cpu", why);
        }
    }
    return DQ_OK;
}

void dqd_ctx_destroy(dqd_ctx *ctx)
{
    /* The store frees its GPU layers through the backend, which goes before the codecs. */
    dqd_leases_destroy(&ctx->leases);
    dqd_store_destroy(ctx->store);
    dqd_gpu_destroy(ctx->gpu);
    dqd_registry_destroy(ctx->reg);
    ctx->store = NULL;
    ctx->gpu = NULL;
    ctx->reg = NULL;
    dqd_framebufs_destroy(&ctx->frames);
    /* Every counted host byte (codecs, layers, sequences) has come back. */
    assert(dqd_hostmem_used(&ctx->mem) == 0);
}

void dqd_ctx_check_idle(dqd_ctx *ctx)
{
    if (ctx->on_idle)
        ctx->on_idle(ctx->idle_arg);
}

void dqd_ctx_gauges(const dqd_ctx *ctx, dqd_gauges *g)
{
    dqd_store_get_stats(ctx->store, &g->store);
    g->gpu_allocated = ctx->gpu ? dqd_gpu_allocated(ctx->gpu) : 0;
    g->gpu_hot_windows = g->gpu_hot_bytes = g->gpu_hot_attend_items = 0;
    g->gpu_hot_only_windows = g->gpu_records_rebuilt = g->gpu_records_rebuilt_gpu = g->gpu_records_rebuilt_cpu = 0;
    g->gpu_windows_encoded = ctx->gpu ? dqd_gpu_encode_stats(ctx->gpu) : 0;
    g->gpu_host_attend_items = ctx->gpu ? dqd_gpu_host_attend_stats(ctx->gpu) : 0;
    if (ctx->gpu) {
        dqd_gpu_hot_stats(ctx->gpu, &g->gpu_hot_windows, &g->gpu_hot_bytes, &g->gpu_hot_attend_items);
        dqd_gpu_hot_only_stats(ctx->gpu, &g->gpu_hot_only_windows, &g->gpu_records_rebuilt, &g->gpu_records_rebuilt_gpu,
                               &g->gpu_records_rebuilt_cpu);
    }
    g->models = dqd_registry_model_count(ctx->reg);
    g->inflight_requests = ctx->reqs_inflight;
    dqd_framebufs_stats((dqd_framebufs *)&ctx->frames, &g->frame_cache_bytes, &g->frame_buffers_reused,
                        &g->frame_buffers_fresh);
    g->io_used = ctx->iomem.used;
    g->io_limit = ctx->iomem.limit;
    g->io_peak = ctx->iomem.peak;
    g->io_waits = ctx->iomem.waits;
    g->io_refused = ctx->iomem.refused;
    g->workers = ctx->cfg->workers;
    g->uptime_seconds = (double)(dqd_now_ns() - ctx->start_ns) * 1e-9;
    g->backend = ctx->backend_name;
    g->version = DQD_VERSION;
}
