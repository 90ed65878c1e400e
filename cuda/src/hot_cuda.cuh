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

/* The offsets of dq_hot_offsets (key s/o, value s/o, key codes, value codes) for dc's profile;
 * returns the hot window's bytes. */
size_t dqcu__hot_offsets(const dqcu_codec *dc, size_t off[4]);

/* The same offsets as 32-bit kernel parameters, and the bits per code of each kind: the geometry
 * every kernel over hot windows and records takes (the transcode and its inverse). */
void dqcu__hot_geometry(const dqcu_codec *dc, uint32_t off[4], uint32_t bits[2]);

#endif
