/* GPU encoder of the fixed-width family (DQ_CODEC_FIXED), byte-identical to lib/src/fixed_codec.c
 * dq__fixed_stream_encode behind the D-Quant preprocessing (encode_internal.cuh load_stream: the
 * rotation, the INT8 key mean of encode_cuda.cu's window-mean kernel, the input checks).
 *
 * One warp per stream, the values in registers (lane l holds values l, l + 32, ...): min and max
 * (exact in any order), the min–max grid and its nearest levels, the least-squares (s, o) of those
 * levels, fp16 s and o, the nearest levels on that grid, then the base-M packing. lib sums y and m·y
 * in double sequentially, value 0 first; those sums are rounded at every step, so lanes 0 and 1 of
 * the warp run them in the same order over the stream staged in shared memory (the same code for
 * both: lane 0 adds 1·y, lane 1 m·y, each product exact); the integer sums Σm and Σm² are exact in
 * any order. Everything else is lib's expressions in lib's order (the build has no contraction:
 * cuda_internal.cuh). */
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "encode_internal.cuh"

#define FX_WARPS 4

struct fx_params {
    enc_params e;
    uint32_t K[2], w[2]; /* per kind: levels per base-M group and bits per group (dq_fixed_packing) */
};

/* Per warp: the stream's values (n floats), then its levels (n bytes), each 16-byte aligned. */
__host__ __device__ static inline size_t fx_levels_off(uint32_t n)
{
    return ((size_t)n * sizeof(float) + 15) & ~(size_t)15;
}

__host__ __device__ static inline size_t fx_warp_bytes(uint32_t n)
{
    return fx_levels_off(n) + (((size_t)n + 15) & ~(size_t)15);
}

/* fixed_codec.c assign_nearest for value y on the grid (s, o), top = M - 1. */
__device__ __forceinline__ uint32_t fx_nearest(float y, double s, double o, uint32_t top)
{
    const double q = s > 0 ? rint(((double)y - o) / s) : 0.0;
    return (uint32_t)(q < 0 ? 0.0 : q > (double)top ? (double)top : q);
}

/* Byte b of the container: the bits [8b, 8b + 8) of the little-endian string of groups, group g
 * (levels gK .. gK + cnt - 1 as a base-M number, the first the least significant) at bit g·w. */
__device__ __forceinline__ uint32_t fx_byte(const uint8_t *lev, uint32_t n, uint32_t M, uint32_t K, uint32_t w,
                                            uint32_t b)
{
    const uint32_t groups = (n + K - 1) / K;
    const uint64_t lo = 8ull * b;
    const uint64_t last = (lo + 7) / w;
    const uint32_t g1 = last < groups - 1 ? (uint32_t)last : groups - 1;
    uint32_t byte = 0;
    for (uint32_t g = (uint32_t)(lo / w); g <= g1; g++) {
        const uint32_t g0 = g * K, cnt = n - g0 < K ? n - g0 : K;
        uint64_t v = 0;
        for (uint32_t i = cnt; i-- > 0;)
            v = v * M + lev[g0 + i];
        const uint64_t pos = (uint64_t)g * w;
        byte |= (uint32_t)((pos >= lo ? v << (pos - lo) : v >> (lo - pos)) & 0xffu);
    }
    return byte;
}

template <int VPL>
__global__ void __launch_bounds__(FX_WARPS * 32) encode_fixed_kernel(fx_params fp)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const enc_params &p = fp.e;
    const int kind = p.kind >= 0 ? p.kind : (int)blockIdx.y;
    const dqcu_tables &tb = *p.tab;
    const uint32_t n = tb.n, M = tb.kind[kind].M, C = tb.kind[kind].C, top = M - 1;
    const uint32_t K = fp.K[kind], w = fp.w[kind];
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    unsigned char *wbase = smem + (size_t)warp * fx_warp_bytes(n);
    float *ys = (float *)(void *)wbase;
    uint8_t *lev = wbase + fx_levels_off(n);
    const size_t nwarps = (size_t)gridDim.x * FX_WARPS;
    uint64_t done = 0;

    float x[VPL];
    uint32_t m[VPL];
    for (size_t s = (size_t)blockIdx.x * FX_WARPS + warp; s < p.count; s += nwarps) {
        const int st = load_stream<VPL>(p, tb, kind, s, lane, x);
        if (st == STATUS_SKIP)
            continue;
        if (st != 0) {
            if (p.status && lane == 0)
                p.status[s] = st;
            continue;
        }
        /* min and max (fminf/fmaxf: the order cannot change a result that matters, see
         * checkcuda: only the sign of a zero could differ, and no output depends on it) */
        float lo = INFINITY, hi = -INFINITY;
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            if ((uint32_t)r * 32u + lane < n) {
                lo = fminf(lo, x[r]);
                hi = fmaxf(hi, x[r]);
            }
        }
#pragma unroll
        for (int off = 16; off >= 1; off >>= 1) {
            lo = fminf(lo, __shfl_xor_sync(DQCU_FULL, lo, off));
            hi = fmaxf(hi, __shfl_xor_sync(DQCU_FULL, hi, off));
        }
        if (!(fabsf(lo) <= DQ_STREAM_MAX_ABS) || !(fabsf(hi) <= DQ_STREAM_MAX_ABS)) {
            if (p.status && lane == 0)
                p.status[s] = DQ_RANGE;
            continue;
        }
        /* the min–max grid and its nearest levels */
        const double s0 = ((double)hi - lo) / top, o0 = lo;
        uint32_t sm = 0, smm = 0;
        __syncwarp(); /* the previous stream's levels have been packed */
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            const uint32_t i = (uint32_t)r * 32u + lane;
            if (i < n) {
                m[r] = fx_nearest(x[r], s0, o0, top);
                sm += m[r];
                smm += m[r] * m[r];
                ys[i] = x[r];
                lev[i] = (uint8_t)m[r];
            }
        }
        __syncwarp();
        /* lib's sequential double sums: lane 0 Σy (as 1·y), lane 1 Σm·y */
        double acc = 0;
        if (lane < 2) {
            for (uint32_t i = 0; i < n; i++) {
                const double f = lane == 0 ? 1.0 : (double)lev[i];
                acc += f * (double)ys[i];
            }
        }
        const double sy = __shfl_sync(DQCU_FULL, acc, 0), smy = __shfl_sync(DQCU_FULL, acc, 1);
        const double dsm = (double)__reduce_add_sync(DQCU_FULL, sm);
        const double dsmm = (double)__reduce_add_sync(DQCU_FULL, smm);
        const double var = dsmm - dsm * dsm / n;
        double gs, go;
        if (var > 0) {
            gs = (smy - dsm * sy / n) / var;
            go = (sy - gs * dsm) / n;
        } else {
            gs = 0;
            go = sy / n;
        }
        if (gs < 0) { /* a rounding below 0 is no slope (fixed_codec.c) */
            gs = 0;
            go = sy / n;
        }
        uint32_t sh = dqcu_f64_to_f16(gs), oh = dqcu_f64_to_f16(go);
        if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
            sh = dqcu_f64_to_f16(s0);
            oh = dqcu_f64_to_f16(o0);
        }
        if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
            if (p.status && lane == 0)
                p.status[s] = DQ_RANGE;
            continue;
        }
        sh &= 0x7fffu; /* s >= 0; never store -0 */
        const double sf = dqcu_f16_to_f32((uint16_t)sh), of = dqcu_f16_to_f32((uint16_t)oh);
        __syncwarp(); /* lanes 0 and 1 have read the levels */
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            const uint32_t i = (uint32_t)r * 32u + lane;
            if (i < n)
                lev[i] = (uint8_t)fx_nearest(x[r], sf, of, top);
        }
        __syncwarp();
        uint8_t *rec = record_of(p, tb, kind, s);
        for (uint32_t b = lane; b < 4u + C; b += 32)
            rec[b] = (uint8_t)(b < 4 ? record_head_byte(sh, oh, b) : fx_byte(lev, n, M, K, w, b - 4));
        if (p.status && lane == 0)
            p.status[s] = 0;
        done++;
    }
    if (p.stats && lane == 0 && done) {
        dq_encode_stats *st = p.stats;
        atomicAdd((unsigned long long *)&st->streams, (unsigned long long)done);
        atomicAdd((unsigned long long *)&st->payload_bytes, (unsigned long long)(done * C));
        atomicMax(&st->max_payload_bytes, C);
    }
}

template <int VPL>
static int launch_fixed(const dqcu_codec *dc, const fx_params &fp, unsigned gy, cudaStream_t stream)
{
    const size_t smem = FX_WARPS * fx_warp_bytes(dc->n);
    if (smem > dc->smem_optin)
        return DQ_UNSUPPORTED;
    DQCU_CHECK(cudaFuncSetAttribute(encode_fixed_kernel<VPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    DQCU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, encode_fixed_kernel<VPL>, FX_WARPS * 32, smem));
    /* one warp per stream, at most one wave of blocks (each warp then strides over the streams) */
    const size_t want = (fp.e.count + FX_WARPS - 1) / FX_WARPS;
    const size_t wave = (size_t)std::max(per_sm, 1) * (size_t)dc->sm_count;
    const size_t blocks = std::min(want, wave);
    encode_fixed_kernel<VPL><<<dim3((unsigned)blocks, gy), FX_WARPS * 32, smem, stream>>>(fp);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

int dqcu__encode_fixed_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream)
{
    if (!dc->fixed)
        return DQ_INTERNAL;
    fx_params fp;
    fp.e = p;
    for (int k = 0; k < 2; k++) {
        fp.K[k] = dc->fx_k[k];
        fp.w[k] = dc->fx_w[k];
    }
    return enc_for_vpl(dc->n, [&](auto vpl) { return launch_fixed<decltype(vpl)::value>(dc, fp, gy, stream); });
}
