/* bench_vskip: decode attention with certified value skipping (dquant/vskip.h) against exact
 * decode attention on the CPU, both in the same run on the same layers and queries:
 *   exact  dq_attend (every key and value stream decoded)
 *   vskip  dq_attend_vskip at mass target tau (every key, the union's value streams)
 * Shapes:
 *   bytellama-19m     the model's KV and queries ($DQ_DATA_DIR or ../shared/data), sequence 0, all 6
 *                     layers at the last position of 1000 tokens (7 windows + a 104-token tail),
 *                     4 query heads over 2 KV heads x 128; skipped when the data is absent
 *   bytellama-n1024   likewise, 4 layers at 500 tokens (3 windows + 116), 16 q heads, 8 KV x 128
 *   synthetic         n = 1024 (8 KV heads x 128, 32 query heads: Qwen3-8B's shape), 8192 + 100 and
 *                     32768 + 57 tokens of N(0, 1) keys and values with a query of N(0, 9) per
 *                     coordinate (logits of standard deviation 3); one layer
 * Per shape and tau: milliseconds per item (the fastest of REPS repetitions over the shape's
 * layers, this thread's CPU time; exact and every tau alternate within a repetition), the ratio
 * exact / vskip (> 1: faster), the share of sealed value streams decoded, the largest relative
 * output error over heads and the bound returned. dq226, one thread.
 *
 * Usage: bench_vskip [--json PATH] [--quick]   (--quick: the synthetic shape at 8192 + 100 only) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "dquant/dquant.h"

#define REPS 15

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: the build machine is shared */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;

static double normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng_s ^= rng_s << 13;
        rng_s ^= rng_s >> 7;
        rng_s ^= rng_s << 17;
        u[i] = ((double)(rng_s >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static uint16_t *load(const char *dataset, const char *file, size_t count)
{
    const char *dir = getenv("DQ_DATA_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/%s", dir && *dir ? dir : "../shared/data", dataset, file);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint16_t *b = malloc(count * 2);
    if (b && fread(b, 2, count, f) != count) {
        free(b);
        b = NULL;
    }
    fclose(f);
    return b;
}

typedef struct shape {
    const char *name;
    uint32_t kvh, hd, qh;
    size_t layers, T;
    dq_layer **l;
    float *q; /* [layers][qh * hd] */
} shape;

typedef struct row {
    const char *name;
    size_t context;
    double tau, exact_ms, vskip_ms, decoded, rel_err, bound_rel;
} row;

/* Times every layer's item of s at each tau; appends rows. */
static size_t run_shape(const dq_codec *codec, dq_workspace *ws, const shape *s, const double *taus, size_t ntau,
                        row *rows)
{
    const size_t qd = (size_t)s->qh * s->hd;
    float *ex = malloc(qd * sizeof *ex), *out = malloc(qd * sizeof *out);
    double *bound = malloc(s->qh * sizeof *bound);
    const float scale = 1.0f / sqrtf((float)s->hd);
    double best_e = INFINITY, best_v[8];
    uint64_t dec[8] = {0}, all[8] = {0};
    double worst[8] = {0}, wb[8] = {0};
    /* accuracy and counts once, untimed */
    for (size_t ti = 0; ti < ntau; ti++) {
        best_v[ti] = INFINITY;
        for (size_t l = 0; l < s->layers; l++) {
            dq_attn_item it = {s->l[l], s->q + l * qd, out, NULL}, ie = {s->l[l], s->q + l * qd, ex, NULL};
            dq_vskip_out vo = {.bound = bound};
            if (dq_attend_vskip(codec, ws, s->qh, scale, taus[ti], &it, &vo, 1) ||
                dq_attend(codec, ws, s->qh, scale, &ie, 1)) {
                fprintf(stderr, "attention failed\n");
                exit(1);
            }
            dec[ti] += vo.values_decoded;
            all[ti] += vo.values_sealed;
            for (uint32_t h = 0; h < s->qh; h++) {
                double e = 0, n = 0;
                for (uint32_t j = 0; j < s->hd; j++) {
                    const double x = (double)out[h * s->hd + j] - ex[h * s->hd + j];
                    e += x * x;
                    n += (double)ex[h * s->hd + j] * ex[h * s->hd + j];
                }
                if (sqrt(e) > bound[h]) {
                    fprintf(stderr, "%s: error %g above the bound %g\n", s->name, sqrt(e), bound[h]);
                    exit(1);
                }
                worst[ti] = fmax(worst[ti], sqrt(e / n));
                wb[ti] = fmax(wb[ti], bound[h] / sqrt(n));
            }
        }
    }
    /* exact and every tau in turn within each repetition (a shared machine's load hits all alike);
     * the fastest repetition of each */
    for (int r = 0; r < REPS; r++) {
        for (size_t ti = 0; ti <= ntau; ti++) {
            const double t0 = now();
            for (size_t l = 0; l < s->layers; l++) {
                dq_attn_item it = {s->l[l], s->q + l * qd, out, NULL};
                dq_vskip_out vo = {0};
                const int rc = ti == 0 ? dq_attend(codec, ws, s->qh, scale, &it, 1)
                                       : dq_attend_vskip(codec, ws, s->qh, scale, taus[ti - 1], &it, &vo, 1);
                if (rc) {
                    fprintf(stderr, "attention failed\n");
                    exit(1);
                }
            }
            const double dt = now() - t0;
            if (ti == 0)
                best_e = fmin(best_e, dt);
            else
                best_v[ti - 1] = fmin(best_v[ti - 1], dt);
        }
    }
    const double exact_ms = 1e3 * best_e / (double)s->layers;
    for (size_t ti = 0; ti < ntau; ti++) {
        const double vs_ms = 1e3 * best_v[ti] / (double)s->layers;
        const double frac = all[ti] ? (double)dec[ti] / (double)all[ti] : 1.0;
        rows[ti] = (row){s->name, s->T, taus[ti], exact_ms, vs_ms, frac, worst[ti], wb[ti]};
        printf("| %s | %zu | %g | %.3f | %.3f | %.2f | %.1f | %.3g | %.3g |\n", s->name, s->T, taus[ti], exact_ms,
               vs_ms, exact_ms / vs_ms, 100.0 * frac, worst[ti], wb[ti]);
        fflush(stdout);
    }
    free(ex);
    free(out);
    free(bound);
    return ntau;
}

static void shape_free(shape *s)
{
    for (size_t l = 0; l < s->layers; l++)
        dq_layer_free(s->l[l]);
    free(s->l);
    free(s->q);
}

/* A real dataset's layers at T tokens (kv [.., layers, tokens, n] f16 of one sequence at kvoff). */
static int shape_real(shape *s, const dq_codec *codec, dq_workspace *ws, const char *ds, size_t seqs, size_t layers,
                      size_t tokens, uint32_t kvh, uint32_t qh, size_t T)
{
    const size_t n = (size_t)kvh * 128, qd = (size_t)qh * 128;
    uint16_t *kv = load(ds, "kv_f16.bin", seqs * 2 * layers * tokens * n);
    uint16_t *q = load(ds, "q_f16.bin", layers * tokens * qd);
    if (!kv || !q) {
        free(kv);
        free(q);
        return -1;
    }
    *s = (shape){ds, kvh, 128, qh, layers, T, calloc(layers, sizeof(dq_layer *)), malloc(layers * qd * sizeof(float))};
    for (size_t l = 0; l < layers; l++) {
        const uint16_t *K = kv + l * tokens * n, *V = kv + (layers + l) * tokens * n;
        dq_layer_create(codec, &s->l[l]);
        if (dq_layer_append(s->l[l], ws, K, V, DQ_DTYPE_F16, T, NULL)) {
            fprintf(stderr, "append failed\n");
            exit(1);
        }
        for (size_t i = 0; i < qd; i++)
            s->q[l * qd + i] = dq_f16_to_f32(q[(l * tokens + T - 1) * qd + i]);
    }
    free(kv);
    free(q);
    return 0;
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else {
            fprintf(stderr, "usage: %s [--json PATH] [--quick]\n", argv[0]);
            return 2;
        }
    }
    static const double taus[] = {0.99, 0.999, 0.9999};
    enum { NT = 3 };
    row rows[8 * NT];
    size_t nrows = 0;
    printf(
        "| shape | context | tau | exact ms/item | vskip ms/item | ratio | value streams decoded %% | max rel. err | "
        "bound / ||o|| |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    dq_profile p;
    dq_codec *codec;
    dq_workspace *ws;
    shape s;
    /* the two real datasets, then the synthetic Qwen3-8B shape */
    static const struct {
        const char *ds;
        size_t seqs, layers, tokens, T;
        uint32_t kvh, qh;
    } real[] = {{"bytellama-19m", 2, 6, 1024, 1000, 2, 4}, {"bytellama-n1024", 1, 4, 512, 500, 8, 16}};
    for (size_t r = 0; r < 2 && !quick; r++) {
        if (dq_profile_builtin("dq226", real[r].kvh, 128, &p) || dq_codec_create(&p, NULL, &codec) ||
            dq_workspace_create(codec, &ws))
            return 1;
        if (shape_real(&s, codec, ws, real[r].ds, real[r].seqs, real[r].layers, real[r].tokens, real[r].kvh, real[r].qh,
                       real[r].T) == 0) {
            nrows += run_shape(codec, ws, &s, taus, NT, rows + nrows);
            shape_free(&s);
        } else {
            printf("| %s | - | - | data absent | | | | | |\n", real[r].ds);
        }
        dq_workspace_free(ws);
        dq_codec_free(codec);
    }
    if (dq_profile_builtin("dq226", 8, 128, &p) || dq_codec_create(&p, NULL, &codec) || dq_workspace_create(codec, &ws))
        return 1;
    static const size_t contexts[] = {8192 + 100, 32768 + 57};
    for (size_t ci = 0; ci < (quick ? 1u : 2u); ci++) {
        const size_t T = contexts[ci], n = 1024, qd = 32 * 128;
        float *k = malloc(T * n * sizeof *k), *v = malloc(T * n * sizeof *v);
        for (size_t i = 0; i < T * n; i++) {
            k[i] = (float)normal();
            v[i] = (float)normal();
        }
        s = (shape){"synthetic", 8, 128, 32, 1, T, calloc(1, sizeof(dq_layer *)), malloc(qd * sizeof(float))};
        dq_layer_create(codec, &s.l[0]);
        if (dq_layer_append(s.l[0], ws, k, v, DQ_DTYPE_F32, T, NULL))
            return 1;
        for (size_t i = 0; i < qd; i++)
            s.q[i] = (float)(3.0 * normal());
        free(k);
        free(v);
        nrows += run_shape(codec, ws, &s, taus, NT, rows + nrows);
        shape_free(&s);
    }
    dq_workspace_free(ws);
    dq_codec_free(codec);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        char cpu[128], load[128];
        bench_read_line("/proc/cpuinfo", "model name", cpu, sizeof cpu);
        bench_read_line("/proc/loadavg", NULL, load, sizeof load);
        fprintf(f,
                "{\n \"bench\": \"bench_vskip\",\n \"cpu\": \"%s\",\n \"loadavg\": \"%s\",\n \"profile\": \"dq226\",\n"
                " \"timing\": \"fastest of %d repetitions, exact and each tau alternating, thread CPU time, one "
                "thread\",\n \"rows\": [\n",
                cpu, load, REPS);
        for (size_t i = 0; i < nrows; i++)
            fprintf(
                f,
                "  {\"shape\": \"%s\", \"context\": %zu, \"value_mass\": %g, \"exact_ms\": %.4f, \"vskip_ms\": %.4f, "
                "\"ratio\": %.4f, \"value_streams_decoded\": %.4f, \"max_rel_err\": %.4g, \"max_bound_rel\": %.4g}%s\n",
                rows[i].name, rows[i].context, rows[i].tau, rows[i].exact_ms, rows[i].vskip_ms,
                rows[i].exact_ms / rows[i].vskip_ms, rows[i].decoded, rows[i].rel_err, rows[i].bound_rel,
                i + 1 < nrows ? "," : "");
        fprintf(f, " ]\n}\n");
        fclose(f);
    }
    return 0;
}
