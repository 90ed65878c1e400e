/* A CPU emulation of the CUDA runtime subset in cuda_runtime_api.h (next to this file) and of
 * libdquant-cuda's API (cuda/include/dquant/cuda.h, computed with libdquant), so that dquantd's
 * cuda backend and the GPU end-to-end program run, and are tested, on machines without a GPU.
 *
 * It is deliberately strict, as a slow GPU would be:
 *   - Work issued on a stream (copies into or out of pinned memory, device-to-device copies,
 *     memsets, "kernels", frees) runs only when the host waits for it (cudaStreamSynchronize,
 *     cudaEventSynchronize on an event recorded after it, cudaDeviceSynchronize) or asks whether
 *     it is done (cudaStreamQuery, cudaEventQuery), so a missing synchronization shows as stale
 *     data. The fake NCCL (fake_nccl.c) puts items on streams that wait for its transfers: the
 *     queries answer cudaErrorNotReady while one of those is pending, the waits block on it. Copies from pageable host memory read it at the call
 *     and copies to pageable host memory complete before returning, as in CUDA.
 *   - Device memory is host memory filled with 0xA5 when allocated, tracked in a registry: every
 *     device pointer a copy or kernel touches must lie in a live device allocation when the work
 *     runs, else the process aborts with a message (use after free, host pointers passed as
 *     device ones, out-of-bounds ranges).
 *   - Device memory is limited (DQCU_FAKE_MEM bytes, default 4G: cudaMallocAsync then fails
 *     with cudaErrorMemoryAllocation) and must all be freed at exit, pinned memory too: a leak
 *     makes the process exit with status 99 (DQCU_FAKE_NO_LEAKCHECK=1 disables the check).
 *   - DQCU_FAKE_DEVICES (default 1) is what dqcu_device_count() returns.
 *   - DQCU_FAKE_HOT_MAX_TOKENS (default: no limit): dqcu_attend_hot refuses (DQ_UNSUPPORTED, and
 *     its workspace size is 0) a launch of more tokens per sequence, as the real one refuses a
 *     launch whose plan exceeds its grid limits although dqcu_attend_hot_check passed.
 * The "kernels" produce what libdquant produces (dq_window_encode, dq_tokens_decode, dq_attend on a
 * layer rebuilt from the records, dq_hot_transcode, dq_hot_attend), which is what the real kernels
 * are checked against. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_runtime_api.h"
#include "fake_internal.h"
#include "dquant/attention.h"
#include "dquant/codec.h"
#include "dquant/cuda.h"
#include "dquant/hot.h"
#include "dquant/layer.h"

/* ---- registry of device and pinned allocations ---- */

typedef struct block {
    uint8_t *base;
    size_t size;
    bool pinned;
    int device; /* the allocating thread's current device (cudaPointerGetAttributes) */
} block;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block *blocks; /* sorted by base */
static size_t nblocks, capblocks;
static size_t dev_used, dev_cap;
static bool leakcheck_armed;
static __thread cudaError_t last_error;
static __thread int last_dqcu_error;
static __thread int current_device;

typedef struct fop {
    struct fop *next;
    uint64_t seq;
    void (*run)(void *arg);
    void *arg;
    bool (*ready)(void *arg); /* NULL: can run at any time; else run blocks until ready says so */
} fop;

struct CUstream_st {
    fop *head, *tail;
    uint64_t enq;
    struct CUstream_st *next_all;
};

struct CUevent_st {
    cudaStream_t stream;
    uint64_t seq;
};

static struct CUstream_st default_stream;
static struct CUstream_st *all_streams = &default_stream;

#define FAIL(...)                                   \
    do {                                            \
        fprintf(stderr, "fake CUDA: " __VA_ARGS__); \
        fputc('\n', stderr);                        \
        abort();                                    \
    } while (0)

static cudaError_t err(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

static void leak_check(void)
{
    if (getenv("DQCU_FAKE_NO_LEAKCHECK"))
        return;
    pthread_mutex_lock(&mu);
    size_t n = nblocks, bytes = 0, pinned = 0;
    for (size_t i = 0; i < nblocks; i++) {
        bytes += blocks[i].size;
        pinned += blocks[i].pinned;
    }
    pthread_mutex_unlock(&mu);
    if (n) {
        fprintf(stderr, "fake CUDA: %zu allocations (%zu pinned, %zu bytes) not freed at exit\n", n, pinned, bytes);
        _exit(99);
    }
}

static size_t find_index(const uint8_t *p)
{
    /* first block with base > p */
    size_t lo = 0, hi = nblocks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The block holding [p, p + n), or NULL. Caller holds mu. */
static block *lookup(const void *p, size_t n)
{
    size_t i = find_index(p);
    if (i == 0)
        return NULL;
    block *b = &blocks[i - 1];
    const uint8_t *q = p;
    if (q >= b->base && q - b->base <= (ptrdiff_t)b->size && n <= b->size - (size_t)(q - b->base))
        return b;
    return NULL;
}

static int kind_of(const void *p)
{
    pthread_mutex_lock(&mu);
    block *b = lookup(p, 1);
    int k = b ? (b->pinned ? 1 : 2) : 0; /* 0 pageable host, 1 pinned host, 2 device */
    pthread_mutex_unlock(&mu);
    return k;
}

static void check_dev(const void *p, size_t n, const char *what)
{
    if (n == 0)
        return;
    pthread_mutex_lock(&mu);
    block *b = lookup(p, n);
    bool ok = b && !b->pinned;
    pthread_mutex_unlock(&mu);
    if (!ok)
        FAIL("%s: [%p, +%zu) is not inside a live device allocation", what, p, n);
}

static void add_block(void *p, size_t size, bool pinned)
{
    pthread_mutex_lock(&mu);
    if (!leakcheck_armed) {
        leakcheck_armed = true;
        atexit(leak_check);
    }
    if (nblocks == capblocks) {
        capblocks = capblocks ? capblocks * 2 : 256;
        blocks = realloc(blocks, capblocks * sizeof *blocks);
        if (!blocks)
            FAIL("out of host memory");
    }
    size_t i = find_index(p);
    memmove(&blocks[i + 1], &blocks[i], (nblocks - i) * sizeof *blocks);
    blocks[i] = (block){p, size, pinned, current_device};
    nblocks++;
    if (!pinned)
        dev_used += size;
    pthread_mutex_unlock(&mu);
}

static void remove_block(void *p, bool pinned, const char *what)
{
    pthread_mutex_lock(&mu);
    size_t i = find_index(p);
    if (i == 0 || blocks[i - 1].base != p || blocks[i - 1].pinned != pinned) {
        pthread_mutex_unlock(&mu);
        FAIL("%s(%p): not the start of a live %s allocation", what, p, pinned ? "pinned" : "device");
    }
    if (!pinned)
        dev_used -= blocks[i - 1].size;
    memmove(&blocks[i - 1], &blocks[i], (nblocks - i) * sizeof *blocks);
    nblocks--;
    pthread_mutex_unlock(&mu);
    free(p);
}

static size_t capacity(void)
{
    if (!dev_cap) {
        const char *e = getenv("DQCU_FAKE_MEM");
        dev_cap = e ? (size_t)strtoull(e, NULL, 0) : (size_t)4 << 30;
    }
    return dev_cap;
}

/* ---- streams ---- */

static cudaStream_t S(cudaStream_t s)
{
    return s ? s : &default_stream;
}

static void enqueue_wait(cudaStream_t s, void (*run)(void *), void *arg, bool (*ready)(void *))
{
    s = S(s);
    fop *op = malloc(sizeof *op);
    if (!op)
        FAIL("out of host memory");
    pthread_mutex_lock(&mu);
    op->next = NULL;
    op->seq = ++s->enq;
    op->run = run;
    op->arg = arg;
    op->ready = ready;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_mutex_unlock(&mu);
}

static void enqueue(cudaStream_t s, void (*run)(void *), void *arg)
{
    enqueue_wait(s, run, arg, NULL);
}

/* Runs the stream's work issued up to sequence number upto. */
static void drain(cudaStream_t s, uint64_t upto)
{
    s = S(s);
    for (;;) {
        pthread_mutex_lock(&mu);
        fop *op = s->head;
        if (!op || op->seq > upto) {
            pthread_mutex_unlock(&mu);
            return;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&mu);
        op->run(op->arg);
        free(op);
    }
}

/* What a query sees: runs the stream's work issued up to upto as far as it can without blocking.
 * False when an item waits for something not done yet (an NCCL transfer). ready() is called with
 * mu held: it may only take locks of its own. */
static bool advance(cudaStream_t s, uint64_t upto)
{
    s = S(s);
    for (;;) {
        pthread_mutex_lock(&mu);
        fop *op = s->head;
        if (!op || op->seq > upto) {
            pthread_mutex_unlock(&mu);
            return true;
        }
        if (op->ready && !op->ready(op->arg)) {
            pthread_mutex_unlock(&mu);
            return false;
        }
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&mu);
        op->run(op->arg);
        free(op);
    }
}

static bool idle(cudaStream_t s)
{
    pthread_mutex_lock(&mu);
    bool r = S(s)->head == NULL;
    pthread_mutex_unlock(&mu);
    return r;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return err(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&mu);
    s->next_all = all_streams;
    all_streams = s;
    pthread_mutex_unlock(&mu);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    drain(stream, UINT64_MAX);
    return cudaSuccess;
}

/* cudaErrorNotReady is an answer, not an error: it does not become the last error. */
cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return advance(stream, UINT64_MAX) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (!stream)
        return err(cudaErrorInvalidValue);
    drain(stream, UINT64_MAX);
    pthread_mutex_lock(&mu);
    for (struct CUstream_st **pp = &all_streams; *pp; pp = &(*pp)->next_all) {
        if (*pp == stream) {
            *pp = stream->next_all;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    for (;;) {
        pthread_mutex_lock(&mu);
        struct CUstream_st *busy = NULL;
        for (struct CUstream_st *s = all_streams; s && !busy; s = s->next_all)
            if (s->head)
                busy = s;
        pthread_mutex_unlock(&mu);
        if (!busy)
            return cudaSuccess;
        drain(busy, UINT64_MAX);
    }
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    *event = calloc(1, sizeof **event);
    return *event ? cudaSuccess : err(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    pthread_mutex_lock(&mu);
    event->stream = S(stream);
    event->seq = S(stream)->enq;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    if (event->stream)
        drain(event->stream, event->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (!event->stream)
        return cudaSuccess;
    return advance(event->stream, event->seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

/* ---- device ---- */

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    return last_error;
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorNotReady:
        return "device not ready";
    }
    return "unknown error";
}

static int fake_devices(void)
{
    const char *e = getenv("DQCU_FAKE_DEVICES");
    return e ? atoi(e) : 1;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = fake_devices();
    return *count ? cudaSuccess : err(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device < 0 || device >= fake_devices())
        return err(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "fake GPU (CPU emulation)");
    prop->totalGlobalMem = capacity();
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 4;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= fake_devices())
        return err(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total)
{
    pthread_mutex_lock(&mu);
    size_t cap = capacity();
    *total = cap;
    *free_b = dev_used < cap ? cap - dev_used : 0;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

static struct CUmemPoolHandle_st {
    int unused;
} the_pool;

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    (void)device;
    *pool = &the_pool;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value)
{
    (void)pool;
    (void)value;
    return attr == cudaMemPoolAttrReleaseThreshold ? cudaSuccess : err(cudaErrorInvalidValue);
}

/* ---- memory ---- */

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream)
{
    (void)stream;
    *ptr = NULL;
    if (size == 0)
        return cudaSuccess;
    pthread_mutex_lock(&mu);
    bool room = dev_used + size <= capacity();
    pthread_mutex_unlock(&mu);
    if (!room)
        return err(cudaErrorMemoryAllocation);
    void *p = malloc(size);
    if (!p)
        return err(cudaErrorMemoryAllocation);
    memset(p, 0xa5, size);
    add_block(p, size, false);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size)
{
    return cudaMallocAsync(ptr, size, NULL);
}

static void run_free(void *p)
{
    remove_block(p, false, "cudaFreeAsync");
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream)
{
    if (!ptr)
        return cudaSuccess;
    if (kind_of(ptr) != 2)
        FAIL("cudaFreeAsync(%p): not device memory", ptr);
    /* An idle stream frees at once, as the GPU would; else after the work before it. */
    if (idle(stream))
        run_free(ptr);
    else
        enqueue(stream, run_free, ptr);
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    cudaDeviceSynchronize();
    remove_block(ptr, false, "cudaFree");
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p)
        return err(cudaErrorMemoryAllocation);
    add_block(p, size ? size : 1, true);
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (ptr)
        remove_block(ptr, true, "cudaFreeHost");
    return cudaSuccess;
}

typedef struct copy_arg {
    void *dst;
    const void *src;
    size_t n;
    int dst_dev, src_dev;
    void *owned; /* snapshot of a pageable source */
} copy_arg;

static void run_copy(void *a_)
{
    copy_arg *a = a_;
    if (a->dst_dev)
        check_dev(a->dst, a->n, "copy destination");
    if (a->src_dev)
        check_dev(a->src, a->n, "copy source");
    memmove(a->dst, a->src, a->n);
    free(a->owned);
    free(a);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    if (count == 0)
        return cudaSuccess;
    int dk = kind_of(dst), sk = kind_of(src);
    bool ddev = dk == 2, sdev = sk == 2;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        if (!ddev || sdev)
            FAIL("cudaMemcpyAsync HostToDevice with dst %p (%s), src %p (%s)", dst, ddev ? "device" : "host", src,
                 sdev ? "device" : "host");
        break;
    case cudaMemcpyDeviceToHost:
        if (ddev || !sdev)
            FAIL("cudaMemcpyAsync DeviceToHost with dst %p (%s), src %p (%s)", dst, ddev ? "device" : "host", src,
                 sdev ? "device" : "host");
        break;
    case cudaMemcpyDeviceToDevice:
        if (!ddev || !sdev)
            FAIL("cudaMemcpyAsync DeviceToDevice with dst %p (%s), src %p (%s)", dst, ddev ? "device" : "host", src,
                 sdev ? "device" : "host");
        break;
    case cudaMemcpyHostToHost:
        if (ddev || sdev)
            FAIL("cudaMemcpyAsync HostToHost with device memory");
        break;
    case cudaMemcpyDefault:
        break;
    }
    if (ddev)
        check_dev(dst, count, "cudaMemcpyAsync destination");
    if (sdev)
        check_dev(src, count, "cudaMemcpyAsync source");
    copy_arg *a = calloc(1, sizeof *a);
    if (!a)
        return err(cudaErrorMemoryAllocation);
    *a = (copy_arg){dst, src, count, ddev, sdev, NULL};
    if (!sdev && sk == 0) {
        /* pageable source: read now */
        a->owned = malloc(count);
        if (!a->owned) {
            free(a);
            return err(cudaErrorMemoryAllocation);
        }
        memcpy(a->owned, src, count);
        a->src = a->owned;
    }
    enqueue(stream, run_copy, a);
    if (!ddev && dk == 0) /* pageable destination: complete before returning */
        drain(stream, UINT64_MAX);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    cudaError_t e = cudaMemcpyAsync(dst, src, count, kind, NULL);
    drain(NULL, UINT64_MAX);
    return e;
}

typedef struct set_arg {
    void *p;
    int v;
    size_t n;
} set_arg;

static void run_set(void *a_)
{
    set_arg *a = a_;
    check_dev(a->p, a->n, "cudaMemsetAsync");
    memset(a->p, a->v, a->n);
    free(a);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream)
{
    if (!count)
        return cudaSuccess;
    check_dev(ptr, count, "cudaMemsetAsync");
    set_arg *a = malloc(sizeof *a);
    if (!a)
        return err(cudaErrorMemoryAllocation);
    *a = (set_arg){ptr, value, count};
    enqueue(stream, run_set, a);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t count)
{
    cudaError_t e = cudaMemsetAsync(ptr, value, count, NULL);
    drain(NULL, UINT64_MAX);
    return e;
}

/* As CUDA 11+: memory the runtime does not know is cudaMemoryTypeUnregistered, not an error. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    if (!attributes)
        return err(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    block *b = ptr ? lookup(ptr, 1) : NULL;
    *attributes = (struct cudaPointerAttributes){cudaMemoryTypeUnregistered, -2, NULL, (void *)ptr};
    if (b) {
        attributes->type = b->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
        attributes->device = b->device;
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = b->pinned ? (void *)ptr : NULL;
    }
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* ---- for fake_nccl.c (fake_internal.h) ---- */

void dq_fake_stream_flush(cudaStream_t stream)
{
    drain(stream, UINT64_MAX);
}

void dq_fake_stream_wait(cudaStream_t stream, bool (*ready)(void *arg), void (*run)(void *arg), void *arg)
{
    enqueue_wait(stream, run, arg, ready);
}

void dq_fake_check_dev(const void *p, size_t n, const char *what)
{
    check_dev(p, n, what);
}

/* ---- libdquant-cuda ---- */

struct dqcu_codec {
    dq_profile profile;
    dqcu_settings settings;
    dq_codec *codec;
    uint32_t n, W, R, d;
    size_t wb;
    bool fixed; /* a fixed-width profile: the encoders and the hot layout only */
    bool pairs; /* format version 2: container attention as v7 takes it (fake_attends) */
};

int dqcu_device_count(void)
{
    return fake_devices();
}

int dqcu_last_cuda_error(void)
{
    return last_dqcu_error;
}

/* the versions libdquant-cuda registers (attend_cuda.cu, encode_cuda.cu) */
static const int fake_attend_versions[] = {7, 5, 3};
static const int fake_encode_versions[] = {5, 4};

void dqcu_settings_default(dqcu_settings *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->size = sizeof *s;
}

const int *dqcu_attend_kernels(size_t *count)
{
    if (count)
        *count = sizeof fake_attend_versions / sizeof fake_attend_versions[0];
    return fake_attend_versions;
}

const int *dqcu_encode_kernels(size_t *count)
{
    if (count)
        *count = sizeof fake_encode_versions / sizeof fake_encode_versions[0];
    return fake_encode_versions;
}

static bool fake_version_ok(int v, const int *list, size_t count)
{
    if (v == DQCU_KERNEL_AUTO)
        return true;
    for (size_t i = 0; i < count; i++)
        if (list[i] == v)
            return true;
    return false;
}

/* what the library checks (codec_cuda.cu settings_ok) */
static bool fake_settings_ok(const dqcu_settings *s)
{
    if (s->size != sizeof *s)
        return false;
    for (size_t i = 0; i < sizeof s->reserved / sizeof s->reserved[0]; i++)
        if (s->reserved[i])
            return false;
    size_t na = 0, ne = 0;
    const int *att = dqcu_attend_kernels(&na), *enc = dqcu_encode_kernels(&ne);
    return fake_version_ok(s->attend_kernel, att, na) && fake_version_ok(s->encode_kernel, enc, ne) &&
           (s->encode_schedule == DQCU_SCHEDULE_PLANNED || s->encode_schedule == DQCU_SCHEDULE_PLAIN);
}

int dqcu_codec_create(const dq_codec *codec, dqcu_codec **out)
{
    return dqcu_codec_create_with(codec, NULL, out);
}

int dqcu_codec_create_with(const dq_codec *codec, const dqcu_settings *settings, dqcu_codec **out)
{
    if (!codec || !out)
        return DQ_INVALID_ARGUMENT;
    *out = NULL;
    if (settings && !fake_settings_ok(settings))
        return DQ_INVALID_ARGUMENT;
    const dq_profile *p = dq_codec_profile(codec);
    /* D-Quant, and the fixed-width family (encoders and the hot layout), as the real library */
    if (p->codec_type != DQ_CODEC_DQUANT && p->codec_type != DQ_CODEC_FIXED)
        return DQ_INVALID_ARGUMENT;
    if (p->format_version != DQ_FORMAT_VERSION && p->format_version != DQ_FORMAT_VERSION_PAIRS)
        return DQ_UNSUPPORTED;
    dqcu_codec *dc = calloc(1, sizeof *dc);
    if (!dc)
        return DQ_NOMEM;
    dc->profile = *p;
    if (settings)
        dc->settings = *settings;
    else
        dqcu_settings_default(&dc->settings);
    int rc = dq_codec_create(p, NULL, &dc->codec);
    if (rc < 0) {
        free(dc);
        return rc;
    }
    dc->n = dq_codec_stream_len(dc->codec);
    dc->W = p->window;
    dc->R = p->residual;
    dc->d = p->head_dim;
    dc->wb = dq_codec_window_bytes(dc->codec);
    dc->fixed = p->codec_type == DQ_CODEC_FIXED;
    dc->pairs = p->format_version == DQ_FORMAT_VERSION_PAIRS;
    *out = dc;
    return DQ_OK;
}

void dqcu_codec_free(dqcu_codec *dc)
{
    if (!dc)
        return;
    cudaDeviceSynchronize();
    dq_codec_free(dc->codec);
    free(dc);
}

const dq_profile *dqcu_codec_profile(const dqcu_codec *dc)
{
    return dc ? &dc->profile : NULL;
}

/* Whether the container attention takes dc's records (q_heads valid): not the fixed-width family;
 * version 2 as the real v7 takes it (both kinds at most 8 levels, head_dim a multiple of 64 up to
 * 256, a GQA group of 1, 2, 4 or 8, version 7 or auto asked for). */
static bool fake_attends(const dqcu_codec *dc, uint32_t q_heads)
{
    if (dc->fixed)
        return false;
    if (!dc->pairs)
        return true;
    const uint32_t G = q_heads / dc->profile.kv_heads, want = (uint32_t)dc->settings.attend_kernel;
    return dc->profile.levels[0] <= 8 && dc->profile.levels[1] <= 8 && dc->d % 64 == 0 && dc->d <= 256 &&
           (G == 1 || G == 2 || G == 4 || G == 8) && (want == 0 || want >= 7);
}

/* one emulation for every version: the one asked for, 7 for auto */
int dqcu_attend_kernel(const dqcu_codec *dc, uint32_t q_heads)
{
    if (!dc)
        return DQ_INVALID_ARGUMENT;
    if (!q_heads || q_heads % dc->profile.kv_heads)
        return DQ_SHAPE;
    if (!fake_attends(dc, q_heads)) /* the hot layout only */
        return DQ_UNSUPPORTED;
    return dc->settings.attend_kernel ? dc->settings.attend_kernel : 7;
}

static dq_workspace *new_ws(const dqcu_codec *dc)
{
    dq_workspace *ws;
    if (dq_workspace_create(dc->codec, &ws) < 0)
        FAIL("out of host memory");
    return ws;
}

typedef struct stream_enc_arg {
    const dqcu_codec *dc;
    dq_kind kind;
    const float *y;
    size_t count;
    uint8_t *records;
    size_t stride;
    int32_t *status;
    dq_encode_stats *stats;
} stream_enc_arg;

static void run_encode_streams(void *a_)
{
    stream_enc_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    check_dev(a->y, a->count * dc->n * sizeof(float), "dqcu_encode_streams y");
    check_dev(a->status, a->count * sizeof(int32_t), "dqcu_encode_streams status");
    if (a->stats)
        check_dev(a->stats, sizeof *a->stats, "dqcu_encode_streams stats");
    dq_workspace *ws = new_ws(dc);
    for (size_t i = 0; i < a->count; i++) {
        uint8_t *rec = a->records + i * a->stride;
        check_dev(rec, dq_codec_record_bytes(dc->codec, a->kind), "dqcu_encode_streams record");
        a->status[i] = dq_stream_encode(dc->codec, ws, a->kind, a->y + i * dc->n, rec, a->stats);
    }
    dq_workspace_free(ws);
    free(a);
}

int dqcu_encode_streams(const dqcu_codec *dc, dq_kind kind, const float *y, size_t count, uint8_t *records,
                        size_t record_stride, int32_t *status, dq_encode_stats *stats, cudaStream_t stream)
{
    if (!dc || (kind != DQ_KIND_K && kind != DQ_KIND_V) || (count && (!y || !records || !status)))
        return DQ_INVALID_ARGUMENT;
    if (record_stride < dq_codec_record_bytes(dc->codec, kind))
        return DQ_INVALID_ARGUMENT;
    if (dc->n > DQCU_MAX_ENCODE_STREAM) /* fixed-width codecs too, as the real encoder */
        return DQ_UNSUPPORTED;
    if (!count)
        return DQ_OK;
    stream_enc_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (stream_enc_arg){dc, kind, y, count, records, record_stride, status, stats};
    enqueue(stream, run_encode_streams, a);
    return DQ_OK;
}

typedef struct win_enc_arg {
    const dqcu_codec *dc;
    const void *k, *v;
    dq_dtype dtype;
    size_t nwin;
    uint8_t *const *windows;
    int32_t *status;
    dq_encode_stats *stats;
} win_enc_arg;

static void run_encode_windows(void *a_)
{
    win_enc_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t per = (size_t)dc->W * dc->n * dq_dtype_size(a->dtype);
    check_dev(a->k, a->nwin * per, "dqcu_encode_windows k");
    check_dev(a->v, a->nwin * per, "dqcu_encode_windows v");
    check_dev(a->windows, a->nwin * sizeof(uint8_t *), "dqcu_encode_windows window pointers");
    check_dev(a->status, a->nwin * sizeof(int32_t), "dqcu_encode_windows status");
    if (a->stats)
        check_dev(a->stats, sizeof *a->stats, "dqcu_encode_windows stats");
    dq_workspace *ws = new_ws(dc);
    for (size_t w = 0; w < a->nwin; w++) {
        uint8_t *win = a->windows[w];
        check_dev(win, dc->wb, "dqcu_encode_windows window");
        a->status[w] = dq_window_encode(dc->codec, ws, (const uint8_t *)a->k + w * per, (const uint8_t *)a->v + w * per,
                                        a->dtype, win, a->stats);
    }
    dq_workspace_free(ws);
    free(a);
}

int dqcu_encode_windows(const dqcu_codec *dc, const void *k, const void *v, dq_dtype dtype, size_t nwin,
                        uint8_t *const *windows, int32_t *status, dq_encode_stats *stats, cudaStream_t stream)
{
    if (!dc || (nwin && (!k || !v || !windows || !status)))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->n > DQCU_MAX_ENCODE_STREAM || dc->d > 512) /* fixed-width codecs too */
        return DQ_UNSUPPORTED;
    if (!nwin)
        return DQ_OK;
    win_enc_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (win_enc_arg){dc, k, v, dtype, nwin, windows, status, stats};
    enqueue(stream, run_encode_windows, a);
    return DQ_OK;
}

typedef struct dec_arg {
    const dqcu_codec *dc;
    dq_kind kind;
    const uint8_t *const *windows;
    size_t nwin;
    const uint16_t *tail;
    size_t tail_tokens, first, count;
    void *out;
    dq_dtype dtype;
    uint32_t *corrupt;
} dec_arg;

static void run_decompress(void *a_)
{
    dec_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t n = dc->n, W = dc->W, esz = dq_dtype_size(a->dtype), sealed = a->nwin * W;
    check_dev(a->out, a->count * n * esz, "dqcu_decompress out");
    if (a->nwin)
        check_dev(a->windows, a->nwin * sizeof(uint8_t *), "dqcu_decompress window pointers");
    if (a->tail_tokens)
        check_dev(a->tail, a->tail_tokens * n * sizeof(uint16_t), "dqcu_decompress tail");
    if (a->corrupt)
        check_dev(a->corrupt, sizeof *a->corrupt, "dqcu_decompress corrupt");
    dq_workspace *ws = new_ws(dc);
    size_t t = a->first, end = a->first + a->count;
    while (t < end && t < sealed) {
        size_t w = t / W, off = t % W, cnt = W - off < end - t ? W - off : end - t;
        const uint8_t *win = a->windows[w];
        check_dev(win, dc->wb, "dqcu_decompress window");
        int r = dq_tokens_decode(dc->codec, ws, a->kind, a->kind == DQ_KIND_K ? dq_window_mean(dc->codec, win) : NULL,
                                 dq_window_record(dc->codec, win, a->kind, off),
                                 dq_codec_record_bytes(dc->codec, a->kind), cnt,
                                 (uint8_t *)a->out + (t - a->first) * n * esz, a->dtype);
        if (r == DQ_CORRUPT && a->corrupt)
            (*a->corrupt)++;
        t += cnt;
    }
    if (t < end)
        dq_convert(a->tail + (t - sealed) * n, DQ_DTYPE_BF16, (uint8_t *)a->out + (t - a->first) * n * esz, a->dtype,
                   (end - t) * n);
    dq_workspace_free(ws);
    free(a);
}

int dqcu_decompress(const dqcu_codec *dc, dq_kind kind, const uint8_t *const *windows, size_t nwin,
                    const uint16_t *tail, size_t tail_tokens, size_t first, size_t count, void *out, dq_dtype dtype,
                    uint32_t *corrupt, cudaStream_t stream)
{
    if (!dc || (kind != DQ_KIND_K && kind != DQ_KIND_V) || (count && !out) || (nwin && !windows) ||
        (tail_tokens && !tail))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->d < 32 || dc->d > 512 || dc->fixed)
        return DQ_UNSUPPORTED;
    const size_t total = nwin * dc->W + tail_tokens;
    if (first > total || count > total - first)
        return DQ_OUT_OF_BOUNDS;
    if (!count)
        return DQ_OK;
    dec_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (dec_arg){dc, kind, windows, nwin, tail, tail_tokens, first, count, out, dtype, corrupt};
    enqueue(stream, run_decompress, a);
    return DQ_OK;
}

size_t dqcu_attend_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq, uint32_t max_tokens)
{
    if (!dc || !q_heads || q_heads % dc->profile.kv_heads || !fake_attends(dc, q_heads))
        return 0;
    (void)max_tokens;
    return 64 + (size_t)nseq * 16;
}

typedef struct att_arg {
    const dqcu_codec *dc;
    uint32_t q_heads;
    float scale;
    const dqcu_attn_seq *seqs;
    uint32_t nseq, max_tokens;
    const float *q;
    float *out, *lse;
} att_arg;

static void run_attend(void *a_)
{
    att_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t n = dc->n, qs = (size_t)a->q_heads * dc->d;
    check_dev(a->seqs, a->nseq * sizeof *a->seqs, "dqcu_attend seqs");
    check_dev(a->q, a->nseq * qs * sizeof(float), "dqcu_attend q");
    check_dev(a->out, a->nseq * qs * sizeof(float), "dqcu_attend out");
    if (a->lse)
        check_dev(a->lse, (size_t)a->nseq * a->q_heads * sizeof(float), "dqcu_attend lse");
    dq_workspace *ws = new_ws(dc);
    for (uint32_t b = 0; b < a->nseq; b++) {
        const dqcu_attn_seq sq = a->seqs[b];
        if ((uint64_t)sq.nwin * dc->W + sq.tail_tokens > a->max_tokens)
            FAIL("dqcu_attend: sequence %u holds %llu tokens, more than max_tokens %u", b,
                 (unsigned long long)sq.nwin * dc->W + sq.tail_tokens, a->max_tokens);
        if (sq.tail_tokens >= dc->R)
            FAIL("dqcu_attend: sequence %u has a tail of %u tokens (R = %u)", b, sq.tail_tokens, dc->R);
        uint8_t *recs = malloc((size_t)sq.nwin * dc->wb + 1);
        if (!recs)
            FAIL("out of host memory");
        if (sq.nwin)
            check_dev(sq.windows, sq.nwin * sizeof(uint8_t *), "dqcu_attend window pointers");
        for (uint32_t w = 0; w < sq.nwin; w++) {
            check_dev(sq.windows[w], dc->wb, "dqcu_attend window");
            memcpy(recs + (size_t)w * dc->wb, sq.windows[w], dc->wb);
        }
        if (sq.tail_tokens) {
            check_dev(sq.tail_k, sq.tail_tokens * n * sizeof(uint16_t), "dqcu_attend tail_k");
            check_dev(sq.tail_v, sq.tail_tokens * n * sizeof(uint16_t), "dqcu_attend tail_v");
        }
        dq_layer *l;
        int rc = dq_layer_restore(dc->codec, recs, sq.nwin, sq.tail_k, sq.tail_v, sq.tail_tokens, &l);
        if (rc < 0)
            FAIL("dqcu_attend: sequence %u does not hold valid records: %s", b, dq_strerror(rc));
        dq_attn_item it = {l, a->q + b * qs, a->out + b * qs, a->lse ? a->lse + (size_t)b * a->q_heads : NULL};
        rc = dq_attend(dc->codec, ws, a->q_heads, a->scale, &it, 1);
        if (rc < 0)
            FAIL("dqcu_attend: dq_attend failed: %s", dq_strerror(rc));
        dq_layer_free(l);
        free(recs);
    }
    dq_workspace_free(ws);
    free(a);
}

int dqcu_attend(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs, uint32_t nseq,
                uint32_t max_tokens, const float *q, float *out, float *lse, void *workspace, size_t workspace_bytes,
                cudaStream_t stream)
{
    if (!dc || (nseq && (!seqs || !q || !out || !workspace)) || scale != scale)
        return DQ_INVALID_ARGUMENT;
    if (!q_heads || q_heads % dc->profile.kv_heads)
        return DQ_SHAPE;
    if (dc->d < 32 || dc->d > 512 || !fake_attends(dc, q_heads)) /* dqcu_attend_hot over the hot windows */
        return DQ_UNSUPPORTED;
    if (!nseq)
        return DQ_OK;
    if (workspace_bytes < dqcu_attend_workspace_size(dc, q_heads, nseq, max_tokens))
        return DQ_INVALID_ARGUMENT;
    check_dev(workspace, workspace_bytes, "dqcu_attend workspace");
    att_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (att_arg){dc, q_heads, scale, seqs, nseq, max_tokens, q, out, lse};
    enqueue(stream, run_attend, a);
    return DQ_OK;
}

/* ---- the hot layout ---- */

size_t dqcu_hot_window_bytes(const dqcu_codec *dc)
{
    return dc ? dq_hot_window_bytes(dc->codec) : 0;
}

/* the limits of the real kernel (attend_hot.cu dqcu__attend_hot_fit; its shared memory fits every
 * shape these allow on sm_90) */
int dqcu_attend_hot_check(const dqcu_codec *dc, uint32_t q_heads)
{
    if (!dc)
        return DQ_INVALID_ARGUMENT;
    if (!q_heads || q_heads % dc->profile.kv_heads)
        return DQ_SHAPE;
    const uint32_t G = q_heads / dc->profile.kv_heads;
    const uint32_t bk = dq_hot_bits(dc->codec, DQ_KIND_K), bv = dq_hot_bits(dc->codec, DQ_KIND_V);
    /* the code widths attend_hot.cu instantiates: 3 + 3, 4 + 4, 3 + 2, 2 + 1 */
    const bool widths = (bk == 3 && bv == 3) || (bk == 4 && bv == 4) || (bk == 3 && bv == 2) || (bk == 2 && bv == 1);
    if ((G != 1 && G != 2 && G != 4 && G != 8) || dc->d % 128 != 0 || dc->d > 256 || !widths)
        return DQ_UNSUPPORTED;
    return DQ_OK;
}

/* DQCU_FAKE_HOT_MAX_TOKENS: whether a launch of max_tokens is beyond the emulated plan limits */
static bool hot_plan_refused(uint32_t max_tokens)
{
    const char *e = getenv("DQCU_FAKE_HOT_MAX_TOKENS");
    return e && *e && max_tokens > strtoull(e, NULL, 10);
}

size_t dqcu_attend_hot_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq, uint32_t max_tokens)
{
    if (!dc || dqcu_attend_hot_check(dc, q_heads) != DQ_OK || hot_plan_refused(max_tokens))
        return 0;
    return 128 + (size_t)nseq * 16;
}

typedef struct hot_tc_arg {
    const dqcu_codec *dc;
    const uint8_t *const *windows;
    size_t nwin;
    uint8_t *const *hot;
    uint32_t *corrupt;
} hot_tc_arg;

static void run_transcode_hot(void *a_)
{
    hot_tc_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t hb = dq_hot_window_bytes(dc->codec);
    check_dev(a->windows, a->nwin * sizeof(uint8_t *), "dqcu_transcode_hot window pointers");
    check_dev(a->hot, a->nwin * sizeof(uint8_t *), "dqcu_transcode_hot hot pointers");
    if (a->corrupt)
        check_dev(a->corrupt, sizeof *a->corrupt, "dqcu_transcode_hot corrupt");
    for (size_t i = 0; i < a->nwin; i++) {
        check_dev(a->windows[i], dc->wb, "dqcu_transcode_hot window");
        check_dev(a->hot[i], hb, "dqcu_transcode_hot hot window");
        if ((uintptr_t)a->hot[i] & 3u)
            FAIL("dqcu_transcode_hot: hot window %zu at %p is not 4-byte aligned", i, (void *)a->hot[i]);
        if (a->hot[i] < a->windows[i] + dc->wb && a->windows[i] < a->hot[i] + hb)
            FAIL("dqcu_transcode_hot: hot window %zu overlaps its record", i);
        int rc = dq_hot_transcode(dc->codec, a->windows[i], a->hot[i]);
        if (rc == DQ_CORRUPT) {
            if (a->corrupt)
                (*a->corrupt)++;
        } else if (rc < 0) {
            FAIL("dqcu_transcode_hot: dq_hot_transcode failed: %s", dq_strerror(rc));
        }
    }
    free(a);
}

int dqcu_transcode_hot(const dqcu_codec *dc, const uint8_t *const *windows, size_t nwin, uint8_t *const *hot,
                       uint32_t *corrupt, cudaStream_t stream)
{
    if (!dc || (nwin && (!windows || !hot)))
        return DQ_INVALID_ARGUMENT;
    if (dc->d < 32 || dc->d > 512)
        return DQ_UNSUPPORTED;
    if (nwin > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    if (!nwin)
        return DQ_OK;
    hot_tc_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (hot_tc_arg){dc, windows, nwin, hot, corrupt};
    enqueue(stream, run_transcode_hot, a);
    return DQ_OK;
}

/* dqcu_rebuild_hot: dq_hot_rebuild per window (which checks more than the kernel: a window it
 * refuses counts as bad, and the daemon never rebuilds one it did not transcode). */
typedef struct hot_rb_arg {
    const dqcu_codec *dc;
    const uint8_t *const *hot;
    size_t nwin;
    uint8_t *const *windows;
    uint32_t *bad;
} hot_rb_arg;

static void run_rebuild_hot(void *a_)
{
    hot_rb_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t hb = dq_hot_window_bytes(dc->codec);
    check_dev(a->windows, a->nwin * sizeof(uint8_t *), "dqcu_rebuild_hot window pointers");
    check_dev(a->hot, a->nwin * sizeof(uint8_t *), "dqcu_rebuild_hot hot pointers");
    if (a->bad)
        check_dev(a->bad, sizeof *a->bad, "dqcu_rebuild_hot bad");
    for (size_t i = 0; i < a->nwin; i++) {
        check_dev(a->windows[i], dc->wb, "dqcu_rebuild_hot window");
        check_dev(a->hot[i], hb, "dqcu_rebuild_hot hot window");
        if ((uintptr_t)a->hot[i] & 3u)
            FAIL("dqcu_rebuild_hot: hot window %zu at %p is not 4-byte aligned", i, (void *)a->hot[i]);
        if (a->hot[i] < a->windows[i] + dc->wb && a->windows[i] < a->hot[i] + hb)
            FAIL("dqcu_rebuild_hot: hot window %zu overlaps its record", i);
        int rc = dq_hot_rebuild(dc->codec, a->hot[i], hb, a->windows[i]);
        if (rc == DQ_CORRUPT || rc == DQ_TRUNCATED) {
            if (a->bad)
                (*a->bad)++;
        } else if (rc < 0) {
            FAIL("dqcu_rebuild_hot: dq_hot_rebuild failed: %s", dq_strerror(rc));
        }
    }
    free(a);
}

int dqcu_rebuild_hot(const dqcu_codec *dc, const uint8_t *const *hot, size_t nwin, uint8_t *const *windows,
                     uint32_t *bad, cudaStream_t stream)
{
    if (!dc || (nwin && (!windows || !hot)))
        return DQ_INVALID_ARGUMENT;
    if (dc->d < 32 || dc->d > 512 || dc->fixed) /* fixed-width records are not rANS, as the real kernel */
        return DQ_UNSUPPORTED;
    if (nwin > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    if (!nwin)
        return DQ_OK;
    hot_rb_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (hot_rb_arg){dc, hot, nwin, windows, bad};
    enqueue(stream, run_rebuild_hot, a);
    return DQ_OK;
}

static void run_attend_hot(void *a_)
{
    att_arg *a = a_;
    const dqcu_codec *dc = a->dc;
    const size_t n = dc->n, qs = (size_t)a->q_heads * dc->d, hb = dq_hot_window_bytes(dc->codec);
    check_dev(a->seqs, a->nseq * sizeof *a->seqs, "dqcu_attend_hot seqs");
    check_dev(a->q, a->nseq * qs * sizeof(float), "dqcu_attend_hot q");
    check_dev(a->out, a->nseq * qs * sizeof(float), "dqcu_attend_hot out");
    if (a->lse)
        check_dev(a->lse, (size_t)a->nseq * a->q_heads * sizeof(float), "dqcu_attend_hot lse");
    dq_workspace *ws = new_ws(dc);
    for (uint32_t b = 0; b < a->nseq; b++) {
        const dqcu_attn_seq sq = a->seqs[b];
        if ((uint64_t)sq.nwin * dc->W + sq.tail_tokens > a->max_tokens)
            FAIL("dqcu_attend_hot: sequence %u holds %llu tokens, more than max_tokens %u", b,
                 (unsigned long long)sq.nwin * dc->W + sq.tail_tokens, a->max_tokens);
        if (sq.tail_tokens >= dc->R)
            FAIL("dqcu_attend_hot: sequence %u has a tail of %u tokens (R = %u)", b, sq.tail_tokens, dc->R);
        if (sq.nwin)
            check_dev(sq.windows, sq.nwin * sizeof(uint8_t *), "dqcu_attend_hot window pointers");
        for (uint32_t w = 0; w < sq.nwin; w++) {
            check_dev(sq.windows[w], hb, "dqcu_attend_hot hot window");
            if ((uintptr_t)sq.windows[w] & 15u)
                FAIL("dqcu_attend_hot: sequence %u: hot window %u is not 16-byte aligned", b, w);
            /* the kernel reads codes as they are: a window dq_hot_transcode did not write is a bug */
            int rc = dq_hot_check(dc->codec, sq.windows[w], hb);
            if (rc < 0)
                FAIL("dqcu_attend_hot: sequence %u: window %u is not a hot window: %s", b, w, dq_strerror(rc));
        }
        if (sq.tail_tokens) {
            check_dev(sq.tail_k, sq.tail_tokens * n * sizeof(uint16_t), "dqcu_attend_hot tail_k");
            check_dev(sq.tail_v, sq.tail_tokens * n * sizeof(uint16_t), "dqcu_attend_hot tail_v");
            if (((uintptr_t)sq.tail_k | (uintptr_t)sq.tail_v) & 15u)
                FAIL("dqcu_attend_hot: sequence %u: the tails are not 16-byte aligned", b);
        }
        dq_hot_item it = {(const uint8_t *const *)sq.windows,
                          sq.nwin,
                          sq.tail_tokens ? sq.tail_k : NULL,
                          sq.tail_tokens ? sq.tail_v : NULL,
                          sq.tail_tokens,
                          a->q + b * qs,
                          a->out + b * qs,
                          a->lse ? a->lse + (size_t)b * a->q_heads : NULL};
        int rc = dq_hot_attend(dc->codec, ws, a->q_heads, a->scale, &it, 1);
        if (rc < 0)
            FAIL("dqcu_attend_hot: dq_hot_attend failed: %s", dq_strerror(rc));
    }
    dq_workspace_free(ws);
    free(a);
}

int dqcu_attend_hot(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs, uint32_t nseq,
                    uint32_t max_tokens, const float *q, float *out, float *lse, void *workspace,
                    size_t workspace_bytes, cudaStream_t stream)
{
    if (!dc || (nseq && (!seqs || !q || !out || !workspace)) || !isfinite(scale))
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu_attend_hot_check(dc, q_heads);
    if (rc)
        return rc;
    if (!nseq)
        return DQ_OK;
    if (hot_plan_refused(max_tokens))
        return DQ_UNSUPPORTED;
    if (workspace_bytes < dqcu_attend_hot_workspace_size(dc, q_heads, nseq, max_tokens) || ((uintptr_t)workspace & 15u))
        return DQ_INVALID_ARGUMENT;
    check_dev(workspace, workspace_bytes, "dqcu_attend_hot workspace");
    att_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (att_arg){dc, q_heads, scale, seqs, nseq, max_tokens, q, out, lse};
    enqueue(stream, run_attend_hot, a);
    return DQ_OK;
}

/* ---- token checks ---- */

typedef struct tok_arg {
    const dqcu_codec *dc;
    const void *x;
    dq_dtype dtype;
    size_t ntok;
    unsigned long long *check;
} tok_arg;

static void run_tokens_check(void *a_)
{
    tok_arg *a = a_;
    const size_t n = a->dc->n, esz = dq_dtype_size(a->dtype);
    check_dev(a->x, a->ntok * n * esz, "dqcu_tokens_check x");
    check_dev(a->check, 2 * sizeof(unsigned long long), "dqcu_tokens_check check");
    float *y = malloc(n * sizeof *y);
    if (!y)
        FAIL("out of host memory");
    if (dq_check_finite(a->x, a->dtype, a->ntok * n) < 0)
        a->check[0] |= 1;
    for (size_t t = 0; t < a->ntok && !a->check[0]; t++) {
        dq_convert((const uint8_t *)a->x + t * n * esz, a->dtype, y, DQ_DTYPE_F32, n);
        unsigned long long key = ~0ull;
        for (size_t j = 0; j < n && key == ~0ull; j++) {
            y[j] = dq_bf16_to_f32(dq_f32_to_bf16(y[j]));
            if (!isfinite(y[j]))
                key = 2ull * t;
        }
        if (key == ~0ull) {
            dq_rotate(a->dc->codec, y);
            for (size_t j = 0; j < n && key == ~0ull; j++)
                if (!(fabsf(y[j]) <= DQ_TOKEN_MAX_ABS))
                    key = 2ull * t + 1;
        }
        if (key < a->check[1])
            a->check[1] = key;
    }
    free(y);
    free(a);
}

int dqcu_tokens_check(const dqcu_codec *dc, const void *x, dq_dtype dtype, size_t ntok, unsigned long long *check,
                      cudaStream_t stream)
{
    if (!dc || !check || (ntok && !x))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->n > DQCU_MAX_ENCODE_STREAM)
        return DQ_UNSUPPORTED;
    if (!ntok)
        return DQ_OK;
    tok_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (tok_arg){dc, x, dtype, ntok, check};
    enqueue(stream, run_tokens_check, a);
    return DQ_OK;
}

int dqcu_tokens_verdict(const unsigned long long check[2])
{
    if (check[0])
        return DQ_NONFINITE;
    if (check[1] == ~0ull)
        return DQ_OK;
    return (check[1] & 1ull) ? DQ_RANGE : DQ_NONFINITE;
}

typedef struct bf16_arg {
    const void *x;
    dq_dtype dtype;
    size_t count;
    uint16_t *out;
} bf16_arg;

static void run_to_bf16(void *a_)
{
    bf16_arg *a = a_;
    check_dev(a->x, a->count * dq_dtype_size(a->dtype), "dqcu_to_bf16 x");
    check_dev(a->out, a->count * sizeof(uint16_t), "dqcu_to_bf16 out");
    if (dq_convert(a->x, a->dtype, a->out, DQ_DTYPE_BF16, a->count) < 0)
        FAIL("dqcu_to_bf16: conversion failed");
    free(a);
}

typedef struct scatter_arg {
    const uint16_t *src;
    uint32_t n, nrows;
    uint16_t *const *dst;
} scatter_arg;

static void run_scatter_rows(void *p)
{
    scatter_arg *a = p;
    check_dev(a->src, (size_t)a->nrows * a->n * sizeof(uint16_t), "dqcu_scatter_rows src");
    check_dev(a->dst, (size_t)a->nrows * sizeof(uint16_t *), "dqcu_scatter_rows dst");
    for (uint32_t i = 0; i < a->nrows; i++) {
        check_dev(a->dst[i], (size_t)a->n * sizeof(uint16_t), "dqcu_scatter_rows row");
        memcpy(a->dst[i], a->src + (size_t)i * a->n, (size_t)a->n * sizeof(uint16_t));
    }
    free(a);
}

int dqcu_scatter_rows(const uint16_t *src, uint32_t n, uint16_t *const *dst, uint32_t nrows, cudaStream_t stream)
{
    if (nrows && (!src || !dst || !n))
        return DQ_INVALID_ARGUMENT;
    if (!nrows)
        return DQ_OK;
    scatter_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (scatter_arg){src, n, nrows, dst};
    enqueue(stream, run_scatter_rows, a);
    return DQ_OK;
}

int dqcu_to_bf16(const void *x, dq_dtype dtype, size_t count, uint16_t *out, cudaStream_t stream)
{
    if (count && (!x || !out))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (!count)
        return DQ_OK;
    bf16_arg *a = malloc(sizeof *a);
    if (!a)
        return DQ_NOMEM;
    *a = (bf16_arg){x, dtype, count, out};
    enqueue(stream, run_to_bf16, a);
    return DQ_OK;
}
