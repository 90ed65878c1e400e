#include "dqtest_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_L (1u << 23)

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void dqt_rng_seed(dqt_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    r->s = splitmix64(&x);
    if (r->s == 0)
        r->s = 0x2545f4914f6cdd1dull;
}

uint64_t dqt_next(dqt_rng *r)
{
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dull;
}

uint32_t dqt_below(dqt_rng *r, uint32_t n)
{
    return (uint32_t)(((dqt_next(r) >> 32) * (uint64_t)n) >> 32);
}

double dqt_uniform(dqt_rng *r)
{
    return (double)(dqt_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

double dqt_normal(dqt_rng *r)
{
    double u1 = 1.0 - dqt_uniform(r); /* (0, 1] */
    double u2 = dqt_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint8_t dqt_draw_symbol(dqt_rng *r, const uint16_t *freq, uint32_t levels)
{
    uint32_t z = dqt_below(r, 256), c = 0;
    for (uint32_t m = 0; m < levels; m++) {
        c += freq[m];
        if (z < c)
            return (uint8_t)m;
    }
    return (uint8_t)(levels - 1);
}

uint64_t dqt_fnv1a64(const void *p, size_t len, uint64_t h)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

long dqt_env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return (*end == '\0' && x > 0) ? x : dflt;
}

const char *dqt_data_dir(void)
{
    const char *d = getenv("DQ_DATA_DIR");
    return (d && *d) ? d : "../shared/data";
}

void *dqt_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) {
        fprintf(stderr, "dqt_xmalloc(%zu) failed\n", size);
        abort();
    }
    return p;
}

static dq_codec *codec_from(const dq_profile *p)
{
    dq_codec *c = NULL;
    int rc = dq_codec_create(p, NULL, &c);
    if (rc != DQ_OK || !c) {
        fprintf(stderr, "dq_codec_create(%s, %u×%u): %s\n", p->name, p->kv_heads, p->head_dim, dq_err_name(rc));
        abort();
    }
    return c;
}

dq_codec *dqt_codec_builtin(const char *name, uint32_t kv_heads, uint32_t head_dim)
{
    dq_profile p;
    int rc = dq_profile_builtin(name, kv_heads, head_dim, &p);
    if (rc != DQ_OK) {
        fprintf(stderr, "dq_profile_builtin(%s, %u, %u): %s\n", name, kv_heads, head_dim, dq_err_name(rc));
        abort();
    }
    return codec_from(&p);
}

dq_codec *dqt_codec_make(const dq_profile_params *params)
{
    dq_profile p;
    int rc = dq_profile_make(params, &p);
    if (rc != DQ_OK) {
        fprintf(stderr, "dq_profile_make(%u×%u, C %u/%u, M %u/%u): %s\n", params->kv_heads, params->head_dim,
                params->container_bytes[0], params->container_bytes[1], params->levels[0], params->levels[1],
                dq_err_name(rc));
        abort();
    }
    return codec_from(&p);
}

static void cumulative(const uint16_t *freq, uint32_t levels, uint32_t *cum)
{
    uint32_t c = 0;
    for (uint32_t m = 0; m < levels; m++) {
        cum[m] = c;
        c += freq[m];
    }
}

uint32_t dqt_ref_rans_encode(const uint16_t *freq, uint32_t levels, const uint8_t *syms, uint32_t n, uint8_t *out,
                             uint32_t cap)
{
    uint32_t cum[32];
    cumulative(freq, levels, cum);
    /* Emitted bytes, in emission order (the decoder reads them backwards). */
    uint8_t *emit = dqt_xmalloc((size_t)n + 1);
    uint32_t ne = 0;
    uint64_t x = REF_L;
    for (uint32_t i = n; i-- > 0;) {
        uint64_t f = freq[syms[i]];
        while (x >= (uint64_t)REF_L * f) {
            emit[ne++] = (uint8_t)(x & 255);
            x >>= 8;
        }
        x = (x / f) * 256 + (x % f) + cum[syms[i]];
    }
    uint32_t used = 4 + ne;
    if (used <= cap) {
        for (int b = 0; b < 4; b++)
            out[b] = (uint8_t)(x >> (8 * b));
        for (uint32_t k = 0; k < ne; k++)
            out[4 + k] = emit[ne - 1 - k];
        memset(out + used, 0, cap - used);
    }
    free(emit);
    return used;
}

dqt_ref_decode dqt_ref_rans_decode(const uint16_t *freq, uint32_t levels, const uint8_t *in, uint32_t C, uint32_t n,
                                   uint8_t *syms)
{
    dqt_ref_decode r = {0};
    uint32_t cum[32];
    uint8_t sym_of[256];
    cumulative(freq, levels, cum);
    for (uint32_t m = 0; m < levels; m++)
        for (uint32_t z = cum[m]; z < cum[m] + freq[m] && z < 256; z++)
            sym_of[z] = (uint8_t)m;
    if (C < 4) {
        r.overrun = 1;
        return r;
    }
    uint64_t x = (uint64_t)in[0] | (uint64_t)in[1] << 8 | (uint64_t)in[2] << 16 | (uint64_t)in[3] << 24;
    r.initial_state = (uint32_t)x;
    uint32_t ptr = 4;
    int state_ok = x >= REF_L && x < (uint64_t)REF_L * 256;
    for (uint32_t i = 0; i < n && state_ok; i++) {
        uint32_t z = (uint32_t)(x & 255);
        uint32_t m = sym_of[z];
        syms[i] = (uint8_t)m;
        x = freq[m] * (x >> 8) + z - cum[m];
        while (x < REF_L) {
            uint8_t b = 0;
            if (ptr < C)
                b = in[ptr++];
            else
                r.overrun = 1;
            x = (x << 8) | b;
            if (r.overrun)
                break;
        }
        if (r.overrun)
            break;
    }
    r.final_state = (uint32_t)x;
    r.consumed = ptr;
    for (uint32_t k = ptr; k < C; k++)
        if (in[k])
            r.nonzero_tail = 1;
    r.valid = state_ok && !r.overrun && x == REF_L && !r.nonzero_tail;
    return r;
}

double dqt_ideal_bits(const uint16_t *freq, const uint8_t *syms, uint32_t n)
{
    double bits = 0;
    for (uint32_t i = 0; i < n; i++)
        bits += -log2(freq[syms[i]] / 256.0);
    return bits;
}

float dqt_record_s(const uint8_t *record)
{
    return dq_f16_to_f32((uint16_t)(record[0] | record[1] << 8));
}

float dqt_record_o(const uint8_t *record)
{
    return dq_f16_to_f32((uint16_t)(record[2] | record[3] << 8));
}

double dqt_rel_l2_f(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void dqt_random_kv(dqt_rng *r, uint32_t n, size_t T, float *k, float *v)
{
    for (uint32_t j = 0; j < n; j++) {
        const float off = (float)(1.5 * dqt_normal(r));
        for (size_t t = 0; t < T; t++) {
            k[t * n + j] = off + (float)dqt_normal(r);
            v[t * n + j] = (float)(dqt_normal(r) * (1.0 + 0.5 * (j % 3)));
        }
    }
}
