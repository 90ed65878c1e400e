/* The analytic probability model and its integer tables (DESIGN §2.2): tables sum to 256 with
 * f >= 1, probabilities sum to one and are symmetric, sharpening favours the centre, the tables
 * follow the sharpened model, and the model matches the measured symbol distribution of Gaussian
 * streams on a min–max grid. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x30de1u);
}

static void suite_fini(void)
{
}

TestSuite(model, .init = suite_init, .fini = suite_fini);

static const uint32_t stream_lens[] = {2, 3, 16, 64, 256, 1024, 4096};
static const float alphas[] = {1.0f, 1.4f, 2.0f};

struct levels_param {
    uint32_t levels;
};

ParameterizedTestParameters(model, tables)
{
    static struct levels_param p[DQ_MAX_LEVELS - DQ_MIN_LEVELS + 1];
    for (uint32_t m = DQ_MIN_LEVELS; m <= DQ_MAX_LEVELS; m++)
        p[m - DQ_MIN_LEVELS].levels = m;
    return cr_make_param_array(struct levels_param, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(struct levels_param *param, model, tables)
{
    const uint32_t M = param->levels;
    for (size_t ni = 0; ni < sizeof stream_lens / sizeof stream_lens[0]; ni++) {
        const uint32_t n = stream_lens[ni];
        double p[DQ_MAX_LEVELS];
        cr_assert_eq(dq_model_probabilities(n, M, p), DQ_OK, "probabilities(n=%u, M=%u)", n, M);
        double sum = 0;
        for (uint32_t m = 0; m < M; m++) {
            cr_assert(p[m] >= 0 && p[m] <= 1, "n=%u M=%u: p[%u] = %g", n, M, m, p[m]);
            sum += p[m];
        }
        cr_assert(fabs(sum - 1.0) <= 1e-9, "n=%u M=%u: probabilities sum to %.12f", n, M, sum);
        for (uint32_t m = 0; m < M; m++)
            cr_assert(fabs(p[m] - p[M - 1 - m]) <= 1e-9, "n=%u M=%u: p[%u]=%.12f but p[%u]=%.12f", n, M, m, p[m],
                      M - 1 - m, p[M - 1 - m]);
        /* The two extremes always sit in the end levels. */
        cr_assert(p[0] >= 1.0 / n - 1e-12, "n=%u M=%u: p[0] = %g < 1/n", n, M, p[0]);

        uint32_t c1 = (M - 1) / 2, c2 = M / 2;
        int centre_is_mode = 1;
        for (uint32_t m = 0; m < M; m++)
            if (p[m] > p[c1] + 1e-12)
                centre_is_mode = 0;

        uint16_t f1[DQ_MAX_LEVELS];
        for (size_t ai = 0; ai < sizeof alphas / sizeof alphas[0]; ai++) {
            const float alpha = alphas[ai];
            uint16_t f[DQ_MAX_LEVELS], again[DQ_MAX_LEVELS];
            cr_assert_eq(dq_model_freq_table(n, M, alpha, f), DQ_OK, "freq_table(n=%u, M=%u, alpha=%g)", n, M,
                         (double)alpha);
            if (n == 1024) {
                cr_assert_eq(dq_model_freq_table(n, M, alpha, again), DQ_OK);
                cr_assert(memcmp(f, again, M * sizeof f[0]) == 0, "n=%u M=%u: table not deterministic", n, M);
            }
            uint32_t fsum = 0;
            for (uint32_t m = 0; m < M; m++) {
                cr_assert(f[m] >= 1, "n=%u M=%u alpha=%g: f[%u] = 0", n, M, (double)alpha, m);
                fsum += f[m];
            }
            cr_assert_eq(fsum, 256, "n=%u M=%u alpha=%g: table sums to %u", n, M, (double)alpha, fsum);
            for (uint32_t m = 0; m < M; m++)
                cr_assert(abs((int)f[m] - (int)f[M - 1 - m]) <= 1, "n=%u M=%u alpha=%g: f[%u]=%u vs f[%u]=%u", n, M,
                          (double)alpha, m, f[m], M - 1 - m, f[M - 1 - m]);

            /* The table follows the sharpened model p^alpha / Σ p^alpha (L1 distance within the
             * rounding of M entries plus the minimum-one corrections). */
            double ps[DQ_MAX_LEVELS], z = 0, l1 = 0;
            for (uint32_t m = 0; m < M; m++)
                z += ps[m] = pow(p[m], alpha);
            uint32_t forced = 0; /* entries raised to the minimum f = 1, paid for by the others */
            for (uint32_t m = 0; m < M; m++) {
                l1 += fabs(f[m] / 256.0 - ps[m] / z);
                forced += 256.0 * ps[m] / z < 1.0;
            }
            cr_assert(l1 <= (M + 2.0 * forced + 1.0) / 256.0,
                      "n=%u M=%u alpha=%g: table is %.4f (L1) from the sharpened model (%u forced to 1)", n, M,
                      (double)alpha, l1, forced);

            if (ai == 0) {
                memcpy(f1, f, sizeof f1);
            } else if (centre_is_mode) {
                cr_assert_geq(f[c1], f1[c1], "n=%u M=%u alpha=%g: centre f %u < %u at alpha 1", n, M, (double)alpha,
                              f[c1], f1[c1]);
                cr_assert_geq(f[c2], f1[c2], "n=%u M=%u alpha=%g: centre f %u < %u at alpha 1", n, M, (double)alpha,
                              f[c2], f1[c2]);
                /* Real-valued sharpening concentrates mass at the mode. */
                cr_assert(ps[c1] / z >= p[c1] - 1e-12, "n=%u M=%u: sharpened centre mass fell", n, M);
            }
        }
    }
}

Test(model, profile_tables_are_model_tables)
{
    static const char *names[] = {"dq226", "dq196"};
    static const uint32_t shapes[][2] = {{8, 128}, {2, 128}, {1, 16}, {4, 64}};
    for (int i = 0; i < 2; i++) {
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            dq_profile p;
            cr_assert_eq(dq_profile_builtin(names[i], shapes[s][0], shapes[s][1], &p), DQ_OK);
            uint32_t n = shapes[s][0] * shapes[s][1];
            for (int k = 0; k < 2; k++) {
                uint16_t f[DQ_MAX_LEVELS];
                cr_assert_eq(dq_model_freq_table(n, p.levels[k], p.alpha, f), DQ_OK);
                cr_assert(memcmp(f, p.freq[k], p.levels[k] * sizeof f[0]) == 0,
                          "%s n=%u kind %d: profile table is not dq_model_freq_table(n, M, alpha)", names[i], n, k);
                for (uint32_t m = p.levels[k]; m < DQ_MAX_LEVELS; m++)
                    cr_assert_eq(p.freq[k][m], 0, "%s: freq[%d][%u] past the levels is %u", names[i], k, m,
                                 p.freq[k][m]);
            }
        }
    }
}

Test(model, invalid_arguments)
{
    double p[DQ_MAX_LEVELS + 1];
    uint16_t f[DQ_MAX_LEVELS + 1];
    cr_assert_lt(dq_model_probabilities(1024, 1, p), 0, "M = 1 accepted");
    cr_assert_lt(dq_model_probabilities(1024, 33, p), 0, "M = 33 accepted");
    cr_assert_lt(dq_model_probabilities(0, 8, p), 0, "n = 0 accepted");
    cr_assert_lt(dq_model_freq_table(1024, 1, 1.4f, f), 0, "M = 1 accepted");
    cr_assert_lt(dq_model_freq_table(1024, 33, 1.4f, f), 0, "M = 33 accepted");
    cr_assert_lt(dq_model_freq_table(1024, 8, NAN, f), 0, "alpha NaN accepted");
    cr_assert_lt(dq_model_freq_table(1024, 8, INFINITY, f), 0, "alpha inf accepted");
}

/* The analytic model against the measured histogram of Gaussian streams quantized to the nearest
 * level of their own min–max grid (seed §3.2: the "normal gap" is tiny). */
struct mc_param {
    uint32_t n, levels, streams;
};

ParameterizedTestParameters(model, matches_measured_distribution)
{
    static struct mc_param p[] = {
        {64, 6, 20000}, {64, 8, 20000}, {256, 6, 6000}, {256, 8, 6000}, {1024, 6, 2000}, {1024, 8, 2000},
    };
    return cr_make_param_array(struct mc_param, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(struct mc_param *param, model, matches_measured_distribution)
{
    const uint32_t n = param->n, M = param->levels;
    double p[DQ_MAX_LEVELS];
    cr_assert_eq(dq_model_probabilities(n, M, p), DQ_OK);
    double *x = dqt_xmalloc(n * sizeof *x);
    double hist[DQ_MAX_LEVELS] = {0};
    for (uint32_t s = 0; s < param->streams; s++) {
        double lo = INFINITY, hi = -INFINITY;
        for (uint32_t i = 0; i < n; i++) {
            x[i] = dqt_normal(&rng);
            lo = fmin(lo, x[i]);
            hi = fmax(hi, x[i]);
        }
        double step = (hi - lo) / (M - 1);
        for (uint32_t i = 0; i < n; i++) {
            long m = lround((x[i] - lo) / step);
            if (m < 0)
                m = 0;
            if (m > (long)M - 1)
                m = M - 1;
            hist[m] += 1;
        }
    }
    double total = (double)n * param->streams, gap = 0, maxdiff = 0;
    for (uint32_t m = 0; m < M; m++) {
        double q = hist[m] / total;
        if (q > 0)
            gap += q * (log2(q) - log2(p[m]));
        maxdiff = fmax(maxdiff, fabs(q - p[m]));
    }
    fprintf(stderr, "model n=%u M=%u: normal gap %.5f bits/value, max |p - measured| %.5f\n", n, M, gap, maxdiff);
    cr_assert(gap < 0.002, "n=%u M=%u: model costs %.4f bits/value more than the measured distribution", n, M, gap);
    cr_assert(maxdiff < 0.006, "n=%u M=%u: a level's probability is off by %.4f", n, M, maxdiff);
    free(x);
}
