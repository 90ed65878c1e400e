/* Fused decode attention, version 6: v5 (attend_v5.cuh, same kernel template with PF = true) with
 * the container bytes staged into shared memory by cp.async on a fixed schedule. Included by
 * attend_v5.cuh before the kernel.
 *
 * Why: v5's reader loads the next container word from global memory into one register (n2) with a
 * predicated load at each advance, and reads that register in the next group of 4 symbols. The
 * scoreboard is per warp: in almost every group some lane of the warp advanced in the previous
 * group, so the whole warp waits an L2 round trip per group (stall_long_scoreboard) instead of
 * having the ~12 symbols of slack one lane's queue would give.
 *
 * Here each stream (thread t's key stream and value stream) has a ring of A6_R words in shared
 * memory, owned by thread t alone (slot s of thread t at word s · A5_T + t: conflict-free, and no
 * other thread ever touches it, so the ring needs no barrier). Per group of 4 symbols every decoding
 * thread, in this order:
 *   cp.async.wait_group A6_D     the groups committed A6_D + 1 or more groups ago have landed;
 *   refill                       v5's deferred window, the raw next word read from the ring
 *                                (ld.shared, consumed one group later) instead of global memory;
 *   fetch                        one cp.async (4 bytes) of its next word f into slot f % A6_R,
 *                                when f <= last and f + 4 <= m + A6_R; then commit_group.
 * No register is the destination of a global load in the inner loop, so no long scoreboard; a word
 * is read A6_D + 1 or more groups after its cp.async was committed.
 *
 * Correctness of the schedule (m = window word after the refill of group h, m <= h + 1 since at
 * most 4 bytes are consumed per group; the refill of group h reads word w = m + 3; f_h = next word
 * to fetch after group h). By induction f_h >= min(A6_P + 4 + h, m_h + A6_R - 3, last + 1) (prime:
 * words 3 .. A6_P + 2 at the tile's open, completed with wait_all; the fetch is either unthrottled,
 * +1, or throttled, f >= m + R - 3). At g = h - 1 - A6_D, m_g >= m_h - A6_D - 1, so f_g > w when
 * A6_R >= A6_D + 8 and A6_P >= A6_D + 2; for h <= A6_D, w <= A6_D + 4 <= A6_P + 2 was primed.
 * A fetch of word f overwrites word f - A6_R <= m - 4, read (and its register consumed) at least
 * 2 groups earlier. Words past `last` are never fetched nor read (tail word and zeros as v5).
 * Before a tile's prime the thread drains its cp.async (wait_all), so no write of the previous tile
 * lands after a prime write of the same slot; the kernel drains again before it exits.
 *
 * Numerics are v5's exactly: the same bytes reach the same decode step in the same order. */

#define A6_R 16 /* ring words per stream (power of two) */
#define A6_D 6  /* groups a cp.async has to land in (cp.async.wait_group A6_D) */
#define A6_P 8  /* words primed at a tile's open beyond the 3 held in registers */
static_assert(A6_R >= A6_D + 8 && A6_P >= A6_D + 2 && A6_P + 2 <= A6_R - 4 && (A6_R & (A6_R - 1)) == 0,
              "v6 ring schedule");

static size_t a6_smem_bytes(uint32_t QH, uint32_t d, uint32_t G)
{
    return a5_smem_bytes(QH, d, G) + 2 * (size_t)A6_R * A5_T * sizeof(uint32_t);
}

__device__ __forceinline__ void a6_cp4(uint32_t dst, const uint32_t *src, bool p)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t@q cp.async.ca.shared.global [%0], [%1], 4;\n\t}" ::"r"(dst),
                 "l"(src), "r"((uint32_t)p)
                 : "memory");
}
__device__ __forceinline__ void a6_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void a6_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
template <int N> __device__ __forceinline__ void a6_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

struct a6_rans_in {
    const uint32_t *w;
    uint32_t last, tailw, m, idx;
    uint32_t lo, hi, n1; /* words m, m + 1, m + 2 */
    uint32_t n2;         /* raw ring read of word m + 3 (fixed up at the next advance) */
    uint32_t f;          /* next word to fetch into the ring */
    uint32_t rs;         /* shared address of this stream's slot 0 (slot s: rs + 4 · s · A5_T) */
};

__device__ __forceinline__ uint32_t a6_slot(const a6_rans_in &in, uint32_t k)
{
    return in.rs + ((k & (A6_R - 1u)) * A5_T) * 4u;
}

/* Issues the prime of the ring (words 3 .. A6_P + 2 that are in the container) and opens the stream
 * as dqcu_rans_open; the caller commits and waits (wait_all) and then calls a6_rans_open_ring. */
__device__ __forceinline__ uint32_t a6_rans_open(a6_rans_in &in, const uint8_t *container, uint32_t C, uint32_t rs)
{
    const uintptr_t a = (uintptr_t)container;
    const uint32_t off = (uint32_t)(a & 3u);
    const uint32_t *w = (const uint32_t *)(const void *)(container - off);
    const uint32_t last = (off + C) / 4u - 1u;
    in.rs = rs;
#pragma unroll
    for (uint32_t k = 3; k <= A6_P + 2u; k++)
        a6_cp4(a6_slot(in, k), w + k, k <= last);
    in.f = min((uint32_t)A6_P + 3u, last + 1u);
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
    return x;
}

__device__ __forceinline__ uint32_t a6_lds(uint32_t addr)
{
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/* after the prime's wait_all: the raw word 3 */
__device__ __forceinline__ void a6_rans_open_ring(a6_rans_in &in)
{
    in.n2 = 3u <= in.last ? a6_lds(a6_slot(in, 3u)) : 0u;
}

/* v5's refill with the raw next word from the ring: the window shifts by a word where idx >= 4;
 * the raw word read at the previous advance is fixed up into n1; word m + 4 is read under a
 * predicate (only where it is in the container: every such word has landed, see above). */
__device__ __forceinline__ void a6_rans_refill(a6_rans_in &in)
{
    const bool adv = in.idx >= 4u;
    const uint32_t k = in.m + 3u;
    const uint32_t past = k == in.last + 1u ? in.tailw : 0u;
    const uint32_t fixed = k <= in.last ? in.n2 : past;
    in.lo = adv ? in.hi : in.lo;
    in.hi = adv ? in.n1 : in.hi;
    in.n1 = adv ? fixed : in.n1;
    const uint32_t addr = a6_slot(in, k + 1u);
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %2, 0;\n\t@p ld.shared.u32 %0, [%1];\n\t}"
                 : "+r"(in.n2)
                 : "r"(addr), "r"((uint32_t)(adv && k + 1u <= in.last))
                 : "memory");
    in.m += adv ? 1u : 0u;
    in.idx -= adv ? 4u : 0u;
}

/* after the refill (m is the new window): fetch word f when the ring has room for it */
__device__ __forceinline__ void a6_rans_fetch(a6_rans_in &in)
{
    const bool go = in.f <= in.last && in.f + 4u <= in.m + A6_R;
    a6_cp4(a6_slot(in, in.f), in.w + in.f, go);
    in.f += go ? 1u : 0u;
}

/* a4_rans_step on the ring reader (the same arithmetic) */
__device__ __forceinline__ uint32_t a4_rans_step(uint32_t &x, const uint32_t *tab, a6_rans_in &in)
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
