/* Fused decode attention on the containers (DESIGN §2.7, seed §4.5 and Appendix A).
 *
 * Token-centric: a block owns tiles of up to 128 tokens of one sequence (split-K: the sequence's
 * tiles are cut into contiguous chunks, one per block, and the BF16 tail is one more block). For a
 * tile, thread t decodes token t's key stream once (all KV heads, in order) and feeds each level
 * straight into the dot products of the GQA group's rotated queries:
 *     q'·k̂_t = s_t·Σ_j q'_j (m_j - c) + (o_t + s_t·c)·Σ_j q'_j + Σ_j q'_j μ_j,   c = (M-1)/2
 * (centered levels, as lib/src/attention.c, so the offset never cancels against the levels).
 * Online softmax per query head; then thread t decodes its value stream head by head into shared
 * memory (levels only, channel-major) and the threads, now one per channel, accumulate
 *     Σ_t (a_t s_t)(m_t,j - c)  and, on the side,  Σ_t a_t (o_t + s_t·c)
 * for every query head of the group. No BF16 copy of the cache exists at any point. Each block ends
 * by un-rotating its accumulator (rotated domain → original) and writes (acc, max, sum); a second
 * kernel merges a sequence's blocks by their log-sum-exp.
 *
 * That is kernel v3. v4 (attend_v4.cuh: keys and values decoded concurrently by two thread roles,
 * values contracted on tensor cores) and v5 (attend_v5.cuh: each thread decodes its token's key and
 * value streams interleaved, a tile done head by head in one pass) and v6 (attend_v6.cuh: v5 with
 * the container words staged into per-thread shared-memory rings by cp.async far ahead of use) and
 * v7 (attend_v7.cuh: v5 with the key scores on tensor cores too, a levels-only decode loop, the
 * queries prepared once per call and 5 blocks per SM) take the shapes they can; v7 is the default
 * (falling back to v5, then v4, where it cannot launch), DQCU_ATTEND_KERNEL=5, 6, 4 or 3 selects
 * another; v3 runs the BF16 tail and the shapes the others do not take. v6 measured slower than v5
 * except at batch 1 / short contexts (tests/bench/GPU_NOTES.md, run 12). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <array>
#include <atomic>
#include <type_traits>

#include "rans_cuda.cuh"

#define ATT_THREADS 128
#define ATT_T 128           /* tokens per tile */
#define ATT_LV_STRIDE (ATT_T + 4)
#define ATT_MAGIC 0x4a800000u /* 2^22: mantissa units of 1/2, so 2m in the low byte reads as m */

struct att_params {
    const dqcu_tables *tab;
    const dqcu_attn_seq *seqs;
    const float *q;
    float *part;            /* [nseq][nsplit + 1][QH][d + 2] */
    void *qprep;            /* v7: [nseq] prepared queries (a7_prep_bytes each), after part */
    uint32_t QH, G;
    uint32_t chunk;         /* tiles per block */
    uint32_t nsplit;        /* window splits; split nsplit is the tail */
    uint32_t split0;        /* split of blockIdx.y 0 (v4 launches v3 for the tail alone) */
    uint32_t tpw;           /* tiles per window */
    float scale;
};

struct att_plan {
    uint32_t tpw, chunk, nsplit;
    size_t smem;
    size_t ws_bytes;
    size_t prep_off; /* v7: offset of the prepared queries in the workspace */
};

static size_t att_smem_bytes(uint32_t QH, uint32_t d)
{
    size_t b = 0;
    b += 2 * 256 * sizeof(uint32_t);            /* decode tables K, V */
    b += (size_t)QH * d * sizeof(float);        /* rotated queries */
    b += (size_t)QH * d * sizeof(float);        /* accumulator */
    b += (size_t)QH * ATT_T * sizeof(float);    /* logits, then weights */
    b += 5 * (size_t)QH * sizeof(float);        /* qsum, qmu, m, l, off */
    b += 2 * ATT_T * sizeof(float);             /* value scale, value mid */
    b += (size_t)d * ATT_LV_STRIDE;             /* value levels, channel-major */
    return (b + 15) & ~(size_t)15;
}

/* Rotation of one head of d values held by a warp (lane l: values l, l + 32, ...; d <= 512). */
#define ATT_DVMAX 16

/* GMAX: the largest GQA group the kernel takes; EXACT: the group is exactly GMAX (no guards). */
template <int GMAX, bool EXACT>
__global__ void __launch_bounds__(ATT_THREADS) attend_kernel(att_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, G = EXACT ? (uint32_t)GMAX : p.G, d = tb.d, n = tb.n, W = tb.W;
    const uint32_t KVH = tb.kv_heads;
    uint32_t *dtk = (uint32_t *)(void *)smem;
    uint32_t *dtv = dtk + 256;
    float *qr = (float *)(void *)(dtv + 256);
    float *acc = qr + (size_t)QH * d;
    float *lg = acc + (size_t)QH * d;           /* [QH][ATT_T] */
    float *qsum = lg + (size_t)QH * ATT_T;
    float *qmu = qsum + QH;
    float *m_run = qmu + QH;
    float *l_run = m_run + QH;
    float *off_run = l_run + QH;
    float *sv = off_run + QH;                   /* [ATT_T] */
    float *midv = sv + ATT_T;
    uint8_t *lv = (uint8_t *)(void *)(midv + ATT_T); /* [d][ATT_LV_STRIDE] */

    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const uint32_t nwarps = ATT_THREADS / 32;
    const size_t b = blockIdx.x;
    const uint32_t split = blockIdx.y + p.split0;
    const dqcu_attn_seq sq = p.seqs[b];
    const bool is_tail = split == p.nsplit;
    uint32_t tile0 = 0, tile1 = 0;
    if (is_tail) {
        tile1 = (sq.tail_tokens + ATT_T - 1) / ATT_T;
    } else {
        const uint32_t ntiles = sq.nwin * p.tpw;
        tile0 = split * p.chunk;
        tile1 = min(ntiles, tile0 + p.chunk);
    }
    float *part = p.part + (((size_t)b * (p.nsplit + 1) + split) * QH) * (d + 2);
    if (tile0 >= tile1) {
        for (uint32_t h = tid; h < QH; h += ATT_THREADS) {
            part[(size_t)h * (d + 2) + d] = -INFINITY;
            part[(size_t)h * (d + 2) + d + 1] = 0.0f;
        }
        return;
    }

    const dqcu_kind_tab &kk = tb.kind[0], &kv_ = tb.kind[1];
    for (uint32_t i = tid; i < 256; i += ATT_THREADS) {
        dtk[i] = kk.dec[i];
        dtv[i] = kv_.dec[i];
    }
    const float ck = 0.5f * (float)(kk.M - 1), cv = 0.5f * (float)(kv_.M - 1);
    const float ck22 = 4194304.0f + ck, cv22 = 4194304.0f + cv;
    const uint32_t CK = kk.C, CV = kv_.C;
    const size_t rk = 4u + CK, rv = 4u + CV;
    const float rot_scale = tb.rot_scale;

    /* queries: rotated for the containers (per head: signs, butterfly, scale), as given for the tail */
    const float *qb = p.q + b * (size_t)QH * d;
    for (uint32_t h = warp; h < QH; h += nwarps) {
        const uint32_t kvh = h / G;
        float y[ATT_DVMAX];
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            y[r] = e < d ? qb[(size_t)h * d + e] : 0.0f;
            if (!is_tail && e < d)
                y[r] = y[r] * tb.signs[kvh * d + e];
        }
        if (!is_tail) {
            dqcu_fwht(y, d, lane);
#pragma unroll
            for (int r = 0; r < ATT_DVMAX; r++)
                y[r] = y[r] * rot_scale;
        }
        float s = 0;
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            if (e < d) {
                qr[(size_t)h * d + e] = y[r];
                acc[(size_t)h * d + e] = 0.0f;
                s += y[r];
            }
        }
        s = dqcu_warp_sum(s);
        if (lane == 0) {
            qsum[h] = s;
            m_run[h] = -INFINITY;
            l_run[h] = 0.0f;
            off_run[h] = 0.0f;
        }
    }
    __syncthreads();

    for (uint32_t tile = tile0; tile < tile1; tile++) {
        uint32_t cnt;
        const uint8_t *win = nullptr;
        size_t tbase;
        if (is_tail) {
            tbase = (size_t)tile * ATT_T;
            cnt = min((uint32_t)ATT_T, sq.tail_tokens - (uint32_t)tbase);
        } else {
            const uint32_t w = tile / p.tpw;
            tbase = (size_t)(tile % p.tpw) * ATT_T;
            cnt = min((uint32_t)ATT_T, W - (uint32_t)tbase);
            win = sq.windows[w];
            /* Σ_j q'_j μ_j per query head, μ = the window's dequantized key mean */
            const float sfm = dqcu_f16_le(win);
            for (uint32_t h = warp; h < QH; h += nwarps) {
                const uint32_t kvh = h / G;
                float s = 0;
                for (uint32_t e = lane; e < d; e += 32)
                    s = __fmaf_rn(qr[(size_t)h * d + e], (float)(int8_t)win[2u + kvh * d + e] * sfm, s);
                s = dqcu_warp_sum(s);
                if (lane == 0)
                    qmu[h] = s;
            }
            __syncthreads();
        }

        /* ---- keys: one stream per thread, decoded once, levels straight into the dots ---- */
        const uint32_t t = tid;
        if (t < cnt) {
            if (!is_tail) {
                const uint8_t *rec = dqcu_krec(win, n, rk, tbase + t);
                const float s = dqcu_f16_le(rec);
                const float o = dqcu_f16_le(rec + 2);
                const float mid = o + s * ck;
                dqcu_rans_in in;
                uint32_t x = dqcu_rans_open(in, rec + 4, CK);
                const float4 *q4 = (const float4 *)(const void *)qr; /* head h, j: q4[(h·d + j) / 4] */
                const uint32_t d4 = d / 4;
                for (uint32_t kvh = 0; kvh < KVH; kvh++) {
                    float dot[GMAX];
#pragma unroll
                    for (int g = 0; g < GMAX; g++)
                        dot[g] = 0.0f;
                    const float4 *qh = q4 + (size_t)kvh * G * d4;
                    for (uint32_t j4 = 0; j4 < d4; j4++) {
                        float l[4];
                        dqcu_rans_refill(in);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const uint32_t e = dqcu_rans_step(x, dtk, in);
                            l[u] = __uint_as_float(dqcu_prmt(e, ATT_MAGIC, 0x7652u)) - ck22;
                        }
#pragma unroll
                        for (int g = 0; g < GMAX; g++) {
                            if (EXACT || (uint32_t)g < G) {
                                const float4 qv = qh[(size_t)g * d4 + j4];
                                dot[g] = __fmaf_rn(qv.x, l[0], dot[g]);
                                dot[g] = __fmaf_rn(qv.y, l[1], dot[g]);
                                dot[g] = __fmaf_rn(qv.z, l[2], dot[g]);
                                dot[g] = __fmaf_rn(qv.w, l[3], dot[g]);
                            }
                        }
                    }
#pragma unroll
                    for (int g = 0; g < GMAX; g++) {
                        if (EXACT || (uint32_t)g < G) {
                            const uint32_t h = kvh * G + (uint32_t)g;
                            lg[(size_t)h * ATT_T + t] = p.scale * (s * dot[g] + mid * qsum[h] + qmu[h]);
                        }
                    }
                }
                const uint8_t *vrec = dqcu_vrec(win, n, W, rk, rv, tbase + t);
                const float s2 = dqcu_f16_le(vrec);
                const float o2 = dqcu_f16_le(vrec + 2);
                sv[t] = s2;
                midv[t] = o2 + s2 * cv;
            } else {
                const uint16_t *krow = sq.tail_k + (tbase + t) * n;
                for (uint32_t kvh = 0; kvh < KVH; kvh++) {
                    float dot[GMAX];
#pragma unroll
                    for (int g = 0; g < GMAX; g++)
                        dot[g] = 0.0f;
                    const float *qh = qr + (size_t)kvh * G * d;
                    for (uint32_t j = 0; j < d; j += 4) {
                        const uint2 kw = *(const uint2 *)(const void *)(krow + (size_t)kvh * d + j);
                        float kf[4] = {__uint_as_float(kw.x << 16), __uint_as_float(kw.x & 0xffff0000u),
                                       __uint_as_float(kw.y << 16), __uint_as_float(kw.y & 0xffff0000u)};
#pragma unroll
                        for (int g = 0; g < GMAX; g++) {
                            if (EXACT || (uint32_t)g < G) {
                                const float4 q4 = *(const float4 *)(const void *)(qh + (size_t)g * d + j);
                                dot[g] = __fmaf_rn(q4.x, kf[0], dot[g]);
                                dot[g] = __fmaf_rn(q4.y, kf[1], dot[g]);
                                dot[g] = __fmaf_rn(q4.z, kf[2], dot[g]);
                                dot[g] = __fmaf_rn(q4.w, kf[3], dot[g]);
                            }
                        }
                    }
#pragma unroll
                    for (int g = 0; g < GMAX; g++)
                        if (EXACT || (uint32_t)g < G)
                            lg[(size_t)(kvh * G + (uint32_t)g) * ATT_T + t] = p.scale * dot[g];
                }
                sv[t] = 1.0f;
                midv[t] = 0.0f;
            }
        }
        __syncthreads();

        /* ---- online softmax, one warp per query head ---- */
        for (uint32_t h = warp; h < QH; h += nwarps) {
            float *row = lg + (size_t)h * ATT_T;
            float mb = -INFINITY;
            for (uint32_t u = lane; u < cnt; u += 32)
                mb = fmaxf(mb, row[u]);
            mb = dqcu_warp_max(mb);
            const float mold = m_run[h];
            const float mnew = fmaxf(mold, mb);
            if (mnew > mold) {
                const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
                for (uint32_t e = lane; e < d; e += 32)
                    acc[(size_t)h * d + e] *= alpha;
                __syncwarp();
                if (lane == 0) {
                    l_run[h] *= alpha;
                    off_run[h] *= alpha;
                    m_run[h] = mnew;
                }
            }
            float ps = 0, os = 0;
            for (uint32_t u = lane; u < ATT_T; u += 32) {
                float wgt = 0.0f;
                if (u < cnt) {
                    const float pr = __expf(row[u] - mnew);
                    ps += pr;
                    os = __fmaf_rn(pr, midv[u], os);
                    wgt = pr * sv[u];
                }
                row[u] = wgt;
            }
#pragma unroll
            for (int off = 16; off >= 1; off >>= 1) {
                ps += __shfl_xor_sync(DQCU_FULL, ps, off);
                os += __shfl_xor_sync(DQCU_FULL, os, off);
            }
            if (lane == 0) {
                l_run[h] += ps;
                off_run[h] += os;
            }
        }
        __syncthreads();

        /* ---- values: decode head by head into shared memory, accumulate per channel ---- */
        dqcu_rans_in vin;
        uint32_t vx = 0;
        if (!is_tail && t < cnt)
            vx = dqcu_rans_open(vin, dqcu_vrec(win, n, W, rk, rv, tbase + t) + 4, CV);
        const uint32_t cnt4 = (cnt + 3u) & ~3u;
        for (uint32_t kvh = 0; kvh < KVH; kvh++) {
            if (!is_tail) {
                if (t < cnt) {
                    uint8_t *dst = lv + t;
                    for (uint32_t j = 0; j < d; j += 4) {
                        dqcu_rans_refill(vin);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const uint32_t e = dqcu_rans_step(vx, dtv, vin);
                            dst[(size_t)u * ATT_LV_STRIDE] = (uint8_t)(e >> 16);
                        }
                        dst += 4 * ATT_LV_STRIDE;
                    }
                }
                __syncthreads();
            }
            const float4 *w4 = (const float4 *)(const void *)(lg + (size_t)kvh * G * ATT_T);
            for (uint32_t j = tid; j < d; j += ATT_THREADS) {
                float a[GMAX];
#pragma unroll
                for (int g = 0; g < GMAX; g++)
                    a[g] = 0.0f;
                if (!is_tail) {
                    const uint32_t *lrow = (const uint32_t *)(const void *)(lv + (size_t)j * ATT_LV_STRIDE);
                    for (uint32_t u4 = 0; u4 < cnt4 / 4; u4++) {
                        const uint32_t pk = lrow[u4];
                        const float l0 = __uint_as_float(dqcu_prmt(pk, ATT_MAGIC, 0x7650u)) - cv22;
                        const float l1 = __uint_as_float(dqcu_prmt(pk, ATT_MAGIC, 0x7651u)) - cv22;
                        const float l2 = __uint_as_float(dqcu_prmt(pk, ATT_MAGIC, 0x7652u)) - cv22;
                        const float l3 = __uint_as_float(dqcu_prmt(pk, ATT_MAGIC, 0x7653u)) - cv22;
#pragma unroll
                        for (int g = 0; g < GMAX; g++) {
                            if (EXACT || (uint32_t)g < G) {
                                const float4 wv = w4[(size_t)g * (ATT_T / 4) + u4];
                                a[g] = __fmaf_rn(wv.x, l0, a[g]);
                                a[g] = __fmaf_rn(wv.y, l1, a[g]);
                                a[g] = __fmaf_rn(wv.z, l2, a[g]);
                                a[g] = __fmaf_rn(wv.w, l3, a[g]);
                            }
                        }
                    }
                } else {
                    const uint16_t *vcol = sq.tail_v + tbase * n + (size_t)kvh * d + j;
                    for (uint32_t u = 0; u < cnt; u++) {
                        const float vf = dqcu_bf16_to_f32(vcol[(size_t)u * n]);
#pragma unroll
                        for (int g = 0; g < GMAX; g++)
                            if (EXACT || (uint32_t)g < G)
                                a[g] = __fmaf_rn(lg[(size_t)(kvh * G + (uint32_t)g) * ATT_T + u], vf, a[g]);
                    }
                }
#pragma unroll
                for (int g = 0; g < GMAX; g++)
                    if (EXACT || (uint32_t)g < G)
                        acc[(size_t)(kvh * G + (uint32_t)g) * d + j] += a[g];
            }
            __syncthreads();
        }
    }

    /* ---- un-rotate (acc + Σ a·mid on every channel) and write this block's partial ---- */
    for (uint32_t h = warp; h < QH; h += nwarps) {
        const uint32_t kvh = h / G;
        float y[ATT_DVMAX];
        const float off = off_run[h];
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            y[r] = e < d ? acc[(size_t)h * d + e] + off : 0.0f;
        }
        if (!is_tail) {
            dqcu_fwht(y, d, lane);
#pragma unroll
            for (int r = 0; r < ATT_DVMAX; r++) {
                const uint32_t e = (uint32_t)r * 32u + lane;
                if (e < d)
                    y[r] = y[r] * rot_scale * tb.signs[kvh * d + e];
            }
        }
        float *ph = part + (size_t)h * (d + 2);
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            if (e < d)
                ph[e] = y[r];
        }
        if (lane == 0) {
            ph[d] = m_run[h];
            ph[d + 1] = l_run[h];
        }
    }
}

#include "attend_v4.cuh"
#include "attend_v5.cuh"
#include "attend_v7.cuh"

/* Merges a sequence's partials by their log-sum-exp. Block (sequence, query head, 32 channels):
 * the 1024 threads first take the splits' maxima and weights, then warp w sums the splits
 * s = w (mod 32) for its lane's channel, and the warps' sums are added. */
#define MERGE_THREADS 1024
__global__ void __launch_bounds__(MERGE_THREADS) attend_merge_kernel(const float *part, uint32_t nsplit_total,
                                                                      uint32_t QH, uint32_t d, float *out, float *lse)
{
    extern __shared__ float wts[]; /* [nsplit_total] */
    __shared__ float red[32][33];
    __shared__ float s_m, s_l;
    const size_t b = blockIdx.x;
    const uint32_t h = blockIdx.y, e = blockIdx.z * 32u + (threadIdx.x & 31u);
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const size_t stride = (size_t)QH * (d + 2);
    const float *ph = part + (size_t)b * nsplit_total * stride + (size_t)h * (d + 2);

    float M = -INFINITY;
    for (uint32_t s = tid; s < nsplit_total; s += MERGE_THREADS)
        M = fmaxf(M, ph[s * stride + d]);
    M = dqcu_warp_max(M);
    if (lane == 0)
        red[0][warp] = M;
    __syncthreads();
    if (warp == 0) {
        M = red[0][lane];
        M = dqcu_warp_max(M);
        if (lane == 0)
            s_m = M;
    }
    __syncthreads();
    M = s_m;
    float L = 0.0f;
    for (uint32_t s = tid; s < nsplit_total; s += MERGE_THREADS) {
        const float ms = ph[s * stride + d];
        const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
        wts[s] = w;
        if (w != 0.0f)
            L = __fmaf_rn(w, ph[s * stride + d + 1], L);
    }
    L = dqcu_warp_sum(L);
    __syncthreads();
    if (lane == 0)
        red[1][warp] = L;
    __syncthreads();
    if (warp == 0) {
        L = red[1][lane];
        L = dqcu_warp_sum(L);
        if (lane == 0)
            s_l = L;
    }
    __syncthreads();
    L = s_l;
    float v = 0.0f;
    if (e < d) {
#pragma unroll 4
        for (uint32_t s = warp; s < nsplit_total; s += 32) {
            const float w = wts[s];
            if (w != 0.0f)
                v = __fmaf_rn(w, ph[s * stride + e], v);
        }
    }
    __syncthreads();
    red[warp][lane] = v;
    __syncthreads();
    if (warp == 0) {
        float sum = 0.0f;
        for (uint32_t w = 0; w < 32; w++)
            sum += red[w][lane];
        if (e < d)
            out[((size_t)b * QH + h) * d + e] = L > 0 ? sum / L : 0.0f;
        if (lse && blockIdx.z == 0 && lane == 0)
            lse[(size_t)b * QH + h] = L > 0 ? M + logf(L) : -INFINITY;
    }
}

/* Which kernel family dqcu_attend asks for: DQCU_ATTEND_KERNEL=3 selects v3 for every shape, =4
 * v4 wherever it takes the shape, =5 v5 and =6 v6 wherever they take the shape and can launch
 * (else v4, else v3), anything else v7 wherever it takes the shape and can launch (else v5, else
 * v4, else v3). The BF16 tail is always v3's. Read once. */
static int att_variant()
{
    static const int v = [] {
        const char *e = getenv("DQCU_ATTEND_KERNEL");
        if (!e || !e[0] || e[1])
            return 7;
        return e[0] == '3' ? 3 : e[0] == '4' ? 4 : e[0] == '5' ? 5 : e[0] == '6' ? 6 : 7;
    }();
    return v;
}

/* Blocks of v5, v6 or v7 (ver), group G, one SM holds with dyn bytes of dynamic shared memory, from
 * the compiled kernel's registers and static shared memory; 0 when it cannot run at all (then an
 * older version runs). The attributes come from the binary, not from a launch, so the choice (and
 * the workspace size that depends on it) is the same in dqcu_attend_workspace_size and
 * dqcu_attend. */
struct a5_attr {
    cudaFuncAttributes fa;
    bool ok;
};
template <typename K> static a5_attr a5_query_attr(K kernel)
{
    a5_attr a{};
    a.ok = cudaFuncGetAttributes(&a.fa, kernel) == cudaSuccess;
    (void)cudaGetLastError();
    return a;
}
template <int V> static std::array<a5_attr, 4> a5_query_attrs()
{
    if constexpr (V == 7)
        return {a5_query_attr(attend7_kernel<1>), a5_query_attr(attend7_kernel<2>),
                a5_query_attr(attend7_kernel<4>), a5_query_attr(attend7_kernel<8>)};
    else
        return {a5_query_attr(attend5_kernel<1, V == 6>), a5_query_attr(attend5_kernel<2, V == 6>),
                a5_query_attr(attend5_kernel<4, V == 6>), a5_query_attr(attend5_kernel<8, V == 6>)};
}

static uint32_t a5_blocks_per_sm(const dqcu_codec *dc, uint32_t G, size_t dyn, int ver)
{
    /* one query per kernel for the process (one sm_90 binary serves every device); ok = false when
     * the query failed */
    static const std::array<a5_attr, 4> attrs5 = a5_query_attrs<5>();
    static const std::array<a5_attr, 4> attrs6 = a5_query_attrs<6>();
    static const std::array<a5_attr, 4> attrs7 = a5_query_attrs<7>();
    const std::array<a5_attr, 4> &attrs = ver == 7 ? attrs7 : ver == 6 ? attrs6 : attrs5;
    const int gi = G == 1 ? 0 : G == 2 ? 1 : G == 4 ? 2 : G == 8 ? 3 : -1;
    if (gi < 0 || !attrs[gi].ok)
        return 0;
    const cudaFuncAttributes &fa = attrs[gi].fa;
    if (fa.maxThreadsPerBlock < A5_THREADS || fa.localSizeBytes > 0)
        return 0;
    const size_t need = dyn + fa.sharedSizeBytes;
    if (need > dc->smem_optin)
        return 0;
    int sm_smem = 0, sm_regs = 0;
    if (cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dc->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_regs, cudaDevAttrMaxRegistersPerMultiprocessor, dc->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* registers are allocated per warp in units of 256 */
    const uint64_t warp_regs = ((uint64_t)fa.numRegs * 32 + 255) / 256 * 256;
    const uint64_t by_regs = warp_regs ? (uint64_t)sm_regs / (warp_regs * (A5_THREADS / 32)) : 0;
    const uint64_t by_smem = (uint64_t)sm_smem / (need + 1024);
    uint64_t nb = by_regs < by_smem ? by_regs : by_smem;
    if (nb > 2048 / A5_THREADS)
        nb = 2048 / A5_THREADS;
    return (uint32_t)nb;
}

static att_plan att_make_plan(const dqcu_codec *dc, uint32_t QH, uint32_t nseq, uint32_t max_tokens, int ver)
{
    att_plan pl;
    const uint32_t G = QH / dc->kv_heads;
    pl.tpw = (dc->W + ATT_T - 1) / ATT_T;
    const uint64_t tiles = (uint64_t)(max_tokens / dc->W) * pl.tpw;
    pl.smem = ver == 7   ? a7_smem_bytes(QH, dc->d, G)
              : ver == 6 ? a6_smem_bytes(QH, dc->d, G)
              : ver == 5 ? a5_smem_bytes(QH, dc->d, G)
              : ver == 4 ? a4_smem_bytes(QH, dc->d, dc->kv_heads, G)
                         : att_smem_bytes(QH, dc->d);
    /* v3: 3 blocks per SM, two rounds of them; v4: one round of the blocks that fit (a block of c
     * tiles pipelines them in c + 1 stages, so fewer, longer blocks lose little); v5: one round of
     * the blocks that fit (no pipeline to fill: any split is fine, one round avoids a tail) */
    uint64_t per_sm = 6;
    if (ver == 4) {
        int sm_smem = 0;
        if (cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dc->device) != cudaSuccess)
            sm_smem = 0;
        per_sm = (uint64_t)sm_smem / (pl.smem + 1024);
        per_sm = per_sm < 1 ? 1 : per_sm > 2 ? 2 : per_sm;
    } else if (ver >= 5) {
        per_sm = a5_blocks_per_sm(dc, G, pl.smem, ver);
        per_sm = per_sm < 1 ? 1 : per_sm;
    }
    const uint64_t slots = (uint64_t)(dc->sm_count > 0 ? dc->sm_count : 1) * per_sm;
    uint64_t chunk = (tiles * nseq + slots - 1) / slots;
    if (chunk < 1)
        chunk = 1;
    if ((tiles + chunk - 1) / chunk > 8191) /* the merge keeps a weight per split in shared memory */
        chunk = (tiles + 8190) / 8191;
    pl.chunk = (uint32_t)chunk;
    pl.nsplit = (uint32_t)((tiles + chunk - 1) / chunk);
    pl.ws_bytes = (size_t)nseq * (pl.nsplit + 1) * QH * (dc->d + 2) * sizeof(float);
    pl.prep_off = 0;
    if (ver == 7) {
        pl.prep_off = (pl.ws_bytes + 255) & ~(size_t)255;
        pl.ws_bytes = pl.prep_off + (size_t)nseq * a7_prep_bytes(QH, dc->d, G);
    }
    return pl;
}

/* The kernel that runs the windows: 7, 6, 5, 4 or 3 (see att_variant) */
static int att_pick(const dqcu_codec *dc, uint32_t QH)
{
    const uint32_t G = QH / dc->kv_heads;
    int want = att_variant();
    if (want == 7 && a7_shape_ok(G, dc->d) && a5_blocks_per_sm(dc, G, a7_smem_bytes(QH, dc->d, G), 7) >= 1)
        return 7;
    if (want == 7)
        want = 5;
    if (want == 6 && a5_shape_ok(G, dc->d) && a5_blocks_per_sm(dc, G, a6_smem_bytes(QH, dc->d, G), 6) >= 1)
        return 6;
    if (want >= 5 && a5_shape_ok(G, dc->d) && a5_blocks_per_sm(dc, G, a5_smem_bytes(QH, dc->d, G), 5) >= 1)
        return 5;
    if (want >= 4 && a4_shape_ok(G, dc->d) && a4_smem_bytes(QH, dc->d, dc->kv_heads, G) <= dc->smem_optin)
        return 4;
    return 3;
}

extern "C" int dqcu_attend_check(const dqcu_codec *dc, uint32_t q_heads)
{
    if (!dc)
        return DQ_INVALID_ARGUMENT;
    if (!q_heads || q_heads % dc->kv_heads)
        return DQ_SHAPE;
    if (dc->d < 32 || dc->d > 512 || q_heads / dc->kv_heads > 8)
        return DQ_UNSUPPORTED;
    if (att_smem_bytes(q_heads, dc->d) > dc->smem_optin)
        return DQ_UNSUPPORTED;
    return DQ_OK;
}

extern "C" size_t dqcu_attend_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq,
                                             uint32_t max_tokens)
{
    if (!dc || !q_heads)
        return 0;
    return att_make_plan(dc, q_heads, nseq, max_tokens, att_pick(dc, q_heads)).ws_bytes;
}

/* Lets kernel K use all the dynamic shared memory a block may opt in to, once per device (the
 * attribute is per device) instead of a cudaFuncSetAttribute before every launch: run 24 measured
 * ~10 µs per CUDA call on the H200 host, and a decode step makes 36 calls of dqcu_attend. Every
 * thread sets the same value, so racing first calls are harmless. */
template <auto K> static int att_allow_smem()
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

template <int GMAX, bool EXACT>
static int launch_att(const att_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
    int rc = att_allow_smem<attend_kernel<GMAX, EXACT>>();
    if (rc)
        return rc;
    dim3 grid(nseq, nblk_y);
    attend_kernel<GMAX, EXACT><<<grid, ATT_THREADS, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

/* v3 over the splits [p.split0, p.split0 + nblk_y) */
static int launch_v3(const att_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
    switch (p.G) {
    case 1: return launch_att<1, true>(p, smem, nseq, nblk_y, stream);
    case 2: return launch_att<2, true>(p, smem, nseq, nblk_y, stream);
    case 4: return launch_att<4, true>(p, smem, nseq, nblk_y, stream);
    case 8: return launch_att<8, true>(p, smem, nseq, nblk_y, stream);
    default: return p.G < 8 ? launch_att<8, false>(p, smem, nseq, nblk_y, stream) : DQ_UNSUPPORTED;
    }
}

template <int G>
static int launch_v4(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    int rc = att_allow_smem<attend4_kernel<G>>();
    if (rc)
        return rc;
    dim3 grid(nseq, pl.nsplit);
    attend4_kernel<G><<<grid, A4_THREADS, pl.smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

/* v5 (PF = false) or v6 (PF = true) */
template <int G, bool PF>
static int launch_v5(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    int rc = att_allow_smem<attend5_kernel<G, PF>>();
    if (rc)
        return rc;
    dim3 grid(nseq, pl.nsplit);
    attend5_kernel<G, PF><<<grid, A5_THREADS, pl.smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <int G>
static int launch_v7(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    attend7_prep_kernel<G><<<nseq, A5_THREADS, 0, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    int rc = att_allow_smem<attend7_kernel<G>>();
    if (rc)
        return rc;
    dim3 grid(nseq, pl.nsplit);
    attend7_kernel<G><<<grid, A5_THREADS, pl.smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

extern "C" int dqcu_attend(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs,
                           uint32_t nseq, uint32_t max_tokens, const float *q, float *out, float *lse,
                           void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (!dc || (nseq && (!seqs || !q || !out || !workspace)) || !isfinite(scale))
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu_attend_check(dc, q_heads);
    if (rc)
        return rc;
    if (nseq > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    if (nseq == 0)
        return DQ_OK;
    const int ver = att_pick(dc, q_heads);
    const att_plan pl = att_make_plan(dc, q_heads, nseq, max_tokens, ver);
    if (workspace_bytes < pl.ws_bytes || ((uintptr_t)workspace & 15))
        return DQ_INVALID_ARGUMENT;
    att_params p = {};
    p.tab = dc->tab;
    p.seqs = seqs;
    p.q = q;
    p.part = (float *)workspace;
    p.qprep = (unsigned char *)workspace + pl.prep_off;
    p.QH = q_heads;
    p.G = q_heads / dc->kv_heads;
    p.chunk = pl.chunk;
    p.nsplit = pl.nsplit;
    p.tpw = pl.tpw;
    p.scale = scale;
    if (ver == 3) {
        rc = launch_v3(p, pl.smem, nseq, pl.nsplit + 1, stream);
    } else {
        /* the BF16 tail (split nsplit) is v3's; windows are v4's .. v7's */
        att_params pt = p;
        pt.split0 = pl.nsplit;
        rc = launch_v3(pt, att_smem_bytes(q_heads, dc->d), nseq, 1, stream);
        if (!rc && ver == 7) {
            switch (p.G) {
            case 1: rc = launch_v7<1>(p, pl, nseq, stream); break;
            case 2: rc = launch_v7<2>(p, pl, nseq, stream); break;
            case 4: rc = launch_v7<4>(p, pl, nseq, stream); break;
            default: rc = launch_v7<8>(p, pl, nseq, stream); break;
            }
        } else if (!rc && ver == 6) {
            switch (p.G) {
            case 1: rc = launch_v5<1, true>(p, pl, nseq, stream); break;
            case 2: rc = launch_v5<2, true>(p, pl, nseq, stream); break;
            case 4: rc = launch_v5<4, true>(p, pl, nseq, stream); break;
            default: rc = launch_v5<8, true>(p, pl, nseq, stream); break;
            }
        } else if (!rc && ver == 5) {
            switch (p.G) {
            case 1: rc = launch_v5<1, false>(p, pl, nseq, stream); break;
            case 2: rc = launch_v5<2, false>(p, pl, nseq, stream); break;
            case 4: rc = launch_v5<4, false>(p, pl, nseq, stream); break;
            default: rc = launch_v5<8, false>(p, pl, nseq, stream); break;
            }
        } else if (!rc) {
            switch (p.G) {
            case 1: rc = launch_v4<1>(p, pl, nseq, stream); break;
            case 2: rc = launch_v4<2>(p, pl, nseq, stream); break;
            case 4: rc = launch_v4<4>(p, pl, nseq, stream); break;
            default: rc = launch_v4<8>(p, pl, nseq, stream); break;
            }
        }
    }
    if (rc)
        return rc;
    dim3 mgrid(nseq, q_heads, (dc->d + 31) / 32);
    attend_merge_kernel<<<mgrid, MERGE_THREADS, sizeof(float) * (pl.nsplit + 1), stream>>>(
        (const float *)workspace, pl.nsplit + 1, q_heads, dc->d, out, lse);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
