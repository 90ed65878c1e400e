/* dquantd cuda backend: the GPU, per-worker CUDA streams and staging buffers, device codecs
 * (libdquant-cuda), and the operations on GPU-resident layers (gpulayer.h).
 *
 * Tiers. A layer lives on the host (dq_layer) or on the GPU (dqd_glayer), with byte-identical
 * window records and BF16 tail either way: the GPU encoder writes exactly what dq_layer_append
 * writes, from the same BF16-rounded tokens, sealing the same windows. Moving a layer between
 * tiers copies its records; dq_layer_restore rebuilds the host form. Who moves what (store.h and
 * tier.h, for PUT and ATTEND): PUT and ATTEND put the layers they write or attend on the
 * GPU (creating them there, or bringing host layers back); making room moves least recently used
 * idle unpinned sequences to the host, or evicts them when the host has no room either; a write to
 * a GPU layer that finds no room at all (everything else pinned or in use) moves that layer to the
 * host and writes it there; GET reads either tier in place.
 *
 * Threads. dqd_gpu_create, the estimates and dqd_gpu_free_seq_layers run on the loop thread and
 * never wait for the device (frees are stream-ordered: cudaFreeAsync). Everything else runs on the
 * worker threads (libuv's pool): each worker gets, on first use, its own CUDA stream, two pinned
 * host staging halves (so that converting the next piece on the CPU overlaps the copy and the
 * kernels of the previous one) and device scratch. Device memory comes from the device's
 * stream-ordered pool (cudaMallocAsync), so allocation is cheap and freeing never synchronizes the
 * device. Every operation has finished on the device when it returns, except dqd_gpu_append
 * without sealing and dqd_gpu_append_tokens, which leave their copies in flight: the task then
 * calls dqd_gpu_finish (or issues more work on the same stream that synchronizes).
 *
 * Budget. The GPU budget (--gpu-memory, default 80% of the free device memory at start) counts
 * the device bytes of layers (dqd_glayer.dev_bytes: window segments, pointer arrays, tails, and
 * with --gpu-attention-layout hot the hot copies of the windows, gpulayer.h; with hot-only the hot
 * windows instead of the segments' records); the
 * per-worker scratch and the device codecs come on top, which is why the default leaves a margin.
 *
 * Without CUDA at build time gpu_none.c provides these functions: dqd_gpu_create then fails with
 * DQ_UNSUPPORTED and nothing else is ever called. */
#ifndef DQD_GPU_H
#define DQD_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "dquant/codec.h"
#include "dquant/layer.h"
#include "gpulayer.h"
#include "hostmem.h"
#include "registry.h"
#include "store.h"

typedef struct dqd_gpu dqd_gpu;

/* ---- loop thread ---- */

/* Opens the configured device. DQ_UNSUPPORTED when this build has no CUDA or no usable device
 * exists (why says which; the caller then runs the cpu backend), DQ_INTERNAL / DQ_NOMEM for a
 * device that fails to initialize. */
int dqd_gpu_create(const dqd_config *cfg, dqd_hostmem *mem, dqd_gpu **out, char *why, size_t whylen);
/* Frees everything (no layer may remain: the store is destroyed first). NULL is allowed. */
void dqd_gpu_destroy(dqd_gpu *g);
uint64_t dqd_gpu_budget(const dqd_gpu *g);
/* Device bytes allocated for layers right now (what the budget governs, before reservations). */
uint64_t dqd_gpu_allocated(const dqd_gpu *g);
/* "NVIDIA H200 (device 0, sm_90)". */
const char *dqd_gpu_describe(const dqd_gpu *g);

/* Whether a model's sequences can live on the GPU: a D-Quant profile of a shape the kernels take
 * (n <= DQCU_MAX_ENCODE_STREAM, 32 <= head_dim <= 512, at most 8 query heads per KV head; in
 * container format version 2 an ATTEND over its records runs on the host, see gpustore.c
 * codec_pairs), or a
 * fixed-width profile (DQ_CODEC_FIXED) of such a shape with --gpu-attention-layout hot or hot-only
 * when dqcu_attend_hot takes the model (dqcu_attend_hot_check at its q_heads, and at a GQA group
 * of 1 as the layers' hot copies are decided): the device encodes that family's records and has its
 * hot layout, but no decoder or container attention, so those reads run libdquant on host copies
 * (gpustore.c). Others stay on the host tier and use the cpu code. */
bool dqd_gpu_model_ok(const dqd_gpu *g, const dqd_model *m);

/* Store hook (dqd_store_gpu_enable): frees every GPU layer of a sequence nothing uses any more. */
void dqd_gpu_free_seq_layers(void *gpu, dqd_seq *seq);
/* Registry hook (dqd_registry_on_codec_free): frees the device codec made for codec, which is
 * going (a later codec at the same address must not find it). Nothing may use it any more: the
 * registry frees only codecs no model and no request references. */
void dqd_gpu_forget_codec(void *gpu, const dqd_codec *codec);

/* Upper estimate of the device bytes, for dqd_store_gpu_reserve, of appending ntok tokens (may be
 * 0) to a layer: gpu when it is on the GPU; else host (may be NULL: a new layer) moved there.
 * With the hot layout, the hot copies of the windows count too (for a layer not yet on the GPU,
 * whenever the profile has a hot layout: the kernel's shape check needs the device codec); with
 * hot-only, instead of the records (the larger of the two for a layer not yet on the GPU). */
uint64_t dqd_gpu_need(const dqd_gpu *g, const dqd_codec *codec, const dq_layer *host, const dqd_glayer *gpu,
                      uint64_t ntok);
/* Hot windows (--gpu-attention-layout hot, gpulayer.h) held right now: transcoded windows and the
 * device bytes of their slots and pointer arrays (included in dqd_gpu_allocated); and the ATTEND
 * items attended over hot windows so far. 0 on the containers layout. */
void dqd_gpu_hot_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *bytes, uint64_t *items);
/* --gpu-attention-layout hot-only: the hot windows held without their record (part of the hot
 * windows above), and the window records rebuilt from hot windows so far: in all, on the device
 * (dqcu_rebuild_hot), and on the CPU (dq_hot_rebuild, where the device refused or failed). */
void dqd_gpu_hot_only_stats(const dqd_gpu *g, uint64_t *windows, uint64_t *rebuilt, uint64_t *rebuilt_gpu,
                            uint64_t *rebuilt_cpu);
/* Windows sealed on the device by dqcu_encode_windows (appends to GPU layers, every profile the GPU
 * tier holds) so far. */
uint64_t dqd_gpu_encode_stats(const dqd_gpu *g);
/* ATTEND items of GPU layers computed on the host so far (libdquant over a host copy of the
 * records: the fixed-width family, and version-2 profiles the container attention refuses, when
 * no hot windows serve them). */
uint64_t dqd_gpu_host_attend_stats(const dqd_gpu *g);

/* ---- worker threads (the caller holds the access the operation needs) ---- */

/* An append that can be undone, as dqd_append for host layers (append.h). */
typedef struct dqd_gappend {
    bool created; /* the layer did not exist before */
    bool applied;
    bool broken;        /* the layer could not be put back after a failure: drop the sequence */
    bool raw_nonfinite; /* refused because a raw input value is NaN/Inf (DQ_NONFINITE) */
    uint32_t nwin0, tail0, nseg0, slots0;
    uint16_t *snap; /* the previous tail (K then V), kept when the append sealed windows */
} dqd_gappend;

/* dqd_gpu_append flags. */
#define DQD_GAPPEND_DEVICE 1u  /* k and v are in device memory (else host memory) */
#define DQD_GAPPEND_CHECKED 2u /* dqd_gpu_check_tokens already passed them */

/* Appends ntok tokens (k, v: [ntok, kv_heads, head_dim] of dtype, in host or device memory, see
 * flags) to *slot, creating a GPU layer when *slot is NULL. Host input is copied to the device
 * first; the tokens are checked there (dqcu_tokens_check) unless flags has DQD_GAPPEND_CHECKED.
 * Same checks, same all-or-nothing result and same bytes as dq_layer_append (DQ_NONFINITE,
 * DQ_RANGE, DQ_NOMEM). stats (may be NULL) is added to. If a device failure leaves the layer
 * unrestorable, txn->broken is set. */
int dqd_gpu_append(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot, const void *k, const void *v,
                   dq_dtype dtype, size_t ntok, unsigned flags, dq_encode_stats *stats);
/* Whether one more token fits in layer l's tail without sealing a window (dqd_gpu_append_tokens
 * takes it). */
bool dqd_gpu_append_fits(const dqd_codec *codec, const dqd_glayer *l);
/* One token appended to each of count existing GPU layers of codec: tok[i].k and .v ([1, kv_heads,
 * head_dim] of .dtype in host memory) passed dq_check_tokens, the layers are distinct and each
 * dqd_gpu_append_fits. Rounded to BF16 on the host into one pinned block with the tail addresses,
 * then one copy and one dqcu_scatter_rows (per DQD_GPIN_BYTES of input), where dqd_gpu_append
 * takes two copies and two conversions per layer. *tok[i].txn as dqd_gpu_append's
 * (dqd_gpu_rollback undoes it); on failure those applied before stay applied. */
typedef struct dqd_gtoken {
    dqd_glayer *layer;
    dqd_gappend *txn;
    const void *k, *v;
    dq_dtype dtype;
} dqd_gtoken;
int dqd_gpu_append_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count);
/* Whether one more token seals layer l's tail into a window and leaves no rest (W == R, the tail
 * at R - 1; not a hot-only layer): dqd_gpu_append_seal_tokens takes it. */
bool dqd_gpu_append_seals_one(const dqd_codec *codec, const dqd_glayer *l);
/* One token appended to each of count existing GPU layers of codec, as dqd_gpu_append_tokens but
 * for layers that dqd_gpu_append_seals_one: their windows staged, encoded with one
 * dqcu_encode_windows and transcoded with one dqcu_transcode_hot, and their statuses read once,
 * per launch (the stage's and a pinned block's worth), where dqd_gpu_append takes each alone:
 * an encode, a transcode and a synchronization per window. *tok[i].txn as dqd_gpu_append's; on
 * failure the launch that failed is put back and those before stay applied. */
int dqd_gpu_append_seal_tokens(dqd_gpu *g, dqd_codec *codec, const dqd_gtoken *tok, size_t count);
/* The checks dq_layer_append makes, for a PUT of `layers` layers of ntok tokens each whose k and v
 * ([layers, ntok, kv_heads, head_dim] of dtype) are in device memory, in the order the host path
 * makes them: DQ_NONFINITE when any raw value is NaN/Inf (*bad_layer = UINT32_MAX), else the code
 * of the first failing layer (*bad_layer, relative to the first), K before V. */
int dqd_gpu_check_tokens(dqd_gpu *g, dqd_codec *codec, const void *k, const void *v, dq_dtype dtype, size_t layers,
                         size_t ntok, uint32_t *bad_layer);
/* Undoes an applied append (no-op otherwise); on failure (the device failed) txn->broken is set. */
int dqd_gpu_rollback(dqd_gpu *g, dqd_codec *codec, dqd_gappend *txn, dqd_glayer **slot);
void dqd_gappend_clear(dqd_gappend *txn);
/* Waits until the calling worker's GPU work is done (call at the end of a task that appended). */
int dqd_gpu_finish(dqd_gpu *g);

/* Moves a host layer to the GPU (*host freed and NULL, *gpu set) or back (dq_layer_restore). On
 * failure both slots are as before. */
int dqd_gpu_promote(dqd_gpu *g, dqd_codec *codec, dq_layer **host, dqd_glayer **gpu);
int dqd_gpu_demote(dqd_gpu *g, dqd_codec *codec, dqd_glayer **gpu, dq_layer **host);

/* Tokens [first, first + count) of K or V to out (host, [count, kv_heads, head_dim] of dtype):
 * identical to dq_layer_decode; DQ_CORRUPT when a container is invalid. */
int dqd_gpu_decode(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                   void *out, dq_dtype dtype);
/* The same into device memory dout. */
int dqd_gpu_decode_dev(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, dq_kind kind, size_t first, size_t count,
                       void *dout, dq_dtype dtype);
/* Device memory outside the budget for one request's transient data (a decoded GET reply for
 * NCCL), from the device's stream-ordered pool: alloc on a worker, free on the loop thread
 * (stream-ordered, never waits), once every use has completed. */
int dqd_gpu_alloc_transient(dqd_gpu *g, size_t bytes, void **out);
void dqd_gpu_free_transient(dqd_gpu *g, void *p);
/* Copies between host memory and device memory (done when they return). */
int dqd_gpu_h2d(dqd_gpu *g, void *dst, const void *src, size_t bytes);
int dqd_gpu_d2h(dqd_gpu *g, void *dst, const void *src, size_t bytes);
/* The layer as GET_RAW sends it: window records back to back, then tail K, then tail V. */
int dqd_gpu_copy_raw(dqd_gpu *g, dqd_codec *codec, const dqd_glayer *l, uint8_t *dst);

/* Decode attention over GPU layers of one codec, as dq_attend (q, out, lse: host memory, or device
 * memory when dev; lse may be NULL): one dqcu_attend launch per batch of items, or dqcu_attend_hot
 * over the hot copies when every layer of the batch has them and the kernel takes q_heads (else
 * the records: the result is the same within float rounding). */
typedef struct dqd_gattn {
    const dqd_glayer *layer;
    const float *q;
    float *out;
    float *lse;
} dqd_gattn;
int dqd_gpu_attend(dqd_gpu *g, dqd_codec *codec, uint32_t q_heads, float scale, const dqd_gattn *items, size_t n,
                   bool dev);

#endif
