/* The driver of the window-record fuzz targets of the container families other than format 1's
 * rANS (fuzz_fixed.c: the fixed-width family; fuzz_pairs.c: format version 2, joint pairs) and the
 * generator of their seed corpora. A family gives its codecs and what only it can check; the driver
 * runs the rest.
 *
 * Input: byte 0 picks a codec (bits 0-6, modulo the count); the rest is one window record
 * (zero-padded or cut to dq_codec_window_bytes, in a block of exactly that size, so that a
 * sanitizer sees any overread). Per record: dq_stream_decode_levels gives 0 or DQ_CORRUPT and levels
 * below M, dq_stream_decode the same code, and a valid container is canonical (the family's check).
 * dq_window_check is DQ_CORRUPT exactly when a record is (or an fp16 field is bad: non-finite, or a
 * negative scale); dq_hot_transcode reports DQ_CORRUPT exactly when a container is; the hot levels
 * equal the records' levels (for every window, or for those the check passes); for a window the
 * check passes, the hot window passes dq_hot_check and the family's own checks. */
#ifndef DQTEST_FUZZ_WINDOW_H
#define DQTEST_FUZZ_WINDOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dquant/codec.h"

typedef struct fuzz_window_family {
    size_t count;            /* codecs */
    dq_codec *const *codecs; /* count codecs, made by setup */
    void (*setup)(void);     /* makes the codecs (once) */
    /* FUZZ_CHECKs that the valid record rec of the kind, whose levels are lev, is canonical */
    void (*canonical)(const dq_codec *c, int kind, const uint8_t *lev, const uint8_t *rec);
    bool hot_levels_always; /* compare the hot levels with the records' for corrupt windows too */
    /* the family's checks of the hot window hot (hb bytes) of win (wb bytes), which passes
     * dq_window_check */
    void (*hot_valid)(const dq_codec *c, const uint8_t *win, size_t wb, const uint8_t *hot, size_t hb);
    /* the generator's damaged seeds that only the family writes, from the valid window win (d: wb
     * bytes of scratch; krec, vrec: the offsets of the first key and value records); 0 or -1 */
    int (*seeds)(const char *dir, uint8_t sel, const dq_codec *c, const uint8_t *win, uint8_t *d, size_t krec,
                 size_t vrec);
    /* the byte offsets the generator flips (at most 16), given krec, vrec and the window bytes wb */
    size_t (*flips)(size_t krec, size_t vrec, size_t wb, size_t *at);
    /* the "tail" seeds (the last byte of the last container of each kind) set its top bit; else
     * they flip it */
    bool tail_set;
} fuzz_window_family;

/* One fuzz input (LLVMFuzzerTestOneInput's contract): 0. */
int fuzz_window_run(const fuzz_window_family *f, const uint8_t *data, size_t size);
/* The seed corpus into dir: per codec a valid window of encoded tokens ("valid-SEL"), the family's
 * seeds, the last byte of each kind ("tail-SEL-KIND"), byte flips ("flip-SEL-I"), a cut ("cut-SEL"),
 * and an empty input. 0, or 1 if a file
 * could not be written. */
int fuzz_window_gen(const fuzz_window_family *f, const char *dir);

#endif
