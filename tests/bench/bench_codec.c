/* bench_codec: libdquant speed on this CPU, against references measured in the same run.
 *
 *   checks  values/s of the PUT input checks (dq_check_finite, dq_check_tokens), beside memcpy
 *   encode  streams/s per core (n = 1024, dq226, Gaussian), 1 thread and all cores
 *   decode  values/s per core (fast multi-stream decoder, and the scalar reference), 1 and all cores,
 *           beside memcpy and ZSTD_decompress (level 3, the BF16 bytes of the same tokens)
 *   attend  decode attention over a 32K-token dq226 layer (32 query heads, 8 KV heads) in tokens/s,
 *           beside plain float attention over the same tokens held as BF16, and beside a bare decode
 *           of the same K and V streams
 *
 * Every figure is the median of several timed repetitions after a warm-up. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "codec_internal.h"
#include "dquant/dquant.h"
#include "dsp.h"

#define REPS 5

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static double gauss(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    double u = ((g_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    double w = (g_rng >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

typedef struct job {
    const dq_codec *codec;
    int kind;
    const float *x;
    uint8_t *rec;
    size_t first, count, stride;
    int fast;
    uint8_t *levels;
    double secs;
} job;

static void *encode_job(void *arg)
{
    job *j = arg;
    dq_workspace *ws;
    if (dq_workspace_create(j->codec, &ws) != DQ_OK)
        return NULL;
    const size_t n = dq_codec_stream_len(j->codec);
    double t0 = now();
    for (size_t i = j->first; i < j->first + j->count; i++)
        if (dq_stream_encode(j->codec, ws, (dq_kind)j->kind, j->x + i * n, j->rec + i * j->stride, NULL) != DQ_OK)
            abort();
    j->secs = now() - t0;
    dq_workspace_free(ws);
    return NULL;
}

static void *decode_job(void *arg)
{
    job *j = arg;
    dq__dsp dsp;
    dq__dsp_init_c(&dsp);
    if (j->fast)
        dq__dsp_init_x86(&dsp);
    const dq__kind_tables *kt = &j->codec->kt[j->kind];
    const size_t n = j->codec->n, chunk = 128;
    double t0 = now();
    for (size_t i = j->first; i < j->first + j->count; i += chunk) {
        size_t c = j->first + j->count - i < chunk ? j->first + j->count - i : chunk;
        if (dsp.decode_levels(&kt->dec, j->rec + i * j->stride, j->stride, c, kt->container, (uint32_t)n, j->levels))
            abort();
    }
    j->secs = now() - t0;
    return NULL;
}

/* Runs fn over [0, total) split across nthreads; returns the wall time. */
static double run_threads(void *(*fn)(void *), job *proto, size_t total, int nthreads, uint8_t **levels)
{
    pthread_t th[64];
    job jobs[64];
    size_t per = total / (size_t)nthreads;
    double t0 = now();
    for (int t = 0; t < nthreads; t++) {
        jobs[t] = *proto;
        jobs[t].first = (size_t)t * per;
        jobs[t].count = t == nthreads - 1 ? total - jobs[t].first : per;
        jobs[t].levels = levels ? levels[t] : NULL;
        pthread_create(&th[t], NULL, fn, &jobs[t]);
    }
    for (int t = 0; t < nthreads; t++)
        pthread_join(th[t], NULL);
    return now() - t0;
}

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2,fma"))) static float dot_f32(const float *a, const float *b, uint32_t d)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    uint32_t j = 0;
    for (; j + 16 <= d; j += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
    }
    s0 = _mm256_add_ps(s0, s1);
    float t[8];
    _mm256_storeu_ps(t, s0);
    float r = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
    for (; j < d; j++)
        r += a[j] * b[j];
    return r;
}
__attribute__((target("avx2,fma"))) static void axpy_f32(float *acc, float w, const float *x, uint32_t d)
{
    __m256 vw = _mm256_set1_ps(w);
    uint32_t j = 0;
    for (; j + 8 <= d; j += 8)
        _mm256_storeu_ps(acc + j, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + j), _mm256_loadu_ps(acc + j)));
    for (; j < d; j++)
        acc[j] += w * x[j];
}
#else
static float dot_f32(const float *a, const float *b, uint32_t d)
{
    float r = 0;
    for (uint32_t j = 0; j < d; j++)
        r += a[j] * b[j];
    return r;
}
static void axpy_f32(float *acc, float w, const float *x, uint32_t d)
{
    for (uint32_t j = 0; j < d; j++)
        acc[j] += w * x[j];
}
#endif

/* Plain float attention over BF16 K/V, token-major like the container path (each K/V row converted
 * once and shared by the query heads of its group), two passes with an exact softmax, with the same
 * SIMD dot/axpy as the container path uses. */
static double bf16_attention(const uint16_t *k, const uint16_t *v, size_t T, const float *q, uint32_t qh, uint32_t kvh,
                             uint32_t d, float *out, float *logits)
{
    const uint32_t G = qh / kvh, n = kvh * d;
    const float scale = 1.0f / sqrtf((float)d);
    float row[8192];
    double t0 = now();
    for (size_t t = 0; t < T; t++) {
        for (uint32_t j = 0; j < n; j++)
            row[j] = dq_bf16_to_f32(k[t * n + j]);
        for (uint32_t h = 0; h < qh; h++)
            logits[(size_t)h * T + t] = scale * dot_f32(q + (size_t)h * d, row + (size_t)(h / G) * d, d);
    }
    float sum[256];
    for (uint32_t h = 0; h < qh; h++) {
        float mx = -INFINITY, *lg = logits + (size_t)h * T;
        for (size_t t = 0; t < T; t++)
            mx = fmaxf(mx, lg[t]);
        float s = 0;
        for (size_t t = 0; t < T; t++) {
            lg[t] = expf(lg[t] - mx);
            s += lg[t];
        }
        sum[h] = s;
    }
    memset(out, 0, sizeof(float) * qh * d);
    for (size_t t = 0; t < T; t++) {
        for (uint32_t j = 0; j < n; j++)
            row[j] = dq_bf16_to_f32(v[t * n + j]);
        for (uint32_t h = 0; h < qh; h++)
            axpy_f32(out + (size_t)h * d, logits[(size_t)h * T + t], row + (size_t)(h / G) * d, d);
    }
    for (uint32_t h = 0; h < qh; h++)
        for (uint32_t j = 0; j < d; j++)
            out[(size_t)h * d + j] /= sum[h];
    return now() - t0;
}

int main(int argc, char **argv)
{
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1)
        ncpu = 1;
    if (ncpu > 64)
        ncpu = 64;
    size_t nstreams = argc > 1 ? (size_t)atol(argv[1]) : 8192;
    dq_profile p;
    dq_codec *c;
    if (dq_profile_builtin("dq226", 8, 128, &p) != DQ_OK || dq_codec_create(&p, NULL, &c) != DQ_OK)
        return 1;
    const size_t n = 1024;
    printf("bench_codec: dq226, n = %zu, %zu Gaussian streams per kind, %d cores, dsp '%s'\n", n, nstreams, ncpu,
           dq__dsp_name());

    float *x = malloc(nstreams * n * sizeof(float));
    uint16_t *bf = malloc(nstreams * n * sizeof(uint16_t));
    for (size_t i = 0; i < nstreams * n; i++) {
        x[i] = (float)gauss();
        bf[i] = dq_f32_to_bf16(x[i]);
    }

    /* references: memcpy and zstd on the BF16 bytes of the same tokens */
    const size_t bfbytes = nstreams * n * 2;
    uint8_t *dst = malloc(bfbytes);
    double tm[REPS];
    memcpy(dst, bf, bfbytes);
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        memcpy(dst, bf, bfbytes);
        tm[r] = now() - t0;
    }
    double memcpy_vps = (double)(nstreams * n) / median(tm, REPS);
    size_t zcap = ZSTD_compressBound(bfbytes);
    uint8_t *z = malloc(zcap);
    size_t zlen = ZSTD_compress(z, zcap, bf, bfbytes, 3);
    if (ZSTD_isError(zlen))
        return 1;
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        size_t got = ZSTD_decompress(dst, bfbytes, z, zlen);
        tm[r] = now() - t0;
        if (got != bfbytes)
            return 1;
    }
    double zstd_vps = (double)(nstreams * n) / median(tm, REPS);
    printf("reference  memcpy %.0f M values/s (BF16 bytes), ZSTD_decompress %.0f M values/s (level 3, ratio %.3f)\n",
           memcpy_vps / 1e6, zstd_vps / 1e6, (double)bfbytes / (double)zlen);

    /* the input checks every PUT runs first: non-finite values (dq_check_finite) and the whole
     * token check (dq_check_tokens: finite, then per-head norms, rotation only above the limit) */
    {
        dq_workspace *cws;
        if (dq_workspace_create(c, &cws) != DQ_OK)
            return 1;
        double tf[REPS], tt[REPS];
        for (int r = 0; r < REPS; r++) {
            double t0 = now();
            if (dq_check_finite(bf, DQ_DTYPE_BF16, nstreams * n) != DQ_OK)
                return 1;
            double t1 = now();
            if (dq_check_tokens(cws, bf, DQ_DTYPE_BF16, nstreams) != DQ_OK)
                return 1;
            tf[r] = t1 - t0;
            tt[r] = now() - t1;
        }
        const double fv = (double)(nstreams * n) / median(tf, REPS), tv = (double)(nstreams * n) / median(tt, REPS);
        printf("checks     dq_check_finite (BF16) %.0f M values/s, vs memcpy %.2f | dq_check_tokens (BF16) %.0f M "
               "values/s, vs memcpy %.2f\n",
               fv / 1e6, fv / memcpy_vps, tv / 1e6, tv / memcpy_vps);
        dq_workspace_free(cws);
    }

    for (int kind = 0; kind < 2; kind++) {
        const size_t stride = dq_codec_record_bytes(c, (dq_kind)kind);
        uint8_t *rec = malloc(nstreams * stride);
        job proto = {c, kind, x, rec, 0, 0, stride, 1, NULL, 0};
        double t1[REPS], tn[REPS];
        run_threads(encode_job, &proto, nstreams / 4, 1, NULL); /* warm-up */
        for (int r = 0; r < 3; r++) {
            t1[r] = run_threads(encode_job, &proto, nstreams, 1, NULL);
            tn[r] = run_threads(encode_job, &proto, nstreams, ncpu, NULL);
        }
        double e1 = (double)nstreams / median(t1, 3), en = (double)nstreams / median(tn, 3);
        printf("%s encode   1 thread %8.0f streams/s | %d threads %8.0f streams/s (%.0f per core) | target >= 20000 "
               "per core: %.2fx\n",
               kind ? "V" : "K", e1, ncpu, en, en / ncpu, e1 / 20000.0);

        uint8_t *lv[64];
        for (int t = 0; t < ncpu; t++)
            lv[t] = malloc(128 * n);
        for (int fast = 1; fast >= 0; fast--) {
            proto.fast = fast;
            run_threads(decode_job, &proto, nstreams, 1, lv);
            for (int r = 0; r < REPS; r++) {
                t1[r] = run_threads(decode_job, &proto, nstreams, 1, lv);
                tn[r] = run_threads(decode_job, &proto, nstreams, ncpu, lv);
            }
            double d1 = (double)(nstreams * n) / median(t1, REPS), dn = (double)(nstreams * n) / median(tn, REPS);
            printf("%s decode %-9s 1 thread %6.0f M values/s | %d threads %6.0f M values/s | vs memcpy %.3f, vs "
                   "ZSTD_decompress %.2f%s\n",
                   kind ? "V" : "K", fast ? "(fast)" : "(scalar)", d1 / 1e6, ncpu, dn / 1e6, d1 / memcpy_vps,
                   d1 / zstd_vps, fast ? " | target >= 300 M/s per core" : "");
        }
        for (int t = 0; t < ncpu; t++)
            free(lv[t]);
        free(rec);
    }

    /* decode attention over a 32K-token layer */
    const size_t T = 32768;
    const uint32_t qh = 32, kvh = 8, d = 128;
    dq_workspace *ws;
    dq_layer *layer;
    if (dq_workspace_create(c, &ws) != DQ_OK || dq_layer_create(c, &layer) != DQ_OK)
        return 1;
    uint16_t *kb = malloc(T * n * 2), *vb = malloc(T * n * 2);
    for (size_t i = 0; i < T * n; i++) {
        kb[i] = dq_f32_to_bf16((float)gauss() + 0.3f * (float)(i % 7));
        vb[i] = dq_f32_to_bf16((float)gauss());
    }
    double te = now();
    for (size_t t = 0; t < T; t += 4096)
        if (dq_layer_append(layer, ws, kb + t * n, vb + t * n, DQ_DTYPE_BF16, 4096, NULL) != DQ_OK)
            return 1;
    te = now() - te;
    float *q = malloc(qh * d * sizeof(float)), *out = malloc(qh * d * sizeof(float)), lse[32];
    float *logits = malloc(T * qh * sizeof(float));
    for (size_t i = 0; i < qh * d; i++)
        q[i] = 0.3f * (float)gauss();
    dq_attn_item it = {layer, q, out, lse};
    double ta[REPS], tb[REPS], td[REPS];
    dq_attend(c, ws, qh, 1.0f / sqrtf((float)d), &it, 1);
    for (int r = 0; r < REPS; r++) {
        double t0 = now();
        dq_attend(c, ws, qh, 1.0f / sqrtf((float)d), &it, 1);
        ta[r] = now() - t0;
        tb[r] = bf16_attention(kb, vb, T, q, qh, kvh, d, out, logits);
        /* bare decode of the same K and V streams */
        const dq__dsp *dsp = dq__dsp_get();
        t0 = now();
        for (size_t w = 0; w < dq_layer_window_count(layer); w++) {
            const uint8_t *win = dq_layer_window(layer, w);
            for (int kind = 0; kind < 2; kind++)
                dsp->decode_levels(&c->kt[kind].dec, dq_window_record(c, win, (dq_kind)kind, 0), c->record_bytes[kind],
                                   p.window, c->kt[kind].container, (uint32_t)n, ws->levels);
        }
        td[r] = now() - t0;
    }
    double a = median(ta, REPS), b = median(tb, REPS), dd = median(td, REPS);
    printf("attend  32K tokens, 32 q heads / 8 kv heads, 1 thread: containers %.0f tokens/s (%.2f ms) | BF16 float "
           "attention %.0f tokens/s (%.2f ms) | ratio %.2fx\n",
           (double)T / a, a * 1e3, (double)T / b, b * 1e3, b / a);
    printf("attend  vs bare decode of the same K+V streams (%.2f ms): %.2fx (target <= 1.5x)\n", dd * 1e3, a / dd);
    printf("layer   append of 32K BF16 tokens (encode K and V): %.0f tokens/s, %.2f bits/value stored\n",
           (double)T / te, 8.0 * (double)dq_layer_stored_bytes(layer) / (2.0 * (double)T * n));
    dq_layer_free(layer);
    dq_workspace_free(ws);
    dq_codec_free(c);
    return 0;
}
