/* dquant eval: ablations of D-Quant's design choices (seed Figure 4 and Appendix C).
 *
 *   levels  (M_K, M_V) at the storage of dq226: M_K 4..12 with M_V 6, M_V 3..10 with M_K 8
 *   budget  both dq226 containers' payload scaled 0.7× .. 1.5×, levels 8/6
 *   split   K/V containers with C_K + C_V = 562 bytes at n = 1024 (C_K 231..431), scaled to n
 *   alpha   sharpening 1.0 .. 2.0 at dq226's containers and levels
 *   drift   per D-Quant profile and kind: symbols moved by drift, largest move, container fill,
 *           and the excess rate of the coding table over the empirical symbol distribution
 * Containers at other n keep the payload rate of the n = 1024 definition (eval_dq_profile). */
#ifndef DQUANT_EVAL_ABLATION_H
#define DQUANT_EVAL_ABLATION_H

#include <stddef.h>
#include <stdint.h>

#include "eval_core.h"

typedef struct eval_ablation_row {
    char panel[16];                    /* "levels K", "levels V", "budget", "split", "alpha" */
    eval_codec codec;                  /* valid when rc == 0 */
    int rc;                            /* 0, or why the configuration cannot exist (DQ_CONTAINER_TOO_SMALL, ...) */
    uint32_t containers[2], levels[2]; /* requested, even when rc != 0 */
    float alpha;
} eval_ablation_row;

/* The configurations of ablation `which` (levels, budget, split, alpha) for kv_heads × head_dim.
 * *rows is allocated (free()). Returns 0, DQ_INVALID_ARGUMENT (unknown name), DQ_NOMEM. */
int eval_ablation_rows(const char *which, uint32_t kv_heads, uint32_t head_dim, eval_ablation_row **rows,
                       size_t *count);

typedef struct eval_drift {
    uint32_t levels, container;
    double moved_fraction; /* symbols off nearest rounding */
    uint32_t max_move;     /* levels */
    uint64_t retries, fallbacks;
    double fill;         /* mean container fill / C */
    double entropy;      /* empirical entropy H of the final symbols, bits/value */
    double excess_table; /* cross-entropy under the profile's integer table − H */
    double excess_model; /* cross-entropy under the unsharpened analytic model (alpha 1) − H */
    double coding_gain;  /* log2 M − H */
} eval_drift;

/* Drift figures of one kind from a result run with collect_levels on a D-Quant profile. */
int eval_drift_summary(const eval_result *r, const dq_profile *p, dq_kind kind, eval_drift *out);

#endif
