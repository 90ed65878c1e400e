/* Internals of the hot layout on the GPU (dquant/hot.h): its geometry, shared by the transcoder
 * (hot_cuda.cu) and the attention over hot windows (attend_hot.cu, attend_cuda.cu). */
#ifndef DQCU_HOT_CUDA_CUH
#define DQCU_HOT_CUDA_CUH

#include "cuda_internal.cuh"
#include "hot_lanes.cuh"

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
