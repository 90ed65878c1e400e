/* dquantd cuda backend: the device, per-worker streams and staging buffers, device codecs and
 * device memory (see gpu.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"
#include "logging.h"

/* Every worker thread of the pool keeps its state for the daemon's lifetime. */
static __thread dqd_gwork *tls_work;

int dqd_gcuda_fail(cudaError_t e, const char *what, const char *file, int line)
{
    (void)cudaGetLastError();
    dq_log_level level = e == cudaErrorMemoryAllocation ? DQ_LOG_WARN : DQ_LOG_ERROR;
    if (level <= dqd_log_max)
        dqd_log_write(level, file, line, "%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? DQ_NOMEM : DQ_INTERNAL;
}

int dqd_gcu_fail(int rc, const char *what, const char *file, int line)
{
    int ce = dqcu_last_cuda_error();
    (void)cudaGetLastError();
    if (rc == DQ_INTERNAL || rc == DQ_NOMEM)
        dqd_log_write(DQ_LOG_ERROR, file, line, "%s: %s (CUDA: %s)", what, dq_err_name(rc),
                      cudaGetErrorString((cudaError_t)ce));
    else if (DQ_LOG_DEBUG <= dqd_log_max)
        dqd_log_write(DQ_LOG_DEBUG, file, line, "%s: %s", what, dq_err_name(rc));
    return rc;
}

int dqd_gpu_create(const dqd_config *cfg, dqd_hostmem *mem, dqd_gpu **out, char *why, size_t whylen)
{
    *out = NULL;
    if (dqcu_device_count() == 0) {
        snprintf(why, whylen, "no CUDA device of compute capability 9.0 or newer is available");
        return DQ_UNSUPPORTED;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        count = 0;
    }
    int dev = (int)cfg->gpu_device;
    if (dev >= count) {
        snprintf(why, whylen, "gpu_device %d does not exist (%d CUDA devices)", dev, count);
        return DQ_UNSUPPORTED;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, whylen, "cannot query CUDA device %d", dev);
        return DQ_UNSUPPORTED;
    }
    if (prop.major < 9) {
        snprintf(why, whylen, "CUDA device %d (%s) has compute capability %d.%d; the kernels need 9.0", dev, prop.name,
                 prop.major, prop.minor);
        return DQ_UNSUPPORTED;
    }

    dqd_gpu *g = calloc(1, sizeof *g);
    if (!g)
        return DQ_NOMEM;
    int rc = DQ_OK;
    g->device = dev;
    g->mem = mem;
    dqcu_settings_default(&g->settings);
    g->settings.attend_kernel = (int)cfg->attend_kernel;
    g->settings.encode_kernel = (int)cfg->encode_kernel;
    g->settings.encode_schedule = cfg->encode_schedule == DQD_ENCODE_PLAIN ? DQCU_SCHEDULE_PLAIN
                                                                           : DQCU_SCHEDULE_PLANNED;
    g->hot_layout = cfg->gpu_attention_layout == DQD_GPU_LAYOUT_HOT ||
                    cfg->gpu_attention_layout == DQD_GPU_LAYOUT_HOT_ONLY;
    g->hot_only = cfg->gpu_attention_layout == DQD_GPU_LAYOUT_HOT_ONLY;
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->allocated, 0);
    atomic_init(&g->hot_windows, 0);
    atomic_init(&g->hot_bytes, 0);
    atomic_init(&g->hot_items, 0);
    atomic_init(&g->hot_only_windows, 0);
    atomic_init(&g->records_rebuilt, 0);
    atomic_init(&g->records_rebuilt_gpu, 0);
    atomic_init(&g->windows_encoded, 0);
    atomic_init(&g->host_attend_items, 0);
    atomic_init(&g->records_rebuilt_cpu, 0);
    DQD_GCK_GOTO(cudaSetDevice(dev), rc, fail);
    size_t free_b = 0, total_b = 0;
    DQD_GCK_GOTO(cudaMemGetInfo(&free_b, &total_b), rc, fail);
    /* Keep freed blocks in the device's pool instead of returning them at every synchronization. */
    cudaMemPool_t pool;
    DQD_GCK_GOTO(cudaDeviceGetDefaultMemPool(&pool, dev), rc, fail);
    uint64_t keep = UINT64_MAX;
    DQD_GCK_GOTO(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), rc, fail);
    DQD_GCK_GOTO(cudaStreamCreateWithFlags(&g->loop_stream, cudaStreamNonBlocking), rc, fail);

    g->budget = cfg->gpu_memory ? cfg->gpu_memory : (uint64_t)free_b / 10u * 8u;
    if (cfg->gpu_memory > free_b)
        DQD_WARN("gpu_memory %llu MiB exceeds the %llu MiB free on the device; allocations may fail",
                 (unsigned long long)(cfg->gpu_memory >> 20), (unsigned long long)(free_b >> 20));
    snprintf(g->desc, sizeof g->desc, "%.200s (device %d, sm_%d%d, %llu MiB free of %llu)", prop.name, dev, prop.major,
             prop.minor, (unsigned long long)(free_b >> 20), (unsigned long long)(total_b >> 20));
    *out = g;
    return DQ_OK;

fail:
    pthread_mutex_destroy(&g->mu);
    free(g);
    snprintf(why, whylen, "CUDA device %d failed to initialize: %s", dev, dq_strerror(rc));
    return rc;
}

static void gwork_free(dqd_gwork *w)
{
    cudaStreamSynchronize(w->stream);
    for (int i = 0; i < DQD_GBUF_COUNT; i++)
        if (w->buf[i])
            cudaFreeAsync(w->buf[i], w->stream);
    cudaStreamSynchronize(w->stream);
    for (int i = 0; i < 2; i++) {
        if (w->pin[i])
            cudaFreeHost(w->pin[i]);
        if (w->ev[i])
            cudaEventDestroy(w->ev[i]);
    }
    cudaStreamDestroy(w->stream);
    (void)cudaGetLastError();
    free(w);
}

void dqd_gpu_destroy(dqd_gpu *g)
{
    if (!g)
        return;
    cudaSetDevice(g->device);
    cudaStreamSynchronize(g->loop_stream);
    for (dqd_gwork *w = g->workers, *next; w; w = next) {
        next = w->next;
        gwork_free(w);
    }
    for (dqd_gcodec *c = g->codecs, *next; c; c = next) {
        next = c->next;
        dqcu_codec_free(c->dc);
        free(c);
    }
    cudaStreamDestroy(g->loop_stream);
    (void)cudaGetLastError();
    uint64_t left = atomic_load(&g->allocated);
    if (left)
        DQD_WARN("%llu bytes of GPU layers still allocated at shutdown", (unsigned long long)left);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

uint64_t dqd_gpu_budget(const dqd_gpu *g)
{
    return g->budget;
}

uint64_t dqd_gpu_allocated(const dqd_gpu *g)
{
    return atomic_load_explicit(&((dqd_gpu *)g)->allocated, memory_order_relaxed);
}

void dqd_gpu_hot_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *bytes, uint64_t *items)
{
    *items = atomic_load_explicit(&((dqd_gpu *)g)->hot_items, memory_order_relaxed);
    *windows = atomic_load_explicit(&((dqd_gpu *)g)->hot_windows, memory_order_relaxed);
    *bytes = atomic_load_explicit(&((dqd_gpu *)g)->hot_bytes, memory_order_relaxed);
}

void dqd_gpu_hot_only_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *rebuilt, uint64_t *rebuilt_gpu,
                            uint64_t *rebuilt_cpu)
{
    *windows = atomic_load_explicit(&((dqd_gpu *)g)->hot_only_windows, memory_order_relaxed);
    *rebuilt = atomic_load_explicit(&((dqd_gpu *)g)->records_rebuilt, memory_order_relaxed);
    *rebuilt_gpu = atomic_load_explicit(&((dqd_gpu *)g)->records_rebuilt_gpu, memory_order_relaxed);
    *rebuilt_cpu = atomic_load_explicit(&((dqd_gpu *)g)->records_rebuilt_cpu, memory_order_relaxed);
}

uint64_t dqd_gpu_encode_stats(const dqd_gpu *g)
{
    return atomic_load_explicit(&((dqd_gpu *)g)->windows_encoded, memory_order_relaxed);
}

uint64_t dqd_gpu_host_attend_stats(const dqd_gpu *g)
{
    return atomic_load_explicit(&((dqd_gpu *)g)->host_attend_items, memory_order_relaxed);
}

const char *dqd_gpu_describe(const dqd_gpu *g)
{
    return g->desc;
}

bool dqd_gpu_model_ok(const dqd_gpu *g, const dqd_model *m)
{
    const dq_profile *p = &m->codec->profile;
    /* Every other codec (the KVQuant++ family included) takes the host path (config.c: --backend). */
    if ((p->codec_type != DQ_CODEC_DQUANT && p->codec_type != DQ_CODEC_FIXED) || m->codec->calib ||
        m->codec->n > DQCU_MAX_ENCODE_STREAM || p->head_dim < 32 || p->head_dim > 512 || m->q_heads / m->kv_heads > 8)
        return false;
    /* D-Quant in either container format: version 2 (joint pairs) has every kernel but the
     * container attention, which runs on the host (gpustore.c codec_pairs) */
    if (p->codec_type == DQ_CODEC_DQUANT)
        return p->format_version == DQ_FORMAT_VERSION || p->format_version == DQ_FORMAT_VERSION_PAIRS;
    /* The fixed-width family has only the hot layout on the device: its sequences live there with
     * --gpu-attention-layout hot or hot-only when the hot kernel takes the model (the device codec
     * is made once per profile, here on the loop thread at the model's first request). */
    const dqcu_codec *dc;
    if (!g->hot_layout || dqd_gcodec_get((dqd_gpu *)g, m->codec, &dc) < 0)
        return false;
    return dqcu_attend_hot_check(dc, m->kv_heads) == DQ_OK && dqcu_attend_hot_check(dc, m->q_heads) == DQ_OK;
}

/* ---- workers ---- */

int dqd_gwork_get(dqd_gpu *g, dqd_gwork **out)
{
    if (tls_work && tls_work->g == g) {
        *out = tls_work;
        return DQ_OK;
    }
    dqd_gwork *w = calloc(1, sizeof *w);
    if (!w)
        return DQ_NOMEM;
    w->g = g;
    int rc = DQ_OK;
    DQD_GCK_GOTO(cudaSetDevice(g->device), rc, fail);
    DQD_GCK_GOTO(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking), rc, fail);
    for (int i = 0; i < 2; i++) {
        DQD_GCK_GOTO(cudaEventCreateWithFlags(&w->ev[i], cudaEventDisableTiming), rc, fail);
        DQD_GCK_GOTO(cudaMallocHost((void **)&w->pin[i], DQD_GPIN_BYTES), rc, fail);
    }
    pthread_mutex_lock(&g->mu);
    w->next = g->workers;
    g->workers = w;
    pthread_mutex_unlock(&g->mu);
    tls_work = w;
    *out = w;
    return DQ_OK;

fail:
    for (int i = 0; i < 2; i++) {
        if (w->pin[i])
            cudaFreeHost(w->pin[i]);
        if (w->ev[i])
            cudaEventDestroy(w->ev[i]);
    }
    if (w->stream)
        cudaStreamDestroy(w->stream);
    free(w);
    return rc;
}

void dqd_gpu_forget_codec(void *gpu, const dqd_codec *codec)
{
    dqd_gpu *g = gpu;
    pthread_mutex_lock(&g->mu);
    dqd_gcodec **pp = &g->codecs;
    while (*pp && (*pp)->codec != codec)
        pp = &(*pp)->next;
    dqd_gcodec *c = *pp;
    if (c)
        *pp = c->next;
    pthread_mutex_unlock(&g->mu);
    if (c) {
        cudaSetDevice(g->device);
        dqcu_codec_free(c->dc);
        free(c);
    }
}

int dqd_gcodec_get(dqd_gpu *g, const dqd_codec *codec, const dqcu_codec **out)
{
    int rc = DQ_OK;
    pthread_mutex_lock(&g->mu);
    dqd_gcodec *c = g->codecs;
    while (c && c->codec != codec)
        c = c->next;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) {
            rc = DQ_NOMEM;
        } else {
            /* Synchronous uploads, once per model profile. */
            rc = dqcu_codec_create_with(codec->codec, &g->settings, &c->dc);
            if (rc < 0) {
                rc = dqd_gcu_fail(rc, "dqcu_codec_create_with", __FILE__, __LINE__);
                free(c);
                c = NULL;
            } else {
                c->codec = codec;
                c->next = g->codecs;
                g->codecs = c;
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (c)
        *out = c->dc;
    return rc;
}

int dqd_gwork_buf(dqd_gwork *w, int slot, size_t bytes, void **out)
{
    if (w->buf_bytes[slot] < bytes) {
        if (w->buf[slot])
            cudaFreeAsync(w->buf[slot], w->stream);
        w->buf[slot] = NULL;
        w->buf_bytes[slot] = 0;
        size_t want = bytes < (1u << 20) ? (1u << 20) : bytes + bytes / 4;
        DQD_GCK(cudaMallocAsync(&w->buf[slot], want, w->stream));
        w->buf_bytes[slot] = want;
    }
    *out = w->buf[slot];
    return DQ_OK;
}

/* ---- device memory for layers ---- */

int dqd_gmalloc(dqd_gwork *w, size_t bytes, void **out)
{
    *out = NULL;
    DQD_GCK(cudaMallocAsync(out, bytes, w->stream));
    atomic_fetch_add_explicit(&w->g->allocated, bytes, memory_order_relaxed);
    return DQ_OK;
}

void dqd_gfree(dqd_gpu *g, cudaStream_t stream, void *p, size_t bytes)
{
    if (!p)
        return;
    cudaError_t e = cudaFreeAsync(p, stream);
    if (e != cudaSuccess)
        dqd_gcuda_fail(e, "cudaFreeAsync", __FILE__, __LINE__);
    atomic_fetch_sub_explicit(&g->allocated, bytes, memory_order_relaxed);
}

int dqd_gpu_alloc_transient(dqd_gpu *g, size_t bytes, void **out)
{
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    if (rc < 0)
        return rc;
    *out = NULL;
    DQD_GCK(cudaMallocAsync(out, bytes ? bytes : 1, w->stream));
    return dqd_gsync(w);
}

void dqd_gpu_free_transient(dqd_gpu *g, void *p)
{
    if (!p)
        return;
    cudaError_t e = cudaFreeAsync(p, g->loop_stream);
    if (e != cudaSuccess)
        dqd_gcuda_fail(e, "cudaFreeAsync", __FILE__, __LINE__);
}

/* ---- staging ---- */

uint8_t *dqd_gpin_take(dqd_gwork *w, size_t bytes, int *half)
{
    int h = w->half;
    bool fresh = w->used == 0;
    if (w->used + bytes > DQD_GPIN_BYTES) {
        h ^= 1;
        fresh = true;
    }
    if (fresh) {
        /* Everything issued from this half before is done (a never-recorded event counts as such). */
        cudaError_t e = cudaEventSynchronize(w->ev[h]);
        if (e != cudaSuccess) {
            dqd_gcuda_fail(e, "cudaEventSynchronize", __FILE__, __LINE__);
            return NULL;
        }
        w->half = h;
        w->used = 0;
    }
    uint8_t *p = w->pin[h] + w->used;
    w->used += (bytes + 255u) & ~(size_t)255u;
    *half = h;
    return p;
}

int dqd_gpin_done(dqd_gwork *w, int half)
{
    DQD_GCK(cudaEventRecord(w->ev[half], w->stream));
    return DQ_OK;
}

int dqd_gh2d(dqd_gwork *w, void *dst, const void *src, size_t bytes)
{
    for (size_t off = 0; off < bytes;) {
        size_t c = bytes - off < DQD_GPIN_BYTES ? bytes - off : DQD_GPIN_BYTES;
        int h;
        uint8_t *pin = dqd_gpin_take(w, c, &h);
        if (!pin)
            return DQ_INTERNAL;
        memcpy(pin, (const uint8_t *)src + off, c);
        DQD_GCK(cudaMemcpyAsync((uint8_t *)dst + off, pin, c, cudaMemcpyHostToDevice, w->stream));
        int rc = dqd_gpin_done(w, h);
        if (rc < 0)
            return rc;
        off += c;
    }
    return DQ_OK;
}

int dqd_gd2h(dqd_gwork *w, void *dst, const void *src, size_t bytes)
{
    /* Chunk i is copied out of its half on the host while chunk i + 1 crosses the bus. */
    size_t prev_off = 0, prev_len = 0;
    int prev_half = -1;
    const uint8_t *prev = NULL;
    for (size_t off = 0; off < bytes;) {
        size_t c = bytes - off < DQD_GPIN_BYTES ? bytes - off : DQD_GPIN_BYTES;
        int h;
        uint8_t *pin = dqd_gpin_take(w, c, &h);
        if (!pin)
            return DQ_INTERNAL;
        DQD_GCK(cudaMemcpyAsync(pin, (const uint8_t *)src + off, c, cudaMemcpyDeviceToHost, w->stream));
        int rc = dqd_gpin_done(w, h);
        if (rc < 0)
            return rc;
        if (prev) {
            DQD_GCK(cudaEventSynchronize(w->ev[prev_half]));
            memcpy((uint8_t *)dst + prev_off, prev, prev_len);
        }
        prev = pin;
        prev_half = h;
        prev_off = off;
        prev_len = c;
        off += c;
    }
    if (prev) {
        DQD_GCK(cudaEventSynchronize(w->ev[prev_half]));
        memcpy((uint8_t *)dst + prev_off, prev, prev_len);
    }
    return DQ_OK;
}

int dqd_gsync(dqd_gwork *w)
{
    DQD_GCK(cudaStreamSynchronize(w->stream));
    return DQ_OK;
}

int dqd_gpu_finish(dqd_gpu *g)
{
    dqd_gwork *w;
    int rc = dqd_gwork_get(g, &w);
    return rc < 0 ? rc : dqd_gsync(w);
}
