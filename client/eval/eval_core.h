/* dquant eval: codec quality on real KV — reconstruction error and attention fidelity, with
 * bootstrap confidence intervals. Used by `dquant eval` (cmd_eval.c) and tests/eval.
 *
 * Every token of every layer is encoded window by window (no BF16 tail: the quality of the codec
 * itself is measured) and decoded; figures are computed against the original f32 arrays:
 *   - key / value NMSE: Σ (x − x̂)² / Σ x², over all values;
 *   - attention-score KL: for each evaluated query position t, layer and query head (GQA: head h
 *     reads KV head h / (q_heads / kv_heads)), p = softmax(q·k_s / sqrt(d)) over s = 0..t with the
 *     original keys, p̂ the same with the reconstructed keys; KL(p || p̂) in nats, averaged;
 *   - attention-output relative error ||o − ô|| / ||o||, o = Σ p_s v_s, ô = Σ p̂_s v̂_s, averaged.
 * 95% intervals: percentile bootstrap over tokens, resampling token indices with replacement
 * (NMSE: the unit is a (sequence, token) with its sums over layers, the statistic the ratio of
 * resampled sums; attention: the unit is a query position with its mean over layers and heads). */
#ifndef DQUANT_EVAL_CORE_H
#define DQUANT_EVAL_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/profile.h"
#include "eval_data.h"

#define EVAL_LABEL_MAX 48

/* A libdquant profile (D-Quant, a baseline, KVQuant++ or fixed-width), stored as the library
 * stores it, under the label it was asked for. */
typedef struct eval_codec {
    char label[EVAL_LABEL_MAX];
    dq_profile profile;
} eval_codec;

/* Resolves a codec spec for a stream shape:
 *   dq226, dq196, bf16, intB, quarotB, kiviB, turboB   library profiles (dq_profile_builtin)
 *   intB-gG, quarotB-gG                                 INT-B with channel groups of G (n % G == 0)
 *   dq226@BITS, dq196@BITS                              the profile's levels, alpha and K/V rate split
 *                                                       with both containers scaled so that the
 *                                                       stored mean bits/value is the largest <= BITS
 *   fixed226, fixed196, fixed226@BITS, ...              the library's fixed-width profile at the
 *                                                       storage of dq226 (dq196, dq226@BITS, ...):
 *                                                       dq_profile_fixed_matched; fixedkAvB
 * Returns 0 or DQ_PROFILE / DQ_CONTAINER_TOO_SMALL with a message in err. */
int eval_codec_parse(const char *spec, uint32_t kv_heads, uint32_t head_dim, eval_codec *out, char *err, size_t errlen);

/* A D-Quant profile for kv_heads × head_dim from its n = 1024 containers c1024 (payload rates
 * (8·C − 32)/1024 bits/value), times scale, as the built-ins are instantiated:
 * C = round((rate · scale · n + 32) / 8) (eval_dq_containers). Returns dq_profile_make's code. */
void eval_dq_containers(uint32_t kv_heads, uint32_t head_dim, const uint32_t c1024[2], double scale, uint32_t out[2]);
int eval_dq_profile(uint32_t kv_heads, uint32_t head_dim, const uint32_t c1024[2], double scale,
                    const uint32_t levels[2], float alpha, const char *name, dq_profile *out);

/* Stored bits per value of one kind (dq_profile_bits_per_value), and their mean. */
double eval_codec_bits(const eval_codec *c, dq_kind kind);
double eval_codec_bits_mean(const eval_codec *c);

typedef struct eval_opts {
    uint32_t query_stride; /* evaluate query positions T−1, T−1−S, ...; 0: auto (about 128 per layer) */
    uint32_t resamples;    /* bootstrap resamples (>= 1000 for reported intervals) */
    uint64_t seed;         /* bootstrap seed: the same resamples for every codec */
    int collect_levels;    /* fill eval_result.hist (D-Quant codecs) */
    int skip_attention;    /* reconstruction figures only */
} eval_opts;

/* stride auto, 2000 resamples, a fixed seed, no histograms. */
void eval_opts_default(eval_opts *o);
/* The stride eval_run uses for d under o. */
uint32_t eval_query_stride(const eval_data *d, const eval_opts *o);

typedef struct eval_ci {
    double est, lo, hi;
} eval_ci;

typedef struct eval_result {
    char label[EVAL_LABEL_MAX];
    double bits[2], bits_mean;
    eval_ci nmse[2];
    int have_attn; /* 0 when the data has no queries */
    eval_ci kl, attn_err;
    uint32_t query_stride, query_positions; /* positions per layer */
    uint32_t resamples;
    /* encoder figures summed over every stream (library codecs) */
    uint64_t streams[2], retries[2], fallbacks[2], symbols_moved[2], payload_bytes[2];
    uint32_t max_move[2];
    uint64_t hist[2][DQ_MAX_LEVELS]; /* final symbols per level (collect_levels, D-Quant) */
    double seconds;
} eval_result;

/* Percentile interval of ratio statistics Σ num[u] / Σ den[u] over units resampled with
 * replacement (den NULL: the mean of num); nstat <= 4 statistics share each resample's indices.
 * Returns 0 or DQ_NOMEM. */
int eval_bootstrap(size_t units, size_t nstat, const double *const *num, const double *const *den, uint32_t resamples,
                   uint64_t seed, eval_ci *out);

/* Evaluates one codec on d. Returns 0 or a dq_error code with a message in err. */
int eval_run(const eval_data *d, const eval_codec *c, const eval_opts *o, eval_result *r, char *err, size_t errlen);

#endif
