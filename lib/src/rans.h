/* Byte-wise rANS with 8-bit precision (DESIGN §2.3): 32-bit state in [L, 256·L), L = 2^23.
 * Encoding runs last symbol to first; the container holds the final state (4 bytes, little endian)
 * then the emitted bytes in the order the decoder reads them, then zeros. */
#ifndef DQ_RANS_H
#define DQ_RANS_H

#include <stdint.h>

#define DQ_RANS_L (1u << 23)
#define DQ_RANS_PREC 8
#define DQ_RANS_STATE_BYTES 4

/* Encoder side of one frequency table. */
typedef struct dq__rans_enc {
    uint32_t levels;
    uint16_t freq[32];
    uint16_t cum[32];
    /* x / f as a multiply-high: rcp = ceil(2^64 / f) for f >= 2 (exact for every 32-bit x, since
     * f <= 256), 0 for f = 1 (the quotient is x) */
    uint64_t rcp[32];
} dq__rans_enc;

/* Decode table: entry z (the state's low byte) packs symbol (bits 0-7), bias z - c (bits 8-15)
 * and f (bits 16-24). One lookup gives the level and the state update. */
typedef struct dq__rans_dec {
    uint32_t entry[256];
} dq__rans_dec;

void dq__rans_tables(const uint16_t *freq, uint32_t levels, dq__rans_enc *enc, dq__rans_dec *dec);

/* Encodes n symbols into out[0..cap). scratch must hold n bytes. Returns the bytes the container
 * needs (4 + emitted); when that exceeds cap nothing useful is in out and the caller retries.
 * On success out[used..cap) is zeroed. */
uint32_t dq__rans_encode(const dq__rans_enc *enc, const uint8_t *syms, uint32_t n, uint8_t *scratch, uint8_t *out,
                         uint32_t cap);

/* Decodes n symbols from a C-byte container; never reads outside it (bytes past the end read as
 * zero). Returns 0 for a valid stream, DQ_CORRUPT when the initial state is out of range, the
 * decoder ran past the container, the final state is not L, or trailing bytes are nonzero. */
int dq__rans_decode(const dq__rans_dec *dec, const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms);

/* The parts both container versions share (rans2.h keeps this layout).
 * dq__rans_store: the container of final encoder state x and the emitted bytes [p, p + emitted)
 * into out[0..cap), zeros after them; returns the bytes needed (4 + emitted), writing nothing
 * when that exceeds cap.
 * dq__rans_open: the decoder's initial state, or 0 when the container has none (C < 4, or a state
 * outside [L, 256·L)); then syms[0..n) are zeroed.
 * dq__rans_close: the decoder's verdict at the end: DQ_CORRUPT when it read past the container
 * (overrun), its state is not L, or a byte after the last one it read (ptr) is nonzero; else 0. */
uint32_t dq__rans_store(uint32_t x, const uint8_t *p, uint32_t emitted, uint8_t *out, uint32_t cap);
uint32_t dq__rans_open(const uint8_t *in, uint32_t C, uint32_t n, uint8_t *syms);
int dq__rans_close(const uint8_t *in, uint32_t C, uint32_t ptr, int overrun, uint32_t x);

#endif
