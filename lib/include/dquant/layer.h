/* dquant — one layer of one sequence: sealed windows of containers plus a BF16 tail.
 *
 * Tokens are appended in order. The newest tokens stay in a BF16 tail; whenever the tail holds R
 * tokens its oldest W tokens are sealed: encoded into one window record (DESIGN §2, W = R = 128 in
 * dq226: a window is encoded when its 128th token arrives). Any token range can be decoded.
 *
 * Memory comes from the codec's allocator: one block per sealed window (dq_codec_window_bytes),
 * one array of window pointers, one tail buffer of R tokens.
 *
 * Thread-safety: appends need exclusive access; decodes and attention may run concurrently with
 * each other (each with its own workspace) but not with an append. */
#ifndef DQUANT_LAYER_H
#define DQUANT_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dq_layer dq_layer;

DQ_API int dq_layer_create(const dq_codec *codec, dq_layer **out);
/* Frees the layer and its windows; NULL is allowed. */
DQ_API void dq_layer_free(dq_layer *layer);

/* Appends ntok tokens: k and v are [ntok, kv_heads, head_dim] of dtype. All-or-nothing: the input
 * is validated first (DQ_NONFINITE, DQ_RANGE, DQ_DTYPE) and on any failure, allocation failure
 * included, the layer is left exactly as it was. stats (may be NULL) is added to. */
DQ_API int dq_layer_append(dq_layer *layer, dq_workspace *ws, const void *k, const void *v, dq_dtype dtype, size_t ntok,
                           dq_encode_stats *stats);

DQ_API size_t dq_layer_tokens(const dq_layer *layer);
/* Tokens held in sealed windows (a multiple of W) and in the BF16 tail. */
DQ_API size_t dq_layer_sealed_tokens(const dq_layer *layer);
DQ_API size_t dq_layer_tail_tokens(const dq_layer *layer);
/* Bytes this layer stores (window records + the tail's BF16 tokens in use). */
DQ_API size_t dq_layer_stored_bytes(const dq_layer *layer);
/* Bytes allocated (window records + window pointer array + the tail buffer). */
DQ_API size_t dq_layer_allocated_bytes(const dq_layer *layer);

/* Decodes tokens [first, first + count) of K or V to out ([count, kv_heads, head_dim] of dtype),
 * sealed tokens through the codec, tail tokens from BF16. DQ_OUT_OF_BOUNDS if the range is not
 * held. */
DQ_API int dq_layer_decode(const dq_layer *layer, dq_workspace *ws, dq_kind kind, size_t first, size_t count, void *out,
                           dq_dtype dtype);

/* Raw access for stores, transports and GPU upload. Window i's record, i < sealed/W. */
DQ_API size_t dq_layer_window_count(const dq_layer *layer);
DQ_API const uint8_t *dq_layer_window(const dq_layer *layer, size_t i);
/* The tail: [tail_tokens, kv_heads, head_dim] BF16 for K and V. */
DQ_API const uint16_t *dq_layer_tail(const dq_layer *layer, dq_kind kind);

/* Builds a layer from raw parts (a copy is made): nwin window records back to back and a BF16
 * tail of tail_tokens (< R) tokens for K and V. Every record is checked (DQ_CORRUPT). */
DQ_API int dq_layer_restore(const dq_codec *codec, const uint8_t *windows, size_t nwin, const uint16_t *tail_k,
                            const uint16_t *tail_v, size_t tail_tokens, dq_layer **out);
/* The same without checking the window records (the tail is still checked): for parts whose
 * integrity the caller has established otherwise, e.g. read back from storage that checksums
 * records which passed the check when they were first stored. dq_window_check decodes every
 * stream; this costs a copy. A record that is not valid anyway decodes to garbage, never to a
 * read outside the layer (DESIGN 2.3), and is reported as DQ_CORRUPT by the decode. */
DQ_API int dq_layer_restore_unchecked(const dq_codec *codec, const uint8_t *windows, size_t nwin,
                                      const uint16_t *tail_k, const uint16_t *tail_v, size_t tail_tokens,
                                      dq_layer **out);

/* Appends nwin whole window records (back to back, dq_codec_window_bytes each, made with this
 * layer's profile) as they are: no re-encoding. The layer must hold no tail (DQ_ORDER), i.e. its
 * length is a multiple of W. Every record is checked first (dq_window_check); on DQ_CORRUPT
 * *bad_window (may be NULL) is the first bad record's index. All-or-nothing: on any failure,
 * DQ_NOMEM included, the layer is as it was. */
DQ_API int dq_layer_append_windows(dq_layer *layer, const uint8_t *windows, size_t nwin, size_t *bad_window);

#ifdef __cplusplus
}
#endif
#endif
