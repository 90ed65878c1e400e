/* Drift: the length-constrained assignment (DESIGN §2.4, seed §4.3 and Algorithm 1).
 *
 * For a grid (s, o) and budget B, choose per value the level minimizing D_i(m) + λ·r_m and bisect
 * log2 λ so that Σ r ≤ B. For a fixed λ the per-value argmin is monotone in the value: the
 * levels that can win form the lower envelope of the lines c_m(y) = -2·s·m·y + s²m² + λ·r_m
 * (y = x - o), and consecutive envelope levels a < b swap at
 *
 *     τ_ab = s·(a + b)/2 + λ·(r_b - r_a) / (2·s·(b - a)).
 *
 * So per bisection step only the M-1 thresholds are computed and the code length is counted
 * from the sorted stream by binary search: O(M log n), no n×M matrix. The final assignment is one
 * pass with at most M-1 comparisons per value (only the candidate levels between the nearest one
 * and the cheap ones can win).
 *
 * Exactly reproducible: log2 λ runs on a dyadic grid, μ_j = hi - 40 + 40·j/4096 (T = 12 steps hit
 * integers j), with hi = ceil(log2(8·(max D - min D))) from the float exponent, λ_j from a table of
 * 2^(i/512); the threshold arithmetic is written out in float without contraction; the CUDA
 * encoder evaluates the same expressions. */
#ifndef DQ_DRIFT_H
#define DQ_DRIFT_H

#include <stdint.h>

#include "codec_internal.h"

#define DQ_DRIFT_STEPS 12
#define DQ_DRIFT_GRID 4096

/* Sorts n floats ascending into out (tmp: n uint32 scratch, out viewed as uint32 scratch too). */
void dq__sort_floats(const float *x, uint32_t n, float *out, uint32_t *tmp);

/* 2^(i/512) for i < 512, rounded to float. */
const float *dq__exp2_table(void);

typedef struct dq__drift_result {
    int64_t cost_q16; /* Σ r of the assignment */
    int feasible;     /* cost_q16 <= budget */
    uint32_t j;       /* grid index of λ used */
} dq__drift_result;

/* Drift for grid (s, o): writes levels[n]. xs is x sorted ascending. s must be > 0. */
dq__drift_result dq__drift(const dq__kind_tables *kt, const float *x, const float *xs, uint32_t n, float s, float o,
                           int64_t budget_q16, uint8_t *levels);

/* The λ of grid index j for the exponent hi. */
float dq__drift_lambda(int hi, uint32_t j);

/* Least-squares (s, o) for fixed levels, canonical reduction order. Returns 0 and writes s, o when
 * the refit is usable; otherwise leaves them. */
void dq__refit(const float *x, const uint8_t *levels, uint32_t n, double *s, double *o);

#endif
