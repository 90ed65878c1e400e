/* Fused decode attention, version 4: keys and values of a block's tiles decoded concurrently, the
 * value contraction on tensor cores. Included by attend_cuda.cu (shares att_params and the merge).
 *
 * Why: v3 decodes a tile's key streams and then its value streams with the same 128 threads, so a
 * tile costs two serial rANS passes of n symbols per thread, and its value contraction runs on CUDA
 * cores (~7 instructions per token and channel at G = 4). Here a block has 256 threads in two roles
 * and runs a two-stage pipeline over its tiles:
 *   warps 0-3 (thread t = token t): decode tile i's key streams, dot products on CUDA cores as v3
 *             (G FMAs per level), logits to shared memory;
 *   warps 4-7 (thread t = token t): decode tile i-1's value streams head by head into a
 *             channel-major byte buffer, then the four warps contract it with the tile's weights on
 *             tensor cores (mma.m16n8k16, f16 in, f32 accumulate) and add the result to the
 *             accumulator, rescaled by the online-softmax factor;
 *   all warps, after a barrier: softmax of tile i (one warp per query head), which also writes the
 *             weights as B fragments for the next stage.
 * A block of c tiles thus takes c + 1 stages of one rANS pass each instead of 2c passes.
 *
 * Exactness of the tensor-core path: levels m - c (M <= 32, c = (M-1)/2) are exact in fp16; each
 * weight a_t·s_t is scaled by a power of two per (tile, head) so the largest is in [0.5, 1), and
 * split into hi = fp16(w) and lo = fp16(w - hi) (~22 significant bits): the MMA's N = 8 columns are
 * (g hi, g lo) for four query heads g, summed afterwards in fp32. The levels come out of the byte
 * 2m with one PRMT into the fp16 pattern 0x60bb (= 512 + m) and one f16x2 subtraction of 512 + c.
 *
 * The MMA's K index (tokens) is permuted: thread (group r, quad c) of a k-step of 16 tokens holds
 * tokens 4c .. 4c+3 in its a0,a1 / a4,a5 (and b0,b1 / b2,b3) slots, so one 32-bit shared load
 * gives the four level bytes; A and B use the same permutation, so the sum is unchanged. */
#include <cuda_fp16.h>

#define A4_THREADS 256
#define A4_T 128              /* tokens per tile (the MMA's K: 8 k-steps of 16) */
#define A4_VSTR (A4_T + 16)   /* bytes per channel row: 36 words, so the 8 rows × 4 words of an A
                                 fragment load fall in 32 distinct banks */
#define A4_F16_512 0x60606060u /* fp16 high byte 0x60: 512 + (low byte)/2 */

__host__ __device__ inline uint32_t a4_ntiles(uint32_t G) { return (2 * G + 7) / 8; }

/* True when v4 takes this shape: GQA group 1, 2, 4 or 8, head_dim a multiple of 64 (the value
 * stage splits d/16 MMA row tiles over 4 warps) and at most 256. */
static inline bool a4_shape_ok(uint32_t G, uint32_t d)
{
    return (G == 1 || G == 2 || G == 4 || G == 8) && d % 64 == 0 && d <= 256;
}

static size_t a4_smem_bytes(uint32_t QH, uint32_t d, uint32_t KVH, uint32_t G)
{
    size_t b = 0;
    b += 2 * 256 * sizeof(uint32_t);                          /* decode tables K, V */
    b += 2 * (size_t)QH * d * sizeof(float);                  /* rotated queries, accumulator */
    b += (size_t)QH * A4_T * sizeof(float);                   /* logits */
    b += (size_t)KVH * (A4_T / 16) * a4_ntiles(G) * 32 * 8;   /* weights as B fragments */
    b += 6 * (size_t)QH * sizeof(float);                      /* qsum, m, l, off, alpha, weight scale */
    b += 2 * A4_T * sizeof(float);                            /* value scale, value mid */
    b += 2 * (size_t)d * A4_VSTR;                             /* value levels, two head buffers */
    return (b + 15) & ~(size_t)15;
}

__device__ __forceinline__ void a4_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint2 b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

/* Two level bytes (2m) of w, selected by sel, as fp16x2 (m - c); c2 = (512 + c) in both halves. */
__device__ __forceinline__ uint32_t a4_lv2(uint32_t w, uint32_t sel, uint32_t c2)
{
    const uint32_t h = dqcu_prmt(w, A4_F16_512, sel);
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(c2));
    return r;
}

/* The byte reader of rans_cuda.cuh with a deeper queue. There the word loaded at an advance is
 * selected into the window at once (the select waits for the load: an L2 round trip at every
 * advance, since the records of 256 streams per block do not stay in L1 next to ~200 KB of shared
 * memory). Here the raw load of word m + 3 (address clamped to the container, so it needs no
 * condition) is only fixed up (tail word, zeros past the end) and moved into the window at the
 * next advance, about 12 symbols later. Same bytes, same symbols. */
struct a4_rans_in {
    const uint32_t *w;
    uint32_t last, tailw, m, idx;
    uint32_t lo, hi, n1;  /* words m, m + 1, m + 2 */
    uint32_t n2;          /* raw load of word min(m + 3, last) */
};

__device__ __forceinline__ uint32_t a4_fix(const a4_rans_in &in, uint32_t v, uint32_t k)
{
    const uint32_t past = k == in.last + 1u ? in.tailw : 0u;
    return k <= in.last ? v : past;
}

__device__ __forceinline__ uint32_t a4_rans_open(a4_rans_in &in, const uint8_t *container, uint32_t C)
{
    dqcu_rans_in r;
    const uint32_t x = dqcu_rans_open(r, container, C);
    in.w = r.w;
    in.last = r.last;
    in.tailw = r.tailw;
    in.m = 0;
    in.idx = r.idx;
    in.lo = r.lo;
    in.hi = r.hi;
    in.n1 = r.nxt;
    in.n2 = __ldg(in.w + min(3u, in.last));
    return x;
}

__device__ __forceinline__ void a4_rans_refill(a4_rans_in &in)
{
    if (in.idx >= 4u) {
        in.lo = in.hi;
        in.hi = in.n1;
        in.n1 = a4_fix(in, in.n2, in.m + 3u);
        in.n2 = __ldg(in.w + min(in.m + 4u, in.last));
        in.m++;
        in.idx -= 4u;
    }
}

/* Online softmax of query head h (group column g) over one tile, one warp (v4, v5/v6 and v7):
 * row = its logits (A4_T), sh = the window's key-mean term (added to every logit), cnt = tokens in
 * the tile, sv/midv = the value streams' scale and mid level. Updates m/l/off of h, leaves the
 * rescale factor in alpha_s[h] and the weights a_t·s_t (scaled by a power of two, wsc[h] undoes
 * it) as fp16 hi/lo B fragments in wfr, its KV head's [k-step][n-tile][32 lanes] (column pair
 * 2(g % 4), n-tile g / 4). */
template <int NT>
__device__ __forceinline__ void a4_softmax(const float *row, float sh, uint32_t cnt, uint32_t h, uint32_t g,
                                           float *m_run, float *l_run, float *off_run, float *alpha_s, float *wsc,
                                           const float *sv, const float *midv, uint2 *wfr, uint32_t lane)
{
    float xs[A4_T / 32];
    float mb = -INFINITY;
#pragma unroll
    for (int k = 0; k < A4_T / 32; k++) {
        const uint32_t u = lane + 32u * k;
        xs[k] = u < cnt ? row[u] + sh : -INFINITY;
        mb = fmaxf(mb, xs[k]);
    }
    mb = dqcu_warp_max(mb);
    const float mold = m_run[h];
    const float mnew = fmaxf(mold, mb);
    const float alpha = mold == -INFINITY ? 0.0f : expf(mold - mnew);
    float ps = 0, os = 0, mw = 0;
    float wv[A4_T / 32];
#pragma unroll
    for (int k = 0; k < A4_T / 32; k++) {
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
    for (int k = 0; k < A4_T / 32; k++) {
        const uint32_t u = lane + 32u * k;
        const float w = wv[k] * inv;
        const __half hi = __float2half_rn(w);
        const __half lo = __float2half_rn(w - __half2float(hi));
        const size_t base = (size_t)(u >> 4) * NT * 32 * 4 + ((u >> 2) & 3u) * 4 + (u & 3u);
        fb[base + (size_t)col * 16] = hi;
        fb[base + (size_t)(col + 1) * 16] = lo;
    }
}

/* dqcu_rans_step on the deeper reader */
__device__ __forceinline__ uint32_t a4_rans_step(uint32_t &x, const uint32_t *tab, a4_rans_in &in)
{
    const uint32_t e = tab[x & 0xffu];
    const uint32_t f = dqcu_prmt(e, 0u, 0x4441u);
    const uint32_t xn = f * (x >> 8) + (e & 0xffu);
    const uint32_t bw = dqcu_prmt(in.lo, in.hi, in.idx);
    const uint32_t xs = dqcu_prmt(xn, bw, 0x2104u);
    const bool need = xn < DQCU_RANS_L;
    x = need ? xs : xn;
    in.idx += need ? 1u : 0u;
    return e;
}

__device__ __forceinline__ void a4_bar_values() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

template <int G>
__global__ void __launch_bounds__(A4_THREADS, 2) attend4_kernel(att_params p)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t KS = A4_T / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, d = tb.d, n = tb.n, W = tb.W, KVH = tb.kv_heads;
    uint32_t *dtk = (uint32_t *)(void *)smem;
    uint32_t *dtv = dtk + 256;
    float *qr = (float *)(void *)(dtv + 256);
    float *acc = qr + (size_t)QH * d;
    float *lg = acc + (size_t)QH * d;                              /* [QH][A4_T] */
    uint2 *wfr = (uint2 *)(void *)(lg + (size_t)QH * A4_T);        /* [KVH][KS][NT][32 lanes] */
    float *qsum = (float *)(void *)(wfr + (size_t)KVH * KS * NT * 32);
    float *m_run = qsum + QH, *l_run = m_run + QH, *off_run = l_run + QH;
    float *alpha_s = off_run + QH, *wsc = alpha_s + QH;
    float *sv = wsc + QH, *midv = sv + A4_T;
    uint8_t *lv = (uint8_t *)(void *)(midv + A4_T);                /* 2 × [d][A4_VSTR] */

    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const uint32_t nwarps = A4_THREADS / 32;
    const size_t b = blockIdx.x;
    const uint32_t split = blockIdx.y;
    const dqcu_attn_seq sq = p.seqs[b];
    const uint32_t ntiles = sq.nwin * p.tpw;
    const uint32_t tile0 = split * p.chunk, tile1 = min(ntiles, tile0 + p.chunk);
    float *part = p.part + (((size_t)b * (p.nsplit + 1) + split) * QH) * (d + 2);
    if (tile0 >= tile1) {
        for (uint32_t h = tid; h < QH; h += A4_THREADS) {
            part[(size_t)h * (d + 2) + d] = -INFINITY;
            part[(size_t)h * (d + 2) + d + 1] = 0.0f;
        }
        return;
    }

    const dqcu_kind_tab &kk = tb.kind[0], &kv_ = tb.kind[1];
    for (uint32_t i = tid; i < 256; i += A4_THREADS) {
        dtk[i] = kk.dec[i];
        dtv[i] = kv_.dec[i];
    }
    /* columns of groups smaller than 4 are never written: keep them zero */
    for (uint32_t i = tid; i < KVH * KS * NT * 32; i += A4_THREADS)
        wfr[i] = make_uint2(0u, 0u);
    const float ck = 0.5f * (float)(kk.M - 1), cv = 0.5f * (float)(kv_.M - 1);
    const float ck22 = 4194304.0f + ck;
    const uint32_t CK = kk.C, CV = kv_.C;
    const size_t rk = 4u + CK, rv = 4u + CV;
    const float rot_scale = tb.rot_scale;

    /* queries, rotated for the containers (per head: signs, butterfly, scale) */
    const float *qb = p.q + b * (size_t)QH * d;
    for (uint32_t h = warp; h < QH; h += nwarps) {
        const uint32_t kvh = h / G;
        float y[ATT_DVMAX];
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            y[r] = e < d ? qb[(size_t)h * d + e] * tb.signs[kvh * d + e] : 0.0f;
        }
        dqcu_fwht(y, d, lane);
        float s = 0;
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            if (e < d) {
                y[r] = y[r] * rot_scale;
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

    const uint32_t ntile = tile1 - tile0;
    for (uint32_t it = 0; it <= ntile; it++) {
        if (warp < 4) {
            /* ---- keys of tile it: one stream per thread, levels straight into the dots ---- */
            const uint32_t t = tid, tile = tile0 + it;
            const uint32_t tbase = (tile % p.tpw) * A4_T, cnt = min((uint32_t)A4_T, W - tbase);
            if (it < ntile && t < cnt) {
                const uint8_t *win = sq.windows[tile / p.tpw];
                const uint8_t *rec = dqcu_krec(win, n, rk, tbase + t);
                const float s = dqcu_f16_le(rec);
                const float o = dqcu_f16_le(rec + 2);
                const float mid = __fmaf_rn(s, ck, o);
                a4_rans_in in;
                uint32_t x = a4_rans_open(in, rec + 4, CK);
                const float4 *q4 = (const float4 *)(const void *)qr;
                const uint32_t d4 = d / 4;
                for (uint32_t kvh = 0; kvh < KVH; kvh++) {
                    float dot[G];
#pragma unroll
                    for (int g = 0; g < G; g++)
                        dot[g] = 0.0f;
                    const float4 *qh = q4 + (size_t)kvh * G * d4;
                    for (uint32_t j4 = 0; j4 < d4; j4++) {
                        float l[4];
                        a4_rans_refill(in);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const uint32_t e = a4_rans_step(x, dtk, in);
                            l[u] = __uint_as_float(dqcu_prmt(e, ATT_MAGIC, 0x7652u)) - ck22;
                        }
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
                    for (int g = 0; g < G; g++) {
                        const uint32_t h = kvh * G + (uint32_t)g;
                        lg[(size_t)h * A4_T + t] = p.scale * __fmaf_rn(s, dot[g], mid * qsum[h]);
                    }
                }
                const uint8_t *vrec = dqcu_vrec(win, n, W, rk, rv, tbase + t);
                const float s2 = dqcu_f16_le(vrec);
                const float o2 = dqcu_f16_le(vrec + 2);
                sv[t] = s2;
                midv[t] = __fmaf_rn(s2, cv, o2);
            }
        } else if (it > 0) {
            /* ---- values of tile it - 1: decode a head into shared memory, contract on tensor cores ---- */
            const uint32_t vt = tid - 128u, vw = warp - 4u, tile = tile0 + it - 1u;
            const uint32_t tbase = (tile % p.tpw) * A4_T, cnt = min((uint32_t)A4_T, W - tbase);
            const uint8_t *win = sq.windows[tile / p.tpw];
            a4_rans_in vin;
            uint32_t vx = 0;
            if (vt < cnt)
                vx = a4_rans_open(vin, dqcu_vrec(win, n, W, rk, rv, tbase + vt) + 4, CV);
            const __half2 c2h = __floats2half2_rn(512.0f + cv, 512.0f + cv);
            const uint32_t c2 = *(const uint32_t *)(const void *)&c2h;
            const uint32_t r = lane >> 2, c = lane & 3u;
            for (uint32_t kvh = 0; kvh < KVH; kvh++) {
                uint8_t *buf = lv + (size_t)(kvh & 1u) * d * A4_VSTR;
                if (vt < cnt) {
                    /* tokens >= cnt keep stale (finite) bytes: their weights are 0 */
                    uint8_t *dst = buf + vt;
                    for (uint32_t j = 0; j < d; j += 4) {
                        a4_rans_refill(vin);
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            const uint32_t e = a4_rans_step(vx, dtv, vin);
                            dst[(size_t)u * A4_VSTR] = (uint8_t)(e >> 16);
                        }
                        dst += 4 * A4_VSTR;
                    }
                }
                /* the other buffer (head kvh - 1) is free once every value warp passed this point */
                a4_bar_values();
                for (uint32_t mt = vw; mt < d / 16; mt += 4) {
                    const uint8_t *r0 = buf + (size_t)(16u * mt + r) * A4_VSTR + 4u * c;
#pragma unroll
                    for (uint32_t nt = 0; nt < NT; nt++) {
                        float dc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        const uint2 *bf = wfr + ((size_t)kvh * KS * NT + nt) * 32 + lane;
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
                            float *ah = acc + (size_t)h * d + ch;
                            ah[0] = __fmaf_rn(ah[0], al, (dc[0] + dc[1]) * sc);
                            ah[8] = __fmaf_rn(ah[8], al, (dc[2] + dc[3]) * sc);
                        }
                    }
                }
            }
        }
        __syncthreads();

        /* ---- softmax of tile it, one warp per query head; weights to B fragments ---- */
        if (it < ntile) {
            const uint32_t tile = tile0 + it;
            const uint32_t tbase = (tile % p.tpw) * A4_T, cnt = min((uint32_t)A4_T, W - tbase);
            const uint8_t *win = sq.windows[tile / p.tpw];
            const float sfm = dqcu_f16_le(win);
            for (uint32_t h = warp; h < QH; h += nwarps) {
                const uint32_t kvh = h / G, g = h - kvh * G;
                /* Σ_j q'_j μ_j, μ = the window's dequantized key mean */
                float qm = 0;
                for (uint32_t e = lane; e < d; e += 32)
                    qm = __fmaf_rn(qr[(size_t)h * d + e], (float)(int8_t)win[2u + kvh * d + e], qm);
                qm = dqcu_warp_sum(qm);
                const float sh = p.scale * (qm * sfm);
                a4_softmax<NT>(lg + (size_t)h * A4_T, sh, cnt, h, g, m_run, l_run, off_run, alpha_s, wsc, sv, midv,
                               wfr + (size_t)kvh * KS * NT * 32, lane);
            }
        }
        __syncthreads();
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
        dqcu_fwht(y, d, lane);
        float *ph = part + (size_t)h * (d + 2);
#pragma unroll
        for (int r = 0; r < ATT_DVMAX; r++) {
            const uint32_t e = (uint32_t)r * 32u + lane;
            if (e < d)
                ph[e] = y[r] * rot_scale * tb.signs[kvh * d + e];
        }
        if (lane == 0) {
            ph[d] = m_run[h];
            ph[d + 1] = l_run[h];
        }
    }
}
