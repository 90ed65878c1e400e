#include <assert.h>
#include <string.h>

#include "codec_internal.h"
#include "rans.h"

void dq__rans_tables(const uint16_t *freq, uint32_t levels, dq__rans_enc *enc, dq__rans_dec *dec)
{
    uint32_t c = 0;
    memset(enc, 0, sizeof *enc);
    enc->levels = levels;
    for (uint32_t m = 0; m < levels; m++) {
        enc->freq[m] = freq[m];
        enc->cum[m] = (uint16_t)c;
        enc->rcp[m] = freq[m] >= 2 ? UINT64_MAX / freq[m] + 1 : 0;
        for (uint32_t z = c; z < c + freq[m] && z < 256; z++)
            dec->entry[z] = m | ((z - c) << 8) | ((uint32_t)freq[m] << 16);
        c += freq[m];
    }
}

uint32_t dq__rans_encode(const dq__rans_enc *enc, const uint8_t *syms, uint32_t n, uint8_t *scratch, uint8_t *out,
                         uint32_t cap)
{
    /* Bytes are emitted last-in-first-read: fill scratch from its end. At most one byte per
     * symbol: after renormalization x < 2^23·f, so the update stays below 2^31. */
    uint32_t x = DQ_RANS_L;
    uint8_t *end = scratch + n, *p = end;
    for (uint32_t i = n; i-- > 0;) {
        uint32_t s = syms[i];
        uint32_t f = enc->freq[s];
        if (x >= ((DQ_RANS_L >> DQ_RANS_PREC) << 8) * f) {
            *--p = (uint8_t)x;
            x >>= 8;
        }
        /* x·rcp / 2^64 = x/f + (less than 2^-32), and x/f is at least 1/f <= 2^-8 below the next
         * integer: the floor is the quotient */
        const uint32_t q = f >= 2 ? (uint32_t)(((unsigned __int128)x * enc->rcp[s]) >> 64) : x;
        x = (q << DQ_RANS_PREC) + (x - q * f) + enc->cum[s];
    }
    assert(x >= DQ_RANS_L && x < (DQ_RANS_L << 8)); /* the state range the decoder starts from */
    const uint32_t emitted = (uint32_t)(end - p);
    assert(emitted <= n);
    return dq__rans_store(x, p, emitted, out, cap);
}

uint32_t dq__rans_store(uint32_t x, const uint8_t *p, uint32_t emitted, uint8_t *out, uint32_t cap)
{
    const uint32_t used = DQ_RANS_STATE_BYTES + emitted;
    if (used > cap)
        return used;
    out[0] = (uint8_t)x;
    out[1] = (uint8_t)(x >> 8);
    out[2] = (uint8_t)(x >> 16);
    out[3] = (uint8_t)(x >> 24);
    memcpy(out + DQ_RANS_STATE_BYTES, p, emitted);
    memset(out + used, 0, cap - used);
    return used;
}

uint32_t dq__rans_open(const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms)
{
    uint32_t x = 0;
    if (C >= DQ_RANS_STATE_BYTES)
        x = (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 | (uint32_t)in[3] << 24;
    if (x < DQ_RANS_L || x >= (DQ_RANS_L << 8)) {
        memset(syms, 0, n);
        return 0;
    }
    return x;
}

int dq__rans_close(const uint8_t *in, uint32_t C, uint32_t ptr, int overrun, uint32_t x)
{
    DQ_RETURN_IF(overrun || x != DQ_RANS_L, DQ_CORRUPT);
    for (uint32_t i = ptr; i < C; i++)
        if (in[i])
            return DQ_CORRUPT;
    return DQ_OK;
}

int dq__rans_decode(const dq__rans_dec *dec, const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms)
{
    uint32_t x = dq__rans_open(in, C, n, syms);
    if (!x)
        return DQ_CORRUPT;
    uint32_t ptr = DQ_RANS_STATE_BYTES;
    int overrun = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t z = x & 0xffu;
        uint32_t e = dec->entry[z];
        syms[i] = (uint8_t)e;
        x = (e >> 16) * (x >> 8) + ((e >> 8) & 0xffu);
        /* x >= 2^15 here (x was >= 2^23 and f >= 1), so one byte restores x >= L. */
        if (x < DQ_RANS_L) {
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
