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
 * Every warp attends sub-tiles of 16 tokens of one KV head on its own: no barrier, no staging
 * through shared memory between loading a sub-tile's codes and accumulating its values. The
 * block's 4 warps take contiguous quarters of the chunk's sub-tiles, each with its own online
 * softmax and accumulator in registers, and are merged once per KV head at the end.
 *
 * Scores on integer tensor cores (mma.m16n8k32, s8 × u8 → s32, exact): the queries, rotated and
 * scaled by 2^(19 - e) (max |q'| < 2^e), are integers Q = 2^14·hi + 2^7·mid + lo in balanced
 * base-128 digits (|hi| <= 33, |mid|, |lo| <= 64), and the A operand holds twice the digits (tile A:
 * row g = head g's hi, row 8 + g its mid; tile B: row g its lo; rows past G zero). The B operand
 * is the key codes m as bytes, straight from the hot layout's byte lanes (lane (r, c) holds token
 * r's channels 32c + 8s .. 32c + 8s + 7 of k-step s as its two registers: one shift and one mask
 * each, the queries permuted to match), and each product starts from -(M - 1)·Σdigit so that it
 * ends at Σ digit·(2m - (M - 1)) = 2·Σ digit·(m - c) exactly; 2^14·D_hi + 2^7·D_mid + D_lo in
 * fp32 is 2^(20 - e)·q'·(m - c) to fp32's rounding (the fp16 hi + lo queries of the block kernel
 * carry 22 bits, these 20).
 * The C fragments then hold head r's scores of tokens 2c, 2c + 1 (n-tile 0; 8 + 2c, 9 + 2c n-tile
 * 1) in lane (r, c), which is the A fragment layout of the value product O = P·V
 * (mma.m16n8k16, FlashAttention-2's register reuse): the weights p·s·2^E go to tensor cores as fp16
 * hi (row r) + lo (row r + 8) without leaving the lane. The value B operand comes straight from
 * the hot layout's half-word lanes: lane (r, c) reads, for group r / 2 and channels
 * 16·(r % 2) .. + 15, the words of token pairs (2c, 2c + 1) and (8 + 2c, 9 + 2c); a channel's two
 * codes are 16 bits apart, so one shift and one mask make the (512 + m) pair and one fp16
 * subtraction the operand. Output column n of n-tile j is channel 16n + j.
 * The value scale s folds into the weights; the per-token offset (s·c + o) into a scalar per head
 * (Σ p·mid); 2^E keeps p·s in fp16's range (E warp-wide, changed only when a sub-tile's largest s
 * would overflow it or has fallen 2^10 below it, with the accumulator rescaled like the softmax's
 * alpha). The key means' term q'·μ is computed once per tile and head by a warp, in rounds of
 * HW_ROUND tiles between two barriers. */
#define HW_D 128
#define HW_ROUND 32
#define HW_WARPS (ATT_THREADS / 32)

#define HW_NS 3 /* stages of each warp's cp.async ring: sub-tiles j + 1 and j + 2 in flight while j is computed */

/* Bytes of one sub-tile in a warp's ring, in the order its 16-byte chunks are copied: key codes
 * [group c][word i][16 tokens], value codes likewise, the 16 key (s, o) pairs, the 16 value pairs. */
__host__ __device__ constexpr uint32_t hw_stage_bytes(uint32_t bk, uint32_t bv)
{
    return 256u * (bk + bv) + 128u;
}

struct hotw_layout {
    size_t qs, qa, qd, qmu, mrg, st, ring, total;
};
__host__ __device__ inline hotw_layout hotw_plan(uint32_t G, uint32_t bk, uint32_t bv)
{
    hotw_layout L;
    size_t b = 0;
    L.qs = b; /* [G][128] rotated queries (fp32) */
    b = hot_align(b + (size_t)G * HW_D * sizeof(float));
    L.qa = b; /* [4 k-steps][32 lanes] tile A's fragments, then tile B's (uint4 each) */
    b = hot_align(b + 4 * 32 * 2 * sizeof(uint4));
    L.qd = b; /* [3 digits][G][128] the queries' base-128 digits (int8) */
    b = hot_align(b + 3 * (size_t)G * HW_D);
    L.qmu = b; /* [HW_ROUND][G] key-mean terms */
    b = hot_align(b + (size_t)HW_ROUND * G * sizeof(float));
    L.mrg = b; /* [warps][G][128] the warps' accumulators */
    b = hot_align(b + (size_t)HW_WARPS * G * HW_D * sizeof(float));
    L.st = b; /* [warps][G] m, l, off; then qsum[G], 2^(e - 20)[G], Σdigit[3][G] (int) */
    b = hot_align(b + ((size_t)HW_WARPS * G * 3 + 5 * G) * sizeof(float));
    L.ring = b; /* [warps][HW_NS] sub-tiles */
    b = hot_align(b + (size_t)HW_WARPS * HW_NS * hw_stage_bytes(bk, bv));
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

__device__ __forceinline__ void hw_imma(int (&c)[4], uint4 a, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
}

/* 2^x (ex2.approx.ftz: 2 ulp, results below 2^-126 flush to 0 — weights that small next to the
 * running max's 1 do not count). */
__device__ __forceinline__ float hw_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* The int8 products of the scores from accumulators C that are not overwritten (the first k-step:
 * C is the starting value -(M - 1)·Σdigit, kept in registers across sub-tiles). */
__device__ __forceinline__ void hw_imma_from(int (&d)[4], uint4 a, uint32_t b0, uint32_t b1, const int4 &c)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(c.x), "r"(c.y), "r"(c.z), "r"(c.w));
}

struct hw_state {
    float m, l, off; /* head r's running max, and this lane's share of Σp and Σp·mid */
    int E;           /* the weights' scale 2^E; INT_MIN before the first sub-tile */
    float O[16][4];  /* n-tile j: channels 16n + j; rows r (hi weights) and r + 8 (lo) */
};

/* Copies sub-tile (tokens [tw0, tw0 + 16) of window win, KV head kvh) into the ring stage at
 * shared address dst: 16·(b_K + b_V) + 8 chunks of 16 bytes, cp.async (L2 only), the warp's lanes
 * taking every 32nd chunk. Every source is 16-byte aligned: the hot layout's regions are, W is a
 * multiple of 128 and tw0 of 16. */
template <int BK, int BV>
struct hw_src {
    uint32_t off[(16 * (BK + BV) + 8 + 31) / 32]; /* this lane's chunks: their offsets in a window at tw0 = 0 */
    uint32_t pair;                                /* bit k: chunk k is value codes (token pairs: 2 bytes a token) */
};

/* The offsets (from the window's start, for tokens from 0) of the 16-byte chunks lane copies for
 * KV head kvh: chunk q = lane + 32k of a sub-tile (see hw_stage_bytes). Key codes: row (group c,
 * word i) of 16 tokens, 4 chunks; value codes: row (group, word i of 2b_V) of 8 token pairs, 2
 * chunks; the (s, o) pairs. A sub-tile at tw0 adds 4·tw0 (2·tw0 to value codes). */
template <int BK, int BV>
__device__ __forceinline__ hw_src<BK, BV> hw_sources(const hot_params &p, uint32_t W, uint32_t kvh, uint32_t lane)
{
    constexpr uint32_t NK = 16 * BK, NV = 16 * BV, N = NK + NV + 8;
    hw_src<BK, BV> o;
    o.pair = 0;
#pragma unroll
    for (uint32_t k = 0; k < (N + 31) / 32; k++) {
        const uint32_t q = lane + 32u * k;
        if (q < NK) {
            const uint32_t row = q >> 2, g = kvh * 4u + row / BK;
            o.off[k] = p.off[2] + ((g * BK + row % BK) * W << 2) + ((q & 3u) << 4);
        } else if (q < NK + NV) {
            const uint32_t qq = q - NK, row = qq >> 1, g = kvh * 4u + row / (2 * BV);
            o.off[k] = p.off[3] + ((g * 2 * BV + row % (2 * BV)) * (W / 2) << 2) + ((qq & 1u) << 4);
            o.pair |= 1u << k;
        } else {
            const uint32_t qq = q - NK - NV;
            o.off[k] = (qq < 4 ? p.off[0] : p.off[1]) + ((qq & 3u) << 4);
        }
    }
    return o;
}

template <int BK, int BV>
__device__ __forceinline__ void hw_issue(const hw_src<BK, BV> &src, const uint8_t *win, uint32_t tw0, uint32_t dst,
                                         uint32_t lane)
{
    constexpr uint32_t N = 16 * (BK + BV) + 8;
#pragma unroll
    for (uint32_t k = 0; k < (N + 31) / 32; k++) {
        const uint32_t q = lane + 32u * k;
        if (q < N)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16u * q),
                         "l"(win + src.off[k] + (((src.pair >> k) & 1u) ? 2u : 4u) * tw0)
                         : "memory");
    }
}

/* hw_issue of sub-tile j of the round of tiles from rt (a window holds tpw tiles; one tile per
 * window needs no division, the common case W = 128). */
template <int BK, int BV>
__device__ __forceinline__ void hw_issue_sub(const hw_src<BK, BV> &src, const dqcu_attn_seq &sq, uint32_t tpw,
                                             uint32_t rt, uint32_t j, uint32_t dst, uint32_t lane)
{
    const uint32_t tile = rt + j / (ATT_T / 16), sub = 16u * (j % (ATT_T / 16));
    if (tpw == 1)
        hw_issue<BK, BV>(src, sq.windows[tile], sub, dst, lane);
    else
        hw_issue<BK, BV>(src, sq.windows[tile / tpw], (tile % tpw) * ATT_T + sub, dst, lane);
}

__device__ __forceinline__ void hw_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* The query fragments of one KV head (built per block; see the kernel): the integer A operands of
 * k-step s for tile A (hi, mid) and tile B (lo; rows 8.. zero), and each lane's starting values
 * -(M - 1)·Σdigit of its rows. */
struct hw_query {
    const uint4 *qa;   /* [4 k-steps][32 lanes] tile A */
    const uint4 *qb;   /* [4][32] tile B: a0, 0, a2, 0 */
    int4 initA, initB; /* (hi, hi, mid, mid), (lo, lo, 0, 0) starting values */
};

/* One sub-tile from its ring stage stg (see hw_issue): KV head kvh's tokens [tw0, tw0 + 16). */
template <int BK, int BV>
__device__ __forceinline__ void hw_subtile(const hot_params &p, const uint32_t *stg, const hw_query &Q, float qmu,
                                           float xs, float qsm, float ck, float cv, uint32_t c2v, uint32_t magic,
                                           hw_state &S, uint32_t r, uint32_t c, uint32_t lane)
{
    /* logits in log2 units (scale·log2 e): ex2 without range reduction; the row's max goes out in
     * natural units */
    const float scale = p.a.scale * 1.4426950408889634f;
    /* the key words of tokens r and 8 + r (group c of the head), the (s, o) pairs of tokens
     * 2c, 2c + 1, 8 + 2c, 9 + 2c of both kinds */
    uint32_t w0[BK], w1[BK];
#pragma unroll
    for (int i = 0; i < BK; i++) {
        w0[i] = stg[(c * BK + (uint32_t)i) * 16u + r];
        w1[i] = stg[(c * BK + (uint32_t)i) * 16u + r + 8u];
    }
    const uint2 *sok = (const uint2 *)(const void *)(stg + 64u * (BK + BV));
    const uint2 *sov = sok + 8;
    const uint2 k01 = sok[c], k89 = sok[c + 4u], v01 = sov[c], v89 = sov[c + 4u];

    /* ---- scores on integer tensor cores ---- */
    int dA0[4], dA1[4], dB0[4], dB1[4];
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const uint4 a = Q.qa[ks * 32 + (int)lane], ab = Q.qb[ks * 32 + (int)lane];
        const uint32_t b00 = hot_lane_code<BK, 8>(w0, 2 * ks), b01 = hot_lane_code<BK, 8>(w0, 2 * ks + 1);
        const uint32_t b10 = hot_lane_code<BK, 8>(w1, 2 * ks), b11 = hot_lane_code<BK, 8>(w1, 2 * ks + 1);
        if (ks == 0) {
            hw_imma_from(dA0, a, b00, b01, Q.initA);
            hw_imma_from(dA1, a, b10, b11, Q.initA);
            hw_imma_from(dB0, ab, b00, b01, Q.initB);
            hw_imma_from(dB1, ab, b10, b11, Q.initB);
        } else {
            hw_imma(dA0, a, b00, b01);
            hw_imma(dA1, a, b10, b11);
            hw_imma(dB0, ab, b00, b01);
            hw_imma(dB1, ab, b10, b11);
        }
    }
    const int *dAs[2] = {dA0, dA1}, *dBs[2] = {dB0, dB1};
    float dot[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int nt = i / 2, col = i % 2;
        dot[i] = hot_digit_dot(dAs[nt][col], dAs[nt][2 + col], dBs[nt][col]);
    }
    const uint32_t ks4[4] = {k01.x, k01.y, k89.x, k89.y}, vs4[4] = {v01.x, v01.y, v89.x, v89.y};
    float lg[4], sv[4], mid[4];
    float mx = -INFINITY, smax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        /* (s, o) pairs converted in hardware (exact, subnormals included; dq_hot_check keeps them finite) */
        const float2 so = __half22float2(*(const __half2 *)(const void *)&ks4[i]);
        const float2 sov = __half22float2(*(const __half2 *)(const void *)&vs4[i]);
        lg[i] = __fmaf_rn(scale, __fmaf_rn(so.x, dot[i] * xs, __fmaf_rn(so.x, ck, so.y) * qsm), qmu);
        mx = fmaxf(mx, lg[i]);
        sv[i] = sov.x;
        mid[i] = __fmaf_rn(sov.x, cv, sov.y);
        smax = fmaxf(smax, sv[i]);
    }
    /* the quad (c = 0..3) holds the sub-tile's 16 tokens */
    mx = fmaxf(mx, __shfl_xor_sync(DQCU_FULL, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(DQCU_FULL, mx, 2));
    smax = fmaxf(smax, __shfl_xor_sync(DQCU_FULL, smax, 1));
    smax = fmaxf(smax, __shfl_xor_sync(DQCU_FULL, smax, 2));

    /* ---- online softmax, the weights' scale ---- */
    const float mnew = fmaxf(S.m, mx);
    const float alpha = S.m == -INFINITY ? 0.0f : hw_ex2(S.m - mnew);
    /* smax < 2^ex (smax is 0 or a normal float: an fp16 value): p·s·2^(14 - ex) < 2^14; E within
     * [-100, 100] so that 2^E and the rescale factors below are normal floats */
    const int ex = (int)((__float_as_uint(smax) >> 23) & 0xffu) - 126;
    int En = max(-100, min(100, 14 - ex));
    if (smax == 0.0f) /* every weight of the sub-tile is 0: keep the scale */
        En = S.E == INT_MIN ? 0 : S.E;
    float f = alpha;
    if (S.E == INT_MIN)
        S.E = En;
    else if (En < S.E || En > S.E + 10) {
        f = alpha * __int_as_float((127 + En - S.E) << 23);
        S.E = En;
    }
    if (__any_sync(DQCU_FULL, f != 1.0f)) {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S.O[j][e] *= f;
    }
    float pr[4], ps = 0.0f, pm = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        pr[i] = hw_ex2(lg[i] - mnew);
        ps += pr[i];
        pm = __fmaf_rn(pr[i], mid[i], pm);
    }
    S.l = __fmaf_rn(S.l, alpha, ps);
    S.off = __fmaf_rn(S.off, alpha, pm);
    S.m = mnew;
    const float sc = __int_as_float((127 + S.E) << 23);
    float wv[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        wv[i] = pr[i] * sv[i] * sc;
    const __half2 h01 = __floats2half2_rn(wv[0], wv[1]), h89 = __floats2half2_rn(wv[2], wv[3]);
    const __half2 l01 = __floats2half2_rn(wv[0] - __low2float(h01), wv[1] - __high2float(h01));
    const __half2 l89 = __floats2half2_rn(wv[2] - __low2float(h89), wv[3] - __high2float(h89));
    const uint32_t a0 = *(const uint32_t *)(const void *)&h01, a1 = *(const uint32_t *)(const void *)&l01;
    const uint32_t a2 = *(const uint32_t *)(const void *)&h89, a3 = *(const uint32_t *)(const void *)&l89;

    /* ---- values on tensor cores, straight from the code words ---- */
    /* lane (r, c): group r / 2, channels 16·(r % 2) .., token pairs c and c + 4 */
    const uint32_t *vst = stg + 64u * BK;
    uint32_t u0[BV], u4[BV];
#pragma unroll
    for (int i = 0; i < BV; i++) {
        u0[i] = vst[(BV * r + (uint32_t)i) * 8u + c];
        u4[i] = vst[(BV * r + (uint32_t)i) * 8u + c + 4u];
    }
#pragma unroll
    for (int j = 0; j < 16; j++)
        hw_mma(S.O[j], a0, a1, a2, a3, hot_value_pair<BV>(u0, j, magic, c2v), hot_value_pair<BV>(u4, j, magic, c2v));
}

template <int G, int BK, int BV>
__global__ void __launch_bounds__(ATT_THREADS, 3) attend_hotw_kernel(hot_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.a.tab;
    const uint32_t QH = p.a.QH, W = tb.W, accs = HW_D + 2;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, r = lane >> 2, c = lane & 3u;
    const size_t b = blockIdx.x;
    const uint32_t yb = blockIdx.y / p.nhg, hg = blockIdx.y % p.nhg;
    const uint32_t split = yb == 0 ? p.a.nsplit : yb - 1;
    const uint32_t kv0 = hg * p.hpb, kv1 = kv0 + p.hpb;
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
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(smem + L.ring) + warp * HW_NS * STB;
    const uint32_t *ringp = (const uint32_t *)(const void *)(smem + L.ring + (size_t)warp * HW_NS * STB);
    float *qs = (float *)(void *)(smem + L.qs);
    uint4 *qa = (uint4 *)(void *)(smem + L.qa);
    uint4 *qbf = qa + 4 * 32;
    int8_t *qd = (int8_t *)(void *)(smem + L.qd);
    float *qmu = (float *)(void *)(smem + L.qmu);
    float *mrg = (float *)(void *)(smem + L.mrg);
    float *st = (float *)(void *)(smem + L.st);
    float *qsum = st + HW_WARPS * G * 3, *qex = qsum + G;
    int *qds = (int *)(void *)(qex + G); /* [3][G] Σ of each digit */
    const float ck = 0.5f * (float)(tb.kind[0].M - 1), cv = 0.5f * (float)(tb.kind[1].M - 1);
    const int mk1 = (int)tb.kind[0].M - 1;
    const __half2 c2vh = __floats2half2_rn(512.0f + cv, 512.0f + cv);
    const uint32_t c2v = *(const uint32_t *)(const void *)&c2vh, magic = c2v & 0xfc00fc00u; /* 0x60006000 */
    const float *qb = p.a.q + b * (size_t)QH * HW_D;

    for (uint32_t kvh = kv0; kvh < kv1; kvh++) {
        /* the group's queries, rotated; Σ q', the exponent e of max |q'| and the digits of
         * Q = q'·2^(19 - e) per head */
        for (uint32_t g = warp; g < (uint32_t)G; g += HW_WARPS) {
            float y[ATT_DVMAX];
            att_rotate_query(qb + (size_t)(kvh * G + g) * HW_D, tb.signs + kvh * HW_D, tb.rot_scale, HW_D, lane, y);
            float s = 0.0f, mx = 0.0f;
#pragma unroll
            for (int k = 0; k < HW_D / 32; k++) {
                s += y[k];
                mx = fmaxf(mx, fabsf(y[k]));
                qs[g * HW_D + (uint32_t)k * 32u + lane] = y[k];
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
                const uint32_t e = g * HW_D + (uint32_t)k * 32u + lane;
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
                qsum[g] = s;
                qex[g] = __int_as_float((127 + ex - 20) << 23);
                for (int i = 0; i < 3; i++)
                    qds[i * G + g] = sd[i];
            }
        }
        __syncthreads();
        /* the A fragments of k-step ks, lane (rr, cc): twice the digits of head rr's channels
         * 32cc + 8ks + 0..3 (a0, a1) and + 4..7 (a2, a3); tile A: hi (rows rr), mid (rows 8 + rr);
         * tile B: lo (rows rr) */
        for (uint32_t i = tid; i < 4u * 32u; i += ATT_THREADS) {
            const uint32_t ks = i / 32u, ln = i % 32u, rr = ln >> 2, cc = ln & 3u;
            uint32_t fr[3][2] = {{0u, 0u}, {0u, 0u}, {0u, 0u}};
            if (rr < (uint32_t)G) {
#pragma unroll
                for (int dg = 0; dg < 3; dg++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int8_t *d4 = qd + ((size_t)dg * G + rr) * HW_D + 32u * cc + 8u * ks + 4u * (uint32_t)hf;
                        uint32_t v = 0;
#pragma unroll
                        for (int y = 0; y < 4; y++)
                            v |= (uint32_t)(uint8_t)(int8_t)(2 * d4[y]) << (8 * y);
                        fr[dg][hf] = v;
                    }
            }
            qa[i] = make_uint4(fr[0][0], fr[1][0], fr[0][1], fr[1][1]);
            qbf[i] = make_uint4(fr[2][0], 0u, fr[2][1], 0u);
        }
        const float xs = r < (uint32_t)G ? qex[r] : 0.0f, qsm = r < (uint32_t)G ? qsum[r] : 0.0f;
        hw_query Qf;
        Qf.qa = qa;
        Qf.qb = qbf;
        {
            const int ih = r < (uint32_t)G ? -mk1 * qds[r] : 0, im = r < (uint32_t)G ? -mk1 * qds[G + r] : 0;
            const int il = r < (uint32_t)G ? -mk1 * qds[2 * G + r] : 0;
            Qf.initA = make_int4(ih, ih, im, im);
            Qf.initB = make_int4(il, il, 0, 0);
        }
        const hw_src<BK, BV> srcs = hw_sources<BK, BV>(p, W, kvh, lane);
        hw_state S;
        S.m = -INFINITY;
        S.l = 0.0f;
        S.off = 0.0f;
        S.E = INT_MIN;
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S.O[j][e] = 0.0f;
        for (uint32_t rt = tile0; rt < tile1; rt += HW_ROUND) {
            const uint32_t rn = min((uint32_t)HW_ROUND, tile1 - rt);
            /* the key-mean term of each tile's window and head: a warp per tile */
            for (uint32_t i = warp; i < rn; i += HW_WARPS) {
                const uint8_t *win = sq.windows[(rt + i) / p.a.tpw];
                const uint16_t *mu2 = (const uint16_t *)(const void *)(win + 2u + kvh * HW_D + 4u * lane);
                const uint32_t mw = (uint32_t)__ldg(mu2) | (uint32_t)__ldg(mu2 + 1) << 16;
                const float sfm = dqcu_f16_le(win);
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float v = 0.0f;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        v = __fmaf_rn(qs[g * HW_D + 4u * lane + (uint32_t)j], (float)(int8_t)(uint8_t)(mw >> (8 * j)),
                                      v);
                    v = dqcu_warp_sum(v);
                    if (lane == 0)
                        qmu[i * G + (uint32_t)g] = p.a.scale * 1.4426950408889634f * (v * sfm);
                }
            }
            __syncthreads();
            const uint32_t nsub = rn * (ATT_T / 16);
            const uint32_t j0 = warp * nsub / HW_WARPS, j1 = (warp + 1) * nsub / HW_WARPS;
            /* the warp's sub-tiles through its ring: HW_NS - 1 copies in flight ahead of the one
             * computed (a commit group per sub-tile, empty past the end, so that the count holds) */
#pragma unroll
            for (uint32_t k = 0; k + 1 < HW_NS; k++) {
                const uint32_t j = j0 + k;
                if (j < j1)
                    hw_issue_sub<BK, BV>(srcs, sq, p.a.tpw, rt, j, ring + k * STB, lane);
                hw_commit();
            }
            uint32_t sj = 0, sn = HW_NS - 1; /* ring stages of sub-tiles j and j + HW_NS - 1 */
            for (uint32_t j = j0; j < j1; j++, sj = sj + 1 == HW_NS ? 0 : sj + 1, sn = sn + 1 == HW_NS ? 0 : sn + 1) {
                const uint32_t jn = j + HW_NS - 1;
                __syncwarp(); /* every lane is done with the stage jn overwrites (sub-tile j - 1's) */
                if (jn < j1)
                    hw_issue_sub<BK, BV>(srcs, sq, p.a.tpw, rt, jn, ring + sn * STB, lane);
                hw_commit();
                asm volatile("cp.async.wait_group %0;" ::"n"(HW_NS - 1) : "memory");
                __syncwarp(); /* the other lanes' copies of sub-tile j are visible */
                const uint32_t i = j / (ATT_T / 16);
                const float qm = r < (uint32_t)G ? qmu[i * G + r] : 0.0f;
                hw_subtile<BK, BV>(p, ringp + sj * (STB / 4), Qf, qm, xs, qsm, ck, cv, c2v, magic, S, r, c, lane);
            }
            __syncthreads(); /* qmu is rewritten by the next round */
        }
        /* the warp's rows into shared memory: O·2^-E by channel, m, Σp, Σp·mid */
        S.l += __shfl_xor_sync(DQCU_FULL, S.l, 1);
        S.l += __shfl_xor_sync(DQCU_FULL, S.l, 2);
        S.off += __shfl_xor_sync(DQCU_FULL, S.off, 1);
        S.off += __shfl_xor_sync(DQCU_FULL, S.off, 2);
        if (r < (uint32_t)G) {
            const float un = S.E == INT_MIN ? 0.0f : __int_as_float((127 - S.E) << 23);
            float *mr = mrg + (warp * G + r) * HW_D;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                mr[32u * c + (uint32_t)j] = (S.O[j][0] + S.O[j][2]) * un;
                mr[32u * c + 16u + (uint32_t)j] = (S.O[j][1] + S.O[j][3]) * un;
            }
            if (c == 0) {
                st[(warp * G + r) * 3] = S.m;
                st[(warp * G + r) * 3 + 1] = S.l;
                st[(warp * G + r) * 3 + 2] = S.off;
            }
        }
        __syncthreads();
        /* merge the warps and finish (un-rotate) each head's partial row: a warp per head */
        for (uint32_t g = warp; g < (uint32_t)G; g += HW_WARPS) {
            float M = -INFINITY;
#pragma unroll
            for (int w = 0; w < HW_WARPS; w++)
                M = fmaxf(M, st[(w * G + g) * 3]);
            float fw[HW_WARPS], Ls = 0.0f;
#pragma unroll
            for (int w = 0; w < HW_WARPS; w++) {
                const float mw = st[(w * G + g) * 3];
                fw[w] = mw == -INFINITY ? 0.0f : exp2f(mw - M); /* log2 units */
                Ls = __fmaf_rn(fw[w], st[(w * G + g) * 3 + 1], Ls);
            }
            float y[ATT_DVMAX];
#pragma unroll
            for (int k = 0; k < ATT_DVMAX; k++) {
                const uint32_t e = (uint32_t)k * 32u + lane;
                float v = 0.0f;
                if (e < HW_D)
#pragma unroll
                    for (int w = 0; w < HW_WARPS; w++)
                        v = __fmaf_rn(fw[w], mrg[(w * G + g) * HW_D + e] + st[(w * G + g) * 3 + 2], v);
                y[k] = v;
            }
            dqcu_fwht(y, HW_D, lane);
            float *ph = part + (size_t)(kvh * G + g) * accs;
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
        __syncthreads(); /* qs, qa, mrg, st are the next KV head's */
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
    const uint32_t nblk_y = (pl.nsplit + 1) * nhg;
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
