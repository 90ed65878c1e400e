/* KVQ toolbox, dense linear algebra in double (dquant/kvq.h section 1): Householder QR, Haar-random
 * SO(d) rotations, determinant signs, one-sided Jacobi SVD and the randomized SVD. Matrices inside
 * this file are column-major (a column is contiguous); the public calls take row-major floats. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "kvq_internal.h"

static int all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Thin Householder QR of a (m × n, column-major, m >= n), overwritten. q (m × n) receives the
 * explicit Q; rdiag the diagonal of R; returns the number of reflections applied (each has det −1).
 * v: m doubles of scratch per column (m × n). */
static int householder_qr(double *a, uint32_t m, uint32_t n, double *q, double *rdiag, double *v)
{
    int reflections = 0;
    for (uint32_t j = 0; j < n; j++) {
        double *x = a + (size_t)j * m, *vj = v + (size_t)j * m;
        double norm = 0;
        for (uint32_t i = j; i < m; i++)
            norm += x[i] * x[i];
        norm = sqrt(norm);
        memset(vj, 0, m * sizeof *vj);
        if (norm == 0) {
            rdiag[j] = 0;
            continue;
        }
        const double alpha = x[j] >= 0 ? -norm : norm;
        double vn = 0;
        for (uint32_t i = j; i < m; i++)
            vj[i] = x[i];
        vj[j] -= alpha;
        for (uint32_t i = j; i < m; i++)
            vn += vj[i] * vj[i];
        vn = sqrt(vn);
        for (uint32_t i = j; i < m; i++)
            vj[i] /= vn;
        reflections++;
        rdiag[j] = alpha;
        for (uint32_t c = j; c < n; c++) {
            double *col = a + (size_t)c * m, dot = 0;
            for (uint32_t i = j; i < m; i++)
                dot += vj[i] * col[i];
            for (uint32_t i = j; i < m; i++)
                col[i] -= 2 * dot * vj[i];
        }
    }
    /* Q = H_0 ⋯ H_{n−1} applied to the first n columns of I */
    memset(q, 0, (size_t)m * n * sizeof *q);
    for (uint32_t j = 0; j < n; j++)
        q[(size_t)j * m + j] = 1;
    for (uint32_t j = n; j-- > 0;) {
        const double *vj = v + (size_t)j * m;
        for (uint32_t c = 0; c < n; c++) {
            double *col = q + (size_t)c * m, dot = 0;
            for (uint32_t i = j; i < m; i++)
                dot += vj[i] * col[i];
            if (dot != 0)
                for (uint32_t i = j; i < m; i++)
                    col[i] -= 2 * dot * vj[i];
        }
    }
    return reflections;
}

/* Orthonormal basis of the columns of a (m × n, m >= n) into q; a is destroyed. */
static int orthonormalize(double *a, uint32_t m, uint32_t n, double *q)
{
    double *v = malloc((size_t)m * n * sizeof *v), *rd = malloc(n * sizeof *rd);
    if (!v || !rd) {
        free(v);
        free(rd);
        return DQ_NOMEM;
    }
    householder_qr(a, m, n, q, rd, v);
    free(v);
    free(rd);
    return DQ_OK;
}

static int haar(uint32_t dim, uint64_t seed, float *out, int fix_det)
{
    DQ_RETURN_IF(dim == 0 || !out || dim > 65535, DQ_INVALID_ARGUMENT);
    const size_t n = dim, nn = n * n;
    double *g = malloc(nn * sizeof *g), *q = malloc(nn * sizeof *q), *v = malloc(nn * sizeof *v);
    double *rd = malloc(n * sizeof *rd);
    if (!g || !q || !v || !rd) {
        free(g);
        free(q);
        free(v);
        free(rd);
        return DQ_NOMEM;
    }
    dq__kvq_rng r;
    dq__kvq_rng_seed(&r, seed);
    for (size_t i = 0; i < nn; i++)
        g[i] = dq__kvq_rng_normal(&r);
    const int refl = householder_qr(g, dim, dim, q, rd, v);
    /* Q·diag(sign R_jj): the Haar measure on O(d) (Mezzadri) */
    int det = refl & 1 ? -1 : 1;
    for (size_t j = 0; j < n; j++) {
        if (rd[j] < 0) {
            det = -det;
            for (size_t i = 0; i < n; i++)
                q[j * n + i] = -q[j * n + i];
        }
    }
    /* a reflection times diag(−1, 1, …, 1) is a rotation; the map keeps the Haar measure */
    if (fix_det && det < 0)
        for (size_t i = 0; i < n; i++)
            q[i] = -q[i];
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            out[i * n + j] = (float)q[j * n + i];
    free(g);
    free(q);
    free(v);
    free(rd);
    return DQ_OK;
}

int dq_kvq_haar(uint32_t dim, uint64_t seed, float *out)
{
    return haar(dim, seed, out, 1);
}

int dq__kvq_haar_unfixed(uint32_t dim, uint64_t seed, float *out)
{
    return haar(dim, seed, out, 0);
}

int dq_kvq_det_sign(const float *m, uint32_t dim, int *sign)
{
    DQ_RETURN_IF(!m || !sign || dim == 0 || dim > 65535, DQ_INVALID_ARGUMENT);
    const size_t n = dim;
    DQ_RETURN_IF(!all_finite(m, n * n), DQ_NONFINITE);
    double *a = malloc(n * n * sizeof *a);
    DQ_RETURN_IF(!a, DQ_NOMEM);
    double scale = 0;
    for (size_t i = 0; i < n * n; i++) {
        a[i] = m[i];
        scale = fmax(scale, fabs(a[i]));
    }
    /* LU with partial pivoting (row-major); a pivot below n·ε·max|m| counts as 0 (singular) */
    const double tiny = (double)n * DBL_EPSILON * scale;
    int s = 1;
    for (size_t k = 0; k < n && s != 0; k++) {
        size_t p = k;
        for (size_t i = k + 1; i < n; i++)
            if (fabs(a[i * n + k]) > fabs(a[p * n + k]))
                p = i;
        const double piv = a[p * n + k];
        if (!(fabs(piv) > tiny)) {
            s = 0;
            break;
        }
        if (p != k) {
            s = -s;
            for (size_t j = 0; j < n; j++) {
                const double t = a[k * n + j];
                a[k * n + j] = a[p * n + j];
                a[p * n + j] = t;
            }
        }
        if (piv < 0)
            s = -s;
        for (size_t i = k + 1; i < n; i++) {
            const double f = a[i * n + k] / piv;
            if (f != 0)
                for (size_t j = k + 1; j < n; j++)
                    a[i * n + j] -= f * a[k * n + j];
        }
    }
    free(a);
    *sign = s;
    return DQ_OK;
}

/* ---- SVD ------------------------------------------------------------------------------------------ */

/* One-sided Jacobi (Hestenes) on the n columns of w (m × n, column-major): rotates column pairs
 * until all are orthogonal, accumulating the rotations in v (n × n, column-major, starts as I).
 * Then w = U·Σ: sv receives the column norms and w the normalized columns, sorted descending. */
static void jacobi_svd(double *w, uint32_t m, uint32_t n, double *v, double *sv)
{
    memset(v, 0, (size_t)n * n * sizeof *v);
    for (uint32_t j = 0; j < n; j++)
        v[(size_t)j * n + j] = 1;
    double *nrm = sv; /* squared column norms, kept up to date by the rotations */
    for (int sweep = 0; sweep < 80; sweep++) {
        int rotated = 0;
        for (uint32_t j = 0; j < n; j++) { /* exact again at each sweep: no drift */
            const double *wj = w + (size_t)j * m;
            double t = 0;
            for (uint32_t i = 0; i < m; i++)
                t += wj[i] * wj[i];
            nrm[j] = t;
        }
        for (uint32_t p = 0; p + 1 < n; p++) {
            for (uint32_t qi = p + 1; qi < n; qi++) {
                double *wp = w + (size_t)p * m, *wq = w + (size_t)qi * m;
                const double al = nrm[p], be = nrm[qi];
                double ga = 0;
                for (uint32_t i = 0; i < m; i++)
                    ga += wp[i] * wq[i];
                if (ga == 0 || fabs(ga) <= 1e-15 * sqrt(al * be))
                    continue;
                rotated = 1;
                const double zeta = (be - al) / (2 * ga);
                const double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                const double c = 1 / sqrt(1 + t * t), s = c * t;
                for (uint32_t i = 0; i < m; i++) {
                    const double x = wp[i], y = wq[i];
                    wp[i] = c * x - s * y;
                    wq[i] = s * x + c * y;
                }
                /* the rotation that annihilates γ moves t·γ of squared norm from p to q */
                nrm[p] = al - t * ga;
                nrm[qi] = be + t * ga;
                double *vp = v + (size_t)p * n, *vq = v + (size_t)qi * n;
                for (uint32_t i = 0; i < n; i++) {
                    const double x = vp[i], y = vq[i];
                    vp[i] = c * x - s * y;
                    vq[i] = s * x + c * y;
                }
            }
        }
        if (!rotated)
            break;
    }
    for (uint32_t j = 0; j < n; j++) {
        double *wj = w + (size_t)j * m, s = 0;
        for (uint32_t i = 0; i < m; i++)
            s += wj[i] * wj[i];
        sv[j] = sqrt(s);
        if (sv[j] > 0)
            for (uint32_t i = 0; i < m; i++)
                wj[i] /= sv[j];
    }
    /* selection sort by σ descending (n is small: a rank or a sketch width) */
    for (uint32_t j = 0; j < n; j++) {
        uint32_t b = j;
        for (uint32_t i = j + 1; i < n; i++)
            if (sv[i] > sv[b])
                b = i;
        if (b == j)
            continue;
        const double t = sv[j];
        sv[j] = sv[b];
        sv[b] = t;
        for (uint32_t i = 0; i < m; i++) {
            const double x = w[(size_t)j * m + i];
            w[(size_t)j * m + i] = w[(size_t)b * m + i];
            w[(size_t)b * m + i] = x;
        }
        for (uint32_t i = 0; i < n; i++) {
            const double x = v[(size_t)j * n + i];
            v[(size_t)j * n + i] = v[(size_t)b * n + i];
            v[(size_t)b * n + i] = x;
        }
    }
}

int dq__kvq_svd_exact(const double *a, uint32_t rows, uint32_t cols, double *u, double *s, double *vt)
{
    DQ_RETURN_IF(!a || !u || !s || !vt || rows == 0 || cols == 0, DQ_INVALID_ARGUMENT);
    const uint32_t r = rows < cols ? rows : cols;
    /* Jacobi on the r columns of A (rows >= cols) or of Aᵀ (rows < cols: A's rows, contiguous) */
    const uint32_t m = rows >= cols ? rows : cols;
    double *w = malloc((size_t)m * r * sizeof *w), *v = malloc((size_t)r * r * sizeof *v);
    if (!w || !v) {
        free(w);
        free(v);
        return DQ_NOMEM;
    }
    if (rows >= cols) {
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t j = 0; j < cols; j++)
                w[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    } else {
        memcpy(w, a, (size_t)rows * cols * sizeof *w);
    }
    jacobi_svd(w, m, r, v, s);
    if (rows >= cols) { /* A V = U Σ */
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t j = 0; j < r; j++)
                u[(size_t)i * r + j] = w[(size_t)j * rows + i];
        for (uint32_t j = 0; j < r; j++)
            for (uint32_t l = 0; l < cols; l++)
                vt[(size_t)j * cols + l] = v[(size_t)j * r + l];
    } else { /* Aᵀ V = W Σ, so A = V Σ Wᵀ */
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t j = 0; j < r; j++)
                u[(size_t)i * r + j] = v[(size_t)j * r + i];
        memcpy(vt, w, (size_t)r * cols * sizeof *vt);
    }
    free(w);
    free(v);
    return DQ_OK;
}

/* Randomized range finder (Halko–Martinsson–Tropp 2011, Alg. 4.4): Q = orth(A Ω), then `power`
 * times Q = orth(A orth(Aᵀ Q)); the SVD of the small B = Qᵀ A gives A's top triplets. */
static int rsvd_sketch(const double *a, uint32_t rows, uint32_t cols, uint32_t k, uint32_t power, uint64_t seed,
                       double *q)
{
    const size_t big = (size_t)(rows > cols ? rows : cols) * k;
    double *y = malloc(big * sizeof *y), *z = malloc(big * sizeof *z), *zq = malloc(big * sizeof *zq);
    int rc = DQ_NOMEM;
    if (!y || !z || !zq)
        goto out;
    dq__kvq_rng r;
    dq__kvq_rng_seed(&r, seed);
    for (size_t i = 0; i < (size_t)cols * k; i++)
        zq[i] = dq__kvq_rng_normal(&r); /* Ω, cols × k */
    for (uint32_t it = 0;; it++) {
        /* y = A zq (rows × k) */
        for (uint32_t j = 0; j < k; j++) {
            const double *om = zq + (size_t)j * cols;
            for (uint32_t i = 0; i < rows; i++) {
                const double *ai = a + (size_t)i * cols;
                double s = 0;
                for (uint32_t l = 0; l < cols; l++)
                    s += ai[l] * om[l];
                y[(size_t)j * rows + i] = s;
            }
        }
        if ((rc = orthonormalize(y, rows, k, q)) < 0)
            goto out;
        if (it == power)
            break;
        /* z = Aᵀ q (cols × k), re-orthonormalized */
        for (uint32_t j = 0; j < k; j++) {
            double *zj = z + (size_t)j * cols;
            const double *qj = q + (size_t)j * rows;
            memset(zj, 0, cols * sizeof *zj);
            for (uint32_t i = 0; i < rows; i++) {
                const double *ai = a + (size_t)i * cols, f = qj[i];
                for (uint32_t l = 0; l < cols; l++)
                    zj[l] += f * ai[l];
            }
        }
        if ((rc = orthonormalize(z, cols, k, zq)) < 0)
            goto out;
    }
    rc = DQ_OK;
out:
    free(y);
    free(z);
    free(zq);
    return rc;
}

int dq_kvq_rsvd(const float *a, uint32_t rows, uint32_t cols, uint32_t rank, uint32_t power, uint64_t seed, float *u,
                float *s, float *vt)
{
    DQ_RETURN_IF(!a || !u || !s || !vt || rows == 0 || cols == 0, DQ_INVALID_ARGUMENT);
    const uint32_t mn = rows < cols ? rows : cols;
    DQ_RETURN_IF(rank == 0 || rank > mn || power > 64, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF((size_t)rows * cols > ((size_t)1 << 31), DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!all_finite(a, (size_t)rows * cols), DQ_NONFINITE);
    const size_t rc_n = (size_t)rows * cols;
    double *ad = malloc(rc_n * sizeof *ad);
    DQ_RETURN_IF(!ad, DQ_NOMEM);
    for (size_t i = 0; i < rc_n; i++)
        ad[i] = a[i];
    int rc = DQ_NOMEM;
    double *q = NULL, *b = NULL, *ub = NULL, *sb = NULL, *vb = NULL, *uo = NULL;
    uint32_t k; /* width of the factorized matrix */
    if (rows < 64) {
        k = mn;
        uo = malloc((size_t)rows * k * sizeof *uo);
        sb = malloc(k * sizeof *sb);
        vb = malloc((size_t)k * cols * sizeof *vb);
        if (!uo || !sb || !vb)
            goto out;
        if ((rc = dq__kvq_svd_exact(ad, rows, cols, uo, sb, vb)) < 0)
            goto out;
    } else {
        k = rank + 10 < mn ? rank + 10 : mn;
        q = malloc((size_t)rows * k * sizeof *q);
        b = malloc((size_t)k * cols * sizeof *b);
        ub = malloc((size_t)k * k * sizeof *ub);
        sb = malloc(k * sizeof *sb);
        vb = malloc((size_t)k * cols * sizeof *vb);
        uo = malloc((size_t)rows * k * sizeof *uo);
        if (!q || !b || !ub || !sb || !vb || !uo)
            goto out;
        if ((rc = rsvd_sketch(ad, rows, cols, k, power, seed, q)) < 0)
            goto out;
        /* B = Qᵀ A (k × cols, row-major) */
        for (uint32_t j = 0; j < k; j++) {
            double *bj = b + (size_t)j * cols;
            const double *qj = q + (size_t)j * rows;
            memset(bj, 0, cols * sizeof *bj);
            for (uint32_t i = 0; i < rows; i++) {
                const double *ai = ad + (size_t)i * cols, f = qj[i];
                for (uint32_t l = 0; l < cols; l++)
                    bj[l] += f * ai[l];
            }
        }
        if ((rc = dq__kvq_svd_exact(b, k, cols, ub, sb, vb)) < 0)
            goto out;
        /* U = Q · U_B (rows × k, row-major) */
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t j = 0; j < k; j++) {
                double t = 0;
                for (uint32_t l = 0; l < k; l++)
                    t += q[(size_t)l * rows + i] * ub[(size_t)l * k + j];
                uo[(size_t)i * k + j] = t;
            }
    }
    /* outputs: the first `rank` triplets, each signed so that its largest |u| entry is positive */
    for (uint32_t j = 0; j < rank; j++) {
        uint32_t im = 0;
        for (uint32_t i = 1; i < rows; i++)
            if (fabs(uo[(size_t)i * k + j]) > fabs(uo[(size_t)im * k + j]))
                im = i;
        const double sg = uo[(size_t)im * k + j] < 0 ? -1.0 : 1.0;
        for (uint32_t i = 0; i < rows; i++)
            u[(size_t)i * rank + j] = (float)(sg * uo[(size_t)i * k + j]);
        s[j] = (float)sb[j];
        for (uint32_t l = 0; l < cols; l++)
            vt[(size_t)j * cols + l] = (float)(sg * vb[(size_t)j * cols + l]);
    }
    rc = DQ_OK;
out:
    free(ad);
    free(q);
    free(b);
    free(ub);
    free(sb);
    free(vb);
    free(uo);
    return rc;
}
