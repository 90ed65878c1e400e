/* KVQ toolbox, scalar part (dquant/kvq.h section 1): the seeded generator, Lloyd–Max codebooks on
 * the coordinate marginal of a random unit vector, nearest-centroid search, the randomized
 * Hadamard rotation, QJL sketches, k-means++ and attention-weighted bit assignment. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_internal.h"

/* ---- generator ------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void dq__kvq_rng_seed(dq__kvq_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
    r->has_spare = 0;
    r->spare = 0;
}

uint64_t dq__kvq_rng_next(dq__kvq_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return out;
}

double dq__kvq_rng_uniform(dq__kvq_rng *r)
{
    return (double)(dq__kvq_rng_next(r) >> 11) * 0x1p-53;
}

double dq__kvq_rng_normal(dq__kvq_rng *r)
{
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    const double u1 = 1.0 - dq__kvq_rng_uniform(r); /* (0, 1]: log is finite */
    const double u2 = dq__kvq_rng_uniform(r);
    const double rad = sqrt(-2.0 * log(u1)), ang = 2.0 * M_PI * u2;
    r->spare = rad * sin(ang);
    r->has_spare = 1;
    return rad * cos(ang);
}

/* ---- nearest centroid -------------------------------------------------------------------------- */

/* Exact sign of |x − a| − |x − b| for doubles (no overflow): the rounded differences order the
 * exact ones weakly (rounding is monotone); a tie is settled by TwoSum's exact rounding errors. */
static int cmp_dist(double x, double a, double b)
{
    const double s1 = x - a, s2 = x - b;
    const double a1 = fabs(s1), a2 = fabs(s2);
    if (a1 != a2)
        return a1 < a2 ? -1 : 1;
    const double v1 = s1 - x, e1 = (x - (s1 - v1)) + (-a - v1);
    const double v2 = s2 - x, e2 = (x - (s2 - v2)) + (-b - v2);
    /* |s + e| = |s| + sign(s)·e when s != 0; s == 0 means the difference was exactly 0 */
    const double r1 = s1 > 0 ? e1 : s1 < 0 ? -e1 : 0, r2 = s2 > 0 ? e2 : s2 < 0 ? -e2 : 0;
    return r1 < r2 ? -1 : r1 > r2;
}

void dq__kvq_boundaries(const float *c, uint32_t k, float *boundaries)
{
    for (uint32_t i = 0; i + 1 < k; i++) {
        const double lo = c[i], hi = c[i + 1];
        float b = (float)(0.5 * (lo + hi));
        /* largest float not strictly closer to hi than to lo */
        while (b > c[i] && cmp_dist(b, hi, lo) < 0)
            b = nextafterf(b, -INFINITY);
        for (;;) {
            const float up = nextafterf(b, INFINITY);
            if (up >= c[i + 1] || cmp_dist(up, hi, lo) < 0)
                break;
            b = up;
        }
        boundaries[i] = b;
    }
}

uint32_t dq_kvq_bucketize(float x, const float *boundaries, uint32_t count)
{
    /* the number of boundaries < x, branch-free (the answer stays in [base, base + n]); NaN compares
     * false everywhere and lands in 0 */
    if (count == 0)
        return 0;
    const float *base = boundaries;
    uint32_t n = count;
    while (n > 1) {
        const uint32_t half = n >> 1;
        base = base[half] < x ? base + half : base;
        n -= half;
    }
    return (uint32_t)(base - boundaries) + (base[0] < x);
}

uint32_t dq_kvq_nearest_argmin(float x, const float *centroids, uint32_t count)
{
    if (count == 0 || isnan(x))
        return 0;
    if (isinf(x))
        return x > 0 ? count - 1 : 0;
    const double xd = x;
    uint32_t best = 0;
    double bestd = fabs(xd - centroids[0]);
    for (uint32_t i = 1; i < count; i++) {
        const double d = fabs(xd - centroids[i]);
        if (d < bestd || (d == bestd && cmp_dist(xd, centroids[i], centroids[best]) < 0)) {
            best = i;
            bestd = d;
        }
    }
    return best;
}

/* ---- the coordinate marginal and its Lloyd–Max codebooks ----------------------------------------- */

/* With t = sin θ the density (1 − t²)^((dim−3)/2) dt becomes cos^(dim−2) θ dθ on [−π/2, π/2]: smooth
 * for every dim >= 2 (dim = 2, singular at t = ±1 in t, is uniform in θ). Integrals are composite
 * Gauss–Legendre over PANELS equal panels of [−Θ, Θ], Θ where cos^n falls below e^−92 (the mass
 * beyond is < 1e−40 of the total); pieces of a cell are integrated on their own sub-intervals. */
#define PANELS 256
#define GL_N 8

static const double gl_x[GL_N] = {-0.9602898564975363, -0.7966664774136267, -0.5255324099163290, -0.1834346424956498,
                                  0.1834346424956498,  0.5255324099163290,  0.7966664774136267,  0.9602898564975363};
static const double gl_w[GL_N] = {0.1012285362903763, 0.2223810344533745, 0.3137066959229770, 0.3626837833783620,
                                  0.3626837833783620, 0.3137066959229770, 0.2223810344533745, 0.1012285362903763};

typedef struct marginal {
    double n;          /* exponent of cos θ: dim − 2 */
    double theta_max;  /* Θ */
    double h;          /* panel width */
    double m0[PANELS]; /* ∫ cos^n over each panel */
    double m1[PANELS]; /* ∫ sin·cos^n */
    double m2[PANELS]; /* ∫ sin²·cos^n */
} marginal;

static inline double weight(const marginal *q, double th)
{
    return q->n == 0 ? 1.0 : pow(cos(th), q->n);
}

/* Moments ∫ (sin θ − c)^j cos^n θ dθ, j = 0, 1, 2, over [a, b] by one Gauss–Legendre rule. */
static void gl_piece(const marginal *q, double a, double b, double c, double m[3])
{
    const double mid = 0.5 * (a + b), half = 0.5 * (b - a);
    for (int i = 0; i < GL_N; i++) {
        const double th = mid + half * gl_x[i];
        const double w = gl_w[i] * half * weight(q, th), s = sin(th) - c;
        m[0] += w;
        m[1] += w * s;
        m[2] += w * s * s;
    }
}

static void marginal_init(marginal *q, uint32_t dim)
{
    q->n = (double)dim - 2.0;
    q->theta_max = q->n == 0 ? M_PI / 2 : acos(exp(-92.0 / q->n));
    q->h = 2.0 * q->theta_max / PANELS;
    for (int p = 0; p < PANELS; p++) {
        double m[3] = {0, 0, 0};
        const double a = -q->theta_max + p * q->h;
        gl_piece(q, a, a + q->h, 0.0, m);
        q->m0[p] = m[0];
        q->m1[p] = m[1];
        q->m2[p] = m[2];
    }
}

static double panel_edge(const marginal *q, int p)
{
    return -q->theta_max + p * q->h;
}

/* Moments of the cell [a, b] (θ) about c. centred = 0 uses the panel tables (m2 not centred; the
 * Lloyd update needs m0, m1 only); centred = 1 integrates (sin θ − c)^j piece by piece (the MSE). */
static void cell_moments(const marginal *q, double a, double b, double c, int centred, double m[3])
{
    m[0] = m[1] = m[2] = 0;
    if (!(b > a))
        return;
    const double T = q->theta_max;
    /* outside [−Θ, Θ]: one rule each (negligible mass, kept so that cells there have a centroid) */
    if (a < -T) {
        gl_piece(q, a, fmin(b, -T), c, m);
        a = -T;
        if (b <= a)
            return;
    }
    if (b > T) {
        gl_piece(q, fmax(a, T), b, c, m);
        b = T;
        if (b <= a)
            return;
    }
    int pa = (int)floor((a + T) / q->h), pb = (int)floor((b + T) / q->h);
    pa = pa < 0 ? 0 : pa >= PANELS ? PANELS - 1 : pa;
    pb = pb < 0 ? 0 : pb >= PANELS ? PANELS - 1 : pb;
    if (pa == pb) {
        gl_piece(q, a, b, c, m);
        return;
    }
    gl_piece(q, a, panel_edge(q, pa + 1), c, m);
    for (int p = pa + 1; p < pb; p++) {
        if (centred) {
            gl_piece(q, panel_edge(q, p), panel_edge(q, p + 1), c, m);
        } else {
            m[0] += q->m0[p];
            m[1] += q->m1[p];
        }
    }
    gl_piece(q, panel_edge(q, pb), b, c, m);
}

/* Cells of ascending centroids (midpoint boundaries) in θ: edges[0] = −π/2 … edges[k] = π/2. */
static void cell_edges(const double *c, uint32_t k, double *edges)
{
    edges[0] = -M_PI / 2;
    edges[k] = M_PI / 2;
    for (uint32_t i = 1; i < k; i++)
        edges[i] = asin(fmax(-1.0, fmin(1.0, 0.5 * (c[i - 1] + c[i]))));
}

static int marginal_mse_d(const marginal *q, const double *c, uint32_t k, double *mse)
{
    double edges[257], total = 0, err = 0;
    if (k > 256)
        return DQ_INVALID_ARGUMENT;
    cell_edges(c, k, edges);
    for (uint32_t i = 0; i < k; i++) {
        double m[3];
        cell_moments(q, edges[i], edges[i + 1], c[i], 1, m);
        total += m[0];
        err += m[2];
    }
    *mse = err / total;
    return DQ_OK;
}

int dq__kvq_marginal_mse(uint32_t dim, const float *c, uint32_t k, double *mse)
{
    DQ_RETURN_IF(dim < 2 || k == 0 || k > 256 || !c || !mse, DQ_INVALID_ARGUMENT);
    marginal *q = malloc(sizeof *q);
    DQ_RETURN_IF(!q, DQ_NOMEM);
    double cd[256];
    for (uint32_t i = 0; i < k; i++)
        cd[i] = c[i];
    marginal_init(q, dim);
    int rc = marginal_mse_d(q, cd, k, mse);
    free(q);
    return rc;
}

/* One Lloyd map c → G(c) (G_i: conditional mean of cell i) and its tridiagonal Jacobian: with
 * cell edges a = (c_{i−1} + c_i)/2, b = (c_i + c_{i+1})/2 and density f(t) = cos^(n−1) θ at t = sin θ,
 * ∂G_i/∂a = f(a)(G_i − a)/m0, ∂G_i/∂b = f(b)(b − G_i)/m0, and each edge moves by half a centroid. */
static double lloyd_eval(const marginal *q, const double *c, uint32_t k, double *g, double *lo, double *di, double *up)
{
    double edges[257], resid = 0;
    cell_edges(c, k, edges);
    for (uint32_t i = 0; i < k; i++) {
        double m[3];
        cell_moments(q, edges[i], edges[i + 1], 0.0, 0, m);
        const double ta = sin(edges[i]), tb = sin(edges[i + 1]);
        g[i] = m[0] > 0 ? m[1] / m[0] : 0.5 * (ta + tb);
        lo[i] = up[i] = 0;
        if (m[0] > 0) {
            if (i > 0)
                lo[i] = 0.5 * pow(cos(edges[i]), q->n - 1) * (g[i] - ta) / m[0];
            if (i + 1 < k)
                up[i] = 0.5 * pow(cos(edges[i + 1]), q->n - 1) * (tb - g[i]) / m[0];
        }
        di[i] = lo[i] + up[i];
        resid = fmax(resid, fabs(c[i] - g[i]));
    }
    return resid;
}

static int ascending(const double *c, uint32_t k)
{
    for (uint32_t i = 0; i + 1 < k; i++)
        if (!(c[i] < c[i + 1]))
            return 0;
    return c[0] > -1 && c[k - 1] < 1;
}

/* Lloyd–Max on the marginal: start at the quantiles (i + ½)/k of the density (from the panel
 * masses), a few Lloyd steps, then Newton on c = G(c) (damped, keeping the centroids ordered)
 * until the fixed-point residual is below 1e−14 of the marginal's standard deviation. */
static void lloyd_marginal(const marginal *q, uint32_t k, double *c)
{
    double cum[PANELS + 1];
    cum[0] = 0;
    for (int p = 0; p < PANELS; p++)
        cum[p + 1] = cum[p] + q->m0[p];
    const double total = cum[PANELS];
    int p = 0;
    for (uint32_t i = 0; i < k; i++) {
        const double target = total * (i + 0.5) / k;
        while (p < PANELS - 1 && cum[p + 1] < target)
            p++;
        const double frac = q->m0[p] > 0 ? (target - cum[p]) / q->m0[p] : 0.5;
        c[i] = sin(panel_edge(q, p) + frac * q->h);
    }
    const double tol = 1e-14 / sqrt(q->n + 2.0);
    double g[256], lo[256], di[256], up[256], step[256], trial[256], cp[256];
    double resid = 0;
    for (int it = 0; it < 20; it++) {
        resid = lloyd_eval(q, c, k, g, lo, di, up);
        memcpy(c, g, k * sizeof *c);
    }
    resid = lloyd_eval(q, c, k, g, lo, di, up);
    for (int it = 0; it < 200 && resid > tol; it++) {
        /* (I − J) step = G − c, J tridiagonal: Thomas algorithm */
        for (uint32_t i = 0; i < k; i++) {
            const double a = -lo[i], b = 1.0 - di[i], r = g[i] - c[i];
            const double den = i ? b - a * cp[i - 1] : b;
            cp[i] = -up[i] / den;
            step[i] = i ? (r - a * step[i - 1]) / den : r / den;
        }
        for (uint32_t i = k - 1; i-- > 0;)
            step[i] -= cp[i] * step[i + 1];
        double lambda = 1.0, nres = 0;
        int ok = 0;
        for (int h = 0; h < 40 && !ok; h++, lambda *= 0.5) {
            for (uint32_t i = 0; i < k; i++)
                trial[i] = c[i] + lambda * step[i];
            if (!ascending(trial, k))
                continue;
            double tg[256], tl[256], td[256], tu[256];
            nres = lloyd_eval(q, trial, k, tg, tl, td, tu);
            if (nres < resid) {
                ok = 1;
                memcpy(c, trial, k * sizeof *c);
                memcpy(g, tg, k * sizeof *g);
                memcpy(lo, tl, k * sizeof *lo);
                memcpy(di, td, k * sizeof *di);
                memcpy(up, tu, k * sizeof *up);
                resid = nres;
            }
        }
        if (!ok)
            break; /* at the quadrature's noise floor */
    }
    /* exact symmetry: the density is even */
    for (uint32_t i = 0; i < k / 2; i++) {
        const double s = 0.5 * (c[k - 1 - i] - c[i]);
        c[i] = -s;
        c[k - 1 - i] = s;
    }
}

typedef struct codebook_entry {
    struct codebook_entry *next;
    uint32_t bits, dim;
    float centroids[256];
    float boundaries[255];
} codebook_entry;

static pthread_mutex_t g_cb_lock = PTHREAD_MUTEX_INITIALIZER;
static codebook_entry *g_cb_head;

static codebook_entry *cb_find(uint32_t bits, uint32_t dim)
{
    for (codebook_entry *e = g_cb_head; e; e = e->next)
        if (e->bits == bits && e->dim == dim)
            return e;
    return NULL;
}

int dq_kvq_codebook(uint32_t bits, uint32_t dim, const float **centroids, const float **boundaries)
{
    DQ_RETURN_IF(bits < 1 || bits > 8 || dim < 2, DQ_INVALID_ARGUMENT);
    pthread_mutex_lock(&g_cb_lock);
    codebook_entry *e = cb_find(bits, dim);
    pthread_mutex_unlock(&g_cb_lock);
    if (!e) {
        /* computed outside the lock; a racing thread's copy wins and ours is dropped */
        codebook_entry *ne = calloc(1, sizeof *ne);
        marginal *q = malloc(sizeof *q);
        if (!ne || !q) {
            free(ne);
            free(q);
            return DQ_NOMEM;
        }
        const uint32_t k = 1u << bits;
        double c[256];
        marginal_init(q, dim);
        lloyd_marginal(q, k, c);
        free(q);
        ne->bits = bits;
        ne->dim = dim;
        for (uint32_t i = 0; i < k; i++)
            ne->centroids[i] = (float)c[i];
        dq__kvq_boundaries(ne->centroids, k, ne->boundaries);
        pthread_mutex_lock(&g_cb_lock);
        e = cb_find(bits, dim);
        if (!e) {
            ne->next = g_cb_head;
            g_cb_head = ne;
            e = ne;
            ne = NULL;
        }
        pthread_mutex_unlock(&g_cb_lock);
        free(ne);
    }
    if (centroids)
        *centroids = e->centroids;
    if (boundaries)
        *boundaries = e->boundaries;
    return DQ_OK;
}

/* Lloyd–Max for N(0, σ²), σ² = 1/dim, with the cell moments in closed form. */
int dq__kvq_gauss_codebook(uint32_t bits, uint32_t dim, float *centroids)
{
    DQ_RETURN_IF(bits < 1 || bits > 8 || dim < 1 || !centroids, DQ_INVALID_ARGUMENT);
    const uint32_t k = 1u << bits;
    const double sigma = 1.0 / sqrt((double)dim);
    double c[256], z[257];
    for (uint32_t i = 0; i < k; i++)
        c[i] = 3.0 * ((2.0 * i + 1.0 - k) / k); /* in units of σ */
    for (int it = 0; it < 200000; it++) {
        z[0] = -INFINITY;
        z[k] = INFINITY;
        for (uint32_t i = 1; i < k; i++)
            z[i] = 0.5 * (c[i - 1] + c[i]);
        double moved = 0;
        for (uint32_t i = 0; i < k; i++) {
            const double a = z[i], b = z[i + 1];
            /* mass from the tail on the side of the cell, so that small cells keep their digits */
            double m0;
            if (a >= 0)
                m0 = 0.5 * (erfc(a / M_SQRT2) - erfc(b / M_SQRT2));
            else if (b <= 0)
                m0 = 0.5 * (erfc(-b / M_SQRT2) - erfc(-a / M_SQRT2));
            else
                m0 = 0.5 * (erf(b / M_SQRT2) - erf(a / M_SQRT2));
            const double pa = isinf(a) ? 0 : exp(-0.5 * a * a), pb = isinf(b) ? 0 : exp(-0.5 * b * b);
            const double m1 = (pa - pb) / sqrt(2.0 * M_PI);
            const double nc = m0 > 0 ? m1 / m0 : c[i];
            moved = fmax(moved, fabs(nc - c[i]));
            c[i] = nc;
        }
        if (moved <= 1e-13)
            break;
    }
    for (uint32_t i = 0; i < k; i++)
        centroids[i] = (float)(c[i] * sigma);
    return DQ_OK;
}

/* ---- randomized Hadamard rotation ------------------------------------------------------------------ */

int dq__kvq_rht_signs(uint32_t d, uint64_t seed, float *signs)
{
    DQ_RETURN_IF(!signs || d == 0 || (d & (d - 1)) != 0, DQ_INVALID_ARGUMENT);
    dq__kvq_rng r;
    dq__kvq_rng_seed(&r, seed);
    for (uint32_t i = 0; i < d; i++)
        signs[i] = dq__kvq_rng_next(&r) >> 63 ? -1.0f : 1.0f;
    return DQ_OK;
}

void dq__kvq_rht_apply(float *x, const float *signs, uint32_t d)
{
    const float scale = (float)(1.0 / sqrt((double)d));
    for (uint32_t i = 0; i < d; i++)
        x[i] *= signs[i];
    dq__fwht(x, d);
    for (uint32_t i = 0; i < d; i++)
        x[i] *= scale;
}

void dq__kvq_rht_inverse(float *x, const float *signs, uint32_t d)
{
    const float scale = (float)(1.0 / sqrt((double)d));
    dq__fwht(x, d);
    for (uint32_t i = 0; i < d; i++)
        x[i] *= scale * signs[i];
}

/* ---- k-means ------------------------------------------------------------------------------------- */

static int finite_f(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

static double dist2(const float *a, const float *b, uint32_t dim)
{
    double s = 0;
    for (uint32_t j = 0; j < dim; j++) {
        const double t = (double)a[j] - b[j];
        s += t * t;
    }
    return s;
}

/* Nearest centroid of p (squared distance; ties to the lower index). */
static uint32_t nearest(const float *p, const float *c, uint32_t k, uint32_t dim, double *d2)
{
    uint32_t best = 0;
    double bd = dist2(p, c, dim);
    for (uint32_t j = 1; j < k; j++) {
        const double d = dist2(p, c + (size_t)j * dim, dim);
        if (d < bd) {
            bd = d;
            best = j;
        }
    }
    *d2 = bd;
    return best;
}

/* Lloyd iterations from the centroids given, then the MSE per point of the final centroids. An
 * empty cluster takes the point farthest from its centroid (deterministic). */
static int lloyd(const float *pts, size_t count, uint32_t dim, uint32_t k, uint32_t iters, float *c, double *mse)
{
    uint32_t *as = malloc(count * sizeof *as);
    double *sum = malloc((size_t)k * dim * sizeof *sum), *d2 = malloc(count * sizeof *d2);
    size_t *cnt = malloc(k * sizeof *cnt);
    if (!as || !sum || !d2 || !cnt) {
        free(as);
        free(sum);
        free(d2);
        free(cnt);
        return DQ_NOMEM;
    }
    for (uint32_t it = 0; it <= iters; it++) {
        int changed = 0;
        double err = 0;
        for (size_t i = 0; i < count; i++) {
            const uint32_t a = nearest(pts + i * dim, c, k, dim, &d2[i]);
            changed |= it == 0 || a != as[i];
            as[i] = a;
            err += d2[i];
        }
        *mse = err / (double)count;
        if (it == iters || !changed)
            break;
        memset(sum, 0, (size_t)k * dim * sizeof *sum);
        memset(cnt, 0, k * sizeof *cnt);
        for (size_t i = 0; i < count; i++) {
            double *s = sum + (size_t)as[i] * dim;
            for (uint32_t j = 0; j < dim; j++)
                s[j] += pts[i * dim + j];
            cnt[as[i]]++;
        }
        for (uint32_t m = 0; m < k; m++) {
            float *cm = c + (size_t)m * dim;
            if (cnt[m]) {
                for (uint32_t j = 0; j < dim; j++)
                    cm[j] = (float)(sum[(size_t)m * dim + j] / (double)cnt[m]);
                continue;
            }
            size_t far = 0;
            for (size_t i = 1; i < count; i++)
                if (d2[i] > d2[far])
                    far = i;
            memcpy(cm, pts + far * dim, dim * sizeof *cm);
            d2[far] = 0;
        }
    }
    free(as);
    free(sum);
    free(d2);
    free(cnt);
    return DQ_OK;
}

static int kmeans_check(const float *points, size_t count, uint32_t dim, uint32_t k, const float *centroids)
{
    DQ_RETURN_IF(!points || !centroids || count == 0 || dim == 0 || k == 0 || k > count, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(count > SIZE_MAX / sizeof(double) / dim, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!finite_f(points, count * dim), DQ_NONFINITE);
    return DQ_OK;
}

int dq_kvq_kmeans(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters, uint64_t seed,
                  float *centroids, double *mse)
{
    DQ_FORWARD_IF_ERROR(kmeans_check(points, count, dim, k, centroids));
    double *d2 = malloc(count * sizeof *d2);
    DQ_RETURN_IF(!d2, DQ_NOMEM);
    dq__kvq_rng r;
    dq__kvq_rng_seed(&r, seed);
    /* k-means++ (Arthur & Vassilvitskii 2007): the first centroid uniformly, each next one with
     * probability ∝ D²(x), the squared distance to the nearest chosen centroid */
    size_t pick = (size_t)(dq__kvq_rng_uniform(&r) * (double)count);
    memcpy(centroids, points + pick * dim, dim * sizeof *centroids);
    for (size_t i = 0; i < count; i++)
        d2[i] = dist2(points + i * dim, centroids, dim);
    for (uint32_t m = 1; m < k; m++) {
        double total = 0;
        for (size_t i = 0; i < count; i++)
            total += d2[i];
        if (total > 0) {
            const double target = dq__kvq_rng_uniform(&r) * total;
            double acc = 0;
            pick = count;
            for (size_t i = 0; i < count; i++) {
                if (d2[i] <= 0)
                    continue;
                pick = i; /* the last point with weight, should rounding leave target unreached */
                acc += d2[i];
                if (acc > target)
                    break;
            }
        } else { /* fewer distinct points than k: duplicates */
            pick = (size_t)(dq__kvq_rng_uniform(&r) * (double)count);
        }
        float *cm = centroids + (size_t)m * dim;
        memcpy(cm, points + pick * dim, dim * sizeof *cm);
        for (size_t i = 0; i < count; i++)
            d2[i] = fmin(d2[i], dist2(points + i * dim, cm, dim));
    }
    free(d2);
    double e;
    DQ_FORWARD_IF_ERROR(lloyd(points, count, dim, k, iters, centroids, &e));
    if (mse)
        *mse = e;
    return DQ_OK;
}

int dq_kvq_kmeans_linspace(const float *points, size_t count, uint32_t dim, uint32_t k, uint32_t iters,
                           float *centroids, double *mse)
{
    DQ_FORWARD_IF_ERROR(kmeans_check(points, count, dim, k, centroids));
    for (uint32_t j = 0; j < dim; j++) {
        float lo = points[j], hi = points[j];
        for (size_t i = 1; i < count; i++) {
            lo = fminf(lo, points[i * dim + j]);
            hi = fmaxf(hi, points[i * dim + j]);
        }
        for (uint32_t m = 0; m < k; m++)
            centroids[(size_t)m * dim + j] = k == 1 ? (float)(0.5 * ((double)lo + hi))
                                                    : (float)(lo + ((double)hi - lo) * m / (k - 1));
    }
    double e;
    DQ_FORWARD_IF_ERROR(lloyd(points, count, dim, k, iters, centroids, &e));
    if (mse)
        *mse = e;
    return DQ_OK;
}

/* ---- QJL ------------------------------------------------------------------------------------------ */

int dq_kvq_qjl_matrix(uint32_t dim, uint64_t seed, float *s)
{
    DQ_RETURN_IF(!s || dim == 0 || dim > 65535, DQ_INVALID_ARGUMENT);
    dq__kvq_rng r;
    dq__kvq_rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)dim * dim; i++)
        s[i] = (float)dq__kvq_rng_normal(&r);
    return DQ_OK;
}

int dq_kvq_qjl_sign(const float *s, uint32_t dim, const float *r, uint8_t *bits, float *norm)
{
    DQ_RETURN_IF(!s || !r || !bits || dim == 0, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!finite_f(r, dim), DQ_NONFINITE);
    double n2 = 0;
    for (uint32_t j = 0; j < dim; j++)
        n2 += (double)r[j] * r[j];
    memset(bits, 0, (dim + 7) / 8);
    for (uint32_t i = 0; i < dim; i++) {
        const float *si = s + (size_t)i * dim;
        double p = 0;
        for (uint32_t j = 0; j < dim; j++)
            p += (double)si[j] * r[j];
        if (p >= 0)
            bits[i >> 3] |= (uint8_t)(1u << (i & 7));
    }
    if (norm)
        *norm = (float)sqrt(n2);
    return DQ_OK;
}

int dq_kvq_qjl_project(const float *s, uint32_t dim, const float *y, float *sy)
{
    DQ_RETURN_IF(!s || !y || !sy || dim == 0, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!finite_f(y, dim), DQ_NONFINITE);
    for (uint32_t i = 0; i < dim; i++) {
        const float *si = s + (size_t)i * dim;
        double p = 0;
        for (uint32_t j = 0; j < dim; j++)
            p += (double)si[j] * y[j];
        sy[i] = (float)p;
    }
    return DQ_OK;
}

float dq_kvq_qjl_estimate(const float *sy, uint32_t dim, const uint8_t *bits, float norm)
{
    double acc = 0;
    for (uint32_t i = 0; i < dim; i++)
        acc += (bits[i >> 3] >> (i & 7) & 1) ? sy[i] : -(double)sy[i];
    return (float)(sqrt(M_PI / 2) / dim * norm * acc);
}

int dq_kvq_qjl_dot(const float *s, uint32_t dim, const float *y, const uint8_t *bits, float norm, float *out)
{
    DQ_RETURN_IF(!s || !y || !bits || !out || dim == 0, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!finite_f(y, dim) || !isfinite(norm), DQ_NONFINITE);
    DQ_RETURN_IF(norm < 0, DQ_INVALID_ARGUMENT);
    double acc = 0;
    for (uint32_t i = 0; i < dim; i++) {
        const float *si = s + (size_t)i * dim;
        double p = 0;
        for (uint32_t j = 0; j < dim; j++)
            p += (double)si[j] * y[j];
        acc += (bits[i >> 3] >> (i & 7) & 1) ? p : -p;
    }
    *out = (float)(sqrt(M_PI / 2) / dim * norm * acc);
    return DQ_OK;
}
