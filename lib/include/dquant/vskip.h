/* dquant — certified value skipping in decode attention (issue 19, part 4).
 *
 * Decode attention decodes a value stream per token as well as a key stream. Most of a head's
 * softmax mass sits on few tokens, so a token whose weight is negligible in every query head that reads
 * its value stream need not be decoded. Here that is done with a *mass target* τ, not a fixed
 * weight threshold, and with a rigorous bound on what it costs:
 *
 * Selection. Every key is decoded and scored as in dq_attend (same float expressions, so the
 * same logits). For each query head h, over the layer's sealed tokens (the BF16 tail is always
 * kept and its mass counts toward the target), the kept set K_h is the smallest set holding at
 * least τ of the head's softmax mass: tokens taken by descending logit, ties by ascending token
 * index, until tail mass + taken mass >= τ·Z_h (Z_h: the head's whole mass; weights
 * expf(logit − max_h) in float as the softmax computes them, sums in double). A token's value
 * stream holds every KV head of the token (n = kv_heads·head_dim values), so every query head of
 * the item shares it: the value streams decoded are the union K = ∪_h K_h, and every head uses every decoded
 * token. Skipped tokens contribute nothing.
 *
 * No renormalization. The output is Σ_{t∈K} p_t v_t / Z_h: the skipped tokens' weights stay in
 * the denominator, so the LSE is the exact one (partial results still merge by LSE as before)
 * and the error is exactly the dropped sum, Σ_{t∉K} p_t v_t / Z_h. Renormalizing over the kept
 * mass would give an error ε(ū_S − ô) whose provable bound needs the skipped values' distance to
 * the output; with the per-coordinate box below that bound is never tighter than the dropped
 * sum's when the skipped values are centred on zero, as rotated values are.
 *
 * Bound. The error is returned per query head as an upper bound on the L2 norm ‖out_τ − out‖₂,
 * where out is dq_attend's result for the same item (τ off). In the rotated domain in which the
 * codec stores values, every coordinate of token t's value is o_t + s_t·m with m in [0, M−1]
 * (fp16 s_t, o_t stored with the stream, M the value levels), so |v'_{t,j}| <= a_t =
 * max(|o_t|, |o_t + s_t(M−1)|) and ‖v'_t restricted to one head‖₂ <= sqrt(head_dim)·a_t. The
 * un-rotation (signs and a normalized Walsh–Hadamard transform, done in double) is orthonormal
 * up to rounding of order log2(head_dim)·2^-53; that and the float weights' few-ulp error in the
 * computed sums are covered by a factor (1 + 2^-20) (a_t is also rounded up by 2^-20). So
 *     ‖out_τ − out‖₂ <= (1 + 2^-20) · sqrt(head_dim) · Σ_{t∉K} w_t a_t / Z_h + ρ_h,
 * w_t = exp(logit_t − max_h). ρ_h is an allowance for float rounding in both computations
 * (they sum weights and weighted levels in float per window of W tokens, and attend the kept
 * tokens with one global max instead of the running one): with u = 2^-24, A = Σ_t w_t a_t / Z,
 * X = Σ_t w_t (|x_t| + 1) a_t / Z and X_l = Σ_t w_t (|x_t| + 1) / Z over every token (x_t =
 * logit_t − max_h; the tail's a_t is its largest |value| in the head), standard summation
 * bounds give per coordinate and computation u·((4W + 12)·A + 3X + X_l·A); ρ_h is
 * 4u·sqrt(head_dim)·((4W + 16)·A + 4X + X_l·A), twice the sum for both computations. With no
 * token skipped the bound is ρ_h alone (measured at W = 128: 8e-4 to 4e-3 of the output's norm;
 * tests/eval/RESULTS.md).
 *
 * Cost. All keys are scored before any value is read, so each item holds its logits and weights
 * for every query head and sealed token: about 8·q_heads·tokens bytes from the codec's allocator
 * per call (32 heads at 128K tokens: 34 MB), besides the workspace. Selection is linear in the
 * tokens (a histogram of weights; only the bin where the target is crossed is sorted).
 *
 * τ = 0 or τ = 1 turns skipping off: the functions below then call dq_attend / dq_hot_attend and
 * their results are bit-identical to them (bounds 0, every value stream counted as decoded).
 * D-Quant and fixed-width codecs (the codecs of levels with a stored fp16 s, o per stream) skip
 * values; with τ on, other codecs are DQ_UNSUPPORTED. */
#ifndef DQUANT_VSKIP_H
#define DQUANT_VSKIP_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/attention.h"
#include "dquant/export.h"
#include "dquant/hot.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-item results of value skipping (all written by the attend calls below). */
typedef struct dq_vskip_out {
    double *bound;           /* [q_heads]: the bound on ‖out_τ − out‖₂ per query head; may be NULL */
    uint8_t *keep;           /* [sealed tokens]: 1 where the value stream was decoded; may be NULL */
    uint64_t values_decoded; /* sealed value streams decoded */
    uint64_t values_sealed;  /* sealed value streams of the item (windows × W) */
} dq_vskip_out;

/* Whether τ turns skipping on: 0 < τ < 1. Returns 1 (on), 0 (off: τ is 0 or 1) or
 * DQ_INVALID_ARGUMENT (NaN, < 0, > 1). */
DQ_API int dq_vskip_enabled(double value_mass);

/* The selection alone (the logic dq_attend_vskip uses): logits [heads][stride] of tokens
 * candidates each (row h at logits + h·stride), fixed [heads][fixed_stride] the logits of nfixed
 * tokens per head that are always kept (may be NULL when nfixed is 0). Writes keep[tokens] (1:
 * in the union of the heads' minimal sets) and, when skipped is not NULL, skipped[heads]: each
 * head's mass outside the union as a fraction of its whole mass. codec only lends its allocator.
 * Logits must be finite. Returns 0, DQ_INVALID_ARGUMENT (τ as dq_vskip_enabled, NULL pointers,
 * a logit not finite), DQ_NOMEM. With τ off every token is kept. */
DQ_API int dq_vskip_select(const dq_codec *codec, const float *logits, size_t stride, uint32_t heads, size_t tokens,
                           const float *fixed, size_t fixed_stride, size_t nfixed, double value_mass, uint8_t *keep,
                           double *skipped);

/* dq_attend with a value mass target (outs[i] for items[i]; outs may be NULL). Errors as
 * dq_attend, plus DQ_INVALID_ARGUMENT for a bad τ and DQ_UNSUPPORTED for τ on with a codec that
 * is neither D-Quant nor fixed-width, DQ_NOMEM. */
DQ_API int dq_attend_vskip(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale, double value_mass,
                           const dq_attn_item *items, dq_vskip_out *outs, size_t nitems);

/* The same over hot windows (dq_hot_attend); for windows transcoded from a layer's records the
 * results equal dq_attend_vskip's on the layer. */
DQ_API int dq_hot_attend_vskip(const dq_codec *codec, dq_workspace *ws, uint32_t q_heads, float scale,
                               double value_mass, const dq_hot_item *items, dq_vskip_out *outs, size_t nitems);

#ifdef __cplusplus
}
#endif
#endif
