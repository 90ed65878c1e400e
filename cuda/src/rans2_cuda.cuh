/* Format version 2 on the device (lib/src/rans2.h: joint two-symbol rANS at 12-bit precision).
 *
 * The tables are lib's (dq__rans2_tables, built from the profile when the host codec is made),
 * repacked on the host by dqcu_codec_create and uploaded beside the version-1 tables. The decoder
 * is version 1's reader (rans_cuda.cuh) with a pair step: a step reads at most 2 bytes, so a group
 * of 4 levels (2 pairs) reads at most 4, which is what dqcu_rans_refill keeps in the window before
 * each group. Every kernel that decodes or encodes levels takes both versions through the helpers
 * here (decode: a group of 4 levels at a time; encode: one pair or one level at a time). */
#ifndef DQCU_RANS2_CUDA_CUH
#define DQCU_RANS2_CUDA_CUH

#include "rans_cuda.cuh"

#define DQCU_RANS2_TOTAL DQ_RANS2_TOTAL
#define DQCU_RANS2_PAIRS DQ_RANS2_MAX_PAIRS
/* the container attention takes version 2 with at most this many levels per kind (2·m in a nibble) */
#define DQCU_RANS2_ATT_MAX_LEVELS 8u

/* One kind's version-2 tables in device memory. */
struct dqcu_rans2_kind {
    /* decoder, per state slot z = x & 4095: (z - c) | f << 12 (f <= 4093: 12 bits each) */
    uint32_t dec[DQCU_RANS2_TOTAL];
    /* the pair of slot z: m1 | m2 << 8 */
    uint16_t sym[DQCU_RANS2_TOTAL];
    /* the container attention's entry of slot z (attend_v7.cu), for M <= 8 (else zeros):
     * (z - c) | f << 12 | (2·m1 | 2·m2 << 4) << 24 */
    uint32_t att[DQCU_RANS2_TOTAL];
    /* encoder, per pair s = m1·M + m2: x_max = 2^19·f, magic, 4096 - f, cum | shift << 16, with
     * x / f == (x · magic) >> shift for every x < 2^31 (as version 1's dqcu_kind_tab::enc) */
    uint4 enc[DQCU_RANS2_PAIRS];
    /* the drift's pair costs (lib's pair_cost, pair_cost_q16) and the cheapest pair (cheap) */
    float cost[DQCU_RANS2_PAIRS];
    int32_t cost_q16[DQCU_RANS2_PAIRS];
    uint32_t cheap[2];
};

struct dqcu_rans2_tables {
    dqcu_rans2_kind kind[2];
};

/* Bytes of shared memory a decoder of either version stages its tables in. */
__host__ __device__ static inline size_t dqcu_dec_smem(bool pairs)
{
    return pairs ? DQCU_RANS2_TOTAL * (sizeof(uint32_t) + sizeof(uint16_t)) : 256u * sizeof(uint32_t);
}

/* The decode tables of one kind staged in shared memory (smem: dqcu_dec_smem bytes, 4-aligned):
 * version 1's 256 entries, or version 2's state and pair tables. Ends with __syncthreads. */
struct dqcu_dtab {
    const uint32_t *st;
    const uint16_t *sy; /* version 2 only */
};

__device__ __forceinline__ dqcu_dtab dqcu_dec_stage(bool pairs, unsigned char *smem, const dqcu_kind_tab &kt,
                                                    const dqcu_rans2_kind *k2)
{
    dqcu_dtab t;
    uint32_t *st = (uint32_t *)(void *)smem;
    t.st = st;
    t.sy = nullptr;
    if (pairs) {
        uint16_t *sy = (uint16_t *)(void *)(smem + DQCU_RANS2_TOTAL * sizeof(uint32_t));
        for (uint32_t i = threadIdx.x; i < DQCU_RANS2_TOTAL; i += blockDim.x) {
            st[i] = k2->dec[i];
            sy[i] = k2->sym[i];
        }
        t.sy = sy;
    } else {
        for (uint32_t i = threadIdx.x; i < 256; i += blockDim.x)
            st[i] = kt.dec[i];
    }
    __syncthreads();
    return t;
}

/* One pair step (rans2.c dq__rans2_decode): x = f·(x >> 12) + (z - c), then up to two bytes while
 * x < L (after the update x >= 2^11, after one byte >= 2^19, after two >= 2^27). Reads only the
 * window (lo, hi) at idx, idx + 1 (both < 8 when idx <= 5 on entry). Returns m1 | m2 << 8. */
__device__ __forceinline__ uint32_t dqcu_rans2_step(uint32_t &x, const dqcu_dtab &t, dqcu_rans_in &in)
{
    const uint32_t z = x & (DQCU_RANS2_TOTAL - 1u);
    const uint32_t e = t.st[z];
    const uint32_t xn = (e >> 12) * (x >> 12) + (e & 0xfffu);
    const bool n1 = xn < DQCU_RANS_L;
    const uint32_t b1 = dqcu_prmt(in.lo, in.hi, in.idx);
    const uint32_t x1 = n1 ? dqcu_prmt(xn, b1, 0x2104u) : xn; /* (xn << 8) | byte */
    in.idx += n1 ? 1u : 0u;
    const bool n2 = x1 < DQCU_RANS_L;
    const uint32_t b2 = dqcu_prmt(in.lo, in.hi, in.idx);
    x = n2 ? dqcu_prmt(x1, b2, 0x2104u) : x1;
    in.idx += n2 ? 1u : 0u;
    return t.sy[z];
}

/* The next 4 levels of a stream (level i in byte i), either version; refills the window first. */
template <bool PAIRS>
__device__ __forceinline__ uint32_t dqcu_dec_quad(uint32_t &x, const dqcu_dtab &t, dqcu_rans_in &in)
{
    dqcu_rans_refill(in);
    if (PAIRS) {
        const uint32_t a = dqcu_rans2_step(x, t, in);
        const uint32_t b = dqcu_rans2_step(x, t, in);
        return a | b << 16;
    }
    uint32_t q = 0;
#pragma unroll
    for (int u = 0; u < 4; u++)
        q |= (dqcu_rans_step(x, t.st, in) >> 17) << (8 * u);
    return q;
}

/* Whether a decoded stream is invalid (lib's dq__rans_decode / dq__rans2_decode verdict, the same
 * for both versions): an initial state out of range, a read past the container, a final state other
 * than L, or a nonzero byte after the last one read. */
__device__ __forceinline__ bool dqcu_dec_bad(bool valid_state, uint32_t x, const dqcu_rans_in &in,
                                             const uint8_t *container, uint32_t C)
{
    if (!valid_state)
        return true;
    const uint32_t pos = dqcu_rans_pos(in, container);
    bool bad = pos > C || x != DQCU_RANS_L;
    for (uint32_t i = pos; !bad && i < C; i++)
        bad = container[i] != 0;
    return bad;
}

/* One encoder step of either version (rans.c, rans2.c) with the table entry e of the symbol (a
 * level, or a pair m1·M + m2): the bytes emitted while x >= x_max (version 1: at most one, version
 * 2: at most two), in emission order in bytes[0..), then the update. Returns how many. */
__device__ __forceinline__ uint32_t dqcu_enc_step(uint32_t &x, const uint4 e, uint8_t bytes[2])
{
    uint32_t k = 0;
    while (x >= e.x) {
        bytes[k++] = (uint8_t)x;
        x >>= 8;
    }
    const uint32_t q = (uint32_t)(((unsigned long long)x * e.y) >> (e.w >> 16));
    x = x + q * e.z + (e.w & 0xffffu);
    return k;
}

#endif
