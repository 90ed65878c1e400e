/* dquant — decode attention computed on the containers (DESIGN §2.7, seed Appendix A).
 *
 * For each item (one sequence's layer and one decode-step query of q_heads × head_dim), computes
 * softmax(scale · q·Kᵀ)·V over every token of the layer: sealed tokens straight from their
 * containers (rotated query, affine terms applied after the contraction, each stream decoded once
 * per call), tail tokens exactly from BF16. GQA: query head h reads KV head h / (q_heads/kv_heads).
 * Writes the output per query head ([q_heads, head_dim], f32, original domain) and its
 * log-sum-exp (natural log, of the scaled logits) so callers can merge partial results.
 *
 * An empty layer gives out = 0 and lse = -inf. */
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

/* q_heads must be a positive multiple of the profile's kv_heads. scale is usually 1/sqrt(head_dim).
 * Items may use different layers (of this codec) of any length. Queries must be finite. */
DQ_API int dq_attend(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale, const dq_attn_item *items,
                     size_t nitems);

/* The same computation over the decoded cache, in double precision (the test reference). */
DQ_API int dq_attend_reference(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale,
                               const dq_attn_item *items, size_t nitems);

#ifdef __cplusplus
}
#endif
#endif
