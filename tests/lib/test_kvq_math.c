/* The KVQ numerical toolbox (dquant/kvq.h section 1): Lloyd–Max codebooks on the sphere marginal,
 * bucketize, Haar rotations, the randomized Hadamard rotation, k-means++, QJL, randomized SVD,
 * Huffman codes and attention-weighted bit assignment. Figures the seed paper quotes are printed
 * beside ours (stderr) where a test measures one. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"
#include "kvq_internal.h"

TestSuite(kvq_math);

/* A uniformly random unit vector of R^d (a Haar rotation of e1): a normalized Gaussian. */
static void unit_vector(dqt_rng *r, float *x, uint32_t d)
{
    double s = 0;
    double g[1024];
    for (uint32_t i = 0; i < d; i++) {
        g[i] = dqt_normal(r);
        s += g[i] * g[i];
    }
    s = 1.0 / sqrt(s);
    for (uint32_t i = 0; i < d; i++)
        x[i] = (float)(g[i] * s);
}

/* E|t| under the marginal of R^d: Γ(d/2) / (√π Γ((d+1)/2)), the exact 1-bit centroid. */
static double mean_abs(uint32_t d)
{
    return exp(lgamma(d / 2.0) - lgamma((d + 1) / 2.0)) / sqrt(M_PI);
}

/* ---- codebooks ---------------------------------------------------------------------------------- */

Test(kvq_math, codebook_shape)
{
    static const uint32_t dims[] = {2, 3, 4, 5, 8, 16, 64, 128, 256, 1024};
    for (uint32_t b = 1; b <= 8; b++) {
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const uint32_t d = dims[di], k = 1u << b;
            const float *c, *bd;
            cr_assert_eq(dq_kvq_codebook(b, d, &c, &bd), DQ_OK);
            for (uint32_t i = 0; i < k; i++) {
                cr_assert_eq(c[i], -c[k - 1 - i], "b=%u d=%u i=%u: %g vs %g", b, d, i, c[i], c[k - 1 - i]);
                cr_assert(c[i] > -1.0f && c[i] < 1.0f);
                if (i + 1 < k) {
                    cr_assert_lt(c[i], c[i + 1], "b=%u d=%u i=%u", b, d, i);
                    cr_assert(bd[i] >= c[i] && bd[i] < c[i + 1], "b=%u d=%u boundary %u", b, d, i);
                }
            }
            const float *c2, *bd2;
            cr_assert_eq(dq_kvq_codebook(b, d, &c2, &bd2), DQ_OK);
            cr_assert(c2 == c && bd2 == bd, "cached: same pointers");
        }
    }
}

/* Closed forms the quadrature must reproduce: the 1-bit centroid is E|t| (dim 2: the arcsine law's
 * 2/π, where the density is singular at ±1), and dim 3 is uniform on [−1, 1]. */
Test(kvq_math, codebook_closed_forms)
{
    static const uint32_t dims[] = {2, 3, 4, 6, 8, 16, 64, 128, 512, 4096};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const float *c;
        cr_assert_eq(dq_kvq_codebook(1, dims[di], &c, NULL), DQ_OK);
        const double want = mean_abs(dims[di]);
        cr_assert(fabs(c[1] - want) <= 2e-7 * want, "d=%u: %.9g vs %.9g", dims[di], c[1], want);
    }
    cr_assert(fabs(mean_abs(2) - 2 / M_PI) < 1e-12);
    for (uint32_t b = 1; b <= 6; b++) {
        const uint32_t k = 1u << b;
        const float *c;
        cr_assert_eq(dq_kvq_codebook(b, 3, &c, NULL), DQ_OK);
        for (uint32_t i = 0; i < k; i++) {
            const double want = -1.0 + (2.0 * i + 1.0) / k;
            cr_assert(fabs(c[i] - want) < 1e-6, "uniform b=%u i=%u: %g vs %g", b, i, c[i], want);
        }
    }
    double mse;
    const float *c;
    cr_assert_eq(dq_kvq_codebook(2, 3, &c, NULL), DQ_OK);
    cr_assert_eq(dq__kvq_marginal_mse(3, c, 4, &mse), DQ_OK);
    cr_assert(fabs(mse - (0.5 * 0.5) / 12) < 1e-9, "uniform 2-bit MSE %g", mse); /* step²/12 */
}

Test(kvq_math, codebook_errors)
{
    const float *c, *b;
    cr_assert_eq(dq_kvq_codebook(0, 16, &c, &b), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_codebook(9, 16, &c, &b), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_codebook(2, 1, &c, &b), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_codebook(2, 0, &c, &b), DQ_INVALID_ARGUMENT);
}

struct cb_race {
    const float *c, *b;
    int rc;
};

static void *cb_thread(void *arg)
{
    struct cb_race *r = arg;
    r->rc = dq_kvq_codebook(7, 77, &r->c, &r->b);
    return NULL;
}

Test(kvq_math, codebook_threads)
{
    pthread_t t[6];
    struct cb_race r[6];
    for (int i = 0; i < 6; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, cb_thread, &r[i]), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(r[i].rc, DQ_OK);
        cr_assert(r[i].c == r[0].c && r[i].b == r[0].b, "one cached codebook for all threads");
    }
}

/* Monte-Carlo MSE of nearest-centroid quantization of every coordinate of n random unit vectors,
 * with its standard error. */
static void mc_mse(uint32_t d, const float *c, uint32_t k, size_t n, uint64_t seed, double *mse, double *se)
{
    float bd[255], x[1024];
    dq__kvq_boundaries(c, k, bd);
    dqt_rng r;
    dqt_rng_seed(&r, seed);
    double s = 0, s2 = 0;
    for (size_t v = 0; v < n; v++) {
        unit_vector(&r, x, d);
        for (uint32_t j = 0; j < d; j++) {
            const double e = (double)x[j] - c[dq_kvq_bucketize(x[j], bd, k - 1)];
            s += e * e;
            s2 += e * e * e * e;
        }
    }
    const double m = (double)n * d;
    *mse = s / m;
    /* coordinates of one vector are dependent; the per-vector sums would be exact, this is close */
    *se = sqrt((s2 / m - *mse * *mse) / m) * 2;
}

Test(kvq_math, codebook_mse_matches_monte_carlo)
{
    static const uint32_t cases[][2] = {{1, 2}, {2, 2}, {1, 8}, {2, 16}, {3, 64}, {4, 128}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint32_t b = cases[i][0], d = cases[i][1], k = 1u << b;
        const float *c;
        double num, mc, se;
        cr_assert_eq(dq_kvq_codebook(b, d, &c, NULL), DQ_OK);
        cr_assert_eq(dq__kvq_marginal_mse(d, c, k, &num), DQ_OK);
        mc_mse(d, c, k, 200000 / d + 2000, 0x6d5e + i, &mc, &se);
        fprintf(stderr, "kvq codebook b=%u d=%u: MSE quadrature %.6g, Monte-Carlo %.6g ± %.2g\n", b, d, num, mc, se);
        cr_assert(fabs(num - mc) < 4 * se, "b=%u d=%u: %g vs %g ± %g", b, d, num, mc, se);
    }
}

/* The seed's §2.2.1 claim: the codebook of the true marginal beats the Gaussian approximation's on
 * true samples, most visibly at small d and b ∈ {1, 2}. */
Test(kvq_math, codebook_beta_beats_gaussian)
{
    static const uint32_t dims[] = {8, 16};
    for (size_t di = 0; di < 2; di++) {
        for (uint32_t b = 1; b <= 2; b++) {
            const uint32_t d = dims[di], k = 1u << b;
            const float *cb;
            float cg[4];
            cr_assert_eq(dq_kvq_codebook(b, d, &cb, NULL), DQ_OK);
            cr_assert_eq(dq__kvq_gauss_codebook(b, d, cg), DQ_OK);
            double nb, ng, mb, mg, sb, sg;
            cr_assert_eq(dq__kvq_marginal_mse(d, cb, k, &nb), DQ_OK);
            cr_assert_eq(dq__kvq_marginal_mse(d, cg, k, &ng), DQ_OK);
            mc_mse(d, cb, k, 40000, 0xbe7a + d + b, &mb, &sb);
            mc_mse(d, cg, k, 40000, 0xbe7a + d + b, &mg, &sg); /* the same samples */
            fprintf(stderr,
                    "kvq Beta vs Gaussian codebook d=%u b=%u: MSE %.6g vs %.6g (quadrature), %.6g vs %.6g "
                    "(Monte-Carlo), %.2f%% lower\n",
                    d, b, nb, ng, mb, mg, 100 * (1 - nb / ng));
            cr_assert_lt(nb, ng);
            cr_assert_lt(mb, mg, "d=%u b=%u on the same samples", d, b);
        }
    }
}

/* ---- bucketize vs argmin ------------------------------------------------------------------------ */

static void check_same(float x, const float *c, const float *bd, uint32_t k)
{
    const uint32_t a = dq_kvq_bucketize(x, bd, k - 1), b = dq_kvq_nearest_argmin(x, c, k);
    cr_assert_eq(a, b, "x=%a: bucketize %u, argmin %u", x, a, b);
}

Test(kvq_math, bucketize_equals_argmin)
{
    dqt_rng r;
    dqt_rng_seed(&r, 0xb0c4e7);
    static const uint32_t dims[] = {2, 3, 128};
    for (size_t di = 0; di < 3; di++) {
        for (uint32_t b = 1; b <= 8; b++) {
            const uint32_t k = 1u << b;
            const float *c, *bd;
            cr_assert_eq(dq_kvq_codebook(b, dims[di], &c, &bd), DQ_OK);
            const double span = 1.3 * c[k - 1];
            for (int i = 0; i < 100000 / 12; i++)
                check_same((float)((2 * dqt_uniform(&r) - 1) * span), c, bd, k);
            for (uint32_t i = 0; i < k; i++) {
                check_same(c[i], c, bd, k);
                cr_assert_eq(dq_kvq_nearest_argmin(c[i], c, k), i);
                if (i + 1 < k) {
                    float x = bd[i];
                    cr_assert_eq(dq_kvq_bucketize(x, bd, k - 1), i, "a boundary belongs to the lower cell");
                    for (int s = 0; s < 3; s++) {
                        check_same(x, c, bd, k);
                        x = nextafterf(x, INFINITY);
                    }
                    x = bd[i];
                    for (int s = 0; s < 3; s++) {
                        x = nextafterf(x, -INFINITY);
                        check_same(x, c, bd, k);
                    }
                }
            }
            static const float special[] = {0.0f, -0.0f, FLT_MIN, -FLT_MIN, 1e-45f,   -1e-45f,
                                            1.0f, -1.0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY};
            for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
                check_same(special[i], c, bd, k);
            cr_assert_eq(dq_kvq_bucketize(INFINITY, bd, k - 1), k - 1);
            cr_assert_eq(dq_kvq_bucketize(-INFINITY, bd, k - 1), 0);
            /* NaN: documented as index 0 by both */
            cr_assert_eq(dq_kvq_bucketize(NAN, bd, k - 1), 0);
            cr_assert_eq(dq_kvq_nearest_argmin(NAN, c, k), 0);
        }
    }
}

/* Boundaries of arbitrary centroids, including ones far apart in magnitude, keep the equality. */
Test(kvq_math, boundaries_exact)
{
    dqt_rng r;
    dqt_rng_seed(&r, 0xbd);
    for (int t = 0; t < 200; t++) {
        float c[16], bd[15];
        const uint32_t k = 2 + dqt_below(&r, 15);
        for (uint32_t i = 0; i < k; i++)
            c[i] = (float)(dqt_normal(&r) * pow(10.0, (double)dqt_below(&r, 8) - 4));
        /* ascending and distinct */
        for (uint32_t i = 1; i < k; i++)
            for (uint32_t j = i; j > 0 && c[j] < c[j - 1]; j--) {
                float s = c[j];
                c[j] = c[j - 1];
                c[j - 1] = s;
            }
        uint32_t m = 1;
        for (uint32_t i = 1; i < k; i++)
            if (c[i] != c[m - 1])
                c[m++] = c[i];
        if (m < 2)
            continue;
        dq__kvq_boundaries(c, m, bd);
        for (uint32_t i = 0; i + 1 < m; i++) {
            float x = bd[i];
            for (int s = 0; s < 4; s++, x = nextafterf(x, INFINITY))
                check_same(x, c, bd, m);
        }
        for (int i = 0; i < 200; i++)
            check_same((float)(dqt_normal(&r) * pow(10.0, (double)dqt_below(&r, 8) - 4)), c, bd, m);
    }
}

/* The cached codebooks are local minima of the quadrature MSE: moving any one centroid either way
 * costs (checked at 8 bits too, where the Lloyd map converges slowest). */
Test(kvq_math, codebook_stationary)
{
    static const uint32_t cases[][2] = {{8, 128}, {8, 2}, {5, 3}, {3, 16}, {1, 64}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t b = cases[ci][0], d = cases[ci][1], k = 1u << b;
        const float *c;
        float p[256];
        double m0, m1;
        cr_assert_eq(dq_kvq_codebook(b, d, &c, NULL), DQ_OK);
        cr_assert_eq(dq__kvq_marginal_mse(d, c, k, &m0), DQ_OK);
        for (uint32_t i = 0; i < k; i += (k > 16 ? 37 : 1)) {
            for (int s = -1; s <= 1; s += 2) {
                memcpy(p, c, k * sizeof *c);
                const float gap = i + 1 < k ? c[i + 1] - c[i] : c[i] - c[i - 1];
                p[i] += s * 0.02f * gap;
                cr_assert_eq(dq__kvq_marginal_mse(d, p, k, &m1), DQ_OK);
                cr_assert_gt(m1, m0, "b=%u d=%u centroid %u moved %+d: %.12g vs %.12g", b, d, i, s, m1, m0);
            }
        }
    }
}
