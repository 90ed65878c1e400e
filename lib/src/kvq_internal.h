/* Internals of the KVQ toolbox (kvq_math.c, kvq_linalg.c, kvq_huffman.c) shared with the KVQ
 * codecs and the tests: the portable seeded generator, the randomized Hadamard rotation, and the
 * helpers behind the public calls of dquant/kvq.h section 1. */
#ifndef DQUANT_KVQ_INTERNAL_H
#define DQUANT_KVQ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dquant/kvq.h"

/* xoshiro256** seeded through splitmix64: the same stream on every platform for a seed. */
typedef struct dq__kvq_rng {
    uint64_t s[4];
    double spare; /* Box–Muller's second normal */
    int has_spare;
} dq__kvq_rng;

void dq__kvq_rng_seed(dq__kvq_rng *r, uint64_t seed);
uint64_t dq__kvq_rng_next(dq__kvq_rng *r);
/* Uniform double in [0, 1) with 53 random bits. */
double dq__kvq_rng_uniform(dq__kvq_rng *r);
/* Standard normal (Box–Muller, both values used). */
double dq__kvq_rng_normal(dq__kvq_rng *r);

/* Boundaries of ascending centroids c[0..k−1] for nearest-centroid search: boundaries[i] is the
 * largest float not strictly closer to c[i+1] than to c[i] (exact comparison), so that
 * dq_kvq_bucketize(x, b, k − 1) == dq_kvq_nearest_argmin(x, c, k) for every float x. */
void dq__kvq_boundaries(const float *c, uint32_t k, float *boundaries);

/* MSE E[(t − c(t))²] of nearest-centroid quantization with ascending centroids c[0..k−1] under the
 * coordinate marginal of a random unit vector in R^dim, by the same quadrature as the codebooks. */
int dq__kvq_marginal_mse(uint32_t dim, const float *c, uint32_t k, double *mse);
/* Lloyd–Max codebook of 2^bits centroids for N(0, 1/dim) (the Gaussian approximation the seed
 * replaces; closed-form cell moments), for comparisons. */
int dq__kvq_gauss_codebook(uint32_t bits, uint32_t dim, float *centroids);

/* Randomized Hadamard rotation of R^d (d a power of two): y = H·D·x / sqrt(d), D = diag(signs),
 * signs ±1 drawn from the seed by dq__kvq_rht_signs. Orthonormal; dq__kvq_rht_inverse undoes it. */
int dq__kvq_rht_signs(uint32_t d, uint64_t seed, float *signs);
void dq__kvq_rht_apply(float *x, const float *signs, uint32_t d);
void dq__kvq_rht_inverse(float *x, const float *signs, uint32_t d);

/* dq_kvq_haar without the determinant fix (columns sign-fixed by diag(R) only): an orthogonal
 * matrix that is a reflection about half the time; for the test that shows the fix matters. */
int dq__kvq_haar_unfixed(uint32_t dim, uint64_t seed, float *out);

/* Exact SVD by one-sided Jacobi of a (rows × cols, row-major, double): u rows × r, s r, vt r × cols
 * with r = min(rows, cols), singular values descending. */
int dq__kvq_svd_exact(const double *a, uint32_t rows, uint32_t cols, double *u, double *s, double *vt);

#endif
