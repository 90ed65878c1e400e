/* The per-head randomized Hadamard rotation (DESIGN §2.1): orthonormal, exactly the Walsh–Hadamard
 * matrix times a ±1 diagonal over sqrt(head_dim), per head, inverted by dq_unrotate; and the raw
 * fast transform dq__fwht. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dqtest_util.h"

static dqt_rng rng;

static void suite_init(void)
{
    dqt_rng_seed(&rng, 0x4ada4a5du);
}

static void suite_fini(void)
{
}

TestSuite(hadamard, .init = suite_init, .fini = suite_fini);

struct rot_param {
    uint32_t kv_heads, head_dim;
    uint64_t seed;
};

ParameterizedTestParameters(hadamard, rotation)
{
    static struct rot_param p[] = {
        {8, 128, 0x5eed}, {8, 128, 0}, {2, 128, 0x5eed}, {1, 2, 0x5eed}, {1, 4, 7},
        {1, 16, 0},       {4, 16, 99}, {3, 64, 0x5eed},  {1, 1, 0x5eed}, {2, 256, 12345},
    };
    return cr_make_param_array(struct rot_param, p, sizeof p / sizeof p[0]);
}

static dq_codec *rot_codec(const struct rot_param *rp)
{
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = rp->kv_heads;
    pp.head_dim = rp->head_dim;
    pp.rotation_seed = rp->seed;
    uint32_t n = rp->kv_heads * rp->head_dim;
    pp.container_bytes[0] = pp.container_bytes[1] = 4 + n + 4;
    return dqt_codec_make(&pp);
}

static double dot(const float *a, const float *b, uint32_t n)
{
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* H[i][j] = (−1)^popcount(i & j), natural (Sylvester) order. */
static int hsign(uint32_t i, uint32_t j)
{
    return (__builtin_popcount(i & j) & 1) ? -1 : 1;
}

ParameterizedTest(struct rot_param *rp, hadamard, rotation)
{
    dq_codec *codec = rot_codec(rp);
    const uint32_t n = dq_codec_stream_len(codec), d = rp->head_dim;
    float *x = dqt_xmalloc(n * sizeof *x), *y = dqt_xmalloc(n * sizeof *y);
    float *rx = dqt_xmalloc(n * sizeof *rx), *ry = dqt_xmalloc(n * sizeof *ry);

    /* Norms and dot products are preserved; unrotate inverts. */
    for (int trial = 0; trial < 200; trial++) {
        double sc = pow(10.0, -3.0 + 6.0 * dqt_uniform(&rng));
        for (uint32_t i = 0; i < n; i++) {
            x[i] = (float)(sc * dqt_normal(&rng) + (trial & 1 ? sc : 0.0));
            y[i] = (float)(sc * dqt_normal(&rng));
        }
        memcpy(rx, x, n * sizeof *x);
        memcpy(ry, y, n * sizeof *y);
        dq_rotate(codec, rx);
        dq_rotate(codec, ry);
        double nx = sqrt(dot(x, x, n)), ny = sqrt(dot(y, y, n));
        double nrx = sqrt(dot(rx, rx, n));
        cr_assert(fabs(nrx - nx) <= 1e-5 * nx, "n=%u: |Rx| = %.9g, |x| = %.9g", n, nrx, nx);
        double dxy = dot(x, y, n), drxy = dot(rx, ry, n);
        cr_assert(fabs(drxy - dxy) <= 1e-5 * nx * ny, "n=%u: Rx·Ry = %.9g, x·y = %.9g", n, drxy, dxy);

        dq_unrotate(codec, rx);
        double amax = 0;
        for (uint32_t i = 0; i < n; i++)
            amax = fmax(amax, fabs(x[i]));
        for (uint32_t i = 0; i < n; i++)
            cr_assert(fabs((double)rx[i] - x[i]) <= 1e-6 * amax, "n=%u: unrotate(rotate(x))[%u] = %.9g, x = %.9g", n, i,
                      (double)rx[i], (double)x[i]);
    }

    /* Basis vectors: rotate(e_i) = ±H[:, i mod d] / sqrt(d) inside e_i's head, zero elsewhere
     * (with seed 0, D = I: exactly +H[:, i]). The columns are therefore orthonormal. */
    const float inv = 1.0f / sqrtf((float)d);
    float *cols = dqt_xmalloc((size_t)d * d * sizeof *cols);
    for (uint32_t h = 0; h < rp->kv_heads; h++) {
        for (uint32_t c = 0; c < d; c++) {
            float *e = cols + (size_t)c * d;
            memset(x, 0, n * sizeof *x);
            x[h * d + c] = 1.0f;
            dq_rotate(codec, x);
            for (uint32_t i = 0; i < n; i++)
                if (i / d != h)
                    cr_assert_eq(x[i], 0.0f, "rotation leaks from head %u into channel %u", h, i);
            memcpy(e, x + h * d, d * sizeof *e);
            float sgn = e[0] >= 0 ? 1.0f : -1.0f;
            if (rp->seed == 0)
                cr_assert_eq(sgn, 1.0f, "seed 0 must not flip signs (head %u, column %u)", h, c);
            for (uint32_t r = 0; r < d; r++)
                cr_assert(fabsf(e[r] - sgn * (float)hsign(r, c) * inv) <= 1e-6f,
                          "head %u column %u row %u: %.9g, expected %.9g", h, c, r, (double)e[r],
                          (double)(sgn * (float)hsign(r, c) * inv));
        }
        for (uint32_t a = 0; a < d; a++)
            for (uint32_t b = a; b < d; b++) {
                double g = dot(cols + (size_t)a * d, cols + (size_t)b * d, d);
                cr_assert(fabs(g - (a == b ? 1.0 : 0.0)) <= 1e-5, "head %u: column %u · column %u = %.9g", h, a, b, g);
            }
    }
    free(cols);
    free(x);
    free(y);
    free(rx);
    free(ry);
    dq_codec_free(codec);
}

/* Two codecs with the same seed rotate identically; different seeds give different signs but the
 * same norms. */
Test(hadamard, seed_determines_signs)
{
    dq_codec *a = rot_codec(&(struct rot_param){8, 128, 0x5eed});
    dq_codec *b = rot_codec(&(struct rot_param){8, 128, 0x5eed});
    dq_codec *c = rot_codec(&(struct rot_param){8, 128, 0x5eee});
    const uint32_t n = 1024;
    float *x = dqt_xmalloc(n * sizeof *x), *ya = dqt_xmalloc(n * sizeof *ya), *yb = dqt_xmalloc(n * sizeof *yb),
          *yc = dqt_xmalloc(n * sizeof *yc);
    for (uint32_t i = 0; i < n; i++)
        x[i] = (float)dqt_normal(&rng);
    memcpy(ya, x, n * sizeof *x);
    memcpy(yb, x, n * sizeof *x);
    memcpy(yc, x, n * sizeof *x);
    dq_rotate(a, ya);
    dq_rotate(b, yb);
    dq_rotate(c, yc);
    cr_assert(memcmp(ya, yb, n * sizeof *ya) == 0, "same seed, different rotation");
    cr_assert(memcmp(ya, yc, n * sizeof *ya) != 0, "different seeds, identical rotation");
    free(x);
    free(ya);
    free(yb);
    free(yc);
    dq_codec_free(a);
    dq_codec_free(b);
    dq_codec_free(c);
}

/* dq__fwht is the unnormalized transform: applied twice it multiplies by len. */
Test(hadamard, fwht_involution)
{
    for (uint32_t len = 1; len <= 65536; len <<= 1) {
        float *x = dqt_xmalloc(len * sizeof *x), *y = dqt_xmalloc(len * sizeof *y);
        /* Small integers: every intermediate is an exact float (|values| <= len^2 <= 2^24 up to 4096). */
        if (len <= 4096) {
            for (uint32_t i = 0; i < len; i++)
                x[i] = (float)((int)dqt_below(&rng, 3) - 1);
            memcpy(y, x, len * sizeof *x);
            dq__fwht(y, len);
            if (len <= 256) /* against the matrix definition */
                for (uint32_t r = 0; r < len; r++) {
                    float want = 0;
                    for (uint32_t c = 0; c < len; c++)
                        want += (float)hsign(r, c) * x[c];
                    cr_assert_eq(y[r], want, "fwht len %u row %u: %g, expected %g", len, r, (double)y[r], (double)want);
                }
            dq__fwht(y, len);
            for (uint32_t i = 0; i < len; i++)
                cr_assert_eq(y[i], (float)len * x[i], "len %u: fwht(fwht(x))[%u] = %g, expected %g", len, i,
                             (double)y[i], (double)((float)len * x[i]));
        }
        /* Random floats: within float rounding of len·x. */
        double amax = 0;
        for (uint32_t i = 0; i < len; i++) {
            x[i] = (float)dqt_normal(&rng);
            amax = fmax(amax, fabs(x[i]));
        }
        memcpy(y, x, len * sizeof *x);
        dq__fwht(y, len);
        dq__fwht(y, len);
        double tol = 1e-6 * len * amax * (1 + log2((double)len));
        for (uint32_t i = 0; i < len; i++)
            cr_assert(fabs((double)y[i] - (double)len * x[i]) <= tol, "len %u: fwht(fwht(x))[%u] = %.9g vs %.9g", len,
                      i, (double)y[i], (double)len * x[i]);
        free(x);
        free(y);
    }
}
