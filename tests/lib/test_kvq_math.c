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
 * with its standard error (from the per-vector totals: a vector's coordinates are dependent, the
 * vectors are not). */
static void mc_mse(uint32_t d, const float *c, uint32_t k, size_t n, uint64_t seed, double *mse, double *se)
{
    float bd[255], x[1024];
    dq__kvq_boundaries(c, k, bd);
    dqt_rng r;
    dqt_rng_seed(&r, seed);
    double s = 0, s2 = 0;
    for (size_t v = 0; v < n; v++) {
        unit_vector(&r, x, d);
        double ev = 0;
        for (uint32_t j = 0; j < d; j++) {
            const double e = (double)x[j] - c[dq_kvq_bucketize(x[j], bd, k - 1)];
            ev += e * e;
        }
        s += ev;
        s2 += ev * ev;
    }
    *mse = s / n / d;
    *se = sqrt((s2 / n - (s / n) * (s / n)) / n) / d;
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

/* The same through the library's own rotations: one fixed unit vector rotated by dq_kvq_haar for
 * many seeds (the coordinates of Q·x0 follow the marginal when Q is Haar on SO(d)). */
Test(kvq_math, codebook_mse_haar_rotated)
{
    static const uint32_t cases[][2] = {{2, 16}, {1, 5}, {3, 32}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const uint32_t b = cases[ci][0], d = cases[ci][1], k = 1u << b, n = 4000;
        const float *c, *bd;
        float q[32 * 32], x0[32];
        dqt_rng r;
        dqt_rng_seed(&r, 0x4a + ci);
        unit_vector(&r, x0, d);
        cr_assert_eq(dq_kvq_codebook(b, d, &c, &bd), DQ_OK);
        double s = 0, s2 = 0, num;
        for (uint32_t t = 0; t < n; t++) {
            cr_assert_eq(dq_kvq_haar(d, 0x600d + t, q), DQ_OK);
            double ev = 0; /* one vector's error: its coordinates are dependent, its total is not */
            for (uint32_t i = 0; i < d; i++) {
                double y = 0;
                for (uint32_t j = 0; j < d; j++)
                    y += (double)q[i * d + j] * x0[j];
                const double e = y - c[dq_kvq_bucketize((float)y, bd, k - 1)];
                ev += e * e;
            }
            s += ev;
            s2 += ev * ev;
        }
        const double mean = s / n / d, se = sqrt((s2 / n - (s / n) * (s / n)) / n) / d;
        cr_assert_eq(dq__kvq_marginal_mse(d, c, k, &num), DQ_OK);
        fprintf(stderr, "kvq codebook b=%u d=%u through dq_kvq_haar: MSE %.6g ± %.2g, quadrature %.6g\n", b, d, mean,
                se, num);
        cr_assert(fabs(mean - num) < 4 * se, "b=%u d=%u: %g vs %g ± %g", b, d, num, mean, se);
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

/* ---- Haar rotations, determinants, the randomized Hadamard rotation ------------------------------ */

static double orth_error(const float *q, uint32_t d)
{
    double worst = 0;
    for (uint32_t i = 0; i < d; i++)
        for (uint32_t j = 0; j < d; j++) {
            double s = 0;
            for (uint32_t l = 0; l < d; l++)
                s += (double)q[i * d + l] * q[j * d + l];
            worst = fmax(worst, fabs(s - (i == j)));
        }
    return worst;
}

Test(kvq_math, haar_orthonormal_deterministic)
{
    static const uint32_t dims[] = {1, 2, 3, 7, 16, 64, 128, 256};
    float *q = dqt_xmalloc(256 * 256 * sizeof *q), *q2 = dqt_xmalloc(256 * 256 * sizeof *q2);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const uint32_t d = dims[di];
        for (uint64_t seed = 0; seed < 3; seed++) {
            cr_assert_eq(dq_kvq_haar(d, seed, q), DQ_OK);
            const double e = orth_error(q, d);
            cr_assert_lt(e, 1e-5, "d=%u seed=%llu: |QQᵀ − I| = %g", d, (unsigned long long)seed, e);
            cr_assert_eq(dq_kvq_haar(d, seed, q2), DQ_OK);
            cr_assert_eq(memcmp(q, q2, (size_t)d * d * sizeof *q), 0, "deterministic");
            if (d > 1) {
                cr_assert_eq(dq_kvq_haar(d, seed + 100, q2), DQ_OK);
                cr_assert_neq(memcmp(q, q2, (size_t)d * d * sizeof *q), 0, "seed changes the rotation");
            }
        }
    }
    /* a fixed value of the stream: the generator and the QR are the same on every platform */
    cr_assert_eq(dq_kvq_haar(2, 1, q), DQ_OK);
    cr_assert(fabsf(q[0] * q[3] - q[1] * q[2] - 1) < 1e-6 && fabsf(q[0] - q[3]) < 1e-7 && fabsf(q[1] + q[2]) < 1e-7,
              "a 2-D rotation is [[c, −s], [s, c]]");
    cr_assert_eq(dq_kvq_haar(0, 1, q), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_haar(4, 1, NULL), DQ_INVALID_ARGUMENT);
    free(q);
    free(q2);
}

/* det(Q) = +1 always (200 seeds for every dim 2..32, 25 seeds at larger dims up to 128: the O(d³)
 * QR keeps the test short); without the fix about half are reflections. */
Test(kvq_math, haar_is_rotation)
{
    float *q = dqt_xmalloc(128 * 128 * sizeof *q), *u = dqt_xmalloc(128 * 128 * sizeof *u);
    uint32_t reflections = 0, total = 0;
    static const uint32_t big[] = {33, 47, 64, 100, 127, 128};
    for (uint32_t di = 0; di < 31 + 6; di++) {
        const uint32_t d = di < 31 ? 2 + di : big[di - 31];
        const uint32_t seeds = d <= 32 ? 200 : 25;
        for (uint32_t s = 0; s < seeds; s++) {
            const uint64_t seed = 0x4a4a0000ull + s * 7919u + d;
            int sg;
            cr_assert_eq(dq_kvq_haar(d, seed, q), DQ_OK);
            cr_assert_eq(dq_kvq_det_sign(q, d, &sg), DQ_OK);
            cr_assert_eq(sg, 1, "d=%u seed=%llu: det sign %d", d, (unsigned long long)seed, sg);
            cr_assert_eq(dq__kvq_haar_unfixed(d, seed, u), DQ_OK);
            cr_assert_eq(dq_kvq_det_sign(u, d, &sg), DQ_OK);
            cr_assert(sg == 1 || sg == -1);
            reflections += sg < 0;
            total++;
            /* the fix touches only the first column, and only of reflections */
            for (uint32_t i = 0; i < d; i++)
                for (uint32_t j = 0; j < d; j++)
                    cr_assert_eq(q[i * d + j], (sg < 0 && j == 0) ? -u[i * d + j] : u[i * d + j]);
        }
    }
    const double frac = (double)reflections / total, sd = sqrt(0.25 / total);
    fprintf(stderr, "kvq haar: without the determinant fix %u of %u (%.1f%%) are reflections\n", reflections, total,
            100 * frac);
    cr_assert(fabs(frac - 0.5) < 4 * sd, "reflections %.3f of the unfixed Q", frac);
    free(q);
    free(u);
}

/* Haar on SO(d): Q·e1 is uniform on the sphere (E[q00] = 0, E[q00²] = 1/d), for d = 3 and 8. */
Test(kvq_math, haar_first_column_uniform)
{
    float q[64];
    static const uint32_t dims[] = {3, 8};
    for (int di = 0; di < 2; di++) {
        const uint32_t d = dims[di], n = 4000;
        double m1 = 0, m2 = 0;
        for (uint32_t s = 0; s < n; s++) {
            cr_assert_eq(dq_kvq_haar(d, 0xc0105 + s, q), DQ_OK);
            m1 += q[0];
            m2 += (double)q[0] * q[0];
        }
        m1 /= n;
        m2 /= n;
        const double se = sqrt(1.0 / d / n);
        cr_assert(fabs(m1) < 4 * se, "d=%u E[q00] = %g", d, m1);
        cr_assert(fabs(m2 - 1.0 / d) < 0.1 / d, "d=%u E[q00²] = %g vs %g", d, m2, 1.0 / d);
    }
}

Test(kvq_math, det_sign)
{
    float m[16] = {0};
    int sg;
    for (int i = 0; i < 4; i++)
        m[i * 4 + i] = 1;
    cr_assert_eq(dq_kvq_det_sign(m, 4, &sg), DQ_OK);
    cr_assert_eq(sg, 1);
    m[0] = -2; /* diag(−2, 1, 1, 1) */
    cr_assert_eq(dq_kvq_det_sign(m, 4, &sg), DQ_OK);
    cr_assert_eq(sg, -1);
    /* a row swap of I: −1 */
    const float swap[9] = {0, 1, 0, 1, 0, 0, 0, 0, 1};
    cr_assert_eq(dq_kvq_det_sign(swap, 3, &sg), DQ_OK);
    cr_assert_eq(sg, -1);
    /* [[1, 2], [3, 4]]: det −2; [[2, 1], [1, 2]]: +3; a rank-1 matrix: 0 */
    const float a[4] = {1, 2, 3, 4}, b[4] = {2, 1, 1, 2}, c[9] = {1, 2, 3, 2, 4, 6, -1, -2, -3};
    cr_assert_eq(dq_kvq_det_sign(a, 2, &sg), DQ_OK);
    cr_assert_eq(sg, -1);
    cr_assert_eq(dq_kvq_det_sign(b, 2, &sg), DQ_OK);
    cr_assert_eq(sg, 1);
    cr_assert_eq(dq_kvq_det_sign(c, 3, &sg), DQ_OK);
    cr_assert_eq(sg, 0);
    const float bad[4] = {1, NAN, 0, 1};
    cr_assert_eq(dq_kvq_det_sign(bad, 2, &sg), DQ_NONFINITE);
    cr_assert_eq(dq_kvq_det_sign(a, 0, &sg), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_det_sign(a, 2, NULL), DQ_INVALID_ARGUMENT);
}

Test(kvq_math, randomized_hadamard)
{
    dqt_rng r;
    dqt_rng_seed(&r, 0x4ad);
    static const uint32_t dims[] = {1, 2, 8, 64, 128, 256};
    float signs[256], x[256], y[256], s2[256];
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const uint32_t d = dims[di];
        cr_assert_eq(dq__kvq_rht_signs(d, 0x5eed + d, signs), DQ_OK);
        cr_assert_eq(dq__kvq_rht_signs(d, 0x5eed + d, s2), DQ_OK);
        cr_assert_eq(memcmp(signs, s2, d * sizeof *signs), 0);
        uint32_t neg = 0;
        for (uint32_t i = 0; i < d; i++) {
            cr_assert(signs[i] == 1.0f || signs[i] == -1.0f);
            neg += signs[i] < 0;
        }
        if (d >= 64)
            cr_assert(neg > d / 4 && neg < 3 * d / 4, "d=%u: %u negative signs", d, neg);
        double n0 = 0, n1 = 0;
        for (uint32_t i = 0; i < d; i++) {
            x[i] = y[i] = (float)dqt_normal(&r);
            n0 += (double)x[i] * x[i];
        }
        dq__kvq_rht_apply(y, signs, d);
        for (uint32_t i = 0; i < d; i++)
            n1 += (double)y[i] * y[i];
        cr_assert(fabs(n1 - n0) < 1e-5 * n0, "d=%u: norm %g vs %g", d, n1, n0);
        if (d == 8) { /* H[i][j] = (−1)^popcount(i & j) */
            for (uint32_t i = 0; i < 8; i++) {
                double s = 0;
                for (uint32_t j = 0; j < 8; j++)
                    s += (__builtin_popcount(i & j) & 1 ? -1.0 : 1.0) * signs[j] * x[j];
                cr_assert(fabs(s / sqrt(8.0) - y[i]) < 1e-6, "explicit H·D/√d row %u", i);
            }
        }
        dq__kvq_rht_inverse(y, signs, d);
        for (uint32_t i = 0; i < d; i++)
            cr_assert(fabsf(y[i] - x[i]) < 1e-5f, "d=%u round trip %u: %g vs %g", d, i, y[i], x[i]);
    }
    cr_assert_eq(dq__kvq_rht_signs(12, 1, signs), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq__kvq_rht_signs(0, 1, signs), DQ_INVALID_ARGUMENT);
}

/* ---- k-means++ ----------------------------------------------------------------------------------- */

/* n 1-D samples of the coordinate marginal of R^d (one coordinate per random unit vector). */
static float *marginal_samples(uint32_t d, size_t n, uint64_t seed)
{
    float *s = dqt_xmalloc(n * sizeof *s), x[1024];
    dqt_rng r;
    dqt_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i += d) {
        unit_vector(&r, x, d);
        for (uint32_t j = 0; j < d && i + j < n; j++)
            s[i + j] = x[j];
    }
    return s;
}

/* The seed's §2.2.1 figure (d = 64, 100k samples, before any Lloyd iteration): k-means++ cuts the
 * initial MSE by 75.1% at 1 bit, 58.5% at 2, 27.6% at 3, ~0% at 4. Ours: mean over 16 seeds. */
Test(kvq_math, kmeanspp_init_beats_linspace)
{
    const size_t n = 100000;
    float *s = marginal_samples(64, n, 0x64);
    static const double paper[] = {75.1, 58.5, 27.6, 0.4};
    for (uint32_t b = 1; b <= 4; b++) {
        const uint32_t k = 1u << b;
        float c[16];
        double lin, pp = 0, m;
        cr_assert_eq(dq_kvq_kmeans_linspace(s, n, 1, k, 0, c, &lin), DQ_OK);
        for (uint64_t seed = 0; seed < 16; seed++) {
            cr_assert_eq(dq_kvq_kmeans(s, n, 1, k, 0, seed, c, &m), DQ_OK);
            pp += m / 16;
        }
        const double red = 100 * (1 - pp / lin);
        fprintf(stderr, "kvq k-means++ init d=64 b=%u: MSE %.4g vs linspace %.4g: %.1f%% lower (paper %.1f%%)\n", b, pp,
                lin, red, paper[b - 1]);
        if (b == 1)
            cr_assert_gt(red, 60, "1 bit: k-means++ init %.1f%% lower", red);
        if (b <= 2)
            cr_assert_lt(pp, lin);
    }
    free(s);
}

/* Lloyd iterations from k-means++ reach the Lloyd–Max codebook of the marginal on its samples. */
Test(kvq_math, kmeans_converges_to_lloyd_max)
{
    const size_t n = 60000;
    float *s = marginal_samples(16, n, 0x16);
    const float *lm;
    float c[4];
    double m0, m1;
    cr_assert_eq(dq_kvq_codebook(2, 16, &lm, NULL), DQ_OK);
    cr_assert_eq(dq_kvq_kmeans(s, n, 1, 4, 0, 3, c, &m0), DQ_OK);
    cr_assert_eq(dq_kvq_kmeans(s, n, 1, 4, 1000, 3, c, &m1), DQ_OK);
    cr_assert_leq(m1, m0);
    /* sort (k-means centroids come in seeding order) */
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && c[j] < c[j - 1]; j--) {
            const float t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    /* the sample fixed point moves with the sample (the Lloyd map contracts slowly): 5% */
    for (int i = 0; i < 4; i++)
        cr_assert(fabsf(c[i] - lm[i]) < 0.05f * fabsf(lm[i]), "centroid %d: %g vs Lloyd–Max %g", i, c[i], lm[i]);
    /* on its own samples k-means is at least as good as the Lloyd–Max codebook, and close */
    double lms = 0;
    float bd[3];
    dq__kvq_boundaries(lm, 4, bd);
    for (size_t i = 0; i < n; i++) {
        const double e = (double)s[i] - lm[dq_kvq_bucketize(s[i], bd, 3)];
        lms += e * e / n;
    }
    cr_assert(m1 <= lms * (1 + 1e-9) && m1 > 0.99 * lms, "k-means MSE %g vs Lloyd–Max %g on the samples", m1, lms);
    double q;
    cr_assert_eq(dq__kvq_marginal_mse(16, lm, 4, &q), DQ_OK);
    cr_assert(fabs(m1 - q) < 0.03 * q, "k-means MSE %g vs Lloyd–Max %g", m1, q);
    free(s);
}

static double dist2(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

Test(kvq_math, kmeans_separable_clusters)
{
    static const float centers[5][3] = {{0, 0, 0}, {10, 0, 0}, {0, 10, 0}, {0, 0, 10}, {10, 10, 10}};
    const size_t per = 200, n = 5 * per;
    float *p = dqt_xmalloc(n * 3 * sizeof *p), c[15], c2[15];
    dqt_rng r;
    dqt_rng_seed(&r, 0xc1);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < 3; j++)
            p[i * 3 + j] = centers[i % 5][j] + 0.1f * (float)dqt_normal(&r);
    for (uint64_t seed = 0; seed < 10; seed++) {
        double mse;
        cr_assert_eq(dq_kvq_kmeans(p, n, 3, 5, 30, seed, c, &mse), DQ_OK);
        /* every true center has a centroid within 0.05 */
        for (int t = 0; t < 5; t++) {
            double best = 1e30;
            for (int m = 0; m < 5; m++)
                best = fmin(best, sqrt(dist2(&centers[t][0], c + m * 3, 3)));
            cr_assert_lt(best, 0.05, "seed %llu center %d: nearest centroid %g away", (unsigned long long)seed, t,
                         best);
        }
        cr_assert(fabs(mse - 0.03) < 0.006, "MSE %g vs 3·0.1²", mse);
        cr_assert_eq(dq_kvq_kmeans(p, n, 3, 5, 30, seed, c2, NULL), DQ_OK);
        cr_assert_eq(memcmp(c, c2, sizeof c), 0, "deterministic");
    }
    /* linspace on the diagonal cannot separate them in 0 iterations but k-means++ can */
    double lin, pp;
    cr_assert_eq(dq_kvq_kmeans_linspace(p, n, 3, 5, 0, c, &lin), DQ_OK);
    cr_assert_eq(dq_kvq_kmeans(p, n, 3, 5, 0, 1, c, &pp), DQ_OK);
    cr_assert_lt(pp, lin);
    free(p);
}

Test(kvq_math, kmeans_errors)
{
    float p[8] = {0, 1, 2, 3, 4, 5, 6, 7}, c[16];
    double m;
    cr_assert_eq(dq_kvq_kmeans(p, 8, 1, 9, 1, 0, c, &m), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_kmeans(p, 0, 1, 1, 1, 0, c, &m), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_kmeans(p, 8, 0, 1, 1, 0, c, &m), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_kmeans(p, 8, 1, 0, 1, 0, c, &m), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_kmeans(NULL, 8, 1, 2, 1, 0, c, &m), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_kmeans_linspace(p, 4, 2, 5, 1, c, &m), DQ_INVALID_ARGUMENT);
    p[5] = NAN;
    cr_assert_eq(dq_kvq_kmeans(p, 8, 1, 2, 1, 0, c, &m), DQ_NONFINITE);
    cr_assert_eq(dq_kvq_kmeans_linspace(p, 8, 1, 2, 1, c, &m), DQ_NONFINITE);
    p[5] = INFINITY;
    cr_assert_eq(dq_kvq_kmeans(p, 8, 1, 2, 1, 0, c, &m), DQ_NONFINITE);
    /* k = count and duplicate points are fine: every point its own centroid, MSE 0 */
    const float dup[4] = {1, 1, 1, 1};
    cr_assert_eq(dq_kvq_kmeans(dup, 4, 1, 4, 3, 0, c, &m), DQ_OK);
    cr_assert_eq(m, 0);
    p[5] = 5;
    cr_assert_eq(dq_kvq_kmeans(p, 8, 1, 8, 3, 0, c, &m), DQ_OK);
    cr_assert_eq(m, 0);
}

/* ---- QJL ------------------------------------------------------------------------------------------ */

/* Mean and variance over `seeds` projections of the estimate's error for fixed y, r. */
static void qjl_errors(uint32_t d, const float *y, const float *r, uint32_t seeds, double *mean, double *var,
                       double *exact)
{
    float *s = dqt_xmalloc((size_t)d * d * sizeof *s), *sy = dqt_xmalloc(d * sizeof *sy), norm, est;
    uint8_t bits[64];
    double e = 0, sum = 0, sum2 = 0;
    for (uint32_t j = 0; j < d; j++)
        e += (double)y[j] * r[j];
    for (uint32_t t = 0; t < seeds; t++) {
        cr_assert_eq(dq_kvq_qjl_matrix(d, 0x917 + t * 1000003ull, s), DQ_OK);
        cr_assert_eq(dq_kvq_qjl_sign(s, d, r, bits, &norm), DQ_OK);
        cr_assert_eq(dq_kvq_qjl_dot(s, d, y, bits, norm, &est), DQ_OK);
        cr_assert_eq(dq_kvq_qjl_project(s, d, y, sy), DQ_OK);
        const float est2 = dq_kvq_qjl_estimate(sy, d, bits, norm);
        cr_assert(fabsf(est2 - est) <= 1e-5f * (fabsf(est) + 1), "split path %g vs %g", est2, est);
        sum += est - e;
        sum2 += (est - e) * (est - e);
    }
    *mean = sum / seeds;
    *var = sum2 / seeds - *mean * *mean;
    *exact = e;
    free(s);
    free(sy);
}

Test(kvq_math, qjl_unbiased_variance_falls_with_d)
{
    dqt_rng g;
    dqt_rng_seed(&g, 0x951);
    static const uint32_t dims[] = {16, 64, 256};
    static const uint32_t seeds[] = {3000, 1500, 400};
    double prev = INFINITY;
    for (int di = 0; di < 3; di++) {
        const uint32_t d = dims[di];
        float y[256], r[256];
        /* unit y, unit r with <y, r> = 0.6 */
        unit_vector(&g, y, d);
        unit_vector(&g, r, d);
        double yr = 0;
        for (uint32_t j = 0; j < d; j++)
            yr += (double)y[j] * r[j];
        double n2 = 0;
        for (uint32_t j = 0; j < d; j++) {
            r[j] = (float)(r[j] - yr * y[j]);
            n2 += (double)r[j] * r[j];
        }
        for (uint32_t j = 0; j < d; j++)
            r[j] = (float)(0.6 * y[j] + 0.8 * r[j] / sqrt(n2));
        double mean, var, exact;
        qjl_errors(d, y, r, seeds[di], &mean, &var, &exact);
        const double theory = (M_PI / 2 - exact * exact) / d, se = sqrt(var / seeds[di]);
        fprintf(stderr, "kvq QJL d=%u: <y,r> = %.4f, mean error %+.5f (se %.5f), variance %.5f (theory %.5f)\n", d,
                exact, mean, se, var, theory);
        cr_assert(fabs(mean) < 3 * se, "d=%u: biased, mean error %g (se %g)", d, mean, se);
        cr_assert(fabs(var - theory) < 0.15 * theory, "d=%u: variance %g vs %g", d, var, theory);
        cr_assert_lt(var, prev / 2.5, "variance falls with d");
        prev = var;
    }
}

Test(kvq_math, qjl_errors_and_zero)
{
    float s[16], r[4] = {0, 0, 0, 0}, y[4] = {1, 2, 3, 4}, norm = 1, out = 1;
    uint8_t bits[1];
    cr_assert_eq(dq_kvq_qjl_matrix(4, 1, s), DQ_OK);
    cr_assert_eq(dq_kvq_qjl_sign(s, 4, r, bits, &norm), DQ_OK);
    cr_assert_eq(norm, 0);
    cr_assert_eq(dq_kvq_qjl_dot(s, 4, y, bits, norm, &out), DQ_OK);
    cr_assert_eq(out, 0, "a zero residual contributes nothing");
    r[2] = NAN;
    cr_assert_eq(dq_kvq_qjl_sign(s, 4, r, bits, &norm), DQ_NONFINITE);
    cr_assert_eq(dq_kvq_qjl_dot(s, 4, y, bits, NAN, &out), DQ_NONFINITE);
    cr_assert_eq(dq_kvq_qjl_dot(s, 4, y, bits, -1, &out), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_qjl_matrix(0, 1, s), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_qjl_sign(s, 0, y, bits, &norm), DQ_INVALID_ARGUMENT);
}

/* ---- randomized SVD ----------------------------------------------------------------------------- */

/* rows × cols: a rank-`rank` product with decaying column scales plus N(0, noise²) entries. */
static float *lowrank_noise(uint32_t rows, uint32_t cols, uint32_t rank, double noise, uint64_t seed)
{
    dqt_rng r;
    dqt_rng_seed(&r, seed);
    double *l = dqt_xmalloc((size_t)rows * rank * sizeof *l), *rt = dqt_xmalloc((size_t)cols * rank * sizeof *rt);
    for (size_t i = 0; i < (size_t)rows * rank; i++)
        l[i] = dqt_normal(&r);
    for (size_t i = 0; i < (size_t)cols * rank; i++)
        rt[i] = dqt_normal(&r) * pow(0.7, (double)(i % rank));
    float *a = dqt_xmalloc((size_t)rows * cols * sizeof *a);
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t j = 0; j < cols; j++) {
            double s = noise * dqt_normal(&r);
            for (uint32_t t = 0; t < rank; t++)
                s += l[(size_t)i * rank + t] * rt[(size_t)j * rank + t];
            a[(size_t)i * cols + j] = (float)s;
        }
    free(l);
    free(rt);
    return a;
}

/* ‖A − U·diag(s)·Vᵀ‖_F for rank triplets (floats). */
static double recon_error(const float *a, uint32_t rows, uint32_t cols, const float *u, const float *s, const float *vt,
                          uint32_t rank)
{
    double e = 0;
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t j = 0; j < cols; j++) {
            double x = a[(size_t)i * cols + j];
            for (uint32_t t = 0; t < rank; t++)
                x -= (double)u[(size_t)i * rank + t] * s[t] * vt[(size_t)t * cols + j];
            e += x * x;
        }
    return sqrt(e);
}

/* The reference: dq__kvq_svd_exact, itself checked (A = UΣVᵀ, orthonormal factors, descending). */
static void exact_svd(const float *a, uint32_t rows, uint32_t cols, double *u, double *s, double *vt)
{
    const uint32_t r = rows < cols ? rows : cols;
    double *ad = dqt_xmalloc((size_t)rows * cols * sizeof *ad), norm = 0;
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        ad[i] = a[i];
        norm += ad[i] * ad[i];
    }
    cr_assert_eq(dq__kvq_svd_exact(ad, rows, cols, u, s, vt), DQ_OK);
    double e = 0;
    for (uint32_t i = 0; i < rows; i++)
        for (uint32_t j = 0; j < cols; j++) {
            double x = ad[(size_t)i * cols + j];
            for (uint32_t t = 0; t < r; t++)
                x -= u[(size_t)i * r + t] * s[t] * vt[(size_t)t * cols + j];
            e += x * x;
        }
    cr_assert_lt(sqrt(e / norm), 1e-10, "exact SVD reconstructs A");
    for (uint32_t p = 0; p < r; p++) {
        if (p + 1 < r)
            cr_assert_geq(s[p], s[p + 1]);
        for (uint32_t q = p; q < r; q++) {
            double du = 0, dv = 0;
            for (uint32_t i = 0; i < rows; i++)
                du += u[(size_t)i * r + p] * u[(size_t)i * r + q];
            for (uint32_t j = 0; j < cols; j++)
                dv += vt[(size_t)p * cols + j] * vt[(size_t)q * cols + j];
            if (s[q] > 1e-9 * s[0])
                cr_assert(fabs(du - (p == q)) < 1e-9, "UᵀU [%u][%u] = %g", p, q, du);
            cr_assert(fabs(dv - (p == q)) < 1e-9, "VᵀV [%u][%u] = %g", p, q, dv);
        }
    }
    free(ad);
}

struct rsvd_case {
    uint32_t rows, cols, true_rank, rank, power;
};

ParameterizedTestParameters(kvq_math, rsvd_vs_exact)
{
    static struct rsvd_case c[] = {
        {256, 96, 8, 8, 2}, {128, 256, 6, 4, 2},  {512, 64, 4, 4, 1},    {40, 100, 5, 5, 0},
        {63, 20, 3, 3, 2},  {256, 128, 24, 8, 1}, {300, 200, 40, 12, 2},
    };
    return cr_make_param_array(struct rsvd_case, c, sizeof c / sizeof c[0]);
}

ParameterizedTest(struct rsvd_case *c, kvq_math, rsvd_vs_exact)
{
    const uint32_t rows = c->rows, cols = c->cols, r = rows < cols ? rows : cols, k = c->rank;
    float *a = lowrank_noise(rows, cols, c->true_rank, 0.05, 0x5fd + rows + cols);
    double *eu = dqt_xmalloc((size_t)rows * r * sizeof *eu), *es = dqt_xmalloc(r * sizeof *es),
           *evt = dqt_xmalloc((size_t)r * cols * sizeof *evt);
    exact_svd(a, rows, cols, eu, es, evt);
    float *u = dqt_xmalloc((size_t)rows * k * sizeof *u), *s = dqt_xmalloc(k * sizeof *s),
          *vt = dqt_xmalloc((size_t)k * cols * sizeof *vt);
    float *u2 = dqt_xmalloc((size_t)rows * k * sizeof *u2), *s2 = dqt_xmalloc(k * sizeof *s2),
          *vt2 = dqt_xmalloc((size_t)k * cols * sizeof *vt2);
    cr_assert_eq(dq_kvq_rsvd(a, rows, cols, k, c->power, 77, u, s, vt), DQ_OK);
    for (uint32_t t = 0; t < k; t++)
        cr_assert(fabs(s[t] - es[t]) < 0.01 * es[t], "%ux%u σ%u: %g vs exact %g", rows, cols, t, s[t], es[t]);
    double tail = 0;
    for (uint32_t t = k; t < r; t++)
        tail += es[t] * es[t];
    tail = sqrt(tail);
    const double err = recon_error(a, rows, cols, u, s, vt, k);
    fprintf(stderr, "kvq rsvd %ux%u rank %u power %u: σ1 %.4f (exact %.4f), error %.5f vs truncated SVD %.5f\n", rows,
            cols, k, c->power, s[0], es[0], err, tail);
    cr_assert(err <= 1.01 * tail + 1e-4, "reconstruction %g vs optimal %g", err, tail);
    cr_assert_eq(dq_kvq_rsvd(a, rows, cols, k, c->power, 77, u2, s2, vt2), DQ_OK);
    cr_assert(!memcmp(u, u2, (size_t)rows * k * sizeof *u) && !memcmp(s, s2, k * sizeof *s) &&
                  !memcmp(vt, vt2, (size_t)k * cols * sizeof *vt),
              "deterministic");
    free(a);
    free(eu);
    free(es);
    free(evt);
    free(u);
    free(s);
    free(vt);
    free(u2);
    free(s2);
    free(vt2);
}

Test(kvq_math, rsvd_rank_deficient_and_errors)
{
    /* exactly rank 3, asked for 6: three zero singular values, exact reconstruction */
    float *a = lowrank_noise(100, 40, 3, 0.0, 0x3d), u[600], s[6], vt[240];
    cr_assert_eq(dq_kvq_rsvd(a, 100, 40, 6, 1, 5, u, s, vt), DQ_OK);
    for (int t = 3; t < 6; t++)
        cr_assert_lt(s[t], 1e-4 * s[0], "σ%d = %g", t, s[t]);
    double n = 0;
    for (int i = 0; i < 4000; i++)
        n += (double)a[i] * a[i];
    cr_assert_lt(recon_error(a, 100, 40, u, s, vt, 6), 1e-5 * sqrt(n));
    cr_assert_eq(dq_kvq_rsvd(a, 100, 40, 0, 1, 5, u, s, vt), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_rsvd(a, 100, 40, 41, 1, 5, u, s, vt), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_rsvd(a, 0, 40, 1, 1, 5, u, s, vt), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_rsvd(a, 100, 0, 1, 1, 5, u, s, vt), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_rsvd(a, 100, 40, 2, 1, 5, NULL, s, vt), DQ_INVALID_ARGUMENT);
    a[17] = NAN;
    cr_assert_eq(dq_kvq_rsvd(a, 100, 40, 2, 1, 5, u, s, vt), DQ_NONFINITE);
    free(a);
}

/* ---- Huffman ------------------------------------------------------------------------------------ */

static double kraft(const uint8_t *len, uint32_t n)
{
    double k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (len[i])
            k += ldexp(1.0, -len[i]);
    return k;
}

/* Plain (unbounded) Huffman cost by repeated merging of the two lightest weights: the optimum. */
static uint64_t huffman_cost(const uint64_t *freq, uint32_t n)
{
    uint64_t w[256], cost = 0;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (freq[i])
            w[m++] = freq[i];
    if (m == 1)
        return w[0];
    while (m > 1) {
        uint32_t a = 0, b = 1;
        if (w[b] < w[a])
            a = 1, b = 0;
        for (uint32_t i = 2; i < m; i++) {
            if (w[i] < w[a]) {
                b = a;
                a = i;
            } else if (w[i] < w[b]) {
                b = i;
            }
        }
        const uint64_t s = w[a] + w[b];
        cost += s;
        w[a < b ? a : b] = s;
        w[a < b ? b : a] = w[--m];
    }
    return cost;
}

static double entropy_bits(const uint64_t *freq, uint32_t n)
{
    double t = 0, h = 0;
    for (uint32_t i = 0; i < n; i++)
        t += (double)freq[i];
    for (uint32_t i = 0; i < n; i++)
        if (freq[i])
            h -= (double)freq[i] * log2((double)freq[i] / t);
    return h;
}

Test(kvq_math, huffman_round_trip)
{
    dqt_rng r;
    dqt_rng_seed(&r, 0x4f);
    const size_t nsym = 20000;
    uint8_t *sym = dqt_xmalloc(nsym), *back = dqt_xmalloc(nsym), *buf = dqt_xmalloc(nsym * 3 + 8);
    for (int trial = 0; trial < 40; trial++) {
        const uint32_t count = 2 + dqt_below(&r, 255);
        /* a skewed distribution: geometric-ish weights, some symbols unused */
        double w[256], tw = 0;
        for (uint32_t i = 0; i < count; i++) {
            w[i] = dqt_below(&r, 5) == 0 ? 0 : pow(dqt_uniform(&r), 4.0);
            tw += w[i];
        }
        if (tw == 0)
            w[0] = tw = 1;
        uint64_t freq[256] = {0};
        for (size_t i = 0; i < nsym; i++) {
            double u = dqt_uniform(&r) * tw;
            uint32_t s = 0;
            while (s + 1 < count && (u >= w[s] || w[s] == 0)) {
                u -= w[s];
                s++;
            }
            if (w[s] == 0) /* rounding at the top end: the last used symbol */
                for (s = count - 1; w[s] == 0; s--)
                    ;
            sym[i] = (uint8_t)s;
            freq[s]++;
        }
        uint32_t used = 0;
        for (uint32_t i = 0; i < count; i++)
            used += freq[i] != 0;
        uint32_t min_len = 0;
        while ((1u << min_len) < used)
            min_len++;
        const uint32_t max_len = (min_len < 1 ? 1 : min_len) + dqt_below(&r, 24 - (min_len < 1 ? 1 : min_len) + 1);
        uint8_t len[256];
        uint64_t bits;
        cr_assert_eq(dq_kvq_huffman_lengths(freq, count, max_len, len, &bits), DQ_OK, "max_len %u used %u", max_len,
                     used);
        uint64_t check = 0;
        for (uint32_t i = 0; i < count; i++) {
            cr_assert_leq(len[i], max_len);
            cr_assert_eq(len[i] == 0, freq[i] == 0, "a code exactly for the used symbols");
            check += freq[i] * len[i];
        }
        cr_assert_eq(bits, check);
        cr_assert_leq(kraft(len, count), 1.0);
        const double h = entropy_bits(freq, count);
        cr_assert_geq((double)bits, h - 1e-6);
        if (max_len >= 20) { /* the bound does not bind: optimal, within 1 bit/symbol of the entropy */
            cr_assert_eq(bits, huffman_cost(freq, count), "package-merge = Huffman without a binding bound");
            cr_assert_lt((double)bits, h + nsym);
        }
        size_t nbits;
        cr_assert_eq(dq_kvq_huffman_encode(len, count, sym, nsym, buf, nsym * 3 + 8, &nbits), DQ_OK);
        cr_assert_eq(nbits, bits);
        memset(back, 0xee, nsym);
        cr_assert_eq(dq_kvq_huffman_decode(len, count, buf, nbits, back, nsym), DQ_OK);
        cr_assert_eq(memcmp(sym, back, nsym), 0, "round trip, trial %d", trial);
    }
    free(sym);
    free(back);
    free(buf);
}

/* Fibonacci frequencies make the unbounded Huffman tree a chain (depth n − 1): the bound binds. */
Test(kvq_math, huffman_length_limit_binds)
{
    uint64_t f[30];
    f[0] = f[1] = 1;
    for (int i = 2; i < 30; i++)
        f[i] = f[i - 1] + f[i - 2];
    uint8_t len[30];
    uint64_t bits, prev = UINT64_MAX;
    /* 20 symbols: depth 19 fits under 24, so the result is the unbounded optimum */
    cr_assert_eq(dq_kvq_huffman_lengths(f, 20, 24, len, &bits), DQ_OK);
    cr_assert_eq(bits, huffman_cost(f, 20));
    cr_assert_eq(len[0], 19);
    /* 30 symbols: depth 29 > 24, the bound binds and costs a little */
    cr_assert_eq(dq_kvq_huffman_lengths(f, 30, 24, len, &bits), DQ_OK);
    cr_assert_gt(bits, huffman_cost(f, 30));
    for (uint32_t L = 5; L <= 12; L++) {
        cr_assert_eq(dq_kvq_huffman_lengths(f, 30, L, len, &bits), DQ_OK);
        uint32_t mx = 0;
        for (int i = 0; i < 30; i++)
            mx = len[i] > mx ? len[i] : mx;
        cr_assert_leq(mx, L);
        cr_assert_leq(kraft(len, 30), 1.0);
        cr_assert_geq(bits, huffman_cost(f, 30));
        cr_assert_leq(bits, prev, "a looser bound never costs more");
        prev = bits;
        /* exhaustive check of optimality is out of reach; the flat 5-bit code bounds it */
        uint64_t flat = 0;
        for (int i = 0; i < 30; i++)
            flat += 5 * f[i];
        cr_assert_leq(bits, flat);
    }
    cr_assert_eq(dq_kvq_huffman_lengths(f, 30, 4, len, &bits), DQ_INVALID_ARGUMENT, "30 symbols need 5 bits");
}

/* The seed's §2.2 claim: Lloyd–Max indices at b = 4, d = 128 have entropy 3.816 bits (about 4%
 * below 4 raw bits); a Huffman code gets close to it. */
Test(kvq_math, huffman_lloyd_max_indices)
{
    const uint32_t d = 128, nvec = 4000;
    const float *c, *bd;
    cr_assert_eq(dq_kvq_codebook(4, d, &c, &bd), DQ_OK);
    float x[128];
    uint8_t *idx = dqt_xmalloc((size_t)nvec * d), *back = dqt_xmalloc((size_t)nvec * d);
    uint8_t *buf = dqt_xmalloc((size_t)nvec * d);
    uint64_t freq[16] = {0};
    dqt_rng r;
    dqt_rng_seed(&r, 0x4b);
    for (uint32_t v = 0; v < nvec; v++) {
        unit_vector(&r, x, d);
        for (uint32_t j = 0; j < d; j++) {
            idx[(size_t)v * d + j] = (uint8_t)dq_kvq_bucketize(x[j], bd, 15);
            freq[idx[(size_t)v * d + j]]++;
        }
    }
    const size_t n = (size_t)nvec * d;
    uint8_t len[16];
    uint64_t bits;
    cr_assert_eq(dq_kvq_huffman_lengths(freq, 16, 16, len, &bits), DQ_OK);
    const double h = entropy_bits(freq, 16) / n, b = (double)bits / n;
    fprintf(stderr,
            "kvq Huffman of 4-bit Lloyd–Max indices (d=128): entropy %.3f bits, Huffman %.3f bits/index "
            "(%.1f%% below 4; paper: entropy 3.816, ~4%%)\n",
            h, b, 100 * (1 - b / 4));
    cr_assert(h > 3.7 && h < 3.9, "entropy %g", h);
    cr_assert(b < 4 && b < h + 0.05, "Huffman %g bits vs entropy %g", b, h);
    size_t nbits;
    cr_assert_eq(dq_kvq_huffman_encode(len, 16, idx, n, buf, n, &nbits), DQ_OK);
    cr_assert_eq(nbits, bits);
    cr_assert_eq(dq_kvq_huffman_decode(len, 16, buf, nbits, back, n), DQ_OK);
    cr_assert_eq(memcmp(idx, back, n), 0);
    free(idx);
    free(back);
    free(buf);
}

Test(kvq_math, huffman_corrupt_and_errors)
{
    /* an incomplete code: lengths 1, 2 (Kraft 3/4), codes "0" and "10": "11" is no code */
    const uint8_t inc[2] = {1, 2};
    const uint8_t good[1] = {0x80}; /* "10" = symbol 1 ("0" is symbol 0) */
    uint8_t s[4], out[8];
    cr_assert_eq(dq_kvq_huffman_decode(inc, 2, good, 2, s, 1), DQ_OK);
    cr_assert_eq(s[0], 1);
    const uint8_t bad[1] = {0xc0}; /* "11" */
    cr_assert_eq(dq_kvq_huffman_decode(inc, 2, bad, 2, s, 1), DQ_CORRUPT);
    cr_assert_eq(dq_kvq_huffman_decode(inc, 2, good, 3, s, 1), DQ_CORRUPT, "a bit left over");
    cr_assert_eq(dq_kvq_huffman_decode(inc, 2, good, 1, s, 1), DQ_TRUNCATED);
    cr_assert_eq(dq_kvq_huffman_decode(inc, 2, good, 2, s, 2), DQ_TRUNCATED);
    /* a single used symbol has the code "0"; "1" is corrupt */
    const uint8_t one[3] = {0, 1, 0};
    const uint8_t ones[1] = {0xff};
    cr_assert_eq(dq_kvq_huffman_decode(one, 3, ones, 1, s, 1), DQ_CORRUPT);
    /* bad code tables and symbols */
    const uint8_t over[3] = {1, 1, 1}, big[2] = {25, 1};
    const uint8_t sym[2] = {0, 1};
    size_t nb;
    cr_assert_eq(dq_kvq_huffman_encode(over, 3, sym, 2, out, 8, &nb), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_decode(over, 3, good, 2, s, 1), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_encode(big, 2, sym, 2, out, 8, &nb), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_encode(one, 3, sym, 2, out, 8, &nb), DQ_INVALID_ARGUMENT, "symbol 0 has no code");
    const uint8_t three[1] = {3};
    cr_assert_eq(dq_kvq_huffman_encode(inc, 2, three, 1, out, 8, &nb), DQ_INVALID_ARGUMENT, "symbol out of range");
    cr_assert_eq(dq_kvq_huffman_encode(inc, 2, sym, 2, out, 0, &nb), DQ_INVALID_ARGUMENT, "cap too small");
    cr_assert_eq(dq_kvq_huffman_encode(inc, 2, sym, 2, out, 1, &nb), DQ_OK);
    cr_assert_eq(nb, 3);
    cr_assert_eq(out[0], 0x40, "\"0\" then \"10\": 010 MSB-first");
    /* lengths */
    uint64_t f[3] = {5, 0, 7}, bits;
    uint8_t len[3];
    cr_assert_eq(dq_kvq_huffman_lengths(f, 0, 8, len, &bits), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_lengths(f, 257, 8, len, &bits), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_lengths(f, 3, 0, len, &bits), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_lengths(f, 3, 25, len, &bits), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_huffman_lengths(f, 3, 1, len, &bits), DQ_OK);
    cr_assert(len[0] == 1 && len[1] == 0 && len[2] == 1 && bits == 12);
    const uint64_t single[2] = {0, 9}, none[2] = {0, 0};
    cr_assert_eq(dq_kvq_huffman_lengths(single, 2, 8, len, &bits), DQ_OK);
    cr_assert(len[0] == 0 && len[1] == 1 && bits == 9);
    cr_assert_eq(dq_kvq_huffman_lengths(none, 2, 8, len, &bits), DQ_OK);
    cr_assert(len[0] == 0 && len[1] == 0 && bits == 0);
}

/* ---- attention-weighted bit assignment ---------------------------------------------------------- */

/* 64 tokens, 2 KV heads, 4 query heads (GQA: heads 0, 1 read KV head 0; heads 2, 3 read KV head 1),
 * head_dim 16, keys of small random norm. Tokens 5, 17 and 40 carry a large key along a direction
 * that one query head looks along: they are the most attended, and the only tier-1 tokens at
 * frac_hi = 3/64. Token 40's key sits on KV head 1 and only query head 2 looks for it: GQA's h/2
 * mapping finds it (h % kv_heads would pair head 2 with KV head 0). */
Test(kvq_math, assign_bits_most_attended)
{
    enum { T = 64, KVH = 2, QH = 4, D = 16, NQ = 3 };
    static float k[T * KVH * D], q[NQ * QH * D];
    dqt_rng r;
    dqt_rng_seed(&r, 0xa7);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        k[i] = 0.1f * (float)dqt_normal(&r);
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = 0.1f * (float)dqt_normal(&r);
    /* token 5: KV head 0 along e0, wanted by query head 0 (query 0); token 17: KV head 0 along e1,
     * query head 1 (query 1); token 40: KV head 1 along e2, query head 2 (query 2) */
    static const int tok[3] = {5, 17, 40}, kvh[3] = {0, 0, 1}, qh[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        k[(size_t)tok[i] * KVH * D + (size_t)kvh[i] * D + i] = 6.0f;
        q[(size_t)i * QH * D + (size_t)qh[i] * D + i] = 6.0f;
    }
    uint8_t tier[T];
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 3.0f / T, tier), DQ_OK);
    for (int t = 0; t < T; t++)
        cr_assert_eq(tier[t], t == 5 || t == 17 || t == 40, "token %d tier %u", t, tier[t]);
    /* frac 0: none; frac 1: all */
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 0.0f, tier), DQ_OK);
    for (int t = 0; t < T; t++)
        cr_assert_eq(tier[t], 0);
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 1.0f, tier), DQ_OK);
    for (int t = 0; t < T; t++)
        cr_assert_eq(tier[t], 1);
}

/* The count of tier-1 tokens is exactly round(frac · tokens), and the tiers split the tokens by
 * importance: every tier-1 token is attended at least as much as every tier-0 one. */
Test(kvq_math, assign_bits_fraction_exact)
{
    enum { KVH = 2, QH = 8, D = 32, NQ = 4 };
    const size_t T = 203;
    float *k = dqt_xmalloc(T * KVH * D * sizeof *k), *q = dqt_xmalloc(NQ * QH * D * sizeof *q);
    dqt_rng r;
    dqt_rng_seed(&r, 0xf4);
    for (size_t i = 0; i < T * KVH * D; i++)
        k[i] = (float)dqt_normal(&r);
    for (size_t i = 0; i < NQ * QH * D; i++)
        q[i] = (float)dqt_normal(&r);
    /* reference importance */
    double *imp = dqt_xmalloc(T * sizeof *imp), *lg = dqt_xmalloc(T * sizeof *lg);
    for (size_t t = 0; t < T; t++)
        imp[t] = 0;
    for (int iq = 0; iq < NQ; iq++)
        for (int h = 0; h < QH; h++) {
            double mx = -1e300, sum = 0;
            for (size_t t = 0; t < T; t++) {
                double s = 0;
                for (int j = 0; j < D; j++)
                    s += (double)q[(iq * QH + h) * D + j] * k[(t * KVH + h / (QH / KVH)) * D + j];
                lg[t] = s / sqrt((double)D);
                mx = fmax(mx, lg[t]);
            }
            for (size_t t = 0; t < T; t++)
                sum += (lg[t] = exp(lg[t] - mx));
            for (size_t t = 0; t < T; t++)
                imp[t] = fmax(imp[t], lg[t] / sum);
        }
    static const float fracs[] = {0.1f, 0.25f, 0.5f, 0.013f, 0.9f};
    uint8_t *tier = dqt_xmalloc(T);
    for (int f = 0; f < 5; f++) {
        cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, fracs[f], tier), DQ_OK);
        size_t n = 0;
        double lo1 = 1e300, hi0 = -1;
        for (size_t t = 0; t < T; t++) {
            n += tier[t];
            if (tier[t])
                lo1 = fmin(lo1, imp[t]);
            else
                hi0 = fmax(hi0, imp[t]);
        }
        cr_assert_eq(n, (size_t)floor(fracs[f] * (double)T + 0.5), "frac %g: %zu tier-1 tokens", fracs[f], n);
        cr_assert_geq(lo1, hi0 - 1e-12, "frac %g: tier 1 is the most attended", fracs[f]);
    }
    /* errors */
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, 7, NQ, 0.5f, tier), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 1.5f, tier), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, NAN, tier), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_assign_bits(k, 0, KVH, D, q, QH, NQ, 0.5f, tier), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, 0, q, QH, NQ, 0.5f, tier), DQ_INVALID_ARGUMENT);
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, 0, 0.5f, tier), DQ_INVALID_ARGUMENT);
    k[77] = INFINITY;
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 0.5f, tier), DQ_NONFINITE);
    k[77] = 0;
    q[5] = NAN;
    cr_assert_eq(dq_kvq_assign_bits(k, T, KVH, D, q, QH, NQ, 0.5f, tier), DQ_NONFINITE);
    free(k);
    free(q);
    free(imp);
    free(lg);
    free(tier);
}
