/* dquant — CUDA kernels for the D-Quant codec (libdquant-cuda), bit-exact with libdquant.
 *
 * Everything here works on device pointers and runs asynchronously on the caller's CUDA stream.
 * The containers the encoder writes are byte-identical to libdquant's (dq_window_encode,
 * dq_stream_encode) and the decompressed tensors are identical to dq_tokens_decode /
 * dq_layer_decode: the kernels use the same IEEE operations in the same order (DESIGN §2,
 * lib/src/drift.h). Decode attention is computed on the containers (DESIGN §2.7, seed §4.5): each K
 * and V stream is decoded once, its levels feed the dot products and the value accumulation with
 * the affine terms folded in; its result matches dq_attend within float rounding.
 *
 * Return codes are dq_error values (0 or negative). A CUDA failure returns DQ_NOMEM (allocation)
 * or DQ_INTERNAL (anything else); dqcu_last_cuda_error() then gives the cudaError_t of the calling
 * thread's most recent failing CUDA call. Launch errors are reported at the call; errors of the
 * kernels themselves show at the caller's next synchronization, as usual in CUDA. Per-item input
 * errors (non-finite values, values outside the format's range) are written to device status
 * arrays, since the host does not see the data.
 *
 * Limits of this version (DQ_UNSUPPORTED beyond them): the encoders take streams of
 * n = kv_heads × head_dim <= DQCU_MAX_ENCODE_STREAM values; decompression and attention need
 * 32 <= head_dim <= 512; attention needs a GQA group q_heads / kv_heads <= 8 and its per-block
 * state (rotated queries, accumulator, a tile's weights: about 4·q_heads·(2·head_dim + 128) bytes)
 * in shared memory; dqcu_attend_check() says whether a shape fits (Qwen3-8B, Llama-3-70B do).
 * Levels and container sizes are those of any valid profile. Fixed-width profiles
 * (dq_profile_fixed: every width the family allows) have the encoders (records byte-identical to
 * libdquant's, whatever dqcu_settings.encode_kernel says: the family has one encoder) and the hot
 * layout (dqcu_transcode_hot, dqcu_attend_hot); dqcu_decompress and dqcu_attend answer
 * DQ_UNSUPPORTED for them. Format version 2 (joint pairs: dq226p, dq196p; lib/src/rans2.h) has
 * the encoders, dqcu_decompress, dqcu_transcode_hot, dqcu_rebuild_hot (byte-identical to
 * libdquant, the same statuses and corrupt verdicts), dqcu_attend_hot (its hot windows are
 * version 1's) and dqcu_attend (attention v7 decoding the pairs) when both kinds have at most 8
 * levels (the built-ins); beyond that dqcu_attend answers DQ_UNSUPPORTED (attention over its hot
 * windows).
 *
 * Kernel versions: a device codec runs the versions its dqcu_settings name (by default the fastest;
 * earlier versions stay for shapes the fastest cannot take and for comparisons).
 * tests/bench/GPU_NOTES.md has each version's design and measurements.
 *
 * Thread-safety: a dqcu_codec is immutable after creation and may be used from any thread and on
 * any stream of its device. Calls with distinct output buffers may run concurrently. */
#ifndef DQUANT_CUDA_H
#define DQUANT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "dquant/codec.h"
#include "dquant/error.h"
#include "dquant/profile.h"
#include "dquant/types.h"

#if defined(DQCU_BUILDING_LIB) && defined(__GNUC__)
#define DQCU_API __attribute__((visibility("default")))
#else
#define DQCU_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Largest stream (kv_heads × head_dim) the GPU encoders take. */
#define DQCU_MAX_ENCODE_STREAM 2048u

/* Number of CUDA devices of compute capability 9.0 or newer (the kernels are built for sm_90);
 * 0 when there is none or no driver. Never fails. */
DQCU_API int dqcu_device_count(void);

/* cudaError_t (as int) of the calling thread's most recent failing CUDA call made by this
 * library; 0 when none failed. */
DQCU_API int dqcu_last_cuda_error(void);

/* ---- settings ---- */

#define DQCU_KERNEL_AUTO 0
#define DQCU_SCHEDULE_PLANNED 0
#define DQCU_SCHEDULE_PLAIN 1

/* Which kernel versions a device codec runs, chosen by the caller when the codec is created
 * (dav1d's Dav1dSettings): fill with dqcu_settings_default(), change fields, pass to
 * dqcu_codec_create_with(). Every encoder version writes the same bytes; every attention version
 * gives dq_attend's result within float rounding. */
typedef struct dqcu_settings {
    uint32_t size; /* sizeof(dqcu_settings), set by dqcu_settings_default */
    /* Attention on the sealed windows: DQCU_KERNEL_AUTO (default) runs the newest version that takes
     * the shape and launches on the device (7, else 5, else 3); a version number (one of
     * dqcu_attend_kernels) the newest not newer than it that does. The BF16 tail is always v3's. */
    int attend_kernel;
    /* Encoder: DQCU_KERNEL_AUTO (default) = 5; 5 or 4 (one of dqcu_encode_kernels). */
    int encode_kernel;
    /* How an encode call's streams are spread over warps: DQCU_SCHEDULE_PLANNED (default; the last
     * waves shared out evenly) or DQCU_SCHEDULE_PLAIN (count / G warps, for comparisons). */
    int encode_schedule;
    /* Attention over hot windows: DQCU_KERNEL_AUTO (default) = 2, the warp kernel, where it takes
     * the shape (head_dim 128, windows of a multiple of 128 tokens), else 1, the block kernel;
     * 1 forces the block kernel (for comparisons). */
    int hot_kernel;
    int reserved[11]; /* zero: room for settings to come */
} dqcu_settings;

/* The defaults: size set, every choice automatic (what dqcu_codec_create uses). */
DQCU_API void dqcu_settings_default(dqcu_settings *s);

/* The kernel versions this build has, newest first, *count of them (count may be NULL); the array
 * is static. checkcuda and bench_cuda iterate them. */
DQCU_API const int *dqcu_attend_kernels(size_t *count);
DQCU_API const int *dqcu_encode_kernels(size_t *count);

/* ---- device codec ---- */

typedef struct dqcu_codec dqcu_codec;

/* Uploads what the kernels need from a host codec (frequency, cost and decode tables, the
 * rotation signs, the exp2 table of the drift) to the current CUDA device, once. The host codec is
 * only read during the call and may be freed afterwards; settings (NULL: the defaults) are copied.
 * D-Quant and fixed-width profiles only (another codec type: DQ_INVALID_ARGUMENT).
 * Returns 0, DQ_INVALID_ARGUMENT (also for settings with another size, a version this build does
 * not have, an unknown schedule or nonzero reserved fields), DQ_NOMEM, DQ_INTERNAL. */
DQCU_API int dqcu_codec_create_with(const dq_codec *codec, const dqcu_settings *settings, dqcu_codec **out);
/* dqcu_codec_create_with(codec, NULL, out). */
DQCU_API int dqcu_codec_create(const dq_codec *codec, dqcu_codec **out);
/* Frees the device codec (synchronizes with the device first); NULL is allowed. */
DQCU_API void dqcu_codec_free(dqcu_codec *dc);
/* The profile the codec was made from (host memory, owned by dc). */
DQCU_API const dq_profile *dqcu_codec_profile(const dqcu_codec *dc);

/* ---- encode ---- */

/* Encodes count already preprocessed streams (rotated and, for keys, mean-removed: exactly what
 * dq_stream_encode takes): y is [count, n] f32 (device). Record i (4 + C bytes: fp16 s, fp16 o,
 * container) goes to records + i·record_stride (device; record_stride >= dq_codec_record_bytes).
 * status (device, count int32, required) receives per stream 0, DQ_NONFINITE or DQ_RANGE, exactly
 * what dq_stream_encode returns; a stream with a nonzero status leaves its record unwritten.
 * stats (device, may be NULL) is added to atomically, with dq_stream_encode's meaning.
 * D-Quant and fixed-width codecs (the fixed-width family: 4 + C bytes of fp16 s, fp16 o and the
 * base-M packed levels, what lib's fixed-width encoder writes).
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_UNSUPPORTED (n too large), DQ_INTERNAL (launch failure). */
DQCU_API int dqcu_encode_streams(const dqcu_codec *dc, dq_kind kind, const float *y, size_t count, uint8_t *records,
                                 size_t record_stride, int32_t *status, dq_encode_stats *stats, cudaStream_t stream);

/* Encodes nwin full windows: k and v are [nwin, W, kv_heads, head_dim] of dtype (device). Window w
 * is written to windows[w] (windows: device array of nwin device pointers, each to
 * dq_codec_window_bytes() bytes), byte-identical to dq_window_encode of the same W tokens.
 * status (device, nwin int32, required) receives per window 0, DQ_NONFINITE or DQ_RANGE, what
 * dq_window_encode returns; a window with a nonzero status holds unspecified bytes. stats as above.
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_DTYPE, DQ_UNSUPPORTED, DQ_INTERNAL. */
DQCU_API int dqcu_encode_windows(const dqcu_codec *dc, const void *k, const void *v, dq_dtype dtype, size_t nwin,
                                 uint8_t *const *windows, int32_t *status, dq_encode_stats *stats, cudaStream_t stream);

/* ---- token checks (appends from device memory) ---- */

/* Checks ntok tokens x ([ntok, kv_heads, head_dim] of dtype, device) as dq_layer_append does before
 * it changes anything: check (device, two u64) must hold {0, UINT64_MAX} before the call; the
 * kernel ORs 1 into check[0] when a raw value is NaN or infinite, and lowers check[1] to 2t for a
 * token t whose BF16 rounding overflows, 2t + 1 for one whose rotated values exceed
 * DQ_TOKEN_MAX_ABS. dqcu_tokens_verdict turns the two words (copied to the host) into the code
 * dq_layer_append returns for the same tokens: 0, DQ_NONFINITE or DQ_RANGE.
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_DTYPE, DQ_UNSUPPORTED (n too large), DQ_INTERNAL. */
DQCU_API int dqcu_tokens_check(const dqcu_codec *dc, const void *x, dq_dtype dtype, size_t ntok,
                               unsigned long long *check, cudaStream_t stream);
DQCU_API int dqcu_tokens_verdict(const unsigned long long check[2]);

/* BF16 of count values of dtype (device to device), each exactly dq_f32_to_bf16 of the value.
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_DTYPE, DQ_INTERNAL. */
DQCU_API int dqcu_to_bf16(const void *x, dq_dtype dtype, size_t count, uint16_t *out, cudaStream_t stream);

/* Copies nrows rows of n BF16 values, row i from src + i·n to dst[i] (src, the pointer array dst
 * and every dst[i] in device memory; rows must not overlap): one launch for many small copies,
 * such as single tokens appended to the tails of many layers. Returns 0, DQ_INVALID_ARGUMENT,
 * DQ_INTERNAL. */
DQCU_API int dqcu_scatter_rows(const uint16_t *src, uint32_t n, uint16_t *const *dst, uint32_t nrows,
                               cudaStream_t stream);

/* ---- decompress ---- */

/* Decodes tokens [first, first + count) of one kind of a layer held as nwin sealed windows
 * (windows: device array of device pointers) followed by a BF16 tail of tail_tokens tokens (tail:
 * device [tail_tokens, kv_heads, head_dim], may be NULL when tail_tokens is 0) into out
 * ([count, kv_heads, head_dim] of dtype, device): identical to dq_layer_decode of the same layer.
 * corrupt (device, may be NULL) is incremented once per invalid container decoded (its values are
 * still written, as libdquant does). Returns 0, DQ_INVALID_ARGUMENT, DQ_DTYPE, DQ_OUT_OF_BOUNDS,
 * DQ_UNSUPPORTED (head_dim), DQ_INTERNAL. */
DQCU_API int dqcu_decompress(const dqcu_codec *dc, dq_kind kind, const uint8_t *const *windows, size_t nwin,
                             const uint16_t *tail, size_t tail_tokens, size_t first, size_t count, void *out,
                             dq_dtype dtype, uint32_t *corrupt, cudaStream_t stream);

/* ---- decode attention ---- */

/* One sequence's layer, as the kernels see it (this struct lives in device memory). */
typedef struct dqcu_attn_seq {
    const uint8_t *const *windows; /* device array of nwin device pointers to window records */
    const uint16_t *tail_k;        /* device BF16 [tail_tokens, kv_heads, head_dim] */
    const uint16_t *tail_v;
    uint32_t nwin;        /* sealed windows */
    uint32_t tail_tokens; /* tokens in the BF16 tail */
} dqcu_attn_seq;

/* 0 when dqcu_attend takes q_heads query heads with this codec on its device, DQ_SHAPE when
 * q_heads is not a positive multiple of kv_heads, DQ_UNSUPPORTED when the shape is beyond the
 * kernel's limits (see the top of this file). */
DQCU_API int dqcu_attend_check(const dqcu_codec *dc, uint32_t q_heads);

/* The attention version dqcu_attend runs on the sealed windows of q_heads query heads with this
 * codec (its settings and device), or dqcu_attend_check's error. */
DQCU_API int dqcu_attend_kernel(const dqcu_codec *dc, uint32_t q_heads);

/* Bytes of workspace dqcu_attend needs for nseq sequences of at most max_tokens tokens each (0
 * where dqcu_attend answers DQ_UNSUPPORTED for the codec). */
DQCU_API size_t dqcu_attend_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq, uint32_t max_tokens);

/* Decode attention for a batch of nseq sequences of different lengths in one launch:
 * out[b] = softmax(scale · q[b]·Kᵀ)·V over every token of sequence b (sealed windows straight from
 * their containers, the tail exactly from BF16), per query head, GQA (query head h reads KV head
 * h / (q_heads / kv_heads)), with split-K over long contexts and a log-sum-exp merge.
 *   seqs: device array of nseq dqcu_attn_seq; every sequence has nwin·W + tail_tokens <= max_tokens.
 *   q:    device f32 [nseq, q_heads, head_dim] (original domain, finite).
 *   out:  device f32 [nseq, q_heads, head_dim]; lse: device f32 [nseq, q_heads] or NULL
 *         (natural log of Σ exp(scaled logit)); an empty sequence gives 0 and -inf.
 *   workspace: device memory of at least dqcu_attend_workspace_size() bytes, 16-byte aligned (as
 *              cudaMalloc gives it).
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_SHAPE (q_heads not a multiple of kv_heads), DQ_UNSUPPORTED
 * (see dqcu_attend_check), DQ_INTERNAL. */
DQCU_API int dqcu_attend(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs, uint32_t nseq,
                         uint32_t max_tokens, const float *q, float *out, float *lse, void *workspace,
                         size_t workspace_bytes, cudaStream_t stream);

/* ---- the hot layout (dquant/hot.h): attention without rANS ---- */

/* Bytes of one hot window of the codec's profile (dq_hot_window_bytes); 0 when dc is NULL. */
DQCU_API size_t dqcu_hot_window_bytes(const dqcu_codec *dc);

/* Transcodes nwin window records into hot windows, byte-identical to dq_hot_transcode: windows
 * and hot are device arrays of nwin device pointers (records of dq_codec_window_bytes, hot windows
 * of dqcu_hot_window_bytes, 4-byte aligned, not overlapping). corrupt (device, may be NULL) is
 * incremented once per invalid container (its levels are still written, as libdquant does).
 * Returns 0, DQ_INVALID_ARGUMENT, DQ_UNSUPPORTED (head_dim outside 32..512), DQ_INTERNAL. */
DQCU_API int dqcu_transcode_hot(const dqcu_codec *dc, const uint8_t *const *windows, size_t nwin, uint8_t *const *hot,
                                uint32_t *corrupt, cudaStream_t stream);

/* The inverse (dq_hot_rebuild): rebuilds nwin window records from hot windows, byte for byte the
 * records dqcu_transcode_hot / dq_hot_transcode made them from: hot and windows are device arrays
 * of nwin device pointers (hot windows 4-byte aligned, not overlapping the records). Only the
 * codes are checked: bad (device, may be NULL) becomes nonzero when a stream's code is not a level
 * or its levels fit no container (that record is not valid); the rest dq_hot_check checks is taken
 * as it is (hot windows a transcode wrote). Returns 0, DQ_INVALID_ARGUMENT, DQ_UNSUPPORTED
 * (head_dim outside 32..512, or a fixed-width codec), DQ_INTERNAL. */
DQCU_API int dqcu_rebuild_hot(const dqcu_codec *dc, const uint8_t *const *hot, size_t nwin, uint8_t *const *windows,
                              uint32_t *bad, cudaStream_t stream);

/* 0 when dqcu_attend_hot takes q_heads query heads with this codec on its device: the limits of
 * dqcu_attend_check, and besides head_dim a multiple of 128 up to 256, a GQA group of 1, 2, 4 or
 * 8, and codes of 3 + 3, 4 + 4, 3 + 2 or 2 + 1 bits (dq226 and dq196 take 3 + 3; fixed226 and
 * fixed196 at n = 1024 take 3 + 2 and 2 + 1); DQ_UNSUPPORTED beyond them, DQ_SHAPE as
 * dqcu_attend_check. */
DQCU_API int dqcu_attend_hot_check(const dqcu_codec *dc, uint32_t q_heads);

/* The hot attention kernel dqcu_attend_hot runs for q_heads query heads with this codec: 2 (the
 * warp kernel) or 1 (the block kernel), see dqcu_settings.hot_kernel; or dqcu_attend_hot_check's
 * error. */
DQCU_API int dqcu_attend_hot_kernel(const dqcu_codec *dc, uint32_t q_heads);

/* Bytes of workspace dqcu_attend_hot needs (0 when dqcu_attend_hot_check fails). */
DQCU_API size_t dqcu_attend_hot_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq,
                                               uint32_t max_tokens);

/* dqcu_attend over hot windows: the same arguments, except that each dqcu_attn_seq's windows point
 * to hot windows (dqcu_transcode_hot, dq_hot_transcode; 16-byte aligned) and its tails must be
 * 16-byte aligned (as cudaMalloc gives them). Matches dq_hot_attend
 * (and dq_attend of the records they came from) within float rounding. One launch runs the
 * windows and the BF16 tail (split over the context and over groups of KV heads, so one sequence
 * fills the GPU), a second merges the splits. Returns 0, DQ_INVALID_ARGUMENT, DQ_SHAPE,
 * DQ_UNSUPPORTED (dqcu_attend_hot_check), DQ_INTERNAL. */
DQCU_API int dqcu_attend_hot(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs,
                             uint32_t nseq, uint32_t max_tokens, const float *q, float *out, float *lse,
                             void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
