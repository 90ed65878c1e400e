/* The baselines D-Quant is compared with (DESIGN §2.8), in the same storage model: fixed-size
 * records per token and kind, a key window header per W tokens, the BF16 tail of the layer.
 * Every stored byte is counted in bits/value.
 *
 *   bf16     record: n BF16 values
 *   int      record: per group of `group` channels fp16 scale + fp16 zero, then n·b bits
 *            (rotate = 1: per-head Hadamard first, QuaRot-style)
 *   kivi     keys: window header = per channel fp16 scale[n] + fp16 zero[n] over the window's
 *            tokens, record = n·b bits; values as int (per token, groups of `group` channels)
 *   turbo    keys: per head fp16 norm, then n·b bits of a Lloyd–Max codebook for N(0,1) applied to
 *            the rotated, norm-scaled coordinates (TurboQuant-MSE); values as int
 * Symbols are packed LSB first. Rounding is to nearest (ties to even); scales and zeros are fp16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"

static int parse_bits(const char *s, uint32_t *bits)
{
    if (!*s || s[1] || *s < '1' || *s > '8')
        return -1;
    *bits = (uint32_t)(*s - '0');
    return 0;
}

int dq__baseline_profile(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    static const struct {
        const char *prefix;
        uint32_t type, rotate;
    } kinds[] = {
        {"int", DQ_CODEC_INT, 0},
        {"quarot", DQ_CODEC_INT, 1},
        {"kivi", DQ_CODEC_KIVI, 0},
        {"turbo", DQ_CODEC_TURBO, 1},
    };
    dq_profile p;
    memset(&p, 0, sizeof p);
    uint32_t bits = 16;
    if (strcmp(name, "bf16") == 0) {
        p.codec_type = DQ_CODEC_BF16;
    } else {
        size_t i;
        for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
            size_t l = strlen(kinds[i].prefix);
            if (strncmp(name, kinds[i].prefix, l) == 0 && parse_bits(name + l, &bits) == 0) {
                p.codec_type = kinds[i].type;
                p.rotate = kinds[i].rotate;
                break;
            }
        }
        DQ_RETURN_IF(i == sizeof kinds / sizeof kinds[0], DQ_PROFILE);
    }
    p.format_version = DQ_FORMAT_VERSION;
    snprintf(p.name, sizeof p.name, "%s", name);
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.window = p.residual = 128;
    p.rotation_seed = 0x5eed;
    p.bits[0] = p.bits[1] = bits;
    const uint32_t n = kv_heads * head_dim;
    p.group = n < 128 ? n : 128;
    for (int k = 0; k < 2; k++) {
        p.levels[k] = bits >= 16 ? 0 : 1u << bits;
        p.container_bytes[k] = (uint32_t)dq__baseline_record_bytes(&p, k);
    }
    int rc = dq__baseline_validate(&p);
    if (rc == DQ_OK)
        *out = p;
    return rc;
}

static size_t packed_bytes(size_t n, uint32_t bits)
{
    return (n * bits + 7) / 8;
}

size_t dq__baseline_record_bytes(const dq_profile *p, int kind)
{
    const size_t n = (size_t)p->kv_heads * p->head_dim;
    const size_t groups = p->group ? (n + p->group - 1) / p->group : 0;
    switch (p->codec_type) {
    case DQ_CODEC_BF16:
        return 2 * n;
    case DQ_CODEC_KIVI:
        return kind == DQ_KIND_K ? packed_bytes(n, p->bits[0]) : 4 * groups + packed_bytes(n, p->bits[1]);
    case DQ_CODEC_TURBO:
        return kind == DQ_KIND_K ? 2 * (size_t)p->kv_heads + packed_bytes(n, p->bits[0])
                                 : 4 * groups + packed_bytes(n, p->bits[1]);
    case DQ_CODEC_INT:
    default:
        return 4 * groups + packed_bytes(n, p->bits[kind]);
    }
}

size_t dq__baseline_header_bytes(const dq_profile *p)
{
    return p->codec_type == DQ_CODEC_KIVI ? 4 * (size_t)p->kv_heads * p->head_dim : 0;
}

int dq__baseline_validate(const dq_profile *p)
{
    DQ_RETURN_IF(p->codec_type > DQ_CODEC_TURBO || p->codec_type == DQ_CODEC_DQUANT, DQ_PROFILE);
    const uint32_t n = p->kv_heads * p->head_dim;
    if (p->codec_type != DQ_CODEC_BF16) {
        for (int k = 0; k < 2; k++)
            if (p->bits[k] < 1 || p->bits[k] > 8 || p->levels[k] != 1u << p->bits[k])
                return DQ_PROFILE;
        DQ_RETURN_IF(!p->group || p->group > n || n % p->group, DQ_PROFILE);
    }
    DQ_RETURN_IF(p->rotate > 1 || p->alpha != 0, DQ_PROFILE);
    for (int k = 0; k < 2; k++) {
        DQ_RETURN_IF(p->container_bytes[k] != dq__baseline_record_bytes(p, k), DQ_PROFILE);
        for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++)
            if (p->freq[k][m])
                return DQ_PROFILE;
    }
    return DQ_OK;
}

/* Lloyd–Max quantizer for N(0,1) with L levels: alternate nearest-centroid thresholds and
 * conditional means until it settles. */
static void lloyd_max(uint32_t L, float *c_out, float *t_out)
{
    double c[256], t[257];
    for (uint32_t i = 0; i < L; i++)
        c[i] = -2.5 + 5.0 * (i + 0.5) / L;
    for (int it = 0; it < 2000; it++) {
        t[0] = -INFINITY;
        t[L] = INFINITY;
        for (uint32_t i = 1; i < L; i++)
            t[i] = 0.5 * (c[i - 1] + c[i]);
        for (uint32_t i = 0; i < L; i++) {
            double a = t[i], b = t[i + 1];
            double pa = isinf(a) ? 0 : exp(-0.5 * a * a), pb = isinf(b) ? 0 : exp(-0.5 * b * b);
            double mass = 0.5 * (erfc(-b * M_SQRT1_2) - erfc(-a * M_SQRT1_2));
            if (mass > 1e-300)
                c[i] = (pa - pb) / (sqrt(2 * M_PI) * mass);
        }
    }
    for (uint32_t i = 0; i < L; i++)
        c_out[i] = (float)c[i];
    for (uint32_t i = 1; i < L; i++)
        t_out[i - 1] = (float)(0.5 * (c[i - 1] + c[i]));
}

void dq__baseline_setup(dq_codec *c)
{
    const dq_profile *p = &c->profile;
    c->group = p->group;
    for (int k = 0; k < 2; k++)
        c->record_bytes[k] = dq__baseline_record_bytes(p, k);
    c->mean_bytes = dq__baseline_header_bytes(p);
    if (p->codec_type == DQ_CODEC_TURBO)
        lloyd_max(1u << p->bits[0], c->lm_c, c->lm_t);
}

/* ---- bit packing and fp16 fields ---- */

static void pack(uint8_t *dst, const uint8_t *sym, size_t n, uint32_t bits)
{
    memset(dst, 0, packed_bytes(n, bits));
    size_t pos = 0;
    for (size_t i = 0; i < n; i++, pos += bits)
        for (uint32_t b = 0; b < bits; b++)
            if (sym[i] >> b & 1u)
                dst[(pos + b) >> 3] |= (uint8_t)(1u << ((pos + b) & 7));
}

static void unpack(const uint8_t *src, uint8_t *sym, size_t n, uint32_t bits)
{
    size_t pos = 0;
    for (size_t i = 0; i < n; i++, pos += bits) {
        uint32_t v = 0;
        for (uint32_t b = 0; b < bits; b++)
            v |= (uint32_t)(src[(pos + b) >> 3] >> ((pos + b) & 7) & 1u) << b;
        sym[i] = (uint8_t)v;
    }
}

static inline float get16f(const uint8_t *p)
{
    return dq_f16_to_f32(dq__get_u16(p));
}

static inline uint8_t quant(float x, float zero, float scale, uint32_t top)
{
    if (!(scale > 0))
        return 0;
    float q = rintf((x - zero) / scale);
    if (q < 0)
        q = 0;
    if (q > (float)top)
        q = (float)top;
    return (uint8_t)q;
}

/* Per-token affine INT-b over groups of g channels: meta (4 bytes per group) then packed symbols. */
static int int_encode_token(const float *x, size_t n, uint32_t g, uint32_t bits, uint8_t *rec, uint8_t *sym)
{
    const uint32_t top = (1u << bits) - 1;
    const size_t groups = n / g;
    for (size_t gi = 0; gi < groups; gi++) {
        const float *xg = x + gi * g;
        float mn = xg[0], mx = xg[0];
        for (uint32_t j = 1; j < g; j++) {
            mn = fminf(mn, xg[j]);
            mx = fmaxf(mx, xg[j]);
        }
        uint16_t sh = dq_f32_to_f16((mx - mn) / (float)top), zh = dq_f32_to_f16(mn);
        DQ_RETURN_IF((sh & 0x7c00u) == 0x7c00u || (zh & 0x7c00u) == 0x7c00u, DQ_RANGE);
        dq__put_u16(rec + 4 * gi, sh);
        dq__put_u16(rec + 4 * gi + 2, zh);
        float sf = dq_f16_to_f32(sh), zf = dq_f16_to_f32(zh);
        for (uint32_t j = 0; j < g; j++)
            sym[gi * g + j] = quant(xg[j], zf, sf, top);
    }
    pack(rec + 4 * groups, sym, n, bits);
    return DQ_OK;
}

static void int_decode_token(const uint8_t *rec, size_t n, uint32_t g, uint32_t bits, float *y, uint8_t *sym)
{
    const size_t groups = n / g;
    unpack(rec + 4 * groups, sym, n, bits);
    for (size_t gi = 0; gi < groups; gi++) {
        float sf = get16f(rec + 4 * gi), zf = get16f(rec + 4 * gi + 2);
        for (uint32_t j = 0; j < g; j++)
            y[gi * g + j] = zf + sf * (float)sym[gi * g + j];
    }
}

int dq__baseline_encode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const void *x, dq_dtype dtype, size_t ntok,
                        uint8_t *header, uint8_t *records, size_t stride)
{
    const dq_profile *p = &c->profile;
    const size_t n = c->n, d = c->head_dim;
    const uint32_t bits = p->bits[kind];
    float *y = ws->f0;
    uint8_t *sym = ws->b0;
    DQ_FORWARD_IF_ERROR(dq_check_finite(x, dtype, ntok * n));
    if (p->codec_type == DQ_CODEC_KIVI && kind == DQ_KIND_K) {
        /* per channel over the window's tokens */
        const uint32_t top = (1u << bits) - 1;
        DQ_RETURN_IF(!header || ntok < 1 || ntok > p->window, DQ_SHAPE);
        for (size_t j = 0; j < n; j++) {
            float mn = dq__load_elem(x, dtype, j), mx = mn;
            for (size_t t = 1; t < ntok; t++) {
                float v = dq__load_elem(x, dtype, t * n + j);
                mn = fminf(mn, v);
                mx = fmaxf(mx, v);
            }
            uint16_t sh = dq_f32_to_f16((mx - mn) / (float)top), zh = dq_f32_to_f16(mn);
            DQ_RETURN_IF((sh & 0x7c00u) == 0x7c00u || (zh & 0x7c00u) == 0x7c00u, DQ_RANGE);
            dq__put_u16(header + 2 * j, sh);
            dq__put_u16(header + 2 * n + 2 * j, zh);
        }
        for (size_t t = 0; t < ntok; t++) {
            for (size_t j = 0; j < n; j++)
                sym[j] = quant(dq__load_elem(x, dtype, t * n + j), get16f(header + 2 * n + 2 * j),
                               get16f(header + 2 * j), top);
            pack(records + t * stride, sym, n, bits);
        }
        return DQ_OK;
    }
    if (p->codec_type == DQ_CODEC_BF16 && dtype == DQ_DTYPE_BF16) {
        /* the values are already what the records hold (finite: checked above) */
        const uint16_t *xb = x;
        for (size_t t = 0; t < ntok; t++)
            for (size_t j = 0; j < n; j++)
                dq__put_u16(records + t * stride + 2 * j, xb[t * n + j]);
        return DQ_OK;
    }
    for (size_t t = 0; t < ntok; t++) {
        uint8_t *rec = records + t * stride;
        for (size_t j = 0; j < n; j++)
            y[j] = dq__load_elem(x, dtype, t * n + j);
        switch (p->codec_type) {
        case DQ_CODEC_BF16:
            for (size_t j = 0; j < n; j++)
                dq__put_u16(rec + 2 * j, dq__f32_bf16(y[j]));
            break;
        case DQ_CODEC_TURBO:
            if (kind == DQ_KIND_K) {
                dq_rotate(c, y);
                const uint32_t L = 1u << bits;
                for (size_t h = 0; h < p->kv_heads; h++) {
                    float *yh = y + h * d;
                    double ss = 0;
                    for (size_t j = 0; j < d; j++)
                        ss += (double)yh[j] * yh[j];
                    uint16_t nh = dq_f64_to_f16(sqrt(ss));
                    DQ_RETURN_IF((nh & 0x7c00u) == 0x7c00u, DQ_RANGE);
                    dq__put_u16(rec + 2 * h, nh);
                    float nf = dq_f16_to_f32(nh), k = nf > 0 ? sqrtf((float)d) / nf : 0.0f;
                    for (size_t j = 0; j < d; j++) {
                        float u = yh[j] * k;
                        uint32_t q = 0;
                        while (q + 1 < L && u > c->lm_t[q])
                            q++;
                        sym[h * d + j] = (uint8_t)q;
                    }
                }
                pack(rec + 2 * p->kv_heads, sym, n, bits);
                break;
            }
            DQ_FORWARD_IF_ERROR(int_encode_token(y, n, c->group, bits, rec, sym));
            break;
        default: /* INT, KIVI values */
            if (p->rotate)
                dq_rotate(c, y);
            DQ_FORWARD_IF_ERROR(int_encode_token(y, n, c->group, bits, rec, sym));
            break;
        }
    }
    return DQ_OK;
}

int dq__baseline_decode(const dq_codec *c, dq_workspace *ws, dq_kind kind, const uint8_t *header,
                        const uint8_t *records, size_t stride, size_t ntok, void *out, dq_dtype dtype)
{
    const dq_profile *p = &c->profile;
    const size_t n = c->n, d = c->head_dim;
    const uint32_t bits = p->bits[kind];
    float *y = ws->f0;
    uint8_t *sym = ws->b0;
    DQ_RETURN_IF(p->codec_type == DQ_CODEC_KIVI && kind == DQ_KIND_K && !header, DQ_INVALID_ARGUMENT);
    for (size_t t = 0; t < ntok; t++) {
        const uint8_t *rec = records + t * stride;
        switch (p->codec_type) {
        case DQ_CODEC_BF16:
            if (dtype == DQ_DTYPE_BF16) { /* the stored values themselves (LE in the record) */
                uint16_t *o = (uint16_t *)out + t * n;
                for (size_t j = 0; j < n; j++)
                    o[j] = dq__get_u16(rec + 2 * j);
                continue;
            }
            for (size_t j = 0; j < n; j++)
                y[j] = dq__bf16_f32(dq__get_u16(rec + 2 * j));
            break;
        case DQ_CODEC_KIVI:
            if (kind == DQ_KIND_K) {
                unpack(rec, sym, n, bits);
                for (size_t j = 0; j < n; j++)
                    y[j] = get16f(header + 2 * n + 2 * j) + get16f(header + 2 * j) * (float)sym[j];
            } else {
                int_decode_token(rec, n, c->group, bits, y, sym);
            }
            break;
        case DQ_CODEC_TURBO:
            if (kind == DQ_KIND_K) {
                unpack(rec + 2 * p->kv_heads, sym, n, bits);
                for (size_t h = 0; h < p->kv_heads; h++) {
                    float k = get16f(rec + 2 * h) / sqrtf((float)d);
                    for (size_t j = 0; j < d; j++)
                        y[h * d + j] = k * c->lm_c[sym[h * d + j]];
                }
                dq_unrotate(c, y);
            } else {
                int_decode_token(rec, n, c->group, bits, y, sym);
            }
            break;
        default:
            int_decode_token(rec, n, c->group, bits, y, sym);
            if (p->rotate)
                dq_unrotate(c, y);
            break;
        }
        DQ_FORWARD_IF_ERROR(dq_convert(y, DQ_DTYPE_F32, (uint8_t *)out + t * n * dq_dtype_size(dtype), dtype, n));
    }
    return DQ_OK;
}
