/* Internals of the GPU encoder shared by its units: encode_cuda.cu (the table of versions, the window
 * mean, the public calls), encode_v5.cu and encode_v4.cu (one kernel version each, instantiated
 * from encode_kernel.cuh), and encode_fixed.cu (the fixed-width family). The value sources below
 * (a stream's values: rotation, key mean, checks; its record in a window) are the encoders' one
 * preprocessing, D-Quant's and the fixed-width family's alike. */
#ifndef DQCU_ENCODE_INTERNAL_CUH
#define DQCU_ENCODE_INTERNAL_CUH

#include <type_traits>

#include "cuda_internal.cuh"

#define ENC_WARPS 4

struct enc_params {
    const dqcu_tables *tab;
    const struct dqcu_rans2_tables *tab2; /* format version 2 (joint pairs), NULL for version 1 */
    int kind;                             /* -1: blockIdx.y */
    size_t count;                         /* streams per kind */
    uint32_t G;                           /* streams per warp group (the level rows in shared memory) */
    size_t bulk_warps;                    /* warps with G streams; after them (enc_plan): */
    uint32_t Gt;                          /* streams per group of the later warps, */
    uint32_t Gt_more;                     /* the first Gt_more of them one more (Gt + 1 <= G) */
    uint32_t row_stride;                  /* bytes per level row (multiple of 4, odd number of words) */
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
/* encode_fixed.cu: the fixed-width family's encoder over p (dc->fixed; p.G and p.row_stride unused),
 * gy = 2 when blockIdx.y picks the kind (p.kind = -1). */
int dqcu__encode_fixed_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream);

/* A stream status of the encoders: nothing to write (its window failed its checks). */
#define STATUS_SKIP 1

/* ---- value sources ---- */

/* Loads stream s into x (lane layout); returns 0, DQ_NONFINITE, or STATUS_SKIP. */
template <int VPL>
__device__ int load_stream(const enc_params &p, const dqcu_tables &tb, int kind, size_t s, uint32_t lane,
                           float (&x)[VPL])
{
    const uint32_t n = tb.n;
    bool bad = false;
    if (p.y) {
        const float *src = p.y + s * n;
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            uint32_t i = (uint32_t)r * 32u + lane;
            x[r] = i < n ? src[i] : 0.0f;
            bad |= i < n && !isfinite(x[r]);
        }
        return __any_sync(DQCU_FULL, bad) ? DQ_NONFINITE : 0;
    }
    const size_t w = s / tb.W, t = s % tb.W;
    if (p.win_status[w] != 0)
        return STATUS_SKIP;
    const void *src = kind == DQ_KIND_K ? p.k : p.v;
    const size_t base = (w * tb.W + t) * n;
    const float *signs = tb.signs;
    /* The element type is picked once and every load of the stream is issued before one is used:
     * with a conversion per element (dqcu_load_elem) ptxas may serialize the loads, each one after
     * the previous one's use (run 51: the windows path 40% slower). F16 bits are converted after. */
    switch (p.dtype) {
    case DQ_DTYPE_F32:
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            uint32_t i = (uint32_t)r * 32u + lane;
            x[r] = i < n ? ((const float *)src)[base + i] : 0.0f;
        }
        break;
    case DQ_DTYPE_BF16:
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            uint32_t i = (uint32_t)r * 32u + lane;
            x[r] = dqcu_bf16_to_f32(i < n ? ((const uint16_t *)src)[base + i] : 0);
        }
        break;
    default: /* F16 */
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            uint32_t i = (uint32_t)r * 32u + lane;
            x[r] = dqcu_bitsf(i < n ? ((const uint16_t *)src)[base + i] : 0u);
        }
#pragma unroll
        for (int r = 0; r < VPL; r++)
            x[r] = dqcu_f16_to_f32((uint16_t)dqcu_fbits(x[r]));
        break;
    }
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        uint32_t i = (uint32_t)r * 32u + lane;
        x[r] = i < n ? x[r] * signs[i] : 0.0f;
    }
    dqcu_fwht(x, tb.d, lane);
#pragma unroll
    for (int r = 0; r < VPL; r++)
        x[r] = x[r] * tb.rot_scale;
    if (kind == DQ_KIND_K) {
        const uint8_t *mean = p.windows[w];
        const float sfm = dqcu_f16_le(mean);
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            uint32_t i = (uint32_t)r * 32u + lane;
            if (i < n) {
                float mu = (float)(int8_t)mean[2 + i] * sfm;
                x[r] = x[r] - mu;
            }
        }
    }
    return 0;
}

/* Byte b < 4 of a record's head: fp16 s, then fp16 o, little-endian. */
__device__ __forceinline__ uint32_t record_head_byte(uint32_t sh, uint32_t oh, uint32_t b)
{
    return (b < 2 ? sh >> (8 * b) : oh >> (8 * (b - 2))) & 0xffu;
}

/* The encoders' kernels hold a stream in VPL values per lane, VPL the smallest power of two with
 * 32·VPL >= n (at most 64: n <= DQCU_MAX_ENCODE_STREAM): launch(std::integral_constant<int, VPL>)
 * for n, or DQ_UNSUPPORTED. */
template <typename F>
static inline int enc_for_vpl(uint32_t n, F &&launch)
{
    uint32_t vpl = 1;
    while (vpl * 32u < n)
        vpl <<= 1;
    switch (vpl) {
    case 1:
        return launch(std::integral_constant<int, 1>());
    case 2:
        return launch(std::integral_constant<int, 2>());
    case 4:
        return launch(std::integral_constant<int, 4>());
    case 8:
        return launch(std::integral_constant<int, 8>());
    case 16:
        return launch(std::integral_constant<int, 16>());
    case 32:
        return launch(std::integral_constant<int, 32>());
    case 64:
        return launch(std::integral_constant<int, 64>());
    default:
        return DQ_UNSUPPORTED;
    }
}

__device__ __forceinline__ uint8_t *record_of(const enc_params &p, const dqcu_tables &tb, int kind, size_t s)
{
    if (p.y)
        return p.records + s * p.record_stride;
    const size_t w = s / tb.W, t = s % tb.W;
    size_t off = 2u + tb.n;
    const size_t rk = 4u + tb.kind[0].C, rv = 4u + tb.kind[1].C;
    if (kind == DQ_KIND_V)
        off += (size_t)tb.W * rk + t * rv;
    else
        off += t * rk;
    return p.windows[w] + off;
}

#endif
