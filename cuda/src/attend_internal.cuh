/* Internals of the decode attention (DESIGN §2.7, seed §4.5 and Appendix A), shared by its kernel
 * versions, one source file each: attend_v3.cu (CUDA cores; the BF16 tail and every shape the others
 * do not take), attend_v5.cu and attend_v7.cu (tensor cores), attend_cuda.cu (the table of versions, the
 * plan, the log-sum-exp merge and the public calls). tests/bench/GPU_NOTES.md has each version's
 * design and measurements.
 *
 * Everything here is a piece two or more versions use: the launch parameters, the online softmax,
 * the query rotation, the tensor-core value contraction and the partial-result write. */
#ifndef DQCU_ATTEND_INTERNAL_CUH
#define DQCU_ATTEND_INTERNAL_CUH

#include <math.h>

#include <array>
#include <atomic>

#include <cuda_fp16.h>

#include "rans2_cuda.cuh"

#define ATT_THREADS 128
#define ATT_T 128             /* tokens per tile (= threads; the MMA's K: 8 k-steps of 16) */
#define ATT_MAGIC 0x4a800000u /* 2^22: mantissa units of 1/2, so 2m in the low byte reads as m */
/* Rotation of one head of d values held by a warp (lane l: values l, l + 32, ...; d <= 512). */
#define ATT_DVMAX 16

struct att_params {
    const dqcu_tables *tab;
    const dqcu_rans2_tables *tab2; /* format version 2 (v7 only); NULL for version 1 */
    const dqcu_attn_seq *seqs;
    const float *q;
    float *part; /* [nseq][nsplit + 1][QH][d + 2] */
    void *qprep; /* v7: [nseq] prepared queries (a7_prep_bytes each), after part */
    uint32_t QH, G;
    uint32_t chunk;  /* tiles per block */
    uint32_t nsplit; /* window splits; split nsplit is the tail */
    uint32_t split0; /* split of blockIdx.y 0 (the tail alone: split nsplit) */
    uint32_t tpw;    /* tiles per window */
    float scale;
};

struct att_plan {
    uint32_t tpw, chunk, nsplit;
    size_t smem;
    size_t ws_bytes;
    size_t prep_off; /* v7: offset of the prepared queries in the workspace */
    uint64_t slots;  /* the hot kernel's: blocks resident at once on the GPU */
};

/* What a kernel version needs for one shape: dynamic shared memory per block, blocks per SM, and
 * workspace per sequence besides the partial results (v7's prepared queries). */
struct att_fit {
    size_t smem;
    uint32_t per_sm;
    size_t prep_bytes;
};

/* A compiled kernel's attributes (registers, static shared memory), read from the binary once;
 * ok = false when the query failed. */
struct att_attr {
    cudaFuncAttributes fa;
    bool ok;
};
template <typename K>
static att_attr att_query_attr(K kernel)
{
    att_attr a{};
    a.ok = cudaFuncGetAttributes(&a.fa, kernel) == cudaSuccess;
    (void)cudaGetLastError();
    return a;
}
/* Index of GQA group G (1, 2, 4, 8) in a version's attribute array, -1 for another. */
static inline int att_group_index(uint32_t G)
{
    return G == 1 ? 0 : G == 2 ? 1 : G == 4 ? 2 : G == 8 ? 3 : -1;
}

/* Blocks of a kernel (attributes a, ATT_THREADS threads) one SM of dc's device holds with dyn bytes
 * of dynamic shared memory; 0 when it cannot run at all (attend_cuda.cu). */
uint32_t dqcu__attend_blocks_per_sm(const dqcu_codec *dc, const att_attr &a, size_t dyn);

/* attend_v3.cu: v3 over the splits [p.split0, p.split0 + nblk_y) with smem = dqcu__attend3_smem. */
size_t dqcu__attend3_smem(uint32_t QH, uint32_t d);
int dqcu__attend3_launch(const att_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream);
/* attend_v5.cu, attend_v7.cu: fit says whether the version runs q_heads QH with dc (filling f);
 * launch runs the window splits [0, pl.nsplit). */
bool dqcu__attend5_fit(const dqcu_codec *dc, uint32_t QH, att_fit *f);
int dqcu__attend5_launch(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream);
bool dqcu__attend7_fit(const dqcu_codec *dc, uint32_t QH, att_fit *f);
int dqcu__attend7_launch(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream);
/* attend_hot.cu (hot windows, dquant/hot.h): fit for blocks of hpb KV heads; launch runs the
 * window splits and the tail split of nhg head groups (grid y = (pl.nsplit + 1)·nhg). */
/* 1: the block kernel (attend_hot_kernel); 2: the warp kernel (attend_hotw_kernel): what
 * dqcu_attend_hot runs with dc's settings (dqcu_settings.hot_kernel) and shape. */
int dqcu__attend_hot_version(const dqcu_codec *dc);
bool dqcu__attend_hot_fit(const dqcu_codec *dc, uint32_t QH, uint32_t hpb, att_fit *f);
int dqcu__attend_hot_launch(const dqcu_codec *dc, const att_params &p, const att_plan &pl, uint32_t nhg, uint32_t nseq,
                            cudaStream_t stream);

/* Lets kernel K use all the dynamic shared memory a block may opt in to, once per device (the
 * attribute is per device) instead of a cudaFuncSetAttribute before every launch: run 24 measured
 * ~10 µs per CUDA call on the H200 host, and a decode step makes 36 calls of dqcu_attend. Every
 * thread sets the same value, so racing first calls are harmless. */
template <auto K>
static int att_allow_smem()
{
    static std::atomic<bool> done[64];
    int dev = 0;
    DQCU_CHECK(cudaGetDevice(&dev));
    if (dev >= 0 && dev < 64 && done[dev].load(std::memory_order_acquire))
        return DQ_OK;
    int optin = 0;
    cudaFuncAttributes fa;
    DQCU_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DQCU_CHECK(cudaFuncGetAttributes(&fa, K));
    DQCU_CHECK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - (int)fa.sharedSizeBytes));
    if (dev >= 0 && dev < 64)
        done[dev].store(true, std::memory_order_release);
    return DQ_OK;
}

/* ---- the tensor-core kernels' pieces (v5, v7) ---- */

#define ATT_VSTR \
    (ATT_T + 16)                /* bytes per channel row: 36 words, so the 8 rows × 4 words of an A
                                   fragment load fall in 32 distinct banks */
#define ATT_F16_512 0x60606060u /* fp16 high byte 0x60: 512 + (low byte)/2 */

__host__ __device__ inline uint32_t att_ntiles(uint32_t G)
{
    return (2 * G + 7) / 8;
}

/* True when the tensor-core kernels (v5, v7) take this shape: GQA group 1, 2, 4 or 8, head_dim a
 * multiple of 64 (the value stage splits d/16 MMA row tiles over 4 warps) and at most 256. */
static inline bool att_mma_shape_ok(uint32_t G, uint32_t d)
{
    return (G == 1 || G == 2 || G == 4 || G == 8) && d % 64 == 0 && d <= 256;
}

__device__ __forceinline__ void att_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

/* Two level bytes (2m) of w, selected by sel, as fp16x2 (m - c); c2 = (512 + c) in both halves. */
__device__ __forceinline__ uint32_t att_lv2(uint32_t w, uint32_t sel, uint32_t c2)
{
    const uint32_t h = dqcu_prmt(w, ATT_F16_512, sel);
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(c2));
    return r;
}

/* Online softmax of query head h (group column g) over one tile, one warp (v5 and v7):
 * row = its logits (ATT_T), sh = the window's key-mean term (added to every logit), cnt = tokens in
 * the tile, sv/midv = the value streams' scale and mid level. Updates m/l/off of h, leaves the
 * rescale factor in alpha_s[h] and the weights a_t·s_t (scaled by a power of two, wsc[h] undoes
 * it) as fp16 hi/lo B fragments in wfr, its KV head's [k-step][n-tile][32 lanes] (column pair
 * 2(g % 4), n-tile g / 4). */
template <int NT>
__device__ __forceinline__ void att_softmax(const float *row, float sh, uint32_t cnt, uint32_t h, uint32_t g,
                                            float *m_run, float *l_run, float *off_run, float *alpha_s, float *wsc,
                                            const float *sv, const float *midv, uint2 *wfr, uint32_t lane)
{
    float xs[ATT_T / 32];
    float mb = -INFINITY;
#pragma unroll
    for (int k = 0; k < ATT_T / 32; k++) {
        const uint32_t u = lane + 32u * k;
        xs[k] = u < cnt ? row[u] + sh : -INFINITY;
        mb = fmaxf(mb, xs[k]);
    }
    mb = dqcu_warp_max(mb);
    const float mold = m_run[h];
    const float mnew = fmaxf(mold, mb);
    const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
    float ps = 0, os = 0, mw = 0;
    float wv[ATT_T / 32];
#pragma unroll
    for (int k = 0; k < ATT_T / 32; k++) {
        const uint32_t u = lane + 32u * k;
        wv[k] = 0.0f;
        if (u < cnt) {
            const float pr = __expf(xs[k] - mnew);
            ps += pr;
            os = __fmaf_rn(pr, midv[u], os);
            wv[k] = pr * sv[u];
            mw = fmaxf(mw, fabsf(wv[k]));
        }
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        ps += __shfl_xor_sync(DQCU_FULL, ps, off);
        os += __shfl_xor_sync(DQCU_FULL, os, off);
        mw = fmaxf(mw, __shfl_xor_sync(DQCU_FULL, mw, off));
    }
    /* power-of-two scale: the largest weight in [0.5, 1) for the fp16 split */
    int ex;
    frexpf(mw, &ex);
    ex = max(-120, min(120, ex));
    const float inv = __int_as_float((127 - ex) << 23), sc = __int_as_float((127 + ex) << 23);
    /* every lane read m_run[h] (mold) above; lane 0 overwrites it below: the shuffles in between
     * order execution but not shared memory, so close the intra-warp write-after-read */
    __syncwarp();
    if (lane == 0) {
        m_run[h] = mnew;
        l_run[h] = __fmaf_rn(l_run[h], alpha, ps);
        off_run[h] = __fmaf_rn(off_run[h], alpha, os);
        alpha_s[h] = alpha;
        wsc[h] = sc;
    }
    /* B fragment of k-step u/16, n-tile g/4: lane (column·4 + quad), half u % 4, where
     * column = 2(g % 4) (+1 for lo) and quad = (u / 4) % 4 */
    __half *fb = (__half *)(void *)(wfr + (size_t)(g / 4u) * 32);
    const uint32_t col = 2u * (g & 3u);
#pragma unroll
    for (int k = 0; k < ATT_T / 32; k++) {
        const uint32_t u = lane + 32u * k;
        const float w = wv[k] * inv;
        const __half hi = __float2half_rn(w);
        const __half lo = __float2half_rn(w - __half2float(hi));
        const size_t base = (size_t)(u >> 4) * NT * 32 * 4 + ((u >> 2) & 3u) * 4 + (u & 3u);
        fb[base + (size_t)col * 16] = hi;
        fb[base + (size_t)(col + 1) * 16] = lo;
    }
}

/* Head h of the block's query, rotated for the containers (signs, butterfly, scale): lane l holds
 * channels l, l + 32, ... in y (zero past d). */
__device__ __forceinline__ void att_rotate_query(const float *qh, const float *signs, float rot_scale, uint32_t d,
                                                 uint32_t lane, float (&y)[ATT_DVMAX])
{
#pragma unroll
    for (int r = 0; r < ATT_DVMAX; r++) {
        const uint32_t e = (uint32_t)r * 32u + lane;
        y[r] = e < d ? qh[e] * signs[e] : 0.0f;
    }
    dqcu_fwht(y, d, lane);
#pragma unroll
    for (int r = 0; r < ATT_DVMAX; r++)
        y[r] = y[r] * rot_scale;
}

/* Value contraction of KV head kvh on tensor cores: lv = its levels, channel-major
 * (ATT_VSTR bytes per channel), wfr = the weights; acc (a row of accs floats per query head) of the
 * group's query heads rescaled by alpha_s and increased by the contraction times wsc. c2 = (512 + c)
 * in both fp16 halves. */
template <int G>
__device__ __forceinline__ void att_value_mma(const uint8_t *lv, const uint2 *wfr, uint32_t kvh, uint32_t d, float *acc,
                                              uint32_t accs, const float *alpha_s, const float *wsc, uint32_t c2,
                                              uint32_t warp, uint32_t lane)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t KS = ATT_T / 16;
    const uint32_t nwarps = ATT_THREADS / 32, r = lane >> 2, c = lane & 3u;
    for (uint32_t mt = warp; mt < d / 16; mt += nwarps) {
        const uint8_t *r0 = lv + (size_t)(16u * mt + r) * ATT_VSTR + 4u * c;
#pragma unroll
        for (uint32_t nt = 0; nt < NT; nt++) {
            float dc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint2 *bf = wfr + (size_t)nt * 32 + lane;
#pragma unroll
            for (uint32_t ks = 0; ks < KS; ks++) {
                const uint32_t w0 = *(const uint32_t *)(const void *)(r0 + 16u * ks);
                const uint32_t w1 = *(const uint32_t *)(const void *)(r0 + 8u * ATT_VSTR + 16u * ks);
                att_mma(dc, att_lv2(w0, 0x4140u, c2), att_lv2(w1, 0x4140u, c2), att_lv2(w0, 0x4342u, c2),
                        att_lv2(w1, 0x4342u, c2), bf[(size_t)ks * NT * 32]);
            }
            /* columns 2c, 2c + 1 = query head g = 4nt + c, hi and lo */
            const uint32_t g = 4u * nt + c;
            if (g < (uint32_t)G) {
                const uint32_t h = kvh * G + g, ch = 16u * mt + r;
                const float al = alpha_s[h], sc = wsc[h];
                float *ah = acc + (size_t)h * accs + ch;
                ah[0] = __fmaf_rn(ah[0], al, (dc[0] + dc[1]) * sc);
                ah[8] = __fmaf_rn(ah[8], al, (dc[2] + dc[3]) * sc);
            }
        }
    }
}

/* The block's partial result: acc (rows of accs floats) + Σ a·mid on every channel, un-rotated,
 * then (max, sum). acc may be part itself. */
__device__ __forceinline__ void att_finish(const float *acc, uint32_t accs, const float *off_run, const float *m_run,
                                           const float *l_run, float *part, const dqcu_tables &tb, uint32_t QH,
                                           uint32_t G, uint32_t warp, uint32_t lane)
{
    const uint32_t d = tb.d, nwarps = ATT_THREADS / 32;
    for (uint32_t h = warp; h < QH; h += nwarps) {
        const uint32_t kvh = h / G;
        float y[ATT_DVMAX];
        const float off = off_run[h];
#pragma unroll
        for (int r2 = 0; r2 < ATT_DVMAX; r2++) {
            const uint32_t e = (uint32_t)r2 * 32u + lane;
            y[r2] = e < d ? acc[(size_t)h * accs + e] + off : 0.0f;
        }
        __syncwarp(); /* acc may be this head's row of part (v7): every lane has read it */
        dqcu_fwht(y, d, lane);
        float *ph = part + (size_t)h * (d + 2);
#pragma unroll
        for (int r2 = 0; r2 < ATT_DVMAX; r2++) {
            const uint32_t e = (uint32_t)r2 * 32u + lane;
            if (e < d)
                ph[e] = y[r2] * tb.rot_scale * tb.signs[kvh * d + e];
        }
        if (lane == 0) {
            ph[d] = m_run[h];
            ph[d + 1] = l_run[h];
        }
    }
}

/* A split with no tiles (the sequence is shorter): an empty partial. */
__device__ __forceinline__ void att_empty(float *part, uint32_t QH, uint32_t d, uint32_t tid)
{
    for (uint32_t h = tid; h < QH; h += ATT_THREADS) {
        part[(size_t)h * (d + 2) + d] = -INFINITY;
        part[(size_t)h * (d + 2) + d + 1] = 0.0f;
    }
}

#endif
