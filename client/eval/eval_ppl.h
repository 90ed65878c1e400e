/* dquant eval: the perplexity / KL protocol of the KVQuant++ paper (seed 001, §5.1) on a real model
 * with the C forward of eval_model.h.
 *
 * Each chunk of the held-out text is context + targets + 1 tokens x[0..C+T]. The context x[0..C−1]
 * is prefilled at full precision (float32 K/V); then the whole prefill cache, every token of every
 * layer (no BF16 tail), is replaced by a codec's reconstruction (keys post-RoPE, as an engine's
 * cache holds them) and the T tokens x[C..C+T−1] are run teacher-forced on that cache; their
 * logits score the targets x[C+1..C+T], so every scored prediction reads the compressed cache.
 * The targets' own K/V stay float32 (they are the live decode tail). The reference is the same run
 * with the float32 cache untouched:
 *   ΔPPL = exp(mean NLL_codec) − exp(mean NLL_fp32) over all scored targets of all chunks,
 *   KL   = mean over scored positions of KL(p_fp32 ‖ p_codec) in nats (float64 log-softmax),
 * with 95% percentile-bootstrap intervals over chunks. Chunks are non-overlapping and disjoint
 * from the calibration sequences (calibrated codecs: eval_ppl_calibration). */
#ifndef DQUANT_EVAL_PPL_H
#define DQUANT_EVAL_PPL_H

#include <stddef.h>
#include <stdint.h>

#include "eval_core.h"
#include "eval_model.h"

/* A model's held-out token stream: heldout.txt as bytes (byte-level models), else kv/tokens_i32.bin. */
typedef struct eval_text {
    int32_t *tokens;
    size_t len;
    char source[64];
} eval_text;

/* Returns 0, DQ_NOT_FOUND (neither file), DQ_IO, DQ_NOMEM, DQ_SHAPE (a token file not a whole
 * number of int32), DQ_INVALID_ARGUMENT (a token outside [0, vocab)). */
int eval_text_load(const char *model_dir, uint32_t vocab, eval_text *t, char *err, size_t errlen);
void eval_text_free(eval_text *t);

typedef struct eval_ppl_opts {
    uint32_t context, targets, chunks; /* 128, 64, 50 (the paper's) */
    uint64_t offset;                   /* first chunk's token offset; chunks follow back to back */
    uint32_t calib_seqs;               /* calibration sequences of `context` tokens (the paper: 8) */
    uint64_t calib_offset;             /* first calibration sequence's token offset */
    uint32_t resamples;                /* bootstrap over chunks */
    uint64_t seed;
    double value_mass; /* 0: off; in (0, 1): the targets' attention over each codec's
                                          prefill cache skips values as dq_attend_vskip would
                                          (eval_kv_cache.value_mass; the prefill is the sealed part);
                                          the fp32 reference run is exact */
} eval_ppl_opts;

/* 128 + 64, 50 chunks from offset 0, 8 calibration sequences, 2000 resamples. eval_ppl_fit then
 * places them in a text. */
void eval_ppl_opts_default(eval_ppl_opts *o);
/* Places calibration at the start of the text and the chunks after it: chunks reduced to what the
 * text holds, calibration sequences to what is left. DQ_OUT_OF_BOUNDS when not even one chunk fits. */
int eval_ppl_fit(eval_ppl_opts *o, size_t text_len);

/* The float32 prefill K/V of the calibration sequences, concatenated per layer:
 * k, v [layers][calib_seqs · context][kv_heads · head_dim] (free with free()); *tokens set. */
int eval_ppl_calibration(const eval_model *m, const eval_text *t, const eval_ppl_opts *o, float **k, float **v,
                         size_t *tokens, char *err, size_t errlen);

/* A codec of the protocol: an eval_codec (a library profile), or the identity
 * ("fp32": the hook rewrites the cache with its own values; KL must be exactly 0). */
typedef struct eval_ppl_codec {
    eval_codec codec;
    int identity;
    const char *unavailable; /* non-NULL: the codec cannot be made at this shape (the reason); reported
                                as DQ_CONTAINER_TOO_SMALL without running */
} eval_ppl_codec;

typedef struct eval_ppl_result {
    char label[EVAL_LABEL_MAX];
    int rc; /* DQ_OK, or why this codec could not run (message in why) */
    char why[256];
    double bits[2], bits_mean; /* every stored byte of the prefill cache per value */
    double nll_ref, nll;       /* mean nats per scored target */
    double ppl_ref, ppl, dppl;
    eval_ci dppl_ci, kl;
    double nmse[2]; /* of the prefill K/V, over all chunks */
    uint32_t chunks, targets;
    double seconds;
    double value_kept; /* with value_mass: share of (target, layer, prefill position) values summed */
} eval_ppl_result;

/* Runs every codec on every chunk. A codec that fails (a profile that cannot encode this data)
 * gets its rc and why and the others go on; the call fails only for the model or text (DQ_* with
 * err). res: [ncodecs]. */
int eval_ppl_run(const eval_model *m, const eval_text *t, const eval_ppl_codec *codecs, size_t ncodecs,
                 const eval_ppl_opts *o, eval_ppl_result *res, char *err, size_t errlen);

#endif
