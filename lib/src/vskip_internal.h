/* The selection and bound of value skipping (dquant/vskip.h), shared by dq_attend_vskip (window
 * records) and dq_hot_attend_vskip (hot windows) in attention.c, and by dq_vskip_select. */
#ifndef DQ_VSKIP_INTERNAL_H
#define DQ_VSKIP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/types.h"

/* The union of the heads' minimal sets (dq_vskip_select's contract) with τ on (0 < τ < 1) and
 * finite logits; also each head's max logit (maxv[heads]) and whole mass Z[heads] (weights
 * exp(logit − max) in double). skipped may be NULL. Returns 0 or DQ_NOMEM. */
int dq__vskip_select(const dq_allocator *a, const float *logits, size_t stride, uint32_t heads, size_t tokens,
                     const float *fixed, size_t fixed_stride, size_t nfixed, double tau, uint8_t *keep, float *maxv,
                     double *Z, double *skipped);

/* One head's bound on ‖out_τ − out‖₂ (dquant/vskip.h): logits[tokens] of the sealed tokens with
 * amax[tokens] their a_t, keep[tokens]; tail[nfixed] the tail's logits with tmax[nfixed] the
 * largest |value| of each tail token in this head; max and Z from dq__vskip_select; W the window,
 * d the head dimension. */
double dq__vskip_bound(const float *logits, const float *amax, const uint8_t *keep, size_t tokens, const float *tail,
                       const float *tmax, size_t nfixed, float max, double Z, uint32_t W, uint32_t d);

/* a_t of a value stream from its fp16 (s, o) and M levels: max(|o|, |o + s·(M − 1)|), rounded up
 * to cover the float evaluation. */
float dq__vskip_amax(float s, float o, uint32_t M);

#endif
