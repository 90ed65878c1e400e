/* Decode attention over hot windows (dquant/hot.h): v7's tensor-core phases fed by fixed-width
 * codes instead of rANS, and the BF16 tail in the same launch.
 *
 * Grid: x = sequence, y = (split, head group): the sequence's tiles of 128 tokens are cut into
 * nsplit contiguous chunks and its KV heads into nhg groups, so that even one short sequence fills
 * the GPU (at (1, 8K) 64 tiles × 8 heads = 512 blocks where v7 had 64); split nsplit is the BF16
 * tail, head group by head group, in the grid's first row of blocks. Every block writes the partial rows (acc, max, sum) of its
 * query heads in its split; attend_merge_kernel merges the splits by their log-sum-exp.
 *
 * A window block (tiles of its chunk, KV heads of its group), per tile and KV head:
 *   1. keys: each warp computes the scores of two row tiles of 16 tokens on tensor cores
 *      (mma.m16n8k16, as v7): the A fragments are built in registers straight from the code words
 *      (a lane holds 32 channels of two tokens: b words each, one coalesced load per word), a pair
 *      of codes becoming an fp16x2 (512 + m) by two shifts and two LOP3s, minus (512 + c); the B
 *      fragments are the block's queries, rotated, scaled by 2^-e and split into fp16 hi + lo once
 *      per block into shared memory (v7's attend7_prep_kernel, inside the block);
 *      values: thread t unpacks token t's value codes of the head into v7's channel-major level
 *      buffer (bytes 2m);
 *   2. the online softmax of the group's query heads (att_softmax, with the window's key-mean term);
 *   3. the value contraction on tensor cores (att_value_mma), the accumulator in the block's
 *      partial rows in global memory (as v7).
 * No rANS, no decode table: per token and KV head ~25 warp-instructions of unpacking against v7's
 * ~180 of rANS. A tail block attends its ≤ 127 BF16 tokens exactly on CUDA cores in the original
 * domain (scores by threads over tokens, values by threads over channels, loads batched 8 deep). */
#include "attend_internal.cuh"
#include "hot_cuda.cuh"

struct hot_params {
    att_params a;
    uint32_t off[4]; /* dq_hot_offsets */
    uint32_t bk, bv; /* bits per key / value code */
    uint32_t hpb;    /* KV heads per block (KVH / nhg) */
    uint32_t nhg;    /* head groups */
};

__host__ __device__ inline size_t hot_align(size_t b)
{
    return (b + 15) & ~(size_t)15;
}

/* dynamic shared memory, in layout order */
struct hot_layout {
    size_t qf, small, lg, sv, lv, wfr, total;
};
__host__ __device__ inline hot_layout hot_plan(uint32_t QH, uint32_t d, uint32_t G, uint32_t hpb)
{
    const size_t NT = att_ntiles(G), KS = d / 16;
    hot_layout L;
    size_t b = 0;
    L.qf = b;
    b = hot_align(b + (size_t)hpb * NT * KS * 32 * sizeof(uint2)); /* the block's query fragments */
    L.small = b;
    b = hot_align(b + 8 * (size_t)QH * sizeof(float)); /* qsum, m, l, off, alpha, weight scale, query scale,
                                                          key-mean term */
    L.lg = b;
    const size_t lgb = (size_t)G * ATT_T * sizeof(float), tq = (size_t)G * d * sizeof(float);
    b = hot_align(b + (lgb > tq ? lgb : tq) + (size_t)G * ATT_T * sizeof(float)); /* logits (tail: + queries) */
    L.sv = b;
    b = hot_align(b + 2 * ATT_T * sizeof(float)); /* value scale, value mid */
    L.lv = b;
    b = hot_align(b + (size_t)d * ATT_VSTR); /* value levels of one head, channel-major */
    L.wfr = b;
    b = hot_align(b + (ATT_T / 16) * NT * 32 * sizeof(uint2)); /* the weights' fragments */
    L.total = b;
    return L;
}

/* Four codes of B bits at bits [0, 4B) of x as the fp16x2 pairs (512 + m) of codes (0, 1) and
 * (2, 3), minus c2 = (512 + c) in both halves: the key MMA's a0/a2 (a1/a3) registers. */
template <int B>
__device__ __forceinline__ void hot_pairs(uint32_t x, uint32_t c2, uint32_t &p01, uint32_t &p23)
{
    constexpr uint32_t m1 = ((1u << B) - 1u) << 1, m2 = m1 << 16;
    const uint32_t h01 = ((x << 1) & m1) | ((x << (17 - B)) & m2) | 0x60006000u;
    const uint32_t h23 = ((x >> (2 * B - 1)) & m1) | ((x << (17 - 3 * B)) & m2) | 0x60006000u;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(p01) : "r"(h01), "r"(c2));
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(p23) : "r"(h23), "r"(c2));
}

/* Bits [P, P + 4B) of the group's bit string w[0..B) (P + 4B <= 32B), at bit 0. */
template <int B>
__device__ __forceinline__ uint32_t hot_chunk(const uint32_t (&w)[B], int P)
{
    const int i = P >> 5, s = P & 31;
    if (s + 4 * B <= 32 || i + 1 >= B)
        return w[i] >> s;
    return __funnelshift_r(w[i], w[i + 1], s);
}

/* Scores of one KV head for the warp's row tiles: lg[g][t] = scale · (s_t·(q'·m_t)·2^e + mid_t·Σq'),
 * the key-mean term added in the softmax. */
template <int G, int B>
__device__ __forceinline__ void hot_scores(const hot_params &p, const uint8_t *win, uint32_t tbase, uint32_t kvh,
                                           uint32_t kvl, const uint2 *qfs, const float *qsum, const float *qex,
                                           float *lg, float ck, uint32_t c2k, uint32_t warp, uint32_t lane)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t d = tb.d, W = tb.W, KS = d / 16, r = lane >> 2, c = lane & 3u;
    const uint32_t *codes = (const uint32_t *)(const void *)(win + p.off[2]);
    const uint32_t *so = (const uint32_t *)(const void *)(win + p.off[0]);
    for (uint32_t mt = warp; mt < ATT_T / 16; mt += ATT_THREADS / 32) {
        /* tokens past the window (a partial last tile) read a clamped token: their logits are ignored */
        const uint32_t t0 = 16u * mt + r, t1 = t0 + 8u;
        const uint32_t g0 = min(tbase + t0, W - 1), g1 = min(tbase + t1, W - 1);
        /* the tokens' (s, o) first: their load overlaps the code words' */
        const uint32_t sok0 = __ldg(so + g0), sok1 = __ldg(so + g1);
        float dc[NT][4];
#pragma unroll
        for (uint32_t nt = 0; nt < NT; nt++)
            dc[nt][0] = dc[nt][1] = dc[nt][2] = dc[nt][3] = 0.0f;
        /* lane quad c holds channels [c·d/4, (c+1)·d/4) of the head: d/128 groups of 32 */
        for (uint32_t j = 0; j < d / 128; j++) {
            const uint32_t grp = kvh * (d / 32) + c * (d / 128) + j;
            uint32_t w0[B], w1[B];
#pragma unroll
            for (int i = 0; i < B; i++) {
                const uint32_t *row = codes + ((size_t)grp * B + i) * W;
                w0[i] = __ldg(row + g0);
                w1[i] = __ldg(row + g1);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const uint32_t ks = 8u * j + (uint32_t)k;
                uint32_t a0, a1, a2, a3;
                hot_pairs<B>(hot_chunk<B>(w0, 4 * k * B), c2k, a0, a2);
                hot_pairs<B>(hot_chunk<B>(w1, 4 * k * B), c2k, a1, a3);
#pragma unroll
                for (uint32_t nt = 0; nt < NT; nt++)
                    att_mma(dc[nt], a0, a1, a2, a3, qfs[(((size_t)kvl * NT + nt) * KS + ks) * 32 + lane]);
            }
        }
        const float s0 = dqcu_f16_to_f32((uint16_t)sok0), o0 = dqcu_f16_to_f32((uint16_t)(sok0 >> 16));
        const float s1 = dqcu_f16_to_f32((uint16_t)sok1), o1 = dqcu_f16_to_f32((uint16_t)(sok1 >> 16));
        const float mid0 = __fmaf_rn(s0, ck, o0), mid1 = __fmaf_rn(s1, ck, o1);
#pragma unroll
        for (uint32_t nt = 0; nt < NT; nt++) {
            /* columns 2c, 2c + 1 = query head g = 4nt + c, hi and lo */
            const uint32_t g = 4u * nt + c;
            if (g < (uint32_t)G) {
                const uint32_t h = kvh * G + g;
                const float xs = qex[h], qs = qsum[h];
                lg[(size_t)g * ATT_T + t0] = p.a.scale * __fmaf_rn(s0, (dc[nt][0] + dc[nt][1]) * xs, mid0 * qs);
                lg[(size_t)g * ATT_T + t1] = p.a.scale * __fmaf_rn(s1, (dc[nt][2] + dc[nt][3]) * xs, mid1 * qs);
            }
        }
    }
}

/* Token t's value codes of KV head kvh as level bytes 2m into column t of lv (channel-major). */
template <int B>
__device__ __forceinline__ void hot_values(const hot_params &p, const uint8_t *win, uint32_t tok, uint32_t kvh,
                                           uint8_t *lvt)
{
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t d = tb.d, W = tb.W;
    const uint32_t *codes = (const uint32_t *)(const void *)(win + p.off[3]);
    constexpr uint32_t m1 = ((1u << B) - 1u) << 1;
    for (uint32_t j = 0; j < d / 32; j++) {
        const uint32_t grp = kvh * (d / 32) + j;
        uint32_t w[B];
#pragma unroll
        for (int i = 0; i < B; i++)
            w[i] = __ldg(codes + ((size_t)grp * B + i) * W + tok);
        uint8_t *dst = lvt + (size_t)32 * j * ATT_VSTR;
#pragma unroll
        for (int cc = 0; cc < 32; cc++) {
            const int P = cc * B, i = P >> 5, s = P & 31;
            uint32_t x;
            if (s == 0)
                x = w[i] << 1;
            else if (s + B <= 32 || i + 1 >= B)
                x = w[i] >> (s - 1);
            else
                x = __funnelshift_r(w[i], w[i + 1], s - 1);
            dst[(size_t)cc * ATT_VSTR] = (uint8_t)(x & m1);
        }
    }
}

__device__ __forceinline__ void hot_prefetch_l2(const void *a)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

/* Brings the code rows of KV head kvh of the tile at tbase (and with so, the tile's (s, o) rows and
 * the window's key means) into L2, a 128-byte line per thread: issued one head-tile ahead, so that
 * phase 1's loads, which the block waits for between its barriers, find L2 instead of DRAM. */
__device__ __forceinline__ void hot_prefetch_tile_head(const hot_params &p, const uint8_t *win, uint32_t tbase,
                                                       uint32_t cnt, uint32_t kvh, bool so, uint32_t tid)
{
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t gph = tb.d / 32, W = tb.W, lpr = (cnt * 4u + 127u) / 128u + 1u; /* lines per row, misaligned */
    const uint32_t rk = gph * p.bk, rows = rk + gph * p.bv;
    for (uint32_t i = tid; i < rows * lpr; i += ATT_THREADS) {
        const uint32_t row = i / lpr, l = i % lpr;
        const uint32_t kind = row < rk ? 0u : 1u, rr = row < rk ? row : row - rk, b = kind ? p.bv : p.bk;
        const uint32_t grp = kvh * gph + rr / b, wi = rr % b;
        /* (selects, not p.off[2 + kind]: a parameter indexed at run time would be copied to the stack) */
        const uint8_t *a = win + (kind ? p.off[3] : p.off[2]) + (((size_t)grp * b + wi) * W + tbase) * 4u;
        hot_prefetch_l2(a + 128u * l);
    }
    if (so) {
        /* (s, o) rows of both kinds: 4·cnt bytes each; the key means: 2 + n bytes */
        const uint32_t lso = (cnt * 4u + 127u) / 128u + 1u, lmu = (2u + tb.n + 127u) / 128u;
        for (uint32_t i = tid; i < 2 * lso + lmu; i += ATT_THREADS) {
            const uint8_t *a = i < 2 * lso ? win + (i < lso ? p.off[0] : p.off[1]) + tbase * 4u + 128u * (i % lso)
                                           : win + 128u * (i - 2 * lso);
            hot_prefetch_l2(a);
        }
    }
}

/* The rows of query heads [h0, h1) of the block's partial: acc + Σ a·mid, un-rotated (att_finish
 * for a range of heads). */
__device__ __forceinline__ void hot_finish(float *part, uint32_t accs, const float *off_run, const float *m_run,
                                           const float *l_run, const dqcu_tables &tb, uint32_t G, uint32_t h0,
                                           uint32_t h1, uint32_t warp, uint32_t lane)
{
    const uint32_t d = tb.d;
    for (uint32_t h = h0 + warp; h < h1; h += ATT_THREADS / 32) {
        const uint32_t kvh = h / G;
        float y[ATT_DVMAX];
        const float off = off_run[h];
        float *ph = part + (size_t)h * accs;
#pragma unroll
        for (int r2 = 0; r2 < ATT_DVMAX; r2++) {
            const uint32_t e = (uint32_t)r2 * 32u + lane;
            y[r2] = e < d ? ph[e] + off : 0.0f;
        }
        __syncwarp();
        dqcu_fwht(y, d, lane);
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

/* The BF16 tail of KV heads [kv0, kv1), exactly, in the original domain, into the rows of split
 * nsplit (a block of its own). */
template <int G>
__device__ void hot_tail(const hot_params &p, const dqcu_attn_seq &sq, float *part, unsigned char *smem,
                         const hot_layout &L, uint32_t kv0, uint32_t kv1)
{
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t d = tb.d, KVH = tb.kv_heads, QH = p.a.QH, T = sq.tail_tokens, accs = d + 2;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, nwarps = ATT_THREADS / 32;
    float *qs = (float *)(void *)(smem + L.lg);    /* [G][d] this KV head's queries */
    float *wt = qs + (size_t)G * d;                /* [G][ATT_T] logits, then weights */
    float *st = (float *)(void *)(smem + L.small); /* m, l, alpha per group column */
    const float *qb = p.a.q + (size_t)blockIdx.x * QH * d;
    for (uint32_t kvh = kv0; kvh < kv1; kvh++) {
        for (uint32_t i = tid; i < G * d; i += ATT_THREADS)
            qs[i] = qb[(size_t)kvh * G * d + i];
        if (tid < G) {
            st[tid] = -INFINITY;
            st[G + tid] = 0.0f;
        }
        float acc[G][ATT_DVMAX / 4]; /* channels tid + 128i */
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int i = 0; i < ATT_DVMAX / 4; i++)
                acc[g][i] = 0.0f;
        __syncthreads();
        for (uint32_t t0 = 0; t0 < T; t0 += ATT_T) {
            const uint32_t cnt = min((uint32_t)ATT_T, T - t0);
            /* scores: a thread per token, its key row read 64 channels (8 × 16 bytes) at a time, the
             * queries broadcast from shared memory */
            if (tid < cnt) {
                const uint4 *kr = (const uint4 *)(const void *)(sq.tail_k + ((size_t)(t0 + tid) * KVH + kvh) * d);
                float sg[G];
#pragma unroll
                for (int g = 0; g < G; g++)
                    sg[g] = 0.0f;
                for (uint32_t c0 = 0; c0 < d / 8; c0 += 8) {
                    uint4 kw[8];
#pragma unroll
                    for (uint32_t j = 0; j < 8; j++)
                        kw[j] = c0 + j < d / 8 ? __ldg(kr + c0 + j) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                    for (uint32_t j = 0; j < 8; j++) {
                        const uint32_t wv[4] = {kw[j].x, kw[j].y, kw[j].z, kw[j].w};
#pragma unroll
                        for (uint32_t k = 0; k < 8; k++) {
                            const uint32_t e = (c0 + j) * 8u + k;
                            const float kv = dqcu_bitsf(k & 1u ? wv[k / 2] & 0xffff0000u : wv[k / 2] << 16);
                            if (e < d) {
#pragma unroll
                                for (int g = 0; g < G; g++)
                                    sg[g] = __fmaf_rn(qs[(size_t)g * d + e], kv, sg[g]);
                            }
                        }
                    }
                }
#pragma unroll
                for (int g = 0; g < G; g++)
                    wt[(size_t)g * ATT_T + tid] = p.a.scale * sg[g];
            }
            __syncthreads();
            /* softmax: a warp per query head */
            for (uint32_t g = warp; g < (uint32_t)G; g += nwarps) {
                float mb = -INFINITY;
                for (uint32_t u = lane; u < cnt; u += 32)
                    mb = fmaxf(mb, wt[(size_t)g * ATT_T + u]);
                mb = dqcu_warp_max(mb);
                const float mold = st[g], mnew = fmaxf(mold, mb);
                const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
                float ps = 0.0f;
                for (uint32_t u = lane; u < cnt; u += 32) {
                    const float pr = __expf(wt[(size_t)g * ATT_T + u] - mnew);
                    wt[(size_t)g * ATT_T + u] = pr;
                    ps += pr;
                }
                ps = dqcu_warp_sum(ps);
                __syncwarp();
                if (lane == 0) {
                    st[g] = mnew;
                    st[G + g] = __fmaf_rn(st[G + g], alpha, ps);
                    st[2 * G + g] = alpha;
                }
            }
            __syncthreads();
            /* values: threads over channels */
#pragma unroll
            for (int i = 0; i < ATT_DVMAX / 4; i++) {
                const uint32_t e = tid + 128u * (uint32_t)i;
                if (e < d) {
#pragma unroll
                    for (int g = 0; g < G; g++)
                        acc[g][i] *= st[2 * G + g];
                    /* 8 tokens' values loaded before they are used: 8 loads in flight per thread */
                    for (uint32_t u0 = 0; u0 < cnt; u0 += 8) {
                        float v[8];
#pragma unroll
                        for (uint32_t j = 0; j < 8; j++)
                            v[j] = u0 + j < cnt ? dqcu_bf16_to_f32(
                                                      __ldg(sq.tail_v + ((size_t)(t0 + u0 + j) * KVH + kvh) * d + e))
                                                : 0.0f;
#pragma unroll
                        for (uint32_t j = 0; j < 8; j++)
                            if (u0 + j < cnt) {
#pragma unroll
                                for (int g = 0; g < G; g++)
                                    acc[g][i] = __fmaf_rn(wt[(size_t)g * ATT_T + u0 + j], v[j], acc[g][i]);
                            }
                    }
                }
            }
            __syncthreads(); /* the weights are read; the next chunk may overwrite them */
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float *ph = part + (size_t)(kvh * G + g) * accs;
#pragma unroll
            for (int i = 0; i < ATT_DVMAX / 4; i++) {
                const uint32_t e = tid + 128u * (uint32_t)i;
                if (e < d)
                    ph[e] = acc[g][i];
            }
            if (tid == 0) {
                ph[d] = T ? st[g] : -INFINITY;
                ph[d + 1] = T ? st[G + g] : 0.0f;
            }
        }
        __syncthreads(); /* qs and st are reused by the next KV head */
    }
}

template <int G, int BK, int BV>
/* 80 registers (G 8: 128) without spills: 6 blocks (24 warps) per SM where shared memory allows,
 * i.e. with at most 4 KV heads' query fragments per block (the plan picks such head groups) */
__global__ void __launch_bounds__(ATT_THREADS, G >= 8 ? 4 : 6) attend_hot_kernel(hot_params p)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t QH = p.a.QH, d = tb.d, W = tb.W, KS = d / 16, accs = d + 2;
    const hot_layout L = hot_plan(QH, d, G, p.hpb);
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, nwarps = ATT_THREADS / 32;
    const size_t b = blockIdx.x;
    /* the tail's blocks first (blockIdx.y < nhg): they are dispatched first and end long before
     * the windows' at large batch, instead of starting after them */
    const uint32_t yb = blockIdx.y / p.nhg, hg = blockIdx.y % p.nhg;
    const uint32_t split = yb == 0 ? p.a.nsplit : yb - 1;
    const uint32_t kv0 = hg * p.hpb, kv1 = kv0 + p.hpb, h0 = kv0 * G, h1 = kv1 * G;
    const dqcu_attn_seq sq = p.a.seqs[b];
    float *part = p.a.part + (((size_t)b * (p.a.nsplit + 1) + split) * QH) * accs;
    if (split == p.a.nsplit) {
        hot_tail<G>(p, sq, part, smem, L, kv0, kv1);
        return;
    }
    const uint32_t ntiles = sq.nwin * p.a.tpw;
    const uint32_t tile0 = split * p.a.chunk, tile1 = min(ntiles, tile0 + p.a.chunk);
    if (tile0 >= tile1) {
        for (uint32_t h = h0 + tid; h < h1; h += ATT_THREADS) {
            part[(size_t)h * accs + d] = -INFINITY;
            part[(size_t)h * accs + d + 1] = 0.0f;
        }
        return;
    }

    uint2 *qfs = (uint2 *)(void *)(smem + L.qf); /* [hpb][NT][KS][32 lanes] */
    float *qsum = (float *)(void *)(smem + L.small);
    float *m_run = qsum + QH, *l_run = m_run + QH, *off_run = l_run + QH;
    float *alpha_s = off_run + QH, *wsc = alpha_s + QH, *qex = wsc + QH;
    float *lg = (float *)(void *)(smem + L.lg); /* [G][ATT_T] */
    float *sv = (float *)(void *)(smem + L.sv), *midv = sv + ATT_T;
    uint8_t *lv = smem + L.lv;                    /* [d][ATT_VSTR] */
    uint2 *wfr = (uint2 *)(void *)(smem + L.wfr); /* [ATT_T / 16][NT][32] */

    const dqcu_kind_tab &kk = tb.kind[0], &kv_ = tb.kind[1];
    const float ck = 0.5f * (float)(kk.M - 1), cv = 0.5f * (float)(kv_.M - 1);

    /* the block's queries: rotated, scaled by 2^-e per head, fp16 hi + lo B fragments (the layout
     * of attend7_prep_kernel), Σ q' and 2^e; the running state; the accumulator rows zeroed */
    if (G < 4) {
        for (uint32_t i = tid; i < p.hpb * NT * KS * 32; i += ATT_THREADS)
            qfs[i] = make_uint2(0u, 0u);
        __syncthreads();
    }
    const float *qb = p.a.q + b * (size_t)QH * d;
    for (uint32_t h = h0 + warp; h < h1; h += nwarps) {
        const uint32_t kvh = h / G, g = h % G;
        float y[ATT_DVMAX];
        att_rotate_query(qb + (size_t)h * d, tb.signs + kvh * d, tb.rot_scale, d, lane, y);
        float s = 0, mx = 0;
#pragma unroll
        for (int k = 0; k < ATT_DVMAX; k++) {
            s += y[k];
            mx = fmaxf(mx, fabsf(y[k]));
        }
        s = dqcu_warp_sum(s);
        mx = dqcu_warp_max(mx);
        int ex;
        frexpf(mx, &ex);
        ex = max(-120, min(120, ex));
        const float inv = __int_as_float((127 - ex) << 23);
        __half *fh = (__half *)(void *)(qfs + ((size_t)(kvh - kv0) * NT + g / 4u) * KS * 32);
        const uint32_t col = 2u * (g & 3u);
#pragma unroll
        for (int k = 0; k < ATT_DVMAX; k++) {
            const uint32_t e = (uint32_t)k * 32u + lane;
            if (e < d) {
                const float v = y[k] * inv;
                const __half hi = __float2half_rn(v);
                const __half lo = __float2half_rn(v - __half2float(hi));
                const uint32_t w = e >> 2, cq = w / KS, ks = w % KS;
                const size_t at = ((size_t)ks * 32 + 4u * col + cq) * 4 + (e & 3u);
                fh[at] = hi;
                fh[at + 16] = lo;
            }
        }
        if (lane == 0) {
            qsum[h] = s;
            qex[h] = __int_as_float((127 + ex) << 23);
            m_run[h] = -INFINITY;
            l_run[h] = 0.0f;
            off_run[h] = 0.0f;
        }
    }
    for (uint32_t i = tid; i < (h1 - h0) * d; i += ATT_THREADS)
        part[(size_t)(h0 + i / d) * accs + i % d] = 0.0f;
    __syncthreads();

    const __half2 c2kh = __floats2half2_rn(512.0f + ck, 512.0f + ck);
    const __half2 c2vh = __floats2half2_rn(512.0f + cv, 512.0f + cv);
    const uint32_t c2k = *(const uint32_t *)(const void *)&c2kh, c2v = *(const uint32_t *)(const void *)&c2vh;
    const uint32_t t = tid;
    float *qmt = qex + QH; /* Σ q'·μ of the tile's window per head, scaled (phase 1 → softmax) */
    for (uint32_t tile = tile0; tile < tile1; tile++) {
        const uint32_t tbase = (tile % p.a.tpw) * ATT_T, cnt = min((uint32_t)ATT_T, W - tbase);
        const uint8_t *win = sq.windows[tile / p.a.tpw];
        if (tile == tile0)
            hot_prefetch_tile_head(p, win, tbase, cnt, kv0, true, tid);
        const float sfm = dqcu_f16_le(win);
        /* sv/midv of the previous tile were last read before its final barrier */
        if (t < cnt) {
            const uint32_t sov = __ldg((const uint32_t *)(const void *)(win + p.off[1]) + tbase + t);
            const float s2 = dqcu_f16_to_f32((uint16_t)sov), o2 = dqcu_f16_to_f32((uint16_t)(sov >> 16));
            sv[t] = s2;
            midv[t] = __fmaf_rn(s2, cv, o2);
        }
        for (uint32_t kvh = kv0; kvh < kv1; kvh++) {
            /* the next head-tile's lines into L2 while this one is computed */
            if (kvh + 1 < kv1)
                hot_prefetch_tile_head(p, win, tbase, cnt, kvh + 1, false, tid);
            else if (tile + 1 < tile1) {
                const uint32_t nb = ((tile + 1) % p.a.tpw) * ATT_T;
                hot_prefetch_tile_head(p, sq.windows[(tile + 1) / p.a.tpw], nb, min((uint32_t)ATT_T, W - nb), kv0, true,
                                       tid);
            }
            /* ---- 1. values of token t into the level buffer; the keys' scores on tensor cores;
             * the key-mean term Σ_j q'_j μ_j of the group's heads (warp g), its means loaded first ---- */
            const uint8_t *mu = win + 2u + kvh * d;
            /* GI heads per warp; d <= 256: KS <= 16, two k-steps per lane; 4 means per word */
            constexpr int GI = (G + 3) / 4;
            uint32_t muw[GI][2];
#pragma unroll
            for (int gi = 0; gi < GI; gi++) {
                const uint32_t g = warp + nwarps * (uint32_t)gi, cq = lane & 3u;
#pragma unroll
                for (int it = 0; it < 2; it++) {
                    const uint32_t ks = (lane >> 2) + 8u * (uint32_t)it, w = KS * cq + ks;
                    uint32_t v = 0;
                    if (g < (uint32_t)G && ks < KS)
                        for (int i = 0; i < 4; i++)
                            v |= (uint32_t)__ldg(mu + 4u * w + i) << (8 * i);
                    muw[gi][it] = v;
                }
            }
            if (t < cnt)
                hot_values<BV>(p, win, tbase + t, kvh, lv + t);
            hot_scores<G, BK>(p, win, tbase, kvh, kvh - kv0, qfs, qsum, qex, lg, ck, c2k, warp, lane);
#pragma unroll
            for (int gi = 0; gi < GI; gi++) {
                const uint32_t g = warp + nwarps * (uint32_t)gi;
                if (g < (uint32_t)G) {
                    /* from the hi and lo fragments (as v7) */
                    const __half *fh = (const __half *)(const void *)(qfs +
                                                                      ((size_t)(kvh - kv0) * NT + g / 4u) * KS * 32);
                    const uint32_t col = 2u * (g & 3u), cq = lane & 3u;
                    float qm = 0;
#pragma unroll
                    for (int it = 0; it < 2; it++) {
                        const uint32_t ks = (lane >> 2) + 8u * (uint32_t)it;
                        if (ks < KS) {
                            const size_t at = ((size_t)ks * 32 + 4u * col + cq) * 4;
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const float q = __half2float(fh[at + i]) + __half2float(fh[at + 16 + i]);
                                qm = __fmaf_rn(q, (float)(int8_t)(uint8_t)(muw[gi][it] >> (8 * i)), qm);
                            }
                        }
                    }
                    qm = dqcu_warp_sum(qm);
                    if (lane == 0)
                        qmt[kvh * G + g] = p.a.scale * ((qm * qex[kvh * G + g]) * sfm);
                }
            }
            __syncthreads(); /* A: logits, value levels and key-mean terms of head kvh are in place */

            /* ---- 2. softmax of the group's query heads over this tile, one warp per head ---- */
            for (uint32_t g = warp; g < (uint32_t)G; g += nwarps) {
                const uint32_t h = kvh * G + g;
                const float sh = qmt[h];
                att_softmax<NT>(lg + (size_t)g * ATT_T, sh, cnt, h, g, m_run, l_run, off_run, alpha_s, wsc, sv, midv,
                                wfr, lane);
            }
            __syncthreads(); /* B: weights, alpha and scale of the group are in place */

            /* ---- 3. value contraction of head kvh on tensor cores ---- */
            att_value_mma<G>(lv, wfr, kvh, d, part, accs, alpha_s, wsc, c2v, warp, lane);
            __syncthreads(); /* C: the level buffer and the weights are free for the next head */
        }
    }
    hot_finish(part, accs, off_run, m_run, l_run, tb, G, h0, h1, warp, lane);
}

/* ---- host side ---- */

template <int G, int BK, int BV>
static att_attr hot_attr()
{
    static const att_attr a = att_query_attr(attend_hot_kernel<G, BK, BV>);
    return a;
}

/* The instantiated code widths: dq226 and dq196 (3 + 3 bits), and 4 + 4 (M up to 16). */
#define HOT_WIDTHS(X) X(3, 3) X(4, 4)

static bool hot_widths_ok(uint32_t bk, uint32_t bv)
{
#define HOT_W_OK(a, b)      \
    if (bk == a && bv == b) \
        return true;
    HOT_WIDTHS(HOT_W_OK)
#undef HOT_W_OK
    return false;
}

template <int G>
static att_attr hot_attr_g(uint32_t bk, uint32_t bv)
{
#define HOT_W_ATTR(a, b)    \
    if (bk == a && bv == b) \
        return hot_attr<G, a, b>();
    HOT_WIDTHS(HOT_W_ATTR)
#undef HOT_W_ATTR
    return att_attr{};
}

size_t dqcu__attend_hot_smem(uint32_t QH, uint32_t d, uint32_t G, uint32_t hpb)
{
    return hot_plan(QH, d, G, hpb).total;
}

bool dqcu__attend_hot_fit(const dqcu_codec *dc, uint32_t QH, uint32_t hpb, att_fit *f)
{
    const uint32_t G = QH / dc->kv_heads;
    const uint32_t bk = dqcu__hot_bits(dc->host.kind[0].M), bv = dqcu__hot_bits(dc->host.kind[1].M);
    /* the key MMA takes a lane's channels a group of 32 at a time: d a multiple of 128 */
    if (!att_mma_shape_ok(G, dc->d) || dc->d % 128 != 0 || !hot_widths_ok(bk, bv))
        return false;
    att_attr a{};
    switch (G) {
    case 1:
        a = hot_attr_g<1>(bk, bv);
        break;
    case 2:
        a = hot_attr_g<2>(bk, bv);
        break;
    case 4:
        a = hot_attr_g<4>(bk, bv);
        break;
    default:
        a = hot_attr_g<8>(bk, bv);
        break;
    }
    f->smem = dqcu__attend_hot_smem(QH, dc->d, G, hpb);
    f->per_sm = dqcu__attend_blocks_per_sm(dc, a, f->smem);
    f->prep_bytes = 0;
    return f->per_sm >= 1;
}

template <int G, int BK, int BV>
static int launch_hot(const hot_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
    int rc = att_allow_smem<attend_hot_kernel<G, BK, BV>>();
    if (rc)
        return rc;
    attend_hot_kernel<G, BK, BV><<<dim3(nseq, nblk_y), ATT_THREADS, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <int G>
static int launch_hot_g(const hot_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
#define HOT_W_LAUNCH(a, b)      \
    if (p.bk == a && p.bv == b) \
        return launch_hot<G, a, b>(p, smem, nseq, nblk_y, stream);
    HOT_WIDTHS(HOT_W_LAUNCH)
#undef HOT_W_LAUNCH
    return DQ_UNSUPPORTED;
}

int dqcu__attend_hot_launch(const dqcu_codec *dc, const att_params &a, const att_plan &pl, uint32_t nhg, uint32_t nseq,
                            cudaStream_t stream)
{
    hot_params p;
    p.a = a;
    size_t off[4];
    dqcu__hot_offsets(dc, off);
    for (int i = 0; i < 4; i++)
        p.off[i] = (uint32_t)off[i];
    p.bk = dqcu__hot_bits(dc->host.kind[0].M);
    p.bv = dqcu__hot_bits(dc->host.kind[1].M);
    p.nhg = nhg;
    p.hpb = dc->kv_heads / nhg;
    const uint32_t nblk_y = (pl.nsplit + 1) * nhg;
    switch (a.G) {
    case 1:
        return launch_hot_g<1>(p, pl.smem, nseq, nblk_y, stream);
    case 2:
        return launch_hot_g<2>(p, pl.smem, nseq, nblk_y, stream);
    case 4:
        return launch_hot_g<4>(p, pl.smem, nseq, nblk_y, stream);
    default:
        return launch_hot_g<8>(p, pl.smem, nseq, nblk_y, stream);
    }
}
