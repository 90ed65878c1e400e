/* The calibration-free probability model (DESIGN §2.2, seed §4.2).
 *
 * After rotation a stream is close to n iid N(0,1) draws X_1..X_n, and its grid is the min–max
 * grid with M levels: a = min X, b = max X, s = (b - a)/(M - 1), level m reconstructing a + s·m.
 * The probability that a value of the stream lands on level m is, exactly,
 *
 *   p_m = E_{a,b}[ (1/n)(1{m = 0} + 1{m = M-1}) + ((n-2)/n) · P(m | a, b) ]
 *
 * because the two extremes sit in the end levels by construction, and given (a, b) the n - 2
 * interior draws are iid normals truncated to [a, b]:
 *
 *   P(m | a, b) = (Φ(e_{m+1}) - Φ(e_m)) / (Φ(b) - Φ(a)),  e_m = a + s·(m - 1/2) clipped to [a, b]
 *
 * (nearest-level rounding). The expectation is over the joint density of the order statistics
 *
 *   f(a, b) = n(n-1) φ(a) φ(b) (Φ(b) - Φ(a))^(n-2),   a < b,
 *
 * computed by quadrature on a grid restricted to where the extremes' densities are within e^-36 of
 * their peak. Affine invariance of the normalized positions makes the table shared by every token
 * and layer: no calibration data. The table is then sharpened, p'_m ∝ p_m^alpha (drift moves values
 * toward cheap central symbols), and quantized to integers f_m >= 1 summing to 256. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/profile.h"

/* Upper tail Q(x) = 1 - Φ(x), accurate in both tails. */
static double q_tail(double x)
{
    return 0.5 * erfc(x * M_SQRT1_2);
}

/* Φ(x1) - Φ(x0) for x0 <= x1 without cancellation in the tails. */
static double cdf_diff(double x0, double x1)
{
    if (x0 >= 0)
        return q_tail(x0) - q_tail(x1);
    if (x1 <= 0)
        return q_tail(-x1) - q_tail(-x0);
    return 1.0 - q_tail(x1) - q_tail(-x0);
}

static double log_phi(double x)
{
    return -0.5 * x * x - 0.91893853320467274178; /* log(1/sqrt(2π)) */
}

/* log Φ(x) */
static double log_cdf(double x)
{
    return x < 0 ? log(q_tail(-x)) : log1p(-q_tail(x));
}

int dq_model_probabilities(uint32_t n, uint32_t levels, double *p)
{
    DQ_RETURN_IF(!p || levels < DQ_MIN_LEVELS || levels > DQ_MAX_LEVELS || n < 1 || n > DQ_MAX_STREAM,
                 DQ_INVALID_ARGUMENT);
    const uint32_t M = levels;
    if (n == 1) {
        for (uint32_t m = 0; m < M; m++)
            p[m] = 1.0 / M;
        return DQ_OK;
    }
    memset(p, 0, sizeof(double) * M);
    if (n == 2) {
        p[0] = p[M - 1] = 0.5;
        return DQ_OK;
    }

    /* Range of the maximum: where log f_max(b) is within 36 of its peak. */
    const double lim = 9.0, h0 = 0.001;
    double peak = -INFINITY, lo_b = lim, hi_b = -lim;
    for (double b = -lim; b <= lim; b += h0) {
        double g = log_phi(b) + (n - 1.0) * log_cdf(b);
        if (g > peak)
            peak = g;
    }
    for (double b = -lim; b <= lim; b += h0) {
        double g = log_phi(b) + (n - 1.0) * log_cdf(b);
        if (g > peak - 36.0) {
            if (b < lo_b)
                lo_b = b;
            if (b > hi_b)
                hi_b = b;
        }
    }
    const int steps = 240;
    double h = (hi_b - lo_b) / steps;
    DQ_RETURN_IF(h <= 0, DQ_INTERNAL);

    double acc[DQ_MAX_LEVELS] = {0};
    double wsum = 0;
    const double lognn = log((double)n) + log((double)n - 1.0);
    for (int ia = 0; ia <= steps; ia++) {
        double a = -(lo_b + ia * h); /* the minimum mirrors the maximum */
        for (int ib = 0; ib <= steps; ib++) {
            double b = lo_b + ib * h;
            if (b <= a)
                continue;
            double mass = cdf_diff(a, b);
            if (mass <= 0)
                continue;
            double lw = lognn + log_phi(a) + log_phi(b) + (n - 2.0) * log(mass);
            double w = exp(lw - lognn); /* <= 1; the weights are renormalized below */
            if (!(w > 0))
                continue;
            wsum += w;
            double s = (b - a) / (M - 1);
            double prev = a;
            for (uint32_t m = 0; m < M; m++) {
                double e = m + 1 < M ? a + s * (m + 0.5) : b;
                acc[m] += w * cdf_diff(prev, e) / mass;
                prev = e;
            }
        }
    }
    DQ_RETURN_IF(!(wsum > 0), DQ_INTERNAL);
    const double interior = (n - 2.0) / n;
    for (uint32_t m = 0; m < M; m++)
        p[m] = interior * acc[m] / wsum;
    p[0] += 1.0 / n;
    p[M - 1] += 1.0 / n;
    /* Exact symmetry (the model is symmetric; quadrature noise is not) and normalization. */
    double tot = 0;
    for (uint32_t m = 0; m < M / 2; m++) {
        double v = 0.5 * (p[m] + p[M - 1 - m]);
        p[m] = p[M - 1 - m] = v;
    }
    for (uint32_t m = 0; m < M; m++)
        tot += p[m];
    for (uint32_t m = 0; m < M; m++)
        p[m] /= tot;
    return DQ_OK;
}

int dq_model_freq_table(uint32_t n, uint32_t levels, float alpha, uint16_t *freq)
{
    DQ_RETURN_IF(!freq || !(alpha > 0) || !(alpha < 16), DQ_INVALID_ARGUMENT);
    double p[DQ_MAX_LEVELS];
    DQ_FORWARD_IF_ERROR(dq_model_probabilities(n, levels, p));
    const uint32_t M = levels;
    double tot = 0;
    for (uint32_t m = 0; m < M; m++) {
        p[m] = pow(p[m] > 1e-300 ? p[m] : 1e-300, (double)alpha);
        tot += p[m];
    }
    int sum = 0;
    int f[DQ_MAX_LEVELS];
    for (uint32_t m = 0; m < M; m++) {
        p[m] /= tot;
        f[m] = (int)lround(256.0 * p[m]);
        if (f[m] < 1)
            f[m] = 1;
        sum += f[m];
    }
    /* Fix the sum greedily by the smallest change in expected code length. */
    while (sum > 256) {
        int best = -1;
        double best_loss = INFINITY;
        for (uint32_t m = 0; m < M; m++) {
            if (f[m] <= 1)
                continue;
            double loss = p[m] * log2((double)f[m] / (f[m] - 1));
            if (loss < best_loss) {
                best_loss = loss;
                best = (int)m;
            }
        }
        assert(best >= 0); /* were every f[m] <= 1, sum would be <= M <= 32 */
        f[best]--;
        sum--;
    }
    while (sum < 256) {
        int best = 0;
        double best_gain = -INFINITY;
        for (uint32_t m = 0; m < M; m++) {
            double gain = p[m] * log2((double)(f[m] + 1) / f[m]);
            if (gain > best_gain) {
                best_gain = gain;
                best = (int)m;
            }
        }
        f[best]++;
        sum++;
    }
    for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++)
        freq[m] = m < M ? (uint16_t)f[m] : 0;
    return DQ_OK;
}

/* -log2(f / 256) in Q16 with an integer-only log2 (bit-by-bit squaring), so every machine and the
 * GPU derive the same costs from the same table. */
int32_t dq__log2_q16(uint32_t f)
{
    uint32_t ip = 31 - (uint32_t)__builtin_clz(f);
    uint64_t y = (uint64_t)f << (30 - ip); /* f / 2^ip in [1, 2), Q30 */
    uint32_t frac = 0;
    for (int i = 0; i < 17; i++) {
        y = (y * y) >> 30;
        frac <<= 1;
        if (y >= (2ull << 30)) {
            y >>= 1;
            frac |= 1;
        }
    }
    return (int32_t)((ip << 16) + ((frac + 1) >> 1)); /* round the 17th bit */
}

int32_t dq__cost_q16(uint32_t f)
{
    if (f == 0 || f > 256)
        return INT32_MAX;
    return (int32_t)(8u << 16) - dq__log2_q16(f);
}

int32_t dq__cost12_q16(uint32_t f)
{
    if (f == 0 || f > 4096)
        return INT32_MAX;
    return (int32_t)(12u << 16) - dq__log2_q16(f);
}
