/* Device rANS decoder, one stream per thread (DESIGN §2.3; lib/src/rans.c dq__rans_decode).
 *
 * Branch-free: the container is seen through a window of two aligned words (lo, hi) plus one word
 * prefetched (nxt); the next byte is byte idx (0..7) of the window, picked with one PRMT. Each
 * symbol consumes at most one byte, so the window is advanced (at most one word) before every group
 * of 4 symbols, with a predicated load. Reads stay inside [record, container end): the first word
 * starts at most 3 bytes before the container, inside the record's fp16 s/o; words past the last
 * whole word of the container come from tailw (its last partial word, read byte by byte once, bytes
 * past the end zero) or are zero, exactly as the reference decoder treats bytes past the end. */
#ifndef DQCU_RANS_CUDA_CUH
#define DQCU_RANS_CUDA_CUH

#include "cuda_internal.cuh"

struct dqcu_rans_in {
    const uint32_t *w; /* container start rounded down to 4 bytes */
    uint32_t last;     /* index of the last word wholly inside the container */
    uint32_t tailw;    /* the word after it, bytes past the end zeroed */
    uint32_t m;        /* the window is words m, m + 1 */
    uint32_t idx;      /* next byte: byte idx of the window (byte position 4m + idx) */
    uint32_t lo, hi, nxt;
};

__device__ __forceinline__ uint32_t dqcu_rans_word(const dqcu_rans_in &in, uint32_t k)
{
    uint32_t v = k == in.last + 1u ? in.tailw : 0u;
    if (k <= in.last)
        v = __ldg(in.w + k);
    return v;
}

/* Opens a container of C >= 5 bytes whose 4 preceding bytes are readable (a record's s/o).
 * Returns the initial state. */
__device__ __forceinline__ uint32_t dqcu_rans_open(dqcu_rans_in &in, const uint8_t *container, uint32_t C)
{
    const uintptr_t a = (uintptr_t)container;
    const uint32_t off = (uint32_t)(a & 3u);
    const uint8_t *ab = (const uint8_t *)(a - off);
    const uint32_t end = off + C;
    in.w = (const uint32_t *)(const void *)ab;
    in.last = end / 4u - 1u;
    uint32_t t = 0;
    for (uint32_t b = 0; b < (end & 3u); b++)
        t |= (uint32_t)__ldg(ab + (end & ~3u) + b) << (8 * b);
    in.tailw = t;
    in.lo = dqcu_rans_word(in, 0);
    in.hi = dqcu_rans_word(in, 1);
    in.nxt = dqcu_rans_word(in, 2);
    in.m = 0;
    const uint32_t sel = off | (off + 1u) << 4 | (off + 2u) << 8 | (off + 3u) << 12;
    in.idx = off + 4u;
    return __byte_perm(in.lo, in.hi, sel);
}

/* Before each group of 4 symbols: keep idx < 4 so the group's bytes are in the window. */
__device__ __forceinline__ void dqcu_rans_refill(dqcu_rans_in &in)
{
    const bool adv = in.idx >= 4u;
    const uint32_t k = in.m + 3u;
    uint32_t v = k == in.last + 1u ? in.tailw : 0u;
    if (adv && k <= in.last)
        v = __ldg(in.w + k);
    in.lo = adv ? in.hi : in.lo;
    in.hi = adv ? in.nxt : in.hi;
    in.nxt = adv ? v : in.nxt;
    in.m += adv ? 1u : 0u;
    in.idx -= adv ? 4u : 0u;
}

/* PRMT with a selector the caller keeps clean (no masking of the selector). */
__device__ __forceinline__ uint32_t dqcu_prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* One decode step with the GPU table entry e = (z - c) | f << 8 | (2m) << 16 of z = x & 255;
 * renormalizes with at most one byte. Returns e (the caller takes the level from it). The one step
 * of every reader (dqcu_rans_in, dqcu_rans_q): it reads only the window (lo, hi) and idx. */
template <typename In>
__device__ __forceinline__ uint32_t dqcu_rans_step(uint32_t &x, const uint32_t *tab, In &in)
{
    const uint32_t e = tab[x & 0xffu];
    const uint32_t f = dqcu_prmt(e, 0u, 0x4441u); /* byte 1 of e, zero-extended */
    const uint32_t xn = f * (x >> 8) + (e & 0xffu);
    const uint32_t bw = dqcu_prmt(in.lo, in.hi, in.idx); /* byte idx of the window in byte 0 */
    const uint32_t xs = dqcu_prmt(xn, bw, 0x2104u);      /* (xn << 8) | that byte */
    const bool need = xn < DQCU_RANS_L;
    x = need ? xs : xn;
    in.idx += need ? 1u : 0u;
    return e;
}

/* The same bytes through a deeper queue (attention v5). Above, the word loaded at an advance is
 * selected into the window at once (the select waits for the load: an L2 round trip at every
 * advance, since the records of a block's streams do not stay in L1 next to its shared memory).
 * Here the raw load of word m + 3 (address clamped to the container, so it needs no condition) is
 * only fixed up (tail word, zeros past the end) and moved into the window at the next advance,
 * about 12 symbols later. Same bytes, same symbols. */
struct dqcu_rans_q {
    const uint32_t *w;
    uint32_t last, tailw, m, idx;
    uint32_t lo, hi, n1; /* words m, m + 1, m + 2 */
    uint32_t n2;         /* raw load of word min(m + 3, last) */
};

__device__ __forceinline__ uint32_t dqcu_rans_q_open(dqcu_rans_q &in, const uint8_t *container, uint32_t C)
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

/* Before each group of 4 symbols, without a branch: the window shifts by a word where idx >= 4; the
 * raw word loaded at the previous advance is fixed up into n1; the next raw word is loaded under a
 * predicate. */
__device__ __forceinline__ void dqcu_rans_q_refill(dqcu_rans_q &in)
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

/* Byte position (relative to the container start) of the next byte the decoder would read. */
__device__ __forceinline__ uint32_t dqcu_rans_pos(const dqcu_rans_in &in, const uint8_t *container)
{
    const uint32_t off = (uint32_t)((uintptr_t)container & 3u);
    return 4u * in.m + in.idx - off;
}

#endif
