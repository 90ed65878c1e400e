/* bench_cuda — times libdquant-cuda's encoders and decompression on the Qwen3-8B shape (32 query
 * heads, 8 KV heads, head_dim 128, dq226) and prints one JSON object per line; with --attn, also
 * decode attention alone (the driver Nsight Compute profiles, tests/cuda/ncu_profile.sh). Decode
 * attention against BF16 attention, per layer and in a whole decode step, is bench_truth.py's.
 *
 *   bench_cuda [--attn B:CTX ...] [--prefill TOKENS:LAYERS] [--quick] [--attend-kernel auto|V]
 *
 * --attend-kernel: the attention version asked for (dqcu_settings.attend_kernel; default auto); the
 * "attn" records name the version that ran. The encoders: every registered version in one run.
 *
 * Records: {"kind":"copy"}: device-to-device copy bandwidth (bytes read + written per second);
 * {"kind":"encode_streams"|"encode_windows"}: streams per second; {"kind":"prefill"}: a whole prefill
 * (TOKENS tokens of each of LAYERS layers, BF16, one dqcu_encode_windows call per layer) on 1 and
 * on 2 CUDA streams; {"kind":"decompress"}: GB/s of BF16 written; {"kind":"attn"}: one
 * decode-attention call of one layer for B sequences of CTX tokens: CTX / W sealed windows and a
 * BF16 tail of CTX mod W tokens per sequence (ms per call, bytes read, GB/s). Containers come from a
 * pool of windows encoded on the GPU from random data; sequences point into the pool, each has its
 * own tail, and the calls rotate through enough sets that the timed bytes come from device memory,
 * not from L2; the time is that of many back-to-back calls, divided. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"

static const uint32_t QH = 32, KVH = 8, D = 128;

/* A device codec of c with these versions (dqcu_settings); exits on failure. */
static dqcu_codec *make_gpu(const dq_codec *c, int encode_kernel, int encode_schedule, int attend_kernel)
{
    dqcu_settings st;
    dqcu_settings_default(&st);
    st.encode_kernel = encode_kernel;
    st.encode_schedule = encode_schedule;
    st.attend_kernel = attend_kernel;
    dqcu_codec *g = nullptr;
    DQ(dqcu_codec_create_with(c, &st, &g));
    return g;
}

struct Pool {
    size_t nwin = 0, wb = 0;
    DevBuf<uint8_t> data;
    std::vector<const uint8_t *> ptrs;
};

/* Random BF16 K/V tokens on the device: keys with channel offsets. */
__global__ void gen_tokens_kernel(uint16_t *x, size_t count, uint32_t n, uint64_t seed, int keys)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        /* sum of 4 uniforms: roughly normal */
        float u = 0;
        for (int k = 0; k < 4; k++)
            u += (float)((z >> (16 * k)) & 0xffffu) * (1.0f / 65536.0f);
        float v = (u - 2.0f) * 1.7f;
        if (keys) {
            uint32_t j = (uint32_t)(i % n);
            v += 2.0f * sinf((float)j * 0.37f);
        }
        uint32_t b = __float_as_uint(v);
        x[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    }
}

static void build_pool(const dqcu_codec *g, const dq_codec *c, size_t nwin, Pool &pool)
{
    const uint32_t n = KVH * D, W = dq_codec_profile(c)->window;
    pool.nwin = nwin;
    pool.wb = dq_codec_window_bytes(c);
    pool.data.alloc(nwin * pool.wb);
    pool.ptrs.resize(nwin);
    for (size_t w = 0; w < nwin; w++)
        pool.ptrs[w] = pool.data.p + w * pool.wb;
    const size_t chunk = 512;
    DevBuf<uint16_t> k(chunk * W * n), v(chunk * W * n);
    DevBuf<uint8_t *> dptr(chunk);
    DevBuf<int32_t> st(chunk);
    for (size_t w0 = 0; w0 < nwin; w0 += chunk) {
        size_t cnt = std::min(chunk, nwin - w0);
        gen_tokens_kernel<<<1024, 256>>>(k.p, cnt * W * n, n, 0x1234 + w0, 1);
        gen_tokens_kernel<<<1024, 256>>>(v.p, cnt * W * n, n, 0x9876 + w0, 0);
        std::vector<uint8_t *> p(cnt);
        for (size_t i = 0; i < cnt; i++)
            p[i] = (uint8_t *)pool.ptrs[w0 + i];
        dptr.upload(p.data(), cnt);
        DQ(dqcu_encode_windows(g, k.p, v.p, DQ_DTYPE_BF16, cnt, dptr.p, st.p, NULL, 0));
    }
    CK(cudaDeviceSynchronize());
}

/* One attention configuration: B sequences of ctx tokens, ctx / W windows and a tail of ctx mod W
 * tokens each. */
static void bench_attn(const dqcu_codec *g, const Pool &pool, uint32_t W, uint32_t B, uint32_t ctx, double copy_bw)
{
    const uint32_t nwin = ctx / W, tail = ctx - nwin * W;
    const size_t per_set = (size_t)B * nwin;
    const size_t tail_vals = (size_t)tail * KVH * D, set_bytes = per_set * pool.wb + (size_t)B * tail_vals * 4;
    /* enough sets that the rotation touches several times the L2 */
    size_t sets = 1;
    while (sets < 256 && sets * set_bytes < ((size_t)400 << 20))
        sets++;
    std::vector<DevBuf<const uint8_t *> *> dptrs(sets);
    std::vector<DevBuf<dqcu_attn_seq> *> dseqs(sets);
    /* every sequence of every set its own K and V tail */
    DevBuf<uint16_t> dtail(std::max<size_t>(sets * B * tail_vals * 2, 1));
    gen_tokens_kernel<<<1024, 256>>>(dtail.p, dtail.n, KVH * D, 0x7a11 + ctx, 0);
    CK(cudaGetLastError());
    size_t off = 0;
    for (size_t s = 0; s < sets; s++) {
        std::vector<const uint8_t *> p(per_set);
        for (size_t i = 0; i < per_set; i++)
            p[i] = pool.ptrs[(off + i) % pool.nwin];
        off += per_set;
        dptrs[s] = new DevBuf<const uint8_t *>(std::max<size_t>(per_set, 1));
        dptrs[s]->upload(p.data(), per_set);
        std::vector<dqcu_attn_seq> sq(B);
        for (uint32_t b = 0; b < B; b++) {
            const uint16_t *tk = dtail.p + ((s * B + b) * 2) * tail_vals;
            sq[b] = {dptrs[s]->p + (size_t)b * nwin, tk, tk + tail_vals, nwin, tail};
        }
        dseqs[s] = new DevBuf<dqcu_attn_seq>(B);
        dseqs[s]->upload(sq.data(), B);
    }
    std::vector<float> qh((size_t)B * QH * D);
    Rng r(B * 131u + ctx);
    for (auto &x : qh)
        x = (float)r.normal();
    DevBuf<float> dq(qh.size()), dout(qh.size()), dlse((size_t)B * QH);
    dq.upload(qh.data(), qh.size());
    const size_t wsb = dqcu_attend_workspace_size(g, QH, B, ctx);
    DevBuf<uint8_t> dws(std::max<size_t>(wsb, 1));
    const float scale = 1.0f / sqrtf((float)D);
    size_t it = 0;
    auto run = [&] {
        size_t s = it++ % sets;
        DQ(dqcu_attend(g, QH, scale, dseqs[s]->p, B, ctx, dq.p, dout.p, dlse.p, dws.p, wsb, 0));
    };
    /* whole passes over the sets, at least 16 calls per timed run */
    const int calls = (int)(sets * ((16 + sets - 1) / sets));
    double ms = time_per_call_ms(run, (int)sets + 2, calls, 7);
    const double bytes = (double)set_bytes + (double)B * QH * D * 4.0 * 2.0;
    printf("{\"kind\":\"attn\",\"version\":%d,\"batch\":%u,\"ctx\":%u,\"nwin\":%u,\"tail\":%u,\"ms\":%.5f,"
           "\"bytes\":%.0f,\"gbps\":%.2f,\"copy_frac\":%.4f,\"sets\":%zu,\"calls\":%d,\"workspace\":%zu}\n",
           dqcu_attend_kernel(g, QH), B, ctx, nwin, tail, ms, bytes, bytes / (ms * 1e6), bytes / (ms * 1e-3) / copy_bw,
           sets, calls, wsb);
    fflush(stdout);
    for (size_t s = 0; s < sets; s++) {
        delete dptrs[s];
        delete dseqs[s];
    }
}

int main(int argc, char **argv)
{
    std::vector<std::pair<uint32_t, uint32_t>> attn;
    bool quick = false;
    uint32_t pf_tokens = 65536, pf_layers = 36;
    int att_kernel = DQCU_KERNEL_AUTO;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--attn") && i + 1 < argc) {
            unsigned b, c;
            if (sscanf(argv[++i], "%u:%u", &b, &c) != 2 || b == 0 || c == 0) {
                fprintf(stderr, "--attn wants BATCH:CONTEXT, both positive\n");
                return 2;
            }
            attn.push_back({b, c});
        } else if (!strcmp(argv[i], "--prefill") && i + 1 < argc) {
            if (sscanf(argv[++i], "%u:%u", &pf_tokens, &pf_layers) != 2) {
                fprintf(stderr, "--prefill wants TOKENS:LAYERS\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--attend-kernel") && i + 1 < argc) {
            const char *v = argv[++i];
            att_kernel = !strcmp(v, "auto") ? DQCU_KERNEL_AUTO : atoi(v);
        } else {
            fprintf(stderr,
                    "usage: %s [--attn B:CTX ...] [--prefill TOKENS:LAYERS] [--quick] [--attend-kernel auto|V]\n",
                    argv[0]);
            return 2;
        }
    }
    if (dqcu_device_count() == 0) {
        printf("{\"kind\":\"skip\",\"reason\":\"no CUDA device of compute capability 9.0\"}\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    dq_profile prof;
    DQ(dq_profile_builtin("dq226", KVH, D, &prof));
    dq_codec *c;
    DQ(dq_codec_create(&prof, NULL, &c));
    dqcu_codec *g = make_gpu(c, DQCU_KERNEL_AUTO, DQCU_SCHEDULE_PLANNED, att_kernel);
    const uint32_t n = KVH * D, W = prof.window;
    printf("{\"kind\":\"device\",\"name\":\"%s\",\"sms\":%d,\"l2_mb\":%.1f,\"profile\":\"dq226\",\"window_bytes\":%zu,"
           "\"q_heads\":%u,\"kv_heads\":%u,\"head_dim\":%u}\n",
           prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0, dq_codec_window_bytes(c), QH, KVH, D);
    const double copy_bw = measure_copy_bw((size_t)2 << 30);
    printf("{\"kind\":\"copy\",\"bytes_per_s\":%.4e}\n", copy_bw);
    fflush(stdout);

    /* encode throughput */
    {
        const size_t count = quick ? 65536 : 262144;
        DevBuf<uint16_t> tok(count * n);
        gen_tokens_kernel<<<1024, 256>>>(tok.p, count * n, n, 7, 0);
        /* preprocessed streams: the same values as f32 (already "rotated") */
        std::vector<uint16_t> hb(count * n);
        tok.download(hb.data(), hb.size());
        std::vector<float> hf(hb.size());
        for (size_t i = 0; i < hb.size(); i++)
            hf[i] = dq_bf16_to_f32(hb[i]);
        DevBuf<float> y(hf.size());
        y.upload(hf.data(), hf.size());
        /* every encoder version (dqcu_encode_kernels), the default one first */
        size_t nvers = 0;
        const int *vers = dqcu_encode_kernels(&nvers);
        const int ver0 = vers[0];
        /* the default version with the planned waves and with the plain grid, alternately, at the
         * bench's size and at one layer of a 64K-token prefill; the other versions planned */
        struct Case {
            int ver, plain;
            size_t count;
        };
        std::vector<Case> cases;
        for (int rep = 0; rep < 2; rep++)
            for (size_t cnt : {count, count / 4})
                for (int plain : {DQCU_SCHEDULE_PLANNED, DQCU_SCHEDULE_PLAIN})
                    cases.push_back({ver0, plain, cnt});
        for (size_t i = 1; i < nvers; i++)
            cases.push_back({vers[i], DQCU_SCHEDULE_PLANNED, count});
        for (const Case &cs : cases)
            for (int kind = 0; kind < 2; kind++) {
                const size_t rb = dq_codec_record_bytes(c, (dq_kind)kind);
                DevBuf<uint8_t> rec(cs.count * rb);
                DevBuf<int32_t> st(cs.count);
                dqcu_codec *ge = make_gpu(c, cs.ver, cs.plain, att_kernel);
                double ms = time_median_ms(
                    [&] { DQ(dqcu_encode_streams(ge, (dq_kind)kind, y.p, cs.count, rec.p, rb, st.p, NULL, 0)); }, 1, 5);
                dqcu_codec_free(ge);
                printf("{\"kind\":\"encode_streams\",\"version\":%d,\"grid\":\"%s\",\"stream\":\"%s\",\"streams\":%zu,"
                       "\"ms\":%.4f,\"streams_per_s\":%.4e}\n",
                       cs.ver, cs.plain ? "plain" : "planned", kind ? "V" : "K", cs.count, ms, cs.count / (ms * 1e-3));
                fflush(stdout);
            }
        const size_t nwin = count / W / 2;
        Pool tmp;
        tmp.wb = dq_codec_window_bytes(c);
        DevBuf<uint8_t> out(nwin * tmp.wb);
        std::vector<uint8_t *> p(nwin);
        for (size_t w = 0; w < nwin; w++)
            p[w] = out.p + w * tmp.wb;
        DevBuf<uint8_t *> dptr(nwin);
        dptr.upload(p.data(), nwin);
        DevBuf<int32_t> st(nwin);
        DevBuf<uint16_t> vtok(nwin * W * n);
        gen_tokens_kernel<<<1024, 256>>>(vtok.p, nwin * W * n, n, 99, 0);
        for (const Case &cs : cases) {
            if (cs.count != count)
                continue;
            dqcu_codec *ge = make_gpu(c, cs.ver, cs.plain, att_kernel);
            double ms = time_median_ms(
                [&] { DQ(dqcu_encode_windows(ge, tok.p, vtok.p, DQ_DTYPE_BF16, nwin, dptr.p, st.p, NULL, 0)); }, 1, 5);
            dqcu_codec_free(ge);
            printf("{\"kind\":\"encode_windows\",\"version\":%d,\"grid\":\"%s\",\"windows\":%zu,\"streams\":%zu,"
                   "\"ms\":%.4f,\"streams_per_s\":%.4e}\n",
                   cs.ver, cs.plain ? "plain" : "planned", nwin, nwin * W * 2, ms, nwin * W * 2 / (ms * 1e-3));
            fflush(stdout);
        }
    }

    /* a prefill: every layer's windows in one call per layer, inputs rotating through 4 sets of
     * 2·TOKENS tokens (more than L2 holds), every layer's windows kept; the layers' calls go to 1 or
     * 2 CUDA streams (blocking ones, so the events on the legacy stream bound all of the work) */
    if (pf_layers > 0 && pf_tokens >= W) {
        const uint32_t layers = quick ? std::min<uint32_t>(pf_layers, 4) : pf_layers;
        const size_t nwin = pf_tokens / W, wb = dq_codec_window_bytes(c), sets = std::min<uint32_t>(layers, 4);
        const size_t set_vals = nwin * W * n;
        DevBuf<uint16_t> kin(sets * set_vals), vin(sets * set_vals);
        gen_tokens_kernel<<<1024, 256>>>(kin.p, kin.n, n, 1234, 1);
        gen_tokens_kernel<<<1024, 256>>>(vin.p, vin.n, n, 5678, 0);
        DevBuf<uint8_t> out(layers * nwin * wb);
        std::vector<uint8_t *> p(layers * nwin);
        for (size_t i = 0; i < p.size(); i++)
            p[i] = out.p + i * wb;
        DevBuf<uint8_t *> dptr(p.size());
        dptr.upload(p.data(), p.size());
        DevBuf<int32_t> st(layers * nwin);
        cudaStream_t cs[2];
        for (auto &x : cs)
            CK(cudaStreamCreate(&x));
        for (int rep = 0; rep < 4; rep++) {
            const int ns = 1 + (rep & 1), plain = rep >> 1;
            dqcu_codec *ge = make_gpu(c, DQCU_KERNEL_AUTO, plain ? DQCU_SCHEDULE_PLAIN : DQCU_SCHEDULE_PLANNED,
                                      att_kernel);
            double ms = time_median_ms(
                [&] {
                    for (uint32_t l = 0; l < layers; l++)
                        DQ(dqcu_encode_windows(ge, kin.p + (l % sets) * set_vals, vin.p + (l % sets) * set_vals,
                                               DQ_DTYPE_BF16, nwin, dptr.p + l * nwin, st.p + l * nwin, NULL,
                                               cs[l % ns]));
                },
                1, 5);
            dqcu_codec_free(ge);
            std::vector<int32_t> hs(st.n);
            st.download(hs.data(), hs.size());
            for (int32_t v : hs)
                if (v != 0) {
                    fprintf(stderr, "prefill: a window's status is %d\n", v);
                    return 1;
                }
            const double streams = (double)layers * nwin * W * 2;
            printf("{\"kind\":\"prefill\",\"grid\":\"%s\",\"tokens\":%zu,\"layers\":%u,\"cuda_streams\":%d,"
                   "\"streams\":%.0f,\"ms\":%.3f,\"streams_per_s\":%.4e}\n",
                   plain ? "plain" : "planned", nwin * W, layers, ns, streams, ms, streams / (ms * 1e-3));
            fflush(stdout);
        }
        for (auto &x : cs)
            CK(cudaStreamDestroy(x));
    }

    Pool pool;
    build_pool(g, c, 4096, pool);

    /* decompress K and V of the pool's windows to BF16 */
    {
        const size_t nwin = std::min<size_t>(pool.nwin, 2048), ntok = nwin * W;
        DevBuf<const uint8_t *> dptr(nwin);
        dptr.upload(pool.ptrs.data(), nwin);
        DevBuf<uint16_t> out(ntok * n);
        for (int kind = 0; kind < 2; kind++) {
            double ms = time_median_ms(
                [&] {
                    DQ(dqcu_decompress(g, (dq_kind)kind, dptr.p, nwin, NULL, 0, 0, ntok, out.p, DQ_DTYPE_BF16, NULL,
                                       0));
                },
                2, 7);
            const double outb = ntok * n * 2.0, inb = nwin * (double)dq_codec_record_bytes(c, (dq_kind)kind) * W;
            printf("{\"kind\":\"decompress\",\"stream\":\"%s\",\"tokens\":%zu,\"ms\":%.4f,\"bf16_gbps\":%.2f,"
                   "\"in_gbps\":%.2f,\"copy_frac\":%.4f}\n",
                   kind ? "V" : "K", ntok, ms, outb / (ms * 1e6), inb / (ms * 1e6),
                   (outb + inb) / (ms * 1e-3) / copy_bw);
            fflush(stdout);
        }
    }

    for (auto &bc : attn)
        bench_attn(g, pool, W, bc.first, bc.second, copy_bw);

    dqcu_codec_free(g);
    dq_codec_free(c);
    return 0;
}
