/* Decode attention over hot windows (dquant/hot.h): v7's tensor-core phases fed by fixed-width
 * codes instead of rANS, and the BF16 tail in the same launch.
 *
 * Grid: x = sequence, y = (split, head group): the sequence's tiles of 128 tokens are cut into
 * nsplit contiguous chunks and its KV heads into nhg groups, so that even one short sequence fills
 * the GPU (at (1, 8K) 64 tiles × 8 heads = 512 blocks where v7 had 64); split nsplit is the BF16
 * tail, a block per KV head, before or after the window blocks (hot_block_role). Every block
 * writes the partial rows (acc, max, sum) of its query heads in its split; attend_merge_kernel
 * merges the splits by their log-sum-exp.
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
    uint32_t tail0;  /* the grid row of the tail's first block: 0 or nsplit·nhg */
};

/* The grid's rows and what each attends: hot_block_role (hot_lanes.cuh) with this launch's plan. */
__host__ __device__ inline uint32_t hot_grid_y(const hot_params &p, uint32_t kv_heads)
{
    return hot_grid_rows(p.a.nsplit, p.nhg, kv_heads);
}

__device__ __forceinline__ void hot_role(const hot_params &p, uint32_t kv_heads, uint32_t y, uint32_t &split,
                                         uint32_t &kv0, uint32_t &kv1)
{
    hot_block_role(p.a.nsplit, p.nhg, p.hpb, kv_heads, p.tail0, y, split, kv0, kv1);
}

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
                hot_key_pairs<B>(w0, k, c2k, a0, a2);
                hot_key_pairs<B>(w1, k, c2k, a1, a3);
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
    const uint32_t d = tb.d, P = (tb.W + 1) / 2, sh = 16u * (tok & 1u);
    const uint32_t *codes = (const uint32_t *)(const void *)(win + p.off[3]);
    for (uint32_t j = 0; j < d / 32; j++) {
        const uint32_t grp = kvh * (d / 32) + j;
        uint8_t *dst = lvt + (size_t)32 * j * ATT_VSTR;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t w[B];
#pragma unroll
            for (int i = 0; i < B; i++)
                w[i] = (__ldg(codes + ((size_t)grp * 2 * B + (uint32_t)(B * h + i)) * P + tok / 2u) >> sh) & 0xffffu;
#pragma unroll
            for (int k = 0; k < 16; k++)
                dst[(size_t)(16 * h + k) * ATT_VSTR] = (uint8_t)(hot_lane_code<B, 16>(w, k) << 1);
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
    /* key rows: b_K words of W tokens per group; value rows: 2·b_V words of P token pairs */
    const uint32_t gph = tb.d / 32, W = tb.W, P = (W + 1) / 2,
                   lpr = (cnt * 4u + 127u) / 128u + 1u; /* lines per row, misaligned */
    const uint32_t rk = gph * p.bk, rows = rk + gph * 2u * p.bv;
    for (uint32_t i = tid; i < rows * lpr; i += ATT_THREADS) {
        const uint32_t row = i / lpr, l = i % lpr;
        const uint32_t kind = row < rk ? 0u : 1u, rr = row < rk ? row : row - rk, b = kind ? 2u * p.bv : p.bk;
        const uint32_t grp = kvh * gph + rr / b, wi = rr % b;
        if (kind && 128u * l >= cnt * 2u + 128u)
            continue;
        /* (selects, not p.off[2 + kind]: a parameter indexed at run time would be copied to the stack) */
        const uint8_t *a = kind ? win + p.off[3] + (((size_t)grp * b + wi) * P + tbase / 2u) * 4u
                                : win + p.off[2] + (((size_t)grp * b + wi) * W + tbase) * 4u;
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
    uint32_t split, kv0, kv1;
    hot_role(p, tb.kv_heads, blockIdx.y, split, kv0, kv1);
    const uint32_t h0 = kv0 * G, h1 = kv1 * G;
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

    const __half2 c2kh = __floats2half2_rn(512.0f + ck, 512.0f + ck); /* hot_key_pairs */
    const __half2 c2vh = __floats2half2_rn(512.0f + cv, 512.0f + cv); /* v7's value MMA: levels 2m */
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

/* ---- the warp kernel (hot kernel 2): d = 128, windows of a multiple of 128 tokens ----
 *
 * Every warp attends sub-tiles of 16 tokens of one KV head on its own: no barrier between loading
 * a sub-tile's codes and accumulating its values. The block's 4 warps take every fourth of a
 * round's sub-tiles (warp w: w, w + 4, ..., so that a tile's rows are read by the 4 warps side by
 * side), each with its own softmax and accumulator in registers, and are merged once per KV head
 * at the end. Lane (g, t) (g = lane / 4, t = lane % 4) holds HL heads of the
 * group, h = HL·t + e (HL = 1 for G <= 4, 2 for G = 8), and tokens g and g + 8 of each sub-tile.
 *
 * Scores S^T = K·Q^T on integer tensor cores (mma.m16n8k32, u8 × s8 → s32, exact): the A operand
 * is the key codes m as bytes, straight from the hot layout's byte lanes (row g: token g; the
 * lane's k-slots 4t.. of k-step s are channels 32t + 8s + 0..3, its k-slots 16 + 4t.. channels
 * 32t + 8s + 4..7: one shift and one mask each, the queries permuted to match). The B operand is
 * the queries, rotated and scaled by 2^(19 - e) (max |q'| < 2^e), as integers Q = 2^14·hi +
 * 2^7·mid + lo in balanced base-128 digits (twice each digit as s8), built once per KV head into
 * shared memory (hw_query): for G <= 4 n-tile 0's column 2h is head h's hi, 2h + 1 its mid,
 * n-tile 1's column 2h its lo (2h + 1 zero), so lane (g, t)'s C fragments hold all three digit
 * products of head t for tokens g and g + 8; for G = 8 n-tile d's column h is head h's digit d.
 * Each product starts from -(M - 1)·Σdigit and so ends at Σ digit·(2m - (M - 1)) =
 * 2·Σ digit·(m - c); 2^14·D_hi + 2^7·D_mid + D_lo, summed in integers and rounded once to fp32,
 * is 2^(20 - e)·q'·(m - c) (hot_digit_dot). Every lane's scores are real ones: no lane computes
 * a softmax for an empty row.
 *
 * The softmax is lazy: each head's reference max m (log2 units, the same in the 8 lanes holding
 * the head) changes only when a score exceeds it by more than 2^8 (a vote per sub-tile; then the
 * head's max over the sub-tile becomes the reference, and the accumulator, Σp and Σp·mid are
 * rescaled), so the weights p = 2^(x - m) stay below 2^8 without a reduction per sub-tile.
 *
 * Values O^T = V^T·P^T on fp16 tensor cores (mma.m16n8k16): the A operand is the value codes as
 * the fp16 subnormals 2(m - c)·2^(z - 24) (exact; z = hot_value_scale of the code), straight
 * from the half-word lanes: lane (g, t) reads, for group g / 2 and channels 16·(g % 2) .., the
 * words of token pairs (2t, 2t + 1) and (2t + 8, 2t + 9), and a mask and a subtraction make a
 * channel's pair of centred codes where it sits in the word (hot_value_operand_scaled: codes
 * above fp16's mantissa after one shift of their word; row g of m-tile i: channel 16g + 2i, row
 * g + 8: 16g + 2i + 1; each row's 2^z comes off when the warp's rows are written out): about 2
 * instructions a code, against 3 for a shift, a mask and a subtraction (hot_value_operand, until
 * run 116).
 * Centred: accumulating Σ w·m in the tensor cores' fp32 and cancelling its large offset at the
 * end lost up to 1.2e-3 of the result over 16K tokens (run 102). The B operand is the weights
 * p·s·2^E as fp16 hi + lo (column 2h head h's hi, 2h + 1 its lo; for G = 8 one n-tile per e),
 * moved from the lanes that computed them (tokens g, g + 8) to the lanes the fragment needs
 * (column g): for G <= 4 lane (g, t)'s (hi, lo) of token g + 8r is row g, columns 2t, 2t + 1 of
 * an 8 x 8 fp16 matrix, and movmatrix.trans hands lane (g, t) column g's tokens 2t, 2t + 1, the
 * fragment; for G = 8 (two heads a lane) through a small buffer in shared memory. The
 * accumulator's lane (g, t) then holds head h's hi and lo sums side by side. The value scale s
 * folds into the weights, the offset (s·c + o) into a scalar per head (Σ p·mid); 2^E (warp-wide,
 * moved with the same rescale when a sub-tile's largest s would overflow it or has fallen 2^10
 * below it) keeps p·s·2^E below 2^15 and far above fp16's subnormals. The key means' term q'·μ
 * is computed once per tile and head by a warp, in rounds of HW_ROUND tiles between two
 * barriers. */
#define HW_D 128
#define HW_ROUND 64 /* tiles of a round: one KV head's whole chunk where the plan cuts chunks of <= 64 */
#define HW_SETUP 2  /* tiles a warp sets up at a time in a round's setup (4 spilled at fixed226) */
#define HW_WARPS (ATT_THREADS / 32)

#define HW_RING \
    2 /* a warp's ring: pairs of sub-tiles (a tile's w and w + 4), tile i + 1's in flight while i is computed */
#define HW_LAZY 8.0f /* log2 of the largest weight before the reference max moves */

/* Bytes of one sub-tile in a warp's ring, in the order its 16-byte chunks are copied: key codes
 * [group c][word i][16 tokens], value codes likewise, the 16 key (s, o) pairs, the 16 value pairs. */
__host__ __device__ constexpr uint32_t hw_stage_bytes(uint32_t bk, uint32_t bv)
{
    return 256u * (bk + bv) + 128u;
}

/* heads per lane and score n-tiles */
__host__ __device__ constexpr int hw_hl(int G)
{
    return G <= 4 ? 1 : 2;
}
__host__ __device__ constexpr int hw_nst(int G)
{
    return G <= 4 ? 2 : 3;
}

struct hotw_layout {
    size_t qs, pt, qd, qf, qmu, wp, wt, mrg, st, ring, total;
};
__host__ __device__ inline hotw_layout hotw_plan(uint32_t G, uint32_t bk, uint32_t bv)
{
    hotw_layout L;
    size_t b = 0;
    L.qs = b; /* [G][128] rotated queries (fp32) */
    b = hot_align(b + (size_t)G * HW_D * sizeof(float));
    L.pt = b; /* G = 8: [warps][2 n-tiles][8 columns][DQCU_HOT_PSTR] the weights' transpose buffer (hot_pt_at) */
    b = hot_align(b + (G <= 4 ? 0 : (size_t)HW_WARPS * 2 * 8 * DQCU_HOT_PSTR * 2));
    L.qd = b; /* [3 digits][G][128] the queries' base-128 digits (int8) */
    b = hot_align(b + 3 * (size_t)G * HW_D);
    L.qf = b; /* hw_query: [4][n-tiles][32] uint2, then [n-tiles][32] int4 */
    b = hot_align(b + (size_t)hw_nst((int)G) * 32 * (4 * sizeof(uint2) + sizeof(int4)));
    L.qmu = b; /* [HW_ROUND][G] key-mean terms */
    b = hot_align(b + (size_t)HW_ROUND * G * sizeof(float));
    L.wp = b; /* [HW_ROUND] the round's tiles' windows */
    b = hot_align(b + (size_t)HW_ROUND * sizeof(const uint8_t *));
    L.wt = b; /* [HW_ROUND] the round's tiles' first tokens in their windows */
    b = hot_align(b + (size_t)HW_ROUND * sizeof(uint32_t));
    L.mrg = b; /* [warps][G][128] the warps' accumulators */
    b = hot_align(b + (size_t)HW_WARPS * G * HW_D * sizeof(float));
    L.st = b; /* [warps][G] m, l, off; then qsum[G], 2^(e - 20)[G], Σdigit[3][G] (int) */
    b = hot_align(b + ((size_t)HW_WARPS * G * 3 + 5 * G) * sizeof(float));
    L.ring = b; /* [warps][HW_RING][2] sub-tiles */
    b = hot_align(b + (size_t)HW_WARPS * HW_RING * 2 * hw_stage_bytes(bk, bv));
    L.total = b;
    return L;
}

__device__ __forceinline__ void hw_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The score products: codes (u8, A) times twice the query digits (s8, B), accumulated (first:
 * from the starting values c instead). */
__device__ __forceinline__ void hw_imma(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void hw_imma_from(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                             const int4 &c)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c.x), "r"(c.y), "r"(c.z), "r"(c.w));
}

/* 2^k for a compile-time k (|k| < 127) */
__device__ __forceinline__ constexpr float hw_pow2(int k)
{
    return k >= 0 ? (float)(1u << (k & 31)) : 1.0f / (float)(1u << (-k & 31));
}

/* 2^x (ex2.approx.ftz: 2 ulp, results below 2^-126 flush to 0 — weights that small next to the
 * reference max's 1 do not count). */
__device__ __forceinline__ float hw_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Lane (g, t) gets elements (2t, g) and (2t + 1, g) of the 8 x 8 fp16 matrix whose row g, columns
 * 2t, 2t + 1 lane (g, t) holds in x. */
__device__ __forceinline__ uint32_t hw_transpose8(uint32_t x)
{
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

template <int HL>
struct hw_state {
    float m[HL];          /* head's reference max (log2 units; -inf before its first sub-tile) */
    float l[HL], off[HL]; /* this lane's share of Σp and Σp·mid */
    int E;                /* the weights' scale 2^E (starts at 100: the first nonzero s sets it) */
    float O[8][HL][4];    /* m-tile i: rows channel 16g + 2i (c0 hi, c1 lo), 16g + 2i + 1 (c2, c3) */
};

/* A sub-tile (tokens [tw0, tw0 + 16) of window win, KV head kvh) in a ring stage: 16·(b_K + b_V) + 8
 * chunks of 16 bytes, the warp's lanes taking every 32nd chunk. Every source is 16-byte aligned:
 * the hot layout's regions are, W is a multiple of 128 and tw0 of 16. */
template <int BK, int BV>
struct hw_src {
    uint32_t off[(16 * (BK + BV) + 8 + 31) / 32]; /* this lane's chunks: their offsets in a window at tw0 = 0 */
    uint32_t pair;                                /* bit k: chunk k is value codes (token pairs: 2 bytes a token) */
};

/* The offsets (from the window's start, for tokens from 0) of the 16-byte chunks lane copies for
 * KV head kvh: chunk q = lane + 32k of a sub-tile, in the stage's order (hot_stage_key_chunk,
 * hot_stage_value_chunk: key codes, row (group t, word i) of 16 tokens, value codes, row (lane
 * row g, word i) of 8 token pairs, the chunks of a row swizzled; then the (s, o) pairs). A
 * sub-tile at tw0 adds 4·tw0 (2·tw0 to value codes). */
template <int BK, int BV>
__device__ __forceinline__ hw_src<BK, BV> hw_sources(const hot_params &p, uint32_t W, uint32_t kvh, uint32_t lane)
{
    constexpr uint32_t NK = 16 * BK, NV = 16 * BV, N = NK + NV + 8;
    hw_src<BK, BV> o;
    o.pair = 0;
#pragma unroll
    for (uint32_t k = 0; k < (N + 31) / 32; k++) {
        const uint32_t q = lane + 32u * k;
        uint32_t r, i, c;
        if (q < NK) { /* word i of group t: row (4·kvh + t)·b_K + i of W words */
            hot_stage_key_chunk(q, r, i, c);
            o.off[k] = p.off[2] + (((kvh * 4u + r) * BK + i) * W << 2) + (c << 4);
        } else if (q < NK + NV) { /* word i of lane row g: row 8·kvh·b_V + b_V·g + i of W / 2 words */
            hot_stage_value_chunk(q - NK, r, i, c);
            o.off[k] = p.off[3] + ((kvh * 8u * BV + BV * r + i) * (W / 2) << 2) + (c << 4);
            o.pair |= 1u << k;
        } else {
            const uint32_t qq = q - NK - NV;
            o.off[k] = (qq < 4 ? p.off[0] : p.off[1]) + ((qq & 3u) << 4);
        }
    }
    return o;
}

/* Copies the warp's two sub-tiles of a tile (tokens tw0 + [0, 16) and tw0 + 64 + [0, 16): the
 * second's sources are the first's 64 tokens on) into the two adjacent ring stages at shared
 * address dst, with one commit group and one wait for both (runs 136–137: 1% against a sub-tile
 * at a time; with the window pointers loaded a tile ahead, 3.5% on top of cp.async.ca, runs 140
 * and 142). cp.async.ca, through L1, which merges the lanes reading one code row into one L2
 * request of whole sectors: .cg (L2 only) sent each lane's 16 bytes as a request of its own, and
 * L2 served two requests for most 32-byte sectors. At the end-to-end shape: 132 M requests for
 * 148 M sectors against 67 M for 96 M (runs 139–140), attention a step 7% faster. */
template <int BK, int BV>
__device__ __forceinline__ void hw_issue_pair(const hw_src<BK, BV> &src, const uint8_t *win, uint32_t tw0, uint32_t dst,
                                              uint32_t lane)
{
    constexpr uint32_t N = 16 * (BK + BV) + 8, STB = hw_stage_bytes(BK, BV);
#pragma unroll
    for (uint32_t k = 0; k < (N + 31) / 32; k++) {
        const uint32_t q = lane + 32u * k;
        const bool pr = (src.pair >> k) & 1u;
        const uint8_t *a = win + src.off[k] + (pr ? 2u : 4u) * tw0;
        if (q < N) {
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst + 16u * q), "l"(a) : "memory");
            asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst + STB + 16u * q),
                         "l"(a + (pr ? 128u : 256u))
                         : "memory");
        }
    }
}

__device__ __forceinline__ void hw_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* The query B fragments of one KV head (built once per KV head into shared memory, read per
 * sub-tile: in registers they pushed the kernel past 128 registers) and the starting values
 * -(M - 1)·Σdigit of each lane's columns 2t, 2t + 1. */
template <int G>
struct hw_query {
    const uint2 *b;   /* [4 k-steps][score n-tiles][32 lanes] */
    const int4 *init; /* [score n-tiles][32 lanes] */
};

/* The block's threads write the fragments of every (k-step, n-tile, lane): b0 holds k-slots
 * 4t .. 4t + 3 of column g (channels 32t + 8ks + 0..3), b1 channels + 4..7, each digit doubled. */
template <int G>
__device__ __forceinline__ void hw_query_build(uint2 *qb, int4 *qi, const int8_t *qd, const int *qds, int mk1,
                                               uint32_t tid)
{
    constexpr uint32_t NS = hw_nst(G);
    for (uint32_t x = tid; x < (4 + 1) * NS * 32u; x += ATT_THREADS) {
        const uint32_t ln = x % 32u, g = ln >> 2, t = ln & 3u, s = (x / 32u) % NS, ks = x / (32u * NS);
        if (ks < 4) {
            uint32_t dg, h, v[2] = {0u, 0u};
            if (hot_score_column(G, (int)s, g, dg, h))
                for (int hf = 0; hf < 2; hf++)
                    v[hf] = (*(const uint32_t *)(const void *)(qd + ((size_t)dg * G + h) * HW_D + 32u * t + 8u * ks +
                                                               4u * (uint32_t)hf)
                             << 1) &
                            0xfefefefeu;
            qb[x] = make_uint2(v[0], v[1]);
        } else {
            int in[2];
            for (uint32_t e = 0; e < 2; e++) {
                uint32_t de, he;
                in[e] = hot_score_column(G, (int)s, 2u * t + e, de, he) ? -mk1 * qds[de * G + he] : 0;
            }
            qi[s * 32u + ln] = make_int4(in[0], in[1], in[0], in[1]);
        }
    }
}

/* A vote found a score more than 2^HW_LAZY above its head's reference max, or the sub-tile's
 * largest value scale smax (warp-wide) outside [2^(-3 - E), 2^(7 - E)) (rs): each head takes its
 * sub-tile max as the reference where it must, E becomes 7 - ex (smax < 2^ex, so s·2^E < 2^7 for
 * every s of the sub-tile and its largest weights stay far above fp16's subnormals), and the
 * accumulators follow. */
template <int HL>
__device__ __forceinline__ void hw_rescale(hw_state<HL> &S, const float (&lg)[HL][2], float smax, bool rs)
{
    const int En = rs ? max(-100, min(100, 7 - ((int)((__float_as_uint(smax) >> 23) & 0xffu) - 126))) : S.E;
#pragma unroll
    for (int e = 0; e < HL; e++) {
        float mx = fmaxf(lg[e][0], lg[e][1]);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
            mx = fmaxf(mx, __shfl_xor_sync(DQCU_FULL, mx, o));
        const float mn = mx > S.m[e] + HW_LAZY ? mx : S.m[e];
        const float a = hw_ex2(S.m[e] - mn); /* 0 before the head's first sub-tile */
        const float f = a * hw_ex2((float)(En - S.E));
        S.l[e] *= a;
        S.off[e] *= a;
        S.m[e] = mn;
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                S.O[i][e][k] *= f;
    }
    S.E = En;
}

/* One sub-tile from its ring stage stg (see hw_issue_pair). qm, xs, qsm: the lane's heads' key-mean
 * term, query scale 2^(e - 20) and Σ q'; ck, cv the centres (M - 1) / 2, cm = M_V - 1 in both
 * halves; pt: the warp's transpose buffer (G = 8). */
template <int G, int BK, int BV>
__device__ __forceinline__ void hw_subtile(const uint32_t *stg, const hw_query<G> &Q, const float (&qm)[hw_hl(G)],
                                           const float (&xs)[hw_hl(G)], const float (&qsm)[hw_hl(G)], float scale,
                                           float ck, float cv, uint32_t cm, hw_state<hw_hl(G)> &S, uint16_t *pt,
                                           uint32_t g, uint32_t t)
{
    constexpr int HL = hw_hl(G), NS = hw_nst(G);
    /* the key words of tokens g and g + 8 (group t of the head), the (s, o) pairs of both */
    uint32_t w0[BK], w1[BK];
#pragma unroll
    for (int i = 0; i < BK; i++) {
        w0[i] = stg[hot_stage_key_at(t, (uint32_t)i, g)];
        w1[i] = stg[hot_stage_key_at(t, (uint32_t)i, g + 8u)];
    }
    const uint32_t *so = stg + 64u * (BK + BV);
    const uint32_t ks2[2] = {so[g], so[g + 8u]}, vs2[2] = {so[16u + g], so[24u + g]};
    const uint32_t lane = 4u * g + t;

    /* ---- scores on integer tensor cores ---- */
    int C[NS][4];
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const uint32_t a[4] = {hot_lane_code<BK, 8>(w0, 2 * ks), hot_lane_code<BK, 8>(w1, 2 * ks),
                               hot_lane_code<BK, 8>(w0, 2 * ks + 1), hot_lane_code<BK, 8>(w1, 2 * ks + 1)};
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const uint2 qf = Q.b[(ks * NS + s) * 32 + (int)lane];
            if (ks == 0)
                hw_imma_from(C[s], a, qf.x, qf.y, Q.init[s * 32 + (int)lane]);
            else
                hw_imma(C[s], a, qf.x, qf.y);
        }
    }
    float lg[HL][2], sv[2], mid[2];
    bool trig = false;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        /* (s, o) pairs converted in hardware (exact, subnormals included; dq_hot_check keeps them finite) */
        const float2 sok = __half22float2(*(const __half2 *)(const void *)&ks2[r]);
        const float2 sov = __half22float2(*(const __half2 *)(const void *)&vs2[r]);
        sv[r] = sov.x;
        mid[r] = __fmaf_rn(sov.x, cv, sov.y);
#pragma unroll
        for (int e = 0; e < HL; e++) {
            const float dot = hot_tile_dot<G>(C, r, e);
            lg[e][r] = __fmaf_rn(scale, __fmaf_rn(sok.x, dot * xs[e], __fmaf_rn(sok.x, ck, sok.y) * qsm[e]), qm[e]);
            trig |= lg[e][r] > S.m[e] + HW_LAZY;
        }
    }
    /* the sub-tile's largest value scale (s >= 0: its bits order as integers; a -0 counts as 0) */
    const float smax = __uint_as_float(
        __reduce_max_sync(DQCU_FULL, __float_as_uint(fmaxf(sv[0], sv[1])) & 0x7fffffffu));
    const uint32_t lim = (uint32_t)(127 + 7 - S.E) << 23; /* 2^(7 - E) */
    /* (no short-circuit: branches and byte flags for || and && took 6% of the samples, run 118) */
    const bool rs = (smax >= __uint_as_float(lim)) | ((smax > 0.0f) & (smax < __uint_as_float(lim - (10u << 23))));
    if (rs || __any_sync(DQCU_FULL, trig))
        hw_rescale<HL>(S, lg, smax, rs);

    /* ---- the weights p·s·2^E as fp16 hi + lo, moved to the value product's B fragments ---- */
    const float sc = __int_as_float((127 + S.E) << 23);
    uint32_t pb[HL][2];
#pragma unroll
    for (int e = 0; e < HL; e++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float pr = hw_ex2(lg[e][r] - S.m[e]);
            S.l[e] += pr;
            S.off[e] = __fmaf_rn(pr, mid[r], S.off[e]);
            const uint32_t hl = hot_weight_pair(pr * (sv[r] * sc));
            if constexpr (HL == 1) {
                pb[0][r] = hw_transpose8(hl); /* column g's tokens 8r + 2t, 8r + 2t + 1 */
            } else {
                uint16_t *col = pt + hot_pt_at(e, 2 * t, g + 8 * r);
                col[0] = (uint16_t)hl;
                col[DQCU_HOT_PSTR] = (uint16_t)(hl >> 16); /* column 2t + 1 */
            }
        }
    if constexpr (HL > 1) {
        __syncwarp();
#pragma unroll
        for (int e = 0; e < HL; e++) {
            const uint16_t *col = pt + hot_pt_at(e, g, 2 * t);
            pb[e][0] = *(const uint32_t *)(const void *)col;
            pb[e][1] = *(const uint32_t *)(const void *)(col + 8);
        }
    }

    /* ---- values on tensor cores, straight from the code words (fp16 subnormals 2(m - c)·2^(z - 24)) ---- */
    const uint32_t *vst = stg + 64u * BK;
    uint32_t u0[BV], u4[BV];
#pragma unroll
    for (int i = 0; i < BV; i++) {
        u0[i] = vst[hot_stage_value_at(g, (uint32_t)i, t)];
        u4[i] = vst[hot_stage_value_at(g, (uint32_t)i, t + 4u)];
    }
    const uint32_t ncm = cm | 0x80008000u;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint32_t a0 = hot_value_operand_scaled<BV>(u0, 2 * i, cm, ncm);
        const uint32_t a1 = hot_value_operand_scaled<BV>(u0, 2 * i + 1, cm, ncm);
        const uint32_t a2 = hot_value_operand_scaled<BV>(u4, 2 * i, cm, ncm);
        const uint32_t a3 = hot_value_operand_scaled<BV>(u4, 2 * i + 1, cm, ncm);
#pragma unroll
        for (int e = 0; e < HL; e++)
            hw_mma(S.O[i][e], a0, a1, a2, a3, pb[e][0], pb[e][1]);
    }
}

template <int G, int BK, int BV>
__global__ void __launch_bounds__(ATT_THREADS, G <= 4 ? 4 : 2) attend_hotw_kernel(hot_params p)
{
    constexpr int HL = hw_hl(G);
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t QH = p.a.QH, W = tb.W, accs = HW_D + 2;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, g = lane >> 2, t = lane & 3u;
    const size_t b = blockIdx.x;
    uint32_t split, kv0, kv1;
    hot_role(p, tb.kv_heads, blockIdx.y, split, kv0, kv1);
    const dqcu_attn_seq sq = p.a.seqs[b];
    float *part = p.a.part + (((size_t)b * (p.a.nsplit + 1) + split) * QH) * accs;
    if (split == p.a.nsplit) {
        hot_tail<G>(p, sq, part, smem, hot_plan(QH, HW_D, G, 1), kv0, kv1);
        return;
    }
    const uint32_t ntiles = sq.nwin * p.a.tpw;
    const uint32_t tile0 = split * p.a.chunk, tile1 = min(ntiles, tile0 + p.a.chunk);
    if (tile0 >= tile1) {
        for (uint32_t h = kv0 * G + tid; h < kv1 * G; h += ATT_THREADS) {
            part[(size_t)h * accs + HW_D] = -INFINITY;
            part[(size_t)h * accs + HW_D + 1] = 0.0f;
        }
        return;
    }
    const hotw_layout L = hotw_plan(G, BK, BV);
    constexpr uint32_t STB = hw_stage_bytes(BK, BV);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem + L.ring) + warp * HW_RING * 2 * STB;
    const uint32_t *ringp = (const uint32_t *)(const void *)(smem + L.ring + (size_t)warp * HW_RING * 2 * STB);
    float *qs = (float *)(void *)(smem + L.qs);
    uint16_t *pt = (uint16_t *)(void *)(smem + L.pt) + (size_t)warp * HL * 8 * DQCU_HOT_PSTR;
    int8_t *qd = (int8_t *)(void *)(smem + L.qd);
    uint2 *qfb = (uint2 *)(void *)(smem + L.qf);
    int4 *qfi = (int4 *)(void *)(qfb + 4 * hw_nst(G) * 32);
    float *qmu = (float *)(void *)(smem + L.qmu);
    const uint8_t **wp = (const uint8_t **)(void *)(smem + L.wp);
    uint32_t *wt = (uint32_t *)(void *)(smem + L.wt);
    float *mrg = (float *)(void *)(smem + L.mrg);
    float *st = (float *)(void *)(smem + L.st);
    float *qsum = st + HW_WARPS * G * 3, *qex = qsum + G;
    int *qds = (int *)(void *)(qex + G); /* [3][G] Σ of each digit */
    const float ck = 0.5f * (float)(tb.kind[0].M - 1), cv = 0.5f * (float)(tb.kind[1].M - 1);
    const uint32_t cm = (tb.kind[1].M - 1) * 0x00010001u; /* M - 1 as two fp16 subnormals' bits */
    const int mk1 = (int)tb.kind[0].M - 1;
    /* logits in log2 units (scale·log2 e): ex2 without range reduction; maxima go out in natural units */
    const float scale = p.a.scale * 1.4426950408889634f;
    const float *qb = p.a.q + b * (size_t)QH * HW_D;

    for (uint32_t kvh = kv0; kvh < kv1; kvh++) {
        /* the group's queries, rotated; Σ q', the exponent e of max |q'| and the digits of
         * Q = q'·2^(19 - e) per head */
        for (uint32_t hh = warp; hh < (uint32_t)G; hh += HW_WARPS) {
            float y[ATT_DVMAX];
            att_rotate_query(qb + (size_t)(kvh * G + hh) * HW_D, tb.signs + kvh * HW_D, tb.rot_scale, HW_D, lane, y);
            float s = 0.0f, mx = 0.0f;
#pragma unroll
            for (int k = 0; k < HW_D / 32; k++) {
                s += y[k];
                mx = fmaxf(mx, fabsf(y[k]));
                qs[hh * HW_D + (uint32_t)k * 32u + lane] = y[k];
            }
            s = dqcu_warp_sum(s);
            mx = dqcu_warp_max(mx);
            int ex;
            frexpf(mx, &ex);
            ex = max(-100, min(120, ex));
            const float up = __int_as_float((127 + 19 - ex) << 23);
            int sd[3] = {0, 0, 0};
#pragma unroll
            for (int k = 0; k < HW_D / 32; k++) {
                int hi, mi, lo;
                hot_query_digits(y[k], up, hi, mi, lo);
                const uint32_t e = hh * HW_D + (uint32_t)k * 32u + lane;
                qd[e] = (int8_t)hi;
                qd[G * HW_D + e] = (int8_t)mi;
                qd[2 * G * HW_D + e] = (int8_t)lo;
                sd[0] += hi;
                sd[1] += mi;
                sd[2] += lo;
            }
#pragma unroll
            for (int i = 0; i < 3; i++)
                sd[i] = __reduce_add_sync(DQCU_FULL, sd[i]);
            if (lane == 0) {
                qsum[hh] = s;
                qex[hh] = __int_as_float((127 + ex - 20) << 23);
                for (int i = 0; i < 3; i++)
                    qds[i * G + hh] = sd[i];
            }
        }
        __syncthreads();
        /* (the round's barrier below orders these before their use) */
        hw_query_build<G>(qfb, qfi, qd, qds, mk1, tid);
        hw_query<G> Qf;
        Qf.b = qfb;
        Qf.init = qfi;
        float xs[HL], qsm[HL];
#pragma unroll
        for (int e = 0; e < HL; e++) {
            const uint32_t h = HL * t + (uint32_t)e;
            xs[e] = h < (uint32_t)G ? qex[h] : 0.0f;
            qsm[e] = h < (uint32_t)G ? qsum[h] : 0.0f;
        }
        const hw_src<BK, BV> srcs = hw_sources<BK, BV>(p, W, kvh, lane);
        hw_state<HL> S;
        S.E = 100;
#pragma unroll
        for (int e = 0; e < HL; e++) {
            S.m[e] = -INFINITY;
            S.l[e] = 0.0f;
            S.off[e] = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int k = 0; k < 4; k++)
                    S.O[i][e][k] = 0.0f;
        }
        for (uint32_t rt = tile0; rt < tile1; rt += HW_ROUND) {
            const uint32_t rn = min((uint32_t)HW_ROUND, tile1 - rt);
            /* the key-mean term of each tile's window and head: a warp per tile (tiles warp,
             * warp + 4, ..), HW_SETUP of its tiles at a time with their loads issued together
             * (until run 125 one tile after another, two dependent loads each, while the block waited
             * ~HW_ROUND / 4 load latencies at the barrier below); the windows */
            for (uint32_t i0 = warp; i0 < rn; i0 += HW_SETUP * HW_WARPS) {
                const uint8_t *win[HW_SETUP];
                uint32_t mw[HW_SETUP], sf[HW_SETUP];
#pragma unroll
                for (int u = 0; u < HW_SETUP; u++) /* past rn: the round's last tile again, not written */
                    win[u] = sq.windows[(rt + min(i0 + (uint32_t)u * HW_WARPS, rn - 1)) / p.a.tpw];
#pragma unroll
                for (int u = 0; u < HW_SETUP; u++) {
                    const uint16_t *mu2 = (const uint16_t *)(const void *)(win[u] + 2u + kvh * HW_D + 4u * lane);
                    mw[u] = (uint32_t)__ldg(mu2) | (uint32_t)__ldg(mu2 + 1) << 16;
                    sf[u] = __ldg((const uint16_t *)(const void *)win[u]);
                }
#pragma unroll
                for (int u = 0; u < HW_SETUP; u++) {
                    const uint32_t i = i0 + (uint32_t)u * HW_WARPS;
                    const float sfm = dqcu_f16_to_f32((uint16_t)sf[u]);
                    float v[G];
#pragma unroll
                    for (int hh = 0; hh < G; hh++) {
                        v[hh] = 0.0f;
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            v[hh] = __fmaf_rn(qs[hh * HW_D + 4u * lane + (uint32_t)j],
                                              (float)(int8_t)(uint8_t)(mw[u] >> (8 * j)), v[hh]);
                        v[hh] = dqcu_warp_sum(v[hh]);
                    }
                    if (lane == 0 && i < rn) {
                        wp[i] = win[u];
                        wt[i] = ((rt + i) % p.a.tpw) * ATT_T;
#pragma unroll
                        for (int hh = 0; hh < G; hh++)
                            qmu[i * G + (uint32_t)hh] = scale * (v[hh] * sfm);
                    }
                }
            }
            __syncthreads();
            /* tile i of the round: the warp's sub-tiles w and w + 4 (the block's warps take a tile's
             * sub-tiles side by side, so that each code row of a tile is read 4 sub-tiles at a time,
             * 256 bytes of a key row, rather than 64 bytes by one warp every 8 sub-tiles: run 123, 2%
             * less time), copied together through the warp's ring of HW_RING pairs, HW_RING - 1 in
             * flight ahead of the one computed (a commit group per pair, empty past the end, so that
             * the count holds) */
#pragma unroll
            for (uint32_t k = 0; k + 1 < HW_RING; k++) {
                if (k < rn)
                    hw_issue_pair<BK, BV>(srcs, wp[k], wt[k] + 16u * warp, ring + k * 2 * STB, lane);
                hw_commit();
            }
            /* the window and first token of the tile the next copy takes, loaded a tile ahead (run
             * 135: loaded where the copies use them, they were waited on at once) */
            const uint8_t *nwin = wp[min(HW_RING - 1u, rn - 1u)];
            uint32_t ntw = wt[min(HW_RING - 1u, rn - 1u)] + 16u * warp;
            uint32_t si = 0, sn = HW_RING - 1; /* ring stages of tiles i and i + HW_RING - 1 */
            for (uint32_t i = 0; i < rn;
                 i++, si = si + 1 == HW_RING ? 0 : si + 1, sn = sn + 1 == HW_RING ? 0 : sn + 1) {
                __syncwarp(); /* every lane is done with the stages tile i + HW_RING - 1 overwrites (tile
                                 i - 1's) and with the transpose buffer (G = 8) */
                if (i + HW_RING - 1 < rn)
                    hw_issue_pair<BK, BV>(srcs, nwin, ntw, ring + sn * 2 * STB, lane);
                hw_commit();
                {
                    const uint32_t ia = min(i + HW_RING, rn - 1u);
                    nwin = wp[ia];
                    ntw = wt[ia] + 16u * warp;
                }
                asm volatile("cp.async.wait_group %0;" ::"n"(HW_RING - 1) : "memory");
                __syncwarp(); /* the other lanes' copies of tile i are visible */
                float qm[HL];
#pragma unroll
                for (int e = 0; e < HL; e++) {
                    const uint32_t h = HL * t + (uint32_t)e;
                    qm[e] = h < (uint32_t)G ? qmu[i * G + h] : 0.0f;
                }
                /* (a loop, not unrolled: both sub-tiles inlined spilled at dq226, G = 4, run 136) */
#pragma unroll 1
                for (uint32_t u = 0; u < 2; u++) {
                    if (u)
                        __syncwarp(); /* the transpose buffer (G = 8) */
                    hw_subtile<G, BK, BV>(ringp + (si * 2 + u) * (STB / 4), Qf, qm, xs, qsm, scale, ck, cv, cm, S, pt,
                                          g, t);
                }
            }
            __syncthreads(); /* qmu and wp are rewritten by the next round */
        }
        /* the warp's rows into shared memory: O·2^(23 - E) by channel, m, Σp, Σp·mid */
        const float un = __int_as_float((127 + 23 - S.E) << 23);
#pragma unroll
        for (int e = 0; e < HL; e++) {
            float l = S.l[e], off = S.off[e];
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                l += __shfl_xor_sync(DQCU_FULL, l, o);
                off += __shfl_xor_sync(DQCU_FULL, off, o);
            }
            const uint32_t h = HL * t + (uint32_t)e;
            if (h < (uint32_t)G) {
                float *mr = mrg + (warp * G + h) * HW_D + 16u * g;
#pragma unroll
                for (int i = 0; i < 8; i++) { /* rows of codes 2i, 2i + 1, each 2^z high */
                    mr[2 * i] = (S.O[i][e][0] + S.O[i][e][1]) * (un * hw_pow2(-hot_value_scale<BV>(2 * i)));
                    mr[2 * i + 1] = (S.O[i][e][2] + S.O[i][e][3]) * (un * hw_pow2(-hot_value_scale<BV>(2 * i + 1)));
                }
                if (g == 0) {
                    st[(warp * G + h) * 3] = S.m[e];
                    st[(warp * G + h) * 3 + 1] = l;
                    st[(warp * G + h) * 3 + 2] = off;
                }
            }
        }
        __syncthreads();
        /* merge the warps and finish (un-rotate) each head's partial row: a warp per head */
        for (uint32_t hh = warp; hh < (uint32_t)G; hh += HW_WARPS) {
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < HW_WARPS; w++)
                M = fmaxf(M, st[(w * G + hh) * 3]);
            float fw[HW_WARPS], Ls = 0.0f;
#pragma unroll
            for (int w = 0; w < HW_WARPS; w++) {
                const float mw = st[(w * G + hh) * 3];
                fw[w] = mw == -INFINITY ? 0.0f : exp2f(mw - M); /* log2 units */
                Ls = __fmaf_rn(fw[w], st[(w * G + hh) * 3 + 1], Ls);
            }
            float y[ATT_DVMAX];
#pragma unroll
            for (int k = 0; k < ATT_DVMAX; k++) {
                const uint32_t e = (uint32_t)k * 32u + lane;
                float v = 0.0f;
                if (e < HW_D)
#pragma unroll
                    for (int w = 0; w < HW_WARPS; w++)
                        v = __fmaf_rn(fw[w], mrg[(w * G + hh) * HW_D + e] + st[(w * G + hh) * 3 + 2], v);
                y[k] = v;
            }
            dqcu_fwht(y, HW_D, lane);
            float *ph = part + (size_t)(kvh * G + hh) * accs;
#pragma unroll
            for (int k = 0; k < ATT_DVMAX; k++) {
                const uint32_t e = (uint32_t)k * 32u + lane;
                if (e < HW_D)
                    ph[e] = y[k] * tb.rot_scale * tb.signs[kvh * HW_D + e];
            }
            if (lane == 0) {
                ph[HW_D] = M * 0.6931471805599453f; /* natural units, as every partial row */
                ph[HW_D + 1] = Ls;
            }
        }
        __syncthreads(); /* qs, pt, mrg, st are the next KV head's */
    }
}

/* ---- host side ---- */

template <int G, int BK, int BV>
static att_attr hot_attr()
{
    static const att_attr a = att_query_attr(attend_hot_kernel<G, BK, BV>);
    return a;
}

/* The instantiated code widths: dq226 and dq196 (3 + 3 bits), 4 + 4 (M up to 16), and the
 * fixed-width family's fixed226 (M 6/3: 3 + 2) and fixed196 (M 3/2: 2 + 1) at n = 1024. */
#define HOT_WIDTHS(X) X(3, 3) X(4, 4) X(3, 2) X(2, 1)

static bool hot_widths_ok(uint32_t bk, uint32_t bv)
{
#define HOT_W_OK(a, b)      \
    if (bk == a && bv == b) \
        return true;
    HOT_WIDTHS(HOT_W_OK)
#undef HOT_W_OK
    return false;
}

size_t dqcu__attend_hot_smem(uint32_t QH, uint32_t d, uint32_t G, uint32_t hpb)
{
    return hot_plan(QH, d, G, hpb).total;
}

template <int G, int BK, int BV>
static att_attr hotw_attr()
{
    static const att_attr a = att_query_attr(attend_hotw_kernel<G, BK, BV>);
    return a;
}

template <int G>
static att_attr hot_attr_any(bool warp, uint32_t bk, uint32_t bv)
{
#define HOT_W_ATTR2(a, b)   \
    if (bk == a && bv == b) \
        return warp ? hotw_attr<G, a, b>() : hot_attr<G, a, b>();
    HOT_WIDTHS(HOT_W_ATTR2)
#undef HOT_W_ATTR2
    return att_attr{};
}

int dqcu__attend_hot_version(const dqcu_codec *dc)
{
    /* the warp kernel: d = 128 and windows of whole 128-token tiles */
    const bool w = dc->d == HW_D && dc->W % ATT_T == 0;
    const int want = dc->settings.hot_kernel;
    return want == 1 || !w ? 1 : 2;
}

bool dqcu__attend_hot_fit(const dqcu_codec *dc, uint32_t QH, uint32_t hpb, att_fit *f)
{
    const uint32_t G = QH / dc->kv_heads;
    const uint32_t bk = dqcu__hot_bits(dc->host.kind[0].M), bv = dqcu__hot_bits(dc->host.kind[1].M);
    /* the key MMA takes a lane's channels a group of 32 at a time: d a multiple of 128 */
    if (!att_mma_shape_ok(G, dc->d) || dc->d % 128 != 0 || !hot_widths_ok(bk, bv))
        return false;
    const bool warp = dqcu__attend_hot_version(dc) == 2;
    att_attr a{};
    switch (G) {
    case 1:
        a = hot_attr_any<1>(warp, bk, bv);
        break;
    case 2:
        a = hot_attr_any<2>(warp, bk, bv);
        break;
    case 4:
        a = hot_attr_any<4>(warp, bk, bv);
        break;
    default:
        a = hot_attr_any<8>(warp, bk, bv);
        break;
    }
    if (warp) {
        /* its own state, or the tail block's (hot_plan with one head's query fragments) */
        const size_t sw = hotw_plan(G, bk, bv).total, st = dqcu__attend_hot_smem(QH, dc->d, G, 1);
        f->smem = sw > st ? sw : st;
    } else
        f->smem = dqcu__attend_hot_smem(QH, dc->d, G, hpb);
    f->per_sm = dqcu__attend_blocks_per_sm(dc, a, f->smem);
    f->prep_bytes = 0;
    return f->per_sm >= 1;
}

template <int G, int BK, int BV>
static int launch_hot(const hot_params &p, bool warp, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
    int rc = warp ? att_allow_smem<attend_hotw_kernel<G, BK, BV>>() : att_allow_smem<attend_hot_kernel<G, BK, BV>>();
    if (rc)
        return rc;
    if (warp)
        attend_hotw_kernel<G, BK, BV><<<dim3(nseq, nblk_y), ATT_THREADS, smem, stream>>>(p);
    else
        attend_hot_kernel<G, BK, BV><<<dim3(nseq, nblk_y), ATT_THREADS, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <int G>
static int launch_hot_g(const hot_params &p, bool warp, size_t smem, uint32_t nseq, uint32_t nblk_y,
                        cudaStream_t stream)
{
#define HOT_W_LAUNCH(a, b)      \
    if (p.bk == a && p.bv == b) \
        return launch_hot<G, a, b>(p, warp, smem, nseq, nblk_y, stream);
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
    /* The tail's blocks (a sequence's ≤ 127 BF16 tokens of one KV head, on CUDA cores) take longer
     * than a window block at small batch and are on the critical path: first where every block of
     * the grid is resident at once. Otherwise last: dispatched first they held back as many window
     * blocks until they ended (run 111: (128, 8K+100) 1.73 → 2.10× BF16, with 8 KV heads a tail
     * block), and a KV head each they fill the last round's free slots. */
    p.tail0 = 0;
    const uint32_t nblk_y = hot_grid_y(p, dc->kv_heads);
    if ((uint64_t)nseq * nblk_y > pl.slots)
        p.tail0 = pl.nsplit * nhg;
    const bool warp = dqcu__attend_hot_version(dc) == 2;
    switch (a.G) {
    case 1:
        return launch_hot_g<1>(p, warp, pl.smem, nseq, nblk_y, stream);
    case 2:
        return launch_hot_g<2>(p, warp, pl.smem, nseq, nblk_y, stream);
    case 4:
        return launch_hot_g<4>(p, warp, pl.smem, nseq, nblk_y, stream);
    default:
        return launch_hot_g<8>(p, warp, pl.smem, nseq, nblk_y, stream);
    }
}
