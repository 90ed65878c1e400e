/* dquant — the hot layout: a window's levels at fixed width, for attention without rANS.
 *
 * Why. Decode attention on the containers (attention.h) decodes 2·n rANS symbols per token, one
 * dependent step after another; on a GPU that loop, not memory, bounds the speed (issue 19,
 * tests/bench/GPU_NOTES.md). A *hot window* holds the same window with each stream's levels
 * written as fixed-width codes, so attention reads them with shifts and masks. It is a lossless
 * transcoding of a D-Quant window record (dq_hot_transcode): the same levels, the same fp16 scale
 * and offset per stream, the same INT8 key mean, so it reconstructs exactly what the record does
 * (dq_hot_decode equals dq_tokens_decode bit for bit) and attention over it gives dq_attend's
 * result. It costs memory: b = ceil(log2 M) bits per value instead of the container's ~C·8/n
 * (dq226, n = 1024: 3 + 3 bits; 784 B per token and layer against the record's 578 B, 1.36×;
 * BF16 takes 4096 B, 5.2× more). A store keeps hot windows as a speed tier beside (or instead
 * of) the records, which stay the format that travels and persists.
 *
 * Layout of a hot window (W tokens of one layer; n = kv_heads × head_dim; G = ceil(n / 32) groups
 * of 32 channels; b_K, b_V = dq_hot_bits of keys and values; all fields little endian):
 *
 *   offset 0        the window record's key-mean block as it is (fp16 scale, n int8 means),
 *                   zero-padded to A = 16·ceil((2 + n) / 16) bytes
 *   offset A        W key (s, o) pairs: fp16 s, fp16 o of token t at A + 4t
 *   offset A + 4W   W value (s, o) pairs, likewise
 *   offset CK       key codes, CK = 16·ceil((A + 8W) / 16): G·b_K·W words of 32 bits;
 *                   word i (0 <= i < b_K) of group g for token t at CK + 4·((g·b_K + i)·W + t)
 *   offset CV       value codes, CV = CK + 4·G·b_K·W: G·2b_V·P words, P = ceil(W / 2) token pairs;
 *                   word i (0 <= i < 2b_V) of group g for tokens 2p, 2p + 1 at
 *                   CV + 4·((g·2b_V + i)·P + p), token 2p in bits 0..15, 2p + 1 in bits 16..31
 *   total           CV + 8·G·b_V·P bytes (dq_hot_window_bytes)
 *
 * Codes sit in *lanes* of U bits, b units each (b = b_K or b_V): a unit holds q = U / b codes in
 * b-bit fields from its bit 0 (code k < q·b: unit k / q, bits from b·(k % q)), and the
 * r = U - q·b bits above them, unit after unit, pool the bits of the lane's other r codes (code
 * k >= q·b: bit e is pool bit u = (k - q·b)·b + e, at unit u / r, bit q·b + u % r). Every lane holds
 * U codes in U·b bits, so nothing is padding.
 *   keys:   a (group, token)'s b words are 4 byte lanes (U = 8): channel c of the group is code
 *           c / 4 of byte lane c % 4 (unit i = byte c % 4 of word i). A GPU makes four channels'
 *           codes (4k .. 4k + 3) as the four bytes of one register with a shift and a mask (code
 *           k < q·b), the int8 operand of an integer tensor-core product.
 *   values: a (group, token pair)'s 2b words are, for channels 16h .. 16h + 15 (h = 0, 1), words
 *           b·h .. b·h + b - 1, each token a lane of half-words (U = 16): channel 16h + k is code k.
 *           Both tokens' codes of a channel are 16 bits apart, so one shift and one mask make the
 *           fp16 pair (512 + m, 512 + m') of a value MMA's operand.
 * Channels past n (when n is not a multiple of 32) are zero codes; an odd W's missing token W has
 * zero codes. With b = 3: codes 0..5 of a byte lane are fields of its three bytes, codes 6 and 7
 * the bits 6..7 of all three; codes 0..14 of a half-word lane fields, code 15 the bit 15 of its
 * three half-words. Words of consecutive tokens (token pairs) are adjacent, so a GPU warp reading a
 * word index for consecutive tokens reads one coalesced line.
 *
 * D-Quant profiles and the fixed-width family (dq_profile_fixed: the same levels, s, o and key
 * mean, its base-M containers unpacked to b bits) have a hot layout; other codecs do not
 * (DQ_UNSUPPORTED, window bytes 0).
 * Thread-safety: every function only reads the codec; a workspace is for one thread at a time. */
#ifndef DQUANT_HOT_H
#define DQUANT_HOT_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of one hot window of the codec's profile; 0 when the codec is not D-Quant. */
DQ_API size_t dq_hot_window_bytes(const dq_codec *codec);
/* Bits per code of a kind: ceil(log2 M), at least 1; 0 for a codec that is not D-Quant or a bad
 * kind. */
DQ_API uint32_t dq_hot_bits(const dq_codec *codec, dq_kind kind);
/* Offsets (see the layout above) of the key (s, o) pairs, the value (s, o) pairs, the key codes
 * and the value codes, in that order, in off[4]; returns dq_hot_window_bytes (0: not D-Quant). */
DQ_API size_t dq_hot_offsets(const dq_codec *codec, size_t off[4]);

/* Transcodes a window record (dq_codec_window_bytes, borrowed) into a hot window
 * (dq_hot_window_bytes, written; must not overlap it). Every stream's levels come from the
 * reference decoder (dq_stream_decode_levels). Returns 0, DQ_INVALID_ARGUMENT, DQ_UNSUPPORTED
 * (not D-Quant), or DQ_CORRUPT when a container is not a valid stream (the hot window is still
 * written in full, with the levels the decoder produced: it reconstructs what the record does). */
DQ_API int dq_hot_transcode(const dq_codec *codec, const uint8_t *window, uint8_t *hot);

/* The exact inverse of dq_hot_transcode: rebuilds the window record (dq_codec_window_bytes,
 * written; must not overlap hot) from bytes bytes at hot, byte for byte the record the window was
 * transcoded from when dq_hot_transcode returned 0 for it. Everything a record holds is kept by
 * the hot window (the key-mean block and each stream's fp16 s and o verbatim, its levels as codes)
 * or follows from it: a valid stream's rANS container (state, bytes, zero tail) is a function of
 * its levels and the profile's table, so re-encoding them reproduces it; a fixed-width container
 * is its levels packed base-M, packed again. (A window transcoded from
 * a corrupt record, where dq_hot_transcode returned DQ_CORRUPT, rebuilds to a valid record that
 * reconstructs the same values, not to the corrupt bytes.) Returns 0, DQ_INVALID_ARGUMENT,
 * DQ_UNSUPPORTED (neither D-Quant nor fixed-width), DQ_NOMEM, DQ_TRUNCATED or DQ_CORRUPT when dq_hot_check rejects the
 * window, and DQ_CORRUPT when a stream's levels do not fit its container (no valid record holds
 * them); on any error the window is zeroed, never a partial record. */
DQ_API int dq_hot_rebuild(const dq_codec *codec, const uint8_t *hot, size_t bytes, uint8_t *window);

/* Checks bytes bytes at hot as a hot window of the codec: DQ_TRUNCATED when bytes is below
 * dq_hot_window_bytes, DQ_CORRUPT when the key-mean scale is not finite, a stream's s is negative
 * or not finite, an o is not finite, a code is >= M, or padding (the mean block's, a group's bits
 * past its channels or past b·32) is not zero. Returns 0 when it is a window dq_hot_transcode can
 * produce from a valid record. */
DQ_API int dq_hot_check(const dq_codec *codec, const uint8_t *hot, size_t bytes);

/* The levels (n bytes) of token t's stream of a kind. Returns 0, DQ_INVALID_ARGUMENT (t >= W). */
DQ_API int dq_hot_levels(const dq_codec *codec, const uint8_t *hot, dq_kind kind, size_t t, uint8_t *levels);

/* Decodes tokens [first, first + count) of a hot window (first + count <= W) to out
 * ([count, kv_heads, head_dim] of dtype, original domain): bit-identical to dq_tokens_decode of
 * the record it was transcoded from. Returns 0, DQ_INVALID_ARGUMENT, DQ_DTYPE, DQ_OUT_OF_BOUNDS,
 * DQ_UNSUPPORTED. */
DQ_API int dq_hot_decode(const dq_codec *codec, dq_workspace *ws, const uint8_t *hot, dq_kind kind, size_t first,
                         size_t count, void *out, dq_dtype dtype);

/* One attention item over a layer held as hot windows plus a BF16 tail (all borrowed). */
typedef struct dq_hot_item {
    const uint8_t *const *windows; /* nwin hot windows, oldest first */
    size_t nwin;
    const uint16_t *tail_k; /* BF16 [tail_tokens, kv_heads, head_dim]; NULL when tail_tokens is 0 */
    const uint16_t *tail_v;
    size_t tail_tokens;
    const float *q; /* [q_heads, head_dim], original domain */
    float *out;     /* [q_heads, head_dim]; written */
    float *lse;     /* [q_heads]; written; may be NULL */
} dq_hot_item;

/* dq_attend over hot windows: the same computation in the same order (levels, scales, offsets and
 * means are the record's), so for a layer whose windows were transcoded from its records the
 * outputs and LSE are identical to dq_attend's. The reference the GPU's hot attention is checked
 * against. Errors as dq_attend (queries: DQ_NONFINITE, DQ_RANGE; DQ_SHAPE; a non-finite result:
 * DQ_RANGE) and DQ_UNSUPPORTED for a codec that is not D-Quant. */
DQ_API int dq_hot_attend(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale,
                         const dq_hot_item *items, size_t nitems);

#ifdef __cplusplus
}
#endif
#endif
