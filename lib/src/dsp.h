/* Hot kernels behind function pointers (dav1d style): the table starts with the portable C
 * versions, then CPU-specific versions replace entries. tests/lib/test_dsp.c compares every fast
 * entry with the C one. */
#ifndef DQ_DSP_H
#define DQ_DSP_H

#include <stddef.h>
#include <stdint.h>

#include "rans.h"

typedef struct dq__dsp {
    /* Decodes count streams (records stride bytes apart; each record is 4 bytes of fp16 s,o then a
     * C-byte container) to levels[i·n + j]. Returns the number of corrupt streams. */
    size_t (*decode_levels)(const dq__rans_dec *dec, const uint8_t *records, size_t stride, size_t count, uint32_t C,
                            uint32_t n, uint8_t *levels);
    /* acc[j] += w · (lev[j] - center), j < len. Centered levels keep the affine offset out of
     * the accumulation (no cancellation between Σ a·s·m and Σ a·o). */
    void (*axpy_u8)(float *acc, float w, const uint8_t *lev, size_t len, float center);
    /* Returns Σ_j q[j] · (lev[j] - center), j < len. */
    float (*dot_u8)(const float *q, const uint8_t *lev, size_t len, float center);
    /* Returns Σ_j q[j] · k[j], j < len, k in BF16 (the BF16 tail of a layer). */
    float (*dot_bf16)(const float *q, const uint16_t *k, size_t len);
    /* acc[j] += w · v[j], j < len, v in BF16. */
    void (*axpy_bf16)(float *acc, float w, const uint16_t *v, size_t len);
    /* Returns Σ_j x[j]², j < len, x in BF16, summed in any order (+inf or NaN when a value is not
     * finite). */
    float (*sumsq_bf16)(const uint16_t *x, size_t len);
    /* The unnormalized Walsh–Hadamard transform of x in place, len a power of two, in the canonical
     * butterfly order (stage h = 1, 2, 4, ...: x[j], x[j + h] = x[j] + x[j + h], x[j] - x[j + h]);
     * every version gives the same bits (each output is one addition or subtraction). */
    void (*fwht)(float *x, uint32_t len);
} dq__dsp;

void dq__dsp_init_c(dq__dsp *dsp);
/* The C transform (the table's fwht before CPU-specific versions; they use it for short lengths). */
void dq__fwht_c(float *x, uint32_t len);
/* Overrides entries with versions for the running CPU (no-op where none apply). */
void dq__dsp_init_x86(dq__dsp *dsp);
/* The process-wide table for this CPU, initialized once (thread-safe). */
const dq__dsp *dq__dsp_get(void);
/* Names the CPU-specific entries in use ("avx2", "sse2", "c"). */
const char *dq__dsp_name(void);

#endif
