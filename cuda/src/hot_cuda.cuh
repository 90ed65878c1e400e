/* Internals of the hot layout on the GPU (dquant/hot.h): its geometry, shared by the transcoder
 * (hot_cuda.cu) and the attention over hot windows (attend_hot.cu, attend_cuda.cu). */
#ifndef DQCU_HOT_CUDA_CUH
#define DQCU_HOT_CUDA_CUH

#include "cuda_internal.cuh"

/* Bits per code of a kind with M levels: ceil(log2 M), at least 1 (lib/src/hot.c bits_for). */
static inline uint32_t dqcu__hot_bits(uint32_t M)
{
    uint32_t b = 1;
    while ((1u << b) < M)
        b++;
    return b;
}

/* Where bit e of code k sits among the b units (U bits each) of one lane: lib/src/hot.c code_bit,
 * the layout of dquant/hot.h (keys: byte lanes, U = 8; values: half-words, U = 16). */
__host__ __device__ __forceinline__ void dqcu_hot_code_bit(uint32_t b, uint32_t U, uint32_t k, uint32_t e,
                                                           uint32_t &unit, uint32_t &bit)
{
    const uint32_t q = U / b, r = U - q * b;
    if (k < q * b) {
        unit = k / q;
        bit = b * (k % q) + e;
    } else {
        const uint32_t u = (k - q * b) * b + e;
        unit = u / r;
        bit = q * b + u % r;
    }
}

/* A token's codes of one group (32 channels) of a kind, gathered before they are stored: keys as
 * b words (byte lanes), values as 2b half-words (units b·h .. b·h + b - 1 for channels 16h ..). */
struct dqcu_hot_group {
    uint32_t w[16];
};

__device__ __forceinline__ void dqcu_hot_group_clear(dqcu_hot_group &g)
{
#pragma unroll
    for (int i = 0; i < 16; i++)
        g.w[i] = 0;
}

/* Adds code m of channel c (0..31) of the group. */
__device__ __forceinline__ void dqcu_hot_group_put(dqcu_hot_group &g, int kind, uint32_t b, uint32_t c, uint32_t m)
{
    for (uint32_t e = 0; e < b; e++) {
        uint32_t unit, bit;
        if (kind == 0) {
            dqcu_hot_code_bit(b, 8, c / 4u, e, unit, bit);
            bit += 8u * (c % 4u);
        } else {
            dqcu_hot_code_bit(b, 16, c % 16u, e, unit, bit);
            unit += b * (c / 16u);
        }
        g.w[unit] |= ((m >> e) & 1u) << bit;
    }
}

/* Stores group grp of token t (W tokens a window) into a kind's codes. */
__device__ __forceinline__ void dqcu_hot_group_store(const dqcu_hot_group &g, uint32_t *codes, int kind, uint32_t b,
                                                     uint32_t W, uint32_t grp, uint32_t t)
{
    if (kind == 0) {
        for (uint32_t i = 0; i < b; i++)
            codes[((size_t)grp * b + i) * W + t] = g.w[i];
    } else {
        const uint32_t P = (W + 1) / 2;
        uint16_t *h = (uint16_t *)(void *)codes;
        for (uint32_t i = 0; i < 2 * b; i++) {
            const size_t at = 2 * (((size_t)grp * 2 * b + i) * P + t / 2) + t % 2;
            h[at] = (uint16_t)g.w[i];
            if (W % 2 && t + 1 == W) /* an odd window's missing token W: zero codes */
                h[at + 1] = 0;
        }
    }
}

/* The code of channel j of token t of a kind (codes: that kind's words). */
__device__ __forceinline__ uint32_t dqcu_hot_code(const uint32_t *codes, int kind, uint32_t b, uint32_t W, uint32_t t,
                                                  uint32_t j)
{
    const uint32_t grp = j / 32u, c = j % 32u;
    uint32_t m = 0;
    for (uint32_t e = 0; e < b; e++) {
        uint32_t unit, bit;
        size_t word;
        if (kind == 0) {
            dqcu_hot_code_bit(b, 8, c / 4u, e, unit, bit);
            bit += 8u * (c % 4u);
            word = ((size_t)grp * b + unit) * W + t;
        } else {
            dqcu_hot_code_bit(b, 16, c % 16u, e, unit, bit);
            bit += 16u * (t % 2u);
            word = ((size_t)grp * 2 * b + b * (c / 16u) + unit) * ((W + 1) / 2) + t / 2;
        }
        m |= ((codes[word] >> bit) & 1u) << e;
    }
    return m;
}

/* The offsets of dq_hot_offsets (key s/o, value s/o, key codes, value codes) for dc's profile;
 * returns the hot window's bytes. */
size_t dqcu__hot_offsets(const dqcu_codec *dc, size_t off[4]);

/* The parameters the kernels between records and hot windows share (the transcode and its
 * inverse: one block per window and kind). */
struct dqcu_hot_common {
    const dqcu_tables *tab;
    const struct dqcu_rans2_tables *tab2; /* format version 2 (NULL for version 1) */
    uint32_t off[4];                      /* dqcu__hot_offsets */
    uint32_t bits[2];                     /* bits per code of each kind */
};

/* The argument checks and setup of dqcu_transcode_hot and dqcu_rebuild_hot: src, dst the arrays
 * of nwin window pointers read and written; rans_only: the fixed-width family is DQ_UNSUPPORTED.
 * Returns a dq_error, 0 when there is nothing to launch, or 1 with c and the grid (nwin, 2) set. */
int dqcu__hot_setup(const dqcu_codec *dc, const void *src, const void *dst, size_t nwin, bool rans_only,
                    dqcu_hot_common *c, dim3 *grid);

#endif
