/* The hot layout on the GPU (dquant/hot.h): window records transcoded to fixed-width codes, byte
 * for byte what dq_hot_transcode writes.
 *
 * One block per (window, kind), a thread per token: the thread decodes its stream with the shared
 * rANS step (rans_cuda.cuh, the decoder of dqcu_decompress) and packs each group of 32 levels into
 * its b words as they come, so the words of consecutive tokens are written side by side (one
 * coalesced line per word index and warp). Block (w, 0) also copies the key-mean block and zeroes
 * its padding. Format version 2 (joint pairs) decodes its 4 levels at a time with the pair step
 * (rans2_cuda.cuh) and packs them the same way: its hot windows are version 1's. A transcode runs
 * once per window (when it is sealed or brought to the GPU tier); attention then never decodes
 * rANS.
 *
 * Fixed-width profiles (DQ_CODEC_FIXED) have their own kernel, a warp per token and a lane per
 * group of 32 levels: the lane reads the base-M groups (w bits each) its levels fall in, splits
 * them into levels by divisions by M and packs its group; a group worth M^k or more, or a set bit
 * past the groups, makes the container corrupt (lib/src/fixed_codec.c dq__fixed_unpack, whose
 * levels it writes). */
#include "hot_cuda.cuh"

#include "rans2_cuda.cuh"

#define HOT_THREADS 128

size_t dqcu__hot_offsets(const dqcu_codec *dc, size_t off[4])
{
    const size_t n = dc->n, W = dc->W, G = (n + 31) / 32;
    const size_t A = (2 + n + 15) & ~(size_t)15, CK = (A + 8 * W + 15) & ~(size_t)15;
    const size_t CV = CK + 4 * G * dqcu__hot_bits(dc->host.kind[0].M) * W; /* values by token pair */
    if (off) {
        off[0] = A;
        off[1] = A + 4 * W;
        off[2] = CK;
        off[3] = CV;
    }
    return CV + 8 * G * dqcu__hot_bits(dc->host.kind[1].M) * ((W + 1) / 2);
}

struct hot_tc_params : dqcu_hot_common {
    const uint8_t *const *windows;
    uint8_t *const *hot;
    uint32_t *corrupt;
    uint32_t fx_k[2], fx_w[2]; /* fixed-width profiles: symbols and bits per base-M group */
};

/* Block (w, 0)'s share of either kernel: the key-mean block as it is, its padding and the padding
 * between the value (s, o) pairs and the key codes (odd W) zeroed. */
__device__ __forceinline__ void hot_copy_head(const hot_tc_params &p, const uint8_t *win, uint8_t *hot, uint32_t n,
                                              uint32_t W)
{
    for (uint32_t i = threadIdx.x; i < p.off[0]; i += blockDim.x)
        hot[i] = i < 2u + n ? win[i] : 0;
    for (uint32_t i = p.off[1] + 4u * W + threadIdx.x; i < p.off[2]; i += blockDim.x)
        hot[i] = 0;
}

/* A record's (s, o) as it is: the record is not 4-byte aligned, the pair is. */
__device__ __forceinline__ void hot_copy_so(const uint8_t *rec, uint8_t *so, uint32_t t)
{
    *(uint32_t *)(void *)(so + 4u * t) = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 |
                                         (uint32_t)rec[3] << 24;
}

template <bool PAIRS>
__global__ void __launch_bounds__(HOT_THREADS) hot_transcode_kernel(hot_tc_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const int kind = (int)blockIdx.y;
    const dqcu_kind_tab &kt = tb.kind[kind];
    const dqcu_dtab dtab = dqcu_dec_stage(PAIRS, smem, kt, PAIRS ? &p.tab2->kind[kind] : nullptr);
    const uint8_t *win = p.windows[blockIdx.x];
    uint8_t *hot = p.hot[blockIdx.x];
    const uint32_t n = tb.n, W = tb.W, C = kt.C, b = p.bits[kind], G = n / 32;
    if (kind == 0)
        hot_copy_head(p, win, hot, n, W);
    const size_t rk = 4u + tb.kind[0].C, rv = 4u + tb.kind[1].C;
    uint8_t *so = hot + p.off[kind];
    uint32_t *codes = (uint32_t *)(void *)(hot + p.off[2 + kind]);
    uint32_t nbad = 0;
    for (uint32_t t = threadIdx.x; t < W; t += blockDim.x) {
        const uint8_t *rec = kind == 0 ? dqcu_krec(win, n, rk, t) : dqcu_vrec(win, n, W, rk, rv, t);
        hot_copy_so(rec, so, t);
        dqcu_rans_in in;
        uint32_t x = dqcu_rans_open(in, rec + 4, C);
        const bool valid_state = x >= DQCU_RANS_L && x < (DQCU_RANS_L << 8);
        for (uint32_t g = 0; g < G; g++) {
            dqcu_hot_group grp;
            dqcu_hot_group_clear(grp);
            for (uint32_t j = 0; j < 32; j += 4) {
                /* an invalid initial state decodes as zeros (lib's reference decoders write zeros
                 * too: dq__rans_decode and dq__rans2_decode fill the levels with 0 when the state
                 * is out of range) */
                const uint32_t quad = valid_state ? dqcu_dec_quad<PAIRS>(x, dtab, in) : 0u;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    dqcu_hot_group_put(grp, kind, b, j + (uint32_t)u, (quad >> (8 * u)) & 0xffu);
                }
            }
            dqcu_hot_group_store(grp, codes, kind, b, W, g, t);
        }
        nbad += dqcu_dec_bad(valid_state, x, in, rec + 4, C) ? 1u : 0u;
    }
    if (p.corrupt && nbad)
        atomicAdd(p.corrupt, nbad);
}

/* w bits (w <= 32) at bit pos of a little-endian bit string, reading only the bytes they touch. */
__device__ __forceinline__ uint32_t hot_get_bits(const uint8_t *buf, uint32_t pos, uint32_t w)
{
    const uint8_t *q = buf + pos / 8;
    const uint32_t sh = pos % 8, nbytes = (sh + w + 7) / 8;
    uint64_t x = 0;
    for (uint32_t i = 0; i < nbytes; i++)
        x |= (uint64_t)q[i] << (8 * i);
    return (uint32_t)((x >> sh) & ((1ull << w) - 1));
}

/* A warp per token (block (window, kind, z): tokens 4z .. 4z + 3), lane l taking the groups of 32
 * levels l, l + 32, ..: level j is digit j % K of base-M group j / K (w bits at (j / K)·w), so a
 * lane reads the base-M groups its levels fall in, skips the digits before its first, and packs
 * its own. The container's checks are lib's, each once: the lane holding a base-M group's first
 * level divides the whole group (nonzero after cnt digits: worth M^cnt or more), lane 0 checks the
 * bits past the groups, and the token counts once if any failed. (One thread per token, as the
 * rANS kernel, took 686 us for 36 windows: 72 blocks for 132 SMs, 1024 levels in a row a thread;
 * run 127.) */
__global__ void __launch_bounds__(HOT_THREADS) hot_transcode_fixed_kernel(hot_tc_params p)
{
    const dqcu_tables &tb = *p.tab;
    const int kind = (int)blockIdx.y;
    const uint8_t *win = p.windows[blockIdx.x];
    uint8_t *hot = p.hot[blockIdx.x];
    const uint32_t n = tb.n, W = tb.W, M = tb.kind[kind].M, b = p.bits[kind], G = n / 32u;
    const uint32_t K = p.fx_k[kind], w = p.fx_w[kind], ngroups = (n + K - 1) / K;
    const uint32_t lane = threadIdx.x & 31u, t = blockIdx.z * (HOT_THREADS / 32) + (threadIdx.x >> 5);
    if (kind == 0 && blockIdx.z == 0)
        hot_copy_head(p, win, hot, n, W);
    if (t >= W)
        return;
    const size_t rk = 4u + tb.kind[0].C, rv = 4u + tb.kind[1].C;
    const uint8_t *rec = kind == 0 ? dqcu_krec(win, n, rk, t) : dqcu_vrec(win, n, W, rk, rv, t);
    if (lane == 0)
        hot_copy_so(rec, hot + p.off[kind], t);
    const uint8_t *cont = rec + 4;
    uint32_t *codes = (uint32_t *)(void *)(hot + p.off[2 + kind]);
    bool bad = false;
    for (uint32_t g = lane; g < G; g += 32) {
        const uint32_t j0 = 32u * g;
        /* the base-M groups starting among this lane's levels: lib's check of each */
        for (uint32_t q = (j0 + K - 1) / K; q * K < j0 + 32u && q < ngroups; q++) {
            uint32_t v = hot_get_bits(cont, q * w, w);
            const uint32_t cnt = n - q * K < K ? n - q * K : K;
            for (uint32_t i = 0; i < cnt; i++)
                v /= M;
            bad |= v != 0;
        }
        uint32_t q = j0 / K, r = j0 % K, v = hot_get_bits(cont, q * w, w);
        for (uint32_t i = 0; i < r; i++)
            v /= M;
        dqcu_hot_group grp;
        dqcu_hot_group_clear(grp);
        for (uint32_t c = 0; c < 32u; c++) {
            dqcu_hot_group_put(grp, kind, b, c, v % M);
            v /= M;
            if (++r == K && c + 1 < 32u) {
                r = 0;
                v = hot_get_bits(cont, ++q * w, w);
            }
        }
        dqcu_hot_group_store(grp, codes, kind, b, W, g, t);
    }
    const uint32_t end = ngroups * w;
    if (lane == 0 && end % 8)
        bad |= (cont[end / 8] >> (end % 8)) != 0;
    if (__any_sync(DQCU_FULL, bad) && lane == 0 && p.corrupt)
        atomicAdd(p.corrupt, 1u);
}

int dqcu__hot_setup(const dqcu_codec *dc, const void *src, const void *dst, size_t nwin, bool rans_only,
                    dqcu_hot_common *c, dim3 *grid)
{
    if (!dc || (nwin && (!src || !dst)))
        return DQ_INVALID_ARGUMENT;
    if (dc->d < 32 || dc->d > 512 || (rans_only && dc->fixed))
        return DQ_UNSUPPORTED;
    if (nwin > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    const int rc = dqcu__use_device(dc);
    if (rc || !nwin)
        return rc;
    c->tab = dc->tab;
    c->tab2 = dc->tab2;
    size_t o[4];
    dqcu__hot_offsets(dc, o);
    for (int i = 0; i < 4; i++)
        c->off[i] = (uint32_t)o[i];
    for (int k = 0; k < 2; k++)
        c->bits[k] = dqcu__hot_bits(dc->host.kind[k].M);
    *grid = dim3((unsigned)nwin, 2);
    return 1;
}

extern "C" size_t dqcu_hot_window_bytes(const dqcu_codec *dc)
{
    return dc ? dqcu__hot_offsets(dc, NULL) : 0;
}

extern "C" int dqcu_transcode_hot(const dqcu_codec *dc, const uint8_t *const *windows, size_t nwin, uint8_t *const *hot,
                                  uint32_t *corrupt, cudaStream_t stream)
{
    hot_tc_params p = {};
    dim3 grid;
    const int rc = dqcu__hot_setup(dc, windows, hot, nwin, false, &p, &grid);
    if (rc <= 0)
        return rc;
    p.windows = windows;
    p.hot = hot;
    p.corrupt = corrupt;
    if (dc->fixed) {
        for (int k = 0; k < 2; k++) {
            p.fx_k[k] = dc->fx_k[k];
            p.fx_w[k] = dc->fx_w[k];
        }
        grid.z = (unsigned)((dc->W + HOT_THREADS / 32 - 1) / (HOT_THREADS / 32));
        hot_transcode_fixed_kernel<<<grid, HOT_THREADS, 0, stream>>>(p);
    } else if (dc->pairs) {
        hot_transcode_kernel<true><<<grid, HOT_THREADS, dqcu_dec_smem(true), stream>>>(p);
    } else {
        hot_transcode_kernel<false><<<grid, HOT_THREADS, dqcu_dec_smem(false), stream>>>(p);
    }
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
