/* Decode attention on the containers: the table of kernel versions, the split-K plan, the
 * log-sum-exp merge and the public calls (dquant/cuda.h). The kernels are in attend_v7.cu (the
 * default), attend_v5.cu and attend_v3.cu; attend_internal.cuh has what they share.
 *
 * Token-centric split-K: a block owns tiles of up to 128 tokens of one sequence (the sequence's
 * tiles are cut into contiguous chunks, one per block, and the BF16 tail is one more block, v3's).
 * Each block ends by un-rotating its accumulator and writes (acc, max, sum); attend_merge_kernel
 * merges a sequence's blocks by their log-sum-exp.
 *
 * Which version runs the windows: the newest of the table that takes the shape and can launch on
 * the device, among those not newer than dqcu_settings.attend_kernel (0: all). Removed versions
 * (GPU_NOTES.md has their designs and figures): v4 (two thread roles; it ran only where v5 could not
 * launch, and needs more shared memory than v5 for every shape) and v6 (v5 with cp.async rings;
 * measured slower than v5 except at batch 1, 8K). Format version 2 (joint pairs) runs on v7 alone
 * (its pair tables, when both kinds have at most 8 levels); other version-2 profiles and the
 * fixed-width family attend over hot windows (dqcu_attend_hot). */
#include <math.h>
#include <string.h>

#include "attend_internal.cuh"

/* Merges a sequence's partials by their log-sum-exp. Block (sequence, query head, 32 channels):
 * the 1024 threads first take the splits' maxima and weights, then warp w sums the splits
 * s = w (mod 32) for its lane's channel, and the warps' sums are added. */
#define MERGE_THREADS 1024
__global__ void __launch_bounds__(MERGE_THREADS)
    attend_merge_kernel(const float *part, uint32_t nsplit_total, uint32_t QH, uint32_t d, float *out, float *lse)
{
    extern __shared__ float wts[]; /* [nsplit_total] */
    __shared__ float red[32][33];
    __shared__ float s_m, s_l;
    const size_t b = blockIdx.x;
    const uint32_t h = blockIdx.y, e = blockIdx.z * 32u + (threadIdx.x & 31u);
    const uint32_t tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const size_t stride = (size_t)QH * (d + 2);
    const float *ph = part + (size_t)b * nsplit_total * stride + (size_t)h * (d + 2);

    float M = -INFINITY;
    for (uint32_t s = tid; s < nsplit_total; s += MERGE_THREADS)
        M = fmaxf(M, ph[s * stride + d]);
    M = dqcu_warp_max(M);
    if (lane == 0)
        red[0][warp] = M;
    __syncthreads();
    if (warp == 0) {
        M = red[0][lane];
        M = dqcu_warp_max(M);
        if (lane == 0)
            s_m = M;
    }
    __syncthreads();
    M = s_m;
    float L = 0.0f;
    for (uint32_t s = tid; s < nsplit_total; s += MERGE_THREADS) {
        const float ms = ph[s * stride + d];
        const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
        wts[s] = w;
        if (w != 0.0f)
            L = __fmaf_rn(w, ph[s * stride + d + 1], L);
    }
    L = dqcu_warp_sum(L);
    __syncthreads();
    if (lane == 0)
        red[1][warp] = L;
    __syncthreads();
    if (warp == 0) {
        L = red[1][lane];
        L = dqcu_warp_sum(L);
        if (lane == 0)
            s_l = L;
    }
    __syncthreads();
    L = s_l;
    float v = 0.0f;
    if (e < d) {
#pragma unroll 4
        for (uint32_t s = warp; s < nsplit_total; s += 32) {
            const float w = wts[s];
            if (w != 0.0f)
                v = __fmaf_rn(w, ph[s * stride + e], v);
        }
    }
    __syncthreads();
    red[warp][lane] = v;
    __syncthreads();
    if (warp == 0) {
        float sum = 0.0f;
        for (uint32_t w = 0; w < 32; w++)
            sum += red[w][lane];
        if (e < d)
            out[((size_t)b * QH + h) * d + e] = L > 0 ? sum / L : 0.0f;
        if (lse && blockIdx.z == 0 && lane == 0)
            lse[(size_t)b * QH + h] = L > 0 ? M + logf(L) : -INFINITY;
    }
}

/* The attributes come from the binary, not from a launch, so the choice (and the workspace size that
 * depends on it) is the same in dqcu_attend_workspace_size and dqcu_attend. */
uint32_t dqcu__attend_blocks_per_sm(const dqcu_codec *dc, const att_attr &a, size_t dyn)
{
    if (!a.ok)
        return 0;
    const cudaFuncAttributes &fa = a.fa;
    if (fa.maxThreadsPerBlock < ATT_THREADS || fa.localSizeBytes > 0)
        return 0;
    const size_t need = dyn + fa.sharedSizeBytes;
    if (need > dc->smem_optin)
        return 0;
    int sm_smem = 0, sm_regs = 0;
    if (cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dc->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_regs, cudaDevAttrMaxRegistersPerMultiprocessor, dc->device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* registers are allocated per warp in units of 256 */
    const uint64_t warp_regs = ((uint64_t)fa.numRegs * 32 + 255) / 256 * 256;
    const uint64_t by_regs = warp_regs ? (uint64_t)sm_regs / (warp_regs * (ATT_THREADS / 32)) : 0;
    const uint64_t by_smem = (uint64_t)sm_smem / (need + 1024);
    uint64_t nb = by_regs < by_smem ? by_regs : by_smem;
    if (nb > 2048 / ATT_THREADS)
        nb = 2048 / ATT_THREADS;
    return (uint32_t)nb;
}

static att_plan att_make_plan(const dqcu_codec *dc, uint32_t nseq, uint32_t QH, uint32_t max_tokens, const att_fit &f)
{
    att_plan pl;
    pl.tpw = (dc->W + ATT_T - 1) / ATT_T;
    const uint64_t tiles = (uint64_t)(max_tokens / dc->W) * pl.tpw;
    pl.smem = f.smem;
    /* v3: 3 blocks per SM, two rounds of them; v5, v7: one round of the blocks that fit (no pipeline
     * to fill: any split is fine, one round avoids a tail) */
    const uint64_t per_sm = f.per_sm < 1 ? 1 : f.per_sm;
    const uint64_t slots = (uint64_t)(dc->sm_count > 0 ? dc->sm_count : 1) * per_sm;
    uint64_t chunk = (tiles * nseq + slots - 1) / slots;
    if (chunk < 1)
        chunk = 1;
    if ((tiles + chunk - 1) / chunk > 8191) /* the merge keeps a weight per split in shared memory */
        chunk = (tiles + 8190) / 8191;
    pl.chunk = (uint32_t)chunk;
    pl.nsplit = (uint32_t)((tiles + chunk - 1) / chunk);
    pl.ws_bytes = (size_t)nseq * (pl.nsplit + 1) * QH * (dc->d + 2) * sizeof(float);
    pl.prep_off = 0;
    if (f.prep_bytes) {
        pl.prep_off = (pl.ws_bytes + 255) & ~(size_t)255;
        pl.ws_bytes = pl.prep_off + (size_t)nseq * f.prep_bytes;
    }
    return pl;
}

struct att_impl {
    int version;
    /* false when the version cannot run q_heads QH with dc; else f is filled */
    bool (*fit)(const dqcu_codec *dc, uint32_t QH, att_fit *f);
    /* runs the window splits (with_tail: and the tail split too, in the same launch) */
    int (*launch)(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream);
    bool with_tail;
};

static bool att3_fit(const dqcu_codec *dc, uint32_t QH, att_fit *f)
{
    f->smem = dqcu__attend3_smem(QH, dc->d);
    f->per_sm = 6;
    f->prep_bytes = 0;
    return true; /* dqcu_attend_check has checked its shared memory */
}

static int att3_launch(const att_params &p, const att_plan &pl, uint32_t nseq, cudaStream_t stream)
{
    return dqcu__attend3_launch(p, pl.smem, nseq, pl.nsplit + 1, stream);
}

/* newest first; the last one takes every shape dqcu_attend_check accepts (version 1; version 2
 * runs on the first alone) */
static const att_impl att_impls[] = {
    {7, dqcu__attend7_fit, dqcu__attend7_launch, false},
    {5, dqcu__attend5_fit, dqcu__attend5_launch, false},
    {3, att3_fit, att3_launch, true},
};
static const int att_versions[] = {7, 5, 3};
#define ATT_NIMPL (sizeof att_impls / sizeof att_impls[0])
static_assert(sizeof att_versions / sizeof att_versions[0] == ATT_NIMPL, "one version number per table entry");

extern "C" const int *dqcu_attend_kernels(size_t *count)
{
    if (count)
        *count = ATT_NIMPL;
    return att_versions;
}

/* The version that runs the windows of q_heads QH (dqcu_attend_check passed), its needs in f;
 * NULL when none takes the codec's containers (fixed-width, or version 2 that v7 does not take). */
static const att_impl *att_pick(const dqcu_codec *dc, uint32_t QH, att_fit *f)
{
    if (dc->fixed)
        return nullptr;
    const int want = dc->settings.attend_kernel;
    if (dc->pairs)
        return (want == 0 || want >= 7) && dqcu__attend7_fit(dc, QH, f) ? &att_impls[0] : nullptr;
    for (size_t i = 0; i + 1 < ATT_NIMPL; i++)
        if ((want == 0 || att_impls[i].version <= want) && att_impls[i].fit(dc, QH, f))
            return &att_impls[i];
    att_impls[ATT_NIMPL - 1].fit(dc, QH, f);
    return &att_impls[ATT_NIMPL - 1];
}

extern "C" int dqcu_attend_check(const dqcu_codec *dc, uint32_t q_heads)
{
    if (!dc)
        return DQ_INVALID_ARGUMENT;
    if (!q_heads || q_heads % dc->kv_heads)
        return DQ_SHAPE;
    if (dc->d < 32 || dc->d > 512 || q_heads / dc->kv_heads > 8)
        return DQ_UNSUPPORTED;
    if (dqcu__attend3_smem(q_heads, dc->d) > dc->smem_optin)
        return DQ_UNSUPPORTED;
    return DQ_OK;
}

extern "C" int dqcu_attend_kernel(const dqcu_codec *dc, uint32_t q_heads)
{
    const int rc = dqcu_attend_check(dc, q_heads);
    if (rc)
        return rc;
    att_fit f;
    const att_impl *im = att_pick(dc, q_heads, &f);
    return im ? im->version : DQ_UNSUPPORTED;
}

extern "C" size_t dqcu_attend_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq, uint32_t max_tokens)
{
    if (!dc || !q_heads)
        return 0;
    att_fit f;
    return att_pick(dc, q_heads, &f) ? att_make_plan(dc, nseq, q_heads, max_tokens, f).ws_bytes : 0;
}

/* This host thread's side stream on device (created on first use, kept for the thread's life; one
 * per thread, so that concurrent callers never share one, and a capture that forks into it stays
 * this thread's). */
#define ATT_MAX_DEVICES 64
static int att_side_stream(int device, cudaStream_t *out)
{
    static thread_local cudaStream_t side[ATT_MAX_DEVICES];
    if (device < 0 || device >= ATT_MAX_DEVICES)
        return DQ_UNSUPPORTED;
    if (!side[device])
        DQCU_CHECK(cudaStreamCreateWithFlags(&side[device], cudaStreamNonBlocking));
    *out = side[device];
    return DQ_OK;
}

extern "C" int dqcu_attend(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs,
                           uint32_t nseq, uint32_t max_tokens, const float *q, float *out, float *lse, void *workspace,
                           size_t workspace_bytes, cudaStream_t stream)
{
    if (!dc || (nseq && (!seqs || !q || !out || !workspace)) || !isfinite(scale))
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu_attend_check(dc, q_heads);
    if (rc)
        return rc;
    att_fit f;
    const att_impl *im = att_pick(dc, q_heads, &f);
    if (!im) /* fixed-width containers, version 2 beyond v7: dqcu_attend_hot over hot windows */
        return DQ_UNSUPPORTED;
    if (nseq > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    rc = dqcu__use_device(dc);
    if (rc)
        return rc;
    if (nseq == 0)
        return DQ_OK;
    const att_plan pl = att_make_plan(dc, nseq, q_heads, max_tokens, f);
    if (workspace_bytes < pl.ws_bytes || ((uintptr_t)workspace & 15))
        return DQ_INVALID_ARGUMENT;
    att_params p = {};
    p.tab = dc->tab;
    p.tab2 = dc->pairs ? dc->tab2 : nullptr;
    p.seqs = seqs;
    p.q = q;
    p.part = (float *)workspace;
    p.qprep = (unsigned char *)workspace + pl.prep_off;
    p.QH = q_heads;
    p.G = q_heads / dc->kv_heads;
    p.chunk = pl.chunk;
    p.nsplit = pl.nsplit;
    p.tpw = pl.tpw;
    p.scale = scale;
    cudaEvent_t fork = nullptr, join = nullptr;
    if (!im->with_tail) {
        /* The BF16 tail (split nsplit) is v3's: one block per sequence, ~180 us on the H200 at any
         * batch, longer than the windows' kernels at batch 1 and 8K. It runs beside them on this
         * thread's side stream, forked from and joined to the caller's stream by events (which a
         * CUDA graph capture turns into edges); the merge waits for both. */
        cudaStream_t side = nullptr;
        rc = att_side_stream(dc->device, &side);
        if (rc)
            return rc;
        att_params pt = p;
        pt.split0 = pl.nsplit;
        DQCU_CHECK_GOTO(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), rc, done);
        DQCU_CHECK_GOTO(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), rc, done);
        DQCU_CHECK_GOTO(cudaEventRecord(fork, stream), rc, done);
        DQCU_CHECK_GOTO(cudaStreamWaitEvent(side, fork, 0), rc, done);
        rc = dqcu__attend3_launch(pt, dqcu__attend3_smem(q_heads, dc->d), nseq, 1, side);
        if (rc)
            goto done;
        DQCU_CHECK_GOTO(cudaEventRecord(join, side), rc, done);
    }
    rc = im->launch(p, pl, nseq, stream);
    if (rc)
        goto done;
    if (join)
        DQCU_CHECK_GOTO(cudaStreamWaitEvent(stream, join, 0), rc, done);
    {
        dim3 mgrid(nseq, q_heads, (dc->d + 31) / 32);
        attend_merge_kernel<<<mgrid, MERGE_THREADS, sizeof(float) * (pl.nsplit + 1), stream>>>(
            (const float *)workspace, pl.nsplit + 1, q_heads, dc->d, out, lse);
        DQCU_CHECK_GOTO(cudaGetLastError(), rc, done);
    }
done:
    /* released when the work recorded on them is done */
    if (fork)
        cudaEventDestroy(fork);
    if (join)
        cudaEventDestroy(join);
    return rc;
}

/* ---- attention over hot windows (attend_hot.cu) ---- */

/* The hot kernel's plan: tiles of 128 tokens split into chunks and KV heads into nhg groups, the
 * fewest groups (a power of two dividing kv_heads) whose blocks fill one round of the GPU's slots;
 * split nsplit is the tail. The same in dqcu_attend_hot_workspace_size and dqcu_attend_hot. */
static int hot_plan_for(const dqcu_codec *dc, uint32_t nseq, uint32_t QH, uint32_t max_tokens, att_plan *pl,
                        uint32_t *nhg_out)
{
    /* Head groups (blocks of hpb = kv_heads / nhg KV heads) and chunks (c tiles per block) by a cost
     * model: the rounds of blocks the GPU's slots run times a block's work in quarter head-tiles,
     * c·(4·hpb + 1) + 20·hpb (a quarter per tile for its (s, o) and prefetches; five head-tiles per
     * KV head for the query preparation, the ring's first copies and the finish: run 125 measured
     * 14-21 quarters, from the time of the plans weights 4 and 40 pick at (32, 32K+13),
     * (128, 8K+100) and (126, 32K+100); weight 4, kept from run 80 to run 124, cut the first two
     * into chunks of 16 tiles over 8 KV heads, 6-9% slower). Rounds, not blocks: 798 blocks on 792
     * slots take two rounds (run 80: e2e at batch 399 lost 10% to that). The fewest splits and
     * groups win ties; no more splits than eight rounds' worth (no quantization left to gain). */
    const uint32_t tpw = (dc->W + ATT_T - 1) / ATT_T;
    const uint64_t tiles = (uint64_t)(max_tokens / dc->W) * tpw;
    const uint64_t sms = dc->sm_count > 0 ? (uint64_t)dc->sm_count : 1;
    uint64_t best = UINT64_MAX, best_c = 1;
    uint32_t best_g = 0;
    att_fit bf = {};
    for (uint32_t g = 1; g <= dc->kv_heads && dc->kv_heads % g == 0; g *= 2) {
        att_fit f;
        if (!dqcu__attend_hot_fit(dc, QH, dc->kv_heads / g, &f))
            continue;
        const uint64_t slots = sms * f.per_sm, hpb = dc->kv_heads / g, units = (uint64_t)nseq * g;
        if (tiles == 0) {
            /* the tail alone: the most groups (the last fitting g) */
            best_g = g;
            bf = f;
            continue;
        }
        uint64_t max_ns = 8 * slots / units;
        max_ns = max_ns < 1 ? 1 : max_ns > tiles ? tiles : max_ns > 8191 ? 8191 : max_ns;
        for (uint64_t ns = 1; ns <= max_ns; ns++) {
            const uint64_t c = (tiles + ns - 1) / ns;
            if ((tiles + c - 1) / c != ns)
                continue; /* ns splits of c tiles are not ns: a smaller ns has this c */
            const uint64_t cost = (units * ns + slots - 1) / slots * (c * (4 * hpb + 1) + 20 * hpb);
            if (cost < best) {
                best = cost;
                best_c = c;
                best_g = g;
                bf = f;
            }
        }
    }
    if (!best_g)
        return DQ_UNSUPPORTED;
    pl->tpw = tpw;
    pl->chunk = (uint32_t)best_c;
    pl->nsplit = (uint32_t)((tiles + best_c - 1) / best_c);
    pl->smem = bf.smem;
    pl->ws_bytes = (size_t)nseq * (pl->nsplit + 1) * QH * (dc->d + 2) * sizeof(float);
    pl->prep_off = 0;
    pl->slots = (uint64_t)sms * bf.per_sm;
    *nhg_out = best_g;
    return DQ_OK;
}

/* The merge of few splits (at most 32, large batches): a warp per (sequence, query head), lane s
 * holding split s's max and sum, the weighted rows added split by split (independent loads) with
 * the lanes over channels. attend_merge_kernel's 1024 threads per head would be mostly idle. */
#define MERGE_WARP_MAX 32
__global__ void __launch_bounds__(128) attend_merge_warp_kernel(const float *part, uint32_t nsplit_total, uint32_t QH,
                                                                uint32_t d, uint32_t nitems, float *out, float *lse)
{
    const uint32_t lane = threadIdx.x & 31u, item = blockIdx.x * 4u + (threadIdx.x >> 5);
    if (item >= nitems)
        return;
    const size_t b = item / QH, stride = (size_t)QH * (d + 2);
    const uint32_t h = item % QH;
    const float *ph = part + b * nsplit_total * stride + (size_t)h * (d + 2);
    const float ms = lane < nsplit_total ? ph[lane * stride + d] : -INFINITY;
    const float ls = lane < nsplit_total ? ph[lane * stride + d + 1] : 0.0f;
    const float M = dqcu_warp_max(ms);
    const float w = ms == -INFINITY ? 0.0f : expf(ms - M);
    const float L = dqcu_warp_sum(w * ls);
    float v[ATT_DVMAX / 2];
#pragma unroll
    for (int k = 0; k < ATT_DVMAX / 2; k++)
        v[k] = 0.0f;
#pragma unroll 4
    for (uint32_t s = 0; s < nsplit_total; s++) {
        const float ws = __shfl_sync(DQCU_FULL, w, (int)s);
        if (ws != 0.0f) {
#pragma unroll
            for (int k = 0; k < ATT_DVMAX / 2; k++) {
                const uint32_t e = lane + 32u * (uint32_t)k;
                if (e < d)
                    v[k] = __fmaf_rn(ws, ph[s * stride + e], v[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < ATT_DVMAX / 2; k++) {
        const uint32_t e = lane + 32u * (uint32_t)k;
        if (e < d)
            out[((size_t)b * QH + h) * d + e] = L > 0 ? v[k] / L : 0.0f;
    }
    if (lse && lane == 0)
        lse[(size_t)b * QH + h] = L > 0 ? M + logf(L) : -INFINITY;
}

extern "C" int dqcu_attend_hot_check(const dqcu_codec *dc, uint32_t q_heads)
{
    int rc = dqcu_attend_check(dc, q_heads);
    if (rc)
        return rc;
    att_fit f;
    for (uint32_t g = 1; g <= dc->kv_heads && dc->kv_heads % g == 0; g *= 2)
        if (dqcu__attend_hot_fit(dc, q_heads, dc->kv_heads / g, &f))
            return DQ_OK;
    return DQ_UNSUPPORTED;
}

extern "C" int dqcu_attend_hot_kernel(const dqcu_codec *dc, uint32_t q_heads)
{
    const int rc = dqcu_attend_hot_check(dc, q_heads);
    return rc ? rc : dqcu__attend_hot_version(dc);
}

extern "C" size_t dqcu_attend_hot_workspace_size(const dqcu_codec *dc, uint32_t q_heads, uint32_t nseq,
                                                 uint32_t max_tokens)
{
    if (!dc || !q_heads || dqcu_attend_hot_check(dc, q_heads))
        return 0;
    att_plan pl;
    uint32_t nhg;
    return hot_plan_for(dc, nseq, q_heads, max_tokens, &pl, &nhg) ? 0 : pl.ws_bytes;
}

extern "C" int dqcu_attend_hot(const dqcu_codec *dc, uint32_t q_heads, float scale, const dqcu_attn_seq *seqs,
                               uint32_t nseq, uint32_t max_tokens, const float *q, float *out, float *lse,
                               void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (!dc || (nseq && (!seqs || !q || !out || !workspace)) || !isfinite(scale))
        return DQ_INVALID_ARGUMENT;
    int rc = dqcu_attend_hot_check(dc, q_heads);
    if (rc)
        return rc;
    if (nseq > 0x7fffffffu)
        return DQ_INVALID_ARGUMENT;
    rc = dqcu__use_device(dc);
    if (rc || nseq == 0)
        return rc;
    att_plan pl;
    uint32_t nhg;
    rc = hot_plan_for(dc, nseq, q_heads, max_tokens, &pl, &nhg);
    if (rc)
        return rc;
    if (workspace_bytes < pl.ws_bytes || ((uintptr_t)workspace & 15))
        return DQ_INVALID_ARGUMENT;
    if ((uint64_t)pl.nsplit * nhg + dc->kv_heads > 65535) /* the grid's rows, the tail's a KV head each at most */
        return DQ_UNSUPPORTED;
    att_params p = {};
    p.tab = dc->tab;
    p.seqs = seqs;
    p.q = q;
    p.part = (float *)workspace;
    p.QH = q_heads;
    p.G = q_heads / dc->kv_heads;
    p.chunk = pl.chunk;
    p.nsplit = pl.nsplit;
    p.tpw = pl.tpw;
    p.scale = scale;
    rc = dqcu__attend_hot_launch(dc, p, pl, nhg, nseq, stream);
    if (rc)
        return rc;
    if (pl.nsplit + 1 <= MERGE_WARP_MAX) {
        const uint64_t items = (uint64_t)nseq * q_heads;
        attend_merge_warp_kernel<<<(unsigned)((items + 3) / 4), 128, 0, stream>>>(
            (const float *)workspace, pl.nsplit + 1, q_heads, dc->d, (uint32_t)items, out, lse);
        DQCU_CHECK_LAUNCH();
        return DQ_OK;
    }
    dim3 mgrid(nseq, q_heads, (dc->d + 31) / 32);
    attend_merge_kernel<<<mgrid, MERGE_THREADS, sizeof(float) * (pl.nsplit + 1), stream>>>(
        (const float *)workspace, pl.nsplit + 1, q_heads, dc->d, out, lse);
    DQCU_CHECK_LAUNCH();
    return DQ_OK;
}
