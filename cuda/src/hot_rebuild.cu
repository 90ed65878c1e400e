/* The inverse of the hot transcode on the GPU: window records rebuilt from hot windows, byte for
 * byte what dq_hot_rebuild writes (lib/src/hot.c says why that is the original record).
 *
 * One block per (window, kind), a thread per token, as the transcoder. The thread copies its
 * stream's s and o and rANS-encodes its levels (read from the codes, last to first) with the
 * encoder's table (the step of encode_kernel.cuh's rans_put): a first pass counts the bytes it
 * emits, a second writes each at its place (the decoder reads them in the reverse order of
 * emission), then the state and the zero tail. Block (w, 0) also copies the key-mean block. For a
 * store that keeps only hot windows (dquantd --gpu-attention-layout hot-only), so that reading a
 * record costs a launch, not a round trip through the CPU. Format version 2 (joint pairs) encodes
 * pair by pair with its pair table (rans2.c dq__rans2_encode: up to two bytes per pair), the
 * same two passes. */
#include "hot_cuda.cuh"

#include "rans2_cuda.cuh"

#define HOT_RB_THREADS 128

struct hot_rb_params : dqcu_hot_common {
    const uint8_t *const *hot;
    uint8_t *const *windows;
    uint32_t *bad;
};

/* The encoder's symbol for position i (of n / 2 pairs, or n levels) of token t: the pair m1·M + m2
 * of levels 2i, 2i + 1, or level i; false when a code is not a level. */
template <bool PAIRS>
__device__ __forceinline__ bool rb_symbol(const uint32_t *codes, int kind, uint32_t W, uint32_t b, uint32_t M,
                                          uint32_t t, uint32_t i, uint32_t *s)
{
    if (PAIRS) {
        const uint32_t m1 = dqcu_hot_code(codes, kind, b, W, t, 2u * i),
                       m2 = dqcu_hot_code(codes, kind, b, W, t, 2u * i + 1u);
        *s = m1 * M + m2;
        return m1 < M && m2 < M;
    }
    *s = dqcu_hot_code(codes, kind, b, W, t, i);
    return *s < M;
}

template <bool PAIRS>
__global__ void __launch_bounds__(HOT_RB_THREADS) hot_rebuild_kernel(hot_rb_params p)
{
    __shared__ uint4 enc[PAIRS ? DQCU_RANS2_PAIRS : 32];
    const dqcu_tables &tb = *p.tab;
    const int kind = (int)blockIdx.y;
    const dqcu_kind_tab &kt = tb.kind[kind];
    const uint32_t nsym = PAIRS ? kt.M * kt.M : kt.M;
    for (uint32_t i = threadIdx.x; i < nsym; i += blockDim.x)
        enc[i] = PAIRS ? p.tab2->kind[kind].enc[i] : kt.enc[i];
    __syncthreads();
    const uint8_t *hot = p.hot[blockIdx.x];
    uint8_t *win = p.windows[blockIdx.x];
    const uint32_t n = tb.n, W = tb.W, C = kt.C, M = kt.M, b = p.bits[kind];
    const uint32_t steps = PAIRS ? n / 2u : n;
    if (kind == 0)
        for (uint32_t i = threadIdx.x; i < 2u + n; i += blockDim.x)
            win[i] = hot[i];
    const size_t rk = 4u + tb.kind[0].C, rv = 4u + tb.kind[1].C;
    const uint8_t *so = hot + p.off[kind];
    const uint32_t *codes = (const uint32_t *)(const void *)(hot + p.off[2 + kind]);
    uint32_t nbad = 0;
    for (uint32_t t = threadIdx.x; t < W; t += blockDim.x) {
        uint8_t *rec = (uint8_t *)(kind == 0 ? dqcu_krec(win, n, rk, t) : dqcu_vrec(win, n, W, rk, rv, t));
        for (int i = 0; i < 4; i++)
            rec[i] = so[4u * t + i];
        /* pass 1: how many bytes the encoder emits; every code must be a level */
        uint32_t x = DQCU_RANS_L, emitted = 0, s;
        bool bad = false;
        uint8_t byte[2];
        for (uint32_t i = steps; i-- > 0;) {
            if (!rb_symbol<PAIRS>(codes, kind, W, b, M, t, i, &s)) {
                bad = true;
                break;
            }
            emitted += dqcu_enc_step(x, enc[s], byte);
        }
        if (bad || 4u + emitted > C) {
            nbad++;
            continue;
        }
        /* pass 2: the first byte emitted is the last the decoder reads */
        uint8_t *bytes = rec + 8;
        uint32_t k = emitted;
        x = DQCU_RANS_L;
        for (uint32_t i = steps; i-- > 0;) {
            (void)rb_symbol<PAIRS>(codes, kind, W, b, M, t, i, &s);
            const uint32_t e = dqcu_enc_step(x, enc[s], byte);
            for (uint32_t j = 0; j < e; j++)
                bytes[--k] = byte[j];
        }
        for (int i = 0; i < 4; i++)
            rec[4 + i] = (uint8_t)(x >> (8 * i));
        for (uint32_t i = 4u + emitted; i < C; i++)
            rec[4 + i] = 0;
    }
    if (p.bad && nbad)
        atomicAdd(p.bad, nbad);
}

extern "C" int dqcu_rebuild_hot(const dqcu_codec *dc, const uint8_t *const *hot, size_t nwin, uint8_t *const *windows,
                                uint32_t *bad, cudaStream_t stream)
{
    /* fixed-width records are not rANS (dq_hot_rebuild refuses them) */
    hot_rb_params p = {};
    dim3 grid;
    const int rc = dqcu__hot_setup(dc, hot, windows, nwin, true, &p, &grid);
    if (rc <= 0)
        return rc;
    p.hot = hot;
    p.windows = windows;
    p.bad = bad;
    if (dc->pairs)
        hot_rebuild_kernel<true><<<grid, HOT_RB_THREADS, 0, stream>>>(p);
    else
        hot_rebuild_kernel<false><<<grid, HOT_RB_THREADS, 0, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
