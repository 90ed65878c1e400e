/* dquantd cuda backend internals shared by gpu_backend.c (device, workers, memory, staged copies)
 * and gpustore.c (layer operations). Compiled only when the build has CUDA (DQD_HAVE_CUDA). */
#ifndef DQD_GPU_INTERNAL_H
#define DQD_GPU_INTERNAL_H

#ifndef DQD_HAVE_CUDA
#error "the cuda backend is built only with CUDA (meson defines DQD_HAVE_CUDA); see gpu_none.c"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dquant/cuda.h"
#include "gpu.h"

/* Bytes of each pinned staging half per worker: a piece of a PUT is as many tokens as fit. (The
 * tests build the backend with small halves, so that every chunked path runs.) */
#ifndef DQD_GPIN_BYTES
#define DQD_GPIN_BYTES (16u << 20)
#endif

/* Bytes of BF16 K and V an append gathers per piece in the device stage buffer: large, so that
 * one dqcu_encode_windows launch fills the GPU (the input is on the device already). The tests'
 * small pinned halves make it small too, so that appends run in many pieces. */
#ifndef DQD_STAGE_BYTES
#if DQD_GPIN_BYTES < (1u << 20)
#define DQD_STAGE_BYTES DQD_GPIN_BYTES
#else
#define DQD_STAGE_BYTES (256u << 20)
#endif
#endif

/* Device scratch buffers of a worker, grown on demand (not counted in the GPU budget). */
enum {
    DQD_GBUF_STAGE, /* encode input: [tail, piece] of K, then of V */
    DQD_GBUF_SMALL, /* encode status and stats, corrupt counters */
    DQD_GBUF_IO,    /* decode output, attention descriptors / queries / outputs */
    DQD_GBUF_WS,    /* attention workspace */
    DQD_GBUF_RAW,   /* an append's host input copied up, K then V */
    DQD_GBUF_CHECK, /* token check words */
    DQD_GBUF_RECS,  /* hot-only layers: window records in passing (pointer array, then records) */
    DQD_GBUF_COUNT
};

typedef struct dqd_gcodec {
    const dqd_codec *codec;
    dqcu_codec *dc;
    struct dqd_gcodec *next;
} dqd_gcodec;

/* One worker thread's CUDA state. */
typedef struct dqd_gwork {
    dqd_gpu *g;
    cudaStream_t stream;
    cudaEvent_t ev[2]; /* recorded after the last copy that reads or writes pin[i] */
    uint8_t *pin[2];   /* pinned halves of DQD_GPIN_BYTES */
    int half;          /* the current half */
    size_t used;       /* bytes of the current half handed out since it became current */
    void *buf[DQD_GBUF_COUNT];
    size_t buf_bytes[DQD_GBUF_COUNT];
    struct dqd_gwork *next;
} dqd_gwork;

struct dqd_gpu {
    int device;
    char desc[320];
    dqd_hostmem *mem;
    cudaStream_t loop_stream; /* frees issued by the loop thread */
    uint64_t budget;
    _Atomic uint64_t allocated;
    pthread_mutex_t mu; /* guards workers and codecs */
    dqd_gwork *workers;
    dqd_gcodec *codecs;
    dqcu_settings settings; /* kernel versions from the config, for every codec */
    bool hot_layout;        /* --gpu-attention-layout hot or hot-only: layers keep hot copies (gpulayer.h) */
    bool hot_only;          /* --gpu-attention-layout hot-only: and no records beside them */
    _Atomic uint64_t hot_windows, hot_bytes; /* held now (dqd_gpu_hot_stats) */
    _Atomic uint64_t hot_items;              /* attention items run by dqcu_attend_hot */
    _Atomic uint64_t hot_only_windows;       /* hot windows held without their record (dqd_gpu_hot_only_stats) */
    _Atomic uint64_t records_rebuilt;        /* records rebuilt from hot windows, total */
    _Atomic uint64_t records_rebuilt_gpu;    /* of those, on the device (dqcu_rebuild_hot) */
    _Atomic uint64_t records_rebuilt_cpu;    /* of those, on the CPU where the device refused or failed */
    _Atomic uint64_t windows_encoded;        /* windows sealed by dqcu_encode_windows (dqd_gpu_encode_stats) */
    _Atomic uint64_t host_attend_items;      /* ATTEND items computed on the host (dqd_gpu_host_attend_stats) */
};

/* Logs a failed CUDA call, clears the thread's last error (so a later library call does not
 * report it as its own) and maps it to DQ_NOMEM or DQ_INTERNAL. */
int dqd_gcuda_fail(cudaError_t e, const char *what, const char *file, int line);
/* Same for a libdquant-cuda call that returned rc < 0. */
int dqd_gcu_fail(int rc, const char *what, const char *file, int line);

#define DQD_GCK(call)                                                 \
    do {                                                              \
        cudaError_t dqd__e = (call);                                  \
        if (dqd__e != cudaSuccess)                                    \
            return dqd_gcuda_fail(dqd__e, #call, __FILE__, __LINE__); \
    } while (0)
#define DQD_GCK_GOTO(call, rc, label)                                 \
    do {                                                              \
        cudaError_t dqd__e = (call);                                  \
        if (dqd__e != cudaSuccess) {                                  \
            (rc) = dqd_gcuda_fail(dqd__e, #call, __FILE__, __LINE__); \
            goto label;                                               \
        }                                                             \
    } while (0)
#define DQD_GCU_GOTO(call, rc, label)                               \
    do {                                                            \
        int dqd__r = (call);                                        \
        if (dqd__r < 0) {                                           \
            (rc) = dqd_gcu_fail(dqd__r, #call, __FILE__, __LINE__); \
            goto label;                                             \
        }                                                           \
    } while (0)

/* The calling worker's state, created on first use (sets the device on this thread). */
int dqd_gwork_get(dqd_gpu *g, dqd_gwork **out);
/* The device codec for a host codec, created on first use. */
int dqd_gcodec_get(dqd_gpu *g, const dqd_codec *codec, const dqcu_codec **out);
/* Device scratch slot of at least bytes (contents not kept when it grows). */
int dqd_gwork_buf(dqd_gwork *w, int slot, size_t bytes, void **out);

/* Device memory for layers, counted in g->allocated; stream-ordered on the given stream. */
int dqd_gmalloc(dqd_gwork *w, size_t bytes, void **out);
void dqd_gfree(dqd_gpu *g, cudaStream_t stream, void *p, size_t bytes);

/* Pinned staging: bytes (at most DQD_GPIN_BYTES) of the current half when they fit after what it
 * handed out already (small copies, like a decode step's tokens, share a half without waiting),
 * else of the other half once the copies issued from it before are done. NULL when CUDA fails.
 * done records that the copies just issued on w->stream read or write the half. The caller is
 * done with the bytes (a device-to-host copy read out) before taking more. */
uint8_t *dqd_gpin_take(dqd_gwork *w, size_t bytes, int *half);
int dqd_gpin_done(dqd_gwork *w, int half);

/* Host → device through the pinned halves, asynchronous (src may be reused on return). */
int dqd_gh2d(dqd_gwork *w, void *dst, const void *src, size_t bytes);
/* Device → host through the pinned halves; done when it returns. */
int dqd_gd2h(dqd_gwork *w, void *dst, const void *src, size_t bytes);
/* Waits for everything issued on the worker's stream. */
int dqd_gsync(dqd_gwork *w);

#endif
