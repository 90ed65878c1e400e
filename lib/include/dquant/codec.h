/* dquant — the D-Quant codec: streams, windows and token blocks.
 *
 * Terms (DESIGN §2). A *stream* is the n = kv_heads × head_dim values of the keys (or of the
 * values) of one token in one layer. It is encoded into a fixed-size *container* of C bytes (rANS
 * state + bytes) plus an fp16 scale and offset. Keys are encoded after a per-head randomized
 * Hadamard rotation and the removal of a windowed channel mean (INT8, one fp16 scale per window);
 * values after the rotation alone.
 *
 * A *window record* holds W consecutive tokens of one layer, keys and values, at fixed offsets:
 *
 *   offset 0                      fp16 key-mean scale (2 bytes, little endian)
 *   offset 2                      int8 key mean, n bytes
 *   offset 2 + n                  W key records,   each 4 + C_K bytes: fp16 s, fp16 o, container
 *   offset 2 + n + W·(4 + C_K)    W value records, each 4 + C_V bytes: fp16 s, fp16 o, container
 *
 * so a token's record is at base + t·stride with no offset table. Containers are little-endian: the
 * final rANS state (4 bytes), then the renormalization bytes in the order the decoder reads them,
 * then zeros.
 *
 * Thread-safety: a dq_codec is immutable after creation and may be shared by any number of threads.
 * A dq_workspace is scratch memory for one thread at a time. */
#ifndef DQUANT_CODEC_H
#define DQUANT_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/export.h"
#include "dquant/profile.h"
#include "dquant/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Range the format represents (fp16 scale/offset): stream values (rotated, mean removed) must
 * satisfy |y| <= DQ_STREAM_MAX_ABS, token values after rotation |y| <= DQ_TOKEN_MAX_ABS; larger
 * inputs are refused with DQ_RANGE. (Real K/V sit orders of magnitude below.) */
#define DQ_STREAM_MAX_ABS 30000.0f
#define DQ_TOKEN_MAX_ABS 14000.0f

typedef struct dq_codec dq_codec;
typedef struct dq_workspace dq_workspace;

/* Creates a codec for a validated profile (copied). alloc may be NULL (malloc/free); the codec and
 * everything made from it allocate through it. Returns 0, DQ_PROFILE, DQ_NOMEM. */
DQ_API int dq_codec_create(const dq_profile *profile, const dq_allocator *alloc, dq_codec **out);
/* Frees a codec; NULL is allowed. Workspaces and layers made from it must be freed first. */
DQ_API void dq_codec_free(dq_codec *codec);
DQ_API const dq_profile *dq_codec_profile(const dq_codec *codec);
/* n = kv_heads × head_dim */
DQ_API uint32_t dq_codec_stream_len(const dq_codec *codec);
/* Bytes of one key / value record (4 + C) and of one window record. */
DQ_API size_t dq_codec_record_bytes(const dq_codec *codec, dq_kind kind);
DQ_API size_t dq_codec_window_bytes(const dq_codec *codec);
/* Bytes of the key-mean block at the head of a window record (2 + n). */
DQ_API size_t dq_codec_mean_bytes(const dq_codec *codec);

/* Scratch memory for encoding, decoding and attention by one thread at a time. */
DQ_API int dq_workspace_create(const dq_codec *codec, dq_workspace **out);
DQ_API void dq_workspace_free(dq_workspace *ws);

/* Per-call encoder statistics, summed over the streams of the call. */
typedef struct dq_encode_stats {
    uint64_t streams;
    uint64_t retries;           /* streams whose first rANS pass overflowed and were redone */
    uint64_t fallbacks;         /* streams that fell back to the all-cheapest assignment */
    uint32_t max_payload_bytes; /* largest container fill seen (state + bytes) */
    uint64_t payload_bytes;     /* sum of container fills */
    uint64_t symbols_moved;     /* symbols whose final level differs from nearest rounding */
    uint32_t max_move;          /* largest such difference, in levels */
} dq_encode_stats;

/* ---- stream level: values already in the rotated (and, for keys, mean-removed) domain ---- */

/* Encodes n preprocessed values into one record (4 + C bytes: fp16 s, fp16 o, container).
 * y must be finite (DQ_NONFINITE) and within DQ_STREAM_MAX_ABS (DQ_RANGE); nothing else fails:
 * every stream fits its container. stats may be NULL; it is added to, not reset. */
DQ_API int dq_stream_encode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const float *y, uint8_t *record,
                            dq_encode_stats *stats);
/* Decodes a record's symbols (levels[n], each < M). The scalar reference decoder.
 * Returns 0, or DQ_CORRUPT when the container is not a valid stream (levels are still written, and
 * never read outside the record). */
DQ_API int dq_stream_decode_levels(const dq_codec *codec, dq_kind kind, const uint8_t *record, uint8_t *levels);
/* Decodes a record to n values in the rotated domain (o + s·m; keys without their mean). */
DQ_API int dq_stream_decode(const dq_codec *codec, dq_kind kind, const uint8_t *record, float *y);

/* ---- token level: original-domain tensors [tokens, kv_heads, head_dim] ---- */

/* Rotates one token's n values in place (forward: y = H·D·x/sqrt(d) per head) or back. */
DQ_API void dq_rotate(const dq_codec *codec, float *x);
DQ_API void dq_unrotate(const dq_codec *codec, float *y);

/* Encodes ntok tokens of keys (kind K, 1 <= ntok <= W) as one window: computes the window's
 * channel mean over these ntok tokens, writes the mean block (2 + n bytes) to mean and the ntok
 * key records to records[t · record_stride]. For values (kind V) mean must be NULL and ntok may be
 * any count. x is [ntok, kv_heads, head_dim] of dtype. Validates everything (DQ_NONFINITE,
 * DQ_RANGE: |rotated value| > DQ_TOKEN_MAX_ABS) before writing anything. */
DQ_API int dq_tokens_encode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype,
                            size_t ntok, uint8_t *mean, uint8_t *records, size_t record_stride, dq_encode_stats *stats);
/* Decodes ntok records (kind K needs the window's mean block) to [ntok, kv_heads, head_dim] of
 * dtype in the original domain. Returns DQ_CORRUPT if any record was invalid (all are written). */
DQ_API int dq_tokens_decode(const dq_codec *codec, dq_workspace *ws, dq_kind kind, const uint8_t *mean,
                            const uint8_t *records, size_t record_stride, size_t ntok, void *out, dq_dtype dtype);

/* Encodes one full window (W tokens of K and V, [W, kv_heads, head_dim] each) into a window
 * record of dq_codec_window_bytes() bytes. */
DQ_API int dq_window_encode(const dq_codec *codec, dq_workspace *ws, const void *k, const void *v, dq_dtype dtype,
                            uint8_t *window, dq_encode_stats *stats);
/* Pointers into a window record. */
DQ_API const uint8_t *dq_window_mean(const dq_codec *codec, const uint8_t *window);
DQ_API const uint8_t *dq_window_record(const dq_codec *codec, const uint8_t *window, dq_kind kind, size_t t);

/* Checks a window record against the container's decode invariants (DESIGN 2.3) without keeping
 * anything: the fp16 key-mean scale finite; for every key and value record, fp16 s finite and not
 * negative, fp16 o finite, and the container decodes its n symbols back to the initial state with
 * every unused byte zero (fixed-width profiles: every group's value a number of its levels' base-M
 * digits, every bit past the groups zero). Returns 0, DQ_CORRUPT, DQ_NOMEM (n > 256 needs
 * scratch). Baseline codecs (no redundancy) always pass. Thread-safe (the codec is only read). */
DQ_API int dq_window_check(const dq_codec *codec, const uint8_t *window);

/* Checks that every value is finite. Returns 0 or DQ_NONFINITE. */
DQ_API int dq_check_finite(const void *x, dq_dtype dtype, size_t count);
/* The checks dq_layer_append makes on ntok tokens x ([ntok, kv_heads, head_dim] of dtype) of
 * ws's codec: DQ_NONFINITE if a value is NaN/Inf (raw or once rounded to BF16), DQ_RANGE if a
 * rotated value exceeds the codec's range. Returns 0 when dq_layer_append would take them. */
DQ_API int dq_check_tokens(dq_workspace *ws, const void *x, dq_dtype dtype, size_t ntok);

#ifdef __cplusplus
}
#endif
#endif
