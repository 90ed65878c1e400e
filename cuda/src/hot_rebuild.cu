/* The inverse of the hot transcode on the GPU: window records rebuilt from hot windows, byte for
 * byte what dq_hot_rebuild writes (lib/src/hot.c says why that is the original record).
 *
 * One block per (window, kind), a thread per token, as the transcoder. The thread copies its
 * stream's s and o and rANS-encodes its levels (read from the codes, last to first) with the
 * encoder's table (the step of encode_kernel.cuh's rans_put): a first pass counts the bytes it
 * emits, a second writes each at its place (the decoder reads them in the reverse order of
 * emission), then the state and the zero tail. Block (w, 0) also copies the key-mean block. For a
 * store that keeps only hot windows (dquantd --gpu-attention-layout hot-only), so that reading a
 * record costs a launch, not a round trip through the CPU. */
#include "hot_cuda.cuh"

#define HOT_RB_THREADS 128

struct hot_rb_params {
    const dqcu_tables *tab;
    const uint8_t *const *hot;
    uint8_t *const *windows;
    uint32_t *bad;
    uint32_t off[4];
    uint32_t bits[2];
};

/* One encoder step (rans.c): true when it emits a byte (the state's low byte before the shift). */
__device__ __forceinline__ bool rb_step(uint32_t &x, const uint4 e, uint8_t *byte)
{
    bool out = false;
    if (x >= e.x) {
        *byte = (uint8_t)x;
        x >>= 8;
        out = true;
    }
    const uint32_t q = (uint32_t)(((unsigned long long)x * e.y) >> (e.w >> 16));
    x = x + q * e.z + (e.w & 0xffffu);
    return out;
}

__global__ void __launch_bounds__(HOT_RB_THREADS) hot_rebuild_kernel(hot_rb_params p)
{
    __shared__ uint4 enc[32];
    const dqcu_tables &tb = *p.tab;
    const int kind = (int)blockIdx.y;
    const dqcu_kind_tab &kt = tb.kind[kind];
    for (uint32_t i = threadIdx.x; i < 32; i += blockDim.x)
        enc[i] = kt.enc[i];
    __syncthreads();
    const uint8_t *hot = p.hot[blockIdx.x];
    uint8_t *win = p.windows[blockIdx.x];
    const uint32_t n = tb.n, W = tb.W, C = kt.C, M = kt.M, b = p.bits[kind];
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
        uint32_t x = DQCU_RANS_L, emitted = 0;
        bool bad = false;
        uint8_t byte;
        for (uint32_t j = n; j-- > 0;) {
            const uint32_t m = dqcu_hot_code(codes, kind, b, W, t, j);
            if (m >= M) {
                bad = true;
                break;
            }
            emitted += rb_step(x, enc[m], &byte) ? 1u : 0u;
        }
        if (bad || 4u + emitted > C) {
            nbad++;
            continue;
        }
        /* pass 2: the first byte emitted is the last the decoder reads */
        uint8_t *bytes = rec + 8;
        uint32_t k = emitted;
        x = DQCU_RANS_L;
        for (uint32_t j = n; j-- > 0;)
            if (rb_step(x, enc[dqcu_hot_code(codes, kind, b, W, t, j)], &byte))
                bytes[--k] = byte;
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
    if (!dc || (nwin && (!windows || !hot)))
        return DQ_INVALID_ARGUMENT;
    if (dc->d < 32 || dc->d > 512 || dc->fixed) /* fixed-width records are not rANS (dq_hot_rebuild refuses them) */
        return DQ_UNSUPPORTED;
    if (nwin > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu__use_device(dc);
    if (rc || !nwin)
        return rc;
    hot_rb_params p = {};
    p.tab = dc->tab;
    p.hot = hot;
    p.windows = windows;
    p.bad = bad;
    size_t off[4];
    dqcu__hot_offsets(dc, off);
    for (int i = 0; i < 4; i++)
        p.off[i] = (uint32_t)off[i];
    p.bits[0] = dqcu__hot_bits(dc->host.kind[0].M);
    p.bits[1] = dqcu__hot_bits(dc->host.kind[1].M);
    hot_rebuild_kernel<<<dim3((unsigned)nwin, 2), HOT_RB_THREADS, 0, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
