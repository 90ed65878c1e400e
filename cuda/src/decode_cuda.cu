/* Decompression to BF16/FP16/F32 pages, identical to dq_tokens_decode / dq_layer_decode.
 *
 * A warp takes up to 32 consecutive tokens of one window, one stream per lane. Head by head, each
 * lane decodes the head's d symbols of its stream into shared memory; then the warp reconstructs
 * the 32 tokens' heads one after the other with the lanes across channels: y = o + s·m (+ μ for
 * keys), the inverse rotation (the butterfly of lib, × rot_scale, × signs) and the conversion to
 * the output type, written coalesced. Both container versions: a lane decodes 4 levels at a time
 * (4 steps of version 1, 2 pair steps of version 2: rans2_cuda.cuh). */
#include "rans2_cuda.cuh"

#define DEC_WARPS 4

struct dec_params {
    const dqcu_tables *tab;
    const dqcu_rans2_tables *tab2; /* version 2 (NULL for version 1) */
    int kind;
    const uint8_t *const *windows;
    size_t first, end; /* token range, end <= sealed */
    size_t w_begin;    /* first window touched */
    uint32_t groups_per_window;
    size_t ngroups;
    void *out; /* [count, n], token first at row 0 */
    int dtype;
    uint32_t *corrupt;
    uint32_t row_stride; /* bytes per lane row of levels (d + 4) */
};

template <int DV, bool PAIRS>
__global__ void __launch_bounds__(DEC_WARPS * 32) decompress_kernel(dec_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const dqcu_tables &tb = *p.tab;
    const dqcu_kind_tab &kt = tb.kind[p.kind];
    const dqcu_dtab dtab = dqcu_dec_stage(PAIRS, smem, kt, PAIRS ? &p.tab2->kind[p.kind] : nullptr);
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    uint8_t *lv = smem + dqcu_dec_smem(PAIRS) + (size_t)warp * 32u * p.row_stride;
    const size_t gid = (size_t)blockIdx.x * DEC_WARPS + warp;
    if (gid >= p.ngroups)
        return;
    const uint32_t n = tb.n, d = tb.d, W = tb.W, C = kt.C;
    const size_t w = p.w_begin + gid / p.groups_per_window;
    const uint32_t g = (uint32_t)(gid % p.groups_per_window);
    const uint8_t *win = p.windows[w];
    const size_t tw = (size_t)g * 32u + lane; /* token within the window */
    const size_t tok = w * W + tw;
    const bool active = tw < W && tok >= p.first && tok < p.end;
    /* lanes [l0, l1) hold the active tokens (a contiguous run) */
    const uint32_t amask = __ballot_sync(DQCU_FULL, active);
    if (!amask)
        return;
    const uint32_t l0 = __ffs(amask) - 1, l1 = 32u - __clz(amask);

    const size_t rk = 4u + tb.kind[0].C, rv = 4u + tb.kind[1].C;
    const uint8_t *rec = p.kind == DQ_KIND_V ? dqcu_vrec(win, n, W, rk, rv, tw) : dqcu_krec(win, n, rk, tw);
    float s = 0, o = 0;
    uint32_t x = DQCU_RANS_L;
    bool valid_state = false;
    dqcu_rans_in in;
    if (active) {
        s = dqcu_f16_le(rec);
        o = dqcu_f16_le(rec + 2);
        x = dqcu_rans_open(in, rec + 4, C);
        valid_state = x >= DQCU_RANS_L && x < (DQCU_RANS_L << 8);
    }
    const float sfm = p.kind == DQ_KIND_K ? dqcu_f16_le(win) : 0.0f;
    uint8_t *myrow = lv + (size_t)lane * p.row_stride;
    for (uint32_t h = 0; h < tb.kv_heads; h++) {
        if (active) {
            if (valid_state) {
                /* rows are d + 4 bytes from a 4-aligned base: word stores */
                for (uint32_t j = 0; j < d; j += 4)
                    *(uint32_t *)(void *)(myrow + j) = dqcu_dec_quad<PAIRS>(x, dtab, in);
            } else {
                for (uint32_t j = 0; j < d; j++)
                    myrow[j] = 0;
            }
        }
        __syncwarp();
        float mu[DV];
#pragma unroll
        for (int r = 0; r < DV; r++) {
            uint32_t e = (uint32_t)r * 32u + lane;
            mu[r] = (p.kind == DQ_KIND_K && e < d) ? (float)(int8_t)win[2u + h * d + e] * sfm : 0.0f;
        }
        for (uint32_t tt = l0; tt < l1; tt++) {
            const float st = __shfl_sync(DQCU_FULL, s, (int)tt), ot = __shfl_sync(DQCU_FULL, o, (int)tt);
            const uint8_t *trow = lv + (size_t)tt * p.row_stride;
            float y[DV];
#pragma unroll
            for (int r = 0; r < DV; r++) {
                uint32_t e = (uint32_t)r * 32u + lane;
                float v = 0.0f;
                if (e < d) {
                    v = ot + st * (float)trow[e];
                    if (p.kind == DQ_KIND_K)
                        v = v + mu[r];
                }
                y[r] = v;
            }
            dqcu_fwht(y, d, lane);
            const size_t obase = (w * W + g * 32u + tt - p.first) * n + (size_t)h * d;
#pragma unroll
            for (int r = 0; r < DV; r++) {
                uint32_t e = (uint32_t)r * 32u + lane;
                if (e < d) {
                    float v = y[r] * tb.rot_scale;
                    v = v * tb.signs[h * d + e];
                    dqcu_store_elem(p.out, p.dtype, obase + e, v);
                }
            }
        }
        __syncwarp();
    }
    if (p.corrupt) {
        bool bad = false;
        if (active)
            bad = dqcu_dec_bad(valid_state, x, in, rec + 4, C);
        uint32_t nbad = __popc(__ballot_sync(DQCU_FULL, bad));
        if (lane == 0 && nbad)
            atomicAdd(p.corrupt, nbad);
    }
}

__global__ void tail_convert_kernel(const uint16_t *tail, size_t count, void *out, int dtype)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dqcu_store_elem(out, dtype, i, dqcu_bf16_to_f32(tail[i]));
}

template <int DV, bool PAIRS>
static int launch_dec_v(const dqcu_codec *dc, const dec_params &p, cudaStream_t stream)
{
    const size_t smem = dqcu_dec_smem(PAIRS) + (size_t)DEC_WARPS * 32u * p.row_stride;
    if (smem > dc->smem_optin)
        return DQ_UNSUPPORTED;
    DQCU_CHECK(
        cudaFuncSetAttribute(decompress_kernel<DV, PAIRS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const size_t blocks = (p.ngroups + DEC_WARPS - 1) / DEC_WARPS;
    if (blocks > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    decompress_kernel<DV, PAIRS><<<(unsigned)blocks, DEC_WARPS * 32, smem, stream>>>(p);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}

template <int DV>
static int launch_dec(const dqcu_codec *dc, const dec_params &p, cudaStream_t stream)
{
    return dc->pairs ? launch_dec_v<DV, true>(dc, p, stream) : launch_dec_v<DV, false>(dc, p, stream);
}

extern "C" int dqcu_decompress(const dqcu_codec *dc, dq_kind kind, const uint8_t *const *windows, size_t nwin,
                               const uint16_t *tail, size_t tail_tokens, size_t first, size_t count, void *out,
                               dq_dtype dtype, uint32_t *corrupt, cudaStream_t stream)
{
    if (!dc || (kind != DQ_KIND_K && kind != DQ_KIND_V) || (count && !out) || (nwin && !windows) ||
        (tail_tokens && !tail))
        return DQ_INVALID_ARGUMENT;
    if (dtype != DQ_DTYPE_F32 && dtype != DQ_DTYPE_F16 && dtype != DQ_DTYPE_BF16)
        return DQ_DTYPE;
    if (dc->d < 32 || dc->d > 512 || dc->fixed)
        return DQ_UNSUPPORTED;
    const size_t W = dc->W, n = dc->n, sealed = nwin * W, total = sealed + tail_tokens;
    if (first > total || count > total - first)
        return DQ_OUT_OF_BOUNDS;
    int rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    const size_t end = first + count;
    if (first < sealed && count) {
        dec_params p = {};
        p.tab = dc->tab;
        p.tab2 = dc->tab2;
        p.kind = (int)kind;
        p.windows = windows;
        p.first = first;
        p.end = end < sealed ? end : sealed;
        p.w_begin = first / W;
        const size_t w_end = (p.end - 1) / W + 1;
        p.groups_per_window = (uint32_t)((W + 31) / 32);
        p.ngroups = (w_end - p.w_begin) * p.groups_per_window;
        p.out = out;
        p.dtype = (int)dtype;
        p.corrupt = corrupt;
        p.row_stride = dc->d + 4u;
        switch (dc->d / 32) {
        case 1:
            rc = launch_dec<1>(dc, p, stream);
            break;
        case 2:
            rc = launch_dec<2>(dc, p, stream);
            break;
        case 4:
            rc = launch_dec<4>(dc, p, stream);
            break;
        case 8:
            rc = launch_dec<8>(dc, p, stream);
            break;
        case 16:
            rc = launch_dec<16>(dc, p, stream);
            break;
        default:
            rc = DQ_UNSUPPORTED;
            break;
        }
        if (rc)
            return rc;
    }
    if (end > sealed && count) {
        const size_t t0 = first > sealed ? first : sealed;
        const size_t cnt = (end - t0) * n;
        const size_t esz = dq_dtype_size(dtype);
        const uint16_t *src = tail + (t0 - sealed) * n;
        uint8_t *dst = (uint8_t *)out + (t0 - first) * n * esz;
        size_t blocks = (cnt + 255) / 256;
        if (blocks > 65535)
            blocks = 65535;
        tail_convert_kernel<<<(unsigned)blocks, 256, 0, stream>>>(src, cnt, dst, (int)dtype);
        DQCU_CHECK_LAUNCH();
    }
    return DQ_OK;
}
