/* dquant eval: fixed-width coding at matched storage (seed Appendix B), an eval-only pseudo-codec.
 *
 * Isolates D-Quant's coding mechanism from its preprocessing: the same per-head Hadamard rotation
 * with the D-Quant profile's seed, for keys the same INT8 window channel mean (computed exactly as
 * libdquant does), a per-token min–max grid of M_fixed = floor(2^(8·C/n)) levels (C the profile's
 * container bytes of that kind: K 6, V 3 for dq226 at n = 1024), nearest rounding, a least-squares
 * refit of (s, o), fp16 s and o, then nearest rounding again against the fp16 grid. It is charged
 * log2(M_fixed) bits per symbol (the ideal fixed-width rate, conservative in its favour) plus the
 * same metadata as D-Quant: fp16 s, o per token and, for keys, the window mean block.
 * Only reconstructions are produced; nothing is stored. */
#ifndef DQUANT_FIXEDWIDTH_H
#define DQUANT_FIXEDWIDTH_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"
#include "dquant/profile.h"

/* floor(2^(8·C/n)) for kind's container, capped at 256; 0 when below 2 (no grid fits). */
uint32_t fixedwidth_levels(const dq_profile *p, dq_kind kind);

/* Charged bits per value of kind: log2(M_fixed) + 32/n, keys plus 8·(2 + n)/(n·W). */
double fixedwidth_bits_per_value(const dq_profile *p, dq_kind kind);

/* The key window mean block (fp16 scale, int8[n]) of ntok rotated tokens y ([ntok, n]), computed
 * as libdquant computes it, so both codecs subtract the same dequantized mean. */
void fixedwidth_window_mean(const float *y, size_t ntok, uint32_t n, uint8_t *block);

/* Reconstructs ntok tokens of x (f32 [ntok, n], original domain) as one layer's keys or values,
 * windows of p->window tokens (the last partial window with its own mean), into xhat (original
 * domain). p must be a D-Quant profile. Returns 0, DQ_PROFILE (not D-Quant, or M_fixed < 2),
 * DQ_NONFINITE, DQ_NOMEM. */
int fixedwidth_roundtrip(const dq_profile *p, dq_kind kind, const float *x, size_t ntok, float *xhat);

#endif
