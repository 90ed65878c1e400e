/* The selection and bound of value skipping (dquant/vskip.h), shared by dq_attend_vskip (window
 * records) and dq_hot_attend_vskip (hot windows) in attention.c, and by dq_vskip_select. */
#ifndef DQ_VSKIP_INTERNAL_H
#define DQ_VSKIP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/types.h"

/* The union of the heads' minimal sets (dq_vskip_select's contract) with τ on (0 < τ < 1) and
 * finite logits; also each head's max logit (maxv[heads]), whole mass Z[heads] (weights
 * expf(logit − max), summed in double) and, when wts is not NULL, the sealed tokens' weights
 * (wts[h·stride + t]). skipped may be NULL. Returns 0 or DQ_NOMEM. */
int dq__vskip_select(const dq_allocator *a, const float *logits, size_t stride, uint32_t heads, size_t tokens,
                     const float *fixed, size_t fixed_stride, size_t nfixed, double tau, uint8_t *keep, float *maxv,
                     double *Z, double *skipped, float *wts);

/* One head's bound on ‖out_τ − out‖₂ (dquant/vskip.h): logits[tokens] of the sealed tokens with
 * their weights wts[tokens] and a_t amax[tokens], keep[tokens]; tail[nfixed] the tail's logits
 * with tmax[nfixed] the largest |value| of each tail token in this head; max and Z from
 * dq__vskip_select; W the window, d the head dimension. The skipped mass is charged with a factor
 * (1 + 2^-20), covering the weights' float rounding (a few ulp) and the rotation's. */
double dq__vskip_bound(const float *logits, const float *wts, const float *amax, const uint8_t *keep, size_t tokens,
                       const float *tail, const float *tmax, size_t nfixed, float max, double Z, uint32_t W,
                       uint32_t d);

/* a_t of a value stream from its fp16 (s, o) and M levels: max(|o|, |o + s·(M − 1)|), rounded up
 * to cover the float evaluation. */
float dq__vskip_amax(float s, float o, uint32_t M);

#endif
