/* bench_kvq: nearest-centroid search of the KVQ scalar quantizer on this CPU (seed §2.2.3).
 *
 * The values: N = 4096 vectors of d = 128 coordinates, each a uniformly random unit vector (the
 * rotated keys the quantizer sees); the Lloyd–Max codebook of the sphere marginal at b bits. Two
 * searches, both scalar C on one core:
 *   bucketize  dq_kvq_bucketize, binary search over the 2^b − 1 boundaries (O(log k) per value)
 *   argmin     dq_kvq_nearest_argmin, |x − c| over all 2^b centroids (O(k) per value; the seed's
 *              "before")
 * Both must give the same indices. The seed's 14× / 22× are its PyTorch versions (torch.bucketize
 * against an N·d·k distance tensor and argmin, allocation included); ours compares two loops in C
 * without any temporary, so the ratio measures the search alone.
 *
 * Usage: bench_kvq [--json PATH]   (every figure is the fastest of 9 timed repetitions, in this
 * thread's CPU time; the JSON records the CPU model and the load average: a loaded machine still
 * skews the ratios through its caches) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host.h"
#include "dquant/kvq.h"
#include "kvq_internal.h"

#define N 4096
#define D 128
#define REPS 9

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: the build machine is shared */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double fastest(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static uint8_t idx_a[N * D], idx_b[N * D];

static double time_bucketize(const float *x, const float *bd, uint32_t k)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        const double t0 = now();
        for (size_t i = 0; i < (size_t)N * D; i++)
            idx_a[i] = (uint8_t)dq_kvq_bucketize(x[i], bd, k - 1);
        t[r] = now() - t0;
    }
    return fastest(t, REPS);
}

static double time_argmin(const float *x, const float *c, uint32_t k)
{
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        const double t0 = now();
        for (size_t i = 0; i < (size_t)N * D; i++)
            idx_b[i] = (uint8_t)dq_kvq_nearest_argmin(x[i], c, k);
        t[r] = now() - t0;
    }
    return fastest(t, REPS);
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
    float *x = malloc((size_t)N * D * sizeof *x);
    if (!x)
        return 1;
    dq__kvq_rng rng;
    dq__kvq_rng_seed(&rng, 0xbe7c4);
    for (size_t v = 0; v < N; v++) {
        double s = 0;
        for (int j = 0; j < D; j++) {
            x[v * D + j] = (float)dq__kvq_rng_normal(&rng);
            s += (double)x[v * D + j] * x[v * D + j];
        }
        for (int j = 0; j < D; j++)
            x[v * D + j] = (float)(x[v * D + j] / sqrt(s));
    }
    static const uint32_t bits[] = {1, 2, 3, 4, 8};
    static const double paper[] = {0, 14, 0, 22, 0};
    FILE *f = json ? fopen(json, "w") : NULL;
    if (json && !f) {
        perror(json);
        return 1;
    }
    char cpu[128], load[128];
    bench_read_line("/proc/cpuinfo", "model name", cpu, sizeof cpu);
    bench_read_line("/proc/loadavg", NULL, load, sizeof load);
    printf("cpu: %s; load average: %s\n", cpu, load);
    if (f)
        fprintf(f,
                "{\n \"bench\": \"bench_kvq\",\n \"cpu\": \"%s\",\n \"loadavg\": \"%s\",\n \"n_vectors\": %d,\n "
                "\"dim\": %d,\n \"reps\": %d,\n"
                " \"note\": \"scalar C, one core; the paper's 14x/22x are PyTorch (bucketize vs an N*d*k "
                "distance tensor + argmin)\",\n \"records\": [\n",
                cpu, load, N, D, REPS);
    printf("%-5s %14s %14s %8s %8s\n", "bits", "bucketize M/s", "argmin M/s", "ratio", "paper");
    int bad = 0;
    for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++) {
        const uint32_t b = bits[i], k = 1u << b;
        const float *c, *bd;
        if (dq_kvq_codebook(b, D, &c, &bd) < 0)
            return 1;
        const double tb = time_bucketize(x, bd, k), ta = time_argmin(x, c, k);
        if (memcmp(idx_a, idx_b, sizeof idx_a)) {
            fprintf(stderr, "bits %u: bucketize and argmin disagree\n", b);
            bad = 1;
        }
        const double nv = (double)N * D;
        printf("%-5u %14.1f %14.1f %7.1fx %7s\n", b, nv / tb / 1e6, nv / ta / 1e6, ta / tb,
               paper[i] > 0 ? (paper[i] == 14 ? "14x" : "22x") : "-");
        if (f)
            fprintf(f,
                    "  {\"bits\": %u, \"bucketize_s\": %.6f, \"argmin_s\": %.6f, \"bucketize_mvals_s\": %.1f, "
                    "\"argmin_mvals_s\": %.1f, \"ratio\": %.2f%s}%s\n",
                    b, tb, ta, nv / tb / 1e6, nv / ta / 1e6, ta / tb,
                    paper[i] > 0 ? (paper[i] == 14 ? ", \"paper_ratio\": 14" : ", \"paper_ratio\": 22") : "",
                    i + 1 < sizeof bits / sizeof bits[0] ? "," : "");
    }
    if (f) {
        fprintf(f, " ]\n}\n");
        fclose(f);
    }
    free(x);
    return bad;
}
