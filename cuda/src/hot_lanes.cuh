/* The hot layout's lanes (dquant/hot.h) as the GPU kernels take them apart: where a code's bits
 * sit, a token's group of codes gathered and stored (the transcoders), a code read back (the
 * rebuild), the tensor-core operands made from code words and the grid's rows of blocks (the
 * attention kernels). Host and
 * device: tests/cuda/emu_hot.cpp compiles this header for the CPU and checks every function
 * against libdquant's layout on every code width, without a GPU; the three PTX instructions
 * used here have exact C equivalents on the host (dqcu_hot_prmt, dqcu_and_or, dqcu_sub_f16x2). */
#ifndef DQCU_HOT_LANES_CUH
#define DQCU_HOT_LANES_CUH

#include <stddef.h>
#include <stdint.h>
#ifndef __CUDA_ARCH__
#include <math.h>
#include <string.h>
#endif
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#ifdef __CUDACC__
#define DQCU_HD_INLINE __host__ __device__ __forceinline__
#else
#define DQCU_HD_INLINE static inline
#endif
#ifdef __CUDA_ARCH__
#define DQCU_UNROLL _Pragma("unroll")
#else
#define DQCU_UNROLL
#endif

/* __byte_perm: byte i of the result is byte (s >> 4i) & 7 of {b, a} (a bytes 0..3). (No sign
 * mode: the selectors used here are 0..7.) */
DQCU_HD_INLINE uint32_t dqcu_hot_prmt(uint32_t a, uint32_t b, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, s);
#else
    const uint64_t ab = (uint64_t)a | (uint64_t)b << 32;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((ab >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

/* (x & M) | c in one LOP3 (c in a register, so that the compiler cannot split the two constants). */
template <uint32_t M>
DQCU_HD_INLINE uint32_t dqcu_and_or(uint32_t x, uint32_t c)
{
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(M), "r"(c));
    return r;
#else
    return (x & M) | c;
#endif
}

#ifndef __CUDA_ARCH__
/* An fp16 value's float, and a float rounded to the nearest fp16 (ties to even; no NaN here):
 * the host's sub.rn.f16x2. */
static inline float dqcu_f16_float(uint32_t h)
{
    const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
    const float v = e ? ldexpf((float)(1024u + m), (int)e - 25) : ldexpf((float)m, -24);
    return (h & 0x8000u) ? -v : v;
}

static inline uint32_t dqcu_float_f16(float x)
{
    uint32_t f;
    memcpy(&f, &x, sizeof f);
    const uint32_t sign = (f >> 16) & 0x8000u, m = f & 0x7fffffu;
    const int e = (int)((f >> 23) & 0xffu) - 112; /* the fp16 exponent field */
    if (e >= 31)
        return sign | 0x7c00u;
    if (e <= 0) { /* subnormal or zero */
        if (e < -10)
            return sign;
        const uint32_t mm = m | 0x800000u, shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
        uint32_t r = mm >> shift;
        const uint32_t rem = mm & ((1u << shift) - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return sign | r;
    }
    uint32_t h = sign | (uint32_t)e << 10 | m >> 13;
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry out of the mantissa raises the exponent, as it should */
    return h;
}
#endif

/* The two fp16 halves of a·b + c, rounded to nearest even (the host computes in float and
 * rounds once more: exact wherever a·b + c is an fp16 value, the only use here). */
DQCU_HD_INLINE uint32_t dqcu_fma_f16x2(uint32_t a, uint32_t b, uint32_t c)
{
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    uint32_t r = 0;
    for (int h = 0; h < 2; h++) {
        const uint32_t s = 16u * (uint32_t)h;
        r |= dqcu_float_f16(fmaf(dqcu_f16_float((a >> s) & 0xffffu), dqcu_f16_float((b >> s) & 0xffffu),
                                 dqcu_f16_float((c >> s) & 0xffffu)))
             << s;
    }
    return r;
#endif
}
/* The two fp16 halves of a minus those of b, rounded to nearest even. */
DQCU_HD_INLINE uint32_t dqcu_sub_f16x2(uint32_t a, uint32_t b)
{
#ifdef __CUDA_ARCH__
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    uint32_t r = 0;
    for (int h = 0; h < 2; h++)
        r |= dqcu_float_f16(dqcu_f16_float((a >> (16 * h)) & 0xffffu) - dqcu_f16_float((b >> (16 * h)) & 0xffffu))
             << (16 * h);
    return r;
#endif
}

/* Where bit e of code k sits among the b units (U bits each) of one lane: lib/src/hot.c code_bit,
 * the layout of dquant/hot.h (keys: byte lanes, U = 8; values: half-words, U = 16). */
DQCU_HD_INLINE void dqcu_hot_code_bit(uint32_t b, uint32_t U, uint32_t k, uint32_t e, uint32_t &unit, uint32_t &bit)
{
    const uint32_t q = U / b, r = U - q * b;
    if (k < q * b) {
        unit = k / q;
        bit = b * (k % q) + e;
    } else {
        const uint32_t u = (k - q * b) * b + e;
        unit = u / r;
        bit = q * b + u % r;
    }
}

/* A token's codes of one group (32 channels) of a kind, gathered before they are stored: keys as
 * b words (byte lanes), values as 2b half-words (units b·h .. b·h + b - 1 for channels 16h ..). */
struct dqcu_hot_group {
    uint32_t w[16];
};

DQCU_HD_INLINE void dqcu_hot_group_clear(dqcu_hot_group &g)
{
    DQCU_UNROLL
    for (int i = 0; i < 16; i++)
        g.w[i] = 0;
}

/* Adds code m of channel c (0..31) of the group. */
DQCU_HD_INLINE void dqcu_hot_group_put(dqcu_hot_group &g, int kind, uint32_t b, uint32_t c, uint32_t m)
{
    for (uint32_t e = 0; e < b; e++) {
        uint32_t unit, bit;
        if (kind == 0) {
            dqcu_hot_code_bit(b, 8, c / 4u, e, unit, bit);
            bit += 8u * (c % 4u);
        } else {
            dqcu_hot_code_bit(b, 16, c % 16u, e, unit, bit);
            unit += b * (c / 16u);
        }
        g.w[unit] |= ((m >> e) & 1u) << bit;
    }
}

/* Stores group grp of token t (W tokens a window) into a kind's codes. */
DQCU_HD_INLINE void dqcu_hot_group_store(const dqcu_hot_group &g, uint32_t *codes, int kind, uint32_t b, uint32_t W,
                                         uint32_t grp, uint32_t t)
{
    if (kind == 0) {
        for (uint32_t i = 0; i < b; i++)
            codes[((size_t)grp * b + i) * W + t] = g.w[i];
    } else {
        const uint32_t P = (W + 1) / 2;
        uint16_t *h = (uint16_t *)(void *)codes;
        for (uint32_t i = 0; i < 2 * b; i++) {
            const size_t at = 2 * (((size_t)grp * 2 * b + i) * P + t / 2) + t % 2;
            h[at] = (uint16_t)g.w[i];
            if (W % 2 && t + 1 == W) /* an odd window's missing token W: zero codes */
                h[at + 1] = 0;
        }
    }
}

/* The code of channel j of token t of a kind (codes: that kind's words). */
DQCU_HD_INLINE uint32_t dqcu_hot_code(const uint32_t *codes, int kind, uint32_t b, uint32_t W, uint32_t t, uint32_t j)
{
    const uint32_t grp = j / 32u, c = j % 32u;
    uint32_t m = 0;
    for (uint32_t e = 0; e < b; e++) {
        uint32_t unit, bit;
        size_t word;
        if (kind == 0) {
            dqcu_hot_code_bit(b, 8, c / 4u, e, unit, bit);
            bit += 8u * (c % 4u);
            word = ((size_t)grp * b + unit) * W + t;
        } else {
            dqcu_hot_code_bit(b, 16, c % 16u, e, unit, bit);
            bit += 16u * (t % 2u);
            word = ((size_t)grp * 2 * b + b * (c / 16u) + unit) * ((W + 1) / 2) + t / 2;
        }
        m |= ((codes[word] >> bit) & 1u) << e;
    }
    return m;
}

/* Code k of every lane of the b units w[0..B) (dquant/hot.h; U = 8: byte lanes, a key's four
 * channels 4k .. 4k + 3 as the four bytes; U = 16: half-word lanes, a value channel's codes of a
 * token pair as the two halves), times 2^S at bit 0 of each lane (S = 1 for fp16's 512 + m: 2m
 * in the mantissa, exact for the half-integer centres c = (M - 1) / 2). k is a compile-time
 * constant after unrolling, so this is a shift and a mask (k < q·B) or a few (pooled codes). */
template <int B, int U, int S = 0>
DQCU_HD_INLINE uint32_t hot_lane_code(const uint32_t (&w)[B], int k)
{
    constexpr uint32_t lanes = U == 8 ? 0x01010101u : 0x00010001u;
    constexpr int q = U / B, r = U - q * B > 0 ? U - q * B : 1; /* (r: 1 where no code is pooled) */
    if (k < q * B) {
        const int sh = B * (k % q) - S;
        const uint32_t x = sh >= 0 ? w[k / q] >> (sh & 31) : w[k / q] << (-sh & 31);
        return x & ((((1u << B) - 1u) << S) * lanes);
    }
    uint32_t m = 0;
    DQCU_UNROLL
    for (int e = 0; e < B; e++) {
        const int u = (k - q * B) * B + e; /* pool bit u: q·B + u % r of unit u / r, >= B + 0 > e */
        m |= (w[u / r] >> (q * B + u % r - e - S)) & (lanes << (e + S));
    }
    return m;
}

/* (512 + x / 2) - c2 for the fp16 halves: x holds twice the codes at bits 0 and 16 (S = 1 above),
 * c2 = (512 + c) twice; exact, fp16's step at 512 being 1/2. */
DQCU_HD_INLINE uint32_t hot_half_pair(uint32_t x, uint32_t c2)
{
    return dqcu_sub_f16x2(x | 0x60006000u, c2);
}

/* Channels 4k .. 4k + 3 of a key group's words w as the fp16x2 pairs (m - c) of channels (0, 1)
 * and (2, 3): the key MMA's a0/a2 (a1/a3) registers. c2 = (512 + c) in both halves. (B <= 7: 2m
 * fits a byte.) */
template <int B>
DQCU_HD_INLINE void hot_key_pairs(const uint32_t (&w)[B], int k, uint32_t c2, uint32_t &p01, uint32_t &p23)
{
    const uint32_t x = hot_lane_code<B, 8, 1>(w, k);
    p01 = hot_half_pair(dqcu_hot_prmt(x, 0u, 0x4140), c2);
    p23 = hot_half_pair(dqcu_hot_prmt(x, 0u, 0x4342), c2);
}

/* Value channel k's pair (both tokens of a half-word lane) as the warp kernel's operand: the fp16
 * subnormals 2·(m - c)·2^-24 = (2m - (M - 1))·2^-24, exact (one shift, one mask, one subtraction;
 * cm = M - 1 in both halves). Centred, so that the accumulator holds Σ w·(m - c), not a large
 * Σ w·m the offset would have to cancel. */
template <int B>
DQCU_HD_INLINE uint32_t hot_value_operand(const uint32_t (&w)[B], int k, uint32_t cm)
{
    return dqcu_sub_f16x2(hot_lane_code<B, 16, 1>(w, k), cm);
}

/* The warp kernel's value operands, read in place: code k's pair as the fp16 subnormals
 * (m - c)·2^(p' - 24) (c = (M - 1) / 2) for a code at bit p' >= 1 of its half-word (a mask and
 * one subtraction of (M - 1)·2^(p' - 1)), or (2m - (M - 1))·2^-24 for p' = 0 (a mask and one
 * fma). A code that fits below bit 10 (fp16's mantissa: p + B <= 10) stays where it is
 * (p' = p); the others are read after one shift of their word right by P1 - 1 (P1 =
 * hot_value_p1: the first position that does not fit), which puts them at
 * p' = p - P1 + 1 <= 10 - B. The operand is 2(m - c)·2^(z - 24), z = hot_value_scale(k): the
 * kernel's accumulator row of code k carries 2^z, taken off at the end. Against
 * hot_value_operand: one shift a word instead of one a code. Pooled codes (k >= q·B) are
 * hot_value_operand's, z = 0. */
template <int B>
DQCU_HD_INLINE constexpr int hot_value_p1()
{
    return B * ((10 - B) / B + 1);
}
template <int B>
DQCU_HD_INLINE constexpr int hot_value_scale(int k)
{
    return k >= (16 / B) * B              ? 0
           : B * (k % (16 / B)) + B <= 10 ? (k % (16 / B) == 0 ? 0 : B * (k % (16 / B)) - 1)
                                          : B * (k % (16 / B)) - hot_value_p1<B>();
}
/* cm = M - 1 in both halves (as hot_value_operand), ncm = cm with both signs set. */
template <int B>
DQCU_HD_INLINE uint32_t hot_value_operand_scaled(const uint32_t (&w)[B], int k, uint32_t cm, uint32_t ncm)
{
    constexpr int q = 16 / B, P1 = hot_value_p1<B>();
    constexpr uint32_t mask = ((1u << B) - 1u) * 0x00010001u;
    if (k >= q * B)
        return hot_value_operand<B>(w, k, cm);
    const int p = B * (k % q);
    if (p + B <= 10)
        return p == 0 ? dqcu_fma_f16x2(w[k / q] & mask, 0x40004000u, ncm) /* 2x - (M - 1) */
                      : dqcu_sub_f16x2(w[k / q] & (mask << p), cm << (p - 1));
    const int pp = p - P1 + 1;
    return dqcu_sub_f16x2((w[k / q] >> (P1 - 1)) & (mask << pp), cm << (pp - 1));
}
/* A softmax weight w as the value product's B operand pair: fp16 hi = rn(w) in the low half
 * (column 2h), lo = rn(w - hi) in the high half (column 2h + 1). */
DQCU_HD_INLINE uint32_t hot_weight_pair(float w)
{
#ifdef __CUDA_ARCH__
    const __half2 hl = __floats2half2_rn(w, w - __half2float(__float2half_rn(w)));
    return *(const uint32_t *)(const void *)&hl;
#else
    const uint32_t hi = dqcu_float_f16(w);
    return hi | dqcu_float_f16(w - dqcu_f16_float(hi)) << 16;
#endif
}
/* The warp kernel's integer scores (attend_hot.cu): a rotated query value y, scaled by up =
 * 2^(19 - e) (|y| < 2^e), rounded to Q (|Q| <= 2^19) and split into balanced base-128 digits,
 * Q = 2^14·hi + 2^7·mid + lo with |hi| <= 33 and mid, lo in [-64, 63] (twice each fits an s8). */
DQCU_HD_INLINE void hot_query_digits(float y, float up, int &hi, int &mid, int &lo)
{
#ifdef __CUDA_ARCH__
    const int q = __float2int_rn(y * up);
#else
    const int q = (int)lrintf(y * up); /* round to nearest even, as __float2int_rn */
#endif
    lo = ((q + 64) & 127) - 64;
    const int q1 = (q - lo) >> 7; /* exact: q - lo is a multiple of 128 */
    mid = ((q1 + 64) & 127) - 64;
    hi = (q1 - mid) >> 7;
}

/* The three exact integer products D = Σ digit·(2m - (M - 1)) combined exactly in integers and
 * rounded once to fp32: 2^14·D_hi + 2^7·D_mid + D_lo = 2^(20 - e)·Σ q'·(m - c). No overflow for
 * 128 channels of codes up to 4 bits: |D_hi| <= 33·15·128, |D_mid|, |D_lo| <= 64·15·128, so the sum
 * stays below 1.07e9 < 2^31. */
DQCU_HD_INLINE float hot_digit_dot(int d_hi, int d_mid, int d_lo)
{
    return (float)(16384 * d_hi + 128 * d_mid + d_lo);
}

/* The warp kernel's tile geometry (attend_hot.cu): lane (g, t) of a warp holds tokens g and g + 8
 * of a 16-token sub-tile and HL heads h = HL·t + e (HL = 1 for G <= 4, 2 for G = 8).
 * The score product S^T = K·Q^T's B operand (the query digits) has, for G <= 4, head h's hi digit
 * in column 2h of n-tile 0, its mid in column 2h + 1, its lo in column 2h of n-tile 1 (column
 * 2h + 1 zero); for G = 8 digit s of head h in column h of n-tile s. hot_score_column says which
 * digit dg (0 hi, 1 mid, 2 lo) of which head h column n (0..7) of n-tile s holds: false for a
 * zero column. */
DQCU_HD_INLINE bool hot_score_column(int G, int s, uint32_t n, uint32_t &dg, uint32_t &h)
{
    if (G <= 4) {
        h = n >> 1;
        dg = s == 0 ? (n & 1u) : 2u;
        return h < (uint32_t)G && !(s == 1 && (n & 1u));
    }
    h = n;
    dg = (uint32_t)s;
    return n < (uint32_t)G;
}

/* Lane (g, t)'s score of head e and token g + 8r, combined from its C fragments (C[s] of score
 * n-tile s: c0, c1 row g, columns 2t, 2t + 1; c2, c3 row g + 8): hot_digit_dot of the hi, mid
 * and lo products. */
template <int G>
DQCU_HD_INLINE float hot_tile_dot(const int (&C)[G <= 4 ? 2 : 3][4], int r, int e)
{
    if (G <= 4)
        return hot_digit_dot(C[0][2 * r], C[0][2 * r + 1], C[1][2 * r]);
    return hot_digit_dot(C[0][2 * r + e], C[1][2 * r + e], C[2][2 * r + e]);
}

/* The weights' transpose buffer of a warp (fp16, DQCU_HOT_PSTR a column: conflict-free stores and
 * loads): lane (g, t) writes its weight of head e and token g + 8r as hi to column 2t, lo to
 * column 2t + 1 of value n-tile e; the value product's B fragment of lane (g, t) is column g,
 * tokens 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1). */
#define DQCU_HOT_PSTR 24
DQCU_HD_INLINE uint32_t hot_pt_at(int e, uint32_t col, uint32_t tok)
{
    return ((uint32_t)e * 8u + col) * DQCU_HOT_PSTR + tok;
}

/* The warp kernel's ring stage (attend_hot.cu, hw_stage_bytes): the key codes, 4·B_K rows of 16
 * words (one word a token), then the value codes, 8·B_V rows of 8 words (one word a token pair),
 * then the (s, o) pairs. Key row 4i + t holds word i of channel group t; its four 16-byte chunks
 * hold tokens 4c .. 4c + 3 at chunk c ^ 2·(t >> 1). Value row 8i + g holds word i of the lane rows
 * g (group g / 2, channels 16·(g % 2) ..); its two chunks hold token pairs 4c .. 4c + 3 at chunk
 * c ^ (g >> 2). So the kernel's loads are free of bank conflicts: lane (g, t) reads key word i of
 * tokens g and g + 8 (32 lanes, 32 banks) and value word i of pairs t and t + 4 (run 118: the
 * plain order had 2-way conflicts on the keys, 2- to 4-way on the values; 29% of the shared
 * wavefronts). */
/* The stage word (from the stage's start) of key word i of channel group t, token tok (0..15). */
DQCU_HD_INLINE uint32_t hot_stage_key_at(uint32_t t, uint32_t i, uint32_t tok)
{
    return (4u * i + t) * 16u + 4u * ((tok >> 2) ^ (2u * ((t >> 1) & 1u))) + (tok & 3u);
}
/* The stage word (from the value codes' start) of value word i of lane row g, token pair pr (0..7). */
DQCU_HD_INLINE uint32_t hot_stage_value_at(uint32_t g, uint32_t i, uint32_t pr)
{
    return (8u * i + g) * 8u + 4u * ((pr >> 2) ^ ((g >> 2) & 1u)) + (pr & 3u);
}
/* What the stage's 16-byte chunk q of the key codes (q < 16·B_K) holds: word i of group t, tokens
 * 4c .. 4c + 3; of the value codes (q < 16·B_V from theirs): word i of lane row g, pairs 4c ... */
DQCU_HD_INLINE void hot_stage_key_chunk(uint32_t q, uint32_t &t, uint32_t &i, uint32_t &c)
{
    t = (q >> 2) & 3u;
    i = q >> 4;
    c = (q & 3u) ^ (2u * ((t >> 1) & 1u));
}
DQCU_HD_INLINE void hot_stage_value_chunk(uint32_t q, uint32_t &g, uint32_t &i, uint32_t &c)
{
    g = (q >> 1) & 7u;
    i = q >> 4;
    c = (q & 1u) ^ ((g >> 2) & 1u);
}
/* The hot kernels' grid (attend_hot.cu): a sequence's rows of blocks are nsplit·nhg window blocks
 * (split i, head group j at row i·nhg + j: KV heads [j·hpb, (j + 1)·hpb)) and kv_heads blocks
 * of the BF16 tail (split nsplit, one KV head each), the tail's from row tail0: 0 (first) or
 * nsplit·nhg (after every window block; blocks are dispatched in grid order). */
DQCU_HD_INLINE uint32_t hot_grid_rows(uint32_t nsplit, uint32_t nhg, uint32_t kv_heads)
{
    return nsplit * nhg + kv_heads;
}

/* What row y attends: split (nsplit: the tail) and KV heads [kv0, kv1). */
DQCU_HD_INLINE void hot_block_role(uint32_t nsplit, uint32_t nhg, uint32_t hpb, uint32_t kv_heads, uint32_t tail0,
                                   uint32_t y, uint32_t &split, uint32_t &kv0, uint32_t &kv1)
{
    if (y >= tail0 && y < tail0 + kv_heads) {
        split = nsplit;
        kv0 = y - tail0;
        kv1 = kv0 + 1;
        return;
    }
    const uint32_t w = y < tail0 ? y : y - kv_heads;
    split = w / nhg;
    kv0 = (w % nhg) * hpb;
    kv1 = kv0 + hpb;
}

#endif
