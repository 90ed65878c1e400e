/* Fused decode attention, version 7: v5's single pass (thread t decodes the key and the value stream
 * of token t, a tile finished head by head), with the key scores on tensor cores too. The default
 * (dqcu_settings.attend_kernel 0 or 7); shares v5's phases (query rotation, softmax, value
 * contraction, partial write: attend_internal.cuh).
 *
 * Why (ncu of v5 at (1, 128K), tests/bench/GPU_NOTES.md run 13): the kernel issues 2.5 instructions
 * per cycle per SM of the 4 possible, i.e. it is bound by its instruction count: 27 warp-instructions
 * per symbol, 23 of them in the decode loop, where a key symbol costs its rANS step plus 4 FMAs into
 * the G = 4 dot products, a float conversion and its share of 4 float4 query loads, and each stream's
 * byte reader spends ~17 instructions per group of 4 symbols. Here:
 *   - the decode loop only stores levels: a value level byte straight from the table entry (the
 *     entry is re-packed so the level is its low byte), four key level bytes packed into one word
 *     of a token-major buffer (the layout the key MMA reads);
 *   - after the head's decode, the four warps compute the 128 × G scores with mma.m16n8k16: A = the
 *     key levels m - c (exact in fp16), B = the rotated queries scaled by a power of two per head
 *     and split into fp16 hi + lo (as att_softmax does with the weights), so ~22 significant bits;
 *   - the byte reader is shorter: idx ∈ [0, 8) at a refill, so the advance is idx & 4 and the new
 *     idx is idx & 3; the tail word replaces every word past the last whole one (valid streams
 *     never read past their end; on a corrupt container the bytes past the end differ from lib's
 *     zeros, so the result is garbage either way, and it stays finite: levels come from the table);
 *   - the renormalization is one predicated PRMT and one predicated add.
 * Shared memory holds only what a tile needs: the key level buffer (token-major, d/4 + 1 words per
 * token so the decode's column stores and the MMA's fragment loads are both conflict-free; the
 * weights' B fragments reuse it once the scores are done), the value level buffer, the logits and
 * per-token scales. The queries' B fragments are prepared once per call (attend7_prep_kernel) and
 * read from L2 by the key MMA; the accumulator lives in the block's partial-result rows in global
 * memory (read and written once per head and tile by the value MMA). So ~40 KB per block at the
 * Qwen3-8B shape and 96 registers: 5 blocks (20 warps) per SM instead of v5's 3 (12 warps), more
 * independent rANS chains to hide the table-lookup and byte-load latencies that bound v5.
 *
 * The key MMA's K index (channels) is permuted: in k-step ks, thread (group r, quad c) holds
 * channels 4w .. 4w + 3, w = (d/16)·c + ks, in its a0/a2 (b0/b1) slots, so one 32-bit load of the
 * token-major buffer gives them, and the 32 lanes' words fall in 32 banks. The queries' fragments
 * use the same permutation, so the dot product is unchanged. */

#include "attend_internal.cuh"

__host__ __device__ inline size_t a7_align(size_t b)
{
    return (b + 15) & ~(size_t)15;
}

/* dynamic shared memory, in layout order (the decode tables are static) */
struct a7_layout {
    size_t lg, small, tok, lv, klv, total;
};
__host__ __device__ inline a7_layout a7_plan(uint32_t QH, uint32_t d, uint32_t G)
{
    const size_t NT = att_ntiles(G);
    a7_layout L;
    size_t b = 0;
    L.lg = b;
    b = a7_align(b + (size_t)G * ATT_T * sizeof(float)); /* logits of one KV head's query heads */
    L.small = b;
    b = a7_align(b + 7 * (size_t)QH * sizeof(float)); /* qsum, m, l, off, alpha, weight scale, query scale */
    L.tok = b;
    b = a7_align(b + 4 * ATT_T * sizeof(float)); /* key scale, key mid, value scale, value mid */
    L.lv = b;
    b = a7_align(b + (size_t)d * ATT_VSTR); /* value levels of one head, channel-major */
    L.klv = b;
    const size_t kb = (size_t)ATT_T * (d / 4 + 1) * sizeof(uint32_t), wb = (ATT_T / 16) * NT * 32 * sizeof(uint2);
    b = a7_align(b + (kb > wb ? kb : wb)); /* key levels, token-major; then the weights */
    L.total = b;
    return L;
}
static size_t a7_smem_bytes(uint32_t QH, uint32_t d, uint32_t G)
{
    return a7_plan(QH, d, G).total;
}

/* The byte reader: window (lo, hi) = words m, m + 1, n1 = word m + 2 (fixed up), n2 = the raw load
 * of word min(k, last), k = m + 3. */
struct a7_in {
    const uint32_t *w;
    uint32_t last, tailw, k, idx;
    uint32_t lo, hi, n1, n2;
};

__device__ __forceinline__ uint32_t a7_open(a7_in &in, const uint8_t *container, uint32_t C)
{
    dqcu_rans_in r;
    const uint32_t x = dqcu_rans_open(r, container, C);
    in.w = r.w;
    in.last = r.last;
    in.tailw = r.tailw;
    in.idx = r.idx;
    in.lo = r.lo;
    in.hi = r.hi;
    in.n1 = r.nxt;
    in.k = 3;
    in.n2 = __ldg(in.w + min(3u, in.last));
    return x;
}

/* Before each group of 4 symbols (idx < 8 here, < 4 after) */
__device__ __forceinline__ void a7_refill(a7_in &in)
{
    const bool adv = (in.idx & 4u) != 0;
    const uint32_t fixed = in.k <= in.last ? in.n2 : in.tailw;
    in.lo = adv ? in.hi : in.lo;
    in.hi = adv ? in.n1 : in.hi;
    in.n1 = adv ? fixed : in.n1;
    in.k += in.idx >> 2;
    const uint32_t *a = in.w + min(in.k, in.last);
    /* a miss brings the whole 128-byte line into L2: the stream reads on through it */
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p ld.global.nc.L2::128B.u32 %0, [%1];\n\t}"
        : "+r"(in.n2)
        : "l"(a), "r"((uint32_t)adv));
    in.idx &= 3u;
}

/* One renormalization read: x = xn, or (xn << 8) | the window's byte idx (idx + 1) if xn < L. */
__device__ __forceinline__ uint32_t a7_renorm(uint32_t xn, a7_in &in)
{
    const uint32_t bw = dqcu_prmt(in.lo, in.hi, in.idx);
    uint32_t x;
    asm("{\n\t.reg .pred p;\n\tsetp.lt.u32 p, %2, %4;\n\tmov.b32 %0, %2;\n\t@p prmt.b32 %0, %2, %3, 0x2104;\n\t"
        "@p add.u32 %1, %1, 1;\n\t}"
        : "=r"(x), "+r"(in.idx)
        : "r"(xn), "r"(bw), "n"(DQCU_RANS_L));
    return x;
}

/* One decode step with the v7 entry e = 2m | (z - c) << 8 | f << 16 of z = x & 255. */
__device__ __forceinline__ uint32_t a7_step(uint32_t &x, const uint32_t *tab, a7_in &in)
{
    const uint32_t e = tab[x & 0xffu];
    x = a7_renorm((e >> 16) * (x >> 8) + dqcu_prmt(e, 0u, 0x4441u), in);
    return e;
}

/* One pair step of format version 2 (rans2_cuda.cuh dqcu_rans2_step) with the attention entry
 * e = (z - c) | f << 12 | (2m1 | 2m2 << 4) << 24 of z = x & 4095 (dqcu_rans2_kind::att): at most
 * two bytes, so a group of two pairs reads at most 4, as a group of 4 version-1 symbols. */
__device__ __forceinline__ uint32_t a7p_step(uint32_t &x, const uint32_t *tab, a7_in &in)
{
    const uint32_t e = tab[x & (DQCU_RANS2_TOTAL - 1u)];
    x = a7_renorm(a7_renorm(((e >> 12) & 0xfffu) * (x >> 12) + (e & 0xfffu), in), in);
    return e;
}

/* The level bytes 2m of channels 4w .. 4w + 3 from their two pair entries (a7p_step): the pairs'
 * nibbles, low ones to bytes 0 and 2, high ones to 1 and 3. */
__device__ __forceinline__ uint32_t a7p_quad(uint32_t e0, uint32_t e1)
{
    const uint32_t pr = dqcu_prmt(e0, e1, 0x0073u); /* e0's top byte, e1's top byte */
    return dqcu_prmt(pr & 0x0f0fu, (pr >> 4) & 0x0f0fu, 0x5140u);
}

/* Bytes of one sequence's prepared query (attend7_prep_kernel): the B fragments, then qsum and
 * the per-head scale 2^e, 16-byte aligned. */
__host__ __device__ inline size_t a7_prep_bytes(uint32_t QH, uint32_t d, uint32_t G)
{
    return a7_align((size_t)(QH / G) * att_ntiles(G) * (d / 16) * 32 * sizeof(uint2) + 2 * (size_t)QH * sizeof(float));
}

/* One block per sequence: its queries rotated, each head scaled by 2^-e (the largest |q'| of the
 * head in [0.5, 1)) and split into fp16 hi + lo B fragments (column 2(g % 4) hi, the next one lo,
 * of n-tile g / 4; columns of groups smaller than 4 zero), plus Σ_j q'_j and 2^e per head. Done
 * once per call instead of once per block of attend7_kernel. */
template <int G>
__global__ void __launch_bounds__(ATT_THREADS) attend7_prep_kernel(att_params p)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, d = tb.d, KVH = tb.kv_heads, KS = d / 16;
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, nwarps = ATT_THREADS / 32;
    const size_t b = blockIdx.x;
    unsigned char *dst = (unsigned char *)p.qprep + b * a7_prep_bytes(QH, d, G);
    uint2 *qf = (uint2 *)(void *)dst;
    float *qsum = (float *)(void *)(dst + (size_t)KVH * NT * KS * 32 * sizeof(uint2)), *qex = qsum + QH;
    if (G < 4) {
        for (uint32_t i = tid; i < KVH * NT * KS * 32; i += ATT_THREADS)
            qf[i] = make_uint2(0u, 0u);
        __syncthreads();
    }
    const float *qb = p.q + b * (size_t)QH * d;
    for (uint32_t h = warp; h < QH; h += nwarps) {
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
        __half *fh = (__half *)(void *)(qf + ((size_t)kvh * NT + g / 4u) * KS * 32);
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
                fh[at + 16] = lo; /* column col + 1: lane + 4 */
            }
        }
        if (lane == 0) {
            qsum[h] = s;
            qex[h] = __int_as_float((127 + ex) << 23);
        }
    }
}

/* The blocks per SM attend7_kernel is compiled for: version 2's 2 × 16 KB decode tables leave
 * room for 3 (run 143). */
constexpr int a7_min_blocks(int G, bool pairs)
{
    return pairs ? 3 : G >= 8 ? 4 : 5;
}

/* PAIRS: format version 2 (p.tab2) */
template <int G, bool PAIRS>
__global__ void __launch_bounds__(ATT_THREADS, a7_min_blocks(G, PAIRS)) attend7_kernel(att_params p)
{
    constexpr uint32_t NT = (2 * G + 7) / 8;
    constexpr uint32_t NTAB = PAIRS ? DQCU_RANS2_TOTAL : 256u;
    __shared__ uint32_t dtk[NTAB], dtv[NTAB];
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const uint32_t QH = p.QH, d = tb.d, n = tb.n, W = tb.W, KVH = tb.kv_heads;
    const uint32_t KS = d / 16, KW = d / 4 + 1;
    const a7_layout L = a7_plan(QH, d, G);
    float *lg = (float *)(void *)(smem + L.lg); /* [G][ATT_T] */
    float *qsum = (float *)(void *)(smem + L.small);
    float *m_run = qsum + QH, *l_run = m_run + QH, *off_run = l_run + QH;
    float *alpha_s = off_run + QH, *wsc = alpha_s + QH, *qex = wsc + QH;
    float *sk = (float *)(void *)(smem + L.tok), *midk = sk + ATT_T, *sv = midk + ATT_T, *midv = sv + ATT_T;
    uint8_t *lv = smem + L.lv;                          /* [d][ATT_VSTR] */
    uint32_t *klv = (uint32_t *)(void *)(smem + L.klv); /* [ATT_T][KW] */
    uint2 *wfr = (uint2 *)(void *)(smem + L.klv);       /* [ATT_T / 16][NT][32], after the scores */

    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const uint32_t nwarps = ATT_THREADS / 32, r = lane >> 2, c = lane & 3u;
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
    if (PAIRS) {
        for (uint32_t i = tid; i < NTAB; i += ATT_THREADS) {
            dtk[i] = p.tab2->kind[0].att[i];
            dtv[i] = p.tab2->kind[1].att[i];
        }
    } else {
        /* entries re-packed: level byte 2m first, then z - c, then f */
        for (uint32_t i = tid; i < NTAB; i += ATT_THREADS) {
            dtk[i] = dqcu_prmt(kk.dec[i], 0u, 0x4102u);
            dtv[i] = dqcu_prmt(kv_.dec[i], 0u, 0x4102u);
        }
    }
    const float ck = 0.5f * (float)(kk.M - 1), cv = 0.5f * (float)(kv_.M - 1);
    const uint32_t CK = kk.C, CV = kv_.C;
    const size_t rk = 4u + CK, rv = 4u + CV;

    /* the queries' B fragments (read from the prepared copy, L2-resident: shared by the sequence's
     * blocks), sums and scales (attend7_prep_kernel); the accumulator is this block's part itself */
    const unsigned char *prep = (const unsigned char *)p.qprep + b * a7_prep_bytes(QH, d, G);
    const uint2 *qf = (const uint2 *)(const void *)prep; /* [KVH][NT][KS][32 lanes] */
    const uint32_t accs = d + 2;
    float *acc = part;
    {
        const float *ps = (const float *)(const void *)(prep + (size_t)KVH * NT * KS * 32 * sizeof(uint2));
        for (uint32_t h = tid; h < QH; h += ATT_THREADS) {
            qsum[h] = ps[h];
            qex[h] = ps[QH + h];
            m_run[h] = -INFINITY;
            l_run[h] = 0.0f;
            off_run[h] = 0.0f;
        }
        for (uint32_t i = tid; i < QH * d; i += ATT_THREADS)
            acc[(size_t)(i / d) * accs + i % d] = 0.0f;
    }
    __syncthreads();

    const __half2 c2kh = __floats2half2_rn(512.0f + ck, 512.0f + ck);
    const __half2 c2vh = __floats2half2_rn(512.0f + cv, 512.0f + cv);
    const uint32_t c2k = *(const uint32_t *)(const void *)&c2kh, c2v = *(const uint32_t *)(const void *)&c2vh;
    const uint32_t t = tid;
    for (uint32_t tile = tile0; tile < tile1; tile++) {
        const uint32_t tbase = (tile % p.tpw) * ATT_T, cnt = min((uint32_t)ATT_T, W - tbase);
        const uint8_t *win = sq.windows[tile / p.tpw];
        const float sfm = dqcu_f16_le(win);
        /* open both streams of token t; sk/midk/sv/midv of the previous tile were last read before
         * its final barrier B, which every thread has passed */
        a7_in kin, vin;
        uint32_t xk = 0, xv = 0;
        if (t < cnt) {
            const uint8_t *rec = dqcu_krec(win, n, rk, tbase + t);
            const float s = dqcu_f16_le(rec);
            const float o = dqcu_f16_le(rec + 2);
            sk[t] = s;
            midk[t] = __fmaf_rn(s, ck, o);
            xk = a7_open(kin, rec + 4, CK);
            const uint8_t *vrec = dqcu_vrec(win, n, W, rk, rv, tbase + t);
            const float s2 = dqcu_f16_le(vrec);
            const float o2 = dqcu_f16_le(vrec + 2);
            sv[t] = s2;
            midv[t] = __fmaf_rn(s2, cv, o2);
            xv = a7_open(vin, vrec + 4, CV);
        }
        for (uint32_t kvh = 0; kvh < KVH; kvh++) {
            /* ---- key and value streams of token t, head kvh, interleaved: levels only ---- */
            if (t < cnt) {
                /* tokens >= cnt keep stale (finite) levels: their weights are 0 */
                uint8_t *vdst = lv + t;
                uint32_t *kdst = klv + (size_t)t * KW;
                for (uint32_t j4 = 0; j4 < d / 4; j4++) {
                    a7_refill(kin);
                    a7_refill(vin);
                    if (PAIRS) {
                        const uint32_t ek0 = a7p_step(xk, dtk, kin), ev0 = a7p_step(xv, dtv, vin);
                        const uint32_t ek1 = a7p_step(xk, dtk, kin), ev1 = a7p_step(xv, dtv, vin);
                        kdst[j4] = a7p_quad(ek0, ek1);
                        const uint32_t vq = a7p_quad(ev0, ev1);
#pragma unroll
                        for (int u = 0; u < 4; u++)
                            vdst[(size_t)u * ATT_VSTR] = (uint8_t)(vq >> (8 * u));
                    } else {
                        uint32_t ek[4];
#pragma unroll
                        for (int u = 0; u < 4; u++) {
                            ek[u] = a7_step(xk, dtk, kin);
                            vdst[(size_t)u * ATT_VSTR] = (uint8_t)a7_step(xv, dtv, vin);
                        }
                        kdst[j4] = dqcu_prmt(dqcu_prmt(ek[0], ek[1], 0x0040u), dqcu_prmt(ek[2], ek[3], 0x0040u),
                                             0x5410u);
                    }
                    vdst += 4 * ATT_VSTR;
                }
            }
            __syncthreads(); /* A: key and value levels of head kvh are in place */

            /* ---- scores of the group's query heads on tensor cores, two row tiles per warp ---- */
            for (uint32_t mt = warp; mt < ATT_T / 16; mt += nwarps) {
                const uint32_t t0 = 16u * mt + r, t1 = t0 + 8u;
                const uint32_t *k0 = klv + (size_t)t0 * KW + KS * c, *k1 = klv + (size_t)t1 * KW + KS * c;
#pragma unroll
                for (uint32_t nt = 0; nt < NT; nt++) {
                    float dc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    const uint2 *bf = qf + ((size_t)kvh * NT + nt) * KS * 32 + lane;
                    for (uint32_t ks = 0; ks < KS; ks++) {
                        const uint32_t w0 = k0[ks], w1 = k1[ks];
                        att_mma(dc, att_lv2(w0, 0x4140u, c2k), att_lv2(w1, 0x4140u, c2k), att_lv2(w0, 0x4342u, c2k),
                                att_lv2(w1, 0x4342u, c2k), __ldg(bf + (size_t)ks * 32));
                    }
                    /* columns 2c, 2c + 1 = query head g = 4nt + c, hi and lo */
                    const uint32_t g = 4u * nt + c;
                    if (g < (uint32_t)G) {
                        const uint32_t h = kvh * G + g;
                        const float xs = qex[h], qs = qsum[h];
                        lg[(size_t)g * ATT_T + t0] = p.scale * __fmaf_rn(sk[t0], (dc[0] + dc[1]) * xs, midk[t0] * qs);
                        lg[(size_t)g * ATT_T + t1] = p.scale * __fmaf_rn(sk[t1], (dc[2] + dc[3]) * xs, midk[t1] * qs);
                    }
                }
            }
            __syncthreads(); /* A': logits in place, the key level buffer free for the weights */

            /* ---- softmax of the group's query heads over this tile, one warp per head ---- */
            for (uint32_t g = warp; g < (uint32_t)G; g += nwarps) {
                const uint32_t h = kvh * G + g;
                /* Σ_j q'_j μ_j, μ = the window's dequantized key mean, from the hi and lo fragments:
                 * lane (ks/8.., c) sums channels 4w .. 4w + 3 of both columns */
                const __half *fh = (const __half *)(const void *)(qf + ((size_t)kvh * NT + g / 4u) * KS * 32);
                const uint32_t col = 2u * (g & 3u);
                const uint8_t *mu = win + 2u + kvh * d;
                float qm = 0;
                for (uint32_t ks = lane >> 2; ks < KS; ks += 8) {
                    const uint32_t w = KS * c + ks;
                    const size_t at = ((size_t)ks * 32 + 4u * col + c) * 4;
#pragma unroll
                    for (uint32_t i = 0; i < 4; i++) {
                        const float q = __half2float(__ldg(fh + at + i)) + __half2float(__ldg(fh + at + 16 + i));
                        qm = __fmaf_rn(q, (float)(int8_t)mu[4u * w + i], qm);
                    }
                }
                qm = dqcu_warp_sum(qm) * qex[h];
                const float sh = p.scale * (qm * sfm);
                att_softmax<NT>(lg + (size_t)g * ATT_T, sh, cnt, h, g, m_run, l_run, off_run, alpha_s, wsc, sv, midv,
                                wfr, lane);
            }
            __syncthreads(); /* B: weights, alpha and scale of the group are in place */

            /* ---- value contraction of head kvh on tensor cores ---- */
            att_value_mma<G>(lv, wfr, kvh, d, acc, accs, alpha_s, wsc, c2v, warp, lane);
            __syncthreads(); /* C: the level buffers and the weights are free for the next head */
        }
    }

    att_finish(acc, accs, off_run, m_run, l_run, part, tb, QH, G, warp, lane);
}

bool dqcu__attend7_fit(const dqcu_codec *dc, uint32_t QH, att_fit *f)
{
    /* one query per kernel for the process (one sm_90 binary serves every device) */
    static const std::array<att_attr, 4> attrs = {
        att_query_attr(attend7_kernel<1, false>), att_query_attr(attend7_kernel<2, false>),
        att_query_attr(attend7_kernel<4, false>), att_query_attr(attend7_kernel<8, false>)};
    static const std::array<att_attr, 4> attrs2 = {
        att_query_attr(attend7_kernel<1, true>), att_query_attr(attend7_kernel<2, true>),
        att_query_attr(attend7_kernel<4, true>), att_query_attr(attend7_kernel<8, true>)};
    const uint32_t G = QH / dc->kv_heads;
    if (!att_mma_shape_ok(G, dc->d))
        return false;
    if (dc->pairs && (dc->host.kind[0].M > DQCU_RANS2_ATT_MAX_LEVELS || dc->host.kind[1].M > DQCU_RANS2_ATT_MAX_LEVELS))
        return false;
    f->smem = a7_smem_bytes(QH, dc->d, G);
    f->per_sm = dqcu__attend_blocks_per_sm(dc, (dc->pairs ? attrs2 : attrs)[att_group_index(G)], f->smem);
    f->prep_bytes = a7_prep_bytes(QH, dc->d, G);
    return f->per_sm >= 1;
}

template <int G, bool PAIRS>
static int launch_v7(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    attend7_prep_kernel<G><<<nseq, ATT_THREADS, 0, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    int rc = att_allow_smem<attend7_kernel<G, PAIRS>>();
    if (rc)
        return rc;
    dim3 grid(nseq, pl.nsplit);
    attend7_kernel<G, PAIRS><<<grid, ATT_THREADS, pl.smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <bool PAIRS>
static int launch_v7_group(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    switch (p.G) {
    case 1:
        return launch_v7<1, PAIRS>(p, pl, nseq, stream);
    case 2:
        return launch_v7<2, PAIRS>(p, pl, nseq, stream);
    case 4:
        return launch_v7<4, PAIRS>(p, pl, nseq, stream);
    default:
        return launch_v7<8, PAIRS>(p, pl, nseq, stream);
    }
}

int dqcu__attend7_launch(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    return p.tab2 ? launch_v7_group<true>(p, pl, nseq, stream) : launch_v7_group<false>(p, pl, nseq, stream);
}
