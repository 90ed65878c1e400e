/* The GPU encoder kernel, bit-exact with lib/src/stream.c + drift.c + tokens.c (DESIGN §2.4, §5; seed §4.5).
 *
 * One warp per stream, the stream's values in registers (lane l holds values l, l + 32, ...):
 * min/max, drift (bisection of log2 λ with the cost of each λ counted by the warp, distortion
 * recomputed on the fly, no n×M matrix), least-squares refit with lib's canonical reduction order,
 * fp16 rounding, drift again on the fp16 grid. A warp takes a group of G streams in turn, leaving
 * each one's levels in shared memory; then G lanes run the (sequential) rANS encoder of the G
 * streams side by side, in place in the level rows. Overflows are redone by the same warp with the
 * tightened budget of stream.c, then the warp writes the records.
 *
 * Two versions of the drift's searches (dqcu_settings.encode_kernel; encode_v5.cu and encode_v4.cu
 * instantiate this template for one each):
 *   5 (default): version 4's sorted stream, and for alphabets M <= 8 (others run version 4's
 *     drift) lib's 12 bisection steps taken two at a time (three λ evaluated at once, eight lanes
 *     each, every count a per-lane search of the sorted stream, two bits per step, costs summed in
 *     uint32), min D by one per-lane search per level, the final assignment from registers (a
 *     binary search of the thresholds, the level picked from bytes by a PRMT; no cost pass:
 *     feasibility is known from the bisection), and drift 1's levels summed straight into the
 *     refit instead of being stored (drift5_warp);
 *   4: like lib, the warp sorts the stream once (bitonic network on order-preserving
 *     integer keys, in registers) into shared memory, and each count of values below a threshold
 *     is a two-level ballot over the sorted stream: O(M) per bisection step instead of O(n·M).
 *     Version 5 runs this drift for M > 8; version 4 runs it for every alphabet, so the comparison
 *     of the two checks and times that path on every profile.
 * (Version 3, removed, counted over all values in every step: GPU_NOTES.md.)
 * Both give lib's integers and floats because fl(x - o) and fl((x - lv)²) are monotone in x (see
 * the comments at each place).
 * Format version 2 (joint pairs, dqcu_codec.pairs) runs the same stream loop with drift.c's pair
 * drift (drift2_warp: the exact Lagrangian pair assignment of every pair per λ, lib's pruning and
 * order, in both versions), the cheapest pair for the fallback and the pair rANS (rans2_row). */
#ifndef DQCU_ENCODE_KERNEL_CUH
#define DQCU_ENCODE_KERNEL_CUH

#include <math.h>

#include <algorithm>

#include "encode_internal.cuh"
#include "rans2_cuda.cuh"

#define ENC_MAX_RETRIES 8 /* stream.c DQ_MAX_RETRIES */

/* Stream modes in a warp's group. */
#define MODE_FRESH 0 /* FitMinMax → Drift → Refit → fp16 → Drift */
#define MODE_RETRY 1 /* Drift again on the fp16 grid with the tightened budget */
#define MODE_CHEAP 2 /* the all-cheapest assignment */

/* The drift's exp2 table (see dqcu__upload_exp2), one copy per unit that includes this file. */
static __constant__ float dqcu_exp2[DQCU_EXP2_N];

/* The table to this unit's copy of dqcu_exp2. */
static int enc_upload_exp2(const float *tab)
{
    DQCU_CHECK(cudaMemcpyToSymbol(dqcu_exp2, tab, sizeof(float) * DQCU_EXP2_N));
    return DQ_OK;
}

/* Per-kind tables the encoder reads, copied to shared memory by each block. */
struct enc_tab {
    uint32_t M, C, cheapest, P, npairs;
    int64_t budget_q16;
    int32_t cost_q16[32];
    float cost[32];
    uint4 enc[32];
    uint8_t pair_a[DQCU_MAX_PAIRS];
    uint8_t pair_b[DQCU_MAX_PAIRS];
};

/* State of one stream of a warp's group (shared memory). */
struct enc_slot {
    int64_t budget;
    float sf, of;
    uint32_t sh, oh;
    uint32_t state, p, used;
    int32_t status; /* 0, a dq_error, or STATUS_SKIP */
    int32_t mode;   /* MODE_* */
    int32_t feasible, fallback, retries;
    uint32_t moved, max_move;
};

/* Per-warp scratch, followed by G enc_slots, G level rows and the sorted stream. */
struct enc_warp {
    float sp[DQCU_MAX_PAIRS]; /* swap points of the current λ, index b(b-1)/2 + a */
    float T[32];              /* thresholds 1..k at T[0..k-1], then +inf up to P-1 */
    int32_t CC[32];           /* cost_q16 of envelope level i */
    uint32_t LV[32];          /* envelope level i */
    uint32_t K;               /* thresholds in the envelope */
};

static_assert(sizeof(enc_slot) % 8 == 0, "enc_slot arrays keep their int64 aligned");

/* A warp's scratch: the slots, the level rows, enc_warp, then the sorted
 * stream, each 16-byte aligned. The sort of a VPL = 32 stream also runs its transposes over the
 * last ENC_SORT_EXTRA bytes of enc_warp (see sort_level_transposed): enc_warp is dead while a
 * stream is sorted, since every drift builds its envelope anew. */
#define ENC_WS_BYTES ((sizeof(enc_warp) + 15) & ~(size_t)15)
#define ENC_SORT_EXTRA 512u
static_assert(ENC_WS_BYTES >= ENC_SORT_EXTRA, "the sort's transposes need 512 bytes before the sorted stream");

__host__ __device__ static inline size_t enc_rows_off(uint32_t G)
{
    return ((size_t)G * sizeof(enc_slot) + 15) & ~(size_t)15;
}

__host__ __device__ static inline size_t enc_ws_off(uint32_t G, uint32_t row_stride)
{
    return (enc_rows_off(G) + (size_t)G * row_stride + 15) & ~(size_t)15;
}

__host__ __device__ static inline size_t enc_sorted_off(uint32_t G, uint32_t row_stride)
{
    return enc_ws_off(G, row_stride) + ENC_WS_BYTES;
}

/* sorted_bytes: 4·VPL·32 */
__host__ __device__ static inline size_t enc_warp_bytes(uint32_t G, uint32_t row_stride, size_t sorted_bytes)
{
    return enc_sorted_off(G, row_stride) + sorted_bytes;
}

/* ---- drift ---- */

/* λ_j = ldexpf(2^((5j mod 512)/512), hi - 40 + 5j/512), correctly rounded like ldexpf: the product
 * with the power of two is exact in double, the conversion to float rounds once. */
__device__ __forceinline__ float drift_lambda(int hi, uint32_t j)
{
    uint32_t k = 5u * j;
    int e = hi - 40 + (int)(k >> 9);
    double p2 = __longlong_as_double((long long)(e + 1023) << 52);
    return __double2float_rn((double)dqcu_exp2[k & 511u] * p2);
}

/* hi = e or e - 1 of frexpf(span) as drift.c: ceil(log2(span)) for span > 0 finite. */
__device__ __forceinline__ int drift_hi(float span)
{
    if (!(span > 0) || !isfinite(span))
        return 0;
    uint32_t b = dqcu_fbits(span);
    uint32_t ef = (b >> 23) & 0xffu, mant = b & 0x7fffffu;
    if (ef == 0) {
        int fl = (31 - __clz((int)mant)) - 149;
        return (mant & (mant - 1)) ? fl + 1 : fl;
    }
    int E = (int)ef - 127;
    return mant ? E + 1 : E;
}

/* drift.c swap_point, the same operations in the same order. Levels of equal cost give a zero
 * dividend, whose quotient is that zero (the divisor is positive and finite for s > 0); it is
 * kept out of the division, where it takes the slow path (for the whole warp). The division is
 * written in PTX so that the compiler cannot hand the zero back to it (it would: the quotient is
 * only used when the dividend is not zero). */
__device__ __forceinline__ float swap_point(const enc_tab &kt, float s, float lam, uint32_t a, uint32_t b)
{
    float mid = s * (float)(a + b) * 0.5f;
    const float num = lam * (kt.cost[b] - kt.cost[a]);
    float q;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(q) : "f"(num == 0.0f ? 1.0f : num), "f"((2.0f * s) * (float)(b - a)));
    return mid + (num == 0.0f ? num : q);
}

/* Envelope of λ (drift.c build_envelope): swap points of all pairs computed by the lanes, then the
 * pop rule run uniformly by the warp with the stack held one entry per lane, then the thresholds
 * made non-decreasing (a running maximum) and published to the warp's T / CC / LV / K. */
static __device__ void build_envelope(const enc_tab &kt, enc_warp &ws, float s, float lam, uint32_t lane)
{
    const uint32_t M = kt.M;
    __syncwarp();
    /* Fast path: when the swap points of consecutive levels increase strictly, lib's pop rule never
     * pops: every level is on the envelope and thr[m] = τ(m-1, m), already increasing. */
    {
        const bool mine = lane >= 1 && lane < M;
        const float t = mine ? swap_point(kt, s, lam, lane - 1, lane) : 0.0f;
        const float prev = __shfl_up_sync(DQCU_FULL, t, 1);
        const bool ok = !(lane >= 2 && lane < M) || prev < t;
        const float next = __shfl_down_sync(DQCU_FULL, t, 1);
        if (__all_sync(DQCU_FULL, ok)) {
            if (lane + 1 < kt.P)
                ws.T[lane] = lane + 1 < M ? next : INFINITY;
            if (lane < M) {
                ws.CC[lane] = kt.cost_q16[lane];
                ws.LV[lane] = lane;
            }
            if (lane == 0)
                ws.K = M - 1;
            __syncwarp();
            return;
        }
    }
    for (uint32_t q = lane; q < kt.npairs; q += 32)
        ws.sp[q] = swap_point(kt, s, lam, kt.pair_a[q], kt.pair_b[q]);
    __syncwarp();
    uint32_t k = 0;
    uint32_t my_lv = 0;
    float my_thr = 0.0f;
    for (uint32_t m = 1; m < M; m++) {
        uint32_t a = __shfl_sync(DQCU_FULL, my_lv, (int)k);
        float t = ws.sp[m * (m - 1) / 2 + a];
        while (k >= 1 && t <= __shfl_sync(DQCU_FULL, my_thr, (int)k)) {
            k--;
            a = __shfl_sync(DQCU_FULL, my_lv, (int)k);
            t = ws.sp[m * (m - 1) / 2 + a];
        }
        k++;
        if (lane == k) {
            my_lv = m;
            my_thr = t;
        }
    }
    /* for i = 2..k: if (thr[i] < thr[i-1]) thr[i] = thr[i-1]  ==  running maximum */
    float v = (lane >= 1 && lane <= k) ? my_thr : -INFINITY;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        float o = __shfl_up_sync(DQCU_FULL, v, off);
        if ((int)lane >= off && v < o)
            v = o;
    }
    float tv = __shfl_down_sync(DQCU_FULL, v, 1);
    if (lane + 1 < kt.P)
        ws.T[lane] = lane < k ? tv : INFINITY;
    if (lane <= k) {
        ws.CC[lane] = kt.cost_q16[my_lv];
        ws.LV[lane] = my_lv;
    }
    if (lane == 0)
        ws.K = k;
    __syncwarp();
}

/* The envelope of at most 7 thresholds in registers (alphabets M <= 8): index of y = number of
 * thresholds below it, cost by the telescoping sum CC[0] + Σ_{T_i < y} (CC[i+1] - CC[i]). */
struct env7 {
    float t[7];
    int32_t dc[7];
    int32_t c0;
};

__device__ __forceinline__ void env7_load(const enc_warp &ws, uint32_t P, env7 &e)
{
    const uint32_t K = ws.K;
#pragma unroll
    for (int i = 0; i < 7; i++) {
        e.t[i] = (uint32_t)i + 1 < P ? ws.T[i] : INFINITY;
        e.dc[i] = (uint32_t)i < K ? ws.CC[i + 1] - ws.CC[i] : 0;
    }
    e.c0 = ws.CC[0];
}

/* The envelope position of y: the number of e's thresholds below y, by a binary search (the
 * thresholds are non-decreasing, +inf past the envelope, never NaN for s > 0: see env_index). */
__device__ __forceinline__ uint32_t env7_pos(const env7 &e, float y)
{
    const bool b2 = e.t[3] < y;
    const bool b1 = (b2 ? e.t[5] : e.t[1]) < y;
    const bool b0 = (b2 ? (b1 ? e.t[6] : e.t[4]) : (b1 ? e.t[2] : e.t[0])) < y;
    return (b2 ? 4u : 0u) + (b1 ? 2u : 0u) + (b0 ? 1u : 0u);
}

/* Envelope index of y: the number of thresholds below y (drift.c counts y > thr; the thresholds
 * are sorted and never NaN for s > 0, so a branch-free binary search gives the same count). */
__device__ __forceinline__ uint32_t env_index(const enc_warp &ws, uint32_t P, float y)
{
    uint32_t pos = 0;
#pragma unroll
    for (int b = 4; b >= 0; b--) {
        uint32_t step = 1u << b;
        if (step < P) {
            if (ws.T[pos + step - 1] < y)
                pos += step;
        }
    }
    return pos;
}

/* ---- the sorted stream (versions 4 and 5) ----
 *
 * Sorted position p = lane·VPL + r: lane l holds the sorted run ("chunk") l in its registers r,
 * and srt[p] in shared memory (written 16 bytes at a time: 8-way bank conflicts on the stores,
 * none on the reads of a chunk by consecutive lanes, and plain addresses for the searches).
 * Positions >= n hold NaN (key 0xffffffff), which no comparison counts. */

/* Ascending compare-exchange: a gets the smaller key, b the larger. */
__device__ __forceinline__ void sort_cx(uint32_t &a, uint32_t &b)
{
    const uint32_t lo = min(a, b), hi = max(a, b);
    a = lo;
    b = hi;
}

/* Ascending compare-exchange of registers r and r ^ 2^j for every r with bit j clear. */
template <int VPL>
__device__ __forceinline__ void sort_stage_regs(uint32_t (&k)[VPL], int j)
{
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        const int q = r ^ (1 << j);
        if (q > r)
            sort_cx(k[r], k[q]);
    }
}

/* Sorts a lane's keys: Batcher's odd-even merge sort (for 32 keys 191 compare-exchanges, the
 * bitonic network takes 240). Step (p = 2^lp, kq = 2^lk) compares positions a and a + kq of the
 * same run of 2p for a - kq % p in [0, kq) modulo 2kq. Every loop has a constant trip count, so
 * it unrolls fully and the keys stay in registers. */
template <int VPL>
__device__ __forceinline__ void sort_regs(uint32_t (&k)[VPL])
{
    constexpr int LV = __builtin_ctz(VPL);
#pragma unroll
    for (int lp = 0; lp < LV; lp++) {
#pragma unroll
        for (int lk = LV - 1; lk >= 0; lk--) {
            const int p = 1 << lp, kq = 1 << lk, j0 = kq % p;
#pragma unroll
            for (int a = 0; a < VPL; a++) {
                const int b = a + kq;
                if (lk <= lp && a >= j0 && (a - j0) % (2 * kq) < kq && b < VPL && a / (2 * p) == b / (2 * p))
                    sort_cx(k[a], k[b]);
            }
        }
    }
}

/* One merge level of sort_warp for VPL = 32 (runs of 2^(kk-1) into runs of 2^kk, kk >= 7) through
 * shared memory instead of kk - 5 stages of shuffles (3 instructions per key each).
 *
 * Layout A (the sort's): lane l, register r holds position p = 32·l + r. Layout B, its transpose:
 * lane l, register r holds position q = 32·r + l, so bits 5..9 of a position are register bits and
 * every stage on them is a compare-exchange inside the lane. The key at position p sits in the
 * buffer at word 36·(p >> 5) + (p & 31): A's rows (16-byte stores and loads) and B's columns (32
 * consecutive words) are both free of bank conflicts, and every address is a lane's base plus a
 * constant. The buffer's 32 · 36 words are the sorted stream's 32 · 32 and ENC_SORT_EXTRA bytes
 * before it.
 *
 * Going to B, the second run of every pair is read reversed (q = p ^ (2^(kk-1) - 1) where bit
 * kk - 1 is set: all of B's lane bits flip, and the register bits below kk - 1, fixed per register).
 * An ascending run followed by a descending one is bitonic, so the merge is the plain bitonic
 * merger with every compare-exchange ascending: the stages on bits kk-1..5 in B, then back in A
 * those on bits 4..0. The merged run is ascending in q, which is its new position. */
__device__ __forceinline__ void sort_level_transposed(uint32_t (&k)[32], uint32_t *buf, uint32_t lane, int kk)
{
    uint4 *arow = (uint4 *)(void *)(buf + 36u * lane);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 32; r += 4)
        arow[r / 4] = make_uint4(k[r], k[r + 1], k[r + 2], k[r + 3]);
    __syncwarp();
    const uint32_t *fwd = buf + lane, *rev = buf + (31u - lane);
    const int hb = kk - 6; /* the register bit of B that holds position bit kk - 1 */
#pragma unroll
    for (int r = 0; r < 32; r++) {
        const bool h = ((r >> hb) & 1) != 0;
        const int rr = h ? r ^ ((1 << hb) - 1) : r;
        k[r] = h ? rev[36 * rr] : fwd[36 * rr];
    }
#pragma unroll
    for (int j = kk - 1; j >= 5; j--)
        sort_stage_regs<32>(k, j - 5);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 32; r++)
        buf[lane + 36u * (uint32_t)r] = k[r];
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 32; r += 4) {
        const uint4 v = arow[r / 4];
        k[r] = v.x;
        k[r + 1] = v.y;
        k[r + 2] = v.z;
        k[r + 3] = v.w;
    }
#pragma unroll
    for (int j = 4; j >= 0; j--)
        sort_stage_regs<32>(k, j);
}

/* Sorts the stream's values into srt (see above); returns the largest value of this lane's chunk.
 * Sorting network on dqcu_float_key (order-preserving unsigned keys: exact min/max, each value
 * kept bit for bit): each lane sorts its registers (sort_regs), then bitonic merges of the lanes'
 * runs, in the variant with ascending comparators only: merging runs of 2^kk starts with
 * partners p ^ (2^kk - 1), then p ^ 2^jj. Partners closer than VPL positions sit in the same
 * lane; the others are exchanged by shuffles (lane ^ mask; the first step also reverses the
 * registers), or, for VPL = 32 and merges with two or more such steps, the level goes through
 * shared memory (sort_level_transposed; for VPL = 64 that put the keys in local memory). -0 sorts before +0, which no count can tell apart. */
template <int VPL>
__device__ float sort_warp(const float (&x)[VPL], uint32_t n, float *srt, uint32_t lane)
{
    constexpr int LV = __builtin_ctz(VPL), LT = LV + 5;
    uint32_t k[VPL];
#pragma unroll
    for (int r = 0; r < VPL; r++)
        k[r] = (uint32_t)r * 32u + lane < n ? dqcu_float_key(x[r]) : 0xffffffffu;
    sort_regs<VPL>(k);
#pragma unroll
    for (int kk = LV + 1; kk <= LT; kk++) {
        if constexpr (VPL == 32) {
            if (kk >= 7) {
                sort_level_transposed(k, (uint32_t *)(void *)srt - ENC_SORT_EXTRA / 4u, lane, kk);
                continue;
            }
        }
#pragma unroll
        for (int jj = kk - 1; jj >= 0; jj--) {
            const bool first = jj == kk - 1;
            if (jj < LV) {
                sort_stage_regs<VPL>(k, jj);
            } else if (first) {
                const uint32_t m = (2u << (jj - LV)) - 1u;
                const bool upper = ((lane >> (jj - LV)) & 1u) != 0;
#pragma unroll
                for (int r = 0; r < (VPL + 1) / 2; r++) {
                    const int q = VPL - 1 - r;
                    const uint32_t a = __shfl_xor_sync(DQCU_FULL, k[q], (int)m);
                    const uint32_t b = q != r ? __shfl_xor_sync(DQCU_FULL, k[r], (int)m) : a;
                    k[r] = upper ? max(k[r], a) : min(k[r], a);
                    if (q != r)
                        k[q] = upper ? max(k[q], b) : min(k[q], b);
                }
            } else {
                const uint32_t m = 1u << (jj - LV);
                const bool upper = (lane & m) != 0;
#pragma unroll
                for (int r = 0; r < VPL; r++) {
                    const uint32_t o = __shfl_xor_sync(DQCU_FULL, k[r], (int)m);
                    k[r] = upper ? max(k[r], o) : min(k[r], o);
                }
            }
        }
    }
    if (VPL == 32)
        __syncwarp(); /* every lane's last transpose loads are done */
    if (VPL >= 4) {
        float4 *dst = (float4 *)(void *)(srt + lane * VPL);
#pragma unroll
        for (int r = 0; r + 3 < VPL; r += 4)
            dst[r / 4] = make_float4(dqcu_key_float(k[r]), dqcu_key_float(k[r + 1]), dqcu_key_float(k[r + 2]),
                                     dqcu_key_float(k[r + 3]));
    } else {
#pragma unroll
        for (int r = 0; r < VPL; r++)
            srt[lane * VPL + r] = dqcu_key_float(k[r]);
    }
    __syncwarp();
    return dqcu_key_float(k[VPL - 1]);
}

/* drift.c count_le: the number of sorted values with fl(x - o) <= t, for the whole warp. cy is
 * fl(c - o) for this lane's chunk maximum c. fl(x - o) <= t holds on a prefix of the sorted
 * stream (fl(x - o) is monotone in x; NaN padding never holds), so the chunks entirely below t
 * are lanes 0..b-1 and the count is b·VPL plus the prefix of chunk b; when every chunk is below
 * (b = 32), chunk 31 counted again gives its VPL. */
template <int VPL>
__device__ __forceinline__ uint32_t count_le_sorted(const float *srt, float cy, float o, float t, uint32_t lane)
{
    const uint32_t b = (uint32_t)__popc(__ballot_sync(DQCU_FULL, cy <= t));
    const uint32_t c = b < 32u ? b : 31u;
    const float *chunk = srt + c * VPL;
    uint32_t cnt = c * VPL;
#pragma unroll
    for (int h = 0; h < (VPL + 31) / 32; h++) {
        const uint32_t i = (uint32_t)h * 32u + lane;
        bool le = false;
        if (i < (uint32_t)VPL)
            le = chunk[i] - o <= t;
        cnt += (uint32_t)__popc(__ballot_sync(DQCU_FULL, le));
    }
    return cnt;
}

/* drift.c envelope_cost on the sorted stream: n·c(lv_0) + Σ_i above_i·(c(lv_i) - c(lv_{i-1})),
 * the thresholds of the published envelope searched eight at a time (independent ballots). */
template <int VPL>
__device__ int64_t envelope_cost_sorted(const enc_warp &ws, const float *srt, uint32_t n, float cy, float o,
                                        uint32_t lane)
{
    const uint32_t K = ws.K;
    int64_t cost = (int64_t)n * ws.CC[0];
    for (uint32_t i0 = 0; i0 < K; i0 += 8) {
#pragma unroll
        for (uint32_t j = 0; j < 8; j++) {
            const uint32_t i = i0 + j;
            if (i < K) {
                const uint32_t above = n - count_le_sorted<VPL>(srt, cy, o, ws.T[i], lane);
                cost += (int64_t)above * (ws.CC[i + 1] - ws.CC[i]);
            }
        }
    }
    return cost;
}

/* drift.c's exponent hi = ceil(log2(8·(max D - min D))) of the grid (s, o), from the sorted stream
 * (both container versions). */
template <int VPL>
__device__ int drift_hi_warp(uint32_t M, const float *srt, float cmax, uint32_t n, float xmin, float xmax, float s,
                             float o, uint32_t lane)
{
    float lv0 = o, lvM = o + s * (float)(M - 1);
    float d, maxd = 0;
    d = xmin - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmin - lvM;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lvM;
    maxd = fmaxf(maxd, d * d);

    /* drift.c: p = count_le(xs, n, 0, lv), then the values on each side of lv; fl(x - 0) = x */
    float mind = INFINITY;
    for (uint32_t m = 0; m < M; m++) {
        const float lv = o + s * (float)m;
        const uint32_t q = count_le_sorted<VPL>(srt, cmax, 0.0f, lv, lane);
        if (q > 0) {
            d = srt[q - 1] - lv;
            mind = fminf(mind, d * d);
        }
        if (q < n) {
            d = srt[q] - lv;
            mind = fminf(mind, d * d);
        }
    }
    return drift_hi(8.0f * (maxd - mind));
}

/* dq__drift for grid (s, o) on the warp's values; writes levels to row, returns Σ cost_q16.
 *
 * min D: lib takes, per level, the nearest sorted values on each side; fl((x - lv)²) is monotone
 * in x on each side of lv, so that equals the minimum over all (value, level) computed here.
 * The cost of an envelope: lib sums counts of fl(x - o) <= thr found by binary search on the
 * sorted stream (fl(x - o) is monotone in x); the per-value sum of cost_q16[level] telescopes to
 * the same integer. It searches the sorted stream srt as lib does (cmax: this lane's
 * chunk maximum, see sort_warp), with lib's formulas for min D and the envelope's cost.
 * (min D is a minimum of non-negative floats and the costs are integers: the order of the
 * operations cannot change either.) */
template <int VPL>
__device__ int64_t drift_warp(const enc_tab &kt, enc_warp &ws, const float (&x)[VPL], const float *srt, float cmax,
                              uint32_t n, float xmin, float xmax, float s, float o, int64_t budget, uint8_t *row,
                              uint32_t lane)
{
    const int hi = drift_hi_warp<VPL>(kt.M, srt, cmax, n, xmin, xmax, s, o, lane);
    const bool small = kt.P <= 8;
    const float cy = cmax - o;
    uint32_t jlo = 0, jhi = 4096;
    for (int t = 0; t < 12; t++) {
        uint32_t jm = (jlo + jhi) >> 1;
        build_envelope(kt, ws, s, drift_lambda(hi, jm), lane);
        if (envelope_cost_sorted<VPL>(ws, srt, n, cy, o, lane) <= budget)
            jhi = jm;
        else
            jlo = jm;
    }
    build_envelope(kt, ws, s, drift_lambda(hi, jhi), lane);
    uint32_t c = 0;
    env7 e;
    if (small)
        env7_load(ws, kt.P, e);
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        uint32_t i = (uint32_t)r * 32u + lane;
        if (i < n) {
            float y = x[r] - o;
            uint32_t pos = 0;
            if (small) {
                pos = env7_pos(e, y);
            } else {
                pos = env_index(ws, kt.P, y);
            }
            row[i] = (uint8_t)ws.LV[pos];
            c += (uint32_t)ws.CC[pos];
        }
    }
    __syncwarp();
    return (int64_t)__reduce_add_sync(DQCU_FULL, c);
}

/* ---- format version 2 (joint pairs): the drift with pair costs (drift.c pair_assign) ----
 *
 * Pair i is values 2i, 2i + 1: the same slot r of lanes 2k, 2k + 1. Both lanes of a pair fetch it
 * and compute its argmin (the same operations as lib, in the same order: the nearest levels, the
 * pruned rows and columns, the search in increasing a·M + b with a strict <); the even lane writes
 * the levels and counts the cost. The costs are integers and the sum of at most 1024 pair costs
 * (< 2^20 each) fits 32 bits, so the warp's sum is lib's. λ·r_min, lib's lrmin, is a minimum of
 * floats (order-free). */

/* The argmin pair a·M + b of (y1, y2) = (x1 - o, x2 - o) for λ = lam (lrmin = min_k lam·r_k). */
static __device__ __noinline__ uint32_t pair_argmin(const dqcu_rans2_kind &k2, uint32_t M, float s, float o, float lam,
                                                    float lrmin, float x1, float x2)
{
    const float y1 = x1 - o, y2 = x2 - o;
    float d1[32], d2[32];
    uint32_t a1 = 0, b1 = 0;
    const float l0 = s * 0.0f;
    d1[0] = (y1 - l0) * (y1 - l0);
    d2[0] = (y2 - l0) * (y2 - l0);
    for (uint32_t m = 1; m < M; m++) {
        const float lv = s * (float)m;
        const float e1 = y1 - lv, e2 = y2 - lv;
        d1[m] = e1 * e1;
        d2[m] = e2 * e2;
        a1 = d1[m] < d1[a1] ? m : a1;
        b1 = d2[m] < d2[b1] ? m : b1;
    }
    const float c0 = (d1[a1] + d2[b1]) + lam * __ldg(&k2.cost[a1 * M + b1]);
    uint32_t ca = 0, cb = 0;
    for (uint32_t m = 0; m < M; m++) {
        ca |= ((d1[m] + d2[b1]) + lrmin <= c0 ? 1u : 0u) << m;
        cb |= ((d1[a1] + d2[m]) + lrmin <= c0 ? 1u : 0u) << m;
    }
    float best = INFINITY;
    uint32_t arg = 0;
    for (uint32_t ma = ca; ma; ma &= ma - 1u) {
        const uint32_t a = (uint32_t)__ffs((int)ma) - 1u;
        for (uint32_t mb = cb; mb; mb &= mb - 1u) {
            const uint32_t b = (uint32_t)__ffs((int)mb) - 1u;
            const float c = (d1[a] + d2[b]) + lam * __ldg(&k2.cost[a * M + b]);
            if (c < best) {
                best = c;
                arg = a * M + b;
            }
        }
    }
    return arg;
}

/* drift.c pair_assign over the warp's stream: Σ r of the pairs (Q16); levels into row when given. */
template <int VPL>
__device__ int64_t pair_assign_warp(const dqcu_rans2_kind &k2, uint32_t M, const float (&x)[VPL], uint32_t n, float s,
                                    float o, float lam, uint8_t *row, uint32_t lane)
{
    float lrmin = INFINITY;
    for (uint32_t k = lane; k < M * M; k += 32)
        lrmin = fminf(lrmin, lam * __ldg(&k2.cost[k]));
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
        lrmin = fminf(lrmin, __shfl_xor_sync(DQCU_FULL, lrmin, off));
    uint32_t c = 0;
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        const float x1 = __shfl_sync(DQCU_FULL, x[r], (int)(lane & ~1u));
        const float x2 = __shfl_sync(DQCU_FULL, x[r], (int)(lane | 1u));
        const uint32_t i = (uint32_t)r * 32u + lane;
        if (!(lane & 1u) && i + 1 < n) {
            const uint32_t arg = pair_argmin(k2, M, s, o, lam, lrmin, x1, x2);
            c += (uint32_t)__ldg(&k2.cost_q16[arg]);
            if (row) {
                row[i] = (uint8_t)(arg / M);
                row[i + 1] = (uint8_t)(arg % M);
            }
        }
    }
    __syncwarp();
    return (int64_t)__reduce_add_sync(DQCU_FULL, c);
}

/* dq__drift of a version-2 stream: lib's λ grid and bisection with the cost counted over the pairs,
 * then the assignment at jhi into row. Returns its cost. */
template <int VPL>
__device__ int64_t drift2_warp(const dqcu_rans2_kind &k2, uint32_t M, const float (&x)[VPL], const float *srt,
                               float cmax, uint32_t n, float xmin, float xmax, float s, float o, int64_t budget,
                               uint8_t *row, uint32_t lane)
{
    const int hi = drift_hi_warp<VPL>(M, srt, cmax, n, xmin, xmax, s, o, lane);
    uint32_t jlo = 0, jhi = 4096;
    for (int t = 0; t < 12; t++) {
        const uint32_t jm = (jlo + jhi) >> 1;
        if (pair_assign_warp<VPL>(k2, M, x, n, s, o, drift_lambda(hi, jm), nullptr, lane) <= budget)
            jhi = jm;
        else
            jlo = jm;
    }
    return pair_assign_warp<VPL>(k2, M, x, n, s, o, drift_lambda(hi, jhi), row, lane);
}

/* ---- version 5: the bisection two steps at a time, counts by per-lane searches ----
 *
 * count_le_lane: drift.c count_le(xs, n, o, t) for this lane's own t, by a branch-free search of
 * the sorted stream srt (see sort_warp): first over the 32 chunk maxima, then inside the chunk.
 * fl(x - o) <= t holds on a prefix of srt (fl(x - o) is monotone in x; the NaN padding beyond n
 * never holds; -0 and +0 give the same answer), so with T the length of that prefix the first
 * search ends at c = min(T / VPL, 31), the second at i = min(T - c·VPL, VPL - 1), and
 * T = c·VPL + i + [i = VPL - 1 and c = 31 and the last element holds] (last: the caller's
 * fl(srt[32·VPL - 1] - o) <= t, NaN padding included). The result is lib's count for any t. */

/* All ones where fl(v - o) <= t (false for NaN, like the comparison). */
__device__ __forceinline__ uint32_t le_mask(float v, float o, float t)
{
    uint32_t m;
    asm("set.le.u32.f32 %0, %1, %2;" : "=r"(m) : "f"(v - o), "f"(t));
    return m;
}

/* The number of leading a[j·S], j < 2^BITS - 1, with fl(a - o) <= t (they form a prefix), two
 * bits per step: three independent loads and tests, so the search is BITS/2 loads deep. A step
 * at c (a multiple of 4u) tests c + u - 1, c + 2u - 1, c + 3u - 1, never index 2^BITS - 1. */
template <int BITS, int S>
__device__ __forceinline__ uint32_t search_le(const float *a, float o, float t)
{
    uint32_t c = 0;
#pragma unroll
    for (int b = BITS - 1; b >= 0; b -= 2) {
        const float *q = a + c * S;
        if (b >= 1) {
            const uint32_t u = 1u << (b - 1);
            const uint32_t m = le_mask(q[(u - 1) * S], o, t) + le_mask(q[(2 * u - 1) * S], o, t) +
                               le_mask(q[(3 * u - 1) * S], o, t);
            c -= u * m;
        } else {
            c -= le_mask(q[0], o, t);
        }
    }
    return c;
}

template <int VPL>
__device__ __forceinline__ uint32_t count_le_lane(const float *srt, float o, float t, bool last)
{
    constexpr int LV = __builtin_ctz(VPL);
    const uint32_t c = search_le<5, VPL>(srt + VPL - 1, o, t);
    const uint32_t i = search_le<LV, 1>(srt + c * VPL, o, t);
    const uint32_t pos = c * VPL + i;
    return pos + (pos == 32u * VPL - 1u && last ? 1u : 0u);
}

/* min D of drift.c by the lanes: lane m < M takes level m's nearest sorted values on each side
 * (count_le with o = 0: fl(x - 0) = x), the warp the minimum of the squares (a minimum of
 * non-negative floats, so the order does not matter; their bit patterns order like the values). */
template <int VPL>
__device__ __forceinline__ float mind_lanes(const float *srt, uint32_t n, uint32_t M, float s, float o, uint32_t lane)
{
    float mn = INFINITY;
    if (lane < M) {
        const float lv = o + s * (float)lane;
        const bool last = srt[32u * VPL - 1u] - 0.0f <= lv;
        const uint32_t q = count_le_lane<VPL>(srt, 0.0f, lv, last);
        float d;
        if (q > 0) {
            d = srt[q - 1] - lv;
            mn = fminf(mn, d * d);
        }
        if (q < n) {
            d = srt[q] - lv;
            mn = fminf(mn, d * d);
        }
    }
    return dqcu_bitsf(__reduce_min_sync(DQCU_FULL, dqcu_fbits(mn)));
}

/* dq__refit's sums (see refit_warp) reduced and solved; px, pxm, sm, smm: this lane's partials. */
__device__ __forceinline__ void refit_finish(double px, double pxm, uint32_t sm, uint32_t smm, uint32_t n, double *s,
                                             double *o)
{
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        double a = __shfl_down_sync(DQCU_FULL, px, off);
        double b = __shfl_down_sync(DQCU_FULL, pxm, off);
        px = px + a;
        pxm = pxm + b;
    }
    const double sx = __shfl_sync(DQCU_FULL, px, 0), sxm = __shfl_sync(DQCU_FULL, pxm, 0);
    const int64_t ism = (int64_t)__reduce_add_sync(DQCU_FULL, sm);
    const int64_t ismm = (int64_t)__reduce_add_sync(DQCU_FULL, smm);
    const double dn = (double)n;
    const double det = dn * (double)ismm - (double)ism * (double)ism;
    double ns, no;
    if (det > 0) {
        ns = (dn * sxm - (double)ism * sx) / det;
        no = (sx - ns * (double)ism) / dn;
    } else {
        ns = *s;
        no = (sx - ns * (double)ism) / dn;
    }
    if (!(ns >= 0) || !isfinite(ns) || !isfinite(no) || (det > 0 && !(ns > 0)))
        return;
    *s = ns;
    *o = no;
}

/* Version 5 drift for alphabets M <= 8 (any other M takes drift_warp<VPL, true>), s > 0.
 *
 * Bisection: lib's 12 steps taken two at a time. With jlo, jhi, lib's first step tests
 * j1 = (jlo + jhi) >> 1 and its second j0 = (jlo + j1) >> 1 when j1 was feasible, else
 * j2 = (j1 + jhi) >> 1; the warp evaluates j0, j1 and j2 at once (lanes 8g + i, g = 0, 1, 2: the
 * threshold i of j_g) and then takes lib's two decisions. Each evaluation is lib's: when the swap
 * points τ(i, i+1) of every group increase strictly, lib's pop rule pops nothing (the envelope is
 * every level, thresholds τ(i, i+1)), and its cost n·c_0 + Σ_i above_i·(c_{i+1} - c_i) is summed
 * in uint32: every c is in [0, 2^19] (f >= 1) and n <= 2048, so the true total is in [0, 2^30]
 * and sums and products mod 2^32 give it exactly, whatever the order. Otherwise the round runs
 * lib's two steps one after the other with the general envelope (build_envelope) and
 * envelope_cost_sorted.
 *
 * Final assignment (drift.c's last loop): the envelope of jhi in registers (thresholds, levels as
 * nibbles), the level of y = x - o is lv[#{thr < y}]. row == nullptr (drift 1): the levels are not
 * stored but summed into the refit straight away (refit_warp's order, same operations), and *s, *o
 * receive the refit. Otherwise the levels go to row and the return value says whether lib's final
 * cost is within the budget: the cost of the jhi envelope, which a step found feasible unless jhi
 * is still 4096 (then it is counted here). */
template <int VPL>
__device__ bool drift5_warp(const enc_tab &kt, enc_warp &ws, const float (&x)[VPL], const float *srt, float cmax,
                            uint32_t n, float xmin, float xmax, float s, float o, int64_t budget, uint8_t *row,
                            double *rs, double *ro, uint32_t lane)
{
    const uint32_t M = kt.M;
    float lv0 = o, lvM = o + s * (float)(M - 1);
    float d, maxd = 0;
    d = xmin - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lv0;
    maxd = fmaxf(maxd, d * d);
    d = xmin - lvM;
    maxd = fmaxf(maxd, d * d);
    d = xmax - lvM;
    maxd = fmaxf(maxd, d * d);
    const float mind = mind_lanes<VPL>(srt, n, M, s, o, lane);
    const int hi = drift_hi(8.0f * (maxd - mind));

    const uint32_t g = lane >> 3, ti = lane & 7u;
    const bool act = g < 3 && ti + 1u < M;
    const uint32_t dcc = act ? (uint32_t)(kt.cost_q16[ti + 1] - kt.cost_q16[ti]) : 0u;
    const uint32_t base = n * (uint32_t)kt.cost_q16[0];
    const float xlast = srt[32u * VPL - 1u] - o;
    const float cy = cmax - o;
    uint32_t jlo = 0, jhi = 4096;
    for (int t = 0; t < 6; t++) {
        const uint32_t j1 = (jlo + jhi) >> 1, j0 = (jlo + j1) >> 1, j2 = (j1 + jhi) >> 1;
        const uint32_t jg = g == 0 ? j0 : g == 1 ? j1 : j2;
        const float lam = drift_lambda(hi, jg);
        const float tt = act ? swap_point(kt, s, lam, ti, ti + 1) : 0.0f;
        const float prev = __shfl_up_sync(DQCU_FULL, tt, 1);
        const bool ok = !(act && ti >= 1) || prev < tt;
        if (__all_sync(DQCU_FULL, ok)) {
            uint32_t cv = 0;
            if (act)
                cv = (n - count_le_lane<VPL>(srt, o, tt, xlast <= tt)) * dcc;
            cv += __shfl_xor_sync(DQCU_FULL, cv, 1);
            cv += __shfl_xor_sync(DQCU_FULL, cv, 2);
            cv += __shfl_xor_sync(DQCU_FULL, cv, 4);
            const uint32_t c0 = base + __shfl_sync(DQCU_FULL, cv, 0);
            const uint32_t c1 = base + __shfl_sync(DQCU_FULL, cv, 8);
            const uint32_t c2 = base + __shfl_sync(DQCU_FULL, cv, 16);
            if ((int64_t)c1 <= budget) {
                jhi = j1;
                if ((int64_t)c0 <= budget)
                    jhi = j0;
                else
                    jlo = j0;
            } else {
                jlo = j1;
                if ((int64_t)c2 <= budget)
                    jhi = j2;
                else
                    jlo = j2;
            }
        } else {
            for (int u = 0; u < 2; u++) {
                const uint32_t jm = (jlo + jhi) >> 1;
                build_envelope(kt, ws, s, drift_lambda(hi, jm), lane);
                if (envelope_cost_sorted<VPL>(ws, srt, n, cy, o, lane) <= budget)
                    jhi = jm;
                else
                    jlo = jm;
            }
        }
    }
    build_envelope(kt, ws, s, drift_lambda(hi, jhi), lane);
    bool feasible = true;
    if (row && jhi == 4096u)
        feasible = envelope_cost_sorted<VPL>(ws, srt, n, cy, o, lane) <= budget;
    env7 e;
    env7_load(ws, kt.P, e);
    /* levels as bytes (at most 8 of them, level 0 first: its byte is 0, so a PRMT with selector
     * pos gives level pos with zero upper bytes) */
    uint32_t lv_lo = 0, lv_hi = 0;
    {
        const uint32_t K = ws.K;
#pragma unroll
        for (int i = 0; i < 8; i++)
            if ((uint32_t)i <= K)
                (i < 4 ? lv_lo : lv_hi) |= ws.LV[i] << (8 * (i & 3));
    }
    /* The levels are computed for every slot and only the store is predicated on i < n (in PTX:
     * with a plain `if` the compiler moves the whole computation under a branch). */
    if (row) {
#pragma unroll
        for (int r = 0; r < VPL; r++) {
            const uint32_t i = (uint32_t)r * 32u + lane;
            const uint32_t l = __byte_perm(lv_lo, lv_hi, env7_pos(e, x[r] - o));
            asm volatile("{\n\t.reg .pred q;\n\tsetp.lt.u32 q, %0, %1;\n\t@q st.shared.u8 [%2], %3;\n\t}" ::"r"(i),
                         "r"(n), "r"((uint32_t)__cvta_generic_to_shared(row + i)), "r"(l)
                         : "memory");
        }
        __syncwarp();
        return feasible;
    }
    /* values beyond n add -0, the identity of IEEE addition (lib never adds them) */
    double px = 0, pxm = 0;
    uint32_t sm = 0, smm = 0;
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        const bool in = (uint32_t)r * 32u + lane < n;
        const uint32_t l = in ? __byte_perm(lv_lo, lv_hi, env7_pos(e, x[r] - o)) : 0u;
        const double xv = (double)(in ? x[r] : -0.0f);
        px += xv;
        pxm += xv * (double)l;
        sm += l;
        smm += l * l;
    }
    refit_finish(px, pxm, sm, smm, n, rs, ro);
    return true;
}

/* dq__refit: lane l sums the values i ≡ l (mod 32) in increasing i, then the butterfly
 * p[l] = p[l] + p[l + off] for off = 16..1 (lane 0 ends with lib's sum). */
template <int VPL>
__device__ void refit_warp(const float (&x)[VPL], const uint8_t *row, uint32_t n, double *s, double *o, uint32_t lane)
{
    double px = 0, pxm = 0;
    uint32_t sm = 0, smm = 0;
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        uint32_t i = (uint32_t)r * 32u + lane;
        if (i < n) {
            uint32_t l = row[i];
            px += (double)x[r];
            pxm += (double)x[r] * (double)l;
            sm += l;
            smm += l * l;
        }
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
        double a = __shfl_down_sync(DQCU_FULL, px, off);
        double b = __shfl_down_sync(DQCU_FULL, pxm, off);
        px = px + a;
        pxm = pxm + b;
    }
    const double sx = __shfl_sync(DQCU_FULL, px, 0), sxm = __shfl_sync(DQCU_FULL, pxm, 0);
    const int64_t ism = (int64_t)__reduce_add_sync(DQCU_FULL, sm);
    const int64_t ismm = (int64_t)__reduce_add_sync(DQCU_FULL, smm);
    const double dn = (double)n;
    const double det = dn * (double)ismm - (double)ism * (double)ism;
    double ns, no;
    if (det > 0) {
        ns = (dn * sxm - (double)ism * sx) / det;
        no = (sx - ns * (double)ism) / dn;
    } else {
        ns = *s;
        no = (sx - ns * (double)ism) / dn;
    }
    if (!(ns >= 0) || !isfinite(ns) || !isfinite(no) || (det > 0 && !(ns > 0)))
        return;
    *s = ns;
    *o = no;
}

/* Number of values whose level differs from nearest rounding, and the largest move (stats). */
template <int VPL>
__device__ void moved_warp(const float (&x)[VPL], const uint8_t *row, uint32_t n, uint32_t M, float sf, float of,
                           uint32_t lane, uint32_t *moved, uint32_t *max_move)
{
    uint32_t cnt = 0, mx = 0;
#pragma unroll
    for (int r = 0; r < VPL; r++) {
        uint32_t i = (uint32_t)r * 32u + lane;
        if (i < n) {
            uint32_t nl = 0;
            if (sf > 0) {
                float u = rintf((x[r] - of) / sf);
                if (u < 0)
                    u = 0;
                if (u > (float)(M - 1))
                    u = (float)(M - 1);
                nl = (uint32_t)u;
            }
            uint32_t l = row[i];
            uint32_t mv = nl > l ? nl - l : l - nl;
            cnt += mv != 0;
            mx = mv > mx ? mv : mx;
        }
    }
    *moved = __reduce_add_sync(DQCU_FULL, cnt);
    *max_move = __reduce_max_sync(DQCU_FULL, mx);
}

/* One rANS encoder step (rans.c) with the symbol's table entry, emitting down from row[p]. */
__device__ __forceinline__ void rans_put(uint32_t &x, uint32_t &p, uint8_t *row, const uint4 e)
{
    if (x >= e.x) {
        row[--p] = (uint8_t)x;
        x >>= 8;
    }
    const uint32_t q = (uint32_t)(((unsigned long long)x * e.y) >> (e.w >> 16));
    x = x + q * e.z + (e.w & 0xffffu);
}

/* rANS encode of row[0..n) from the last symbol to the first (rans.c), emitting bytes downward
 * from row[n] in place: before symbol i is encoded at most n-1-i bytes were emitted, so the write
 * position stays above the symbols not read yet (symbols are read four at a time, ahead of their
 * steps, so the table loads stay off the state's dependency chain). Returns the final state and
 * the start of the emitted bytes in *p_out. row is 4-byte aligned. */
static __device__ uint32_t rans_row(const enc_tab &kt, uint8_t *row, uint32_t n, uint32_t *p_out)
{
    uint32_t x = DQCU_RANS_L, p = n, i = n;
    while (i & 3u) {
        i--;
        rans_put(x, p, row, kt.enc[row[i]]);
    }
    for (; i; i -= 4) {
        const uint32_t w = *(const uint32_t *)(const void *)(row + i - 4);
        const uint4 e3 = kt.enc[w >> 24], e2 = kt.enc[(w >> 16) & 0xffu];
        const uint4 e1 = kt.enc[(w >> 8) & 0xffu], e0 = kt.enc[w & 0xffu];
        rans_put(x, p, row, e3);
        rans_put(x, p, row, e2);
        rans_put(x, p, row, e1);
        rans_put(x, p, row, e0);
    }
    *p_out = p;
    return x;
}

/* Version 2's rANS encode of row[0..n) (rans2.c dq__rans2_encode), pair by pair from the last,
 * emitting bytes downward from row[n] in place: before pair i is encoded at most n - 2 - 2i bytes
 * were emitted (two per pair at most), and its levels are read before its bytes are written, so
 * the write position stays above the levels not read yet. Returns the final state, the start of
 * the emitted bytes in *p_out. */
static __device__ __noinline__ uint32_t rans2_row(const dqcu_rans2_kind &k2, uint32_t M, uint8_t *row, uint32_t n,
                                                  uint32_t *p_out)
{
    uint32_t x = DQCU_RANS_L, p = n;
    uint8_t bytes[2];
    for (uint32_t i = n / 2u; i-- > 0;) {
        const uint4 e = __ldg(&k2.enc[row[2u * i] * M + row[2u * i + 1u]]);
        const uint32_t k = dqcu_enc_step(x, e, bytes);
        for (uint32_t j = 0; j < k; j++)
            row[--p] = bytes[j];
    }
    *p_out = p;
    return x;
}

/* One warp, a group of G streams, stream.c's encoder for each:
 *   1. every pending stream: its drift(s) (the only call site), levels left in its row;
 *   2. the pending streams' rANS passes side by side, one lane each (the only call site);
 *   3. the length check: streams that overflow become pending again, with the budget tightened as
 *      stream.c does, or with the all-cheapest assignment; repeat until none is pending;
 *   4. the records. */
template <int VPL, int VER>
__global__ void __launch_bounds__(ENC_WARPS * 32, VPL >= 64   ? 2
                                                  : VPL >= 32 ? 3
                                                              : 4) encode_kernel(enc_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    enc_tab &kt = *(enc_tab *)(void *)smem;
    const int kind = p.kind >= 0 ? p.kind : (int)blockIdx.y;
    const dqcu_tables &tb = *p.tab;
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;

    if (threadIdx.x == 0) {
        const dqcu_kind_tab &src = tb.kind[kind];
        kt.M = src.M;
        kt.C = src.C;
        kt.cheapest = src.cheapest;
        kt.P = src.P;
        kt.npairs = src.npairs;
        kt.budget_q16 = src.budget_q16;
    }
    for (uint32_t i = threadIdx.x; i < 32; i += blockDim.x) {
        kt.cost_q16[i] = tb.kind[kind].cost_q16[i];
        kt.cost[i] = tb.kind[kind].cost[i];
        kt.enc[i] = tb.kind[kind].enc[i];
    }
    for (uint32_t i = threadIdx.x; i < DQCU_MAX_PAIRS; i += blockDim.x) {
        kt.pair_a[i] = tb.kind[kind].pair_a[i];
        kt.pair_b[i] = tb.kind[kind].pair_b[i];
    }
    __syncthreads();

    const uint32_t G = p.G, n = tb.n;
    const size_t tab_bytes = (sizeof(enc_tab) + 15) & ~(size_t)15;
    unsigned char *wbase = smem + tab_bytes + (size_t)warp * enc_warp_bytes(G, p.row_stride, 128u * VPL);
    enc_warp &ws = *(enc_warp *)(void *)(wbase + enc_ws_off(G, p.row_stride));
    enc_slot *slots = (enc_slot *)(void *)wbase;
    uint8_t *rows = wbase + enc_rows_off(G);
    float *srt = (float *)(void *)(wbase + enc_sorted_off(G, p.row_stride));

    const size_t gwarp = (size_t)blockIdx.x * ENC_WARPS + warp;
    size_t g0;
    uint32_t gmax;
    if (gwarp < p.bulk_warps) {
        g0 = gwarp * G;
        gmax = G;
    } else {
        const size_t t = gwarp - p.bulk_warps;
        g0 = p.bulk_warps * G + t * p.Gt + min(t, (size_t)p.Gt_more);
        gmax = p.Gt + (t < p.Gt_more);
    }
    if (g0 >= p.count)
        return;
    const uint32_t gcount = (uint32_t)min((size_t)gmax, p.count - g0);
    const bool want_stats = p.stats != nullptr;
    const uint32_t C = kt.C, M = kt.M;
    /* format version 2: the pair drift (drift2_warp), the cheapest pair, the pair rANS (rans2_row) */
    const dqcu_rans2_kind *k2 = p.tab2 ? &p.tab2->kind[kind] : nullptr;

    if (lane < gcount) {
        enc_slot &sl = slots[lane];
        sl.mode = MODE_FRESH;
        sl.retries = 0;
        sl.fallback = 0;
        sl.feasible = 0;
        sl.status = 0;
        sl.sf = sl.of = 0.0f;
        sl.sh = sl.oh = 0;
        sl.budget = 0;
        sl.used = 0;
    }
    __syncwarp();

    float x[VPL];
    uint32_t pending = gcount == 32 ? DQCU_FULL : (1u << gcount) - 1u;
    while (pending) {
        for (uint32_t pm = pending; pm; pm &= pm - 1u) {
            const uint32_t gi = (uint32_t)__ffs((int)pm) - 1u;
            enc_slot &sl = slots[gi];
            uint8_t *row = rows + (size_t)gi * p.row_stride;
            const int mode = sl.mode;
            float gs = sl.sf, go = sl.of, xmin = 0, xmax = 0;
            int64_t budget = sl.budget;
            uint32_t sh = sl.sh, oh = sl.oh;
            int pass = mode == MODE_FRESH ? 0 : mode == MODE_RETRY ? 1 : 2;
            if (mode != MODE_CHEAP || want_stats) {
                const int st = load_stream<VPL>(p, tb, kind, g0 + gi, lane, x);
                if (st != 0) {
                    if (lane == 0)
                        sl.status = st;
                    __syncwarp();
                    continue;
                }
            }
            float cmax = 0;
            if (mode != MODE_CHEAP) {
                cmax = sort_warp(x, n, srt, lane);
                xmin = srt[0];
                xmax = srt[n - 1];
            }
            if (mode == MODE_FRESH) {
                if (!(fabsf(xmin) <= DQ_STREAM_MAX_ABS) || !(fabsf(xmax) <= DQ_STREAM_MAX_ABS)) {
                    if (lane == 0)
                        sl.status = DQ_RANGE;
                    __syncwarp();
                    continue;
                }
                gs = (xmax - xmin) / (float)(M - 1); /* FitMinMax */
                go = xmin;
                budget = kt.budget_q16;
            }
            int feasible = 0;
            /* version 5: the drift of drift5_warp, drift 1 fused with the refit */
            const bool v5 = VER == 5 && M <= 8 && !k2;
            for (; pass < 2; pass++) {
                int64_t cost = 0;
                bool ok5 = false;
                double ds = gs, dof = go;
                if (gs > 0) {
                    if (v5)
                        ok5 = drift5_warp<VPL>(kt, ws, x, srt, cmax, n, xmin, xmax, gs, go, budget,
                                               pass == 1 ? row : nullptr, &ds, &dof, lane);
                    else if (k2)
                        cost = drift2_warp<VPL>(*k2, M, x, srt, cmax, n, xmin, xmax, gs, go, budget, row, lane);
                    else
                        cost = drift_warp<VPL>(kt, ws, x, srt, cmax, n, xmin, xmax, gs, go, budget, row, lane);
                }
                if (pass == 1) {
                    feasible = gs > 0 && (v5 ? ok5 : cost <= budget);
                    break;
                }
                /* Refit, then s and o in fp16 (stream.c) */
                if (gs > 0) {
                    if (!v5)
                        refit_warp(x, row, n, &ds, &dof, lane);
                    sh = dqcu_f64_to_f16(ds);
                    oh = dqcu_f64_to_f16(dof);
                    if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u) {
                        sh = dqcu_f64_to_f16((double)gs);
                        oh = dqcu_f64_to_f16((double)go);
                    }
                } else {
                    sh = 0;
                    oh = dqcu_f64_to_f16((double)xmin);
                }
                if ((sh & 0x7c00u) == 0x7c00u || (oh & 0x7c00u) == 0x7c00u)
                    break;
                sh &= 0x7fffu;
                gs = dqcu_f16_to_f32((uint16_t)sh);
                go = dqcu_f16_to_f32((uint16_t)oh);
            }
            if (pass == 0) { /* s or o outside fp16 */
                if (lane == 0)
                    sl.status = DQ_RANGE;
                __syncwarp();
                continue;
            }
            int fallback = sl.fallback;
            if (!feasible) {
                for (uint32_t i = lane; i < n; i += 32)
                    row[i] = (uint8_t)(k2 ? k2->cheap[i & 1u] : kt.cheapest);
                /* s = 0: the cheapest level is the exact answer, not a fallback */
                fallback = mode == MODE_CHEAP ? 1 : gs > 0;
            }
            __syncwarp();
            uint32_t mv = 0, mx = 0;
            if (want_stats)
                moved_warp(x, row, n, M, gs, go, lane, &mv, &mx);
            if (lane == 0) {
                sl.sf = gs;
                sl.of = go;
                sl.sh = sh;
                sl.oh = oh;
                sl.budget = budget;
                sl.feasible = feasible;
                sl.fallback = fallback;
                sl.moved = mv;
                sl.max_move = mx;
            }
            __syncwarp();
        }
        /* the pending streams' rANS passes side by side */
        if (((pending >> lane) & 1u) && slots[lane].status == 0) {
            uint32_t pp;
            uint8_t *row = rows + (size_t)lane * p.row_stride;
            const uint32_t stt = k2 ? rans2_row(*k2, M, row, n, &pp) : rans_row(kt, row, n, &pp);
            slots[lane].state = stt;
            slots[lane].p = pp;
            slots[lane].used = 4u + (n - pp);
        }
        __syncwarp();
        /* the length check of stream.c */
        uint32_t next = 0;
        if (((pending >> lane) & 1u) && slots[lane].status == 0 && slots[lane].used > C) {
            enc_slot &sl = slots[lane];
            if (sl.mode == MODE_CHEAP) {
                sl.status = DQ_INTERNAL; /* cannot happen: profiles guarantee the cheapest fits */
            } else if (!sl.feasible || sl.retries >= ENC_MAX_RETRIES) {
                sl.mode = MODE_CHEAP;
            } else {
                sl.retries++;
                sl.budget -= (((int64_t)sl.used - (int64_t)C) * 8 + 8 * (int64_t)sl.retries) << 16;
                sl.mode = MODE_RETRY;
            }
            next = sl.status == 0 ? 1u << lane : 0u;
        }
        pending = __reduce_or_sync(DQCU_FULL, next);
        __syncwarp();
    }

    uint64_t agg_streams = 0, agg_retries = 0, agg_fallbacks = 0, agg_payload = 0, agg_moved = 0;
    uint32_t agg_max_payload = 0, agg_max_move = 0;
    for (uint32_t gi = 0; gi < gcount; gi++) {
        const enc_slot &sl = slots[gi];
        const size_t s = g0 + gi;
        const int32_t status = sl.status;
        if (status == STATUS_SKIP)
            continue;
        if (p.status && lane == 0)
            p.status[s] = status;
        if (status != 0)
            continue;
        const uint8_t *row = rows + (size_t)gi * p.row_stride;
        /* the record: fp16 s, fp16 o, state (LE), emitted bytes, zeros */
        uint8_t *rec = record_of(p, tb, kind, s);
        const uint32_t sh = sl.sh, oh = sl.oh, state = sl.state, pp = sl.p, emitted = n - sl.p;
        for (uint32_t b = lane; b < 4u + C; b += 32) {
            uint32_t v;
            if (b < 4)
                v = record_head_byte(sh, oh, b);
            else if (b < 8)
                v = state >> (8 * (b - 4));
            else if (b - 8 < emitted)
                v = row[pp + (b - 8)];
            else
                v = 0;
            rec[b] = (uint8_t)v;
        }
        if (want_stats) {
            agg_streams++;
            agg_retries += sl.retries > 0;
            agg_fallbacks += (uint64_t)sl.fallback;
            agg_payload += sl.used;
            agg_max_payload = max(agg_max_payload, sl.used);
            agg_moved += sl.moved;
            agg_max_move = max(agg_max_move, sl.max_move);
        }
    }
    if (want_stats && lane == 0 && agg_streams) {
        dq_encode_stats *st = p.stats;
        atomicAdd((unsigned long long *)&st->streams, (unsigned long long)agg_streams);
        atomicAdd((unsigned long long *)&st->retries, (unsigned long long)agg_retries);
        atomicAdd((unsigned long long *)&st->fallbacks, (unsigned long long)agg_fallbacks);
        atomicAdd((unsigned long long *)&st->payload_bytes, (unsigned long long)agg_payload);
        atomicAdd((unsigned long long *)&st->symbols_moved, (unsigned long long)agg_moved);
        atomicMax(&st->max_payload_bytes, agg_max_payload);
        atomicMax(&st->max_move, agg_max_move);
    }
}

/* ---- launchers ---- */

/* How the streams of one kind are spread over warps. A warp takes G streams (as many as its level
 * rows hold) and a block of ENC_WARPS warps runs for about G stream times, so a plain grid of
 * count / G warps ends with a partial wave of blocks that runs alone: 262,144 streams at G = 11 are
 * 15.05 waves of the H200's 1,584 resident warps, and the last 0.05 of a wave costs a whole block
 * time. enc_plan keeps G for the bulk and shares the rest out evenly over whole waves: what lies
 * past the last full wave but one goes to two waves of warps with Gt or Gt + 1 (<= G) streams each,
 * a call of less than one wave to one wave of every resident warp. Blocks start in index order, so
 * the smaller groups run last. resident = warps the GPU runs at once (0: unknown, plain grid);
 * plain: the plain grid (dqcu_settings.encode_schedule). Returns the warps per kind. */
static size_t enc_plan(enc_params &p, size_t resident, bool plain)
{
    const size_t G = p.G, S = p.count, wave = resident * G;
    p.bulk_warps = (S + G - 1) / G;
    p.Gt = p.G;
    p.Gt_more = 0;
    if (resident == 0 || plain || S % wave == 0)
        return p.bulk_warps;
    const size_t full = S / wave;
    p.bulk_warps = full == 0 ? 0 : (full - 1) * resident;
    const size_t rest = S - p.bulk_warps * G; /* < 2 waves, or < 1 wave when full == 0 */
    const size_t warps = std::min(rest, full == 0 ? resident : 2 * resident);
    p.Gt = (uint32_t)(rest / warps); /* Gt + 1 <= G */
    p.Gt_more = (uint32_t)(rest % warps);
    return p.bulk_warps + warps;
}

template <int VPL, int VER>
static int launch_encode_kernel(const dqcu_codec *dc, const enc_params &p0, unsigned gy, cudaStream_t stream)
{
    const size_t tab_bytes = (sizeof(enc_tab) + 15) & ~(size_t)15;
    const size_t smem = tab_bytes + ENC_WARPS * enc_warp_bytes(p0.G, p0.row_stride, 128u * VPL);
    if (smem > dc->smem_optin)
        return DQ_UNSUPPORTED;
    DQCU_CHECK(cudaFuncSetAttribute(encode_kernel<VPL, VER>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    DQCU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, encode_kernel<VPL, VER>, ENC_WARPS * 32, smem));
    enc_params p = p0;
    const size_t warps = enc_plan(p, (size_t)per_sm * (size_t)dc->sm_count * ENC_WARPS,
                                  dc->settings.encode_schedule == DQCU_SCHEDULE_PLAIN);
    const size_t blocks = (warps + ENC_WARPS - 1) / ENC_WARPS;
    if (blocks > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    dim3 grid((unsigned)blocks, gy);
    encode_kernel<VPL, VER><<<grid, ENC_WARPS * 32, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

/* Version VER for the stream length of dc (encode_cuda.cu has set p.G and p.row_stride). */
template <int VER>
static int enc_launch(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream)
{
    return enc_for_vpl(dc->n,
                       [&](auto vpl) { return launch_encode_kernel<decltype(vpl)::value, VER>(dc, p, gy, stream); });
}

#endif
