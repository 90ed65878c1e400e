#include <assert.h>
#include <string.h>

#include "codec_internal.h"
#include "rans2.h"

#define DQ_RANS2_XMAX_UNIT ((DQ_RANS_L >> DQ_RANS2_PREC) << 8) /* x_max(f) = 2^19 · f */

void dq__rans2_pair_freq(const uint16_t *freq, uint32_t levels, uint16_t *pair)
{
    const uint32_t P = levels * levels;
    uint32_t t[DQ_RANS2_MAX_PAIRS];
    int32_t sum = 0;
    for (uint32_t i = 0; i < P; i++) {
        t[i] = (uint32_t)freq[i / levels] * freq[i % levels];
        uint32_t q = (t[i] + 8) >> 4;
        pair[i] = (uint16_t)(q ? q : 1);
        sum += pair[i];
    }
    while (sum > (int32_t)DQ_RANS2_TOTAL) {
        /* least t / (q - 1/2) among q >= 2: t_i·(2q_j - 1) < t_j·(2q_i - 1) */
        uint32_t best = P;
        for (uint32_t i = 0; i < P; i++) {
            if (pair[i] < 2)
                continue;
            if (best == P || (uint64_t)t[i] * (2u * pair[best] - 1u) < (uint64_t)t[best] * (2u * pair[i] - 1u))
                best = i;
        }
        pair[best]--;
        sum--;
    }
    while (sum < (int32_t)DQ_RANS2_TOTAL) {
        uint32_t best = 0;
        for (uint32_t i = 1; i < P; i++)
            if ((uint64_t)t[i] * (2u * pair[best] + 1u) > (uint64_t)t[best] * (2u * pair[i] + 1u))
                best = i;
        pair[best]++;
        sum++;
    }
}

void dq__rans2_tables(const uint16_t *pair, uint32_t levels, dq__rans2_enc *enc, dq__rans2_dec *dec)
{
    const uint32_t P = levels * levels;
    uint32_t c = 0;
    memset(enc, 0, sizeof *enc);
    enc->levels = levels;
    for (uint32_t s = 0; s < P; s++) {
        const uint32_t f = pair[s];
        enc->freq[s] = (uint16_t)f;
        enc->cum[s] = (uint16_t)c;
        enc->rcp[s] = f >= 2 ? UINT64_MAX / f + 1 : 0;
        for (uint32_t z = c; z < c + f && z < DQ_RANS2_TOTAL; z++) {
            dq__rans2_entry e = {(uint16_t)f, (uint16_t)(z - c), (uint8_t)(s / levels), (uint8_t)(s % levels)};
            dec->entry[z] = e;
        }
        c += f;
    }
    assert(c == DQ_RANS2_TOTAL);
}

static inline uint32_t put(const dq__rans2_enc *enc, uint32_t s, uint32_t x)
{
    const uint32_t f = enc->freq[s];
    /* x·rcp / 2^64 = x/f + (less than 2^-32), and x/f is at least 1/f >= 2^-12 below the next
     * integer: the floor is the quotient */
    const uint32_t q = f >= 2 ? (uint32_t)(((unsigned __int128)x * enc->rcp[s]) >> 64) : x;
    return (q << DQ_RANS2_PREC) + (x - q * f) + enc->cum[s];
}

uint32_t dq__rans2_encode(const dq__rans2_enc *enc, const uint8_t *syms, uint32_t n, uint8_t *scratch, uint8_t *out,
                          uint32_t cap)
{
    assert(n % 2 == 0);
    const uint32_t M = enc->levels;
    uint32_t x = DQ_RANS_L;
    uint8_t *end = scratch + n, *p = end;
    for (uint32_t i = n / 2; i-- > 0;) {
        const uint32_t s = syms[2 * i] * M + syms[2 * i + 1];
        const uint32_t xmax = DQ_RANS2_XMAX_UNIT * enc->freq[s];
        while (x >= xmax) {
            *--p = (uint8_t)x;
            x >>= 8;
        }
        x = put(enc, s, x);
    }
    assert(x >= DQ_RANS_L && x < (DQ_RANS_L << 8));
    const uint32_t emitted = (uint32_t)(end - p);
    assert(emitted <= n);
    return dq__rans_store(x, p, emitted, out, cap);
}

uint32_t dq__rans2_const_bytes(const dq__rans2_enc *enc, uint32_t pair, uint32_t n)
{
    const uint32_t xmax = DQ_RANS2_XMAX_UNIT * enc->freq[pair];
    uint32_t x = DQ_RANS_L, emitted = 0;
    for (uint32_t i = 0; i < n / 2; i++) {
        while (x >= xmax) {
            emitted++;
            x >>= 8;
        }
        x = put(enc, pair, x);
    }
    return DQ_RANS_STATE_BYTES + emitted;
}

int dq__rans2_decode(const dq__rans2_dec *dec, const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms)
{
    uint32_t x = dq__rans_open(in, C, n, syms);
    if (!x)
        return DQ_CORRUPT;
    uint32_t ptr = DQ_RANS_STATE_BYTES;
    int overrun = 0;
    for (uint32_t i = 0; i + 1 < n; i += 2) {
        const dq__rans2_entry e = dec->entry[x & (DQ_RANS2_TOTAL - 1u)];
        syms[i] = e.m1;
        syms[i + 1] = e.m2;
        x = (uint32_t)e.f * (x >> DQ_RANS2_PREC) + e.bias;
        /* x >= 2^11 here: at most two bytes restore x >= L */
        while (x < DQ_RANS_L) {
            uint32_t b = 0;
            if (ptr < C)
                b = in[ptr++];
            else
                overrun = 1;
            x = (x << 8) | b;
        }
    }
    return dq__rans_close(in, C, ptr, overrun, x);
}
