/* Token checks and BF16 rounding on the GPU, for appends whose input is already in device memory
 * (the daemon's NCCL path, and its socket path once the bytes are copied up): the same verdict as
 * dq_layer_append's validation (lib/src/layer.c validate_tokens) without a trip through the host.
 *
 * One warp per token, the token's n values in lane layout (value i in lane i % 32, slot i / 32),
 * rotated with the canonical butterfly exactly as dq_rotate does, so the range test sees the same
 * floats as lib. */
#include <math.h>

#include "cuda_internal.cuh"

#define TOK_WARPS 4

struct tok_params {
    const dqcu_tables *tab;
    const void *x;
    int dtype;
    size_t ntok;
    unsigned long long *check;
};

template <int VPL>
__global__ void __launch_bounds__(TOK_WARPS * 32) tokens_check_kernel(tok_params p)
{
    const dqcu_tables &tb = *p.tab;
    const uint32_t n = tb.n, lane = threadIdx.x & 31u;
    const size_t nwarps = (size_t)gridDim.x * TOK_WARPS;
    for (size_t t = (size_t)blockIdx.x * TOK_WARPS + (threadIdx.x >> 5); t < p.ntok; t += nwarps) {
        float y[VPL];
        bool raw_bad = false, bf_bad = false;
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            const uint32_t i = (uint32_t)r * 32u + lane;
            float v = 0.0f;
            if (i < n) {
                const float raw = dqcu_load_elem(p.x, p.dtype, t * n + i);
                raw_bad |= !isfinite(raw);
                v = dqcu_bf16_to_f32(dqcu_f32_to_bf16(raw));
                bf_bad |= !isfinite(v);
                v = v * tb.signs[i];
            }
            y[r] = v;
        }
        raw_bad = __any_sync(DQCU_FULL, raw_bad);
        bf_bad = __any_sync(DQCU_FULL, bf_bad);
        if (raw_bad) {
            if (lane == 0)
                atomicOr(&p.check[0], 1ull);
            continue;
        }
        if (bf_bad) {
            if (lane == 0)
                atomicMin(&p.check[1], 2ull * t);
            continue;
        }
        dqcu_fwht(y, tb.d, lane);
        bool out = false;
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            const uint32_t i = (uint32_t)r * 32u + lane;
            out |= i < n && !(fabsf(y[r] * tb.rot_scale) <= DQ_TOKEN_MAX_ABS);
        }
        if (__any_sync(DQCU_FULL, out) && lane == 0)
            atomicMin(&p.check[1], 2ull * t + 1ull);
    }
}

template <int VPL>
static int launch_check(const tok_params &p, cudaStream_t stream)
{
    const size_t blocks_needed = (p.ntok + TOK_WARPS - 1) / TOK_WARPS;
    const unsigned blocks = (unsigned)(blocks_needed < 65535u * 8u ? blocks_needed : 65535u * 8u);
    tokens_check_kernel<VPL><<<blocks, TOK_WARPS * 32, 0, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

extern "C" int dqcu_tokens_check(const dqcu_codec *dc, const void *x, dq_dtype dtype, size_t ntok,
                                 unsigned long long *check, cudaStream_t stream)
{
    if (!dc || !check || (ntok && !x))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->n > DQCU_MAX_ENCODE_STREAM)
        return DQ_UNSUPPORTED;
    int rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    if (ntok == 0)
        return DQ_OK;
    tok_params p = {dc->tab, x, (int)dtype, ntok, check};
    uint32_t vpl = 1;
    while (vpl * 32u < dc->n)
        vpl <<= 1;
    switch (vpl) {
    case 1:
        return launch_check<1>(p, stream);
    case 2:
        return launch_check<2>(p, stream);
    case 4:
        return launch_check<4>(p, stream);
    case 8:
        return launch_check<8>(p, stream);
    case 16:
        return launch_check<16>(p, stream);
    case 32:
        return launch_check<32>(p, stream);
    case 64:
        return launch_check<64>(p, stream);
    default:
        return DQ_UNSUPPORTED;
    }
}

extern "C" int dqcu_tokens_verdict(const unsigned long long check[2])
{
    if (check[0])
        return DQ_NONFINITE;
    if (check[1] == ~0ull)
        return DQ_OK;
    return (check[1] & 1ull) ? DQ_RANGE : DQ_NONFINITE;
}

__global__ void to_bf16_kernel(const void *x, int dtype, size_t count, uint16_t *out)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        out[i] = dqcu_f32_to_bf16(dqcu_load_elem(x, dtype, i));
}

/* A block per row (grid-stride over rows), 32-bit copies where the row length and both addresses
 * allow them (even n, 4-byte aligned rows). */
__global__ void scatter_rows_kernel(const uint16_t *src, uint32_t n, uint16_t *const *dst, uint32_t nrows)
{
    for (uint32_t row = blockIdx.x; row < nrows; row += gridDim.x) {
        const uint16_t *s = src + (size_t)row * n;
        uint16_t *d = dst[row];
        if ((n & 1u) == 0 && (((uintptr_t)s | (uintptr_t)d) & 3u) == 0) {
            const uint32_t *s2 = (const uint32_t *)(const void *)s;
            uint32_t *d2 = (uint32_t *)(void *)d;
            for (uint32_t i = threadIdx.x; i < n / 2; i += blockDim.x)
                d2[i] = s2[i];
        } else {
            for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
                d[i] = s[i];
        }
    }
}

extern "C" int dqcu_scatter_rows(const uint16_t *src, uint32_t n, uint16_t *const *dst, uint32_t nrows,
                                 cudaStream_t stream)
{
    if (nrows && (!src || !dst || !n))
        return DQ_INVALID_ARGUMENT;
    if (!nrows)
        return DQ_OK;
    const uint32_t blocks = nrows < 65535u ? nrows : 65535u;
    scatter_rows_kernel<<<blocks, 128, 0, stream>>>(src, n, dst, nrows);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

extern "C" int dqcu_to_bf16(const void *x, dq_dtype dtype, size_t count, uint16_t *out, cudaStream_t stream)
{
    if (count && (!x || !out))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (count == 0)
        return DQ_OK;
    if (dtype == DQ_DTYPE_BF16) {
        DQCU_CHECK(cudaMemcpyAsync(out, x, count * sizeof(uint16_t), cudaMemcpyDeviceToDevice, stream));
        return DQ_OK;
    }
    const size_t need = (count + 255) / 256;
    const unsigned blocks = (unsigned)(need < 65535u * 16u ? need : 65535u * 16u);
    to_bf16_kernel<<<blocks, 256, 0, stream>>>(x, (int)dtype, count, out);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
