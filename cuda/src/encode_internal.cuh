/* Internals of the GPU encoder shared by its units: encode_cuda.cu (the table of versions, the window
 * mean, the public calls), encode_v5.cu and encode_v4.cu (one kernel version each, instantiated
 * from encode_kernel.cuh). */
#ifndef DQCU_ENCODE_INTERNAL_CUH
#define DQCU_ENCODE_INTERNAL_CUH

#include "cuda_internal.cuh"

#define ENC_WARPS 4

struct enc_params {
    const dqcu_tables *tab;
    const struct dqcu_rans2_tables *tab2; /* format version 2 (joint pairs), NULL for version 1 */
    int kind;            /* -1: blockIdx.y */
    size_t count;        /* streams per kind */
    uint32_t G;          /* streams per warp group (the level rows in shared memory) */
    size_t bulk_warps;   /* warps with G streams; after them (enc_plan): */
    uint32_t Gt;         /* streams per group of the later warps, */
    uint32_t Gt_more;    /* the first Gt_more of them one more (Gt + 1 <= G) */
    uint32_t row_stride; /* bytes per level row (multiple of 4, odd number of words) */
    dq_encode_stats *stats;
    /* streams source */
    const float *y;
    uint8_t *records;
    size_t record_stride;
    int32_t *status;
    /* windows source */
    const void *k, *v;
    int dtype;
    uint8_t *const *windows;
    const int32_t *win_status;
};

/* encode_v5.cu, encode_v4.cu: launch runs the encoder of that version over p (p.G and
 * p.row_stride set); upload_exp2 copies the drift's exp2 table to that unit's constant memory. */
int dqcu__encode5_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream);
int dqcu__encode5_upload_exp2(const float *tab);
int dqcu__encode4_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream);
int dqcu__encode4_upload_exp2(const float *tab);

#endif
