/* Fused decode attention, version 3: CUDA cores only (DESIGN §2.7, seed §4.5 and Appendix A).
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
 * v3 runs the BF16 tail of every call (split nsplit; v5 and v7 run only the sealed windows) and the
 * windows of the shapes v5 and v7 do not take (a GQA group other than 1, 2, 4, 8; head_dim not a
 * multiple of 64 or above 256), and the windows of every shape when dqcu_settings asks for it. */
#include "attend_internal.cuh"

#define ATT_LV_STRIDE (ATT_T + 4)

size_t dqcu__attend3_smem(uint32_t QH, uint32_t d)
{
    size_t b = 0;
    b += 2 * 256 * sizeof(uint32_t);         /* decode tables K, V */
    b += (size_t)QH * d * sizeof(float);     /* rotated queries */
    b += (size_t)QH * d * sizeof(float);     /* accumulator */
    b += (size_t)QH * ATT_T * sizeof(float); /* logits, then weights */
    b += 5 * (size_t)QH * sizeof(float);     /* qsum, qmu, m, l, off */
    b += 2 * ATT_T * sizeof(float);          /* value scale, value mid */
    b += (size_t)d * ATT_LV_STRIDE;          /* value levels, channel-major */
    return (b + 15) & ~(size_t)15;
}

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
    float *lg = acc + (size_t)QH * d; /* [QH][ATT_T] */
    float *qsum = lg + (size_t)QH * ATT_T;
    float *qmu = qsum + QH;
    float *m_run = qmu + QH;
    float *l_run = m_run + QH;
    float *off_run = l_run + QH;
    float *sv = off_run + QH; /* [ATT_T] */
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
int dqcu__attend3_launch(const att_params &p, size_t smem, uint32_t nseq, uint32_t nblk_y, cudaStream_t stream)
{
    switch (p.G) {
    case 1:
        return launch_att<1, true>(p, smem, nseq, nblk_y, stream);
    case 2:
        return launch_att<2, true>(p, smem, nseq, nblk_y, stream);
    case 4:
        return launch_att<4, true>(p, smem, nseq, nblk_y, stream);
    case 8:
        return launch_att<8, true>(p, smem, nseq, nblk_y, stream);
    default:
        return p.G < 8 ? launch_att<8, false>(p, smem, nseq, nblk_y, stream) : DQ_UNSUPPORTED;
    }
}
