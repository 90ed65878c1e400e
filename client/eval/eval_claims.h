/* dquant eval --claims: each quantitative claim of the KVQuant++ paper (seed 001) next to our
 * figure on our data (the real K/V and queries of ../shared/data, and for the ΔPPL rows the model
 * itself through eval_ppl.h), with a verdict and a note saying why when they differ.
 *
 * Tensor claims use one sequence of the dataset's K/V per layer: calibrated codecs (outliers, PQ)
 * are calibrated per layer on the first tokens and measured on the rest (eval_claims_split); the
 * others are measured on the same tokens. NMSE = Σ (x − x̂)² / Σ x². */
#ifndef DQUANT_EVAL_CLAIMS_H
#define DQUANT_EVAL_CLAIMS_H

#include <stddef.h>
#include <stdint.h>

#include "eval_data.h"
#include "eval_model.h"

typedef enum eval_verdict {
    EVAL_AGREES = 0,
    EVAL_PARTLY = 1, /* the direction holds, the size does not (or only at some settings) */
    EVAL_DISAGREES = 2,
    EVAL_NOT_RUN = 3, /* not measured in this run (says why) */
} eval_verdict;

const char *eval_verdict_name(eval_verdict v);

#define EVAL_CLAIM_VALUES 8

typedef struct eval_claim {
    const char *id;    /* short stable key: "awq", "delta", ... */
    const char *claim; /* the paper's statement */
    const char *paper; /* the paper's figure */
    char ours[256];    /* our figure */
    eval_verdict verdict;
    char note[768];
    size_t nvalues;
    struct {
        char key[40];
        double value;
    } values[EVAL_CLAIM_VALUES];
} eval_claim;

typedef struct eval_claims_opts {
    uint32_t ppl_chunks;     /* chunks of the ΔPPL rows (0: not run) */
    uint32_t bench_reps;     /* bucketize benchmark repetitions */
    uint32_t kmeans_samples; /* k-means claim; the Huffman claim takes twice as many */
    uint64_t seed;
} eval_claims_opts;

/* 8 ΔPPL chunks, 20 benchmark repetitions, 100000 k-means samples. */
void eval_claims_opts_default(eval_claims_opts *o);

/* Calibration tokens [0, split) and measured tokens [split, tokens): half, or 256 when a half is
 * too few for 8-bit PQ codebooks and 128 tokens are left to measure. */
uint32_t eval_claims_split(uint32_t tokens);

/* The number of claim rows (every row is always filled). */
size_t eval_claims_count(void);

/* Fills rows[eval_claims_count()] from d (K/V, and queries for the attention-weighted row) and m
 * with its held-out text t (the ΔPPL rows; m may be NULL: those parts say "not run"). Returns 0 or
 * a dq_error code with err for a failure of the data itself; a claim that cannot be measured on
 * this data is a row with verdict EVAL_NOT_RUN and the reason. */
struct eval_text;
int eval_claims_run(const eval_data *d, const eval_model *m, const struct eval_text *t, const eval_claims_opts *o,
                    eval_claim *rows, char *err, size_t errlen);

#endif
