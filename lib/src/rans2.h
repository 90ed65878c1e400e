/* Format version 2 (normative here; DESIGN §2 holds version 1): joint two-symbol rANS at 12-bit precision. Levels are coded in
 * pairs (m_2i, m_2i+1), one symbol a·M + b of M² per pair, with integer frequencies summing to
 * 4096. The 32-bit state lives in [L, 256·L), L = 2^23, as in version 1; the decoder takes
 * z = x & 4095, looks up (m1, m2, f, z − c) = T[z], sets x = f·(x >> 12) + z − c and then reads
 * bytes while x < L: after a step x >= 2^11 (x >= 2^23, f >= 1), so at most 2 bytes per pair.
 * The encoder emits bytes while x >= 2^19·f (at most 2: x < 2^31), so x/f < 2^19 and the update
 * stays below 2^31. The container layout is version 1's: the final encoder state (4 bytes, little
 * endian), the bytes in the order the decoder reads them, zeros.
 *
 * The pair table comes from the profile's version-1 table f_m (sum 256): t_ab = f_a·f_b (sum
 * 65536), q_ab = max(1, round(t_ab / 16)), then the sum is brought to 4096 one unit at a time:
 * while it is above, the entry with q >= 2 of least t/(q − 1/2) loses one; while below, the entry
 * of largest t/(q + 1/2) gains one (compared exactly as integers; ties: the lowest index a·M + b).
 * So the table travels as the same integers as version 1's. */
#ifndef DQ_RANS2_H
#define DQ_RANS2_H

#include <stdint.h>

#define DQ_RANS2_PREC 12
#define DQ_RANS2_TOTAL 4096u
#define DQ_RANS2_MAX_PAIRS (32u * 32u)

/* Encoder and decoder tables of one kind. */
typedef struct dq__rans2_enc {
    uint32_t levels;
    uint16_t freq[DQ_RANS2_MAX_PAIRS]; /* pair a·M + b */
    uint16_t cum[DQ_RANS2_MAX_PAIRS];
    uint64_t rcp[DQ_RANS2_MAX_PAIRS]; /* ceil(2^64 / f) for f >= 2 (exact for 32-bit x, f <= 4096), 0 for f = 1 */
} dq__rans2_enc;

typedef struct dq__rans2_entry {
    uint16_t f, bias; /* bias = z − c */
    uint8_t m1, m2;
} dq__rans2_entry;

typedef struct dq__rans2_dec {
    dq__rans2_entry entry[DQ_RANS2_TOTAL];
} dq__rans2_dec;

/* Pair frequencies (levels² entries, sum 4096, each >= 1) from a version-1 table (sum 256). */
void dq__rans2_pair_freq(const uint16_t *freq, uint32_t levels, uint16_t *pair);
void dq__rans2_tables(const uint16_t *pair, uint32_t levels, dq__rans2_enc *enc, dq__rans2_dec *dec);

/* Encodes n (even) levels into out[0..cap); scratch holds n bytes. Same contract as
 * dq__rans_encode: returns the bytes needed; when <= cap, out[used..cap) is zeroed. */
uint32_t dq__rans2_encode(const dq__rans2_enc *enc, const uint8_t *syms, uint32_t n, uint8_t *scratch, uint8_t *out,
                          uint32_t cap);
/* Bytes n levels of the constant pair symbol need (state + emitted), without storing them. */
uint32_t dq__rans2_const_bytes(const dq__rans2_enc *enc, uint32_t pair, uint32_t n);

/* Decodes n (even) levels from a C-byte container; never reads outside it. Returns 0 or
 * DQ_CORRUPT under the same conditions as dq__rans_decode. */
int dq__rans2_decode(const dq__rans2_dec *dec, const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms);

#endif
