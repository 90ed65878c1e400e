/* checkcuda — every libdquant-cuda kernel against libdquant on fresh random inputs (checkasm style).
 *
 *   encode  (streams and windows): containers byte-identical, same status codes, same statistics
 *   decompress: output bytes identical to dq_layer_decode / dq_tokens_decode (corrupt ones too)
 *   attention: within 1e-3 relative of dq_attend and of dq_attend_reference
 * Output buffers are poisoned first so unwritten elements show. Inputs are drawn from a seed taken
 * from the clock (printed; --seed N repeats a run). Then it times each kernel (events, warm-up,
 * median) on the dq226 shape. Every kernel version the library registers (dqcu_encode_kernels,
 * dqcu_attend_kernels) is checked and timed in the same process: each through a device codec whose
 * dqcu_settings name it.
 *
 *   fixed-width family (dq_profile_fixed): encode (streams and windows, random and the real KV
 *   captures of ../shared/data) byte-identical to lib's encoder, decompress and attend refused
 *   hot layout: dqcu_transcode_hot byte-identical to dq_hot_transcode (corrupt containers too),
 *   dqcu_rebuild_hot giving back the records byte for byte (a code that is not a level counted),
 *   dqcu_attend_hot within 1e-3 relative of dq_hot_attend and of dq_attend_reference; the same for
 *   the fixed-width family
 *
 *   format version 2 (dq226p, dq196p; records from libdquant): dqcu_decompress, dqcu_transcode_hot
 *   and dqcu_rebuild_hot byte-identical (corrupt containers too), dqcu_attend_hot as above, the
 *   encoders and container attention refusing it; also on the real bytellama-n1024 cache
 *   (DIR/bytellama-n1024/kv_f16.bin; DIR: --data, $DQ_DATA_DIR or ../shared/data; skipped if absent)
 *
 *   checkcuda [--seed N] [--small] [--no-timing] [--quiet] [--hot] [--fixed] [--format2] [--data DIR]
 *             [--encode-kernel V,...] [--attend-kernel V,...]
 *   --small: a few small cases only (for compute-sanitizer memcheck / racecheck runs).
 *   --hot: the hot layout alone on its shapes (production dq226 first), with the container
 *   attention versions of --attend-kernel on the same inputs; with --small one GQA group per shape
 *   and no container attention (for compute-sanitizer runs on the production shape).
 *   --fixed: the fixed-width family's encoder alone (test_fixed_encode; with --small one shape).
 *   --format2: the format version 2 checks alone (with --small: the built-ins and one real layer).
 *   --encode-kernel, --attend-kernel: only these versions (default: every registered one, the
 *   default first).
 * Exit status: 0 all passed, 1 a check failed, 2 a setup error, 77 no suitable GPU (skipped). */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"

extern "C" {
#include "codec_internal.h"
#include "drift.h"
}

static int g_checks, g_failures, g_quiet;

/* the settings of the device codecs make_codecs and set_gpu create */
static int g_enc_version, g_att_version, g_schedule, g_hot_version;

static void report(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(bool ok, const char *fmt, ...)
{
    g_checks++;
    if (!ok)
        g_failures++;
    if (ok && g_quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "  ok  " : "  FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

/* ---- codecs ---- */

struct Cfg {
    uint32_t kvh, d, MK, MV, W, R;
    double rate_k, rate_v; /* payload bits per value (C derived); <= 0.5 → the smallest C allowed */
    uint64_t seed;
    const char *builtin; /* or NULL */
};

struct Codecs {
    dq_codec *c = nullptr;
    dq_workspace *ws = nullptr;
    dqcu_codec *g = nullptr;
    uint32_t n = 0, d = 0, kvh = 0, W = 0, R = 0;
    std::string name;
    ~Codecs()
    {
        dqcu_codec_free(g);
        dq_workspace_free(ws);
        dq_codec_free(c);
    }
};

/* The encoder version g_enc_version names (the library's default for DQCU_KERNEL_AUTO). */
static int enc_ver(void)
{
    return g_enc_version != DQCU_KERNEL_AUTO ? g_enc_version : dqcu_encode_kernels(NULL)[0];
}

/* (Re)creates cs.g with the versions in g_enc_version, g_att_version, g_schedule, g_hot_version. */
static bool set_gpu(Codecs &cs)
{
    dqcu_codec_free(cs.g);
    cs.g = nullptr;
    dqcu_settings st;
    dqcu_settings_default(&st);
    st.encode_kernel = g_enc_version;
    st.attend_kernel = g_att_version;
    st.encode_schedule = g_schedule;
    st.hot_kernel = g_hot_version;
    DQ(dqcu_codec_create_with(cs.c, &st, &cs.g));
    return true;
}

/* format: the format_version of a profile made from cfg's parameters (0: version 1) */
static bool make_codecs(const Cfg &cfg, Codecs &cs, uint32_t format = 0)
{
    dq_profile prof;
    if (cfg.builtin) {
        DQ(dq_profile_builtin(cfg.builtin, cfg.kvh, cfg.d, &prof));
    } else {
        dq_profile_params pp;
        dq_profile_params_default(&pp);
        pp.kv_heads = cfg.kvh;
        pp.head_dim = cfg.d;
        pp.levels[0] = cfg.MK;
        pp.levels[1] = cfg.MV;
        pp.window = cfg.W;
        pp.residual = cfg.R;
        pp.rotation_seed = cfg.seed;
        pp.format_version = format;
        const double n = (double)cfg.kvh * cfg.d;
        const double rate[2] = {cfg.rate_k, cfg.rate_v};
        for (int k = 0; k < 2; k++)
            pp.container_bytes[k] = (uint32_t)fmax(5.0, floor((rate[k] * n + 32.0) / 8.0 + 0.5));
        int rc;
        for (int tries = 0;; tries++) {
            rc = dq_profile_make(&pp, &prof);
            if (rc != DQ_CONTAINER_TOO_SMALL || tries > 100000)
                break;
            /* grow the container that is too small (profile_make does not say which) */
            for (int k = 0; k < 2; k++)
                pp.container_bytes[k] += 1 + pp.container_bytes[k] / 256;
        }
        DQ(rc);
    }
    DQ(dq_codec_create(&prof, NULL, &cs.c));
    DQ(dq_workspace_create(cs.c, &cs.ws));
    cs.n = prof.kv_heads * prof.head_dim;
    cs.d = prof.head_dim;
    cs.kvh = prof.kv_heads;
    cs.W = prof.window;
    cs.R = prof.residual;
    char buf[160];
    snprintf(buf, sizeof buf, "%s n=%u(%ux%u) M=%u/%u C=%u/%u W=%u R=%u seed=%llx", prof.name, cs.n, cs.kvh, cs.d,
             prof.levels[0], prof.levels[1], prof.container_bytes[0], prof.container_bytes[1], prof.window,
             prof.residual, (unsigned long long)prof.rotation_seed);
    cs.name = buf;
    return set_gpu(cs);
}

/* ---- stream inputs (the rotated, mean-removed domain) ---- */

enum Dist {
    D_GAUSS,
    D_HEAVY,
    D_CONST,
    D_TINY,
    D_SUBNORMAL,
    D_TWO,
    D_UNIFORM,
    D_OUTLIER,
    D_EDGE,
    D_ZERO_END,
    D_ZEROS,
    D_COUNT
};
static const char *dist_name[D_COUNT] = {"gauss",   "heavy",   "const", "tiny",     "subnormal", "two",
                                         "uniform", "outlier", "edge",  "zero_end", "zeros"};

static void gen_stream(Rng &r, int dist, uint32_t n, float *y)
{
    const double scale = pow(10.0, -3.0 + 5.0 * r.uniform());
    const double off = r.normal() * scale * (r.below(2) ? 3.0 : 0.0);
    switch (dist) {
    case D_GAUSS:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(off + scale * r.normal());
        break;
    case D_HEAVY:
        for (uint32_t i = 0; i < n; i++) {
            double v = off + scale * r.normal() * exp(1.5 * r.normal());
            y[i] = (float)fmax(-29000.0, fmin(29000.0, v));
        }
        break;
    case D_CONST: {
        float c = r.below(4) == 0 ? 0.0f : (float)(off + scale * r.normal());
        for (uint32_t i = 0; i < n; i++)
            y[i] = (c == 0.0f && r.below(2)) ? -0.0f : c;
        break;
    }
    case D_TINY: {
        float c = (float)(off + scale * r.normal());
        for (uint32_t i = 0; i < n; i++) {
            float v = c;
            int steps = (int)r.below(5) - 2;
            for (int k = 0; k < abs(steps); k++)
                v = nextafterf(v, steps > 0 ? INFINITY : -INFINITY);
            y[i] = v;
        }
        break;
    }
    case D_SUBNORMAL:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(r.normal() * 1e-41);
        break;
    case D_TWO: {
        float a = (float)(off + scale * r.normal()), b = (float)(off + scale * r.normal());
        for (uint32_t i = 0; i < n; i++)
            y[i] = r.below(2) ? a : b;
        break;
    }
    case D_UNIFORM:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(off + scale * (2.0 * r.uniform() - 1.0));
        break;
    case D_OUTLIER:
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(scale * r.normal());
        y[r.below(n)] = (float)(scale * 3000.0 * (r.below(2) ? 1 : -1));
        for (uint32_t i = 0; i < n; i++)
            y[i] = fmaxf(-29000.0f, fminf(29000.0f, y[i]));
        break;
    case D_EDGE: /* the format's range limits */
        for (uint32_t i = 0; i < n; i++)
            y[i] = (float)(r.uniform() * 59999.0 - 29999.5);
        y[0] = DQ_STREAM_MAX_ABS;
        y[n - 1] = -DQ_STREAM_MAX_ABS;
        break;
    case D_ZERO_END: { /* one side of zero, signed zeros at that end: lib's key order picks the extreme */
        const float sgn = r.below(2) ? 1.0f : -1.0f;
        for (uint32_t i = 0; i < n; i++)
            y[i] = r.below(4) ? sgn * (float)fabs(scale * r.normal()) : r.below(2) ? 0.0f : -0.0f;
        break;
    }
    default:
        for (uint32_t i = 0; i < n; i++)
            y[i] = r.below(3) ? 0.0f : -0.0f;
        break;
    }
}

/* First difference between two records, reported with both decoded values. */
static void explain_record_mismatch(const Codecs &cs, dq_kind kind, size_t idx, const uint8_t *cpu, const uint8_t *gpu,
                                    size_t len, const char *what)
{
    size_t b = 0;
    while (b < len && cpu[b] == gpu[b])
        b++;
    std::vector<float> yc(cs.n), yg(cs.n);
    dq_stream_decode(cs.c, kind, cpu, yc.data());
    dq_stream_decode(cs.c, kind, gpu, yg.data());
    uint32_t i = 0;
    while (i < cs.n && memcmp(&yc[i], &yg[i], 4) == 0)
        i++;
    uint32_t ndiff = 0;
    for (uint32_t j = 0; j < cs.n; j++)
        ndiff += memcmp(&yc[j], &yg[j], 4) != 0;
    printf("        %s %s stream %zu: first byte %zu differs (cpu %02x gpu %02x); s/o cpu %04x/%04x gpu %04x/%04x; ",
           what, kind == DQ_KIND_K ? "K" : "V", idx, b, b < len ? cpu[b] : 0, b < len ? gpu[b] : 0,
           cpu[0] | cpu[1] << 8, cpu[2] | cpu[3] << 8, gpu[0] | gpu[1] << 8, gpu[2] | gpu[3] << 8);
    if (i < cs.n)
        printf("first decoded value %u: cpu %.9g gpu %.9g (%u values differ)\n", i, yc[i], yg[i], ndiff);
    else
        printf("decoded values identical\n");
}

static void stats_report(const char *what, const dq_encode_stats &a, const dq_encode_stats &b)
{
    bool ok = a.streams == b.streams && a.retries == b.retries && a.fallbacks == b.fallbacks &&
              a.max_payload_bytes == b.max_payload_bytes && a.payload_bytes == b.payload_bytes &&
              a.symbols_moved == b.symbols_moved && a.max_move == b.max_move;
    report(ok,
           "%s stats: streams %llu/%llu retries %llu/%llu fallbacks %llu/%llu payload %llu/%llu max %u/%u "
           "moved %llu/%llu maxmove %u/%u (cpu/gpu)",
           what, (unsigned long long)a.streams, (unsigned long long)b.streams, (unsigned long long)a.retries,
           (unsigned long long)b.retries, (unsigned long long)a.fallbacks, (unsigned long long)b.fallbacks,
           (unsigned long long)a.payload_bytes, (unsigned long long)b.payload_bytes, a.max_payload_bytes,
           b.max_payload_bytes, (unsigned long long)a.symbols_moved, (unsigned long long)b.symbols_moved, a.max_move,
           b.max_move);
}

/* ---- dqcu_encode_streams ---- */

static void test_streams(Codecs &cs, Rng &r, size_t count, bool encode_supported)
{
    const uint32_t n = cs.n;
    std::vector<float> y(count * n);
    std::vector<int> dist(count);
    for (size_t s = 0; s < count; s++) {
        dist[s] = s < D_COUNT ? (int)s : (int)r.below(D_COUNT + 3) % D_COUNT;
        gen_stream(r, dist[s], n, &y[s * n]);
    }
    /* invalid streams: NaN, infinity, out of range */
    if (count > 16) {
        y[(count - 1) * n + r.below(n)] = NAN;
        y[(count - 2) * n + r.below(n)] = -INFINITY;
        y[(count - 3) * n + r.below(n)] = 30001.0f;
    }
    for (int kind = 0; kind < 2; kind++) {
        const size_t rb = dq_codec_record_bytes(cs.c, (dq_kind)kind), stride = rb + 3;
        DevBuf<float> dy(count * n);
        DevBuf<uint8_t> drec(count * stride);
        DevBuf<int32_t> dst(count);
        DevBuf<dq_encode_stats> dstats(1);
        if (!encode_supported) {
            int rc = dqcu_encode_streams(cs.g, (dq_kind)kind, dy.p, count, drec.p, stride, dst.p, NULL, 0);
            report(rc == DQ_UNSUPPORTED, "encode_streams %s: n=%u over the GPU encoder's limit -> %s", cs.name.c_str(),
                   n, dq_err_name(rc));
            return;
        }
        std::vector<uint8_t> cpu(count * stride, 0xa5), gpu(count * stride);
        std::vector<int> cst(count);
        dq_encode_stats cstats = {};
        for (size_t s = 0; s < count; s++)
            cst[s] = dq_stream_encode(cs.c, cs.ws, (dq_kind)kind, &y[s * n], &cpu[s * stride], &cstats);
        dy.upload(y.data(), count * n);
        /* the encoder's planned waves (a call of less than a wave: every warp a few streams) and the
         * plain grid (every warp a group of G streams) */
        for (int plain : {DQCU_SCHEDULE_PLANNED, DQCU_SCHEDULE_PLAIN}) {
            g_schedule = plain;
            set_gpu(cs);
            drec.fill_bytes(0xa5);
            dst.fill_bytes(0x7f);
            CK(cudaMemset(dstats.p, 0, sizeof(dq_encode_stats)));
            DQ(dqcu_encode_streams(cs.g, (dq_kind)kind, dy.p, count, drec.p, stride, dst.p, dstats.p, 0));
            CK(cudaDeviceSynchronize());
            g_schedule = DQCU_SCHEDULE_PLANNED;
            set_gpu(cs);
            std::vector<int32_t> gst(count);
            drec.download(gpu.data(), count * stride);
            dst.download(gst.data(), count);
            dq_encode_stats gstats;
            dstats.download(&gstats, 1);
            size_t bad_status = 0, bad_bytes = 0, shown = 0;
            for (size_t s = 0; s < count; s++) {
                if (gst[s] != cst[s]) {
                    if (bad_status++ < 3)
                        printf("        stream %zu (%s): status cpu %s gpu %d\n", s, dist_name[dist[s]],
                               dq_err_name(cst[s]), gst[s]);
                    continue;
                }
                const uint8_t *a = &cpu[s * stride], *b = &gpu[s * stride];
                if (memcmp(a, b, stride) != 0) {
                    bad_bytes++;
                    if (shown++ < 4)
                        explain_record_mismatch(cs, (dq_kind)kind, s, a, b, rb, dist_name[dist[s]]);
                }
            }
            report(bad_status == 0 && bad_bytes == 0,
                   "encode_streams v%d %s %s (%s grid): %zu streams, %zu status and %zu record mismatches", enc_ver(),
                   cs.name.c_str(), kind ? "V" : "K", plain ? "plain" : "planned", count, bad_status, bad_bytes);
            stats_report("  encode_streams", cstats, gstats);
        }
    }
}

/* ---- dqcu_encode_windows ---- */

static void to_dtype(const float *x, size_t count, dq_dtype t, std::vector<uint8_t> &out)
{
    out.resize(count * dq_dtype_size(t));
    DQ(dq_convert(x, DQ_DTYPE_F32, out.data(), t, count));
}

/* K/V tokens in the original domain: channel offsets for keys (so the window mean matters). */
static void gen_tokens(Rng &r, uint32_t n, size_t ntok, bool keys, std::vector<float> &x)
{
    x.resize(ntok * n);
    const double sigma = pow(10.0, -1.0 + 2.0 * r.uniform());
    std::vector<double> mu(n);
    for (uint32_t j = 0; j < n; j++)
        mu[j] = keys ? r.normal() * sigma * 3.0 : 0.0;
    for (size_t t = 0; t < ntok; t++)
        for (uint32_t j = 0; j < n; j++)
            x[t * n + j] = (float)(mu[j] + sigma * r.normal() * (1.0 + 0.5 * sin((double)t)));
}

static std::vector<uint8_t> compare_windows(Codecs &cs, const std::vector<uint8_t> &kb, const std::vector<uint8_t> &vb,
                                            dq_dtype dtype, size_t nwin, const char *label, bool encode_supported);

/* Encodes nwin windows on the CPU and GPU and compares them; returns the valid CPU windows. */
static std::vector<uint8_t> test_windows(Codecs &cs, Rng &r, size_t nwin, dq_dtype dtype, bool specials,
                                         bool encode_supported)
{
    const uint32_t n = cs.n, W = cs.W;
    std::vector<float> k, v;
    gen_tokens(r, n, nwin * W, true, k);
    gen_tokens(r, n, nwin * W, false, v);
    size_t nan_w = SIZE_MAX, range_w = SIZE_MAX;
    if (specials && nwin >= 3) {
        nan_w = 1;
        v[(nan_w * W + r.below(W)) * n + r.below(n)] = NAN;
        if (dtype != DQ_DTYPE_F16) {
            range_w = 2;
            k[(range_w * W + r.below(W)) * n + r.below(n)] = 14001.0f * sqrtf((float)cs.d) * 1.01f;
        }
    }
    std::vector<uint8_t> kb, vb;
    to_dtype(k.data(), k.size(), dtype, kb);
    to_dtype(v.data(), v.size(), dtype, vb);
    char what[64];
    snprintf(what, sizeof what, "(%s%s)", nan_w != SIZE_MAX ? "with NaN window" : "all valid",
             range_w != SIZE_MAX ? " and range window" : "");
    return compare_windows(cs, kb, vb, dtype, nwin, what, encode_supported);
}

/* nwin windows of K and V (kb, vb: [nwin·W, n] of dtype) encoded by dq_window_encode and by
 * dqcu_encode_windows: the same statuses, records and statistics. Returns the valid CPU windows. */
static std::vector<uint8_t> compare_windows(Codecs &cs, const std::vector<uint8_t> &kb, const std::vector<uint8_t> &vb,
                                            dq_dtype dtype, size_t nwin, const char *label, bool encode_supported)
{
    const uint32_t n = cs.n, W = cs.W;
    const size_t wb = dq_codec_window_bytes(cs.c), esz = dq_dtype_size(dtype);
    std::vector<uint8_t> cpu(nwin * wb, 0);
    std::vector<int> crc(nwin);
    dq_encode_stats cstats = {};
    for (size_t w = 0; w < nwin; w++) {
        dq_encode_stats one = {};
        crc[w] = dq_window_encode(cs.c, cs.ws, &kb[w * W * n * esz], &vb[w * W * n * esz], dtype, &cpu[w * wb], &one);
        if (crc[w] == 0) {
            cstats.streams += one.streams;
            cstats.retries += one.retries;
            cstats.fallbacks += one.fallbacks;
            cstats.payload_bytes += one.payload_bytes;
            cstats.symbols_moved += one.symbols_moved;
            cstats.max_payload_bytes = std::max(cstats.max_payload_bytes, one.max_payload_bytes);
            cstats.max_move = std::max(cstats.max_move, one.max_move);
        }
    }
    std::vector<uint8_t> valid;
    for (size_t w = 0; w < nwin; w++)
        if (crc[w] == 0)
            valid.insert(valid.end(), cpu.begin() + w * wb, cpu.begin() + (w + 1) * wb);

    DevBuf<uint8_t> dk(kb.size()), dv(vb.size()), dwin(nwin * wb);
    DevBuf<uint8_t *> dptr(nwin);
    DevBuf<int32_t> dst(nwin);
    DevBuf<dq_encode_stats> dstats(1);
    std::vector<uint8_t *> ptrs(nwin);
    for (size_t w = 0; w < nwin; w++)
        ptrs[w] = dwin.p + w * wb;
    dptr.upload(ptrs.data(), nwin);
    if (!encode_supported) {
        int rc = dqcu_encode_windows(cs.g, dk.p, dv.p, dtype, nwin, dptr.p, dst.p, NULL, 0);
        report(rc == DQ_UNSUPPORTED, "encode_windows %s: n=%u over the GPU encoder's limit -> %s", cs.name.c_str(), n,
               dq_err_name(rc));
        return valid;
    }
    dk.upload(kb.data(), kb.size());
    dv.upload(vb.data(), vb.size());
    dwin.fill_bytes(0xa5);
    dst.fill_bytes(0x7f);
    CK(cudaMemset(dstats.p, 0, sizeof(dq_encode_stats)));
    DQ(dqcu_encode_windows(cs.g, dk.p, dv.p, dtype, nwin, dptr.p, dst.p, dstats.p, 0));
    CK(cudaDeviceSynchronize());
    std::vector<uint8_t> gpu(nwin * wb);
    std::vector<int32_t> gst(nwin);
    dwin.download(gpu.data(), gpu.size());
    dst.download(gst.data(), nwin);
    dq_encode_stats gstats;
    dstats.download(&gstats, 1);
    size_t bad = 0;
    for (size_t w = 0; w < nwin; w++) {
        if (gst[w] != crc[w]) {
            bad++;
            printf("        window %zu: status cpu %s gpu %d\n", w, dq_err_name(crc[w]), gst[w]);
            continue;
        }
        if (crc[w] != 0)
            continue;
        const uint8_t *a = &cpu[w * wb], *b = &gpu[w * wb];
        if (memcmp(a, b, wb) == 0)
            continue;
        bad++;
        const size_t mb = dq_codec_mean_bytes(cs.c);
        if (memcmp(a, b, mb) != 0) {
            size_t i = 0;
            while (a[i] == b[i])
                i++;
            printf("        window %zu: mean block differs at byte %zu (cpu %02x gpu %02x)\n", w, i, a[i], b[i]);
            continue;
        }
        int shown = 0;
        for (int kind = 0; kind < 2 && shown < 2; kind++)
            for (uint32_t t = 0; t < W && shown < 2; t++) {
                const uint8_t *ra = dq_window_record(cs.c, a, (dq_kind)kind, t);
                const uint8_t *rg = dq_window_record(cs.c, b, (dq_kind)kind, t);
                size_t rb = dq_codec_record_bytes(cs.c, (dq_kind)kind);
                if (memcmp(ra, rg, rb) != 0) {
                    shown++;
                    char what[48];
                    snprintf(what, sizeof what, "window %zu token %u", w, t);
                    explain_record_mismatch(cs, (dq_kind)kind, t, ra, rg, rb, what);
                }
            }
    }
    report(bad == 0, "encode_windows v%d %s %s: %zu windows %s, %zu mismatches", enc_ver(), cs.name.c_str(),
           dq_dtype_name(dtype), nwin, label, bad);
    stats_report("  encode_windows", cstats, gstats);
    return valid;
}

/* ---- dqcu_scatter_rows ---- */

/* Rows of n BF16 values to scattered row slots of a poisoned device buffer, some at odd element
 * offsets (the 16-bit path); every target row exact, every other element untouched. */
static void test_scatter(Rng &r, uint32_t n, uint32_t nrows)
{
    const uint32_t slots = 3 * nrows + 5;
    const size_t stride = (size_t)n + 1; /* slot s starts at element s * stride: odd offsets when n is even */
    std::vector<uint16_t> src((size_t)nrows * n), host(slots * stride + n, 0xfbadu), want;
    for (auto &v : src)
        v = (uint16_t)r.next();
    std::vector<uint32_t> order(slots);
    for (uint32_t i = 0; i < slots; i++)
        order[i] = i;
    for (uint32_t i = slots; i > 1; i--)
        std::swap(order[i - 1], order[r.below(i)]);
    uint16_t *d_buf, *d_src, **d_ptr;
    CK(cudaMalloc(&d_buf, host.size() * sizeof(uint16_t)));
    CK(cudaMalloc(&d_src, src.size() * sizeof(uint16_t)));
    CK(cudaMalloc(&d_ptr, nrows * sizeof(uint16_t *)));
    std::vector<uint16_t *> ptr(nrows);
    want = host;
    for (uint32_t i = 0; i < nrows; i++) {
        ptr[i] = d_buf + order[i] * stride;
        memcpy(&want[order[i] * stride], &src[(size_t)i * n], n * sizeof(uint16_t));
    }
    CK(cudaMemcpy(d_buf, host.data(), host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_src, src.data(), src.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ptr, ptr.data(), nrows * sizeof(uint16_t *), cudaMemcpyHostToDevice));
    int rc = dqcu_scatter_rows(d_src, n, d_ptr, nrows, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(host.data(), d_buf, host.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < host.size(); i++)
        bad += host[i] != want[i];
    const int bad_args = dqcu_scatter_rows(NULL, n, d_ptr, nrows, 0);
    const int none = dqcu_scatter_rows(NULL, n, NULL, 0, 0);
    report(rc == DQ_OK && bad == 0 && bad_args == DQ_INVALID_ARGUMENT && none == DQ_OK,
           "scatter_rows n=%u rows=%u: %s, %zu elements differ; NULL src -> %s, no rows -> %s", n, nrows,
           dq_err_name(rc), bad, dq_err_name(bad_args), dq_err_name(none));
    CK(cudaFree(d_buf));
    CK(cudaFree(d_src));
    CK(cudaFree(d_ptr));
}

/* ---- dqcu_decompress ---- */

static void random_bf16(Rng &r, size_t count, std::vector<uint16_t> &out)
{
    out.resize(count);
    for (size_t i = 0; i < count; i++)
        out[i] = dq_f32_to_bf16((float)(r.normal() * 2.0));
}

static void test_decompress(Codecs &cs, Rng &r, const std::vector<uint8_t> &windows, int ranges)
{
    const uint32_t n = cs.n, W = cs.W;
    const size_t wb = dq_codec_window_bytes(cs.c), nwin = windows.size() / wb;
    const size_t tail = r.below(cs.R);
    std::vector<uint16_t> tk, tv;
    random_bf16(r, tail * n, tk);
    random_bf16(r, tail * n, tv);
    dq_layer *layer = nullptr;
    DQ(dq_layer_restore(cs.c, windows.data(), nwin, tk.data(), tv.data(), tail, &layer));
    DevBuf<uint8_t> dwin(std::max<size_t>(windows.size(), 1));
    if (nwin)
        dwin.upload(windows.data(), windows.size());
    DevBuf<const uint8_t *> dptr(std::max<size_t>(nwin, 1));
    std::vector<const uint8_t *> ptrs(nwin);
    for (size_t w = 0; w < nwin; w++)
        ptrs[w] = dwin.p + w * wb;
    if (nwin)
        dptr.upload(ptrs.data(), nwin);
    DevBuf<uint16_t> dtk(std::max<size_t>(tail * n, 1)), dtv(std::max<size_t>(tail * n, 1));
    if (tail) {
        dtk.upload(tk.data(), tail * n);
        dtv.upload(tv.data(), tail * n);
    }
    const size_t total = nwin * W + tail;
    DevBuf<uint32_t> dcorrupt(1);
    size_t bad = 0, done = 0;
    for (int it = 0; it < ranges; it++) {
        dq_kind kind = (dq_kind)(it & 1);
        dq_dtype dt = (dq_dtype)((it / 2) % 3);
        size_t first = 0, count = total;
        if (it >= 6 && total) {
            first = r.below((uint32_t)total);
            count = 1 + r.below((uint32_t)(total - first));
        }
        if (!count)
            continue;
        const size_t esz = dq_dtype_size(dt), bytes = count * n * esz;
        std::vector<uint8_t> cpu(bytes), gpu(bytes);
        int crc = dq_layer_decode(layer, cs.ws, kind, first, count, cpu.data(), dt);
        DevBuf<uint8_t> dout(bytes);
        dout.fill_bytes(0xff); /* NaN in every output type */
        CK(cudaMemset(dcorrupt.p, 0, 4));
        DQ(dqcu_decompress(cs.g, kind, dptr.p, nwin, kind == DQ_KIND_K ? dtk.p : dtv.p, tail, first, count, dout.p, dt,
                           dcorrupt.p, 0));
        CK(cudaDeviceSynchronize());
        dout.download(gpu.data(), bytes);
        uint32_t corrupt = 0;
        dcorrupt.download(&corrupt, 1);
        done++;
        if (crc != 0 || corrupt != 0 || memcmp(cpu.data(), gpu.data(), bytes) != 0) {
            bad++;
            size_t i = 0;
            while (i < bytes && cpu[i] == gpu[i])
                i++;
            printf("        decompress %s %s [%zu, +%zu): cpu rc %s, gpu corrupt %u, first byte diff %zu (token %zu)\n",
                   kind ? "V" : "K", dq_dtype_name(dt), first, count, dq_err_name(crc), corrupt, i,
                   i / (n * esz) + first);
        }
    }
    report(bad == 0, "decompress %s: %zu windows + %zu tail tokens, %zu ranges, %zu mismatches", cs.name.c_str(), nwin,
           tail, done, bad);

    /* corrupt containers: bad initial state, garbage, nonzero padding, truncated stream */
    if (nwin) {
        std::vector<uint8_t> win(windows.begin(), windows.begin() + wb);
        const size_t C = dq_codec_record_bytes(cs.c, DQ_KIND_K) - 4;
        uint8_t *r0 = (uint8_t *)dq_window_record(cs.c, win.data(), DQ_KIND_K, 0);
        memset(r0 + 4, 0, 4);
        uint8_t *r1 = (uint8_t *)dq_window_record(cs.c, win.data(), DQ_KIND_K, 1 % W);
        for (size_t i = 8; i < C + 4; i++)
            r1[i] = (uint8_t)r.next();
        uint8_t *r2 = (uint8_t *)dq_window_record(cs.c, win.data(), DQ_KIND_K, 2 % W);
        r2[4 + C - 1] ^= 0x5a;
        uint8_t *r3 = (uint8_t *)dq_window_record(cs.c, win.data(), DQ_KIND_K, 3 % W);
        for (size_t i = 4 + 4; i < C + 4; i++)
            r3[i] = 0;
        std::vector<uint8_t> lv(n);
        uint32_t expect = 0;
        for (uint32_t t = 0; t < W; t++)
            expect += dq_stream_decode_levels(cs.c, DQ_KIND_K, dq_window_record(cs.c, win.data(), DQ_KIND_K, t),
                                              lv.data()) != 0;
        for (int dt = 0; dt < 3; dt++) {
            const size_t esz = dq_dtype_size((dq_dtype)dt), bytes = (size_t)W * n * esz;
            std::vector<uint8_t> cpu(bytes), gpu(bytes);
            int crc = dq_tokens_decode(cs.c, cs.ws, DQ_KIND_K, win.data(),
                                       dq_window_record(cs.c, win.data(), DQ_KIND_K, 0),
                                       dq_codec_record_bytes(cs.c, DQ_KIND_K), W, cpu.data(), (dq_dtype)dt);
            DevBuf<uint8_t> dw(wb), dout(bytes);
            dw.upload(win.data(), wb);
            const uint8_t *pw = dw.p;
            DevBuf<const uint8_t *> dp(1);
            dp.upload(&pw, 1);
            dout.fill_bytes(0xff);
            CK(cudaMemset(dcorrupt.p, 0, 4));
            DQ(dqcu_decompress(cs.g, DQ_KIND_K, dp.p, 1, NULL, 0, 0, W, dout.p, (dq_dtype)dt, dcorrupt.p, 0));
            CK(cudaDeviceSynchronize());
            dout.download(gpu.data(), bytes);
            uint32_t corrupt = 0;
            dcorrupt.download(&corrupt, 1);
            bool ok = crc == DQ_CORRUPT && corrupt == expect && memcmp(cpu.data(), gpu.data(), bytes) == 0;
            report(ok, "decompress %s corrupt containers %s: cpu %s, %u corrupt expected, gpu counted %u, values %s",
                   cs.name.c_str(), dq_dtype_name((dq_dtype)dt), dq_err_name(crc), expect, corrupt,
                   memcmp(cpu.data(), gpu.data(), bytes) == 0 ? "identical" : "DIFFER");
        }
    }
    dq_layer_free(layer);
}

/* ---- dqcu_attend ---- */

static double rel_err(const float *a, const float *ref, size_t count)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (den == 0)
        return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

/* The same inputs through every attention version in att_list (one check per version that runs
 * on this shape: a version that does not take it falls back to one already checked). */
static void test_attention(Codecs &cs, Rng &r, const std::vector<uint32_t> &lens, uint32_t G,
                           const std::vector<int> &att_list)
{
    const uint32_t n = cs.n, d = cs.d, QH = cs.kvh * G;
    const size_t nseq = lens.size(), wb = dq_codec_window_bytes(cs.c);
    std::vector<dq_layer *> layers(nseq);
    uint32_t max_tokens = 0;
    for (size_t b = 0; b < nseq; b++) {
        DQ(dq_layer_create(cs.c, &layers[b]));
        std::vector<float> k, v;
        gen_tokens(r, n, lens[b], true, k);
        gen_tokens(r, n, lens[b], false, v);
        std::vector<uint8_t> kb, vb;
        to_dtype(k.data(), k.size(), DQ_DTYPE_BF16, kb);
        to_dtype(v.data(), v.size(), DQ_DTYPE_BF16, vb);
        if (lens[b])
            DQ(dq_layer_append(layers[b], cs.ws, kb.data(), vb.data(), DQ_DTYPE_BF16, lens[b], NULL));
        max_tokens = std::max(max_tokens, lens[b]);
    }
    /* device copies: per sequence its windows, pointer array and tails */
    std::vector<DevBuf<uint8_t> *> dwins(nseq);
    std::vector<DevBuf<const uint8_t *> *> dptrs(nseq);
    std::vector<DevBuf<uint16_t> *> dtk(nseq), dtv(nseq);
    std::vector<dqcu_attn_seq> seqs(nseq);
    for (size_t b = 0; b < nseq; b++) {
        const size_t nw = dq_layer_window_count(layers[b]), tail = dq_layer_tail_tokens(layers[b]);
        dwins[b] = new DevBuf<uint8_t>(std::max<size_t>(nw * wb, 1));
        dptrs[b] = new DevBuf<const uint8_t *>(std::max<size_t>(nw, 1));
        std::vector<const uint8_t *> ptrs(nw);
        for (size_t w = 0; w < nw; w++) {
            CK(cudaMemcpy(dwins[b]->p + w * wb, dq_layer_window(layers[b], w), wb, cudaMemcpyHostToDevice));
            ptrs[w] = dwins[b]->p + w * wb;
        }
        if (nw)
            dptrs[b]->upload(ptrs.data(), nw);
        dtk[b] = new DevBuf<uint16_t>(std::max<size_t>(tail * n, 1));
        dtv[b] = new DevBuf<uint16_t>(std::max<size_t>(tail * n, 1));
        if (tail) {
            dtk[b]->upload(dq_layer_tail(layers[b], DQ_KIND_K), tail * n);
            dtv[b]->upload(dq_layer_tail(layers[b], DQ_KIND_V), tail * n);
        }
        seqs[b].windows = dptrs[b]->p;
        seqs[b].tail_k = dtk[b]->p;
        seqs[b].tail_v = dtv[b]->p;
        seqs[b].nwin = (uint32_t)nw;
        seqs[b].tail_tokens = (uint32_t)tail;
    }
    const float scale = 1.0f / sqrtf((float)d);
    std::vector<float> q(nseq * QH * d);
    const double qs = 0.5 + 2.0 * r.uniform();
    for (auto &x : q)
        x = (float)(r.normal() * qs);
    std::vector<float> oc(nseq * QH * d), lc(nseq * QH), orf(nseq * QH * d), lrf(nseq * QH);
    std::vector<dq_attn_item> items(nseq), items_ref(nseq);
    for (size_t b = 0; b < nseq; b++) {
        items[b] = {layers[b], &q[b * QH * d], &oc[b * QH * d], &lc[b * QH]};
        items_ref[b] = {layers[b], &q[b * QH * d], &orf[b * QH * d], &lrf[b * QH]};
    }
    DQ(dq_attend(cs.c, cs.ws, QH, scale, items.data(), nseq));
    DQ(dq_attend_reference(cs.c, cs.ws, QH, scale, items_ref.data(), nseq));

    DevBuf<dqcu_attn_seq> dseqs(nseq);
    dseqs.upload(seqs.data(), nseq);
    DevBuf<float> dq_(q.size()), dout(q.size()), dlse(nseq * QH);
    dq_.upload(q.data(), q.size());
    std::vector<int> done;
    for (int want : att_list) {
        g_att_version = want;
        set_gpu(cs);
        const int ran = dqcu_attend_kernel(cs.g, QH);
        if (std::find(done.begin(), done.end(), ran) != done.end())
            continue;
        done.push_back(ran);
        const size_t wsb = dqcu_attend_workspace_size(cs.g, QH, (uint32_t)nseq, max_tokens);
        DevBuf<uint8_t> dws(std::max<size_t>(wsb, 1));
        dout.fill_bytes(0xff);
        dlse.fill_bytes(0xff);
        DQ(dqcu_attend(cs.g, QH, scale, dseqs.p, (uint32_t)nseq, max_tokens, dq_.p, dout.p, dlse.p, dws.p, wsb, 0));
        CK(cudaDeviceSynchronize());
        std::vector<float> og(q.size()), lg(nseq * QH);
        dout.download(og.data(), og.size());
        dlse.download(lg.data(), lg.size());
        double worst = 0, worst_ref = 0, worst_lse = 0, cpu_vs_ref = 0;
        bool ok = true;
        for (size_t b = 0; b < nseq; b++) {
            const size_t o = b * QH * d;
            if (lens[b] == 0) {
                bool z = true;
                for (size_t i = 0; i < (size_t)QH * d; i++)
                    z &= og[o + i] == 0.0f;
                for (uint32_t h = 0; h < QH; h++)
                    z &= lg[b * QH + h] == -INFINITY;
                if (!z) {
                    ok = false;
                    printf("        empty sequence %zu: output not 0 / lse not -inf\n", b);
                }
                continue;
            }
            double e1 = rel_err(&og[o], &oc[o], (size_t)QH * d), e2 = rel_err(&og[o], &orf[o], (size_t)QH * d);
            cpu_vs_ref = std::max(cpu_vs_ref, rel_err(&oc[o], &orf[o], (size_t)QH * d));
            double el = 0;
            for (uint32_t h = 0; h < QH; h++) {
                double a = lg[b * QH + h], ref = lrf[b * QH + h];
                double e = fabs(a - ref) / std::max(1.0, fabs(ref));
                if (!(e == e))
                    e = INFINITY;
                el = std::max(el, e);
            }
            if (!(e1 <= 1e-3) || !(e2 <= 1e-3) || !(el <= 1e-3)) {
                ok = false;
                printf("        sequence %zu (%u tokens): rel err vs dq_attend %.3g, vs reference %.3g, lse %.3g\n", b,
                       lens[b], e1, e2, el);
            }
            worst = std::max(worst, e1);
            worst_ref = std::max(worst_ref, e2);
            worst_lse = std::max(worst_lse, el);
        }
        std::string ls;
        for (size_t b = 0; b < nseq; b++)
            ls += (b ? "," : "") + std::to_string(lens[b]);
        report(ok,
               "attend v%d %s QH=%u (G=%u) lens [%s]: rel err vs dq_attend %.2e, vs f64 reference %.2e, lse %.2e "
               "(cpu vs reference %.2e)",
               ran, cs.name.c_str(), QH, G, ls.c_str(), worst, worst_ref, worst_lse, cpu_vs_ref);
    }
    g_att_version = DQCU_KERNEL_AUTO;
    set_gpu(cs);
    for (size_t b = 0; b < nseq; b++) {
        delete dwins[b];
        delete dptrs[b];
        delete dtk[b];
        delete dtv[b];
        dq_layer_free(layers[b]);
    }
}

/* ---- the hot layout: dqcu_transcode_hot and dqcu_attend_hot ---- */

/* Whether dqcu_attend_hot should take this shape (the limits stated in dquant/cuda.h). */
static bool hot_expected(const Codecs &cs, uint32_t G)
{
    const uint32_t bk = dq_hot_bits(cs.c, DQ_KIND_K), bv = dq_hot_bits(cs.c, DQ_KIND_V);
    return cs.d % 128 == 0 && cs.d <= 256 && (G == 1 || G == 2 || G == 4 || G == 8) &&
           ((bk == 3 && bv == 3) || (bk == 4 && bv == 4) || (bk == 3 && bv == 2) || (bk == 2 && bv == 1)) &&
           dqcu_attend_check(cs.g, cs.kvh * G) == DQ_OK;
}

/* A fixed-width device codec has the encoders and the hot layout: decompress and the container
 * attention refuse it, the encoders take it (an empty call succeeds). */
static void test_fixed_refusals(Codecs &cs)
{
    const size_t rb = dq_codec_record_bytes(cs.c, DQ_KIND_K);
    const int enc = dqcu_encode_streams(cs.g, DQ_KIND_K, NULL, 0, NULL, rb, NULL, NULL, 0);
    const int encw = dqcu_encode_windows(cs.g, NULL, NULL, DQ_DTYPE_BF16, 0, NULL, NULL, NULL, 0);
    const int dec = dqcu_decompress(cs.g, DQ_KIND_K, NULL, 0, NULL, 0, 0, 0, NULL, DQ_DTYPE_F32, NULL, 0);
    const int att = dqcu_attend(cs.g, cs.kvh, 1.0f, NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0);
    const size_t wsb = dqcu_attend_workspace_size(cs.g, cs.kvh, 1, 128);
    report(enc == DQ_OK && encw == DQ_OK && dec == DQ_UNSUPPORTED && att == DQ_UNSUPPORTED && wsb == 0,
           "fixed-width %s: encode_streams %s, encode_windows %s, decompress %s, attend %s, workspace %zu",
           cs.name.c_str(), dq_err_name(enc), dq_err_name(encw), dq_err_name(dec), dq_err_name(att), wsb);
}

/* The first byte at which a and b (n bytes, windows of wb bytes) differ, SIZE_MAX where they are the
 * same; a difference is printed with its window and offset. */
static size_t first_difference(const uint8_t *a, const uint8_t *b, size_t n, size_t wb)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            printf("        first difference at byte %zu of window %zu (offset %zu)\n", i, i / wb, i % wb);
            return i;
        }
    return SIZE_MAX;
}

/* Where the real KV captures are (--data DIR, else $DQ_DATA_DIR, else ../shared/data). */
static const char *g_data_dir = "../shared/data";

/* The first out.size() fp16 values of <data dir>/model/kv_f16.bin (shared/data/model when the data
 * dir has no such file, for a run from the repository's parent). Returns how many were read: fewer
 * when the file is absent or short; path is the file tried last. */
static size_t read_real_kv(const char *model, std::vector<uint16_t> &out, std::string &path)
{
    path = std::string(g_data_dir) + "/" + model + "/kv_f16.bin";
    FILE *f = fopen(path.c_str(), "rb");
    if (!f) {
        path = std::string("shared/data/") + model + "/kv_f16.bin";
        f = fopen(path.c_str(), "rb");
    }
    if (!f)
        return 0;
    const size_t got = fread(out.data(), sizeof(uint16_t), out.size(), f);
    fclose(f);
    return got;
}

/* The real KV captures (read_real_kv): float16 [.., 2 (K, V), layers, tokens, kv_heads, head_dim]:
 * each (sequence, layer)'s tokens cut into whole windows of cs.W and encoded on the CPU and the
 * GPU, byte for byte the same. A missing file skips with a message. */
static void test_real_windows(Codecs &cs, const char *model, uint32_t seqs, uint32_t layers, uint32_t tokens)
{
    const uint32_t n = cs.n, W = cs.W;
    const size_t per_kind = (size_t)layers * tokens * n, total = (size_t)seqs * 2 * per_kind;
    std::vector<uint16_t> raw(total);
    std::string path;
    const size_t got = read_real_kv(model, raw, path);
    if (got == 0) {
        printf("  skip  real windows %s: %s/kv_f16.bin not found (--data DIR or DQ_DATA_DIR)\n", cs.name.c_str(),
               model);
        return;
    }
    if (got != total) {
        report(false, "real windows %s: %s holds %zu values, %zu expected", cs.name.c_str(), path.c_str(), got, total);
        return;
    }
    const uint32_t wpl = tokens / W; /* whole windows per layer */
    const size_t nwin = (size_t)seqs * layers * wpl, wbytes = (size_t)W * n * 2;
    std::vector<uint8_t> kb(nwin * wbytes), vb(nwin * wbytes);
    size_t w = 0;
    for (uint32_t s = 0; s < seqs; s++)
        for (uint32_t l = 0; l < layers; l++)
            for (uint32_t i = 0; i < wpl; i++, w++) {
                const size_t tok0 = (size_t)l * tokens + (size_t)i * W;
                const uint16_t *k = &raw[(size_t)s * 2 * per_kind + tok0 * n];
                const uint16_t *v = &raw[((size_t)s * 2 + 1) * per_kind + tok0 * n];
                memcpy(&kb[w * wbytes], k, wbytes);
                memcpy(&vb[w * wbytes], v, wbytes);
            }
    char what[96];
    snprintf(what, sizeof what, "real %s KV, %u layers", model, layers);
    compare_windows(cs, kb, vb, DQ_DTYPE_F16, nwin, what, true);
}

/* The fixed-width family's GPU encoder: streams (random, NaN, infinity, out of range) and windows
 * (F32, F16, BF16 with a NaN and an out-of-range window) byte-identical to lib's encoder, for the
 * widths of fixed226, fixed196 and some fixedkAvB at n = 64, 128, 256 and 1024, and the real
 * captures of ../shared/data at their shapes. */
static void test_fixed_encode(Rng &r, bool small)
{
    const Cfg fcfgs[] = {
        {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixed226"},    /* n = 1024: M 6/3 */
        {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixed196"},    /* n = 1024 */
        {2, 128, 0, 0, 128, 128, 0, 0, 0, "fixed226"},    /* n = 256 */
        {2, 128, 0, 0, 128, 128, 0, 0, 0, "fixed196"},    /* n = 256: M 5/3 */
        {1, 128, 0, 0, 128, 128, 0, 0, 0, "fixed226"},    /* n = 128 */
        {1, 64, 0, 0, 128, 128, 0, 0, 0, "fixed196"},     /* n = 64 */
        {4, 16, 0, 0, 128, 128, 0, 0, 0, "fixed226"},     /* n = 64, head_dim 16 */
        {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk8v6"},   /* 3 + 3 bits */
        {2, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk16v9"},  /* 4 bits, base-9 groups */
        {1, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk256v2"}, /* byte and 1-bit codes */
        {1, 64, 0, 0, 128, 128, 0, 0, 0, "fixedk7v11"},   /* base-7 and base-11 groups */
        {16, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk3v5"},  /* n = 2048, the encoder's limit */
    };
    for (const Cfg &cfg : fcfgs) {
        Codecs cs;
        make_codecs(cfg, cs);
        printf("%s\n", cs.name.c_str());
        test_fixed_refusals(cs);
        test_streams(cs, r, small ? 40 : 1200, true);
        for (int dt = 0; dt < 3; dt++)
            test_windows(cs, r, small && dt ? 1 : 4, (dq_dtype)dt, dt != 0 || small, true);
        if (small)
            break;
        if (cs.n == 1024)
            test_real_windows(cs, "bytellama-n1024", 1, 4, 512);
        if (cs.n == 256 && cs.d == 128)
            test_real_windows(cs, "bytellama-19m", 2, 6, 1024);
    }
    if (!small) {
        /* more streams than one wave of warps: each warp strides over several */
        Codecs cs;
        Cfg cfg = {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixed226"};
        make_codecs(cfg, cs);
        test_streams(cs, r, 30000, true);
    }
}

/* Layers of these lengths built on the CPU: every window transcoded on the GPU equals
 * dq_hot_transcode byte for byte (and a window with corrupt containers too, with the count);
 * dqcu_attend_hot over the GPU's hot windows within 1e-3 of dq_hot_attend and of
 * dq_attend_reference over the records, LSE too; an empty sequence gives 0 and -inf. */
static void test_hot(Codecs &cs, Rng &r, const std::vector<uint32_t> &lens, uint32_t G)
{
    const uint32_t n = cs.n, d = cs.d, QH = cs.kvh * G;
    const size_t nseq = lens.size(), wb = dq_codec_window_bytes(cs.c), hb = dq_hot_window_bytes(cs.c);
    report(hb == dqcu_hot_window_bytes(cs.g), "hot %s: window bytes gpu %zu, cpu %zu", cs.name.c_str(),
           dqcu_hot_window_bytes(cs.g), hb);
    std::vector<dq_layer *> layers(nseq);
    uint32_t max_tokens = 0;
    for (size_t b = 0; b < nseq; b++) {
        DQ(dq_layer_create(cs.c, &layers[b]));
        std::vector<float> k, v;
        gen_tokens(r, n, lens[b], true, k);
        gen_tokens(r, n, lens[b], false, v);
        std::vector<uint8_t> kb, vb;
        to_dtype(k.data(), k.size(), DQ_DTYPE_BF16, kb);
        to_dtype(v.data(), v.size(), DQ_DTYPE_BF16, vb);
        if (lens[b])
            DQ(dq_layer_append(layers[b], cs.ws, kb.data(), vb.data(), DQ_DTYPE_BF16, lens[b], NULL));
        max_tokens = std::max(max_tokens, lens[b]);
    }
    /* every window of every sequence, records then hot windows, in one buffer each */
    size_t total = 0;
    for (size_t b = 0; b < nseq; b++)
        total += dq_layer_window_count(layers[b]);
    std::vector<uint8_t> recs(std::max<size_t>(total, 1) * wb), cpu_hot(std::max<size_t>(total, 1) * hb);
    std::vector<const uint8_t *> cpu_ptrs(total);
    {
        size_t i = 0;
        for (size_t b = 0; b < nseq; b++)
            for (size_t w = 0; w < dq_layer_window_count(layers[b]); w++, i++) {
                memcpy(&recs[i * wb], dq_layer_window(layers[b], w), wb);
                DQ(dq_hot_transcode(cs.c, &recs[i * wb], &cpu_hot[i * hb]));
                cpu_ptrs[i] = &cpu_hot[i * hb];
            }
    }
    DevBuf<uint8_t> drec(recs.size()), dhot(cpu_hot.size());
    drec.upload(recs.data(), recs.size());
    dhot.fill_bytes(0x5a);
    std::vector<const uint8_t *> rp(std::max<size_t>(total, 1)), hp(std::max<size_t>(total, 1));
    for (size_t i = 0; i < total; i++) {
        rp[i] = drec.p + i * wb;
        hp[i] = dhot.p + i * hb;
    }
    DevBuf<const uint8_t *> drp(rp.size()), dhp(hp.size());
    drp.upload(rp.data(), rp.size());
    dhp.upload(hp.data(), hp.size());
    DevBuf<uint32_t> dcorrupt(1);
    dcorrupt.fill_bytes(0);
    DQ(dqcu_transcode_hot(cs.g, drp.p, total, (uint8_t *const *)dhp.p, dcorrupt.p, 0));
    CK(cudaDeviceSynchronize());
    {
        std::vector<uint8_t> gpu_hot(cpu_hot.size());
        dhot.download(gpu_hot.data(), gpu_hot.size());
        uint32_t corrupt = 0;
        dcorrupt.download(&corrupt, 1);
        const size_t diff = first_difference(gpu_hot.data(), cpu_hot.data(), total * hb, hb);
        report(diff == SIZE_MAX && corrupt == 0, "hot transcode %s: %zu windows (%zu B each) %s, corrupt %u",
               cs.name.c_str(), total, hb, diff == SIZE_MAX ? "identical" : "DIFFER", corrupt);
    }
    if (total && dq_codec_profile(cs.c)->codec_type == DQ_CODEC_FIXED) {
        const int rrc = dqcu_rebuild_hot(cs.g, dhp.p, total, (uint8_t *const *)dhp.p, NULL, 0);
        report(rrc == DQ_UNSUPPORTED, "hot rebuild %s (fixed-width): %s (expected UNSUPPORTED)", cs.name.c_str(),
               dq_err_name(rrc));
    } else if (total) {
        /* the inverse: records rebuilt from the GPU's hot windows, byte for byte the originals */
        DevBuf<uint8_t> dback(recs.size());
        dback.fill_bytes(0xa5);
        std::vector<const uint8_t *> bp(total);
        for (size_t i = 0; i < total; i++)
            bp[i] = dback.p + i * wb;
        DevBuf<const uint8_t *> dbp(bp.size());
        dbp.upload(bp.data(), bp.size());
        DevBuf<uint32_t> dbad(1);
        dbad.fill_bytes(0);
        DQ(dqcu_rebuild_hot(cs.g, dhp.p, total, (uint8_t *const *)dbp.p, dbad.p, 0));
        CK(cudaDeviceSynchronize());
        std::vector<uint8_t> back(recs.size());
        dback.download(back.data(), back.size());
        uint32_t nbad = 0;
        dbad.download(&nbad, 1);
        const size_t diff = first_difference(back.data(), recs.data(), total * wb, wb);
        report(diff == SIZE_MAX && nbad == 0, "hot rebuild %s: %zu records (%zu B each) %s, bad %u", cs.name.c_str(),
               total, wb, diff == SIZE_MAX ? "identical" : "DIFFER", nbad);
        /* a value code that is not a level (where M_V is not a power of two): counted as bad */
        const uint32_t bv = dq_hot_bits(cs.c, DQ_KIND_V), mv = dq_codec_profile(cs.c)->levels[DQ_KIND_V];
        if ((1u << bv) > mv) {
            size_t off[4];
            dq_hot_offsets(cs.c, off);
            std::vector<uint8_t> badhot(cpu_hot.begin(), cpu_hot.begin() + hb);
            badhot[off[3] + 4 * (cs.W / 4) + 2 * (cs.W / 2 % 2)] |= (uint8_t)((1u << bv) -
                                                                              1u); /* channel 0 of token W/2 */
            dhot.upload(badhot.data(), hb);
            dbad.fill_bytes(0);
            DQ(dqcu_rebuild_hot(cs.g, dhp.p, 1, (uint8_t *const *)dbp.p, dbad.p, 0));
            CK(cudaDeviceSynchronize());
            dbad.download(&nbad, 1);
            report(nbad == 1 && dq_hot_check(cs.c, badhot.data(), hb) == DQ_CORRUPT,
                   "hot rebuild %s: a code %u >= M_V = %u counted as bad (%u)", cs.name.c_str(), (1u << bv) - 1u, mv,
                   nbad);
            dhot.upload(cpu_hot.data(), hb);
        }
    }
    if (total) {
        /* corrupt containers: bytes flipped in three streams of the first window */
        std::vector<uint8_t> bad(recs.begin(), recs.begin() + wb), cpu_bad(hb), gpu_bad(hb);
        const size_t W = cs.W;
        const size_t t1 = r.below((uint32_t)W), t2 = r.below((uint32_t)W);
        uint8_t *k1 = (uint8_t *)dq_window_record(cs.c, bad.data(), DQ_KIND_K, t1);
        uint8_t *v2 = (uint8_t *)dq_window_record(cs.c, bad.data(), DQ_KIND_V, t2);
        k1[4 + r.below(4)] ^= 0x81;
        v2[4] ^= 0xff; /* the state's low byte */
        v2[5] ^= 0x3c;
        const int crc = dq_hot_transcode(cs.c, bad.data(), cpu_bad.data());
        size_t ncorrupt = 0;
        std::vector<uint8_t> lev(n);
        for (int kind = 0; kind < 2; kind++)
            for (size_t t = 0; t < W; t++)
                ncorrupt += dq_stream_decode_levels(cs.c, (dq_kind)kind,
                                                    dq_window_record(cs.c, bad.data(), (dq_kind)kind, t),
                                                    lev.data()) != DQ_OK;
        drec.upload(bad.data(), wb);
        dcorrupt.fill_bytes(0);
        DQ(dqcu_transcode_hot(cs.g, drp.p, 1, (uint8_t *const *)dhp.p, dcorrupt.p, 0));
        CK(cudaDeviceSynchronize());
        dhot.download(gpu_bad.data(), hb);
        uint32_t corrupt = 0;
        dcorrupt.download(&corrupt, 1);
        report(crc == (ncorrupt ? DQ_CORRUPT : DQ_OK) && corrupt == ncorrupt && gpu_bad == cpu_bad,
               "hot transcode %s corrupt containers: cpu %s, %zu corrupt, gpu counted %u, bytes %s", cs.name.c_str(),
               dq_err_name(crc), ncorrupt, corrupt, gpu_bad == cpu_bad ? "identical" : "DIFFER");
        /* back to the valid window for the attention below */
        drec.upload(recs.data(), wb);
        DQ(dqcu_transcode_hot(cs.g, drp.p, 1, (uint8_t *const *)dhp.p, NULL, 0));
    }

    const int chk = dqcu_attend_hot_check(cs.g, QH);
    const bool expect = hot_expected(cs, G);
    report((chk == DQ_OK) == expect, "attend_hot_check %s QH=%u: %s (expected %s)", cs.name.c_str(), QH,
           dq_err_name(chk), expect ? "OK" : "UNSUPPORTED");
    if (chk == DQ_OK) {
        std::vector<DevBuf<uint16_t> *> dtk(nseq), dtv(nseq);
        std::vector<dqcu_attn_seq> seqs(nseq);
        std::vector<dq_hot_item> items(nseq);
        std::vector<dq_attn_item> items_ref(nseq);
        const float scale = 1.0f / sqrtf((float)d);
        std::vector<float> q(nseq * QH * d);
        const double qs = 0.5 + 2.0 * r.uniform();
        for (auto &x : q)
            x = (float)(r.normal() * qs);
        std::vector<float> oc(nseq * QH * d), lc(nseq * QH), orf(nseq * QH * d), lrf(nseq * QH);
        size_t w0 = 0;
        for (size_t b = 0; b < nseq; b++) {
            const size_t nw = dq_layer_window_count(layers[b]), tail = dq_layer_tail_tokens(layers[b]);
            dtk[b] = new DevBuf<uint16_t>(std::max<size_t>(tail * n, 1));
            dtv[b] = new DevBuf<uint16_t>(std::max<size_t>(tail * n, 1));
            if (tail) {
                dtk[b]->upload(dq_layer_tail(layers[b], DQ_KIND_K), tail * n);
                dtv[b]->upload(dq_layer_tail(layers[b], DQ_KIND_V), tail * n);
            }
            seqs[b].windows = dhp.p + w0;
            seqs[b].tail_k = dtk[b]->p;
            seqs[b].tail_v = dtv[b]->p;
            seqs[b].nwin = (uint32_t)nw;
            seqs[b].tail_tokens = (uint32_t)tail;
            items[b] = {cpu_ptrs.data() + w0,
                        nw,
                        dq_layer_tail(layers[b], DQ_KIND_K),
                        dq_layer_tail(layers[b], DQ_KIND_V),
                        tail,
                        &q[b * QH * d],
                        &oc[b * QH * d],
                        &lc[b * QH]};
            items_ref[b] = {layers[b], &q[b * QH * d], &orf[b * QH * d], &lrf[b * QH]};
            w0 += nw;
        }
        DQ(dq_hot_attend(cs.c, cs.ws, QH, scale, items.data(), nseq));
        DQ(dq_attend_reference(cs.c, cs.ws, QH, scale, items_ref.data(), nseq));
        /* every hot kernel that takes the shape: the default (the warp kernel where it applies),
         * then the block kernel */
        const int kernels[] = {DQCU_KERNEL_AUTO, 1};
        int last = 0;
        for (int hv : kernels) {
            g_hot_version = hv;
            set_gpu(cs);
            const int kernel = dqcu_attend_hot_kernel(cs.g, QH);
            if (kernel == last)
                continue;
            last = kernel;
            DevBuf<dqcu_attn_seq> dseqs(nseq);
            dseqs.upload(seqs.data(), nseq);
            DevBuf<float> dq_(q.size()), dout(q.size()), dlse(nseq * QH);
            dq_.upload(q.data(), q.size());
            const size_t wsb = dqcu_attend_hot_workspace_size(cs.g, QH, (uint32_t)nseq, max_tokens);
            DevBuf<uint8_t> dws(std::max<size_t>(wsb, 16));
            dout.fill_bytes(0xff);
            dlse.fill_bytes(0xff);
            DQ(dqcu_attend_hot(cs.g, QH, scale, dseqs.p, (uint32_t)nseq, max_tokens, dq_.p, dout.p, dlse.p, dws.p, wsb,
                               0));
            CK(cudaDeviceSynchronize());
            std::vector<float> og(q.size()), lg(nseq * QH);
            dout.download(og.data(), og.size());
            dlse.download(lg.data(), lg.size());
            double worst = 0, worst_ref = 0, worst_lse = 0;
            bool ok = wsb > 0;
            for (size_t b = 0; b < nseq; b++) {
                const size_t o = b * QH * d;
                if (lens[b] == 0) {
                    bool z = true;
                    for (size_t i = 0; i < (size_t)QH * d; i++)
                        z &= og[o + i] == 0.0f;
                    for (uint32_t h = 0; h < QH; h++)
                        z &= lg[b * QH + h] == -INFINITY;
                    if (!z) {
                        ok = false;
                        printf("        empty sequence %zu: output not 0 / lse not -inf\n", b);
                    }
                    continue;
                }
                const double e1 = rel_err(&og[o], &oc[o], (size_t)QH * d),
                             e2 = rel_err(&og[o], &orf[o], (size_t)QH * d);
                double el = 0;
                for (uint32_t h = 0; h < QH; h++) {
                    const double a = lg[b * QH + h], ref = lrf[b * QH + h];
                    double e = fabs(a - ref) / std::max(1.0, fabs(ref));
                    if (!(e == e))
                        e = INFINITY;
                    el = std::max(el, e);
                }
                if (!(e1 <= 1e-3) || !(e2 <= 1e-3) || !(el <= 1e-3)) {
                    ok = false;
                    printf("        sequence %zu (%u tokens): rel err vs dq_hot_attend %.3g, vs reference %.3g, lse "
                           "%.3g\n",
                           b, lens[b], e1, e2, el);
                }
                worst = std::max(worst, e1);
                worst_ref = std::max(worst_ref, e2);
                worst_lse = std::max(worst_lse, el);
            }
            std::string ls;
            for (size_t b = 0; b < nseq; b++)
                ls += (b ? "," : "") + std::to_string(lens[b]);
            report(ok,
                   "attend_hot %s QH=%u (G=%u) kernel %d lens [%s]: rel err vs dq_hot_attend %.2e, vs f64 reference "
                   "%.2e, lse %.2e",
                   cs.name.c_str(), QH, G, kernel, ls.c_str(), worst, worst_ref, worst_lse);
        }
        g_hot_version = DQCU_KERNEL_AUTO;
        set_gpu(cs);
        for (size_t b = 0; b < nseq; b++) {
            delete dtk[b];
            delete dtv[b];
        }
    }
    for (size_t b = 0; b < nseq; b++)
        dq_layer_free(layers[b]);
}

/* Every encoder version of enc_list on cs: test_streams, then test_windows in each input type (with
 * --small one window but for f32); the codec's default encoder afterwards. Returns the valid
 * windows of the first version's f32 run. */
static std::vector<uint8_t> test_encoders(Codecs &cs, Rng &r, const std::vector<int> &enc_list, size_t streams,
                                          size_t nwin, bool small, bool enc_ok)
{
    std::vector<uint8_t> valid;
    for (int ver : enc_list) {
        g_enc_version = ver;
        set_gpu(cs);
        test_streams(cs, r, streams, enc_ok);
        for (int dt = 0; dt < 3; dt++) {
            std::vector<uint8_t> v = test_windows(cs, r, small && dt ? 1 : nwin, (dq_dtype)dt, dt != 0 || small,
                                                  enc_ok);
            if (valid.empty())
                valid = v;
        }
    }
    g_enc_version = DQCU_KERNEL_AUTO;
    set_gpu(cs);
    return valid;
}

/* ---- container format version 2 (joint pairs: dq226p, dq196p, lib/src/rans2.h) ----
 *
 * dqcu_encode_streams / dqcu_encode_windows (every encoder version), dqcu_decompress,
 * dqcu_transcode_hot and dqcu_rebuild_hot must equal libdquant byte for byte (statuses, statistics
 * and corrupt containers too: test_streams, test_windows, test_decompress, test_hot),
 * dqcu_attend_hot take its hot windows, and the container attention run v7 on its pairs where
 * both kinds have at most 8 levels (test_attention) and refuse it beyond. */

/* Whether dqcu_attend takes the version-2 codec of cs (both kinds at most 8 levels, and a shape
 * attention v7 takes: head_dim a multiple of 64 up to 256; GQA groups 1, 2, 4, 8). */
static bool format2_attends(const Codecs &cs)
{
    const dq_profile *p = dq_codec_profile(cs.c);
    return p->levels[0] <= 8 && p->levels[1] <= 8 && cs.d % 64 == 0 && cs.d <= 256;
}

/* The container attention's answers for a version-2 codec with q_heads QH: v7 (a workspace, an
 * empty call that succeeds) where format2_attends, else DQ_UNSUPPORTED and no workspace; versions
 * older than 7 asked for refuse it either way. Decompress and the encoders take it. */
static void test_format2_api(Codecs &cs, uint32_t QH)
{
    const bool takes = format2_attends(cs);
    const int att = dqcu_attend(cs.g, QH, 1.0f, NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0);
    const int ak = dqcu_attend_kernel(cs.g, QH);
    const size_t wsb = dqcu_attend_workspace_size(cs.g, QH, 1, 128);
    const int dec = dqcu_decompress(cs.g, DQ_KIND_K, NULL, 0, NULL, 0, 0, 0, NULL, DQ_DTYPE_F32, NULL, 0);
    const int encw = dqcu_encode_windows(cs.g, NULL, NULL, DQ_DTYPE_BF16, 0, NULL, NULL, NULL, 0);
    g_att_version = 5;
    set_gpu(cs);
    const int old = dqcu_attend_kernel(cs.g, QH);
    g_att_version = DQCU_KERNEL_AUTO;
    set_gpu(cs);
    const bool ok = takes ? att == DQ_OK && ak == 7 && wsb > 0
                          : att == DQ_UNSUPPORTED && ak == DQ_UNSUPPORTED && wsb == 0;
    report(ok && old == DQ_UNSUPPORTED && dec == DQ_OK && encw == DQ_OK,
           "format 2 %s QH=%u: attend %s, attend_kernel %d (v5 asked: %s), workspace %zu, decompress %s, "
           "encode_windows %s (expected %s)",
           cs.name.c_str(), QH, dq_err_name(att), ak, dq_err_name(old), wsb, dq_err_name(dec), dq_err_name(encw),
           takes ? "v7" : "UNSUPPORTED");
}

/* Windows given on the host (a real cache's): dqcu_transcode_hot equals dq_hot_transcode and
 * dqcu_rebuild_hot gives the records back, byte for byte. */
static void test_hot_windows(Codecs &cs, const std::vector<uint8_t> &recs, const char *what)
{
    const size_t wb = dq_codec_window_bytes(cs.c), hb = dq_hot_window_bytes(cs.c), total = recs.size() / wb;
    if (!total)
        return;
    std::vector<uint8_t> cpu(total * hb), gpu(total * hb), back(total * wb);
    for (size_t i = 0; i < total; i++)
        DQ(dq_hot_transcode(cs.c, &recs[i * wb], &cpu[i * hb]));
    DevBuf<uint8_t> drec(recs.size()), dhot(cpu.size()), dback(recs.size());
    drec.upload(recs.data(), recs.size());
    dhot.fill_bytes(0x5a);
    dback.fill_bytes(0xa5);
    std::vector<const uint8_t *> rp(total), hp(total), bp(total);
    for (size_t i = 0; i < total; i++) {
        rp[i] = drec.p + i * wb;
        hp[i] = dhot.p + i * hb;
        bp[i] = dback.p + i * wb;
    }
    DevBuf<const uint8_t *> drp(total), dhp(total), dbp(total);
    drp.upload(rp.data(), total);
    dhp.upload(hp.data(), total);
    dbp.upload(bp.data(), total);
    DevBuf<uint32_t> dcnt(2);
    dcnt.fill_bytes(0);
    DQ(dqcu_transcode_hot(cs.g, drp.p, total, (uint8_t *const *)dhp.p, dcnt.p, 0));
    DQ(dqcu_rebuild_hot(cs.g, dhp.p, total, (uint8_t *const *)dbp.p, dcnt.p + 1, 0));
    CK(cudaDeviceSynchronize());
    dhot.download(gpu.data(), gpu.size());
    dback.download(back.data(), back.size());
    uint32_t cnt[2];
    dcnt.download(cnt, 2);
    report(cnt[0] == 0 && cnt[1] == 0 && gpu == cpu && back == recs,
           "%s %s: %zu windows, transcode %s (corrupt %u), rebuild %s (bad %u)", what, cs.name.c_str(), total,
           gpu == cpu ? "identical" : "DIFFER", cnt[0], back == recs ? "identical" : "DIFFER", cnt[1]);
}

/* Every layer of bytellama-n1024's real cache (read_real_kv) ([2, layers, T, 8, 128] fp16, n = 1024 like
 * Qwen3-8B) with profile: its whole windows encoded on the GPU (every encoder version) as by
 * libdquant, then libdquant's records decompressed, transcoded and rebuilt on the GPU. */
static void test_real_cache(Rng &r, const char *profile, bool small, const std::vector<int> &enc_list)
{
    const uint32_t layers = 4, T = 512, kvh = 8, d = 128, n = kvh * d;
    std::vector<uint16_t> kv((size_t)2 * layers * T * n);
    std::string path;
    const size_t got = read_real_kv("bytellama-n1024", kv, path);
    if (got != kv.size()) {
        printf("real cache %s: %s absent or short (%zu of %zu values); skipped (--data DIR)\n", profile, path.c_str(),
               got, kv.size());
        return;
    }
    Cfg cfg = {kvh, d, 0, 0, 128, 128, 0, 0, 0, profile};
    Codecs cs;
    make_codecs(cfg, cs);
    printf("real cache bytellama-n1024, %s\n", cs.name.c_str());
    if (dq_codec_profile(cs.c)->format_version == DQ_FORMAT_VERSION_PAIRS)
        test_format2_api(cs, cs.kvh * 4);
    for (uint32_t l = 0; l < (small ? 1u : layers); l++) {
        dq_layer *hl = nullptr;
        DQ(dq_layer_create(cs.c, &hl));
        const uint16_t *k = &kv[(size_t)l * T * n], *v = &kv[((size_t)layers + l) * T * n];
        const size_t nw = T / cs.W, vals = nw * cs.W * n;
        std::vector<uint8_t> kb((const uint8_t *)k, (const uint8_t *)(k + vals));
        std::vector<uint8_t> vb((const uint8_t *)v, (const uint8_t *)(v + vals));
        char label[48];
        snprintf(label, sizeof label, "(real layer %u)", l);
        for (int ver : enc_list) {
            g_enc_version = ver;
            set_gpu(cs);
            compare_windows(cs, kb, vb, DQ_DTYPE_F16, nw, label, true);
        }
        g_enc_version = DQCU_KERNEL_AUTO;
        set_gpu(cs);
        DQ(dq_layer_append(hl, cs.ws, k, v, DQ_DTYPE_F16, T, NULL));
        const size_t wb = dq_codec_window_bytes(cs.c);
        std::vector<uint8_t> wins(dq_layer_window_count(hl) * wb);
        for (size_t w = 0; w < dq_layer_window_count(hl); w++)
            memcpy(&wins[w * wb], dq_layer_window(hl, w), wb);
        dq_layer_free(hl);
        char what[48];
        snprintf(what, sizeof what, "real layer %u hot", l);
        test_decompress(cs, r, wins, small ? 4 : 12);
        test_hot_windows(cs, wins, what);
    }
}

/* Random profiles and inputs of version 2 (the built-ins first), then the real cache. */
static void test_format2(Rng &r, bool small, const std::vector<int> &enc_list)
{
    std::vector<Cfg> cfgs = {
        {8, 128, 0, 0, 128, 128, 0, 0, 0, "dq226p"}, /* production: n = 1024, 3 + 3 bits */
        {8, 128, 0, 0, 128, 128, 0, 0, 0, "dq196p"},
        {2, 128, 0, 0, 128, 128, 0, 0, 0, "dq226p"},
    };
    if (!small) {
        cfgs.push_back({4, 64, 5, 3, 64, 64, 2.5, 1.8, 0x77, NULL});
        cfgs.push_back({2, 256, 16, 12, 100, 120, 3.5, 3.0, 0x5, NULL});
        cfgs.push_back({1, 32, 32, 2, 32, 40, 0.1, 4.0, 0, NULL}); /* 1024 pairs, tight container */
        cfgs.push_back({2, 512, 2, 32, 64, 64, 1.0, 0.1, 0x9, NULL});
        cfgs.push_back({3, 128, 9, 7, 128, 150, 2.7, 2.0, 0x3, NULL});
        cfgs.push_back({2, 256, 8, 2, 100, 120, 2.5, 1.2, 0x11, NULL}); /* attended: d = 256, W = 100 */
        cfgs.push_back({1, 64, 2, 8, 32, 32, 0.1, 3.0, 0, NULL});       /* attended: tight keys, W = 32 */
    }
    for (const Cfg &cfg : cfgs) {
        Codecs cs;
        make_codecs(cfg, cs, DQ_FORMAT_VERSION_PAIRS);
        printf("%s (format 2)\n", cs.name.c_str());
        const std::vector<uint8_t> valid = test_encoders(cs, r, enc_list, small ? 40 : 600, 5, small, true);
        test_decompress(cs, r, valid, small ? 4 : 12);
        const uint32_t W = cs.W;
        std::vector<uint32_t> lens = {0, 1, W + 3, 3 * W + r.below(W)};
        if (!small)
            lens.push_back(20 * W + r.below(W));
        uint32_t G = 4;
        while (G > 1 && dqcu_attend_check(cs.g, cs.kvh * G) != DQ_OK)
            G >>= 1;
        test_format2_api(cs, cs.kvh * G);
        test_hot(cs, r, lens, G);
        if (format2_attends(cs))
            test_attention(cs, r, lens, G, {DQCU_KERNEL_AUTO});
    }
    const char *profiles[] = {"dq226p", "dq196p", "dq226"};
    for (const char *p : profiles)
        test_real_cache(r, p, small, enc_list);
}

/* ---- timing on the dq226 shape ---- */

static void timing(Rng &r, const std::vector<int> &enc_list, const std::vector<int> &att_list)
{
    Codecs cs;
    Cfg cfg = {8, 128, 0, 0, 128, 128, 0, 0, 0, "dq226"};
    make_codecs(cfg, cs);
    const uint32_t n = cs.n, W = cs.W;
    printf("\ntiming (%s), medians of events after warm-up:\n", cs.name.c_str());
    {
        const size_t count = 131072;
        std::vector<float> y((size_t)count * n);
        for (size_t s = 0; s < count; s++)
            gen_stream(r, D_GAUSS, n, &y[s * n]);
        DevBuf<float> dy(y.size());
        dy.upload(y.data(), y.size());
        for (int ver : enc_list)
            for (int kind = 0; kind < 2; kind++) {
                const size_t rb = dq_codec_record_bytes(cs.c, (dq_kind)kind);
                DevBuf<uint8_t> drec(count * rb);
                DevBuf<int32_t> dst(count);
                g_enc_version = ver;
                set_gpu(cs);
                double ms = time_median_ms(
                    [&] { DQ(dqcu_encode_streams(cs.g, (dq_kind)kind, dy.p, count, drec.p, rb, dst.p, NULL, 0)); }, 2,
                    5);
                printf("  encode_streams v%d %s: %zu streams in %.3f ms = %.2f M streams/s\n", ver, kind ? "V" : "K",
                       count, ms, count / (ms * 1e3));
            }
    }
    {
        const size_t nwin = 512;
        std::vector<float> k, v;
        gen_tokens(r, n, nwin * W, true, k);
        gen_tokens(r, n, nwin * W, false, v);
        std::vector<uint8_t> kb, vb;
        to_dtype(k.data(), k.size(), DQ_DTYPE_BF16, kb);
        to_dtype(v.data(), v.size(), DQ_DTYPE_BF16, vb);
        const size_t wb = dq_codec_window_bytes(cs.c);
        DevBuf<uint8_t> dk(kb.size()), dv(vb.size()), dwin(nwin * wb);
        dk.upload(kb.data(), kb.size());
        dv.upload(vb.data(), vb.size());
        DevBuf<uint8_t *> dptr(nwin);
        std::vector<uint8_t *> ptrs(nwin);
        for (size_t w = 0; w < nwin; w++)
            ptrs[w] = dwin.p + w * wb;
        dptr.upload(ptrs.data(), nwin);
        DevBuf<int32_t> dst(nwin);
        for (int ver : enc_list) {
            g_enc_version = ver;
            set_gpu(cs);
            double ms = time_median_ms(
                [&] { DQ(dqcu_encode_windows(cs.g, dk.p, dv.p, DQ_DTYPE_BF16, nwin, dptr.p, dst.p, NULL, 0)); }, 2, 5);
            printf("  encode_windows v%d bf16: %zu windows (%zu streams) in %.3f ms = %.2f M streams/s\n", ver, nwin,
                   nwin * W * 2, ms, nwin * W * 2 / (ms * 1e3));
        }
        const size_t ntok = nwin * W;
        DevBuf<uint16_t> dout(ntok * n);
        double ms2 = time_median_ms(
            [&] {
                DQ(dqcu_decompress(cs.g, DQ_KIND_K, (const uint8_t *const *)dptr.p, nwin, NULL, 0, 0, ntok, dout.p,
                                   DQ_DTYPE_BF16, NULL, 0));
            },
            2, 7);
        printf("  decompress K -> bf16: %zu tokens in %.3f ms = %.1f GB/s of bf16 written, %.1f M tokens/s\n", ntok,
               ms2, ntok * n * 2.0 / (ms2 * 1e6), ntok / (ms2 * 1e3));
        /* attention on those windows (38 MB: they may sit in L2; a comparison of the versions, not a
         * bandwidth figure): 8 sequences of 64 windows (8K tokens) each, GQA group 4 */
        const uint32_t nseq = 8, per = (uint32_t)(nwin / nseq), QH = cs.kvh * 4, maxt = per * W;
        DevBuf<uint16_t> dtail(1); /* no tail tokens */
        std::vector<dqcu_attn_seq> seqs(nseq);
        for (uint32_t b = 0; b < nseq; b++)
            seqs[b] = {(const uint8_t *const *)(dptr.p + (size_t)b * per), dtail.p, dtail.p, per, 0};
        DevBuf<dqcu_attn_seq> dseqs(nseq);
        dseqs.upload(seqs.data(), nseq);
        std::vector<float> q((size_t)nseq * QH * cs.d);
        for (auto &x : q)
            x = (float)r.normal();
        DevBuf<float> dq_(q.size()), dao(q.size());
        dq_.upload(q.data(), q.size());
        g_enc_version = DQCU_KERNEL_AUTO;
        for (int ver : att_list) {
            g_att_version = ver;
            set_gpu(cs);
            const size_t wsb = dqcu_attend_workspace_size(cs.g, QH, nseq, maxt);
            DevBuf<uint8_t> dws(std::max<size_t>(wsb, 1));
            const float scale = 1.0f / sqrtf((float)cs.d);
            double ms = time_median_ms(
                [&] { DQ(dqcu_attend(cs.g, QH, scale, dseqs.p, nseq, maxt, dq_.p, dao.p, NULL, dws.p, wsb, 0)); }, 3,
                11);
            printf("  attend v%d (asked %d): %u sequences x %u tokens, QH=%u, in %.3f ms = %.1f M tokens/s\n",
                   dqcu_attend_kernel(cs.g, QH), ver, nseq, maxt, QH, ms, nseq * (double)maxt / (ms * 1e3));
        }
        g_att_version = DQCU_KERNEL_AUTO;
    }
}

/* ---- the test matrix ---- */

/* A comma-separated list of versions, each one the library registers (list()); false after a
 * message when not. */
static bool parse_versions(const char *arg, const int *(*list)(size_t *), std::vector<int> &out, const char *flag)
{
    size_t nv = 0;
    const int *v = list(&nv);
    for (const char *q = arg; *q;) {
        char *end;
        const long x = strtol(q, &end, 10);
        if (end == q || std::find(v, v + nv, (int)x) == v + nv) {
            fprintf(stderr, "%s: a comma-separated list of the versions this library has:", flag);
            for (size_t i = 0; i < nv; i++)
                fprintf(stderr, " %d", v[i]);
            fprintf(stderr, "\n");
            return false;
        }
        out.push_back((int)x);
        q = *end == ',' ? end + 1 : end;
    }
    return true;
}

/* Every registered version, the library's default (the first) first. */
static void all_versions(const int *(*list)(size_t *), std::vector<int> &out)
{
    size_t nv = 0;
    const int *v = list(&nv);
    out.assign(v, v + nv);
}

int main(int argc, char **argv)
{
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    bool small = false, do_timing = true, hot_only = false, fixed_only = false, format2_only = false;
    if (getenv("DQ_DATA_DIR") && *getenv("DQ_DATA_DIR"))
        g_data_dir = getenv("DQ_DATA_DIR");
    std::vector<int> enc_list, att_list;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--small"))
            small = true;
        else if (!strcmp(argv[i], "--no-timing"))
            do_timing = false;
        else if (!strcmp(argv[i], "--quiet"))
            g_quiet = 1;
        else if (!strcmp(argv[i], "--hot"))
            hot_only = true;
        else if (!strcmp(argv[i], "--fixed"))
            fixed_only = true;
        else if (!strcmp(argv[i], "--format2"))
            format2_only = true;
        else if (!strcmp(argv[i], "--data") && i + 1 < argc)
            g_data_dir = argv[++i];
        else if (!strcmp(argv[i], "--encode-kernel") && i + 1 < argc) {
            if (!parse_versions(argv[++i], dqcu_encode_kernels, enc_list, "--encode-kernel"))
                return 2;
        } else if (!strcmp(argv[i], "--attend-kernel") && i + 1 < argc) {
            if (!parse_versions(argv[++i], dqcu_attend_kernels, att_list, "--attend-kernel"))
                return 2;
        } else {
            fprintf(stderr,
                    "usage: %s [--seed N] [--small] [--no-timing] [--quiet] [--hot] [--fixed] [--format2] [--data DIR] "
                    "[--encode-kernel V,...] [--attend-kernel V,...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (dqcu_device_count() == 0) {
        printf("checkcuda: no CUDA device of compute capability 9.0 or newer; skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("checkcuda: %s (sm_%d%d, %d SMs), seed %llu%s\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (unsigned long long)seed, small ? " (small)" : "");
    Rng r(seed);

    /* the drift's λ table on the device comes from the same expression as lib's */
    {
        const float *t = dq__exp2_table();
        bool same = true;
        for (int i = 0; i < 512; i++)
            same &= (float)exp2(i / 512.0) == t[i];
        report(same, "exp2 table: host recomputation equals dq__exp2_table()");
    }

    if (fixed_only) {
        test_fixed_encode(r, small);
        printf("\ncheckcuda: %d checks, %d failed (seed %llu)\n", g_checks, g_failures, (unsigned long long)seed);
        return g_failures ? 1 : 0;
    }

    test_scatter(r, 1024, 64);
    test_scatter(r, 128, 3);
    test_scatter(r, 77, 1);

    if (enc_list.empty())
        all_versions(dqcu_encode_kernels, enc_list);
    if (att_list.empty())
        all_versions(dqcu_attend_kernels, att_list);
    printf("versions: encode");
    for (int v : enc_list)
        printf(" %d", v);
    printf(", attend");
    for (int v : att_list)
        printf(" %d", v);
    printf("\n");
    if (enc_list.empty())
        all_versions(dqcu_encode_kernels, enc_list);
    if (format2_only) {
        test_format2(r, small, enc_list);
        printf("\ncheckcuda: %d checks, %d failed (seed %llu)\n", g_checks, g_failures, (unsigned long long)seed);
        return g_failures ? 1 : 0;
    }
    if (hot_only) {
        /* the hot layout alone, with the container attention of att_list on the same shapes */
        const Cfg hcfgs[] = {
            {8, 128, 0, 0, 128, 128, 0, 0, 0, "dq226"},     /* production: n = 1024, 3 + 3 bits */
            {2, 128, 0, 0, 128, 128, 0, 0, 0, "dq196"},     /* M 7/5 */
            {4, 256, 8, 6, 128, 128, 2.5, 1.8, 0x77, NULL}, /* d = 256: two groups per lane quad */
            {2, 128, 16, 12, 64, 64, 3.5, 3.0, 0x5, NULL},  /* 4 + 4 bits, W = 64: half tiles */
            {2, 128, 8, 6, 256, 256, 2.5, 1.8, 0x9, NULL},  /* W = 256: two tiles per window */
            {2, 128, 8, 12, 128, 128, 2.5, 3.0, 0x3, NULL}, /* 3 + 4 bits: not taken */
            {4, 64, 8, 6, 128, 128, 2.5, 1.8, 0x3, NULL},   /* d = 64: not taken */
            /* the fixed-width family: device transcode of base-M containers */
            {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixed226"},    /* production: M 6/3, 3 + 2 bits */
            {8, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk8v6"},   /* 3 + 3 bits: attention taken */
            {2, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk16v9"},  /* 4 + 4 bits: taken */
            {2, 128, 0, 0, 128, 128, 0, 0, 0, "fixed196"},    /* M 5/3 at n = 256 */
            {1, 128, 0, 0, 128, 128, 0, 0, 0, "fixedk256v2"}, /* byte and 1-bit codes */
        };
        for (const Cfg &cfg : hcfgs) {
            Codecs cs;
            make_codecs(cfg, cs);
            printf("%s\n", cs.name.c_str());
            const bool fixed = dq_codec_profile(cs.c)->codec_type == DQ_CODEC_FIXED;
            if (fixed)
                test_fixed_refusals(cs);
            const uint32_t W = cs.W;
            std::vector<uint32_t> lens = {0, 1, W + 3, 3 * W + r.below(W), 20 * W + r.below(W)};
            if (cfg.builtin && cs.n == 1024)
                lens = {64 * 128 + 17, 0, 5 * 128, 130 * 128 + 100, 1, 128 * 8 + 127};
            const uint32_t Gs[] = {4, 2, 1, 8};
            for (uint32_t G : Gs) {
                if (dqcu_attend_check(cs.g, cs.kvh * G) != DQ_OK)
                    continue;
                test_hot(cs, r, lens, G);
                if (!small && !fixed && (G == 4 || cs.n != 1024))
                    test_attention(cs, r, lens, G, att_list);
                if (small)
                    break;
            }
        }
        printf("\ncheckcuda: %d checks, %d failed (seed %llu)\n", g_checks, g_failures, (unsigned long long)seed);
        return g_failures ? 1 : 0;
    }
    std::vector<Cfg> cfgs;
    if (small) {
        cfgs.push_back({2, 128, 8, 6, 32, 32, 2.5, 1.8, 0x5eed, NULL});
        cfgs.push_back({1, 64, 5, 3, 32, 40, 0.1, 0.1, 0, NULL});
    } else {
        cfgs.push_back({8, 128, 0, 0, 128, 128, 0, 0, 0, "dq226"});
        cfgs.push_back({8, 128, 0, 0, 128, 128, 0, 0, 0, "dq196"});
        const uint32_t shapes[][2] = {{1, 64},  {2, 32},   {4, 16},  {1, 128},  {3, 128}, {8, 64}, {5, 128},
                                      {4, 256}, {16, 128}, {2, 512}, {32, 128}, {3, 32},  {5, 16}, {6, 4}};
        const uint32_t wins[] = {128, 64, 32, 100};
        for (const auto &sh : shapes) {
            Cfg c = {};
            c.kvh = sh[0];
            c.d = sh[1];
            c.MK = 2 + r.below(15);
            c.MV = 2 + r.below(15);
            c.W = wins[r.below(4)];
            c.R = c.W + (r.below(2) ? 0 : r.below(64));
            c.rate_k = r.below(5) == 0 ? 0.1 : 1.0 + 3.0 * r.uniform();
            c.rate_v = r.below(5) == 0 ? 0.1 : 0.8 + 2.5 * r.uniform();
            c.seed = r.below(4) ? r.next() : 0;
            cfgs.push_back(c);
        }
        /* the largest alphabets and very tight containers */
        cfgs.push_back({8, 128, 32, 16, 128, 128, 0.1, 3.0, 0x1234, NULL});
        cfgs.push_back({2, 128, 16, 32, 64, 64, 4.5, 0.1, 0x77, NULL});
    }

    for (const Cfg &cfg : cfgs) {
        Codecs cs;
        make_codecs(cfg, cs);
        printf("%s\n", cs.name.c_str());
        const bool enc_ok = cs.n <= DQCU_MAX_ENCODE_STREAM;
        const bool dec_ok = cs.d >= 32;
        /* every encoder version (or those asked for), the first one's windows decompressed below */
        std::vector<uint8_t> valid = test_encoders(cs, r, enc_list, small ? 40 : 1200, small ? 3 : 5, small, enc_ok);
        if (!dec_ok)
            continue;
        test_decompress(cs, r, valid, small ? 4 : 12);
        /* a GQA group the attention kernel takes for this shape (its state is in shared memory) */
        const uint32_t Gs[] = {1, 2, 4, 8};
        uint32_t G = Gs[r.below(4)];
        while (G > 1 && dqcu_attend_check(cs.g, cs.kvh * G) != 0)
            G >>= 1;
        {
            int bad_shape = cs.kvh > 1 ? dqcu_attend_check(cs.g, cs.kvh * G + 1) : DQ_SHAPE;
            int big_group = dqcu_attend_check(cs.g, cs.kvh * 16);
            report(bad_shape == DQ_SHAPE && big_group == DQ_UNSUPPORTED,
                   "attend_check %s: q_heads not a multiple of kv_heads -> %s, group of 16 -> %s", cs.name.c_str(),
                   dq_err_name(bad_shape), dq_err_name(big_group));
        }
        std::vector<uint32_t> lens;
        if (small) {
            lens = {0, 1, cs.W + 3, 2 * cs.W};
        } else {
            const uint32_t W = cs.W;
            lens = {0, 1, W - 1, W, W + 1, 3 * W + r.below(W), r.below(12 * W), 20 * W + r.below(W)};
            if (cs.n >= 2048)
                lens.resize(6);
        }
        test_attention(cs, r, lens, G, att_list);
        test_hot(cs, r, lens, G);
    }
    test_fixed_encode(r, small);
    if (!small) {
        Codecs cs;
        Cfg cfg = {8, 128, 0, 0, 128, 128, 0, 0, 0, "dq226"};
        make_codecs(cfg, cs);
        /* more streams than one wave of the encoder's warps holds at G per warp (17,424 on an H200):
         * the planned grid's full groups, then its smaller ones */
        test_streams(cs, r, 30000, true);
        std::vector<uint32_t> lens = {64 * 128 + 17, 5 * 128, 130 * 128 + 100};
        test_attention(cs, r, lens, 4, att_list);
    }
    test_format2(r, small, enc_list);
    printf("\ncheckcuda: %d checks, %d failed (seed %llu)\n", g_checks, g_failures, (unsigned long long)seed);
    if (do_timing && !small && g_failures == 0)
        timing(r, enc_list, att_list);
    return g_failures ? 1 : 0;
}
