/* Profiles: creation, built-ins, validation, serialization (the codec objects: codec.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec_internal.h"
#include "dquant/kvq.h"

static const char *const g_builtin_names[] = {"dq226", "dq196", NULL};

typedef struct builtin_def {
    const char *name;
    uint32_t c1024[2]; /* containers at n = 1024 */
    uint32_t levels[2];
} builtin_def;

static const builtin_def g_builtins[] = {
    {"dq226", {331, 231}, {8, 6}},
    {"dq196", {287, 199}, {7, 5}},
};

/* Format version 2 (joint pairs, rans2.h): a built-in name with this suffix is the same profile
 * with format_version 2 ("dq226p", "dq196p"). */
#define DQ_PAIRS_SUFFIX 'p'

void dq_profile_params_default(dq_profile_params *p)
{
    memset(p, 0, sizeof *p);
    p->kv_heads = 8;
    p->head_dim = 128;
    p->container_bytes[0] = 331;
    p->container_bytes[1] = 231;
    p->levels[0] = 8;
    p->levels[1] = 6;
    p->alpha = 1.4f;
    p->window = 128;
    p->residual = 128;
    p->rotation_seed = 0x5eed;
    p->name = "custom";
}

static int is_pow2(uint32_t v)
{
    return v && !(v & (v - 1));
}

/* Container bytes the all-cheapest assignment needs (state + emitted), by running the encoder's
 * renormalization without storing bytes. */
static uint32_t cheapest_bytes(const dq__rans_enc *enc, uint32_t sym, uint32_t n)
{
    uint32_t x = DQ_RANS_L, emitted = 0, f = enc->freq[sym];
    for (uint32_t i = 0; i < n; i++) {
        if (x >= ((DQ_RANS_L >> DQ_RANS_PREC) << 8) * f) {
            emitted++;
            x >>= 8;
        }
        x = ((x / f) << DQ_RANS_PREC) + (x % f) + enc->cum[sym];
    }
    return DQ_RANS_STATE_BYTES + emitted;
}

void dq__kind_tables_init(const dq_profile *p, int kind, dq__kind_tables *kt)
{
    memset(kt, 0, sizeof *kt);
    kt->container = p->container_bytes[kind];
    kt->levels = p->levels[kind];
    kt->budget_q16 = ((uint64_t)kt->container * 8u - 32u) << 16;
    int32_t best = INT32_MAX;
    for (uint32_t m = 0; m < kt->levels; m++) {
        kt->cost_q16[m] = dq__cost_q16(p->freq[kind][m]);
        kt->cost[m] = (float)kt->cost_q16[m] / 65536.0f;
        if (kt->cost_q16[m] < best) {
            best = kt->cost_q16[m];
            kt->cheapest = m;
        }
    }
    dq__rans_tables(p->freq[kind], kt->levels, &kt->enc, &kt->dec);
    kt->cheap[0] = kt->cheap[1] = kt->cheapest;
    if (p->format_version != DQ_FORMAT_VERSION_PAIRS)
        return;
    uint16_t pair[DQ_RANS2_MAX_PAIRS];
    const uint32_t M = kt->levels;
    dq__rans2_pair_freq(p->freq[kind], M, pair);
    dq__rans2_tables(pair, M, &kt->enc2, &kt->dec2);
    kt->pairs = 1;
    best = INT32_MAX;
    for (uint32_t s = 0; s < M * M; s++) {
        kt->pair_cost_q16[s] = dq__cost12_q16(pair[s]);
        kt->pair_cost[s] = (float)kt->pair_cost_q16[s] / 65536.0f;
        if (kt->pair_cost_q16[s] < best) {
            best = kt->pair_cost_q16[s];
            kt->cheap[0] = s / M;
            kt->cheap[1] = s % M;
        }
    }
}

static int validate_shape(uint32_t kv_heads, uint32_t head_dim)
{
    DQ_RETURN_IF(!kv_heads || !is_pow2(head_dim), DQ_PROFILE);
    DQ_RETURN_IF((uint64_t)kv_heads * head_dim > DQ_MAX_STREAM, DQ_PROFILE);
    return DQ_OK;
}

int dq_profile_validate(const dq_profile *p)
{
    DQ_RETURN_IF(!p, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(p->format_version != DQ_FORMAT_VERSION &&
                     (p->format_version != DQ_FORMAT_VERSION_PAIRS || p->codec_type != DQ_CODEC_DQUANT),
                 DQ_VERSION);
    DQ_FORWARD_IF_ERROR(validate_shape(p->kv_heads, p->head_dim));
    DQ_RETURN_IF(memchr(p->name, 0, sizeof p->name) == NULL, DQ_PROFILE);
    DQ_RETURN_IF(p->window < 1 || p->residual < p->window || p->window > 65536 || p->residual > 65536, DQ_PROFILE);
    const int kvq_zero = !p->kvq_variant && !p->kvq_rotation && !p->kvq_outliers && !p->kvq_pq_m && !p->kvq_rank &&
                         !p->kvq_anchor && p->kvq_tau == 0 && !p->kvq_layers && !p->kvq_calib_hash;
    if (p->codec_type == DQ_CODEC_KVQ)
        return dq__kvq_validate(p);
    DQ_RETURN_IF(!kvq_zero, DQ_PROFILE);
    if (p->codec_type == DQ_CODEC_FIXED)
        return dq__fixed_validate(p);
    if (p->codec_type != DQ_CODEC_DQUANT)
        return dq__baseline_validate(p);
    DQ_RETURN_IF(p->bits[0] || p->bits[1] || p->group || p->rotate, DQ_PROFILE);
    DQ_RETURN_IF(!(p->alpha > 0) || !(p->alpha < 16), DQ_PROFILE);
    const uint32_t n = p->kv_heads * p->head_dim;
    DQ_RETURN_IF(p->format_version == DQ_FORMAT_VERSION_PAIRS && n % 2 != 0, DQ_PROFILE);
    for (int k = 0; k < 2; k++) {
        uint32_t M = p->levels[k];
        DQ_RETURN_IF(M < DQ_MIN_LEVELS || M > DQ_MAX_LEVELS, DQ_PROFILE);
        DQ_RETURN_IF(p->container_bytes[k] < DQ_RANS_STATE_BYTES + 1 || p->container_bytes[k] > DQ_MAX_CONTAINER,
                     DQ_CONTAINER_TOO_SMALL);
        uint32_t sum = 0;
        for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++) {
            DQ_RETURN_IF(m < M && p->freq[k][m] < 1, DQ_PROFILE);
            DQ_RETURN_IF(m >= M && p->freq[k][m] != 0, DQ_PROFILE);
            sum += p->freq[k][m];
        }
        DQ_RETURN_IF(sum != 256, DQ_PROFILE);
        dq__kind_tables kt;
        dq__kind_tables_init(p, k, &kt);
        const uint32_t need = kt.pairs ? dq__rans2_const_bytes(&kt.enc2, kt.cheap[0] * M + kt.cheap[1], n)
                                       : cheapest_bytes(&kt.enc, kt.cheapest, n);
        DQ_RETURN_IF(need > p->container_bytes[k], DQ_CONTAINER_TOO_SMALL);
    }
    return DQ_OK;
}

int dq_profile_make(const dq_profile_params *params, dq_profile *out)
{
    DQ_RETURN_IF(!params || !out, DQ_INVALID_ARGUMENT);
    DQ_FORWARD_IF_ERROR(validate_shape(params->kv_heads, params->head_dim));
    dq_profile p;
    memset(&p, 0, sizeof p);
    DQ_RETURN_IF(params->format_version > DQ_FORMAT_VERSION_PAIRS, DQ_VERSION);
    p.format_version = params->format_version ? params->format_version : DQ_FORMAT_VERSION;
    snprintf(p.name, sizeof p.name, "%s", params->name ? params->name : "custom");
    p.kv_heads = params->kv_heads;
    p.head_dim = params->head_dim;
    p.alpha = params->alpha;
    p.window = params->window;
    p.residual = params->residual;
    p.rotation_seed = params->rotation_seed;
    const uint32_t n = p.kv_heads * p.head_dim;
    for (int k = 0; k < 2; k++) {
        p.container_bytes[k] = params->container_bytes[k];
        p.levels[k] = params->levels[k];
        DQ_RETURN_IF(p.levels[k] < DQ_MIN_LEVELS || p.levels[k] > DQ_MAX_LEVELS, DQ_PROFILE);
        int rc = dq_model_freq_table(n, p.levels[k], p.alpha, p.freq[k]);
        if (rc < 0)
            return rc == DQ_INVALID_ARGUMENT ? DQ_PROFILE : rc;
    }
    DQ_FORWARD_IF_ERROR(dq_profile_validate(&p));
    *out = p;
    return DQ_OK;
}

const char *const *dq_profile_builtin_names(void)
{
    return g_builtin_names;
}

int dq_profile_builtin(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    DQ_RETURN_IF(!name || !out, DQ_INVALID_ARGUMENT);
    DQ_FORWARD_IF_ERROR(validate_shape(kv_heads, head_dim));
    for (size_t i = 0; i < sizeof g_builtins / sizeof g_builtins[0]; i++) {
        const builtin_def *b = &g_builtins[i];
        const size_t len = strlen(b->name);
        const int pairs = strncmp(name, b->name, len) == 0 && name[len] == DQ_PAIRS_SUFFIX && name[len + 1] == 0;
        if (strcmp(name, b->name) != 0 && !pairs)
            continue;
        dq_profile_params pp;
        dq_profile_params_default(&pp);
        pp.name = name;
        pp.format_version = pairs ? DQ_FORMAT_VERSION_PAIRS : DQ_FORMAT_VERSION;
        pp.kv_heads = kv_heads;
        pp.head_dim = head_dim;
        const double n = (double)kv_heads * head_dim;
        for (int k = 0; k < 2; k++) {
            /* keep the payload bit rate of the n = 1024 definition */
            double rate = (8.0 * b->c1024[k] - 32.0) / 1024.0;
            pp.container_bytes[k] = (uint32_t)lround((rate * n + 32.0) / 8.0);
            pp.levels[k] = b->levels[k];
        }
        return dq_profile_make(&pp, out);
    }
    if (dq__baseline_profile(name, kv_heads, head_dim, out) == DQ_OK)
        return DQ_OK;
    if (strncmp(name, "fixed", 5) == 0)
        return dq_profile_fixed(name, kv_heads, head_dim, out);
    return dq_profile_kvq(name, kv_heads, head_dim, out);
}

int dq_profile_baseline(const char *name, uint32_t kv_heads, uint32_t head_dim, dq_profile *out)
{
    DQ_RETURN_IF(!name || !out, DQ_INVALID_ARGUMENT);
    DQ_FORWARD_IF_ERROR(validate_shape(kv_heads, head_dim));
    return dq__baseline_profile(name, kv_heads, head_dim, out);
}

const char *const *dq_profile_baseline_names(void)
{
    static const char *const names[] = {"bf16", "int2", "quarot2", "kivi2", "turbo2", NULL};
    return names;
}

double dq_profile_bits_per_value(const dq_profile *p, dq_kind kind)
{
    const double n = (double)p->kv_heads * p->head_dim;
    if (p->codec_type == DQ_CODEC_KVQ) {
        double b = 8.0 * (double)dq__kvq_record_bytes(p, kind) / n;
        if (kind == DQ_KIND_K)
            b += 8.0 * (double)dq__kvq_header_bytes(p) / (n * p->window);
        return b;
    }
    if (p->codec_type != DQ_CODEC_DQUANT && p->codec_type != DQ_CODEC_FIXED) {
        double b = 8.0 * (double)dq__baseline_record_bytes(p, kind) / n;
        if (kind == DQ_KIND_K)
            b += 8.0 * (double)dq__baseline_header_bytes(p) / (n * p->window);
        return b;
    }
    double bits = 8.0 * (4.0 + p->container_bytes[kind]) / n;
    if (kind == DQ_KIND_K)
        bits += 8.0 * (2.0 + n) / (n * p->window);
    return bits;
}

double dq_profile_bits_per_value_mean(const dq_profile *p)
{
    return 0.5 * (dq_profile_bits_per_value(p, DQ_KIND_K) + dq_profile_bits_per_value(p, DQ_KIND_V));
}

/* ---- serialization ---- */

static uint32_t fnv1a32(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

static uint8_t *w32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}

static uint32_t r32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#define DQ_PROFILE_FIXED_BYTES 108u
/* codec_type DQ_CODEC_KVQ appends, before the checksum: variant, rotation, outliers, pq_m, rank,
 * anchor, tau (float bits), layers, calibration hash (low, high word): 40 bytes */
#define DQ_PROFILE_KVQ_BYTES 40u
_Static_assert(DQ_PROFILE_FIXED_BYTES + 4u * DQ_MAX_LEVELS <= DQ_PROFILE_SERIALIZED_MAX &&
                   DQ_PROFILE_FIXED_BYTES + DQ_PROFILE_KVQ_BYTES <= DQ_PROFILE_SERIALIZED_MAX,
               "a serialized profile fits DQ_PROFILE_SERIALIZED_MAX");

int dq_profile_serialize(const dq_profile *p, uint8_t *buf, size_t cap, size_t *len)
{
    DQ_RETURN_IF(!p || !buf || !len, DQ_INVALID_ARGUMENT);
    DQ_FORWARD_IF_ERROR(dq_profile_validate(p));
    size_t need = DQ_PROFILE_FIXED_BYTES + (p->codec_type == DQ_CODEC_DQUANT ? 2u * (p->levels[0] + p->levels[1]) : 0) +
                  (p->codec_type == DQ_CODEC_KVQ ? DQ_PROFILE_KVQ_BYTES : 0);
    DQ_RETURN_IF(cap < need, DQ_INVALID_ARGUMENT);
    uint8_t *q = buf;
    memcpy(q, "DQPF", 4);
    q = w32(q + 4, p->format_version);
    memset(q, 0, DQ_PROFILE_NAME_MAX);
    memcpy(q, p->name, strnlen(p->name, DQ_PROFILE_NAME_MAX - 1));
    q += DQ_PROFILE_NAME_MAX;
    q = w32(q, p->kv_heads);
    q = w32(q, p->head_dim);
    q = w32(q, p->container_bytes[0]);
    q = w32(q, p->container_bytes[1]);
    q = w32(q, p->levels[0]);
    q = w32(q, p->levels[1]);
    uint32_t ab;
    memcpy(&ab, &p->alpha, 4);
    q = w32(q, ab);
    q = w32(q, p->window);
    q = w32(q, p->residual);
    q = w32(q, (uint32_t)p->rotation_seed);
    q = w32(q, (uint32_t)(p->rotation_seed >> 32));
    q = w32(q, p->codec_type);
    q = w32(q, p->bits[0]);
    q = w32(q, p->bits[1]);
    q = w32(q, p->group);
    q = w32(q, p->rotate);
    for (int k = 0; k < 2; k++)
        for (uint32_t m = 0; m < p->levels[k] && p->codec_type == DQ_CODEC_DQUANT; m++) {
            q[0] = (uint8_t)p->freq[k][m];
            q[1] = (uint8_t)(p->freq[k][m] >> 8);
            q += 2;
        }
    if (p->codec_type == DQ_CODEC_KVQ) {
        uint32_t tb;
        memcpy(&tb, &p->kvq_tau, 4);
        q = w32(q, p->kvq_variant);
        q = w32(q, p->kvq_rotation);
        q = w32(q, p->kvq_outliers);
        q = w32(q, p->kvq_pq_m);
        q = w32(q, p->kvq_rank);
        q = w32(q, p->kvq_anchor);
        q = w32(q, tb);
        q = w32(q, p->kvq_layers);
        q = w32(q, (uint32_t)p->kvq_calib_hash);
        q = w32(q, (uint32_t)(p->kvq_calib_hash >> 32));
    }
    q = w32(q, fnv1a32(buf, (size_t)(q - buf)));
    *len = (size_t)(q - buf);
    return DQ_OK;
}

int dq_profile_deserialize(const uint8_t *buf, size_t len, dq_profile *out)
{
    DQ_RETURN_IF(!buf || !out, DQ_INVALID_ARGUMENT);
    DQ_RETURN_IF(len < DQ_PROFILE_FIXED_BYTES, DQ_TRUNCATED);
    DQ_RETURN_IF(memcmp(buf, "DQPF", 4) != 0, DQ_CORRUPT);
    dq_profile p;
    memset(&p, 0, sizeof p);
    const uint8_t *q = buf + 4;
    p.format_version = r32(q);
    q += 4;
    DQ_RETURN_IF(p.format_version != DQ_FORMAT_VERSION && p.format_version != DQ_FORMAT_VERSION_PAIRS, DQ_VERSION);
    memcpy(p.name, q, DQ_PROFILE_NAME_MAX);
    p.name[DQ_PROFILE_NAME_MAX - 1] = 0;
    q += DQ_PROFILE_NAME_MAX;
    p.kv_heads = r32(q);
    q += 4;
    p.head_dim = r32(q);
    q += 4;
    p.container_bytes[0] = r32(q);
    q += 4;
    p.container_bytes[1] = r32(q);
    q += 4;
    p.levels[0] = r32(q);
    q += 4;
    p.levels[1] = r32(q);
    q += 4;
    uint32_t ab = r32(q);
    q += 4;
    memcpy(&p.alpha, &ab, 4);
    p.window = r32(q);
    q += 4;
    p.residual = r32(q);
    q += 4;
    p.rotation_seed = r32(q);
    p.rotation_seed |= (uint64_t)r32(q + 4) << 32;
    q += 8;
    p.codec_type = r32(q);
    q += 4;
    p.bits[0] = r32(q);
    q += 4;
    p.bits[1] = r32(q);
    q += 4;
    p.group = r32(q);
    q += 4;
    p.rotate = r32(q);
    q += 4;
    const int dquant = p.codec_type == DQ_CODEC_DQUANT;
    if (dquant && (p.levels[0] < DQ_MIN_LEVELS || p.levels[0] > DQ_MAX_LEVELS || p.levels[1] < DQ_MIN_LEVELS ||
                   p.levels[1] > DQ_MAX_LEVELS))
        return DQ_CORRUPT;
    const int kvq = p.codec_type == DQ_CODEC_KVQ;
    size_t need = DQ_PROFILE_FIXED_BYTES + (dquant ? 2u * (p.levels[0] + p.levels[1]) : 0) +
                  (kvq ? DQ_PROFILE_KVQ_BYTES : 0);
    DQ_RETURN_IF(len < need, DQ_TRUNCATED);
    for (int k = 0; k < 2; k++)
        for (uint32_t m = 0; m < p.levels[k] && dquant; m++) {
            p.freq[k][m] = (uint16_t)(q[0] | q[1] << 8);
            q += 2;
        }
    if (kvq) {
        p.kvq_variant = r32(q);
        p.kvq_rotation = r32(q + 4);
        p.kvq_outliers = r32(q + 8);
        p.kvq_pq_m = r32(q + 12);
        p.kvq_rank = r32(q + 16);
        p.kvq_anchor = r32(q + 20);
        uint32_t tb = r32(q + 24);
        memcpy(&p.kvq_tau, &tb, 4);
        p.kvq_layers = r32(q + 28);
        p.kvq_calib_hash = r32(q + 32) | (uint64_t)r32(q + 36) << 32;
        q += DQ_PROFILE_KVQ_BYTES;
    }
    DQ_RETURN_IF(r32(q) != fnv1a32(buf, (size_t)(q - buf)), DQ_CORRUPT);
    DQ_FORWARD_IF_ERROR(dq_profile_validate(&p));
    *out = p;
    return DQ_OK;
}
