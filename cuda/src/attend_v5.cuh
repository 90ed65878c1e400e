/* Fused decode attention, version 5: each thread decodes the key AND the value stream of its token,
 * interleaved, and a tile is finished head by head in one pass. Included by attend_cuda.cu after
 * attend_v4.cuh (shares att_params, the v4 reader, the MMA helpers and the merge).
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
 * The reader: the decode tables live in static shared memory (the lookup's address is
 * (x & 255) · 4 plus an immediate, one add fewer per symbol than a table pointer), and the
 * refill is v4's deferred queue written without a branch (predicated load, selects), so the two
 * chains' refills can be scheduled into each other. */

#define A5_THREADS 128
#define A5_T 128 /* tokens per tile, = threads; the MMA's K */
static_assert(A5_T == A4_T, "a4_softmax works on v4's tiles");

static inline bool a5_shape_ok(uint32_t G, uint32_t d) { return a4_shape_ok(G, d); }

/* dynamic shared memory (the decode tables are static: A5_STATIC more) */
#define A5_STATIC (2 * 256 * sizeof(uint32_t))
static size_t a5_smem_bytes(uint32_t QH, uint32_t d, uint32_t G)
{
    size_t b = 0;
    b += 2 * (size_t)QH * d * sizeof(float);               /* rotated queries, accumulator */
    b += (size_t)G * A5_T * sizeof(float);                 /* logits of one KV head's query heads */
    b += (size_t)(A5_T / 16) * a4_ntiles(G) * 32 * 8;      /* their weights as B fragments */
    b += 6 * (size_t)QH * sizeof(float);                   /* qsum, m, l, off, alpha, weight scale */
    b += 2 * A5_T * sizeof(float);                         /* value scale, value mid */
    b += (size_t)d * A4_VSTR;                              /* value levels of one head */
    return (b + 15) & ~(size_t)15;
}

/* v4's refill without a branch: the window shifts by a word where idx >= 4; the raw word loaded at
 * the previous advance is fixed up into n1; the next raw word is loaded under a predicate. */
__device__ __forceinline__ void a5_rans_refill(a4_rans_in &in)
{
    const bool adv = in.idx >= 4u;
    const uint32_t k = in.m + 3u;
    const uint32_t past = k == in.last + 1u ? in.tailw : 0u;
    const uint32_t fixed = k <= in.last ? in.n2 : past;
    in.lo = adv ? in.hi : in.lo;
    in.hi = adv ? in.n1 : in.hi;
    in.n1 = adv ? fixed : in.n1;
    const uint32_t *a = in.w + min(in.m + 4u, in.last);
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p ld.global.nc.u32 %0, [%1];\n\t}"
        : "+r"(in.n2)
        : "l"(a), "r"((uint32_t)adv));
    in.m += adv ? 1u : 0u;
    in.idx -= adv ? 4u : 0u;
}

/* ---- phases shared by v5/v6 and v7 ---- */

/* Head h of the block's query, rotated for the containers (signs, butterfly, scale): lane l holds
 * channels l, l + 32, ... in y (zero past d). */
__device__ __forceinline__ void a5_rotate_query(const float *qh, const float *signs, float rot_scale, uint32_t d,
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

/* Value contraction of KV head kvh on tensor cores (as v4): lv = its levels, channel-major
 * (A4_VSTR bytes per channel), wfr = the weights; acc (a row of accs floats per query head) of the
 * group's query heads rescaled by alpha_s and increased by the contraction times wsc. c2 = (512 + c)
 * in both fp16 halves. */
template <int G>
__device__ __forceinline__ void a5_value_mma(const uint8_t *lv, const uint2 *wfr, uint32_t kvh, uint32_t d, float *acc,
                                             uint32_t accs, const float *alpha_s, const float *wsc, uint32_t c2,
                                             uint32_t warp, uint32_t lane)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t KS = A5_T / 16;
    const uint32_t nwarps = A5_THREADS / 32, r = lane >> 2, c = lane & 3u;
    for (uint32_t mt = warp; mt < d / 16; mt += nwarps) {
        const uint8_t *r0 = lv + (size_t)(16u * mt + r) * A4_VSTR + 4u * c;
#pragma unroll
        for (uint32_t nt = 0; nt < NT; nt++) {
            float dc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const uint2 *bf = wfr + (size_t)nt * 32 + lane;
#pragma unroll
            for (uint32_t ks = 0; ks < KS; ks++) {
                const uint32_t w0 = *(const uint32_t *)(const void *)(r0 + 16u * ks);
                const uint32_t w1 = *(const uint32_t *)(const void *)(r0 + 8u * A4_VSTR + 16u * ks);
                a4_mma(dc, a4_lv2(w0, 0x4140u, c2), a4_lv2(w1, 0x4140u, c2), a4_lv2(w0, 0x4342u, c2),
                       a4_lv2(w1, 0x4342u, c2), bf[(size_t)ks * NT * 32]);
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
__device__ __forceinline__ void a5_finish(const float *acc, uint32_t accs, const float *off_run, const float *m_run,
                                          const float *l_run, float *part, const dqcu_tables &tb, uint32_t QH,
                                          uint32_t G, uint32_t warp, uint32_t lane)
{
    const uint32_t d = tb.d, nwarps = A5_THREADS / 32;
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
__device__ __forceinline__ void a5_empty(float *part, uint32_t QH, uint32_t d, uint32_t tid)
{
    for (uint32_t h = tid; h < QH; h += A5_THREADS) {
        part[(size_t)h * (d + 2) + d] = -INFINITY;
        part[(size_t)h * (d + 2) + d + 1] = 0.0f;
    }
}

#include "attend_v6.cuh"

/* PF = false: v5; PF = true: v6 (the container words staged through per-thread shared-memory rings
 * by cp.async, attend_v6.cuh); everything else is the same code. */
template <int G, bool PF>
__global__ void __launch_bounds__(A5_THREADS, 3) attend5_kernel(att_params p)
{
    using rans_in = typename std::conditional<PF, a6_rans_in, a4_rans_in>::type;
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t KS = A5_T / 16;
    __shared__ uint32_t dtk[256], dtv[256];
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, d = tb.d, n = tb.n, W = tb.W, KVH = tb.kv_heads;
    float *qr = (float *)(void *)smem;
    float *acc = qr + (size_t)QH * d;
    float *lg = acc + (size_t)QH * d;                        /* [G][A5_T] */
    uint2 *wfr = (uint2 *)(void *)(lg + (size_t)G * A5_T);   /* [KS][NT][32 lanes] */
    float *qsum = (float *)(void *)(wfr + (size_t)KS * NT * 32);
    float *m_run = qsum + QH, *l_run = m_run + QH, *off_run = l_run + QH;
    float *alpha_s = off_run + QH, *wsc = alpha_s + QH;
    float *sv = wsc + QH, *midv = sv + A5_T;
    uint8_t *lv = (uint8_t *)(void *)(midv + A5_T);          /* [d][A4_VSTR] */
    /* v6 only: rings [A6_R][A5_T] words, keys then values (a6_smem_bytes) */
    uint32_t *ring = (uint32_t *)(void *)(lv + (size_t)d * A4_VSTR);

    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const uint32_t nwarps = A5_THREADS / 32;
    const size_t b = blockIdx.x;
    const uint32_t split = blockIdx.y;
    const dqcu_attn_seq sq = p.seqs[b];
    const uint32_t ntiles = sq.nwin * p.tpw;
    const uint32_t tile0 = split * p.chunk, tile1 = min(ntiles, tile0 + p.chunk);
    float *part = p.part + (((size_t)b * (p.nsplit + 1) + split) * QH) * (d + 2);
    if (tile0 >= tile1) {
        a5_empty(part, QH, d, tid);
        return;
    }

    const dqcu_kind_tab &kk = tb.kind[0], &kv_ = tb.kind[1];
    for (uint32_t i = tid; i < 256; i += A5_THREADS) {
        dtk[i] = kk.dec[i];
        dtv[i] = kv_.dec[i];
    }
    /* columns of groups smaller than 4 are never written: keep them zero */
    for (uint32_t i = tid; i < KS * NT * 32; i += A5_THREADS)
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
        a5_rotate_query(qb + (size_t)h * d, tb.signs + (h / G) * d, rot_scale, d, lane, y);
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
        const uint32_t tbase = (tile % p.tpw) * A5_T, cnt = min((uint32_t)A5_T, W - tbase);
        const uint8_t *win = sq.windows[tile / p.tpw];
        const float sfm = dqcu_f16_le(win);
        /* open both streams of token t; sv/midv of the previous tile were last read before its
         * final barrier B, which every thread has passed */
        float s = 0.0f, mid = 0.0f;
        rans_in kin, vin;
        uint32_t xk = 0, xv = 0;
        if (PF) /* no cp.async of the previous tile may land after this tile's prime */
            a6_wait_all();
        if (t < cnt) {
            const uint8_t *rec = dqcu_krec(win, n, rk, tbase + t);
            s = dqcu_f16_le(rec);
            const float o = dqcu_f16_le(rec + 2);
            mid = __fmaf_rn(s, ck, o);
            if constexpr (PF)
                xk = a6_rans_open(kin, rec + 4, CK, (uint32_t)__cvta_generic_to_shared(ring + t));
            else
                xk = a4_rans_open(kin, rec + 4, CK);
            const uint8_t *vrec = dqcu_vrec(win, n, W, rk, rv, tbase + t);
            const float s2 = dqcu_f16_le(vrec);
            const float o2 = dqcu_f16_le(vrec + 2);
            sv[t] = s2;
            midv[t] = __fmaf_rn(s2, cv, o2);
            if constexpr (PF) {
                xv = a6_rans_open(vin, vrec + 4, CV, (uint32_t)__cvta_generic_to_shared(ring + A6_R * A5_T + t));
                a6_wait_all(); /* the primes have landed */
                a6_rans_open_ring(kin);
                a6_rans_open_ring(vin);
            } else {
                xv = a4_rans_open(vin, vrec + 4, CV);
            }
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
                    if constexpr (PF) {
                        a6_wait<A6_D>();
                        a6_rans_refill(kin);
                        a6_rans_refill(vin);
                        a6_rans_fetch(kin);
                        a6_rans_fetch(vin);
                        a6_commit();
                    } else {
                        a5_rans_refill(kin);
                        a5_rans_refill(vin);
                    }
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        const uint32_t e = a4_rans_step(xk, dtk, kin);
                        l[u] = __uint_as_float(dqcu_prmt(e, ATT_MAGIC, 0x7652u)) - ck22;
                        const uint32_t ev = a4_rans_step(xv, dtv, vin);
                        dst[(size_t)u * A4_VSTR] = (uint8_t)(ev >> 16);
                    }
                    dst += 4 * A4_VSTR;
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
                    lg[(size_t)g * A5_T + t] = p.scale * __fmaf_rn(s, dot[g], mid * qsum[kvh * G + (uint32_t)g]);
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
                a4_softmax<NT>(lg + (size_t)g * A5_T, sh, cnt, h, g, m_run, l_run, off_run, alpha_s, wsc, sv, midv, wfr,
                               lane);
            }
            __syncthreads(); /* B: weights, alpha and scale of the group are in place */

            /* ---- value contraction of head kvh on tensor cores (as v4) ---- */
            a5_value_mma<G>(lv, wfr, kvh, d, acc, d, alpha_s, wsc, c2, warp, lane);
            __syncthreads(); /* C: the value buffer and the weights are free for the next head */
        }
    }
    if (PF) /* nothing in flight into the rings when the block ends */
        a6_wait_all();

    /* ---- un-rotate (acc + Σ a·mid on every channel) and write this block's partial ---- */
    a5_finish(acc, d, off_run, m_run, l_run, part, tb, QH, G, warp, lane);
}
