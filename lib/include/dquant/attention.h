/* dquant — decode attention computed on the containers (DESIGN §2.7, seed Appendix A).
 *
 * For each item (one sequence's layer and one decode-step query of q_heads × head_dim), computes
 * softmax(scale · q·Kᵀ)·V over every token of the layer: sealed tokens straight from their
 * containers (rotated query, affine terms applied after the contraction, each stream decoded once
 * per call), tail tokens exactly from BF16. GQA: query head h reads KV head h / (q_heads/kv_heads).
 * Writes the output per query head ([q_heads, head_dim], f32, original domain) and its
 * log-sum-exp (natural log, of the scaled logits) so callers can merge partial results.
 *
 * An empty layer gives out = 0 and lse = -inf.
 *
 * Numerics. A query is taken when, for every query head h, ‖q_h‖₂ · max(1, |scale|) <=
 * DQ_ATTEND_QUERY_MAX: every value a layer can hold is bounded (fp16 scale, offset and mean scale
 * in the records, |rotated value| <= DQ_TOKEN_MAX_ABS in the BF16 tail), so every logit and every
 * partial sum then stays finite (by a margin of about 10^9 at head_dim 65536) and output and LSE
 * are finite. A larger query could make a logit overflow: it is refused with DQ_RANGE, never
 * answered with Inf or NaN. A result that is not finite all the same (a baseline codec's records
 * restored with values near the float range) fails the call with DQ_RANGE. */
#ifndef DQUANT_ATTENTION_H
#define DQUANT_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/export.h"
#include "dquant/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dq_attn_item {
    const dq_layer *layer; /* borrowed */
    const float *q;        /* [q_heads, head_dim], original domain; borrowed */
    float *out;            /* [q_heads, head_dim]; written */
    float *lse;            /* [q_heads]; written; may be NULL */
} dq_attn_item;

/* The largest ‖q_h‖₂ · max(1, |scale|) decode attention takes: 2^64, far above any real query. */
#define DQ_ATTEND_QUERY_MAX 18446744073709551616.0

/* Checks a query as dq_attend checks each item's: q [q_heads, head_dim] f32 (borrowed) finite
 * (DQ_NONFINITE, which wins) and within DQ_ATTEND_QUERY_MAX (DQ_RANGE); scale finite
 * (DQ_INVALID_ARGUMENT). On an error *bad_head (may be NULL) is the first head at fault and *norm
 * (may be NULL) its ‖q_h‖₂ · max(1, |scale|) (+inf when not finite). */
DQ_API int dq_attend_check_query(const float *q, uint32_t q_heads, uint32_t head_dim, float scale, uint32_t *bad_head,
                                 double *norm);

/* q_heads must be a positive multiple of the profile's kv_heads. scale is usually 1/sqrt(head_dim).
 * Items may use different layers (of this codec) of any length. Queries must be finite and within
 * DQ_ATTEND_QUERY_MAX (dq_attend_check_query: DQ_NONFINITE, DQ_RANGE); a result that is not
 * finite is DQ_RANGE (see "Numerics" above). */
DQ_API int dq_attend(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale, const dq_attn_item *items,
                     size_t nitems);

/* The same computation over the decoded cache, in double precision (the test reference). */
DQ_API int dq_attend_reference(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale,
                               const dq_attn_item *items, size_t nitems);

#ifdef __cplusplus
}
#endif
#endif
