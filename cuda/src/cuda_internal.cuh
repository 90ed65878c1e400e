/* Internals shared by the libdquant-cuda sources: the device codec, error checks, and device
 * versions of libdquant's exact arithmetic (fp16/bf16 conversions, the Walsh–Hadamard butterfly).
 *
 * Everything that must be bit-exact with lib/ is compiled with -fmad=false (no contraction of
 * a*b + c), -prec-div=true, -prec-sqrt=true, -ftz=false: plain float/double operators are then the
 * IEEE basic operations lib/ performs with -ffp-contract=off. Kernels that want fused
 * multiply-adds (attention) write __fmaf_rn explicitly. */
#ifndef DQCU_CUDA_INTERNAL_CUH
#define DQCU_CUDA_INTERNAL_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "dquant/cuda.h"

extern "C" {
#include "codec_internal.h"
}

#define DQCU_WARP 32
#define DQCU_FULL 0xffffffffu
#define DQCU_RANS_L (1u << 23)
#define DQCU_EXP2_N 512
#define DQCU_MAX_PAIRS (DQ_MAX_LEVELS * (DQ_MAX_LEVELS - 1) / 2)

/* ---- errors ---- */

void dqcu__set_cuda_error(cudaError_t e);

/* Remembers a failed CUDA call's error (dqcu_last_cuda_error) and gives its dq code. */
static inline int dqcu__cuda_fail(cudaError_t e)
{
    dqcu__set_cuda_error(e);
    return e == cudaErrorMemoryAllocation ? DQ_NOMEM : DQ_INTERNAL;
}

/* NCCL-style checks (CUDACHECK, CUDACHECKGOTO): on a failed CUDA call, remember its error, then
 * return the dq code, or store it in rc and jump to label. */
#define DQCU_CHECK(call)                     \
    do {                                     \
        cudaError_t dqcu__e = (call);        \
        if (dqcu__e != cudaSuccess)          \
            return dqcu__cuda_fail(dqcu__e); \
    } while (0)
#define DQCU_CHECK_GOTO(call, rc, label)     \
    do {                                     \
        cudaError_t dqcu__e = (call);        \
        if (dqcu__e != cudaSuccess) {        \
            (rc) = dqcu__cuda_fail(dqcu__e); \
            goto label;                      \
        }                                    \
    } while (0)
/* The same after a launch. */
#define DQCU_CHECK_LAUNCH() DQCU_CHECK(cudaGetLastError())

/* ---- the device codec ---- */

/* Per kind, everything the kernels read; lives in device global memory and is copied to shared
 * memory by the blocks that use it. */
struct dqcu_kind_tab {
    uint32_t M;        /* levels */
    uint32_t C;        /* container bytes */
    uint32_t cheapest; /* argmin cost */
    uint32_t P;        /* smallest power of two >= M (threshold search) */
    uint32_t npairs;   /* M(M-1)/2 */
    uint32_t pad_;
    int64_t budget_q16; /* (8C - 32) << 16 */
    int32_t cost_q16[32];
    float cost[32];
    /* rANS encoder, per symbol: x_max = 2^23·f, magic, 256 - f, cum | (shift << 16), with
     * x / f == (x · magic) >> shift for every x < 2^31 (Granlund–Montgomery, N = 31). */
    uint4 enc[32];
    /* rANS decoder, per state byte z: (z - c) | f << 8 | (2·m) << 16. */
    uint32_t dec[256];
    uint8_t pair_a[DQCU_MAX_PAIRS]; /* swap-point pairs a < b, index b(b-1)/2 + a */
    uint8_t pair_b[DQCU_MAX_PAIRS];
};

struct dqcu_tables {
    dqcu_kind_tab kind[2];
    uint32_t n, d, log2_d, kv_heads, W, R;
    float rot_scale;
    uint32_t pad_;
    const float *signs; /* n × ±1 (all +1 for seed 0) */
};

struct dqcu_codec {
    dq_profile profile;
    dqcu_settings settings; /* validated; attend_kernel 0 = the newest that runs a shape */
    uint32_t n, d, kv_heads, W, R;
    int device;
    int sm_count;
    size_t smem_optin; /* max dynamic shared memory per block */
    size_t record_bytes[2], mean_bytes, window_bytes;
    dqcu_tables host; /* host copy (signs points to device memory) */
    dqcu_tables *tab; /* device */
    float *signs;     /* device */
    /* fixed-width profiles (DQ_CODEC_FIXED): no rANS tables (host.kind holds M and C only); per kind
     * the base-M packing, symbols per group and bits per group (dq_fixed_packing) */
    bool fixed;
    uint32_t fx_k[2], fx_w[2];
    /* format version 2 (joint pairs, rans2_cuda.cuh): its tables in device memory (NULL for
     * version 1). The encoders, decode, the hot transcode and its inverse take it; the container
     * attention takes it with attention v7 when both kinds have at most 8 levels. */
    bool pairs;
    struct dqcu_rans2_tables *tab2;
};

/* Uploads the exp2 table 2^(i/512) (rounded to float, identical to lib's dq__exp2_table()) to the
 * encoder's constant memory on the current device (the same table for every codec). */
int dqcu__upload_exp2(const float *tab);

/* ---- exact scalar helpers (device ports of lib/src/half.c) ---- */

__device__ __forceinline__ uint32_t dqcu_fbits(float f)
{
    return __float_as_uint(f);
}
__device__ __forceinline__ float dqcu_bitsf(uint32_t u)
{
    return __uint_as_float(u);
}

__device__ __forceinline__ uint16_t dqcu_f32_to_f16(float x)
{
    uint32_t u = dqcu_fbits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        if (a < 0x33000000u)
            return sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (a >> 23) - 112;
    uint32_t m = a & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

__device__ __forceinline__ float dqcu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        if (m == 0)
            return dqcu_bitsf(sign);
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return dqcu_bitsf(sign | 0x7f800000u | (m << 13));
    return dqcu_bitsf(sign | ((e + 112) << 23) | (m << 13));
}

/* Sum and maximum of v over the warp, every lane getting the result (xor butterfly). */
__device__ __forceinline__ float dqcu_warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
        v += __shfl_xor_sync(DQCU_FULL, v, off);
    return v;
}

__device__ __forceinline__ float dqcu_warp_max(float v)
{
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(DQCU_FULL, v, off));
    return v;
}

/* The fp16 at p (two little-endian bytes: a record's scale or offset, a mean block's scale). */
__device__ __forceinline__ float dqcu_f16_le(const uint8_t *p)
{
    return dqcu_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* Record t of a window (DESIGN §3: the key-mean block of 2 + n bytes, W key records of rk bytes,
 * then W value records of rv bytes). */
__device__ __forceinline__ const uint8_t *dqcu_krec(const uint8_t *win, uint32_t n, size_t rk, size_t t)
{
    return win + 2u + n + t * rk;
}

__device__ __forceinline__ const uint8_t *dqcu_vrec(const uint8_t *win, uint32_t n, uint32_t W, size_t rk, size_t rv,
                                                    size_t t)
{
    return win + 2u + n + (size_t)W * rk + t * rv;
}

__device__ __forceinline__ uint16_t dqcu_f64_to_f16(double x)
{
    if (isnan(x))
        return 0x7e00u;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs(x);
    if (a >= 65520.0)
        return (uint16_t)(sign | 0x7c00u);
    if (a <= 0x1p-25)
        return sign;
    int ex;
    frexp(a, &ex);
    int e = ex - 1;
    double ulp = e < -14 ? 0x1p-24 : ldexp(1.0, e - 10);
    double q = a / ulp;
    double r = rint(q);
    double v = r * ulp;
    if (v >= 65520.0)
        return (uint16_t)(sign | 0x7c00u);
    return (uint16_t)(sign | dqcu_f32_to_f16((float)v));
}

__device__ __forceinline__ uint16_t dqcu_f32_to_bf16(float x)
{
    uint32_t u = dqcu_fbits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float dqcu_bf16_to_f32(uint16_t b)
{
    return dqcu_bitsf((uint32_t)b << 16);
}

/* Element i of a [.., n] tensor of dtype as float (exact). */
__device__ __forceinline__ float dqcu_load_elem(const void *src, int dtype, size_t i)
{
    switch (dtype) {
    case DQ_DTYPE_F16:
        return dqcu_f16_to_f32(((const uint16_t *)src)[i]);
    case DQ_DTYPE_BF16:
        return dqcu_bf16_to_f32(((const uint16_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

__device__ __forceinline__ void dqcu_store_elem(void *dst, int dtype, size_t i, float v)
{
    switch (dtype) {
    case DQ_DTYPE_F16:
        ((uint16_t *)dst)[i] = dqcu_f32_to_f16(v);
        break;
    case DQ_DTYPE_BF16:
        ((uint16_t *)dst)[i] = dqcu_f32_to_bf16(v);
        break;
    default:
        ((float *)dst)[i] = v;
        break;
    }
}

/* Sort key of lib's radix sort: orders floats as the sort does (-0 before +0). */
__device__ __forceinline__ uint32_t dqcu_float_key(float f)
{
    uint32_t u = dqcu_fbits(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float dqcu_key_float(uint32_t k)
{
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    return dqcu_bitsf(u);
}

/* ---- the canonical Walsh–Hadamard butterfly (lib/src/hadamard.c dq__fwht) ----
 *
 * Layout: element e of a block of values sits in lane e % 32, slot e / 32 (v[slot]). Stage h pairs
 * e and e + h (e with bit h clear): lower = a + b, upper = a - b, a the lower's value. Stages
 * h < 32 pair lanes (shuffle), stages h >= 32 pair slots of one lane. Stages run h = 1, 2, 4, ...
 * < len, as in lib, so the result is bit-identical. len is a power of two; with len < 32 the
 * butterflies stay inside aligned groups of len lanes. */
template <int SLOTS>
__device__ __forceinline__ void dqcu_fwht(float (&v)[SLOTS], uint32_t len, uint32_t lane)
{
#pragma unroll
    for (uint32_t h = 1; h < 32; h <<= 1) {
        if (h < len) {
            const bool upper = (lane & h) != 0;
#pragma unroll
            for (int r = 0; r < SLOTS; r++) {
                float p = __shfl_xor_sync(DQCU_FULL, v[r], (int)h);
                v[r] = upper ? p - v[r] : v[r] + p;
            }
        }
    }
#pragma unroll
    for (int hh = 1; hh < SLOTS; hh <<= 1) {
        if ((uint32_t)hh * 32u < len) {
#pragma unroll
            for (int r = 0; r < SLOTS; r++) {
                if (!(r & hh)) {
                    float a = v[r], b = v[r | hh];
                    v[r] = a + b;
                    v[r | hh] = a - b;
                }
            }
        }
    }
}

/* Smallest power of two >= x (x >= 1). */
static inline uint32_t dqcu_pow2_ceil(uint32_t x)
{
    uint32_t p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

/* Device properties the launchers need. */
int dqcu__use_device(const dqcu_codec *dc);

#endif
