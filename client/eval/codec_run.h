/* dquant command-line tool: one layer's K or V through any codec profile, in memory.
 *
 * Shared by `dquant codec` (cmd_codec.c) and `dquant eval` (eval_core.c): every token is encoded
 * window by window (W tokens; keys get the window's INT8 channel mean, the last partial window
 * the mean of its own tokens), nothing is kept in a BF16 tail, and the records are decoded back. */
#ifndef DQUANT_CODEC_RUN_H
#define DQUANT_CODEC_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/profile.h"

typedef struct codec_rt_result {
    uint64_t streams, tokens, retries, fallbacks;
    uint32_t container_bytes, max_payload;
    uint64_t stored_bytes;  /* records + key window headers */
    uint64_t payload_bytes; /* sum of container fills (D-Quant; 0 for baselines) */
    uint64_t symbols_moved; /* drift: symbols off nearest rounding (D-Quant) */
    double bits_per_value, moved_fraction;
    uint32_t max_move;
    double encode_s;
} codec_rt_result;

/* Encodes ntok tokens of x (f32, [ntok, kv_heads · head_dim]) as one layer's keys or values with
 * profile p (D-Quant or a baseline), decodes into xhat (f32, same shape) and fills res. levels may
 * be NULL; for a D-Quant profile it receives every stream's final symbols ([ntok, n], read back
 * from the records with dq_stream_decode_levels). Returns 0 or a dq_error code. */
int codec_roundtrip_f32(const dq_profile *p, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *levels,
                        codec_rt_result *res);

/* The same with an existing codec (a calibrated codec's per-layer view, dq_codec_layer). */
int codec_roundtrip_codec(const dq_codec *c, dq_kind kind, const float *x, size_t ntok, float *xhat, uint8_t *levels,
                          codec_rt_result *res);

#endif
