/* dquantd GPU-resident layer (cuda backend): one sequence layer held in device memory, the same
 * sealed window records and BF16 tail a dq_layer holds on the host, plus a host shadow of its small
 * metadata (counts, the window pointer array) that the loop thread reads for ORDER checks, budget
 * estimates and accounting without touching the device.
 *
 * A layer lives in exactly one tier at a time: dqd_seq.layers[i] (host) or dqd_seq.glayers[i]
 * (GPU), never both. Moving it copies the records (gpustore.c); the bytes never change.
 *
 * Device layout. Window records live in segments: device blocks of consecutive window records
 * (one block per append that seals windows, at least DQD_GSEG_MIN windows, so a decode stream
 * allocates once per few windows and a prefill once). d_win is the device array of window
 * pointers the kernels take (dqcu_attn_seq.windows, dqcu_decompress); h_win is its host copy.
 * d_tail holds the K tail (R tokens) followed by the V tail (R tokens), BF16.
 *
 * Hot windows (--gpu-attention-layout hot, dquant/hot.h). A layer of a model the hot attention
 * kernel takes keeps, beside each sealed window record, its hot copy (the same levels at fixed
 * width, transcoded on the GPU by dqcu_transcode_hot when the window is sealed or the layer comes
 * to the GPU), and ATTEND runs dqcu_attend_hot over them. The records stay what every other path
 * reads (GET_RAW, GET, moves to the host and disk tiers, rollbacks): the hot copies are an
 * attention cache of the GPU tier, counted in dev_bytes (the GPU budget) and dropped with the
 * layer when it leaves the GPU. Each segment has a hot block of as many slots (hot_stride bytes
 * apart); d_hot/h_hot are the pointer arrays dqcu_attn_seq.windows takes, parallel to d_win.
 *
 * Hot-only layers (--gpu-attention-layout hot-only, hot_only set): the same, without the records.
 * A segment has only its hot block (base NULL) and the layer no d_win/h_win; an append encodes
 * its windows into the worker's scratch (DQD_GBUF_RECS) and transcodes them from there, a promote
 * uploads the host records there. Whatever reads records (GET, GET_RAW, demotes to the host and
 * disk tiers, an ATTEND over the records) gets them rebuilt from the hot windows on the CPU
 * (dq_hot_rebuild: byte for byte the records they were transcoded from). dev_bytes counts what is
 * held: the hot blocks, the hot pointer arrays, the tail.
 *
 * This header has no CUDA types: device addresses are plain pointers the host never dereferences.
 * Fields change only under exclusive access to the sequence (a writer's worker task); the loop
 * thread reads them between requests. */
#ifndef DQD_GPULAYER_H
#define DQD_GPULAYER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hostmem.h"

/* Smallest segment, in windows: bounds both the allocations of a decode stream and the slack. */
#define DQD_GSEG_MIN 4u

typedef struct dqd_gseg {
    uint8_t *base;  /* device: count window records back to back (NULL in a hot-only layer) */
    uint32_t first; /* index in the layer of its first window */
    uint32_t count; /* windows it has room for */
    uint8_t *hot;   /* device: count hot windows, hot_stride apart (NULL when the layer has none) */
} dqd_gseg;

typedef struct dqd_glayer {
    uint32_t W, R;  /* the codec's window and residual */
    uint32_t nwin;  /* sealed windows */
    uint32_t tail;  /* tokens in the BF16 tail (< R) */
    uint32_t slots; /* windows the segments have room for (>= nwin) */
    uint32_t cap;   /* entries of h_win / d_win (>= slots) */
    uint32_t nseg, segcap;
    dqd_gseg *segs;      /* host [segcap] */
    uint8_t **h_win;     /* host [cap]: device addresses of the window slots (NULL: hot-only) */
    uint8_t **d_win;     /* device [cap]: the same pointers (NULL: hot-only) */
    uint16_t *d_tail;    /* device: K tail [R][n] then V tail [R][n], BF16 */
    uint64_t dev_bytes;  /* device bytes allocated for this layer (what the GPU budget counts) */
    uint32_t nhot;       /* windows [0, nhot) have their hot copy (nhot == nwin after every operation) */
    uint64_t hot_stride; /* bytes per hot window slot (dqcu_hot_window_bytes rounded up); 0: no hot copies */
    uint8_t **h_hot;     /* host [cap]: device addresses of the hot window slots (NULL: no hot copies) */
    uint8_t **d_hot;     /* device [cap]: the same pointers */
    bool hot_only;       /* the windows are held only as hot windows (hot_stride != 0) */
} dqd_glayer;

static inline uint64_t dqd_glayer_tokens(const dqd_glayer *l)
{
    return (uint64_t)l->nwin * l->W + l->tail;
}

/* Bytes of K/V held: window records plus the tail tokens in use (as dq_layer_stored_bytes; a
 * hot-only layer counts the records it stands for, dev_bytes what it holds). */
static inline uint64_t dqd_glayer_stored_bytes(const dqd_glayer *l, size_t window_bytes, uint32_t n)
{
    return (uint64_t)l->nwin * window_bytes + (uint64_t)l->tail * n * 2u * sizeof(uint16_t);
}

/* Host bytes of the shadow (struct, segment list, pointer arrays), as counted by the hostmem. */
static inline uint64_t dqd_glayer_host_bytes(const dqd_glayer *l)
{
    uint64_t b = dqd_hostmem_cost(sizeof *l);
    if (l->segcap)
        b += dqd_hostmem_cost((size_t)l->segcap * sizeof(dqd_gseg));
    if (l->cap)
        b += dqd_hostmem_cost((size_t)l->cap * sizeof(uint8_t *)) * (l->hot_stride && !l->hot_only ? 2u : 1u);
    return b;
}

/* Device bytes of the layer's hot copies (slots allocated; part of dev_bytes). */
static inline uint64_t dqd_glayer_hot_bytes(const dqd_glayer *l)
{
    return l->hot_stride ? (uint64_t)l->slots * l->hot_stride + (uint64_t)l->cap * sizeof(uint8_t *) : 0;
}

#endif
