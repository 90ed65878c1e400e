/* The fixed-width family (dquant/profile.h dq_profile_fixed, codec_type DQ_CODEC_FIXED): profile
 * names, validation, the base-M packing of a stream's levels and its encoder.
 *
 * Everything else is D-Quant's: the rotation, the INT8 key window mean and the record layout
 * (tokens.c), the reconstruction o + s·m (+ μ) and attention on the levels (attention.c), the hot
 * layout (hot.c). Only the container differs: levels on a per-token min–max grid of M levels,
 * packed in groups of k as base-M numbers of w bits, instead of rANS symbols. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "dsp.h"

#define FX_MAX_LEVELS 256u

uint32_t dq_fixed_packing(uint32_t n, uint32_t levels, uint32_t *k, uint32_t *w)
{
    if (n == 0 || levels < DQ_MIN_LEVELS || levels > FX_MAX_LEVELS)
        return 0;
    uint32_t best_c = 0, best_k = 0, best_w = 0;
    uint64_t pw = 1; /* M^kk */
    for (uint32_t kk = 1;; kk++) {
        pw *= levels;
        if (pw > (1ull << 32))
            break;
        uint32_t ww = 0;
        while ((1ull << ww) < pw)
            ww++;
        const uint64_t groups = ((uint64_t)n + kk - 1) / kk;
        const uint64_t c = (groups * ww + 7) / 8;
        if (best_c == 0 || c < best_c) {
            best_c = (uint32_t)(c > UINT32_MAX ? UINT32_MAX : c);
            best_k = kk;
            best_w = ww;
        }
    }
    if (k)
        *k = best_k;
    if (w)
        *w = best_w;
    return best_c;
}

int dq__fixed_validate(const dq_profile *p)
{
    DQ_RETURN_IF(p->codec_type != DQ_CODEC_FIXED, DQ_PROFILE);
    DQ_RETURN_IF(p->bits[0] || p->bits[1] || p->group || p->rotate || p->alpha != 0, DQ_PROFILE);
    const uint32_t n = p->kv_heads * p->head_dim;
    for (int k = 0; k < 2; k++) {
        DQ_RETURN_IF(p->levels[k] < DQ_MIN_LEVELS || p->levels[k] > FX_MAX_LEVELS, DQ_PROFILE);
        for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++)
            DQ_RETURN_IF(p->freq[k][m] != 0, DQ_PROFILE);
        const uint32_t c = dq_fixed_packing(n, p->levels[k], NULL, NULL);
        DQ_RETURN_IF(c == 0 || c > DQ_MAX_CONTAINER || p->container_bytes[k] != c, DQ_PROFILE);
    }
    return DQ_OK;
}

void dq__fixed_setup(dq_codec *c)
{
    for (int k = 0; k < 2; k++) {
        dq__kind_tables *kt = &c->kt[k];
        memset(kt, 0, sizeof *kt);
        kt->levels = c->profile.levels[k];
        kt->container = dq_fixed_packing(c->n, kt->levels, &c->fx_k[k], &c->fx_w[k]);
        uint64_t pw = 1;
        for (uint32_t i = 0; i < c->fx_k[k]; i++)
            pw *= kt->levels;
        c->fx_pow[k] = pw;
        c->record_bytes[k] = 4u + kt->container;
    }
    c->mean_bytes = 2u + c->n;
}

int dq_profile_fixed_make(const dq_profile_params *params, dq_profile *out)
{
    DQ_RETURN_IF(!params || !out, DQ_INVALID_ARGUMENT);
    dq_profile p;
    memset(&p, 0, sizeof p);
    p.format_version = DQ_FORMAT_VERSION;
    snprintf(p.name, sizeof p.name, "%s", params->name ? params->name : "fixed");
    p.codec_type = DQ_CODEC_FIXED;
    p.kv_heads = params->kv_heads;
    p.head_dim = params->head_dim;
    p.window = params->window;
    p.residual = params->residual;
    p.rotation_seed = params->rotation_seed;
    const uint64_t n = (uint64_t)p.kv_heads * p.head_dim;
    DQ_RETURN_IF(n == 0 || n > DQ_MAX_STREAM, DQ_PROFILE);
    for (int k = 0; k < 2; k++) {
        p.levels[k] = params->levels[k];
        p.container_bytes[k] = dq_fixed_packing((uint32_t)n, p.levels[k], NULL, NULL);
    }
    DQ_FORWARD_IF_ERROR(dq_profile_validate(&p));
    *out = p;
    return DQ_OK;
}

static int parse_levels(const char *s, uint32_t *m, const char **end)
{
    char *e = NULL;
    if (*s < '0' || *s > '9')
        return 0;
    unsigned long v = strtoul(s, &e, 10);
    if (e == s || v < DQ_MIN_LEVELS || v > FX_MAX_LEVELS)
        return 0;
    *m = (uint32_t)v;
    *end = e;
    return 1;
}

int dq_profile_fixed(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    DQ_RETURN_IF(!name || !out, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(strncmp(name, "fixed", 5) != 0, DQ_PROFILE);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = kv_heads;
    pp.head_dim = head_dim;
    pp.name = name;
    const char *s = name + 5, *e = NULL;
    if (s[0] == 'k') {
        DQ_RETURN_IF(!parse_levels(s + 1, &pp.levels[0], &e) || e[0] != 'v', DQ_PROFILE);
        DQ_RETURN_IF(!parse_levels(e + 1, &pp.levels[1], &e) || *e, DQ_PROFILE);
        return dq_profile_fixed_make(&pp, out);
    }
    /* the D-Quant profile of the same storage: its containers at this shape set the levels */
    char dq_name[DQ_PROFILE_NAME_MAX];
    DQ_RETURN_IF(snprintf(dq_name, sizeof dq_name, "dq%s", s) >= (int)sizeof dq_name, DQ_PROFILE);
    const char *const *names = dq_profile_builtin_names();
    size_t i = 0;
    while (names[i] && strcmp(names[i], dq_name) != 0)
        i++;
    DQ_RETURN_IF(!names[i], DQ_PROFILE);
    dq_profile ref;
    DQ_FORWARD_IF_ERROR(dq_profile_builtin(dq_name, kv_heads, head_dim, &ref));
    return dq_profile_fixed_matched(&ref, name, out);
}

int dq_profile_fixed_matched(const dq_profile *dquant, const char *name, dq_profile *out)
{
    DQ_RETURN_IF(!dquant || !out, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(dquant->codec_type != DQ_CODEC_DQUANT || dq_profile_validate(dquant) != DQ_OK, DQ_PROFILE);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = dquant->kv_heads;
    pp.head_dim = dquant->head_dim;
    pp.name = name;
    const double n = (double)dquant->kv_heads * dquant->head_dim;
    for (int k = 0; k < 2; k++) {
        const double rate = 8.0 * dquant->container_bytes[k] / n;
        /* 2^rate is exact when rate is an integer; otherwise floor is far from any boundary */
        const double m = rate >= 8.0 ? (double)FX_MAX_LEVELS : floor(exp2(rate));
        DQ_RETURN_IF(m < DQ_MIN_LEVELS, DQ_PROFILE);
        pp.levels[k] = (uint32_t)m;
    }
    pp.window = dquant->window;
    pp.residual = dquant->residual;
    pp.rotation_seed = dquant->rotation_seed;
    return dq_profile_fixed_make(&pp, out);
}

const char *const *dq_profile_fixed_names(void)
{
    static const char *const names[] = {"fixed226", "fixed196", NULL};
    return names;
}

/* ---- the stream coder ---- */

static void assign_nearest(const float *y, uint32_t n, double s, double o, uint32_t top, uint8_t *m)
{
    for (uint32_t i = 0; i < n; i++) {
        const double q = s > 0 ? nearbyint(((double)y[i] - o) / s) : 0.0;
        m[i] = (uint8_t)(q < 0 ? 0 : q > top ? top : q);
    }
}

/* v (below 2^32) at bit pos of a little-endian bit string (the caller zeroed its bits). */
static void put_bits(uint8_t *buf, uint64_t pos, uint32_t v)
{
    uint64_t x = (uint64_t)v << (pos % 8);
    for (uint8_t *p = buf + pos / 8; x; p++, x >>= 8)
        *p |= (uint8_t)x;
}

static uint32_t get_bits(const uint8_t *buf, uint64_t pos, uint32_t w)
{
    const uint8_t *p = buf + pos / 8;
    const uint32_t sh = (uint32_t)(pos % 8), nbytes = (sh + w + 7) / 8;
    uint64_t x = 0;
    for (uint32_t i = 0; i < nbytes; i++)
        x |= (uint64_t)p[i] << (8 * i);
    return (uint32_t)((x >> sh) & ((1ull << w) - 1));
}

void dq__fixed_pack(const dq_codec *c, dq_kind kind, const uint8_t *lev, uint8_t *container)
{
    const uint32_t n = c->n, K = c->fx_k[kind], w = c->fx_w[kind], M = c->kt[kind].levels;
    memset(container, 0, c->kt[kind].container);
    uint64_t pos = 0;
    for (uint32_t g0 = 0; g0 < n; g0 += K, pos += w) {
        const uint32_t cnt = n - g0 < K ? n - g0 : K;
        uint64_t v = 0;
        for (uint32_t i = cnt; i-- > 0;)
            v = v * M + lev[g0 + i];
        put_bits(container, pos, (uint32_t)v);
    }
}

int dq__fixed_unpack(const dq_codec *c, dq_kind kind, const uint8_t *container, uint8_t *levels)
{
    const uint32_t n = c->n, K = c->fx_k[kind], w = c->fx_w[kind], M = c->kt[kind].levels;
    int bad = 0;
    uint64_t pos = 0;
    for (uint32_t g0 = 0; g0 < n; g0 += K, pos += w) {
        const uint32_t cnt = n - g0 < K ? n - g0 : K;
        uint32_t v = get_bits(container, pos, w);
        for (uint32_t i = 0; i < cnt; i++) {
            levels[g0 + i] = (uint8_t)(v % M);
            v /= M;
        }
        bad |= v != 0; /* the group's value is not a number of cnt base-M digits */
    }
    /* the bits past the last group are zero (C is the groups' bytes: no byte lies past them) */
    if (pos % 8)
        bad |= (container[pos / 8] >> (pos % 8)) != 0;
    return bad ? DQ_CORRUPT : DQ_OK;
}

int dq__fixed_stream_encode(const dq_codec *c, dq_kind kind, const float *y, uint8_t *record, dq_encode_stats *stats,
                            uint8_t *levels)
{
    const uint32_t n = c->n, M = c->kt[kind].levels, top = M - 1;
    float lo = y[0], hi = y[0];
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(y[i]))
            return DQ_NONFINITE;
        lo = fminf(lo, y[i]);
        hi = fmaxf(hi, y[i]);
    }
    DQ_RETURN_IF(!(fabsf(lo) <= DQ_STREAM_MAX_ABS) || !(fabsf(hi) <= DQ_STREAM_MAX_ABS), DQ_RANGE);
    /* min–max grid, nearest levels, then the least-squares (s, o) of those levels */
    uint8_t small[256];
    uint8_t *m = levels ? levels : small;
    uint8_t *heap = NULL;
    if (!levels && n > sizeof small) {
        heap = dq__alloc(&c->alloc, n);
        DQ_RETURN_IF(!heap, DQ_NOMEM);
        m = heap;
    }
    const double s0 = ((double)hi - lo) / top, o0 = lo;
    double s = s0, o = o0;
    assign_nearest(y, n, s, o, top, m);
    double sm = 0, sy = 0, smm = 0, smy = 0;
    for (uint32_t i = 0; i < n; i++) {
        sm += m[i];
        sy += y[i];
        smm += (double)m[i] * m[i];
        smy += (double)m[i] * y[i];
    }
    const double var = smm - sm * sm / n;
    if (var > 0) {
        s = (smy - sm * sy / n) / var;
        o = (sy - s * sm) / n;
    } else {
        s = 0;
        o = sy / n;
    }
    if (s < 0) { /* levels are monotone in y, so cov(m, y) >= 0; a rounding below 0 is no slope */
        s = 0;
        o = sy / n;
    }
    uint16_t sh = dq_f64_to_f16(s), oh = dq_f64_to_f16(o);
    if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
        /* a degenerate refit outside fp16: the min–max grid always fits (|y| <= 30000) */
        sh = dq_f64_to_f16(s0);
        oh = dq_f64_to_f16(o0);
    }
    if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
        dq__free(&c->alloc, heap);
        return DQ_RANGE;
    }
    sh &= 0x7fffu; /* s >= 0; never store -0 */
    const float sf = dq_f16_to_f32(sh), of = dq_f16_to_f32(oh);
    assign_nearest(y, n, sf, of, top, m);
    dq__put_u16(record, sh);
    dq__put_u16(record + 2, oh);
    dq__fixed_pack(c, kind, m, record + 4);
    if (stats) {
        const uint32_t C = c->kt[kind].container;
        stats->streams++;
        stats->payload_bytes += C;
        if (C > stats->max_payload_bytes)
            stats->max_payload_bytes = C;
    }
    dq__free(&c->alloc, heap);
    return DQ_OK;
}

size_t dq__levels_decode(const dq_codec *c, dq_kind kind, const uint8_t *records, size_t stride, size_t count,
                         uint8_t *levels)
{
    const dq__kind_tables *kt = &c->kt[kind];
    if (c->profile.codec_type == DQ_CODEC_DQUANT && !kt->pairs)
        return dq__dsp_get()->decode_levels(&kt->dec, records, stride, count, kt->container, c->n, levels);
    size_t bad = 0;
    for (size_t t = 0; t < count; t++) {
        const uint8_t *container = records + t * stride + 4;
        uint8_t *lev = levels + t * c->n;
        bad += (kt->pairs ? dq__kt_decode(kt, container, c->n, lev) : dq__fixed_unpack(c, kind, container, lev)) !=
               DQ_OK;
    }
    return bad;
}
