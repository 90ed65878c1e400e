/* The KVQuant++ codec family (dquant/kvq.h, codec_type DQ_CODEC_KVQ): profile names, validation,
 * record layout, encoding and decoding of token runs (delta coding, low-rank correction) and the
 * window logits of attention (PQ lookup tables, the factored low-rank term).
 *
 * Record of one token and kind (fixed size, little endian), H = kv_heads, d = head_dim, P parts
 * per head (2 for "ol": the outlier channels and the regular ones, else 1):
 *   offset 0             H·P fp16 norms, head-major ([h][p]); bit 15 of the first (a norm is never
 *                        negative) is the delta anchor flag of "+dN" profiles
 *   off_rnorm            IP keys only: H fp16 norms of the QJL residual
 *   off_lr               "+lrR" keys only: R fp16, the token's row of U_s = U_r·Σ_r
 *   off_bits             the indices of every head, bit-packed LSB first, head after head; per head:
 *                        each part's coordinates at the part's bits (lm: B; ip keys: B−1; ol: B+1 for
 *                        the outlier part, B−1 for the regular part), then for IP keys d QJL sign
 *                        bits (1: S·r >= 0); PQ: M codes of B bits instead
 * Key window header ("+lrR" only): V_r, R × n fp16 (row r, then channel), the right singular
 * vectors of the window's key residual K − K̂ (rank min(R, tokens); unused rows zero).
 *
 * Quantizers (per head, per part): the part is rotated (randomized Hadamard: seeded signs then
 * dq__fwht / sqrt(d); "lmh"/"iph": a Haar SO(d) rotation; "ol": Haar rotations of the outlier and
 * regular parts, whose sizes are not powers of two), its norm stored in fp16, the unit vector
 * quantized per coordinate with the Lloyd–Max codebook of the coordinate marginal of a unit vector
 * of the part's dimension (dq_kvq_codebook), or per subspace with the layer's PQ codebook. IP keys
 * add the QJL of the residual r = u − û: sign(S·r) and ‖r‖, dequantized as û + sqrt(π/2)/d·‖r‖·Sᵀz
 * (S: d × d standard Gaussian from the rotation seed), unbiased for inner products.
 * Outlier channels are raw (unrotated) channels chosen per layer and kind by their calibration
 * variance, as the seed's OutlierKVQuant does; the two parts are then quantized independently. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/kvq.h"

#define KVQ_MAX_RANK 64u
#define KVQ_DEFAULT_TAU 0.5f

/* ---- record layout from the profile alone ---- */

typedef struct kvq_layout {
    uint32_t parts, ip;
    uint32_t pdim[2], pbits[2];
    size_t off_rnorm, off_lr, off_bits, head_bits, record;
} kvq_layout;

static void layout(const dq_profile *p, int kind, kvq_layout *L)
{
    memset(L, 0, sizeof *L);
    const uint32_t d = p->head_dim, H = p->kv_heads, b = p->bits[kind];
    L->parts = 1;
    L->pdim[0] = d;
    L->pbits[0] = b;
    switch (p->kvq_variant) {
    case DQ_KVQ_IP:
        if (kind == DQ_KIND_K) {
            L->ip = 1;
            L->pbits[0] = b - 1;
        }
        break;
    case DQ_KVQ_OUTLIER:
        L->parts = 2;
        L->pdim[0] = p->kvq_outliers;
        L->pdim[1] = d - p->kvq_outliers;
        L->pbits[0] = b + 1;
        L->pbits[1] = b - 1;
        break;
    default:
        break;
    }
    L->off_rnorm = 2u * (size_t)H * L->parts;
    L->off_lr = L->off_rnorm + (L->ip ? 2u * (size_t)H : 0);
    L->off_bits = L->off_lr + (kind == DQ_KIND_K ? 2u * (size_t)p->kvq_rank : 0);
    if (p->kvq_variant == DQ_KVQ_PQ)
        L->head_bits = (size_t)p->kvq_pq_m * b;
    else
        L->head_bits = (size_t)L->pdim[0] * L->pbits[0] + (size_t)L->pdim[1] * L->pbits[1] + (L->ip ? d : 0);
    L->record = L->off_bits + ((size_t)H * L->head_bits + 7) / 8;
}

size_t dq__kvq_record_bytes(const dq_profile *p, int kind)
{
    kvq_layout L;
    layout(p, kind, &L);
    return L.record;
}

size_t dq__kvq_header_bytes(const dq_profile *p)
{
    return 2u * (size_t)p->kvq_rank * p->kv_heads * p->head_dim;
}

/* ---- profiles ---- */

static int parse_uint(const char **s, uint32_t *v)
{
    const char *q = *s;
    uint64_t x = 0;
    if (*q < '0' || *q > '9')
        return -1;
    while (*q >= '0' && *q <= '9') {
        x = x * 10 + (uint64_t)(*q - '0');
        if (x > 1000000)
            return -1;
        q++;
    }
    *s = q;
    *v = (uint32_t)x;
    return 0;
}

int dq__kvq_validate(const dq_profile *p)
{
    const uint32_t d = p->head_dim, n = p->kv_heads * p->head_dim;
    DQ_RETURN_IF(p->codec_type != DQ_CODEC_KVQ || p->kvq_variant > DQ_KVQ_PQ || p->kvq_rotation > 1, DQ_PROFILE);
    DQ_RETURN_IF(p->alpha != 0 || p->group || p->rotate, DQ_PROFILE);
    for (int k = 0; k < 2; k++) {
        uint32_t lo = 1, hi = 8;
        if (p->kvq_variant == DQ_KVQ_IP && k == DQ_KIND_K)
            lo = 2;
        if (p->kvq_variant == DQ_KVQ_OUTLIER) {
            lo = 2;
            hi = 7;
        }
        DQ_RETURN_IF(p->bits[k] < lo || p->bits[k] > hi || p->levels[k] != 1u << p->bits[k], DQ_PROFILE);
        for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++)
            DQ_RETURN_IF(p->freq[k][m], DQ_PROFILE);
    }
    DQ_RETURN_IF(p->kvq_variant == DQ_KVQ_OUTLIER ? p->kvq_outliers < 1 || p->kvq_outliers >= d : p->kvq_outliers != 0,
                 DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_variant == DQ_KVQ_PQ ? p->kvq_pq_m < 1 || p->kvq_pq_m > d || d % p->kvq_pq_m : p->kvq_pq_m != 0,
                 DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_rank > KVQ_MAX_RANK || p->kvq_rank > p->window || p->kvq_rank > n, DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_anchor > p->window, DQ_PROFILE);
    DQ_RETURN_IF(!(p->kvq_tau >= 0) || !(p->kvq_tau < 1e6f) || (p->kvq_anchor == 0 && p->kvq_tau != 0), DQ_PROFILE);
    DQ_RETURN_IF((p->kvq_layers == 0) != (p->kvq_calib_hash == 0) || p->kvq_layers > 65536, DQ_PROFILE);
    for (int k = 0; k < 2; k++)
        DQ_RETURN_IF(p->container_bytes[k] != dq__kvq_record_bytes(p, k), DQ_PROFILE);
    return DQ_OK;
}

int dq_profile_kvq(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    DQ_RETURN_IF(!name || !out, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(!kv_heads || !head_dim || (head_dim & (head_dim - 1)) || (uint64_t)kv_heads * head_dim > DQ_MAX_STREAM,
                 DQ_PROFILE);
    DQ_RETURN_IF(strlen(name) >= DQ_PROFILE_NAME_MAX, DQ_PROFILE);
    dq_profile p;
    memset(&p, 0, sizeof p);
    const char *s = name;
    uint32_t bits = 0;
    if (strncmp(s, "lmh", 3) == 0 || strncmp(s, "iph", 3) == 0) {
        p.kvq_variant = s[0] == 'l' ? DQ_KVQ_LM : DQ_KVQ_IP;
        p.kvq_rotation = 1;
        s += 3;
    } else if (strncmp(s, "lm", 2) == 0 || strncmp(s, "ip", 2) == 0 || strncmp(s, "ol", 2) == 0) {
        p.kvq_variant = s[0] == 'l' ? DQ_KVQ_LM : s[0] == 'i' ? DQ_KVQ_IP : DQ_KVQ_OUTLIER;
        s += 2;
    } else if (strncmp(s, "pq", 2) == 0) {
        p.kvq_variant = DQ_KVQ_PQ;
        s += 2;
        DQ_RETURN_IF(parse_uint(&s, &p.kvq_pq_m) || *s != 'x', DQ_PROFILE);
        s++;
    } else {
        return DQ_PROFILE;
    }
    DQ_RETURN_IF(parse_uint(&s, &bits) || bits < 1 || bits > 8, DQ_PROFILE);
    if (p.kvq_variant == DQ_KVQ_OUTLIER)
        p.kvq_outliers = head_dim / 4 ? head_dim / 4 : 1;
    /* suffixes, in this order, each at most once: +oO (outliers per head), +lrR, +dN */
    int stage = 0;
    while (*s) {
        DQ_RETURN_IF(*s != '+', DQ_PROFILE);
        s++;
        uint32_t v;
        if (s[0] == 'o' && stage < 1 && p.kvq_variant == DQ_KVQ_OUTLIER) {
            s++;
            DQ_RETURN_IF(parse_uint(&s, &v), DQ_PROFILE);
            p.kvq_outliers = v;
            stage = 1;
        } else if (s[0] == 'l' && s[1] == 'r' && stage < 2) {
            s += 2;
            DQ_RETURN_IF(parse_uint(&s, &v) || v < 1, DQ_PROFILE);
            p.kvq_rank = v;
            stage = 2;
        } else if (s[0] == 'd' && stage < 3) {
            s++;
            DQ_RETURN_IF(parse_uint(&s, &v) || v < 1, DQ_PROFILE);
            p.kvq_anchor = v;
            p.kvq_tau = KVQ_DEFAULT_TAU;
            stage = 3;
        } else {
            return DQ_PROFILE;
        }
    }
    p.format_version = DQ_FORMAT_VERSION;
    snprintf(p.name, sizeof p.name, "%s", name);
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.window = p.residual = 128;
    p.rotation_seed = 0x5eed;
    p.codec_type = DQ_CODEC_KVQ;
    p.bits[0] = p.bits[1] = bits;
    for (int k = 0; k < 2; k++) {
        p.levels[k] = 1u << bits;
        p.container_bytes[k] = (uint32_t)dq__kvq_record_bytes(&p, k);
    }
    DQ_FORWARD_IF_ERROR(dq__kvq_validate(&p));
    *out = p;
    return DQ_OK;
}

int dq_profile_needs_calibration(const dq_profile *p)
{
    return p && p->codec_type == DQ_CODEC_KVQ && (p->kvq_variant == DQ_KVQ_OUTLIER || p->kvq_variant == DQ_KVQ_PQ);
}

/* ---- codec state ---- */

size_t dq__kvq_scratch_floats(const dq_codec *c)
{
    const size_t n = c->n, d = c->head_dim, W = c->profile.window;
    /* token buffers, head buffers, the window residual (low rank), rSVD factors, PQ tables */
    return 4 * n + 8 * d + W * n + W * KVQ_MAX_RANK + KVQ_MAX_RANK + KVQ_MAX_RANK * n + 256 * d + 64;
}

void dq__kvq_release(dq_codec *c)
{
    if (c->root != c)
        return;
    dq__free(&c->alloc, c->kvq_haar);
    dq__free(&c->alloc, c->kvq_ol_rot[0]);
    dq__free(&c->alloc, c->kvq_ol_rot[1]);
    dq__free(&c->alloc, c->kvq_qjl);
    dq__free(&c->alloc, c->kvq_mem);
    dq__free(&c->alloc, c->views);
    c->kvq_haar = c->kvq_ol_rot[0] = c->kvq_ol_rot[1] = c->kvq_qjl = NULL;
    c->kvq_mem = NULL;
    c->views = NULL;
}

int dq__kvq_setup(dq_codec *c)
{
    const dq_profile *p = &c->profile;
    const uint32_t d = c->head_dim;
    const dq_allocator *a = &c->alloc;
    for (int k = 0; k < 2; k++) {
        kvq_layout L;
        layout(p, k, &L);
        c->record_bytes[k] = L.record;
        c->kvq_parts = L.parts;
        c->kvq_pdim[0] = L.pdim[0];
        c->kvq_pdim[1] = L.pdim[1];
        c->kvq_ip[k] = L.ip;
        c->kvq_off_rnorm[k] = L.off_rnorm;
        c->kvq_off_lr[k] = L.off_lr;
        c->kvq_off_bits[k] = L.off_bits;
        c->kvq_head_bits[k] = L.head_bits;
        for (uint32_t q = 0; q < L.parts; q++) {
            c->kvq_pbits[k][q] = L.pbits[q];
            if (p->kvq_variant != DQ_KVQ_PQ)
                DQ_FORWARD_IF_ERROR(
                    dq_kvq_codebook(L.pbits[q], L.pdim[q] >= 2 ? L.pdim[q] : 2, &c->kvq_cent[k][q], &c->kvq_bnd[k][q]));
        }
    }
    c->mean_bytes = dq__kvq_header_bytes(p);
    int rc = DQ_OK;
    if (p->kvq_variant == DQ_KVQ_OUTLIER) {
        for (int q = 0; q < 2 && rc == DQ_OK; q++) {
            const uint32_t dp = c->kvq_pdim[q];
            c->kvq_ol_rot[q] = dq__alloc(a, sizeof(float) * dp * dp);
            rc = c->kvq_ol_rot[q] ? dq_kvq_haar(dp, p->rotation_seed + 1 + (uint64_t)q, c->kvq_ol_rot[q]) : DQ_NOMEM;
        }
    } else if (p->kvq_rotation == 1) {
        c->kvq_haar = dq__alloc(a, sizeof(float) * d * d);
        rc = c->kvq_haar ? dq_kvq_haar(d, p->rotation_seed, c->kvq_haar) : DQ_NOMEM;
    }
    if (rc == DQ_OK && p->kvq_variant == DQ_KVQ_IP) {
        c->kvq_qjl = dq__alloc(a, sizeof(float) * d * d);
        rc = c->kvq_qjl ? dq_kvq_qjl_matrix(d, p->rotation_seed ^ 0x514a4cull, c->kvq_qjl) : DQ_NOMEM;
    }
    if (rc != DQ_OK)
        dq__kvq_release(c);
    return rc;
}

/* ---- bits and fp16 ---- */

static inline void put_bits(uint8_t *buf, size_t pos, uint32_t v, uint32_t nb)
{
    for (uint32_t b = 0; b < nb; b++)
        if (v >> b & 1u)
            buf[(pos + b) >> 3] |= (uint8_t)(1u << ((pos + b) & 7));
}

static inline uint32_t get_bits(const uint8_t *buf, size_t pos, uint32_t nb)
{
    uint32_t v = 0;
    for (uint32_t b = 0; b < nb; b++)
        v |= (uint32_t)(buf[(pos + b) >> 3] >> ((pos + b) & 7) & 1u) << b;
    return v;
}

static inline float get16f(const uint8_t *p)
{
    return dq_f16_to_f32(dq__get_u16(p));
}

/* Norm of part q of head h (the anchor flag masked off). */
static inline float rec_norm(const dq_codec *c, const uint8_t *rec, uint32_t h, uint32_t q)
{
    const size_t i = (size_t)h * c->kvq_parts + q;
    uint16_t v = dq__get_u16(rec + 2 * i);
    if (i == 0)
        v &= 0x7fffu;
    return dq_f16_to_f32(v);
}

static inline int rec_anchor(const uint8_t *rec)
{
    return rec[1] >> 7;
}

static inline int delta_on(const dq_codec *c)
{
    return c->profile.kvq_anchor > 0;
}

/* ---- rotations per head and part ---- */

static void matvec(const float *m, const float *x, float *y, uint32_t dim)
{
    for (uint32_t i = 0; i < dim; i++) {
        const float *r = m + (size_t)i * dim;
        float s = 0;
        for (uint32_t j = 0; j < dim; j++)
            s += r[j] * x[j];
        y[i] = s;
    }
}

static void matvec_t(const float *m, const float *y, float *x, uint32_t dim)
{
    for (uint32_t j = 0; j < dim; j++)
        x[j] = 0;
    for (uint32_t i = 0; i < dim; i++) {
        const float *r = m + (size_t)i * dim;
        const float yi = y[i];
        for (uint32_t j = 0; j < dim; j++)
            x[j] += r[j] * yi;
    }
}

/* y (parts back to back, d floats) = the rotated parts of head h of a token (xh: d floats). */
void dq__kvq_head_forward(const dq_codec *c, int kind, uint32_t h, const float *xh, float *y, float *tmp)
{
    const uint32_t d = c->head_dim;
    if (c->kvq_parts == 2) {
        const uint16_t *perm = c->kvq_perm[kind] + (size_t)h * d;
        for (uint32_t j = 0; j < d; j++)
            tmp[j] = xh[perm[j]];
        matvec(c->kvq_ol_rot[0], tmp, y, c->kvq_pdim[0]);
        matvec(c->kvq_ol_rot[1], tmp + c->kvq_pdim[0], y + c->kvq_pdim[0], c->kvq_pdim[1]);
    } else if (c->kvq_haar) {
        matvec(c->kvq_haar, xh, y, d);
    } else {
        const float *sg = c->signs ? c->signs + (size_t)h * d : NULL;
        for (uint32_t j = 0; j < d; j++)
            y[j] = sg ? xh[j] * sg[j] : xh[j];
        dq__fwht(y, d);
        for (uint32_t j = 0; j < d; j++)
            y[j] *= c->rot_scale;
    }
}

/* The inverse: xh (d floats, original channels) from y (overwritten). */
static void head_inverse(const dq_codec *c, int kind, uint32_t h, float *y, float *xh, float *tmp)
{
    const uint32_t d = c->head_dim;
    if (c->kvq_parts == 2) {
        const uint16_t *perm = c->kvq_perm[kind] + (size_t)h * d;
        matvec_t(c->kvq_ol_rot[0], y, tmp, c->kvq_pdim[0]);
        matvec_t(c->kvq_ol_rot[1], y + c->kvq_pdim[0], tmp + c->kvq_pdim[0], c->kvq_pdim[1]);
        for (uint32_t j = 0; j < d; j++)
            xh[perm[j]] = tmp[j];
    } else if (c->kvq_haar) {
        matvec_t(c->kvq_haar, y, xh, d);
    } else {
        const float *sg = c->signs ? c->signs + (size_t)h * d : NULL;
        dq__fwht(y, d);
        for (uint32_t j = 0; j < d; j++)
            xh[j] = y[j] * (sg ? c->rot_scale * sg[j] : c->rot_scale);
    }
}

/* ---- one head ---- */

static uint32_t pq_nearest(const float *cb, uint32_t K, uint32_t ds, const float *u)
{
    uint32_t best = 0;
    float bd = INFINITY;
    for (uint32_t k = 0; k < K; k++) {
        const float *e = cb + (size_t)k * ds;
        float s = 0;
        for (uint32_t i = 0; i < ds; i++) {
            float t = u[i] - e[i];
            s += t * t;
        }
        if (s < bd) {
            bd = s;
            best = k;
        }
    }
    return best;
}

/* Encodes head h of xh into rec (zeroed beforehand). y, u, tmp: d floats of scratch. */
static int enc_head(const dq_codec *c, int kind, uint32_t h, const float *xh, uint8_t *rec, float *y, float *u,
                    float *tmp)
{
    const dq_profile *p = &c->profile;
    const uint32_t d = c->head_dim;
    size_t pos = c->kvq_off_bits[kind] * 8 + (size_t)h * c->kvq_head_bits[kind];
    dq__kvq_head_forward(c, kind, h, xh, y, tmp);
    float *yp = y;
    for (uint32_t q = 0; q < c->kvq_parts; q++) {
        const uint32_t dp = c->kvq_pdim[q];
        double ss = 0;
        for (uint32_t j = 0; j < dp; j++)
            ss += (double)yp[j] * yp[j];
        const uint16_t nh = dq_f64_to_f16(sqrt(ss));
        DQ_RETURN_IF((nh & 0x7c00u) == 0x7c00u, DQ_RANGE);
        dq__put_u16(rec + 2 * ((size_t)h * c->kvq_parts + q), nh);
        const float nf = dq_f16_to_f32(nh), inv = nf > 0 ? 1.0f / nf : 0.0f;
        for (uint32_t j = 0; j < dp; j++)
            u[j] = yp[j] * inv;
        if (p->kvq_variant == DQ_KVQ_PQ) {
            const uint32_t M = p->kvq_pq_m, B = p->bits[kind], K = 1u << B, ds = d / M;
            for (uint32_t m = 0; m < M; m++, pos += B)
                put_bits(rec, pos, pq_nearest(c->kvq_pq[kind] + (size_t)m * K * ds, K, ds, u + m * ds), B);
        } else {
            const uint32_t b = c->kvq_pbits[kind][q];
            const float *bnd = c->kvq_bnd[kind][q], *cent = c->kvq_cent[kind][q];
            for (uint32_t j = 0; j < dp; j++, pos += b) {
                uint32_t i = dq_kvq_bucketize(u[j], bnd, (1u << b) - 1);
                put_bits(rec, pos, i, b);
                u[j] -= cent[i]; /* the residual, for the QJL stage */
            }
            if (c->kvq_ip[kind]) {
                double rs = 0;
                for (uint32_t j = 0; j < d; j++)
                    rs += (double)u[j] * u[j];
                dq__put_u16(rec + c->kvq_off_rnorm[kind] + 2 * h, dq_f64_to_f16(sqrt(rs)));
                matvec(c->kvq_qjl, u, tmp, d);
                for (uint32_t i = 0; i < d; i++, pos++)
                    put_bits(rec, pos, tmp[i] >= 0, 1);
            }
        }
        yp += dp;
    }
    return DQ_OK;
}

/* Decodes head h of rec to the rotated parts y (d floats). tmp: d floats. qjl = 0 leaves out the
 * QJL term of IP keys (attention adds it as a dot product with S·q). */
static void dec_head(const dq_codec *c, int kind, uint32_t h, const uint8_t *rec, float *y, float *tmp, int qjl)
{
    const dq_profile *p = &c->profile;
    const uint32_t d = c->head_dim;
    size_t pos = c->kvq_off_bits[kind] * 8 + (size_t)h * c->kvq_head_bits[kind];
    float *yp = y;
    for (uint32_t q = 0; q < c->kvq_parts; q++) {
        const uint32_t dp = c->kvq_pdim[q];
        const float nf = rec_norm(c, rec, h, q);
        if (p->kvq_variant == DQ_KVQ_PQ) {
            const uint32_t M = p->kvq_pq_m, B = p->bits[kind], K = 1u << B, ds = d / M;
            for (uint32_t m = 0; m < M; m++, pos += B) {
                const float *e = c->kvq_pq[kind] + ((size_t)m * K + get_bits(rec, pos, B)) * ds;
                for (uint32_t i = 0; i < ds; i++)
                    yp[m * ds + i] = nf * e[i];
            }
        } else {
            const uint32_t b = c->kvq_pbits[kind][q];
            const float *cent = c->kvq_cent[kind][q];
            for (uint32_t j = 0; j < dp; j++, pos += b)
                yp[j] = cent[get_bits(rec, pos, b)];
            if (c->kvq_ip[kind] && qjl) {
                const float g = (float)(sqrt(M_PI / 2) / d) * get16f(rec + c->kvq_off_rnorm[kind] + 2 * h);
                for (uint32_t i = 0; i < d; i++, pos++)
                    tmp[i] = get_bits(rec, pos, 1) ? g : -g;
                const float *S = c->kvq_qjl;
                for (uint32_t i = 0; i < d; i++) {
                    const float *r = S + (size_t)i * d;
                    const float zi = tmp[i];
                    for (uint32_t j = 0; j < d; j++)
                        yp[j] += r[j] * zi;
                }
            }
            for (uint32_t j = 0; j < dp; j++)
                yp[j] *= nf;
        }
        yp += dp;
    }
}

/* Token scratch inside ws->kvq. */
typedef struct kvq_scratch {
    float *x, *prev, *cur, *hy, *hu, *ht, *X, *su, *ss, *svt, *lut;
} kvq_scratch;

static void scratch(const dq_codec *c, dq_workspace *ws, kvq_scratch *s)
{
    const size_t n = c->n, d = c->head_dim, W = c->profile.window;
    float *f = ws->kvq;
    s->x = f;
    s->prev = s->x + n;
    s->cur = s->prev + n;
    s->hy = s->cur + n;
    s->hu = s->hy + 2 * d;
    s->ht = s->hu + 2 * d;
    s->X = s->ht + 2 * d + n;
    s->su = s->X + W * n;
    s->ss = s->su + W * KVQ_MAX_RANK;
    s->svt = s->ss + KVQ_MAX_RANK;
    s->lut = s->svt + KVQ_MAX_RANK * n;
}

static int enc_token(const dq_codec *c, const kvq_scratch *s, int kind, const float *x, uint8_t *rec)
{
    const uint32_t d = c->head_dim;
    memset(rec, 0, c->record_bytes[kind]);
    for (uint32_t h = 0; h < c->profile.kv_heads; h++)
        DQ_FORWARD_IF_ERROR(enc_head(c, kind, h, x + (size_t)h * d, rec, s->hy, s->hu, s->ht));
    return DQ_OK;
}

static void dec_token(const dq_codec *c, const kvq_scratch *s, int kind, const uint8_t *rec, float *out)
{
    const uint32_t d = c->head_dim;
    for (uint32_t h = 0; h < c->profile.kv_heads; h++) {
        dec_head(c, kind, h, rec, s->hy, s->ht, 1);
        head_inverse(c, kind, h, s->hy, out + (size_t)h * d, s->ht);
    }
}

static double sumsq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

int dq__kvq_encode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype, size_t ntok,
                   uint8_t *header, uint8_t *records, size_t stride)
{
    const dq_profile *p = &c->profile;
    const size_t n = c->n;
    DQ_RETURN_IF(!ws->kvq, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(c->kvq_parts == 2 && !c->kvq_perm[kind], DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_variant == DQ_KVQ_PQ && !c->kvq_pq[kind], DQ_PROFILE);
    DQ_FORWARD_IF_ERROR(dq_check_finite(x, dtype, ntok * n));
    kvq_scratch s;
    scratch(c, ws, &s);
    const int lowrank = kind == DQ_KIND_K && p->kvq_rank > 0;
    DQ_RETURN_IF(lowrank && (!header || ntok > p->window), DQ_SHAPE);
    const uint32_t N = p->kvq_anchor;
    for (size_t t = 0; t < ntok; t++) {
        uint8_t *rec = records + t * stride;
        for (size_t j = 0; j < n; j++)
            s.x[j] = dq__load_elem(x, dtype, t * n + j);
        int anchor = !delta_on(c) || t % N == 0;
        if (!anchor) {
            for (size_t j = 0; j < n; j++)
                s.cur[j] = s.x[j] - s.prev[j];
            if (p->kvq_tau > 0 && sumsq(s.cur, n) > (double)p->kvq_tau * p->kvq_tau * sumsq(s.x, n))
                anchor = 1;
        }
        DQ_FORWARD_IF_ERROR(enc_token(c, &s, kind, anchor ? s.x : s.cur, rec));
        if (delta_on(c) && anchor)
            rec[1] |= 0x80u;
        if (!delta_on(c) && !lowrank)
            continue;
        dec_token(c, &s, kind, rec, s.cur);
        if (!anchor)
            for (size_t j = 0; j < n; j++)
                s.cur[j] += s.prev[j];
        memcpy(s.prev, s.cur, n * sizeof(float));
        if (lowrank) {
            for (size_t j = 0; j < n; j++)
                s.X[t * n + j] = s.x[j] - s.cur[j];
        }
    }
    if (!lowrank)
        return DQ_OK;
    /* V_r of the residual (rows of s.svt), stored in fp16; U_s = E·V_rᵀ against the stored V_r */
    const uint32_t R = p->kvq_rank, rk = ntok < R ? (uint32_t)ntok : R;
    memset(header, 0, c->mean_bytes);
    if (sumsq(s.X, ntok * n) > 0)
        DQ_FORWARD_IF_ERROR(dq_kvq_rsvd(s.X, (uint32_t)ntok, (uint32_t)n, rk, 2, p->rotation_seed, s.su, s.ss, s.svt));
    else
        memset(s.svt, 0, sizeof(float) * rk * n);
    for (size_t i = 0; i < (size_t)rk * n; i++) {
        uint16_t v = dq_f32_to_f16(s.svt[i]);
        DQ_RETURN_IF((v & 0x7c00u) == 0x7c00u, DQ_RANGE);
        dq__put_u16(header + 2 * i, v);
        s.svt[i] = dq_f16_to_f32(v);
    }
    for (size_t t = 0; t < ntok; t++) {
        uint8_t *lr = records + t * stride + c->kvq_off_lr[0];
        for (uint32_t r = 0; r < rk; r++) {
            double a = 0;
            for (size_t j = 0; j < n; j++)
                a += (double)s.X[t * n + j] * s.svt[(size_t)r * n + j];
            uint16_t v = dq_f64_to_f16(a);
            DQ_RETURN_IF((v & 0x7c00u) == 0x7c00u, DQ_RANGE);
            dq__put_u16(lr + 2 * r, v);
        }
    }
    return DQ_OK;
}

int dq__kvq_decode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const uint8_t *header, const uint8_t *records,
                   size_t stride, size_t first, size_t count, void *out, dq_dtype dtype, int lowrank)
{
    const dq_profile *p = &c->profile;
    const size_t n = c->n;
    DQ_RETURN_IF(!ws->kvq, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(c->kvq_parts == 2 && !c->kvq_perm[kind], DQ_PROFILE);
    DQ_RETURN_IF(p->kvq_variant == DQ_KVQ_PQ && !c->kvq_pq[kind], DQ_PROFILE);
    if (!count)
        return DQ_OK;
    kvq_scratch s;
    scratch(c, ws, &s);
    size_t start = first;
    if (delta_on(c)) {
        while (start > 0 && !rec_anchor(records + start * stride))
            start--;
        DQ_RETURN_IF(!rec_anchor(records + start * stride), DQ_CORRUPT);
    }
    const uint32_t R = kind == DQ_KIND_K && lowrank && header ? p->kvq_rank : 0;
    const size_t esz = dq_dtype_size(dtype);
    for (size_t t = start; t < first + count; t++) {
        const uint8_t *rec = records + t * stride;
        dec_token(c, &s, kind, rec, s.cur);
        if (delta_on(c) && !rec_anchor(rec))
            for (size_t j = 0; j < n; j++)
                s.cur[j] += s.prev[j];
        if (delta_on(c))
            memcpy(s.prev, s.cur, n * sizeof(float));
        if (t < first)
            continue;
        float *o = s.cur;
        if (R) {
            o = s.x;
            memcpy(o, s.cur, n * sizeof(float));
            for (uint32_t r = 0; r < R; r++) {
                const float u = get16f(rec + c->kvq_off_lr[0] + 2 * r);
                if (u == 0)
                    continue;
                const uint8_t *vr = header + 2 * (size_t)r * n;
                for (size_t j = 0; j < n; j++)
                    o[j] += u * get16f(vr + 2 * j);
            }
        }
        DQ_FORWARD_IF_ERROR(dq_convert(o, DQ_DTYPE_F32, (uint8_t *)out + (t - first) * n * esz, dtype, n));
    }
    return DQ_OK;
}

static inline int f16_finite(const uint8_t *p)
{
    return (dq__get_u16(p) & 0x7c00u) != 0x7c00u;
}

int dq__kvq_window_check(const dq_codec *c, const uint8_t *window)
{
    const dq_profile *p = &c->profile;
    const size_t W = p->window, H = p->kv_heads;
    for (size_t i = 0; i < c->mean_bytes; i += 2)
        DQ_RETURN_IF(!f16_finite(window + i), DQ_CORRUPT);
    for (int kind = 0; kind < 2; kind++)
        for (size_t t = 0; t < W; t++) {
            const uint8_t *rec = dq_window_record(c, window, (dq_kind)kind, t);
            DQ_RETURN_IF(t == 0 && delta_on(c) && !rec_anchor(rec), DQ_CORRUPT);
            DQ_RETURN_IF(!delta_on(c) && rec_anchor(rec), DQ_CORRUPT);
            for (size_t i = 0; i < H * c->kvq_parts; i++) {
                const uint16_t v = dq__get_u16(rec + 2 * i);
                DQ_RETURN_IF(!f16_finite(rec + 2 * i) || (i > 0 && (v & 0x8000u)), DQ_CORRUPT);
            }
            for (size_t off = c->kvq_off_rnorm[kind]; off < c->kvq_off_bits[kind]; off += 2)
                DQ_RETURN_IF(!f16_finite(rec + off), DQ_CORRUPT);
            for (size_t off = c->kvq_off_rnorm[kind]; off < c->kvq_off_lr[kind]; off += 2)
                DQ_RETURN_IF(dq__get_u16(rec + off) & 0x8000u, DQ_CORRUPT);
        }
    return DQ_OK;
}

/* ---- attention ---- */

int dq__kvq_window_logits(const dq_codec *c, dq_workspace *ws, const uint8_t *window, const float *q, uint32_t qh0,
                          uint32_t qn, uint32_t G, float scale, float *logit, size_t ld)
{
    const dq_profile *p = &c->profile;
    const uint32_t n = c->n, d = c->head_dim, W = p->window;
    const size_t rb = c->record_bytes[0];
    const uint8_t *hdr = c->mean_bytes ? dq_window_mean(c, window) : NULL;
    const uint8_t *krec = dq_window_record(c, window, DQ_KIND_K, 0);
    kvq_scratch s;
    scratch(c, ws, &s);
    if (p->kvq_variant == DQ_KVQ_PQ) {
        DQ_RETURN_IF(!c->kvq_pq[0], DQ_PROFILE);
        /* per query head: the rotated query's dot products with every codebook entry, then a
         * token's score is its norm times the sum of M table entries (deltas accumulate) */
        const uint32_t M = p->kvq_pq_m, B = p->bits[0], K = 1u << B, ds = d / M;
        for (uint32_t h = 0; h < qn; h++) {
            const uint32_t kv = (qh0 + h) / G;
            dq__kvq_head_forward(c, DQ_KIND_K, kv, q + (size_t)(qh0 + h) * d, s.hy, s.ht);
            for (uint32_t m = 0; m < M; m++)
                for (uint32_t k = 0; k < K; k++) {
                    const float *e = c->kvq_pq[0] + ((size_t)m * K + k) * ds;
                    float a = 0;
                    for (uint32_t i = 0; i < ds; i++)
                        a += s.hy[m * ds + i] * e[i];
                    s.lut[(size_t)m * K + k] = a;
                }
            float prev = 0;
            for (uint32_t t = 0; t < W; t++) {
                const uint8_t *rec = krec + (size_t)t * rb;
                size_t pos = c->kvq_off_bits[0] * 8 + (size_t)kv * c->kvq_head_bits[0];
                float a = 0;
                for (uint32_t m = 0; m < M; m++, pos += B)
                    a += s.lut[(size_t)m * K + get_bits(rec, pos, B)];
                a *= rec_norm(c, rec, kv, 0);
                if (delta_on(c) && !rec_anchor(rec))
                    a += prev;
                prev = a;
                logit[(size_t)h * ld + t] = a;
            }
        }
    } else {
        /* in the rotated domain of each head: q_rot · ŷ, and for IP keys the QJL term
         * nf·g·(S·q_rot)·z, so that S is applied once per query head instead of once per token */
        const int ip = c->kvq_ip[0];
        const float g0 = (float)(sqrt(M_PI / 2) / d);
        float *qr = s.lut, *qs = s.lut + d;
        for (uint32_t h = 0; h < qn; h++) {
            const uint32_t kv = (qh0 + h) / G;
            dq__kvq_head_forward(c, DQ_KIND_K, kv, q + (size_t)(qh0 + h) * d, qr, s.ht);
            if (ip)
                dq_kvq_qjl_project(c->kvq_qjl, d, qr, qs);
            float prev = 0;
            for (uint32_t t = 0; t < W; t++) {
                const uint8_t *rec = krec + (size_t)t * rb;
                dec_head(c, DQ_KIND_K, kv, rec, s.hy, s.ht, 0);
                float a = 0;
                for (uint32_t j = 0; j < d; j++)
                    a += qr[j] * s.hy[j];
                if (ip) {
                    size_t pos = c->kvq_off_bits[0] * 8 + (size_t)kv * c->kvq_head_bits[0] +
                                 (size_t)d * c->kvq_pbits[0][0];
                    float z = 0;
                    for (uint32_t i = 0; i < d; i++, pos++)
                        z += get_bits(rec, pos, 1) ? qs[i] : -qs[i];
                    a += rec_norm(c, rec, kv, 0) * g0 * get16f(rec + c->kvq_off_rnorm[0] + 2 * kv) * z;
                }
                if (delta_on(c) && !rec_anchor(rec))
                    a += prev;
                prev = a;
                logit[(size_t)h * ld + t] = a;
            }
        }
    }
    if (delta_on(c) && !rec_anchor(krec))
        return DQ_CORRUPT;
    if (p->kvq_rank && hdr) {
        /* + (q·V_rᵀ)·U_sᵀ: R dot products per query head, then R terms per token */
        const uint32_t R = p->kvq_rank;
        for (uint32_t h = 0; h < qn; h++) {
            const uint32_t kv = (qh0 + h) / G;
            const float *qq = q + (size_t)(qh0 + h) * d;
            for (uint32_t r = 0; r < R; r++) {
                const uint8_t *vr = hdr + 2 * ((size_t)r * n + (size_t)kv * d);
                float a = 0;
                for (uint32_t j = 0; j < d; j++)
                    a += qq[j] * get16f(vr + 2 * j);
                s.ss[r] = a;
            }
            for (uint32_t t = 0; t < W; t++) {
                const uint8_t *lr = krec + (size_t)t * rb + c->kvq_off_lr[0];
                float a = 0;
                for (uint32_t r = 0; r < R; r++)
                    a += s.ss[r] * get16f(lr + 2 * r);
                logit[(size_t)h * ld + t] += a;
            }
        }
    }
    for (uint32_t h = 0; h < qn; h++)
        for (uint32_t t = 0; t < W; t++)
            logit[(size_t)h * ld + t] *= scale;
    return DQ_OK;
}
