/* dquant eval --value-mass: certified value skipping (libdquant's dquant/vskip.h) on real KV and
 * the data's own queries.
 *
 * For each layer of sequence 0 the tokens are appended to a libdquant layer in order, as a decode
 * loop would (sealed windows of W tokens plus the BF16 tail of the last (t + 1) mod W), and at every
 * evaluated query position t (T−1, T−1−S, ... as the attention columns of eval_core.h) the query of
 * every head attends causally over tokens 0..t: once exactly (dq_attend) and once per value mass
 * target τ (dq_attend_vskip). Per τ:
 *   - value streams decoded: sealed value streams decoded / sealed value streams (the union over
 *     the query heads), summed over positions and layers;
 *   - value tokens used: (decoded + tail tokens) / tokens attended, likewise;
 *   - 16-token blocks decoded: of the aligned blocks of 16 sealed tokens (the GPU hot kernel's
 *     value sub-tile, attend_hot.cu), those holding a decoded token: what a kernel that skips whole
 *     sub-tiles could leave out;
 *   - output relative error ||o_τ − o|| / ||o|| against dq_attend (τ off) per query head, averaged
 *     over layers and heads per position, with a 95% percentile-bootstrap interval over positions,
 *     and its largest value;
 *   - the bound dq_attend_vskip returned, relative to ||o||, averaged likewise, and the share of
 *     heads whose error was within it (it must be all of them). */
#ifndef DQUANT_EVAL_VSKIP_H
#define DQUANT_EVAL_VSKIP_H

#include <stddef.h>

#include "eval_core.h"
#include "eval_data.h"

typedef struct eval_vskip_row {
    double tau;
    double decoded;  /* sealed value streams decoded / sealed */
    double used;     /* (decoded + tail) / tokens attended */
    double blocks16; /* aligned 16-token blocks of sealed tokens with a decoded token / all of them */
    eval_ci rel_err; /* mean over layers and heads per position; bootstrap over positions */
    double rel_err_max;
    double bound_rel; /* mean bound / ||o|| */
    double held;      /* share of (position, layer, head) with error <= bound */
    uint32_t positions, items;
    double seconds_exact, seconds_vskip; /* time in dq_attend / dq_attend_vskip */
} eval_vskip_row;

/* Runs taus[ntau] (each in (0, 1)) for a D-Quant or fixed-width codec on d (which must have
 * queries). rows[ntau] written. Returns 0, DQ_INVALID_ARGUMENT (no queries, a τ out of range),
 * DQ_UNSUPPORTED (another codec), DQ_NOMEM or a libdquant error, with a message in err. */
int eval_vskip_run(const eval_data *d, const eval_codec *c, const eval_opts *o, const double *taus, size_t ntau,
                   eval_vskip_row *rows, char *err, size_t errlen);

#endif
