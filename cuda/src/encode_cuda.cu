/* GPU encoder: the table of versions (encode_v5.cu, the default, and encode_v4.cu; the kernel and
 * its design are in encode_kernel.cuh), the key window mean and the window's input checks, and the
 * public calls (dquant/cuda.h), which hand fixed-width codecs to encode_fixed.cu. */
#include <math.h>
#include <stdint.h>

#include "encode_internal.cuh"

/* ---- the key window mean and the window's input checks (tokens.c) ---- */

struct mean_params {
    const dqcu_tables *tab;
    const void *k, *v;
    uint8_t *const *windows;
    int32_t *status;
    uint32_t warps; /* per block (one window) */
};

#define MEAN_MAX_WARPS 4

/* The mean kernel's layout: lane q of a window's block holds the MEAN_CPL consecutive channels from
 * MEAN_CPL·q of every key and value token in registers (ch = min(MEAN_CPL, n - MEAN_CPL·q) of them),
 * so the rotation's strides below MEAN_CPL stay inside a lane and only the others cross lanes (a head
 * spans d/MEAN_CPL lanes when it is wider, a lane holds MEAN_CPL/d heads otherwise). A token's values
 * arrive as raw words: F32 one value per word, F16/BF16 two (channel 2i in the low half). The kernel
 * is bound by each warp's latency through its tokens: 16 channels per lane give twice the warps of
 * 32, and with the values in the same lanes (they are rarely rotated) the registers let a wave of
 * blocks hold every window of a 128K-token call. */
#define MEAN_CPL 16

/* Loads the raw words of ch channels from element i of src (zeros for a lane without channels). VEC:
 * 16-byte loads (src 16-byte aligned, ch = MEAN_CPL). */
template <int DT, bool VEC>
__device__ __forceinline__ void mean_load(const void *src, size_t i, uint32_t ch, bool live, uint32_t (&raw)[MEAN_CPL])
{
    if (!live) {
#pragma unroll
        for (int j = 0; j < MEAN_CPL; j++)
            raw[j] = 0;
        return;
    }
    constexpr int WORDS = DT == DQ_DTYPE_F32 ? MEAN_CPL : MEAN_CPL / 2;
    if (VEC) {
        const uint4 *s = (const uint4 *)(const void *)((const char *)src + i * (DT == DQ_DTYPE_F32 ? 4 : 2));
#pragma unroll
        for (int q = 0; q < WORDS / 4; q++) {
            const uint4 w = s[q];
            raw[4 * q] = w.x;
            raw[4 * q + 1] = w.y;
            raw[4 * q + 2] = w.z;
            raw[4 * q + 3] = w.w;
        }
    } else if (DT == DQ_DTYPE_F32) {
        const uint32_t *s = (const uint32_t *)src + i;
#pragma unroll
        for (int j = 0; j < MEAN_CPL; j++)
            raw[j] = (uint32_t)j < ch ? s[j] : 0u;
    } else {
        const uint16_t *s = (const uint16_t *)src + i;
#pragma unroll
        for (int j = 0; j < MEAN_CPL / 2; j++) {
            const uint32_t lo = (uint32_t)(2 * j) < ch ? s[2 * j] : 0u;
            const uint32_t hi = (uint32_t)(2 * j + 1) < ch ? s[2 * j + 1] : 0u;
            raw[j] = lo | hi << 16;
        }
    }
}

/* Channel j of the raw words as float with its rotation sign applied: sp[j / 2] has bit 15 set when
 * channel 2(j/2) is negated and bit 31 for channel 2(j/2) + 1 (x·(±1) is a sign flip). */
template <int DT>
__device__ __forceinline__ float mean_value(const uint32_t (&raw)[MEAN_CPL], const uint32_t (&sp)[MEAN_CPL / 2], int j)
{
    if (DT == DQ_DTYPE_F32) {
        const uint32_t flip = (j & 1) ? sp[j >> 1] & 0x80000000u : sp[j >> 1] << 16;
        return dqcu_bitsf(raw[j] ^ flip);
    }
    const uint32_t w = raw[j >> 1] ^ sp[j >> 1];
    if (DT == DQ_DTYPE_BF16)
        return dqcu_bitsf((j & 1) ? w & 0xffff0000u : w << 16);
    return dqcu_f16_to_f32((uint16_t)((j & 1) ? w >> 16 : w));
}

/* One token of one lane (see above): rotation (lib's strides 1, 2, ..., d/2), scale, range check, and
 * for the keys the running sums in token order (dq__mean_compute). A value token is rotated only when
 * some head of the warp may have a 2-norm above DQ__TOKEN_NORM_LIMIT (the sum of squares over a lane's
 * heads bounds each of them; none of a head's rotated values can exceed its norm); non-finite values
 * fail the range check (see mean_kernel). hs = min(d, MEAN_CPL), lph = max(1, d/MEAN_CPL). */
template <int DT, bool KEYS>
__device__ __forceinline__ void mean_token(const dqcu_tables &tb, const uint32_t (&raw)[MEAN_CPL],
                                           const uint32_t (&sp)[MEAN_CPL / 2], uint32_t hs, uint32_t lph, bool live,
                                           uint32_t lane, float (&sum)[MEAN_CPL], bool &range)
{
    float y[MEAN_CPL];
#pragma unroll
    for (int j = 0; j < MEAN_CPL; j++)
        y[j] = mean_value<DT>(raw, sp, j);
    if (!KEYS) {
        float ss = 0;
#pragma unroll
        for (int j = 0; j < MEAN_CPL; j++)
            ss += y[j] * y[j];
        for (uint32_t m = 1; m < lph; m <<= 1)
            ss += __shfl_xor_sync(DQCU_FULL, ss, (int)m);
        const float lim2 = DQ__TOKEN_NORM_LIMIT * DQ__TOKEN_NORM_LIMIT;
        if (!__any_sync(DQCU_FULL, live && !(ss <= lim2))) /* +inf or NaN: rotated and checked */
            return;
    }
#pragma unroll
    for (uint32_t h = 1; h < MEAN_CPL; h <<= 1) {
        if (h < hs) {
#pragma unroll
            for (int j = 0; j < MEAN_CPL; j++) {
                if (!(j & h)) {
                    const float a = y[j], b = y[j | h];
                    y[j] = a + b;
                    y[j | h] = a - b;
                }
            }
        }
    }
    for (uint32_t m = 1; m < lph; m <<= 1) {
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int j = 0; j < MEAN_CPL; j++) {
            const float o = __shfl_xor_sync(DQCU_FULL, y[j], (int)m);
            y[j] = upper ? o - y[j] : y[j] + o;
        }
    }
    bool bad = false;
#pragma unroll
    for (int j = 0; j < MEAN_CPL; j++) {
        const float v = y[j] * tb.rot_scale;
        bad |= !(fabsf(v) <= DQ_TOKEN_MAX_ABS);
        if (KEYS)
            sum[j] += v;
    }
    if (live && bad)
        range = true;
}

/* One block per window (layout above): every lane runs its key and value channels through the
 * window's tokens in order, the next token's loads in flight. The key sums are lib's (float, from +0,
 * tokens in order, then / W). A non-finite input makes every rotated value of its head non-finite,
 * so it fails the range check; a window that fails it is then scanned for non-finite inputs to tell
 * DQ_NONFINITE from DQ_RANGE. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(MEAN_MAX_WARPS * 32, 4) mean_kernel(mean_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *mean = (float *)(void *)smem; /* n floats */
    __shared__ uint32_t s_flags, s_amax;
    __shared__ float s_sf;
    const dqcu_tables &tb = *p.tab;
    const uint32_t n = tb.n, d = tb.d, W = tb.W;
    const uint32_t lane = threadIdx.x & 31u;
    const size_t w = blockIdx.x;
    const uint32_t lph = d > MEAN_CPL ? d / MEAN_CPL : 1, hs = d < MEAN_CPL ? d : MEAN_CPL;
    const uint32_t q = threadIdx.x;
    const bool live = q * MEAN_CPL < n;
    const uint32_t c0 = live ? q * MEAN_CPL : 0, ch = live ? min((uint32_t)MEAN_CPL, n - c0) : 0;
    if (threadIdx.x == 0) {
        s_flags = 0;
        s_amax = 0;
    }
    __syncthreads();
    uint32_t sp[MEAN_CPL / 2];
#pragma unroll
    for (int i = 0; i < MEAN_CPL / 2; i++) {
        const uint32_t j0 = 2u * i, j1 = j0 + 1;
        const bool n0 = live && j0 < ch && tb.signs[c0 + j0] < 0.0f;
        const bool n1 = live && j1 < ch && tb.signs[c0 + j1] < 0.0f;
        sp[i] = (n0 ? 0x8000u : 0u) | (n1 ? 0x80000000u : 0u);
    }
    float sum[MEAN_CPL];
#pragma unroll
    for (int j = 0; j < MEAN_CPL; j++)
        sum[j] = 0.0f;
    bool range = false;
    const size_t base = w * W * n + c0;
    uint32_t k0[MEAN_CPL], v0[MEAN_CPL], k1[MEAN_CPL], v1[MEAN_CPL];
    mean_load<DT, VEC>(p.k, base, ch, live, k0);
    mean_load<DT, VEC>(p.v, base, ch, live, v0);
    for (uint32_t t = 0; t < W; t += 2) {
        const size_t t1 = base + (size_t)(t + 1) * n, t2 = base + (size_t)(t + 2) * n;
        mean_load<DT, VEC>(p.k, t1, ch, live && t + 1 < W, k1);
        mean_load<DT, VEC>(p.v, t1, ch, live && t + 1 < W, v1);
        mean_token<DT, true>(tb, k0, sp, hs, lph, live, lane, sum, range);
        mean_token<DT, false>(tb, v0, sp, hs, lph, live, lane, sum, range);
        if (t + 1 >= W)
            break;
        mean_load<DT, VEC>(p.k, t2, ch, live && t + 2 < W, k0);
        mean_load<DT, VEC>(p.v, t2, ch, live && t + 2 < W, v0);
        mean_token<DT, true>(tb, k1, sp, hs, lph, live, lane, sum, range);
        mean_token<DT, false>(tb, v1, sp, hs, lph, live, lane, sum, range);
    }
    if (range)
        atomicOr(&s_flags, 2u);
    float amax = 0;
    if (live) {
#pragma unroll
        for (int j = 0; j < MEAN_CPL; j++) {
            if ((uint32_t)j < ch) {
                const float m = sum[j] / (float)W;
                mean[c0 + j] = m;
                amax = fmaxf(amax, fabsf(m));
            }
        }
    }
    atomicMax(&s_amax, dqcu_fbits(amax)); /* non-negative floats order like their bits */
    __syncthreads();
    if (s_flags) {       /* the window fails: non-finite inputs, or values out of range */
        __syncthreads(); /* every thread has read s_flags */
        bool nf = false;
        const size_t wn = (size_t)W * n;
        for (size_t i = threadIdx.x; i < wn; i += blockDim.x)
            nf |= !isfinite(dqcu_load_elem(p.k, DT, w * wn + i)) || !isfinite(dqcu_load_elem(p.v, DT, w * wn + i));
        if (nf)
            atomicOr(&s_flags, 1u);
        __syncthreads();
    }
    uint8_t *win = p.windows[w];
    if (threadIdx.x == 0) {
        uint16_t sh = dqcu_f32_to_f16(dqcu_bitsf(s_amax) / 127.0f);
        win[0] = (uint8_t)sh;
        win[1] = (uint8_t)(sh >> 8);
        s_sf = dqcu_f16_to_f32(sh);
        uint32_t f = s_flags;
        p.status[w] = (f & 1) ? DQ_NONFINITE : (f & 2) ? DQ_RANGE : DQ_OK;
    }
    __syncthreads();
    const float sf = s_sf;
    for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) {
        float r = sf > 0 ? rintf(mean[j] / sf) : 0.0f;
        if (r > 127.0f)
            r = 127.0f;
        if (r < -127.0f)
            r = -127.0f;
        win[2 + j] = (uint8_t)(int8_t)r;
    }
}

/* ---- the table of versions ---- */

struct enc_impl {
    int version;
    int (*launch)(const dqcu_codec *dc, const enc_params &p, unsigned gy, cudaStream_t stream);
    int (*upload_exp2)(const float *tab);
};

/* newest first; the first is the default */
static const enc_impl enc_impls[] = {
    {5, dqcu__encode5_launch, dqcu__encode5_upload_exp2},
    {4, dqcu__encode4_launch, dqcu__encode4_upload_exp2},
};
static const int enc_versions[] = {5, 4};
#define ENC_NIMPL (sizeof enc_impls / sizeof enc_impls[0])
static_assert(sizeof enc_versions / sizeof enc_versions[0] == ENC_NIMPL, "one version number per table entry");

extern "C" const int *dqcu_encode_kernels(size_t *count)
{
    if (count)
        *count = ENC_NIMPL;
    return enc_versions;
}

static const enc_impl *enc_pick(const dqcu_codec *dc)
{
    for (size_t i = 0; i < ENC_NIMPL; i++)
        if (enc_impls[i].version == dc->settings.encode_kernel)
            return &enc_impls[i];
    return &enc_impls[0];
}

int dqcu__upload_exp2(const float *tab)
{
    for (size_t i = 0; i < ENC_NIMPL; i++) {
        const int rc = enc_impls[i].upload_exp2(tab);
        if (rc)
            return rc;
    }
    return DQ_OK;
}

/* ---- launchers ---- */

static int enc_run(const dqcu_codec *dc, enc_params &p, unsigned gy, cudaStream_t stream)
{
    const uint32_t n = dc->n;
    p.row_stride = ((n + 3u) & ~3u);
    if (((p.row_stride / 4u) & 1u) == 0)
        p.row_stride += 4; /* odd number of words: the lanes' rows fall in distinct banks */
    /* Level rows of 12 KB per warp: more streams per group keep more lanes busy in the rANS pass,
     * and with the sorted stream the blocks that the registers allow per SM still fit in shared
     * memory. */
    uint32_t G = 12288u / p.row_stride;
    p.G = G < 1 ? 1 : G > 32 ? 32 : G;
    return enc_pick(dc)->launch(dc, p, gy, stream);
}

extern "C" int dqcu_encode_streams(const dqcu_codec *dc, dq_kind kind, const float *y, size_t count, uint8_t *records,
                                   size_t record_stride, int32_t *status, dq_encode_stats *stats, cudaStream_t stream)
{
    if (!dc || (kind != DQ_KIND_K && kind != DQ_KIND_V) || (count && (!y || !records || !status)))
        return DQ_INVALID_ARGUMENT;
    if (record_stride < dc->record_bytes[kind])
        return DQ_INVALID_ARGUMENT;
    if (dc->n > DQCU_MAX_ENCODE_STREAM)
        return DQ_UNSUPPORTED;
    int rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    if (count == 0)
        return DQ_OK;
    enc_params p = {};
    p.tab = dc->tab;
    p.tab2 = dc->tab2;
    p.kind = (int)kind;
    p.count = count;
    p.stats = stats;
    p.y = y;
    p.records = records;
    p.record_stride = record_stride;
    p.status = status;
    if (dc->fixed)
        return dqcu__encode_fixed_launch(dc, p, 1, stream);
    return enc_run(dc, p, 1, stream);
}

template <int DT, bool VEC>
static int launch_mean(const dqcu_codec *dc, const mean_params &p, size_t nwin, cudaStream_t stream)
{
    const size_t smem = sizeof(float) * dc->n;
    if (smem > dc->smem_optin)
        return DQ_UNSUPPORTED;
    DQCU_CHECK(cudaFuncSetAttribute(mean_kernel<DT, VEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    mean_kernel<DT, VEC><<<(unsigned)nwin, 32u * p.warps, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <int DT>
static int launch_mean_dt(const dqcu_codec *dc, const mean_params &p, bool vec, size_t nwin, cudaStream_t stream)
{
    return vec ? launch_mean<DT, true>(dc, p, nwin, stream) : launch_mean<DT, false>(dc, p, nwin, stream);
}

extern "C" int dqcu_encode_windows(const dqcu_codec *dc, const void *k, const void *v, dq_dtype dtype, size_t nwin,
                                   uint8_t *const *windows, int32_t *status, dq_encode_stats *stats,
                                   cudaStream_t stream)
{
    if (!dc || (nwin && (!k || !v || !windows || !status)))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->n > DQCU_MAX_ENCODE_STREAM || dc->d > 512)
        return DQ_UNSUPPORTED;
    if (nwin > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    if (nwin == 0)
        return DQ_OK;
    /* n <= 2048: at most 4 warps */
    mean_params mp = {dc->tab, k, v, windows, status, (dc->n + 32u * MEAN_CPL - 1u) / (32u * MEAN_CPL)};
    const bool vec = dc->n % MEAN_CPL == 0 && (((uintptr_t)k | (uintptr_t)v) & 15u) == 0;
    switch (dtype) {
    case DQ_DTYPE_F32:
        rc = launch_mean_dt<DQ_DTYPE_F32>(dc, mp, vec, nwin, stream);
        break;
    case DQ_DTYPE_F16:
        rc = launch_mean_dt<DQ_DTYPE_F16>(dc, mp, vec, nwin, stream);
        break;
    default:
        rc = launch_mean_dt<DQ_DTYPE_BF16>(dc, mp, vec, nwin, stream);
        break;
    }
    if (rc)
        return rc;
    enc_params p = {};
    p.tab = dc->tab;
    p.tab2 = dc->tab2;
    p.kind = -1;
    p.count = nwin * dc->W;
    p.stats = stats;
    p.k = k;
    p.v = v;
    p.dtype = (int)dtype;
    p.windows = windows;
    p.win_status = status;
    if (dc->fixed)
        return dqcu__encode_fixed_launch(dc, p, 2, stream);
    return enc_run(dc, p, 2, stream);
}
