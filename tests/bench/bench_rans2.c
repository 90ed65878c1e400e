/* bench_rans2: CPU decode speed of container format version 2 (joint two-symbol rANS at 12-bit
 * precision, lib/src/rans2.h) against version 1 (byte-wise rANS at 8-bit precision) on the same
 * levels, in the same run.
 *
 * The levels: S = 2048 streams of n = 1024 values per kind, each a Gaussian stream quantized by
 * dq226's encoder (dq_stream_encode through the v1 codec, so drift included), then coded with
 * dq226's v1 tables and with dq226p's pair tables (containers of n + 4 bytes: every stream fits
 * both). Decoders, scalar C on one core:
 *   v1 scalar   dq__rans_decode (the reference decoder, one lookup per level)
 *   v1 dsp      the dsp table's decode_levels for this CPU (interleaved streams where AVX2 is)
 *   v2 scalar   dq__rans2_decode (one lookup per two levels)
 * Every decode must give the levels back. Figures: levels/s, the fastest of 9 repetitions in
 * this thread's CPU time; ratio = v2 scalar / v1 scalar.
 *
 * Usage: bench_rans2 [--json PATH] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "codec_internal.h"
#include "dsp.h"

#define S 2048
#define REPS 9

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        u[i] = ((rng * 2685821657736338717ull) >> 11) * 0x1.0p-53;
    }
    return sqrt(-2.0 * log(u[0] + 1e-300)) * cos(6.283185307179586 * u[1]);
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) {
            json = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--json PATH]\n", argv[0]);
            return 2;
        }
    }
    dq_profile p1, p2;
    dq_codec *c1, *c2;
    dq_workspace *ws;
    if (dq_profile_builtin("dq226", 8, 128, &p1) || dq_profile_builtin("dq226p", 8, 128, &p2) ||
        dq_codec_create(&p1, NULL, &c1) || dq_codec_create(&p2, NULL, &c2) || dq_workspace_create(c1, &ws))
        return 1;
    const uint32_t n = 1024, C = n + 4;
    const size_t stride = 4 + C;
    uint8_t *lev = malloc((size_t)S * n), *rec1 = calloc(S, stride), *rec2 = calloc(S, stride);
    uint8_t *out = malloc((size_t)S * n), *scratch = malloc(n), *rec = malloc(4 + 1024);
    float *y = malloc(n * sizeof *y);
    if (!lev || !rec1 || !rec2 || !out || !scratch || !rec || !y)
        return 1;
    FILE *f = json ? fopen(json, "w") : NULL;
    if (json && !f) {
        perror(json);
        return 1;
    }
    char cpu[128], load[128];
    bench_read_line("/proc/cpuinfo", "model name", cpu, sizeof cpu);
    bench_read_line("/proc/loadavg", NULL, load, sizeof load);
    printf("cpu: %s; load average: %s; dsp: %s\n", cpu, load, dq__dsp_name());
    if (f)
        fprintf(f,
                "{\n \"bench\": \"bench_rans2\",\n \"cpu\": \"%s\",\n \"loadavg\": \"%s\",\n \"dsp\": \"%s\",\n"
                " \"streams\": %d,\n \"n\": %u,\n \"reps\": %d,\n"
                " \"note\": \"levels/s of decoding the same dq226 levels: v1 (8-bit byte-wise rANS) vs v2 (joint "
                "pairs, 12-bit); scalar C, one core, CPU time; ratio = v2 scalar / v1 scalar; bits_per_value: the "
                "containers' payload of the same levels\",\n \"records\": [\n",
                cpu, load, dq__dsp_name(), S, n, REPS);
    printf("%-4s %6s %11s %14s %14s %14s %8s %8s\n", "kind", "M", "bits v1/v2", "v1 scalar M/s", "v1 dsp M/s",
           "v2 scalar M/s", "v2/v1", "v2/v1dsp");
    int bad = 0;
    for (int kind = 0; kind < 2; kind++) {
        const dq__kind_tables *k1 = &c1->kt[kind], *k2 = &c2->kt[kind];
        double bytes1 = 0, bytes2 = 0;
        for (uint32_t s = 0; s < S; s++) {
            for (uint32_t i = 0; i < n; i++)
                y[i] = (float)normal();
            if (dq__stream_encode_ex(c1, ws, (dq_kind)kind, y, rec, NULL, lev + (size_t)s * n))
                return 1;
            bytes1 += dq__rans_encode(&k1->enc, lev + (size_t)s * n, n, scratch, rec1 + s * stride + 4, C);
            bytes2 += dq__rans2_encode(&k2->enc2, lev + (size_t)s * n, n, scratch, rec2 + s * stride + 4, C);
        }
        double t[3] = {INFINITY, INFINITY, INFINITY};
        for (int r = 0; r < REPS; r++) {
            double t0 = now();
            size_t corrupt = 0;
            for (uint32_t s = 0; s < S; s++)
                corrupt += dq__rans_decode(&k1->dec, rec1 + s * stride + 4, C, n, out + (size_t)s * n) != 0;
            double t1 = now();
            bad |= corrupt != 0 || memcmp(out, lev, (size_t)S * n) != 0;
            memset(out, 0, (size_t)S * n);
            if (t1 - t0 < t[0])
                t[0] = t1 - t0;
            t0 = now();
            corrupt = dq__dsp_get()->decode_levels(&k1->dec, rec1, stride, S, C, n, out);
            t1 = now();
            if (t1 - t0 < t[1])
                t[1] = t1 - t0;
            bad |= corrupt != 0 || memcmp(out, lev, (size_t)S * n) != 0;
            memset(out, 0, (size_t)S * n);
            t0 = now();
            corrupt = 0;
            for (uint32_t s = 0; s < S; s++)
                corrupt += dq__rans2_decode(&k2->dec2, rec2 + s * stride + 4, C, n, out + (size_t)s * n) != 0;
            t1 = now();
            if (t1 - t0 < t[2])
                t[2] = t1 - t0;
            bad |= corrupt != 0 || memcmp(out, lev, (size_t)S * n) != 0;
            memset(out, 0, (size_t)S * n);
        }
        const double nv = (double)S * n;
        const double bpv1 = 8.0 * bytes1 / nv, bpv2 = 8.0 * bytes2 / nv;
        printf("%-4s %6u %4.3f/%4.3f %14.1f %14.1f %14.1f %7.2fx %7.2fx\n", kind ? "V" : "K", k1->levels, bpv1, bpv2,
               nv / t[0] / 1e6, nv / t[1] / 1e6, nv / t[2] / 1e6, t[0] / t[2], t[1] / t[2]);
        if (f)
            fprintf(f,
                    "  {\"kind\": \"%s\", \"levels\": %u, \"v1_bits_per_value\": %.5f, \"v2_bits_per_value\": %.5f, "
                    "\"v1_scalar_msym_s\": %.1f, \"v1_dsp_msym_s\": %.1f, \"v2_scalar_msym_s\": %.1f, "
                    "\"ratio_v2_v1_scalar\": %.3f, \"ratio_v2_scalar_v1_dsp\": %.3f}%s\n",
                    kind ? "V" : "K", k1->levels, bpv1, bpv2, nv / t[0] / 1e6, nv / t[1] / 1e6, nv / t[2] / 1e6,
                    t[0] / t[2], t[1] / t[2], kind ? "" : ",");
    }
    if (f) {
        fprintf(f, " ]\n}\n");
        fclose(f);
    }
    if (bad)
        fprintf(stderr, "bench_rans2: a decoder did not give the levels back\n");
    dq_workspace_free(ws);
    dq_codec_free(c1);
    dq_codec_free(c2);
    free(lev);
    free(rec1);
    free(rec2);
    free(out);
    free(scratch);
    free(rec);
    free(y);
    return bad;
}
