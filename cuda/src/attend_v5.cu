/* Fused decode attention, version 5: each thread decodes the key AND the value stream of its token,
 * interleaved, and a tile is finished head by head in one pass. Its phases shared with v7 are
 * in attend_internal.cuh; it is v7's fallback and the reference v7 is measured against.
 *
 * Why: v4 gives each thread one stream, so a warp has one serial dependency chain (table lookup →
 * multiply → renormalize → next lookup) and issues ~0.24 instructions per cycle per scheduler; and
 * its key and value passes of a tile are two pipeline stages, so a block of one tile (batch 1)
 * pays two full serial passes. Here a block has 128 threads, thread t = token t of the tile:
 *   for each KV head kvh (both streams are in head order, d symbols per head):
 *     decode d key symbols and d value symbols, interleaved: two independent chains per thread;
 *       key levels go into the G dot products (CUDA cores, as v4), value levels into a
 *       channel-major byte buffer;                                                   barrier A
 *     softmax of the G query heads of kvh over the tile (a query head's scores only need its KV
 *       head's keys), weights as MMA B fragments;                                     barrier B
 *     value contraction of kvh on tensor cores (as v4), accumulator rescaled;        barrier C
 * So a tile is one serial pass of n symbol pairs instead of two passes of n, and the per-head
 * buffers (logits G × 128, weights, one value head) are small: ~58 KB of shared memory at the
 * Qwen3-8B shape, so 3 blocks per SM: 12 warps × 2 chains = 24 chains per SM against v4's 16.
 *
 * Numerics are v4's: the same decode step, the same FMA order in the dots, the same softmax per
 * (tile, query head), the same fp16 hi/lo weight split and MMA order; only the order in which
 * heads and tiles are visited changes, and each (tile, head) update is independent of the others
 * except through the online-softmax state, which is updated in the same tile order as v4.
 *
 * (v4, removed: 256 threads, keys and values decoded by two thread roles; GPU_NOTES.md.)
 *
 * The reader: the decode tables live in static shared memory (the lookup's address is
 * (x & 255) · 4 plus an immediate, one add fewer per symbol than a table pointer), and the
 * refill is v4's deferred queue written without a branch (predicated load, selects), so the two
 * chains' refills can be scheduled into each other. */

#include "attend_internal.cuh"

/* dynamic shared memory (the decode tables are static: A5_STATIC more) */
#define A5_STATIC (2 * 256 * sizeof(uint32_t))
static size_t a5_smem_bytes(uint32_t QH, uint32_t d, uint32_t G)
{
    size_t b = 0;
    b += 2 * (size_t)QH * d * sizeof(float);            /* rotated queries, accumulator */
    b += (size_t)G * ATT_T * sizeof(float);             /* logits of one KV head's query heads */
    b += (size_t)(ATT_T / 16) * att_ntiles(G) * 32 * 8; /* their weights as B fragments */
    b += 6 * (size_t)QH * sizeof(float);                /* qsum, m, l, off, alpha, weight scale */
    b += 2 * ATT_T * sizeof(float);                     /* value scale, value mid */
    b += (size_t)d * ATT_VSTR;                          /* value levels of one head */
    return (b + 15) & ~(size_t)15;
}

template <int G>
__global__ void __launch_bounds__(ATT_THREADS, 3) attend5_kernel(att_params p)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t KS = ATT_T / 16;
    __shared__ uint32_t dtk[256], dtv[256];
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, d = tb.d, n = tb.n, W = tb.W, KVH = tb.kv_heads;
    float *qr = (float *)(void *)smem;
    float *acc = qr + (size_t)QH * d;
    float *lg = acc + (size_t)QH * d;                       /* [G][ATT_T] */
    uint2 *wfr = (uint2 *)(void *)(lg + (size_t)G * ATT_T); /* [KS][NT][32 lanes] */
    float *qsum = (float *)(void *)(wfr + (size_t)KS * NT * 32);
    float *m_run = qsum + QH, *l_run = m_run + QH, *off_run = l_run + QH;
    float *alpha_s = off_run + QH, *wsc = alpha_s + QH;
    float *sv = wsc + QH, *midv = sv + ATT_T;
    uint8_t *lv = (uint8_t *)(void *)(midv + ATT_T); /* [d][ATT_VSTR] */

    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const uint32_t nwarps = ATT_THREADS / 32;
    const size_t b = blockIdx.x;
    const uint32_t split = blockIdx.y;
    const dqcu_attn_seq sq = p.seqs[b];
    const uint32_t ntiles = sq.nwin * p.tpw;
    const uint32_t tile0 = split * p.chunk, tile1 = min(ntiles, tile0 + p.chunk);
    float *part = p.part + (((size_t)b * (p.nsplit + 1) + split) * QH) * (d + 2);
    if (tile0 >= tile1) {
        att_empty(part, QH, d, tid);
        return;
    }

    const dqcu_kind_tab &kk = tb.kind[0], &kv_ = tb.kind[1];
    for (uint32_t i = tid; i < 256; i += ATT_THREADS) {
        dtk[i] = kk.dec[i];
        dtv[i] = kv_.dec[i];
    }
    /* columns of groups smaller than 4 are never written: keep them zero */
    for (uint32_t i = tid; i < KS * NT * 32; i += ATT_THREADS)
        wfr[i] = make_uint2(0u, 0u);
    const float ck = 0.5f * (float)(kk.M - 1), cv = 0.5f * (float)(kv_.M - 1);
    const float ck22 = 4194304.0f + ck;
    const uint32_t CK = kk.C, CV = kv_.C;
    const size_t rk = 4u + CK, rv = 4u + CV;
    const float rot_scale = tb.rot_scale;

    /* queries, rotated for the containers (per head: signs, butterfly, scale) */
    const float *qb = p.q + b * (size_t)QH * d;
    for (uint32_t h = warp; h < QH; h += nwarps) {
        float y[ATT_DVMAX];
        att_rotate_query(qb + (size_t)h * d, tb.signs + (h / G) * d, rot_scale, d, lane, y);
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

    const __half2 c2h = __floats2half2_rn(512.0f + cv, 512.0f + cv);
    const uint32_t c2 = *(const uint32_t *)(const void *)&c2h;
    const uint32_t t = tid;
    for (uint32_t tile = tile0; tile < tile1; tile++) {
        const uint32_t tbase = (tile % p.tpw) * ATT_T, cnt = min((uint32_t)ATT_T, W - tbase);
        const uint8_t *win = sq.windows[tile / p.tpw];
        const float sfm = dqcu_f16_le(win);
        /* open both streams of token t; sv/midv of the previous tile were last read before its
         * final barrier B, which every thread has passed */
        float s = 0.0f, mid = 0.0f;
        dqcu_rans_q kin, vin;
        uint32_t xk = 0, xv = 0;
        if (t < cnt) {
            const uint8_t *rec = dqcu_krec(win, n, rk, tbase + t);
            s = dqcu_f16_le(rec);
            const float o = dqcu_f16_le(rec + 2);
            mid = __fmaf_rn(s, ck, o);
            xk = dqcu_rans_q_open(kin, rec + 4, CK);
            const uint8_t *vrec = dqcu_vrec(win, n, W, rk, rv, tbase + t);
            const float s2 = dqcu_f16_le(vrec);
            const float o2 = dqcu_f16_le(vrec + 2);
            sv[t] = s2;
            midv[t] = __fmaf_rn(s2, cv, o2);
            xv = dqcu_rans_q_open(vin, vrec + 4, CV);
        }
        const float4 *q4 = (const float4 *)(const void *)qr;
        const uint32_t d4 = d / 4;
        for (uint32_t kvh = 0; kvh < KVH; kvh++) {
            /* ---- key and value streams of token t, head kvh, interleaved ---- */
            if (t < cnt) {
                float dot[G];
#pragma unroll
                for (int g = 0; g < G; g++)
                    dot[g] = 0.0f;
                const float4 *qh = q4 + (size_t)kvh * G * d4;
                /* tokens >= cnt keep stale (finite) bytes: their weights are 0 */
                uint8_t *dst = lv + t;
                for (uint32_t j4 = 0; j4 < d4; j4++) {
                    float l[4];
                    dqcu_rans_q_refill(kin);
                    dqcu_rans_q_refill(vin);
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const uint32_t e = dqcu_rans_step(xk, dtk, kin);
                        l[u] = __uint_as_float(dqcu_prmt(e, ATT_MAGIC, 0x7652u)) - ck22;
                        const uint32_t ev = dqcu_rans_step(xv, dtv, vin);
                        dst[(size_t)u * ATT_VSTR] = (uint8_t)(ev >> 16);
                    }
                    dst += 4 * ATT_VSTR;
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        const float4 qv = qh[(size_t)g * d4 + j4];
                        dot[g] = __fmaf_rn(qv.x, l[0], dot[g]);
                        dot[g] = __fmaf_rn(qv.y, l[1], dot[g]);
                        dot[g] = __fmaf_rn(qv.z, l[2], dot[g]);
                        dot[g] = __fmaf_rn(qv.w, l[3], dot[g]);
                    }
                }
#pragma unroll
                for (int g = 0; g < G; g++)
                    lg[(size_t)g * ATT_T + t] = p.scale * __fmaf_rn(s, dot[g], mid * qsum[kvh * G + (uint32_t)g]);
            }
            __syncthreads(); /* A: logits and value levels of head kvh are in place */

            /* ---- softmax of the group's query heads over this tile, one warp per head ---- */
            for (uint32_t g = warp; g < (uint32_t)G; g += nwarps) {
                const uint32_t h = kvh * G + g;
                /* Σ_j q'_j μ_j, μ = the window's dequantized key mean */
                float qm = 0;
                for (uint32_t e = lane; e < d; e += 32)
                    qm = __fmaf_rn(qr[(size_t)h * d + e], (float)(int8_t)win[2u + kvh * d + e], qm);
                qm = dqcu_warp_sum(qm);
                const float sh = p.scale * (qm * sfm);
                att_softmax<NT>(lg + (size_t)g * ATT_T, sh, cnt, h, g, m_run, l_run, off_run, alpha_s, wsc, sv, midv,
                                wfr, lane);
            }
            __syncthreads(); /* B: weights, alpha and scale of the group are in place */

            /* ---- value contraction of head kvh on tensor cores ---- */
            att_value_mma<G>(lv, wfr, kvh, d, acc, d, alpha_s, wsc, c2, warp, lane);
            __syncthreads(); /* C: the value buffer and the weights are free for the next head */
        }
    }
    /* ---- un-rotate (acc + Σ a·mid on every channel) and write this block's partial ---- */
    att_finish(acc, d, off_run, m_run, l_run, part, tb, QH, G, warp, lane);
}

bool dqcu__attend5_fit(const dqcu_codec *dc, uint32_t QH, att_fit *f)
{
    /* one query per kernel for the process (one sm_90 binary serves every device) */
    static const std::array<att_attr, 4> attrs = {att_query_attr(attend5_kernel<1>), att_query_attr(attend5_kernel<2>),
                                                  att_query_attr(attend5_kernel<4>), att_query_attr(attend5_kernel<8>)};
    const uint32_t G = QH / dc->kv_heads;
    if (!att_mma_shape_ok(G, dc->d))
        return false;
    f->smem = a5_smem_bytes(QH, dc->d, G);
    f->per_sm = dqcu__attend_blocks_per_sm(dc, attrs[att_group_index(G)], f->smem);
    f->prep_bytes = 0;
    return f->per_sm >= 1;
}

template <int G>
static int launch_v5(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    int rc = att_allow_smem<attend5_kernel<G>>();
    if (rc)
        return rc;
    dim3 grid(nseq, pl.nsplit);
    attend5_kernel<G><<<grid, ATT_THREADS, pl.smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

int dqcu__attend5_launch(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    switch (p.G) {
    case 1:
        return launch_v5<1>(p, pl, nseq, stream);
    case 2:
        return launch_v5<2>(p, pl, nseq, stream);
    case 4:
        return launch_v5<4>(p, pl, nseq, stream);
    default:
        return launch_v5<8>(p, pl, nseq, stream);
    }
}
